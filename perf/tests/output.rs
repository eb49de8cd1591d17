//! `gdaki-perf` whose reader goes away (`gdaki-perf coll | head -2`): the program ends quietly, killed by
//! SIGPIPE at its next write as `cat` would be, instead of panicking on the broken pipe.

use std::io::{BufRead, BufReader};
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// SIGPIPE's number on Linux.
const SIGPIPE: i32 = 13;

#[test]
fn a_reader_that_goes_away_ends_the_program_quietly() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_gdaki-perf"))
        .args(["coll", "--executor", "cpu", "--quick"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut first).unwrap();
    assert!(first.starts_with("# gdaki-perf coll"), "first line {first:?}");
    // The reader is gone: the rest of the tables meet a closed pipe.
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
    assert_eq!(out.status.signal(), Some(SIGPIPE), "status {:?}; stderr {stderr}", out.status);
    assert!(!stderr.contains("panicked"), "stderr: {stderr}");
}
