//! What the test suite needs from outside cargo, installed when it is missing and we are allowed to:
//! rdma-core's `infiniband/mlx5dv.h` (the golden layout tests compile C against it; gdaki-mlx5-sys binds it and
//! links libibverbs/libmlx5), libclang (bindgen, for gdaki-mlx5-sys), ptxas (the PTX check), and cuobjdump /
//! nvdisasm (`cargo xtask sass`).
//!
//! Installing is done the way a person would on these machines: Debian's `libibverbs-dev` with apt-get when we
//! are root, and NVIDIA's `nvidia-cuda-nvcc-cu12` wheel with pip (ptxas needs no GPU), into `target/ptxas-wheel`
//! rather than into the system's Python, which may be externally managed. When a step fails, the error is one
//! line saying what to install.
//!
//! An [`Installer`] runs the installs of one `cargo xtask` run: apt-get's and pip's output goes to one log file
//! under the target directory (not to the terminal), each install prints one line on stderr (what, with which
//! tool, about how long it takes, then how long it took), a failure names the log and quotes its last lines, and
//! `apt-get update` runs at most once.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

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
pub fn ensure_mlx5dv_header(installer: &mut Installer) -> Result<()> {
    let header = Path::new(MLX5DV_HEADER);
    if header.exists() {
        return Ok(());
    }
    let hint =
        format!("{MLX5DV_HEADER} is missing: install Debian's {MLX5DV_PACKAGE} (apt-get install {MLX5DV_PACKAGE})");
    if !can_apt_get() {
        bail!("{hint}");
    }
    installer.apt_get_install(MLX5DV_PACKAGE, "for infiniband/mlx5dv.h").with_context(|| hint.clone())?;
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
pub fn ensure_libclang(installer: &mut Installer) -> Result<()> {
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
    installer.apt_get_install(LIBCLANG_PACKAGE, "for bindgen").with_context(|| hint.clone())?;
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
pub fn ensure_ptxas(installer: &mut Installer, wheel_dir: &Path) -> Result<PathBuf> {
    ensure_tool(installer, "ptxas", crate::ptxas::PTXAS_ENV, PTXAS_WHEEL, wheel_dir)
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
pub fn ensure_tool(installer: &mut Installer, tool: &str, env: &str, wheel: &str, wheel_dir: &Path) -> Result<PathBuf> {
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
        installer.apt_get_install(PIP_PACKAGE, "python3 has no pip").with_context(|| hint.clone())?;
    }
    let mut pip = Command::new("python3");
    pip.args([
        "-m",
        "pip",
        "install",
        "--disable-pip-version-check",
        "--no-input",
        "--progress-bar",
        "off",
        "--upgrade",
    ])
    .arg("--target")
    .arg(wheel_dir)
    .arg(wheel)
    // As root (CI), pip warns that a virtual environment would be better; not for a folder of our own. An
    // environment variable rather than `--root-user-action`, which a pip older than 22.1 would reject.
    .env("PIP_ROOT_USER_ACTION", "ignore");
    let what = format!("{wheel} into {} for {tool}", wheel_dir.display());
    installer.step(&what, "pip", expected_time(wheel), &mut pip).with_context(|| hint.clone())?;
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

/// About how long installing `package` takes on a CI machine with a fresh image (2 cores, a fast mirror):
/// what the step's line announces.
fn expected_time(package: &str) -> &'static str {
    match package {
        "update" => "about 10 s",
        MLX5DV_PACKAGE => "about 15 s",
        // It pulls in LLVM's and clang's libraries, about 100 MB.
        LIBCLANG_PACKAGE => "about 1 min",
        PIP_PACKAGE => "about 20 s",
        // A wheel of about 40 MB.
        PTXAS_WHEEL => "about 30 s",
        _ => "about 15 s",
    }
}

/// The installs of one `cargo xtask` run: each is one line on stderr, its output goes to [`Installer::log`],
/// and `apt-get update` runs before the first apt-get install and not again.
#[derive(Debug)]
pub struct Installer {
    log: PathBuf,
    /// Whether the log was started (emptied) by this run.
    started: bool,
    /// Whether `apt-get update` ran (successfully) in this run.
    apt_updated: bool,
}

impl Installer {
    /// An installer writing the output of what it runs to `log` (emptied at the first install of the run, its
    /// folder created then).
    pub fn new(log: PathBuf) -> Self {
        Self { log, started: false, apt_updated: false }
    }

    /// The log file of the installs' output.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// `apt-get update` (the first time only), then installs `package` without questions or recommended
    /// packages; `why` says what needs it.
    fn apt_get_install(&mut self, package: &str, why: &str) -> Result<()> {
        if !self.apt_updated {
            let mut update = Command::new("apt-get");
            update.args(["update", "-q"]);
            self.step("the package lists (apt-get update)", "apt-get", expected_time("update"), &mut update)?;
            self.apt_updated = true;
        }
        // Non-interactive: CI has no standard input, and a configuration prompt would hang the run.
        let mut install = Command::new("apt-get");
        install.env("DEBIAN_FRONTEND", "noninteractive").args(["install", "-y", "-q", "--no-install-recommends"]);
        self.step(&format!("{package} ({why})"), "apt-get", expected_time(package), install.arg(package))
    }

    /// Runs `cmd` with its output appended to the log, announced as one line on stderr: "xtask: installing
    /// WHAT (TOOL, EXPECTED)..." and, when it ends, "done in N s" or "failed after N s".
    ///
    /// # Errors
    /// The log cannot be written, `cmd` cannot be started, or it exits with a failure: the error names the log
    /// and quotes its last lines.
    fn step(&mut self, what: &str, tool: &str, expected: &str, cmd: &mut Command) -> Result<()> {
        let log = self.open_log()?;
        eprint!("xtask: installing {what} ({tool}, {expected})... ");
        let _ = std::io::stderr().flush();
        let start = Instant::now();
        let result = self.run_logged(log, cmd);
        let secs = start.elapsed().as_secs_f64();
        match &result {
            Ok(()) => eprintln!("done in {secs:.0} s"),
            Err(_) => eprintln!("failed after {secs:.0} s"),
        }
        result
    }

    /// The log, emptied the first time in this run and appended to after that.
    fn open_log(&mut self) -> Result<std::fs::File> {
        if let Some(dir) = self.log.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        }
        let file = std::fs::File::options()
            .create(true)
            .write(true)
            .append(self.started)
            .truncate(!self.started)
            .open(&self.log)
            .with_context(|| format!("cannot write {}", self.log.display()))?;
        self.started = true;
        Ok(file)
    }

    /// Runs `cmd` with standard output and error going to `log` (after a line with the command).
    fn run_logged(&self, mut log: std::fs::File, cmd: &mut Command) -> Result<()> {
        let line = std::iter::once(cmd.get_program())
            .chain(cmd.get_args())
            .map(|a| a.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ");
        let cannot_write = || format!("cannot write {}", self.log.display());
        writeln!(log, "$ {line}").with_context(cannot_write)?;
        let err = log.try_clone().with_context(cannot_write)?;
        let status = cmd
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .status()
            .with_context(|| format!("cannot run `{line}`"))?;
        if !status.success() {
            bail!(
                "`{line}` failed ({status}); its output is in {}, which ends:\n{}",
                self.log.display(),
                tail(&self.log, 15)
            );
        }
        Ok(())
    }
}

/// The last `n` lines of `file`, indented, or why they cannot be read.
fn tail(file: &Path, n: usize) -> String {
    match std::fs::File::open(file) {
        Ok(f) => {
            let lines: Vec<String> = std::io::BufReader::new(f).lines().map_while(std::result::Result::ok).collect();
            lines[lines.len().saturating_sub(n)..].iter().map(|l| format!("    {l}")).collect::<Vec<_>>().join("\n")
        }
        Err(e) => format!("    (cannot read it: {e})"),
    }
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
    fn steps_log_their_output_and_a_failure_quotes_it() {
        let dir = std::env::temp_dir().join(format!("xtask-installer-{}", std::process::id()));
        let log = dir.join("sub/install.log");
        std::fs::remove_dir_all(&dir).ok();
        let mut installer = Installer::new(log.clone());
        let sh = |script: &str| {
            let mut c = Command::new("sh");
            c.args(["-c", script]);
            c
        };
        installer.step("one", "sh", "about 0 s", &mut sh("echo first-out; echo first-err >&2")).unwrap();
        let err = installer.step("two", "sh", "about 0 s", &mut sh("echo second-out; exit 3")).unwrap_err();
        let text = std::fs::read_to_string(&log).unwrap();
        // Both steps' output, stdout and stderr, in order, after the command line.
        assert!(text.starts_with("$ sh -c echo first-out"), "{text}");
        for (a, b) in [("first-out", "first-err"), ("first-err", "second-out")] {
            assert!(text.find(a).unwrap() < text.find(b).unwrap(), "{text}");
        }
        let err = format!("{err:#}");
        assert!(err.contains(&log.display().to_string()) && err.contains("    second-out"), "{err}");
        // A new run empties the log.
        let mut again = Installer::new(log.clone());
        again.step("three", "sh", "about 0 s", &mut sh("echo third")).unwrap();
        assert_eq!(std::fs::read_to_string(&log).unwrap(), "$ sh -c echo third\nthird\n");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_tail_is_the_last_lines() {
        let file = std::env::temp_dir().join(format!("xtask-tail-{}", std::process::id()));
        std::fs::write(&file, "a\nb\nc\n").unwrap();
        assert_eq!(tail(&file, 2), "    b\n    c");
        assert_eq!(tail(&file, 5), "    a\n    b\n    c");
        std::fs::remove_file(&file).ok();
        assert!(tail(&file, 2).contains("cannot read it"));
    }

    #[test]
    fn shell_words() {
        assert_eq!(shell_word(Path::new("/w/target/ptxas-wheel")), "/w/target/ptxas-wheel");
        assert_eq!(shell_word(Path::new("/my dir/it's")), r"'/my dir/it'\''s'");
    }
}
