//! RC queue pairs as the executor uses them: their queues, state and connection to a peer QP, made and moved
//! by the firmware's commands (`fw`). The host API's [`Qp`](super::Qp) over one is in `verbs`.
//!
//! Each QP uses, in the umems CREATE_QP named: the SQ ring (`wqe_cnt` × 64-byte WQEBBs) and a doorbell record
//! ([`QpDbrec`], word 1 = SQ counter); and one 4096-byte UAR page whose doorbell/BlueFlame register is at
//! offset 0x800. There is no receive queue yet: inbound RDMA WRITE with immediate completes on the QP's
//! receive CQ without consuming a receive WQE (hardware would need one posted, and would NAK with RNR
//! without it).
//!
//! [`QpDbrec`]: gdaki_shared::prm::dbrec::QpDbrec

use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use gdaki_shared::prm::cmd::qpc;
use gdaki_shared::prm::uar::{BF_BUF_SIZE, BF_OFFSET};

use crate::{Error, Result};

use super::cq::CqInner;
use super::exec::Responder;
use super::guard::lock;
use super::mr::Access;
use super::qmem;
use super::qmem::{HostView, QBuf};
use super::wire::Link;

/// The SQ sizes the NIC takes are the ones device code posts to (16 ..= 2^15 WQEBBs, a power of two): the
/// limits are the device crate's. With at most 2^15 WQEBBs between two doorbells, two different doorbells never
/// carry the same 16-bit index, so a change of the register is always new work.
pub use gdaki_device::sq::{MAX_WQE_CNT, MIN_WQE_CNT};

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
    /// A WQE failed (or the CQ overran): every later WQE completes with a flush error (syndrome 0x05). Also
    /// what [`Qp::state`](super::Qp::state) reads for a QP that a DESTROY_QP command destroyed.
    Error = 4,
}

impl QpState {
    /// The state as the PRM encodes it (`qpc.state`, [`qpc::state`]).
    pub(crate) fn prm(self) -> u8 {
        match self {
            QpState::Reset => qpc::state::RST,
            QpState::Init => qpc::state::INIT,
            QpState::Rtr => qpc::state::RTR,
            QpState::Rts => qpc::state::RTS,
            QpState::Error => qpc::state::ERR,
        }
    }

    pub(crate) fn from_u8(v: u8) -> QpState {
        match v {
            0 => QpState::Reset,
            1 => QpState::Init,
            2 => QpState::Rtr,
            3 => QpState::Rts,
            _ => QpState::Error,
        }
    }
}

/// A QP's state: read without a lock (the executor reads it on every look at the QP), changed only under
/// the cell's lock. A command takes the lock ([`StateCell::lock`]), checks the state, makes its changes and
/// moves the QP while holding it, so that a move of the executor's (to the error state) comes wholly before
/// the command (which then refuses, having changed nothing) or after it.
///
/// Lock order: a QP's `progress` lock before its state lock; under the state lock, only the `qpc` image's.
#[derive(Debug)]
pub(crate) struct StateCell {
    now: AtomicU8,
    moves: Mutex<()>,
}

impl StateCell {
    pub(crate) fn new(s: QpState) -> Self {
        Self { now: AtomicU8::new(s as u8), moves: Mutex::new(()) }
    }

    /// The current state, without the lock.
    pub(crate) fn get(&self) -> QpState {
        QpState::from_u8(self.now.load(Ordering::Acquire))
    }

    /// Takes the lock: until the returned guard is dropped, the state is what the guard makes it.
    pub(crate) fn lock(&self) -> StateLock<'_> {
        StateLock { cell: self, _held: lock(&self.moves) }
    }
}

/// A [`StateCell`]'s lock, held.
pub(crate) struct StateLock<'a> {
    cell: &'a StateCell,
    _held: MutexGuard<'a, ()>,
}

impl StateLock<'_> {
    /// The state, which nobody else changes while the lock is held.
    pub(crate) fn get(&self) -> QpState {
        self.cell.get()
    }

    /// Moves the QP to `s`.
    pub(crate) fn set(&mut self, s: QpState) {
        self.cell.now.store(s as u8, Ordering::Release);
    }
}

/// What a peer needs to connect to a QP (the QP info RC peers exchange out of band): the NIC it lives on, its
/// QP number, the PSN its requests start at, and where its NIC listens for other processes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Endpoint {
    /// Identifier of the [`EmuNic`](super::EmuNic): random, so unique across processes and hosts in practice.
    pub nic: u64,
    /// QP number (24 bits).
    pub qpn: u32,
    /// First PSN of this QP's requests (24 bits; `sq_psn` of `ibv_modify_qp`, the peer's `rq_psn`).
    pub psn: u32,
    /// The NIC's wire listener ([`EmuNic::wire_addr`](super::EmuNic::wire_addr)); `None` when the NIC was
    /// opened without a wire, and then only QPs of the same NIC can connect to this one.
    pub wire: Option<SocketAddr>,
}

/// The prefix of an emulated NIC's GID: IPv6 link-local (`fe80::/64`), as the first GID of a RoCE port is the
/// link-local address of its interface.
const GID_PREFIX: [u8; 8] = [0xfe, 0x80, 0, 0, 0, 0, 0, 0];

/// The GID of port 1, index 0, of the emulated NIC `nic` (its identifier, [`EmuNic::id`](super::EmuNic::id)): `fe80::` with the
/// identifier as the interface identifier, in wire order.
pub fn gid_of(nic: u64) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[..8].copy_from_slice(&GID_PREFIX);
    g[8..].copy_from_slice(&nic.to_be_bytes());
    g
}

/// The identifier of the emulated NIC whose GID is `gid` ([`gid_of`]), or `None` for any other GID.
pub fn nic_of_gid(gid: &[u8]) -> Option<u64> {
    let g: &[u8; 16] = gid.try_into().ok()?;
    let mut id = [0u8; 8];
    id.copy_from_slice(&g[8..]);
    let id = u64::from_be_bytes(id);
    (g[..8] == GID_PREFIX && id != 0).then_some(id)
}

/// Bytes of [`Endpoint::to_bytes`].
pub const ENDPOINT_BYTES: usize = 40;

impl Endpoint {
    /// The GID of the endpoint's NIC ([`gid_of`]): where an INIT2RTR's path leads to reach
    /// this QP.
    pub fn gid(&self) -> [u8; 16] {
        gid_of(self.nic)
    }

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

/// Executor-side state of one SQ, shared with the QP's owner (behind `QpInner::progress`).
#[derive(Debug, Default)]
pub(crate) struct SqProgress {
    /// WQEBBs consumed (executed, failed or flushed), 64-bit.
    pub consumed: u64,
    /// The doorbell register's value when last acted on. RTR2RTS and 2ERR reset it (with the register).
    pub last_db: u64,
    /// Since when the WQE at `consumed` has waited for its responder on this NIC to reach RTR (see
    /// `sq::step`); `None` while it does not wait.
    pub responder_wait: Option<std::time::Instant>,
    /// The WQE index whose error CQE a fault of the doorbell itself already wrote (`sq::act`: a bad doorbell
    /// or BlueFlame write fails the WQE at the consumer index). That CQE retires it: `sq::step` skips it
    /// without another CQE when the consumer index reaches it, so that no WQE has two completions.
    pub reported: Option<u64>,
}

/// What CREATE_QP makes a QP of, checked.
pub(crate) struct QpRes {
    pub qpn: u32,
    pub pdn: u32,
    pub wqe_cnt: u32,
    pub sq: QBuf,
    pub dbrec: QBuf,
    pub uar: HostView,
    pub cq: Arc<CqInner>,
    pub rcq: Arc<CqInner>,
    pub log_msg_max: u8,
    /// The `qpc` of the CREATE_QP command.
    pub qpc: [u8; qpc::SIZE],
}

/// The QP as the executor uses it.
#[derive(Debug)]
pub(crate) struct QpInner {
    pub qpn: u32,
    pub pdn: u32,
    pub wqe_cnt: u32,
    pub sq: QBuf,
    pub dbrec: QBuf,
    pub uar: HostView,
    /// The send CQ (`qpc.cqn_snd`).
    pub cq: Arc<CqInner>,
    /// The receive CQ (`qpc.cqn_rcv`): responder CQEs (RESP_WR_IMM).
    pub rcq: Arc<CqInner>,
    state: StateCell,
    destroyed: AtomicBool,
    /// The connected peer's QPN. The executor looks the peer up in the NIC's QP map, so that it never holds
    /// a destroyed QP (QPNs are never reused within a NIC).
    pub peer: OnceLock<u32>,
    /// Executor-side SQ state (the executor is the only user once the QP is in RTS).
    pub progress: Mutex<SqProgress>,
    /// Responder CQEs written for this QP: their `wqe_counter` (there is no RQ to index).
    pub resp_count: AtomicU64,
    /// First PSN of this QP's requests (24 bits), from RTR2RTS.
    sq_psn: AtomicU32,
    /// The remote rights RST2INIT enabled (`rre`, `rwe`, `rae`), as [`Access`] bits.
    rights: AtomicU32,
    /// log2 of the longest message (`qpc.log_msg_max`).
    log_msg_max: AtomicU8,
    /// The connection to a peer on another NIC, set once by INIT2RTR.
    pub link: OnceLock<Arc<Link>>,
    /// The `qpc` as the QP's commands set it (QUERY_QP's answer, with the state and counters filled in then).
    pub qpc: Mutex<[u8; qpc::SIZE]>,
}

impl QpInner {
    pub(crate) fn new(r: QpRes) -> Self {
        Self {
            qpn: r.qpn,
            pdn: r.pdn,
            wqe_cnt: r.wqe_cnt,
            sq: r.sq,
            dbrec: r.dbrec,
            uar: r.uar,
            cq: r.cq,
            rcq: r.rcq,
            state: StateCell::new(QpState::Reset),
            destroyed: AtomicBool::new(false),
            peer: OnceLock::new(),
            progress: Mutex::new(SqProgress::default()),
            resp_count: AtomicU64::new(0),
            sq_psn: AtomicU32::new(0),
            rights: AtomicU32::new(0),
            log_msg_max: AtomicU8::new(r.log_msg_max),
            link: OnceLock::new(),
            qpc: Mutex::new(r.qpc),
        }
    }

    pub(crate) fn state(&self) -> QpState {
        self.state.get()
    }

    /// Moves the QP to `s` whatever its state (the executor's moves to the error state), under the state
    /// lock: never in the middle of a command's move.
    pub(crate) fn set_state(&self, s: QpState) {
        self.state.lock().set(s);
    }

    /// Takes the QP's state lock, for a command that checks the state, changes the QP and moves it as one
    /// step ([`StateCell`]).
    pub(crate) fn lock_state(&self) -> StateLock<'_> {
        self.state.lock()
    }

    pub(crate) fn is_destroyed(&self) -> bool {
        self.destroyed.load(Ordering::Acquire)
    }

    /// Marks the QP destroyed (DESTROY_QP). The executor checks the flag again under the progress lock:
    /// taking the lock here waits for a batch it is running, and every later poll sees the flag, so no WQE of
    /// this QP starts after this returns.
    pub(crate) fn mark_destroyed(&self) {
        self.destroyed.store(true, Ordering::Release);
        drop(lock(&self.progress));
    }

    /// Whether the QP answers requests from QP `from`: alive, connected back to `from`, in RTR or RTS.
    pub(crate) fn responds_to(&self, from: u32) -> bool {
        !self.is_destroyed() && matches!(self.state(), QpState::Rtr | QpState::Rts) && self.peer.get() == Some(&from)
    }

    /// What requests to this QP are checked against: its PD and remote rights.
    pub(crate) fn responder(&self) -> Responder {
        Responder { pdn: self.pdn, rights: Access::from_bits(self.rights.load(Ordering::Acquire)) }
    }

    /// Sets the remote rights (RST2INIT).
    pub(crate) fn set_rights(&self, a: Access) {
        self.rights.store(a.bits(), Ordering::Release);
    }

    /// The first PSN of this QP's requests (RTR2RTS's `next_send_psn`; 0 before).
    pub(crate) fn sq_psn(&self) -> u32 {
        self.sq_psn.load(Ordering::Acquire)
    }

    /// Sets the first PSN of this QP's requests (RTR2RTS, before the QP reaches RTS).
    pub(crate) fn set_sq_psn(&self, psn: u32) {
        self.sq_psn.store(psn & 0x00ff_ffff, Ordering::Release);
    }

    /// The longest message in bytes (`2^log_msg_max`).
    pub(crate) fn max_msg(&self) -> u64 {
        1u64 << self.log_msg_max.load(Ordering::Acquire)
    }

    /// Sets `log_msg_max` (INIT2RTR).
    pub(crate) fn set_log_msg_max(&self, log: u8) {
        self.log_msg_max.store(log.min(31), Ordering::Release);
    }

    /// The current value of the doorbell register (UAR + 0x800), as stored (big-endian fields).
    pub(crate) fn doorbell(&self) -> u64 {
        qmem::load_u64(&self.uar, BF_OFFSET, Ordering::Acquire)
    }

    /// Forgets doorbells written so far, before the executor starts watching the QP (RTR2RTS, 2ERR): the
    /// register is cleared (software never reads a UAR, so only the NIC sees this) and the BlueFlame words
    /// get the sentinel, so that the next write, even of the same value, is a change. `p` is the QP's
    /// `progress`, locked.
    pub(crate) fn reset_doorbell(&self, p: &mut SqProgress, sentinel: u64) {
        clear_doorbell(&self.uar, sentinel);
        p.last_db = 0;
    }
}

/// Fills words 1..32 of the BlueFlame buffer in `uar` (the 64-byte register and what a larger write would reach)
/// with `sentinel`: what the NIC leaves there after each doorbell it acts on, so that words a later BlueFlame
/// write stored are told apart from stale ones.
pub(crate) fn clear_blueflame(uar: &HostView, sentinel: u64) {
    for w in 1..BF_BUF_SIZE / 8 {
        qmem::store_u64(uar, BF_OFFSET + 8 * w, sentinel, Ordering::Relaxed);
    }
}

/// Clears the doorbell register in `uar` (word 0) and fills its BlueFlame words with `sentinel`, as a new UAR
/// page or a new QP's page starts.
pub(crate) fn clear_doorbell(uar: &HostView, sentinel: u64) {
    qmem::store_u64(uar, BF_OFFSET, 0, Ordering::Relaxed);
    clear_blueflame(uar, sentinel);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_move_under_the_state_lock_is_not_interleaved_with_another() {
        let cell = Arc::new(StateCell::new(QpState::Rtr));
        let mut st = cell.lock();
        assert_eq!(st.get(), QpState::Rtr);
        // The executor's move to the error state, while a command holds the lock between its check and its move.
        let mover = {
            let cell = cell.clone();
            std::thread::spawn(move || cell.lock().set(QpState::Error))
        };
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert_eq!(st.get(), QpState::Rtr, "the state moved under the lock");
        assert!(!mover.is_finished(), "a move went past the lock");
        st.set(QpState::Rts);
        assert_eq!(cell.get(), QpState::Rts);
        drop(st);
        mover.join().unwrap();
        // The command's move came wholly first; the executor's after it.
        assert_eq!(cell.get(), QpState::Error);
    }

    #[test]
    fn gids_carry_the_nic_identifier() {
        let g = gid_of(0x0123_4567_89ab_cdef);
        assert_eq!(g[..8], GID_PREFIX);
        assert_eq!(nic_of_gid(&g), Some(0x0123_4567_89ab_cdef));
        assert_eq!(nic_of_gid(&gid_of(0)), None);
        let mut other = g;
        other[0] = 0x20;
        assert_eq!(nic_of_gid(&other), None);
        assert_eq!(nic_of_gid(&g[..15]), None);
    }
}
