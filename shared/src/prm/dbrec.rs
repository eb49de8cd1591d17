//! Doorbell records (`dbrec`): the 8-byte words in queue memory (host or GPU memory) that tell the NIC how far
//! software got.

use crate::be::Be32;
use bytemuck::{Pod, Zeroable};

/// A QP's doorbell record: word 0 (`MLX5_RCV_DBR`) is the RQ counter, word 1 (`MLX5_SND_DBR`) the SQ
/// producer counter, `htobe32(pi & 0xffff)` in WQEBBs. 8 bytes, 8-byte aligned.
///
/// Writing the SQ counter to word 0 is a known bug class: the NIC never sees it.
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
#[repr(C, align(8))]
pub struct QpDbrec {
    /// RQ consumer counter (`MLX5_RCV_DBR`, word 0).
    pub rcv_counter: Be32,
    /// SQ producer counter (`MLX5_SND_DBR`, word 1), WQEBBs, low 16 bits.
    pub snd_counter: Be32,
}

/// A CQ's doorbell record: word 0 is the consumer index (`set_ci`, low 24 bits), word 1 the arm word
/// (`MLX5_CQ_ARM_DB` in rdma-core's mlx5 provider, not in `mlx5dv.h`; unused by polling code). 8 bytes, 8-byte aligned.
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
#[repr(C, align(8))]
pub struct CqDbrec {
    /// Consumer index, CQEs, `ci & 0xffffff` (`MLX5_CQ_SET_CI` in rdma-core's mlx5 provider, word 0).
    pub set_ci: Be32,
    /// Arm doorbell word (`MLX5_CQ_ARM_DB`, word 1).
    pub arm: Be32,
}

/// Mask of the SQ counter carried by the dbrec and by the ctrl segment's WQE index: 16 bits.
pub const SQ_COUNTER_MASK: u32 = 0xffff;
/// Mask of the CQ consumer index carried by the CQ dbrec: 24 bits.
pub const CQ_CI_MASK: u32 = 0x00ff_ffff;

const _: () = assert!(core::mem::size_of::<QpDbrec>() == 8);
const _: () = assert!(core::mem::offset_of!(QpDbrec, snd_counter) == 4);
const _: () = assert!(core::mem::size_of::<CqDbrec>() == 8);
