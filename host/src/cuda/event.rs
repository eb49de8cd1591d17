//! CUDA events that time work on a stream, for [`crate::launch::Kernel::launch_timed`].

use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::sys;

use super::driver::check;
use super::{Shared, Stream};
use crate::{Error, Result};

/// A CUDA event created with timing on (`cuEventCreate`, `CU_EVENT_DEFAULT`): recorded on a stream, it
/// completes when the work queued before it has, and the driver keeps the GPU time at which it did. Destroyed
/// on drop (`cuEventDestroy`; an event still pending is released by the driver once it completes).
pub(crate) struct Event {
    shared: Arc<Shared>,
    raw: sys::CUevent,
}

// SAFETY: a `CUevent` handle may be used from any thread of the process (the driver API is thread-safe);
// every use binds the owning context first.
unsafe impl Send for Event {}
// SAFETY: as above; the type has no interior state of its own.
unsafe impl Sync for Event {}

impl Event {
    /// Creates an event of `shared`'s context.
    ///
    /// # Errors
    /// The driver's error, as [`Error::Cuda`].
    pub(crate) fn new(shared: &Arc<Shared>) -> Result<Self> {
        shared.bind()?;
        let mut raw: sys::CUevent = std::ptr::null_mut();
        let flags = sys::CUevent_flags::CU_EVENT_DEFAULT as u32;
        // SAFETY: the context is current; the call writes one handle through a valid pointer.
        check(unsafe { sys::cuEventCreate(&mut raw, flags) }, "cuEventCreate")?;
        Ok(Event { shared: Arc::clone(shared), raw })
    }

    /// Queues the event on `stream` (`cuEventRecord`): it completes when the work queued on `stream` before it
    /// has completed.
    ///
    /// # Errors
    /// The driver's error, as [`Error::Cuda`] (e.g. `CUDA_ERROR_INVALID_HANDLE` for a stream of another
    /// context).
    pub(crate) fn record(&self, stream: &Stream) -> Result<()> {
        self.shared.bind()?;
        // SAFETY: the context is bound; `raw` is a live event and `stream.raw` a live stream (the driver refuses
        // one of another context with an error).
        check(unsafe { sys::cuEventRecord(self.raw, stream.raw) }, "cuEventRecord")
    }

    /// The GPU time from `start` completing to this event completing (`cuEventElapsedTime`; the driver's
    /// resolution is about 0.5 µs). Call it once both have completed (the stream they were recorded on has
    /// been waited for): it never blocks.
    ///
    /// # Errors
    /// [`Error::Cuda`]: `CUDA_ERROR_NOT_READY` when either has not completed, the driver's other errors (an
    /// event never recorded, events of two contexts), or a time that is negative or not a number (`start`
    /// completed after this event), which no status names.
    pub(crate) fn elapsed_since(&self, start: &Event) -> Result<Duration> {
        self.shared.bind()?;
        let mut ms: f32 = 0.0;
        // SAFETY: the context is bound; both events are live (the driver refuses events of two contexts with an
        // error); the call writes one float through a valid pointer.
        check(unsafe { sys::cuEventElapsedTime(&mut ms, start.raw, self.raw) }, "cuEventElapsedTime")?;
        Duration::try_from_secs_f64(f64::from(ms) / 1e3).map_err(|_| Error::Cuda {
            message: format!("cuEventElapsedTime: {ms} ms from one event to the next is not a duration"),
            status: None,
        })
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        let raw = self.raw;
        // SAFETY: `raw` is a live event of this context, destroyed once here; a pending one is released by the
        // driver when it completes (cuEventDestroy does not wait for it).
        self.shared.release("cuEventDestroy", || unsafe { sys::cuEventDestroy_v2(raw) });
    }
}
