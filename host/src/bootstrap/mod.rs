//! Bootstrap: how the ranks of one job, in different processes or on different hosts, find each other over
//! TCP and exchange what they need to connect QPs (QPN, PSN, queue addresses) and reach memory (address,
//! length, rkey), before any RDMA traffic exists. It plays the part of NCCL's bootstrap and MSCCL++'s
//! `TcpBootstrap`.
//!
//! 1. [`Launch::resolve`] reads rank, world size, the root's `HOST:PORT` and the session [`Secret`] from flags
//!    or from the environment of mpirun, srun or torchrun. The secret comes from `--secret`, `--secret-file`,
//!    `GDAKI_SECRET` or `GDAKI_SECRET_FILE`; without one, a root on a loopback address derives it from its
//!    address ([`Secret::derived`], which separates sessions but authenticates nothing), and a root on any
//!    other address refuses to start, saying how to pass one.
//! 2. [`Bootstrap::connect`] joins the session: rank 0 (the root) listens on exactly that address (loopback
//!    unless told otherwise) and checks each rank's hello (magic, version, secret, rank, world size); the
//!    others dial it.
//! 3. [`Bootstrap::all_gather`], [`barrier`](Bootstrap::barrier), [`send`](Bootstrap::send) and
//!    [`recv`](Bootstrap::recv) move bytes through the root; the `_pod` variants move any [`bytemuck::Pod`]
//!    value, such as a peer's [`RemoteMr`](gdaki_shared::handle::RemoteMr). A QP's connection info travels as
//!    [`Endpoint::to_bytes`](crate::nic::emu::Endpoint::to_bytes).
//!
//! The wire format is little-endian length-prefixed frames (`len u32`, `kind u32`, payload) of at most
//! [`MAX_FRAME`] bytes. Failures are [`Error::Bootstrap`](crate::Error::Bootstrap) with one-line messages that
//! name the rank, the address and what was wrong; no byte sequence from the network makes it panic.

mod join;
mod launch;
mod session;
mod wire;

pub use launch::{Launch, LaunchFlags, Secret, DEFAULT_ROOT};
pub use session::Bootstrap;
pub use wire::{MAX_FRAME, MAX_WORLD_SIZE};
