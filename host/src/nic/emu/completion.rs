//! The CQEs the NIC writes for its QPs' work: a requester's success (REQ) and error (REQ_ERR) CQEs, and a
//! responder's RESP_WR_IMM CQE for a WRITE with immediate; for WQEs executed here ([`super::sq`]) and over the
//! wire ([`super::wire`]) alike. Each goes through the CQ's [`CqInner::push`], behind the data movement it
//! reports.
//!
//! [`CqInner::push`]: super::cq::CqInner::push

use std::sync::atomic::Ordering;

use gdaki_shared::prm::cqe::{Cqe64, ErrCqe};
use gdaki_shared::prm::opcode;
use gdaki_shared::{Be16, Be32, Be64};

use super::access::DataPath;
use super::fabric::Fabric;
use super::fault::{vendor, Fault};
use super::qp::{QpInner, QpState};
use super::stats::bump;

/// The CQE timestamp the emulator writes: nanoseconds since the NIC was opened (`Fabric::epoch`), not a
/// device clock (hardware writes free-running device clock ticks; nothing here converts between the two).
fn timestamp(fab: &Fabric) -> Be64 {
    Be64::new(fab.epoch.elapsed().as_nanos() as u64)
}

/// Writes the RESP_WR_IMM CQE of responder QP `peer` for a WRITE with immediate `imm` that placed `placed`
/// bytes, after the data is placed. A responder CQ that overran moves `peer` to the error state and fails the
/// requester's WQE with 0x14 (remote operation error).
pub(crate) fn push_resp_imm(
    fab: &Fabric,
    peer: &QpInner,
    data: &mut DataPath,
    imm: Be32,
    placed: u32,
) -> Result<(), Fault> {
    let n = peer.resp_count.fetch_add(1, Ordering::Relaxed);
    let mut c = Cqe64::INVALID;
    c.imm_inval_pkey = imm;
    c.byte_cnt = Be32::new(placed);
    c.timestamp = timestamp(fab);
    c.sop_drop_qpn = Be32::new(peer.qpn & 0x00ff_ffff);
    c.wqe_counter = Be16::new(n as u16);
    c.op_own = opcode::cqe::RESP_WR_IMM << 4;
    if peer.rcq.push(&c, &fab.stats, data).is_err() {
        peer.set_state(QpState::Error);
        return Err(Fault::remote_op(vendor::RESP_CQ_OVERRUN));
    }
    bump(&fab.stats.cqes);
    Ok(())
}

/// Writes the requester's success CQE (opcode REQ) for the WQE at `idx`, after every earlier placement:
/// [`CqInner::push`] writes it through the copier, behind the operations it reports, while any are pending. A
/// CQ that overran moves the QP to the error state instead.
///
/// [`CqInner::push`]: super::cq::CqInner::push
pub(crate) fn complete(fab: &Fabric, qp: &QpInner, data: &mut DataPath, idx: u64, op: u8, byte_cnt: u32) {
    let mut c = Cqe64::INVALID;
    c.byte_cnt = Be32::new(byte_cnt);
    c.timestamp = timestamp(fab);
    c.sop_drop_qpn = Be32::new((op as u32) << 24 | (qp.qpn & 0x00ff_ffff));
    c.wqe_counter = Be16::new(idx as u16);
    c.op_own = opcode::cqe::REQ << 4;
    if qp.cq.push(&c, &fab.stats, data).is_err() {
        qp.set_state(QpState::Error);
    } else {
        bump(&fab.stats.cqes);
    }
}

/// Writes an error CQE (opcode REQ_ERR) for the WQE at `idx`, whatever its `fm_ce_se` asked, after every
/// earlier placement, and moves the QP to the error state.
pub(crate) fn fail(fab: &Fabric, qp: &QpInner, data: &mut DataPath, idx: u64, op: u8, f: Fault) {
    // Earlier placements precede this completion; a copy failure here changes nothing more.
    let _ = data.fence();
    let flushed = f == Fault::flushed();
    if !flushed {
        tracing::warn!(
            qpn = qp.qpn,
            wqe_counter = idx as u16,
            opcode = op,
            syndrome = f.syndrome,
            vendor = f.vendor,
            "emulated NIC: WQE failed; QP moves to the error state"
        );
    }
    qp.set_state(QpState::Error);
    let mut c: ErrCqe = bytemuck::cast(Cqe64::INVALID);
    c.syndrome = f.syndrome;
    c.vendor_err_synd = f.vendor;
    c.s_wqe_opcode_qpn = Be32::new((op as u32) << 24 | (qp.qpn & 0x00ff_ffff));
    c.wqe_counter = Be16::new(idx as u16);
    c.op_own = opcode::cqe::REQ_ERR << 4;
    if qp.cq.push(c.as_cqe(), &fab.stats, data).is_ok() {
        bump(if flushed { &fab.stats.flush_cqes } else { &fab.stats.error_cqes });
    }
}
