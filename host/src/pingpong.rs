//! Host side of the ping-pong (the `pingpong` example and the GPU tests): two ranks in one process on one
//! emulated NIC, one RC QP each, connected to each other; the rank loop is `gdaki_device::pingpong::run`, on
//! GPU CTAs or host threads.

use std::sync::Arc;
use std::time::Duration;

use gdaki_device::pingpong::{PingPongArgs, Solo};
use gdaki_shared::handle::{ErrorReport, QpHandle};

use crate::cuda::{DeviceBuffer, KernelArg, LaunchConfig};
use crate::exec::{DataBuf, Executor};
use crate::mem::{MappedBuf, MemKind, MemLoc};
use crate::nic::emu::{Access, Cq, EmuConfig, EmuNic, Mr, Pd, Qp};
use crate::{Error, Result};

/// SQ size of each rank's QP, WQEBBs.
const WQE_CNT: u32 = 64;
/// Threads per CTA of the `gdaki_pingpong` kernel: they fill and check payloads; thread 0 drives the QP.
const CTA_THREADS: u32 = 256;
/// Bytes of control words per rank in the control buffer: semaphore, fetch-add result, counter, report,
/// QP handle (cpu executor).
const CTRL_STRIDE: usize = 256;
const SEM: usize = 0;
const SCRATCH: usize = 8;
const CHECKED: usize = 16;
const REPORT: usize = 64;
const QP_HANDLE: usize = 128;

/// Knobs of one ping-pong run.
#[derive(Clone, Copy, Debug)]
pub struct RunConfig {
    /// Payload bytes per message (1 ..= the `max_size` given to [`PingPong::new`]).
    pub size: usize,
    /// Measured round trips.
    pub iters: u32,
    /// Round trips run before measuring.
    pub warmup: u32,
    /// Seed of the payload generator.
    pub seed: u64,
    /// Bound of every device-side wait.
    pub timeout: Duration,
}

/// What one run measured.
#[derive(Clone, Debug)]
pub struct RunResult {
    /// Round-trip time of each measured iteration, ns (warm-up excluded).
    pub round_trip_ns: Vec<u64>,
    /// Payloads received and checked byte for byte, both ranks, warm-up included.
    pub checked: u64,
}

/// One rank's resources. Field order is drop order: MRs before the QP and the buffers they cover.
struct Rank {
    send_mr: Mr,
    recv_mr: Mr,
    sem_mr: Mr,
    scratch_mr: Mr,
    qp: Qp,
    _cq: Cq,
    send: DataBuf,
    _recv: DataBuf,
}

/// Two connected ranks, ready to run ping-pongs of up to `max_size` bytes.
pub struct PingPong {
    exec: Executor,
    nic: Arc<EmuNic>,
    _pd: [Pd; 2],
    ranks: [Rank; 2],
    /// Control words of both ranks, in queue memory (host memory device code reaches).
    ctrl: MappedBuf,
    /// Per-iteration times written by rank 0, in queue memory.
    times: MappedBuf,
    max_iters: usize,
    /// GPU only: QP handles and kernel arguments in GPU memory (the device updates the handles' counters on
    /// every post, so they must not live across PCIe).
    gpu_state: Option<DeviceBuffer>,
    /// A run failed: its WQEs may still land, and the QPs are in the error state.
    failed: bool,
}

impl PingPong {
    /// Opens an emulated NIC for `exec`, creates two PDs, CQs and RC QPs, connects them, and registers each
    /// rank's send and receive buffers (`max_size` bytes rounded up to 8), semaphore and fetch-add result.
    /// Room for `max_iters` timed iterations (warm-up included).
    ///
    /// # Errors
    /// Allocation, registration or CUDA errors; [`Error::InvalidArgument`] for a zero size.
    pub fn new(exec: Executor, max_size: usize, max_iters: usize) -> Result<Self> {
        let too_large = || Error::InvalidArgument(format!("ping-pong of {max_size} bytes × {max_iters} iterations"));
        if max_size == 0 || max_iters == 0 {
            return Err(Error::InvalidArgument("ping-pong size and iterations must be at least 1".into()));
        }
        let buf_len = max_size.checked_next_multiple_of(8).ok_or_else(too_large)?;
        let times_len = max_iters.checked_mul(8).ok_or_else(too_large)?;
        let queue_mem = exec.queue_memory();
        let nic = EmuNic::open(EmuConfig { queue_mem: queue_mem.clone(), gpu: exec.gpu_copier()?, wire: None })?;
        let ctrl = queue_mem.alloc(2 * CTRL_STRIDE)?;
        let times = queue_mem.alloc(times_len)?;
        let pds = [nic.alloc_pd()?, nic.alloc_pd()?];
        let mut ranks = Vec::with_capacity(2);
        for (r, pd) in pds.iter().enumerate() {
            let cq = nic.create_cq(WQE_CNT)?;
            let qp = nic.create_qp(pd, &cq, WQE_CNT)?;
            let send = exec.alloc_data(buf_len)?;
            let recv = exec.alloc_data(buf_len)?;
            let word =
                |off: usize| MemLoc { kind: MemKind::Host, addr: ctrl.device_addr() + (r * CTRL_STRIDE + off) as u64 };
            // SAFETY: every registered range is owned by `PingPong` (buffers, `ctrl`) and outlives the MRs,
            // which are dropped first (field order of `Rank` and `PingPong`).
            let (send_mr, recv_mr, sem_mr, scratch_mr) = unsafe {
                (
                    nic.reg_mr(pd, send.loc(), buf_len as u64, Access::LOCAL_WRITE)?,
                    nic.reg_mr(pd, recv.loc(), buf_len as u64, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?,
                    nic.reg_mr(pd, word(SEM), 8, Access::LOCAL_WRITE | Access::REMOTE_ATOMIC)?,
                    nic.reg_mr(pd, word(SCRATCH), 8, Access::LOCAL_WRITE)?,
                )
            };
            ranks.push(Rank { send_mr, recv_mr, sem_mr, scratch_mr, qp, _cq: cq, send, _recv: recv });
        }
        let ranks: [Rank; 2] = ranks.try_into().map_err(|_| Error::Emu("two ranks".into()))?;
        ranks[0].qp.connect(&ranks[1].qp.endpoint())?;
        ranks[1].qp.connect(&ranks[0].qp.endpoint())?;
        let handles = [ranks[0].qp.handle(), ranks[1].qp.handle()];
        let gpu_state = match &exec {
            Executor::Gpu(g) => {
                let b = g.alloc_device(GPU_ARGS + 2 * std::mem::size_of::<PingPongArgs>())?;
                b.copy_from_host(0, bytemuck::cast_slice(&handles))?;
                Some(b)
            }
            Executor::Cpu => {
                for (r, h) in handles.iter().enumerate() {
                    // SAFETY: `ctrl` is ours; the handle slot is 8-aligned and 96 of the 128 bytes left.
                    unsafe { (ctrl.host_ptr().add(r * CTRL_STRIDE + QP_HANDLE) as *mut QpHandle).write(*h) };
                }
                None
            }
        };
        Ok(Self { exec, nic, _pd: pds, ranks, ctrl, times, max_iters, gpu_state, failed: false })
    }

    /// The emulated NIC (for its statistics).
    pub fn nic(&self) -> &Arc<EmuNic> {
        &self.nic
    }

    fn ctrl_ptr(&self, rank: usize, off: usize) -> *mut u8 {
        // SAFETY: offsets stay inside the 2 × CTRL_STRIDE control buffer.
        unsafe { self.ctrl.host_ptr().add(rank * CTRL_STRIDE + off) }
    }

    fn args(&self, cfg: &RunConfig) -> [PingPongArgs; 2] {
        let ctrl_addr = |r: usize, off: usize| self.ctrl.device_addr() + (r * CTRL_STRIDE + off) as u64;
        let qp_addr = |r: usize| match &self.gpu_state {
            Some(b) => b.device_addr() + (r * std::mem::size_of::<QpHandle>()) as u64,
            None => ctrl_addr(r, QP_HANDLE),
        };
        std::array::from_fn(|r| {
            let (me, peer) = (&self.ranks[r], &self.ranks[r ^ 1]);
            PingPongArgs {
                qp: qp_addr(r),
                send: me.send_mr.handle(),
                recv: me.recv_mr.handle(),
                scratch: me.scratch_mr.handle(),
                peer_recv: peer.recv_mr.remote(),
                peer_sem: peer.sem_mr.remote(),
                sem: ctrl_addr(r, SEM),
                times: if r == 0 { self.times.device_addr() } else { 0 },
                report: ctrl_addr(r, REPORT),
                checked: ctrl_addr(r, CHECKED),
                size: cfg.size as u64,
                seed: cfg.seed,
                timeout_ns: cfg.timeout.as_nanos().min(u64::MAX as u128) as u64,
                iters: cfg.warmup + cfg.iters,
                rank: r as u32,
            }
        })
    }

    /// Runs `cfg.warmup + cfg.iters` round trips and returns the measured ones.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a size or iteration count beyond what [`PingPong::new`] set up;
    /// [`Error::Device`] when device code reported an error (error CQE, timed-out wait, wrong payload: the
    /// QPs are then in the error state, and later runs return [`Error::InvalidArgument`]); CUDA errors.
    pub fn run(&mut self, cfg: &RunConfig) -> Result<RunResult> {
        if self.failed {
            return Err(Error::InvalidArgument("an earlier run failed: create a new PingPong".into()));
        }
        let total = cfg.warmup.checked_add(cfg.iters).map_or(usize::MAX, |t| t as usize);
        if cfg.size == 0 || cfg.size > self.ranks[0].send.len() || total > self.max_iters || cfg.iters == 0 {
            return Err(Error::InvalidArgument(format!(
                "size {} must be 1..={} and warmup + iters {} at most {} (iters >= 1)",
                cfg.size,
                self.ranks[0].send.len(),
                total,
                self.max_iters
            )));
        }
        for r in 0..2 {
            // SAFETY: no device code runs between runs; the words are ours and aligned.
            unsafe {
                (self.ctrl_ptr(r, SEM) as *mut u64).write_volatile(0);
                (self.ctrl_ptr(r, CHECKED) as *mut u64).write_volatile(0);
                (self.ctrl_ptr(r, REPORT) as *mut ErrorReport).write_volatile(ErrorReport::default());
            }
        }
        // Cleared only when the run ends without error (a CUDA error returns early, too).
        self.failed = true;
        let args = self.args(cfg);
        match (&self.exec, &self.gpu_state) {
            (Executor::Gpu(g), Some(state)) => {
                state.copy_from_host(GPU_ARGS, bytemuck::cast_slice(&args))?;
                let kernel = g.kernel(crate::ptx::PTX, "gdaki_pingpong")?;
                let stream = g.new_stream()?;
                // SAFETY: the argument blocks are in GPU memory and name live buffers, handles and control
                // words owned by `self`; 2 CTAs keep both ranks resident at once.
                unsafe {
                    kernel.launch(
                        &stream,
                        &LaunchConfig::linear(2, CTA_THREADS),
                        &[KernelArg::U64(state.device_addr() + GPU_ARGS as u64)],
                    )?
                };
                // Device waits are bounded by `cfg.timeout` each; a kernel that outlives many of them is hung.
                stream.wait(cfg.timeout.saturating_mul(4).saturating_add(Duration::from_secs(10)))?;
            }
            _ => std::thread::scope(|s| {
                for a in &args {
                    // SAFETY: `a` names live buffers, handles and control words owned by `self`; the two ranks
                    // run on two threads at once.
                    s.spawn(move || unsafe { gdaki_device::pingpong::run(&Solo, a) });
                }
            }),
        }
        let mut errors = Vec::new();
        let mut checked = 0;
        for r in 0..2 {
            // SAFETY: the device code has finished; the words are ours and aligned.
            let (report, n) = unsafe {
                (
                    (self.ctrl_ptr(r, REPORT) as *const ErrorReport).read_volatile(),
                    (self.ctrl_ptr(r, CHECKED) as *const u64).read_volatile(),
                )
            };
            checked += n;
            match gdaki_device::Error::from_report(&report) {
                Some(e) => errors.push(format!("rank {r}: {e}")),
                None if report.kind != 0 => errors.push(format!("rank {r}: error report of unknown kind {report:?}")),
                None => {}
            }
        }
        if !errors.is_empty() {
            return Err(Error::Device(format!("{} ({checked} payloads checked before)", errors.join("; "))));
        }
        self.failed = false;
        // SAFETY: rank 0 wrote `total` times; the device code has finished.
        let times = unsafe { std::slice::from_raw_parts(self.times.host_ptr() as *const u64, total) };
        Ok(RunResult { round_trip_ns: times[cfg.warmup as usize..].to_vec(), checked })
    }
}

/// Offset of the kernel arguments in the GPU state buffer (after two QP handles, 256-byte aligned).
const GPU_ARGS: usize = 256;
const _: () = assert!(2 * std::mem::size_of::<QpHandle>() <= GPU_ARGS);
