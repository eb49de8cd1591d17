//! The responder side of a QP whose peer is across the wire: validates each inbound request against this
//! NIC's MRs and the QP's PD, places or fetches the data, and answers.
//!
//! Checks are the direct path's ([`exec::remote`]): rkey, PD, bounds and rights (NAK with 0x13), atomic
//! alignment (NAK with 0x12). Requests run in PSN order on the executor thread, so an atomic is applied only
//! after every earlier WRITE of the QP is placed (GPU copies are fenced first), and a WRITE is acknowledged
//! only after its data is placed. After a NAK the responder ignores the rest of the connection's requests: the
//! requester has moved to the error state and flushes them itself.
//!
//! Every request is taken at once, whether or not the outbox has room to answer it (see [`super::link`] for
//! why that matters): a WRITE is placed, an atomic is applied, and what a READ or an atomic must send back
//! becomes a record in the responder's queue, turned into packets as the outbox has room ([`pump`]); a READ's
//! data is read then. The queue holds at most [`MAX_RD_ATOMIC`] records: a requester that has more READs and
//! atomics outstanding breaks the protocol (the link goes down). An honest requester sends a WRITE or atomic
//! only once its earlier READs are answered, so a READ never sees a later request's data.

use std::collections::VecDeque;

use super::link::peer_name;
use super::packet::{self, Packet, MAX_CHUNK, MAX_RD_ATOMIC, PSN_MASK};
use super::requester::{link_down, WireSq};
use crate::nic::emu::access::DataPath;
use crate::nic::emu::exec::{self, at};
use crate::nic::emu::fabric::{read, Fabric};
use crate::nic::emu::fault::{vendor, Fault};
use crate::nic::emu::mr::Access;
use crate::nic::emu::qp::{QpInner, QpState};
use crate::nic::emu::sq::push_resp_imm;
use crate::nic::emu::wqe::Remote;
use gdaki_shared::Be32;

/// The responder's place in the request stream.
#[derive(Debug)]
pub(crate) struct RespState {
    /// PSN of the next request (all packets of a multi-packet WRITE carry the same one).
    expected: u32,
    /// A NAK was sent: later requests are ignored.
    broken: bool,
    /// The last WRITE placed and not acknowledged yet: one cumulative ACK covers every WRITE of a batch of
    /// inbound requests (InfiniBand's ACK coalescing).
    ack_due: Option<u32>,
    /// Answers not in the outbox yet, in PSN order.
    queue: VecDeque<Answer>,
}

/// An answer the responder owes, until its packets are in the outbox.
#[derive(Clone, Copy, Debug)]
enum Answer {
    /// A READ of `len` bytes at `raddr` (checked when it came); `offset` bytes of it are sent.
    Read { psn: u32, rkey: u32, raddr: u64, len: u64, offset: u64 },
    /// An atomic, applied when it came, and the old value it found.
    Atomic { psn: u32, old: u64 },
    /// A refusal: the last answer (the responder ignores the rest of the connection's requests).
    Nak { psn: u32, syndrome: u8, vendor: u8 },
}

impl RespState {
    pub(crate) fn new(rq_psn: u32) -> Self {
        Self { expected: rq_psn & PSN_MASK, broken: false, ack_due: None, queue: VecDeque::new() }
    }

    /// Encodes the due ACK, if any, into `out`: before any other response, and when the outbox is written.
    pub(crate) fn put_ack(&mut self, out: &mut Vec<u8>) {
        if let Some(psn) = self.ack_due.take() {
            packet::encode(&Packet::Ack { psn }, out);
        }
    }

    /// Encodes into `out`, whatever room it has, the answers owed for requests whose effect already took place:
    /// the due ACK (WRITEs placed), atomic responses (applied) and a NAK, in order, up to the first READ (whose
    /// data is not read any more: the QP is destroyed). For [`super::requester::farewell`]; bounded, as the
    /// queue is ([`MAX_RD_ATOMIC`]).
    pub(crate) fn put_executed(&mut self, out: &mut Vec<u8>) {
        self.put_ack(out);
        while let Some(&answer) = self.queue.front() {
            match answer {
                Answer::Atomic { psn, old } => packet::encode(&Packet::AtomicResp { psn, old }, out),
                Answer::Nak { psn, syndrome, vendor } => {
                    packet::encode(&Packet::Nak { psn, syndrome, vendor }, out);
                    self.queue.clear();
                    return;
                }
                Answer::Read { .. } => return,
            }
            self.queue.pop_front();
        }
    }

    /// Forgets the answers still owed (the link is down).
    pub(crate) fn discard(&mut self) {
        self.ack_due = None;
        self.queue.clear();
    }
}

/// Handles request `p` for `qp`. A request out of PSN order breaks the protocol: the link goes down.
pub(crate) fn on_request(fab: &Fabric, qp: &QpInner, ws: &mut WireSq, dp: &mut DataPath, p: Packet<'_>) {
    // A QP that is not in RTR/RTS does not answer (the requester times out, 0x15), as on hardware.
    if ws.resp.broken || !matches!(qp.state(), QpState::Rtr | QpState::Rts) {
        return;
    }
    let psn = match p {
        Packet::Write { psn, .. } | Packet::Read { psn, .. } | Packet::Atomic { psn, .. } => psn,
        _ => return,
    };
    if psn != ws.resp.expected {
        let reason = format!("request PSN {psn:#x} where {:#x} was due", ws.resp.expected);
        ws.link.close();
        link_down(fab, qp, ws, dp, format!("{} broke the protocol: {reason}", peer_name(&ws.link)));
        return;
    }
    if matches!(p, Packet::Read { .. } | Packet::Atomic { .. }) && ws.resp.queue.len() >= MAX_RD_ATOMIC {
        let reason = format!(
            "{} broke the protocol: more than {MAX_RD_ATOMIC} READs and atomics outstanding",
            peer_name(&ws.link)
        );
        ws.link.close();
        link_down(fab, qp, ws, dp, reason);
        return;
    }
    match execute(fab, qp, ws, dp, p) {
        Ok(true) => ws.resp.expected = (psn + 1) & PSN_MASK,
        Ok(false) => {}
        Err(f) => {
            tracing::warn!(
                qpn = qp.qpn,
                psn,
                syndrome = f.syndrome,
                vendor = f.vendor,
                "emulated NIC: responder refused a request (NAK)"
            );
            ws.resp.broken = true;
            ws.resp.queue.push_back(Answer::Nak { psn, syndrome: f.syndrome, vendor: f.vendor });
        }
    }
}

/// Puts owed answers into the outbox, in order, while it has room (the due ACK first, before any other
/// answer, as one packet of a READ response goes in at a time). A READ's data is read now, from its range
/// checked again: an MR deregistered since the READ came is refused with a NAK (0x13) after what was sent.
pub(crate) fn pump(fab: &Fabric, qp: &QpInner, ws: &mut WireSq, dp: &mut DataPath) {
    while ws.has_room() {
        let Some(&answer) = ws.resp.queue.front() else { return };
        ws.resp.put_ack(&mut ws.outbox);
        match answer {
            Answer::Atomic { psn, old } => {
                packet::encode(&Packet::AtomicResp { psn, old }, &mut ws.outbox);
                ws.resp.queue.pop_front();
            }
            Answer::Nak { psn, syndrome, vendor } => {
                packet::encode(&Packet::Nak { psn, syndrome, vendor }, &mut ws.outbox);
                ws.resp.queue.clear();
            }
            Answer::Read { psn, rkey, raddr, len, offset } => {
                let n = (len - offset).min(MAX_CHUNK as u64) as usize;
                ws.gather.resize(n, 0);
                if n > 0 {
                    let mrs = read(&fab.mrs);
                    let got =
                        exec::remote(&mrs, qp.responder(), Remote { addr: raddr, rkey }, len, Access::REMOTE_READ)
                            .and_then(|src| {
                                // SAFETY: inside `src`, a registered range of `len` bytes (`offset + n <= len`);
                                // the MR read lock is held. Earlier writes of this QP are placed first (read_bytes
                                // fences pending GPU copies).
                                unsafe { dp.read_bytes(at(src, offset), &mut ws.gather) }
                            });
                    if let Err(f) = got {
                        drop(mrs);
                        tracing::warn!(qpn = qp.qpn, psn, "emulated NIC: READ source gone mid-response (NAK)");
                        ws.resp.broken = true;
                        packet::encode(&Packet::Nak { psn, syndrome: f.syndrome, vendor: f.vendor }, &mut ws.outbox);
                        ws.resp.queue.clear();
                        continue;
                    }
                }
                let last = offset + n as u64 == len;
                packet::encode(&Packet::ReadResp { psn, offset, last, data: &ws.gather }, &mut ws.outbox);
                match ws.resp.queue.front_mut() {
                    Some(Answer::Read { offset: o, .. }) if !last => *o += n as u64,
                    _ => {
                        ws.resp.queue.pop_front();
                    }
                }
            }
        }
    }
}

/// Executes one request packet; returns whether its message is complete (answered).
fn execute(fab: &Fabric, qp: &QpInner, ws: &mut WireSq, dp: &mut DataPath, p: Packet<'_>) -> Result<bool, Fault> {
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
            if !last {
                return Ok(false);
            }
            // Placed before it is acknowledged (and before the immediate's CQE).
            dp.fence()?;
            if let Some(i) = imm {
                push_resp_imm(fab, qp, dp, Be32::from_bits(i), total as u32)?;
            }
            ws.resp.ack_due = Some(psn);
        }
        Packet::Read { psn, rkey, raddr, len } => {
            // A zero-length READ checks no key (as a zero-length WRITE); it is answered with one empty packet.
            if len > 0 {
                let mrs = read(&fab.mrs);
                exec::remote(&mrs, qp.responder(), Remote { addr: raddr, rkey }, len, Access::REMOTE_READ)?;
            }
            // The data is read when the response goes out (`pump`).
            ws.resp.queue.push_back(Answer::Read { psn, rkey, raddr, len, offset: 0 });
        }
        Packet::Atomic { psn, rkey, raddr, op } => {
            if !raddr.is_multiple_of(8) {
                return Err(Fault::remote_inval(vendor::ATOMIC_ALIGN));
            }
            let mrs = read(&fab.mrs);
            let word = exec::remote_atomic(&mrs, qp.responder(), Remote { addr: raddr, rkey })?;
            // SAFETY: a registered, 8-aligned 8-byte range; the MR read lock is held. `atomic` orders itself
            // after earlier placements.
            let old = unsafe { dp.atomic(word, op) }?;
            // Its write-back is placed before the response tells the requester it was applied.
            dp.fence()?;
            ws.resp.queue.push_back(Answer::Atomic { psn, old });
        }
        _ => return Ok(false),
    }
    Ok(true)
}
