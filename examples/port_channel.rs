//! MSCCL++'s one-to-one PortChannel tests (GPUNetIO Device mode) on gdaki's emulated NIC: ping-pong
//! (`put_with_signal` + `wait` + `flush`), PacketPingPong with LL16 and LL8 packets (`put_packets` +
//! `read_packets`: no signal, no wait), 1-QP and 4-QP bandwidth, bidirectional bandwidth, flush stress
//! (4 QPs, 1 KiB each) and same-channel concurrent flush (4 threads, 1 QP), each in Exclusive, Block and
//! Device sharing. Every received payload is checked on the device; the last line is `N passed, M failed`.
//!
//! Two ranks in this process (each with its own bootstrap endpoint, communicator and emulated NIC, connected
//! over the wire), or one rank per process with `--world-size 2 --rank R --bootstrap HOST:PORT` (or mpirun's
//! environment); rank 0 prints.
//!
//! `cargo run --release --example port_channel -- --executor cpu`

use std::net::TcpListener;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use gdaki::bootstrap::{Bootstrap, Launch, Secret};
use gdaki::channel::Communicator;
use gdaki::exec::{Executor, ExecutorKind};
use gdaki::nic::emu::WireConfig;
use gdaki::nic::NicSpec;
use gdaki::perftest::LatencyRow;
use gdaki::porttest::{max_size_for, op, Mode, PortTest, RunConfig};

#[derive(Parser, Debug, Clone)]
#[command(about = "MSCCL++'s one-to-one PortChannel tests on gdaki's emulated NIC (or a real one)")]
struct Args {
    /// cpu or gpu (default: the GPU if there is one).
    #[arg(long)]
    executor: Option<ExecutorKind>,
    /// Modes to run: host, host-no-atomic (the CPU proxy), exclusive, block, device (device code posts;
    /// comma-separated; default all).
    #[arg(long, value_delimiter = ',', default_value = "host,host-no-atomic,exclusive,block,device")]
    mode: Vec<Mode>,
    /// Iterations per row (bandwidth rows use fewer for large sizes: at most 512 MiB per row).
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    iters: u32,
    /// Largest bandwidth message, bytes (rows go 1 KiB, 4×, … up to it; MSCCL++ goes to 128 MiB).
    #[arg(long, default_value_t = 128 << 20)]
    max_size: usize,
    /// Threads per team: a CTA's size on the GPU; host threads per channel on the cpu executor.
    #[arg(long)]
    team: Option<u32>,
    /// Bound of every device-side wait, ms.
    #[arg(long, default_value_t = 10_000)]
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

/// One rank's tables per mode, payloads checked, failures.
type RankOutcome = (Vec<(Mode, Vec<(String, Row)>)>, u64, u64);

/// Most bytes one bandwidth row moves per channel.
const ROW_BUDGET: usize = 512 << 20;

/// One row of output, computed on rank 0.
enum Row {
    Latency(LatencyRow),
    Bandwidth { channels: u32, bytes: usize, iters: u32, us_per_iter: f64, gbps: f64 },
    Flush { label: &'static str, iters: u32, us_per_op: f64 },
}

fn median_us(ns: &[u64]) -> f64 {
    let mut v = ns.to_vec();
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or(0) as f64 / 1e3
}

/// Runs every test of `mode` on this rank; returns the rows (rank 0) and the payloads checked.
fn run_mode(comm: &Arc<Communicator>, mode: Mode, args: &Args, team: u32) -> gdaki::Result<(Vec<(String, Row)>, u64)> {
    let timeout = Duration::from_millis(args.timeout_ms);
    let mut rows = Vec::new();
    let mut checked = 0;
    // 1 KiB, ×4 steps, and `max_size` itself as the last row.
    let mut sizes: Vec<usize> =
        std::iter::successors(Some(1024usize), |s| Some(s * 4)).take_while(|s| *s < args.max_size).collect();
    sizes.push(args.max_size.max(1024));
    let max = *sizes.last().unwrap_or(&1024);
    let cfg = |op, size, iters| RunConfig { op, size, iters, team, seed: 0x5eed_0000 ^ size as u64, timeout };
    let rank = comm.rank();
    let trace = |t: &mut PortTest, c: RunConfig| {
        if args.verbose {
            eprintln!("rank {rank}: {} op {} size {} x{} ...", mode.name(), c.op, c.size, c.iters);
        }
        let r = t.run(&c);
        if args.verbose {
            eprintln!(
                "rank {rank}: {} op {} size {}: {}",
                mode.name(),
                c.op,
                c.size,
                if r.is_ok() { "ok" } else { "failed" }
            );
        }
        r
    };
    // Ping-pong, 1 QP.
    {
        let mut t = PortTest::new(comm.clone(), mode, 1, 4096, args.iters as usize)?;
        t.set_blue_flame_limit(args.blue_flame_limit)?;
        for size in [8usize, 1024, 4096] {
            let r = trace(&mut t, cfg(op::PINGPONG, size, args.iters))?;
            checked += r.checked;
            if let Some(row) = LatencyRow::from_ns(size as u64, &r.iter_ns) {
                rows.push(("pingpong".to_string(), Row::Latency(row)));
            }
        }
    }
    // PacketPingPong (MSCCL++'s LL protocol), 1 QP: data and flags in one put, the receiver polls the flags.
    for (name, opc) in
        [("PacketPingPong (LL16)", op::PACKET_PINGPONG), ("PacketPingPong (LL8)", op::PACKET_PINGPONG_LL8)]
    {
        let mut t = PortTest::new(comm.clone(), mode, 1, max_size_for(opc, 4096), args.iters as usize)?;
        t.set_blue_flame_limit(args.blue_flame_limit)?;
        for size in [8usize, 1024, 4096] {
            let r = trace(&mut t, cfg(opc, size, args.iters))?;
            checked += r.checked;
            if let Some(row) = LatencyRow::from_ns(size as u64, &r.iter_ns) {
                rows.push((name.to_string(), Row::Latency(row)));
            }
        }
    }
    // Bandwidth: 1 QP and 4 QPs (the size is the total per iteration, split over the channels), one way and
    // both ways.
    for (name, opc, nch) in [("bw 1-QP", op::BW, 1u32), ("bw 4-QP", op::BW, 4), ("bibw 1-QP", op::BIBW, 1)] {
        let per_max = max / nch as usize;
        let mut t = PortTest::new(comm.clone(), mode, nch, per_max.max(8), args.iters as usize)?;
        t.set_blue_flame_limit(args.blue_flame_limit)?;
        for &total in &sizes {
            let per = (total / nch as usize).max(8);
            let iters = (ROW_BUDGET / per).clamp(3, args.iters as usize) as u32;
            let r = trace(&mut t, cfg(opc, per, iters))?;
            checked += r.checked;
            if !r.iter_ns.is_empty() {
                let ns: u64 = r.iter_ns.iter().sum();
                let dirs = if opc == op::BIBW { 2.0 } else { 1.0 };
                let gbps = dirs * (per * nch as usize) as f64 * iters as f64 / ns as f64;
                let row = Row::Bandwidth {
                    channels: nch,
                    bytes: total,
                    iters,
                    us_per_iter: ns as f64 / 1e3 / iters as f64,
                    gbps,
                };
                rows.push((name.to_string(), row));
            }
        }
    }
    // Flush stress (4 QPs, 1 KiB each) and same-channel concurrent flush (4 threads, 1 QP, 1 KiB).
    for (label, opc, nch) in
        [("flush stress 4-QP", op::FLUSH_STRESS, 4u32), ("concurrent flush 1-QP", op::SAME_CHANNEL_FLUSH, 1)]
    {
        let mut t = PortTest::new(comm.clone(), mode, nch, 1024, args.iters as usize)?;
        t.set_blue_flame_limit(args.blue_flame_limit)?;
        let r = trace(&mut t, cfg(opc, 1024, args.iters))?;
        checked += r.checked;
        if !r.iter_ns.is_empty() {
            rows.push((label.to_string(), Row::Flush { label, iters: args.iters, us_per_op: median_us(&r.iter_ns) }));
        }
    }
    Ok((rows, checked))
}

fn print_rows(mode: Mode, rows: &[(String, Row)]) {
    println!("\n## {}", mode.title());
    // One latency table per test (pingpong, then each PacketPingPong), in the order they ran.
    let mut tests: Vec<&str> = Vec::new();
    for (name, r) in rows {
        if matches!(r, Row::Latency(_)) && !tests.contains(&name.as_str()) {
            tests.push(name);
        }
    }
    for (i, test) in tests.iter().enumerate() {
        if i > 0 {
            println!();
        }
        println!("{}  test", LatencyRow::header());
        for (name, r) in rows {
            if let Row::Latency(l) = r {
                if name == test {
                    println!("{}  {name}", l.line());
                }
            }
        }
    }
    // Typical LL latency against the signal-based ping-pong, per size (MSCCL++'s reason for LL).
    for (name, r) in rows {
        if let (Row::Latency(l), true) = (r, name.starts_with("PacketPingPong")) {
            let base = rows.iter().find_map(|(n, r)| match r {
                Row::Latency(p) if n == "pingpong" && p.bytes == l.bytes => Some(p.t_typical),
                _ => None,
            });
            if let Some(b) = base.filter(|b| *b > 0.0) {
                println!("{name} {:>6} B: {:.2}x the pingpong's typical latency", l.bytes, l.t_typical / b);
            }
        }
    }
    println!(
        "{:>12} {:>8} {:>12} {:>8} {:>14} {:>12}  test",
        "#bytes", "#QPs", "bytes/QP", "#iters", "us/iter", "algbw[GB/s]"
    );
    for (name, r) in rows {
        if let Row::Bandwidth { channels, bytes, iters, us_per_iter, gbps } = r {
            println!(
                "{bytes:>12} {channels:>8} {:>12} {iters:>8} {us_per_iter:>14.2} {gbps:>12.3}  {name}",
                bytes / *channels as usize
            );
        }
    }
    println!("{:>24} {:>8} {:>16}", "test", "#iters", "us per put+flush");
    for (_, r) in rows {
        if let Row::Flush { label, iters, us_per_op } = r {
            println!("{label:>24} {iters:>8} {us_per_op:>16.2}");
        }
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let modes = args.mode.clone();
    let launch = match args.launch.two_ranks() {
        Ok(l) => l,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let (exec, notice) = match Executor::open(args.executor) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(n) = notice {
        eprintln!("note: {n}");
    }
    let kind = exec.kind();
    drop(exec);
    if let Err(why) = gdaki_examples::check_nic(&args.nic) {
        eprintln!("error: {why}");
        return ExitCode::from(2);
    }
    let nic = match &args.nic {
        NicSpec::Emu => "emulated mlx5 NIC over the wire".to_string(),
        real => format!("NIC {real}"),
    };
    let team = args.team.unwrap_or(if kind == ExecutorKind::Gpu { 128 } else { 4 });
    println!(
        "gdaki port_channel ({}): {} executor, team of {team} threads per channel, {nic}",
        env!("GDAKI_COMMIT"),
        if kind == ExecutorKind::Gpu { "gpu" } else { "cpu" }
    );
    // One rank's whole run: one communicator (bootstrap + NIC), every mode in turn, fresh channels per test.
    let rank_run = |launch: Launch, listener: Option<TcpListener>| -> RankOutcome {
        let timeout = Duration::from_secs(60);
        let mut listener = listener;
        let boot = match listener.take() {
            Some(l) => Bootstrap::root_on(l, &launch, timeout),
            None => Bootstrap::connect(&launch, timeout),
        };
        let comm = boot.and_then(|b| {
            let (exec, _) = Executor::open(Some(kind))?;
            Communicator::with_nic(b, exec, &args.nic, WireConfig::loopback())
        });
        let comm = match comm {
            Ok(c) => Arc::new(c),
            Err(e) => {
                eprintln!("error: rank {}: {e}", launch.rank);
                return (Vec::new(), 0, 1);
            }
        };
        let (mut out, mut passed, mut failed) = (Vec::new(), 0, 0);
        for &mode in &modes {
            match run_mode(&comm, mode, &args, team) {
                Ok((rows, n)) => {
                    passed += n;
                    out.push((mode, rows));
                }
                Err(e) => {
                    eprintln!("error: rank {}, {} sharing: {e}", launch.rank, mode.name());
                    failed += 1;
                    break;
                }
            }
        }
        (out, passed, failed)
    };
    let results = match launch {
        Some(l) => vec![rank_run(l, None)],
        None => {
            let listener = match TcpListener::bind("127.0.0.1:0") {
                Ok(l) => l,
                Err(e) => {
                    eprintln!("error: cannot listen on loopback: {e}");
                    return ExitCode::from(2);
                }
            };
            let root = listener.local_addr().map(|a| a.to_string()).unwrap_or_default();
            let secret = match Secret::random() {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::from(2);
                }
            };
            let mut listener = Some(listener);
            std::thread::scope(|s| {
                let hs: Vec<_> = (0..2u32)
                    .map(|rank| {
                        let l = Launch { rank, world_size: 2, root: root.clone(), secret, source: "this process" };
                        let lis = if rank == 0 { listener.take() } else { None };
                        let rank_run = &rank_run;
                        s.spawn(move || rank_run(l, lis))
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap_or((Vec::new(), 0, 1))).collect()
            })
        }
    };
    for (mode, rows) in &results[0].0 {
        print_rows(*mode, rows);
    }
    let passed: u64 = results.iter().map(|r| r.1).sum();
    let failed: u64 = results.iter().map(|r| r.2).sum();
    println!("\n{passed} passed, {failed} failed");
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
