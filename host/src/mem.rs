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

/// Bytes of an export handle ([`PeerExport::handle`]): the size of CUDA's `CUipcMemHandle`.
pub const EXPORT_HANDLE_BYTES: usize = 64;

/// GPU memory of this process made reachable by another process on the same host
/// ([`GpuCopier::export`]): the handle of the allocation holding it (for the CUDA copier, the
/// `CUipcMemHandle` of `cuIpcGetMemHandle`), and the memory's byte offset in that allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerExport {
    /// Names the allocation to [`GpuCopier::import`] in the other process.
    pub handle: [u8; EXPORT_HANDLE_BYTES],
    /// Byte offset of the exported memory in the allocation.
    pub offset: u64,
}

/// Where another process's exported allocation ([`PeerExport`]) is mapped in this one
/// ([`GpuCopier::import`]): GPU memory at `base`, `len` bytes, that this copier's copies may read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerMapping {
    /// First byte of the mapping (a `CUdeviceptr`, [`MemKind::Gpu`]).
    pub base: u64,
    /// Length of the mapped allocation, bytes.
    pub len: u64,
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
/// ([`GpuCopier::mirror_sq`]): a tagged copy of the ring, then a 64-bit count.
///
/// Each WQEBB takes [`SqMirror::WQEBB_BYTES`] (128) bytes: its sixteen 4-byte words, each stored as one aligned
/// 8-byte word whose low half is the WQE word (bytes `4k..4k + 4` of the WQEBB, as device code wrote them)
/// and whose high half is the tag `producer index + 1` (truncated to 32 bits). A reader takes a WQEBB only
/// when all sixteen words carry its own index's tag, so the copy needs no fence between the bytes and a count:
/// 8-byte aligned stores and loads are single-copy atomic on both sides of PCIe (PTX memory model; x86-64),
/// the ordering NCCL's LL protocol relies on too. A slot holding an older lap's tag is not there yet; one
/// holding a newer lap's tag was overwritten. A fresh mirror's slots are zero (tag 0: never written).
///
/// The count (the producer count copied so far) only tells a restarted copier where to go on and the NIC
/// when to rebase the mirror; it is not ordered with the copy. Valid until [`GpuCopier::unmirror_sq`] or the
/// copier's drop.
#[derive(Clone, Copy, Debug)]
pub struct SqMirror {
    slot: u32,
    words: *const u64,
    wqebbs: u32,
}

// SAFETY: the mirror names host memory that its copier keeps alive and writes only with aligned word stores;
// this type reads it only with atomic word loads, from any thread.
unsafe impl Send for SqMirror {}
// SAFETY: as above.
unsafe impl Sync for SqMirror {}

/// What [`SqMirror::read`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MirrorRead {
    /// Every WQEBB of the range was copied out.
    Done,
    /// The WQEBB at this producer index (and maybe later ones) is not in the mirror yet; the ones before it
    /// were copied out.
    Behind(u64),
    /// A WQEBB of the range was overwritten by a later lap (or the range is longer than the ring): the
    /// mirror no longer holds it.
    Overwritten,
}

impl SqMirror {
    /// Bytes of the mirror per WQEBB: sixteen tagged 8-byte words.
    pub const WQEBB_BYTES: usize = 128;

    /// Bytes of host memory a mirror of a ring of `wqebbs` WQEBBs takes: the tagged copy, then a 64-byte
    /// line whose first word is the count.
    pub fn bytes(wqebbs: u32) -> usize {
        wqebbs as usize * Self::WQEBB_BYTES + 64
    }

    /// The tag of the WQEBB at producer index `idx`.
    fn tag(idx: u64) -> u32 {
        (idx as u32).wrapping_add(1)
    }

    /// The sixteen mirror words of `wqebb`, the WQEBB at producer index `idx` (for copiers on host threads).
    pub fn encode(idx: u64, wqebb: &[u8; 64]) -> [u64; 16] {
        let tag = u64::from(Self::tag(idx)) << 32;
        std::array::from_fn(|k| {
            let w = u32::from_le_bytes([wqebb[4 * k], wqebb[4 * k + 1], wqebb[4 * k + 2], wqebb[4 * k + 3]]);
            tag | u64::from(w)
        })
    }

    /// A mirror in `slot` of its copier, of a ring of `wqebbs` WQEBBs (a power of two), in the
    /// [`SqMirror::bytes`] bytes at `base` (8-byte aligned).
    ///
    /// # Safety
    /// The memory must stay valid, and be written by its copier with aligned 8-byte stores only, until the
    /// mirror is given back to [`GpuCopier::unmirror_sq`] or the copier is dropped.
    pub unsafe fn new(slot: u32, base: *const u8, wqebbs: u32) -> Self {
        Self { slot, words: base.cast(), wqebbs }
    }

    /// The copier's slot of this mirror.
    pub fn slot(&self) -> u32 {
        self.slot
    }

    fn word(&self, i: usize) -> u64 {
        // SAFETY: `i` is inside the mirror's words (callers keep it below `wqebbs * 16 + 8`), an aligned word of
        // memory the copier keeps alive (`new`'s contract), accessed atomically by both sides.
        unsafe { std::sync::atomic::AtomicU64::from_ptr(self.words.add(i).cast_mut()) }.load(Ordering::Relaxed)
    }

    /// The producer count the copier has reached (a hint: not ordered with the copy).
    pub fn count(&self) -> u64 {
        self.word(self.wqebbs as usize * 16)
    }

    /// Copies WQEBBs `from..to` (producer indices) out of the mirror into `ring`, a copy of the whole ring
    /// (`wqebbs * 64` bytes), each at its slot's offset. Stops at the first WQEBB that is not in the mirror.
    /// A WQEBB whose slot lies past the end of a shorter `ring` (or any, for a mirror whose ring size is not
    /// a power of two) is reported as [`MirrorRead::Overwritten`]: not in the mirror for this caller, who
    /// then reads the ring itself.
    pub fn read(&self, from: u64, to: u64, ring: &mut [u8]) -> MirrorRead {
        if !self.wqebbs.is_power_of_two() {
            return MirrorRead::Overwritten;
        }
        let mask = u64::from(self.wqebbs) - 1;
        if to.saturating_sub(from) > mask + 1 {
            return MirrorRead::Overwritten;
        }
        for idx in from..to {
            let slot = (idx & mask) as usize;
            let tag = Self::tag(idx);
            let Some(out) = ring.get_mut(slot * 64..slot * 64 + 64) else { return MirrorRead::Overwritten };
            for k in 0..16 {
                let w = self.word(slot * 16 + k);
                let found = (w >> 32) as u32;
                if found != tag {
                    // A later lap's tag is ahead of ours in wrapping order; an earlier one (or 0) behind.
                    return if (found.wrapping_sub(tag) as i32) > 0 && found != 0 {
                        MirrorRead::Overwritten
                    } else {
                        MirrorRead::Behind(idx)
                    };
                }
                out[4 * k..4 * k + 4].copy_from_slice(&(w as u32).to_le_bytes());
            }
        }
        MirrorRead::Done
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
    /// of its thread, and before building the CQE of a doorbell's last WQE when no other QP has WQEs
    /// waiting (so that the data that WQE moves starts first). The default does nothing (every operation
    /// starts when enqueued).
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
    /// moves, the copier copies the WQEBBs it passed into the mirror, tagged (see [`SqMirror`]), and then
    /// advances the mirror's count, without being asked, so that the emulated NIC finds a rung WQE in host memory instead of fetching it
    /// from the GPU after the doorbell (one GPU round trip less per doorbell). `None` when this copier
    /// cannot (the default, and when its mirror slots are taken).
    fn mirror_sq(&self, sq: SqWatch) -> Option<SqMirror> {
        let _ = sq;
        None
    }

    /// Whether the copier's mirrors are advancing now (on the CUDA copier, whether its engine runs). A
    /// reader that waits for a WQEBB to appear in a mirror waits only while this holds.
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

    /// Makes the `len` bytes of GPU memory at `addr` reachable by another process on this host: the handle of
    /// the allocation holding them and their offset in it, for [`GpuCopier::import`] there. `None` when this
    /// copier cannot (the default), or the range is not inside one allocation that can be exported (for the
    /// CUDA copier: one `cuMemAlloc` allocation; `cuIpcGetMemHandle` refuses others, e.g. `cuMemCreate`'s).
    /// Does not wait for running kernels (measured: `cuIpcGetMemHandle` returns while a kernel spins).
    fn export(&self, addr: u64, len: u64) -> Option<PeerExport> {
        let _ = (addr, len);
        None
    }

    /// Enqueues a copy of `len` bytes at byte `offset` of the peer allocation `handle`, which this copier
    /// mapped ([`GpuCopier::import`]), to `dst`, as [`GpuCopier::copy_async`] does. By default a copy out of
    /// the mapping ([`GpuCopier::imported`]).
    ///
    /// # Safety
    /// `dst` as for [`GpuCopier::copy_async`]; `offset + len` within the mapping.
    ///
    /// # Errors
    /// [`crate::Error::InvalidArgument`] for a handle this copier has not mapped; as
    /// [`GpuCopier::copy_async`].
    unsafe fn copy_from_peer_async(
        &self,
        dst: MemLoc,
        (handle, offset): (&[u8; EXPORT_HANDLE_BYTES], u64),
        len: usize,
    ) -> Result<()> {
        let m = self
            .imported(handle)
            .ok_or_else(|| crate::Error::InvalidArgument("a peer allocation this copier has not mapped".into()))?;
        let src = MemLoc { kind: MemKind::Gpu, addr: m.base + offset };
        // SAFETY: the caller's contract: `dst` valid until the synchronize, the source inside the mapping,
        // which lasts as long as this copier.
        unsafe { self.copy_async(dst, src, len) }
    }

    /// The memory of `export` ([`GpuCopier::export`]) is no longer registered: no peer may read it from now on.
    /// Called once every WRITE the peer copies out of it has been answered (or the wait for the answers gave up
    /// after the wire's retry timeout). Nothing to do by default, and for the CUDA copier, whose peers keep
    /// their mappings until their copiers drop (the exporting process must keep the allocation until then:
    /// [`GpuCopier::import`]); [`SimGpu`](crate::nic::emu::SimGpu), whose handles name this process's own
    /// memory, waits for the copies out of the handle already enqueued and refuses the handle from then on,
    /// as the application may free the memory next.
    fn unexport(&self, export: &PeerExport) {
        let _ = export;
    }

    /// Maps the allocation another process exported ([`GpuCopier::export`]) into this one, so that this
    /// copier's copies can read it as [`MemKind::Gpu`] memory, or returns the mapping made for the same handle
    /// before. A mapping lasts as long as the copier, and the exporting process must not free the allocation
    /// before (CUDA leaves freeing an exported allocation before the importer's `cuIpcCloseMemHandle`
    /// undefined). May wait (the CUDA driver may wait for running kernels): never called on a thread that
    /// device code waits on.
    ///
    /// # Errors
    /// [`crate::Error::Unavailable`] for a copier without this (the default); the CUDA driver's error (a
    /// handle of this process, of another host or container, or of a freed allocation).
    fn import(&self, handle: &[u8; EXPORT_HANDLE_BYTES]) -> Result<PeerMapping> {
        let _ = handle;
        Err(crate::Error::Unavailable("this GPU copier does not map other processes' memory".into()))
    }

    /// The mapping [`GpuCopier::import`] made for `handle`, if it did; never waits.
    fn imported(&self, handle: &[u8; EXPORT_HANDLE_BYTES]) -> Option<PeerMapping> {
        let _ = handle;
        None
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

/// `cpu`-executor kernels that outlived their launch's wait (it timed out, or the `Running` was dropped) and
/// still run. While any does, a dropped [`HostAlloc`] is leaked rather than freed: their threads may still
/// read and write it (the rings, the data, the handles of the launch), and a free under them would crash the
/// process. On the GPU a free waits for running kernels instead (`cuMemFree`); here that wait could last as
/// long as the kernel's own bounded waits, or forever for a kernel that spins without a bound.
static STRAY_KERNELS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Counts a `cpu`-executor kernel that outlived its launch's wait ([`STRAY_KERNELS`]).
pub(crate) fn stray_kernel_started() {
    STRAY_KERNELS.fetch_add(1, Ordering::SeqCst);
}

/// A kernel counted by [`stray_kernel_started`] has ended.
pub(crate) fn stray_kernel_ended() {
    STRAY_KERNELS.fetch_sub(1, Ordering::SeqCst);
}

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
        if STRAY_KERNELS.load(Ordering::SeqCst) != 0 {
            tracing::debug!(bytes = self.layout.size(), "a cpu kernel outlived its launch: memory leaked, not freed");
            return;
        }
        // SAFETY: `ptr` came from `alloc_zeroed` with this `layout` and is freed once.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) }
    }
}

impl QueueMemory for HostQueueMemory {
    fn alloc(&self, len: usize) -> Result<MappedBuf> {
        let layout = std::alloc::Layout::from_size_align(len.max(1), 4096)
            .map_err(|_| crate::Error::InvalidArgument(format!("a host buffer of {len} bytes is too large")))?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A mirror's memory for a ring of `wqebbs` WQEBBs (8-byte aligned, zeroed), and a mirror over it.
    fn mirror(wqebbs: u32) -> (Vec<u64>, SqMirror) {
        let mem = vec![0u64; SqMirror::bytes(wqebbs) / 8];
        // SAFETY: the vector outlives every use in the test and is written only before reads (no other thread).
        let m = unsafe { SqMirror::new(0, mem.as_ptr().cast(), wqebbs) };
        (mem, m)
    }

    /// What a copier does: the tagged words of WQEBB `idx` into its slot.
    fn store(mem: &mut [u64], wqebbs: u32, idx: u64, wqebb: &[u8; 64]) {
        let slot = (idx & (u64::from(wqebbs) - 1)) as usize;
        mem[slot * 16..slot * 16 + 16].copy_from_slice(&SqMirror::encode(idx, wqebb));
    }

    proptest! {
        /// Every WQEBB stored comes back byte for byte at its slot, across the 32-bit tag's wrap too.
        #[test]
        fn a_stored_range_reads_back_as_written(
            log in 0u32..6,
            base in prop_oneof![any::<u64>().prop_map(|b| b >> 1), Just((1u64 << 32) - 3)],
            data in proptest::collection::vec(any::<[u8; 32]>(), 64),
        ) {
            let wqebbs = 1u32 << log;
            let (mut mem, m) = mirror(wqebbs);
            let n = u64::from(wqebbs);
            let mut want = vec![0u8; wqebbs as usize * 64];
            for (k, idx) in (base..base + n).enumerate() {
                let mut w = [0u8; 64];
                w[..32].copy_from_slice(&data[2 * k]);
                w[32..].copy_from_slice(&data[2 * k + 1]);
                store(&mut mem, wqebbs, idx, &w);
                let slot = (idx % n) as usize;
                want[slot * 64..slot * 64 + 64].copy_from_slice(&w);
            }
            let mut got = vec![0u8; want.len()];
            prop_assert_eq!(m.read(base, base + n, &mut got), MirrorRead::Done);
            prop_assert_eq!(got, want);
        }
    }

    #[test]
    fn a_wqebb_of_another_lap_or_a_torn_one_is_not_taken() {
        let (mut mem, m) = mirror(4);
        let mut ring = vec![0u8; 4 * 64];
        // Never written: behind.
        assert_eq!(m.read(10, 11, &mut ring), MirrorRead::Behind(10));
        // WQEBBs 8 and 9 in place, 10 still holds the lap before (6): the read stops at 10, 8 and 9 copied.
        for idx in [6u64, 8, 9] {
            store(&mut mem, 4, idx, &[idx as u8; 64]);
        }
        assert_eq!(m.read(8, 11, &mut ring), MirrorRead::Behind(10));
        assert_eq!((ring[0], ring[63], ring[64], ring[127]), (8, 8, 9, 9));
        // WQEBB 10 with one word still of the lap before: torn, so behind.
        store(&mut mem, 4, 10, &[10; 64]);
        mem[2 * 16 + 7] = SqMirror::encode(6, &[6; 64])[7];
        assert_eq!(m.read(10, 11, &mut ring), MirrorRead::Behind(10));
        // Slot 2 overwritten by the lap after (14): WQEBB 10 is gone.
        store(&mut mem, 4, 14, &[14; 64]);
        assert_eq!(m.read(10, 11, &mut ring), MirrorRead::Overwritten);
        // A range longer than the ring cannot be in it.
        assert_eq!(m.read(8, 13, &mut ring), MirrorRead::Overwritten);
        // A copy too short for WQEBB 9's slot gets WQEBB 8 only.
        let mut short = vec![0u8; 64];
        assert_eq!(m.read(8, 10, &mut short), MirrorRead::Overwritten);
        assert_eq!(short[0], 8);
    }

    #[test]
    fn each_word_carries_its_wqe_word_low_and_the_tag_high() {
        let mut w = [0u8; 64];
        w.iter_mut().enumerate().for_each(|(i, b)| *b = i as u8);
        let words = SqMirror::encode(0x1_2345_6789, &w);
        assert_eq!(words[0], 0x2345_678a_0302_0100);
        assert_eq!(words[15], 0x2345_678a_3f3e_3d3c);
    }
}
