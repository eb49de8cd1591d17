//! Collectives on port channels, device-initiated end to end: [`broadcast`] (direct puts, a pipelined chain or
//! a binary tree, completed by a group acknowledgment) and [`all_to_all_v`] (every rank sends a different
//! number of bytes to every other, the counts exchanged on the device), [`reduce`] and [`all_reduce`] of `f32`
//! data summed on the NIC (quantized to 64-bit fixed point, added by RDMA fetch-adds at the root), and
//! [`all_reduce_ring`] of `f32` data summed by the GPU (a ring reduce-scatter and all-gather: exact `f32`
//! additions in a fixed order, the same result on every rank).
//!
//! A call is made by one thread of each rank, which owns every channel of the handle (Exclusive sharing;
//! [`all_reduce_ring`] is called by every thread of one block, its thread 0 the owner), and every rank of the communicator makes the same calls in the same order with the same arguments (but for
//! the counts of [`all_to_all_v`]). Nothing is reset between calls: semaphores and the acknowledgment
//! counter only grow, and each call waits for exactly the signals it is owed. Every wait is bounded by the
//! handle's `timeout_ns`, and a timeout names what it waited for: the rank ([`WaitOn::Peer`]), or, for the
//! root's acknowledgment, how many receivers had not answered ([`WaitOn::GroupAck`]); a late wait whose rank
//! (for the root's acknowledgment: any rank) the host has marked gone ends with [`Error::PeerGone`]. After an error the
//! counts no longer match between ranks: build a new communicator.

mod all_to_all;
mod broadcast;
mod reduce;
mod ring;

pub use all_to_all::{all_to_all_v, AllToAllV};
pub use broadcast::{broadcast, default_chunk, Algorithm, Broadcast};
pub use gdaki_shared::coll::{ctrl, CollHandle, MAX_RANKS};
pub use reduce::{all_reduce, dequantize, quantize, reduce, scale, Reduce};
pub use ring::{all_reduce_ring, ring_scratch_bytes, RingAllReduce};

use crate::channel::{departed, Exclusive, PortChannel, PortChannelHandle};
use crate::error::{Error, InvalidArgument, Result, WaitOn};
use crate::{sync, wait};
use gdaki_shared::handle::RemoteMr;

/// [`InvalidArgument::Collective`] as an error: a bad communicator handle, root or calling block.
const BAD_COMM: Error = Error::InvalidArgument(InvalidArgument::Collective);

/// [`InvalidArgument::Regions`] as an error: counts or regions that do not fit the data buffer or its layout.
const BAD_REGIONS: Error = Error::InvalidArgument(InvalidArgument::Regions);

/// A handle whose rank and size are checked.
struct Comm<'h> {
    h: &'h CollHandle,
    rank: u32,
    n: u32,
}

impl<'h> Comm<'h> {
    /// Checks `h`: `1 ..= MAX_RANKS` ranks, `rank` below them.
    fn new(h: &'h CollHandle) -> Result<Self> {
        if h.nranks == 0 || h.nranks as usize > MAX_RANKS || h.rank >= h.nranks {
            return Err(BAD_COMM);
        }
        Ok(Self { h, rank: h.rank, n: h.nranks })
    }

    /// The data channel to `peer` (below `n`, not this rank: the caller's to ensure).
    ///
    /// # Safety
    /// The handle's contract (see [`broadcast`]), and no other channel of the same peer alive meanwhile.
    unsafe fn channel(&self, peer: u32) -> PortChannel<'h, Exclusive> {
        // SAFETY: the caller's contract: a live channel whose QP only this thread uses now.
        unsafe { PortChannel::new(&self.h.peers[peer as usize]) }
    }

    /// The channel to `peer` retargeted at its control region: `put` writes from this rank's control region
    /// into the peer's (`signal` still advances the pair's semaphore); with `ack`, `signal` advances the peer's
    /// acknowledgment counter instead.
    fn ctrl_handle(&self, peer: u32, ack: bool) -> PortChannelHandle {
        let mut c = self.h.peers[peer as usize];
        let pc = self.h.peer_ctrl[peer as usize];
        c.dst = pc;
        c.src = self.h.ctrl;
        if ack {
            c.remote_sem = RemoteMr { addr: pc.addr.wrapping_add(ctrl::ACK), length: 8, rkey: pc.rkey, pad: 0 };
        }
        c
    }
}

/// Whether `bytes` bytes at `offset` lie inside a buffer of `len` bytes.
fn fits(len: u64, offset: u64, bytes: u64) -> bool {
    offset.checked_add(bytes).is_some_and(|end| end <= len)
}

/// Whether the ranges `a .. a + a_len` and `b .. b + b_len` share no byte (an empty range shares none). Both
/// must lie inside a buffer ([`fits`]), so that neither end overflows.
fn disjoint(a: u64, a_len: u64, b: u64, b_len: u64) -> bool {
    a_len == 0 || b_len == 0 || a + a_len <= b || b + b_len <= a
}

/// A receiver's acknowledgment (of a broadcast or a reduce): 1 added to the root's counter, flushed.
///
/// # Safety
/// As [`broadcast`].
unsafe fn acknowledge(c: &Comm<'_>, root: u32) -> Result<()> {
    let h = c.ctrl_handle(root, true);
    // SAFETY: the caller's contract: the channel to the root, retargeted; no other channel of it alive.
    let mut ch = unsafe { PortChannel::<Exclusive>::new(&h) };
    ch.signal()?;
    ch.flush()
}

/// The root's wait (of a broadcast or a reduce): `nranks - 1` more acknowledgments than it has waited for
/// so far.
///
/// # Safety
/// As [`broadcast`].
unsafe fn wait_acks(c: &Comm<'_>) -> Result<()> {
    let expected = c.h.ack_expected as *mut u64;
    let counter = c.h.ctrl.addr.wrapping_add(ctrl::ACK) as *const u64;
    // SAFETY: the handle's expected count, used by this thread only (the caller's contract); 8-byte aligned.
    let target = unsafe {
        let t = expected.read_volatile() + u64::from(c.n - 1);
        expected.write_volatile(t);
        t
    };
    let seen = core::cell::Cell::new(0);
    // Once late, the wait reads every peer's departed word as a channel's wait reads its peer's: an
    // acknowledgment from a rank that left or died never comes.
    wait::bounded_watching(
        c.h.timeout_ns,
        |watch| {
            // SAFETY: the handle's acknowledgment counter, live for the call and 8-byte aligned (64-byte
            // aligned region, offset 0).
            seen.set(unsafe { sync::load_acquire_u64(counter) });
            if seen.get() >= target {
                return Ok(Some(()));
            }
            if watch == wait::Watch::Look {
                let others = (0..c.n).filter(|&p| p != c.rank);
                // SAFETY: the peers' handles are host-built (the caller's contract): their words are live.
                if let Some(gone) = others.into_iter().find_map(|p| unsafe { departed(&c.h.peers[p as usize]) }) {
                    return Err(Error::PeerGone(gone));
                }
            }
            Ok(None)
        },
        || WaitOn::GroupAck { addr: counter as u64, expected: target, seen: seen.get() },
    )
}
