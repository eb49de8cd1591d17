//! The DevX path of the mlx5 backend: CQs and RC QPs made with PRM commands (the builders of
//! [`crate::nic::devx`], the same ones the emulated NIC's firmware runs) sent through rdma-core's DevX calls,
//! with their rings and doorbell records in GPU memory registered as umems, and a UAR of their own. This is
//! how DOCA GPUNetIO and NVSHMEM IBGDA create their objects; only the [`Transport`] differs from the emulated
//! NIC's.
//!
//! | step | calls | memory |
//! |---|---|---|
//! | context | `mlx5dv_open_device(MLX5DV_CONTEXT_FLAGS_DEVX)` | |
//! | capabilities | QUERY_HCA_CAP (`mlx5dv_devx_general_cmd`), `mlx5dv_devx_query_eqn(0)` | |
//! | UAR | `mlx5dv_devx_alloc_uar` (BlueFlame type, else non-cached), `cuMemHostRegister(IOMEMORY)` of its page | the NIC's BAR |
//! | ring + dbrec | `cuMemAlloc`, `cuMemGetHandleForAddressRange(DMA_BUF_FD)` + `mlx5dv_devx_umem_reg_ex(DMABUF)`, else `mlx5dv_devx_umem_reg_ex` on the GPU address (nvidia-peermem) | GPU |
//! | CQ | CREATE_CQ (`mlx5dv_devx_obj_create`) | |
//! | QP | `mlx5dv_init_obj(PD)` for the PD number, CREATE_QP | |
//! | connect | RST2INIT, INIT2RTR, RTR2RTS (`mlx5dv_devx_obj_modify`), 2ERR when INIT2RTR or RTR2RTS fails; on RoCE the peer's MAC from `ibv_create_ah` + `mlx5dv_init_obj(AH)` | |
//! | state | QUERY_QP (`mlx5dv_devx_obj_query`) | |
//! | drop | `mlx5dv_devx_obj_destroy`, `mlx5dv_devx_umem_dereg`, `cuMemFree`, `mlx5dv_devx_free_uar` | |
//!
//! Umems are registered with 4 KiB pages only (`pgsz_bitmap` = 4096), so that the contexts' page-size fields,
//! which the builders leave 0 (= 4 KiB), match the umem. Facts (signatures, flags, the dmabuf offset meaning of
//! `addr`) are from rdma-core's `mlx5dv.h` and its `mlx5dv_devx_*` man pages.

use std::mem::ManuallyDrop;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;
use std::sync::Arc;

use gdaki_mlx5_sys as sys;
use gdaki_shared::handle::{CqHandle, Placement, QpHandle};
use gdaki_shared::prm::cmd::{cmd_hca_cap, mbox_in, mbox_out, opcode, qpc, status};
use gdaki_shared::prm::cqe::{Cqe64, CQE_SIZE};
use gdaki_shared::prm::uar::UAR_PAGE_SIZE;
use gdaki_shared::prm::wqe::WQEBB;

use super::endpoint::{Endpoint, LinkLayer};
use super::map::{Mapped, Mapper, PAGE};
use super::path::{ProbeResult, UmemPath};
use super::verbs::{check, errno, nonnull, Context};
use super::{attr, Mlx5Nic};
use crate::cuda::{DeviceBuffer, Gpu};
use crate::nic::devx::{self, AddressPath, Grh, HcaCap, Init2Rtr, QpAttr, Rq, Rst2Init, Rtr2Rts, Transport};
use crate::nic::emu::QpState;
use crate::{Error, Result};

// ---------------------------------------------------------------------------------------------------------
// Pure parts (unit-tested without hardware).

/// What a DevX call's return and output mailbox mean. `call` is the rdma-core function, `ok` whether it
/// returned success, `errno` what it left; the command's opcode comes from `inbox` and the firmware's status
/// and syndrome from `outbox` (which the caller zeroed before the call).
///
/// # Errors
/// [`Error::DevxCmd`] with `via = (call, errno)` when the output's status is not OK (the kernel passes the
/// firmware's mailbox back with EREMOTEIO); [`Error::Verbs`] naming the call and the command when the call
/// failed before the firmware answered (e.g. EPERM, EINVAL from the kernel, EOPNOTSUPP without DevX).
pub(super) fn cmd_result(call: &str, ok: bool, errno: i32, inbox: &[u8], outbox: &[u8]) -> Result<()> {
    let op = mbox_in::OPCODE.try_get(inbox).map_or(0, |v| v as u16);
    let st = mbox_out::STATUS.try_get(outbox).unwrap_or(0) as u8;
    if st != status::OK {
        let syndrome = mbox_out::SYNDROME.try_get(outbox).unwrap_or(0) as u32;
        return Err(Error::DevxCmd { opcode: op, status: st, syndrome, detail: None, via: Some((call.into(), errno)) });
    }
    if !ok {
        let name = opcode::name(op).map_or_else(|| format!("opcode {op:#x}"), str::to_string);
        return Err(Error::Verbs { call: format!("{call}({name})"), errno });
    }
    Ok(())
}

/// The errno of a DevX call that returns an int (0, or -1 with `errno`, or the errno itself, as
/// `mlx5dv_devx_obj_modify(3)` documents), `None` for success.
fn ret_errno(ret: i32) -> Option<i32> {
    match ret {
        0 => None,
        -1 => Some(errno()),
        e => Some(e.abs()),
    }
}

/// `log2(n)` for a power of two, else `None`.
pub(super) fn log2_exact(n: u32) -> Option<u8> {
    n.is_power_of_two().then(|| n.trailing_zeros() as u8)
}

/// `qpc.ts_format` for a device whose `cmd_hca_cap.sq_ts_format` is `cap`: the one format a device that has
/// one requires, DEFAULT where it has both (the Linux kernel's choice for its own QPs).
pub(super) fn qp_ts_format(cap: u8) -> u8 {
    use cmd_hca_cap::ts_format_cap as c;
    match cap {
        c::FREE_RUNNING => qpc::ts_format::FREE_RUNNING,
        c::REAL_TIME => qpc::ts_format::REAL_TIME,
        _ => qpc::ts_format::DEFAULT,
    }
}

/// The kind of UAR `mlx5dv_devx_alloc_uar` gave (its `flags`: `MLX5DV_UAR_ALLOC_TYPE_BF` 0, `_NC` 1, from
/// `mlx5_user_ioctl_verbs.h`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum UarKind {
    /// Write-combining, with BlueFlame buffers.
    BlueFlame,
    /// Non-cached: doorbells only.
    NonCached,
}

impl UarKind {
    /// The `flags` value of `mlx5dv_devx_alloc_uar`.
    fn flags(self) -> u32 {
        match self {
            Self::BlueFlame => 0,
            Self::NonCached => 1,
        }
    }
}

/// `QpHandle::bf_size` for a UAR of `kind` on a device with `cmd_hca_cap.bf` = `bf` and
/// `log_bf_reg_size`: half the BlueFlame register (its two halves alternate, as rdma-core's provider sizes
/// `mlx5dv_qp.bf.size`), 0 (doorbell only) on a non-cached UAR or a device without BlueFlame.
pub(super) fn bf_size(kind: UarKind, bf: bool, log_bf_reg_size: u8) -> u32 {
    match kind {
        UarKind::BlueFlame if bf && (1..=16).contains(&log_bf_reg_size) => (1u32 << log_bf_reg_size) / 2,
        _ => 0,
    }
}

/// The UDP source port of a RoCE v2 connection between QPs `local` and `remote`: in the dynamic range
/// 0xC000..=0xFFFF, spread by the QP numbers so that connections take different paths of a multipath fabric.
pub(super) fn udp_sport(local: u32, remote: u32) -> u16 {
    let h = (local ^ remote.rotate_left(7)).wrapping_mul(0x9e37_79b1);
    0xc000 | ((h >> 18) as u16 & 0x3fff)
}

/// `log2` of the READs/atomics in flight a QP asks for (`qpc.log_sra_max`, `log_rra_max`: 3 bits) from the
/// device's `log_max_ra_req_qp` / `log_max_ra_res_qp`.
pub(super) fn log_ra(cap: u64) -> u8 {
    cap.min(7) as u8
}

/// Where a ring and its doorbell record sit in one GPU allocation registered as one umem: the ring at offset
/// 0, the dbrec right after it (64-byte aligned), the umem a whole number of 4 KiB pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct QueueLayout {
    /// The dbrec's byte offset.
    pub(super) dbrec: u64,
    /// The umem's bytes.
    pub(super) bytes: u64,
}

/// The layout of a ring of `ring_bytes`.
pub(super) fn queue_layout(ring_bytes: u64) -> QueueLayout {
    let dbrec = ring_bytes.next_multiple_of(64);
    QueueLayout { dbrec, bytes: (dbrec + 64).next_multiple_of(PAGE) }
}

/// The device capabilities the DevX path uses (QUERY_HCA_CAP, general, current).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct DevxCaps {
    pub(super) log_max_cq_sz: u8,
    pub(super) log_max_qp_sz: u8,
    pub(super) log_max_msg: u8,
    pub(super) log_max_ra_req_qp: u8,
    pub(super) log_max_ra_res_qp: u8,
    pub(super) ts_format: u8,
    pub(super) bf: bool,
    pub(super) log_bf_reg_size: u8,
}

impl DevxCaps {
    /// The fields of `cap`.
    ///
    /// # Errors
    /// A text naming what the DevX path lacks (RC; a nonzero `log_max_qp_sz`/`log_max_cq_sz`).
    pub(super) fn from_cap(cap: &HcaCap) -> std::result::Result<Self, String> {
        use cmd_hca_cap as c;
        let g = |f| cap.get(f) as u8;
        if cap.get(c::RC) == 0 {
            return Err("the device reports no RC transport (cmd_hca_cap.rc = 0)".into());
        }
        let caps = Self {
            log_max_cq_sz: g(c::LOG_MAX_CQ_SZ),
            log_max_qp_sz: g(c::LOG_MAX_QP_SZ),
            log_max_msg: g(c::LOG_MAX_MSG),
            log_max_ra_req_qp: g(c::LOG_MAX_RA_REQ_QP),
            log_max_ra_res_qp: g(c::LOG_MAX_RA_RES_QP),
            ts_format: qp_ts_format(g(c::SQ_TS_FORMAT)),
            bf: cap.get(c::BF) != 0,
            log_bf_reg_size: g(c::LOG_BF_REG_SIZE),
        };
        if caps.log_max_cq_sz == 0 || caps.log_max_qp_sz == 0 {
            return Err(format!(
                "implausible limits: log_max_cq_sz {}, log_max_qp_sz {}",
                caps.log_max_cq_sz, caps.log_max_qp_sz
            ));
        }
        Ok(caps)
    }
}

// ---------------------------------------------------------------------------------------------------------
// The transport.

/// A device context opened with `mlx5dv_open_device(MLX5DV_CONTEXT_FLAGS_DEVX)` as a DevX [`Transport`]:
/// every call is the `mlx5dv_devx_*` call of its name. Borrowed from the NIC that owns the context
/// ([`Mlx5Nic::devx`]).
#[derive(Clone, Copy, Debug)]
pub struct DevxContext<'a> {
    ctx: &'a Context,
}

/// A firmware object made through a [`DevxContext`] (`struct mlx5dv_devx_obj`): destroyed with
/// [`Transport::obj_destroy`], or on drop (a failure then only logged).
#[derive(Debug)]
pub struct DevxObj {
    ptr: NonNull<sys::mlx5dv_devx_obj>,
    /// The opcode that created it, for error texts.
    opcode: u16,
}

// SAFETY: DevX objects may be used from any thread (rdma-core's calls are ioctls on the object's handle); the
// pointer is freed once, by `destroy` or `Drop`.
unsafe impl Send for DevxObj {}
// SAFETY: as above; every call through `&DevxObj` is a thread-safe ioctl.
unsafe impl Sync for DevxObj {}

impl DevxObj {
    /// `mlx5dv_devx_obj_destroy`; the kernel builds the destroying command from the creating one.
    fn destroy(self) -> Result<()> {
        let me = ManuallyDrop::new(self);
        // SAFETY: `ptr` came from `mlx5dv_devx_obj_create` and is destroyed once (`me` is never dropped).
        let ret = unsafe { sys::mlx5dv_devx_obj_destroy(me.ptr.as_ptr()) };
        match ret_errno(ret) {
            None => Ok(()),
            Some(e) => Err(Error::Verbs { call: format!("mlx5dv_devx_obj_destroy({})", what(me.opcode)), errno: e }),
        }
    }
}

impl Drop for DevxObj {
    fn drop(&mut self) {
        // SAFETY: as in `destroy`; this runs only when `destroy` did not.
        if let Some(e) = ret_errno(unsafe { sys::mlx5dv_devx_obj_destroy(self.ptr.as_ptr()) }) {
            tracing::warn!("mlx5dv_devx_obj_destroy({}): {}", what(self.opcode), std::io::Error::from_raw_os_error(e));
        }
    }
}

/// "the object of CREATE_QP".
fn what(op: u16) -> String {
    format!("object of {}", opcode::name(op).unwrap_or("a command"))
}

impl DevxContext<'_> {
    /// Runs one call that returns an int over `inbox`/`outbox`.
    fn run(&self, call: &str, inbox: &[u8], outbox: &mut [u8], f: impl FnOnce(&mut [u8]) -> i32) -> Result<()> {
        outbox.fill(0);
        let e = ret_errno(f(outbox));
        cmd_result(call, e.is_none(), e.unwrap_or(0), inbox, outbox)
    }
}

impl Transport for DevxContext<'_> {
    type Obj = DevxObj;

    fn obj_create(&self, inbox: &[u8], outbox: &mut [u8]) -> Result<DevxObj> {
        outbox.fill(0);
        // SAFETY: the context is a live DevX context; `inbox` and `outbox` are valid for their lengths, and
        // rdma-core reads at most `inbox.len()` and writes at most `outbox.len()` bytes.
        let p = unsafe {
            sys::mlx5dv_devx_obj_create(
                self.ctx.ptr,
                inbox.as_ptr().cast(),
                inbox.len(),
                outbox.as_mut_ptr().cast(),
                outbox.len(),
            )
        };
        let e = if p.is_null() { errno() } else { 0 };
        let op = mbox_in::OPCODE.try_get(inbox).map_or(0, |v| v as u16);
        let result = cmd_result("mlx5dv_devx_obj_create", !p.is_null(), e, inbox, outbox);
        match (NonNull::new(p), result) {
            (Some(ptr), Ok(())) => Ok(DevxObj { ptr, opcode: op }),
            // An object whose output says failure cannot happen with rdma-core, but would be destroyed here.
            (Some(ptr), Err(e)) => {
                drop(DevxObj { ptr, opcode: op });
                Err(e)
            }
            (None, Err(e)) => Err(e),
            (None, Ok(())) => Err(Error::Verbs { call: "mlx5dv_devx_obj_create".into(), errno: e }),
        }
    }

    fn obj_modify(&self, obj: &DevxObj, inbox: &[u8], outbox: &mut [u8]) -> Result<()> {
        self.run("mlx5dv_devx_obj_modify", inbox, outbox, |out| {
            // SAFETY: `obj` is live; the buffers are valid for their lengths.
            unsafe {
                sys::mlx5dv_devx_obj_modify(
                    obj.ptr.as_ptr(),
                    inbox.as_ptr().cast(),
                    inbox.len(),
                    out.as_mut_ptr().cast(),
                    out.len(),
                )
            }
        })
    }

    fn obj_query(&self, obj: &DevxObj, inbox: &[u8], outbox: &mut [u8]) -> Result<()> {
        self.run("mlx5dv_devx_obj_query", inbox, outbox, |out| {
            // SAFETY: `obj` is live; the buffers are valid for their lengths.
            unsafe {
                sys::mlx5dv_devx_obj_query(
                    obj.ptr.as_ptr(),
                    inbox.as_ptr().cast(),
                    inbox.len(),
                    out.as_mut_ptr().cast(),
                    out.len(),
                )
            }
        })
    }

    fn obj_destroy(&self, obj: DevxObj) -> Result<()> {
        obj.destroy()
    }

    fn general_cmd(&self, inbox: &[u8], outbox: &mut [u8]) -> Result<()> {
        self.run("mlx5dv_devx_general_cmd", inbox, outbox, |out| {
            // SAFETY: the context is a live DevX context; the buffers are valid for their lengths.
            unsafe {
                sys::mlx5dv_devx_general_cmd(
                    self.ctx.ptr,
                    inbox.as_ptr().cast(),
                    inbox.len(),
                    out.as_mut_ptr().cast(),
                    out.len(),
                )
            }
        })
    }
}

// ---------------------------------------------------------------------------------------------------------
// UAR, umems, GPU queue memory.

/// A UAR of our own (`mlx5dv_devx_alloc_uar`), freed on drop (`mlx5dv_devx_free_uar`).
#[derive(Debug)]
pub(super) struct Uar {
    ptr: NonNull<sys::mlx5dv_devx_uar>,
    pub(super) kind: UarKind,
    /// `page_id`: what `cqc.uar_page` and `qpc.uar_page` name.
    pub(super) page_id: u32,
    /// `base_addr`: rdma-core's mmap of the UAR page.
    pub(super) base: u64,
    /// `reg_addr`: the doorbell/BlueFlame register, inside the page.
    pub(super) reg: u64,
}

// SAFETY: the UAR is a mapping of device memory plus a kernel handle, usable from any thread; freed once.
unsafe impl Send for Uar {}
// SAFETY: as above; nothing is mutated through `&Uar`.
unsafe impl Sync for Uar {}

impl Uar {
    /// A BlueFlame UAR, else a non-cached one.
    ///
    /// # Errors
    /// [`Error::Verbs`] naming both attempts' errnos; [`Error::Unavailable`] for a register outside the page.
    fn alloc(ctx: &Context) -> Result<Self> {
        let mut failed = Vec::new();
        for kind in [UarKind::BlueFlame, UarKind::NonCached] {
            // SAFETY: the context is a live DevX context.
            let p = unsafe { sys::mlx5dv_devx_alloc_uar(ctx.ptr, kind.flags()) };
            let Some(ptr) = NonNull::new(p) else {
                failed.push(format!("{kind:?}: {}", std::io::Error::from_raw_os_error(errno())));
                continue;
            };
            // SAFETY: `ptr` is the live UAR just allocated.
            let u = unsafe { *ptr.as_ptr() };
            let uar = Self { ptr, kind, page_id: u.page_id, base: u.base_addr as u64, reg: u.reg_addr as u64 };
            if !uar.base.is_multiple_of(PAGE) || uar.reg < uar.base || uar.reg + 64 > uar.base + UAR_PAGE_SIZE as u64 {
                return Err(Error::Unavailable(format!(
                    "mlx5dv_devx_alloc_uar gave register {:#x} outside page {:#x}",
                    uar.reg, uar.base
                )));
            }
            return Ok(uar);
        }
        Err(Error::Verbs { call: format!("mlx5dv_devx_alloc_uar ({})", failed.join("; ")), errno: errno() })
    }
}

impl Drop for Uar {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `mlx5dv_devx_alloc_uar` and is freed once; no object uses it any more (the
        // NIC owning it outlives its CQs and QPs).
        unsafe { sys::mlx5dv_devx_free_uar(self.ptr.as_ptr()) };
    }
}

/// A registered umem (`mlx5dv_devx_umem_reg_ex`), deregistered on drop.
#[derive(Debug)]
pub(super) struct Umem {
    ptr: NonNull<sys::mlx5dv_devx_umem>,
    pub(super) id: u32,
}

// SAFETY: a kernel handle usable from any thread; freed once.
unsafe impl Send for Umem {}
// SAFETY: as above.
unsafe impl Sync for Umem {}

impl Drop for Umem {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `mlx5dv_devx_umem_reg_ex`; the objects using it were destroyed before.
        if let Some(e) = ret_errno(unsafe { sys::mlx5dv_devx_umem_dereg(self.ptr.as_ptr()) }) {
            tracing::warn!("mlx5dv_devx_umem_dereg: {}", std::io::Error::from_raw_os_error(e));
        }
    }
}

/// Registers `bytes` of GPU memory at `addr` (4 KiB aligned, whole pages) as a umem, the NIC allowed to
/// write it (`IBV_ACCESS_LOCAL_WRITE`), 4 KiB pages.
///
/// # Safety
/// The memory must stay allocated until the umem is dropped.
///
/// # Errors
/// The CUDA driver's error exporting the dmabuf; [`Error::Verbs`] naming `mlx5dv_devx_umem_reg_ex` and the
/// errno (EFAULT/EINVAL for peermem without the nvidia-peermem module, EOPNOTSUPP for a kernel without dmabuf
/// umems).
unsafe fn reg_umem(ctx: &Context, gpu: &Gpu, path: UmemPath, addr: u64, bytes: u64) -> Result<Umem> {
    let size = usize::try_from(bytes).map_err(|_| Error::InvalidArgument(format!("umem of {bytes} bytes")))?;
    let mut inp =
        sys::mlx5dv_devx_umem_in { size, access: sys::IBV_ACCESS_LOCAL_WRITE, pgsz_bitmap: PAGE, ..Default::default() };
    let (fd, call) = match path {
        UmemPath::Dmabuf => {
            let fd = gpu.dmabuf_fd(addr, size)?;
            // With a dmabuf, `addr` is the offset into it (mlx5dv_devx_umem_reg(3)).
            inp.addr = std::ptr::null_mut();
            inp.comp_mask = u64::from(sys::MLX5DV_UMEM_MASK_DMABUF);
            inp.dmabuf_fd = fd.as_raw_fd();
            (Some(fd), "mlx5dv_devx_umem_reg_ex(dmabuf)")
        }
        UmemPath::Peermem => {
            inp.addr = addr as *mut _;
            (None, "mlx5dv_devx_umem_reg_ex(GPU address, nvidia-peermem)")
        }
    };
    // SAFETY: the context is a live DevX context; `inp` is filled; the memory stays allocated (the caller's
    // contract). The umem holds its own reference to the dmabuf, so `fd` may be closed after the call.
    let p = nonnull(unsafe { sys::mlx5dv_devx_umem_reg_ex(ctx.ptr, &mut inp) }, call)?;
    drop(fd);
    // SAFETY: `p` is the live umem just registered.
    let id = unsafe { (*p).umem_id };
    // `nonnull` returned a non-null pointer.
    Ok(Umem { ptr: NonNull::new(p).expect("checked non-null"), id })
}

/// A ring and its dbrec in GPU memory, registered as one umem ([`queue_layout`]). Drops the umem before the
/// memory.
#[derive(Debug)]
pub(super) struct GpuQueue {
    pub(super) umem: Umem,
    /// The ring's GPU address (4 KiB aligned); the dbrec is at `base + layout.dbrec`.
    pub(super) base: u64,
    pub(super) layout: QueueLayout,
    _mem: DeviceBuffer,
}

impl GpuQueue {
    /// Allocates a queue of `ring_bytes`, copies `ring_image` (if any) to the ring's start (the rest, dbrec
    /// included, zero), and registers it.
    ///
    /// # Errors
    /// The CUDA driver's (allocation, copy, dmabuf); [`reg_umem`]'s.
    fn new(ctx: &Context, gpu: &Gpu, path: UmemPath, ring_bytes: u64, ring_image: Option<&[u8]>) -> Result<Self> {
        let layout = queue_layout(ring_bytes);
        // One page more, so that a 4 KiB aligned start fits whatever alignment cuMemAlloc gave.
        let mem =
            gpu.alloc_device(usize::try_from(layout.bytes + PAGE).map_err(|_| Error::OutOfMemory(usize::MAX))?)?;
        let base = mem.device_addr().next_multiple_of(PAGE);
        let off = (base - mem.device_addr()) as usize;
        if let Some(img) = ring_image {
            mem.copy_from_host(off, img)?;
        }
        // SAFETY: `base..base + layout.bytes` lies inside `mem`, which the returned value owns and drops after
        // the umem.
        let umem = unsafe { reg_umem(ctx, gpu, path, base, layout.bytes) }?;
        Ok(Self { umem, base, layout, _mem: mem })
    }

    /// The dbrec's GPU address.
    pub(super) fn dbrec(&self) -> u64 {
        self.base + self.layout.dbrec
    }
}

// ---------------------------------------------------------------------------------------------------------
// The NIC's DevX resources, the probes, and the objects.

/// What a NIC on the DevX path holds: the UAR (and its GPU mapping), the capabilities, the EQ number CQs
/// name, and how umems are registered. The mapping is declared first, so it is undone before the UAR goes.
#[derive(Debug)]
pub(super) struct DevxRes {
    pub(super) uar_map: Mapped,
    pub(super) uar: Uar,
    pub(super) caps: DevxCaps,
    pub(super) eqn: u32,
    pub(super) umem: UmemPath,
}

/// What [`probe`] found: the results for [`super::path::Probe`], and the resources when every step up to the
/// umem succeeded.
pub(super) struct Probed {
    pub(super) hca_cap: Option<ProbeResult>,
    pub(super) uar: Option<ProbeResult>,
    pub(super) dmabuf: Option<ProbeResult>,
    pub(super) peermem: Option<ProbeResult>,
    pub(super) res: Option<DevxRes>,
}

/// Runs the DevX probes on a DevX context for device code on `gpu` (the order of [`super::path`]); stops at
/// the first failure.
pub(super) fn probe(ctx: &Context, map: &Mapper, gpu: &Gpu) -> Probed {
    let mut p = Probed { hca_cap: None, uar: None, dmabuf: None, peermem: None, res: None };
    let t = DevxContext { ctx };
    let caps =
        devx::query_hca_cap(&t).map_err(|e| e.to_string()).and_then(|cap| DevxCaps::from_cap(&cap)).and_then(|caps| {
            let mut eqn = 0u32;
            // SAFETY: the context is a live DevX context; the call writes one u32.
            let ret = unsafe { sys::mlx5dv_devx_query_eqn(ctx.ptr, 0, &mut eqn) };
            check(ret, "mlx5dv_devx_query_eqn(0)").map_err(|e| e.to_string())?;
            Ok((caps, eqn))
        });
    p.hca_cap = Some(caps.as_ref().map(|_| ()).map_err(Clone::clone));
    let Ok((caps, eqn)) = caps else { return p };
    let uar = Uar::alloc(ctx).and_then(|uar| {
        // SAFETY: the UAR page is rdma-core's mmap of device memory, mapped until `mlx5dv_devx_free_uar`, which
        // runs after this mapping is dropped (`DevxRes`'s field order).
        let m = unsafe { map.map(uar.base, UAR_PAGE_SIZE as u64, true) }?;
        Ok((uar, m))
    });
    p.uar = Some(uar.as_ref().map(|_| ()).map_err(|e| e.to_string()));
    let Ok((uar, uar_map)) = uar else { return p };
    let mut umem = None;
    for path in [UmemPath::Dmabuf, UmemPath::Peermem] {
        let r = GpuQueue::new(ctx, gpu, path, PAGE - 128, None).map(drop).map_err(|e| e.to_string());
        let ok = r.is_ok();
        match path {
            UmemPath::Dmabuf => p.dmabuf = Some(r),
            UmemPath::Peermem => p.peermem = Some(r),
        }
        if ok {
            umem = Some(path);
            break;
        }
    }
    if let Some(umem) = umem {
        p.res = Some(DevxRes { uar_map, uar, caps, eqn, umem });
    }
    p
}

impl Mlx5Nic {
    /// The NIC's context as a DevX [`Transport`], when it was opened with `MLX5DV_CONTEXT_FLAGS_DEVX` (the
    /// `gpu` executor, unless `GDAKI_MLX5_QUEUES=verbs`). Commands sent through it run on the device's
    /// firmware as they are: [`crate::nic::devx`]'s builders make them.
    pub fn devx(&self) -> Option<DevxContext<'_>> {
        self.ctx.devx.then_some(DevxContext { ctx: &self.ctx })
    }

    /// The DevX resources; an error for a NIC on the verbs path.
    fn devx_res(&self) -> Result<(&DevxRes, DevxContext<'_>, &Arc<Gpu>)> {
        match (&self.devx, self.devx(), self.map.gpu()) {
            (Some(r), Some(t), Some(g)) => Ok((r, t, g)),
            _ => Err(Error::InvalidArgument(format!("{} is not on the DevX path", self.ctx.name))),
        }
    }

    /// A CQ of `ncqe` 64-byte CQEs on the DevX path: ring and dbrec in GPU memory (the ring filled with
    /// [`Cqe64::INVALID`], the dbrec zero), one umem, CREATE_CQ on the NIC's UAR and EQ 0's number.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a size that is not a power of two within `2^log_max_cq_sz`; the CUDA
    /// driver's; [`Error::Verbs`] for the umem; [`Error::DevxCmd`] for CREATE_CQ.
    pub(super) fn create_cq_devx(&self, ncqe: u32) -> Result<(DevxObj, GpuQueue, CqHandle)> {
        let (res, t, gpu) = self.devx_res()?;
        let log = log2_exact(ncqe).filter(|&l| l <= res.caps.log_max_cq_sz).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "CQ of {ncqe} entries: DevX CQs are a power of two of at most 2^{}",
                res.caps.log_max_cq_sz
            ))
        })?;
        let image: Vec<u8> = (0..ncqe).flat_map(|_| bytemuck::bytes_of(&Cqe64::INVALID).to_vec()).collect();
        let q = GpuQueue::new(&self.ctx, gpu, res.umem, u64::from(ncqe) * CQE_SIZE as u64, Some(&image))?;
        let eqn = u8::try_from(res.eqn)
            .map_err(|_| Error::Unavailable(format!("EQ number {} does not fit cqc.c_eqn (8 bits)", res.eqn)))?;
        let a = devx::CqAttr {
            log_cq_size: log,
            uar_page: res.uar.page_id,
            c_eqn: eqn,
            umem_id: q.umem.id,
            umem_offset: 0,
            dbr_umem_id: q.umem.id,
            dbr_offset: q.layout.dbrec,
        };
        let c = devx::create_cq(&t, &a)?;
        let handle = CqHandle {
            buf: q.base,
            dbrec: q.dbrec(),
            ncqe,
            cqn: c.id,
            cons_index: 0,
            placement: Placement::GPU,
            pad: 0,
        };
        Ok((c.obj, q, handle))
    }

    /// An RC QP on the DevX path in RST: SQ of `wqe_cnt` WQEBBs and dbrec in GPU memory (zero), no receive
    /// queue, one umem, CREATE_QP in PD `pd` (its number from `mlx5dv_init_obj(MLX5DV_OBJ_PD)`) completing
    /// into CQ `cq` both ways, on the NIC's UAR; the handle's register is the UAR's `reg_addr` as the GPU
    /// sees it.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a size device code cannot post to or over `2^log_max_qp_sz`
    /// ([`attr::sq_log2`]); [`Error::Verbs`] for `mlx5dv_init_obj(PD)` or the umem; the CUDA driver's; [`Error::DevxCmd`] for
    /// CREATE_QP.
    pub(super) fn create_qp_devx(
        &self,
        pd: *mut sys::ibv_pd,
        cq: &CqHandle,
        wqe_cnt: u32,
    ) -> Result<(DevxObj, GpuQueue, QpHandle)> {
        let (res, t, gpu) = self.devx_res()?;
        let log = attr::sq_log2(wqe_cnt, 1u32.checked_shl(res.caps.log_max_qp_sz.into()).unwrap_or(u32::MAX))?;
        let mut dv = sys::mlx5dv_pd::default();
        let mut obj = sys::mlx5dv_obj::default();
        obj.pd.in_ = pd;
        obj.pd.out = &mut dv;
        // SAFETY: `obj.pd` names a live PD of this context and a zeroed `mlx5dv_pd` to fill.
        check(unsafe { sys::mlx5dv_init_obj(&mut obj, sys::MLX5DV_OBJ_PD as u64) }, "mlx5dv_init_obj(PD)")?;
        let q = GpuQueue::new(&self.ctx, gpu, res.umem, u64::from(wqe_cnt) * WQEBB as u64, None)?;
        let a = QpAttr {
            pd: dv.pdn,
            log_sq_size: log,
            rq: Rq::None,
            cqn_snd: cq.cqn,
            cqn_rcv: cq.cqn,
            uar_page: res.uar.page_id,
            log_msg_max: res.caps.log_max_msg,
            ts_format: res.caps.ts_format,
            wq_umem_id: q.umem.id,
            wq_umem_offset: 0,
            dbr_umem_id: q.umem.id,
            dbr_offset: q.layout.dbrec,
        };
        let c = devx::create_qp(&t, &a)?;
        let handle = QpHandle {
            sq_buf: q.base,
            dbrec: q.dbrec(),
            bf_reg: res.uar_map.device_addr + (res.uar.reg - res.uar.base),
            bf_size: bf_size(res.uar.kind, res.caps.bf, res.caps.log_bf_reg_size),
            wqe_cnt,
            qpn: c.id,
            cq: *cq,
            placement: Placement::GPU,
            ..QpHandle::default()
        };
        Ok((c.obj, q, handle))
    }

    /// The peer's MAC (or the next hop's) for RoCE: an address handle to its GID from our GID index
    /// (`ibv_create_ah`, the kernel resolves the neighbour), read back with `mlx5dv_init_obj(MLX5DV_OBJ_AH)`,
    /// destroyed.
    ///
    /// # Errors
    /// [`Error::Verbs`] for `ibv_create_ah` (e.g. no route or neighbour for the GID) or `mlx5dv_init_obj(AH)`.
    fn roce_rmac(&self, pd: *mut sys::ibv_pd, local: &Endpoint, remote: &Endpoint) -> Result<[u8; 6]> {
        let (mut a, _) = attr::rtr(local, remote, self.port, 1)?;
        // SAFETY: `pd` is a live PD of this context; `a.ah_attr` is a zeroed, filled address vector.
        let ah = nonnull(unsafe { sys::ibv_create_ah(pd, &mut a.ah_attr) }, "ibv_create_ah(peer GID)")?;
        let mut dv = sys::mlx5dv_ah::default();
        let mut obj = sys::mlx5dv_obj::default();
        obj.ah.in_ = ah;
        obj.ah.out = &mut dv;
        // SAFETY: `obj.ah` names the live AH and a zeroed `mlx5dv_ah` to fill.
        let r = check(unsafe { sys::mlx5dv_init_obj(&mut obj, sys::MLX5DV_OBJ_AH as u64) }, "mlx5dv_init_obj(AH)")
            .and_then(|()| {
                if dv.av.is_null() {
                    return Err(Error::Unavailable("mlx5dv_init_obj(AH) gave no address vector".into()));
                }
                // SAFETY: `dv.av` points into the live AH, which is destroyed only below.
                Ok(unsafe { (*dv.av).rmac })
            });
        // SAFETY: `ah` was created above and is destroyed once.
        if let Err(e) = check(unsafe { sys::ibv_destroy_ah(ah) }, "ibv_destroy_ah") {
            tracing::warn!("mlx5: {e}");
        }
        r
    }

    /// Moves DevX QP `obj` (number `local.qpn`) RST → INIT → RTR → RTS towards `remote`, with the verbs path's
    /// attributes ([`attr`]'s constants) as PRM fields: remote READ/WRITE/atomics, the smaller MTU, the
    /// device's READ/atomic depths, on InfiniBand the peer's LID, on RoCE v2 its GID, MAC and a UDP source port.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for endpoints of two link layers or an InfiniBand peer with LID 0;
    /// [`roce_rmac`](Self::roce_rmac)'s; [`Error::DevxCmd`] naming the transition that the firmware refused,
    /// after which a QP that got past RST2INIT is in ERR ([`devx::to_err_on_failure`]).
    pub(super) fn connect_devx(
        &self,
        obj: &DevxObj,
        pd: *mut sys::ibv_pd,
        local: &Endpoint,
        remote: &Endpoint,
    ) -> Result<()> {
        let (res, t, _) = self.devx_res()?;
        // The same checks as the verbs path (link layers, LID).
        attr::rtr(local, remote, self.port, 1)?;
        let path = match remote.link {
            LinkLayer::InfiniBand => AddressPath::Ib { rlid: remote.lid, sl: 0, grh: None },
            LinkLayer::Ethernet => AddressPath::RoceV2 {
                grh: Grh {
                    rgid: remote.gid,
                    src_addr_index: local.gid_index,
                    hop_limit: attr::HOP_LIMIT,
                    tclass: 0,
                    flow_label: 0,
                },
                rmac: self.roce_rmac(pd, local, remote)?,
                udp_sport: udp_sport(local.qpn, remote.qpn),
                eth_prio: 0,
            },
        };
        let port = self.port;
        let init = Rst2Init { port, pkey_index: 0, remote_read: true, remote_write: true, remote_atomic: true };
        devx::rst2init(&t, obj, local.qpn, &init)?;
        let rtr = Init2Rtr {
            remote_qpn: remote.qpn,
            rq_psn: remote.psn,
            mtu: local.mtu.min(remote.mtu) as u8,
            log_msg_max: res.caps.log_max_msg,
            min_rnr_nak: attr::MIN_RNR_TIMER,
            log_rra_max: log_ra(res.caps.log_max_ra_res_qp.into()),
            port,
            path,
        };
        let rts = Rtr2Rts {
            sq_psn: local.psn,
            ack_timeout: attr::ACK_TIMEOUT,
            retry_count: attr::RETRY_CNT,
            rnr_retry: attr::RNR_RETRY,
            log_sra_max: log_ra(res.caps.log_max_ra_req_qp.into()),
            port,
        };
        // Out of RST, a failed step leaves the QP in ERR, where later WQEs are flushed rather than ignored.
        devx::to_err_on_failure(&t, obj, local.qpn, || {
            devx::init2rtr(&t, obj, local.qpn, &rtr)?;
            devx::rtr2rts(&t, obj, local.qpn, &rts)
        })
    }

    /// DevX QP `obj`'s state (QUERY_QP).
    ///
    /// # Errors
    /// [`Error::DevxCmd`] for QUERY_QP.
    pub(super) fn state_devx(&self, obj: &DevxObj, qpn: u32) -> Result<QpState> {
        let (_, t, _) = self.devx_res()?;
        Ok(qp_state(devx::query_qp(&t, obj, qpn)?.state()))
    }

    /// Destroys a DevX object, recording a failure as the NIC's drop error.
    pub(super) fn destroy_devx(&self, obj: DevxObj, what: &str) {
        if let Err(e) = obj.destroy() {
            self.drops.record(what, e);
        }
    }
}

/// [`QpState`] of `qpc.state`; SQER, SQD and unknown states read as [`QpState::Error`].
pub(super) fn qp_state(s: u8) -> QpState {
    match s {
        qpc::state::RST => QpState::Reset,
        qpc::state::INIT => QpState::Init,
        qpc::state::RTR => QpState::Rtr,
        qpc::state::RTS => QpState::Rts,
        _ => QpState::Error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nic::mlx5::endpoint::Mtu;
    use gdaki_shared::prm::cmd::{create_qp_in, create_qp_out};

    #[test]
    fn a_refused_command_names_call_errno_status_and_syndrome() {
        let inbox = devx::create_qp_in(&QpAttr { log_sq_size: 4, ..QpAttr::default() }).unwrap();
        let mut out = [0u8; create_qp_out::SIZE];
        mbox_out::STATUS.set(&mut out, status::BAD_PARAM.into()).unwrap();
        mbox_out::SYNDROME.set(&mut out, 0x1234_5678).unwrap();
        let e = cmd_result("mlx5dv_devx_obj_create", false, 121, &inbox, &out).unwrap_err();
        let Error::DevxCmd { opcode: op, status: st, syndrome, via: Some((call, errno)), .. } = &e else {
            panic!("{e:?}")
        };
        assert_eq!(
            (*op, *st, *syndrome, call.as_str(), *errno),
            (opcode::CREATE_QP, 3, 0x1234_5678, "mlx5dv_devx_obj_create", 121)
        );
        let t = e.to_string();
        assert!(t.starts_with("mlx5dv_devx_obj_create: CREATE_QP failed: status BAD_PARAM (0x3)"), "{t}");
        assert!(t.contains("syndrome 0x12345678") && t.contains("errno 121"), "{t}");
    }

    #[test]
    fn a_call_that_failed_before_the_firmware_is_a_verbs_error() {
        let inbox = devx::create_qp_in(&QpAttr::default()).unwrap();
        let out = [0u8; create_qp_out::SIZE];
        let e = cmd_result("mlx5dv_devx_obj_create", false, libc_eperm(), &inbox, &out).unwrap_err();
        let Error::Verbs { call, errno } = &e else { panic!("{e:?}") };
        assert_eq!((call.as_str(), *errno), ("mlx5dv_devx_obj_create(CREATE_QP)", 1));
        assert!(cmd_result("mlx5dv_devx_general_cmd", true, 0, &inbox, &out).is_ok());
        assert_eq!(create_qp_in::OPCODE.get(&inbox), u64::from(opcode::CREATE_QP));
    }

    /// EPERM.
    fn libc_eperm() -> i32 {
        1
    }

    #[test]
    fn sizes_formats_and_blueflame() {
        assert_eq!((log2_exact(1), log2_exact(256), log2_exact(3), log2_exact(0)), (Some(0), Some(8), None, None));
        use cmd_hca_cap::ts_format_cap as c;
        assert_eq!(qp_ts_format(c::FREE_RUNNING), qpc::ts_format::FREE_RUNNING);
        assert_eq!(qp_ts_format(c::REAL_TIME), qpc::ts_format::REAL_TIME);
        assert_eq!(qp_ts_format(c::FREE_RUNNING_AND_REAL_TIME), qpc::ts_format::DEFAULT);
        assert_eq!(bf_size(UarKind::BlueFlame, true, 9), 256, "half of a 512-byte register");
        assert_eq!(bf_size(UarKind::NonCached, true, 9), 0);
        assert_eq!(bf_size(UarKind::BlueFlame, false, 9), 0);
        assert_eq!((UarKind::BlueFlame.flags(), UarKind::NonCached.flags()), (0, 1));
        assert_eq!((log_ra(4), log_ra(30)), (4, 7));
    }

    #[test]
    fn queue_layout_puts_the_dbrec_after_the_ring_in_whole_pages() {
        assert_eq!(queue_layout(64 * 64), QueueLayout { dbrec: 4096, bytes: 8192 });
        assert_eq!(queue_layout(16 * 64), QueueLayout { dbrec: 1024, bytes: 4096 });
        assert_eq!(queue_layout(PAGE - 128), QueueLayout { dbrec: PAGE - 128, bytes: PAGE });
    }

    #[test]
    fn udp_source_ports_are_in_the_dynamic_range_and_spread() {
        let ports: std::collections::HashSet<u16> = (0..256).map(|q| udp_sport(0x100 + q, 0x200)).collect();
        assert!(ports.iter().all(|&p| p >= 0xc000));
        assert!(ports.len() > 200, "{} distinct ports of 256", ports.len());
    }

    #[test]
    fn mtu_codes_are_the_qpc_codes_and_states_map() {
        assert_eq!(Mtu::M4096 as u8, qpc::mtu::MTU_4K);
        assert_eq!(Mtu::M256 as u8, qpc::mtu::MTU_256);
        assert_eq!(qp_state(qpc::state::RTS), QpState::Rts);
        assert_eq!(qp_state(qpc::state::RST), QpState::Reset);
        assert_eq!(qp_state(qpc::state::ERR), QpState::Error);
    }

    #[test]
    fn caps_need_rc() {
        // A capability page of zeros: no RC.
        let mut out = vec![0u8; gdaki_shared::prm::cmd::query_hca_cap_out::SIZE];
        struct Fixed<'a>(&'a [u8]);
        impl Transport for Fixed<'_> {
            type Obj = ();
            fn obj_create(&self, _: &[u8], _: &mut [u8]) -> Result<()> {
                Ok(())
            }
            fn obj_modify(&self, _: &(), _: &[u8], _: &mut [u8]) -> Result<()> {
                Ok(())
            }
            fn obj_query(&self, _: &(), _: &[u8], _: &mut [u8]) -> Result<()> {
                Ok(())
            }
            fn obj_destroy(&self, _: ()) -> Result<()> {
                Ok(())
            }
            fn general_cmd(&self, _: &[u8], o: &mut [u8]) -> Result<()> {
                o.copy_from_slice(self.0);
                Ok(())
            }
        }
        let cap = devx::query_hca_cap(&Fixed(&out)).unwrap();
        assert!(DevxCaps::from_cap(&cap).unwrap_err().contains("no RC"));
        use gdaki_shared::prm::cmd::query_hca_cap_out::capability;
        for (f, v) in [
            (cmd_hca_cap::RC, 1),
            (cmd_hca_cap::LOG_MAX_CQ_SZ, 22),
            (cmd_hca_cap::LOG_MAX_QP_SZ, 15),
            (cmd_hca_cap::LOG_MAX_MSG, 30),
            (cmd_hca_cap::BF, 1),
            (cmd_hca_cap::LOG_BF_REG_SIZE, 9),
            (cmd_hca_cap::SQ_TS_FORMAT, 2),
        ] {
            capability(f).set(&mut out, v).unwrap();
        }
        let caps = DevxCaps::from_cap(&devx::query_hca_cap(&Fixed(&out)).unwrap()).unwrap();
        assert_eq!((caps.log_max_cq_sz, caps.log_max_qp_sz, caps.log_max_msg), (22, 15, 30));
        assert_eq!((caps.bf, caps.log_bf_reg_size, caps.ts_format), (true, 9, qpc::ts_format::DEFAULT));
    }
}
