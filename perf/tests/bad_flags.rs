//! Flags `gdaki-perf` cannot run as asked are refused before anything runs: exit code 2, nothing on standard
//! output, and an error naming the flag on standard error (never a run that prints a table it did not measure).

use std::process::Command;

/// Runs `gdaki-perf` with `args` on the cpu executor; asserts it refused them (exit 2, no output) and returns
/// standard error's first line.
fn refused(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_gdaki-perf")).args(args).args(["--executor", "cpu"]).output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(2), "{args:?}: exit {:?}\n{stdout}\n{stderr}", out.status);
    assert!(stdout.is_empty(), "{args:?} ran:\n{stdout}");
    let first = stderr.lines().next().unwrap_or_default().to_string();
    assert!(first.starts_with("error: "), "{args:?}: {stderr}");
    first
}

/// `-w` and `-n` of `coll` are bounded so that their sum, each placement's loop, cannot wrap (a warm-up of
/// 2^32 - 1 plus one iteration ran no timed iteration and printed a row of NaN that passed).
#[test]
fn coll_warmup_past_its_bound_is_refused() {
    let base = ["coll", "--nranks", "2", "--op", "broadcast", "--algorithm", "direct", "-b", "8", "-e", "8"];
    let line = refused(&[&base[..], &["-n", "1", "-w", "4294967295"]].concat());
    assert!(line.contains("--warmup"), "{line}");
    let line = refused(&[&base[..], &["-n", "1", "-w", "1000001"]].concat());
    assert!(line.contains("1000001"), "{line}");
    let line = refused(&[&base[..], &["-n", "1000001"]].concat());
    assert!(line.contains("--iters"), "{line}");
}

/// `-b`/`-e` of `coll` above 1G per rank are refused as flags (2^62 aborted on allocating its payload, and
/// 2^64 - 1 ran with a buffer whose size had wrapped).
#[test]
fn coll_sizes_past_the_limit_are_refused() {
    let base = ["coll", "--nranks", "2", "--op", "broadcast", "--algorithm", "direct", "-n", "1"];
    for sizes in [
        ["-b", "8", "-e", "4611686018427387904"],
        ["-b", "8", "-e", "18446744073709551615"],
        ["-b", "8", "-e", "1025M"],
        ["-b", "2G", "-e", "4G"],
    ] {
        let line = refused(&[&base[..], &sizes].concat());
        assert!(line.contains("1G"), "{sizes:?}: {line}");
    }
}

/// A value named twice in `--op`, `--algorithm` or `--mode` is refused, naming it (each printed its table or
/// row twice, `coll`'s tables each with the rows of both).
#[test]
fn a_list_value_named_twice_is_refused() {
    let coll = ["coll", "--nranks", "2", "-b", "8", "-e", "8", "-n", "1"];
    let line = refused(&[&coll[..], &["--op", "broadcast,broadcast", "--algorithm", "direct"]].concat());
    assert_eq!(line, "error: --op names broadcast twice");
    let line = refused(&[&coll[..], &["--op", "reduce,all_reduce", "--algorithm", "direct,tree,direct"]].concat());
    assert_eq!(line, "error: --algorithm names direct twice");
    let line = refused(&["pingpong", "--mode", "host,exclusive,host", "-n", "3", "-s", "8"]);
    assert_eq!(line, "error: --mode names Host twice");
}

/// A `coll` op none of whose sizes holds a whole element is refused (reduce's `f32`s from 1 to 3 bytes: each
/// size rounded down to 0 and left out, an empty table that passed).
#[test]
fn coll_op_without_a_size_is_refused() {
    let line = refused(&["coll", "--nranks", "2", "--op", "broadcast,reduce", "-b", "1", "-e", "3", "-n", "1"]);
    assert_eq!(line, "error: --op reduce: no size from -b 1 to -e 3 holds a whole element of 4 bytes");
}

/// `--json` and `--plot` files the run could not write are refused before it runs, on every subcommand
/// (the two-rank suites checked them only after the whole run); a `--plot` chart a subcommand does not
/// draw is not checked, and the check leaves no file behind.
#[test]
fn unwritable_json_and_plot_files_are_refused_before_running() {
    let run = ["pingpong", "--mode", "exclusive", "-n", "3", "-s", "8"];
    let line = refused(&[&run[..], &["--json", "/proc/no-such-dir/run.json"]].concat());
    assert!(line.starts_with("error: --json /proc/no-such-dir/run.json: "), "{line}");
    let line = refused(&[&run[..], &["--plot", "/proc/no-such-dir/run.png"]].concat());
    assert!(line.starts_with("error: --plot /proc/no-such-dir/run.png: "), "{line}");
    let dir = std::env::temp_dir().join(format!("gdaki-perf-bad-plot-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let svg = dir.join("run.svg");
    let line = refused(&[&run[..], &["--plot", svg.to_str().unwrap()]].concat());
    assert!(line.starts_with(&format!("error: --plot {}: ", svg.display())), "{line}");
    // bw draws only PATH-bw.png: that file is the one checked.
    let line = refused(&["bw", "--mode", "exclusive", "-n", "3", "-s", "4096", "--plot", "/proc/no-such-dir/run.png"]);
    assert!(line.starts_with("error: --plot /proc/no-such-dir/run-bw.png: "), "{line}");
    let line = refused(&["coll", "--nranks", "2", "--op", "reduce", "-e", "8", "-n", "1", "--plot", "/proc/x/c.png"]);
    assert!(line.starts_with("error: --plot /proc/x/c.png: "), "{line}");
    // A run that may write its chart: pingpong's latency chart only, and no empty bandwidth chart beside it.
    let png = dir.join("run.png");
    let out = Command::new(env!("CARGO_BIN_EXE_gdaki-perf"))
        .args([&run[..], &["--executor", "cpu", "--plot"]].concat())
        .arg(&png)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(std::fs::metadata(&png).unwrap().len() > 0);
    assert!(!dir.join("run-bw.png").exists());
    std::fs::remove_dir_all(&dir).ok();
}

/// The two-rank suites' `--timeout-ms 0`, `--team 0` and sizes past 1 GiB are refused as flags (each ran
/// into a per-rank error after the header and exited 1), and so is `coll --timeout 0s` as `--timeout 0` is.
#[test]
fn zero_timeouts_and_teams_and_huge_sizes_are_refused() {
    let run = ["pingpong", "--mode", "exclusive", "-n", "3"];
    for (flag, value) in [
        ("--timeout-ms", "0"),
        ("--timeout-ms", "86400001"),
        ("--team", "0"),
        ("--team", "1025"),
        ("-s", "18446744073709551615"),
        ("-s", "1073741825"),
        ("-s", "0"),
    ] {
        let line = refused(&[&run[..], &[flag, value]].concat());
        assert!(line.starts_with(&format!("error: invalid value '{value}'")), "{flag} {value}: {line}");
    }
    let coll = ["coll", "--nranks", "2", "--op", "reduce", "-e", "8", "-n", "1"];
    for timeout in ["0", "0s", "0ms", "1e-12", "-1", "NaN", "1000000", "12days"] {
        let flag = format!("--timeout={timeout}");
        let line = refused(&[&coll[..], &[flag.as_str()]].concat());
        assert!(line.starts_with(&format!("error: invalid value '{timeout}' for '--timeout")), "{timeout}: {line}");
    }
}

/// `--plot` names a PNG file whatever charts the subcommand draws: a bandwidth-only run (`bw`) drew PATH's stem
/// + "-bw.png" and took `chart.svg` without a word.
#[test]
fn a_plot_path_that_is_not_png_is_refused_for_bandwidth_only_runs_too() {
    let line = refused(&["bw", "--plot", "/tmp/gdaki-chart.svg", "-s", "1024"]);
    assert!(line.contains("--plot /tmp/gdaki-chart.svg") && line.contains(".png"), "{line}");
}

/// `coll` refuses a malformed `GDAKI_QUEUES` before its header, as the two-rank suites do (every rank's NIC
/// refused to open after the header had named a placement).
#[test]
fn coll_refuses_a_malformed_queues_variable_first() {
    let out = Command::new(env!("CARGO_BIN_EXE_gdaki-perf"))
        .args(["coll", "--nranks", "2", "--op", "broadcast", "-b", "8", "-e", "8", "-n", "1", "--executor", "cpu"])
        .env("GDAKI_QUEUES", "bogus")
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(2), "{stdout}\n{stderr}");
    assert!(stdout.is_empty(), "it ran:\n{stdout}");
    assert_eq!(stderr.trim_end(), "error: GDAKI_QUEUES=\"bogus\": queues must be gpu or host (or GDAKI_QUEUES unset)");
}

/// `--row-mib 0` ran every bandwidth row anyway, under a header that promised "at most 0 MiB" per row.
#[test]
fn a_row_budget_of_nothing_is_refused() {
    let line = refused(&["bw", "--mode", "exclusive", "--quick", "--row-mib", "0"]);
    assert!(line.starts_with("error: invalid value '0' for '--row-mib <ROW_MIB>'"), "{line}");
}
