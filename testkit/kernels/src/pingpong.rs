//! The ping-pong rank loop (the `pingpong` example's device code), one function for both executors: a GPU
//! CTA per rank (`gdaki_pingpong` kernel) or one host thread per rank.
//!
//! Iteration `k`: rank 0 fills its send buffer with a pseudo-random payload, RDMA-writes it to rank 1 and
//! signals rank 1's semaphore (ATOMIC fetch-add, placed after the write), then waits for its own semaphore to
//! reach `k + 1`; the time between is one round trip. Rank 1 waits for its semaphore and answers the same way at
//! once (its answer is filled before the ping arrives), then checks every byte of the ping. Both ranks check
//! what they receive and flush before reusing their send buffer. A receive buffer has two halves, and the
//! message of iteration `k` lands in half `k % 2`: the next message lands in the other half, and the one after
//! it only once this rank has sent again, after its check; so rank 1 checks off the round trip's path, as
//! perftest's `ib_write_lat` (which checks nothing) leaves it. With `blueflame` set, a message is one 8-byte
//! WRITE by BlueFlame and no fetch-add: the peer polls the payload's word instead of a semaphore.

use bytemuck::{Pod, Zeroable};
use gdaki_device::error::{Error, PayloadMismatch, Result, WaitOn};
use gdaki_device::qp::Qp;
use gdaki_device::sync;
use gdaki_device::thread::CtaGroup;
use gdaki_device::wqe::{self, Wqe};
use gdaki_device::{onesided, wait};
use gdaki_shared::handle::{ErrorReport, MrHandle, QpHandle, RemoteMr};

/// Arguments of one rank, built by the host (`#[repr(C)]`, passed by pointer). 200 bytes.
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
#[repr(C)]
pub struct PingPongArgs {
    /// Address of this rank's [`QpHandle`] (connected to the peer's QP).
    pub qp: u64,
    /// Send buffer (at least `size` bytes rounded up to 8).
    pub send: MrHandle,
    /// Receive buffer the peer writes into: two halves of `length / 2` bytes, each at least the send buffer's
    /// length (iteration `k`'s message lands in half `k % 2`).
    pub recv: MrHandle,
    /// 8 bytes (8-byte aligned) where fetch-add results land.
    pub scratch: MrHandle,
    /// The peer's receive buffer (two halves, as `recv`).
    pub peer_recv: RemoteMr,
    /// The peer's semaphore (8 bytes).
    pub peer_sem: RemoteMr,
    /// Address of this rank's own semaphore (host-order `u64`, advanced by the peer's fetch-adds).
    pub sem: u64,
    /// Address of this rank's `warmup + iters` [`Phases`] records, or 0.
    pub times: u64,
    /// Address of this rank's [`ErrorReport`].
    pub report: u64,
    /// Address of a `u64`: payloads this rank received and checked correct.
    pub checked: u64,
    /// Payload bytes per message (1 ..= buffer length).
    pub size: u64,
    /// Seed of the payload generator.
    pub seed: u64,
    /// Bound of every wait, ns.
    pub timeout_ns: u64,
    /// Round trips, warm-up included.
    pub iters: u32,
    /// 0 or 1.
    pub rank: u32,
    /// Nonzero: send each message as one RDMA WRITE by BlueFlame ([`Qp::post_bf`]; `size` 8: the peer polls
    /// the payload's one word, as perftest's `ib_write_lat` polls its buffer), with no fetch-add.
    pub blueflame: u32,
    /// Zero (the struct is 200 bytes, without padding).
    pub pad: u32,
}

const _: () = assert!(core::mem::size_of::<PingPongArgs>() == 200);

/// What one rank records of iteration `k` (`sync::clock_ns` readings, ns; the GPU's `%globaltimer`, one
/// clock for every SM): when its send started and returned, and when it saw its semaphore reach `k + 1`.
/// Rank 0 sends, then waits; rank 1 waits, then sends.
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
#[repr(C)]
pub struct Phases {
    /// Before the leader's `put_with_signal`.
    pub send_start: u64,
    /// After it returned (the WQEs stored, the doorbell rung).
    pub send_done: u64,
    /// When the semaphore was seen at `k + 1`.
    pub seen: u64,
    /// Zero (the record is 32 bytes).
    pub pad: u64,
}

/// The threads that run one rank: a block of the launch ([`gdaki_device::Thread`] is one). Thread 0 drives the
/// QP; all threads fill and check payloads. A team is a [`CtaGroup`] too, for the team posts of the shared
/// sharing modes.
pub trait Team: CtaGroup {
    /// This thread's index in the team.
    fn tid(&self) -> usize;
    /// Threads in the team.
    fn size(&self) -> usize;
    /// Barrier over the team that returns whether any thread passed `true` (`bar.red.or.pred`).
    fn sync_or(&self, flag: bool) -> bool;
}

/// Payload word `i` of the message that `rank` sends in iteration `iter` (splitmix64 of the four).
#[inline(always)]
pub fn payload_word(seed: u64, rank: u32, iter: u64, i: u64) -> u64 {
    let mut z = seed ^ ((rank as u64) << 62) ^ (iter << 36) ^ i;
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn fill(team: &impl Team, a: &PingPongArgs, iter: u64) {
    let words = a.size.div_ceil(8);
    let base = a.send.addr as *mut u64;
    let mut i = team.tid() as u64;
    while i < words {
        // SAFETY: the send buffer holds at least `size` rounded up to 8 bytes (host contract), 8-aligned.
        unsafe { base.add(i as usize).write_volatile(payload_word(a.seed, a.rank, iter, i)) };
        i += team.size() as u64;
    }
}

/// The half of this rank's receive buffer that iteration `iter`'s message lands in.
#[inline(always)]
fn recv_half(a: &PingPongArgs, iter: u64) -> u64 {
    a.recv.addr + (iter & 1) * (a.recv.length / 2)
}

fn check(team: &impl Team, a: &PingPongArgs, iter: u64) -> Option<PayloadMismatch> {
    let words = a.size.div_ceil(8);
    let base = recv_half(a, iter) as *const u64;
    let mut i = team.tid() as u64;
    while i < words {
        let expected = payload_word(a.seed, a.rank ^ 1, iter, i);
        // The last word may be partial: only its first `size % 8` bytes were sent.
        let tail = a.size - i * 8;
        let mask = if tail >= 8 { u64::MAX } else { u64::MAX >> (64 - 8 * tail) };
        // SAFETY: each half of the receive buffer holds `words` words (host contract). Volatile: the NIC wrote
        // it, and L1 may hold the line of two iterations ago.
        let seen = unsafe { base.add(i as usize).read_volatile() };
        if (seen ^ expected) & mask != 0 {
            return Some(PayloadMismatch { iter, offset: i * 8, expected: expected & mask, seen: seen & mask });
        }
        i += team.size() as u64;
    }
    None
}

fn report(a: &PingPongArgs, e: Error) {
    // SAFETY: `report` is this rank's ErrorReport (host contract); first error wins, later ones are effects.
    unsafe {
        let r = a.report as *mut ErrorReport;
        if (*r).kind == 0 {
            r.write_volatile(e.to_report());
        }
    }
}

/// Runs `step` on the leader (thread 0, the only one holding the QP), reports its error, and returns to every
/// thread of the team whether the rank must stop.
fn leader_step(
    team: &impl Team,
    qp: &mut Option<Qp<'_>>,
    a: &PingPongArgs,
    step: impl FnOnce(&mut Qp<'_>) -> Result<()>,
) -> bool {
    let failed = qp.as_mut().is_some_and(|qp| step(qp).map_err(|e| report(a, e)).is_err());
    team.sync_or(failed)
}

/// What a rank sends, built once before its loop (the ranges and keys are checked there, not on every send):
/// the WRITE of the payload into each half of the peer's receive buffer, and the fetch-add on the peer's
/// semaphore.
#[derive(Clone, Copy)]
struct Sends {
    even: Wqe<3>,
    odd: Wqe<3>,
    signal: Wqe<4>,
}

impl Sends {
    fn new(a: &PingPongArgs) -> Result<Self> {
        let local = onesided::local(&a.send, 0, a.size)?;
        let half = a.peer_recv.length / 2;
        let even = wqe::rdma_write(onesided::remote(&a.peer_recv, 0, a.size)?, local);
        let odd = wqe::rdma_write(onesided::remote(&a.peer_recv, half, a.size)?, local);
        let (r, l) = onesided::atomic_target(&a.peer_sem, 0, &a.scratch, 0)?;
        Ok(Sends { even, odd, signal: wqe::atomic_fetch_add(r, l, 1)? })
    }
}

/// Sends one message: the WRITE and the fetch-add with one doorbell (as `put_with_signal`), or, by
/// BlueFlame, the WRITE alone (one WQEBB, signaled), stored whole into the BlueFlame register: the NIC takes
/// it from there, not from the ring.
///
/// Inlined into the rank loop, as [`arrived`]: the `Qp` then stays in registers across the post, where a
/// call takes it by reference and loads every field from the stack (measured on the H200 at 8 B by
/// BlueFlame: 0.9 µs per post inlined, 1.3 µs called).
#[inline(always)]
fn send(qp: &mut Qp<'_>, s: &Sends, k: u64, blueflame: bool) -> Result<()> {
    let write = if k & 1 == 0 { s.even } else { s.odd };
    if blueflame {
        return qp.post_bf(true, write).map(|_| ());
    }
    let _ = qp.post(false, write)?;
    let _ = qp.post(true, s.signal)?;
    qp.ring_db();
    Ok(())
}

/// Waits for iteration `k`'s message: the semaphore, or (by BlueFlame, no fetch-add) the payload's word
/// turning into the one the peer sent, as perftest's `ib_write_lat` polls its buffer.
#[inline(always)]
fn arrived(qp: &mut Qp<'_>, a: &PingPongArgs, k: u64) -> Result<()> {
    if a.blueflame == 0 {
        // SAFETY: `sem` is this rank's semaphore (caller's contract). Watching the QP: a peer that died with
        // our signal outstanding ends the wait with its error CQE.
        return unsafe { qp.wait_semaphore(a.sem as *const u64, k + 1).map(|_| ()) };
    }
    let want = payload_word(a.seed, a.rank ^ 1, k, 0);
    let word = recv_half(a, k) as *const u64;
    let seen = core::cell::Cell::new(0);
    wait::bounded(
        a.timeout_ns,
        || {
            // SAFETY: each half of the receive buffer holds at least 8 bytes (host contract), 8-aligned.
            seen.set(unsafe { sync::load_acquire_u64(word) });
            Ok((seen.get() == want).then_some(()))
        },
        || WaitOn::Semaphore { addr: word as u64, expected: want, seen: seen.get() },
    )
}

/// Runs one rank's loop. Returns early, with the error written to `a.report`, when anything fails.
///
/// # Safety
/// `a` must come from the host's ping-pong setup: every address valid for the whole run, `a.qp` used by no
/// one else, and both ranks running at the same time (they wait on each other).
pub unsafe fn run(team: &impl Team, a: &PingPongArgs) {
    // SAFETY: the caller's contract; only the leader touches the QP.
    let mut qp = (team.tid() == 0).then(|| unsafe { Qp::new(&mut *(a.qp as *mut QpHandle), a.timeout_ns) });
    // Every thread finds the same result; the leader reports it.
    let sends = match Sends::new(a) {
        Ok(s) => s,
        Err(e) => {
            if team.tid() == 0 {
                report(a, e);
            }
            return;
        }
    };
    for k in 0..a.iters as u64 {
        // Rank 1 fills its answer before waiting: it is ready when the ping arrives.
        fill(team, a, k);
        let _ = team.sync_or(false);
        let mut ph = Phases::default();
        let stop = leader_step(team, &mut qp, a, |qp| {
            if a.rank == 0 {
                ph.send_start = sync::clock_ns();
                send(qp, &sends, k, a.blueflame != 0)?;
                ph.send_done = sync::clock_ns();
            }
            arrived(qp, a, k)?;
            ph.seen = sync::clock_ns();
            if a.rank == 1 {
                // The answer goes first; the ping is checked below, in its half of the receive buffer, which
                // no message overwrites before this rank's next answer.
                ph.send_start = sync::clock_ns();
                send(qp, &sends, k, a.blueflame != 0)?;
                ph.send_done = sync::clock_ns();
            }
            Ok(())
        });
        if stop {
            return;
        }
        let bad = check(team, a, k);
        if let Some(m) = bad {
            report(a, Error::Payload(m));
        }
        if team.sync_or(bad.is_some()) {
            return;
        }
        let stop = leader_step(team, &mut qp, a, |qp| {
            if a.times != 0 {
                // SAFETY: `times` holds `iters` records (caller's contract); only the leader writes them.
                unsafe { (a.times as *mut Phases).add(k as usize).write_volatile(ph) };
            }
            // The send buffer is refilled next iteration: every read of it must be done.
            qp.flush()?;
            // SAFETY: `checked` is this rank's counter (caller's contract).
            unsafe { *(a.checked as *mut u64) += 1 };
            Ok(())
        });
        if stop {
            return;
        }
    }
}
