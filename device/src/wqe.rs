//! WQE builders: each returns the WQE as a value of 16-byte segments, built in registers; [`crate::sq`]
//! stores it. Layouts follow the PRM's send WQE formats (rdma-core `mlx5dv.h` segment structs).

use gdaki_shared::prm::opcode;
use gdaki_shared::prm::wqe::{ds, AtomicSeg, CtrlSeg, DataSeg, InlineSeg, RaddrSeg, Seg, SEG};
use gdaki_shared::Be32;

/// A WQE of `DS` segments (16 bytes each), segment 0 being the ctrl segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Wqe<const DS: usize> {
    /// The segments in ring order.
    pub segs: [Seg; DS],
}

/// A local buffer: one scatter/gather entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sge {
    /// Address (device-visible), bytes.
    pub addr: u64,
    /// Length, bytes (1 ..= 2^31 − 1; the PRM reads 0 as 2^31, which gdaki never posts).
    pub len: u32,
    /// Local key of its MR, big-endian.
    pub lkey: Be32,
}

/// A remote address: where an RDMA WRITE/READ or atomic lands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Raddr {
    /// Address in the peer's address space, bytes.
    pub addr: u64,
    /// Remote key of the peer's MR, big-endian.
    pub rkey: Be32,
}

/// Where a WQE goes and how it completes: the fields every ctrl segment carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ctrl {
    /// WQE index: the SQ producer index in WQEBBs, low 16 bits.
    pub idx: u16,
    /// QP number (24 bits).
    pub qpn: u32,
    /// `fm_ce_se` flags (`gdaki_shared::prm::wqe::fm_ce_se`).
    pub fm_ce_se: u8,
}

impl Ctrl {
    #[inline(always)]
    fn seg(self, opcode: u8, ds: u8, imm: Be32) -> Seg {
        CtrlSeg::new(self.idx, opcode, 0, self.qpn, self.fm_ce_se, ds, 0, imm).into()
    }
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
pub fn nop(c: Ctrl) -> Wqe<1> {
    Wqe { segs: [c.seg(opcode::NOP, ds::NOP, Be32::ZERO)] }
}

/// RDMA WRITE of `local` to `remote` (`MLX5_OPCODE_RDMA_WRITE`, ds 3: ctrl + raddr + data).
#[inline(always)]
pub fn rdma_write(c: Ctrl, remote: Raddr, local: Sge) -> Wqe<3> {
    Wqe { segs: [c.seg(opcode::RDMA_WRITE, ds::RDMA, Be32::ZERO), raddr(remote), data(local)] }
}

/// RDMA WRITE with immediate (`MLX5_OPCODE_RDMA_WRITE_IMM`, ds 3); `imm` in wire order, delivered in the
/// responder's CQE.
#[inline(always)]
pub fn rdma_write_imm(c: Ctrl, remote: Raddr, local: Sge, imm: Be32) -> Wqe<3> {
    Wqe { segs: [c.seg(opcode::RDMA_WRITE_IMM, ds::RDMA, imm), raddr(remote), data(local)] }
}

/// RDMA READ of `remote` into `local` (`MLX5_OPCODE_RDMA_READ`, ds 3).
#[inline(always)]
pub fn rdma_read(c: Ctrl, remote: Raddr, local: Sge) -> Wqe<3> {
    Wqe { segs: [c.seg(opcode::RDMA_READ, ds::RDMA, Be32::ZERO), raddr(remote), data(local)] }
}

/// 8-byte fetch-and-add of `add` at `remote` (`MLX5_OPCODE_ATOMIC_FA`, ds 4: ctrl + raddr + atomic + data);
/// the old value lands in `result` (8 bytes, 8-byte aligned).
#[inline(always)]
pub fn atomic_fetch_add(c: Ctrl, remote: Raddr, result: Sge, add: u64) -> Wqe<4> {
    Wqe {
        segs: [
            c.seg(opcode::ATOMIC_FA, ds::ATOMIC, Be32::ZERO),
            raddr(remote),
            AtomicSeg::fetch_add(add).into(),
            data(result),
        ],
    }
}

/// 8-byte compare-and-swap at `remote` (`MLX5_OPCODE_ATOMIC_CS`, ds 4): if it equals `compare` it becomes
/// `swap`; the old value lands in `result`.
#[inline(always)]
pub fn atomic_compare_swap(c: Ctrl, remote: Raddr, result: Sge, compare: u64, swap: u64) -> Wqe<4> {
    Wqe {
        segs: [
            c.seg(opcode::ATOMIC_CS, ds::ATOMIC, Be32::ZERO),
            raddr(remote),
            AtomicSeg::compare_swap(compare, swap).into(),
            data(result),
        ],
    }
}

/// Largest WQE gdaki builds, in segments: 4 WQEBBs.
pub const MAX_DS: usize = 16;

/// Longest inline RDMA WRITE payload, bytes: what fits in [`MAX_DS`] segments after ctrl, raddr and the
/// 4-byte inline header (16 × 16 − 32 − 4).
pub const MAX_INLINE: usize = MAX_DS * SEG - 2 * SEG - 4;

/// RDMA WRITE with the payload inline in the WQE (`MLX5_OPCODE_RDMA_WRITE` + `mlx5_wqe_inl_data_seg`): no lkey,
/// the NIC reads the bytes from the WQE itself. `data.len()` must be 1 ..= [`MAX_INLINE`] (the caller checks).
/// Returns the segments (the first `ds` are meaningful) and `ds` = 2 + ceil((4 + len) / 16).
#[inline(always)]
pub fn rdma_write_inline(c: Ctrl, remote: Raddr, data: &[u8]) -> (Wqe<MAX_DS>, u8) {
    let len = data.len().min(MAX_INLINE);
    let ds = ds::rdma_write_inline(len as u32) as u8;
    let mut segs = [Seg::default(); MAX_DS];
    segs[0] = c.seg(opcode::RDMA_WRITE, ds, Be32::ZERO);
    segs[1] = raddr(remote);
    let body: &mut [u8] = bytemuck::cast_slice_mut(&mut segs[2..]);
    body[..4].copy_from_slice(&InlineSeg::new(len as u32).byte_count.to_bytes());
    body[4..4 + len].copy_from_slice(&data[..len]);
    (Wqe { segs }, ds)
}
