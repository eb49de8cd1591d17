//! Send WQE segments (`mlx5_wqe_*_seg` in `mlx5dv.h`) and the writers that fill them.
//!
//! A WQE is a list of 16-byte segments ("octowords"); its size in segments is `ds`. It occupies
//! `ceil(ds / 4)` consecutive 64-byte WQEBBs of the SQ ring and may wrap from the last slot to slot 0.

use crate::be::{Be32, Be64};
use bytemuck::{Pod, Zeroable};

/// Bytes in one WQE basic block (`MLX5_SEND_WQE_BB`).
pub const WQEBB: usize = 64;
/// Bytes in one segment: the unit of `ds` (`MLX5_SEND_WQE_DS` in rdma-core's mlx5 provider).
pub const SEG: usize = 16;
/// Segments per WQEBB.
pub const SEGS_PER_WQEBB: usize = WQEBB / SEG;
/// `MLX5_INLINE_SEG`: set in an inline segment's `byte_count` to mark the data as inline.
pub const INLINE_SEG: u32 = 0x8000_0000;

/// `fm_ce_se` bits of the ctrl segment (`MLX5_WQE_CTRL_*`).
pub mod fm_ce_se {
    /// `MLX5_WQE_CTRL_CQ_UPDATE` (completion mode 2): always write a CQE for this WQE.
    pub const CQ_UPDATE: u8 = 2 << 2;
    /// `MLX5_WQE_CTRL_SOLICITED`.
    pub const SOLICITED: u8 = 1 << 1;
    /// `MLX5_WQE_CTRL_INITIATOR_SMALL_FENCE` (fence mode 1).
    pub const INITIATOR_SMALL_FENCE: u8 = 1 << 5;
    /// Fence mode 3, strong ordering (rdma-core's mlx5 provider; not in `mlx5dv.h`).
    pub const STRONG_ORDERING: u8 = 3 << 5;
    /// `MLX5_WQE_CTRL_FENCE` (fence mode 4): wait for earlier RDMA READs/atomics of this QP.
    pub const FENCE: u8 = 4 << 5;
    /// Every bit a WQE may set: fence mode (7:5), completion mode (3:2), solicited (1).
    pub const VALID_MASK: u8 = 0xe0 | 0x0c | 0x02;
}

/// Control segment (`mlx5_wqe_ctrl_seg`), the first segment of every WQE. 16 bytes, 4-byte aligned (the C
/// struct is `packed, aligned(4)`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct CtrlSeg {
    /// `opmod << 24 | wqe_idx << 8 | opcode`; `wqe_idx` is the WQE's producer index in WQEBBs, low 16 bits.
    pub opmod_idx_opcode: Be32,
    /// `qpn << 8 | ds`: the QP number (24 bits) and the WQE size in 16-byte segments.
    pub qpn_ds: Be32,
    /// WQE signature (unused unless the QP enables signatures; zero).
    pub signature: u8,
    /// `dci_stream_channel_id` (DCI only; zero). Bytes, since the C field sits unaligned at offset 9.
    pub dci_stream_channel_id: [u8; 2],
    /// Fence mode (bits 7:5), completion mode (bits 3:2), solicited (bit 1): see [`fm_ce_se`].
    pub fm_ce_se: u8,
    /// Immediate data, already in wire order (as `ibv_send_wr.imm_data`).
    pub imm: Be32,
}

impl CtrlSeg {
    /// Builds a ctrl segment exactly as `mlx5dv_set_ctrl_seg(seg, pi, opcode, opmod, qpn, fm_ce_se, ds,
    /// signature, imm)` does, with `dci_stream_channel_id` zero.
    ///
    /// `pi`: WQE index (WQEBBs, wraps at 2^16). `qpn`: 24 bits (higher bits are dropped). `ds`: size in
    /// 16-byte segments.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)] // mirrors mlx5dv_set_ctrl_seg's parameter list
    pub const fn new(pi: u16, opcode: u8, opmod: u8, qpn: u32, fm_ce_se: u8, ds: u8, signature: u8, imm: Be32) -> Self {
        Self {
            opmod_idx_opcode: Be32::new(((opmod as u32) << 24) | ((pi as u32) << 8) | opcode as u32),
            qpn_ds: Be32::new((qpn << 8) | ds as u32),
            signature,
            dci_stream_channel_id: [0; 2],
            fm_ce_se,
            imm,
        }
    }

    /// Opcode (`MLX5_OPCODE_*`), bits 7:0 of `opmod_idx_opcode`.
    #[inline(always)]
    pub const fn opcode(&self) -> u8 {
        self.opmod_idx_opcode.get() as u8
    }

    /// WQE index (WQEBBs, 16 bits), bits 23:8 of `opmod_idx_opcode`.
    #[inline(always)]
    pub const fn wqe_index(&self) -> u16 {
        (self.opmod_idx_opcode.get() >> 8) as u16
    }

    /// Opcode modifier, bits 31:24 of `opmod_idx_opcode`.
    #[inline(always)]
    pub const fn opmod(&self) -> u8 {
        (self.opmod_idx_opcode.get() >> 24) as u8
    }

    /// QP number (24 bits).
    #[inline(always)]
    pub const fn qpn(&self) -> u32 {
        self.qpn_ds.get() >> 8
    }

    /// WQE size in 16-byte segments (bits 5:0 of `qpn_ds`; mlx5 allows up to 63).
    #[inline(always)]
    pub const fn ds(&self) -> u8 {
        (self.qpn_ds.get() & 0x3f) as u8
    }

    /// The first 8 bytes as stored in memory: the value of the 8-byte doorbell for this WQE
    /// (`opmod_idx_opcode` then `qpn_ds`, big-endian), read as a native `u64`.
    #[inline(always)]
    pub const fn doorbell_bits(&self) -> u64 {
        let lo = self.opmod_idx_opcode.to_bits() as u64;
        let hi = self.qpn_ds.to_bits() as u64;
        if cfg!(target_endian = "little") {
            lo | (hi << 32)
        } else {
            (lo << 32) | hi
        }
    }

    /// The 8-byte doorbell that announces every WQE below producer index `pi` (WQEBBs, low 16 bits) of QP
    /// `qpn`, without naming the last WQE: `wqe_index = pi`, opcode 0, `ds = 0`, as NVSHMEM IBGDA's
    /// `ibgda_ring_db` rings. The NIC's producer index is `wqe_index + ceil(ds / 4)` either way, so this value
    /// and the last WQE's [`CtrlSeg::doorbell_bits`] announce the same WQEs. gdaki's posters ring with this one:
    /// a shared QP's ringer knows only the index, and an Exclusive poster need not keep the last WQE's words.
    #[inline(always)]
    pub const fn producer_doorbell(pi: u16, qpn: u32) -> u64 {
        Self::new(pi, 0, 0, qpn, 0, 0, 0, Be32::ZERO).doorbell_bits()
    }
}

/// Remote address segment (`mlx5_wqe_raddr_seg`): target of an RDMA WRITE/READ or atomic. 16 bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct RaddrSeg {
    /// Remote virtual address, bytes.
    pub raddr: Be64,
    /// Remote key of the MR that holds `raddr`.
    pub rkey: Be32,
    /// Reserved, zero.
    pub reserved: u32,
}

impl RaddrSeg {
    /// Builds a remote address segment (reserved word zero), as rdma-core's `set_raddr_seg`.
    #[inline(always)]
    pub const fn new(raddr: u64, rkey: Be32) -> Self {
        Self { raddr: Be64::new(raddr), rkey, reserved: 0 }
    }
}

/// Data (scatter/gather) segment (`mlx5_wqe_data_seg`): one local buffer. 16 bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct DataSeg {
    /// Length in bytes (0 means 2^31 on hardware; gdaki never posts 0-length SGEs).
    pub byte_count: Be32,
    /// Local key of the MR that holds `addr`.
    pub lkey: Be32,
    /// Local virtual address, bytes.
    pub addr: Be64,
}

impl DataSeg {
    /// Builds a data segment exactly as `mlx5dv_set_data_seg(seg, length, lkey, address)` does.
    #[inline(always)]
    pub const fn new(length: u32, lkey: Be32, addr: u64) -> Self {
        Self { byte_count: Be32::new(length), lkey, addr: Be64::new(addr) }
    }
}

/// Inline data segment header (`mlx5_wqe_inl_data_seg`): `byte_count | MLX5_INLINE_SEG`, followed directly by
/// the data; header plus data are padded to a multiple of 16 bytes. 4 bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct InlineSeg {
    /// `len | INLINE_SEG`, `len` in bytes.
    pub byte_count: Be32,
}

impl InlineSeg {
    /// Header for `len` bytes of inline data.
    #[inline(always)]
    pub const fn new(len: u32) -> Self {
        Self { byte_count: Be32::new(len | INLINE_SEG) }
    }

    /// Segments (16 B each) taken by this header plus `len` bytes of data: `ceil((4 + len) / 16)`.
    #[inline(always)]
    pub const fn ds(len: u32) -> u32 {
        (4 + len).div_ceil(SEG as u32)
    }
}

/// Atomic segment (`mlx5_wqe_atomic_seg`). 16 bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct AtomicSeg {
    /// Fetch-add: the addend. Compare-swap: the value swapped in.
    pub swap_add: Be64,
    /// Compare-swap: the value compared with. Fetch-add: zero.
    pub compare: Be64,
}

impl AtomicSeg {
    /// Fetch-and-add of `add`.
    #[inline(always)]
    pub const fn fetch_add(add: u64) -> Self {
        Self { swap_add: Be64::new(add), compare: Be64::ZERO }
    }

    /// Compare-and-swap: if the target equals `compare`, replace it with `swap`.
    #[inline(always)]
    pub const fn compare_swap(compare: u64, swap: u64) -> Self {
        Self { swap_add: Be64::new(swap), compare: Be64::new(compare) }
    }
}

/// One 16-byte WQE segment as raw stored bits: what a 16-byte (vector) store writes to the ring.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
#[repr(C, align(16))]
pub struct Seg(pub [u64; 2]);

macro_rules! seg_from {
    ($($t:ty),*) => {$(
        impl From<$t> for Seg {
            #[inline(always)]
            fn from(s: $t) -> Seg {
                Seg(bytemuck::cast(s))
            }
        }
    )*};
}
seg_from!(CtrlSeg, RaddrSeg, DataSeg, AtomicSeg);

impl From<Seg> for CtrlSeg {
    /// Reads a stored segment back as a ctrl segment (the bytes unchanged).
    #[inline(always)]
    fn from(s: Seg) -> CtrlSeg {
        bytemuck::cast(s)
    }
}

/// Number of WQEBBs a WQE of `ds` segments occupies: `ceil(ds / 4)`.
#[inline(always)]
pub const fn wqebbs(ds: u32) -> u32 {
    ds.div_ceil(SEGS_PER_WQEBB as u32)
}

/// `ds` of common WQE shapes.
pub mod ds {
    /// NOP: ctrl only.
    pub const NOP: u8 = 1;
    /// RDMA WRITE / WRITE_IMM / READ with one SGE: ctrl + raddr + data.
    pub const RDMA: u8 = 3;
    /// Atomic: ctrl + raddr + atomic + data.
    pub const ATOMIC: u8 = 4;

    /// RDMA WRITE with `len` bytes inline: ctrl + raddr + the inline header and data, padded to 16 bytes.
    #[inline(always)]
    pub const fn rdma_write_inline(len: u32) -> u32 {
        2 + super::InlineSeg::ds(len)
    }
}

const _: () = {
    use core::mem::{align_of, offset_of, size_of};
    assert!(size_of::<CtrlSeg>() == 16 && align_of::<CtrlSeg>() == 4);
    assert!(offset_of!(CtrlSeg, qpn_ds) == 4);
    assert!(offset_of!(CtrlSeg, signature) == 8);
    assert!(offset_of!(CtrlSeg, dci_stream_channel_id) == 9);
    assert!(offset_of!(CtrlSeg, fm_ce_se) == 11);
    assert!(offset_of!(CtrlSeg, imm) == 12);
    assert!(size_of::<RaddrSeg>() == 16 && offset_of!(RaddrSeg, rkey) == 8);
    assert!(size_of::<DataSeg>() == 16 && offset_of!(DataSeg, lkey) == 4 && offset_of!(DataSeg, addr) == 8);
    assert!(size_of::<InlineSeg>() == 4);
    assert!(size_of::<AtomicSeg>() == 16 && offset_of!(AtomicSeg, compare) == 8);
    assert!(size_of::<Seg>() == SEG);
};
