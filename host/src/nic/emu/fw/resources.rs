//! What a DevX user gets from the kernel rather than from firmware commands, and the tables the commands
//! check against: umems (`mlx5dv_devx_umem_reg`), UAR pages (`mlx5dv_devx_alloc_uar`), PDs (`ibv_alloc_pd`),
//! the emulated neighbour table (a peer NIC's GID to its wire address), and the CQs and QPs the commands made,
//! with the resources each one holds.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;

use gdaki_shared::prm::uar::{BF_OFFSET, UAR_PAGE_SIZE};

use crate::mem::{GpuMem, MappedBuf, MemKind};
use crate::{EmuError, Error, Result};

use super::super::cq::CqInner;
use super::super::guard::lock;
use super::super::mr::Access;
use super::super::qmem::{HostView, PooledGpuMem, QBuf, QMem};
use super::super::qp::{self, gid_of, nic_of_gid};
use super::super::EmuNic;
use super::syndrome::Fail;

/// Memory to register as a umem ([`EmuNic::devx_umem_reg`]): host memory (pinned and mapped into the GPU on the
/// `gpu` executor) or GPU memory, where the NIC's [`EmuConfig::queues`](super::super::EmuConfig::queues) puts
/// its own queues or wherever the caller allocated it.
///
/// `mlx5dv_devx_umem_reg` takes an address and a length and pins the pages behind them; the emulated NIC takes
/// the buffer itself, so that it reaches the memory the way the hardware would (host memory through its host
/// pointer, with the address device code uses; GPU memory through the GPU copier). Keep its
/// [`device_addr`](UmemBuf::device_addr) (and [`host_ptr`](UmemBuf::host_ptr)) before registering it: they
/// are where device code finds the rings.
#[derive(Debug)]
pub struct UmemBuf(pub(crate) QMem);

impl UmemBuf {
    /// Host memory: `buf` as allocated by a [`QueueMemory`](crate::mem::QueueMemory) (zeroed, 4096-byte
    /// aligned).
    pub fn host(buf: MappedBuf) -> Self {
        UmemBuf(QMem::Host(buf))
    }

    /// GPU memory from a [`GpuCopier`](crate::mem::GpuCopier)'s `alloc`, freed when the umem is deregistered
    /// and no QP or CQ uses it any more. Freeing GPU memory (`cuMemFree`) waits for running kernels:
    /// [`EmuNic::alloc_umem_buf`] keeps such memory in the NIC's pool instead, and needs no `unsafe`.
    ///
    /// # Safety
    /// `mem` must be a live allocation of `mem.len()` bytes at `mem.addr()` that the GPU copier of the NIC
    /// it is registered with can copy to and from, for as long as `mem` lives (what the copier's `alloc`
    /// returns is). [`GpuMem::new`] is safe and takes any address; the NIC reads and writes the rings it
    /// holds through the copier, which for a [`SimGpu`](crate::nic::emu::SimGpu) is a store to that address
    /// in this process.
    ///
    /// ```compile_fail
    /// use gdaki::mem::GpuMem;
    /// use gdaki::nic::emu::UmemBuf;
    /// // Needs `unsafe`: the NIC would write CQEs wherever the address points.
    /// let _ = UmemBuf::gpu(GpuMem::new(0x1000, 4096, Box::new(())));
    /// ```
    pub unsafe fn gpu(mem: GpuMem) -> Self {
        UmemBuf(QMem::Gpu(PooledGpuMem::new(mem, None)))
    }

    /// Where it is.
    pub fn kind(&self) -> MemKind {
        self.0.kind()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.0.len() == 0
    }

    /// The address of the first byte as device code uses it (a host pointer on the `cpu` executor, the
    /// mapped address of pinned memory or a GPU address on the `gpu` executor).
    pub fn device_addr(&self) -> u64 {
        self.0.device_addr()
    }

    /// The host pointer to the first byte, for host memory.
    pub fn host_ptr(&self) -> Option<*mut u8> {
        self.0.host_ptr()
    }
}

/// A UAR page from [`EmuNic::devx_alloc_uar`] (what `mlx5dv_devx_alloc_uar` returns as `struct
/// mlx5dv_devx_uar`): its index, which CREATE_CQ's `cqc.uar_page` and CREATE_QP's `qpc.uar_page` name, and
/// where device code writes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DevxUar {
    /// `mlx5dv_devx_uar.page_id`: the page's index (from 1).
    pub page_id: u32,
    /// `mlx5dv_devx_uar.base_addr`: the page's first byte as device code addresses it (4096 bytes, host
    /// memory that device code writes as MMIO).
    pub base_addr: u64,
}

impl DevxUar {
    /// `mlx5dv_devx_uar.reg_addr`: the doorbell/BlueFlame register, at [`BF_OFFSET`] (0x800) of the page.
    pub fn reg_addr(&self) -> u64 {
        self.base_addr + BF_OFFSET as u64
    }
}

/// A registered umem.
#[derive(Debug)]
struct Umem {
    mem: Arc<QMem>,
    access: Access,
    /// CQs and QPs whose rings or doorbell records are in it.
    users: u32,
}

/// An allocated UAR page.
#[derive(Debug)]
struct Uar {
    page: Arc<MappedBuf>,
    /// The live QP whose doorbells go to it.
    qp: Option<u32>,
    /// Live CQs that name it.
    cqs: u32,
}

/// A CQ that CREATE_CQ made.
#[derive(Debug)]
pub(crate) struct CqObj {
    pub inner: Arc<CqInner>,
    /// The umems of its ring and doorbell record.
    umems: [u32; 2],
    uar: u32,
    /// QPs that complete into it (`cqn_snd` and `cqn_rcv` each count).
    users: u32,
}

/// What a QP that CREATE_QP made holds, released by DESTROY_QP.
#[derive(Debug)]
pub(crate) struct QpObj {
    /// The umems of its work queue and doorbell record.
    umems: [u32; 2],
    uar: u32,
    /// `cqn_snd`, `cqn_rcv`.
    cqs: [u32; 2],
}

/// The emulated NIC's firmware state (inside [`Fabric::fw`](super::super::fabric::Fabric)).
#[derive(Debug, Default)]
pub(crate) struct Firmware {
    umems: HashMap<u32, Umem>,
    last_umem: u32,
    uars: HashMap<u32, Uar>,
    last_uar: u32,
    cqs: HashMap<u32, CqObj>,
    qps: HashMap<u32, QpObj>,
    pds: HashSet<u32>,
    /// Peer NICs by identifier (their GID's low 64 bits): where their wire listens.
    neighbors: HashMap<u64, SocketAddr>,
}

/// Which syndromes a failed umem lookup reports: the ring's or the doorbell record's.
#[derive(Clone, Copy, Debug)]
pub(super) struct Lookup {
    pub unknown: u32,
    pub range: u32,
    pub align: u32,
    /// Bytes the offset must be a multiple of.
    pub align_to: u64,
    /// Whether the NIC writes the range (the umem needs `LOCAL_WRITE`), with the syndrome if not.
    pub write: Option<u32>,
}

impl Firmware {
    /// A view of `len` bytes at offset `off` of umem `id`, checked as `how` says; nothing changes.
    pub(super) fn view(&self, id: u32, off: u64, len: u64, how: Lookup) -> Result<QBuf, Fail> {
        let u = self.umems.get(&id).ok_or(Fail::of(how.unknown))?;
        if !off.is_multiple_of(how.align_to) {
            return Err(Fail::of(how.align));
        }
        let end = off.checked_add(len).ok_or(Fail::of(how.range))?;
        if end > u.mem.len() as u64 {
            return Err(Fail::of(how.range));
        }
        if let Some(s) = how.write {
            if !u.access.contains(Access::LOCAL_WRITE) {
                return Err(Fail::of(s));
            }
        }
        // In range (checked), so only a host buffer that does not start 8-byte aligned fails here.
        QMem::view(&u.mem, off as usize, len as usize).ok_or(Fail::of(how.align))
    }

    /// The UAR page `id` (`None` if not allocated), and the live QP that rings it.
    pub(super) fn uar(&self, id: u32) -> Option<(&Arc<MappedBuf>, Option<u32>)> {
        self.uars.get(&id).map(|u| (&u.page, u.qp))
    }

    /// A view of UAR page `id` (which must be allocated).
    pub(super) fn uar_view(&self, id: u32) -> Option<HostView> {
        let u = self.uars.get(&id)?;
        HostView::new(&u.page, 0, u.page.len(), u.page.clone())
    }

    /// The CQ `cqn`.
    pub(super) fn cq(&self, cqn: u32) -> Option<&CqObj> {
        self.cqs.get(&cqn)
    }

    /// The CQ `cqn` as the executor uses it.
    pub(crate) fn cq_inner(&self, cqn: u32) -> Option<Arc<CqInner>> {
        self.cqs.get(&cqn).map(|c| c.inner.clone())
    }

    /// Whether PD `pdn` is allocated.
    pub(super) fn has_pd(&self, pdn: u32) -> bool {
        self.pds.contains(&pdn)
    }

    /// Where the wire of NIC `nic` listens, if known.
    pub(super) fn neighbor(&self, nic: u64) -> Option<SocketAddr> {
        self.neighbors.get(&nic).copied()
    }

    /// Records CQ `cqn` made over umems `umems` and UAR page `uar` (all checked).
    pub(super) fn add_cq(&mut self, cqn: u32, inner: Arc<CqInner>, umems: [u32; 2], uar: u32) {
        for id in umems {
            self.umem_users(id, true);
        }
        if let Some(u) = self.uars.get_mut(&uar) {
            u.cqs += 1;
        }
        self.cqs.insert(cqn, CqObj { inner, umems, uar, users: 0 });
    }

    /// Removes CQ `cqn` unless a QP uses it: `Ok(false)` when there is no such CQ, `Err` when it is used.
    pub(super) fn remove_cq(&mut self, cqn: u32) -> Result<bool, ()> {
        match self.cqs.get(&cqn) {
            None => Ok(false),
            Some(c) if c.users > 0 => Err(()),
            Some(_) => {
                let c = self.cqs.remove(&cqn).ok_or(())?;
                for id in c.umems {
                    self.umem_users(id, false);
                }
                if let Some(u) = self.uars.get_mut(&c.uar) {
                    u.cqs -= 1;
                }
                Ok(true)
            }
        }
    }

    /// Records QP `qpn` made over umems `umems`, UAR page `uar` and CQs `cqs` (all checked).
    pub(super) fn add_qp(&mut self, qpn: u32, umems: [u32; 2], uar: u32, cqs: [u32; 2]) {
        for id in umems {
            self.umem_users(id, true);
        }
        for cqn in cqs {
            if let Some(c) = self.cqs.get_mut(&cqn) {
                c.users += 1;
            }
        }
        if let Some(u) = self.uars.get_mut(&uar) {
            u.qp = Some(qpn);
        }
        self.qps.insert(qpn, QpObj { umems, uar, cqs });
    }

    /// Whether QP `qpn` was made by CREATE_QP and not destroyed.
    pub(super) fn has_qp(&self, qpn: u32) -> bool {
        self.qps.contains_key(&qpn)
    }

    /// Releases what QP `qpn` held; `false` when there is no such QP.
    pub(super) fn remove_qp(&mut self, qpn: u32) -> bool {
        let Some(q) = self.qps.remove(&qpn) else { return false };
        for id in q.umems {
            self.umem_users(id, false);
        }
        for cqn in q.cqs {
            if let Some(c) = self.cqs.get_mut(&cqn) {
                c.users -= 1;
            }
        }
        if let Some(u) = self.uars.get_mut(&q.uar) {
            u.qp = None;
        }
        true
    }

    fn umem_users(&mut self, id: u32, add: bool) {
        if let Some(u) = self.umems.get_mut(&id) {
            u.users = if add { u.users + 1 } else { u.users.saturating_sub(1) };
        }
    }

    /// Records PD `pdn` as allocated.
    pub(crate) fn add_pd(&mut self, pdn: u32) {
        self.pds.insert(pdn);
    }

    /// Forgets PD `pdn` (deallocated).
    pub(crate) fn remove_pd(&mut self, pdn: u32) {
        self.pds.remove(&pdn);
    }
}

/// A 24-bit identifier after `last`, skipping those `taken` says are in use; `None` when all are.
fn next_id(last: &mut u32, taken: impl Fn(u32) -> bool) -> Option<u32> {
    for _ in 0..0x00ff_ffff {
        *last = if *last >= 0x00ff_ffff { 1 } else { *last + 1 };
        if !taken(*last) {
            return Some(*last);
        }
    }
    None
}

impl EmuNic {
    /// Allocates `len` zeroed bytes for a umem in `kind` of memory, as the NIC allocates its own queues: host
    /// memory from [`EmuConfig::queue_mem`](super::super::EmuConfig::queue_mem), GPU memory through the GPU
    /// copier, kept in the NIC's pool once no umem, QP or CQ uses it (freed with the NIC).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for GPU memory on a NIC without a GPU copier; the allocation's error.
    pub fn alloc_umem_buf(&self, len: usize, kind: MemKind) -> Result<UmemBuf> {
        self.fab.alloc_queue(len, kind).map(UmemBuf)
    }

    /// Registers `mem` as a umem with rights `access` (`mlx5dv_devx_umem_reg`: the kernel's CREATE_UMEM), and
    /// returns its id, which CREATE_CQ's `cq_umem_id`/`cqc.dbr_umem_id` and CREATE_QP's
    /// `wq_umem_id`/`qpc.dbr_umem_id` name. The NIC writes CQ rings, so a CQ's ring needs `LOCAL_WRITE`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an empty buffer, GPU memory on a NIC without a GPU copier, host memory
    /// that does not start 8-byte aligned, or access bits other than the four of [`Access`];
    /// [`Error::Emu`] when all 2^24 umem ids are used.
    pub fn devx_umem_reg(&self, mem: UmemBuf, access: Access) -> Result<u32> {
        if mem.is_empty() {
            return Err(Error::InvalidArgument("umem of zero bytes".into()));
        }
        if mem.kind() == MemKind::Gpu && self.fab.gpu.is_none() {
            return Err(Error::InvalidArgument("umem in GPU memory on a NIC without a GPU copier".into()));
        }
        if mem.host_ptr().is_some_and(|p| !(p as usize).is_multiple_of(8)) {
            return Err(Error::InvalidArgument("umem in host memory that does not start 8-byte aligned".into()));
        }
        if access.bits() & !Access::ALL.bits() != 0 {
            return Err(Error::InvalidArgument(format!("unknown umem access bits {:#x}", access.bits())));
        }
        let mut fw = lock(&self.fab.fw);
        let fw = &mut *fw;
        let id = next_id(&mut fw.last_umem, |i| fw.umems.contains_key(&i))
            .ok_or(Error::Emu(EmuError::Exhausted("umem ids")))?;
        fw.umems.insert(id, Umem { mem: Arc::new(mem.0), access, users: 0 });
        Ok(id)
    }

    /// Deregisters umem `id` (`mlx5dv_devx_umem_dereg`). Its memory is freed (GPU memory from
    /// [`EmuNic::alloc_umem_buf`]: back to the NIC's pool) once no QP or CQ made over it is left.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when no umem has that id, or a live CQ or QP has its ring or doorbell
    /// record in it (as the kernel refuses with `EBUSY`).
    pub fn devx_umem_dereg(&self, id: u32) -> Result<()> {
        let mut fw = lock(&self.fab.fw);
        match fw.umems.get(&id) {
            None => Err(Error::InvalidArgument(format!("no umem {id}"))),
            Some(u) if u.users > 0 => {
                Err(Error::InvalidArgument(format!("umem {id} holds the queues of {} live CQs or QPs", u.users)))
            }
            Some(_) => {
                fw.umems.remove(&id);
                Ok(())
            }
        }
    }

    /// Allocates a UAR page (`mlx5dv_devx_alloc_uar`): 4096 bytes of host memory from the NIC's queue memory,
    /// which device code writes as MMIO, with the doorbell/BlueFlame register at 0x800. A QP's doorbells need a
    /// page of their own (CREATE_QP refuses one another live QP rings); CQs may share one.
    ///
    /// # Errors
    /// The queue memory's allocation error; [`Error::Emu`] when all 2^24 page ids are used.
    pub fn devx_alloc_uar(&self) -> Result<DevxUar> {
        let page = self.fab.queue_mem.alloc(UAR_PAGE_SIZE)?;
        if let Some(v) = HostView::new(&page, 0, page.len(), Arc::new(())) {
            qp::clear_doorbell(&v, self.fab.bf_sentinel);
        }
        let base_addr = page.device_addr();
        let mut fw = lock(&self.fab.fw);
        let fw = &mut *fw;
        let page_id = next_id(&mut fw.last_uar, |i| fw.uars.contains_key(&i))
            .ok_or(Error::Emu(EmuError::Exhausted("UAR pages")))?;
        fw.uars.insert(page_id, Uar { page: Arc::new(page), qp: None, cqs: 0 });
        Ok(DevxUar { page_id, base_addr })
    }

    /// Frees UAR page `page_id` (`mlx5dv_devx_free_uar`).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when no page has that id, or a live QP or CQ names it.
    pub fn devx_free_uar(&self, page_id: u32) -> Result<()> {
        let mut fw = lock(&self.fab.fw);
        match fw.uars.get(&page_id) {
            None => Err(Error::InvalidArgument(format!("no UAR page {page_id}"))),
            Some(u) if u.qp.is_some() || u.cqs > 0 => {
                Err(Error::InvalidArgument(format!("UAR page {page_id} is named by a live QP or CQ")))
            }
            Some(_) => {
                fw.uars.remove(&page_id);
                Ok(())
            }
        }
    }

    /// The GID of this NIC's port 1 at index 0, the only one ([`gid_of`] of [`EmuNic::id`]): what a peer's
    /// INIT2RTR puts in the path's `rgid_rip` to reach a QP of this NIC.
    pub fn gid(&self) -> [u8; 16] {
        gid_of(self.id())
    }

    /// Records that the emulated NIC whose GID is `gid` listens for its wire at `wire`: the emulated
    /// neighbour table, which an INIT2RTR whose path names that GID reaches the peer through (as RoCE
    /// resolves a GID to a MAC through the kernel's neighbour table). A later call for the same GID replaces
    /// the address.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a GID that is not an emulated NIC's, or this NIC's own; for an address
    /// that cannot be dialed (0.0.0.0, `::` or port 0).
    pub fn add_neighbor(&self, gid: &[u8; 16], wire: SocketAddr) -> Result<()> {
        let nic = nic_of_gid(gid)
            .ok_or_else(|| Error::InvalidArgument(format!("{gid:02x?} is not an emulated NIC's GID")))?;
        if nic == self.id() {
            return Err(Error::InvalidArgument("add_neighbor with this NIC's own GID".into()));
        }
        if wire.ip().is_unspecified() || wire.port() == 0 {
            return Err(Error::InvalidArgument(format!(
                "wire address {wire} cannot be dialed (an unspecified address or port 0; a NIC listens on neither)"
            )));
        }
        lock(&self.fab.fw).neighbors.insert(nic, wire);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_skip_used_ones_and_wrap() {
        let mut last = 0x00ff_fffe;
        assert_eq!(next_id(&mut last, |i| i == 0x00ff_ffff), Some(1));
        assert_eq!(next_id(&mut last, |_| false), Some(2));
    }
}
