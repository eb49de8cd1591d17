//! Collectives on the `cpu` executor: N ranks as threads of this process, each with its own emulated NIC
//! (over the loopback wire) or all on one NIC, device code making every call. Every received byte is
//! checked against payloads made here from a seed, and so is every byte outside the range (untouched); the
//! roots' group-acknowledgment counters are checked against the counts of calls made. Reduce results are
//! checked against an `f64` sum made here, within an error bound derived here from the rank count and the
//! bound of the values alone; ring all-reduce results against an `f64` sum within the bound of `n - 1` `f32`
//! additions, against the documented order of additions replayed here in `f32`, and bitwise across ranks.
//! The GPU runs are `--ignored`.

use std::sync::Arc;
use std::time::Duration;

use gdaki::channel::{run_ranks, Communicator, RankSetup};
use gdaki::coll::CollConfig;
use gdaki::exec::ExecutorKind;
use gdaki_device::coll::{
    default_chunk, dequantize, quantize, ring_scratch_bytes, scale, Algorithm, Broadcast, Reduce, RingAllReduce,
};
use gdaki_device::error::{InvalidArgument, Timeout, WaitOn};
use gdaki_device::Error as DevError;
use gdaki_testkit::coll::CollRank;
use proptest::prelude::*;
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};

const BUF: usize = 128 << 10;

/// `len` random bytes from `seed`.
fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut v: Vec<u8> = (0..len.div_ceil(8)).flat_map(|_| rng.random::<u64>().to_le_bytes()).collect();
    v.truncate(len);
    v
}

/// Runs `f` on `n` ranks (threads) of `kind`, each with its collectives set up with `cfg`; by rank. The
/// library's `tracing` events go to stderr as `RUST_LOG` selects them.
fn on_ranks<T: Send>(
    n: u32,
    kind: ExecutorKind,
    one_nic: bool,
    cfg: CollConfig,
    f: impl Fn(CollRank) -> T + Sync,
) -> Vec<T> {
    gdaki_testkit::init_tracing();
    let setup = RankSetup { one_nic, ..RankSetup::local(n, kind) };
    let out = run_ranks(&setup, |comm: Arc<Communicator>| {
        let rank = comm.rank();
        f(CollRank::new(comm, &cfg).unwrap_or_else(|e| panic!("rank {rank}: set up: {e}")))
    })
    .expect("ranks");
    out.into_iter().map(|(rank, r)| r.unwrap_or_else(|e| panic!("rank {rank}: {e}"))).collect()
}

/// The index of the first byte where `a` and `b` differ.
fn first_diff(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter().zip(b).position(|(x, y)| x != y).or((a.len() != b.len()).then_some(a.len().min(b.len())))
}

/// The calls of one broadcast run: (bytes, root, chunk, offset), the same communicator throughout.
fn calls(n: u32) -> Vec<(u64, u32, u64, u64)> {
    vec![
        (4097, 0, 1000, 24),
        (0, n - 1, 0, 0),
        (1, n - 1, 0, 7),
        (3000, 1 % n, 1000, 0),
        (100_003, n / 2, 0, 5),
        // The same root again: its counter keeps counting from the earlier calls.
        (65_536, 1 % n, 4096, 100),
        (12_345, n - 1, 777, 3),
    ]
}

/// Broadcasts `calls(n)` with `alg` on `n` ranks; checks every byte of every rank's buffer after each call
/// and each root's acknowledgment counter at the end.
fn broadcast_run(kind: ExecutorKind, n: u32, alg: Algorithm, one_nic: bool) {
    let list = calls(n);
    let acks = on_ranks(n, kind, one_nic, CollConfig::new(BUF), |r| {
        let rank = r.communicator().rank();
        for (i, &(bytes, root, chunk, offset)) in list.iter().enumerate() {
            let seed = (i as u64) << 32;
            // Every rank's buffer starts as its own noise; the root's range holds the payload.
            let mut before = self::bytes(seed | 0x100 | rank as u64, BUF);
            let payload = self::bytes(seed | 0x200, bytes as usize);
            let (a, e) = (offset as usize, (offset + bytes) as usize);
            if rank == root {
                before[a..e].copy_from_slice(&payload);
            }
            r.collectives().buffer().write(0, &before).expect("fill");
            let b = Broadcast { root, offset, bytes, chunk, algorithm: alg };
            r.broadcast(&b).unwrap_or_else(|e| {
                let stats = r.communicator().nic().as_emu().map(|nic| nic.stats());
                panic!("{alg:?} n={n} call {i} rank {rank}: {e}; NIC: {stats:?}")
            });
            let after = r.collectives().buffer().to_vec().expect("read");
            let mut want = before;
            want[a..e].copy_from_slice(&payload);
            if let Some(at) = first_diff(&after, &want) {
                panic!("{alg:?} n={n} call {i} ({bytes} B from {root} at {offset}) rank {rank}: byte {at} differs");
            }
        }
        r.collectives().acks()
    });
    for (rank, got) in acks.into_iter().enumerate() {
        let rooted = list.iter().filter(|&&(bytes, root, ..)| bytes > 0 && root == rank as u32).count() as u64;
        assert_eq!(got, rooted * (n as u64 - 1), "{alg:?} n={n}: acknowledgments at rank {rank}");
    }
}

fn broadcast_every_algorithm(kind: ExecutorKind) {
    for alg in Algorithm::ALL {
        for n in [2, 3, 4, 8] {
            // Eight ranks share one NIC (no wire): the same device code, fewer threads on a small machine.
            broadcast_run(kind, n, alg, n == 8);
        }
    }
}

#[test]
fn cpu_broadcast_every_algorithm_and_size() {
    broadcast_every_algorithm(ExecutorKind::Cpu);
}

#[test]
#[ignore = "needs a GPU: run on the H200 with --ignored"]
fn gpu_broadcast_every_algorithm_and_size() {
    let _gpu = gdaki_testkit::gpu_turn();
    broadcast_every_algorithm(ExecutorKind::Gpu);
}

/// The rank a receiver waits for in a broadcast from `root` of `n` ranks with `alg`, from the algorithms'
/// definitions (ranks counted from the root).
fn parent(alg: Algorithm, rank: u32, root: u32, n: u32) -> u32 {
    let v = (rank + n - root) % n;
    let pv = match alg {
        Algorithm::Direct => 0,
        Algorithm::Chain => v - 1,
        Algorithm::Tree => (v - 1) / 2,
    };
    (pv + root) % n
}

/// Whether `ancestor` is above `rank` in the tree of a broadcast from `root` of `n` ranks with `alg`.
fn has_ancestor(alg: Algorithm, rank: u32, root: u32, n: u32, ancestor: u32) -> bool {
    let mut r = rank;
    while r != root {
        r = parent(alg, r, root, n);
        if r == ancestor {
            return true;
        }
    }
    false
}

/// One rank sits a broadcast out (it set up, then never launches): every other rank's call ends within the
/// short bound, not a hang. Each receiver below the missing rank times out naming its parent (the missing
/// rank for its children, else a parent stuck itself); every other receiver gets its bytes; unless the root
/// is the missing rank, its group acknowledgment ends short by the receivers that never had their bytes.
fn broadcast_with_a_rank_missing(kind: ExecutorKind) {
    let n = 4;
    let cfg = CollConfig { timeout: Duration::from_millis(300), ..CollConfig::new(4096) };
    for (alg, root, missing) in [
        (Algorithm::Direct, 2, 2),
        (Algorithm::Chain, 2, 2),
        (Algorithm::Tree, 2, 2),
        (Algorithm::Direct, 0, 3),
        // Chain 0 -> 1 -> 2 -> 3: rank 3 waits for rank 2, itself waiting for the missing rank.
        (Algorithm::Chain, 0, 1),
        // Rank 0's children are 1 and 2, rank 1's is 3: rank 2 gets its bytes, rank 3 names rank 1.
        (Algorithm::Tree, 0, 1),
    ] {
        let below = |rank| rank != root && rank != missing && has_ancestor(alg, rank, root, n, missing);
        let acked = (0..n).filter(|&q| q != root && q != missing && !below(q)).count() as u64;
        let t0 = std::time::Instant::now();
        let out = on_ranks(n, kind, false, cfg, |r| {
            let rank = r.communicator().rank();
            let b = Broadcast { root, offset: 0, bytes: 3000, chunk: 1000, algorithm: alg };
            let res = if rank == missing {
                r.barrier().map(|_| Ok(()))
            } else {
                r.broadcast(&b).map(|_| Ok(())).or_else(|e| Ok(Err(e)))
            };
            // Nobody's memory goes before everyone is done.
            r.barrier().expect("closing barrier");
            res.expect("barrier")
        });
        assert!(t0.elapsed() < Duration::from_secs(20), "{alg:?}: took {:?}", t0.elapsed());
        for (rank, res) in out.into_iter().enumerate() {
            let rank = rank as u32;
            let err = match res {
                Err(gdaki::Error::Kernel { error, .. }) => Some(error),
                Err(e) => panic!("{alg:?} rank {rank}: {e}"),
                Ok(()) => None,
            };
            // A receiver below the missing rank waits for its parent: the missing rank itself or a rank stuck
            // waiting above it. Any other receiver gets its bytes.
            let stuck = below(rank);
            match err {
                _ if rank == missing => assert_eq!(err, None),
                Some(DevError::Timeout(Timeout { on: WaitOn::Peer { rank: named, .. }, .. })) if stuck => {
                    assert_eq!(named, parent(alg, rank, root, n), "{alg:?} rank {rank} waits for its parent");
                }
                Some(DevError::Timeout(Timeout { on: WaitOn::GroupAck { expected, seen, .. }, .. }))
                    if rank == root =>
                {
                    assert_eq!((expected, seen), (3, acked), "{alg:?}: receivers that acknowledged");
                }
                None if rank != root && !stuck => {}
                other => panic!("{alg:?} root {root} missing {missing}: rank {rank} got {other:?}"),
            }
        }
    }
}

/// A rank that leaves the session during a broadcast (after the call's barrier, without launching): the root's
/// wait for acknowledgments ends with `PeerGone` naming it soon after the session reports the departure, not
/// after the call's 8 s bound; the root's other child, which does not depend on the rank that left, gets its
/// bytes and acknowledges. (Tree from rank 0 over 4 ranks: rank 0's children are 1 and 2, rank 1's is 3.)
/// Every rank keeps its objects until the others' calls have ended ([`CollRank::leave`] says why).
fn broadcast_root_learns_that_a_rank_left(kind: ExecutorKind) {
    let cfg = CollConfig { timeout: Duration::from_secs(8), ..CollConfig::new(4096) };
    let data = bytes(41, 3000);
    let ended = std::sync::Barrier::new(4);
    let t0 = std::time::Instant::now();
    let out = on_ranks(4, kind, false, cfg, |mut r| {
        let rank = r.communicator().rank();
        if rank == 0 {
            r.collectives().buffer().write(0, &data).expect("fill");
        }
        if rank == 3 {
            let barrier = r.barrier();
            r.leave();
            ended.wait();
            barrier.expect("the broadcast's barrier");
            return None;
        }
        let b = Broadcast { root: 0, offset: 0, bytes: 3000, chunk: 1000, algorithm: Algorithm::Tree };
        let res = r.broadcast(&b).map(|_| ());
        let took = t0.elapsed();
        let got = r.collectives().buffer().to_vec().map(|b| b[..3000].to_vec());
        ended.wait();
        Some((res, took, got.expect("read")))
    });
    match &out[0] {
        Some((Err(gdaki::Error::Kernel { error: DevError::PeerGone(p), .. }), took, _)) => {
            assert_eq!((p.rank, p.broken), (3, false));
            assert!(*took < Duration::from_secs(4), "the root ended after {took:?}");
        }
        other => panic!("the root got {:?}", other.as_ref().map(|o| &o.0)),
    }
    match &out[2] {
        Some((Ok(()), _, got)) => assert_eq!(first_diff(got, &data), None, "rank 2's bytes"),
        other => panic!("rank 2 got {:?}", other.as_ref().map(|o| &o.0)),
    }
}

#[test]
fn cpu_broadcast_root_learns_that_a_rank_left() {
    broadcast_root_learns_that_a_rank_left(ExecutorKind::Cpu);
}

/// On one GPU too: the rank that leaves says goodbye before it frees anything ([`CollRank::leave`]), so the
/// others' kernels learn of it while they run.
#[test]
#[ignore = "needs a GPU: run on the H200 with --ignored"]
fn gpu_broadcast_root_learns_that_a_rank_left() {
    let _gpu = gdaki_testkit::gpu_turn();
    broadcast_root_learns_that_a_rank_left(ExecutorKind::Gpu);
}

/// A call whose wait for its kernel ends first (a bound of 1 ns) leaves the kernel running; the rank's next
/// call fails at once, before its barrier, saying so, instead of launching a second kernel beside the first on
/// the same channels.
#[test]
fn cpu_no_call_follows_one_whose_kernel_outlived_its_wait() {
    let cfg = CollConfig { timeout: Duration::from_secs(8), ..CollConfig::new(4096) };
    let out = on_ranks(2, ExecutorKind::Cpu, false, cfg, |mut r| {
        let b = Broadcast { root: 0, offset: 0, bytes: 1000, chunk: 1000, algorithm: Algorithm::Tree };
        r.set_launch_timeout(Duration::from_nanos(1));
        let first = r.broadcast(&b).map(drop).map_err(|e| e.to_string());
        let t = std::time::Instant::now();
        let second = r.broadcast(&b).map(drop).map_err(|e| e.to_string());
        (first, second, t.elapsed())
    });
    for (rank, (first, second, took)) in out.iter().enumerate() {
        assert!(first.as_ref().is_err_and(|e| e.contains("still running")), "rank {rank}'s first call: {first:?}");
        let refused = second.as_ref().is_err_and(|e| e.contains("no more collectives on this rank"));
        assert!(refused && *took < Duration::from_secs(1), "rank {rank}'s second call ({took:?}): {second:?}");
    }
}

#[test]
fn cpu_broadcast_with_a_rank_missing_times_out_naming_it() {
    broadcast_with_a_rank_missing(ExecutorKind::Cpu);
}

#[test]
#[ignore = "needs a GPU: run on the H200 with --ignored"]
fn gpu_broadcast_with_a_rank_missing_times_out_naming_it() {
    let _gpu = gdaki_testkit::gpu_turn();
    broadcast_with_a_rank_missing(ExecutorKind::Gpu);
}

/// The bytes rank `src` sends rank `dst` in round `round`.
fn block(round: u64, src: usize, dst: usize, len: u64) -> Vec<u8> {
    bytes(round << 32 | (src as u64) << 8 | dst as u64, len as usize)
}

/// A random `n × n` count matrix (row: sender) with about a quarter zeros, each count at most `max`.
fn matrix(seed: u64, n: usize, max: u64) -> Vec<Vec<u64>> {
    let mut rng = SmallRng::seed_from_u64(seed);
    (0..n)
        .map(|_| (0..n).map(|_| if rng.random::<u8>() < 64 { 0 } else { rng.random_range(1..=max) }).collect())
        .collect()
}

/// One `all_to_all_v` on rank `r` with the count matrix `m` (row: sender), whose blocks are those of `round`:
/// fills this rank's buffer of `len` bytes with noise from `seed` and its blocks at `send_off`, makes the
/// call, and checks the counts received (the matrix's column), every byte at `recv_off` and that nothing
/// else of the buffer moved. `what` names the call in a failure.
fn all_to_all_v_checked<R: AsRef<[u64]>>(
    r: &CollRank,
    m: &[R],
    round: u64,
    seed: u64,
    len: usize,
    (send_off, recv_off): (u64, u64),
    what: &str,
) {
    let rank = r.communicator().rank() as usize;
    let mut before = bytes(seed, len);
    let mut at = send_off as usize;
    for (dst, &n) in m[rank].as_ref().iter().enumerate() {
        before[at..at + n as usize].copy_from_slice(&block(round, rank, dst, n));
        at += n as usize;
    }
    r.collectives().buffer().write(0, &before).expect("fill");
    let (got, _time) = r.all_to_all_v(m[rank].as_ref(), send_off, recv_off).unwrap_or_else(|e| panic!("{what}: {e}"));
    let column: Vec<u64> = m.iter().map(|row| row.as_ref()[rank]).collect();
    assert_eq!(got, column, "{what}: received counts");
    let mut want = before;
    let mut at = recv_off as usize;
    for (src, row) in m.iter().enumerate() {
        let n = row.as_ref()[rank];
        want[at..at + n as usize].copy_from_slice(&block(round, src, rank, n));
        at += n as usize;
    }
    let after = r.collectives().buffer().to_vec().expect("read");
    if let Some(at) = first_diff(&after, &want) {
        panic!("{what}: byte {at} differs");
    }
}

/// Three rounds of `all_to_all_v` on `n` ranks with random counts: each rank checks the counts it got
/// (the matrix's column) and every byte of its receive region, and that nothing else of its buffer moved.
fn all_to_all_v_run(kind: ExecutorKind, n: u32, one_nic: bool) {
    let n_us = n as usize;
    let max = (BUF as u64 / 2 - 64) / n as u64;
    let (send_off, recv_off) = (40u64, BUF as u64 / 2 + 8);
    let mats: Vec<Vec<Vec<u64>>> = (0..3).map(|k| matrix(0xa2a0 + k * 31 + n as u64, n_us, max)).collect();
    on_ranks(n, kind, one_nic, CollConfig::new(BUF), |r| {
        let rank = r.communicator().rank() as usize;
        for (round, m) in mats.iter().enumerate() {
            let round = round as u64;
            let what = format!("n={n} round {round} rank {rank}");
            all_to_all_v_checked(&r, m, round, round << 40 | 0xff00 | rank as u64, BUF, (send_off, recv_off), &what);
        }
    });
}

fn all_to_all_v_every_size(kind: ExecutorKind) {
    for n in [2, 3, 4, 8] {
        all_to_all_v_run(kind, n, n == 8);
    }
}

#[test]
fn cpu_all_to_all_v_random_counts() {
    all_to_all_v_every_size(ExecutorKind::Cpu);
}

#[test]
#[ignore = "needs a GPU: run on the H200 with --ignored"]
fn gpu_all_to_all_v_random_counts() {
    let _gpu = gdaki_testkit::gpu_turn();
    all_to_all_v_every_size(ExecutorKind::Gpu);
}

/// One rank sits an all-to-all out: every other rank waits for its count row and times out naming it.
fn all_to_all_v_with_a_rank_missing(kind: ExecutorKind) {
    let (n, missing) = (4u32, 1u32);
    let cfg = CollConfig { timeout: Duration::from_millis(300), ..CollConfig::new(4096) };
    let out = on_ranks(n, kind, false, cfg, |r| {
        let res = if r.communicator().rank() == missing {
            r.barrier().map(|_| None)
        } else {
            Ok(r.all_to_all_v(&[100; 4], 0, 2048).err())
        };
        r.barrier().expect("closing barrier");
        res.expect("barrier")
    });
    for (rank, err) in out.into_iter().enumerate() {
        match err {
            None if rank as u32 == missing => {}
            Some(gdaki::Error::Kernel {
                error: DevError::Timeout(Timeout { on: WaitOn::Peer { rank: named, .. }, .. }),
                ..
            }) => {
                assert_eq!(named, missing, "rank {rank}");
            }
            other => panic!("rank {rank}: {other:?}"),
        }
    }
}

#[test]
fn cpu_all_to_all_v_with_a_rank_missing_times_out_naming_it() {
    all_to_all_v_with_a_rank_missing(ExecutorKind::Cpu);
}

#[test]
#[ignore = "needs a GPU: run on the H200 with --ignored"]
fn gpu_all_to_all_v_with_a_rank_missing_times_out_naming_it() {
    let _gpu = gdaki_testkit::gpu_turn();
    all_to_all_v_with_a_rank_missing(ExecutorKind::Gpu);
}

/// All-to-all calls whose regions are bad on some rank, found only once the counts have arrived: the send and
/// receive regions overlapping on every rank, on one rank only (the one that sends most), one rank's
/// receive region running past the buffer, one rank's send region running past it, and one rank's counts
/// whose sum overflows. Every rank refuses each with `Regions` at once (no timeout, also where the bad
/// region is the caller's own send region, which it alone could have refused before the exchange), no byte
/// of any buffer moves, and a good call after each refused one delivers every byte.
fn all_to_all_v_refuses_bad_regions(kind: ExecutorKind) {
    const LEN: usize = 8192;
    let bad: [([[u64; 3]; 3], u64, u64); 5] = [
        ([[100; 3]; 3], 0, 100),
        ([[100; 3], [100; 3], [500; 3]], 0, 1000),
        ([[0, 0, 1500]; 3], 0, 6000),
        ([[10; 3], [5000, 5000, 0], [10; 3]], 0, 4096),
        ([[10; 3], [10; 3], [u64::MAX, 2, 0]], 0, 4096),
    ];
    let good: [[u64; 3]; 3] = [[10, 20, 30], [0, 40, 50], [60, 0, 70]];
    let (good_send, good_recv) = (8u64, 4096u64);
    let cfg = CollConfig { timeout: Duration::from_millis(300), ..CollConfig::new(LEN) };
    on_ranks(3, kind, false, cfg, |r| {
        let rank = r.communicator().rank() as usize;
        for (i, (counts, send_off, recv_off)) in bad.iter().enumerate() {
            let before = bytes(((0xbad0 + i as u64) << 8) | rank as u64, LEN);
            r.collectives().buffer().write(0, &before).expect("fill");
            match r.all_to_all_v(&counts[rank], *send_off, *recv_off) {
                Err(gdaki::Error::Kernel { error: DevError::InvalidArgument(InvalidArgument::Regions), .. }) => {}
                other => panic!("bad call {i} rank {rank}: {other:?}"),
            }
            let after = r.collectives().buffer().to_vec().expect("read");
            assert_eq!(first_diff(&after, &before), None, "bad call {i} rank {rank}: a byte moved");
            // A good call: the semaphores and the count matrix are as before the refused one.
            let (seed, what) =
                (((0x600d + i as u64) << 8) | rank as u64, format!("good call after bad call {i}, rank {rank}"));
            all_to_all_v_checked(&r, &good, i as u64, seed, LEN, (good_send, good_recv), &what);
        }
    });
}

#[test]
fn cpu_all_to_all_v_refuses_bad_regions_on_every_rank() {
    all_to_all_v_refuses_bad_regions(ExecutorKind::Cpu);
}

#[test]
#[ignore = "needs a GPU: run on the H200 with --ignored"]
fn gpu_all_to_all_v_refuses_bad_regions_on_every_rank() {
    let _gpu = gdaki_testkit::gpu_turn();
    all_to_all_v_refuses_bad_regions(ExecutorKind::Gpu);
}

/// More ranks than a handle holds, a zero buffer or a tag range past `u32::MAX`: refused by the setup on
/// every rank, before any exchange.
#[test]
fn setup_refuses_bad_configurations() {
    let setup = RankSetup { one_nic: true, ..RankSetup::local(9, ExecutorKind::Cpu) };
    let out = run_ranks(&setup, |comm: Arc<Communicator>| {
        gdaki::coll::Collectives::new(&comm, &CollConfig::new(4096)).err().map(|e| e.to_string())
    })
    .expect("ranks");
    for (rank, r) in out {
        let msg = r.expect("communicator").unwrap_or_else(|| panic!("rank {rank}: 9 ranks accepted"));
        assert!(msg.contains("9 ranks (at most 8)"), "rank {rank}: {msg}");
    }
    let setup = RankSetup { one_nic: true, ..RankSetup::local(2, ExecutorKind::Cpu) };
    let out = run_ranks(&setup, |comm: Arc<Communicator>| {
        let zero = gdaki::coll::Collectives::new(&comm, &CollConfig::new(0)).is_err();
        let tag =
            gdaki::coll::Collectives::new(&comm, &CollConfig { tag: u32::MAX - 2, ..CollConfig::new(64) }).is_err();
        (zero, tag)
    })
    .expect("ranks");
    for (rank, r) in out {
        assert_eq!(r.expect("communicator"), (true, true), "rank {rank}");
    }
}

/// The fixed-point scale of a reduce of `n` ranks' values bounded by `max_abs`, found by search: the largest
/// power of two `s` with `n * max_abs * s < 2^63` (so that `n` values of at most `max_abs * s` sum below
/// `i64::MAX`).
fn fixed_scale(n: u32, max_abs: f32) -> f64 {
    let m = n as f64 * max_abs as f64;
    (-400..400).rev().map(|k| 2f64.powi(k)).find(|s| m * s < 2f64.powi(63)).expect("a scale")
}

/// The most a reduce result may differ from the `f64` sum `reference` of `n` values bounded by `max_abs`:
/// each quantized value is off by at most `1 / (2s)`, the integer sum's conversion to `f64` by a relative
/// 2^-53 of at most `n * max_abs`, the reference's own `n - 1` additions as much each, and the final
/// rounding to `f32` by a relative 2^-24 (2^-150 absolute below the normal range).
fn error_bound(n: u32, max_abs: f32, reference: f64) -> f64 {
    let (nf, m) = (n as f64, n as f64 * max_abs as f64);
    let sums = nf / (2.0 * fixed_scale(n, max_abs)) + nf * m * 2f64.powi(-53);
    2f64.powi(-24) * (reference.abs() + sums) + sums + 2f64.powi(-150)
}

/// `count` values of rank `rank` in call `call`: uniform in `[-max_abs, max_abs]`, or, when `exact`,
/// multiples of 2^-12 there (multiples of `1 / s` whose sums `f32` holds exactly).
fn values(call: u64, rank: u32, count: usize, max_abs: f32, exact: bool) -> Vec<f32> {
    let mut rng = SmallRng::seed_from_u64(call << 16 | rank as u64);
    let steps = (max_abs * 4096.0) as i32;
    (0..count)
        .map(|_| {
            if exact {
                rng.random_range(-steps..=steps) as f32 / 4096.0
            } else {
                rng.random_range(-max_abs..=max_abs)
            }
        })
        .collect()
}

/// Reduce buffer layout: input at 16, accumulation area at 64 KiB, output at 32 KiB (or in place).
const R_IN: u64 = 16;
const R_ACC: u64 = 64 << 10;
const R_OUT: u64 = 32 << 10;

/// Values per call on `n` ranks: fewer on 8 (one NIC for all, and eight times the fetch-adds).
fn reduce_count(n: u32) -> usize {
    if n == 8 {
        128
    } else {
        700
    }
}

/// Four reduce calls on `n` ranks (roots 0, the last, 1, the last again; the third exact), or all-reduce
/// calls (in place) with each broadcast algorithm: each checks every output value against the `f64` sum
/// within [`error_bound`] (exactly for the exact call) on the root (on every rank for all-reduce), and that
/// a reduce left the other ranks' output ranges as they were.
fn reduce_run(kind: ExecutorKind, n: u32, all: bool) {
    let count = reduce_count(n);
    let max_abs = 3.25f32;
    let roots = [0, n - 1, 1 % n, n - 1];
    on_ranks(n, kind, n == 8, CollConfig::new(BUF), |r| {
        let rank = r.communicator().rank();
        for (call, &root) in roots.iter().enumerate() {
            let exact = call == 2;
            let out_offset = if all { R_IN } else { R_OUT };
            let x = values(call as u64, rank, count, max_abs, exact);
            let mut before = bytes(0xbeef << 8 | rank as u64, BUF);
            before[R_IN as usize..][..4 * count].copy_from_slice(bytemuck::cast_slice(&x));
            r.collectives().buffer().write(0, &before).expect("fill");
            let red = Reduce { root, offset: R_IN, count: count as u64, acc_offset: R_ACC, out_offset, max_abs };
            let what = format!("n={n} all={all} call {call} root {root} rank {rank}");
            if all { r.all_reduce(&red, Algorithm::ALL[call % 3]) } else { r.reduce(&red) }
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            let after = r.collectives().buffer().to_vec().expect("read");
            let out: &[f32] = bytemuck::cast_slice(&after[out_offset as usize..][..4 * count]);
            if !all && rank != root {
                let range = R_OUT as usize..R_OUT as usize + 4 * count;
                assert!(after[range.clone()] == before[range], "{what}: the output range moved");
                continue;
            }
            let every: Vec<Vec<f32>> = (0..n).map(|q| values(call as u64, q, count, max_abs, exact)).collect();
            for (i, &got) in out.iter().enumerate() {
                let want: f64 = every.iter().map(|x| x[i] as f64).sum();
                if exact {
                    assert_eq!(got as f64, want, "{what}: value {i}");
                } else {
                    let (err, bound) = ((got as f64 - want).abs(), error_bound(n, max_abs, want));
                    assert!(err <= bound, "{what}: value {i}: {got} for {want}, off by {err} > {bound}");
                }
            }
        }
    });
}

fn reduce_every_size(kind: ExecutorKind, all: bool) {
    for n in [2, 3, 4, 8] {
        reduce_run(kind, n, all);
    }
}

#[test]
fn cpu_reduce_within_the_error_bound() {
    reduce_every_size(ExecutorKind::Cpu, false);
}

#[test]
#[ignore = "needs a GPU: run on the H200 with --ignored"]
fn gpu_reduce_within_the_error_bound() {
    let _gpu = gdaki_testkit::gpu_turn();
    reduce_every_size(ExecutorKind::Gpu, false);
}

#[test]
fn cpu_all_reduce_within_the_error_bound() {
    reduce_every_size(ExecutorKind::Cpu, true);
}

#[test]
#[ignore = "needs a GPU: run on the H200 with --ignored"]
fn gpu_all_reduce_within_the_error_bound() {
    let _gpu = gdaki_testkit::gpu_turn();
    reduce_every_size(ExecutorKind::Gpu, true);
}

/// One rank holds a value above the bound or a NaN: that rank's call fails with `Value` and sends nothing.
/// With a receiver at fault, the root's group acknowledgment ends one short and its accumulation area holds
/// exactly the other ranks' quantized values (quantized here); with the root at fault, every other rank
/// times out naming it.
fn reduce_with_a_bad_value(kind: ExecutorKind) {
    let (n, count, max_abs) = (4u32, 50usize, 2.0f32);
    let cfg = CollConfig { timeout: Duration::from_millis(300), ..CollConfig::new(BUF) };
    for (root, bad, poison) in [(0u32, 2u32, 2.5f32), (1, 3, f32::NAN), (2, 2, 2.0000002), (3, 3, f32::INFINITY)] {
        let t0 = std::time::Instant::now();
        let out = on_ranks(n, kind, false, cfg, |r| {
            let rank = r.communicator().rank();
            let mut x = values(7, rank, count, max_abs, false);
            if rank == bad {
                x[count / 2] = poison;
            }
            r.collectives().buffer().write(R_IN as usize, bytemuck::cast_slice(&x)).expect("fill");
            let red = Reduce { root, offset: R_IN, count: count as u64, acc_offset: R_ACC, out_offset: R_OUT, max_abs };
            let res = r.reduce(&red);
            let acc = r.collectives().buffer().to_vec().expect("read")[R_ACC as usize..][..8 * count].to_vec();
            r.barrier().expect("closing barrier");
            (res, acc)
        });
        assert!(t0.elapsed() < Duration::from_secs(20), "took {:?}", t0.elapsed());
        let s = fixed_scale(n, max_abs);
        for (rank, (res, acc)) in out.into_iter().enumerate() {
            let rank = rank as u32;
            let what = format!("root {root} bad {bad} ({poison}) rank {rank}");
            let err = match res {
                Err(gdaki::Error::Kernel { error, .. }) => Some(error),
                Err(e) => panic!("{what}: {e}"),
                Ok(_) => None,
            };
            match err {
                Some(DevError::InvalidArgument(InvalidArgument::Value)) if rank == bad => {}
                Some(DevError::Timeout(Timeout { on: WaitOn::GroupAck { expected, seen, .. }, .. }))
                    if rank == root && bad != root =>
                {
                    assert_eq!((expected, seen), (3, 2), "{what}: one of three never acknowledged");
                    let lanes: &[i64] = bytemuck::cast_slice(&acc);
                    let good: Vec<Vec<f32>> =
                        (0..n).filter(|&q| q != bad).map(|q| values(7, q, count, max_abs, false)).collect();
                    for (i, &lane) in lanes.iter().enumerate() {
                        let want: i64 = good.iter().map(|x| (x[i] as f64 * s).round() as i64).sum();
                        assert_eq!(lane, want, "{what}: lane {i} holds what the good ranks sent");
                    }
                }
                Some(DevError::Timeout(Timeout { on: WaitOn::Peer { rank: named, .. }, .. })) if bad == root => {
                    assert_eq!(named, root, "{what}");
                }
                None if rank != root && rank != bad && bad != root => {}
                other => panic!("{what}: got {other:?}"),
            }
        }
    }
}

#[test]
fn cpu_reduce_with_a_bad_value_fails_there_and_sends_nothing() {
    reduce_with_a_bad_value(ExecutorKind::Cpu);
}

#[test]
#[ignore = "needs a GPU: run on the H200 with --ignored"]
fn gpu_reduce_with_a_bad_value_fails_there_and_sends_nothing() {
    let _gpu = gdaki_testkit::gpu_turn();
    reduce_with_a_bad_value(ExecutorKind::Gpu);
}

/// The device's scale is the one found here by search, for bounds from the smallest subnormal `f32` to the
/// largest, powers of two and their neighbours among them, on 1 to 8 ranks; bounds that are not positive
/// and finite have none.
#[test]
fn scale_is_the_largest_power_of_two_that_cannot_overflow() {
    let mut bounds = vec![f32::from_bits(1), f32::MIN_POSITIVE, 1e-30, 0.1, 3.25, 1e30, f32::MAX];
    for k in [-20, 0, 1, 10, 60] {
        let p = 2f32.powi(k);
        bounds.extend([p, f32::from_bits(p.to_bits() - 1), f32::from_bits(p.to_bits() + 1)]);
    }
    for n in 1..=8 {
        for &m in &bounds {
            assert_eq!(gdaki_device::coll::scale(n, m), Some(fixed_scale(n, m)), "n={n} max_abs={m:e}");
        }
        for m in [0.0, -1.0, f32::NAN, f32::INFINITY] {
            assert_eq!(gdaki_device::coll::scale(n, m), None, "n={n} max_abs={m}");
        }
    }
}

/// A positive finite `f32` from any binade, subnormals included.
fn any_bound() -> impl Strategy<Value = f32> {
    (1u32..0x7f80_0000).prop_map(f32::from_bits)
}

/// One rank's value as a fraction of the bound: the bound itself (either sign), zero, or anything between.
fn any_fraction() -> impl Strategy<Value = f64> {
    prop_oneof![Just(1.0), Just(-1.0), Just(0.0), -1.0f64..=1.0, -1.0f64..=1.0]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4000))]

    /// The NIC reduce's arithmetic, on any rank count and bound: the device's scale is the searched one;
    /// each quantized value is within half a unit of `x * s` (exactly: `x * s` is exact in `f64`); the
    /// `i64` sum of one value per rank never overflows (also with every value at the bound, same sign);
    /// and the dequantized sum is within [`error_bound`] of the `f64` sum.
    #[test]
    fn quantized_sums_never_overflow_and_stay_within_the_error_bound(
        n in 1u32..=8,
        max_abs in any_bound(),
        fractions in proptest::collection::vec(any_fraction(), 8),
        all_at_bound in proptest::option::weighted(0.2, any::<bool>()),
    ) {
        let s = scale(n, max_abs).expect("a positive finite bound has a scale");
        prop_assert_eq!(s, fixed_scale(n, max_abs));
        let xs: Vec<f32> = match all_at_bound {
            Some(positive) => vec![if positive { max_abs } else { -max_abs }; n as usize],
            None => fractions[..n as usize]
                .iter()
                .map(|f| ((f * max_abs as f64) as f32).clamp(-max_abs, max_abs))
                .collect(),
        };
        let mut sum = 0i64;
        for &x in &xs {
            let q = quantize(x, s);
            let exact = x as f64 * s;
            // |x * s| < 2^63, so both sides fit i128; below 2^53 the f64 difference is exact.
            if exact.abs() >= 2f64.powi(53) {
                prop_assert_eq!(q as i128, exact as i128, "x={:e} s={:e}", x, s);
            } else {
                prop_assert!((q as f64 - exact).abs() <= 0.5, "x={:e} s={:e} q={}", x, s, q);
            }
            sum = match sum.checked_add(q) {
                Some(v) => v,
                None => return Err(TestCaseError::fail(format!("overflow: n={n} max_abs={max_abs:e} xs={xs:?}"))),
            };
        }
        let reference: f64 = xs.iter().map(|&x| x as f64).sum();
        let got = dequantize(sum, s) as f64;
        let bound = error_bound(n, max_abs, reference);
        if got.is_infinite() {
            // A sum beyond f32's range is an infinity of its sign, as any f32 sum (n * max_abs may exceed
            // f32::MAX); only where the reference lies within the bound of that edge.
            prop_assert!(got.signum() == reference.signum() && reference.abs() + bound >= f32::MAX as f64,
                "n={} max_abs={:e} got={:e} want={:e}", n, max_abs, got, reference);
        } else {
            prop_assert!((got - reference).abs() <= bound,
                "n={} max_abs={:e} got={:e} want={:e} bound={:e}", n, max_abs, got, reference, bound);
        }
    }
}

/// Reduce arguments that break the layout or the bound: refused on every rank, each with its own code (a root
/// not below the rank count `Collective`, a bound that is not positive and finite `Bound`, regions that are
/// misaligned, overlap or leave the buffer `Regions`), nothing posted (no rank waits: each call returns at
/// once).
#[test]
fn cpu_reduce_refuses_bad_arguments() {
    use InvalidArgument::{Bound, Collective, Regions};
    let ok = Reduce { root: 0, offset: R_IN, count: 64, acc_offset: R_ACC, out_offset: R_OUT, max_abs: 1.0 };
    let bad = [
        (Reduce { root: 2, ..ok }, Collective),
        (Reduce { max_abs: 0.0, ..ok }, Bound),
        (Reduce { max_abs: -1.0, ..ok }, Bound),
        (Reduce { max_abs: f32::NAN, ..ok }, Bound),
        (Reduce { max_abs: f32::INFINITY, ..ok }, Bound),
        (Reduce { offset: R_IN + 2, ..ok }, Regions),
        (Reduce { acc_offset: R_ACC + 4, ..ok }, Regions),
        (Reduce { out_offset: R_OUT + 1, ..ok }, Regions),
        (Reduce { acc_offset: R_IN + 8, ..ok }, Regions),
        (Reduce { acc_offset: R_OUT - 8, ..ok }, Regions),
        (Reduce { acc_offset: BUF as u64 - 8 * 63, ..ok }, Regions),
        (Reduce { count: u64::MAX / 4, ..ok }, Regions),
    ];
    let out = on_ranks(2, ExecutorKind::Cpu, true, CollConfig::new(BUF), |r| {
        bad.iter().map(|(b, _)| r.reduce(b).err()).collect::<Vec<_>>()
    });
    for (rank, errs) in out.into_iter().enumerate() {
        for ((b, want), err) in bad.iter().zip(errs) {
            match err {
                Some(gdaki::Error::Kernel { error: DevError::InvalidArgument(a), .. }) if a == *want => {}
                other => panic!("rank {rank}: {b:?}: {other:?}, not {want:?}"),
            }
        }
    }
}

/// Ring all-reduce layout: input at 256, output at 40 KiB (or in place), scratch at 80 KiB; the broadcast
/// run between the ring calls uses 2000 bytes at 100 KiB.
const G_IN: u64 = 256;
const G_OUT: u64 = 40 << 10;
const G_SCRATCH: u64 = 80 << 10;
const G_BCAST: u64 = 100 << 10;

/// The values of segment `j` of `count` over `n` ranks, from the ring's definition: the first `count % n`
/// segments one value longer, in rank order.
fn ring_segment(count: usize, n: usize, j: usize) -> std::ops::Range<usize> {
    let (base, rem) = (count / n, count % n);
    let first = j * base + j.min(rem);
    first..first + base + usize::from(j < rem)
}

/// The ring's result for value `i` replayed on the host: the ranks' values added in `f32` from rank `j`
/// (the segment holding `i`) round the ring, `((x_j + x_{j+1}) + ...) + x_{j-1}`.
fn ring_order_sum(every: &[Vec<f32>], i: usize) -> f32 {
    let n = every.len();
    let j = (0..n).find(|&j| ring_segment(every[0].len(), n, j).contains(&i)).expect("a segment");
    (1..n).fold(every[j][i], |acc, k| acc + every[(j + k) % n][i])
}

/// The most an `f32` sum of `n` values made with `n - 1` additions (any order) may differ from the `f64`
/// sum `reference` of the same values, whose absolute values sum to `abs_sum`. Each `f32` addition rounds
/// by a relative `u = 2^-24` (an addition whose result is subnormal is exact), so the recursive sum is off by
/// at most `γ(n-1) · abs_sum` with `γ(k) = k u / (1 - k u)` (every partial sum is at most `abs_sum` in
/// magnitude); the `f64` reference's own `n - 1` additions add at most `(n - 1) 2^-53 · abs_sum`.
fn ring_error_bound(n: u32, abs_sum: f64) -> f64 {
    let k = (n - 1) as f64;
    let u = 2f64.powi(-24);
    (k * u / (1.0 - k * u) + k * 2f64.powi(-53)) * abs_sum
}

/// One call of a ring run: a ring all-reduce (count, chunk, in place), a broadcast or a NIC all-reduce on
/// the same communicator.
#[derive(Clone, Copy, Debug)]
enum RingCall {
    Ring(u64, u64, bool),
    Broadcast,
    NicAllReduce,
}

/// The calls of one ring run: counts 0, 1, odd, not multiples of the rank count or the chunk, in place
/// and out of place, the default chunk and small ones, with a broadcast and a NIC all-reduce between them.
fn ring_calls() -> Vec<RingCall> {
    use RingCall::*;
    vec![
        Ring(0, 0, false),
        Ring(1, 0, true),
        Ring(777, 50, false),
        Broadcast,
        Ring(1001, 0, true),
        Ring(13, 1, false),
        NicAllReduce,
        Ring(4099, 333, false),
        Ring(4099, 333, true),
    ]
}

/// `ring_calls()` on `n` ranks: after each ring call every rank checks every value of its output against
/// the `f64` sum within [`ring_error_bound`] and bitwise against [`ring_order_sum`], and that no byte
/// outside the output and the scratch area moved; the outputs are then compared bitwise across ranks. The
/// broadcast and NIC all-reduce between them are checked as in their own tests.
fn ring_run(kind: ExecutorKind, n: u32, one_nic: bool) {
    let list = ring_calls();
    let max_abs = 4.0f32;
    let outs = on_ranks(n, kind, one_nic, CollConfig::new(BUF), |r| {
        let rank = r.communicator().rank();
        let mut outs = Vec::new();
        for (call, &c) in list.iter().enumerate() {
            let what = format!("n={n} call {call} {c:?} rank {rank}");
            let seed = 0x5150 + call as u64;
            let mut before = bytes(seed << 8 | rank as u64, BUF);
            match c {
                RingCall::Broadcast => {
                    let root = n - 1;
                    let payload = bytes(seed << 8 | 0xff, 2000);
                    let range = G_BCAST as usize..G_BCAST as usize + 2000;
                    if rank == root {
                        before[range.clone()].copy_from_slice(&payload);
                    }
                    r.collectives().buffer().write(0, &before).expect("fill");
                    let b = Broadcast { root, offset: G_BCAST, bytes: 2000, chunk: 700, algorithm: Algorithm::Chain };
                    r.broadcast(&b).unwrap_or_else(|e| panic!("{what}: {e}"));
                    let mut want = before;
                    want[range].copy_from_slice(&payload);
                    let after = r.collectives().buffer().to_vec().expect("read");
                    assert_eq!(first_diff(&after, &want), None, "{what}: broadcast bytes");
                }
                RingCall::NicAllReduce => {
                    let count = 100;
                    let x = values(seed, rank, count, max_abs, false);
                    before[R_IN as usize..][..4 * count].copy_from_slice(bytemuck::cast_slice(&x));
                    r.collectives().buffer().write(0, &before).expect("fill");
                    let red = Reduce {
                        root: 1 % n,
                        offset: R_IN,
                        count: count as u64,
                        acc_offset: R_ACC,
                        out_offset: R_IN,
                        max_abs,
                    };
                    r.all_reduce(&red, Algorithm::Tree).unwrap_or_else(|e| panic!("{what}: {e}"));
                    let after = r.collectives().buffer().to_vec().expect("read");
                    let out: &[f32] = bytemuck::cast_slice(&after[R_IN as usize..][..4 * count]);
                    let every: Vec<Vec<f32>> = (0..n).map(|q| values(seed, q, count, max_abs, false)).collect();
                    for (i, &got) in out.iter().enumerate() {
                        let want: f64 = every.iter().map(|x| x[i] as f64).sum();
                        let (err, bound) = ((got as f64 - want).abs(), error_bound(n, max_abs, want));
                        assert!(err <= bound, "{what}: value {i}: {got} for {want}, off by {err} > {bound}");
                    }
                }
                RingCall::Ring(count, chunk, in_place) => {
                    let cn = count as usize;
                    let out_offset = if in_place { G_IN } else { G_OUT };
                    let x = values(seed, rank, cn, max_abs, false);
                    before[G_IN as usize..][..4 * cn].copy_from_slice(bytemuck::cast_slice(&x));
                    r.collectives().buffer().write(0, &before).expect("fill");
                    let g = RingAllReduce { in_offset: G_IN, out_offset, count, scratch_offset: G_SCRATCH, chunk };
                    r.all_reduce_ring(&g).unwrap_or_else(|e| panic!("{what}: {e}"));
                    let after = r.collectives().buffer().to_vec().expect("read");
                    let out = after[out_offset as usize..][..4 * cn].to_vec();
                    let got: Vec<f32> =
                        out.chunks_exact(4).map(|w| f32::from_le_bytes([w[0], w[1], w[2], w[3]])).collect();
                    let every: Vec<Vec<f32>> = (0..n).map(|q| values(seed, q, cn, max_abs, false)).collect();
                    let mut want = before;
                    for (i, &g) in got.iter().enumerate() {
                        let exact: f64 = every.iter().map(|x| x[i] as f64).sum();
                        let abs_sum: f64 = every.iter().map(|x| (x[i] as f64).abs()).sum();
                        let (err, bound) = ((g as f64 - exact).abs(), ring_error_bound(n, abs_sum));
                        assert!(err <= bound, "{what}: value {i}: {g} for {exact}, off by {err} > {bound}");
                        let ordered = ring_order_sum(&every, i);
                        assert_eq!(
                            g.to_bits(),
                            ordered.to_bits(),
                            "{what}: value {i}: {g}, ring order gives {ordered}"
                        );
                        want[out_offset as usize + 4 * i..][..4].copy_from_slice(&ordered.to_le_bytes());
                    }
                    // The scratch area holds partial sums: the only bytes besides the output that may move.
                    let scratch = G_SCRATCH as usize..(G_SCRATCH + ring_scratch_bytes(n, count)) as usize;
                    let mut after = after;
                    after[scratch.clone()].copy_from_slice(&want[scratch]);
                    assert_eq!(first_diff(&after, &want), None, "{what}: a byte outside the output moved");
                    outs.push(out);
                }
            }
        }
        outs
    });
    // Every rank gives one output per ring call (a `zip` alone would stop at the shorter list).
    let rings = list.iter().filter(|c| matches!(c, RingCall::Ring(..))).count();
    assert_eq!(outs.len(), n as usize, "n={n}: outputs of {} ranks", outs.len());
    for (rank, o) in outs.iter().enumerate() {
        assert_eq!(o.len(), rings, "n={n}: rank {rank} gave {} outputs for {rings} ring calls", o.len());
        for (k, (a, b)) in o.iter().zip(&outs[0]).enumerate() {
            assert!(a == b, "n={n}: ring call {k}: rank {rank}'s output differs from rank 0's");
        }
    }
}

fn ring_every_size(kind: ExecutorKind) {
    for n in [1, 2, 3, 4, 8] {
        // Eight ranks share one NIC, as in the other tests.
        ring_run(kind, n, n == 8);
    }
}

#[test]
fn cpu_all_reduce_ring_matches_the_ring_order_on_every_rank() {
    ring_every_size(ExecutorKind::Cpu);
}

#[test]
#[ignore = "needs a GPU: run on the H200 with --ignored"]
fn gpu_all_reduce_ring_matches_the_ring_order_on_every_rank() {
    let _gpu = gdaki_testkit::gpu_turn();
    ring_every_size(ExecutorKind::Gpu);
}

/// One rank sits a ring all-reduce out: every other rank ends within the short bound with a timeout naming
/// the rank before it in the ring (the missing rank's successor names it; the others wait for a successor
/// that is itself stuck).
fn ring_with_a_rank_missing(kind: ExecutorKind) {
    let (n, missing) = (4u32, 2u32);
    let cfg = CollConfig { timeout: Duration::from_millis(300), ..CollConfig::new(BUF) };
    let t0 = std::time::Instant::now();
    let out = on_ranks(n, kind, false, cfg, |r| {
        let g =
            RingAllReduce { in_offset: G_IN, out_offset: G_OUT, count: 3000, scratch_offset: G_SCRATCH, chunk: 400 };
        let res = if r.communicator().rank() == missing {
            r.barrier().map(|_| None)
        } else {
            Ok(r.all_reduce_ring(&g).err())
        };
        r.barrier().expect("closing barrier");
        res.expect("barrier")
    });
    assert!(t0.elapsed() < Duration::from_secs(20), "took {:?}", t0.elapsed());
    for (rank, err) in out.into_iter().enumerate() {
        let rank = rank as u32;
        match err {
            None if rank == missing => {}
            Some(gdaki::Error::Kernel {
                error: DevError::Timeout(Timeout { on: WaitOn::Peer { rank: named, .. }, .. }),
                ..
            }) if rank != missing => {
                assert_eq!(named, (rank + n - 1) % n, "rank {rank} names the rank before it");
            }
            other => panic!("rank {rank}: {other:?}"),
        }
    }
}

#[test]
fn cpu_all_reduce_ring_with_a_rank_missing_times_out_naming_it() {
    ring_with_a_rank_missing(ExecutorKind::Cpu);
}

#[test]
#[ignore = "needs a GPU: run on the H200 with --ignored"]
fn gpu_all_reduce_ring_with_a_rank_missing_times_out_naming_it() {
    let _gpu = gdaki_testkit::gpu_turn();
    ring_with_a_rank_missing(ExecutorKind::Gpu);
}

proptest! {
    /// The ring's scratch size against the definition computed here in 128 bits: `nranks - 1` slots of
    /// `ceil(count / nranks)` `f32`s, or `u64::MAX` (no buffer holds it) when that does not fit 64 bits.
    #[test]
    fn ring_scratch_bytes_is_exact_or_saturates(n in 0u32..=64, count in prop_oneof![0u64..100_000, any::<u64>()]) {
        let want = if n == 0 {
            0
        } else {
            let exact = 4 * (n as u128 - 1) * (count as u128).div_ceil(n as u128);
            u64::try_from(exact).unwrap_or(u64::MAX)
        };
        prop_assert_eq!(ring_scratch_bytes(n, count), want);
    }

    /// The default chunk against its documented properties: the whole range up to 64 KiB (1 for none), else
    /// a multiple of 4 KiB between 64 KiB and 4 MiB, and the smallest such one that takes the range in at
    /// most eight chunks (4 MiB when none does).
    #[test]
    fn default_chunk_takes_at_most_eight_chunks(
        bytes in prop_oneof![0u64..(1 << 16) + 100, (1u64 << 16)..(1 << 26), any::<u64>()],
    ) {
        const KIB: u64 = 1 << 10;
        let c = default_chunk(bytes);
        if bytes <= 64 * KIB {
            prop_assert_eq!(c, bytes.max(1));
        } else {
            prop_assert!(c.is_multiple_of(4 * KIB) && (64 * KIB..=4096 * KIB).contains(&c), "chunk {}", c);
            let chunks = |c: u64| bytes.div_ceil(c);
            if c < 4096 * KIB {
                prop_assert!(chunks(c) <= 8, "{} bytes in {} chunks of {}", bytes, chunks(c), c);
            }
            if c > 64 * KIB {
                prop_assert!(chunks(c - 4 * KIB) > 8, "{} bytes: {} is not the smallest chunk", bytes, c);
            }
        }
    }
}

/// Ring all-reduce arguments that break the layout: refused with `Regions` on every rank, nothing posted
/// (no rank waits: each call returns at once).
fn ring_refuses_bad_arguments(kind: ExecutorKind) {
    let ok = RingAllReduce { in_offset: G_IN, out_offset: G_OUT, count: 64, scratch_offset: G_SCRATCH, chunk: 0 };
    let scratch = ring_scratch_bytes(2, 64);
    let bad = [
        RingAllReduce { in_offset: G_IN + 2, ..ok },
        RingAllReduce { out_offset: G_OUT + 1, ..ok },
        RingAllReduce { scratch_offset: G_SCRATCH + 3, ..ok },
        // Input and output overlapping without being equal.
        RingAllReduce { out_offset: G_IN + 4, ..ok },
        RingAllReduce { out_offset: G_IN - 4, ..ok },
        // The scratch area overlapping the input or the output.
        RingAllReduce { scratch_offset: G_IN + 252, ..ok },
        RingAllReduce { scratch_offset: G_OUT - scratch + 4, ..ok },
        // Outside the buffer.
        RingAllReduce { in_offset: BUF as u64 - 252, ..ok },
        RingAllReduce { out_offset: BUF as u64 - 4, ..ok },
        RingAllReduce { scratch_offset: BUF as u64 - scratch + 4, ..ok },
        RingAllReduce { count: u64::MAX / 4, ..ok },
        RingAllReduce { count: BUF as u64 / 4 + 1, out_offset: 0, in_offset: 0, ..ok },
    ];
    let out = on_ranks(2, kind, true, CollConfig::new(BUF), |r| {
        let errs = bad.iter().map(|b| r.all_reduce_ring(b).err()).collect::<Vec<_>>();
        // The communicator still works: nothing was posted or waited for.
        let fine = r.all_reduce_ring(&ok).err();
        (errs, fine)
    });
    for (rank, (errs, fine)) in out.into_iter().enumerate() {
        for (b, err) in bad.iter().zip(errs) {
            match err {
                Some(gdaki::Error::Kernel { error: DevError::InvalidArgument(InvalidArgument::Regions), .. }) => {}
                other => panic!("rank {rank}: {b:?}: {other:?}"),
            }
        }
        assert!(fine.is_none(), "rank {rank}: the good call after the refused ones: {fine:?}");
    }
}

#[test]
fn cpu_all_reduce_ring_refuses_bad_arguments() {
    ring_refuses_bad_arguments(ExecutorKind::Cpu);
}

#[test]
#[ignore = "needs a GPU: run on the H200 with --ignored"]
fn gpu_all_reduce_ring_refuses_bad_arguments() {
    let _gpu = gdaki_testkit::gpu_turn();
    ring_refuses_bad_arguments(ExecutorKind::Gpu);
}

/// A ring all-reduce called from part of its block (behind a `tid == 0` test, as the other collectives are
/// called) or from two blocks: refused with `Collective` on every rank before anything is posted (before the
/// check the partial call returned `Ok` with most values missing their share), and a call made right after
/// works and sums exactly.
fn ring_refuses_a_partial_block_or_two_blocks(kind: ExecutorKind) {
    let count = 1000u64;
    let g = RingAllReduce { in_offset: G_IN, out_offset: G_OUT, count, scratch_offset: G_SCRATCH, chunk: 0 };
    let threads = match kind {
        ExecutorKind::Gpu => 128,
        _ => 4,
    };
    let out = on_ranks(2, kind, true, CollConfig::new(BUF), |r| {
        let rank = r.communicator().rank();
        let input: Vec<f32> = (0..count).map(|i| (i as f32) * (rank as f32 + 1.0)).collect();
        r.collectives().buffer().write(G_IN as usize, bytemuck::cast_slice(&input)).expect("input");
        let misuses = [(1, 1), (1, threads - 1), (2, threads)]
            .map(|(blocks, callers)| (blocks, callers, r.all_reduce_ring_by(&g, blocks, callers).err()));
        let fine = r.all_reduce_ring(&g).err();
        let all = r.collectives().buffer().to_vec().expect("read");
        let out = &all[G_OUT as usize..(G_OUT + 4 * count) as usize];
        (misuses, fine, out.chunks(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect::<Vec<f32>>())
    });
    for (rank, (misuses, fine, sum)) in out.into_iter().enumerate() {
        for (blocks, callers, err) in misuses {
            match err {
                Some(gdaki::Error::Kernel {
                    error: DevError::InvalidArgument(InvalidArgument::Collective), ..
                }) => {}
                other => panic!("rank {rank}: {blocks} block(s), {callers} caller(s): {other:?}"),
            }
        }
        assert!(fine.is_none(), "rank {rank}: the call as it should be made: {fine:?}");
        for (i, &v) in sum.iter().enumerate() {
            // Rank 0's value plus rank 1's, both exact in f32 below 2^24.
            assert_eq!(v, 3.0 * i as f32, "rank {rank}: value {i}");
        }
    }
}

#[test]
fn cpu_all_reduce_ring_refuses_a_partial_block_or_two_blocks() {
    ring_refuses_a_partial_block_or_two_blocks(ExecutorKind::Cpu);
}

#[test]
#[ignore = "needs a GPU: run on the H200 with --ignored"]
fn gpu_all_reduce_ring_refuses_a_partial_block_or_two_blocks() {
    let _gpu = gdaki_testkit::gpu_turn();
    ring_refuses_a_partial_block_or_two_blocks(ExecutorKind::Gpu);
}

/// A rank's calls made from two host threads at once (the harness's methods take `&self`): they take turns
/// on the rank, so that no two kernels post to the same channels at once. Both threads of both ranks make
/// the same chain broadcasts, so any pairing of the calls across ranks is a good one: every call succeeds,
/// every receiver holds the root's bytes, and the root counts one acknowledgment per call.
#[test]
fn cpu_calls_from_two_threads_of_a_rank_take_turns() {
    const BYTES: usize = 30_000;
    const CALLS: usize = 3;
    let cfg = CollConfig { timeout: Duration::from_millis(500), ..CollConfig::new(BUF) };
    let payload = bytes(0x7e7e, BYTES);
    let out = on_ranks(2, ExecutorKind::Cpu, false, cfg, |r| {
        let rank = r.communicator().rank();
        let mine = if rank == 0 { payload.clone() } else { bytes(0x7e00 | rank as u64, BYTES) };
        r.collectives().buffer().write(0, &mine).expect("fill");
        let b = Broadcast { root: 0, offset: 0, bytes: BYTES as u64, chunk: 100, algorithm: Algorithm::Chain };
        let errors: Vec<String> = std::thread::scope(|s| {
            let threads: Vec<_> = (0..2)
                .map(|_| {
                    s.spawn(|| {
                        (0..CALLS).filter_map(|_| r.broadcast(&b).err()).map(|e| e.to_string()).collect::<Vec<_>>()
                    })
                })
                .collect();
            threads.into_iter().flat_map(|t| t.join().expect("a calling thread")).collect::<Vec<_>>()
        });
        let after = r.collectives().buffer().to_vec().expect("read");
        (errors, first_diff(&after[..BYTES], &payload), r.collectives().acks())
    });
    for (rank, (errors, diff, acks)) in out.into_iter().enumerate() {
        assert!(errors.is_empty(), "rank {rank}: {errors:?}");
        assert_eq!(diff, None, "rank {rank}: the root's bytes");
        assert_eq!(acks, if rank == 0 { 2 * CALLS as u64 } else { 0 }, "rank {rank}: acknowledgments");
    }
}

/// One rank of three set up with a buffer of another length: every rank refuses the setup at once, those with
/// the right length naming the odd rank, before any of them connects. (Had the ranks connected peer by peer,
/// rank 2 would connect to rank 0 while rank 0 had already refused rank 1, and wait for it in vain.)
#[test]
fn setup_with_one_buffer_of_another_length_is_refused_on_every_rank() {
    let setup = RankSetup { one_nic: true, timeout: Duration::from_secs(10), ..RankSetup::local(3, ExecutorKind::Cpu) };
    let t0 = std::time::Instant::now();
    let out = run_ranks(&setup, |comm: Arc<Communicator>| {
        let len = if comm.rank() == 1 { 8192 } else { 4096 };
        let res = gdaki::coll::Collectives::new(&comm, &CollConfig::new(len)).map(drop);
        // Every rank has its answer before any leaves the session.
        comm.bootstrap().barrier().expect("barrier");
        res
    })
    .expect("ranks");
    assert!(t0.elapsed() < Duration::from_secs(8), "took {:?}", t0.elapsed());
    for (rank, r) in out {
        let msg = match r.expect("communicator") {
            Err(gdaki::Error::InvalidArgument(m)) => m,
            other => panic!("rank {rank}: {other:?}"),
        };
        let odd = if rank == 1 { "rank 0's" } else { "rank 1's" };
        assert!(msg.contains(&format!("{odd} data buffer is")), "rank {rank}: {msg}");
    }
}
