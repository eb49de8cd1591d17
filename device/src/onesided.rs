//! One-sided operations on registered memory, named as MSCCL++'s PortChannel device API names them:
//! `put` (RDMA WRITE), `signal` (an 8-byte fetch-add of 1 on the peer's semaphore), `put_with_signal`
//! (both, one doorbell), `flush` (see [`Qp::flush`]) and `wait` ([`crate::wait::semaphore_ge`]); and as
//! NVSHMEM names the rest: `get` (RDMA READ), `fetch_add` and `compare_swap` (8-byte remote atomics), each
//! returning the ticket whose [`Qp::wait`] says the data or old value has landed.
//!
//! Ranges are checked against the handles before anything is posted, so a bad offset is an [`Error::Range`]
//! here rather than an error CQE that would move the QP to the error state.

use crate::error::{Error, InvalidArgument, RangeError, Result};
use crate::qp::{Qp, Ticket};
use crate::wqe::{self, Raddr, Sge};
use gdaki_shared::handle::{MrHandle, RemoteMr};

/// `len` bytes at `off` of local MR `mr` as an SGE (1 ..= [`wqe::MAX_SGE_LEN`] bytes, inside the MR).
///
/// # Errors
/// [`InvalidArgument::Length`] for 0 bytes or more than [`wqe::MAX_SGE_LEN`]; [`Error::Range`] for a range
/// outside the MR.
pub fn local(mr: &MrHandle, off: u64, len: u64) -> Result<Sge> {
    if len == 0 || len > wqe::MAX_SGE_LEN as u64 {
        return Err(Error::InvalidArgument(InvalidArgument::Length));
    }
    match (off.checked_add(len), mr.addr.checked_add(off)) {
        (Some(end), Some(addr)) if end <= mr.length => Sge::new(addr, len as u32, mr.lkey),
        _ => Err(RangeError::local(off, len, mr.length).into()),
    }
}

/// `len` bytes at `off` of the peer's MR `mr` as a raddr (inside the MR).
///
/// # Errors
/// [`Error::Range`] for a range outside the MR.
pub fn remote(mr: &RemoteMr, off: u64, len: u64) -> Result<Raddr> {
    match (off.checked_add(len), mr.addr.checked_add(off)) {
        (Some(end), Some(addr)) if end <= mr.length => Ok(Raddr { addr, rkey: mr.rkey }),
        _ => Err(RangeError::remote(off, len, mr.length).into()),
    }
}

/// The 8-byte remote word at `sem_off` of `sem` and the 8-byte local result word at `result_off` of `result`,
/// both 8-byte aligned.
///
/// # Errors
/// As [`remote`] and [`local`]; [`InvalidArgument::AtomicAlignment`] for a misaligned word.
pub fn atomic_target(sem: &RemoteMr, sem_off: u64, result: &MrHandle, result_off: u64) -> Result<(Raddr, Sge)> {
    let r = remote(sem, sem_off, 8)?;
    let l = local(result, result_off, 8)?;
    if r.addr % 8 != 0 || l.addr() % 8 != 0 {
        return Err(Error::InvalidArgument(InvalidArgument::AtomicAlignment));
    }
    Ok((r, l))
}

impl Qp<'_> {
    /// Posts an RDMA WRITE of `len` bytes from `src + src_off` to `dst + dst_off` and rings the doorbell.
    ///
    /// # Errors
    /// [`Error::Range`] for a range outside either MR, [`Error::InvalidArgument`] for a zero length; as
    /// [`Qp::post`] otherwise.
    pub fn put(&mut self, dst: &RemoteMr, dst_off: u64, src: &MrHandle, src_off: u64, len: u64) -> Result<()> {
        let (r, l) = (remote(dst, dst_off, len)?, local(src, src_off, len)?);
        let _ = self.post(false, wqe::rdma_write(r, l))?;
        self.ring_db();
        Ok(())
    }

    /// Adds 1 to the peer's 8-byte semaphore at `sem + sem_off` with an RDMA fetch-add whose old value lands
    /// in `result + result_off` (8 bytes, 8-byte aligned), and rings the doorbell. The NIC places it after
    /// every earlier write of this QP, so the peer that sees the new value sees those writes.
    ///
    /// # Errors
    /// [`Error::Range`] for a range outside either MR, [`Error::InvalidArgument`] for a misaligned address; as
    /// [`Qp::post`].
    pub fn signal(&mut self, sem: &RemoteMr, sem_off: u64, result: &MrHandle, result_off: u64) -> Result<Ticket> {
        let (r, l) = atomic_target(sem, sem_off, result, result_off)?;
        let t = self.post(true, wqe::atomic_fetch_add_tested(r, l, 1))?;
        self.ring_db();
        Ok(t)
    }

    /// Posts an RDMA READ of `len` bytes from `src + src_off` (the peer's) into `dst + dst_off` (local, with
    /// `LOCAL_WRITE`) and rings the doorbell (NVSHMEM's `get_nbi`). The bytes have landed once the returned
    /// ticket is waited for ([`Qp::wait`]), or after a [`Qp::flush`].
    ///
    /// # Errors
    /// [`Error::Range`] for a range outside either MR, [`Error::InvalidArgument`] for a zero length; as
    /// [`Qp::post`] otherwise.
    pub fn get(&mut self, dst: &MrHandle, dst_off: u64, src: &RemoteMr, src_off: u64, len: u64) -> Result<Ticket> {
        let (r, l) = (remote(src, src_off, len)?, local(dst, dst_off, len)?);
        let t = self.post(true, wqe::rdma_read(r, l))?;
        self.ring_db();
        Ok(t)
    }

    /// Adds `add` to the peer's 8-byte word at `target + target_off` with an RDMA fetch-add whose old value
    /// lands in `result + result_off` (8 bytes, both 8-byte aligned), and rings the doorbell (NVSHMEM's
    /// `atomic_fetch_add`, non-blocking: the old value is there once the returned ticket is waited for).
    ///
    /// # Errors
    /// [`Error::Range`] for a range outside either MR, [`Error::InvalidArgument`] for a misaligned address; as
    /// [`Qp::post`].
    pub fn fetch_add(
        &mut self,
        target: &RemoteMr,
        target_off: u64,
        add: u64,
        result: &MrHandle,
        result_off: u64,
    ) -> Result<Ticket> {
        let (r, l) = atomic_target(target, target_off, result, result_off)?;
        let t = self.post(true, wqe::atomic_fetch_add_tested(r, l, add))?;
        self.ring_db();
        Ok(t)
    }

    /// Replaces the peer's 8-byte word at `target + target_off` by `swap` if it equals `compare`, with an RDMA
    /// compare-and-swap whose old value lands in `result + result_off` (the swap happened when it equals
    /// `compare`), and rings the doorbell (NVSHMEM's `atomic_compare_swap`, non-blocking as [`Qp::fetch_add`]).
    ///
    /// # Errors
    /// As [`Qp::fetch_add`].
    pub fn compare_swap(
        &mut self,
        target: &RemoteMr,
        target_off: u64,
        compare: u64,
        swap: u64,
        result: &MrHandle,
        result_off: u64,
    ) -> Result<Ticket> {
        let (r, l) = atomic_target(target, target_off, result, result_off)?;
        let t = self.post(true, wqe::atomic_compare_swap(r, l, compare, swap)?)?;
        self.ring_db();
        Ok(t)
    }

    /// [`Qp::put`] then [`Qp::signal`] with one doorbell (MSCCL++ `putWithSignal`).
    ///
    /// # Errors
    /// As [`Qp::put`] and [`Qp::signal`]; nothing is posted if an argument is bad.
    #[allow(clippy::too_many_arguments)]
    pub fn put_with_signal(
        &mut self,
        dst: &RemoteMr,
        dst_off: u64,
        src: &MrHandle,
        src_off: u64,
        len: u64,
        sem: &RemoteMr,
        sem_off: u64,
        result: &MrHandle,
        result_off: u64,
    ) -> Result<Ticket> {
        let (r, l) = (remote(dst, dst_off, len)?, local(src, src_off, len)?);
        let (sr, sl) = atomic_target(sem, sem_off, result, result_off)?;
        let _ = self.post(false, wqe::rdma_write(r, l))?;
        let t = self.post(true, wqe::atomic_fetch_add_tested(sr, sl, 1))?;
        self.ring_db();
        Ok(t)
    }
}
