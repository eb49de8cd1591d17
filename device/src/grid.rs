//! A barrier over every CTA of a launch (CUDA cooperative groups' `grid.sync()`), for kernels whose CTAs wait
//! on each other: an all-to-all that exchanges counts before it moves data, a step that must see every CTA's
//! writes. The launch must keep every CTA resident at once (`LaunchConfig::co_resident` on the host, which
//! refuses a grid the GPU cannot hold); on the `cpu` executor every thread runs at once anyway.
//!
//! One `u64` counter per barrier, which the host zeroes before the launch: at each barrier, thread 0 of every
//! CTA adds 1 and waits until the counter reaches the CTAs' count times the barriers passed, while the other
//! threads of its CTA wait at the CTA barrier. The wait is bounded, so a CTA that never arrives (it returned
//! early, failed, or was never resident) ends the others' waits with an error instead of a hang.

use crate::error::{Error, InvalidArgument, Result, WaitOn};
use crate::launch::DevPtr;
use crate::scope::{Device, Scope};
use crate::thread::Thread;
use crate::wait::bounded;

/// One thread's handle on a grid-wide barrier; every thread of the launch makes its own on the same counter
/// ([`GridBarrier::new`]) and calls [`GridBarrier::wait`] as many times as every other (a thread that returns
/// first fails its CTA's waits).
#[derive(Debug)]
pub struct GridBarrier {
    counter: *mut u64,
    /// CTAs of the launch.
    ctas: u64,
    /// Barriers this thread has passed.
    passed: u64,
    timeout_ns: u64,
}

impl GridBarrier {
    /// The barrier on `counter` for the launch `t` runs in; each wait is bounded by `timeout_ns`.
    ///
    /// # Safety
    /// `counter` must be an 8-byte aligned `u64` that every CTA of the launch reaches (GPU memory on the GPU:
    /// its atomics are at GPU scope), zero when the launch starts, and used by nothing but this launch's
    /// `GridBarrier`s until it ends.
    #[inline(always)]
    pub unsafe fn new(t: &Thread, counter: DevPtr<u64>, timeout_ns: u64) -> Self {
        GridBarrier { counter: counter.addr() as *mut u64, ctas: t.grid_dim().count(), passed: 0, timeout_ns }
    }

    /// Waits until every thread of every CTA of the launch has called it as many times as this thread. What
    /// any thread of the grid stored to GPU memory before its call is visible to every thread after it (each
    /// CTA's barrier, then thread 0's release and acquire at GPU scope); for stores to host memory that other
    /// CTAs read, add [`crate::sync::fence_release_sys`] before the call.
    ///
    /// # Errors
    /// [`Error::Timeout`] on [`WaitOn::Semaphore`] (the counter, the count awaited and the last seen: how many
    /// CTA arrivals were missing) for thread 0 of a CTA whose wait ran out: a CTA that never arrived (returned
    /// before the call, failed, or was not resident, in a launch that was not co-resident);
    /// [`InvalidArgument::Team`] for the other threads of that CTA, and for every thread of a CTA some thread
    /// of which returned before this call (the CTA does not arrive then, and the other CTAs time out). The
    /// barrier is broken for the rest of the launch then: later waits end the same way.
    pub fn wait(&mut self, t: &Thread) -> Result<()> {
        self.passed += 1;
        let expected = self.passed.saturating_mul(self.ctas);
        // Every thread of the CTA has made its accesses before thread 0 releases them with its arrival; a CTA
        // whose threads are not all here (one returned: the barrier no longer waits for it) does not arrive.
        if t.sync_threads_count(true) != t.block_size() {
            return Err(Error::InvalidArgument(InvalidArgument::Team));
        }
        let mut r = Ok(());
        if t.tid() == 0 {
            let counter = self.counter;
            // SAFETY: the counter of `new`'s contract, only accessed atomically.
            unsafe {
                Device::fence_release();
                Device::fetch_add(counter, 1);
            }
            let seen = core::cell::Cell::new(0);
            r = bounded(
                self.timeout_ns,
                || {
                    // SAFETY: as above.
                    seen.set(unsafe { Device::load_acquire(counter) });
                    Ok((seen.get() >= expected).then_some(()))
                },
                || WaitOn::Semaphore { addr: counter as u64, expected, seen: seen.get() },
            );
        }
        // Thread 0's acquire is ordered before every thread's accesses after the CTA barrier.
        if t.sync_threads_or(r.is_err()) && r.is_ok() {
            return Err(Error::InvalidArgument(InvalidArgument::Team));
        }
        r
    }
}

#[cfg(all(test, not(target_arch = "nvptx64")))]
mod tests {
    use super::*;
    use crate::launch::{run_on_host, KernelFn};
    use crate::thread::Dim3;
    use core::sync::atomic::{AtomicU64, Ordering};
    use std::vec::Vec;

    /// What a thread of [`rounds`] ended with.
    const OK: u64 = 1;
    const STALE: u64 = 2;
    const TIMEOUT: u64 = 3;
    const TEAM: u64 = 4;

    /// In [`rounds`]' `leave`: only thread 0 of the CTA returns at once.
    const THREAD_0: u64 = 1 << 32;

    /// Counter, one slot per thread, one outcome per thread, rounds, a CTA that returns at once (`u64::MAX`:
    /// none; with [`THREAD_0`] set, only its thread 0 returns), and the waits' bound in ns.
    type Args = (DevPtr<u64>, DevPtr<AtomicU64>, DevPtr<AtomicU64>, u64, u64, u64);

    /// Each round every thread stores the round's number in its slot, passes the barrier, reads every slot of
    /// the grid (each must hold the round), and passes the barrier again before the next round's stores.
    fn rounds(t: &Thread, a: &Args, _: u64) {
        let &(counter, slots, outcomes, rounds, leave, timeout_ns) = a;
        let threads = t.grid_dim().count() * u64::from(t.block_size());
        // SAFETY: the test passes `threads` slots and outcomes, alive for the launch.
        let (slots, outcomes) = unsafe {
            (
                core::slice::from_raw_parts(slots.addr() as *const AtomicU64, threads as usize),
                core::slice::from_raw_parts(outcomes.addr() as *const AtomicU64, threads as usize),
            )
        };
        let me = t.global_id() as usize;
        if t.block() == leave & !THREAD_0 && (leave & THREAD_0 == 0 || t.tid() == 0) {
            return;
        }
        // SAFETY: the test's zeroed counter, used by this launch's barriers only.
        let mut barrier = unsafe { GridBarrier::new(t, counter, timeout_ns) };
        let outcome = (|| {
            for r in 1..=rounds {
                slots[me].store(r, Ordering::Relaxed);
                barrier.wait(t)?;
                if slots.iter().any(|s| s.load(Ordering::Relaxed) != r) {
                    return Ok(STALE);
                }
                barrier.wait(t)?;
            }
            Ok(OK)
        })();
        outcomes[me].store(
            match outcome {
                Ok(o) => o,
                Err(Error::Timeout(crate::error::Timeout { on: WaitOn::Semaphore { .. }, .. })) => TIMEOUT,
                Err(Error::InvalidArgument(InvalidArgument::Team)) => TEAM,
                Err(_) => 0,
            },
            Ordering::Relaxed,
        );
    }

    /// Runs [`rounds`] on `ctas` CTAs of `threads` threads; returns each thread's outcome.
    fn run(ctas: u32, threads: u32, n: u64, leave: u64, timeout_ns: u64) -> Vec<u64> {
        let total = (ctas * threads) as usize;
        let counter = AtomicU64::new(0);
        let slots: Vec<AtomicU64> = (0..total).map(|_| AtomicU64::new(0)).collect();
        let outcomes: Vec<AtomicU64> = (0..total).map(|_| AtomicU64::new(0)).collect();
        let k = KernelFn { name: "rounds", host: rounds };
        let ptr = |p: *const AtomicU64| DevPtr::new(p as u64);
        let args =
            (DevPtr::new(counter.as_ptr() as u64), ptr(slots.as_ptr()), ptr(outcomes.as_ptr()), n, leave, timeout_ns);
        // SAFETY: the counter (zero), slots and outcomes outlive the run.
        unsafe { run_on_host(&k, Dim3::x(ctas), Dim3::x(threads), args, 0) }.unwrap();
        outcomes.iter().map(|o| o.load(Ordering::Relaxed)).collect()
    }

    /// Every thread of every CTA sees every other thread's store of the round after the barrier, round after
    /// round, on one counter.
    #[test]
    fn every_cta_sees_every_store_before_the_barrier() {
        assert!(run(6, 8, 20, u64::MAX, 10_000_000_000).iter().all(|&o| o == OK));
    }

    /// A CTA that returns before the barrier ends the others' waits: thread 0 of each waits out the bound and
    /// gets the timeout on the counter, the other threads of its CTA `Team`; nothing hangs. The same when only
    /// thread 0 of that CTA returns: its other threads get `Team` at once (before, they passed the barrier as if
    /// every CTA had arrived, their thread 0 being the one that adds and waits).
    #[test]
    fn a_cta_that_never_arrives_ends_every_wait_in_an_error() {
        let (ctas, threads) = (4, 4);
        for leave in [2, 2 | THREAD_0] {
            let outcomes = run(ctas, threads, 3, leave, 100_000_000);
            for (i, &o) in outcomes.iter().enumerate() {
                let (cta, tid) = (i as u32 / threads, i as u32 % threads);
                let want = match (cta, tid) {
                    (2, 0) => 0,
                    (2, _) if leave & THREAD_0 != 0 => TEAM,
                    (2, _) => 0,
                    (_, 0) => TIMEOUT,
                    _ => TEAM,
                };
                assert_eq!(o, want, "leave {leave:#x}: CTA {cta} thread {tid}");
            }
        }
    }
}
