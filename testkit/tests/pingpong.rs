//! Ping-pong end to end: device code drives two RC QPs of the emulated NIC, every payload checked on the
//! device. The `cpu` test runs everywhere; the `gpu` tests are ignored here and run on the GPU machine with
//! `--ignored` (build with `cargo test --no-run`, carry the test binary).

use std::time::Duration;

use gdaki::cuda::Gpu;
use gdaki::exec::{Executor, ExecutorKind};
use gdaki::launch::{LaunchConfig, Module};
use gdaki_device::launch::DevPtr;
use gdaki_device::wqe::MAX_DS;
use gdaki_shared::prm::wqe::Seg;
use gdaki_testkit::pingpong::{PingPong, RunConfig};
use gdaki_testkit_kernels::samples::{self, SampleParams, SAMPLES};
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};

/// A generator seeded from the clock; the seed is printed so that a failure can be replayed.
fn rng() -> SmallRng {
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64);
    println!("seed {seed:#x}");
    SmallRng::seed_from_u64(seed)
}

/// Sizes that cover a partial last word, one word, and multi-page payloads.
const SIZES: [usize; 5] = [1, 8, 13, 4096, 1 << 20];

fn run_sizes(kind: ExecutorKind, blueflame: bool) {
    let t0 = std::time::Instant::now();
    let (exec, _) = Executor::open(Some(kind)).expect("executor");
    let (iters, warmup) = (40, 5);
    let mut pp = PingPong::new(exec, 1 << 20, (iters + warmup) as usize).expect("set up");
    let mut rng = rng();
    let sizes: &[usize] = if blueflame { &[gdaki_testkit::pingpong::BLUEFLAME_SIZE] } else { &SIZES };
    for &size in sizes {
        let cfg = RunConfig { size, iters, warmup, seed: rng.random(), timeout: Duration::from_secs(5), blueflame };
        let r = pp.run(&cfg).unwrap_or_else(|e| panic!("{size} bytes: {e}"));
        // Each round trip checks one payload on each rank.
        assert_eq!(r.checked, 2 * (iters + warmup) as u64, "{size} bytes");
        assert_eq!(r.round_trip_ns.len(), iters as usize);
        assert!(r.round_trip_ns.iter().all(|&t| t > 0));
        // Both ranks ran here: each round trip's split adds up to it (one clock). Both legs cross the NIC, so
        // they take time, but on CPU threads a rank descheduled between ringing and reading its clock reads
        // after the peer saw the semaphore (that leg is then 0): most round trips, not all.
        assert_eq!(r.split.len(), iters as usize);
        for (s, &rt) in r.split.iter().zip(&r.round_trip_ns) {
            assert_eq!(s.post0 + s.leg01 + s.turn1 + s.leg10, rt, "{size} bytes: {s:?}");
        }
        let crossed = r.split.iter().filter(|s| s.leg01 > 0 && s.leg10 > 0).count();
        assert!(2 * crossed > iters as usize, "{size} bytes: {crossed} of {iters} round trips with both legs");
    }
    let s = pp.nic().as_emu().expect("emulated NIC").stats();
    let trips = ((iters + warmup) as usize * sizes.len()) as u64;
    assert_eq!(s.error_cqes, 0, "{s:?}");
    assert_eq!(s.dbrec_mismatches, 0, "{s:?}");
    // The NIC's thread worked (every WQE went through it) and not longer than the runs took; it waited for a
    // mirror only if the ring had one.
    assert!(s.busy_ns > 0 && s.busy_ns <= t0.elapsed().as_nanos() as u64, "{s:?}");
    if s.ring_mirrored == 0 {
        assert_eq!(s.ring_mirror_wait_ns, 0, "{s:?}");
    }
    if blueflame {
        // Each round trip is two signaled WRITEs, each its own BlueFlame write, which the NIC takes from
        // the register (the sender waits for the peer's answer, which needs this WRITE, before it writes
        // again: no BlueFlame write overtakes another), and two flushes that need no NOP.
        assert_eq!((s.wqes, s.doorbells, s.blueflame), (2 * trips, 2 * trips, 2 * trips), "{s:?}");
        assert_eq!((s.blueflame_fallbacks, s.blueflame_mismatches), (0, 0), "{s:?}");
    } else {
        // Each round trip is two put_with_signal (write + fetch-add) and two flushes that need no NOP.
        assert_eq!(s.wqes, 4 * trips, "{s:?}");
    }
}

#[test]
fn cpu_pingpong_checks_every_payload() {
    run_sizes(ExecutorKind::Cpu, false);
}

#[test]
fn cpu_pingpong_by_blueflame_checks_every_payload() {
    run_sizes(ExecutorKind::Cpu, true);
}

/// An exchange between two threads standing in for two processes: each call sends this rank's bytes and
/// returns the peer's.
fn thread_exchange() -> (gdaki_testkit::pingpong::Exchange, gdaki_testkit::pingpong::Exchange) {
    let (tx0, rx1) = std::sync::mpsc::channel::<Vec<u8>>();
    let (tx1, rx0) = std::sync::mpsc::channel::<Vec<u8>>();
    let end = |tx: std::sync::mpsc::Sender<Vec<u8>>,
               rx: std::sync::mpsc::Receiver<Vec<u8>>|
     -> gdaki_testkit::pingpong::Exchange {
        Box::new(move |mine: &[u8]| {
            tx.send(mine.to_vec()).map_err(|_| gdaki::Error::Bootstrap("peer gone".into()))?;
            rx.recv_timeout(Duration::from_secs(10)).map_err(|e| gdaki::Error::Bootstrap(format!("peer: {e}")))
        })
    };
    (end(tx0, rx0), end(tx1, rx1))
}

#[test]
fn one_rank_per_nic_over_the_wire_checks_every_payload() {
    let (iters, warmup) = (30u32, 3u32);
    let mut rng = rng();
    let seeds: Vec<u64> = SIZES.iter().map(|_| rng.random()).collect();
    let (x0, x1) = thread_exchange();
    let results: Vec<Vec<(Vec<u64>, u64)>> = std::thread::scope(|s| {
        let hs: Vec<_> = [(0u32, x0), (1, x1)]
            .into_iter()
            .map(|(rank, x)| {
                let seeds = &seeds;
                s.spawn(move || {
                    let wire = gdaki::nic::emu::WireConfig::loopback();
                    let mut pp = PingPong::new_rank(Executor::Cpu, rank, 1 << 20, (iters + warmup) as usize, wire, x)
                        .expect("set up");
                    assert_eq!(pp.local_ranks(), vec![rank]);
                    SIZES
                        .iter()
                        .zip(seeds)
                        .map(|(&size, &seed)| {
                            let cfg = RunConfig {
                                size,
                                iters,
                                warmup,
                                seed,
                                timeout: Duration::from_secs(5),
                                blueflame: false,
                            };
                            let r = pp.run(&cfg).unwrap_or_else(|e| panic!("rank {rank}, {size} bytes: {e}"));
                            (r.round_trip_ns, r.checked)
                        })
                        .collect()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("rank thread")).collect()
    });
    for (i, &size) in SIZES.iter().enumerate() {
        let ((t0, c0), (t1, c1)) = (&results[0][i], &results[1][i]);
        // Each rank checks one payload per round trip; only rank 0 measures.
        assert_eq!((*c0, *c1), ((iters + warmup) as u64, (iters + warmup) as u64), "{size} bytes");
        assert_eq!((t0.len(), t1.len()), (iters as usize, 0));
        assert!(t0.iter().all(|&t| t > 0));
    }
}

#[test]
fn ranks_with_different_flags_refuse_to_run() {
    let (x0, x1) = thread_exchange();
    let errs: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = [(0u32, x0, 64usize), (1, x1, 128)]
            .into_iter()
            .map(|(rank, x, size)| {
                s.spawn(move || {
                    let wire = gdaki::nic::emu::WireConfig::loopback();
                    let mut pp = PingPong::new_rank(Executor::Cpu, rank, 128, 10, wire, x).expect("set up");
                    let cfg = RunConfig {
                        size,
                        iters: 5,
                        warmup: 0,
                        seed: 1,
                        timeout: Duration::from_secs(2),
                        blueflame: false,
                    };
                    pp.run(&cfg).err().map(|e| e.to_string()).unwrap_or_default()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for e in errs {
        assert!(e.contains("give both the same flags"), "{e}");
    }
}

/// A rank whose setup fails tells its peer why, in step: before the info exchange (0 iterations: its buffers
/// cannot be sized) and after it (a larger message than the peer's buffer takes). The failed rank returns its
/// own error; its peer returns an error naming the peer's reason (it read the failed rank's bytes as peer info,
/// or as a run's configuration with the failed rank's raw bytes in the message, before).
#[test]
fn a_rank_whose_setup_fails_tells_its_peer_why() {
    for (sizes, iters, own, told) in [
        ([128, 128], [10, 0], "size and iterations must be at least 1", "the peer's setup failed: "),
        ([128, 4096], [10, 10], "this rank sends up to 4096", "the peer's setup failed: "),
    ] {
        let (x0, x1) = thread_exchange();
        let errs: Vec<String> = std::thread::scope(|s| {
            let hs: Vec<_> = [(0u32, x0), (1, x1)]
                .into_iter()
                .map(|(rank, x)| {
                    s.spawn(move || {
                        let wire = gdaki::nic::emu::WireConfig::loopback();
                        let (size, iters) = (sizes[rank as usize], iters[rank as usize]);
                        match PingPong::new_rank(Executor::Cpu, rank, size, iters, wire, x) {
                            Ok(_) => "set up".to_string(),
                            Err(e) => e.to_string(),
                        }
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(errs[1].contains(own), "rank 1: {}", errs[1]);
        assert!(errs[0].contains(told) && errs[0].contains(own), "rank 0: {}", errs[0]);
    }
}

#[test]
fn bad_run_arguments_are_errors() {
    let (exec, _) = Executor::open(Some(ExecutorKind::Cpu)).unwrap();
    let mut pp = PingPong::new(exec, 64, 10).unwrap();
    let cfg = RunConfig { size: 65, iters: 5, warmup: 0, seed: 1, timeout: Duration::from_secs(1), blueflame: false };
    assert!(matches!(pp.run(&cfg), Err(gdaki::Error::InvalidArgument(_))));
    let cfg = RunConfig { size: 64, iters: 11, ..cfg };
    assert!(matches!(pp.run(&cfg), Err(gdaki::Error::InvalidArgument(_))));
    // By BlueFlame, the payload is the one word the peer polls.
    for size in [7, 9] {
        let cfg = RunConfig { size, iters: 5, blueflame: true, ..cfg };
        assert!(matches!(pp.run(&cfg), Err(gdaki::Error::InvalidArgument(_))), "{size}");
    }
    assert!(matches!(PingPong::new(Executor::Cpu, 0, 1), Err(gdaki::Error::InvalidArgument(_))));
}

#[test]
#[ignore = "needs a GPU: run on the H200 with --ignored"]
fn gpu_pingpong_checks_every_payload() {
    let _gpu = gdaki_testkit::gpu_turn();
    run_sizes(ExecutorKind::Gpu, false);
}

#[test]
#[ignore = "needs a GPU: run on the H200 with --ignored"]
fn gpu_pingpong_by_blueflame_checks_every_payload() {
    let _gpu = gdaki_testkit::gpu_turn();
    run_sizes(ExecutorKind::Gpu, true);
}

#[test]
#[ignore = "needs a GPU: run on the H200 with --ignored"]
fn ptx_wqe_bytes_equal_host_built_ones() {
    let gpu = Gpu::open(0).expect("GPU");
    let exec = Executor::Gpu(gpu.clone());
    let module = Module::load(&exec, gdaki_testkit::ptx::PTX).expect("module");
    let kernel = module.kernel(&gdaki_testkit_kernels::entries::GDAKI_WQE_SAMPLES).expect("kernel");
    let mut rng = rng();
    for _ in 0..32 {
        let p = SampleParams {
            // 8-byte aligned, so that the atomics' result buffer is valid too.
            laddr: rng.random::<u64>() & !7,
            raddr: rng.random(),
            swap_add: rng.random(),
            compare: rng.random(),
            inline: rng.random(),
            idx: rng.random(),
            qpn: rng.random::<u32>() & 0xff_ffff,
            lkey: rng.random(),
            rkey: rng.random(),
            len: (rng.random::<u32>() >> 1).max(1),
            imm: rng.random(),
        };
        let pbuf = gpu.alloc_device(std::mem::size_of::<SampleParams>()).unwrap();
        pbuf.copy_from_host(0, bytemuck::bytes_of(&p)).unwrap();
        let out = gpu.alloc_device(std::mem::size_of::<[[Seg; MAX_DS]; SAMPLES]>()).unwrap();
        // SAFETY: both buffers are live GPU allocations of the sizes the kernel uses.
        unsafe {
            kernel.launch(
                &LaunchConfig::linear(1, 1),
                (DevPtr::new(pbuf.device_addr()), DevPtr::new(out.device_addr())),
                Duration::from_secs(10),
            )
        }
        .unwrap();
        let mut host = [[Seg::default(); MAX_DS]; SAMPLES];
        samples::build(&p, &mut host);
        let gpu_bytes = out.to_vec().unwrap();
        for (i, (g, h)) in gpu_bytes.chunks(MAX_DS * 16).zip(host.iter()).enumerate() {
            assert_eq!(g, bytemuck::cast_slice::<Seg, u8>(h), "sample {i} differs, params {p:?}");
        }
    }
}
