//! MSCCL++'s one-to-one PortChannel tests on the `cpu` executor: two ranks (two threads, each with its own
//! bootstrap, communicator and emulated NIC, connected over the wire), every operation in every sharing mode,
//! every received payload checked on the device side and counted here. The GPU runs are `--ignored`.

use std::time::Duration;

#[path = "../../host/tests/ranks/mod.rs"]
mod ranks;

use gdaki::channel::Communicator;
use gdaki::exec::{Executor, ExecutorKind};
use gdaki::nic::emu::WireConfig;
use gdaki_device::Error as DevError;
use gdaki_shared::prm::opcode::syndrome;
use gdaki_testkit::porttest::{max_size_for, op, Mode, PortTest, RunConfig};

const TIMEOUT: Duration = Duration::from_secs(10);

/// Runs `f(rank, communicator)` on two ranks at once, each with its own emulated NIC over the loopback wire;
/// returns what each returned.
fn two_ranks<T: Send>(kind: ExecutorKind, f: impl Fn(u32, Communicator) -> T + Sync) -> Vec<T> {
    two_ranks_on(kind, None, f)
}

/// [`two_ranks`] with both ranks on the NIC `shared` when given (one emulated NIC, no wire between them). The
/// library's `tracing` events go to stderr as `RUST_LOG` selects them (`RUST_LOG=gdaki=warn`: waits of a NIC
/// on the GPU that last long).
fn two_ranks_on<T: Send>(
    kind: ExecutorKind,
    shared: Option<gdaki::nic::Nic>,
    f: impl Fn(u32, Communicator) -> T + Sync,
) -> Vec<T> {
    gdaki_testkit::init_tracing();
    ranks::two_ranks(
        |boot| {
            let (exec, _) = Executor::open(Some(kind)).expect("executor");
            match &shared {
                Some(nic) => Communicator::on_nic(boot, exec, nic.clone()),
                None => Communicator::new(boot, exec, WireConfig::loopback()),
            }
            .expect("communicator")
        },
        |rank, comm, _| f(rank, comm),
    )
}

/// Payloads each rank checks in one run of `op` over `nch` channels of `iters` iterations.
fn expected_checks(op: u32, nch: u32, iters: u32, rank: u32) -> u64 {
    match op {
        op::PINGPONG | op::PACKET_PINGPONG | op::PACKET_PINGPONG_LL8 => iters as u64,
        op::BIBW => nch as u64,
        op::SAME_CHANNEL_FLUSH if rank == 1 => 1,
        _ if rank == 1 => nch as u64,
        _ => 0,
    }
}

fn every_op(kind: ExecutorKind, team: u32) {
    let cases: [(u32, u32, usize, u32); 9] = [
        (op::PINGPONG, 1, 4096, 50),
        // LL packets: 4 KiB; one packet in one round (run 2 then finds run 1's packets, which carry the flag of
        // run 1's only round); and (LL8) a size that is not a multiple of 8.
        (op::PACKET_PINGPONG, 1, 4096, 50),
        (op::PACKET_PINGPONG, 1, 8, 1),
        (op::PACKET_PINGPONG_LL8, 1, 1020, 50),
        (op::BW, 1, 64 << 10, 20),
        (op::BW, 4, 4096, 20),
        (op::BIBW, 1, 1024, 20),
        (op::FLUSH_STRESS, 4, 1024, 30),
        (op::SAME_CHANNEL_FLUSH, 1, 1024, 30),
    ];
    for mode in Mode::ALL.into_iter().chain([Mode::Warp]) {
        let team = mode.fit_team(team);
        for (opc, nch, size, iters) in cases {
            let seed = 0x5eed ^ opc as u64;
            let results = two_ranks(kind, |rank, comm| {
                let max = max_size_for(opc, size);
                let mut t = PortTest::new(std::sync::Arc::new(comm), mode, nch, max, iters as usize).expect("set up");
                let cfg = RunConfig { op: opc, size, iters, team, seed, timeout: TIMEOUT };
                let r = t.run(&cfg).unwrap_or_else(|e| panic!("{} op {opc} x{nch} rank {rank}: {e}", mode.name()));
                // A second run on the same channels, with another payload: semaphore counts and packet flags
                // carry over, nothing is reset (a packet left by run 1 that matched a flag of run 2 would
                // fail its check).
                let cfg2 = RunConfig { seed: !seed, ..cfg };
                let r2 = t.run(&cfg2).unwrap_or_else(|e| panic!("{} op {opc} rank {rank}, run 2: {e}", mode.name()));
                (r, r2)
            });
            for (rank, (r, r2)) in results.iter().enumerate() {
                let want = expected_checks(opc, nch, iters, rank as u32);
                assert_eq!((r.checked, r2.checked), (want, want), "{} op {opc} x{nch} rank {rank}", mode.name());
                let timed = if rank == 0 { iters as usize } else { 0 };
                assert_eq!(r.iter_ns.len(), timed);
                assert!(r.iter_ns.iter().all(|&t| t > 0));
            }
        }
    }
}

#[test]
fn cpu_every_op_in_every_mode() {
    every_op(ExecutorKind::Cpu, 4);
}

#[test]
#[ignore = "needs a GPU: run on the H200 with --ignored"]
fn gpu_every_op_in_every_mode() {
    let _gpu = gdaki_testkit::gpu_turn();
    every_op(ExecutorKind::Gpu, 128);
}

/// Device sharing: four teams (CTAs) post to ONE QP at once, each on its own channel (its own buffer and
/// semaphore), one-way and both ways; every payload is checked and every semaphore counts exactly its rounds.
fn four_teams_one_qp(kind: ExecutorKind, team: u32) {
    for opc in [op::BW, op::BIBW] {
        let (iters, size) = (50u32, 8192usize);
        let results = two_ranks(kind, |rank, comm| {
            let mut t = PortTest::with_qps(std::sync::Arc::new(comm), Mode::Device, 4, 1, size, iters as usize)
                .expect("set up");
            let cfg = RunConfig { op: opc, size, iters, team, seed: 0xfeed, timeout: TIMEOUT };
            let r = t.run(&cfg).unwrap_or_else(|e| panic!("op {opc} rank {rank}: {e}"));
            // Inbound signals on this rank: `iters` per channel where the peer sends.
            let inbound: Vec<u64> =
                t.channels().iter().map(|c| c.semaphore().inbound().expect("inbound word")).collect();
            (r.checked, inbound)
        });
        for (rank, (checked, inbound)) in results.iter().enumerate() {
            let receives = opc == op::BIBW || rank == 1;
            assert_eq!(*checked, if receives { 4 } else { 0 }, "op {opc} rank {rank}");
            let want = if receives { iters as u64 } else { 0 };
            assert_eq!(inbound, &vec![want; 4], "op {opc} rank {rank}: one signal per round per channel");
        }
    }
}

#[test]
fn cpu_four_teams_share_one_qp() {
    four_teams_one_qp(ExecutorKind::Cpu, 4);
}

#[test]
#[ignore = "needs a GPU: run on the H200 with --ignored"]
fn gpu_four_ctas_share_one_qp() {
    let _gpu = gdaki_testkit::gpu_turn();
    four_teams_one_qp(ExecutorKind::Gpu, 128);
}

/// More than 65,536 WQEs through one QP (the 16-bit WQE index wraps) from a whole team in Device sharing:
/// one 8-byte piece per thread per round (`BW_PIECES`), then a signal.
fn sq_wraps(kind: ExecutorKind, team: u32, iters: u32) {
    let size = 8 * team as usize;
    let results = two_ranks(kind, |rank, comm| {
        let mut t =
            PortTest::with_qps(std::sync::Arc::new(comm), Mode::Device, 1, 1, size, iters as usize).expect("set up");
        let cfg = RunConfig { op: op::BW_PIECES, size, iters, team, seed: 0x3a9, timeout: TIMEOUT };
        let r = t.run(&cfg).unwrap_or_else(|e| panic!("rank {rank}: {e}"));
        let st = t.channels()[0].connection().qp_handle().expect("QP handle").sq;
        (r.checked, st.ready, t.channels()[0].semaphore().inbound().expect("inbound word"))
    });
    let (sent, receiver) = (&results[0], &results[1]);
    // One WQE per thread per round, one signal per round, one closing flush: all through the shared QP.
    assert!(sent.1 >= (iters as u64) * (team as u64 + 1), "{} WQEBBs", sent.1);
    assert!(sent.1 > 65_536, "the 16-bit index wrapped: {} WQEBBs", sent.1);
    assert_eq!((receiver.0, receiver.2), (1, iters as u64), "payload checked, every signal counted");
}

#[test]
fn cpu_sq_wraps_past_65536_wqes() {
    sq_wraps(ExecutorKind::Cpu, 4, 13_200);
}

#[test]
#[ignore = "needs a GPU: run on the H200 with --ignored"]
fn gpu_sq_wraps_past_65536_wqes() {
    let _gpu = gdaki_testkit::gpu_turn();
    sq_wraps(ExecutorKind::Gpu, 128, 520);
}

/// A put whose rkey is wrong: `flush` on the sender returns the error CQE's syndrome (0x13, remote access),
/// in every Device-mode sharing (the proxy keeps its own copy of the keys: channel_host.rs covers the Host
/// modes); the receiver, whose signal never comes, fails too instead of hanging.
fn bad_key_flush(kind: ExecutorKind, team: u32) {
    let timeout = Duration::from_secs(2);
    for mode in Mode::DEVICE {
        let results = two_ranks(kind, |rank, comm| {
            let mut t = PortTest::new(std::sync::Arc::new(comm), mode, 1, 1024, 4).expect("set up");
            if rank == 0 {
                t.edit_handles(|_, h| h.dst.rkey = gdaki_shared::Be32::new(h.dst.rkey.get() ^ 0x100)).unwrap();
            }
            let cfg = RunConfig {
                op: op::FLUSH_STRESS,
                size: 1024,
                iters: 4,
                team: mode.fit_team(team),
                seed: 0xbad,
                timeout,
            };
            (t.run(&cfg).map(|r| r.checked), t.device_error())
        });
        let (sender, receiver) = (&results[0], &results[1]);
        assert!(sender.0.is_err() && receiver.0.is_err(), "{}: {results:?}", mode.name());
        assert!(
            matches!(sender.1, Some(DevError::Cqe(c)) if c.syndrome == syndrome::REMOTE_ACCESS_ERR),
            "{}: the sender's flush reported {:?}",
            mode.name(),
            sender.1
        );
        assert!(receiver.1.is_some(), "{}: the receiver reported nothing", mode.name());
    }
}

#[test]
fn cpu_flush_reports_a_bad_key_in_every_mode() {
    bad_key_flush(ExecutorKind::Cpu, 4);
}

#[test]
#[ignore = "needs a GPU: run on the H200 with --ignored"]
fn gpu_flush_reports_a_bad_key_in_every_mode() {
    let _gpu = gdaki_testkit::gpu_turn();
    bad_key_flush(ExecutorKind::Gpu, 128);
}

/// How rank 0 leaves in [`a_peer_that_leaves_ends_the_wait_for_it`].
#[derive(Clone, Copy, Debug)]
enum Leaving {
    /// `Communicator::leave`, its channels and memory kept until rank 1's run has ended.
    Leave,
    /// Dropping everything, the communicator last.
    Drop,
}

/// Rank 0 leaves the session once the run's barrier is passed, without launching: rank 1's ping-pong, whose
/// first step waits for rank 0's message with nothing of its own outstanding (no error CQE can tell it), ends
/// with `PeerGone` naming rank 0 soon after the goodbye (the departed word, written `DEPARTURE_GRACE` later), not
/// after the run's 8 s bound, in every Device-mode sharing. On the GPU only by `Leaving::Leave`: a rank that drops
/// its objects first frees GPU memory, which waits for rank 1's running kernel (one process, one GPU), so its
/// goodbye would come only once that kernel's wait had timed out (the guide says so).
fn a_peer_that_leaves_ends_the_wait_for_it(kind: ExecutorKind, team: u32, leaving: Leaving) {
    let timeout = Duration::from_secs(8);
    for mode in Mode::DEVICE {
        // Rank 1's run ends before rank 0's objects go, whatever happens to either (a failure is returned, not
        // panicked, until both have passed it, so that neither waits here for ever).
        let ended = &std::sync::Barrier::new(2);
        let results = two_ranks(kind, |rank, comm| {
            let comm = std::sync::Arc::new(comm);
            let mut t = PortTest::new(comm.clone(), mode, 1, 1024, 4).expect("set up");
            if rank == 0 {
                // As `PortTest::run` does before its barrier: the module's first load (the PTX compiled for the
                // GPU, tens of seconds) does not count against the barrier's bound.
                let barrier = gdaki::launch::Module::load(comm.executor(), gdaki_testkit::ptx::PTX)
                    .and_then(|_| comm.bootstrap().barrier());
                match leaving {
                    Leaving::Leave => {
                        comm.leave();
                        ended.wait();
                    }
                    Leaving::Drop => {
                        drop((t, comm));
                        ended.wait();
                    }
                }
                barrier.expect("rank 0's module and the run's barrier");
                return None;
            }
            let cfg =
                RunConfig { op: op::PINGPONG, size: 1024, iters: 1, team: mode.fit_team(team), seed: 0x1e, timeout };
            // The module's first load (the PTX compiled for the GPU, tens of seconds on a fresh machine) before the
            // clock starts: the run's own load is then quick.
            let loaded = gdaki::launch::Module::load(comm.executor(), gdaki_testkit::ptx::PTX).map(drop);
            let start = std::time::Instant::now();
            let r = t.run(&cfg);
            let out = (r.is_err(), t.device_error(), start.elapsed());
            ended.wait();
            loaded.expect("rank 1's module");
            Some(out)
        });
        let (failed, error, took) = results[1].expect("rank 1's run");
        // For the record (`--nocapture`): how soon the departure ended the wait.
        eprintln!("{} {leaving:?}: rank 1's run ended after {took:?}", mode.name());
        let gone = DevError::PeerGone(gdaki_device::error::PeerGone { rank: 0, broken: false });
        assert_eq!((failed, error), (true, Some(gone)), "{} {leaving:?}", mode.name());
        assert!(took < Duration::from_secs(4), "{} {leaving:?}: rank 1's run took {took:?}", mode.name());
    }
}

#[test]
fn cpu_a_peer_that_leaves_ends_the_wait_for_it() {
    a_peer_that_leaves_ends_the_wait_for_it(ExecutorKind::Cpu, 4, Leaving::Drop);
    a_peer_that_leaves_ends_the_wait_for_it(ExecutorKind::Cpu, 4, Leaving::Leave);
}

#[test]
#[ignore = "needs a GPU: run on the H200 with --ignored"]
fn gpu_a_peer_that_leaves_ends_the_wait_for_it() {
    let _gpu = gdaki_testkit::gpu_turn();
    a_peer_that_leaves_ends_the_wait_for_it(ExecutorKind::Gpu, 128, Leaving::Leave);
}

/// Packet ping-pongs of a size that is not whole packets, or whose packets do not fit the buffer, are refused
/// before anything runs, and the channels stay usable.
#[test]
fn cpu_packet_sizes_are_checked_before_running() {
    let results = two_ranks(ExecutorKind::Cpu, |rank, comm| {
        let mut t = PortTest::new(std::sync::Arc::new(comm), Mode::Exclusive, 1, 64, 10).expect("set up");
        let cfg = |op, size| RunConfig { op, size, iters: 10, team: 2, seed: 0x11, timeout: TIMEOUT };
        for (op, size) in [(op::PACKET_PINGPONG, 12), (op::PACKET_PINGPONG_LL8, 6), (op::PACKET_PINGPONG, 64)] {
            let e = t.run(&cfg(op, size)).expect_err("a bad packet size ran");
            assert!(matches!(e, gdaki::Error::InvalidArgument(_)), "rank {rank}, op {op}, {size} B: {e}");
        }
        assert_eq!(max_size_for(op::PACKET_PINGPONG, 64), 160);
        t.run(&cfg(op::PACKET_PINGPONG_LL8, 12)).unwrap_or_else(|e| panic!("rank {rank}: {e}")).checked
    });
    assert_eq!(results, vec![10, 10]);
}

/// A run beyond its setup, or with no thread, is refused before anything runs with a message naming the
/// limit it broke, and the channels stay usable.
#[test]
fn cpu_bad_runs_name_the_limit_they_break() {
    let results = two_ranks(ExecutorKind::Cpu, |rank, comm| {
        let mut t = PortTest::new(std::sync::Arc::new(comm), Mode::Exclusive, 1, 64, 10).expect("set up");
        let base = RunConfig { op: op::PINGPONG, size: 64, iters: 10, team: 2, seed: 0x12, timeout: TIMEOUT };
        for (cfg, want) in [
            (RunConfig { size: 0, ..base }, "a size of 0 bytes: 1..=64 "),
            (RunConfig { size: 65, ..base }, "a size of 65 bytes: 1..=64 "),
            (RunConfig { iters: 11, ..base }, "11 iterations: at most 10 "),
            (RunConfig { team: 0, ..base }, "a team of 0 threads: at least 1"),
        ] {
            let e = t.run(&cfg).expect_err("a bad run ran").to_string();
            assert!(e.contains(want), "rank {rank}: {e}");
        }
        t.run(&base).unwrap_or_else(|e| panic!("rank {rank}: {e}")).checked
    });
    assert_eq!(results, vec![10, 10]);
}

/// A `max_size` whose channel buffer (two halves, each rounded up to 8 bytes) overflows is refused alike on both
/// ranks, before anything is exchanged. Before, the sizes wrapped: one rank asked for a zero-length MR and the
/// other failed on a QP its peer never made.
#[test]
fn cpu_a_max_size_that_overflows_is_refused() {
    let results = two_ranks(ExecutorKind::Cpu, |_, comm| {
        let comm = std::sync::Arc::new(comm);
        [usize::MAX - 3, usize::MAX / 2 + 1]
            .map(|max| PortTest::new(comm.clone(), Mode::Exclusive, 1, max, 1).err().map(|e| e.to_string()))
    });
    for (rank, r) in results.iter().enumerate() {
        for e in r {
            assert!(e.as_ref().is_some_and(|e| e.contains("does not fit the address space")), "rank {rank}: {e:?}");
        }
    }
}

/// Both ranks on ONE emulated NIC (`Communicator::on_nic`): their QPs reach each other on the NIC's direct path,
/// each rank with its own PD; ping-pong, packets and bandwidth pass in every mode.
#[test]
fn cpu_two_ranks_share_one_nic() {
    let (exec, _) = Executor::open(Some(ExecutorKind::Cpu)).unwrap();
    let nic = gdaki::nic::Nic::open(&gdaki::nic::NicSpec::Emu, &exec, None).unwrap();
    for mode in Mode::ALL.into_iter().chain([Mode::Warp]) {
        for (opc, size, iters) in [(op::PINGPONG, 4096, 20), (op::PACKET_PINGPONG, 1024, 20), (op::BW, 65536, 10)] {
            let results = two_ranks_on(ExecutorKind::Cpu, Some(nic.clone()), |rank, comm| {
                let max = gdaki_testkit::porttest::max_size_for(opc, size);
                let mut t = PortTest::new(std::sync::Arc::new(comm), mode, 1, max, iters as usize).expect("set up");
                let cfg = RunConfig { op: opc, size, iters, team: 4, seed: 0x0e1c, timeout: TIMEOUT };
                t.run(&cfg).unwrap_or_else(|e| panic!("{} op {opc} rank {rank}: {e}", mode.name())).checked
            });
            assert_eq!(results, vec![expected_checks(opc, 1, iters, 0), expected_checks(opc, 1, iters, 1)]);
        }
    }
    let s = nic.as_emu().expect("emulated").stats();
    assert_eq!((s.error_cqes, s.dbrec_mismatches), (0, 0), "{s:?}");
}

/// A run's timeout bounds the device-side waits, not only the launch: rank 0's signal carries a wrong rkey,
/// so rank 1's wait for it can only time out, and it does so after the run's 300 ms (the channels were made
/// with the 5 s default), with what it waited for; the whole run ends before the default could have run out
/// (0.5 s alone on a 2-core machine, 3.6 s once beside the other tests of this file there).
#[test]
fn a_runs_timeout_bounds_the_device_waits() {
    let timeout = Duration::from_millis(300);
    let results = two_ranks(ExecutorKind::Cpu, |rank, comm| {
        let mut t = PortTest::new(std::sync::Arc::new(comm), Mode::Exclusive, 1, 1024, 4).expect("set up");
        if rank == 0 {
            t.edit_handles(|_, h| h.remote_sem.rkey = gdaki_shared::Be32::new(h.remote_sem.rkey.get() ^ 0x100))
                .unwrap();
        }
        let cfg = RunConfig { op: op::PINGPONG, size: 1024, iters: 1, team: 1, seed: 0x7e, timeout };
        let start = std::time::Instant::now();
        let r = t.run(&cfg).map(|r| r.checked);
        (r.is_err(), t.device_error(), start.elapsed())
    });
    let (sender, receiver) = (&results[0], &results[1]);
    assert!(
        sender.0 && matches!(sender.1, Some(DevError::Cqe(c)) if c.syndrome == syndrome::REMOTE_ACCESS_ERR),
        "rank 0: {sender:?}"
    );
    match receiver.1 {
        Some(DevError::Timeout(t)) => {
            // The host-built channel records its peer: the timeout names rank 0, the one that never signalled.
            assert_eq!(t.on, gdaki_device::error::WaitOn::Peer { rank: 0, expected: 1, seen: 0 }, "{t:?}");
            assert!((timeout.as_nanos() as u64..2_000_000_000).contains(&t.waited_ns), "waited {} ns", t.waited_ns);
        }
        other => panic!("rank 1: expected a semaphore timeout, got {other:?}"),
    }
    assert!(receiver.2 < Duration::from_secs(5), "rank 1's run took {:?}", receiver.2);
}
