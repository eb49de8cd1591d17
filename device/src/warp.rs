//! Warp-level primitives for warp-aggregated posting (sm_70+ semantics on nvptx: `shfl.sync`, `vote.sync`
//! and `bar.warp.sync` with an explicit member mask, which lanes may reach at different instructions).
//!
//! On the host (the `cpu` executor) a thread is a warp of one lane: the members are the caller alone, a
//! shuffle returns the caller's own value and a vote its own predicate, so that code written for a warp runs
//! unchanged, each thread posting for itself.

use crate::error::Error;
use gdaki_shared::handle::ErrorReport;

/// The lanes of the calling warp that execute this call together, and the caller's place among them.
#[derive(Clone, Copy, Debug)]
pub struct Lanes {
    /// Member mask (`activemask`).
    pub mask: u32,
    /// This lane's index in the warp, 0..32.
    pub lane: u32,
}

impl Lanes {
    /// The lanes executing this call now with the same `key` (e.g. the address of the QP they post to:
    /// `match.any.sync.b64` within `activemask`); on the host, the caller alone.
    #[inline(always)]
    pub fn active_with(key: u64) -> Self {
        let active = Self::active();
        #[cfg(target_arch = "nvptx64")]
        {
            let mask: u32;
            // SAFETY: comparing registers among the active lanes touches no memory.
            unsafe {
                core::arch::asm!("match.any.sync.b64 {d}, {k}, {m};", d = out(reg32) mask, k = in(reg64) key,
                    m = in(reg32) active, options(nostack, nomem));
            }
            Self::of(mask)
        }
        #[cfg(not(target_arch = "nvptx64"))]
        {
            let _ = key;
            Self::of(active)
        }
    }

    /// The lowest member: the one that reserves and publishes for all.
    #[inline(always)]
    pub fn leader(&self) -> u32 {
        self.mask.trailing_zeros()
    }

    /// The highest member: the one whose WQE is last.
    #[inline(always)]
    pub fn last(&self) -> u32 {
        31 - self.mask.leading_zeros()
    }

    /// Members below this lane.
    #[inline(always)]
    pub fn rank(&self) -> u32 {
        if self.mask == u32::MAX {
            return self.lane;
        }
        (self.mask & ((1u32 << self.lane) - 1)).count_ones()
    }

    /// Members.
    #[inline(always)]
    pub fn count(&self) -> u32 {
        self.mask.count_ones()
    }

    /// The members of rank `first .. first + count` (none past the last), with the caller's lane: a part of
    /// a batch too large to post at once, which the members post part by part.
    #[inline(always)]
    pub fn part(&self, first: u32, count: u32) -> Lanes {
        let mut from = self.mask;
        for _ in 0..first {
            from &= from.wrapping_sub(1);
        }
        let mut after = from;
        for _ in 0..count {
            after &= after.wrapping_sub(1);
        }
        Lanes { mask: from & !after, lane: self.lane }
    }

    /// The lanes of the warp executing this instruction now (`activemask.b32`); on the host, the caller alone
    /// (1). Only a snapshot: lanes are not guaranteed to run together because they are in it.
    #[inline(always)]
    pub fn active() -> u32 {
        #[cfg(target_arch = "nvptx64")]
        {
            let active: u32;
            // SAFETY: reading the active mask touches no memory.
            unsafe { core::arch::asm!("activemask.b32 {m};", m = out(reg32) active, options(nostack, nomem)) };
            active
        }
        #[cfg(not(target_arch = "nvptx64"))]
        1
    }

    /// The lanes `mask` of the calling warp, of which the caller is one: what a caller that made its mask
    /// earlier (with [`Lanes::active_with`]) uses for every later call of its members.
    #[inline(always)]
    pub fn of(mask: u32) -> Self {
        Self { mask, lane: Self::lane_id() }
    }

    /// The caller's lane index (`%laneid`; 0 on the host).
    #[inline(always)]
    fn lane_id() -> u32 {
        #[cfg(target_arch = "nvptx64")]
        {
            let lane: u32;
            // SAFETY: reading the lane id touches no memory.
            unsafe { core::arch::asm!("mov.u32 {l}, %laneid;", l = out(reg32) lane, options(nostack, nomem)) };
            lane
        }
        #[cfg(not(target_arch = "nvptx64"))]
        0
    }

    /// `v` of lane `src`, to every member (`shfl.sync.idx.b32`).
    #[inline(always)]
    pub fn shfl32(&self, v: u32, src: u32) -> u32 {
        #[cfg(target_arch = "nvptx64")]
        {
            let d: u32;
            // SAFETY: `shfl.sync` among the member lanes; registers only.
            unsafe {
                core::arch::asm!("shfl.sync.idx.b32 {d}, {v}, {s}, 31, {m};", d = out(reg32) d, v = in(reg32) v,
                    s = in(reg32) src, m = in(reg32) self.mask, options(nostack, nomem));
            }
            d
        }
        #[cfg(not(target_arch = "nvptx64"))]
        {
            let _ = src;
            v
        }
    }

    /// `v` of lane `src`, to every member (two 32-bit shuffles).
    #[inline(always)]
    pub fn shfl(&self, v: u64, src: u32) -> u64 {
        (self.shfl32((v >> 32) as u32, src) as u64) << 32 | self.shfl32(v as u32, src) as u64
    }

    /// Whether `p` holds for any member (`vote.sync.any.pred`).
    #[inline(always)]
    pub fn any(&self, p: bool) -> bool {
        #[cfg(target_arch = "nvptx64")]
        {
            let r: u32;
            // SAFETY: a vote among the member lanes; registers only.
            unsafe {
                core::arch::asm!("{{ .reg .pred a, r; setp.ne.u32 a, {p}, 0; vote.sync.any.pred r, a, {m}; selp.u32 {r}, 1, 0, r; }}",
                    r = out(reg32) r, p = in(reg32) p as u32, m = in(reg32) self.mask, options(nostack, nomem));
            }
            r != 0
        }
        #[cfg(not(target_arch = "nvptx64"))]
        p
    }

    /// The members for which `p` holds, as a lane mask (`vote.sync.ballot.b32`); on the host, the caller's own
    /// bit when `p` holds.
    #[inline(always)]
    pub fn ballot(&self, p: bool) -> u32 {
        #[cfg(target_arch = "nvptx64")]
        {
            let r: u32;
            // SAFETY: a vote among the member lanes; registers only.
            unsafe {
                core::arch::asm!("{{ .reg .pred a; setp.ne.u32 a, {p}, 0; vote.sync.ballot.b32 {r}, a, {m}; }}",
                    r = out(reg32) r, p = in(reg32) p as u32, m = in(reg32) self.mask, options(nostack, nomem));
            }
            r
        }
        #[cfg(not(target_arch = "nvptx64"))]
        if p {
            self.mask
        } else {
            0
        }
    }

    /// Whether `p` holds for every member (`vote.sync.all.pred`).
    #[inline(always)]
    pub fn all(&self, p: bool) -> bool {
        !self.any(!p)
    }

    /// Waits for every member; memory accesses before it are ordered before those after it among them.
    #[inline(always)]
    pub fn sync(&self) {
        #[cfg(target_arch = "nvptx64")]
        // SAFETY: `bar.warp.sync` with the members' own mask; every member calls it.
        unsafe {
            core::arch::asm!("bar.warp.sync {m};", m = in(reg32) self.mask, options(nostack))
        };
    }

    /// The leader's result, to every member (errors travel as their [`ErrorReport`]): one 32-bit shuffle
    /// when the leader succeeded, the whole report only when it failed.
    #[inline(always)]
    pub fn share_result(&self, r: Result<(), Error>) -> Result<(), Error> {
        if self.shfl32(r.is_err() as u32, self.leader()) == 0 {
            return Ok(());
        }
        share_error(*self, r)
    }
}

/// The slow half of [`Lanes::share_result`]: the leader's error, word by word. Out of line, so that a loop
/// of posts does not keep registers for the report's words: inline, it made ptxas spill more of the warp
/// post loop's state to local memory (the post-rate kernel's warp loops: 88-198 local accesses, 47-77 out of
/// line), and one warp posting to one QP took 28.6-29.2 ns per WQE against 27.6-28.3 ns out of line on the
/// H200. By value, in the C ABI's parameter space (the Rust ABI passes aggregates through the caller's stack).
#[cold]
#[inline(never)]
#[allow(improper_ctypes_definitions)]
extern "C" fn share_error(lanes: Lanes, r: Result<(), Error>) -> Result<(), Error> {
    let words: [u64; 5] = bytemuck::cast(match r {
        Ok(()) => ErrorReport::default(),
        Err(e) => e.to_report(),
    });
    let mut got = [0u64; 5];
    for (g, w) in got.iter_mut().zip(words) {
        *g = lanes.shfl(w, lanes.leader());
    }
    Err(Error::from_report(&bytemuck::cast(got))
        .unwrap_or(Error::InvalidArgument(crate::error::InvalidArgument::Handle)))
}

#[cfg(test)]
mod tests {
    use super::Lanes;

    /// A part is the members of rank `first .. first + count`, found here by walking the lanes in order.
    #[test]
    fn a_part_is_the_members_of_its_ranks() {
        let masks = [u32::MAX, 0x0000_ffff, 0xaaaa_aaaa, 0x8000_0001, 0x1248_1248, 0xdead_beef, 1, 0];
        for mask in masks {
            let members: std::vec::Vec<u32> = (0..32).filter(|l| mask >> l & 1 == 1).collect();
            for count in [1, 2, 4, 8, 16, 32] {
                for first in (0..32).step_by(count as usize) {
                    let want = members.iter().skip(first as usize).take(count as usize).fold(0u32, |m, &l| m | 1 << l);
                    let part = Lanes { mask, lane: 7 }.part(first, count);
                    assert_eq!((part.mask, part.lane), (want, 7), "{mask:#x}, ranks {first}..+{count}");
                }
            }
        }
    }
}
