//! Completion queues and the CQE writer.
//!
//! The ring is `ncqe` 64-byte CQEs in the umem CREATE_CQ named; software fills it before with `op_own = 0xF1`
//! (opcode INVALID, owner 1; [`fill_invalid`] for gdaki's own CQs) so that zeroed memory never looks valid.
//! The executor thread is the only producer; software (device code)
//! consumes and reports its consumer index in dbrec word 0 (24 bits). A CQE is written only into an entry
//! software has consumed; otherwise the CQ overruns, as on hardware (the CQ then stops taking CQEs).
//!
//! A CQ in GPU memory is written through the copier, one published write per CQE, in the copier's order
//! (after the data its CQEs report, with no wait); its consumer index is read through a copy only when the
//! index last read says the ring is full. A CQE into a CQ in host memory goes the same way while copier
//! operations are pending (through the ring's device address), else it is stored directly.

use std::mem::offset_of;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use gdaki_shared::handle::CqHandle;
use gdaki_shared::prm::cqe::{Cqe64, CQE_SIZE, OP_OWN_INVALID};
use gdaki_shared::prm::dbrec::{CqDbrec, CQ_CI_MASK};
use gdaki_shared::Be32;

use crate::mem::{GpuCopier, MemKind, MemLoc};
use crate::{Error, Result};

use super::access::DataPath;
use super::hostmem;
use super::qmem::{self, QBuf, QMem};
use super::stats::{bump, Counters};

/// Largest CQ, in CQEs: 2^22, the largest ring ConnectX takes. Its `ibv_query_device` reports `max_cqe` =
/// 2^22 - 1, and rdma-core's mlx5 provider allocates `cqe + 1` entries rounded up to a power of two, so
/// asking for `max_cqe` gives a ring of 2^22. Keeps the 24-bit consumer index unambiguous.
pub const MAX_CQE: u32 = 1 << 22;

/// Byte offset of the CQE's last 8-byte word (`sop_drop_qpn`, `wqe_counter`, `signature`, `op_own`): the
/// word that is written last and makes the entry valid.
const LAST_WORD: usize = offset_of!(Cqe64, sop_drop_qpn);
/// Index of `op_own` within the last word, as bytes in memory order.
const OP_OWN_BYTE: usize = offset_of!(Cqe64, op_own) - LAST_WORD;
/// Byte offset of the consumer index (`set_ci`, word 0) in the CQ's doorbell record.
const SET_CI: usize = offset_of!(CqDbrec, set_ci);

// `push` stores the entry as eight words, the last one after the others.
const _: () = assert!(LAST_WORD == CQE_SIZE - 8 && OP_OWN_BYTE == 7);

/// The CQ as the executor uses it.
#[derive(Debug)]
pub(crate) struct CqInner {
    pub cqn: u32,
    pub ncqe: u32,
    ring: QBuf,
    dbrec: QBuf,
    /// For a CQ in GPU memory: the dbrec's consumer index (24 bits) as last read.
    ci_seen: AtomicU32,
    /// CQEs written so far; only the executor thread stores it.
    produced: AtomicU64,
    /// Set on overrun; no CQE is written after it.
    error: AtomicBool,
}

/// Fills the `ncqe` entries of a CQ ring at byte `off` of `mem` with `op_own = 0xF1` (opcode INVALID, owner 1)
/// and zeroes, as software prepares a ring before CREATE_CQ (rdma-core's provider writes 0xF0), so that no
/// entry looks valid before the NIC writes it: in host memory with word stores, in GPU memory with one copy
/// through `gpu`, waited for.
///
/// # Errors
/// [`Error::InvalidArgument`] when the ring does not fit `mem` at `off` or is not 8-byte aligned;
/// [`Error::OutOfMemory`] when the image of a ring in GPU memory cannot be allocated; the copier's error.
pub(crate) fn fill_invalid(mem: &QMem, gpu: Option<&Arc<dyn GpuCopier>>, off: usize, ncqe: u32) -> Result<()> {
    let len = ncqe as usize * CQE_SIZE;
    let bad =
        || Error::InvalidArgument(format!("CQ ring of {len} bytes at offset {off} of a {}-byte buffer", mem.len()));
    if !off.is_multiple_of(8) || off.checked_add(len).is_none_or(|end| end > mem.len()) {
        return Err(bad());
    }
    // op_own is a byte of the last word; native-endian bytes keep memory order.
    let mut last = [0u8; 8];
    last[OP_OWN_BYTE] = OP_OWN_INVALID;
    let last = u64::from_ne_bytes(last);
    let word = |i: usize| if i % (CQE_SIZE / 8) == LAST_WORD / 8 { last } else { 0 };
    match (mem, gpu) {
        (QMem::Host(b), _) => {
            // Stored in place, with no image: a ring the allocator gave must not fail for want of a copy of it.
            let host = b.host_ptr();
            for i in 0..len / 8 {
                // SAFETY: `off + len <= mem.len()` (checked above) and `off` is 8-aligned in a 4096-aligned
                // buffer, so every word is inside and aligned; no CQ uses the ring yet, so nothing else writes
                // it, and device code reads it only with atomic or volatile loads.
                unsafe { AtomicU64::from_ptr(host.add(off + i * 8).cast()) }.store(word(i), Ordering::Relaxed);
            }
            std::sync::atomic::fence(Ordering::Release);
            Ok(())
        }
        (QMem::Gpu(g), Some(copier)) => {
            let mut image = hostmem::zeroed::<u64>(len / 8)?;
            for (i, w) in image.iter_mut().enumerate() {
                *w = word(i);
            }
            let src = MemLoc { kind: MemKind::Host, addr: image.as_ptr() as u64 };
            // SAFETY: the ring is `len` bytes inside `g` (checked above), `image` as long; `image` lives until
            // the synchronize below.
            unsafe { copier.copy_async(g.loc(off), src, len)? };
            copier.synchronize()
        }
        (QMem::Gpu(_), None) => Err(Error::InvalidArgument("a CQ ring in GPU memory needs a GPU copier".into())),
    }
}

/// Why a CQE could not be written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CqFull;

impl CqInner {
    /// The CQ `cqn` over a ring of `ncqe` CQEs (a power of two, `1..=MAX_CQE`) and a dbrec, both checked by
    /// CREATE_CQ. The NIC does not touch the ring here: software fills it first ([`fill_invalid`]).
    pub(crate) fn new(cqn: u32, ncqe: u32, ring: QBuf, dbrec: QBuf) -> Self {
        let ci_seen = AtomicU32::new(0);
        Self { cqn, ncqe, ring, dbrec, ci_seen, produced: AtomicU64::new(0), error: AtomicBool::new(false) }
    }

    /// CQEs written so far (64-bit producer count).
    pub(crate) fn produced(&self) -> u64 {
        self.produced.load(Ordering::Acquire)
    }

    /// Whether the CQ overran and stopped taking CQEs.
    pub(crate) fn is_error(&self) -> bool {
        self.error.load(Ordering::Acquire)
    }

    pub(crate) fn handle(&self) -> CqHandle {
        CqHandle {
            buf: self.ring.device_addr(),
            dbrec: self.dbrec.device_addr(),
            ncqe: self.ncqe,
            cqn: self.cqn,
            // Where the NIC is: a new CQ's handle starts at 0, a later one after every CQE written so far.
            cons_index: self.produced.load(Ordering::Acquire),
            placement: self.ring.placement(),
            pad: 0,
        }
    }

    /// Whether the ring is in GPU memory (its CQEs follow the data path's copies in stream order).
    pub(crate) fn in_gpu(&self) -> bool {
        matches!(self.ring, QBuf::Gpu(_))
    }

    /// The consumer index software last reported (24 bits): read from host memory, or for a GPU dbrec the
    /// value last read, read again through a copy when `refresh`.
    fn consumer_index(&self, data: &mut DataPath, refresh: bool) -> u32 {
        match &self.dbrec {
            QBuf::Host(d) => Be32::from_bits(qmem::load_u32(d, SET_CI, Ordering::Acquire)).get() & CQ_CI_MASK,
            QBuf::Gpu(_) if !refresh => self.ci_seen.load(Ordering::Relaxed),
            QBuf::Gpu(_) => {
                let mut b = [0u8; 4];
                // A failed read keeps the last value (the CQ then overruns, as it would on a dead GPU).
                if data.fetch(&mut [(self.dbrec.loc(SET_CI), &mut b[..])]).is_ok() {
                    let ci = Be32::from_bits(u32::from_ne_bytes(b)).get() & CQ_CI_MASK;
                    self.ci_seen.store(ci, Ordering::Relaxed);
                }
                self.ci_seen.load(Ordering::Relaxed)
            }
        }
    }

    /// Writes `cqe` (owner bit clear) into the next entry, setting the owner bit to the lap parity of the
    /// producer index. Bytes 0..56 go first (relaxed), then the last 8 bytes (`sop_drop_qpn`, `wqe_counter`,
    /// `signature`, `op_own`) in one Release store, so that a reader who sees the new `op_own` with Acquire
    /// sees the whole entry. In GPU memory the entry is one published write of the copier
    /// ([`DataPath::publish`]), which stores the last word in the same way, after every operation enqueued
    /// before (the data the CQE reports).
    ///
    /// # Errors
    /// [`CqFull`] when software has not consumed the entry (overrun: the CQ moves to error and the caller
    /// moves its QP to error) or the CQ already overran.
    pub(crate) fn push(&self, cqe: &Cqe64, counters: &Counters, data: &mut DataPath) -> Result<(), CqFull> {
        if self.error.load(Ordering::Relaxed) {
            return Err(CqFull);
        }
        let pi = self.produced.load(Ordering::Relaxed);
        // Entries software has not consumed yet, from the 24-bit CI (a CI "ahead" of the PI reads as huge).
        let outstanding = |ci: u32| (pi as u32).wrapping_sub(ci) & CQ_CI_MASK;
        let mut ci = self.consumer_index(data, false);
        if outstanding(ci) >= self.ncqe && self.in_gpu() {
            ci = self.consumer_index(data, true);
        }
        if outstanding(ci) >= self.ncqe {
            self.error.store(true, Ordering::Release);
            bump(&counters.cq_overruns);
            tracing::warn!(cqn = self.cqn, pi, ci, "emulated NIC: CQ overrun (software has not consumed the entry)");
            return Err(CqFull);
        }
        // Constant indices into fixed-size arrays: a layout that broke them would not compile.
        let words: [u64; CQE_SIZE / 8] = bytemuck::cast(*cqe);
        let owner = ((pi / self.ncqe as u64) & 1) as u8;
        let mut last = words[LAST_WORD / 8].to_ne_bytes();
        last[OP_OWN_BYTE] = (last[OP_OWN_BYTE] & !1) | owner;
        let base = (pi & (self.ncqe as u64 - 1)) as usize * CQE_SIZE;
        match &self.ring {
            QBuf::Host(r) if data.pending() => {
                // Behind pending copier operations (the data this CQE reports): written by the copier too,
                // through the ring's device address, so that the NIC need not wait for them.
                let mut entry = words;
                entry[LAST_WORD / 8] = u64::from_ne_bytes(last);
                let at = MemLoc { kind: MemKind::Gpu, addr: r.device_addr() + base as u64 };
                // SAFETY: the entry lies inside the ring, which this CQ keeps alive while the executor uses it.
                if unsafe { data.publish(at, bytemuck::bytes_of(&entry)) }.is_err() {
                    self.error.store(true, Ordering::Release);
                    return Err(CqFull);
                }
            }
            QBuf::Host(r) => {
                for (i, w) in words.iter().enumerate().take(LAST_WORD / 8) {
                    qmem::store_u64(r, base + i * 8, *w, Ordering::Relaxed);
                }
                qmem::store_u64(r, base + LAST_WORD, u64::from_ne_bytes(last), Ordering::Release);
            }
            QBuf::Gpu(g) => {
                let mut entry = words;
                entry[LAST_WORD / 8] = u64::from_ne_bytes(last);
                // SAFETY: the entry lies inside the ring, which this CQ keeps alive while the executor uses it.
                if unsafe { data.publish(g.loc(base), bytemuck::bytes_of(&entry)) }.is_err() {
                    // The GPU is unusable (its operations fail): nothing more reaches this CQ.
                    self.error.store(true, Ordering::Release);
                    return Err(CqFull);
                }
            }
        }
        self.produced.store(pi + 1, Ordering::Release);
        Ok(())
    }
}
