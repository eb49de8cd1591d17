//! Memory-ordering primitives and MMIO stores, one implementation per executor.
//!
//! On nvptx every ordered access is inline PTX: `core::sync::atomic` read-modify-writes lose their ordering
//! there (docs/guide.md, "Toolchain"). The NIC is a system-scope observer of host memory, so what it reads
//! there is ordered at `.sys` scope; what it reads from GPU memory (queues placed there) is ordered at `.gpu`
//! scope, as the hardware stacks do (see `db`). Release fences are `fence.release` (PTX 8.6), not
//! `fence.acq_rel`: a post needs no acquire, and the acquire half costs an L1 invalidate (`CCTL.IVALL`) on
//! sm_90. On the host the same functions map to `core::sync::atomic`, whose Acquire/Release pair with the
//! emulated NIC's thread.
//!
//! All pointers are generic addresses of naturally aligned values in memory the NIC may read or write (pinned
//! host memory mapped into the GPU, GPU memory, or plain host memory for the `cpu` executor).

use gdaki_shared::prm::wqe::Seg;

#[cfg(not(target_arch = "nvptx64"))]
use crate::twin;
#[cfg(not(target_arch = "nvptx64"))]
use core::sync::atomic::Ordering;

/// Release fence at system scope: every memory access before it is performed for every observer (the NIC
/// reading host memory, host threads) before any store after it. nvptx: `fence.release.sys` (`MEMBAR.ALL.SYS`
/// on sm_90, no L1 invalidate); host: `fence(Release)`.
#[inline(always)]
pub fn fence_release_sys() {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: a fence has no operands and no memory effects besides ordering.
    unsafe {
        core::arch::asm!("fence.release.sys;", options(nostack))
    };
    #[cfg(not(target_arch = "nvptx64"))]
    twin::fence(Ordering::Release);
}

/// Release fence at GPU scope: every memory access before it is performed in the GPU's memory (its L2, where
/// a NIC's PCIe reads of GPU memory are served) before any store after it, the MMIO doorbell included.
/// nvptx: `fence.release.gpu` (`MEMBAR.ALL.GPU`); host: `fence(Release)`.
#[inline(always)]
pub fn fence_release_gpu() {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: a fence has no operands and no memory effects besides ordering.
    unsafe {
        core::arch::asm!("fence.release.gpu;", options(nostack))
    };
    #[cfg(not(target_arch = "nvptx64"))]
    twin::fence(Ordering::Release);
}

/// Loads a `u64` that the NIC or a peer writes (a semaphore), with acquire semantics at system scope
/// (`ld.acquire.sys.u64`).
///
/// # Safety
/// `p` must be valid for reads and 8-byte aligned.
#[inline(always)]
pub unsafe fn load_acquire_u64(p: *const u64) -> u64 {
    #[cfg(target_arch = "nvptx64")]
    {
        let v: u64;
        // SAFETY: the caller guarantees `p` is readable and aligned; the load does not write memory.
        unsafe {
            core::arch::asm!("ld.acquire.sys.u64 {v}, [{p}];", v = out(reg64) v, p = in(reg64) p, options(nostack))
        };
        v
    }
    #[cfg(not(target_arch = "nvptx64"))]
    // SAFETY: the caller guarantees `p` is valid and 8-byte aligned.
    unsafe {
        twin::load_u64(p, Ordering::Acquire)
    }
}

/// Loads a value the NIC wrote, after an acquire has ordered it (a volatile load: never cached in a register
/// or a stale L1 line).
///
/// # Safety
/// `p` must be valid for reads and aligned.
#[inline(always)]
pub unsafe fn load_volatile<T: Copy>(p: *const T) -> T {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: the caller guarantees validity and alignment.
    unsafe {
        core::ptr::read_volatile(p)
    }
    #[cfg(not(target_arch = "nvptx64"))]
    // SAFETY: the caller guarantees validity and alignment.
    unsafe {
        twin::load_plain(p)
    }
}

/// Loads a word that other threads write only under a lock the caller holds: a plain (weak) load on nvptx,
/// `ld.global` (the lock's acquire ordered the last holder's store before it and invalidated L1), where
/// [`load_volatile`] would be a system-scope load, as for memory the NIC writes. Host: the twin's plain load.
///
/// # Safety
/// `p` must be valid for reads and aligned, and written only under the lock the caller holds.
#[inline(always)]
pub unsafe fn load_locked<T: Copy>(p: *const T) -> T {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: the caller guarantees validity and alignment; no store races this load (the lock).
    unsafe {
        core::ptr::read(p)
    }
    #[cfg(not(target_arch = "nvptx64"))]
    // SAFETY: the caller guarantees validity and alignment.
    unsafe {
        twin::load_plain(p)
    }
}

/// Stores a `u32` with release semantics at system scope (`st.release.sys.u32`): a dbrec in host memory.
///
/// # Safety
/// `p` must be valid for writes and 4-byte aligned.
#[inline(always)]
pub unsafe fn store_release_u32(p: *mut u32, v: u32) {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: the caller guarantees `p` is writable and aligned.
    unsafe {
        core::arch::asm!("st.release.sys.u32 [{p}], {v};", p = in(reg64) p, v = in(reg32) v, options(nostack))
    };
    #[cfg(not(target_arch = "nvptx64"))]
    // SAFETY: the caller guarantees `p` is valid and 4-byte aligned.
    unsafe {
        twin::store_u32(p, v, Ordering::Release)
    };
}

/// Stores a `u32` with release semantics at GPU scope (`st.release.gpu.u32`): a dbrec in GPU memory.
///
/// # Safety
/// `p` must be valid for writes and 4-byte aligned.
#[inline(always)]
pub unsafe fn store_release_gpu_u32(p: *mut u32, v: u32) {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: the caller guarantees `p` is writable and aligned.
    unsafe {
        core::arch::asm!("st.release.gpu.u32 [{p}], {v};", p = in(reg64) p, v = in(reg32) v, options(nostack))
    };
    #[cfg(not(target_arch = "nvptx64"))]
    // SAFETY: the caller guarantees `p` is valid and 4-byte aligned.
    unsafe {
        twin::store_u32(p, v, Ordering::Release)
    };
}

/// Stores a `u64` with release semantics at system scope (`st.release.sys.u64`): every store before it is
/// visible to a host thread (or the NIC) that sees this one.
///
/// # Safety
/// `p` must be valid for writes and 8-byte aligned.
#[inline(always)]
pub unsafe fn store_release_u64(p: *mut u64, v: u64) {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: the caller guarantees `p` is writable and aligned.
    unsafe {
        core::arch::asm!("st.release.sys.u64 [{p}], {v};", p = in(reg64) p, v = in(reg64) v, options(nostack))
    };
    #[cfg(not(target_arch = "nvptx64"))]
    // SAFETY: the caller guarantees `p` is valid and 8-byte aligned.
    unsafe {
        twin::store_u64(p, v, Ordering::Release)
    };
}

/// Stores a value that other threads read after an acquire that this store is ordered before (a volatile
/// store: never kept in a register or merged away).
///
/// # Safety
/// `p` must be valid for writes and aligned.
#[inline(always)]
pub unsafe fn store_volatile<T: Copy>(p: *mut T, v: T) {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: the caller guarantees validity and alignment.
    unsafe {
        core::ptr::write_volatile(p, v)
    }
    #[cfg(not(target_arch = "nvptx64"))]
    // SAFETY: the caller guarantees validity and alignment.
    unsafe {
        twin::store_plain(p, v)
    }
}

/// Stores 8 bytes to a UAR register: the doorbell, or one word of a BlueFlame write.
/// nvptx: `st.mmio.relaxed.sys.global.u64` (PTX 8.2; ordered by the caller's release fence, never merged or
/// elided); host: a release store the emulated NIC observes.
///
/// # Safety
/// `p` must be a valid, 8-byte aligned address in a UAR page. On nvptx it is used as a `.global` address: a
/// generic address of global memory (device memory or host memory mapped into the GPU) is one, because the
/// generic window maps global addresses unchanged on every GPU the PTX targets.
#[inline(always)]
pub unsafe fn mmio_store_u64(p: *mut u64, v: u64) {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: the caller guarantees `p` is a writable, aligned UAR address.
    unsafe {
        core::arch::asm!("st.mmio.relaxed.sys.global.u64 [{p}], {v};", p = in(reg64) p, v = in(reg64) v, options(nostack))
    };
    #[cfg(not(target_arch = "nvptx64"))]
    // SAFETY: the caller guarantees `p` is valid and 8-byte aligned.
    unsafe {
        twin::store_u64(p, v, Ordering::Release)
    };
}

/// Stores one 16-byte WQE segment into the SQ ring (`st.v2.u64` on nvptx). Unordered: the dbrec's release
/// (at the queues' scope, `db::publish_and_ring`) publishes it.
///
/// # Safety
/// `p` must be valid for writes and 16-byte aligned.
#[inline(always)]
pub unsafe fn store_seg(p: *mut Seg, s: Seg) {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: the caller guarantees `p` is writable and 16-byte aligned.
    unsafe {
        core::arch::asm!("st.v2.u64 [{p}], {{{a}, {b}}};", p = in(reg64) p, a = in(reg64) s.0[0], b = in(reg64) s.0[1], options(nostack))
    };
    #[cfg(not(target_arch = "nvptx64"))]
    // SAFETY: the caller guarantees `p` is valid and 16-byte aligned.
    unsafe {
        twin::store_pair(p as *mut [u64; 2], s.0, Ordering::Relaxed)
    };
}

/// Loads an 8-byte word that the NIC or another thread may be writing at this moment (an LL packet word: data
/// next to its flag; the proxy FIFO's `head`), whole and from memory every time. nvptx: `ld.volatile.u64` (never a stale L1 line, as MSCCL++'s
/// packet reads); host: a relaxed atomic load, since the emulated NIC stores aligned words atomically.
///
/// # Safety
/// `p` must be valid for reads and 8-byte aligned.
#[inline(always)]
pub unsafe fn load_word_u64(p: *const u64) -> u64 {
    #[cfg(target_arch = "nvptx64")]
    {
        let v: u64;
        // SAFETY: the caller guarantees `p` is readable and aligned; the load does not write memory.
        unsafe { core::arch::asm!("ld.volatile.u64 {v}, [{p}];", v = out(reg64) v, p = in(reg64) p, options(nostack)) };
        v
    }
    #[cfg(not(target_arch = "nvptx64"))]
    // SAFETY: the caller guarantees `p` is valid and 8-byte aligned.
    unsafe {
        twin::load_u64(p, Ordering::Relaxed)
    }
}

/// Loads two 8-byte words as [`load_word_u64`] does, with one 16-byte vector load on nvptx
/// (`ld.volatile.v2.u64`); each word is whole, the pair need not be.
///
/// # Safety
/// `p` must be valid for reads and 16-byte aligned.
#[inline(always)]
pub unsafe fn load_words_v2_u64(p: *const [u64; 2]) -> [u64; 2] {
    #[cfg(target_arch = "nvptx64")]
    {
        let (a, b): (u64, u64);
        // SAFETY: the caller guarantees `p` is readable and 16-byte aligned; the load does not write memory.
        unsafe {
            core::arch::asm!("ld.volatile.v2.u64 {{{a}, {b}}}, [{p}];", a = out(reg64) a, b = out(reg64) b, p = in(reg64) p, options(nostack))
        };
        [a, b]
    }
    #[cfg(not(target_arch = "nvptx64"))]
    // SAFETY: the caller guarantees `p` is valid and 16-byte aligned, so both words are 8-byte aligned.
    unsafe {
        let w = p as *const u64;
        [load_word_u64(w), load_word_u64(w.add(1))]
    }
}

/// Stores an 8-byte word whole (an LL packet word), for the NIC to read after a later release fence.
/// nvptx: `st.volatile.u64`; host: a relaxed atomic store.
///
/// # Safety
/// `p` must be valid for writes and 8-byte aligned.
#[inline(always)]
pub unsafe fn store_word_u64(p: *mut u64, v: u64) {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: the caller guarantees `p` is writable and aligned.
    unsafe {
        core::arch::asm!("st.volatile.u64 [{p}], {v};", p = in(reg64) p, v = in(reg64) v, options(nostack))
    };
    #[cfg(not(target_arch = "nvptx64"))]
    // SAFETY: the caller guarantees `p` is valid and 8-byte aligned.
    unsafe {
        twin::store_u64(p, v, Ordering::Relaxed)
    };
}

/// Stores two 8-byte words as [`store_word_u64`] does, with one 16-byte vector store on nvptx
/// (`st.volatile.v2.u64`).
///
/// # Safety
/// `p` must be valid for writes and 16-byte aligned.
#[inline(always)]
pub unsafe fn store_words_v2_u64(p: *mut [u64; 2], v: [u64; 2]) {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: the caller guarantees `p` is writable and 16-byte aligned.
    unsafe {
        core::arch::asm!("st.volatile.v2.u64 [{p}], {{{a}, {b}}};", p = in(reg64) p, a = in(reg64) v[0], b = in(reg64) v[1], options(nostack))
    };
    #[cfg(not(target_arch = "nvptx64"))]
    // SAFETY: the caller guarantees `p` is valid and 16-byte aligned, so both words are 8-byte aligned.
    unsafe {
        let w = p as *mut u64;
        store_word_u64(w, v[0]);
        store_word_u64(w.add(1), v[1]);
    }
}

/// The CTA barrier (`__syncthreads`) in its non-aligned form, `barrier.sync 0` (PTX ISA 6.0, sm_70+): the
/// threads of a warp may reach it diverged, at different instructions (one lane posting while the others
/// wait), which `bar.sync` (= `barrier.sync.aligned`) forbids and compute-sanitizer's synccheck reports.
/// Also a memory barrier among the CTA's threads. nvptx only: host teams synchronize with `std::sync::Barrier`.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub fn cta_barrier() {
    // SAFETY: a barrier has no operands; every thread of the CTA reaches it (the callers' protocol).
    unsafe { core::arch::asm!("barrier.sync 0;", options(nostack)) };
}

/// [`cta_barrier`] that also ORs a flag over the CTA (`__syncthreads_or`): `barrier.red.or.pred`, non-aligned
/// like it. nvptx only.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub fn cta_barrier_or(flag: bool) -> bool {
    let any: u32;
    // SAFETY: a reduction barrier on registers; every thread of the CTA reaches it (the callers' protocol).
    unsafe {
        core::arch::asm!(
            "{{ .reg .pred %f, %r; setp.ne.u32 %f, {flag}, 0; barrier.red.or.pred %r, 0, %f; selp.u32 {any}, 1, 0, %r; }}",
            flag = in(reg32) flag as u32,
            any = out(reg32) any,
            options(nostack)
        )
    };
    any != 0
}

/// [`cta_barrier`] that also counts the CTA's threads that passed `true` (`__syncthreads_count`):
/// `barrier.red.popc.u32`, non-aligned like it. nvptx only.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub fn cta_barrier_count(flag: bool) -> u32 {
    let n: u32;
    // SAFETY: a reduction barrier on registers; every thread of the CTA reaches it (the callers' protocol).
    unsafe {
        core::arch::asm!(
            "{{ .reg .pred %f; setp.ne.u32 %f, {flag}, 0; barrier.red.popc.u32 {n}, 0, %f; }}",
            flag = in(reg32) flag as u32,
            n = out(reg32) n,
            options(nostack)
        )
    };
    n
}

// The words of `cta_barrier_broadcast`: 32 bytes of each CTA's shared memory, declared once for the PTX module.
// A declaration inside the function's inline assembly would be one variable per copy of that assembly, and
// the compiler may copy it (into the leader's branch and the others', say), leaving the members reading words
// the leader never wrote.
#[cfg(target_arch = "nvptx64")]
core::arch::global_asm!(".shared .align 16 .b64 gdaki_cta_words[4];");

/// [`cta_barrier`] that hands four words from the thread that passes `from = true` to every thread of the CTA
/// (a `__shared__` array written before `__syncthreads` and read after it, as DOCA GPUNetIO's CTA-scope post
/// hands its leader's WQE index to the block): the sender stores them to the CTA's shared memory, a barrier,
/// every thread loads them, and a second barrier keeps the next call's store from overwriting them before every
/// thread has read them. Exactly one thread of the CTA passes `true` (with none, every thread reads what the
/// last call left, zeros at first). Non-aligned barriers, as [`cta_barrier`]. nvptx only.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub fn cta_barrier_broadcast(from: bool, words: [u64; 4]) -> [u64; 4] {
    let (a, b, c, d): (u64, u64, u64, u64);
    // SAFETY: shared-memory accesses to the module's own `gdaki_cta_words` (32 bytes, 16-byte aligned) and two
    // barriers that every thread of the CTA reaches (the callers' protocol).
    unsafe {
        core::arch::asm!(
            "{{ .reg .pred %f; setp.ne.u32 %f, {from}, 0;",
            "@%f st.shared.v2.u64 [gdaki_cta_words], {{{a}, {b}}};",
            "@%f st.shared.v2.u64 [gdaki_cta_words+16], {{{c}, {d}}};",
            "barrier.sync 0;",
            "ld.shared.v2.u64 {{{a}, {b}}}, [gdaki_cta_words];",
            "ld.shared.v2.u64 {{{c}, {d}}}, [gdaki_cta_words+16];",
            "barrier.sync 0; }}",
            from = in(reg32) from as u32,
            a = inout(reg64) words[0] => a,
            b = inout(reg64) words[1] => b,
            c = inout(reg64) words[2] => c,
            d = inout(reg64) words[3] => d,
            options(nostack)
        )
    };
    [a, b, c, d]
}

/// Nanoseconds from an arbitrary epoch: `%globaltimer` on nvptx, a process-wide monotonic clock on the host.
#[inline(always)]
pub fn clock_ns() -> u64 {
    #[cfg(target_arch = "nvptx64")]
    {
        let t: u64;
        // SAFETY: reading a special register has no memory effects.
        unsafe { core::arch::asm!("mov.u64 {t}, %globaltimer;", t = out(reg64) t, options(nostack, nomem)) };
        t
    }
    #[cfg(not(target_arch = "nvptx64"))]
    twin::now_ns()
}

/// Pauses this thread for about `ns` nanoseconds, leaving the SM's issue slots and its memory requests to
/// others: for a wait that knows it has far to go (a shared poster with many turns ahead of its own) and
/// would otherwise poll a contended word. nvptx: `nanosleep`, which the PTX ISA lets last anywhere in
/// `[0, 2 * ns]`. Host: one spin hint (a host thread's longer pauses are [`backoff`]'s yields).
#[inline(always)]
pub fn pause_ns(ns: u32) {
    #[cfg(target_arch = "nvptx64")]
    // SAFETY: `nanosleep` only delays this thread.
    unsafe {
        core::arch::asm!("nanosleep.u32 {ns};", ns = in(reg32) ns, options(nostack, nomem))
    };
    #[cfg(not(target_arch = "nvptx64"))]
    {
        let _ = ns;
        core::hint::spin_loop();
    }
}

/// Backs off inside a polling loop; `spins` is how often this wait has spun already.
/// nvptx: `nanosleep` growing to 1 µs, so a waiting thread leaves the SM's issue slots to others. Host: a
/// spin hint, then `yield_now` after 64 spins, because the emulated NIC thread may share the core (docs/guide.md,
/// "GPU hazards": 2-core machines).
#[inline(always)]
pub fn backoff(spins: u32) {
    #[cfg(target_arch = "nvptx64")]
    if spins > 16 {
        let ns: u32 = if spins > 256 { 1000 } else { 100 };
        // SAFETY: `nanosleep` only delays this thread.
        unsafe { core::arch::asm!("nanosleep.u32 {ns};", ns = in(reg32) ns, options(nostack, nomem)) };
    }
    #[cfg(not(target_arch = "nvptx64"))]
    twin::spin(spins);
}
