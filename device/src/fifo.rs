//! Device side of the proxy FIFO (Host and HostNoAtomic modes; MSCCL++ `FifoDeviceHandle::push` / `sync`):
//! push a [`Trigger`], and wait until the proxy has done one; and the proxy's twin of it ([`peek_slot`],
//! [`retire_slot`]), which the host's proxy thread runs. The protocol is in [`gdaki_shared::proxy`].

use crate::error::{Result, WaitOn};
use crate::scope::{Device, Scope};
use crate::sync;
use crate::wait::{bounded, bounded_steps, Step};
use gdaki_shared::proxy::{FifoHandle, Trigger};

/// Pushes `t` and returns its index. Any thread may push: a pusher takes the next index with a GPU-scope
/// compare-and-swap on `head` only once the ring has room for it, then fills that slot; stores made before
/// the push (e.g. the data of a put) are visible to the proxy before the trigger.
///
/// An index is taken only with its room, so that a push that gives up leaves no hole: a pusher that took an
/// index first (an atomic add, as MSCCL++'s FIFO does) and then timed out waiting for its slot would leave
/// that slot empty for good, and the proxy, which takes triggers in index order, would wait on it forever
/// while every later push (of any channel of the communicator) was lost.
///
/// # Errors
/// [`Error::Timeout`](crate::Error::Timeout) with [`WaitOn::FifoSpace`] when the ring stays full for
/// `timeout_ns` (the proxy is stopped or stuck; the index is the one the push waited to take). Nothing was
/// pushed, and the FIFO works on once the proxy takes triggers again.
///
/// # Safety
/// `f` must be a live FIFO's handle (its words valid for the push).
#[inline(always)]
pub unsafe fn push(f: &FifoHandle, t: Trigger, timeout_ns: u64) -> Result<u64> {
    // SAFETY: the FIFO's words (caller's contract): `head` and `tail_cache` in device memory, `tail` written
    // by the proxy, the ring in pinned host memory; slot `i % size` is this pusher's once it took index `i`,
    // which it does only while `i < tail + size`.
    unsafe {
        let i = take_index(f, timeout_ns)?;
        let slot = (f.triggers as *mut [u64; 2]).add((i & (f.size as u64 - 1)) as usize) as *mut u64;
        sync::store_volatile(slot, t.0[0]);
        // Word 1 carries the valid bit: released after word 0 and everything stored before the push.
        sync::store_release_u64(slot.add(1), t.0[1]);
        Ok(i)
    }
}

/// [`push`]'s index: the next one, taken with a compare-and-swap once the ring has room for it.
///
/// The first try names `head` as loaded (a volatile load, issued together with the cache's load so that the two
/// cost one trip to memory): with no other pusher in between, the index is taken in one compare-and-swap. Its
/// room is checked by the cached copy of `tail`, and by `tail` itself (which also refreshes the cache) when the
/// cache does not show room, as an atomic add's index was checked before. A swap that finds another value has
/// read `head`: the next try names that; a ring still full is waited on, bounded by `timeout_ns`. (The cache
/// as the first guess cost a failed swap on nearly every push, since it is refreshed only when the ring looks
/// full: ping-pong through the proxy was 2-3 µs slower per round trip on an H100.)
///
/// The cache is read with acquire and written with release (GPU scope): a pusher that trusts another's copy
/// of `tail` must also see the proxy's clearing of the slot it reuses, which happened before that `tail` (a
/// relaxed cache let this pusher's trigger be overwritten by the clearing; the loom model of the FIFO found
/// it).
///
/// # Errors
/// As [`push`].
///
/// # Safety
/// As [`push`].
#[inline(always)]
unsafe fn take_index(f: &FifoHandle, timeout_ns: u64) -> Result<u64> {
    let (head, cache, size) = (f.head as *mut u64, f.tail_cache as *mut u64, f.size as u64);
    // SAFETY: the FIFO's words (caller's contract). `head` first: the cache's acquire load must not hold it back.
    let (guess, cached) = unsafe { (sync::load_word_u64(head), Device::load_acquire(cache)) };
    // The index to try, and the latest lower bound of `tail` read (with acquire) to check its room by.
    let (next, tail_bound) = (core::cell::Cell::new(guess), core::cell::Cell::new(cached));
    bounded_steps(
        timeout_ns,
        || {
            let i = next.get();
            // SAFETY: the FIFO's words (caller's contract).
            unsafe {
                if i >= tail_bound.get() + size {
                    let tail = sync::load_acquire_u64(f.tail as *const u64);
                    // A lower bound of `tail` whichever pusher stores last: `tail` only grows.
                    Device::store_release(cache, tail);
                    tail_bound.set(tail);
                    if i >= tail + size {
                        return Ok(Step::Idle);
                    }
                }
                let seen = Device::cas(head, i, i + 1);
                if seen == i {
                    return Ok(Step::Done(i));
                }
                // `head` was elsewhere (another pusher took `i`, or the guess was behind): try its value at once.
                next.set(seen);
                Ok(Step::Progress)
            }
        },
        || WaitOn::FifoSpace { index: next.get() },
    )
}

/// Waits until the proxy has done the trigger at `index` (MSCCL++ `FifoDeviceHandle::sync`); after a
/// [`Trigger::FLUSH`] there, every WQE the proxy posted before it for that channel's QP has completed.
///
/// # Errors
/// [`Error::Timeout`](crate::Error::Timeout) with [`WaitOn::Proxy`] after `timeout_ns`.
///
/// # Safety
/// As [`push`].
#[inline(always)]
pub unsafe fn sync(f: &FifoHandle, index: u64, timeout_ns: u64) -> Result<()> {
    let tail = core::cell::Cell::new(0);
    bounded(
        timeout_ns,
        || {
            // SAFETY: the proxy's counter (caller's contract).
            tail.set(unsafe { sync::load_acquire_u64(f.tail as *const u64) });
            Ok((tail.get() > index).then_some(()))
        },
        || WaitOn::Proxy { index, done: tail.get() },
    )
}

/// The proxy's side of the protocol (host code; MSCCL++ `Fifo::poll`): the trigger in `slot` if its pusher
/// has published it. Word 1 (with [`Trigger::VALID`]) is loaded with acquire order, so word 0 and everything
/// the pusher stored before the push are visible.
///
/// # Safety
/// `slot` must be a 16-byte aligned slot of a live FIFO's ring, readable by the caller.
#[inline(always)]
pub unsafe fn peek_slot(slot: *const [u64; 2]) -> Option<Trigger> {
    let w = slot as *const u64;
    // SAFETY: the caller's contract; both words are 8-byte aligned.
    unsafe {
        let second = sync::load_acquire_u64(w.add(1));
        (second & Trigger::VALID != 0).then(|| Trigger([sync::load_word_u64(w), second]))
    }
}

/// The proxy's side: retires the trigger [`peek_slot`] returned by clearing its slot and then storing
/// `new_tail` (its index + 1) to `tail` with release order, so that a pusher that sees the new tail may reuse
/// the slot and its stores follow the clearing.
///
/// # Safety
/// As [`peek_slot`], writable; `tail` the FIFO's 8-byte aligned tail word, written by this caller only.
#[inline(always)]
pub unsafe fn retire_slot(slot: *mut [u64; 2], tail: *mut u64, new_tail: u64) {
    let w = slot as *mut u64;
    // SAFETY: the caller's contract.
    unsafe {
        sync::store_word_u64(w.add(1), 0);
        sync::store_word_u64(w, 0);
        sync::store_release_u64(tail, new_tail);
    }
}
