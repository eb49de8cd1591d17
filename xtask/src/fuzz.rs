//! `cargo xtask fuzz`: a smoke run of the cargo-fuzz targets in `fuzz/` (the emulated NIC's WQE parser and wire
//! decoder), for CI and for a quick local check.
//!
//! Installs cargo-fuzz when `cargo fuzz` is missing, builds the targets (on the pinned stable toolchain, whose
//! `-Z` flags cargo-fuzz needs: `RUSTC_BOOTSTRAP=1`; AddressSanitizer, debug assertions and overflow checks on, as
//! cargo-fuzz builds by default), then runs each for a fixed time from its corpus (`fuzz/corpus/<target>`: the
//! committed `seed-*` files plus whatever earlier runs added). libFuzzer's output goes to
//! `fuzz/target/smoke/<target>.log`; a crash fails the task with the log's tail and the crashing input under
//! `fuzz/artifacts/<target>/`.

use std::fs::File;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context};
use xtask::build::clean_cargo_env;
use xtask::workspace::Workspace;
use xtask::Result;

/// The cargo-fuzz installed when `cargo fuzz` is missing (checked with the pinned toolchain).
const CARGO_FUZZ_VERSION: &str = "0.13.2";

/// The fuzz targets (fuzz/Cargo.toml's binaries).
pub const TARGETS: [&str; 2] = ["wqe_parser", "wire_decoder"];

/// Runs each of `targets` (all when empty) for `seconds`.
pub fn run(seconds: u32, targets: &[String]) -> Result<()> {
    let workspace = Workspace::current()?;
    let fuzz_dir = workspace.root.join("fuzz");
    let targets: Vec<&str> =
        if targets.is_empty() { TARGETS.to_vec() } else { targets.iter().map(String::as_str).collect() };
    ensure_cargo_fuzz(&workspace.root)?;

    let cargo_fuzz = |args: &[&str]| {
        let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
        clean_cargo_env(&mut cmd);
        cmd.current_dir(&workspace.root)
            .env("RUSTC_BOOTSTRAP", "1")
            .args(["fuzz"])
            .args(args)
            .arg("--fuzz-dir")
            .arg(&fuzz_dir)
            .arg("--target-dir")
            .arg(fuzz_dir.join("target"))
            .stdin(Stdio::null());
        cmd
    };

    let start = Instant::now();
    for target in &targets {
        let status = cargo_fuzz(&["build", target]).status().context("cannot run `cargo fuzz build`")?;
        if !status.success() {
            bail!("`cargo fuzz build {target}` failed ({status})");
        }
    }
    eprintln!("xtask: fuzz targets built in {:.0} s", start.elapsed().as_secs_f64());

    let logs = fuzz_dir.join("target/smoke");
    std::fs::create_dir_all(&logs).with_context(|| format!("cannot create {}", logs.display()))?;
    for target in &targets {
        let log = logs.join(format!("{target}.log"));
        let out = File::create(&log).with_context(|| format!("cannot create {}", log.display()))?;
        let err = out.try_clone()?;
        let status = cargo_fuzz(&["run", target])
            .args(["--", &format!("-max_total_time={seconds}"), "-timeout=10"])
            .stdout(out)
            .stderr(err)
            .status()
            .context("cannot run `cargo fuzz run`")?;
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if !status.success() {
            let lines: Vec<&str> = text.lines().collect();
            eprintln!("{}", lines[lines.len().saturating_sub(80)..].join("\n"));
            bail!(
                "fuzz target {target} failed ({status}): see {} and the input under {}",
                log.display(),
                fuzz_dir.join("artifacts").join(target).display()
            );
        }
        println!("fuzz {target}: {}", summary(&text));
    }
    Ok(())
}

/// libFuzzer's closing lines, in one: "Done N runs in S second(s)" and the final coverage and corpus size.
fn summary(log: &str) -> String {
    let done = log.lines().rev().find(|l| l.starts_with("Done ")).unwrap_or("no \"Done\" line");
    let stats = log.lines().rev().find(|l| l.contains("DONE ")).and_then(|l| l.split_once("DONE"));
    match stats {
        Some((_, stats)) => format!("{done}; {}", stats.split_whitespace().take(6).collect::<Vec<_>>().join(" ")),
        None => done.to_string(),
    }
}

/// Installs cargo-fuzz (`cargo install --locked`, about a minute on two cores) unless `cargo fuzz` runs.
fn ensure_cargo_fuzz(root: &Path) -> Result<()> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let found = Command::new(&cargo)
        .current_dir(root)
        .args(["fuzz", "--version"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if found {
        return Ok(());
    }
    eprintln!(
        "xtask: `cargo fuzz` not found; installing cargo-fuzz {CARGO_FUZZ_VERSION} with `cargo install --locked`"
    );
    let mut install = Command::new(&cargo);
    clean_cargo_env(&mut install);
    let status = install
        .current_dir(root)
        .args(["install", "--locked", "cargo-fuzz", "--version", CARGO_FUZZ_VERSION])
        .stdin(Stdio::null())
        .status()
        .context("cannot run `cargo install`")?;
    if !status.success() {
        bail!("`cargo install cargo-fuzz` failed ({status})");
    }
    Ok(())
}
