//! The send-queue engine: turns a doorbell into a producer index, cross-checks the dbrec, then consumes
//! WQEs from the ring in order, executing them and writing their CQEs (or error and flush CQEs) through
//! [`super::completion`].
//!
//! Doorbell → producer index: the doorbell is the first 8 bytes of the last posted WQE's ctrl segment
//! (rdma-core's form), or the producer index itself with `ds` 0 (NVSHMEM IBGDA's form, which gdaki's posters
//! use), so the new producer index is `wqe_idx + ceil(ds / 4)` (16 bits) for both. It is rebuilt into a 64-bit index from the
//! QP's 64-bit consumer count: 1..=`wqe_cnt` WQEBBs ahead is new work; up to `wqe_cnt` behind is a stale
//! doorbell (e.g. two posters' doorbells landing out of order) and ignored, and so is one ahead but no further
//! than WQEs an earlier doorbell announced that still wait in the ring; anything else is a bad doorbell,
//! which fails the QP.

use std::mem::offset_of;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gdaki_shared::prm::dbrec::{QpDbrec, SQ_COUNTER_MASK};
use gdaki_shared::prm::uar::{blueflame_tagged, BF_BUF_SIZE, BF_OFFSET};
use gdaki_shared::prm::wqe::{wqebbs, CtrlSeg, SEG, SEGS_PER_WQEBB, WQEBB};
use gdaki_shared::Be32;

use crate::mem::{MemLoc, MirrorRead, SqMirror, SqWatch};

use super::access::DataPath;
use super::completion::{complete, fail, push_resp_imm};
use super::exec::{self, Pds};
use super::fabric::Fabric;
use super::fault::{vendor, Fault};
use super::guard::{lock, read};
use super::mr::MrTable;
use super::qmem::{self, QBuf};
use super::qp::{QpInner, QpState, SqProgress};
use super::stats::{add_ns, bump};
use super::wire::{requester, WireSq};
use super::wqe::{self, Expect, Op, MAX_WQE_BYTES};

/// Byte offset of the SQ counter (word 1) in the QP's doorbell record.
const DBREC_SQ_COUNTER: usize = offset_of!(QpDbrec, snd_counter);

/// The executor's own view of one QP, kept from one sweep to the next and touched by no other thread: what
/// makes a sweep over idle QPs cheap (no lock, no shared write), and the peer it executes against.
#[derive(Debug)]
pub(crate) struct Watched {
    pub qp: Arc<QpInner>,
    /// A copy of [`SqProgress::last_db`] that needs no lock: the two are written together under the
    /// `progress` lock by [`poll`], and RTR2RTS or 2ERR (the only other writers) run before the executor
    /// watches the QP (in RTS or ERR), when `poll` does not look at it. So a register equal to this value is no
    /// new doorbell.
    last_db: u64,
    /// The connected peer, looked up in the NIC's QP map when first needed. The executor drops it at its
    /// next refresh of the QP list, which `Qp::drop` of the peer waits for, so that this reference is never
    /// the last one.
    peer: Option<Arc<QpInner>>,
    /// Requester and responder state of a QP connected across the wire, made when the executor first sees
    /// the QP's link.
    pub wire: Option<WireSq>,
    /// The producer index of a doorbell whose WQEs are not all taken: the wire's requester had no room for
    /// the next one (see [`WireSq::accepts`]). `poll` goes on from the consumer index up to it.
    resume: Option<u64>,
    /// The copier's mirror of an SQ ring in GPU memory, where it keeps one ([`DataPath::mirror_sq`]); given
    /// back by [`Watched::release`].
    mirror: Option<SqMirror>,
}

impl Watched {
    /// Whether [`poll`] would find WQEs to take: a new doorbell, or WQEs left from the last one. Read without
    /// the QP's lock, as `poll` first decides.
    pub(crate) fn has_work(&self) -> bool {
        self.qp.doorbell() != self.last_db || self.resume.is_some()
    }

    /// Starts watching `qp`, with a mirror of its SQ ring from `data`'s copier when the ring and its dbrec
    /// are in GPU memory.
    pub(crate) fn new(qp: Arc<QpInner>, data: &DataPath) -> Self {
        // A QP the executor has not seen yet has had no doorbell acted on, so this is 0; read rather than
        // assumed, as it is what the lock-free comparison in `poll` must agree with.
        let (last_db, consumed) = {
            let p = lock(&qp.progress);
            (p.last_db, p.consumed)
        };
        let mirror = match (&qp.sq, &qp.dbrec) {
            (QBuf::Gpu(ring), QBuf::Gpu(dbrec)) => data.mirror_sq(SqWatch {
                ring: ring.addr(),
                wqebbs: qp.wqe_cnt,
                dbrec: dbrec.addr() + DBREC_SQ_COUNTER as u64,
                base: consumed,
            }),
            _ => None,
        };
        Self { qp, last_db, peer: None, wire: None, resume: None, mirror }
    }

    /// Gives the ring's mirror back to the copier (before the QP's memory may go): the executor calls this
    /// for every entry it stops watching.
    pub(crate) fn release(&mut self, data: &DataPath) {
        if let Some(m) = self.mirror.take() {
            data.unmirror_sq(m);
        }
    }

    /// The QP and its wire state, made when the QP has a link (from its INIT2RTR on); `None` for a QP without
    /// a link or a destroyed one. From RTS on, the state's requests start at the QP's `next_send_psn`.
    pub(crate) fn wire(&mut self) -> Option<(&QpInner, &mut WireSq)> {
        if self.qp.is_destroyed() {
            return None;
        }
        if self.wire.is_none() {
            self.wire = Some(WireSq::new(self.qp.link.get()?.clone()));
        }
        let ws = self.wire.as_mut()?;
        // The executor's requester runs in RTS (and flushes in ERR, which follows RTS or sends nothing).
        if matches!(self.qp.state(), QpState::Rts | QpState::Error) {
            ws.start_sending(self.qp.sq_psn());
        }
        Some((&self.qp, ws))
    }

    /// Forgets the cached peer (the executor refreshed its QP list: the peer may be gone).
    pub(crate) fn forget_peer(&mut self) {
        self.peer = None;
    }
}

/// The peer `qp` is connected to: `cached`, or looked up in the NIC's QP map (and cached). `None` when the QP
/// is not connected or its peer is destroyed.
fn peer<'a>(fab: &Fabric, qp: &QpInner, cached: &'a mut Option<Arc<QpInner>>) -> Option<&'a QpInner> {
    if cached.is_none() {
        let qpn = *qp.peer.get()?;
        *cached = read(&fab.qps).get(&qpn).cloned();
    }
    cached.as_deref()
}

/// The executor's reusable state, handed to [`poll`].
pub(crate) struct Engine {
    pub data: DataPath,
    pub scratch: Vec<(MemLoc, u64)>,
    /// Whether more than one QP has WQEs to take in this sweep (the executor sets it per sweep): then a
    /// [`take`] leaves its QP after a WQE that changed the way the GPU operations go, for the others.
    pub interleave: bool,
    wqe: Box<[u8; MAX_WQE_BYTES]>,
    fetched: Fetched,
}

impl Engine {
    pub(crate) fn new(data: DataPath) -> Self {
        Self {
            data,
            scratch: Vec::new(),
            interleave: false,
            wqe: Box::new([0; MAX_WQE_BYTES]),
            fetched: Fetched::default(),
        }
    }
}

/// Where the WQE bytes of the current [`take`] come from, besides an SQ ring in host memory (read in place);
/// valid for that QP and range only.
#[derive(Debug, Default)]
struct Fetched {
    /// The host copy of the WQEBBs fetched from an SQ ring in GPU memory, at their offsets in the ring.
    mirror: Vec<u8>,
    /// The WQE a BlueFlame write carried (its 64-bit index and the register's 64 bytes, `signature` byte as
    /// the ring's copy has it), taken in place of the ring's copy, as hardware does.
    blueflame: Option<(u64, [u8; WQEBB])>,
    /// The QP's ring mirror, if it has one ([`Watched::mirror`]).
    sq_mirror: Option<SqMirror>,
}

/// The ctrl segment whose first 8 bytes are the doorbell value `db` (as stored in memory).
fn ctrl_of_doorbell(db: u64) -> CtrlSeg {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&db.to_ne_bytes());
    bytemuck::pod_read_unaligned(&b)
}

/// Looks at the watched QP's doorbell register and, if it changed, processes the WQEs it announces. Returns
/// whether there was anything to do (for the idle back-off).
pub(crate) fn poll(fab: &Fabric, w: &mut Watched, eng: &mut Engine) -> bool {
    if w.qp.is_destroyed() || !matches!(w.qp.state(), QpState::Rts | QpState::Error) {
        return false;
    }
    w.wire();
    let qp = &*w.qp;
    let db = qp.doorbell();
    // The common case on a sweep: nothing new on this QP. Decided without the lock or any shared write.
    if db == w.last_db && w.resume.is_none() {
        return false;
    }
    let mut p = lock(&qp.progress);
    // `Qp::drop` marks the QP destroyed and then takes this lock: checked again under it, no WQE of a
    // dropped QP starts after `drop` has passed the lock.
    if qp.is_destroyed() {
        return false;
    }
    // Doorbells rung while one is taken join its batch (at most MAX_DOORBELLS_PER_BATCH, for fairness):
    // posters that each ring their own (Block and Device sharing) are taken in one pass.
    let mut busy = false;
    let mut db = db;
    eng.fetched.sq_mirror = w.mirror;
    // This QP's GPU operations need follow only its own earlier ones (RC orders a QP, not QPs).
    eng.data.order_by(Some(qp.qpn));
    for _ in 0..MAX_DOORBELLS_PER_BATCH {
        w.last_db = db;
        busy |= act(fab, qp, (&mut w.peer, w.wire.as_mut(), &mut w.resume), eng, &mut p, db);
        if w.resume.is_some() || qp.state() != QpState::Rts {
            break;
        }
        db = qp.doorbell();
        if db == p.last_db {
            break;
        }
    }
    eng.data.order_by(None);
    busy
}

/// Doorbells one [`poll`] takes in one batch at most.
const MAX_DOORBELLS_PER_BATCH: usize = 64;

/// Acts on doorbell value `db` of `qp` (or, when it is the one already acted on, resumes WQEs the wire had no
/// room for). Returns whether there was anything to do.
fn act(
    fab: &Fabric,
    qp: &QpInner,
    mut w: (&mut Option<Arc<QpInner>>, Option<&mut WireSq>, &mut Option<u64>),
    eng: &mut Engine,
    p: &mut SqProgress,
    db: u64,
) -> bool {
    if db == p.last_db {
        // No new doorbell; WQEs of an earlier one may still wait for room on the wire.
        let Some(pi) = *w.2 else { return false };
        return take(fab, qp, w, eng, p, pi);
    }
    p.last_db = db;
    bump(&fab.stats.doorbells);
    let ctrl = ctrl_of_doorbell(db);
    let end = ctrl.wqe_index().wrapping_add(wqebbs(ctrl.ds() as u32) as u16);
    let cons16 = p.consumed as u16;
    let ahead = end.wrapping_sub(cons16) as u64;
    let wqe_cnt = qp.wqe_cnt as u64;
    // WQEBBs an earlier doorbell announced that still wait in the ring (`take` left them for later): a doorbell
    // that announces no more was rung before that one and landed after it (two posters' doorbells out of order),
    // and is stale too. Taken, it would leave the rest in the ring, without CQEs, until some later doorbell.
    let owed = w.2.map_or(0, |pi| pi.saturating_sub(p.consumed));
    if ahead <= owed || ahead > wqe_cnt {
        // A BlueFlame write that carried this doorbell goes with it: its words must not stay in the register for
        // the next doorbell, which would take them for its own WQE when their tag matches (when it names the WQE
        // index this one named, or one 256 on).
        clear_blueflame_words(fab, qp, 1..BF_BUF_SIZE / 8);
        if ahead <= owed || cons16.wrapping_sub(end) as u64 <= wqe_cnt {
            bump(&fab.stats.stale_doorbells);
            tracing::debug!(qpn = qp.qpn, end, consumed = p.consumed, "emulated NIC: stale doorbell ignored");
        } else {
            bump(&fab.stats.bad_doorbells);
            tracing::warn!(
                qpn = qp.qpn,
                end,
                consumed = p.consumed,
                wqe_cnt,
                "emulated NIC: doorbell announces more WQEBBs than the SQ holds"
            );
            fail_doorbell(fab, qp, w.1, eng, p, ctrl.opcode(), Fault::qp_op(vendor::BAD_DOORBELL));
        }
        return true;
    }
    if ctrl.qpn() != qp.qpn {
        // A doorbell that would have this QP take WQEs but names another QP. On hardware its QPN picks the SQ it
        // rings: that other QP, or none, and this one's WQEs would wait forever. Stricter: the QP fails, as a
        // BlueFlame write naming another QP does. (A stale one is ignored above whatever it names.)
        clear_blueflame_words(fab, qp, 1..BF_BUF_SIZE / 8);
        bump(&fab.stats.bad_doorbells);
        tracing::warn!(qpn = qp.qpn, named = ctrl.qpn(), "emulated NIC: doorbell names another QP");
        fail_doorbell(fab, qp, w.1, eng, p, ctrl.opcode(), Fault::qp_op(vendor::BAD_QPN));
        return true;
    }
    let pi = p.consumed + ahead;
    if let QBuf::Host(d) = &qp.dbrec {
        check_dbrec(fab, qp, qmem::load_u32(d, DBREC_SQ_COUNTER, Ordering::Acquire), pi);
    }
    let bf = match take_blueflame(fab, qp, db, p.consumed) {
        Ok(bf) => bf,
        Err(f) => {
            // The producer index is sound: the doorbell's other WQEs are flushed now, behind the error.
            fail_doorbell(fab, qp, w.1.as_deref_mut(), eng, p, ctrl.opcode(), f);
            take(fab, qp, w, eng, p, pi);
            return true;
        }
    };
    if let Some(b) = &bf {
        compare_blueflame(fab, qp, p.consumed, b);
    }
    eng.fetched.blueflame = bf.map(|b| (p.consumed, b));
    take(fab, qp, w, eng, p, pi);
    eng.fetched.blueflame = None;
    true
}

/// Fails `qp` for a fault of its doorbell itself (`f`: a bad doorbell or BlueFlame write; `op`: the opcode byte
/// the doorbell carried), unless it is in the error state already. The error CQE names the WQE at the consumer
/// index, as hardware's does, and retires it ([`SqProgress::reported`]). With a wire it goes through the wire's
/// queue, behind the CQEs of requests still outstanding, as the failure of a WQE does. A QP whose failure is
/// queued there already ([`WireSq::failing`]) counts as in the error state too (it leaves RTS only once the
/// requests ahead of that failure complete): a second fault queued at the same consumer index would give the WQE
/// the first one retired a flush CQE after its error CQE.
fn fail_doorbell(
    fab: &Fabric,
    qp: &QpInner,
    wire: Option<&mut WireSq>,
    eng: &mut Engine,
    p: &mut SqProgress,
    op: u8,
    f: Fault,
) {
    if qp.state() == QpState::Error || wire.as_deref().is_some_and(WireSq::failing) {
        return;
    }
    match wire {
        Some(ws) => requester::post_failed(fab, qp, ws, &mut eng.data, p.consumed, op, f),
        None => fail(fab, qp, &mut eng.data, p.consumed, op, f),
    }
    p.reported = Some(p.consumed);
}

/// Takes the WQEs from the consumer index up to `pi`, or up to the first one the wire's requester has no room
/// for (then `w.resume` remembers `pi`). Returns whether it took any.
/// `w` is the watched QP's cached peer, wire state and resume index.
fn take(
    fab: &Fabric,
    qp: &QpInner,
    w: (&mut Option<Arc<QpInner>>, Option<&mut WireSq>, &mut Option<u64>),
    eng: &mut Engine,
    p: &mut SqProgress,
    pi: u64,
) -> bool {
    let (peer, mut wire, resume) = w;
    let start = p.consumed;
    *resume = None;
    if wire.is_none()
        && qp.state() == QpState::Rts
        && p.responder_wait.is_some_and(|t| t.elapsed() < fab.retry_timeout())
        && responder_pending(fab, qp, peer)
    {
        // The WQE at the consumer index waits for its responder (`step`), still in vain: nothing of the ring is
        // read again (a ring in GPU memory without a mirror would be copied to the host at every look). A QP
        // moved to ERR meanwhile goes on to `step`, which flushes its WQEs.
        *resume = Some(pi);
        return false;
    }
    // While QPs interleave, a ring in GPU memory with a mirror is read from the mirror a window at a time:
    // this take may pause after a change of way (below), and reading the whole rung range again at each pause
    // cost more than the WQEs. A ring read in place has nothing to read ahead; one without a mirror is fetched
    // whole, once, and never paused.
    let mirrored = eng.interleave && matches!(qp.sq, QBuf::Gpu(_)) && eng.fetched.sq_mirror.is_some();
    let stop = if mirrored { pi.min(p.consumed + WINDOW_WQEBBS) } else { pi };
    // A BlueFlame WQE is the doorbell's only one (see `take_blueflame`): nothing to fetch from the ring.
    if eng.fetched.blueflame.is_none() {
        // Up to one largest WQE past the window: the last WQE that starts in it is read whole.
        load_ring(fab, qp, eng, p.consumed, pi.min(stop + (MAX_WQE_BYTES / WQEBB) as u64));
    }
    // Without a wire the WQEs execute here, under the MR table's read lock: taken once for up to
    // `WQES_PER_MR_LOCK` of them (two atomic read-modify-writes per WQE were a quarter of this function's
    // time), so that a deregistration, which takes the write lock, waits for that many at most.
    let mut mrs = wire.is_none().then(|| read(&fab.mrs));
    let mut under_lock = 0;
    // Whether going on later costs nothing: the ring is read in place or from its mirror, not fetched again.
    let may_pause = eng.interleave && (!matches!(qp.sq, QBuf::Gpu(_)) || mirrored);
    if stop < pi {
        // Goes on from the window's end in the next pass, unless the loop stops before it.
        *resume = Some(pi);
    }
    while p.consumed < stop {
        if under_lock == WQES_PER_MR_LOCK && mrs.is_some() {
            // Released first, so that a waiting deregistration goes before the lock is taken again.
            drop(mrs.take());
            mrs = Some(read(&fab.mrs));
            under_lock = 0;
        }
        let via = match (wire.as_deref_mut(), mrs.as_deref()) {
            (Some(ws), _) => Via::Wire(ws),
            (None, Some(m)) => Via::Here(m),
            // Not reached: `mrs` is taken whenever there is no wire.
            (None, None) => break,
        };
        let ways = eng.data.way_changes();
        let n = step(fab, qp, (peer, p), via, eng, pi);
        if n == 0 {
            *resume = Some(pi);
            break;
        }
        p.responder_wait = None;
        p.consumed += n;
        under_lock += 1;
        if may_pause && eng.data.way_changes() != ways && p.consumed < pi {
            // The WQE changed the way the GPU operations go (a long copy after atomics, or the reverse): the
            // other QPs' WQEs of the new way go next, together with it, and this QP goes on in the next pass.
            *resume = Some(pi);
            break;
        }
    }
    p.consumed != start
}

/// WQEBBs of a ring mirror one [`take`] reads and executes at most (see there).
const WINDOW_WQEBBS: u64 = 64;

/// WQEs executed under one hold of the MR table's read lock at most ([`take`]).
const WQES_PER_MR_LOCK: u32 = 64;

/// Records a mismatch when dbrec word 1 (SQ counter, `word` as stored) is behind the doorbell's producer
/// index. It may be ahead: another poster may have updated it already for WQEs whose doorbell is still to
/// come.
fn check_dbrec(fab: &Fabric, qp: &QpInner, word: u32, pi: u64) {
    let dbrec = Be32::from_bits(word).get() & SQ_COUNTER_MASK;
    let ahead = (dbrec as u16).wrapping_sub(pi as u16) as u64;
    if ahead > qp.wqe_cnt as u64 {
        bump(&fab.stats.dbrec_mismatches);
        tracing::warn!(
            qpn = qp.qpn,
            dbrec,
            pi = pi & SQ_COUNTER_MASK as u64,
            "emulated NIC: dbrec SQ counter (word 1) behind the doorbell; was it written, and to word 1?"
        );
    }
}

/// Takes the WQE of a BlueFlame write from the register, for doorbell value `db` (word 0, already read)
/// when the NIC has consumed `consumed` WQEBBs: words 7..1 are swapped for [`Fabric::bf_sentinel`] (what the
/// NIC leaves in them, so that a word that differs was stored since), word 1 last. Returns the register's 64
/// bytes when they are a whole write of the WQE `db` announces, as [`blueflame_word1`] describes it: word 0
/// names the next WQE (`consumed`; a later index means doorbells the NIC never saw, whose words may still be
/// in the register), the WQE fits the register (`ds` 1..=4), every word its `ds` covers was stored, word 1
/// carries its tag, and word 0, loaded again once word 1 is taken, still holds `db`. The last check is for the
/// tag's 8 bits: while the NIC is between its read of `db` and its swaps (a descheduled thread), posters may
/// write WQEs `idx + 1 ..= idx + 256` by BlueFlame, and the last one's words carry `idx`'s tag; each of those
/// writes stored its own word 0 (a WQE index repeats only 65,536 WQEs later, beyond any ring), so a word 0 that
/// still holds `db` means the words taken were stored for `db`. Then the `signature` byte is given back the
/// ring copy's value (zero, as gdaki and rdma-core build WQEs). Otherwise `None`, and the WQEs are read from
/// the ring, where software must have written them too (hardware falls back to the ring the same way;
/// [`Stats::blueflame_fallbacks`] counts the register's words that were written but not used).
///
/// A write that stored words past the register (the handle's `bf_size` is one WQEBB) fails the QP instead:
/// `Err` with [`vendor::BLUEFLAME_TOO_LARGE`]; so does any write to the register of a doorbell-only UAR
/// ([`vendor::BLUEFLAME_NO_BUFFER`]).
///
/// [`Stats::blueflame_fallbacks`]: super::Stats::blueflame_fallbacks
fn take_blueflame(fab: &Fabric, qp: &QpInner, db: u64, consumed: u64) -> Result<Option<[u8; WQEBB]>, Fault> {
    let sentinel = fab.bf_sentinel;
    let mut words = [db; WQEBB / 8];
    for i in (1..WQEBB / 8).rev() {
        words[i] = qmem::swap_u64(&qp.uar, BF_OFFSET + 8 * i, sentinel, Ordering::AcqRel);
    }
    if words[1..].iter().all(|&v| v == sentinel) {
        return Ok(None);
    }
    if !fab.blueflame {
        tracing::warn!(qpn = qp.qpn, consumed, "emulated NIC: a BlueFlame write on a doorbell-only UAR");
        return Err(Fault::qp_op(vendor::BLUEFLAME_NO_BUFFER));
    }
    // Looked at only after a write to the register: a plain doorbell costs nothing more.
    if clear_blueflame_words(fab, qp, WQEBB / 8..BF_BUF_SIZE / 8) {
        tracing::warn!(qpn = qp.qpn, consumed, "emulated NIC: a BlueFlame write larger than the 64-byte register");
        return Err(Fault::qp_op(vendor::BLUEFLAME_TOO_LARGE));
    }
    let ctrl = ctrl_of_doorbell(db);
    let covered = 2 * ctrl.ds() as usize;
    let whole = ctrl.wqe_index() == consumed as u16
        && (1..=SEGS_PER_WQEBB as u8).contains(&ctrl.ds())
        && words[1..covered].iter().all(|&v| v != sentinel)
        && blueflame_tagged(db, words[1])
        // After the swaps (acquire): a write stored since the doorbell's read has replaced word 0.
        && qmem::load_u64(&qp.uar, BF_OFFSET, Ordering::Acquire) == db;
    if !whole {
        bump(&fab.stats.blueflame_fallbacks);
        tracing::debug!(
            qpn = qp.qpn,
            consumed,
            "emulated NIC: BlueFlame words not a whole write; WQE read from the ring"
        );
        return Ok(None);
    }
    bump(&fab.stats.blueflame);
    let mut b = [0u8; WQEBB];
    for (chunk, w) in b.chunks_exact_mut(8).zip(words) {
        chunk.copy_from_slice(&w.to_ne_bytes());
    }
    b[offset_of!(CtrlSeg, signature)] = 0;
    Ok(Some(b))
}

/// Gives BlueFlame buffer words `words` of `qp`'s UAR (indices of 8-byte words) the sentinel back; returns whether
/// any held something else (software stored it since the NIC last cleared it). A load first, a swap only for a
/// word that differs: past the 64-byte register the words hold the sentinel unless software wrote past it, and
/// 24 locked swaps on every BlueFlame doorbell were a third of the NIC's work on it (the `cpu` executor's
/// BlueFlame ping-pong: 0.95 -> 0.65 µs of passes per round trip). A write that lands after the load is seen
/// by the next doorbell's look.
fn clear_blueflame_words(fab: &Fabric, qp: &QpInner, words: std::ops::Range<usize>) -> bool {
    let sentinel = fab.bf_sentinel;
    let mut written = false;
    for i in words {
        let off = BF_OFFSET + 8 * i;
        if qmem::load_u64(&qp.uar, off, Ordering::Acquire) != sentinel {
            written |= qmem::swap_u64(&qp.uar, off, sentinel, Ordering::AcqRel) != sentinel;
        }
    }
    written
}

/// Compares the WQE a BlueFlame write carried (`bf`, at WQEBB index `idx`) with the ring's copy when the ring
/// is in host memory (for a ring in GPU memory that would cost the fetch BlueFlame saves) and counts a
/// difference in [`Stats::blueflame_mismatches`](super::Stats::blueflame_mismatches): software that writes
/// one WQE to the ring and another to the register has a bug that hardware shows only when it falls back to
/// the ring. The register's copy is the one executed, as on hardware.
fn compare_blueflame(fab: &Fabric, qp: &QpInner, idx: u64, bf: &[u8; WQEBB]) {
    let QBuf::Host(ring) = &qp.sq else { return };
    let mut r = [0u8; WQEBB];
    let off = ((idx & (qp.wqe_cnt as u64 - 1)) as usize) * WQEBB;
    qmem::read_wrapping(ring, off, &mut r);
    let n = SEG * bytemuck::pod_read_unaligned::<CtrlSeg>(&bf[..SEG]).ds() as usize;
    if r[..n] != bf[..n] {
        bump(&fab.stats.blueflame_mismatches);
        tracing::warn!(
            qpn = qp.qpn,
            wqe_counter = idx as u16,
            "emulated NIC: BlueFlame write differs from the WQE in the ring"
        );
    }
}

/// Fetches WQEBBs `from..to` of an SQ ring in GPU memory into the engine's mirror, with dbrec word 1 (one
/// synchronize for both), and cross-checks the dbrec. Nothing to do for a ring in host memory (read in
/// place). A failed fetch moves the QP to the error state.
fn load_ring(fab: &Fabric, qp: &QpInner, eng: &mut Engine, from: u64, to: u64) {
    let QBuf::Gpu(ring) = &qp.sq else { return };
    if to <= from {
        return;
    }
    let len = ring.len();
    eng.fetched.mirror.resize(len, 0);
    let mask = qp.wqe_cnt as u64 - 1;
    let start = ((from & mask) as usize) * WQEBB;
    let n = (((to - from) as usize) * WQEBB).min(len);
    let first = n.min(len - start);
    if let Some(m) = eng.fetched.sq_mirror {
        if read_mirror(fab, &eng.data, &m, from, to, &mut eng.fetched.mirror) {
            bump(&fab.stats.ring_mirrored);
            return;
        }
    }
    let (head, tail) = eng.fetched.mirror.split_at_mut(start);
    let mut word = [0u8; 4];
    let mut reads = [
        (ring.loc(start), &mut tail[..first]),
        (ring.loc(0), &mut head[..n - first]),
        (qp.dbrec.loc(DBREC_SQ_COUNTER), &mut word[..]),
    ];
    bump(&fab.stats.ring_fetches);
    match eng.data.fetch(&mut reads) {
        Ok(()) => check_dbrec(fab, qp, u32::from_ne_bytes(word), to),
        Err(f) => fail(fab, qp, &mut eng.data, from, 0, f),
    }
    // A mirror that fell so far behind (its engine was away) that the dbrec's 16 bits no longer tell how far
    // starts again here.
    if let Some(m) = eng.fetched.sq_mirror {
        if to.saturating_sub(m.count()) > MIRROR_REBASE {
            eng.data.rebase_sq_mirror(&m, to);
        }
    }
}

/// How long the NIC waits for a ring's mirror to hold a rung range before it fetches the range: the mirror
/// is written by the GPU, which sees the dbrec move before the doorbell reaches the NIC, but whose copy
/// crosses PCIe after it.
const MIRROR_WAIT: Duration = Duration::from_micros(20);

/// How far behind the producer index a mirror may be before it is rebased: half the dbrec counter's range.
const MIRROR_REBASE: u64 = 1 << 15;

/// Copies WQEBBs `from..to` out of `m` into `ring` (the engine's copy of the whole ring), waiting up to
/// [`MIRROR_WAIT`] for the ones not there yet while its copier runs; whether all of them came. A range a
/// later lap overwrote is not waited for (the fetch that follows finds what the ring holds now).
fn read_mirror(fab: &Fabric, data: &DataPath, m: &SqMirror, mut from: u64, to: u64, ring: &mut [u8]) -> bool {
    let mut t0 = None;
    let done = loop {
        match m.read(from, to, ring) {
            MirrorRead::Done => break true,
            MirrorRead::Overwritten => break false,
            MirrorRead::Behind(at) => from = at,
        }
        if !data.mirrors_running() {
            break false;
        }
        let t = *t0.get_or_insert_with(Instant::now);
        if t.elapsed() >= MIRROR_WAIT {
            break false;
        }
        std::hint::spin_loop();
    };
    if let Some(t) = t0 {
        add_ns(&fab.stats.ring_mirror_wait_ns, t.elapsed());
    }
    done
}

/// Reads `out.len()` bytes (a multiple of 8) of the WQE at 64-bit index `idx`, from byte `at` of the WQE on:
/// from the BlueFlame write that carried it, or from the ring (in place, or the mirror of a ring in GPU
/// memory), wrapping past the ring's end.
fn wqe_bytes(qp: &QpInner, fetched: &Fetched, idx: u64, at: usize, out: &mut [u8]) {
    if let Some((i, b)) = &fetched.blueflame {
        if *i == idx {
            // `parse_ctrl` bounds the WQE to the one WQEBB the doorbell announced: inside `b`.
            for (k, o) in out.iter_mut().enumerate() {
                *o = b.get(at + k).copied().unwrap_or(0);
            }
            return;
        }
    }
    let off = ((idx & (qp.wqe_cnt as u64 - 1)) as usize) * WQEBB + at;
    match &qp.sq {
        QBuf::Host(b) => qmem::read_wrapping(b, off, out),
        QBuf::Gpu(_) => {
            let mirror = &fetched.mirror;
            let len = mirror.len();
            for (i, b) in out.iter_mut().enumerate() {
                *b = if len == 0 { 0 } else { mirror[(off + i) % len] };
            }
        }
    }
}

/// Where a WQE goes once parsed.
enum Via<'a> {
    /// To the QP's wire, whose requester sends it.
    Wire(&'a mut WireSq),
    /// Executed here (the peer QP is on this NIC), against the MR table under its read lock.
    Here(&'a MrTable),
}

/// Consumes the WQE at `qp`'s consumer index `p.consumed` (producer index `pi`; its peer QP is cached in
/// `peer`); returns the WQEBBs it took (≥ 1), or 0 when the wire's requester cannot take it yet
/// ([`WireSq::accepts`]) or its responder on this NIC is not in RTR yet ([`responder_pending`]): it stays in
/// the ring, untouched.
fn step(
    fab: &Fabric,
    qp: &QpInner,
    (peer, p): (&mut Option<Arc<QpInner>>, &mut SqProgress),
    mut via: Via<'_>,
    eng: &mut Engine,
    pi: u64,
) -> u64 {
    let idx = p.consumed;
    let avail = pi - idx;
    // The ctrl segment goes where the whole WQE will be, so that the body is read after it and nothing twice.
    wqe_bytes(qp, &eng.fetched, idx, 0, &mut eng.wqe[..SEG]);
    let ctrl: CtrlSeg = bytemuck::pod_read_unaligned(&eng.wqe[..SEG]);
    // Size to skip when the WQE is not executed: its own ds when sane, at least one WQEBB, never past pi.
    let skip = (wqebbs(ctrl.ds() as u32) as u64).clamp(1, avail);
    // Failures go through the wire's queue when there is one, so that their CQEs stay behind earlier ones.
    let settle = |via: &mut Via<'_>, eng: &mut Engine, op: u8, f: Fault| match via {
        Via::Wire(ws) => requester::post_failed(fab, qp, ws, &mut eng.data, idx, op, f),
        Via::Here(_) => fail(fab, qp, &mut eng.data, idx, op, f),
    };
    if p.reported == Some(idx) {
        // Its error CQE is written (or queued behind the wire's outstanding requests) already.
        p.reported = None;
        return skip;
    }
    if qp.state() == QpState::Error {
        settle(&mut via, eng, ctrl.opcode(), Fault::flushed());
        return skip;
    }
    let e = Expect { qpn: qp.qpn, wqe_cnt: qp.wqe_cnt, index: idx as u16, avail };
    let h = match wqe::parse_ctrl(&ctrl, &e) {
        Ok(h) => h,
        Err(f) => {
            settle(&mut via, eng, ctrl.opcode(), f);
            return skip;
        }
    };
    // parse_ctrl bounds ds to 63 segments: `len` fits `eng.wqe`, and the body starts inside the ring (read
    // with wrap, as the WQE may continue at slot 0).
    let len = h.ds as usize * SEG;
    wqe_bytes(qp, &eng.fetched, idx, SEG, &mut eng.wqe[SEG..len]);
    let op = match wqe::parse_body(&h, &eng.wqe[..len]) {
        Ok(op) if op.len() > qp.max_msg() => {
            settle(&mut via, eng, h.opcode, Fault::length(vendor::MSG_TOO_LONG));
            return h.wqebbs as u64;
        }
        Ok(op) => op,
        Err(f) => {
            settle(&mut via, eng, h.opcode, f);
            return h.wqebbs as u64;
        }
    };
    let mrs = match via {
        Via::Wire(ws) => {
            if !ws.accepts(&op) {
                // Taken later, once the outbox has room (or the READs it must wait for are answered).
                return 0;
            }
            requester::post(fab, qp, ws, &mut eng.data, idx, &h, &op);
            return h.wqebbs as u64;
        }
        Via::Here(mrs) => mrs,
    };
    if !matches!(op, Op::Nop) && responder_pending(fab, qp, peer) {
        // Unanswered, as on hardware, whose requester sends it again after each ACK timeout until its retry
        // count runs out: it waits here, and fails (0x15, below) only once the retry timeout has passed.
        let since = *p.responder_wait.get_or_insert_with(Instant::now);
        if since.elapsed() < fab.retry_timeout() {
            return 0;
        }
    }
    match run(fab, qp, (peer, mrs), &op, &mut eng.data, &mut eng.scratch) {
        Ok(out) => {
            bump(&fab.stats.wqes);
            if let Some((imm, placed)) = out.resp_imm {
                if let Err(f) = respond_imm(fab, qp, peer, &mut eng.data, imm, placed) {
                    fail(fab, qp, &mut eng.data, idx, h.opcode, f);
                    return h.wqebbs as u64;
                }
            }
            if h.cq_update {
                if !eng.interleave && idx + h.wqebbs as u64 >= pi {
                    // The doorbell's last WQE, with no other QP's WQEs waiting: its data movement starts now,
                    // before its CQE is even built, which follows with the pass's own submit. The peer waits
                    // for the data, the poster for the CQE later; the engine reads the published commands
                    // once per PCIe round trip, so data published a few hundred ns sooner is executed
                    // sooner. With several QPs busy the pass publishes once (measured on the H200: with a
                    // publish per doorbell, four QPs' 256 KiB and 4 MiB WRITEs took 37% longer).
                    eng.data.submit();
                }
                complete(fab, qp, &mut eng.data, idx, h.opcode, out.byte_cnt);
            }
        }
        Err(f) => fail(fab, qp, &mut eng.data, idx, h.opcode, f),
    }
    h.wqebbs as u64
}

/// Whether `qp`'s peer on this NIC exists but has not been moved to RTR yet (RESET or INIT): the two ends of a
/// connection are moved one after the other, so a requester in RTS may post before its responder can answer.
/// A peer that is gone, in ERR, or connected to another QP never answers: `run` fails the WQE at once.
fn responder_pending(fab: &Fabric, qp: &QpInner, cached: &mut Option<Arc<QpInner>>) -> bool {
    peer(fab, qp, cached).is_some_and(|p| !p.is_destroyed() && matches!(p.state(), QpState::Reset | QpState::Init))
}

/// Finds the responder and executes `op` against `mrs` (the MR table, under its read lock).
fn run(
    fab: &Fabric,
    qp: &QpInner,
    (peer_cache, mrs): (&mut Option<Arc<QpInner>>, &MrTable),
    op: &Op<'_>,
    data: &mut DataPath,
    scratch: &mut Vec<(MemLoc, u64)>,
) -> Result<exec::Outcome, Fault> {
    let remote = match op {
        Op::Nop => qp.responder(),
        _ => match peer(fab, qp, peer_cache) {
            Some(peer) if peer.responds_to(qp.qpn) => peer.responder(),
            _ => return Err(Fault::retry_exceeded()),
        },
    };
    exec::execute(op, Pds { local: qp.pdn, remote }, mrs, data, scratch)
}

/// The responder's RESP_WR_IMM CQE, after the data is placed.
fn respond_imm(
    fab: &Fabric,
    qp: &QpInner,
    peer_cache: &mut Option<Arc<QpInner>>,
    data: &mut DataPath,
    imm: Be32,
    placed: u32,
) -> Result<(), Fault> {
    let Some(peer) = peer(fab, qp, peer_cache) else {
        return Err(Fault::retry_exceeded());
    };
    push_resp_imm(fab, peer, data, imm, placed)
}
