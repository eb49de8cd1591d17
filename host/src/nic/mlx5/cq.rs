//! Completion queues on a real NIC: `ibv_create_cq`, then `mlx5dv_init_obj` for the ring and doorbell record
//! that device code polls and updates (the CQE ring stays in host memory, mapped into the GPU for `gpu`).

use std::sync::Arc;

use gdaki_mlx5_sys as sys;
use gdaki_shared::handle::{CqHandle, Placement};
use gdaki_shared::prm::cqe::CQE_SIZE;

use super::attr;
use super::map::Mapped;
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
    pub(super) ptr: *mut sys::ibv_cq,
    handle: CqHandle,
    /// The ring's and the dbrec's GPU mappings; undone before the CQ (and its memory) is destroyed.
    maps: Vec<Mapped>,
}

// SAFETY: verbs objects may be used from any thread; the pointer is only freed by `Drop`, once.
unsafe impl Send for CqInner {}
// SAFETY: as above; nothing here mutates through a shared reference.
unsafe impl Sync for CqInner {}

impl Drop for CqInner {
    fn drop(&mut self) {
        // The GPU's view of the ring goes before the ring itself.
        self.maps.clear();
        // SAFETY: `ptr` came from `ibv_create_cq`; QPs that complete into it hold this value, so none is left.
        let ret = unsafe { sys::ibv_destroy_cq(self.ptr) };
        if let Err(e) = check(ret, "ibv_destroy_cq") {
            self.nic.drops.record("an mlx5 CQ", e);
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
    pub fn create_cq(self: &Arc<Self>, ncqe: u32) -> Result<Cq> {
        let req = attr::cq_request(ncqe, self.limits.max_cqe)?;
        // SAFETY: the context is open; no completion channel or context pointer.
        let ptr = unsafe { sys::ibv_create_cq(self.ctx.ptr, req, std::ptr::null_mut(), std::ptr::null_mut(), 0) };
        let ptr = nonnull(ptr, format!("ibv_create_cq({req})"))?;
        // From here on, dropping `inner` destroys the CQ, whatever fails next.
        let mut inner = CqInner { nic: self.clone(), ptr, handle: CqHandle::default(), maps: Vec::new() };
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
