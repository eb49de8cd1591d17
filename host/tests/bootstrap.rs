//! The bootstrap over real loopback TCP, with threads as ranks. Every session binds port 0 through
//! `Bootstrap::root_on`, so tests run in parallel without port clashes.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use gdaki::bootstrap::{Bootstrap, Launch, LaunchFlags, Secret, MAX_FRAME, MAX_WORLD_SIZE};
use gdaki::Error;
use gdaki_shared::handle::RemoteMr;
use gdaki_shared::Be32;

const TIMEOUT: Duration = Duration::from_secs(10);

/// A listener on a free loopback port, and the launch of every rank of a session rooted there.
fn session(world_size: u32) -> (TcpListener, Vec<Launch>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let root = listener.local_addr().unwrap().to_string();
    let secret = Secret::random().unwrap();
    let launches = (0..world_size).map(|rank| Launch {
        rank,
        world_size,
        local_rank: rank,
        root: root.clone(),
        secret,
        source: "test",
    });
    (listener, launches.collect())
}

/// Runs `f` on every rank of a fresh session (one thread per rank) and returns the results by rank.
fn run<T: Send>(world_size: u32, timeout: Duration, f: impl Fn(Bootstrap) -> T + Sync) -> Vec<T> {
    let (listener, launches) = session(world_size);
    let mut listener = Some(listener);
    let f = &f;
    thread::scope(|s| {
        let handles: Vec<_> = launches
            .iter()
            .map(|launch| {
                let listener = if launch.rank == 0 { listener.take() } else { None };
                s.spawn(move || {
                    let boot = match listener {
                        Some(l) => Bootstrap::root_on(l, launch, timeout),
                        None => Bootstrap::connect(launch, timeout),
                    };
                    f(boot.unwrap_or_else(|e| panic!("rank {}: {e}", launch.rank)))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn message(e: Error) -> String {
    match e {
        Error::Bootstrap(m) => m,
        other => panic!("expected Error::Bootstrap, got {other:?}"),
    }
}

fn random_bytes(len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    getrandom::fill(&mut v).unwrap();
    v
}

/// Waits until the root has closed `stream` (read returns 0 or an error), which is how it drops a stray.
fn assert_closed_by_root(mut stream: TcpStream) {
    stream.set_read_timeout(Some(Duration::from_secs(8))).unwrap();
    let mut buf = [0u8; 64];
    match stream.read(&mut buf) {
        Ok(0) => {}
        Err(e) => assert!(
            !matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut),
            "the root kept a stray connection open"
        ),
        Ok(n) => panic!("the root answered a stray connection with {n} bytes: {:?}", &buf[..n]),
    }
}

#[test]
fn all_gather_four_ranks_random_payloads() {
    let rounds: Vec<Vec<Vec<u8>>> =
        (0..3).map(|round| (0..4).map(|rank| random_bytes(rank * 97 + round * 1000 + rank * rank)).collect()).collect();
    assert_eq!(rounds[0][0].len(), 0);
    let results = run(4, TIMEOUT, |b| {
        assert_eq!((b.world_size(), b.timeout()), (4, TIMEOUT));
        rounds.iter().map(|round| b.all_gather(&round[b.rank() as usize]).unwrap()).collect::<Vec<_>>()
    });
    for got in results {
        assert_eq!(got, rounds);
    }
}

#[test]
fn all_gather_pod_exchanges_qp_and_mr_info() {
    let results = run(3, TIMEOUT, |b| {
        let r = b.rank();
        // A QP's info as 40 bytes (what `Endpoint::to_bytes` gives), here as five words.
        let qp: [u64; 5] = [100 + r as u64, 0x1000 + r as u64, 0xabc000 + r as u64, 1 << 40, r as u64];
        let qps = b.all_gather_pod(&qp).unwrap();
        let mr = RemoteMr { addr: 0x7f00_0000_0000 + r as u64 * 4096, length: 4096, rkey: Be32::new(0x55 + r), pad: 0 };
        // Ring: send my MR to the next rank, receive the previous rank's.
        b.send_pod((r + 1) % 3, 7, &mr).unwrap();
        let prev: RemoteMr = b.recv_pod((r + 2) % 3, 7).unwrap();
        // Wrong size: QP info where an MR is expected.
        b.send_pod(r, 8, &qp).unwrap();
        let wrong = message(b.recv_pod::<RemoteMr>(r, 8).unwrap_err());
        // The refused message stays queued: a receive of the right shape still gets it.
        assert_eq!(b.recv_pod::<[u64; 5]>(r, 8).unwrap(), qp);
        // The root relays: it must not leave before the others are done.
        b.barrier().unwrap();
        (qps, prev, wrong)
    });
    for (r, (qps, prev, wrong)) in results.into_iter().enumerate() {
        let qpns: Vec<u64> = qps.iter().map(|q| q[1]).collect();
        assert_eq!(qpns, [0x1000, 0x1001, 0x1002]);
        assert_eq!(qps[2], [102, 0x1002, 0xabc002, 1 << 40, 2]);
        let p = (r as u32 + 2) % 3;
        assert_eq!(
            (prev.addr, prev.length, prev.rkey.get(), prev.pad),
            (0x7f00_0000_0000 + p as u64 * 4096, 4096, 0x55 + p, 0)
        );
        assert_eq!(
            wrong,
            format!("rank {r}: recv_pod tag 8: rank {r} sent 40 bytes, expected 24 for gdaki_shared::handle::RemoteMr")
        );
    }
}

#[test]
fn barrier_waits_for_every_rank() {
    let before = AtomicU32::new(0);
    let seen = run(3, TIMEOUT, |b| {
        let mut seen = Vec::new();
        for round in 1..=3u32 {
            if b.rank() == 2 {
                // The last rank comes late: nobody may leave the barrier before it arrives.
                thread::sleep(Duration::from_millis(100));
            }
            before.fetch_add(1, Ordering::SeqCst);
            b.barrier().unwrap();
            // The second barrier keeps everyone from starting the next round before this check.
            seen.push(before.load(Ordering::SeqCst) == 3 * round);
            b.barrier().unwrap();
        }
        seen
    });
    assert_eq!(seen, vec![vec![true; 3]; 3]);
}

#[test]
fn send_recv_keeps_other_tags_for_later() {
    let got = run(3, TIMEOUT, |b| match b.rank() {
        // B sends tag 2 then tag 1, before A asks.
        2 => {
            b.send(1, 2, b"two").unwrap();
            b.send(1, 1, b"one").unwrap();
            b.send(1, 2, b"two again").unwrap();
            b.send(0, 5, b"to the root").unwrap();
            b.barrier().unwrap();
            vec![b.recv(0, 9).unwrap()]
        }
        1 => {
            thread::sleep(Duration::from_millis(100));
            let one = b.recv(2, 1).unwrap();
            let two = b.recv(2, 2).unwrap();
            let again = b.recv(2, 2).unwrap();
            b.send(1, 3, b"self").unwrap();
            let own = b.recv(1, 3).unwrap();
            b.barrier().unwrap();
            vec![one, two, again, own]
        }
        _ => {
            let m = b.recv(2, 5).unwrap();
            b.barrier().unwrap();
            b.send(2, 9, b"from the root").unwrap();
            vec![m]
        }
    });
    assert_eq!(got[0], [b"to the root".to_vec()]);
    assert_eq!(got[1], [b"one".to_vec(), b"two".to_vec(), b"two again".to_vec(), b"self".to_vec()]);
    assert_eq!(got[2], [b"from the root".to_vec()]);
}

#[test]
fn recv_times_out_naming_peer_and_tag() {
    // Joining is bounded by TIMEOUT, so that a rank thread that starts late does not fail the join.
    let errs = run(2, TIMEOUT, |mut b| {
        b.set_timeout(Duration::from_millis(300));
        let t = Instant::now();
        let e = message(b.recv(1 - b.rank(), 42).unwrap_err());
        let elapsed = t.elapsed();
        b.barrier().unwrap();
        (e, elapsed)
    });
    for (r, (e, elapsed)) in errs.into_iter().enumerate() {
        assert_eq!(e, format!("rank {r}: recv from rank {} tag 42: timed out after 300ms", 1 - r));
        assert!(elapsed >= Duration::from_millis(290) && elapsed < Duration::from_secs(2), "{elapsed:?}");
    }
}

#[test]
fn out_of_range_peer_and_oversized_send_are_errors() {
    let errs = run(2, TIMEOUT, |b| {
        let e1 = message(b.send(2, 0, b"x").unwrap_err());
        let e2 = message(b.recv(7, 0).unwrap_err());
        let e3 = message(b.send(1 - b.rank(), 0, &vec![0u8; MAX_FRAME as usize]).unwrap_err());
        b.barrier().unwrap();
        [e1, e2, e3]
    });
    assert_eq!(errs[1][0], "rank 1: send to rank 2 tag 0: rank 2 is out of range for world size 2");
    assert_eq!(errs[0][1], "rank 0: recv from rank 7 tag 0: rank 7 is out of range for world size 2");
    assert_eq!(
        errs[0][2],
        "rank 0: send to rank 1 tag 0: frame of 16777232 bytes exceeds the limit of 16777216 bytes (MAX_FRAME)"
    );
    assert!(errs[1][2].starts_with("rank 1: send to rank 0 tag 0: via the root at 127.0.0.1:"), "{}", errs[1][2]);
    assert!(errs[1][2].ends_with(": frame of 16777232 bytes exceeds the limit of 16777216 bytes (MAX_FRAME)"));
}

#[test]
fn world_of_one_needs_no_socket() {
    let launch = Launch::solo(Secret::random().unwrap());
    let b = Bootstrap::connect(&launch, Duration::from_millis(100)).unwrap();
    assert_eq!(b.all_gather(b"solo").unwrap(), [b"solo".to_vec()]);
    b.barrier().unwrap();
    b.send(0, 1, b"me").unwrap();
    assert_eq!(b.recv(0, 1).unwrap(), b"me");
}

/// A message to oneself and a world of one's all_gather never touch a socket, but keep MAX_FRAME as every
/// other send and all_gather does: a frame of `16 + len` bytes (kind, the call's header, the data) passes at
/// exactly MAX_FRAME and fails one byte over, queuing nothing.
#[test]
fn sends_to_oneself_and_a_world_of_one_keep_the_frame_limit() {
    let fits = MAX_FRAME as usize - 16;
    let over = format!("frame of {} bytes exceeds the limit of {MAX_FRAME} bytes (MAX_FRAME)", MAX_FRAME + 1);
    let errs = run(2, TIMEOUT, |b| {
        let me = b.rank();
        let e = message(b.send(me, 5, &vec![7u8; fits + 1]).unwrap_err());
        let big = random_bytes(fits);
        b.send(me, 5, &big).unwrap();
        b.send(me, 5, b"next").unwrap();
        assert!(b.recv(me, 5).unwrap() == big, "rank {me}: the largest message to itself came back changed");
        assert_eq!(b.recv(me, 5).unwrap(), b"next");
        b.barrier().unwrap();
        e
    });
    for (rank, e) in errs.iter().enumerate() {
        assert_eq!(*e, format!("rank {rank}: send to rank {rank} tag 5: {over}"));
    }
    let solo = Bootstrap::connect(&Launch::solo(Secret::random().unwrap()), Duration::from_millis(100)).unwrap();
    let e = message(solo.all_gather(&vec![1u8; fits + 1]).unwrap_err());
    assert_eq!(e, format!("rank 0: all_gather #0: {over}"));
    let part = random_bytes(fits);
    assert!(solo.all_gather(&part).unwrap() == [part], "a world of one's largest all_gather came back changed");
    let e = message(solo.send(0, 1, &vec![0u8; fits + 1]).unwrap_err());
    assert_eq!(e, format!("rank 0: send to rank 0 tag 1: {over}"));
}

/// Starts the root and rank 1 of a two-rank session after `intrude` has had its way with the root; returns
/// what `intrude` returned. The real session must then complete an all_gather.
fn survives<T>(intrude: impl FnOnce(&Launch) -> T) -> T {
    let (listener, launches) = session(2);
    thread::scope(|s| {
        let root = s.spawn(|| {
            let b = Bootstrap::root_on(listener, &launches[0], TIMEOUT).unwrap();
            b.all_gather(b"root").unwrap()
        });
        let out = intrude(&launches[1]);
        let b = Bootstrap::connect(&launches[1], TIMEOUT).unwrap();
        let expect = vec![b"root".to_vec(), b"one".to_vec()];
        assert_eq!(b.all_gather(b"one").unwrap(), expect);
        assert_eq!(root.join().unwrap(), expect);
        out
    })
}

#[test]
fn wrong_secret_is_rejected_and_the_session_completes() {
    let (e, root) = survives(|real| {
        let intruder = Launch { secret: Secret::random().unwrap(), ..real.clone() };
        (message(Bootstrap::connect(&intruder, TIMEOUT).unwrap_err()), real.root.clone())
    });
    assert_eq!(
        e,
        format!(
            "rank 1: rejected by root {root}: wrong session secret (give every rank the same secret: --secret, \
             --secret-file, GDAKI_SECRET or GDAKI_SECRET_FILE; without one, on loopback, the same --bootstrap \
             spelling)"
        )
    );
}

#[test]
fn wrong_world_size_and_rank_zero_are_rejected() {
    let (e1, e2) = survives(|real| {
        let bigger = Launch { world_size: 3, ..real.clone() };
        let e1 = message(Bootstrap::connect(&bigger, TIMEOUT).unwrap_err());
        // A process claiming rank 0 (connect would make it listen instead): its hello, by hand.
        let mut s = TcpStream::connect(&real.root).unwrap();
        s.write_all(&hello_frame(1, real.secret.as_bytes(), 0, 2)).unwrap();
        (e1, read_reject(s))
    });
    assert!(e1.ends_with(": rank 1 says world size 3, the root's is 2"), "{e1}");
    assert!(e1.starts_with("rank 1: rejected by root 127.0.0.1:"), "{e1}");
    assert_eq!(e2, "rank 0 is the root; another process claims it");
}

/// Ranks on loopback without a secret derive it from the root's address and their world size, so a rank that
/// disagrees on the world size also has another secret: the root must still say that the world size is what
/// differs, not send the user hunting for a secret nobody gave.
#[test]
fn loopback_ranks_without_a_secret_are_told_when_their_world_sizes_differ() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let root = listener.local_addr().unwrap().to_string();
    let launch = |rank, world_size| {
        let flags = LaunchFlags {
            rank: Some(rank),
            world_size: Some(world_size),
            bootstrap: Some(root.clone()),
            ..LaunchFlags::default()
        };
        Launch::resolve(flags, |_| None).unwrap().unwrap()
    };
    let (root_launch, bigger, real) = (launch(0, 2), launch(1, 3), launch(1, 2));
    assert_ne!(bigger.secret, real.secret, "the derived secret no longer depends on the world size");
    thread::scope(|s| {
        let r = s.spawn(|| Bootstrap::root_on(listener, &root_launch, TIMEOUT).unwrap().all_gather(b"root").unwrap());
        let e = message(Bootstrap::connect(&bigger, TIMEOUT).unwrap_err());
        assert_eq!(e, format!("rank 1: rejected by root {root}: rank 1 says world size 3, the root's is 2"));
        // The session still completes with the right rank 1.
        let b = Bootstrap::connect(&real, TIMEOUT).unwrap();
        let expect = vec![b"root".to_vec(), b"one".to_vec()];
        assert_eq!(b.all_gather(b"one").unwrap(), expect);
        assert_eq!(r.join().unwrap(), expect);
    });
}

fn hello_frame(version: u32, secret: &[u8; 16], rank: u32, world_size: u32) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&40u32.to_le_bytes());
    f.extend_from_slice(&1u32.to_le_bytes());
    f.extend_from_slice(b"GDAKIBS1");
    f.extend_from_slice(&version.to_le_bytes());
    f.extend_from_slice(secret);
    f.extend_from_slice(&rank.to_le_bytes());
    f.extend_from_slice(&world_size.to_le_bytes());
    f
}

/// Reads the root's reject frame by hand (the wire format is part of the contract) and returns its reason.
fn read_reject(mut s: TcpStream) -> String {
    s.set_read_timeout(Some(Duration::from_secs(8))).unwrap();
    let mut reply = Vec::new();
    s.read_to_end(&mut reply).unwrap();
    assert!(reply.len() >= 8, "{reply:?}");
    let len = u32::from_le_bytes(reply[0..4].try_into().unwrap()) as usize;
    assert_eq!(len + 4, reply.len(), "one frame, then the root closes");
    assert_eq!(u32::from_le_bytes(reply[4..8].try_into().unwrap()), 3, "kind Reject");
    String::from_utf8(reply[8..].to_vec()).unwrap()
}

#[test]
fn other_protocol_version_gets_a_readable_reject() {
    let reason = survives(|real| {
        let mut s = TcpStream::connect(&real.root).unwrap();
        s.write_all(&hello_frame(2, real.secret.as_bytes(), 1, 2)).unwrap();
        read_reject(s)
    });
    assert_eq!(reason, "protocol version 2, the root speaks version 1");
}

#[test]
fn malformed_hello_is_dropped_and_the_session_completes() {
    survives(|real| {
        // Right length and kind, wrong magic.
        let mut s = TcpStream::connect(&real.root).unwrap();
        let mut frame = hello_frame(1, real.secret.as_bytes(), 1, 2);
        frame[8..16].copy_from_slice(b"NOTGDAKI");
        s.write_all(&frame).unwrap();
        assert_closed_by_root(s);
        // Random garbage, then a truncated frame, then a connection that says nothing and stays open (it must
        // not delay the real rank; the root drops it after its hello timeout).
        let mut g = TcpStream::connect(&real.root).unwrap();
        g.write_all(&random_bytes(100)).unwrap();
        assert_closed_by_root(g);
        let mut t = TcpStream::connect(&real.root).unwrap();
        t.write_all(&frame[..20]).unwrap();
        t.shutdown(std::net::Shutdown::Write).unwrap();
        assert_closed_by_root(t);
        TcpStream::connect(&real.root).unwrap()
    });
}

#[test]
fn oversized_length_prefix_is_dropped_and_the_session_completes() {
    survives(|real| {
        let mut s = TcpStream::connect(&real.root).unwrap();
        s.write_all(&u32::MAX.to_le_bytes()).unwrap();
        s.write_all(&1u32.to_le_bytes()).unwrap();
        assert_closed_by_root(s);
    });
}

#[test]
fn duplicate_rank_is_rejected() {
    let (listener, launches) = session(3);
    let launches = &launches;
    thread::scope(|s| {
        let root = s.spawn(|| Bootstrap::root_on(listener, &launches[0], TIMEOUT).unwrap().all_gather(b"0").unwrap());
        // Two processes claim rank 1: the one whose hello comes second is rejected (and returns at once);
        // the other waits until rank 2 joins.
        let (tx, rx) = mpsc::channel();
        let ones: Vec<_> = (0..2)
            .map(|_| {
                let tx = tx.clone();
                s.spawn(move || {
                    let r = Bootstrap::connect(&launches[1], TIMEOUT);
                    let failed = r.is_err();
                    tx.send(()).unwrap();
                    let r = r.map(|b| b.all_gather(b"1").unwrap());
                    (failed, r)
                })
            })
            .collect();
        rx.recv_timeout(TIMEOUT).expect("one of the two rank-1 processes is rejected before rank 2 starts");
        let two = s.spawn(|| Bootstrap::connect(&launches[2], TIMEOUT).unwrap().all_gather(b"2").unwrap());
        let expect = vec![b"0".to_vec(), b"1".to_vec(), b"2".to_vec()];
        let mut outcomes: Vec<_> = ones.into_iter().map(|h| h.join().unwrap().1).collect();
        outcomes.sort_by_key(|r| r.is_ok());
        let err = message(outcomes.remove(0).unwrap_err());
        assert_eq!(err, format!("rank 1: rejected by root {}: rank 1 already joined", launches[0].root));
        assert_eq!(outcomes.remove(0).unwrap(), expect);
        assert_eq!(two.join().unwrap(), expect);
        assert_eq!(root.join().unwrap(), expect);
    });
}

#[test]
fn rank_out_of_range_is_rejected_by_resolve_and_connect() {
    let flags = LaunchFlags { rank: Some(4), world_size: Some(4), ..LaunchFlags::default() };
    let e = message(Launch::resolve(flags, |_| None).unwrap_err());
    assert_eq!(e, "rank 4 is out of range for world size 4 (from flags)");
    let env = |k: &str| match k {
        "SLURM_PROCID" => Some("9".to_string()),
        "SLURM_NTASKS" => Some("2".to_string()),
        _ => None,
    };
    let e = message(Launch::resolve(LaunchFlags::default(), env).unwrap_err());
    assert_eq!(e, "rank 9 is out of range for world size 2 (from srun)");
    let (_listener, launches) = session(2);
    let bad = Launch { rank: 2, local_rank: 2, ..launches[1].clone() };
    let e = message(Bootstrap::connect(&bad, TIMEOUT).unwrap_err());
    assert_eq!(e, "rank 2 is out of range for world size 2 (from test)");
}

#[test]
fn rank_out_of_range_hello_is_rejected_by_the_root() {
    let reason = survives(|real| {
        let mut s = TcpStream::connect(&real.root).unwrap();
        s.write_all(&hello_frame(1, real.secret.as_bytes(), 5, 2)).unwrap();
        read_reject(s)
    });
    assert_eq!(reason, "rank 5 is out of range for world size 2");
}

#[test]
fn root_times_out_listing_the_missing_rank() {
    let timeout = Duration::from_secs(1);
    let (listener, launches) = session(3);
    thread::scope(|s| {
        let root = s.spawn(|| {
            let t = Instant::now();
            (Bootstrap::root_on(listener, &launches[0], timeout).map(drop), t.elapsed())
        });
        // A longer timeout than the root's, so that the root's reject (not rank 1's own timeout) ends it.
        let one = s.spawn(|| {
            let t = Instant::now();
            (Bootstrap::connect(&launches[1], 4 * timeout).map(drop), t.elapsed())
        });
        let (r0, t0) = root.join().unwrap();
        let (r1, t1) = one.join().unwrap();
        let addr = &launches[0].root;
        let why = format!("timed out after 1s waiting for ranks [2] to join root {addr}");
        assert_eq!(message(r0.unwrap_err()), format!("rank 0: {why}"));
        assert_eq!(message(r1.unwrap_err()), format!("rank 1: rejected by root {addr}: {why}"));
        assert!(t0 >= timeout && t0 < 3 * timeout, "root returned after {t0:?}");
        assert!(t1 < 3 * timeout, "rank 1 returned after {t1:?}");
    });
}

/// A world size over MAX_WORLD_SIZE is refused at once, on the root and on the others, before the root sizes
/// anything by it or a rank dials (u32::MAX made the root build and scan tables of 4 billion entries); and a
/// large world that is allowed but incomplete times out naming its missing ranks in one short line.
#[test]
fn a_world_over_the_limit_is_refused_at_once_and_a_large_worlds_timeout_stays_one_short_line() {
    let (listener, launches) = session(2);
    let short = Duration::from_millis(300);
    // Over the limit by one first: on code without the limit it fails here, before trying u32::MAX.
    for world_size in [MAX_WORLD_SIZE + 1, u32::MAX] {
        let why = |rank| {
            format!("rank {rank}: world size {world_size} (from test) is over the bootstrap's limit of 65536 ranks")
        };
        let root = Launch { world_size, ..launches[0].clone() };
        // Calls bounded by TIMEOUT, refused in far less: a root that waited for its ranks, or a rank that dialed
        // and waited for a welcome, would take all of it (with `short` as their bound, two refusals had to fit in
        // 300 ms, which a loaded machine may not give them).
        let t = Instant::now();
        let e = message(Bootstrap::root_on(listener.try_clone().unwrap(), &root, TIMEOUT).unwrap_err());
        assert_eq!(e, why(0));
        assert_eq!(
            message(Bootstrap::connect(&Launch { world_size, ..launches[1].clone() }, TIMEOUT).unwrap_err()),
            why(1)
        );
        assert!(t.elapsed() < TIMEOUT / 2, "refused after {:?}", t.elapsed());
    }
    let (listener, launches) = session(5000);
    let t = Instant::now();
    let e = message(Bootstrap::root_on(listener, &launches[0], short).unwrap_err());
    let addr = &launches[0].root;
    assert_eq!(
        e,
        format!(
            "rank 0: timed out after 300ms waiting for ranks [1, 2, 3, 4, 5, 6, 7, 8, ... (4999 ranks in all)] to \
             join root {addr}"
        )
    );
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    // In-process ranks too, before a thread starts.
    let setup = gdaki::channel::RankSetup::local(MAX_WORLD_SIZE + 1, gdaki::exec::ExecutorKind::Cpu);
    match gdaki::channel::run_ranks(&setup, |_| ()) {
        Err(Error::InvalidArgument(m)) => assert_eq!(m, "run_ranks with 65537 ranks: a session has at most 65536"),
        other => panic!("run_ranks over the limit: {:?}", other.map(|v| v.len())),
    }
}

#[test]
fn non_root_times_out_when_no_root_listens() {
    let (listener, launches) = session(2);
    drop(listener);
    let t = Instant::now();
    let e = message(Bootstrap::connect(&launches[1], Duration::from_millis(300)).unwrap_err());
    // Bounded (generously: the machine may be busy), not hanging.
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    let prefix = format!("rank 1: cannot reach the root at {} within 300ms: ", launches[1].root);
    assert!(e.starts_with(&prefix) && e.contains("refused"), "{e}");
}

#[test]
fn departed_peer_fails_calls_involving_it_and_nothing_else() {
    let timeout = Duration::from_secs(5);
    let results = run(3, timeout, |b| {
        b.barrier().unwrap();
        if b.rank() == 2 {
            b.send(1, 4, b"before leaving").unwrap();
            thread::sleep(Duration::from_millis(100));
            drop(b);
            return None;
        }
        let t = Instant::now();
        let queued = b.recv(2, 4);
        let pending = message(b.recv(2, 9).unwrap_err());
        let elapsed = t.elapsed();
        let send = message(b.send(2, 1, b"x").unwrap_err());
        // Rank 0 and rank 1 still talk.
        b.send(1 - b.rank(), 5, &[b.rank() as u8]).unwrap();
        let other = b.recv(1 - b.rank(), 5).unwrap();
        let collective = message(b.barrier().unwrap_err());
        Some((queued.ok(), pending, elapsed, send, other, collective, b.root().to_string()))
    });
    let root = results[0].clone().unwrap();
    let one = results[1].clone().unwrap();
    assert!(results[2].is_none());
    assert!(root.2 < timeout / 2 && one.2 < timeout / 2, "the departure was noticed after {:?}, {:?}", root.2, one.2);
    assert_eq!(root.0, None);
    assert_eq!(one.0, Some(b"before leaving".to_vec()));
    assert_eq!(root.1, "rank 0: recv from rank 2 tag 9: rank 2 left the session");
    let by_root = format!("rank 2 left the session (reported by the root at {})", one.6);
    assert_eq!(one.1, format!("rank 1: recv from rank 2 tag 9: {by_root}"));
    assert_eq!(root.3, "rank 0: send to rank 2 tag 1: rank 2 left the session");
    assert_eq!(one.3, format!("rank 1: send to rank 2 tag 1: {by_root}"));
    assert_eq!((root.4, one.4), (vec![1], vec![0]));
    assert_eq!(root.5, "rank 0: barrier (all_gather #1): rank 2 left the session");
    assert!(
        one.5.starts_with("rank 1: barrier (all_gather #1): rank 0: barrier (all_gather #1): rank 2 left the session"),
        "{}",
        one.5
    );
}

/// Joins a session as `rank` by hand (hello, then the welcome, which comes once every rank joined).
fn raw_rank(launch: &Launch) -> TcpStream {
    let mut raw = TcpStream::connect(&launch.root).unwrap();
    raw.write_all(&hello_frame(1, launch.secret.as_bytes(), launch.rank, launch.world_size)).unwrap();
    let mut welcome = [0u8; 16];
    raw.read_exact(&mut welcome).unwrap();
    let mut expect = vec![12, 0, 0, 0, 2, 0, 0, 0];
    expect.extend_from_slice(&launch.rank.to_le_bytes());
    expect.extend_from_slice(&launch.world_size.to_le_bytes());
    assert_eq!(welcome[..], expect[..], "Welcome {{ rank, world size }}");
    raw
}

#[test]
fn dead_peer_fails_pending_and_later_calls_naming_it() {
    let timeout = Duration::from_secs(5);
    let (listener, launches) = session(3);
    let launches = &launches;
    let root_addr = &launches[0].root;
    thread::scope(|s| {
        let ranks: Vec<_> = [Some(listener), None]
            .into_iter()
            .enumerate()
            .map(|(rank, listener)| {
                s.spawn(move || {
                    let b = match listener {
                        Some(l) => Bootstrap::root_on(l, &launches[0], timeout).unwrap(),
                        None => Bootstrap::connect(&launches[rank], timeout).unwrap(),
                    };
                    let t = Instant::now();
                    let pending = message(b.recv(2, 9).unwrap_err());
                    let elapsed = t.elapsed();
                    let later = message(b.barrier().unwrap_err());
                    let send = message(b.send(1 - b.rank(), 1, b"x").unwrap_err());
                    (pending, elapsed, later, send)
                })
            })
            .collect();
        // Rank 2 joins by hand, then its "process" dies: the connection ends without a goodbye.
        let raw = raw_rank(&launches[2]);
        thread::sleep(Duration::from_millis(100));
        drop(raw);
        let results: Vec<_> = ranks.into_iter().map(|h| h.join().unwrap()).collect();
        let died = "rank 2 closed its connection without leaving the session (did it die?)";
        let reported = format!("{died} (reported by the root at {root_addr})");
        for (rank, (pending, elapsed, later, send)) in results.into_iter().enumerate() {
            assert!(elapsed < timeout / 2, "rank {rank} noticed the death after {elapsed:?}");
            let why = if rank == 0 { died.to_string() } else { reported.clone() };
            assert_eq!(pending, format!("rank {rank}: recv from rank 2 tag 9: {why}"));
            assert_eq!(later, format!("rank {rank}: barrier (all_gather #0): {why}"));
            assert_eq!(send, format!("rank {rank}: send to rank {} tag 1: {why}", 1 - rank));
        }
    });
}

#[test]
fn root_leaving_fails_the_others_naming_rank_zero() {
    let timeout = Duration::from_secs(5);
    let results = run(3, timeout, |b| {
        b.send(1, 1, b"queued").unwrap();
        b.barrier().unwrap();
        if b.rank() == 0 {
            thread::sleep(Duration::from_millis(100));
            let root = b.root().to_string();
            drop(b);
            return root;
        }
        if b.rank() == 1 {
            // What arrived before the root left is still delivered.
            thread::sleep(Duration::from_millis(200));
            assert_eq!(b.recv(0, 1).unwrap(), b"queued");
            assert_eq!(b.recv(2, 1).unwrap(), b"queued");
        }
        let t = Instant::now();
        let e = message(b.recv(0, 1).unwrap_err());
        assert!(t.elapsed() < timeout / 2, "{:?}", t.elapsed());
        e
    });
    for r in 1..3 {
        assert_eq!(
            results[r],
            format!("rank {r}: recv from rank 0 tag 1: the root (rank 0) at {} left the session", results[0])
        );
    }
}

#[test]
fn dead_root_fails_the_others_naming_rank_zero() {
    // A hand-made root of a two-rank session that welcomes rank 1, then dies.
    let (listener, launches) = session(2);
    thread::scope(|s| {
        let one = s.spawn(|| {
            let b = Bootstrap::connect(&launches[1], TIMEOUT).unwrap();
            let t = Instant::now();
            let e = message(b.recv(0, 1).unwrap_err());
            assert!(t.elapsed() < TIMEOUT / 2, "{:?}", t.elapsed());
            e
        });
        let (mut conn, _) = listener.accept().unwrap();
        let mut hello = [0u8; 44];
        conn.read_exact(&mut hello).unwrap();
        assert_eq!(hello[..], hello_frame(1, launches[1].secret.as_bytes(), 1, 2)[..]);
        conn.write_all(&[12, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0]).unwrap();
        thread::sleep(Duration::from_millis(100));
        drop(conn);
        assert_eq!(
            one.join().unwrap(),
            format!(
                "rank 1: recv from rank 0 tag 1: the root (rank 0) at {} closed the connection without leaving the \
                 session (did it die?)",
                launches[0].root
            )
        );
    });
}

#[test]
fn messages_that_arrived_before_a_departure_are_still_delivered() {
    let got = run(2, TIMEOUT, |b| {
        if b.rank() == 1 {
            b.send(0, 3, b"last words").unwrap();
            b.barrier().unwrap();
            return None;
        }
        b.barrier().unwrap();
        // Rank 1 is gone (or going) by now; its message is here.
        thread::sleep(Duration::from_millis(100));
        let msg = b.recv(1, 3).unwrap();
        let e = message(b.recv(1, 3).unwrap_err());
        Some((msg, e))
    });
    let (msg, e) = got[0].clone().unwrap();
    assert_eq!(msg, b"last words");
    assert_eq!(e, "rank 0: recv from rank 1 tag 3: rank 1 left the session");
}

/// A rank that joined and gave up before the others came is taken again when it restarts, in place of its dead
/// connection instead of being rejected as a duplicate, whether it restarts before the last rank joins or after.
/// (Before, a restart after the last rank was never answered: the root welcomed the dead connection, and the
/// session broke.)
#[test]
fn rank_that_gave_up_may_join_again() {
    for restart_last in [false, true] {
        let (listener, launches) = session(3);
        let launches = &launches;
        thread::scope(|s| {
            let root =
                s.spawn(|| Bootstrap::root_on(listener, &launches[0], TIMEOUT).unwrap().all_gather(b"0").unwrap());
            // Rank 1 joins, waits 200 ms for rank 2, gives up and closes its connection.
            let e = message(Bootstrap::connect(&launches[1], Duration::from_millis(200)).unwrap_err());
            let root_addr = &launches[0].root;
            assert_eq!(
                e,
                format!(
                    "rank 1: the root at {root_addr} did not welcome this rank within 200ms (are all 3 ranks \
                     started?)"
                )
            );
            // The restart of rank 1 and rank 2, the second of them 100 ms after the first: the case's order
            // whenever the threads run then, but either order must work.
            let join = |rank: usize, late: bool| {
                s.spawn(move || {
                    if late {
                        thread::sleep(Duration::from_millis(100));
                    }
                    Bootstrap::connect(&launches[rank], TIMEOUT).unwrap().all_gather(format!("{rank}").as_bytes())
                })
            };
            let (one, two) = (join(1, restart_last), join(2, !restart_last));
            let expect = vec![b"0".to_vec(), b"1".to_vec(), b"2".to_vec()];
            let case = if restart_last { "restarted after rank 2 joined" } else { "restarted before rank 2 joined" };
            assert_eq!(one.join().unwrap().unwrap(), expect, "{case}");
            assert_eq!(two.join().unwrap().unwrap(), expect, "{case}");
            assert_eq!(root.join().unwrap(), expect, "{case}");
        });
    }
}

/// Joins a two-rank session as rank 1 by hand (hello, welcome), then writes `after` and returns the root's
/// error for a recv from rank 1.
fn root_error_after_raw_rank_sends(after: &[u8]) -> String {
    let (listener, launches) = session(2);
    thread::scope(|s| {
        let root = s.spawn(|| {
            let b = Bootstrap::root_on(listener, &launches[0], TIMEOUT).unwrap();
            let t = Instant::now();
            let e = message(b.recv(1, 0).unwrap_err());
            assert!(t.elapsed() < TIMEOUT / 2, "{:?}", t.elapsed());
            e
        });
        let mut raw = raw_rank(&launches[1]);
        raw.write_all(after).unwrap();
        let e = root.join().unwrap();
        drop(raw);
        e
    })
}

#[test]
fn bad_frames_after_the_handshake_break_the_session_naming_the_rank() {
    let unknown = root_error_after_raw_rank_sends(&[4, 0, 0, 0, 99, 0, 0, 0]);
    assert_eq!(unknown, "rank 0: recv from rank 1 tag 0: rank 1 sent a bad frame: unknown frame kind 99");
    let mut huge = u32::MAX.to_le_bytes().to_vec();
    huge.extend_from_slice(&6u32.to_le_bytes());
    let oversized = root_error_after_raw_rank_sends(&huge);
    assert_eq!(
        oversized,
        "rank 0: recv from rank 1 tag 0: rank 1 sent a bad frame: frame of 4294967295 bytes announced, over the \
         limit of 16777216 bytes (MAX_FRAME)"
    );
    // A P2p frame that claims to come from rank 0.
    let mut forged = 16u32.to_le_bytes().to_vec();
    forged.extend_from_slice(&6u32.to_le_bytes());
    forged.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    let e = root_error_after_raw_rank_sends(&forged);
    assert_eq!(e, "rank 0: recv from rank 1 tag 0: rank 1 broke the protocol: a message claims to come from rank 0");
}

// ---- a rank that stops in the middle of a frame (half-open connection) ----

/// What each real rank's call returned and how long after the stall began it returned.
type Outcome = (String, Duration);

/// A session of three: ranks 0 and 1 real, rank 2 joined by hand. Once all joined, rank 2 writes `partial` (the
/// start of a frame) and then nothing, keeping its connection open; 200 ms later ranks 0 and 1 run `call`.
/// Returns each real rank's error and when it came (from the stall's start), and the root's address.
fn stalled_rank_2(
    timeout: Duration,
    partial: &[u8],
    call: impl Fn(&Bootstrap) -> Error + Sync,
) -> (Vec<Outcome>, String) {
    let (listener, launches) = session(3);
    let launches = &launches;
    let (call, mut listener) = (&call, Some(listener));
    let outcomes = thread::scope(|s| {
        let (txs, ranks): (Vec<_>, Vec<_>) = (0..2)
            .map(|rank| {
                let (tx, rx) = mpsc::channel::<Instant>();
                let listener = if rank == 0 { listener.take() } else { None };
                let h = s.spawn(move || {
                    let b = match listener {
                        Some(l) => Bootstrap::root_on(l, &launches[0], timeout).unwrap(),
                        None => Bootstrap::connect(&launches[rank], timeout).unwrap(),
                    };
                    let stalled_at = rx.recv().unwrap();
                    thread::sleep(Duration::from_millis(200));
                    let e = message(call(&b));
                    (e, stalled_at.elapsed())
                });
                (tx, h)
            })
            .unzip();
        let mut raw = raw_rank(&launches[2]);
        let t = Instant::now();
        raw.write_all(partial).unwrap();
        for tx in txs {
            tx.send(t).unwrap();
        }
        let outcomes: Vec<_> = ranks.into_iter().map(|h| h.join().unwrap()).collect();
        drop(raw);
        outcomes
    });
    (outcomes, launches[0].root.clone())
}

/// Checks that each rank's error is `what` followed by rank 2's stall (`stall`, as the root saw it; the others
/// hear it from the root), and that it came within the bound: the timeout after the stall began, plus slack.
fn assert_named_rank_2(outcomes: &[Outcome], root: &str, what: &str, stall: &str, timeout: Duration) {
    for (rank, (e, after)) in outcomes.iter().enumerate() {
        let why = if rank == 0 { stall.to_string() } else { format!("{stall} (reported by the root at {root})") };
        assert_eq!(*e, format!("rank {rank}: {what}: {why}"));
        assert!(*after >= timeout && *after < timeout + Duration::from_secs(3), "rank {rank} gave up after {after:?}");
    }
}

/// The first `n` bytes of a frame of kind `kind` whose payload is `payload_len` bytes.
fn frame_start(kind: u32, payload_len: u32, n: usize) -> Vec<u8> {
    let mut f = (payload_len + 4).to_le_bytes().to_vec();
    f.extend_from_slice(&kind.to_le_bytes());
    f.resize(8 + payload_len as usize, 0xab);
    f.truncate(n);
    f
}

#[test]
fn rank_stalled_mid_frame_fails_every_ranks_all_gather_naming_it() {
    let timeout = Duration::from_secs(1);
    // A Gather (kind 4) of sequence number 0 and 4 bytes: 20 bytes in all, of which 9 come.
    let (outcomes, root) = stalled_rank_2(timeout, &frame_start(4, 12, 9), |b| b.all_gather(b"mine").unwrap_err());
    let stall = "rank 2 stalled mid-frame: sent 9 of the 20 bytes of a frame, and the rest did not come within 1s (a \
                 half-open connection?)";
    assert_named_rank_2(&outcomes, &root, "all_gather #0", stall, timeout);
}

#[test]
fn rank_stalled_mid_header_fails_every_ranks_barrier_naming_it() {
    let timeout = Duration::from_secs(1);
    let (outcomes, root) = stalled_rank_2(timeout, &frame_start(4, 8, 3), |b| b.barrier().unwrap_err());
    let stall = "rank 2 stalled mid-frame: sent 3 of the 8 bytes of a frame header, and the rest did not come within \
                 1s (a half-open connection?)";
    assert_named_rank_2(&outcomes, &root, "barrier (all_gather #0)", stall, timeout);
}

#[test]
fn rank_stalled_mid_message_fails_recv_and_later_sends_naming_it() {
    let timeout = Duration::from_secs(1);
    // A P2p (kind 6) from rank 2 to rank 1, tag 7, of 100 data bytes, cut after 30 of its 120 bytes.
    let mut start = frame_start(6, 112, 30);
    start[8..20].copy_from_slice(&[2, 0, 0, 0, 1, 0, 0, 0, 7, 0, 0, 0]);
    let (outcomes, root) = stalled_rank_2(timeout, &start, |b| {
        let e = b.recv(2, 7).unwrap_err();
        // Nothing works any more, and later calls say why.
        let later = message(b.send(1 - b.rank(), 1, b"x").unwrap_err());
        let stall = "rank 2 stalled mid-frame: sent 30 of the 120 bytes of a frame, and the rest did not come within \
                     1s (a half-open connection?)";
        let why =
            if b.rank() == 0 { stall.to_string() } else { format!("{stall} (reported by the root at {})", b.root()) };
        assert_eq!(later, format!("rank {}: send to rank {} tag 1: {why}", b.rank(), 1 - b.rank()));
        e
    });
    let stall = "rank 2 stalled mid-frame: sent 30 of the 120 bytes of a frame, and the rest did not come within 1s \
                 (a half-open connection?)";
    assert_named_rank_2(&outcomes, &root, "recv from rank 2 tag 7", stall, timeout);
}

#[test]
fn rank_trickling_a_frame_is_stalled_at_the_bound_however_slowly_bytes_come() {
    let timeout = Duration::from_secs(1);
    let (listener, launches) = session(2);
    thread::scope(|s| {
        let root = s.spawn(|| {
            let b = Bootstrap::root_on(listener, &launches[0], timeout).unwrap();
            // The frame begins before the recv does: the stall, not the recv's own timeout, ends it.
            thread::sleep(Duration::from_millis(200));
            message(b.recv(1, 0).unwrap_err())
        });
        let mut raw = raw_rank(&launches[1]);
        // A P2p frame of 112 bytes (120 with its length field): the header at once, then a byte every 100 ms.
        let frame = frame_start(6, 112, 120);
        // The clock starts before the header goes: read after it, the root (which may read the header at once, on
        // another core) could start its bound first and give up less than the bound after this reading.
        let t = Instant::now();
        raw.write_all(&frame[..8]).unwrap();
        let mut sent = 8;
        while !root.is_finished() && sent < frame.len() {
            thread::sleep(Duration::from_millis(100));
            if raw.write_all(&frame[sent..sent + 1]).is_err() {
                break;
            }
            sent += 1;
        }
        let e = root.join().unwrap();
        let elapsed = t.elapsed();
        assert!(elapsed >= timeout && elapsed < timeout + Duration::from_secs(1), "gave up after {elapsed:?}");
        let rest = e
            .strip_prefix("rank 0: recv from rank 1 tag 0: rank 1 stalled mid-frame: sent ")
            .and_then(|r| {
                r.strip_suffix(
                    " of the 120 bytes of a frame, and the rest did not come within 1s (a half-open connection?)",
                )
            })
            .unwrap_or_else(|| panic!("{e}"));
        let got: usize = rest.parse().unwrap();
        // About 10 bytes came in that second, more than the header; far fewer than the frame.
        assert!((9..=sent).contains(&got) && got < 30, "{got} of {sent}");
    });
}

#[test]
fn root_stalled_mid_frame_fails_the_other_rank_naming_it() {
    let timeout = Duration::from_millis(500);
    let (listener, launches) = session(2);
    thread::scope(|s| {
        let one = s.spawn(|| {
            let b = Bootstrap::connect(&launches[1], timeout).unwrap();
            // The stall's bound runs from when rank 1's reader meets the cut header, about when `connect` returns:
            // the recv begins half the bound later, so that it is pending when the stall is found and its own
            // timeout is half a bound away (from 100 ms later, a reader thread that started 100 ms late, as on a
            // loaded machine, put the stall past the recv's timeout).
            thread::sleep(timeout / 2);
            let t = Instant::now();
            let e = message(b.recv(0, 1).unwrap_err());
            (e, t.elapsed())
        });
        let (mut conn, _) = listener.accept().unwrap();
        let mut hello = [0u8; 44];
        conn.read_exact(&mut hello).unwrap();
        // The welcome, then 5 bytes of the next frame's 8-byte header, then silence with the connection open.
        conn.write_all(&[12, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 40, 0, 0, 0, 6]).unwrap();
        let (e, after) = one.join().unwrap();
        assert_eq!(
            e,
            format!(
                "rank 1: recv from rank 0 tag 1: the root (rank 0) at {} stalled mid-frame: sent 5 of the 8 bytes of \
                 a frame header, and the rest did not come within 500ms (a half-open connection?)",
                launches[0].root
            )
        );
        assert!(after < timeout, "{after:?}");
        drop(conn);
    });
}

/// A root that stops answering (a stopped process: its connection stays open and nothing arrives) fails rank 1's
/// collective once rank 1's timeout and grace have passed, and breaks rank 1's session: its later calls fail at
/// once, naming the root, and its departure watchers hear that every rank is lost, instead of each later call
/// waiting out the timeout again (a survivor of a SIGSTOPped root took two timeouts to end: one for the run's
/// exchange, one more for gathering its checks).
#[test]
fn a_silent_root_breaks_the_session_of_the_rank_that_timed_out_on_it() {
    let timeout = Duration::from_millis(400);
    let (listener, launches) = session(2);
    thread::scope(|s| {
        let one = s.spawn(|| {
            let b = Bootstrap::connect(&launches[1], timeout).unwrap();
            let heard = watch(&b);
            let t = Instant::now();
            let first = message(b.all_gather(b"x").unwrap_err());
            let took_first = t.elapsed();
            let t = Instant::now();
            let later = [
                message(b.barrier().unwrap_err()),
                message(b.all_gather(b"y").unwrap_err()),
                message(b.send(0, 1, b"z").unwrap_err()),
                message(b.recv(0, 1).unwrap_err()),
            ];
            let heard = heard.lock().unwrap().clone();
            (first, took_first, later, t.elapsed(), heard)
        });
        let (mut conn, _) = listener.accept().unwrap();
        let mut hello = [0u8; 44];
        conn.read_exact(&mut hello).unwrap();
        // The welcome (rank 1 of 2), then silence with the connection open.
        conn.write_all(&[12, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0]).unwrap();
        let (first, took_first, later, took_later, heard) = one.join().unwrap();
        let root = &launches[0].root;
        assert_eq!(
            first,
            format!("rank 1: all_gather #0: timed out after 400ms waiting for the root at {root} to gather every rank")
        );
        assert!(took_first >= timeout, "gave up after {took_first:?}");
        let why = format!(
            "the root (rank 0) at {root} gave no result of all_gather #0 within 400ms (is it stopped or hung?)"
        );
        assert_eq!(
            later,
            [
                format!("rank 1: barrier (all_gather #1): {why}"),
                format!("rank 1: all_gather #2: {why}"),
                format!("rank 1: send to rank 0 tag 1: {why}"),
                format!("rank 1: recv from rank 0 tag 1: {why}"),
            ]
        );
        assert!(took_later < timeout / 2, "the later calls took {took_later:?}");
        assert_eq!(heard, [None]);
        drop(conn);
    });
}

#[test]
fn silent_rank_in_all_gather_is_named_on_every_rank() {
    // Rank 2 joins and then says nothing at all (no frame begins): the root gives up at its timeout naming it,
    // and rank 1, which waits a little longer for the root's verdict, gets the same reason.
    let timeout = Duration::from_secs(1);
    let (listener, launches) = session(3);
    let launches = &launches;
    // Both begin the all-gather together: rank 1 waits a quarter of the timeout past its own start for the
    // root's verdict, which a rank 1 that began long before the root (a loaded machine) would miss.
    let start = &std::sync::Barrier::new(2);
    thread::scope(|s| {
        let ranks: Vec<_> = [Some(listener), None]
            .into_iter()
            .enumerate()
            .map(|(rank, listener)| {
                s.spawn(move || {
                    let b = match listener {
                        Some(l) => Bootstrap::root_on(l, &launches[0], timeout).unwrap(),
                        None => Bootstrap::connect(&launches[rank], timeout).unwrap(),
                    };
                    start.wait();
                    let t = Instant::now();
                    (message(b.all_gather(b"x").unwrap_err()), t.elapsed())
                })
            })
            .collect();
        let raw = raw_rank(&launches[2]);
        let got: Vec<_> = ranks.into_iter().map(|h| h.join().unwrap()).collect();
        drop(raw);
        let why = "rank 0: all_gather #0: timed out after 1s waiting for ranks [2]";
        assert_eq!(got[0].0, why);
        assert_eq!(got[1].0, format!("rank 1: all_gather #0: {why} (reported by the root at {})", launches[0].root));
        // The root waits its timeout; rank 1 (which may have begun a little before or after it) no longer than
        // that and its grace.
        assert!(got[0].1 >= timeout && got[0].1 < timeout + Duration::from_secs(2), "root after {:?}", got[0].1);
        assert!(got[1].1 < timeout + Duration::from_secs(2), "rank 1 after {:?}", got[1].1);
    });
}

/// `Duration::MAX` as "no bound" is no panic (it was: the deadline `Instant::now() + timeout` overflowed in
/// `root_on`, `connect`, `barrier` and `recv`). A world of one binds and dials nothing, so its part needs no
/// socket.
#[test]
fn a_timeout_of_duration_max_is_no_panic() {
    let quiet = |f: &mut dyn FnMut()| std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).is_ok();
    let mut panicked = Vec::new();
    let solo = Launch::solo(Secret::random().unwrap());
    if !quiet(&mut || drop(Bootstrap::connect(&solo, Duration::MAX))) {
        panicked.push("connect(solo, MAX)");
    }
    let mut b = Bootstrap::connect(&solo, TIMEOUT).unwrap();
    b.set_timeout(Duration::MAX);
    if !quiet(&mut || drop(b.barrier())) {
        panicked.push("solo: set_timeout(MAX) then barrier()");
    }
    b.send(0, 7, b"x").unwrap();
    if !quiet(&mut || drop(b.recv(0, 7))) {
        panicked.push("solo: set_timeout(MAX) then recv()");
    }
    let (listener, launches) = session(2);
    let (launches, mut listener) = (&launches, Some(listener));
    thread::scope(|s| {
        let one =
            s.spawn(move || std::panic::catch_unwind(|| drop(Bootstrap::connect(&launches[1], Duration::MAX))).is_ok());
        let l = listener.take().unwrap();
        if !quiet(&mut || drop(Bootstrap::root_on(l.try_clone().unwrap(), &launches[0], Duration::MAX))) {
            panicked.push("root_on(.., MAX)");
            // Let rank 1 finish: a real root with a finite timeout.
            drop(Bootstrap::root_on(l.try_clone().unwrap(), &launches[0], Duration::from_secs(3)));
        }
        if !one.join().unwrap() {
            panicked.push("connect(rank 1, MAX)");
        }
    });
    assert!(panicked.is_empty(), "panicked: {panicked:?}");
}

/// `connect` promises that "everything, waiting for the last rank included, takes at most `timeout`". A root that
/// sends its 16-byte welcome one byte every 0.6 s (each within a per-read timeout of the time left) kept a
/// joining rank 9.6 s with a timeout of 1 s; the welcome is now read against the deadline.
#[test]
fn connect_is_bounded_by_its_timeout_when_the_root_trickles_the_welcome() {
    let (listener, launches) = session(2);
    let launch = launches[1].clone();
    let timeout = Duration::from_secs(1);
    let fake_root = thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut hello = [0u8; 8 + 36];
        s.read_exact(&mut hello).unwrap();
        let mut welcome = vec![12, 0, 0, 0, 2, 0, 0, 0];
        welcome.extend_from_slice(&1u32.to_le_bytes());
        welcome.extend_from_slice(&2u32.to_le_bytes());
        for b in welcome {
            thread::sleep(Duration::from_millis(600));
            if s.write_all(&[b]).is_err() {
                return;
            }
        }
        thread::sleep(Duration::from_secs(5));
    });
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let t = Instant::now();
        let r = Bootstrap::connect(&launch, timeout).map(drop).map_err(message);
        let _ = tx.send((r, t.elapsed()));
    });
    match rx.recv_timeout(timeout * 3) {
        Ok((r, took)) => assert!(took < timeout * 3, "connect took {took:?} with a timeout of {timeout:?}: {r:?}"),
        Err(_) => panic!("connect with a timeout of {timeout:?} had not returned after {:?}", timeout * 3),
    }
    drop(fake_root);
}

/// A root that accepts a rank's connection and closes it before welcoming it (a root process that ended in the
/// handshake) is reported as that, in one line, not only as an address that may not be a gdaki root.
#[test]
fn a_root_that_closes_during_the_handshake_is_said_to_have_ended() {
    let (listener, launches) = session(2);
    let root = std::thread::spawn(move || {
        // Takes the whole hello before closing, so that the close is an orderly one (bytes left unread would
        // make it a reset, which the rank reports as such).
        let (mut stream, _) = listener.accept().unwrap();
        stream.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
        let mut buf = [0u8; 4096];
        while matches!(std::io::Read::read(&mut stream, &mut buf), Ok(n) if n > 0) {}
        drop(stream);
    });
    let m = message(Bootstrap::connect(&launches[1], TIMEOUT).unwrap_err());
    root.join().unwrap();
    assert!(m.contains("closed the connection during the handshake") && m.contains("its process ended"), "{m}");
    assert!(!m.contains('\n'), "one line: {m}");
}

/// What a bootstrap's `on_departure` watcher heard, in order.
type Heard = std::sync::Arc<std::sync::Mutex<Vec<Option<u32>>>>;

/// A watcher of `b`'s departures that records them.
fn watch(b: &Bootstrap) -> Heard {
    let heard = Heard::default();
    let h = heard.clone();
    b.on_departure(move |who| h.lock().unwrap().push(who));
    heard
}

/// What `on_departure` reports, on each rank, in a session of 3: a non-root rank's goodbye is that rank
/// (`Some(2)`), and so is the root's (`Some(0)`): the session breaks with it, but ranks 1 and 2 are still there
/// (their QPs still reach each other); a rank that dies breaks the session for every rank (`None`). A watcher
/// that comes after a departure hears of it at once, as the same value. Before, the root's goodbye was
/// reported as `None`, which marked every rank gone to the communicators of ranks 1 and 2.
#[test]
fn on_departure_reports_a_goodbye_as_its_rank_and_a_death_as_the_session_broken() {
    fn wait_for(heard: &Heard) {
        let t = Instant::now();
        while heard.lock().unwrap().is_empty() && t.elapsed() < TIMEOUT {
            thread::sleep(Duration::from_millis(1));
        }
        // Anything more would come at once.
        thread::sleep(Duration::from_millis(50));
    }
    for leaver in [2u32, 0] {
        let heard = run(3, TIMEOUT, |b| {
            let heard = watch(&b);
            b.barrier().unwrap();
            if b.rank() == leaver {
                drop(b);
                return None;
            }
            wait_for(&heard);
            let late = watch(&b);
            let (heard, late) = (heard.lock().unwrap().clone(), late.lock().unwrap().clone());
            // Rank 0 must not leave before rank 1 has heard (its goodbye would be a second departure).
            if leaver == 2 {
                b.send(1 - b.rank(), 1, b"heard").unwrap();
                b.recv(1 - b.rank(), 1).unwrap();
            }
            Some((heard, late))
        });
        for (rank, h) in heard.into_iter().enumerate() {
            let want = (rank as u32 != leaver).then(|| (vec![Some(leaver)], vec![Some(leaver)]));
            assert_eq!(h, want, "rank {leaver} left: what rank {rank} heard");
        }
    }
    // Rank 2 dies: ranks 0 and 1 hear that the session broke.
    let (listener, launches) = session(3);
    let (launches, both) = (&launches, &std::sync::Barrier::new(2));
    thread::scope(|s| {
        let ranks: Vec<_> = [Some(listener), None]
            .into_iter()
            .enumerate()
            .map(|(rank, listener)| {
                s.spawn(move || {
                    let b = match listener {
                        Some(l) => Bootstrap::root_on(l, &launches[0], TIMEOUT).unwrap(),
                        None => Bootstrap::connect(&launches[rank], TIMEOUT).unwrap(),
                    };
                    let heard = watch(&b);
                    wait_for(&heard);
                    let late = watch(&b);
                    let r = (heard.lock().unwrap().clone(), late.lock().unwrap().clone());
                    // Neither leaves before both have heard.
                    both.wait();
                    r
                })
            })
            .collect();
        let raw = raw_rank(&launches[2]);
        thread::sleep(Duration::from_millis(100));
        drop(raw);
        for (rank, h) in ranks.into_iter().enumerate() {
            assert_eq!(h.join().unwrap(), (vec![None], vec![None]), "rank 2 died: what rank {rank} heard");
        }
    });
}

/// `leave` is the drop's goodbye while the `Bootstrap` lives on: the others hear of the leaver at once (as
/// `Some(rank)`, a non-root's and the root's alike) and their calls that need it fail naming it; the leaver's own
/// calls fail at once with "rank N left the session" (not after the timeout), its watchers hear nothing of its
/// own leaving, and a second `leave` and the drop after it add nothing.
#[test]
fn leave_says_goodbye_while_the_bootstrap_lives_and_later_calls_fail_at_once() {
    for leaver in [2u32, 0] {
        let done = &std::sync::Barrier::new(3);
        let results = run(3, TIMEOUT, |b| {
            let heard = watch(&b);
            b.barrier().unwrap();
            let r = if b.rank() == leaver {
                b.leave();
                let t = Instant::now();
                let calls = [b.barrier().map_err(message), b.send(1, 7, b"late").map_err(message)];
                b.leave();
                let quick = t.elapsed() < Duration::from_secs(1);
                // Long enough for a report of its own leaving to come, were there one.
                thread::sleep(Duration::from_millis(100));
                let own = heard.lock().unwrap().clone();
                calls.iter().all(|c| c.as_ref().is_err_and(|m| m.contains(&format!("rank {leaver} left the session"))))
                    && quick
                    && own.is_empty()
            } else {
                let t = Instant::now();
                while heard.lock().unwrap().is_empty() && t.elapsed() < TIMEOUT {
                    thread::sleep(Duration::from_millis(1));
                }
                let seen = heard.lock().unwrap().clone() == vec![Some(leaver)] && t.elapsed() < Duration::from_secs(2);
                let recv = b.recv(leaver, 7).map_err(message);
                // The root's goodbye is reported as "the root (rank 0) at ADDRESS left the session".
                let named = |m: &String| m.contains(&format!("rank {leaver}")) && m.contains("left the session");
                seen && recv.is_err_and(|m| named(&m))
            };
            // The leaver's value lives until the others are done with theirs.
            done.wait();
            r
        });
        assert_eq!(results, vec![true; 3], "rank {leaver} left: what each rank saw");
    }
}

/// The root leaves while another of its threads waits in a collective: that collective fails at once, and the
/// others hear of rank 0's leaving alone, as from its goodbye, never of a broken session, which would count every
/// rank as lost (their port-channel waits for each other would end with `PeerGone`). The collective's failure
/// raced the goodbye with an abort to every rank; a rank that read the abort first heard `None`. Repeated, as
/// it was a race (a third of the rounds lost it).
#[test]
fn the_root_leaving_during_its_own_collective_is_heard_as_its_leaving_alone() {
    for round in 0..12 {
        let done = &std::sync::Barrier::new(5);
        let results = run(5, TIMEOUT, |b| {
            let heard = watch(&b);
            b.barrier().unwrap();
            let ok = if b.rank() == 0 {
                thread::scope(|s| {
                    // The others never join this all_gather: it waits until the leave.
                    let pending = s.spawn(|| b.all_gather(b"x").map_err(message));
                    thread::sleep(Duration::from_millis(30));
                    let t = Instant::now();
                    b.leave();
                    let r = pending.join().unwrap();
                    r.is_err_and(|m| m.contains("rank 0 left the session")) && t.elapsed() < Duration::from_secs(1)
                })
            } else {
                let t = Instant::now();
                while heard.lock().unwrap().is_empty() && t.elapsed() < TIMEOUT {
                    thread::sleep(Duration::from_millis(1));
                }
                true
            };
            // Every rank has heard something; time for a late report to come, were there one.
            done.wait();
            thread::sleep(Duration::from_millis(50));
            let heard = heard.lock().unwrap().clone();
            (ok, heard)
        });
        let want: Vec<_> = (0..5).map(|r| (true, if r == 0 { vec![] } else { vec![Some(0)] })).collect();
        assert_eq!(results, want, "round {round}: (call as expected, departures heard) by rank");
    }
}

/// Frame kinds of the bootstrap's wire, as the tests here write them by hand.
mod kind {
    pub const WELCOME: u32 = 2;
    pub const P2P: u32 = 6;
    pub const LEFT: u32 = 9;
}

/// One frame: its length (the kind and the payload), its kind, its payload.
fn raw_frame(kind: u32, payload: &[u8]) -> Vec<u8> {
    let mut f = ((payload.len() + 4) as u32).to_le_bytes().to_vec();
    f.extend_from_slice(&kind.to_le_bytes());
    f.extend_from_slice(payload);
    f
}

/// A root by hand for rank 1 of a world of 2, on a listener of its own: takes rank 1's hello, welcomes it, and
/// returns rank 1's launch and (once joined) the socket to it.
fn fake_root() -> (Launch, thread::JoinHandle<TcpStream>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let root = listener.local_addr().unwrap().to_string();
    let launch =
        Launch { rank: 1, world_size: 2, local_rank: 1, root, secret: Secret::random().unwrap(), source: "test" };
    let root = thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut hello = [0u8; 44];
        s.read_exact(&mut hello).unwrap();
        s.write_all(&raw_frame(kind::WELCOME, &[1u32.to_le_bytes(), 2u32.to_le_bytes()].concat())).unwrap();
        s
    });
    (launch, root)
}

#[test]
fn a_root_that_names_a_rank_outside_the_world_as_gone_breaks_the_session_and_names_no_one() {
    // A departure watcher is told only of ranks of the session (the communicator's writes one word per rank
    // with it): a root that says rank 0xdeadbeef (or the rank itself) left broke the protocol.
    for gone in [0xdead_beef_u32, 2, 1] {
        let (launch, root) = fake_root();
        let b = Bootstrap::connect(&launch, TIMEOUT).unwrap();
        let mut raw = root.join().unwrap();
        let heard = watch(&b);
        let mut left = gone.to_le_bytes().to_vec();
        left.extend_from_slice(b"rank left the session");
        raw.write_all(&raw_frame(kind::LEFT, &left)).unwrap();
        let t = Instant::now();
        let e = loop {
            match b.all_gather(b"x").map_err(message) {
                Err(e) if e.contains("left, to rank 1") => break e,
                _ if t.elapsed() > TIMEOUT => panic!("rank {gone}: the session did not break"),
                _ => thread::sleep(Duration::from_millis(10)),
            }
        };
        assert!(e.contains(&format!("rank {gone} left")), "{e}");
        let heard = heard.lock().unwrap().clone();
        assert!(heard.iter().all(|w| w.is_none()), "rank {gone}: watchers told of {heard:?}");
    }
}

#[test]
fn a_communicator_survives_a_root_that_names_a_rank_outside_the_world_as_gone() {
    // Under a communicator the watcher marks the rank's word in a one-page buffer: 8 x 0xdeadbeef bytes past it,
    // were the rank taken as it came.
    let (launch, root) = fake_root();
    let b = Bootstrap::connect(&launch, TIMEOUT).unwrap();
    let mut raw = root.join().unwrap();
    let comm =
        gdaki::channel::Communicator::new(b, gdaki::exec::Executor::Cpu, gdaki::nic::emu::WireConfig::loopback())
            .unwrap();
    let mut left = 0xdead_beefu32.to_le_bytes().to_vec();
    left.extend_from_slice(b"bye");
    raw.write_all(&raw_frame(kind::LEFT, &left)).unwrap();
    // Past the departure thread's grace (20 ms).
    thread::sleep(Duration::from_millis(300));
    drop(comm);
}

#[test]
fn a_timeout_the_clock_can_barely_hold_does_not_overflow_a_ranks_wait_for_the_roots_verdict() {
    // The largest whole number of seconds the clock can add to now: the rank's all_gather adds a grace to
    // its deadline for the root's verdict, which must not overflow.
    let now = Instant::now();
    let (mut lo, mut hi) = (0u64, u64::MAX);
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if now.checked_add(Duration::from_secs(mid)).is_some() {
            lo = mid
        } else {
            hi = mid - 1
        }
    }
    let got = run(2, TIMEOUT, |mut b| {
        if b.rank() == 1 {
            b.set_timeout(Duration::from_secs(lo));
        }
        b.all_gather(&[b.rank() as u8]).map_err(message)
    });
    assert_eq!(got, vec![Ok(vec![vec![0], vec![1]]); 2]);
}

#[test]
fn a_send_cut_off_by_its_timeout_shuts_the_connection_and_relays_nothing_it_did_not_send() {
    // World of 3: the root, rank 1 (a short timeout) and rank 2 by hand, which stops reading for a while (a
    // stopped process): the root's relay to it, and behind that rank 1's socket, stop moving, and a send of
    // rank 1 times out with part of its frame written. Its next frames must not be read as that frame's rest.
    const MSG: usize = 4 << 20;
    let (listener, launches) = session(3);
    let [l0, l1, l2] = <[Launch; 3]>::try_from(launches).unwrap();
    let (go, wait_go) = mpsc::channel::<()>();
    let (done, wait_done) = mpsc::channel::<()>();
    thread::scope(|s| {
        s.spawn(move || {
            let b = Bootstrap::root_on(listener, &l0, TIMEOUT).unwrap();
            let _ = wait_done.recv();
            drop(b);
        });
        let two = s.spawn(move || {
            let mut raw = TcpStream::connect(&l2.root).unwrap();
            raw.write_all(&hello_frame(1, l2.secret.as_bytes(), 2, 3)).unwrap();
            let mut welcome = [0u8; 16];
            raw.read_exact(&mut welcome).unwrap();
            wait_go.recv().unwrap();
            raw.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            // (tag, every byte is the tag) of each message relayed, until another frame or the end.
            let mut got = Vec::new();
            loop {
                let mut h = [0u8; 8];
                if raw.read_exact(&mut h).is_err() {
                    break;
                }
                let len = u32::from_le_bytes(h[0..4].try_into().unwrap()) as usize;
                let mut p = vec![0u8; len - 4];
                if raw.read_exact(&mut p).is_err() || u32::from_le_bytes(h[4..8].try_into().unwrap()) != kind::P2P {
                    break;
                }
                let tag = u32::from_le_bytes(p[8..12].try_into().unwrap());
                got.push((tag, p[12..].len() == MSG && p[12..].iter().all(|&b| b == tag as u8)));
            }
            got
        });
        let mut one = Bootstrap::connect(&l1, TIMEOUT).unwrap();
        one.set_timeout(Duration::from_millis(300));
        let cut_off =
            (1..40u32).find_map(|tag| one.send(2, tag, &vec![tag as u8; MSG]).err().map(|e| (tag, message(e))));
        go.send(()).unwrap();
        thread::sleep(Duration::from_millis(200));
        let cut = cut_off.as_ref().map_or(40, |c| c.0);
        let later: Vec<bool> = (cut + 1..cut + 3).map(|tag| one.send(2, tag, &vec![tag as u8; MSG]).is_ok()).collect();
        drop(one);
        let got = two.join().unwrap();
        done.send(()).unwrap();
        let (cut, e) = cut_off.expect("a send timed out");
        assert!(e.contains("timed out writing"), "{e}");
        assert_eq!(later, [false, false], "sends after the cut-off one went out");
        assert!(!got.is_empty() && got.iter().all(|&(tag, whole)| whole && tag < cut), "relayed (tag, whole): {got:?}");
    });
}
