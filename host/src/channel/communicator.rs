//! The communicator (MSCCL++ `Communicator`): one rank's NIC, PD and bootstrap, and the calls that register,
//! exchange and connect.

use std::sync::{Arc, Mutex};

use crate::bootstrap::Bootstrap;
use crate::exec::{DataBuf, Executor};
use crate::mem::MemLoc;
use crate::nic::emu::WireConfig;
use crate::nic::{Access, Nic, NicSpec};
use crate::{Error, Result};

use super::config::{EndpointConfig, IbMode, Transport};
use super::connection::{ConnInner, Connection, QP_HANDLE_OFF, STATE_BYTES};
use super::departed::Departed;
use super::memory::{RegInner, RegisteredMemory, RemoteMemory};
use super::msg::{self, Kind};
use super::port::PortChannel;
use super::resources::Resources;
use super::semaphore::{SemInner, Semaphore, EXPECTED_BYTES};
use crate::proxy::service::QpUse;
use crate::proxy::{ProxyService, DEFAULT_FIFO_SIZE};

/// One rank's view of a job for port channels (MSCCL++ `Communicator`): its [`Bootstrap`], its executor and
/// its NIC (one PD): by default its own emulated NIC, opened with a wire so that peers in other processes, on
/// other hosts, or on other threads with their own communicator connect to it
/// ([`new`](Self::new)); or a ConnectX ([`with_nic`](Self::with_nic)), or a NIC shared with other ranks of
/// this process ([`on_nic`](Self::on_nic)).
///
/// Setup calls come in pairs, one on each rank, matched by peer and tag: [`send_memory`](Self::send_memory)
/// with [`recv_memory`](Self::recv_memory), [`connect`](Self::connect) with `connect`,
/// [`semaphore`](Self::semaphore) with `semaphore`. They exchange bytes with the bootstrap's tagged
/// [`send`](Bootstrap::send)/[`recv`](Bootstrap::recv) (send first, so a pair never deadlocks); calls with
/// the same peer and tag pair up in call order, and a call that meets the other kind of call fails with an
/// error saying so. Tags are shared with other users of the same bootstrap. Each call that receives returns
/// once the peer's matching call has sent, so a rank that sets up with several peers must order its calls so that no cycle of
/// ranks waits on each other: a ring whose every rank connects to its next rank and then to its previous one
/// waits until the bootstrap's timeout; by ascending peer rank (as [`Collectives`](crate::coll::Collectives)
/// does) never.
///
/// Everything it makes keeps the NIC alive: connections, memory, semaphores and channels may outlive the
/// communicator (dropping it only leaves the bootstrap session, as [`leave`](Self::leave) does while it lives
/// on). Its peers take that leaving as this rank's departure, though: [`DEPARTURE_GRACE`](super::DEPARTURE_GRACE)
/// after they learn of it, their port-channel waits for this rank that are late end with `PeerGone`. So drop it
/// (or leave) once what the peers await from this rank has landed: after a flush, or, in the Host modes, by
/// dropping the channels and connections first, since the communicator's drop drains the proxy it holds last
/// before it leaves. That drain waits for the proxy's WQEs for at most the proxy's timeout
/// ([`PortChannel::DEFAULT_TIMEOUT`]) on each QP: puts that take longer to complete (much data on a slow wire)
/// are still on their way when the goodbye goes out, so flush those first.
pub struct Communicator {
    res: Arc<Resources>,
    /// The proxy of the Host modes, started by the first connection that needs it. Dropped before `boot`: as
    /// its last holder the communicator drains it (every trigger done, every WQE completed or the proxy's
    /// timeout passed) before the bootstrap's goodbye, after which the peers mark this rank gone
    /// ([`super::DEPARTURE_GRACE`] later) and their late waits for it end with `PeerGone`, whatever is still on
    /// its way.
    proxy: Mutex<Option<Arc<ProxyService>>>,
    /// The first setup exchange (`connect`, `semaphore`) that timed out after sending this rank's message,
    /// named: the messages of such calls (this rank's, and the peers' of theirs, which time out too in a
    /// cycle) stay queued and would pair with later calls, which would take an endpoint of a QP destroyed
    /// since. Every later exchange of this communicator is refused instead.
    stale: Mutex<Option<String>>,
    boot: Bootstrap,
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Communicator")
            .field("rank", &self.res.rank)
            .field("world_size", &self.res.world_size)
            .field("executor", &self.res.exec.kind())
            .field("nic", &self.res.nic)
            .finish_non_exhaustive()
    }
}

impl Communicator {
    /// Opens this rank's emulated NIC for `exec` (queue memory from [`Executor::queue_memory`], GPU copies
    /// from [`Executor::gpu_copier`]) listening on `wire`, and allocates its PD. `bootstrap` is this rank's
    /// joined session. MSCCL++ `Communicator(bootstrap)`.
    ///
    /// # Errors
    /// What [`EmuNic::open`](crate::nic::emu::EmuNic::open) returns ([`Error::Emu`] when the wire cannot listen, the address named;
    /// [`Error::InvalidArgument`] for an unspecified listen address); CUDA errors creating the copier.
    pub fn new(bootstrap: Bootstrap, exec: Executor, wire: WireConfig) -> Result<Self> {
        Self::with_nic(bootstrap, exec, &NicSpec::Emu, wire)
    }

    /// [`Communicator::new`] on the NIC `nic` names: the emulated NIC (listening on `wire`), or a real mlx5
    /// NIC (`--nic mlx5_0`, feature `mlx5`; `wire` unused). Every rank must use the same kind of NIC.
    ///
    /// # Errors
    /// What [`Nic::open`] returns ([`Error::Unavailable`], one line, for a real NIC that is not there or a
    /// build without the `mlx5` feature); as [`Communicator::new`].
    pub fn with_nic(bootstrap: Bootstrap, exec: Executor, nic: &NicSpec, wire: WireConfig) -> Result<Self> {
        let nic = Nic::open(nic, &exec, Some(wire))?;
        Self::on_nic(bootstrap, exec, nic)
    }

    /// [`Communicator::new`] on an open NIC, which ranks of one process may share (each with its own PD): their
    /// QPs then reach each other through that one NIC, as two ports of one HCA would, with no wire between them.
    ///
    /// # Errors
    /// The NIC's error allocating the PD.
    pub fn on_nic(bootstrap: Bootstrap, exec: Executor, nic: Nic) -> Result<Self> {
        let pd = nic.alloc_pd()?;
        let departed = Departed::watch(&bootstrap, &exec)?;
        let res = Resources { pd, nic, exec, rank: bootstrap.rank(), world_size: bootstrap.world_size(), departed };
        Ok(Self { res: Arc::new(res), boot: bootstrap, proxy: Mutex::new(None), stale: Mutex::new(None) })
    }

    /// This rank, `0..world_size()` (MSCCL++ `bootstrap()->getRank()`).
    pub fn rank(&self) -> u32 {
        self.res.rank
    }

    /// Number of ranks (MSCCL++ `bootstrap()->getNranks()`).
    pub fn world_size(&self) -> u32 {
        self.res.world_size
    }

    /// The NIC ([`Nic::as_emu`]: the emulated NIC's statistics and wire address).
    pub fn nic(&self) -> &Nic {
        &self.res.nic
    }

    /// The executor device code runs on.
    pub fn executor(&self) -> &Executor {
        &self.res.exec
    }

    /// Leaves the bootstrap session now, as dropping the communicator does, while it and what it made live
    /// on (NCCL's `ncclCommFinalize` before `ncclCommDestroy`): drops its hold on the proxy (which drains it if
    /// that hold was the last), then says goodbye ([`Bootstrap::leave`]). The peers' late port-channel waits
    /// for this rank end with `PeerGone` [`DEPARTURE_GRACE`](super::DEPARTURE_GRACE) after they learn of it.
    /// Call it once what the peers await from this rank has landed (after a flush). A `leave` on another
    /// thread meanwhile returns once this one's goodbye is out, and says none before.
    ///
    /// Why before the drop: freeing GPU memory (a channel's buffers, a NIC's queues) waits for every running
    /// kernel of the GPU. Ranks that are threads of one process on one GPU therefore see a rank that drops
    /// its objects first and its communicator last leave only once their own waiting kernels have ended
    /// (timed out); a rank that leaves first, then drops, is seen leaving at once.
    ///
    /// Later calls that exchange with peers (`connect`, `send_memory`, `semaphore`, the bootstrap's own)
    /// fail at once with "rank N left the session"; channels and connections made before keep working.
    pub fn leave(&self) {
        // The lock is held until the goodbye is out: a `leave` on another thread meanwhile waits for this one's
        // drain of the proxy, rather than saying goodbye while puts are still on their way.
        let mut proxy = self.proxy.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        drop(proxy.take());
        self.boot.leave();
    }

    /// The bootstrap (for barriers and the caller's own exchanges; mind the tags).
    pub fn bootstrap(&self) -> &Bootstrap {
        &self.boot
    }

    fn check_peer(&self, peer: u32, what: &str) -> Result<()> {
        if peer >= self.res.world_size {
            return Err(Error::InvalidArgument(format!(
                "{what}: peer rank {peer} is out of range for world size {}",
                self.res.world_size
            )));
        }
        Ok(())
    }

    fn check_mine(&self, res: &Arc<Resources>, what: &str, thing: &str) -> Result<()> {
        if !Arc::ptr_eq(res, &self.res) {
            return Err(Error::InvalidArgument(format!(
                "{what}: the {thing} belongs to another communicator (rank {}, {}), not this one ({})",
                res.rank,
                res.nic.describe(),
                self.res.nic.describe()
            )));
        }
        Ok(())
    }

    /// Refuses a setup exchange once an earlier one timed out ([`Communicator::stale`]); called before the
    /// exchange makes anything (a QP, a proxy).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] after an exchange that timed out.
    fn check_in_step(&self, what: &str) -> Result<()> {
        match self.stale.lock().unwrap_or_else(std::sync::PoisonError::into_inner).as_ref() {
            Some(first) => Err(Error::InvalidArgument(format!(
                "{what}: this rank's {first} timed out after sending its message, which stays queued at the peer \
                 (as the peers' messages of their timed-out calls stay here) and would pair with a later call: \
                 setup calls cannot go on; make a new bootstrap session and communicator on every rank"
            ))),
            None => Ok(()),
        }
    }

    /// Sends `mine` to `peer` with `tag`, then receives the peer's message with `tag` ([`Self::recv_setup`]);
    /// bootstrap errors get `what` in front. An exchange whose receive timed out leaves the communicator's
    /// setup out of step ([`Communicator::stale`]): later exchanges are refused ([`Self::check_in_step`]).
    ///
    /// # Errors
    /// As [`Self::recv_setup`].
    fn exchange(&self, peer: u32, tag: u32, what: &str, mine: &[u8]) -> Result<Vec<u8>> {
        self.boot.send(peer, tag, mine).map_err(|e| match e {
            Error::Bootstrap(m) => Error::Bootstrap(format!("{what}: {m}")),
            e => e,
        })?;
        self.recv_setup(peer, tag, what).inspect_err(|e| {
            if matches!(e, Error::Bootstrap(m) if m.contains(&recv_timeout(peer, tag))) {
                let mut stale = self.stale.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                stale.get_or_insert_with(|| what.to_string());
            }
        })
    }

    /// Receives the message of `peer`'s setup call with `tag`; bootstrap errors get `what` in front, and a
    /// timeout says how setup calls must be ordered.
    fn recv_setup(&self, peer: u32, tag: u32, what: &str) -> Result<Vec<u8>> {
        self.boot.recv(peer, tag).map_err(|e| match e {
            // This receive's own timeout (the bootstrap's words for it; a broken session's reason may quote
            // another wait's) while the peer lives: it has not made the matching call, most often because it
            // waits in a call of its own for a rank that waits in turn, a cycle such as every rank connecting
            // to its next rank first, then to its previous one.
            Error::Bootstrap(m) if m.contains(&recv_timeout(peer, tag)) => {
                Error::Bootstrap(format!("{what}: {m} ({})", cycle_hint(peer)))
            }
            Error::Bootstrap(m) => Error::Bootstrap(format!("{what}: {m}")),
            e => e,
        })
    }

    /// Registers `len` bytes at `loc` (host or GPU memory) with `LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ |
    /// REMOTE_ATOMIC` in this communicator's PD (MSCCL++ `registerMemory(ptr, size, transports)`).
    ///
    /// # Safety
    /// As [`EmuNic::reg_mr`](crate::nic::emu::EmuNic::reg_mr): until the returned memory and every clone of it (channels hold one) are dropped,
    /// the NIC reads and writes the range from its thread whenever a WQE names it, so it must stay allocated
    /// (host memory) or a live allocation the NIC's GPU copier reaches (GPU memory) for that long. On the `cpu`
    /// executor with `GDAKI_QUEUES=gpu` that copier is a [`SimGpu`](crate::nic::emu::SimGpu), whose "GPU
    /// memory" is host memory: GPU memory there is host memory that stays allocated.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a zero length, a null address, a range that wraps, or GPU memory on a NIC
    /// without a GPU copier: on the `cpu` executor, a real NIC's, and the emulated NIC's unless
    /// `GDAKI_QUEUES=gpu` (which gives it a [`SimGpu`](crate::nic::emu::SimGpu): GPU memory is then accepted and
    /// reached through the simulator's copies, as through the CUDA copier on the `gpu` executor);
    /// [`Error::Emu`] when the NIC's key table is full.
    pub unsafe fn register_memory(&self, loc: MemLoc, len: u64) -> Result<RegisteredMemory> {
        // SAFETY: the caller's contract is `reg_mr`'s.
        let mr = unsafe { self.res.nic.reg_mr(&self.res.pd, loc, len, Access::ALL) }?;
        Ok(RegisteredMemory { inner: Arc::new(RegInner { mr, buf: None, res: self.res.clone() }) })
    }

    /// Registers the whole of `buf` (from [`Executor::alloc_data`]: host memory on `cpu`, GPU memory on
    /// `gpu`) as [`register_memory`](Self::register_memory) does, and keeps it: it is freed after the
    /// registration ends. [`RegisteredMemory::buffer`] gives it back for filling and checking.
    ///
    /// # Errors
    /// As [`register_memory`](Self::register_memory) (an empty buffer is a zero length).
    pub fn register_buffer(&self, buf: DataBuf) -> Result<RegisteredMemory> {
        // SAFETY: `buf` moves into the returned memory and is dropped after its MR (field order of `RegInner`).
        let mr = unsafe { self.res.nic.reg_mr(&self.res.pd, buf.loc(), buf.len() as u64, Access::ALL) }?;
        Ok(RegisteredMemory { inner: Arc::new(RegInner { mr, buf: Some(buf), res: self.res.clone() }) })
    }

    /// Sends `mem`'s address, length and rkey to `peer` with `tag` (MSCCL++ `sendMemory(memory, remoteRank,
    /// tag)`); the peer gets a [`RemoteMemory`] from [`recv_memory`](Self::recv_memory) with the same tag.
    /// Returns without waiting for the peer.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a peer out of range or memory of another communicator;
    /// [`Error::Bootstrap`] when the send fails.
    pub fn send_memory(&self, mem: &RegisteredMemory, peer: u32, tag: u32) -> Result<()> {
        let what = format!("send_memory to rank {peer} tag {tag}");
        self.check_peer(peer, &what)?;
        self.check_mine(&mem.inner.res, &what, "memory")?;
        self.boot.send(peer, tag, &msg::memory(&mem.remote())).map_err(|e| match e {
            Error::Bootstrap(m) => Error::Bootstrap(format!("{what}: {m}")),
            e => e,
        })
    }

    /// Receives the memory `peer` sent with [`send_memory`](Self::send_memory) and `tag` (MSCCL++
    /// `recvMemory(remoteRank, tag)`), waiting up to the bootstrap's timeout.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a peer out of range, or a message with `tag` that is not memory (the two
    /// ranks' calls do not pair up) or has the wrong size; [`Error::Bootstrap`] when nothing arrives in time
    /// or the session breaks.
    pub fn recv_memory(&self, peer: u32, tag: u32) -> Result<RemoteMemory> {
        let what = format!("recv_memory from rank {peer} tag {tag}");
        self.check_peer(peer, &what)?;
        let bytes = self.recv_setup(peer, tag, &what)?;
        let mr = msg::parse_memory(msg::body(&bytes, Kind::Memory, peer, tag)?);
        Ok(RemoteMemory { rank: peer, mr })
    }

    /// Connects a new QP to `peer` (MSCCL++ `connect(endpointConfig, remoteRank, tag)`): creates a CQ and an
    /// RC QP of `cfg.ib`'s sizes in this communicator's PD, its atomic scratch word and the memory for its
    /// device-side state, sends the QP's endpoint to `peer` with `tag`, receives the peer's, and connects
    /// (RESET → RTS). Each call makes a new QP, so calling it `n` times for one peer gives `n` QPs
    /// (multi-QP); the peer's `n` calls with the same tag pair with them in order. Connecting to this rank
    /// itself gives a loopback QP.
    ///
    /// In [`IbMode::Host`](super::IbMode::Host) and [`IbMode::HostNoAtomic`](super::IbMode::HostNoAtomic) the
    /// connection's WQEs are posted by this communicator's proxy ([`Communicator::proxy`], started here when
    /// it is not running yet).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for sizes out of range, a peer out of range, or a peer message that is not
    /// an endpoint (calls that do not pair up), has the wrong size, or another mode, and after an earlier
    /// `connect` or `semaphore` of this communicator timed out (its message, and the peers' of their calls
    /// that timed out with it, stay queued and would pair with later calls; a peer whose matching call comes
    /// late pairs with it all the same and connects to a QP destroyed since: make a new bootstrap session and
    /// communicator on every rank);
    /// [`Error::Bootstrap`] when the exchange fails or times out; the NIC's and the executor's allocation errors; in the Host
    /// modes, what starting the proxy returns (as [`Communicator::proxy`]).
    pub fn connect(&self, cfg: &EndpointConfig, peer: u32, tag: u32) -> Result<Connection> {
        let what = format!("connect to rank {peer} tag {tag}");
        let (wqe_cnt, ncqe) = cfg.check()?;
        self.check_peer(peer, &what)?;
        self.check_in_step(&what)?;
        let proxy = match cfg.ib.mode {
            IbMode::Device => None,
            IbMode::Host | IbMode::HostNoAtomic => Some(self.proxy()?),
        };
        let res = &self.res;
        // The proxy's QPs are posted to and polled by a host thread: their queues stay in host memory.
        let cq = res.nic.create_cq_for(ncqe, proxy.is_some())?;
        let qp = res.nic.create_qp_for(&res.pd, &cq, wqe_cnt, proxy.is_some())?;
        let scratch = res.exec.alloc_data(8)?;
        // SAFETY: `scratch` moves into the connection and is dropped after this MR (field order of `ConnInner`).
        let scratch_mr = unsafe { res.nic.reg_mr(&res.pd, scratch.loc(), 8, Access::LOCAL_WRITE) }?;
        let state = res.exec.alloc_data(STATE_BYTES)?;
        let transport = match cfg.transport {
            Transport::EmuRc => 1,
        };
        let mine = msg::endpoint(transport, cfg.ib.mode.code(), &qp.endpoint());
        let theirs = self.exchange(peer, tag, &what, &mine)?;
        let (t, m, remote) = msg::parse_endpoint(msg::body(&theirs, Kind::Endpoint, peer, tag)?)?;
        if (t, m) != (transport, cfg.ib.mode.code()) {
            // Names where the codes have them (Transport::EmuRc is 1, the only one), so that the user sees
            // the `IbMode` each side asked for.
            let name = |t: u8, m: u8| {
                let t = if t == 1 { "EmuRc".to_string() } else { format!("transport {t}") };
                let m = IbMode::from_code(m).map_or_else(|| m.to_string(), |m| m.name().to_string());
                format!("{t} in mode {m}")
            };
            return Err(Error::InvalidArgument(format!(
                "{what}: rank {peer} connects with {}, this rank with {} (give both the same EndpointConfig)",
                name(t, m),
                name(transport, cfg.ib.mode.code())
            )));
        }
        qp.connect(&remote)?;
        // A new QP's NIC has consumed nothing: the handle's send-queue state starts at zero.
        state.write(QP_HANDLE_OFF, bytemuck::bytes_of(&qp.handle()))?;
        let inner = Arc::new(ConnInner {
            scratch_mr,
            qp,
            cq,
            state,
            scratch,
            peer,
            tag,
            config: *cfg,
            remote,
            res: res.clone(),
        });
        let proxy = proxy.map(|p| Arc::new(QpUse::new(p, Connection::proxy_key(&inner))));
        Ok(Connection { proxy, inner })
    }

    /// The proxy that posts the WQEs of this communicator's Host-mode connections (MSCCL++ `ProxyService`),
    /// started with a FIFO of [`DEFAULT_FIFO_SIZE`] slots if it is not running.
    ///
    /// # Errors
    /// [`Error::Bootstrap`] once this rank has left the session ([`leave`](Self::leave)); as
    /// [`ProxyService::start`].
    pub fn proxy(&self) -> Result<Arc<ProxyService>> {
        self.running_proxy(None)
    }

    /// Starts the proxy with a FIFO of `fifo_size` slots (a power of two, 2 ..= 2^20), or returns the running
    /// one if it has that size. Call it before the first Host-mode [`connect`](Self::connect) to choose the
    /// size.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the proxy already runs with another FIFO size; as
    /// [`proxy`](Self::proxy).
    pub fn start_proxy(&self, fifo_size: u32) -> Result<Arc<ProxyService>> {
        self.running_proxy(Some(fifo_size))
    }

    fn running_proxy(&self, fifo_size: Option<u32>) -> Result<Arc<ProxyService>> {
        let mut p = self.proxy.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if self.boot.has_left() {
            // A proxy started now would serve no connection: none can be made after the leaving.
            return Err(Error::Bootstrap(format!("rank {} left the session: no proxy is started", self.rank())));
        }
        if let Some(p) = &*p {
            match fifo_size {
                Some(n) if n != p.fifo().size => {
                    return Err(Error::InvalidArgument(format!(
                        "the proxy already runs with a FIFO of {} slots, not {n}",
                        p.fifo().size
                    )))
                }
                _ => return Ok(p.clone()),
            }
        }
        let fifo_size = fifo_size.unwrap_or(DEFAULT_FIFO_SIZE);
        let started = Arc::new(ProxyService::start(&self.res.exec, fifo_size, PortChannel::DEFAULT_TIMEOUT)?);
        *p = Some(started.clone());
        Ok(started)
    }

    /// Builds a semaphore on `conn` with `peer` (MSCCL++ `buildSemaphore(connection, remoteRank, tag)`):
    /// allocates this side's inbound word (8 bytes, registered `LOCAL_WRITE | REMOTE_WRITE | REMOTE_ATOMIC`
    /// (HostNoAtomic signals write it), initially 0) and expected counter (8 bytes, initially 0), both where
    /// device code keeps state (GPU memory on `gpu`, host memory on `cpu`), sends the inbound word's
    /// [`RemoteMr`](gdaki_shared::handle::RemoteMr) to `peer` with `tag` and receives the peer's. The peer's
    /// `signal`s advance this side's inbound word through its end of `conn` (RDMA fetch-adds; in
    /// HostNoAtomic, RDMA WRITEs of the new count); this side's advance the peer's through `conn`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `conn` belongs to another communicator or goes to another rank than
    /// `peer`, when the peer's message is not a semaphore (calls that do not pair up), has the wrong size,
    /// names a word that is not 8 aligned bytes, or was built on a QP that is not `conn`'s peer QP, and
    /// after a setup exchange of this communicator timed out (as [`Communicator::connect`]);
    /// [`Error::Bootstrap`] when the exchange fails; allocation and registration errors.
    pub fn semaphore(&self, conn: &Connection, peer: u32, tag: u32) -> Result<Semaphore> {
        let what = format!("semaphore with rank {peer} tag {tag}");
        self.check_peer(peer, &what)?;
        self.check_mine(&conn.inner.res, &what, "connection")?;
        self.check_in_step(&what)?;
        if conn.peer() != peer {
            return Err(Error::InvalidArgument(format!(
                "{what}: the connection (QP {:#x}) goes to rank {}, not {peer}",
                conn.qpn(),
                conn.peer()
            )));
        }
        let res = &self.res;
        let inbound = res.exec.alloc_data(8)?;
        // SAFETY: `inbound` moves into the semaphore and is dropped after this MR (field order of `SemInner`).
        let inbound_mr = unsafe {
            res.nic.reg_mr(
                &res.pd,
                inbound.loc(),
                8,
                Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC,
            )
        }?;
        let expected = res.exec.alloc_data(EXPECTED_BYTES)?;
        let theirs = self.exchange(peer, tag, &what, &msg::semaphore(&inbound_mr.remote(), conn.qpn()))?;
        let (remote_inbound, their_qpn) = msg::parse_semaphore(msg::body(&theirs, Kind::Semaphore, peer, tag)?)?;
        let remote_qpn = conn.remote_endpoint().qpn();
        if their_qpn != remote_qpn {
            return Err(Error::InvalidArgument(format!(
                "{what}: rank {peer} built its semaphore on its QP {their_qpn:#x}, but this connection (QP {:#x}) \
                 is connected to its QP {remote_qpn:#x} (build semaphores on matching connections, in the same order)",
                conn.qpn()
            )));
        }
        if remote_inbound.length != 8 || !remote_inbound.addr.is_multiple_of(8) {
            return Err(Error::InvalidArgument(format!(
                "{what}: rank {peer}'s inbound word is {} bytes at {:#x}, not 8 bytes 8-byte aligned",
                remote_inbound.length, remote_inbound.addr
            )));
        }
        Ok(Semaphore {
            inner: Arc::new(SemInner {
                inbound_mr,
                conn: conn.clone(),
                remote_inbound,
                inbound,
                expected,
                proxy_count: Arc::default(),
            }),
        })
    }
}

/// The words with which the bootstrap reports that its receive from `peer` with `tag` timed out.
fn recv_timeout(peer: u32, tag: u32) -> String {
    format!("recv from rank {peer} tag {tag}: timed out after")
}

/// What a setup call's timeout adds: how to order the calls so that no cycle of ranks waits.
fn cycle_hint(peer: u32) -> String {
    format!(
        "rank {peer} did not make the matching call: if it waits in a setup call with another rank, order every \
         rank's setup calls so that no cycle of ranks waits, e.g. by ascending peer rank; if it made the call \
         with another tag, give both ranks' calls the same tag"
    )
}
