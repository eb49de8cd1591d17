//! The responder side of a QP whose peer is across the wire: validates each inbound request against this
//! NIC's MRs and the QP's PD, places or fetches the data, and answers.
//!
//! Checks are the direct path's ([`exec::remote`]): rkey, PD, bounds and rights (NAK with 0x13), atomic
//! alignment (NAK with 0x12). Requests run in PSN order on the executor thread, so an atomic is applied only
//! after every earlier WRITE of the QP is placed (in GPU memory the copier runs them in the order they were
//! enqueued; a direct host access waits for it first). A WRITE is acknowledged, and an atomic's response sent,
//! only after its effect is placed, but the responder does not wait for each: it waits once, when answers are
//! encoded ([`RespState::settle`]), for every placement and atomic of the batch of requests before them. After
//! a NAK the responder ignores the rest of the connection's requests: the requester has moved to the error
//! state and flushes them itself.
//!
//! Every request is taken at once, whether or not the outbox has room to answer it (see [`super::link`] for
//! why that matters): a WRITE is placed, an atomic is applied, and what a READ or an atomic must send back
//! becomes a record in the responder's queue, turned into packets as the outbox has room ([`pump`]); a READ's
//! data is read then. The queue holds at most [`MAX_RD_ATOMIC`] records: a requester that has more READs and
//! atomics outstanding breaks the protocol (the link goes down). An honest requester sends a WRITE or atomic
//! only once its earlier READs are answered, so a READ never sees a later request's data.

use std::collections::{HashMap, VecDeque};

use super::packet::{self, Packet, MAX_CHUNK, MAX_RD_ATOMIC, PSN_MASK};
use crate::mem::{MemKind, EXPORT_HANDLE_BYTES};
use crate::nic::emu::access::{DataPath, Old};
use crate::nic::emu::completion::push_resp_imm;
use crate::nic::emu::exec::{self, at};
use crate::nic::emu::fabric::Fabric;
use crate::nic::emu::fault::{vendor, Fault};
use crate::nic::emu::guard::read;
use crate::nic::emu::mr::Access;
use crate::nic::emu::qp::{QpInner, QpState};
use crate::nic::emu::wqe::Remote;
use gdaki_shared::Be32;

/// The responder's place in the request stream.
#[derive(Debug)]
pub(crate) struct RespState {
    /// PSN of the next request (all packets of a multi-packet WRITE carry the same one).
    expected: u32,
    /// A NAK was sent: later requests are ignored.
    broken: bool,
    /// The last WRITE enqueued for placement and not acknowledged yet: one cumulative ACK covers every WRITE
    /// of a batch of inbound requests (InfiniBand's ACK coalescing), once they are placed ([`RespState::settle`]).
    ack_due: Option<u32>,
    /// Answers not in the outbox yet, in PSN order.
    queue: VecDeque<Answer>,
    /// The allocations the peer offered for the same-host path, by handle: `None` while this NIC maps one,
    /// then whether it did ([`RespState::offer`]). Pieces may name only those mapped.
    offers: HashMap<[u8; EXPORT_HANDLE_BYTES], Option<bool>>,
}

/// Most allocations one peer QP may offer (a requester offers no more; its later WRITEs from other allocations
/// go as bytes): more means a broken or hostile peer (each offer costs this NIC a thread while it maps).
pub(crate) const MAX_OFFERS: usize = 64;

/// An answer the responder owes, until its packets are in the outbox.
#[derive(Debug)]
enum Answer {
    /// A READ of `len` bytes at `raddr` (checked when it came); `offset` bytes of it are sent.
    Read { psn: u32, rkey: u32, raddr: u64, len: u64, offset: u64 },
    /// An atomic, enqueued when it came, and the old value it found (pending until the data path's next wait).
    Atomic { psn: u32, old: Old },
    /// A refusal: the last answer (the responder ignores the rest of the connection's requests).
    Nak { psn: u32, syndrome: u8, vendor: u8 },
}

impl RespState {
    pub(crate) fn new(rq_psn: u32) -> Self {
        Self {
            expected: rq_psn & PSN_MASK,
            broken: false,
            ack_due: None,
            queue: VecDeque::new(),
            offers: HashMap::new(),
        }
    }

    /// Records the peer's offer of `handle`, to be mapped. `Err` (the link goes down) for an allocation it
    /// offered before, or one more than [`MAX_OFFERS`].
    pub(crate) fn offer(&mut self, handle: &[u8; EXPORT_HANDLE_BYTES]) -> Result<(), String> {
        if self.offers.contains_key(handle) {
            return Err("an allocation offered twice".into());
        }
        if self.offers.len() >= MAX_OFFERS {
            return Err(format!("more than {MAX_OFFERS} allocations offered"));
        }
        self.offers.insert(*handle, None);
        Ok(())
    }

    /// The offer of `handle` was answered: mapped or not.
    pub(crate) fn answered(&mut self, handle: &[u8; EXPORT_HANDLE_BYTES], mapped: bool) {
        self.offers.insert(*handle, Some(mapped));
    }

    /// Makes what the owed answers report true before any of them is encoded: waits once
    /// ([`DataPath::fence`]) for every placement and atomic enqueued so far when a WRITE awaits its ACK or a
    /// NAK is owed, and resolves every pending old value ([`RespState::resolve`]). So a batch of requests
    /// costs one host wait, at the moment its answers go out, not one per request.
    ///
    /// # Errors
    /// The data path's fault when the wait failed: the owed answers cannot be vouched for.
    fn settle(&mut self, dp: &mut DataPath) -> Result<(), Fault> {
        // A NAK ends the request for the requester as an ACK does: a WRITE by mapping refused after its copy
        // was enqueued (its immediate's CQE found no room) would otherwise let the requester's MR go while
        // this NIC still copies out of it.
        if self.ack_due.is_some() || self.queue.iter().any(|a| matches!(a, Answer::Nak { .. })) {
            dp.fence()?;
        }
        self.resolve(dp)
    }

    /// Turns every pending old value of the queue into the value the copier's atomic returned, after one
    /// [`DataPath::fence`] for all of them (none when none is pending), giving their slots back to the data
    /// path. Called once per pass of the executor as well, whether or not the outbox has room for the
    /// answers, so that slots are held for one pass at most while the link is up.
    ///
    /// # Errors
    /// As [`RespState::settle`].
    pub(crate) fn resolve(&mut self, dp: &mut DataPath) -> Result<(), Fault> {
        let pending_old = |a: &Answer| matches!(a, Answer::Atomic { old: Old::Pending(_), .. });
        if !self.queue.iter().any(pending_old) {
            return Ok(());
        }
        dp.fence()?;
        for a in self.queue.iter_mut() {
            if let Answer::Atomic { old, .. } = a {
                if matches!(old, Old::Pending(_)) {
                    // On an error the placeholder is never sent: every caller then discards the answers.
                    let v = dp.take_old(std::mem::replace(old, Old::Known(0)))?;
                    *old = Old::Known(v);
                }
            }
        }
        Ok(())
    }

    /// Encodes the due ACK, if any, into `out`, once the WRITEs it covers are placed ([`RespState::settle`]):
    /// before any other response, and when the outbox is written.
    ///
    /// # Errors
    /// As [`RespState::settle`]; nothing is encoded then.
    pub(crate) fn put_ack(&mut self, dp: &mut DataPath, out: &mut Vec<u8>) -> Result<(), Fault> {
        self.settle(dp)?;
        if let Some(psn) = self.ack_due.take() {
            packet::encode(&Packet::Ack { psn }, out);
        }
        Ok(())
    }

    /// Encodes into `out`, whatever room it has, the answers owed for requests whose effect already took place
    /// (once it is placed: [`RespState::settle`]): the due ACK (WRITEs placed), atomic responses (applied) and
    /// a NAK, in order, up to the first READ (whose data is not read any more: the QP is destroyed). For
    /// [`super::requester::farewell`]; bounded, as the queue is ([`MAX_RD_ATOMIC`]).
    ///
    /// # Errors
    /// As [`RespState::settle`]; nothing is encoded then.
    pub(crate) fn put_executed(&mut self, dp: &mut DataPath, out: &mut Vec<u8>) -> Result<(), Fault> {
        self.put_ack(dp, out)?;
        while let Some(answer) = self.queue.pop_front() {
            match answer {
                Answer::Atomic { psn, old } => {
                    let old = dp.take_old(old)?;
                    packet::encode(&Packet::AtomicResp { psn, old }, out);
                }
                Answer::Nak { psn, syndrome, vendor } => {
                    packet::encode(&Packet::Nak { psn, syndrome, vendor }, out);
                    self.drop_answers(dp);
                }
                read @ Answer::Read { .. } => {
                    self.queue.push_front(read);
                    break;
                }
            }
        }
        Ok(())
    }

    /// Forgets the answers still owed (the link is down, or the QP is gone), giving their old-value slots
    /// back to `dp`.
    pub(crate) fn discard(&mut self, dp: &mut DataPath) {
        self.ack_due = None;
        self.drop_answers(dp);
    }

    /// Forgets the answers in the queue (after a NAK, none of them is sent), giving back their slots.
    fn drop_answers(&mut self, dp: &mut DataPath) {
        for a in self.queue.drain(..) {
            if let Answer::Atomic { old, .. } = a {
                dp.drop_old(old);
            }
        }
    }
}

/// Handles request `p` for `qp`, whose responder state is `resp`. A request out of PSN order, or one READ or
/// atomic more than [`MAX_RD_ATOMIC`] outstanding, breaks the protocol: `Err` says how, and the caller takes
/// the link down ([`super::requester::on_request`]).
pub(crate) fn on_request(
    fab: &Fabric,
    qp: &QpInner,
    resp: &mut RespState,
    dp: &mut DataPath,
    p: Packet<'_>,
) -> Result<(), String> {
    // A QP that is not in RTR/RTS does not answer (the requester times out, 0x15), as on hardware.
    if resp.broken || !matches!(qp.state(), QpState::Rtr | QpState::Rts) {
        return Ok(());
    }
    let psn = match p {
        Packet::Write { psn, .. }
        | Packet::WriteIpc { psn, .. }
        | Packet::Read { psn, .. }
        | Packet::Atomic { psn, .. } => psn,
        _ => return Ok(()),
    };
    if psn != resp.expected {
        return Err(format!("request PSN {psn:#x} where {:#x} was due", resp.expected));
    }
    if matches!(p, Packet::Read { .. } | Packet::Atomic { .. }) && resp.queue.len() >= MAX_RD_ATOMIC {
        return Err(format!("more than {MAX_RD_ATOMIC} READs and atomics outstanding"));
    }
    // A piece of memory this NIC did not map for the peer, or past the mapping's end: only a broken or
    // hostile peer sends it (an honest one waits for the answer to its offer).
    if let Packet::WriteIpc { handle, src, len, .. } = p {
        let offered = resp.offers.get(handle) == Some(&Some(true));
        let inside =
            offered && dp.imported(handle).is_some_and(|m| src.checked_add(len).is_some_and(|end| end <= m.len));
        if !inside {
            return Err(format!(
                "a WRITE piece from GPU memory it did not offer or this NIC did not map ({len} bytes at offset {src:#x})"
            ));
        }
    }
    match execute(fab, qp, resp, dp, p) {
        Ok(true) => resp.expected = (psn + 1) & PSN_MASK,
        Ok(false) => {}
        Err(f) => {
            tracing::warn!(
                qpn = qp.qpn,
                psn,
                syndrome = f.syndrome,
                vendor = f.vendor,
                "emulated NIC: responder refused a request (NAK)"
            );
            resp.broken = true;
            resp.queue.push_back(Answer::Nak { psn, syndrome: f.syndrome, vendor: f.vendor });
        }
    }
    Ok(())
}

/// Puts owed answers into `outbox`, in order, while it is shorter than `full` bytes (the due ACK first, before
/// any other answer, as one packet of a READ response goes in at a time), after the effects they report are
/// placed ([`RespState::settle`]: one wait for all of them); `gather` is the buffer a READ's data goes through.
/// A READ's data is read now, from its range checked again: an MR deregistered since the READ came is refused
/// with a NAK (0x13) after what was sent. `Err` when the data path's wait for the effects failed: none of the
/// answers can be vouched for, and the caller takes the link down ([`super::requester::tick`]).
pub(crate) fn pump(
    fab: &Fabric,
    qp: &QpInner,
    resp: &mut RespState,
    dp: &mut DataPath,
    (outbox, full, gather): (&mut Vec<u8>, usize, &mut Vec<u8>),
) -> Result<(), Fault> {
    while outbox.len() < full {
        if resp.queue.is_empty() {
            return Ok(());
        }
        resp.put_ack(dp, outbox)?;
        let Some(answer) = resp.queue.pop_front() else { return Ok(()) };
        match answer {
            Answer::Atomic { psn, old } => packet::encode(&Packet::AtomicResp { psn, old: dp.take_old(old)? }, outbox),
            Answer::Nak { psn, syndrome, vendor } => {
                packet::encode(&Packet::Nak { psn, syndrome, vendor }, outbox);
                resp.drop_answers(dp);
            }
            Answer::Read { psn, rkey, raddr, len, offset } => {
                let n = (len - offset).min(MAX_CHUNK as u64) as usize;
                gather.resize(n, 0);
                if n > 0 {
                    let mrs = read(&fab.mrs);
                    let got =
                        exec::remote(&mrs, qp.responder(), Remote { addr: raddr, rkey }, len, Access::REMOTE_READ)
                            .and_then(|src| {
                                // SAFETY: inside `src`, a registered range of `len` bytes (`offset + n <= len`);
                                // the MR read lock is held. Earlier writes of this QP are placed first (read_bytes
                                // fences pending GPU copies).
                                unsafe { dp.read_bytes(at(src, offset), gather) }
                            });
                    if let Err(f) = got {
                        drop(mrs);
                        tracing::warn!(qpn = qp.qpn, psn, "emulated NIC: READ source gone mid-response (NAK)");
                        resp.broken = true;
                        packet::encode(&Packet::Nak { psn, syndrome: f.syndrome, vendor: f.vendor }, outbox);
                        resp.drop_answers(dp);
                        continue;
                    }
                }
                let last = offset + n as u64 == len;
                packet::encode(&Packet::ReadResp { psn, offset, last, data: gather }, outbox);
                if !last {
                    resp.queue.push_front(Answer::Read { psn, rkey, raddr, len, offset: offset + n as u64 });
                }
            }
        }
    }
    Ok(())
}

/// Executes one request packet; returns whether its message is complete (answered).
fn execute(fab: &Fabric, qp: &QpInner, resp: &mut RespState, dp: &mut DataPath, p: Packet<'_>) -> Result<bool, Fault> {
    match p {
        Packet::Write { psn, rkey, raddr, total, offset, imm, last, data } => {
            // A zero-length WRITE checks no key (IB spec), so a WRITE_IMM with no data may carry rkey 0.
            if total > 0 {
                let mrs = read(&fab.mrs);
                let dst =
                    exec::remote(&mrs, qp.responder(), Remote { addr: raddr, rkey }, total, Access::REMOTE_WRITE)?;
                // SAFETY: `dst` is a registered range of `total` bytes and `offset + data.len() <= total`
                // (checked by the decoder); the MR read lock is held while the bytes move.
                unsafe { dp.write_bytes(at(dst, offset), data) }?;
            }
            return finish_write(fab, qp, resp, dp, (psn, total, imm, last));
        }
        Packet::WriteIpc { psn, rkey, raddr, total, offset, imm, last, handle, src, len } => {
            // Checked as a WRITE's packet is; the bytes come from the peer's memory mapped here (checked by
            // `on_request`), copied GPU to GPU in this request's turn.
            let mrs = read(&fab.mrs);
            let dst = exec::remote(&mrs, qp.responder(), Remote { addr: raddr, rkey }, total, Access::REMOTE_WRITE)?;
            // SAFETY: `dst` is a registered range of `total` bytes and `offset + len <= total` (decoder); the
            // MR read lock is held while the copy is enqueued and the MR's drop synchronizes the copier. The
            // source lies inside a mapping this NIC's copier holds until it is dropped (`on_request`).
            unsafe { dp.copy_from_peer(at(dst, offset), (handle, src), len) }?;
            // Into host memory the copier may land the bytes only at its next synchronize (its engine's small
            // copies go through a bounce buffer), after which an immediate's CQE or a later atomic could
            // already be visible: wait for them here.
            if dst.kind == MemKind::Host {
                dp.fence()?;
            }
            return finish_write(fab, qp, resp, dp, (psn, total, imm, last));
        }
        Packet::Read { psn, rkey, raddr, len } => {
            // A zero-length READ checks no key (as a zero-length WRITE); it is answered with one empty packet.
            if len > 0 {
                let mrs = read(&fab.mrs);
                exec::remote(&mrs, qp.responder(), Remote { addr: raddr, rkey }, len, Access::REMOTE_READ)?;
            }
            // The data is read when the response goes out (`pump`).
            resp.queue.push_back(Answer::Read { psn, rkey, raddr, len, offset: 0 });
        }
        Packet::Atomic { psn, rkey, raddr, op } => {
            if !raddr.is_multiple_of(8) {
                return Err(Fault::remote_inval(vendor::ATOMIC_ALIGN));
            }
            let mrs = read(&fab.mrs);
            let word = exec::remote_atomic(&mrs, qp.responder(), Remote { addr: raddr, rkey })?;
            // SAFETY: a registered, 8-aligned 8-byte range; the MR read lock is held. `atomic_deferred` orders
            // itself after earlier placements. Its effect and old value are waited for when the response is
            // encoded (`RespState::settle`), with those of the rest of the batch.
            let old = unsafe { dp.atomic_deferred(word, op) }?;
            resp.queue.push_back(Answer::Atomic { psn, old });
        }
        _ => return Ok(false),
    }
    Ok(true)
}

/// After a WRITE's packet or piece `(psn, total, imm, last)` was placed: once its last one is, the
/// immediate's CQE (if any) follows the data (written by the copier behind it while any of it is pending,
/// `CqInner::push`) and the ACK is due, sent once the data is placed ([`RespState::settle`]). Returns whether
/// the message is complete.
fn finish_write(
    fab: &Fabric,
    qp: &QpInner,
    resp: &mut RespState,
    dp: &mut DataPath,
    (psn, total, imm, last): (u32, u64, Option<u32>, bool),
) -> Result<bool, Fault> {
    if !last {
        return Ok(false);
    }
    if let Some(i) = imm {
        push_resp_imm(fab, qp, dp, Be32::from_bits(i), total as u32)?;
    }
    resp.ack_due = Some(psn);
    Ok(true)
}
