//! Faults on the emulated NIC, each with the exact outcome it must have: the catalogue that the `faults`
//! example prints as a table and `host/tests/faults.rs` asserts case by case.
//!
//! Every case builds its own NICs, QPs and buffers, drives them with device code (`gdaki_device::qp::Qp`:
//! `post`, `put`, `signal`, `wait`, `flush`, `wait_semaphore`) on the calling host thread (the `cpu`
//! executor), and observes:
//! - the **outcome** device code sees: an error CQE's syndrome (and the emulator's vendor syndrome, which names
//!   the check that fired), a successful completion, a bounded wait's timeout and what it waited for, or (for a
//!   CQ overrun, which has no CQE) the CQ and QP error states;
//! - the requester **QP's state** afterwards ([`QpState`]);
//! - **bytes changed outside the permitted range**: every buffer of both sides is a guarded buffer (64 guard
//!   bytes on each side of the registered middle, every byte filled with a position-dependent pattern), and
//!   every byte that no longer holds its pattern outside what the case's good operations were allowed to
//!   write is counted (queue memory too, where the case is about a queue: SQ ring bytes overwritten, CQ
//!   entries overwritten); it must be 0;
//! - **how long the waiter waited**, against its bound: every device-side wait is bounded, and must end with
//!   the error well before its bound, or with its timeout (plus a small slack) where a timeout is the outcome;
//! - case-specific **checks** (the error CQE names the failed WQE, later WQEs are flushed with 0x05, the NIC
//!   executed nothing extra, ...).
//!
//! A case passes when all of these hold. Faults that a peer answers (keys, bounds, rights, alignment) run
//! across the wire (two NICs connected over loopback TCP, endpoints exchanged as bytes: what two processes
//! meet) and on the direct path (one NIC); the SIGKILL case runs its peer in a child process, which the
//! caller starts ([`Ctx::new`]; the child runs [`run_peer`]).
//!
//! | fault | expected outcome |
//! |---|---|
//! | bad lkey (RDMA WRITE) | 0x04 `LOCAL_PROT_ERR` |
//! | bad rkey; remote address past the MR end; MR without the remote right | 0x13 `REMOTE_ACCESS_ERR` |
//! | atomic on a 4-byte aligned address | 0x12 `REMOTE_INVAL_REQ_ERR` |
//! | zero-byte RDMA WRITE (empty inline, or no data segment as rdma-core posts it) | completes, writes nothing |
//! | WQE with another QP's number; atomic with ds 3 | 0x02 `LOCAL_QP_OP_ERR` |
//! | SQ full (peer silent, 17th WQE on a 16-WQEBB SQ) | `Timeout(SqSpace)`, no WQE overwritten |
//! | CQ overrun (17 CQEs due on a 16-entry CQ never polled) | CQ and QP in error, no CQE overwritten |
//! | doorbell never rung (dbrec written) | `Timeout(Cqe)`, nothing executed |
//! | peer process killed with SIGKILL mid 64 MiB | first unacknowledged WQE 0x15, the rest 0x05 |
//! | peer unreachable (retry timeout 300 ms) | 0x15 after ≥ 300 ms, < 3 s |
//! | error CQE on one QP while waiting on a semaphore fed by another | the wait returns 0x13 at once |
//!
//! Syndromes are the PRM's (`MLX5_CQE_SYNDROME_*`, [`gdaki_shared::prm::opcode::syndrome`]); vendor
//! syndromes are the emulator's own ([`vendor`]).

mod access;
mod guard;
mod peer;
mod queue;
mod rig;

use std::fmt;
use std::process::Command;
use std::time::{Duration, Instant};

use gdaki_shared::prm::opcode::syndrome;

use gdaki::nic::emu::{vendor, QpState};

use access::Bad;
use rig::Path;

pub use peer::{run_peer, LINE_PREFIX, TRANSFER};

/// What a bounded device-side wait waited for (`gdaki_device::error::WaitOn` without its values).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitKind {
    /// The CQE of a WQE (`Qp::wait`, `Qp::flush`).
    Cqe,
    /// Room in the SQ (`Qp::post` and everything that posts).
    SqSpace,
    /// A semaphore reaching a value (`Qp::wait_semaphore`, `wait::semaphore_ge`).
    Semaphore,
    /// Earlier posters of a shared QP publishing their WQEs (`SharedQp::post`).
    Publish,
    /// Room in the proxy FIFO (Host modes: every push).
    FifoSpace,
    /// The proxy doing a trigger (Host modes: `flush`).
    Proxy,
    /// An LL packet carrying its round's flag (`Packets::read_packets`).
    Packet,
    /// A collective's peer (`gdaki_device::coll`: its data or count row).
    Peer,
    /// A broadcast root's group acknowledgment (`gdaki_device::coll::broadcast`).
    GroupAck,
    /// A host thread's turn on a QP whose Warp-sharing handle other host threads share (`WarpQp` on the `cpu`
    /// executor).
    Turn,
}

/// How a fault ended: what a case expects, and what it observed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Device code got an error CQE (`gdaki_device::Error::Cqe`).
    Cqe {
        /// PRM syndrome (`MLX5_CQE_SYNDROME_*`).
        syndrome: u8,
        /// The emulated NIC's vendor syndrome ([`vendor`]): which check failed.
        vendor: u8,
    },
    /// The WQE completed successfully.
    Completed,
    /// A bounded wait ran out (`gdaki_device::Error::Timeout`).
    Timeout(WaitKind),
    /// The CQ overran: no CQE reports it; the CQ is in its error state and took no more CQEs, and the NIC
    /// counted one overrun.
    CqOverrun,
    /// Anything else: device code returned another error, or the case could not be set up (the message says
    /// which).
    Failed(String),
}

/// The PRM name of syndrome `s` (`MLX5_CQE_SYNDROME_` left out), or `"?"`.
pub fn syndrome_name(s: u8) -> &'static str {
    match s {
        syndrome::LOCAL_LENGTH_ERR => "LOCAL_LENGTH_ERR",
        syndrome::LOCAL_QP_OP_ERR => "LOCAL_QP_OP_ERR",
        syndrome::LOCAL_PROT_ERR => "LOCAL_PROT_ERR",
        syndrome::WR_FLUSH_ERR => "WR_FLUSH_ERR",
        syndrome::MW_BIND_ERR => "MW_BIND_ERR",
        syndrome::BAD_RESP_ERR => "BAD_RESP_ERR",
        syndrome::LOCAL_ACCESS_ERR => "LOCAL_ACCESS_ERR",
        syndrome::REMOTE_INVAL_REQ_ERR => "REMOTE_INVAL_REQ_ERR",
        syndrome::REMOTE_ACCESS_ERR => "REMOTE_ACCESS_ERR",
        syndrome::REMOTE_OP_ERR => "REMOTE_OP_ERR",
        syndrome::TRANSPORT_RETRY_EXC_ERR => "TRANSPORT_RETRY_EXC_ERR",
        syndrome::RNR_RETRY_EXC_ERR => "RNR_RETRY_EXC_ERR",
        syndrome::REMOTE_ABORTED_ERR => "REMOTE_ABORTED_ERR",
        _ => "?",
    }
}

/// The name of the emulated NIC's vendor syndrome `v` ([`vendor`]), or `"?"`.
pub fn vendor_name(v: u8) -> &'static str {
    match v {
        vendor::BAD_OPCODE => "BAD_OPCODE",
        vendor::BAD_OPMOD => "BAD_OPMOD",
        vendor::BAD_QPN => "BAD_QPN",
        vendor::BAD_WQE_INDEX => "BAD_WQE_INDEX",
        vendor::BAD_FLAGS => "BAD_FLAGS",
        vendor::BAD_DS => "BAD_DS",
        vendor::PAST_DOORBELL => "PAST_DOORBELL",
        vendor::BAD_INLINE => "BAD_INLINE",
        vendor::BAD_DOORBELL => "BAD_DOORBELL",
        vendor::BLUEFLAME_TOO_LARGE => "BLUEFLAME_TOO_LARGE",
        vendor::BLUEFLAME_NO_BUFFER => "BLUEFLAME_NO_BUFFER",
        vendor::MSG_TOO_LONG => "MSG_TOO_LONG",
        vendor::ATOMIC_SGE_LEN => "ATOMIC_SGE_LEN",
        vendor::BAD_LKEY => "BAD_LKEY",
        vendor::LKEY_PD => "LKEY_PD",
        vendor::LOCAL_BOUNDS => "LOCAL_BOUNDS",
        vendor::LOCAL_ACCESS => "LOCAL_ACCESS",
        vendor::BAD_RKEY => "BAD_RKEY",
        vendor::RKEY_PD => "RKEY_PD",
        vendor::REMOTE_BOUNDS => "REMOTE_BOUNDS",
        vendor::REMOTE_ACCESS => "REMOTE_ACCESS",
        vendor::QP_ACCESS => "QP_ACCESS",
        vendor::ATOMIC_ALIGN => "ATOMIC_ALIGN",
        vendor::NO_PEER => "NO_PEER",
        vendor::RESP_CQ_OVERRUN => "RESP_CQ_OVERRUN",
        vendor::GPU_COPY => "GPU_COPY",
        vendor::FLUSHED => "FLUSHED",
        _ => "?",
    }
}

impl fmt::Display for Outcome {
    /// `0x13 REMOTE_ACCESS_ERR/BAD_RKEY`, `completed`, `Timeout(SqSpace)`, `CQ error + QP error`, or the
    /// failure's message.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Cqe { syndrome, vendor } => {
                write!(f, "{syndrome:#04x} {}/{}", syndrome_name(*syndrome), vendor_name(*vendor))
            }
            Outcome::Completed => f.write_str("completed"),
            Outcome::Timeout(k) => write!(f, "Timeout({k:?})"),
            Outcome::CqOverrun => f.write_str("CQ error + QP error"),
            Outcome::Failed(m) => f.write_str(m),
        }
    }
}

/// One case-specific check: what was checked (with the values seen), and whether it held.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Check {
    /// What was checked, with the values seen.
    pub what: String,
    /// Whether it held.
    pub ok: bool,
}

impl Check {
    pub(crate) fn new(what: impl Into<String>, ok: bool) -> Check {
        Check { what: what.into(), ok }
    }
}

/// What a case's run observed (before it is judged against the case).
#[derive(Debug)]
pub(crate) struct Observed {
    pub outcome: Outcome,
    pub qp_state: QpState,
    pub outside_changed: u64,
    pub waited: Duration,
    pub bound: Duration,
    pub checks: Vec<Check>,
}

/// Which scenario a case runs.
#[derive(Clone, Copy, Debug)]
enum Kind {
    Access(Path, Bad),
    SqFull,
    CqOverrun,
    NoDoorbell,
    BadDoorbell(Path, queue::BadDb),
    PeerKilled,
    Unreachable,
    SemaphoreOtherQp,
}

/// What the cases need from their caller.
pub struct Ctx {
    peer: Box<dyn Fn() -> Command + Send + Sync>,
}

impl Ctx {
    /// `peer` makes the command that starts a peer process for the SIGKILL case: a process whose body is
    /// [`run_peer`] on its stdin and stdout (for a program, e.g. itself with a hidden argument; for a test
    /// binary, itself running one ignored test). The case adds the pipes.
    pub fn new(peer: impl Fn() -> Command + Send + Sync + 'static) -> Ctx {
        Ctx { peer: Box::new(peer) }
    }

    pub(crate) fn peer_command(&self) -> Command {
        (self.peer)()
    }
}

impl fmt::Debug for Ctx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ctx").finish_non_exhaustive()
    }
}

/// One fault and the outcome it must have.
#[derive(Clone, Debug)]
pub struct FaultCase {
    /// Unique name, with the path in parentheses where a fault runs on more than one.
    pub name: &'static str,
    /// The outcome device code must see.
    pub expected: Outcome,
    /// The requester QP's state afterwards.
    pub state: QpState,
    kind: Kind,
}

/// A case's result.
#[derive(Clone, Debug)]
pub struct Report {
    /// The case's name.
    pub name: &'static str,
    /// The outcome the case expects.
    pub expected: Outcome,
    /// The outcome observed.
    pub observed: Outcome,
    /// The QP state the case expects.
    pub expected_state: QpState,
    /// The requester QP's state afterwards; `None` when the case could not run.
    pub qp_state: Option<QpState>,
    /// Bytes changed outside the permitted ranges (guards, buffers, queue memory); `None` when the case could
    /// not run.
    pub outside_changed: Option<u64>,
    /// How long the waiter under test waited (from posting or connecting to its return).
    pub waited: Duration,
    /// The longest it may wait.
    pub bound: Duration,
    /// Case-specific checks.
    pub checks: Vec<Check>,
    /// Wall time of the whole case (setup and teardown included).
    pub elapsed: Duration,
    /// Whether everything above is as the case expects.
    pub pass: bool,
}

impl Report {
    /// Why the case failed: one line per thing that is not as expected (empty when it passed).
    pub fn failures(&self) -> Vec<String> {
        let mut f = Vec::new();
        if self.observed != self.expected {
            f.push(format!("observed {}, expected {}", self.observed, self.expected));
        }
        if self.qp_state != Some(self.expected_state) {
            f.push(format!("QP state {:?}, expected {:?}", self.qp_state, self.expected_state));
        }
        if self.outside_changed != Some(0) {
            f.push(format!("bytes changed outside the permitted range: {:?}", self.outside_changed));
        }
        if self.waited > self.bound {
            f.push(format!("waited {:?}, longer than its bound {:?}", self.waited, self.bound));
        }
        f.extend(self.checks.iter().filter(|c| !c.ok).map(|c| format!("check failed: {}", c.what)));
        f
    }
}

impl FaultCase {
    /// Runs the case and judges it. Never panics on a fault; a case that cannot be set up (e.g. no free
    /// loopback port) fails with [`Outcome::Failed`].
    pub fn run(&self, ctx: &Ctx) -> Report {
        let start = Instant::now();
        let r = match self.kind {
            Kind::Access(path, bad) => access::run(path, bad),
            Kind::SqFull => queue::sq_full(),
            Kind::CqOverrun => queue::cq_overrun(),
            Kind::NoDoorbell => queue::no_doorbell(),
            Kind::BadDoorbell(path, bad) => queue::bad_doorbell(path, bad),
            Kind::PeerKilled => peer::peer_killed(ctx),
            Kind::Unreachable => queue::unreachable(),
            Kind::SemaphoreOtherQp => queue::semaphore_other_qp(),
        };
        let elapsed = start.elapsed();
        let mut rep = Report {
            name: self.name,
            expected: self.expected.clone(),
            observed: Outcome::Failed(String::new()),
            expected_state: self.state,
            qp_state: None,
            outside_changed: None,
            waited: Duration::ZERO,
            bound: Duration::ZERO,
            checks: Vec::new(),
            elapsed,
            pass: false,
        };
        match r {
            Ok(o) => {
                rep.observed = o.outcome;
                rep.qp_state = Some(o.qp_state);
                rep.outside_changed = Some(o.outside_changed);
                rep.waited = o.waited;
                rep.bound = o.bound;
                rep.checks = o.checks;
            }
            Err(e) => rep.observed = Outcome::Failed(e),
        }
        rep.pass = rep.failures().is_empty();
        rep
    }
}

const fn cqe(syndrome: u8, vendor: u8) -> Outcome {
    Outcome::Cqe { syndrome, vendor }
}

/// Every fault, in the order the example prints them.
pub fn catalogue() -> Vec<FaultCase> {
    use syndrome::*;
    use Path::{Direct, Wire};
    let err = QpState::Error;
    let rts = QpState::Rts;
    use queue::BadDb::{OtherQpn, PastRing};
    let c = |name, expected, state, kind| FaultCase { name, expected, state, kind };
    let a = Kind::Access;
    let db = Kind::BadDoorbell;
    vec![
        c("bad lkey (wire)", cqe(LOCAL_PROT_ERR, vendor::BAD_LKEY), err, a(Wire, Bad::Lkey)),
        c("bad lkey (direct)", cqe(LOCAL_PROT_ERR, vendor::BAD_LKEY), err, a(Direct, Bad::Lkey)),
        c("bad rkey (wire)", cqe(REMOTE_ACCESS_ERR, vendor::BAD_RKEY), err, a(Wire, Bad::Rkey)),
        c("bad rkey (direct)", cqe(REMOTE_ACCESS_ERR, vendor::BAD_RKEY), err, a(Direct, Bad::Rkey)),
        c(
            "remote address past MR end (wire)",
            cqe(REMOTE_ACCESS_ERR, vendor::REMOTE_BOUNDS),
            err,
            a(Wire, Bad::PastEnd),
        ),
        c(
            "remote address past MR end (direct)",
            cqe(REMOTE_ACCESS_ERR, vendor::REMOTE_BOUNDS),
            err,
            a(Direct, Bad::PastEnd),
        ),
        c(
            "MR without REMOTE_WRITE (wire)",
            cqe(REMOTE_ACCESS_ERR, vendor::REMOTE_ACCESS),
            err,
            a(Wire, Bad::NoRemoteWrite),
        ),
        c(
            "MR without REMOTE_WRITE (direct)",
            cqe(REMOTE_ACCESS_ERR, vendor::REMOTE_ACCESS),
            err,
            a(Direct, Bad::NoRemoteWrite),
        ),
        c(
            "MR without REMOTE_READ (wire)",
            cqe(REMOTE_ACCESS_ERR, vendor::REMOTE_ACCESS),
            err,
            a(Wire, Bad::NoRemoteRead),
        ),
        c(
            "MR without REMOTE_READ (direct)",
            cqe(REMOTE_ACCESS_ERR, vendor::REMOTE_ACCESS),
            err,
            a(Direct, Bad::NoRemoteRead),
        ),
        c(
            "MR without REMOTE_ATOMIC (wire)",
            cqe(REMOTE_ACCESS_ERR, vendor::REMOTE_ACCESS),
            err,
            a(Wire, Bad::NoRemoteAtomic),
        ),
        c(
            "MR without REMOTE_ATOMIC (direct)",
            cqe(REMOTE_ACCESS_ERR, vendor::REMOTE_ACCESS),
            err,
            a(Direct, Bad::NoRemoteAtomic),
        ),
        c(
            "unaligned atomic (wire)",
            cqe(REMOTE_INVAL_REQ_ERR, vendor::ATOMIC_ALIGN),
            err,
            a(Wire, Bad::UnalignedAtomic),
        ),
        c(
            "unaligned atomic (direct)",
            cqe(REMOTE_INVAL_REQ_ERR, vendor::ATOMIC_ALIGN),
            err,
            a(Direct, Bad::UnalignedAtomic),
        ),
        c("zero-byte WRITE, empty inline (wire)", Outcome::Completed, rts, a(Wire, Bad::ZeroInline)),
        c("zero-byte WRITE, empty inline (direct)", Outcome::Completed, rts, a(Direct, Bad::ZeroInline)),
        c("zero-byte WRITE, no data seg (wire)", Outcome::Completed, rts, a(Wire, Bad::ZeroNoData)),
        c("zero-byte WRITE, no data seg (direct)", Outcome::Completed, rts, a(Direct, Bad::ZeroNoData)),
        c("SQ full (silent peer)", Outcome::Timeout(WaitKind::SqSpace), rts, Kind::SqFull),
        c("CQ overrun", Outcome::CqOverrun, err, Kind::CqOverrun),
        c("doorbell never rung", Outcome::Timeout(WaitKind::Cqe), rts, Kind::NoDoorbell),
        c("doorbell past the ring (wire)", cqe(LOCAL_QP_OP_ERR, vendor::BAD_DOORBELL), err, db(Wire, PastRing)),
        c("doorbell past the ring (direct)", cqe(LOCAL_QP_OP_ERR, vendor::BAD_DOORBELL), err, db(Direct, PastRing)),
        c("doorbell naming another QP (wire)", cqe(LOCAL_QP_OP_ERR, vendor::BAD_QPN), err, db(Wire, OtherQpn)),
        c("doorbell naming another QP (direct)", cqe(LOCAL_QP_OP_ERR, vendor::BAD_QPN), err, db(Direct, OtherQpn)),
        c("WQE with wrong QPN (wire)", cqe(LOCAL_QP_OP_ERR, vendor::BAD_QPN), err, a(Wire, Bad::WrongQpn)),
        c("WQE with wrong QPN (direct)", cqe(LOCAL_QP_OP_ERR, vendor::BAD_QPN), err, a(Direct, Bad::WrongQpn)),
        c("WQE with wrong ds (wire)", cqe(LOCAL_QP_OP_ERR, vendor::BAD_DS), err, a(Wire, Bad::WrongDs)),
        c("WQE with wrong ds (direct)", cqe(LOCAL_QP_OP_ERR, vendor::BAD_DS), err, a(Direct, Bad::WrongDs)),
        c("peer killed (SIGKILL) mid 64 MiB", cqe(TRANSPORT_RETRY_EXC_ERR, vendor::NO_PEER), err, Kind::PeerKilled),
        c("peer unreachable", cqe(TRANSPORT_RETRY_EXC_ERR, vendor::NO_PEER), err, Kind::Unreachable),
        c("error CQE during semaphore wait", cqe(REMOTE_ACCESS_ERR, vendor::BAD_RKEY), err, Kind::SemaphoreOtherQp),
    ]
}

/// The case named `name`, if the catalogue has one.
pub fn find(name: &str) -> Option<FaultCase> {
    catalogue().into_iter().find(|c| c.name == name)
}
