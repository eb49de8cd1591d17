//! WQE builders: each returns a [`Wqe`], a value of 16-byte segments built in registers whose size (`ds`) is
//! part of the value; a poster ([`crate::qp::Qp::post`], [`crate::shared_qp::SharedQp::post`]) fills in the
//! ctrl segment's WQE index, QPN and completion flags, reserves exactly `ceil(ds / 4)` WQEBBs and stores the
//! first `ds` segments. Layouts follow the PRM's send WQE formats (rdma-core `mlx5dv.h` segment structs).
//!
//! A builder cannot produce a WQE the NIC reads differently from what the caller meant: its inputs are checked
//! types ([`Sge::new`] refuses lengths the data segment cannot carry) or it returns
//! [`Error::InvalidArgument`], and the ds in the ctrl segment is the ds the poster reserves for. The one way to
//! post other bytes is the `unsafe` [`crate::qp::Qp::post_raw`], for testing a NIC's checks.

use crate::error::{Error, InvalidArgument, Result};
use gdaki_shared::prm::opcode;
use gdaki_shared::prm::wqe::{ds, AtomicSeg, CtrlSeg, DataSeg, InlineSeg, RaddrSeg, Seg, SEG};
use gdaki_shared::Be32;

/// Longest payload of one data segment, bytes: 2^31 − 1. Bit 31 of `byte_count` is `MLX5_INLINE_SEG` (the
/// NIC would read the segment's own lkey and address as inline data), and a `byte_count` of 0 means 2^31
/// (PRM "Data Segment"; mlx5's `max_msg_sz` is 2^31).
pub const MAX_SGE_LEN: u32 = (1 << 31) - 1;

/// A WQE of at most `N` segments, ready to post: segment 0 is its ctrl segment with opcode, `ds` and
/// immediate set and the WQE index, QPN and `fm_ce_se` left zero for the poster ([`Wqe::encode`]). Only this
/// module's builders make one, so `ds` (1 ..= `N`) always matches the segments the opcode needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Wqe<const N: usize> {
    segs: [Seg; N],
    ds: u8,
}

/// A local buffer: one scatter/gather entry of 1 ..= [`MAX_SGE_LEN`] bytes. Built by [`Sge::new`] (or after the
/// same test), so its length always means what it says in a data segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sge {
    addr: u64,
    len: u32,
    lkey: Be32,
}

impl Sge {
    /// `len` bytes at device-visible address `addr` of the MR whose local key is `lkey` (big-endian, as the
    /// handle carries it).
    ///
    /// # Errors
    /// [`InvalidArgument::Length`] for 0 bytes (a data segment's 0 means 2^31) or more than [`MAX_SGE_LEN`]
    /// (bit 31 would mark the segment inline).
    #[inline(always)]
    pub const fn new(addr: u64, len: u32, lkey: Be32) -> Result<Sge> {
        if len == 0 || len > MAX_SGE_LEN {
            return Err(Error::InvalidArgument(InvalidArgument::Length));
        }
        Ok(Sge { addr, len, lkey })
    }

    /// `len` bytes at `addr` with key `lkey`, for a caller that has already tested `1 <= len <= MAX_SGE_LEN`
    /// together with its other checks (one test for all of them on a fast path).
    #[inline(always)]
    pub(crate) const fn tested(addr: u64, len: u32, lkey: Be32) -> Sge {
        debug_assert!(len != 0 && len <= MAX_SGE_LEN);
        Sge { addr, len, lkey }
    }

    /// The address, bytes.
    #[inline(always)]
    pub const fn addr(&self) -> u64 {
        self.addr
    }

    /// The length, bytes (1 ..= [`MAX_SGE_LEN`]; never empty, so there is no `is_empty`).
    #[inline(always)]
    #[allow(clippy::len_without_is_empty)]
    pub const fn len(&self) -> u32 {
        self.len
    }

    /// The local key, big-endian.
    #[inline(always)]
    pub const fn lkey(&self) -> Be32 {
        self.lkey
    }
}

/// A remote address: where an RDMA WRITE/READ or atomic lands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Raddr {
    /// Address in the peer's address space, bytes.
    pub addr: u64,
    /// Remote key of the peer's MR, big-endian.
    pub rkey: Be32,
}

/// The ctrl-segment fields a poster supplies: what [`Wqe::encode`] and [`crate::qp::Qp::post_raw`] take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ctrl {
    /// WQE index: the SQ producer index in WQEBBs, low 16 bits.
    pub idx: u16,
    /// QP number (24 bits).
    pub qpn: u32,
    /// `fm_ce_se` flags (`gdaki_shared::prm::wqe::fm_ce_se`).
    pub fm_ce_se: u8,
}

impl<const N: usize> Wqe<N> {
    /// WQE size in 16-byte segments (1 ..= `N`): what the ctrl segment says and what a poster reserves for
    /// (`ceil(ds / 4)` WQEBBs).
    #[inline(always)]
    pub const fn ds(&self) -> u8 {
        self.ds
    }

    /// The same WQE in a builder of `M >= N` segments (the extra ones zero and outside `ds`), so that WQEs of
    /// different builders can go through one call that takes a single `Wqe<M>` (a team batch whose members post
    /// a WRITE or an atomic). `M < N` does not compile.
    #[inline(always)]
    pub fn widen<const M: usize>(self) -> Wqe<M> {
        const { assert!(M >= N, "a WQE only widens") };
        let mut segs = [Seg::default(); M];
        segs[..N].copy_from_slice(&self.segs);
        Wqe { segs, ds: self.ds }
    }

    /// The opcode (`MLX5_OPCODE_*`).
    #[inline(always)]
    pub fn opcode(&self) -> u8 {
        CtrlSeg::from(self.segs[0]).opcode()
    }

    /// The segments with the ctrl fields of `c` filled in, exactly as a poster stores them (the first
    /// [`Wqe::ds`] are the WQE; the rest are zero). The same bytes as `mlx5dv_set_ctrl_seg` + the segment
    /// setters of `mlx5dv.h` (the golden tests check it).
    #[inline(always)]
    pub fn encode(&self, c: Ctrl) -> [Seg; N] {
        let mut segs = self.segs;
        segs[0] = seal(segs[0], c);
        segs
    }
}

/// Fills the WQE index, QPN and `fm_ce_se` into a ctrl segment whose fields for them are zero.
#[inline(always)]
fn seal(ctrl: Seg, c: Ctrl) -> Seg {
    let mut s = CtrlSeg::from(ctrl);
    s.opmod_idx_opcode = Be32::new(s.opmod_idx_opcode.get() | (c.idx as u32) << 8);
    s.qpn_ds = Be32::new(s.qpn_ds.get() | (c.qpn << 8));
    s.fm_ce_se = c.fm_ce_se;
    s.into()
}

#[inline(always)]
fn ctrl(opcode: u8, ds: u8, imm: Be32) -> Seg {
    CtrlSeg::new(0, opcode, 0, 0, 0, ds, 0, imm).into()
}

#[inline(always)]
fn data(s: Sge) -> Seg {
    DataSeg::new(s.len, s.lkey, s.addr).into()
}

#[inline(always)]
fn raddr(r: Raddr) -> Seg {
    RaddrSeg::new(r.addr, r.rkey).into()
}

/// NOP (`MLX5_OPCODE_NOP`, ds 1): completes without touching memory; used to request a CQE.
#[inline(always)]
pub fn nop() -> Wqe<1> {
    Wqe { segs: [ctrl(opcode::NOP, ds::NOP, Be32::ZERO)], ds: ds::NOP }
}

/// RDMA WRITE of `local` to `remote` (`MLX5_OPCODE_RDMA_WRITE`, ds 3: ctrl + raddr + data).
#[inline(always)]
pub fn rdma_write(remote: Raddr, local: Sge) -> Wqe<3> {
    Wqe { segs: [ctrl(opcode::RDMA_WRITE, ds::RDMA, Be32::ZERO), raddr(remote), data(local)], ds: ds::RDMA }
}

/// RDMA WRITE with immediate (`MLX5_OPCODE_RDMA_WRITE_IMM`, ds 3); `imm` in wire order, delivered in the
/// responder's CQE.
#[inline(always)]
pub fn rdma_write_imm(remote: Raddr, local: Sge, imm: Be32) -> Wqe<3> {
    Wqe { segs: [ctrl(opcode::RDMA_WRITE_IMM, ds::RDMA, imm), raddr(remote), data(local)], ds: ds::RDMA }
}

/// RDMA READ of `remote` into `local` (`MLX5_OPCODE_RDMA_READ`, ds 3).
#[inline(always)]
pub fn rdma_read(remote: Raddr, local: Sge) -> Wqe<3> {
    Wqe { segs: [ctrl(opcode::RDMA_READ, ds::RDMA, Be32::ZERO), raddr(remote), data(local)], ds: ds::RDMA }
}

/// The checks every atomic passes: an 8-byte result buffer, both addresses 8-byte aligned (PRM: atomics
/// operate on naturally aligned 8-byte words; the NIC answers a misaligned one with an error CQE).
#[inline(always)]
fn atomic(op: u8, remote: Raddr, result: Sge, seg: AtomicSeg) -> Result<Wqe<4>> {
    if result.len != 8 {
        return Err(Error::InvalidArgument(InvalidArgument::Length));
    }
    if !(remote.addr | result.addr).is_multiple_of(8) {
        return Err(Error::InvalidArgument(InvalidArgument::AtomicAlignment));
    }
    Ok(atomic_tested(op, remote, result, seg))
}

/// The atomic WQE of operands that passed [`atomic`]'s checks.
#[inline(always)]
fn atomic_tested(op: u8, remote: Raddr, result: Sge, seg: AtomicSeg) -> Wqe<4> {
    debug_assert!(result.len == 8 && (remote.addr | result.addr).is_multiple_of(8));
    Wqe { segs: [ctrl(op, ds::ATOMIC, Be32::ZERO), raddr(remote), seg.into(), data(result)], ds: ds::ATOMIC }
}

/// [`atomic_fetch_add`] of operands that passed its checks already, as those of
/// [`crate::onesided::atomic_target`] have: built without testing them a second time (a fast path's one
/// argument check per call).
#[inline(always)]
pub(crate) fn atomic_fetch_add_tested(remote: Raddr, result: Sge, add: u64) -> Wqe<4> {
    atomic_tested(opcode::ATOMIC_FA, remote, result, AtomicSeg::fetch_add(add))
}

/// 8-byte fetch-and-add of `add` at `remote` (`MLX5_OPCODE_ATOMIC_FA`, ds 4: ctrl + raddr + atomic + data);
/// the old value lands in `result`.
///
/// # Errors
/// [`InvalidArgument::Length`] unless `result` is 8 bytes; [`InvalidArgument::AtomicAlignment`] unless
/// `remote` and `result` are 8-byte aligned.
#[inline(always)]
pub fn atomic_fetch_add(remote: Raddr, result: Sge, add: u64) -> Result<Wqe<4>> {
    atomic(opcode::ATOMIC_FA, remote, result, AtomicSeg::fetch_add(add))
}

/// 8-byte compare-and-swap at `remote` (`MLX5_OPCODE_ATOMIC_CS`, ds 4): if it equals `compare` it becomes
/// `swap`; the old value lands in `result`.
///
/// # Errors
/// As [`atomic_fetch_add`].
#[inline(always)]
pub fn atomic_compare_swap(remote: Raddr, result: Sge, compare: u64, swap: u64) -> Result<Wqe<4>> {
    atomic(opcode::ATOMIC_CS, remote, result, AtomicSeg::compare_swap(compare, swap))
}

/// Largest WQE gdaki builds, in segments: 4 WQEBBs.
pub const MAX_DS: usize = 16;

/// Longest inline RDMA WRITE payload, bytes: what fits in [`MAX_DS`] segments after ctrl, raddr and the
/// 4-byte inline header (16 × 16 − 32 − 4).
pub const MAX_INLINE: usize = MAX_DS * SEG - 2 * SEG - 4;

/// RDMA WRITE with the payload inline in the WQE (`MLX5_OPCODE_RDMA_WRITE` + `mlx5_wqe_inl_data_seg`): no
/// lkey, the NIC reads the bytes from the WQE itself. `ds` = 2 + ceil((4 + len) / 16), so a poster reserves
/// only the WQEBBs the payload needs.
///
/// # Errors
/// [`InvalidArgument::Length`] for an empty payload; [`InvalidArgument::InlineTooLong`] beyond
/// [`MAX_INLINE`] bytes.
#[inline(always)]
pub fn rdma_write_inline(remote: Raddr, bytes: &[u8]) -> Result<Wqe<MAX_DS>> {
    if bytes.is_empty() {
        return Err(Error::InvalidArgument(InvalidArgument::Length));
    }
    if bytes.len() > MAX_INLINE {
        return Err(Error::InvalidArgument(InvalidArgument::InlineTooLong));
    }
    let len = bytes.len();
    let n = ds::rdma_write_inline(len as u32) as u8;
    let mut segs = [Seg::default(); MAX_DS];
    segs[0] = ctrl(opcode::RDMA_WRITE, n, Be32::ZERO);
    segs[1] = raddr(remote);
    let body: &mut [u8] = bytemuck::cast_slice_mut(&mut segs[2..]);
    body[..4].copy_from_slice(&InlineSeg::new(len as u32).byte_count.to_bytes());
    body[4..4 + len].copy_from_slice(bytes);
    Ok(Wqe { segs, ds: n })
}
