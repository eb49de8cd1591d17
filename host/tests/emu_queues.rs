//! Where the emulated NIC keeps its queues (host or GPU memory, here GPU memory simulated by `SimGpu`), and
//! how it reads BlueFlame writes.

mod emu_util;

use std::sync::Arc;
use std::time::Duration;

use emu_util::*;
use gdaki::mem::{HostQueueMemory, MemKind};
use gdaki::nic::emu::{Access, EmuConfig, EmuNic, Mr, SimGpu};
use gdaki_shared::handle::Placement;
use gdaki_shared::prm::opcode;
use gdaki_shared::prm::uar::blueflame_word1;
use gdaki_shared::prm::wqe::Seg;

fn config(queues: MemKind) -> EmuConfig {
    match queues {
        MemKind::Host => EmuConfig::host(),
        MemKind::Gpu => EmuConfig {
            queue_mem: Arc::new(HostQueueMemory),
            gpu: Some(Arc::new(SimGpu::new().unwrap())),
            queues: MemKind::Gpu,
            wire: None,
            blueflame: true,
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
    // The NIC counts a CQE just after writing it: the count may trail the last CQE polled.
    wait_until("the 8th CQE counted", || p.nic.stats().cqes >= 8);
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

/// A QP with queues of `kind`, a 128-byte source of random bytes and a 128-byte destination, for the
/// BlueFlame tests. Fields drop in order: the MRs before their buffers, the NIC last.
struct Ranges {
    lmr: Mr,
    rmr: Mr,
    src: GuardedBuf,
    dst: GuardedBuf,
    data: Vec<u8>,
    sq: Sq,
    cq: CqPoll,
    p: Pair,
}

impl Ranges {
    fn new(kind: MemKind) -> Self {
        Self::with_config(config(kind))
    }

    fn with_config(cfg: EmuConfig) -> Self {
        let p = Pair::with_config(cfg, 64, 64);
        let (sq, cq) = (Sq::new(&p.a), CqPoll::new(&p.cq_a));
        let (src, dst) = (GuardedBuf::new(128, 0), GuardedBuf::new(128, 0));
        let (lmr, rmr) = (src.register(&p.nic, &p.pd, Access::NONE), dst.register(&p.nic, &p.pd, Access::ALL));
        let data = random_bytes(&mut rng(), 128);
        src.write(0, &data);
        Self { lmr, rmr, src, dst, data, sq, cq, p }
    }

    /// A signaled RDMA WRITE of the 64 source bytes at `off` (0 or 64) to the same offset of the destination,
    /// built for the SQ's next index.
    fn write(&self, off: u64) -> [Seg; 3] {
        let local = (self.lmr.lkey(), self.src.addr() + off, 64);
        self.sq.write(SIGNALED, local, self.dst.addr() + off, self.rmr.rkey())
    }

    /// Waits for the WRITE CQE of the WQE at `at`.
    fn completes(&mut self, at: u64) {
        assert_req(&self.cq.wait(), opcode::RDMA_WRITE, self.sq.qpn(), at, 0);
    }
}

#[test]
fn an_old_blueflame_write_is_not_taken_for_a_later_doorbell() {
    for kind in BOTH {
        let mut r = Ranges::new(kind);
        let a = r.sq.put(&r.write(0));
        r.sq.dbrec();
        r.sq.blueflame(a);
        r.completes(a);
        // The second WQE (another range) by plain doorbell: the register still holds words of the first
        // write unless the NIC cleared them; executed from the register, the second range stays zero.
        let b = r.sq.put(&r.write(64));
        r.sq.dbrec();
        r.sq.doorbell(b);
        r.completes(b);
        assert_eq!(r.dst.read(), r.data, "{kind:?}");
        assert_eq!(r.p.nic.stats().blueflame, 1, "{kind:?}");
        r.cq.assert_none_for(Duration::from_millis(20));
    }
}

/// The first WQEBB of `segs` as the eight words of a whole, tagged BlueFlame write.
fn blueflame_words(segs: &[Seg]) -> [u64; 8] {
    let mut words = [0u64; 8];
    for (i, s) in segs.iter().take(4).enumerate() {
        words[2 * i..2 * i + 2].copy_from_slice(&s.0);
    }
    words[1] = blueflame_word1(words[0], words[1]);
    words
}

#[test]
fn a_blueflame_wqe_is_taken_from_the_register_not_the_ring() {
    for kind in BOTH {
        let mut r = Ranges::new(kind);
        // Two WQEs for the same slot: the ring gets the first (bytes 0..64), the register the second (64..128).
        let (in_ring, in_register) = (r.write(0), r.write(64));
        let at = r.sq.put(&in_ring);
        r.sq.dbrec();
        r.sq.blueflame_words(&blueflame_words(&in_register), (1..8).chain([0]));
        r.completes(at);
        let got = r.dst.read();
        assert_eq!((&got[..64], &got[64..]), (&[0u8; 64][..], &r.data[64..]), "{kind:?}: the register's WQE ran");
        let s = r.p.nic.stats();
        // A ring in GPU memory is not fetched at all; one in host memory is compared, and differs here.
        let mismatches = if kind == MemKind::Gpu { 0 } else { 1 };
        assert_eq!(
            (s.blueflame, s.blueflame_fallbacks, s.ring_fetches, s.blueflame_mismatches),
            (1, 0, 0, mismatches),
            "{kind:?}"
        );
    }
}

/// Writes that are not a whole, tagged write of the announced WQE: its words are not used, the WQE is read
/// from the ring.
#[test]
fn a_blueflame_write_that_is_not_whole_is_read_from_the_ring() {
    type Shape = fn(&mut [u64; 8]) -> Vec<usize>;
    let shapes: [(&str, Shape); 3] = [
        ("untagged", |w| {
            w[1] &= !0xff;
            (1..8).chain([0]).collect()
        }),
        ("word 2 missing", |_| [1, 3, 4, 5, 6, 7, 0].into()),
        ("word 1 of another WQE", |w| {
            w[1] ^= 0x01;
            (1..8).chain([0]).collect()
        }),
    ];
    for kind in BOTH {
        for (name, shape) in shapes {
            let mut r = Ranges::new(kind);
            // A NOP first, so that the WQE's index (1) is not what an untagged word 1 (signature 0) says.
            let at = r.sq.post(&r.sq.nop(SIGNALED));
            assert_req(&r.cq.wait(), opcode::NOP, r.sq.qpn(), at, 0);
            let wqe = r.write(0);
            // The register's copy would fail (a zero-length SGE is a length error): only the ring's copy
            // completes the WRITE.
            let mut bad = wqe;
            bad[2].0[0] &= !0xffff_ffff;
            let at = r.sq.put(&wqe);
            r.sq.dbrec();
            let mut words = blueflame_words(&bad);
            let order = shape(&mut words);
            r.sq.blueflame_words(&words, order);
            r.completes(at);
            assert_eq!(&r.dst.read()[..64], &r.data[..64], "{kind:?} {name}");
            let s = r.p.nic.stats();
            let fetches = if kind == MemKind::Gpu { 2 } else { 0 };
            assert_eq!(
                (s.blueflame, s.blueflame_fallbacks, s.error_cqes, s.ring_fetches),
                (0, 1, 0, fetches),
                "{kind:?} {name}"
            );
        }
    }
}

/// A BlueFlame write for a WQE behind others that were never rung covers them, as a doorbell does; its
/// words are not the next WQE's, so every WQE is read from the ring.
#[test]
fn a_blueflame_write_behind_unrung_wqes_reads_them_all_from_the_ring() {
    for kind in BOTH {
        let mut r = Ranges::new(kind);
        let a = r.sq.put(&r.write(0));
        let b = r.sq.put(&r.write(64));
        r.sq.dbrec();
        r.sq.blueflame(b);
        r.completes(a);
        r.completes(b);
        assert_eq!(r.dst.read(), r.data, "{kind:?}");
        let s = r.p.nic.stats();
        let fetches = if kind == MemKind::Gpu { 1 } else { 0 };
        assert_eq!((s.blueflame, s.blueflame_fallbacks, s.ring_fetches), (0, 1, fetches), "{kind:?}");
    }
}

/// A BlueFlame write whose doorbell is stale goes with it: its words do not stay in the register for the next
/// doorbell, whose WQE they would be taken for when their tag (the low byte of a WQE index) matches. Two such
/// writes, each followed by a signaled NOP rung by plain doorbell, which must complete from the ring (the
/// register's words ask for no CQE): one naming the next WQE but announcing none (ds 0), as `emu_fuzz_wire`
/// found it (a BlueFlame write of a still empty ring); and one for a WQE 256 before the next, which a poster's
/// write landing that late carries.
#[test]
fn a_stale_blueflame_write_is_not_taken_for_the_next_doorbell() {
    use gdaki_shared::prm::wqe::CtrlSeg;
    use gdaki_shared::Be32;
    for late in [false, true] {
        let p = Pair::new(512, 512);
        let (mut sq, mut cq) = (Sq::new(&p.a), CqPoll::new(&p.cq_a));
        let stale = |n: u64| wait_until("the stale doorbell", || p.nic.stats().stale_doorbells == n);
        let words = if late {
            // 256 unsignaled NOPs, rung 64 at a time; then the BlueFlame write of the first, unsignaled.
            for i in 1..=256 {
                sq.put(&sq.nop(0));
                if i % 64 == 0 {
                    sq.dbrec();
                    sq.doorbell_pi(sq.pi);
                }
            }
            wait_until("the NOPs taken", || p.a.sq_consumed() == 256);
            blueflame_words(&[Seg::from(CtrlSeg::new(0, opcode::NOP, 0, sq.qpn(), 0, 1, 0, Be32::ZERO))])
        } else {
            // A doorbell for no new WQE first, so that the BlueFlame write of an all-zero WQEBB (index 0, ds 0,
            // no CQE asked for) changes the register.
            sq.doorbell_pi(0);
            stale(1);
            blueflame_words(&[Seg::default()])
        };
        sq.blueflame_words(&words, (1..8).chain([0]));
        stale(if late { 1 } else { 2 });
        let at = sq.post(&sq.nop(SIGNALED));
        assert_req(&cq.wait(), opcode::NOP, sq.qpn(), at, 0);
        let s = p.nic.stats();
        assert_eq!((s.blueflame, s.blueflame_mismatches), (0, 0), "late {late}: {s:?}");
    }
}

/// A BlueFlame write of two WQEBBs on a register of one (the handle's `bf_size`), ringing two WQEs: the QP
/// fails with LOCAL_QP_OP_ERR at the first, nothing runs, and the second is flushed at once. The first has no
/// other CQE, not even when a later doorbell covers it again.
#[test]
fn a_blueflame_write_larger_than_the_register_fails_the_qp() {
    for kind in BOTH {
        let mut r = Ranges::new(kind);
        assert_eq!(r.p.a.handle().bf_size, 64, "{kind:?}");
        let first = r.sq.put(&r.write(0));
        let at = r.sq.put(&r.write(64));
        r.sq.dbrec();
        let bf_reg = r.sq.h.bf_reg;
        for w in 8..16u64 {
            // SAFETY: inside the UAR page (the BlueFlame buffer's first 256 bytes), 8-aligned.
            unsafe { std::sync::atomic::AtomicU64::from_ptr((bf_reg + 8 * w) as *mut u64) }
                .store(w, std::sync::atomic::Ordering::Release);
        }
        r.sq.blueflame(at);
        let c = r.cq.wait();
        assert_eq!(c.opcode(), opcode::cqe::REQ_ERR, "{kind:?}: {c:?}");
        let e = c.as_err();
        assert_eq!((e.syndrome, e.vendor_err_synd), (0x02, gdaki::nic::emu::vendor::BLUEFLAME_TOO_LARGE), "{kind:?}");
        assert_eq!(e.wqe_counter.get(), first as u16, "{kind:?}");
        assert_err(&r.cq.wait(), opcode::syndrome::WR_FLUSH_ERR, opcode::RDMA_WRITE, r.sq.qpn(), at);
        assert!(r.dst.read().iter().all(|&b| b == 0), "{kind:?}: nothing placed");
        assert_eq!(r.p.a.state(), gdaki::nic::emu::QpState::Error, "{kind:?}");
        let next = r.sq.put(&r.write(128));
        r.sq.dbrec();
        // Covering the ring's WQEs from `first` to `next`.
        r.sq.doorbell_pi(next + 1);
        assert_err(&r.cq.wait(), opcode::syndrome::WR_FLUSH_ERR, opcode::RDMA_WRITE, r.sq.qpn(), next);
        r.cq.assert_none_for(std::time::Duration::from_millis(30));
    }
}

/// A doorbell-only UAR (`EmuConfig::blueflame` false): handles say `bf_size` 0; a doorbell works, and a
/// BlueFlame write fails the QP with LOCAL_QP_OP_ERR and nothing of its WQE runs.
#[test]
fn a_doorbell_only_uar_takes_doorbells_and_refuses_blueflame() {
    for kind in BOTH {
        let mut r = Ranges::with_config(EmuConfig { blueflame: false, ..config(kind) });
        assert_eq!(r.p.a.handle().bf_size, 0, "{kind:?}");
        let at = r.sq.put(&r.write(0));
        r.sq.dbrec();
        r.sq.doorbell(at);
        r.completes(at);
        assert_eq!(&r.dst.read()[..64], &r.data[..64], "{kind:?}: the doorbell's WRITE");
        let at = r.sq.put(&r.write(64));
        r.sq.dbrec();
        r.sq.blueflame(at);
        let c = r.cq.wait();
        assert_eq!(c.opcode(), opcode::cqe::REQ_ERR, "{kind:?}: {c:?}");
        let e = c.as_err();
        assert_eq!((e.syndrome, e.vendor_err_synd), (0x02, gdaki::nic::emu::vendor::BLUEFLAME_NO_BUFFER), "{kind:?}");
        assert!(r.dst.read()[64..].iter().all(|&b| b == 0), "{kind:?}: nothing of the BlueFlame WQE placed");
        assert_eq!(r.p.a.state(), gdaki::nic::emu::QpState::Error, "{kind:?}");
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

/// How long the mirroring tests give the simulator's thread (which mirrors every 200 µs) between a dbrec and
/// its doorbell: their assertions want most rounds mirrored.
const MIRROR_TIME: Duration = Duration::from_millis(20);

fn mirrored() -> EmuConfig {
    EmuConfig { gpu: Some(Arc::new(SimGpu::with_sq_mirrors().unwrap())), ..config(MemKind::Gpu) }
}

/// With a copier that mirrors SQ rings, a rung range the mirror already holds is read from host memory: no
/// fetch. The simulator mirrors every 200 µs, so each round gives it 20 ms between the dbrec and the doorbell
/// (which a simulator thread woken late on a loaded machine still meets in most rounds; with 2 ms, it could
/// miss half of them); every round is either mirrored or fetched, and every payload lands.
#[test]
fn a_mirrored_ring_is_read_from_the_mirror_not_fetched() {
    let mut rng = rng();
    let p = Pair::with_config(mirrored(), 64, 64);
    let (mut sq, mut cq) = (Sq::new(&p.a), CqPoll::new(&p.cq_a));
    let src = GuardedBuf::new(4096, 0);
    let dst = GuardedBuf::new(4096, 0);
    let (lmr, rmr) = (src.register(&p.nic, &p.pd, Access::NONE), dst.register(&p.nic, &p.pd, Access::ALL));
    let rounds = 12u64;
    for round in 0..rounds {
        let data = random_bytes(&mut rng, 4096);
        src.write(0, &data);
        // Eight WRITEs of 512 bytes under one doorbell, which wraps the 64-WQEBB ring every 8 rounds.
        let mut last = 0;
        for i in 0..8u64 {
            let w = sq.write(SIGNALED, (lmr.lkey(), src.addr() + 512 * i, 512), dst.addr() + 512 * i, rmr.rkey());
            last = sq.put(&w);
        }
        sq.dbrec();
        std::thread::sleep(MIRROR_TIME);
        sq.doorbell(last);
        for i in 0..8 {
            assert_req(&cq.wait(), opcode::RDMA_WRITE, sq.qpn(), round * 8 + i, 0);
        }
        assert_eq!(dst.read(), data, "round {round}");
    }
    // The NIC counts a CQE just after writing it: the count may trail the last CQE polled.
    wait_until("the 96th CQE counted", || p.nic.stats().cqes >= 96);
    let s = p.nic.stats();
    assert_eq!((s.doorbells, s.ring_fetches + s.ring_mirrored, s.cqes, s.dbrec_mismatches), (rounds, rounds, 96, 0));
    assert!(s.ring_mirrored >= rounds / 2, "{} of {rounds} rounds read from the mirror", s.ring_mirrored);
}

/// A doorbell whose dbrec was never written is not covered by the mirror (it follows the dbrec): the NIC
/// fetches the ring, which still reports the dbrec behind the doorbell, and executes the WQE, as without a
/// mirror.
#[test]
fn a_doorbell_without_its_dbrec_is_caught_with_a_mirror_too() {
    let p = Pair::with_config(mirrored(), 64, 64);
    let (mut sq, mut cq) = (Sq::new(&p.a), CqPoll::new(&p.cq_a));
    let at = sq.put(&sq.nop(SIGNALED));
    std::thread::sleep(Duration::from_millis(2));
    sq.doorbell(at);
    assert_req(&cq.wait(), opcode::NOP, sq.qpn(), at, 0);
    let s = p.nic.stats();
    assert_eq!((s.doorbells, s.ring_fetches, s.ring_mirrored, s.dbrec_mismatches), (1, 1, 0, 1));
}

/// A destroyed QP gives its mirror slot back: more QPs than the copier has slots (32), one after another, are
/// each mirrored.
#[test]
fn mirror_slots_come_back_when_qps_are_destroyed() {
    let nic = EmuNic::open(mirrored()).unwrap();
    let pd = nic.alloc_pd().unwrap();
    for n in 0..40u64 {
        let cq = nic.create_cq(64).unwrap();
        let qp = nic.create_qp(&pd, &cq, 64).unwrap();
        qp.connect(&qp.endpoint()).unwrap();
        let (mut sq, mut poll) = (Sq::new(&qp), CqPoll::new(&cq));
        let at = sq.put(&sq.nop(SIGNALED));
        sq.dbrec();
        std::thread::sleep(MIRROR_TIME);
        sq.doorbell(at);
        assert_req(&poll.wait(), opcode::NOP, sq.qpn(), at, 0);
        let s = nic.stats();
        assert_eq!((s.doorbells, s.ring_fetches + s.ring_mirrored), (n + 1, n + 1), "QP {n}");
    }
    assert!(nic.stats().ring_mirrored >= 20, "{:?}", nic.stats());
}

/// A GPU copier that does nothing (host queues and host MRs never reach it) but can hold the executor in
/// `order_by(Some(qpn))`, which `sq::poll` calls after it read a QP's doorbell register and before it takes the
/// BlueFlame words: the moment a descheduled executor thread is in, made to last.
#[derive(Default)]
struct GateCopier {
    armed: std::sync::atomic::AtomicBool,
    entered: std::sync::atomic::AtomicBool,
    open: std::sync::atomic::AtomicBool,
}

impl gdaki::mem::GpuCopier for GateCopier {
    unsafe fn copy_async(&self, _: gdaki::mem::MemLoc, _: gdaki::mem::MemLoc, _: usize) -> gdaki::Result<()> {
        Err(gdaki::Error::InvalidArgument("no GPU".into()))
    }
    unsafe fn write_async(&self, _: gdaki::mem::MemLoc, _: &[u8], _: bool) -> gdaki::Result<()> {
        Err(gdaki::Error::InvalidArgument("no GPU".into()))
    }
    unsafe fn atomic_async(
        &self,
        _: gdaki::mem::MemLoc,
        _: gdaki::mem::AtomicOp,
        _: gdaki::mem::MemLoc,
    ) -> gdaki::Result<()> {
        Err(gdaki::Error::InvalidArgument("no GPU".into()))
    }
    fn synchronize(&self) -> gdaki::Result<()> {
        Ok(())
    }
    fn order_by(&self, qp: Option<u32>) {
        use std::sync::atomic::Ordering::SeqCst;
        if qp.is_some() && self.armed.swap(false, SeqCst) {
            self.entered.store(true, SeqCst);
            while !self.open.load(SeqCst) {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
    fn device_code_on_gpu(&self) -> bool {
        false
    }
    fn alloc(&self, _: usize) -> gdaki::Result<gdaki::mem::GpuMem> {
        Err(gdaki::Error::InvalidArgument("no GPU".into()))
    }
}

/// Device code posts one 8-byte inline WRITE per WQE by BlueFlame, each rung alone (what `Qp::post_bf` does):
/// WQE `i` writes `i + 1` to slot `i`. The executor reads WQE 0's doorbell and is held (as a descheduled thread
/// is) before it takes the register's words; meanwhile WQEs 1..=256 are posted the same way. WQE 256's words are
/// in the register then, and its tag (the low byte of its index) is WQE 0's: they must not be taken for WQE 0.
#[test]
fn a_blueflame_write_256_wqes_later_is_not_taken_for_the_doorbell_read_before_it() {
    use std::sync::atomic::Ordering::SeqCst;
    let gate = Arc::new(GateCopier::default());
    let cfg = EmuConfig { gpu: Some(gate.clone()), ..EmuConfig::host() };
    let p = Pair::with_config(cfg, 512, 512);
    let n = 257usize;
    let dst = GuardedBuf::new(8 * n, 0);
    let mr = dst.register(&p.nic, &p.pd, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let mut sq = Sq::new(&p.a);
    let mut cq = CqPoll::new(&p.cq_a);
    let post = |sq: &mut Sq, i: usize| {
        let fm = if i + 1 == n { SIGNALED } else { 0 };
        let v = (i as u64 + 1).to_ne_bytes();
        let w = sq.inline_write(opcode::RDMA_WRITE, fm, &v, mr.loc().addr + 8 * i as u64, mr.rkey(), 0);
        assert_eq!(w.len(), 48, "one WQEBB, ds 3");
        let at = sq.put_bytes(&w);
        sq.dbrec();
        sq.blueflame(at);
    };
    gate.armed.store(true, SeqCst);
    post(&mut sq, 0);
    wait_until("the executor to read WQE 0's doorbell", || gate.entered.load(SeqCst));
    for i in 1..n {
        post(&mut sq, i);
    }
    gate.open.store(true, SeqCst);
    wait_until("the NIC to consume every WQE", || p.a.sq_consumed() == n as u64);
    let cqes: Vec<u16> = std::iter::from_fn(|| cq.poll()).map(|c| c.wqe_counter.get()).collect();
    let got: Vec<u64> = (0..n).map(|i| dst.u64_at(8 * i)).collect();
    let want: Vec<u64> = (1..=n as u64).collect();
    let wrong: Vec<(usize, u64)> =
        got.iter().enumerate().filter(|(i, &v)| v != want[*i]).map(|(i, &v)| (i, v)).collect();
    assert!(
        wrong.is_empty(),
        "slots with the wrong value (slot, value): {wrong:?}; CQEs for WQEs {cqes:?}; stats {:?}",
        p.nic.stats()
    );
    assert_eq!(cqes, [(n - 1) as u16], "one CQE, for the one signaled WQE");
    assert_eq!(p.nic.stats().blueflame_mismatches, 0);
}
