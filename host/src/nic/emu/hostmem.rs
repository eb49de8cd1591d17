//! Reads, writes and atomics on registered host memory, as the emulated NIC's "DMA engine".
//!
//! Device code (host threads for the `cpu` executor) may read or spin on the same bytes while the NIC writes
//! them, so every access is atomic: the aligned middle of a range moves as relaxed 8-byte words, the unaligned
//! head and tail as relaxed bytes. Rust then sees no data race, and a reader never sees a torn aligned word.
//! Ordering towards readers comes from the Release store of the CQE (or of the atomic that signals).

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering::Relaxed};

/// Bytes copied through the stack buffer at a time by [`copy`].
const CHUNK: usize = 4096;

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

/// Copies `len` bytes from host address `src` to host address `dst`, front to back in 4 KiB chunks.
/// Overlapping ranges give an unspecified (but race-free) result, as DMA between overlapping buffers does.
///
/// # Safety
/// `src..src + len` must be valid for reads and `dst..dst + len` for writes.
pub(crate) unsafe fn copy(dst: u64, src: u64, len: u64) {
    let mut buf = [0u8; CHUNK];
    let mut done = 0u64;
    while done < len {
        let n = (len - done).min(CHUNK as u64) as usize;
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
