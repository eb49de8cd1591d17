//! The host side of the proxy FIFO (MSCCL++ `Fifo`): its memory, the handle device code pushes through, and
//! popping triggers in order. The protocol is in [`gdaki_shared::proxy`].

use std::sync::atomic::{AtomicU64, Ordering};

use gdaki_device::fifo;

use gdaki_shared::proxy::{FifoHandle, Trigger};

use crate::exec::{DataBuf, Executor};
use crate::mem::MappedBuf;
use crate::{Error, Result};

/// Slots of a FIFO when the caller does not choose (MSCCL++'s `DEFAULT_FIFO_SIZE` is 512).
pub const DEFAULT_FIFO_SIZE: u32 = 512;

/// A FIFO's memory: the ring and `tail` in queue memory (pinned host memory mapped into the GPU on `gpu`),
/// `head` and `tail_cache` where device code keeps state (GPU memory on `gpu`), all zero at first.
#[derive(Debug)]
pub(crate) struct Fifo {
    ring: MappedBuf,
    tail_word: MappedBuf,
    /// `head` at 0, `tail_cache` at 64 (separate lines: pushers add to one and store to the other).
    device_words: DataBuf,
    size: u32,
    /// Triggers popped so far (the proxy's copy of `tail`).
    tail: u64,
}

impl Fifo {
    /// A FIFO of `size` slots for device code of `exec`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] unless `size` is a power of two in 2 ..= 2^20; allocation errors;
    /// [`Error::Unavailable`] when the queue memory is not at one address for host and device.
    pub(super) fn new(exec: &Executor, size: u32) -> Result<Self> {
        if !size.is_power_of_two() || !(2..=1 << 20).contains(&size) {
            return Err(Error::InvalidArgument(format!(
                "proxy FIFO size {size} must be a power of two in 2..=1048576"
            )));
        }
        let mem = exec.queue_memory();
        let ring = mem.alloc(size as usize * size_of::<Trigger>())?;
        let tail_word = mem.alloc(8)?;
        for b in [&ring, &tail_word] {
            // The proxy reads triggers by host address; device code writes them by device address.
            if b.host_ptr() as u64 != b.device_addr() {
                return Err(Error::Unavailable(format!(
                    "queue memory at host {:p} is mapped at device address {:#x}: the proxy needs unified addressing",
                    b.host_ptr(),
                    b.device_addr()
                )));
            }
        }
        let device_words = exec.alloc_data(128)?;
        Ok(Self { ring, tail_word, device_words, size, tail: 0 })
    }

    /// The handle device code pushes through.
    pub(super) fn handle(&self) -> FifoHandle {
        let words = self.device_words.loc().addr;
        FifoHandle {
            triggers: self.ring.device_addr(),
            head: words,
            tail: self.tail_word.device_addr(),
            tail_cache: words + 64,
            size: self.size,
            pad: 0,
        }
    }

    /// Host address of the slot of trigger `i`.
    fn slot(&self, i: u64) -> *mut [u64; 2] {
        let base = (i & (self.size as u64 - 1)) as usize * size_of::<Trigger>();
        // SAFETY: inside the ring (masked index), 16-byte aligned (4096-aligned buffer).
        unsafe { self.ring.host_ptr().add(base) as *mut [u64; 2] }
    }

    /// The next trigger, if its pusher has stored it ([`fifo::peek_slot`]: word 1 with the valid bit, read
    /// with Acquire, then word 0).
    pub(super) fn peek(&self) -> Option<Trigger> {
        // SAFETY: a slot of the live ring; device code stores its words whole, 8 bytes at a time.
        unsafe { fifo::peek_slot(self.slot(self.tail)) }
    }

    /// Retires the trigger [`Fifo::peek`] returned ([`fifo::retire_slot`]: clears its slot, then counts it in
    /// `tail` with Release, so the slot is clear before a pusher may reuse it).
    pub(super) fn pop(&mut self) {
        let slot = self.slot(self.tail);
        self.tail += 1;
        // SAFETY: the live ring's slot and the 8-byte aligned `tail` word, which device code only loads.
        unsafe { fifo::retire_slot(slot, self.tail_word.host_ptr() as *mut u64, self.tail) };
    }

    /// The FIFO's `head`: indices pushers have taken so far (each trigger below it is stored, or about to be).
    /// Host memory is read with an atomic load; GPU memory with a copy on the GPU's non-blocking stream, which
    /// does not wait for running kernels.
    ///
    /// # Errors
    /// The CUDA driver's error for a copy from GPU memory.
    pub(super) fn head(&self) -> Result<u64> {
        match &self.device_words {
            DataBuf::Host(b) => {
                // SAFETY: `head` is the first 8 bytes of the live, 8-byte aligned buffer, which pushers access only
                // atomically.
                let head = unsafe { AtomicU64::from_ptr(b.host_ptr() as *mut u64) };
                Ok(head.load(Ordering::Acquire))
            }
            gpu => {
                let mut w = [0u8; 8];
                gpu.read(0, &mut w)?;
                Ok(u64::from_ne_bytes(w))
            }
        }
    }

    /// Triggers popped so far.
    pub(super) fn popped(&self) -> u64 {
        self.tail
    }
}
