//! Protection domains, memory regions and the key table the executor checks every lkey and rkey against.
//!
//! Keys are laid out like mlx5 mkeys: `index << 8 | variant`. The index (24 bits, from 1) picks a table slot;
//! the variant byte changes each time a slot is reused, so a stale key of a deregistered MR does not silently
//! name its successor. An MR's lkey and rkey are the same key.

use std::sync::Arc;

use gdaki_shared::handle::{MrHandle, RemoteMr};
use gdaki_shared::Be32;

use crate::mem::{MemKind, MemLoc, PeerExport};

use super::EmuNic;

/// Access rights of a memory region (the `IBV_ACCESS_*` values of `ibv_reg_mr`). Local read is always allowed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Access(u32);

impl Access {
    /// No rights beyond local read: the MR can be the source of RDMA WRITEs only.
    pub const NONE: Access = Access(0);
    /// `IBV_ACCESS_LOCAL_WRITE`: the NIC may write the MR locally (RDMA READ and atomic results).
    pub const LOCAL_WRITE: Access = Access(1);
    /// `IBV_ACCESS_REMOTE_WRITE`: peers may RDMA WRITE into the MR. Requires `LOCAL_WRITE`.
    pub const REMOTE_WRITE: Access = Access(2);
    /// `IBV_ACCESS_REMOTE_READ`: peers may RDMA READ from the MR.
    pub const REMOTE_READ: Access = Access(4);
    /// `IBV_ACCESS_REMOTE_ATOMIC`: peers may run atomics on the MR. Requires `LOCAL_WRITE`.
    pub const REMOTE_ATOMIC: Access = Access(8);
    /// All four rights.
    pub const ALL: Access = Access(15);

    /// The raw `IBV_ACCESS_*` bits.
    pub const fn bits(self) -> u32 {
        self.0
    }

    /// The rights of raw `IBV_ACCESS_*` bits `b` (the four above; other bits are dropped).
    pub(crate) const fn from_bits(b: u32) -> Access {
        Access(b & Access::ALL.0)
    }

    /// Whether every right in `other` is in `self`.
    pub const fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }
}

impl std::ops::BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        Access(self.0 | rhs.0)
    }
}

/// A protection domain. MRs and QPs of one PD may be used together: a WQE's lkeys must belong to its QP's PD,
/// and its rkey to the responder QP's PD. Created by [`EmuNic::alloc_pd`].
#[derive(Debug)]
pub struct Pd {
    pub(crate) nic: Arc<EmuNic>,
    pub(crate) pdn: u32,
}

impl Pd {
    /// The PD number (unique within its NIC).
    pub fn pdn(&self) -> u32 {
        self.pdn
    }
}

/// A registered memory region. Created by [`EmuNic::reg_mr`]; deregistered when dropped.
///
/// Dropping it waits until no WQE is using it and every GPU copy that touched it has completed: once `drop`
/// returns, the NIC never touches the memory again, and WQEs that name its key fail with a protection error.
#[derive(Debug)]
pub struct Mr {
    pub(crate) nic: Arc<EmuNic>,
    pub(crate) key: u32,
    pub(crate) loc: MemLoc,
    pub(crate) len: u64,
}

impl Mr {
    /// The local key (what data segments carry), host order.
    pub fn lkey(&self) -> u32 {
        self.key
    }

    /// The remote key (what peers put in raddr segments), host order. Equal to [`Mr::lkey`].
    pub fn rkey(&self) -> u32 {
        self.key
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

    /// The device handle for local use: address, length, lkey and rkey (big-endian).
    pub fn handle(&self) -> MrHandle {
        MrHandle { addr: self.loc.addr, length: self.len, lkey: Be32::new(self.key), rkey: Be32::new(self.key) }
    }

    /// What a peer needs to target this region: address, length and rkey (big-endian).
    pub fn remote(&self) -> RemoteMr {
        RemoteMr { addr: self.loc.addr, length: self.len, rkey: Be32::new(self.key), pad: 0 }
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        self.nic.dereg_mr(self.key);
    }
}

/// One registered region as the executor sees it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MrEntry {
    pub pdn: u32,
    pub loc: MemLoc,
    pub len: u64,
    pub access: Access,
    /// For host memory that the NIC's GPU copier reaches (pinned and mapped into the GPU): the address at
    /// which it does, for `loc.addr` ([`GpuCopier::device_view`](crate::mem::GpuCopier::device_view)).
    pub gpu_view: Option<u64>,
    /// For GPU memory when the NIC's wire may skip TCP to peers on this host ([`WireConfig::gpu_ipc`]): the
    /// allocation the MR lies in, as another process maps it ([`GpuCopier::export`]), for `loc.addr`.
    ///
    /// [`WireConfig::gpu_ipc`]: super::WireConfig::gpu_ipc
    /// [`GpuCopier::export`]: crate::mem::GpuCopier::export
    pub export: Option<PeerExport>,
}

impl MrEntry {
    /// `addr..addr + len` as a location in this MR, or `None` when any of it lies outside.
    pub(crate) fn range(&self, addr: u64, len: u64) -> Option<MemLoc> {
        let start = self.loc.addr;
        let end = start.checked_add(self.len)?;
        let last = addr.checked_add(len)?;
        (addr >= start && last <= end).then_some(MemLoc { kind: self.loc.kind, addr })
    }

    /// Where an atomic on `loc` (inside this MR) runs: on the GPU for GPU memory and for host memory the GPU
    /// reaches (as [`MemKind::Gpu`] at its GPU address), so that every atomic of the NIC on such a word is
    /// the GPU's (atomic towards each other and towards device code's, and ordered behind the NIC's earlier
    /// GPU operations without a host wait); on the host for host memory the GPU cannot reach.
    pub(crate) fn atomic_view(&self, loc: MemLoc) -> MemLoc {
        match self.gpu_view {
            Some(base) if loc.kind == MemKind::Host => {
                MemLoc { kind: MemKind::Gpu, addr: base + (loc.addr - self.loc.addr) }
            }
            _ => loc,
        }
    }
}

#[derive(Debug, Default)]
struct Slot {
    variant: u8,
    entry: Option<MrEntry>,
}

/// Key → MR. Slot 0 is never used, so no key below 0x100 is valid (a zeroed handle's key fails).
#[derive(Debug, Default)]
pub(crate) struct MrTable {
    slots: Vec<Slot>,
    free: Vec<u32>,
}

/// Highest slot index: keys have 24 index bits.
const MAX_INDEX: u32 = (1 << 24) - 1;

impl MrTable {
    /// Stores `entry` and returns its key, or `None` when all 2^24 - 1 slots are taken.
    pub(crate) fn insert(&mut self, entry: MrEntry) -> Option<u32> {
        if self.slots.is_empty() {
            self.slots.push(Slot::default());
        }
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                let i = u32::try_from(self.slots.len()).ok().filter(|&i| i <= MAX_INDEX)?;
                // Start variants at an odd value so that a key is never a small integer by accident.
                self.slots.push(Slot { variant: 0x5a, entry: None });
                i
            }
        };
        let slot = &mut self.slots[index as usize];
        slot.variant = slot.variant.wrapping_add(1);
        slot.entry = Some(entry);
        Some(index << 8 | slot.variant as u32)
    }

    /// Removes the MR with `key`; returns its entry, if there was one.
    pub(crate) fn remove(&mut self, key: u32) -> Option<MrEntry> {
        let index = key >> 8;
        match self.slots.get_mut(index as usize) {
            Some(slot) if index != 0 && slot.variant == key as u8 => {
                let entry = slot.entry.take()?;
                self.free.push(index);
                Some(entry)
            }
            _ => None,
        }
    }

    /// The MR with `key`, if registered.
    pub(crate) fn get(&self, key: u32) -> Option<&MrEntry> {
        let index = key >> 8;
        if index == 0 {
            return None;
        }
        let slot = self.slots.get(index as usize)?;
        if slot.variant != key as u8 {
            return None;
        }
        slot.entry.as_ref()
    }
}

/// Checks `reg_mr`'s arguments as `ibv_reg_mr` would (EINVAL cases).
pub(crate) fn check_reg(loc: MemLoc, len: u64, access: Access, have_gpu: bool) -> Result<(), String> {
    if len == 0 {
        return Err("MR length is zero".into());
    }
    if loc.addr == 0 {
        return Err("MR address is null".into());
    }
    if loc.addr.checked_add(len).is_none() {
        return Err(format!("MR {:#x}+{len} wraps the address space", loc.addr));
    }
    if access.bits() & !Access::ALL.bits() != 0 {
        return Err(format!("unknown access bits {:#x}", access.bits()));
    }
    if (access.contains(Access::REMOTE_WRITE) || access.contains(Access::REMOTE_ATOMIC))
        && !access.contains(Access::LOCAL_WRITE)
    {
        return Err("REMOTE_WRITE and REMOTE_ATOMIC need LOCAL_WRITE (as ibv_reg_mr)".into());
    }
    if loc.kind == MemKind::Gpu && !have_gpu {
        return Err("MR in GPU memory, but the NIC was opened without a GPU copier".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(addr: u64, len: u64) -> MrEntry {
        MrEntry {
            pdn: 1,
            loc: MemLoc { kind: MemKind::Host, addr },
            len,
            access: Access::ALL,
            gpu_view: None,
            export: None,
        }
    }

    #[test]
    fn keys_change_on_reuse_and_stale_keys_fail() {
        let mut t = MrTable::default();
        let k1 = t.insert(entry(0x1000, 64)).unwrap();
        assert_eq!(k1 >> 8, 1);
        assert!(t.get(k1).is_some());
        assert!(t.remove(k1).is_some());
        assert!(t.get(k1).is_none());
        let k2 = t.insert(entry(0x2000, 64)).unwrap();
        assert_eq!(k2 >> 8, 1, "slot reused");
        assert_ne!(k1, k2, "variant byte changed");
        assert!(t.get(k1).is_none());
        assert_eq!(t.get(k2).unwrap().loc.addr, 0x2000);
        assert!(t.get(0).is_none() && t.get(0xff).is_none());
        assert!(t.remove(k1).is_none());
    }

    #[test]
    fn range_checks_bounds_without_overflow() {
        let e = entry(0x1000, 0x100);
        assert!(e.range(0x1000, 0x100).is_some());
        assert!(e.range(0x10ff, 1).is_some());
        assert!(e.range(0x10ff, 2).is_none());
        assert!(e.range(0xfff, 1).is_none());
        assert!(e.range(u64::MAX, 2).is_none());
    }
}
