//! The 64-byte completion queue entry (`mlx5_cqe64`) and its error view (`mlx5_err_cqe`).

use crate::be::{Be16, Be32, Be64};
use crate::prm::opcode;
use bytemuck::{Pod, Zeroable};

/// Bytes in one CQE (gdaki creates 64-byte CQEs only).
pub const CQE_SIZE: usize = 64;

/// `op_own` of an entry that holds no completion: opcode `MLX5_CQE_INVALID` (15) and owner bit 1. New CQ rings
/// are filled with it, so that zeroed memory (owner 0 = valid in lap 0) never looks like a CQE.
pub const OP_OWN_INVALID: u8 = (opcode::cqe::INVALID << 4) | 1;

/// A successful completion (`mlx5_cqe64`). 64 bytes, 8-byte aligned; `op_own` (byte 63) is written last.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
#[repr(C, align(8))]
pub struct Cqe64 {
    /// Bytes 0..32: RX offload fields, unused by RDMA requester completions.
    pub rsvd0: [u8; 32],
    /// `srqn_uidx`.
    pub srqn_uidx: Be32,
    /// Immediate data (RESP_WR_IMM), in wire order.
    pub imm_inval_pkey: Be32,
    /// `app`.
    pub app: u8,
    /// `app_op`.
    pub app_op: u8,
    /// `app_info`.
    pub app_info: Be16,
    /// Bytes transferred (RDMA READ / atomic: bytes returned; responder: bytes placed).
    pub byte_cnt: Be32,
    /// Completion timestamp: free-running device clock ticks on hardware; nanoseconds since the NIC was
    /// opened on the emulated NIC.
    pub timestamp: Be64,
    /// Bits 31:24: send WQE opcode (requester), bits 23:0: QPN.
    pub sop_drop_qpn: Be32,
    /// WQE index (WQEBBs, 16 bits) of the completed WQE.
    pub wqe_counter: Be16,
    /// Signature.
    pub signature: u8,
    /// Bits 7:4: CQE opcode (`MLX5_CQE_*`); bit 0: owner bit.
    pub op_own: u8,
}

/// An error completion (`mlx5_err_cqe`): the same 64 bytes seen through the error layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
#[repr(C, align(8))]
pub struct ErrCqe {
    /// Reserved.
    pub rsvd0: [u8; 32],
    /// `srqn`.
    pub srqn: Be32,
    /// Reserved.
    pub rsvd1: [u8; 16],
    /// Hardware error syndrome.
    pub hw_err_synd: u8,
    /// Hardware syndrome type.
    pub hw_synd_type: u8,
    /// Vendor error syndrome.
    pub vendor_err_synd: u8,
    /// Syndrome (`MLX5_CQE_SYNDROME_*`, see [`opcode::syndrome`]).
    pub syndrome: u8,
    /// Bits 31:24: opcode of the failed send WQE; bits 23:0: QPN.
    pub s_wqe_opcode_qpn: Be32,
    /// WQE index (WQEBBs, 16 bits) of the failed WQE.
    pub wqe_counter: Be16,
    /// Signature.
    pub signature: u8,
    /// Bits 7:4: `MLX5_CQE_REQ_ERR` or `MLX5_CQE_RESP_ERR`; bit 0: owner bit.
    pub op_own: u8,
}

impl Cqe64 {
    /// An entry with no completion: all zero but `op_own` = [`OP_OWN_INVALID`].
    pub const INVALID: Self = {
        let mut c = zeroed();
        c.op_own = OP_OWN_INVALID;
        c
    };

    /// Owner bit, as `mlx5dv_get_cqe_owner`.
    #[inline(always)]
    pub const fn owner(&self) -> u8 {
        self.op_own & 1
    }

    /// CQE opcode (`MLX5_CQE_*`), as `mlx5dv_get_cqe_opcode`.
    #[inline(always)]
    pub const fn opcode(&self) -> u8 {
        self.op_own >> 4
    }

    /// QPN, bits 23:0 of `sop_drop_qpn`.
    #[inline(always)]
    pub const fn qpn(&self) -> u32 {
        self.sop_drop_qpn.get() & 0x00ff_ffff
    }

    /// The error view of these bytes.
    #[inline(always)]
    pub fn as_err(&self) -> &ErrCqe {
        bytemuck::cast_ref(self)
    }
}

impl ErrCqe {
    /// The same bytes through the success layout.
    #[inline(always)]
    pub fn as_cqe(&self) -> &Cqe64 {
        bytemuck::cast_ref(self)
    }
}

const fn zeroed() -> Cqe64 {
    Cqe64 {
        rsvd0: [0; 32],
        srqn_uidx: Be32::ZERO,
        imm_inval_pkey: Be32::ZERO,
        app: 0,
        app_op: 0,
        app_info: Be16::ZERO,
        byte_cnt: Be32::ZERO,
        timestamp: Be64::ZERO,
        sop_drop_qpn: Be32::ZERO,
        wqe_counter: Be16::ZERO,
        signature: 0,
        op_own: 0,
    }
}

/// Whether `op_own`, read from CQ entry number `index` (64-bit consumer count) of a ring of `ncqe` entries
/// (a power of two), holds a completion software may consume: opcode not `INVALID` and owner bit equal to
/// the lap parity `(index / ncqe) & 1` (rdma-core `get_sw_cqe`), computed as `index & ncqe` because `ncqe` is a
/// power of two (no division on the device). Read the rest of the CQE only after this holds and a read
/// barrier.
#[inline(always)]
pub const fn is_sw_owned(op_own: u8, index: u64, ncqe: u32) -> bool {
    (op_own >> 4) != opcode::cqe::INVALID && ((op_own & 1) != 0) == (index & ncqe as u64 != 0)
}

const _: () = {
    use core::mem::{offset_of, size_of};
    assert!(size_of::<Cqe64>() == CQE_SIZE && size_of::<ErrCqe>() == CQE_SIZE);
    assert!(offset_of!(Cqe64, srqn_uidx) == 32);
    assert!(offset_of!(Cqe64, imm_inval_pkey) == 36);
    assert!(offset_of!(Cqe64, byte_cnt) == 44);
    assert!(offset_of!(Cqe64, timestamp) == 48);
    assert!(offset_of!(Cqe64, sop_drop_qpn) == 56);
    assert!(offset_of!(Cqe64, wqe_counter) == 60);
    assert!(offset_of!(Cqe64, signature) == 62);
    assert!(offset_of!(Cqe64, op_own) == 63);
    assert!(offset_of!(ErrCqe, srqn) == 32);
    assert!(offset_of!(ErrCqe, hw_err_synd) == 52);
    assert!(offset_of!(ErrCqe, vendor_err_synd) == 54);
    assert!(offset_of!(ErrCqe, syndrome) == 55);
    assert!(offset_of!(ErrCqe, s_wqe_opcode_qpn) == 56);
    assert!(offset_of!(ErrCqe, wqe_counter) == 60);
    assert!(offset_of!(ErrCqe, op_own) == 63);
};
