//! The responder side of a QP whose peer is across the wire: validates each inbound request against this
//! NIC's MRs and the QP's PD, places or fetches the data, and answers.
//!
//! Checks are the direct path's ([`exec::remote`]): rkey, PD, bounds and rights (NAK with 0x13), atomic
//! alignment (NAK with 0x12). Requests run in PSN order on the executor thread, so an atomic is applied only
//! after every earlier WRITE of the QP is placed (GPU copies are fenced first), and a WRITE is acknowledged
//! only after its data is placed. After a NAK the responder ignores the rest of the connection's requests: the
//! requester has moved to the error state and flushes them itself.

use super::packet::{self, Packet, MAX_CHUNK, PSN_MASK};
use super::requester::{link_down, WireSq, FLUSH_AT};
use crate::mem::{MemKind, MemLoc};
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
}

impl RespState {
    pub(crate) fn new(rq_psn: u32) -> Self {
        Self { expected: rq_psn & PSN_MASK, broken: false, ack_due: None }
    }

    /// Encodes the due ACK, if any, into `out`: before any other response, and when the outbox is written.
    pub(crate) fn put_ack(&mut self, out: &mut Vec<u8>) {
        if let Some(psn) = self.ack_due.take() {
            packet::encode(&Packet::Ack { psn }, out);
        }
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
        link_down(fab, qp, ws, dp, format!("peer QP {:#x} broke the protocol: {reason}", ws.link.remote.qpn));
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
            ws.resp.put_ack(&mut ws.outbox);
            packet::encode(&Packet::Nak { psn, syndrome: f.syndrome, vendor: f.vendor }, &mut ws.outbox);
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
                let dst = exec::remote(&mrs, qp.pdn, Remote { addr: raddr, rkey }, total, Access::REMOTE_WRITE)?;
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
            let mrs = read(&fab.mrs);
            // A zero-length READ checks no key (as a zero-length WRITE); it is answered with one empty packet.
            let src = match len {
                0 => MemLoc { kind: MemKind::Host, addr: 0 },
                _ => exec::remote(&mrs, qp.pdn, Remote { addr: raddr, rkey }, len, Access::REMOTE_READ)?,
            };
            ws.resp.put_ack(&mut ws.outbox);
            let mut offset = 0;
            loop {
                let n = (len - offset).min(MAX_CHUNK as u64) as usize;
                ws.gather.resize(n, 0);
                // SAFETY: inside `src`, a registered range of `len` bytes; the MR read lock is held. Earlier
                // writes of this QP are placed first (read_bytes fences pending GPU copies).
                unsafe { dp.read_bytes(at(src, offset), &mut ws.gather) }?;
                let last = offset + n as u64 == len;
                packet::encode(&Packet::ReadResp { psn, offset, last, data: &ws.gather }, &mut ws.outbox);
                offset += n as u64;
                if last {
                    break;
                }
                // A long response streams out while it is read, rather than piling up in the outbox.
                if ws.outbox.len() >= FLUSH_AT && ws.flush().is_err() {
                    return Err(Fault::retry_exceeded());
                }
            }
        }
        Packet::Atomic { psn, rkey, raddr, op } => {
            if !raddr.is_multiple_of(8) {
                return Err(Fault::remote_inval(vendor::ATOMIC_ALIGN));
            }
            let mrs = read(&fab.mrs);
            let word = exec::remote(&mrs, qp.pdn, Remote { addr: raddr, rkey }, 8, Access::REMOTE_ATOMIC)?;
            // SAFETY: a registered, 8-aligned 8-byte range; the MR read lock is held. `atomic` fences earlier
            // placements first.
            let old = unsafe { dp.atomic(word, op) }?;
            ws.resp.put_ack(&mut ws.outbox);
            packet::encode(&Packet::AtomicResp { psn, old }, &mut ws.outbox);
        }
        _ => return Ok(false),
    }
    Ok(true)
}
