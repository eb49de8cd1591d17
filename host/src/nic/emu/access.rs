//! The executor's data path: moves bytes between resolved MR ranges, in host memory directly and in GPU
//! memory through the configured [`GpuCopier`], and keeps the PRM's ordering across the two.
//!
//! GPU copies are enqueued (asynchronous, on the copier's own non-blocking stream) and only waited for when
//! something must be ordered after them: a direct host access (which would otherwise overtake them), an
//! atomic or RDMA READ of the same QP, and every CQE. Call [`DataPath::fence`] before those; the helpers here
//! call it themselves before any direct host access.

use std::sync::Arc;

use crate::mem::{GpuCopier, MemKind, MemLoc};

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

/// Moves data for the executor thread. Not shared: one per executor.
pub(crate) struct DataPath {
    gpu: Option<Arc<dyn GpuCopier>>,
    /// GPU copies were enqueued since the last synchronize.
    pending: bool,
    /// Host sources and destinations of pending GPU copies that this type owns (inline data, atomic
    /// operands); they must live until the copies complete.
    staging: Vec<Box<[u8]>>,
}

impl DataPath {
    /// A data path that reaches GPU memory through `gpu`, if any.
    pub(crate) fn new(gpu: Option<Arc<dyn GpuCopier>>) -> Self {
        Self { gpu, pending: false, staging: Vec::new() }
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
        self.staging.clear();
        r.map_err(|e| {
            tracing::warn!("emulated NIC: GPU copy failed: {e}");
            Fault::gpu_copy()
        })
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
        let stage: Box<[u8]> = data.into();
        let src = MemLoc { kind: MemKind::Host, addr: stage.as_ptr() as u64 };
        // SAFETY: `dst` as the caller promises; `stage` is kept in `self.staging` until the next
        // synchronize, so the source stays valid (a boxed slice does not move when the Vec grows).
        unsafe { g.copy_async(dst, src, data.len()) }.map_err(|_| Fault::gpu_copy())?;
        self.staging.push(stage);
        self.pending = true;
        Ok(())
    }

    /// Applies `op` to the 8-byte, 8-byte-aligned word at `at` and returns the old value (host order).
    ///
    /// Earlier writes of this executor are placed first. In host memory the operation is a real atomic
    /// (SeqCst), atomic also towards device code on host threads. In GPU memory it is a read, a synchronize
    /// and a write through the copier: atomic towards other operations of this NIC only.
    ///
    /// # Safety
    /// As [`DataPath::copy`] for `at` and 8 bytes; `at.addr` is 8-byte aligned.
    pub(crate) unsafe fn atomic(&mut self, at: MemLoc, op: AtomicOp) -> Result<u64, Fault> {
        self.fence()?;
        if at.kind == MemKind::Host {
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
        let mut word = Box::new([0u8; 8]);
        let host = MemLoc { kind: MemKind::Host, addr: word.as_mut_ptr() as u64 };
        // SAFETY: `at` as the caller promises; `word` lives until the synchronize below returns.
        unsafe { g.copy_async(host, at, 8) }.map_err(|_| Fault::gpu_copy())?;
        g.synchronize().map_err(|_| Fault::gpu_copy())?;
        let old = u64::from_ne_bytes(*word);
        *word = op.apply(old).to_ne_bytes();
        // SAFETY: as above.
        unsafe { g.copy_async(at, host, 8) }.map_err(|_| Fault::gpu_copy())?;
        g.synchronize().map_err(|_| Fault::gpu_copy())?;
        Ok(old)
    }
}
