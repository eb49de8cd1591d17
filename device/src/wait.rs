//! Bounded polling: every device-side wait goes through [`bounded`], so none can hang forever, and each one
//! reports what it waited for.

use crate::error::{Error, Result, Timeout, WaitOn};
use crate::sync;

/// What one step of a [`bounded_steps`] wait found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step<T> {
    /// The wait is over, with this value.
    Done(T),
    /// Not yet, but something moved (e.g. CQEs were retired): the back-off starts again from its shortest
    /// pause, so that a wait that makes progress keeps up with it.
    Progress,
    /// Nothing moved: the back-off grows.
    Idle,
}

/// Calls `step` until it returns `Some` (done) or an error, backing off between calls; after `timeout_ns`
/// nanoseconds returns [`Error::Timeout`] with the [`WaitOn`] that `on` describes at that moment.
#[inline(always)]
pub fn bounded<T>(
    timeout_ns: u64,
    mut step: impl FnMut() -> Result<Option<T>>,
    on: impl FnOnce() -> WaitOn,
) -> Result<T> {
    bounded_steps(timeout_ns, || Ok(step()?.map_or(Step::Idle, Step::Done)), on)
}

/// As [`bounded`], for a `step` that also says when it made progress without finishing ([`Step::Progress`]):
/// the back-off then starts again from its shortest pause. The timeout counts from the first call whatever
/// progress is made, so the wait stays bounded.
#[inline(always)]
pub fn bounded_steps<T>(
    timeout_ns: u64,
    mut step: impl FnMut() -> Result<Step<T>>,
    on: impl FnOnce() -> WaitOn,
) -> Result<T> {
    if let Step::Done(v) = step()? {
        return Ok(v);
    }
    let start = sync::clock_ns();
    let mut spins = 0u32;
    loop {
        sync::backoff(spins);
        spins = spins.saturating_add(1);
        match step()? {
            Step::Done(v) => return Ok(v),
            Step::Progress => spins = 0,
            Step::Idle => {}
        }
        let waited = sync::clock_ns().wrapping_sub(start);
        if waited > timeout_ns {
            return Err(Error::Timeout(Timeout { on: on(), waited_ns: waited }));
        }
    }
}

/// Waits until the 8-byte semaphore at `sem` (host-order `u64`, written by the NIC's atomics) is at least
/// `expected`; returns the value seen. MSCCL++ `Semaphore::wait` / NVSHMEM `signal_wait_until(GE)`.
///
/// # Errors
/// [`Error::Timeout`] with [`WaitOn::Semaphore`] after `timeout_ns`.
///
/// # Safety
/// `sem` must be valid for reads and 8-byte aligned for the whole wait.
#[inline(always)]
pub unsafe fn semaphore_ge(sem: *const u64, expected: u64, timeout_ns: u64) -> Result<u64> {
    let seen = core::cell::Cell::new(0);
    bounded(
        timeout_ns,
        || {
            // SAFETY: the caller guarantees `sem`.
            seen.set(unsafe { sync::load_acquire_u64(sem) });
            Ok((seen.get() >= expected).then_some(seen.get()))
        },
        || WaitOn::Semaphore { addr: sem as u64, expected, seen: seen.get() },
    )
}
