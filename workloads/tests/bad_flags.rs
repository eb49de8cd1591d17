//! `train` and `wordcount` refuse what they cannot run before running anything: exit code 2, nothing on
//! standard output, one `error:` line on standard error.

use std::process::{Command, Output};

/// Runs program `exe` on the cpu executor with `args` and `GDAKI_QUEUES` set to `queues` (`None`: unset).
fn run(exe: &str, args: &[&str], queues: Option<&str>) -> Output {
    let mut cmd = Command::new(exe);
    cmd.args(["--executor", "cpu"]).args(args).env_remove("GDAKI_QUEUES");
    if let Some(q) = queues {
        cmd.env("GDAKI_QUEUES", q);
    }
    cmd.output().unwrap_or_else(|e| panic!("starting {exe}: {e}"))
}

/// Asserts `out` is a refusal whose first line contains `needle`.
fn assert_refused(out: &Output, needle: &str) {
    let (so, se) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(2), "stdout {so:?} stderr {se:?}");
    assert_eq!(so, "", "it printed before refusing");
    let first = se.lines().next().unwrap_or_default();
    assert!(first.starts_with("error") && first.contains(needle), "{first:?} does not mention {needle:?}");
}

const PROGRAMS: [&str; 2] = [env!("CARGO_BIN_EXE_train"), env!("CARGO_BIN_EXE_wordcount")];

/// `--nranks` past 1..=8 was taken: `train` failed at run time with exit 1, and `wordcount --nranks 0` ran
/// one mapper.
#[test]
fn ranks_outside_one_to_eight_are_refused_as_flags() {
    for exe in PROGRAMS {
        for n in ["0", "9", "4294967295"] {
            assert_refused(&run(exe, &["--nranks", n], None), &format!("invalid value '{n}' for '--nranks"));
        }
    }
}

/// A malformed `GDAKI_QUEUES` reached the emulated NIC's open, after the program had started its ranks.
#[test]
fn a_malformed_queues_variable_is_refused_first() {
    for exe in PROGRAMS {
        for v in ["bogus", "GPU", ""] {
            let out = run(exe, &["--nranks", "2"], Some(v));
            assert_refused(&out, &format!("GDAKI_QUEUES={v:?}: queues must be gpu or host"));
            assert_eq!(String::from_utf8_lossy(&out.stderr).lines().count(), 1);
        }
    }
}
