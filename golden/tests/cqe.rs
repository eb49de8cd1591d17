//! CQE accessors against rdma-core's `mlx5dv_get_cqe_*`, and `is_sw_owned` against an independent
//! formulation of the lap-parity rule.

use gdaki_golden::{c_const, cqe_format, cqe_opcode, cqe_owner, cqe_se};
use gdaki_shared::prm::cqe::{is_sw_owned, Cqe64, OP_OWN_INVALID};
use proptest::prelude::*;

/// Random cases per property, set explicitly.
const CASES: u32 = 4096;

/// 64 random bytes.
fn cqe_bytes() -> impl Strategy<Value = [u8; 64]> {
    prop::collection::vec(any::<u8>(), 64).prop_map(|v| <[u8; 64]>::try_from(v).unwrap())
}

/// A CQE that is all `fill` but for `op_own`.
fn cqe_with_op_own(fill: u8, op_own: u8) -> [u8; 64] {
    let mut b = [fill; 64];
    b[63] = op_own;
    b
}

fn mlx5_cqe_invalid() -> u8 {
    c_const("MLX5_CQE_INVALID").expect("mlx5dv.h defines MLX5_CQE_INVALID") as u8
}

/// Entry `index` of a ring of `2^log2_ncqe` CQEs holds a completion for software, said without division: the
/// header's opcode is not `MLX5_CQE_INVALID`, and the header's owner bit equals bit `log2_ncqe` of the 64-bit
/// consumer count (the count's lap parity; rdma-core tests `n & ncqe`).
fn sw_owned_reference(cqe: &[u8; 64], index: u64, log2_ncqe: u32) -> bool {
    let lap_odd = (index >> log2_ncqe) & 1 == 1;
    cqe_opcode(cqe) != mlx5_cqe_invalid() && (cqe_owner(cqe) == 1) == lap_odd
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    /// `Cqe64::owner()` / `opcode()` on arbitrary bytes == `mlx5dv_get_cqe_owner` / `mlx5dv_get_cqe_opcode`.
    #[test]
    fn accessors_match_mlx5dv(bytes in cqe_bytes()) {
        let cqe: Cqe64 = bytemuck::pod_read_unaligned(&bytes);
        prop_assert_eq!(cqe.owner(), cqe_owner(&bytes));
        prop_assert_eq!(cqe.opcode(), cqe_opcode(&bytes));
    }

    /// `is_sw_owned(op_own, index, ncqe)` == the reference, for every op_own, ring sizes 1 .. 2^31, and
    /// consumer counts both anywhere in u64 and right at lap boundaries (k·ncqe - 1, k·ncqe, k·ncqe + 1).
    #[test]
    fn is_sw_owned_matches_lap_parity(
        bytes in cqe_bytes(),
        log2_ncqe in 0u32..32,
        index: u64,
        at_boundary: bool,
    ) {
        let ncqe = 1u32 << log2_ncqe;
        // Half the cases move `index` onto a lap boundary of this ring: lap_start - 1, lap_start or lap_start + 1.
        let index = if at_boundary {
            let lap_start = index & !(u64::from(ncqe) - 1);
            lap_start.wrapping_add(index % 3).wrapping_sub(1)
        } else {
            index
        };
        let op_own = bytes[63];
        prop_assert_eq!(
            is_sw_owned(op_own, index, ncqe),
            sw_owned_reference(&bytes, index, log2_ncqe),
            "op_own {:#04x}, index {}, ncqe {}", op_own, index, ncqe
        );
    }
}

/// Every op_own value (the accessors only look at byte 63), with the rest of the CQE all zeros and all ones.
#[test]
fn accessors_exhaustive_op_own() {
    for fill in [0x00, 0xff] {
        for op_own in 0..=u8::MAX {
            let bytes = cqe_with_op_own(fill, op_own);
            let cqe: Cqe64 = bytemuck::pod_read_unaligned(&bytes);
            assert_eq!(cqe.owner(), cqe_owner(&bytes), "owner of op_own {op_own:#04x}");
            assert_eq!(cqe.opcode(), cqe_opcode(&bytes), "opcode of op_own {op_own:#04x}");
            // owner (bit 0), se (bit 1), format (bits 3:2), opcode (bits 7:4) partition op_own: the two fields
            // we read are exactly the header's, and no bit of op_own is left to other fields.
            let rebuilt = cqe_owner(&bytes) | cqe_se(&bytes) << 1 | cqe_format(&bytes) << 2 | cqe_opcode(&bytes) << 4;
            assert_eq!(rebuilt, op_own);
        }
    }
}

/// A freshly filled ring entry (`Cqe64::INVALID`, op_own = `OP_OWN_INVALID`) is, per the header, opcode
/// `MLX5_CQE_INVALID` with owner 1, and is never software-owned on any lap; zeroed memory, by contrast, would
/// look valid on lap 0 (which is why rings are pre-filled).
#[test]
fn invalid_entry_is_never_sw_owned() {
    let bytes: [u8; 64] = bytemuck::cast(Cqe64::INVALID);
    assert_eq!(bytes[63], OP_OWN_INVALID);
    assert_eq!(cqe_opcode(&bytes), mlx5_cqe_invalid());
    assert_eq!(cqe_owner(&bytes), 1);
    for log2_ncqe in 0..32 {
        let ncqe = 1u32 << log2_ncqe;
        for index in [0, 1, u64::from(ncqe) - 1, u64::from(ncqe), u64::from(ncqe) + 1, 3 << log2_ncqe, u64::MAX] {
            assert!(!is_sw_owned(OP_OWN_INVALID, index, ncqe), "index {index}, ncqe {ncqe}");
            assert!(!sw_owned_reference(&bytes, index, log2_ncqe));
        }
    }
    let zeroed = [0u8; 64];
    assert!(is_sw_owned(0, 0, 64) && sw_owned_reference(&zeroed, 0, 6));
}
