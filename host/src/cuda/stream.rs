//! Non-blocking CUDA streams and the bounded wait.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cudarc::driver::sys;

use super::driver::check;
use super::Shared;
use crate::{Error, Result};

/// A CUDA stream created with `CU_STREAM_NON_BLOCKING` (`cuStreamCreate`): its work never waits for the legacy
/// default stream. Kernels launched on one stream run in order; kernels on different streams may run at the
/// same time (needed when two kernels wait on each other). Destroyed on drop (`cuStreamDestroy`; work already
/// queued still completes).
pub struct Stream {
    pub(crate) shared: Arc<Shared>,
    pub(crate) raw: sys::CUstream,
    /// Name of the last kernel launched on this stream, for the message of a timed-out wait.
    pub(crate) last_kernel: Mutex<Option<Arc<str>>>,
}

// SAFETY: a `CUstream` handle may be used from any thread of the process (the driver API is thread-safe);
// every use binds the owning context first.
unsafe impl Send for Stream {}
// SAFETY: as above; the only interior state is behind a `Mutex`.
unsafe impl Sync for Stream {}

impl fmt::Debug for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stream").field("raw", &self.raw).finish()
    }
}

/// How long [`Stream::wait`] polls back to back before it starts yielding, then sleeping.
const SPIN: Duration = Duration::from_micros(50);
const YIELD: Duration = Duration::from_millis(2);
const SLEEP: Duration = Duration::from_micros(100);

impl Stream {
    pub(crate) fn new(shared: &Arc<Shared>) -> Result<Self> {
        shared.bind()?;
        let mut raw: sys::CUstream = std::ptr::null_mut();
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        // SAFETY: the context is current; the call writes one handle through a valid pointer.
        check(unsafe { sys::cuStreamCreate(&mut raw, flags) }, "cuStreamCreate")?;
        Ok(Stream { shared: Arc::clone(shared), raw, last_kernel: Mutex::new(None) })
    }

    /// Whether all work queued on the stream has completed (`cuStreamQuery`); never blocks.
    ///
    /// # Errors
    /// [`Error::Cuda`] when queued work failed (e.g. a kernel faulted: `CUDA_ERROR_ILLEGAL_ADDRESS`; such
    /// errors are sticky and the context is then unusable).
    pub fn is_idle(&self) -> Result<bool> {
        self.shared.bind()?;
        // SAFETY: `raw` is a live stream of the bound context.
        match unsafe { sys::cuStreamQuery(self.raw) } {
            sys::CUresult::CUDA_SUCCESS => Ok(true),
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            status => check(status, "cuStreamQuery").map(|()| true),
        }
    }

    /// Waits until all work queued on the stream (kernels, copies) has completed, for at most `timeout`: polls
    /// `cuStreamQuery`, back to back for 50 µs, then yielding the thread for 2 ms, then every 100 µs. A kernel
    /// that never ends gives an error instead of a hang.
    ///
    /// A hung kernel cannot be stopped: CUDA has no call that kills a running kernel. After a timeout this
    /// GPU is marked hung ([`super::Gpu::is_hung`]): drops of its objects leak instead of freeing (a free could
    /// wait for the kernel forever) and the primary context is never released. Report and exit the process;
    /// the driver then tears the context down. (A later `wait` may still succeed if the kernel does end.)
    ///
    /// # Errors
    /// - [`Error::Device`] naming the last kernel launched on the stream when `timeout` passes first.
    /// - [`Error::Cuda`] when queued work failed (see [`Stream::is_idle`]).
    pub fn wait(&self, timeout: Duration) -> Result<()> {
        let start = Instant::now();
        loop {
            if self.is_idle()? {
                return Ok(());
            }
            let waited = start.elapsed();
            if waited >= timeout {
                self.shared.mark_hung();
                let what = match self.last_kernel.lock().ok().and_then(|k| k.clone()) {
                    Some(name) => format!("kernel `{name}`"),
                    None => "stream work".to_string(),
                };
                return Err(Error::Device(format!(
                    "{what} still running after {:.3} s (bounded wait on the host timed out; a hung kernel \
                     cannot be stopped: exit the process)",
                    waited.as_secs_f64()
                )));
            }
            if waited < SPIN {
                std::hint::spin_loop();
            } else if waited < YIELD {
                std::thread::yield_now();
            } else {
                std::thread::sleep(SLEEP.min(timeout - waited));
            }
        }
    }

    /// Waits without a time limit until all work queued on the stream has completed (`cuStreamSynchronize`).
    /// Use it for streams that carry only copies or kernels known to end; use [`Stream::wait`] for kernels that
    /// spin on memory.
    ///
    /// # Errors
    /// [`Error::Cuda`] when queued work failed.
    pub fn synchronize(&self) -> Result<()> {
        self.shared.bind()?;
        // SAFETY: `raw` is a live stream of the bound context.
        check(unsafe { sys::cuStreamSynchronize(self.raw) }, "cuStreamSynchronize")
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let raw = self.raw;
        // SAFETY: `raw` is a live stream of this context, destroyed once here; work still queued completes
        // (cuStreamDestroy does not wait for it).
        self.shared.release("cuStreamDestroy", || unsafe { sys::cuStreamDestroy_v2(raw) });
    }
}
