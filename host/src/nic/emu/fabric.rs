//! The registry one [`super::EmuNic`] and its executor thread share: QPs by number, the MR key table, id
//! allocation, counters and the stop flag. All QPs of one NIC form one "fabric": they can connect to each
//! other.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Instant;

use crate::drop_errors::DropErrors;
use crate::mem::{GpuCopier, MemKind, QueueMemory};
use crate::{Error, Result};

use super::fw::resources::Firmware;
use super::qmem::{GpuPool, PooledGpuMem, QMem};

use super::mr::MrTable;
use super::qp::QpInner;
use super::stats::Counters;
use super::wire::link::Mailbox;
use super::wire::requester::IpcRefs;
use super::wire::WireConfig;

/// Shared state of one emulated NIC.
pub(crate) struct Fabric {
    /// Random (nonzero): unique across processes and hosts in practice, so that a hello names one NIC.
    pub id: u64,
    /// The wire, when the NIC has one: its configuration, with the listener's actual address.
    pub wire: Option<WireConfig>,
    /// Where the wire's reader threads deliver frames; set once the executor thread exists.
    pub mailbox: OnceLock<Mailbox>,
    pub queue_mem: Arc<dyn QueueMemory>,
    pub gpu: Option<Arc<dyn GpuCopier>>,
    /// Where SQ rings, dbrecs and CQ rings go ([`EmuConfig::queues`](super::EmuConfig::queues)); `Gpu` only
    /// with `gpu`.
    pub queues: MemKind,
    /// GPU queue memory of destroyed QPs and CQs, for later ones (freed with the NIC).
    pub gpu_pool: Arc<GpuPool>,
    /// What the NIC leaves in words 1..8 of each BlueFlame register after acting on a doorbell (random,
    /// never zero): a word that differs was written by a BlueFlame write since (see `sq::take_blueflame`).
    pub bf_sentinel: u64,
    /// The UAR pages have a BlueFlame buffer ([`super::EmuConfig::blueflame`]).
    pub blueflame: bool,
    /// Live QPs by QPN.
    pub qps: RwLock<HashMap<u32, Arc<QpInner>>>,
    /// Bumped whenever `qps` changes (after the change), so the executor refreshes its list only then.
    pub qp_gen: AtomicU64,
    /// The `qp_gen` the executor last refreshed its QP list to, published once it has finished a whole sweep
    /// with that list (Release). When it reaches the generation a QP's removal produced, the executor holds
    /// no reference to that QP (nor to it as a cached peer) and runs none of its WQEs: `Qp::drop` waits for
    /// it, so that the last reference, and with it the queue memory, is dropped by the QP's owner.
    pub acked_gen: AtomicU64,
    /// Registered MRs. The executor holds the read lock while a WQE moves bytes; deregistration takes the
    /// write lock.
    pub mrs: RwLock<MrTable>,
    next_qpn: AtomicU32,
    next_cqn: AtomicU32,
    next_pdn: AtomicU32,
    /// What the NIC's firmware commands create and check against (umems, UAR pages, CQs, PDs, the QPs'
    /// resources); one command at a time holds it, as a firmware command queue runs them.
    pub fw: Mutex<Firmware>,
    pub stats: Counters,
    /// Set by the NIC's drop: the executor thread exits.
    pub stop: AtomicBool,
    /// Set by [`EmuNic::hold_executor`](super::EmuNic::hold_executor) (tests): the executor runs no passes.
    pub held: AtomicBool,
    /// Set by the executor when it finds `held` set between two passes, cleared (before it looks at `held`
    /// again) when it leaves that state: while `held` and `holding` are both set, no pass runs.
    pub holding: AtomicBool,
    /// Set by [`EmuNic::fail_next_dialer`](super::EmuNic::fail_next_dialer) (tests), cleared by the INIT2RTR
    /// it fails.
    pub fail_dialer: AtomicBool,
    /// By MR key: WRITEs sent as pieces a peer process copies out of the MR's GPU memory (the wire's
    /// same-host path), for the MR's deregistration to wait for ([`IpcRefs`]).
    pub ipc_refs: Mutex<HashMap<u32, IpcRefs>>,
    /// Cleared when the executor thread exits (normally or by a panic).
    pub running: AtomicBool,
    /// Zero of CQE timestamps: the emulator writes nanoseconds since the NIC was opened.
    pub epoch: Instant,
    /// Failures of the drops of this NIC's QPs; see [`super::EmuNic::take_drop_error`].
    pub drops: DropErrors,
}

/// First QPN handed out (small QPNs are reserved on hardware; a zeroed handle's QPN is never valid).
const FIRST_QPN: u32 = 0x100;

impl Fabric {
    /// How long a request may go unanswered before its WQE fails with 0x15 (transport retry exceeded):
    /// [`WireConfig::retry_timeout`], or its default on a NIC without a wire.
    pub(crate) fn retry_timeout(&self) -> std::time::Duration {
        self.wire.map_or(WireConfig::DEFAULT_RETRY_TIMEOUT, |w| w.retry_timeout)
    }

    pub(crate) fn new(
        id: u64,
        queue_mem: Arc<dyn QueueMemory>,
        gpu: Option<Arc<dyn GpuCopier>>,
        queues: MemKind,
        wire: Option<WireConfig>,
        blueflame: bool,
    ) -> Self {
        Self {
            id,
            wire,
            mailbox: OnceLock::new(),
            queue_mem,
            gpu,
            queues,
            gpu_pool: Arc::default(),
            // Derived from the random identifier: any value works, a fixed one might be some WQE's word.
            bf_sentinel: id.rotate_left(29) ^ 0x5bd1_e995_a5a5_c3c3 | 1,
            blueflame,
            qps: RwLock::new(HashMap::new()),
            qp_gen: AtomicU64::new(0),
            acked_gen: AtomicU64::new(0),
            mrs: RwLock::new(MrTable::default()),
            next_qpn: AtomicU32::new(FIRST_QPN),
            drops: DropErrors::default(),
            next_cqn: AtomicU32::new(1),
            next_pdn: AtomicU32::new(1),
            fw: Mutex::new(Firmware::default()),
            stats: Counters::default(),
            stop: AtomicBool::new(false),
            held: AtomicBool::new(false),
            holding: AtomicBool::new(false),
            fail_dialer: AtomicBool::new(false),
            ipc_refs: Mutex::default(),
            running: AtomicBool::new(true),
            epoch: Instant::now(),
        }
    }

    /// Allocates `len` zeroed bytes of queue memory in `kind` of memory: host memory from the configured
    /// queue memory; GPU memory from the NIC's pool when it has a buffer of that size (zeroed by a copy, waited
    /// for), else new from the copier, and back to the pool when dropped.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for GPU memory on a NIC without a GPU copier; the allocation's error.
    pub(crate) fn alloc_queue(&self, len: usize, kind: MemKind) -> Result<QMem> {
        match (kind, &self.gpu) {
            (MemKind::Gpu, Some(g)) => {
                let mem = match self.gpu_pool.take(len) {
                    Some(m) => {
                        let zeros = super::hostmem::zeroed::<u64>(len.div_ceil(8))?;
                        let src = crate::mem::MemLoc { kind: MemKind::Host, addr: zeros.as_ptr() as u64 };
                        // SAFETY: `m` is `len` bytes of GPU memory no QP or CQ uses any more (it was given back);
                        // `zeros` is as long and lives until the synchronize below. The copy follows, on the
                        // copier's stream, any copy its last user left in flight.
                        unsafe { g.copy_async(m.loc(0), src, len)? };
                        g.synchronize()?;
                        m
                    }
                    None => g.alloc(len)?,
                };
                Ok(QMem::Gpu(PooledGpuMem::new(mem, Some(self.gpu_pool.clone()))))
            }
            (MemKind::Gpu, None) => {
                Err(Error::InvalidArgument("queues in GPU memory need a GPU copier (EmuConfig::gpu)".into()))
            }
            (MemKind::Host, _) => Ok(QMem::Host(self.queue_mem.alloc(len)?)),
        }
    }

    /// Listening address of the wire, if any.
    pub(crate) fn wire_addr(&self) -> Option<SocketAddr> {
        self.wire.map(|w| w.listen)
    }

    /// A fresh QPN (24 bits), or `None` once all are used.
    pub(crate) fn alloc_qpn(&self) -> Option<u32> {
        alloc(&self.next_qpn, 0x00ff_ffff)
    }

    /// A fresh CQN (24 bits), or `None` once all are used.
    pub(crate) fn alloc_cqn(&self) -> Option<u32> {
        alloc(&self.next_cqn, 0x00ff_ffff)
    }

    /// A fresh PD number, or `None` once all are used.
    pub(crate) fn alloc_pdn(&self) -> Option<u32> {
        alloc(&self.next_pdn, 0x00ff_ffff)
    }
}

fn alloc(next: &AtomicU32, max: u32) -> Option<u32> {
    next.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| (n <= max).then_some(n + 1)).ok()
}
