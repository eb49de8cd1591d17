//! Polling the CQ: find the next CQE by its owner bit, read it, hand back its WQE index or its error, and
//! tell the NIC how far software consumed (CQ dbrec word 0). rdma-core's `get_sw_cqe` + `update_cons_index`.

use crate::error::CqeError;
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

/// Polls one CQE: `None` when the next entry is still owned by the NIC; otherwise consumes it (advancing
/// `cq.cons_index` and the CQ dbrec) and returns it, an error CQE becoming `Err` with its syndrome.
///
/// # Safety
/// `cq` must describe a live CQ (ring of `ncqe` 64-byte CQEs and its dbrec) that only this thread polls.
#[inline(always)]
pub unsafe fn poll(cq: &mut CqHandle) -> Option<Result<Completion, CqeError>> {
    let n = cq.cons_index;
    let slot = n & (cq.ncqe as u64 - 1);
    let cqe = (cq.buf + slot * CQE_SIZE as u64) as *const Cqe64;
    let op_own_ptr = (cqe as usize + core::mem::offset_of!(Cqe64, op_own)) as *const u8;
    // SAFETY: the entry is inside the ring; the acquire load orders the reads below after it.
    let op_own = unsafe { sync::load_acquire_u8(op_own_ptr) };
    if !is_sw_owned(op_own, n, cq.ncqe) {
        return None;
    }
    // Only bytes 32..64 carry what requester and RDMA responder completions report; four 8-byte loads
    // instead of a 64-byte copy through local memory.
    let mut words = [0u64; CQE_SIZE / 8];
    for (i, w) in words.iter_mut().enumerate().skip(4) {
        // SAFETY: the entry is software-owned now; the NIC does not rewrite it until the consumer index
        // passes it. 8-byte aligned words inside the entry.
        *w = unsafe { sync::load_volatile((cqe as *const u64).add(i)) };
    }
    let c: Cqe64 = bytemuck::cast(words);
    cq.cons_index = n + 1;
    let ci = Be32::new((n + 1) as u32 & CQ_CI_MASK).to_bits();
    // SAFETY: word 0 of the CQ dbrec (`set_ci`), 4-byte aligned; the release orders our CQE reads before the
    // NIC may reuse the entry.
    unsafe { sync::store_release_u32(cq.dbrec as *mut u32, ci) };
    let op = c.opcode();
    if op == opcode::cqe::REQ_ERR || op == opcode::cqe::RESP_ERR {
        let e: &ErrCqe = c.as_err();
        return Some(Err(CqeError {
            syndrome: e.syndrome,
            vendor_err_synd: e.vendor_err_synd,
            wqe_counter: e.wqe_counter.get(),
        }));
    }
    Some(Ok(Completion {
        opcode: op,
        wqe_counter: c.wqe_counter.get(),
        byte_cnt: c.byte_cnt.get(),
        qpn: c.qpn(),
        imm: c.imm_inval_pkey,
    }))
}
