//! Destroying a QP is synchronous with the emulated NIC's executor thread: once `drop` returns, no WQE of the
//! QP runs and no CQE for it is written, and the queue memory is freed by the dropping thread, never by the
//! executor (whose thread is named `emu-nic-<id>`): on the `gpu` executor that free is `cuMemFreeHost`, which
//! blocks while any kernel runs.

mod emu_util;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use emu_util::*;
use gdaki::mem::{HostQueueMemory, MappedBuf, QueueMemory};
use gdaki::nic::emu::{Access, EmuConfig, EmuNic, QpState};
use gdaki_shared::handle::CqHandle;
use gdaki_shared::prm::opcode;
use rand::RngExt;

/// Queue memory from [`HostQueueMemory`] whose `MappedBuf` owners record the name of the thread that drops
/// them. With `keep_alive`, the allocations themselves outlive the NIC's buffers (until this value is
/// dropped), so that a test can keep writing a destroyed QP's ring and doorbell as a misbehaving device would.
#[derive(Default)]
struct ProbedQueueMemory {
    keep_alive: bool,
    kept: Mutex<Vec<Arc<MappedBuf>>>,
    allocs: AtomicU64,
    /// Names of the threads that dropped a buffer of the NIC, one per buffer.
    drops: Arc<Mutex<Vec<String>>>,
}

/// The owner of one NIC buffer: holds the real allocation and records who drops it.
struct Probe {
    _buf: Arc<MappedBuf>,
    drops: Arc<Mutex<Vec<String>>>,
}

impl Drop for Probe {
    fn drop(&mut self) {
        let name = std::thread::current().name().unwrap_or("<unnamed>").to_string();
        self.drops.lock().unwrap_or_else(|e| e.into_inner()).push(name);
    }
}

impl QueueMemory for ProbedQueueMemory {
    fn alloc(&self, len: usize) -> gdaki::Result<MappedBuf> {
        let real = Arc::new(HostQueueMemory.alloc(len)?);
        if self.keep_alive {
            self.kept.lock().unwrap().push(real.clone());
        }
        self.allocs.fetch_add(1, Ordering::Relaxed);
        let (ptr, addr) = (real.host_ptr(), real.device_addr());
        let owner = Box::new(Probe { _buf: real, drops: self.drops.clone() });
        // SAFETY: the same zeroed, 4096-aligned bytes as `real`, which `owner` keeps alive.
        Ok(unsafe { MappedBuf::from_raw(ptr, addr, len, owner) })
    }
}

impl ProbedQueueMemory {
    fn drops(&self) -> Vec<String> {
        self.drops.lock().unwrap().clone()
    }

    /// Asserts that every buffer allocated so far was dropped, and none of them by an executor thread.
    fn assert_all_freed_off_the_executor(&self) {
        let drops = self.drops();
        assert_eq!(drops.len() as u64, self.allocs.load(Ordering::Relaxed), "every queue buffer freed: {drops:?}");
        assert!(
            drops.iter().all(|n| !n.starts_with("emu-nic-")),
            "the executor thread dropped queue memory: {drops:?}"
        );
    }
}

fn config(mem: &Arc<ProbedQueueMemory>) -> EmuConfig {
    EmuConfig { queue_mem: mem.clone(), gpu: None, queues: gdaki::mem::MemKind::Host, wire: None, blueflame: true }
}

/// The words of a CQ's ring, read with atomic loads.
fn ring_words(h: &CqHandle) -> Vec<u64> {
    (0..h.ncqe as u64 * 8)
        .map(|i| {
            // SAFETY: an 8-aligned word inside the CQ ring, which the test's queue memory keeps alive.
            unsafe { AtomicU64::from_ptr((h.buf + 8 * i) as *mut u64) }.load(Ordering::Acquire)
        })
        .collect()
}

#[test]
fn no_wqe_of_a_dropped_qp_runs_after_drop_returns() {
    const WQE_CNT: u32 = 256;
    const SLOTS: usize = 512;
    const ROUNDS: usize = 40;
    let mut rng = rng();
    for round in 0..ROUNDS {
        let mem = Arc::new(ProbedQueueMemory { keep_alive: true, ..Default::default() });
        let Pair { nic, pd, cq_a, cq_b, a, b } = Pair::with_config(config(&mem), WQE_CNT, WQE_CNT);
        let dst = GuardedBuf::new(SLOTS * 8, 0);
        let rmr = dst.register(&nic, &pd, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
        let rkey = rmr.rkey();
        let (mut sq, mut cq) = (Sq::new(&a), CqPoll::new(&cq_a));
        let cq_h = cq.h;
        let (dropped, stop) = (AtomicBool::new(false), AtomicBool::new(false));
        let completions = AtomicU64::new(0);
        let settle = Duration::from_micros(rng.random_range(0..3000));
        let (produced, placed, ring) = std::thread::scope(|s| {
            let poster = s.spawn(|| {
                // Device code that ignores the destruction: posts 8-byte inline WRITEs of a sequence number
                // into slot `seq % SLOTS`, each with its doorbell, and polls the CQ to free ring entries. Once
                // the QP is gone it fills the whole ring, then keeps ringing (alternating doorbells).
                let mut seq = 0u64;
                let mut ringing = false;
                while !stop.load(Ordering::Relaxed) {
                    while let Some(c) = cq.poll() {
                        assert_eq!(c.opcode(), opcode::cqe::REQ, "{:?}", c.as_err());
                        completions.fetch_add(1, Ordering::Relaxed);
                    }
                    let outstanding = sq.pi - cq.ci;
                    let limit = if dropped.load(Ordering::Relaxed) { WQE_CNT as u64 - 1 } else { 32 };
                    if outstanding < limit {
                        let raddr = dst.addr() + (seq as usize % SLOTS) as u64 * 8;
                        let w = sq.inline_write(opcode::RDMA_WRITE, SIGNALED, &seq.to_ne_bytes(), raddr, rkey, 0);
                        sq.post_bytes(&w);
                        seq += 1;
                    } else if dropped.load(Ordering::Relaxed) && sq.pi >= 2 {
                        let at = if ringing { sq.pi - 1 } else { sq.pi - 2 };
                        ringing = !ringing;
                        sq.doorbell(at);
                    } else {
                        std::thread::yield_now();
                    }
                }
                seq
            });
            // Let it run, then drop the QP while it posts.
            let t = Instant::now();
            while t.elapsed() < settle || completions.load(Ordering::Relaxed) < 4 {
                assert!(t.elapsed() < CQE_TIMEOUT, "round {round}: the poster made no progress");
                std::thread::yield_now();
            }
            drop(a);
            let after = (cq_a.produced(), dst.read(), ring_words(&cq_h));
            dropped.store(true, Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(20));
            stop.store(true, Ordering::Relaxed);
            let posted = poster.join().expect("poster");
            assert!(posted > 4, "round {round}: the poster posted");
            after
        });
        // The poster may not have been scheduled again before `stop` (a loaded machine): the CQEs it left are
        // polled here, so the count below is every CQE written, each checked.
        while let Some(c) = cq.poll() {
            assert_eq!(c.opcode(), opcode::cqe::REQ, "{:?}", c.as_err());
            completions.fetch_add(1, Ordering::Relaxed);
        }
        assert_eq!(cq_a.produced(), produced, "round {round}: a CQE was written after drop returned");
        assert_eq!(ring_words(&cq_h), ring, "round {round}: the CQ ring changed after drop returned");
        assert_eq!(dst.read(), placed, "round {round}: bytes landed after drop returned");
        assert!(dst.guards_intact());
        assert_eq!(completions.load(Ordering::Relaxed), produced, "round {round}: CQEs polled");
        assert_eq!(b.state(), QpState::Rts);
        drop((rmr, b, cq_a, cq_b, pd, nic));
    }
}

#[test]
fn queue_memory_is_never_freed_by_the_executor_thread() {
    let mut rng = rng();
    let mem = Arc::new(ProbedQueueMemory::default());
    let nic = EmuNic::open(config(&mem)).unwrap();
    let pd = nic.alloc_pd().unwrap();
    let dst = GuardedBuf::new(4096, 0);
    let rmr = dst.register(&nic, &pd, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    for round in 0..8 {
        let cq_a = nic.create_cq(64).unwrap();
        let cq_b = nic.create_cq(64).unwrap();
        let a = nic.create_qp(&pd, &cq_a, 64).unwrap();
        let b = nic.create_qp(&pd, &cq_b, 64).unwrap();
        a.connect(&b.endpoint()).unwrap();
        b.connect(&a.endpoint()).unwrap();
        let (mut sq, mut cq, mut peer_cq) = (Sq::new(&a), CqPoll::new(&cq_a), CqPoll::new(&cq_b));
        // Traffic that makes the executor look up `b` as a's peer (and write b's CQ): WRITE with immediate.
        for i in 0..4u32 {
            let data = random_bytes(&mut rng, 16);
            let at = sq.post_bytes(&sq.inline_write(
                opcode::RDMA_WRITE_IMM,
                SIGNALED,
                &data,
                dst.addr() + 16 * i as u64,
                rmr.rkey(),
                i,
            ));
            assert_req(&cq.wait(), opcode::RDMA_WRITE_IMM, sq.qpn(), at, 0);
            assert_eq!(peer_cq.wait().opcode(), opcode::cqe::RESP_WR_IMM);
        }
        // Each round drops in another order; every order must leave the frees to this thread.
        match round % 4 {
            0 => drop((a, b, cq_a, cq_b)),
            1 => drop((cq_a, cq_b, b, a)),
            2 => {
                // The peer first, then a doorbell of `a` that makes the executor look for it.
                drop(b);
                let at = sq.post_bytes(&sq.inline_write(
                    opcode::RDMA_WRITE_IMM,
                    SIGNALED,
                    &[1; 8],
                    dst.addr(),
                    rmr.rkey(),
                    9,
                ));
                assert_err(&cq.wait(), 0x15, opcode::RDMA_WRITE_IMM, sq.qpn(), at);
                drop((cq_b, a, cq_a));
            }
            _ => {
                // Idle long enough for the executor to sleep: drop must wake it rather than wait it out.
                std::thread::sleep(Duration::from_millis(5));
                drop((cq_b, cq_a));
                let t = Instant::now();
                drop(a);
                drop(b);
                assert!(t.elapsed() < Duration::from_secs(1), "drop of idle QPs took {:?}", t.elapsed());
            }
        }
    }
    drop((rmr, pd));
    drop(nic);
    mem.assert_all_freed_off_the_executor();
}

#[test]
fn dropping_many_qps_is_quick_and_leaves_the_others_running() {
    let mem = Arc::new(ProbedQueueMemory::default());
    let p = Pair::with_config(config(&mem), 64, 64);
    let (mut sq, mut cq) = (Sq::new(&p.a), CqPoll::new(&p.cq_a));
    let t = Instant::now();
    for _ in 0..64 {
        let q = p.nic.create_qp(&p.pd, &p.cq_b, 16).unwrap();
        drop(q);
    }
    // Each drop waits for one sweep of the executor, microseconds; the bound only catches a drop that waits
    // for its timeout instead of the executor's acknowledgement.
    assert!(t.elapsed() < Duration::from_secs(4), "64 create+drop took {:?}", t.elapsed());
    let at = sq.post(&sq.nop(SIGNALED));
    assert_req(&cq.wait(), opcode::NOP, sq.qpn(), at, 0);
    assert!(mem.drops().iter().all(|n| !n.starts_with("emu-nic-")), "{:?}", mem.drops());
}
