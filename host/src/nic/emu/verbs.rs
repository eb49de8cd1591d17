//! gdaki's own PDs, CQs and QPs on the emulated NIC, made of its firmware commands as a DevX user makes them
//! on a ConnectX: queue memory registered as a umem, a UAR page, then CREATE_CQ / CREATE_QP and the state
//! transitions, built by [`crate::nic::devx`] and answered by [`EmuNic::devx_cmd`]. There is one model of a
//! CQ and a QP, the firmware's; these calls are what rdma-core's verbs provider is to a ConnectX: they check
//! their arguments in the caller's terms, fill the CQ ring, pick a PSN, and release everything on drop. The
//! host API's [`Cq`] and [`Qp`] live here; the executor's side of each (`CqInner`, `QpInner`) below, in `cq`
//! and `qp`.

use std::sync::Arc;

use gdaki_shared::handle::{CqHandle, QpHandle, SqState};
use gdaki_shared::prm::cmd::qpc;
use gdaki_shared::prm::cqe::CQE_SIZE;
use gdaki_shared::prm::uar::{BF_OFFSET, BF_WRITE_SIZE};
use gdaki_shared::prm::wqe::WQEBB;

use crate::mem::MemKind;
use crate::nic::devx::{self, AddressPath, CqAttr, EmuObj, Grh, Init2Rtr, QpAttr, Rq, Rst2Init, Rtr2Rts, Transport};
use crate::{EmuError, Error, Result};

use super::cq::{self, CqInner, MAX_CQE};
use super::fw::{self, cmd_syndrome, UmemBuf};
use super::guard::lock;
use super::mr::{Access, Pd};
use super::qp::{Endpoint, QpInner, QpState, MAX_WQE_CNT, MIN_WQE_CNT};
use super::EmuNic;

/// Bytes set aside for a doorbell record after a ring in the same umem (one cache line).
const DBR_SLOT: usize = 64;

/// A completion queue. Created by [`EmuNic::create_cq`] (CREATE_CQ); the QPs that complete into it keep it
/// alive, and it is destroyed (DESTROY_CQ) when the last of it and its QPs is dropped.
///
/// The executor reaches a CQ only through a QP that completes into it, never holding a CQ of its own, and
/// `Qp::drop` makes sure the executor never holds a QP's last reference; so a CQ's memory is freed by whoever
/// drops the last of the CQ and its QPs, never by the executor thread, and dropping a CQ needs no wait.
#[derive(Debug)]
pub struct Cq {
    pub(crate) nic: Arc<EmuNic>,
    pub(crate) inner: Arc<CqInner>,
    /// The firmware CQ, shared with the QPs that complete into it.
    pub(crate) obj: Arc<CqObject>,
}

impl Cq {
    /// The CQ number (unique within its NIC).
    pub fn cqn(&self) -> u32 {
        self.inner.cqn
    }

    /// Entries in the ring (a power of two).
    pub fn ncqe(&self) -> u32 {
        self.inner.ncqe
    }

    /// The device handle: ring and dbrec addresses (device-visible), size, CQN; consumer index at the CQEs
    /// produced so far (zero for a new CQ).
    pub fn handle(&self) -> CqHandle {
        self.inner.handle()
    }

    /// CQEs the NIC has written into this CQ so far (64-bit producer count).
    pub fn produced(&self) -> u64 {
        self.inner.produced()
    }

    /// Whether the CQ overran and stopped taking CQEs.
    pub fn is_error(&self) -> bool {
        self.inner.is_error()
    }
}

/// An RC queue pair. Created by [`EmuNic::create_qp`] in the RESET state; [`Qp::connect`] brings it to RTS.
/// Dropping it destroys it (DESTROY_QP): the NIC stops watching its doorbell, and peers' WQEs to it fail with
/// syndrome 0x15 (transport retry exceeded), as when a remote QP goes away.
///
/// Drop is synchronous with the NIC's executor thread (as `ibv_destroy_qp` is with the HCA): once it
/// returns, no WQE of this QP runs, no CQE for it is written (its own, or a responder CQE of a peer's WRITE
/// with immediate), and the queue memory has been freed by the dropping thread, never by the executor. It
/// waits at most a few seconds for the executor (which finishes the batch of WQEs it is running), and not at
/// all when the executor thread is not running.
#[derive(Debug)]
pub struct Qp {
    pub(crate) nic: Arc<EmuNic>,
    pub(crate) inner: Arc<QpInner>,
    /// The PSN this QP's requests start at (RTR2RTS's `next_send_psn`), chosen when it was created.
    pub(crate) psn: u32,
    /// The umem, UAR page and CQs behind it, released after DESTROY_QP.
    pub(crate) res: QpResources,
}

impl Qp {
    /// The QP number (24 bits).
    pub fn qpn(&self) -> u32 {
        self.inner.qpn
    }

    /// What a peer passes to its [`Qp::connect`].
    pub fn endpoint(&self) -> Endpoint {
        Endpoint { nic: self.nic.id(), qpn: self.inner.qpn, psn: self.psn, wire: self.nic.wire_addr() }
    }

    /// Current state. A QP that a DESTROY_QP command destroyed under this handle (`devx_cmd`) reads as
    /// [`QpState::Error`], whatever state it was in: the NIC no longer has it, and QUERY_QP refuses it as
    /// `ibv_query_qp` fails on a destroyed QP, which [`crate::nic::Qp::state`] reads as the error state.
    pub fn state(&self) -> QpState {
        if self.inner.is_destroyed() {
            return QpState::Error;
        }
        self.inner.state()
    }

    /// Why this QP's wire connection went down, once it did, naming the peer QP and its address (e.g. `peer QP
    /// 0x1a2 at 10.0.0.2:40123 stalled mid-frame: ...`, `no response from peer QP ... within 4s`); `None` while
    /// it is up or connecting, and for a QP whose peer is on the same NIC. The error CQEs of the QP's WQEs
    /// carry only the syndrome (0x15); this says what happened.
    pub fn wire_error(&self) -> Option<String> {
        self.inner.link.get()?.error()
    }

    /// SQ size in WQEBBs.
    pub fn wqe_cnt(&self) -> u32 {
        self.inner.wqe_cnt
    }

    /// WQEBBs the NIC has consumed from the SQ so far (64-bit count; executed, failed and flushed WQEs).
    pub fn sq_consumed(&self) -> u64 {
        lock(&self.inner.progress).consumed
    }

    /// The device handle: SQ ring, dbrec and BlueFlame register addresses (device-visible addresses of the
    /// queue memory), `wqe_cnt`, QPN, the CQ's handle, and software counters where the NIC is: the producer
    /// and retired indices at the WQEBBs the NIC has consumed, the CQ consumer index at the CQEs it has
    /// produced (all zero for a new QP).
    ///
    /// A handle carries the device's position in the SQ and CQ; take a new one only while no other handle of
    /// this QP has work in flight (everything flushed and its CQEs polled), or the two disagree about where
    /// the queues are.
    pub fn handle(&self) -> QpHandle {
        let q = &self.inner;
        let consumed = self.sq_consumed();
        QpHandle {
            sq_buf: q.sq.device_addr(),
            dbrec: q.dbrec.device_addr(),
            bf_reg: q.uar.device_addr() + BF_OFFSET as u64,
            wqe_cnt: q.wqe_cnt,
            qpn: q.qpn,
            cq: q.cq.handle(),
            sq: SqState::at(consumed),
            placement: q.sq.placement(),
            // The register takes one WQEBB; a doorbell-only UAR takes no BlueFlame write.
            bf_size: if self.nic.fab.blueflame { BF_WRITE_SIZE as u32 } else { 0 },
            // A new handle knows of no error yet; the NIC still flushes WQEs of a QP in the error state.
            ..QpHandle::default()
        }
    }
}

/// The firmware CQ behind a [`Cq`], shared with the QPs that complete into it: destroyed (DESTROY_CQ, then its
/// umem deregistered) when the last of them is dropped, so that a CQ may be dropped before its QPs.
#[derive(Debug)]
pub(crate) struct CqObject {
    nic: Arc<EmuNic>,
    cqn: u32,
    umem: u32,
}

impl Drop for CqObject {
    fn drop(&mut self) {
        // The umem goes even when DESTROY_CQ fails (a CQ destroyed by a command already); the firmware
        // refuses it while a live CQ uses it.
        let destroyed = self.nic.obj_destroy(EmuObj::Cq(self.cqn));
        let umem = self.nic.devx_umem_dereg(self.umem);
        let r = destroyed.and(umem);
        if let Err(e) = r {
            tracing::warn!("emulated NIC: destroying CQ {:#x} failed: {e}", self.cqn);
            self.nic.fab.drops.record("an emulated CQ", e);
        }
    }
}

/// What a [`Qp`] holds besides the firmware QP: its umem (work queue and doorbell record), its UAR page and
/// its CQ, released after DESTROY_QP.
#[derive(Debug)]
pub(crate) struct QpResources {
    umem: u32,
    uar: u32,
    /// Keeps the CQ's firmware object until the QP is destroyed.
    _cq: Arc<CqObject>,
}

impl Drop for Pd {
    fn drop(&mut self) {
        lock(&self.nic.fab.fw).remove_pd(self.pdn);
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        let nic = &self.nic;
        // The umem and UAR page go even when DESTROY_QP fails (a QP destroyed by a command already); the
        // firmware refuses them while a live QP uses them. The first failure is reported.
        let destroyed = nic.obj_destroy(EmuObj::Qp(self.inner.qpn));
        let umem = nic.devx_umem_dereg(self.res.umem);
        let uar = nic.devx_free_uar(self.res.uar);
        let r = destroyed.and(umem).and(uar);
        if let Err(e) = r {
            tracing::warn!("emulated NIC: destroying QP {:#x} failed: {e}", self.inner.qpn);
            nic.fab.drops.record("an emulated QP", e);
        }
    }
}

impl EmuNic {
    /// Allocates a protection domain (`ibv_alloc_pd`; a DevX user reads its number with `mlx5dv_init_obj`):
    /// [`Pd::pdn`] is what CREATE_QP's `qpc.pd` names. Dropping it deallocates it; QPs and MRs made in it keep
    /// working.
    ///
    /// # Errors
    /// [`Error::Emu`] when all 2^24 PD numbers are used.
    pub fn alloc_pd(self: &Arc<Self>) -> Result<Pd> {
        let pdn = self.fab.alloc_pdn().ok_or(Error::Emu(EmuError::Exhausted("PD numbers")))?;
        lock(&self.fab.fw).add_pd(pdn);
        Ok(Pd { nic: self.clone(), pdn })
    }

    /// Creates a CQ of `ncqe` 64-byte entries, filled with `op_own = 0xF1` (invalid, owner 1) before the NIC
    /// sees it: the ring and its doorbell record in one umem where [`EmuConfig::queues`](super::EmuConfig::queues)
    /// says, then CREATE_CQ.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] unless `ncqe` is a power of two in `1..=`[`MAX_CQE`]; the queue memory's
    /// allocation error; [`Error::DevxCmd`] if the firmware refuses the command.
    pub fn create_cq(self: &Arc<Self>, ncqe: u32) -> Result<Cq> {
        self.create_cq_in(ncqe, self.fab.queues)
    }

    /// [`EmuNic::create_cq`] with the ring and dbrec in `kind` of memory, whatever [`EmuConfig::queues`] says:
    /// [`MemKind::Host`] for a CQ that host code polls (the proxy of the Host modes).
    ///
    /// # Errors
    /// As [`EmuNic::create_cq`]; [`Error::InvalidArgument`] for GPU memory on a NIC without a GPU copier.
    ///
    /// [`EmuConfig::queues`]: super::EmuConfig::queues
    pub fn create_cq_in(self: &Arc<Self>, ncqe: u32, kind: MemKind) -> Result<Cq> {
        if !ncqe.is_power_of_two() || ncqe > MAX_CQE {
            return Err(Error::InvalidArgument(format!("ncqe {ncqe} must be a power of two <= {MAX_CQE}")));
        }
        let ring = ncqe as usize * CQE_SIZE;
        let mem = self.fab.alloc_queue(ring + DBR_SLOT, kind)?;
        cq::fill_invalid(&mem, self.fab.gpu.as_ref(), 0, ncqe)?;
        let umem = self.devx_umem_reg(UmemBuf(mem), Access::LOCAL_WRITE)?;
        let made = self.cq_uar().and_then(|uar_page| {
            let attr = CqAttr {
                log_cq_size: ncqe.ilog2() as u8,
                uar_page,
                c_eqn: 0,
                umem_id: umem,
                umem_offset: 0,
                dbr_umem_id: umem,
                dbr_offset: ring as u64,
            };
            devx::create_cq(&**self, &attr)
        });
        let made = match made {
            Ok(m) => m,
            Err(e) => {
                let _ = self.devx_umem_dereg(umem);
                return Err(e);
            }
        };
        let inner = lock(&self.fab.fw).cq_inner(made.id).ok_or(Error::Emu(EmuError::NoExecutor))?;
        let obj = Arc::new(CqObject { nic: self.clone(), cqn: made.id, umem });
        Ok(Cq { nic: self.clone(), inner, obj })
    }

    /// The UAR page gdaki's CQs name (one per NIC, allocated with the first CQ).
    fn cq_uar(&self) -> Result<u32> {
        let mut u = lock(&self.cq_uar);
        if let Some(id) = *u {
            return Ok(id);
        }
        let id = self.devx_alloc_uar()?.page_id;
        *u = Some(id);
        Ok(id)
    }

    /// Creates an RC QP in `pd` whose SQ holds `wqe_cnt` WQEBBs and completes into `cq` (sends and responder
    /// completions), in the RESET state: its SQ ring and dbrec in one umem where
    /// [`EmuConfig::queues`](super::EmuConfig::queues) says, a UAR page of its own, then CREATE_QP.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`]: `pd` or `cq` of another NIC, `wqe_cnt` not a power of two in
    /// [`MIN_WQE_CNT`]`..=`[`MAX_WQE_CNT`], or a CQ smaller than the SQ (`ncqe < wqe_cnt`: every WQEBB could need a CQE).
    /// The queue memory's allocation error; [`Error::DevxCmd`] if the firmware refuses the command.
    pub fn create_qp(self: &Arc<Self>, pd: &Pd, cq: &Cq, wqe_cnt: u32) -> Result<Qp> {
        self.create_qp_in(pd, cq, wqe_cnt, self.fab.queues)
    }

    /// [`EmuNic::create_qp`] with the SQ ring and dbrec in `kind` of memory, whatever [`EmuConfig::queues`]
    /// says: [`MemKind::Host`] for a QP that host code posts to (the proxy of the Host modes).
    ///
    /// # Errors
    /// As [`EmuNic::create_qp`]; [`Error::InvalidArgument`] for GPU memory on a NIC without a GPU copier.
    ///
    /// [`EmuConfig::queues`]: super::EmuConfig::queues
    pub fn create_qp_in(self: &Arc<Self>, pd: &Pd, cq: &Cq, wqe_cnt: u32, kind: MemKind) -> Result<Qp> {
        self.check_parent(&pd.nic, "PD")?;
        self.check_parent(&cq.nic, "CQ")?;
        if !wqe_cnt.is_power_of_two() || !(MIN_WQE_CNT..=MAX_WQE_CNT).contains(&wqe_cnt) {
            return Err(Error::InvalidArgument(format!(
                "wqe_cnt {wqe_cnt} must be a power of two in {MIN_WQE_CNT}..={MAX_WQE_CNT}"
            )));
        }
        if cq.ncqe() < wqe_cnt {
            return Err(Error::InvalidArgument(format!("CQ of {} entries is smaller than SQ of {wqe_cnt}", cq.ncqe())));
        }
        let sq = wqe_cnt as usize * WQEBB;
        let mem = self.fab.alloc_queue(sq + DBR_SLOT, kind)?;
        let umem = self.devx_umem_reg(UmemBuf(mem), Access::LOCAL_WRITE)?;
        let uar = match self.devx_alloc_uar() {
            Ok(u) => u.page_id,
            Err(e) => {
                let _ = self.devx_umem_dereg(umem);
                return Err(e);
            }
        };
        let attr = QpAttr {
            pd: pd.pdn,
            log_sq_size: wqe_cnt.ilog2() as u8,
            rq: Rq::None,
            cqn_snd: cq.cqn(),
            cqn_rcv: cq.cqn(),
            uar_page: uar,
            log_msg_max: 31,
            ts_format: qpc::ts_format::DEFAULT,
            wq_umem_id: umem,
            wq_umem_offset: 0,
            dbr_umem_id: umem,
            dbr_offset: sq as u64,
        };
        let made = devx::create_qp(&**self, &attr).and_then(|m| {
            // A random first PSN, as rdma-core's examples and NCCL pick one (24 bits).
            let mut psn = [0u8; 4];
            getrandom::fill(&mut psn).map_err(|e| EmuError::os("no random PSN", e))?;
            Ok((m.id, u32::from_le_bytes(psn) & 0x00ff_ffff))
        });
        let (qpn, psn) = match made {
            Ok(m) => m,
            Err(e) => {
                let _ = self.devx_free_uar(uar);
                let _ = self.devx_umem_dereg(umem);
                return Err(e);
            }
        };
        let inner = self.qp(qpn).ok_or(Error::Emu(EmuError::NoExecutor))?;
        let res = QpResources { umem, uar, _cq: cq.obj.clone() };
        Ok(Qp { nic: self.clone(), inner, psn, res })
    }
}

/// A locally administered MAC derived from emulated NIC `nic`: what gdaki's INIT2RTR puts in the path's
/// `rmac` (the emulated NIC does not use it).
fn mac_of(nic: u64) -> [u8; 6] {
    let b = nic.to_be_bytes();
    [0x02, b[3], b[4], b[5], b[6], b[7]]
}

impl Qp {
    /// Connects this QP to `remote` and moves it RESET → INIT → RTR → RTS with RST2INIT, INIT2RTR and
    /// RTR2RTS, as `ibv_modify_qp` with the attributes of an RC QP whose peer is `remote`: all remote rights
    /// enabled (MR rights still apply), a 4096-byte MTU, the path to the peer's NIC by its GID
    /// ([`Endpoint::gid`]), the PSNs of both endpoints.
    ///
    /// A peer on the same [`EmuNic`] (possibly this QP) is reached directly. A peer on another NIC, in this
    /// process or another one, is reached over the wire: both NICs need a [`WireConfig`](super::WireConfig),
    /// `remote`'s wire address goes into this NIC's neighbour table ([`EmuNic::add_neighbor`]), the QP with
    /// the smaller `(nic, qpn)` dials the other's listener, and WQEs posted before the connection is up wait
    /// for it (for the retry timeout at most; then they fail with 0x15).
    ///
    /// The peer must connect back to this QP (RC checks the source QPN): WQEs sent to a peer that is not
    /// connected to this QP, not in RTR/RTS or destroyed fail with syndrome 0x15 (retry exceeded).
    ///
    /// Doorbells written before this call are ignored (hardware ignores doorbells in RESET); the first WQE
    /// posted after it must carry index 0.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `remote` names no live QP of this NIC, is on another NIC while this NIC
    /// or the remote one has no wire, has a QPN or PSN over 24 bits, or this QP is not in RESET (connect
    /// once) or was destroyed by a DESTROY_QP command; these leave the QP as it was. [`Error::DevxCmd`] if the
    /// firmware refuses a transition (INIT2RTR when the dialing thread could not start: `INTERNAL_ERR`); one
    /// refused after RST2INIT leaves the QP in ERR (`2ERR`, best effort: a failure of it is logged), where
    /// every WQE posted later completes with a flush error (0x05) instead of never running: create a new QP
    /// to retry.
    pub fn connect(&self, remote: &Endpoint) -> Result<()> {
        if remote.qpn > 0x00ff_ffff || remote.psn > 0x00ff_ffff {
            return Err(Error::InvalidArgument(format!(
                "endpoint QPN {:#x} or PSN {:#x} over 24 bits",
                remote.qpn, remote.psn
            )));
        }
        let nic = &*self.nic;
        let qpn = self.inner.qpn;
        // Checked before anything changes: the neighbour table below is the NIC's, not this QP's.
        if self.inner.is_destroyed() {
            return Err(Error::InvalidArgument(format!("QP {qpn:#x} was destroyed by a DESTROY_QP command")));
        }
        if self.state() != QpState::Reset {
            return Err(Error::InvalidArgument(format!(
                "QP {qpn:#x} is in state {:?}; connect needs RESET",
                self.state()
            )));
        }
        if remote.nic != nic.id() {
            match (nic.wire_addr(), remote.wire) {
                (Some(_), Some(w)) => nic.add_neighbor(&remote.gid(), w)?,
                _ => {
                    return Err(Error::InvalidArgument(format!(
                        "endpoint of NIC {:#x} cannot be reached from NIC {:#x}: both NICs need a wire \
                         (EmuConfig::wire) to connect across NICs",
                        remote.nic,
                        nic.id()
                    )))
                }
            }
        }
        // What INIT2RTR would refuse, refused before the QP leaves RESET.
        let reach = fw::reach(&nic.fab, &lock(&nic.fab.fw), remote.nic, remote.qpn);
        match reach {
            Ok(_) => {}
            Err(cmd_syndrome::REMOTE_QPN) => {
                return Err(Error::InvalidArgument(format!("no QP {:#x} on this NIC", remote.qpn)))
            }
            Err(s) => {
                return Err(Error::InvalidArgument(format!(
                    "QP {:#x} of NIC {:#x}: {}",
                    remote.qpn,
                    remote.nic,
                    cmd_syndrome::describe(s).unwrap_or("unreachable")
                )))
            }
        }
        let obj = EmuObj::Qp(qpn);
        let all = Rst2Init { port: 1, pkey_index: 0, remote_read: true, remote_write: true, remote_atomic: true };
        devx::rst2init(nic, &obj, qpn, &all)?;
        let grh = Grh { rgid: remote.gid(), src_addr_index: 0, hop_limit: 64, tclass: 0, flow_label: 0 };
        let rtr = Init2Rtr {
            remote_qpn: remote.qpn,
            rq_psn: remote.psn,
            mtu: qpc::mtu::MTU_4K,
            log_msg_max: 31,
            min_rnr_nak: 12,
            log_rra_max: 4,
            port: 1,
            // RoCE v2's UDP source port from the QPN, in the range RFC 8085 leaves for it (0xc000..).
            path: AddressPath::RoceV2 {
                grh,
                rmac: mac_of(remote.nic),
                udp_sport: 0xc000 | (qpn as u16 & 0x3fff),
                eth_prio: 0,
            },
        };
        let rts = Rtr2Rts { sq_psn: self.psn, ack_timeout: 14, retry_count: 7, rnr_retry: 7, log_sra_max: 4, port: 1 };
        // Out of RESET, a failed step leaves the QP in ERR, where later WQEs are flushed rather than ignored.
        devx::to_err_on_failure(nic, &obj, qpn, || {
            devx::init2rtr(nic, &obj, qpn, &rtr)?;
            devx::rtr2rts(nic, &obj, qpn, &rts)
        })
    }
}
