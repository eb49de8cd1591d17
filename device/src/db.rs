//! Telling the NIC: the doorbell record (dbrec), the 8-byte doorbell, and BlueFlame.
//!
//! Order, as rdma-core's `post_send_db` and the GPU libraries do it: WQE stores → release → dbrec word 1 =
//! `htobe32(pi & 0xffff)` → release fence → the doorbell store to the UAR. The PRM lets the NIC read the ring
//! and the dbrec at any time after a doorbell (and the dbrec at any time at all), so the WQEs must be visible
//! to it before the dbrec, and both before the doorbell. rdma-core puts a barrier before the dbrec store
//! (`udma_to_device_barrier`) and another before the doorbell (`mmio_wc_start`).
//!
//! The scope of both releases follows where the queues are ([`Placement`], recorded by the host in the
//! handle): for queues in **host memory** (pinned, mapped into the GPU), system scope, as NVSHMEM IBGDA fences
//! with `__threadfence_system` for NIC buffers in host memory; for queues in **GPU memory**, GPU scope, as
//! DOCA GPUNetIO does (two `MEMBAR.ALL.GPU` per doorbell post, no system-scope fence): the NIC reads GPU
//! memory over PCIe from the GPU's L2, where a GPU-scope release has performed the stores, and the doorbell is
//! the only store that leaves the GPU. Both are `fence.release`/`st.release`, never `fence.acq_rel`: a post
//! reads nothing the NIC wrote, and the acquire half would cost an L1 invalidate.

use crate::sync;
use gdaki_shared::handle::Placement;
use gdaki_shared::prm::dbrec::{QpDbrec, SQ_COUNTER_MASK};
use gdaki_shared::prm::uar::blueflame_word1;
use gdaki_shared::prm::wqe::Seg;
use gdaki_shared::Be32;

/// Publishes WQEs up to producer index `pi` (WQEBBs) in the dbrec's SQ counter (word 1, `MLX5_SND_DBR`) with
/// a release store, which orders the WQE stores before it as a release fence would, in one instruction less:
/// `st.release.gpu.u32` for queues in GPU memory, `st.release.sys.u32` for queues in host memory (`placement`,
/// the handle's).
///
/// # Safety
/// `dbrec` must be the QP's writable, 8-byte aligned doorbell record, in memory of `placement`.
#[inline(always)]
pub unsafe fn update_dbrec(dbrec: u64, pi: u64, placement: Placement) {
    // SAFETY: the caller's contract.
    unsafe {
        if placement.is_gpu() {
            dbrec_in::<true>(dbrec, pi)
        } else {
            dbrec_in::<false>(dbrec, pi)
        }
    }
}

/// [`update_dbrec`] at the scope `GPU` names (GPU scope when set, system scope otherwise).
///
/// # Safety
/// As [`update_dbrec`], `GPU` saying where the dbrec is.
#[inline(always)]
unsafe fn dbrec_in<const GPU: bool>(dbrec: u64, pi: u64) {
    let word1 = core::mem::offset_of!(QpDbrec, snd_counter);
    let p = (dbrec as usize + word1) as *mut u32;
    let v = Be32::new(pi as u32 & SQ_COUNTER_MASK).to_bits();
    // SAFETY: the caller guarantees the dbrec; word 1 is 4-byte aligned inside it.
    unsafe {
        if GPU {
            sync::store_release_gpu_u32(p, v)
        } else {
            sync::store_release_u32(p, v)
        }
    }
}

/// The release before a doorbell or BlueFlame write: the dbrec (and the WQEs before it) are visible to the
/// NIC before the MMIO store (see the module docs for the scope).
#[inline(always)]
fn release_before_doorbell<const GPU: bool>() {
    if GPU {
        // GPU memory: GPU scope, as DOCA GPUNetIO fences before its doorbell (the NIC reads the queues from the
        // GPU's L2; the doorbell is the only store leaving the GPU).
        sync::fence_release_gpu();
    } else {
        // Host memory: system scope, as NVSHMEM IBGDA's `__threadfence_system` and rdma-core's `mmio_wc_start`
        // (the NIC reads the queues across PCIe from host memory).
        sync::fence_release_sys();
    }
}

/// Rings the doorbell: after a release fence (`fence.release.gpu` for queues in GPU memory,
/// `fence.release.sys` for queues in host memory), stores `ctrl_bits` (the first 8 bytes of the last posted
/// WQE's ctrl segment, see [`CtrlSeg::doorbell_bits`](gdaki_shared::prm::wqe::CtrlSeg::doorbell_bits), or the
/// producer index alone, [`CtrlSeg::producer_doorbell`](gdaki_shared::prm::wqe::CtrlSeg::producer_doorbell)) to
/// the doorbell register (UAR + `0x800`).
///
/// # Safety
/// `bf_reg` must be the QP's doorbell register, the dbrec must already carry the producer index, and
/// `placement` must be where the QP's queues are.
#[inline(always)]
pub unsafe fn ring_db(bf_reg: u64, ctrl_bits: u64, placement: Placement) {
    if placement.is_gpu() {
        release_before_doorbell::<true>();
    } else {
        release_before_doorbell::<false>();
    }
    // SAFETY: the caller guarantees `bf_reg` is the 8-byte aligned doorbell register.
    unsafe { sync::mmio_store_u64(bf_reg as *mut u64, ctrl_bits) };
}

/// [`update_dbrec`] then [`ring_db`], deciding the scope once: one branch on `placement` to a path with one
/// scope's fences, where the two calls would each select between both scopes.
///
/// # Safety
/// As [`update_dbrec`] and [`ring_db`].
#[inline(always)]
pub unsafe fn publish_and_ring(dbrec: u64, pi: u64, bf_reg: u64, ctrl_bits: u64, placement: Placement) {
    // SAFETY: the caller's contract.
    unsafe {
        if placement.is_gpu() {
            publish_and_ring_in::<true>(dbrec, pi, bf_reg, ctrl_bits)
        } else {
            publish_and_ring_sys(dbrec, pi, bf_reg, ctrl_bits)
        }
    }
}

/// [`publish_and_ring`] for queues in host memory, out of line: ptxas turns two short paths of one branch
/// into one path of predicated instructions (both scopes' fences and doorbells issued on every post), and a
/// call is the one arm it keeps apart. Host-memory queues pay the call; GPU-memory queues pay one branch (and
/// `#[cold]` lays the call out of their way, so that they fall through to what follows).
///
/// # Safety
/// As [`publish_and_ring`], for queues in host memory.
#[cold]
#[inline(never)]
unsafe fn publish_and_ring_sys(dbrec: u64, pi: u64, bf_reg: u64, ctrl_bits: u64) {
    // SAFETY: the caller's contract.
    unsafe { publish_and_ring_in::<false>(dbrec, pi, bf_reg, ctrl_bits) }
}

/// [`publish_and_ring`] at the scope `GPU` names.
///
/// # Safety
/// As [`publish_and_ring`].
#[inline(always)]
unsafe fn publish_and_ring_in<const GPU: bool>(dbrec: u64, pi: u64, bf_reg: u64, ctrl_bits: u64) {
    // SAFETY: the caller's contract.
    unsafe {
        dbrec_in::<GPU>(dbrec, pi);
        release_before_doorbell::<GPU>();
        sync::mmio_store_u64(bf_reg as *mut u64, ctrl_bits);
    }
}

/// [`update_dbrec`] then [`ring_bf`], deciding the scope once, as [`publish_and_ring`].
///
/// # Safety
/// As [`update_dbrec`] and [`ring_bf`].
#[inline(always)]
pub unsafe fn publish_and_ring_bf(dbrec: u64, pi: u64, bf_reg: u64, wqebb: &[Seg; 4], placement: Placement) {
    // SAFETY: the caller's contract.
    unsafe {
        if placement.is_gpu() {
            dbrec_in::<true>(dbrec, pi);
            release_before_doorbell::<true>();
            bf_words(bf_reg, wqebb);
        } else {
            publish_and_ring_bf_sys(dbrec, pi, bf_reg, *wqebb);
        }
    }
}

/// [`publish_and_ring_bf`] for queues in host memory, out of line as [`publish_and_ring_sys`] is. The WQEBB
/// goes by value, in the C ABI's parameter space (a reference would put it in the caller's stack frame).
///
/// # Safety
/// As [`publish_and_ring_bf`], for queues in host memory.
#[cold]
#[inline(never)]
#[allow(improper_ctypes_definitions)]
unsafe extern "C" fn publish_and_ring_bf_sys(dbrec: u64, pi: u64, bf_reg: u64, wqebb: [Seg; 4]) {
    // SAFETY: the caller's contract.
    unsafe {
        dbrec_in::<false>(dbrec, pi);
        release_before_doorbell::<false>();
        bf_words(bf_reg, &wqebb);
    }
}

/// Rings by BlueFlame: after the same release fence as [`ring_db`], writes the whole first WQEBB of the WQE
/// (`wqebb`, 4 segments; the ctrl segment first) to the BlueFlame register as eight 8-byte MMIO stores: words
/// 1..8 first, word 1 carrying the WQE's tag ([`blueflame_word1`]), then word 0 (the doorbell value) last.
/// Hardware takes the 64 bytes in any order; the order and the tag let a NIC that watches memory (the
/// emulated one) tell a complete write of this WQE from stale or torn words, so that it too can take the WQE
/// from the register. The WQE must also be in the ring (the NIC may fetch it from there), and must fit one
/// WQEBB.
///
/// # Safety
/// `bf_reg` must be the QP's 64-byte BlueFlame register, the dbrec must already carry the producer index, and
/// `placement` must be where the QP's queues are.
#[inline(always)]
pub unsafe fn ring_bf(bf_reg: u64, wqebb: &[Seg; 4], placement: Placement) {
    if placement.is_gpu() {
        release_before_doorbell::<true>();
    } else {
        release_before_doorbell::<false>();
    }
    // SAFETY: the caller's contract.
    unsafe { bf_words(bf_reg, wqebb) };
}

/// The eight MMIO stores of a BlueFlame write, in [`ring_bf`]'s order.
///
/// # Safety
/// As [`ring_bf`], after its release.
#[inline(always)]
unsafe fn bf_words(bf_reg: u64, wqebb: &[Seg; 4]) {
    let reg = bf_reg as *mut u64;
    let word0 = wqebb[0].0[0];
    // SAFETY: word 1 of the 64-byte register; the caller guarantees the register.
    unsafe { sync::mmio_store_u64(reg.add(1), blueflame_word1(word0, wqebb[0].0[1])) };
    for (i, s) in wqebb.iter().enumerate().skip(1) {
        // SAFETY: words 2..8 of the register.
        unsafe {
            sync::mmio_store_u64(reg.add(2 * i), s.0[0]);
            sync::mmio_store_u64(reg.add(2 * i + 1), s.0[1]);
        }
    }
    // SAFETY: word 0 of the register.
    unsafe { sync::mmio_store_u64(reg, word0) };
}
