//! The executor's data path: moves bytes between resolved MR ranges, in host memory directly and in GPU
//! memory through the configured [`GpuCopier`], and keeps the PRM's ordering across the two.
//!
//! GPU operations are enqueued (the copier runs them in order, without waiting for kernels) and only waited
//! for when something must be ordered after them that does not go through the copier: a direct host access
//! (which would otherwise overtake them) and the old value of an atomic that must go back over the wire. A
//! CQE in GPU memory and an atomic whose word and result are in GPU memory go through
//! the copier behind the operations they follow, with no wait; so does a CQE into a CQ in host memory while
//! operations are pending (the copier writes it through the memory's device address). Call
//! [`DataPath::fence`] before the others; the helpers here call it themselves before any direct host access.
//!
//! An atomic whose old value goes back over the wire need not be waited for when it is applied either
//! ([`DataPath::atomic_deferred`]): the copier's atomic leaves the old value in a slot of a scratch array in
//! GPU memory and a copy behind it brings it into the same slot of a host array; the answer holds the slot
//! ([`Old::Pending`]) until it is encoded, and one [`DataPath::fence`] then resolves every slot enqueued before
//! it ([`DataPath::take_old`]). So a responder that applies a batch of atomics waits once for all of them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

pub(crate) use crate::mem::AtomicOp;
use crate::mem::{GpuCopier, MemKind, MemLoc, PeerMapping, SqMirror, SqWatch, EXPORT_HANDLE_BYTES, WRITE_ASYNC_MAX};

use super::fault::Fault;
use super::hostmem;
use super::qmem::QBuf;

/// Moves data for the executor thread. Not shared: one per executor.
/// The host's waits on the GPU: what the emulated NIC's thread spent not executing WQEs (see
/// [`Stats::host_syncs`](super::Stats::host_syncs)).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Waits {
    /// Synchronizes with the copier (each waits for every operation enqueued before it).
    pub syncs: u64,
    /// Nanoseconds spent in them.
    pub sync_ns: u64,
    /// Nanoseconds spent fetching SQ ranges in GPU memory (their synchronize included).
    pub fetch_ns: u64,
}

/// Slots for old values of atomics in GPU memory not waited for yet ([`DataPath::atomic_deferred`]), the
/// spare included. A responder resolves its slots at least once per pass of the executor (`RespState::resolve`),
/// and a pass takes at most 256 inbound requests: these cover several passes' worth.
const OLD_SLOTS: usize = 1024;
/// The slot an atomic takes when every other slot is held: it is waited for at once, so it is never held.
const SPARE_SLOT: usize = OLD_SLOTS - 1;
/// Bytes of GPU scratch memory a [`DataPath`] needs for its old-value slots (8 per slot).
pub(crate) const SCRATCH_BYTES: usize = OLD_SLOTS * 8;

/// The old value of an atomic, as its answer holds it: known already, or in a slot of the data path that
/// the next [`DataPath::fence`] fills ([`DataPath::take_old`] gives it, [`DataPath::drop_old`] gives the slot
/// back unread). Not `Clone`: each pending slot has one holder, who takes or drops it exactly once.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Old {
    /// The value (the atomic ran on the host, or was waited for at once).
    Known(u64),
    /// The slot its copy from GPU memory lands in.
    Pending(OldSlot),
}

/// A slot of [`DataPath`]'s old-value arrays, held by one [`Old::Pending`].
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct OldSlot(usize);

/// One bit per old-value slot.
type SlotBits = [u64; OLD_SLOTS / 64];

fn bit_get(b: &SlotBits, i: usize) -> bool {
    b[i / 64] & (1 << (i % 64)) != 0
}

fn bit_set(b: &mut SlotBits, i: usize, on: bool) {
    if on {
        b[i / 64] |= 1 << (i % 64);
    } else {
        b[i / 64] &= !(1 << (i % 64));
    }
}

/// Where the old values of deferred atomics land (see [`DataPath::atomic_deferred`]), and which slots are
/// held, not yet landed, or lost to a failed wait.
struct Olds {
    /// The host array the copier copies slot `i`'s old value into; written by the copier (from another
    /// thread, or at the synchronize) until the next synchronize, so read only after it and only per slot.
    host: Box<[AtomicU64]>,
    /// Held by an answer (never the spare).
    held: SlotBits,
    /// Copied into `host` by an operation not waited for yet.
    unfenced: SlotBits,
    /// Their wait failed: the value never arrived.
    failed: SlotBits,
    /// Where the round-robin search for a free slot starts.
    next: usize,
}

impl Olds {
    fn new() -> Self {
        let host = (0..OLD_SLOTS).map(|_| AtomicU64::new(0)).collect();
        Self { host, held: [0; OLD_SLOTS / 64], unfenced: [0; OLD_SLOTS / 64], failed: [0; OLD_SLOTS / 64], next: 0 }
    }

    /// The next slot no answer holds, round robin from the last one taken (so that a slot given back unread,
    /// whose copy may still be pending, is reused last); the spare when every slot is held.
    fn free(&mut self) -> usize {
        for k in 0..SPARE_SLOT {
            let i = (self.next + k) % SPARE_SLOT;
            if !bit_get(&self.held, i) {
                self.next = (i + 1) % SPARE_SLOT;
                return i;
            }
        }
        SPARE_SLOT
    }

    /// A synchronize ended (`ok`: without an error): every slot copied before it has landed, or never will.
    fn landed(&mut self, ok: bool) {
        for (u, f) in self.unfenced.iter_mut().zip(self.failed.iter_mut()) {
            if !ok {
                *f |= *u;
            }
            *u = 0;
        }
    }
}

pub(crate) struct DataPath {
    gpu: Option<Arc<dyn GpuCopier>>,
    /// GPU operations were enqueued since the last synchronize.
    pending: bool,
    /// What the host has waited for so far ([`Waits`]).
    waits: Waits,
    /// [`SCRATCH_BYTES`] of GPU memory: word `i` is where an atomic in slot `i` leaves its old value (see
    /// [`DataPath::atomic_deferred`]); none without a copier.
    scratch: Option<QBuf>,
    /// The host side of the old-value slots.
    olds: Olds,
}

impl DataPath {
    /// A data path that reaches GPU memory through `gpu`, if any, with `scratch` (at least
    /// [`SCRATCH_BYTES`] of GPU memory) for atomics whose old value is read back.
    pub(crate) fn new(gpu: Option<Arc<dyn GpuCopier>>, scratch: Option<QBuf>) -> Self {
        Self { gpu, pending: false, scratch, waits: Waits::default(), olds: Olds::new() }
    }

    /// What the host has waited for so far.
    pub(crate) fn waits(&self) -> Waits {
        self.waits
    }

    /// A mirror of the SQ ring `sq` in host memory, if the copier keeps one ([`GpuCopier::mirror_sq`]).
    pub(crate) fn mirror_sq(&self, sq: SqWatch) -> Option<SqMirror> {
        self.gpu.as_ref()?.mirror_sq(sq)
    }

    /// Whether the copier's mirrors advance now ([`GpuCopier::mirrors_running`]).
    pub(crate) fn mirrors_running(&self) -> bool {
        self.gpu.as_ref().is_some_and(|g| g.mirrors_running())
    }

    /// [`GpuCopier::rebase_sq_mirror`].
    pub(crate) fn rebase_sq_mirror(&self, m: &SqMirror, base: u64) {
        if let Some(g) = &self.gpu {
            g.rebase_sq_mirror(m, base);
        }
    }

    /// [`GpuCopier::unmirror_sq`].
    pub(crate) fn unmirror_sq(&self, m: SqMirror) {
        if let Some(g) = &self.gpu {
            g.unmirror_sq(m);
        }
    }

    /// Starts the GPU operations enqueued so far ([`GpuCopier::submit`]); a failure is logged, and shows at
    /// the next wait.
    pub(crate) fn submit(&self) {
        if let Some(Err(e)) = self.gpu.as_ref().map(|g| g.submit()) {
            tracing::warn!("emulated NIC: starting GPU operations failed: {e}");
        }
    }

    /// Tags the GPU operations this thread enqueues from now on with QP `qp` ([`GpuCopier::order_by`]).
    pub(crate) fn order_by(&self, qp: Option<u32>) {
        if let Some(g) = &self.gpu {
            g.order_by(qp);
        }
    }

    /// [`GpuCopier::way_changes`] (0 without a copier).
    pub(crate) fn way_changes(&self) -> u64 {
        self.gpu.as_ref().map_or(0, |g| g.way_changes())
    }

    /// Where the peer allocation `handle` is mapped, if this NIC's copier mapped it
    /// ([`GpuCopier::imported`]).
    pub(crate) fn imported(&self, handle: &[u8; EXPORT_HANDLE_BYTES]) -> Option<PeerMapping> {
        self.gpu.as_ref()?.imported(handle)
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
        let t0 = Instant::now();
        let r = match &self.gpu {
            Some(g) => g.synchronize(),
            None => Ok(()),
        };
        self.olds.landed(r.is_ok());
        self.waits.syncs += 1;
        self.waits.sync_ns += t0.elapsed().as_nanos() as u64;
        r.map_err(|e| {
            tracing::warn!("emulated NIC: GPU copy failed: {e}");
            Fault::gpu_copy()
        })
    }

    /// The copier of `gpu` (a `DataPath`'s field, borrowed alone so that the others stay writable while it is
    /// used, with no reference count taken per operation).
    fn copier(gpu: &Option<Arc<dyn GpuCopier>>) -> Result<&dyn GpuCopier, Fault> {
        // An MR in GPU memory can only be registered with a copier, so this is unreachable in practice.
        gpu.as_deref().ok_or(Fault::gpu_copy())
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
        let g = Self::copier(&self.gpu)?;
        let n = usize::try_from(len).map_err(|_| Fault::gpu_copy())?;
        // SAFETY: both ranges are registered and stay valid until the next synchronize (caller's contract).
        unsafe { g.copy_async(dst, src, n) }.map_err(|_| Fault::gpu_copy())?;
        self.pending = true;
        Ok(())
    }

    /// Copies `len` bytes at byte `offset` of the peer allocation `handle` (mapped by this NIC's copier) to
    /// `dst` ([`GpuCopier::copy_from_peer_async`]), in order with the other copies.
    ///
    /// # Safety
    /// As [`DataPath::copy`] for `dst`; `offset + len` within the mapping.
    pub(crate) unsafe fn copy_from_peer(
        &mut self,
        dst: MemLoc,
        from: (&[u8; EXPORT_HANDLE_BYTES], u64),
        len: u64,
    ) -> Result<(), Fault> {
        if len == 0 {
            return Ok(());
        }
        let g = Self::copier(&self.gpu)?;
        let n = usize::try_from(len).map_err(|_| Fault::gpu_copy())?;
        // SAFETY: the caller's contract.
        unsafe { g.copy_from_peer_async(dst, from, n) }.map_err(|_| Fault::gpu_copy())?;
        self.pending = true;
        Ok(())
    }

    /// Writes `data` to `dst`: into GPU memory as copier writes of at most 64 bytes (up to 256 bytes), else
    /// as one copy whose host bytes the copier takes at once, so `data` may be reused when this returns.
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
        let g = Self::copier(&self.gpu)?;
        if data.len() > 4 * WRITE_ASYNC_MAX {
            let src = MemLoc { kind: MemKind::Host, addr: data.as_ptr() as u64 };
            // SAFETY: `dst` as the caller promises; the copier takes the host bytes before it returns.
            unsafe { g.copy_async(dst, src, data.len()) }.map_err(|_| Fault::gpu_copy())?;
            self.pending = true;
            return Ok(());
        }
        for (i, chunk) in data.chunks(WRITE_ASYNC_MAX).enumerate() {
            let to = MemLoc { kind: dst.kind, addr: dst.addr + (i * WRITE_ASYNC_MAX) as u64 };
            // SAFETY: `to` is inside `dst` as the caller promises; the bytes are taken now.
            unsafe { g.write_async(to, chunk, false) }.map_err(|_| Fault::gpu_copy())?;
            self.pending = true;
        }
        Ok(())
    }

    /// Writes one CQE (or any `data` of at most [`WRITE_ASYNC_MAX`] bytes whose last 8 bytes are an aligned
    /// word) into GPU memory at `dst`, its last word stored last and after every earlier operation's bytes
    /// are visible. No wait.
    ///
    /// # Safety
    /// As [`DataPath::copy`] for `dst` and `data.len()` bytes.
    pub(crate) unsafe fn publish(&mut self, dst: MemLoc, data: &[u8]) -> Result<(), Fault> {
        let g = Self::copier(&self.gpu)?;
        // SAFETY: the caller's contract.
        unsafe { g.write_async(dst, data, true) }.map_err(|_| Fault::gpu_copy())?;
        self.pending = true;
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
        let g = Self::copier(&self.gpu)?;
        let dst = MemLoc { kind: MemKind::Host, addr: out.as_mut_ptr() as u64 };
        // SAFETY: `src` as the caller promises; `out` is borrowed exclusively until the fence below.
        unsafe { g.copy_async(dst, src, out.len()) }.map_err(|_| Fault::gpu_copy())?;
        self.pending = true;
        self.fence()
    }

    /// Reads queue memory in GPU memory (a ring range, a dbrec word) into each `out` buffer: one copy per
    /// buffer straight into it, then one synchronize for all of them (which also completes every copy
    /// enqueued before). Device code wrote these bytes before it rang the doorbell the caller acts on, so no
    /// earlier copy of this executor needs to precede them.
    ///
    /// Queue memory is owned by the QP or CQ the executor holds while it runs, so it outlives the copies.
    pub(crate) fn fetch(&mut self, reads: &mut [(MemLoc, &mut [u8])]) -> Result<(), Fault> {
        let t0 = Instant::now();
        let r = self.fetch_into(reads);
        self.waits.fetch_ns += t0.elapsed().as_nanos() as u64;
        r
    }

    fn fetch_into(&mut self, reads: &mut [(MemLoc, &mut [u8])]) -> Result<(), Fault> {
        let g = Self::copier(&self.gpu)?;
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

    /// Applies `op` to the 8-byte, 8-byte-aligned word at `at` and returns the old value (host order), waiting
    /// for it if it comes from GPU memory: [`DataPath::atomic_deferred`], then [`DataPath::take_old`].
    ///
    /// # Safety
    /// As [`DataPath::atomic_deferred`].
    pub(crate) unsafe fn atomic(&mut self, at: MemLoc, op: AtomicOp) -> Result<u64, Fault> {
        // SAFETY: the caller's contract.
        let old = unsafe { self.atomic_deferred(at, op) }?;
        self.take_old(old)
    }

    /// Applies `op` to the 8-byte, 8-byte-aligned word at `at`, for a responder that sends the old value back
    /// over the wire, without waiting for it: the answer holds the [`Old`] until it is encoded.
    ///
    /// Earlier writes of this executor are placed first. In host memory the operation is a real atomic
    /// (SeqCst), atomic also towards device code on host threads, and its old value is [`Old::Known`]. In GPU
    /// memory it is the copier's atomic, enqueued behind the earlier operations with its old value left in
    /// a scratch slot and copied into the host array behind it: [`Old::Pending`], resolved by the next
    /// [`DataPath::fence`]. A slot is reused only once its holder gave it back; one whose copy may still be
    /// pending (given back unread) is waited for first. When every slot is held the atomic takes the spare
    /// slot and is waited for at once ([`Old::Known`]).
    ///
    /// # Safety
    /// As [`DataPath::copy`] for `at` and 8 bytes; `at.addr` is 8-byte aligned.
    pub(crate) unsafe fn atomic_deferred(&mut self, at: MemLoc, op: AtomicOp) -> Result<Old, Fault> {
        if at.kind == MemKind::Host {
            self.fence()?;
            // SAFETY: registered, aligned host word (caller's contract).
            return Ok(Old::Known(unsafe { host_atomic(at.addr, op) }));
        }
        let slot = self.olds.free();
        if bit_get(&self.olds.unfenced, slot) {
            // Two pending copies into one host word: the first one's value would be lost.
            self.fence()?;
        }
        let g = Self::copier(&self.gpu)?;
        let scratch = self.scratch.as_ref().ok_or(Fault::gpu_copy())?.loc(slot * 8);
        let host = MemLoc { kind: MemKind::Host, addr: self.olds.host[slot].as_ptr() as u64 };
        // SAFETY: `at` as the caller promises; the scratch word (inside the `SCRATCH_BYTES` of `scratch`) and
        // the host word live as long as `self`, which waits for the copier before it is dropped (the
        // executor fences at its end); no earlier copy into the host word is pending (waited for above).
        unsafe { g.atomic_async(at, op, scratch) }.map_err(|_| Fault::gpu_copy())?;
        // SAFETY: as above.
        unsafe { g.copy_async(host, scratch, 8) }.map_err(|_| Fault::gpu_copy())?;
        self.pending = true;
        bit_set(&mut self.olds.unfenced, slot, true);
        bit_set(&mut self.olds.failed, slot, false);
        if slot == SPARE_SLOT {
            return self.take_old(Old::Pending(OldSlot(slot))).map(Old::Known);
        }
        bit_set(&mut self.olds.held, slot, true);
        Ok(Old::Pending(OldSlot(slot)))
    }

    /// The value of `old`: for a pending slot, after one [`DataPath::fence`] unless one already followed
    /// its atomic (so a batch of slots costs one wait); the slot is free again.
    ///
    /// # Errors
    /// [`Fault::gpu_copy`] when the wait that was to bring the value failed.
    pub(crate) fn take_old(&mut self, old: Old) -> Result<u64, Fault> {
        let slot = match old {
            Old::Known(v) => return Ok(v),
            Old::Pending(OldSlot(slot)) => slot,
        };
        bit_set(&mut self.olds.held, slot, false);
        if bit_get(&self.olds.unfenced, slot) {
            if let Err(f) = self.fence() {
                bit_set(&mut self.olds.failed, slot, false);
                return Err(f);
            }
        }
        if bit_get(&self.olds.failed, slot) {
            bit_set(&mut self.olds.failed, slot, false);
            return Err(Fault::gpu_copy());
        }
        // After the synchronize that completed the copy into it (the copier's completion happens before
        // the synchronize returns), and nothing writes this word until the slot is taken again.
        Ok(self.olds.host[slot].load(Ordering::Relaxed))
    }

    /// Gives back `old`'s slot unread (its answer will not be sent). Its copy may still be pending: the slot
    /// is waited for before it is reused.
    pub(crate) fn drop_old(&mut self, old: Old) {
        if let Old::Pending(OldSlot(slot)) = old {
            bit_set(&mut self.olds.held, slot, false);
        }
    }

    /// Applies `op` to the word at `at` and writes the old value (host order) to the 8 bytes at `result`,
    /// both after every earlier placement of this executor. With both in GPU memory this is one copier atomic
    /// and no wait; otherwise the old value is read ([`DataPath::atomic`]) and written.
    ///
    /// # Safety
    /// As [`DataPath::copy`] for `at` and `result`, 8 bytes each; `at.addr` is 8-byte aligned.
    pub(crate) unsafe fn atomic_into(&mut self, at: MemLoc, op: AtomicOp, result: MemLoc) -> Result<(), Fault> {
        if at.kind == MemKind::Gpu && result.kind == MemKind::Gpu {
            let g = Self::copier(&self.gpu)?;
            // SAFETY: the caller's contract.
            unsafe { g.atomic_async(at, op, result) }.map_err(|_| Fault::gpu_copy())?;
            self.pending = true;
            return Ok(());
        }
        // SAFETY: the caller's contract.
        let old = unsafe { self.atomic(at, op) }?;
        // SAFETY: the caller's contract.
        unsafe { self.write_bytes(result, &old.to_ne_bytes()) }
    }
}

/// A SeqCst host atomic on the word at `addr`; returns the old value.
///
/// # Safety
/// `addr` is a registered, 8-byte aligned host word.
unsafe fn host_atomic(addr: u64, op: AtomicOp) -> u64 {
    use std::sync::atomic::Ordering::SeqCst;
    // SAFETY: the caller's contract.
    let word = unsafe { hostmem::atomic_u64(addr) };
    match op {
        AtomicOp::FetchAdd(add) => word.fetch_add(add, SeqCst),
        AtomicOp::CompareSwap { compare, swap } => match word.compare_exchange(compare, swap, SeqCst, SeqCst) {
            Ok(v) | Err(v) => v,
        },
    }
}
