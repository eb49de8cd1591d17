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
//! | CQs | `cq.rs` | `ibv_create_cq`, `mlx5dv_init_obj(CQ)` |
//! | QPs | `qp.rs` | `ibv_create_qp`, `mlx5dv_init_obj(QP)`, `ibv_modify_qp` ×3, `ibv_query_qp` |
//!
//! # Where the queues live
//! The portable layout: rdma-core allocates the SQ and CQ rings and doorbell records in host memory, and for
//! the `gpu` executor they are registered with the GPU (`cuMemHostRegister`), as the emulated NIC's queues are
//! pinned host memory mapped into the GPU. The doorbell/BlueFlame register (`mlx5dv_qp.bf.reg`) is in a UAR
//! page rdma-core mmapped from the device; the GPU reaches it through `cuMemHostRegister(...,
//! CU_MEMHOSTREGISTER_IOMEMORY)` (PCIe peer-to-peer stores to the NIC's BAR). The faster layout, rings in GPU
//! memory through DevX objects over a umem registered from a dmabuf (`mlx5dv_devx_umem_reg_ex`,
//! `mlx5dv_devx_obj_create` with PRM `CREATE_QP`/`CREATE_CQ`), is not built yet.
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

#[cfg(feature = "mlx5")]
pub use context::Mlx5Nic;
#[cfg(feature = "mlx5")]
pub use cq::Cq;
#[cfg(feature = "mlx5")]
pub use device::{list, AtomicCap, DeviceInfo, PortInfo, PortState};
#[cfg(feature = "mlx5")]
pub use gid::{GidEntry, GidType};
#[cfg(feature = "mlx5")]
pub use mr::{Mr, MrPath, Pd};
#[cfg(feature = "mlx5")]
pub use qp::Qp;
