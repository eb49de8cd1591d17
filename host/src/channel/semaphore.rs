//! Port-channel semaphores (MSCCL++ `Semaphore` / `Host2DeviceSemaphore`): an inbound word that the peer
//! advances through the connection (RDMA fetch-adds; in HostNoAtomic, RDMA WRITEs of the new count), and the
//! count this side expects.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use gdaki_shared::handle::RemoteMr;

use crate::exec::DataBuf;
use crate::nic::Mr;
use crate::Result;

use super::connection::Connection;
use super::memory::{addr_of, read_words};

/// Bytes of the expected-count buffer.
pub(super) const EXPECTED_BYTES: usize = 8;

/// One side of a semaphore pair on a [`Connection`], made by
/// [`Communicator::semaphore`](super::Communicator::semaphore).
///
/// | word | size | where | who writes it |
/// |---|---|---|---|
/// | inbound | 8 B, 8-aligned, host-order `u64`, initially 0 | GPU memory (`gpu`: `wait` polls it there, as MSCCL++ keeps its semaphores), host memory (`cpu`), registered `LOCAL_WRITE \| REMOTE_WRITE \| REMOTE_ATOMIC` | the peer's `signal` (RDMA fetch-add of 1; in HostNoAtomic, the peer's proxy's RDMA WRITE of the new count) |
/// | expected | 8 B, 8-aligned, initially 0 | GPU memory (`gpu`), host memory (`cpu`) | this side's `wait` (adds 1, then waits until inbound reaches it) |
///
/// It also knows the peer's inbound word ([`remote_inbound`](Self::remote_inbound)), which this side's
/// `signal` advances through the connection's QP. Cloning is cheap and shares the words; the connection
/// lives as long as its semaphores. The inbound MR is deregistered before the words are freed, when the last
/// clone goes; a peer that signals after that gets a remote access error.
#[derive(Clone, Debug)]
pub struct Semaphore {
    pub(super) inner: Arc<SemInner>,
}

/// Field order is drop order: the MR before the word it covers.
#[derive(Debug)]
pub(super) struct SemInner {
    pub(super) inbound_mr: Mr,
    pub(super) conn: Connection,
    pub(super) remote_inbound: RemoteMr,
    /// The inbound word, at offset 0.
    pub(super) inbound: DataBuf,
    /// The expected count, at offset 0.
    pub(super) expected: DataBuf,
    /// HostNoAtomic: how many signals this side has sent, the value the proxy writes to the peer's inbound
    /// word with the next one. The semaphore's own (a new semaphore counts from 0, as its peer's word does),
    /// shared by the channels on it through the proxy's registrations.
    pub(super) proxy_count: Arc<AtomicU64>,
}

impl Semaphore {
    /// The connection whose QP carries this semaphore's signals.
    pub fn connection(&self) -> &Connection {
        &self.inner.conn
    }

    /// The peer's rank.
    pub fn peer(&self) -> u32 {
        self.inner.conn.peer()
    }

    /// Device-visible address of this side's inbound word: a
    /// [`PortChannelHandle`](gdaki_shared::channel::PortChannelHandle)'s `local_sem`. Device code reads it with
    /// acquire (or volatile) loads.
    pub fn inbound_addr(&self) -> u64 {
        // The MR is at the word's device address (`queue_loc`).
        self.inner.inbound_mr.loc().addr
    }

    /// Device-visible address of the expected count: a
    /// [`PortChannelHandle`](gdaki_shared::channel::PortChannelHandle)'s `expected`.
    pub fn expected_addr(&self) -> u64 {
        addr_of(&self.inner.expected, 0)
    }

    /// The peer's inbound word (8 bytes, rkey big-endian): a
    /// [`PortChannelHandle`](gdaki_shared::channel::PortChannelHandle)'s `remote_sem`.
    pub fn remote_inbound(&self) -> RemoteMr {
        self.inner.remote_inbound
    }

    /// The inbound word's current value: how many times the peer has signalled (MSCCL++ reads it with
    /// `semaphore.load()` on the device). Copied from GPU memory on `gpu`; on `cpu` byte loads, so a value
    /// being written may be seen torn: read it once signals have stopped.
    ///
    /// # Errors
    /// The CUDA driver's error copying it.
    pub fn inbound(&self) -> Result<u64> {
        Ok(bytemuck::pod_read_unaligned(&read_words(&self.inner.inbound, 0, 8)?))
    }

    /// The expected count as device code left it (copied from GPU memory on `gpu`).
    ///
    /// # Errors
    /// The CUDA driver's error copying it.
    pub fn expected(&self) -> Result<u64> {
        let b = read_words(&self.inner.expected, 0, 8)?;
        Ok(bytemuck::pod_read_unaligned(&b))
    }
}
