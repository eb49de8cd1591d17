//! The UAR (user access region) page: where software rings the doorbell or writes a BlueFlame WQE.

use bytemuck::{Pod, Zeroable};

/// Size of one UAR page in bytes (a 4 KiB system page, as mlx5 maps it).
pub const UAR_PAGE_SIZE: usize = 4096;

/// Offset of the first BlueFlame register in the UAR page (`MLX5_BF_OFFSET` in rdma-core's mlx5 provider).
/// The 8-byte doorbell is written to the same address as a BlueFlame WQE.
pub const BF_OFFSET: usize = 0x800;

/// Bytes of one BlueFlame write: one whole WQEBB.
pub const BF_WRITE_SIZE: usize = 64;

/// A UAR page as the emulated NIC lays it out: 4096 bytes, 4096-aligned, with the doorbell/BlueFlame register
/// at [`BF_OFFSET`]. A real UAR is MMIO: software only stores to it, never reads it back.
#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C, align(4096))]
pub struct UarPage {
    /// Bytes before the BlueFlame register.
    pub head: [u64; BF_OFFSET / 8],
    /// The doorbell / BlueFlame register: the 8-byte doorbell goes to word 0, a BlueFlame WQEBB to words 0..8.
    pub bf: [u64; BF_WRITE_SIZE / 8],
    /// Bytes after the first register.
    pub tail: [u64; (UAR_PAGE_SIZE - BF_OFFSET - BF_WRITE_SIZE) / 8],
}

const _: () = assert!(core::mem::size_of::<UarPage>() == UAR_PAGE_SIZE);
const _: () = assert!(core::mem::offset_of!(UarPage, bf) == BF_OFFSET);
