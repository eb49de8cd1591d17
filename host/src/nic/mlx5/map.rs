//! Device-visible addresses of the queue memory rdma-core allocated (SQ ring, CQ ring, doorbell records) and
//! of the UAR page it mmapped: the identity for the `cpu` executor; for `gpu`, the host pages registered with
//! the GPU (`cuMemHostRegister`, the UAR with `IOMEMORY`).
//!
//! Doorbell records of several QPs and CQs share a page (rdma-core carves them out of one), and QPs share UAR
//! pages, while CUDA refuses to register a page twice: registrations are per page range and shared, counted by
//! `Arc`, and dropped with their last user.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use crate::cuda::{Gpu, HostRegistration};
use crate::{Error, Result};

/// Host page size rdma-core and CUDA work in, bytes.
pub(super) const PAGE: u64 = 4096;

/// The whole pages covering `addr..addr + len`: `(first page, bytes)`.
pub(super) fn page_span(addr: u64, len: u64) -> Option<(u64, u64)> {
    let start = addr & !(PAGE - 1);
    let end = addr.checked_add(len.max(1))?.checked_next_multiple_of(PAGE)?;
    Some((start, end - start))
}

/// One host range as device code addresses it; keeps its registration alive.
#[derive(Debug)]
pub(super) struct Mapped {
    /// Device-visible address of the range's first byte.
    pub(super) device_addr: u64,
    _reg: Option<Arc<HostRegistration>>,
}

/// Maps host ranges for one executor.
#[derive(Debug)]
pub(super) struct Mapper {
    gpu: Option<Arc<Gpu>>,
    /// Live registrations by (first page, bytes, MMIO).
    regs: Mutex<HashMap<(u64, u64, bool), Weak<HostRegistration>>>,
}

impl Mapper {
    /// For the `cpu` executor (`gpu` `None`: device code uses host addresses) or a GPU.
    pub(super) fn new(gpu: Option<Arc<Gpu>>) -> Self {
        Self { gpu, regs: Mutex::new(HashMap::new()) }
    }

    /// The GPU, if device code runs on one.
    pub(super) fn gpu(&self) -> Option<&Arc<Gpu>> {
        self.gpu.as_ref()
    }

    /// `addr..addr + len` (host memory, or MMIO when `io`) as device code sees it.
    ///
    /// # Safety
    /// The whole pages covering the range must stay mapped in this process while the returned [`Mapped`]
    /// lives, and must not overlap pages mapped here as another span.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a range that wraps; the CUDA driver's error registering it.
    pub(super) unsafe fn map(&self, addr: u64, len: u64, io: bool) -> Result<Mapped> {
        let Some(gpu) = &self.gpu else {
            return Ok(Mapped { device_addr: addr, _reg: None });
        };
        let (start, bytes) =
            page_span(addr, len).ok_or_else(|| Error::InvalidArgument(format!("range {addr:#x}+{len} wraps")))?;
        // A panic while the lock was held leaves a valid table (entries are inserted whole).
        let mut regs = self.regs.lock().unwrap_or_else(|e| e.into_inner());
        let key = (start, bytes, io);
        let reg = match regs.get(&key).and_then(Weak::upgrade) {
            Some(r) => r,
            None => {
                let len = usize::try_from(bytes).map_err(|_| Error::InvalidArgument(format!("{bytes} bytes")))?;
                // SAFETY: the caller keeps the pages mapped; `start` and `bytes` are whole pages; overlaps with
                // other spans are the caller's to avoid (and CUDA refuses them with an error).
                let r = Arc::new(unsafe { gpu.register_host(start as *mut u8, len, io) }?);
                regs.retain(|_, w| w.strong_count() > 0);
                regs.insert(key, Arc::downgrade(&r));
                r
            }
        };
        Ok(Mapped { device_addr: reg.device_addr() + (addr - start), _reg: Some(reg) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_span_covers_whole_pages() {
        assert_eq!(page_span(0x1000, 0x1000), Some((0x1000, 0x1000)));
        assert_eq!(page_span(0x1008, 8), Some((0x1000, 0x1000)), "a dbrec inside a page");
        assert_eq!(page_span(0x1800, 0x1000), Some((0x1000, 0x2000)), "straddles two pages");
        assert_eq!(page_span(0x1800, 0), Some((0x1000, 0x1000)), "empty still needs its page");
        assert_eq!(page_span(u64::MAX - 8, 64), None);
    }

    #[test]
    fn cpu_mapping_is_the_identity() {
        let m = Mapper::new(None);
        // SAFETY: nothing is registered on the cpu path.
        let r = unsafe { m.map(0x7f00_1234, 64, true) }.unwrap();
        assert_eq!(r.device_addr, 0x7f00_1234);
    }
}
