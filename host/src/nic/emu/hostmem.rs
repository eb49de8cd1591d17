//! Reads, writes and atomics on registered host memory, as the emulated NIC's "DMA engine".
//!
//! Device code (host threads for the `cpu` executor) may read or spin on the same bytes while the NIC writes
//! them, so every access is atomic: the aligned middle of a range moves as relaxed 8-byte words, the unaligned
//! head and tail as relaxed bytes. Rust then sees no data race, and a reader never sees a torn aligned word.
//! Ordering towards readers comes from the Release store of the CQE (or of the atomic that signals).

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering::Relaxed};

/// Bytes copied through the stack buffer at a time by [`copy`] when source and destination are not aligned
/// alike.
const CHUNK: usize = 4096;

/// Copies shorter than this go through a buffer of this size: zeroing a 4 KiB buffer for an 8-byte payload
/// cost more than the copy.
const SMALL: usize = 256;

/// Reads `out.len()` bytes starting at host address `src`.
///
/// # Safety
/// `src..src + out.len()` must be valid for reads (a registered host MR range).
pub(crate) unsafe fn read(src: u64, out: &mut [u8]) {
    let mut i = 0;
    let n = out.len();
    while i < n && !(src as usize + i).is_multiple_of(8) {
        // SAFETY: inside the caller's valid range; any address is aligned for a byte.
        out[i] = unsafe { AtomicU8::from_ptr((src as usize + i) as *mut u8) }.load(Relaxed);
        i += 1;
    }
    while i + 8 <= n {
        // SAFETY: `src + i` is 8-aligned here and the 8 bytes are inside the caller's valid range.
        let w = unsafe { AtomicU64::from_ptr((src as usize + i) as *mut u64) }.load(Relaxed);
        out[i..i + 8].copy_from_slice(&w.to_ne_bytes());
        i += 8;
    }
    while i < n {
        // SAFETY: as for the head bytes.
        out[i] = unsafe { AtomicU8::from_ptr((src as usize + i) as *mut u8) }.load(Relaxed);
        i += 1;
    }
}

/// Writes `data` to host address `dst`.
///
/// # Safety
/// `dst..dst + data.len()` must be valid for writes (a registered host MR range).
pub(crate) unsafe fn write(dst: u64, data: &[u8]) {
    let mut i = 0;
    let n = data.len();
    while i < n && !(dst as usize + i).is_multiple_of(8) {
        // SAFETY: inside the caller's valid range; any address is aligned for a byte.
        unsafe { AtomicU8::from_ptr((dst as usize + i) as *mut u8) }.store(data[i], Relaxed);
        i += 1;
    }
    while i + 8 <= n {
        let mut w = [0u8; 8];
        w.copy_from_slice(&data[i..i + 8]);
        // SAFETY: `dst + i` is 8-aligned here and the 8 bytes are inside the caller's valid range.
        unsafe { AtomicU64::from_ptr((dst as usize + i) as *mut u64) }.store(u64::from_ne_bytes(w), Relaxed);
        i += 8;
    }
    while i < n {
        // SAFETY: as for the head bytes.
        unsafe { AtomicU8::from_ptr((dst as usize + i) as *mut u8) }.store(data[i], Relaxed);
        i += 1;
    }
}

/// Copies `len` bytes from host address `src` to host address `dst`, front to back. When both addresses are
/// aligned alike (equal modulo 8, the common case) the bytes move straight, each aligned word as one 8-byte
/// load and store; otherwise through a stack buffer ([`read`] then [`write`]), in chunks of up to 4 KiB.
/// Overlapping ranges give an unspecified (but race-free) result, as DMA between overlapping buffers does.
///
/// # Safety
/// `src..src + len` must be valid for reads and `dst..dst + len` for writes.
pub(crate) unsafe fn copy(dst: u64, src: u64, len: u64) {
    if (dst ^ src).is_multiple_of(8) {
        // SAFETY: the caller's contract.
        unsafe { copy_aligned_alike(dst, src, len) };
    } else if len <= SMALL as u64 {
        // SAFETY: the caller's contract.
        unsafe { copy_via::<SMALL>(dst, src, len) };
    } else {
        // SAFETY: the caller's contract.
        unsafe { copy_via::<CHUNK>(dst, src, len) };
    }
}

/// [`copy`] for `dst` and `src` equal modulo 8: head bytes up to the first aligned word, the words, the tail.
///
/// # Safety
/// As [`copy`], and `dst ≡ src (mod 8)`.
unsafe fn copy_aligned_alike(dst: u64, src: u64, len: u64) {
    let byte = |a: u64| {
        // SAFETY: every address passed lies inside the caller's range; any address is aligned for a byte.
        unsafe { AtomicU8::from_ptr(a as *mut u8) }
    };
    let mut i = 0u64;
    while i < len && !(src + i).is_multiple_of(8) {
        byte(dst + i).store(byte(src + i).load(Relaxed), Relaxed);
        i += 1;
    }
    while i + 8 <= len {
        // SAFETY: `src + i` is 8-aligned here, and so is `dst + i` (aligned alike); both words lie inside the
        // caller's ranges.
        let (from, to) = unsafe { (atomic_u64(src + i), atomic_u64(dst + i)) };
        to.store(from.load(Relaxed), Relaxed);
        i += 8;
    }
    while i < len {
        byte(dst + i).store(byte(src + i).load(Relaxed), Relaxed);
        i += 1;
    }
}

/// [`copy`] through a stack buffer of `N` bytes.
///
/// # Safety
/// As [`copy`].
unsafe fn copy_via<const N: usize>(dst: u64, src: u64, len: u64) {
    let mut buf = [0u8; N];
    let mut done = 0u64;
    while done < len {
        let n = (len - done).min(N as u64) as usize;
        // SAFETY: `src + done .. + n` lies inside the caller's source range.
        unsafe { read(src + done, &mut buf[..n]) };
        // SAFETY: `dst + done .. + n` lies inside the caller's destination range.
        unsafe { write(dst + done, &buf[..n]) };
        done += n as u64;
    }
}

/// The 8-byte word at host address `addr` as an atomic.
///
/// # Safety
/// `addr` must be 8-byte aligned and its 8 bytes valid for reads and writes for the caller's use of the result.
pub(crate) unsafe fn atomic_u64<'a>(addr: u64) -> &'a AtomicU64 {
    // SAFETY: alignment and validity are the caller's contract.
    unsafe { AtomicU64::from_ptr(addr as *mut u64) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Every alignment pair and length, straight or through either buffer: the destination holds the
        /// source's bytes and nothing around it changed.
        #[test]
        fn copy_moves_exactly_the_range(
            src_off in 0usize..16, dst_off in 0usize..16, len in 0usize..5000, seed in any::<u64>(),
        ) {
            let mut x = seed | 1;
            let src: Vec<u8> = (0..len + 32).map(|_| { x ^= x << 13; x ^= x >> 7; x ^= x << 17; x as u8 }).collect();
            let mut dst = vec![0xa5u8; len + 32];
            // SAFETY: both ranges lie inside the vectors, which live across the call.
            unsafe { copy(dst.as_mut_ptr() as u64 + dst_off as u64, src.as_ptr() as u64 + src_off as u64, len as u64) };
            prop_assert_eq!(&dst[dst_off..dst_off + len], &src[src_off..src_off + len]);
            prop_assert!(dst[..dst_off].iter().chain(&dst[dst_off + len..]).all(|&b| b == 0xa5));
        }
    }
}
