//! `gdaki-perf` whose reader goes away (`gdaki-perf coll --json F | head -2`): the run goes on to its end,
//! succeeds and writes its JSON, with nothing about the closed stdout on stderr (it panicked on the broken
//! pipe at its next line). And the header's plan says what the rows then run.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn a_reader_that_goes_away_loses_neither_the_run_nor_its_json() {
    let json = std::env::temp_dir().join(format!("gdaki-perf-output-{}.json", std::process::id()));
    let mut child = Command::new(env!("CARGO_BIN_EXE_gdaki-perf"))
        .args(["coll", "--executor", "cpu", "--quick", "--op", "broadcast", "--algorithm", "direct", "--json"])
        .arg(&json)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut first).unwrap();
    assert!(first.starts_with("# gdaki-perf coll"), "first line {first:?}");
    // The reader is gone: the rest of the table meets a closed pipe.
    let t = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            panic!("gdaki-perf coll with its reader gone hung");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let written = std::fs::read_to_string(&json);
    let _ = std::fs::remove_file(&json);
    assert!(out.status.success(), "status {:?}; stderr {stderr}", out.status);
    assert!(!stderr.contains("panicked") && !stderr.contains("Broken pipe"), "stderr: {stderr}");
    let v: serde_json::Value = serde_json::from_str(&written.expect("the JSON file")).unwrap();
    assert_eq!(v["program"], "gdaki-perf");
    assert!(!v["rows"].as_array().unwrap().is_empty(), "{v}");
}

#[test]
fn the_header_gives_the_bandwidth_rows_iterations_as_run() {
    // A bandwidth row runs at least 3 iterations but never more than `-n`: with `-n 2` the header said
    // "(3..=2 iterations)", a range with nothing in it.
    let out = Command::new(env!("CARGO_BIN_EXE_gdaki-perf"))
        .args(["bw", "--executor", "cpu", "--quick", "--mode", "exclusive", "-n", "2", "--warmup", "0"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "status {:?}; stderr {}", out.status, String::from_utf8_lossy(&out.stderr));
    let line = stdout.lines().find(|l| l.contains("bandwidth rows at most")).expect("the plan's line");
    assert!(line.contains("(2..=2 iterations)"), "{line}");
    // The rows: bytes, QPs, bytes per QP, iterations, ...
    let iters: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with(' ') && l.trim_start().starts_with(|c: char| c.is_ascii_digit()))
        .filter_map(|l| l.split_whitespace().nth(3))
        .collect();
    assert!(!iters.is_empty() && iters.iter().all(|&n| n == "2"), "iterations per row {iters:?}: {stdout}");
}
