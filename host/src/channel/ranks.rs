//! N ranks of one program: every rank's [`Communicator`] set up and handed to the rank's function, either all
//! ranks on threads of this process (a loopback bootstrap with a fresh secret) or this process's one rank of a
//! multi-process launch (mpirun, srun, torchrun or flags: [`Launch`]). The two-rank examples, the benchmarks and
//! a user's first program start here.

use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use crate::bootstrap::{Bootstrap, Launch, Secret, MAX_WORLD_SIZE};
use crate::channel::Communicator;
use crate::exec::{default_gpu, Executor, ExecutorKind};
use crate::nic::emu::WireConfig;
use crate::nic::{Nic, NicSpec};
use crate::{Error, Result};

/// How to set the ranks up.
#[derive(Clone, Debug)]
pub struct RankSetup {
    /// Ranks in this process (ignored with [`RankSetup::launch`]: one rank, the launch's).
    pub ranks: u32,
    /// This process's rank of a multi-process launch, or `None` for all ranks in this process.
    pub launch: Option<Launch>,
    /// The executor every rank opens.
    pub executor: ExecutorKind,
    /// The NIC every rank opens (the emulated one by default).
    pub nic: NicSpec,
    /// With all ranks in this process: one NIC shared by every rank ([`Communicator::on_nic`]: their QPs meet on
    /// its direct path, no wire); else each rank its own NIC, connected over the wire on loopback.
    pub one_nic: bool,
    /// Bound of each rank's bootstrap setup.
    pub timeout: Duration,
    /// The wire of this process's NIC with [`RankSetup::launch`] (ranks in several processes, perhaps on several
    /// hosts: listen on a routable address there, as the guide's "Across processes and hosts" shows). Ranks
    /// in this process always use [`WireConfig::loopback`] (a fixed address could be taken only once).
    pub wire: WireConfig,
    /// The GPU of every rank on the `gpu` executor (0-based, `cuDeviceGet` order). `None`: each rank takes
    /// GPU `local_rank % count` of the `count` GPUs its process sees (in this process, the rank is the local
    /// rank; across processes, [`Launch::local_rank`]), one GPU per rank on a host with as many, as NCCL's
    /// and NVSHMEM's launchers are used ([`default_gpu`]); with [`RankSetup::one_nic`] every rank shares GPU 0,
    /// the NIC's.
    pub gpu: Option<usize>,
}

impl RankSetup {
    /// `ranks` ranks in this process on `executor`, each with its own emulated NIC over the loopback wire.
    pub fn local(ranks: u32, executor: ExecutorKind) -> Self {
        RankSetup {
            ranks,
            launch: None,
            executor,
            nic: NicSpec::Emu,
            one_nic: false,
            wire: WireConfig::loopback(),
            timeout: Duration::from_secs(60),
            gpu: None,
        }
    }

    /// The GPU ordinal of the rank with local rank `local_rank` ([`RankSetup::gpu`]); `spread` is
    /// [`default_gpu`].
    fn gpu_of(&self, local_rank: u32, spread: impl FnOnce(u32) -> usize) -> usize {
        match (self.gpu, self.one_nic && self.launch.is_none()) {
            (Some(g), _) => g,
            (None, true) => 0,
            (None, false) => spread(local_rank),
        }
    }
}

/// Runs `rank_main` on every rank of `setup` at once (a thread each in this process) and returns, by rank, what
/// each returned; a rank whose communicator could not be set up (bootstrap, executor, NIC) has that error
/// instead, and its function does not run. A rank that panics is a bug of the caller's: the other ranks see
/// it leave (their bootstrap calls fail), and the panic goes on unwinding in the caller once all have ended.
///
/// # Errors
/// [`Error::InvalidArgument`] for 0 ranks or more than [`MAX_WORLD_SIZE`] (before any thread starts);
/// [`Error::Unavailable`] when the in-process bootstrap cannot start
/// (no loopback listener) or the shared NIC cannot be opened; [`Error::Bootstrap`] without a random source.
pub fn run_ranks<T: Send>(
    setup: &RankSetup,
    rank_main: impl Fn(Arc<Communicator>) -> T + Sync,
) -> Result<Vec<(u32, Result<T>)>> {
    if setup.launch.is_none() && setup.ranks == 0 {
        return Err(Error::InvalidArgument("run_ranks with 0 ranks".into()));
    }
    if setup.launch.is_none() && setup.ranks > MAX_WORLD_SIZE {
        return Err(Error::InvalidArgument(format!(
            "run_ranks with {} ranks: a session has at most {MAX_WORLD_SIZE}",
            setup.ranks
        )));
    }
    // The CPU executor ignores the ordinal: no need to ask the CUDA driver.
    let on_gpu = setup.executor == ExecutorKind::Gpu;
    let gpu_of = |local_rank| setup.gpu_of(local_rank, |l| if on_gpu { default_gpu(l) } else { 0 });
    let shared = match (setup.one_nic, &setup.launch) {
        (true, None) => {
            let (exec, _) = Executor::open_on(Some(setup.executor), gpu_of(0))?;
            Some(Nic::open(&setup.nic, &exec, None)?)
        }
        _ => None,
    };
    let rank_run = |launch: Launch, listener: Option<TcpListener>| {
        let boot = match listener {
            Some(l) => Bootstrap::root_on(l, &launch, setup.timeout),
            None => Bootstrap::connect(&launch, setup.timeout),
        };
        let comm = boot.and_then(|b| {
            let (exec, _) = Executor::open_on(Some(setup.executor), gpu_of(launch.local_rank))?;
            match &shared {
                Some(n) => Communicator::on_nic(b, exec, n.clone()),
                None => {
                    let wire = if setup.launch.is_some() { setup.wire } else { WireConfig::loopback() };
                    Communicator::with_nic(b, exec, &setup.nic, wire)
                }
            }
        });
        (launch.rank, comm.map(|c| rank_main(Arc::new(c))))
    };
    if let Some(l) = &setup.launch {
        return Ok(vec![rank_run(l.clone(), None)]);
    }
    let listener = TcpListener::bind("127.0.0.1:0")
        .map_err(|e| Error::Unavailable(format!("cannot listen on loopback for the ranks' bootstrap: {e}")))?;
    let root = listener
        .local_addr()
        .map_err(|e| Error::Unavailable(format!("loopback listener of the ranks' bootstrap: {e}")))?
        .to_string();
    let secret = Secret::random()?;
    let mut listener = Some(listener);
    Ok(std::thread::scope(|s| {
        let handles: Vec<_> = (0..setup.ranks)
            .map(|rank| {
                let (root, world_size) = (root.clone(), setup.ranks);
                let l = Launch { rank, world_size, local_rank: rank, root, secret, source: "this process" };
                let lis = if rank == 0 { listener.take() } else { None };
                let rank_run = &rank_run;
                s.spawn(move || rank_run(l, lis))
            })
            .collect();
        // A panic of a rank is a bug: let it go on unwinding here.
        handles.into_iter().map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))).collect()
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_of_each_rank() {
        let local = RankSetup::local(4, ExecutorKind::Gpu);
        let twice = |l: u32| 2 * l as usize;
        // By local rank unless named.
        assert_eq!((0..4).map(|r| local.gpu_of(r, twice)).collect::<Vec<_>>(), [0, 2, 4, 6]);
        assert_eq!(RankSetup { gpu: Some(5), ..local.clone() }.gpu_of(3, twice), 5);
        // One shared NIC keeps every rank in this process on GPU 0, the NIC's; across processes it means nothing.
        assert_eq!(RankSetup { one_nic: true, ..local.clone() }.gpu_of(3, twice), 0);
    }

    /// With a launch (one rank per process, here two threads standing for the processes), the NIC listens where
    /// `wire` says (127.0.0.2, also loopback on Linux); ranks all in one process keep the loopback wire.
    #[test]
    fn a_launch_listens_on_its_wire() {
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let secret = Secret::random().unwrap();
        let wire = WireConfig { listen: "127.0.0.2:0".parse().unwrap(), ..WireConfig::loopback() };
        let listened = |comm: Arc<Communicator>| comm.nic().as_emu().and_then(|n| n.wire_addr()).map(|a| a.ip());
        let ips: Vec<_> = std::thread::scope(|s| {
            let ranks: Vec<_> = (0..2)
                .map(|rank| {
                    let root = format!("127.0.0.1:{port}");
                    let launch = Launch { rank, world_size: 2, local_rank: rank, root, secret, source: "test" };
                    let setup = RankSetup { launch: Some(launch), wire, ..RankSetup::local(2, ExecutorKind::Cpu) };
                    s.spawn(move || run_ranks(&setup, listened).unwrap().pop().unwrap().1.unwrap())
                })
                .collect();
            ranks.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let two: std::net::IpAddr = "127.0.0.2".parse().unwrap();
        assert_eq!(ips, [Some(two), Some(two)]);
        let here = run_ranks(&RankSetup { wire, ..RankSetup::local(2, ExecutorKind::Cpu) }, listened).unwrap();
        let one: std::net::IpAddr = "127.0.0.1".parse().unwrap();
        let here: Vec<_> = here.into_iter().map(|(rank, ip)| (rank, ip.unwrap())).collect();
        assert_eq!(here, [(0, Some(one)), (1, Some(one))]);
    }
}
