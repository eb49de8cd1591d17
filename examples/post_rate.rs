//! The device-side post rate: how many 8-byte RDMA WRITE WQEs per second device code builds and submits
//! (`gdaki_testkit::postrate`): one thread per QP on one and on many QPs, ringing the doorbell every post, every 32
//! posts, or by BlueFlame; one warp per QP (a WQE per lane, one doorbell); and many threads on one QP in
//! Device scope. The emulated NIC consumes the WQEs as fast as it can meanwhile (loopback QPs writing pinned
//! host memory; each launch ends with the posters' flushes), or, with `--no-consumer`, nothing consumes them
//! (the QPs are not connected; fresh counters each round, at least 11 rounds): the post path alone, the
//! shapes of DOCA GPUNetIO's comparison. Each round is a launch of its own (after a warm-up launch) in both
//! modes, so that they differ in the NIC alone; `--one-launch` runs a consumer's rounds in one launch, each
//! after the flush of the one before, as a persistent kernel would (on the H200 the two busiest many-poster
//! rows post 1.4-1.5x slower that way, for a reason not found; the NIC's work is not it).
//! Every round starts at a grid-wide barrier, so the posters post at the same time. Each row gives WQEs/s over
//! the median round (all posters' WQEs over the earliest start to the latest end, `%globaltimer`), the ns per
//! WQE that makes, the median poster's ns per post (per warp post for the warp rows) and the slowest poster's
//! (whose round sets the span when posters run together); with
//! `--no-consumer` also the median launch's time over the posts per poster ("event ns/post": CUDA events
//! around each launch on the GPU, wall time on the cpu executor, so launch and start-up included, as DOCA
//! GPUNetIO's post path is measured). The last line is `N passed, M failed` (a row passes when device code
//! reported no error and the NIC saw no error CQE and no dbrec mismatch, or, without a consumer, no doorbell
//! at all). Without a consumer the last rows are the platform's floors: under the one-thread-per-QP rows, each
//! post's ordering alone (dbrec release store, release fence, doorbell or BlueFlame stores), no WQE built;
//! under the warp rows, each lane's WQE stores and one doorbell's ordering, nothing reserved or checked.
//! With a consumer, a row whose rings are in GPU memory is followed by where the NIC read them: ranges from
//! the rings' mirrors in host memory, and ranges fetched from the GPU (`Stats::ring_mirrored`,
//! `Stats::ring_fetches`), with the time its thread waited for each.
//!
//! `cargo run --release --example post_rate -- --executor cpu [--no-consumer | --one-launch]`

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use gdaki::exec::{Executor, ExecutorKind};
use gdaki_testkit::postrate::{PostRate, Shape};

/// Most QPs of the many-QP rows (`--qps`): nearly 8 times the GPU's default of 132, and small enough that the
/// counts made from it below (QPs `2 * many`, posters `2 * many * 32` lanes) cannot wrap.
const MAX_QPS: u32 = 1024;
const _: () = assert!(MAX_QPS.checked_mul(2 * 32).is_some());

#[derive(Parser, Debug)]
#[command(about = "WQEs per second that device code builds and submits (8-byte RDMA WRITE)")]
struct Args {
    /// cpu or gpu (default: the GPU if there is one).
    #[arg(long)]
    executor: Option<ExecutorKind>,
    /// Where the emulated NIC keeps its SQ/CQ rings and dbrecs: gpu (GPU memory, the default on the gpu
    /// executor; simulated on the cpu executor) or host (pinned host memory); sets GDAKI_QUEUES.
    #[arg(long, value_enum)]
    queues: Option<gdaki_examples::Queues>,
    /// QPs of the many-QP rows, 1 to 1024 (default: 132 on the GPU, one per SM of an H200; 2 on cpu). The
    /// warp rows take twice as many, and each QP's rings are 4 MiB: 8 GiB of queue memory at 1024.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=MAX_QPS as i64))]
    qps: Option<u32>,
    /// Nothing consumes the rings: the post path alone (fresh counters each round, at least 11 rounds).
    #[arg(long)]
    no_consumer: bool,
    /// With a consumer, every round in one launch (each after the posters' flush of the one before, at the
    /// grid-wide barrier) instead of one launch per round.
    #[arg(long, conflicts_with = "no_consumer")]
    one_launch: bool,
    /// Posts per thread per round in the one-thread-per-QP rows.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..=16_000))]
    posts: u32,
    /// Timed rounds per row (after one warm-up round).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    rounds: u32,
}

fn main() -> ExitCode {
    let args = Args::parse();
    gdaki_examples::apply_queues(args.queues);
    let (exec, note) = match Executor::open(args.executor) {
        Ok(e) => e,
        Err(e) => {
            gdaki_examples::eprintln_line!("error: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(n) = note {
        gdaki_examples::eprintln_line!("{n}");
    }
    let exec_kind = exec.kind();
    let gpu = exec_kind == ExecutorKind::Gpu;
    let many = args.qps.unwrap_or(if gpu { 132 } else { 2 });
    let (ctas, threads) = if gpu { (132, 32) } else { (1, 4) };
    let mut rows = Vec::new();
    for qps in [1, many] {
        for (db_batch, bf) in [(1, false), (32, false), (1, true)] {
            rows.push((Shape::Exclusive { qps, db_batch, bf }, args.posts));
        }
        // The doorbell every 32 WQEs again, the 32 posted by one `post_batch` call (one reservation).
        rows.push((Shape::Batch { qps, batch: 32 }, args.posts));
    }
    // Many threads on one QP: every post is its own WQE, so a round's posts share the one SQ.
    let posters = ctas * threads;
    rows.push((Shape::Shared { ctas, threads }, (8000 / posters).clamp(1, args.posts)));
    // One warp per QP, a WQE per lane and one doorbell per post (a host thread is a warp of one lane), on one
    // QP and on two per SM.
    let lanes = if gpu { 32 } else { 1 };
    for qps in [1, 2 * many] {
        rows.push((Shape::Warp { qps, lanes }, args.posts.min(16_000 / lanes)));
    }
    // Without a consumer, the platform's floor under the one-thread-per-QP rows: each post's ordering alone (on
    // two QPs per SM too, the floor under the 264-warp row's doorbells); then the floor under the warp rows:
    // each lane's WQE stores and the leader's ordering.
    if args.no_consumer {
        for qps in [1, many, 2 * many] {
            for bf in [false, true] {
                rows.push((Shape::Ordering { qps, bf }, args.posts));
            }
        }
        for qps in [1, 2 * many] {
            rows.push((Shape::WarpOrdering { qps, lanes }, args.posts.min(16_000 / lanes)));
        }
    }
    let rounds = if args.no_consumer { args.rounds.max(11) } else { args.rounds };
    let open = if args.no_consumer { PostRate::without_consumer } else { PostRate::new };
    let mut bench = match open(exec, 2 * many, posters.max(2 * many * lanes)) {
        Ok(b) => b,
        Err(e) => {
            gdaki_examples::eprintln_line!("error: {e}");
            return ExitCode::from(1);
        }
    };
    gdaki_examples::outln!("queues in {} memory", gdaki_examples::queues_label(exec_kind));
    if args.no_consumer {
        gdaki_examples::outln!("nothing consumes the rings: one launch per round, medians of {rounds} launches");
    } else if args.one_launch {
        gdaki_examples::outln!("the NIC consumes the rings: every round in one launch, each flushed before the next");
    } else {
        gdaki_examples::outln!("the NIC consumes the rings: one launch per round, flushed, medians of {rounds} rounds");
    }
    // The event-timed column is the no-consumer mode's: with a consumer each launch also holds the flushes (and
    // with `--one-launch` every round), so its time is no cost per post.
    let event_col = if args.no_consumer { format!(" {:>16}", "event ns/post") } else { String::new() };
    gdaki_examples::outln!(
        "{:<40} {:>8} {:>8} {:>7} {:>14} {:>10} {:>12} {:>12}{event_col}",
        "shape",
        "posters",
        "posts",
        "rounds",
        "WQEs/s",
        "ns/WQE",
        "ns/post",
        "max ns/post"
    );
    let (mut passed, mut failed) = (0, 0);
    for (shape, posts) in rows {
        let before = bench.nic().stats();
        let run = if args.one_launch { PostRate::run_in_one_launch } else { PostRate::run };
        match run(&mut bench, shape, posts, rounds, Duration::from_secs(10)) {
            Ok(r) => {
                let after = bench.nic().stats();
                let nposters = (r.wqes / (posts as u64 * rounds as u64)) as u32;
                let rate = r.wqes_per_s(nposters, posts);
                let event = if args.no_consumer {
                    format!(" {:>16.1}", r.median_launch_ns() as f64 / posts as f64)
                } else {
                    String::new()
                };
                gdaki_examples::outln!(
                    "{:<40} {nposters:>8} {posts:>8} {rounds:>7} {rate:>14.0} {:>10.2} {:>12.1} {:>12.1}{event}",
                    shape.label(),
                    1e9 / rate.max(1.0),
                    r.median_ns_per_post(),
                    r.max_ns_per_post()
                );
                if args.no_consumer {
                    if (after.doorbells, after.wqes) == (before.doorbells, before.wqes) {
                        passed += 1;
                    } else {
                        gdaki_examples::eprintln_line!(
                            "error: {}: the NIC consumed WQEs of unconnected QPs: {after:?}",
                            shape.label()
                        );
                        failed += 1;
                    }
                    continue;
                }
                if after.ring_mirrored + after.ring_fetches > before.ring_mirrored + before.ring_fetches {
                    gdaki_examples::outln!(
                        "  NIC: {} ring ranges read from mirrors (waited {:.0} µs), {} fetched from the GPU ({:.0} µs)",
                        after.ring_mirrored - before.ring_mirrored,
                        (after.ring_mirror_wait_ns - before.ring_mirror_wait_ns) as f64 / 1e3,
                        after.ring_fetches - before.ring_fetches,
                        (after.ring_fetch_ns - before.ring_fetch_ns) as f64 / 1e3
                    );
                }
                if let Shape::Exclusive { bf: true, .. } = shape {
                    gdaki_examples::outln!(
                        "  BlueFlame: {} WQEs taken from the register, {} writes read from the ring (a poster ahead of the NIC)",
                        after.blueflame - before.blueflame,
                        after.blueflame_fallbacks - before.blueflame_fallbacks
                    );
                }
                let clean = after.error_cqes == before.error_cqes
                    && after.dbrec_mismatches == before.dbrec_mismatches
                    && after.blueflame_mismatches == before.blueflame_mismatches;
                if clean {
                    passed += 1;
                } else {
                    gdaki_examples::eprintln_line!(
                        "error: {}: the NIC saw error CQEs, dbrec mismatches or BlueFlame WQEs unlike the ring's: {after:?}",
                        shape.label()
                    );
                    failed += 1;
                }
            }
            Err(e) => {
                gdaki_examples::eprintln_line!("error: {}: {e}", shape.label());
                failed += 1;
            }
        }
    }
    gdaki_examples::outln!("\n{passed} passed, {failed} failed");
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
