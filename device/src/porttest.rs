//! MSCCL++'s one-to-one PortChannel tests as device loops, for the `port_channel` example and its tests: one
//! function per rank, run by a team (a GPU CTA, or host threads) per channel, in Exclusive, Block or Device
//! sharing ([`Sharing`]).
//!
//! Every channel has one buffer per rank of `2 × size` bytes: a rank sends from its first half into the
//! peer's second half, so that both directions can run at once. Operations ([`op`]):
//! - `PINGPONG` (channel 0): rank 0 sends, rank 1 checks and answers, `iters` round trips, each timed and each
//!   payload checked.
//! - `BW` / `BIBW`: `iters` puts of `size` bytes per channel (split over the team's threads in the shared
//!   scopes), each followed by a signal, then a flush; one-way (rank 0 sends) or both ways. The times add up
//!   to the whole transfer, until the flush saw it placed. The receiver waits for every signal and checks
//!   the payload.
//! - `FLUSH_STRESS`: per channel, `iters` times a put of `size` bytes and a flush.
//! - `SAME_CHANNEL_FLUSH`: threads 0..4 of channel 0's team each put their quarter of `size` bytes and flush,
//!   `iters` times, on the one QP (Exclusive: thread 0 puts it all).
//!
//! Every operation ends with a signal that the receiver waits for before it checks the data it got.

use bytemuck::{Pod, Zeroable};

use crate::channel::{PortChannel, Poster, Sharing};
use crate::error::{Error, InvalidArgument, PayloadMismatch, Result};
use crate::pingpong::{payload_word, Team};
use crate::scope::{Device, Scope};
use crate::sync;
use gdaki_shared::channel::PortChannelHandle;
use gdaki_shared::handle::ErrorReport;

/// Operation codes of [`PortTestArgs::op`].
pub mod op {
    /// Ping-pong on channel 0.
    pub const PINGPONG: u32 = 1;
    /// One-way bandwidth: rank 0 sends on every channel.
    pub const BW: u32 = 2;
    /// Bidirectional bandwidth: both ranks send on every channel.
    pub const BIBW: u32 = 3;
    /// Put + flush, repeatedly, on every channel.
    pub const FLUSH_STRESS: u32 = 4;
    /// Four threads put + flush on channel 0 at once.
    pub const SAME_CHANNEL_FLUSH: u32 = 5;
}

/// Threads that flush channel 0 at once in `SAME_CHANNEL_FLUSH`.
pub const FLUSHERS: usize = 4;

/// Arguments of one rank (`#[repr(C)]`, built by the host). 72 bytes.
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
#[repr(C)]
pub struct PortTestArgs {
    /// Address of `nchannels` [`PortChannelHandle`]s; team `c` runs channel `c`.
    pub channels: u64,
    /// Address of `iters` `u64` times in ns (team 0's thread 0 of rank 0 writes them), or 0.
    pub times: u64,
    /// Address of this rank's [`ErrorReport`] (the first error of any thread).
    pub report: u64,
    /// Address of a `u64`: payloads received and checked (atomic adds).
    pub checked: u64,
    /// Bytes per channel per iteration (each buffer half holds them).
    pub size: u64,
    /// Seed of the payload generator.
    pub seed: u64,
    /// Iterations.
    pub iters: u32,
    /// One of [`op`].
    pub op: u32,
    /// 0 or 1.
    pub rank: u32,
    /// Channels (teams).
    pub nchannels: u32,
}

const _: () = assert!(core::mem::size_of::<PortTestArgs>() == 64);

/// Writes `e` to the report unless an earlier error got there first.
fn report(a: &PortTestArgs, e: Error) {
    let r = a.report as *mut ErrorReport;
    // SAFETY: the report (host contract); the kind word is taken with a CAS so that one error wins; the host
    // reads it after every thread has finished.
    unsafe {
        if Device::try_lock(r as *mut u32) {
            r.write_volatile(e.to_report());
        }
    }
}

/// The payload word `i` that `rank` sends on channel `ch` in round `iter`.
fn word(a: &PortTestArgs, ch: u32, iter: u64, i: u64) -> u64 {
    payload_word(a.seed ^ ((ch as u64) << 48), a.rank, iter, i)
}

/// Fills this rank's send half of channel `h` with round `iter`'s payload (team-strided).
fn fill(team: &impl Team, a: &PortTestArgs, h: &PortChannelHandle, ch: u32, iter: u64) {
    let base = h.src.addr as *mut u64;
    let mut i = team.tid() as u64;
    while i < a.size.div_ceil(8) {
        // SAFETY: the send half holds `size` bytes rounded up to 8 (host contract), 8-aligned.
        unsafe { base.add(i as usize).write_volatile(word(a, ch, iter, i)) };
        i += team.size() as u64;
    }
}

/// Checks the receive half of channel `h` against the peer's round `iter` payload (team-strided).
fn check(team: &impl Team, a: &PortTestArgs, h: &PortChannelHandle, ch: u32, iter: u64) -> Option<PayloadMismatch> {
    let peer = PortTestArgs { rank: a.rank ^ 1, ..*a };
    let base = (h.src.addr + a.size.next_multiple_of(8)) as *const u64;
    let mut i = team.tid() as u64;
    while i < a.size.div_ceil(8) {
        let tail = a.size - i * 8;
        let mask = if tail >= 8 { u64::MAX } else { u64::MAX >> (64 - 8 * tail) };
        let expected = word(&peer, ch, iter, i);
        // SAFETY: the receive half holds `size` bytes rounded up to 8 (host contract); written by the NIC.
        let seen = unsafe { base.add(i as usize).read_volatile() };
        if (seen ^ expected) & mask != 0 {
            return Some(PayloadMismatch { iter, offset: i * 8, expected: expected & mask, seen: seen & mask });
        }
        i += team.size() as u64;
    }
    None
}

/// The channel of a thread that posts (every thread that `run` lets post has one).
fn held<'c, 'h, P: Poster>(c: &'c mut Option<PortChannel<'h, P>>) -> Result<&'c mut PortChannel<'h, P>> {
    c.as_mut().ok_or(Error::InvalidArgument(InvalidArgument::Handle))
}

/// Runs `f` and reports its error; returns to every thread of the team whether any thread failed.
fn step(team: &impl Team, a: &PortTestArgs, run: bool, f: impl FnOnce() -> Result<()>) -> bool {
    let failed = run && f().map_err(|e| report(a, e)).is_err();
    team.sync_or(failed)
}

/// Checks the received payload of round `iter` on every thread and counts it once.
fn verify(team: &impl Team, a: &PortTestArgs, h: &PortChannelHandle, ch: u32, iter: u64) -> bool {
    let bad = check(team, a, h, ch, iter);
    if let Some(m) = bad {
        report(a, Error::Payload(m));
    }
    let failed = team.sync_or(bad.is_some());
    if !failed && team.tid() == 0 {
        // SAFETY: the checked counter (host contract), added to atomically by every team.
        unsafe { Device::fetch_add(a.checked as *mut u64, 1) };
    }
    failed
}

/// One rank's part of operation `a.op` on channel `ch` (this team's), with sharing `M`; `staging` is the
/// team's [`Sharing::Staging`] (zeroed before the run; the poster of thread 0 uses it in Exclusive sharing).
///
/// # Safety
/// `a` must come from the host's port-test setup: every address valid for the run, the channel's QP used only
/// by this team's threads (Exclusive: its thread 0 only; Device: any team of this launch), and both ranks
/// running at the same time; `staging` valid for the run and used by no other team.
pub unsafe fn run<M: Sharing>(team: &impl Team, a: &PortTestArgs, ch: u32, staging: *mut M::Staging) {
    // SAFETY: `channels` holds `nchannels` handles (caller's contract); `ch` is this team's.
    let h = unsafe { &*(a.channels as *const PortChannelHandle).add(ch as usize) };
    let tid = team.tid();
    let posts = tid == 0 || M::SHARED;
    // SAFETY: `h` is a live channel and `staging` this team's (caller's contract); Exclusive: only thread 0
    // builds a poster.
    let mut chan = posts.then(|| unsafe { PortChannel::new(h, M::poster(h, staging)) });
    let sender = a.rank == 0 || a.op == op::BIBW || a.op == op::PINGPONG;
    let receiver = a.rank == 1 || a.op == op::BIBW || a.op == op::PINGPONG;
    let half = a.size.next_multiple_of(8);
    let timed = a.rank == 0 && ch == 0 && tid == 0 && a.times != 0;
    let clock = |k: u64, t0: u64| {
        if timed {
            // SAFETY: `times` holds `iters` words (caller's contract).
            unsafe { (a.times as *mut u64).add(k as usize).write_volatile(sync::clock_ns() - t0) };
        }
    };
    if a.op == op::PINGPONG {
        if ch != 0 {
            return;
        }
        for k in 0..a.iters as u64 {
            let t0 = sync::clock_ns();
            if a.rank == 0 {
                fill(team, a, h, ch, k);
            }
            // Every thread's words are stored before the leader posts the put.
            let _ = team.sync_or(false);
            let lead = tid == 0;
            let c = &mut chan;
            let failed = step(team, a, lead, || {
                let c = held(c)?;
                if a.rank == 0 {
                    c.put_with_signal(half, 0, a.size)?;
                }
                c.wait()
            });
            if failed || verify(team, a, h, ch, k) {
                return;
            }
            if a.rank == 1 {
                fill(team, a, h, ch, k);
            }
            let _ = team.sync_or(false);
            let c = &mut chan;
            let failed = step(team, a, lead, || {
                let c = held(c)?;
                if a.rank == 1 {
                    c.put_with_signal(half, 0, a.size)?;
                }
                c.flush()
            });
            if failed {
                return;
            }
            clock(k, t0);
        }
        return;
    }
    if sender {
        fill(team, a, h, ch, 0);
    }
    let _ = team.sync_or(false);
    // The threads that post each round, and the slice of `size` each one puts.
    let (posters, flushes) = match a.op {
        op::SAME_CHANNEL_FLUSH if ch != 0 => (0, false),
        op::SAME_CHANNEL_FLUSH => (if M::SHARED { FLUSHERS.min(team.size()) } else { 1 }, true),
        op::FLUSH_STRESS => (1, true),
        _ if M::SHARED => (team.size(), false),
        _ => (1, false),
    };
    let start = sync::clock_ns();
    let piece = a.size.div_ceil(posters.max(1) as u64).next_multiple_of(8);
    let mine = (tid as u64 * piece).min(a.size);
    let len = piece.min(a.size - mine);
    for k in 0..a.iters as u64 {
        let t0 = sync::clock_ns();
        let c = &mut chan;
        let failed = step(team, a, sender && tid < posters && len > 0, || {
            let c = held(c)?;
            c.put(half + mine, mine, len)?;
            if flushes {
                c.flush()?;
            }
            Ok(())
        });
        if failed {
            return;
        }
        let c = &mut chan;
        // One signal per round, after every thread's piece is posted (the NIC places it after them).
        let failed = step(team, a, sender && tid == 0 && !flushes, || held(c)?.signal());
        if failed {
            return;
        }
        clock(k, t0);
    }
    let c = &mut chan;
    // The closing signal of the flush operations, and a flush for everyone.
    let failed = step(team, a, tid == 0, || {
        let c = held(c)?;
        if sender && flushes {
            c.signal()?;
        }
        if sender {
            c.flush()?;
        }
        if receiver {
            let rounds = if flushes { 1 } else { a.iters };
            for _ in 0..rounds {
                c.wait()?;
            }
        }
        Ok(())
    });
    if timed && a.iters > 0 && !flushes {
        // The last iteration's time runs to the flush: the times add up to the whole transfer, placed.
        // SAFETY: `times` holds `iters` words (caller's contract), written above by this thread.
        unsafe {
            let t = a.times as *mut u64;
            let before: u64 = (0..a.iters as usize - 1).map(|k| t.add(k).read_volatile()).sum();
            let total = sync::clock_ns() - start;
            t.add(a.iters as usize - 1).write_volatile(total.saturating_sub(before));
        }
    }
    if !failed && receiver && posters > 0 {
        let _ = verify(team, a, h, ch, 0);
    }
}
