//! The emulated mlx5 NIC: a software model of a ConnectX HCA that reads the same memory hardware would read.
//!
//! # What it models
//! - **Firmware commands**: CQs and QPs are made, connected, queried and destroyed only by the PRM's commands
//!   in DevX mailboxes ([`EmuNic::devx_cmd`]: QUERY_HCA_CAP, CREATE_CQ/DESTROY_CQ, CREATE_QP/DESTROY_QP,
//!   RST2INIT, INIT2RTR, RTR2RTS, 2ERR, QUERY_QP), over what DevX gets from the kernel: umems
//!   ([`EmuNic::devx_umem_reg`]), UAR pages ([`EmuNic::devx_alloc_uar`]) and PDs ([`EmuNic::alloc_pd`]).
//!   Every command is validated before it changes anything: lengths, opcode, `op_mod`, every bit outside the
//!   fields it takes zero (reserved bits, and fields it does not take or the emulator does not model), sizes
//!   within the emulator's limits, umem ids and ranges, alignments, UAR page, CQs, PD, `st` RC, `pm_state`
//!   MIGRATED, legal state transitions only, the address path. A refused command answers with the PRM's
//!   status and a [`cmd_syndrome`] of its own and changes nothing. [`EmuNic::create_cq`],
//!   [`EmuNic::create_qp`] and [`Qp::connect`] are built of these commands ([`crate::nic::devx`]), so there is
//!   one model of a QP and a CQ.
//! - **Queues** in the umems the commands name, where the user (or [`EmuConfig::queues`], for gdaki's own)
//!   put them: per QP a work queue (an optional receive queue, then the SQ ring of `wqe_cnt` × 64-byte
//!   WQEBBs) and a [`QpDbrec`] (word 1 = SQ counter), per CQ a ring of 64-byte CQEs and a [`CqDbrec`] (word 0
//!   = consumer index, 24 bits), in GPU memory (as DOCA GPUNetIO and NVSHMEM IBGDA place them; the default
//!   on the `gpu` executor) or in host memory from the configured [`QueueMemory`]; per QP a 4096-byte UAR
//!   page of its own with the doorbell/BlueFlame register at `UAR + 0x800`, always host memory that device
//!   code writes as MMIO. The NIC never writes a CQ ring before its first CQE: software fills it (gdaki's
//!   [`EmuNic::create_cq`] with `op_own = 0xF1`). The handles record the placement
//!   ([`Placement`](gdaki_shared::handle::Placement)).
//! - **A RoCE port**: port 1 with one GID, `fe80::` and the NIC's identifier ([`EmuNic::gid`]); INIT2RTR's
//!   path names the peer's NIC by its GID, and a NIC reached over the wire by the address its neighbour
//!   table holds for that GID ([`EmuNic::add_neighbor`]; [`Qp::connect`] fills it from the peer's
//!   [`Endpoint`]).
//! - **Doorbells**: one executor thread per NIC watches every RTS (or error-state) QP's doorbell register (8
//!   bytes, big-endian: the last posted WQE's `opmod_idx_opcode` and `qpn_ds`, as rdma-core rings, or the
//!   producer index with `ds` 0, as NVSHMEM IBGDA and gdaki's posters ring). A change is a doorbell; a
//!   BlueFlame write (the whole 64-byte WQEBB at 0x800) is one too. The new producer index is
//!   `wqe_idx + ceil(ds / 4)`; dbrec word 1 is cross-checked against it ([`Stats::dbrec_mismatches`]). A WQE
//!   whose doorbell never comes is never executed, whatever the dbrec says. A doorbell up to `wqe_cnt` WQEBBs
//!   behind the NIC is stale and ignored; one further off fails the QP ([`vendor::BAD_DOORBELL`]) with one
//!   error CQE for the WQE at the consumer index, behind the CQEs of requests still outstanding on the wire,
//!   and so does one that would take WQEs but names another QPN than the QP's ([`vendor::BAD_QPN`]: hardware
//!   would ring that QP, or none).
//! - **BlueFlame** WQEs are taken from the register, as hardware takes them, when the NIC can prove that the
//!   register's 64 bytes are one whole write of the WQE that word 0 announces: device code stores word 1 first,
//!   tagged with the WQE index ([`blueflame_word1`](gdaki_shared::prm::uar::blueflame_word1)), and word 0 last;
//!   the NIC leaves a random sentinel in words 1..8 after each doorbell and swaps them back as it reads them,
//!   word 1 last. Otherwise (a poster that overtook the NIC, a torn or untagged write, a WQE behind unrung ones)
//!   the WQEs are read from the ring, where software must write them too ([`Stats::blueflame_fallbacks`]). With a
//!   ring in host memory the register's WQE is compared with the ring's ([`Stats::blueflame_mismatches`]).
//!   A write that reaches past the 64-byte register (the handles' `bf_size`) fails the QP (`LOCAL_QP_OP_ERR`,
//!   [`vendor::BLUEFLAME_TOO_LARGE`]), and so does any BlueFlame write on a NIC opened with doorbell-only UAR
//!   pages ([`EmuConfig::blueflame`] `false`, handles with `bf_size` 0; [`vendor::BLUEFLAME_NO_BUFFER`]).
//! - **Queues in GPU memory** are reached through the [`GpuCopier`] only: on a doorbell the NIC first reads the
//!   announced WQEBBs from the SQ ring's mirror in host memory, which the copier fills as the dbrec moves
//!   ([`Stats::ring_mirrored`]), and fetches them from the ring with dbrec word 1 only when the mirror does not
//!   hold them in time or the copier keeps none (one read and one synchronize, [`Stats::ring_fetches`]); a
//!   BlueFlame WQE taken from the register needs neither. Each CQE is one published write of the copier (bytes
//!   0..56, then the word with `op_own`, after the data it reports), with no synchronize; the CQ's consumer index
//!   is re-read only when the index last read says the ring is full. Their memory goes back to the NIC when a QP
//!   or CQ is destroyed and is freed with the NIC (`cuMemFree` waits for every running kernel). On the `gpu`
//!   executor the copier runs small operations on a resident engine warp and long copies on the copy engines
//!   ([`CudaCopier`](crate::cuda::CudaCopier)); on the `cpu` executor `GDAKI_QUEUES=gpu` puts the queues in a
//!   [`SimGpu`]'s simulated GPU memory, to test this path without a GPU.
//! - **Validation** of every WQE as the PRM lays it out: opcode (NOP, RDMA_WRITE, RDMA_WRITE_IMM, RDMA_READ,
//!   ATOMIC_CS, ATOMIC_FA), opmod, `ds` against the opcode's shape and the ring, QPN, WQE index, `fm_ce_se`
//!   reserved bits (all → syndrome 0x02), message length (0x01), lkey / local bounds / `LOCAL_WRITE` (0x04),
//!   rkey / remote bounds / remote rights (0x13), atomic alignment (0x12). A failed WQE gets an error CQE
//!   (`mlx5_err_cqe`: REQ_ERR, syndrome, a [`vendor`] syndrome, `wqe_counter`, `s_wqe_opcode_qpn`) whether
//!   or not it asked for one; the QP moves to [`QpState::Error`] and every later WQE completes with a flush
//!   error (0x05). Nothing outside a registered region is ever written, and no byte pattern in the ring makes
//!   the NIC panic or hang.
//! - **Execution**, in order per QP, against the connected peer QP's registered memory, within the rights the
//!   peer's RST2INIT enabled (`rre`, `rwe`, `rae`: else 0x13) and the QP's `log_msg_max` (else 0x01): RDMA
//!   WRITE (SGE list or inline), WRITE with immediate (data, then a RESP_WR_IMM CQE with the immediate on the
//!   peer's receive CQ, `cqn_rcv`),
//!   RDMA READ, ATOMIC_FA and ATOMIC_CS on an 8-byte aligned remote word. A READ or atomic runs only after
//!   the QP's earlier writes are placed; a requester CQE (REQ, for WQEs with `CQ_UPDATE`) is written only
//!   after the data is placed. CQEs are written bytes first, the last 8 bytes (with `op_own`) last with
//!   Release ordering; the owner bit is the lap parity of the CQ producer index; the timestamp is
//!   nanoseconds since the NIC was opened.
//!
//! # Differences from hardware (deliberate or not yet modelled)
//! - **Atomics are host-endian**: the remote word is a host-order `u64` in memory (the "host-endianness
//!   atomic mode" of ConnectX), and the old value lands in the local SGE in host order. The WQE's atomic
//!   segment is big-endian, as on hardware.
//! - **An atomic whose result buffer is bad** (lkey, bounds, `LOCAL_WRITE`: 0x04) is never applied: the
//!   requester checks the buffer before the request leaves, on one NIC and over the wire alike, so the
//!   peer's word does not change for a signal that fails. Hardware may find out only when the response
//!   arrives, after the responder applied it. The 0x04 also comes before a misaligned or refused remote word's
//!   0x12 or 0x13.
//! - **No receive queue yet**: an inbound WRITE_IMM completes on the responder's receive CQ without consuming
//!   a receive WQE; its `wqe_counter` counts such completions. Hardware needs a posted receive (else RNR). A
//!   QP's receive queue (`rq_type` NON_ZERO) takes its place in the work queue and is never read.
//! - **Firmware** takes rings only in umems (no page lists, no doorbell records at device addresses), 64-byte
//!   CQEs only, one QP per UAR page, RC QPs with one path (`pm_state` MIGRATED), no optional parameters
//!   (`opt_param_mask` 0); it raises no completion events (`c_eqn` and the moderation fields are taken and
//!   ignored), and the retry attributes of RTR2RTS are not used ([`WireConfig::retry_timeout`] is the NIC's).
//!   Its syndromes are its own ([`cmd_syndrome`]). `mlx5dv_devx_umem_reg` takes an address; the emulated NIC
//!   takes the buffer ([`UmemBuf`]), to reach it as the hardware would.
//! - **Peers** are QPs of the same [`EmuNic`] (reached directly; a peer that is destroyed, in ERR, or not
//!   connected back makes the requester's WQE fail with 0x15 at once, without a timeout; one still in RESET or
//!   INIT leaves it waiting in the ring, as hardware would send it again, and fails it with 0x15 only after
//!   [`WireConfig::retry_timeout`], so that a requester may post before its peer's connect is done) or QPs of
//!   another NIC, in this process, another process or another host, reached over the **wire** (a TCP
//!   connection per QP pair carrying RC requests and ACK/NAK/READ/atomic responses; see `wire`). Over the
//!   wire the responder validates rkey, bounds and rights and NAKs a violation (0x13, 0x12), a WRITE's
//!   requester CQE waits for the responder's ACK, and a lost connection or a peer silent for
//!   [`WireConfig::retry_timeout`] (no answer, no byte taken, or a frame left half-sent) fails the oldest
//!   outstanding WQE with 0x15 and flushes the rest ([`Qp::wire_error`] says why). PSNs number messages rather
//!   than packets, and nothing is retransmitted (TCP is reliable). A peer faster than this NIC is held back
//!   by TCP's flow control: at most [`WireConfig::inbound_bytes`] of its frames wait for the executor.
//! - **CQ overrun**: a CQE due for an entry software has not released through the CQ dbrec moves the CQ to
//!   an error state (it takes no more CQEs) and the QP to [`QpState::Error`] ([`Stats::cq_overruns`]).
//! - **Vendor syndromes** are the emulator's own ([`vendor`]); `hw_err_synd` is zero.
//! - **GPU memory** MRs are reached through the [`GpuCopier`]: copies, writes and atomics are enqueued in one
//!   order and waited for only before what does not go through it (a direct host access, a READ, and over
//!   the wire the answers owed for a batch of requests: one wait, when they are encoded, covers every WRITE
//!   their ACK acknowledges and every atomic whose old value they carry); a CQE behind pending operations
//!   goes through the copier too, whichever memory its CQ is in. An atomic on GPU memory is the copier's (a GPU atomic on the `gpu`
//!   executor, atomic towards device code's atomics too), and so is an atomic on host memory the copier
//!   reaches (pinned and mapped into the GPU, [`GpuCopier::device_view`], looked up when the MR is
//!   registered): it runs behind the QP's earlier GPU writes without a host wait, and every atomic of the
//!   NIC on that word is the GPU's. Only pageable host memory takes the NIC's atomics on the host.
//! - **CQE timestamps** are nanoseconds since the NIC was opened, not device clock ticks.
//! - **Destroying a QP** ([`Qp`]'s drop) waits for the executor thread to let go of it, so that no WQE of it
//!   runs afterwards and its queue memory is released by the dropping thread, never by the executor (host
//!   memory is freed; GPU memory the NIC allocated goes back to the NIC's pool, to be freed when the NIC
//!   closes); the NIC's other commands are not held up by the wait. Over the wire its connection then ends,
//!   but only after the answers owed for requests it already executed (the ACK of a placed WRITE, an applied
//!   atomic's old value), as hardware sends them with the effect.
//!
//! # Use
//! ```
//! use std::sync::Arc;
//! use gdaki::mem::{HostQueueMemory, MemKind, MemLoc};
//! use gdaki::nic::emu::{Access, EmuConfig, EmuNic};
//!
//! let nic = EmuNic::open(EmuConfig::host()).unwrap();
//! let pd = nic.alloc_pd().unwrap();
//! // CREATE_CQ and CREATE_QP, then RST2INIT, INIT2RTR and RTR2RTS in `connect`.
//! let cq = nic.create_cq(64).unwrap();
//! let (a, b) = (nic.create_qp(&pd, &cq, 64).unwrap(), nic.create_qp(&pd, &cq, 64).unwrap());
//! a.connect(&b.endpoint()).unwrap();
//! b.connect(&a.endpoint()).unwrap();
//! let mut buf = vec![0u8; 4096];
//! let loc = MemLoc { kind: MemKind::Host, addr: buf.as_mut_ptr() as u64 };
//! // SAFETY: `buf` outlives `mr` and is not moved.
//! let mr = unsafe { nic.reg_mr(&pd, loc, 4096, Access::ALL) }.unwrap();
//! let (handle, remote) = (a.handle(), mr.remote()); // pass to device code
//! # let _ = (handle, remote);
//! drop(mr);
//! ```
//!
//! [`QpDbrec`]: gdaki_shared::prm::dbrec::QpDbrec
//! [`CqDbrec`]: gdaki_shared::prm::dbrec::CqDbrec

mod access;
mod completion;
mod cq;
mod exec;
mod executor;
mod fabric;
mod fault;
mod fw;
mod guard;
mod hostmem;
mod mr;
mod qmem;
mod qp;
mod sim_gpu;
mod sq;
mod stats;
mod verbs;
mod wire;
mod wqe;

// The WQE parser and the wire decoder on arbitrary bytes, for fuzz/ (feature `fuzzing`); not an API.
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_utils::Backoff;

use crate::mem::{GpuCopier, HostQueueMemory, MemKind, MemLoc, QueueMemory};
use crate::{EmuError, Error, Result};

pub use cq::MAX_CQE;
pub use fault::vendor;
pub use fw::{cmd_syndrome, DevxUar, UmemBuf};
pub use mr::{Access, Mr, Pd};
pub use qp::ENDPOINT_BYTES;
pub use qp::{gid_of, nic_of_gid, Endpoint, QpState, MAX_WQE_CNT, MIN_WQE_CNT};
pub use sim_gpu::SimGpu;
pub use stats::Stats;
pub use verbs::{Cq, Qp};
pub use wire::WireConfig;

use fabric::Fabric;
use guard::{lock, write};
use mr::MrEntry;
use qp::QpInner;

/// How to open an [`EmuNic`].
#[derive(Clone)]
pub struct EmuConfig {
    /// Where queue memory (SQ rings, dbrecs, UAR pages, CQ rings) comes from: [`HostQueueMemory`] for the
    /// `cpu` executor, pinned host memory mapped into the GPU for the `gpu` executor.
    pub queue_mem: Arc<dyn QueueMemory>,
    /// How to reach MRs in GPU memory (and queues in GPU memory); `None`: only host-memory MRs can be
    /// registered.
    pub gpu: Option<Arc<dyn GpuCopier>>,
    /// Where SQ rings, their dbrecs, CQ rings and their dbrecs go: [`MemKind::Host`] (from `queue_mem`) or
    /// [`MemKind::Gpu`] (from `gpu`, which it needs), as DOCA GPUNetIO and NVSHMEM IBGDA place them by
    /// default ([`EmuConfig::for_executor`] does too on the `gpu` executor). UAR pages (doorbell and
    /// BlueFlame register) are always from `queue_mem`: device code writes them as MMIO. The QP and CQ
    /// handles record the choice ([`Placement`](gdaki_shared::handle::Placement)).
    pub queues: MemKind,
    /// How to reach QPs of other NICs (other processes or hosts); `None`: only QPs of this NIC connect.
    pub wire: Option<WireConfig>,
    /// Whether the UAR pages have a BlueFlame buffer: `true` (the default) gives handles a `bf_size` of one
    /// WQEBB (the emulated register); `false` models a doorbell-only UAR (`mlx5dv_qp.bf.size` 0, as a UAR
    /// allocated non-cached gives), whose handles say `bf_size` 0 so that device code rings by doorbell, and
    /// on which a BlueFlame write fails the QP (`LOCAL_QP_OP_ERR`, [`vendor::BLUEFLAME_NO_BUFFER`]).
    pub blueflame: bool,
}

impl EmuConfig {
    /// Host queue memory, no GPU, no wire: everything for the `cpu` executor in one process.
    pub fn host() -> Self {
        Self { queue_mem: Arc::new(HostQueueMemory), gpu: None, queues: MemKind::Host, wire: None, blueflame: true }
    }

    /// The configuration for executor `exec`: its queue memory and GPU copier, no wire, and the queues where
    /// the environment variable [`QUEUES_ENV`] says (`gpu` or `host`). Unset, they are in GPU memory on the
    /// `gpu` executor (as the hardware stacks place them) and in host memory on the `cpu` executor;
    /// `GDAKI_QUEUES=host` on the `gpu` executor puts them in pinned host memory mapped into the GPU, and
    /// `GDAKI_QUEUES=gpu` on the `cpu` executor puts
    /// them in a [`SimGpu`]'s simulated GPU memory, which the NIC reaches only through copies, as on a GPU:
    /// the GPU-memory path, tested without one (without SQ-ring mirrors: see [`SimGpu::with_sq_mirrors`]).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a [`QUEUES_ENV`] other than `gpu` or `host`; the CUDA driver's error
    /// creating the copier's stream; [`Error::Emu`] when the simulator's thread cannot start.
    pub fn for_executor(exec: &crate::exec::Executor) -> Result<Self> {
        let asked = queues_from_env()?;
        let (gpu, queues): (Option<Arc<dyn GpuCopier>>, MemKind) = match (exec.gpu_copier()?, asked) {
            (None, Some(MemKind::Gpu)) => (Some(Arc::new(SimGpu::new()?)), MemKind::Gpu),
            (None, _) => (None, MemKind::Host),
            (Some(g), Some(k)) => (Some(g), k),
            (Some(g), None) => (Some(g), MemKind::Gpu),
        };
        Ok(Self { queue_mem: exec.queue_memory(), gpu, queues, wire: None, blueflame: true })
    }

    /// [`EmuConfig::host`], or with [`QUEUES_ENV`]`=gpu` its queues in a [`SimGpu`]'s simulated GPU memory
    /// (as [`EmuConfig::for_executor`] on the `cpu` executor): how the project's tests run every emulated-NIC
    /// test with both placements.
    ///
    /// # Errors
    /// As [`EmuConfig::for_executor`].
    pub fn host_or_env() -> Result<Self> {
        Self::for_executor(&crate::exec::Executor::Cpu)
    }

    /// This configuration with a wire.
    pub fn with_wire(self, wire: WireConfig) -> Self {
        Self { wire: Some(wire), ..self }
    }
}

impl std::fmt::Debug for EmuConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmuConfig")
            .field("gpu", &self.gpu.is_some())
            .field("queues", &self.queues)
            .field("wire", &self.wire)
            .field("blueflame", &self.blueflame)
            .finish_non_exhaustive()
    }
}

/// The environment variable that places the emulated NIC's queues, like NVSHMEM's
/// `IBGDA_FORCE_NIC_BUF_MEMTYPE`: `gpu` (the default on the `gpu` executor) or `host` (the default on the
/// `cpu` executor). Read by [`EmuConfig::for_executor`]; the programs' `--queues` flag sets it.
pub const QUEUES_ENV: &str = "GDAKI_QUEUES";

/// The placement [`QUEUES_ENV`] asks for, if set.
fn queues_from_env() -> Result<Option<MemKind>> {
    match std::env::var(QUEUES_ENV) {
        Err(std::env::VarError::NotPresent) => Ok(None),
        // Not UTF-8: neither `gpu` nor `host`, and not unset either.
        Err(std::env::VarError::NotUnicode(v)) => {
            Err(Error::InvalidArgument(format!("{QUEUES_ENV}={v:?}: queues must be gpu or host")))
        }
        Ok(v) => match v.as_str() {
            "gpu" => Ok(Some(MemKind::Gpu)),
            "host" => Ok(Some(MemKind::Host)),
            _ => Err(Error::InvalidArgument(format!("{QUEUES_ENV}={v:?}: queues must be gpu or host"))),
        },
    }
}

/// An emulated mlx5 NIC: the parent of its PDs, MRs, CQs and QPs, and the owner of the executor thread.
///
/// Every child holds an `Arc` of it, so the NIC (and its thread) lives until the last child is dropped; the
/// thread is stopped and joined when the NIC is dropped.
pub struct EmuNic {
    fab: Arc<Fabric>,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// The wire's listener thread, if any.
    acceptor: Mutex<Option<JoinHandle<()>>>,
    /// The UAR page the CQs of [`EmuNic::create_cq`] name, once allocated.
    cq_uar: Mutex<Option<u32>>,
}

impl std::fmt::Debug for EmuNic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmuNic").field("id", &self.fab.id).finish_non_exhaustive()
    }
}

impl EmuNic {
    /// Opens a NIC and starts its executor thread, and with a wire its listener.
    ///
    /// # Errors
    /// [`Error::Emu`] when a thread cannot be started, the wire's address cannot be bound (the message names
    /// it), or the OS has no random numbers for the NIC's identifier; [`Error::InvalidArgument`] for a wire
    /// that listens on an unspecified address (0.0.0.0 or ::, which peers cannot dial) or has a retry timeout
    /// over [`WireConfig::MAX_RETRY_TIMEOUT`].
    pub fn open(cfg: EmuConfig) -> Result<Arc<EmuNic>> {
        let mut id = 0u64;
        while id == 0 {
            let mut b = [0u8; 8];
            getrandom::fill(&mut b).map_err(|e| EmuError::os("no random NIC identifier", e))?;
            id = u64::from_ne_bytes(b);
        }
        if let Some(w) = cfg.wire {
            w.check()?;
        }
        if cfg.queues == MemKind::Gpu && cfg.gpu.is_none() {
            return Err(Error::InvalidArgument(
                "queues in GPU memory need a GPU copier (EmuConfig::gpu): the cpu executor keeps them in host memory"
                    .into(),
            ));
        }
        let listener = match cfg.wire {
            Some(w) => Some(
                wire::acceptor::bind(w.listen)
                    .map_err(|e| EmuError::os(format!("cannot listen on {} for the wire", w.listen), e))?,
            ),
            None => None,
        };
        let wire = match (&listener, cfg.wire) {
            (Some(l), Some(w)) => {
                Some(WireConfig { listen: l.local_addr().map_err(|e| EmuError::os("wire listener address", e))?, ..w })
            }
            _ => None,
        };
        let fab = Arc::new(Fabric::new(id, cfg.queue_mem, cfg.gpu, cfg.queues, wire, cfg.blueflame));
        // Unbounded as a channel, bounded by `inflow`, which counts bytes (frames differ in size by 6000×).
        let (tx, rx) = std::sync::mpsc::channel();
        let inflow = Arc::new(wire::link::Inflow::new(wire.map_or(WireConfig::INBOUND_BYTES, |w| w.inbound_bytes)));
        let thread = executor::spawn(fab.clone(), rx, inflow.clone())
            .map_err(|e| EmuError::os("starting the executor thread", e))?;
        let mailbox = wire::link::Mailbox { tx, executor: thread.thread().clone(), inflow };
        let _ = fab.mailbox.set(mailbox.clone());
        let nic = Arc::new(EmuNic {
            fab,
            thread: Mutex::new(Some(thread)),
            acceptor: Mutex::new(None),
            cq_uar: Mutex::new(None),
        });
        if let (Some(l), Some(w)) = (listener, wire) {
            let t = wire::acceptor::spawn_acceptor(l, Arc::downgrade(&nic.fab), mailbox, w.retry_timeout)
                .map_err(|e| EmuError::os("starting the wire listener thread", e))?;
            *lock(&nic.acceptor) = Some(t);
        }
        Ok(nic)
    }

    /// This NIC's identifier: random and nonzero (the `nic` of its QPs' [`Endpoint`]s).
    pub fn id(&self) -> u64 {
        self.fab.id
    }

    /// Where this NIC listens for QPs of other NICs (the address bound, with the port picked for port 0);
    /// `None` without a wire.
    pub fn wire_addr(&self) -> Option<SocketAddr> {
        self.fab.wire_addr()
    }

    pub(crate) fn retry_timeout(&self) -> Duration {
        self.fab.retry_timeout()
    }

    pub(crate) fn mailbox(&self) -> Result<wire::link::Mailbox> {
        // Set in `open` before the NIC is returned.
        self.fab.mailbox.get().cloned().ok_or(Error::Emu(EmuError::NoExecutor))
    }

    /// Takes the first failure a drop of this NIC's QPs met since the last call (the executor did not let go
    /// of a QP in time: [`EmuError::Unresponsive`]); each was logged with `tracing` when it happened, as every
    /// backend's drops do.
    pub fn take_drop_error(&self) -> Option<Error> {
        self.fab.drops.take()
    }

    /// Counters since the NIC was opened.
    pub fn stats(&self) -> Stats {
        let mut s = self.fab.stats.snapshot();
        if let Some(mb) = self.fab.mailbox.get() {
            let (queued, peak, waits) = mb.inflow.levels();
            (s.inbound_queued, s.inbound_peak, s.inbound_waits) = (queued as u64, peak as u64, waits);
        }
        s
    }

    /// Stops (`true`) or resumes (`false`) the executor thread between two passes, for tests that need the NIC
    /// to fall behind its wire (e.g. to watch the inbound queue fill and its readers wait): while held, no
    /// doorbell, WQE or inbound frame is handled. Holding returns once the pass under way (if any) has ended,
    /// so that nothing rung after it runs; it waits [`EXECUTOR_SYNC_TIMEOUT`] at most (then logs a warning) and
    /// not at all when the thread is not running. Dropping a QP waits for the executor, so resume it first.
    #[doc(hidden)]
    pub fn hold_executor(&self, held: bool) {
        self.fab.held.store(held, Ordering::SeqCst);
        // The executor may be asleep in its idle loop (or held): wake it, to resume or to see the hold.
        if let Some(t) = lock(&self.thread).as_ref() {
            t.thread().unpark();
        }
        if held && !self.wait_executor_until(|| self.fab.holding.load(Ordering::SeqCst)) {
            tracing::warn!("emulated NIC: the executor did not stop within {EXECUTOR_SYNC_TIMEOUT:?}");
        }
    }

    /// Makes the next INIT2RTR of this NIC that would start a thread to dial a peer's NIC fail as if that
    /// thread could not start (`INTERNAL_ERR`, [`cmd_syndrome::WIRE_THREAD`]), for tests of a connect that
    /// fails after RST2INIT. An INIT2RTR towards a QP of this NIC, or one that waits for the peer to dial,
    /// starts no thread and leaves it armed.
    #[doc(hidden)]
    pub fn fail_next_dialer(&self) {
        self.fab.fail_dialer.store(true, Ordering::SeqCst);
    }

    /// Whether the executor thread runs (false only if it panicked, which is a bug of the emulator).
    pub fn executor_alive(&self) -> bool {
        self.fab.running.load(Ordering::Acquire)
    }

    fn check_parent(&self, nic: &Arc<EmuNic>, what: &str) -> Result<()> {
        if nic.fab.id == self.fab.id {
            Ok(())
        } else {
            Err(Error::InvalidArgument(format!("{what} belongs to NIC {}, not to NIC {}", nic.fab.id, self.fab.id)))
        }
    }

    /// Registers `len` bytes at `loc` in `pd` with rights `access` (`ibv_reg_mr`). The MR's lkey and rkey are
    /// one key, laid out as an mlx5 mkey (`index << 8 | variant`).
    ///
    /// # Safety
    /// Until the returned [`Mr`] is dropped, the NIC reads and writes `loc.addr .. loc.addr + len` from its
    /// executor thread whenever a WQE names it: for [`crate::mem::MemKind::Host`], the range must stay
    /// valid, allocated host memory for that long; for [`crate::mem::MemKind::Gpu`], a live allocation that
    /// the configured [`GpuCopier`] can copy to and from.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`]: `pd` of another NIC, zero length, null address, a range that wraps, unknown
    /// access bits, `REMOTE_WRITE`/`REMOTE_ATOMIC` without `LOCAL_WRITE` (as `ibv_reg_mr`'s EINVAL), or GPU
    /// memory without a copier. [`Error::Emu`] when the key table is full (2^24 - 1 MRs).
    pub unsafe fn reg_mr(self: &Arc<Self>, pd: &Pd, loc: MemLoc, len: u64, access: Access) -> Result<Mr> {
        self.check_parent(&pd.nic, "PD")?;
        mr::check_reg(loc, len, access, self.fab.gpu.is_some()).map_err(Error::InvalidArgument)?;
        // Host memory the copier reaches takes the NIC's atomics on the GPU (`MrEntry::atomic_view`).
        let gpu_view = match (&self.fab.gpu, loc.kind) {
            (Some(g), crate::mem::MemKind::Host) => g.device_view(loc.addr, len),
            _ => None,
        };
        // GPU memory a peer process on this host may read itself (`WireConfig::gpu_ipc`).
        let export = match (&self.fab.gpu, loc.kind, self.fab.wire) {
            (Some(g), crate::mem::MemKind::Gpu, Some(w)) if w.gpu_ipc => g.export(loc.addr, len),
            _ => None,
        };
        let entry = MrEntry { pdn: pd.pdn, loc, len, access, gpu_view, export };
        let key = write(&self.fab.mrs).insert(entry).ok_or(Error::Emu(EmuError::Exhausted("MR keys")))?;
        Ok(Mr { nic: self.clone(), key, loc, len })
    }

    /// Removes MR `key`: after this returns, no WQE can touch its memory (the write lock waits for a WQE that
    /// is using it, and the copier is synchronized for copies it enqueued). For an MR a peer process may copy
    /// from (the wire's same-host path), also waits until it no longer can ([`EmuNic::wait_ipc_answers`]),
    /// then withdraws the export ([`GpuCopier::unexport`](crate::mem::GpuCopier::unexport)).
    pub(crate) fn dereg_mr(&self, key: u32) {
        let removed = write(&self.fab.mrs).remove(key);
        if let (Some(export), Some(g)) = (removed.as_ref().and_then(|e| e.export), &self.fab.gpu) {
            self.wait_ipc_answers(key);
            g.unexport(&export);
        }
        if removed.is_some() {
            if let Some(g) = &self.fab.gpu {
                if let Err(e) = g.synchronize() {
                    tracing::warn!("emulated NIC: synchronize at MR deregistration failed: {e}");
                }
            }
        }
    }

    /// Waits until a peer process can no longer copy out of MR `key` ([`IpcRefs`]): every WRITE sent from
    /// it by mapping answered, and a retry timeout past any that will never be answered; at most the retry
    /// timeout and 100 ms in all, which only a peer that stopped answering reaches (a warning says so).
    ///
    /// [`IpcRefs`]: wire::requester::IpcRefs
    fn wait_ipc_answers(&self, key: u32) {
        let bound = self.fab.retry_timeout() + std::time::Duration::from_millis(100);
        let t = std::time::Instant::now();
        loop {
            let busy = match lock(&self.fab.ipc_refs).get(&key) {
                None => false,
                Some(r) => r.unanswered > 0 || r.quiet_after.is_some_and(|q| q > std::time::Instant::now()),
            };
            if !busy {
                lock(&self.fab.ipc_refs).remove(&key);
                return;
            }
            if t.elapsed() > bound {
                tracing::warn!(
                    "emulated NIC: an MR in GPU memory was deregistered while a peer process had not answered WRITEs \
                     it copies from that memory within {bound:?}: it may still read it"
                );
                lock(&self.fab.ipc_refs).remove(&key);
                return;
            }
            std::thread::sleep(std::time::Duration::from_micros(50));
        }
    }

    pub(crate) fn qp(&self, qpn: u32) -> Option<Arc<QpInner>> {
        guard::read(&self.fab.qps).get(&qpn).cloned()
    }

    /// Removes QP `qpn` from the map the executor refreshes its list from; returns the generation of the QP
    /// map after the removal (see [`EmuNic::wait_for_executor`]).
    pub(crate) fn remove_qp(&self, qpn: u32) -> u64 {
        write(&self.fab.qps).remove(&qpn);
        self.fab.qp_gen.fetch_add(1, Ordering::Release) + 1
    }

    /// Waits until the executor thread has acknowledged QP-map generation `gen` (refreshed its list to it or
    /// later, then swept once), so that it holds no QP removed before `gen`. Returns at once when the thread
    /// is not running (it holds nothing then, or is unwinding from a bug), and after
    /// [`EXECUTOR_SYNC_TIMEOUT`] at most, with a warning, so that a stuck executor cannot hang the caller.
    pub(crate) fn wait_for_executor(&self, gen: u64) {
        let acked = || self.fab.acked_gen.load(Ordering::Acquire) >= gen;
        if acked() || !self.executor_alive() {
            return;
        }
        // The executor may be asleep in its idle loop; wake it rather than wait for its sleep to end.
        if let Some(t) = lock(&self.thread).as_ref() {
            t.thread().unpark();
        }
        if !self.wait_executor_until(acked) {
            self.fab.drops.record("an emulated QP", Error::Emu(EmuError::Unresponsive(EXECUTOR_SYNC_TIMEOUT)));
        }
    }

    /// Waits until `done` holds or the executor thread is not running (true), or until
    /// [`EXECUTOR_SYNC_TIMEOUT`] has passed (false).
    fn wait_executor_until(&self, done: impl Fn() -> bool) -> bool {
        let start = Instant::now();
        let backoff = Backoff::new();
        while !done() {
            if !self.executor_alive() {
                return true;
            }
            if start.elapsed() > EXECUTOR_SYNC_TIMEOUT {
                return false;
            }
            if backoff.is_completed() {
                std::thread::sleep(Duration::from_micros(20));
            } else {
                backoff.snooze();
            }
        }
        true
    }
}

/// The longest [`EmuNic::wait_for_executor`] waits. A sweep takes microseconds unless a doorbell announced a
/// batch of huge WQEs; this only keeps a stuck executor from hanging `Qp::drop`.
const EXECUTOR_SYNC_TIMEOUT: Duration = Duration::from_secs(5);

impl Drop for EmuNic {
    fn drop(&mut self) {
        self.fab.stop.store(true, Ordering::Release);
        if let Some(t) = lock(&self.acceptor).take() {
            let _ = t.join();
        }
        if let Some(t) = lock(&self.thread).take() {
            t.thread().unpark();
            // A panicked executor was already reported by its thread.
            let _ = t.join();
        }
        // QPs made by commands and never destroyed: their peers across the wire see the connections end, and
        // the links' threads stop.
        for qp in guard::read(&self.fab.qps).values() {
            if let Some(link) = qp.link.get() {
                link.close();
            }
        }
    }
}
