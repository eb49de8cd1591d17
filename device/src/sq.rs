//! The SQ ring: where a WQE's segments go. A WQE starting at producer index `pi` occupies segments
//! `pi * 4 ..` of the ring, modulo the ring size, so a WQE that runs past the last WQEBB continues at slot 0
//! (PRM "Send Queue"; rdma-core wraps data segments at `qend` the same way).

use crate::sync;
use gdaki_shared::prm::wqe::{Seg, SEGS_PER_WQEBB};

/// Stores `segs` into the ring at `sq_buf` (`wqe_cnt` WQEBBs) starting at WQEBB index `pi`, wrapping at the
/// ring's end. Unordered stores: publish with a release fence before the dbrec.
///
/// # Safety
/// `sq_buf` must be the 64-byte aligned SQ ring of `wqe_cnt` (a power of two) WQEBBs, writable, and the
/// WQEBBs `pi .. pi + ceil(segs.len() / 4)` must be reserved by the caller.
#[inline(always)]
pub unsafe fn write_segs(sq_buf: u64, wqe_cnt: u32, pi: u64, segs: &[Seg]) {
    let mask = (wqe_cnt as u64 * SEGS_PER_WQEBB as u64) - 1;
    let first = pi * SEGS_PER_WQEBB as u64;
    for (i, s) in segs.iter().enumerate() {
        let slot = (first + i as u64) & mask;
        // SAFETY: `slot` is inside the ring (masked), the ring is 16-byte aligned, and the caller reserved it.
        unsafe { sync::store_seg((sq_buf as *mut Seg).add(slot as usize), *s) };
    }
}

/// WQEBBs free in a ring of `wqe_cnt` given the producer and retired indices.
#[inline(always)]
pub const fn free_wqebbs(wqe_cnt: u32, pi: u64, ci: u64) -> u64 {
    // Wrapping and saturating: a forged handle (ci > pi) reads as a full ring, never as a panic.
    (wqe_cnt as u64).saturating_sub(pi.wrapping_sub(ci))
}

/// Reconstructs the 64-bit WQEBB index of a 16-bit `wqe_counter` from a CQE, given the retired index `ci` and
/// the producer index `pi`: the one index `w` with `ci <= w < pi` whose low 16 bits are `wqe_counter` (fewer
/// than 2^16 WQEBBs are in flight). `None` when no outstanding WQE has that index: a stale CQE, or another QP's.
#[inline(always)]
pub const fn wqe_index_from_counter(ci: u64, pi: u64, wqe_counter: u16) -> Option<u64> {
    let w = pi.wrapping_sub((pi as u16).wrapping_sub(wqe_counter) as u64);
    if w >= ci && w < pi {
        Some(w)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::{vec, vec::Vec};

    #[test]
    fn counter_reconstruction_across_wrap() {
        // pi just past the 16-bit wrap; the completed WQE was the last one before it.
        assert_eq!(wqe_index_from_counter(0xfff0, 0x1_0002, 0xffff), Some(0xffff));
        assert_eq!(wqe_index_from_counter(0xfff0, 0x1_0002, 0x0001), Some(0x1_0001));
        assert_eq!(wqe_index_from_counter(5, 6, 5), Some(5));
        // Not outstanding: already retired, not yet posted, or beyond a producer index below 2^16.
        assert_eq!(wqe_index_from_counter(6, 8, 5), None);
        assert_eq!(wqe_index_from_counter(0, 1, 3), None);
        assert_eq!(wqe_index_from_counter(0xfff0, 0x1_0002, 0x0002), None);
    }

    #[test]
    fn wrapping_wqe_continues_at_slot_zero() {
        // A 16-WQEBB ring; a 2-WQEBB WQE (8 segments) starting in the last WQEBB.
        let mut ring = vec![Seg::default(); 16 * 4];
        let segs: Vec<Seg> = (0..8u64).map(|i| Seg([i + 1, !(i + 1)])).collect();
        // SAFETY: `ring` is a 16-WQEBB, 16-byte aligned buffer we own.
        unsafe { write_segs(ring.as_mut_ptr() as u64, 16, 16 * 3 + 15, &segs) };
        assert_eq!(&ring[60..64], &segs[..4]);
        assert_eq!(&ring[0..4], &segs[4..]);
        assert!(ring[4..60].iter().all(|s| *s == Seg::default()));
    }
}
