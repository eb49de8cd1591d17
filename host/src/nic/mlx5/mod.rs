//! The real mlx5 backend: ConnectX NICs through rdma-core (`libibverbs` + `libmlx5`), feature `mlx5`.
//!
//! It makes the same device handles as the emulated NIC ([`crate::nic::emu`]), so the same device code drives
//! it: the host opens the device, creates CQs and RC QPs with verbs, exports their rings with
//! `mlx5dv_init_obj`, maps them (and the UAR page) into the GPU, and connects the QPs; device code then builds
//! WQEs, writes the dbrec and rings the doorbell on the hardware itself.
//!
//! | concern | file | calls |
//! |---|---|---|
//! | errors, device context, device list | `verbs.rs` | `ibv_get_device_list`, `ibv_open_device` |
//! | devices, ports, GID tables | `device.rs` | `ibv_query_device`, `___ibv_query_port`, `ibv_query_gid_table`, `mlx5dv_is_supported` |
//! | GID choice (pure) | `gid.rs` | |
//! | attribute structs and masks (pure) | `attr.rs` | |
//! | QP info exchanged with peers | `endpoint.rs` | |
//! | host ranges and UAR → GPU | `map.rs` | `cuMemHostRegister` (`IOMEMORY` for the UAR) |
//! | PD, MRs | `mr.rs` | `ibv_alloc_pd`, `ibv_reg_mr_iova2`, `ibv_reg_dmabuf_mr` + `cuMemGetHandleForAddressRange` |
//! | CQs | `cq.rs` | `ibv_create_cq`, `mlx5dv_init_obj(CQ)`; DevX: CREATE_CQ |
//! | QPs | `qp.rs` | `ibv_create_qp`, `mlx5dv_init_obj(QP)`, `ibv_modify_qp` ×3, `ibv_query_qp`; DevX: CREATE_QP, RST2INIT, INIT2RTR, RTR2RTS, QUERY_QP |
//! | which path (pure, every build) | `path.rs` | |
//! | DevX transport, UAR, umems, GPU rings | `devx.rs` | `mlx5dv_open_device(DEVX)`, `mlx5dv_devx_*`, `cuMemGetHandleForAddressRange` |
//!
//! # Where the queues live
//! The portable layout: rdma-core allocates the SQ and CQ rings and doorbell records in host memory, and for
//! the `gpu` executor they are registered with the GPU (`cuMemHostRegister`), as the emulated NIC's queues are
//! pinned host memory mapped into the GPU. The doorbell/BlueFlame register (`mlx5dv_qp.bf.reg`) is in a UAR
//! page rdma-core mmapped from the device; the GPU reaches it through `cuMemHostRegister(...,
//! CU_MEMHOSTREGISTER_IOMEMORY)` (PCIe peer-to-peer stores to the NIC's BAR). That is the verbs path.
//!
//! The DevX path, the `gpu` executor's default where the device allows it (`path.rs` chooses, `devx.rs`
//! builds): rings and doorbell records in GPU memory registered as umems (`mlx5dv_devx_umem_reg_ex` over a
//! dmabuf, or the GPU address through nvidia-peermem), CQs and QPs made with `gdaki::nic::devx`'s PRM
//! commands (`mlx5dv_devx_obj_create` with `CREATE_CQ`/`CREATE_QP`, then the state transitions) on a context
//! opened with `mlx5dv_open_device(MLX5DV_CONTEXT_FLAGS_DEVX)`, and a UAR of the NIC's own
//! (`mlx5dv_devx_alloc_uar`, mapped with `IOMEMORY`); handles have placement GPU, so a device post's ring and
//! dbrec stores stay in GPU memory and only the doorbell crosses PCIe. `Mlx5Nic::open` falls back to the verbs
//! path when a probe fails, and logs which path it took and why in one line.
//!
//! # What has been tested
//! No machine of this project has an RDMA NIC. The pure parts (attributes, masks, GID choice, sizes,
//! endpoint bytes, layouts against the C compiler's) are unit-tested; the "no device" path is tested; the code
//! that talks to hardware compiles and was reviewed against rdma-core's man pages and `mlx5dv.h`, but has
//! never run. `testkit/tests/mlx5_hw.rs` is the hardware suite (docs/mlx5.md says how to run it).
//!
//! # Atomics
//! Device code reads semaphores as host-endian `u64`s (the emulated NIC's model). ConnectX adapters run 8-byte
//! atomics in host endianness when the driver enables it (mlx5_core sets `atomic_req_8B_endianness_mode` to
//! host endianness where the HCA supports it, all ConnectX-5 and later); older ones would show byte-swapped
//! semaphores, which the hardware suite's ping-pong detects.

pub mod endpoint;
pub mod path;

// Everything below talks to rdma-core, and exists with the `mlx5` feature only; the endpoint above (what peers
// exchange) exists in every build, so that a build without the feature can read a peer's and say why not.
#[cfg(feature = "mlx5")]
pub mod attr;
#[cfg(feature = "mlx5")]
mod context;
#[cfg(feature = "mlx5")]
mod cq;
#[cfg(feature = "mlx5")]
pub mod device;
#[cfg(feature = "mlx5")]
mod devx;
#[cfg(feature = "mlx5")]
pub mod gid;
#[cfg(feature = "mlx5")]
mod map;
#[cfg(feature = "mlx5")]
mod mr;
#[cfg(feature = "mlx5")]
mod qp;
#[cfg(feature = "mlx5")]
mod verbs;

pub use endpoint::{Endpoint, LinkLayer, Mtu, ENDPOINT_BYTES};
pub use path::{QueuePath, UmemPath};

#[cfg(feature = "mlx5")]
pub use context::Mlx5Nic;
#[cfg(feature = "mlx5")]
pub use cq::Cq;
#[cfg(feature = "mlx5")]
pub use device::{list, AtomicCap, DeviceInfo, PortInfo, PortState};
#[cfg(feature = "mlx5")]
pub use devx::{DevxContext, DevxObj};
#[cfg(feature = "mlx5")]
pub use gid::{GidEntry, GidType};
#[cfg(feature = "mlx5")]
pub use mr::{Mr, MrPath, Pd};
#[cfg(feature = "mlx5")]
pub use qp::Qp;
