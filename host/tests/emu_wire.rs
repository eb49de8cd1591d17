//! The wire: QPs on two emulated NICs (as in two processes) connected over loopback TCP. RDMA WRITE (with
//! immediate), READ and atomics land where the direct path puts them; responder-side violations come back as
//! NAKs with the PRM syndrome; a lost or silent peer fails outstanding WQEs with 0x15 and flushes the rest.

mod emu_util;

use std::sync::Arc;
use std::time::{Duration, Instant};

use emu_util::*;
use gdaki::mem::MemKind;
use gdaki::nic::emu::{Access, EmuConfig, EmuNic, Endpoint, Pd, QpState, SimGpu, WireConfig};
use gdaki_shared::prm::opcode::{self, syndrome};
use gdaki_shared::prm::wqe::AtomicSeg;
use rand::RngExt;

#[test]
fn write_read_atomic_and_immediate_across_the_wire() {
    let mut rng = rng();
    let p = WirePair::new(Duration::from_secs(10));
    let (mut sq, mut cq, mut peer_cq) = (Sq::new(&p.a), CqPoll::new(&p.cq_a), CqPoll::new(&p.cq_b));
    let n = 700_000; // several packets
    let src = GuardedBuf::new(n, 0);
    let dst = GuardedBuf::new(n, 0xee);
    let back = GuardedBuf::new(n, 0x11);
    let sem = GuardedBuf::new(64, 0);
    let (lmr, bmr) =
        (src.register(&p.nic_a, &p.pd_a, Access::NONE), back.register(&p.nic_a, &p.pd_a, Access::LOCAL_WRITE));
    let (rmr, smr) = (dst.register(&p.nic_b, &p.pd_b, Access::ALL), sem.register(&p.nic_b, &p.pd_b, Access::ALL));
    let data = random_bytes(&mut rng, n);
    src.write(0, &data);
    for len in [1usize, 64, 4097, 300_000, n - 3] {
        dst.fill(0xee);
        let at = sq.post(&sq.write(SIGNALED, (lmr.lkey(), src.addr(), len as u32), dst.addr() + 3, rmr.rkey()));
        assert_req(&cq.wait(), opcode::RDMA_WRITE, sq.qpn(), at, 0);
        let got = dst.read();
        assert_eq!(&got[3..3 + len], &data[..len], "{len} bytes placed");
        assert!(got[..3].iter().chain(&got[3 + len..]).all(|&b| b == 0xee));
    }
    // READ them back.
    let at = sq.post(&sq.read(SIGNALED, (bmr.lkey(), back.addr(), (n - 3) as u32), dst.addr() + 3, rmr.rkey()));
    assert_req(&cq.wait(), opcode::RDMA_READ, sq.qpn(), at, (n - 3) as u32);
    assert_eq!(&back.read()[..n - 3], &data[..n - 3]);
    // Fetch-add and compare-swap, results in host order.
    for k in 0..5u64 {
        let add = rng.random::<u32>() as u64;
        let before = sem.u64_at(0);
        let at = sq.post(&sq.atomic(
            opcode::ATOMIC_FA,
            SIGNALED,
            AtomicSeg::fetch_add(add),
            (bmr.lkey(), back.addr()),
            sem.addr(),
            smr.rkey(),
        ));
        assert_req(&cq.wait(), opcode::ATOMIC_FA, sq.qpn(), at, 8);
        assert_eq!(back.u64_at(0), before, "old value #{k}");
        assert_eq!(sem.u64_at(0), before.wrapping_add(add));
    }
    // WRITE with immediate: data, then the responder's CQE.
    let imm = rng.random::<u32>();
    let mut wqe = sq.write(SIGNALED, (lmr.lkey(), src.addr(), 100), dst.addr(), rmr.rkey());
    wqe[0] = sq.ctrl(opcode::RDMA_WRITE_IMM, SIGNALED, 3, imm);
    let at = sq.post(&wqe);
    assert_req(&cq.wait(), opcode::RDMA_WRITE_IMM, sq.qpn(), at, 0);
    let r = peer_cq.wait();
    assert_eq!(
        (r.opcode(), r.imm_inval_pkey.get(), r.byte_cnt.get(), r.qpn()),
        (opcode::cqe::RESP_WR_IMM, imm, 100, p.b.qpn())
    );
    assert!(src.guards_intact() && dst.guards_intact() && back.guards_intact() && sem.guards_intact());
}

#[test]
fn bad_rkey_is_a_nak_with_remote_access_error_and_later_wqes_flush() {
    let p = WirePair::new(Duration::from_secs(10));
    let (mut sq, mut cq) = (Sq::new(&p.a), CqPoll::new(&p.cq_a));
    let src = GuardedBuf::new(256, 0x5a);
    let dst = GuardedBuf::new(256, 0xc3);
    let lmr = src.register(&p.nic_a, &p.pd_a, Access::NONE);
    let rmr = dst.register(&p.nic_b, &p.pd_b, Access::ALL);
    let ok = sq.post(&sq.write(SIGNALED, (lmr.lkey(), src.addr(), 64), dst.addr(), rmr.rkey()));
    let bad = sq.put(&sq.write(0, (lmr.lkey(), src.addr(), 64), dst.addr() + 64, rmr.rkey() ^ 0x100));
    let later = sq.put(&sq.write(SIGNALED, (lmr.lkey(), src.addr(), 64), dst.addr() + 128, rmr.rkey()));
    sq.dbrec();
    sq.doorbell(later);
    assert_req(&cq.wait(), opcode::RDMA_WRITE, sq.qpn(), ok, 0);
    assert_err(&cq.wait(), syndrome::REMOTE_ACCESS_ERR, opcode::RDMA_WRITE, sq.qpn(), bad);
    assert_err(&cq.wait(), syndrome::WR_FLUSH_ERR, opcode::RDMA_WRITE, sq.qpn(), later);
    assert_eq!(p.a.state(), QpState::Error);
    let got = dst.read();
    assert!(got[..64].iter().all(|&b| b == 0x5a) && got[64..].iter().all(|&b| b == 0xc3));
}

#[test]
fn dropped_peer_fails_outstanding_with_retry_exceeded() {
    let p = WirePair::new(Duration::from_secs(10));
    let WirePair { a, b, cq_a, nic_a, pd_a, .. } = p;
    let (mut sq, mut cq) = (Sq::new(&a), CqPoll::new(&cq_a));
    let src = GuardedBuf::new(64, 1);
    let lmr = src.register(&nic_a, &pd_a, Access::NONE);
    // A zero-byte WRITE's round trip first, so that the connection is up: a peer that vanishes before it comes up is
    // only noticed after the retry timeout (see `unreachable_peer_fails_after_the_retry_timeout`).
    let at = sq.post_bytes(&sq.inline_write(opcode::RDMA_WRITE, SIGNALED, &[], 0, 0, 0));
    assert_req(&cq.wait(), opcode::RDMA_WRITE, sq.qpn(), at, 0);
    drop(b);
    // Idle when the peer went: the QP stays in RTS until it sends again.
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(a.state(), QpState::Rts);
    let t = Instant::now();
    let at = sq.post(&sq.write(SIGNALED, (lmr.lkey(), src.addr(), 64), 0x1000, 0x1234));
    assert_err(&cq.wait(), syndrome::TRANSPORT_RETRY_EXC_ERR, opcode::RDMA_WRITE, sq.qpn(), at);
    assert!(t.elapsed() < Duration::from_secs(5), "noticed at once, not after the retry timeout");
    assert_eq!(a.state(), QpState::Error);
}

#[test]
fn unreachable_peer_fails_after_the_retry_timeout() {
    let nic = EmuNic::open(wired(Duration::from_millis(300))).unwrap();
    let (pd, cq) = (nic.alloc_pd().unwrap(), nic.create_cq(64).unwrap());
    let qp = nic.create_qp(&pd, &cq, 64).unwrap();
    // A port nobody listens on: bind one, then close it.
    let addr = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    // A larger NIC id than ours would make the peer the dialer; make ours smaller so that we dial.
    let ghost = Endpoint { nic: u64::MAX, qpn: 0x100, psn: 0, wire: Some(addr) };
    qp.connect(&ghost).unwrap();
    let (mut sq, mut cqp) = (Sq::new(&qp), CqPoll::new(&cq));
    let src = GuardedBuf::new(64, 1);
    let lmr = src.register(&nic, &pd, Access::NONE);
    let t = Instant::now();
    let at = sq.post(&sq.write(SIGNALED, (lmr.lkey(), src.addr(), 64), 0x1000, 0x1234));
    assert_err(&cqp.wait(), syndrome::TRANSPORT_RETRY_EXC_ERR, opcode::RDMA_WRITE, sq.qpn(), at);
    let waited = t.elapsed();
    assert!(waited >= Duration::from_millis(250) && waited < Duration::from_secs(5), "failed after {waited:?}");
    // The error names why the dialer's last attempt failed (here the connect's own error), not only the timeout.
    let e = qp.wire_error().expect("the link's error");
    assert!(
        e.starts_with("no connection to peer QP 0x100 at ")
            && e.contains(&format!("within 300ms (the last try: connecting to {addr}: ")),
        "{e}"
    );
}

#[test]
fn zero_length_read_checks_no_key_and_completes() {
    let wired = WirePair::new(Duration::from_secs(10));
    let direct = Pair::new(64, 64);
    for (qp, cq) in [(&wired.a, &wired.cq_a), (&direct.a, &direct.cq_a)] {
        let (mut sq, mut cqp) = (Sq::new(qp), CqPoll::new(cq));
        // ctrl + raddr only (ds 2): how rdma-core posts a READ of zero bytes; rkey 0 names no MR.
        let mut segs = sq.read(SIGNALED, (0, 0, 0), 0, 0).to_vec();
        segs.truncate(2);
        segs[0] = sq.ctrl(opcode::RDMA_READ, SIGNALED, 2, 0);
        let at = sq.post(&segs);
        assert_req(&cqp.wait(), opcode::RDMA_READ, sq.qpn(), at, 0);
        assert_eq!(qp.state(), QpState::Rts);
    }
}

/// Both NICs stream large WRITEs and READs to each other at once, each far more than both sockets' buffers
/// hold, through inbound queues of 64 KiB (a few frames), so that each side's readers keep waiting for room
/// while its peer has bytes to send. Had an executor waited on its socket while its own readers waited on it,
/// the two would block each other until the retry timeout (0x15). Everything completes, every byte in place,
/// and neither queue ever held more than its bound (and one frame: an empty queue always takes one).
#[test]
fn large_writes_and_reads_both_ways_at_once_complete_with_bounded_queues() {
    let mut rng = rng();
    let inbound = 64 << 10;
    let cfg = || {
        EmuConfig::host_or_env().unwrap().with_wire(WireConfig {
            retry_timeout: Duration::from_secs(20),
            inbound_bytes: inbound,
            ..WireConfig::loopback()
        })
    };
    let p = WirePair::with(cfg(), cfg());
    let n = 32 << 20;
    let side = |nic: &Arc<EmuNic>, pd: &Pd, rng: &mut rand::rngs::SmallRng| {
        // Random 64 KiB blocks, each stamped with its number, so that a misplaced block shows.
        let block = random_bytes(rng, 64 << 10);
        let mut data = Vec::with_capacity(n);
        for i in 0..n / block.len() {
            data.extend_from_slice(&block);
            let at = data.len() - block.len();
            data[at..at + 8].copy_from_slice(&(i as u64).to_le_bytes());
        }
        let mine = GuardedBuf::new(n, 0);
        mine.copy_in(&data);
        let (written, read_back) = (GuardedBuf::new(n, 0), GuardedBuf::new(n, 0));
        let mrs = (
            mine.register(nic, pd, Access::ALL),
            written.register(nic, pd, Access::ALL),
            read_back.register(nic, pd, Access::LOCAL_WRITE),
        );
        (data, mine, written, read_back, mrs)
    };
    let (data_a, mine_a, written_a, back_a, mrs_a) = side(&p.nic_a, &p.pd_a, &mut rng);
    let (data_b, mine_b, written_b, back_b, mrs_b) = side(&p.nic_b, &p.pd_b, &mut rng);
    let (mut sq_a, mut sq_b) = (Sq::new(&p.a), Sq::new(&p.b));
    // Each side: WRITE its data into the other's `written`, then READ the other's data into `read_back`.
    type Local<'a> = (&'a GuardedBuf, u32);
    let post = |sq: &mut Sq, mine: Local, back: Local, peer_w: (u64, u32), peer_r: (u64, u32)| {
        let w = sq.put(&sq.write(SIGNALED, (mine.1, mine.0.addr(), n as u32), peer_w.0, peer_w.1));
        let r = sq.put(&sq.read(SIGNALED, (back.1, back.0.addr(), n as u32), peer_r.0, peer_r.1));
        sq.dbrec();
        (w, r)
    };
    let (wa, ra) = post(
        &mut sq_a,
        (&mine_a, mrs_a.0.lkey()),
        (&back_a, mrs_a.2.lkey()),
        (written_b.addr(), mrs_b.1.rkey()),
        (mine_b.addr(), mrs_b.0.rkey()),
    );
    let (wb, rb) = post(
        &mut sq_b,
        (&mine_b, mrs_b.0.lkey()),
        (&back_b, mrs_b.2.lkey()),
        (written_a.addr(), mrs_a.1.rkey()),
        (mine_a.addr(), mrs_a.0.rkey()),
    );
    let t = Instant::now();
    sq_a.doorbell(ra);
    sq_b.doorbell(rb);
    let (mut cq_a, mut cq_b) = (CqPoll::new(&p.cq_a), CqPoll::new(&p.cq_b));
    assert_req(&cq_a.wait(), opcode::RDMA_WRITE, sq_a.qpn(), wa, 0);
    assert_req(&cq_b.wait(), opcode::RDMA_WRITE, sq_b.qpn(), wb, 0);
    assert_req(&cq_a.wait(), opcode::RDMA_READ, sq_a.qpn(), ra, n as u32);
    assert_req(&cq_b.wait(), opcode::RDMA_READ, sq_b.qpn(), rb, n as u32);
    eprintln!("4 × {} MiB across the wire, both ways at once: {:?}", n >> 20, t.elapsed());
    assert!(written_b.copy_out() == data_a && back_a.copy_out() == data_b, "a's WRITE or READ");
    assert!(written_a.copy_out() == data_b && back_b.copy_out() == data_a, "b's WRITE or READ");
    // As the NIC counts a frame: its length plus 64; the largest is a header and 256 KiB.
    let one_frame = (40 + (256 << 10) + 64) as u64;
    for (name, nic) in [("a", &p.nic_a), ("b", &p.nic_b)] {
        let st = nic.stats();
        eprintln!("NIC {name}: inbound peak {} bytes, {} waits for room", st.inbound_peak, st.inbound_waits);
        assert!(st.inbound_peak <= one_frame.max(inbound as u64), "NIC {name}: {st:?}");
        assert!(st.inbound_waits > 0, "NIC {name}'s readers never waited: nothing was tested ({st:?})");
        assert_eq!(st.inbound_queued, 0, "NIC {name}");
    }
    for b in [&mine_a, &written_a, &back_a, &mine_b, &written_b, &back_b] {
        assert!(b.guards_intact());
    }
    drop((mrs_a, mrs_b));
}

/// A wire pair whose NICs reach "GPU memory" through a simulated copier (the `gpu` executor's path; the
/// copier of `GDAKI_QUEUES=gpu` when set, else one of its own), so that the responder's waits on the copier
/// show in [`gdaki::nic::emu::Stats::host_syncs`].
fn gpu_wire_pair() -> WirePair {
    let cfg = || {
        let mut c = wired(Duration::from_secs(10));
        if c.gpu.is_none() {
            c.gpu = Some(Arc::new(SimGpu::new().unwrap()));
        }
        c
    };
    WirePair::with(cfg(), cfg())
}

#[test]
fn fetch_adds_into_gpu_memory_return_exact_prefix_sums_with_one_wait_per_batch() {
    const N: usize = 64;
    const WORDS: usize = 4;
    let mut rng = rng();
    let p = gpu_wire_pair();
    let (mut sq, mut cq) = (Sq::new(&p.a), CqPoll::new(&p.cq_a));
    let target = GuardedBuf::new(WORDS * 8, 0);
    let back = GuardedBuf::new(N * 8, 0x5a);
    let start: Vec<u64> = (0..WORDS).map(|_| rng.random::<u64>()).collect();
    for (w, v) in start.iter().enumerate() {
        target.write(w * 8, &v.to_ne_bytes());
    }
    let tmr = target.register_as(MemKind::Gpu, &p.nic_b, &p.pd_b, Access::ALL);
    let bmr = back.register(&p.nic_a, &p.pd_a, Access::LOCAL_WRITE);
    // Random addends into random words, each word's old values the prefix sums of its addends.
    let ops: Vec<(usize, u64)> = (0..N).map(|_| (rng.random_range(0..WORDS), rng.random::<u64>())).collect();
    let mut sums = start.clone();
    let expected: Vec<u64> = ops
        .iter()
        .map(|&(w, add)| {
            let old = sums[w];
            sums[w] = old.wrapping_add(add);
            old
        })
        .collect();
    let before = (p.nic_a.stats().host_syncs, p.nic_b.stats().host_syncs);
    let mut last = 0;
    for (i, &(w, add)) in ops.iter().enumerate() {
        last = sq.put(&sq.atomic(
            opcode::ATOMIC_FA,
            SIGNALED,
            AtomicSeg::fetch_add(add),
            (bmr.lkey(), back.addr() + 8 * i as u64),
            target.addr() + 8 * w as u64,
            tmr.rkey(),
        ));
    }
    sq.dbrec();
    sq.doorbell(last);
    for i in 0..N {
        assert_req(&cq.wait(), opcode::ATOMIC_FA, sq.qpn(), i as u64, 8);
    }
    for (i, want) in expected.iter().enumerate() {
        assert_eq!(back.u64_at(8 * i), *want, "old value of fetch-add #{i} (word {})", ops[i].0);
    }
    for (w, total) in sums.iter().enumerate() {
        assert_eq!(target.u64_at(8 * w), *total, "word {w}: start plus every addend");
    }
    // The executors publish their tallies after a pass that did work: let the last passes end (waiting less
    // would only make the counts smaller).
    std::thread::sleep(Duration::from_millis(50));
    let (a, b) = (p.nic_a.stats().host_syncs - before.0, p.nic_b.stats().host_syncs - before.1);
    eprintln!("{N} fetch-adds over the wire into GPU memory: responder {b} host syncs, requester {a}");
    // One wait per batch of requests the responder's thread takes together (one here, as a rule; the bound
    // leaves room for batches taken in pieces), where it used to wait once per atomic (N). The requester
    // waits for none of the responses (each used to cost one with its CQ in GPU memory).
    assert!(b <= (N / 4) as u64, "responder: {b} host syncs for {N} atomics");
    assert!(a <= (N / 4) as u64, "requester: {a} host syncs for {N} atomic responses");
    assert!(target.guards_intact() && back.guards_intact());
    drop((tmr, bmr));
}

#[test]
fn a_batch_of_writes_into_gpu_memory_is_acknowledged_with_one_wait_per_batch_and_reads_back() {
    const N: usize = 64;
    const SLOT: usize = 512;
    let mut rng = rng();
    let p = gpu_wire_pair();
    let (mut sq, mut cq) = (Sq::new(&p.a), CqPoll::new(&p.cq_a));
    let src = GuardedBuf::new(N * SLOT, 0);
    let dst = GuardedBuf::new(N * SLOT, 0xee);
    let back = GuardedBuf::new(N * SLOT, 0x11);
    let data = random_bytes(&mut rng, N * SLOT);
    src.write(0, &data);
    let lmr = src.register(&p.nic_a, &p.pd_a, Access::NONE);
    let bmr = back.register(&p.nic_a, &p.pd_a, Access::LOCAL_WRITE);
    let rmr = dst.register_as(MemKind::Gpu, &p.nic_b, &p.pd_b, Access::ALL);
    // WRITE i puts 1..=SLOT bytes at the start of slot i; the rest of the slot keeps its fill.
    let lens: Vec<usize> = (0..N).map(|_| rng.random_range(1..=SLOT)).collect();
    let mut want = vec![0xeeu8; N * SLOT];
    for (i, &len) in lens.iter().enumerate() {
        want[i * SLOT..i * SLOT + len].copy_from_slice(&data[i * SLOT..i * SLOT + len]);
    }
    let before = p.nic_b.stats().host_syncs;
    let mut last = 0;
    for (i, &len) in lens.iter().enumerate() {
        let off = (i * SLOT) as u64;
        last = sq.put(&sq.write(SIGNALED, (lmr.lkey(), src.addr() + off, len as u32), dst.addr() + off, rmr.rkey()));
    }
    sq.dbrec();
    sq.doorbell(last);
    for i in 0..N {
        assert_req(&cq.wait(), opcode::RDMA_WRITE, sq.qpn(), i as u64, 0);
    }
    std::thread::sleep(Duration::from_millis(50));
    let syncs = p.nic_b.stats().host_syncs - before;
    // One wait per batch, before its cumulative ACK, where it used to wait once per WRITE (N).
    eprintln!("{N} WRITEs over the wire into GPU memory: responder {syncs} host syncs");
    assert!(syncs <= (N / 4) as u64, "responder: {syncs} host syncs for {N} WRITEs");
    // Every ACKed byte is placed: READ the whole range back (one READ per 4 slots) and compare.
    let mut last = 0;
    for k in 0..N / 4 {
        let off = (k * 4 * SLOT) as u64;
        let r = sq.read(SIGNALED, (bmr.lkey(), back.addr() + off, 4 * SLOT as u32), dst.addr() + off, rmr.rkey());
        last = sq.put(&r);
    }
    sq.dbrec();
    sq.doorbell(last);
    for k in 0..N / 4 {
        assert_req(&cq.wait(), opcode::RDMA_READ, sq.qpn(), (N + k) as u64, 4 * SLOT as u32);
    }
    let got = back.copy_out();
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g, w, "byte {i} (slot {}, {} bytes written there)", i / SLOT, lens[i / SLOT]);
    }
    assert_eq!(dst.copy_out(), want);
    assert!(src.guards_intact() && dst.guards_intact() && back.guards_intact());
    drop((lmr, bmr, rmr));
}

/// A requester may post as soon as its own QP is in RTS, before the responder's QP has reached RTR (the two
/// ranks of a connect move their QPs one after the other): on hardware the requests go unanswered until then
/// and are sent again after the ACK timeout, so they land once the responder is ready, within the retry count.
/// Across the wire, and on one NIC's direct path, they land in order once the responder's QP is in RTR, and
/// complete without error.
#[test]
fn requests_posted_before_the_responder_is_ready_land_once_it_is() {
    let wire =
        (EmuNic::open(wired(Duration::from_secs(10))).unwrap(), EmuNic::open(wired(Duration::from_secs(10))).unwrap());
    let one = EmuNic::open(wired(Duration::from_secs(10))).unwrap();
    for (what, nic_a, nic_b) in [("wire", &wire.0, &wire.1), ("direct", &one, &one)] {
        let mut rng = rng();
        let (pd_a, pd_b) = (nic_a.alloc_pd().unwrap(), nic_b.alloc_pd().unwrap());
        let (cq_a, cq_b) = (nic_a.create_cq(64).unwrap(), nic_b.create_cq(64).unwrap());
        let a = nic_a.create_qp(&pd_a, &cq_a, 64).unwrap();
        let b = nic_b.create_qp(&pd_b, &cq_b, 64).unwrap();
        let (ea, eb) = (a.endpoint(), b.endpoint());
        a.connect(&eb).unwrap();
        let (mut sq, mut cq) = (Sq::new(&a), CqPoll::new(&cq_a));
        let n = 4096;
        let src = GuardedBuf::new(n, 0);
        let dst = GuardedBuf::new(n, 0xee);
        let lmr = src.register(nic_a, &pd_a, Access::NONE);
        let rmr = dst.register(nic_b, &pd_b, Access::ALL);
        let data = random_bytes(&mut rng, n);
        src.write(0, &data);
        let first = sq.post(&sq.write(SIGNALED, (lmr.lkey(), src.addr(), 1024), dst.addr(), rmr.rkey()));
        let rest = (lmr.lkey(), src.addr() + 1024, (n - 1024) as u32);
        let second = sq.post(&sq.write(SIGNALED, rest, dst.addr() + 1024, rmr.rkey()));
        std::thread::sleep(Duration::from_millis(200));
        b.connect(&ea).unwrap();
        let (c1, c2) = (cq.wait(), cq.wait());
        assert_req(&c1, opcode::RDMA_WRITE, sq.qpn(), first, 0);
        assert_req(&c2, opcode::RDMA_WRITE, sq.qpn(), second, 0);
        assert_eq!(dst.read(), data, "{what}");
        assert!(src.guards_intact() && dst.guards_intact());
    }
}

/// On one NIC's direct path, a request waiting for its responder to reach RTR stops waiting as soon as it never
/// will, not at the retry timeout (10 s here): the responder connects to another QP, or is destroyed (0x15 at once,
/// nothing placed); or the requester is moved to ERR (its waiting WQEs are flushed, each once, and nothing is
/// placed when the responder connects back later).
#[test]
fn a_request_waiting_for_its_responder_ends_at_once_when_it_never_will() {
    use gdaki::nic::devx::{self, EmuObj};
    for case in ["connected elsewhere", "destroyed", "requester to ERR"] {
        let nic = EmuNic::open(wired(Duration::from_secs(10))).unwrap();
        let pd = nic.alloc_pd().unwrap();
        let cq = nic.create_cq(64).unwrap();
        let qp = || nic.create_qp(&pd, &cq, 64).unwrap();
        let (a, b, c) = (qp(), qp(), qp());
        a.connect(&b.endpoint()).unwrap();
        let (mut sq, mut cqp) = (Sq::new(&a), CqPoll::new(&cq));
        let (src, dst) = (GuardedBuf::new(64, 1), GuardedBuf::new(64, 0xee));
        let (lmr, rmr) = (src.register(&nic, &pd, Access::NONE), dst.register(&nic, &pd, Access::ALL));
        let first = sq.post(&sq.write(SIGNALED, (lmr.lkey(), src.addr(), 64), dst.addr(), rmr.rkey()));
        let second = sq.post(&sq.write(SIGNALED, (lmr.lkey(), src.addr(), 64), dst.addr(), rmr.rkey()));
        // Both wait.
        cqp.assert_none_for(Duration::from_millis(100));
        let t = Instant::now();
        let b = match case {
            "connected elsewhere" => {
                b.connect(&c.endpoint()).unwrap();
                Some(b)
            }
            "destroyed" => {
                drop(b);
                None
            }
            _ => {
                devx::to_err(&*nic, &EmuObj::Qp(a.qpn()), a.qpn()).unwrap();
                Some(b)
            }
        };
        if case == "requester to ERR" {
            assert_err(&cqp.wait(), syndrome::WR_FLUSH_ERR, opcode::RDMA_WRITE, sq.qpn(), first);
            assert_err(&cqp.wait(), syndrome::WR_FLUSH_ERR, opcode::RDMA_WRITE, sq.qpn(), second);
            b.unwrap().connect(&a.endpoint()).unwrap();
        } else {
            assert_err(&cqp.wait(), syndrome::TRANSPORT_RETRY_EXC_ERR, opcode::RDMA_WRITE, sq.qpn(), first);
            assert_err(&cqp.wait(), syndrome::WR_FLUSH_ERR, opcode::RDMA_WRITE, sq.qpn(), second);
        }
        let ended = t.elapsed();
        cqp.assert_none_for(Duration::from_millis(100));
        assert!(ended < Duration::from_secs(1), "{case}: the wait ended after {ended:?}");
        assert_eq!(a.state(), QpState::Error, "{case}");
        assert!(dst.read().iter().all(|&x| x == 0xee) && dst.guards_intact(), "{case}: something was placed");
        drop(c);
    }
}

/// On one NIC's direct path, a request to a peer QP that stays in INIT goes unanswered: its WQE fails with 0x15
/// (transport retry exceeded) once the retry timeout has passed, not before, and the QP moves to ERR.
#[test]
fn a_responder_that_never_reaches_rtr_fails_the_request_after_the_retry_timeout() {
    let nic = EmuNic::open(wired(Duration::from_millis(300))).unwrap();
    let pd = nic.alloc_pd().unwrap();
    let (cq_a, cq_b) = (nic.create_cq(64).unwrap(), nic.create_cq(64).unwrap());
    let (a, b) = (nic.create_qp(&pd, &cq_a, 64).unwrap(), nic.create_qp(&pd, &cq_b, 64).unwrap());
    a.connect(&b.endpoint()).unwrap();
    let (mut sq, mut cq) = (Sq::new(&a), CqPoll::new(&cq_a));
    let (src, dst) = (GuardedBuf::new(64, 1), GuardedBuf::new(64, 0xee));
    let (lmr, rmr) = (src.register(&nic, &pd, Access::NONE), dst.register(&nic, &pd, Access::ALL));
    let t = Instant::now();
    let at = sq.post(&sq.write(SIGNALED, (lmr.lkey(), src.addr(), 64), dst.addr(), rmr.rkey()));
    assert_err(&cq.wait(), syndrome::TRANSPORT_RETRY_EXC_ERR, opcode::RDMA_WRITE, sq.qpn(), at);
    let waited = t.elapsed();
    assert!(waited >= Duration::from_millis(250) && waited < Duration::from_secs(5), "failed after {waited:?}");
    assert_eq!(a.state(), QpState::Error);
    assert!(dst.read().iter().all(|&x| x == 0xee) && dst.guards_intact());
}

/// While a request waits for its responder on the same NIC, its SQ ring is not read again: with the ring in
/// (simulated) GPU memory and no mirror, every look used to copy it to the host, thousands of times a second.
#[test]
fn a_waiting_request_does_not_fetch_its_ring_again() {
    let mut cfg = wired(Duration::from_secs(10));
    cfg.gpu = Some(Arc::new(SimGpu::new().unwrap()));
    cfg.queues = MemKind::Gpu;
    let nic = EmuNic::open(cfg).unwrap();
    let pd = nic.alloc_pd().unwrap();
    let cq = nic.create_cq(64).unwrap();
    let (a, b) = (nic.create_qp(&pd, &cq, 64).unwrap(), nic.create_qp(&pd, &cq, 64).unwrap());
    a.connect(&b.endpoint()).unwrap();
    let (mut sq, mut cqp) = (Sq::new(&a), CqPoll::new(&cq));
    let (src, dst) = (GuardedBuf::new(64, 0x3c), GuardedBuf::new(64, 0xee));
    let (lmr, rmr) = (src.register(&nic, &pd, Access::NONE), dst.register(&nic, &pd, Access::ALL));
    let at = sq.post(&sq.write(SIGNALED, (lmr.lkey(), src.addr(), 64), dst.addr(), rmr.rkey()));
    // The NIC's first look at the ring (the one fetch due), however late its thread runs, then time to settle
    // into the wait: a count taken after a fixed 50 ms missed that fetch when the thread was late, and counted
    // it as one of the wait's.
    wait_until("the NIC's first fetch of the ring", || nic.stats().ring_fetches >= 1);
    std::thread::sleep(Duration::from_millis(50));
    let before = nic.stats().ring_fetches;
    std::thread::sleep(Duration::from_millis(300));
    let during = nic.stats().ring_fetches - before;
    b.connect(&a.endpoint()).unwrap();
    assert_req(&cqp.wait(), opcode::RDMA_WRITE, sq.qpn(), at, 0);
    assert!(dst.read().iter().all(|&x| x == 0x3c) && dst.guards_intact());
    assert_eq!(during, 0, "ring fetches in 300 ms of waiting");
}

/// A bad doorbell (a producer index 100 WQEBBs past a 64-WQEBB ring) rung while a WRITE waits for its ACK
/// fails the QP behind that WRITE: the WRITE's CQE comes first, then the doorbell's error CQE (0x02,
/// BAD_DOORBELL) naming the WQE at the consumer index, as a WQE failing there would. A second bad doorbell
/// meanwhile finds the QP bound for the error state and adds nothing (it used to queue a second error CQE for
/// the same WQE; found by `emu_fuzz_wire`). The error CQE retires the WQE: when one is posted there later it
/// gets no second CQE, and the next one is flushed, once.
#[test]
fn a_bad_doorbell_behind_an_outstanding_request_fails_the_qp_after_it_completes() {
    let p = WirePair::new(Duration::from_secs(10));
    let (mut sq, mut cq) = (Sq::new(&p.a), CqPoll::new(&p.cq_a));
    let src = GuardedBuf::new(64, 0x5a);
    let dst = GuardedBuf::new(64, 0xc3);
    let lmr = src.register(&p.nic_a, &p.pd_a, Access::NONE);
    let rmr = dst.register(&p.nic_b, &p.pd_b, Access::ALL);
    // One round trip first, so that the connection is up.
    let at = sq.post_bytes(&sq.inline_write(opcode::RDMA_WRITE, SIGNALED, &[], 0, 0, 0));
    assert_req(&cq.wait(), opcode::RDMA_WRITE, sq.qpn(), at, 0);
    // The responder's NIC stops: the next WRITE goes out and waits for its ACK.
    p.nic_b.hold_executor(true);
    let write = sq.post(&sq.write(SIGNALED, (lmr.lkey(), src.addr(), 64), dst.addr(), rmr.rkey()));
    wait_until("the WRITE taken", || p.a.sq_consumed() == write + 1);
    sq.doorbell_pi(write + 101);
    wait_until("the bad doorbell seen", || p.nic_a.stats().bad_doorbells == 1);
    cq.assert_none_for(Duration::from_millis(50));
    sq.doorbell_pi(write + 102);
    wait_until("the second bad doorbell seen", || p.nic_a.stats().bad_doorbells == 2);
    p.nic_b.hold_executor(false);
    assert_req(&cq.wait(), opcode::RDMA_WRITE, sq.qpn(), write, 0);
    let c = cq.wait();
    assert_err(&c, syndrome::LOCAL_QP_OP_ERR, opcode::NOP, sq.qpn(), write + 1);
    assert_eq!(c.as_err().vendor_err_synd, gdaki::nic::emu::vendor::BAD_DOORBELL);
    assert_eq!(dst.read(), src.read(), "the WRITE before the bad doorbell placed its data");
    cq.assert_none_for(Duration::from_millis(50));
    assert_eq!(p.a.state(), QpState::Error);
    // Posted after the error: the first is the WQE that CQE named, the second is flushed.
    let retired = sq.post(&sq.nop(SIGNALED));
    let flushed = sq.post(&sq.nop(SIGNALED));
    assert_eq!(retired, write + 1);
    assert_err(&cq.wait(), syndrome::WR_FLUSH_ERR, opcode::NOP, sq.qpn(), flushed);
    cq.assert_none_for(Duration::from_millis(50));
    let s = stats_when(&p.nic_a, "the error and flush CQEs counted", |s| s.error_cqes >= 1 && s.flush_cqes >= 1);
    assert_eq!((s.error_cqes, s.flush_cqes), (1, 1), "{s:?}");
}

/// Two posters' doorbells landing out of order while WQEs wait in the ring for the wire (found by
/// `emu_fuzz_wire`): a READ goes out and waits for its response, so the WRITE behind it waits in the ring (an
/// implicit fence); the doorbell that announced the WRITE and a second one after it lands first, the one that
/// announced only the READ and that WRITE lands last. It is stale: the NIC keeps the WQEs it owes, and once the
/// READ is answered all three complete (the late doorbell used to leave the last one in the ring, with no CQE,
/// until some later doorbell).
#[test]
fn an_older_doorbell_landing_late_keeps_the_wqes_waiting_for_the_wire() {
    let p = WirePair::new(Duration::from_secs(10));
    let (mut sq, mut cq) = (Sq::new(&p.a), CqPoll::new(&p.cq_a));
    let src = GuardedBuf::new(64, 0x5a);
    let back = GuardedBuf::new(64, 0);
    let dst = GuardedBuf::new(192, 0xc3);
    let lmr = src.register(&p.nic_a, &p.pd_a, Access::NONE);
    let bmr = back.register(&p.nic_a, &p.pd_a, Access::LOCAL_WRITE);
    let rmr = dst.register(&p.nic_b, &p.pd_b, Access::ALL);
    // One round trip first, so that the connection is up.
    let at = sq.post_bytes(&sq.inline_write(opcode::RDMA_WRITE, SIGNALED, &[], 0, 0, 0));
    assert_req(&cq.wait(), opcode::RDMA_WRITE, sq.qpn(), at, 0);
    p.nic_b.hold_executor(true);
    let read = sq.put(&sq.read(SIGNALED, (bmr.lkey(), back.addr(), 64), dst.addr(), rmr.rkey()));
    let first = sq.put(&sq.write(SIGNALED, (lmr.lkey(), src.addr(), 64), dst.addr() + 64, rmr.rkey()));
    let second = sq.put(&sq.write(SIGNALED, (lmr.lkey(), src.addr(), 64), dst.addr() + 128, rmr.rkey()));
    sq.dbrec();
    sq.doorbell(second);
    wait_until("the READ taken", || p.a.sq_consumed() == read + 1);
    let seen = p.nic_a.stats().doorbells;
    sq.doorbell_pi(second);
    wait_until("the late doorbell seen", || p.nic_a.stats().doorbells == seen + 1);
    assert_eq!(p.a.sq_consumed(), read + 1, "the WRITEs still wait for the READ's response");
    p.nic_b.hold_executor(false);
    assert_req(&cq.wait(), opcode::RDMA_READ, sq.qpn(), read, 64);
    assert_req(&cq.wait(), opcode::RDMA_WRITE, sq.qpn(), first, 0);
    assert_req(&cq.wait(), opcode::RDMA_WRITE, sq.qpn(), second, 0);
    assert_eq!(back.read(), vec![0xc3; 64]);
    assert_eq!(dst.read()[64..], [0x5a; 128]);
    assert_eq!(p.nic_a.stats().stale_doorbells, 1);
}

/// A wire pair whose NICs reach "GPU memory" through simulated copiers, with the same-host path on or off at
/// each end (`WireConfig::gpu_ipc`).
fn ipc_wire_pair(a: bool, b: bool) -> WirePair {
    ipc_wire_pair_with(a, b, Duration::from_secs(10))
}

/// [`ipc_wire_pair`] with retry timeout `retry`.
fn ipc_wire_pair_with(a: bool, b: bool, retry: Duration) -> WirePair {
    WirePair::with(ipc_config(a, retry), ipc_config(b, retry))
}

/// A wired NIC's configuration with a (simulated, unless `GDAKI_QUEUES=gpu` gave one) GPU copier and the
/// same-host path `on` or off.
fn ipc_config(on: bool, retry: Duration) -> EmuConfig {
    let mut c = EmuConfig::host_or_env().unwrap().with_wire(WireConfig {
        retry_timeout: retry,
        gpu_ipc: on,
        ..WireConfig::loopback()
    });
    if c.gpu.is_none() {
        c.gpu = Some(Arc::new(SimGpu::new().unwrap()));
    }
    c
}

/// Device code's side of a wire pair: QP a's SQ and CQ, QP b's CQ.
type Sides = (Sq, CqPoll, CqPoll);

fn sides(p: &WirePair) -> Sides {
    (Sq::new(&p.a), CqPoll::new(&p.cq_a), CqPoll::new(&p.cq_b))
}

/// Waits until NIC b (`nic_b`) has mapped the source of NIC a's first WRITE and NIC a has its answer: b counts
/// the mapping as it puts the answer in the QP's stream, so the ACK of an 8-byte WRITE (`lkey`, `src` to
/// `raddr`, `rkey`) posted after that comes behind the answer; WRITEs posted later go by mapping.
fn until_answered(
    nic_b: &EmuNic,
    (sq, cq): (&mut Sq, &mut CqPoll),
    (lkey, src): (u32, u64),
    (raddr, rkey): (u64, u32),
) {
    stats_when(nic_b, "the peer's mapping of the source", |s| s.ipc_mapped == 1);
    let at = sq.post(&sq.write(SIGNALED, (lkey, src, 8), raddr, rkey));
    assert_req(&cq.wait(), opcode::RDMA_WRITE, sq.qpn(), at, 0);
}

/// Posts WRITEs of random lengths from random offsets of `src` (GPU memory at NIC a) to random offsets of
/// `dst` (at NIC b), every other one with an immediate, and checks every byte placed, the guards, and that
/// each immediate's CQE comes after its data. Returns the bytes written.
fn random_writes(sides: &mut Sides, src: &GuardedBuf, dst: &GuardedBuf, rkey: u32, lkey: u32, n: usize) -> u64 {
    let mut rng = rng();
    let (sq, cq, peer_cq) = sides;
    let data = random_bytes(&mut rng, src.len());
    src.write(0, &data);
    let mut moved = 0;
    for i in 0..n {
        let len = rng.random_range(1..=src.len().min(dst.len()) / 2);
        let (from, to) = (rng.random_range(0..src.len() - len), rng.random_range(0..dst.len() - len));
        let fill = rng.random::<u8>();
        dst.fill(fill);
        let mut wqe = sq.write(SIGNALED, (lkey, src.addr() + from as u64, len as u32), dst.addr() + to as u64, rkey);
        let imm = rng.random::<u32>();
        if i % 2 == 1 {
            wqe[0] = sq.ctrl(opcode::RDMA_WRITE_IMM, SIGNALED, 3, imm);
        }
        let at = sq.post(&wqe);
        if i % 2 == 1 {
            let r = peer_cq.wait();
            assert_eq!(
                (r.opcode(), r.imm_inval_pkey.get(), r.byte_cnt.get()),
                (opcode::cqe::RESP_WR_IMM, imm, len as u32)
            );
            assert_eq!(&dst.read()[to..to + len], &data[from..from + len], "WRITE #{i}: data before its CQE");
        }
        let opc = if i % 2 == 1 { opcode::RDMA_WRITE_IMM } else { opcode::RDMA_WRITE };
        assert_req(&cq.wait(), opc, sq.qpn(), at, 0);
        let got = dst.read();
        assert_eq!(&got[to..to + len], &data[from..from + len], "WRITE #{i} of {len} bytes placed");
        assert!(got[..to].iter().chain(&got[to + len..]).all(|&b| b == fill), "WRITE #{i}: nothing else");
        moved += len as u64;
    }
    assert!(src.guards_intact() && dst.guards_intact());
    moved
}

#[test]
fn writes_from_gpu_memory_to_a_peer_on_this_host_go_by_mapping_once_it_mapped_the_source() {
    let p = ipc_wire_pair(true, true);
    let src = GuardedBuf::new(64 << 10, 0);
    let (dst_gpu, dst_host) = (GuardedBuf::new(64 << 10, 0), GuardedBuf::new(64 << 10, 0));
    let smr = src.register_as(MemKind::Gpu, &p.nic_a, &p.pd_a, Access::NONE);
    let gmr = dst_gpu.register_as(MemKind::Gpu, &p.nic_b, &p.pd_b, Access::ALL);
    let hmr = dst_host.register(&p.nic_b, &p.pd_b, Access::ALL);
    // The first WRITE goes as bytes and offers the source's allocation; the peer maps it on its own thread.
    let mut sides = sides(&p);
    random_writes(&mut sides, &src, &dst_gpu, gmr.rkey(), smr.lkey(), 1);
    let first = p.nic_a.stats();
    assert_eq!((first.ipc_pieces, first.ipc_bytes), (0, 0), "the first WRITE went as bytes");
    until_answered(&p.nic_b, (&mut sides.0, &mut sides.1), (smr.lkey(), src.addr()), (dst_gpu.addr(), gmr.rkey()));
    let before = p.nic_a.stats();
    let moved = random_writes(&mut sides, &src, &dst_gpu, gmr.rkey(), smr.lkey(), 24)
        + random_writes(&mut sides, &src, &dst_host, hmr.rkey(), smr.lkey(), 24);
    let after = p.nic_a.stats();
    assert_eq!(after.ipc_pieces - before.ipc_pieces, 48, "every WRITE one piece the responder copied");
    assert_eq!(after.ipc_bytes - before.ipc_bytes, moved);
    assert_eq!(p.nic_b.stats().ipc_mapped, 1, "one allocation, mapped once");
    assert_eq!((p.nic_a.stats().ipc_mapped, p.nic_b.stats().ipc_pieces), (0, 0), "nothing the other way");
    drop((smr, gmr, hmr));
}

#[test]
fn writes_go_as_bytes_when_either_end_keeps_the_same_host_path_off() {
    for (a, b) in [(true, false), (false, true)] {
        let p = ipc_wire_pair(a, b);
        let src = GuardedBuf::new(16 << 10, 0);
        let dst = GuardedBuf::new(16 << 10, 0);
        let smr = src.register_as(MemKind::Gpu, &p.nic_a, &p.pd_a, Access::NONE);
        let dmr = dst.register_as(MemKind::Gpu, &p.nic_b, &p.pd_b, Access::ALL);
        let mut sides = sides(&p);
        random_writes(&mut sides, &src, &dst, dmr.rkey(), smr.lkey(), 1);
        // Long enough for an offer's answer to have come back.
        std::thread::sleep(Duration::from_millis(100));
        random_writes(&mut sides, &src, &dst, dmr.rkey(), smr.lkey(), 8);
        let (sa, sb) = (p.nic_a.stats(), p.nic_b.stats());
        assert_eq!((sb.ipc_mapped, sa.ipc_pieces), (0, 0), "requester on: {a}, responder on: {b}");
        drop((smr, dmr));
    }
}

#[test]
fn an_mr_the_peer_copies_from_is_deregistered_only_once_the_peer_has_answered() {
    // The peer may still copy a WRITE sent by mapping until it answers: the source MR's drop waits for that
    // (the memory may go once it returns), here while the peer's NIC is held.
    let p = ipc_wire_pair(true, true);
    let src = GuardedBuf::new(4096, 0);
    let dst = GuardedBuf::new(4096, 0);
    let smr = src.register_as(MemKind::Gpu, &p.nic_a, &p.pd_a, Access::NONE);
    let dmr = dst.register_as(MemKind::Gpu, &p.nic_b, &p.pd_b, Access::ALL);
    let mut sides = sides(&p);
    random_writes(&mut sides, &src, &dst, dmr.rkey(), smr.lkey(), 1);
    until_answered(&p.nic_b, (&mut sides.0, &mut sides.1), (smr.lkey(), src.addr()), (dst.addr(), dmr.rkey()));
    let pieces = p.nic_a.stats().ipc_pieces;
    let data = random_bytes(&mut rng(), 4096);
    src.write(0, &data);
    p.nic_b.hold_executor(true);
    let at = sides.0.post(&sides.0.write(SIGNALED, (smr.lkey(), src.addr(), 4096), dst.addr(), dmr.rkey()));
    stats_when(&p.nic_a, "the WRITE sent by mapping", |s| s.ipc_pieces == pieces + 1);
    let (tx, rx) = std::sync::mpsc::channel();
    let dropper = std::thread::spawn(move || {
        drop(smr);
        tx.send(()).unwrap();
    });
    assert!(
        rx.recv_timeout(Duration::from_millis(300)).is_err(),
        "the MR went while the peer had not copied from it yet"
    );
    p.nic_b.hold_executor(false);
    rx.recv_timeout(Duration::from_secs(5)).expect("the MR's drop returns once the peer answered");
    dropper.join().unwrap();
    assert_req(&sides.1.wait(), opcode::RDMA_WRITE, sides.0.qpn(), at, 0);
    assert_eq!(dst.read(), data);
    assert!(src.guards_intact() && dst.guards_intact());
    drop(dmr);
}

#[test]
fn a_write_by_mapping_refused_after_its_copy_began_is_answered_once_the_copy_is_done() {
    // The responder enqueues a long copy out of the mapping, then refuses the WRITE (its immediate finds the
    // CQ full: NAK, remote operation error). The NAK is the peer's answer: once the error CQE is out, the
    // application owns the source again (and may free it), so the copy must have ended before.
    const N: usize = 64 << 20;
    const NCQE: u32 = 64;
    let retry = Duration::from_secs(10);
    let p = WirePair::sized(ipc_config(true, retry), ipc_config(true, retry), 64, NCQE);
    let src = GuardedBuf::new(N, 0x3c);
    let dst = GuardedBuf::new(N, 0);
    let smr = src.register_as(MemKind::Gpu, &p.nic_a, &p.pd_a, Access::NONE);
    let dmr = dst.register_as(MemKind::Gpu, &p.nic_b, &p.pd_b, Access::ALL);
    let (sq, cq) = (&mut Sq::new(&p.a), &mut CqPoll::new(&p.cq_a));
    let at = sq.post(&sq.write(SIGNALED, (smr.lkey(), src.addr(), 64), dst.addr(), dmr.rkey()));
    assert_req(&cq.wait(), opcode::RDMA_WRITE, sq.qpn(), at, 0);
    until_answered(&p.nic_b, (sq, cq), (smr.lkey(), src.addr()), (dst.addr(), dmr.rkey()));
    let pieces = p.nic_a.stats().ipc_pieces;
    // Fill the peer's CQ with the immediates' CQEs, never polled.
    for i in 0..NCQE {
        let mut wqe = sq.write(SIGNALED, (smr.lkey(), src.addr(), 8), dst.addr(), dmr.rkey());
        wqe[0] = sq.ctrl(opcode::RDMA_WRITE_IMM, SIGNALED, 3, i);
        let at = sq.post(&wqe);
        assert_req(&cq.wait(), opcode::RDMA_WRITE_IMM, sq.qpn(), at, 0);
    }
    let pieces = pieces + u64::from(NCQE);
    assert_eq!(p.nic_a.stats().ipc_pieces, pieces, "the small WRITEs went by mapping");
    let mut wqe = sq.write(SIGNALED, (smr.lkey(), src.addr(), N as u32), dst.addr(), dmr.rkey());
    wqe[0] = sq.ctrl(opcode::RDMA_WRITE_IMM, SIGNALED, 3, u32::MAX);
    let at = sq.post(&wqe);
    assert_err(&cq.wait(), syndrome::REMOTE_OP_ERR, opcode::RDMA_WRITE_IMM, sq.qpn(), at);
    // The application's next bytes in the source, at once: a copy still running would take them.
    src.write(N - 4096, &[0xee; 4096]);
    assert_eq!(p.nic_a.stats().ipc_pieces, pieces + 1, "the long WRITE went by mapping");
    std::thread::sleep(Duration::from_millis(200));
    assert!(dst.read().iter().all(|&b| b == 0x3c), "the peer copied bytes written after the error CQE");
    assert!(src.guards_intact() && dst.guards_intact());
    drop((smr, dmr));
}

#[test]
fn a_write_by_mapping_flushed_or_abandoned_unanswered_holds_its_mr_for_a_retry_timeout() {
    // The requester's QP fails (2ERR) or is destroyed while the peer, held, has not run a WRITE by mapping it
    // already took: the peer may still copy it, so the source MR's drop waits a retry timeout before the
    // memory may go, and what the peer copies is the source as it was.
    const RETRY: Duration = Duration::from_millis(600);
    for destroy in [false, true] {
        let p = ipc_wire_pair_with(true, true, RETRY);
        let WirePair { a, b, cq_a, cq_b, pd_a, pd_b, nic_a, nic_b } = p;
        let src = GuardedBuf::new(4096, 0x11);
        let dst = GuardedBuf::new(4096, 0);
        let smr = src.register_as(MemKind::Gpu, &nic_a, &pd_a, Access::NONE);
        let dmr = dst.register_as(MemKind::Gpu, &nic_b, &pd_b, Access::ALL);
        let (mut sq, mut cq) = (Sq::new(&a), CqPoll::new(&cq_a));
        let at = sq.post(&sq.write(SIGNALED, (smr.lkey(), src.addr(), 64), dst.addr(), dmr.rkey()));
        assert_req(&cq.wait(), opcode::RDMA_WRITE, sq.qpn(), at, 0);
        until_answered(&nic_b, (&mut sq, &mut cq), (smr.lkey(), src.addr()), (dst.addr(), dmr.rkey()));
        let pieces = nic_a.stats().ipc_pieces;
        nic_b.hold_executor(true);
        let w = sq.post(&sq.write(SIGNALED, (smr.lkey(), src.addr(), 4096), dst.addr(), dmr.rkey()));
        stats_when(&nic_a, "the WRITE sent by mapping", |s| s.ipc_pieces == pieces + 1);
        // Let the frame reach the peer's inbound queue.
        std::thread::sleep(Duration::from_millis(50));
        if destroy {
            drop(a);
        } else {
            use gdaki::nic::devx::{self, EmuObj};
            devx::to_err(&*nic_a, &EmuObj::Qp(a.qpn()), a.qpn()).unwrap();
            let n = sq.post(&sq.nop(SIGNALED));
            assert_err(&cq.wait(), syndrome::WR_FLUSH_ERR, opcode::RDMA_WRITE, sq.qpn(), w);
            assert_err(&cq.wait(), syndrome::WR_FLUSH_ERR, opcode::NOP, sq.qpn(), n);
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let t = Instant::now();
        let dropper = std::thread::spawn(move || {
            drop(smr);
            tx.send(()).unwrap();
        });
        assert!(rx.recv_timeout(Duration::from_millis(200)).is_err(), "destroy {destroy}: the MR went at once");
        nic_b.hold_executor(false);
        rx.recv_timeout(RETRY * 4).expect("the MR's drop returns within its bound");
        dropper.join().unwrap();
        assert!(t.elapsed() >= RETRY / 2, "destroy {destroy}: waited {:?}", t.elapsed());
        // The memory is the application's again.
        src.fill(0xee);
        std::thread::sleep(Duration::from_millis(100));
        assert!(dst.read().iter().all(|&b| b == 0x11), "destroy {destroy}: the peer copied the source as it was");
        drop((dmr, b, cq_b, cq_a));
    }
}

#[test]
fn writes_from_more_allocations_than_a_peer_maps_go_as_bytes_and_the_link_stays_up() {
    // A requester offers a peer at most 64 allocations per QP (the peer refuses more), and none after one it
    // declined: WRITEs from 70 GPU MRs, each its own allocation, to a peer that maps, that keeps the path off,
    // and that has no GPU copier (as a peer on another host).
    let peers = [
        ipc_config(true, Duration::from_secs(10)),
        ipc_config(false, Duration::from_secs(10)),
        wired(Duration::from_secs(10)),
    ];
    for (k, b) in peers.into_iter().enumerate() {
        let p = WirePair::with(ipc_config(true, Duration::from_secs(10)), b);
        let dst = GuardedBuf::new(256, 0);
        let dmr = dst.register(&p.nic_b, &p.pd_b, Access::ALL);
        let (mut sq, mut cq) = (Sq::new(&p.a), CqPoll::new(&p.cq_a));
        let bufs: Vec<GuardedBuf> = (0..70).map(|i| GuardedBuf::new(256, i as u8)).collect();
        for (i, buf) in bufs.iter().enumerate() {
            let mr = buf.register_as(MemKind::Gpu, &p.nic_a, &p.pd_a, Access::NONE);
            let at = sq.post(&sq.write(SIGNALED, (mr.lkey(), buf.addr(), 256), dst.addr(), dmr.rkey()));
            let c = cq.wait();
            assert_eq!(c.opcode(), opcode::cqe::REQ, "peer #{k}, WRITE from MR #{i}: {:?}", p.a.wire_error());
            assert_req(&c, opcode::RDMA_WRITE, sq.qpn(), at, 0);
            assert_eq!(dst.read(), [i as u8; 256], "peer #{k}, WRITE from MR #{i}");
            drop(mr);
        }
        drop(dmr);
    }
}
