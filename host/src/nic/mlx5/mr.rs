//! Protection domains and memory registration on a real NIC: host memory with `ibv_reg_mr`, GPU memory with
//! `ibv_reg_dmabuf_mr` over a dmabuf the CUDA driver exports, falling back to `ibv_reg_mr` on the GPU address
//! (which needs the nvidia-peermem kernel module).

use std::os::fd::AsRawFd;
use std::sync::Arc;

use gdaki_mlx5_sys as sys;
use gdaki_shared::handle::{MrHandle, RemoteMr};
use gdaki_shared::Be32;

use super::attr;
use super::map::page_span;
use super::verbs::{check, nonnull};
use super::Mlx5Nic;
use crate::mem::{MemKind, MemLoc};
use crate::nic::emu::Access;
use crate::{Error, Result};

/// A protection domain (`ibv_alloc_pd`), freed when it and its MRs and QPs are dropped.
#[derive(Debug)]
pub struct Pd {
    pub(super) inner: Arc<PdInner>,
}

#[derive(Debug)]
pub(super) struct PdInner {
    pub(super) nic: Arc<Mlx5Nic>,
    pub(super) ptr: *mut sys::ibv_pd,
}

// SAFETY: verbs objects may be used from any thread; the pointer is only freed by `Drop`, once.
unsafe impl Send for PdInner {}
// SAFETY: as above.
unsafe impl Sync for PdInner {}

impl Drop for PdInner {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `ibv_alloc_pd`; MRs and QPs of it hold this value, so none is left.
        if let Err(e) = check(unsafe { sys::ibv_dealloc_pd(self.ptr) }, "ibv_dealloc_pd") {
            self.nic.drops.record("an mlx5 PD", e);
        }
    }
}

/// How an MR was registered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MrPath {
    /// Host memory, `ibv_reg_mr`.
    Host,
    /// GPU memory through a dmabuf, `ibv_reg_dmabuf_mr` (Linux 5.12+, CUDA 11.7+, open GPU kernel modules).
    Dmabuf,
    /// GPU memory through nvidia-peermem, `ibv_reg_mr` on the GPU address.
    Peermem,
}

/// A registered memory region, deregistered (`ibv_dereg_mr`) on drop.
#[derive(Debug)]
pub struct Mr {
    /// Keeps the PD (and the NIC) alive while the MR is registered in it.
    pd: Arc<PdInner>,
    ptr: *mut sys::ibv_mr,
    loc: MemLoc,
    len: u64,
    lkey: u32,
    rkey: u32,
    path: MrPath,
}

// SAFETY: verbs objects may be used from any thread; the pointer is only freed by `Drop`, once.
unsafe impl Send for Mr {}
// SAFETY: as above.
unsafe impl Sync for Mr {}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from a registration call and is deregistered once.
        if let Err(e) = check(unsafe { sys::ibv_dereg_mr(self.ptr) }, "ibv_dereg_mr") {
            self.pd.nic.drops.record("an mlx5 MR", e);
        }
    }
}

impl Mlx5Nic {
    /// Allocates a protection domain (`ibv_alloc_pd`).
    ///
    /// # Errors
    /// [`Error::Verbs`] for `ibv_alloc_pd`.
    pub fn alloc_pd(self: &Arc<Self>) -> Result<Pd> {
        // SAFETY: the context is open.
        let ptr = nonnull(unsafe { sys::ibv_alloc_pd(self.ctx.ptr) }, "ibv_alloc_pd")?;
        Ok(Pd { inner: Arc::new(PdInner { nic: self.clone(), ptr }) })
    }

    /// Registers `len` bytes at `loc` in `pd` with rights `access`, I/O virtual address = `loc.addr` (so that
    /// WQEs name the memory by the address device code uses). Host memory: `ibv_reg_mr`. GPU memory:
    /// `ibv_reg_dmabuf_mr` over a dmabuf of the whole pages covering the range (`cuMemGetHandleForAddressRange`),
    /// and when that fails, `ibv_reg_mr` on the GPU address (nvidia-peermem). [`Mr::path`] says which.
    ///
    /// # Safety
    /// The range must stay allocated until the MR is dropped (the NIC reads and writes it whenever a WQE
    /// names it).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a PD of another NIC, zero length, unknown access bits, or GPU memory on a
    /// NIC opened for the `cpu` executor; [`Error::Verbs`] naming the registration call and errno (for GPU
    /// memory the peermem call's, with the dmabuf failure in the call text).
    pub unsafe fn reg_mr(self: &Arc<Self>, pd: &Pd, loc: MemLoc, len: u64, access: Access) -> Result<Mr> {
        if !Arc::ptr_eq(&pd.inner.nic, self) {
            return Err(Error::InvalidArgument(format!("PD belongs to another NIC than {}", self.ctx.name)));
        }
        if len == 0 {
            return Err(Error::InvalidArgument("MR length is zero".into()));
        }
        let bits = attr::mr_access(access)?;
        let size = usize::try_from(len).map_err(|_| Error::InvalidArgument(format!("MR of {len} bytes")))?;
        let host_reg = |what: &str| {
            // SAFETY: the caller keeps the range allocated while the MR lives.
            let p = unsafe { sys::ibv_reg_mr_iova2(pd.inner.ptr, loc.addr as *mut _, size, loc.addr, bits) };
            nonnull(p, what.to_string())
        };
        let (ptr, path) = match loc.kind {
            MemKind::Host => (host_reg("ibv_reg_mr")?, MrPath::Host),
            MemKind::Gpu => {
                let gpu = self.map.gpu().ok_or_else(|| {
                    Error::InvalidArgument("MR in GPU memory, but the NIC was opened for the cpu executor".into())
                })?;
                let dmabuf = page_span(loc.addr, len)
                    .ok_or_else(|| Error::InvalidArgument(format!("MR {:#x}+{len} wraps", loc.addr)))
                    .and_then(|(base, bytes)| {
                        let fd = gpu.dmabuf_fd(base, bytes as usize)?;
                        // SAFETY: `fd` is a dmabuf of whole pages covering the range; the MR takes its own
                        // reference to the dmabuf, so `fd` may be closed afterwards.
                        let p = unsafe {
                            sys::ibv_reg_dmabuf_mr(
                                pd.inner.ptr,
                                loc.addr - base,
                                size,
                                loc.addr,
                                fd.as_raw_fd(),
                                bits as i32,
                            )
                        };
                        nonnull(p, "ibv_reg_dmabuf_mr")
                    });
                match dmabuf {
                    Ok(p) => (p, MrPath::Dmabuf),
                    Err(e) => {
                        tracing::info!("mlx5: dmabuf registration failed ({e}); trying nvidia-peermem");
                        let what = format!("ibv_reg_mr(GPU memory, needs nvidia-peermem; dmabuf failed: {e})");
                        (host_reg(&what)?, MrPath::Peermem)
                    }
                }
            }
        };
        // SAFETY: `ptr` is a live MR returned just now.
        let (lkey, rkey) = unsafe { ((*ptr).lkey, (*ptr).rkey) };
        Ok(Mr { pd: pd.inner.clone(), ptr, loc, len, lkey, rkey, path })
    }
}

impl Mr {
    /// The local key (data segments), host order.
    pub fn lkey(&self) -> u32 {
        self.lkey
    }

    /// The remote key (raddr segments of peers), host order.
    pub fn rkey(&self) -> u32 {
        self.rkey
    }

    /// Where the region starts.
    pub fn loc(&self) -> MemLoc {
        self.loc
    }

    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the region is empty (never: registration rejects zero lengths).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// How it was registered.
    pub fn path(&self) -> MrPath {
        self.path
    }

    /// The device handle for local use: address, length, lkey and rkey (big-endian).
    pub fn handle(&self) -> MrHandle {
        MrHandle { addr: self.loc.addr, length: self.len, lkey: Be32::new(self.lkey), rkey: Be32::new(self.rkey) }
    }

    /// What a peer needs to target this region: address, length and rkey (big-endian).
    pub fn remote(&self) -> RemoteMr {
        RemoteMr { addr: self.loc.addr, length: self.len, rkey: Be32::new(self.rkey), pad: 0 }
    }
}
