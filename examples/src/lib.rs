//! Runnable gdaki examples live beside this crate as `[[example]]` targets; this library holds what several of
//! them (and `gdaki-perf`) share.

use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use gdaki::bootstrap::{Bootstrap, Launch, LaunchFlags, Secret};
use gdaki::channel::Communicator;
use gdaki::exec::{Executor, ExecutorKind};
use gdaki::nic::emu::WireConfig;
use gdaki::nic::{Nic, NicSpec};

/// The commit this crate was built from (`git rev-parse --short=12 HEAD`, `-dirty` when the tree had
/// changes, "unknown" outside a git checkout), so that results name it where no checkout is (the GPU machine).
pub const COMMIT: &str = env!("GDAKI_COMMIT");

/// The flags of a two-process run every two-rank example takes (`--world-size`, `--rank`, `--bootstrap`, `--secret`,
/// `--secret-file`); without them, mpirun's, srun's or torchrun's environment decides, and without that both ranks run
/// in this process.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct LaunchArgs {
    /// Ranks of a multi-process run (2: one rank per process, over the emulated NIC's wire). Default: from
    /// mpirun/srun/torchrun's environment, else both ranks in this process.
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
    /// GDAKI_SECRET_FILE; without any, one derived from the bootstrap address, which only a loopback address
    /// may use).
    #[arg(long)]
    pub secret: Option<String>,
    /// File holding the session secret (32 hex digits), accessible by its owner only (chmod 600).
    #[arg(long, value_name = "PATH")]
    pub secret_file: Option<std::path::PathBuf>,
}

impl LaunchArgs {
    /// This process's place in a two-rank run, or `None` when both ranks run here (no flags, no launcher, or
    /// a world of one).
    ///
    /// # Errors
    /// A one-line message: what `Launch::resolve` refused, or a world size other than 2 (naming the launcher).
    pub fn two_ranks(&self) -> Result<Option<Launch>, String> {
        let flags = LaunchFlags {
            rank: self.rank,
            world_size: self.world_size,
            bootstrap: self.bootstrap.clone(),
            secret: self.secret.clone(),
            secret_file: self.secret_file.clone(),
        };
        match Launch::resolve_from_process_env(flags).map_err(|e| e.to_string())? {
            Some(l) if l.world_size == 2 => Ok(Some(l)),
            Some(l) if l.world_size > 2 => {
                Err(format!("this example takes 2 ranks, the launch ({}) has {}", l.source, l.world_size))
            }
            _ => Ok(None),
        }
    }
}

/// Checks, before anything is printed, that the NIC `--nic` names can be opened: the emulated NIC always can;
/// a real one is opened once (for the `cpu` executor: device, port, GID) and closed.
///
/// # Errors
/// The one line to print before exiting with code 2: no RDMA device ("no RDMA devices found: ..."), none of
/// that name, a port that cannot serve, or a build without the `mlx5` feature.
pub fn check_nic(spec: &NicSpec) -> Result<(), String> {
    match spec {
        NicSpec::Emu => Ok(()),
        real => Nic::open(real, &Executor::Cpu, None).map(drop).map_err(|e| e.to_string()),
    }
}

/// Runs `rank_main` on each rank of a two-rank run, each rank with its own communicator (bootstrap endpoint,
/// executor of `kind`, NIC `nic`, the emulated NIC's wire on loopback): both ranks on threads of this process
/// when `launch` is `None` (rank 0's bootstrap on an ephemeral loopback port, a fresh secret), else this
/// process's rank of `launch`. With `one_nic` (and both ranks in this process) the two communicators share
/// one NIC ([`Communicator::on_nic`]): their QPs meet on its direct path, with no wire between them. Returns
/// (rank, what `rank_main` returned) per rank here, by rank; a rank whose communicator could not be set up
/// (bootstrap within 60 s, executor, NIC) has that error instead.
///
/// # Errors
/// A one-line message when the in-process bootstrap cannot start (no loopback listener, no random source).
pub fn run_ranks<T: Send>(
    launch: Option<Launch>,
    kind: ExecutorKind,
    nic: &NicSpec,
    one_nic: bool,
    rank_main: impl Fn(Arc<Communicator>) -> T + Sync,
) -> Result<Vec<(u32, gdaki::Result<T>)>, String> {
    let shared = match (one_nic, &launch) {
        (true, None) => {
            let (exec, _) = Executor::open(Some(kind)).map_err(|e| e.to_string())?;
            Some(Nic::open(nic, &exec, None).map_err(|e| e.to_string())?)
        }
        _ => None,
    };
    let rank_run = |launch: Launch, listener: Option<TcpListener>| {
        let timeout = Duration::from_secs(60);
        let boot = match listener {
            Some(l) => Bootstrap::root_on(l, &launch, timeout),
            None => Bootstrap::connect(&launch, timeout),
        };
        let comm = boot.and_then(|b| {
            let (exec, _) = Executor::open(Some(kind))?;
            match &shared {
                Some(n) => Communicator::on_nic(b, exec, n.clone()),
                None => Communicator::with_nic(b, exec, nic, WireConfig::loopback()),
            }
        });
        (launch.rank, comm.map(|c| rank_main(Arc::new(c))))
    };
    if let Some(l) = launch {
        return Ok(vec![rank_run(l, None)]);
    }
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("cannot listen on loopback: {e}"))?;
    let root = listener.local_addr().map_err(|e| format!("loopback listener: {e}"))?.to_string();
    let secret = Secret::random().map_err(|e| e.to_string())?;
    let mut listener = Some(listener);
    Ok(std::thread::scope(|s| {
        let handles: Vec<_> = (0..2u32)
            .map(|rank| {
                let l = Launch { rank, world_size: 2, root: root.clone(), secret, source: "this process" };
                let lis = if rank == 0 { listener.take() } else { None };
                let rank_run = &rank_run;
                s.spawn(move || rank_run(l, lis))
            })
            .collect();
        // A panic is a bug: let it go on unwinding here.
        handles.into_iter().map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))).collect()
    }))
}
