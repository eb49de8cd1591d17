//! What the test suite needs from outside cargo, installed when it is missing and we are allowed to:
//! rdma-core's `infiniband/mlx5dv.h` (the golden layout tests compile C against it) and ptxas (the PTX check).
//!
//! Installing is done the way a person would on these machines: Debian's `libibverbs-dev` with apt-get when we
//! are root, and NVIDIA's `nvidia-cuda-nvcc-cu12` wheel with pip (ptxas needs no GPU). When a step fails, the
//! error is one line saying what to install.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context};

use crate::Result;

/// The header the golden tests compile against.
pub const MLX5DV_HEADER: &str = "/usr/include/infiniband/mlx5dv.h";

/// Debian package that ships [`MLX5DV_HEADER`].
pub const MLX5DV_PACKAGE: &str = "libibverbs-dev";

/// PyPI package that ships ptxas for CUDA 12 (`nvidia/cuda_nvcc/bin/ptxas`).
pub const PTXAS_WHEEL: &str = "nvidia-cuda-nvcc-cu12";

/// Makes sure [`MLX5DV_HEADER`] exists, installing [`MLX5DV_PACKAGE`] with apt-get if we are root.
///
/// # Errors
/// The header is missing and cannot be installed here (not root, no apt-get, or apt-get failed).
pub fn ensure_mlx5dv_header() -> Result<()> {
    let header = Path::new(MLX5DV_HEADER);
    if header.exists() {
        return Ok(());
    }
    let hint =
        format!("{MLX5DV_HEADER} is missing: install Debian's {MLX5DV_PACKAGE} (apt-get install {MLX5DV_PACKAGE})");
    if !is_root() || which::which("apt-get").is_err() {
        bail!("{hint}");
    }
    eprintln!("xtask: {MLX5DV_HEADER} is missing; installing {MLX5DV_PACKAGE} with apt-get");
    run_streamed(Command::new("apt-get").args(["update", "-q"])).with_context(|| hint.clone())?;
    // Non-interactive: CI has no standard input, and a configuration prompt would hang the run.
    let mut install = Command::new("apt-get");
    install.env("DEBIAN_FRONTEND", "noninteractive").args(["install", "-y", "-q", "--no-install-recommends"]);
    run_streamed(install.arg(MLX5DV_PACKAGE)).with_context(|| hint.clone())?;
    if !header.exists() {
        bail!("{hint} (apt-get installed {MLX5DV_PACKAGE} but the header is still missing)");
    }
    Ok(())
}

/// Finds ptxas ([`crate::ptxas::find`]), installing [`PTXAS_WHEEL`] with `python3 -m pip` if there is none.
///
/// # Errors
/// ptxas is missing and pip could not install it, or installed it where it cannot be found.
pub fn ensure_ptxas() -> Result<PathBuf> {
    if let Some(ptxas) = crate::ptxas::find() {
        return Ok(ptxas);
    }
    let hint = format!(
        "ptxas not found: install it with `python3 -m pip install {PTXAS_WHEEL}`, put CUDA's bin folder on PATH, or \
         set {}=/path/to/ptxas",
        crate::ptxas::PTXAS_ENV
    );
    if std::env::var_os(crate::ptxas::PTXAS_ENV).is_some() {
        bail!("{hint} (${} does not name an executable)", crate::ptxas::PTXAS_ENV);
    }
    eprintln!("xtask: ptxas not found; installing {PTXAS_WHEEL} with pip");
    run_streamed(Command::new("python3").args([
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        PTXAS_WHEEL,
    ]))
    .with_context(|| hint.clone())?;
    crate::ptxas::find().with_context(|| format!("{hint} (pip installed {PTXAS_WHEEL} but ptxas is still not found)"))
}

/// Runs `cmd` with its output shown as it comes; fails on a non-zero exit.
fn run_streamed(cmd: &mut Command) -> Result<()> {
    let program = cmd.get_program().to_string_lossy().into_owned();
    let status = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .status()
        .with_context(|| format!("cannot run {program}"))?;
    if !status.success() {
        bail!("`{program}` failed ({status})");
    }
    Ok(())
}

/// Whether this process runs as root (`id -u` prints 0).
fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}
