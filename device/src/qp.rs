//! An RC QP driven by one thread (Exclusive mode, DOCA GPUNetIO `EXCLUSIVE` / MSCCL++ PortChannel with one
//! poster): reserve WQEBBs → store the WQE → advance the producer index → dbrec + doorbell (or BlueFlame) →
//! poll the CQ to retire WQEBBs.
//!
//! CQE policy: a WQE asks for a CQE when the caller wants a [`Ticket`], and also when a quarter of the ring
//! has been posted since the last one, so that the SQ can always be retired (rdma-core leaves this to the
//! user; NVSHMEM IBGDA and DOCA signal periodically the same way).

use crate::cq::{self, Completion};
use crate::db;
use crate::error::{CqeError, Error, InvalidArgument, Result, WaitOn};
use crate::sq;
use crate::sync;
use crate::wait::{bounded_steps, bounded_watching, Step, Watch};
use crate::wqe::{self, Ctrl, Raddr, Wqe};
use gdaki_shared::handle::{Placement, QpHandle};
use gdaki_shared::prm::wqe::{fm_ce_se, wqebbs, CtrlSeg, Seg, SEGS_PER_WQEBB, WQEBB};

/// A posted WQE that asked for a CQE: its first WQEBB's 64-bit index. Complete once the CQ retires it
/// ([`Qp::wait`]); DOCA GPUNetIO's `ticket`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub struct Ticket(pub u64);

/// Exclusive access to one QP's send side, for the lifetime of the borrow.
///
/// The handle's fixed fields and its send-queue state are read by [`Qp::new`] and kept in this value (in
/// registers, while device code keeps the `Qp` across its posts): a post reads nothing from memory but its
/// WQE's inputs, and the fences around the doorbell do not force the counters out to memory and back. The
/// counters go back to the handle's [`SqState`](gdaki_shared::handle::SqState) when the `Qp` is dropped,
/// where the next poster of the QP (a `Qp`, a [`crate::shared_qp::SharedQp`]) or the host finds them: every
/// kind of poster keeps the words the others read, so one QP may be used by one kind, then another. The slow
/// paths (waiting for room, CQ polling, waits) take the counters through the handle too, and the `Qp` reads
/// them (not the fixed fields, which nothing changes meanwhile) again after each. The sticky error and the CQ's
/// consumer index stay in the handle: only the slow paths touch them.
pub struct Qp<'a> {
    h: &'a mut QpHandle,
    sq: Sq,
    /// Whether WQEs were posted since the last doorbell.
    unrung: bool,
    timeout_ns: u64,
    /// On the `cpu` executor: whether another poster of the handle was at work when this one was made
    /// ([`SqState::host_posters`](gdaki_shared::handle::SqState::host_posters), `host_shared`, `host_warps`);
    /// its counters may then be stale, so its calls are refused and its drop writes nothing back.
    #[cfg(not(target_arch = "nvptx64"))]
    intruder: bool,
    /// On the `cpu` executor: whether this `Qp` is a [`crate::warp_qp::WarpQp`]'s leader for one turn (or the
    /// slow path of one), which is not counted among the handle's Exclusive posters (its `WarpQp` is counted
    /// in `host_warps`) and to which the handle's live `WarpQp`s are not other posters.
    #[cfg(not(target_arch = "nvptx64"))]
    warp_leader: bool,
}

/// What a post needs of the handle (read by [`Qp::new`], [`Sq::load`]), and the send-queue counters (read
/// again after each slow path, [`Sq::load_counters`]).
#[derive(Clone, Copy)]
struct Sq {
    buf: u64,
    dbrec: u64,
    bf_reg: u64,
    /// WQEBBs in the ring: the handle's size. For a size device code cannot post to, `room` is 0 (no WQE is
    /// ever stored) and the slow paths see [`sq::MIN_WQE_CNT`] here ([`out_of_line`]).
    cnt: u32,
    qpn: u32,
    placement: Placement,
    /// Whether the UAR's BlueFlame buffer takes a whole WQEBB (`bf_size` >= 64).
    blueflame: bool,
    /// WQEBBs free for posting without looking at the CQ: `cnt - (pi - ci)`, less as posts take them, more as
    /// the CQ retires them. 0 for a handle device code cannot post to, so that every post takes the slow path,
    /// which reports it.
    room: u32,
    /// WQEBBs that may still be posted before a WQE must ask for a CQE (the quarter-ring policy, kept as a
    /// countdown so that the fast path decides it in 32 bits).
    until_cqe: u32,
    pi: u64,
    /// The SQ consumer index. Only the slow paths move it, and they write it back to the handle themselves
    /// ([`out_of_line`]); so do posts that ask for a CQE with `sig_first` and `sig_end`, which are not kept
    /// here ([`Qp::commit`]): the common post writes back nothing but the producer index.
    ci: u64,
}

impl Sq {
    /// Reads `h` once: its fixed fields, then its counters ([`Sq::load_counters`]).
    #[inline(always)]
    fn load(h: &QpHandle) -> Sq {
        let mut sq = Sq {
            buf: h.sq_buf,
            dbrec: h.dbrec,
            bf_reg: h.bf_reg,
            cnt: h.wqe_cnt,
            qpn: h.qpn,
            placement: h.placement,
            blueflame: h.bf_size as usize >= WQEBB,
            room: 0,
            until_cqe: 0,
            pi: 0,
            ci: 0,
        };
        sq.load_counters(h);
        sq
    }

    /// Reads the send-queue counters of `h` again (after a slow path moved them), keeping the fixed fields as
    /// read: nothing changes those while the `Qp` holds the handle, and keeping them lets the compiler derive
    /// what a post computes from them (the QPN's big-endian words, the ring's mask) once, before a posting
    /// loop, instead of after every slow path that loop might take.
    ///
    /// The room is 0 when the handle's own size is one device code cannot post to. The handle's size is what
    /// is tested, not `cnt`: inside a slow path `cnt` is [`sq::MIN_WQE_CNT`] for such a ring
    /// ([`out_of_line`]), and a slow path nested in that one (a NOP posted by `wait` that finds the ring full)
    /// must still find no room.
    #[inline(always)]
    fn load_counters(&mut self, h: &QpHandle) {
        // `ready`, not `pi`: WQEBBs that a shared poster reserved and never published (it timed out) are
        // posted over, never announced to the NIC unwritten.
        let (pi, ci, sig_end) = (h.sq.ready, h.sq.ci, h.sq.sig_end);
        self.room = if sq::valid_ring(h.wqe_cnt) { sq::free_wqebbs(self.cnt, pi, ci) as u32 } else { 0 };
        self.until_cqe = until_cqe(self.cnt, pi, sig_end);
        self.pi = pi;
        self.ci = ci;
    }

    /// Writes the producer index back to `h`: every word of it another kind of poster reads (a shared poster
    /// reserves from `pi` and publishes after `ready`; `rung` moves to `pi` when nothing is left unrung,
    /// `rung_all`). The other counters are in `h` already ([`Sq::ci`]).
    #[inline(always)]
    fn store_pi(&self, rung_all: bool, h: &mut QpHandle) {
        h.sq.pi = self.pi;
        h.sq.ready = self.pi;
        if rung_all {
            h.sq.rung = self.pi;
        }
    }

    /// [`Sq::store_pi`], and the consumer index: what a slow path writes back.
    #[inline(always)]
    fn store(&self, rung_all: bool, h: &mut QpHandle) {
        self.store_pi(rung_all, h);
        h.sq.ci = self.ci;
    }
}

/// WQEBBs that may be posted after producer index `pi` before a WQE must ask for a CQE, given the end of the
/// last one that did (`sig_end`): a quarter of the ring after it, at least 0.
///
/// In 32 bits: `pi - sig_end` is below the ring size in every state a poster leaves, so its low 32 bits are
/// the distance. In a state no poster leaves (a `sig_end` ahead of `pi`, or 2^32 behind it) the result is
/// still at most a quarter ring, so the next CQE is never asked for later than the policy allows.
#[inline(always)]
fn until_cqe(cnt: u32, pi: u64, sig_end: u64) -> u32 {
    let since = (pi as u32).wrapping_sub(sig_end as u32);
    (cnt / 4).saturating_sub(since)
}

impl Drop for Qp<'_> {
    /// Rings what is still unrung (WQEs left for the QP's next poster would never complete if it only waits),
    /// then writes the counters back. A kernel that rang before dropping the `Qp` pays nothing for the first
    /// part: the compiler sees that nothing is left.
    #[inline(always)]
    fn drop(&mut self) {
        #[cfg(not(target_arch = "nvptx64"))]
        if self.intruder {
            self.uncount();
            return;
        }
        self.ring_db();
        self.sq.store_pi(true, self.h);
        // After the write-back: a `Qp` made next (on another thread) that sees the count at none reads the
        // counters written here (release, and acquire in `new`).
        #[cfg(not(target_arch = "nvptx64"))]
        self.uncount();
    }
}

/// The handle's count of live Exclusive posters on the `cpu` executor
/// ([`SqState::host_posters`](gdaki_shared::handle::SqState::host_posters)).
#[cfg(not(target_arch = "nvptx64"))]
fn host_posters(h: &mut QpHandle) -> &core::sync::atomic::AtomicU64 {
    // SAFETY: an 8-byte aligned word of the live handle, only ever accessed atomically, by host threads.
    unsafe { core::sync::atomic::AtomicU64::from_ptr(core::ptr::addr_of_mut!(h.sq.host_posters)) }
}

/// The handle's count of shared posters' calls under way on the `cpu` executor
/// ([`SqState::host_shared`](gdaki_shared::handle::SqState::host_shared)).
#[cfg(not(target_arch = "nvptx64"))]
fn host_shared(h: &mut QpHandle) -> &core::sync::atomic::AtomicU64 {
    // SAFETY: an 8-byte aligned word of the live handle, only ever accessed atomically, by host threads.
    unsafe { core::sync::atomic::AtomicU64::from_ptr(core::ptr::addr_of_mut!(h.sq.host_shared)) }
}

/// The handle's count of live `WarpQp`s on the `cpu` executor
/// ([`SqState::host_warps`](gdaki_shared::handle::SqState::host_warps)).
#[cfg(not(target_arch = "nvptx64"))]
fn host_warps(h: &mut QpHandle) -> &core::sync::atomic::AtomicU64 {
    // SAFETY: an 8-byte aligned word of the live handle, only ever accessed atomically, by host threads.
    unsafe { core::sync::atomic::AtomicU64::from_ptr(core::ptr::addr_of_mut!(h.sq.host_warps)) }
}

impl<'a> Qp<'a> {
    /// Takes the QP described by `h`; bounded waits give up after `timeout_ns` nanoseconds. Reads the handle
    /// (its counters again only after a slow path); the counters go back to it when the `Qp` is dropped, which
    /// also rings any WQE still unrung.
    ///
    /// # Safety
    /// `h` must be a handle built by the host for a live, connected QP: its ring, dbrec, UAR register and CQ
    /// addresses valid for the borrow, and no other poster of the QP, in this thread or another, posting to it
    /// or polling its CQ meanwhile: not a `Qp` of another copy of the handle (each keeps its own producer
    /// index, so both would write the same WQEBBs), not a shared poster. Posters of the QP before and after
    /// this `Qp` may be of any kind, not at the same time. Its CQ is the QP's alone: a CQE of another QP
    /// stops the poll with [`Error::UnexpectedCqe`] (the host's `Nic::create_qp` says so too).
    ///
    /// On the `cpu` executor a second `Qp` of the same handle made while the first lives (two
    /// `PortChannel::<Exclusive>` of one handle, or threads each making their own) is counted in the handle:
    /// the posts, CQ polls, waits and flushes of either get [`InvalidArgument::Posters`] while both live, and the
    /// second's drop writes nothing back, where on the GPU their WQEs would overwrite each other; so are the
    /// calls of a shared poster of the handle ([`crate::shared_qp::SharedQp`]) while the `Qp` lives, a `Qp` made
    /// while a shared poster's call is under way or a [`crate::warp_qp::WarpQp`] of the handle lives (all its
    /// calls, and its drop writes nothing back), and a live `Qp`'s calls while either is. A `Qp` that
    /// is forgotten (`mem::forget`) instead of dropped counts for as long as the handle's memory: take a copy
    /// with [`Qp::handle`] (which counts none) and go on from that. What it left unrung stays unrung (a later
    /// `Qp`'s doorbell rings it with its own WQEs; a wait alone does not): ring before forgetting it.
    #[inline(always)]
    pub unsafe fn new(h: &'a mut QpHandle, timeout_ns: u64) -> Self {
        #[cfg(not(target_arch = "nvptx64"))]
        return Self::counted(h, timeout_ns, false);
        #[cfg(target_arch = "nvptx64")]
        Self { sq: Sq::load(h), h, unrung: false, timeout_ns }
    }

    /// [`Qp::new`] for a [`crate::warp_qp::WarpQp`]'s leader on a host thread, for one turn: the handle's live
    /// `WarpQp`s (this one's and its warp's other threads') are not other posters to it.
    ///
    /// # Safety
    /// As [`Qp::new`].
    #[cfg(not(target_arch = "nvptx64"))]
    pub(crate) unsafe fn new_warp_leader(h: &'a mut QpHandle, timeout_ns: u64) -> Self {
        Self::counted(h, timeout_ns, true)
    }

    /// A `Qp` on the `cpu` executor: counted among the handle's Exclusive posters but for a warp's leader,
    /// and an intruder when another poster is at work.
    #[cfg(not(target_arch = "nvptx64"))]
    fn counted(h: &'a mut QpHandle, timeout_ns: u64, warp_leader: bool) -> Self {
        use core::sync::atomic::Ordering::SeqCst;
        // Counted before the look at the other posters, all sequentially consistent, as a shared call or a
        // `WarpQp` counts itself before it looks at the Exclusive posters: of two made at once, at least one
        // sees the other. (The count's acquire also reads the counters the last `Qp` wrote back; a leader's
        // turn read them with the turn's acquire.)
        let before = if warp_leader { host_posters(h).load(SeqCst) } else { host_posters(h).fetch_add(1, SeqCst) };
        let intruder =
            before != 0 || host_shared(h).load(SeqCst) != 0 || (!warp_leader && host_warps(h).load(SeqCst) != 0);
        Self { sq: Sq::load(h), h, unrung: false, timeout_ns, intruder, warp_leader }
    }

    /// Takes this `Qp` out of the handle's count of Exclusive posters, where [`Qp::counted`] put it.
    #[cfg(not(target_arch = "nvptx64"))]
    fn uncount(&mut self) {
        if !self.warp_leader {
            host_posters(self.h).fetch_sub(1, core::sync::atomic::Ordering::Release);
        }
    }

    /// On the `cpu` executor, refuses a call of a `Qp` whose handle has another Exclusive poster alive, a
    /// shared poster's call under way or (but to a `WarpQp`'s leader) a `WarpQp` alive (see [`Qp::new`]).
    /// Nothing on the GPU.
    #[inline(always)]
    fn sole(&mut self) -> Result<()> {
        #[cfg(not(target_arch = "nvptx64"))]
        if self.intruder
            || host_posters(self.h).load(core::sync::atomic::Ordering::Relaxed) > u64::from(!self.warp_leader)
            || host_shared(self.h).load(core::sync::atomic::Ordering::Relaxed) != 0
            || (!self.warp_leader && host_warps(self.h).load(core::sync::atomic::Ordering::Relaxed) != 0)
        {
            return Err(Error::InvalidArgument(InvalidArgument::Posters));
        }
        Ok(())
    }

    /// The handle as it stands now: its fixed fields with this `Qp`'s counters (the handle in memory gets
    /// them at each slow path and when the `Qp` is dropped).
    pub fn handle(&self) -> QpHandle {
        let mut h = *self.h;
        self.sq.store(!self.unrung, &mut h);
        // A `Qp` of the copy is not a second poster of this one's handle.
        #[cfg(not(target_arch = "nvptx64"))]
        {
            h.sq.host_posters = 0;
        }
        h
    }

    /// Runs a slow path (`f`: polling the CQ, waiting for room) out of line, handing the counters over through
    /// the handle: this `Qp` writes its producer index there ([`Sq::store_pi`]; the rest of the state is
    /// there already), the slow path reads the handle and writes back what it moved, and this `Qp` reads the
    /// counters again ([`Sq::load_counters`]; its fixed fields stay as read). A call that took `&mut self` out
    /// of line would make every caller keep the `Qp` in memory (its address escapes), and every fence would
    /// then store and reload the counters; one that took and returned the counters by value packs pairs of
    /// 32-bit counters into 64-bit registers on the fast path, where they meet the slow path's.
    #[inline(always)]
    fn cold<R>(&mut self, f: impl FnOnce(&mut Qp<'_>) -> R) -> R {
        self.sq.store_pi(!self.unrung, self.h);
        let (unrung, r) = out_of_line(
            &mut *self.h,
            self.unrung,
            self.timeout_ns,
            #[cfg(not(target_arch = "nvptx64"))]
            self.warp_leader,
            f,
        );
        self.sq.load_counters(self.h);
        self.unrung = unrung;
        r
    }

    /// The slow path of a post: waits until `n` WQEBBs are free, polling the CQ to retire earlier WQEs.
    ///
    /// # Errors
    /// As [`Qp::post`]: an invalid ring size, a timeout, an unexpected CQE.
    fn reserve_slow(&mut self, n: u32) -> Result<()> {
        if !sq::valid_ring(self.h.wqe_cnt) {
            // The CQE policy (a CQE every quarter ring) needs room for a 4-WQEBB WQE beside the unsignaled
            // tail; a smaller ring could wait forever for room.
            return Err(Error::InvalidArgument(InvalidArgument::Handle));
        }
        let (timeout, qpn) = (self.timeout_ns, self.h.qpn);
        bounded_steps(
            timeout,
            || {
                if self.sq.room >= n {
                    return Ok(Step::Done(()));
                }
                // WQEs that were posted but not rung can never complete: ring them before waiting on them.
                self.ring_db();
                // An error CQE is recorded (sticky) and reported by `wait`/`flush`; it still frees room.
                Ok(if self.drain()? { Step::Progress } else { Step::Idle })
            },
            move || WaitOn::SqSpace { qpn, wqebbs: n },
        )
    }

    /// Reserves `ceil(w.ds() / 4)` WQEBBs, stores `w` there with this QP's WQE index, QPN and completion
    /// flags, and advances the producer index. Nothing reaches the NIC before [`Qp::ring_db`] (or the `Qp`'s
    /// drop, which rings what is left). Takes every builder of [`crate::wqe`].
    ///
    /// # Errors
    /// [`Error::Timeout`] when no room appears in time; [`Error::UnexpectedCqe`] when retiring earlier WQEs
    /// met one (error CQEs met there are kept for `wait`/`flush`); [`Error::InvalidArgument`] (`Handle`) for a
    /// handle whose SQ is not a power of two of 16 ..= 2^15 WQEBBs. Posting to a QP in the error state
    /// succeeds: the NIC flushes the WQE (syndrome 0x05), as hardware does, and waits report the first error.
    #[inline(always)]
    pub fn post<const N: usize>(&mut self, signaled: bool, w: Wqe<N>) -> Result<Ticket> {
        let ds = w.ds();
        self.post_segs(signaled, ds, move |c| w.encode(c)).map(|(t, _)| t)
    }

    /// Posts `ds` segments that `build` makes from the ctrl fields this QP would use, unchecked: the way to
    /// hand a NIC a malformed WQE (a wrong QPN or WQE index, a `ds` the opcode does not take, an inline flag in
    /// a data segment) to test its checks. Everything else is as [`Qp::post`]: `ceil(ds / 4)` WQEBBs are
    /// reserved and the first `ds` segments stored.
    ///
    /// # Errors
    /// As [`Qp::post`]; [`InvalidArgument::WqeSize`] for a `ds` of 0, more than `N`, or more than
    /// [`MAX_DS`](wqe::MAX_DS) (4 WQEBBs, the largest WQE a builder makes, and the largest the room
    /// accounting covers: a CQE frees the ring up to the WQEBB it names, the WQE's first, and the rest of its
    /// WQE only with the next CQE, so a larger WQE on a small ring could wait out the timeout for room that is
    /// free). Nothing is posted then.
    ///
    /// # Safety
    /// Nothing checks the segments. A real NIC executes what they say: a data segment with bit 31 set sends
    /// the segment's own bytes, a `byte_count` of 0 moves 2^31 bytes, and a ctrl segment whose `ds` differs
    /// from `ds` makes the NIC parse the next WQE from the wrong place. The caller must mean it (tests of the
    /// emulated NIC).
    pub unsafe fn post_raw<const N: usize>(
        &mut self,
        signaled: bool,
        ds: u8,
        build: impl FnOnce(Ctrl) -> [Seg; N],
    ) -> Result<Ticket> {
        if ds == 0 || ds as usize > N.min(wqe::MAX_DS) {
            return Err(Error::InvalidArgument(InvalidArgument::WqeSize));
        }
        self.post_segs(signaled, ds, build).map(|(t, _)| t)
    }

    /// Posts the `ds` segments `build` makes; returns the ticket and the segments as stored.
    ///
    /// A post that must wait for room waits out of line ([`Qp::reserve_slow`]) and comes back here, as a batch
    /// does ([`Qp::reserve_batch`]): its WQE is stored by the same code as the fast path's. When the WQE was
    /// stored out of line too, the two paths met only after the store, and the compiler kept the tests of the
    /// post's result and of what is left to ring in the code after every post (`cargo xtask sass`: more
    /// instructions in each loop iteration of a user's posts and of `PortChannel::put`).
    #[inline(always)]
    fn post_segs<const N: usize>(
        &mut self,
        signaled: bool,
        ds: u8,
        build: impl FnOnce(Ctrl) -> [Seg; N],
    ) -> Result<(Ticket, [Seg; N])> {
        self.sole()?;
        let nbb = wqebbs(ds as u32);
        if nbb > self.sq.room {
            self.cold(move |q| q.reserve_slow(nbb))?;
        }
        Ok(self.store_wqe(signaled, ds, nbb, build))
    }

    /// Stores the `ds` segments `build` makes in the `nbb` WQEBBs at the producer index (free: the caller made
    /// sure) and commits them; asks for a CQE when `signaled` or when the quarter-ring rule says so.
    #[inline(always)]
    fn store_wqe<const N: usize>(
        &mut self,
        signaled: bool,
        ds: u8,
        nbb: u32,
        build: impl FnOnce(Ctrl) -> [Seg; N],
    ) -> (Ticket, [Seg; N]) {
        let pi = self.sq.pi;
        let signaled = signaled || nbb >= self.sq.until_cqe;
        let flags = if signaled { fm_ce_se::CQ_UPDATE } else { 0 };
        let segs = build(Ctrl { idx: pi as u16, qpn: self.sq.qpn, fm_ce_se: flags });
        // SAFETY: `Qp::new`'s contract gives a valid ring (room is 0 for any other size); the room check made
        // WQEBBs `pi..pi + nbb` ours.
        unsafe { sq::write_segs(self.sq.buf, self.sq.cnt, pi, &segs, ds) };
        self.commit(pi, nbb, signaled);
        (Ticket(pi), segs)
    }

    /// Posts `n` WQEs that `wqe(i)` builds (`i` in `0..n`, called in that order) with one reservation of the
    /// ring, as DOCA GPUNetIO's `reserve_wq_slots` for `n` slots and NVSHMEM IBGDA's `ibgda_reserve_wqe_slots`
    /// do: the room check and the CQE policy are decided once for the batch, and the WQEs are then stored by a
    /// loop with no test in it, whose iterations the compiler may overlap. Nothing reaches the NIC before
    /// [`Qp::ring_db`] (or the drop); only the last WQE may ask for a CQE (when `signaled`, or when the
    /// quarter-ring rule says so). Returns the last WQE's ticket. [`Qp::try_post_batch`] takes a builder that
    /// may refuse a WQE.
    ///
    /// The room reserved is `n` times the WQEBBs of a WQE of `N` segments (one WQEBB for `N` <= 4), each WQE
    /// taking its own `ds`'s WQEBBs of it.
    ///
    /// # Errors
    /// [`InvalidArgument::Batch`] for `n` = 0, or a batch that may need more than half the ring (it could wait
    /// for room forever); as [`Qp::post`] otherwise. Nothing is posted on an error.
    #[inline(always)]
    pub fn post_batch<const N: usize>(
        &mut self,
        n: u32,
        signaled: bool,
        mut wqe: impl FnMut(u32) -> Wqe<N>,
    ) -> Result<Ticket> {
        // The builder cannot fail: the compiler removes the test of its result from the loop.
        self.try_post_batch(n, signaled, |i| Ok(wqe(i)))
    }

    /// [`Qp::post_batch`] with a builder that may refuse a WQE (a range check, `Sge::new`): its first error
    /// ends the call with that error and nothing of the batch posted (the WQEs stored so far lie in WQEBBs the
    /// producer index has not passed, which the next post overwrites). The loop then tests each WQE's result.
    ///
    /// # Errors
    /// As [`Qp::post_batch`]; the builder's first error.
    #[inline(always)]
    pub fn try_post_batch<const N: usize>(
        &mut self,
        n: u32,
        signaled: bool,
        mut wqe: impl FnMut(u32) -> Result<Wqe<N>>,
    ) -> Result<Ticket> {
        let nbb = n.saturating_mul(wqebbs(N as u32));
        // A ring of a size device code cannot post to is refused by the reservation (`Handle`), as for `post`.
        if n == 0 || (sq::valid_ring(self.sq.cnt) && nbb > self.sq.cnt / 2) {
            return Err(Error::InvalidArgument(InvalidArgument::Batch));
        }
        let (first, sig) = self.reserve_batch(nbb, signaled)?;
        let (buf, cnt, qpn) = (self.sq.buf, self.sq.cnt, self.sq.qpn);
        // Stores WQE `i` at `pi` with `flags` and moves `pi` past it.
        let mut store = |i: u32, pi: &mut u64, flags: u8| -> Result<()> {
            let w = wqe(i)?;
            let segs = w.encode(Ctrl { idx: *pi as u16, qpn, fm_ce_se: flags });
            // SAFETY: `Qp::new`'s contract gives a valid ring; the reservation made `nbb` WQEBBs from `first`
            // ours, `n` times the most one WQE of `N` segments takes.
            unsafe { sq::write_segs(buf, cnt, *pi, &segs, w.ds()) };
            *pi += wqebbs(w.ds() as u32) as u64;
            Ok(())
        };
        let mut pi = first;
        // Every WQE but the last asks for no CQE: the loop holds no test of which one is last.
        for i in 0..n - 1 {
            store(i, &mut pi, 0)?;
        }
        let last = pi;
        store(n - 1, &mut pi, if sig { fm_ce_se::CQ_UPDATE } else { 0 })?;
        self.commit(last, (pi - first) as u32, sig);
        Ok(Ticket(last))
    }

    /// Reserves `nbb` WQEBBs for WQEs stored next (a batch, or a warp's WQEs), waiting for room; returns the
    /// first one's index and whether the last WQE of them asks for a CQE: when `signaled`, or when a quarter
    /// of the ring has been posted since the last one that did.
    ///
    /// # Errors
    /// As [`Qp::post`].
    #[inline(always)]
    pub(crate) fn reserve_batch(&mut self, nbb: u32, signaled: bool) -> Result<(u64, bool)> {
        self.sole()?;
        if nbb > self.sq.room {
            self.cold(move |q| q.reserve_slow(nbb))?;
        }
        Ok((self.sq.pi, signaled || nbb >= self.sq.until_cqe))
    }

    /// Records WQEs stored in the `nbb` WQEBBs just reserved, the last of which starts at `last` and asked for a
    /// CQE when `signaled`; the next [`Qp::ring_db`] rings them. A WQE that asked for a CQE goes to the
    /// handle's `sig_first`/`sig_end` at once (they are not kept in registers: most posts do not change them).
    #[inline(always)]
    pub(crate) fn commit(&mut self, last: u64, nbb: u32, signaled: bool) {
        self.sq.room -= nbb;
        self.sq.pi += nbb as u64;
        if signaled {
            self.h.sq.sig_first = last + 1;
            self.h.sq.sig_end = self.sq.pi;
            self.sq.until_cqe = self.sq.cnt / 4;
        } else {
            self.sq.until_cqe -= nbb;
        }
        self.unrung = true;
    }

    /// Posts an RDMA WRITE whose payload travels inside the WQE (1 ..= [`wqe::MAX_INLINE`] bytes):
    /// [`wqe::rdma_write_inline`] through [`Qp::post`].
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an empty or too long payload; as [`Qp::post`] otherwise.
    pub fn post_write_inline(&mut self, signaled: bool, remote: Raddr, data: &[u8]) -> Result<Ticket> {
        self.post(signaled, wqe::rdma_write_inline(remote, data)?)
    }

    /// Rings the doorbell for every WQE posted since the last ring: dbrec, then the 8-byte doorbell naming the
    /// producer index ([`CtrlSeg::producer_doorbell`], the form NVSHMEM IBGDA rings; rdma-core's provider
    /// writes the last WQE's first ctrl words instead, which announce the same WQEs). Does nothing when nothing
    /// is pending.
    ///
    /// Naming the producer index, the `Qp` keeps only whether anything is unrung, not the last WQE's ctrl
    /// words: one value fewer carried from a post to its doorbell, and fewer instructions in the BlueFlame
    /// post and the warp post (`cargo xtask sass`).
    #[inline(always)]
    pub fn ring_db(&mut self) {
        if self.unrung {
            self.unrung = false;
            let bits = CtrlSeg::producer_doorbell(self.sq.pi as u16, self.sq.qpn);
            // SAFETY: `Qp::new`'s contract gives valid dbrec and UAR addresses; the WQEs are stored.
            unsafe { db::publish_and_ring(self.sq.dbrec, self.sq.pi, self.sq.bf_reg, bits, self.sq.placement) };
        }
    }

    /// Posts `w` and rings by BlueFlame: after the dbrec, the WQE's first WQEBB goes, whole, from registers to
    /// the BlueFlame register ([`db::ring_bf`]; the WQE is also in the ring, where the NIC may fetch it). As
    /// rdma-core's mlx5 provider does, BlueFlame carries a doorbell's only WQE and only where the UAR has a
    /// BlueFlame buffer that takes it: a WQE of more than one WQEBB (an inline WRITE of more than 28 bytes),
    /// one behind earlier unrung WQEs, or any WQE on a QP whose handle says `bf_size` < 64 (a doorbell-only
    /// UAR) is posted and rung by doorbell instead (the doorbell covers the unrung ones).
    ///
    /// # Errors
    /// As [`Qp::post`].
    #[inline(always)]
    pub fn post_bf<const N: usize>(&mut self, signaled: bool, w: Wqe<N>) -> Result<Ticket> {
        let ds = w.ds();
        if ds as usize > SEGS_PER_WQEBB || self.unrung || !self.sq.blueflame {
            let t = self.post(signaled, w)?;
            self.ring_db();
            return Ok(t);
        }
        let (t, segs) = self.post_segs(signaled, ds, move |c| w.encode(c))?;
        // The first WQEBB, segment by segment up to a constant count, as `sq::write_segs` does: a copy of
        // run-time length would put both arrays in local memory.
        let first: [Seg; SEGS_PER_WQEBB] =
            core::array::from_fn(|i| if i < ds as usize && i < N { segs[i] } else { Seg::default() });
        self.unrung = false;
        // SAFETY: `Qp::new`'s contract gives valid dbrec and BlueFlame addresses; the WQE is stored.
        unsafe { db::publish_and_ring_bf(self.sq.dbrec, self.sq.pi, self.sq.bf_reg, &first, self.sq.placement) };
        Ok(t)
    }

    /// Polls one CQE. A requester completion retires the SQ up to its WQE; other completions (e.g. an inbound
    /// RDMA WRITE with immediate) are returned as they are. It rings nothing: a WQE posted without
    /// [`Qp::ring_db`] never completes however often it polls ([`Qp::wait`], [`Qp::flush`] and
    /// [`Qp::progress`] ring first).
    ///
    /// The QP has one CQ for both directions (there is no RQ yet): responder completions that
    /// [`Qp::wait`], [`Qp::flush`] or a post waiting for room meet are consumed there and not returned. Poll
    /// for them with `poll_cq` before waiting when the peer writes with immediate.
    ///
    /// A CQE that does not belong to this QP's outstanding WQEs is left in the CQ and reported as
    /// [`Error::UnexpectedCqe`].
    ///
    /// # Errors
    /// [`Error::Cqe`] for an error CQE (the QP is then in the error state); [`Error::UnexpectedCqe`].
    pub fn poll_cq(&mut self) -> Option<Result<Completion>> {
        if let Err(e) = self.sole() {
            return Some(Err(e));
        }
        self.cold(move |q| {
            let t = q.take()?;
            // SAFETY: `Qp::new`'s contract: a live CQ polled only by this thread.
            unsafe { cq::publish_ci(&q.h.cq) };
            Some(t.map(|t| t.completion).and_then(|c| c.map_err(Error::Cqe)))
        })
    }

    /// Takes one CQE ([`cq::take`]) and retires the SQ up to it, recording the first error CQE (sticky); the
    /// consumer index is left for the caller to publish.
    fn take(&mut self) -> Option<Result<cq::Taken>> {
        let pi = self.sq.pi;
        // SAFETY: `Qp::new`'s contract: a live CQ polled only by this thread.
        let t = match unsafe { cq::take(&mut self.h.cq, self.sq.qpn, self.sq.cnt, self.sq.ci, || pi) }? {
            Ok(t) => t,
            Err(u) => return Some(Err(Error::UnexpectedCqe(u))),
        };
        if let Some(w) = t.wqe {
            // The room grows by what this CQE retired, but for a ring of a size device code cannot post to
            // (`Sq::room`): CQEs of WQEs posted under another size must not open it (the slow paths run with
            // `cnt` set to a size they can work with; the handle keeps the real one).
            if sq::valid_ring(self.h.wqe_cnt) {
                self.sq.room += (w + 1 - self.sq.ci) as u32;
            }
            self.sq.ci = w + 1;
            if let (Err(e), 0) = (t.completion, self.h.sq.err_idx) {
                self.h.sq.err = e.pack();
                // Released after the error word: the other lanes of a warp that shares this QP
                // (`WarpQp::error`) read the index with acquire while the leader polls, and must see the word.
                // SAFETY: a field of the live handle, 8-byte aligned.
                unsafe { sync::store_release_u64(&mut self.h.sq.err_idx, w + 1) };
            }
        }
        Some(Ok(t))
    }

    /// Takes the CQEs software owns now, retiring the SQ and recording the first error CQE (sticky; error CQEs
    /// and responder completions are not returned), up to and including the first error CQE (the flushes
    /// behind it stay for [`Qp::poll_cq`]), and tells the NIC the consumer index once. Returns whether it took
    /// any.
    ///
    /// # Errors
    /// [`Error::UnexpectedCqe`] (left in the CQ; those before it are taken).
    fn drain(&mut self) -> Result<bool> {
        let mut took = false;
        let r = loop {
            match self.take() {
                None => break Ok(took),
                Some(Ok(t)) => {
                    took = true;
                    if t.completion.is_err() {
                        break Ok(true);
                    }
                }
                Some(Err(e)) => break Err(e),
            }
        };
        if took {
            // SAFETY: `Qp::new`'s contract: a live CQ polled only by this thread.
            unsafe { cq::publish_ci(&self.h.cq) };
        }
        r
    }

    /// Rings anything unrung and looks at the CQ once without waiting, so that an error CQE becomes visible
    /// to [`Qp::error`] (an error CQE is kept, sticky, not returned).
    ///
    /// # Errors
    /// [`Error::UnexpectedCqe`].
    pub fn progress(&mut self) -> Result<()> {
        self.sole()?;
        self.cold(move |q| {
            q.ring_db();
            q.drain().map(|_| ())
        })
    }

    /// The first error CQE of this QP's WQEs, if one completed in error (the QP is then in the error state).
    pub fn error(&self) -> Option<CqeError> {
        (self.h.sq.err_idx != 0).then(|| CqeError::unpack(self.h.sq.err, self.h.qpn))
    }

    /// Whether a try of a wait for a peer's signal looks at the CQ: [`Watch::IfDue`] only while the last WQE
    /// that asked for a CQE has not been retired.
    pub(crate) fn looks(&self, watch: Watch) -> bool {
        match watch {
            Watch::Skip => false,
            Watch::IfDue => self.sq.ci < self.h.sq.sig_first,
            Watch::Look => true,
        }
    }

    /// The first error, if it hit the WQE at `idx` or an earlier one.
    fn error_at_or_before(&self, idx: u64) -> Option<Error> {
        (self.h.sq.err_idx != 0 && self.h.sq.err_idx - 1 <= idx)
            .then(|| Error::Cqe(CqeError::unpack(self.h.sq.err, self.h.qpn)))
    }

    /// Waits until the WQE behind `t` has completed (DOCA GPUNetIO's `poll_cq_at`).
    ///
    /// # Errors
    /// [`Error::Cqe`] with the QP's first error CQE if that hit this WQE or an earlier one, however often
    /// asked and whoever polled it (the error is sticky); [`Error::Timeout`] after the QP's timeout;
    /// [`Error::UnexpectedCqe`]; [`Error::InvalidArgument`] (`Ticket`) for a ticket at or past this QP's
    /// producer index (one it has not issued yet). A ticket is a WQE index and carries no QP: one of another
    /// QP that is below this QP's producer index waits for this QP's WQE of that index.
    pub fn wait(&mut self, t: Ticket) -> Result<()> {
        self.sole()?;
        self.cold(move |q| {
            if t.0 >= q.sq.pi {
                // Not a WQE of this QP (yet): nothing could ever complete it.
                return Err(Error::InvalidArgument(InvalidArgument::Ticket));
            }
            if let Some(e) = q.error_at_or_before(t.0) {
                return Err(e);
            }
            if q.sq.ci > t.0 {
                return Ok(());
            }
            // An unsignaled WQE is retired only by a later CQE: ask for one when none was requested since `t`.
            if q.h.sq.sig_first <= t.0 {
                let _ = q.post(true, wqe::nop())?;
            }
            q.ring_db();
            let (timeout, qpn) = (q.timeout_ns, q.sq.qpn);
            bounded_steps(
                timeout,
                || {
                    let polled = q.drain();
                    if let Some(e) = q.error_at_or_before(t.0) {
                        return Err(e);
                    }
                    if q.sq.ci > t.0 {
                        // Done, even if a later WQE failed: its error belongs to its own waiters.
                        return Ok(Step::Done(()));
                    }
                    Ok(if polled? { Step::Progress } else { Step::Idle })
                },
                move || WaitOn::Cqe { qpn, wqe_index: t.0 },
            )
        })
    }

    /// Waits until the 8-byte semaphore at `sem` (host-order `u64`, advanced by a peer's atomics) is at least
    /// `expected`, watching this QP meanwhile; returns the value seen. MSCCL++ `Semaphore::wait` on the
    /// channel's connection.
    ///
    /// Unlike [`crate::wait::semaphore_ge`], the wait ends as soon as this QP has an error CQE (for example its
    /// peer died with WQEs of this QP outstanding, so the signal will never come): a dead connection is an
    /// error for its waiters, not a timeout. Polls the CQ like [`Qp::wait`] (responder completions met are
    /// consumed) while a CQE of this QP's own work is due, and else only once the signal is late
    /// ([`crate::wait::bounded_watching`]). A QP with nothing outstanding cannot learn of its peer's death:
    /// then the wait times out.
    ///
    /// # Errors
    /// [`Error::Cqe`] with the QP's first error CQE; [`Error::Timeout`] with [`WaitOn::Semaphore`] after the
    /// QP's timeout; [`Error::UnexpectedCqe`].
    ///
    /// # Safety
    /// `sem` must be valid for reads and 8-byte aligned for the whole wait.
    pub unsafe fn wait_semaphore(&mut self, sem: *const u64, expected: u64) -> Result<u64> {
        self.sole()?;
        self.cold(move |q| {
            let seen = core::cell::Cell::new(0);
            // Anything still unrung would never complete, and its CQE is what reports a dead peer.
            q.ring_db();
            bounded_watching(
                q.timeout_ns,
                |watch| {
                    // SAFETY: the caller guarantees `sem`.
                    seen.set(unsafe { crate::sync::load_acquire_u64(sem) });
                    if seen.get() >= expected {
                        return Ok(Some(seen.get()));
                    }
                    if !q.looks(watch) {
                        return Ok(None);
                    }
                    let polled = q.drain();
                    if let Some(e) = q.error() {
                        return Err(Error::Cqe(e));
                    }
                    polled.map(|_| None)
                },
                || WaitOn::Semaphore { addr: sem as u64, expected, seen: seen.get() },
            )
        })
    }

    /// Waits until every WQE posted so far has completed (MSCCL++ `flush`): rings pending WQEs, asks for a
    /// CQE with a NOP if the last WQE did not, then waits for it.
    ///
    /// # Errors
    /// As [`Qp::wait`]: once any WQE of this QP has completed in error, every flush returns that first error.
    pub fn flush(&mut self) -> Result<()> {
        self.sole()?;
        self.cold(move |q| {
            if let Some(e) = q.error() {
                return Err(Error::Cqe(e));
            }
            if q.h.sq.sig_end != q.sq.pi {
                let _ = q.post(true, wqe::nop())?;
            }
            if q.h.sq.sig_first == 0 {
                return Ok(());
            }
            q.wait(Ticket(q.h.sq.sig_first - 1))
        })
    }
}

/// The out-of-line half of [`Qp::cold`]: runs `f` on a `Qp` of `h` (whose counters the caller has just
/// written there) with the caller's `unrung` (whether WQEs wait for a doorbell), writes the counters back to
/// the handle (as the caller's drop will again later) and returns whether WQEs are still unrung with the
/// result. The `Qp` is not dropped: its drop would ring what the caller's `Qp` still holds unrung.
///
/// The C ABI is what keeps the caller's fast path free of a stack frame: on nvptx it passes and returns
/// aggregates (the closure, the result) by value in parameter space, where the Rust ABI passes them through a
/// copy in the caller's local memory (whose frame set-up ptxas then hoists into the caller's entry). Nothing
/// but Rust calls it.
#[cold]
#[inline(never)]
#[allow(improper_ctypes_definitions)]
extern "C" fn out_of_line<R, F: FnOnce(&mut Qp<'_>) -> R>(
    h: &mut QpHandle,
    unrung: bool,
    timeout_ns: u64,
    #[cfg(not(target_arch = "nvptx64"))] warp_leader: bool,
    f: F,
) -> (bool, R) {
    let mut q = core::mem::ManuallyDrop::new(Qp {
        sq: Sq::load(h),
        h,
        unrung,
        timeout_ns,
        // The caller's `Qp` made its check and stays counted (or not, a warp's leader, whose kind this one
        // takes); this one is never dropped.
        #[cfg(not(target_arch = "nvptx64"))]
        intruder: false,
        #[cfg(not(target_arch = "nvptx64"))]
        warp_leader,
    });
    if !sq::valid_ring(q.sq.cnt) {
        // Room is 0, so nothing is stored; the CQ's index arithmetic gets a size it can work with.
        q.sq.cnt = sq::MIN_WQE_CNT;
    }
    let r = f(&mut q);
    let (sq, unrung) = (q.sq, q.unrung);
    sq.store(!unrung, q.h);
    (unrung, r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gdaki_shared::prm::cqe::CQE_SIZE;
    use gdaki_shared::prm::opcode;
    use std::boxed::Box;

    /// Host memory for one QP: a ring of 16 WQEBBs, its dbrec and register, and an empty 16-entry CQ.
    #[repr(C, align(64))]
    struct Mem {
        ring: [Seg; 16 * SEGS_PER_WQEBB],
        reg: [u64; 8],
        dbrec: [u32; 2],
        cq_dbrec: [u32; 2],
        cqes: [[u8; CQE_SIZE]; 16],
    }

    /// A ring's worth of `old` in [`Mem`] with an empty CQ, and a handle of size `wqe_cnt` over it.
    fn mem_and_handle(wqe_cnt: u32, old: Seg) -> (Box<Mem>, QpHandle) {
        let mut m = Box::new(Mem {
            ring: [old; 16 * SEGS_PER_WQEBB],
            reg: [0; 8],
            dbrec: [0; 2],
            cq_dbrec: [0; 2],
            cqes: [[0; CQE_SIZE]; 16],
        });
        for c in &mut m.cqes {
            c[CQE_SIZE - 1] = opcode::cqe::INVALID << 4;
        }
        let mut h = QpHandle {
            sq_buf: m.ring.as_mut_ptr() as u64,
            dbrec: m.dbrec.as_mut_ptr() as u64,
            bf_reg: m.reg.as_mut_ptr() as u64,
            wqe_cnt,
            qpn: 0x42,
            bf_size: 64,
            ..QpHandle::default()
        };
        h.cq.buf = m.cqes.as_mut_ptr() as u64;
        h.cq.dbrec = m.cq_dbrec.as_mut_ptr() as u64;
        h.cq.ncqe = 16;
        (m, h)
    }

    #[test]
    fn a_raw_wqe_over_max_ds_is_refused_at_once() {
        let old = Seg([0x5a5a_5a5a_5a5a_5a5a, 0xa5a5]);
        let (m, mut h) = mem_and_handle(16, old);
        // SAFETY: every address of `h` is in `m`, which outlives the `Qp`; one thread. A wait for room (what
        // such a post did) ends in a timeout after 100 ms.
        let mut q = unsafe { Qp::new(&mut h, 100_000_000) };
        let nop = |c| wqe::nop().encode(c)[0];
        // 17 and 64 WQEBBs (more than MAX_DS takes), on a ring of 16, where a wait for room would never end.
        // SAFETY: refused before anything is stored.
        let r =
            [unsafe { q.post_raw(false, 65, |c| [nop(c); 65]) }, unsafe { q.post_raw(false, 255, |c| [nop(c); 255]) }];
        assert_eq!(r, [Err(Error::InvalidArgument(InvalidArgument::WqeSize)); 2]);
        drop(q);
        assert!(m.ring.iter().all(|s| *s == old));
        assert_eq!((h.sq.pi, m.dbrec, m.reg), (0, [0; 2], [0; 8]));
    }

    #[test]
    fn a_slow_path_nested_in_one_finds_no_room_in_a_ring_of_an_invalid_size() {
        // Handles of sizes device code does not post to, over memory that holds 16 WQEBBs (the size a slow path
        // works with for them), so that a post the size check misses lands in memory the test owns and shows.
        for wqe_cnt in [0, 8, 15, 17, 1 << 16] {
            let old = Seg([0x5a5a_5a5a_5a5a_5a5a, 0xa5a5]);
            let (m, mut h) = mem_and_handle(wqe_cnt, old);
            // SAFETY: every address of `h` is in `m`, which outlives the `Qp`; one thread.
            let mut q = unsafe { Qp::new(&mut h, 1_000_000) };
            assert_eq!(q.sq.room, 0, "{wqe_cnt}");
            // Inside a slow path (whose `cnt` is the smallest valid size), a nested one (`progress`) reads the
            // counters again: the room must stay 0, and posts must be refused, not stored.
            let (room, posted) = q.cold(|q| {
                q.progress().unwrap();
                (q.sq.room, [q.post(false, wqe::nop()), q.post(false, wqe::nop())])
            });
            let refused = Err(Error::InvalidArgument(InvalidArgument::Handle));
            assert_eq!((room, posted), (0, [refused, refused]), "{wqe_cnt}");
            assert_eq!(q.post(false, wqe::nop()), refused, "{wqe_cnt}");
            drop(q);
            assert!(m.ring.iter().all(|s| *s == old), "{wqe_cnt}");
            assert_eq!((h.sq.pi, h.sq.ready, m.dbrec, m.reg), (0, 0, [0; 2], [0; 8]), "{wqe_cnt}");
        }
    }

    /// An Exclusive `Qp` made while a shared poster's call is under way on its handle (a flush waiting for a CQE
    /// that this NIC-less memory never gets): every call of the `Qp` is refused with `Posters`, its drop writes
    /// nothing back, and the flush ends in its own timeout; once both are gone a new `Qp` posts after the shared
    /// poster's WQE.
    #[test]
    fn a_qp_made_while_a_shared_call_is_under_way_is_refused() {
        use crate::scope::Device;
        use crate::shared_qp::SharedQp;
        let old = Seg([0x5a5a_5a5a_5a5a_5a5a, 0xa5a5]);
        let (_m, mut h) = mem_and_handle(16, old);
        let hp = &mut h as *mut QpHandle as usize;
        let (flushing, flushed) = std::sync::mpsc::channel();
        std::thread::scope(|s| {
            let waiter = s.spawn(move || {
                // SAFETY: `h` and its memory outlive the scope; this thread is the QP's one shared poster, and
                // the `Qp` below is the misuse under test.
                let qp = unsafe { SharedQp::<Device>::new(hp as *mut QpHandle, 2_000_000_000) };
                assert_eq!(qp.post(true, wqe::nop()), Ok(Ticket(0)));
                flushing.send(()).unwrap();
                qp.flush()
            });
            flushed.recv().unwrap();
            // Well inside the flush's 2 s.
            std::thread::sleep(std::time::Duration::from_millis(200));
            // SAFETY: as above.
            let mut q = unsafe { Qp::new(&mut *(hp as *mut QpHandle), 1_000_000) };
            let refused = Error::InvalidArgument(InvalidArgument::Posters);
            assert_eq!(q.post(false, wqe::nop()), Err(refused));
            assert_eq!(q.flush(), Err(refused));
            assert_eq!(q.wait(Ticket(0)), Err(refused));
            drop(q);
            match waiter.join().unwrap() {
                Err(Error::Timeout(crate::error::Timeout {
                    on: crate::error::WaitOn::Cqe { qpn: 0x42, .. }, ..
                })) => {}
                other => panic!("the shared flush: {other:?}"),
            }
        });
        assert_eq!(
            (h.sq.host_posters, h.sq.host_shared, h.sq.pi, h.sq.ready),
            (0, 0, 1, 1),
            "the refused Qp wrote back"
        );
        // SAFETY: as above, one thread now.
        let mut q = unsafe { Qp::new(&mut h, 1_000_000) };
        assert_eq!(q.post(false, wqe::nop()), Ok(Ticket(1)));
    }

    /// A `WarpQp` holds the QP from its making to its drop (on the GPU its leader keeps the counters): on a
    /// host thread, a Device-scope shared post and an Exclusive `Qp` made while it lives are refused with
    /// `Posters` (before, both went out between the `WarpQp`'s calls); a `WarpQp` made while a `Qp` lives is
    /// refused for its life, even once the `Qp` is gone; and once the `WarpQp`s are dropped, every poster posts
    /// after the last WQE.
    #[test]
    fn a_warp_qp_is_a_poster_from_its_making_to_its_drop() {
        use crate::scope::Device;
        use crate::shared_qp::SharedQp;
        use crate::warp_qp::WarpQp;
        let (_m, mut h) = mem_and_handle(16, Seg([0; 2]));
        let hp: *mut QpHandle = &mut h;
        let refused = Error::InvalidArgument(InvalidArgument::Posters);
        // SAFETY: `h` and its memory outlive every poster; one thread; the posters made while another lives are
        // the misuse under test, refused before they touch the ring.
        let mut wq = unsafe { WarpQp::new(hp, 1_000_000) };
        assert_eq!(wq.post(false, wqe::nop()), Ok(Ticket(0)));
        // SAFETY: as above.
        let shared = unsafe { SharedQp::<Device>::new(hp, 1_000_000) };
        assert_eq!(shared.post(false, wqe::nop()), Err(refused));
        {
            // SAFETY: as above.
            let mut q = unsafe { Qp::new(&mut *hp, 1_000_000) };
            assert_eq!(q.post(false, wqe::nop()), Err(refused));
        }
        assert_eq!(wq.post(false, wqe::nop()), Ok(Ticket(1)), "the WarpQp goes on");
        drop(wq);
        assert_eq!(shared.post(false, wqe::nop()), Ok(Ticket(2)), "after the WarpQp's drop");
        // SAFETY: as above.
        let mut q = unsafe { Qp::new(&mut *hp, 1_000_000) };
        // SAFETY: as above.
        let mut late = unsafe { WarpQp::new(hp, 1_000_000) };
        drop(q);
        assert_eq!(late.post(false, wqe::nop()), Err(refused), "made while a Qp lived");
        drop(late);
        // SAFETY: as above.
        q = unsafe { Qp::new(&mut *hp, 1_000_000) };
        assert_eq!(q.post(false, wqe::nop()), Ok(Ticket(3)));
        drop(q);
        assert_eq!((h.sq.host_posters, h.sq.host_shared, h.sq.host_warps, h.sq.pi), (0, 0, 0, 4));
    }
}
