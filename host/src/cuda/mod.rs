//! The `gpu` executor's CUDA layer, over the CUDA driver API (cudarc's `driver` bindings, loaded at run time).
//!
//! - [`Gpu::open`] binds one GPU (its primary context); without libcuda or without a device it returns
//!   [`Error::Unavailable`] with one line, never a panic (`driver.rs` says how cudarc would panic and
//!   how we prevent it).
//! - Queue memory ([`Gpu::alloc_mapped`], [`QueueMemory`](crate::mem::QueueMemory)): pinned host memory mapped into the GPU.
//! - GPU memory: [`DeviceBuffer`].
//! - For the real mlx5 backend (feature `mlx5`): host memory and MMIO mapped into the GPU
//!   (`Gpu::register_host`) and dmabufs of GPU memory (`Gpu::dmabuf_fd`).
//! - The emulated NIC's copies: [`CudaCopier`] ([`crate::mem::GpuCopier`]) on its own non-blocking stream.
//! - Kernels: [`Gpu::load_module`] (PTX, JIT-compiled by the driver, once per `Gpu`), [`Module::kernel`],
//!   [`Kernel::launch`] on a [`Stream`], and [`Stream::wait`], a wait with a host-side time limit; CUDA events
//!   around a launch give its GPU time ([`crate::launch::Kernel::launch_timed`]).
//!
//! # Hazards this layer is built around
//! - A kernel that spins on memory that a host thread updates with CUDA copies deadlocks if those copies go to
//!   the legacy default stream or use synchronous `cuMemcpy*`. Nothing here uses the legacy default stream
//!   (stream 0) or a synchronous copy: every stream is created with `CU_STREAM_NON_BLOCKING`, every copy is a
//!   `cuMemcpy*Async` on such a stream, and `cuCtxSynchronize` is never called.
//! - A hung kernel cannot be stopped from the host: the driver has no call that kills one kernel. A timed-out
//!   [`Stream::wait`] therefore marks the `Gpu` hung; from then on drops leak their CUDA resources instead of
//!   freeing them (frees may wait for the device), and the process should report and exit
//!   (`std::process::exit`), which makes the driver tear the context down.
//! - Some calls wait for every running kernel of the device, whichever thread makes them. Measured on the H200
//!   (driver 580.159, `tests/cuda_probe.rs`) while a kernel spins: `cuMemFree` ([`DeviceBuffer`] drop),
//!   `cuMemFreeHost` ([`crate::mem::MappedBuf`] drop) and `cuModuleLoadDataEx` ([`Gpu::load_module`]) wait
//!   for it; `cuMemAlloc`, `cuMemHostAlloc`, stream creation and destruction, and copies on non-blocking
//!   streams (pinned or pageable host memory) do not. A thread blocked in such a call can also hold up other
//!   threads' CUDA calls (seen as copier copies stalling while another thread freed memory). So: load modules
//!   and allocate before launching kernels that spin, and free nothing (in any thread) until they have ended.

mod copier;
mod device_buffer;
mod driver;
mod engine;
mod event;
#[cfg(feature = "mlx5")]
mod host_register;
mod module;
mod pinned;
mod stream;

use std::ffi::c_int;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::safe::CudaContext;
use cudarc::driver::{result, sys};

pub use copier::CudaCopier;
/// The CUDA driver's status codes (`CUresult`, cudarc's binding of `cuda.h`), as [`Error::Cuda`] carries them.
pub use cudarc::driver::sys::CUresult;
pub use device_buffer::DeviceBuffer;
pub(crate) use event::Event;
#[cfg(feature = "mlx5")]
pub use host_register::HostRegistration;
pub(crate) use module::entry_param_counts;
pub use module::{Kernel, KernelArg, LaunchConfig, Module};
pub use stream::Stream;

use crate::drop_errors::DropErrors;
use crate::mem::MappedBuf;
use crate::{Error, Result};

use driver::{check, DriverLibrary};

/// What every CUDA object of one [`Gpu`] shares: the context, and where drops record their errors.
pub(crate) struct Shared {
    ctx: Arc<CudaContext>,
    lib: DriverLibrary,
    /// Failures of this GPU's objects' drops; see [`Gpu::take_drop_error`].
    drops: DropErrors,
    /// Set when a bounded wait timed out: a kernel may still run, so drops leak instead of freeing.
    hung: AtomicBool,
    /// Streaming multiprocessors (`CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT`): with a kernel's blocks per SM,
    /// how many of its CTAs can be resident at once.
    pub(crate) multiprocessors: u32,
    /// Whether the device takes cooperative launches (`CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH`).
    pub(crate) cooperative: bool,
}

impl Shared {
    /// Makes this GPU's context current on the calling thread (`cuCtxGetCurrent`, then `cuCtxSetCurrent` if
    /// another context is current). Every call into the driver does this first: the emulated NIC's thread and
    /// user threads all use the same objects.
    pub(crate) fn bind(&self) -> Result<()> {
        self.ctx.bind_to_thread().map_err(|e| driver::failed("cuCtxSetCurrent", e))
    }

    /// Runs a free from a `Drop`: binds the context and calls `free` unless the GPU is marked hung (then the
    /// resource is leaked on purpose). Errors are recorded, never raised.
    pub(crate) fn release(&self, what: &str, free: impl FnOnce() -> sys::CUresult) {
        if self.hung.load(Ordering::Acquire) {
            return;
        }
        let result = self.bind().and_then(|()| check(free(), what));
        if let Err(e) = result {
            self.drops.record(what, e);
        }
    }

    /// Marks the GPU hung (a kernel did not finish in time): from now on drops leak, and the primary context
    /// is never released (one reference to it is leaked), since releasing it would wait for the kernel.
    pub(crate) fn mark_hung(&self) {
        if !self.hung.swap(true, Ordering::AcqRel) {
            std::mem::forget(Arc::clone(&self.ctx));
        }
    }

    pub(crate) fn same(a: &Arc<Shared>, b: &Arc<Shared>) -> bool {
        Arc::ptr_eq(a, b)
    }
}

/// One GPU, opened through the CUDA driver: its primary context, device facts, a non-blocking stream for this
/// layer's own short copies, and the PTX modules loaded on it.
///
/// Every method may be called from any thread: each makes the context current first. Objects made from a
/// `Gpu` ([`DeviceBuffer`], [`Stream`], [`CudaCopier`], [`Module`], [`crate::mem::MappedBuf`]) keep the context
/// alive, so they may outlive the `Gpu` value.
pub struct Gpu {
    shared: Arc<Shared>,
    ordinal: usize,
    name: String,
    pci: (u32, u32, u32),
    compute_capability: (u32, u32),
    driver_version: (u32, u32),
    /// Non-blocking stream for [`DeviceBuffer`]'s zeroing and host-slice copies.
    util: Arc<Stream>,
    /// Modules loaded so far, with the PTX text they came from, so that each PTX is JIT-compiled once.
    modules: Mutex<Vec<(String, Arc<Module>)>>,
    /// The error reports of kernel launches on this GPU, kept for later launches ([`Gpu::launch_reports`]).
    reports: Arc<Mutex<Vec<Arc<MappedBuf>>>>,
}

impl fmt::Debug for Gpu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gpu")
            .field("ordinal", &self.ordinal)
            .field("name", &self.name)
            .field("compute_capability", &self.compute_capability)
            .field("driver_version", &self.driver_version)
            .finish_non_exhaustive()
    }
}

impl Gpu {
    /// How many GPUs the CUDA driver sees (`cuDeviceGetCount` after `cuInit(0)`; `CUDA_VISIBLE_DEVICES` applies).
    ///
    /// # Errors
    /// [`Error::Unavailable`] with a one-line reason when libcuda cannot be loaded or `cuInit` fails (e.g.
    /// `CUDA_ERROR_NO_DEVICE`).
    pub fn count() -> Result<usize> {
        driver::check_library()?;
        result::init().map_err(|e| Error::Unavailable(format!("no GPU: cuInit failed: {}", driver::describe(e))))?;
        let count = result::device::get_count()
            .map_err(|e| Error::Unavailable(format!("no GPU: cuDeviceGetCount failed: {}", driver::describe(e))))?;
        Ok(usize::try_from(count).unwrap_or(0))
    }

    /// Opens GPU `ordinal` (0-based, in `cuDeviceGet` order): loads libcuda if this process has not yet,
    /// `cuInit(0)`, retains the device's primary context (`cuDevicePrimaryCtxRetain`), checks that it can map
    /// host memory with unified addressing, and creates this layer's non-blocking stream.
    ///
    /// # Errors
    /// - [`Error::Unavailable`] with a one-line reason when there is no GPU to use: libcuda cannot be loaded or
    ///   lacks a symbol we call, `cuInit` fails (e.g. `CUDA_ERROR_NO_DEVICE`), or there is no device `ordinal`.
    ///   The caller falls back to the `cpu` executor or reports the line. Never panics.
    /// - [`Error::Cuda`] when a later driver call fails (e.g. the context cannot be created).
    pub fn open(ordinal: usize) -> Result<Arc<Gpu>> {
        let lib = driver::check_library()?;
        let count = Self::count()?;
        if ordinal >= count {
            return Err(Error::Unavailable(match count {
                0 => "no GPU: the CUDA driver sees no device".to_string(),
                n => format!("no GPU {ordinal}: the CUDA driver sees {n} device(s)"),
            }));
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| driver::failed(&format!("opening GPU {ordinal}"), e))?;
        let dev = ctx.cu_device();
        let attr = |a: sys::CUdevice_attribute| -> Result<u32> {
            // SAFETY: `dev` came from `cuDeviceGet` (inside `CudaContext::new`); the call only writes an int.
            let v = unsafe { result::device::get_attribute(dev, a) }?;
            Ok(u32::try_from(v).unwrap_or(0))
        };
        use sys::CUdevice_attribute as A;
        if attr(A::CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY)? == 0
            || attr(A::CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING)? == 0
        {
            return Err(Error::Unavailable(format!(
                "no usable GPU: device {ordinal} cannot map host memory with unified addressing"
            )));
        }
        let pci = (
            attr(A::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID)?,
            attr(A::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID)?,
            attr(A::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID)?,
        );
        let compute_capability = (
            attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        );
        let name = result::device::get_name(dev)?;
        let mut version: c_int = 0;
        // SAFETY: the call writes one int through a valid pointer.
        check(unsafe { sys::cuDriverGetVersion(&mut version) }, "cuDriverGetVersion")?;
        let version = u32::try_from(version).unwrap_or(0);
        let (multiprocessors, cooperative) =
            (attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?, attr(A::CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH)? != 0);
        let shared = Arc::new(Shared {
            ctx,
            lib,
            drops: DropErrors::default(),
            hung: AtomicBool::new(false),
            multiprocessors,
            cooperative,
        });
        let util = Arc::new(Stream::new(&shared)?);
        Ok(Arc::new(Gpu {
            shared,
            ordinal,
            name,
            pci,
            compute_capability,
            driver_version: (version / 1000, version % 1000 / 10),
            util,
            modules: Mutex::new(Vec::new()),
            reports: Arc::default(),
        }))
    }

    /// The pool of pinned error reports that kernel launches on this GPU take and give back
    /// (`launch::Kernel`): kept for the `Gpu`'s lifetime, so that dropping a kernel frees nothing. A free of
    /// pinned memory waits for every running kernel of the device and holds up other threads' CUDA calls
    /// meanwhile (see the module docs); a rank that dropped its kernel's reports after its launch could stall
    /// a peer rank's NIC until that peer's kernel, waiting on the NIC, timed out.
    pub(crate) fn launch_reports(&self) -> Arc<Mutex<Vec<Arc<MappedBuf>>>> {
        Arc::clone(&self.reports)
    }

    /// The ordinal this GPU was opened with.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The device's name (`cuDeviceGetName`), e.g. "NVIDIA H200".
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The device's PCI address as `nvidia-smi` writes it, `DDDDDDDD:BB:DD.0` (domain, bus, device from
    /// `cuDeviceGetAttribute`), which tells apart GPUs that `CUDA_VISIBLE_DEVICES` numbers alike in each process.
    pub fn pci_address(&self) -> String {
        let (domain, bus, device) = self.pci;
        format!("{domain:08X}:{bus:02X}:{device:02X}.0")
    }

    /// Compute capability (major, minor), e.g. (9, 0) for an H100/H200.
    pub fn compute_capability(&self) -> (u32, u32) {
        self.compute_capability
    }

    /// The CUDA version the driver implements (`cuDriverGetVersion`), e.g. (13, 0). This crate uses the CUDA
    /// 12.8 API, which newer drivers serve.
    pub fn driver_version(&self) -> (u32, u32) {
        self.driver_version
    }

    /// Creates a new stream with `CU_STREAM_NON_BLOCKING` (`cuStreamCreate`): work on it never waits for the
    /// legacy default stream, and nothing here puts work there. Launch kernels on it with [`Kernel::launch`].
    ///
    /// # Errors
    /// The driver's error, as [`Error::Cuda`].
    pub fn new_stream(&self) -> Result<Stream> {
        Stream::new(&self.shared)
    }

    /// Creates a CUDA event with timing on, for timing work on this GPU's streams.
    ///
    /// # Errors
    /// The driver's error, as [`Error::Cuda`].
    pub(crate) fn new_event(&self) -> Result<Event> {
        Event::new(&self.shared)
    }

    /// Creates the emulated NIC's copier, with its own non-blocking stream. See [`CudaCopier`].
    ///
    /// # Errors
    /// The driver's error, as [`Error::Cuda`].
    pub fn copier(&self) -> Result<CudaCopier> {
        CudaCopier::new(self, Stream::new(&self.shared)?)
    }

    /// Whether a bounded wait on this GPU timed out ([`Stream::wait`]): a kernel may still be running, drops
    /// leak their resources, and the process should exit.
    pub fn is_hung(&self) -> bool {
        self.shared.hung.load(Ordering::Acquire)
    }

    /// Takes the first error that a `Drop` of an object of this GPU met (a free that failed) since the last
    /// call, if any. Drops never panic and cannot return errors: they log each failure with `tracing` and keep
    /// the first here, as every backend's drops do.
    pub fn take_drop_error(&self) -> Option<Error> {
        self.shared.drops.take()
    }
}
