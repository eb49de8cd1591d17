//! What the cases share: two connected QPs (across the wire or on one NIC), device QPs on host threads, and
//! bounded host-side waits.

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gdaki_device::cq::Completion;
use gdaki_device::error::WaitOn;
use gdaki_device::qp::Qp as DevQp;
use gdaki_device::Error as DevError;
use gdaki_shared::handle::QpHandle;

use gdaki::nic::emu::{Cq, EmuConfig, EmuNic, Endpoint, Pd, Qp, WireConfig};

use super::{Outcome, WaitKind};

/// How the two QPs of a [`Rig`] reach each other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Path {
    /// Two NICs, each with a wire: what two processes meet (RC over TCP on loopback).
    Wire,
    /// One NIC: the peer QP is reached directly.
    Direct,
}

/// A NIC configuration with a loopback wire whose retry timeout is `retry`.
/// Queues in host memory, or where `GDAKI_QUEUES` says ([`EmuConfig::host_or_env`]).
pub(crate) fn wired(retry: Duration) -> gdaki::Result<EmuConfig> {
    Ok(EmuConfig::host_or_env()?.with_wire(WireConfig { retry_timeout: retry, ..WireConfig::loopback() }))
}

/// An endpoint bytes round trip, as through a bootstrap.
pub(crate) fn via_bytes(e: &Endpoint) -> gdaki::Result<Endpoint> {
    Endpoint::from_bytes(&e.to_bytes())
}

/// Two connected RC QPs: `a` is the requester under test, `b` its peer (responder). Field order is drop order:
/// QPs, then CQs and PDs, then the NICs.
pub(crate) struct Rig {
    pub a: Qp,
    /// The peer: kept alive (and connected) for as long as the rig.
    pub _b: Qp,
    pub cq_a: Cq,
    pub _cq_b: Cq,
    pub pd_a: Pd,
    pub pd_b: Pd,
    pub nic_a: Arc<EmuNic>,
    pub nic_b: Arc<EmuNic>,
}

impl Rig {
    /// QPs of `wqe_cnt` WQEBBs completing into CQs of `ncqe` entries, each QP in its own PD, connected over
    /// `path`; `retry` is the wire's retry timeout.
    pub(crate) fn new(path: Path, wqe_cnt: u32, ncqe: u32, retry: Duration) -> gdaki::Result<Rig> {
        let nic_a = EmuNic::open(match path {
            Path::Wire => wired(retry)?,
            Path::Direct => EmuConfig::host_or_env()?,
        })?;
        let nic_b = match path {
            Path::Wire => EmuNic::open(wired(retry)?)?,
            Path::Direct => nic_a.clone(),
        };
        let (pd_a, pd_b) = (nic_a.alloc_pd()?, nic_b.alloc_pd()?);
        let (cq_a, cq_b) = (nic_a.create_cq(ncqe)?, nic_b.create_cq(ncqe)?);
        let a = nic_a.create_qp(&pd_a, &cq_a, wqe_cnt)?;
        let b = nic_b.create_qp(&pd_b, &cq_b, wqe_cnt)?;
        a.connect(&via_bytes(&b.endpoint())?)?;
        b.connect(&via_bytes(&a.endpoint())?)?;
        Ok(Rig { a, _b: b, cq_a, _cq_b: cq_b, pd_a, pd_b, nic_a, nic_b })
    }
}

/// An endpoint on a NIC that does not exist, at a loopback port where nothing listens (bound, then closed),
/// with a NIC identifier above every real one so that our QP is the one that dials.
pub(crate) fn ghost_endpoint() -> gdaki::Result<Endpoint> {
    let addr: SocketAddr = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| gdaki::Error::Unavailable(format!("no free loopback port: {e}")))?;
    Ok(Endpoint { nic: u64::MAX, qpn: 0x100, psn: 0, wire: Some(addr) })
}

/// Wraps `h` as an Exclusive device QP whose bounded waits give up after `timeout`.
///
/// # Safety
/// `h` must come from `emu::Qp::handle()` of a QP (and its CQ) with host queue memory that outlives the
/// returned value, and only the calling thread may post to that QP or poll its CQ meanwhile.
pub(crate) unsafe fn dev_qp(h: &mut QpHandle, timeout: Duration) -> DevQp<'_> {
    // SAFETY: the caller's contract is `DevQp::new`'s.
    unsafe { DevQp::new(h, timeout.as_nanos() as u64) }
}

/// The kind of a device wait.
pub(crate) fn wait_kind(on: &WaitOn) -> WaitKind {
    match on {
        WaitOn::Cqe { .. } => WaitKind::Cqe,
        WaitOn::SqSpace { .. } => WaitKind::SqSpace,
        WaitOn::Semaphore { .. } => WaitKind::Semaphore,
        WaitOn::Publish { .. } => WaitKind::Publish,
        WaitOn::FifoSpace { .. } => WaitKind::FifoSpace,
        WaitOn::Proxy { .. } => WaitKind::Proxy,
        WaitOn::Packet { .. } => WaitKind::Packet,
        WaitOn::Peer { .. } => WaitKind::Peer,
        WaitOn::GroupAck { .. } => WaitKind::GroupAck,
        WaitOn::Turn { .. } => WaitKind::Turn,
    }
}

/// What device code returned, as an [`Outcome`].
pub(crate) fn outcome<T>(r: &Result<T, DevError>) -> Outcome {
    match r {
        Ok(_) => Outcome::Completed,
        Err(DevError::Cqe(e)) => Outcome::Cqe { syndrome: e.syndrome, vendor: e.vendor_err_synd },
        Err(DevError::Timeout(t)) => Outcome::Timeout(wait_kind(&t.on)),
        Err(e) => Outcome::Failed(format!("device code: {e}")),
    }
}

/// A host-library result as a setup step: errors become a message.
pub(crate) fn setup<T>(r: gdaki::Result<T>) -> Result<T, String> {
    r.map_err(|e| format!("setup: {e}"))
}

/// Device code's result as a setup step: errors become a message naming `what`.
pub(crate) fn step<T>(what: &str, r: Result<T, DevError>) -> Result<T, String> {
    r.map_err(|e| format!("{what}: {e}"))
}

/// Polls `qp`'s CQ until one CQE arrives, for `bound` at most (`None` when none came).
pub(crate) fn next_cqe(qp: &mut DevQp<'_>, bound: Duration) -> Option<Result<Completion, DevError>> {
    let t = Instant::now();
    loop {
        if let Some(r) = qp.poll_cq() {
            return Some(r);
        }
        if t.elapsed() > bound {
            return None;
        }
        std::thread::yield_now();
    }
}

/// Waits until `cond` holds, for `bound` at most; returns whether it did.
pub(crate) fn wait_until(bound: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let t = Instant::now();
    while !cond() {
        if t.elapsed() > bound {
            return false;
        }
        std::thread::sleep(Duration::from_micros(100));
    }
    true
}
