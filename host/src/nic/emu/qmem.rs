//! Loads and stores to queue memory (SQ ring, doorbell records, UAR page, CQ ring).
//!
//! Device code writes and reads these buffers while the executor thread does, so every access here is an
//! atomic access of a naturally aligned word: no data race in Rust's memory model, and the same single-copy
//! atomicity that the PRM assumes for the doorbell (8 bytes) and the CQE's last word (8 bytes).
//!
//! Offsets come from ring masks and fixed layouts; a misaligned or out-of-range offset is an emulator bug, so
//! it trips a `debug_assert!` in tests and is answered with 0 (loads) or ignored (stores) in release builds
//! rather than touching memory outside the buffer.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use gdaki_shared::handle::Placement;

use crate::mem::{GpuMem, MappedBuf, MemKind, MemLoc};

use super::fabric::lock;

fn word_ptr(buf: &MappedBuf, off: usize, size: usize) -> Option<*mut u8> {
    let ok = off.is_multiple_of(size) && off.checked_add(size).is_some_and(|end| end <= buf.len());
    debug_assert!(ok, "queue memory access at {off:#x}+{size} outside a {}-byte buffer", buf.len());
    // SAFETY: `off + size <= len` when `ok`, so the `add` stays inside the allocation.
    ok.then(|| unsafe { buf.host_ptr().add(off) })
}

/// Loads the 8-byte word at byte offset `off` (8-byte aligned) with ordering `ord`.
pub(crate) fn load_u64(buf: &MappedBuf, off: usize, ord: Ordering) -> u64 {
    match word_ptr(buf, off, 8) {
        // SAFETY: the pointer is 8-aligned (buffers are 4096-aligned, `off` is a multiple of 8), inside the
        // buffer, and the buffer lives as long as `buf`; others access it only atomically or read-only.
        Some(p) => unsafe { AtomicU64::from_ptr(p.cast()) }.load(ord),
        None => 0,
    }
}

/// Loads the 4-byte word at byte offset `off` (4-byte aligned) with ordering `ord`.
pub(crate) fn load_u32(buf: &MappedBuf, off: usize, ord: Ordering) -> u32 {
    match word_ptr(buf, off, 4) {
        // SAFETY: as in `load_u64`, for 4 bytes.
        Some(p) => unsafe { AtomicU32::from_ptr(p.cast()) }.load(ord),
        None => 0,
    }
}

/// Stores the 8-byte word `v` at byte offset `off` (8-byte aligned) with ordering `ord`.
pub(crate) fn store_u64(buf: &MappedBuf, off: usize, v: u64, ord: Ordering) {
    if let Some(p) = word_ptr(buf, off, 8) {
        // SAFETY: as in `load_u64`.
        unsafe { AtomicU64::from_ptr(p.cast()) }.store(v, ord)
    }
}

/// Swaps the 8-byte word at byte offset `off` (8-byte aligned) for `v` with ordering `ord`; returns the old
/// word (0 for an offset outside the buffer, which is an emulator bug).
pub(crate) fn swap_u64(buf: &MappedBuf, off: usize, v: u64, ord: Ordering) -> u64 {
    match word_ptr(buf, off, 8) {
        // SAFETY: as in `load_u64`.
        Some(p) => unsafe { AtomicU64::from_ptr(p.cast()) }.swap(v, ord),
        None => 0,
    }
}

/// Reads `out.len()` bytes (a multiple of 8) starting at `off` (8-byte aligned) with relaxed word loads,
/// wrapping from the end of the buffer to its start (SQ ring semantics: a WQE's segments past the last slot
/// continue at slot 0). The caller orders these loads after an Acquire load of the doorbell.
pub(crate) fn read_wrapping(buf: &MappedBuf, off: usize, out: &mut [u8]) {
    let len = buf.len();
    if len == 0 {
        return;
    }
    for (i, chunk) in out.chunks_exact_mut(8).enumerate() {
        let at = (off + i * 8) % len;
        chunk.copy_from_slice(&load_u64(buf, at, Ordering::Relaxed).to_ne_bytes());
    }
}

/// A buffer of queue memory (SQ ring, dbrec, CQ ring) where the NIC's [`EmuConfig::queues`] put it: host memory
/// that the executor thread reads and writes with the functions above, or GPU memory that it reaches only
/// through the data path's copies (`DataPath::fetch`, `DataPath::write_bytes`). The UAR page is always host
/// memory ([`MappedBuf`]).
///
/// [`EmuConfig::queues`]: super::EmuConfig::queues
#[derive(Debug)]
pub(crate) enum QBuf {
    /// Host memory (pinned and mapped into the GPU for the `gpu` executor).
    Host(MappedBuf),
    /// GPU memory (back to the NIC's pool when dropped).
    Gpu(PooledGpuMem),
}

impl QBuf {
    /// The address device code uses.
    pub(crate) fn device_addr(&self) -> u64 {
        match self {
            QBuf::Host(b) => b.device_addr(),
            QBuf::Gpu(g) => g.addr(),
        }
    }

    /// Where it is, as the QP and CQ handles record it.
    pub(crate) fn placement(&self) -> Placement {
        match self {
            QBuf::Host(_) => Placement::HOST,
            QBuf::Gpu(_) => Placement::GPU,
        }
    }

    /// The byte at offset `off` as the data path addresses it.
    pub(crate) fn loc(&self, off: usize) -> MemLoc {
        match self {
            QBuf::Host(b) => MemLoc { kind: MemKind::Host, addr: b.host_ptr() as u64 + off as u64 },
            QBuf::Gpu(g) => g.loc(off),
        }
    }
}

/// GPU queue memory the NIC's destroyed QPs and CQs gave back, kept for later ones and freed only with the
/// NIC: freeing GPU memory (`cuMemFree`) waits for every running kernel of the device, so a QP destroyed
/// while another rank's kernel spins on its own QP would hang the dropping thread until that kernel's waits
/// time out. Buffers are kept by size (rings are powers of two, dbrecs 64 bytes), so the pool holds at most
/// what the NIC once held at a time.
#[derive(Default)]
pub(crate) struct GpuPool {
    free: Mutex<HashMap<usize, Vec<GpuMem>>>,
}

impl GpuPool {
    /// A buffer of `len` bytes given back earlier, if any (its bytes are what its last user left).
    pub(crate) fn take(&self, len: usize) -> Option<GpuMem> {
        lock(&self.free).get_mut(&len)?.pop()
    }

    /// Keeps `mem` for a later [`GpuPool::take`].
    fn give_back(&self, mem: GpuMem) {
        lock(&self.free).entry(mem.len()).or_default().push(mem);
    }
}

/// GPU queue memory that goes back to its NIC's [`GpuPool`] when dropped.
#[derive(Debug)]
pub(crate) struct PooledGpuMem {
    mem: Option<GpuMem>,
    pool: Arc<GpuPool>,
}

impl PooledGpuMem {
    pub(crate) fn new(mem: GpuMem, pool: Arc<GpuPool>) -> Self {
        Self { mem: Some(mem), pool }
    }
}

impl std::ops::Deref for PooledGpuMem {
    type Target = GpuMem;
    fn deref(&self) -> &GpuMem {
        // Only `drop` takes it out.
        self.mem.as_ref().expect("pooled GPU memory used after drop")
    }
}

impl Drop for PooledGpuMem {
    fn drop(&mut self) {
        if let Some(m) = self.mem.take() {
            self.pool.give_back(m);
        }
    }
}

impl std::fmt::Debug for GpuPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuPool").finish_non_exhaustive()
    }
}
