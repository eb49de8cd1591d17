//! Where the emulated NIC keeps its queues (host or GPU memory, here GPU memory simulated by `SimGpu`), and
//! how it reads BlueFlame writes.

mod emu_util;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use emu_util::*;
use gdaki::mem::{HostQueueMemory, MemKind};
use gdaki::nic::emu::{Access, EmuConfig, EmuNic, SimGpu};
use gdaki_shared::handle::Placement;
use gdaki_shared::prm::opcode;

fn config(queues: MemKind) -> EmuConfig {
    match queues {
        MemKind::Host => EmuConfig::host(),
        MemKind::Gpu => EmuConfig {
            queue_mem: Arc::new(HostQueueMemory),
            gpu: Some(Arc::new(SimGpu::new().unwrap())),
            queues: MemKind::Gpu,
            wire: None,
        },
    }
}

const BOTH: [MemKind; 2] = [MemKind::Host, MemKind::Gpu];

#[test]
fn handles_record_the_placement() {
    for (kind, placement) in [(MemKind::Host, Placement::HOST), (MemKind::Gpu, Placement::GPU)] {
        let p = Pair::with_config(config(kind), 64, 64);
        let h = p.a.handle();
        assert_eq!((h.placement, h.cq.placement), (placement, placement), "{kind:?}");
    }
}

#[test]
fn gpu_queues_need_a_copier() {
    let cfg = EmuConfig { queues: MemKind::Gpu, ..EmuConfig::host() };
    let e = EmuNic::open(cfg).unwrap_err().to_string();
    assert!(e.contains("GPU copier"), "{e}");
}

#[test]
fn gpu_queues_fetch_the_ring_once_per_doorbell() {
    let mut rng = rng();
    let p = Pair::with_config(config(MemKind::Gpu), 64, 64);
    let (mut sq, mut cq) = (Sq::new(&p.a), CqPoll::new(&p.cq_a));
    let src = GuardedBuf::new(4096, 0);
    let dst = GuardedBuf::new(4096, 0);
    let (lmr, rmr) = (src.register(&p.nic, &p.pd, Access::NONE), dst.register(&p.nic, &p.pd, Access::ALL));
    let data = random_bytes(&mut rng, 4096);
    src.write(0, &data);
    // Eight WRITEs of 512 bytes under one doorbell: one fetch of the ring, eight CQEs written by copies.
    let mut last = 0;
    for i in 0..8u64 {
        let w = sq.write(SIGNALED, (lmr.lkey(), src.addr() + 512 * i, 512), dst.addr() + 512 * i, rmr.rkey());
        last = sq.put(&w);
    }
    sq.dbrec();
    sq.doorbell(last);
    for i in 0..8 {
        assert_req(&cq.wait(), opcode::RDMA_WRITE, sq.qpn(), i, 0);
    }
    assert_eq!(dst.read(), data);
    let s = p.nic.stats();
    assert_eq!((s.doorbells, s.ring_fetches, s.cqes, s.dbrec_mismatches), (1, 1, 8, 0));
}

#[test]
fn a_gpu_cq_still_overruns_when_software_does_not_consume() {
    // 16 CQEs fit; the 17th finds the (cached, then re-read) consumer index still at 0.
    let p = Pair::with_config(config(MemKind::Gpu), 16, 16);
    let mut sq = Sq::new(&p.a);
    for _ in 0..17 {
        let at = sq.put(&sq.nop(SIGNALED));
        sq.dbrec();
        sq.doorbell(at);
        wait_until("the NOP", || p.a.sq_consumed() > at);
    }
    wait_until("the overrun", || p.nic.stats().cq_overruns == 1);
    assert!(p.cq_a.is_error());
}

#[test]
fn a_gpu_cq_takes_more_cqes_than_it_holds_once_consumed() {
    let p = Pair::with_config(config(MemKind::Gpu), 16, 16);
    let (mut sq, mut cq) = (Sq::new(&p.a), CqPoll::new(&p.cq_a));
    for _ in 0..100 {
        let at = sq.post(&sq.nop(SIGNALED));
        assert_req(&cq.wait(), opcode::NOP, sq.qpn(), at, 0);
    }
    assert_eq!(p.nic.stats().cq_overruns, 0);
}

/// Stores word `w` of `qp`'s BlueFlame register.
fn bf_store(qp: &gdaki::nic::emu::Qp, w: usize, v: u64) {
    let h = qp.handle();
    // SAFETY: the 64-byte register inside the UAR page, 8-aligned.
    unsafe { AtomicU64::from_ptr((h.bf_reg + 8 * w as u64) as *mut u64) }.store(v, Ordering::Release);
}

#[test]
fn a_torn_blueflame_write_is_counted_and_the_wqe_read_from_the_ring() {
    for kind in BOTH {
        let mut rng = rng();
        let p = Pair::with_config(config(kind), 64, 64);
        let (mut sq, mut cq) = (Sq::new(&p.a), CqPoll::new(&p.cq_a));
        let src = GuardedBuf::new(64, 0);
        let dst = GuardedBuf::new(64, 0);
        let (lmr, rmr) = (src.register(&p.nic, &p.pd, Access::NONE), dst.register(&p.nic, &p.pd, Access::ALL));
        let data = random_bytes(&mut rng, 64);
        src.write(0, &data);
        let at = sq.put(&sq.write(SIGNALED, (lmr.lkey(), src.addr(), 64), dst.addr(), rmr.rkey()));
        sq.dbrec();
        // Word 1 of the WQE (not the rest) and then the doorbell: a torn BlueFlame write.
        bf_store(&p.a, 1, 0x1234_5678);
        sq.doorbell(at);
        assert_req(&cq.wait(), opcode::RDMA_WRITE, sq.qpn(), at, 0);
        assert_eq!(dst.read(), data, "{kind:?}");
        let s = p.nic.stats();
        assert_eq!(s.blueflame, 1, "{kind:?}");
        let fetched = if kind == MemKind::Gpu { 1 } else { 0 };
        assert_eq!(s.ring_fetches, fetched, "{kind:?}");
    }
}

#[test]
fn an_old_blueflame_write_is_not_taken_for_a_later_doorbell() {
    for kind in BOTH {
        let mut rng = rng();
        let p = Pair::with_config(config(kind), 64, 64);
        let (mut sq, mut cq) = (Sq::new(&p.a), CqPoll::new(&p.cq_a));
        let src = GuardedBuf::new(128, 0);
        let dst = GuardedBuf::new(128, 0);
        let (lmr, rmr) = (src.register(&p.nic, &p.pd, Access::NONE), dst.register(&p.nic, &p.pd, Access::ALL));
        let data = random_bytes(&mut rng, 128);
        src.write(0, &data);
        let a = sq.put(&sq.write(SIGNALED, (lmr.lkey(), src.addr(), 64), dst.addr(), rmr.rkey()));
        sq.dbrec();
        sq.blueflame(a);
        assert_req(&cq.wait(), opcode::RDMA_WRITE, sq.qpn(), a, 0);
        // The second WQE (another range) by plain doorbell: the register still holds words of the first
        // write unless the NIC cleared them; executed from the register, the second range stays zero.
        let b = sq.put(&sq.write(SIGNALED, (lmr.lkey(), src.addr() + 64, 64), dst.addr() + 64, rmr.rkey()));
        sq.dbrec();
        sq.doorbell(b);
        assert_req(&cq.wait(), opcode::RDMA_WRITE, sq.qpn(), b, 0);
        assert_eq!(dst.read(), data, "{kind:?}");
        assert_eq!(p.nic.stats().blueflame, 1, "{kind:?}");
        cq.assert_none_for(Duration::from_millis(20));
    }
}

/// Freeing GPU memory waits for every running kernel, so a destroyed QP's or CQ's GPU memory goes back to the
/// NIC, zeroed before its next use, and is freed only with the NIC.
#[test]
fn gpu_queue_memory_of_a_destroyed_qp_is_reused_zeroed() {
    let nic = EmuNic::open(config(MemKind::Gpu)).unwrap();
    let pd = nic.alloc_pd().unwrap();
    let (ring, cq_ring) = {
        let cq = nic.create_cq(64).unwrap();
        let qp = nic.create_qp(&pd, &cq, 64).unwrap();
        qp.connect(&qp.endpoint()).unwrap();
        let mut sq = Sq::new(&qp);
        let mut poll = CqPoll::new(&cq);
        for _ in 0..3 {
            let at = sq.post(&sq.nop(SIGNALED));
            assert_req(&poll.wait(), opcode::NOP, sq.qpn(), at, 0);
        }
        (qp.handle().sq_buf, cq.handle().buf)
    };
    let cq = nic.create_cq(64).unwrap();
    let qp = nic.create_qp(&pd, &cq, 64).unwrap();
    assert_eq!((qp.handle().sq_buf, cq.handle().buf), (ring, cq_ring), "the same buffers, from the NIC's pool");
    // SAFETY: the ring (simulated GPU memory: host memory here) is 64 WQEBBs; nothing else writes it now.
    let bytes = unsafe { std::slice::from_raw_parts(ring as *const u8, 64 * 64) };
    assert!(bytes.iter().all(|&b| b == 0), "a reused ring starts zeroed");
    qp.connect(&qp.endpoint()).unwrap();
    let (mut sq, mut poll) = (Sq::new(&qp), CqPoll::new(&cq));
    let at = sq.post(&sq.nop(SIGNALED));
    assert_req(&poll.wait(), opcode::NOP, sq.qpn(), at, 0);
}

/// Dropping a NIC whose queues are in (simulated) GPU memory with CQE copies still in flight ends at once:
/// its executor waits for its copies, and the pool frees each buffer after the copies that target it.
#[test]
fn a_gpu_queue_nic_dropped_with_copies_in_flight_ends() {
    let start = std::time::Instant::now();
    for _ in 0..20 {
        let p = Pair::with_config(config(MemKind::Gpu), 64, 64);
        let mut sq = Sq::new(&p.a);
        let mut last = 0;
        for _ in 0..40 {
            last = sq.put(&sq.nop(SIGNALED));
        }
        sq.dbrec();
        sq.doorbell(last);
        // No CQE is polled: the NIC may still be writing them when everything is dropped.
        drop(p);
    }
    assert!(start.elapsed() < Duration::from_secs(10), "20 drops took {:?}", start.elapsed());
}
