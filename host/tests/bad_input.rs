//! Bad input and misuse, as a careless or hostile user would try them, on the `cpu` executor and the emulated
//! NIC: the host API (`EmuNic`, executors) and device code
//! (`gdaki_device::qp::Qp`, one-sided operations, bounded waits) with forged handles, odd sizes and zero
//! timeouts, and resources dropped in odd orders while device code runs.
//!
//! The rule checked everywhere: no panic, no hang (every wait bounded), no silent data loss, no
//! write outside a registered region (guard bytes), and each error a typed value with a clear one-line
//! message.

mod emu_util;

use std::collections::VecDeque;
use std::ops::RangeInclusive;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use emu_util::{
    assert_err, assert_req, local_range, random_bytes, remote_range, rng, wait_until, CqPoll, GuardedBuf, Pair, Sq,
    CQE_TIMEOUT, SIGNALED,
};
use gdaki::exec::{Executor, ExecutorKind};
use gdaki::mem::{MemKind, MemLoc};
use gdaki::nic::emu::{
    cmd_syndrome, vendor, Access, Cq, EmuConfig, EmuNic, Endpoint, Pd, Qp, QpState, WireConfig, MAX_CQE, MAX_WQE_CNT,
    MIN_WQE_CNT,
};
use gdaki_device::error::{CqeError, InvalidArgument, Timeout, WaitOn};
use gdaki_device::qp::{Qp as DevQp, Ticket};
use gdaki_device::wait::semaphore_ge;
use gdaki_device::wqe::{self, Raddr, Sge};
use gdaki_device::Error;
use gdaki_shared::handle::{MrHandle, QpHandle, RemoteMr};
use gdaki_shared::prm::cmd;
use gdaki_shared::prm::cqe::Cqe64;
use gdaki_shared::prm::opcode::{self, syndrome};
use gdaki_shared::prm::wqe::{fm_ce_se, CtrlSeg, DataSeg, RaddrSeg, Seg};
use gdaki_shared::Be32;
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};

/// Bound of device-side waits in tests that expect success (a loaded 2-core machine), short enough that a
/// hang fails the test rather than the CI job.
const TIMEOUT_NS: u64 = 10_000_000_000;

/// Bound of device-side waits in tests that expect a timeout.
const SHORT_NS: u64 = 20_000_000;

/// Wraps `h` as an Exclusive device QP whose waits give up after `timeout_ns`.
fn dev_qp(h: &mut QpHandle, timeout_ns: u64) -> DevQp<'_> {
    // SAFETY: every handle passed here comes from `emu::Qp::handle()` of a QP (and CQ) that the calling test
    // keeps alive for longer than the borrow; its queues are host memory (cpu executor), and only the calling
    // thread posts to it or polls its CQ while the returned value lives.
    unsafe { DevQp::new(h, timeout_ns) }
}

/// An error CQE as device code reports it.
fn cqe(syndrome: u8, vendor_err_synd: u8, wqe_index: u64, qpn: u32) -> Error {
    Error::Cqe(CqeError { syndrome, vendor_err_synd, wqe_counter: wqe_index as u16, qpn })
}

fn inval<T>(a: InvalidArgument) -> Result<T, Error> {
    Err(Error::InvalidArgument(a))
}

/// Asserts that `msg` is one non-empty line.
fn one_line(msg: &str) {
    assert!(!msg.trim().is_empty() && !msg.trim_end().contains('\n'), "not one line: {msg:?}");
}

/// Asserts that `r` is an `InvalidArgument` whose message is one line mentioning every word of `words`.
fn host_inval<T: std::fmt::Debug>(r: gdaki::Result<T>, words: &[&str]) {
    match r {
        Err(e @ gdaki::Error::InvalidArgument(_)) => {
            let m = e.to_string();
            one_line(&m);
            for w in words {
                assert!(m.contains(w), "{m:?} does not mention {w:?}");
            }
        }
        other => panic!("expected InvalidArgument mentioning {words:?}, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------------------
// Executors
// ---------------------------------------------------------------------------------------------------------

#[test]
fn executor_names_are_exact_and_errors_name_the_input() {
    for bad in ["", "CPU", "Gpu", " cpu", "cpu ", "cuda", "cpu\n"] {
        let r: gdaki::Result<ExecutorKind> = bad.parse();
        host_inval(r.map(|_| ()), &["cpu or gpu", &format!("{bad:?}")]);
    }
    assert_eq!("cpu".parse::<ExecutorKind>().unwrap(), ExecutorKind::Cpu);
    assert_eq!(
        ("gpu".parse::<ExecutorKind>().unwrap(), ExecutorKind::Gpu.to_string()),
        (ExecutorKind::Gpu, "gpu".into())
    );
    assert_eq!(ExecutorKind::Cpu.to_string(), "cpu", "printed as the flag takes it");
    match Executor::open(Some(ExecutorKind::Gpu)) {
        Ok(_) => eprintln!("this machine has a GPU"),
        Err(e @ gdaki::Error::Unavailable(_)) => one_line(&e.to_string()),
        Err(e) => panic!("a missing GPU must be Unavailable, not {e:?}"),
    }
    // The automatic choice never fails for lack of a GPU.
    let (exec, _notice) = Executor::open(None).unwrap();
    let _ = exec.kind();
}

#[test]
fn executor_data_buffers_of_zero_and_absurd_sizes() {
    let e = Executor::Cpu;
    let b = e.alloc_data(0).unwrap();
    assert!(b.is_empty() && b.to_vec().unwrap().is_empty());
    // Sizes that no allocation layout can describe (over isize::MAX once rounded up to the 4 KiB alignment)
    // are argument errors; 2^62 bytes is a valid layout that no 64-bit address space (at most 2^57 bytes) can
    // hold, so the allocator returns null: out of memory, with the size.
    for (huge, message) in [
        (usize::MAX, "invalid argument: a host buffer of 18446744073709551615 bytes is too large"),
        (usize::MAX / 2, "invalid argument: a host buffer of 9223372036854775807 bytes is too large"),
        (1 << 62, "out of memory allocating 4611686018427387904 bytes"),
    ] {
        let e = e.alloc_data(huge).expect_err("an absurd size was allocated");
        match e {
            gdaki::Error::InvalidArgument(_) if huge != 1 << 62 => {}
            gdaki::Error::OutOfMemory(n) if huge == 1 << 62 => assert_eq!(n, huge),
            _ => panic!("{huge} bytes: {e:?}"),
        }
        assert_eq!(e.to_string(), message);
    }
}

// ---------------------------------------------------------------------------------------------------------
// EmuNic: registration, queues, connection
// ---------------------------------------------------------------------------------------------------------

#[test]
fn reg_mr_rejects_zero_null_wrapping_and_rightless_ranges() {
    // Host queues whatever GDAKI_QUEUES says: without a GPU copier, a GPU-memory MR must be refused.
    let nic = EmuNic::open(EmuConfig::host()).unwrap();
    let other = EmuNic::open(EmuConfig::host()).unwrap();
    let pd = nic.alloc_pd().unwrap();
    let other_pd = other.alloc_pd().unwrap();
    let buf = GuardedBuf::new(64, 0);
    let host = |addr| MemLoc { kind: MemKind::Host, addr };
    let cases: [(MemLoc, u64, Access, &Pd, &[&str]); 8] = [
        (host(buf.addr()), 0, Access::ALL, &pd, &["length is zero"]),
        (host(0), 64, Access::ALL, &pd, &["null"]),
        (host(u64::MAX - 10), 64, Access::ALL, &pd, &["wraps"]),
        (host(1), u64::MAX, Access::ALL, &pd, &["wraps"]),
        (host(buf.addr()), 64, Access::REMOTE_WRITE, &pd, &["LOCAL_WRITE"]),
        (host(buf.addr()), 64, Access::REMOTE_ATOMIC | Access::REMOTE_READ, &pd, &["LOCAL_WRITE"]),
        (MemLoc { kind: MemKind::Gpu, addr: buf.addr() }, 64, Access::ALL, &pd, &["GPU"]),
        (host(buf.addr()), 64, Access::ALL, &other_pd, &["PD", "NIC"]),
    ];
    for (loc, len, access, pd, words) in cases {
        // SAFETY: every case is rejected before the NIC could touch memory; none returns an Mr.
        let r = unsafe { nic.reg_mr(pd, loc, len, access) };
        host_inval(r.map(|_| ()), words);
    }
    assert!(buf.guards_intact());
}

#[test]
fn overlapping_mrs_each_keep_their_own_rights_and_survive_each_other() {
    const LEN: usize = 256;
    let (src, dst) = (GuardedBuf::new(LEN, 0x5a), GuardedBuf::new(LEN, 0));
    let p = Pair::new(16, 16);
    let lmr = src.register(&p.nic, &p.pd, Access::NONE);
    // The same bytes three times: writable whole, read-only whole, writable second half.
    let rw = dst.register(&p.nic, &p.pd, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let ro = dst.register(&p.nic, &p.pd, Access::REMOTE_READ);
    let loc = MemLoc { kind: MemKind::Host, addr: dst.addr() + 128 };
    // SAFETY: `dst` outlives the MR (dropped at the end of the test, after the MR).
    let half = unsafe { p.nic.reg_mr(&p.pd, loc, 128, Access::LOCAL_WRITE | Access::REMOTE_WRITE) }.unwrap();
    assert!(rw.rkey() != ro.rkey() && ro.rkey() != half.rkey() && rw.rkey() != half.rkey());
    let mut h = p.a.handle();
    let mut qp = dev_qp(&mut h, TIMEOUT_NS);
    // Dropping the whole-range writable MR leaves the others working.
    drop(rw);
    qp.put(&half.remote(), 0, &lmr.handle(), 0, 128).unwrap();
    qp.flush().unwrap();
    let got = dst.read();
    assert!(got[..128].iter().all(|&b| b == 0) && got[128..].iter().all(|&b| b == 0x5a));
    // The read-only one refuses a write, and nothing is placed.
    dst.fill(0);
    let at = qp.handle().sq.pi;
    qp.put(&ro.remote(), 0, &lmr.handle(), 0, 8).unwrap();
    assert_eq!(qp.flush(), Err(cqe(syndrome::REMOTE_ACCESS_ERR, vendor::REMOTE_ACCESS, at, qp.handle().qpn)));
    assert!(dst.read().iter().all(|&b| b == 0) && dst.guards_intact());
}

#[test]
fn stale_keys_stay_dead_across_many_re_registrations() {
    let p = Pair::new(16, 16);
    let (src, dst) = (GuardedBuf::new(64, 0x33), GuardedBuf::new(64, 0));
    let lmr = src.register(&p.nic, &p.pd, Access::NONE);
    let first = dst.register(&p.nic, &p.pd, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let stale = first.remote();
    drop(first);
    // New MRs over the same bytes reuse the key slot again and again; the stale rkey names none of the next
    // 255 (the key's variant byte has 8 bits, as an mlx5 mkey's: the 256th reuse of one slot repeats it).
    let mut now = None;
    for _ in 0..255 {
        drop(now.take());
        now = Some(dst.register(&p.nic, &p.pd, Access::LOCAL_WRITE | Access::REMOTE_WRITE));
        assert_ne!(now.as_ref().unwrap().rkey(), stale.rkey.get());
    }
    let mut h = p.a.handle();
    let mut qp = dev_qp(&mut h, TIMEOUT_NS);
    qp.put(&stale, 0, &lmr.handle(), 0, 64).unwrap();
    assert_eq!(qp.flush(), Err(cqe(syndrome::REMOTE_ACCESS_ERR, vendor::BAD_RKEY, 0, qp.handle().qpn)));
    assert!(dst.read().iter().all(|&b| b == 0));
    drop(now);
}

#[test]
fn queues_of_bad_sizes_are_refused_with_the_limits_named() {
    let nic = EmuNic::open(EmuConfig::host_or_env().unwrap()).unwrap();
    let other = EmuNic::open(EmuConfig::host_or_env().unwrap()).unwrap();
    let pd = nic.alloc_pd().unwrap();
    for n in [0, 3, 48, MAX_CQE + 1, MAX_CQE * 2, u32::MAX, 1 << 31] {
        host_inval(nic.create_cq(n).map(|_| ()), &[&n.to_string(), "power of two"]);
    }
    let cq = nic.create_cq(64).unwrap();
    for n in [0, 1, 8, MIN_WQE_CNT - 1, 17, 48, MAX_WQE_CNT * 2, u32::MAX] {
        host_inval(nic.create_qp(&pd, &cq, n).map(|_| ()), &[&n.to_string(), "power of two"]);
    }
    host_inval(nic.create_qp(&pd, &cq, 128).map(|_| ()), &["smaller than SQ"]);
    let other_cq = other.create_cq(64).unwrap();
    let other_pd = other.alloc_pd().unwrap();
    host_inval(nic.create_qp(&pd, &other_cq, 16).map(|_| ()), &["CQ", "NIC"]);
    host_inval(nic.create_qp(&other_pd, &cq, 16).map(|_| ()), &["PD", "NIC"]);
    // The extremes that are allowed work.
    let big_cq = nic.create_cq(MAX_WQE_CNT).unwrap();
    let qp = nic.create_qp(&pd, &big_cq, MAX_WQE_CNT).unwrap();
    assert_eq!(qp.handle().wqe_cnt, MAX_WQE_CNT);
    let tiny = nic.create_cq(1).unwrap();
    assert_eq!(tiny.ncqe(), 1);
}

#[test]
fn connect_misuse_is_refused_and_leaves_the_qp_usable() {
    let nic = EmuNic::open(EmuConfig::host_or_env().unwrap()).unwrap();
    let other = EmuNic::open(EmuConfig::host_or_env().unwrap()).unwrap();
    let pd = nic.alloc_pd().unwrap();
    let cq = nic.create_cq(16).unwrap();
    let (a, b) = (nic.create_qp(&pd, &cq, 16).unwrap(), nic.create_qp(&pd, &cq, 16).unwrap());
    let (opd, ocq) = (other.alloc_pd().unwrap(), other.create_cq(16).unwrap());
    let foreign = other.create_qp(&opd, &ocq, 16).unwrap();
    // A QP of another NIC, a QPN that does not exist, a destroyed QP.
    host_inval(a.connect(&foreign.endpoint()), &["NIC"]);
    let mut ghost = b.endpoint();
    ghost.qpn = 0xdead;
    host_inval(a.connect(&ghost), &["0xdead"]);
    let gone = nic.create_qp(&pd, &cq, 16).unwrap();
    let gone_ep = gone.endpoint();
    drop(gone);
    host_inval(a.connect(&gone_ep), &[&format!("{:#x}", gone_ep.qpn)]);
    // None of that moved `a` out of RESET: it still connects, once.
    assert_eq!(a.state(), QpState::Reset);
    a.connect(&b.endpoint()).unwrap();
    assert_eq!(a.state(), QpState::Rts);
    host_inval(a.connect(&b.endpoint()), &["RESET"]);
    host_inval(a.connect(&a.endpoint()), &["RESET"]);
    assert_eq!(a.state(), QpState::Rts);
}

/// Wire addresses that cannot be dialed (an unspecified address, port 0) are refused as neighbours, and a
/// connect of a QP that has left RESET is refused as such whatever address its endpoint names; the QP still
/// carries traffic.
#[test]
fn undialable_neighbours_and_connects_out_of_reset_are_refused() {
    let cfg = || EmuConfig::host_or_env().unwrap().with_wire(WireConfig::loopback());
    let (na, nb) = (EmuNic::open(cfg()).unwrap(), EmuNic::open(cfg()).unwrap());
    let (pa, pb) = (na.alloc_pd().unwrap(), nb.alloc_pd().unwrap());
    let (ca, cb) = (na.create_cq(16).unwrap(), nb.create_cq(16).unwrap());
    let (a, b) = (na.create_qp(&pa, &ca, 16).unwrap(), nb.create_qp(&pb, &cb, 16).unwrap());
    a.connect(&b.endpoint()).unwrap();
    b.connect(&a.endpoint()).unwrap();
    for wire in ["0.0.0.0:0", "127.0.0.1:0", "[::]:4000"] {
        host_inval(na.add_neighbor(&nb.gid(), wire.parse().unwrap()), &[wire, "cannot be dialed"]);
    }
    for wire in ["127.0.0.1:1", "0.0.0.0:0", "[::]:4000"] {
        let bogus = Endpoint { wire: Some(wire.parse().unwrap()), ..b.endpoint() };
        host_inval(a.connect(&bogus), &["RESET"]);
    }
    let (src, dst) = (GuardedBuf::new(64, 0x5c), GuardedBuf::new(64, 0));
    let lmr = src.register(&na, &pa, Access::NONE);
    let rmr = dst.register(&nb, &pb, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let mut h = a.handle();
    let mut qp = dev_qp(&mut h, TIMEOUT_NS);
    qp.put(&rmr.remote(), 0, &lmr.handle(), 0, 64).unwrap();
    qp.flush().unwrap();
    assert!(dst.read().iter().all(|&x| x == 0x5c) && dst.guards_intact());
}

/// A connect that fails after RST2INIT (INIT2RTR: the thread that dials the peer's NIC could not start)
/// returns the firmware's error and leaves the QP in ERR: a WQE device code posts on it later completes at once
/// with a flush error (0x05) and moves nothing, where a QP left in INIT or RTR would never execute it and the
/// wait would run out its bound. A new QP connects in its place.
#[test]
fn a_connect_that_fails_past_reset_leaves_the_qp_in_error_and_later_wqes_flush() {
    let cfg = || EmuConfig::host_or_env().unwrap().with_wire(WireConfig::loopback());
    let (n1, n2) = (EmuNic::open(cfg()).unwrap(), EmuNic::open(cfg()).unwrap());
    // The QP with the smaller (NIC, QPN) dials the other's NIC: its INIT2RTR starts the thread that fails.
    let (na, nb) = if n1.id() < n2.id() { (n1, n2) } else { (n2, n1) };
    let (pa, pb) = (na.alloc_pd().unwrap(), nb.alloc_pd().unwrap());
    let (ca, cb) = (na.create_cq(16).unwrap(), nb.create_cq(16).unwrap());
    let (a, b) = (na.create_qp(&pa, &ca, 16).unwrap(), nb.create_qp(&pb, &cb, 16).unwrap());
    na.fail_next_dialer();
    match a.connect(&b.endpoint()) {
        Err(gdaki::Error::DevxCmd { opcode, status, syndrome, .. }) => assert_eq!(
            (opcode, status, syndrome),
            (cmd::opcode::INIT2RTR_QP, cmd::status::INTERNAL_ERR, cmd_syndrome::WIRE_THREAD),
            "INIT2RTR's own error, not the 2ERR's"
        ),
        other => panic!("expected INIT2RTR's INTERNAL_ERR, got {other:?}"),
    }
    assert_eq!(a.state(), QpState::Error);
    host_inval(a.connect(&b.endpoint()), &["RESET"]);

    let (src, dst) = (GuardedBuf::new(64, 0x3d), GuardedBuf::new(64, 0));
    let lmr = src.register(&na, &pa, Access::NONE);
    let rmr = dst.register(&nb, &pb, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let mut h = a.handle();
    let mut qp = dev_qp(&mut h, TIMEOUT_NS);
    let t0 = Instant::now();
    qp.put(&rmr.remote(), 0, &lmr.handle(), 0, 64).unwrap();
    assert_eq!(qp.flush(), Err(cqe(syndrome::WR_FLUSH_ERR, vendor::FLUSHED, 0, a.qpn())));
    assert!(t0.elapsed() < Duration::from_secs(2), "the flush error took {:?}", t0.elapsed());
    assert!(dst.read().iter().all(|&x| x == 0) && dst.guards_intact());

    // The hook fired once: a new QP in its place connects and carries traffic. It gets a CQ of its own: the
    // flush returned at the put's flush error, and the flush error of the NOP it posted behind the put may reach
    // `ca` later (on a loaded machine, after the new QP's first poll, which took it for its own and failed with
    // UnexpectedCqe).
    let ca2 = na.create_cq(16).unwrap();
    let a2 = na.create_qp(&pa, &ca2, 16).unwrap();
    a2.connect(&b.endpoint()).unwrap();
    b.connect(&a2.endpoint()).unwrap();
    let mut h2 = a2.handle();
    let mut qp2 = dev_qp(&mut h2, TIMEOUT_NS);
    qp2.put(&rmr.remote(), 0, &lmr.handle(), 0, 64).unwrap();
    qp2.flush().unwrap();
    assert!(dst.read().iter().all(|&x| x == 0x3d) && dst.guards_intact());
}

#[test]
fn a_qp_connected_to_itself_writes_into_its_own_nic_memory() {
    let (src, dst) = (GuardedBuf::new(100, 0x6b), GuardedBuf::new(100, 0));
    let nic = EmuNic::open(EmuConfig::host_or_env().unwrap()).unwrap();
    let pd = nic.alloc_pd().unwrap();
    let cq = nic.create_cq(16).unwrap();
    let q = nic.create_qp(&pd, &cq, 16).unwrap();
    q.connect(&q.endpoint()).unwrap();
    let lmr = src.register(&nic, &pd, Access::NONE);
    let rmr = dst.register(&nic, &pd, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let mut h = q.handle();
    let mut qp = dev_qp(&mut h, TIMEOUT_NS);
    qp.put(&rmr.remote(), 1, &lmr.handle(), 0, 99).unwrap();
    qp.flush().unwrap();
    let got = dst.read();
    assert!(got[0] == 0 && got[1..].iter().all(|&b| b == 0x6b) && dst.guards_intact());
}

#[test]
fn dropping_cq_pd_and_nic_handles_before_the_qp_keeps_the_qp_working() {
    let (src, dst) = (GuardedBuf::new(64, 0x42), GuardedBuf::new(64, 0));
    let p = Pair::new(16, 16);
    let lmr = src.register(&p.nic, &p.pd, Access::NONE);
    let rmr = dst.register(&p.nic, &p.pd, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let emu_util::Pair { nic, pd, cq_a, cq_b, a, b } = p;
    let mut h = a.handle();
    // The QPs keep their CQs' memory, the PD is a number, the MRs and QPs keep the NIC.
    drop((cq_a, cq_b, pd, nic));
    let mut qp = dev_qp(&mut h, TIMEOUT_NS);
    qp.put(&rmr.remote(), 0, &lmr.handle(), 0, 64).unwrap();
    qp.flush().unwrap();
    assert!(dst.read().iter().all(|&b| b == 0x42));
    drop((a, b));
}

// ---------------------------------------------------------------------------------------------------------
// Dropping things while device code runs on another thread
// ---------------------------------------------------------------------------------------------------------

/// Runs `rounds` of "fill the source with round k's byte, put it, flush" on QP `h` until a round fails, and
/// returns that failure (or `None` if all succeed). `stop` ends it early without an error.
fn put_rounds(h: &mut QpHandle, dst: RemoteMr, src: (&GuardedBuf, MrHandle), stop: &AtomicBool) -> Option<Error> {
    let mut qp = dev_qp(h, TIMEOUT_NS);
    for k in 0..200_000u32 {
        if stop.load(Ordering::Acquire) {
            return None;
        }
        // The previous flush returned: the NIC no longer reads the source.
        src.0.fill((k % 251) as u8 + 1);
        if let Err(e) = qp.put(&dst, 0, &src.1, 0, dst.length).and_then(|()| qp.flush()) {
            return Some(e);
        }
    }
    None
}

#[test]
fn dropping_the_target_mr_while_a_thread_puts_stops_every_write_at_once() {
    const LEN: usize = 4096;
    let (src, dst) = (GuardedBuf::new(LEN, 0), GuardedBuf::new(LEN, 0));
    let p = Pair::new(64, 64);
    let lmr = src.register(&p.nic, &p.pd, Access::NONE);
    let rmr = dst.register(&p.nic, &p.pd, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let (remote, local) = (rmr.remote(), lmr.handle());
    let stop = AtomicBool::new(false);
    let mut h = p.a.handle();
    let (err, after_drop) = std::thread::scope(|s| {
        let t = s.spawn(|| put_rounds(&mut h, remote, (&src, local), &stop));
        // Let some rounds land, then deregister under the poster's feet.
        while p.nic.stats().wqes < 20 {
            std::thread::yield_now();
        }
        drop(rmr);
        let after_drop = dst.read();
        (t.join().unwrap(), after_drop)
    });
    // The poster got the protection error (stale rkey) and nothing after it.
    assert_eq!(err.map(|e| matches!(e, Error::Cqe(c) if c.syndrome == syndrome::REMOTE_ACCESS_ERR)), Some(true));
    assert_eq!(p.a.state(), QpState::Error);
    std::thread::sleep(Duration::from_millis(20));
    assert!(dst.read() == after_drop, "the NIC wrote into the region after its MR was dropped");
    assert!(dst.guards_intact() && src.guards_intact());
}

#[test]
fn dropping_the_source_mr_while_a_thread_puts_fails_with_a_local_protection_error() {
    const LEN: usize = 4096;
    let (src, dst) = (GuardedBuf::new(LEN, 0), GuardedBuf::new(LEN, 0));
    let p = Pair::new(64, 64);
    let lmr = src.register(&p.nic, &p.pd, Access::NONE);
    let rmr = dst.register(&p.nic, &p.pd, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let (remote, local) = (rmr.remote(), lmr.handle());
    let stop = AtomicBool::new(false);
    let mut h = p.a.handle();
    let err = std::thread::scope(|s| {
        let t = s.spawn(|| put_rounds(&mut h, remote, (&src, local), &stop));
        while p.nic.stats().wqes < 20 {
            std::thread::yield_now();
        }
        drop(lmr);
        t.join().unwrap()
    });
    let Some(Error::Cqe(c)) = err else { panic!("{err:?}") };
    assert_eq!((c.syndrome, c.vendor_err_synd), (syndrome::LOCAL_PROT_ERR, vendor::BAD_LKEY));
    assert!(dst.guards_intact() && src.guards_intact());
}

#[test]
fn dropping_the_peer_qp_while_a_thread_puts_fails_with_retry_exceeded_in_bounded_time() {
    const LEN: usize = 4096;
    let (src, dst) = (GuardedBuf::new(LEN, 0), GuardedBuf::new(LEN, 0));
    let p = Pair::new(64, 64);
    let lmr = src.register(&p.nic, &p.pd, Access::NONE);
    let rmr = dst.register(&p.nic, &p.pd, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let (remote, local) = (rmr.remote(), lmr.handle());
    let stop = AtomicBool::new(false);
    let emu_util::Pair { nic, pd: _pd, cq_a: _cq_a, cq_b: _cq_b, a, b } = p;
    let mut h = a.handle();
    let t0 = Instant::now();
    let err = std::thread::scope(|s| {
        let t = s.spawn(|| put_rounds(&mut h, remote, (&src, local), &stop));
        while nic.stats().wqes < 20 {
            std::thread::yield_now();
        }
        drop(b);
        t.join().unwrap()
    });
    assert!(t0.elapsed() < Duration::from_secs(8), "took {:?}", t0.elapsed());
    let Some(Error::Cqe(c)) = err else { panic!("{err:?}") };
    assert_eq!((c.syndrome, c.vendor_err_synd), (syndrome::TRANSPORT_RETRY_EXC_ERR, vendor::NO_PEER));
    // Later posts are flushed, not executed, and flush keeps reporting the first error (sticky in the handle).
    let mut qp = dev_qp(&mut h, TIMEOUT_NS);
    let before = dst.read();
    qp.put(&remote, 0, &local, 0, 8).unwrap();
    assert!(matches!(qp.flush(), Err(Error::Cqe(x)) if x == c));
    assert!(dst.read() == before && dst.guards_intact());
}

// ---------------------------------------------------------------------------------------------------------
// Device code: forged handles, odd lengths and offsets
// ---------------------------------------------------------------------------------------------------------

/// A healthy pair with a 4 KiB source and destination; `f` gets the device QP and both MRs' handles.
fn with_put_fixture(f: impl FnOnce(&mut DevQp<'_>, MrHandle, RemoteMr, &GuardedBuf, &Pair)) {
    const LEN: usize = 4096;
    let (src, dst) = (GuardedBuf::new(LEN, 0x77), GuardedBuf::new(LEN, 0));
    let p = Pair::new(16, 16);
    let lmr = src.register(&p.nic, &p.pd, Access::NONE);
    let rmr = dst.register(&p.nic, &p.pd, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let mut h = p.a.handle();
    let mut qp = dev_qp(&mut h, TIMEOUT_NS);
    f(&mut qp, lmr.handle(), rmr.remote(), &dst, &p);
    assert!(dst.guards_intact() && src.guards_intact(), "a guard byte changed");
}

#[test]
fn zeroed_and_truncated_handles_are_argument_errors_and_post_nothing() {
    with_put_fixture(|qp, l, r, dst, p| {
        let (zl, zr) = (MrHandle::default(), RemoteMr::default());
        assert_eq!(qp.put(&zr, 0, &l, 0, 8), remote_range(0, 8, 0));
        assert_eq!(qp.put(&r, 0, &zl, 0, 8), local_range(0, 8, 0));
        assert_eq!(qp.signal(&zr, 0, &zl, 0), remote_range(0, 8, 0));
        assert_eq!(qp.put(&r, 0, &l, 0, u64::MAX), remote_range(0, u64::MAX, 4096));
        assert_eq!(qp.put(&r, u64::MAX, &l, u64::MAX, u64::MAX), remote_range(u64::MAX, u64::MAX, 4096));
        // Handles that claim more than 2^31 bytes get past the range checks but not the length check.
        let (bl, br) = (MrHandle { length: u64::MAX, ..l }, RemoteMr { length: u64::MAX, ..r });
        assert_eq!(qp.put(&br, 0, &bl, 0, 1 << 31), inval(InvalidArgument::Length));
        assert_eq!(qp.put(&br, 0, &bl, 0, u64::MAX), inval(InvalidArgument::Length));
        assert_eq!(qp.put(&r, 0, &l, 0, 0), inval(InvalidArgument::Length));
        let e = qp.put(&r, 1, &l, 0, 4096).unwrap_err();
        one_line(&e.to_string());
        assert!(e.to_string().contains("remote range of 4096 bytes at offset 1 "), "{e}");
        assert_eq!((qp.handle().sq.pi, qp.handle().sq.sig_end), (0, 0), "a rejected call took SQ room");
        qp.flush().unwrap();
        assert_eq!(p.nic.stats().doorbells, 0);
        assert!(dst.read().iter().all(|&b| b == 0));
    });
}

#[test]
fn handles_that_lie_about_their_length_are_stopped_by_the_nic() {
    with_put_fixture(|qp, l, r, dst, _| {
        // The remote handle claims 1 MiB: the put passes device checks, the NIC refuses it (0x13).
        let big_r = RemoteMr { length: 1 << 20, ..r };
        qp.put(&big_r, 4000, &l, 0, 200).unwrap();
        assert_eq!(qp.flush(), Err(cqe(syndrome::REMOTE_ACCESS_ERR, vendor::REMOTE_BOUNDS, 0, qp.handle().qpn)));
        assert!(dst.read().iter().all(|&b| b == 0));
    });
    with_put_fixture(|qp, l, r, dst, _| {
        // The local handle claims more than was registered: 0x04, nothing read or placed.
        let big_l = MrHandle { length: 1 << 20, ..l };
        qp.put(&r, 0, &big_l, 4000, 200).unwrap();
        assert_eq!(qp.flush(), Err(cqe(syndrome::LOCAL_PROT_ERR, vendor::LOCAL_BOUNDS, 0, qp.handle().qpn)));
        assert!(dst.read().iter().all(|&b| b == 0));
    });
    // Keys that were never issued (0, all ones, a small integer), one case per healthy QP.
    for (rk, lk, synd, vendor_synd) in [
        (Some(0), None, syndrome::REMOTE_ACCESS_ERR, vendor::BAD_RKEY),
        (Some(u32::MAX), None, syndrome::REMOTE_ACCESS_ERR, vendor::BAD_RKEY),
        (None, Some(0xff), syndrome::LOCAL_PROT_ERR, vendor::BAD_LKEY),
        (None, Some(0), syndrome::LOCAL_PROT_ERR, vendor::BAD_LKEY),
    ] {
        with_put_fixture(|qp, l, r, dst, _| {
            let r = RemoteMr { rkey: rk.map_or(r.rkey, Be32::new), ..r };
            let l = MrHandle { lkey: lk.map_or(l.lkey, Be32::new), ..l };
            qp.put(&r, 0, &l, 0, 64).unwrap();
            assert_eq!(qp.flush(), Err(cqe(synd, vendor_synd, 0, qp.handle().qpn)), "rkey {rk:?}, lkey {lk:?}");
            assert!(dst.read().iter().all(|&b| b == 0));
        });
    }
}

#[test]
fn handle_addresses_that_overflow_are_range_errors_not_panics() {
    with_put_fixture(|qp, l, r, _, _| {
        let top_r = RemoteMr { addr: u64::MAX - 8, length: 64, ..r };
        assert_eq!(qp.put(&top_r, 32, &l, 0, 8), remote_range(32, 8, 64));
        let top_l = MrHandle { addr: u64::MAX - 8, length: 64, ..l };
        assert_eq!(qp.put(&r, 0, &top_l, 32, 8), local_range(32, 8, 64));
    });
}

/// The NICs (A's first), PDs, CQs and QPs (A → B) of [`pair_on`].
type Connected = (Vec<Arc<EmuNic>>, (Pd, Pd), (Cq, Cq), (Qp, Qp));

/// Two connected QPs, each on its own NIC over the wire when `wire`, else both on one NIC.
fn pair_on(wire: bool) -> Connected {
    let cfg = || {
        let c = EmuConfig::host_or_env().unwrap();
        if wire {
            c.with_wire(WireConfig::loopback())
        } else {
            c
        }
    };
    let na = EmuNic::open(cfg()).unwrap();
    let nb = if wire { EmuNic::open(cfg()).unwrap() } else { na.clone() };
    let (pa, pb) = (na.alloc_pd().unwrap(), nb.alloc_pd().unwrap());
    let (ca, cb) = (na.create_cq(16).unwrap(), nb.create_cq(16).unwrap());
    let a = na.create_qp(&pa, &ca, 16).unwrap();
    let b = nb.create_qp(&pb, &cb, 16).unwrap();
    a.connect(&b.endpoint()).unwrap();
    b.connect(&a.endpoint()).unwrap();
    (vec![na, nb], (pa, pb), (ca, cb), (a, b))
}

#[test]
fn a_signal_whose_result_cannot_be_written_does_not_touch_the_semaphore() {
    // On one NIC and across the wire alike: the requester checks where the old value lands before the
    // request leaves, so the peer's semaphore never moves for a signal that fails (a peer waiting on it
    // would otherwise go on while the signaller's QP is in the error state), and a WQE with a bad result
    // word and a bad remote word fails for its result word on both paths.
    for wire in [false, true] {
        let (sem, res) = (GuardedBuf::new(16, 0), GuardedBuf::new(8, 0x99));
        let (nics, (pa, pb), _cqs, (a, _b)) = pair_on(wire);
        let sem_mr = sem.register(&nics[1], &pb, Access::LOCAL_WRITE | Access::REMOTE_ATOMIC);
        // No LOCAL_WRITE: the NIC may not place the old value here.
        let res_mr = res.register(&nics[0], &pa, Access::NONE);
        let mut h = a.handle();
        let mut qp = dev_qp(&mut h, TIMEOUT_NS);
        let t = qp.signal(&sem_mr.remote(), 0, &res_mr.handle(), 0).unwrap();
        assert_eq!(
            qp.wait(t),
            Err(cqe(syndrome::LOCAL_PROT_ERR, vendor::LOCAL_ACCESS, 0, qp.handle().qpn)),
            "wire {wire}"
        );
        drop(qp);
        // Misaligned remote word as well (built by hand: the builders refuse it): still the result word's error.
        let (nics, (pa, pb), _cqs, (a, _b)) = pair_on(wire);
        let sem_mr2 = sem.register(&nics[1], &pb, Access::LOCAL_WRITE | Access::REMOTE_ATOMIC);
        let res_mr2 = res.register(&nics[0], &pa, Access::NONE);
        let mut h = a.handle();
        let mut qp = dev_qp(&mut h, TIMEOUT_NS);
        let r = sem_mr2.remote();
        let l = res_mr2.handle();
        // SAFETY: an atomic WQE of the PRM layout whose only defects are the ones under test.
        let t = unsafe {
            qp.post_raw(true, 4, |c| {
                let w = wqe::atomic_fetch_add(
                    Raddr { addr: r.addr, rkey: r.rkey },
                    Sge::new(l.addr, 8, l.lkey).unwrap(),
                    1,
                )
                .unwrap()
                .encode(c);
                [w[0], RaddrSeg::new(r.addr + 4, r.rkey).into(), w[2], w[3]]
            })
        }
        .unwrap();
        qp.ring_db();
        assert_eq!(
            qp.wait(t),
            Err(cqe(syndrome::LOCAL_PROT_ERR, vendor::LOCAL_ACCESS, 0, qp.handle().qpn)),
            "wire {wire}"
        );
        drop(qp);
        assert_eq!(sem.load_u64(0), 0, "the semaphore moved although the signal failed (wire {wire})");
        assert_eq!(sem.load_u64(8), 0, "the misaligned word moved (wire {wire})");
        assert!(res.read().iter().all(|&b| b == 0x99) && sem.guards_intact() && res.guards_intact());
        drop((sem_mr, res_mr, sem_mr2, res_mr2));
    }
}

#[test]
fn a_wqe_with_a_wrong_qpn_or_index_gets_an_error_cqe_and_nothing_moves() {
    with_put_fixture(|qp, l, r, dst, p| {
        let raddr: Seg = RaddrSeg::new(r.addr, r.rkey).into();
        let data: Seg = DataSeg::new(64, l.lkey, l.addr).into();
        let ctrl = |idx: u16, qpn: u32| -> Seg {
            CtrlSeg::new(idx, opcode::RDMA_WRITE, 0, qpn, fm_ce_se::CQ_UPDATE, 3, 0, Be32::ZERO).into()
        };
        // Another QP's number: the builders cannot say it, `post_raw` can.
        // SAFETY: malformed on purpose; the emulated NIC must refuse it.
        let t = unsafe { qp.post_raw(true, 3, |c| [ctrl(c.idx, c.qpn ^ 1), raddr, data]) }.unwrap();
        assert_eq!(qp.wait(t), Err(cqe(syndrome::LOCAL_QP_OP_ERR, vendor::BAD_QPN, t.0, qp.handle().qpn)));
        assert_eq!(p.a.state(), QpState::Error);
        // Then a WQE index from the future, on the QP now in the error state: flushed (0x05) at its slot, as
        // every WQE after an error is, whatever its ctrl segment says. Waiting on it reports the QP's first
        // error (sticky); the CQ holds the flush.
        let first = cqe(syndrome::LOCAL_QP_OP_ERR, vendor::BAD_QPN, t.0, qp.handle().qpn);
        // SAFETY: as above.
        let t = unsafe { qp.post_raw(true, 3, |c| [ctrl(c.idx + 7, c.qpn), raddr, data]) }.unwrap();
        qp.ring_db();
        assert_eq!(qp.wait(t), Err(first));
        let deadline = Instant::now() + Duration::from_secs(5);
        let flushed = loop {
            match qp.poll_cq() {
                Some(r) => break r,
                None if Instant::now() < deadline => std::thread::yield_now(),
                None => panic!("no CQE for the WQE posted after the error"),
            }
        };
        assert_eq!(flushed, Err(cqe(syndrome::WR_FLUSH_ERR, vendor::FLUSHED, t.0, qp.handle().qpn)));
        assert!(dst.read().iter().all(|&b| b == 0));
    });
}

/// A data segment of 2^31 bytes or more cannot be built (bit 31 would mark it inline), nor one of 0 bytes
/// (which the PRM reads as 2^31), and an atomic's result buffer is 8 bytes, 8-byte aligned.
#[test]
fn builders_refuse_what_the_nic_would_misread() {
    let lkey = Be32::new(0x155);
    assert_eq!(Sge::new(0x1000, 0, lkey), inval(InvalidArgument::Length));
    assert_eq!(Sge::new(0x1000, 1 << 31, lkey), inval(InvalidArgument::Length));
    assert_eq!(Sge::new(0x1000, u32::MAX, lkey), inval(InvalidArgument::Length));
    let max = Sge::new(0x1000, (1 << 31) - 1, lkey).unwrap();
    assert_eq!((max.addr(), max.len(), max.lkey()), (0x1000, (1 << 31) - 1, lkey));
    let remote = Raddr { addr: 0x2000, rkey: Be32::new(0x255) };
    let result = Sge::new(0x1000, 8, lkey).unwrap();
    assert_eq!(wqe::atomic_fetch_add(remote, max, 1), inval(InvalidArgument::Length));
    assert_eq!(
        wqe::atomic_fetch_add(Raddr { addr: 0x2004, ..remote }, result, 1),
        inval(InvalidArgument::AtomicAlignment)
    );
    let misaligned = Sge::new(0x1004, 8, lkey).unwrap();
    assert_eq!(wqe::atomic_compare_swap(remote, misaligned, 0, 1), inval(InvalidArgument::AtomicAlignment));
    assert_eq!(wqe::rdma_write_inline(remote, &[]), inval(InvalidArgument::Length));
    assert_eq!(wqe::rdma_write_inline(remote, &[0; wqe::MAX_INLINE + 1]), inval(InvalidArgument::InlineTooLong));
    // An inline WRITE's ds is what its payload needs (2 + ceil((4 + len) / 16)), not the largest WQE.
    for (len, ds) in [(1, 3), (12, 3), (13, 4), (28, 4), (29, 5), (wqe::MAX_INLINE, 16)] {
        assert_eq!(wqe::rdma_write_inline(remote, &vec![7; len]).unwrap().ds(), ds, "{len} bytes");
    }
}

// ---------------------------------------------------------------------------------------------------------
// Device code: tickets, timeouts, waiting twice
// ---------------------------------------------------------------------------------------------------------

#[test]
fn waiting_twice_on_a_ticket_and_on_old_tickets_is_fine() {
    with_put_fixture(|qp, l, r, dst, p| {
        qp.put(&r, 0, &l, 0, 4096).unwrap();
        let t = qp.post(true, wqe::nop()).unwrap();
        qp.wait(t).unwrap();
        qp.wait(t).unwrap();
        qp.wait(Ticket(0)).unwrap();
        qp.flush().unwrap();
        qp.flush().unwrap();
        assert!(dst.read().iter().all(|&b| b == 0x77));
        // Waiting again asked the NIC for nothing more.
        assert_eq!(p.nic.stats().wqes, 2);
    });
}

#[test]
fn waiting_on_a_ticket_never_issued_is_an_argument_error_at_once() {
    with_put_fixture(|_, _, _, _, p| {
        let mut h = p.b.handle();
        let mut qp = dev_qp(&mut h, SHORT_NS);
        let t0 = Instant::now();
        assert_eq!(qp.wait(Ticket(1000)), inval(InvalidArgument::Ticket));
        assert_eq!(qp.wait(Ticket(0)), inval(InvalidArgument::Ticket), "nothing posted: ticket 0 is no WQE yet");
        assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    });
}

/// A zero timeout gives up without losing anything: the WQEs stay posted, and a later owner of the same handle
/// with time to wait sees them complete. The responder is a QP on another NIC, over the wire, that connects only
/// after the zero-timeout flush: until then nothing posted can complete (the requester's WQEs wait for the
/// connection), so that flush times out whatever the scheduling.
///
/// The requester is on the NIC with the smaller id, so that it is the side that dials: the responder's NIC
/// answers the hello only once the responder is in RTR. The other way round is racy: `Qp::connect` starts the
/// responder's dialer before it moves the QP to RTR, so requests already queued on the other side can reach it
/// in INIT, go unanswered and fail with 0x15 after the retry timeout (about 1 run in 130 with the CPUs busy).
#[test]
fn a_zero_timeout_loses_nothing_and_a_patient_waiter_finishes_the_job() {
    const LEN: usize = 1 << 16;
    let wired = || EmuConfig::host_or_env().unwrap().with_wire(WireConfig::loopback());
    let (x, y) = (EmuNic::open(wired()).unwrap(), EmuNic::open(wired()).unwrap());
    let (nic_a, nic_b) = if x.id() < y.id() { (x, y) } else { (y, x) };
    let (pd_a, pd_b) = (nic_a.alloc_pd().unwrap(), nic_b.alloc_pd().unwrap());
    let (cq_a, cq_b) = (nic_a.create_cq(64).unwrap(), nic_b.create_cq(64).unwrap());
    let a = nic_a.create_qp(&pd_a, &cq_a, 64).unwrap();
    let b = nic_b.create_qp(&pd_b, &cq_b, 64).unwrap();
    let (src, dst) = (GuardedBuf::new(LEN, 0x3c), GuardedBuf::new(LEN, 0));
    let lmr = src.register(&nic_a, &pd_a, Access::NONE);
    let rmr = dst.register(&nic_b, &pd_b, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    a.connect(&b.endpoint()).unwrap();
    let mut h = a.handle();
    {
        let mut qp = dev_qp(&mut h, 0);
        // Posting needs no wait while there is room.
        for k in 0..4u64 {
            qp.put(&rmr.remote(), k * (LEN as u64 / 4), &lmr.handle(), 0, LEN as u64 / 4).unwrap();
        }
        let r = qp.flush();
        // The flush waits for the CQE of the last WQE posted (the NOP it adds when the last put is unsignaled).
        let last = qp.handle().sq.pi - 1;
        assert!(
            matches!(r, Err(Error::Timeout(Timeout { on: WaitOn::Cqe { qpn, wqe_index }, .. })) if wqe_index == last && qpn == a.qpn()),
            "{r:?} (last WQE {last})"
        );
        // A satisfied semaphore returns at once even with no time to wait; an unsatisfied one times out.
        let sem = 5u64;
        // SAFETY: `sem` is an aligned local that outlives the wait.
        assert_eq!(unsafe { semaphore_ge(&sem, 5, 0) }, Ok(5));
        // SAFETY: as above.
        let r = unsafe { semaphore_ge(&sem, 6, 0) };
        assert!(matches!(r, Err(Error::Timeout(Timeout { on: WaitOn::Semaphore { expected: 6, seen: 5, .. }, .. }))));
    }
    assert!(dst.read().iter().all(|&b| b == 0), "bytes placed before the responder connected");
    b.connect(&a.endpoint()).unwrap();
    // The same handle, a new owner with time to wait: everything posted completes.
    let mut qp = dev_qp(&mut h, TIMEOUT_NS);
    qp.flush().unwrap();
    assert!(dst.read().iter().all(|&b| b == 0x3c) && dst.guards_intact());
    assert_eq!(qp.handle().sq.ci, qp.handle().sq.pi);
}

#[test]
fn an_sq_that_never_drains_times_out_naming_the_room_it_wanted() {
    // A QP never connected: the NIC ignores its doorbells (as hardware does in RESET), so nothing retires.
    let nic = EmuNic::open(EmuConfig::host_or_env().unwrap()).unwrap();
    let pd = nic.alloc_pd().unwrap();
    let cq = nic.create_cq(16).unwrap();
    let q = nic.create_qp(&pd, &cq, 16).unwrap();
    let mut h = q.handle();
    let mut qp = dev_qp(&mut h, SHORT_NS);
    let t0 = Instant::now();
    let mut last = Ok(Ticket(0));
    for _ in 0..17 {
        last = qp.post(false, wqe::nop());
        if last.is_err() {
            break;
        }
    }
    assert!(
        matches!(last, Err(Error::Timeout(Timeout { on: WaitOn::SqSpace { qpn, wqebbs: 1 }, .. })) if qpn == q.qpn()),
        "{last:?}"
    );
    assert_eq!(qp.handle().sq.pi, 16);
    assert!(t0.elapsed() < Duration::from_secs(2));
    let e = last.unwrap_err().to_string();
    one_line(&e);
    assert!(e.contains("1 free WQEBBs"), "{e}");
}

#[test]
fn posting_after_an_error_never_executes_and_every_wait_reports_it() {
    with_put_fixture(|qp, l, r, dst, p| {
        let bad = RemoteMr { rkey: Be32::new(r.rkey.get() ^ 0x80), ..r };
        qp.put(&bad, 0, &l, 0, 64).unwrap();
        assert!(matches!(qp.flush(), Err(Error::Cqe(c)) if c.syndrome == syndrome::REMOTE_ACCESS_ERR));
        // More work than the ring holds: each WQE is flushed (0x05), the ring keeps draining, no hang. Posts
        // succeed (retiring flushed WQEs frees room); every wait and flush reports the first error, 0x13.
        let is_first =
            |r: &Result<(), Error>| matches!(r, Err(Error::Cqe(c)) if c.syndrome == syndrome::REMOTE_ACCESS_ERR);
        for i in 0..40u64 {
            qp.put(&r, (i * 64) % 4096, &l, 0, 64).unwrap();
            if i % 8 == 0 {
                let t = qp.post(true, wqe::nop()).unwrap();
                let w = qp.wait(t);
                assert!(is_first(&w), "{w:?}");
            }
        }
        assert!(is_first(&qp.flush()));
        assert!(dst.read().iter().all(|&b| b == 0), "a WQE posted after the error placed bytes");
        let s = p.nic.stats();
        assert_eq!((s.error_cqes, s.cq_overruns, s.bad_doorbells), (1, 0, 0), "{s:?}");
    });
}

// ---------------------------------------------------------------------------------------------------------
// Handles used in ways the API allows but the device model does not expect
// ---------------------------------------------------------------------------------------------------------

#[test]
fn a_fresh_handle_of_a_flushed_qp_continues_where_the_nic_is_and_its_work_completes() {
    const LEN: usize = 4096;
    let (src, dst) = (GuardedBuf::new(LEN, 0x11), GuardedBuf::new(LEN, 0));
    let p = Pair::new(64, 64);
    let lmr = src.register(&p.nic, &p.pd, Access::NONE);
    let rmr = dst.register(&p.nic, &p.pd, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let first = {
        let mut h = p.a.handle();
        let mut qp = dev_qp(&mut h, TIMEOUT_NS);
        qp.put(&rmr.remote(), 0, &lmr.handle(), 0, 8).unwrap();
        qp.flush().unwrap();
        qp.handle()
    };
    // Later, somewhere else, the same QP's handle is asked for again and used, as the API allows (everything
    // was flushed and polled). It starts where the NIC is, which is where the first handle's counters ended,
    // so the put is executed and its completion is the one the flush waits for.
    src.fill(0x22);
    let mut h = p.a.handle();
    assert_eq!((h.sq.pi, h.sq.ci, h.cq.cons_index), (first.sq.pi, first.sq.ci, first.cq.cons_index));
    let mut qp = dev_qp(&mut h, TIMEOUT_NS);
    qp.put(&rmr.remote(), 0, &lmr.handle(), 0, LEN as u64).unwrap();
    assert_eq!(qp.flush(), Ok(()));
    assert!(dst.read().iter().all(|&b| b == 0x22), "flush returned Ok but the put was not executed");
    assert!(dst.guards_intact());
}

/// Two QPs on one CQ (verbs allows it), each driven by its own thread that posts RDMA READs and polls the shared
/// CQ while the other does the same: the NIC executes the two SQs' WQEs interleaved and writes both QPs'
/// completions into the one ring in the order it runs them. The CQ has one consumer index, so polling it is
/// serialized (a lock, as `SharedQp`'s poll lock): whichever thread holds the lock takes every ready CQE and
/// routes it by the QPN the CQE names to that QP's inbox; each thread checks the CQEs of its inbox against its
/// outstanding WQEs in posting order (opcode, QPN, WQE index, byte count) and then the bytes the READ placed.
///
/// Why a mix-up fails: A's READs are 1..=128 bytes and B's 129..=256 (random lengths, random payloads), and a
/// READ's CQE carries its byte count. A completion of B's that names A's QPN (or the other way round) reaches the
/// wrong thread and fails the byte count whatever the random draw; a CQE handed to the wrong thread whatever it
/// names fails the QPN check (a test that routed every 97th CQE to the other inbox failed at once); one that
/// names the right QP but another of its WQEs fails the WQE index of the oldest outstanding WQE; a CQE that comes
/// before its data fails the payload check; a lost completion leaves its thread without progress (the deadline
/// fails it), and a duplicate, or a CQE naming neither QP, fails at once. Each thread must end with exactly its
/// ROUNDS completions.
///
/// That the completions really interleave is checked too: a thread posts its j-th WQE (from 0) only while the
/// other has completed more than j - LEAD, which bounds every run of one QP's CQEs in the ring's order to
/// 2 * LEAD. Say A's CQEs k ..= k + r come with no CQE of B's between them. When A posted WQE k + r (before its
/// CQE), B had completed at least k + r - LEAD + 1, all of whose CQEs precede A's CQE k (none lies in the run). But
/// B posted each WQE j of those before A's CQE k existed, so with A at most k completions done: j < k + LEAD, at
/// most k + LEAD CQEs. Hence k + r - LEAD + 1 <= k + LEAD, r <= 2 * LEAD - 1.
#[test]
fn qps_sharing_a_cq_never_take_each_others_completions() {
    const ROUNDS: usize = 400;
    /// READs in flight per QP, one slot (a local and a remote buffer, each its own MR) each.
    const WINDOW: usize = 8;
    const LEAD: usize = 16;
    const SLOT: usize = 256;
    let nic = EmuNic::open(EmuConfig::host_or_env().unwrap()).unwrap();
    let pd = nic.alloc_pd().unwrap();
    // At most 2 * WINDOW CQEs unpolled: the shared CQ cannot overrun.
    let shared = nic.create_cq(64).unwrap();
    let (peer_cq_a, peer_cq_b) = (nic.create_cq(16).unwrap(), nic.create_cq(16).unwrap());
    let a = nic.create_qp(&pd, &shared, 64).unwrap();
    let b = nic.create_qp(&pd, &shared, 64).unwrap();
    let (pa, pb) = (nic.create_qp(&pd, &peer_cq_a, 16).unwrap(), nic.create_qp(&pd, &peer_cq_b, 16).unwrap());
    for (x, y) in [(&a, &pa), (&pa, &a), (&b, &pb), (&pb, &b)] {
        x.connect(&y.endpoint()).unwrap();
    }
    let qpns = [a.qpn(), b.qpn()];
    let lens: [RangeInclusive<usize>; 2] = [1..=128, 129..=SLOT];
    let local: Vec<Vec<GuardedBuf>> = (0..2).map(|_| (0..WINDOW).map(|_| GuardedBuf::new(SLOT, 0)).collect()).collect();
    let remote: Vec<Vec<GuardedBuf>> =
        (0..2).map(|_| (0..WINDOW).map(|_| GuardedBuf::new(SLOT, 0)).collect()).collect();
    let lmrs: Vec<Vec<_>> =
        local.iter().map(|q| q.iter().map(|g| g.register(&nic, &pd, Access::LOCAL_WRITE)).collect()).collect();
    let rmrs: Vec<Vec<_>> =
        remote.iter().map(|q| q.iter().map(|g| g.register(&nic, &pd, Access::REMOTE_READ)).collect()).collect();
    // (lkey, rkey) of each slot.
    let keys: Vec<Vec<(u32, u32)>> =
        (0..2).map(|q| (0..WINDOW).map(|i| (lmrs[q][i].lkey(), rmrs[q][i].rkey())).collect()).collect();
    let mut seeds = rng();
    let seeds = [seeds.random::<u64>(), seeds.random::<u64>()];
    // The CQ's one consumer, and the QPN of every CQE in the ring's order.
    let poller = Mutex::new((CqPoll::new(&shared), Vec::with_capacity(2 * ROUNDS)));
    let inboxes: [Mutex<VecDeque<Cqe64>>; 2] = Default::default();
    let done = [AtomicUsize::new(0), AtomicUsize::new(0)];
    let route = || {
        let mut guard = poller.lock().unwrap();
        let (cq, order) = &mut *guard;
        while let Some(c) = cq.poll() {
            let q = qpns.iter().position(|&n| n == c.qpn()).unwrap_or_else(|| panic!("a CQE naming neither QP: {c:?}"));
            order.push(q);
            inboxes[q].lock().unwrap().push_back(c);
        }
    };
    let run = |me: usize, mut sq: Sq| {
        let mut rng = SmallRng::seed_from_u64(seeds[me]);
        let mut free: Vec<usize> = (0..WINDOW).collect();
        // (WQE index, slot, payload), oldest first.
        let mut outstanding: VecDeque<(u64, usize, Vec<u8>)> = VecDeque::new();
        let mut posted = 0;
        let mut last_progress = Instant::now();
        while done[me].load(Ordering::Acquire) < ROUNDS {
            let allowed = (done[1 - me].load(Ordering::Acquire) + LEAD).min(ROUNDS).saturating_sub(posted);
            let n = rng.random_range(0..=free.len().min(allowed));
            for _ in 0..n {
                let slot = free.swap_remove(rng.random_range(0..free.len()));
                let len = rng.random_range(lens[me].clone());
                let payload = random_bytes(&mut rng, len);
                remote[me][slot].write(0, &payload);
                local[me][slot].fill(0);
                let (lkey, rkey) = keys[me][slot];
                let wqe = sq.read(SIGNALED, (lkey, local[me][slot].addr(), len as u32), remote[me][slot].addr(), rkey);
                let at = sq.post(&wqe);
                outstanding.push_back((at, slot, payload));
                posted += 1;
            }
            route();
            let mine: Vec<Cqe64> = inboxes[me].lock().unwrap().drain(..).collect();
            if mine.is_empty() {
                assert!(
                    last_progress.elapsed() < CQE_TIMEOUT,
                    "QP {:#x}: no completion within {CQE_TIMEOUT:?} ({} of {ROUNDS} done, {} outstanding)",
                    qpns[me],
                    done[me].load(Ordering::Relaxed),
                    outstanding.len()
                );
                std::thread::yield_now();
                continue;
            }
            last_progress = Instant::now();
            for c in mine {
                let (at, slot, payload) = outstanding
                    .pop_front()
                    .unwrap_or_else(|| panic!("QP {:#x}: a CQE with nothing outstanding: {c:?}", qpns[me]));
                assert_req(&c, opcode::RDMA_READ, qpns[me], at, payload.len() as u32);
                assert_eq!(local[me][slot].read()[..payload.len()], payload[..], "QP {:#x}, WQE {at}", qpns[me]);
                free.push(slot);
                done[me].fetch_add(1, Ordering::AcqRel);
            }
        }
        assert!(outstanding.is_empty() && posted == ROUNDS);
    };
    let (sq_a, sq_b) = (Sq::new(&a), Sq::new(&b));
    std::thread::scope(|s| {
        let ta = s.spawn(|| run(0, sq_a));
        let tb = s.spawn(|| run(1, sq_b));
        ta.join().unwrap();
        tb.join().unwrap();
    });
    let (cq, order) = &*poller.lock().unwrap();
    assert_eq!(cq.ci, 2 * ROUNDS as u64, "CQEs taken from the shared CQ");
    assert_eq!(order.iter().filter(|&&q| q == 0).count(), ROUNDS);
    let longest_run = order.chunk_by(|x, y| x == y).map(<[usize]>::len).max().unwrap();
    assert!(longest_run <= 2 * LEAD, "the two QPs' completions did not interleave: a run of {longest_run}");
    assert!(inboxes.iter().all(|i| i.lock().unwrap().is_empty()));
    // The NIC counts a CQE after writing it, so the poller may have taken the last one before the count moved;
    // nothing may be counted beyond what was taken.
    wait_until("the shared CQ's producer count", || shared.produced() >= 2 * ROUNDS as u64);
    assert_eq!(shared.produced(), 2 * ROUNDS as u64);
    let s = nic.stats();
    assert_eq!((s.error_cqes, s.cq_overruns, s.bad_doorbells), (0, 0, 0), "{s:?}");
    assert!(local.iter().chain(&remote).flatten().all(GuardedBuf::guards_intact));
    drop((lmrs, rmrs));
}

#[test]
fn a_cqe_from_beyond_the_producer_index_is_an_error_not_a_panic() {
    let p = Pair::new(16, 16);
    {
        let mut h = p.a.handle();
        let mut qp = dev_qp(&mut h, TIMEOUT_NS);
        // Three unsignaled NOPs and a signaled one: the first CQE in the ring carries wqe_counter 3.
        for _ in 0..3 {
            let _ = qp.post(false, wqe::nop()).unwrap();
        }
        let t = qp.post(true, wqe::nop()).unwrap();
        qp.wait(t).unwrap();
    }
    // A forged handle whose counters restart at zero (as if the host had built it from scratch).
    let fresh = p.a.handle();
    let mut h = QpHandle {
        sq: gdaki_shared::handle::SqState::at(0),
        cq: gdaki_shared::handle::CqHandle { cons_index: 0, ..fresh.cq },
        ..fresh
    };
    let mut qp = dev_qp(&mut h, SHORT_NS);
    let t = qp.post(true, wqe::nop()).unwrap();
    // Ticket 0, producer index 1: CQE slot 0 still holds the old CQE of WQE 3, which is not outstanding.
    let r = qp.wait(t);
    assert!(
        matches!(r, Err(Error::UnexpectedCqe(u)) if u.wqe_counter == 3 && u.qpn == fresh.qpn),
        "a stale CQE was taken for the completion of {t:?}: {r:?}"
    );
}

#[test]
fn rdma_writes_into_a_peers_queues_and_doorbell_never_stop_the_nic() {
    // A hostile user registers a third QP's queue memory (valid host memory, as reg_mr's contract asks) and
    // scribbles on it with RDMA WRITEs: its SQ ring, its dbrec and its doorbell/BlueFlame register.
    let p = Pair::new(16, 16);
    let victim_cq = p.nic.create_cq(16).unwrap();
    let victim = p.nic.create_qp(&p.pd, &victim_cq, 16).unwrap();
    victim.connect(&victim.endpoint()).unwrap();
    let hb = victim.handle();
    let src = GuardedBuf::new(1024, 0);
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let noise: Vec<u8> = (0..1024)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    src.write(0, &noise);
    let lmr = src.register(&p.nic, &p.pd, Access::NONE);
    let targets = [(hb.sq_buf, 16 * 64u64), (hb.dbrec, 64), (hb.bf_reg - 0x800, 4096)];
    let mrs: Vec<_> = targets
        .iter()
        .map(|&(addr, len)| {
            let loc = MemLoc { kind: MemKind::Host, addr };
            // SAFETY: queue memory of `victim`, which outlives these MRs (dropped at the end, before it).
            unsafe { p.nic.reg_mr(&p.pd, loc, len, Access::LOCAL_WRITE | Access::REMOTE_WRITE) }.unwrap()
        })
        .collect();
    let mut ha = p.a.handle();
    let mut qp = dev_qp(&mut ha, TIMEOUT_NS);
    for round in 0..4u64 {
        for m in &mrs {
            let r = m.remote();
            let len = r.length.min(1024 - round * 64);
            qp.put(&r, 0, &lmr.handle(), round * 64, len).unwrap();
            // Into the doorbell register itself, at 0x800.
            if r.length == 4096 {
                qp.put(&r, 0x800, &lmr.handle(), round * 64, 64).unwrap();
            }
        }
        qp.flush().unwrap();
        // The register is memory the NIC samples: a second write landing before it looked would replace the
        // first unseen, as two doorbells of a real NIC never do. Each round waits until its doorbell is seen.
        wait_until("the round's doorbell seen", || p.nic.stats().bad_doorbells == round + 1);
    }
    std::thread::sleep(Duration::from_millis(20));
    assert!(p.nic.executor_alive(), "the NIC's executor died");
    // The scribbler's own QP is unharmed and still places data.
    let dst = GuardedBuf::new(64, 0);
    let dmr = dst.register(&p.nic, &p.pd, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    qp.put(&dmr.remote(), 0, &lmr.handle(), 0, 64).unwrap();
    qp.flush().unwrap();
    assert_eq!(dst.read(), noise[..64]);
    // The victim's doorbell register got noise: each round's 8 doorbell bytes (noise[64 r..64 r + 8]) announce a
    // WQE whose end lies far outside the victim's 16-WQEBB ring (checked here from the bytes), so the NIC counts
    // four bad doorbells and fails the victim on the first one (0x02, BAD_DOORBELL, at WQE 0, with the opcode
    // byte of the noise); its CQ holds exactly that error CQE.
    for r in 0..4 {
        let db = &noise[64 * r..64 * r + 8];
        let end = u16::from_be_bytes([db[1], db[2]]).wrapping_add(u16::from(db[7] & 0x3f).div_ceil(4));
        assert!(end > 16 && 0u16.wrapping_sub(end) > 16, "round {r}: doorbell {db:x?} is not a bad one");
    }
    assert_eq!(victim.state(), QpState::Error);
    let s = p.nic.stats();
    assert_eq!((s.bad_doorbells, s.error_cqes), (4, 1), "{s:?}");
    let mut vcq = CqPoll::new(&victim_cq);
    let c = vcq.poll().expect("the victim's error CQE");
    assert_err(&c, syndrome::LOCAL_QP_OP_ERR, noise[3], victim.qpn(), 0);
    assert_eq!(c.as_err().vendor_err_synd, vendor::BAD_DOORBELL);
    assert!(vcq.poll().is_none(), "a second CQE on the victim's CQ");
    drop(mrs);
}

#[test]
fn a_peer_that_never_polls_its_cq_fails_write_imm_with_0x14_and_both_sides_stay_bounded() {
    let (src, dst) = (GuardedBuf::new(64, 0x10), GuardedBuf::new(64, 0));
    let p = Pair::new(16, 16);
    let lmr = src.register(&p.nic, &p.pd, Access::NONE);
    let rmr = dst.register(&p.nic, &p.pd, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let (raddr, sge) = (
        Raddr { addr: rmr.remote().addr, rkey: rmr.remote().rkey },
        Sge::new(lmr.handle().addr, 64, lmr.handle().lkey).unwrap(),
    );
    let mut ha = p.a.handle();
    let mut a = dev_qp(&mut ha, TIMEOUT_NS);
    // B's CQ has 16 entries and B never polls: the 17th responder completion has nowhere to go.
    for i in 0..16u64 {
        let t = a.post(true, wqe::rdma_write_imm(raddr, sge, Be32::new(i as u32))).unwrap();
        a.wait(t).unwrap();
    }
    let t = a.post(true, wqe::rdma_write_imm(raddr, sge, Be32::new(16))).unwrap();
    assert_eq!(a.wait(t), Err(cqe(syndrome::REMOTE_OP_ERR, vendor::RESP_CQ_OVERRUN, 16, a.handle().qpn)));
    assert_eq!((p.a.state(), p.b.state()), (QpState::Error, QpState::Error));
    assert!(p.cq_b.is_error());
    // B's own work can complete nowhere: B's handle starts after the 16 CQEs its CQ holds, B has posted nothing
    // (flush has nothing to wait for), and the NOP it posts is flushed into a CQ that overran and takes no more
    // CQEs, so the wait on it times out, bounded, naming that WQE.
    let mut hb = p.b.handle();
    assert_eq!((hb.cq.cons_index, hb.sq.pi), (16, 0));
    let mut b = dev_qp(&mut hb, SHORT_NS);
    assert_eq!(b.flush(), Ok(()));
    let t = b.post(true, wqe::nop()).unwrap();
    assert_eq!(t, Ticket(0));
    let r = b.wait(t);
    assert!(
        matches!(r, Err(Error::Timeout(Timeout { on: WaitOn::Cqe { qpn, wqe_index: 0 }, .. })) if qpn == p.b.qpn()),
        "{r:?}"
    );
    assert_eq!(b.handle().cq.cons_index, 16);
    assert!(dst.guards_intact());
}

/// `post_raw` refuses a WQE larger than `MAX_DS` segments (here a well-formed 39-segment RDMA WRITE of 37 SGEs,
/// 10 WQEBBs) and posts nothing: a CQE frees the ring up to the WQEBB it names, the WQE's first, so a second such
/// WQE on a 16-WQEBB ring waited out the timeout for room the first had freed. WQEs of `MAX_DS` segments
/// (4 WQEBBs, 14 SGEs) posted one after the other on the same ring, each waited for, all get room and land.
#[test]
fn post_raw_refuses_wqes_past_max_ds_and_max_ds_wqes_keep_finding_room() {
    const SGES: usize = 37;
    let (src, dst) = (GuardedBuf::new(SGES * 8, 0), GuardedBuf::new(SGES * 8, 0));
    let p = Pair::new(16, 16);
    let lmr = src.register(&p.nic, &p.pd, Access::NONE);
    let rmr = dst.register(&p.nic, &p.pd, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let (remote, local) = (rmr.remote(), lmr.handle());
    // A WRITE of the first `sges` 8-byte pieces of `src` to the same place in `dst`, in `ds = 2 + sges` segments.
    let build = move |sges: usize| {
        move |c: gdaki_device::wqe::Ctrl| -> [Seg; SGES + 2] {
            let mut s = [Seg::default(); SGES + 2];
            s[0] = CtrlSeg::new(c.idx, opcode::RDMA_WRITE, 0, c.qpn, c.fm_ce_se, 2 + sges as u8, 0, Be32::ZERO).into();
            s[1] = RaddrSeg::new(remote.addr, remote.rkey).into();
            for k in 0..sges {
                s[2 + k] = DataSeg::new(8, local.lkey, local.addr + 8 * k as u64).into();
            }
            s
        }
    };
    let mut h = p.a.handle();
    let mut qp = dev_qp(&mut h, TIMEOUT_NS);
    // SAFETY: a well-formed WQE whose ctrl segment says the ds posted.
    let big = unsafe { qp.post_raw(true, 2 + SGES as u8, build(SGES)) };
    assert_eq!(big, inval(InvalidArgument::WqeSize));
    let sges = gdaki_device::wqe::MAX_DS - 2;
    let mut rng = SmallRng::seed_from_u64(39);
    for round in 0..12u64 {
        let payload: Vec<u8> = (0..sges * 8).map(|_| rng.random()).collect();
        src.write(0, &payload);
        // SAFETY: as above.
        let t = unsafe { qp.post_raw(true, 2 + sges as u8, build(sges)) }.unwrap();
        assert_eq!(t, Ticket(4 * round), "the refused WQE reserved nothing; each WQE takes 4 WQEBBs");
        qp.ring_db();
        qp.wait(t).unwrap();
        assert_eq!(&dst.read()[..sges * 8], &payload[..], "round {round}");
    }
    assert!(src.guards_intact() && dst.guards_intact());
}
