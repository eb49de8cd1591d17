//! Builds gdaki-device to PTX for `src/ptx.rs`, so that a plain `cargo build` needs no manual step.
//!
//! The build is `xtask`'s ([`xtask::PtxBuild`]): a nested `cargo rustc` for `nvptx64-nvidia-cuda` with its own
//! target directory (`<target>/ptx-build`, shared by every outer profile and by `cargo xtask build-ptx`: the outer
//! cargo's lock is on `<target>/<profile>`, so the nested one never waits for it) and an environment cleaned of
//! the outer build's flags. The PTX is validated (target, version, `.entry`, no `.extern`) and copied to
//! `OUT_DIR`. ptxas is not needed here; `cargo xtask build-ptx` and `cargo xtask test` run it.
//!
//! If the active toolchain lacks a component the nvptx build needs (`rust-src`, `llvm-tools`,
//! `llvm-bitcode-linker`: rustup installs those of `rust-toolchain.toml` only with the toolchain itself), the build
//! adds them with `rustup component add` first and says so in one `cargo:warning`.
//!
//! `GDAKI_PTX=/path/to/gdaki_device.ptx` skips the nested build and embeds that file (validated the same way),
//! for builds where no nvptx toolchain is available.

use std::env;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use xtask::anyhow::Context;
use xtask::{PtxBuild, Result, ARCH, PTX_FILE, PTX_ISA};

/// Overrides the nested build with a prebuilt PTX file.
const PTX_OVERRIDE_ENV: &str = "GDAKI_PTX";

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            // One line, and a failing exit: cargo shows it under "failed to run custom build command".
            eprintln!("error: building the device PTX: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<()> {
    let manifest_dir =
        PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").context("cargo did not set CARGO_MANIFEST_DIR")?);
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").context("cargo did not set OUT_DIR")?);
    let root = manifest_dir.parent().context("the host crate has no parent folder")?;

    // Everything the PTX depends on: the device and shared crates (folders are scanned recursively), the workspace
    // manifest (profile `ptx`), the lock file, the toolchain pin and cargo's config.
    // A path that does not exist would make cargo rerun this script on every build, hence the filter.
    for path in ["device", "shared", "Cargo.toml", "Cargo.lock", "rust-toolchain.toml", ".cargo/config.toml"] {
        let path = root.join(path);
        if path.exists() {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }
    println!("cargo:rerun-if-env-changed={PTX_OVERRIDE_ENV}");

    let dest = out_dir.join(PTX_FILE);
    let entries = match env::var_os(PTX_OVERRIDE_ENV) {
        Some(path) => {
            let path = PathBuf::from(path);
            println!("cargo:rerun-if-changed={}", path.display());
            let ptx = std::fs::read_to_string(&path)
                .with_context(|| format!("cannot read ${PTX_OVERRIDE_ENV} ({})", path.display()))?;
            let info = xtask::validate(&ptx, ARCH, PTX_ISA)?;
            xtask::build::write_atomically(&dest, ptx.as_bytes())?;
            info.entries
        }
        None => {
            let mut build = PtxBuild::new(root, xtask::build::nested_target_dir(&out_dir));
            // A build script must not rewrite Cargo.lock; the outer cargo has already brought it up to date.
            build.locked = true;
            build.jobs = env::var("NUM_JOBS").ok().and_then(|n| n.parse().ok());
            // Warnings about nvptx-only device code would otherwise stay in this script's hidden stderr.
            build.cargo_warnings = true;
            let built = build.build()?;
            built.write_to(&dest)?;
            built.info.entries
        }
    };
    write_entries(&out_dir, &entries)
}

/// Writes `gdaki_device_entries.rs`: the kernel names as a Rust slice expression, for `ptx::ENTRIES`.
fn write_entries(out_dir: &Path, entries: &[String]) -> Result<()> {
    // `{:?}` quotes and escapes each name; PTX identifiers need no escaping anyway.
    let text = format!("&{entries:?}\n");
    xtask::build::write_atomically(&out_dir.join("gdaki_device_entries.rs"), text.as_bytes())
}
