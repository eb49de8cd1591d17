//! Which way the mlx5 backend makes its CQs and QPs: through DevX with the rings in GPU memory (as DOCA
//! GPUNetIO and NVSHMEM IBGDA do), or through verbs (`ibv_create_cq`/`ibv_create_qp` + `mlx5dv_init_obj`) with
//! the rings in host memory mapped into the GPU. A pure function of what was asked for and of the probes
//! `Mlx5Nic::open` ran, so that the choice is tested without hardware; `Mlx5Nic::open` logs the chosen path
//! and its reason in one `tracing` line.
//!
//! The probes run in this order, each only when the previous one succeeded (and only for the `gpu`
//! executor): open the device with `mlx5dv_open_device(MLX5DV_CONTEXT_FLAGS_DEVX)`; QUERY_HCA_CAP through
//! `mlx5dv_devx_general_cmd` and the capabilities the DevX path needs (RC); `mlx5dv_devx_alloc_uar`; then
//! registering a page of GPU memory as a umem from a dmabuf (`cuMemGetHandleForAddressRange` +
//! `mlx5dv_devx_umem_reg_ex`), and when that fails, from the GPU address itself (nvidia-peermem,
//! `mlx5dv_devx_umem_reg`).

use std::fmt;

use crate::{Error, Result};

/// The environment variable that overrides the automatic choice: `auto` (the default), `devx` (fail rather
/// than fall back) or `verbs` (never try DevX).
pub const PATH_ENV: &str = "GDAKI_MLX5_QUEUES";

/// How a DevX umem over GPU memory is registered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UmemPath {
    /// `mlx5dv_devx_umem_reg_ex` with `MLX5DV_UMEM_MASK_DMABUF`, over a dmabuf of the GPU memory from
    /// `cuMemGetHandleForAddressRange(CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD)` (Linux 5.12+, the NVIDIA open
    /// kernel modules, CUDA 11.7+).
    Dmabuf,
    /// `mlx5dv_devx_umem_reg` on the GPU address itself, which the kernel pins through nvidia-peermem.
    Peermem,
}

/// How the NIC's CQs and QPs are made.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QueuePath {
    /// DevX: CREATE_CQ/CREATE_QP and the state transitions as PRM commands (`gdaki::nic::devx`'s builders,
    /// through `mlx5dv_devx_obj_*`), rings and doorbell records in GPU memory registered as umems this way,
    /// a UAR from `mlx5dv_devx_alloc_uar`. Handles have placement GPU.
    Devx(UmemPath),
    /// Verbs: `ibv_create_cq`/`ibv_create_qp` and `mlx5dv_init_obj`, rings and doorbell records in host
    /// memory rdma-core allocated, mapped into the GPU for the `gpu` executor. Handles have placement HOST.
    Verbs,
}

impl fmt::Display for QueuePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Devx(UmemPath::Dmabuf) => "DevX (rings in GPU memory, dmabuf umems)",
            Self::Devx(UmemPath::Peermem) => "DevX (rings in GPU memory, nvidia-peermem umems)",
            Self::Verbs => "verbs (rings in host memory)",
        })
    }
}

/// What was asked for ([`PATH_ENV`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum PathRequest {
    /// DevX where every probe succeeds, else verbs.
    #[default]
    Auto,
    /// DevX, or an error saying which probe failed.
    Devx,
    /// Verbs; DevX is not tried.
    Verbs,
}

impl PathRequest {
    /// From the value of [`PATH_ENV`] (`None`: unset, the same as `auto`).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a value other than `auto`, `devx` and `verbs`.
    pub fn from_env_value(v: Option<&str>) -> Result<Self> {
        match v {
            None | Some("auto") | Some("") => Ok(Self::Auto),
            Some("devx") => Ok(Self::Devx),
            Some("verbs") => Ok(Self::Verbs),
            Some(v) => Err(Error::InvalidArgument(format!("{PATH_ENV}={v:?}: give auto, devx or verbs"))),
        }
    }

    /// From the environment ([`PATH_ENV`]).
    ///
    /// # Errors
    /// As [`PathRequest::from_env_value`]; [`Error::InvalidArgument`] for a value that is not UTF-8.
    pub fn from_env() -> Result<Self> {
        match std::env::var(PATH_ENV) {
            Ok(v) => Self::from_env_value(Some(&v)),
            Err(std::env::VarError::NotPresent) => Self::from_env_value(None),
            Err(std::env::VarError::NotUnicode(v)) => {
                Err(Error::InvalidArgument(format!("{PATH_ENV}={v:?}: give auto, devx or verbs")))
            }
        }
    }
}

/// The outcome of one probe: `Err` carries the error's text (the call, errno, status/syndrome).
pub type ProbeResult = std::result::Result<(), String>;

/// What `Mlx5Nic::open` found out, in probe order; `None` for a probe that did not run (an earlier one
/// failed, or the executor or request made it pointless).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Probe {
    /// Device code runs on a GPU (the DevX path puts the rings in GPU memory, which host threads cannot
    /// read).
    pub gpu: bool,
    /// `mlx5dv_open_device(MLX5DV_CONTEXT_FLAGS_DEVX)`.
    pub devx_context: Option<ProbeResult>,
    /// QUERY_HCA_CAP through `mlx5dv_devx_general_cmd`, and the capabilities the path needs.
    pub hca_cap: Option<ProbeResult>,
    /// `mlx5dv_devx_alloc_uar`.
    pub uar: Option<ProbeResult>,
    /// A umem over GPU memory from a dmabuf.
    pub dmabuf_umem: Option<ProbeResult>,
    /// A umem over GPU memory through nvidia-peermem.
    pub peermem_umem: Option<ProbeResult>,
}

/// The chosen path and why, as `Mlx5Nic::open` logs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Choice {
    /// The path.
    pub path: QueuePath,
    /// Why: what was asked for, or which probe failed and how.
    pub reason: String,
}

/// The path for request `req` given the probes `p`: DevX when the DevX context, the capabilities and the UAR
/// are there and a GPU umem registers (dmabuf first, then nvidia-peermem); otherwise verbs, with the first
/// failure as the reason.
///
/// # Errors
/// [`Error::Unavailable`] when `req` is [`PathRequest::Devx`] and DevX cannot serve (the `cpu` executor, or a
/// failed probe, named with its error).
pub fn choose(req: PathRequest, p: &Probe) -> Result<Choice> {
    let verbs = |reason: String| Ok(Choice { path: QueuePath::Verbs, reason });
    if req == PathRequest::Verbs {
        return verbs(format!("{PATH_ENV}=verbs"));
    }
    let fallback = |why: String| -> Result<Choice> {
        if req == PathRequest::Devx {
            Err(Error::Unavailable(format!("{PATH_ENV}=devx, but DevX cannot serve: {why}")))
        } else {
            verbs(format!("{why}; falling back to verbs"))
        }
    };
    if !p.gpu {
        return fallback("the cpu executor: device code on host threads reads the rings in host memory".into());
    }
    let steps = [
        ("mlx5dv_open_device(DEVX)", &p.devx_context),
        ("QUERY_HCA_CAP", &p.hca_cap),
        ("mlx5dv_devx_alloc_uar", &p.uar),
    ];
    for (what, r) in steps {
        match r {
            Some(Ok(())) => {}
            Some(Err(e)) => return fallback(format!("{what} failed: {e}")),
            None => return fallback(format!("{what} was not tried")),
        }
    }
    let dmabuf = match &p.dmabuf_umem {
        Some(Ok(())) => {
            return Ok(Choice {
                path: QueuePath::Devx(UmemPath::Dmabuf),
                reason: "DevX context, capabilities, UAR and a dmabuf umem of GPU memory all available".into(),
            })
        }
        Some(Err(e)) => e.clone(),
        None => "not tried".into(),
    };
    match &p.peermem_umem {
        Some(Ok(())) => Ok(Choice {
            path: QueuePath::Devx(UmemPath::Peermem),
            reason: format!("dmabuf umem failed ({dmabuf}); nvidia-peermem registers GPU memory as a umem"),
        }),
        Some(Err(e)) => fallback(format!("no umem over GPU memory: dmabuf ({dmabuf}), nvidia-peermem ({e})")),
        None => fallback(format!("no umem over GPU memory: dmabuf ({dmabuf}), nvidia-peermem not tried")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_ok() -> Probe {
        Probe {
            gpu: true,
            devx_context: Some(Ok(())),
            hca_cap: Some(Ok(())),
            uar: Some(Ok(())),
            dmabuf_umem: Some(Ok(())),
            peermem_umem: None,
        }
    }

    #[test]
    fn every_probe_passing_is_devx_over_dmabuf() {
        let c = choose(PathRequest::Auto, &all_ok()).unwrap();
        assert_eq!(c.path, QueuePath::Devx(UmemPath::Dmabuf));
        assert_eq!(choose(PathRequest::Devx, &all_ok()).unwrap().path, c.path);
    }

    #[test]
    fn no_dmabuf_is_peermem_and_neither_is_verbs() {
        let p = Probe { dmabuf_umem: Some(Err("CUDA_ERROR_NOT_SUPPORTED".into())), ..all_ok() };
        let c = choose(PathRequest::Auto, &p).unwrap();
        assert_eq!(c.path, QueuePath::Verbs, "peermem not tried is no umem");
        assert!(c.reason.contains("nvidia-peermem not tried"), "{}", c.reason);
        let p = Probe { peermem_umem: Some(Ok(())), ..p };
        let c = choose(PathRequest::Auto, &p).unwrap();
        assert_eq!(c.path, QueuePath::Devx(UmemPath::Peermem));
        assert!(c.reason.contains("CUDA_ERROR_NOT_SUPPORTED"), "{}", c.reason);
        let p = Probe { peermem_umem: Some(Err("mlx5dv_devx_umem_reg: EFAULT".into())), ..p };
        let c = choose(PathRequest::Auto, &p).unwrap();
        assert_eq!(c.path, QueuePath::Verbs);
        assert!(c.reason.contains("EFAULT") && c.reason.contains("NOT_SUPPORTED"), "{}", c.reason);
        let e = choose(PathRequest::Devx, &p).unwrap_err().to_string();
        assert!(e.contains("GDAKI_MLX5_QUEUES=devx") && e.contains("EFAULT"), "{e}");
    }

    #[test]
    fn the_first_failed_probe_is_the_reason() {
        let p = Probe {
            devx_context: Some(Err("mlx5dv_open_device(DEVX): EOPNOTSUPP".into())),
            hca_cap: None,
            uar: None,
            dmabuf_umem: None,
            ..all_ok()
        };
        let c = choose(PathRequest::Auto, &p).unwrap();
        assert_eq!(c.path, QueuePath::Verbs);
        assert!(c.reason.starts_with("mlx5dv_open_device(DEVX) failed") && c.reason.contains("EOPNOTSUPP"));
        let p = Probe { uar: Some(Err("ENOMEM".into())), ..all_ok() };
        let c = choose(PathRequest::Auto, &p).unwrap();
        assert!(c.reason.starts_with("mlx5dv_devx_alloc_uar failed: ENOMEM"), "{}", c.reason);
        let p = Probe { hca_cap: None, ..all_ok() };
        assert!(choose(PathRequest::Auto, &p).unwrap().reason.contains("QUERY_HCA_CAP was not tried"));
    }

    #[test]
    fn cpu_executor_and_verbs_request_never_take_devx() {
        let p = Probe { gpu: false, ..all_ok() };
        let c = choose(PathRequest::Auto, &p).unwrap();
        assert_eq!(c.path, QueuePath::Verbs);
        assert!(c.reason.contains("cpu executor"), "{}", c.reason);
        assert!(choose(PathRequest::Devx, &p).is_err());
        let c = choose(PathRequest::Verbs, &all_ok()).unwrap();
        assert_eq!((c.path, c.reason.as_str()), (QueuePath::Verbs, "GDAKI_MLX5_QUEUES=verbs"));
    }

    #[test]
    fn request_from_the_environment_value() {
        assert_eq!(PathRequest::from_env_value(None).unwrap(), PathRequest::Auto);
        assert_eq!(PathRequest::from_env_value(Some("auto")).unwrap(), PathRequest::Auto);
        assert_eq!(PathRequest::from_env_value(Some("devx")).unwrap(), PathRequest::Devx);
        assert_eq!(PathRequest::from_env_value(Some("verbs")).unwrap(), PathRequest::Verbs);
        let e = PathRequest::from_env_value(Some("gpu")).unwrap_err().to_string();
        assert!(e.contains("GDAKI_MLX5_QUEUES") && e.contains("auto, devx or verbs"), "{e}");
    }

    #[test]
    fn paths_say_where_the_rings_are() {
        assert!(QueuePath::Devx(UmemPath::Dmabuf).to_string().contains("GPU memory"));
        assert!(QueuePath::Verbs.to_string().contains("host memory"));
    }
}
