//! `gdaki-perf`: MSCCL++'s one-to-one PortChannel tests, the rows of its GPUNetIO comparison (PingPong,
//! PacketPingPong LL16/LL8, bidirectional bandwidth, 1-QP and 4-QP bandwidth, flush stress, same-channel
//! concurrent flush), for Host, HostNoAtomic, Device-Exclusive, Device-Block and Device-Device, in one run on
//! one NIC. Prints one table per test with every mode side by side and its ratio to Host, a summary of the
//! Device/Host latency ratios against the targets, and last `N passed, M failed` (payloads checked, rows
//! failed); exits 1 when a row failed, 2 on bad flags or a missing GPU/NIC. `--json` and `--plot` write the
//! run down.
//!
//! Two ranks in this process (each with its own communicator and NIC, over the emulated NIC's wire), or one
//! rank per process with `--world-size 2 --rank R --bootstrap HOST:PORT` (or mpirun's environment).
//!
//! `cargo run --release -p gdaki-perf -- all --executor cpu`

mod cli;
mod coll;
mod plot;
mod report;
mod suite;
mod table;

use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use gdaki::channel::Communicator;
use gdaki::exec::{Executor, ExecutorKind};
use gdaki::nic::NicSpec;
use gdaki_testkit::porttest::bench::{run_test, Row, Step, Test};
use gdaki_testkit::porttest::Mode;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// One rank's rows, and 1 if it stopped at a failure.
type RankOutcome = (Vec<Row>, u64);

/// Each row's `checked` and the failure count summed over every rank (a bootstrap all-gather); rows pair up
/// in order, as every rank runs the same rows. A rank that failed early has fewer rows: the others' counts
/// cover the rows it ran. When the gather itself fails, this rank's own counts and one failure more.
fn gather_counts(comm: &Communicator, mut rows: Vec<Row>, failed: u64) -> RankOutcome {
    let mut mine = failed.to_le_bytes().to_vec();
    mine.extend(rows.iter().flat_map(|r| r.checked.to_le_bytes()));
    let all = match comm.bootstrap().all_gather(&mine) {
        Ok(all) => all,
        Err(e) => {
            gdaki_examples::eprintln_line!("error: rank {}: gathering the ranks' checked payloads: {e}", comm.rank());
            return (rows, failed + 1);
        }
    };
    let words = |b: &[u8]| b.chunks_exact(8).map(|w| u64::from_le_bytes(w.try_into().unwrap_or_default())).collect();
    let mut total_failed = 0;
    for (r, theirs) in all.iter().enumerate() {
        let theirs: Vec<u64> = words(theirs);
        total_failed += theirs.first().copied().unwrap_or(1);
        if r as u32 != comm.rank() {
            for (row, n) in rows.iter_mut().zip(theirs.iter().skip(1)) {
                row.checked += n;
            }
        }
    }
    (rows, total_failed)
}

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    // coll takes 2 to 8 ranks, the two-rank suites 2.
    let launch = match &cli.cmd {
        cli::Cmd::Coll(o) => Some((&o.launch, 2..=8)),
        c => c.split().map(|(_, o)| (&o.launch, 2..=2)),
    };
    if let Some(code) = launch.and_then(|(l, ranks)| l.spawn_processes(ranks)) {
        return code;
    }
    let res = match (&cli.cmd, cli.cmd.split()) {
        (cli::Cmd::Coll(o), _) => {
            gdaki_examples::apply_queues(None);
            coll::run(o)
        }
        (_, Some((cmd, opts))) => run(cmd, opts),
        (_, None) => Err("no such subcommand".to_string()),
    };
    match res {
        Ok(code) => code,
        Err(why) => {
            gdaki_examples::eprintln_line!("error: {why}");
            ExitCode::from(2)
        }
    }
}

/// The run's two header lines (rank 0 of a multi-process run prints them).
fn header(
    cmd: &str,
    machine: &str,
    nic: &str,
    plan: &gdaki_testkit::porttest::bench::Plan,
    modes: &[Mode],
    warmup: u32,
    kind: ExecutorKind,
) {
    let executor = if kind == ExecutorKind::Gpu { "gpu" } else { "cpu" };
    gdaki_examples::outln!(
        "gdaki-perf {cmd} ({}): {executor} executor on {machine}, {nic}, {}, queues in {} memory",
        gdaki_examples::COMMIT,
        Mode::team_words(modes, plan.team),
        gdaki_examples::queues_label(kind)
    );
    gdaki_examples::outln!(
        "{} iterations per latency row after up to {warmup} warm-up, bandwidth rows at most {} MiB ({}..={} \
         iterations); every payload checked",
        plan.iters,
        plan.byte_budget >> 20,
        // As `Plan::iters_for`: at least 3, but never more than `iters`.
        plan.iters.min(3),
        plan.iters
    );
}

/// The whole run; `Err` is a one-line reason to exit with code 2 before anything ran.
fn run(cmd: &str, opts: &cli::Opts) -> Result<ExitCode, String> {
    gdaki_examples::refuse_repeats("--mode", &opts.mode, |m| m.label())?;
    gdaki_examples::apply_queues(opts.queues);
    let tests = suite::tests(cmd);
    let sizes: Vec<(Test, Vec<usize>)> = tests.iter().map(|&t| (t, suite::sizes(t, opts))).collect();
    for (t, s) in &sizes {
        s.iter().try_for_each(|&b| t.check_size(b))?;
    }
    let launch = opts.launch.two_ranks()?;
    let (exec, notice) =
        Executor::open_on(opts.executor, opts.launch.gpu_of(launch.as_ref())).map_err(|e| e.to_string())?;
    if let Some(n) = notice {
        gdaki_examples::eprintln_line!("note: {n}");
    }
    let kind = exec.kind();
    let gpu = report::GpuInfo::of(&exec);
    gdaki_examples::check_nic(&opts.nic, &exec)?;
    drop(exec);
    let plan = suite::plan(opts, kind);
    // What the rows will run: each row's warm-up is the plan's, capped by a tenth of the row's iterations.
    let warmup =
        sizes.iter().flat_map(|(t, s)| s.iter().map(|&b| plan.warmup_for(plan.iters_for(*t, b)))).max().unwrap_or(0);
    let executor = if kind == ExecutorKind::Gpu { "gpu" } else { "cpu" };
    // `--one-nic` shares a NIC between the two ranks of this process; ranks in two processes each have their own.
    let one_nic = opts.one_nic && launch.is_none();
    if opts.one_nic && !one_nic {
        gdaki_examples::eprintln_line!(
            "note: --one-nic has no effect with one rank per process: each process has its own NIC"
        );
    }
    let nic = nic_description(&opts.nic, one_nic, launch.is_some());
    let prints = launch.as_ref().is_none_or(|l| l.rank == 0);
    let machine = match &gpu {
        Some(g) => format!("{} (CUDA {}, driver {})", g.name, g.cuda_driver, g.driver.as_deref().unwrap_or("?")),
        None => format!("{} host threads", std::thread::available_parallelism().map_or(1, |n| n.get())),
    };
    // Rank 0 writes --json and --plot: a file it could not write is an error before the run, not after it.
    if prints {
        if let Some(path) = &opts.json {
            gdaki_examples::create_json(Some(path))?;
        }
        if let Some(path) = &opts.plot {
            plot::check_name(path)?;
            plot::files(path, &tests).iter().try_for_each(|(file, _)| plot::check_file(file))?;
        }
        header(cmd, &machine, &nic, &plan, &opts.mode, warmup, kind);
    }
    let total: usize = sizes.iter().map(|(_, s)| s.len()).sum::<usize>() * opts.mode.len();
    let progress = Progress::new(total as u64, prints);
    let rank_rows = |comm: &Arc<Communicator>| -> RankOutcome {
        let comm = comm.clone();
        let rank = comm.rank();
        let mut rows = Vec::new();
        for (test, test_sizes) in &sizes {
            for &mode in &opts.mode {
                let at = std::cell::Cell::new(0);
                let step = |s: Step<'_>| {
                    if let Step::Start { bytes, .. } = s {
                        at.set(bytes);
                    }
                    if rank == 0 {
                        progress.step(s)
                    }
                };
                match run_test(&comm, mode, *test, test_sizes, &plan, step) {
                    Ok(r) => rows.extend(r),
                    Err(e) => {
                        let at = match at.get() {
                            0 => "setting up".to_string(),
                            b => format!("at {b} B"),
                        };
                        gdaki_examples::eprintln_line!(
                            "error: rank {rank}, {} in {}, {at}: {e}",
                            test.name(),
                            mode.label()
                        );
                        return (rows, 1);
                    }
                }
            }
        }
        (rows, 0)
    };
    let rank_main = |comm: Arc<Communicator>| -> RankOutcome {
        let (rows, failed) = rank_rows(&comm);
        // One rank per process: rank 0's table counts the payloads every rank checked (the receiving side
        // checks), so each rank adds its counts and failures to the others', over the bootstrap.
        if launch.is_some() {
            return gather_counts(&comm, rows, failed);
        }
        (rows, failed)
    };
    let results = gdaki_examples::run_ranks(launch.clone(), (kind, &opts.launch), &opts.nic, opts.one_nic, rank_main)?;
    progress.finish();
    let mut failed = 0;
    let mut per_rank: Vec<(u32, Vec<Row>)> = Vec::new();
    for (rank, r) in results {
        match r {
            Ok((rows, f)) => {
                failed += f;
                per_rank.push((rank, rows));
            }
            Err(e) => {
                gdaki_examples::eprintln_line!("error: rank {rank}: {e}");
                failed += 1;
            }
        }
    }
    let passed: u64 = per_rank.iter().flat_map(|(_, rows)| rows).map(|r| r.checked).sum();
    if !prints {
        // Rank 0 prints every rank's counts (gathered); this rank's errors went to standard error.
        return Ok(if failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE });
    }
    // Rank 0's rows carry the times; each row's count covers the ranks in this process (rows pair up in order).
    let mut rows = per_rank.iter().find(|(r, _)| *r == 0).map(|(_, rows)| rows.clone()).unwrap_or_default();
    for (_, other) in per_rank.iter().filter(|(r, _)| *r != 0) {
        for (row, o) in rows.iter_mut().zip(other) {
            row.checked += o.checked;
        }
    }
    table::print(&tests, &rows, opts.nic_stats);
    let summary = table::summary(&rows);
    table::print_summary(&summary);
    if let Some(path) = &opts.json {
        let report = report::Report {
            program: "gdaki-perf",
            subcommand: cmd,
            commit: gdaki_examples::COMMIT,
            date: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
            host: report::host_name(),
            executor,
            queues: gdaki_examples::queues_label(kind),
            gpu,
            host_threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            nic: opts.nic.to_string(),
            ranks_in_process: per_rank.len() == 2,
            one_nic,
            quick: opts.quick,
            iters: plan.iters,
            warmup: rows.iter().map(|r| r.warmup).max().unwrap_or(0),
            warmup_cap: plan.warmup,
            row_bytes: plan.byte_budget,
            team: plan.team,
            timeout_ms: plan.timeout.as_millis(),
            modes: opts.mode.iter().map(|m| m.label()).collect(),
            units: "latency: us per round trip (PingPong, PacketPingPong) or per put + flush (flush tests); \
                    bandwidth: us per iteration, GB/s = 1e9 bytes/s",
            rows: rows.iter().map(|r| report::JsonRow { row: r, vs_host: table::vs_host(&rows, r) }).collect(),
            summary: &summary,
            passed,
            failed,
        };
        if let Err(e) = report::write(path, &report) {
            gdaki_examples::eprintln_line!("error: {e}");
            failed += 1;
        }
    }
    if let Some(path) = &opts.plot {
        match plot::draw(path, &tests, &rows) {
            Ok(files) => {
                for f in files {
                    gdaki_examples::eprintln_line!("wrote {}", f.display());
                }
            }
            Err(e) => {
                gdaki_examples::eprintln_line!("error: {e}");
                failed += 1;
            }
        }
    }
    gdaki_examples::outln!("\n{passed} passed, {failed} failed");
    Ok(if failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// The NIC part of the header line: the emulated NIC shared by both ranks (`one_nic`), one per rank over the
/// wire (`processes`: one rank per process), or the RDMA device.
fn nic_description(spec: &NicSpec, one_nic: bool, processes: bool) -> String {
    match (spec, one_nic) {
        (NicSpec::Emu, true) => "one emulated mlx5 NIC shared by both ranks (no wire)".to_string(),
        (NicSpec::Emu, false) if processes => "an emulated mlx5 NIC per process, over the wire".to_string(),
        (NicSpec::Emu, false) => "an emulated mlx5 NIC per rank, over the wire (loopback TCP)".to_string(),
        (real, true) => format!("NIC {real} shared by both ranks"),
        (real, false) => format!("NIC {real}"),
    }
}

/// A progress bar on stderr that shows itself only after a couple of seconds and only on a terminal.
struct Progress {
    bar: ProgressBar,
    shown: Option<std::thread::JoinHandle<()>>,
}

impl Progress {
    /// Rows to go; `active` false: never shown (a rank that does not print).
    fn new(rows: u64, active: bool) -> Self {
        let bar = ProgressBar::with_draw_target(Some(rows), ProgressDrawTarget::hidden());
        if let Ok(style) = ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} rows  {msg}") {
            bar.set_style(style.progress_chars("=> "));
        }
        let shown = (active && std::io::stderr().is_terminal()).then(|| {
            let bar = bar.clone();
            std::thread::spawn(move || {
                let start = Instant::now();
                while !bar.is_finished() {
                    if start.elapsed() >= Duration::from_secs(2) {
                        bar.set_draw_target(ProgressDrawTarget::stderr());
                        bar.enable_steady_tick(Duration::from_millis(200));
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            })
        });
        Self { bar, shown }
    }

    fn step(&self, s: Step<'_>) {
        match s {
            Step::Start { test, mode, bytes, iters } => {
                self.bar.set_message(format!("{} {bytes} B, {} x{iters}", test.name(), mode.label()))
            }
            Step::Done(_) => self.bar.inc(1),
        }
    }

    fn finish(self) {
        self.bar.finish_and_clear();
        if let Some(h) = self.shown {
            let _ = h.join();
        }
    }
}
