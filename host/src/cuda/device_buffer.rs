//! GPU memory buffers.

use std::fmt;
use std::sync::Arc;

use cudarc::driver::sys;

use super::driver::check;
use super::stream::Stream;
use super::Gpu;
use crate::mem::{MemKind, MemLoc};
use crate::{Error, Result};

/// A buffer of GPU memory (`cuMemAlloc`): at least 256-byte aligned, zeroed when allocated, freed on drop
/// (`cuMemFree`, context bound to the dropping thread). Host code reaches it only through copies; device
/// code through [`DeviceBuffer::device_addr`].
///
/// The copy methods use this GPU's internal non-blocking stream and wait for their copy only (never the legacy
/// default stream, so they do not wait for running kernels). They are not ordered with kernels either: wait
/// for a kernel ([`super::Stream::wait`]) before copying what it wrote. Dropping waits for every running kernel
/// of the device (`cuMemFree`, measured): drop buffers only after kernels that spin have ended.
pub struct DeviceBuffer {
    ptr: sys::CUdeviceptr,
    len: usize,
    stream: Arc<Stream>,
}

impl fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("device_addr", &format_args!("{:#x}", self.ptr))
            .field("len", &self.len)
            .finish()
    }
}

impl Gpu {
    /// Allocates `len` bytes of GPU memory (`cuMemAlloc`), zeroed (`cuMemsetD8Async` on a non-blocking stream,
    /// then waiting for it). A `len` of 0 allocates one byte so that the address is valid.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`] when the GPU has not that much free, [`Error::Cuda`] for other driver errors.
    pub fn alloc_device(&self, len: usize) -> Result<DeviceBuffer> {
        DeviceBuffer::alloc(&self.util, len)
    }
}

impl DeviceBuffer {
    /// [`Gpu::alloc_device`], zeroing on (and later copying through) `stream`.
    pub(crate) fn alloc(stream: &Arc<Stream>, len: usize) -> Result<DeviceBuffer> {
        stream.shared.bind()?;
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: the context is bound; the call writes one address through a valid pointer.
        let status = unsafe { sys::cuMemAlloc_v2(&mut ptr, len.max(1)) };
        if status == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
            return Err(Error::OutOfMemory(len));
        }
        check(status, "cuMemAlloc")?;
        let buf = DeviceBuffer { ptr, len, stream: Arc::clone(stream) };
        // SAFETY: `ptr` is `len.max(1)` bytes of GPU memory of this context, owned by `buf`.
        check(unsafe { sys::cuMemsetD8Async(ptr, 0, len.max(1), buf.stream.raw) }, "cuMemsetD8Async")?;
        buf.stream.synchronize()?;
        Ok(buf)
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The GPU address of the first byte (a `CUdeviceptr`), for device code and for the NIC.
    pub fn device_addr(&self) -> u64 {
        self.ptr
    }

    /// The buffer as a [`MemLoc`] of kind [`MemKind::Gpu`].
    pub fn loc(&self) -> MemLoc {
        MemLoc { kind: MemKind::Gpu, addr: self.ptr }
    }

    fn range(&self, offset: usize, len: usize) -> Result<sys::CUdeviceptr> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(self.ptr + offset as u64),
            _ => Err(Error::InvalidArgument(format!(
                "{len} bytes at offset {offset} do not fit in a GPU buffer of {} bytes",
                self.len
            ))),
        }
    }

    /// Copies `src` into the buffer at byte `offset` (`cuMemcpyHtoDAsync` on a non-blocking stream, then
    /// waiting for it). `src` may be pageable memory (the driver stages it).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `offset + src.len()` exceeds the buffer, [`Error::Cuda`] for driver
    /// errors.
    pub fn copy_from_host(&self, offset: usize, src: &[u8]) -> Result<()> {
        let dst = self.range(offset, src.len())?;
        if src.is_empty() {
            return Ok(());
        }
        self.stream.shared.bind()?;
        // SAFETY: `dst` is inside this live buffer; `src` is valid for reads of its length and borrowed until
        // the copy has completed (we wait for the stream before returning).
        let status = unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src.as_ptr().cast(), src.len(), self.stream.raw) };
        check(status, "cuMemcpyHtoDAsync")?;
        self.stream.synchronize()
    }

    /// Copies from the buffer at byte `offset` into `dst` (`cuMemcpyDtoHAsync` on a non-blocking stream, then
    /// waiting for it).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `offset + dst.len()` exceeds the buffer, [`Error::Cuda`] for driver
    /// errors.
    pub fn copy_to_host(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        let src = self.range(offset, dst.len())?;
        if dst.is_empty() {
            return Ok(());
        }
        self.stream.shared.bind()?;
        // SAFETY: `src` is inside this live buffer; `dst` is valid for writes of its length and borrowed
        // exclusively until the copy has completed (we wait for the stream before returning).
        let status = unsafe { sys::cuMemcpyDtoHAsync_v2(dst.as_mut_ptr().cast(), src, dst.len(), self.stream.raw) };
        check(status, "cuMemcpyDtoHAsync")?;
        self.stream.synchronize()
    }

    /// Copies the whole buffer into a new vector (see [`DeviceBuffer::copy_to_host`]).
    ///
    /// # Errors
    /// As [`DeviceBuffer::copy_to_host`].
    pub fn to_vec(&self) -> Result<Vec<u8>> {
        let mut out = vec![0; self.len];
        self.copy_to_host(0, &mut out)?;
        Ok(out)
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        let ptr = self.ptr;
        // SAFETY: `ptr` came from `cuMemAlloc` and is freed once, here.
        self.stream.shared.release("cuMemFree", || unsafe { sys::cuMemFree_v2(ptr) });
    }
}
