//! The application's device code: its kernels, written once for both executors.
#![no_std]
#![cfg_attr(target_arch = "nvptx64", feature(abi_ptx))]

use gdaki_device::channel::{Exclusive, PortChannel, PortChannelHandle};
use gdaki_device::{kernel, Error, Thread};

/// One exchange on a port channel: rank 0 puts `bytes` bytes of its buffer into rank 1's and signals;
/// rank 1 waits for the signal (after which the data is in its buffer). Thread 0 of the launch does the
/// work; every wait is bounded by the channel's timeout.
#[kernel]
pub fn exchange(t: &Thread, ch: &PortChannelHandle, bytes: u64, rank: u32) -> Result<(), Error> {
    if t.global_id() != 0 {
        return Ok(());
    }
    // SAFETY: the host made `ch` for a live channel whose QP only this thread uses (Exclusive sharing).
    let mut ch = unsafe { PortChannel::<Exclusive>::new(ch) };
    if rank == 0 {
        ch.put_with_signal(0, 0, bytes)?;
        ch.flush()
    } else {
        ch.wait()
    }
}
