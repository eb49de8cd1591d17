//! The post-rate microbenchmark on the `cpu` executor: every shape runs (each round started at a grid-wide
//! barrier), reports a time per round, per post and per launch, and every WQE it claims to have posted reached
//! the emulated NIC without an error. The GPU run is `--ignored`.

use std::time::Duration;

use gdaki::exec::{Executor, ExecutorKind};
use gdaki_testkit::postrate::{PostRate, Shape, WQE_CNT};

fn every_shape(kind: ExecutorKind, qps: u32, ctas: u32, threads: u32) {
    let (exec, _) = Executor::open(Some(kind)).expect("executor");
    // A warp has 32 lanes on the GPU; a host thread is a warp of one.
    let lanes = if kind == ExecutorKind::Gpu { 32 } else { 1 };
    let mut b = PostRate::new(exec, qps, (ctas * threads).max(qps * lanes)).expect("set up");
    let rounds = 3;
    let mut shapes = vec![
        Shape::Exclusive { qps, db_batch: 1, bf: false },
        Shape::Exclusive { qps, db_batch: 32, bf: false },
        Shape::Exclusive { qps, db_batch: 1, bf: true },
        Shape::Batch { qps, batch: 32 },
        Shape::Batch { qps, batch: 7 },
        Shape::Shared { ctas, threads },
        Shape::Warp { qps, lanes },
    ];
    if kind == ExecutorKind::Gpu {
        // Part of a warp (CTAs of 5 threads): `WarpQp` takes its path for a member mask that is not the
        // whole warp.
        shapes.push(Shape::Warp { qps, lanes: 5 });
        // A warp of 32 lanes, 5 of which have a WQE (`WarpQp::post_some`'s batches that not every lane fills).
        shapes.push(Shape::WarpPart { qps, lanes: 5 });
    }
    for shape in shapes {
        // A round's WQEs share the one SQ in the shared shape.
        let posts = match shape {
            Shape::Exclusive { .. }
            | Shape::Batch { .. }
            | Shape::Warp { .. }
            | Shape::Ordering { .. }
            | Shape::WarpOrdering { .. }
            | Shape::WarpPart { .. } => 200,
            Shape::Shared { ctas, threads } => (8000 / (ctas * threads)).min(200),
        };
        let before = b.nic().stats();
        let r = b.run(shape, posts, rounds, Duration::from_secs(10)).unwrap_or_else(|e| panic!("{e}"));
        let after = b.nic().stats();
        let posters = match shape {
            Shape::Exclusive { qps, .. } | Shape::Batch { qps, .. } | Shape::Ordering { qps, .. } => qps,
            Shape::Shared { ctas, threads } => ctas * threads,
            Shape::Warp { qps, lanes } | Shape::WarpOrdering { qps, lanes } | Shape::WarpPart { qps, lanes } => {
                qps * lanes
            }
        } as u64;
        assert_eq!(r.wqes, posters * posts as u64 * rounds as u64, "{shape:?}");
        assert_eq!((r.round_ns.len(), r.post_ns.len()), (rounds as usize, (posters * rounds as u64) as usize));
        assert!(r.round_ns.iter().all(|&t| t > 0) && r.median_ns_per_post() > 0.0, "{shape:?}: {r:?}");
        // A launch per round, each at least its round's span.
        assert_eq!(r.launch_ns.len(), rounds as usize, "{shape:?}: {r:?}");
        assert!(r.launch_ns.iter().zip(&r.round_ns).all(|(l, t)| l >= t), "{shape:?}: {r:?}");
        // The warm-up round too, each flush's NOP at most once per poster and round.
        let posted = posters * posts as u64 * (rounds as u64 + 1);
        let executed = after.wqes - before.wqes;
        assert!(executed >= posted && executed <= posted + posters * (rounds as u64 + 1), "{shape:?}: {executed}");
        assert_eq!((after.error_cqes, after.dbrec_mismatches), (before.error_cqes, before.dbrec_mismatches));
        if let Shape::Shared { .. } = shape {
            // Unsignaled WRITEs: a CQE per quarter ring, and one per flush that posts a NOP.
            let cqes = after.cqes - before.cqes;
            let most = posted / (WQE_CNT as u64 / 4) + 1 + posters * (rounds as u64 + 1);
            assert!(cqes <= most, "{shape:?}: {cqes} CQEs for {executed} WQEs");
        }
        if let Shape::Exclusive { bf: true, .. } = shape {
            // Taken from the register, or read from the ring when a poster overtook the NIC.
            let seen = |s: &gdaki::nic::emu::Stats| s.blueflame + s.blueflame_fallbacks;
            assert!(seen(&after) > seen(&before), "{shape:?}: no BlueFlame write seen: {after:?}");
            assert_eq!(after.blueflame_mismatches, before.blueflame_mismatches, "{shape:?}: {after:?}");
        }
    }
    // Every round in one launch: the warm-up round, then the timed ones, each after the flush of the one before;
    // the launch takes at least the timed rounds' spans, and every WQE reaches the NIC without an error.
    let shape = Shape::Exclusive { qps, db_batch: 32, bf: false };
    let before = b.nic().stats();
    let r = b.run_in_one_launch(shape, 200, rounds, Duration::from_secs(10)).unwrap_or_else(|e| panic!("{e}"));
    let after = b.nic().stats();
    assert_eq!((r.wqes, r.round_ns.len(), r.launch_ns.len()), (qps as u64 * 200 * rounds as u64, rounds as usize, 1));
    assert!(r.median_launch_ns() >= r.round_ns.iter().sum::<u64>(), "{r:?}");
    let posted = qps as u64 * 200 * (rounds as u64 + 1);
    let executed = after.wqes - before.wqes;
    assert!(executed >= posted && executed <= posted + qps as u64 * (rounds as u64 + 1), "{executed}");
    assert_eq!((after.error_cqes, after.dbrec_mismatches), (before.error_cqes, before.dbrec_mismatches));
    // A round that would not fit the SQ is refused before anything runs, and so is a warp the executor has not.
    assert!(b.run(Shape::Exclusive { qps, db_batch: 1, bf: false }, 20_000, 1, Duration::from_secs(1)).is_err());
    assert!(b.run(Shape::Warp { qps, lanes: 33 }, 1, 1, Duration::from_secs(1)).is_err());
    // So is a batch that `Qp::post_batch` refuses (none, or more than half the ring).
    for batch in [0, WQE_CNT / 2 + 1] {
        assert!(b.run(Shape::Batch { qps, batch }, 1, 1, Duration::from_secs(1)).is_err(), "{batch}");
    }
    // The floors name WQEs never stored or never reserved: refused where the NIC consumes.
    assert!(b.run(Shape::Ordering { qps, bf: false }, 1, 1, Duration::from_secs(1)).is_err());
    assert!(b.run(Shape::WarpOrdering { qps, lanes: 1 }, 1, 1, Duration::from_secs(1)).is_err());
    // A warp of 32 lanes is the GPU's.
    if kind == ExecutorKind::Cpu {
        assert!(b.run(Shape::WarpPart { qps, lanes: 5 }, 1, 1, Duration::from_secs(1)).is_err());
    }
}

#[test]
fn cpu_post_rate_every_shape() {
    every_shape(ExecutorKind::Cpu, 2, 1, 4);
}

#[test]
#[ignore = "needs a GPU: run on the H200 with --ignored"]
fn gpu_post_rate_every_shape() {
    let _gpu = gdaki_testkit::gpu_turn();
    every_shape(ExecutorKind::Gpu, 8, 4, 32);
}

/// `ctas × threads` threads post `posts` WRITEs each to one Device-scope QP of 32,768 WQEBBs in one round,
/// oversubscribing it: posters wait for room, and on the GPU (a grid of 2^17 + 2^12 threads) reservations run
/// more than 65,536 WQEBBs ahead of the retired ones, beyond what the 16-bit `wqe_counter` spans. No poller
/// may misread a CQE and nothing may be lost: the NIC executes every WRITE (plus the flushes' NOPs, at most
/// one per thread), with no error. With `mixed` the odd posters' WQEs take two WQEBBs (a 32-byte inline WRITE)
/// and the even ones' one, so that on the GPU the lanes of every warp post two sizes at once.
fn flood(kind: ExecutorKind, ctas: u32, threads: u32, posts: u32, mixed: bool) {
    flood_on(kind, ctas, threads, posts, mixed, WQE_CNT);
}

/// [`flood`] on SQs of `wqe_cnt` WQEBBs.
fn flood_on(kind: ExecutorKind, ctas: u32, threads: u32, posts: u32, mixed: bool, wqe_cnt: u32) {
    let (exec, _) = Executor::open(Some(kind)).expect("executor");
    let posters = ctas * threads;
    let mut b = PostRate::with_ring(exec, 1, posters, wqe_cnt).expect("set up");
    let before = b.nic().stats();
    let r = b.flood(ctas, threads, posts, mixed, Duration::from_secs(60)).unwrap_or_else(|e| panic!("{e}"));
    let after = b.nic().stats();
    let want = posters as u64 * posts as u64;
    assert_eq!(r.wqes, want);
    let executed = after.wqes - before.wqes;
    assert!((want..=want + posters as u64).contains(&executed), "{executed} WQEs for {want} posts");
    assert_eq!((after.error_cqes, after.dbrec_mismatches, after.bad_doorbells), (0, 0, 0), "{after:?}");
    // A CQE per quarter ring of WQEBBs, and one per flush that posts a NOP (on the large ring: on the GPU a
    // ring too small for a CQE period beside a warp's batch asks for a CQE of every WQE).
    let wqebbs = if mixed { want + want / 2 } else { want };
    let cqes = after.cqes - before.cqes;
    if wqe_cnt == WQE_CNT {
        assert!(cqes <= wqebbs / (WQE_CNT as u64 / 4) + 1 + posters as u64, "{cqes} CQEs for {executed} WQEs");
    }
    println!("{posters} posters x {posts}: {executed} WQEs in {:.1} ms", r.round_ns[0] as f64 / 1e6);
}

#[test]
fn cpu_shared_qp_oversubscribed_loses_nothing() {
    // 64 threads × 600 posts = 38,400 WQEs through a 32,768-WQEBB SQ in one round.
    flood(ExecutorKind::Cpu, 4, 16, 600, false);
}

#[test]
#[ignore = "needs a GPU: run on the H200 with --ignored"]
fn gpu_shared_qp_takes_2_17_posting_threads() {
    let _gpu = gdaki_testkit::gpu_turn();
    flood(ExecutorKind::Gpu, 528, 256, 1, false);
}

/// The mixed flood's harness on host threads, each a warp of one lane: what the GPU test below guards (lanes of
/// one warp posting two sizes in one call) cannot happen here.
#[test]
fn cpu_shared_qp_takes_wqes_of_two_sizes() {
    flood(ExecutorKind::Cpu, 4, 16, 300, true);
}

/// Lanes of one warp posting WQEs of one and two WQEBBs in the same `SharedQp::post` call: aggregated as one
/// batch reserved for the leader's size, the two-WQEBB lanes stored outside it and overwrote other batches.
#[test]
#[ignore = "needs a GPU: run on the H200 with --ignored"]
fn gpu_shared_qp_takes_wqes_of_two_sizes_from_one_warp() {
    let _gpu = gdaki_testkit::gpu_turn();
    flood(ExecutorKind::Gpu, 132, 256, 8, true);
}

/// The flood's harness on a ring of 16 WQEBBs (`PostRate::with_ring`), on host threads: each posts one WQE
/// at a time, so only the GPU test below reaches a warp's post in parts.
#[test]
fn cpu_flood_on_a_ring_of_16_wqebbs() {
    flood_on(ExecutorKind::Cpu, 2, 8, 50, true, 16);
}

/// A ring of 16 WQEBBs under full warps: on the GPU the lanes of a warp posting together (32 WQEs, or 32
/// two-WQEBB inline WRITEs in the mixed flood) are more than half the ring, and post in parts; before, the
/// warp's one batch waited for room that its own WQEBBs had to make, until the timeout.
#[test]
#[ignore = "needs a GPU: run on the H200 with --ignored"]
fn gpu_shared_qp_takes_full_warps_on_a_small_ring() {
    let _gpu = gdaki_testkit::gpu_turn();
    flood_on(ExecutorKind::Gpu, 4, 64, 50, false, 16);
    flood_on(ExecutorKind::Gpu, 4, 64, 50, true, 16);
}

/// Without a consumer every shape posts into rings nobody reads: one launch per round on fresh counters, no
/// flush, and the NIC sees no doorbell at all.
fn every_shape_without_consumer(kind: ExecutorKind, qps: u32, ctas: u32, threads: u32) {
    let (exec, _) = Executor::open(Some(kind)).expect("executor");
    let lanes = if kind == ExecutorKind::Gpu { 32 } else { 1 };
    let mut b = PostRate::without_consumer(exec, qps, (ctas * threads).max(qps * lanes)).expect("set up");
    let rounds = 11;
    let before = b.nic().stats();
    for shape in [
        Shape::Exclusive { qps, db_batch: 1, bf: false },
        Shape::Exclusive { qps, db_batch: 32, bf: true },
        Shape::Shared { ctas, threads },
        Shape::Warp { qps, lanes },
        Shape::Ordering { qps, bf: false },
        Shape::Ordering { qps, bf: true },
        Shape::WarpOrdering { qps, lanes },
    ] {
        let r = b.run(shape, 100, rounds, Duration::from_secs(10)).unwrap_or_else(|e| panic!("{shape:?}: {e}"));
        assert_eq!(r.round_ns.len(), rounds as usize, "{shape:?}: one round per launch");
        assert!(r.round_ns.iter().all(|&t| t > 0) && r.median_ns_per_post() > 0.0, "{shape:?}: {r:?}");
        // Each launch timed as a whole, its one round inside it.
        assert_eq!(r.launch_ns.len(), rounds as usize, "{shape:?}: one time per launch");
        assert!(r.launch_ns.iter().zip(&r.round_ns).all(|(l, t)| l >= t), "{shape:?}: {r:?}");
    }
    let after = b.nic().stats();
    assert_eq!((after.doorbells, after.wqes), (before.doorbells, before.wqes), "nothing consumed: {after:?}");
    assert!(b.flood(ctas, threads, 1, false, Duration::from_secs(1)).is_err(), "a flood needs a consumer");
    let one = b.run_in_one_launch(Shape::Exclusive { qps, db_batch: 1, bf: false }, 1, 1, Duration::from_secs(1));
    assert!(one.is_err(), "rounds in one launch need a consumer");
}

#[test]
fn cpu_post_rate_without_consumer() {
    every_shape_without_consumer(ExecutorKind::Cpu, 2, 1, 4);
}

#[test]
#[ignore = "needs a GPU: run on the H200 with --ignored"]
fn gpu_post_rate_without_consumer() {
    let _gpu = gdaki_testkit::gpu_turn();
    every_shape_without_consumer(ExecutorKind::Gpu, 8, 4, 32);
}
