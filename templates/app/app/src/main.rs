//! Two ranks exchange payloads over a port channel, device code driving the (emulated) NIC: rank 0's kernel
//! puts each payload with a signal, rank 1's waits for it, and the host checks every byte. On CPU threads,
//! then on the GPU when there is one. The last line is `N passed, M failed`. Both ranks run in this process,
//! or, under a launcher of two (`mpirun -np 2`), one in each process.

use std::process::ExitCode;
use std::time::Duration;

use gdaki::bootstrap::{Launch, LaunchFlags};
use gdaki::channel::{run_ranks, Communicator, EndpointConfig, PortChannel, RankSetup};
use gdaki::exec::{Executor, ExecutorKind};
use gdaki::launch::{LaunchConfig, Module};

/// The kernels, built by build.rs.
const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/kernels.ptx"));

/// Payload sizes, bytes, and exchanges of each.
const SIZES: [usize; 3] = [8, 4096, 1 << 20];
const ROUNDS: u32 = 4;

/// The payload of round `r` of size `len`: bytes anyone can recompute.
fn payload(len: usize, r: u32) -> Vec<u8> {
    (0..len).map(|i| (i as u32).wrapping_mul(2_654_435_761).wrapping_add(r * 97 + len as u32) as u8).collect()
}

/// Payloads that arrived intact and payloads that did not (counted by rank 1, which receives them), and how
/// many were to arrive in this process.
#[derive(Default)]
struct Tally {
    passed: u32,
    failed: u32,
    expected: u32,
}

/// One rank: sets up a channel to the other rank, then runs every round.
fn rank_main(comm: &Communicator) -> gdaki::Result<Tally> {
    let (rank, peer) = (comm.rank(), 1 - comm.rank());
    let exec = comm.executor().clone();
    let max = *SIZES.iter().max().unwrap_or(&8);
    let mem = comm.register_buffer(exec.alloc_data(max)?)?;
    comm.send_memory(&mem, peer, 0)?;
    let dst = comm.recv_memory(peer, 0)?;
    let conn = comm.connect(&EndpointConfig::default(), peer, 1)?;
    let sem = comm.semaphore(&conn, peer, 2)?;
    let chan = PortChannel::new(&conn, &sem, dst, &mem)?;
    let handle = exec.upload(&chan.device_handle())?;
    let buf = mem.buffer().ok_or_else(|| gdaki::Error::InvalidArgument("memory without a buffer".into()))?;
    // Loaded before the ranks start: loading a module waits for running kernels.
    let exchange = Module::load(&exec, PTX)?.kernel(&kernels::EXCHANGE)?;
    let mut tally = Tally::default();
    for len in SIZES {
        for r in 0..ROUNDS {
            let data = payload(len, r);
            if rank == 0 {
                buf.write(0, &data)?;
            }
            // Both ranks' kernels run at once: neither waits out its bound for a peer still setting up.
            comm.bootstrap().barrier()?;
            // SAFETY: `handle` holds a live channel's handle in memory the executor reaches; the channel's QP
            // is used by this kernel's thread 0 only; everything outlives the launch, which is waited for.
            unsafe {
                exchange.launch(
                    &LaunchConfig::linear(1, 32),
                    (handle.dev_ptr(), len as u64, rank),
                    Duration::from_secs(30),
                )?
            };
            if rank == 1 {
                let mut got = vec![0; len];
                buf.read(0, &mut got)?;
                if got == data {
                    tally.passed += 1;
                } else {
                    let at = got.iter().zip(&data).position(|(a, b)| a != b).unwrap_or(0);
                    eprintln!("round {r} of {len} bytes: first wrong byte at offset {at}");
                    tally.failed += 1;
                }
            }
            comm.bootstrap().barrier()?;
        }
    }
    Ok(tally)
}

/// Runs both ranks, or this process's one of `launch`, on executor `kind` and adds what they checked to
/// `total`.
fn run_on(kind: ExecutorKind, launch: Option<&Launch>, total: &mut Tally) {
    println!("two ranks on the {kind} executor, emulated NIC");
    let setup = RankSetup { launch: launch.cloned(), ..RankSetup::local(2, kind) };
    let results = match run_ranks(&setup, |comm| rank_main(&comm)) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("{kind}: {e}");
            total.failed += 1;
            return;
        }
    };
    for (rank, r) in results {
        if rank == 1 {
            total.expected += SIZES.len() as u32 * ROUNDS;
        }
        match r.and_then(|x| x) {
            Ok(t) => (total.passed, total.failed) = (total.passed + t.passed, total.failed + t.failed),
            Err(e) => {
                eprintln!("{kind}, rank {rank}: {e}");
                total.failed += 1;
            }
        }
    }
}

fn main() -> ExitCode {
    // gdaki's warnings (what it cannot return: a NAK, a link gone down, a proxy giving up on a QP) on stderr,
    // when RUST_LOG asks for them (RUST_LOG=gdaki=warn).
    if std::env::var_os("RUST_LOG").is_some() {
        let filter = tracing_subscriber::EnvFilter::from_default_env();
        let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
    }
    // Under a launcher (mpirun, srun, torchrun), this process is one rank of its launch; else both run here.
    let launch = match Launch::resolve_from_process_env(LaunchFlags::default()) {
        // A world of one (a Slurm batch script's environment) is no launch of ranks.
        Ok(Some(l)) if l.world_size == 1 => None,
        Ok(Some(l)) if l.world_size != 2 => {
            eprintln!("this program takes 2 ranks, the launch ({}) has {}", l.source, l.world_size);
            return ExitCode::from(2);
        }
        Ok(l) => l,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    // The same kernel on CPU threads, then on the GPU when this machine has one.
    let mut kinds = vec![ExecutorKind::Cpu];
    match Executor::open(Some(ExecutorKind::Gpu)) {
        Ok(_) => kinds.push(ExecutorKind::Gpu),
        Err(e) => println!("{e}: the GPU run is skipped"),
    }
    let mut total = Tally::default();
    for &kind in &kinds {
        run_on(kind, launch.as_ref(), &mut total);
    }
    println!("{} passed, {} failed", total.passed, total.failed);
    if total.failed == 0 && total.passed == total.expected {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
