//! Runnable gdaki examples live beside this crate as `[[example]]` targets; this library holds what several of
//! them (and `gdaki-perf`) share.

use std::sync::Arc;

mod processes;

use gdaki::bootstrap::{Launch, LaunchFlags};
use gdaki::channel::{Communicator, RankSetup};
use gdaki::exec::{Executor, ExecutorKind};
use gdaki::nic::emu::WireConfig;
use gdaki::nic::{Nic, NicSpec};

/// The commit this crate was built from (`git rev-parse --short=12 HEAD`, `-dirty` when the tree had
/// changes, "unknown" outside a git checkout), so that results name it where no checkout is (the GPU machine).
pub const COMMIT: &str = env!("GDAKI_COMMIT");

/// `println!` that ignores a failed write, in one `write` of the whole line: a closed stdout (`| head`) must
/// neither stop a run nor lose its JSON file (`println!` panics on the broken pipe), and the line never mixes
/// with another process's output on the same pipe.
#[macro_export]
macro_rules! outln {
    () => {
        $crate::write_stdout(::std::string::String::from("\n"))
    };
    ($($arg:tt)*) => {
        $crate::write_stdout(::std::format!("{}\n", ::std::format_args!($($arg)*)))
    };
}

/// Writes `text` to stdout in one call (what [`outln!`] expands to), dropping a failed write.
pub fn write_stdout(text: String) {
    use std::io::Write;
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
}

/// `eprintln!` in one `write` of the whole line: the ranks of a multi-process run share one stderr, and
/// `eprintln!` writes each formatted piece with a call of its own, so two ranks' lines could mix within a line.
/// A line shorter than `PIPE_BUF` (4 KiB) written once to a pipe is never split by another writer's.
#[macro_export]
macro_rules! eprintln_line {
    ($($arg:tt)*) => {
        $crate::write_stderr_line(::std::format!($($arg)*))
    };
}

/// Writes `line` and a newline to stderr in one call (what [`eprintln_line!`] expands to); a failed write is
/// dropped, as `eprintln!` would have nothing better to do with it than to panic.
pub fn write_stderr_line(mut line: String) {
    use std::io::Write;
    line.push('\n');
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// The launch flags every program with ranks takes (the two-rank examples, `gdaki-perf`, `train`): a run of one
/// rank per process (`--world-size`, `--rank`, `--bootstrap`, `--secret`, `--secret-file`, `--wire`), or
/// `--processes` to start them; `--gpu` and `--bootstrap-timeout`. Without the rank flags, mpirun's, srun's or
/// torchrun's environment decides, and without that every rank runs in this process.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct LaunchArgs {
    /// Ranks of a multi-process run, one per process, over the emulated NIC's wire (as many as the program
    /// takes). Default: from mpirun/srun/torchrun's environment, else every rank in this process.
    #[arg(long)]
    pub world_size: Option<u32>,
    /// This process's rank in a multi-process run.
    #[arg(long)]
    pub rank: Option<u32>,
    /// Rank 0's bootstrap address HOST:PORT (default: GDAKI_BOOTSTRAP, MASTER_ADDR:MASTER_PORT, else
    /// 127.0.0.1:29500). Rank 0 binds exactly this address.
    #[arg(long)]
    pub bootstrap: Option<String>,
    /// Session secret, 32 hex digits, e.g. from `openssl rand -hex 16` (default: --secret-file, GDAKI_SECRET,
    /// GDAKI_SECRET_FILE; without any, one derived from the bootstrap address and the world size, which only a
    /// loopback address may use).
    #[arg(long)]
    pub secret: Option<String>,
    /// File holding the session secret (32 hex digits), accessible by its owner only (chmod 600).
    #[arg(long, value_name = "PATH")]
    pub secret_file: Option<std::path::PathBuf>,
    /// GPU of this process's ranks on the gpu executor, 0-based (default: each rank's local rank modulo the
    /// GPUs this process sees: one GPU per rank on a host with as many).
    #[arg(long, value_name = "ORDINAL")]
    pub gpu: Option<usize>,
    /// Seconds a rank waits for the others to join the bootstrap, and for each of its exchanges, before it
    /// gives up with an error naming what it waited for (default 60; 1 to 3600).
    #[arg(long, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub bootstrap_timeout: Option<u64>,
    /// Start N processes of this program on this host, one rank each, and wait for them (as `torchrun
    /// --nproc-per-node N` would): each gets --world-size N, its --rank and a free loopback --bootstrap
    /// port, the session secret in GDAKI_SECRET, and on the gpu executor GPU `rank % GPUs seen` unless --gpu
    /// names one (CUDA_VISIBLE_DEVICES, inherited, picks which GPUs are seen). The ranks end with this
    /// process. Not under another launcher.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=64),
          conflicts_with_all = ["world_size", "rank", "bootstrap", "secret", "secret_file"])]
    pub processes: Option<u32>,
    /// Address this rank's emulated NIC listens on for its peers, in a run of one rank per process (default
    /// 127.0.0.1:0; use a routable one across hosts; port 0: a free one).
    #[arg(long, value_name = "ADDR", value_parser = parse_wire)]
    pub wire: Option<std::net::SocketAddr>,
}

/// `--wire`'s value: a socket address with a specific IP. An unspecified one (`0.0.0.0`, `::`) is refused
/// here, as the emulated NIC would refuse it, since the NIC advertises the address it listens on to its peers;
/// refused at parsing, it ends the program before its header and in a run of ranks of this process too.
fn parse_wire(s: &str) -> Result<std::net::SocketAddr, String> {
    let addr: std::net::SocketAddr = s.trim().parse().map_err(|e| format!("{e} (expected IP:PORT)"))?;
    if addr.ip().is_unspecified() {
        return Err(format!(
            "{} is not a specific address: the NIC tells its peers the address it listens on, so name one \
             they can reach (127.0.0.1:0 on one host, this host's routable address across hosts)",
            addr.ip()
        ));
    }
    Ok(addr)
}

impl LaunchArgs {
    /// The wire of this process's emulated NIC: `--wire`, with the default retry timeout and inbound queue.
    /// `GDAKI_WIRE_IPC=1` lets WRITEs from GPU memory to a peer process on this host skip TCP
    /// ([`WireConfig::gpu_ipc`], off by default).
    pub fn wire_config(&self) -> WireConfig {
        let loopback = WireConfig::loopback();
        let gpu_ipc = std::env::var("GDAKI_WIRE_IPC").is_ok_and(|v| v == "1");
        WireConfig { listen: self.wire.unwrap_or(loopback.listen), gpu_ipc, ..loopback }
    }

    /// With `--processes N`: starts N processes of this program with the same arguments, less `--processes`,
    /// plus each one's rank flags, inheriting standard output and error, and waits for all of them. Once one
    /// fails, the others have 3 s to end by themselves before they are stopped (SIGKILL), as torchrun stops
    /// a failed launch's workers; each rank that failed or was stopped is named on standard error with how it
    /// ended. Returns the exit code to leave with: success when every process succeeded, else the code of
    /// the first rank seen failing (a process killed by a signal counts as 1), or 2, before anything starts,
    /// for an N outside `ranks` (the rank counts the program takes), a `--wire` with a port (each process
    /// would listen on it), or a launcher's environment of more than one rank (this process is a rank
    /// already), and when a process could not be started (those already
    /// started are killed). `None` without the flag: run as usual.
    pub fn spawn_processes(&self, ranks: std::ops::RangeInclusive<u32>) -> Option<std::process::ExitCode> {
        let n = self.processes?;
        let refused = if !ranks.contains(&n) {
            Some(match ranks.start() == ranks.end() {
                true => format!("this program takes {} ranks", ranks.start()),
                false => format!("this program takes {} to {} ranks", ranks.start(), ranks.end()),
            })
        } else if let Some(w) = self.wire.filter(|w| w.port() != 0 && n > 1) {
            // Every process would listen on it: all but the first would fail to start their NIC.
            Some(format!("--wire {w} names a port, which only one of the {n} processes could listen on: give port 0 (a free one each) or leave --wire out"))
        } else {
            match Launch::resolve_from_process_env(LaunchFlags::default()) {
                // A world of one (a Slurm batch script's environment) is no launch of ranks.
                Ok(Some(l)) if l.world_size > 1 => {
                    Some(format!("this process is rank {} of a launch by {} already", l.rank, l.source))
                }
                _ => None,
            }
        };
        let r = match refused {
            Some(why) => Err(why),
            None => processes::spawn(n),
        };
        Some(r.unwrap_or_else(|why| {
            crate::eprintln_line!("error: --processes {n}: {why}");
            std::process::ExitCode::from(2)
        }))
    }

    /// The flags of the launch, for [`Launch::resolve`].
    pub fn flags(&self) -> LaunchFlags {
        LaunchFlags {
            rank: self.rank,
            world_size: self.world_size,
            bootstrap: self.bootstrap.clone(),
            secret: self.secret.clone(),
            secret_file: self.secret_file.clone(),
        }
    }

    /// `--bootstrap-timeout`, 60 s without it.
    pub fn bootstrap_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.bootstrap_timeout.unwrap_or(60))
    }

    /// The GPU of a process that runs `launch`'s rank (`None`: every rank in this process, on its first GPU):
    /// `--gpu`, else [`gdaki::exec::default_gpu`] of the local rank.
    pub fn gpu_of(&self, launch: Option<&Launch>) -> usize {
        self.gpu.unwrap_or_else(|| launch.map_or(0, |l| gdaki::exec::default_gpu(l.local_rank)))
    }

    /// This process's place in a two-rank run, or `None` when both ranks run here (no flags, no launcher, or
    /// a launcher's world of one, as a Slurm batch script's environment is).
    ///
    /// # Errors
    /// A one-line message: what `Launch::resolve` refused, or a world size other than 2 (naming the launcher),
    /// `--world-size 1` among them: that flag asks for a world of one rank, which a two-rank program does not take.
    pub fn two_ranks(&self) -> Result<Option<Launch>, String> {
        match Launch::resolve_from_process_env(self.flags()).map_err(|e| e.to_string())? {
            Some(l) if l.world_size == 2 => Ok(Some(l)),
            Some(l) if l.world_size > 2 || self.world_size.is_some() => {
                Err(format!("this example takes 2 ranks, the launch ({}) has {}", l.source, l.world_size))
            }
            _ => Ok(None),
        }
    }
}

/// `Err` naming the first value that `flag`'s list has twice (`name` says it as the tables do): each value
/// is a table or a row of its own, and one named twice ran twice and printed its rows twice over.
///
/// # Errors
/// The one line to print before exiting with code 2: `FLAG names VALUE twice`.
pub fn refuse_repeats<T: PartialEq>(flag: &str, values: &[T], name: impl Fn(&T) -> &str) -> Result<(), String> {
    match values.iter().enumerate().find(|(i, v)| values[..*i].contains(v)) {
        Some((_, v)) => Err(format!("{flag} names {} twice", name(v))),
        None => Ok(()),
    }
}

/// Creates the `--json` file at `path`, if any, before the run: a path that cannot be written is an error before
/// anything is measured, not after it.
///
/// # Errors
/// The one line to print before exiting with code 2: `--json PATH: ` and why the file could not be created.
pub fn create_json(path: Option<&std::path::Path>) -> Result<Option<std::fs::File>, String> {
    path.map(|p| std::fs::File::create(p).map_err(|e| format!("--json {}: {e}", p.display()))).transpose()
}

/// Checks, before anything is printed, that the NIC `--nic` names can be opened for `exec`, the executor the
/// run uses: the emulated NIC always can; a real one is opened once (device, port, GID, and the queue path
/// `exec` takes: DevX serves the `gpu` executor only, so `GDAKI_MLX5_QUEUES=devx` is refused for `cpu` and
/// not for `gpu`) and closed.
///
/// # Errors
/// The one line to print before exiting with code 2: no RDMA device ("no RDMA devices found: ..."), none of
/// that name, a port that cannot serve, a queue path that cannot serve `exec`, or a build without the `mlx5`
/// feature.
pub fn check_nic(spec: &NicSpec, exec: &Executor) -> Result<(), String> {
    match spec {
        NicSpec::Emu => Ok(()),
        real => Nic::open(real, exec, None).map(drop).map_err(|e| e.to_string()),
    }
}

/// Runs `rank_main` on each rank of a two-rank run through the library's [`gdaki::channel::run_ranks`]: both
/// ranks on threads of this process when `launch` is `None`, else this process's rank of `launch`; with
/// `one_nic` (both ranks here) on one shared NIC; `gpu` is `--gpu` ([`RankSetup::gpu`]). Returns (rank, what
/// `rank_main` returned) per rank here.
///
/// # Errors
/// A one-line message when the in-process bootstrap cannot start.
pub fn run_ranks<T: Send>(
    launch: Option<Launch>,
    (kind, args): (ExecutorKind, &LaunchArgs),
    nic: &NicSpec,
    one_nic: bool,
    rank_main: impl Fn(Arc<Communicator>) -> T + Sync,
) -> Result<Vec<(u32, gdaki::Result<T>)>, String> {
    let setup = RankSetup {
        launch,
        nic: nic.clone(),
        one_nic,
        gpu: args.gpu,
        timeout: args.bootstrap_timeout(),
        wire: args.wire_config(),
        ..RankSetup::local(2, kind)
    };
    gdaki::channel::run_ranks(&setup, rank_main).map_err(|e| e.to_string())
}

/// Every rank's checked payloads and failures, summed over the bootstrap `bs` (every rank calls it, at the same
/// point): what rank 0 reports for a run of one rank per process. A failed exchange is one failure more on this
/// rank's own counts, with an error line naming `rank`.
pub fn sum_checks(bs: &gdaki::bootstrap::Bootstrap, rank: u32, passed: u64, failed: u64) -> (u64, u64) {
    match bs.all_gather_pod(&[passed, failed]) {
        Ok(all) => all.iter().fold((0, 0), |(p, f), [q, g]| (p + q, f + g)),
        Err(e) => {
            crate::eprintln_line!("error: rank {rank}: gathering the ranks' checks: {e}");
            (passed, failed + 1)
        }
    }
}

/// Where the emulated NIC keeps its SQ rings, CQ rings and dbrecs: the programs' `--queues` flag.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Queues {
    /// GPU memory, as DOCA GPUNetIO and NVSHMEM IBGDA place them: the default on the `gpu` executor
    /// (simulated on the `cpu` executor).
    Gpu,
    /// Host memory: pinned and mapped into the GPU on the `gpu` executor (NVSHMEM's
    /// `IBGDA_FORCE_NIC_BUF_MEMTYPE=hostmem`); the default on the `cpu` executor.
    Host,
}

pub use gdaki_testkit::init_tracing;

/// Applies `--queues`: sets [`gdaki::nic::emu::QUEUES_ENV`] for this process and the ranks it launches, which
/// every emulated NIC it opens then follows, and starts [`init_tracing`]. Without the flag the variable is
/// left as it is (unset: GPU memory on the `gpu` executor, host memory on the `cpu` executor); if it holds
/// neither `gpu` nor `host`, this ends the process with a one-line error and exit code 2, before anything is
/// printed: every emulated NIC would refuse to open, after the program's header had named a placement. Call it
/// first in `main`, before any thread starts.
pub fn apply_queues(q: Option<Queues>) {
    init_tracing();
    let var = gdaki::nic::emu::QUEUES_ENV;
    match q {
        Some(q) => {
            let v = match q {
                Queues::Gpu => "gpu",
                Queues::Host => "host",
            };
            std::env::set_var(var, v);
        }
        None => {
            // A value that is not UTF-8 is neither `gpu` nor `host`, and the NIC refuses it too.
            let v = match std::env::var(var) {
                Ok(v) => Some(v).filter(|v| !matches!(v.as_str(), "gpu" | "host")).map(|v| format!("{v:?}")),
                Err(std::env::VarError::NotPresent) => None,
                Err(std::env::VarError::NotUnicode(v)) => Some(format!("{v:?}")),
            };
            if let Some(v) = v {
                crate::eprintln_line!("error: {var}={v}: queues must be gpu or host (or {var} unset)");
                std::process::exit(2);
            }
        }
    }
}

/// The placement the emulated NIC's queues get on executor `kind` (for the programs' headers): `gpu`, `host`, or
/// `gpu (simulated)` for `GDAKI_QUEUES=gpu` on the `cpu` executor.
pub fn queues_label(kind: ExecutorKind) -> &'static str {
    placement_label(kind, std::env::var(gdaki::nic::emu::QUEUES_ENV).ok().as_deref())
}

/// [`queues_label`] for `GDAKI_QUEUES` set to `asked` (`None`: unset).
fn placement_label(kind: ExecutorKind, asked: Option<&str>) -> &'static str {
    match (kind, asked) {
        (ExecutorKind::Gpu, Some("host")) => "host",
        // Unset on the `gpu` executor: its default (`apply_queues` refused any value but `gpu` and `host`).
        (ExecutorKind::Gpu, _) => "gpu",
        (ExecutorKind::Cpu, Some("gpu")) => "gpu (simulated)",
        (ExecutorKind::Cpu, _) => "host",
    }
}

/// One line saying what the emulated NIC's thread did and waited for between two snapshots of its counters,
/// per `per` operations named `what` (e.g. "round trip"): doorbells, WQEs, CQEs, SQ ranges read from a ring mirror
/// (and the time spent waiting for the mirror), SQ fetches from GPU memory and host synchronizes (each with its
/// mean time), the time per operation the thread spent waiting for the GPU, and the time it spent in passes
/// that found work (all of its own share of the latency).
/// The measured cause behind a latency that the device code's own work does not explain; and the WRITE pieces sent
/// by mapping (the wire's same-host path).
pub fn emu_waits(before: &gdaki::nic::emu::Stats, after: &gdaki::nic::emu::Stats, per: u64, what: &str) -> String {
    let n = per.max(1) as f64;
    let mean = |ns: u64, count: u64| if count == 0 { 0.0 } else { ns as f64 / count as f64 / 1e3 };
    let (fetches, fetch_ns) = (after.ring_fetches - before.ring_fetches, after.ring_fetch_ns - before.ring_fetch_ns);
    let (syncs, sync_ns) = (after.host_syncs - before.host_syncs, after.host_sync_ns - before.host_sync_ns);
    format!(
        "# emulated NIC per {what}: {:.2} doorbells, {:.2} WQEs, {:.2} CQEs, {:.2} SQ ranges from the ring's mirror ({:.2} µs \
         waiting for it), {:.2} SQ fetches from GPU memory ({:.2} µs each), {:.2} host synchronizes ({:.2} µs each, fetches \
         included): {:.2} µs of each {what} waited for the GPU; {:.2} µs in the NIC thread's passes that found work; \
         {:.2} WRITE pieces sent by mapping (the peer process copied them)",
        (after.doorbells - before.doorbells) as f64 / n,
        (after.wqes - before.wqes) as f64 / n,
        (after.cqes - before.cqes) as f64 / n,
        (after.ring_mirrored - before.ring_mirrored) as f64 / n,
        (after.ring_mirror_wait_ns - before.ring_mirror_wait_ns) as f64 / n / 1e3,
        fetches as f64 / n,
        mean(fetch_ns, fetches),
        syncs as f64 / n,
        mean(sync_ns, syncs),
        sync_ns as f64 / n / 1e3,
        (after.busy_ns - before.busy_ns) as f64 / n / 1e3,
        (after.ipc_pieces - before.ipc_pieces) as f64 / n,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The header says where the NIC put the queues: its defaults (GPU memory on `gpu`, host memory on `cpu`)
    /// and what `GDAKI_QUEUES` asked for.
    #[test]
    fn the_label_follows_the_nics_placement() {
        assert_eq!(placement_label(ExecutorKind::Gpu, None), "gpu");
        assert_eq!(placement_label(ExecutorKind::Gpu, Some("gpu")), "gpu");
        assert_eq!(placement_label(ExecutorKind::Gpu, Some("host")), "host");
        assert_eq!(placement_label(ExecutorKind::Cpu, None), "host");
        assert_eq!(placement_label(ExecutorKind::Cpu, Some("host")), "host");
        assert_eq!(placement_label(ExecutorKind::Cpu, Some("gpu")), "gpu (simulated)");
    }
}
