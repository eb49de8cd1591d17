//! Reads, writes and atomics on registered host memory, as the emulated NIC's "DMA engine".
//!
//! Device code (host threads for the `cpu` executor) may read or spin on the same bytes while the NIC writes
//! them, so every access is atomic: the aligned middle of a range moves as relaxed 8-byte words, the unaligned
//! head and tail in the widest naturally aligned pieces (4, 2 or 1 bytes) that fit. Rust then sees no data
//! race, and a reader never sees a torn naturally aligned word of up to 8 bytes.
//! Ordering towards readers comes from the Release store of the CQE (or of the atomic that signals).

use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, AtomicU8, Ordering::Relaxed};

use crate::{Error, Result};

/// Bytes copied through the stack buffer at a time by [`copy`] when source and destination are not aligned
/// alike.
const CHUNK: usize = 4096;

/// Copies shorter than this go through a buffer of this size: zeroing a 4 KiB buffer for an 8-byte payload
/// cost more than the copy.
const SMALL: usize = 256;

/// `len` zeroed elements in a vector of their own, or [`Error::OutOfMemory`] (with the bytes asked for) where
/// `vec![0; len]` would abort the process: the staging buffers of queue creation are as large as the rings,
/// which a caller sizes (up to 256 MiB a CQ), so an allocator's refusal is the caller's error to handle.
///
/// # Errors
/// [`Error::OutOfMemory`] when the allocator refuses, or the size overflows `isize`.
pub(crate) fn zeroed<T: Copy + Default>(len: usize) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|_| Error::OutOfMemory(len.saturating_mul(size_of::<T>())))?;
    v.resize(len, T::default());
    Ok(v)
}

/// Reads `out.len()` bytes starting at host address `src`.
///
/// # Safety
/// `src..src + out.len()` must be valid for reads (a registered host MR range).
pub(crate) unsafe fn read(src: u64, out: &mut [u8]) {
    let n = out.len();
    let mut i = 0;
    while i < n {
        let at = src + i as u64;
        if at.is_multiple_of(8) && i + 8 <= n {
            // SAFETY: `at` is 8-aligned and the 8 bytes are inside the caller's valid range.
            let w = unsafe { AtomicU64::from_ptr(at as *mut u64) }.load(Relaxed);
            out[i..i + 8].copy_from_slice(&w.to_ne_bytes());
            i += 8;
            continue;
        }
        let u = unit(at, n - i);
        // SAFETY: `at` is aligned for `u` bytes and they lie inside the caller's valid range.
        let b = unsafe { load(at, u) };
        out[i..i + u].copy_from_slice(&b[..u]);
        i += u;
    }
}

/// The widest access, of 4, 2 or 1 bytes, that `addr` is aligned for and that `left` bytes still hold (the
/// callers move aligned 8-byte words themselves):
/// a naturally aligned word of the range moves in one access, as a DMA engine or a GPU moves it, so that
/// a reader never sees it torn (a 4-byte dbrec word read byte by byte while device code advanced it once
/// mixed two values).
fn unit(addr: u64, left: usize) -> usize {
    [4, 2].into_iter().find(|&u| addr.is_multiple_of(u as u64) && u <= left).unwrap_or(1)
}

/// One relaxed load of `u` bytes (4, 2 or 1) at `addr`, in the first `u` bytes of the result.
///
/// # Safety
/// `addr` must be aligned for `u` bytes and they must be valid for reads.
unsafe fn load(addr: u64, u: usize) -> [u8; 4] {
    let mut b = [0u8; 4];
    // SAFETY: the caller's contract.
    unsafe {
        match u {
            4 => b[..4].copy_from_slice(&AtomicU32::from_ptr(addr as *mut u32).load(Relaxed).to_ne_bytes()),
            2 => b[..2].copy_from_slice(&AtomicU16::from_ptr(addr as *mut u16).load(Relaxed).to_ne_bytes()),
            _ => b[0] = AtomicU8::from_ptr(addr as *mut u8).load(Relaxed),
        }
    }
    b
}

/// One relaxed store of the first `u` bytes (4, 2 or 1) of `b` at `addr`.
///
/// # Safety
/// `addr` must be aligned for `u` bytes and they must be valid for writes.
unsafe fn store(addr: u64, u: usize, b: &[u8]) {
    // SAFETY: the caller's contract.
    unsafe {
        match u {
            4 => AtomicU32::from_ptr(addr as *mut u32).store(u32::from_ne_bytes([b[0], b[1], b[2], b[3]]), Relaxed),
            2 => AtomicU16::from_ptr(addr as *mut u16).store(u16::from_ne_bytes([b[0], b[1]]), Relaxed),
            _ => AtomicU8::from_ptr(addr as *mut u8).store(b[0], Relaxed),
        }
    }
}

/// Writes `data` to host address `dst`.
///
/// # Safety
/// `dst..dst + data.len()` must be valid for writes (a registered host MR range).
pub(crate) unsafe fn write(dst: u64, data: &[u8]) {
    let n = data.len();
    let mut i = 0;
    while i < n {
        let at = dst + i as u64;
        if at.is_multiple_of(8) && i + 8 <= n {
            let w = u64::from_ne_bytes(data[i..i + 8].try_into().unwrap_or_default());
            // SAFETY: `at` is 8-aligned and the 8 bytes are inside the caller's valid range.
            unsafe { AtomicU64::from_ptr(at as *mut u64) }.store(w, Relaxed);
            i += 8;
            continue;
        }
        let u = unit(at, n - i);
        // SAFETY: `at` is aligned for `u` bytes and they lie inside the caller's valid range.
        unsafe { store(at, u, &data[i..i + u]) };
        i += u;
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
    let mut i = 0u64;
    while i < len {
        if (src + i).is_multiple_of(8) && i + 8 <= len {
            // SAFETY: `src + i` is 8-aligned here, and so is `dst + i` (aligned alike); both words lie inside the
            // caller's ranges.
            let (from, to) = unsafe { (atomic_u64(src + i), atomic_u64(dst + i)) };
            to.store(from.load(Relaxed), Relaxed);
            i += 8;
            continue;
        }
        // Aligned alike: the unit that suits the source suits the destination.
        let u = unit(src + i, (len - i) as usize);
        // SAFETY: `src + i` and `dst + i` are aligned for `u` bytes (aligned alike), inside the caller's ranges.
        unsafe { store(dst + i, u, &load(src + i, u)) };
        i += u as u64;
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

    /// A size the allocator cannot give (past `isize::MAX` bytes) is `OutOfMemory` naming those bytes, not an
    /// abort; a size it can is that many zeros.
    #[test]
    fn zeroed_reports_a_refused_allocation() {
        let len = usize::MAX / 8;
        match zeroed::<u64>(len) {
            Err(Error::OutOfMemory(bytes)) => assert_eq!(bytes, usize::MAX - 7),
            other => panic!("expected OutOfMemory, got {:?}", other.map(|v| v.len())),
        }
        assert_eq!(zeroed::<u8>(3).unwrap(), [0, 0, 0]);
    }

    /// A naturally aligned 4-byte word that another thread rewrites is read whole, never two values' bytes
    /// mixed: by `read`, and by `copy` into a destination aligned alike and into one that is not.
    #[test]
    fn an_aligned_word_is_never_read_torn() {
        use std::sync::atomic::AtomicBool;
        let words = [AtomicU64::new(0), AtomicU64::new(0)];
        let src = words.as_ptr() as u64 + 4;
        let (a, b) = (0x00ff_00ffu32, 0xff00_ff00u32);
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                // SAFETY: `src` is the 4-aligned upper half of `words[0]`, alive for the scope.
                let w = unsafe { AtomicU32::from_ptr(src as *mut u32) };
                let mut k = 0u32;
                while !stop.load(Relaxed) {
                    w.store(if k.is_multiple_of(2) { a } else { b }, Relaxed);
                    k = k.wrapping_add(1);
                }
            });
            let mut alike = [0u64; 2];
            let mut odd = [0u8; 8];
            let mut torn = None;
            for _ in 0..200_000 {
                let mut out = [0u8; 4];
                // SAFETY: `src` is valid for 4 bytes; the destinations are this frame's buffers.
                unsafe {
                    read(src, &mut out);
                    copy(alike.as_mut_ptr() as u64 + 4, src, 4);
                    copy(odd.as_mut_ptr() as u64 + 1, src, 4);
                }
                let seen = [
                    u32::from_ne_bytes(out),
                    (alike[0] >> 32) as u32,
                    u32::from_ne_bytes([odd[1], odd[2], odd[3], odd[4]]),
                ];
                if !seen.iter().all(|v| [0, a, b].contains(v)) {
                    torn = Some(seen);
                    break;
                }
            }
            // Before asserting: a failed assertion must not leave the writer spinning (the scope would wait).
            stop.store(true, Relaxed);
            assert_eq!(torn, None, "a word read torn");
        });
    }

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
