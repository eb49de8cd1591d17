//! Port channels, host side: MSCCL++'s host API (`Communicator`, `RegisteredMemory`, `connect`,
//! `Semaphore`, `PortChannel`) in Rust names, in its three modes ([`IbMode`]): Device (the GPUNetIO backend,
//! the default: device code posts the WQEs itself, no proxy thread), Host and HostNoAtomic (device code pushes
//! triggers, the communicator's CPU proxy, [`crate::proxy`], posts the WQEs). The host builds what the handle
//! of [`gdaki_shared::channel::PortChannelHandle`] names; device code (`gdaki_device`) does the rest.
//!
//! | MSCCL++ | here |
//! |---|---|
//! | `Communicator(bootstrap)` | [`Communicator::new`]`(bootstrap, executor, wire)` (opens its own emulated NIC), [`Communicator::with_nic`] (any NIC) |
//! | `registerMemory(ptr, size, transports)` | [`Communicator::register_memory`] (unsafe), [`Communicator::register_buffer`] |
//! | `sendMemory` / `recvMemory` | [`Communicator::send_memory`] / [`Communicator::recv_memory`] → [`RemoteMemory`] |
//! | `EndpointConfig{transport, ib{mode, maxSendWr, maxCqSize}}` | [`EndpointConfig`], [`Transport`], [`IbConfig`], [`IbMode`] |
//! | `connect(config, remoteRank, tag)` | [`Communicator::connect`] → [`Connection`] |
//! | `buildSemaphore(connection, remoteRank, tag)` | [`Communicator::semaphore`] → [`Semaphore`] |
//! | `PortChannel(semaphoreId, semaphore, proxy, dst, src)` | [`PortChannel::new`]`(&conn, &sem, dst, &src)` |
//! | `PortChannel::deviceHandle()` | [`PortChannel::device_handle`] → `PortChannelHandle` |
//!
//! Setup, on every rank of a pair (the calls pair up by peer and tag):
//!
//! ```no_run
//! # fn main() -> gdaki::Result<()> {
//! use gdaki::bootstrap::{Bootstrap, Launch, LaunchFlags};
//! use gdaki::channel::{Communicator, EndpointConfig, PortChannel};
//! use gdaki::exec::{Executor, ExecutorKind};
//! use gdaki::nic::emu::WireConfig;
//!
//! let launch = Launch::resolve_from_process_env(LaunchFlags::default())?.expect("a launcher's environment");
//! let boot = Bootstrap::connect(&launch, std::time::Duration::from_secs(30))?;
//! let (exec, _) = Executor::open(Some(ExecutorKind::Cpu))?;
//! let comm = Communicator::new(boot, exec, WireConfig::loopback())?;
//! let peer = 1 - comm.rank();
//! let mem = comm.register_buffer(comm.executor().alloc_data(1 << 20)?)?;
//! comm.send_memory(&mem, peer, 0)?;
//! let dst = comm.recv_memory(peer, 0)?;
//! let conn = comm.connect(&EndpointConfig::default(), peer, 1)?;
//! let sem = comm.semaphore(&conn, peer, 2)?;
//! let chan = PortChannel::new(&conn, &sem, dst, &mem)?;
//! let handle = chan.device_handle(); // to device code, by value or in device memory
//! # let _ = handle; Ok(()) }
//! ```
//!
//! Where things live (`gpu` executor / `cpu` executor):
//!
//! | what | `gpu` | `cpu` | why |
//! |---|---|---|---|
//! | QP handle + shared QP state | GPU memory (`cuMemAlloc`) | host memory | device code updates the counters on every post: no PCIe round trip |
//! | SQ ring, dbrecs, CQ ring | GPU memory (the NIC's queue placement; pinned host memory with `GDAKI_QUEUES=host`, and always for the Host modes' proxy QPs) | host memory | where DOCA GPUNetIO and NVSHMEM IBGDA put them; the NIC reads and writes them directly |
//! | UAR (doorbell, BlueFlame register) | pinned host memory mapped into the GPU | host memory | the GPU writes it as MMIO |
//! | atomic scratch word, inbound semaphore word | GPU memory | host memory | the NIC writes them (the emulated NIC's engine, without a CUDA copy); `wait` polls the inbound word without crossing PCIe |
//! | expected count of a semaphore | GPU memory | host memory | only device code touches it |
//! | registered data | where the caller put it ([`Executor::alloc_data`](crate::exec::Executor::alloc_data): GPU memory) | host memory | |
//!
//! Lifetimes: connections, registered memory, semaphores and channels hold an `Arc` of the communicator's NIC
//! and PD, and channels hold their connection, semaphore and source memory, so nothing a handle names on this
//! side is freed while the channel lives. Each object deregisters its MRs before freeing the memory they cover
//! and destroys its QP (synchronously with the NIC) before freeing the QP's state. Device code must have
//! stopped using a handle before the last owner of what it names is dropped. In the Host modes the proxy is one
//! more owner of a connection that has had a channel: it lets go once the connection's channels and clones are
//! gone and what was pushed for them is done (see [`Connection`]).

mod communicator;
mod config;
mod connection;
mod departed;
mod memory;
mod msg;
mod port;
pub mod ranks;
mod resources;
mod semaphore;

pub use communicator::Communicator;
pub use config::{EndpointConfig, IbConfig, IbMode, Transport};
pub use connection::Connection;
pub use departed::DEPARTURE_GRACE;
pub use memory::{RegisteredMemory, RemoteMemory};
pub use port::PortChannel;
pub use ranks::{run_ranks, RankSetup};
pub use semaphore::Semaphore;

#[cfg(test)]
mod tests;
