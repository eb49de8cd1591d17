//! The CPU-proxy FIFO of the Host and HostNoAtomic modes (MSCCL++ `Fifo` / `ProxyTrigger`): device code pushes
//! 16-byte [`Trigger`]s into a ring in pinned host memory, and the host's proxy thread pops them in order and
//! posts the work through the NIC's host path.
//!
//! Protocol (indices are 64-bit counts of triggers):
//! - A pusher takes index `i` with a compare-and-swap of `head` (device memory) from `i` to `i + 1`, and only
//!   while `i < tail + size` (checked by `tail_cache`, and by `tail` only when the cache says the ring is full),
//!   so that a push that gives up has taken no index and leaves no hole. It then stores the trigger in slot
//!   `i % size`: word 0, then word 1 (which holds [`Trigger::VALID`]) with release order, so that a word 1 with
//!   the valid bit means the whole trigger and everything the pusher stored before it are visible.
//! - The proxy waits for the valid bit in slot `tail % size`, executes the trigger, zeroes the slot, and stores
//!   `tail + 1` to `tail` with release order. A trigger with [`Trigger::FLUSH`] is counted in `tail` only once
//!   every WQE the proxy posted for that QP has completed, so a pusher that waits for `tail > i` after pushing
//!   a flush at `i` knows its puts are placed (MSCCL++ `FifoDeviceHandle::sync`).

use bytemuck::{Pod, Zeroable};

/// One request from device code to the proxy: 16 bytes, 16-byte aligned, two host-order words (MSCCL++
/// `ProxyTrigger`'s `fst`/`snd`, with a layout of our own).
///
/// | word | bits | field |
/// |---|---|---|
/// | 0 | 0..32 | `size`: bytes to put (`PUT`), 0 otherwise |
/// | 0 | 32..64 | `src_offset`: byte offset in the channel's local memory (`PUT`) |
/// | 0 | 0..64 | the addend, for `ACCUMULATE` (which carries no `PUT`) |
/// | 1 | 0..32 | `dst_offset`: byte offset in the peer's memory (`PUT`, `ACCUMULATE`) |
/// | 1 | 32..48 | channel id (the proxy's number of the channel) |
/// | 1 | 48..56 | operation bits: [`Trigger::PUT`], [`Trigger::SIGNAL`], [`Trigger::FLUSH`], [`Trigger::ACCUMULATE`] |
/// | 1 | 63 | [`Trigger::VALID`] |
///
/// Operations of one trigger run in the order put, signal, flush.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
#[repr(C, align(16))]
pub struct Trigger(pub [u64; 2]);

const _: () = assert!(core::mem::size_of::<Trigger>() == 16);

impl Trigger {
    /// RDMA WRITE of `size` bytes from `src_offset` to `dst_offset`.
    pub const PUT: u8 = 1;
    /// Advance the peer's inbound semaphore by 1 (Host: RDMA fetch-add; HostNoAtomic: RDMA WRITE of the new
    /// value), after the puts before it.
    pub const SIGNAL: u8 = 2;
    /// Report in `tail` only after every WQE of the channel's QP has completed.
    pub const FLUSH: u8 = 4;
    /// RDMA fetch-add of word 0 on the 8-byte word at `dst_offset` of the peer's memory.
    pub const ACCUMULATE: u8 = 8;
    /// Bit 63 of word 1: the slot holds a trigger.
    pub const VALID: u64 = 1 << 63;
    /// Largest `size`, `src_offset` and `dst_offset`: 32 bits each; device code splits longer puts.
    pub const MAX_FIELD: u64 = u32::MAX as u64;

    /// A trigger of operations `ops` on channel `channel`. Offsets and size must fit 32 bits.
    #[inline(always)]
    pub const fn new(ops: u8, channel: u16, dst_offset: u64, src_offset: u64, size: u64) -> Self {
        Self::with_word0(ops, channel, dst_offset, (src_offset << 32) | size)
    }

    /// An `ACCUMULATE` of `add` on the word at `dst_offset` of channel `channel`'s peer memory.
    #[inline(always)]
    pub const fn accumulate(channel: u16, dst_offset: u64, add: u64) -> Self {
        Self::with_word0(Self::ACCUMULATE, channel, dst_offset, add)
    }

    #[inline(always)]
    const fn with_word0(ops: u8, channel: u16, dst_offset: u64, w0: u64) -> Self {
        Self([w0, Self::VALID | (ops as u64) << 48 | (channel as u64) << 32 | (dst_offset & Self::MAX_FIELD)])
    }

    /// The operation bits.
    pub const fn ops(&self) -> u8 {
        (self.0[1] >> 48) as u8
    }

    /// The channel id.
    pub const fn channel(&self) -> u16 {
        (self.0[1] >> 32) as u16
    }

    /// Bytes to put.
    pub const fn size(&self) -> u64 {
        self.0[0] & Self::MAX_FIELD
    }

    /// Offset in the local memory.
    pub const fn src_offset(&self) -> u64 {
        self.0[0] >> 32
    }

    /// Offset in the peer's memory.
    pub const fn dst_offset(&self) -> u64 {
        self.0[1] & Self::MAX_FIELD
    }

    /// The addend of an `ACCUMULATE`.
    pub const fn addend(&self) -> u64 {
        self.0[0]
    }

    /// Whether word 1 carries the valid bit.
    pub const fn is_valid(&self) -> bool {
        self.0[1] & Self::VALID != 0
    }
}

/// A proxy FIFO as device code uses it (MSCCL++ `FifoDeviceHandle`): 40 bytes, 8-byte aligned.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
#[repr(C)]
pub struct FifoHandle {
    /// Address of the ring of `size` [`Trigger`]s (pinned host memory mapped into the GPU), 16-byte aligned.
    pub triggers: u64,
    /// Address of the 64-bit push counter (device memory): indices taken so far.
    pub head: u64,
    /// Address of the 64-bit pop counter the proxy advances (pinned host memory): triggers done so far.
    pub tail: u64,
    /// Address of a 64-bit copy of `tail` in device memory (a lower bound of it, raised by pushers), so that
    /// pushes read the host's counter only when the ring looks full.
    pub tail_cache: u64,
    /// Slots in the ring (a power of two).
    pub size: u32,
    /// Zero.
    pub pad: u32,
}

const _: () = assert!(core::mem::size_of::<FifoHandle>() == 40);

/// Values of [`PortChannelHandle::proxy`](crate::channel::PortChannelHandle::proxy): who posts the channel's
/// WQEs.
pub mod mode {
    /// Device code itself (Device mode).
    pub const DEVICE: u32 = 0;
    /// The proxy, signals by RDMA fetch-add (MSCCL++ `Host`).
    pub const HOST: u32 = 1;
    /// The proxy, signals by RDMA WRITE of the new semaphore value (MSCCL++ `HostNoAtomic`).
    pub const HOST_NO_ATOMIC: u32 = 2;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trigger_fields_round_trip_at_their_bits() {
        let t = Trigger::new(Trigger::PUT | Trigger::SIGNAL, 0x1234, 0xdead_beef, 0x0102_0304, 0xffff_fffe);
        assert_eq!(t.0, [0x0102_0304_ffff_fffe, 1 << 63 | 3 << 48 | 0x1234 << 32 | 0xdead_beef]);
        assert_eq!(
            (t.ops(), t.channel(), t.dst_offset(), t.src_offset(), t.size()),
            (3, 0x1234, 0xdead_beef, 0x0102_0304, 0xffff_fffe)
        );
        assert!(t.is_valid() && !Trigger::default().is_valid());
        let a = Trigger::accumulate(7, 64, u64::MAX - 1);
        assert_eq!((a.ops(), a.channel(), a.dst_offset(), a.addend()), (Trigger::ACCUMULATE, 7, 64, u64::MAX - 1));
    }
}
