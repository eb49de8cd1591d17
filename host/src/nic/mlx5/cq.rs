//! Completion queues on a real NIC. Verbs path: `ibv_create_cq`, then `mlx5dv_init_obj` for the ring and
//! doorbell record that device code polls and updates (the CQE ring stays in host memory, mapped into the GPU
//! for `gpu`). DevX path: CREATE_CQ over a ring and dbrec in GPU memory (`super::devx`).

use std::sync::Arc;

use gdaki_mlx5_sys as sys;
use gdaki_shared::handle::{CqHandle, Placement};
use gdaki_shared::prm::cqe::CQE_SIZE;

use super::attr;
use super::devx::{DevxObj, GpuQueue};
use super::map::Mapped;
use super::path::QueuePath;
use super::verbs::{check, nonnull};
use super::Mlx5Nic;
use crate::{Error, Result};

/// A CQ of 64-byte CQEs. Created by [`Mlx5Nic::create_cq`]; destroyed (`ibv_destroy_cq`) when it and every
/// QP that completes into it are dropped.
#[derive(Debug)]
pub struct Cq {
    pub(super) inner: Arc<CqInner>,
}

#[derive(Debug)]
pub(super) struct CqInner {
    nic: Arc<Mlx5Nic>,
    pub(super) kind: CqKind,
    handle: CqHandle,
    /// The ring's and the dbrec's GPU mappings; undone before the CQ (and its memory) is destroyed.
    maps: Vec<Mapped>,
}

/// How the CQ was made.
#[derive(Debug)]
pub(super) enum CqKind {
    /// `ibv_create_cq`.
    Verbs(*mut sys::ibv_cq),
    /// CREATE_CQ; the object is taken (and destroyed) by `Drop`, before the queue memory goes.
    Devx {
        /// The CREATE_CQ object.
        obj: Option<DevxObj>,
        /// The ring and dbrec it uses.
        _mem: Box<GpuQueue>,
    },
}

// SAFETY: verbs objects may be used from any thread; the pointer is only freed by `Drop`, once.
unsafe impl Send for CqInner {}
// SAFETY: as above; nothing here mutates through a shared reference.
unsafe impl Sync for CqInner {}

impl Drop for CqInner {
    fn drop(&mut self) {
        // The GPU's view of the ring goes before the ring itself.
        self.maps.clear();
        match &mut self.kind {
            CqKind::Verbs(ptr) => {
                // SAFETY: `ptr` came from `ibv_create_cq`; QPs that complete into it hold this value, so none
                // is left.
                let ret = unsafe { sys::ibv_destroy_cq(*ptr) };
                if let Err(e) = check(ret, "ibv_destroy_cq") {
                    self.nic.drops.record("an mlx5 CQ", e);
                }
            }
            // The queue memory (umem, then GPU memory) is dropped with `self.kind`, after this.
            CqKind::Devx { obj, .. } => {
                if let Some(o) = obj.take() {
                    self.nic.destroy_devx(o, "an mlx5 DevX CQ");
                }
            }
        }
    }
}

impl Mlx5Nic {
    /// Creates a CQ of exactly `ncqe` 64-byte CQEs (`ibv_create_cq` with `ncqe - 1`, see
    /// [`attr::cq_request`]) and exports its ring and doorbell record (`mlx5dv_init_obj(MLX5DV_OBJ_CQ)`).
    /// rdma-core fills a new ring with the INVALID opcode (`op_own = 0xF0`), which device code never takes for
    /// a CQE.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a size that is not a power of two within the device's `max_cqe + 1`;
    /// [`Error::Verbs`] for `ibv_create_cq` or `mlx5dv_init_obj`; [`Error::Unavailable`] when rdma-core made
    /// 128-byte CQEs (environment `MLX5_CQE_SIZE=128`) or another ring size; the CUDA driver's error mapping
    /// the ring into the GPU.
    ///
    /// On the DevX path ([`Mlx5Nic::queue_path`]) the ring and dbrec are in GPU memory instead (CREATE_CQ;
    /// placement GPU); its errors are [`Error::InvalidArgument`] for a size, the CUDA driver's,
    /// [`Error::Verbs`] for the umem and [`Error::DevxCmd`] for the command.
    pub fn create_cq(self: &Arc<Self>, ncqe: u32) -> Result<Cq> {
        if let QueuePath::Devx(_) = self.path.path {
            let (obj, q, handle) = self.create_cq_devx(ncqe)?;
            let inner = CqInner {
                nic: self.clone(),
                kind: CqKind::Devx { obj: Some(obj), _mem: Box::new(q) },
                handle,
                maps: Vec::new(),
            };
            return Ok(Cq { inner: Arc::new(inner) });
        }
        self.create_cq_host(ncqe)
    }

    /// [`Mlx5Nic::create_cq`] on the verbs path whatever the NIC's [`Mlx5Nic::queue_path`]: the ring in host
    /// memory (mapped into the GPU for `gpu`), for a CQ that host code polls (the proxy of the Host modes).
    /// QPs made with it are verbs QPs.
    ///
    /// # Errors
    /// As [`Mlx5Nic::create_cq`] on the verbs path.
    pub fn create_cq_host(self: &Arc<Self>, ncqe: u32) -> Result<Cq> {
        let req = attr::cq_request(ncqe, self.limits.max_cqe)?;
        // SAFETY: the context is open; no completion channel or context pointer.
        let ptr = unsafe { sys::ibv_create_cq(self.ctx.ptr, req, std::ptr::null_mut(), std::ptr::null_mut(), 0) };
        let ptr = nonnull(ptr, format!("ibv_create_cq({req})"))?;
        // From here on, dropping `inner` destroys the CQ, whatever fails next.
        let mut inner =
            CqInner { nic: self.clone(), kind: CqKind::Verbs(ptr), handle: CqHandle::default(), maps: Vec::new() };
        let mut dv = sys::mlx5dv_cq::default();
        let mut obj = sys::mlx5dv_obj::default();
        obj.cq.in_ = ptr;
        obj.cq.out = &mut dv;
        // SAFETY: `obj.cq` names a live CQ of this context and a zeroed `mlx5dv_cq` to fill.
        check(unsafe { sys::mlx5dv_init_obj(&mut obj, sys::MLX5DV_OBJ_CQ as u64) }, "mlx5dv_init_obj(CQ)")?;
        if dv.cqe_size as usize != CQE_SIZE || dv.cqe_cnt != ncqe {
            return Err(Error::Unavailable(format!(
                "rdma-core made a CQ of {} CQEs of {} bytes, not {ncqe} of {CQE_SIZE} (is MLX5_CQE_SIZE set?)",
                dv.cqe_cnt, dv.cqe_size
            )));
        }
        // SAFETY: the ring (`cqe_cnt` × 64 bytes) and the dbrec (8 bytes) are rdma-core's allocations of this
        // CQ, alive until `ibv_destroy_cq`, which `Drop` calls after dropping the mappings.
        let ring = unsafe { self.map.map(dv.buf as u64, u64::from(ncqe) * CQE_SIZE as u64, false) }?;
        inner.maps.push(ring);
        // SAFETY: as above.
        let dbrec = unsafe { self.map.map(dv.dbrec as u64, 8, false) }?;
        inner.maps.push(dbrec);
        inner.handle = CqHandle {
            buf: inner.maps[0].device_addr,
            dbrec: inner.maps[1].device_addr,
            ncqe,
            cqn: dv.cqn,
            cons_index: 0,
            // The fallback path: rings in host memory mapped into the GPU.
            placement: Placement::HOST,
            pad: 0,
        };
        Ok(Cq { inner: Arc::new(inner) })
    }
}

impl Cq {
    /// The CQ number (24 bits).
    pub fn cqn(&self) -> u32 {
        self.inner.handle.cqn
    }

    /// Entries in the ring (a power of two).
    pub fn ncqe(&self) -> u32 {
        self.inner.handle.ncqe
    }

    /// The device handle: ring and dbrec addresses as device code sees them, size, CQN; consumer index 0 (a
    /// handle is taken once, before device code polls).
    pub fn handle(&self) -> CqHandle {
        self.inner.handle
    }

    pub(super) fn nic(&self) -> &Arc<Mlx5Nic> {
        &self.inner.nic
    }
}
