//! The device-side post-rate microbenchmark: how fast device code builds and submits 8-byte RDMA WRITE WQEs
//! (the figure to set against DOCA GPUNetIO's cost per post). Each posting thread posts `posts` unsignaled WRITEs
//! back to back per round and times them (first post to last doorbell); then the round's WQEs are flushed,
//! untimed, so that the next round starts with an empty SQ and never waits for room: the time is the cost of
//! posting, while the NIC consumes the WQEs as fast as it can. With [`PostRateArgs::no_consumer`] nothing
//! consumes them (the QPs are not connected, so the NIC never looks at their doorbells): nothing is flushed,
//! and the host gives every launch fresh counters, as DOCA GPUNetIO's post path is measured.
//!
//! Shapes ([`PostRateArgs::shape`]):
//! - [`shape::EXCLUSIVE`]: thread 0 of CTA `b` owns QP `b` (one thread per QP, many QPs), rings the doorbell
//!   every `db_batch` posts, or by BlueFlame on every post (`bf`).
//! - [`shape::SHARED`]: every thread of every CTA posts to QP 0 through a Device-scope [`SharedQp`].
//! - [`shape::WARP`]: the threads of CTA `b` (one warp on the GPU, one thread on the host) own QP `b` as a
//!   [`WarpQp`]: each post is one WQE per lane and one doorbell.

use bytemuck::{Pod, Zeroable};

use crate::pingpong::Team;
use gdaki_device::error::{Error, Result};
use gdaki_device::onesided::{local, remote};
use gdaki_device::qp::Qp;
use gdaki_device::scope::Device;
use gdaki_device::shared_qp::SharedQp;
use gdaki_device::sync;
use gdaki_device::warp_qp::WarpQp;
use gdaki_device::wqe;
use gdaki_shared::handle::{ErrorReport, MrHandle, QpHandle, RemoteMr};

/// Values of [`PostRateArgs::shape`].
pub mod shape {
    /// One thread per QP (thread 0 of each team), Exclusive.
    pub const EXCLUSIVE: u32 = 0;
    /// Every thread posts to one QP, Device scope.
    pub const SHARED: u32 = 1;
    /// The lanes of one warp per QP post together ([`gdaki_device::warp_qp::WarpQp`]).
    pub const WARP: u32 = 2;
}

/// Arguments of one launch (`#[repr(C)]`, built by the host): 120 bytes.
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
#[repr(C)]
pub struct PostRateArgs {
    /// Address of the QPs' [`QpHandle`]s, one per team (Exclusive) or one (shared).
    pub qps: u64,
    /// Address of QP 0's [`SharedQpState`](gdaki_shared::channel::SharedQpState) (shared shape).
    pub shared: u64,
    /// Where the WRITEs go (8 bytes at offset 8 × poster of it).
    pub dst: RemoteMr,
    /// Where they come from (8 bytes at offset 0).
    pub src: MrHandle,
    /// Address of `rounds × posters × 2` `u64`s: each poster's start and end clock (ns) per round.
    pub times: u64,
    /// Address of the first error's [`ErrorReport`].
    pub report: u64,
    /// Bound of every wait, ns.
    pub timeout_ns: u64,
    /// WRITEs per poster per round.
    pub posts: u32,
    /// Rounds.
    pub rounds: u32,
    /// One of [`shape`].
    pub shape: u32,
    /// Exclusive: ring the doorbell once per this many posts (1: every post).
    pub db_batch: u32,
    /// Exclusive: 1 to ring every post by BlueFlame.
    pub bf: u32,
    /// Posting threads per team (Exclusive: 1; shared: the team's size).
    pub team_posters: u32,
    /// Posting threads in the launch (teams × `team_posters`): the row length of `times`.
    pub posters: u32,
    /// 1 when nothing consumes the rings: the rounds are not flushed (nothing would ever complete).
    pub no_consumer: u32,
}

const _: () = assert!(core::mem::size_of::<PostRateArgs>() == 120);

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

/// One team's part of the benchmark: `team_index` is the CTA (or host team) number.
///
/// # Safety
/// `a` must come from the host's post-rate setup (every address valid, QP `team_index` used by this team only in
/// the Exclusive shape).
pub unsafe fn run(team: &impl Team, a: &PostRateArgs, team_index: u32) {
    let poster = team_index * a.team_posters + team.tid() as u32;
    let posts = team.tid() < a.team_posters as usize;
    for round in 0..a.rounds {
        let r = if !posts {
            Ok((0, 0))
        } else if a.shape == shape::SHARED {
            // SAFETY: QP 0's handle and shared state (caller's contract), shared by every poster.
            let qp = unsafe { SharedQp::<Device>::new(&*(a.qps as *const QpHandle), a.shared as *mut _, a.timeout_ns) };
            burst_shared(a, &qp, poster)
        } else if a.shape == shape::WARP {
            // SAFETY: this team's QP (caller's contract), used by this team's one warp only, its lanes together.
            let mut qp = unsafe { WarpQp::new((a.qps as *mut QpHandle).add(team_index as usize), a.timeout_ns) };
            burst_warp(a, &mut qp, poster)
        } else {
            // SAFETY: this team's QP (caller's contract), used by this thread only.
            let mut qp = unsafe { Qp::new(&mut *(a.qps as *mut QpHandle).add(team_index as usize), a.timeout_ns) };
            burst_exclusive(a, &mut qp, poster)
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

/// The 8-byte WRITE of poster `p`.
fn target(a: &PostRateArgs, p: u32) -> Result<(wqe::Raddr, wqe::Sge)> {
    Ok((remote(&a.dst, 8 * p as u64, 8)?, local(&a.src, 0, 8)?))
}

fn burst_exclusive(a: &PostRateArgs, qp: &mut Qp, p: u32) -> Result<(u64, u64)> {
    let (r, l) = target(a, p)?;
    let batch = a.db_batch.max(1);
    let t0 = sync::clock_ns();
    for k in 0..a.posts {
        if a.bf != 0 {
            let _ = qp.post_bf(false, wqe::rdma_write(r, l))?;
        } else {
            let _ = qp.post(false, wqe::rdma_write(r, l))?;
            if (k + 1) % batch == 0 || k + 1 == a.posts {
                qp.ring_db();
            }
        }
    }
    let t1 = sync::clock_ns();
    if a.no_consumer == 0 {
        qp.flush()?;
    }
    Ok((t0, t1))
}

fn burst_warp(a: &PostRateArgs, qp: &mut WarpQp, p: u32) -> Result<(u64, u64)> {
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

fn burst_shared(a: &PostRateArgs, qp: &SharedQp<Device>, p: u32) -> Result<(u64, u64)> {
    let (r, l) = target(a, p)?;
    let t0 = sync::clock_ns();
    for _ in 0..a.posts {
        let _ = qp.post(true, wqe::rdma_write(r, l))?;
    }
    let t1 = sync::clock_ns();
    if a.no_consumer == 0 {
        qp.flush()?;
    }
    Ok((t0, t1))
}
