//! Polling the CQ: find the next CQE by its owner bit, read it, hand back its WQE index or its error, and
//! tell the NIC how far software consumed (CQ dbrec word 0). rdma-core's `get_sw_cqe` + `update_cons_index`.

use crate::error::{CqeError, UnexpectedCqe};
use crate::sq;
use crate::sync;
use gdaki_shared::handle::CqHandle;
use gdaki_shared::prm::cqe::{is_sw_owned, Cqe64, ErrCqe, CQE_SIZE};
use gdaki_shared::prm::dbrec::CQ_CI_MASK;
use gdaki_shared::prm::opcode;
use gdaki_shared::Be32;

/// A successful completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    /// CQE opcode (`MLX5_CQE_REQ`, `MLX5_CQE_RESP_WR_IMM`, ...).
    pub opcode: u8,
    /// WQE index (WQEBBs, low 16 bits) of the completed WQE.
    pub wqe_counter: u16,
    /// Bytes transferred (READ / atomic results; responder: bytes placed).
    pub byte_cnt: u32,
    /// QPN the completion belongs to.
    pub qpn: u32,
    /// Immediate data (RESP_WR_IMM), wire order.
    pub imm: Be32,
}

/// The next CQE if software owns it, else `None`; does not consume it. Loads only bytes 32..64 (the rest are
/// RX offload fields): first the last 8 bytes (`sop_drop_qpn`, `wqe_counter`, `signature`, `op_own`) with one
/// acquire load at system scope (`ld.acquire.sys.u64`; the NIC writes that word last, whole), then bytes 32..56
/// with three volatile loads ordered after it. Bytes 0..32 come back zero.
///
/// # Safety
/// `cq` must describe a live CQ (ring of `ncqe` 64-byte CQEs and its dbrec) that only this thread polls.
#[inline(always)]
pub unsafe fn peek(cq: &CqHandle) -> Option<Cqe64> {
    let n = cq.cons_index;
    let slot = n & (cq.ncqe as u64 - 1);
    let cqe = (cq.buf + slot * CQE_SIZE as u64) as *const u64;
    const LAST: usize = CQE_SIZE / 8 - 1;
    // SAFETY: the entry is inside the ring and 8-byte aligned.
    let last = unsafe { sync::load_acquire_u64(cqe.add(LAST)) };
    let mut words = [0u64; CQE_SIZE / 8];
    words[LAST] = last;
    let c: Cqe64 = bytemuck::cast(words);
    if !is_sw_owned(c.op_own, n, cq.ncqe) {
        return None;
    }
    for (i, w) in words.iter_mut().enumerate().take(LAST).skip(4) {
        // SAFETY: the entry is software-owned now; the NIC does not rewrite it until the consumer index
        // passes it. 8-byte aligned words inside the entry, read after the acquire above.
        *w = unsafe { sync::load_volatile(cqe.add(i)) };
    }
    Some(bytemuck::cast(words))
}

/// A CQE that [`take`] consumed: what it reports, and for a requester CQE the WQE it completes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Taken {
    /// The completion, or the error CQE's syndromes.
    pub completion: Result<Completion, CqeError>,
    /// The 64-bit WQEBB index of the WQE a requester CQE completes (it retires the SQ up to `wqe + 1`);
    /// `None` for a responder completion (an inbound WRITE with immediate).
    pub wqe: Option<u64>,
}

/// Takes the next CQE of `cq` for the send queue of QP `qpn` (`wqe_cnt` WQEBBs, retired up to `ci`, WQEs
/// posted below the bound `pi` gives): the one completion path of every poster, Exclusive or shared. A
/// requester CQE's 16-bit `wqe_counter` becomes a 64-bit index in `[ci, pi)` (`pi` is asked again once when
/// the first bound does not cover it: a shared QP's reservations run ahead of what its poller loaded).
/// Advances `cq.cons_index` but does not tell the NIC: [`publish_ci`] does, once per batch of takes.
///
/// Returns `None` when software owns no CQE, and [`UnexpectedCqe`] (the CQE left in the CQ) for a CQE of
/// another QP or of no posted WQE.
///
/// # Safety
/// As [`peek`].
#[inline(always)]
pub unsafe fn take(
    cq: &mut CqHandle,
    qpn: u32,
    wqe_cnt: u32,
    ci: u64,
    mut pi: impl FnMut() -> u64,
) -> Option<Result<Taken, UnexpectedCqe>> {
    // SAFETY: the caller's contract.
    let c = unsafe { peek(cq) }?;
    let unexpected = UnexpectedCqe { qpn: c.qpn(), wqe_counter: c.wqe_counter.get() };
    // Requester CQEs and error CQEs carry the QPN at the same place (`sop_drop_qpn`, `s_wqe_opcode_qpn`).
    if c.qpn() != qpn {
        return Some(Err(unexpected));
    }
    let wqe = if matches!(c.opcode(), opcode::cqe::REQ | opcode::cqe::REQ_ERR) {
        let counter = c.wqe_counter.get();
        let w = sq::wqe_index_from_counter(ci, pi(), wqe_cnt, counter)
            .or_else(|| sq::wqe_index_from_counter(ci, pi(), wqe_cnt, counter));
        match w {
            Some(w) => Some(w),
            None => return Some(Err(unexpected)),
        }
    } else {
        None
    };
    cq.cons_index += 1;
    Some(Ok(Taken { completion: decode(&c), wqe }))
}

/// Tells the NIC how far software consumed: writes the CQ dbrec's consumer index (word 0, low 24 bits of
/// `cq.cons_index`) with a release store, so that the reads of the entries precede their reuse by the NIC:
/// at GPU scope for a CQ in GPU memory (`st.release.gpu.u32`), at system scope for one in host memory
/// (`st.release.sys.u32`), as for the SQ's dbrec (see `db`). Once per batch of [`take`]s.
///
/// # Safety
/// As [`peek`].
#[inline(always)]
pub unsafe fn publish_ci(cq: &CqHandle) {
    let ci = Be32::new(cq.cons_index as u32 & CQ_CI_MASK).to_bits();
    let p = cq.dbrec as *mut u32;
    // SAFETY: word 0 of the CQ dbrec (`set_ci`), 4-byte aligned (caller's contract).
    unsafe {
        if cq.placement.is_gpu() {
            sync::store_release_gpu_u32(p, ci)
        } else {
            sync::store_release_u32(p, ci)
        }
    }
}

/// What a CQE reports: a completion, or an error CQE's syndromes.
///
/// # Errors
/// [`CqeError`] for `MLX5_CQE_REQ_ERR` / `MLX5_CQE_RESP_ERR`.
#[inline(always)]
pub fn decode(c: &Cqe64) -> Result<Completion, CqeError> {
    let op = c.opcode();
    if op == opcode::cqe::REQ_ERR || op == opcode::cqe::RESP_ERR {
        let e: &ErrCqe = c.as_err();
        return Err(CqeError {
            syndrome: e.syndrome,
            vendor_err_synd: e.vendor_err_synd,
            wqe_counter: e.wqe_counter.get(),
            qpn: c.qpn(),
        });
    }
    Ok(Completion {
        opcode: op,
        wqe_counter: c.wqe_counter.get(),
        byte_cnt: c.byte_cnt.get(),
        qpn: c.qpn(),
        imm: c.imm_inval_pkey,
    })
}
