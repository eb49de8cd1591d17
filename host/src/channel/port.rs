//! Port channels (MSCCL++ `PortChannel`): what a channel binds together, and its device handle.

use std::sync::Arc;
use std::time::Duration;

use gdaki_shared::channel::PortChannelHandle;
use gdaki_shared::proxy::{mode, FifoHandle};

use crate::{Error, Result};

use super::config::IbMode;
use super::connection::Connection;
use super::memory::{RegisteredMemory, RemoteMemory};
use super::semaphore::Semaphore;
use crate::proxy::service::Registration;

/// A port channel (MSCCL++ `PortChannel`): a connection's QP, a semaphore on it, the peer's memory `put`
/// writes into and the local memory it reads from. Device code gets it as a [`PortChannelHandle`]
/// ([`device_handle`](Self::device_handle)) and calls `put`, `signal`, `flush`, `wait` on it. On a
/// connection in [`IbMode::Device`] device code posts the WQEs itself (MSCCL++'s GPUNetIO backend); in the
/// Host modes the channel is registered with the connection's proxy, and device code pushes triggers that the
/// proxy turns into WQEs.
///
/// Several channels may share one connection (one QP, one scratch word, one set of counters); a channel is
/// bound to the connection it is made with, so with several connections to one peer (multi-QP) the caller
/// picks the QP by picking the connection (e.g. `&conns[i]`).
///
/// It holds clones of the connection, the semaphore and the source memory, so everything its handle names on
/// this side stays alive as long as the channel does; the destination is the peer's to keep alive. Drop it only
/// once a `flush` on it has returned: its clone may be the source memory's last registration, and a put that
/// the NIC (or, in the Host modes, the proxy) has not executed when the memory is deregistered fails with a local
/// protection error (syndrome 0x04) or, with the QP destroyed too, never runs, as on hardware; nobody is left to
/// be told.
#[derive(Clone, Debug)]
pub struct PortChannel {
    conn: Connection,
    sem: Semaphore,
    dst: RemoteMemory,
    src: RegisteredMemory,
    max_wqe_bytes: u64,
    timeout_ns: u64,
    blue_flame_limit: u64,
    /// Host modes: the handle's proxy fields, as the proxy registered this channel.
    proxied: Option<Proxied>,
}

/// What registering a channel with the proxy gave it.
#[derive(Clone, Debug)]
struct Proxied {
    fifo: FifoHandle,
    err: u64,
    mode: u32,
    id: u32,
    /// Gives the id back when the last clone of this registration goes.
    _registration: Arc<Registration>,
}

impl PortChannel {
    /// Default largest payload of one RDMA WRITE: 1 GiB. Longer puts are split by device code.
    pub const DEFAULT_MAX_WQE_BYTES: u64 = 1 << 30;
    /// Largest allowed [`with_max_wqe_bytes`](Self::with_max_wqe_bytes): 2^31 bytes, mlx5's `max_msg_sz`.
    pub const MAX_WQE_BYTES: u64 = 1 << 31;
    /// Default bound of every device-side wait: 5 s.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
    /// Default BlueFlame limit: in Device mode with Exclusive sharing, puts of up to 512 KiB are rung by
    /// BlueFlame (see [`with_blue_flame_limit`](Self::with_blue_flame_limit)).
    pub const DEFAULT_BLUE_FLAME_LIMIT: u64 = 512 << 10;

    /// Binds `conn`'s QP, `sem` (built on `conn`), the peer's memory `dst` (received from `conn`'s peer) and
    /// the local memory `src` (registered on `conn`'s communicator) into a channel (MSCCL++
    /// `PortChannel(semaphoreId, semaphore, proxy, dst, src)`; the proxy, in the Host modes, is the
    /// connection's, which this registers the channel with). Limits start at
    /// [`DEFAULT_MAX_WQE_BYTES`](Self::DEFAULT_MAX_WQE_BYTES), [`DEFAULT_TIMEOUT`](Self::DEFAULT_TIMEOUT) and
    /// [`DEFAULT_BLUE_FLAME_LIMIT`](Self::DEFAULT_BLUE_FLAME_LIMIT).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `sem` was built on another connection (its signals would not be ordered
    /// after this channel's puts), `dst` is another rank's memory than `conn`'s peer's, or `src` was
    /// registered by another communicator (its key means nothing to this QP's NIC); in the Host modes,
    /// [`Error::InvalidArgument`] when the proxy serves 65,536 channels at once (a dropped channel's id is given
    /// back to it once the triggers pushed for it are done), and allocation errors. Keep the channel while
    /// kernels may use its handle.
    pub fn new(conn: &Connection, sem: &Semaphore, dst: RemoteMemory, src: &RegisteredMemory) -> Result<Self> {
        let what = format!("port channel on QP {:#x} to rank {}", conn.qpn(), conn.peer());
        if !sem.connection().same(conn) {
            return Err(Error::InvalidArgument(format!(
                "{what}: the semaphore was built on another connection (QP {:#x} to rank {})",
                sem.connection().qpn(),
                sem.peer()
            )));
        }
        if dst.rank() != conn.peer() {
            return Err(Error::InvalidArgument(format!(
                "{what}: the destination is rank {}'s memory, not the peer's",
                dst.rank()
            )));
        }
        if !std::sync::Arc::ptr_eq(&src.inner.res, &conn.inner.res) {
            return Err(Error::InvalidArgument(format!(
                "{what}: the source memory was registered by another communicator (rank {}, {})",
                src.rank(),
                src.inner.res.nic.describe()
            )));
        }
        Self {
            conn: conn.clone(),
            sem: sem.clone(),
            dst,
            src: src.clone(),
            max_wqe_bytes: Self::DEFAULT_MAX_WQE_BYTES,
            timeout_ns: Self::DEFAULT_TIMEOUT.as_nanos() as u64,
            blue_flame_limit: Self::DEFAULT_BLUE_FLAME_LIMIT,
            proxied: None,
        }
        .registered()
    }

    /// In the Host modes, this channel registered with the connection's proxy (again, after a change the
    /// proxy must know of: it splits puts at `max_wqe_bytes`).
    fn registered(self) -> Result<Self> {
        let Some(proxy) = self.conn.proxy() else {
            return Ok(self);
        };
        let mode = match self.conn.config().ib.mode {
            IbMode::HostNoAtomic => mode::HOST_NO_ATOMIC,
            _ => mode::HOST,
        };
        let (h, registration) =
            proxy.register(self.conn.proxy_qp(), self.device_handle(), mode, self.sem.inner.proxy_count.clone())?;
        let proxied = Some(Proxied {
            fifo: h.fifo,
            err: h.proxy_err,
            mode,
            id: h.channel_id,
            _registration: Arc::new(registration),
        });
        Ok(Self { proxied, ..self })
    }

    /// This channel with puts split into RDMA WRITEs of at most `bytes` each (in the Host modes a channel of
    /// its own for the proxy, which splits the puts: registered again, with a new id).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] unless `1 <= bytes <=` [`MAX_WQE_BYTES`](Self::MAX_WQE_BYTES); in the Host
    /// modes, as [`PortChannel::new`].
    pub fn with_max_wqe_bytes(self, bytes: u64) -> Result<Self> {
        if bytes == 0 || bytes > Self::MAX_WQE_BYTES {
            return Err(Error::InvalidArgument(format!(
                "port channel max_wqe_bytes {bytes} must be 1..={} (mlx5 max_msg_sz)",
                Self::MAX_WQE_BYTES
            )));
        }
        Self { max_wqe_bytes: bytes, ..self }.registered()
    }

    /// This channel with every device-side wait bounded by `timeout` (nanoseconds in the handle; longer than
    /// `u64::MAX` ns, about 584 years, is clamped).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a zero timeout.
    pub fn with_timeout(self, timeout: Duration) -> Result<Self> {
        if timeout.is_zero() {
            return Err(Error::InvalidArgument("port channel timeout must be more than 0".into()));
        }
        Ok(Self { timeout_ns: u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX), ..self })
    }

    /// This channel with puts of up to `bytes` bytes rung by BlueFlame, in Device mode with Exclusive sharing:
    /// the put's last WQE (one WQEBB: ctrl, remote address and data segments) is written whole to the
    /// BlueFlame register, from registers, after being stored to the ring; the payload itself is read by the
    /// NIC from memory as for any WRITE. Larger puts ring the 8-byte doorbell. The fetch-add of a signal or an
    /// accumulate counts as 8 bytes, so 0 never uses BlueFlame. Block and Device sharing and the Host modes
    /// always ring the doorbell, whatever the limit.
    pub fn with_blue_flame_limit(self, bytes: u64) -> Self {
        Self { blue_flame_limit: bytes, ..self }
    }

    /// The connection.
    pub fn connection(&self) -> &Connection {
        &self.conn
    }

    /// The semaphore.
    pub fn semaphore(&self) -> &Semaphore {
        &self.sem
    }

    /// The peer's memory `put` writes into.
    pub fn dst(&self) -> RemoteMemory {
        self.dst
    }

    /// The local memory `put` reads from.
    pub fn src(&self) -> &RegisteredMemory {
        &self.src
    }

    /// The handle device code uses (MSCCL++ `deviceHandle()`), every field filled: `qp` (the connection's
    /// [`QpHandle`](gdaki_shared::handle::QpHandle) address), `dst`, `src`, `remote_sem` (the
    /// peer's inbound word), `local_sem` and `expected` (this side's words), `scratch` (the QP's atomic
    /// scratch word), `max_wqe_bytes`, `timeout_ns`, `blue_flame_limit`, `departed` (the peer's departure
    /// word), `peer_plus_one` (the peer's rank), `proxy` (the mode), and in the Host modes `fifo`,
    /// `proxy_err` and `channel_id` (the proxy's FIFO, its error word and this channel's id; zero in Device
    /// mode). Plain data to copy into kernel arguments or device memory; the addresses in it stay valid while
    /// this channel lives.
    pub fn device_handle(&self) -> PortChannelHandle {
        let (fifo, err, proxy, id) = self
            .proxied
            .as_ref()
            .map_or((FifoHandle::default(), 0, mode::DEVICE, 0), |p| (p.fifo, p.err, p.mode, p.id));
        PortChannelHandle {
            qp: self.conn.qp_handle_addr(),
            dst: self.dst.remote(),
            src: self.src.handle(),
            remote_sem: self.sem.remote_inbound(),
            local_sem: self.sem.inbound_addr(),
            expected: self.sem.expected_addr(),
            scratch: self.conn.scratch(),
            max_wqe_bytes: self.max_wqe_bytes,
            timeout_ns: self.timeout_ns,
            blue_flame_limit: self.blue_flame_limit,
            fifo,
            proxy_err: err,
            departed: self.conn.departed_addr(),
            proxy,
            channel_id: id,
            peer_plus_one: self.conn.peer() + 1,
            pad: 0,
        }
    }
}
