//! Executes one parsed WQE against registered memory: resolves every lkey and rkey first (so a failing WQE
//! places nothing), then moves the bytes through the [`DataPath`].
//!
//! Checks follow the order in which an RC exchange meets them. RDMA WRITE: local keys, PD and bounds (0x04,
//! the requester reads its buffers first), then the remote key, PD, bounds and rights (0x13). Atomics: the
//! result buffer's key, PD, bounds and `LOCAL_WRITE` (0x04, checked by the requester before the request
//! leaves, so that a failing atomic never changes the remote word), then remote alignment (0x12), remote
//! key, PD, bounds and rights (0x13). RDMA READ: remote key, PD, bounds and rights (0x13), then the local
//! keys, PD, bounds and `LOCAL_WRITE` (0x04, when the response arrives). A zero-length RDMA WRITE or READ checks no
//! key, as the IB spec says, so a WRITE_IMM with no data may carry rkey 0. Remote checks start with the
//! responder QP's own rights (`qpc.rre`/`rwe`/`rae`, from RST2INIT).

use crate::mem::MemLoc;

use super::access::DataPath;
use super::fault::{vendor, Fault};
use super::mr::{Access, MrTable};
use super::wqe::{Op, Payload, Remote, Sge};
use gdaki_shared::Be32;

/// What a successful WQE produced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Outcome {
    /// The requester CQE's `byte_cnt`: bytes returned by an RDMA READ or atomic; 0 otherwise.
    pub byte_cnt: u32,
    /// For RDMA WRITE with immediate: the immediate (wire order) and the bytes placed, for the responder's
    /// RESP_WR_IMM CQE.
    pub resp_imm: Option<(Be32, u32)>,
}

/// What a responder QP checks a remote access against: its PD (rkeys) and the remote rights its RST2INIT
/// enabled (`qpc.rre`, `rwe`, `rae` as [`Access`] bits).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Responder {
    /// The responder QP's PD.
    pub pdn: u32,
    /// `REMOTE_READ`, `REMOTE_WRITE` and `REMOTE_ATOMIC` as the QP allows them.
    pub rights: Access,
}

/// The PDs a WQE is checked against.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Pds {
    /// The requester QP's PD (lkeys).
    pub local: u32,
    /// The responder QP (rkeys, remote rights).
    pub remote: Responder,
}

/// Resolves local SGE `s` of a QP in PD `pdn` (0x04 when the lkey, PD, bounds or `LOCAL_WRITE` fail).
pub(crate) fn local(mrs: &MrTable, pdn: u32, s: Sge, write: bool) -> Result<MemLoc, Fault> {
    let e = mrs.get(s.lkey).ok_or(Fault::local_prot(vendor::BAD_LKEY))?;
    if e.pdn != pdn {
        return Err(Fault::local_prot(vendor::LKEY_PD));
    }
    let loc = e.range(s.addr, s.len).ok_or(Fault::local_prot(vendor::LOCAL_BOUNDS))?;
    if write && !e.access.contains(Access::LOCAL_WRITE) {
        return Err(Fault::local_prot(vendor::LOCAL_ACCESS));
    }
    Ok(loc)
}

/// Resolves `len` bytes at `r` for responder QP `resp` needing `right` (0x13 when the QP does not enable the
/// right, or the rkey, PD, bounds or the MR's right fail).
pub(crate) fn remote(mrs: &MrTable, resp: Responder, r: Remote, len: u64, right: Access) -> Result<MemLoc, Fault> {
    if !resp.rights.contains(right) {
        return Err(Fault::remote_access(vendor::QP_ACCESS));
    }
    let e = mrs.get(r.rkey).ok_or(Fault::remote_access(vendor::BAD_RKEY))?;
    if e.pdn != resp.pdn {
        return Err(Fault::remote_access(vendor::RKEY_PD));
    }
    let loc = e.range(r.addr, len).ok_or(Fault::remote_access(vendor::REMOTE_BOUNDS))?;
    if !e.access.contains(right) {
        return Err(Fault::remote_access(vendor::REMOTE_ACCESS));
    }
    Ok(loc)
}

/// The target word of an atomic at `r` (8 bytes) for responder QP `resp`, checked as [`remote`] checks it,
/// where the atomic runs ([`MrEntry::atomic_view`](super::mr::MrEntry::atomic_view)).
pub(crate) fn remote_atomic(mrs: &MrTable, resp: Responder, r: Remote) -> Result<MemLoc, Fault> {
    let loc = remote(mrs, resp, r, 8, Access::REMOTE_ATOMIC)?;
    Ok(mrs.get(r.rkey).map_or(loc, |e| e.atomic_view(loc)))
}

/// `base` moved `off` bytes on.
pub(crate) fn at(base: MemLoc, off: u64) -> MemLoc {
    MemLoc { kind: base.kind, addr: base.addr + off }
}

/// Executes `op`. `scratch` is reused between calls to hold resolved SGEs without allocating.
///
/// The caller holds the MR table's read lock for the whole call, so no MR named here is deregistered
/// before its bytes are moved (deregistration takes the write lock, then waits for GPU copies).
pub(crate) fn execute(
    op: &Op<'_>,
    pds: Pds,
    mrs: &MrTable,
    data: &mut DataPath,
    scratch: &mut Vec<(MemLoc, u64)>,
) -> Result<Outcome, Fault> {
    scratch.clear();
    match *op {
        Op::Nop => Ok(Outcome { byte_cnt: 0, resp_imm: None }),
        Op::Write { remote: r, payload, imm } => {
            let total = match payload {
                Payload::Inline(d) => d.len() as u64,
                Payload::Sges(l) => l.total(),
            };
            // total ≤ 2^31 (checked by the parser), so it fits the CQE's 32-bit byte_cnt.
            let resp_imm = imm.map(|i| (i, total as u32));
            if total == 0 {
                return Ok(Outcome { byte_cnt: 0, resp_imm });
            }
            // The requester reads its local buffers before the request leaves, so lkeys are checked first.
            if let Payload::Sges(l) = payload {
                for s in l.iter() {
                    scratch.push((local(mrs, pds.local, s, false)?, s.len));
                }
            }
            let dst = remote(mrs, pds.remote, r, total, Access::REMOTE_WRITE)?;
            match payload {
                Payload::Inline(d) => {
                    // SAFETY: `dst` is a registered range of `d.len()` bytes; the caller holds the MR lock.
                    unsafe { data.write_bytes(dst, d) }?;
                }
                Payload::Sges(_) => {
                    let mut off = 0;
                    for &(src, len) in scratch.iter() {
                        // SAFETY: both ranges were resolved inside registered MRs; their sum is `total`, the
                        // length `dst` was checked for; the caller holds the MR lock.
                        unsafe { data.copy(at(dst, off), src, len) }?;
                        off += len;
                    }
                }
            }
            Ok(Outcome { byte_cnt: 0, resp_imm })
        }
        Op::Read { remote: r, sges } => {
            // The responder checks the rkey (not for a zero-length READ, as for a WRITE); local buffers are
            // checked when the response arrives.
            let total = sges.total();
            if total == 0 {
                return Ok(Outcome { byte_cnt: 0, resp_imm: None });
            }
            let src = remote(mrs, pds.remote, r, total, Access::REMOTE_READ)?;
            for s in sges.iter() {
                scratch.push((local(mrs, pds.local, s, true)?, s.len));
            }
            // A READ is ordered after the QP's earlier writes.
            data.fence()?;
            let mut off = 0;
            for &(dst, len) in scratch.iter() {
                // SAFETY: as for writes, in the other direction.
                unsafe { data.copy(dst, at(src, off), len) }?;
                off += len;
            }
            Ok(Outcome { byte_cnt: total as u32, resp_imm: None })
        }
        Op::Atomic { remote: r, op, sge } => {
            // The requester checks where the old value lands before the request leaves (as the wire's does),
            // so a failing atomic never changes the remote word.
            let result = local(mrs, pds.local, sge, true)?;
            if !r.addr.is_multiple_of(8) {
                return Err(Fault::remote_inval(vendor::ATOMIC_ALIGN));
            }
            let target = remote_atomic(mrs, pds.remote, r)?;
            // The old value goes where the atomic's GPU operation can write it, when it runs on the GPU.
            let result = mrs.get(sge.lkey).map_or(result, |e| e.atomic_view(result));
            // The old value lands in host order (the NIC runs in host-endianness atomic mode).
            // SAFETY: `target` is a registered, 8-aligned 8-byte range and `result` a registered 8-byte range
            // with LOCAL_WRITE; the caller holds the MR lock.
            unsafe { data.atomic_into(target, op, result) }?;
            Ok(Outcome { byte_cnt: 8, resp_imm: None })
        }
    }
}
