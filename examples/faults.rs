//! Runs every fault of `gdaki_testkit::faults` (bad keys, bounds, rights, alignment, zero-byte WRITEs, SQ full, CQ
//! overrun, a doorbell never rung or past the ring, malformed WQEs, a peer process killed with SIGKILL
//! mid-transfer, an unreachable peer, an error CQE during a semaphore wait) on the emulated NIC with device code on
//! host threads (the `cpu` executor), and prints one row per fault: expected and observed outcome (syndrome and the
//! emulator's vendor syndrome, or completion / timeout / overrun), the QP state, bytes changed outside the
//! permitted range, how long the waiter waited and its bound, and the result. Failed checks follow the table;
//! the last line is `N passed, M failed`, and the exit code is 1 when any case failed.
//!
//! `cargo run --example faults` (all cases), `cargo run --example faults -- wire` (cases whose name contains
//! `wire`), `-v` to list every case's checks under its row, `--help` for the flags. Exit code 2 for bad
//! arguments, a `GDAKI_QUEUES` other than `gpu` or `host`, or a filter no case name matches. The SIGKILL case starts this program again as its peer, with the
//! hidden flag `--peer`.

use std::io::Write;
use std::process::{Command, ExitCode};

use clap::Parser;
use gdaki_testkit::faults::{self, Ctx, Report};

/// The hidden flag (`--peer`) that makes this program the SIGKILL case's peer.
const PEER_FLAG: &str = "peer";

/// The command line.
#[derive(Parser, Debug)]
#[command(
    about = "Runs every fault of gdaki's emulated mlx5 NIC (cpu executor) and prints expected and observed \
             outcomes per case",
    long_about = "Runs every fault of gdaki's emulated mlx5 NIC with device code on host threads (bad keys, \
                  bounds, rights, alignment, SQ full, CQ overrun, a doorbell never rung or past the ring, \
                  malformed WQEs, a peer killed with SIGKILL mid-transfer, an unreachable peer, ...) and prints one \
                  row per case: expected and observed outcome, QP state, bytes changed outside the permitted range, how long \
                  the waiter waited and its bound, and the result. The last line is `N passed, M failed`.\n\n\
                  Exit codes: 0 when every case passed, 1 when one failed, 2 for bad arguments, a GDAKI_QUEUES \
                  other than gpu or host, or a NAME-SUBSTRING that no case name contains.",
    after_help = "Examples: `faults` (every case), `faults wire` (the cases whose name contains `wire`), \
                  `faults -v \"SQ full\"`, `faults --list`."
)]
struct Args {
    /// List every check of each case under its row.
    #[arg(short, long)]
    verbose: bool,
    /// Print the names of the cases (those NAME-SUBSTRING selects) instead of running them.
    #[arg(long)]
    list: bool,
    /// Run only the cases whose name contains this (default: all).
    #[arg(value_name = "NAME-SUBSTRING")]
    filter: Option<String>,
    /// Be the SIGKILL case's peer (this program, started again by that case; not for interactive use).
    #[arg(long = PEER_FLAG, hide = true)]
    peer: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    if args.peer {
        return match faults::run_peer(std::io::stdin().lock(), std::io::stdout()) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                gdaki_examples::eprintln_line!("faults peer: {e}");
                ExitCode::FAILURE
            }
        };
    }
    // A malformed GDAKI_QUEUES is refused here, before the header names a placement.
    gdaki_examples::apply_queues(None);
    let verbose = args.verbose;
    let filter = args.filter.unwrap_or_default();
    let cases: Vec<_> = faults::catalogue().into_iter().filter(|c| c.name.contains(filter.as_str())).collect();
    if cases.is_empty() {
        gdaki_examples::eprintln_line!("no case name contains {filter:?} (`faults --list` prints the names)");
        return ExitCode::from(2);
    }
    if args.list {
        for c in &cases {
            gdaki_examples::outln!("{}", c.name);
        }
        return ExitCode::SUCCESS;
    }
    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            gdaki_examples::eprintln_line!(
                "faults: cannot find this program's path (the SIGKILL case restarts it): {e}"
            );
            return ExitCode::FAILURE;
        }
    };
    let ctx = Ctx::new(move || {
        let mut c = Command::new(&exe);
        c.arg(format!("--{PEER_FLAG}"));
        c
    });

    let name_w = cases.iter().map(|c| c.name.len()).max().unwrap_or(5).max(5);
    let out_w = 38;
    gdaki_examples::outln!(
        "# gdaki faults on the emulated NIC, cpu executor, queues in {} memory (GDAKI_QUEUES; commit {})",
        gdaki_examples::queues_label(gdaki::exec::ExecutorKind::Cpu),
        env!("GDAKI_COMMIT")
    );
    gdaki_examples::outln!(
        "{:<name_w$}  {:<out_w$}  {:<out_w$}  {:<5}  {:>7}  {:>10}  {:>8}  result",
        "fault",
        "expected",
        "observed",
        "QP",
        "outside",
        "waited ms",
        "bound ms"
    );
    let mut reports: Vec<Report> = Vec::new();
    for case in &cases {
        let r = case.run(&ctx);
        let state = r.qp_state.map_or("-".to_string(), |s| format!("{s:?}"));
        let outside = r.outside_changed.map_or("-".to_string(), |n| n.to_string());
        let clip = |s: String| {
            if s.chars().count() > out_w {
                format!("{}…", s.chars().take(out_w - 1).collect::<String>())
            } else {
                s
            }
        };
        gdaki_examples::outln!(
            "{:<name_w$}  {:<out_w$}  {:<out_w$}  {:<5}  {:>7}  {:>10.3}  {:>8.0}  {}",
            r.name,
            clip(r.expected.to_string()),
            clip(r.observed.to_string()),
            state,
            outside,
            r.waited.as_secs_f64() * 1e3,
            r.bound.as_secs_f64() * 1e3,
            if r.pass { "ok" } else { "FAIL" }
        );
        if verbose {
            for c in &r.checks {
                gdaki_examples::outln!("    {} {}", if c.ok { "ok  " } else { "FAIL" }, c.what);
            }
        }
        let _ = std::io::stdout().flush();
        reports.push(r);
    }
    let failed: Vec<&Report> = reports.iter().filter(|r| !r.pass).collect();
    for r in &failed {
        gdaki_examples::outln!("{} failed:", r.name);
        for f in r.failures() {
            gdaki_examples::outln!("  - {f}");
        }
    }
    gdaki_examples::outln!("{} passed, {} failed", reports.len() - failed.len(), failed.len());
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
