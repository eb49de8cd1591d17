//! Loads and stores to queue memory (SQ ring, doorbell records, UAR page, CQ ring).
//!
//! Device code writes and reads these buffers while the executor thread does, so every access here is an
//! atomic access of a naturally aligned word: no data race in Rust's memory model, and the same single-copy
//! atomicity that the PRM assumes for the doorbell (8 bytes) and the CQE's last word (8 bytes).
//!
//! Offsets come from ring masks and fixed layouts; a misaligned or out-of-range offset is an emulator bug, so
//! it trips a `debug_assert!` in tests and is answered with 0 (loads) or ignored (stores) in release builds
//! rather than touching memory outside the buffer.

use std::any::Any;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use gdaki_shared::handle::Placement;

use crate::mem::{GpuMem, MappedBuf, MemKind, MemLoc};

use super::guard::lock;

fn word_ptr(buf: &HostView, off: usize, size: usize) -> Option<*mut u8> {
    let ok = off.is_multiple_of(size) && off.checked_add(size).is_some_and(|end| end <= buf.len());
    debug_assert!(ok, "queue memory access at {off:#x}+{size} outside a {}-byte buffer", buf.len());
    // SAFETY: `off + size <= len` when `ok`, so the `add` stays inside the allocation.
    ok.then(|| unsafe { buf.host_ptr().add(off) })
}

/// Loads the 8-byte word at byte offset `off` (8-byte aligned) with ordering `ord`.
pub(crate) fn load_u64(buf: &HostView, off: usize, ord: Ordering) -> u64 {
    match word_ptr(buf, off, 8) {
        // SAFETY: the pointer is 8-aligned (a view starts 8-aligned, `off` is a multiple of 8), inside the
        // view, and the memory lives as long as `buf` (its owner); others access it only atomically or
        // read-only.
        Some(p) => unsafe { AtomicU64::from_ptr(p.cast()) }.load(ord),
        None => 0,
    }
}

/// Loads the 4-byte word at byte offset `off` (4-byte aligned) with ordering `ord`.
pub(crate) fn load_u32(buf: &HostView, off: usize, ord: Ordering) -> u32 {
    match word_ptr(buf, off, 4) {
        // SAFETY: as in `load_u64`, for 4 bytes.
        Some(p) => unsafe { AtomicU32::from_ptr(p.cast()) }.load(ord),
        None => 0,
    }
}

/// Stores the 8-byte word `v` at byte offset `off` (8-byte aligned) with ordering `ord`.
pub(crate) fn store_u64(buf: &HostView, off: usize, v: u64, ord: Ordering) {
    if let Some(p) = word_ptr(buf, off, 8) {
        // SAFETY: as in `load_u64`.
        unsafe { AtomicU64::from_ptr(p.cast()) }.store(v, ord)
    }
}

/// Swaps the 8-byte word at byte offset `off` (8-byte aligned) for `v` with ordering `ord`; returns the old
/// word (0 for an offset outside the buffer, which is an emulator bug).
pub(crate) fn swap_u64(buf: &HostView, off: usize, v: u64, ord: Ordering) -> u64 {
    match word_ptr(buf, off, 8) {
        // SAFETY: as in `load_u64`.
        Some(p) => unsafe { AtomicU64::from_ptr(p.cast()) }.swap(v, ord),
        None => 0,
    }
}

/// Reads `out.len()` bytes (a multiple of 8) starting at `off` (8-byte aligned) with relaxed word loads,
/// wrapping from the end of the buffer to its start (SQ ring semantics: a WQE's segments past the last slot
/// continue at slot 0). The caller orders these loads after an Acquire load of the doorbell.
pub(crate) fn read_wrapping(buf: &HostView, off: usize, out: &mut [u8]) {
    let len = buf.len();
    if len == 0 {
        return;
    }
    for (i, chunk) in out.chunks_exact_mut(8).enumerate() {
        let at = (off + i * 8) % len;
        chunk.copy_from_slice(&load_u64(buf, at, Ordering::Relaxed).to_ne_bytes());
    }
}

/// Host memory the executor thread reads and writes with the functions above: a range of a larger allocation
/// (an SQ ring inside a umem, a UAR page), kept alive by the view. Starts 8-byte aligned, so that every word
/// access at a multiple of 8 is a naturally aligned atomic.
pub(crate) struct HostView {
    host_ptr: *mut u8,
    device_addr: u64,
    len: usize,
    _owner: Arc<dyn Any + Send + Sync>,
}

// SAFETY: the memory is shared with device code and the NIC on purpose; every access goes through the atomic
// word functions of this module or through the copier.
unsafe impl Send for HostView {}
// SAFETY: as above; the view itself hands out only raw pointers.
unsafe impl Sync for HostView {}

impl HostView {
    /// `len` bytes at offset `off` of `buf`, which `owner` keeps alive; `None` when the range is not inside
    /// `buf` or does not start 8-byte aligned.
    pub(crate) fn new(buf: &MappedBuf, off: usize, len: usize, owner: Arc<dyn Any + Send + Sync>) -> Option<Self> {
        let end = off.checked_add(len)?;
        if end > buf.len() || !(buf.host_ptr() as usize).wrapping_add(off).is_multiple_of(8) {
            return None;
        }
        // SAFETY: `off + len <= buf.len()`, so the pointer stays inside the allocation.
        let host_ptr = unsafe { buf.host_ptr().add(off) };
        Some(Self { host_ptr, device_addr: buf.device_addr() + off as u64, len, _owner: owner })
    }

    /// Host pointer to the first byte.
    pub(crate) fn host_ptr(&self) -> *mut u8 {
        self.host_ptr
    }

    /// Address of the first byte as device code sees it.
    pub(crate) fn device_addr(&self) -> u64 {
        self.device_addr
    }

    /// Length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl std::fmt::Debug for HostView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostView")
            .field("host_ptr", &self.host_ptr)
            .field("device_addr", &format_args!("{:#x}", self.device_addr))
            .field("len", &self.len)
            .finish()
    }
}

/// An allocation of queue memory where the NIC's [`EmuConfig::queues`] (or the caller) put it: host memory
/// (pinned and mapped into the GPU for the `gpu` executor) or GPU memory (back to the NIC's pool when dropped,
/// when it came from there). What a umem holds; the QPs and CQs made over it hold [`QBuf`] views of it.
///
/// [`EmuConfig::queues`]: super::EmuConfig::queues
#[derive(Debug)]
pub(crate) enum QMem {
    /// Host memory.
    Host(MappedBuf),
    /// GPU memory.
    Gpu(PooledGpuMem),
}

impl QMem {
    /// Length in bytes.
    pub(crate) fn len(&self) -> usize {
        match self {
            QMem::Host(b) => b.len(),
            QMem::Gpu(g) => g.len(),
        }
    }

    /// Where it is.
    pub(crate) fn kind(&self) -> MemKind {
        match self {
            QMem::Host(_) => MemKind::Host,
            QMem::Gpu(_) => MemKind::Gpu,
        }
    }

    /// The address device code uses for the first byte.
    pub(crate) fn device_addr(&self) -> u64 {
        match self {
            QMem::Host(b) => b.device_addr(),
            QMem::Gpu(g) => g.addr(),
        }
    }

    /// The host pointer to the first byte, for host memory.
    pub(crate) fn host_ptr(&self) -> Option<*mut u8> {
        match self {
            QMem::Host(b) => Some(b.host_ptr()),
            QMem::Gpu(_) => None,
        }
    }

    /// A view of `len` bytes at offset `off` of `this`, keeping it alive; `None` when the range is outside the
    /// memory or, for host memory, does not start 8-byte aligned.
    pub(crate) fn view(this: &Arc<QMem>, off: usize, len: usize) -> Option<QBuf> {
        let owner: Arc<dyn Any + Send + Sync> = this.clone();
        match &**this {
            QMem::Host(b) => HostView::new(b, off, len, owner).map(QBuf::Host),
            QMem::Gpu(g) => {
                let end = off.checked_add(len)?;
                (end <= g.len()).then(|| QBuf::Gpu(GpuMem::new(g.addr() + off as u64, len, Box::new(owner))))
            }
        }
    }

    /// The whole of `self` as one view (`None` only for host memory that does not start 8-byte aligned).
    pub(crate) fn into_view(self) -> Option<QBuf> {
        let len = self.len();
        QMem::view(&Arc::new(self), 0, len)
    }
}

/// A buffer of queue memory (SQ ring, dbrec, CQ ring) inside a [`QMem`], which it keeps alive: host memory that
/// the executor thread reads and writes with the functions above, or GPU memory that it reaches only through
/// the data path's copies (`DataPath::fetch`, `DataPath::write_bytes`). The UAR page is always host memory
/// ([`HostView`]).
#[derive(Debug)]
pub(crate) enum QBuf {
    /// Host memory (pinned and mapped into the GPU for the `gpu` executor).
    Host(HostView),
    /// GPU memory.
    Gpu(GpuMem),
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

/// GPU queue memory that goes back to its NIC's [`GpuPool`] when dropped (when it has one: memory a user
/// brought is freed instead).
#[derive(Debug)]
pub(crate) struct PooledGpuMem {
    mem: Option<GpuMem>,
    pool: Option<Arc<GpuPool>>,
}

impl PooledGpuMem {
    /// `mem`, given back to `pool` when dropped, or freed there without one.
    pub(crate) fn new(mem: GpuMem, pool: Option<Arc<GpuPool>>) -> Self {
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
        if let (Some(m), Some(pool)) = (self.mem.take(), &self.pool) {
            pool.give_back(m);
        }
    }
}

impl std::fmt::Debug for GpuPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuPool").finish_non_exhaustive()
    }
}
