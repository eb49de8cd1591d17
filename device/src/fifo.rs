//! Device side of the proxy FIFO (Host and HostNoAtomic modes; MSCCL++ `FifoDeviceHandle::push` / `sync`):
//! push a [`Trigger`], and wait until the proxy has done one; and the proxy's twin of it ([`peek_slot`],
//! [`retire_slot`]), which the host's proxy thread runs. The protocol is in [`gdaki_shared::proxy`].

use crate::error::{Result, WaitOn};
use crate::scope::{Device, Scope};
use crate::sync;
use crate::wait::bounded;
use gdaki_shared::proxy::{FifoHandle, Trigger};

/// Pushes `t` and returns its index. Any thread may push (the index comes from a GPU-scope atomic add);
/// stores made before the push (e.g. the data of a put) are visible to the proxy before the trigger.
///
/// # Errors
/// [`Error::Timeout`](crate::Error::Timeout) with [`WaitOn::FifoSpace`] when the ring stays full for `timeout_ns` (the proxy is
/// stopped or stuck). The index stays taken, so the FIFO does not recover from that.
///
/// # Safety
/// `f` must be a live FIFO's handle (its words valid for the push).
#[inline(always)]
pub unsafe fn push(f: &FifoHandle, t: Trigger, timeout_ns: u64) -> Result<u64> {
    let size = f.size as u64;
    // SAFETY: the FIFO's words (caller's contract): `head` and `tail_cache` in device memory, `tail` written
    // by the proxy, the ring in pinned host memory; slot `i % size` is this pusher's once `i < tail + size`.
    unsafe {
        let i = Device::fetch_add(f.head as *mut u64, 1);
        let cache = f.tail_cache as *mut u64;
        // The cache is read with acquire and written with release (GPU scope): a pusher that trusts another's
        // copy of `tail` must also see the proxy's clearing of the slot it reuses, which happened before that
        // `tail` (a relaxed cache let this pusher's trigger be overwritten by the clearing; the loom model of
        // the FIFO found it).
        if i >= Device::load_acquire(cache) + size {
            bounded(
                timeout_ns,
                || {
                    let tail = sync::load_acquire_u64(f.tail as *const u64);
                    // A lower bound of `tail` whichever pusher stores last: `tail` only grows.
                    Device::store_release(cache, tail);
                    Ok((i < tail + size).then_some(()))
                },
                || WaitOn::FifoSpace { index: i },
            )?;
        }
        let slot = (f.triggers as *mut [u64; 2]).add((i & (size - 1)) as usize) as *mut u64;
        sync::store_volatile(slot, t.0[0]);
        // Word 1 carries the valid bit: released after word 0 and everything stored before the push.
        sync::store_release_u64(slot.add(1), t.0[1]);
        Ok(i)
    }
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
