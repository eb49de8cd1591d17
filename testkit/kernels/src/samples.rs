//! One WQE of every kind the builders make, from one parameter block: the GPU test compares what the PTX
//! kernel `gdaki_wqe_samples` builds with what the host build of the same builders gives.

use bytemuck::{Pod, Zeroable};
use gdaki_device::wqe::{self, Ctrl, Raddr, Sge, MAX_DS};
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
/// compare-swap (both with an 8-byte result buffer at `laddr`), inline WRITE of 24 bytes (only its `ds` segments); sample `i` has WQE index `idx + i` and alternates `fm_ce_se`
/// between 0 and CQ_UPDATE.
pub fn build(p: &SampleParams, out: &mut [[Seg; MAX_DS]; SAMPLES]) {
    let c = |i: u32| Ctrl { idx: (p.idx + i) as u16, qpn: p.qpn, fm_ce_se: if i % 2 == 1 { 0x08 } else { 0 } };
    let remote = Raddr { addr: p.raddr, rkey: Be32::new(p.rkey) };
    let pad = |s: &[Seg]| {
        let mut o = [Seg::default(); MAX_DS];
        o[..s.len()].copy_from_slice(s);
        o
    };
    // A bad length or alignment in `p` leaves that sample all zero: the host's comparison then fails.
    let Ok(local) = Sge::new(p.laddr, p.len, Be32::new(p.lkey)) else { return };
    let atomic = Sge::new(p.laddr, 8, Be32::new(p.lkey));
    out[0] = pad(&wqe::nop().encode(c(0)));
    out[1] = pad(&wqe::rdma_write(remote, local).encode(c(1)));
    out[2] = pad(&wqe::rdma_write_imm(remote, local, Be32::from_bits(p.imm)).encode(c(2)));
    out[3] = pad(&wqe::rdma_read(remote, local).encode(c(3)));
    if let Ok(w) = atomic.and_then(|r| wqe::atomic_fetch_add(remote, r, p.swap_add)) {
        out[4] = pad(&w.encode(c(4)));
    }
    if let Ok(w) = atomic.and_then(|r| wqe::atomic_compare_swap(remote, r, p.compare, p.swap_add)) {
        out[5] = pad(&w.encode(c(5)));
    }
    if let Ok(w) = wqe::rdma_write_inline(remote, &p.inline) {
        let ds = w.ds() as usize;
        out[6] = pad(&w.encode(c(6))[..ds]);
    }
}
