//! Guarded host buffers: a registered middle between two guard areas, every byte (guards included) filled
//! with a pattern that depends on its position, so that any byte the NIC writes where it may not is found.

use std::marker::PhantomData;
use std::ops::{Deref, Range};
use std::sync::Arc;

use gdaki::mem::{MemKind, MemLoc};
use gdaki::nic::emu::{Access, EmuNic, Mr, Pd};

/// Guard bytes on each side of the registered middle (a multiple of 8, so the middle stays 8-byte aligned).
pub(crate) const GUARD: usize = 64;

/// The first 8-byte word of a middle (a semaphore, an atomic's result).
pub(crate) const WORD0: Range<usize> = 0..8;

/// A host buffer of `len` bytes between two [`GUARD`]-byte guards. Only the middle is ever registered. All
/// accesses go through raw pointers with volatile loads and stores, since the NIC writes it from its thread.
pub(crate) struct Guarded {
    base: *mut u64,
    words: usize,
    len: usize,
    seed: u64,
}

// SAFETY: the buffer is plain memory owned by this value; every access is a volatile load or store through
// `base`, and the NIC's concurrent writes are what the buffer exists to catch.
unsafe impl Send for Guarded {}
// SAFETY: as above: shared references only read through volatile loads.
unsafe impl Sync for Guarded {}

/// The pattern word at word index `w` of a buffer seeded with `seed` (splitmix64: cheap, and no two nearby
/// words alike, so a shifted or repeated copy is caught too).
fn pattern_word(seed: u64, w: usize) -> u64 {
    let mut z = seed.wrapping_add((w as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Guarded {
    /// A buffer whose middle holds `len` bytes (at least 1), every byte set to the pattern of `seed`.
    pub(crate) fn new(len: usize, seed: u64) -> Self {
        let words = (len.max(1) + 2 * GUARD).div_ceil(8);
        let base = Box::into_raw(vec![0u64; words].into_boxed_slice()) as *mut u64;
        let g = Self { base, words, len: len.max(1), seed };
        for w in 0..words {
            // SAFETY: `w < words`, inside the allocation; u64-aligned.
            unsafe { g.base.add(w).write_volatile(pattern_word(seed, w)) };
        }
        g
    }

    /// Address of byte 0 of the middle (8-byte aligned).
    pub(crate) fn addr(&self) -> u64 {
        self.base as u64 + GUARD as u64
    }

    /// The pattern byte at middle offset `off`: what the byte holds until someone writes it.
    pub(crate) fn pattern(&self, off: usize) -> u8 {
        let i = GUARD + off;
        pattern_word(self.seed, i / 8).to_ne_bytes()[i % 8]
    }

    /// The pattern bytes of middle offsets `r`.
    pub(crate) fn pattern_range(&self, r: Range<usize>) -> Vec<u8> {
        r.map(|o| self.pattern(o)).collect()
    }

    /// The bytes of middle offsets `r` as they are now.
    pub(crate) fn bytes(&self, r: Range<usize>) -> Vec<u8> {
        assert!(r.end <= self.len, "range {r:?} outside a buffer of {} bytes", self.len);
        // SAFETY: `GUARD + o < GUARD + len`, inside the allocation; byte loads need no alignment.
        r.map(|o| unsafe { (self.base as *const u8).add(GUARD + o).read_volatile() }).collect()
    }

    /// The 8-byte word at middle offset `off` (8-aligned) as a host-order `u64`.
    pub(crate) fn u64_at(&self, off: usize) -> u64 {
        assert!(off.is_multiple_of(8) && off + 8 <= self.len);
        // SAFETY: inside the allocation and 8-aligned (the middle starts at an 8-aligned offset).
        unsafe { (self.addr() as *const u64).add(off / 8).read_volatile() }
    }

    /// Stores `v` (host order) into the 8-byte word at middle offset `off` (8-aligned).
    pub(crate) fn write_u64(&self, off: usize, v: u64) {
        assert!(off.is_multiple_of(8) && off + 8 <= self.len);
        // SAFETY: inside the allocation and 8-aligned (the middle starts at an 8-aligned offset).
        unsafe { (self.addr() as *mut u64).add(off / 8).write_volatile(v) }
    }

    /// A pointer to the 8-byte word at middle offset `off` (8-aligned), for device code that waits on it.
    pub(crate) fn word_ptr(&self, off: usize) -> *const u64 {
        assert!(off.is_multiple_of(8) && off + 8 <= self.len);
        (self.addr() + off as u64) as *const u64
    }

    /// Bytes of the whole allocation (guards included) that no longer hold their pattern, not counting middle
    /// offsets inside `allowed` (what the operation under test was permitted to write).
    pub(crate) fn changed_outside(&self, allowed: &[Range<usize>]) -> u64 {
        let mut changed = 0;
        for w in 0..self.words {
            // SAFETY: `w < words`, inside the allocation; u64-aligned.
            let now = unsafe { self.base.add(w).read_volatile() };
            let diff = now ^ pattern_word(self.seed, w);
            if diff == 0 {
                continue;
            }
            for (b, d) in diff.to_ne_bytes().iter().enumerate() {
                let i = w * 8 + b;
                let permitted = i >= GUARD && allowed.iter().any(|r| r.contains(&(i - GUARD)));
                if *d != 0 && !permitted {
                    changed += 1;
                }
            }
        }
        changed
    }

    /// Registers the middle with `nic` in `pd` with `access`. The registration cannot outlive the buffer.
    pub(crate) fn register<'a>(&'a self, nic: &Arc<EmuNic>, pd: &Pd, access: Access) -> gdaki::Result<Reg<'a>> {
        let loc = MemLoc { kind: MemKind::Host, addr: self.addr() };
        // SAFETY: the middle is `len` bytes of this allocation, which stays allocated and in place for `'a`;
        // the returned `Reg` borrows `self` for `'a`, so the MR is dropped (deregistered) before the buffer.
        let mr = unsafe { nic.reg_mr(pd, loc, self.len as u64, access) }?;
        Ok(Reg { mr, _buf: PhantomData })
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        // SAFETY: `base` came from `Box::into_raw` of a `[u64]` of `words` elements and is freed once; every
        // MR of it (`Reg`) borrowed it and is gone.
        unsafe { drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.base, self.words))) }
    }
}

/// A registered [`Guarded`] middle: the [`Mr`], tied to the buffer's lifetime.
pub(crate) struct Reg<'a> {
    mr: Mr,
    _buf: PhantomData<&'a Guarded>,
}

impl Deref for Reg<'_> {
    type Target = Mr;
    fn deref(&self) -> &Mr {
        &self.mr
    }
}
