//! NIC backends: the models of an mlx5 HCA that device code drives through WQEs, doorbells and CQEs.
//!
//! - [`emu`]: the emulated mlx5 NIC, the default backend. It needs no hardware: a host thread reads the same
//!   queue memory (SQ ring, doorbell record, UAR page, CQ ring) that a ConnectX adapter would read, and
//!   executes RDMA operations between QPs of the same process.

pub mod emu;
