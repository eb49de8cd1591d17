//! gdaki-shared's segment builders against rdma-core's own inline helpers, byte for byte, on random inputs.

use gdaki_golden::{set_ctrl_seg, set_data_seg};
use gdaki_shared::prm::wqe::{CtrlSeg, DataSeg};
use gdaki_shared::Be32;
use proptest::prelude::*;

/// Random cases per property. Set explicitly so that the count does not depend on PROPTEST_CASES defaults.
const CASES: u32 = 4096;

/// `mlx5dv_set_ctrl_seg` on a zeroed segment (the helper leaves `dci_stream_channel_id` as it was; our builder
/// zeroes it, so the two agree from zeroed memory).
#[allow(clippy::too_many_arguments)]
fn c_ctrl(pi: u16, opcode: u8, opmod: u8, qpn: u32, fm_ce_se: u8, ds: u8, signature: u8, imm: u32) -> [u8; 16] {
    set_ctrl_seg([0; 16], pi, opcode, opmod, qpn, fm_ce_se, ds, signature, imm)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    /// `CtrlSeg::new` == `mlx5dv_set_ctrl_seg`, over the full range of every argument. `qpn` covers all 32
    /// bits: both sides take a 32-bit QPN and shift it left by 8, dropping bits 31:24, so QPNs >= 2^24 must
    /// agree too. `imm` is wire-order bits, passed verbatim to both (the C helper stores it unconverted).
    #[test]
    fn ctrl_seg_matches_mlx5dv(
        pi: u16, opcode: u8, opmod: u8, qpn: u32, fm_ce_se: u8, ds: u8, signature: u8, imm: u32,
    ) {
        let ours = CtrlSeg::new(pi, opcode, opmod, qpn, fm_ce_se, ds, signature, Be32::from_bits(imm));
        let c = c_ctrl(pi, opcode, opmod, qpn, fm_ce_se, ds, signature, imm);
        prop_assert_eq!(bytemuck::bytes_of(&ours), &c[..]);
    }

    /// Same, with QPNs drawn only from the valid 24-bit range (so a builder that masks or range-checks the QPN
    /// is still held to the helper's bytes where the PRM defines them), and our accessors read the C bytes back.
    #[test]
    fn ctrl_seg_valid_qpn_and_accessors(
        pi: u16, opcode: u8, opmod: u8, qpn in 0u32..1 << 24, fm_ce_se: u8, ds in 0u8..64, signature: u8, imm: u32,
    ) {
        let ours = CtrlSeg::new(pi, opcode, opmod, qpn, fm_ce_se, ds, signature, Be32::from_bits(imm));
        let c = c_ctrl(pi, opcode, opmod, qpn, fm_ce_se, ds, signature, imm);
        prop_assert_eq!(bytemuck::bytes_of(&ours), &c[..]);
        let seg: CtrlSeg = bytemuck::pod_read_unaligned(&c);
        prop_assert_eq!(
            (seg.wqe_index(), seg.opcode(), seg.opmod(), seg.qpn(), seg.ds(), seg.fm_ce_se, seg.signature),
            (pi, opcode, opmod, qpn, ds, fm_ce_se, signature)
        );
        prop_assert_eq!(seg.imm.to_bits(), imm);
        // The doorbell is the first 8 bytes of the ctrl segment, as the C helper laid them out.
        prop_assert_eq!(seg.doorbell_bits().to_ne_bytes(), <[u8; 8]>::try_from(&c[..8]).unwrap());
    }

    /// The producer-index doorbell (NVSHMEM IBGDA's form: no last WQE named) is the first 8 bytes of what
    /// `mlx5dv_set_ctrl_seg` writes for WQE index `pi`, opcode 0 and `ds` 0, and the emulated NIC's producer
    /// index rule (`wqe_index + ceil(ds / 4)`) reads `pi` back from it.
    #[test]
    fn producer_doorbell_matches_mlx5dv(pi: u16, qpn in 0u32..1 << 24) {
        let c = c_ctrl(pi, 0, 0, qpn, 0, 0, 0, 0);
        let bits = CtrlSeg::producer_doorbell(pi, qpn);
        prop_assert_eq!(bits.to_ne_bytes(), <[u8; 8]>::try_from(&c[..8]).unwrap());
        let mut seg = [0u8; 16];
        seg[..8].copy_from_slice(&bits.to_ne_bytes());
        let seg: CtrlSeg = bytemuck::pod_read_unaligned(&seg);
        prop_assert_eq!((seg.wqe_index(), seg.ds(), seg.qpn()), (pi, 0, qpn));
    }

    /// The helper writes every byte but `dci_stream_channel_id` (9..11): from any prior contents, the bytes it
    /// writes equal ours, and bytes 9..11 keep their old value (ours writes zero there; so WQE writers that
    /// build a whole `CtrlSeg` need not zero the ring first).
    #[test]
    fn ctrl_seg_from_dirty_memory(
        init: [u8; 16], pi: u16, opcode: u8, opmod: u8, qpn: u32, fm_ce_se: u8, ds: u8, signature: u8, imm: u32,
    ) {
        let ours = CtrlSeg::new(pi, opcode, opmod, qpn, fm_ce_se, ds, signature, Be32::from_bits(imm));
        let ours = bytemuck::bytes_of(&ours);
        let c = set_ctrl_seg(init, pi, opcode, opmod, qpn, fm_ce_se, ds, signature, imm);
        prop_assert_eq!(&c[..9], &ours[..9]);
        prop_assert_eq!(&c[9..11], &init[9..11]);
        prop_assert_eq!(&c[11..], &ours[11..]);
    }

    /// `DataSeg::new(length, Be32::new(lkey), addr)` == `mlx5dv_set_data_seg(seg, length, lkey, addr)` (the C
    /// helper takes `lkey` in host order and converts it; ours takes it already big-endian).
    #[test]
    fn data_seg_matches_mlx5dv(init: [u8; 16], length: u32, lkey: u32, addr: usize) {
        let ours = DataSeg::new(length, Be32::new(lkey), addr as u64);
        let c = set_data_seg(init, length, lkey, addr);
        prop_assert_eq!(bytemuck::bytes_of(&ours), &c[..]);
    }
}

/// Edge values the random draws might miss: all-zero and all-ones arguments, and QPNs at the 24-bit boundary.
#[test]
fn ctrl_seg_edges() {
    for qpn in [0, 1, 0x00ff_ffff, 0x0100_0000, 0x0123_4567, 0xff00_0001, u32::MAX] {
        for (pi, opcode, opmod, fm_ce_se, ds, sig, imm) in
            [(0, 0, 0, 0, 0, 0, 0), (u16::MAX, u8::MAX, u8::MAX, u8::MAX, u8::MAX, u8::MAX, u32::MAX)]
        {
            let ours = CtrlSeg::new(pi, opcode, opmod, qpn, fm_ce_se, ds, sig, Be32::from_bits(imm));
            let c = c_ctrl(pi, opcode, opmod, qpn, fm_ce_se, ds, sig, imm);
            assert_eq!(bytemuck::bytes_of(&ours), &c[..], "qpn {qpn:#x}, pi {pi:#x}");
        }
    }
}
