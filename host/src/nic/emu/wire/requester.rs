//! The requester side of a QP whose peer is across the wire: turns each WQE into request packets, keeps it
//! outstanding until the responder answers, and writes the CQEs in WQE order.
//!
//! A WQE's CQE is written only when its response arrived (ACK for a WRITE: the responder has placed the data;
//! the data itself for a READ or atomic) and every earlier WQE has completed, so completions stay in order as
//! on an RC send queue. A NAK fails its WQE with the responder's syndrome; a lost connection or
//! [`WireConfig::retry_timeout`](super::WireConfig::retry_timeout) without progress fails the oldest
//! outstanding WQE with 0x15 (transport retry exceeded). After a failure the QP is in the error state and every
//! other outstanding or later WQE completes with 0x05 (flushed).
//!
//! Sending never waits (see [`super::link`]): frames go into the QP's outbox, which is written as far as the
//! socket takes it. Once [`OUTBOX_HIGH`] bytes wait there, the QP produces nothing more until they are taken:
//! the executor takes no further WQE from its SQ (the WQEs wait in the ring, as on a congested NIC), a long
//! WRITE sends its next chunk later ([`WriteStream`]), READ responses wait in the responder's queue. Two rules
//! keep the responder able to take every request at once, without room to answer: at most
//! [`MAX_RD_ATOMIC`] READs and atomics are outstanding, and a WRITE or atomic waits until no READ of the QP is
//! outstanding (an implicit fence: the responder reads a READ's data when its response goes out, which must
//! not see a later request's writes). A peer whose socket takes nothing for the retry timeout fails the QP
//! (0x15), as one that does not answer.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::link::{peer_name, Link};
use super::packet::{self, Packet, MAX_CHUNK, MAX_RD_ATOMIC, PSN_MASK};
use crate::mem::{MemKind, MemLoc, EXPORT_HANDLE_BYTES, WRITE_ASYNC_MAX};
use crate::nic::emu::access::DataPath;
use crate::nic::emu::completion::{complete, fail};
use crate::nic::emu::exec::{self, at as at_loc};
use crate::nic::emu::fabric::Fabric;
use crate::nic::emu::fault::Fault;
use crate::nic::emu::guard::{lock, read};
use crate::nic::emu::mr::MrTable;
use crate::nic::emu::qp::{QpInner, QpState};
use crate::nic::emu::stats::bump;
use crate::nic::emu::wire::link::Inbound;
use crate::nic::emu::wqe::{Header, Op, Payload, Sge, SgeList};

use super::responder::{self, RespState, MAX_OFFERS};

/// Unsent outbox bytes at which a QP stops producing frames until the socket has taken some: its outbox holds
/// at most this plus one frame (and a few small responses).
pub(crate) const OUTBOX_HIGH: usize = 1 << 20;

/// Most bytes one QP produces in one pass of the executor, so that a long READ response or WRITE to a fast
/// peer leaves the other QPs their turn.
const PASS_BUDGET: usize = 4 * OUTBOX_HIGH;

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
    /// For a WRITE sent by mapping, until answered: the keys of the MRs the peer copies from
    /// ([`release_ipc`]).
    ipc_keys: Vec<u32>,
}

/// A WRITE whose packets are not all in the outbox yet: the rest follow as the outbox has room. Its local
/// SGEs are resolved again for every later batch of packets (an MR may be deregistered in between).
#[derive(Debug)]
struct WriteStream {
    msg: WriteMsg,
    at: Cursor,
    sges: Vec<Sge>,
}

/// The fields every packet of one WRITE carries.
#[derive(Clone, Copy, Debug)]
struct WriteMsg {
    psn: u32,
    rkey: u32,
    raddr: u64,
    total: u64,
    imm: Option<u32>,
}

/// How far a WRITE's packets have got: bytes of the message in the outbox, and where in its SGEs the next
/// byte comes from.
#[derive(Clone, Copy, Debug, Default)]
struct Cursor {
    offset: u64,
    sge: usize,
    in_sge: u64,
}

/// How many outstanding WQEs wait for a READ response or an atomic response.
#[derive(Debug, Default)]
struct Outstanding {
    reads: usize,
    atomics: usize,
}

/// What a peer process may still copy out of one MR's GPU memory (see [`Fabric::ipc_refs`]): WRITEs sent
/// by mapping and not answered, and, after WRITEs that will never be answered (their QP failed, was destroyed
/// or lost its link) but that the peer may still run from frames it took, the moment until which that may
/// happen (a retry timeout later). The MR's deregistration waits for both ([`EmuNic::dereg_mr`]).
///
/// [`EmuNic::dereg_mr`]: crate::nic::emu::EmuNic
#[derive(Debug, Default)]
pub(crate) struct IpcRefs {
    pub unanswered: u32,
    pub quiet_after: Option<Instant>,
}

/// Takes the MR keys of `q`'s WRITE by mapping, if it is one, out of [`Fabric::ipc_refs`]: `answered`, the
/// peer has copied it (ACK) or refused it (NAK); else it never will answer, and may still copy it for up to
/// a retry timeout.
fn release_ipc(fab: &Fabric, q: &mut Pending, answered: bool) {
    if q.ipc_keys.is_empty() {
        return;
    }
    let mut refs = lock(&fab.ipc_refs);
    for key in q.ipc_keys.drain(..) {
        let Some(r) = refs.get_mut(&key) else { continue };
        r.unanswered -= 1;
        if !answered {
            r.quiet_after = Some(Instant::now() + fab.retry_timeout());
        }
        if r.unanswered == 0 && r.quiet_after.is_none_or(|t| t <= Instant::now()) {
            refs.remove(&key);
        }
    }
}

impl Outstanding {
    fn count(&mut self, s: &State, up: bool) {
        let n = match s {
            State::Read { .. } => &mut self.reads,
            State::Atomic { .. } => &mut self.atomics,
            _ => return,
        };
        if up {
            *n += 1;
        } else {
            *n -= 1;
        }
    }
}

/// Moves `q` to `state`, keeping `out` in step.
fn set_state(out: &mut Outstanding, q: &mut Pending, state: State) {
    out.count(&q.state, false);
    out.count(&state, true);
    q.state = state;
}

/// Executor-side state of a QP connected across the wire, as requester and as responder.
#[derive(Debug)]
pub(crate) struct WireSq {
    pub link: Arc<Link>,
    /// PSN of the next request: the QP's `next_send_psn` once it reached RTS ([`WireSq::start_sending`]); the
    /// responder side works before that, from RTR on.
    next_psn: u32,
    /// Whether `next_psn` was set from the QP's RTR2RTS.
    sending: bool,
    /// WQEs consumed from the SQ whose CQE is not written yet, oldest first.
    pending: VecDeque<Pending>,
    /// READs and atomics among `pending` still waiting for their response.
    out: Outstanding,
    /// Encoded frames (requests and responses), written as far as the socket takes them once the link is up;
    /// `outbox[..sent]` is written already.
    outbox: Vec<u8>,
    sent: usize,
    /// Since when unsent bytes wait on an up link without the socket taking any.
    stuck_since: Option<Instant>,
    /// The WRITE still being put into the outbox, if any: no other WQE is taken meanwhile.
    stream: Option<WriteStream>,
    /// The SGE list of the last finished stream, kept for the next (no allocation per WRITE).
    spare_sges: Vec<Sge>,
    /// A WRITE's local ranges, resolved when it is taken from the SQ.
    scratch: Vec<(MemLoc, u64)>,
    /// Last time a request was first outstanding or a response arrived.
    last_progress: Instant,
    /// A WQE failed before its request left: later WQEs are flushed, not sent.
    failing: bool,
    /// Why the link is down, once it is.
    down: Option<String>,
    /// Gathers a WRITE's local bytes into packets, and a READ's remote bytes into responses.
    gather: Vec<u8>,
    /// The responder side.
    resp: RespState,
    /// The MR keys of the WRITE by mapping `send_request` just sent (empty for any other request), for its
    /// WQE's record ([`Pending::ipc_keys`]).
    ipc_keys: Vec<u32>,
    /// Allocations this requester offered its peer for the same-host path
    /// ([`WireConfig::gpu_ipc`](super::WireConfig::gpu_ipc)), by handle: `None` until the peer answers, then
    /// whether it mapped them.
    offers: HashMap<[u8; EXPORT_HANDLE_BYTES], Option<bool>>,
}

impl WireSq {
    /// The state of a QP in RTR or RTS connected over `link`, whose peer's requests start at `link.remote.psn`
    /// (the QP's `next_rcv_psn`).
    pub(crate) fn new(link: Arc<Link>) -> Self {
        let rq_psn = link.remote.psn;
        Self {
            link,
            next_psn: 0,
            sending: false,
            pending: VecDeque::new(),
            out: Outstanding::default(),
            outbox: Vec::new(),
            sent: 0,
            stuck_since: None,
            stream: None,
            spare_sges: Vec::new(),
            scratch: Vec::new(),
            last_progress: Instant::now(),
            failing: false,
            down: None,
            gather: Vec::new(),
            resp: RespState::new(rq_psn),
            offers: HashMap::new(),
            ipc_keys: Vec::new(),
        }
    }

    /// Sets the PSN of the first request (the QP's `next_send_psn`, from RTR2RTS) once, when the QP is in RTS:
    /// the state may have been made in RTR, when requests from the peer arrived first.
    pub(crate) fn start_sending(&mut self, sq_psn: u32) {
        if !self.sending {
            self.next_psn = sq_psn & PSN_MASK;
            self.sending = true;
        }
    }

    fn push(&mut self, p: Pending) {
        if !self.pending.iter().any(|q| is_waiting(&q.state)) && is_waiting(&p.state) {
            self.last_progress = Instant::now();
        }
        self.out.count(&p.state, true);
        self.pending.push_back(p);
    }

    /// Whether a WQE of the QP has failed (its error CQE written, or queued behind requests still outstanding):
    /// the QP is in the error state, or will be once those complete, and every later WQE is flushed.
    pub(crate) fn failing(&self) -> bool {
        self.failing
    }

    /// Outbox bytes not written yet.
    fn unsent(&self) -> usize {
        self.outbox.len() - self.sent
    }

    /// Whether the QP may put more frames into its outbox (fewer than [`OUTBOX_HIGH`] bytes wait).
    fn has_room(&self) -> bool {
        self.unsent() < OUTBOX_HIGH
    }

    /// Whether the requester takes `op` from the SQ now (see the module docs): it produces frames only while
    /// the outbox has room and no WRITE is still streaming; a READ or atomic only below [`MAX_RD_ATOMIC`]
    /// outstanding; a WRITE or atomic only while no READ is outstanding. A WQE that sends nothing (a NOP, or any
    /// WQE once the QP fails or the link is down) is always taken.
    pub(crate) fn accepts(&self, op: &Op<'_>) -> bool {
        if self.failing || self.down.is_some() || matches!(op, Op::Nop) {
            return true;
        }
        if self.stream.is_some() || !self.has_room() {
            return false;
        }
        let rd_atomic = self.out.reads + self.out.atomics;
        match op {
            Op::Nop => true,
            Op::Read { .. } => rd_atomic < MAX_RD_ATOMIC,
            Op::Atomic { .. } => self.out.reads == 0 && rd_atomic < MAX_RD_ATOMIC,
            Op::Write { .. } => self.out.reads == 0,
        }
    }

    /// Writes as much of the outbox as the socket takes now, if the link is up; never waits. Returns whether
    /// any byte went out. A failed write takes the link down: it may have left part of a frame on the stream,
    /// so the link is closed at once and nothing more is written to it.
    /// The due ACK goes in first, once the WRITEs it covers are placed (one wait on `dp` for the batch); a
    /// failed wait takes the link down too.
    pub(crate) fn flush(&mut self, dp: &mut DataPath) -> Result<bool, String> {
        if self.has_room() {
            if let Err(f) = self.resp.put_ack(dp, &mut self.outbox) {
                self.link.close();
                return Err(format!(
                    "placed WRITEs could not be waited for (syndrome {:#x}, vendor {:#x}); answers to {} lost",
                    f.syndrome,
                    f.vendor,
                    peer_name(&self.link)
                ));
            }
        }
        if self.unsent() == 0 || !self.link.is_up() {
            return Ok(false);
        }
        let mut wrote = false;
        while self.unsent() > 0 {
            match self.link.try_send(&self.outbox[self.sent..]) {
                Ok(0) => break,
                Ok(n) => {
                    self.sent += n;
                    wrote = true;
                }
                Err(e) => {
                    self.link.close();
                    return Err(format!("sending to {} failed: {e}", peer_name(&self.link)));
                }
            }
        }
        if self.unsent() == 0 {
            self.outbox.clear();
            self.sent = 0;
            self.stuck_since = None;
            return Ok(wrote);
        }
        if wrote || self.stuck_since.is_none() {
            self.stuck_since = Some(Instant::now());
        }
        // Keep the outbox from growing by what was written already: move the rest to the front once that
        // is at least a high-water mark's worth (amortized: one copy of at most the unsent bytes per
        // OUTBOX_HIGH written).
        if self.sent >= OUTBOX_HIGH {
            self.outbox.drain(..self.sent);
            self.sent = 0;
        }
        Ok(wrote)
    }

    /// Forgets everything not sent yet (the link is down), giving the responder's old-value slots back to
    /// `dp`.
    fn discard(&mut self, dp: &mut DataPath) {
        self.outbox.clear();
        self.sent = 0;
        self.stuck_since = None;
        self.stream = None;
        self.resp.discard(dp);
    }
}

fn is_waiting(s: &State) -> bool {
    matches!(s, State::Sent | State::Read { .. } | State::Atomic { .. })
}

/// Consumes WQE `idx` (header `h`, body `op`) of `qp`: sends its request, or records it as done or failed.
pub(crate) fn post(fab: &Fabric, qp: &QpInner, ws: &mut WireSq, dp: &mut DataPath, idx: u64, h: &Header, op: &Op<'_>) {
    let mut p = Pending {
        idx,
        opcode: h.opcode,
        cq_update: h.cq_update,
        psn: None,
        state: State::Done { byte_cnt: 0 },
        ipc_keys: Vec::new(),
    };
    if ws.failing || qp.state() == QpState::Error {
        p.state = State::Failed(Fault::flushed());
    } else if ws.down.is_some() && !matches!(op, Op::Nop) {
        // The peer is gone: the request would be retried until the retry count runs out.
        ws.failing = true;
        p.state = State::Failed(Fault::retry_exceeded());
    } else if !matches!(op, Op::Nop) {
        ws.ipc_keys.clear();
        match send_request(fab, qp, ws, dp, op) {
            Ok((psn, state)) => {
                p.psn = Some(psn);
                p.state = state;
                // The MR keys a WRITE by mapping holds until answered (none for any other request).
                std::mem::swap(&mut p.ipc_keys, &mut ws.ipc_keys);
            }
            Err(f) => {
                ws.failing = true;
                p.state = State::Failed(f);
            }
        }
    }
    ws.push(p);
    if !ws.has_room() {
        // Write what the socket takes now, so that the next WQE of a batch may still be taken.
        if let Err(reason) = ws.flush(dp) {
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
    ws.push(Pending { idx, opcode, cq_update: true, psn: None, state: State::Failed(f), ipc_keys: Vec::new() });
    drain(fab, qp, ws, dp);
}

/// Encodes the request(s) of `op` into the outbox; returns its PSN and what it waits for. Local buffers are
/// checked (0x04) and, for a WRITE, read now: the requester reads them when the request leaves; an atomic's
/// result buffer is checked now too (and again when the response arrives); a READ's when the response arrives.
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
                    // Checked and resolved all at once (0x04 before anything leaves); the first packets are
                    // read from what was resolved, under the same read lock.
                    let mrs = read(&fab.mrs);
                    let mut ranges = std::mem::take(&mut ws.scratch);
                    ranges.clear();
                    if total > 0 {
                        for s in list.iter() {
                            match exec::local(&mrs, qp.pdn, s, false) {
                                Ok(loc) => ranges.push((loc, s.len)),
                                Err(f) => {
                                    ws.scratch = ranges;
                                    return Err(f);
                                }
                            }
                        }
                    }
                    let msg = WriteMsg { psn, rkey: remote.rkey, raddr: remote.addr, total, imm };
                    if total > 0
                        && fab.wire.is_some_and(|w| w.gpu_ipc)
                        && put_ipc_pieces((fab, &mrs), ws, dp, msg, list)?
                    {
                        ws.scratch = ranges;
                        ws.next_psn = (psn + 1) & PSN_MASK;
                        return Ok((psn, State::Sent));
                    }
                    let mut at = Cursor::default();
                    let put = put_write_packets(ws, dp, msg, &mut at, |i| Ok(ranges[i]));
                    ws.scratch = ranges;
                    // Only a failed copy out of local memory can fail here (the ranges were just resolved), and
                    // only before the message's first packet was complete: nothing left.
                    put?;
                    if at.offset < total {
                        // The outbox is full: the rest follows as it empties, the SGEs resolved again then.
                        let mut sges = std::mem::take(&mut ws.spare_sges);
                        sges.clear();
                        sges.extend(list.iter());
                        ws.stream = Some(WriteStream { msg, at, sges });
                    }
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
            // Where the old value lands is checked before the request leaves (0x04), as on the direct path: a
            // responder that applied the atomic would change the peer's word for a WQE that fails. Checked
            // again when the response arrives (the MR may be gone by then).
            exec::local(&read(&fab.mrs), qp.pdn, sge, true)?;
            packet::encode(&Packet::Atomic { psn, rkey: remote.rkey, raddr: remote.addr, op }, &mut ws.outbox);
            State::Atomic { sge }
        }
    };
    ws.next_psn = (psn + 1) & PSN_MASK;
    Ok((psn, state))
}

/// Puts the WRITE `msg` (local SGEs `list`, resolved in `mrs` just before) into the outbox as pieces the peer
/// copies itself ([`Packet::WriteIpc`], one per SGE), when every SGE lies in GPU memory of an allocation the
/// peer has mapped; returns whether it did. Otherwise offers the peer each exported allocation of the SGEs
/// it was not offered yet ([`Packet::IpcOffer`], answered later: [`on_answer`]), and the caller sends the
/// bytes. The peer reads the source when the request's turn comes, later than the requester would: every
/// placement this data path enqueued before (e.g. a READ's data landing in the source) completes first.
///
/// # Errors
/// The data path's fault when that wait failed: the WQE fails, nothing left.
fn put_ipc_pieces(
    (fab, mrs): (&Fabric, &MrTable),
    ws: &mut WireSq,
    dp: &mut DataPath,
    msg: WriteMsg,
    list: SgeList,
) -> Result<bool, Fault> {
    let mut all_mapped = true;
    for s in list.iter().filter(|s| s.len > 0) {
        let export = mrs.get(s.lkey).and_then(|e| e.export);
        let Some(x) = export else { return Ok(false) };
        match ws.offers.get(&x.handle) {
            Some(Some(true)) => {}
            Some(Some(false)) => return Ok(false),
            Some(None) => all_mapped = false,
            // A peer that declined an offer cannot map (another host, no GPU copier, the path off there):
            // offer it nothing more; nor more than it takes.
            None if ws.offers.len() >= MAX_OFFERS || ws.offers.values().any(|a| *a == Some(false)) => return Ok(false),
            None => {
                packet::encode(&Packet::IpcOffer { handle: &x.handle }, &mut ws.outbox);
                ws.offers.insert(x.handle, None);
                all_mapped = false;
            }
        }
    }
    if !all_mapped {
        return Ok(false);
    }
    dp.fence()?;
    // Counted before the MR table's read lock goes: a deregistration (which takes the write lock) then sees
    // this WRITE as unanswered, and waits for its answer before the memory may go (`EmuNic::dereg_mr`). The
    // keys go to the WQE's record (`post`), which gives them back when the answer comes (`release_ipc`).
    ws.ipc_keys.clear();
    for s in list.iter().filter(|s| s.len > 0) {
        if !ws.ipc_keys.contains(&s.lkey) {
            ws.ipc_keys.push(s.lkey);
        }
    }
    let mut refs = lock(&fab.ipc_refs);
    for key in &ws.ipc_keys {
        refs.entry(*key).or_default().unanswered += 1;
    }
    drop(refs);
    let mut offset = 0;
    for s in list.iter().filter(|s| s.len > 0) {
        // Resolved and exported just above, under the same read lock: present.
        let Some((e, Some(x))) = mrs.get(s.lkey).map(|e| (e, e.export)) else { continue };
        let last = offset + s.len == msg.total;
        let piece = Packet::WriteIpc {
            psn: msg.psn,
            rkey: msg.rkey,
            raddr: msg.raddr,
            total: msg.total,
            offset,
            imm: msg.imm,
            last,
            handle: &x.handle,
            src: x.offset + (s.addr - e.loc.addr),
            len: s.len,
        };
        packet::encode(&piece, &mut ws.outbox);
        bump(&fab.stats.ipc_pieces);
        fab.stats.ipc_bytes.fetch_add(s.len, std::sync::atomic::Ordering::Relaxed);
        offset += s.len;
    }
    Ok(true)
}

/// The peer's answer to an offer ([`Packet::IpcAnswer`]): from now on, WRITEs from that allocation go as
/// pieces the peer copies (`mapped`), or always as bytes. An answer to nothing offered, or a second answer,
/// breaks the protocol.
fn on_answer(ws: &mut WireSq, handle: &[u8; EXPORT_HANDLE_BYTES], mapped: bool) -> Result<(), &'static str> {
    match ws.offers.get_mut(handle) {
        Some(state @ None) => {
            *state = Some(mapped);
            Ok(())
        }
        _ => Err("an IPC answer to no open offer"),
    }
}

/// The peer offers an allocation its WRITEs read from ([`Packet::IpcOffer`]): when this NIC may take the
/// same-host path, its copier maps the allocation on a thread of its own (the driver call may wait for
/// running kernels: the executor must not), which posts [`Inbound::Mapped`] for [`answer_offer`]; else the
/// answer is no at once.
pub(crate) fn on_offer(
    fab: &Fabric,
    qp: &QpInner,
    ws: &mut WireSq,
    dp: &mut DataPath,
    handle: &[u8; EXPORT_HANDLE_BYTES],
) {
    if let Err(reason) = ws.resp.offer(handle) {
        ws.link.close();
        let reason = format!("{} broke the protocol: {reason}", peer_name(&ws.link));
        return link_down(fab, qp, ws, dp, reason);
    }
    let gpu = fab.gpu.clone().filter(|_| fab.wire.is_some_and(|w| w.gpu_ipc));
    let (Some(gpu), Some(mb)) = (gpu, fab.mailbox.get().cloned()) else {
        return answer_offer(fab, ws, handle, false);
    };
    if gpu.imported(handle).is_some() {
        return answer_offer(fab, ws, handle, true);
    }
    let (qpn, handle) = (qp.qpn, *handle);
    let spawned = std::thread::Builder::new().name("emu-ipc-map".into()).spawn(move || {
        let mapped = match gpu.import(&handle) {
            Ok(_) => true,
            Err(e) => {
                tracing::info!(
                    qpn,
                    "emulated NIC: a peer's GPU memory cannot be mapped here ({e}); its WRITEs go over TCP"
                );
                false
            }
        };
        mb.post(Inbound::Mapped { qpn, handle, mapped });
    });
    if let Err(e) = spawned {
        tracing::warn!("emulated NIC: no thread to map a peer's GPU memory ({e}); its WRITEs go over TCP");
        answer_offer(fab, ws, &handle, false);
    }
}

/// Answers the peer's offer of `handle` ([`Packet::IpcAnswer`]); pieces of it are taken from now on if
/// `mapped`.
pub(crate) fn answer_offer(fab: &Fabric, ws: &mut WireSq, handle: &[u8; EXPORT_HANDLE_BYTES], mapped: bool) {
    if mapped {
        bump(&fab.stats.ipc_mapped);
    }
    ws.resp.answered(handle, mapped);
    packet::encode(&Packet::IpcAnswer { handle, mapped }, &mut ws.outbox);
}

/// The peer's answer to an offer of this QP ([`on_answer`]); an answer to nothing offered takes the link down.
/// Not progress towards any outstanding request, so the retry timeout runs on.
pub(crate) fn on_ipc_answer(
    fab: &Fabric,
    qp: &QpInner,
    ws: &mut WireSq,
    dp: &mut DataPath,
    (handle, mapped): (&[u8; EXPORT_HANDLE_BYTES], bool),
) {
    if let Err(why) = on_answer(ws, handle, mapped) {
        ws.link.close();
        let reason = format!("peer QP {:#x} broke the protocol: {why}", ws.link.remote.qpn);
        link_down(fab, qp, ws, dp, reason);
    }
}

/// Puts packets of the WRITE `msg` into the outbox from `at` on while it has room, or until its last packet
/// is in; `range(i)` is SGE `i`'s local memory and length. Returns whether it put anything.
fn put_write_packets(
    ws: &mut WireSq,
    dp: &mut DataPath,
    msg: WriteMsg,
    at: &mut Cursor,
    mut range: impl FnMut(usize) -> Result<(MemLoc, u64), Fault>,
) -> Result<bool, Fault> {
    let mut put = false;
    while ws.has_room() {
        let n = (msg.total - at.offset).min(MAX_CHUNK as u64) as usize;
        ws.gather.resize(n, 0);
        let mut filled = 0;
        while filled < n {
            let (loc, len) = range(at.sge)?;
            let take = ((len - at.in_sge) as usize).min(n - filled);
            // SAFETY: `loc` was resolved inside a registered MR (`len` bytes, `in_sge + take <= len`) under the
            // MR table's read lock, which the caller holds still, so the MR stays registered while its bytes
            // are read.
            unsafe { dp.read_bytes(at_loc(loc, at.in_sge), &mut ws.gather[filled..filled + take]) }?;
            filled += take;
            at.in_sge += take as u64;
            if at.in_sge == len {
                at.sge += 1;
                at.in_sge = 0;
            }
        }
        let last = at.offset + n as u64 == msg.total;
        let w = Packet::Write {
            psn: msg.psn,
            rkey: msg.rkey,
            raddr: msg.raddr,
            total: msg.total,
            offset: at.offset,
            imm: msg.imm,
            last,
            data: &ws.gather,
        };
        packet::encode(&w, &mut ws.outbox);
        at.offset += n as u64;
        put = true;
        if last {
            break;
        }
    }
    Ok(put)
}

/// Puts the next packets of the streaming WRITE (`ws.stream`) into the outbox while it has room, resolving
/// each local SGE again in `mrs` (the MR table, read-locked by the caller). Clears the stream once its last
/// packet is in. Returns whether it put anything.
///
/// # Errors
/// The fault when a local SGE no longer resolves (its MR was deregistered) or its memory cannot be read: the
/// message cannot be finished.
fn pump_write(mrs: &MrTable, qp: &QpInner, ws: &mut WireSq, dp: &mut DataPath) -> Result<bool, Fault> {
    let Some(mut st) = ws.stream.take() else { return Ok(false) };
    let sges = std::mem::take(&mut st.sges);
    let put = put_write_packets(ws, dp, st.msg, &mut st.at, |i| {
        let s = sges[i];
        Ok((exec::local(mrs, qp.pdn, s, false)?, s.len))
    })?;
    if st.at.offset < st.msg.total {
        st.sges = sges;
        ws.stream = Some(st);
    } else {
        ws.spare_sges = sges;
    }
    Ok(put)
}

/// The streaming WRITE could not be finished (`f`): its WQE fails with `f`, and the link goes down, since its
/// peer holds part of a message that no packet will complete.
fn stream_failed(fab: &Fabric, qp: &QpInner, ws: &mut WireSq, dp: &mut DataPath, psn: u32, f: Fault) {
    if let Some(q) = ws.pending.iter_mut().find(|q| q.psn == Some(psn)) {
        set_state(&mut ws.out, q, State::Failed(f));
    }
    ws.failing = true;
    let reason =
        format!("a WRITE to {} lost its local memory mid-message (syndrome {:#x})", peer_name(&ws.link), f.syndrome);
    link_down(fab, qp, ws, dp, reason);
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

fn waiting_for(pending: &mut VecDeque<Pending>, psn: u32) -> Option<&mut Pending> {
    pending.iter_mut().find(|p| p.psn == Some(psn) && is_waiting(&p.state))
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
                    set_state(&mut ws.out, q, State::Done { byte_cnt: 0 });
                    release_ipc(fab, q, true);
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
            let q = waiting_for(&mut ws.pending, psn).ok_or("NAK of nothing outstanding")?;
            set_state(&mut ws.out, q, State::Failed(Fault { syndrome, vendor }));
            release_ipc(fab, q, true);
            Ok(())
        }
        Packet::ReadResp { psn, offset, last, data } => {
            let q = waiting_for(&mut ws.pending, psn).ok_or("READ response of nothing outstanding")?;
            let State::Read { sges, got, total } = &mut q.state else { return Err("READ response to another request") };
            if offset != *got || offset + data.len() as u64 > *total || last != (offset + data.len() as u64 == *total) {
                return Err("READ response out of order");
            }
            let placed = place_read(fab, qp, dp, sges, offset, data);
            *got += data.len() as u64;
            let state = match placed {
                Err(f) => State::Failed(f),
                Ok(()) if last => State::Done { byte_cnt: *total as u32 },
                Ok(()) => return Ok(()),
            };
            set_state(&mut ws.out, q, state);
            Ok(())
        }
        Packet::AtomicResp { psn, old } => {
            let q = waiting_for(&mut ws.pending, psn).ok_or("atomic response of nothing outstanding")?;
            let State::Atomic { sge } = q.state else { return Err("atomic response to another request") };
            let mrs = read(&fab.mrs);
            let placed = exec::local(&mrs, qp.pdn, sge, true).and_then(|loc| {
                let loc = landing(&mrs, sge.lkey, loc, 8, dp);
                // The old value lands in host order (host-endianness atomic mode, as on the direct path).
                // SAFETY: `loc` is a registered 8-byte range with LOCAL_WRITE (or the copier's view of it); the
                // MR read lock is held.
                unsafe { dp.write_bytes(loc, &old.to_ne_bytes()) }
            });
            let state = match placed {
                Ok(()) => State::Done { byte_cnt: 8 },
                Err(f) => State::Failed(f),
            };
            set_state(&mut ws.out, q, state);
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
            let to = landing(&mrs, s.lkey, at_loc(loc, from), n, dp);
            // SAFETY: `to` lies in a registered range of `s.len` bytes with LOCAL_WRITE (or the copier's view of
            // it) and `from + n <= s.len`; the MR read lock is held.
            unsafe { dp.write_bytes(to, &data[done..done + n]) }?;
            done += n;
        }
        start = end;
    }
    Ok(())
}

/// Most bytes of a response that go into host memory through the copier rather than directly
/// ([`landing`]): what its small writes carry without a staging copy.
const LANDING_VIA_COPIER_MAX: usize = 4 * WRITE_ASYNC_MAX;

/// Where `len` bytes of a response for `loc` (inside the MR of `lkey`) are written. While GPU operations are
/// pending (an earlier response's data, the CQEs the copier writes into a CQ in GPU memory) a direct write
/// to host memory would first wait for them, once per response; so a few bytes for host memory that the
/// copier reaches go through it, at the MR's GPU view, in order behind those operations and before the CQE
/// that reports them, without a wait. Otherwise `loc` itself.
fn landing(mrs: &MrTable, lkey: u32, loc: MemLoc, len: usize, dp: &DataPath) -> MemLoc {
    if loc.kind != MemKind::Host || !dp.pending() || len > LANDING_VIA_COPIER_MAX {
        return loc;
    }
    mrs.get(lkey).map_or(loc, |e| e.atomic_view(loc))
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
        if let Some(mut q) = ws.pending.pop_front() {
            ws.out.count(&q.state, false);
            // Flushed unanswered (the QP failed): the peer may still run it.
            release_ipc(fab, &mut q, false);
        }
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
        ws.link.set_error(&reason);
        ws.down = Some(reason);
    }
    ws.discard(dp);
    if let Some(q) = ws.pending.iter_mut().find(|q| is_waiting(&q.state)) {
        set_state(&mut ws.out, q, State::Failed(Fault::retry_exceeded()));
    }
    drain(fab, qp, ws, dp);
}

/// The QP was destroyed (the executor drops its state now): ends its connection, but only after what is owed
/// to the peer for requests already executed here. On hardware a responder's ACK or atomic response leaves
/// with the effect it answers, long before the process that sees the effect (the semaphore a fetch-add
/// advanced, the data a WRITE placed) can destroy the QP; here the executor writes answers a little after it
/// placed the data (later in its pass, or much later when it is preempted), and a process that watched the
/// memory and tore down at once would cut the peer's last request off, failing it with 0x15 although it took
/// place. So the outbox (whole frames, requests included) and those answers ([`RespState::put_executed`]) go
/// out first (after one wait on `dp` for the effects they report): what the socket takes now, the rest by
/// [`Link::close_after`], within `timeout`. Nothing new is produced: no further packet of a streaming WRITE,
/// no READ data. The answers not sent give their old-value slots back to `dp`.
pub(crate) fn farewell(fab: &Fabric, mut ws: WireSq, dp: &mut DataPath, timeout: Duration) {
    // WRITEs by mapping it never learns the answer to: the peer may still run them.
    for q in ws.pending.iter_mut() {
        release_ipc(fab, q, false);
    }
    if ws.down.is_some() || !ws.link.is_up() {
        ws.resp.discard(dp);
        ws.link.close();
        return;
    }
    let owed = ws.resp.put_executed(dp, &mut ws.outbox);
    // What is left: READs (and what follows them), or everything after a failed wait.
    ws.resp.discard(dp);
    if owed.is_err() {
        ws.link.close();
        return;
    }
    if ws.flush(dp).is_err() {
        // The link is closed already.
        return;
    }
    if ws.unsent() == 0 {
        ws.link.close();
    } else {
        let rest = ws.outbox.split_off(ws.sent);
        ws.link.close_after(rest, timeout);
    }
}

/// Handles request `p` for `qp` on its responder side ([`responder::on_request`]); a request that breaks the
/// protocol (out of PSN order, too many READs and atomics outstanding) takes the link down.
pub(crate) fn on_request(fab: &Fabric, qp: &QpInner, ws: &mut WireSq, dp: &mut DataPath, p: Packet<'_>) {
    if let Err(reason) = responder::on_request(fab, qp, &mut ws.resp, dp, p) {
        ws.link.close();
        let reason = format!("{} broke the protocol: {reason}", peer_name(&ws.link));
        link_down(fab, qp, ws, dp, reason);
    }
}

/// The data path's wait failed while answers were due (`f`): none of them can be vouched for, so the link
/// goes down (the peer's requester fails its outstanding WQEs with 0x15), as it would for a lost connection.
fn answers_lost(fab: &Fabric, qp: &QpInner, ws: &mut WireSq, dp: &mut DataPath, f: Fault) {
    ws.link.close();
    let reason = format!(
        "its effects in GPU memory could not be waited for (syndrome {:#x}, vendor {:#x}); answers to {} lost",
        f.syndrome,
        f.vendor,
        peer_name(&ws.link)
    );
    link_down(fab, qp, ws, dp, reason);
}

/// Per-pass upkeep: writes the outbox and produces what waits for room in it (the responder's answers, the
/// rest of a streaming WRITE), at most [`PASS_BUDGET`] bytes; then fails the QP when its peer made no
/// progress for `timeout` while something was outstanding, or its socket took nothing for `timeout` while
/// bytes waited. Returns whether it did anything.
pub(crate) fn tick(fab: &Fabric, qp: &QpInner, ws: &mut WireSq, dp: &mut DataPath, timeout: Duration) -> bool {
    let mut worked = false;
    let mut produced = 0;
    // The old values of the atomics this pass applied, resolved now even if their answers must wait for
    // room: their slots go back to the data path.
    if let Err(f) = ws.resp.resolve(dp) {
        answers_lost(fab, qp, ws, dp, f);
        return true;
    }
    loop {
        match ws.flush(dp) {
            Ok(wrote) => worked |= wrote,
            Err(reason) => {
                link_down(fab, qp, ws, dp, reason);
                return true;
            }
        }
        if !ws.has_room() || produced >= PASS_BUDGET || ws.down.is_some() {
            break;
        }
        let before = ws.outbox.len();
        // Answers first: they let the peer's requester go on.
        // The bound of `has_room`: `sent` does not move while the responder fills the outbox.
        let full = ws.sent + OUTBOX_HIGH;
        if let Err(f) = responder::pump(fab, qp, &mut ws.resp, dp, (&mut ws.outbox, full, &mut ws.gather)) {
            answers_lost(fab, qp, ws, dp, f);
            return true;
        }
        if let Some(psn) = ws.stream.as_ref().map(|st| st.msg.psn) {
            let mrs = read(&fab.mrs);
            if let Err(f) = pump_write(&mrs, qp, ws, dp) {
                drop(mrs);
                stream_failed(fab, qp, ws, dp, psn, f);
                return true;
            }
        }
        // The outbox only grows here (flush compacts it, but not in between).
        let made = ws.outbox.len() - before;
        if made == 0 {
            break;
        }
        produced += made;
        worked = true;
    }
    if ws.down.is_none() && ws.link.is_down() {
        // Closed after a failed send elsewhere in this pass (while posting a batch of WQEs).
        let reason = format!("the connection to {} broke while sending", peer_name(&ws.link));
        link_down(fab, qp, ws, dp, reason);
        return true;
    }
    if let Some(since) = ws.stuck_since {
        if ws.down.is_none() && since.elapsed() > timeout {
            let reason = format!(
                "{} stopped reading: its socket took none of {} bytes within {timeout:?}",
                peer_name(&ws.link),
                ws.unsent()
            );
            link_down(fab, qp, ws, dp, reason);
            return true;
        }
    }
    if ws.down.is_none() && ws.pending.iter().any(|q| is_waiting(&q.state)) && ws.last_progress.elapsed() > timeout {
        let peer = peer_name(&ws.link);
        let reason = match (ws.link.is_up(), ws.unsent()) {
            (false, _) => match ws.link.last_try() {
                Some(why) => format!("no connection to {peer} within {timeout:?} (the last try: {why})"),
                None => format!("no connection to {peer} within {timeout:?}"),
            },
            (true, 0) => format!("no response from {peer} within {timeout:?}"),
            (true, n) => format!("no response from {peer} within {timeout:?} ({n} bytes still wait for its socket)"),
        };
        link_down(fab, qp, ws, dp, reason);
        return true;
    }
    worked
}
