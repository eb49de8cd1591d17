//! The calling thread of a kernel: its indices in the launch's grid, and the CTA barrier. What
//! `#[kernel]` functions take as their first argument (`t: &Thread`), on both executors: on the GPU it reads the
//! special registers (`%tid`, `%ctaid`, `%ntid`, `%nctaid`) and synchronizes with `barrier.sync`; on the `cpu`
//! executor every thread of the launch is a host thread, and the block's threads share a barrier.
//!
//! Indices follow CUDA: `thread_idx` within the block, `block_idx` within the grid, each a [`Dim3`]; the linear
//! thread number within the block is `x + y·dim.x + z·dim.x·dim.y` ([`Thread::tid`]), and lanes and warps are
//! counted from it (32 lanes per warp).

/// A three-component size or index (CUDA's `dim3`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Dim3 {
    /// First component.
    pub x: u32,
    /// Second component.
    pub y: u32,
    /// Third component.
    pub z: u32,
}

impl Dim3 {
    /// `(x, y, z)`.
    pub const fn new(x: u32, y: u32, z: u32) -> Self {
        Dim3 { x, y, z }
    }

    /// `(x, 1, 1)`.
    pub const fn x(x: u32) -> Self {
        Dim3 { x, y: 1, z: 1 }
    }

    /// `x · y · z`, as a `u64`, saturating at `u64::MAX` (three `u32`s can make up to 2^96; `x · y` alone
    /// always fits).
    pub const fn count(&self) -> u64 {
        (self.x as u64 * self.y as u64).saturating_mul(self.z as u64)
    }

    /// The linear number of index `i` in a box of this size: `i.x + i.y·x + i.z·x·y`.
    pub const fn linear(&self, i: Dim3) -> u64 {
        i.x as u64 + i.y as u64 * self.x as u64 + i.z as u64 * self.x as u64 * self.y as u64
    }
}

/// Lanes per warp.
pub const WARP_SIZE: u32 = 32;

/// The thread running a kernel (see the module docs). Made by the launch (the `#[kernel]` entry on the GPU,
/// the host launcher on the `cpu` executor), never by user code; valid for the kernel's run.
pub struct Thread {
    #[cfg(not(target_arch = "nvptx64"))]
    host: host::Context,
    /// `Thread` is neither `Send` nor `Sync`: it is the calling thread's.
    _not_send: core::marker::PhantomData<*const ()>,
}

impl Thread {
    /// The thread's index in its block.
    #[inline(always)]
    pub fn thread_idx(&self) -> Dim3 {
        #[cfg(target_arch = "nvptx64")]
        // SAFETY: reading special registers has no memory effects.
        unsafe {
            use core::arch::nvptx::*;
            Dim3::new(_thread_idx_x() as u32, _thread_idx_y() as u32, _thread_idx_z() as u32)
        }
        #[cfg(not(target_arch = "nvptx64"))]
        self.host.thread_idx
    }

    /// The block's index in the grid.
    #[inline(always)]
    pub fn block_idx(&self) -> Dim3 {
        #[cfg(target_arch = "nvptx64")]
        // SAFETY: as above.
        unsafe {
            use core::arch::nvptx::*;
            Dim3::new(_block_idx_x() as u32, _block_idx_y() as u32, _block_idx_z() as u32)
        }
        #[cfg(not(target_arch = "nvptx64"))]
        self.host.block_idx
    }

    /// Threads per block.
    #[inline(always)]
    pub fn block_dim(&self) -> Dim3 {
        #[cfg(target_arch = "nvptx64")]
        // SAFETY: as above.
        unsafe {
            use core::arch::nvptx::*;
            Dim3::new(_block_dim_x() as u32, _block_dim_y() as u32, _block_dim_z() as u32)
        }
        #[cfg(not(target_arch = "nvptx64"))]
        self.host.block_dim
    }

    /// Blocks in the grid.
    #[inline(always)]
    pub fn grid_dim(&self) -> Dim3 {
        #[cfg(target_arch = "nvptx64")]
        // SAFETY: as above.
        unsafe {
            use core::arch::nvptx::*;
            Dim3::new(_grid_dim_x() as u32, _grid_dim_y() as u32, _grid_dim_z() as u32)
        }
        #[cfg(not(target_arch = "nvptx64"))]
        self.host.grid_dim
    }

    /// The linear thread number within the block (`0 .. block_size()`).
    #[inline(always)]
    pub fn tid(&self) -> u32 {
        self.block_dim().linear(self.thread_idx()) as u32
    }

    /// Threads per block (at most 1024).
    #[inline(always)]
    pub fn block_size(&self) -> u32 {
        self.block_dim().count() as u32
    }

    /// The linear block number within the grid.
    #[inline(always)]
    pub fn block(&self) -> u64 {
        self.grid_dim().linear(self.block_idx())
    }

    /// Blocks in the grid.
    #[inline(always)]
    pub fn blocks(&self) -> u64 {
        self.grid_dim().count()
    }

    /// The linear thread number in the whole grid: `block() · block_size() + tid()`.
    #[inline(always)]
    pub fn global_id(&self) -> u64 {
        self.block() * self.block_size() as u64 + self.tid() as u64
    }

    /// The lane within the warp (`tid() % 32`).
    #[inline(always)]
    pub fn lane(&self) -> u32 {
        self.tid() % WARP_SIZE
    }

    /// The warp within the block (`tid() / 32`).
    #[inline(always)]
    pub fn warp(&self) -> u32 {
        self.tid() / WARP_SIZE
    }

    /// Waits until every thread of the block that has not returned reaches this barrier (`__syncthreads`);
    /// memory accesses before it are visible to the block's threads after it. The threads of a warp may arrive
    /// diverged (the non-aligned `barrier.sync`).
    #[inline(always)]
    pub fn sync_threads(&self) {
        let _ = self.sync_threads_or(false);
    }

    /// [`Thread::sync_threads`] that also returns whether any thread of the block passed `true`
    /// (`__syncthreads_or`; PTX `barrier.red.or.pred`).
    #[inline(always)]
    pub fn sync_threads_or(&self, flag: bool) -> bool {
        #[cfg(target_arch = "nvptx64")]
        {
            crate::sync::cta_barrier_or(flag)
        }
        #[cfg(not(target_arch = "nvptx64"))]
        self.host.block.sync(flag).0
    }

    /// [`Thread::sync_threads`] that also returns how many threads of the block passed `true`
    /// (`__syncthreads_count`; PTX `barrier.red.popc`).
    #[inline(always)]
    pub fn sync_threads_count(&self, flag: bool) -> u32 {
        #[cfg(target_arch = "nvptx64")]
        {
            crate::sync::cta_barrier_count(flag)
        }
        #[cfg(not(target_arch = "nvptx64"))]
        self.host.block.sync(flag).1
    }
}

/// The threads of one CTA (or of a host team that stands for one) that call a team operation together:
/// [`SharedQp::post_team`](crate::shared_qp::SharedQp::post_team) and
/// [`PortChannel::put_team`](crate::channel::PortChannel::put_team). A [`Thread`] is the member of its
/// block; tests may make other groups of host threads.
///
/// # Safety
/// Implementors promise barrier semantics that the team protocols rely on for the WQEs they store: the
/// members have distinct ranks `0 .. members()`; every member calls each barrier, in the same order; a
/// barrier returns only when all members have reached it, and orders every memory access a member made before
/// it before every access any member makes after it (as `barrier.sync` does among a CTA's threads); and
/// [`CtaGroup::barrier_broadcast`] returns to every member exactly the words rank 0 passed to that call (a team
/// post stores each member's WQE at the leader's base plus its rank: a wrong base would overwrite WQEBBs that
/// another poster owns).
pub unsafe trait CtaGroup {
    /// This member's rank, `0 .. members()`.
    fn rank(&self) -> u32;
    /// Members of the group (at least 1).
    fn members(&self) -> u32;
    /// A barrier over the group that returns whether any member passed `true`.
    fn barrier_or(&self, flag: bool) -> bool;
    /// A barrier over the group that returns how many members passed `true`.
    fn barrier_count(&self, flag: bool) -> u32;
    /// A barrier over the group that returns rank 0's `words` to every member (the other members' `words` are
    /// not read): how a team's leader hands what it alone did (a reservation's base, its error) to the
    /// members. Every member calls it, as every barrier.
    fn barrier_broadcast(&self, words: [u64; 4]) -> [u64; 4];
}

// SAFETY: the block's threads have distinct linear indices below the block size, and `barrier.sync` (on the
// host: the block's shared barrier, a mutex and condition variable, whose lock orders the accesses) is a full
// barrier of the block with memory ordering among its threads.
unsafe impl CtaGroup for Thread {
    #[inline(always)]
    fn rank(&self) -> u32 {
        self.tid()
    }
    #[inline(always)]
    fn members(&self) -> u32 {
        self.block_size()
    }
    #[inline(always)]
    fn barrier_or(&self, flag: bool) -> bool {
        self.sync_threads_or(flag)
    }
    #[inline(always)]
    fn barrier_count(&self, flag: bool) -> u32 {
        self.sync_threads_count(flag)
    }
    #[inline(always)]
    fn barrier_broadcast(&self, words: [u64; 4]) -> [u64; 4] {
        #[cfg(target_arch = "nvptx64")]
        {
            crate::sync::cta_barrier_broadcast(self.tid() == 0, words)
        }
        #[cfg(not(target_arch = "nvptx64"))]
        self.host.block.sync_words(self.tid() == 0, false, words).2
    }
}

#[cfg(target_arch = "nvptx64")]
impl Thread {
    /// The calling GPU thread (for the `#[kernel]` entry).
    #[doc(hidden)]
    #[inline(always)]
    pub fn current() -> Thread {
        Thread { _not_send: core::marker::PhantomData }
    }
}

/// The `cpu` executor's side: a launch's threads as host threads.
#[cfg(not(target_arch = "nvptx64"))]
pub(crate) mod host {
    use super::{Dim3, Thread, WARP_SIZE};
    use core::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Condvar, Mutex};

    /// What a host thread of a launch knows about itself.
    pub(crate) struct Context {
        /// The launch's number, unique in the process and never 0 ([`next_launch`]).
        pub(crate) launch: u32,
        pub(crate) thread_idx: Dim3,
        pub(crate) block_idx: Dim3,
        pub(crate) block_dim: Dim3,
        pub(crate) grid_dim: Dim3,
        pub(crate) block: std::sync::Arc<BlockBarrier>,
    }

    /// A number for a new launch: 1, 2, ... (0 stays "no launch" in [`SqState::host_owner`]).
    ///
    /// [`SqState::host_owner`]: gdaki_shared::handle::SqState::host_owner
    pub(crate) fn next_launch() -> u32 {
        static LAUNCHES: core::sync::atomic::AtomicU32 = core::sync::atomic::AtomicU32::new(0);
        LAUNCHES.fetch_add(1, Ordering::Relaxed).wrapping_add(1).max(1)
    }

    /// This host thread's launch, CTA (linear index in the grid) and warp (`tid / 32`), while it runs a
    /// kernel.
    #[derive(Clone, Copy)]
    struct Unit {
        launch: u32,
        block: u32,
        warp: u32,
    }

    std::thread_local! {
        static UNIT: core::cell::Cell<Option<Unit>> = const { core::cell::Cell::new(None) };
    }

    /// Whether the calling host thread runs a thread of a launch (not a test's own thread).
    pub(crate) fn in_launch() -> bool {
        UNIT.with(|c| c.get()).is_some()
    }

    /// Whether the calling host thread may post to the QP whose [`SqState::host_owner`] word is `owner`,
    /// sharing it by CTA (`by_warp` false: Block scope) or by warp (`by_warp` true: Warp sharing). The first
    /// CTA (warp) of a launch to post claims the QP; another of the same launch is refused, and so is any warp
    /// of a launch whose QP a CTA claimed (and the reverse): on the GPU its `.cta` atomics, or its warp's own
    /// leader, would corrupt the QP, while host threads would take turns and hide it. A later launch claims
    /// the QP afresh. A thread outside a launch (a test's own threads) always
    /// may.
    ///
    /// [`SqState::host_owner`]: gdaki_shared::handle::SqState::host_owner
    pub(crate) fn may_post(owner: &AtomicU64, by_warp: bool) -> bool {
        let Some(u) = UNIT.with(|c| c.get()) else { return true };
        // At most 32 warps a block and 8192 threads a launch: a warp's number (block x 32 + warp) fits below
        // bit 31, which tells a warp from a CTA, so that one QP claimed by a CTA is refused to a warp of
        // another CTA that happens to have the CTA's number, and the reverse (the two ways of posting share
        // the QP's state but not its protocol: both at once corrupt it).
        let who = if by_warp { 1 << 31 | (u.block * 32 + u.warp) } else { u.block };
        let me = u64::from(u.launch) << 32 | u64::from(who);
        let mut cur = owner.load(Ordering::Relaxed);
        loop {
            if cur == me {
                return true;
            }
            if cur >> 32 == me >> 32 {
                return false;
            }
            match owner.compare_exchange_weak(cur, me, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return true,
                Err(c) => cur = c,
            }
        }
    }

    /// The barrier of one block: as `barrier.sync` on the GPU, it counts the threads that have not returned,
    /// so a thread that leaves the kernel early does not stall the others.
    pub(crate) struct BlockBarrier {
        state: Mutex<State>,
        changed: Condvar,
    }

    struct State {
        /// Threads of the block still in the kernel.
        live: u32,
        /// Threads waiting at the barrier now.
        arrived: u32,
        /// OR of the flags of this round so far.
        or: bool,
        /// Threads that passed `true` this round so far.
        count: u32,
        /// Rounds completed; a waiter leaves when it changes.
        round: u64,
        /// The OR of the last completed round.
        last_or: bool,
        /// The count of the last completed round.
        last_count: u32,
        /// The words a thread last handed to the others ([`BlockBarrier::sync_words`]), kept until the next
        /// thread hands some (as the GPU's shared memory keeps them); those at the end of the last completed
        /// round.
        words: [u64; 4],
        last_words: [u64; 4],
    }

    impl BlockBarrier {
        pub(crate) fn new(threads: u32) -> Self {
            BlockBarrier {
                state: Mutex::new(State {
                    live: threads,
                    arrived: 0,
                    or: false,
                    count: 0,
                    round: 0,
                    last_or: false,
                    last_count: 0,
                    words: [0; 4],
                    last_words: [0; 4],
                }),
                changed: Condvar::new(),
            }
        }

        fn lock(&self) -> std::sync::MutexGuard<'_, State> {
            self.state.lock().unwrap_or_else(|e| e.into_inner())
        }

        /// Ends the round when every live thread has arrived.
        fn complete_if_full(&self, s: &mut State) {
            if s.arrived > 0 && s.arrived >= s.live {
                s.last_or = s.or;
                s.last_count = s.count;
                s.last_words = s.words;
                s.or = false;
                s.count = 0;
                s.arrived = 0;
                s.round += 1;
                self.changed.notify_all();
            }
        }

        /// Waits for the round; returns the OR of the flags and the number of `true` flags.
        pub(crate) fn sync(&self, flag: bool) -> (bool, u32) {
            let (or, count, _) = self.sync_words(false, flag, [0; 4]);
            (or, count)
        }

        /// [`BlockBarrier::sync`] that also returns the `words` of the thread that passed `from = true` this
        /// round (the last such thread's; those of the previous round when none did).
        pub(crate) fn sync_words(&self, from: bool, flag: bool, words: [u64; 4]) -> (bool, u32, [u64; 4]) {
            let mut s = self.lock();
            if from {
                s.words = words;
            }
            s.or |= flag;
            s.count += flag as u32;
            s.arrived += 1;
            let round = s.round;
            self.complete_if_full(&mut s);
            while s.round == round {
                s = self.changed.wait(s).unwrap_or_else(|e| e.into_inner());
            }
            (s.last_or, s.last_count, s.last_words)
        }

        /// A thread of the block returned from the kernel.
        pub(crate) fn leave(&self) {
            let mut s = self.lock();
            s.live -= 1;
            self.complete_if_full(&mut s);
        }
    }

    impl Thread {
        /// The thread of `ctx`, made on the host thread that runs it (which it then names in [`may_post`]).
        pub(crate) fn on_host(ctx: Context) -> Thread {
            let unit = Unit {
                launch: ctx.launch,
                block: ctx.grid_dim.linear(ctx.block_idx) as u32,
                warp: ctx.block_dim.linear(ctx.thread_idx) as u32 / WARP_SIZE,
            };
            UNIT.with(|c| c.set(Some(unit)));
            Thread { host: ctx, _not_send: core::marker::PhantomData }
        }
    }

    impl Drop for Thread {
        fn drop(&mut self) {
            UNIT.with(|c| c.set(None));
            self.host.block.leave();
        }
    }
}

#[cfg(all(test, not(target_arch = "nvptx64")))]
mod tests {
    use super::*;

    #[test]
    fn dims_count_and_linearize() {
        let d = Dim3::new(4, 3, 2);
        assert_eq!(d.count(), 24);
        assert_eq!(d.linear(Dim3::new(1, 2, 1)), 1 + 2 * 4 + 12);
        assert_eq!(Dim3::x(7), Dim3::new(7, 1, 1));
        assert_eq!(Dim3::new(u32::MAX, u32::MAX, 1).count(), (u32::MAX as u64).pow(2));
        assert_eq!(Dim3::new(u32::MAX, u32::MAX, 2).count(), u64::MAX, "saturates");
    }

    /// The `cpu` executor's block barrier hands the sender's words to every thread of each round, also when the
    /// sender is not the last to arrive, and counts and ORs the flags of the same round.
    #[test]
    fn block_barrier_hands_the_senders_words_to_every_thread() {
        const THREADS: u64 = 4;
        let b = host::BlockBarrier::new(THREADS as u32);
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let b = &b;
                s.spawn(move || {
                    for k in 0..200u64 {
                        let from = k % THREADS;
                        let mine = [k, t, k.wrapping_mul(0x9e37_79b9_7f4a_7c15), !k];
                        let (or, count, got) = b.sync_words(t == from, t == 0, mine);
                        assert_eq!(got, [k, from, k.wrapping_mul(0x9e37_79b9_7f4a_7c15), !k], "round {k}, thread {t}");
                        assert_eq!((or, count), (true, 1), "round {k}, thread {t}");
                        // A plain barrier between hand-overs, so that the sender of the next round may arrive first.
                        assert_eq!(b.sync(false), (false, 0));
                    }
                });
            }
        });
    }
}
