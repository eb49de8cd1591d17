//! Builds gdaki-device to PTX for `src/ptx.rs`, so that a plain `cargo build` needs no manual step.
//!
//! The build is `gdaki-build`'s ([`gdaki_build::PtxBuilder`], as any user's build script runs it): a nested
//! `cargo rustc` for `nvptx64-nvidia-cuda` with its own target directory (`<target>/ptx-build`, shared by every
//! outer profile: the outer cargo's lock is on `<target>/<profile>`, so the nested one never waits for it) and an
//! environment cleaned of the outer build's flags. The PTX is validated (target, version, `.entry`, no
//! `.extern`) and written to `OUT_DIR`. ptxas is not needed here; `cargo xtask build-ptx` and `cargo xtask test`
//! run it.
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

use gdaki_build::anyhow::Context;
use gdaki_build::{PtxBuilder, Result, ARCH, PTX_ISA};

/// File name of the module in `OUT_DIR` (the device crate's library name).
const PTX_FILE: &str = "gdaki_device.ptx";

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

    println!("cargo:rerun-if-env-changed={PTX_OVERRIDE_ENV}");

    let dest = out_dir.join(PTX_FILE);
    let entries = match env::var_os(PTX_OVERRIDE_ENV) {
        Some(path) => {
            let path = PathBuf::from(path);
            println!("cargo:rerun-if-changed={}", path.display());
            let ptx = std::fs::read_to_string(&path)
                .with_context(|| format!("cannot read ${PTX_OVERRIDE_ENV} ({})", path.display()))?;
            let info = gdaki_build::validate(&ptx, ARCH, PTX_ISA)?;
            gdaki_build::builder::write_atomically(&dest, ptx.as_bytes())?;
            info.entries
        }
        // Writes OUT_DIR/gdaki_device.ptx and tells cargo when to rerun (the device and shared crates, the lock
        // file, the toolchain pin).
        None => PtxBuilder::new(root.join("device")).build()?.info.entries,
    };
    write_entries(&out_dir, &entries)
}

/// Writes `gdaki_device_entries.rs`: the kernel names as a Rust slice expression, for `ptx::ENTRIES`.
fn write_entries(out_dir: &Path, entries: &[String]) -> Result<()> {
    // `{:?}` quotes and escapes each name; PTX identifiers need no escaping anyway.
    let text = format!("&{entries:?}\n");
    gdaki_build::builder::write_atomically(&out_dir.join("gdaki_device_entries.rs"), text.as_bytes())
}
