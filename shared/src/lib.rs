//! `#[repr(C)]` layouts that both sides of gdaki read: the mlx5 PRM structures the NIC parses (WQE segments,
//! CQE64, doorbell records, the UAR page) and the device handles the host builds for kernels.
//!
//! Every layout has compile-time size and offset assertions, so the same checks hold on x86_64 and nvptx64.
//! Fields that are big-endian on the wire use [`be::Be16`]/[`be::Be32`]/[`be::Be64`] and can never be mixed up
//! with host-order integers.
#![no_std]
#![deny(missing_docs)]

pub mod be;
pub mod channel;
pub mod coll;
pub mod handle;
pub mod packet;
pub mod prm;
pub mod proxy;

pub use be::{Be16, Be32, Be64};
