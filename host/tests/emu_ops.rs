//! The emulated NIC executes RDMA operations as a user drives them: WQE bytes in the SQ ring, dbrec, doorbell;
//! completions polled from the CQ ring. Payloads are random and checked byte for byte.

mod emu_util;

use emu_util::*;
use gdaki::nic::emu::{Access, QpState};
use gdaki_shared::prm::opcode;
use gdaki_shared::prm::wqe::{AtomicSeg, DataSeg, RaddrSeg, Seg};
use gdaki_shared::Be32;
use rand::RngExt;

#[test]
fn rdma_write_places_random_payloads_and_nothing_else() {
    let mut rng = rng();
    let p = Pair::new(64, 64);
    let (mut sq, mut cq) = (Sq::new(&p.a), CqPoll::new(&p.cq_a));
    let src = GuardedBuf::new(70_000, 0);
    let dst = GuardedBuf::new(70_000, 0xee);
    let (lmr, rmr) = (src.register(&p.nic, &p.pd, Access::NONE), dst.register(&p.nic, &p.pd, Access::ALL));
    for len in [1usize, 7, 8, 63, 64, 4096, 4097, 65_536, 69_999] {
        dst.fill(0xee);
        let payload = random_bytes(&mut rng, len);
        let (soff, doff) = (rng.random_range(0..=70_000 - len), rng.random_range(0..=70_000 - len));
        src.write(soff, &payload);
        let wqe = sq.write(
            SIGNALED,
            (lmr.lkey(), src.addr() + soff as u64, len as u32),
            dst.addr() + doff as u64,
            rmr.rkey(),
        );
        let at = sq.post(&wqe);
        let c = cq.wait();
        assert_req(&c, opcode::RDMA_WRITE, sq.qpn(), at, 0);
        let got = dst.read();
        assert_eq!(&got[doff..doff + len], &payload[..], "payload of {len} bytes");
        assert!(got[..doff].iter().chain(&got[doff + len..]).all(|&b| b == 0xee), "bytes outside the target");
        assert!(dst.guards_intact() && src.guards_intact());
    }
    assert_eq!(p.nic.stats().wqes, 9);
    assert_eq!(p.nic.stats().dbrec_mismatches, 0);
}

#[test]
fn rdma_write_gathers_several_sges_in_order() {
    let mut rng = rng();
    let p = Pair::new(64, 64);
    let (mut sq, mut cq) = (Sq::new(&p.a), CqPoll::new(&p.cq_a));
    let src = GuardedBuf::new(4096, 0);
    let dst = GuardedBuf::new(4096, 0);
    let (lmr, rmr) = (
        src.register(&p.nic, &p.pd, Access::NONE),
        dst.register(&p.nic, &p.pd, Access::REMOTE_WRITE | Access::LOCAL_WRITE),
    );
    let data = random_bytes(&mut rng, 4096);
    src.write(0, &data);
    // Three pieces gathered out of order from the source: [3000..3100), [0..17), [1000..1500).
    let pieces = [(3000u64, 100u32), (0, 17), (1000, 500)];
    let mut segs: Vec<Seg> =
        vec![sq.ctrl(opcode::RDMA_WRITE, SIGNALED, 5, 0), RaddrSeg::new(dst.addr() + 5, Be32::new(rmr.rkey())).into()];
    segs.extend(pieces.iter().map(|&(o, l)| Seg::from(DataSeg::new(l, Be32::new(lmr.lkey()), src.addr() + o))));
    let at = sq.post(&segs);
    assert_req(&cq.wait(), opcode::RDMA_WRITE, sq.qpn(), at, 0);
    let want: Vec<u8> = pieces.iter().flat_map(|&(o, l)| data[o as usize..(o + l as u64) as usize].to_vec()).collect();
    let got = dst.read();
    assert_eq!(&got[5..5 + want.len()], &want[..]);
    assert!(got[..5].iter().chain(&got[5 + want.len()..]).all(|&b| b == 0));
}

#[test]
fn rdma_read_returns_remote_bytes_and_byte_count() {
    let mut rng = rng();
    let p = Pair::new(64, 64);
    let (mut sq, mut cq) = (Sq::new(&p.a), CqPoll::new(&p.cq_a));
    let local = GuardedBuf::new(10_000, 0x11);
    let remote = GuardedBuf::new(10_000, 0);
    let (lmr, rmr) =
        (local.register(&p.nic, &p.pd, Access::LOCAL_WRITE), remote.register(&p.nic, &p.pd, Access::REMOTE_READ));
    let data = random_bytes(&mut rng, 10_000);
    remote.write(0, &data);
    for len in [1usize, 8, 333, 10_000] {
        local.fill(0x11);
        let (loff, roff) = (rng.random_range(0..=10_000 - len), rng.random_range(0..=10_000 - len));
        let wqe = sq.read(
            SIGNALED,
            (lmr.lkey(), local.addr() + loff as u64, len as u32),
            remote.addr() + roff as u64,
            rmr.rkey(),
        );
        let at = sq.post(&wqe);
        assert_req(&cq.wait(), opcode::RDMA_READ, sq.qpn(), at, len as u32);
        let got = local.read();
        assert_eq!(&got[loff..loff + len], &data[roff..roff + len]);
        assert!(got[..loff].iter().chain(&got[loff + len..]).all(|&b| b == 0x11));
    }
    assert_eq!(remote.read(), data, "READ must not change the remote buffer");
    assert!(local.guards_intact() && remote.guards_intact());
}

#[test]
fn inline_writes_of_every_size_up_to_200_bytes() {
    let mut rng = rng();
    let p = Pair::new(64, 64);
    let (mut sq, mut cq) = (Sq::new(&p.a), CqPoll::new(&p.cq_a));
    let dst = GuardedBuf::new(256, 0);
    let rmr = dst.register(&p.nic, &p.pd, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    for len in 0..=200usize {
        dst.fill(0);
        let data = random_bytes(&mut rng, len);
        let off = rng.random_range(0..=256 - len);
        let wqe = sq.inline_write(opcode::RDMA_WRITE, SIGNALED, &data, dst.addr() + off as u64, rmr.rkey(), 0);
        let at = sq.post_bytes(&wqe);
        assert_req(&cq.wait(), opcode::RDMA_WRITE, sq.qpn(), at, 0);
        let got = dst.read();
        assert_eq!(&got[off..off + len], &data[..], "inline {len} bytes");
        assert!(got[..off].iter().chain(&got[off + len..]).all(|&b| b == 0));
    }
    assert!(dst.guards_intact());
}

#[test]
fn write_with_immediate_completes_on_both_sides() {
    let mut rng = rng();
    let p = Pair::new(64, 64);
    let (mut sq, mut cq, mut peer_cq) = (Sq::new(&p.a), CqPoll::new(&p.cq_a), CqPoll::new(&p.cq_b));
    let src = GuardedBuf::new(512, 0);
    let dst = GuardedBuf::new(512, 0);
    let (lmr, rmr) = (src.register(&p.nic, &p.pd, Access::NONE), dst.register(&p.nic, &p.pd, Access::ALL));
    for n in 0..3u16 {
        let (data, imm) = (random_bytes(&mut rng, 300), rng.random::<u32>());
        src.write(0, &data);
        let mut wqe = sq.write(SIGNALED, (lmr.lkey(), src.addr(), 300), dst.addr() + 100, rmr.rkey());
        // imm travels in wire order: the CQE carries the same big-endian bytes.
        wqe[0] = sq.ctrl(opcode::RDMA_WRITE_IMM, SIGNALED, 3, imm);
        let at = sq.post(&wqe);
        assert_req(&cq.wait(), opcode::RDMA_WRITE_IMM, sq.qpn(), at, 0);
        let r = peer_cq.wait();
        assert_eq!(r.opcode(), opcode::cqe::RESP_WR_IMM);
        assert_eq!(r.imm_inval_pkey.get(), imm);
        assert_eq!(r.byte_cnt.get(), 300);
        assert_eq!(r.qpn(), p.b.qpn());
        assert_eq!(r.wqe_counter.get(), n);
        assert_eq!(&dst.read()[100..400], &data[..]);
    }
    // A zero-byte WRITE_IMM (inline, no data) carries no rkey check: rkey 0 is fine.
    let wqe = sq.inline_write(opcode::RDMA_WRITE_IMM, SIGNALED, &[], 0, 0, 0);
    let at = sq.post_bytes(&wqe);
    assert_req(&cq.wait(), opcode::RDMA_WRITE_IMM, sq.qpn(), at, 0);
    let r = peer_cq.wait();
    assert_eq!((r.opcode(), r.byte_cnt.get(), r.wqe_counter.get()), (opcode::cqe::RESP_WR_IMM, 0, 3));
}

#[test]
fn atomics_fetch_add_and_compare_swap_in_host_order() {
    let mut rng = rng();
    let p = Pair::new(64, 64);
    let (mut sq, mut cq) = (Sq::new(&p.a), CqPoll::new(&p.cq_a));
    let res = GuardedBuf::new(64, 0);
    let sem = GuardedBuf::new(64, 0);
    let (lmr, rmr) = (
        res.register(&p.nic, &p.pd, Access::LOCAL_WRITE),
        sem.register(&p.nic, &p.pd, Access::LOCAL_WRITE | Access::REMOTE_ATOMIC),
    );
    let init = rng.random::<u64>();
    sem.write(8, &init.to_ne_bytes());

    // Fetch-add: old value returned (host order, at an unaligned local address), new value in memory.
    let add = rng.random::<u64>();
    let wqe = sq.atomic(
        opcode::ATOMIC_FA,
        SIGNALED,
        AtomicSeg::fetch_add(add),
        (lmr.lkey(), res.addr() + 3),
        sem.addr() + 8,
        rmr.rkey(),
    );
    let at = sq.post(&wqe);
    assert_req(&cq.wait(), opcode::ATOMIC_FA, sq.qpn(), at, 8);
    assert_eq!(res.u64_at(3), init);
    let now = init.wrapping_add(add);
    assert_eq!(sem.u64_at(8), now);

    // Compare-swap that matches, then one that does not.
    let swap = rng.random::<u64>();
    let wqe = sq.atomic(
        opcode::ATOMIC_CS,
        SIGNALED,
        AtomicSeg::compare_swap(now, swap),
        (lmr.lkey(), res.addr() + 16),
        sem.addr() + 8,
        rmr.rkey(),
    );
    let at = sq.post(&wqe);
    assert_req(&cq.wait(), opcode::ATOMIC_CS, sq.qpn(), at, 8);
    assert_eq!((res.u64_at(16), sem.u64_at(8)), (now, swap));
    let wqe = sq.atomic(
        opcode::ATOMIC_CS,
        SIGNALED,
        AtomicSeg::compare_swap(now, 1),
        (lmr.lkey(), res.addr() + 24),
        sem.addr() + 8,
        rmr.rkey(),
    );
    let at = sq.post(&wqe);
    assert_req(&cq.wait(), opcode::ATOMIC_CS, sq.qpn(), at, 8);
    assert_eq!((res.u64_at(24), sem.u64_at(8)), (swap, swap), "failed CAS returns the current value, changes nothing");
    assert!(res.guards_intact() && sem.guards_intact());
}

#[test]
fn atomic_is_placed_after_earlier_unsignaled_writes() {
    // The signal pattern of a put: unsignaled WRITE of the payload, then FA on the semaphore. Whoever sees
    // the semaphore change must see the payload.
    let mut rng = rng();
    let p = Pair::new(256, 256);
    let mut sq = Sq::new(&p.a);
    let src = GuardedBuf::new(1 << 16, 0);
    let dst = GuardedBuf::new(1 << 16, 0);
    let sem = GuardedBuf::new(8, 0);
    let lmr = src.register(&p.nic, &p.pd, Access::NONE);
    let rmr = dst.register(&p.nic, &p.pd, Access::ALL);
    let smr = sem.register(&p.nic, &p.pd, Access::ALL);
    let scratch = GuardedBuf::new(8, 0);
    let xmr = scratch.register(&p.nic, &p.pd, Access::LOCAL_WRITE);
    for round in 1..=20u64 {
        let data = random_bytes(&mut rng, 1 << 16);
        src.write(0, &data);
        sq.put(&sq.write(0, (lmr.lkey(), src.addr(), 1 << 16), dst.addr(), rmr.rkey()));
        let at = sq.put(&sq.atomic(
            opcode::ATOMIC_FA,
            0,
            AtomicSeg::fetch_add(1),
            (xmr.lkey(), scratch.addr()),
            sem.addr(),
            smr.rkey(),
        ));
        sq.dbrec();
        sq.doorbell(at);
        wait_until("semaphore", || sem.load_u64(0) == round);
        assert_eq!(dst.read(), data, "payload visible once the semaphore moved (round {round})");
    }
}

#[test]
fn two_wqebb_inline_wqe_wraps_across_the_ring_end() {
    let mut rng = rng();
    let p = Pair::new(16, 64);
    let (mut sq, mut cq) = (Sq::new(&p.a), CqPoll::new(&p.cq_a));
    let dst = GuardedBuf::new(256, 0);
    let rmr = dst.register(&p.nic, &p.pd, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    // 15 NOPs bring the producer index to slot 15, the last one; the last is signaled, and its CQE retires
    // them all, so that the ring has room for the wrapping WQE (posting 18 WQEBBs into a 16-WQEBB ring at
    // once would overrun it: the NIC reports that as a bad doorbell).
    for _ in 0..14 {
        sq.put(&sq.nop(0));
    }
    let at = sq.post(&sq.nop(SIGNALED));
    assert_req(&cq.wait(), opcode::NOP, sq.qpn(), at, 0);
    assert_eq!(sq.pi, 15);
    // 100 bytes inline: ds = 2 + ceil(104 / 16) = 9 → 3 WQEBBs: slots 15, 0, 1.
    let data = random_bytes(&mut rng, 100);
    let wqe = sq.inline_write(opcode::RDMA_WRITE, SIGNALED, &data, dst.addr() + 50, rmr.rkey(), 0);
    assert_eq!(wqe.len(), 9 * 16);
    let at = sq.post_bytes(&wqe);
    assert_eq!((at, sq.pi), (15, 18));
    assert_req(&cq.wait(), opcode::RDMA_WRITE, sq.qpn(), 15, 0);
    assert_eq!(&dst.read()[50..150], &data[..]);
    // And a 2-WQEBB one (60 bytes: ds 6) straddling the end again, after 13 more NOPs (pi 18 → 31).
    for _ in 0..12 {
        sq.put(&sq.nop(0));
    }
    let at = sq.post(&sq.nop(SIGNALED));
    assert_req(&cq.wait(), opcode::NOP, sq.qpn(), at, 0);
    assert_eq!(sq.pi % 16, 15);
    let data = random_bytes(&mut rng, 60);
    let wqe = sq.inline_write(opcode::RDMA_WRITE, SIGNALED, &data, dst.addr(), rmr.rkey(), 0);
    assert_eq!(wqe.len(), 6 * 16);
    let at = sq.post_bytes(&wqe);
    assert_req(&cq.wait(), opcode::RDMA_WRITE, sq.qpn(), at, 0);
    assert_eq!(&dst.read()[..60], &data[..]);
    assert_eq!(p.a.sq_consumed(), sq.pi);
    assert!(dst.guards_intact());
}

#[test]
fn sixteen_bit_index_wraps_over_70000_wqebbs() {
    let mut rng = rng();
    let p = Pair::new(256, 256);
    let (mut sq, mut cq) = (Sq::new(&p.a), CqPoll::new(&p.cq_a));
    let dst = GuardedBuf::new(64 * 8, 0);
    let rmr = dst.register(&p.nic, &p.pd, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let mut last = [0u64; 64];
    let mut batches = 0u64;
    while sq.pi < 70_000 {
        // A batch: 63 inline 8-byte writes (1 WQEBB each) to random slots, one 2-WQEBB inline write, the
        // last signaled; one doorbell.
        let mut at = 0;
        for i in 0..64 {
            let slot = rng.random_range(0..64usize);
            let v = rng.random::<u64>();
            let data: Vec<u8> = if i == 63 {
                [v.to_ne_bytes(), [0xab; 8], [0xcd; 8], [0xef; 8]].concat()
            } else {
                v.to_ne_bytes().to_vec()
            };
            let fm = if i == 63 { SIGNALED } else { 0 };
            let target = if i == 63 { 0 } else { slot };
            let wqe = sq.inline_write(opcode::RDMA_WRITE, fm, &data, dst.addr() + 8 * target as u64, rmr.rkey(), 0);
            at = sq.put_bytes(&wqe);
            last[target] = v;
        }
        last[1] = u64::from_ne_bytes([0xab; 8]);
        last[2] = u64::from_ne_bytes([0xcd; 8]);
        last[3] = u64::from_ne_bytes([0xef; 8]);
        sq.dbrec();
        sq.doorbell(at);
        let c = cq.wait();
        assert_req(&c, opcode::RDMA_WRITE, sq.qpn(), at, 0);
        batches += 1;
    }
    assert!(sq.pi > 65_536 + 256);
    assert_eq!(p.a.sq_consumed(), sq.pi);
    assert_eq!(cq.ci, batches, "one CQE per batch, none for unsignaled WQEs");
    for (i, v) in last.iter().enumerate() {
        assert_eq!(dst.u64_at(8 * i), *v, "slot {i}");
    }
    let s = p.nic.stats();
    assert_eq!((s.wqes, s.error_cqes, s.dbrec_mismatches, s.bad_doorbells), (batches * 64, 0, 0, 0));
    assert_eq!(p.a.state(), QpState::Rts);
}

#[test]
fn blueflame_write_is_a_doorbell() {
    let mut rng = rng();
    let p = Pair::new(64, 64);
    let (mut sq, mut cq) = (Sq::new(&p.a), CqPoll::new(&p.cq_a));
    let dst = GuardedBuf::new(64, 0);
    let rmr = dst.register(&p.nic, &p.pd, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    for i in 0..3 {
        let data = random_bytes(&mut rng, 16);
        let wqe = sq.inline_write(opcode::RDMA_WRITE, SIGNALED, &data, dst.addr() + 16 * i, rmr.rkey(), 0);
        assert_eq!(wqe.len(), 64, "fits one WQEBB");
        let at = sq.put_bytes(&wqe);
        sq.dbrec();
        sq.blueflame(at);
        assert_req(&cq.wait(), opcode::RDMA_WRITE, sq.qpn(), at, 0);
        assert_eq!(&dst.read()[16 * i as usize..16 * i as usize + 16], &data[..]);
    }
    let s = p.nic.stats();
    assert_eq!((s.doorbells, s.blueflame, s.wqes), (3, 3, 3));
}

#[test]
fn plain_doorbell_after_a_blueflame_write_is_not_counted_as_one() {
    let mut rng = rng();
    let p = Pair::new(64, 64);
    let (mut sq, mut cq) = (Sq::new(&p.a), CqPoll::new(&p.cq_a));
    let dst = GuardedBuf::new(64, 0);
    let rmr = dst.register(&p.nic, &p.pd, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let data = random_bytes(&mut rng, 16);
    let at = sq.put_bytes(&sq.inline_write(opcode::RDMA_WRITE, SIGNALED, &data, dst.addr(), rmr.rkey(), 0));
    sq.dbrec();
    sq.blueflame(at);
    assert_req(&cq.wait(), opcode::RDMA_WRITE, sq.qpn(), at, 0);
    // The same WQE again (only its index differs) with an 8-byte doorbell: the register's bytes 8..64 still
    // hold the BlueFlame write's, which equal the new WQE's. It is no BlueFlame write.
    let at = sq.post_bytes(&sq.inline_write(opcode::RDMA_WRITE, SIGNALED, &data, dst.addr(), rmr.rkey(), 0));
    assert_req(&cq.wait(), opcode::RDMA_WRITE, sq.qpn(), at, 0);
    assert_eq!(&dst.read()[..16], &data[..]);
    let s = p.nic.stats();
    assert_eq!((s.doorbells, s.blueflame, s.wqes), (2, 1, 2));
}

#[test]
fn nop_completes_and_unsignaled_wqes_write_no_cqe() {
    let p = Pair::new(64, 64);
    let (mut sq, mut cq) = (Sq::new(&p.a), CqPoll::new(&p.cq_a));
    sq.put(&sq.nop(0));
    sq.put(&sq.nop(0));
    let at = sq.post(&sq.nop(SIGNALED));
    assert_req(&cq.wait(), opcode::NOP, sq.qpn(), at, 0);
    assert_eq!(at, 2);
    cq.assert_none_for(std::time::Duration::from_millis(20));
    assert_eq!(p.nic.stats().wqes, 3);
}
