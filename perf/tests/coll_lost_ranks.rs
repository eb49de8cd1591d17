//! Ranks of `gdaki-perf coll` that lose their peers: three processes on the cpu executor whose rank 2 is killed
//! in the timed loop, each survivor exiting non-zero within its `--timeout` plus a margin and naming the dead
//! rank; and a rank whose peer never starts, giving up after `--bootstrap-timeout`.

use std::fs::File;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn spawn(rank: u32, port: u16, log: &PathBuf) -> Child {
    let out = File::create(log).unwrap();
    let err = out.try_clone().unwrap();
    Command::new(env!("CARGO_BIN_EXE_gdaki-perf"))
        .args(["coll", "--executor", "cpu", "--world-size", "3", "--rank", &rank.to_string()])
        .args(["--bootstrap", &format!("127.0.0.1:{port}")])
        .args(["--op", "all_reduce", "--algorithm", "direct", "-b", "4K", "-e", "4K"])
        .args(["--iters", "100000", "--timeout", "2s"])
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .unwrap()
}

#[test]
fn survivors_of_a_killed_rank_exit_and_name_it() {
    let dir = std::env::temp_dir().join(format!("coll-dead-rank-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let port = free_port();
    let logs: Vec<PathBuf> = (0..3).map(|r| dir.join(format!("rank{r}.txt"))).collect();
    let mut kids: Vec<Child> = (0..3).map(|r| spawn(r, port, &logs[r as usize])).collect();
    // Long enough for the setup and some calls, also on a loaded machine (setup takes well under a second
    // here).
    std::thread::sleep(Duration::from_secs(8));
    kids[2].kill().unwrap();
    kids[2].wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    for (rank, kid) in kids.iter_mut().enumerate().take(2) {
        let status = loop {
            if let Some(s) = kid.try_wait().unwrap() {
                break s;
            }
            if Instant::now() > deadline {
                kid.kill().unwrap();
                let _ = kid.wait();
                panic!("rank {rank} still running 30 s after rank 2 was killed");
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let text = std::fs::read_to_string(&logs[rank]).unwrap();
        assert!(!status.success(), "rank {rank} exited 0 after rank 2 died:\n{text}");
        // A peer's timeout names the rank it waited for; the root's group acknowledgment cannot (one counter for
        // every receiver), so the error adds the links that went down.
        let named = text.lines().any(|l| l.starts_with("error:") && l.contains("rank 2"));
        assert!(named, "rank {rank} does not name rank 2:\n{text}");
    }
}

/// Rank 1 of two whose rank 0 never starts gives up after `--bootstrap-timeout` (2 s), not the default 60 s,
/// with an error line and a non-zero exit.
#[test]
fn a_rank_alone_gives_up_after_the_bootstrap_timeout() {
    let t = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_gdaki-perf"))
        .args(["coll", "--executor", "cpu", "--world-size", "2", "--rank", "1", "--quick"])
        .args(["--bootstrap", &format!("127.0.0.1:{}", free_port()), "--bootstrap-timeout", "2"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let waited = t.elapsed();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!out.status.success(), "exit 0 without a rank 0:\n{text}");
    assert!(waited >= Duration::from_secs(2) && waited < Duration::from_secs(20), "gave up after {waited:?}:\n{text}");
    assert!(text.lines().any(|l| l.starts_with("error")), "no error line:\n{text}");
}
