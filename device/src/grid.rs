//! A barrier over every CTA of a launch (CUDA cooperative groups' `grid.sync()`), for kernels whose CTAs wait
//! on each other: an all-to-all that exchanges counts before it moves data, a step that must see every CTA's
//! writes. The launch must keep every CTA resident at once (`LaunchConfig::co_resident` on the host, which
//! refuses a grid the GPU cannot hold); on the `cpu` executor every thread runs at once anyway.
//!
//! One `u64` counter per barrier, which the host zeroes before the launch: at each barrier, thread 0 of every
//! CTA adds 1 and waits until the counter reaches the CTAs' count times the barriers passed, while the other
//! threads of its CTA wait at the CTA barrier. The wait is bounded, so a CTA that never arrives (it returned
//! early, failed, or was never resident) ends the others' waits with an error instead of a hang; the CTA whose
//! wait ran out, or that lost a thread, then sets the counter's [`BROKEN`] bit, so that every other wait of
//! the launch, now or later, ends at once instead of waiting out its own bound (or passing on late arrivals).

use crate::error::{Error, InvalidArgument, Result, WaitOn};
use crate::launch::DevPtr;
use crate::scope::{Device, Scope};
use crate::thread::Thread;
use crate::wait::bounded;

/// The counter's bit that says the barrier is broken: a CTA's wait ran out, or a CTA lost a thread before it
/// arrived. Set once, never cleared during the launch; arrivals count below it.
pub const BROKEN: u64 = 1 << 63;

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
    /// any thread of the grid stored before its call, to GPU or host memory, is visible to every thread of the
    /// grid after it (each CTA's barrier, then thread 0's release and acquire at GPU scope, which covers every
    /// thread of the GPU wherever the memory lies); a reader outside the GPU (the host, a NIC) needs the
    /// system-scope release ([`crate::sync::fence_release_sys`]) as always.
    ///
    /// # Errors
    /// [`Error::Timeout`] on [`WaitOn::Semaphore`] (the counter, the count awaited and the last seen: how many
    /// CTA arrivals were missing) for thread 0 of a CTA whose wait ran out: a CTA that never arrived (returned
    /// before the call, failed, or was not resident, in a launch that was not co-resident).
    /// [`InvalidArgument::Team`] for the other threads of that CTA, for every thread of a CTA some thread of
    /// which returned before this call (the CTA does not arrive then), and for every thread of the launch that
    /// waits once the barrier is broken (either of those happened in some CTA: [`BROKEN`]); a timeout is final,
    /// every later wait of the launch returns `Team` at once. [`InvalidArgument::Counter`] for thread 0 of a
    /// CTA that found more arrivals on the counter than this launch can have made (it was not zero at the
    /// start, or another launch uses it; caught for sure only when it held at least the CTA count), `Team` for
    /// the CTA's other threads; the barrier is broken then too.
    pub fn wait(&mut self, t: &Thread) -> Result<()> {
        self.passed += 1;
        let expected = self.passed.saturating_mul(self.ctas);
        let counter = self.counter;
        // Every thread of the CTA has made its accesses before thread 0 releases them with its arrival; a CTA
        // whose threads are not all here (one returned: the barrier no longer waits for it) does not arrive,
        // and breaks the barrier so that the other CTAs need not wait out their bounds for it.
        if t.sync_threads_count(true) != t.block_size() {
            // SAFETY: the counter of `new`'s contract, only accessed atomically.
            unsafe { break_barrier(counter) };
            return Err(Error::InvalidArgument(InvalidArgument::Team));
        }
        let mut r = Ok(());
        if t.tid() == 0 {
            // SAFETY: the counter of `new`'s contract, only accessed atomically.
            let before = unsafe {
                Device::fence_release();
                Device::fetch_add(counter, 1)
            };
            // Before this CTA's arrival the other CTAs can have made at most `expected - 1` arrivals (none
            // passes this barrier without it); more means a counter this launch did not start at zero.
            r = if before & BROKEN != 0 {
                Err(Error::InvalidArgument(InvalidArgument::Team))
            } else if before >= expected {
                Err(Error::InvalidArgument(InvalidArgument::Counter))
            } else {
                let seen = core::cell::Cell::new(0);
                bounded(
                    self.timeout_ns,
                    || {
                        // SAFETY: as above.
                        seen.set(unsafe { Device::load_acquire(counter) });
                        if seen.get() & BROKEN != 0 {
                            return Err(Error::InvalidArgument(InvalidArgument::Team));
                        }
                        Ok((seen.get() >= expected).then_some(()))
                    },
                    || WaitOn::Semaphore { addr: counter as u64, expected, seen: seen.get() },
                )
            };
            if r.is_err() {
                // A timeout or a stale counter breaks the barrier; one found broken is broken again, in case
                // this arrival's add carried out of the bit (a counter left at `u64::MAX` wraps to 0).
                // SAFETY: as above.
                unsafe { break_barrier(counter) };
            }
        }
        // Thread 0's acquire is ordered before every thread's accesses after the CTA barrier. Its error, if
        // any, is its own; the CTA's other threads get Team (a launch's report takes thread 0's cause over it).
        if t.sync_threads_or(r.is_err()) && r.is_ok() {
            return Err(Error::InvalidArgument(InvalidArgument::Team));
        }
        r
    }

    /// Breaks the barrier for the rest of the launch (NCCL's abort, for one barrier): every wait of every CTA,
    /// now or later, returns [`InvalidArgument::Team`] at once. For a CTA that gives up before a barrier the
    /// others wait at (its threads all failed): without it they wait out their bounds for its arrival. Any
    /// thread may call it, as often as it likes.
    pub fn abort(&self) {
        // SAFETY: the counter of `new`'s contract, only accessed atomically.
        unsafe { break_barrier(self.counter) }
    }
}

/// Sets the [`BROKEN`] bit of the barrier's `counter` (once: a CAS, since several CTAs may find the barrier
/// broken at once and an add of the bit would carry out of it).
///
/// # Safety
/// `counter` as in [`GridBarrier::new`].
unsafe fn break_barrier(counter: *mut u64) {
    // SAFETY: the caller's.
    let mut cur = unsafe { Device::load_acquire(counter) };
    // Ends: each failed CAS saw another value, and the values only grow until the bit is set.
    while cur & BROKEN == 0 {
        // SAFETY: as above.
        let was = unsafe { Device::cas(counter, cur, cur | BROKEN) };
        if was == cur {
            break;
        }
        cur = was;
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
    const COUNTER: u64 = 5;
    /// Added to an outcome when a second wait after the failed one did not return `Team` at once.
    const RETRY_PASSED: u64 = 1 << 8;

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
        // A wait after a failed one (each thread of a failed CTA has failed) finds the barrier broken.
        let retry = match outcome {
            Err(_) if barrier.wait(t) != Err(Error::InvalidArgument(InvalidArgument::Team)) => RETRY_PASSED,
            _ => 0,
        };
        outcomes[me].store(
            retry
                + match outcome {
                    Ok(o) => o,
                    Err(Error::Timeout(crate::error::Timeout { on: WaitOn::Semaphore { .. }, .. })) => TIMEOUT,
                    Err(Error::InvalidArgument(InvalidArgument::Team)) => TEAM,
                    Err(Error::InvalidArgument(InvalidArgument::Counter)) => COUNTER,
                    Err(_) => 0,
                },
            Ordering::Relaxed,
        );
    }

    /// Runs [`rounds`] on `ctas` CTAs of `threads` threads with the counter at `start`; returns each thread's
    /// outcome.
    fn run(ctas: u32, threads: u32, n: u64, leave: u64, timeout_ns: u64, start: u64) -> Vec<u64> {
        let total = (ctas * threads) as usize;
        let counter = AtomicU64::new(start);
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
        assert!(run(6, 8, 20, u64::MAX, 10_000_000_000, 0).iter().all(|&o| o == OK));
    }

    /// A CTA that returns before the barrier ends the others' waits: thread 0 of a CTA waits out the bound and
    /// gets the timeout on the counter, and breaks the barrier, so that the other thread 0s get the timeout
    /// too or `Team` (whichever comes first), and the other threads `Team`; nothing hangs, and a wait after the
    /// failed one gets `Team` at once.
    #[test]
    fn a_cta_that_never_arrives_ends_every_wait_in_an_error() {
        let (ctas, threads) = (4, 4);
        let outcomes = run(ctas, threads, 3, 2, 100_000_000, 0);
        for (i, &o) in outcomes.iter().enumerate() {
            let (cta, tid) = (i as u32 / threads, i as u32 % threads);
            let fine = match (cta, tid) {
                (2, _) => o == 0,
                (_, 0) => o == TIMEOUT || o == TEAM,
                _ => o == TEAM,
            };
            assert!(fine, "CTA {cta} thread {tid}: {o:#x} in {outcomes:?}");
        }
        assert!(outcomes.iter().step_by(threads as usize).any(|&o| o == TIMEOUT), "no timeout: {outcomes:?}");
    }

    /// When only thread 0 of a CTA returns, its other threads get `Team` at once (before, they passed the
    /// barrier as if every CTA had arrived, their thread 0 being the one that adds and waits) and break the
    /// barrier: every other CTA gets `Team` at once too, long before the waits' 20 s bound.
    #[test]
    fn a_cta_that_lost_a_thread_breaks_the_barrier_at_once() {
        let (ctas, threads) = (4, 4);
        let t0 = std::time::Instant::now();
        let outcomes = run(ctas, threads, 3, 2 | THREAD_0, 20_000_000_000, 0);
        assert!(t0.elapsed() < std::time::Duration::from_secs(10), "took {:?}", t0.elapsed());
        for (i, &o) in outcomes.iter().enumerate() {
            let want = if i as u32 == 2 * threads { 0 } else { TEAM };
            assert_eq!(o, want, "thread {i}: {outcomes:?}");
        }
    }

    /// A CTA whose threads give up before the first barrier and abort it ends every other CTA's wait at once
    /// with `Team`, long before the waits' 20 s bound.
    #[test]
    fn an_abort_ends_every_wait_at_once() {
        fn aborting(t: &Thread, a: &(DevPtr<u64>, DevPtr<AtomicU64>), _: u64) {
            // SAFETY: the test's zeroed counter, used by this launch's barriers only.
            let mut barrier = unsafe { GridBarrier::new(t, a.0, 20_000_000_000) };
            // SAFETY: one outcome per thread, alive for the launch.
            let outcome = unsafe { &*(a.1.addr() as *const AtomicU64).add(t.global_id() as usize) };
            if t.block() == 1 {
                barrier.abort();
                return;
            }
            let team = barrier.wait(t) == Err(Error::InvalidArgument(InvalidArgument::Team));
            outcome.store(if team { TEAM } else { OK }, Ordering::Relaxed);
        }
        let counter = AtomicU64::new(0);
        let outcomes: Vec<AtomicU64> = (0..12).map(|_| AtomicU64::new(0)).collect();
        let k = KernelFn { name: "aborting", host: aborting };
        let args = (DevPtr::new(counter.as_ptr() as u64), DevPtr::new(outcomes.as_ptr() as u64));
        let t0 = std::time::Instant::now();
        // SAFETY: the counter (zero) and outcomes outlive the run.
        unsafe { run_on_host(&k, Dim3::x(3), Dim3::x(4), args, 0) }.unwrap();
        assert!(t0.elapsed() < std::time::Duration::from_secs(10), "took {:?}", t0.elapsed());
        let got: Vec<u64> = outcomes.iter().map(|o| o.load(Ordering::Relaxed)).collect();
        let want: Vec<u64> = (0..12).map(|i| if i / 4 == 1 { 0 } else { TEAM }).collect();
        assert_eq!(got, want);
    }

    /// A counter that did not start at zero (a second launch on the first's counter) is refused: the thread 0
    /// that finds it gets `Counter` and breaks the barrier, every other thread `Team`, at once. Without the
    /// check every wait passed at once and the CTAs raced (the slots' check caught it as STALE).
    #[test]
    fn a_counter_not_zeroed_is_refused() {
        let (ctas, threads) = (4, 4);
        let t0 = std::time::Instant::now();
        let outcomes = run(ctas, threads, 3, u64::MAX, 20_000_000_000, 6 * u64::from(ctas));
        assert!(t0.elapsed() < std::time::Duration::from_secs(10), "took {:?}", t0.elapsed());
        for (i, &o) in outcomes.iter().enumerate() {
            let fine = if i % threads as usize == 0 { o == COUNTER || o == TEAM } else { o == TEAM };
            assert!(fine, "thread {i}: {o:#x} in {outcomes:?}");
        }
        assert!(outcomes.iter().step_by(threads as usize).any(|&o| o == COUNTER), "no Counter: {outcomes:?}");
    }

    /// A counter left at `u64::MAX` (broken, every other bit set): the first arrival's add wraps it to 0,
    /// clearing the bit, and the CTA that made it breaks the barrier again, so that every other CTA gets `Team`
    /// at once, not its timeout. Before, the others waited out their bounds.
    #[test]
    fn a_counter_left_at_the_top_stays_broken() {
        let (ctas, threads) = (4, 4);
        let t0 = std::time::Instant::now();
        let outcomes = run(ctas, threads, 3, u64::MAX, 20_000_000_000, u64::MAX);
        assert!(t0.elapsed() < std::time::Duration::from_secs(10), "took {:?}", t0.elapsed());
        assert!(outcomes.iter().all(|&o| o == TEAM), "{outcomes:?}");
    }
}
