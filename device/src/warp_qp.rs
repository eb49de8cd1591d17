//! An RC QP driven by one warp (DOCA GPUNetIO's `put_warp` on an EXCLUSIVE QP, NVSHMEM's warp-scope puts):
//! the lanes that call [`WarpQp::post`] together each build one WQE, the lowest reserves WQEBBs for all of
//! them, each stores its own, and one doorbell covers the batch.
//!
//! The send-queue state is the Exclusive QP's: the leader lane drives a [`Qp`] over the handle for the
//! reservation, the counters, the CQ and the doorbell, so the ring's rules (CQE policy, retirement, sticky
//! errors) are the same code. The other lanes only read the handle's fixed fields (ring, QPN, size). On the
//! host a thread is a warp of one lane ([`crate::warp`]): each thread posts and rings for itself. A `WarpQp`
//! keeps the QP's one send-queue state as a `Qp` does, so it follows any earlier poster of its handle.

use core::marker::PhantomData;

use crate::error::{CqeError, Error, InvalidArgument, Result};
use crate::qp::{Qp, Ticket};
use crate::sq;
use crate::warp::Lanes;
use crate::wqe::{Ctrl, Wqe};
use gdaki_shared::handle::QpHandle;
use gdaki_shared::prm::wqe::{fm_ce_se, wqebbs};

/// One QP's send side, owned by the lanes of one warp for the lifetime `'a`.
pub struct WarpQp<'a> {
    h: *mut QpHandle,
    timeout_ns: u64,
    _owned: PhantomData<&'a mut QpHandle>,
}

impl<'a> WarpQp<'a> {
    /// Takes the QP described by `h` for the calling warp; bounded waits give up after `timeout_ns`
    /// nanoseconds. Every lane that will post makes its own `WarpQp` of the same handle.
    ///
    /// # Safety
    /// `h` must be a handle built by the host for a live, connected QP (as [`Qp::new`] requires), used for
    /// `'a` by the lanes of one warp only, through `WarpQp`s, and each call made by the same lanes together:
    /// lanes of the warp that call at different points of the program would drive the QP's counters at once.
    pub unsafe fn new(h: *mut QpHandle, timeout_ns: u64) -> Self {
        Self { h, timeout_ns, _owned: PhantomData }
    }

    /// The leader's view of the QP.
    ///
    /// # Safety
    /// Only the leader lane may call it, and only while no other lane reads the handle's counters.
    unsafe fn leader_qp(&mut self) -> Qp<'_> {
        // SAFETY: the contract of `new` gives a live handle owned by this warp; the caller is its one writer.
        unsafe { Qp::new(&mut *self.h, self.timeout_ns) }
    }

    /// Posts `w` from every lane that calls this together, one WQE each in lane order, and rings one doorbell
    /// for all of them (an 8-byte doorbell with the last WQE's ctrl words; never BlueFlame, which carries a
    /// single WQE). The last WQE asks for a CQE when any lane passed `signaled` (or the Exclusive QP's quarter
    /// ring rule says so); its ticket, returned to those lanes, completes once every WQE of the batch has.
    /// Other lanes get their own WQE's index.
    ///
    /// # Errors
    /// For every lane: [`InvalidArgument::Length`] when the lanes' WQEs differ in size or the batch needs
    /// more than half the ring (it could wait for room forever); otherwise what [`Qp::post`] returns to the
    /// leader (a timeout, an unexpected CQE, a bad handle). Nothing is posted on an error.
    pub fn post<const N: usize>(&mut self, signaled: bool, w: Wqe<N>) -> Result<Ticket> {
        let lanes = Lanes::active_with(self.h as u64);
        let lead = lanes.lane == lanes.leader();
        let nbb = wqebbs(w.ds() as u32);
        // SAFETY: fields the host set and nobody writes while the QP is owned (contract of `new`).
        let (sq_buf, wqe_cnt, qpn) = unsafe { ((*self.h).sq_buf, (*self.h).wqe_cnt, (*self.h).qpn) };
        let total = nbb * lanes.count();
        let same = lanes.all(nbb as u64 == lanes.shfl(nbb as u64, lanes.leader()));
        if !same || total > wqe_cnt / 2 {
            return Err(Error::InvalidArgument(InvalidArgument::Length));
        }
        let any_signaled = lanes.any(signaled);
        // The leader's `Qp` lives across the whole post: the handle's counters are read once before the
        // reservation and written back once after the doorbell, not once per step.
        // SAFETY: only the leader makes it; the other lanes read only the handle's fixed fields meanwhile.
        let mut qp = if lead { Some(unsafe { self.leader_qp() }) } else { None };
        let reserved = match &mut qp {
            Some(q) => q.reserve_batch(total, any_signaled),
            None => Ok((0, false)),
        };
        let (first, sig) = reserved.unwrap_or((0, false));
        lanes.share_result(reserved.map(|_| ()))?;
        let base = lanes.shfl(first, lanes.leader());
        let sig = lanes.shfl(sig as u64, lanes.leader()) != 0;
        let idx = base + (lanes.rank() * nbb) as u64;
        let last = base + ((lanes.count() - 1) * nbb) as u64;
        let flags = if sig && idx == last { fm_ce_se::CQ_UPDATE } else { 0 };
        let segs = w.encode(Ctrl { idx: idx as u16, qpn, fm_ce_se: flags });
        // SAFETY: a valid ring (contract of `new`); the leader reserved WQEBBs `base..base + total` for the
        // batch, and `idx..idx + nbb` is this lane's share.
        unsafe { sq::write_segs(sq_buf, wqe_cnt, idx, &segs, w.ds()) };
        let bits = lanes.shfl(segs[0].0[0], lanes.last());
        // Every lane's WQE is stored before the leader's release and doorbell (bar.warp.sync orders the
        // members' accesses; the leader's release fence then covers them).
        lanes.sync();
        if let Some(mut q) = qp {
            q.commit(last, total, sig, bits);
            q.ring_db();
        }
        Ok(Ticket(if signaled && sig { last } else { idx }))
    }

    /// Waits until every WQE posted so far has completed ([`Qp::flush`], by the leader), for every lane that
    /// calls it together.
    ///
    /// # Errors
    /// For every lane: the leader's [`Qp::flush`] result (the QP's first error CQE, sticky; a timeout).
    pub fn flush(&mut self) -> Result<()> {
        let lanes = Lanes::active_with(self.h as u64);
        let r = if lanes.lane == lanes.leader() {
            // SAFETY: this is the leader; the other lanes do not touch the handle during the call.
            unsafe { self.leader_qp() }.flush()
        } else {
            Ok(())
        };
        lanes.share_result(r)
    }

    /// Waits until the WQE behind `t` has completed ([`Qp::wait`], by the leader; every lane that calls this
    /// together must pass the same ticket, e.g. the one [`WarpQp::post`] returned to signaled lanes).
    ///
    /// # Errors
    /// For every lane: the leader's [`Qp::wait`] result.
    pub fn wait(&mut self, t: Ticket) -> Result<()> {
        let lanes = Lanes::active_with(self.h as u64);
        let r = if lanes.lane == lanes.leader() {
            // SAFETY: as in `flush`.
            unsafe { self.leader_qp() }.wait(t)
        } else {
            Ok(())
        };
        lanes.share_result(r)
    }

    /// Rings anything unrung and looks at the CQ once without waiting (the leader), so that an error CQE
    /// becomes visible to [`WarpQp::error`].
    ///
    /// # Errors
    /// For every lane: an unexpected CQE.
    pub fn progress(&mut self) -> Result<()> {
        let lanes = Lanes::active_with(self.h as u64);
        let r = if lanes.lane == lanes.leader() {
            // SAFETY: as in `flush`.
            unsafe { self.leader_qp() }.progress()
        } else {
            Ok(())
        };
        lanes.share_result(r)
    }

    /// The first error CQE of this QP's WQEs, if one completed in error.
    pub fn error(&self) -> Option<CqeError> {
        // SAFETY: the sticky error words, written by the leader only while it polls, which the lanes that
        // call this do not do at the same time (contract of `new`).
        let (idx, e) = unsafe { ((*self.h).sq.err_idx, (*self.h).sq.err) };
        (idx != 0).then(|| CqeError::unpack(e))
    }
}
