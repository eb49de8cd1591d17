//! Memory the NIC and device code share: where a buffer lives, and the two services the emulated NIC needs
//! from an executor (queue memory it can read and write directly, and copies into and out of GPU memory).

use std::any::Any;
use std::sync::atomic::Ordering;

use crate::Result;

/// Where a buffer lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemKind {
    /// Host memory (pageable or pinned): host threads read and write it directly.
    Host,
    /// GPU memory: reachable from the host only through CUDA copies.
    Gpu,
}

/// A device-visible address and the kind of memory behind it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemLoc {
    /// Kind of memory.
    pub kind: MemKind,
    /// Address, bytes: a host pointer for [`MemKind::Host`], a `CUdeviceptr` for [`MemKind::Gpu`].
    pub addr: u64,
}

/// A buffer of queue memory (SQ ring, dbrec, UAR page, CQ ring): host memory that host threads access through
/// `host_ptr` and device code through `device_addr` (the same address for the `cpu` executor; the mapped
/// address of pinned memory for the `gpu` executor). Zeroed and 4096-byte aligned when allocated; freed on drop.
pub struct MappedBuf {
    host_ptr: *mut u8,
    device_addr: u64,
    len: usize,
    _owner: Box<dyn Any + Send + Sync>,
}

// SAFETY: the buffer is plain memory shared with device code and the NIC on purpose; every access goes
// through raw pointers with atomics or volatile operations chosen by the accessor.
unsafe impl Send for MappedBuf {}
// SAFETY: as above; `MappedBuf` itself hands out only raw pointers.
unsafe impl Sync for MappedBuf {}

impl MappedBuf {
    /// Wraps an allocation. `owner` frees it when dropped.
    ///
    /// # Safety
    /// `host_ptr` must point to `len` zeroed bytes, 4096-byte aligned, valid until `owner` is dropped, and
    /// `device_addr` must name the same bytes for the executor's device code.
    pub unsafe fn from_raw(host_ptr: *mut u8, device_addr: u64, len: usize, owner: Box<dyn Any + Send + Sync>) -> Self {
        Self { host_ptr, device_addr, len, _owner: owner }
    }

    /// Host pointer to the first byte.
    pub fn host_ptr(&self) -> *mut u8 {
        self.host_ptr
    }

    /// Address of the first byte as device code sees it.
    pub fn device_addr(&self) -> u64 {
        self.device_addr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl std::fmt::Debug for MappedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MappedBuf")
            .field("host_ptr", &self.host_ptr)
            .field("device_addr", &format_args!("{:#x}", self.device_addr))
            .field("len", &self.len)
            .finish()
    }
}

/// Allocates queue memory for one executor: plain host memory for `cpu`, pinned host memory mapped into the
/// GPU for `gpu` (`cuMemHostAlloc(DEVICEMAP)`).
pub trait QueueMemory: Send + Sync {
    /// Allocates `len` zeroed bytes, 4096-byte aligned.
    ///
    /// # Errors
    /// Out of memory, or the CUDA driver's error.
    fn alloc(&self, len: usize) -> Result<MappedBuf>;
}

/// An RDMA atomic on an 8-byte word, as the emulated NIC executes it (the word in host byte order: the NIC
/// runs in host-endianness atomic mode).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AtomicOp {
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
    /// The value the operation leaves behind when it finds `old`.
    pub fn apply(self, old: u64) -> u64 {
        match self {
            AtomicOp::FetchAdd(add) => old.wrapping_add(add),
            AtomicOp::CompareSwap { compare, swap } if old == compare => swap,
            AtomicOp::CompareSwap { .. } => old,
        }
    }
}

/// An SQ ring in GPU memory to mirror into host memory ([`GpuCopier::mirror_sq`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SqWatch {
    /// Device address of the ring's first WQEBB.
    pub ring: u64,
    /// WQEBBs (64 bytes each) in the ring: a power of two.
    pub wqebbs: u32,
    /// Device address of the dbrec's SQ counter (word 1: big-endian, its low 16 bits the producer counter in
    /// WQEBBs, PRM "Doorbell Record"), in GPU memory.
    pub dbrec: u64,
    /// The producer count (64-bit, WQEBBs) the ring is at now: mirroring starts there.
    pub base: u64,
}

/// Host memory that a copier keeps filling with an SQ ring's WQEBBs as device code posts them
/// ([`GpuCopier::mirror_sq`]): a copy of the ring (same length, same offsets) and a 64-bit count.
///
/// The count says that every WQEBB with a producer index in `count - wqebbs .. count` is in the copy as device
/// code wrote it before it moved the dbrec past that index; it only grows, and a WQEBB is in place before the
/// count that covers it is stored. Valid until [`GpuCopier::unmirror_sq`] or the copier's drop.
#[derive(Clone, Copy, Debug)]
pub struct SqMirror {
    slot: u32,
    bytes: *const u8,
    len: usize,
    count: *const u64,
}

// SAFETY: the mirror names host memory that its copier keeps alive and writes only with aligned word stores;
// this type reads it only with atomic word loads, from any thread.
unsafe impl Send for SqMirror {}
// SAFETY: as above.
unsafe impl Sync for SqMirror {}

impl SqMirror {
    /// A mirror in `slot` of its copier: the ring's copy is the `len` bytes at `bytes` (8-byte aligned, a
    /// multiple of 64), the count the aligned word at `count`.
    ///
    /// # Safety
    /// Both must stay valid, and be written by their copier with aligned word stores only, until the mirror
    /// is given back to [`GpuCopier::unmirror_sq`] or the copier is dropped.
    pub unsafe fn new(slot: u32, bytes: *const u8, len: usize, count: *const u64) -> Self {
        Self { slot, bytes, len, count }
    }

    /// The copier's slot of this mirror.
    pub fn slot(&self) -> u32 {
        self.slot
    }

    /// Bytes of the ring's copy.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the copy is empty (never, for a mirror of a ring).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The count (Acquire: the WQEBBs it covers are readable after it).
    pub fn count(&self) -> u64 {
        // SAFETY: an aligned word the copier keeps alive (`new`'s contract), accessed atomically by both sides.
        unsafe { std::sync::atomic::AtomicU64::from_ptr(self.count.cast_mut()) }.load(Ordering::Acquire)
    }

    /// Reads `out.len()` bytes (a multiple of 8) of the copy from byte `off` (8-byte aligned) on, wrapping
    /// past its end to its start as the ring does.
    pub fn read(&self, off: usize, out: &mut [u8]) {
        for (i, chunk) in out.chunks_exact_mut(8).enumerate() {
            let at = (off + i * 8) % self.len;
            // SAFETY: `at` is 8-aligned and inside the copy, which the copier keeps alive (`new`'s contract);
            // the copier writes it with aligned word stores.
            let w = unsafe { std::sync::atomic::AtomicU64::from_ptr(self.bytes.add(at).cast::<u64>().cast_mut()) }
                .load(Ordering::Relaxed);
            chunk.copy_from_slice(&w.to_ne_bytes());
        }
    }
}

/// Bytes one [`GpuCopier::write_async`] takes at most: one CQE.
pub const WRITE_ASYNC_MAX: usize = 64;

/// How the emulated NIC reaches GPU memory: copies, small writes and atomics, run later but in the order they
/// were enqueued (each one's bytes are in place before the next one starts; by QP, see
/// [`GpuCopier::order_by`]), without waiting for kernels
/// that spin on what they write, started at the latest by [`GpuCopier::submit`] or a synchronize. Two implementations: CUDA ([`crate::cuda::CudaCopier`]: a resident engine
/// kernel for small operations and the copy engines for large copies) and the simulated GPU of the `cpu`
/// executor ([`crate::nic::emu::SimGpu`]).
pub trait GpuCopier: Send + Sync {
    /// Enqueues a copy of `len` bytes from `src` to `dst` (at least one of them GPU memory).
    ///
    /// Bytes a copy reads from host memory into GPU memory are taken when it is enqueued: the source may be
    /// reused as soon as the call returns, and must not be the destination of an earlier copy still pending.
    ///
    /// # Safety
    /// Both ranges must be valid for `len` bytes until [`GpuCopier::synchronize`] returns (a host source only
    /// until this call returns).
    ///
    /// # Errors
    /// The CUDA driver's error.
    unsafe fn copy_async(&self, dst: MemLoc, src: MemLoc, len: usize) -> Result<()>;

    /// Enqueues a write of `data` (at most [`WRITE_ASYNC_MAX`] bytes, taken now) to `dst`: GPU memory, or
    /// queue memory mapped into the GPU named by its device address ([`MappedBuf::device_addr`], given as
    /// [`MemKind::Gpu`]: the emulated NIC writes CQEs into host-memory CQs this way behind pending copies).
    ///
    /// With `publish`, the last 8 bytes (8-byte aligned in memory) are stored in one piece, after the
    /// others and after every earlier operation's bytes are visible to device code at system scope: how a
    /// CQE's last word (with the owner bit) makes the entry valid.
    ///
    /// # Safety
    /// `dst` must be valid for `data.len()` bytes until [`GpuCopier::synchronize`] returns.
    ///
    /// # Errors
    /// [`crate::Error::InvalidArgument`] for more than [`WRITE_ASYNC_MAX`] bytes, host memory at `dst`, or a
    /// `publish` whose last word is not 8-byte aligned; the CUDA driver's error.
    unsafe fn write_async(&self, dst: MemLoc, data: &[u8], publish: bool) -> Result<()>;

    /// Enqueues `op` on the 8-byte, 8-byte-aligned word of GPU memory at `at`, after every earlier
    /// operation's bytes are visible to device code; the old value goes to the 8 bytes of GPU memory at
    /// `result`. Atomic towards device code's atomics on the same word (a real GPU atomic, or an atomic host
    /// access on the simulated GPU).
    ///
    /// # Safety
    /// Both must be valid for 8 bytes until [`GpuCopier::synchronize`] returns.
    ///
    /// # Errors
    /// [`crate::Error::InvalidArgument`] for host memory or a misaligned `at`; the CUDA driver's error.
    unsafe fn atomic_async(&self, at: MemLoc, op: AtomicOp, result: MemLoc) -> Result<()>;

    /// Waits until every enqueued operation has completed.
    ///
    /// # Errors
    /// The CUDA driver's error (e.g. a copy faulted).
    fn synchronize(&self) -> Result<()>;

    /// Names the QP whose operations the calling thread enqueues from now on (until its next call; `None`: no
    /// QP, the default). An operation of a QP need follow only the earlier operations of the same QP and
    /// those enqueued without one, where an untagged operation follows every earlier one: RC orders a QP's
    /// own operations, not one QP's against another's. The emulated NIC's thread names each QP before it
    /// takes the QP's WQEs. Operations of other threads stay untagged. The default keeps one order for all,
    /// which is also correct.
    fn order_by(&self, qp: Option<u32>) {
        let _ = qp;
    }

    /// How often the operations so far changed the way they reach the GPU (for the CUDA copier: between its
    /// engine and its copy-engine stream), a running count; 0 for a copier with one way, the default. The
    /// emulated NIC's thread leaves a QP for the others after a WQE that changed the way, so that the next
    /// QPs' operations of that way go together with it.
    fn way_changes(&self) -> u64 {
        0
    }

    /// Starts every operation enqueued so far. An implementation may hold small operations back to hand
    /// them to the GPU in batches (the CUDA copier's engine takes eight commands per turn); it starts them
    /// at a synchronize, once a batch is full, or here. The emulated NIC calls this at the end of each pass
    /// of its thread. The default does nothing (every operation starts when enqueued).
    ///
    /// # Errors
    /// The CUDA driver's error.
    fn submit(&self) -> Result<()> {
        Ok(())
    }

    /// The address at which this copier's operations reach the `len` bytes of host memory at `addr`, given as
    /// [`MemKind::Gpu`], when that memory is pinned and mapped into the GPU (`cuMemHostGetDevicePointer`):
    /// so that the emulated NIC can run its atomics on such memory on the GPU, in order behind its other GPU
    /// operations, instead of waiting for them on the host. `None` for memory the GPU cannot reach (pageable
    /// host memory), the default.
    fn device_view(&self, addr: u64, len: u64) -> Option<u64> {
        let _ = (addr, len);
        None
    }

    /// Starts mirroring the SQ ring `sq` into host memory: from now on, each time the dbrec's SQ counter
    /// moves, the copier copies the WQEBBs it passed into the mirror and then advances the mirror's count,
    /// without being asked, so that the emulated NIC finds a rung WQE in host memory instead of fetching it
    /// from the GPU after the doorbell (one GPU round trip less per doorbell). `None` when this copier
    /// cannot (the default, and when its mirror slots are taken).
    fn mirror_sq(&self, sq: SqWatch) -> Option<SqMirror> {
        let _ = sq;
        None
    }

    /// Whether the copier's mirrors are advancing now (on the CUDA copier, whether its engine runs). A
    /// reader that waits for a mirror's count waits only while this holds.
    fn mirrors_running(&self) -> bool {
        false
    }

    /// Tells the mirror that its ring is at producer count `base` (after its reader took WQEBBs another way
    /// while the mirror fell behind by more than its 16-bit counter can tell).
    fn rebase_sq_mirror(&self, mirror: &SqMirror, base: u64) {
        let _ = (mirror, base);
    }

    /// Stops `mirror`; once this returns the copier no longer reads the ring or dbrec it named, and its
    /// memory goes back to the copier.
    fn unmirror_sq(&self, mirror: SqMirror) {
        let _ = mirror;
    }

    /// Whether device code runs on a GPU of its own (not on host threads) while this copier serves the
    /// emulated NIC: then the NIC's thread may spin on a host core between doorbells without taking it from
    /// device code. `true`, the default, for a real GPU; `false` for [`SimGpu`](crate::nic::emu::SimGpu),
    /// whose device code runs on the `cpu` executor's threads.
    fn device_code_on_gpu(&self) -> bool {
        true
    }

    /// Allocates `len` zeroed bytes of GPU memory (at least 256-byte aligned), for queues the emulated NIC
    /// keeps in GPU memory ([`EmuConfig::queues`](crate::nic::emu::EmuConfig::queues)); freed when the
    /// result is dropped.
    ///
    /// # Errors
    /// Out of memory, or the CUDA driver's error.
    fn alloc(&self, len: usize) -> Result<GpuMem>;
}

/// The argument checks of [`GpuCopier::write_async`], shared by both implementations.
pub(crate) fn check_write(dst: MemLoc, len: usize, publish: bool) -> Result<()> {
    if len > WRITE_ASYNC_MAX || dst.kind != MemKind::Gpu {
        return Err(crate::Error::InvalidArgument(format!(
            "write of {len} bytes to {:?} memory at {:#x}: at most {WRITE_ASYNC_MAX} bytes, to GPU memory",
            dst.kind, dst.addr
        )));
    }
    if publish && (len < 8 || !(dst.addr + len as u64 - 8).is_multiple_of(8)) {
        return Err(crate::Error::InvalidArgument(format!(
            "published write of {len} bytes at {:#x}: its last 8 bytes must be one aligned word",
            dst.addr
        )));
    }
    Ok(())
}

/// The argument checks of [`GpuCopier::atomic_async`], shared by both implementations.
pub(crate) fn check_atomic(at: MemLoc, result: MemLoc) -> Result<()> {
    if at.kind != MemKind::Gpu || result.kind != MemKind::Gpu || !at.addr.is_multiple_of(8) {
        return Err(crate::Error::InvalidArgument(format!(
            "atomic on {:?} memory at {:#x} (result to {:?} memory): both in GPU memory, the word 8-byte aligned",
            at.kind, at.addr, result.kind
        )));
    }
    Ok(())
}

/// A buffer of GPU memory from [`GpuCopier::alloc`]: an address that device code uses and the copier copies
/// to and from, never dereferenced by host code. Freed when dropped (by `owner`).
pub struct GpuMem {
    addr: u64,
    len: usize,
    _owner: Box<dyn Any + Send + Sync>,
}

impl GpuMem {
    /// Wraps an allocation of `len` bytes at GPU address `addr`, which `owner` frees when dropped.
    pub fn new(addr: u64, len: usize, owner: Box<dyn Any + Send + Sync>) -> Self {
        Self { addr, len, _owner: owner }
    }

    /// The GPU address of the first byte.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The byte at offset `off` as the copier addresses it.
    pub fn loc(&self, off: usize) -> MemLoc {
        MemLoc { kind: MemKind::Gpu, addr: self.addr + off as u64 }
    }
}

impl std::fmt::Debug for GpuMem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuMem").field("addr", &format_args!("{:#x}", self.addr)).field("len", &self.len).finish()
    }
}

/// Queue memory from the global allocator, for the `cpu` executor (device code runs on host threads).
#[derive(Debug, Default, Clone, Copy)]
pub struct HostQueueMemory;

struct HostAlloc {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}

// SAFETY: the allocation is owned by this value alone; it is only freed, from whichever thread drops it.
unsafe impl Send for HostAlloc {}
// SAFETY: `HostAlloc` exposes nothing; sharing it shares no access.
unsafe impl Sync for HostAlloc {}

impl Drop for HostAlloc {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `alloc_zeroed` with this `layout` and is freed once.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) }
    }
}

impl QueueMemory for HostQueueMemory {
    fn alloc(&self, len: usize) -> Result<MappedBuf> {
        let layout = std::alloc::Layout::from_size_align(len.max(1), 4096)
            .map_err(|_| crate::Error::InvalidArgument(format!("queue buffer of {len} bytes is too large")))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(crate::Error::OutOfMemory(len));
        }
        let owner = Box::new(HostAlloc { ptr, layout });
        // SAFETY: `ptr` is `len` zeroed bytes, 4096-aligned, alive while `owner` lives; host threads use the
        // same address as device code.
        Ok(unsafe { MappedBuf::from_raw(ptr, ptr as u64, len, owner) })
    }
}
