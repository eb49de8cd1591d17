//! Loading libcuda without panicking, and turning CUDA driver status codes into [`Error`]s.
//!
//! # What cudarc does when libcuda is missing
//! With the `dynamic-loading` feature, every function of `cudarc::driver::sys` resolves its symbol on first use
//! through `sys::culib()`, a `OnceLock<libloading::Library>` that tries `libcuda.so`, `libcuda.so.1`, … and
//! **panics** ("Unable to dynamically load the \"cuda\" shared library …") when none loads; a symbol missing
//! from the library that did load **panics** too ("Missing symbol cuXxx"). Both happen inside the first call,
//! `cuInit` included, so calling cudarc on a machine without a driver aborts the caller with a panic.
//!
//! We never let it get there: [`check_library`] first asks `sys::is_culib_present()` (same candidate names, same
//! order, returns `false` instead of panicking), then resolves every symbol that this module calls through the
//! very `Library` cudarc will use (`sys::culib()`, which cannot panic once a candidate is known to load). Only
//! when both checks pass do we call into cudarc. This needs no panic hook: a `catch_unwind` with a silenced hook
//! would swap a process-global hook while other threads (parallel tests) may be panicking for real.

use std::ffi::CStr;
use std::sync::OnceLock;

use cudarc::driver::result::DriverError;
use cudarc::driver::sys;

use crate::{Error, Result};

/// Driver entry points this module calls, by the exact names cudarc's `sys` layer (CUDA 12.8 API) loads.
const REQUIRED_SYMBOLS: &[&str] = &[
    "cuInit",
    "cuDriverGetVersion",
    "cuGetErrorName",
    "cuGetErrorString",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetAttribute",
    "cuDeviceGetName",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxGetCurrent",
    "cuCtxSetCurrent",
    "cuMemHostAlloc",
    "cuMemHostGetDevicePointer_v2",
    "cuMemFreeHost",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemsetD8Async",
    "cuMemcpyAsync",
    "cuMemcpyHtoDAsync_v2",
    "cuMemcpyDtoHAsync_v2",
    "cuMemcpyDtoDAsync_v2",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuStreamQuery",
    "cuStreamSynchronize",
    "cuStreamWaitValue32_v2",
    "cuStreamWriteValue32_v2",
    "cuEventCreate",
    "cuEventRecord",
    "cuEventElapsedTime",
    "cuEventDestroy_v2",
    "cuModuleLoadDataEx",
    "cuModuleGetFunction",
    "cuModuleUnload",
    "cuFuncGetAttribute",
    "cuFuncSetAttribute",
    "cuLaunchKernel",
    "cuLaunchCooperativeKernel",
    "cuOccupancyMaxActiveBlocksPerMultiprocessor",
];

/// Entry points used when present (newer drivers); their absence only disables a check.
const OPTIONAL_SYMBOLS: &[&str] = &["cuFuncGetParamInfo"];

/// What the driver library offers, found once per process.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DriverLibrary {
    /// `cuFuncGetParamInfo` (CUDA 12.4+) resolves: kernel argument sizes can be checked at launch.
    pub(crate) has_param_info: bool,
}

/// Checks, once per process, that libcuda loads and has every symbol we call. After `Ok`, cudarc's `sys`
/// functions of [`REQUIRED_SYMBOLS`] cannot panic for a missing library or symbol.
///
/// # Errors
/// [`Error::Unavailable`] with one line: no loadable libcuda, or a libcuda too old for a symbol we need.
pub(crate) fn check_library() -> Result<DriverLibrary> {
    static CHECKED: OnceLock<std::result::Result<DriverLibrary, String>> = OnceLock::new();
    CHECKED.get_or_init(probe).clone().map_err(Error::Unavailable)
}

fn probe() -> std::result::Result<DriverLibrary, String> {
    // SAFETY: `is_culib_present` only tries `libloading::Library::new` on cudarc's candidate names and drops what
    // it loaded; loading libcuda runs its initializers, which is what any CUDA use does.
    if !unsafe { sys::is_culib_present() } {
        return Err("no GPU: libcuda.so not found (no NVIDIA driver on this machine)".to_string());
    }
    // SAFETY: a candidate loads (checked just above), so `culib` returns it instead of panicking; the library
    // stays loaded for the life of the process (cudarc keeps it in a static).
    let lib = unsafe { sys::culib() };
    let has = |name: &str| {
        // SAFETY: we only look the symbol up and never call it through this type; the pointer type is a
        // placeholder of the right size.
        unsafe { lib.get::<unsafe extern "C" fn()>(name.as_bytes()) }.is_ok()
    };
    if let Some(missing) = REQUIRED_SYMBOLS.iter().find(|s| !has(s)) {
        return Err(format!("no GPU: libcuda lacks {missing} (driver older than the CUDA 12.8 API we use)"));
    }
    let has_param_info = OPTIONAL_SYMBOLS.iter().all(|s| has(s));
    Ok(DriverLibrary { has_param_info })
}

/// Names a driver status, e.g. `CUDA_ERROR_OUT_OF_MEMORY (out of memory)`.
pub(crate) fn describe(err: DriverError) -> String {
    let name = err.error_name().map(CStr::to_string_lossy).map(|s| s.into_owned());
    let text = err.error_string().map(CStr::to_string_lossy).map(|s| s.into_owned());
    match (name, text) {
        (Ok(name), Ok(text)) => format!("{name} ({text})"),
        (Ok(name), Err(_)) => name,
        _ => format!("CUresult {}", err.0 as u32),
    }
}

impl From<DriverError> for Error {
    /// Any driver status as [`Error::Cuda`] with its name and description.
    fn from(err: DriverError) -> Self {
        Error::Cuda { message: describe(err), status: Some(err.0) }
    }
}

/// [`Error::Cuda`] for a failed call: `call: NAME (text)`, and the status.
pub(crate) fn failed(call: &str, e: DriverError) -> Error {
    Error::Cuda { message: format!("{call}: {}", describe(e)), status: Some(e.0) }
}

/// Turns a driver status into `Ok` or [`Error::Cuda`] naming the call that failed (`call: NAME (text)`).
pub(crate) fn check(status: sys::CUresult, call: &str) -> Result<()> {
    status.result().map_err(|e| failed(call, e))
}
