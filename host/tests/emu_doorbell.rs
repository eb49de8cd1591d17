//! The emulated NIC acts on doorbells only, and cross-checks the doorbell record.

mod emu_util;

use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use emu_util::*;
use gdaki::nic::emu::{Access, EmuConfig, EmuNic, QpState};
use gdaki_shared::prm::opcode;
use gdaki_shared::prm::wqe::CtrlSeg;

/// `nic_drop_stops_the_executor_thread` counts the process's threads named after its NIC's executor, a name of
/// 16 bits of the NIC's random identifier: a NIC of a test running beside it has the same name once in 65,536
/// draws. It runs alone ([`alone`]); every other test of this binary may run beside the others ([`beside`]).
static ONE_AT_A_TIME: RwLock<()> = RwLock::new(());

/// The lock of a test that may run beside the others of this binary but not beside the thread count.
fn beside() -> RwLockReadGuard<'static, ()> {
    // A test that panicked while holding it leaves nothing to repair.
    ONE_AT_A_TIME.read().unwrap_or_else(|p| p.into_inner())
}

/// The lock of the test that runs alone.
fn alone() -> RwLockWriteGuard<'static, ()> {
    ONE_AT_A_TIME.write().unwrap_or_else(|p| p.into_inner())
}

#[test]
fn wqe_without_doorbell_is_never_executed() {
    let _turn = beside();
    let mut rng = rng();
    let p = Pair::new(64, 64);
    let (mut sq, mut cq) = (Sq::new(&p.a), CqPoll::new(&p.cq_a));
    let src = GuardedBuf::new(256, 0);
    let dst = GuardedBuf::new(256, 0x77);
    let (lmr, rmr) = (src.register(&p.nic, &p.pd, Access::NONE), dst.register(&p.nic, &p.pd, Access::ALL));
    let data = random_bytes(&mut rng, 256);
    src.write(0, &data);
    let at = sq.put(&sq.write(SIGNALED, (lmr.lkey(), src.addr(), 256), dst.addr(), rmr.rkey()));
    sq.dbrec(); // the dbrec says "one WQE", but no doorbell comes
    cq.assert_none_for(Duration::from_millis(100));
    assert!(dst.read().iter().all(|&b| b == 0x77), "nothing placed without a doorbell");
    let s = p.nic.stats();
    assert_eq!((s.doorbells, s.wqes), (0, 0));
    assert_eq!(p.a.sq_consumed(), 0);
    // The same WQE runs once its doorbell comes: it was valid all along.
    sq.doorbell(at);
    assert_req(&cq.wait(), opcode::RDMA_WRITE, sq.qpn(), at, 0);
    assert_eq!(dst.read(), data);
    assert_eq!(p.nic.stats().doorbells, 1);
}

#[test]
fn dbrec_written_to_word_0_is_a_mismatch() {
    let _turn = beside();
    let p = Pair::new(64, 64);
    let (mut sq, mut cq) = (Sq::new(&p.a), CqPoll::new(&p.cq_a));
    // Correct order first: no mismatch.
    let at = sq.post(&sq.nop(SIGNALED));
    assert_req(&cq.wait(), opcode::NOP, sq.qpn(), at, 0);
    assert_eq!(p.nic.stats().dbrec_mismatches, 0);
    // The known bug: the SQ counter goes to word 0 (the RQ counter); word 1 keeps the old value.
    let at = sq.put(&sq.nop(SIGNALED));
    sq.dbrec_word(0, sq.pi as u32 & 0xffff);
    sq.doorbell(at);
    // The doorbell drives execution, as on hardware; the mismatch is recorded.
    assert_req(&cq.wait(), opcode::NOP, sq.qpn(), at, 0);
    let s = p.nic.stats();
    assert_eq!((s.doorbells, s.dbrec_mismatches, s.wqes), (2, 1, 2));
    // No dbrec update at all is the same mismatch.
    let at = sq.put(&sq.nop(SIGNALED));
    sq.doorbell(at);
    assert_req(&cq.wait(), opcode::NOP, sq.qpn(), at, 0);
    assert_eq!(p.nic.stats().dbrec_mismatches, 2);
}

#[test]
fn dbrec_ahead_of_the_doorbell_is_no_mismatch() {
    let _turn = beside();
    // Two WQEs, dbrec updated for both, but the doorbell of the first comes first: legal when posters race.
    let p = Pair::new(64, 64);
    let (mut sq, mut cq) = (Sq::new(&p.a), CqPoll::new(&p.cq_a));
    let first = sq.put(&sq.nop(SIGNALED));
    let second = sq.put(&sq.nop(SIGNALED));
    sq.dbrec();
    sq.doorbell(first);
    assert_req(&cq.wait(), opcode::NOP, sq.qpn(), first, 0);
    sq.doorbell(second);
    assert_req(&cq.wait(), opcode::NOP, sq.qpn(), second, 0);
    assert_eq!(p.nic.stats().dbrec_mismatches, 0);
}

#[test]
fn stale_doorbell_is_ignored_and_one_doorbell_covers_a_batch() {
    let _turn = beside();
    let p = Pair::new(64, 64);
    let (mut sq, mut cq) = (Sq::new(&p.a), CqPoll::new(&p.cq_a));
    let first = sq.put(&sq.nop(SIGNALED));
    let second = sq.put(&sq.nop(SIGNALED));
    sq.dbrec();
    // The later doorbell first: it covers both WQEs.
    sq.doorbell(second);
    assert_req(&cq.wait(), opcode::NOP, sq.qpn(), first, 0);
    assert_req(&cq.wait(), opcode::NOP, sq.qpn(), second, 0);
    wait_until("doorbell counted", || p.nic.stats().doorbells == 1);
    // Then the earlier one lands late: behind the NIC, ignored.
    sq.doorbell(first);
    wait_until("stale doorbell counted", || p.nic.stats().stale_doorbells == 1);
    cq.assert_none_for(Duration::from_millis(20));
    assert_eq!((p.nic.stats().wqes, p.a.sq_consumed()), (2, 2));
    assert_eq!(p.a.state(), QpState::Rts);
}

#[test]
fn doorbell_beyond_the_ring_fails_the_qp() {
    let _turn = beside();
    let p = Pair::new(16, 64);
    let (mut sq, mut cq) = (Sq::new(&p.a), CqPoll::new(&p.cq_a));
    // 17 NOPs into a 16-WQEBB ring in one go: the 17th overwrote the first.
    let mut at = 0;
    for _ in 0..17 {
        at = sq.put(&sq.nop(SIGNALED));
    }
    sq.dbrec();
    sq.doorbell(at);
    let c = cq.wait();
    assert_err(&c, 0x02, opcode::NOP, sq.qpn(), 0);
    assert_eq!(c.as_err().vendor_err_synd, gdaki::nic::emu::vendor::BAD_DOORBELL);
    assert_eq!(p.nic.stats().bad_doorbells, 1);
    assert_eq!(p.a.state(), QpState::Error);
    // That CQE retired WQE 0: a later doorbell flushes from WQE 1 on (the ring's slots 1..=3 hold WQEs 1..=3),
    // and WQE 0 gets no second CQE.
    sq.doorbell(3);
    for at in 1..=3 {
        assert_err(&cq.wait(), opcode::syndrome::WR_FLUSH_ERR, opcode::NOP, sq.qpn(), at);
    }
    cq.assert_none_for(Duration::from_millis(50));
    let s = stats_when(&p.nic, "the error and flush CQEs counted", |s| s.error_cqes >= 1 && s.flush_cqes >= 3);
    assert_eq!((s.error_cqes, s.flush_cqes), (1, 3), "{s:?}");
}

/// A doorbell written to this QP's register whose QPN names another QP (a poster's stale or wrong QPN): on
/// hardware it would ring that QP, or none, and this one's WQEs would wait forever. The emulated NIC fails the
/// QP (0x02, vendor `BAD_QPN`) with one error CQE for the WQE at the consumer index, executes nothing, and
/// flushes from there. Before, it ran this QP's WQEs as if the doorbell were its own.
#[test]
fn doorbell_naming_another_qp_fails_the_qp() {
    let _turn = beside();
    let p = Pair::new(16, 64);
    let (mut sq, mut cq) = (Sq::new(&p.a), CqPoll::new(&p.cq_a));
    for _ in 0..2 {
        sq.put(&sq.nop(SIGNALED));
    }
    sq.dbrec();
    sq.doorbell_bits(CtrlSeg::producer_doorbell(2, sq.qpn() ^ 0x0ab_cdef));
    let c = cq.wait();
    assert_err(&c, 0x02, 0, sq.qpn(), 0);
    assert_eq!(c.as_err().vendor_err_synd, gdaki::nic::emu::vendor::BAD_QPN);
    assert_eq!((p.nic.stats().bad_doorbells, p.nic.stats().wqes), (1, 0));
    assert_eq!(p.a.state(), QpState::Error);
    // The right doorbell, late: WQE 0 was retired by the error CQE; WQE 1 is flushed.
    sq.doorbell_pi(2);
    assert_err(&cq.wait(), opcode::syndrome::WR_FLUSH_ERR, opcode::NOP, sq.qpn(), 1);
    cq.assert_none_for(Duration::from_millis(50));
}

#[test]
fn doorbells_before_connect_are_ignored() {
    let _turn = beside();
    let nic = EmuNic::open(EmuConfig::host_or_env().unwrap()).unwrap();
    let pd = nic.alloc_pd().unwrap();
    let cq = nic.create_cq(64).unwrap();
    let (a, b) = (nic.create_qp(&pd, &cq, 64).unwrap(), nic.create_qp(&pd, &cq, 64).unwrap());
    let mut sq = Sq::new(&a);
    let mut poll = CqPoll::new(&cq);
    let at = sq.post(&sq.nop(SIGNALED));
    poll.assert_none_for(Duration::from_millis(30));
    assert_eq!(a.state(), QpState::Reset);
    a.connect(&b.endpoint()).unwrap();
    b.connect(&a.endpoint()).unwrap();
    poll.assert_none_for(Duration::from_millis(30));
    assert_eq!(nic.stats().doorbells, 0);
    // Connecting twice is refused.
    assert!(a.connect(&b.endpoint()).is_err());
    // The NOP posted in RESET is consumed by nobody; a new post must restart at index 0 to be valid, as on a
    // freshly connected hardware QP.
    let mut sq = Sq::new(&a);
    let at2 = sq.post(&sq.nop(SIGNALED));
    assert_eq!((at, at2), (0, 0));
    assert_req(&poll.wait(), opcode::NOP, sq.qpn(), 0, 0);
}

#[test]
fn nic_drop_stops_the_executor_thread() {
    let _alone = alone();
    let nic = EmuNic::open(EmuConfig::host_or_env().unwrap()).unwrap();
    assert!(nic.executor_alive());
    // The executor thread is named `emu-nic-<low 16 bits of the id, hex>` (short enough for /proc's 15-byte comm).
    let name = format!("emu-nic-{:x}", nic.id() & 0xffff);
    let count = || {
        std::fs::read_dir("/proc/self/task")
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .filter(|e| std::fs::read_to_string(e.path().join("comm")).is_ok_and(|c| c.trim() == name))
                    .count()
            })
            .unwrap_or(0)
    };
    // The thread names itself when it starts.
    wait_until("executor thread visible", || count() == 1);
    drop(nic);
    assert_eq!(count(), 0, "executor thread joined by drop");
}
