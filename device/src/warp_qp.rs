//! An RC QP driven by one warp (DOCA GPUNetIO's `put_warp` on an EXCLUSIVE QP, NVSHMEM's warp-scope puts):
//! the lanes that call [`WarpQp::post`] together each build one WQE, the lowest reserves WQEBBs for all of
//! them, each stores its own, and one doorbell covers the batch.
//!
//! A call is made by the members that execute it together, as long as the leader (the lowest member, which
//! keeps the counters) is one of them: the whole warp for a batch of 32, lane 0 alone for a signal or a
//! flush. Members without the leader get an error and post nothing.
//!
//! The send-queue state is the Exclusive QP's: the leader lane keeps a [`Qp`] over the handle, from
//! [`WarpQp::new`] to the drop, for the reservation, the counters (in its registers across posts), the CQ and
//! the doorbell, so the ring's rules (CQE policy, retirement, sticky errors) are the same code. The other lanes
//! only read the handle's fixed fields (ring, QPN, size), once. On the
//! host a thread is a warp of one lane ([`crate::warp`]): each thread posts and rings for itself. The threads
//! that are one warp on the GPU share its handle there, so on the host each call takes a turn (a ticket of
//! the handle's `host_next`, served in order; a bounded wait) and makes its leader `Qp` from the handle for the
//! call alone: the same code posts, one thread at a time. A `WarpQp` keeps the QP's one send-queue state as a
//! `Qp` does, so it follows any earlier poster of its handle.

use crate::error::{CqeError, Error, InvalidArgument, Result};
use crate::qp::{Qp, Ticket};
use crate::sq;
use crate::warp::Lanes;
use crate::wqe::{Ctrl, Wqe};
use gdaki_shared::handle::QpHandle;
use gdaki_shared::prm::wqe::{fm_ce_se, wqebbs, SEGS_PER_WQEBB};

/// How many timeouts a host thread's call may hold its turn for, at most, in the bound of a later call's wait
/// for its turn ([`WarpQp::begin_turn`]): a post may wait for room once, a flush for room (its NOP) and for
/// the CQE, each bounded by the timeout.
#[cfg(not(target_arch = "nvptx64"))]
const TURN_BOUND: u64 = 4;

/// The turn word (`host_serving` low, `host_given_up` high) once the serving ticket's turn ends: the next
/// ticket served, passing over every ticket given up.
#[cfg(not(target_arch = "nvptx64"))]
fn pass(turn: u64) -> u64 {
    let (mut serving, mut given_up) = ((turn as u32).wrapping_add(1), (turn >> 32) as u32 >> 1);
    while given_up & 1 != 0 {
        serving = serving.wrapping_add(1);
        given_up >>= 1;
    }
    u64::from(serving) | u64::from(given_up) << 32
}

/// Gives up `ticket`, whose host thread waited out its bound: marks it in `host_given_up`, so that the turn
/// passes over it, or ends its turn at once if it has just come. A ticket 32 or more behind the one served
/// cannot be marked and is lost, as every later one then is (each times out; none hangs).
#[cfg(not(target_arch = "nvptx64"))]
fn give_up(turn: &core::sync::atomic::AtomicU64, ticket: u32) {
    use core::sync::atomic::Ordering;
    let _ = turn.fetch_update(Ordering::AcqRel, Ordering::Relaxed, |t| match ticket.wrapping_sub(t as u32) {
        0 => Some(pass(t)),
        d @ 1..32 => Some(t | 1u64 << (32 + d)),
        _ => None,
    });
}

/// One QP's send side, owned by the lanes of one warp for the lifetime `'a`.
///
/// The lanes that make it together ([`WarpQp::new`]) are its members for its whole life; the lowest of them
/// is the leader and keeps the QP's [`Qp`] (the handle's counters in registers, read here and written back
/// when the `WarpQp` drops, as a `Qp` keeps them), the others the handle's fixed fields.
pub struct WarpQp<'a> {
    h: *mut QpHandle,
    /// The members' lane mask.
    mask: u32,
    /// The leader's view of the QP; `None` in the other members.
    leader: Option<Qp<'a>>,
    sq_buf: u64,
    wqe_cnt: u32,
    qpn: u32,
    /// Bound of each wait, ns: a host thread's wait for its turn is bounded by it too ([`TURN_BOUND`]).
    #[cfg(not(target_arch = "nvptx64"))]
    timeout_ns: u64,
    /// On a host thread: whether an Exclusive `Qp` of the handle lived when this `WarpQp` was made: on the GPU
    /// its leader would have read stale counters, so every call is refused ([`InvalidArgument::Posters`]).
    #[cfg(not(target_arch = "nvptx64"))]
    intruder: bool,
}

/// On a host thread a `WarpQp` is counted in its handle
/// ([`SqState::host_warps`](gdaki_shared::handle::SqState::host_warps)) from [`WarpQp::new`] to its drop, as
/// the GPU's leader holds the QP's counters that long.
#[cfg(not(target_arch = "nvptx64"))]
impl Drop for WarpQp<'_> {
    fn drop(&mut self) {
        // SAFETY: the handle's `host_warps` word (contract of `new`), 8-byte aligned, only ever accessed
        // atomically, by host threads.
        unsafe { core::sync::atomic::AtomicU64::from_ptr(core::ptr::addr_of_mut!((*self.h).sq.host_warps)) }
            .fetch_sub(1, core::sync::atomic::Ordering::Release);
    }
}

impl<'a> WarpQp<'a> {
    /// Takes the QP described by `h` for the calling lanes; bounded waits give up after `timeout_ns`
    /// nanoseconds. The lanes that will post call this together (the lanes executing it with the same `h`
    /// become the members), each making its own `WarpQp`; every later call is made by the members that take
    /// part in it, together, the leader (the lowest member) always among them.
    ///
    /// # Safety
    /// `h` must be a handle built by the host for a live, connected QP (as [`Qp::new`] requires), used for
    /// `'a` by the members only, through their `WarpQp`s. On the `cpu` executor the first warp of a launch
    /// whose call takes a turn (a post, flush or wait) owns the handle until the launch ends, and another
    /// warp's calls get [`InvalidArgument::Sharing`]; a `WarpQp` made while an Exclusive `Qp` of the handle
    /// lives gets [`InvalidArgument::Posters`] for every call, its turns get it while a shared poster's call is
    /// under way, and while it lives an Exclusive `Qp` or a Device-scope shared poster of the handle (a
    /// Block-scope one too, outside a launch) is refused with it.
    #[inline(always)]
    pub unsafe fn new(h: *mut QpHandle, timeout_ns: u64) -> Self {
        let lanes = Lanes::active_with(h as u64);
        // SAFETY: fields the host set and nobody writes while the QP is owned (the contract).
        let (sq_buf, wqe_cnt, qpn) = unsafe { ((*h).sq_buf, (*h).wqe_cnt, (*h).qpn) };
        // SAFETY: the contract gives a live handle owned by these lanes; the leader is its one writer, the
        // others read only the fixed fields above. (A host thread makes its leader for each call instead.)
        #[cfg(target_arch = "nvptx64")]
        let leader = (lanes.lane == lanes.leader()).then(|| unsafe { Qp::new(&mut *h, timeout_ns) });
        #[cfg(target_arch = "nvptx64")]
        return Self { h, mask: lanes.mask, leader, sq_buf, wqe_cnt, qpn };
        #[cfg(not(target_arch = "nvptx64"))]
        {
            use core::sync::atomic::{AtomicU64, Ordering::SeqCst};
            // SAFETY: the handle's host-only words (contract), 8-byte aligned, only ever accessed atomically,
            // by host threads.
            let word = |w: *mut u64| unsafe { AtomicU64::from_ptr(w) };
            // SAFETY: the contract gives a live handle; `addr_of_mut!` forms no reference.
            let sq = unsafe { core::ptr::addr_of_mut!((*h).sq) };
            // Counted before the look at the other posters, all sequentially consistent, as they count
            // themselves before they look at this count: of two made at once, at least one sees the other.
            // A shared call under way is not looked at here: each turn's leader refuses to go on beside one
            // (`Qp::new_warp_leader`), every later shared call is refused while this `WarpQp` lives, and in a
            // launch a Block-scope QP's owner tells the two sharings apart (`owned`) whichever came first.
            // SAFETY: as above.
            let (warps, posters) =
                unsafe { (core::ptr::addr_of_mut!((*sq).host_warps), core::ptr::addr_of_mut!((*sq).host_posters)) };
            word(warps).fetch_add(1, SeqCst);
            let intruder = word(posters).load(SeqCst) != 0;
            Self { h, mask: lanes.mask, leader: None, sq_buf, wqe_cnt, qpn, timeout_ns, intruder }
        }
    }

    /// On a host thread of a `cpu` launch, whether this thread's warp owns the QP for the launch: the first
    /// warp whose call takes a turn (a post, a flush, a wait) claims it, and another warp of the launch (another
    /// CTA's, or the same CTA's with another `tid / 32`) is refused, since on the GPU each warp would lead the
    /// QP with counters of its own ([`crate::thread`]'s `may_post`).
    ///
    /// # Errors
    /// [`InvalidArgument::Sharing`] for a warp that does not own the QP; [`InvalidArgument::Posters`] for a
    /// `WarpQp` made while an Exclusive `Qp` of the handle lived (`intruder`).
    #[cfg(not(target_arch = "nvptx64"))]
    fn owned(&self) -> Result<()> {
        // SAFETY: the handle's `host_owner` word (contract of `new`), 8-byte aligned, only ever accessed
        // atomically, by host threads.
        let owner =
            unsafe { core::sync::atomic::AtomicU64::from_ptr(core::ptr::addr_of_mut!((*self.h).sq.host_owner)) };
        if !crate::thread::host::may_post(owner, true) {
            return Err(Error::InvalidArgument(InvalidArgument::Sharing));
        }
        // After the launch's owner, so that in a launch two sharings of one QP are told apart alike whichever
        // posted first.
        if self.intruder {
            return Err(Error::InvalidArgument(InvalidArgument::Posters));
        }
        Ok(())
    }

    /// On a host thread, makes the QP this thread's until [`WarpQp::end_turn`]: takes a ticket of the handle's
    /// host turns (`SqState::host_next`), waits until it is served (`host_serving`: turns go in ticket order,
    /// so no thread is passed over by later ones), and makes the leader `Qp` from the handle, so that the
    /// threads sharing a handle there post one at a time, each from the counters the last one left. (On the
    /// GPU the warp owns the QP from `new` to the drop, and the calls take no turns.)
    ///
    /// The wait is bounded by [`TURN_BOUND`] times the timeout for each call ahead of this one and for this
    /// one: far more than those calls take, every wait of theirs being bounded by the same timeout.
    ///
    /// # Errors
    /// [`Error::Timeout`] on [`WaitOn::Turn`](crate::error::WaitOn::Turn) when the calls ahead did not end
    /// their turns in time (a call of another handle of the QP, whose timeout is longer; or one that never
    /// ends, which then loses the QP for every later ticket too: each of them ends the same way, none hangs).
    /// The ticket is given up ([`give_up`]): the turn passes over it, so later calls go on.
    /// [`InvalidArgument::Sharing`] when another warp of the launch owns the QP ([`WarpQp::owned`]).
    #[cfg(not(target_arch = "nvptx64"))]
    fn begin_turn(&mut self) -> Result<()> {
        use core::sync::atomic::Ordering;
        self.owned()?;
        let (next, turn) = self.turn_words();
        let ticket = next.fetch_add(1, Ordering::Relaxed);
        let serving = |t: &core::sync::atomic::AtomicU64, o| t.load(o) as u32;
        let ahead = u64::from(ticket.wrapping_sub(serving(turn, Ordering::Relaxed)));
        let bound = self.timeout_ns.saturating_mul(TURN_BOUND).saturating_mul(ahead + 1);
        let waited = crate::wait::bounded(
            bound,
            // Acquire: the last holder's counters, written back before its release, are read below. A thread
            // that is not served yields at once: the turn goes to one thread, which may be waiting for a core
            // (8 threads on 2 cores, each posting as fast as it can: 13 µs a turn this way, 19 µs spinning
            // first as other waits do; a lock that the holder could take straight back took 1.3 µs a turn but
            // let one thread keep the QP while the others timed out).
            || {
                if serving(turn, Ordering::Acquire) == ticket {
                    return Ok(Some(()));
                }
                std::thread::yield_now();
                Ok(None)
            },
            || crate::error::WaitOn::Turn {
                addr: next.as_ptr() as u64,
                ticket,
                serving: serving(turn, Ordering::Relaxed),
            },
        );
        if waited.is_err() {
            give_up(turn, ticket);
        }
        waited?;
        // SAFETY: the turn makes this thread the handle's one poster until `end_turn`.
        self.leader = Some(unsafe { Qp::new_warp_leader(&mut *self.h, self.timeout_ns) });
        Ok(())
    }

    /// Ends a host thread's [`WarpQp::begin_turn`]: drops the leader (what it left unrung is rung, its counters
    /// go back to the handle), then serves the next ticket.
    #[cfg(not(target_arch = "nvptx64"))]
    fn end_turn(&mut self) {
        use core::sync::atomic::Ordering;
        self.leader = None;
        let turn = self.turn_words().1;
        // Release: the counters the leader wrote back are seen by the next holder's acquire.
        let _ = turn.fetch_update(Ordering::Release, Ordering::Relaxed, |t| Some(pass(t)));
    }

    /// The handle's `host_next` word, and its `host_serving` and `host_given_up` words as one 64-bit word
    /// (serving in the low half), as atomics.
    #[cfg(not(target_arch = "nvptx64"))]
    fn turn_words(&self) -> (&core::sync::atomic::AtomicU32, &core::sync::atomic::AtomicU64) {
        use core::sync::atomic::{AtomicU32, AtomicU64};
        const _: () = assert!(cfg!(target_endian = "little"), "the turn word keeps the serving ticket low");
        // SAFETY: fields of the live handle (contract of `new`), only ever accessed atomically (by the host
        // threads' turns); `host_serving` is at offset 72 of the 8-byte aligned state, with `host_given_up`
        // after it; they live as long as the handle, which outlives `self`.
        unsafe {
            (
                AtomicU32::from_ptr(core::ptr::addr_of_mut!((*self.h).sq.host_next)),
                AtomicU64::from_ptr(core::ptr::addr_of_mut!((*self.h).sq.host_serving).cast::<u64>()),
            )
        }
    }

    /// The members that make this call (those executing it now), when the leader is one of them: the call is
    /// theirs, its batch their WQEs. An error for every caller otherwise (before any warp-wide instruction,
    /// so that no lane waits for a member that is not there): only the leader keeps the counters.
    #[inline(always)]
    fn callers(&self) -> Result<Lanes> {
        let callers = Lanes::active() & self.mask;
        if !self.led(callers) {
            return Err(Error::InvalidArgument(InvalidArgument::TeamRules));
        }
        Ok(Lanes::of(callers))
    }

    /// Whether the lanes `callers` include the leader, the lowest member (`mask & -mask` is its bit).
    #[inline(always)]
    fn led(&self, callers: u32) -> bool {
        callers & self.mask & self.mask.wrapping_neg() != 0
    }

    /// Posts `w` from every caller, one WQE each in lane order, and rings one doorbell for all of them (the
    /// leader's [`Qp::ring_db`], naming the producer index; never BlueFlame, which carries a single WQE). The
    /// last WQE asks for a CQE when any caller passed `signaled` (or the Exclusive QP's quarter ring rule says
    /// so); its ticket, returned to those lanes, completes once every WQE of the batch has. Other lanes get
    /// their own WQE's index.
    ///
    /// # Errors
    /// For every caller: [`InvalidArgument::TeamRules`] when the leader does not execute the call with it (a
    /// call without the leader, or a warp that diverged between them: then the leader's part of the warp makes
    /// a call of its own, posting its lanes' WQEs); [`InvalidArgument::Batch`] when the callers' WQEs differ in size or
    /// the batch needs more than half the ring (it could wait for room forever); otherwise what [`Qp::post`] returns to
    /// the leader (a timeout, an unexpected CQE, [`InvalidArgument::Handle`] for a ring of a size device code cannot
    /// post to). Nothing is posted on an error.
    #[inline(always)]
    pub fn post<const N: usize>(&mut self, signaled: bool, w: Wqe<N>) -> Result<Ticket> {
        let lanes = self.callers()?;
        // A whole warp (the common case) gets its own copy of the path, with every mask, count and lane
        // index a constant: a shuffle or vote whose member mask is not known to be the whole warp costs a
        // convergence check of five instructions in SASS.
        #[cfg(not(target_arch = "nvptx64"))]
        self.begin_turn()?;
        let r = if lanes.mask == u32::MAX {
            self.post_as(Lanes { mask: u32::MAX, lane: lanes.lane }, signaled, w)
        } else {
            self.post_as(lanes, signaled, w)
        };
        #[cfg(not(target_arch = "nvptx64"))]
        self.end_turn();
        r
    }

    /// [`WarpQp::post`] by the members `lanes`.
    #[inline(always)]
    fn post_as<const N: usize>(&mut self, lanes: Lanes, signaled: bool, w: Wqe<N>) -> Result<Ticket> {
        // A WQE of at most four segments (`ds` <= `N`) takes one WQEBB in every lane: no shuffle and vote to
        // compare sizes then.
        let one_wqebb = N <= SEGS_PER_WQEBB;
        let nbb = if one_wqebb { 1 } else { wqebbs(w.ds() as u32) };
        let total = nbb * lanes.count();
        let same = one_wqebb || lanes.all(nbb == lanes.shfl32(nbb, lanes.leader()));
        // A ring of a size device code cannot post to goes on to the reservation, which refuses it (`Handle`),
        // as `Qp::post` does.
        if !same || (total > self.wqe_cnt / 2 && sq::valid_ring(self.wqe_cnt)) {
            return Err(Error::InvalidArgument(InvalidArgument::Batch));
        }
        // The reservation, the store and the publication inline, as `reserve`, `store` and `publish` do them for
        // `post_part`: built from those three, this path's loop in the post-rate kernel went from 121 SASS
        // instructions to 160 and spilled to local memory (`cargo xtask sass`).
        let any_signaled = lanes.any(signaled);
        let reserved = match &mut self.leader {
            Some(q) => q.reserve_batch(total, any_signaled),
            None => Ok((0, false)),
        };
        let (first, sig) = *reserved.as_ref().unwrap_or(&(0, false));
        lanes.share_result(reserved.map(|_| ()))?;
        let base = lanes.shfl(first, lanes.leader());
        let sig = lanes.shfl32(sig as u32, lanes.leader()) != 0;
        let idx = base + (lanes.rank() * nbb) as u64;
        let last = base + ((lanes.count() - 1) * nbb) as u64;
        let flags = if sig && idx == last { fm_ce_se::CQ_UPDATE } else { 0 };
        let segs = w.encode(Ctrl { idx: idx as u16, qpn: self.qpn, fm_ce_se: flags });
        // SAFETY: a valid ring (contract of `new`); the leader reserved WQEBBs `base..base + total` for the
        // batch, and `idx..idx + nbb` is this lane's share.
        unsafe { sq::write_segs(self.sq_buf, self.wqe_cnt, idx, &segs, w.ds()) };
        // Every lane's WQE is stored before the leader's release and doorbell (bar.warp.sync orders the
        // members' accesses; the leader's release fence then covers them).
        lanes.sync();
        if let Some(q) = &mut self.leader {
            q.commit(last, total, sig);
            q.ring_db();
        }
        Ok(Ticket(if signaled && sig { last } else { idx }))
    }

    /// Posts the WQEs of the callers that pass one, in lane order, as one batch with one doorbell; the callers
    /// passing `None` make the call too but post nothing: [`WarpQp::post`] for a batch that not every caller
    /// fills (a range in fewer pieces than lanes, a signal posted by one lane). Returns to each lane with a
    /// WQE its ticket (as `post` does), `None` to the others; a batch of no WQE posts nothing.
    ///
    /// # Errors
    /// As [`WarpQp::post`], for every caller ([`InvalidArgument::Batch`] also when the WQEs passed differ in
    /// size).
    pub fn post_some<const N: usize>(&mut self, signaled: bool, w: Option<Wqe<N>>) -> Result<Option<Ticket>> {
        let lanes = self.callers()?;
        // A caller without a WQE takes no turn below: it is refused here as its team's posters are.
        #[cfg(not(target_arch = "nvptx64"))]
        self.owned()?;
        let have = lanes.ballot(w.is_some());
        match w {
            // Every caller posts: `post`'s path.
            Some(w) if have == lanes.mask => return self.post(signaled, w).map(Some),
            _ if have == 0 => return Ok(None),
            _ => {}
        }
        // Some callers post (only on the GPU: a host thread is a warp of one lane).
        #[cfg(not(target_arch = "nvptx64"))]
        self.begin_turn()?;
        let r = self.post_part(lanes, Lanes { mask: have, lane: lanes.lane }, signaled, w);
        #[cfg(not(target_arch = "nvptx64"))]
        self.end_turn();
        r
    }

    /// On host threads (each a warp of one lane, posting alone), what the GPU refuses of a team call whose
    /// members with a WQE are ranks `0 .. k` and of which this caller, of rank `rank`, passes `w`: the warp's
    /// batch then holds at least `rank + 1` such WQEs, and over half the ring it is
    /// [`InvalidArgument::Batch`] on the GPU ([`WarpQp::post_some`]). Refused here too, so that a test on the
    /// `cpu` executor fails as the GPU would (the members of lower rank pass there).
    ///
    /// # Errors
    /// [`InvalidArgument::Batch`] as said.
    #[cfg(not(target_arch = "nvptx64"))]
    pub(crate) fn check_team_piece<const N: usize>(&self, rank: u32, w: &Wqe<N>) -> Result<()> {
        let at_least = (rank + 1).saturating_mul(wqebbs(w.ds() as u32));
        if at_least > self.wqe_cnt / 2 && sq::valid_ring(self.wqe_cnt) {
            return Err(Error::InvalidArgument(InvalidArgument::Batch));
        }
        Ok(())
    }

    /// [`WarpQp::post_some`] when the callers `posters` of `lanes` (some, not all) pass a WQE.
    fn post_part<const N: usize>(
        &mut self,
        lanes: Lanes,
        posters: Lanes,
        signaled: bool,
        w: Option<Wqe<N>>,
    ) -> Result<Option<Ticket>> {
        let mine = w.as_ref().map_or(0, |w| wqebbs(w.ds() as u32));
        let nbb = lanes.shfl32(mine, posters.leader());
        let total = nbb * posters.count();
        let same = lanes.all(w.is_none() || mine == nbb);
        if !same || (total > self.wqe_cnt / 2 && sq::valid_ring(self.wqe_cnt)) {
            return Err(Error::InvalidArgument(InvalidArgument::Batch));
        }
        let (base, sig) = self.reserve(lanes, total, lanes.any(signaled && w.is_some()))?;
        let idx = base + (posters.rank() * nbb) as u64;
        let last = base + ((posters.count() - 1) * nbb) as u64;
        if let Some(w) = &w {
            self.store(idx, sig && idx == last, w);
        }
        self.publish(lanes, last, total, sig);
        Ok(w.map(|_| Ticket(if signaled && sig { last } else { idx })))
    }

    /// The leader's reservation of `total` WQEBBs for a batch (its last WQE asking for a CQE when
    /// `any_signaled` or the quarter-ring rule says so), handed to every caller: the first WQEBB's index and
    /// whether the batch's last WQE asks for a CQE.
    ///
    /// # Errors
    /// The leader's [`Qp::reserve_batch`] error, for every caller.
    #[inline(always)]
    fn reserve(&mut self, lanes: Lanes, total: u32, any_signaled: bool) -> Result<(u64, bool)> {
        let reserved = match &mut self.leader {
            Some(q) => q.reserve_batch(total, any_signaled),
            None => Ok((0, false)),
        };
        let (first, sig) = *reserved.as_ref().unwrap_or(&(0, false));
        lanes.share_result(reserved.map(|_| ()))?;
        let base = lanes.shfl(first, lanes.leader());
        let sig = lanes.shfl32(sig as u32, lanes.leader()) != 0;
        Ok((base, sig))
    }

    /// Stores this lane's WQE `w` at WQEBB `idx` of the batch, asking for a CQE when `cqe`.
    #[inline(always)]
    fn store<const N: usize>(&self, idx: u64, cqe: bool, w: &Wqe<N>) {
        let flags = if cqe { fm_ce_se::CQ_UPDATE } else { 0 };
        let segs = w.encode(Ctrl { idx: idx as u16, qpn: self.qpn, fm_ce_se: flags });
        // SAFETY: a valid ring (contract of `new`); the leader reserved the batch's WQEBBs ([`WarpQp::reserve`]),
        // and `idx..idx + ceil(ds / 4)` is this lane's share of them.
        unsafe { sq::write_segs(self.sq_buf, self.wqe_cnt, idx, &segs, w.ds()) };
    }

    /// Publishes the batch: once every lane's WQE is stored (bar.warp.sync orders the members' accesses; the
    /// leader's release fence then covers them), the leader records the `total` WQEBBs, the last at `last`, and
    /// rings one doorbell.
    #[inline(always)]
    fn publish(&mut self, lanes: Lanes, last: u64, total: u32, sig: bool) {
        lanes.sync();
        if let Some(q) = &mut self.leader {
            q.commit(last, total, sig);
            q.ring_db();
        }
    }

    /// Runs `f` on the leader's [`Qp`] and gives its result to every caller (those calling it together).
    ///
    /// # Errors
    /// [`InvalidArgument::TeamRules`] when the leader does not make the call; `f`'s error otherwise.
    #[inline(always)]
    fn by_leader(&mut self, f: impl FnOnce(&mut Qp<'a>) -> Result<()>) -> Result<()> {
        let lanes = self.callers()?;
        self.lead(lanes, f)
    }

    /// [`WarpQp::by_leader`] for the callers `lanes` (the leader among them).
    #[inline(always)]
    fn lead(&mut self, lanes: Lanes, f: impl FnOnce(&mut Qp<'a>) -> Result<()>) -> Result<()> {
        #[cfg(not(target_arch = "nvptx64"))]
        self.begin_turn()?;
        let r = self.leader.as_mut().map_or(Ok(()), f);
        #[cfg(not(target_arch = "nvptx64"))]
        self.end_turn();
        lanes.share_result(r)
    }

    /// Waits until every WQE posted so far has completed ([`Qp::flush`], by the leader), for every caller.
    ///
    /// # Errors
    /// For every caller: the leader's [`Qp::flush`] result (the QP's first error CQE, sticky; a timeout);
    /// [`InvalidArgument::TeamRules`] as for [`WarpQp::post`].
    pub fn flush(&mut self) -> Result<()> {
        self.by_leader(|q| q.flush())
    }

    /// Waits until the WQE behind `t` has completed ([`Qp::wait`], by the leader; every caller passes the
    /// same ticket, e.g. the one [`WarpQp::post`] returned to signaled lanes).
    ///
    /// # Errors
    /// For every caller: the leader's [`Qp::wait`] result; [`InvalidArgument::TeamRules`] as for
    /// [`WarpQp::post`].
    pub fn wait(&mut self, t: Ticket) -> Result<()> {
        self.by_leader(|q| q.wait(t))
    }

    /// Looks at the CQ once without waiting (the leader), so that an error CQE becomes visible to
    /// [`WarpQp::error`]. A call without the leader looks at nothing (the leader's next call does): lanes
    /// that wait on their own, each for its own count of a semaphore, call it as often as they like, the
    /// leader among them or not.
    ///
    /// # Errors
    /// For every caller: an unexpected CQE.
    pub fn progress(&mut self) -> Result<()> {
        // One snapshot of the callers for the test and the call, so that lanes parting in between cannot turn
        // a call that looks at nothing into a refused one.
        let callers = Lanes::active() & self.mask;
        if !self.led(callers) {
            return Ok(());
        }
        self.lead(Lanes::of(callers), |q| q.progress())
    }

    /// The first error CQE of this QP's WQEs, if one completed in error.
    pub fn error(&self) -> Option<CqeError> {
        // SAFETY: the sticky error words of the live handle (contract of `new`), which the leader may be
        // writing in a call of its own meanwhile: it stores the error before releasing its index, so an
        // index seen with acquire comes with its error.
        unsafe {
            let idx = crate::sync::load_acquire_u64(core::ptr::addr_of!((*self.h).sq.err_idx));
            let qpn = core::ptr::addr_of!((*self.h).qpn).read();
            (idx != 0).then(|| CqeError::unpack(core::ptr::addr_of!((*self.h).sq.err).read_volatile(), qpn))
        }
    }
}
