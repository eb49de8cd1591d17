//! LL ("low latency") packets, MSCCL++'s LL protocol (`LL16Packet`, `LL8Packet` in
//! `include/mscclpp/packet_device.hpp`): data words interleaved with flag words, so that a receiver that sees
//! the flag it expects in a packet also sees that packet's data, with no separate signal.
//!
//! The protocol rests on one fact of the writers (MSCCL++ states it as "data is written with an atomicity of
//! 8 bytes (IB/RDMA)"): an aligned 8-byte word is placed whole, never torn. So every 8-byte word of a packet
//! holds 4 bytes of data next to a 4-byte flag, and a reader that checks the flag of each word has that word's
//! data. The flag a round writes must differ from whatever an earlier round left in the buffer (MSCCL++ passes
//! a round number; zero-filled memory never matches a nonzero flag), so buffers need no reset between rounds.
//!
//! Both layouts are little-endian on every target gdaki builds for (x86_64, aarch64, nvptx64): packet word
//! `w` (8 bytes) is `data | flag << 32`.

use bytemuck::{Pod, Zeroable};

/// A 16-byte LL packet: 8 data bytes in two 4-byte words, each followed by its copy of the flag (MSCCL++
/// `LL16Packet`, alias `LLPacket`). 16 bytes, 16-byte aligned; twice the data on the wire.
///
/// Bytes 0..4 of the data go to `data1`, bytes 4..8 to `data2`. A writer stores each 8-byte half
/// (`data1, flag1` and `data2, flag2`) with one store (or the whole packet with one 16-byte vector store); a
/// reader accepts the packet when both flags hold the round's flag.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
#[repr(C, align(16))]
pub struct LL16Packet {
    /// Data bytes 0..4 (host order).
    pub data1: u32,
    /// The round's flag (nonzero).
    pub flag1: u32,
    /// Data bytes 4..8 (host order).
    pub data2: u32,
    /// The round's flag again: the second 8-byte half is placed on its own.
    pub flag2: u32,
}

/// An 8-byte LL packet: 4 data bytes and the flag (MSCCL++ `LL8Packet`). 8 bytes, 8-byte aligned; twice the
/// data on the wire, half the data per packet of [`LL16Packet`], one word per packet to check.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
#[repr(C, align(8))]
pub struct LL8Packet {
    /// Data bytes 0..4 (host order).
    pub data: u32,
    /// The round's flag (nonzero).
    pub flag: u32,
}

const _: () = {
    use core::mem::{align_of, offset_of, size_of};
    assert!(size_of::<LL16Packet>() == 16 && align_of::<LL16Packet>() == 16);
    assert!(offset_of!(LL16Packet, flag1) == 4 && offset_of!(LL16Packet, data2) == 8);
    assert!(offset_of!(LL16Packet, flag2) == 12);
    assert!(size_of::<LL8Packet>() == 8 && align_of::<LL8Packet>() == 8);
    assert!(offset_of!(LL8Packet, flag) == 4);
};
