//! One WQE of every kind the builders make, from one parameter block: the GPU test compares what the PTX
//! kernel `gdaki_wqe_samples` builds with what the host build of the same builders gives.

use crate::wqe::{self, Ctrl, Raddr, Sge, MAX_DS};
use bytemuck::{Pod, Zeroable};
use gdaki_shared::prm::wqe::Seg;
use gdaki_shared::Be32;

/// Inputs of [`build`]. 80 bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct SampleParams {
    /// Local address of the SGEs.
    pub laddr: u64,
    /// Remote address.
    pub raddr: u64,
    /// Fetch-add addend / compare-swap swap value.
    pub swap_add: u64,
    /// Compare-swap compare value.
    pub compare: u64,
    /// Inline payload bytes (the first `inline_len` are used).
    pub inline: [u8; 24],
    /// WQE index of the first sample (each sample uses the next index).
    pub idx: u32,
    /// QPN.
    pub qpn: u32,
    /// lkey, host order.
    pub lkey: u32,
    /// rkey, host order.
    pub rkey: u32,
    /// SGE length, bytes.
    pub len: u32,
    /// Immediate (wire order bits).
    pub imm: u32,
}

/// Number of samples [`build`] writes.
pub const SAMPLES: usize = 7;

/// Writes [`SAMPLES`] WQEs, each padded to [`MAX_DS`] segments: NOP, RDMA WRITE, WRITE_IMM, READ, fetch-add,
/// compare-swap, inline WRITE of 24 bytes; sample `i` has WQE index `idx + i` and alternates `fm_ce_se`
/// between 0 and CQ_UPDATE.
pub fn build(p: &SampleParams, out: &mut [[Seg; MAX_DS]; SAMPLES]) {
    let c = |i: u32| Ctrl { idx: (p.idx + i) as u16, qpn: p.qpn, fm_ce_se: if i % 2 == 1 { 0x08 } else { 0 } };
    let local = Sge { addr: p.laddr, len: p.len, lkey: Be32::new(p.lkey) };
    let remote = Raddr { addr: p.raddr, rkey: Be32::new(p.rkey) };
    let pad = |s: &[Seg]| {
        let mut o = [Seg::default(); MAX_DS];
        o[..s.len()].copy_from_slice(s);
        o
    };
    out[0] = pad(&wqe::nop(c(0)).segs);
    out[1] = pad(&wqe::rdma_write(c(1), remote, local).segs);
    out[2] = pad(&wqe::rdma_write_imm(c(2), remote, local, Be32::from_bits(p.imm)).segs);
    out[3] = pad(&wqe::rdma_read(c(3), remote, local).segs);
    out[4] = pad(&wqe::atomic_fetch_add(c(4), remote, local, p.swap_add).segs);
    out[5] = pad(&wqe::atomic_compare_swap(c(5), remote, local, p.compare, p.swap_add).segs);
    out[6] = wqe::rdma_write_inline(c(6), remote, &p.inline).0.segs;
}
