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
pub mod launch;
pub mod mem;
pub mod nic;
pub mod proxy;

pub use error::{Error, Result};
