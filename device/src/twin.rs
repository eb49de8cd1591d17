//! The host twins of [`crate::sync`]'s and [`crate::scope`]'s PTX: every ordered access device code makes, as
//! the `cpu` executor runs it. One set of functions on raw addresses, with two backends:
//!
//! - normally `core::sync::atomic` on the address itself (`AtomicU64::from_ptr`), which pairs with the emulated
//!   NIC's and the proxy's own atomics;
//! - under `--cfg loom`, a model-checking backend: each registered 8-byte word becomes a `loom` atomic
//!   (holding the memory's bytes at registration; stores are written through so the memory stays readable; a
//!   4-byte word is a half of its 8-byte word, updated by read-modify-write), spins yield to loom's scheduler
//!   and the clock counts calls, so that `loom::model` explores the interleavings of the real device code
//!   (shared-QP posting and polling, the proxy FIFO) on its host twins. Plain (volatile) accesses are
//!   modelled as relaxed atomics: the model checks the protocols' logic, not data races of plain memory.
//!
//! Not for device code to call directly: it goes through `sync` and `scope`, which pick PTX on nvptx.

use core::sync::atomic::Ordering;

pub(crate) use backend::*;

#[cfg(not(loom))]
mod backend {
    use core::sync::atomic::{fence as core_fence, AtomicU32, AtomicU64, Ordering};

    /// # Safety
    /// `p` valid for reads and 8-byte aligned.
    #[inline(always)]
    pub(crate) unsafe fn load_u64(p: *const u64, o: Ordering) -> u64 {
        // SAFETY: the caller's contract.
        unsafe { AtomicU64::from_ptr(p as *mut u64) }.load(o)
    }

    /// # Safety
    /// `p` valid for writes and 8-byte aligned.
    #[inline(always)]
    pub(crate) unsafe fn store_u64(p: *mut u64, v: u64, o: Ordering) {
        // SAFETY: the caller's contract.
        unsafe { AtomicU64::from_ptr(p) }.store(v, o)
    }

    /// # Safety
    /// `p` valid for writes and 4-byte aligned.
    #[inline(always)]
    pub(crate) unsafe fn store_u32(p: *mut u32, v: u32, o: Ordering) {
        // SAFETY: the caller's contract.
        unsafe { AtomicU32::from_ptr(p) }.store(v, o)
    }

    /// # Safety
    /// As [`store_u64`].
    #[inline(always)]
    pub(crate) unsafe fn fetch_add_u64(p: *mut u64, v: u64, o: Ordering) -> u64 {
        // SAFETY: the caller's contract.
        unsafe { AtomicU64::from_ptr(p) }.fetch_add(v, o)
    }

    /// Compare-and-swap `cur` → `new`; whether it swapped.
    ///
    /// # Safety
    /// As [`store_u32`].
    #[inline(always)]
    pub(crate) unsafe fn cas_u32(p: *mut u32, cur: u32, new: u32, o: Ordering) -> bool {
        // SAFETY: the caller's contract.
        unsafe { AtomicU32::from_ptr(p) }.compare_exchange(cur, new, o, Ordering::Relaxed).is_ok()
    }

    /// Compare-and-swap `cur` → `new` on a `u64`; the value found (`cur` when it swapped).
    ///
    /// # Safety
    /// As [`store_u64`].
    #[inline(always)]
    pub(crate) unsafe fn cas_u64(p: *mut u64, cur: u64, new: u64, o: Ordering) -> u64 {
        // SAFETY: the caller's contract.
        unsafe { AtomicU64::from_ptr(p) }.compare_exchange(cur, new, o, Ordering::Relaxed).unwrap_or_else(|v| v)
    }

    #[inline(always)]
    pub(crate) fn fence(o: Ordering) {
        core_fence(o)
    }

    /// A plain load the caller has ordered (after an acquire): volatile, never cached in a register.
    ///
    /// # Safety
    /// `p` valid for reads and aligned.
    #[inline(always)]
    pub(crate) unsafe fn load_plain<T: Copy>(p: *const T) -> T {
        // SAFETY: the caller's contract.
        unsafe { core::ptr::read_volatile(p) }
    }

    /// A plain store the caller orders (before a release): volatile, never merged away.
    ///
    /// # Safety
    /// `p` valid for writes and aligned.
    #[inline(always)]
    pub(crate) unsafe fn store_plain<T: Copy>(p: *mut T, v: T) {
        // SAFETY: the caller's contract.
        unsafe { core::ptr::write_volatile(p, v) }
    }

    /// Nanoseconds since the first call in this process.
    #[inline(always)]
    pub(crate) fn now_ns() -> u64 {
        static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        EPOCH.get_or_init(std::time::Instant::now).elapsed().as_nanos() as u64
    }

    /// A spin hint, then `yield_now` after 64 spins: the emulated NIC's thread may share the core (2-core
    /// machines).
    #[inline(always)]
    pub(crate) fn spin(spins: u32) {
        if spins < 64 {
            core::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

#[cfg(loom)]
mod backend {
    use core::sync::atomic::Ordering;
    use loom::sync::atomic::AtomicU64;
    use std::cell::RefCell;
    use std::collections::HashMap;
    use std::sync::Arc;

    std::thread_local! {
        /// The model's atomics, one per registered 8-byte word, by address. Per OS thread: loom runs a
        /// model's threads as coroutines on the thread of the test that calls `loom::model`, so tests that
        /// run at once keep apart.
        static CELLS: RefCell<HashMap<usize, Arc<AtomicU64>>> = RefCell::new(HashMap::new());
    }

    fn with_cells<T>(f: impl FnOnce(&mut HashMap<usize, Arc<AtomicU64>>) -> T) -> T {
        CELLS.with(|c| f(&mut c.borrow_mut()))
    }

    /// Forgets every word: call at the start and end of each `loom::model` iteration (the atomics belong
    /// to one execution).
    pub fn reset() {
        with_cells(|c| c.clear());
    }

    /// Makes the 8-byte words of `[addr, addr + len)` model atomics holding the memory's current bytes.
    /// Register what the model's threads share before spawning them, so that every thread sees the words'
    /// creation (loom reports a first touch from one thread racing with another's access).
    ///
    /// # Safety
    /// The range must be readable, and `addr` and `len` multiples of 8.
    pub unsafe fn register(addr: *const u8, len: usize) {
        assert!((addr as usize).is_multiple_of(8) && len.is_multiple_of(8), "loom model: register whole 8-byte words");
        with_cells(|c| {
            for off in (0..len).step_by(8) {
                // SAFETY: the caller's contract.
                let v = unsafe { (addr.add(off) as *const u64).read_volatile() };
                c.insert(addr as usize + off, Arc::new(AtomicU64::new(v)));
            }
        });
    }

    fn cell(p: usize) -> Arc<AtomicU64> {
        with_cells(|c| c.get(&(p & !7)).cloned())
            .unwrap_or_else(|| panic!("loom model: {p:#x} was not registered (gdaki_device::loom_register)"))
    }

    /// The u32 at `p` as (its 8-byte word, shift of its half).
    fn half(p: *const u32) -> (Arc<AtomicU64>, u32) {
        // Little-endian host: the lower address is the low half.
        (cell(p as usize), if (p as usize).is_multiple_of(8) { 0 } else { 32 })
    }

    /// # Safety
    /// As the core backend's.
    pub(crate) unsafe fn load_u64(p: *const u64, o: Ordering) -> u64 {
        cell(p as usize).load(o)
    }

    /// # Safety
    /// As the core backend's.
    pub(crate) unsafe fn store_u64(p: *mut u64, v: u64, o: Ordering) {
        cell(p as usize).store(v, o);
        // SAFETY: the caller's contract; written through so that the memory stays readable.
        unsafe { p.write_volatile(v) };
    }

    /// Replaces the u32 at `p` with `f(old)` (a read-modify-write of its word, as the other half must keep
    /// its value) unless `f` declines; returns the old u32.
    fn update_u32(p: *mut u32, o: Ordering, f: impl Fn(u32) -> Option<u32>) -> Result<u32, u32> {
        let (c, sh) = half(p);
        let r = c.fetch_update(o, Ordering::Relaxed, |w| {
            let old = (w >> sh) as u32;
            f(old).map(|new| (w & !(0xffff_ffffu64 << sh)) | (new as u64) << sh)
        });
        if let Ok(w) = r {
            let v = f((w >> sh) as u32).expect("accepted once");
            // SAFETY: the callers' contracts; written through.
            unsafe { p.write_volatile(v) };
        }
        r.map(|w| (w >> sh) as u32).map_err(|w| (w >> sh) as u32)
    }

    /// # Safety
    /// As the core backend's.
    pub(crate) unsafe fn store_u32(p: *mut u32, v: u32, o: Ordering) {
        let _ = update_u32(p, o, |_| Some(v));
    }

    /// # Safety
    /// As the core backend's.
    pub(crate) unsafe fn fetch_add_u64(p: *mut u64, v: u64, o: Ordering) -> u64 {
        let old = cell(p as usize).fetch_add(v, o);
        // SAFETY: as in `store_u64`.
        unsafe { p.write_volatile(old.wrapping_add(v)) };
        old
    }

    /// # Safety
    /// As the core backend's.
    pub(crate) unsafe fn cas_u32(p: *mut u32, cur: u32, new: u32, o: Ordering) -> bool {
        update_u32(p, o, |old| (old == cur).then_some(new)).is_ok()
    }

    /// # Safety
    /// As the core backend's.
    pub(crate) unsafe fn cas_u64(p: *mut u64, cur: u64, new: u64, o: Ordering) -> u64 {
        let r = cell(p as usize).compare_exchange(cur, new, o, Ordering::Relaxed);
        if r.is_ok() {
            // SAFETY: as in `store_u64`.
            unsafe { p.write_volatile(new) };
        }
        r.unwrap_or_else(|v| v)
    }

    pub(crate) fn fence(o: Ordering) {
        loom::sync::atomic::fence(o)
    }

    /// # Safety
    /// As the core backend's; `T` is 4 or 8 bytes (every plain access of device code is).
    pub(crate) unsafe fn load_plain<T: Copy>(p: *const T) -> T {
        // SAFETY: the size picks the word; the bits are `T`'s.
        unsafe {
            match size_of::<T>() {
                8 => core::mem::transmute_copy(&load_u64(p as *const u64, Ordering::Relaxed)),
                4 => {
                    let (c, sh) = half(p as *const u32);
                    core::mem::transmute_copy(&((c.load(Ordering::Relaxed) >> sh) as u32))
                }
                n => panic!("loom model: plain load of {n} bytes"),
            }
        }
    }

    /// # Safety
    /// As [`load_plain`].
    pub(crate) unsafe fn store_plain<T: Copy>(p: *mut T, v: T) {
        // SAFETY: as in `load_plain`.
        unsafe {
            match size_of::<T>() {
                8 => store_u64(p as *mut u64, core::mem::transmute_copy(&v), Ordering::Relaxed),
                4 => store_u32(p as *mut u32, core::mem::transmute_copy(&v), Ordering::Relaxed),
                n => panic!("loom model: plain store of {n} bytes"),
            }
        }
    }

    std::thread_local! {
        static TICKS: core::cell::Cell<u64> = const { core::cell::Cell::new(0) };
    }

    /// A clock that advances 1 µs per call (one clock per model, see `CELLS`): deterministic, so that a
    /// bounded wait ends after a fixed number of tries in every interleaving.
    pub(crate) fn now_ns() -> u64 {
        TICKS.with(|t| {
            t.set(t.get() + 1000);
            t.get()
        })
    }

    /// Lets loom run another thread: a spinning thread makes no progress by itself.
    pub(crate) fn spin(_spins: u32) {
        loom::thread::yield_now();
    }
}

/// Stores the two 8-byte words of a 16-byte value, each whole, in order.
///
/// # Safety
/// `p` valid for writes and 16-byte aligned.
#[inline(always)]
pub(crate) unsafe fn store_pair(p: *mut [u64; 2], v: [u64; 2], o: Ordering) {
    let w = p as *mut u64;
    // SAFETY: the caller's contract: both words are 8-byte aligned inside `p`.
    unsafe {
        store_u64(w, v[0], o);
        store_u64(w.add(1), v[1], o);
    }
}
