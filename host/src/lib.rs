//! gdaki: GPU-initiated RDMA in Rust — the host library.
//!
//! The host opens NIC resources (the emulated mlx5 NIC by default, a ConnectX with the `mlx5` feature),
//! registers memory, connects RC QPs, and builds the `#[repr(C)]` handles ([`gdaki_shared::handle`]) that device
//! code ([`gdaki_device`]) uses to post WQEs, ring doorbells and poll CQs itself, on a GPU (`gpu` executor) or
//! on host threads (`cpu` executor).
//!
//! # A program, in the order it uses the API
//! 1. **Ranks**: [`channel::run_ranks`] with a [`channel::RankSetup`] runs one function per rank, each with
//!    its [`channel::Communicator`] (bootstrap, [`exec::Executor`], NIC): all ranks as threads of this
//!    process, or this process's rank of an mpirun/srun/torchrun launch ([`bootstrap::Launch`]).
//! 2. **Memory**: [`exec::Executor::alloc_data`] (GPU memory on the `gpu` executor, host memory on `cpu`),
//!    [`channel::Communicator::register_buffer`], then [`send_memory`](channel::Communicator::send_memory) /
//!    [`recv_memory`](channel::Communicator::recv_memory) to exchange it with a peer.
//! 3. **Channels**: [`channel::Communicator::connect`] (an RC QP to the peer),
//!    [`semaphore`](channel::Communicator::semaphore), [`channel::PortChannel::new`]; its
//!    [`device_handle`](channel::PortChannel::device_handle) is what device code builds a
//!    `gdaki_device::channel::PortChannel` from ([`exec::Executor::upload`] puts it where the executor reaches it).
//! 4. **Kernels**: a device crate of `#[kernel]` functions, built to PTX by `gdaki-build` from a build script;
//!    [`launch::Module::load`], [`launch::Module::kernel`], [`launch::Kernel::launch`] run them on either
//!    executor.
//! 5. **Errors** are values: [`Error`] carries the kernel's `gdaki_device::Error` ([`Error::Kernel`]), the
//!    CUDA status and the NIC's errors; a device-side wait is bounded and says what it waited for.
//!
//! gdaki's `templates/app/` is such a program, and docs/guide.md ("Your first kernel") walks through it.
//! Lower down, [`nic`] has the NICs themselves (PDs, CQs, QPs, MRs) for device code that drives a QP
//! directly, and [`proxy`] the CPU proxy of the Host modes.
#![deny(missing_docs)]

pub mod bootstrap;
pub mod channel;
pub mod coll;
pub mod cuda;
mod deadline;
mod drop_errors;
pub mod error;
pub mod exec;
pub mod launch;
pub mod mem;
pub mod nic;
pub mod proxy;

pub use error::{EmuError, Error, Result};
