//! Reduce and all-reduce of `f32` data on the NIC: every rank quantizes its values to 64-bit fixed point with
//! one scale that all ranks compute alike, the NIC adds them into the root's accumulation area with RDMA
//! fetch-adds (one per value), and the root turns the integer sums back into `f32`.

use super::{acknowledge, broadcast, fits, wait_acks, Algorithm, Broadcast, Comm, BAD_COMM, BAD_REGIONS};
use crate::error::{Error, InvalidArgument, Result};
use crate::onesided::atomic_target;
use crate::sync;
use crate::wqe::{self, Raddr};
use gdaki_shared::coll::CollHandle;

/// Fetch-adds a sender stages between two doorbells.
const LANES_PER_DOORBELL: u64 = 32;

/// One reduce call, the same on every rank. The input and output ranges hold `f32`s (4-byte aligned), the
/// accumulation area `i64`s (8-byte aligned); the accumulation area must overlap neither of the others,
/// which may overlap each other (the root has read its input before it writes its output).
///
/// `#[repr(C)]`, 40 bytes: a kernel may take it by value or by reference.
#[derive(Clone, Copy, Debug, PartialEq)]
#[repr(C)]
pub struct Reduce {
    /// Byte offset of every rank's input: `count` `f32`s.
    pub offset: u64,
    /// Number of values (0: the call does nothing, on every rank).
    pub count: u64,
    /// Byte offset of the accumulation area, `8 * count` bytes: the root's is where the NIC adds; every
    /// rank's must fit the buffer (the same arguments everywhere), only the root's is written.
    pub acc_offset: u64,
    /// Byte offset of the root's output: `count` `f32`s (for [`all_reduce`], every rank's).
    pub out_offset: u64,
    /// The rank that receives the sum, below `nranks`.
    pub root: u32,
    /// Bound of every value of every rank: `|x| <= max_abs`, positive and finite. It sets the scale
    /// ([`scale`]) and so the error bound.
    pub max_abs: f32,
}

const _: () = assert!(core::mem::size_of::<Reduce>() == 40);

// SAFETY: `#[repr(C)]` of four `u64`s, a `u32` and an `f32` (no padding, the size asserted above), no
// pointers: the same layout on the host and on nvptx64.
unsafe impl crate::launch::DeviceRepr for Reduce {}

/// The scale of a reduce over `nranks` ranks of values bounded by `max_abs`: the largest power of two `s`
/// with `nranks * max_abs * s < 2^63`, so that `nranks` quantized values (each at most `max_abs * s` in
/// magnitude) sum without overflow. `None` for 0 ranks or a `max_abs` that is not positive and finite.
///
/// With `nranks * max_abs = f * 2^e` (`1 <= f < 2`), `s = 2^(62 - e)`: exact in `f64` for every `f32`
/// bound and any rank count.
pub fn scale(nranks: u32, max_abs: f32) -> Option<f64> {
    if nranks == 0 || !(max_abs > 0.0 && max_abs <= f32::MAX) {
        return None;
    }
    // Normal in f64 (at least 2^-149), rounded at most upwards in exponent: the scale stays safe.
    let m = f64::from(nranks) * f64::from(max_abs);
    let e = ((m.to_bits() >> 52) & 0x7ff) as i64 - 1023;
    // 62 - e lies in -98 ..= 211: a normal f64 power of two.
    Some(f64::from_bits(((62 - e + 1023) as u64) << 52))
}

/// The fixed-point value [`reduce`] adds on the NIC for `x` at scale `s` (from [`scale`]): `x * s` rounded to
/// the nearest integer, halves away from zero. For `|x| <= max_abs`, `|x * s| < 2^63 / nranks`, so the
/// result is off by at most `1 / (2s)` and `nranks` of them sum without overflow. `x * s` is exact in `f64`
/// (a power-of-two scale of an `f32`); the truncation and the fraction are exact too. Public for users who
/// aggregate on the NIC themselves (their own fetch-adds) and for tests of the bound.
pub fn quantize(x: f32, s: f64) -> i64 {
    let y = f64::from(x) * s;
    let t = y as i64;
    let frac = y - t as f64;
    t + i64::from(frac >= 0.5) - i64::from(frac <= -0.5)
}

/// Sums `r.count` `f32`s of every rank's input at `r.offset` into the root's output at `r.out_offset`, on
/// the NIC. Every rank calls it with the same `r`, from one thread.
///
/// Each rank first checks all its values against `r.max_abs` (a value above it, a NaN or an infinity is
/// [`InvalidArgument::Value`], nothing sent). The root then writes its own quantized values into its
/// accumulation area (locally: there is no channel to itself, and this store is also what resets the area
/// for the call), and signals every peer that the area is ready. Each peer waits for that signal, posts one
/// 8-byte RDMA fetch-add per value (`round(x * s)` as `u64`; two's complement makes the unsigned sum the
/// signed one) on the root's area, their old values landing in the channel's scratch word, flushes, and
/// acknowledges as a broadcast's receiver does. The root waits for `nranks - 1` acknowledgments, then writes
/// `f32(sum as f64 / s)` for every value. The scale `s` is [`scale`]`(nranks, max_abs)`.
///
/// Error bound: each quantized value is off by at most `1 / (2s)`, the sum by `nranks / (2s)`, which is at
/// most `nranks^2 * max_abs / 2^63` since `s >= 2^62 / (nranks * max_abs)`; converting the integer sum to
/// `f64` adds at most `nranks * max_abs * 2^-53`, and the last rounding to `f32` half an ulp of the result.
/// A sum beyond `f32::MAX` (possible when `nranks * max_abs` exceeds it) comes out as an infinity of its sign,
/// as any `f32` sum would.
///
/// # Errors
/// [`InvalidArgument::Collective`] for a bad handle or a root not below `nranks`, [`InvalidArgument::Bound`]
/// for a `max_abs` that is not positive and finite, [`InvalidArgument::Regions`] for misaligned,
/// overlapping or out-of-buffer ranges (nothing posted);
/// [`InvalidArgument::Value`] for a value out of bound on this rank (nothing posted: the root then times out
/// with [`WaitOn::GroupAck`](crate::error::WaitOn::GroupAck), or, where the root's value is out of bound, the
/// peers with [`WaitOn::Peer`](crate::error::WaitOn::Peer) naming the root); the timeouts and channel errors
/// of [`super::broadcast`].
///
/// # Safety
/// As [`super::broadcast`].
pub unsafe fn reduce(h: &CollHandle, r: &Reduce) -> Result<()> {
    let c = Comm::new(h)?;
    let s = scale(c.n, r.max_abs).ok_or(Error::InvalidArgument(InvalidArgument::Bound))?;
    if r.root >= c.n {
        return Err(BAD_COMM);
    }
    if !ranges_ok(h.buf.addr, h.buf.length, r) {
        return Err(BAD_REGIONS);
    }
    if r.count == 0 {
        return Ok(());
    }
    let input = (h.buf.addr + r.offset) as *const f32;
    let value = |i: u64| {
        // SAFETY: `i < count`: inside the input range, checked above; 4-byte aligned.
        unsafe { sync::load_volatile(input.add(i as usize)) }
    };
    for i in 0..r.count {
        let x = value(i);
        if !(x >= -r.max_abs && x <= r.max_abs) {
            return Err(Error::InvalidArgument(InvalidArgument::Value));
        }
    }
    if c.rank == r.root {
        // SAFETY: the caller's contract.
        return unsafe { gather(&c, r, s, value) };
    }
    // SAFETY: the caller's contract; the only channel of the root alive.
    let mut ch = unsafe { c.channel(r.root) };
    let (first, result) = atomic_target(&ch.handle().dst, r.acc_offset, &ch.handle().scratch, 0)?;
    ch.wait()?;
    let qp = ch.poster();
    for i in 0..r.count {
        let lane = Raddr { addr: first.addr + 8 * i, rkey: first.rkey };
        let _ticket = qp.post(false, wqe::atomic_fetch_add(lane, result, quantize(value(i), s) as u64)?)?;
        if (i + 1).is_multiple_of(LANES_PER_DOORBELL) {
            qp.ring_db();
        }
    }
    ch.flush()?;
    drop(ch);
    // SAFETY: the caller's contract; the data channel is gone.
    unsafe { acknowledge(&c, r.root) }
}

/// The `f32` that [`reduce`] writes for an integer sum `sum` of [`quantize`]d values at scale `s`:
/// `sum as f64 / s`, rounded to `f32`. The conversion to `f64` rounds by at most a relative 2^-53, the
/// division by a power of two is exact, and the last rounding is half an ulp of the `f32` result.
pub fn dequantize(sum: i64, s: f64) -> f32 {
    (sum as f64 / s) as f32
}

/// The root's side of [`reduce`]: its own values into the accumulation area, the ready signals, the
/// acknowledgments, the output.
///
/// # Safety
/// As [`super::broadcast`]; `r` checked by [`reduce`].
unsafe fn gather(c: &Comm<'_>, r: &Reduce, s: f64, value: impl Fn(u64) -> f32) -> Result<()> {
    let acc = (c.h.buf.addr + r.acc_offset) as *mut u64;
    for i in 0..r.count {
        // SAFETY: inside the accumulation area (checked), 8-byte aligned; no peer adds before the signal
        // below.
        unsafe { sync::store_volatile(acc.add(i as usize), quantize(value(i), s) as u64) };
    }
    // The NIC adds to these words: they are in place before any peer hears that the area is ready.
    sync::fence_release_sys();
    let peers = || (0..c.n).filter(|&p| p != c.rank);
    for p in peers() {
        // SAFETY: the caller's contract; one channel alive at a time.
        unsafe { c.channel(p) }.signal()?;
    }
    for p in peers() {
        // SAFETY: as above.
        unsafe { c.channel(p) }.flush()?;
    }
    // SAFETY: as above (with no peers it waits for nothing).
    unsafe { wait_acks(c) }?;
    let out = (c.h.buf.addr + r.out_offset) as *mut f32;
    for i in 0..r.count {
        // SAFETY: the area and the output range, checked and disjoint; every peer's fetch-adds completed
        // before its acknowledgment, which `wait_acks` read with acquire.
        unsafe {
            let sum = sync::load_volatile(acc.add(i as usize)) as i64;
            sync::store_volatile(out.add(i as usize), dequantize(sum, s));
        }
    }
    Ok(())
}

/// Whether `r`'s ranges fit a buffer of `len` bytes at `base`, aligned, the accumulation area apart from
/// the input and the output.
fn ranges_ok(base: u64, len: u64, r: &Reduce) -> bool {
    let (Some(vals), Some(acc)) = (r.count.checked_mul(4), r.count.checked_mul(8)) else {
        return false;
    };
    let apart = |a: u64, b: u64, bb: u64| a + acc <= b || b + bb <= a;
    fits(len, r.offset, vals)
        && fits(len, r.out_offset, vals)
        && fits(len, r.acc_offset, acc)
        && (base + r.offset).is_multiple_of(4)
        && (base + r.out_offset).is_multiple_of(4)
        && (base + r.acc_offset).is_multiple_of(8)
        && apart(r.acc_offset, r.offset, vals)
        && apart(r.acc_offset, r.out_offset, vals)
}

/// [`reduce`] to `r.root`, then a [`broadcast`] of the root's output range with `algorithm` (its default
/// chunk): every rank ends with the sum at `r.out_offset` (which may be `r.offset`: an in-place
/// all-reduce).
///
/// # Errors
/// As [`reduce`] and [`broadcast`].
///
/// # Safety
/// As [`super::broadcast`].
pub unsafe fn all_reduce(h: &CollHandle, r: &Reduce, algorithm: Algorithm) -> Result<()> {
    // SAFETY: the caller's contract.
    unsafe {
        reduce(h, r)?;
        let bytes = r.count * 4;
        broadcast(h, &Broadcast { root: r.root, offset: r.out_offset, bytes, chunk: 0, algorithm })
    }
}
