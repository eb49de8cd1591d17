//! N ranks of one program: every rank's [`Communicator`] set up and handed to the rank's function, either all
//! ranks on threads of this process (a loopback bootstrap with a fresh secret) or this process's one rank of a
//! multi-process launch (mpirun, srun, torchrun or flags: [`Launch`]). The two-rank examples, the benchmarks and
//! a user's first program start here.

use std::net::TcpListener;
use std::sync::atomic::{AtomicU8, Ordering};
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
/// [`Error::Unavailable`] when the in-process bootstrap cannot start (no loopback listener), the shared NIC
/// cannot be opened, or the OS refuses a rank's thread (then no rank has set up anything: every thread waits
/// until all have started); [`Error::Bootstrap`] without a random source.
pub fn run_ranks<T: Send>(
    setup: &RankSetup,
    rank_main: impl Fn(Arc<Communicator>) -> T + Sync,
) -> Result<Vec<(u32, Result<T>)>> {
    run_ranks_refusing(setup, rank_main, |_| None)
}

/// [`run_ranks`], with `refuse(rank)` standing for the OS refusing the thread of `rank` in this process.
fn run_ranks_refusing<T: Send>(
    setup: &RankSetup,
    rank_main: impl Fn(Arc<Communicator>) -> T + Sync,
    refuse: impl Fn(usize) -> Option<std::io::Error>,
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
    let ranks: Vec<_> = (0..setup.ranks)
        .map(|rank| {
            let l = Launch {
                rank,
                world_size: setup.ranks,
                local_rank: rank,
                root: root.clone(),
                secret,
                source: "this process",
            };
            (l, if rank == 0 { listener.take() } else { None })
        })
        .collect();
    on_threads(ranks, &|(l, lis)| rank_run(l, lis), refuse)
}

/// Runs `run` on each of `inputs` at once, a thread each, and returns what each returned, in order. No thread
/// runs `run` before every thread has started: when the OS refuses one, those already started return at once
/// without running it (ranks that ran would wait at the bootstrap for the missing rank until its timeout), and
/// this returns [`Error::Unavailable`] naming the rank. `refuse(i)` stands for the OS refusing thread `i`
/// (tests; `None` in use). A panic of `run` goes on unwinding here once every thread has ended.
fn on_threads<I: Send, T: Send>(
    inputs: Vec<I>,
    run: &(impl Fn(I) -> T + Sync),
    refuse: impl Fn(usize) -> Option<std::io::Error>,
) -> Result<Vec<T>> {
    // The gate every thread waits at until the spawner has started them all (SHUT), then runs (RUN) or returns
    // without running (ABORT). Threads park rather than wait on a mutex, so that thousands start without
    // contending.
    const SHUT: u8 = 0;
    const RUN: u8 = 1;
    const ABORT: u8 = 2;
    let gate = AtomicU8::new(SHUT);
    let count = inputs.len();
    std::thread::scope(|s| {
        let mut handles = Vec::with_capacity(count);
        let mut refused = None;
        for (i, input) in inputs.into_iter().enumerate() {
            let gate = &gate;
            let spawned = match refuse(i) {
                Some(e) => Err(e),
                None => std::thread::Builder::new().name(format!("gdaki rank {i}")).spawn_scoped(s, move || {
                    let mut state = gate.load(Ordering::Acquire);
                    while state == SHUT {
                        // Woken by the spawner's unpark (or spuriously: the loop looks again).
                        std::thread::park();
                        state = gate.load(Ordering::Acquire);
                    }
                    (state == RUN).then(|| run(input))
                }),
            };
            match spawned {
                Ok(h) => handles.push(h),
                Err(e) => {
                    refused = Some(Error::Unavailable(format!(
                        "run_ranks: cannot start the thread of rank {i} of {count}: {e}"
                    )));
                    break;
                }
            }
        }
        gate.store(if refused.is_none() { RUN } else { ABORT }, Ordering::Release);
        for h in &handles {
            h.thread().unpark();
        }
        // A panic of a rank is a bug: let it go on unwinding here (the scope joins the other threads first).
        let ended: Vec<_> =
            handles.into_iter().map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))).collect();
        match refused {
            Some(e) => Err(e),
            // Every thread passed the gate open, so each ran `run` and returned `Some`.
            None => Ok(ended.into_iter().flatten().collect()),
        }
    })
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

    /// The OS refusing the thread of a rank in this process is [`Error::Unavailable`] of one line naming the
    /// rank, returned at once: the ranks already started set nothing up (they would wait at the bootstrap for
    /// the missing rank until its timeout) and no rank's function runs.
    #[test]
    fn a_rank_thread_the_os_refuses_is_unavailable_at_once() {
        let setup = RankSetup { timeout: Duration::from_secs(30), ..RankSetup::local(4, ExecutorKind::Cpu) };
        let ran = std::sync::atomic::AtomicU32::new(0);
        let start = std::time::Instant::now();
        let refused = |rank| (rank == 2).then(|| std::io::Error::from(std::io::ErrorKind::WouldBlock));
        let r = run_ranks_refusing(&setup, |_| ran.fetch_add(1, Ordering::Relaxed), refused);
        let took = start.elapsed();
        match r {
            Err(Error::Unavailable(m)) => {
                assert!(m.contains("rank 2 of 4") && !m.contains('\n'), "{m:?}");
            }
            other => panic!("expected Unavailable, got {:?}", other.map(|v| v.len())),
        }
        assert_eq!(ran.load(Ordering::Relaxed), 0, "a rank's function ran");
        assert!(took < Duration::from_secs(10), "run_ranks took {took:?} to give up (the bootstrap's timeout is 30 s)");
    }
}
