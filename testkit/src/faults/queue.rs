//! Faults of the queues and of the connection, in process: SQ full, CQ overrun, a doorbell never rung, a
//! doorbell past the ring, an unreachable peer, and an error CQE on one QP while device code waits on a
//! semaphore fed by another.

use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gdaki_device::error::WaitOn;
use gdaki_device::qp::Ticket;
use gdaki_device::wqe::{self, Ctrl, Raddr, Sge};
use gdaki_device::{db, sq, Error as DevError};
use gdaki_shared::handle::{MrHandle, QpHandle, RemoteMr, SqState};
use gdaki_shared::prm::cqe::{is_sw_owned, CQE_SIZE};
use gdaki_shared::prm::opcode;
use gdaki_shared::prm::wqe::{fm_ce_se, CtrlSeg, RaddrSeg, Seg, SEG, WQEBB};
use gdaki_shared::Be32;

use gdaki::nic::emu::{Access, EmuNic, QpState};

use super::guard::{Guarded, WORD0};
use super::rig::{dev_qp, ghost_endpoint, outcome, setup, step, via_bytes, wait_until, wired, Path, Rig};
use super::{Check, Observed, Outcome};

/// Slack granted to a bounded wait past its own timeout (the wait notices the deadline between two polls,
/// and a loaded 2-core machine may deschedule it).
const SLACK: Duration = Duration::from_millis(200);

/// A target at a peer that never answers: any address, any key (nothing ever reaches them).
const NOWHERE: RemoteMr = RemoteMr { addr: 0x10_0000, length: 1 << 20, rkey: Be32::new(0x1234), pad: 0 };

/// `len` bytes at `addr`, read with volatile byte loads.
///
/// # Safety
/// `addr .. addr + len` must be valid for reads (queue memory of a live QP or CQ).
unsafe fn snapshot(addr: u64, len: usize) -> Vec<u8> {
    // SAFETY: the caller's contract; byte loads need no alignment.
    (0..len).map(|i| unsafe { (addr as *const u8).add(i).read_volatile() }).collect()
}

fn differing(a: &[u8], b: &[u8]) -> u64 {
    a.iter().zip(b).filter(|(x, y)| x != y).count() as u64
}

/// SQ full: a QP of 16 WQEBBs whose peer never answers. Device code posts 16 one-WQEBB RDMA WRITEs (all
/// rung), then a 17th: `put` must return `Timeout(SqSpace)` after its bound, having stored nothing, and the
/// 16 WQEs in the ring must be byte for byte what was posted (none overwritten before the NIC executed it).
pub(crate) fn sq_full() -> Result<Observed, String> {
    const WQE_CNT: u32 = 16;
    const TIMEOUT: Duration = Duration::from_millis(300);
    // The peer stays silent far longer than the wait: the ring cannot drain.
    let nic = setup(wired(Duration::from_secs(10)).and_then(EmuNic::open))?;
    let pd = setup(nic.alloc_pd())?;
    let cq = setup(nic.create_cq(WQE_CNT))?;
    let qp = setup(nic.create_qp(&pd, &cq, WQE_CNT))?;
    setup(qp.connect(&setup(ghost_endpoint())?))?;
    let src = Guarded::new((WQE_CNT as usize + 1) * 64, 5);
    let src_mr = setup(src.register(&nic, &pd, Access::NONE))?;
    let mut h = qp.handle();
    let ring = (h.sq_buf, WQE_CNT as usize * WQEBB);
    // SAFETY: `h` is the handle of `qp`, whose queues (host memory) outlive `d`; only this thread uses it.
    let mut d = unsafe { dev_qp(&mut h, TIMEOUT) };
    for k in 0..WQE_CNT as u64 {
        step("posting the first 16 WRITEs", d.put(&NOWHERE, 64 * k, &src_mr.handle(), 64 * k, 64))?;
    }
    // SAFETY: the SQ ring of `qp`, alive; the NIC only reads it.
    let before = unsafe { snapshot(ring.0, ring.1) };
    let pi = d.handle().sq.pi;
    let start = Instant::now();
    let r = d.put(&NOWHERE, 64 * WQE_CNT as u64, &src_mr.handle(), 64 * WQE_CNT as u64, 64);
    let waited = start.elapsed();
    let mut checks = vec![
        Check::new(
            format!("the wait names 1 WQEBB ({r:?})"),
            matches!(r, Err(DevError::Timeout(t)) if t.on == WaitOn::SqSpace { qpn: d.handle().qpn, wqebbs: 1 }),
        ),
        Check::new(
            format!("the 17th WQE was not stored (producer index {})", d.handle().sq.pi),
            d.handle().sq.pi == pi,
        ),
        Check::new(format!("the wait lasted its timeout ({waited:?} >= {TIMEOUT:?})"), waited >= TIMEOUT),
    ];
    // SAFETY: as above.
    let after = unsafe { snapshot(ring.0, ring.1) };
    let consumed = qp.sq_consumed();
    checks.push(Check::new(
        format!("the NIC consumed the 16 WQEs rung and nothing more ({consumed})"),
        consumed == WQE_CNT as u64,
    ));
    // Each slot still holds the WQE posted there: an RDMA WRITE with its index and its target.
    let intact = (0..WQE_CNT as usize).all(|k| {
        let ctrl: CtrlSeg = bytemuck::pod_read_unaligned(&after[k * WQEBB..k * WQEBB + SEG]);
        let raddr: RaddrSeg = bytemuck::pod_read_unaligned(&after[k * WQEBB + SEG..k * WQEBB + 2 * SEG]);
        ctrl.opcode() == opcode::RDMA_WRITE
            && ctrl.wqe_index() == k as u16
            && raddr.raddr.get() == NOWHERE.addr + 64 * k as u64
    });
    checks.push(Check::new("every slot still holds the WRITE posted there", intact));
    // Ring bytes changed after the 16 posts count as bytes changed outside the permitted range.
    let outside = differing(&before, &after) + src.changed_outside(&[]);
    let qp_state = qp.state();
    Ok(Observed { outcome: outcome(&r), qp_state, outside_changed: outside, waited, bound: TIMEOUT + SLACK, checks })
}

/// A NOP asking for a CQE, for WQE index `idx` of the QP behind `h`, as stored.
fn nop(h: &QpHandle, idx: u64) -> [Seg; 1] {
    wqe::nop().encode(Ctrl { idx: idx as u16, qpn: h.qpn, fm_ce_se: fm_ce_se::CQ_UPDATE })
}

/// Stores `w` at WQE index `idx`, publishes producer index `idx + 1` in the dbrec and rings the doorbell.
///
/// # Safety
/// `h` must be the handle of a live QP with host queue memory, and WQEBB `idx` must be free.
unsafe fn post_nop(h: &QpHandle, idx: u64) {
    let w = nop(h, idx);
    // SAFETY: the caller's contract: a live ring, dbrec and doorbell register; slot `idx` is free.
    unsafe {
        sq::write_segs(h.sq_buf, h.wqe_cnt, idx, &w, 1);
        db::update_dbrec(h.dbrec, idx + 1, h.placement);
        db::ring_db(h.bf_reg, w[0].0[0], h.placement);
    }
}

/// CQ overrun: a QP of 16 WQEBBs and a CQ of 16 entries that software never polls; 17 signaled NOPs. The
/// 17th CQE is due in an entry software has not released: the CQ must move to its error state without
/// overwriting any of the 16 unconsumed CQEs, and the QP to the error state. (Device code's Exclusive QP
/// cannot cause this: it polls before it reuses a slot, and a CQ is never smaller than its QP's SQ. So the
/// WQEs are written into the ring as a poster that never polls would.) Device code that then waits for the
/// 17th completion gets `Timeout(Cqe)`: an overrun writes no CQE, so waits learn of it only by their bound.
pub(crate) fn cq_overrun() -> Result<Observed, String> {
    const N: u64 = 16;
    const TIMEOUT: Duration = Duration::from_millis(200);
    let rig = setup(Rig::new(Path::Direct, N as u32, N as u32, Duration::from_secs(5)))?;
    let h = rig.a.handle();
    let cq_ring = (h.cq.buf, h.cq.ncqe as usize * CQE_SIZE);
    for i in 0..N {
        // SAFETY: `h` is `rig.a`'s handle (alive); slots 0..16 are free in a new QP.
        unsafe { post_nop(&h, i) };
    }
    // `produced` counts CQEs the NIC issued; with queues in GPU memory a CQE lands through the copier after
    // that, so the snapshot waits until every entry's owner byte shows its completion.
    let landed = || {
        // SAFETY: the CQ ring of `rig.cq_a`, alive; entry `i`'s `op_own` is its last byte.
        (0..N).all(|i| is_sw_owned(unsafe { snapshot(cq_ring.0 + (i + 1) * CQE_SIZE as u64 - 1, 1) }[0], i, N as u32))
    };
    if !wait_until(Duration::from_secs(2), || rig.cq_a.produced() == N && landed()) {
        return Err(format!("the first {N} CQEs were not written ({} were)", rig.cq_a.produced()));
    }
    // SAFETY: the CQ ring of `rig.cq_a`, alive.
    let before = unsafe { snapshot(cq_ring.0, cq_ring.1) };
    let start = Instant::now();
    // SAFETY: as above; slot 0 again, which the NIC has consumed (its CQE is written).
    unsafe { post_nop(&h, N) };
    let overran = wait_until(Duration::from_secs(2), || rig.nic_a.stats().cq_overruns >= 1);
    let waited = start.elapsed();
    // SAFETY: as above.
    let after = unsafe { snapshot(cq_ring.0, cq_ring.1) };
    let (produced, overruns) = (rig.cq_a.produced(), rig.nic_a.stats().cq_overruns);
    let observed = if overran && rig.cq_a.is_error() && produced == N {
        Outcome::CqOverrun
    } else {
        Outcome::Failed(format!(
            "no overrun seen: {overruns} overruns, CQ error {}, {produced} CQEs written",
            rig.cq_a.is_error()
        ))
    };
    let mut checks = vec![
        Check::new(format!("one overrun counted ({overruns})"), overruns == 1),
        Check::new(format!("no CQE written past the {N} entries ({produced})"), produced == N),
    ];
    // Device code's view: it posted 17 NOPs and waits for the last; 16 CQEs come, the 17th never does.
    let posted = N + 1;
    let sq = SqState { pi: posted, ready: posted, sig_first: posted, sig_end: posted, rung: posted, ..h.sq };
    let mut dh = QpHandle { sq, ..h };
    // SAFETY: `dh` describes `rig.a` (alive) as device code that posted those 17 NOPs would hold it.
    let mut d = unsafe { dev_qp(&mut dh, TIMEOUT) };
    let r = d.wait(Ticket(N));
    checks.push(Check::new(
        format!("device code waiting for the 17th CQE gets Timeout(Cqe) ({r:?})"),
        matches!(r, Err(DevError::Timeout(t)) if t.on == WaitOn::Cqe { qpn: d.handle().qpn, wqe_index: N }),
    ));
    checks.push(Check::new(
        format!("device code retired the {N} CQEs written (SQ ci {})", d.handle().sq.ci),
        d.handle().sq.ci == N,
    ));
    Ok(Observed {
        outcome: observed,
        qp_state: rig.a.state(),
        // CQ bytes changed by the overrun (it may write none: every entry held an unconsumed CQE).
        outside_changed: differing(&before, &after),
        waited,
        bound: Duration::from_secs(2),
        checks,
    })
}

fn raddr(mr: &RemoteMr, off: u64) -> Raddr {
    Raddr { addr: mr.addr + off, rkey: mr.rkey }
}

/// The catalogue's lengths are constants in 1 ..= 2^31 − 1.
fn sge(mr: &MrHandle, off: u64, len: u32) -> Sge {
    Sge::new(mr.addr + off, len, mr.lkey).expect("a catalogue SGE length")
}

/// A doorbell never rung: device code posts a signaled RDMA WRITE and publishes the dbrec but never writes
/// the doorbell (its `Qp` is forgotten, never dropped: a drop would ring it; the counters go to the handle as
/// they stood); other device code then waits for that WQE. The wait must end with `Timeout(Cqe)` after its
/// bound, the NIC must have executed nothing, and the destination must be untouched.
pub(crate) fn no_doorbell() -> Result<Observed, String> {
    const TIMEOUT: Duration = Duration::from_millis(200);
    let rig = setup(Rig::new(Path::Direct, 64, 64, Duration::from_secs(5)))?;
    let (src, dst) = (Guarded::new(256, 7), Guarded::new(256, 8));
    let src_mr = setup(src.register(&rig.nic_a, &rig.pd_a, Access::NONE))?;
    let dst_mr = setup(dst.register(&rig.nic_b, &rig.pd_b, Access::ALL))?;
    let mut h = rig.a.handle();
    let (ticket, posted) = {
        // SAFETY: `h` is `rig.a`'s handle (alive, host memory); only this thread uses it.
        let mut d = unsafe { dev_qp(&mut h, TIMEOUT) };
        let (r, l) = (raddr(&dst_mr.remote(), 0), sge(&src_mr.handle(), 0, 64));
        let t = step("posting the WRITE", d.post(true, wqe::rdma_write(r, l)))?;
        // The dbrec says there is a WQE; the doorbell never comes.
        // SAFETY: `rig.a`'s dbrec, alive.
        unsafe { db::update_dbrec(d.handle().dbrec, d.handle().sq.pi, d.handle().placement) };
        let posted = d.handle();
        core::mem::forget(d);
        (t, posted)
    };
    h = posted;
    // SAFETY: as above; the previous `Qp` over `h` is gone.
    let mut d = unsafe { dev_qp(&mut h, TIMEOUT) };
    let start = Instant::now();
    let r = d.wait(ticket);
    let waited = start.elapsed();
    let s = rig.nic_a.stats();
    let checks = vec![
        Check::new(
            format!("the wait names WQE {} ({r:?})", ticket.0),
            matches!(r, Err(DevError::Timeout(t)) if t.on == WaitOn::Cqe { qpn: d.handle().qpn, wqe_index: ticket.0 }),
        ),
        Check::new(format!("the wait lasted its timeout ({waited:?} >= {TIMEOUT:?})"), waited >= TIMEOUT),
        Check::new(
            format!("the NIC saw no doorbell and executed nothing ({} doorbells, {} WQEs)", s.doorbells, s.wqes),
            s.doorbells == 0 && s.wqes == 0 && rig.a.sq_consumed() == 0,
        ),
    ];
    let outside = src.changed_outside(&[]) + dst.changed_outside(&[]);
    let qp_state = rig.a.state();
    Ok(Observed { outcome: outcome(&r), qp_state, outside_changed: outside, waited, bound: TIMEOUT + SLACK, checks })
}

/// What is wrong with [`bad_doorbell`]'s doorbell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BadDb {
    /// It announces 100 WQEBBs more than the ring holds (a poster whose producer index went wrong): vendor
    /// `BAD_DOORBELL`.
    PastRing,
    /// It announces the right producer index but names another QPN (a poster's stale or wrong QPN, which on
    /// hardware rings another QP, or none): vendor `BAD_QPN`.
    OtherQpn,
}

/// A bad doorbell: device code posts an RDMA WRITE that completes, then a signaled second one whose doorbell is
/// not its own (`bad`, after the dbrec). The QP must fail on the second WRITE's index with 0x02 (the vendor
/// syndrome `bad` names): device code's wait for it ends with that error CQE, nothing of the WRITE is placed,
/// and the WRITE gets no second CQE when its right doorbell is rung after all.
pub(crate) fn bad_doorbell(path: Path, bad: BadDb) -> Result<Observed, String> {
    const TIMEOUT: Duration = Duration::from_secs(2);
    const FIRST: Range<usize> = 0..64;
    let rig = setup(Rig::new(path, 64, 64, Duration::from_secs(5)))?;
    let (src, dst) = (Guarded::new(128, 14), Guarded::new(128, 15));
    let src_mr = setup(src.register(&rig.nic_a, &rig.pd_a, Access::NONE))?;
    let dst_mr = setup(dst.register(&rig.nic_b, &rig.pd_b, Access::ALL))?;
    let mut h = rig.a.handle();
    let (ticket, posted) = {
        // SAFETY: `h` is `rig.a`'s handle (alive, host memory); only this thread uses it.
        let mut d = unsafe { dev_qp(&mut h, TIMEOUT) };
        step("the first WRITE", d.put(&dst_mr.remote(), 0, &src_mr.handle(), 0, 64).and_then(|()| d.flush()))?;
        let (r, l) = (raddr(&dst_mr.remote(), 64), sge(&src_mr.handle(), 64, 64));
        let t = step("posting the second WRITE", d.post(true, wqe::rdma_write(r, l)))?;
        let q = d.handle();
        let bad = match bad {
            BadDb::PastRing => CtrlSeg::producer_doorbell((q.sq.pi + 100) as u16, q.qpn),
            BadDb::OtherQpn => CtrlSeg::producer_doorbell(q.sq.pi as u16, q.qpn ^ 0x5a5a),
        };
        // SAFETY: `rig.a`'s dbrec and doorbell register, alive.
        unsafe { db::publish_and_ring(q.dbrec, q.sq.pi, q.bf_reg, bad, q.placement) };
        // Forgotten, not dropped: a drop would ring; the counters go on with the handle as they stood.
        let posted = d.handle();
        core::mem::forget(d);
        (t, posted)
    };
    h = posted;
    if !wait_until(Duration::from_secs(2), || rig.nic_a.stats().bad_doorbells == 1) {
        return Err("the NIC never saw the corrupt doorbell".into());
    }
    // SAFETY: as above; the previous `Qp` over `h` is gone.
    let mut d = unsafe { dev_qp(&mut h, TIMEOUT) };
    let start = Instant::now();
    let r = d.wait(ticket);
    let waited = start.elapsed();
    // The right doorbell, late: in the error state it flushes from the consumer index, which the error CQE
    // retired already.
    let q = d.handle();
    // SAFETY: `rig.a`'s doorbell register, alive.
    unsafe { db::ring_db(q.bf_reg, CtrlSeg::producer_doorbell(q.sq.pi as u16, q.qpn), q.placement) };
    let seen = wait_until(Duration::from_secs(2), || rig.nic_a.stats().doorbells >= 3);
    // Taking the SQ progress lock waits until the NIC has finished with that doorbell.
    let _ = rig.a.sq_consumed();
    let s = rig.nic_a.stats();
    let checks = vec![
        Check::new(format!("the right doorbell was seen after the corrupt one ({} doorbells)", s.doorbells), seen),
        Check::new(
            format!(
                "two CQEs: the first WRITE's and the error ({} written, {} error, {} flush)",
                rig.cq_a.produced(),
                s.error_cqes,
                s.flush_cqes
            ),
            rig.cq_a.produced() == 2 && s.error_cqes == 1 && s.flush_cqes == 0,
        ),
    ];
    let outside = src.changed_outside(&[]) + dst.changed_outside(&[FIRST]);
    let qp_state = rig.a.state();
    Ok(Observed { outcome: outcome(&r), qp_state, outside_changed: outside, waited, bound: TIMEOUT, checks })
}

/// Peer unreachable: a QP connected to an endpoint where nothing listens, with a retry timeout of 300 ms.
/// Device code's wait for an RDMA WRITE must end with 0x15 (transport retry exceeded) no earlier than the
/// retry timeout after `connect` and well before 10 times it (the wait's own bound).
pub(crate) fn unreachable() -> Result<Observed, String> {
    const RETRY: Duration = Duration::from_millis(300);
    const TIMEOUT: Duration = Duration::from_secs(3);
    let nic = setup(wired(RETRY).and_then(EmuNic::open))?;
    let pd = setup(nic.alloc_pd())?;
    let cq = setup(nic.create_cq(64))?;
    let qp = setup(nic.create_qp(&pd, &cq, 64))?;
    let src = Guarded::new(64, 9);
    let src_mr = setup(src.register(&nic, &pd, Access::NONE))?;
    let ghost = setup(ghost_endpoint())?;
    let start = Instant::now();
    setup(qp.connect(&ghost))?;
    let mut h = qp.handle();
    // SAFETY: `h` is `qp`'s handle (alive, host memory); only this thread uses it.
    let mut d = unsafe { dev_qp(&mut h, TIMEOUT) };
    let (r, l) = (raddr(&NOWHERE, 0), sge(&src_mr.handle(), 0, 64));
    let t = step("posting the WRITE", d.post(true, wqe::rdma_write(r, l)))?;
    let r = d.wait(t);
    let waited = start.elapsed();
    let checks = vec![Check::new(format!("not before the retry timeout ({waited:?} >= {RETRY:?})"), waited >= RETRY)];
    let outside = src.changed_outside(&[]);
    let qp_state = qp.state();
    Ok(Observed { outcome: outcome(&r), qp_state, outside_changed: outside, waited, bound: TIMEOUT, checks })
}

/// An error CQE on one QP while device code waits on a semaphore fed by another: NIC A has QP1 (to P1) and
/// QP2 (to P2), both on NIC B, across the wire. P2 feeds A's semaphore once (an RDMA fetch-add from device
/// code on P2: the semaphore reads 1), then never again. Device code on A posts an RDMA WRITE on QP1 with a
/// stale rkey and waits on the semaphore for 2 through QP1 (`Qp::wait_semaphore`): the wait must end with
/// QP1's 0x13 long before its 2 s bound, not hang or time out; QP2 stays usable.
pub(crate) fn semaphore_other_qp() -> Result<Observed, String> {
    const TIMEOUT: Duration = Duration::from_secs(2);
    const QP2_WRITE: Range<usize> = 128..192;
    let retry = Duration::from_secs(5);
    let (nic_a, nic_b) = (setup(wired(retry).and_then(EmuNic::open))?, setup(wired(retry).and_then(EmuNic::open))?);
    let (pd_a, pd_b) = (setup(nic_a.alloc_pd())?, setup(nic_b.alloc_pd())?);
    let cq = |nic: &Arc<EmuNic>| setup(nic.create_cq(64));
    let (cq1, cq2, cqp1, cqp2) = (cq(&nic_a)?, cq(&nic_a)?, cq(&nic_b)?, cq(&nic_b)?);
    let q1 = setup(nic_a.create_qp(&pd_a, &cq1, 64))?;
    let q2 = setup(nic_a.create_qp(&pd_a, &cq2, 64))?;
    let p1 = setup(nic_b.create_qp(&pd_b, &cqp1, 64))?;
    let p2 = setup(nic_b.create_qp(&pd_b, &cqp2, 64))?;
    for (x, y) in [(&q1, &p1), (&p1, &q1), (&q2, &p2), (&p2, &q2)] {
        setup(via_bytes(&y.endpoint()).and_then(|e| x.connect(&e)))?;
    }
    let (sem, src, res, dst) = (Guarded::new(8, 10), Guarded::new(64, 11), Guarded::new(8, 12), Guarded::new(256, 13));
    sem.write_u64(0, 0);
    let sem_mr = setup(sem.register(&nic_a, &pd_a, Access::LOCAL_WRITE | Access::REMOTE_ATOMIC))?;
    let src_mr = setup(src.register(&nic_a, &pd_a, Access::NONE))?;
    let res_mr = setup(res.register(&nic_b, &pd_b, Access::LOCAL_WRITE))?;
    let dst_mr = setup(dst.register(&nic_b, &pd_b, Access::ALL))?;
    let mut checks = Vec::new();

    // P2 feeds the semaphore once.
    let mut hp2 = p2.handle();
    {
        // SAFETY: `hp2` is `p2`'s handle (alive, host memory); only this thread uses it.
        let mut d = unsafe { dev_qp(&mut hp2, TIMEOUT) };
        let t = step("P2's signal", d.signal(&sem_mr.remote(), 0, &res_mr.handle(), 0))?;
        step("P2's signal completing", d.wait(t))?;
    }
    checks.push(Check::new(
        format!("P2's signal arrived (semaphore {}, old value {})", sem.u64_at(0), res.u64_at(0)),
        sem.u64_at(0) == 1 && res.u64_at(0) == 0,
    ));

    // QP1: a WRITE with a stale rkey, then the wait for P2's second signal, through QP1.
    let mut h1 = q1.handle();
    // SAFETY: `h1` is `q1`'s handle (alive, host memory); only this thread uses it.
    let mut d = unsafe { dev_qp(&mut h1, TIMEOUT) };
    let stale = RemoteMr { rkey: Be32::new(dst_mr.rkey() ^ 0x00ff_0000), ..dst_mr.remote() };
    let start = Instant::now();
    step("the WRITE on QP1", d.put(&stale, 0, &src_mr.handle(), 0, 64))?;
    // SAFETY: the semaphore word stays allocated and registered for the whole wait.
    let r = unsafe { d.wait_semaphore(sem.word_ptr(0), 2) };
    let waited = start.elapsed();
    // QP2 still carries a WRITE to P2.
    let mut h2 = q2.handle();
    // SAFETY: `h2` is `q2`'s handle (alive, host memory); only this thread uses it.
    let mut d2 = unsafe { dev_qp(&mut h2, TIMEOUT) };
    let q2_ok = d2.put(&dst_mr.remote(), QP2_WRITE.start as u64, &src_mr.handle(), 0, 64).and_then(|()| d2.flush());
    checks.push(Check::new(
        format!("QP2 still works: a WRITE on it completes ({q2_ok:?}, state {:?})", q2.state()),
        q2_ok.is_ok() && q2.state() == QpState::Rts && dst.bytes(QP2_WRITE) == src.pattern_range(0..64),
    ));
    checks.push(Check::new(format!("the semaphore still reads 1 ({})", sem.u64_at(0)), sem.u64_at(0) == 1));
    checks.push(Check::new(
        format!("the wait ended well before its bound ({waited:?} < {:?})", TIMEOUT / 2),
        waited < TIMEOUT / 2,
    ));
    // Permitted: the semaphore word (0 → 1 by P2), P2's fetch-add result (8 bytes at B) and QP2's WRITE.
    let outside = sem.changed_outside(&[WORD0])
        + src.changed_outside(&[])
        + res.changed_outside(&[WORD0])
        + dst.changed_outside(&[QP2_WRITE]);
    let qp_state = q1.state();
    Ok(Observed { outcome: outcome(&r), qp_state, outside_changed: outside, waited, bound: TIMEOUT, checks })
}
