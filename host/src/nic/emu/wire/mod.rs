//! The wire: RC transport between emulated NICs in different processes or hosts, over TCP; between processes
//! of one host, a WRITE from GPU memory may leave its bytes behind and have the responder copy them out of a
//! mapping of the requester's allocation ([`WireConfig::gpu_ipc`]).
//!
//! Two connected QPs on different [`EmuNic`](super::EmuNic)s share one TCP connection (a [`Link`]); the QP with
//! the smaller `(nic, qpn)` dials the other NIC's listener ([`acceptor`]), says hello, and both ends then carry requests
//! (RDMA WRITE, READ, atomics) one way and responses (ACK, NAK with syndrome, READ response, atomic response)
//! the other, as the [`packet`]s of an InfiniBand RC connection. Reader threads only frame bytes; everything
//! that touches memory, CQEs or QP state runs on the NIC's executor thread ([`requester`], [`responder`]),
//! so the single-writer rules of the in-process path hold unchanged.
//!
//! Faults map as on hardware: a responder that refuses a request answers with a NAK, which becomes the
//! requester's error CQE (0x13 remote access, 0x12 remote invalid request); a peer whose connection breaks
//! (process killed, host gone), that does not answer within [`WireConfig::retry_timeout`], that takes none of
//! this NIC's bytes for that long (it stopped reading), or that stops for that long in the middle of a frame (a
//! half-open connection) fails the oldest outstanding WQE with 0x15 (transport retry exceeded) and flushes the
//! rest with 0x05; [`Qp::wire_error`](super::Qp::wire_error) tells which, naming the peer QP and its address.
//!
//! Memory stays bounded whatever a peer sends: the reader threads queue at most
//! [`WireConfig::inbound_bytes`] for the executor and otherwise leave the bytes in the socket (TCP
//! backpressure); each QP's outbox holds about [`requester::OUTBOX_HIGH`] bytes at most, and its responder at
//! most [`packet::MAX_RD_ATOMIC`] unanswered READs and atomics, and takes at most
//! [`responder::MAX_OFFERS`] allocations offered for mapping. [`link`] explains why none of these waits can
//! deadlock.

pub(crate) mod acceptor;
pub(crate) mod link;
pub(crate) mod packet;
pub(crate) mod requester;
mod responder;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

pub(crate) use link::{Inbound, Link};
pub(crate) use requester::WireSq;

/// How an emulated NIC reaches peers in other processes or hosts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WireConfig {
    /// Address the NIC listens on for its peers' connections. Port 0 picks a free port;
    /// [`EmuNic::wire_addr`](super::EmuNic::wire_addr) tells which. Loopback by default: bind a routable
    /// address only when peers are on other hosts.
    pub listen: SocketAddr,
    /// How long a requester waits for its peer without any progress (no connection yet, or no response to an
    /// outstanding request) before it fails the oldest outstanding WQE with syndrome 0x15 (transport retry
    /// exceeded): the emulator's `timeout` × `retry_cnt` of `ibv_modify_qp`. Also how long a peer may take to
    /// finish a frame it began, and to take any byte this NIC has for it, before its connection fails.
    pub retry_timeout: Duration,
    /// Most bytes of inbound frames the NIC's reader threads queue for its executor, each frame counted as its
    /// length plus 64 bytes; default [`WireConfig::INBOUND_BYTES`]. A reader whose frame does not fit waits,
    /// reading nothing more from its socket, so that a peer faster than this NIC is slowed down by TCP's flow
    /// control instead of growing this NIC's memory ([`Stats::inbound_waits`](super::Stats::inbound_waits)
    /// counts the waits). One frame is always taken into an empty queue, so any value works; small ones cost
    /// throughput.
    pub inbound_bytes: usize,
    /// Whether a WRITE from GPU memory to a peer NIC in another process on this host may skip TCP: the
    /// requester offers the peer the allocation its source lies in ([`GpuCopier::export`], CUDA IPC), the peer
    /// maps it ([`GpuCopier::import`], on a thread of its own, so that a driver call that waits cannot stall
    /// the NIC) and says so, and from then on such WRITEs carry the handle and offset instead of the bytes, and
    /// the responder copies them GPU to GPU, in the request's turn (the RC order stays). Until the peer has
    /// mapped it, or when it cannot (another host, a container apart, a copier without IPC), WRITEs go over
    /// TCP as before. Default `false`, until the CUDA copier's rule for copies out of a mapping (the engine
    /// warp up to 4 MiB, which made the path faster than TCP at every size measured with two processes on
    /// one H100) has run on a GPU in its final build; two GPUs are not measured (the guide's "Across
    /// processes and hosts: bootstrap and wire"). `cuIpcOpenMemHandle` does not wait for running kernels
    /// (measured), so turning it on cannot stall a NIC that kernels wait on. Programs built on the examples'
    /// flags read `GDAKI_WIRE_IPC=1` to turn it on.
    ///
    /// [`GpuCopier::export`]: crate::mem::GpuCopier::export
    /// [`GpuCopier::import`]: crate::mem::GpuCopier::import
    pub gpu_ipc: bool,
}

impl WireConfig {
    /// Default of [`WireConfig::retry_timeout`]: 4 s (about ConnectX's `timeout` = 18, 1.07 s, with
    /// `retry_cnt` = 3; NCCL uses longer ones).
    pub const DEFAULT_RETRY_TIMEOUT: Duration = Duration::from_secs(4);

    /// Longest [`WireConfig::retry_timeout`]: a day.
    pub const MAX_RETRY_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

    /// Shortest [`WireConfig::retry_timeout`]: 1 ms (a shorter one fails requests to a live peer before its
    /// answer can come over loopback TCP).
    pub const MIN_RETRY_TIMEOUT: Duration = Duration::from_millis(1);

    /// Default of [`WireConfig::inbound_bytes`]: 16 MiB (63 frames of the largest size, or some 150 000
    /// ACKs).
    pub const INBOUND_BYTES: usize = 16 << 20;

    /// Refuses what cannot work: an unspecified listening address (the NIC tells peers the address it listens
    /// on, and 0.0.0.0 would send them to themselves) and a retry timeout under [`Self::MIN_RETRY_TIMEOUT`] or
    /// over [`Self::MAX_RETRY_TIMEOUT`].
    pub(crate) fn check(&self) -> crate::Result<()> {
        if self.listen.ip().is_unspecified() {
            return Err(crate::Error::InvalidArgument(format!(
                "wire address {}: listen on a specific address (peers dial the address this NIC advertises)",
                self.listen
            )));
        }
        if self.retry_timeout < Self::MIN_RETRY_TIMEOUT {
            return Err(crate::Error::InvalidArgument(format!(
                "wire retry timeout {:?} is under {:?}: every request would fail (0x15) before a live peer could \
                 answer",
                self.retry_timeout,
                Self::MIN_RETRY_TIMEOUT
            )));
        }
        if self.retry_timeout > Self::MAX_RETRY_TIMEOUT {
            return Err(crate::Error::InvalidArgument(format!(
                "wire retry timeout {:?} is over {:?}",
                self.retry_timeout,
                Self::MAX_RETRY_TIMEOUT
            )));
        }
        Ok(())
    }

    /// Listens on `127.0.0.1`, on a free port, with the default retry timeout and inbound queue.
    pub fn loopback() -> Self {
        Self {
            listen: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0),
            retry_timeout: Self::DEFAULT_RETRY_TIMEOUT,
            inbound_bytes: Self::INBOUND_BYTES,
            gpu_ipc: false,
        }
    }
}
