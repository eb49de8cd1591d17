//! The emulated NIC's copies into and out of GPU memory.

use std::fmt;
use std::sync::Arc;

use cudarc::driver::sys;

use super::driver::check;
use super::stream::Stream;
use super::DeviceBuffer;
use crate::mem::{GpuCopier, GpuMem, MemKind, MemLoc};
use crate::{Error, Result};

/// [`GpuCopier`] on its own `CU_STREAM_NON_BLOCKING` stream ([`super::Gpu::copier`]): the emulated NIC's thread
/// enqueues copies with [`GpuCopier::copy_async`] and waits for them with [`GpuCopier::synchronize`]. The
/// copies run in the order they were enqueued, and concurrently with kernels on other streams, so they never
/// wait for a kernel that spins on NIC-written memory (nothing goes to the legacy default stream, and no
/// synchronous `cuMemcpy` is used).
///
/// Host memory in a copy should be pinned ([`super::Gpu::alloc_mapped`]): then the copy is asynchronous and
/// `copy_async` returns at once. With pageable host memory the driver stages the bytes through its own pinned
/// buffers, so the call may return only after the copy (from host memory: once staged; to host memory: once
/// complete); it is still correct and still does not wait for kernels on other streams.
pub struct CudaCopier {
    stream: Arc<Stream>,
}

impl fmt::Debug for CudaCopier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaCopier").field("stream", &self.stream).finish()
    }
}

impl CudaCopier {
    pub(crate) fn new(stream: Stream) -> Self {
        CudaCopier { stream: Arc::new(stream) }
    }

    /// The copier's stream, e.g. to wait for its copies with a time limit ([`Stream::wait`]).
    pub fn stream(&self) -> &Stream {
        &self.stream
    }
}

fn check_range(loc: MemLoc, len: usize, side: &str) -> Result<()> {
    if loc.addr == 0 || loc.addr.checked_add(len as u64).is_none() {
        return Err(Error::InvalidArgument(format!(
            "copy {side} {:?} address {:#x} for {len} bytes",
            loc.kind, loc.addr
        )));
    }
    Ok(())
}

impl GpuCopier for CudaCopier {
    /// Enqueues `len` bytes from `src` to `dst` on the copier's stream, by kind: host→GPU
    /// `cuMemcpyHtoDAsync`, GPU→host `cuMemcpyDtoHAsync`, GPU→GPU `cuMemcpyDtoDAsync`, host→host
    /// `cuMemcpyAsync` (unified addressing; stream-ordered with the others). A `len` of 0 enqueues nothing.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a null address or an address range that wraps; the driver's error as
    /// [`Error::Cuda`] (e.g. an address that is not GPU memory of this context).
    unsafe fn copy_async(&self, dst: MemLoc, src: MemLoc, len: usize) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        check_range(dst, len, "to")?;
        check_range(src, len, "from")?;
        self.stream.shared.bind()?;
        let s = self.stream.raw;
        // The caller guarantees both ranges are valid for `len` bytes until `synchronize` returns, and `s` is a
        // live stream of the bound context: that is all each call below needs.
        let (status, call) = match (dst.kind, src.kind) {
            (MemKind::Gpu, MemKind::Host) => {
                // SAFETY: see above; `src.addr` is a host pointer, `dst.addr` GPU memory.
                let st = unsafe { sys::cuMemcpyHtoDAsync_v2(dst.addr, src.addr as *const _, len, s) };
                (st, "cuMemcpyHtoDAsync")
            }
            (MemKind::Host, MemKind::Gpu) => {
                // SAFETY: see above; `dst.addr` is a host pointer, `src.addr` GPU memory.
                let st = unsafe { sys::cuMemcpyDtoHAsync_v2(dst.addr as *mut _, src.addr, len, s) };
                (st, "cuMemcpyDtoHAsync")
            }
            (MemKind::Gpu, MemKind::Gpu) => {
                // SAFETY: see above; both are GPU memory.
                let st = unsafe { sys::cuMemcpyDtoDAsync_v2(dst.addr, src.addr, len, s) };
                (st, "cuMemcpyDtoDAsync")
            }
            (MemKind::Host, MemKind::Host) => {
                // SAFETY: see above; both are host pointers, which unified addressing lets `cuMemcpyAsync` take.
                let st = unsafe { sys::cuMemcpyAsync(dst.addr, src.addr, len, s) };
                (st, "cuMemcpyAsync")
            }
        };
        check(status, call)
    }

    /// Waits until every copy enqueued so far has completed (`cuStreamSynchronize` on the copier's stream
    /// only: it does not wait for kernels).
    ///
    /// # Errors
    /// The driver's error as [`Error::Cuda`] (e.g. a copy faulted).
    fn synchronize(&self) -> Result<()> {
        self.stream.synchronize()
    }

    /// `cuMemAlloc`, zeroed with `cuMemsetD8Async` on the copier's stream and waited for (so before any
    /// copy enqueued later); freed with `cuMemFree` when dropped ([`DeviceBuffer`]).
    ///
    /// # Errors
    /// [`Error::OutOfMemory`], or the driver's error as [`Error::Cuda`].
    fn alloc(&self, len: usize) -> Result<GpuMem> {
        let buf = DeviceBuffer::alloc(&self.stream, len)?;
        Ok(GpuMem::new(buf.device_addr(), len, Box::new(buf)))
    }
}
