//! Collectives, host side: [`Collectives`] sets up, on a [`Communicator`], everything device code's
//! `gdaki_device::coll` (broadcast, all-to-all with variable sizes, reduce and all-reduce summed on the NIC,
//! the ring all-reduce summed by the GPU) needs for the whole communicator, and builds its [`CollHandle`]: a
//! port channel (one RC QP in Device mode, a semaphore) to every peer, this rank's data buffer registered and
//! exchanged (a reduce's accumulation area and a ring all-reduce's scratch area lie in it),
//! and a control region (the group-acknowledgment counter of broadcasts and reduces, the all-to-all count
//! matrix) registered and exchanged. The same code serves both executors.
//!
//! Every rank calls [`Collectives::new`] with the same configuration; the setup pairs up with each peer through
//! the bootstrap, on four tags from [`CollConfig::tag`] (keep them apart from the caller's own).

use std::time::Duration;

use gdaki_shared::coll::{ctrl, CollHandle, MAX_RANKS};

use crate::channel::{Communicator, EndpointConfig, PortChannel, RegisteredMemory};
use crate::exec::DataBuf;
use crate::mem::{MappedBuf, MemKind, MemLoc};
use crate::{Error, Result};

/// What [`Collectives::new`] sets up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CollConfig {
    /// Bytes of each rank's data buffer (GPU memory on `gpu`, host memory on `cpu`), more than 0: what
    /// collectives read from and write into.
    pub buffer_bytes: usize,
    /// Bound of every device-side wait of a collective call (more than 0).
    pub timeout: Duration,
    /// First of the four bootstrap tags the setup uses with each peer (`tag ..= tag + 3`).
    pub tag: u32,
}

impl CollConfig {
    /// Default first tag: `0x4000_0000`.
    pub const DEFAULT_TAG: u32 = 0x4000_0000;

    /// `buffer_bytes` of data per rank, [`PortChannel::DEFAULT_TIMEOUT`], [`CollConfig::DEFAULT_TAG`].
    pub fn new(buffer_bytes: usize) -> Self {
        Self { buffer_bytes, timeout: PortChannel::DEFAULT_TIMEOUT, tag: Self::DEFAULT_TAG }
    }
}

/// One rank's collective communicator: channels to every peer, the registered data buffer and control
/// region, and the [`CollHandle`] device code takes. Everything the handle names on this side lives as long
/// as this value; keep it (on every rank) until every rank's device code is done with the collectives.
#[derive(Debug)]
pub struct Collectives {
    handle: CollHandle,
    /// Field order is drop order: channels and MRs before the memory they cover.
    channels: Vec<PortChannel>,
    mem: RegisteredMemory,
    _ctrl_mr: RegisteredMemory,
    buf: DataBuf,
    ctrl: MappedBuf,
    _ack_expected: DataBuf,
}

impl Collectives {
    /// Sets up the collectives of `comm`'s ranks (every rank calls it with the same `cfg`): registers a data
    /// buffer of `cfg.buffer_bytes` and a control region of [`ctrl::BYTES`] (queue memory, zero), sends both
    /// to every peer and receives theirs (every peer's before any connection, so that a buffer of another
    /// length is refused by every rank at once), connects one QP in Device mode to every peer (in ascending
    /// rank order, so the pairings never wait in a cycle) with a semaphore on it, and builds the handle.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for more than [`MAX_RANKS`] ranks, a zero buffer or timeout, a first tag
    /// above `u32::MAX - 3`, or peers
    /// whose buffers differ in length; [`Error::Unavailable`] for queue memory without unified addressing;
    /// what the communicator's calls return (bootstrap timeouts name the peer and tag).
    pub fn new(comm: &Communicator, cfg: &CollConfig) -> Result<Self> {
        let (rank, n) = (comm.rank(), comm.world_size());
        if n as usize > MAX_RANKS || cfg.buffer_bytes == 0 || cfg.timeout.is_zero() || cfg.tag > u32::MAX - 3 {
            return Err(Error::InvalidArgument(format!(
                "collectives of {n} ranks (at most {MAX_RANKS}), {} buffer bytes, timeout {:?}, tags from {:#x}: need \
                 nonzero sizes and four tags",
                cfg.buffer_bytes, cfg.timeout, cfg.tag
            )));
        }
        let exec = comm.executor();
        let buf = exec.alloc_data(cfg.buffer_bytes)?;
        // SAFETY: `buf` is a field dropped after `mem` (and after every channel, which holds a clone of it).
        let mem = unsafe { comm.register_memory(buf.loc(), buf.len() as u64) }?;
        let ctrl = exec.queue_memory().alloc(ctrl::BYTES as usize)?;
        if ctrl.host_ptr() as u64 != ctrl.device_addr() {
            return Err(Error::Unavailable(format!(
                "queue memory at host {:p} is mapped at device address {:#x}: collectives need unified addressing",
                ctrl.host_ptr(),
                ctrl.device_addr()
            )));
        }
        let loc = MemLoc { kind: MemKind::Host, addr: ctrl.device_addr() };
        // SAFETY: `ctrl` is a field dropped after `ctrl_mr`.
        let ctrl_mr = unsafe { comm.register_memory(loc, ctrl::BYTES) }?;
        let ack_expected = exec.alloc_data(8)?;
        let peers = || (0..n).filter(move |&p| p != rank);
        let t = cfg.tag;
        for p in peers() {
            comm.send_memory(&mem, p, t)?;
            comm.send_memory(&ctrl_mr, p, t + 1)?;
        }
        let mut handle = CollHandle {
            rank,
            nranks: n,
            timeout_ns: u64::try_from(cfg.timeout.as_nanos()).unwrap_or(u64::MAX),
            buf: mem.handle(),
            ctrl: ctrl_mr.handle(),
            ack_expected: ack_expected.loc().addr,
            peer_ctrl: Default::default(),
            peers: Default::default(),
        };
        // Every peer's memory before any connection: a rank refuses a length before it pairs up with anyone,
        // so no rank waits to connect to a peer that has already refused a third one.
        let mut dsts = Vec::with_capacity(n as usize - 1);
        for p in peers() {
            let dst = comm.recv_memory(p, t)?;
            if dst.len() != mem.len() {
                return Err(Error::InvalidArgument(format!(
                    "collectives: rank {p}'s data buffer is {} bytes, this rank's {} (give every rank the same \
                     CollConfig)",
                    dst.len(),
                    mem.len()
                )));
            }
            handle.peer_ctrl[p as usize] = comm.recv_memory(p, t + 1)?.remote();
            dsts.push((p, dst));
        }
        let mut channels = Vec::with_capacity(n as usize - 1);
        for (p, dst) in dsts {
            let conn = comm.connect(&EndpointConfig::default(), p, t + 2)?;
            let sem = comm.semaphore(&conn, p, t + 3)?;
            let chan = PortChannel::new(&conn, &sem, dst, &mem)?.with_timeout(cfg.timeout)?;
            handle.peers[p as usize] = chan.device_handle();
            channels.push(chan);
        }
        Ok(Self { handle, channels, mem, _ctrl_mr: ctrl_mr, buf, ctrl, _ack_expected: ack_expected })
    }

    /// The handle device code takes (copy it where the executor reaches it, e.g. `Executor::upload`).
    pub fn handle(&self) -> &CollHandle {
        &self.handle
    }

    /// This rank's data buffer (fill it before a broadcast's root runs, read it after a call returns).
    pub fn buffer(&self) -> &DataBuf {
        &self.buf
    }

    /// This rank's registered data buffer.
    pub fn memory(&self) -> &RegisteredMemory {
        &self.mem
    }

    /// This rank's group-acknowledgment counter: how many other ranks have acknowledged the broadcasts and
    /// reduces this rank was the root of, in all.
    pub fn acks(&self) -> u64 {
        let p = (self.ctrl.host_ptr() as usize + ctrl::ACK as usize) as *mut u64;
        // SAFETY: the counter is 8 aligned bytes inside `ctrl` (4096-aligned, `ctrl::BYTES` long); the NIC
        // writes it with whole-word stores.
        unsafe { std::sync::atomic::AtomicU64::from_ptr(p) }.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The channels to the peers, in ascending rank order (this rank left out).
    pub fn channels(&self) -> &[PortChannel] {
        &self.channels
    }

    /// The peers whose connection has failed, with why, in ascending rank order: on the emulated NIC, a wire
    /// link that went down (the peer's process ended, its host went away, or it did not answer within the
    /// wire's retry timeout). Empty while every link is up, and on the mlx5 backend (whose error CQEs say
    /// it). A collective that timed out waiting for the group acknowledgment cannot name the receiver that
    /// did not answer (there is one counter for all of them); this can.
    pub fn failed_peers(&self) -> Vec<(u32, String)> {
        self.channels
            .iter()
            .filter_map(|c| {
                let conn = c.connection();
                conn.qp().as_emu().and_then(|q| q.wire_error()).map(|why| (conn.peer(), why))
            })
            .collect()
    }
}
