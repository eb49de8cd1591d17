//! The open device and port that every PD, CQ, QP and MR of the mlx5 backend hangs from: what
//! `Mlx5Nic::open` checks and chooses (port state, link layer, MTU, GID, device limits).

use std::sync::Arc;

use super::device::{self, AtomicCap, PortState};
use super::devx::{self, DevxRes};
use super::endpoint::{LinkLayer, Mtu};
use super::gid::{self, GidEntry};
use super::map;
use super::path::{self, Choice, PathRequest, Probe, QueuePath};
use super::verbs::Context;
use crate::cuda::Gpu;
use crate::drop_errors::DropErrors;
use crate::nic::Mlx5Spec;
use crate::{Error, Result};

/// The device limits QP and CQ creation checks against (`ibv_query_device`).
#[derive(Clone, Copy, Debug)]
pub(super) struct Limits {
    pub(super) max_cqe: u32,
    pub(super) max_qp_wr: u32,
    pub(super) max_qp_rd_atom: i32,
    pub(super) max_qp_init_rd_atom: i32,
}

/// One port of an open mlx5 device, ready to make PDs, CQs, QPs and MRs for one executor: the parent of all
/// of them (each holds an `Arc` of it, so the device stays open until the last is dropped).
#[derive(Debug)]
pub struct Mlx5Nic {
    /// The DevX path's UAR, capabilities and umem kind (`None` on the verbs path). Declared before `ctx`, so
    /// that it is freed before the context is closed.
    pub(super) devx: Option<DevxRes>,
    /// Which path the CQs and QPs take, and why.
    pub(super) path: Choice,
    pub(super) ctx: Context,
    pub(super) port: u8,
    pub(super) link: LinkLayer,
    pub(super) lid: u16,
    pub(super) mtu: Mtu,
    pub(super) gid: GidEntry,
    pub(super) limits: Limits,
    pub(super) map: map::Mapper,
    /// Failures of the drops of this NIC's PDs, MRs, CQs and QPs; see [`Mlx5Nic::take_drop_error`].
    pub(super) drops: DropErrors,
}

impl Mlx5Nic {
    /// Takes the first failure a drop of this NIC's PDs, MRs, CQs or QPs met (an `ibv_destroy_*` or
    /// `ibv_dereg_mr` that failed) since the last call; each was logged with `tracing` when it happened, as
    /// every backend's drops do. The device's own close, when the NIC is dropped, is only logged.
    pub fn take_drop_error(&self) -> Option<Error> {
        self.drops.take()
    }

    /// Opens port `spec.port` of device `spec.device` for device code on `gpu` (`None`: the `cpu` executor):
    /// checks that rdma-core's mlx5 provider drives it, that the port is ACTIVE with a known link layer and
    /// MTU, and that the device has RDMA atomics; picks the GID QPs send from ([`gid::select`], or
    /// `spec.gid_index`); chooses how CQs and QPs are made ([`path::choose`], logged in one line): for the
    /// `gpu` executor the device is opened for DevX and probed (capabilities, UAR, a GPU umem from a dmabuf
    /// or through nvidia-peermem), and the verbs path is taken when a probe fails; `GDAKI_MLX5_QUEUES`
    /// overrides ([`path::PATH_ENV`]).
    ///
    /// # Errors
    /// [`Error::Unavailable`] (one line) when the host has no RDMA device ("no RDMA devices found: ..."), none
    /// of that name, or the device, port or GID table cannot serve (not mlx5, no such port, port not active,
    /// no atomics, no RoCE v2 GID); [`Error::InvalidArgument`] for a bad `gid_index`; [`Error::Verbs`] for a
    /// failed query; with `GDAKI_MLX5_QUEUES=devx`, [`Error::Unavailable`] naming the DevX probe that failed,
    /// and [`Error::InvalidArgument`] for another value than `auto`, `devx`, `verbs`.
    pub fn open(spec: &Mlx5Spec, gpu: Option<Arc<Gpu>>) -> Result<Arc<Self>> {
        let req = PathRequest::from_env()?;
        let (ctx, devx_open_error) = Context::open_as(&spec.device, gpu.is_some() && req != PathRequest::Verbs)?;
        let info = device::query(&ctx)?;
        let name = &spec.device;
        if !info.mlx5 {
            return Err(Error::Unavailable(format!("{name} is not driven by rdma-core's mlx5 provider")));
        }
        if info.atomic == Some(AtomicCap::None) {
            return Err(Error::Unavailable(format!("{name} has no RDMA atomics (semaphores need them)")));
        }
        let port = info.ports.iter().find(|p| p.num == spec.port).ok_or_else(|| {
            Error::Unavailable(format!("{name} has no port {} (it has {})", spec.port, info.ports.len()))
        })?;
        if let PortState::NotActive(s) = port.state {
            return Err(Error::Unavailable(format!(
                "port {} of {name} is not active (ibv_port_state {s}: cable, link partner, or subnet manager)",
                spec.port
            )));
        }
        let (Some(link), Some(mtu)) = (port.link, port.active_mtu) else {
            return Err(Error::Unavailable(format!("port {} of {name}: unknown link layer or MTU", spec.port)));
        };
        let gid = gid::select(&port.gids, link, spec.gid_index)?;
        if gid.index > u32::from(u8::MAX) {
            return Err(Error::Unavailable(format!("GID index {} does not fit sgid_index (u8)", gid.index)));
        }
        let limits = Limits {
            max_cqe: u32::try_from(info.max_cqe).unwrap_or(0),
            max_qp_wr: u32::try_from(info.max_qp_wr).unwrap_or(0),
            max_qp_rd_atom: info.max_qp_rd_atom,
            max_qp_init_rd_atom: info.max_qp_init_rd_atom,
        };
        let lid = port.lid;
        let map = map::Mapper::new(gpu);
        let mut probe = Probe { gpu: map.gpu().is_some(), ..Probe::default() };
        let mut devx_res = None;
        if let Some(e) = devx_open_error {
            probe.devx_context = Some(Err(e));
        } else if let (true, Some(g)) = (ctx.devx, map.gpu()) {
            probe.devx_context = Some(Ok(()));
            let p = devx::probe(&ctx, &map, g);
            (probe.hca_cap, probe.uar, probe.dmabuf_umem, probe.peermem_umem) = (p.hca_cap, p.uar, p.dmabuf, p.peermem);
            devx_res = p.res;
        }
        let choice = path::choose(req, &probe)?;
        tracing::info!("mlx5 {name} port {}: queues through {}: {}", spec.port, choice.path, choice.reason);
        if choice.path == QueuePath::Verbs {
            // Freed before the context, which stays open for verbs.
            devx_res = None;
        }
        Ok(Arc::new(Self {
            devx: devx_res,
            path: choice,
            ctx,
            port: spec.port,
            link,
            lid,
            mtu,
            gid,
            limits,
            map,
            drops: DropErrors::default(),
        }))
    }

    /// The device's name (`mlx5_0`).
    pub fn name(&self) -> &str {
        &self.ctx.name
    }

    /// The port QPs use (from 1).
    pub fn port(&self) -> u8 {
        self.port
    }

    /// The port's link layer.
    pub fn link(&self) -> LinkLayer {
        self.link
    }

    /// The GID QPs send from.
    pub fn gid(&self) -> GidEntry {
        self.gid
    }

    /// How this NIC's CQs and QPs are made (DevX with rings in GPU memory, or verbs), chosen by
    /// [`Mlx5Nic::open`].
    pub fn queue_path(&self) -> QueuePath {
        self.path.path
    }

    /// Why [`Mlx5Nic::queue_path`] is what it is (the request, or the DevX probe that failed and its error).
    pub fn queue_path_reason(&self) -> &str {
        &self.path.reason
    }
}
