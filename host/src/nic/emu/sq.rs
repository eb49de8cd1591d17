//! The send-queue engine: turns a doorbell into a producer index, cross-checks the dbrec, then consumes
//! WQEs from the ring in order, executing them and writing their CQEs (or error and flush CQEs).
//!
//! Doorbell → producer index: the doorbell is the first 8 bytes of the last posted WQE's ctrl segment, so
//! the new producer index is `wqe_idx + ceil(ds / 4)` (16 bits). It is rebuilt into a 64-bit index from the
//! QP's 64-bit consumer count: 1..=`wqe_cnt` WQEBBs ahead is new work; up to `wqe_cnt` behind is a stale
//! doorbell (e.g. two posters' doorbells landing out of order) and ignored; anything else is a bad doorbell,
//! which fails the QP.

use std::sync::atomic::Ordering;

use gdaki_shared::prm::cqe::{Cqe64, ErrCqe};
use gdaki_shared::prm::dbrec::SQ_COUNTER_MASK;
use gdaki_shared::prm::opcode;
use gdaki_shared::prm::uar::BF_OFFSET;
use gdaki_shared::prm::wqe::{wqebbs, CtrlSeg, SEG, WQEBB};
use gdaki_shared::{Be16, Be32, Be64};

use crate::mem::MemLoc;

use super::access::DataPath;
use super::exec::{self, Pds};
use super::fabric::{read, Fabric};
use super::fault::{vendor, Fault};
use super::qmem;
use super::qp::{QpInner, QpState};
use super::stats::bump;
use super::wqe::{self, Expect, Op, MAX_WQE_BYTES};

/// Executor-side state of one SQ.
#[derive(Debug, Default)]
pub(crate) struct SqProgress {
    /// WQEBBs consumed (executed, failed or flushed), 64-bit.
    pub consumed: u64,
    /// The doorbell register's value when last looked at.
    pub last_db: u64,
}

/// The executor's reusable state, handed to [`poll`].
pub(crate) struct Engine {
    pub data: DataPath,
    scratch: Vec<(MemLoc, u64)>,
    wqe: Box<[u8; MAX_WQE_BYTES]>,
}

impl Engine {
    pub(crate) fn new(data: DataPath) -> Self {
        Self { data, scratch: Vec::new(), wqe: Box::new([0; MAX_WQE_BYTES]) }
    }
}

/// The ctrl segment whose first 8 bytes are the doorbell value `db` (as stored in memory).
fn ctrl_of_doorbell(db: u64) -> CtrlSeg {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&db.to_ne_bytes());
    bytemuck::pod_read_unaligned(&b)
}

/// Looks at `qp`'s doorbell register and, if it changed, processes the WQEs it announces. Returns whether
/// there was anything to do (for the idle back-off).
pub(crate) fn poll(fab: &Fabric, qp: &QpInner, eng: &mut Engine) -> bool {
    if qp.is_destroyed() || !matches!(qp.state(), QpState::Rts | QpState::Error) {
        return false;
    }
    let db = qp.doorbell();
    let mut p = super::fabric::lock(&qp.progress);
    if db == p.last_db {
        return false;
    }
    p.last_db = db;
    bump(&fab.stats.doorbells);
    let ctrl = ctrl_of_doorbell(db);
    let end = ctrl.wqe_index().wrapping_add(wqebbs(ctrl.ds() as u32) as u16);
    let cons16 = p.consumed as u16;
    let ahead = end.wrapping_sub(cons16) as u64;
    let wqe_cnt = qp.wqe_cnt as u64;
    if ahead == 0 || ahead > wqe_cnt {
        if cons16.wrapping_sub(end) as u64 <= wqe_cnt {
            bump(&fab.stats.stale_doorbells);
            tracing::debug!(qpn = qp.qpn, end, consumed = p.consumed, "emulated NIC: stale doorbell ignored");
        } else {
            bump(&fab.stats.bad_doorbells);
            tracing::warn!(
                qpn = qp.qpn,
                end,
                consumed = p.consumed,
                wqe_cnt,
                "emulated NIC: doorbell announces more WQEBBs than the SQ holds"
            );
            if qp.state() != QpState::Error {
                fail(fab, qp, eng, p.consumed, ctrl.opcode(), Fault::qp_op(vendor::BAD_DOORBELL));
            }
        }
        return true;
    }
    let pi = p.consumed + ahead;
    check_dbrec(fab, qp, pi);
    check_blueflame(fab, qp, db, ctrl.wqe_index());
    while p.consumed < pi {
        let n = step(fab, qp, eng, p.consumed, pi);
        p.consumed += n;
    }
    true
}

/// Records a mismatch when dbrec word 1 (SQ counter) is behind the doorbell's producer index. It may be
/// ahead: another poster may have updated it already for WQEs whose doorbell is still to come.
fn check_dbrec(fab: &Fabric, qp: &QpInner, pi: u64) {
    let dbrec = Be32::from_bits(qmem::load_u32(&qp.dbrec, 4, Ordering::Acquire)).get() & SQ_COUNTER_MASK;
    let ahead = (dbrec as u16).wrapping_sub(pi as u16) as u64;
    if ahead > qp.wqe_cnt as u64 {
        bump(&fab.stats.dbrec_mismatches);
        tracing::warn!(
            qpn = qp.qpn,
            dbrec,
            pi = pi & SQ_COUNTER_MASK as u64,
            "emulated NIC: dbrec SQ counter (word 1) behind the doorbell; was it written, and to word 1?"
        );
    }
}

/// Counts a BlueFlame write when the register's 64 bytes equal the first WQEBB of the doorbell's WQE in the
/// ring. The WQE itself is always read from the ring, as software must write it there too.
fn check_blueflame(fab: &Fabric, qp: &QpInner, db: u64, wqe_index: u16) {
    let mut ring = [0u8; WQEBB];
    let slot = (wqe_index as u32 & (qp.wqe_cnt - 1)) as usize;
    qmem::read_wrapping(&qp.sq, slot * WQEBB, &mut ring);
    let same = (1..WQEBB / 8).all(|i| {
        let reg = qmem::load_u64(&qp.uar, BF_OFFSET + i * 8, Ordering::Relaxed);
        reg.to_ne_bytes()[..] == ring[i * 8..i * 8 + 8]
    });
    if same && db.to_ne_bytes()[..] == ring[..8] {
        bump(&fab.stats.blueflame);
    }
}

/// Consumes the WQE at consumer index `idx` (producer index `pi`); returns the WQEBBs it took (≥ 1).
fn step(fab: &Fabric, qp: &QpInner, eng: &mut Engine, idx: u64, pi: u64) -> u64 {
    let mask = qp.wqe_cnt as u64 - 1;
    let off = ((idx & mask) as usize) * WQEBB;
    let avail = pi - idx;
    let mut head = [0u8; SEG];
    qmem::read_wrapping(&qp.sq, off, &mut head);
    let ctrl: CtrlSeg = bytemuck::pod_read_unaligned(&head);
    // Size to skip when the WQE is not executed: its own ds when sane, at least one WQEBB, never past pi.
    let skip = (wqebbs(ctrl.ds() as u32) as u64).clamp(1, avail);
    if qp.state() == QpState::Error {
        fail(fab, qp, eng, idx, ctrl.opcode(), Fault::flushed());
        return skip;
    }
    let e = Expect { qpn: qp.qpn, wqe_cnt: qp.wqe_cnt, index: idx as u16, avail };
    let h = match wqe::parse_ctrl(&ctrl, &e) {
        Ok(h) => h,
        Err(f) => {
            fail(fab, qp, eng, idx, ctrl.opcode(), f);
            return skip;
        }
    };
    let len = h.ds as usize * SEG;
    let buf = &mut eng.wqe[..len];
    qmem::read_wrapping(&qp.sq, off, buf);
    let result = wqe::parse_body(&h, &eng.wqe[..len]).and_then(|op| run(fab, qp, &op, &mut eng.data, &mut eng.scratch));
    match result {
        Ok(out) => {
            bump(&fab.stats.wqes);
            if let Some((imm, placed)) = out.resp_imm {
                if let Err(f) = respond_imm(fab, qp, eng, imm, placed) {
                    fail(fab, qp, eng, idx, h.opcode, f);
                    return h.wqebbs as u64;
                }
            }
            if h.cq_update {
                complete(fab, qp, eng, idx, h.opcode, out.byte_cnt);
            }
        }
        Err(f) => fail(fab, qp, eng, idx, h.opcode, f),
    }
    h.wqebbs as u64
}

/// Finds the responder and executes `op` under the MR table's read lock.
fn run(
    fab: &Fabric,
    qp: &QpInner,
    op: &Op<'_>,
    data: &mut DataPath,
    scratch: &mut Vec<(MemLoc, u64)>,
) -> Result<exec::Outcome, Fault> {
    let remote_pd = match op {
        Op::Nop => qp.pdn,
        _ => {
            let peer = qp.peer.get().and_then(|(_, w)| w.upgrade());
            match peer {
                Some(peer) if peer.responds_to(qp.qpn) => peer.pdn,
                _ => return Err(Fault::retry_exceeded()),
            }
        }
    };
    let mrs = read(&fab.mrs);
    exec::execute(op, Pds { local: qp.pdn, remote: remote_pd }, &mrs, data, scratch)
}

fn timestamp(fab: &Fabric) -> Be64 {
    Be64::new(fab.epoch.elapsed().as_nanos() as u64)
}

/// The responder's RESP_WR_IMM CQE, after the data is placed.
fn respond_imm(fab: &Fabric, qp: &QpInner, eng: &mut Engine, imm: Be32, placed: u32) -> Result<(), Fault> {
    let Some(peer) = qp.peer.get().and_then(|(_, w)| w.upgrade()) else {
        return Err(Fault::retry_exceeded());
    };
    eng.data.fence()?;
    let n = peer.resp_count.fetch_add(1, Ordering::Relaxed);
    let mut c = Cqe64::INVALID;
    c.imm_inval_pkey = imm;
    c.byte_cnt = Be32::new(placed);
    c.timestamp = timestamp(fab);
    c.sop_drop_qpn = Be32::new(peer.qpn & 0x00ff_ffff);
    c.wqe_counter = Be16::new(n as u16);
    c.op_own = opcode::cqe::RESP_WR_IMM << 4;
    if peer.cq.push(&c, &fab.stats).is_err() {
        peer.set_state(QpState::Error);
        return Err(Fault::remote_op(vendor::RESP_CQ_OVERRUN));
    }
    bump(&fab.stats.cqes);
    Ok(())
}

/// The requester's success CQE (opcode REQ), after every earlier placement.
fn complete(fab: &Fabric, qp: &QpInner, eng: &mut Engine, idx: u64, op: u8, byte_cnt: u32) {
    if let Err(f) = eng.data.fence() {
        fail(fab, qp, eng, idx, op, f);
        return;
    }
    let mut c = Cqe64::INVALID;
    c.byte_cnt = Be32::new(byte_cnt);
    c.timestamp = timestamp(fab);
    c.sop_drop_qpn = Be32::new((op as u32) << 24 | (qp.qpn & 0x00ff_ffff));
    c.wqe_counter = Be16::new(idx as u16);
    c.op_own = opcode::cqe::REQ << 4;
    if qp.cq.push(&c, &fab.stats).is_err() {
        qp.set_state(QpState::Error);
    } else {
        bump(&fab.stats.cqes);
    }
}

/// An error CQE (opcode REQ_ERR) for the WQE at `idx`, written whatever its `fm_ce_se` asked, and the QP
/// moves to the error state.
fn fail(fab: &Fabric, qp: &QpInner, eng: &mut Engine, idx: u64, op: u8, f: Fault) {
    // Earlier placements still precede this completion; a copy failure here changes nothing more.
    let _ = eng.data.fence();
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
    if qp.cq.push(c.as_cqe(), &fab.stats).is_ok() {
        bump(if flushed { &fab.stats.flush_cqes } else { &fab.stats.error_cqes });
    }
}
