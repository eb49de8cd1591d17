//! The requester side of a QP whose peer is across the wire: turns each WQE into request packets, keeps it
//! outstanding until the responder answers, and writes the CQEs in WQE order.
//!
//! A WQE's CQE is written only when its response arrived (ACK for a WRITE: the responder has placed the data;
//! the data itself for a READ or atomic) and every earlier WQE has completed, so completions stay in order as
//! on an RC send queue. A NAK fails its WQE with the responder's syndrome; a lost connection or
//! [`WireConfig::retry_timeout`](super::WireConfig::retry_timeout) without progress fails the oldest
//! outstanding WQE with 0x15 (transport retry exceeded). After a failure the QP is in the error state and every
//! other outstanding or later WQE completes with 0x05 (flushed).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::link::Link;
use super::packet::{self, Packet, MAX_CHUNK, PSN_MASK};
use crate::mem::MemLoc;
use crate::nic::emu::access::DataPath;
use crate::nic::emu::exec::{self, at};
use crate::nic::emu::fabric::{read, Fabric};
use crate::nic::emu::fault::Fault;
use crate::nic::emu::qp::{QpInner, QpState};
use crate::nic::emu::sq::{complete, fail};
use crate::nic::emu::stats::bump;
use crate::nic::emu::wqe::{Header, Op, Payload, Sge};

use super::responder::RespState;

/// Outbox bytes after which frames are written at once rather than at the end of the executor's pass.
pub(crate) const FLUSH_AT: usize = 1 << 20;

/// Where an outstanding WQE stands.
#[derive(Debug)]
enum State {
    /// Sent; waits for an ACK (WRITE) or its response.
    Sent,
    /// RDMA READ sent; the response lands in `sges`, `got` of `total` bytes so far.
    Read { sges: Vec<Sge>, got: u64, total: u64 },
    /// Atomic sent; the old value lands in `sge`.
    Atomic { sge: Sge },
    /// Finished; its CQE carries `byte_cnt`, once every earlier WQE has completed.
    Done { byte_cnt: u32 },
    /// Failed; its error CQE is written once every earlier WQE has completed.
    Failed(Fault),
}

#[derive(Debug)]
struct Pending {
    /// Consumer index of the WQE (its CQE's `wqe_counter` is the low 16 bits).
    idx: u64,
    opcode: u8,
    cq_update: bool,
    /// PSN of the request, when one was sent.
    psn: Option<u32>,
    state: State,
}

/// Executor-side state of a QP connected across the wire, as requester and as responder.
#[derive(Debug)]
pub(crate) struct WireSq {
    pub link: Arc<Link>,
    /// PSN of the next request.
    next_psn: u32,
    /// WQEs consumed from the SQ whose CQE is not written yet, oldest first.
    pending: VecDeque<Pending>,
    /// Encoded frames not written yet (requests and responses), sent when the link is up.
    pub outbox: Vec<u8>,
    /// Last time a request was first outstanding or a response arrived.
    last_progress: Instant,
    /// A WQE failed before its request left: later WQEs are flushed, not sent.
    failing: bool,
    /// Why the link is down, once it is.
    down: Option<String>,
    /// Gathers a WRITE's local bytes into packets, and a READ's remote bytes into responses.
    pub gather: Vec<u8>,
    /// A WRITE's local ranges, resolved.
    scratch: Vec<(MemLoc, u64)>,
    /// The responder side.
    pub resp: RespState,
}

impl WireSq {
    pub(crate) fn new(link: Arc<Link>) -> Self {
        let (sq_psn, rq_psn) = (link.local.psn, link.remote.psn);
        Self {
            link,
            next_psn: sq_psn & PSN_MASK,
            pending: VecDeque::new(),
            outbox: Vec::new(),
            last_progress: Instant::now(),
            failing: false,
            down: None,
            gather: Vec::new(),
            scratch: Vec::new(),
            resp: RespState::new(rq_psn),
        }
    }

    fn push(&mut self, p: Pending) {
        if !self.pending.iter().any(|q| is_waiting(&q.state)) && is_waiting(&p.state) {
            self.last_progress = Instant::now();
        }
        self.pending.push_back(p);
    }

    /// Writes the outbox if the link is up; a failed write takes the link down.
    ///
    /// A send blocks for the retry timeout at most (the socket's write timeout): a peer that stops reading
    /// fails the link rather than hanging the executor. A failed send may have left part of a frame on the
    /// stream, so the link is closed at once and nothing more is written to it.
    pub(crate) fn flush(&mut self) -> Result<(), String> {
        self.resp.put_ack(&mut self.outbox);
        if self.outbox.is_empty() || !self.link.is_up() {
            return Ok(());
        }
        let r = self.link.send(&self.outbox);
        self.outbox.clear();
        r.map_err(|e| {
            self.link.close();
            format!("sending to peer QP {:#x} failed: {e}", self.link.remote.qpn)
        })
    }
}

fn is_waiting(s: &State) -> bool {
    matches!(s, State::Sent | State::Read { .. } | State::Atomic { .. })
}

/// Consumes WQE `idx` (header `h`, body `op`) of `qp`: sends its request, or records it as done or failed.
pub(crate) fn post(fab: &Fabric, qp: &QpInner, ws: &mut WireSq, dp: &mut DataPath, idx: u64, h: &Header, op: &Op<'_>) {
    let mut p =
        Pending { idx, opcode: h.opcode, cq_update: h.cq_update, psn: None, state: State::Done { byte_cnt: 0 } };
    if ws.failing || qp.state() == QpState::Error {
        p.state = State::Failed(Fault::flushed());
    } else if ws.down.is_some() && !matches!(op, Op::Nop) {
        // The peer is gone: the request would be retried until the retry count runs out.
        ws.failing = true;
        p.state = State::Failed(Fault::retry_exceeded());
    } else if !matches!(op, Op::Nop) {
        match send_request(fab, qp, ws, dp, op) {
            Ok((psn, state)) => {
                p.psn = Some(psn);
                p.state = state;
            }
            Err(f) => {
                ws.failing = true;
                p.state = State::Failed(f);
            }
        }
    }
    ws.push(p);
    if ws.outbox.len() >= FLUSH_AT {
        if let Err(reason) = ws.flush() {
            link_down(fab, qp, ws, dp, reason);
        }
    }
    drain(fab, qp, ws, dp);
}

/// Records WQE `idx` as failed before any request left (a malformed WQE, or a QP in the error state): its
/// error CQE follows those of every earlier WQE.
pub(crate) fn post_failed(
    fab: &Fabric,
    qp: &QpInner,
    ws: &mut WireSq,
    dp: &mut DataPath,
    idx: u64,
    opcode: u8,
    f: Fault,
) {
    ws.failing = true;
    ws.push(Pending { idx, opcode, cq_update: true, psn: None, state: State::Failed(f) });
    drain(fab, qp, ws, dp);
}

/// Encodes the request(s) of `op` into the outbox; returns its PSN and what it waits for. Local buffers are
/// checked (0x04) and, for a WRITE, read now: the requester reads them when the request leaves.
fn send_request(
    fab: &Fabric,
    qp: &QpInner,
    ws: &mut WireSq,
    dp: &mut DataPath,
    op: &Op<'_>,
) -> Result<(u32, State), Fault> {
    let psn = ws.next_psn;
    let state = match *op {
        Op::Nop => State::Done { byte_cnt: 0 },
        Op::Write { remote, payload, imm } => {
            let imm = imm.map(|i| i.to_bits());
            match payload {
                Payload::Inline(d) => {
                    let w = Packet::Write {
                        psn,
                        rkey: remote.rkey,
                        raddr: remote.addr,
                        total: d.len() as u64,
                        offset: 0,
                        imm,
                        last: true,
                        data: d,
                    };
                    packet::encode(&w, &mut ws.outbox);
                }
                Payload::Sges(list) => {
                    let total = list.total();
                    let mrs = read(&fab.mrs);
                    ws.scratch.clear();
                    if total > 0 {
                        for s in list.iter() {
                            ws.scratch.push((exec::local(&mrs, qp.pdn, s, false)?, s.len));
                        }
                    }
                    write_packets(ws, dp, psn, remote.addr, remote.rkey, total, imm)?;
                }
            }
            State::Sent
        }
        Op::Read { remote, sges } => {
            let total = sges.total();
            packet::encode(&Packet::Read { psn, rkey: remote.rkey, raddr: remote.addr, len: total }, &mut ws.outbox);
            State::Read { sges: sges.iter().collect(), got: 0, total }
        }
        Op::Atomic { remote, op, sge } => {
            packet::encode(&Packet::Atomic { psn, rkey: remote.rkey, raddr: remote.addr, op }, &mut ws.outbox);
            State::Atomic { sge }
        }
    };
    ws.next_psn = (psn + 1) & PSN_MASK;
    Ok((psn, state))
}

/// Gathers the WRITE's resolved local ranges (`ws.scratch`, `total` bytes) into packets of at most
/// [`MAX_CHUNK`] bytes. The caller holds the MR table's read lock.
fn write_packets(
    ws: &mut WireSq,
    dp: &mut DataPath,
    psn: u32,
    raddr: u64,
    rkey: u32,
    total: u64,
    imm: Option<u32>,
) -> Result<(), Fault> {
    let (mut sge, mut in_sge, mut offset) = (0usize, 0u64, 0u64);
    loop {
        let n = (total - offset).min(MAX_CHUNK as u64) as usize;
        ws.gather.resize(n, 0);
        let mut filled = 0;
        while filled < n {
            let (loc, len) = ws.scratch[sge];
            let take = ((len - in_sge) as usize).min(n - filled);
            // SAFETY: `loc` was resolved inside a registered MR (`len` bytes) and the caller holds the MR
            // table's read lock, so the MR stays registered while its bytes are read.
            unsafe { dp.read_bytes(at(loc, in_sge), &mut ws.gather[filled..filled + take]) }?;
            filled += take;
            in_sge += take as u64;
            if in_sge == len {
                sge += 1;
                in_sge = 0;
            }
        }
        let last = offset + n as u64 == total;
        let w = Packet::Write { psn, rkey, raddr, total, offset, imm, last, data: &ws.gather };
        packet::encode(&w, &mut ws.outbox);
        offset += n as u64;
        if last {
            return Ok(());
        }
        if ws.outbox.len() >= FLUSH_AT {
            // A long WRITE streams out while it is read, rather than piling up in the outbox.
            if ws.flush().is_err() {
                return Err(Fault::retry_exceeded());
            }
        }
    }
}

/// Handles a response for `qp`. A response that matches no outstanding request breaks the protocol: the
/// link goes down.
pub(crate) fn on_response(fab: &Fabric, qp: &QpInner, ws: &mut WireSq, dp: &mut DataPath, p: Packet<'_>) {
    ws.last_progress = Instant::now();
    if let Err(why) = apply(fab, qp, ws, dp, p) {
        let reason = format!("peer QP {:#x} broke the protocol: {why}", ws.link.remote.qpn);
        ws.link.close();
        link_down(fab, qp, ws, dp, reason);
        return;
    }
    drain(fab, qp, ws, dp);
}

fn waiting_for(ws: &mut WireSq, psn: u32) -> Option<&mut Pending> {
    ws.pending.iter_mut().find(|p| p.psn == Some(psn) && is_waiting(&p.state))
}

fn apply(fab: &Fabric, qp: &QpInner, ws: &mut WireSq, dp: &mut DataPath, p: Packet<'_>) -> Result<(), &'static str> {
    match p {
        Packet::Ack { psn } => {
            // An ACK of a PSN never sent is a ghost (hardware drops it): a broken peer.
            let newest = ws.next_psn.wrapping_sub(1) & PSN_MASK;
            if psn.wrapping_sub(newest) & PSN_MASK != 0 && psn.wrapping_sub(newest) & PSN_MASK <= PSN_MASK / 2 {
                return Err("ACK of a PSN never sent");
            }
            // Cumulative: every WRITE up to `psn` (24-bit serial order) is placed. Requests left in PSN order, so
            // the walk stops at the first one after `psn`.
            let mut hit = false;
            for q in ws.pending.iter_mut() {
                let Some(s) = q.psn else { continue };
                if psn.wrapping_sub(s) & PSN_MASK > PSN_MASK / 2 {
                    break;
                }
                if matches!(q.state, State::Sent) {
                    q.state = State::Done { byte_cnt: 0 };
                    hit = true;
                }
            }
            hit.then_some(()).ok_or("ACK of nothing outstanding")
        }
        Packet::Nak { psn, syndrome, vendor } => {
            // A responder refuses with these only; any other syndrome would pass for a local error.
            use gdaki_shared::prm::opcode::syndrome as s;
            if ![s::REMOTE_INVAL_REQ_ERR, s::REMOTE_ACCESS_ERR, s::REMOTE_OP_ERR].contains(&syndrome) {
                return Err("NAK with a syndrome no responder gives");
            }
            let q = waiting_for(ws, psn).ok_or("NAK of nothing outstanding")?;
            q.state = State::Failed(Fault { syndrome, vendor });
            Ok(())
        }
        Packet::ReadResp { psn, offset, last, data } => {
            let q = waiting_for(ws, psn).ok_or("READ response of nothing outstanding")?;
            let State::Read { sges, got, total } = &mut q.state else { return Err("READ response to another request") };
            if offset != *got || offset + data.len() as u64 > *total || last != (offset + data.len() as u64 == *total) {
                return Err("READ response out of order");
            }
            let placed = place_read(fab, qp, dp, sges, offset, data);
            *got += data.len() as u64;
            q.state = match placed {
                Err(f) => State::Failed(f),
                Ok(()) if last => State::Done { byte_cnt: *total as u32 },
                Ok(()) => return Ok(()),
            };
            Ok(())
        }
        Packet::AtomicResp { psn, old } => {
            let q = waiting_for(ws, psn).ok_or("atomic response of nothing outstanding")?;
            let State::Atomic { sge } = q.state else { return Err("atomic response to another request") };
            let mrs = read(&fab.mrs);
            let placed = exec::local(&mrs, qp.pdn, sge, true).and_then(|loc| {
                // The old value lands in host order (host-endianness atomic mode, as on the direct path).
                // SAFETY: `loc` is a registered 8-byte range with LOCAL_WRITE; the MR read lock is held.
                unsafe { dp.write_bytes(loc, &old.to_ne_bytes()) }
            });
            q.state = match placed {
                Ok(()) => State::Done { byte_cnt: 8 },
                Err(f) => State::Failed(f),
            };
            Ok(())
        }
        _ => Err("a request or hello where a response was due"),
    }
}

/// Writes `data`, at byte `offset` of a READ response, into the local `sges` (checked now: 0x04 when an SGE
/// is bad, as the hardware finds out when the response arrives).
fn place_read(
    fab: &Fabric,
    qp: &QpInner,
    dp: &mut DataPath,
    sges: &[Sge],
    offset: u64,
    data: &[u8],
) -> Result<(), Fault> {
    let mrs = read(&fab.mrs);
    let (mut start, mut done) = (0u64, 0usize);
    for s in sges {
        let end = start + s.len;
        if done < data.len() && offset + (done as u64) < end {
            let loc = exec::local(&mrs, qp.pdn, *s, true)?;
            let from = offset + done as u64 - start;
            let n = ((s.len - from) as usize).min(data.len() - done);
            // SAFETY: `loc` is a registered range of `s.len` bytes with LOCAL_WRITE and `from + n <= s.len`;
            // the MR read lock is held.
            unsafe { dp.write_bytes(at(loc, from), &data[done..done + n]) }?;
            done += n;
        }
        start = end;
    }
    Ok(())
}

/// Writes the CQEs of finished WQEs at the head of the queue, in order. After a failure the QP is in the
/// error state and everything behind it is flushed.
fn drain(fab: &Fabric, qp: &QpInner, ws: &mut WireSq, dp: &mut DataPath) {
    while let Some(front) = ws.pending.front() {
        match front.state {
            _ if qp.state() == QpState::Error => fail(fab, qp, dp, front.idx, front.opcode, Fault::flushed()),
            State::Failed(f) => fail(fab, qp, dp, front.idx, front.opcode, f),
            State::Done { byte_cnt } => {
                bump(&fab.stats.wqes);
                if front.cq_update {
                    complete(fab, qp, dp, front.idx, front.opcode, byte_cnt);
                }
            }
            _ => return,
        }
        ws.pending.pop_front();
    }
}

/// The connection is gone: the oldest WQE still waiting fails with 0x15 (transport retry exceeded) and the
/// rest are flushed (the QP moves to the error state). With nothing outstanding the QP stays as it is, as an
/// idle RC QP does on hardware, and its next request fails with 0x15.
pub(crate) fn link_down(fab: &Fabric, qp: &QpInner, ws: &mut WireSq, dp: &mut DataPath, reason: String) {
    // Nothing more goes out on it, and a dialer still trying stops.
    ws.link.close();
    if ws.down.is_none() {
        tracing::warn!(qpn = qp.qpn, "emulated NIC: link down: {reason}; QP moves to the error state");
        ws.down = Some(reason);
    }
    ws.outbox.clear();
    if let Some(q) = ws.pending.iter_mut().find(|q| is_waiting(&q.state)) {
        q.state = State::Failed(Fault::retry_exceeded());
    }
    drain(fab, qp, ws, dp);
}

/// Per-pass upkeep: writes the outbox, and fails the QP when its peer made no progress for `timeout` while
/// something was outstanding. Returns whether it did anything.
pub(crate) fn tick(fab: &Fabric, qp: &QpInner, ws: &mut WireSq, dp: &mut DataPath, timeout: Duration) -> bool {
    let had = !ws.outbox.is_empty() && ws.link.is_up();
    if let Err(reason) = ws.flush() {
        link_down(fab, qp, ws, dp, reason);
        return true;
    }
    if ws.down.is_none() && ws.link.is_down() {
        // Closed after a failed send elsewhere in this pass (a long WRITE's or READ response's streaming).
        let reason = format!("the connection to peer QP {:#x} broke while sending", ws.link.remote.qpn);
        link_down(fab, qp, ws, dp, reason);
        return true;
    }
    if ws.down.is_none() && ws.pending.iter().any(|q| is_waiting(&q.state)) && ws.last_progress.elapsed() > timeout {
        let what = if ws.link.is_up() { "no response" } else { "no connection" };
        let reason = format!("{what} from peer QP {:#x} within {timeout:?}", ws.link.remote.qpn);
        link_down(fab, qp, ws, dp, reason);
        return true;
    }
    had
}
