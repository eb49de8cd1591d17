//! MRs in GPU memory: the emulated NIC reaches them only through its `GpuCopier`, and synchronizes the copier
//! before anything that must be ordered after its operations and does not go through it (a CQE in host
//! memory, a READ, a host-memory write, an atomic response over the wire, MR deregistration), and no more
//! often.
//!
//! The copier here is a stand-in whose "GPU memory" is host memory and whose operations happen only at
//! `synchronize()` (bytes from host memory taken when enqueued, as the trait says): a NIC that forgot to
//! synchronize shows stale bytes, and one that freed a copy's GPU-side source or host destination before the
//! synchronize copies garbage.

mod emu_util;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use emu_util::*;
use gdaki::mem::{AtomicOp, GpuCopier, HostQueueMemory, MemKind, MemLoc, QueueMemory};
use gdaki::nic::emu::{vendor, Access, EmuConfig, EmuNic};
use gdaki_shared::prm::opcode::{self, syndrome};
use gdaki_shared::prm::wqe::AtomicSeg;
use rand::RngExt;

/// One deferred operation.
enum Deferred {
    Copy(MemLoc, MemLoc, usize),
    /// Bytes taken when enqueued; with `publish`, the last word stored last (Release).
    Write(MemLoc, Vec<u8>, bool),
    Atomic(MemLoc, AtomicOp, MemLoc),
}

impl Deferred {
    /// Runs the operation.
    ///
    /// # Safety
    /// The NIC's promise: every range valid until a synchronize returns (none returns before this ran);
    /// the "GPU" side is host memory in these tests, and an atomic's word is 8-byte aligned.
    unsafe fn run(self) {
        match self {
            // SAFETY: the caller's contract.
            Deferred::Copy(dst, src, len) => unsafe { std::ptr::copy(src.addr as *const u8, dst.addr as *mut u8, len) },
            Deferred::Write(dst, d, publish) => {
                let body = if publish { d.len() - 8 } else { d.len() };
                // SAFETY: the caller's contract.
                unsafe { std::ptr::copy(d.as_ptr(), dst.addr as *mut u8, body) };
                if publish {
                    let w = u64::from_ne_bytes(d[body..].try_into().unwrap());
                    // SAFETY: the caller's contract; `write_async` requires the last word to be aligned.
                    unsafe { AtomicU64::from_ptr((dst.addr + body as u64) as *mut u64) }.store(w, Ordering::Release);
                }
            }
            Deferred::Atomic(at, op, result) => {
                // SAFETY: the caller's contract.
                let word = unsafe { AtomicU64::from_ptr(at.addr as *mut u64) };
                let old = word.load(Ordering::Acquire);
                word.store(op.apply(old), Ordering::Release);
                // SAFETY: the caller's contract.
                unsafe { std::ptr::copy(old.to_ne_bytes().as_ptr(), result.addr as *mut u8, 8) };
            }
        }
    }
}

/// How long an operation waits before the copier's own thread runs it, like a slow GPU: a NIC that reads
/// what it enqueued before a synchronize sees stale bytes.
const DELAY: Duration = Duration::from_millis(2);

/// Operations enqueued by `copy_async`, `write_async` and `atomic_async` run in order, [`DELAY`] after they
/// were enqueued (on the copier's thread, as a GPU makes progress on its own) or at `synchronize`.
#[derive(Default)]
struct DeferredCopier {
    queue: Mutex<VecDeque<(Instant, Deferred)>>,
    syncs: AtomicU64,
    copies: AtomicU64,
    /// Fail every copy (to check the error path).
    broken: bool,
    /// Say that it reaches host memory (as pinned memory mapped into a GPU is reached): the NIC then runs
    /// its atomics on host MRs here too.
    maps_host: bool,
    /// Take operations, but drop them when they would run, and fail the next synchronize (operations that
    /// faulted on the GPU).
    faulting: bool,
    /// Operations were dropped since the last synchronize (`faulting`).
    faulted: AtomicBool,
    /// Run once, at the first copy (on the NIC's thread, in the middle of a batch).
    at_first_copy: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl DeferredCopier {
    /// Starts the copier's thread, which runs operations once they are [`DELAY`] old, until the copier is
    /// dropped.
    fn start(self) -> Arc<Self> {
        let c = Arc::new(self);
        let weak = Arc::downgrade(&c);
        std::thread::spawn(move || {
            while let Some(c) = weak.upgrade() {
                c.run(|at| at.elapsed() >= DELAY);
                drop(c);
                std::thread::sleep(Duration::from_micros(200));
            }
        });
        c
    }

    /// Runs (or, `faulting`, drops) the queued operations `due` says are due, in order.
    fn run(&self, due: impl Fn(Instant) -> bool) {
        let mut q = self.queue.lock().unwrap();
        while q.front().is_some_and(|(at, _)| due(*at)) {
            let (_, op) = q.pop_front().unwrap();
            if self.faulting {
                self.faulted.store(true, Ordering::Relaxed);
            } else {
                // SAFETY: the NIC's promise for every operation it enqueued; see `Deferred::run`.
                unsafe { op.run() };
            }
        }
    }

    fn check(&self, kind: MemKind) -> gdaki::Result<()> {
        if self.broken {
            return Err(gdaki::Error::Cuda {
                message: "CUDA_ERROR_ILLEGAL_ADDRESS (test)".into(),
                status: Some(gdaki::cuda::CUresult::CUDA_ERROR_ILLEGAL_ADDRESS),
            });
        }
        assert_eq!(kind, MemKind::Gpu, "a copier write outside GPU memory");
        Ok(())
    }

    fn enqueue(&self, op: Deferred) {
        if let Some(f) = self.at_first_copy.lock().unwrap().take() {
            f();
        }
        self.queue.lock().unwrap().push_back((Instant::now(), op));
        self.copies.fetch_add(1, Ordering::Relaxed);
    }
}

impl GpuCopier for DeferredCopier {
    unsafe fn copy_async(&self, dst: MemLoc, src: MemLoc, len: usize) -> gdaki::Result<()> {
        self.check(if src.kind == MemKind::Gpu { src.kind } else { dst.kind })?;
        // Bytes copied from host memory are taken now, as the trait says.
        let op = if src.kind == MemKind::Host && dst.kind == MemKind::Gpu {
            // SAFETY: the NIC promised `src` valid for `len` bytes during this call.
            Deferred::Write(dst, unsafe { std::slice::from_raw_parts(src.addr as *const u8, len) }.to_vec(), false)
        } else {
            Deferred::Copy(dst, src, len)
        };
        self.enqueue(op);
        Ok(())
    }

    unsafe fn write_async(&self, dst: MemLoc, data: &[u8], publish: bool) -> gdaki::Result<()> {
        self.check(dst.kind)?;
        self.enqueue(Deferred::Write(dst, data.to_vec(), publish));
        Ok(())
    }

    unsafe fn atomic_async(&self, at: MemLoc, op: AtomicOp, result: MemLoc) -> gdaki::Result<()> {
        assert_eq!((at.kind, result.kind), (MemKind::Gpu, MemKind::Gpu), "a copier atomic outside GPU memory");
        self.check(at.kind)?;
        self.enqueue(Deferred::Atomic(at, op, result));
        Ok(())
    }

    fn device_view(&self, addr: u64, _len: u64) -> Option<u64> {
        self.maps_host.then_some(addr)
    }

    fn alloc(&self, len: usize) -> gdaki::Result<gdaki::mem::GpuMem> {
        // These tests keep queues in host memory; the NIC's own GPU words (the scratch word of atomics
        // answered over the wire) are host memory standing for GPU memory, like the MRs.
        let buf = HostQueueMemory.alloc(len)?;
        Ok(gdaki::mem::GpuMem::new(buf.host_ptr() as u64, len, Box::new(buf)))
    }

    fn synchronize(&self) -> gdaki::Result<()> {
        if !self.queue.lock().unwrap().is_empty() {
            // Like a real GPU, take a while: a NIC that let something overtake the operations gets caught.
            std::thread::sleep(DELAY);
        }
        self.run(|_| true);
        self.syncs.fetch_add(1, Ordering::Relaxed);
        if self.faulted.swap(false, Ordering::Relaxed) {
            return Err(gdaki::Error::Cuda {
                message: "CUDA_ERROR_ILLEGAL_ADDRESS (test)".into(),
                status: Some(gdaki::cuda::CUresult::CUDA_ERROR_ILLEGAL_ADDRESS),
            });
        }
        Ok(())
    }
}

fn pair(copier: &Arc<DeferredCopier>) -> Pair {
    let cfg = EmuConfig {
        queue_mem: Arc::new(HostQueueMemory),
        gpu: Some(copier.clone()),
        queues: MemKind::Host,
        wire: None,
        blueflame: true,
    };
    Pair::with_config(cfg, 64, 64)
}

#[test]
fn gpu_mr_needs_a_copier() {
    let nic = EmuNic::open(EmuConfig::host()).unwrap();
    let pd = nic.alloc_pd().unwrap();
    let buf = GuardedBuf::new(64, 0);
    let loc = MemLoc { kind: MemKind::Gpu, addr: buf.addr() };
    // SAFETY: refused before anything could use it.
    assert!(unsafe { nic.reg_mr(&pd, loc, 64, Access::ALL) }.is_err());
}

#[test]
fn write_into_gpu_memory_is_placed_before_its_cqe() {
    let mut rng = rng();
    let copier = DeferredCopier::default().start();
    let p = pair(&copier);
    let (mut sq, mut cq) = (Sq::new(&p.a), CqPoll::new(&p.cq_a));
    let src = GuardedBuf::new(4096, 0);
    let dst = GuardedBuf::new(4096, 0);
    let lmr = src.register(&p.nic, &p.pd, Access::NONE);
    let rmr = dst.register_as(MemKind::Gpu, &p.nic, &p.pd, Access::ALL);
    let data = random_bytes(&mut rng, 4096);
    src.write(0, &data);
    let at = sq.post(&sq.write(SIGNALED, (lmr.lkey(), src.addr(), 4096), dst.addr(), rmr.rkey()));
    assert_req(&cq.wait(), opcode::RDMA_WRITE, sq.qpn(), at, 0);
    assert_eq!(dst.read(), data);
    // The copy, then the CQE behind it: while the copy is pending, the CQE into the host-memory CQ goes
    // through the copier too (through the ring's device address), so the NIC waits for nothing.
    assert_eq!(copier.copies.load(Ordering::Relaxed), 2);
    assert_eq!(copier.syncs.load(Ordering::Relaxed), 0);
    // Inline data into GPU memory goes through the copier's writes, its bytes taken when they are enqueued.
    let small = random_bytes(&mut rng, 100);
    let at = sq.post_bytes(&sq.inline_write(opcode::RDMA_WRITE, SIGNALED, &small, dst.addr() + 7, rmr.rkey(), 0));
    assert_req(&cq.wait(), opcode::RDMA_WRITE, sq.qpn(), at, 0);
    assert_eq!(&dst.read()[7..107], &small[..]);
    assert!(dst.guards_intact());
}

#[test]
fn atomic_on_host_memory_waits_for_earlier_gpu_writes() {
    let mut rng = rng();
    let copier = DeferredCopier::default().start();
    let p = pair(&copier);
    let mut sq = Sq::new(&p.a);
    let src = GuardedBuf::new(8192, 0);
    let dst = GuardedBuf::new(8192, 0);
    let sem = GuardedBuf::new(8, 0);
    let res = GuardedBuf::new(8, 0);
    let lmr = src.register_as(MemKind::Gpu, &p.nic, &p.pd, Access::NONE);
    let rmr = dst.register_as(MemKind::Gpu, &p.nic, &p.pd, Access::ALL);
    let smr = sem.register(&p.nic, &p.pd, Access::ALL);
    let xmr = res.register(&p.nic, &p.pd, Access::LOCAL_WRITE);
    for round in 1..=10u64 {
        let data = random_bytes(&mut rng, 8192);
        src.write(0, &data);
        // GPU → GPU payload, unsignaled, then the signal on a host semaphore.
        sq.put(&sq.write(0, (lmr.lkey(), src.addr(), 8192), dst.addr(), rmr.rkey()));
        let at = sq.put(&sq.atomic(
            opcode::ATOMIC_FA,
            0,
            AtomicSeg::fetch_add(1),
            (xmr.lkey(), res.addr()),
            sem.addr(),
            smr.rkey(),
        ));
        sq.dbrec();
        sq.doorbell(at);
        wait_until("semaphore", || sem.load_u64(0) == round);
        assert_eq!(dst.read(), data, "payload placed before the semaphore moved (round {round})");
    }
}

/// With a copier that reaches host memory (pinned memory mapped into the GPU), an atomic on a host MR behind
/// a WRITE into GPU memory runs on the copier, in order behind the WRITE, and the leg costs no synchronize.
#[test]
fn atomic_on_mapped_host_memory_runs_on_the_copier() {
    leg_without_synchronize(DeferredCopier { maps_host: true, ..DeferredCopier::default() }, MemKind::Host);
}

/// Five legs of a WRITE of 4 KiB into GPU memory and a signaled fetch-add of 3 on a semaphore whose word and
/// result are MRs of kind `words`: none synchronizes the copier, the semaphore moves only after the payload
/// is placed, and the old value lands.
fn leg_without_synchronize(copier: DeferredCopier, words: MemKind) {
    let mut rng = rng();
    let copier = copier.start();
    let p = pair(&copier);
    let (mut sq, mut cq) = (Sq::new(&p.a), CqPoll::new(&p.cq_a));
    let (src, dst) = (GuardedBuf::new(4096, 0), GuardedBuf::new(4096, 0));
    let (sem, res) = (GuardedBuf::new(8, 0), GuardedBuf::new(8, 0));
    let lmr = src.register_as(MemKind::Gpu, &p.nic, &p.pd, Access::NONE);
    let rmr = dst.register_as(MemKind::Gpu, &p.nic, &p.pd, Access::ALL);
    let smr = sem.register_as(words, &p.nic, &p.pd, Access::ALL);
    let xmr = res.register_as(words, &p.nic, &p.pd, Access::LOCAL_WRITE);
    for round in 0..5u64 {
        let data = random_bytes(&mut rng, 4096);
        src.write(0, &data);
        let before = copier.syncs.load(Ordering::Relaxed);
        sq.put(&sq.write(0, (lmr.lkey(), src.addr(), 4096), dst.addr(), rmr.rkey()));
        let at = sq.put(&sq.atomic(
            opcode::ATOMIC_FA,
            SIGNALED,
            AtomicSeg::fetch_add(3),
            (xmr.lkey(), res.addr()),
            sem.addr(),
            smr.rkey(),
        ));
        sq.dbrec();
        sq.doorbell(at);
        wait_until("semaphore", || sem.load_u64(0) == 3 * (round + 1));
        assert_eq!(dst.read(), data, "payload placed before the semaphore moved (round {round})");
        assert_req(&cq.wait(), opcode::ATOMIC_FA, sq.qpn(), at, 8);
        assert_eq!(copier.syncs.load(Ordering::Relaxed) - before, 0, "round {round}: the NIC waited on the host");
        assert_eq!(res.u64_at(0), 3 * round, "round {round}: the old value");
    }
    assert!([&src, &dst, &sem, &res].iter().all(|b| b.guards_intact()));
}

#[test]
fn read_and_atomic_on_gpu_memory() {
    let mut rng = rng();
    let copier = DeferredCopier::default().start();
    let p = pair(&copier);
    let (mut sq, mut cq) = (Sq::new(&p.a), CqPoll::new(&p.cq_a));
    let local = GuardedBuf::new(1024, 0);
    let remote = GuardedBuf::new(1024, 0);
    let lmr = local.register_as(MemKind::Gpu, &p.nic, &p.pd, Access::LOCAL_WRITE);
    let rmr = remote.register_as(MemKind::Gpu, &p.nic, &p.pd, Access::ALL);
    let data = random_bytes(&mut rng, 1024);
    remote.write(0, &data);
    let at = sq.post(&sq.read(SIGNALED, (lmr.lkey(), local.addr(), 1000), remote.addr() + 24, rmr.rkey()));
    assert_req(&cq.wait(), opcode::RDMA_READ, sq.qpn(), at, 1000);
    assert_eq!(&local.read()[..1000], &data[24..1024]);
    // Fetch-add on a GPU word; the old value lands in GPU memory too.
    let (init, add) = (remote.u64_at(0), rng.random::<u64>());
    let at = sq.post(&sq.atomic(
        opcode::ATOMIC_FA,
        SIGNALED,
        AtomicSeg::fetch_add(add),
        (lmr.lkey(), local.addr() + 1000),
        remote.addr(),
        rmr.rkey(),
    ));
    assert_req(&cq.wait(), opcode::ATOMIC_FA, sq.qpn(), at, 8);
    assert_eq!(local.u64_at(1000), init);
    assert_eq!(remote.u64_at(0), init.wrapping_add(add));
    assert!(local.guards_intact() && remote.guards_intact());
}

/// One ping-pong leg in GPU memory (an unsignaled WRITE, then a signaled fetch-add on the peer's semaphore with
/// its result in GPU memory, one doorbell) costs no synchronize: the atomic, its result and the CQE (into the
/// host-memory CQ through its device address) are the copier's own operations, behind the WRITE. Everything
/// is placed when the CQE is seen.
#[test]
fn a_gpu_memory_leg_never_synchronizes() {
    leg_without_synchronize(DeferredCopier::default(), MemKind::Gpu);
}

/// A doorbell batch of signaled WRITEs into GPU memory costs no synchronize: each success CQE follows its
/// copy through the copier, in order, and every CQE seen has its data in place.
#[test]
fn a_batch_of_signaled_gpu_writes_never_synchronizes() {
    let mut rng = rng();
    let copier = DeferredCopier::default().start();
    let p = pair(&copier);
    let (mut sq, mut cq) = (Sq::new(&p.a), CqPoll::new(&p.cq_a));
    let n = 16;
    let (src, dst) = (GuardedBuf::new(n * 512, 0), GuardedBuf::new(n * 512, 0));
    let lmr = src.register_as(MemKind::Gpu, &p.nic, &p.pd, Access::NONE);
    let rmr = dst.register_as(MemKind::Gpu, &p.nic, &p.pd, Access::ALL);
    for round in 0..3 {
        let data = random_bytes(&mut rng, n * 512);
        src.write(0, &data);
        let before = copier.syncs.load(Ordering::Relaxed);
        let mut last = 0;
        for i in 0..n {
            let off = (i * 512) as u64;
            last = sq.put(&sq.write(SIGNALED, (lmr.lkey(), src.addr() + off, 512), dst.addr() + off, rmr.rkey()));
        }
        sq.dbrec();
        sq.doorbell(last);
        for i in 0..n as u64 {
            assert_req(&cq.wait(), opcode::RDMA_WRITE, sq.qpn(), last + 1 - n as u64 + i, 0);
            let at = i as usize * 512;
            assert_eq!(&dst.read()[at..at + 512], &data[at..at + 512], "WRITE {i} placed before its CQE");
        }
        assert_eq!(dst.read(), data, "round {round}");
        assert_eq!(copier.syncs.load(Ordering::Relaxed) - before, 0, "round {round}");
    }
    assert!(src.guards_intact() && dst.guards_intact());
}

#[test]
fn mr_drop_waits_for_pending_gpu_copies() {
    let mut rng = rng();
    let copier = DeferredCopier::default().start();
    let p = pair(&copier);
    let mut sq = Sq::new(&p.a);
    let src = GuardedBuf::new(256, 0);
    let dst = GuardedBuf::new(256, 0);
    let lmr = src.register(&p.nic, &p.pd, Access::NONE);
    let rmr = dst.register_as(MemKind::Gpu, &p.nic, &p.pd, Access::ALL);
    let data = random_bytes(&mut rng, 256);
    src.write(0, &data);
    // Unsignaled: no CQE forces a synchronize.
    let at = sq.post(&sq.write(0, (lmr.lkey(), src.addr(), 256), dst.addr(), rmr.rkey()));
    wait_until("WQE consumed", || p.a.sq_consumed() == at + 1);
    let before = copier.syncs.load(Ordering::Relaxed);
    drop(rmr);
    assert!(copier.syncs.load(Ordering::Relaxed) > before, "deregistration synchronized the copier");
    assert!(copier.queue.lock().unwrap().is_empty());
    assert_eq!(dst.read(), data);
}

#[test]
fn failed_gpu_copy_is_a_local_access_error() {
    let copier = DeferredCopier { broken: true, ..Default::default() }.start();
    let p = pair(&copier);
    let (mut sq, mut cq) = (Sq::new(&p.a), CqPoll::new(&p.cq_a));
    let src = GuardedBuf::new(64, 0);
    let dst = GuardedBuf::new(64, 0);
    let lmr = src.register(&p.nic, &p.pd, Access::NONE);
    let rmr = dst.register_as(MemKind::Gpu, &p.nic, &p.pd, Access::ALL);
    let at = sq.post(&sq.write(0, (lmr.lkey(), src.addr(), 64), dst.addr(), rmr.rkey()));
    let e = assert_err(&cq.wait(), syndrome::LOCAL_ACCESS_ERR, opcode::RDMA_WRITE, sq.qpn(), at);
    assert_eq!(e.vendor_err_synd, vendor::GPU_COPY);
}

/// GPU memory on both ends of the wire: the requester reads its source through its copier, the responder
/// places through its own, and a fetch-add on the responder's GPU word lands after the WRITE before it.
#[test]
fn gpu_memory_across_the_wire() {
    use gdaki::nic::emu::WireConfig;
    let mut rng = rng();
    let (ca, cb) = (DeferredCopier::default().start(), DeferredCopier::default().start());
    let cfg = |c: &Arc<DeferredCopier>| {
        let gpu: Arc<dyn GpuCopier> = c.clone();
        EmuConfig {
            queue_mem: Arc::new(HostQueueMemory),
            gpu: Some(gpu),
            queues: MemKind::Host,
            wire: Some(WireConfig::loopback()),
            blueflame: true,
        }
    };
    let (na, nb) = (EmuNic::open(cfg(&ca)).unwrap(), EmuNic::open(cfg(&cb)).unwrap());
    let (pa, pb) = (na.alloc_pd().unwrap(), nb.alloc_pd().unwrap());
    let (cqa, cqb) = (na.create_cq(64).unwrap(), nb.create_cq(64).unwrap());
    let (a, b) = (na.create_qp(&pa, &cqa, 64).unwrap(), nb.create_qp(&pb, &cqb, 64).unwrap());
    a.connect(&b.endpoint()).unwrap();
    b.connect(&a.endpoint()).unwrap();
    let n = 300_000;
    let (src, dst, back) = (GuardedBuf::new(n, 0), GuardedBuf::new(n, 0xee), GuardedBuf::new(n, 0));
    let (sem, res) = (GuardedBuf::new(8, 0), GuardedBuf::new(8, 0));
    let smr = src.register_as(MemKind::Gpu, &na, &pa, Access::NONE);
    let bmr = back.register_as(MemKind::Gpu, &na, &pa, Access::LOCAL_WRITE);
    let rmr = res.register_as(MemKind::Gpu, &na, &pa, Access::LOCAL_WRITE);
    let dmr = dst.register_as(MemKind::Gpu, &nb, &pb, Access::ALL);
    let semr = sem.register_as(MemKind::Gpu, &nb, &pb, Access::ALL);
    let data = random_bytes(&mut rng, n);
    src.write(0, &data);
    let (mut sq, mut cq) = (Sq::new(&a), CqPoll::new(&cqa));
    // An unsignaled WRITE, then a signaled fetch-add: once the atomic's CQE is seen, both are placed.
    let _ = sq.put(&sq.write(0, (smr.lkey(), src.addr(), n as u32), dst.addr(), dmr.rkey()));
    let at = sq.put(&sq.atomic(
        opcode::ATOMIC_FA,
        SIGNALED,
        AtomicSeg::fetch_add(7),
        (rmr.lkey(), res.addr()),
        sem.addr(),
        semr.rkey(),
    ));
    sq.dbrec();
    sq.doorbell(at);
    assert_req(&cq.wait(), opcode::ATOMIC_FA, sq.qpn(), at, 8);
    assert_eq!(dst.read(), data, "WRITE placed before the atomic completed");
    assert_eq!((sem.u64_at(0), res.u64_at(0)), (7, 0));
    let at = sq.post(&sq.read(SIGNALED, (bmr.lkey(), back.addr(), n as u32), dst.addr(), dmr.rkey()));
    assert_req(&cq.wait(), opcode::RDMA_READ, sq.qpn(), at, n as u32);
    assert_eq!(back.read(), data);
    assert!(ca.copies.load(Ordering::Relaxed) > 0 && cb.copies.load(Ordering::Relaxed) > 0, "both copiers used");
    assert!([&src, &dst, &back, &sem, &res].iter().all(|b| b.guards_intact()));
}

/// Operations that fault on the GPU are lost, with the CQEs behind them (as after a GPU fault); the next
/// synchronize the NIC makes (a READ's, which follows the QP's earlier writes) fails that WQE with the copy's
/// local access error, the QP moves to the error state, and a later WQE is flushed.
#[test]
fn a_faulting_copy_fails_the_next_wqe_that_waits_for_it() {
    let copier = DeferredCopier { faulting: true, ..Default::default() }.start();
    let p = pair(&copier);
    let (mut sq, mut cq) = (Sq::new(&p.a), CqPoll::new(&p.cq_a));
    let (src, dst) = (GuardedBuf::new(3 * 64, 0), GuardedBuf::new(3 * 64, 0));
    let lmr = src.register(&p.nic, &p.pd, Access::NONE);
    let rmr = dst.register_as(MemKind::Gpu, &p.nic, &p.pd, Access::ALL);
    let bmr = src.register(&p.nic, &p.pd, Access::LOCAL_WRITE);
    // Unsignaled: a success CQE behind a faulted copy would be lost with it (the CQ would skip an entry).
    for i in 0..3u64 {
        let _ = sq.put(&sq.write(0, (lmr.lkey(), src.addr() + 64 * i, 64), dst.addr() + 64 * i, rmr.rkey()));
    }
    let read = sq.put(&sq.read(SIGNALED, (bmr.lkey(), src.addr(), 64), dst.addr(), rmr.rkey()));
    sq.dbrec();
    sq.doorbell(read);
    let e = assert_err(&cq.wait(), syndrome::LOCAL_ACCESS_ERR, opcode::RDMA_READ, sq.qpn(), read);
    assert_eq!(e.vendor_err_synd, vendor::GPU_COPY);
    let after = sq.post(&sq.write(SIGNALED, (lmr.lkey(), src.addr(), 64), dst.addr(), rmr.rkey()));
    assert_err(&cq.wait(), syndrome::WR_FLUSH_ERR, opcode::RDMA_WRITE, sq.qpn(), after);
}

/// A doorbell rung while the NIC takes an earlier one joins that batch: its WQEs run and their success CQEs
/// follow, with no synchronize (posters that each ring their own doorbell, as in Block and Device sharing).
/// Deterministic: the second doorbell rings from inside the NIC's first copy.
#[test]
fn a_doorbell_rung_during_a_batch_joins_it() {
    let mut rng = rng();
    let copier = DeferredCopier::default().start();
    let p = pair(&copier);
    let (mut sq, mut cq) = (Sq::new(&p.a), CqPoll::new(&p.cq_a));
    let (src, dst) = (GuardedBuf::new(16 * 256, 0), GuardedBuf::new(16 * 256, 0));
    let lmr = src.register_as(MemKind::Gpu, &p.nic, &p.pd, Access::NONE);
    let rmr = dst.register_as(MemKind::Gpu, &p.nic, &p.pd, Access::ALL);
    let data = random_bytes(&mut rng, 16 * 256);
    src.write(0, &data);
    let idx: Vec<u64> = (0..16u64)
        .map(|i| sq.put(&sq.write(SIGNALED, (lmr.lkey(), src.addr() + 256 * i, 256), dst.addr() + 256 * i, rmr.rkey())))
        .collect();
    sq.dbrec();
    let (reg, second) = (sq.h.bf_reg, sq.ctrl_bits(idx[15]));
    *copier.at_first_copy.lock().unwrap() = Some(Box::new(move || {
        // SAFETY: the QP's BlueFlame register, 8-aligned, alive while the QP is (the test holds it).
        unsafe { AtomicU64::from_ptr(reg as *mut u64) }.store(second, Ordering::Release);
    }));
    let before = copier.syncs.load(Ordering::Relaxed);
    sq.doorbell(idx[7]);
    for &at in &idx {
        assert_req(&cq.wait(), opcode::RDMA_WRITE, sq.qpn(), at, 0);
    }
    assert_eq!(dst.read(), data);
    assert_eq!(copier.syncs.load(Ordering::Relaxed) - before, 0, "no synchronize for either doorbell");
    assert!(src.guards_intact() && dst.guards_intact());
}
