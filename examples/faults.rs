//! Runs every fault of `gdaki_testkit::faults` (bad keys, bounds, rights, alignment, zero-byte WRITEs, SQ full, CQ
//! overrun, a doorbell never rung, malformed WQEs, a peer process killed with SIGKILL mid-transfer, an
//! unreachable peer, an error CQE during a semaphore wait) on the emulated NIC with device code on host threads
//! (the `cpu` executor), and prints one row per fault: expected and observed outcome (syndrome and the
//! emulator's vendor syndrome, or completion / timeout / overrun), the QP state, bytes changed outside the
//! permitted range, how long the waiter waited and its bound, and the result. Failed checks follow the table;
//! the last line is `N passed, M failed`, and the exit code is 1 when any case failed.
//!
//! `cargo run --example faults` (all cases), `cargo run --example faults -- wire` (cases whose name contains
//! `wire`), `-v` to list every case's checks under its row. The SIGKILL case starts this program again as its
//! peer, with the hidden argument `--peer`.

use std::io::Write;
use std::process::{Command, ExitCode};

use gdaki_testkit::faults::{self, Ctx, Report};

/// The hidden argument that makes this program the SIGKILL case's peer.
const PEER_ARG: &str = "--peer";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some(PEER_ARG) {
        return match faults::run_peer(std::io::stdin().lock(), std::io::stdout()) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("faults peer: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let verbose = args.iter().any(|a| a == "-v" || a == "--verbose");
    let rest: Vec<&String> = args.iter().filter(|a| *a != "-v" && *a != "--verbose").collect();
    if rest.len() > 1 || rest.first().is_some_and(|a| a.starts_with('-')) {
        eprintln!("usage: faults [-v] [NAME-SUBSTRING]");
        eprintln!("  runs the cases whose name contains NAME-SUBSTRING (all without one); -v lists every check");
        return ExitCode::from(2);
    }
    let filter = rest.first().map(|s| s.to_string()).unwrap_or_default();
    let cases: Vec<_> = faults::catalogue().into_iter().filter(|c| c.name.contains(filter.as_str())).collect();
    if cases.is_empty() {
        eprintln!("no case name contains {filter:?}");
        return ExitCode::from(2);
    }
    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("faults: cannot find this program's path (the SIGKILL case restarts it): {e}");
            return ExitCode::FAILURE;
        }
    };
    let ctx = Ctx::new(move || {
        let mut c = Command::new(&exe);
        c.arg(PEER_ARG);
        c
    });

    let name_w = cases.iter().map(|c| c.name.len()).max().unwrap_or(5).max(5);
    let out_w = 38;
    println!("# gdaki faults on the emulated NIC, cpu executor (commit {})", env!("GDAKI_COMMIT"));
    println!(
        "{:<name_w$}  {:<out_w$}  {:<out_w$}  {:<5}  {:>7}  {:>10}  {:>8}  result",
        "fault", "expected", "observed", "QP", "outside", "waited ms", "bound ms"
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
        println!(
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
                println!("    {} {}", if c.ok { "ok  " } else { "FAIL" }, c.what);
            }
        }
        let _ = std::io::stdout().flush();
        reports.push(r);
    }
    let failed: Vec<&Report> = reports.iter().filter(|r| !r.pass).collect();
    for r in &failed {
        println!("{} failed:", r.name);
        for f in r.failures() {
            println!("  - {f}");
        }
    }
    println!("{} passed, {} failed", reports.len() - failed.len(), failed.len());
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
