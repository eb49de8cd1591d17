//! A connection (MSCCL++ `Connection`, IB transport): one RC QP to one peer, with what device code needs to
//! post to it from any scope.

use std::sync::Arc;

use gdaki_shared::handle::{MrHandle, QpHandle};

use crate::exec::DataBuf;
use crate::nic::{Cq, Endpoint, Mr, Qp};
use crate::proxy::service::{ProxyQp, QpUse};
use crate::proxy::ProxyService;
use crate::Result;

use super::config::EndpointConfig;
use super::memory::{addr_of, read_words};
use super::resources::Resources;

/// Byte offset of the [`QpHandle`] in a connection's state buffer (64-byte aligned, so that its send-queue
/// state at byte 128 has a cache line of its own: the buffer is 4096-aligned on `cpu`, 256-aligned on `gpu`).
pub(super) const QP_HANDLE_OFF: usize = 0;
/// Bytes of the state buffer.
pub(super) const STATE_BYTES: usize = 256;

const _: () = assert!(QP_HANDLE_OFF.is_multiple_of(64) && QP_HANDLE_OFF + size_of::<QpHandle>() <= STATE_BYTES);

/// A connected RC QP to one peer, made by [`Communicator::connect`](super::Communicator::connect) (MSCCL++
/// `Connection`). Any number of [`PortChannel`](super::PortChannel)s and
/// [`Semaphore`](super::Semaphore)s may use it; each `connect` makes another one (multi-QP).
///
/// It owns, besides the QP and its CQ (the PD is the communicator's):
///
/// | what | size | where |
/// |---|---|---|
/// | the QP's [`QpHandle`] (ring, dbrec, doorbell register, CQ; the send-queue state every sharing mode keeps, at byte 128) | 256 B, 64-aligned | GPU memory (`gpu`), host memory (`cpu`): device code updates it on every post |
/// | the atomic scratch word: where every fetch-add's old value lands, registered `LOCAL_WRITE` | 8 B, 8-aligned | GPU memory (`gpu`), host memory (`cpu`): only the NIC writes it, and a fetch-add into GPU memory needs no PCIe round trip |
///
/// Cloning is cheap and shares the QP. The last clone to go (channels and semaphores hold one) destroys the
/// QP: the scratch MR is deregistered, the QP destroyed (synchronously with the NIC: no WQE of it runs
/// afterwards), then the memory is freed. Device code must have stopped using the connection's handles by
/// then; on `gpu`, freeing the state buffer waits for running kernels.
///
/// In the Host modes, once a [`PortChannel`](super::PortChannel) has been made on it, the communicator's proxy
/// holds the connection too, and the destruction happens on the proxy's thread soon after the last clone goes,
/// when the proxy lets go: once it has done every trigger pushed for the connection's channels before they were
/// dropped, and the WQEs it posted on the QP have completed (or one failed). The proxy then polls the QP no more;
/// a peer's later WQEs on its end fail (on the emulated NIC with syndrome 0x15, transport retry exceeded).
/// [`ProxyService::qps`] counts the QPs the proxy still holds. A connection of which a clone lives keeps its QP
/// with the proxy even with no channel on it, so channels made on it later go on where the others left off.
#[derive(Clone, Debug)]
pub struct Connection {
    /// The communicator's proxy, in the Host modes (held here, not in `ConnInner`, which the proxy keeps
    /// alive while it serves the QP: no cycle). Declared first so that it is dropped first: when the last
    /// clone's goes, the proxy is told while `inner`, whose address names the QP to it, is still alive.
    pub(super) proxy: Option<Arc<QpUse>>,
    pub(super) inner: Arc<ConnInner>,
}

/// Field order is drop order: the MR, then the QP (after which the NIC touches nothing), then memory.
#[derive(Debug)]
pub(super) struct ConnInner {
    pub(super) scratch_mr: Mr,
    pub(super) qp: Qp,
    pub(super) cq: Cq,
    /// The [`QpHandle`] at [`QP_HANDLE_OFF`].
    pub(super) state: DataBuf,
    /// The atomic scratch word, at offset 0.
    pub(super) scratch: DataBuf,
    pub(super) peer: u32,
    pub(super) tag: u32,
    pub(super) config: EndpointConfig,
    pub(super) remote: Endpoint,
    pub(super) res: Arc<Resources>,
}

impl Connection {
    /// The peer's rank (MSCCL++ `remoteRank()`).
    pub fn peer(&self) -> u32 {
        self.inner.peer
    }

    /// The device address of the word that says whether the peer is gone
    /// ([`PortChannelHandle::departed`](gdaki_shared::channel::PortChannelHandle::departed)).
    pub fn departed_addr(&self) -> u64 {
        self.inner.res.departed.addr(self.inner.peer)
    }

    /// The tag it was connected with (MSCCL++ `tag()`).
    pub fn tag(&self) -> u32 {
        self.inner.tag
    }

    /// The configuration it was made with.
    pub fn config(&self) -> &EndpointConfig {
        &self.inner.config
    }

    /// This side's QP number.
    pub fn qpn(&self) -> u32 {
        self.inner.qp.qpn()
    }

    /// The peer QP's endpoint (its NIC, QPN, first PSN, wire address).
    pub fn remote_endpoint(&self) -> Endpoint {
        self.inner.remote
    }

    /// The QP (state; [`Qp::as_emu`] for the emulated NIC's WQEBBs consumed).
    pub fn qp(&self) -> &Qp {
        &self.inner.qp
    }

    /// The QP's send CQ.
    pub fn cq(&self) -> &Cq {
        &self.inner.cq
    }

    /// Device-visible address of the QP's [`QpHandle`] (8-byte aligned; GPU memory on `gpu`, host memory on
    /// `cpu`): a [`PortChannelHandle`](gdaki_shared::channel::PortChannelHandle)'s `qp`. A kernel takes it as
    /// `*mut QpHandle` (launched as a `DevPtr<QpHandle>` of this address); in Exclusive scope one thread at a
    /// time makes its `&mut QpHandle` of it for a device `Qp`, the shared scopes use the pointer.
    /// Every sharing mode keeps the QP's one send-queue state ([`QpHandle::sq`]), so the connection's channels
    /// may use different modes, one after another (never at the same time). While a channel in a Host mode
    /// lives, its proxy posts to this QP and polls its CQ from counters of its own: device code posting on the
    /// handle meanwhile overwrites the proxy's WQEs and may take its CQEs, undetected, and when the proxy meets
    /// a CQE that none of its WQEs asked for it gives up on the QP (every wait of its channels then reports
    /// [`VENDOR_PROXY_POST`](crate::proxy::VENDOR_PROXY_POST)). Do not post on it in the Host modes.
    pub fn qp_handle_addr(&self) -> u64 {
        addr_of(&self.inner.state, QP_HANDLE_OFF)
    }

    /// The QP's atomic scratch word as device code names it (8 bytes, 8-byte aligned, `LOCAL_WRITE`): where
    /// the fetch-adds of `signal` return the old value, so that it never lands in user memory. Shared by all
    /// channels of this connection.
    pub fn scratch(&self) -> MrHandle {
        self.inner.scratch_mr.handle()
    }

    /// The scratch word's current value: the old value returned by the latest fetch-add (for tests; copied
    /// from GPU memory on `gpu`).
    ///
    /// # Errors
    /// The CUDA driver's error copying it.
    pub fn scratch_value(&self) -> Result<u64> {
        Ok(bytemuck::pod_read_unaligned(&read_words(&self.inner.scratch, 0, 8)?))
    }

    /// A copy of the QP's [`QpHandle`] as device code left it (copied from GPU memory on `gpu`). Exact only
    /// while no device code runs on it.
    ///
    /// # Errors
    /// The CUDA driver's error copying it.
    pub fn qp_handle(&self) -> Result<QpHandle> {
        let b = read_words(&self.inner.state, QP_HANDLE_OFF, size_of::<QpHandle>())?;
        Ok(bytemuck::pod_read_unaligned(&b))
    }

    pub(super) fn same(&self, other: &Connection) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// The proxy that posts this connection's WQEs (Host and HostNoAtomic modes), if any.
    pub fn proxy(&self) -> Option<&Arc<ProxyService>> {
        self.proxy.as_deref().map(QpUse::proxy)
    }

    /// The key that names this connection's QP to the proxy ([`ProxyQp::key`]).
    pub(super) fn proxy_key(inner: &Arc<ConnInner>) -> usize {
        Arc::as_ptr(inner) as usize
    }

    /// The QP as the proxy drives it: its handle as the NIC made it, and the connection's innards to keep.
    pub(super) fn proxy_qp(&self) -> ProxyQp {
        ProxyQp { key: Self::proxy_key(&self.inner), handle: self.inner.qp.handle(), _keep: self.inner.clone() }
    }
}
