//! What the real mlx5 backend needs from CUDA: host memory it did not allocate (rdma-core's queue buffers,
//! doorbell records, the UAR page) mapped into the GPU, and a dmabuf of GPU memory for `ibv_reg_dmabuf_mr`.

use std::ffi::c_void;
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::Arc;

use cudarc::driver::sys;

use super::driver::check;
use super::{Gpu, Shared};
use crate::{Error, Result};

/// A host range registered with the GPU (`cuMemHostRegister`), unregistered on drop (`cuMemHostUnregister`).
pub struct HostRegistration {
    shared: Arc<Shared>,
    host: *mut c_void,
    device_addr: u64,
    len: usize,
}

impl std::fmt::Debug for HostRegistration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostRegistration")
            .field("host", &self.host)
            .field("device_addr", &format_args!("{:#x}", self.device_addr))
            .field("len", &self.len)
            .finish()
    }
}

// SAFETY: the registration is owned by this value alone and only undone, once, from whichever thread drops it.
unsafe impl Send for HostRegistration {}
// SAFETY: `HostRegistration` hands out only addresses.
unsafe impl Sync for HostRegistration {}

impl HostRegistration {
    /// The address of the range's first byte in the GPU's address space.
    pub fn device_addr(&self) -> u64 {
        self.device_addr
    }

    /// Bytes registered.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no byte is registered (never).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for HostRegistration {
    fn drop(&mut self) {
        let host = self.host;
        // SAFETY: `host` was registered by `register_host` and is unregistered once, here.
        self.shared.release("cuMemHostUnregister", || unsafe { sys::cuMemHostUnregister(host) });
    }
}

impl Gpu {
    /// Maps `len` bytes of host memory at `host` into this GPU (`cuMemHostRegister` with
    /// `CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_PORTABLE`, plus `CU_MEMHOSTREGISTER_IOMEMORY` when
    /// `io`: the range is MMIO, e.g. a NIC's UAR page mmapped by rdma-core; the GPU then writes it as PCIe
    /// peer-to-peer stores), and returns its device address (`cuMemHostGetDevicePointer`).
    ///
    /// # Safety
    /// `host..host + len` must be mapped in this process (memory or device MMIO) until the returned
    /// registration is dropped, page aligned and a whole number of pages, and overlap no other registered
    /// range.
    ///
    /// # Errors
    /// [`Error::Cuda`] naming the call (e.g. `CUDA_ERROR_NOT_SUPPORTED` for IOMEMORY where the platform has
    /// no peer-to-peer path to the NIC, `CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED` for an overlap).
    pub unsafe fn register_host(&self, host: *mut u8, len: usize, io: bool) -> Result<HostRegistration> {
        self.shared.bind()?;
        let mut flags = sys::CU_MEMHOSTREGISTER_DEVICEMAP | sys::CU_MEMHOSTREGISTER_PORTABLE;
        if io {
            flags |= sys::CU_MEMHOSTREGISTER_IOMEMORY;
        }
        let what = if io { "cuMemHostRegister(IOMEMORY)" } else { "cuMemHostRegister" };
        // SAFETY: the caller guarantees the range is mapped and not registered yet.
        check(unsafe { sys::cuMemHostRegister_v2(host.cast(), len, flags) }, what)?;
        // From here on, dropping `reg` unregisters the range, whatever fails next.
        let mut reg = HostRegistration { shared: self.shared.clone(), host: host.cast(), device_addr: 0, len };
        check(
            // SAFETY: `host` is registered with DEVICEMAP; the call writes one address.
            unsafe { sys::cuMemHostGetDevicePointer_v2(&mut reg.device_addr, host.cast(), 0) },
            "cuMemHostGetDevicePointer",
        )?;
        Ok(reg)
    }

    /// A dmabuf file descriptor for `len` bytes of this GPU's memory at `addr` (`cuMemGetHandleForAddressRange`
    /// with `CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD`), which `ibv_reg_dmabuf_mr` registers without
    /// nvidia-peermem. Both `addr` and `len` must be multiples of the host page size (4096).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an unaligned range; [`Error::Cuda`] when the driver cannot export it
    /// (e.g. `CUDA_ERROR_NOT_SUPPORTED` on a kernel or driver without dmabuf support).
    pub fn dmabuf_fd(&self, addr: u64, len: usize) -> Result<OwnedFd> {
        if !addr.is_multiple_of(4096) || !len.is_multiple_of(4096) || len == 0 {
            return Err(Error::InvalidArgument(format!("dmabuf range {addr:#x}+{len} is not whole 4096-byte pages")));
        }
        self.shared.bind()?;
        let mut fd: i32 = -1;
        // SAFETY: the call writes one int (the fd) through a valid pointer; the range is checked by the driver.
        let status = unsafe {
            sys::cuMemGetHandleForAddressRange(
                (&mut fd as *mut i32).cast(),
                addr,
                len,
                sys::CUmemRangeHandleType::CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
                0,
            )
        };
        check(status, "cuMemGetHandleForAddressRange(DMA_BUF_FD)")?;
        // SAFETY: on success the driver returned a new file descriptor that nothing else owns.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }
}
