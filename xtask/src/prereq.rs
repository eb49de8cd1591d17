//! What the test suite needs from outside cargo, installed when it is missing and we are allowed to:
//! rdma-core's `infiniband/mlx5dv.h` (the golden layout tests compile C against it; gdaki-mlx5-sys binds it and
//! links libibverbs/libmlx5), libclang (bindgen, for gdaki-mlx5-sys), ptxas (the PTX check), and cuobjdump /
//! nvdisasm (`cargo xtask sass`).
//!
//! Installing is done the way a person would on these machines: Debian's `libibverbs-dev` with apt-get when we
//! are root, and NVIDIA's `nvidia-cuda-nvcc-cu12` wheel with pip (ptxas needs no GPU), into `target/ptxas-wheel`
//! rather than into the system's Python, which may be externally managed. When a step fails, the error is one
//! line saying what to install.

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

/// PyPI package that ships cuobjdump (`nvidia/cu13/bin/cuobjdump`; CUDA 13 reads sm_90 cubins of ptxas 12).
pub const CUOBJDUMP_WHEEL: &str = "nvidia-cuda-cuobjdump";

/// PyPI package that ships nvdisasm (`nvidia/cu13/bin/nvdisasm`).
pub const NVDISASM_WHEEL: &str = "nvidia-cuda-nvdisasm";

/// Debian package that gives the system `python3` its pip (stock Debian and Ubuntu images may lack it).
pub const PIP_PACKAGE: &str = "python3-pip";

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
    if !can_apt_get() {
        bail!("{hint}");
    }
    eprintln!("xtask: {MLX5DV_HEADER} is missing; installing {MLX5DV_PACKAGE} with apt-get");
    apt_get_install(MLX5DV_PACKAGE).with_context(|| hint.clone())?;
    if !header.exists() {
        bail!("{hint} (apt-get installed {MLX5DV_PACKAGE} but the header is still missing)");
    }
    Ok(())
}

/// Debian package that ships libclang, which bindgen loads to generate gdaki-mlx5-sys's bindings.
pub const LIBCLANG_PACKAGE: &str = "libclang-dev";

/// Makes sure bindgen can find a libclang (`$LIBCLANG_PATH`, or `libclang*.so*` where Debian and other
/// distributions put it), installing [`LIBCLANG_PACKAGE`] with apt-get if we are root. The workspace's
/// gdaki-mlx5-sys (the mlx5 backend's bindings) needs it to build.
///
/// # Errors
/// No libclang, and it cannot be installed here (not root, no apt-get, or apt-get failed).
pub fn ensure_libclang() -> Result<()> {
    if has_libclang() {
        return Ok(());
    }
    let hint = format!(
        "libclang not found (bindgen needs it for gdaki-mlx5-sys): install Debian's {LIBCLANG_PACKAGE} \
         (apt-get install {LIBCLANG_PACKAGE}) or set LIBCLANG_PATH"
    );
    if !can_apt_get() {
        bail!("{hint}");
    }
    eprintln!("xtask: libclang is missing; installing {LIBCLANG_PACKAGE} with apt-get");
    apt_get_install(LIBCLANG_PACKAGE).with_context(|| hint.clone())?;
    if !has_libclang() {
        bail!("{hint} (apt-get installed {LIBCLANG_PACKAGE} but no libclang*.so is found)");
    }
    Ok(())
}

/// Whether a libclang shared library is where clang-sys looks for one.
fn has_libclang() -> bool {
    let mut dirs: Vec<PathBuf> = std::env::var_os("LIBCLANG_PATH").map(PathBuf::from).into_iter().collect();
    dirs.extend(
        ["/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib"].map(PathBuf::from),
    );
    if let Ok(entries) = std::fs::read_dir("/usr/lib") {
        dirs.extend(
            entries
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with("llvm-"))
                .map(|e| e.path().join("lib")),
        );
    }
    dirs.iter().any(|d| {
        std::fs::read_dir(d).is_ok_and(|mut entries| {
            entries.any(|e| {
                e.is_ok_and(|e| {
                    let n = e.file_name().to_string_lossy().into_owned();
                    n.starts_with("libclang") && n.contains(".so") && !n.starts_with("libclang-cpp")
                })
            })
        })
    })
}

/// Finds ptxas ([`crate::ptxas::find`]), installing [`PTXAS_WHEEL`] into `wheel_dir` if there is none; see
/// [`ensure_tool`].
///
/// # Errors
/// ptxas is missing and pip could not install it, or installed it where it cannot be found.
pub fn ensure_ptxas(wheel_dir: &Path) -> Result<PathBuf> {
    ensure_tool("ptxas", crate::ptxas::PTXAS_ENV, PTXAS_WHEEL, wheel_dir)
}

/// Finds the CUDA binary `tool` ([`crate::ptxas::find_tool`], `$env` first), installing the PyPI package
/// `wheel` into `wheel_dir` with `python3 -m pip install --target` if there is none (and pip itself,
/// [`PIP_PACKAGE`], with apt-get if python3 has none and we are root).
///
/// `--target`, not a plain install: pip refuses to install into an externally managed Python (PEP 668: Debian
/// 12's and Ubuntu 23.04+'s system Python, "externally-managed-environment"), but it does not check when given a
/// folder of our own; and it leaves the user's Python alone on every other system too. One folder per wheel
/// family: `pip install --target --upgrade` replaces the top-level `nvidia/` folder it finds there.
///
/// # Errors
/// `tool` is missing and pip could not install it, or installed it where it cannot be found.
pub fn ensure_tool(tool: &str, env: &str, wheel: &str, wheel_dir: &Path) -> Result<PathBuf> {
    if let Some(path) = crate::ptxas::find_tool(tool, env, wheel_dir) {
        return Ok(path);
    }
    let hint = format!(
        "{tool} not found: install it with `python3 -m pip install --target {} {wheel}` (cargo xtask looks \
         there), put CUDA's bin folder on PATH, or set {env}=/path/to/{tool}",
        shell_word(wheel_dir),
    );
    if std::env::var_os(env).is_some() {
        bail!("{hint} (${env} does not name an executable)");
    }
    if !has_pip() {
        if !can_apt_get() {
            bail!("{hint} (python3 has no pip: install Debian's {PIP_PACKAGE} first)");
        }
        eprintln!("xtask: python3 has no pip; installing {PIP_PACKAGE} with apt-get");
        apt_get_install(PIP_PACKAGE).with_context(|| hint.clone())?;
    }
    eprintln!("xtask: {tool} not found; installing {wheel} into {} with pip", wheel_dir.display());
    let mut pip = Command::new("python3");
    pip.args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-input", "--upgrade"])
        .arg("--target")
        .arg(wheel_dir)
        .arg(wheel)
        // As root (CI), pip warns that a virtual environment would be better; not for a folder of our own. An
        // environment variable rather than `--root-user-action`, which a pip older than 22.1 would reject.
        .env("PIP_ROOT_USER_ACTION", "ignore");
    run_streamed(&mut pip).with_context(|| hint.clone())?;
    crate::ptxas::find_tool(tool, env, wheel_dir)
        .with_context(|| format!("{hint} (pip installed {wheel} but {tool} is still not found)"))
}

/// Whether `python3 -m pip` works (stock Debian ships python3 without pip).
fn has_pip() -> bool {
    Command::new("python3")
        .args(["-m", "pip", "--version"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Whether we may install Debian packages here: root, with apt-get on PATH.
fn can_apt_get() -> bool {
    is_root() && which::which("apt-get").is_ok()
}

/// `apt-get update`, then installs `package` without questions or recommended packages.
fn apt_get_install(package: &str) -> Result<()> {
    run_streamed(Command::new("apt-get").args(["update", "-q"]))?;
    // Non-interactive: CI has no standard input, and a configuration prompt would hang the run.
    let mut install = Command::new("apt-get");
    install.env("DEBIAN_FRONTEND", "noninteractive").args(["install", "-y", "-q", "--no-install-recommends"]);
    run_streamed(install.arg(package))
}

/// `path` as one shell word, for a command in a hint that a person copies: quoted if it needs to be.
fn shell_word(path: &Path) -> String {
    let text = path.display().to_string();
    if text.chars().all(|c| c.is_ascii_alphanumeric() || "/._-+,:@%=".contains(c)) {
        text
    } else {
        format!("'{}'", text.replace('\'', r"'\''"))
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_words() {
        assert_eq!(shell_word(Path::new("/w/target/ptxas-wheel")), "/w/target/ptxas-wheel");
        assert_eq!(shell_word(Path::new("/my dir/it's")), r"'/my dir/it'\''s'");
    }
}
