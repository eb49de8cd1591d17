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
    poll(timeout_ns, |_| step(), on)
}

/// How long a wait for a peer's signal goes before it also watches its QP's CQ ([`bounded_watching`]), ns.
/// Longer than a round trip through the emulated NIC (11-20 µs with either queue placement), far shorter than
/// any wait's bound: a signal that comes in time is waited for without a look at the CQ, and a dead peer is
/// still an error within tens of µs. With the CQ in host memory each look is a read across PCIe and, when it
/// takes CQEs, a system-scope release of the consumer index: looks from the start of every wait made a
/// host-memory ping-pong by doorbell 18.3-19.8 µs a round trip, none 13.3-13.8 µs (H100, one lease).
pub const WATCH_AFTER_NS: u64 = 50_000;

/// As [`bounded`], for a wait on a peer's signal that also watches a QP for an error CQE (the peer died with
/// work of the QP outstanding): `step(watch)` looks at the CQ only when `watch` is set, which is on every 8th
/// call once the wait has lasted [`WATCH_AFTER_NS`], and on the last call before a timeout, so that an error
/// CQE already there ends the wait as itself whatever `timeout_ns` is.
#[inline(always)]
pub fn bounded_watching<T>(
    timeout_ns: u64,
    mut step: impl FnMut(bool) -> Result<Option<T>>,
    on: impl FnOnce() -> WaitOn,
) -> Result<T> {
    let mut calls = 0u32;
    poll(
        timeout_ns,
        |waited| {
            calls = calls.wrapping_add(1);
            let watch = waited > timeout_ns || (waited >= WATCH_AFTER_NS && calls.is_multiple_of(8));
            Ok(step(watch)?.map_or(Step::Idle, Step::Done))
        },
        on,
    )
}

/// The loop of every bounded wait: calls `step` with the nanoseconds waited so far (0 on the first call, which
/// is made before the clock is read), backing off between calls, until it is done, fails, or has been called
/// once with more than `timeout_ns` waited.
#[inline(always)]
fn poll<T>(timeout_ns: u64, mut step: impl FnMut(u64) -> Result<Step<T>>, on: impl FnOnce() -> WaitOn) -> Result<T> {
    if let Step::Done(v) = step(0)? {
        return Ok(v);
    }
    let start = sync::clock_ns();
    let mut spins = 0u32;
    loop {
        sync::backoff(spins);
        spins = spins.saturating_add(1);
        let waited = sync::clock_ns().wrapping_sub(start);
        match step(waited)? {
            Step::Done(v) => return Ok(v),
            Step::Progress => spins = 0,
            Step::Idle => {}
        }
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

#[cfg(all(test, not(loom)))]
mod tests {
    use super::{bounded_watching, WATCH_AFTER_NS};
    use crate::error::{Error, PayloadMismatch, WaitOn};
    use crate::sync;

    fn on() -> WaitOn {
        WaitOn::Semaphore { addr: 0, expected: 1, seen: 0 }
    }

    /// No look before the wait has lasted `WATCH_AFTER_NS`; then every 8th call looks.
    #[test]
    fn a_watching_wait_looks_only_after_its_delay() {
        let start = sync::clock_ns();
        let (mut calls, mut looks) = (0u32, 0u32);
        let first_look = bounded_watching(
            1_000_000_000,
            |watch| {
                calls += 1;
                if watch {
                    looks += 1;
                    // The third look ends the wait.
                    return Ok((looks == 3).then(|| sync::clock_ns().wrapping_sub(start)));
                }
                Ok(None)
            },
            on,
        )
        .unwrap();
        assert!(first_look >= WATCH_AFTER_NS, "looked after {first_look} ns");
        assert!(calls.is_multiple_of(8), "{calls} calls");
    }

    /// With a bound shorter than the delay, the last call before the timeout still looks: an error there ends
    /// the wait as itself, not as a timeout.
    #[test]
    fn a_short_watching_wait_looks_once_before_timing_out() {
        let mut looks = 0u32;
        let r: Result<(), Error> = bounded_watching(
            2_000,
            |watch| {
                looks += u32::from(watch);
                if watch {
                    return Err(Error::Payload(PayloadMismatch { iter: 1, offset: 0, expected: 1, seen: 2 }));
                }
                Ok(None)
            },
            on,
        );
        assert!(matches!(r, Err(Error::Payload(_))), "{r:?}");
        assert_eq!(looks, 1);
        // And with nothing found, the timeout names what was waited for.
        let r: Result<(), Error> = bounded_watching(2_000, |_| Ok(None), on);
        assert!(matches!(r, Err(Error::Timeout(t)) if t.waited_ns > 2_000 && t.on == on()), "{r:?}");
    }
}
