//! The UAR (user access region) page: where software rings the doorbell or writes a BlueFlame WQE.

/// Size of one UAR page in bytes (a 4 KiB system page, as mlx5 maps it).
pub const UAR_PAGE_SIZE: usize = 4096;

/// Offset of the first BlueFlame register in the UAR page (`MLX5_BF_OFFSET` in rdma-core's mlx5 provider).
/// The 8-byte doorbell is written to the same address as a BlueFlame WQE.
pub const BF_OFFSET: usize = 0x800;

/// Bytes of one BlueFlame write: one whole WQEBB.
pub const BF_WRITE_SIZE: usize = 64;

const _: () = assert!(BF_OFFSET + BF_WRITE_SIZE <= UAR_PAGE_SIZE);
