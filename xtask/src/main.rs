//! `cargo xtask`: gdaki's chores. `cargo xtask build-ptx` builds and checks the device PTX; `cargo xtask test`
//! is the project's test command (prerequisites, PTX with ptxas, then `cargo test --workspace`); `cargo xtask fuzz`
//! smoke-runs the cargo-fuzz targets in fuzz/; `cargo xtask sass` counts the SASS instructions of the put path;
//! `cargo xtask loom` model-checks device code's concurrent protocols on their host twins.

mod fuzz;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use xtask::prereq::Installer;
use xtask::workspace::Workspace;
use xtask::{prereq, ptxas, sass, BuiltPtx, PtxBuilder, Result, ARCH, KERNELS_CRATE, PTX_FILE};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "gdaki's chores", version)]
struct Cli {
    #[command(subcommand)]
    command: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Build the project's kernels (testkit/kernels) to target/ptx/gdaki_testkit_kernels.ptx with gdaki-build,
    /// validate it, and assemble it with ptxas if found.
    BuildPtx {
        /// Fail if ptxas is not found (instead of skipping the assembly).
        #[arg(long)]
        require_ptxas: bool,
        /// Also measure the PTX build: cold (empty target dir), incremental (device source touched), no-op.
        #[arg(long)]
        time: bool,
    },
    /// The test command: install missing prerequisites (libibverbs-dev's mlx5dv.h, ptxas), build and check the
    /// PTX with ptxas, then run `cargo test --workspace` with ARGS appended.
    Test {
        /// Arguments for `cargo test --workspace` (after `--`).
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// Smoke-run the cargo-fuzz targets in fuzz/ (installs cargo-fuzz when missing): each for SECONDS from its
    /// corpus (committed seeds included), on the pinned toolchain with RUSTC_BOOTSTRAP=1 and AddressSanitizer.
    Fuzz {
        /// Seconds per target.
        #[arg(long, default_value_t = 20)]
        seconds: u32,
        /// Targets to run (default: all, `wqe_parser` and `wire_decoder`).
        targets: Vec<String>,
    },
    /// Model-check device code's shared-QP and proxy-FIFO protocols with loom on their host twins
    /// (device/tests/loom.rs): `cargo test -p gdaki-device --test loom --release` with `--cfg loom`, in
    /// target/loom. Extra ARGS go to the test binary (after `--`), e.g. a test name or `--nocapture`.
    Loom {
        /// Arguments for the test binary.
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// Build the PTX, assemble it for sm_90, write the SASS of kernels to target/sass/KERNEL.sass (cuobjdump;
    /// installs the cuobjdump and nvdisasm wheels when missing) and print, per kernel, its static instruction
    /// count and the instructions, fences, MMIO stores and loads of its fast path, then its posting loops
    /// (loops with an MMIO store) with their local-memory accesses and the instructions of one fast iteration
    /// with no MMIO store, a doorbell and a BlueFlame write (method: xtask/src/sass.rs).
    Sass {
        /// Kernel to analyse, repeatable (default: every gdaki_sass_* kernel).
        #[arg(long = "kernel", value_name = "NAME")]
        kernels: Vec<String>,
        /// Numbers of MMIO stores that define the fast paths: 1 is a doorbell, 8 a BlueFlame write.
        #[arg(long, value_delimiter = ',', default_values_t = [sass::DOORBELL_STORES, sass::BLUE_FLAME_STORES])]
        mmio: Vec<u32>,
        /// Fail (exit code 1) when an innermost posting loop of the analysed kernels, outside the device crate's
        /// slow paths, has more local-memory accesses than this: a loop that spilled its state to the stack.
        #[arg(long, value_name = "N")]
        max_loop_local: Option<usize>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Task::BuildPtx { require_ptxas, time } => build_ptx_task(require_ptxas, time).map(|()| ExitCode::SUCCESS),
        Task::Test { args } => test_task(&args),
        Task::Fuzz { seconds, targets } => fuzz::run(seconds, &targets).map(|()| ExitCode::SUCCESS),
        Task::Sass { kernels, mmio, max_loop_local } => sass_task(&kernels, &mmio, max_loop_local),
        Task::Loom { args } => loom_task(&args),
    };
    result.unwrap_or_else(|error| {
        eprintln!("error: {error:#}");
        ExitCode::FAILURE
    })
}

fn build_ptx_task(require_ptxas: bool, time: bool) -> Result<()> {
    let workspace = Workspace::current()?;
    let ptxas = match ptxas::find(&workspace.ptxas_wheel_dir()) {
        Some(path) => Some(path),
        None if require_ptxas => {
            let mut installer = Installer::new(workspace.install_log());
            Some(prereq::ensure_ptxas(&mut installer, &workspace.ptxas_wheel_dir())?)
        }
        None => None,
    };
    build_ptx(&workspace, ptxas.as_deref())?;
    if time {
        measure(&workspace)?;
    }
    Ok(())
}

/// Builds, validates, writes `target/ptx/gdaki_testkit_kernels.ptx`, and assembles it with `ptxas` if given.
fn build_ptx(workspace: &Workspace, ptxas: Option<&Path>) -> Result<BuiltPtx> {
    let built =
        PtxBuilder::new(workspace.root.join(KERNELS_CRATE)).target_dir(workspace.nested_target_dir()).build()?;
    let dest = workspace.ptx_dir().join(PTX_FILE);
    built.write_to(&dest)?;
    let info = &built.info;
    println!(
        "PTX: {} ({} bytes, PTX {}.{}, {}; {} kernel(s): {})",
        dest.display(),
        built.ptx.len(),
        info.version.0,
        info.version.1,
        info.target,
        info.entries.len(),
        info.entries.join(", ")
    );
    match ptxas {
        Some(ptxas_path) => {
            let cubin = workspace.ptx_dir().join(format!("gdaki_testkit_kernels.{ARCH}.cubin"));
            let report = ptxas::assemble(ptxas_path, &dest, ARCH, &cubin)?;
            let version = ptxas::version(ptxas_path).unwrap_or_else(|| "version unknown".into());
            println!("ptxas: {} ({version}) -> {}", ptxas_path.display(), cubin.display());
            print!("{}", ptxas::table(&report));
        }
        None => println!("ptxas not found: skipped"),
    }
    Ok(built)
}

/// Times three PTX builds: cold (empty `target/ptx-time`, `core` included), incremental (a device source's
/// modification time set to now), and no-op (nothing changed: what every `cargo build` pays in testkit/build.rs).
fn measure(workspace: &Workspace) -> Result<()> {
    let dir = workspace.target_dir.join("ptx-time");
    remove_dir(&dir)?;
    let build = PtxBuilder::new(workspace.root.join(KERNELS_CRATE)).target_dir(&dir).quiet(true);
    let touched = workspace.root.join(KERNELS_CRATE).join("src/lib.rs");

    let cold = timed(|| build.build())?;
    touch(&touched)?;
    let incremental = timed(|| build.build())?;
    let noop = timed(|| build.build())?;
    remove_dir(&dir)?;

    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "PTX build time ({cores} cores): cold {}, incremental {}, no-op {}",
        secs(cold),
        secs(incremental),
        secs(noop)
    );
    Ok(())
}

fn timed(build: impl FnOnce() -> Result<BuiltPtx>) -> Result<Duration> {
    let start = Instant::now();
    build()?;
    Ok(start.elapsed())
}

fn secs(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

/// Sets `path`'s modification time to now (cargo's fingerprints compare times), leaving its content alone.
fn touch(path: &Path) -> Result<()> {
    let file =
        std::fs::File::options().append(true).open(path).with_context(|| format!("cannot open {}", path.display()))?;
    file.set_modified(SystemTime::now()).with_context(|| format!("cannot touch {}", path.display()))
}

fn remove_dir(dir: &PathBuf) -> Result<()> {
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("cannot remove {}", dir.display()))
        }
        _ => Ok(()),
    }
}

fn sass_task(kernels: &[String], mmio: &[u32], max_loop_local: Option<usize>) -> Result<ExitCode> {
    let workspace = Workspace::current()?;
    let mut installer = Installer::new(workspace.install_log());
    let ptxas = prereq::ensure_ptxas(&mut installer, &workspace.ptxas_wheel_dir())?;
    build_ptx(&workspace, Some(&ptxas))?;
    let mut tool = |name: &str, env: &str, wheel: &str| {
        prereq::ensure_tool(&mut installer, name, env, wheel, &workspace.tool_wheel_dir(name))
    };
    let cuobjdump = tool("cuobjdump", "CUOBJDUMP", prereq::CUOBJDUMP_WHEEL)?;
    let nvdisasm = tool("nvdisasm", "NVDISASM", prereq::NVDISASM_WHEEL)?;
    let cubin = workspace.ptx_dir().join(format!("gdaki_testkit_kernels.{ARCH}.cubin"));
    let out = workspace.sass_dir();
    let (rows, loops) = sass::analyse(&cuobjdump, &nvdisasm, &cubin, kernels, mmio, &out)?;
    let version = |tool: &Path| ptxas::version(tool).unwrap_or_else(|| "version unknown".into());
    println!("cuobjdump: {} ({})", cuobjdump.display(), version(&cuobjdump));
    println!("nvdisasm: {} ({})", nvdisasm.display(), version(&nvdisasm));
    println!("SASS listings and fast paths: {}", out.display());
    print!("{}", sass::table(&rows));
    println!(
        "fast path: the fewest instructions from entry to EXIT that execute that many MMIO stores and no poll \
         (.STRONG.SYS load), loops run at most once, branches decided by known constants (an unknown guard followed \
         both ways), a gdaki_sass_* kernel's path storing at least its WQEs; read the path listings before quoting \
         a count (method and assumptions: xtask/src/sass.rs)"
    );
    if !loops.is_empty() {
        print!("{}", sass::loop_table(&loops));
        println!(
            "iteration: the fewest instructions from a loop's start to its branch back with no MMIO store, a \
             doorbell or a BlueFlame write (-: none), its listing in the loop's .loop-<start>.path-<k>.sass"
        );
    }
    if let Some(max) = max_loop_local {
        let spilled: Vec<_> =
            loops.iter().filter(|l| !l.slow && l.local > max && sass::is_innermost(l, &loops)).collect();
        if !spilled.is_empty() {
            for l in spilled {
                eprintln!(
                    "xtask sass: {} loop {:#x}-{:#x} in {}: {} local-memory accesses (at most {max}): its state \
                     went to the stack",
                    l.kernel, l.start, l.end, l.function, l.local
                );
            }
            return Ok(ExitCode::FAILURE);
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn loom_task(args: &[String]) -> Result<ExitCode> {
    let workspace = Workspace::current()?;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    eprintln!("xtask: RUSTFLAGS=\"--cfg loom\" cargo test -p gdaki-device --test loom --release -- {}", args.join(" "));
    let status = Command::new(&cargo)
        .current_dir(&workspace.root)
        // Its own target directory: `--cfg loom` rebuilds every crate, and would otherwise evict the main build.
        .env("CARGO_TARGET_DIR", workspace.root.join("target/loom"))
        .env("RUSTFLAGS", "--cfg loom")
        .args(["test", "-p", "gdaki-device", "--test", "loom", "--release", "--", "--nocapture"])
        .args(args)
        .status()
        .context("cannot run `cargo test` for the loom models")?;
    match status.code() {
        Some(0) => Ok(ExitCode::SUCCESS),
        Some(code) => Ok(ExitCode::from(u8::try_from(code).unwrap_or(1))),
        None => bail!("the loom models were killed ({status})"),
    }
}

fn test_task(args: &[String]) -> Result<ExitCode> {
    let workspace = Workspace::current()?;
    // Each install is one line here; apt-get's and pip's own output goes to the log.
    let mut installer = Installer::new(workspace.install_log());
    prereq::ensure_mlx5dv_header(&mut installer)?;
    prereq::ensure_libclang(&mut installer)?;
    let ptxas = prereq::ensure_ptxas(&mut installer, &workspace.ptxas_wheel_dir())?;
    build_ptx(&workspace, Some(&ptxas))?;

    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    eprintln!("xtask: cargo test --workspace {}", args.join(" "));
    let status = Command::new(&cargo)
        .current_dir(&workspace.root)
        .args(["test", "--workspace"])
        .args(args)
        .status()
        .context("cannot run `cargo test`")?;
    if status.success() {
        // The emulated NIC's, the fault catalogue's and the port channels' tests again with the NIC's queues in
        // GPU memory (simulated by `SimGpu` where there is no GPU): the other placement.
        eprintln!("xtask: GDAKI_QUEUES=gpu cargo test -p gdaki -p gdaki-testkit {}", args.join(" "));
        let status = Command::new(&cargo)
            .current_dir(&workspace.root)
            .env("GDAKI_QUEUES", "gpu")
            .args(["test", "-p", "gdaki", "-p", "gdaki-testkit"])
            .args(args)
            .status()
            .context("cannot run `cargo test`")?;
        return exit_code(status);
    }
    exit_code(status)
}

/// `cargo test`'s exit status as ours.
fn exit_code(status: std::process::ExitStatus) -> Result<ExitCode> {
    match status.code() {
        Some(0) => Ok(ExitCode::SUCCESS),
        // cargo's own code (101 for failed tests), passed on.
        Some(code) => Ok(ExitCode::from(u8::try_from(code).unwrap_or(1))),
        None => bail!("`cargo test` was killed ({status})"),
    }
}
