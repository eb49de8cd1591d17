//! The host's RDMA devices and ports as `ibv_query_device`, `ibv_query_port` and `ibv_query_gid_table` report
//! them: what the `devices` example prints and what [`super::Mlx5Nic::open`] checks.

use std::fmt;

use gdaki_mlx5_sys as sys;

use super::endpoint::{LinkLayer, Mtu};
use super::gid::{GidEntry, GidType};
use super::verbs::{check, Context, DeviceList};
use crate::{Error, Result};

/// The atomic capability of a device (`enum ibv_atomic_cap`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AtomicCap {
    /// `IBV_ATOMIC_NONE`: no RDMA atomics (port channels' semaphores need them).
    None,
    /// `IBV_ATOMIC_HCA`: atomic towards this HCA's operations only (ConnectX).
    Hca,
    /// `IBV_ATOMIC_GLOB`: atomic towards the CPU's atomics too.
    Global,
}

/// A port's state (`enum ibv_port_state`), the ones that matter here.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PortState {
    /// `IBV_PORT_ACTIVE`: the only state in which a QP can connect.
    Active,
    /// `IBV_PORT_DOWN`, `INIT` (waiting for the subnet manager), `ARMED` or another; the verbs code.
    NotActive(u32),
}

/// One port of a device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortInfo {
    /// Port number (from 1).
    pub num: u8,
    /// State.
    pub state: PortState,
    /// Link layer; `None` for one verbs does not name.
    pub link: Option<LinkLayer>,
    /// LID (InfiniBand; 0 on Ethernet).
    pub lid: u16,
    /// Active MTU; `None` for a code verbs does not name.
    pub active_mtu: Option<Mtu>,
    /// The valid entries of its GID table (`ibv_query_gid_table`).
    pub gids: Vec<GidEntry>,
}

/// One device and its limits (`ibv_query_device`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Name (`mlx5_0`).
    pub name: String,
    /// Firmware version.
    pub fw_ver: String,
    /// Whether rdma-core's mlx5 provider drives it (`mlx5dv_is_supported`): only those can be used.
    pub mlx5: bool,
    /// Most QPs.
    pub max_qp: i32,
    /// Most WQEs per QP (`max_qp_wr`).
    pub max_qp_wr: i32,
    /// Most CQs.
    pub max_cq: i32,
    /// Most CQEs per CQ (`max_cqe`).
    pub max_cqe: i32,
    /// Largest MR, bytes.
    pub max_mr_size: u64,
    /// Outstanding RDMA READs/atomics a QP accepts as responder (`max_qp_rd_atom`).
    pub max_qp_rd_atom: i32,
    /// Outstanding RDMA READs/atomics a QP issues as requester (`max_qp_init_rd_atom`).
    pub max_qp_init_rd_atom: i32,
    /// Atomic capability; `None` for a code verbs does not name.
    pub atomic: Option<AtomicCap>,
    /// Its ports.
    pub ports: Vec<PortInfo>,
}

/// Lists every RDMA device of the host with its ports and GID tables.
///
/// # Errors
/// [`Error::Unavailable`] with the one line "no RDMA devices found: ..." when there is none; [`Error::Verbs`]
/// when opening or querying one fails.
pub fn list() -> Result<Vec<DeviceInfo>> {
    let names: Vec<String> = DeviceList::get()?.iter().map(|(_, n)| n).collect();
    names.iter().map(|n| query(&Context::open(n)?)).collect()
}

/// Queries an open device.
pub(super) fn query(ctx: &Context) -> Result<DeviceInfo> {
    let mut a = sys::ibv_device_attr::default();
    // SAFETY: `ctx` is open; `a` is a zeroed out-parameter of the right type.
    check(unsafe { sys::ibv_query_device(ctx.ptr, &mut a) }, format!("ibv_query_device({})", ctx.name))?;
    // SAFETY: the context's device is live while the context is.
    let mlx5 = unsafe { sys::mlx5dv_is_supported((*ctx.ptr).device) };
    let fw: Vec<u8> = a.fw_ver.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    let mut ports = Vec::with_capacity(a.phys_port_cnt.into());
    for num in 1..=a.phys_port_cnt {
        ports.push(query_port(ctx, num)?);
    }
    Ok(DeviceInfo {
        name: ctx.name.clone(),
        fw_ver: String::from_utf8_lossy(&fw).into_owned(),
        mlx5,
        max_qp: a.max_qp,
        max_qp_wr: a.max_qp_wr,
        max_cq: a.max_cq,
        max_cqe: a.max_cqe,
        max_mr_size: a.max_mr_size,
        max_qp_rd_atom: a.max_qp_rd_atom,
        max_qp_init_rd_atom: a.max_qp_init_rd_atom,
        atomic: match a.atomic_cap {
            sys::IBV_ATOMIC_NONE => Some(AtomicCap::None),
            sys::IBV_ATOMIC_HCA => Some(AtomicCap::Hca),
            sys::IBV_ATOMIC_GLOB => Some(AtomicCap::Global),
            _ => None,
        },
        ports,
    })
}

/// Queries port `num` of an open device and its GID table.
pub(super) fn query_port(ctx: &Context, num: u8) -> Result<PortInfo> {
    let mut p = sys::ibv_port_attr::default();
    // SAFETY: as `query`; `___ibv_query_port` is what the `ibv_query_port` macro calls (it zeroes the
    // compat fields the macro would).
    check(unsafe { sys::___ibv_query_port(ctx.ptr, num, &mut p) }, format!("ibv_query_port({}, {num})", ctx.name))?;
    let len = usize::try_from(p.gid_tbl_len).unwrap_or(0);
    let mut raw = vec![sys::ibv_gid_entry::default(); len];
    let gids = if len == 0 {
        Vec::new()
    } else {
        // SAFETY: `raw` holds `len` zeroed entries; the call fills at most that many.
        let n = unsafe { sys::ibv_query_gid_table(ctx.ptr, raw.as_mut_ptr(), len, 0) };
        if n < 0 {
            return Err(Error::Verbs { call: format!("ibv_query_gid_table({})", ctx.name), errno: (-n) as i32 });
        }
        raw.truncate(n as usize);
        raw.iter()
            .filter(|e| e.port_num == u32::from(num))
            .filter_map(|e| {
                Some(GidEntry {
                    index: e.gid_index,
                    // SAFETY: `raw` is the union's byte view, valid for every bit pattern.
                    gid: unsafe { e.gid.raw },
                    kind: GidType::from_verbs(e.gid_type)?,
                    ifindex: e.ndev_ifindex,
                })
            })
            .collect()
    };
    Ok(PortInfo {
        num,
        state: if p.state == sys::IBV_PORT_ACTIVE { PortState::Active } else { PortState::NotActive(p.state) },
        link: LinkLayer::from_verbs(p.link_layer),
        lid: p.lid,
        active_mtu: Mtu::from_verbs(p.active_mtu),
        gids,
    })
}

impl fmt::Display for DeviceInfo {
    /// Several lines: the device, its limits, then per port its state, link layer, LID, MTU and GID table.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{} (fw {}{})", self.name, self.fw_ver, if self.mlx5 { ", mlx5" } else { ", not mlx5: unusable" })?;
        writeln!(
            f,
            "  max_qp {}  max_qp_wr {}  max_cq {}  max_cqe {}  max_mr_size {}  rd_atom {}/{}  atomic {:?}",
            self.max_qp,
            self.max_qp_wr,
            self.max_cq,
            self.max_cqe,
            self.max_mr_size,
            self.max_qp_rd_atom,
            self.max_qp_init_rd_atom,
            self.atomic
        )?;
        for p in &self.ports {
            let state = match p.state {
                PortState::Active => "ACTIVE".to_string(),
                PortState::NotActive(s) => format!("not active (state {s})"),
            };
            writeln!(
                f,
                "  port {}: {state}, link {:?}, lid {:#x}, mtu {}",
                p.num,
                p.link,
                p.lid,
                p.active_mtu.map_or(0, Mtu::bytes)
            )?;
            for g in &p.gids {
                writeln!(f, "    gid[{}] {} {:?} ifindex {}", g.index, g.ip(), g.kind, g.ifindex)?;
            }
        }
        Ok(())
    }
}
