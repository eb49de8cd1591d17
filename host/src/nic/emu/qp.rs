//! RC queue pairs: their queue memory, state machine and connection to a peer QP.
//!
//! Each QP owns, in queue memory: the SQ ring (`wqe_cnt` × 64-byte WQEBBs), a doorbell record ([`QpDbrec`],
//! word 1 = SQ counter) and one 4096-byte UAR page whose doorbell/BlueFlame register is at offset 0x800.
//! There is no receive queue yet: inbound RDMA WRITE with immediate completes on the QP's CQ without
//! consuming a receive WQE (hardware would need one posted, and would NAK with RNR without it).
//!
//! [`QpDbrec`]: gdaki_shared::prm::dbrec::QpDbrec

use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use gdaki_shared::handle::QpHandle;
use gdaki_shared::prm::uar::{BF_OFFSET, BF_WRITE_SIZE};

use crate::mem::MappedBuf;

use super::qmem::QBuf;
use crate::{EmuError, Error, Result};

use super::cq::CqInner;
use super::sq::SqProgress;
use super::wire::{link, Link};
use super::{lock, qmem, EmuNic};

/// Smallest SQ, in WQEBBs ([`QpHandle::wqe_cnt`] promises device code at least this many).
pub const MIN_WQE_CNT: u32 = 16;

/// Largest SQ, in WQEBBs (2^15, ConnectX's `max_qp_wr`). With at most 2^15 WQEBBs between two doorbells, two
/// different doorbells never carry the same 16-bit index, so a change of the register is always new work.
pub const MAX_WQE_CNT: u32 = 1 << 15;

/// State of a QP (`enum ibv_qp_state`, the states an RC requester uses).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum QpState {
    /// Just created; doorbells are ignored.
    Reset = 0,
    /// Initialized (port, access rights).
    Init = 1,
    /// Ready to receive: the QP answers as a responder.
    Rtr = 2,
    /// Ready to send: the NIC acts on the QP's doorbells.
    Rts = 3,
    /// A WQE failed (or the CQ overran): every later WQE completes with a flush error (syndrome 0x05).
    Error = 4,
}

impl QpState {
    fn from_u8(v: u8) -> QpState {
        match v {
            0 => QpState::Reset,
            1 => QpState::Init,
            2 => QpState::Rtr,
            3 => QpState::Rts,
            _ => QpState::Error,
        }
    }
}

/// What a peer needs to connect to a QP (the QP info RC peers exchange out of band): the NIC it lives on, its
/// QP number, the PSN its requests start at, and where its NIC listens for other processes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Endpoint {
    /// Identifier of the [`EmuNic`]: random, so unique across processes and hosts in practice.
    pub nic: u64,
    /// QP number (24 bits).
    pub qpn: u32,
    /// First PSN of this QP's requests (24 bits; `sq_psn` of `ibv_modify_qp`, the peer's `rq_psn`).
    pub psn: u32,
    /// The NIC's wire listener ([`EmuNic::wire_addr`]); `None` when the NIC was opened without a wire, and
    /// then only QPs of the same NIC can connect to this one.
    pub wire: Option<SocketAddr>,
}

/// Bytes of [`Endpoint::to_bytes`].
pub const ENDPOINT_BYTES: usize = 40;

impl Endpoint {
    /// A fixed 40-byte encoding (little-endian numbers; IPv4 or IPv6 address and port), for exchange through a
    /// bootstrap.
    pub fn to_bytes(&self) -> [u8; ENDPOINT_BYTES] {
        let mut b = [0u8; ENDPOINT_BYTES];
        b[0..8].copy_from_slice(&self.nic.to_le_bytes());
        b[8..12].copy_from_slice(&self.qpn.to_le_bytes());
        b[12..16].copy_from_slice(&self.psn.to_le_bytes());
        if let Some(a) = self.wire {
            b[16] = if a.is_ipv4() { 4 } else { 6 };
            b[18..20].copy_from_slice(&a.port().to_le_bytes());
            let ip = match a.ip() {
                IpAddr::V4(v4) => v4.to_ipv6_mapped(),
                IpAddr::V6(v6) => v6,
            };
            b[24..40].copy_from_slice(&ip.octets());
        }
        b
    }

    /// Decodes [`Endpoint::to_bytes`].
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a length other than [`ENDPOINT_BYTES`], an address family other than
    /// none/4/6, a QPN or PSN over 24 bits, or nonzero padding.
    pub fn from_bytes(b: &[u8]) -> Result<Endpoint> {
        let bad = |what: &str| Error::InvalidArgument(format!("endpoint bytes: {what}"));
        let b: &[u8; ENDPOINT_BYTES] =
            b.try_into().map_err(|_| bad(&format!("{} bytes, not {ENDPOINT_BYTES}", b.len())))?;
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let (qpn, psn) = (u32_at(8), u32_at(12));
        if qpn > 0x00ff_ffff || psn > 0x00ff_ffff {
            return Err(bad("QPN or PSN over 24 bits"));
        }
        if b[17] != 0 || b[20..24] != [0; 4] {
            return Err(bad("padding not zero"));
        }
        let mut ip = [0u8; 16];
        ip.copy_from_slice(&b[24..40]);
        let ip = Ipv6Addr::from(ip);
        let port = u16::from_le_bytes([b[18], b[19]]);
        let wire = match b[16] {
            0 if port == 0 && ip.is_unspecified() => None,
            4 => Some(SocketAddr::new(
                IpAddr::V4(ip.to_ipv4_mapped().ok_or_else(|| bad("IPv4 flag on an IPv6 address"))?),
                port,
            )),
            6 => Some(SocketAddr::new(IpAddr::V6(ip), port)),
            _ => return Err(bad("unknown address family")),
        };
        let mut nic = [0u8; 8];
        nic.copy_from_slice(&b[0..8]);
        Ok(Endpoint { nic: u64::from_le_bytes(nic), qpn, psn, wire })
    }
}

/// An RC queue pair. Created by [`EmuNic::create_qp`] in the RESET state; [`Qp::connect`] brings it to RTS.
/// Dropping it destroys it: the NIC stops watching its doorbell, and peers' WQEs to it fail with syndrome
/// 0x15 (transport retry exceeded), as when a remote QP goes away.
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
}

/// The QP as the executor uses it.
#[derive(Debug)]
pub(crate) struct QpInner {
    pub qpn: u32,
    pub pdn: u32,
    pub wqe_cnt: u32,
    pub sq: QBuf,
    pub dbrec: QBuf,
    pub uar: MappedBuf,
    pub cq: Arc<CqInner>,
    state: AtomicU8,
    destroyed: AtomicBool,
    /// The connected peer's QPN. The executor looks the peer up in the NIC's QP map, so that it never holds
    /// a destroyed QP (QPNs are never reused within a NIC).
    pub peer: OnceLock<u32>,
    /// Executor-side SQ state (the executor is the only user once the QP is in RTS).
    pub progress: Mutex<SqProgress>,
    /// Responder CQEs written for this QP: their `wqe_counter` (there is no RQ to index).
    pub resp_count: AtomicU64,
    /// First PSN of this QP's requests (24 bits, random).
    pub psn: u32,
    /// The connection to a peer on another NIC, set once by `Qp::connect`.
    pub link: OnceLock<Arc<Link>>,
}

impl QpInner {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        qpn: u32,
        psn: u32,
        pdn: u32,
        wqe_cnt: u32,
        sq: QBuf,
        dbrec: QBuf,
        uar: MappedBuf,
        cq: Arc<CqInner>,
    ) -> Self {
        Self {
            qpn,
            pdn,
            wqe_cnt,
            sq,
            dbrec,
            uar,
            cq,
            state: AtomicU8::new(QpState::Reset as u8),
            destroyed: AtomicBool::new(false),
            peer: OnceLock::new(),
            progress: Mutex::new(SqProgress::default()),
            resp_count: AtomicU64::new(0),
            psn,
            link: OnceLock::new(),
        }
    }

    pub(crate) fn state(&self) -> QpState {
        QpState::from_u8(self.state.load(Ordering::Acquire))
    }

    pub(crate) fn set_state(&self, s: QpState) {
        self.state.store(s as u8, Ordering::Release);
    }

    pub(crate) fn is_destroyed(&self) -> bool {
        self.destroyed.load(Ordering::Acquire)
    }

    /// Whether the QP answers requests from QP `from`: alive, connected back to `from`, in RTR or RTS.
    pub(crate) fn responds_to(&self, from: u32) -> bool {
        !self.is_destroyed() && matches!(self.state(), QpState::Rtr | QpState::Rts) && self.peer.get() == Some(&from)
    }

    /// The current value of the doorbell register (UAR + 0x800), as stored (big-endian fields).
    pub(crate) fn doorbell(&self) -> u64 {
        qmem::load_u64(&self.uar, BF_OFFSET, Ordering::Acquire)
    }
}

impl Qp {
    /// The QP number (24 bits).
    pub fn qpn(&self) -> u32 {
        self.inner.qpn
    }

    /// What a peer passes to its [`Qp::connect`].
    pub fn endpoint(&self) -> Endpoint {
        Endpoint { nic: self.nic.id(), qpn: self.inner.qpn, psn: self.inner.psn, wire: self.nic.wire_addr() }
    }

    /// Current state.
    pub fn state(&self) -> QpState {
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
            sq_pi: consumed,
            sq_ci: consumed,
            sq_sig_first: consumed,
            sq_sig_end: consumed,
            placement: q.sq.placement(),
            // A new handle knows of no error yet; the NIC still flushes WQEs of a QP in the error state.
            ..QpHandle::default()
        }
    }

    /// Connects this QP to `remote` and moves it RESET → INIT → RTR → RTS, as `ibv_modify_qp` with the
    /// attributes of an RC QP whose peer is `remote`. All remote access rights are enabled on the responder
    /// side; MR rights still apply.
    ///
    /// A peer on the same [`EmuNic`] (possibly this QP) is reached directly. A peer on another NIC, in this
    /// process or another one, is reached over the wire: both NICs need a [`WireConfig`](super::WireConfig),
    /// the QP with the smaller `(nic, qpn)` dials the other's listener, and WQEs posted before the connection
    /// is up wait for it (for the retry timeout at most; then they fail with 0x15).
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
    /// once). [`Error::Emu`] when the dialing thread cannot be started.
    pub fn connect(&self, remote: &Endpoint) -> Result<()> {
        let local = self.endpoint();
        if remote.qpn > 0x00ff_ffff || remote.psn > 0x00ff_ffff {
            return Err(Error::InvalidArgument(format!(
                "endpoint QPN {:#x} or PSN {:#x} over 24 bits",
                remote.qpn, remote.psn
            )));
        }
        let link = if remote.nic == self.nic.id() {
            if self.nic.qp(remote.qpn).is_none() {
                return Err(Error::InvalidArgument(format!("no QP {:#x} on this NIC", remote.qpn)));
            }
            None
        } else {
            let (Some(_), Some(_)) = (local.wire, remote.wire) else {
                return Err(Error::InvalidArgument(format!(
                    "endpoint of NIC {:#x} cannot be reached from NIC {:#x}: both NICs need a wire (EmuConfig::wire) \
                     to connect across NICs",
                    remote.nic,
                    self.nic.id()
                )));
            };
            Some(Arc::new(Link::new(local, *remote)))
        };
        let q = &self.inner;
        q.state
            .compare_exchange(QpState::Reset as u8, QpState::Init as u8, Ordering::AcqRel, Ordering::Acquire)
            .map_err(|s| {
                Error::InvalidArgument(format!(
                    "QP {:#x} is in state {:?}; connect needs RESET",
                    q.qpn,
                    QpState::from_u8(s)
                ))
            })?;
        // Only the RESET → INIT winner gets here, so the peer (or link) is set once.
        let dialer = match link {
            Some(link) => {
                let _ = q.link.set(link.clone());
                link.dials().then_some(link)
            }
            None => {
                let _ = q.peer.set(remote.qpn);
                None
            }
        };
        q.set_state(QpState::Rtr);
        {
            // Doorbells written before RTS are ignored: the register is cleared (software never reads a UAR,
            // so only the NIC sees this), and the next write, even of the same value, is a change.
            let mut p = lock(&q.progress);
            qmem::store_u64(&q.uar, BF_OFFSET, 0, Ordering::Relaxed);
            clear_blueflame(&q.uar, self.nic.fab.bf_sentinel);
            p.last_db = 0;
        }
        q.set_state(QpState::Rts);
        // The dialer starts in RTS: frames it reads from the peer (requests already queued there) would be
        // dropped by a QP still in INIT, failing them with 0x15 after the retry timeout.
        if let Some(link) = dialer {
            let timeout = self.nic.retry_timeout();
            link::spawn_dialer(link, self.nic.mailbox()?, timeout)
                .map_err(|e| EmuError::os(format!("starting the wire thread of QP {:#x}", q.qpn), e))?;
        }
        tracing::debug!(qpn = q.qpn, peer = remote.qpn, "emulated NIC: QP in RTS");
        Ok(())
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        self.inner.destroyed.store(true, Ordering::Release);
        // The executor checks `destroyed` again under the progress lock: taking the lock here waits for a
        // batch it is running, and every later poll sees the flag. So no WQE of this QP starts after this
        // point, even if the wait for the executor below gives up.
        drop(lock(&self.inner.progress));
        let gen = self.nic.remove_qp(self.inner.qpn);
        // Until the executor has swept with a list that no longer holds this QP, it may still hold an
        // `Arc` of it (in its list, or as a peer it cached): wait, so that `self.inner` is the last one.
        self.nic.wait_for_executor(gen);
        // The peer across the wire sees the connection end (its outstanding WQEs fail), and the link's threads
        // stop. The executor's refresh has done so already, after sending what this QP owed the peer for
        // requests it executed (`requester::farewell`); this is for a link the executor never took up, or an
        // executor that did not answer.
        if let Some(link) = self.inner.link.get() {
            link.close();
        }
    }
}

/// Fills words 1..8 of the BlueFlame register in `uar` with `sentinel`: what the NIC leaves there after each
/// doorbell it acts on, so that words a later BlueFlame write stored are told apart from stale ones.
pub(crate) fn clear_blueflame(uar: &MappedBuf, sentinel: u64) {
    for w in 1..BF_WRITE_SIZE / 8 {
        qmem::store_u64(uar, BF_OFFSET + 8 * w, sentinel, Ordering::Relaxed);
    }
}
