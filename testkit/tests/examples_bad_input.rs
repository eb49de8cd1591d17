//! Bad input to the example programs other than the ping-pong's own flags (those are in pingpong_bad_input.rs):
//! out-of-range counts, an unwritable `--json`, a malformed `GDAKI_QUEUES`, a world size a two-rank program does
//! not take, and a run whose queues do not fit the memory it may have. Each is one `error:` line and the exit
//! code the programs document, before anything runs where the input alone decides.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The example `name` of this target directory (built by `cargo build -p gdaki-examples --examples` in the
/// same profile as this test): a missing one fails the test rather than skipping it.
fn example(name: &str) -> PathBuf {
    // This test runs from <target>/<profile>/deps/; examples are in <target>/<profile>/examples/.
    let exe = std::env::current_exe().expect("this test's path");
    let bin = exe.parent().and_then(|d| d.parent()).expect("a target directory").join("examples").join(name);
    assert!(bin.is_file(), "{} is not built: run `cargo build -p gdaki-examples --examples`", bin.display());
    bin
}

/// Runs `cmd` (stdin closed) for at most 120 s.
fn output(mut cmd: Command) -> Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {cmd:?}: {e}"));
    let t = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            panic!("{cmd:?} hung");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().unwrap()
}

/// Runs the example `name` on the cpu executor with `args` added and the variables `env` set.
fn run(name: &str, env: &[(&str, &str)], args: &[&str]) -> Output {
    let mut cmd = Command::new(example(name));
    cmd.args(["--executor", "cpu"]).args(args).envs(env.iter().copied());
    output(cmd)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Asserts that the program exited with `code` without a panic, its stderr's first line is an error containing
/// `needle`, and, for a refusal before running (code 2), that stdout is empty: no header was printed.
fn assert_error(out: &Output, code: i32, needle: &str) {
    let (so, se) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(code), "exit status; stdout {so:?} stderr {se:?}");
    assert!(!se.contains("panicked") && !se.contains("RUST_BACKTRACE"), "it panicked: {se}");
    let first = se.lines().next().unwrap_or_default();
    assert!(first.starts_with("error") && first.contains(needle), "{first:?} does not mention {needle:?}");
    if code == 2 {
        assert_eq!(so, "", "it printed before refusing");
    }
}

#[test]
fn post_rate_refuses_qp_counts_outside_its_range() {
    // 2^31 QPs made the warp rows' `2 * qps` wrap to 0; 2^32 - 1 of them ran out of memory.
    for qps in ["0", "1025", "2147483648", "4294967295"] {
        let out = run("post_rate", &[], &["--rounds", "1", "--posts", "4", "--qps", qps]);
        assert_error(&out, 2, &format!("'{qps}' for '--qps <QPS>': {qps} is not in 1..=1024"));
    }
}

/// Sets this process's address-space limit to `bytes` (RLIMIT_AS, as `ulimit -v` does) before `exec`.
fn limit_address_space(cmd: &mut Command, bytes: u64) {
    // SAFETY: the closure runs in the child between fork and exec and calls only setrlimit, which is
    // async-signal-safe; it allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            let lim = libc::rlimit { rlim_cur: bytes, rlim_max: bytes };
            match libc::setrlimit(libc::RLIMIT_AS, &lim) {
                0 => Ok(()),
                _ => Err(std::io::Error::last_os_error()),
            }
        });
    }
}

/// 1024 QPs each way need 8 GiB of rings; in 512 MiB of address space the emulated NIC's queue creation runs
/// out of memory, and that is an error line (exit 1), not an abort, with the queues in host memory and in
/// simulated GPU memory (where each CQ's filled image is staged in host memory and copied).
#[test]
fn post_rate_out_of_memory_is_an_error_not_an_abort() {
    for queues in ["host", "gpu"] {
        let mut cmd = Command::new(example("post_rate"));
        cmd.args(["--executor", "cpu", "--rounds", "1", "--posts", "4", "--qps", "1024", "--queues", queues]);
        limit_address_space(&mut cmd, 512 << 20);
        let out = output(cmd);
        assert_error(&out, 1, "error: out of memory allocating ");
    }
}

#[test]
fn floors_refuses_an_unwritable_json_path_before_measuring() {
    let t = Instant::now();
    let out = run("floors", &[], &["--iters", "10", "--json", "/nonexistent/f.json"]);
    assert_error(&out, 2, "--json /nonexistent/f.json: No such file or directory");
    // Measuring takes seconds on the cpu executor (copy bandwidth by size); a refusal does not.
    assert!(t.elapsed() < Duration::from_secs(2), "took {:?}", t.elapsed());
}

#[test]
fn floors_writes_its_json() {
    let path = std::env::temp_dir().join(format!("gdaki-floors-{}.json", std::process::id()));
    let out = run("floors", &[], &["--iters", "10", "--json", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let doc = std::fs::read_to_string(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    assert!(doc.starts_with('{') && doc.contains("\"commit\"") && doc.contains("\"floors\""), "{doc}");
}

#[test]
fn port_channel_refuses_out_of_range_flags_before_running() {
    let cases: &[(&[&str], &str)] = &[
        (&["--timeout-ms", "0"], "'0' for '--timeout-ms <TIMEOUT_MS>': 0 is not in 1..=86400000"),
        (&["--team", "0"], "'0' for '--team <TEAM>': 0 is not in 1..=1024"),
        (&["--team", "1025"], "'1025' for '--team <TEAM>': 1025 is not in 1..=1024"),
        (&["--team", "4294967295"], "'4294967295' for '--team <TEAM>'"),
        (&["--max-size", "0"], "'0' for '--max-size <MAX_SIZE>': 0 is not in 1024..=1073741824"),
        (&["--max-size", "1000"], "'1000' for '--max-size <MAX_SIZE>': 1000 is not in 1024..=1073741824"),
        (&["--max-size", "1073741825"], "'1073741825' for '--max-size <MAX_SIZE>'"),
        // Each mode is a table of its own: one named twice ran twice.
        (&["--mode", "exclusive,host,exclusive"], "--mode names Exclusive twice"),
    ];
    for (args, needle) in cases {
        assert_error(&run("port_channel", &[], args), 2, needle);
    }
}

#[test]
fn a_malformed_queues_variable_is_refused_before_the_header() {
    for (program, args) in [
        ("pingpong", &["--iters", "2"][..]),
        ("post_rate", &["--rounds", "1", "--posts", "4"][..]),
        ("port_channel", &["--iters", "1", "--mode", "exclusive", "--max-size", "4096"][..]),
    ] {
        for v in ["bogus", "GPU", ""] {
            let out = run(program, &[("GDAKI_QUEUES", v)], args);
            let want = format!("error: GDAKI_QUEUES={v:?}: queues must be gpu or host (or GDAKI_QUEUES unset)");
            assert_error(&out, 2, &want);
            assert_eq!(text(&out.stderr).lines().count(), 1, "{program}: {}", text(&out.stderr));
        }
        // --queues replaces the variable.
        let mut with_flag = args.to_vec();
        with_flag.extend(["--queues", "host"]);
        let out = run(program, &[("GDAKI_QUEUES", "bogus")], &with_flag);
        assert_eq!(out.status.code(), Some(0), "{program}: {}", text(&out.stderr));
        assert!(text(&out.stdout).contains("queues in host memory"), "{program}: {}", text(&out.stdout));
    }
    // The fault catalogue and emu_rate (no --queues flag, no --executor: they run on the cpu executor) check
    // it too.
    for program in ["faults", "emu_rate"] {
        let mut cmd = Command::new(example(program));
        cmd.env("GDAKI_QUEUES", "bogus");
        let want = "error: GDAKI_QUEUES=\"bogus\": queues must be gpu or host (or GDAKI_QUEUES unset)";
        assert_error(&output(cmd), 2, want);
    }
}

/// A `GDAKI_QUEUES` that is not UTF-8 is neither `gpu` nor `host` either: refused before the header, not taken
/// for an unset variable (the header would name the default placement, and every emulated NIC refuses it).
#[test]
fn a_queues_variable_that_is_not_utf8_is_refused_before_the_header() {
    use std::os::unix::ffi::OsStrExt;
    let v = std::ffi::OsStr::from_bytes(b"gpu\xe9");
    for (program, args) in [("pingpong", &["--executor", "cpu", "--iters", "2"][..]), ("emu_rate", &[][..])] {
        let mut cmd = Command::new(example(program));
        cmd.args(args).env("GDAKI_QUEUES", v);
        let out = output(cmd);
        assert_error(&out, 2, "error: GDAKI_QUEUES=\"gpu\\xE9\": queues must be gpu or host (or GDAKI_QUEUES unset)");
        assert_eq!(text(&out.stderr).lines().count(), 1, "{program}: {}", text(&out.stderr));
    }
}

#[test]
fn two_rank_programs_refuse_a_world_of_one_rank() {
    for program in ["pingpong", "port_channel"] {
        let out = run(program, &[], &["--world-size", "1", "--rank", "0"]);
        assert_error(&out, 2, "this example takes 2 ranks, the launch (flags) has 1");
    }
    // A launcher's world of one (a Slurm batch script's environment) is no launch: both ranks run here.
    let slurm = [("SLURM_PROCID", "0"), ("SLURM_NTASKS", "1")];
    let out = run("pingpong", &slurm, &["--iters", "2"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("both ranks in this process"), "{}", text(&out.stdout));
}

#[test]
fn an_unspecified_wire_address_is_refused_before_the_header() {
    // The NIC advertises the address it listens on: 0.0.0.0 failed each rank of a multi-process run after its
    // header (exit code 1), and was ignored when both ranks ran in this process.
    for program in ["pingpong", "port_channel"] {
        for wire in ["0.0.0.0:0", "[::]:7000"] {
            let out = run(program, &[], &["--iters", "2", "--wire", wire]);
            assert_error(&out, 2, &format!("'{wire}' for '--wire <ADDR>'"));
            assert!(text(&out.stderr).contains("not a specific address"), "{}", text(&out.stderr));
        }
    }
    let out = run("pingpong", &[], &["--iters", "2", "--wire", "nonsense"]);
    assert_error(&out, 2, "'nonsense' for '--wire <ADDR>'");
}
