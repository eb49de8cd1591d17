//! mlx5 PRM structures, named as in rdma-core's `infiniband/mlx5dv.h`.
//!
//! All multi-byte fields are big-endian. Segments are 16 bytes; a WQE basic block (WQEBB) is 64 bytes.

pub mod cmd;
pub mod cqe;
pub mod dbrec;
pub mod opcode;
pub mod uar;
pub mod wqe;
