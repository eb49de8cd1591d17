//! The SQ ring: where a WQE's segments go. A WQE starting at producer index `pi` occupies segments
//! `pi * 4 ..` of the ring, modulo the ring size, so a WQE that runs past the last WQEBB continues at slot 0
//! (PRM "Send Queue"; rdma-core wraps data segments at `qend` the same way).

use crate::sync;
use gdaki_shared::prm::wqe::{Seg, SEGS_PER_WQEBB};

/// Stores the first `ds` of `segs` (a WQE of `ds` 16-byte segments) into the ring at `sq_buf` (`wqe_cnt`
/// WQEBBs) starting at WQEBB index `pi`, wrapping at the ring's end, and zeroes the rest of its last WQEBB.
/// Unordered stores: publish with a release fence before the dbrec.
///
/// The WQE's WQEBBs are stored whole: a NIC reads `ds` segments and ignores the rest of the last WQEBB (PRM
/// "Send Queue"), but a 32-byte sector of GPU memory written in part costs more than one written whole.
/// Measured on the H200 with rings larger than L2 (264 warps posting one-WQEBB RDMA WRITEs, `ds` 3, each
/// WQE's second sector half written when its fourth segment is left alone): 6.29 G WQE/s, and 8.01 G with
/// that segment zeroed, while one warp, which writes about 1 MiB of its ring per launch, went from 26.7-27.1 to
/// 27.4 ns per WQE. (Why the half-written sector costs, in L2 or in the release fences after the stores, was
/// not measured.)
///
/// A WQE wraps only between WQEBBs, so the address is computed once per WQEBB (from the 32-bit index: the
/// ring has at most 2^15 WQEBBs) and the segments of one WQEBB go to consecutive 16-byte slots. The loop over
/// the segments runs `N` (a constant) times with a test of `ds` in each, not `ds` times: it unrolls, and the
/// segments stay in registers. A loop of run-time length indexes the array, which puts it in local memory (a
/// store and a load of each segment through L1 before its store to the ring, seen in the ping-pong kernel,
/// whose `ds` is not a constant). The zeroes after it index nothing, so their loop may run `ds`-dependent
/// times.
///
/// # Safety
/// `sq_buf` must be the 64-byte aligned SQ ring of `wqe_cnt` (a power of two) WQEBBs, writable, and the
/// WQEBBs `pi .. pi + ceil(ds / 4)` must be reserved by the caller.
#[inline(always)]
pub unsafe fn write_segs<const N: usize>(sq_buf: u64, wqe_cnt: u32, pi: u64, segs: &[Seg; N], ds: u8) {
    let mask = wqe_cnt.wrapping_sub(1);
    let slot = |i: usize| {
        let wqebb = (pi as u32).wrapping_add((i / SEGS_PER_WQEBB) as u32) & mask;
        wqebb as usize * SEGS_PER_WQEBB + i % SEGS_PER_WQEBB
    };
    for (i, s) in segs.iter().enumerate() {
        if i >= ds as usize {
            continue;
        }
        // SAFETY: the slot is inside the ring (masked WQEBB, slot within it), the ring is 16-byte aligned, and
        // the caller reserved it.
        unsafe { sync::store_seg((sq_buf as *mut Seg).add(slot(i)), *s) };
    }
    for i in ds as usize..(ds as usize).div_ceil(SEGS_PER_WQEBB) * SEGS_PER_WQEBB {
        // SAFETY: as above: the rest of the WQE's last WQEBB, which the caller reserved.
        unsafe { sync::store_seg((sq_buf as *mut Seg).add(slot(i)), Seg::default()) };
    }
}

/// Smallest SQ device code posts to, WQEBBs: an Exclusive QP asks for a CQE every quarter ring, which must
/// leave room for a 4-WQEBB WQE.
pub const MIN_WQE_CNT: u32 = 16;

/// Largest SQ, WQEBBs: 2^15 (ConnectX's `max_qp_wr`). Fewer than 2^16 WQEBBs are then ever in flight, so a
/// CQE's 16-bit `wqe_counter` names one outstanding WQE and a doorbell's 16-bit index one producer index.
pub const MAX_WQE_CNT: u32 = 1 << 15;

/// Whether device code can post to an SQ of `wqe_cnt` WQEBBs: a power of two in
/// [`MIN_WQE_CNT`]`..=`[`MAX_WQE_CNT`].
#[inline(always)]
pub const fn valid_ring(wqe_cnt: u32) -> bool {
    // A power of two whose one bit is among those of MIN_WQE_CNT ..= MAX_WQE_CNT: a population count and an
    // AND, where the two range comparisons took an addition and two tests more.
    const SIZES: u32 = (MAX_WQE_CNT << 1).wrapping_sub(1) & !(MIN_WQE_CNT - 1);
    wqe_cnt.is_power_of_two() && wqe_cnt & SIZES != 0
}

/// WQEBBs free in a ring of `wqe_cnt` given the producer and retired indices.
#[inline(always)]
pub const fn free_wqebbs(wqe_cnt: u32, pi: u64, ci: u64) -> u64 {
    // Wrapping and saturating: a forged handle (ci > pi) reads as a full ring, never as a panic.
    (wqe_cnt as u64).saturating_sub(pi.wrapping_sub(ci))
}

/// Reconstructs the 64-bit WQEBB index of a CQE's 16-bit `wqe_counter`, given the retired index `ci`, the
/// producer (or reserved) index `pi` and the ring size `wqe_cnt`: the index `w` with `ci <= w < pi` and
/// `w < ci + wqe_cnt` whose low 16 bits are `wqe_counter`. `None` when no outstanding WQE has that index: a
/// stale CQE, or another QP's.
///
/// The answer is unique however far `pi` runs ahead of `ci` (a shared QP's reservations may exceed 2^16 when
/// that many threads wait for room): every stored WQE lies in `[ci, ci + wqe_cnt)` because a poster stores
/// only after the room check, and `wqe_cnt` ≤ [`MAX_WQE_CNT`] < 2^16.
#[inline(always)]
pub const fn wqe_index_from_counter(ci: u64, pi: u64, wqe_cnt: u32, wqe_counter: u16) -> Option<u64> {
    let ahead = wqe_counter.wrapping_sub(ci as u16) as u64;
    let w = ci + ahead;
    if ahead < wqe_cnt as u64 && w < pi {
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
        assert_eq!(wqe_index_from_counter(0xfff0, 0x1_0002, 64, 0xffff), Some(0xffff));
        assert_eq!(wqe_index_from_counter(0xfff0, 0x1_0002, 64, 0x0001), Some(0x1_0001));
        assert_eq!(wqe_index_from_counter(5, 6, 16, 5), Some(5));
        // Not outstanding: already retired, not yet posted, or beyond a producer index below 2^16.
        assert_eq!(wqe_index_from_counter(6, 8, 16, 5), None);
        assert_eq!(wqe_index_from_counter(0, 1, 16, 3), None);
        assert_eq!(wqe_index_from_counter(0xfff0, 0x1_0002, 64, 0x0002), None);
    }

    #[test]
    fn counter_reconstruction_with_reservations_far_ahead() {
        // 200,000 WQEBBs reserved beyond the retired index (threads waiting for room on a 2^15 ring): the CQE
        // can only be for a WQE inside the ring's window above `ci`, and it is found there.
        let (ci, pi, cnt) = (3 * 65536 + 100, 3 * 65536 + 100 + 200_000, 1 << 15);
        assert_eq!(wqe_index_from_counter(ci, pi, cnt, 100), Some(ci));
        assert_eq!(wqe_index_from_counter(ci, pi, cnt, 100 + 32767), Some(ci + 32767));
        // One past the window: no stored WQE can be there yet.
        assert_eq!(wqe_index_from_counter(ci, pi, cnt, 100 + 32768), None);
        // The WQE just retired (stale).
        assert_eq!(wqe_index_from_counter(ci, pi, cnt, 99), None);
        // Exhaustively on a small ring: exactly the counters of [ci, ci + cnt) map, each to its own index.
        for ci in [0u64, 65_530, 1 << 40] {
            let hits: Vec<(u16, u64)> = (0..=u16::MAX)
                .filter_map(|c| wqe_index_from_counter(ci, ci + 1_000_000, 16, c).map(|w| (c, w)))
                .collect();
            // Each counter names the index whose low 16 bits it is, and together they are the window.
            assert!(hits.iter().all(|&(c, w)| w as u16 == c), "{ci}: {hits:?}");
            let mut indices: Vec<u64> = hits.iter().map(|&(_, w)| w).collect();
            indices.sort_unstable();
            assert_eq!(indices, (ci..ci + 16).collect::<Vec<_>>(), "{ci}");
        }
    }

    #[test]
    fn valid_ring_is_a_power_of_two_in_range() {
        let by_range = |c: u32| c.is_power_of_two() && (MIN_WQE_CNT..=MAX_WQE_CNT).contains(&c);
        for c in (0..=(1u32 << 17)).chain((0..32).flat_map(|b| [1u32 << b, (1u32 << b) + 1, (1u32 << b) - 1])) {
            assert_eq!(valid_ring(c), by_range(c), "{c}");
        }
        assert!(!valid_ring(u32::MAX));
    }

    #[test]
    fn wrapping_wqe_continues_at_slot_zero() {
        // A 16-WQEBB ring; a 2-WQEBB WQE (8 segments) starting in the last WQEBB.
        let mut ring = vec![Seg::default(); 16 * 4];
        let segs: [Seg; 8] = core::array::from_fn(|i| Seg([i as u64 + 1, !(i as u64 + 1)]));
        // SAFETY: `ring` is a 16-WQEBB, 16-byte aligned buffer we own.
        unsafe { write_segs(ring.as_mut_ptr() as u64, 16, 16 * 3 + 15, &segs, 8) };
        assert_eq!(&ring[60..64], &segs[..4]);
        assert_eq!(&ring[0..4], &segs[4..]);
        assert!(ring[4..60].iter().all(|s| *s == Seg::default()));
    }

    #[test]
    fn the_first_ds_segments_are_stored_and_the_last_wqebb_zeroed() {
        // A ring full of a pattern no store writes, so that every slot the call touches shows.
        let old = Seg([0xdead_beef, 0xfeed]);
        let mut ring = vec![old; 16 * 4];
        let segs: [Seg; 8] = core::array::from_fn(|i| Seg([i as u64 + 1, 7]));
        // SAFETY: `ring` is a 16-WQEBB, 16-byte aligned buffer we own.
        unsafe { write_segs(ring.as_mut_ptr() as u64, 16, 2, &segs, 5) };
        // ds 5: WQEBBs 2 and 3; segments 0..5, then the rest of WQEBB 3 zero; nothing else moves.
        assert_eq!(&ring[8..13], &segs[..5]);
        assert!(ring[13..16].iter().all(|s| *s == Seg::default()));
        assert!(ring[..8].iter().chain(&ring[16..]).all(|s| *s == old));
        // A WQE that fills its WQEBBs (ds 8) leaves nothing to zero; one of ds 1 zeroes three segments.
        let mut ring = vec![old; 16 * 4];
        // SAFETY: as above.
        unsafe { write_segs(ring.as_mut_ptr() as u64, 16, 5, &segs, 8) };
        assert_eq!(&ring[20..28], &segs[..]);
        assert!(ring[..20].iter().chain(&ring[28..]).all(|s| *s == old));
        let mut ring = vec![old; 16 * 4];
        // SAFETY: as above.
        unsafe { write_segs(ring.as_mut_ptr() as u64, 16, 15, &[segs[0]], 1) };
        assert_eq!(ring[60], segs[0]);
        assert!(ring[61..64].iter().all(|s| *s == Seg::default()));
        assert!(ring[..60].iter().all(|s| *s == old));
    }
}
