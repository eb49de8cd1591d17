//! MSCCL++'s one-to-one PortChannel tests on gdaki's emulated NIC (or a ConnectX with `--nic`): ping-pong
//! (`put_with_signal` + `wait` + `flush`), PacketPingPong with LL16 and LL8 packets (`put_packets` +
//! `read_packets`: no signal, no wait), 1-QP and 4-QP bandwidth, bidirectional bandwidth, flush stress
//! (4 QPs, 1 KiB each) and same-channel concurrent flush (4 threads, 1 QP), each in every mode: Host and
//! HostNoAtomic (the CPU proxy posts) and Device mode with Exclusive, Block and Device sharing (`--mode`
//! picks). Every received payload is checked on the device; the last line is `N passed, M failed`.
//!
//! Two ranks in this process (each with its own bootstrap endpoint, communicator and emulated NIC, connected
//! over the wire), or one rank per process with `--world-size 2 --rank R --bootstrap HOST:PORT` (or mpirun's
//! environment); rank 0 prints.
//!
//! `cargo run --release --example port_channel -- --executor cpu`

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use gdaki::channel::Communicator;
use gdaki::exec::{Executor, ExecutorKind};
use gdaki::nic::NicSpec;
use gdaki_testkit::perftest::{BandwidthRow, LatencyRow};
use gdaki_testkit::porttest::bench::{run_test, Measure, Plan, Row, Step, Test};
use gdaki_testkit::porttest::Mode;

#[derive(Parser, Debug, Clone)]
#[command(about = "MSCCL++'s one-to-one PortChannel tests on gdaki's emulated NIC (or a real one)")]
struct Args {
    /// cpu or gpu (default: the GPU if there is one).
    #[arg(long)]
    executor: Option<ExecutorKind>,
    /// Where the emulated NIC keeps its SQ/CQ rings and dbrecs: gpu (GPU memory, the default on the gpu
    /// executor; simulated on the cpu executor) or host (pinned host memory); sets GDAKI_QUEUES.
    #[arg(long, value_enum)]
    queues: Option<gdaki_examples::Queues>,
    /// Modes to run: host, host-no-atomic (the CPU proxy), exclusive, warp, block, device (device code posts;
    /// warp with a team of at most 32 threads; comma-separated; default all but warp).
    #[arg(long, value_delimiter = ',', default_value = "host,host-no-atomic,exclusive,block,device")]
    mode: Vec<Mode>,
    /// Iterations per row (bandwidth rows use fewer for large sizes: at most 512 MiB per row).
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    iters: u32,
    /// Largest bandwidth message, bytes, 1 KiB to 1 GiB (rows go 1 KiB, 4×, … up to it; MSCCL++ goes to 128 MiB).
    #[arg(long, default_value_t = 128 << 20,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1024..=1 << 30))]
    max_size: usize,
    /// Threads per team, 1 to 1024: a CTA's size on the GPU (1024 is the largest CTA); host threads per
    /// channel on the cpu executor (default: 128 on the GPU, 4 on cpu).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1024))]
    team: Option<u32>,
    /// Bound of every device-side wait, ms (at most a day).
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=86_400_000))]
    timeout_ms: u64,
    #[command(flatten)]
    launch: gdaki_examples::LaunchArgs,
    /// Payloads up to this many bytes go by BlueFlame in Exclusive sharing (0: never).
    #[arg(long, default_value_t = 512 << 10)]
    blue_flame_limit: u64,
    /// Say on stderr which test each rank starts and ends.
    #[arg(long)]
    verbose: bool,
    /// NIC: emu (the emulated mlx5 NIC) or an RDMA device, DEVICE[:PORT[:GID_INDEX]] (e.g. mlx5_0; needs a
    /// build with --features mlx5 and a ConnectX NIC).
    #[arg(long, default_value = "emu")]
    nic: NicSpec,
}

/// A rank's rows by mode, its failures, and the payloads checked and failures of every rank of a
/// multi-process run (gathered over the bootstrap; `None` when every rank runs in this process).
type RankOutcome = (Vec<(Mode, Vec<Row>)>, u64, Option<(u64, u64)>);

/// Most bytes one bandwidth row moves.
const ROW_BUDGET: usize = 512 << 20;

/// Runs every test of `mode` on this rank; returns the rows (with times on rank 0).
fn run_mode(comm: &Arc<Communicator>, mode: Mode, args: &Args, team: u32) -> gdaki::Result<Vec<Row>> {
    // 1 KiB, ×4 steps, and `max_size` itself as the last row.
    let mut sizes: Vec<usize> =
        std::iter::successors(Some(1024usize), |s| s.checked_mul(4)).take_while(|s| *s < args.max_size).collect();
    sizes.push(args.max_size);
    let plan = Plan {
        iters: args.iters,
        warmup: 0,
        byte_budget: ROW_BUDGET,
        team,
        timeout: Duration::from_millis(args.timeout_ms),
        blue_flame_limit: args.blue_flame_limit,
    };
    let rank = comm.rank();
    let trace = |s: Step<'_>| {
        if args.verbose {
            match s {
                Step::Start { test, bytes, iters, .. } => {
                    gdaki_examples::eprintln_line!(
                        "rank {rank}: {} {} {bytes} B x{iters} ...",
                        mode.name(),
                        test.name()
                    )
                }
                Step::Done(r) => {
                    gdaki_examples::eprintln_line!("rank {rank}: {} {} {} B: ok", mode.name(), r.test.name(), r.bytes)
                }
            }
        }
    };
    let mut rows = Vec::new();
    for test in Test::ALL {
        let test_sizes = match test {
            Test::PingPong | Test::PacketLl16 | Test::PacketLl8 => vec![8, 1024, 4096],
            Test::FlushStress | Test::SameChannelFlush => vec![1024],
            _ => sizes.iter().map(|&s| s.next_multiple_of(test.channels() as usize)).collect(),
        };
        rows.extend(run_test(comm, mode, test, &test_sizes, &plan, trace)?);
    }
    Ok(rows)
}

fn print_rows(mode: Mode, rows: &[Row]) {
    gdaki_examples::outln!("\n## {}", mode.title());
    let latency = |r: &Row| match &r.measure {
        Some(Measure::Latency(l)) => Some(l.clone()),
        _ => None,
    };
    // One latency table per ping-pong test, in the order they ran.
    for (i, test) in [Test::PingPong, Test::PacketLl16, Test::PacketLl8].into_iter().enumerate() {
        if i > 0 {
            gdaki_examples::outln!();
        }
        gdaki_examples::outln!("{}  test", LatencyRow::header());
        for l in rows.iter().filter(|r| r.test == test).filter_map(latency) {
            gdaki_examples::outln!("{}  {}", l.line(), test.name());
        }
    }
    // Typical LL latency against the signal-based ping-pong, per size (MSCCL++'s reason for LL).
    for r in rows.iter().filter(|r| matches!(r.test, Test::PacketLl16 | Test::PacketLl8)) {
        let base = rows.iter().filter(|p| p.test == Test::PingPong && p.bytes == r.bytes).find_map(latency);
        if let (Some(l), Some(b)) = (latency(r), base.filter(|b| b.t_typical > 0.0)) {
            gdaki_examples::outln!(
                "{} {:>6} B: {:.2}x the pingpong's typical latency",
                r.test.name(),
                l.bytes,
                l.t_typical / b.t_typical
            );
        }
    }
    gdaki_examples::outln!("{}  test", BandwidthRow::header());
    for r in rows {
        if let Some(Measure::Bandwidth(b)) = &r.measure {
            gdaki_examples::outln!("{}  {}", b.line(), r.test.name());
        }
    }
    gdaki_examples::outln!("{:>24} {:>8} {:>16}", "test", "#iters", "us per put+flush");
    for r in rows.iter().filter(|r| matches!(r.test, Test::FlushStress | Test::SameChannelFlush)) {
        if let Some(l) = latency(r) {
            gdaki_examples::outln!("{:>24} {:>8} {:>16.2}", r.test.name(), l.iterations, l.t_typical);
        }
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(code) = args.launch.spawn_processes(2..=2) {
        return code;
    }
    gdaki_examples::apply_queues(args.queues);
    if let Err(e) = gdaki_examples::refuse_repeats("--mode", &args.mode, |m| m.name()) {
        gdaki_examples::eprintln_line!("error: {e}");
        return ExitCode::from(2);
    }
    let modes = args.mode.clone();
    let launch = match args.launch.two_ranks() {
        Ok(l) => l,
        Err(e) => {
            gdaki_examples::eprintln_line!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let (exec, notice) = match Executor::open_on(args.executor, args.launch.gpu_of(launch.as_ref())) {
        Ok(e) => e,
        Err(e) => {
            gdaki_examples::eprintln_line!("error: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(n) = notice {
        gdaki_examples::eprintln_line!("note: {n}");
    }
    let kind = exec.kind();
    if let Err(why) = gdaki_examples::check_nic(&args.nic, &exec) {
        gdaki_examples::eprintln_line!("error: {why}");
        return ExitCode::from(2);
    }
    drop(exec);
    let nic = match &args.nic {
        NicSpec::Emu => "emulated mlx5 NIC over the wire".to_string(),
        real => format!("NIC {real}"),
    };
    let team = args.team.unwrap_or(if kind == ExecutorKind::Gpu { 128 } else { 4 });
    // Rank 0 prints (rank 1 of a multi-process run only its errors, its checks counted in rank 0's summary).
    let multi = launch.is_some();
    let measures = launch.as_ref().is_none_or(|l| l.rank == 0);
    if measures {
        gdaki_examples::outln!(
            "gdaki port_channel ({}): {} executor, {}, {nic} (queues in {} memory)",
            gdaki_examples::COMMIT,
            if kind == ExecutorKind::Gpu { "gpu" } else { "cpu" },
            Mode::team_words(&args.mode, team),
            gdaki_examples::queues_label(kind)
        );
    }
    // One rank's whole run: one communicator (bootstrap + NIC), every mode in turn, fresh channels per test.
    let rank_main = |comm: Arc<Communicator>| -> RankOutcome {
        let mut out = Vec::new();
        let mut failed = 0;
        for &mode in &modes {
            match run_mode(&comm, mode, &args, team) {
                Ok(rows) => out.push((mode, rows)),
                Err(e) => {
                    gdaki_examples::eprintln_line!("error: rank {}, {} sharing: {e}", comm.rank(), mode.name());
                    failed = 1;
                    break;
                }
            }
        }
        let passed = out.iter().flat_map(|(_, rows)| rows).map(|r| r.checked).sum();
        let all = multi.then(|| gdaki_examples::sum_checks(comm.bootstrap(), comm.rank(), passed, failed));
        (out, failed, all)
    };
    let results: Vec<RankOutcome> =
        match gdaki_examples::run_ranks(launch, (kind, &args.launch), &args.nic, false, rank_main) {
            Ok(r) => r
                .into_iter()
                .map(|(rank, r)| {
                    r.unwrap_or_else(|e| {
                        gdaki_examples::eprintln_line!("error: rank {rank}: {e}");
                        (Vec::new(), 1, None)
                    })
                })
                .collect(),
            Err(e) => {
                gdaki_examples::eprintln_line!("error: {e}");
                return ExitCode::from(2);
            }
        };
    let (passed, failed) = match results.first().and_then(|r| r.2) {
        Some(all) => all,
        None => (
            results.iter().flat_map(|r| &r.0).flat_map(|(_, rows)| rows).map(|r| r.checked).sum(),
            results.iter().map(|r| r.1).sum(),
        ),
    };
    if measures {
        for (mode, rows) in &results[0].0 {
            print_rows(*mode, rows);
        }
        gdaki_examples::outln!("\n{passed} passed, {failed} failed");
    }
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
