//! Faults of one WQE that the NIC refuses (keys, bounds, rights, alignment, a malformed ctrl segment) or must
//! execute as a no-op (a zero-byte RDMA WRITE), posted by device code between two good WRITEs.
//!
//! Every case runs the same script on a [`Rig`]: a good 64-byte WRITE (must complete and place its bytes),
//! the WQE under test (its completion is the observed outcome), then a good 64-byte WRITE that must be
//! flushed (0x05) and place nothing when the WQE under test failed, or complete when it did not. Then every
//! byte of every buffer on both sides, guards included, is compared with its fill pattern.

use std::ops::Range;
use std::time::{Duration, Instant};

use gdaki_device::qp::{Qp as DevQp, Ticket};
use gdaki_device::wqe::{self, Ctrl, Raddr, Sge};
use gdaki_device::Result as DevResult;
use gdaki_shared::handle::{MrHandle, RemoteMr};
use gdaki_shared::prm::opcode::{self, syndrome};
use gdaki_shared::prm::wqe::{AtomicSeg, CtrlSeg, DataSeg, InlineSeg, RaddrSeg, Seg};
use gdaki_shared::Be32;

use gdaki::nic::emu::Access;

use super::guard::Guarded;
use super::rig::{dev_qp, next_cqe, outcome, setup, step, Path, Rig};
use super::{Check, Observed, Outcome};

/// The WQE under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Bad {
    /// RDMA WRITE whose data segment names no MR (lkey of an unused key index).
    Lkey,
    /// RDMA WRITE whose raddr segment names no MR at the peer.
    Rkey,
    /// RDMA WRITE of 64 bytes starting 32 bytes before the end of the peer's MR.
    PastEnd,
    /// RDMA WRITE to a peer MR registered without `REMOTE_WRITE`.
    NoRemoteWrite,
    /// RDMA READ from a peer MR registered without `REMOTE_READ`.
    NoRemoteRead,
    /// ATOMIC_FA on a peer MR registered without `REMOTE_ATOMIC`.
    NoRemoteAtomic,
    /// ATOMIC_FA on a 4-byte aligned (not 8-byte aligned) peer address.
    UnalignedAtomic,
    /// RDMA WRITE of zero bytes as an empty inline segment (ds 3).
    ZeroInline,
    /// RDMA WRITE of zero bytes as rdma-core's mlx5 provider posts it: ctrl + raddr, no data segment (ds 2;
    /// the provider skips zero-length SGEs, since a data segment's byte_count of 0 means 2 GiB).
    ZeroNoData,
    /// RDMA WRITE whose ctrl segment carries another QP's number.
    WrongQpn,
    /// ATOMIC_FA whose ctrl segment says ds 3 (an atomic is ctrl + raddr + atomic + data: ds 4).
    WrongDs,
}

impl Bad {
    /// Rights of the peer's target MR.
    fn victim_access(self) -> Access {
        let w = Access::LOCAL_WRITE;
        match self {
            Bad::NoRemoteWrite => w | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
            Bad::NoRemoteRead => w | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC,
            Bad::NoRemoteAtomic => w | Access::REMOTE_WRITE | Access::REMOTE_READ,
            _ => Access::ALL,
        }
    }
}

/// Bytes of each buffer.
const LEN: usize = 4096;
/// Bytes of each good WRITE.
const PUT: usize = 64;
/// Middle offset of the good WRITE before the WQE under test, and of the one after it.
const BEFORE: usize = 0;
const AFTER: usize = 128;
const BEFORE_RANGE: Range<usize> = BEFORE..BEFORE + PUT;
const AFTER_RANGE: Range<usize> = AFTER..AFTER + PUT;
/// Bound of every device-side wait: an error CQE must arrive well before it.
const TIMEOUT: Duration = Duration::from_secs(2);
/// Retry timeout of the wire: longer than any wait here, so that a 0x15 could only come from a lost peer.
const RETRY: Duration = Duration::from_secs(5);

/// A key no MR of these NICs has: the key index moved far past every registered one.
fn unused_key(key: u32) -> Be32 {
    Be32::new(key ^ 0x00ff_0000)
}

fn raddr(mr: &RemoteMr, off: usize) -> Raddr {
    Raddr { addr: mr.addr + off as u64, rkey: mr.rkey }
}

fn sge(mr: &MrHandle, off: usize, len: usize) -> Sge {
    sge_with_key(mr, off, len, mr.lkey)
}

/// The catalogue's lengths are constants in 1 ..= 2^31 − 1.
fn sge_with_key(mr: &MrHandle, off: usize, len: usize, lkey: Be32) -> Sge {
    Sge::new(mr.addr + off as u64, len as u32, lkey).expect("a catalogue SGE length")
}

/// What the WQE under test targets.
struct Targets {
    src: MrHandle,
    res: MrHandle,
    victim: RemoteMr,
}

/// Posts the WQE under test (signaled, not rung). Cases the builders refuse to express (a misaligned
/// atomic, a malformed ctrl segment) go through `post_raw`, the way to hand the NIC such a WQE.
fn post_bad(qp: &mut DevQp<'_>, bad: Bad, t: &Targets) -> DevResult<Ticket> {
    let v = t.victim;
    let write = |r: Raddr, l: Sge| wqe::rdma_write(r, l);
    match bad {
        Bad::Lkey => {
            let l = sge_with_key(&t.src, 0, PUT, unused_key(t.src.lkey.get()));
            qp.post(true, write(raddr(&v, 0), l))
        }
        Bad::Rkey => {
            let r = Raddr { rkey: unused_key(v.rkey.get()), ..raddr(&v, 0) };
            qp.post(true, write(r, sge(&t.src, 0, PUT)))
        }
        Bad::PastEnd => qp.post(true, write(raddr(&v, LEN - PUT / 2), sge(&t.src, 0, PUT))),
        Bad::NoRemoteWrite => qp.post(true, write(raddr(&v, 0), sge(&t.src, 0, PUT))),
        Bad::NoRemoteRead => qp.post(true, wqe::rdma_read(raddr(&v, 0), sge(&t.res, 0, PUT))),
        Bad::NoRemoteAtomic => qp.post(true, wqe::atomic_fetch_add(raddr(&v, 0), sge(&t.res, 0, 8), 1)?),
        Bad::UnalignedAtomic => {
            let (r, l) = (raddr_seg(&v, 4), data_seg(&sge(&t.res, 0, 8)));
            // SAFETY: a misaligned fetch-add, on purpose: the NIC under test must refuse it.
            unsafe {
                qp.post_raw(true, 4, |c| [ctrl(c, opcode::ATOMIC_FA, c.qpn, 4), r, AtomicSeg::fetch_add(1).into(), l])
            }
        }
        Bad::ZeroInline => {
            // SAFETY: an inline header of 0 bytes, on purpose: the NIC under test must treat it as no data.
            unsafe {
                qp.post_raw(true, 3, |c| [ctrl(c, opcode::RDMA_WRITE, c.qpn, 3), raddr_seg(&v, 0), inline_header(0)])
            }
        }
        Bad::ZeroNoData => {
            // SAFETY: a WRITE without a data segment (ds 2), on purpose: the NIC under test must no-op it.
            unsafe { qp.post_raw(true, 2, |c| [ctrl(c, opcode::RDMA_WRITE, c.qpn, 2), raddr_seg(&v, 0)]) }
        }
        Bad::WrongQpn => {
            let l = data_seg(&sge(&t.src, 0, PUT));
            // Another QP's number (flip bit 0: a QPN this QP does not have).
            // SAFETY: malformed on purpose: the NIC under test must refuse it.
            unsafe { qp.post_raw(true, 3, |c| [ctrl(c, opcode::RDMA_WRITE, c.qpn ^ 1, 3), raddr_seg(&v, 0), l]) }
        }
        Bad::WrongDs => {
            // SAFETY: an atomic of ds 3, on purpose: the NIC under test must refuse it.
            unsafe {
                qp.post_raw(true, 3, |c| {
                    [ctrl(c, opcode::ATOMIC_FA, c.qpn, 3), raddr_seg(&v, 0), AtomicSeg::fetch_add(1).into()]
                })
            }
        }
    }
}

/// A ctrl segment for `c` with the given opcode, QPN and ds (what the builders would not produce).
fn ctrl(c: Ctrl, opc: u8, qpn: u32, ds: u8) -> Seg {
    CtrlSeg::new(c.idx, opc, 0, qpn, c.fm_ce_se, ds, 0, Be32::ZERO).into()
}

fn data_seg(s: &Sge) -> Seg {
    DataSeg::new(s.len(), s.lkey(), s.addr()).into()
}

fn raddr_seg(mr: &RemoteMr, off: usize) -> Seg {
    RaddrSeg::new(mr.addr + off as u64, mr.rkey).into()
}

/// An inline data segment header for `len` bytes, padded to 16 bytes with zeros.
fn inline_header(len: u32) -> Seg {
    let mut b = [0u8; 16];
    b[..4].copy_from_slice(bytemuck::bytes_of(&InlineSeg::new(len)));
    Seg(bytemuck::cast(b))
}

/// Runs the script (see the module docs) for `bad` over `path`.
pub(crate) fn run(path: Path, bad: Bad) -> Result<Observed, String> {
    let rig = setup(Rig::new(path, 64, 64, RETRY))?;
    let (src, res, dst, victim) =
        (Guarded::new(LEN, 1), Guarded::new(64, 2), Guarded::new(LEN, 3), Guarded::new(LEN, 4));
    let src_mr = setup(src.register(&rig.nic_a, &rig.pd_a, Access::NONE))?;
    let res_mr = setup(res.register(&rig.nic_a, &rig.pd_a, Access::LOCAL_WRITE))?;
    let dst_mr = setup(dst.register(&rig.nic_b, &rig.pd_b, Access::ALL))?;
    let victim_mr = setup(victim.register(&rig.nic_b, &rig.pd_b, bad.victim_access()))?;
    let t = Targets { src: src_mr.handle(), res: res_mr.handle(), victim: victim_mr.remote() };
    let mut h = rig.a.handle();
    // SAFETY: `h` is the handle of `rig.a`, whose queues (host memory) outlive `qp`; only this thread uses it.
    let mut qp = unsafe { dev_qp(&mut h, TIMEOUT) };
    let mut checks = Vec::new();

    // 1. A good WRITE: proves the connection and the keys.
    step("the WRITE before", qp.put(&dst_mr.remote(), BEFORE as u64, &t.src, BEFORE as u64, PUT as u64))?;
    step("its flush", qp.flush())?;

    // 2. The WQE under test: its completion is the outcome.
    let start = Instant::now();
    let ticket = step("posting the WQE under test", post_bad(&mut qp, bad, &t))?;
    qp.ring_db();
    let r = qp.wait(ticket);
    let waited = start.elapsed();
    let observed = outcome(&r);
    if let Err(gdaki_device::Error::Cqe(e)) = r {
        checks.push(Check::new(
            format!("error CQE names the WQE (wqe_counter {}, saw {})", ticket.0 as u16, e.wqe_counter),
            e.wqe_counter == ticket.0 as u16,
        ));
    }

    // 3. A good WRITE after it: flushed (0x05) after a failure, completed otherwise.
    let after = step(
        "posting the WRITE after",
        qp.post(true, wqe::rdma_write(raddr(&dst_mr.remote(), AFTER), sge(&t.src, AFTER, PUT))),
    )?;
    qp.ring_db();
    let next = next_cqe(&mut qp, TIMEOUT);
    let failed = !matches!(observed, Outcome::Completed);
    let (what, ok) = match (&next, failed) {
        (Some(Err(gdaki_device::Error::Cqe(e))), true) => (
            format!("the next WQE is flushed (syndrome {:#04x}, wqe_counter {})", e.syndrome, e.wqe_counter),
            e.syndrome == syndrome::WR_FLUSH_ERR && e.wqe_counter == after.0 as u16,
        ),
        (Some(Ok(c)), false) => {
            (format!("the next WQE completes (wqe_counter {})", c.wqe_counter), c.wqe_counter == after.0 as u16)
        }
        (other, _) => (format!("the next WQE: unexpected {other:?}"), false),
    };
    checks.push(Check::new(what, ok));

    // 4. Memory: the good WRITEs placed their bytes; nothing else changed anywhere.
    let mut allowed = vec![BEFORE_RANGE];
    if !failed {
        allowed.push(AFTER_RANGE);
    }
    for r in &allowed {
        checks.push(Check::new(
            format!("peer bytes {r:?} hold the good WRITE's payload"),
            dst.bytes(r.clone()) == src.pattern_range(r.clone()),
        ));
    }
    let outside = src.changed_outside(&[])
        + res.changed_outside(&[])
        + dst.changed_outside(&allowed)
        + victim.changed_outside(&[]);
    let qp_state = rig.a.state();
    Ok(Observed { outcome: observed, qp_state, outside_changed: outside, waited, bound: TIMEOUT, checks })
}
