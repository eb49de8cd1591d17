//! Ping-pong between two ranks over the emulated mlx5 NIC, driven by device code: rank 0 RDMA-writes a
//! random payload and signals rank 1's semaphore with an RDMA fetch-add; rank 1 waits, answers the same way and
//! then checks the payload. Prints a perftest-style latency table (one iteration = one round trip) and, last,
//! `N passed, M failed` over the checked payloads.
//!
//! `cargo run --release --example pingpong -- --executor cpu --iters 200 --size 4096`
//!
//! Two processes, one rank each, over the emulated NIC's wire (rank 0 prints the table):
//! `pingpong --world-size 2 --rank 0 --bootstrap 127.0.0.1:29500` and the same with `--rank 1`; or under
//! `mpirun -np 2`, `srun -n 2` or `torchrun --nproc-per-node 2` (rank and world size from their environment).

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use gdaki::bootstrap::Bootstrap;
use gdaki::exec::{Executor, ExecutorKind};
use gdaki::nic::NicSpec;
use gdaki_testkit::perftest::LatencyRow;
use gdaki_testkit::pingpong::{PingPong, RunConfig};

/// Largest size of --all, bytes.
const MAX_ALL: usize = 1 << 20;

#[derive(Parser, Debug)]
#[command(about = "Ping-pong over the emulated mlx5 NIC (or a real one), driven by gdaki device code")]
struct Args {
    /// Where device code runs: cpu or gpu (default: the GPU if there is one, else cpu).
    #[arg(long)]
    executor: Option<ExecutorKind>,
    /// Where the emulated NIC keeps its SQ/CQ rings and dbrecs: gpu (GPU memory, the default on the gpu
    /// executor; simulated on the cpu executor) or host (pinned host memory); sets GDAKI_QUEUES.
    #[arg(long, value_enum)]
    queues: Option<gdaki_examples::Queues>,
    /// Payload bytes per message.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=1u64 << 30))]
    size: u64,
    /// Send each message as one 8-byte RDMA WRITE by BlueFlame, with no fetch-add (the peer polls the payload,
    /// as perftest's ib_write_lat does), instead of a WRITE and a fetch-add with one doorbell.
    #[arg(long)]
    blueflame: bool,
    /// Run every power of two from 8 B to 1 MiB.
    #[arg(long, conflicts_with = "size")]
    all: bool,
    /// Measured round trips per size.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=10_000_000))]
    iters: u32,
    /// Round trips before measuring (default: iters / 10, at most 1000).
    #[arg(long, value_parser = clap::value_parser!(u32).range(0..=10_000_000))]
    warmup: Option<u32>,
    /// Bound of every device-side wait, ms.
    #[arg(long, default_value_t = 5000, value_parser = clap::value_parser!(u64).range(1..=86_400_000))]
    timeout_ms: u64,
    /// Seed of the payload generator, decimal or 0x-hex as printed (default: from the clock).
    #[arg(long, value_parser = parse_seed)]
    seed: Option<u64>,
    /// Also write the results as JSON here.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
    #[command(flatten)]
    launch: gdaki_examples::LaunchArgs,
    /// Run the sizes this many times (a soak), printing this process's memory after each pass.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    repeat: u32,
    /// NIC: emu (the emulated mlx5 NIC) or an RDMA device, DEVICE[:PORT[:GID_INDEX]] (e.g. mlx5_0; needs a
    /// build with --features mlx5 and a ConnectX NIC).
    #[arg(long, default_value = "emu")]
    nic: NicSpec,
}

fn parse_seed(s: &str) -> Result<u64, std::num::ParseIntError> {
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => s.parse(),
    }
}

/// What `--json` writes: the table plus everything needed to say where and how it was measured.
#[derive(serde::Serialize)]
struct Report<'a> {
    /// "pingpong".
    program: &'a str,
    /// Commit the binary was built from (`-dirty` when the tree had changes).
    commit: &'a str,
    /// When the run ended, RFC 3339 UTC.
    date: String,
    /// Host name of the machine.
    host: String,
    /// "cpu" or "gpu".
    executor: &'a str,
    /// Where the emulated NIC's queues were: "gpu", "host" or "gpu (simulated)".
    queues: &'a str,
    /// Whether each WQE went by BlueFlame (`--blueflame`) instead of one doorbell per send.
    blueflame: bool,
    /// The GPU's name, or the host's thread count.
    device: String,
    /// CUDA driver API version, for the gpu executor.
    cuda_driver: Option<String>,
    /// NIC backend.
    nic: String,
    /// One iteration = one round trip (rank 0 → rank 1 → rank 0), not perftest's half round trip.
    iteration: &'a str,
    /// Units of the row times.
    units: &'a str,
    seed: String,
    warmup: u32,
    timeout_ms: u64,
    rows: &'a [LatencyRow],
    /// Payloads received and checked byte for byte.
    passed: u64,
    /// Sizes whose run failed.
    failed: u64,
    /// With --repeat: this process's peak resident set (VmHWM, KiB) after each pass.
    peak_rss_kib: &'a [u64],
}

/// This process's resident set and its peak so far (VmRSS, VmHWM from /proc/self/status), KiB; 0 where
/// unknown.
fn memory_kib() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

fn main() -> ExitCode {
    let args = Args::parse();
    // BlueFlame sends the payload's one 8-byte word: refuse other sizes before any rank starts, not after the
    // 8-byte row has run.
    if args.blueflame && (args.all || args.size != 8) {
        let what = if args.all { "--all".to_string() } else { format!("--size {}", args.size) };
        gdaki_examples::eprintln_line!("error: --blueflame sends one 8-byte word: it does not go with {what}");
        return ExitCode::from(2);
    }
    if let Some(code) = args.launch.spawn_processes(2..=2) {
        return code;
    }
    gdaki_examples::apply_queues(args.queues);
    let launch = match args.launch.two_ranks() {
        Ok(l) => l,
        Err(e) => {
            gdaki_examples::eprintln_line!("error: {e}");
            return ExitCode::from(2);
        }
    };
    // Create the JSON file first: a path that cannot be written is an error before the run, not after it.
    // Rank 0 writes it (in a multi-process run both ranks may see the same path).
    let json_path = args.json.as_deref().filter(|_| launch.as_ref().is_none_or(|l| l.rank == 0));
    let json = match gdaki_examples::create_json(json_path) {
        Ok(f) => f,
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
    let sizes: Vec<usize> = if args.all {
        std::iter::successors(Some(8usize), |s| (*s < MAX_ALL).then_some(s * 2)).collect()
    } else {
        vec![args.size as usize]
    };
    let warmup = args.warmup.unwrap_or((args.iters / 10).min(1000));
    let mut seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1)
    });
    let timeout = Duration::from_millis(args.timeout_ms);
    // A multi-process run: join the session first, and take rank 0's seed so that both check the same payloads.
    let session = match &launch {
        None => None,
        Some(l) => {
            let joined = Bootstrap::connect(l, args.launch.bootstrap_timeout())
                .and_then(|bs| Ok((bs.all_gather(&seed.to_le_bytes())?, bs)));
            match joined {
                Ok((seeds, bs)) => {
                    seed = seeds[0].as_slice().try_into().map_or(seed, u64::from_le_bytes);
                    Some((bs, l.rank))
                }
                Err(e) => {
                    gdaki_examples::eprintln_line!("error: {e}");
                    return ExitCode::from(2);
                }
            }
        }
    };
    let device = match &exec {
        Executor::Cpu => format!("{} host threads", std::thread::available_parallelism().map_or(1, |n| n.get())),
        Executor::Gpu(g) => g.name().to_string(),
    };
    let cuda_driver = match &exec {
        Executor::Cpu => None,
        Executor::Gpu(g) => Some(format!("{}.{}", g.driver_version().0, g.driver_version().1)),
    };
    let exec_kind = exec.kind();
    let executor = exec.kind().to_string();
    let max = *sizes.iter().max().unwrap_or(&8);
    let total = (warmup + args.iters) as usize;
    let (mut rows, mut passed, mut failed) = (Vec::new(), 0u64, 0u64);
    let mut rss_kib = Vec::new();
    // The bootstrap serves the setup's exchange, then the count of both ranks' checks at the end.
    let session = session.map(|(bs, rank)| (std::sync::Arc::new(bs), rank));
    let setup = match session.clone() {
        None => PingPong::new_on(&args.nic, exec, max, total),
        Some((bs, rank)) => {
            let peer = (1 - rank) as usize;
            let exchange = Box::new(move |mine: &[u8]| Ok(bs.all_gather(mine)?.swap_remove(peer)));
            let wire = args.launch.wire_config();
            PingPong::new_rank_on(&args.nic, exec, rank, max, total, wire, exchange)
        }
    };
    // A NIC that is not there (no RDMA device, a build without the mlx5 feature) is one line and exit code 2.
    if let Err(gdaki::Error::Unavailable(why)) = &setup {
        gdaki_examples::eprintln_line!("error: {why}");
        return ExitCode::from(2);
    }
    let nic = match &args.nic {
        NicSpec::Emu => "emulated mlx5 NIC".to_string(),
        real => format!("NIC {real}"),
    };
    // Rank 0 prints; rank 1 of a multi-process run prints only its errors (its checks are counted in rank 0's
    // summary).
    let measures = launch.as_ref().is_none_or(|l| l.rank == 0);
    if measures {
        gdaki_examples::outln!(
            "gdaki pingpong ({}): executor {executor} ({device}), {nic} (queues in {} memory), RC {}",
            env!("GDAKI_COMMIT"),
            gdaki_examples::queues_label(exec_kind),
            if args.blueflame {
                "RDMA WRITE by BlueFlame, the peer polling its payload"
            } else {
                "RDMA WRITE + ATOMIC fetch-add, one doorbell"
            }
        );
        let layout = match &launch {
            Some(l) => format!("rank {} of 2 in this process ({}), peer over the wire", l.rank, l.source),
            None => "both ranks in this process".to_string(),
        };
        gdaki_examples::outln!("{layout}");
        gdaki_examples::outln!(
            "seed {seed:#x}, {warmup} warm-up + {} measured round trips per size; times are full round trips",
            args.iters
        );
    }
    match setup {
        Err(e) => {
            gdaki_examples::eprintln_line!("error: {e}");
            failed += 1;
        }
        Ok(mut pp) => {
            if measures {
                gdaki_examples::outln!("{}", LatencyRow::header());
            }
            'runs: for rep in 0..args.repeat {
                for &size in &sizes {
                    let seed = seed ^ size as u64 ^ (rep as u64) << 32;
                    let cfg = RunConfig { size, iters: args.iters, warmup, seed, timeout, blueflame: args.blueflame };
                    let before = emu_stats(pp.nic());
                    match pp.run(&cfg) {
                        Ok(r) => {
                            passed += r.checked;
                            if let Some(row) = LatencyRow::from_ns(size as u64, &r.round_trip_ns) {
                                gdaki_examples::outln!("{}", row.line());
                                if let (Some(b), Some(a)) = (before, emu_stats(pp.nic())) {
                                    let trips = (cfg.warmup + cfg.iters) as u64;
                                    gdaki_examples::outln!(
                                        "{}",
                                        gdaki_examples::emu_waits(&b, &a, trips, "round trip")
                                    );
                                }
                                if let Some(line) = split_line(&r.split) {
                                    gdaki_examples::outln!("{line}");
                                }
                                rows.push(row);
                            }
                        }
                        Err(e) => {
                            gdaki_examples::eprintln_line!("error at {size} bytes: {e}");
                            failed += 1;
                            break 'runs;
                        }
                    }
                }
                if args.repeat > 1 && measures {
                    let (rss, hwm) = memory_kib();
                    gdaki_examples::outln!(
                        "# after pass {} of {}: {passed} payloads checked, VmRSS {rss} KiB, VmHWM {hwm} KiB",
                        rep + 1,
                        args.repeat
                    );
                    rss_kib.push(hwm);
                }
            }
        }
    }
    // Rank 0 reports both ranks' checks (rank 1 counts the payloads it received and checks).
    if let Some((bs, rank)) = &session {
        (passed, failed) = gdaki_examples::sum_checks(bs, *rank, passed, failed);
    }
    if let (Some(file), Some(path)) = (json, &args.json) {
        let report = Report {
            program: "pingpong",
            commit: env!("GDAKI_COMMIT"),
            date: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
            host: std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map_or_else(|_| "unknown".into(), |h| h.trim().into()),
            executor: &executor,
            queues: gdaki_examples::queues_label(exec_kind),
            blueflame: args.blueflame,
            device,
            cuda_driver,
            nic: args.nic.to_string(),
            iteration: "round trip",
            units: "us",
            seed: format!("{seed:#x}"),
            warmup,
            timeout_ms: args.timeout_ms,
            rows: &rows,
            passed,
            failed,
            peak_rss_kib: &rss_kib,
        };
        let written = serde_json::to_writer_pretty(std::io::BufWriter::new(file), &report);
        if let Err(e) = written {
            gdaki_examples::eprintln_line!("error: writing {}: {e}", path.display());
            failed += 1;
        }
    }
    if measures {
        gdaki_examples::outln!("{passed} passed, {failed} failed");
    }
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The emulated NIC's counters, if the ping-pong runs on one.
fn emu_stats(nic: &gdaki::nic::Nic) -> Option<gdaki::nic::emu::Stats> {
    match nic {
        gdaki::nic::Nic::Emu(n) => Some(n.stats()),
        #[allow(unreachable_patterns)]
        _ => None,
    }
}

/// The medians of where the round trips went (both ranks in this process), from the ranks' own clocks.
fn split_line(split: &[gdaki_testkit::pingpong::Split]) -> Option<String> {
    if split.is_empty() {
        return None;
    }
    let median = |f: fn(&gdaki_testkit::pingpong::Split) -> u64| {
        let mut v: Vec<u64> = split.iter().map(f).collect();
        v.sort_unstable();
        v[v.len() / 2] as f64 / 1e3
    };
    Some(format!(
        "# round trip split (medians, the ranks' clocks): rank 0 posts {:.2} µs, leg to rank 1 {:.2} µs, rank 1 \
         posts {:.2} µs, leg back {:.2} µs",
        median(|s| s.post0),
        median(|s| s.leg01),
        median(|s| s.turn1),
        median(|s| s.leg10),
    ))
}
