//! Port channels (MSCCL++'s `PortChannel`): what the host builds so that device code can `put`, `signal`,
//! `flush` and `wait` on a connection. In Device mode (MSCCL++'s GPUNetIO backend) device code posts the WQEs
//! itself, with no proxy thread; in the Host modes the handle also names the CPU proxy's FIFO
//! ([`PortChannelHandle::fifo`]), and device code pushes triggers there instead.
//!
//! A channel names a QP (shared by any number of channels), the peer's memory and the local memory it moves
//! data between, the peer's inbound semaphore it signals and its own inbound semaphore it waits on. Device code
//! uses it in one of four sharing modes: `Exclusive` (one thread owns the QP), `Warp` (the lanes of one warp
//! post together), `Block` (the threads of one CTA share the QP) and `Device` (any thread of the grid). Every mode
//! keeps the QP's counters in the one [`SqState`](crate::handle::SqState) of its
//! [`QpHandle`](crate::handle::QpHandle), so channels of one connection may use different modes, kernel after kernel.

use crate::handle::{MrHandle, RemoteMr};
use crate::proxy::FifoHandle;
use bytemuck::{Pod, Zeroable};

/// One port channel as device code uses it (MSCCL++ `PortChannelDeviceHandle`). 216 bytes,
/// 8-byte aligned; built by the host's `PortChannel::device_handle`.
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
#[repr(C)]
pub struct PortChannelHandle {
    /// Address of the QP's [`QpHandle`](crate::handle::QpHandle) (ring, dbrec, doorbell register, CQ and the
    /// send-queue state every scope updates).
    pub qp: u64,
    /// The peer's memory that `put` writes into (`dst_offset` counts from its start).
    pub dst: RemoteMr,
    /// The local memory that `put` reads from (`src_offset` counts from its start).
    pub src: MrHandle,
    /// The peer's inbound semaphore for this channel: one 8-byte host-order word, advanced by `signal` with
    /// an RDMA fetch-add of 1 (host-endian atomics: the emulated NIC's, and ConnectX's in the mode mlx5_core
    /// enables), or in HostNoAtomic by the proxy's RDMA WRITE of the new count.
    pub remote_sem: RemoteMr,
    /// Address of this side's inbound semaphore (the word the peer's `signal` advances), 8-byte aligned.
    pub local_sem: u64,
    /// Address of this side's expected inbound count (8 bytes, device memory): `wait` adds 1 and waits until
    /// the inbound semaphore reaches it (MSCCL++ `expectedInboundSemaphore`).
    pub expected: u64,
    /// The QP's atomic scratch word (8 bytes, 8-byte aligned, `LOCAL_WRITE`): where fetch-add results land,
    /// so that they never overwrite user data. Shared by the QP's channels; nobody reads it.
    pub scratch: MrHandle,
    /// Largest payload of one RDMA WRITE, bytes: longer puts are split (at most 2^31, mlx5's `max_msg_sz`).
    pub max_wqe_bytes: u64,
    /// Bound of every device-side wait, ns.
    pub timeout_ns: u64,
    /// Puts of up to this many bytes ring by BlueFlame in Device mode with Exclusive sharing (default
    /// 512 KiB): their last WQE's one WQEBB is written to the BlueFlame register (the payload is read from
    /// memory as for any WRITE). A signal or an accumulate counts as its 8 bytes, so 0 means no BlueFlame at
    /// all. Unused by Block and Device sharing and by the proxy.
    pub blue_flame_limit: u64,
    /// The proxy's FIFO (Host and HostNoAtomic modes; all zero in Device mode).
    pub fifo: FifoHandle,
    /// Address of the proxy's sticky error word for this channel's QP (8 bytes, pinned host memory): 0 while
    /// no WQE the proxy posted has failed, else `(1 << 24 | qpn) << 32 |` the packed error CQE (`syndrome << 24
    /// | vendor_err_synd << 16 | wqe_counter`), `qpn` the proxy's QP's number. 0 in Device mode.
    pub proxy_err: u64,
    /// Address of the word that says whether the peer is gone (8 bytes, 8-byte aligned, host memory mapped
    /// for device code; 0: not watched): once the bootstrap session reports that the peer left (its goodbye)
    /// and a grace period has passed for what it sent before to land, the host writes the peer's rank plus one
    /// there; once the session broke (a rank or the root died, or a collective failed: every peer is lost to
    /// the session, alive or not), the same with [`DEPARTED_BROKEN`] set. A wait for the peer that is late
    /// reads it, and ends with `PeerGone` instead of waiting out its timeout (NCCL's abort flag, per peer).
    pub departed: u64,
    /// Who posts this channel's WQEs: one of [`crate::proxy::mode`].
    pub proxy: u32,
    /// The proxy's number of this channel, carried by its triggers in 16 bits (device code refuses a larger
    /// one with `InvalidArgument::Handle` rather than cut it).
    pub channel_id: u32,
    /// The peer's rank plus one, so that a channel's wait that runs out names the rank it waited for; 0 when
    /// the handle's builder did not say (a hand-made handle: the timeout then names the semaphore's address).
    /// See [`PortChannelHandle::peer`].
    pub peer_plus_one: u32,
    /// Zero: keeps the handle a multiple of 8 bytes.
    pub pad: u32,
}

/// The bit of a [`PortChannelHandle::departed`] word that says the peer was marked because the bootstrap
/// session broke, not because the peer left; the low 32 bits hold the peer's rank plus one either way.
pub const DEPARTED_BROKEN: u64 = 1 << 32;

impl PortChannelHandle {
    /// The peer's rank, when the handle's builder recorded it ([`PortChannelHandle::peer_plus_one`]).
    pub const fn peer(&self) -> Option<u32> {
        self.peer_plus_one.checked_sub(1)
    }
}

const _: () = assert!(core::mem::size_of::<PortChannelHandle>() == 216);
