//! The device code (`gdaki-device`) on the `cpu` executor, against the emulated NIC: the same functions a GPU
//! kernel calls (`Qp::post`, `put`, `put_with_signal`, `post_write_inline`, `post_bf`, `poll_cq`, `wait`,
//! `flush`, `semaphore_ge`), called from host threads on `QpHandle`s the emulator built. Payloads are random
//! and checked byte for byte; every expected value is computed here, not taken from the code under test.
//! Replay a failure with the `GDAKI_TEST_SEED` it printed.

mod emu_util;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use emu_util::{local_range, random_bytes, remote_range, rng, GuardedBuf, Pair};
use gdaki::nic::emu::{vendor, Access, EmuConfig, EmuNic, QpState};
use gdaki_device::cq::Completion;
use gdaki_device::error::{
    kind, AppError, CqeError, InvalidArgument, PayloadMismatch, PeerGone, RangeError, Timeout, UnexpectedCqe, WaitOn,
};
use gdaki_device::qp::{Qp as DevQp, Ticket};
use gdaki_device::scope::{Block, Device, Scope};
use gdaki_device::shared_qp::SharedQp;
use gdaki_device::wait::semaphore_ge;
use gdaki_device::wqe::{self, Raddr, Sge, MAX_INLINE};
use gdaki_device::Error;
use gdaki_shared::handle::{ErrorReport, MrHandle, QpHandle, RemoteMr};
use gdaki_shared::prm::opcode::{self, syndrome};
use gdaki_shared::prm::wqe::WQEBB;
use gdaki_shared::Be32;
use proptest::prelude::*;
use rand::RngExt;

/// Bound of every device-side wait in tests that expect success: long enough for a loaded 2-core machine,
/// short enough that a hang fails the test instead of the CI job.
const TIMEOUT_NS: u64 = 10_000_000_000;

/// Wraps `h` as an Exclusive device QP.
fn dev_qp(h: &mut QpHandle) -> DevQp<'_> {
    // SAFETY: every handle passed here comes from `emu::Qp::handle()` of a QP (and its CQ) that the calling
    // test keeps alive for longer than the returned borrow; its ring, dbrec, UAR and CQ are host queue memory
    // (the `cpu` executor), and only the calling thread posts to it or polls its CQ.
    unsafe { DevQp::new(h, TIMEOUT_NS) }
}

/// A remote target inside `mr` at byte offset `off` (what the builders take for hand-built WQEs).
fn raddr(mr: &RemoteMr, off: u64) -> Raddr {
    Raddr { addr: mr.addr + off, rkey: mr.rkey }
}

/// A local SGE inside `mr`.
fn sge(mr: &MrHandle, off: u64, len: u32) -> Sge {
    Sge::new(mr.addr + off, len, mr.lkey).unwrap()
}

/// Bytes `off .. off + len` of `buf`, read byte by byte with volatile loads (the NIC writes it from its
/// thread; a peer thread may read while other parts of the buffer are being written).
fn read_range(buf: &GuardedBuf, off: usize, len: usize) -> Vec<u8> {
    assert!(off + len <= buf.len());
    // SAFETY: inside the buffer's registered middle (checked above); byte loads need no alignment.
    (0..len).map(|i| unsafe { ((buf.addr() as usize + off + i) as *const u8).read_volatile() }).collect()
}

/// Asserts that `got` holds `want` at `off` and `fill` everywhere else.
fn assert_placed(got: &[u8], off: usize, want: &[u8], fill: u8, what: &str) {
    assert_eq!(&got[off..off + want.len()], want, "{what}: payload of {} bytes at {off}", want.len());
    let outside = got[..off].iter().chain(&got[off + want.len()..]).position(|&b| b != fill);
    assert_eq!(outside, None, "{what}: a byte outside the target changed");
}

/// Polls `qp`'s CQ until a completion (or error) arrives, at most [`TIMEOUT_NS`].
fn next_completion(qp: &mut DevQp<'_>) -> Result<Completion, Error> {
    let t = Instant::now();
    loop {
        if let Some(r) = qp.poll_cq() {
            return r;
        }
        assert!(t.elapsed() < Duration::from_nanos(TIMEOUT_NS), "no completion within the test timeout");
        std::thread::yield_now();
    }
}

/// The result a call rejected with `a` returns.
fn inval<T>(a: InvalidArgument) -> Result<T, Error> {
    Err(Error::InvalidArgument(a))
}

/// The error CQE a flush or wait must return.
fn cqe_err(syndrome: u8, vendor_err_synd: u8, wqe_index: u64, qpn: u32) -> Error {
    Error::Cqe(CqeError { syndrome, vendor_err_synd, wqe_counter: wqe_index as u16, qpn })
}

// ---------------------------------------------------------------------------------------------------------
// put / flush / signal
// ---------------------------------------------------------------------------------------------------------

#[test]
fn put_then_flush_places_random_payloads_byte_for_byte() {
    const LEN: usize = 100_000;
    let mut rng = rng();
    let (src, dst) = (GuardedBuf::new(LEN, 0), GuardedBuf::new(LEN, 0xee));
    let p = Pair::new(64, 64);
    let lmr = src.register(&p.nic, &p.pd, Access::NONE);
    let rmr = dst.register(&p.nic, &p.pd, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let (local, remote) = (lmr.handle(), rmr.remote());
    let mut h = p.a.handle();
    let mut qp = dev_qp(&mut h);

    // One put per flush, sizes around word and WQEBB boundaries and a large one.
    for len in [1usize, 7, 8, 63, 64, 4095, 65_536, LEN] {
        dst.fill(0xee);
        let data = random_bytes(&mut rng, len);
        let (soff, doff) = (rng.random_range(0..=LEN - len), rng.random_range(0..=LEN - len));
        src.write(soff, &data);
        qp.put(&remote, doff as u64, &local, soff as u64, len as u64).unwrap();
        qp.flush().unwrap();
        assert_placed(&dst.read(), doff, &data, 0xee, "single put");
    }

    // Many puts, one flush: every one is placed once the flush returns.
    dst.fill(0);
    const SLOT: usize = 4096;
    let mut want = vec![0u8; LEN];
    for k in 0..LEN / SLOT {
        let len = rng.random_range(1..=SLOT);
        let data = random_bytes(&mut rng, len);
        src.write(k * SLOT, &data);
        want[k * SLOT..k * SLOT + len].copy_from_slice(&data);
        qp.put(&remote, (k * SLOT) as u64, &local, (k * SLOT) as u64, len as u64).unwrap();
    }
    qp.flush().unwrap();
    assert!(dst.read() == want, "batched puts: destination differs from what was sent");
    assert!(src.guards_intact() && dst.guards_intact(), "a guard byte changed");
    // The device retired everything it posted: its consumer index reached its producer index.
    assert_eq!(qp.handle().sq.ci, qp.handle().sq.pi);
    let s = p.nic.stats();
    assert_eq!((s.error_cqes, s.flush_cqes, s.dbrec_mismatches, s.bad_doorbells), (0, 0, 0, 0), "{s:?}");
}

#[test]
fn put_with_signal_adds_one_and_returns_the_old_value() {
    const LEN: usize = 8192;
    let mut rng = rng();
    let (src, dst) = (GuardedBuf::new(LEN, 0), GuardedBuf::new(LEN, 0));
    let sem = GuardedBuf::new(16, 0);
    let scratch = GuardedBuf::new(128, 0xa5);
    let p = Pair::new(64, 64);
    let lmr = src.register(&p.nic, &p.pd, Access::NONE);
    let rmr = dst.register(&p.nic, &p.pd, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let sem_mr = sem.register(&p.nic, &p.pd, Access::LOCAL_WRITE | Access::REMOTE_ATOMIC);
    let res_mr = scratch.register(&p.nic, &p.pd, Access::LOCAL_WRITE);
    let mut h = p.a.handle();
    let mut qp = dev_qp(&mut h);

    // A random start, then a start just below u64::MAX so that the semaphore wraps to 0.
    for v0 in [rng.random::<u64>(), u64::MAX - 3] {
        sem.write(8, &v0.to_ne_bytes());
        scratch.fill(0xa5);
        for k in 0..8u64 {
            let len = rng.random_range(1..=LEN);
            let data = random_bytes(&mut rng, len);
            src.write(0, &data);
            dst.fill(0);
            let t = qp
                .put_with_signal(
                    &rmr.remote(),
                    0,
                    &lmr.handle(),
                    0,
                    len as u64,
                    &sem_mr.remote(),
                    8,
                    &res_mr.handle(),
                    8 * k,
                )
                .unwrap();
            qp.wait(t).unwrap();
            assert_eq!(sem.load_u64(8), v0.wrapping_add(k + 1), "semaphore after signal {k}");
            assert_eq!(scratch.u64_at(8 * k as usize), v0.wrapping_add(k), "fetch-add result of signal {k}");
            assert_placed(&dst.read(), 0, &data, 0, "put before signal");
        }
        assert_eq!(sem.load_u64(0), 0, "the word before the semaphore changed");
        assert!(scratch.read()[64..].iter().all(|&b| b == 0xa5), "scratch beyond the 8 results changed");
    }
    assert!(sem.guards_intact() && scratch.guards_intact() && dst.guards_intact());
}

#[test]
fn peer_that_sees_the_semaphore_sees_the_whole_payload() {
    // Large payloads: the longer the NIC takes to place one, the likelier a peer polling the semaphore would
    // catch a signal that overtook its payload.
    const ROUNDS: usize = 8;
    const SLOT: usize = 2 << 20;
    let mut rng = rng();
    // Two slots, used in turn: the peer has checked round i - 2 before round i starts.
    let (src, dst) = (GuardedBuf::new(2 * SLOT, 0), GuardedBuf::new(2 * SLOT, 0));
    let sem = GuardedBuf::new(8, 0);
    let scratch = GuardedBuf::new(ROUNDS * 8, 0xa5);
    let p = Pair::new(64, 64);
    let lmr = src.register(&p.nic, &p.pd, Access::NONE);
    let rmr = dst.register(&p.nic, &p.pd, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let sem_mr = sem.register(&p.nic, &p.pd, Access::LOCAL_WRITE | Access::REMOTE_ATOMIC);
    let res_mr = scratch.register(&p.nic, &p.pd, Access::LOCAL_WRITE);
    let payloads: Vec<Vec<u8>> = (0..ROUNDS)
        .map(|_| {
            let words = rng.random_range(SLOT / 16..=SLOT / 8);
            (0..words).flat_map(|_| rng.random::<u64>().to_ne_bytes()).collect()
        })
        .collect();
    let sem_ptr = sem.addr() as *const u64 as usize;
    // Rounds the peer has checked. The sender starts round i only once the peer waits for it, so the peer is
    // polling when the semaphore moves.
    let acked = AtomicU64::new(0);

    std::thread::scope(|s| {
        let peer = s.spawn(|| {
            for (i, d) in payloads.iter().enumerate() {
                // SAFETY: the semaphore word is 8-aligned, registered host memory that outlives this thread.
                let seen = unsafe { semaphore_ge(sem_ptr as *const u64, i as u64 + 1, TIMEOUT_NS) };
                let seen = seen.unwrap_or_else(|e| panic!("peer, round {i}: {e}"));
                assert_eq!(seen, i as u64 + 1, "semaphore_ge returned a value never written");
                // The tail first: a copy that runs front to back places it last.
                let (slot, tail) = ((i % 2) * SLOT, d.len() - 64);
                assert_eq!(read_range(&dst, slot + tail, 64), &d[tail..], "round {i}: tail not placed");
                let got = read_range(&dst, slot, d.len());
                let bad = got.iter().zip(d).position(|(a, b)| a != b);
                assert_eq!(bad, None, "round {i}: payload not fully placed when the semaphore reached {seen}");
                acked.store(i as u64 + 1, Ordering::Release);
            }
        });
        let mut h = p.a.handle();
        let mut qp = dev_qp(&mut h);
        for (i, d) in payloads.iter().enumerate() {
            let t = Instant::now();
            while acked.load(Ordering::Acquire) < i as u64 {
                assert!(!peer.is_finished() && t.elapsed() < Duration::from_secs(10), "peer stopped at round {i}");
                std::thread::yield_now();
            }
            let slot = ((i % 2) * SLOT) as u64;
            src.write(slot as usize, d);
            let (dst_r, src_l, sem_r, res_l) = (rmr.remote(), lmr.handle(), sem_mr.remote(), res_mr.handle());
            let _ = qp
                .put_with_signal(&dst_r, slot, &src_l, slot, d.len() as u64, &sem_r, 0, &res_l, 8 * i as u64)
                .unwrap();
        }
        qp.flush().unwrap();
        peer.join().expect("peer thread");
    });
    assert_eq!(sem.load_u64(0), ROUNDS as u64);
    // Signal i found the semaphore at i: the old values land in order.
    for i in 0..ROUNDS {
        assert_eq!(scratch.u64_at(8 * i), i as u64, "fetch-add result of round {i}");
    }
    assert!(dst.guards_intact());
}

// ---------------------------------------------------------------------------------------------------------
// RDMA READ, atomics, WRITE with immediate
// ---------------------------------------------------------------------------------------------------------

#[test]
fn rdma_read_returns_the_remote_bytes() {
    const LEN: usize = 70_000;
    let mut rng = rng();
    let (local, remote) = (GuardedBuf::new(LEN, 0x5a), GuardedBuf::new(LEN, 0));
    let p = Pair::new(64, 64);
    let lmr = local.register(&p.nic, &p.pd, Access::LOCAL_WRITE);
    let rmr = remote.register(&p.nic, &p.pd, Access::REMOTE_READ);
    let data = random_bytes(&mut rng, LEN);
    remote.write(0, &data);
    let mut h = p.a.handle();
    let mut qp = dev_qp(&mut h);
    for len in [1usize, 8, 100, 4096, 65_537] {
        local.fill(0x5a);
        let (loff, roff) = (rng.random_range(0..=LEN - len), rng.random_range(0..=LEN - len));
        let t = qp
            .post(true, wqe::rdma_read(raddr(&rmr.remote(), roff as u64), sge(&lmr.handle(), loff as u64, len as u32)));
        let t = t.unwrap();
        qp.wait(t).unwrap();
        assert_placed(&local.read(), loff, &data[roff..roff + len], 0x5a, "RDMA READ");
    }
    // The requester completion of a READ, as `poll_cq` returns it: REQ, this WQE's index, bytes read, QPN.
    let len = 3000u32;
    let t = qp.post(true, wqe::rdma_read(raddr(&rmr.remote(), 17), sge(&lmr.handle(), 0, len))).unwrap();
    qp.ring_db();
    let c = next_completion(&mut qp).unwrap();
    assert_eq!((c.opcode, c.wqe_counter, c.byte_cnt, c.qpn), (opcode::cqe::REQ, t.0 as u16, len, p.a.qpn()), "{c:?}");
    assert_eq!(&local.read()[..len as usize], &data[17..17 + len as usize]);
    assert!(local.guards_intact() && remote.guards_intact());
}

#[test]
fn compare_swap_and_fetch_add_return_old_values() {
    let mut rng = rng();
    let target = GuardedBuf::new(64, 0);
    let result = GuardedBuf::new(64, 0);
    let p = Pair::new(64, 64);
    let tmr = target.register(&p.nic, &p.pd, Access::LOCAL_WRITE | Access::REMOTE_ATOMIC);
    let rmr = result.register(&p.nic, &p.pd, Access::LOCAL_WRITE);
    let mut h = p.a.handle();
    let mut qp = dev_qp(&mut h);
    let (tr, rl) = (tmr.remote(), rmr.handle());
    for _ in 0..16 {
        let off = 8 * rng.random_range(0..8u64);
        let (v, w, x) = (rng.random::<u64>(), rng.random::<u64>(), rng.random::<u64>());
        target.write(off as usize, &v.to_ne_bytes());

        // Success: the word held `v`; it becomes `w`, and `v` comes back.
        let t = qp.post(true, wqe::atomic_compare_swap(raddr(&tr, off), sge(&rl, 0, 8), v, w).unwrap()).unwrap();
        qp.wait(t).unwrap();
        assert_eq!((result.u64_at(0), target.load_u64(off as usize)), (v, w), "CAS that matches");

        // Failure: compare with the stale `v` (the word is `w` now, and w != v but for a 2^-64 chance).
        let t = qp.post(true, wqe::atomic_compare_swap(raddr(&tr, off), sge(&rl, 8, 8), v, x).unwrap()).unwrap();
        qp.wait(t).unwrap();
        let expect_after = if w == v { x } else { w };
        assert_eq!((result.u64_at(8), target.load_u64(off as usize)), (w, expect_after), "CAS that does not match");

        // Fetch-add of a random addend, wrapping.
        let add = rng.random::<u64>();
        let t = qp.post(true, wqe::atomic_fetch_add(raddr(&tr, off), sge(&rl, 16, 8), add).unwrap()).unwrap();
        qp.wait(t).unwrap();
        assert_eq!((result.u64_at(16), target.load_u64(off as usize)), (expect_after, expect_after.wrapping_add(add)));
        target.fill(0);
    }
    assert!(target.guards_intact() && result.guards_intact());
}

/// The one-sided helpers `get`, `fetch_add` and `compare_swap`: random bytes read at random offsets, old
/// values returned and words changed as the operation says; out-of-range and misaligned arguments are refused
/// before anything is posted (the QP stays usable).
#[test]
fn get_fetch_add_and_compare_swap_helpers() {
    const LEN: usize = 8192;
    let mut rng = rng();
    let (local, remote) = (GuardedBuf::new(LEN, 0x5a), GuardedBuf::new(LEN, 0));
    let p = Pair::new(64, 64);
    let lmr = local.register(&p.nic, &p.pd, Access::LOCAL_WRITE);
    let rmr = remote.register(&p.nic, &p.pd, Access::REMOTE_READ | Access::REMOTE_ATOMIC | Access::LOCAL_WRITE);
    let data = random_bytes(&mut rng, LEN);
    remote.write(0, &data);
    let (l, r) = (lmr.handle(), rmr.remote());
    let mut h = p.a.handle();
    let mut qp = dev_qp(&mut h);
    for len in [1u64, 7, 64, 4000] {
        let (loff, roff) = (rng.random_range(0..=LEN as u64 - len), rng.random_range(0..=LEN as u64 - len));
        local.fill(0x5a);
        let t = qp.get(&l, loff, &r, roff, len).unwrap();
        qp.wait(t).unwrap();
        assert_placed(&local.read(), loff as usize, &data[roff as usize..(roff + len) as usize], 0x5a, "get");
    }
    let off = 8 * rng.random_range(0..64u64);
    let (v, add, swap) = (remote.load_u64(off as usize), rng.random::<u64>(), rng.random::<u64>());
    let t = qp.fetch_add(&r, off, add, &l, 0).unwrap();
    qp.wait(t).unwrap();
    assert_eq!((local.u64_at(0), remote.load_u64(off as usize)), (v, v.wrapping_add(add)), "fetch_add");
    let now = v.wrapping_add(add);
    let t = qp.compare_swap(&r, off, now, swap, &l, 8).unwrap();
    qp.wait(t).unwrap();
    assert_eq!((local.u64_at(8), remote.load_u64(off as usize)), (now, swap), "compare_swap that matches");
    let t = qp.compare_swap(&r, off, now, 0, &l, 16).unwrap();
    qp.wait(t).unwrap();
    let after = if swap == now { 0 } else { swap };
    assert_eq!((local.u64_at(16), remote.load_u64(off as usize)), (swap, after), "compare_swap that does not");
    // Refused before posting: the QP goes on.
    assert_eq!(qp.get(&l, 0, &r, LEN as u64 - 4, 8), remote_range(LEN as u64 - 4, 8, LEN as u64));
    assert_eq!(qp.get(&l, LEN as u64 - 4, &r, 0, 8), local_range(LEN as u64 - 4, 8, LEN as u64));
    assert_eq!(qp.get(&l, 0, &r, 0, 0), inval(InvalidArgument::Length));
    assert_eq!(qp.fetch_add(&r, 4, 1, &l, 0), inval(InvalidArgument::AtomicAlignment));
    assert_eq!(qp.compare_swap(&r, 0, 0, 1, &l, 4), inval(InvalidArgument::AtomicAlignment));
    qp.flush().unwrap();
    assert!(local.guards_intact() && remote.guards_intact());
}

#[test]
fn write_with_immediate_completes_on_the_peer_cq() {
    const LEN: usize = 5000;
    let mut rng = rng();
    let (src, dst) = (GuardedBuf::new(LEN, 0), GuardedBuf::new(LEN, 0x77));
    let p = Pair::new(64, 64);
    let lmr = src.register(&p.nic, &p.pd, Access::NONE);
    let rmr = dst.register(&p.nic, &p.pd, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let (mut ha, mut hb) = (p.a.handle(), p.b.handle());
    let mut a = dev_qp(&mut ha);
    let mut b = dev_qp(&mut hb);
    for _ in 0..6 {
        dst.fill(0x77);
        let len = rng.random_range(1..=LEN);
        let doff = rng.random_range(0..=LEN - len);
        let data = random_bytes(&mut rng, len);
        src.write(0, &data);
        let imm = rng.random::<u32>();
        let t = a.post(
            true,
            wqe::rdma_write_imm(raddr(&rmr.remote(), doff as u64), sge(&lmr.handle(), 0, len as u32), Be32::new(imm)),
        );
        a.wait(t.unwrap()).unwrap();
        // The responder's completion: RESP_WR_IMM with the immediate and the bytes placed, for B's QPN.
        let c = next_completion(&mut b).unwrap();
        assert_eq!(c.opcode, opcode::cqe::RESP_WR_IMM, "{c:?}");
        assert_eq!((c.imm.get(), c.byte_cnt, c.qpn), (imm, len as u32, p.b.qpn()), "{c:?}");
        assert_placed(&dst.read(), doff, &data, 0x77, "WRITE_IMM");
        // Exactly one completion per WRITE_IMM reaches B, and A's requester CQ got none of them.
        assert!(b.poll_cq().is_none(), "a second responder completion");
        assert!(a.poll_cq().is_none(), "a stray completion on the requester");
    }
    // B never posted: its SQ counters are untouched by responder completions.
    assert_eq!((b.handle().sq.pi, b.handle().sq.ci), (0, 0));
    assert_eq!(b.handle().cq.cons_index, 6);
}

// ---------------------------------------------------------------------------------------------------------
// post_batch
// ---------------------------------------------------------------------------------------------------------

#[test]
fn post_batch_places_every_write_and_only_the_last_asks_for_a_cqe() {
    const SLOT: usize = 512;
    const SLOTS: usize = 32;
    let mut rng = rng();
    let (src, dst) = (GuardedBuf::new(SLOT * SLOTS, 0), GuardedBuf::new(SLOT * SLOTS, 0x5a));
    let p = Pair::new(64, 64);
    let lmr = src.register(&p.nic, &p.pd, Access::NONE);
    let rmr = dst.register(&p.nic, &p.pd, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let (local, remote) = (lmr.handle(), rmr.remote());
    let mut h = p.a.handle();
    let mut qp = dev_qp(&mut h);
    // Batches of every size up to half the ring, at random places of the ring (it wraps many times).
    for _ in 0..40 {
        let n = rng.random_range(1..=SLOTS);
        dst.fill(0x5a);
        let mut want = vec![0x5a; SLOT * SLOTS];
        let mut lens = Vec::new();
        for k in 0..n {
            let len = rng.random_range(1..=SLOT);
            let data = random_bytes(&mut rng, len);
            src.write(k * SLOT, &data);
            want[k * SLOT..k * SLOT + len].copy_from_slice(&data);
            lens.push(len as u32);
        }
        let (before, cqes) = (qp.handle().sq.pi, p.nic.stats().cqes);
        let mut called = Vec::new();
        let t = qp
            .post_batch(n as u32, true, |i| {
                called.push(i);
                let off = i as u64 * SLOT as u64;
                wqe::rdma_write(raddr(&remote, off), sge(&local, off, lens[i as usize]))
            })
            .unwrap();
        assert_eq!(called, (0..n as u32).collect::<Vec<_>>(), "each WQE built once, in order");
        assert_eq!(t, Ticket(before + n as u64 - 1), "the ticket is the last WQE's");
        assert_eq!(qp.handle().sq.pi, before + n as u64);
        qp.ring_db();
        qp.wait(t).unwrap();
        assert!(dst.read() == want, "a batch of {n}: the destination differs from what was sent");
        let s = emu_util::stats_counted(&p.nic, 0, cqes + 1);
        assert_eq!(s.cqes - cqes, 1, "a batch of {n} asked for more than its last CQE");
    }
    assert!(src.guards_intact() && dst.guards_intact(), "a guard byte changed");
    let s = p.nic.stats();
    assert_eq!((s.error_cqes, s.dbrec_mismatches, s.bad_doorbells), (0, 0, 0), "{s:?}");
}

#[test]
fn post_batch_of_wqes_of_different_sizes_takes_each_ones_wqebbs() {
    const LEN: usize = 4096;
    let mut rng = rng();
    let dst = GuardedBuf::new(LEN, 0);
    let p = Pair::new(64, 64);
    let rmr = dst.register(&p.nic, &p.pd, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let mut h = p.a.handle();
    let mut qp = dev_qp(&mut h);
    for _ in 0..20 {
        // Inline WRITEs of 1 to 4 WQEBBs: a batch reserves 4 each, at most half the ring (8 WQEs).
        let n = rng.random_range(1..=8usize);
        let lens: Vec<usize> = (0..n).map(|_| rng.random_range(1..=MAX_INLINE)).collect();
        let datas: Vec<Vec<u8>> = lens.iter().map(|&l| random_bytes(&mut rng, l)).collect();
        dst.fill(0);
        let before = qp.handle().sq.pi;
        let t = qp
            .post_batch(n as u32, false, |i| {
                let off = i as u64 * 256;
                wqe::rdma_write_inline(raddr(&rmr.remote(), off), &datas[i as usize]).unwrap()
            })
            .unwrap();
        let taken: u64 = lens.iter().map(|&l| inline_wqebbs(l)).sum();
        assert_eq!(qp.handle().sq.pi, before + taken, "WQEBBs of {lens:?}");
        assert_eq!(t, Ticket(before + taken - inline_wqebbs(lens[n - 1])), "the last WQE's index");
        qp.flush().unwrap();
        let got = dst.read();
        for (i, d) in datas.iter().enumerate() {
            assert_eq!(&got[i * 256..i * 256 + d.len()], &d[..], "inline WRITE {i} of {lens:?}");
        }
    }
    let s = p.nic.stats();
    assert_eq!((s.error_cqes, s.bad_doorbells, s.dbrec_mismatches), (0, 0, 0), "{s:?}");
}

#[test]
fn post_batch_refuses_no_wqes_and_more_than_half_the_ring_and_posts_nothing() {
    let p = Pair::new(16, 16);
    let mut h = p.a.handle();
    let mut qp = dev_qp(&mut h);
    let mut built = 0;
    assert_eq!(qp.post_batch(0, false, |_| wqe::nop()), inval(InvalidArgument::Batch));
    assert_eq!(
        qp.post_batch(9, false, |_| {
            built += 1;
            wqe::nop()
        }),
        inval(InvalidArgument::Batch)
    );
    // 4-WQEBB WQEs: two fill half of the ring.
    let big = |_| wqe::rdma_write_inline(Raddr { addr: 0, rkey: Be32::new(0) }, &[0; MAX_INLINE]).unwrap();
    assert_eq!(qp.post_batch(3, false, big), inval(InvalidArgument::Batch));
    assert_eq!((built, qp.handle().sq.pi), (0, 0), "a refused batch built or posted WQEs");
    // Half the ring, again and again, unsignaled and rung only by the reservation waiting for room: the
    // quarter-ring CQEs retire it.
    for _ in 0..20 {
        let _ = qp.post_batch(8, false, |_| wqe::nop()).unwrap();
    }
    qp.flush().unwrap();
    assert_eq!(qp.handle().sq.ci, qp.handle().sq.pi);
    assert_eq!(p.a.sq_consumed(), qp.handle().sq.pi);
    // A batch of 8 WQEBBs is past the quarter ring (4) since the last CQE: each one's last WQE asks for a CQE,
    // so the flush has one to wait for and posts no NOP.
    let s = emu_util::stats_counted(&p.nic, 20 * 8, 20);
    assert_eq!((s.wqes, s.cqes, s.error_cqes), (20 * 8, 20, 0), "{s:?}");
}

/// `try_post_batch` whose builder refuses WQE `k` (here a range outside the MR, from `onesided::remote`):
/// the call returns that error with nothing of the batch posted (the producer index unmoved, no WQE executed),
/// and the next batch overwrites the WQEBBs the refused one had stored and completes.
#[test]
fn try_post_batch_posts_nothing_when_its_builder_refuses_a_wqe() {
    const LEN: usize = 1024;
    let mut rng = rng();
    let (src, dst) = (GuardedBuf::new(LEN, 0), GuardedBuf::new(LEN, 0x77));
    let p = Pair::new(64, 64);
    let lmr = src.register(&p.nic, &p.pd, Access::NONE);
    let rmr = dst.register(&p.nic, &p.pd, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let (local, remote) = (lmr.handle(), rmr.remote());
    let data = random_bytes(&mut rng, LEN);
    src.write(0, &data);
    let mut h = p.a.handle();
    let mut qp = dev_qp(&mut h);
    let build = |bad: Option<u32>| {
        move |i: u32| {
            // WRITE `i` covers bytes 64 i .. 64 i + 64; the bad one starts past the MR's end.
            let off = if Some(i) == bad { LEN as u64 } else { 64 * i as u64 };
            let r = gdaki_device::onesided::remote(&remote, off, 64)?;
            Ok(wqe::rdma_write(r, gdaki_device::onesided::local(&local, 64 * i as u64, 64)?))
        }
    };
    for _ in 0..10 {
        let k = rng.random_range(0..16u32);
        let (pi, wqes) = (qp.handle().sq.pi, p.nic.stats().wqes);
        assert_eq!(qp.try_post_batch(16, true, build(Some(k))), remote_range(LEN as u64, 64, LEN as u64), "WQE {k}");
        qp.ring_db();
        assert_eq!((qp.handle().sq.pi, p.nic.stats().wqes), (pi, wqes), "a refused batch (WQE {k}) posted");
        let t = qp.try_post_batch(16, true, build(None)).unwrap();
        qp.ring_db();
        qp.wait(t).unwrap();
        assert!(dst.read() == data, "the batch after a refused one");
        dst.fill(0x77);
    }
    let s = p.nic.stats();
    assert_eq!((s.wqes, s.error_cqes, s.bad_doorbells), (10 * 16, 0, 0), "{s:?}");
}

#[test]
fn post_batch_with_a_bad_rkey_fails_at_that_wqe_and_flushes_the_rest() {
    const LEN: usize = 256;
    let (src, dst) = (GuardedBuf::new(LEN, 0x11), GuardedBuf::new(LEN, 0));
    let p = Pair::new(64, 64);
    let lmr = src.register(&p.nic, &p.pd, Access::NONE);
    let rmr = dst.register(&p.nic, &p.pd, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let mut h = p.a.handle();
    let mut qp = dev_qp(&mut h);
    let bad = RemoteMr { rkey: Be32::new(rmr.rkey() ^ 0x5), ..rmr.remote() };
    let bad_at = rng().random_range(0..8u32);
    let t = qp
        .post_batch(8, true, |i| {
            let r = if i == bad_at { bad } else { rmr.remote() };
            wqe::rdma_write(raddr(&r, i as u64 * 32), sge(&lmr.handle(), 0, 32))
        })
        .unwrap();
    qp.ring_db();
    let first = cqe_err(syndrome::REMOTE_ACCESS_ERR, vendor::BAD_RKEY, bad_at as u64, qp.handle().qpn);
    assert_eq!(qp.wait(t), Err(first));
    assert_eq!(qp.flush(), Err(first), "the error is sticky");
    // The WRITEs before the bad one were placed, none after it.
    let got = dst.read();
    for i in 0..8usize {
        let placed = got[i * 32..i * 32 + 32].iter().all(|&b| b == 0x11);
        assert_eq!(placed, i < bad_at as usize, "WRITE {i} of a batch whose WRITE {bad_at} failed");
    }
    assert_eq!(p.a.state(), QpState::Error);
}

/// A handle whose ring size device code cannot post to (here forged over a live QP whose CQ holds CQEs of 12
/// WQEs posted under its real size) stays refused after the CQ is polled: retiring those WQEs gave the `Qp`
/// room back, and it then stored the next WQEs past the end of the ring the handle describes. Every post is
/// `InvalidArgument::Handle` and no byte of the forged ring or around it changes (found by a helper).
#[test]
fn a_ring_of_an_invalid_size_takes_nothing_after_its_cq_is_polled() {
    for cnt in [8u32, 3, 0, 1 << 16] {
        let p = Pair::new(64, 64);
        let mut h = p.a.handle();
        {
            let mut qp = dev_qp(&mut h);
            for _ in 0..12 {
                let _ = qp.post(true, wqe::nop()).unwrap();
            }
        }
        let cq = emu_util::CqPoll::new(&p.cq_a);
        emu_util::wait_until("12 CQEs written", || cq.written(11));
        // The NIC executes nothing more: only what device code stores is looked at.
        p.nic.hold_executor(true);
        // The forged ring: 64 WQEBBs of guard on each side of `cnt` (at most 64) WQEBBs.
        let room = 64 * WQEBB * (2 + cnt.min(64) as usize);
        let fake = vec![0x5cu8; room];
        h.wqe_cnt = cnt;
        h.sq_buf = fake.as_ptr() as u64 + 64 * WQEBB as u64;
        let (polled, batch, post) = {
            let mut qp = dev_qp(&mut h);
            let polled = qp.poll_cq().is_some();
            let batch = qp.post_batch(1, false, |_| wqe::nop());
            let _ = qp.poll_cq();
            (polled, batch, qp.post(false, wqe::nop()))
        };
        // A warp's post too (this thread is a warp of one lane).
        // SAFETY: as `dev_qp`.
        let warp = unsafe { gdaki_device::warp_qp::WarpQp::new(&mut h, TIMEOUT_NS) }.post(false, wqe::nop());
        p.nic.hold_executor(false);
        assert!(polled, "wqe_cnt {cnt}: the CQ had CQEs to poll");
        let handle = inval(InvalidArgument::Handle);
        assert_eq!((batch, post, warp.map(|_| ())), (handle, handle, inval(InvalidArgument::Handle)), "wqe_cnt {cnt}");
        // SAFETY: `fake` is plain memory that device code may have stored to; read it volatile.
        let changed = (0..room).filter(|&i| unsafe { fake.as_ptr().add(i).read_volatile() } != 0x5c).count();
        assert_eq!(changed, 0, "wqe_cnt {cnt}: bytes stored in or around a ring of an invalid size");
    }
}

// ---------------------------------------------------------------------------------------------------------
// Inline writes and BlueFlame
// ---------------------------------------------------------------------------------------------------------

/// WQEBBs of an inline RDMA WRITE of `len` bytes, worked out by hand from the PRM layout: ctrl (16) + raddr
/// (16) + inline header (4) + data, rounded up to 16-byte segments, then to 64-byte WQEBBs.
fn inline_wqebbs(len: usize) -> u64 {
    match len {
        1..=28 => 1,    // 32 + 4 + 28 = 64
        29..=92 => 2,   // 32 + 4 + 92 = 128
        93..=156 => 3,  // ... 192
        157..=220 => 4, // ... 256
        _ => unreachable!(),
    }
}

#[test]
fn inline_writes_of_every_shape_place_their_bytes() {
    const LEN: usize = 4096;
    assert_eq!(MAX_INLINE, 220, "MAX_INLINE: 4 WQEBBs - ctrl - raddr - 4-byte header");
    let mut rng = rng();
    let dst = GuardedBuf::new(LEN, 0x33);
    let p = Pair::new(64, 64);
    let rmr = dst.register(&p.nic, &p.pd, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let mut h = p.a.handle();
    let mut qp = dev_qp(&mut h);
    let mut pi = 0;
    for len in [1usize, 12, 28, 29, 92, 93, 100, 156, 157, MAX_INLINE] {
        dst.fill(0x33);
        let data = random_bytes(&mut rng, len);
        let off = rng.random_range(0..=LEN - len);
        let t = qp.post_write_inline(true, raddr(&rmr.remote(), off as u64), &data).unwrap();
        assert_eq!(t, Ticket(pi), "inline write of {len} bytes starts where the last WQE ended");
        qp.wait(t).unwrap();
        pi += inline_wqebbs(len);
        assert_eq!(qp.handle().sq.pi, pi, "WQEBBs taken by an inline write of {len} bytes");
        assert_eq!(p.a.sq_consumed(), pi, "WQEBBs the NIC consumed");
        assert_placed(&dst.read(), off, &data, 0x33, "inline write");
    }
    assert!(dst.guards_intact());
    assert_eq!(p.nic.stats().error_cqes, 0);
}

#[test]
fn inline_write_wraps_across_the_ring_end() {
    const LEN: usize = 1024;
    let mut rng = rng();
    let dst = GuardedBuf::new(LEN, 0);
    let p = Pair::new(16, 16);
    let rmr = dst.register(&p.nic, &p.pd, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let mut h = p.a.handle();
    let sq_buf = h.sq_buf;
    let mut qp = dev_qp(&mut h);
    // (ring slot the WQE starts in, payload bytes): each one runs past slot 15 into slot 0 and beyond.
    for (slot, len) in [(15u64, MAX_INLINE), (14, 100), (15, 29), (13, 200), (15, 93)] {
        // Place the producer index at `slot` with NOPs (1 WQEBB each), every one rung; `post` retires
        // earlier WQEs from the CQ when the 16-WQEBB ring is short of room.
        while qp.handle().sq.pi % 16 != slot {
            let _ = qp.post(false, wqe::nop()).unwrap();
            qp.ring_db();
        }
        dst.fill(0);
        let data = random_bytes(&mut rng, len);
        let off = rng.random_range(0..=LEN - len);
        let t = qp.post_write_inline(true, raddr(&rmr.remote(), off as u64), &data).unwrap();
        assert_eq!(t.0 % 16, slot);
        // The bytes in the ring: header + data start at byte 32 of `slot` and continue at slot 0.
        let ring: Vec<u8> = (0..16 * WQEBB)
            // SAFETY: the SQ ring is 16 WQEBBs of host queue memory owned by `p.a`; no one writes it now
            // (the doorbell is not rung yet).
            .map(|i| unsafe { ((sq_buf as usize + i) as *const u8).read_volatile() })
            .collect();
        let start = slot as usize * WQEBB;
        let wqe: Vec<u8> = ring[start..].iter().chain(&ring[..start]).copied().collect();
        assert_eq!(&wqe[32..36], &(len as u32 | 0x8000_0000).to_be_bytes(), "inline header");
        assert_eq!(&wqe[36..36 + len], &data[..], "inline data as laid out across the ring end");
        qp.wait(t).unwrap();
        assert_placed(&dst.read(), off, &data, 0, "wrapped inline write");
    }
    let s = p.nic.stats();
    assert_eq!((s.error_cqes, s.bad_doorbells, s.dbrec_mismatches), (0, 0, 0), "{s:?}");
}

#[test]
fn inline_write_rejects_empty_and_too_long_payloads_and_posts_nothing() {
    let dst = GuardedBuf::new(512, 0);
    let p = Pair::new(16, 16);
    let rmr = dst.register(&p.nic, &p.pd, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let mut h = p.a.handle();
    let mut qp = dev_qp(&mut h);
    let r = raddr(&rmr.remote(), 0);
    assert_eq!(qp.post_write_inline(true, r, &[]), inval(InvalidArgument::Length), "empty inline payload");
    assert_eq!(
        qp.post_write_inline(true, r, &[1u8; MAX_INLINE + 1]),
        Err(Error::InvalidArgument(InvalidArgument::InlineTooLong))
    );
    assert_eq!(
        qp.post_write_inline(true, r, &[1u8; 4096]),
        Err(Error::InvalidArgument(InvalidArgument::InlineTooLong))
    );
    assert_eq!((qp.handle().sq.pi, qp.handle().sq.sig_end), (0, 0), "a rejected write took SQ room");
    // Nothing pending either: a ring now sends no doorbell, and the next WQE gets index 0 and runs.
    qp.ring_db();
    let t = qp.post_write_inline(true, r, &[9u8; 5]).unwrap();
    assert_eq!(t, Ticket(0));
    qp.wait(t).unwrap();
    assert_eq!(&dst.read()[..6], &[9, 9, 9, 9, 9, 0]);
    let s = p.nic.stats();
    assert_eq!((s.doorbells, s.wqes), (1, 1), "{s:?}");
}

#[test]
fn blueflame_posts_a_write_and_an_atomic() {
    const LEN: usize = 2048;
    let mut rng = rng();
    let (src, dst) = (GuardedBuf::new(LEN, 0), GuardedBuf::new(LEN, 0));
    let (sem, result) = (GuardedBuf::new(8, 0), GuardedBuf::new(8, 0));
    let p = Pair::new(64, 64);
    let lmr = src.register(&p.nic, &p.pd, Access::NONE);
    let rmr = dst.register(&p.nic, &p.pd, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let sem_mr = sem.register(&p.nic, &p.pd, Access::LOCAL_WRITE | Access::REMOTE_ATOMIC);
    let res_mr = result.register(&p.nic, &p.pd, Access::LOCAL_WRITE);
    let mut h = p.a.handle();
    let mut qp = dev_qp(&mut h);
    let v0 = rng.random::<u64>();
    sem.write(0, &v0.to_ne_bytes());
    const ROUNDS: u64 = 8;
    for k in 0..ROUNDS {
        let len = rng.random_range(1..=LEN / 2);
        let data = random_bytes(&mut rng, len);
        src.write(0, &data);
        dst.fill(0);
        let t = qp.post_bf(true, wqe::rdma_write(raddr(&rmr.remote(), 0), sge(&lmr.handle(), 0, len as u32)));
        qp.wait(t.unwrap()).unwrap();
        assert_placed(&dst.read(), 0, &data, 0, "BlueFlame write");
        let add = rng.random_range(1..1000u64);
        let before = sem.load_u64(0);
        let t = qp.post_bf(
            true,
            wqe::atomic_fetch_add(raddr(&sem_mr.remote(), 0), sge(&res_mr.handle(), 0, 8), add).unwrap(),
        );
        qp.wait(t.unwrap()).unwrap();
        assert_eq!((result.u64_at(0), sem.load_u64(0)), (before, before.wrapping_add(add)), "BlueFlame fetch-add {k}");
    }
    // A BlueFlame post behind a WQE that was posted and never rung rings one doorbell for both.
    dst.fill(0);
    let data = random_bytes(&mut rng, LEN);
    src.write(0, &data);
    let half = (LEN / 2) as u32;
    let _ = qp.post(false, wqe::rdma_write(raddr(&rmr.remote(), 0), sge(&lmr.handle(), 0, half))).unwrap();
    let t = qp.post_bf(true, wqe::rdma_write(raddr(&rmr.remote(), half as u64), sge(&lmr.handle(), half as u64, half)));
    qp.wait(t.unwrap()).unwrap();
    assert_eq!(dst.read(), data, "unrung write + BlueFlame write");
    let s = p.nic.stats();
    // Every BlueFlame write is one doorbell; the unrung WQE added none. `wait` rang nothing more.
    assert_eq!(s.doorbells, 2 * ROUNDS + 1, "{s:?}");
    // Each write of the rounds was whole and the next WQE: taken from the register, equal to the ring's copy.
    // The last one is behind an unrung WQE: rung by doorbell, for both.
    assert_eq!((s.blueflame, s.blueflame_fallbacks, s.blueflame_mismatches), (2 * ROUNDS, 0, 0), "{s:?}");
    assert_eq!((s.wqes, s.error_cqes, s.dbrec_mismatches), (2 * ROUNDS + 2, 0, 0), "{s:?}");
}

// ---------------------------------------------------------------------------------------------------------
// Wrap-around of the SQ, the 16-bit WQE counter and the CQ
// ---------------------------------------------------------------------------------------------------------

#[test]
fn sq_wqe_counter_and_cq_wrap_over_seventy_thousand_wqebbs() {
    const SLOTS: usize = 16;
    const SLOT: usize = 256;
    const TARGET: u64 = 70_000;
    const _: () = assert!(TARGET > 1 << 16, "past the 16-bit wire index");
    let mut rng = rng();
    let (src, dst) = (GuardedBuf::new(SLOTS * SLOT, 0), GuardedBuf::new(SLOTS * SLOT, 0));
    // The smallest SQ and CQ: the ring wraps every 16 WQEBBs, the CQ every 16 CQEs.
    let p = Pair::new(16, 16);
    let lmr = src.register(&p.nic, &p.pd, Access::NONE);
    let rmr = dst.register(&p.nic, &p.pd, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let (local, remote) = (lmr.handle(), rmr.remote());
    let mut h = p.a.handle();
    let mut qp = dev_qp(&mut h);
    let mut want = vec![0u8; SLOTS * SLOT];
    let (mut ops, mut flushes) = (0u64, 0u64);
    while qp.handle().sq.pi < TARGET {
        // One window: an operation per destination slot (a put reads its source slot when the NIC runs it,
        // so a source slot is rewritten only after the flush that ends the window).
        for k in 0..SLOTS {
            let off = k * SLOT;
            match rng.random_range(0..3u32) {
                0 => {
                    let len = rng.random_range(1..=SLOT);
                    let data = random_bytes(&mut rng, len);
                    src.write(off, &data);
                    want[off..off + data.len()].copy_from_slice(&data);
                    qp.put(&remote, off as u64, &local, off as u64, data.len() as u64).unwrap();
                }
                1 => {
                    let len = rng.random_range(1..=MAX_INLINE);
                    let data = random_bytes(&mut rng, len);
                    want[off..off + data.len()].copy_from_slice(&data);
                    let _ = qp.post_write_inline(rng.random(), raddr(&remote, off as u64), &data).unwrap();
                    qp.ring_db();
                }
                _ => {
                    let _ = qp.post(false, wqe::nop()).unwrap();
                    qp.ring_db();
                }
            }
            ops += 1;
        }
        qp.flush().unwrap();
        flushes += 1;
        assert!(dst.read() == want, "after flush {flushes} (SQ pi {}): destination differs", qp.handle().sq.pi);
    }
    let hd = qp.handle();
    assert!(hd.sq.pi >= TARGET, "SQ pi {}", hd.sq.pi);
    // After the last flush the NIC consumed exactly what the device produced, the device retired it all, and
    // the device consumed every CQE the NIC wrote, many laps of the 16-entry CQ.
    assert_eq!(p.a.sq_consumed(), hd.sq.pi);
    assert!(hd.sq.ci > hd.sq.pi - 4, "SQ ci {} pi {}", hd.sq.ci, hd.sq.pi);
    // `produced` is stored just after the CQE itself: give the NIC thread a moment to get there.
    let t = Instant::now();
    while p.cq_a.produced() != hd.cq.cons_index && t.elapsed() < Duration::from_secs(10) {
        std::thread::yield_now();
    }
    assert_eq!(hd.cq.cons_index, p.cq_a.produced());
    assert!(hd.cq.cons_index > 64 * 16, "only {} CQEs", hd.cq.cons_index);
    assert!(!p.cq_a.is_error() && p.a.state() == QpState::Rts);
    let s = p.nic.stats();
    assert_eq!((s.error_cqes, s.flush_cqes, s.cq_overruns, s.bad_doorbells, s.dbrec_mismatches), (0, 0, 0, 0, 0));
    eprintln!("{ops} operations, {flushes} flushes, {} WQEBBs, {} CQEs", hd.sq.pi, hd.cq.cons_index);
}

// ---------------------------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------------------------

#[test]
fn put_with_a_bad_rkey_fails_with_0x13_and_then_everything_flushes() {
    const LEN: usize = 1024;
    let mut rng = rng();
    let (src, dst) = (GuardedBuf::new(LEN, 0), GuardedBuf::new(LEN, 0x44));
    let p = Pair::new(64, 64);
    let lmr = src.register(&p.nic, &p.pd, Access::NONE);
    let rmr = dst.register(&p.nic, &p.pd, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let mut h = p.a.handle();
    let mut qp = dev_qp(&mut h);
    src.write(0, &random_bytes(&mut rng, LEN));
    // A few good operations first, so that the failing WQE's index is not 0.
    let lead = rng.random_range(1..10u64);
    for _ in 0..lead {
        let _ = qp.post(false, wqe::nop()).unwrap();
    }
    qp.flush().unwrap();
    let bad_at = qp.handle().sq.pi;
    assert_eq!(bad_at, lead + 1, "NOPs plus the flush's own NOP");

    // An rkey whose variant byte differs: no MR has it.
    let bad = RemoteMr { rkey: Be32::new(rmr.rkey() ^ 0x5), ..rmr.remote() };
    qp.put(&bad, 0, &lmr.handle(), 0, LEN as u64).unwrap();
    assert_eq!(qp.flush(), Err(cqe_err(syndrome::REMOTE_ACCESS_ERR, vendor::BAD_RKEY, bad_at, qp.handle().qpn)));
    assert!(dst.read().iter().all(|&b| b == 0x44), "a failed put placed bytes");
    assert_eq!(p.a.state(), QpState::Error);

    // The QP is in the error state: flush and wait keep reporting the first error (sticky in the handle)...
    let first = cqe_err(syndrome::REMOTE_ACCESS_ERR, vendor::BAD_RKEY, bad_at, qp.handle().qpn);
    assert_eq!(qp.flush(), Err(first));
    // ...while the NIC completes every later WQE, good ones included, with WR_FLUSH_ERR: the flush's NOP
    // behind the failed put, then a put and a NOP posted now.
    let next = qp.handle().sq.pi;
    qp.put(&rmr.remote(), 0, &lmr.handle(), 0, LEN as u64).unwrap();
    let t = qp.post(true, wqe::nop()).unwrap();
    qp.ring_db();
    let mut seen = Vec::new();
    let t0 = Instant::now();
    while seen.len() < 3 && t0.elapsed() < Duration::from_secs(5) {
        match qp.poll_cq() {
            Some(r) => seen.push(r),
            None => std::thread::yield_now(),
        }
    }
    let qpn = p.a.qpn();
    let flushed = |at| Err(cqe_err(syndrome::WR_FLUSH_ERR, vendor::FLUSHED, at, qpn));
    assert_eq!(seen, [flushed(bad_at + 1), flushed(next), flushed(next + 1)]);
    assert_eq!(qp.wait(t), Err(first));
    assert_eq!(qp.wait(t), Err(first), "the error is sticky");
    assert!(dst.read().iter().all(|&b| b == 0x44), "a flushed put placed bytes");
    let s =
        emu_util::stats_when(&p.nic, "the error and flush CQEs counted", |s| s.error_cqes >= 1 && s.flush_cqes >= 3);
    assert_eq!((s.error_cqes, s.flush_cqes), (1, 3), "{s:?}");
}

#[test]
fn posts_that_fill_the_ring_unrung_still_complete() {
    // More unsignaled NOPs than the ring holds, never rung by the caller: reserving room must ring them
    // itself, or it waits for CQEs that cannot come.
    let p = Pair::new(16, 16);
    let mut h = p.a.handle();
    let mut qp = dev_qp(&mut h);
    for _ in 0..40 {
        let _ = qp.post(false, wqe::nop()).unwrap();
    }
    qp.flush().unwrap();
    assert_eq!(qp.handle().sq.ci, qp.handle().sq.pi);
    assert_eq!(p.a.sq_consumed(), qp.handle().sq.pi);
}

#[test]
fn waiting_on_an_unsignaled_ticket_asks_for_a_cqe() {
    let p = Pair::new(16, 16);
    let mut h = p.a.handle();
    let mut qp = dev_qp(&mut h);
    let t = qp.post(false, wqe::nop()).unwrap();
    qp.wait(t).unwrap();
    // The NOP itself and the signaled NOP `wait` added.
    assert_eq!(qp.handle().sq.pi, 2);
    assert!(qp.handle().sq.ci > t.0);
}

/// An error names the QP whose WQE failed, so that one failing connection among many is found: both QPs of a
/// pair post, only B's WQE has a bad rkey, and B's error (polled from the CQE, then read back as the sticky
/// error) carries B's QPN, not A's, through the launch report and into its message.
#[test]
fn an_error_cqe_names_its_qp() {
    let (src, dst) = (GuardedBuf::new(256, 0x21), GuardedBuf::new(256, 0));
    let p = Pair::new(16, 16);
    assert_ne!(p.a.qpn(), p.b.qpn());
    let lmr = src.register(&p.nic, &p.pd, Access::NONE);
    let rmr = dst.register(&p.nic, &p.pd, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let (mut ha, mut hb) = (p.a.handle(), p.b.handle());
    let (mut a, mut b) = (dev_qp(&mut ha), dev_qp(&mut hb));
    let _ = a.post(true, wqe::rdma_write(raddr(&rmr.remote(), 0), sge(&lmr.handle(), 0, 64))).unwrap();
    let bad_rkey = RemoteMr { rkey: Be32::new(rmr.rkey() ^ 0x5), ..rmr.remote() };
    let bad = b.post(true, wqe::rdma_write(raddr(&bad_rkey, 64), sge(&lmr.handle(), 0, 64))).unwrap();
    assert_eq!(a.flush(), Ok(()));
    let polled = b.flush().unwrap_err();
    let Error::Cqe(e) = polled else { panic!("{polled:?}") };
    assert_eq!((e.qpn, e.wqe_counter), (p.b.qpn(), bad.0 as u16));
    assert_eq!(b.error().map(|e| e.qpn), Some(p.b.qpn()), "the sticky error");
    let reported = Error::from_report(&polled.to_report()).unwrap();
    assert_eq!(reported, polled, "through a launch report");
    let text = reported.to_string();
    assert!(text.starts_with(&format!("error CQE on QP {:#x}: syndrome 0x13", p.b.qpn())), "{text}");
}

#[test]
fn an_error_is_sticky_whoever_polled_its_cqe() {
    let (src, dst) = (GuardedBuf::new(256, 0x21), GuardedBuf::new(256, 0));
    let p = Pair::new(16, 16);
    let lmr = src.register(&p.nic, &p.pd, Access::NONE);
    let rmr = dst.register(&p.nic, &p.pd, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let mut h = p.a.handle();
    let mut qp = dev_qp(&mut h);
    let good = qp.post(true, wqe::rdma_write(raddr(&rmr.remote(), 0), sge(&lmr.handle(), 0, 64))).unwrap();
    let bad_rkey = RemoteMr { rkey: Be32::new(rmr.rkey() ^ 0x5), ..rmr.remote() };
    let bad = qp.post(true, wqe::rdma_write(raddr(&bad_rkey, 0), sge(&lmr.handle(), 0, 64))).unwrap();
    let after = qp.post(true, wqe::nop()).unwrap();
    let first = cqe_err(syndrome::REMOTE_ACCESS_ERR, vendor::BAD_RKEY, bad.0, qp.handle().qpn);
    // Waiting on the last WQE consumes the error CQE; the failed WQE's own wait must still see it.
    assert_eq!(qp.wait(after), Err(first));
    assert_eq!(qp.wait(bad), Err(first));
    assert_eq!(qp.flush(), Err(first));
    // The WQE before the failure completed: its wait succeeds.
    assert_eq!(qp.wait(good), Ok(()));
    assert_eq!(
        qp.error(),
        Some(CqeError {
            syndrome: syndrome::REMOTE_ACCESS_ERR,
            vendor_err_synd: vendor::BAD_RKEY,
            wqe_counter: bad.0 as u16,
            qpn: qp.handle().qpn
        })
    );
    assert_eq!(&dst.read()[..64], &[0x21; 64][..]);
}

#[test]
fn bad_lkey_fails_with_0x04() {
    let (src, dst) = (GuardedBuf::new(256, 0x12), GuardedBuf::new(256, 0));
    let p = Pair::new(16, 16);
    let lmr = src.register(&p.nic, &p.pd, Access::NONE);
    let rmr = dst.register(&p.nic, &p.pd, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let mut h = p.a.handle();
    let mut qp = dev_qp(&mut h);
    qp.put(&rmr.remote(), 0, &lmr.handle(), 0, 256).unwrap();
    qp.flush().unwrap();
    assert!(dst.read().iter().all(|&b| b == 0x12));
    dst.fill(0);
    let at = qp.handle().sq.pi;
    let bad = MrHandle { lkey: Be32::new(lmr.lkey() ^ 0x5), ..lmr.handle() };
    qp.put(&rmr.remote(), 0, &bad, 0, 256).unwrap();
    assert_eq!(qp.flush(), Err(cqe_err(syndrome::LOCAL_PROT_ERR, vendor::BAD_LKEY, at, qp.handle().qpn)));
    assert!(dst.read().iter().all(|&b| b == 0), "a put with a bad lkey placed bytes");
}

#[test]
fn misaligned_atomic_built_by_hand_fails_with_0x12() {
    let target = GuardedBuf::new(16, 0);
    let result = GuardedBuf::new(8, 0x66);
    let p = Pair::new(16, 16);
    let tmr = target.register(&p.nic, &p.pd, Access::LOCAL_WRITE | Access::REMOTE_ATOMIC);
    let rmr = result.register(&p.nic, &p.pd, Access::LOCAL_WRITE);
    let mut h = p.a.handle();
    let mut qp = dev_qp(&mut h);
    // `signal` refuses the misaligned offset before posting ...
    let err = qp.signal(&tmr.remote(), 4, &rmr.handle(), 0);
    assert_eq!(err, Err(Error::InvalidArgument(InvalidArgument::AtomicAlignment)));
    assert_eq!(qp.handle().sq.pi, 0);
    // ... so build the WQE by hand: the NIC answers REMOTE_INVAL_REQ_ERR and touches nothing.
    // The builder refuses a misaligned target (`bad_input.rs` checks that); `post_raw` hands the NIC one.
    let (r, l) = (raddr(&tmr.remote(), 4), sge(&rmr.handle(), 0, 8));
    let segs = |c| {
        let mut s = wqe::atomic_fetch_add(Raddr { addr: r.addr & !7, ..r }, l, 1).unwrap().encode(c);
        s[1] = gdaki_shared::prm::wqe::RaddrSeg::new(r.addr, r.rkey).into();
        s
    };
    // SAFETY: a misaligned fetch-add, on purpose: the NIC must refuse it.
    let t = unsafe { qp.post_raw(true, 4, segs) }.unwrap();
    assert_eq!(t, Ticket(0));
    assert_eq!(qp.wait(t), Err(cqe_err(syndrome::REMOTE_INVAL_REQ_ERR, vendor::ATOMIC_ALIGN, 0, qp.handle().qpn)));
    assert!(target.read().iter().all(|&b| b == 0) && result.read().iter().all(|&b| b == 0x66));
}

#[test]
fn out_of_range_arguments_are_rejected_before_anything_is_posted() {
    const LEN: u64 = 4096;
    let (src, dst) = (GuardedBuf::new(LEN as usize, 0x21), GuardedBuf::new(LEN as usize, 0));
    let (sem, result) = (GuardedBuf::new(16, 0), GuardedBuf::new(16, 0));
    let p = Pair::new(16, 16);
    let lmr = src.register(&p.nic, &p.pd, Access::NONE);
    let rmr = dst.register(&p.nic, &p.pd, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let sem_mr = sem.register(&p.nic, &p.pd, Access::LOCAL_WRITE | Access::REMOTE_ATOMIC);
    let res_mr = result.register(&p.nic, &p.pd, Access::LOCAL_WRITE);
    let (l, r, s, res) = (lmr.handle(), rmr.remote(), sem_mr.remote(), res_mr.handle());
    let mut h = p.a.handle();
    let mut qp = dev_qp(&mut h);
    assert_eq!(qp.put(&r, 1, &l, 0, LEN), remote_range(1, LEN, LEN), "one byte past the remote MR");
    assert_eq!(qp.put(&r, LEN, &l, 0, 1), remote_range(LEN, 1, LEN), "starts at the remote end");
    assert_eq!(qp.put(&r, u64::MAX, &l, 0, 2), remote_range(u64::MAX, 2, LEN), "offset + len overflows");
    assert_eq!(qp.put(&r, 0, &l, 1, LEN), local_range(1, LEN, LEN), "one byte past the local MR");
    assert_eq!(qp.put(&r, 0, &l, u64::MAX, 2), local_range(u64::MAX, 2, LEN), "local offset overflows");
    assert_eq!(qp.put(&r, 0, &l, 0, 0), inval(InvalidArgument::Length), "zero bytes");
    assert_eq!(qp.put(&r, 0, &l, 0, 1 << 31), remote_range(0, 1 << 31, LEN), "remote is checked first");
    assert_eq!(qp.signal(&s, 9, &res, 0), remote_range(9, 8, 16), "semaphore past its MR");
    assert_eq!(qp.signal(&s, 0, &res, 12), local_range(12, 8, 16), "result past its MR");
    assert_eq!(qp.signal(&s, 0, &res, 4), inval(InvalidArgument::AtomicAlignment), "misaligned result");
    // A valid put with a bad signal: the put is not posted either.
    assert_eq!(qp.put_with_signal(&r, 0, &l, 0, 8, &s, 3, &res, 0), inval(InvalidArgument::AtomicAlignment));
    assert_eq!(qp.put_with_signal(&r, 1, &l, 0, LEN, &s, 0, &res, 0), remote_range(1, LEN, LEN));
    let hd = qp.handle();
    assert_eq!((hd.sq.pi, hd.sq.sig_end, hd.sq.sig_first), (0, 0, 0), "a rejected call took SQ room");
    qp.ring_db();
    std::thread::sleep(Duration::from_millis(5));
    let st = p.nic.stats();
    assert_eq!((st.doorbells, st.wqes), (0, 0), "the NIC saw work: {st:?}");
    assert!(dst.read().iter().all(|&b| b == 0) && sem.u64_at(0) == 0);
    // The QP is healthy: the largest valid put goes through, as WQE 0.
    qp.put(&r, 0, &l, 0, LEN).unwrap();
    qp.flush().unwrap();
    assert!(dst.read().iter().all(|&b| b == 0x21));
    let st = p.nic.stats();
    assert_eq!((st.wqes, st.error_cqes), (2, 0), "the put and the flush's NOP: {st:?}");
}

#[test]
fn put_to_a_peer_that_did_not_connect_back_fails_with_0x15() {
    let (src, dst) = (GuardedBuf::new(64, 1), GuardedBuf::new(64, 0));
    let nic = EmuNic::open(EmuConfig::host_or_env().unwrap()).unwrap();
    let pd = nic.alloc_pd().unwrap();
    let (cq_a, cq_b) = (nic.create_cq(16).unwrap(), nic.create_cq(16).unwrap());
    let a = nic.create_qp(&pd, &cq_a, 16).unwrap();
    let b = nic.create_qp(&pd, &cq_b, 16).unwrap();
    a.connect(&b.endpoint()).unwrap(); // b stays in RESET
    let lmr = src.register(&nic, &pd, Access::NONE);
    let rmr = dst.register(&nic, &pd, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let mut h = a.handle();
    let mut qp = dev_qp(&mut h);
    // A NOP needs no responder; the put does.
    let _ = qp.post(false, wqe::nop()).unwrap();
    qp.put(&rmr.remote(), 0, &lmr.handle(), 0, 64).unwrap();
    assert_eq!(qp.flush(), Err(cqe_err(syndrome::TRANSPORT_RETRY_EXC_ERR, vendor::NO_PEER, 1, qp.handle().qpn)));
    assert!(dst.read().iter().all(|&b| b == 0));
}

// ---------------------------------------------------------------------------------------------------------
// Timeouts
// ---------------------------------------------------------------------------------------------------------

#[test]
fn semaphore_wait_times_out_naming_the_semaphore() {
    let mut rng = rng();
    let sem = GuardedBuf::new(8, 0);
    let v = rng.random_range(0..u64::MAX / 2);
    sem.write(0, &v.to_ne_bytes());
    let bound = 20_000_000;
    let t0 = Instant::now();
    // SAFETY: `sem` is an 8-aligned word that lives for the whole wait.
    let r = unsafe { semaphore_ge(sem.addr() as *const u64, v + 1, bound) };
    let wall = t0.elapsed();
    let Err(Error::Timeout(Timeout { on, waited_ns })) = r else { panic!("expected a timeout, got {r:?}") };
    assert_eq!(on, WaitOn::Semaphore { addr: sem.addr(), expected: v + 1, seen: v });
    assert!(waited_ns >= bound, "waited {waited_ns} ns < {bound}");
    assert!(wall >= Duration::from_nanos(bound) && wall < Duration::from_secs(2), "wall time {wall:?}");
    let text = r.unwrap_err().to_string();
    for part in ["semaphore", &format!("{:#x}", sem.addr()), &format!("reach {}", v + 1), &format!("saw {v}")] {
        assert!(text.contains(part), "{text:?} lacks {part:?}");
    }
    // A value already reached returns at once, with the value seen.
    // SAFETY: as above.
    assert_eq!(unsafe { semaphore_ge(sem.addr() as *const u64, v, bound) }, Ok(v));
}

#[test]
fn waiting_on_a_qp_the_nic_never_runs_times_out_naming_the_cqe() {
    // A QP left in RESET: the NIC ignores its doorbells, as hardware does, so no CQE ever comes.
    let nic = EmuNic::open(EmuConfig::host_or_env().unwrap()).unwrap();
    let pd = nic.alloc_pd().unwrap();
    let cq = nic.create_cq(16).unwrap();
    let qp_emu = nic.create_qp(&pd, &cq, 16).unwrap();
    let mut h = qp_emu.handle();
    // SAFETY: the handle's memory is owned by `qp_emu` and `cq`, which outlive `qp`; this thread alone uses
    // it. The QP is not connected, which is the point: its WQEs are never executed.
    let mut qp = unsafe { DevQp::new(&mut h, 20_000_000) };
    let _ = qp.post(false, wqe::nop()).unwrap();
    let t = qp.post(true, wqe::nop()).unwrap();
    assert_eq!(t, Ticket(1));
    let t0 = Instant::now();
    let r = qp.wait(t);
    let Err(Error::Timeout(Timeout { on, waited_ns })) = r else { panic!("expected a timeout, got {r:?}") };
    assert_eq!(on, WaitOn::Cqe { qpn: qp_emu.qpn(), wqe_index: 1 });
    assert!(waited_ns >= 20_000_000 && t0.elapsed() < Duration::from_secs(2), "waited {waited_ns} ns");
    let text = r.unwrap_err().to_string();
    assert!(text.contains(&format!("CQE of WQE 1 on QP {:#x}", qp_emu.qpn())), "{text:?}");
    assert_eq!(qp_emu.sq_consumed(), 0);
    assert_eq!(cq.produced(), 0);

    // Posting until the ring is full: the next WQE finds no room, and the error says how much it wanted.
    while qp.handle().sq.pi < 13 {
        let _ = qp.post(false, wqe::nop()).unwrap();
    }
    let r = qp.post_write_inline(false, Raddr { addr: 0x1000, rkey: Be32::new(1) }, &[0u8; MAX_INLINE]);
    let Err(Error::Timeout(Timeout { on, waited_ns })) = r else { panic!("expected a timeout, got {r:?}") };
    assert_eq!(on, WaitOn::SqSpace { qpn: qp_emu.qpn(), wqebbs: 4 });
    assert!(waited_ns >= 20_000_000);
    assert!(r.unwrap_err().to_string().contains("4 free WQEBBs"));
    assert_eq!(qp.handle().sq.pi, 13, "a WQE that found no room changed the producer index");
    assert_eq!(nic.stats().doorbells, 0);
}

// ---------------------------------------------------------------------------------------------------------
// Error reports (what a kernel hands the host)
// ---------------------------------------------------------------------------------------------------------

fn wait_on() -> impl Strategy<Value = WaitOn> {
    prop_oneof![
        (any::<u32>(), any::<u64>()).prop_map(|(qpn, wqe_index)| WaitOn::Cqe { qpn, wqe_index }),
        (any::<u32>(), any::<u32>()).prop_map(|(qpn, wqebbs)| WaitOn::SqSpace { qpn, wqebbs }),
        (any::<u32>(), any::<u64>()).prop_map(|(qpn, wqe_index)| WaitOn::Publish { qpn, wqe_index }),
        any::<u64>().prop_map(|index| WaitOn::FifoSpace { index }),
        (any::<u64>(), any::<u64>()).prop_map(|(index, done)| WaitOn::Proxy { index, done }),
        (any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(addr, expected, seen)| WaitOn::Semaphore {
            addr,
            expected,
            seen
        }),
        (any::<u64>(), any::<u32>(), any::<u32>()).prop_map(|(addr, flag, seen)| WaitOn::Packet { addr, flag, seen }),
        (any::<u32>(), any::<u64>(), any::<u64>()).prop_map(|(rank, expected, seen)| WaitOn::Peer {
            rank,
            expected,
            seen
        }),
        (any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(addr, expected, seen)| WaitOn::GroupAck {
            addr,
            expected,
            seen
        }),
        (any::<u64>(), any::<u32>(), any::<u32>()).prop_map(|(addr, ticket, serving)| WaitOn::Turn {
            addr,
            ticket,
            serving
        }),
    ]
}

fn invalid_argument() -> impl Strategy<Value = InvalidArgument> {
    prop_oneof![
        Just(InvalidArgument::InlineTooLong),
        Just(InvalidArgument::AtomicAlignment),
        Just(InvalidArgument::Length),
        Just(InvalidArgument::Ticket),
        Just(InvalidArgument::Handle),
        Just(InvalidArgument::Unsupported),
        Just(InvalidArgument::Packet),
        Just(InvalidArgument::Team),
        Just(InvalidArgument::Collective),
        Just(InvalidArgument::Value),
        Just(InvalidArgument::Counter),
        Just(InvalidArgument::TeamRules),
        Just(InvalidArgument::Sharing),
        Just(InvalidArgument::Posters),
        Just(InvalidArgument::WqeSize),
        Just(InvalidArgument::Batch),
        Just(InvalidArgument::Regions),
        Just(InvalidArgument::Bound),
    ]
}

fn any_error() -> impl Strategy<Value = Error> {
    prop_oneof![
        (any::<u8>(), any::<u8>(), any::<u16>(), 0..1u32 << 24).prop_map(
            |(syndrome, vendor_err_synd, wqe_counter, qpn)| Error::Cqe(CqeError {
                syndrome,
                vendor_err_synd,
                wqe_counter,
                qpn
            })
        ),
        (wait_on(), any::<u64>()).prop_map(|(on, waited_ns)| Error::Timeout(Timeout { on, waited_ns })),
        (any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(iter, offset, expected, seen)| {
            Error::Payload(PayloadMismatch { iter, offset, expected, seen })
        }),
        invalid_argument().prop_map(Error::InvalidArgument),
        (any::<bool>(), any::<u64>(), any::<u64>(), any::<u64>())
            .prop_map(|(remote, offset, bytes, length)| { Error::Range(RangeError { remote, offset, bytes, length }) }),
        (any::<u32>().prop_map(|q| q & 0xff_ffff), any::<u16>())
            .prop_map(|(qpn, wqe_counter)| Error::UnexpectedCqe(UnexpectedCqe { qpn, wqe_counter })),
        (any::<u32>(), any::<u64>()).prop_map(|(code, value)| Error::App(AppError { code, value })),
        (any::<u32>(), any::<bool>()).prop_map(|(rank, broken)| Error::PeerGone(PeerGone { rank, broken })),
    ]
}

/// The report's `kind` for `e`, from the documented codes (not from `to_report`).
fn expected_kind(e: &Error) -> u32 {
    match e {
        Error::Cqe(_) => kind::CQE,
        Error::Timeout(Timeout { on: WaitOn::Cqe { .. }, .. }) => kind::TIMEOUT_CQE,
        Error::Timeout(Timeout { on: WaitOn::SqSpace { .. }, .. }) => kind::TIMEOUT_SQ_SPACE,
        Error::Timeout(Timeout { on: WaitOn::Semaphore { .. }, .. }) => kind::TIMEOUT_SEMAPHORE,
        Error::Timeout(Timeout { on: WaitOn::Publish { .. }, .. }) => kind::TIMEOUT_PUBLISH,
        Error::Timeout(Timeout { on: WaitOn::FifoSpace { .. }, .. }) => kind::TIMEOUT_FIFO_SPACE,
        Error::Timeout(Timeout { on: WaitOn::Proxy { .. }, .. }) => kind::TIMEOUT_PROXY,
        Error::Timeout(Timeout { on: WaitOn::Packet { .. }, .. }) => kind::TIMEOUT_PACKET,
        Error::Timeout(Timeout { on: WaitOn::Peer { .. }, .. }) => 13,
        Error::Timeout(Timeout { on: WaitOn::GroupAck { .. }, .. }) => 14,
        Error::Timeout(Timeout { on: WaitOn::Turn { .. }, .. }) => 16,
        Error::Payload(_) => kind::PAYLOAD,
        Error::InvalidArgument(InvalidArgument::Team) => 15,
        Error::InvalidArgument(_) => kind::INVALID_ARGUMENT,
        Error::Range(_) => 18,
        Error::UnexpectedCqe(_) => kind::UNEXPECTED_CQE,
        Error::App(_) => 12,
        Error::PeerGone(_) => 17,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn error_reports_round_trip(e in any_error()) {
        let r = e.to_report();
        prop_assert_eq!(r.kind, expected_kind(&e));
        prop_assert_ne!(r.kind, kind::NONE);
        prop_assert_eq!(Error::from_report(&r), Some(e));
        // The report survives the bytes the host reads back.
        let bytes = bytemuck::bytes_of(&r).to_vec();
        let back: ErrorReport = bytemuck::pod_read_unaligned(&bytes);
        prop_assert_eq!(Error::from_report(&back), Some(e));
        // Each message names what went wrong.
        let text = e.to_string();
        let part = match e {
            Error::Cqe(c) => format!("syndrome {:#04x}", c.syndrome),
            Error::Timeout(Timeout { on: WaitOn::Cqe { qpn, wqe_index }, .. }) => {
                format!("CQE of WQE {wqe_index} on QP {qpn:#x}")
            }
            Error::Timeout(Timeout { on: WaitOn::SqSpace { qpn, wqebbs }, .. }) => {
                format!("{wqebbs} free WQEBBs in the SQ of QP {qpn:#x}")
            }
            Error::Timeout(Timeout { on: WaitOn::Semaphore { addr, .. }, .. }) => format!("semaphore {addr:#x}"),
            Error::Timeout(Timeout { on: WaitOn::Publish { qpn, wqe_index }, .. }) => {
                format!("on QP {qpn:#x} to publish up to WQE {wqe_index}")
            }
            Error::Timeout(Timeout { on: WaitOn::FifoSpace { index }, .. }) => format!("FIFO for trigger {index}"),
            Error::Timeout(Timeout { on: WaitOn::Proxy { index, done }, .. }) => {
                format!("trigger {index} (it had done {done})")
            }
            Error::Timeout(Timeout { on: WaitOn::Packet { addr, flag, seen }, .. }) => {
                format!("LL packet at {addr:#x} to carry flag {flag} (saw {seen})")
            }
            Error::Timeout(Timeout { on: WaitOn::Peer { rank, .. }, .. }) => format!("waiting for rank {rank} "),
            Error::Timeout(Timeout { on: WaitOn::GroupAck { addr, .. }, .. }) => {
                format!("group acknowledgment at {addr:#x}")
            }
            Error::Timeout(Timeout { on: WaitOn::Turn { addr, ticket, serving }, .. }) => {
                format!("warp QP at {addr:#x} (ticket {ticket}, serving {serving}")
            }
            Error::Payload(p) => format!("iteration {} at byte {}", p.iter, p.offset),
            Error::InvalidArgument(a) => format!("{a:?}"),
            Error::Range(r) => {
                let whose = if r.remote { "the peer's" } else { "its" };
                let (bytes, offset, length) = (r.bytes, r.offset, r.length);
                let (at, memory) = (format!("{bytes} bytes at offset {offset}"), format!("{whose} registered memory"));
                if offset.checked_add(bytes).is_some_and(|end| end <= length) {
                    format!("{at} of {memory} of {length} bytes has an address past 2^64")
                } else {
                    format!("{at} lies outside {memory} of {length} bytes")
                }
            }
            Error::UnexpectedCqe(u) => format!("QPN {:#x}, WQE index {}", u.qpn, u.wqe_counter),
            Error::App(a) => format!("application error {} (value {})", a.code, a.value),
            Error::PeerGone(PeerGone { rank, broken: false }) => format!("rank {rank} left the session"),
            Error::PeerGone(PeerGone { rank, broken: true }) => {
                format!("the bootstrap session broke while waiting for rank {rank} ")
            }
        };
        prop_assert!(text.contains(&part), "{:?} lacks {:?}", text, part);
    }

    #[test]
    fn reports_of_no_error_or_unknown_kinds_are_none(k in prop_oneof![Just(0u32), 19u32..]) {
        let r = ErrorReport { kind: k, syndrome: 0x13, expected: 5, ..ErrorReport::default() };
        prop_assert_eq!(Error::from_report(&r), None);
    }
}

#[test]
fn invalid_argument_codes_are_the_documented_ones() {
    // Every variant with the code the host decodes `expected` of an INVALID_ARGUMENT report (kind 6) with,
    // and its message: a literal table, not derived from the enum. The match in the loop is exhaustive, so a
    // variant added to `InvalidArgument` does not compile until it is listed there, next to this table.
    let table = [
        (InvalidArgument::InlineTooLong, 3u64, "invalid argument: InlineTooLong"),
        (InvalidArgument::AtomicAlignment, 4, "invalid argument: AtomicAlignment"),
        (InvalidArgument::Length, 5, "invalid argument: Length"),
        (InvalidArgument::Ticket, 6, "invalid argument: Ticket"),
        (InvalidArgument::Handle, 7, "invalid argument: Handle"),
        (InvalidArgument::Packet, 8, "invalid argument: Packet"),
        (InvalidArgument::Unsupported, 9, "invalid argument: Unsupported"),
        (InvalidArgument::Team, 11, "invalid argument: Team"),
        (InvalidArgument::Collective, 12, "invalid argument: Collective"),
        (InvalidArgument::Value, 13, "invalid argument: Value"),
        (InvalidArgument::Counter, 14, "invalid argument: Counter"),
        (InvalidArgument::TeamRules, 15, "invalid argument: TeamRules"),
        (InvalidArgument::Sharing, 16, "invalid argument: Sharing"),
        (InvalidArgument::Posters, 17, "invalid argument: Posters"),
        (InvalidArgument::WqeSize, 18, "invalid argument: WqeSize"),
        (InvalidArgument::Batch, 19, "invalid argument: Batch"),
        (InvalidArgument::Regions, 20, "invalid argument: Regions"),
        (InvalidArgument::Bound, 21, "invalid argument: Bound"),
    ];
    assert_eq!(kind::INVALID_ARGUMENT, 6);
    for (a, code, message) in table {
        match a {
            InvalidArgument::InlineTooLong
            | InvalidArgument::AtomicAlignment
            | InvalidArgument::Length
            | InvalidArgument::Ticket
            | InvalidArgument::Handle
            | InvalidArgument::Packet
            | InvalidArgument::Unsupported
            | InvalidArgument::Team
            | InvalidArgument::Collective
            | InvalidArgument::Value
            | InvalidArgument::Counter
            | InvalidArgument::TeamRules
            | InvalidArgument::Sharing
            | InvalidArgument::Posters
            | InvalidArgument::WqeSize
            | InvalidArgument::Batch
            | InvalidArgument::Regions
            | InvalidArgument::Bound => {}
        }
        // Packing: the report the device writes (Team alone in the kind word, kind 15, so that a launch's
        // report of it can be replaced by its cause).
        let literal = if a == InvalidArgument::Team {
            ErrorReport { kind: 15, ..ErrorReport::default() }
        } else {
            ErrorReport { kind: 6, expected: code, ..ErrorReport::default() }
        };
        let r = Error::InvalidArgument(a).to_report();
        assert_eq!(r, literal, "{a:?}");
        // Unpacking: a report built here from the literal code, as the host reads it.
        let from_host = literal;
        assert_eq!(Error::from_report(&from_host), Some(Error::InvalidArgument(a)), "code {code}");
        // The message: the variant's name, then what it means.
        assert_eq!(Error::InvalidArgument(a).to_string(), format!("{message} ({})", a.describe()), "{a:?}");
    }
    // Each code's description is its own.
    let mut described: Vec<&str> = table.iter().map(|&(a, _, _)| a.describe()).collect();
    described.sort_unstable();
    described.dedup();
    assert_eq!(described.len(), table.len(), "two codes described alike");
    // One message in full, as a kernel's error reads on the host.
    assert_eq!(
        Error::InvalidArgument(InvalidArgument::Posters).to_string(),
        "invalid argument: Posters (two posters of one QP at once: a second Exclusive Qp of the handle, or an \
         Exclusive Qp and a shared poster's call)"
    );
    // The eighteen codes are 3..=21 but 10 (retired, as are 1 and 2, the ranges that are `Error::Range` now),
    // each once; as kind 6, those, 11 (Team, which has a kind of its own) and the codes around them decode to
    // nothing.
    let mut codes: Vec<u64> = table.iter().map(|&(_, c, _)| c).collect();
    codes.sort_unstable();
    assert_eq!(codes, (3..=21).filter(|&c| c != 10).collect::<Vec<u64>>());
    for code in [0u64, 1, 2, 10, 11, 22, 23, u32::MAX as u64, u64::MAX] {
        let r = ErrorReport { kind: 6, expected: code, ..ErrorReport::default() };
        assert_eq!(Error::from_report(&r), None, "code {code} is no InvalidArgument");
    }
}

/// A range error's report, word by word as documented (kind 18; `addr` the offset, `seen` the bytes, `expected`
/// the memory's length, `detail` 1 for the peer's memory), built here by hand; a `detail` other than 0 or 1
/// decodes to nothing; and its message in full.
#[test]
fn range_reports_are_the_documented_words() {
    let words = ErrorReport { kind: 18, addr: 4088, seen: 16, expected: 4096, detail: 1, ..ErrorReport::default() };
    let remote = Error::Range(RangeError { remote: true, offset: 4088, bytes: 16, length: 4096 });
    assert_eq!(remote.to_report(), words);
    assert_eq!(Error::from_report(&words), Some(remote));
    let local = ErrorReport { detail: 0, ..words };
    assert_eq!(
        Error::from_report(&local),
        Some(Error::Range(RangeError { remote: false, offset: 4088, bytes: 16, length: 4096 }))
    );
    assert_eq!(Error::from_report(&ErrorReport { detail: 2, ..words }), None);
    // A range inside the length whose address passed 2^64 (a wrong handle address) says so.
    let wrapped = Error::Range(RangeError { remote: false, offset: 32, bytes: 8, length: 64 });
    assert_eq!(
        wrapped.to_string(),
        "local range of 8 bytes at offset 32 of its registered memory of 64 bytes has an address past 2^64 (the \
         handle's address is wrong; nothing was posted)"
    );
    assert_eq!(
        remote.to_string(),
        "remote range of 16 bytes at offset 4088 lies outside the peer's registered memory of 4096 bytes (nothing \
         was posted)"
    );
}

// ---------------------------------------------------------------------------------------------------------
// A QP owned by a warp (on the host a thread is a warp of one lane: each post is its own batch)
// ---------------------------------------------------------------------------------------------------------

#[test]
fn a_warp_qp_posts_rings_once_per_batch_and_reports_errors() {
    use gdaki_device::warp_qp::WarpQp;
    const SLOT: usize = 512;
    const POSTS: usize = 200;
    let mut rng = rng();
    let (src, dst) = (GuardedBuf::new(SLOT * 8, 0), GuardedBuf::new(SLOT * 8, 0));
    let p = Pair::new(64, 64);
    let lmr = src.register(&p.nic, &p.pd, Access::NONE);
    let rmr = dst.register(&p.nic, &p.pd, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let mut h = p.a.handle();
    // SAFETY: `p.a`'s handle, alive for the test; this thread is the warp that owns it.
    let mut qp = unsafe { WarpQp::new(&mut h, TIMEOUT_NS) };
    let mut want = vec![0u8; SLOT * 8];
    // More posts than the ring holds, so the batches wrap it and retire through the quarter-ring CQEs.
    for k in 0..POSTS {
        let (slot, len) = (k % 8, rng.random_range(1..=SLOT));
        let data = random_bytes(&mut rng, len);
        src.write(slot * SLOT, &data);
        want[slot * SLOT..slot * SLOT + len].copy_from_slice(&data);
        let off = (slot * SLOT) as u64;
        let t = qp.post(true, wqe::rdma_write(raddr(&rmr.remote(), off), sge(&lmr.handle(), off, len as u32)));
        qp.wait(t.unwrap()).unwrap();
        assert_eq!(&dst.read()[slot * SLOT..slot * SLOT + len], &data[..], "post {k}");
    }
    qp.flush().unwrap();
    assert_eq!(dst.read(), want);
    let s = p.nic.stats();
    assert_eq!((s.doorbells, s.wqes, s.error_cqes), (POSTS as u64, POSTS as u64, 0), "one doorbell per batch: {s:?}");
    // A bad rkey: the error CQE reaches `flush` and `error`, and stays.
    let mut bad = rmr.remote();
    bad.rkey = Be32::new(bad.rkey.get() ^ 0x100);
    let _ = qp.post(false, wqe::rdma_write(raddr(&bad, 0), sge(&lmr.handle(), 0, 8))).unwrap();
    let e = qp.flush().unwrap_err();
    assert!(matches!(e, Error::Cqe(c) if c.syndrome == syndrome::REMOTE_ACCESS_ERR), "{e:?}");
    assert_eq!(qp.error().map(|c| c.syndrome), Some(syndrome::REMOTE_ACCESS_ERR));
    assert!(matches!(qp.flush(), Err(Error::Cqe(_))), "sticky");
}

#[test]
fn blueflame_on_a_doorbell_only_uar_rings_by_doorbell() {
    let mut rng = rng();
    let (src, dst) = (GuardedBuf::new(64, 0), GuardedBuf::new(64, 0));
    // A NIC whose UAR pages have no BlueFlame buffer, as `mlx5dv_qp.bf.size` 0 says; it fails a QP on a
    // BlueFlame write, so the doorbell below is the only way this test passes.
    let p = Pair::with_config(
        gdaki::nic::emu::EmuConfig { blueflame: false, ..gdaki::nic::emu::EmuConfig::host() },
        64,
        64,
    );
    let lmr = src.register(&p.nic, &p.pd, Access::NONE);
    let rmr = dst.register(&p.nic, &p.pd, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let mut h = p.a.handle();
    assert_eq!(h.bf_size, 0, "a doorbell-only UAR");
    let mut qp = dev_qp(&mut h);
    let data = random_bytes(&mut rng, 64);
    src.write(0, &data);
    let t = qp.post_bf(true, wqe::rdma_write(raddr(&rmr.remote(), 0), sge(&lmr.handle(), 0, 64)));
    qp.wait(t.unwrap()).unwrap();
    assert_eq!(dst.read(), data);
    let s = p.nic.stats();
    assert_eq!((s.doorbells, s.blueflame, s.blueflame_fallbacks), (1, 0, 0), "an 8-byte doorbell: {s:?}");
}

// ---------------------------------------------------------------------------------------------------------
// One send-queue state: every kind of poster (`Qp`, `WarpQp`, `SharedQp` of either scope) keeps the handle's
// `SqState`, so any may follow any other on a QP
// ---------------------------------------------------------------------------------------------------------

/// A Block- or Device-scope shared poster on `h`.
///
/// # Safety
/// `h` is a live QP's handle, used by this thread only while the poster lives.
unsafe fn shared_qp<S: Scope>(h: *mut QpHandle) -> SharedQp<'static, S> {
    // SAFETY: the caller's contract; the queues are host memory (the `cpu` executor).
    unsafe { SharedQp::new(h, TIMEOUT_NS) }
}

/// One QP's posting side for the sharing tests: 64-byte slots of a random source, a destination filled
/// with 0xee, a handle where device code keeps it. Field order is drop order: the MRs
/// before the NIC's PD, the memory last.
struct Slots {
    _mrs: (gdaki::nic::emu::Mr, gdaki::nic::emu::Mr),
    p: Pair,
    src: GuardedBuf,
    dst: GuardedBuf,
    local: MrHandle,
    remote: RemoteMr,
    h: Box<QpHandle>,
}

impl Slots {
    const SLOT: usize = 64;

    fn new(slots: usize) -> Self {
        let mut rng = rng();
        let (src, dst) = (GuardedBuf::new(slots * Self::SLOT, 0), GuardedBuf::new(slots * Self::SLOT, 0xee));
        src.write(0, &random_bytes(&mut rng, slots * Self::SLOT));
        let p = Pair::new(64, 64);
        let lmr = src.register(&p.nic, &p.pd, Access::NONE);
        let rmr = dst.register(&p.nic, &p.pd, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
        let h = Box::new(p.a.handle());
        let (local, remote) = (lmr.handle(), rmr.remote());
        Slots { p, src, dst, local, remote, h, _mrs: (lmr, rmr) }
    }

    /// The RDMA WRITE of slot `k`.
    fn write(&self, k: usize) -> gdaki_device::wqe::Wqe<3> {
        let off = (k * Self::SLOT) as u64;
        wqe::rdma_write(raddr(&self.remote, off), sge(&self.local, off, Self::SLOT as u32))
    }

    /// Whether slot `k` of the destination holds the source's bytes (true) or is untouched (false); panics
    /// on anything else.
    fn placed(&self, k: usize) -> bool {
        let r = k * Self::SLOT..(k + 1) * Self::SLOT;
        let got = &self.dst.read()[r.clone()];
        if got == &self.src.read()[r] {
            return true;
        }
        assert!(got.iter().all(|&b| b == 0xee), "slot {k} is neither placed nor untouched");
        false
    }

    /// Posts slot `k` through an Exclusive `Qp` of the handle and flushes, then drops the `Qp`.
    fn exclusive(&mut self, k: usize) -> Result<(), Error> {
        let w = self.write(k);
        let mut qp = dev_qp(&mut self.h);
        let _ = qp.post(false, w)?;
        qp.flush()
    }

    /// Posts slot `k` through a `WarpQp` of the handle (this thread is a warp of one lane) and flushes.
    fn warp(&mut self, k: usize) -> Result<(), Error> {
        // SAFETY: the live pair's handle, used by this thread only.
        let mut wq = unsafe { gdaki_device::warp_qp::WarpQp::new(&mut *self.h, TIMEOUT_NS) };
        let _ = wq.post(false, self.write(k))?;
        wq.flush()
    }

    /// Posts slot `k` through a shared poster of scope `S` on the handle, and flushes.
    fn shared<S: Scope>(&mut self, k: usize) -> Result<(), Error> {
        // SAFETY: the live pair's handle, used by this thread only.
        let qp = unsafe { shared_qp::<S>(&mut *self.h) };
        let _ = qp.post(true, self.write(k))?;
        qp.flush()
    }

    /// Waits a little, so that every doorbell rung has been acted on, and returns the NIC's doorbells,
    /// executed WQEs and consumed WQEBBs.
    fn nic_work(&self) -> (u64, u64, u64) {
        std::thread::sleep(Duration::from_millis(20));
        let s = self.p.nic.stats();
        assert_eq!((s.error_cqes, s.flush_cqes, s.stale_doorbells, s.bad_doorbells), (0, 0, 0, 0), "{s:?}");
        (s.doorbells, s.wqes, self.p.a.sq_consumed())
    }
}

#[test]
fn posters_of_one_side_follow_each_other_on_a_qp() {
    use gdaki_device::warp_qp::WarpQp;
    // Exclusive: two `Qp`s one after the other, then a `WarpQp`, each continuing the counters of the last.
    let mut q = Slots::new(8);
    q.exclusive(0).unwrap();
    q.exclusive(1).unwrap();
    // SAFETY: the live pair's handle, used by this thread (a warp of one lane) only.
    let mut wq = unsafe { WarpQp::new(&mut *q.h, TIMEOUT_NS) };
    let _ = wq.post(true, q.write(2)).unwrap();
    wq.flush().unwrap();
    assert!((0..3).all(|k| q.placed(k)));
    let (doorbells, wqes, consumed) = q.nic_work();
    assert_eq!((wqes, consumed), (5, 5), "three WRITEs and the two flushes' NOPs ({doorbells} doorbells)");
    assert_eq!((q.h.sq.pi, q.h.sq.ci), (5, 5), "every post continued the last one's counters");

    // Shared: Block, then Device, then Block again, on one handle and state.
    let mut q = Slots::new(8);
    q.shared::<Block>(0).unwrap();
    q.shared::<Device>(1).unwrap();
    q.shared::<Block>(2).unwrap();
    assert!((0..3).all(|k| q.placed(k)));
    let (_, wqes, consumed) = q.nic_work();
    assert_eq!((wqes, consumed, q.h.sq.pi, q.h.sq.ci), (3, 3, 3, 3), "every post continued the last one's");
}

/// Every kind of poster after every other, in a random order, for more than two turns of the 64-WQEBB ring:
/// each continues the one send-queue state where the last left it, so every WRITE lands and the NIC sees no
/// stale or bad doorbell and no error CQE.
#[test]
fn posters_of_every_kind_follow_each_other_on_a_qp() {
    let mut rng = rng();
    let mut q = Slots::new(16);
    let mut kinds = [0u32; 4];
    for k in 0..120 {
        let slot = k % 16;
        let kind = rng.random_range(0..4u32);
        kinds[kind as usize] += 1;
        let r = match kind {
            0 => q.exclusive(slot),
            1 => q.warp(slot),
            2 => q.shared::<Block>(slot),
            _ => q.shared::<Device>(slot),
        };
        r.unwrap_or_else(|e| panic!("post {k} by poster kind {kind}: {e}"));
        assert!(q.placed(slot), "post {k} by poster kind {kind}");
    }
    let (_, wqes, consumed) = q.nic_work();
    let st = q.h.sq;
    assert!(consumed > 2 * 64, "the ring turned over twice: {consumed} WQEBBs ({kinds:?})");
    assert_eq!((wqes, st.pi, st.ready, st.ci, st.rung), (consumed, consumed, consumed, consumed, consumed), "{st:?}");
}

/// `PeerGone` as the report carries it, from literal words: kind 17, the rank in `addr`, `expected` 1 when the
/// session broke and 0 when the peer left; any other `expected`, or a rank past 32 bits, decodes to nothing.
#[test]
fn peer_gone_reports_are_the_documented_ones() {
    assert_eq!(kind::PEER_GONE, 17);
    for (rank, broken, expected) in [(0u32, false, 0u64), (7, true, 1), (u32::MAX, false, 0)] {
        let literal = ErrorReport { kind: 17, addr: rank as u64, expected, ..ErrorReport::default() };
        let e = Error::PeerGone(PeerGone { rank, broken });
        assert_eq!(e.to_report(), literal);
        assert_eq!(Error::from_report(&literal), Some(e));
    }
    assert_eq!(
        Error::PeerGone(PeerGone { rank: 3, broken: false }).to_string(),
        "rank 3 left the session before what was awaited from it came"
    );
    for (addr, expected) in [(1u64, 2u64), (1, u64::MAX), (u32::MAX as u64 + 1, 0)] {
        let r = ErrorReport { kind: 17, addr, expected, ..ErrorReport::default() };
        assert_eq!(Error::from_report(&r), None, "addr {addr}, expected {expected}");
    }
}
