//! gdaki: GPU-initiated RDMA in Rust — the host library.
//!
//! The host opens NIC resources (the emulated mlx5 NIC by default), registers memory, connects RC QPs, and
//! builds the `#[repr(C)]` handles ([`gdaki_shared::handle`]) that device code ([`gdaki_device`]) uses to post
//! WQEs, ring doorbells and poll CQs itself, on a GPU (`gpu` executor) or on host threads (`cpu` executor).
#![deny(missing_docs)]

pub mod bootstrap;
pub mod channel;
pub mod cuda;
pub mod error;
pub mod exec;
pub mod faults;
pub mod launch;
pub mod mem;
pub mod nic;
pub mod perftest;
pub mod pingpong;
pub mod porttest;
pub mod postrate;
pub mod proxy;
pub mod ptx;

pub use error::{Error, Result};
