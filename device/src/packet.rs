//! LL packets (MSCCL++'s LL protocol, `putPackets` / `getPackets` in `packet_device.hpp`) on a port channel:
//! data interleaved with flags ([`LL16Packet`], [`LL8Packet`]), sent with one RDMA WRITE and read by polling the
//! flags, so that the receiver needs no signal, no atomic and no CQE of the sender's.
//!
//! - [`Packets::write_packets`] turns data in the channel's local memory into packets carrying `flag`, in the
//!   same memory; each 8-byte packet word (4 data bytes, 4 flag bytes) is one store.
//! - [`PortChannel::put_packets`] writes packets and sends them with one [`PortChannel::put`] (so every
//!   posting path of the channel carries them).
//! - [`Packets::read_packets`] polls the flags of packets that the peer's put placed in this side's local
//!   memory (bounded by the channel's timeout), then copies the data out; [`PortChannel::read_packets`] does
//!   the same while watching the channel's QP, so that a dead peer ends the read with the QP's error CQE.
//!
//! A packet word is read whole (`ld.volatile` on nvptx, never a plain load that L1 could serve stale; a relaxed
//! atomic on the host), and the NIC places aligned 8-byte words whole, so a word whose flag matches holds the
//! data written with it: no fence, no semaphore. The cost is bytes: a packet carries as many flag bytes as data
//! bytes, so the wire moves twice the data.
//!
//! Flags: nonzero, and different in every round that uses a buffer (MSCCL++ passes a round counter), so that
//! neither zeroed memory nor a packet of an earlier round ever matches and buffers need no reset.
//!
//! Both calls split their packets over `threads` threads (packet `i` goes to thread `i % threads`), as
//! MSCCL++'s `threadId` / `numThreads`; one thread alone passes `0, 1`.

use crate::channel::{PortChannel, Sharing};
use crate::error::{Error, InvalidArgument, RangeError, Result, WaitOn};
use crate::sync;
use crate::wait::{bounded_watching, Watch};
use gdaki_shared::channel::PortChannelHandle;
use gdaki_shared::handle::MrHandle;
/// The packet layouts, re-exported so that a kernel crate names them from `gdaki_device` alone.
pub use gdaki_shared::packet::{LL16Packet, LL8Packet};

/// A packet layout: [`LL16Packet`] or [`LL8Packet`] (two real implementations).
pub trait Packet: bytemuck::Pod {
    /// The data one packet carries, as it lies in memory: `u64` (LL16) or `u32` (LL8), host order.
    type Data: bytemuck::Pod;

    /// Data bytes one packet carries: 8 (LL16) or 4 (LL8). Data offsets and lengths are multiples of it.
    const DATA: u64 = core::mem::size_of::<Self::Data>() as u64;

    /// The packet carrying `data` and `flag`.
    fn new(data: Self::Data, flag: u32) -> Self;

    /// Stores `v` at `p`, each 8-byte word with one store (LL16: one 16-byte vector store on nvptx).
    ///
    /// # Safety
    /// `p` must be valid for writes and aligned to the packet.
    unsafe fn store(p: *mut Self, v: Self);

    /// Loads the packet at `p` once: `Ok(data)` when every flag word holds `flag`, else `Err` with the first
    /// flag read that differs.
    ///
    /// # Safety
    /// `p` must be valid for reads and aligned to the packet.
    unsafe fn load(p: *const Self, flag: u32) -> core::result::Result<Self::Data, u32>;
}

impl Packet for LL16Packet {
    type Data = u64;

    #[inline(always)]
    fn new(data: u64, flag: u32) -> Self {
        Self { data1: data as u32, flag1: flag, data2: (data >> 32) as u32, flag2: flag }
    }

    #[inline(always)]
    unsafe fn store(p: *mut Self, v: Self) {
        // SAFETY: the caller's contract; 16 bytes, 16-byte aligned.
        unsafe { sync::store_words_v2_u64(p as *mut [u64; 2], bytemuck::cast(v)) }
    }

    #[inline(always)]
    unsafe fn load(p: *const Self, flag: u32) -> core::result::Result<u64, u32> {
        // SAFETY: the caller's contract; 16 bytes, 16-byte aligned.
        let v: Self = bytemuck::cast(unsafe { sync::load_words_v2_u64(p as *const [u64; 2]) });
        match (v.flag1 == flag, v.flag2 == flag) {
            (true, true) => Ok(v.data1 as u64 | (v.data2 as u64) << 32),
            (false, _) => Err(v.flag1),
            (true, false) => Err(v.flag2),
        }
    }
}

impl Packet for LL8Packet {
    type Data = u32;

    #[inline(always)]
    fn new(data: u32, flag: u32) -> Self {
        Self { data, flag }
    }

    #[inline(always)]
    unsafe fn store(p: *mut Self, v: Self) {
        // SAFETY: the caller's contract; 8 bytes, 8-byte aligned.
        unsafe { sync::store_word_u64(p as *mut u64, bytemuck::cast(v)) }
    }

    #[inline(always)]
    unsafe fn load(p: *const Self, flag: u32) -> core::result::Result<u32, u32> {
        // SAFETY: the caller's contract; 8 bytes, 8-byte aligned.
        let v: Self = bytemuck::cast(unsafe { sync::load_word_u64(p as *const u64) });
        if v.flag == flag {
            Ok(v.data)
        } else {
            Err(v.flag)
        }
    }
}

/// Bytes of the packets that carry `bytes` bytes of data: `2 × bytes` for both layouts; `u64::MAX` (more than
/// any memory holds) when that does not fit 64 bits.
#[inline(always)]
pub const fn packet_bytes<T: Packet>(bytes: u64) -> u64 {
    (bytes / T::DATA).saturating_mul(core::mem::size_of::<T>() as u64)
}

/// A channel's local memory (its `src` MR: what its `put` reads, and in MSCCL++'s one-to-one setup also where
/// the peer's put lands) as LL packets use it. Any number of threads may hold one at once, each working on its
/// own share of the packets.
#[derive(Clone, Copy, Debug)]
pub struct Packets<'h> {
    mem: &'h MrHandle,
    timeout_ns: u64,
}

impl<'h> Packets<'h> {
    /// Packets in `mem`, with reads bounded by `timeout_ns`.
    ///
    /// # Safety
    /// `mem.addr .. mem.addr + mem.length` must be valid for reads and writes by this thread for `'h` (device
    /// memory, or host memory for the `cpu` executor).
    pub unsafe fn new(mem: &'h MrHandle, timeout_ns: u64) -> Self {
        Self { mem, timeout_ns }
    }

    /// The local memory of channel `h` (`h.src`), reads bounded by the channel's timeout.
    ///
    /// # Safety
    /// `h` must be a live channel (see [`PortChannel::new`]).
    pub unsafe fn of(h: &'h PortChannelHandle) -> Self {
        // SAFETY: a live channel's local MR is valid for the channel's lifetime (caller's contract).
        unsafe { Self::new(&h.src, h.timeout_ns) }
    }

    /// The addresses of `bytes` bytes of data at `data_offset` and of their packets at `pkt_offset`, checked.
    fn ranges<T: Packet>(
        &self,
        data_offset: u64,
        pkt_offset: u64,
        bytes: u64,
        flag: u32,
        part: (u32, u32),
    ) -> Result<(u64, u64)> {
        if bytes == 0 {
            return Err(Error::InvalidArgument(InvalidArgument::Length));
        }
        let len = self.mem.length;
        let inside = |off: u64, n: u64| off.checked_add(n).is_some_and(|end| end <= len);
        let wire = packet_bytes::<T>(bytes);
        if !inside(data_offset, bytes) {
            return Err(RangeError::local(data_offset, bytes, len).into());
        }
        if !inside(pkt_offset, wire) {
            return Err(RangeError::local(pkt_offset, wire, len).into());
        }
        let (data, pkts) = (self.mem.addr + data_offset, self.mem.addr + pkt_offset);
        let size = core::mem::size_of::<T>() as u64;
        // Both inside the memory (checked above), so neither end overflows.
        let overlap = data_offset < pkt_offset + wire && pkt_offset < data_offset + bytes;
        if overlap
            || !bytes.is_multiple_of(T::DATA)
            || !data.is_multiple_of(T::DATA)
            || !pkts.is_multiple_of(size)
            || flag == 0
            || part.0 >= part.1
        {
            return Err(Error::InvalidArgument(InvalidArgument::Packet));
        }
        Ok((data, pkts))
    }

    /// Writes the packets of `bytes` bytes of data at `src_offset` of the local memory, each carrying `flag`,
    /// to `pkt_offset` of the same memory ([`packet_bytes`] bytes; MSCCL++ `putPackets` into a local buffer).
    /// This thread writes packets `thread, thread + threads, ...`. The two ranges must not overlap. Stores are
    /// unordered: a `put` of the packets (its release fence) or a barrier orders them.
    ///
    /// # Errors
    /// [`InvalidArgument::Length`] for 0 bytes, [`Error::Range`] for the data's or the packets' range outside
    /// the memory (local), [`InvalidArgument::Packet`] for a size, alignment, flag of 0 or thread
    /// index that breaks the layout, or data and packets that overlap. Nothing is written then.
    pub fn write_packets<T: Packet>(
        &self,
        pkt_offset: u64,
        src_offset: u64,
        bytes: u64,
        flag: u32,
        thread: u32,
        threads: u32,
    ) -> Result<()> {
        let (data, pkts) = self.ranges::<T>(src_offset, pkt_offset, bytes, flag, (thread, threads))?;
        Self::store::<T>(data, pkts, bytes, flag, thread, threads);
        Ok(())
    }

    /// Writes this thread's share (packets `thread, thread + threads, ...`) of the packets of `bytes` bytes of
    /// data at address `data` to address `pkts`, each carrying `flag`: [`Packets::write_packets`] once
    /// [`Packets::ranges`] has checked its arguments and made the addresses.
    fn store<T: Packet>(data: u64, pkts: u64, bytes: u64, flag: u32, thread: u32, threads: u32) {
        let mut i = thread as u64;
        while i < bytes / T::DATA {
            // SAFETY: packet `i` and its data lie inside the local memory, aligned (checked by `ranges`); the
            // data is local memory no NIC writes meanwhile (the caller's buffer).
            unsafe {
                let d = (data as *const T::Data).add(i as usize).read_volatile();
                T::store((pkts as *mut T).add(i as usize), T::new(d, flag));
            }
            i += threads as u64;
        }
    }

    /// Waits until the packets at `pkt_offset` of the local memory that carry `bytes` bytes of data all hold
    /// `flag`, and copies their data to `dst_offset` of the same memory (MSCCL++ `getPackets`). This thread
    /// reads packets `thread, thread + threads, ...`; the wait is bounded by the timeout for the whole share.
    /// It knows nothing of the peer: [`PortChannel::read_packets`] also ends when the channel's QP fails.
    ///
    /// # Errors
    /// [`Error::Timeout`] with [`WaitOn::Packet`] (the first packet still without `flag`, and the flag it
    /// held) when the share is not complete within the timeout; [`Error::InvalidArgument`] and
    /// [`Error::Range`] as [`Packets::write_packets`], nothing read then.
    pub fn read_packets<T: Packet>(
        &self,
        dst_offset: u64,
        pkt_offset: u64,
        bytes: u64,
        flag: u32,
        thread: u32,
        threads: u32,
    ) -> Result<()> {
        self.read_watching::<T>(dst_offset, pkt_offset, bytes, flag, (thread, threads), |_| Ok(()))
    }

    /// [`Packets::read_packets`] of this thread's share `part` (`thread, threads`), calling `watch` on each try
    /// ([`bounded_watching`]'s schedule): an error it returns ends the read.
    fn read_watching<T: Packet>(
        &self,
        dst_offset: u64,
        pkt_offset: u64,
        bytes: u64,
        flag: u32,
        part: (u32, u32),
        mut watch: impl FnMut(Watch) -> Result<()>,
    ) -> Result<()> {
        let (thread, threads) = part;
        let (data, pkts) = self.ranges::<T>(dst_offset, pkt_offset, bytes, flag, part)?;
        let n = bytes / T::DATA;
        let next = core::cell::Cell::new(thread as u64);
        let seen = core::cell::Cell::new(0u32);
        bounded_watching(
            self.timeout_ns,
            |w| {
                let mut i = next.get();
                while i < n {
                    // SAFETY: packet `i` and its data slot lie inside the local memory, aligned (checked by
                    // `ranges`); the packet may be written by the NIC meanwhile, which `load` allows.
                    unsafe {
                        match T::load((pkts as *const T).add(i as usize), flag) {
                            Ok(d) => (data as *mut T::Data).add(i as usize).write_volatile(d),
                            Err(f) => {
                                next.set(i);
                                seen.set(f);
                                watch(w)?;
                                return Ok(None);
                            }
                        }
                    }
                    i += threads as u64;
                }
                Ok(Some(()))
            },
            || WaitOn::Packet { addr: pkts + next.get() * core::mem::size_of::<T>() as u64, flag, seen: seen.get() },
        )
    }
}

impl<'h, M: Sharing> PortChannel<'h, M> {
    /// The channel's local memory as packets see it ([`Packets::of`]).
    pub fn packets(&self) -> Packets<'h> {
        // SAFETY: the channel is live (contract of `PortChannel::new`).
        unsafe { Packets::of(self.handle()) }
    }

    /// [`Packets::read_packets`] on the channel's local memory, watching the channel's QP as
    /// [`PortChannel::wait`] does: when the peer dies with this side's puts outstanding, their error CQE (0x15,
    /// transport retry exceeded, after the transport's retries) ends the read rather than the channel's timeout.
    /// The other threads of a team may read their shares with [`PortChannel::packets`]; one of them watching is
    /// enough for the team to learn of the error.
    ///
    /// # Errors
    /// As [`Packets::read_packets`]; [`Error::Cqe`] with the QP's first error CQE (in the Host modes, the
    /// proxy's); [`Error::PeerGone`] once the packets are late and the host has marked the peer gone.
    pub fn read_packets<T: Packet>(
        &mut self,
        dst_offset: u64,
        pkt_offset: u64,
        bytes: u64,
        flag: u32,
        thread: u32,
        threads: u32,
    ) -> Result<()> {
        self.ring_staged();
        let packets = self.packets();
        packets.read_watching::<T>(dst_offset, pkt_offset, bytes, flag, (thread, threads), |w| self.watch(w))
    }

    /// Writes this thread's share of the packets of `bytes` bytes at `src_offset` (flag `flag`) to
    /// `pkt_offset` of the local memory ([`Packets::write_packets`]), then puts all the packets
    /// ([`packet_bytes`] bytes) to `dst_offset` of the peer's memory with one [`PortChannel::put`]. The other
    /// `threads - 1` threads must have written their shares before (and a barrier ordered them before this
    /// call); one thread alone passes `0, 1`. The peer reads them with [`Packets::read_packets`] at
    /// `dst_offset` of its local memory, with no signal; [`PortChannel::flush`] before rewriting the packets
    /// (or learn from the peer's answer that they arrived).
    ///
    /// # Errors
    /// As [`Packets::write_packets`] (the local ranges are checked first) and [`PortChannel::put`];
    /// [`InvalidArgument::Packet`] for a `dst_offset` whose address in the peer's memory is not a multiple of
    /// the packet size (the peer's reads could never find the packets there); in the Host modes
    /// [`InvalidArgument::Unsupported`] for packets past 4 GiB of either memory (triggers carry 32-bit offsets)
    /// and [`InvalidArgument::Handle`] for a channel id past 16 bits. Nothing is written or posted for any of
    /// these.
    #[allow(clippy::too_many_arguments)]
    pub fn put_packets<T: Packet>(
        &mut self,
        dst_offset: u64,
        pkt_offset: u64,
        src_offset: u64,
        bytes: u64,
        flag: u32,
        thread: u32,
        threads: u32,
    ) -> Result<()> {
        let packets = self.packets();
        let (data, pkts) = packets.ranges::<T>(src_offset, pkt_offset, bytes, flag, (thread, threads))?;
        let (wire, dst) = (packet_bytes::<T>(bytes), &self.handle().dst);
        let at = crate::onesided::remote(dst, dst_offset, wire)?;
        if !at.addr.is_multiple_of(core::mem::size_of::<T>() as u64) {
            return Err(Error::InvalidArgument(InvalidArgument::Packet));
        }
        if self.proxied() {
            // What the put's triggers cannot carry is refused before a packet is written, as a bad range is.
            self.proxy_put(dst_offset, pkt_offset, wire)?;
        }
        Packets::store::<T>(data, pkts, bytes, flag, thread, threads);
        self.put(dst_offset, pkt_offset, wire)
    }
}
