//! Queue memory for the `gpu` executor: pinned host memory mapped into the GPU.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::sys;

use super::driver::check;
use super::{Gpu, Shared};
use crate::mem::{MappedBuf, QueueMemory};
use crate::{Error, Result};

/// Page size the buffers are aligned to, bytes.
const PAGE: usize = 4096;

/// One `cuMemHostAlloc` allocation, freed with `cuMemFreeHost` (context bound to the dropping thread).
struct PinnedAlloc {
    shared: Arc<Shared>,
    base: *mut c_void,
}

// SAFETY: the allocation is owned by this value alone and only freed, from whichever thread drops it; pinned
// memory allocated with CU_MEMHOSTALLOC_PORTABLE is valid in every thread and context.
unsafe impl Send for PinnedAlloc {}
// SAFETY: `PinnedAlloc` exposes nothing; sharing it shares no access.
unsafe impl Sync for PinnedAlloc {}

impl Drop for PinnedAlloc {
    fn drop(&mut self) {
        let base = self.base;
        // SAFETY: `base` came from `cuMemHostAlloc` and is freed once, here.
        self.shared.release("cuMemFreeHost", || unsafe { sys::cuMemFreeHost(base) });
    }
}

impl Gpu {
    /// Allocates `len` bytes of queue memory: pinned host memory mapped into the GPU's address space
    /// (`cuMemHostAlloc` with `CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE`; the device address comes
    /// from `cuMemHostGetDevicePointer`). The allocation is rounded up to whole 4096-byte pages; the buffer is
    /// zeroed, 4096-byte aligned on both sides, and freed (`cuMemFreeHost`) when the returned [`MappedBuf`] is
    /// dropped. Host threads use [`MappedBuf::host_ptr`], device code [`MappedBuf::device_addr`]; both see
    /// each other's stores (system scope: device code loads with `ld.volatile`/`ld.acquire.sys`, host threads
    /// with atomics). Also usable as a host buffer for async copies that must not block (pinned).
    ///
    /// Dropping the buffer (`cuMemFreeHost`) waits for every running kernel of the device (measured): free it
    /// only after kernels that spin have ended. Allocating does not wait.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `len` rounded up overflows, [`Error::OutOfMemory`] when the driver
    /// cannot pin that much, [`Error::Cuda`] for other driver errors.
    pub fn alloc_mapped(&self, len: usize) -> Result<MappedBuf> {
        alloc_mapped_in(&self.shared, len)
    }
}

/// [`Gpu::alloc_mapped`] in the context `shared` (for objects that keep the context, not the [`Gpu`]).
pub(crate) fn alloc_mapped_in(shared: &Arc<Shared>, len: usize) -> Result<MappedBuf> {
    let size = len
        .max(1)
        .checked_next_multiple_of(PAGE)
        .ok_or_else(|| Error::InvalidArgument(format!("a pinned buffer of {len} bytes is too large")))?;
    shared.bind()?;
    let mut alloc = pin(shared, size, len)?;
    let mut offset = (alloc.base as usize).wrapping_neg() % PAGE;
    if offset != 0 {
        // The driver's pinned allocations are page aligned in practice; if one is not, allocate a page more
        // and align inside it.
        drop(alloc);
        let padded = size
            .checked_add(PAGE)
            .ok_or_else(|| Error::InvalidArgument(format!("a pinned buffer of {len} bytes is too large")))?;
        alloc = pin(shared, padded, len)?;
        offset = (alloc.base as usize).wrapping_neg() % PAGE;
    }
    let mut dev: sys::CUdeviceptr = 0;
    // SAFETY: `alloc.base` is a live DEVICEMAP allocation of the bound context; the call writes one address.
    check(unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, alloc.base, 0) }, "cuMemHostGetDevicePointer")?;
    // SAFETY: `offset + size` bytes from `base` belong to the allocation (padded when `offset != 0`).
    let host_ptr = unsafe { alloc.base.cast::<u8>().add(offset) };
    // SAFETY: `host_ptr` is valid for `size` bytes of writes and nothing else uses them yet.
    unsafe { std::ptr::write_bytes(host_ptr, 0, size) };
    let device_addr = dev + offset as u64;
    if !device_addr.is_multiple_of(PAGE as u64) {
        return Err(Error::Cuda {
            message: format!("mapped address {device_addr:#x} of pinned memory is not page aligned"),
            status: None,
        });
    }
    // SAFETY: `host_ptr` is `len <= size` zeroed bytes, 4096-aligned, valid until `alloc` (the owner) drops;
    // `device_addr` is the same bytes' mapped address in this GPU's context (unified addressing).
    Ok(unsafe { MappedBuf::from_raw(host_ptr, device_addr, len, Box::new(alloc)) })
}

/// `cuMemHostAlloc(size, DEVICEMAP | PORTABLE)`; the context must be bound.
fn pin(shared: &Arc<Shared>, size: usize, len: usize) -> Result<PinnedAlloc> {
    let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
    let mut base: *mut c_void = std::ptr::null_mut();
    // SAFETY: the context is bound; the call writes one pointer through a valid pointer.
    let status = unsafe { sys::cuMemHostAlloc(&mut base, size, flags) };
    if status == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
        return Err(Error::OutOfMemory(len));
    }
    check(status, "cuMemHostAlloc")?;
    if base.is_null() {
        return Err(Error::Cuda { message: "cuMemHostAlloc returned a null pointer".into(), status: None });
    }
    Ok(PinnedAlloc { shared: Arc::clone(shared), base })
}

impl QueueMemory for Gpu {
    /// Same as [`Gpu::alloc_mapped`].
    fn alloc(&self, len: usize) -> Result<MappedBuf> {
        self.alloc_mapped(len)
    }
}
