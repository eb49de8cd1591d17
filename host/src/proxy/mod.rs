//! The CPU proxy of the Host and HostNoAtomic port-channel modes (MSCCL++'s `ProxyService` and `Fifo`): device
//! code pushes 16-byte triggers into a FIFO in pinned host memory, and one host thread posts the WQEs. It is
//! the baseline GPU-initiated RDMA is measured against (`gdaki-perf`), so it is built to be fast: a dedicated
//! polling thread, no locks or sleeps on its hot path, doorbells rung once per batch.
//!
//! - [`fifo`]: the FIFO's memory, its device handle, and popping triggers in order.
//! - [`service`]: the thread and the registry of channels and QPs it serves.

pub mod fifo;
pub mod service;

pub use fifo::DEFAULT_FIFO_SIZE;
pub use service::{ProxyService, VENDOR_PROXY_FLUSH, VENDOR_PROXY_POST, VENDOR_PROXY_UNKNOWN_CHANNEL};
