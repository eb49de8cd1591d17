//! NIC backends: the models of an mlx5 HCA that device code drives through WQEs, doorbells and CQEs.
//!
//! - [`emu`]: the emulated mlx5 NIC, the default backend. It needs no hardware: a host thread reads the same
//!   queue memory (SQ ring, doorbell record, UAR page, CQ ring) that a ConnectX adapter would read, and
//!   executes RDMA operations between its own QPs, or with QPs of other emulated NICs (in this process,
//!   another process or another host) over its wire.
//! - [`mlx5`]: a real ConnectX NIC through rdma-core (verbs + mlx5dv), with the cargo feature `mlx5`. Without
//!   the feature only its [`mlx5::Endpoint`] exists.
//!
//! - [`devx`]: the firmware commands (DevX mailboxes) that create and connect QPs and CQs, built from typed
//!   attributes; the emulated NIC's own QPs and CQs are made of them.
//!
//! Both make the same device handles ([`gdaki_shared::handle`]), so the same device code drives either.
//! [`NicSpec`] names one (`--nic emu` or `--nic mlx5_0`), [`Nic::open`] opens it, and [`Nic`], [`Pd`], [`Cq`],
//! [`Qp`], [`Mr`] and [`Endpoint`] are the objects of either, for code that runs on both (the ping-pong, the
//! port channels).

mod backend;
pub mod devx;
pub mod emu;
pub mod mlx5;
mod spec;

pub use backend::{Cq, Endpoint, Mr, Nic, Pd, Qp, ENDPOINT_BYTES};
pub use emu::Access;
pub use spec::{Mlx5Spec, NicSpec};
