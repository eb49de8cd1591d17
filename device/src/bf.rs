//! The BlueFlame staging area of an Exclusive QP: `SLOTS` 64-byte slots (one WQEBB each) in a CTA's shared
//! memory, where a BlueFlame WQE is built before it is stored to the SQ ring and, whole, to the BlueFlame
//! register (DOCA GPUNetIO builds BlueFlame WQEs in shared memory the same way; design.md, "BlueFlame").
//!
//! Slots are used round-robin, and a slot is reused only once the WQE that last used it has completed, so
//! the copy in a slot is the WQE the NIC may still be reading from the ring. To keep that wait rare, every
//! `SLOTS / 2`-th BlueFlame WQE asks for a CQE: when a slot comes round again, a CQE at or after its WQE was
//! requested at least `SLOTS / 2` posts earlier.

use bytemuck::Zeroable;
use gdaki_shared::prm::wqe::{Seg, SEGS_PER_WQEBB};

/// Slots of the area when a kernel does not choose (the default).
pub const DEFAULT_SLOTS: usize = 32;

/// `SLOTS` (≥ 2) BlueFlame slots and the bookkeeping of their reuse: `SLOTS × 72 + 8` bytes, 64-byte aligned.
/// All-zero bytes are a fresh area (every slot free), so a kernel clears its shared-memory copy before use,
/// and host threads (the `cpu` executor) take [`Zeroable::zeroed`]. One area belongs to one QP for its life:
/// the indices it keeps are that QP's.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub struct BfSlots<const SLOTS: usize = DEFAULT_SLOTS> {
    wqebb: [[Seg; SEGS_PER_WQEBB]; SLOTS],
    /// Per slot: 1 + the 64-bit WQEBB index of the WQE built there last; 0 for never used.
    last: [u64; SLOTS],
    /// BlueFlame WQEs built so far.
    next: u64,
}

// SAFETY: plain integers and segments; all-zero is the fresh state.
unsafe impl<const SLOTS: usize> Zeroable for BfSlots<SLOTS> {}

impl<const SLOTS: usize> BfSlots<SLOTS> {
    const CHECK: () = assert!(SLOTS >= 2, "a BlueFlame area has at least 2 slots");

    /// 1 + the WQEBB index of the WQE the next slot held last (0: never used): it must have completed before
    /// [`BfSlots::take`].
    #[inline(always)]
    pub fn next_previous(&self) -> u64 {
        let () = Self::CHECK;
        self.last[(self.next % SLOTS as u64) as usize]
    }

    /// Whether the WQE for the next slot must ask for a CQE, so that the slots ahead of it can be reused.
    #[inline(always)]
    pub fn next_signals(&self) -> bool {
        (self.next % SLOTS as u64 + 1).is_multiple_of(SLOTS as u64 / 2)
    }

    /// Takes the next slot for the WQE at WQEBB index `pi`: where to put its first WQEBB. The caller has made
    /// sure that the WQE [`BfSlots::next_previous`] named has completed.
    #[inline(always)]
    pub fn take(&mut self, pi: u64) -> &mut [Seg; SEGS_PER_WQEBB] {
        let i = (self.next % SLOTS as u64) as usize;
        self.next += 1;
        self.last[i] = pi + 1;
        &mut self.wqebb[i]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_round_robin_and_signal_every_half() {
        let mut a: BfSlots<4> = Zeroable::zeroed();
        let mut signals = std::vec::Vec::new();
        for k in 0..8u64 {
            // WQEBB indices 10·k, so that the bookkeeping is seen to keep indices, not post counts.
            let prev = a.next_previous();
            assert_eq!(prev, if k < 4 { 0 } else { 10 * (k - 4) + 1 }, "slot of post {k}");
            signals.push(a.next_signals());
            a.take(10 * k);
        }
        assert_eq!(signals, [false, true, false, true, false, true, false, true]);
    }

    #[test]
    fn size_and_alignment() {
        assert_eq!(core::mem::size_of::<BfSlots>(), 32 * 64 + 32 * 8 + 8 + 56);
        assert_eq!(core::mem::align_of::<BfSlots>(), 64);
    }
}
