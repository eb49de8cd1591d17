//! RC queue pairs on a real NIC. Verbs path: `ibv_create_qp`, `mlx5dv_init_obj` for the SQ ring, doorbell
//! record and BlueFlame register that device code writes, and the RESET → INIT → RTR → RTS transitions of
//! `ibv_modify_qp` (attributes from [`super::attr`]). DevX path: CREATE_QP over an SQ and dbrec in GPU
//! memory, the NIC's own UAR, and the same transitions as PRM commands (`super::devx`). On both, a connect
//! that fails after RESET → INIT moves the QP to ERR.

use std::sync::Arc;

use gdaki_mlx5_sys as sys;
use gdaki_shared::handle::QpHandle;
use gdaki_shared::prm::uar::UAR_PAGE_SIZE;
use gdaki_shared::prm::wqe::WQEBB;

use super::cq::{Cq, CqInner, CqKind};
use super::devx::{DevxObj, GpuQueue};
use super::endpoint::Endpoint;
use super::map::Mapped;
use super::mr::{Pd, PdInner};
use super::verbs::{check, nonnull};
use super::{attr, Mlx5Nic};
use crate::nic::emu::QpState;
use crate::{Error, Result};

/// An RC QP. Created by [`Mlx5Nic::create_qp`] in RESET; [`Qp::connect`] brings it to RTS. Destroyed
/// (`ibv_destroy_qp`) on drop, after the GPU's mappings of its queue memory are undone.
#[derive(Debug)]
pub struct Qp {
    kind: QpKind,
    nic: Arc<Mlx5Nic>,
    handle: QpHandle,
    psn: u32,
    /// SQ ring, dbrec and UAR page as device code sees them; undone before the QP is destroyed.
    maps: Vec<Mapped>,
    /// The CQ and PD outlive the QP.
    _cq: Arc<CqInner>,
    _pd: Arc<PdInner>,
}

/// How the QP was made.
#[derive(Debug)]
enum QpKind {
    /// `ibv_create_qp`.
    Verbs(*mut sys::ibv_qp),
    /// CREATE_QP; the object is taken (and destroyed) by `Drop`, before the queue memory goes.
    Devx {
        /// The CREATE_QP object.
        obj: Option<DevxObj>,
        /// The ring and dbrec it uses.
        _mem: Box<GpuQueue>,
    },
}

// SAFETY: verbs objects may be used from any thread; the pointer is only freed by `Drop`, once.
unsafe impl Send for Qp {}
// SAFETY: as above; `connect` and `state` are thread-safe verbs calls.
unsafe impl Sync for Qp {}

impl Drop for Qp {
    fn drop(&mut self) {
        self.maps.clear();
        match &mut self.kind {
            QpKind::Verbs(ptr) => {
                // SAFETY: `ptr` came from `ibv_create_qp` and is destroyed once.
                if let Err(e) = check(unsafe { sys::ibv_destroy_qp(*ptr) }, "ibv_destroy_qp") {
                    self.nic.drops.record("an mlx5 QP", e);
                }
            }
            // The queue memory (umem, then GPU memory) is dropped with `self.kind`, after this; the CQ after
            // that (`_cq`).
            QpKind::Devx { obj, .. } => {
                if let Some(o) = obj.take() {
                    self.nic.destroy_devx(o, "an mlx5 DevX QP");
                }
            }
        }
    }
}

impl Mlx5Nic {
    /// Creates an RC QP in `pd` whose SQ holds `wqe_cnt` WQEBBs and completes into `cq`
    /// ([`attr::qp_init_attr`]), in RESET, and exports it (`mlx5dv_init_obj(MLX5DV_OBJ_QP)`): the SQ ring
    /// (`sq.buf`, `sq.wqe_cnt` WQEBBs of `sq.stride` = 64 bytes), the doorbell record (`dbrec`, word 1 = SQ)
    /// and the doorbell/BlueFlame register (`bf.reg`, inside a UAR page mmapped by rdma-core), mapped into the
    /// GPU for the `gpu` executor (the UAR page with `CU_MEMHOSTREGISTER_IOMEMORY`). The first PSN is random
    /// (24 bits).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a PD or CQ of another NIC or a size out of range; [`Error::Verbs`] for
    /// `ibv_create_qp` or `mlx5dv_init_obj`; [`Error::Unavailable`] when rdma-core laid the SQ out otherwise
    /// than device code expects (stride, size, alignment); the CUDA driver's error mapping it.
    ///
    /// For a CQ of the DevX path ([`Mlx5Nic::queue_path`]; not one of [`Mlx5Nic::create_cq_host`]) the SQ ring and dbrec are in GPU memory instead (CREATE_QP
    /// on the NIC's UAR; placement GPU), `wqe_cnt` exactly (a power of two); its errors are
    /// [`Error::InvalidArgument`] for a size, [`Error::Verbs`] for the PD number or the umem, the CUDA
    /// driver's, and [`Error::DevxCmd`] for the command.
    pub fn create_qp(self: &Arc<Self>, pd: &Pd, cq: &Cq, wqe_cnt: u32) -> Result<Qp> {
        if !Arc::ptr_eq(&pd.inner.nic, self) || !Arc::ptr_eq(cq.nic(), self) {
            return Err(Error::InvalidArgument(format!("PD or CQ belongs to another NIC than {}", self.ctx.name)));
        }
        if cq.ncqe() < wqe_cnt {
            return Err(Error::InvalidArgument(format!("CQ of {} entries is smaller than SQ of {wqe_cnt}", cq.ncqe())));
        }
        let psn = random_psn()?;
        let cq_ptr = match cq.inner.kind {
            CqKind::Verbs(p) => p,
            CqKind::Devx { .. } => {
                let (obj, q, handle) = self.create_qp_devx(pd.inner.ptr, &cq.handle(), wqe_cnt)?;
                return Ok(Qp {
                    kind: QpKind::Devx { obj: Some(obj), _mem: Box::new(q) },
                    nic: self.clone(),
                    handle,
                    psn,
                    maps: Vec::new(),
                    _cq: cq.inner.clone(),
                    _pd: pd.inner.clone(),
                });
            }
        };
        let mut init = attr::qp_init_attr(cq_ptr, wqe_cnt, self.limits.max_qp_wr)?;
        // SAFETY: `pd` and the CQ are live objects of this context; `init` is zeroed and filled.
        let ptr = nonnull(unsafe { sys::ibv_create_qp(pd.inner.ptr, &mut init) }, "ibv_create_qp(RC)")?;
        // SAFETY: `ptr` is the live QP just created.
        let qpn = unsafe { (*ptr).qp_num };
        // From here on, dropping `qp` destroys the QP, whatever fails next.
        let mut qp = Qp {
            kind: QpKind::Verbs(ptr),
            nic: self.clone(),
            handle: QpHandle::default(),
            psn,
            maps: Vec::new(),
            _cq: cq.inner.clone(),
            _pd: pd.inner.clone(),
        };
        let mut dv = sys::mlx5dv_qp::default();
        let mut obj = sys::mlx5dv_obj::default();
        obj.qp.in_ = ptr;
        obj.qp.out = &mut dv;
        // SAFETY: `obj.qp` names a live QP of this context and a zeroed `mlx5dv_qp` to fill.
        check(unsafe { sys::mlx5dv_init_obj(&mut obj, sys::MLX5DV_OBJ_QP as u64) }, "mlx5dv_init_obj(QP)")?;
        let (sq, n) = (dv.sq.buf as u64, dv.sq.wqe_cnt);
        if dv.sq.stride as usize != WQEBB || !n.is_power_of_two() || n < wqe_cnt || !sq.is_multiple_of(WQEBB as u64) {
            return Err(Error::Unavailable(format!(
                "rdma-core laid out the SQ of QP {qpn:#x} as {n} × {} bytes at {sq:#x}; device code needs a power \
                 of two ≥ {wqe_cnt} of 64-byte WQEBBs, 64-byte aligned",
                dv.sq.stride
            )));
        }
        let bf = dv.bf.reg as u64;
        if bf == 0 {
            return Err(Error::Unavailable(format!("QP {qpn:#x} has no doorbell register (mlx5dv_qp.bf.reg)")));
        }
        let page = UAR_PAGE_SIZE as u64;
        // SAFETY: the SQ ring and the dbrec are rdma-core's allocations for this QP and the UAR page is its
        // mmap of the device's doorbell page; all stay mapped until `ibv_destroy_qp`, which `Drop` calls after
        // dropping the mappings.
        unsafe {
            qp.maps.push(self.map.map(sq, u64::from(n) * WQEBB as u64, false)?);
            qp.maps.push(self.map.map(dv.dbrec as u64, 8, false)?);
            qp.maps.push(self.map.map(bf & !(page - 1), page, true)?);
        }
        qp.handle = QpHandle {
            sq_buf: qp.maps[0].device_addr,
            dbrec: qp.maps[1].device_addr,
            bf_reg: qp.maps[2].device_addr + (bf & (page - 1)),
            // 0 on a UAR without BlueFlame: device code then rings by doorbell.
            bf_size: dv.bf.size,
            wqe_cnt: n,
            qpn,
            cq: cq.handle(),
            ..QpHandle::default()
        };
        Ok(qp)
    }
}

/// A random first PSN (24 bits).
fn random_psn() -> Result<u32> {
    let mut psn = [0u8; 4];
    getrandom::fill(&mut psn).map_err(|e| Error::Unavailable(format!("no random PSN: {e}")))?;
    Ok(u32::from_le_bytes(psn) & 0x00ff_ffff)
}

impl Qp {
    /// The QP number (24 bits).
    pub fn qpn(&self) -> u32 {
        self.handle.qpn
    }

    /// SQ size in WQEBBs (rdma-core's, at least what was asked for).
    pub fn wqe_cnt(&self) -> u32 {
        self.handle.wqe_cnt
    }

    /// What a peer passes to its [`Qp::connect`]: this port's link layer, LID, chosen GID and active MTU,
    /// and the QP's number and first PSN.
    pub fn endpoint(&self) -> Endpoint {
        let n = &self.nic;
        Endpoint {
            link: n.link,
            qpn: self.handle.qpn,
            psn: self.psn,
            lid: n.lid,
            gid: n.gid.gid,
            gid_index: n.gid.index as u8,
            mtu: n.mtu,
        }
    }

    /// The device handle: SQ ring, dbrec and doorbell/BlueFlame register as device code sees them,
    /// `wqe_cnt`, QPN and the CQ's handle; software counters zero (a handle is taken once, before device code
    /// posts).
    pub fn handle(&self) -> QpHandle {
        self.handle
    }

    /// Moves the QP RESET → INIT → RTR → RTS towards `remote` ([`attr::init`], [`attr::rtr`], [`attr::rts`]).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an endpoint with another link layer or LID 0 on InfiniBand;
    /// [`Error::Verbs`] naming the transition (`ibv_modify_qp(INIT→RTR)`) and errno (e.g. EINVAL for a QP
    /// not in RESET). On the DevX path the same transitions are RST2INIT, INIT2RTR and RTR2RTS, and a
    /// refused one is [`Error::DevxCmd`] naming it with the firmware's status and syndrome; on RoCE
    /// `ibv_create_ah` finds the peer's MAC ([`Error::Verbs`] when it cannot). A transition refused after
    /// RESET → INIT leaves the QP in ERR (best effort: a failure of that move is logged), where every WQE
    /// posted later completes with a flush error (0x05) instead of never running: create a new QP to retry.
    pub fn connect(&self, remote: &Endpoint) -> Result<()> {
        let n = &self.nic;
        let local = self.endpoint();
        let ptr = match &self.kind {
            QpKind::Verbs(p) => *p,
            QpKind::Devx { obj, .. } => {
                let obj = obj.as_ref().ok_or_else(|| Error::InvalidArgument("QP is being destroyed".into()))?;
                n.connect_devx(obj, self._pd.ptr, &local, remote)?;
                tracing::debug!(qpn = self.handle.qpn, peer = remote.qpn, "mlx5: DevX QP in RTS");
                return Ok(());
            }
        };
        let init = attr::init(n.port);
        let rtr = attr::rtr(&local, remote, n.port, attr::rd_atomic(n.limits.max_qp_rd_atom))?;
        let rts = attr::rts(self.psn, attr::rd_atomic(n.limits.max_qp_init_rd_atom));
        self.modify(ptr, init, "RESET→INIT")?;
        // Out of RESET, a failed step leaves the QP in ERR, where later WQEs are flushed rather than ignored.
        self.to_err_on_failure(ptr, || {
            self.modify(ptr, rtr, "INIT→RTR")?;
            self.modify(ptr, rts, "RTR→RTS")
        })?;
        tracing::debug!(qpn = self.handle.qpn, peer = remote.qpn, "mlx5: QP in RTS");
        Ok(())
    }

    /// `ibv_modify_qp` of this QP's verbs QP `ptr` with an attribute struct and mask of [`attr`]; a failure
    /// names `step` (`INIT→RTR`).
    ///
    /// # Errors
    /// [`Error::Verbs`] with the errno.
    fn modify(&self, ptr: *mut sys::ibv_qp, (mut a, mask): (sys::ibv_qp_attr, u32), step: &str) -> Result<()> {
        // SAFETY: `ptr` is this QP's live verbs QP (`QpKind::Verbs`, destroyed only by `Drop`); `a` is a zeroed,
        // filled attribute struct and the mask names the fields set.
        let ret = unsafe { sys::ibv_modify_qp(ptr, &mut a, mask as i32) };
        check(ret, format!("ibv_modify_qp({step}) of QP {:#x} on {}", self.handle.qpn, self.nic.ctx.name))
    }

    /// Runs `steps`, the transitions of verbs QP `ptr` after RESET → INIT, and when one fails moves the QP to
    /// ERR ([`attr::err`]) before returning that failure, as the DevX path does
    /// ([`devx::to_err_on_failure`](crate::nic::devx::to_err_on_failure)): in ERR every WQE posted later
    /// completes with a flush error (0x05), where in INIT or RTR it would never run. A failed move to ERR is
    /// logged as a `tracing` warning, and the transitions' error returned all the same.
    ///
    /// # Errors
    /// The error `steps` returned.
    fn to_err_on_failure(&self, ptr: *mut sys::ibv_qp, steps: impl FnOnce() -> Result<()>) -> Result<()> {
        let e = match steps() {
            Ok(()) => return Ok(()),
            Err(e) => e,
        };
        if let Err(e2) = self.modify(ptr, attr::err(), "→ERR") {
            tracing::warn!("QP {:#x} could not be moved to ERR after a failed transition ({e}): {e2}", self.handle.qpn);
        }
        Err(e)
    }

    /// The QP's state as the NIC reports it (`ibv_query_qp`); SQD, SQE and unknown states read as
    /// [`QpState::Error`].
    ///
    /// # Errors
    /// [`Error::Verbs`] for `ibv_query_qp`; on the DevX path [`Error::DevxCmd`] for QUERY_QP.
    pub fn state(&self) -> Result<QpState> {
        let ptr = match &self.kind {
            QpKind::Verbs(p) => *p,
            QpKind::Devx { obj, .. } => {
                let obj = obj.as_ref().ok_or_else(|| Error::InvalidArgument("QP is being destroyed".into()))?;
                return self.nic.state_devx(obj, self.handle.qpn);
            }
        };
        let mut a = sys::ibv_qp_attr::default();
        let mut init = sys::ibv_qp_init_attr::default();
        // SAFETY: `ptr` is a live QP; both out-parameters are zeroed structs of the right types.
        let ret = unsafe { sys::ibv_query_qp(ptr, &mut a, sys::IBV_QP_STATE as i32, &mut init) };
        check(ret, "ibv_query_qp")?;
        Ok(match a.qp_state {
            sys::IBV_QPS_RESET => QpState::Reset,
            sys::IBV_QPS_INIT => QpState::Init,
            sys::IBV_QPS_RTR => QpState::Rtr,
            sys::IBV_QPS_RTS => QpState::Rts,
            _ => QpState::Error,
        })
    }
}
