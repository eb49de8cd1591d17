//! The device-side post-rate microbenchmark: how fast device code builds and submits 8-byte RDMA WRITE WQEs
//! (the figure to set against DOCA GPUNetIO's cost per post). Each round starts with a grid-wide barrier
//! (every team of the launch arrives, bounded by the timeout), so that the posters start their bursts
//! together (on the GPU within about a microsecond, the waits' longest back-off pause); then each posting
//! thread posts `posts` unsignaled WRITEs back to back and times them (first post to last doorbell); then the
//! round's WQEs are flushed, untimed, so that the next round starts with an empty SQ and never waits for room:
//! the time is the cost of posting, while the NIC consumes the WQEs as fast as it can. With
//! [`PostRateArgs::no_consumer`] nothing consumes them (the QPs are not connected, so the NIC never looks at
//! their doorbells): nothing is flushed, and the host gives every launch fresh counters, as DOCA GPUNetIO's
//! post path is measured.
//!
//! The barrier is what makes a round's span (the earliest poster's start to the latest poster's end) a rate of
//! the posters running together: without it, with a consumer, the NIC retires the previous round's QPs one
//! after the other, each poster leaves its flush at a different time, and the span measures that skew, not
//! the posting.
//!
//! Shapes ([`PostRateArgs::shape`]):
//! - [`shape::EXCLUSIVE`]: thread 0 of CTA `b` owns QP `b` (one thread per QP, many QPs), rings the doorbell
//!   every `db_batch` posts.
//! - [`shape::BLUEFLAME`]: as the Exclusive shape, each post rung by BlueFlame.
//! - [`shape::ORDERING`]: as the Exclusive shape, with nothing posted: each post's ordering alone, the floor
//!   (`no_consumer` only).
//! - [`shape::SHARED`]: every thread of every CTA posts to QP 0 through a Device-scope [`SharedQp`].
//! - [`shape::WARP`]: the threads of CTA `b` (one warp on the GPU, one thread on the host) own QP `b` as a
//!   [`WarpQp`]: each post is one WQE per lane and one doorbell.
//! - [`shape::BATCH`]: thread 0 of CTA `b` owns QP `b`, as in the Exclusive shape, and posts by
//!   [`Qp::post_batch`]es of `db_batch` WQEs, each followed by its doorbell.
//! - [`shape::WARP_ORDERING`]: as the Warp shape, each lane storing its WQE and the lowest ringing, with
//!   nothing reserved, checked or retired: the floor under the Warp shape (`no_consumer` only).
//! - [`shape::WARP_PART`]: as the Warp shape, every lane of CTA `b`'s warp a member, but only its first
//!   `team_posters` lanes with a WQE ([`WarpQp::post_some`]): batches that not every lane fills. Before its
//!   posts, the lanes but the leader (lane 0) make one call alone, which must be refused for each of them
//!   (else [`WITHOUT_LEADER`]) and post nothing (the NIC's count of the WQEs it executed says so).

use bytemuck::{Pod, Zeroable};

use crate::pingpong::Team;
use gdaki_device::db;
use gdaki_device::error::{AppError, Error, InvalidArgument, Result, WaitOn};
use gdaki_device::onesided::{local, remote};
use gdaki_device::qp::Qp;
use gdaki_device::scope::{Device, Scope};
use gdaki_device::shared_qp::SharedQp;
use gdaki_device::sq;
use gdaki_device::sync;
use gdaki_device::wait;
use gdaki_device::warp::Lanes;
use gdaki_device::warp_qp::WarpQp;
use gdaki_device::wqe;
use gdaki_shared::handle::{ErrorReport, MrHandle, QpHandle, RemoteMr};
use gdaki_shared::prm::wqe::{CtrlSeg, Seg};

/// Values of [`PostRateArgs::shape`].
pub mod shape {
    /// One thread per QP (thread 0 of each team), Exclusive.
    pub const EXCLUSIVE: u32 = 0;
    /// Every thread posts to one QP, Device scope.
    pub const SHARED: u32 = 1;
    /// The lanes of one warp per QP post together ([`gdaki_device::warp_qp::WarpQp`]).
    pub const WARP: u32 = 2;
    /// One thread per QP, `db_batch` WQEs per [`gdaki_device::qp::Qp::post_batch`] and doorbell.
    pub const BATCH: u32 = 3;
    /// One thread per QP (thread 0 of each team), each post rung by BlueFlame ([`gdaki_device::qp::Qp::post_bf`]).
    pub const BLUEFLAME: u32 = 4;
    /// One thread per QP: the floor under the two shapes above, each post's ordering alone (the dbrec's
    /// release store, the release fence and the doorbell, or the eight BlueFlame stores with `bf`, as
    /// [`gdaki_device::db::publish_and_ring`] does them), with no WQE built or stored; `no_consumer` only.
    pub const ORDERING: u32 = 5;
    /// The lanes of one warp per QP: the floor under the Warp shape, each post's WQE stores and ordering alone
    /// (every lane encodes its WQE with its index and stores it to its slot of the ring, the lanes sync, and the
    /// lowest runs one doorbell's ordering for the batch, as [`gdaki_device::db::publish_and_ring`] does it),
    /// with nothing reserved, checked or retired; `no_consumer` only.
    pub const WARP_ORDERING: u32 = 6;
    /// The lanes of one warp per QP post together, the first `team_posters` with a WQE, the others with none
    /// ([`gdaki_device::warp_qp::WarpQp::post_some`]).
    pub const WARP_PART: u32 = 7;
}

/// Arguments of one launch (`#[repr(C)]`, built by the host): 128 bytes.
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
#[repr(C)]
pub struct PostRateArgs {
    /// Address of the QPs' [`QpHandle`]s, one per team (Exclusive) or one (shared).
    pub qps: u64,
    /// Where the WRITEs go (8 bytes at offset 8 × poster of it).
    pub dst: RemoteMr,
    /// Where they come from (8 bytes at offset 0).
    pub src: MrHandle,
    /// Address of `rounds × posters × 2` `u64`s: each poster's start and end clock (ns) per round.
    pub times: u64,
    /// Address of the first error's [`ErrorReport`].
    pub report: u64,
    /// Address of the grid-wide barrier's counter, a `u64` in GPU memory on the GPU that the host zeroes: each
    /// team adds 1 per round and waits for `teams × (round + 1)`. 0 for no barrier: a correctness run whose
    /// grid need not be co-resident (the host's flood).
    pub barrier: u64,
    /// Bound of every wait, ns.
    pub timeout_ns: u64,
    /// WRITEs per poster per round.
    pub posts: u32,
    /// Rounds.
    pub rounds: u32,
    /// One of [`shape`]: the shape of the kernel launched (each shape is a kernel of its own, see [`run`]),
    /// which checks it.
    pub shape: u32,
    /// Exclusive: ring the doorbell once per this many posts (1: every post). Batch: WQEs per call.
    pub db_batch: u32,
    /// Ordering: 1 for the floor of a BlueFlame post, 0 for a doorbell's.
    pub bf: u32,
    /// Posting threads per team (Exclusive: 1; shared: the team's size).
    pub team_posters: u32,
    /// Posting threads in the launch (teams × `team_posters`): the row length of `times`.
    pub posters: u32,
    /// 1 when nothing consumes the rings: the rounds are not flushed (nothing would ever complete).
    pub no_consumer: u32,
    /// Teams (CTAs) in the launch, all of which arrive at the barrier; on the GPU they must be co-resident.
    pub teams: u32,
    /// Shared shape with a consumer: 1 when odd posters post a 32-byte inline WRITE (two WQEBBs) and even
    /// posters the 8-byte WRITE (one), so that the lanes of a warp post WQEs of two sizes in one call
    /// ([`burst_shared_mixed`]); 0 for the 8-byte WRITE alone.
    pub mixed: u32,
}

const _: () = assert!(core::mem::size_of::<PostRateArgs>() == 128);

/// Writes `e` to the report unless an earlier error got there first.
fn report(a: &PostRateArgs, e: Error) {
    let r = a.report as *mut ErrorReport;
    // SAFETY: the report (host contract); one error wins the CAS on its kind word.
    unsafe {
        if <Device as gdaki_device::scope::Scope>::try_lock(r as *mut u32) {
            r.write_volatile(e.to_report());
        }
    }
}

/// Grid-wide barrier `round` (0-based), for thread 0 of a team: adds this team's arrival to the counter and
/// waits until every team of the launch has arrived at this round's barrier. Returns `false` when the round
/// must not start: the wait ran out (reported), or another team reported an error (it has left, so the rest
/// stop instead of waiting out the bound).
///
/// # Safety
/// `a.barrier` must be the launch's counter (host contract), accessed only through this function meanwhile.
unsafe fn grid_barrier(a: &PostRateArgs, round: u32) -> bool {
    let count = a.barrier as *mut u64;
    let expected = a.teams as u64 * (round as u64 + 1);
    // The barrier orders the posters' start times, not data: no team reads what another wrote before it, so a
    // relaxed arrival is enough. GPU scope: the teams are CTAs anywhere on the device.
    // SAFETY: the counter (caller's contract), 8-byte aligned, only accessed atomically during the launch.
    unsafe { Device::fetch_add(count, 1) };
    let seen = core::cell::Cell::new(0);
    let polls = core::cell::Cell::new(0u32);
    let arrived = wait::bounded(
        a.timeout_ns,
        || {
            // SAFETY: as above.
            seen.set(unsafe { Device::load_acquire(count) });
            if seen.get() >= expected {
                return Ok(Some(true));
            }
            // The report is in pinned host memory, where each look is a PCIe read: one poll in 64 looks. (With
            // the counter there too and every poll looking, 132 CTAs flooded PCIe with reads and left the
            // barrier up to 130 µs apart on the H200.)
            polls.set(polls.get().wrapping_add(1));
            if !polls.get().is_multiple_of(64) {
                return Ok(None);
            }
            // SAFETY: the report (host contract); its kind word is nonzero once an error is being written.
            let kind = unsafe { sync::load_volatile(core::ptr::addr_of!((*(a.report as *const ErrorReport)).kind)) };
            Ok((kind != 0).then_some(false))
        },
        || WaitOn::Semaphore { addr: a.barrier, expected, seen: seen.get() },
    );
    arrived.unwrap_or_else(|e| {
        report(a, e);
        false
    })
}

/// One team's part of the benchmark in shape `SHAPE` (one of [`shape`]): `team_index` is the CTA (or host
/// team) number. Each shape is a kernel of its own, so that ptxas allocates registers for its loop alone (one
/// kernel of three shapes needed more than 255 and spilled the posters' state to local memory), and so that
/// no shape's loop carries a test of which shape it is. Arguments made for another shape are reported as
/// [`InvalidArgument::Handle`].
///
/// # Safety
/// `a` must come from the host's post-rate setup (every address valid, QP `team_index` used by this team only in
/// the Exclusive shape, `a.teams` teams running at the same time).
pub unsafe fn run<const SHAPE: u32>(team: &impl Team, a: &PostRateArgs, team_index: u32) {
    if a.shape != SHAPE {
        if team.tid() == 0 {
            report(a, Error::InvalidArgument(InvalidArgument::Handle));
        }
        return;
    }
    if one_thread(SHAPE) && a.rounds == 1 && a.team_posters == 1 && team.size() == 1 {
        // A launch of one round, as every launch but `run_in_one_launch`'s: the loop a user writes.
        // SAFETY: the caller's contract.
        return unsafe { one_round::<SHAPE>(a, team_index) };
    }
    let poster = team_index * a.team_posters + team.tid() as u32;
    let posts = team.tid() < a.team_posters as usize;
    for round in 0..a.rounds {
        // Thread 0 stands for its team at the grid-wide barrier; the team's sync holds the others until it is
        // through.
        // SAFETY: the barrier counter (caller's contract), used by thread 0 of each team only.
        let through = team.tid() != 0 || a.barrier == 0 || unsafe { grid_barrier(a, round) };
        if team.sync_or(!through) {
            return;
        }
        let r = if SHAPE == shape::WARP_PART {
            // Every lane of the warp makes the calls, those that post and those that do not.
            // SAFETY: this team's QP (caller's contract), used by this team's one warp only, its lanes together.
            unsafe { burst_warp_part(a, (a.qps as *mut QpHandle).add(team_index as usize), poster, posts) }
        } else if !posts {
            Ok((0, 0))
        } else if SHAPE == shape::SHARED {
            // SAFETY: QP 0's handle (caller's contract), shared by every poster.
            unsafe {
                if a.mixed != 0 {
                    burst_shared_mixed(a, poster)
                } else {
                    burst_shared(a, poster)
                }
            }
        } else if SHAPE == shape::WARP {
            // SAFETY: this team's QP (caller's contract), used by this team's one warp only, its lanes together.
            unsafe { burst_warp(a, (a.qps as *mut QpHandle).add(team_index as usize), poster) }
        } else if SHAPE == shape::WARP_ORDERING {
            // SAFETY: this team's QP (caller's contract), used by this team's one warp only, its lanes together.
            unsafe { burst_warp_ordering(a, &*(a.qps as *mut QpHandle).add(team_index as usize), poster) }
        } else {
            // SAFETY: this team's QP (caller's contract), used by this thread only.
            unsafe { burst_one_thread::<SHAPE>(a, &mut *(a.qps as *mut QpHandle).add(team_index as usize), poster) }
        };
        let failed = match r {
            Ok((t0, t1)) => {
                if posts {
                    let slot = (round as usize * a.posters as usize + poster as usize) * 2;
                    // SAFETY: `times` holds rounds × posters × 2 words (caller's contract).
                    unsafe {
                        (a.times as *mut u64).add(slot).write_volatile(t0);
                        (a.times as *mut u64).add(slot + 1).write_volatile(t1);
                    }
                }
                false
            }
            Err(e) => {
                report(a, e);
                true
            }
        };
        if team.sync_or(failed) {
            return;
        }
    }
}

/// Whether shape `s` (one of [`shape`]) is one thread per team: Exclusive, Batch, BlueFlame, Ordering.
const fn one_thread(s: u32) -> bool {
    matches!(s, shape::EXCLUSIVE | shape::BATCH | shape::BLUEFLAME | shape::ORDERING)
}

/// [`run`]'s one round for a team of one thread, when the launch has one round: the barrier, the burst, its
/// times or its error, with no team barrier (a team of one thread needs none) and no loop of rounds around the
/// posts. In the loop of rounds (a launch of many rounds, [`run`]'s own path) ptxas carries the posting loop's
/// values across rounds with register moves: the doorbell-each loop's iteration takes 67 SASS instructions
/// there, 57 here, the BlueFlame loop's 105 and 97 (`cargo xtask sass`).
///
/// # Safety
/// As [`run`], with QP `team_index` used by this one thread.
#[inline(always)]
unsafe fn one_round<const SHAPE: u32>(a: &PostRateArgs, team_index: u32) {
    // SAFETY: the barrier counter (caller's contract), used by this team's one thread only.
    if a.barrier != 0 && !unsafe { grid_barrier(a, 0) } {
        return;
    }
    // SAFETY: this team's QP (caller's contract), used by this one thread only.
    match unsafe { burst_one_thread::<SHAPE>(a, &mut *(a.qps as *mut QpHandle).add(team_index as usize), team_index) } {
        Ok((t0, t1)) => {
            let slot = team_index as usize * 2;
            // SAFETY: `times` holds rounds × posters × 2 words (caller's contract).
            unsafe {
                (a.times as *mut u64).add(slot).write_volatile(t0);
                (a.times as *mut u64).add(slot + 1).write_volatile(t1);
            }
        }
        Err(e) => report(a, e),
    }
}

/// The burst of poster `p` in a one-thread shape (`SHAPE`, one that [`one_thread`] names): Batch, BlueFlame,
/// Ordering, or else Exclusive.
///
/// # Safety
/// `h` is this thread's QP (caller's contract).
#[inline(always)]
unsafe fn burst_one_thread<const SHAPE: u32>(a: &PostRateArgs, h: &mut QpHandle, p: u32) -> Result<(u64, u64)> {
    // SAFETY: the caller's contract.
    unsafe {
        if SHAPE == shape::BATCH {
            burst_batch(a, h, p)
        } else if SHAPE == shape::BLUEFLAME {
            burst_blueflame(a, h, p)
        } else if SHAPE == shape::ORDERING {
            burst_ordering(a, h, p)
        } else {
            burst_exclusive(a, h, p)
        }
    }
}

/// The 8-byte WRITE of poster `p`.
fn target(a: &PostRateArgs, p: u32) -> Result<(wqe::Raddr, wqe::Sge)> {
    Ok((remote(&a.dst, 8 * p as u64, 8)?, local(&a.src, 0, 8)?))
}

// Each burst is a function of its own that makes its poster itself, so that the poster, never passed by
// reference, stays in registers across the posts; and each shape is a kernel of its own, so that the register
// allocator treats one shape's loop alone (three shapes inlined into one kernel needed more than 255 registers
// and spilled the poster's state to local memory). This is how a user's kernel should be shaped too. The
// one-thread bursts of a `Qp` (doorbell, BlueFlame) are inlined into their kernels: out of line, the burst
// addressed memory through a descriptor in ordinary registers, moved to uniform ones before each access
// (`R2UR`), and kept convergence barriers around each post (`cargo xtask sass`, measured when a doorbell every
// 32 posts was one loop counting down to each doorbell: its iteration with the doorbell 87 instructions out of
// line, 79 inlined; by BlueFlame 119 and 108). The rounds loop around them has 21-34 local-memory accesses,
// once a round. The other bursts stay out of line.

/// The Exclusive shape: `posts` WRITEs on the QP of `h`, a doorbell every `db_batch`.
///
/// # Safety
/// `h` is this thread's QP (caller's contract).
#[inline(always)]
unsafe fn burst_exclusive(a: &PostRateArgs, h: &mut QpHandle, p: u32) -> Result<(u64, u64)> {
    // SAFETY: the caller's contract.
    unsafe { burst_qp(a, h, p, |qp, w| posts_db(qp, w, a.posts, a.db_batch)) }
}

/// The BlueFlame shape: `posts` WRITEs on the QP of `h`, each by BlueFlame.
///
/// # Safety
/// `h` is this thread's QP (caller's contract).
#[inline(always)]
unsafe fn burst_blueflame(a: &PostRateArgs, h: &mut QpHandle, p: u32) -> Result<(u64, u64)> {
    // SAFETY: the caller's contract.
    unsafe { burst_qp(a, h, p, |qp, w| posts_bf(qp, w, a.posts)) }
}

/// One thread's burst on the QP of `h`: `posts` runs the posts of poster `p`'s WRITE on a [`Qp`] of it; timed,
/// then flushed (with a consumer).
///
/// # Safety
/// `h` is this thread's QP (caller's contract).
#[inline(always)]
unsafe fn burst_qp(
    a: &PostRateArgs,
    h: &mut QpHandle,
    p: u32,
    posts: impl FnOnce(&mut Qp, wqe::Wqe<3>) -> Result<()>,
) -> Result<(u64, u64)> {
    let (r, l) = target(a, p)?;
    let w = wqe::rdma_write(r, l);
    // SAFETY: the caller's contract.
    let mut qp = unsafe { Qp::new(h, a.timeout_ns) };
    let t0 = sync::clock_ns();
    let posted = posts(&mut qp, w);
    let t1 = sync::clock_ns();
    posted?;
    if a.no_consumer == 0 {
        qp.flush()?;
    }
    Ok((t0, t1))
}

/// The Ordering shape: `posts` times the ordering of a post on the QP of `h` alone ([`posts_ordering`]).
///
/// # Errors
/// [`InvalidArgument::Handle`] with a consumer: its NIC would read doorbells of WQEs never stored.
///
/// # Safety
/// `h` is this thread's QP (caller's contract).
#[inline(never)]
unsafe fn burst_ordering(a: &PostRateArgs, h: &QpHandle, p: u32) -> Result<(u64, u64)> {
    if a.no_consumer == 0 {
        return Err(Error::InvalidArgument(InvalidArgument::Handle));
    }
    let (r, l) = target(a, p)?;
    let t0 = sync::clock_ns();
    // SAFETY: the caller's contract; nothing consumes the QP (checked above), so its dbrec and doorbell may
    // carry producer indices of WQEs never stored.
    unsafe { posts_ordering(h, wqe::rdma_write(r, l), a.posts, a.bf != 0) };
    Ok((t0, sync::clock_ns()))
}

/// `posts` posts of `w`, a doorbell every `batch` of them and after the last.
#[inline(always)]
fn posts_db(qp: &mut Qp, w: wqe::Wqe<3>, posts: u32, batch: u32) -> Result<()> {
    if batch <= 1 {
        // A doorbell each post: the loop a user writes for it, with no countdown to test.
        for _ in 0..posts {
            let _ = qp.post(false, w)?;
            qp.ring_db();
        }
        return Ok(());
    }
    // Batches of `batch` posts and a doorbell after each (the last batch shorter): the loops a user writes for
    // it, the inner one with nothing to test but its own count (`cargo xtask sass`: 35 instructions a post,
    // where one loop counting down to each doorbell took 61).
    let mut left = posts;
    while left > 0 {
        let n = left.min(batch);
        for _ in 0..n {
            let _ = qp.post(false, w)?;
        }
        qp.ring_db();
        left -= n;
    }
    Ok(())
}

/// The Batch shape: `posts` WRITEs on the QP of `h` in [`Qp::post_batch`]es of `db_batch` (the last one
/// shorter), a doorbell after each.
///
/// # Safety
/// `h` is this thread's QP (caller's contract).
#[inline(never)]
unsafe fn burst_batch(a: &PostRateArgs, h: &mut QpHandle, p: u32) -> Result<(u64, u64)> {
    let (r, l) = target(a, p)?;
    let w = wqe::rdma_write(r, l);
    // SAFETY: the caller's contract.
    let mut qp = unsafe { Qp::new(h, a.timeout_ns) };
    let batch = a.db_batch.max(1);
    let t0 = sync::clock_ns();
    let mut left = a.posts;
    let posted = loop {
        if left == 0 {
            break Ok(());
        }
        let n = left.min(batch);
        if let Err(e) = qp.post_batch(n, false, |_| w) {
            break Err(e);
        }
        qp.ring_db();
        left -= n;
    };
    let t1 = sync::clock_ns();
    posted?;
    if a.no_consumer == 0 {
        qp.flush()?;
    }
    Ok((t0, t1))
}

/// `posts` posts of `w`, each by BlueFlame.
#[inline(always)]
fn posts_bf(qp: &mut Qp, w: wqe::Wqe<3>, posts: u32) -> Result<()> {
    for _ in 0..posts {
        let _ = qp.post_bf(false, w)?;
    }
    Ok(())
}

/// `posts` times the ordering of a post alone, by doorbell or by BlueFlame (`w`'s first WQEBB): the dbrec's
/// release store, the release fence and the MMIO stores, each with the next producer index.
///
/// # Safety
/// `h` is this thread's QP, which nothing consumes (its dbrec and doorbell name WQEs never stored).
#[inline(always)]
unsafe fn posts_ordering(h: &QpHandle, w: wqe::Wqe<3>, posts: u32, bf: bool) {
    let (dbrec, reg, placement, qpn) = (h.dbrec, h.bf_reg, h.placement, h.qpn);
    let segs = w.encode(wqe::Ctrl { idx: 0, qpn, fm_ce_se: 0 });
    let wqebb = [segs[0], segs[1], segs[2], Seg::default()];
    for k in 0..posts as u64 {
        // The producer index after this post. (A loop over `1..=posts` has an end test of its own.)
        let k = k + 1;
        // SAFETY: the handle's dbrec and register (caller's contract).
        unsafe {
            if bf {
                db::publish_and_ring_bf(dbrec, k, reg, &wqebb, placement);
            } else {
                db::publish_and_ring(dbrec, k, reg, CtrlSeg::producer_doorbell(k as u16, qpn), placement);
            }
        }
    }
}

/// The Warp shape: `posts` times one WRITE per lane on the QP of `h`, one doorbell each.
///
/// # Safety
/// `h` is this team's QP, used by its one warp only, its lanes together (caller's contract).
#[inline(never)]
unsafe fn burst_warp(a: &PostRateArgs, h: *mut QpHandle, p: u32) -> Result<(u64, u64)> {
    // SAFETY: the caller's contract.
    let mut qp = unsafe { WarpQp::new(h, a.timeout_ns) };
    let (r, l) = target(a, p)?;
    let t0 = sync::clock_ns();
    for _ in 0..a.posts {
        let _ = qp.post(false, wqe::rdma_write(r, l))?;
    }
    let t1 = sync::clock_ns();
    // The leader's counters go back to the handle before the flush's own `WarpQp` reads them.
    drop(qp);
    if a.no_consumer == 0 {
        // SAFETY: the caller's contract.
        unsafe { flush_warp(h, a.timeout_ns) }?;
    }
    Ok((t0, t1))
}

/// The [`AppError::code`] of a WarpPart launch whose lanes without the leader were not refused a call they
/// made alone; its value is 1 when the call returned Ok.
pub const WITHOUT_LEADER: u32 = 1;

/// The WarpPart shape: `posts` times one WRITE from each lane that `posts` (the first `team_posters` of the
/// warp), the other lanes making the call with none ([`WarpQp::post_some`]), one doorbell each; first, the
/// lanes but lane 0, the leader, make a call without it.
///
/// # Safety
/// As [`burst_warp`].
#[inline(never)]
unsafe fn burst_warp_part(a: &PostRateArgs, h: *mut QpHandle, p: u32, posts: bool) -> Result<(u64, u64)> {
    // SAFETY: the caller's contract.
    let mut qp = unsafe { WarpQp::new(h, a.timeout_ns) };
    let w = if posts {
        let (r, l) = target(a, p)?;
        Some(wqe::rdma_write(r, l))
    } else {
        None
    };
    let warp = Lanes::of(u32::MAX);
    // Only the leader keeps the QP's counters: a call it does not make is refused, whoever makes it.
    let unrefused = (warp.lane != 0)
        .then(|| qp.post_some(false, w))
        .filter(|r| !matches!(r, Err(Error::InvalidArgument(InvalidArgument::TeamRules))));
    // The whole warp again before the posts (or the error): nothing else makes lanes that parted at a branch
    // run together.
    warp.sync();
    if let Some(r) = unrefused {
        return Err(Error::App(AppError { code: WITHOUT_LEADER, value: r.is_ok() as u64 }));
    }
    let t0 = sync::clock_ns();
    for _ in 0..a.posts {
        let _ = qp.post_some(false, w)?;
    }
    let t1 = sync::clock_ns();
    drop(qp);
    if a.no_consumer == 0 {
        // SAFETY: the caller's contract.
        unsafe { flush_warp(h, a.timeout_ns) }?;
    }
    Ok((t0, t1))
}

/// Flushes the QP of `h` through a `WarpQp` of its own (the lanes together), out of line, once the posting
/// `WarpQp` is gone: with the flush on the posting `WarpQp`, ptxas kept more of the posting loop's state in
/// local memory (`burst_warp`: 184 bytes of spill stores and 248 of spill loads, 104 and 136 this way), and
/// one warp on the H200 posted at 27.4-28.4 ns per WQE against 27.2 this way.
///
/// # Safety
/// As [`burst_warp`].
#[inline(never)]
unsafe fn flush_warp(h: *mut QpHandle, timeout_ns: u64) -> Result<()> {
    // SAFETY: the caller's contract.
    unsafe { WarpQp::new(h, timeout_ns) }.flush()
}

/// The WarpOrdering shape: `posts` times the floor of a warp post on the QP of `h` ([`shape::WARP_ORDERING`]):
/// what every post of the Warp shape must do whatever the library, the WQE stores and one doorbell's ordering.
///
/// # Errors
/// [`InvalidArgument::Handle`] with a consumer: its NIC would execute WQEs that were never reserved.
///
/// # Safety
/// `h` is this team's QP, used by its one warp only, its lanes together (caller's contract), which nothing
/// consumes.
#[inline(never)]
unsafe fn burst_warp_ordering(a: &PostRateArgs, h: &QpHandle, p: u32) -> Result<(u64, u64)> {
    if a.no_consumer == 0 {
        return Err(Error::InvalidArgument(InvalidArgument::Handle));
    }
    let (r, l) = target(a, p)?;
    let w = wqe::rdma_write(r, l);
    let lanes = Lanes::active_with(h as *const QpHandle as u64);
    let (n, rank, leads) = (lanes.count() as u64, lanes.rank() as u64, lanes.lane == lanes.leader());
    let (sq_buf, wqe_cnt, dbrec, reg, placement, qpn) = (h.sq_buf, h.wqe_cnt, h.dbrec, h.bf_reg, h.placement, h.qpn);
    let t0 = sync::clock_ns();
    for k in 0..a.posts as u64 {
        let idx = k * n + rank;
        let segs = w.encode(wqe::Ctrl { idx: idx as u16, qpn, fm_ce_se: 0 });
        // SAFETY: the QP's ring (caller's contract); nothing consumes it, so any slot may be overwritten.
        unsafe { sq::write_segs(sq_buf, wqe_cnt, idx, &segs, w.ds()) };
        // Every lane's WQE is stored before the leader's release, as in `WarpQp::post`.
        lanes.sync();
        if leads {
            let pi = (k + 1) * n;
            // SAFETY: the handle's dbrec and doorbell register (caller's contract).
            unsafe { db::publish_and_ring(dbrec, pi, reg, CtrlSeg::producer_doorbell(pi as u16, qpn), placement) };
        }
    }
    Ok((t0, sync::clock_ns()))
}

/// The shared shape: `posts` WRITEs on QP 0 through a Device-scope [`SharedQp`].
///
/// # Safety
/// QP 0's handle, shared by every poster (caller's contract).
#[inline(never)]
unsafe fn burst_shared(a: &PostRateArgs, p: u32) -> Result<(u64, u64)> {
    // SAFETY: the caller's contract.
    let qp = unsafe { SharedQp::<Device>::new(a.qps as *mut QpHandle, a.timeout_ns) };
    let (r, l) = target(a, p)?;
    let t0 = sync::clock_ns();
    for _ in 0..a.posts {
        let _ = qp.post(false, wqe::rdma_write(r, l))?;
    }
    let t1 = sync::clock_ns();
    if a.no_consumer == 0 {
        qp.flush()?;
    }
    Ok((t0, t1))
}

/// The shared shape with WQEs of two sizes ([`PostRateArgs::mixed`]): odd posters a 32-byte inline WRITE to
/// the four 8-byte slots of their group of four posters (two WQEBBs), even posters [`burst_shared`]'s 8-byte
/// WRITE (one). The lanes of a warp post both at once: a batch reserved for one size and stored in two would
/// overwrite WQEs of other batches, which the NIC then refuses.
///
/// # Safety
/// As [`burst_shared`].
#[inline(never)]
unsafe fn burst_shared_mixed(a: &PostRateArgs, p: u32) -> Result<(u64, u64)> {
    // SAFETY: the caller's contract.
    let qp = unsafe { SharedQp::<Device>::new(a.qps as *mut QpHandle, a.timeout_ns) };
    let (r, l) = target(a, p)?;
    let group = remote(&a.dst, 8 * (p & !3) as u64, 32)?;
    let payload = [p as u8; 32];
    let t0 = sync::clock_ns();
    for _ in 0..a.posts {
        let w = if p % 2 == 1 { wqe::rdma_write_inline(group, &payload)? } else { wqe::rdma_write(r, l).widen() };
        let _ = qp.post(false, w)?;
    }
    let t1 = sync::clock_ns();
    qp.flush()?;
    Ok((t0, t1))
}
