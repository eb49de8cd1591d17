//! PTX modules, kernels and launches.

use std::ffi::{c_int, c_uint, c_void, CString};
use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use cudarc::driver::sys;

use super::driver::check;
use super::stream::Stream;
use super::{Gpu, Shared};
use crate::{Error, Result};

/// Bytes of dynamic shared memory a kernel may use without opting in
/// (`CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`).
const DEFAULT_DYNAMIC_SHARED: u32 = 48 * 1024;

/// Size of the JIT error log buffer, bytes.
const JIT_LOG: usize = 16 * 1024;

/// A PTX module loaded on a GPU (`cuModuleLoadDataEx`; the driver JIT-compiles it for the device). Unloaded
/// (`cuModuleUnload`) when the last [`Kernel`] of it and the [`Gpu`]'s cache are dropped.
pub struct Module {
    shared: Arc<Shared>,
    raw: sys::CUmodule,
    /// Parameter counts of the module's kernels, by name, read from the PTX text's `.entry` declarations.
    param_counts: Vec<(String, usize)>,
}

// SAFETY: a `CUmodule` handle may be used from any thread (the driver API is thread-safe); every use binds the
// owning context first.
unsafe impl Send for Module {}
// SAFETY: as above; `Module` has no interior state.
unsafe impl Sync for Module {}

impl fmt::Debug for Module {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Module").field("raw", &self.raw).finish()
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        let raw = self.raw;
        // SAFETY: `raw` came from `cuModuleLoadDataEx` and is unloaded once, here; no `Kernel` of it is left
        // (each holds an `Arc<Module>`).
        self.shared.release("cuModuleUnload", || unsafe { sys::cuModuleUnload(raw) });
    }
}

impl Gpu {
    /// Loads a PTX module (`cuModuleLoadDataEx`, JIT-compiled by the driver for this GPU), once per `Gpu`:
    /// loading the same text again returns the module loaded the first time (the PTX a build script made with
    /// `gdaki-build`).
    ///
    /// The first load of a PTX text waits for every running kernel of the device (measured): load modules
    /// before launching kernels that spin.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `ptx` contains a NUL byte; [`Error::Cuda`] when the driver rejects the
    /// PTX, with the first lines of the JIT error log (e.g. an unsupported `.version` or `.target`).
    pub fn load_module(&self, ptx: &str) -> Result<Arc<Module>> {
        // A panic while the lock was held leaves a valid cache (entries are pushed whole).
        let mut modules = self.modules.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, m)) = modules.iter().find(|(text, _)| text == ptx) {
            return Ok(Arc::clone(m));
        }
        let image = CString::new(ptx).map_err(|_| Error::InvalidArgument("PTX text contains a NUL byte".into()))?;
        self.shared.bind()?;
        let mut log = vec![0u8; JIT_LOG];
        let mut options =
            [sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER, sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES];
        // Option values are passed as pointer-sized words: the buffer's address, then its size.
        let mut values: [*mut c_void; 2] = [log.as_mut_ptr().cast(), JIT_LOG as *mut c_void];
        let mut raw: sys::CUmodule = std::ptr::null_mut();
        // SAFETY: the context is bound; `image` is a NUL-terminated PTX text alive for the call; `options` and
        // `values` are two valid entries; the log buffer is `JIT_LOG` writable bytes alive for the call.
        let status = unsafe {
            sys::cuModuleLoadDataEx(&mut raw, image.as_ptr().cast(), 2, options.as_mut_ptr(), values.as_mut_ptr())
        };
        if let Err(e) = check(status, "cuModuleLoadDataEx") {
            let text = String::from_utf8_lossy(&log[..log.iter().position(|&b| b == 0).unwrap_or(log.len())]);
            let lines: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty()).take(4).collect();
            return Err(match e {
                Error::Cuda { message, status } if !lines.is_empty() => {
                    Error::Cuda { message: format!("{message}: {}", lines.join("; ")), status }
                }
                e => e,
            });
        }
        let module = Arc::new(Module { shared: Arc::clone(&self.shared), raw, param_counts: entry_param_counts(ptx) });
        modules.push((ptx.to_owned(), Arc::clone(&module)));
        Ok(module)
    }

    /// Looks up kernel `name` in the module of `ptx`, loading it if needed ([`Gpu::load_module`],
    /// [`Module::kernel`]).
    ///
    /// # Errors
    /// As [`Gpu::load_module`] and [`Module::kernel`].
    pub fn kernel(&self, ptx: &str, name: &str) -> Result<Kernel> {
        self.load_module(ptx)?.kernel(name)
    }
}

impl Module {
    /// Looks up the kernel (`.entry`) called `name` (`cuModuleGetFunction`). When the driver has
    /// `cuFuncGetParamInfo` (CUDA 12.4+), the sizes of its parameters are read too, and every launch is
    /// checked against them.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the module has no kernel `name` (or `name` contains a NUL byte);
    /// [`Error::Cuda`] for other driver errors.
    pub fn kernel(self: &Arc<Self>, name: &str) -> Result<Kernel> {
        let c_name = CString::new(name).map_err(|_| Error::InvalidArgument(format!("kernel name {name:?}")))?;
        self.shared.bind()?;
        let mut raw: sys::CUfunction = std::ptr::null_mut();
        // SAFETY: the context is bound, `self.raw` is a loaded module, `c_name` is NUL-terminated; the call
        // writes one handle.
        let status = unsafe { sys::cuModuleGetFunction(&mut raw, self.raw, c_name.as_ptr()) };
        if status == sys::CUresult::CUDA_ERROR_NOT_FOUND {
            return Err(Error::InvalidArgument(format!("no kernel `{name}` in the PTX module")));
        }
        check(status, "cuModuleGetFunction")?;
        let count = self.param_counts.iter().find(|(n, _)| n == name).map(|&(_, c)| c);
        let param_sizes = match count {
            Some(count) if self.shared.lib.has_param_info => param_sizes(raw, count),
            _ => None,
        };
        Ok(Kernel {
            module: Arc::clone(self),
            raw,
            name: Arc::from(name),
            param_sizes,
            dynamic_shared_limit: AtomicU32::new(DEFAULT_DYNAMIC_SHARED),
        })
    }
}

/// Parameter sizes of `f` in bytes, in order, for its `count` parameters (`cuFuncGetParamInfo` for each);
/// `None` if the driver answers anything but success. The count comes from the PTX text, so that no call is
/// made past the last parameter (the driver would answer `CUDA_ERROR_INVALID_VALUE`, which compute-sanitizer
/// reports as an API error).
fn param_sizes(f: sys::CUfunction, count: usize) -> Option<Vec<usize>> {
    let mut sizes = Vec::with_capacity(count);
    for index in 0..count {
        let (mut offset, mut size) = (0usize, 0usize);
        // SAFETY: `f` is a live function handle (the caller's context is bound); the call writes two words.
        match unsafe { sys::cuFuncGetParamInfo(f, index, &mut offset, &mut size) } {
            sys::CUresult::CUDA_SUCCESS => sizes.push(size),
            _ => return None,
        }
    }
    Some(sizes)
}

/// The kernels of a PTX text and how many parameters each declares: for every `.entry NAME(`, the `.param`
/// directives up to the closing parenthesis (PTX ISA, "Kernel Function Parameters").
pub(crate) fn entry_param_counts(ptx: &str) -> Vec<(String, usize)> {
    // `//` comments are not code: an `.entry` inside one declares nothing.
    let code: String = ptx.lines().map(|l| l.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n");
    let mut out = Vec::new();
    let mut rest = code.as_str();
    while let Some(at) = rest.find(".entry ") {
        rest = &rest[at + ".entry ".len()..];
        let Some(open) = rest.find('(') else { break };
        let name = rest[..open].trim().to_string();
        let Some(close) = rest[open..].find(')') else { break };
        let params = &rest[open + 1..open + close];
        out.push((name, params.matches(".param").count()));
        rest = &rest[open + close..];
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn entry_param_counts_reads_each_kernels_parameters() {
        let ptx = "// a comment: .entry z(.param .u64 q)\n.visible .entry a(\n\t.param .u64 .ptr .align 1 a_param_0\n)\n{\n}\n\
                   .func f(.param .b64 x)\n.visible .entry b(\n\t.param .u64 b_param_0,\n\t.param .u32 b_param_1\n)\n\
                   .visible .entry c()\n{\n}\n";
        assert_eq!(super::entry_param_counts(ptx), [("a".to_string(), 1), ("b".to_string(), 2), ("c".to_string(), 0)]);
    }
}

/// One kernel argument, passed by value as the kernel's parameter of the same size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelArg<'a> {
    /// A 4-byte parameter (`.param .u32`/`.s32`/`.b32`; `u32`, `i32` in Rust device code).
    U32(u32),
    /// An 8-byte parameter (`.param .u64`; a pointer is a device address: [`crate::mem::MappedBuf::device_addr`],
    /// [`super::DeviceBuffer::device_addr`]).
    U64(u64),
    /// A parameter passed as raw bytes, e.g. a `#[repr(C)]` handle by value (`.param .align A .b8 name[N]`);
    /// the bytes are copied at launch, so the borrow ends when `launch` returns.
    Bytes(&'a [u8]),
}

impl KernelArg<'_> {
    fn size(&self) -> usize {
        match self {
            KernelArg::U32(_) => 4,
            KernelArg::U64(_) => 8,
            KernelArg::Bytes(b) => b.len(),
        }
    }
}

impl From<u32> for KernelArg<'_> {
    fn from(v: u32) -> Self {
        KernelArg::U32(v)
    }
}

impl From<u64> for KernelArg<'_> {
    fn from(v: u64) -> Self {
        KernelArg::U64(v)
    }
}

/// Grid and block shape of a launch (`cuLaunchKernel`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchConfig {
    /// Blocks (CTAs) in x, y, z; each at least 1.
    pub grid: [u32; 3],
    /// Threads per block in x, y, z; each at least 1, product at most 1024.
    pub block: [u32; 3],
    /// Dynamic shared memory per block, bytes (the kernel's `.extern .shared` array). Above 48 KiB the
    /// kernel is opted in automatically (`CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`).
    pub shared_mem_bytes: u32,
    /// Every CTA must be resident at once: a cooperative launch (`cuLaunchCooperativeKernel`), refused when the
    /// grid is larger than [`Kernel::max_co_resident_blocks`].
    pub co_resident: bool,
}

impl LaunchConfig {
    /// `blocks` blocks of `threads_per_block` threads, one-dimensional, no dynamic shared memory.
    pub fn linear(blocks: u32, threads_per_block: u32) -> Self {
        LaunchConfig { grid: [blocks, 1, 1], block: [threads_per_block, 1, 1], shared_mem_bytes: 0, co_resident: false }
    }
}

/// A kernel of a loaded [`Module`] (a `CUfunction`); keeps its module loaded.
pub struct Kernel {
    module: Arc<Module>,
    raw: sys::CUfunction,
    name: Arc<str>,
    /// Parameter sizes in bytes, when the driver can tell (`cuFuncGetParamInfo`).
    param_sizes: Option<Vec<usize>>,
    /// The dynamic shared memory the kernel is opted in to, bytes.
    dynamic_shared_limit: AtomicU32,
}

// SAFETY: a `CUfunction` handle may be used from any thread (the driver API is thread-safe); every use binds
// the owning context first; the interior state is an atomic.
unsafe impl Send for Kernel {}
// SAFETY: as above.
unsafe impl Sync for Kernel {}

impl fmt::Debug for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Kernel").field("name", &self.name).field("param_sizes", &self.param_sizes).finish()
    }
}

impl Kernel {
    /// The kernel's name (its PTX `.entry`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Sizes of the kernel's parameters in bytes, in order, when the driver can tell (`cuFuncGetParamInfo`,
    /// CUDA 12.4+ drivers); launches are checked against them.
    pub fn param_sizes(&self) -> Option<&[usize]> {
        self.param_sizes.as_deref()
    }

    fn attribute(&self, attr: sys::CUfunction_attribute) -> Result<i32> {
        self.module.shared.bind()?;
        let mut v = 0;
        // SAFETY: the context is bound and `raw` is a live function; the call writes one int.
        check(unsafe { sys::cuFuncGetAttribute(&mut v, attr, self.raw) }, "cuFuncGetAttribute")?;
        Ok(v)
    }

    /// Registers per thread (`CU_FUNC_ATTRIBUTE_NUM_REGS`).
    ///
    /// # Errors
    /// The driver's error as [`Error::Cuda`].
    pub fn num_regs(&self) -> Result<u32> {
        Ok(u32::try_from(self.attribute(sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_NUM_REGS)?).unwrap_or(0))
    }

    /// The most threads per block this kernel can be launched with (`CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK`).
    ///
    /// # Errors
    /// The driver's error as [`Error::Cuda`].
    pub fn max_threads_per_block(&self) -> Result<u32> {
        let v = self.attribute(sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?;
        Ok(u32::try_from(v).unwrap_or(0))
    }

    /// Opts the kernel in to `bytes` of dynamic shared memory per block when that is more than it is opted in to
    /// (above 48 KiB the driver asks for it). The context must be bound.
    fn opt_in_shared(&self, bytes: u32) -> Result<()> {
        if bytes > self.dynamic_shared_limit.load(Ordering::Relaxed) {
            let attr = sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
            let v = i32::try_from(bytes).unwrap_or(i32::MAX);
            // SAFETY: the caller bound the context and `raw` is a live function; the call sets one attribute.
            check(unsafe { sys::cuFuncSetAttribute(self.raw, attr, v) }, "cuFuncSetAttribute")?;
            self.dynamic_shared_limit.fetch_max(bytes, Ordering::Relaxed);
        }
        Ok(())
    }

    /// How many CTAs of `threads` threads and `shared_mem_bytes` of dynamic shared memory each this GPU can
    /// hold resident at once: the driver's occupancy per SM (`cuOccupancyMaxActiveBlocksPerMultiprocessor`,
    /// from the kernel's registers and shared memory) times the SMs. A cooperative launch of more is refused
    /// by the driver; kernels of other streams running meanwhile (another rank's, the emulated NIC's engine)
    /// take room from it.
    ///
    /// # Errors
    /// The driver's error as [`Error::Cuda`] (for instance more threads per block than the kernel can take).
    pub fn max_co_resident_blocks(&self, threads: u32, shared_mem_bytes: u32) -> Result<u32> {
        self.module.shared.bind()?;
        self.opt_in_shared(shared_mem_bytes)?;
        let mut per_sm: c_int = 0;
        let threads = c_int::try_from(threads).unwrap_or(c_int::MAX);
        // SAFETY: the context is bound and `raw` is a live function; the call writes one int.
        let status = unsafe {
            sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(&mut per_sm, self.raw, threads, shared_mem_bytes as usize)
        };
        check(status, "cuOccupancyMaxActiveBlocksPerMultiprocessor")?;
        Ok(u32::try_from(per_sm).unwrap_or(0).saturating_mul(self.module.shared.multiprocessors))
    }

    /// Refuses a co-resident launch of `cfg` that the GPU cannot hold at once, naming the limit.
    fn check_co_resident(&self, cfg: &LaunchConfig) -> Result<()> {
        if !self.module.shared.cooperative {
            return Err(Error::Unavailable(format!(
                "launch of `{}` with every CTA resident: this GPU takes no cooperative launches",
                self.name
            )));
        }
        // Saturating: the shape's fields are the caller's, not yet checked by the driver.
        let count = |d: [u32; 3]| d.iter().fold(1u64, |n, &x| n.saturating_mul(u64::from(x)));
        let (ctas, threads) = (count(cfg.grid), count(cfg.block));
        if threads > 1024 {
            return Err(Error::InvalidArgument(format!(
                "launch of `{}` with blocks of {threads} threads: at most 1024",
                self.name
            )));
        }
        let most = self.max_co_resident_blocks(threads as u32, cfg.shared_mem_bytes)?;
        if ctas > u64::from(most) {
            return Err(Error::InvalidArgument(format!(
                "launch of `{}` with every CTA resident: {ctas} CTAs of {threads} threads ({} bytes of dynamic shared \
                 memory) cannot all be resident on this GPU, which holds at most {most} ({} SMs)",
                self.name, cfg.shared_mem_bytes, self.module.shared.multiprocessors
            )));
        }
        Ok(())
    }

    /// Launches the kernel on `stream` (`cuLaunchKernel`; `cuLaunchCooperativeKernel` when `cfg.co_resident`)
    /// with `cfg` and `args` (one per kernel parameter, in
    /// order, each passed by value). Returns once the launch is queued; wait for it with [`Stream::wait`]
    /// (bounded) or [`Stream::synchronize`].
    ///
    /// # Safety
    /// 1. Every address in `args` must be valid for what the kernel does with it (device addresses of this
    ///    GPU: [`crate::mem::MappedBuf::device_addr`], [`super::DeviceBuffer::device_addr`]), and the memory must
    ///    stay allocated until the kernel has completed.
    /// 2. Each argument must be what the kernel expects at that position. Sizes are checked when the driver can
    ///    tell ([`Kernel::param_sizes`]); without `cuFuncGetParamInfo`, a wrong count or size is undefined
    ///    behavior (the driver reads as many bytes as the parameter has).
    /// 3. Memory the kernel writes may be read by the host only with atomics or volatile loads while it runs.
    ///
    /// # Errors
    /// - [`Error::InvalidArgument`]: `stream` belongs to another GPU context, a grid or block dimension is 0,
    ///   `args` do not match the kernel's parameter sizes, or a `co_resident` grid is larger than
    ///   [`Kernel::max_co_resident_blocks`].
    /// - [`Error::Unavailable`]: `co_resident` on a GPU without cooperative launches.
    /// - [`Error::Cuda`]: the driver rejects the launch (e.g. too many threads per block or registers, too much
    ///   shared memory: `CUDA_ERROR_INVALID_VALUE`, `CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES`).
    pub unsafe fn launch(&self, stream: &Stream, cfg: &LaunchConfig, args: &[KernelArg<'_>]) -> Result<()> {
        if !Shared::same(&stream.shared, &self.module.shared) {
            return Err(Error::InvalidArgument(format!("launch of `{}` on a stream of another GPU", self.name)));
        }
        if cfg.grid.contains(&0) || cfg.block.contains(&0) {
            return Err(Error::InvalidArgument(format!(
                "launch of `{}` with grid {:?} and block {:?}: every dimension must be at least 1",
                self.name, cfg.grid, cfg.block
            )));
        }
        if let Some(sizes) = &self.param_sizes {
            let given: Vec<usize> = args.iter().map(KernelArg::size).collect();
            if &given != sizes {
                return Err(Error::InvalidArgument(format!(
                    "kernel `{}` takes parameters of {sizes:?} bytes; got arguments of {given:?} bytes",
                    self.name
                )));
            }
        }
        self.module.shared.bind()?;
        self.opt_in_shared(cfg.shared_mem_bytes)?;
        if cfg.co_resident {
            self.check_co_resident(cfg)?;
        }
        // The driver reads each parameter's bytes through a pointer; scalars live in `words` until the call ends.
        let words: Vec<[u8; 8]> = args
            .iter()
            .map(|a| {
                let mut w = [0u8; 8];
                match a {
                    KernelArg::U32(v) => w[..4].copy_from_slice(&v.to_ne_bytes()),
                    KernelArg::U64(v) => w = v.to_ne_bytes(),
                    KernelArg::Bytes(_) => {}
                }
                w
            })
            .collect();
        let mut params: Vec<*mut c_void> = args
            .iter()
            .zip(&words)
            .map(|(a, w)| match a {
                KernelArg::Bytes(b) => b.as_ptr().cast_mut().cast(),
                _ => w.as_ptr().cast_mut().cast(),
            })
            .collect();
        let params_ptr = if params.is_empty() { std::ptr::null_mut() } else { params.as_mut_ptr() };
        let [gx, gy, gz] = cfg.grid;
        let [bx, by, bz] = cfg.block;
        if let Ok(mut last) = stream.last_kernel.lock() {
            *last = Some(Arc::clone(&self.name));
        }
        // SAFETY: the context is bound; `raw` is a live function and `stream.raw` a live stream of the same
        // context; `params` holds one pointer per argument, each to at least the argument's bytes, alive for
        // the call (the driver copies them); what the kernel does with the values is the caller's contract.
        let (status, call) = unsafe {
            let (g, b, smem) =
                ([gx, gy, gz].map(|d| d as c_uint), [bx, by, bz].map(|d| d as c_uint), cfg.shared_mem_bytes);
            if cfg.co_resident {
                let s = sys::cuLaunchCooperativeKernel(
                    self.raw, g[0], g[1], g[2], b[0], b[1], b[2], smem, stream.raw, params_ptr,
                );
                (s, "cuLaunchCooperativeKernel")
            } else {
                let s = sys::cuLaunchKernel(
                    self.raw,
                    g[0],
                    g[1],
                    g[2],
                    b[0],
                    b[1],
                    b[2],
                    smem,
                    stream.raw,
                    params_ptr,
                    std::ptr::null_mut(),
                );
                (s, "cuLaunchKernel")
            }
        };
        check(status, call).map_err(|e| match e {
            Error::Cuda { message, status } => {
                Error::Cuda { message: format!("launching `{}`: {message}", self.name), status }
            }
            other => other,
        })
    }
}
