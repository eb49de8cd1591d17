//! MSCCL++'s one-to-one PortChannel tests as device loops, for the `port_channel` example and its tests: one
//! function per rank, run by a team (a GPU CTA, or host threads) per channel, in Exclusive, Warp, Block or
//! Device sharing ([`Sharing`]; Warp: a CTA of one warp, whose lane 0 makes the calls that one thread makes).
//!
//! Every channel has one buffer per rank of `2 × size` bytes: a rank sends from its first half into the
//! peer's second half, so that both directions can run at once. Operations ([`op`]):
//! - `PINGPONG` (channel 0): rank 0 sends, rank 1 checks and answers, `iters` round trips, each timed and each
//!   payload checked.
//! - `BW` / `BIBW`: `iters` puts of `size` bytes per channel, each followed by a signal (in the shared scopes a
//!   block put of the whole range by the team's threads with its signal, [`PortChannel::put_block_with_signal`]:
//!   WQEs of at most `max_wqe_bytes`, one doorbell and one CQE per team's worth, the signal in the last), then a
//!   flush; one-way (rank 0 sends) or both ways. The times add up
//!   to the whole transfer, until the flush saw it placed. The receiver waits for every signal and checks
//!   the payload.
//! - `FLUSH_STRESS`: per channel, `iters` times a put of `size` bytes and a flush.
//! - `SAME_CHANNEL_FLUSH`: threads 0..4 of channel 0's team each put their quarter of `size` bytes and flush,
//!   `iters` times, on the one QP (Exclusive: thread 0 puts it all).
//! - `PACKET_PINGPONG` / `PACKET_PINGPONG_LL8` (channel 0; MSCCL++'s `PacketPingPong`): ping-pong with LL
//!   packets ([`gdaki_device::packet`]) instead of `put_with_signal` + `wait`: the team writes the packets, the
//!   leader puts them, the peer's team polls their flags and checks every byte, then answers the same way.
//!   The buffer holds data, outgoing and incoming packets ([`PacketLayout`]); round `k` carries flag
//!   [`packet_flag`]`(flag_base, k)`.
//!
//! Every other operation ends with a signal that the receiver waits for before it checks the data it got.

use bytemuck::{Pod, Zeroable};

use crate::pingpong::{payload_word, Team};
use gdaki_device::channel::{PortChannel, Sharing};
use gdaki_device::error::{Error, InvalidArgument, PayloadMismatch, Result};
use gdaki_device::packet::{Packet, Packets};
use gdaki_device::scope::{Device, Scope};
use gdaki_device::sync;
use gdaki_device::wait;
use gdaki_shared::channel::PortChannelHandle;
use gdaki_shared::handle::ErrorReport;
use gdaki_shared::packet::{LL16Packet, LL8Packet};

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
    /// Ping-pong with [`LL16Packet`](gdaki_shared::packet::LL16Packet)s on channel 0.
    pub const PACKET_PINGPONG: u32 = 6;
    /// Ping-pong with [`LL8Packet`](gdaki_shared::packet::LL8Packet)s on channel 0.
    pub const PACKET_PINGPONG_LL8: u32 = 7;
    /// As [`BW`], but in the shared scopes each thread puts its own slice of the range as one WQE
    /// ([`PortChannel::put_team`](gdaki_device::channel::PortChannel::put_team)): one WQE per thread.
    pub const BW_PIECES: u32 = 8;
}

/// Where a packet ping-pong of `size` bytes keeps things in a channel's buffer (byte offsets): the data sent
/// and received at 0, the outgoing packets at `out`, the incoming ones (the peer's put) at `inbound`; `end`
/// bytes in all, 5 × `size` rounded up to 16.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PacketLayout {
    /// Outgoing packets.
    pub out: u64,
    /// Incoming packets.
    pub inbound: u64,
    /// Bytes the layout needs.
    pub end: u64,
}

/// The [`PacketLayout`] of a packet ping-pong of `size` bytes.
pub const fn packet_layout(size: u64) -> PacketLayout {
    let d = size.next_multiple_of(16);
    PacketLayout { out: d, inbound: 3 * d, end: 5 * d }
}

/// The flag of round `k` of a run given `base`: nonzero, and a new value for each of 2^32 - 1 rounds in a row
/// (the host advances `base` by the rounds of each run, so a later run never matches an earlier one's packets).
pub const fn packet_flag(base: u32, k: u64) -> u32 {
    ((base as u64 + k) % u32::MAX as u64) as u32 + 1
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
    /// Address of a `u64`, zero at launch: sending teams of the bandwidth operations that have flushed
    /// (atomic adds), so that the timed thread's last time runs until every channel's transfer is placed.
    pub finished: u64,
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
    /// Packet operations: the flag base of round 0 ([`packet_flag`]).
    pub flag_base: u32,
    /// Padding, zero.
    pub pad: u32,
}

const _: () = assert!(core::mem::size_of::<PortTestArgs>() == 80);

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

/// Checks the `size` bytes at `at` of channel `h`'s buffer against the peer's round `iter` payload
/// (team-strided).
fn check(
    team: &impl Team,
    a: &PortTestArgs,
    h: &PortChannelHandle,
    at: u64,
    ch: u32,
    iter: u64,
) -> Option<PayloadMismatch> {
    let peer = PortTestArgs { rank: a.rank ^ 1, ..*a };
    let base = (h.src.addr + at) as *const u64;
    let mut i = team.tid() as u64;
    while i < a.size.div_ceil(8) {
        let tail = a.size - i * 8;
        let mask = if tail >= 8 { u64::MAX } else { u64::MAX >> (64 - 8 * tail) };
        let expected = word(&peer, ch, iter, i);
        // SAFETY: `at` holds `size` bytes rounded up to 8 (host contract); written by the NIC, or by this team
        // before a barrier.
        let seen = unsafe { base.add(i as usize).read_volatile() };
        if (seen ^ expected) & mask != 0 {
            return Some(PayloadMismatch { iter, offset: i * 8, expected: expected & mask, seen: seen & mask });
        }
        i += team.size() as u64;
    }
    None
}

/// The channel of a thread that posts (every thread that `run` lets post has one).
fn held<'c, 'h, M: Sharing>(c: &'c mut Option<PortChannel<'h, M>>) -> Result<&'c mut PortChannel<'h, M>> {
    c.as_mut().ok_or(Error::InvalidArgument(InvalidArgument::Handle))
}

/// Runs `f` and reports its error; returns to every thread of the team whether any thread failed.
fn step(team: &impl Team, a: &PortTestArgs, run: bool, f: impl FnOnce() -> Result<()>) -> bool {
    let failed = run && f().map_err(|e| report(a, e)).is_err();
    team.sync_or(failed)
}

/// Checks the received payload of round `iter` at `at` on every thread and counts it once.
fn verify(team: &impl Team, a: &PortTestArgs, h: &PortChannelHandle, at: u64, ch: u32, iter: u64) -> bool {
    let bad = check(team, a, h, at, ch, iter);
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

/// One rank's part of operation `a.op` on channel `ch` (this team's), with sharing `M`.
///
/// # Safety
/// `a` must come from the host's port-test setup: every address valid for the run, the channel's QP used only
/// by this team's threads (Exclusive: its thread 0 only; Warp: a team of one warp; Device: any team of this
/// launch), and both ranks running at the same time.
pub unsafe fn run<M: Sharing>(team: &impl Team, a: &PortTestArgs, ch: u32) {
    // SAFETY: `channels` holds `nchannels` handles (caller's contract); `ch` is this team's.
    let h = unsafe { &*(a.channels as *const PortChannelHandle).add(ch as usize) };
    let tid = team.tid();
    let posts = tid == 0 || M::SHARED;
    // SAFETY: `h` is a live channel (caller's contract); Exclusive: only thread 0 builds a channel.
    let mut chan = posts.then(|| unsafe { PortChannel::<M>::new(h) });
    let sender = a.rank == 0 || a.op == op::BIBW || a.op == op::PINGPONG;
    let pieces = a.op == op::BW_PIECES;
    let receiver = a.rank == 1 || a.op == op::BIBW || a.op == op::PINGPONG;
    let half = a.size.next_multiple_of(8);
    let timed = a.rank == 0 && ch == 0 && tid == 0 && a.times != 0;
    let clock = |k: u64, t0: u64| {
        if timed {
            // SAFETY: `times` holds `iters` words (caller's contract).
            unsafe { (a.times as *mut u64).add(k as usize).write_volatile(sync::clock_ns() - t0) };
        }
    };
    if a.op == op::PACKET_PINGPONG || a.op == op::PACKET_PINGPONG_LL8 {
        if ch == 0 {
            if a.op == op::PACKET_PINGPONG {
                packet_pingpong::<LL16Packet, _>(team, a, h, &mut chan, &clock);
            } else {
                packet_pingpong::<LL8Packet, _>(team, a, h, &mut chan, &clock);
            }
        }
        return;
    }
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
            if failed || verify(team, a, h, half, ch, k) {
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
    // The shared scopes' bandwidth rounds: every thread of the team calls the block put of the whole range
    // (NVSHMEM's `putmem_block`), which posts it in WQEs of at most `max_wqe_bytes` with one doorbell.
    let team_put = M::SHARED && !flushes;
    for k in 0..a.iters as u64 {
        let t0 = sync::clock_ns();
        let c = &mut chan;
        let failed = if team_put {
            step(team, a, sender, || {
                let c = held(c)?;
                if pieces {
                    c.put_team(team, half + mine, mine, len)
                } else {
                    c.put_block_with_signal(team, half, 0, a.size)
                }
            })
        } else {
            step(team, a, sender && tid < posters && len > 0, || {
                let c = held(c)?;
                c.put(half + mine, mine, len)?;
                if flushes {
                    c.flush()?;
                }
                Ok(())
            })
        };
        if failed {
            return;
        }
        let c = &mut chan;
        // One signal per round, after every thread's piece is posted (the NIC places it after them); a block
        // put carried its own.
        let signals = sender && tid == 0 && !flushes && (pieces || !team_put);
        let failed = step(team, a, signals, || held(c)?.signal());
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
    let all = u64::from(a.nchannels);
    if sender && !flushes && tid == 0 {
        // This channel's transfer is placed (or failed, and the report says so): counted either way, so that the
        // timed thread never waits for a team that gave up.
        // SAFETY: the finished counter (host contract), added to atomically by every sending team.
        unsafe { Device::fetch_add(a.finished as *mut u64, 1) };
    }
    if timed && a.iters > 0 && !flushes {
        // The last iteration's time runs until every channel has flushed, not only this one: the times add up
        // to the whole transfer over all QPs, placed (as perftest's `ib_write_bw` times every QP's last
        // completion). A channel that stops early still counts, so the wait ends within the run's bound.
        // SAFETY: the finished counter (host contract), 8-byte aligned and live for the launch.
        if let Err(e) = unsafe { wait::semaphore_ge(a.finished as *const u64, all, h.timeout_ns) } {
            report(a, e);
        }
        // SAFETY: `times` holds `iters` words (caller's contract), written above by this thread.
        unsafe {
            let t = a.times as *mut u64;
            let before: u64 = (0..a.iters as usize - 1).map(|k| t.add(k).read_volatile()).sum();
            let total = sync::clock_ns() - start;
            t.add(a.iters as usize - 1).write_volatile(total.saturating_sub(before));
        }
    }
    if !failed && receiver && posters > 0 {
        let _ = verify(team, a, h, half, ch, 0);
    }
}

/// `PACKET_PINGPONG` on channel 0 with packets `T`: per round, rank 0's team fills the payload and writes the
/// packets, the leader puts them ([`PortChannel::put_packets`]); rank 1's team reads them (the leader with
/// [`PortChannel::read_packets`], the others with [`Packets::read_packets`]) into its data, checks every byte
/// and answers the same way. Ends with a flush.
fn packet_pingpong<T: Packet, M: Sharing>(
    team: &impl Team,
    a: &PortTestArgs,
    h: &PortChannelHandle,
    chan: &mut Option<PortChannel<'_, M>>,
    clock: &impl Fn(u64, u64),
) {
    let l = packet_layout(a.size);
    // SAFETY: `h` is a live channel (contract of `run`).
    let pk = unsafe { Packets::of(h) };
    let (tid, n) = (team.tid() as u32, team.size() as u32);
    let send = |k: u64, chan: &mut Option<PortChannel<'_, M>>| {
        let flag = packet_flag(a.flag_base, k);
        fill(team, a, h, 0, k);
        // Every thread's data is stored before it is turned into packets (another thread's share).
        let _ = team.sync_or(false);
        // The leader writes its share after the barrier, inside `put_packets`, before the put.
        let failed = step(team, a, tid != 0, || pk.write_packets::<T>(l.out, 0, a.size, flag, tid, n));
        failed || step(team, a, tid == 0, || held(chan)?.put_packets::<T>(l.inbound, l.out, 0, a.size, flag, 0, n))
    };
    let recv = |k: u64, chan: &mut Option<PortChannel<'_, M>>| {
        let flag = packet_flag(a.flag_base, k);
        // The leader reads its share through the channel, which watches the QP (a dead peer is its error CQE,
        // not a timeout); the others read the memory.
        let read = || match chan {
            Some(c) if tid == 0 => c.read_packets::<T>(0, l.inbound, a.size, flag, tid, n),
            _ => pk.read_packets::<T>(0, l.inbound, a.size, flag, tid, n),
        };
        step(team, a, true, read) || verify(team, a, h, 0, 0, k)
    };
    for k in 0..a.iters as u64 {
        let t0 = sync::clock_ns();
        // Rank 0 sends, then receives the answer; rank 1 receives, then answers.
        let first = a.rank == 0;
        let failed = (first && send(k, chan)) || recv(k, chan) || (!first && send(k, chan));
        if failed {
            return;
        }
        clock(k, t0);
    }
    // Errors of the unsignaled puts surface here rather than in a later run.
    let _ = step(team, a, tid == 0, || held(chan)?.flush());
}
