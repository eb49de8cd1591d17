//! All-reduce of `f32` data summed by the GPU: a ring reduce-scatter, then a ring all-gather, over the port
//! channels to the next rank (puts with a signal) and from the previous one (waits), the additions made by
//! the threads of one block.

use super::{broadcast::default_chunk, disjoint, fits, Comm, BAD_COMM, BAD_REGIONS};
use crate::error::{Error, InvalidArgument, Result};
use crate::launch::DeviceRepr;
use crate::sync;
use crate::thread::Thread;
use gdaki_shared::coll::CollHandle;

/// One ring all-reduce call, the same on every rank (`#[repr(C)]`, 40 bytes: a kernel may take it by
/// reference). Every offset is a byte offset into the rank's data buffer, 4-byte aligned there; the input and
/// the output are either the same range (in place) or disjoint, and the scratch area overlaps neither.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct RingAllReduce {
    /// Byte offset of every rank's input: `count` `f32`s.
    pub in_offset: u64,
    /// Byte offset of every rank's output, where the sum lands: `count` `f32`s (`in_offset`: in place).
    pub out_offset: u64,
    /// Number of values (0: the call does nothing, on every rank).
    pub count: u64,
    /// Byte offset of the scratch area that the previous rank's partial sums land in:
    /// [`ring_scratch_bytes`]`(nranks, count)` bytes.
    pub scratch_offset: u64,
    /// Values per chunk (each chunk is one put with a signal per step); 0 for the default: the
    /// broadcast's [`default_chunk`] of one segment's bytes, in values (the whole segment up to 64 KiB).
    pub chunk: u64,
}

const _: () = assert!(core::mem::size_of::<RingAllReduce>() == 40);

// SAFETY: `#[repr(C)]` of five `u64`s (no padding, the size asserted above), no pointers: the same layout on
// the host and on nvptx64.
unsafe impl DeviceRepr for RingAllReduce {}

/// Bytes of the scratch area of a ring all-reduce of `count` values over `nranks` ranks: `nranks - 1` slots
/// (one per reduce-scatter step) of one longest segment, `ceil(count / nranks)` `f32`s each. 0 for 0 ranks;
/// `u64::MAX` (more than any buffer holds) when the size does not fit 64 bits.
pub const fn ring_scratch_bytes(nranks: u32, count: u64) -> u64 {
    if nranks == 0 {
        return 0;
    }
    let n = nranks as u64;
    (4 * (n - 1)).saturating_mul(count.div_ceil(n))
}

/// The values of segment `j` of `count` over `n` ranks: `(first, len)`. The first `count % n` segments hold
/// `count / n + 1` values, the others `count / n`, in rank order.
const fn segment(count: u64, n: u32, j: u32) -> (u64, u64) {
    let (base, rem, j) = (count / n as u64, count % n as u64, j as u64);
    let first = j * base + if j < rem { j } else { rem };
    (first, base + (j < rem) as u64)
}

/// Sums `r.count` `f32`s of every rank's input at `r.in_offset` into every rank's output at `r.out_offset`,
/// added by the GPU. Every thread of one block of each rank calls it with the same `r` (thread 0 posts and
/// waits; all threads add a strided share of each chunk, between two block barriers). Any block size works;
/// on the GPU the calling kernel's registers bound it (a kernel of 255 registers a thread launches at most 256
/// threads a block: `CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES` beyond).
///
/// The values are split into `nranks` segments (the first `count % nranks` of them one value longer, in rank
/// order) and each segment into chunks of `r.chunk` values. Reduce-scatter: at step 0 rank `q` puts its input of
/// segment `q` into the next rank's scratch slot 0; at step `s` (1 ..= `nranks - 1`) it waits for each chunk
/// of segment `q - s` from the previous rank, writes `scratch + input` to its output there and puts that to
/// the next rank's slot `s` (at step `nranks - 1`: its segment `q + 1`, now complete, straight into the next
/// rank's output). All-gather: for `nranks - 2` more steps each rank waits for a complete segment in its
/// output and forwards it. A chunk is forwarded as soon as it is added, so chunks pipeline along the ring.
/// Every rank puts `2 (nranks - 1) / nranks` of the data and adds `(nranks - 1) / nranks` of it; one put
/// with a signal per chunk per step. The channel to the next rank is flushed before the call returns.
///
/// Order of additions: value `i` of segment `j` is `((x_j + x_{j+1}) + x_{j+2}) + ... + x_{j+n-1}`
/// (ranks mod `n`, `x_q` rank `q`'s value), `n - 1` additions in `f32` rounded to nearest, made once (by rank
/// `j - 1`) and copied to every other rank: the result is bitwise identical on every rank. It is the
/// sequential sum `x_0 + ... + x_{n-1}` with the ranks rotated to start at `j`, so for 3 or more ranks it may
/// differ from the sequential sum by the rounding of a different order (within `(n-1) 2^-24 sum |x_q|` of the
/// exact sum, to first order); for 1 or 2 ranks it is the same.
///
/// Calls that follow each other may overlap across ranks, as for [`super::broadcast`]: a rank that returned
/// may already put the next call's chunks into this rank's scratch. Repeating a call with the same ranges is
/// safe; otherwise keep the next call's scratch apart from this call's output (or separate the calls).
///
/// # Errors
/// [`InvalidArgument::Collective`] for a bad handle, or a call that not every thread of the block makes, or
/// from a launch of more than one block; [`InvalidArgument::Regions`] for misaligned ranges, ranges outside
/// the buffer, an input and output that overlap without being equal, a scratch area overlapping either (on
/// every thread that calls, nothing posted); [`Error::Timeout`] with [`WaitOn::Peer`](crate::error::WaitOn::Peer)
/// naming the previous rank, and the channels' errors, on thread 0; every other thread then returns
/// [`InvalidArgument::Team`].
///
/// # Safety
/// As [`super::broadcast`] for thread 0 (the channels used by it only), and every thread of the block makes
/// the call (it holds block barriers).
pub unsafe fn all_reduce_ring(h: &CollHandle, r: &RingAllReduce, t: &Thread) -> Result<()> {
    let c = Comm::new(h)?;
    if !ranges_ok(h.buf.addr, h.buf.length, c.n, r) {
        return Err(BAD_REGIONS);
    }
    // Every thread of one block: a call from part of the block (behind a `tid == 0` test, as the other
    // collectives are called) would add only the callers' shares and return `Ok`, since a barrier counts the
    // threads that returned as arrived; a second block would post on the same channels.
    if t.sync_threads_count(true) != t.block_size() || t.blocks() != 1 {
        return Err(BAD_COMM);
    }
    if r.count == 0 {
        return Ok(());
    }
    let base = h.buf.addr;
    let (tid, threads) = (t.tid() as u64, t.block_size() as u64);
    if c.n == 1 {
        if r.out_offset != r.in_offset {
            for i in (tid..r.count).step_by(threads as usize) {
                // SAFETY: `i < count`: inside both ranges (checked), which are disjoint; 4-byte aligned.
                unsafe {
                    let x = sync::load_volatile((base + r.in_offset + 4 * i) as *const f32);
                    sync::store_volatile((base + r.out_offset + 4 * i) as *mut f32, x);
                }
            }
        }
        t.sync_threads();
        return Ok(());
    }
    let ring = Ring { c: &c, r, t, base, tid, threads };
    // Thread 0's error stays with it; the others learn of it at the next barrier.
    let res = ring.run();
    let failed = t.sync_threads_or(res.is_err());
    match res {
        Err(e) => Err(e),
        Ok(()) if failed => Err(Error::InvalidArgument(InvalidArgument::Team)),
        Ok(()) => Ok(()),
    }
}

/// One call's state on one thread.
struct Ring<'a, 'h> {
    c: &'a Comm<'h>,
    r: &'a RingAllReduce,
    t: &'a Thread,
    base: u64,
    tid: u64,
    threads: u64,
}

impl Ring<'_, '_> {
    /// The calling rank's segment `q + k` (mod `n`).
    fn seg(&self, k: u32) -> (u64, u64) {
        let n = self.c.n;
        segment(self.r.count, n, (self.c.rank + k) % n)
    }

    /// Values per chunk.
    fn chunk(&self) -> u64 {
        let longest = self.r.count.div_ceil(self.c.n as u64);
        let c = if self.r.chunk == 0 { default_chunk(4 * longest) / 4 } else { self.r.chunk };
        c.clamp(1, longest.max(1))
    }

    /// The call on this thread: thread 0 posts and waits, every thread adds. Thread 0 keeps its first error
    /// and posts nothing more; the block learns of it at the next barrier and every thread returns there
    /// (thread 0 with the error, the others `Ok`), so that all pass the same barriers.
    fn run(&self) -> Result<()> {
        let (n, rank) = (self.c.n, self.c.rank);
        let (next, prev) = ((rank + 1) % n, (rank + n - 1) % n);
        let chunk = self.chunk();
        let longest = self.r.count.div_ceil(n as u64);
        let lead = self.tid == 0;
        let slot = |s: u32| self.r.scratch_offset + 4 * longest * s as u64;
        let mut err: Option<Error> = None;
        let put = |err: &mut Option<Error>, dst: u64, src: u64, bytes: u64| {
            if lead && err.is_none() {
                // SAFETY: the caller's contract: thread 0 owns the channels; one alive at a time.
                *err = unsafe { self.c.channel(next) }.put_with_signal(dst, src, bytes).err();
            }
        };
        // Reduce-scatter, step 0: this rank's own segment, from its input, into the next rank's slot 0.
        let (first, len) = self.seg(0);
        let mut at = 0;
        while at < len {
            let m = chunk.min(len - at);
            put(&mut err, slot(0) + 4 * at, self.r.in_offset + 4 * (first + at), 4 * m);
            at += m;
        }
        // Step s takes what the previous rank put at step s - 1: for s in 1 ..= n - 1 a partial sum of
        // segment q - s (q + 1, complete, at s = n - 1), for s in n ..= 2n - 2 the complete segment q + n - s;
        // each chunk is forwarded but at the last step.
        for s in 1..=2 * (n - 1) {
            let reducing = s < n;
            let (first, len) = if reducing { self.seg(n - s) } else { self.seg(2 * n - s) };
            let mut at = 0;
            while at < len {
                let m = chunk.min(len - at);
                let out = self.r.out_offset + 4 * (first + at);
                if lead && err.is_none() {
                    // SAFETY: as above.
                    err = unsafe { self.c.channel(prev) }.wait().err();
                }
                if self.t.sync_threads_or(err.is_some()) {
                    return err.map_or(Ok(()), Err);
                }
                if reducing {
                    self.add(slot(s - 1) + 4 * at, self.r.in_offset + 4 * (first + at), out, m);
                    self.t.sync_threads();
                }
                if s < 2 * (n - 1) {
                    // Partial sums into the next rank's slot s; complete ones (s >= n - 1) into its output.
                    let dst = if s < n - 1 { slot(s) + 4 * at } else { out };
                    put(&mut err, dst, out, 4 * m);
                }
                at += m;
            }
        }
        if lead && err.is_none() {
            // SAFETY: as above.
            err = unsafe { self.c.channel(next) }.flush().err();
        }
        err.map_or(Ok(()), Err)
    }

    /// `out[i] = scratch[i] + input[i]` for `m` values (byte offsets), this thread's strided share; then a
    /// system-scope release fence, so that the NIC reads the sums once thread 0 posts after the barrier.
    fn add(&self, scratch: u64, input: u64, out: u64, m: u64) {
        let b = self.base;
        let mut i = self.tid;
        while i < m {
            // SAFETY: inside the scratch slot, the input and the output ranges (checked by `ranges_ok`), 4-byte
            // aligned; the scratch chunk was placed by the NIC before the signal thread 0 waited for (acquire),
            // ordered before this load by the block barrier; no other thread touches value `i`.
            unsafe {
                let x = sync::load_volatile((b + scratch + 4 * i) as *const f32);
                let y = sync::load_volatile((b + input + 4 * i) as *const f32);
                sync::store_volatile((b + out + 4 * i) as *mut f32, x + y);
            }
            i += self.threads;
        }
        sync::fence_release_sys();
    }
}

/// Whether `r`'s ranges fit a buffer of `len` bytes at `base` for `n` ranks: aligned, input and output
/// equal or disjoint, the scratch area apart from both.
fn ranges_ok(base: u64, len: u64, n: u32, r: &RingAllReduce) -> bool {
    let Some(vals) = r.count.checked_mul(4) else {
        return false;
    };
    if vals > len {
        return false;
    }
    let scratch = ring_scratch_bytes(n, r.count);
    fits(len, r.in_offset, vals)
        && fits(len, r.out_offset, vals)
        && fits(len, r.scratch_offset, scratch)
        && (base + r.in_offset).is_multiple_of(4)
        && (base + r.out_offset).is_multiple_of(4)
        && (base + r.scratch_offset).is_multiple_of(4)
        && (r.in_offset == r.out_offset || disjoint(r.in_offset, vals, r.out_offset, vals))
        && disjoint(r.scratch_offset, scratch, r.in_offset, vals)
        && disjoint(r.scratch_offset, scratch, r.out_offset, vals)
}
