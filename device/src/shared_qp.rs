//! An RC QP that many threads post to at once (Block or Device scope; DOCA GPUNetIO's CTA/GPU resource sharing
//! modes, NVSHMEM IBGDA's shared QPs): reservation by atomic add, in-order publication, batched doorbells (a
//! poster that sees a later reservation leaves the ringing to it), and a CQ polled by whichever waiter holds the
//! poll lock.
//!
//! The protocol is in [`SqState`]'s docs. CQE policy: a WQE asks for a CQE when its poster asks (a signaled
//! [`SharedQp::post`], the last WQE of a team post, the NOP of a [`SharedQp::flush`]) and whenever it covers the last
//! WQEBB of a quarter of the ring (the ring's index space cut in aligned quarters, [`cqe_period`]), so that every
//! quarter of WQEBBs posted is followed by a CQE that retires it (a CQE completes every earlier WQE of the SQ) without
//! any poster knowing what the others asked for. `flush` adds a signaled NOP when the last published WQE asked for
//! none. A team post ([`SharedQp::post_team`]: the threads of one CTA together, one reservation and one doorbell for
//! all) asks for one on its last WQE only, which comes after any quarter's end inside the batch. Doorbells are batched:
//! a poster that publishes while a later one has reserved leaves the doorbell to it, and every doorbell, rung under a
//! lock with the published producer index ([`CtrlSeg::producer_doorbell`]), covers all WQEs published before it;
//! anyone who waits on unrung WQEs rings them, so skipping a doorbell never stalls a waiter.
//!
//! The in-order publication is a chain: each poster's turn comes when the one before it has published, so the
//! time between two turns bounds the rate of the whole QP. A turn costs one compare-and-swap of `ready` (the
//! poster's release fence comes before it starts waiting, not after its turn came), as NVSHMEM IBGDA's
//! `ready_head` does; only a WQE that asks for a CQE, whose poster also records it in `sig_first`/`sig_end`,
//! takes its turn by a load and publishes with a release store.
//!
//! A poster whose wait for room or for its turn times out leaves its reserved WQEBBs unpublished: later posters
//! then time out too (the QP is stuck), and every one of them reports why.
//!
//! The counters are the handle's one [`SqState`], which Exclusive posters ([`crate::qp::Qp`],
//! [`crate::warp_qp::WarpQp`]) keep too: shared posts continue where an earlier Exclusive poster of the QP
//! stopped, and the other way round.

use core::marker::PhantomData;
use core::ptr::addr_of_mut;

use crate::cq;
use crate::db;
use crate::error::{CqeError, Error, InvalidArgument, Result, Timeout, WaitOn};
use crate::qp::Ticket;
use crate::scope::Scope;
use crate::sq;
use crate::sync;
use crate::thread::CtaGroup;
use crate::wait::{bounded, bounded_steps, Step};
use crate::warp::Lanes;
use crate::wqe::{Ctrl, Wqe};
use gdaki_shared::handle::{QpHandle, SqState};
use gdaki_shared::prm::wqe::{fm_ce_se, wqebbs, CtrlSeg, SEGS_PER_WQEBB};

/// The most WQEBBs one reservation of [`SharedQp::post`] takes: a warp's 32 lanes (one on the host) of
/// [`crate::wqe::MAX_DS`]-segment WQEs.
const MAX_BATCH: u32 = if cfg!(target_arch = "nvptx64") { 32 } else { 1 } * 4;

/// WQEBBs ahead of a poster's own in the publication chain that it waits for without pausing: two warps'
/// batches of one-WQEBB WQEs, so that the next poster in line polls at once.
const NEAR_WQEBBS: u64 = 64;
/// Pause per WQEBB ahead beyond [`NEAR_WQEBBS`], ns: under a warp's turn per WQEBB (132 warps of one-WQEBB
/// WQEs publish at about 7 ns per WQEBB on an H200), so that a waiter wakes before its turn.
const PAUSE_PER_WQEBB_NS: u64 = 4;
/// The longest such pause, ns: the back-off's longest ([`sync::backoff`]).
const MAX_TURN_PAUSE_NS: u64 = 1000;

/// How long a poster with `ahead` WQEBBs before its own still unpublished pauses before it polls again.
fn turn_pause_ns(ahead: u64) -> u32 {
    (ahead.saturating_sub(NEAR_WQEBBS) * PAUSE_PER_WQEBB_NS).min(MAX_TURN_PAUSE_NS) as u32
}

/// The CQE period of a shared QP of `cnt` WQEBBs (a power of two): a WQE that covers a WQEBB index `k` with
/// `k + 1` a multiple of it asks for a CQE. A quarter of the ring, or less on a ring too small for that:
/// a poster waiting for room up to `end` needs a CQE of a WQE at or after `end - cnt`, and the last WQE
/// before its reservation that covers a period's last WQEBB retires (its index + 1: the accounting counts the
/// CQE's WQE index, up to 3 WQEBBs short of its end) everything below its period's end minus 3, so a
/// reservation of up to `MAX_BATCH` WQEBBs gets its room when `MAX_BATCH + period + 2 <= cnt`. 1 (every WQE
/// asks) when no period fits. Team posts (at most half the ring) fit too: `cnt / 2 + cnt / 4 + 2 <= cnt`; a
/// period's end inside a team batch is covered by the batch's last WQE, which asks for a CQE and comes before
/// any later reservation.
#[inline(always)]
pub fn cqe_period(cnt: u32) -> u32 {
    let fit = cnt.saturating_sub(MAX_BATCH + 2);
    if fit == 0 {
        return 1;
    }
    // The largest power of two not over `fit`, and at most a quarter.
    (1u32 << (31 - fit.leading_zeros())).min(cnt / 4).max(1)
}

/// Whether a WQE of `n` WQEBBs at index `idx` covers the last WQEBB of a CQE period `q` (a power of two):
/// 32-bit arithmetic on the low bits of the index, which is all the period needs.
#[inline(always)]
fn ends_period(idx: u64, n: u32, q: u32) -> bool {
    (idx as u32 & (q - 1)) + n >= q
}

/// A shared poster's call under way: on the `cpu` executor counted in the handle's
/// [`SqState::host_shared`](gdaki_shared::handle::SqState::host_shared) from [`SharedQp::enter`] until it
/// drops (at the call's return), so that an Exclusive `Qp` made meanwhile is refused. Nothing on the GPU.
struct Call {
    #[cfg(not(target_arch = "nvptx64"))]
    count: *mut u64,
}

#[cfg(not(target_arch = "nvptx64"))]
impl Drop for Call {
    fn drop(&mut self) {
        // SAFETY: the handle's `host_shared` word, valid while the call runs (contract of `SharedQp::new`),
        // 8-byte aligned, only ever accessed atomically, by host threads.
        unsafe { core::sync::atomic::AtomicU64::from_ptr(self.count) }
            .fetch_sub(1, core::sync::atomic::Ordering::Release);
    }
}

/// A QP shared by the threads of scope `S`. Cheap to make: every thread that posts builds its own from the
/// same handle.
pub struct SharedQp<'a, S: Scope> {
    /// Ring, dbrec, doorbell register, CQ, read only; the send-queue state ([`QpHandle::sq`]) and the CQ's
    /// `cons_index`, which posters update. A pointer, not a reference: a `&QpHandle` would promise that no
    /// byte of it changes while it lives.
    h: *mut QpHandle,
    timeout_ns: u64,
    /// The handle is borrowed for `'a`, shared with the QP's other posters.
    _borrow: PhantomData<&'a QpHandle>,
    _scope: PhantomData<S>,
}

impl<'a, S: Scope> SharedQp<'a, S> {
    /// The QP of handle `h`; bounded waits give up after `timeout_ns` nanoseconds. Posts continue the QP's
    /// send-queue state wherever its earlier posters left it, of any kind.
    ///
    /// # Safety
    /// `h` must describe a live, connected QP whose ring, dbrec, doorbell register and CQ are valid for `'a`,
    /// and be valid for reads and writes for `'a` and 8-byte aligned; its state is used only through
    /// `SharedQp`s of scope `S` (or narrower) and only by threads of that scope while they live. No Exclusive
    /// poster may use the QP at the same time (before and after is fine): on the `cpu` executor the calls of a
    /// `SharedQp` get [`InvalidArgument::Posters`] while an Exclusive `Qp` of the same handle lives, and a `Qp`
    /// made while one of them is under way gets it for its life ([`crate::qp::Qp::new`]). There a
    /// Block-scope QP belongs, until the launch ends, to the first CTA of the launch that posts, flushes or
    /// polls; another CTA's calls get [`InvalidArgument::Sharing`].
    pub unsafe fn new(h: *mut QpHandle, timeout_ns: u64) -> Self {
        Self { h, timeout_ns, _borrow: PhantomData, _scope: PhantomData }
    }

    /// The handle's SQ size in WQEBBs.
    #[inline(always)]
    fn wqe_cnt(&self) -> u32 {
        // SAFETY: `h` is valid (contract of `new`); only the host writes the field, before the QP is used.
        unsafe { (*self.h).wqe_cnt }
    }

    /// The handle's QPN, for the errors that name their QP.
    fn qpn(&self) -> u32 {
        // SAFETY: `h` is valid (contract of `new`); only the host writes the field, before the QP is used.
        unsafe { (*self.h).qpn }
    }

    /// The address of one word of the state.
    #[inline(always)]
    fn word<T>(&self, f: impl FnOnce(*mut SqState) -> *mut T) -> *mut T {
        // SAFETY: `h` is valid (contract of `new`); `addr_of_mut!` forms no reference.
        f(unsafe { addr_of_mut!((*self.h).sq) })
    }

    /// Starts a call of this poster: whether the calling thread's CTA may use the QP, on the `cpu` executor
    /// (always on the GPU). Not while an Exclusive `Qp` of the same handle lives (its counters, kept apart and
    /// written back when it is dropped, would overwrite this poster's:
    /// [`SqState::host_posters`](gdaki_shared::handle::SqState::host_posters)), and a Block-scope QP takes
    /// posts, flushes and polls from one CTA of a launch, the first to make one ([`Scope::ONE_CTA`]; the GPU's
    /// `.cta` atomics would not order two). The call is counted in the handle
    /// ([`SqState::host_shared`](gdaki_shared::handle::SqState::host_shared)) until the returned [`Call`]
    /// drops, so that an Exclusive `Qp` made meanwhile is refused too. A Block-scope call refused for a live
    /// `Qp` has claimed the QP for its CTA all the same: the launch misuses the QP either way.
    ///
    /// # Errors
    /// [`InvalidArgument::Sharing`] for a second CTA of a Block-scope QP; [`InvalidArgument::Posters`] while an
    /// Exclusive `Qp` lives.
    #[inline(always)]
    fn enter(&self) -> Result<Call> {
        #[cfg(not(target_arch = "nvptx64"))]
        {
            use core::sync::atomic::{AtomicU64, Ordering};
            // The launch's owner first: in a launch it tells Block scope and Warp sharing of one QP apart
            // (`Sharing`), whichever posted first; the live `WarpQp`s are then not looked at below.
            if S::ONE_CTA {
                // SAFETY: the state's `host_owner` word (contract of `new`), 8-byte aligned, only ever accessed
                // atomically, by host threads.
                let owner = unsafe { AtomicU64::from_ptr(self.word(|s| addr_of_mut!((*s).host_owner))) };
                if !crate::thread::host::may_post(owner, false) {
                    return Err(Error::InvalidArgument(InvalidArgument::Sharing));
                }
            }
            // SAFETY: the state is valid (contract of `new`); `addr_of_mut!` forms no reference.
            let (count, posters, warp_qps) = unsafe {
                (
                    self.word(|s| addr_of_mut!((*s).host_shared)),
                    self.word(|s| addr_of_mut!((*s).host_posters)),
                    self.word(|s| addr_of_mut!((*s).host_warps)),
                )
            };
            // SAFETY: the state's `host_shared`, `host_posters` and `host_warps` words (contract of `new`), 8-byte
            // aligned, only ever accessed atomically, by host threads.
            let (shared, exclusive, warps) =
                unsafe { (AtomicU64::from_ptr(count), AtomicU64::from_ptr(posters), AtomicU64::from_ptr(warp_qps)) };
            // Counted before the look at the other posters, all sequentially consistent, as `Qp::new` and
            // `WarpQp::new` count themselves before they look at the calls: of two made at once, at least one
            // sees the other.
            shared.fetch_add(1, Ordering::SeqCst);
            let call = Call { count };
            // A live `WarpQp` is another poster, but to a Block-scope call in a launch, where the launch's owner
            // (above) already tells the first of the two sharings to post from the second.
            let warp_counts = !S::ONE_CTA || !crate::thread::host::in_launch();
            if exclusive.load(Ordering::SeqCst) != 0 || (warp_counts && warps.load(Ordering::SeqCst) != 0) {
                return Err(Error::InvalidArgument(InvalidArgument::Posters));
            }
            Ok(call)
        }
        #[cfg(target_arch = "nvptx64")]
        Ok(Call {})
    }

    fn resv(&self) -> *mut u64 {
        // SAFETY: the state is valid (contract of `new`); `addr_of_mut!` forms no reference.
        self.word(|s| unsafe { addr_of_mut!((*s).pi) })
    }
    fn ready(&self) -> *mut u64 {
        // SAFETY: as in `resv`.
        self.word(|s| unsafe { addr_of_mut!((*s).ready) })
    }
    fn retired(&self) -> *mut u64 {
        // SAFETY: as in `resv`.
        self.word(|s| unsafe { addr_of_mut!((*s).ci) })
    }
    fn cq_ci(&self) -> *mut u64 {
        // SAFETY: `h` is valid (contract of `new`); `addr_of_mut!` forms no reference.
        unsafe { addr_of_mut!((*self.h).cq.cons_index) }
    }
    fn err_idx(&self) -> *mut u64 {
        // SAFETY: as in `resv`.
        self.word(|s| unsafe { addr_of_mut!((*s).err_idx) })
    }
    fn sig_first(&self) -> *mut u64 {
        // SAFETY: as in `resv`.
        self.word(|s| unsafe { addr_of_mut!((*s).sig_first) })
    }
    fn sig_end(&self) -> *mut u64 {
        // SAFETY: as in `resv`.
        self.word(|s| unsafe { addr_of_mut!((*s).sig_end) })
    }
    fn rung(&self) -> *mut u64 {
        // SAFETY: as in `resv`.
        self.word(|s| unsafe { addr_of_mut!((*s).rung) })
    }
    fn db_lock(&self) -> *mut u32 {
        // SAFETY: as in `resv`.
        self.word(|s| unsafe { addr_of_mut!((*s).db_lock) })
    }
    fn err(&self) -> *mut u32 {
        // SAFETY: as in `resv`.
        self.word(|s| unsafe { addr_of_mut!((*s).err) })
    }
    fn poll_lock(&self) -> *mut u32 {
        // SAFETY: as in `resv`.
        self.word(|s| unsafe { addr_of_mut!((*s).poll_lock) })
    }

    /// Reserves `ceil(wqe.ds() / 4)` WQEBBs, stores `wqe` there with this QP's WQE index and QPN, waits for its
    /// turn, publishes it and rings the doorbell (or leaves that to a later poster). The WQE asks for a CQE when
    /// `signaled`, and when it covers the last WQEBB of a CQE period ([`cqe_period`]: a quarter of the ring);
    /// [`SharedQp::flush`] waits for unsignaled WQEs too. Takes every builder of [`crate::wqe`].
    ///
    /// On the GPU the lanes of a warp that call `post` on this QP together are aggregated: the lowest reserves WQEBBs for
    /// all of them with one atomic add, waits for room and for the warp's turn, and publishes all their WQEs at
    /// once (every lane stores its own), so the in-order publication costs one hand-off per warp rather than one
    /// per thread (docs/architecture.md, "Posting: who owns the QP"). Lanes whose WQEs take different numbers
    /// of WQEBBs (inline WRITEs of different lengths) are aggregated apart, one batch per size, as the `cpu`
    /// executor, where each thread is a warp of one lane, posts each on its own; lanes whose batch would take
    /// more than half the ring (a full warp on a ring of under 64 WQEBBs) post in parts of at most half the
    /// ring, one after another.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] (`Handle`) for an SQ that is not a power of two of 16 ..= 2^15 WQEBBs
    /// (nothing is reserved); on the `cpu` executor (`Sharing`) for a Block-scope QP that another CTA of the
    /// launch posts to ([`crate::scope::Block`]), or (`Posters`) while an Exclusive `Qp` of the same handle
    /// lives;
    /// [`Error::Timeout`] on [`WaitOn::SqSpace`] or [`WaitOn::Publish`]; [`Error::UnexpectedCqe`] met while
    /// retiring WQEs. Posting to a QP in the error state succeeds (the NIC flushes the WQE). On the GPU every
    /// lane of an aggregated post gets the leader's error (its part's leader's, for a warp that posts in parts,
    /// whose later parts then wait on the reservation the failed part left unpublished, a timeout each).
    #[inline(always)]
    pub fn post<const N: usize>(&self, signaled: bool, wqe: Wqe<N>) -> Result<Ticket> {
        if !sq::valid_ring(self.wqe_cnt()) {
            return Err(Error::InvalidArgument(InvalidArgument::Handle));
        }
        let _call = self.enter()?;
        let n = wqebbs(wqe.ds() as u32) as u64;
        // Lanes posting to other QPs at the same time are aggregated among themselves (on the host each
        // thread is a warp of one lane), and so are lanes whose WQEs take another number of WQEBBs: a batch is
        // reserved as count x the leader's size, and each lane stores at `base + rank x` its own. The handle is
        // 8-byte aligned, so its low bits carry `n - 1` (at most 3, `MAX_DS` segments being four WQEBBs);
        // WQEs of at most four segments always take one WQEBB, and their key is the handle alone.
        const _: () = assert!(wqebbs(crate::wqe::MAX_DS as u32) <= 4 && align_of::<QpHandle>() >= 4);
        let key = if N > SEGS_PER_WQEBB { self.h as u64 | (n - 1) } else { self.h as u64 };
        let w = Lanes::active_with(key);
        // A batch of more than half the ring could never find room (its own WQEBBs would have to be retired
        // first): 32 lanes on a ring of under 64 WQEBBs, or of 4-WQEBB WQEs under 256. Such lanes post in parts
        // of a power of two of lanes (by rank), at most half the ring, one part after another: before its post
        // a lane of part `p` passes `p` barriers of the warp, after it the rest, so barrier `k` lets part `k`
        // post once part `k - 1` has (`bar.warp.sync`, which lanes may reach at different instructions). Only
        // on the GPU (a host thread is a warp of one lane, and one WQE takes at most 4 of at least 16 WQEBBs).
        let half = u64::from(self.wqe_cnt() / 2);
        if n * w.count() as u64 <= half {
            return self.post_lanes(w, n, signaled, &wqe);
        }
        let shift = 63 - (half / n).max(1).leading_zeros();
        let (mine, parts) = (w.rank() >> shift, ((w.count() - 1) >> shift) + 1);
        for _ in 0..mine {
            w.sync();
        }
        let part = w.part(mine << shift, 1 << shift);
        let r = self.post_lanes(part, n, signaled, &wqe);
        for _ in mine + 1..parts {
            w.sync();
        }
        r
    }

    /// The lanes `w` (all posting `n`-WQEBB WQEs to this QP) post one batch: the leader reserves for all, waits
    /// for room and the batch's turn, each lane stores its `wqe`, and the leader publishes them.
    #[inline(always)]
    fn post_lanes<const N: usize>(&self, w: Lanes, n: u64, signaled: bool, wqe: &Wqe<N>) -> Result<Ticket> {
        let lead = w.lane == w.leader();
        let total = n * w.count() as u64;
        // SAFETY: the state's words (contract of `new`), used atomically by every poster.
        let base = w.shfl(if lead { unsafe { S::fetch_add(self.resv(), total) } } else { 0 }, w.leader());
        let (idx, end) = (base + w.rank() as u64 * n, base + total);
        w.share_result(if lead { self.wait_room(end, total) } else { Ok(()) })?;
        let cqe = signaled || ends_period(idx, n as u32, cqe_period(self.wqe_cnt()));
        self.store(idx, wqe, if cqe { fm_ce_se::CQ_UPDATE } else { 0 });
        let last_cqe = w.shfl(cqe as u64, w.last()) != 0;
        // Every lane's WQE is stored before the leader publishes them (bar.warp.sync orders the members'
        // accesses; the leader's release then covers them).
        w.sync();
        w.share_result(if lead { self.publish(base, end, end - n, last_cqe) } else { Ok(()) })?;
        Ok(Ticket(idx))
    }

    /// Posts one WQE for each member of the team `g` that passes one, as one batch: the members (the threads of
    /// one CTA, e.g. every [`Thread`](crate::Thread) of a block) call this together, each with its own
    /// `wqe` (`Ok(None)`: nothing to post; `Err(e)`: this member's WQE was refused while it was built, e.g.
    /// its range). The members with a WQE must be ranks `0 .. k`, and each WQE must take one WQEBB (`ds <= 4`:
    /// RDMA WRITE / READ with one SGE, atomics, NOP, inline WRITEs of up to 28 bytes). Returns, to the
    /// members with a WQE, the ticket of the batch's last WQE; `None` to the others and for an empty batch.
    ///
    /// DOCA GPUNetIO's CTA-scope post: the leader (rank 0) reserves the `k` WQEBBs with one atomic add and waits
    /// for room; a barrier hands its base (or its error) to the members ([`CtaGroup::barrier_broadcast`]: the
    /// CTA's shared memory on the GPU), and member `r` stores its WQE at `base + r`; only the last WQE asks for a
    /// CQE (its CQE retires the whole batch, and [`SharedQp::flush`] waits for it; a CQE period's end inside the
    /// batch is covered by it, since it comes later and before any later reservation, which is all
    /// [`cqe_period`] needs); after another barrier the leader publishes the batch in order with the single
    /// posters and rings one doorbell for it (or leaves it to a later poster, as [`SharedQp::post`] does). Five
    /// barriers of `g` in all (the broadcast is two on the GPU), four for a call refused before the reservation;
    /// for Device scope several CTAs may post teams (and single posts) to the QP at once, each team a poster of
    /// the chain like a single one: nothing of a team's but its WQEs is in the QP's memory, so teams never wait
    /// for each other but for their turns.
    ///
    /// # Errors
    /// Every member gets an error, and nothing is posted, when any member cannot post: a member whose `wqe`
    /// is `Err(e)` gets `e`, the others [`InvalidArgument::Batch`] when the batch needs more than half the
    /// ring; else a member whose WQE takes more than one WQEBB, or who passes a WQE from a rank not below the
    /// number of members with one (the members with a WQE must be the lowest ranks; told only when every
    /// member made the call and built its WQE), gets [`InvalidArgument::TeamRules`] and the
    /// others [`InvalidArgument::Team`], as they do when fewer than `g.members()` members make the call (a
    /// thread of the block that returned before it: a CTA barrier stops waiting for exited threads). When the
    /// members' `SharedQp`s are not all of one handle (found once the leader has reserved: its batch is then
    /// published as NOPs, and the other handles' rings are not touched; or, in a call refused before that,
    /// when every member made it and built its WQE), the members of another handle than the leader's get
    /// [`InvalidArgument::TeamRules`], the others [`InvalidArgument::Team`] (or `Batch`, judged on the
    /// leader's ring);
    /// [`InvalidArgument::Handle`] and, on the `cpu` executor, [`InvalidArgument::Sharing`] for a Block-scope
    /// QP of another CTA or [`InvalidArgument::Posters`] while an Exclusive `Qp` of the handle lives, as for
    /// [`SharedQp::post`]. Once the
    /// WQEBBs are reserved: [`Error::Timeout`] on [`WaitOn::SqSpace`] or [`WaitOn::Publish`], or
    /// [`Error::UnexpectedCqe`], for every member (the leader's own; the others the same but for their
    /// `waited_ns`, which is the QP's timeout), and the batch stays unpublished, as a single post that
    /// times out does.
    pub fn post_team<const N: usize>(&self, g: &impl CtaGroup, wqe: Result<Option<Wqe<N>>>) -> Result<Option<Ticket>> {
        self.post_team_keyed(g, 0, wqe)
    }

    /// [`SharedQp::post_team`] by members that must also pass one `key` (a port channel's memory pair: two
    /// channels of one QP are two keys): a member whose key differs from the leader's gets
    /// [`InvalidArgument::TeamRules`] and the others [`InvalidArgument::Team`], as for members of different
    /// handles.
    ///
    /// # Errors
    /// As [`SharedQp::post_team`].
    pub fn post_team_keyed<const N: usize>(
        &self,
        g: &impl CtaGroup,
        key: u64,
        wqe: Result<Option<Wqe<N>>>,
    ) -> Result<Option<Ticket>> {
        let cnt = self.wqe_cnt();
        // What every member can check for itself, with the same outcome for all (one handle).
        let own =
            if !sq::valid_ring(cnt) { Err(Error::InvalidArgument(InvalidArgument::Handle)) } else { self.enter() };
        let (w, mine) = match wqe {
            Ok(Some(w)) => (Some(w), Ok(wqebbs(w.ds() as u32) == 1)),
            Ok(None) => (None, Ok(true)),
            Err(e) => (None, Err(e)),
        };
        let rank = g.rank();
        // Barrier 1: how many post.
        let count = g.barrier_count(w.is_some());
        let bad = own.is_err() || mine != Ok(true) || (w.is_some() && rank >= count) || count > cnt / 2;
        // Barrier 2: whether every member is here and can post. Counting the members that can, rather than
        // OR-ing those that cannot, also refuses a call that some members never make: a thread that left the
        // kernel (the barrier no longer waits for it) would leave its pieces of a range unposted, and the
        // others' WQEs would be published without them.
        if g.barrier_count(!bad) != g.members() {
            // Refused (the cold path): every member here takes two more barriers before any returns. The first
            // tells whether every member made the call and built its WQE: only then does a WQE of a rank at or
            // past the count of WQEs mean that a lower rank passed none (else the count is short by the failed
            // or absent members, and the rank proves nothing), and only then are member 0's handle and key,
            // which the second hands to all, this call's: a member of another channel is told so, rather than
            // judged by its own ring's size.
            let complete = g.barrier_count(own.is_ok() && mine.is_ok()) == g.members();
            let first = g.barrier_broadcast([self.h as u64, key, 0, 0]);
            let _call = own?;
            mine?;
            if complete && (first[0] != self.h as u64 || first[1] != key) {
                return Err(Error::InvalidArgument(InvalidArgument::TeamRules));
            }
            // Every member of one channel counted the same batch: all of them say why, as a warp's batch and
            // `Qp::post_batch` do.
            if count > cnt / 2 {
                return Err(Error::InvalidArgument(InvalidArgument::Batch));
            }
            // A member whose own WQE breaks the rules says so; the others were refused for it (or for a
            // member that failed or never made the call).
            if mine == Ok(false) || (complete && w.is_some() && rank >= count) {
                return Err(Error::InvalidArgument(InvalidArgument::TeamRules));
            }
            return Err(Error::InvalidArgument(InvalidArgument::Team));
        }
        if count == 0 {
            return Ok(None);
        }
        let (lead, n) = (rank == 0, count as u64);
        // The leader's reservation, handed to the members: word 0 is 0, word 1 the base, word 2 the leader's
        // handle and word 3 its key, or the words of the error it met waiting for room (words 0, 1, 3 and 4 of its `ErrorReport`:
        // kind and CQE fields, `expected`, `detail`, `addr`; no error met there has a `seen`, and every kind is
        // nonzero).
        let mut words = [0u64; 4];
        if lead {
            // SAFETY: the state's word (contract of `new`).
            let base = unsafe { S::fetch_add(self.resv(), n) };
            words = match self.wait_room(base + n, n) {
                Ok(()) => [0, base, self.h as u64, key],
                Err(e) => {
                    let r: [u64; 5] = bytemuck::cast(e.to_report());
                    [r[0], r[1], r[3], r[4]]
                }
            };
        }
        // Barrier 3: the leader's base or error, to every member.
        let words = g.barrier_broadcast(words);
        let (base, err) = if words[0] as u32 == 0 {
            (words[1], None)
        } else {
            let r = bytemuck::cast([words[0], words[1], 0, words[2], words[3]]);
            (0, Some(Error::from_report(&r).unwrap_or(Error::InvalidArgument(InvalidArgument::Team))))
        };
        // A member of another handle or key than the leader's (a block split between two channels in one call)
        // must not store into its own ring at indices reserved in the leader's.
        let stranger = err.is_none() && (words[2] != self.h as u64 || words[3] != key);
        let last = base + n - 1;
        if let Some(w) = &w {
            if err.is_none() && !stranger {
                let idx = base + rank as u64;
                let flags = if idx == last { fm_ce_se::CQ_UPDATE } else { 0 };
                self.store(idx, w, flags);
            }
        }
        // Barrier 4: every WQE is stored (before the leader's release in `publish`: the barrier orders the
        // members' stores before it), and whether any member is on another handle.
        let strangers = g.barrier_or(stranger);
        if lead && strangers {
            // The call is refused for all, but the leader's reservation stands (later posters may have
            // reserved after it): it becomes NOPs, published as the batch would have been, so the QP goes on.
            for idx in base..base + n {
                self.store(idx, &crate::wqe::nop(), if idx == last { fm_ce_se::CQ_UPDATE } else { 0 });
            }
        }
        let mut r = Ok(());
        if lead {
            r = match err {
                Some(e) => Err(e),
                None => self.publish(base, base + n, last, true),
            };
        }
        // Barrier 5: the leader's publication.
        if g.barrier_or(r.is_err()) {
            return Err(match (r, err) {
                (Err(e), _) | (_, Some(e)) => e,
                _ => self.publish_timeout(base),
            });
        }
        if strangers {
            let why = if stranger { InvalidArgument::TeamRules } else { InvalidArgument::Team };
            return Err(Error::InvalidArgument(why));
        }
        Ok(w.map(|_| Ticket(last)))
    }

    /// The timeout a member reports for its leader's wait on earlier posters' publication (of the batch at
    /// `first`).
    fn publish_timeout(&self, first: u64) -> Error {
        Error::Timeout(Timeout {
            on: WaitOn::Publish { qpn: self.qpn(), wqe_index: first },
            waited_ns: self.timeout_ns,
        })
    }

    /// Waits until WQEBBs up to `end` (a reservation of `n`) are free in the ring, retiring and ringing meanwhile.
    fn wait_room(&self, end: u64, n: u64) -> Result<()> {
        let cnt = self.wqe_cnt() as u64;
        bounded_steps(
            self.timeout_ns,
            || {
                // SAFETY: the state's words (contract of `new`).
                let retired = unsafe { S::load_acquire(self.retired()) };
                if end - retired <= cnt {
                    return Ok(Step::Done(()));
                }
                // The WQEs this poster waits on may be published but left unrung (their posters saw this one).
                self.ring_pending();
                self.poll()?;
                // Room appeared, if not yet enough: back off from the start again.
                // SAFETY: as above.
                let moved = unsafe { S::load_acquire(self.retired()) } != retired;
                Ok(if moved { Step::Progress } else { Step::Idle })
            },
            || WaitOn::SqSpace { qpn: self.qpn(), wqebbs: n as u32 },
        )
    }

    /// Stores `w` at WQEBB index `idx` of the ring with completion flags `flags`.
    #[inline(always)]
    fn store<const N: usize>(&self, idx: u64, w: &Wqe<N>, flags: u8) {
        // SAFETY: fields of a valid handle that only the host writes (contract of `new`).
        let (qpn, buf) = unsafe { ((*self.h).qpn, (*self.h).sq_buf) };
        let segs = w.encode(Ctrl { idx: idx as u16, qpn, fm_ce_se: flags });
        // SAFETY: a valid ring (contract of `new`); WQEBBs from `idx` are this poster's (reserved, and retired by
        // the NIC: the room check).
        unsafe { sq::write_segs(buf, self.wqe_cnt(), idx, &segs, w.ds()) };
    }

    /// Waits for the turn of the WQEs `[first, end)` (stored), publishes them (`last` is the last one's index,
    /// `cqe` whether it asked for a CQE), and rings unless a later poster exists (whose doorbell covers them).
    fn publish(&self, first: u64, end: u64, last: u64, cqe: bool) -> Result<()> {
        let on = || WaitOn::Publish { qpn: self.qpn(), wqe_index: first };
        if cqe {
            bounded(
                self.timeout_ns,
                // SAFETY: the state's words (contract of `new`).
                || Ok((unsafe { S::load_acquire(self.ready()) } == first).then_some(())),
                on,
            )?;
            // SAFETY: the state's words (contract of `new`). This poster holds its turn: no other poster stores
            // them until `ready` moves on. The release of `ready` orders the WQEs' stores before it, for the
            // thread that rings (acquire), and `sig_first`/`sig_end`, for flushers and for the QP's next
            // Exclusive poster.
            unsafe {
                sync::store_volatile(self.sig_first(), last + 1);
                sync::store_volatile(self.sig_end(), end);
                S::store_release(self.ready(), end);
            }
        } else {
            // The release comes first, while earlier posters still publish: the turn then costs only the CAS
            // that takes it, which is also the publication (`ready` moves from `first` only by this poster).
            S::fence_release();
            let last_seen = core::cell::Cell::new(first);
            bounded_steps(
                self.timeout_ns,
                || {
                    // SAFETY: the state's word (contract of `new`), used atomically by every poster.
                    let seen = unsafe { S::cas(self.ready(), first, end) };
                    if seen == first {
                        return Ok(Step::Done(()));
                    }
                    // Every failed CAS queues at `ready`'s L2 slice before the one that takes the next turn:
                    // a poster far back in line pauses for as long as those ahead of it need, so that only
                    // the next few poll.
                    let pause = turn_pause_ns(first.wrapping_sub(seen));
                    if pause > 0 {
                        sync::pause_ns(pause);
                    }
                    Ok(if last_seen.replace(seen) != seen { Step::Progress } else { Step::Idle })
                },
                on,
            )?;
        }
        // A later poster exists: its doorbell (or that of whoever waits on these WQEs) will cover these.
        // SAFETY: as above.
        // The last poster rings: straight for the lock, since it knows there is something to ring (its own
        // WQEs), and done once it rang them itself, without reading back what it stored: with Device-scope
        // atomics each of those reads is a round trip to L2.
        if unsafe { S::load_acquire(self.resv()) } == end {
            bounded(
                self.timeout_ns,
                || {
                    if self.try_ring().is_some() {
                        return Ok(Some(()));
                    }
                    // Another thread rings: done once its doorbell covers these WQEs.
                    // SAFETY: as above.
                    Ok((unsafe { S::load_acquire(self.rung()) } >= end).then_some(()))
                },
                || WaitOn::Publish { qpn: self.qpn(), wqe_index: first },
            )?;
        }
        Ok(())
    }

    /// Rings the doorbell for every published WQE if some are unrung and no other thread is ringing: one
    /// doorbell with the published producer index covers all of them (the NIC executes the SQ in order). The
    /// dbrec carries that index, so it never goes backwards.
    ///
    /// The doorbell names no WQE ([`CtrlSeg::producer_doorbell`], NVSHMEM IBGDA's form): the ringer knows only
    /// `ready`, and a doorbell carrying the last WQE's ctrl bits would need them published beside `ready`, a
    /// second release on every poster's turn.
    pub fn ring_pending(&self) {
        // SAFETY: the state's words (contract of `new`).
        if unsafe { S::load_acquire(self.rung()) >= S::load_acquire(self.ready()) } {
            return;
        }
        let _ = self.try_ring();
    }

    /// Takes `db_lock` if it is free and rings every WQE published by then that is still unrung; `None` when
    /// another thread holds the lock. When it returns `Some`, every WQE published before the call is rung.
    fn try_ring(&self) -> Option<()> {
        // SAFETY: the state's words and the QP's dbrec and doorbell register (contract of `new`; the handle's
        // fields read here only the host writes); `rung`, the dbrec and the doorbell are written only under
        // `db_lock`, so `rung` is read with a plain load under it (the lock's acquire ordered the last holder's
        // store before this load, and invalidated L1: no stale line; a volatile load would be a system-scope
        // one, as if the NIC wrote the word). `ready`'s acquire orders the WQEs below it (released by their posters) before the
        // dbrec and doorbell stores, whose own releases pass them on to the NIC.
        unsafe {
            if !S::try_lock(self.db_lock()) {
                return None;
            }
            let pi = S::load_acquire(self.ready());
            if pi > sync::load_locked(self.rung()) {
                let h = self.h;
                db::update_dbrec((*h).dbrec, pi, (*h).placement);
                db::ring_db((*h).bf_reg, CtrlSeg::producer_doorbell(pi as u16, (*h).qpn), (*h).placement);
                S::store_release(self.rung(), pi);
            }
            S::unlock(self.db_lock());
        }
        Some(())
    }

    /// Polls the CQ if no other thread does (try-lock), retiring WQEs and recording the first error CQE.
    /// Returns whether it polled.
    ///
    /// # Errors
    /// [`Error::UnexpectedCqe`] for a CQE of another QP or of no published WQE (left in the CQ);
    /// on the `cpu` executor [`InvalidArgument::Sharing`] for a Block-scope QP of another CTA of the launch,
    /// or [`InvalidArgument::Posters`] while an Exclusive `Qp` of the same handle lives.
    pub fn progress(&self) -> Result<bool> {
        let _call = self.enter()?;
        self.poll()
    }

    /// [`SharedQp::progress`].
    fn poll(&self) -> Result<bool> {
        // SAFETY: the lock word of the state (contract of `new`).
        if !unsafe { S::try_lock(self.poll_lock()) } {
            return Ok(false);
        }
        let r = self.poll_locked();
        // SAFETY: held by this thread.
        unsafe { S::unlock(self.poll_lock()) };
        r.map(|()| true)
    }

    fn poll_locked(&self) -> Result<()> {
        // SAFETY: fields of a valid handle that only the host writes (contract of `new`); the consumer index is
        // reloaded below.
        let (mut cq, qpn) = unsafe { ((*self.h).cq, (*self.h).qpn) };
        let cnt = self.wqe_cnt();
        // SAFETY: `cq_ci`, `retired`'s writer and the error words are this lock holder's; the lock's acquire
        // ordered the previous holder's stores before these loads.
        let (mut retired, mut reserved) = unsafe {
            cq.cons_index = sync::load_volatile(self.cq_ci());
            (sync::load_volatile(self.retired()), S::load_acquire(self.resv()))
        };
        let mut result = Ok(());
        loop {
            // The bound of CQEs to expect is `resv`, not `ready` (a ringer may announce a WQE whose poster has
            // not moved `ready` yet). A CQE may be of a WQE reserved after the load of `resv` above: its
            // reservation happened before the doorbell that announced it, so a load made after reading the CQE
            // (`take` asks again when the first bound falls short) sees it.
            let mut reloaded = false;
            // SAFETY: a valid CQ (contract of `new`) polled only under the lock; the state's word.
            let t = unsafe {
                cq::take(&mut cq, qpn, cnt, retired, || {
                    if reloaded {
                        reserved = S::load_acquire(self.resv());
                    }
                    reloaded = true;
                    reserved
                })
            };
            let t = match t {
                None => break,
                Some(Ok(t)) => t,
                Some(Err(u)) => {
                    result = Err(Error::UnexpectedCqe(u));
                    break;
                }
            };
            // A responder completion (an inbound WRITE with immediate) retires nothing: channels do not use
            // them.
            if let Some(w) = t.wqe {
                retired = w + 1;
                if let Err(e) = t.completion {
                    // SAFETY: the error words are the lock holder's to write; published by the release below.
                    unsafe {
                        if sync::load_volatile(self.err_idx()) == 0 {
                            sync::store_volatile(self.err(), e.pack());
                            S::store_release(self.err_idx(), w + 1);
                        }
                    }
                }
            }
        }
        // SAFETY: as above; `retired` is published with release for the posters' acquire loads, and the NIC is
        // told the consumer index once for the batch. Nothing is stored when nothing was consumed (most polls
        // of a waiter find no CQE).
        unsafe {
            if cq.cons_index != sync::load_volatile(self.cq_ci()) {
                cq::publish_ci(&cq);
                sync::store_volatile(self.cq_ci(), cq.cons_index);
                S::store_release(self.retired(), retired);
            }
        }
        result
    }

    /// The first error CQE of this QP's WQEs, if one completed in error (the QP is then in the error state).
    pub fn error(&self) -> Option<CqeError> {
        // SAFETY: the state's words (contract of `new`); `err` was stored before `err_idx`'s release.
        unsafe {
            let i = S::load_acquire(self.err_idx());
            (i != 0)
                .then(|| CqeError::unpack(sync::load_volatile(self.err()), core::ptr::addr_of!((*self.h).qpn).read()))
        }
    }

    /// Waits until every WQE published so far has completed (MSCCL++ `flush`): until the CQE of the last
    /// published WQE that asked for one, after a signaled NOP when the last published WQE asked for none (a
    /// CQE completes every earlier WQE). Flushers running at once may each post a NOP; posters meanwhile need
    /// not stop.
    ///
    /// # Errors
    /// [`Error::Cqe`] with the QP's first error CQE, once any WQE has completed in error (sticky);
    /// [`Error::Timeout`] on [`WaitOn::Cqe`]; [`Error::UnexpectedCqe`]; the errors of [`SharedQp::post`] for
    /// the NOP; on the `cpu` executor [`InvalidArgument::Sharing`] for a Block-scope QP of another CTA of the
    /// launch or [`InvalidArgument::Posters`] while an Exclusive `Qp` of the same handle lives (whether or not a
    /// NOP is due).
    pub fn flush(&self) -> Result<()> {
        let _call = self.enter()?;
        // SAFETY: the state's words (contract of `new`); `sig_first`/`sig_end` were stored before `ready`'s
        // release. They may be a later WQE's than the one ending at the `ready` seen: waiting for that one covers
        // more, and a NOP for a `sig_end` past `ready` costs a NOP.
        let (ready, sig_end, mut target) = unsafe {
            let ready = S::load_acquire(self.ready());
            (ready, sync::load_volatile(self.sig_end()), sync::load_volatile(self.sig_first()))
        };
        // SAFETY: as above.
        if sig_end != ready && unsafe { S::load_acquire(self.retired()) } < ready {
            if let Some(e) = self.error() {
                return Err(Error::Cqe(e));
            }
            // Reserved after every WQE published before this flush, so its CQE completes them all.
            target = self.post(true, crate::wqe::nop())?.0 + 1;
        }
        bounded(
            self.timeout_ns,
            || {
                if let Some(e) = self.error() {
                    return Err(Error::Cqe(e));
                }
                // SAFETY: as above.
                if unsafe { S::load_acquire(self.retired()) } >= target {
                    // The poller that moved `ci` stored an error CQE it met before that release: looked at
                    // again after the acquire, so that a flush racing that poll cannot miss it.
                    return match self.error() {
                        Some(e) => Err(Error::Cqe(e)),
                        None => Ok(Some(())),
                    };
                }
                self.ring_pending();
                self.poll().map(|_| None)
            },
            || WaitOn::Cqe { qpn: self.qpn(), wqe_index: target.saturating_sub(1) },
        )
    }
}
