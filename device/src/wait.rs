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

/// How long a wait for a peer's signal goes before it watches its QP's CQ whatever it awaits
/// ([`bounded_watching`]), ns. Longer than a round trip through the emulated NIC (11-20 µs with either queue
/// placement), far shorter than any wait's bound: a dead peer is still an error within tens of µs.
pub const WATCH_AFTER_NS: u64 = 50_000;

/// Whether a try of [`bounded_watching`] looks at the QP's CQ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Watch {
    /// No look on this try.
    Skip,
    /// Look if a CQE of the waiter's own work is due: every 8th try, from the first, before the signal is late.
    IfDue,
    /// Look: every 8th try once the signal is late ([`WATCH_AFTER_NS`]), and the last try before a timeout.
    Look,
}

/// As [`bounded`], for a wait on a peer's signal that also watches a QP for an error CQE (the peer died with
/// work of the QP outstanding): `step(watch)` looks at the CQ as [`Watch`] says. While a CQE of the waiter's
/// own work is due, taking it during the wait spares the flush that usually follows an exchange from taking it
/// on its critical path (a Device-Exclusive ping-pong through port channels on an H100 took 3.3 µs longer a
/// round trip with GPU-memory queues, 7.1 µs with host-memory queues, when its waits did not look). Once
/// nothing is due the wait looks only when the signal is late: with the CQ in host memory a look is a read
/// across PCIe, and one that coincided with the signal delayed seeing it by up to 5 µs (the leg of a
/// host-memory ping-pong in which that rank's own CQE was taken: 7.7-9.5 µs, the other leg 4.5). The last try
/// before a timeout looks too, so that an error CQE already there ends the wait as itself whatever
/// `timeout_ns` is. A [`Error::PeerGone`] from a watching step is final only once `step(Watch::Skip)`, called
/// right after it, still does not find what the wait awaits: the mark is read after the step's look, and what
/// the peer sent before it left may have landed between the two.
#[inline(always)]
pub fn bounded_watching<T>(
    timeout_ns: u64,
    mut step: impl FnMut(Watch) -> Result<Option<T>>,
    on: impl FnOnce() -> WaitOn,
) -> Result<T> {
    let mut calls = 0u32;
    poll(
        timeout_ns,
        |waited| {
            calls = calls.wrapping_add(1);
            let watch = if waited > timeout_ns {
                Watch::Look
            } else if calls % 8 != 1 {
                Watch::Skip
            } else if waited >= WATCH_AFTER_NS {
                Watch::Look
            } else {
                Watch::IfDue
            };
            match step(watch) {
                // The watch reads the peer's departure after the step looked at what it awaits, and what the
                // peer sent before it left may have landed between the two reads (its mark is written a grace
                // period after its goodbye, which a sender that flushed sends once its signal has landed): one
                // more look, without watching, takes that instead of ending the wait with `PeerGone`.
                Err(gone @ Error::PeerGone(_)) => step(Watch::Skip)?.map_or(Err(gone), |v| Ok(Step::Done(v))),
                done => Ok(done?.map_or(Step::Idle, Step::Done)),
            }
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
    use super::{bounded_watching, Watch, WATCH_AFTER_NS};
    use crate::error::{Error, PayloadMismatch, PeerGone, WaitOn};
    use crate::sync;

    fn on() -> WaitOn {
        WaitOn::Semaphore { addr: 0, expected: 1, seen: 0 }
    }

    /// Every 8th try from the first may look if something is due; none looks unconditionally before the wait
    /// has lasted `WATCH_AFTER_NS`; then every 8th does.
    #[test]
    fn a_watching_wait_looks_if_due_then_once_late() {
        let start = sync::clock_ns();
        let mut seen: std::vec::Vec<(u32, Watch, u64)> = std::vec::Vec::new();
        let first_look = bounded_watching(
            1_000_000_000,
            |watch| {
                let at = sync::clock_ns().wrapping_sub(start);
                seen.push((seen.len() as u32 + 1, watch, at));
                Ok((watch == Watch::Look).then_some(at))
            },
            on,
        )
        .unwrap();
        assert!(first_look >= WATCH_AFTER_NS, "looked after {first_look} ns");
        for &(call, watch, _) in &seen {
            let want = match (call % 8 == 1, call as usize == seen.len()) {
                (true, true) => Watch::Look,
                (true, false) => Watch::IfDue,
                (false, _) => Watch::Skip,
            };
            assert_eq!(watch, want, "call {call} of {}", seen.len());
        }
    }

    /// With a bound shorter than the delay, the last call before the timeout still looks: an error there ends
    /// the wait as itself, not as a timeout.
    #[test]
    fn a_short_watching_wait_looks_once_before_timing_out() {
        let mut looks = 0u32;
        let r: Result<(), Error> = bounded_watching(
            2_000,
            |watch| {
                if watch == Watch::Look {
                    looks += 1;
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

    /// A step looks at what it awaits, then watches: the peer's signal may land between the two reads, and its
    /// departure be marked after it (the host marks a departed peer only a grace period after its goodbye,
    /// which a sender that flushed sends after its signal landed). Such a wait ends with the signal, from one
    /// more look without watching, not with `PeerGone`; one whose signal is still missing then ends with
    /// `PeerGone` after that one look. Other errors of the watch end the wait as they are.
    #[test]
    fn a_peer_gone_found_by_the_watch_is_checked_against_what_the_wait_awaits_once_more() {
        let gone = Error::PeerGone(PeerGone { rank: 3, broken: false });
        for landed_meanwhile in [true, false] {
            let (mut log, mut landed) = (std::vec::Vec::new(), false);
            let r: Result<usize, Error> = bounded_watching(
                1_000_000_000,
                |watch| {
                    log.push(watch);
                    if landed {
                        return Ok(Some(log.len()));
                    }
                    if watch == Watch::Look {
                        // The signal was not there at this step's look; it lands now (or not), before the mark
                        // is read.
                        landed = landed_meanwhile;
                        return Err(gone);
                    }
                    Ok(None)
                },
                on,
            );
            let first_look = log.iter().position(|&w| w == Watch::Look).expect("a look");
            assert_eq!(log[first_look..], [Watch::Look, Watch::Skip], "one more call, without watching");
            match landed_meanwhile {
                true => assert_eq!(r, Ok(first_look + 2), "the signal that landed ends the wait"),
                false => assert_eq!(r, Err(gone)),
            }
        }
        // An error CQE found by the watch ends the wait at once: the QP failed, whatever else arrives.
        let cqe = Error::Cqe(crate::error::CqeError { syndrome: 0x15, vendor_err_synd: 0, wqe_counter: 1, qpn: 7 });
        let mut log = std::vec::Vec::new();
        let r: Result<(), Error> = bounded_watching(
            1_000_000_000,
            |watch| {
                log.push(watch);
                if watch == Watch::Look {
                    return Err(cqe);
                }
                Ok(None)
            },
            on,
        );
        assert_eq!(r, Err(cqe));
        assert_eq!(log.iter().filter(|&&w| w == Watch::Look).count(), 1);
        assert_eq!(log.last(), Some(&Watch::Look), "no call after the error");
    }
}
