//! The rustup components the nvptx build needs, added when the active toolchain lacks them.
//!
//! `rust-toolchain.toml` lists them, but rustup only installs them along with the toolchain: a machine that has
//! the pinned toolchain without them (installed with another profile, or as a link to `stable`), with
//! `RUSTUP_AUTO_INSTALL=0`, builds the host crates fine and then fails deep inside the nested nvptx build with an
//! error that does not say which component is missing. So the PTX build checks for them first, in the sysroot of
//! the rustc the nested cargo will run, and runs `rustup component add` once if one is missing.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context};

use crate::Result;

/// The components of `rust-toolchain.toml` that the nvptx build needs: `rust-src` for `-Zbuild-std=core`,
/// `llvm-bitcode-linker` to link the `cdylib`, and `llvm-tools` for the `llvm-link`, `opt` and `llc` that the
/// linker runs.
pub const COMPONENTS: &[&str] = &["rust-src", "llvm-tools", "llvm-bitcode-linker"];

/// The rustc whose sysroot is checked: `$RUSTC` (cargo sets it for build scripts, and the nested cargo keeps it),
/// else `rustc` from PATH, as the nested cargo would choose.
fn rustc() -> PathBuf {
    std::env::var_os("RUSTC").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("rustc"))
}

/// The sysroot and host triple of `rustc`, asked in `dir` so that rustup's proxy picks the toolchain of
/// `dir`'s `rust-toolchain.toml`, like the nested cargo will.
fn sysroot_and_host(dir: &Path) -> Result<(PathBuf, String)> {
    let rustc = rustc();
    let output = Command::new(&rustc)
        .current_dir(dir)
        .args(["--print", "sysroot", "--print", "host-tuple"])
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("cannot run `{}`", rustc.display()))?;
    if !output.status.success() {
        bail!("`{} --print sysroot --print host-tuple` failed ({})", rustc.display(), output.status);
    }
    let text = String::from_utf8_lossy(&output.stdout);
    let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
    match (lines.next(), lines.next()) {
        (Some(sysroot), Some(host)) => Ok((PathBuf::from(sysroot), host.to_string())),
        _ => bail!("`{} --print sysroot --print host-tuple` printed {:?}", rustc.display(), text.trim()),
    }
}

/// The [`COMPONENTS`] that the toolchain at `sysroot` (host `host`) lacks, judged by a file each installs.
pub fn missing_components(sysroot: &Path, host: &str) -> Vec<&'static str> {
    let rustlib = sysroot.join("lib/rustlib");
    let host_bin = rustlib.join(host).join("bin");
    let exe = |dir: &Path, name: &str| dir.join(format!("{name}{}", std::env::consts::EXE_SUFFIX)).is_file();
    let present = |component: &str| match component {
        // `-Zbuild-std=core` builds `core` from here.
        "rust-src" => rustlib.join("src/rust/library/core/src/lib.rs").is_file(),
        // rustc looks for the linker among its self-contained tools.
        "llvm-bitcode-linker" => exe(&host_bin.join("self-contained"), "llvm-bitcode-linker"),
        // The three tools llvm-bitcode-linker runs.
        "llvm-tools" => ["llvm-link", "opt", "llc"].iter().all(|tool| exe(&host_bin, tool)),
        _ => true,
    };
    COMPONENTS.iter().copied().filter(|c| !present(c)).collect()
}

/// The rustup toolchain the nested build will use: `$RUSTUP_TOOLCHAIN` (rustup's proxies set it for cargo and
/// everything cargo runs), else the first word of `rustup show active-toolchain` run in `dir`. `None` without
/// rustup.
fn active_toolchain(dir: &Path) -> Option<String> {
    if let Some(name) = std::env::var("RUSTUP_TOOLCHAIN").ok().filter(|n| !n.trim().is_empty()) {
        return Some(name.trim().to_string());
    }
    let output = Command::new("rustup")
        .current_dir(dir)
        .args(["show", "active-toolchain"])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&output.stdout);
    output.status.success().then(|| text.split_whitespace().next().map(str::to_string)).flatten()
}

/// Makes sure the toolchain that builds the workspace at `workspace_root` has [`COMPONENTS`], running
/// `rustup component add` once for the missing ones. `report` receives the one line that says it does so (a
/// build script turns it into a `cargo:warning`, the command line prints it to stderr).
///
/// # Errors
/// rustc cannot be asked for its sysroot, or a component is missing and rustup is absent, fails, or leaves it
/// missing; the error names the command to run by hand.
pub fn ensure_components(workspace_root: &Path, report: impl FnOnce(&str)) -> Result<()> {
    let (sysroot, host) = sysroot_and_host(workspace_root)?;
    let missing = missing_components(&sysroot, &host);
    if missing.is_empty() {
        return Ok(());
    }
    let toolchain = active_toolchain(workspace_root);
    // All of them, not only the missing ones: rustup skips what is installed, and the command is then the same
    // one a person would copy from the error.
    let mut args = vec!["component", "add"];
    args.extend_from_slice(COMPONENTS);
    if let Some(name) = &toolchain {
        args.extend(["--toolchain", name.as_str()]);
    }
    let command = format!("rustup {}", args.join(" "));
    let what = format!(
        "the Rust toolchain {} lacks {}, which the {} build needs",
        toolchain.as_deref().unwrap_or(&sysroot.display().to_string()),
        missing.join(", "),
        crate::TARGET_TRIPLE
    );
    let hint = format!("{what}: run `{command}` in {}", workspace_root.display());
    report(&format!("{what}; running `{command}`"));

    // rustup's progress goes to our stderr: a build script's stdout is for cargo's `cargo:` lines.
    let status = Command::new("rustup")
        .current_dir(workspace_root)
        .args(&args)
        .stdin(Stdio::null())
        .stdout(std::io::stderr())
        .stderr(Stdio::inherit())
        .status();
    match status {
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => bail!("{hint} (rustup is not on PATH)"),
        Err(error) => bail!("{hint} (cannot run rustup: {error})"),
        Ok(status) if !status.success() => bail!("{hint} (`{command}` failed: {status})"),
        Ok(_) => {}
    }
    let still = missing_components(&sysroot, &host);
    if !still.is_empty() {
        bail!("{hint} (`{command}` succeeded, but {} still lacks {})", sysroot.display(), still.join(", "));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_missing_components_by_their_files() {
        let root = std::env::temp_dir().join(format!("xtask-toolchain-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let host = "x86_64-unknown-linux-gnu";
        assert_eq!(missing_components(&root, host), COMPONENTS);

        let file = |path: &str| {
            let path = root.join(path);
            std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
            std::fs::write(path, "").expect("write");
        };
        file("lib/rustlib/src/rust/library/core/src/lib.rs");
        assert_eq!(missing_components(&root, host), ["llvm-tools", "llvm-bitcode-linker"]);
        file("lib/rustlib/x86_64-unknown-linux-gnu/bin/self-contained/llvm-bitcode-linker");
        file("lib/rustlib/x86_64-unknown-linux-gnu/bin/llvm-link");
        file("lib/rustlib/x86_64-unknown-linux-gnu/bin/opt");
        assert_eq!(missing_components(&root, host), ["llvm-tools"]);
        file("lib/rustlib/x86_64-unknown-linux-gnu/bin/llc");
        assert!(missing_components(&root, host).is_empty());
        let _ = std::fs::remove_dir_all(&root);
    }
}
