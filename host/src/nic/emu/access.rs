//! The executor's data path: moves bytes between resolved MR ranges, in host memory directly and in GPU
//! memory through the configured [`GpuCopier`], and keeps the PRM's ordering across the two.
//!
//! GPU copies are enqueued (asynchronous, on the copier's own non-blocking stream, which runs them in order)
//! and only waited for when something must be ordered after them: a direct host access (which would otherwise
//! overtake them), an RDMA READ of the same QP, the old value of an atomic on GPU memory (its read follows the
//! earlier copies on the stream; its write-back is left pending), and every CQE. Call [`DataPath::fence`] before those; the helpers here
//! call it themselves before any direct host access.

use std::sync::Arc;

use crate::mem::{GpuCopier, HostQueueMemory, MappedBuf, MemKind, MemLoc, QueueMemory};

use super::fault::Fault;
use super::hostmem;

/// An atomic operation on a remote 8-byte word (host order in memory: see the module docs of `emu`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AtomicOp {
    /// Fetch-and-add of the addend.
    FetchAdd(u64),
    /// Compare-and-swap: if the word equals `compare`, write `swap`.
    CompareSwap {
        /// Value compared with.
        compare: u64,
        /// Value written on a match.
        swap: u64,
    },
}

impl AtomicOp {
    /// The value an atomic leaves behind when it found `old`.
    fn apply(self, old: u64) -> u64 {
        match self {
            AtomicOp::FetchAdd(add) => old.wrapping_add(add),
            AtomicOp::CompareSwap { compare, swap } if old == compare => swap,
            AtomicOp::CompareSwap { .. } => old,
        }
    }
}

/// Bytes of the staging buffer of a [`DataPath`]: room for the inline data of 64 maximal inline WRITEs
/// between two synchronizes (a full buffer synchronizes first).
const STAGING_BYTES: usize = 64 * 1024;

/// The host side of GPU copies: one buffer of queue memory (pinned host memory on the `gpu` executor, so that
/// copies from it are asynchronous DMA: from pageable memory CUDA synchronizes the stream before each one),
/// touched only through the raw pointer taken at allocation (copies read and write it behind Rust's back, so
/// no reference to it is formed afterwards). Accessors check bounds and do nothing (or read 0) outside the
/// buffer: callers stay inside what [`DataPath::stage`] reserved, so that never happens.
struct Staging {
    ptr: *mut u64,
    words: usize,
    /// Owns the memory (none without a GPU copier: nothing is staged then).
    _buf: Option<MappedBuf>,
}

impl Staging {
    fn new(buf: Option<MappedBuf>) -> Self {
        match buf {
            Some(b) => Self { ptr: b.host_ptr().cast(), words: b.len() / 8, _buf: Some(b) },
            None => Self { ptr: std::ptr::NonNull::dangling().as_ptr(), words: 0, _buf: None },
        }
    }

    /// Length in bytes.
    fn len(&self) -> usize {
        self.words * 8
    }

    /// Whether `len` bytes at `off` lie inside the buffer.
    fn fits(&self, off: usize, len: usize) -> bool {
        off.checked_add(len).is_some_and(|end| end <= self.len())
    }

    /// The host address of byte `off`.
    fn loc(&self, off: usize) -> MemLoc {
        MemLoc { kind: MemKind::Host, addr: self.ptr as u64 + off as u64 }
    }

    /// Copies `data` to byte `off`.
    fn write(&mut self, off: usize, data: &[u8]) {
        if self.fits(off, data.len()) {
            // SAFETY: inside the allocation (checked); `data` is a Rust slice, so not this buffer; the range is
            // not one a pending copy uses (the caller staged it).
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), (self.ptr as *mut u8).add(off), data.len()) }
        }
    }

    /// Copies `out.len()` bytes at byte `off` into `out`.
    fn read(&self, off: usize, out: &mut [u8]) {
        if self.fits(off, out.len()) {
            // SAFETY: inside the allocation (checked); no copy writes it now (the caller synchronized).
            unsafe { std::ptr::copy_nonoverlapping((self.ptr as *const u8).add(off), out.as_mut_ptr(), out.len()) }
        }
    }

    /// The word at byte `off` (8-byte aligned).
    fn word(&self, off: usize) -> u64 {
        if !self.fits(off, 8) || !off.is_multiple_of(8) {
            return 0;
        }
        // SAFETY: an aligned word inside the allocation (checked); no copy writes it now (synchronized).
        unsafe { self.ptr.add(off / 8).read() }
    }

    /// Sets the word at byte `off` (8-byte aligned).
    fn set_word(&mut self, off: usize, v: u64) {
        if self.fits(off, 8) && off.is_multiple_of(8) {
            // SAFETY: as in `word`.
            unsafe { self.ptr.add(off / 8).write(v) }
        }
    }
}

/// Moves data for the executor thread. Not shared: one per executor.
pub(crate) struct DataPath {
    gpu: Option<Arc<dyn GpuCopier>>,
    /// GPU copies were enqueued since the last synchronize.
    pending: bool,
    /// Host memory that pending GPU copies read from or write into (inline data, atomic operands): one
    /// buffer for the executor's lifetime, so that nothing is allocated per WQE and no copy's host side is
    /// ever freed under it, not even after a failed synchronize. `u64` words: 8-byte aligned slots.
    staging: Staging,
    /// Bytes at the start of `staging` that pending copies use; what follows is free.
    staged: usize,
    /// While a doorbell batch of one QP is taken: success CQEs of its WQEs whose data is still in flight,
    /// written in order after one synchronize when the batch ends (or before any other CQE of the QP), so
    /// that a batch costs one synchronize however many WQEs it signals.
    pub(crate) held: Vec<HeldCqe>,
    /// Whether a batch is being taken (success CQEs may be held).
    pub(crate) holding: bool,
}

/// A success CQE held until the copies of its WQE are placed: the WQE's 64-bit index, opcode and byte count.
#[derive(Clone, Copy, Debug)]
pub(crate) struct HeldCqe {
    pub idx: u64,
    pub op: u8,
    pub byte_cnt: u32,
}

impl DataPath {
    /// A data path that reaches GPU memory through `gpu`, if any, staging through a buffer from `mem`.
    pub(crate) fn new(gpu: Option<Arc<dyn GpuCopier>>, mem: &dyn QueueMemory) -> Self {
        // Only GPU copies stage anything: without a copier the buffer would never be used.
        let buf = gpu.as_ref().map(|_| {
            mem.alloc(STAGING_BYTES).or_else(|e| {
                tracing::warn!("emulated NIC: no pinned staging buffer ({e}); copies stage through the heap");
                HostQueueMemory.alloc(STAGING_BYTES)
            })
        });
        let staging = Staging::new(buf.and_then(|b| b.ok()));
        Self { gpu, pending: false, staging, staged: 0, held: Vec::new(), holding: false }
    }

    /// Whether GPU copies are enqueued and not yet waited for.
    pub(crate) fn pending(&self) -> bool {
        self.pending
    }

    /// Waits for every enqueued GPU copy. Cheap when none is pending.
    pub(crate) fn fence(&mut self) -> Result<(), Fault> {
        if !self.pending {
            return Ok(());
        }
        self.pending = false;
        let r = match &self.gpu {
            Some(g) => g.synchronize(),
            None => Ok(()),
        };
        // No copy uses the staging buffer any more (or, after a failure, the CUDA context is unusable and
        // every later copy fails): it is free again.
        self.staged = 0;
        r.map_err(|e| {
            tracing::warn!("emulated NIC: GPU copy failed: {e}");
            Fault::gpu_copy()
        })
    }

    /// Reserves `len` bytes (at most [`STAGING_BYTES`]) of the staging buffer for a GPU copy, synchronizing
    /// first when the rest of the buffer is too small. Returns the byte offset of the slot (8-byte aligned).
    fn stage(&mut self, len: usize) -> Result<usize, Fault> {
        let cap = self.staging.len();
        if len > cap {
            // Callers split their data into slots of at most STAGING_BYTES; no copier, no buffer.
            return Err(Fault::gpu_copy());
        }
        if cap - self.staged < len {
            self.fence()?;
        }
        let at = self.staged;
        self.staged = (at + len).next_multiple_of(8).min(cap);
        Ok(at)
    }

    fn copier(&self) -> Result<&Arc<dyn GpuCopier>, Fault> {
        // An MR in GPU memory can only be registered with a copier, so this is unreachable in practice.
        self.gpu.as_ref().ok_or(Fault::gpu_copy())
    }

    /// Copies `len` bytes from `src` to `dst`.
    ///
    /// # Safety
    /// Both ranges must lie inside registered MRs that stay registered until [`DataPath::fence`] returns (MR
    /// deregistration synchronizes the copier, so holding the MR table's read lock while calling this
    /// suffices).
    pub(crate) unsafe fn copy(&mut self, dst: MemLoc, src: MemLoc, len: u64) -> Result<(), Fault> {
        if len == 0 {
            return Ok(());
        }
        if dst.kind == MemKind::Host && src.kind == MemKind::Host {
            self.fence()?;
            // SAFETY: both are registered host ranges of `len` bytes (caller's contract).
            unsafe { hostmem::copy(dst.addr, src.addr, len) };
            return Ok(());
        }
        let g = self.copier()?.clone();
        let n = usize::try_from(len).map_err(|_| Fault::gpu_copy())?;
        // SAFETY: both ranges are registered and stay valid until the next synchronize (caller's contract).
        unsafe { g.copy_async(dst, src, n) }.map_err(|_| Fault::gpu_copy())?;
        self.pending = true;
        Ok(())
    }

    /// Writes `data` to `dst`.
    ///
    /// # Safety
    /// As [`DataPath::copy`] for `dst` and `data.len()` bytes.
    pub(crate) unsafe fn write_bytes(&mut self, dst: MemLoc, data: &[u8]) -> Result<(), Fault> {
        if data.is_empty() {
            return Ok(());
        }
        if dst.kind == MemKind::Host {
            self.fence()?;
            // SAFETY: a registered host range of `data.len()` bytes (caller's contract).
            unsafe { hostmem::write(dst.addr, data) };
            return Ok(());
        }
        let g = self.copier()?.clone();
        let mut done = 0;
        for chunk in data.chunks(STAGING_BYTES) {
            let off = self.stage(chunk.len())?;
            self.staging.write(off, chunk);
            let src = self.staging.loc(off);
            let to = MemLoc { kind: dst.kind, addr: dst.addr + done as u64 };
            // SAFETY: `to` is inside `dst` as the caller promises; the source is a slot of the staging buffer
            // that no other pending copy uses, reserved until the next synchronize, and the buffer lives as
            // long as `self`.
            unsafe { g.copy_async(to, src, chunk.len()) }.map_err(|_| Fault::gpu_copy())?;
            self.pending = true;
            done += chunk.len();
        }
        Ok(())
    }

    /// Reads `out.len()` bytes at `src` into `out`, after every earlier placement of this executor.
    ///
    /// # Safety
    /// As [`DataPath::copy`] for `src` and `out.len()` bytes.
    pub(crate) unsafe fn read_bytes(&mut self, src: MemLoc, out: &mut [u8]) -> Result<(), Fault> {
        self.fence()?;
        if out.is_empty() {
            return Ok(());
        }
        if src.kind == MemKind::Host {
            // SAFETY: a registered host range of `out.len()` bytes (caller's contract).
            unsafe { hostmem::read(src.addr, out) };
            return Ok(());
        }
        let g = self.copier()?.clone();
        let mut done = 0;
        for chunk in out.chunks_mut(STAGING_BYTES) {
            let off = self.stage(chunk.len())?;
            let from = MemLoc { kind: src.kind, addr: src.addr + done as u64 };
            // SAFETY: `from` is inside `src` as the caller promises; the slot is reserved until the fence.
            unsafe { g.copy_async(self.staging.loc(off), from, chunk.len()) }.map_err(|_| Fault::gpu_copy())?;
            self.pending = true;
            self.fence()?;
            self.staging.read(off, chunk);
            done += chunk.len();
        }
        Ok(())
    }

    /// Reads queue memory in GPU memory (a ring range, a dbrec word) into each `out` buffer: one copy per
    /// buffer straight into it, then one synchronize for all of them (which also completes every copy
    /// enqueued before). Device code wrote these bytes before it rang the doorbell the caller acts on, so no
    /// earlier copy of this executor needs to precede them.
    ///
    /// Queue memory is owned by the QP or CQ the executor holds while it runs, so it outlives the copies.
    pub(crate) fn fetch(&mut self, reads: &mut [(MemLoc, &mut [u8])]) -> Result<(), Fault> {
        let g = self.copier()?.clone();
        for (src, out) in reads.iter_mut() {
            if out.is_empty() {
                continue;
            }
            let dst = MemLoc { kind: MemKind::Host, addr: out.as_mut_ptr() as u64 };
            // SAFETY: `src` is queue memory the executor's QP or CQ keeps alive; `out` is a buffer this call
            // borrows exclusively until the synchronize below, and nothing reads it before then.
            unsafe { g.copy_async(dst, *src, out.len()) }.map_err(|_| Fault::gpu_copy())?;
            self.pending = true;
        }
        self.fence()
    }

    /// Applies `op` to the 8-byte, 8-byte-aligned word at `at` and returns the old value (host order).
    ///
    /// Earlier writes of this executor are placed first. In host memory the operation is a real atomic
    /// (SeqCst), atomic also towards device code on host threads. In GPU memory it is a read through the
    /// copier's stream (so after every copy enqueued before it), one synchronize, and a write-back enqueued
    /// behind it, which later copies follow on the same stream and the next [`DataPath::fence`] (every CQE's)
    /// waits for: atomic towards other operations of this NIC only.
    ///
    /// # Safety
    /// As [`DataPath::copy`] for `at` and 8 bytes; `at.addr` is 8-byte aligned.
    pub(crate) unsafe fn atomic(&mut self, at: MemLoc, op: AtomicOp) -> Result<u64, Fault> {
        if at.kind == MemKind::Host {
            self.fence()?;
            use std::sync::atomic::Ordering::SeqCst;
            // SAFETY: registered, aligned host word (caller's contract).
            let word = unsafe { hostmem::atomic_u64(at.addr) };
            let old = match op {
                AtomicOp::FetchAdd(add) => word.fetch_add(add, SeqCst),
                AtomicOp::CompareSwap { compare, swap } => match word.compare_exchange(compare, swap, SeqCst, SeqCst) {
                    Ok(v) | Err(v) => v,
                },
            };
            return Ok(old);
        }
        let g = self.copier()?.clone();
        let off = self.stage(8)?;
        let host = self.staging.loc(off);
        // SAFETY: `at` as the caller promises; the slot lives as long as `self` and is reserved until the
        // fence below. The stream runs copies in order: this read sees every earlier copy's bytes.
        unsafe { g.copy_async(host, at, 8) }.map_err(|_| Fault::gpu_copy())?;
        self.pending = true;
        self.fence()?;
        let old = self.staging.word(off);
        // The fence freed the slot: stage the new value afresh for the write-back.
        let off = self.stage(8)?;
        self.staging.set_word(off, op.apply(old));
        let host = self.staging.loc(off);
        // SAFETY: as above; the slot stays reserved until the next fence, which the write-back precedes.
        unsafe { g.copy_async(at, host, 8) }.map_err(|_| Fault::gpu_copy())?;
        self.pending = true;
        Ok(old)
    }
}
