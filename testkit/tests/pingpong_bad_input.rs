//! Bad input to the ping-pong harness: the `pingpong` example's command line and the `PingPong` host API
//! (zero and absurd sizes, configs refused before running, a failed run). Every case asserts the one outcome
//! the code has.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use gdaki::exec::{Executor, ExecutorKind};
use gdaki_testkit::pingpong::{PingPong, RunConfig};

/// Asserts that `msg` is one non-empty line.
fn one_line(msg: &str) {
    assert!(!msg.trim().is_empty() && !msg.trim_end().contains('\n'), "not one line: {msg:?}");
}

/// Asserts that `r` is an `InvalidArgument` whose message is one line mentioning every word of `words`.
fn host_inval<T: std::fmt::Debug>(r: gdaki::Result<T>, words: &[&str]) {
    match r {
        Err(e @ gdaki::Error::InvalidArgument(_)) => {
            let m = e.to_string();
            one_line(&m);
            for w in words {
                assert!(m.contains(w), "{m:?} does not mention {w:?}");
            }
        }
        other => panic!("expected InvalidArgument mentioning {words:?}, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------------------
// The pingpong example's command line
// ---------------------------------------------------------------------------------------------------------

/// The `pingpong` example binary of this target directory (built by `cargo test --workspace` or
/// `cargo build --example pingpong`), or `GDAKI_PINGPONG` when set. A missing one fails the test rather than
/// skipping it.
fn pingpong_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("GDAKI_PINGPONG") {
        return p.into();
    }
    // This test runs from <target>/<profile>/deps/; examples are in <target>/<profile>/examples/.
    let exe = std::env::current_exe().expect("this test's path");
    let bin = exe.parent().and_then(|d| d.parent()).expect("a target directory").join("examples");
    let bin = bin.join(format!("pingpong{}", std::env::consts::EXE_SUFFIX));
    assert!(
        bin.is_file(),
        "the pingpong example is not built: run `cargo build --example pingpong` or `cargo xtask test`"
    );
    bin
}

/// Runs the example with `args` (stdin closed), at most 60 s. The example must be built (`cargo test
/// --workspace`, the test command, builds it): a missing one fails the test rather than skipping it.
fn pingpong(args: &[&str]) -> Output {
    pingpong_in(&[], args)
}

/// [`pingpong`] with the variables `env` added to its environment.
fn pingpong_in(env: &[(&str, &str)], args: &[&str]) -> Output {
    let bin = pingpong_bin();
    let mut child = Command::new(&bin)
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()));
    let t = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("pingpong {args:?} hung");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Asserts that the example exited with `code`, did not panic, and that its stderr's first line starts with
/// `error:` and contains `needle`.
fn assert_cli_error(out: &Output, code: i32, needle: &str) {
    let (so, se) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(code), "exit status; stdout {so:?} stderr {se:?}");
    assert!(!se.contains("panicked") && !se.contains("RUST_BACKTRACE"), "it panicked: {se}");
    let first = se.lines().find(|l| l.starts_with("error")).unwrap_or_else(|| panic!("no error line in {se:?}"));
    assert!(first.contains(needle), "{first:?} does not mention {needle:?}");
}

#[test]
fn cli_rejects_out_of_range_and_malformed_numbers_before_running() {
    let cases: &[(&[&str], &str)] = &[
        (&["--size", "0"], "--size"),
        (&["--size", "-1"], "-1"),
        (&["--size", "1073741825"], "--size"),
        (&["--size", "99999999999999999999999"], "--size"),
        (&["--size", "8k"], "--size"),
        (&["--iters", "0"], "--iters"),
        (&["--iters", "-5"], "-5"),
        (&["--iters", "10000001"], "--iters"),
        (&["--warmup", "-1"], "-1"),
        (&["--warmup", "4294967296"], "--warmup"),
        (&["--timeout-ms", "-1"], "-1"),
        (&["--timeout-ms", "1.5"], "--timeout-ms"),
        (&["--seed", "-1"], "-1"),
        (&["--json"], "--json"),
        (&["--frobnicate"], "--frobnicate"),
        (&["--size"], "--size"),
    ];
    for (args, needle) in cases {
        let mut all = vec!["--executor", "cpu"];
        all.extend_from_slice(args);
        let out = pingpong(&all);
        assert_cli_error(&out, 2, needle);
        // Nothing ran: no table.
        assert!(!text(&out.stdout).contains("#bytes"), "{args:?} ran anyway");
    }
}

#[test]
fn cli_unknown_executor_is_a_one_line_error() {
    for bad in ["tpu", "", "CPU", " cpu", "cpu,gpu"] {
        let out = pingpong(&["--executor", bad]);
        assert_cli_error(&out, 2, "executor must be cpu or gpu");
    }
}

#[test]
fn cli_gpu_executor_without_a_gpu_is_a_one_line_error() {
    if Executor::open(Some(ExecutorKind::Gpu)).is_ok() {
        eprintln!("skipped: this machine has a GPU");
        return;
    }
    let out = pingpong(&["--executor", "gpu", "--iters", "1"]);
    assert_cli_error(&out, 2, "error:");
    assert_eq!(text(&out.stderr).lines().count(), 1, "{:?}", text(&out.stderr));
}

#[test]
fn cli_processes_runs_two_ranks_and_refuses_what_cannot_work() {
    // Two processes, one rank each: rank 0 prints the table and both check every payload.
    let out = pingpong(&["--executor", "cpu", "--iters", "3", "--size", "24", "--processes", "2"]);
    let so = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{so} {}", text(&out.stderr));
    assert_eq!(so.lines().filter(|l| l.split_whitespace().take(2).eq(["24", "3"])).count(), 1, "{so:?}");
    // Flags that place one process cannot go with --processes.
    let out = pingpong(&["--processes", "2", "--rank", "0"]);
    assert_cli_error(&out, 2, "--processes");
    let out = pingpong(&["--processes", "0"]);
    assert_cli_error(&out, 2, "--processes");
    // A rank that fails (rank 0 alone writes --json) is named with how it ended, the launch exits with its
    // code, and the rank left waiting for it is stopped, not waited for until its bootstrap gives up.
    let t = Instant::now();
    let out = pingpong(&["--executor", "cpu", "--processes", "2", "--json", "/proc/no-such-dir/x.json"]);
    let se = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{se}");
    assert!(se.contains("--processes: rank 0 ended with exit status: 2"), "{se}");
    assert!(se.contains("--processes: rank 1 was stopped") && se.contains("after rank 0 failed"), "{se}");
    assert!(t.elapsed() < Duration::from_secs(20), "took {:?}", t.elapsed());
    // Three processes of a two-rank program, or any number under a launcher: refused before one starts.
    let out = pingpong(&["--executor", "cpu", "--processes", "3"]);
    assert_cli_error(&out, 2, "--processes 3: this program takes 2 ranks");
    assert_eq!(text(&out.stderr).lines().count(), 1, "{}", text(&out.stderr));
    // A wire port every process would listen on: refused before one starts (port 0 gives each a free one).
    let out = pingpong(&["--executor", "cpu", "--processes", "2", "--wire", "127.0.0.1:45123"]);
    assert_cli_error(&out, 2, "--processes 2: --wire 127.0.0.1:45123 names a port");
    assert_eq!(text(&out.stderr).lines().count(), 1, "{}", text(&out.stderr));
    let ompi = [("OMPI_COMM_WORLD_RANK", "0"), ("OMPI_COMM_WORLD_SIZE", "2")];
    let out = pingpong_in(&ompi, &["--executor", "cpu", "--processes", "2"]);
    assert_cli_error(&out, 2, "--processes 2: this process is rank 0 of a launch by mpirun (OMPI_*) already");
    // A world of one (a Slurm batch script's environment) is no launch: --processes runs.
    let slurm = [("SLURM_PROCID", "0"), ("SLURM_NTASKS", "1")];
    let out = pingpong_in(&slurm, &["--executor", "cpu", "--iters", "2", "--processes", "2"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}

#[test]
fn cli_zero_timeout_is_refused_before_running() {
    // A round trip cannot finish within 0 ns: the bound must be at least 1 ms.
    let out = pingpong(&["--executor", "cpu", "--iters", "3", "--timeout-ms", "0"]);
    assert_cli_error(&out, 2, "--timeout-ms");
    assert!(!text(&out.stdout).contains("#bytes"), "it ran: {}", text(&out.stdout));
}

#[test]
fn cli_warmup_larger_than_iters_runs() {
    let out = pingpong(&["--executor", "cpu", "--iters", "2", "--warmup", "30", "--size", "13"]);
    let so = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{so} {}", text(&out.stderr));
    // Every payload of warm-up and measured round trips is checked, on both ranks.
    assert!(so.trim_end().ends_with("64 passed, 0 failed"), "{so:?}");
    // The table has the measured iterations only.
    assert!(so.lines().any(|l| l.split_whitespace().take(2).eq(["13", "2"])), "{so:?}");
}

/// One rank per process (`--processes 2`): rank 0 alone prints, and its summary counts both ranks' checks, the
/// same 64 as the run of both ranks in one process above.
#[test]
fn cli_two_processes_print_once_and_count_both_ranks() {
    let args = ["--executor", "cpu", "--iters", "2", "--warmup", "30", "--size", "13", "--processes", "2"];
    let out = pingpong(&args);
    let so = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{so} {}", text(&out.stderr));
    assert!(so.trim_end().ends_with("64 passed, 0 failed"), "{so:?}");
    assert_eq!(so.matches("gdaki pingpong (").count(), 1, "one header: {so:?}");
    assert_eq!(so.matches(" passed, ").count(), 1, "one summary: {so:?}");
}

#[test]
fn cli_warmup_plus_iters_overflow_is_an_error_not_a_panic() {
    let out = pingpong(&["--executor", "cpu", "--iters", "5", "--warmup", "4294967295"]);
    assert_cli_error(&out, 2, "--warmup");
}

#[test]
fn cli_json_to_a_directory_or_missing_folder_is_a_one_line_error() {
    let dir = std::env::temp_dir().join(format!("gdaki-bad-input-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let missing = dir.join("no/such/folder/out.json");
    for path in [dir.clone(), missing] {
        let p = path.to_str().unwrap();
        let out = pingpong(&["--executor", "cpu", "--iters", "2", "--json", p]);
        assert_cli_error(&out, 2, &format!("--json {p}"));
    }
    assert!(dir.is_dir(), "the directory given as --json was replaced");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn cli_unwritable_json_path_is_refused_before_running() {
    let dir = std::env::temp_dir();
    let p = dir.to_str().unwrap();
    let out = pingpong(&["--executor", "cpu", "--iters", "2", "--json", p]);
    assert_cli_error(&out, 2, "--json");
    assert!(!text(&out.stdout).contains("#bytes"), "it ran the benchmark first: {}", text(&out.stdout));
}

#[test]
fn cli_closed_stdout_does_not_panic_and_still_writes_json() {
    let bin = pingpong_bin();
    let json = std::env::temp_dir().join(format!("gdaki-bad-input-{}.json", std::process::id()));
    let mut child = Command::new(bin)
        .args(["--executor", "cpu", "--iters", "2", "--json", json.to_str().unwrap()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // A reader that went away, as `| head -1` does.
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let se = text(&out.stderr);
    let written = std::fs::read_to_string(&json);
    let _ = std::fs::remove_file(&json);
    assert!(!se.contains("panicked"), "{se}");
    assert!(written.is_ok_and(|j| j.contains("\"passed\"")), "no JSON written; stderr {se}");
}

// ---------------------------------------------------------------------------------------------------------
// PingPong (host API)
// ---------------------------------------------------------------------------------------------------------

#[test]
fn pingpong_new_rejects_zero_and_huge_sizes() {
    host_inval(PingPong::new(Executor::Cpu, 0, 10).map(|_| ()), &["size"]);
    host_inval(PingPong::new(Executor::Cpu, 8, 0).map(|_| ()), &["iterations"]);
    // 2^62 bytes: the send buffer's allocation fails (no address space holds it). isize::MAX rounds up to
    // 2^63 bytes (a multiple of 8), which no allocation layout can describe.
    match PingPong::new(Executor::Cpu, 1 << 62, 1) {
        Err(gdaki::Error::OutOfMemory(n)) => assert_eq!(n, 1 << 62),
        Err(e) => panic!("2^62 bytes: expected OutOfMemory, got {e:?}"),
        Ok(_) => panic!("2^62 bytes: allocated?"),
    }
    match PingPong::new(Executor::Cpu, isize::MAX as usize, 1) {
        Err(e @ gdaki::Error::InvalidArgument(_)) => {
            assert_eq!(e.to_string(), "invalid argument: a host buffer of 9223372036854775808 bytes is too large")
        }
        Err(e) => panic!("isize::MAX bytes: expected InvalidArgument, got {e:?}"),
        Ok(_) => panic!("isize::MAX bytes: allocated?"),
    }
}

#[test]
fn pingpong_new_size_that_overflows_rounding_is_an_error() {
    match PingPong::new(Executor::Cpu, usize::MAX, 1) {
        Err(e @ gdaki::Error::InvalidArgument(_)) => {
            assert_eq!(e.to_string(), "invalid argument: ping-pong of 18446744073709551615 bytes × 1 iterations")
        }
        Err(e) => panic!("expected InvalidArgument, got {e:?}"),
        Ok(_) => panic!("usize::MAX bytes: created?"),
    }
}

#[test]
fn pingpong_new_iteration_count_that_overflows_is_an_error() {
    host_inval(PingPong::new(Executor::Cpu, 8, (1usize << 61) + 1).map(|_| ()), &["iter"]);
}

#[test]
fn pingpong_run_rejects_bad_configs_and_still_runs_afterwards() {
    let mut pp = PingPong::new(Executor::Cpu, 64, 10).unwrap();
    let ok = RunConfig { size: 13, iters: 4, warmup: 6, seed: 3, timeout: Duration::from_secs(10), blueflame: false };
    for (bad, what) in [
        (RunConfig { size: 0, ..ok }, "size 0"),
        (RunConfig { size: 65, ..ok }, "size 65"),
        (RunConfig { blueflame: true, ..ok }, "size 13 by BlueFlame"),
        (RunConfig { size: usize::MAX, ..ok }, "size usize::MAX"),
        (RunConfig { iters: 0, warmup: 3, ..ok }, "iters 0"),
        (RunConfig { iters: 5, warmup: 6, ..ok }, "warmup + iters 11"),
        (RunConfig { iters: u32::MAX, warmup: 0, ..ok }, "iters u32::MAX"),
    ] {
        match pp.run(&bad) {
            Err(e @ gdaki::Error::InvalidArgument(_)) => one_line(&e.to_string()),
            other => panic!("{what}: {other:?}"),
        }
    }
    // The size rounds up to 8 bytes inside: the whole rounded buffer is usable, one more byte is not.
    let mut pp7 = PingPong::new(Executor::Cpu, 61, 2).unwrap();
    assert_eq!(pp7.run(&RunConfig { size: 64, iters: 2, warmup: 0, ..ok }).unwrap().checked, 4);
    match pp7.run(&RunConfig { size: 65, iters: 2, warmup: 0, ..ok }) {
        Err(e @ gdaki::Error::InvalidArgument(_)) => assert_eq!(
            e.to_string(),
            "invalid argument: size 65 must be 1..=64 and warmup + iters 2 at most 2 (iters >= 1)"
        ),
        other => panic!("size 65 of a 64-byte buffer: {other:?}"),
    }
    // Rejected configs changed nothing: a good run checks every payload.
    let r = pp.run(&ok).unwrap();
    assert_eq!((r.checked, r.round_trip_ns.len()), (20, 4));
}

#[test]
fn pingpong_run_warmup_overflow_is_an_error() {
    let mut pp = PingPong::new(Executor::Cpu, 8, 4).unwrap();
    let cfg =
        RunConfig { size: 8, iters: 5, warmup: u32::MAX, seed: 1, timeout: Duration::from_secs(1), blueflame: false };
    host_inval(pp.run(&cfg).map(|_| ()), &["warmup"]);
}

#[test]
fn pingpong_zero_timeout_is_a_device_error_that_says_timed_out() {
    let mut pp = PingPong::new(Executor::Cpu, 8, 4).unwrap();
    let cfg = RunConfig { size: 8, iters: 4, warmup: 0, seed: 1, timeout: Duration::ZERO, blueflame: false };
    let t = Instant::now();
    match pp.run(&cfg) {
        Err(e @ gdaki::Error::Device(_)) => {
            let m = e.to_string();
            one_line(&m);
            assert!(m.contains("timed out") && m.contains("rank 0"), "{m}");
        }
        other => panic!("{other:?}"),
    }
    assert!(t.elapsed() < Duration::from_secs(5), "a zero timeout took {:?}", t.elapsed());
}

#[test]
fn pingpong_with_the_largest_timeout_runs() {
    // Duration::MAX saturates to u64::MAX ns on the way to device code instead of overflowing.
    let mut pp = PingPong::new(Executor::Cpu, 16, 3).unwrap();
    let cfg = RunConfig { size: 16, iters: 2, warmup: 1, seed: u64::MAX, timeout: Duration::MAX, blueflame: false };
    assert_eq!(pp.run(&cfg).unwrap().checked, 6);
}

/// A failed run leaves the QPs in the error state, so every later run of that `PingPong` is refused (documented on
/// `PingPong::run`), good configuration or not, and a new `PingPong` runs fine.
#[test]
fn pingpong_run_after_a_failed_run_is_refused_and_a_new_pingpong_runs() {
    const SIZE: usize = 1 << 20;
    let mut pp = PingPong::new(Executor::Cpu, SIZE, 8).unwrap();
    // Fails at once: with no time to wait, rank 1 gives up on the first 1 MiB ping before the NIC has copied it
    // (for this run to pass, each of its 16 waits would have to be satisfied within two polls).
    let failing = RunConfig { size: SIZE, iters: 8, warmup: 0, seed: 1, timeout: Duration::ZERO, blueflame: false };
    match pp.run(&failing) {
        Err(gdaki::Error::Device(m)) => assert!(m.contains("timed out"), "{m}"),
        other => panic!("a zero timeout: {other:?}"),
    }
    let good = RunConfig { timeout: Duration::from_secs(10), seed: 2, ..failing };
    for cfg in [good, failing, good] {
        match pp.run(&cfg) {
            Err(e @ gdaki::Error::InvalidArgument(_)) => {
                assert_eq!(e.to_string(), "invalid argument: an earlier run failed: create a new PingPong")
            }
            other => panic!("a run after a failed one: {other:?}"),
        }
    }
    drop(pp);
    let mut fresh = PingPong::new(Executor::Cpu, SIZE, 8).unwrap();
    assert_eq!(fresh.run(&good).unwrap().checked, 16);
}

#[test]
fn cli_all_with_an_explicit_size_is_refused() {
    let out = pingpong(&["--executor", "cpu", "--all", "--size", "64", "--iters", "1"]);
    assert_cli_error(&out, 2, "--size");
}

/// `--blueflame` sends one 8-byte word: another size, or `--all`'s sizes, is refused before the header (exit 2),
/// not after the 8-byte row has run.
#[test]
fn cli_blueflame_with_a_size_other_than_8_is_refused_before_running() {
    for args in [&["--size", "16"][..], &["--all"][..]] {
        let out = pingpong(&[&["--executor", "cpu", "--blueflame", "--iters", "1"][..], args].concat());
        assert_cli_error(&out, 2, "--blueflame");
        assert!(text(&out.stdout).is_empty(), "ran before refusing {args:?}: {}", text(&out.stdout));
    }
}

// ---------------------------------------------------------------------------------------------------------
// A rank killed in the middle of a run
// ---------------------------------------------------------------------------------------------------------

/// Runs rank 0 and rank 1 as two processes of `executor`, kills rank 1 (SIGKILL: no goodbye, no NIC close)
/// once rank 0 has printed its table's header and `settle` has passed, and returns rank 0's output and how long
/// it took to end after the kill. Both are stopped after `bound` whatever happens, so a hang fails the test.
fn kill_rank_one(executor: &str, settle: Duration, bound: Duration) -> (Output, Duration) {
    use std::io::{BufRead, BufReader, Read};
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr = format!("127.0.0.1:{port}");
    let rank = |r: &str| {
        let args = ["--executor", executor, "--world-size", "2", "--rank", r, "--bootstrap", &addr];
        Command::new(pingpong_bin())
            .args(args)
            .args(["--iters", "10000000", "--timeout-ms", "2000"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("starting rank {r}: {e}"))
    };
    let mut r0 = rank("0");
    let mut r1 = rank("1");
    // Rank 0's stdout, line by line, to see the header; kept whole for the assertion messages.
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let stdout = r0.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut stderr0 = r0.stderr.take().unwrap();
    let errs = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr0.read_to_string(&mut s);
        s
    });
    let start = Instant::now();
    let mut so = String::new();
    while !so.contains("#bytes") {
        match rx.recv_timeout(Duration::from_millis(50)) {
            Ok(l) => so += &(l + "\n"),
            Err(_) if start.elapsed() > bound => {
                let _ = (r0.kill(), r1.kill());
                panic!("rank 0 printed no header within {bound:?}: {so:?}");
            }
            Err(_) => {}
        }
        if let Some(s) = r0.try_wait().unwrap() {
            let _ = r1.kill();
            panic!("rank 0 ended ({s}) before the kill: {so:?}");
        }
    }
    std::thread::sleep(settle);
    if let Some(s) = r1.try_wait().unwrap() {
        let _ = r0.kill();
        panic!("rank 1 ended ({s}) before the kill: rank 0 printed {so:?}");
    }
    r1.kill().expect("kill rank 1");
    let _ = r1.wait();
    let killed = Instant::now();
    let status = loop {
        if let Some(s) = r0.try_wait().unwrap() {
            break s;
        }
        if killed.elapsed() > bound {
            let _ = r0.kill();
            panic!("rank 0 still ran {bound:?} after rank 1 was killed: {so:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let took = killed.elapsed();
    reader.join().unwrap();
    so.extend(rx.try_iter().map(|l| l + "\n"));
    let stderr = errs.join().unwrap().into_bytes();
    (Output { status, stdout: so.into_bytes(), stderr }, took)
}

/// Asserts what rank 0 says when rank 1 was killed in the middle of the run: exit status 1, no panic, the
/// measurement's failure (a device error of rank 0: its outstanding WQE's error CQE, 0x15 as soon as the wire
/// sees the connection close, or, when rank 1 died between ACKing rank 0's signal and answering it, rank 0's
/// wait running out after `--timeout-ms` 2000, since RC gives no CQE while nothing is outstanding) and the
/// bootstrap naming rank 1 as gone without leaving, and no table row (no size finished).
fn assert_peer_killed(out: &Output) {
    let (so, se) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "stdout {so:?} stderr {se:?}");
    assert!(!se.contains("panicked"), "{se}");
    assert!(se.lines().any(|l| l.starts_with("error at 8 bytes: device code failed: rank 0: ")), "{se}");
    assert!(se.contains("rank 1 closed its connection without leaving the session (did it die?)"), "{se}");
    assert!(!so.lines().any(|l| l.split_whitespace().next() == Some("8")), "a row was printed: {so}");
}

/// A rank killed in the middle of a two-process run (its process gone, its wire connection closed by the
/// kernel): the peer's run ends with errors naming the failure within its device waits' bound (2 s here), not
/// with a hang.
#[test]
fn a_rank_killed_mid_run_ends_its_peers_run_with_errors() {
    let (out, took) = kill_rank_one("cpu", Duration::from_millis(300), Duration::from_secs(60));
    assert_peer_killed(&out);
    assert!(took < Duration::from_secs(6), "rank 0 took {took:?} to end");
    eprintln!("rank 0 ended {took:?} after the kill");
}

/// [`a_rank_killed_mid_run_ends_its_peers_run_with_errors`] on the GPU: rank 0's kernel, spinning on the GPU,
/// ends through the same bounded paths (its WQE's error CQE, or its wait's bound) and the process exits.
#[test]
#[ignore = "needs a GPU: run on the H200 with --ignored"]
fn gpu_a_rank_killed_mid_run_ends_its_peers_run_with_errors() {
    // Each process compiles the PTX on a machine that has not yet (about 45 s): the header comes after it.
    let (out, took) = kill_rank_one("gpu", Duration::from_secs(5), Duration::from_secs(120));
    assert_peer_killed(&out);
    assert!(took < Duration::from_secs(10), "rank 0 took {took:?} to end");
    eprintln!("rank 0 ended {took:?} after the kill");
}
