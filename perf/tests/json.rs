//! `gdaki-perf all --quick` for one mode on the cpu executor writes the documented JSON: machine, build and
//! plan fields, one row per test and size with its statistics and payloads checked, and counts that add up;
//! the header line and the JSON say what ran (the NICs, the wire or none, the warm-up).

use std::process::Command;

use serde_json::Value;

/// Runs `gdaki-perf` with `args` and `--json` into a scratch file; asserts it succeeded and returns its standard
/// output and the JSON. `tag` names the scratch folder.
fn run_json(tag: &str, args: &[&str]) -> (String, Value) {
    let dir = std::env::temp_dir().join(format!("gdaki-perf-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("run.json");
    let out = Command::new(env!("CARGO_BIN_EXE_gdaki-perf")).args(args).arg("--json").arg(&json).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "exit {:?}\n{stdout}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    std::fs::remove_dir_all(&dir).ok();
    (stdout, v)
}

#[test]
fn all_quick_json_has_every_row_and_field() {
    let (stdout, v) = run_json("json", &["all", "--quick", "--executor", "cpu", "--mode", "exclusive", "-n", "20"]);

    assert_eq!(v["program"], "gdaki-perf");
    assert_eq!(v["subcommand"], "all");
    assert_eq!(v["executor"], "cpu");
    assert_eq!(v["nic"], "emu");
    assert!(v["gpu"].is_null(), "no GPU on the cpu executor: {}", v["gpu"]);
    assert!(!v["commit"].as_str().unwrap().is_empty());
    assert!(v["date"].as_str().unwrap().ends_with('Z'), "RFC 3339 UTC: {}", v["date"]);
    assert_eq!(v["modes"], serde_json::json!(["Device-Exclusive"]));
    assert_eq!((v["quick"].as_bool(), v["iters"].as_u64()), (Some(true), Some(20)));
    // The warm-up that ran: --warmup's 100 capped by a tenth of each row's 20 iterations.
    assert_eq!((v["warmup"].as_u64(), v["warmup_cap"].as_u64()), (Some(2), Some(100)));
    assert_eq!(v["one_nic"], false);

    // --quick: latency tests at 8 B, 1-QP bandwidth at 1 KiB and 64 KiB, 4-QP at 4 KiB and 256 KiB, bibw and
    // both flush tests at 1 KiB.
    let expected = [
        ("PingPong", 8, "latency"),
        ("PacketPingPong (LL16)", 8, "latency"),
        ("PacketPingPong (LL8)", 8, "latency"),
        ("bw 1-QP", 1024, "bandwidth"),
        ("bw 1-QP", 65536, "bandwidth"),
        ("bw 4-QP", 4096, "bandwidth"),
        ("bw 4-QP", 262144, "bandwidth"),
        ("bibw 1-QP", 1024, "bandwidth"),
        ("flush stress 4-QP", 1024, "latency"),
        ("concurrent flush 1-QP", 1024, "latency"),
    ];
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), expected.len(), "{rows:#?}");
    let mut checked = 0;
    for (row, (test, bytes, kind)) in rows.iter().zip(expected) {
        assert_eq!((row["test"].as_str(), row["bytes"].as_u64()), (Some(test), Some(bytes)), "{row}");
        assert_eq!(row["mode"], "Device-Exclusive");
        assert_eq!(row["warmup"].as_u64(), Some(2), "{row}");
        assert!(row["checked"].as_u64().unwrap() > 0, "{row}");
        checked += row["checked"].as_u64().unwrap();
        // No Host row to compare with.
        assert!(row["vs_host"].is_null(), "{row}");
        let m = &row["measure"][kind];
        assert_eq!(m["bytes"].as_u64(), Some(bytes), "{row}");
        if kind == "latency" {
            assert_eq!(m["iterations"].as_u64(), Some(20), "{row}");
            let (min, p50, p99, p999, max) = (
                m["t_min"].as_f64().unwrap(),
                m["t_typical"].as_f64().unwrap(),
                m["p99"].as_f64().unwrap(),
                m["p99_9"].as_f64().unwrap(),
                m["t_max"].as_f64().unwrap(),
            );
            assert!(0.0 < min && min <= p50 && p50 <= p99 && p99 <= p999 && p999 <= max, "{row}");
        } else {
            // 16 MiB budget: 20 iterations of these sizes fit.
            assert_eq!(m["iterations"].as_u64(), Some(20), "{row}");
            let (us, gbps, qps) =
                (m["us_per_iter"].as_f64().unwrap(), m["gbps"].as_f64().unwrap(), m["qps"].as_u64().unwrap());
            assert_eq!(qps, if test == "bw 4-QP" { 4 } else { 1 });
            // Only the mean time per iteration: the pipelined iterations have no transfer time of their own.
            assert!(m.get("us_per_iter_p50").is_none(), "{row}");
            let dirs = if test == "bibw 1-QP" { 2.0 } else { 1.0 };
            // GB/s = bytes per ns, from the mean time per iteration.
            assert!((gbps - dirs * bytes as f64 / (us * 1e3)).abs() <= 1e-6 * gbps, "{row}");
        }
    }
    // Every payload counted in a row, and the closing line says the same.
    assert_eq!(v["passed"].as_u64(), Some(checked));
    assert_eq!(v["failed"].as_u64(), Some(0));
    assert!(stdout.trim_end().ends_with(&format!("{checked} passed, 0 failed")), "{stdout}");
    // The header names what ran: a NIC per rank with the wire between them, and the warm-up of the rows.
    let mut lines = stdout.lines();
    let header = lines.next().unwrap_or_default();
    assert!(header.contains(", an emulated mlx5 NIC per rank, over the wire (loopback TCP),"), "{header}");
    let plan = lines.next().unwrap_or_default();
    assert!(plan.starts_with("20 iterations per latency row after up to 2 warm-up,"), "{plan}");
    // Without Host there is no ratio to summarise.
    assert_eq!(v["summary"], serde_json::json!([]));
}

#[test]
fn one_nic_header_and_json_say_no_wire() {
    let (stdout, v) = run_json(
        "one-nic",
        &["pingpong", "--one-nic", "--quick", "--executor", "cpu", "--mode", "exclusive", "-n", "5"],
    );
    let header = stdout.lines().next().unwrap_or_default();
    assert!(header.contains(", one emulated mlx5 NIC shared by both ranks (no wire),"), "{header}");
    // The cpu executor keeps the queues in host memory unless GDAKI_QUEUES says gpu (simulated).
    let queues = if std::env::var("GDAKI_QUEUES").as_deref() == Ok("gpu") { "gpu (simulated)" } else { "host" };
    assert!(header.ends_with(&format!(", queues in {queues} memory")), "{header}");
    assert_eq!(v["queues"], queues);
    assert!(!header.contains("over the wire"), "{header}");
    assert_eq!(v["one_nic"], true);
    // 5 iterations: a warm-up of 1 (a tenth, at least 1).
    assert_eq!(v["warmup"].as_u64(), Some(1));
}

/// `gdaki-perf coll --processes 3` (one rank per process, started by the program itself) lists each rank's
/// process under "Using devices" and in the JSON, three different processes, and checks every element.
#[test]
fn coll_one_process_per_rank_lists_each_ranks_device() {
    let (stdout, v) = run_json(
        "coll",
        &[
            "coll",
            "--quick",
            "--executor",
            "cpu",
            "--processes",
            "3",
            "--op",
            "broadcast",
            "--algorithm",
            "direct",
            "-e",
            "64",
        ],
    );
    assert_eq!((v["nranks"].as_u64(), v["ranks_in_process"].as_bool()), (Some(3), Some(false)));
    let devices = v["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 3, "{devices:?}");
    let pids: std::collections::BTreeSet<u64> = devices.iter().map(|d| d["pid"].as_u64().unwrap()).collect();
    assert_eq!(pids.len(), 3, "three processes: {devices:?}");
    for (r, d) in devices.iter().enumerate() {
        assert_eq!((d["device"].as_str(), d["pci"].as_str(), d["name"].as_str()), (Some("cpu"), Some(""), Some("")));
        let (pid, host) = (d["pid"].as_u64().unwrap(), d["host"].as_str().unwrap());
        let line = format!("#  Rank {r:>2} Pid {pid:>7} on {host} device cpu\n");
        assert!(stdout.contains(&line), "rank {r} not listed as {line:?}:\n{stdout}");
    }
    assert_eq!((v["wrong"].as_u64(), v["errors"].as_u64()), (Some(0), Some(0)));
    // 8 and 64 bytes, each checked.
    assert_eq!(v["rows"].as_array().unwrap().len(), 2, "{}", v["rows"]);
}

/// `gdaki-perf bw --processes 2`: rank 0 alone prints, and its table and JSON count the payloads both ranks
/// checked (the receiving side checks), as the same run with both ranks in one process does.
#[test]
fn bw_one_process_per_rank_counts_every_ranks_checks() {
    let args = ["bw", "--quick", "--executor", "cpu", "--mode", "exclusive"];
    let (_, one) = run_json("bw-one", &args);
    let (stdout, two) = run_json("bw-two", &[&args[..], &["--processes", "2"]].concat());
    assert_eq!(stdout.matches("gdaki-perf bw (").count(), 1, "one header:\n{stdout}");
    let passed = one["passed"].as_u64().expect("passed");
    assert!(passed > 0);
    assert_eq!(two["passed"].as_u64(), Some(passed));
    assert!(stdout.trim_end().ends_with(&format!("{passed} passed, 0 failed")), "{stdout}");
    let checked = |v: &Value| v["rows"].as_array().unwrap().iter().map(|r| r["checked"].as_u64()).collect::<Vec<_>>();
    assert_eq!(checked(&two), checked(&one));
}

/// A `--json` path that cannot be written stops `gdaki-perf coll` before it runs anything: exit code 2 and one
/// line naming the path.
#[test]
fn coll_unwritable_json_is_refused_before_running() {
    let out = Command::new(env!("CARGO_BIN_EXE_gdaki-perf"))
        .args(["coll", "--quick", "--executor", "cpu", "--json", "/proc/no-such-dir/coll.json"])
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(2), "{stdout}\n{stderr}");
    assert!(stdout.is_empty(), "it ran:\n{stdout}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with("error: --json /proc/no-such-dir/coll.json: "), "{stderr}");
}
