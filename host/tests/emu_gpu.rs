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

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use emu_util::*;
use gdaki::mem::{AtomicOp, GpuCopier, HostQueueMemory, MemKind, MemLoc, QueueMemory};
use gdaki::nic::emu::{vendor, Access, EmuConfig, EmuNic};
use gdaki_shared::prm::opcode::{self, syndrome};
use gdaki_shared::prm::wqe::AtomicSeg;
use rand::RngExt;

/// One deferred operation.
enum Deferred {
    Copy(MemLoc, MemLoc, usize),
    Write(MemLoc, Vec<u8>),
    Atomic(MemLoc, AtomicOp, MemLoc),
}

/// Operations enqueued by `copy_async`, `write_async` and `atomic_async` run only at `synchronize`.
#[derive(Default)]
struct DeferredCopier {
    queue: Mutex<Vec<Deferred>>,
    syncs: AtomicU64,
    copies: AtomicU64,
    /// Fail every copy (to check the error path).
    broken: bool,
    /// Take copies, but fail every synchronize that has any to run (a copy that faulted on the GPU).
    faulting: bool,
    /// Run once, at the first copy (on the NIC's thread, in the middle of a batch).
    at_first_copy: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl DeferredCopier {
    fn enqueue(&self, kind: MemKind, op: Deferred) -> gdaki::Result<()> {
        if self.broken {
            return Err(gdaki::Error::Cuda {
                message: "CUDA_ERROR_ILLEGAL_ADDRESS (test)".into(),
                status: Some(gdaki::cuda::CUresult::CUDA_ERROR_ILLEGAL_ADDRESS),
            });
        }
        assert_eq!(kind, MemKind::Gpu, "a copier write outside GPU memory");
        if let Some(f) = self.at_first_copy.lock().unwrap().take() {
            f();
        }
        self.queue.lock().unwrap().push(op);
        self.copies.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

impl GpuCopier for DeferredCopier {
    unsafe fn copy_async(&self, dst: MemLoc, src: MemLoc, len: usize) -> gdaki::Result<()> {
        if self.broken {
            return Err(gdaki::Error::Cuda {
                message: "CUDA_ERROR_ILLEGAL_ADDRESS (test)".into(),
                status: Some(gdaki::cuda::CUresult::CUDA_ERROR_ILLEGAL_ADDRESS),
            });
        }
        assert!(dst.kind == MemKind::Gpu || src.kind == MemKind::Gpu, "a copier copy without GPU memory");
        if let Some(f) = self.at_first_copy.lock().unwrap().take() {
            f();
        }
        // Bytes copied from host memory are taken now, as the trait says.
        let op = if src.kind == MemKind::Host && dst.kind == MemKind::Gpu {
            // SAFETY: the NIC promised `src` valid for `len` bytes during this call.
            Deferred::Write(dst, unsafe { std::slice::from_raw_parts(src.addr as *const u8, len) }.to_vec())
        } else {
            Deferred::Copy(dst, src, len)
        };
        self.queue.lock().unwrap().push(op);
        self.copies.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    unsafe fn write_async(&self, dst: MemLoc, data: &[u8], _publish: bool) -> gdaki::Result<()> {
        self.enqueue(dst.kind, Deferred::Write(dst, data.to_vec()))
    }

    unsafe fn atomic_async(&self, at: MemLoc, op: AtomicOp, result: MemLoc) -> gdaki::Result<()> {
        assert_eq!((at.kind, result.kind), (MemKind::Gpu, MemKind::Gpu), "a copier atomic outside GPU memory");
        self.enqueue(at.kind, Deferred::Atomic(at, op, result))
    }

    fn alloc(&self, len: usize) -> gdaki::Result<gdaki::mem::GpuMem> {
        // These tests keep queues in host memory; the NIC's own GPU words (the scratch word of atomics
        // answered over the wire) are host memory standing for GPU memory, like the MRs.
        let buf = HostQueueMemory.alloc(len)?;
        Ok(gdaki::mem::GpuMem::new(buf.host_ptr() as u64, len, Box::new(buf)))
    }

    fn synchronize(&self) -> gdaki::Result<()> {
        let mut q = self.queue.lock().unwrap();
        if self.faulting && !q.is_empty() {
            q.clear();
            return Err(gdaki::Error::Cuda {
                message: "CUDA_ERROR_ILLEGAL_ADDRESS (test)".into(),
                status: Some(gdaki::cuda::CUresult::CUDA_ERROR_ILLEGAL_ADDRESS),
            });
        }
        if !q.is_empty() {
            // Like a real GPU, take a while: a NIC that let something overtake the copies gets caught.
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        for op in q.drain(..) {
            // The NIC promised every range valid until this synchronize returns; the "GPU" side is host memory
            // in this test, and an atomic's word is 8-byte aligned.
            match op {
                // SAFETY: as said above.
                Deferred::Copy(dst, src, len) => unsafe {
                    std::ptr::copy(src.addr as *const u8, dst.addr as *mut u8, len)
                },
                // SAFETY: as said above.
                Deferred::Write(dst, d) => unsafe { std::ptr::copy(d.as_ptr(), dst.addr as *mut u8, d.len()) },
                Deferred::Atomic(at, op, result) => {
                    // SAFETY: as said above.
                    let old = unsafe { (at.addr as *const u64).read() };
                    // SAFETY: as said above.
                    unsafe { (at.addr as *mut u64).write(op.apply(old)) };
                    // SAFETY: as said above.
                    unsafe { std::ptr::copy(old.to_ne_bytes().as_ptr(), result.addr as *mut u8, 8) };
                }
            }
        }
        self.syncs.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

fn pair(copier: &Arc<DeferredCopier>) -> Pair {
    let cfg = EmuConfig {
        queue_mem: Arc::new(HostQueueMemory),
        gpu: Some(copier.clone()),
        queues: MemKind::Host,
        wire: None,
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
    let copier = Arc::new(DeferredCopier::default());
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
    assert_eq!(copier.copies.load(Ordering::Relaxed), 1);
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
    let copier = Arc::new(DeferredCopier::default());
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

#[test]
fn read_and_atomic_on_gpu_memory() {
    let mut rng = rng();
    let copier = Arc::new(DeferredCopier::default());
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
/// its result in GPU memory, one doorbell) costs one synchronize, the CQE's (its CQ is in host memory): the
/// atomic and its result are the copier's own operations, behind the WRITE, with no wait. Everything is placed
/// when the CQE is seen.
#[test]
fn a_gpu_memory_leg_synchronizes_once() {
    let mut rng = rng();
    let copier = Arc::new(DeferredCopier::default());
    let p = pair(&copier);
    let (mut sq, mut cq) = (Sq::new(&p.a), CqPoll::new(&p.cq_a));
    let (src, dst) = (GuardedBuf::new(4096, 0), GuardedBuf::new(4096, 0));
    let (sem, res) = (GuardedBuf::new(8, 0), GuardedBuf::new(8, 0));
    let lmr = src.register_as(MemKind::Gpu, &p.nic, &p.pd, Access::NONE);
    let rmr = dst.register_as(MemKind::Gpu, &p.nic, &p.pd, Access::ALL);
    let smr = sem.register_as(MemKind::Gpu, &p.nic, &p.pd, Access::ALL);
    let xmr = res.register_as(MemKind::Gpu, &p.nic, &p.pd, Access::LOCAL_WRITE);
    for round in 0..5u64 {
        let data = random_bytes(&mut rng, 4096);
        src.write(0, &data);
        let before = copier.syncs.load(Ordering::Relaxed);
        sq.put(&sq.write(0, (lmr.lkey(), src.addr(), 4096), dst.addr(), rmr.rkey()));
        let at = sq.put(&sq.atomic(
            opcode::ATOMIC_FA,
            SIGNALED,
            AtomicSeg::fetch_add(1),
            (xmr.lkey(), res.addr()),
            sem.addr(),
            smr.rkey(),
        ));
        sq.dbrec();
        sq.doorbell(at);
        assert_req(&cq.wait(), opcode::ATOMIC_FA, sq.qpn(), at, 8);
        assert_eq!(copier.syncs.load(Ordering::Relaxed) - before, 1, "round {round}");
        assert_eq!(dst.read(), data, "round {round}");
        assert_eq!((sem.u64_at(0), res.u64_at(0)), (round + 1, round), "round {round}");
    }
    assert!([&src, &dst, &sem, &res].iter().all(|b| b.guards_intact()));
}

/// A doorbell batch of signaled WRITEs into GPU memory costs one synchronize, not one per CQE: the success
/// CQEs wait, in order, until the batch's copies are placed, and every CQE seen has its data in place.
#[test]
fn a_batch_of_signaled_gpu_writes_synchronizes_once() {
    let mut rng = rng();
    let copier = Arc::new(DeferredCopier::default());
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
        assert_eq!(copier.syncs.load(Ordering::Relaxed) - before, 1, "round {round}");
    }
    assert!(src.guards_intact() && dst.guards_intact());
}

#[test]
fn mr_drop_waits_for_pending_gpu_copies() {
    let mut rng = rng();
    let copier = Arc::new(DeferredCopier::default());
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
    let copier = Arc::new(DeferredCopier { broken: true, ..Default::default() });
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
    let (ca, cb) = (Arc::new(DeferredCopier::default()), Arc::new(DeferredCopier::default()));
    let cfg = |c: &Arc<DeferredCopier>| {
        let gpu: Arc<dyn GpuCopier> = c.clone();
        EmuConfig {
            queue_mem: Arc::new(HostQueueMemory),
            gpu: Some(gpu),
            queues: MemKind::Host,
            wire: Some(WireConfig::loopback()),
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

/// A batch whose copies fault when synchronized: the first held WQE fails with the copy's local access error
/// and the QP moves to the error state, the others of the batch are flushed, in order.
#[test]
fn a_faulting_batch_fails_its_first_wqe_and_flushes_the_rest() {
    let copier = Arc::new(DeferredCopier { faulting: true, ..Default::default() });
    let p = pair(&copier);
    let (mut sq, mut cq) = (Sq::new(&p.a), CqPoll::new(&p.cq_a));
    let (src, dst) = (GuardedBuf::new(3 * 64, 0), GuardedBuf::new(3 * 64, 0));
    let lmr = src.register(&p.nic, &p.pd, Access::NONE);
    let rmr = dst.register_as(MemKind::Gpu, &p.nic, &p.pd, Access::ALL);
    let mut last = 0;
    for i in 0..3u64 {
        last = sq.put(&sq.write(SIGNALED, (lmr.lkey(), src.addr() + 64 * i, 64), dst.addr() + 64 * i, rmr.rkey()));
    }
    sq.dbrec();
    sq.doorbell(last);
    let e = assert_err(&cq.wait(), syndrome::LOCAL_ACCESS_ERR, opcode::RDMA_WRITE, sq.qpn(), last - 2);
    assert_eq!(e.vendor_err_synd, vendor::GPU_COPY);
    assert_err(&cq.wait(), syndrome::WR_FLUSH_ERR, opcode::RDMA_WRITE, sq.qpn(), last - 1);
    assert_err(&cq.wait(), syndrome::WR_FLUSH_ERR, opcode::RDMA_WRITE, sq.qpn(), last);
}

/// A doorbell rung while the NIC takes an earlier one joins that batch: its WQEs run and its success CQEs are
/// written after the same one synchronize (posters that each ring their own doorbell, as in Block and Device
/// sharing, share it). Deterministic: the second doorbell rings from inside the NIC's first copy.
#[test]
fn a_doorbell_rung_during_a_batch_joins_it() {
    let mut rng = rng();
    let copier = Arc::new(DeferredCopier::default());
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
    assert_eq!(copier.syncs.load(Ordering::Relaxed) - before, 1, "both doorbells in one batch");
    assert!(src.guards_intact() && dst.guards_intact());
}
