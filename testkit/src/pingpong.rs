//! Host side of the ping-pong (the `pingpong` example and the GPU tests): two ranks, one RC QP each, connected
//! to each other; the rank loop is `gdaki_testkit_kernels::pingpong::run`, on GPU CTAs or host threads.
//!
//! Either both ranks live in this process, on one emulated NIC ([`PingPong::new`]), or this process is one
//! rank and its peer another process or host, reached over the emulated NIC's wire ([`PingPong::new_rank`]);
//! the two exchange their QP and MR info through a bootstrap and synchronize before each run.

use std::time::Duration;

use gdaki_device::launch::DevPtr;
use gdaki_shared::handle::{ErrorReport, QpHandle, RemoteMr};
use gdaki_testkit_kernels::entries;
use gdaki_testkit_kernels::pingpong::{Phases, PingPongArgs};

use gdaki::cuda::DeviceBuffer;
use gdaki::exec::{DataBuf, Executor};
use gdaki::launch::{LaunchConfig, Module};
use gdaki::mem::MemLoc;
use gdaki::nic::emu::WireConfig;
use gdaki::nic::{Access, Cq, Endpoint, Mr, Nic, NicSpec, Pd, Qp, ENDPOINT_BYTES};
use gdaki::{Error, Result};

/// SQ size of each rank's QP, WQEBBs.
const WQE_CNT: u32 = 64;
/// Threads per CTA of the `gdaki_pingpong` kernel: they fill and check payloads; thread 0 drives the QP.
const CTA_THREADS: u32 = 256;
/// Bytes of control words per rank in the control buffer: semaphore, fetch-add result, counter, report,
/// QP handle (cpu executor).
const CTRL_STRIDE: usize = 512;
const SEM: usize = 0;
const SCRATCH: usize = 8;
const CHECKED: usize = 16;
const REPORT: usize = 64;
const QP_HANDLE: usize = 128;
const _: () = assert!(QP_HANDLE + std::mem::size_of::<QpHandle>() <= CTRL_STRIDE);
const _: () = assert!(REPORT + std::mem::size_of::<ErrorReport>() <= QP_HANDLE);

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
    /// Send each message as one RDMA WRITE by BlueFlame (`Qp::post_bf`: the WQE travels in the BlueFlame
    /// register), with no fetch-add: the peer polls the payload's word, as perftest's `ib_write_lat` polls
    /// its buffer. `size` must then be [`BLUEFLAME_SIZE`]: one word, which the NIC places whole, and which
    /// matches the one its half of the receive buffer held (two iterations earlier, or zero at a run's
    /// start) by chance with probability 2^-64.
    pub blueflame: bool,
}

/// The payload size a BlueFlame run takes ([`RunConfig::blueflame`]), bytes.
pub const BLUEFLAME_SIZE: usize = 8;

/// What one run measured.
#[derive(Clone, Debug)]
pub struct RunResult {
    /// Round-trip time of each measured iteration, ns (warm-up excluded).
    pub round_trip_ns: Vec<u64>,
    /// Where each measured round trip went, when both ranks ran in this process (else empty): see
    /// [`Split`].
    pub split: Vec<Split>,
    /// Payloads received and checked byte for byte, both ranks, warm-up included.
    pub checked: u64,
}

/// One measured round trip cut at the ranks' own clock readings (ns; one GPU clock for both ranks, or one host
/// clock): what device code spent and what the NIC took in between. The parts add up to the round trip: a
/// reading earlier than the cut before it (on the `cpu` executor, a rank's thread descheduled between ringing
/// and reading the clock, so that the peer saw its semaphore first) is taken at that cut, its part 0 and the
/// time counted in the part before.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Split {
    /// Rank 0's `put_with_signal` (storing the WQEs and ringing).
    pub post0: u64,
    /// From there until rank 1 saw its semaphore: the NIC's leg and rank 1's poll.
    pub leg01: u64,
    /// Rank 1 from seeing its semaphore to its own send returning: the post (the payload is checked after
    /// it, off the round trip's path).
    pub turn1: u64,
    /// From there until rank 0 saw its semaphore.
    pub leg10: u64,
}

impl Split {
    /// The split of one round trip from both ranks' records.
    fn of(r0: &Phases, r1: &Phases) -> Self {
        let (start, end) = (r0.send_start, r0.seen.max(r0.send_start));
        let mut at = start;
        // The time from the last cut to `t`, with `t` kept within `at..=end`; `t` becomes the cut.
        let mut part = |t: u64| {
            let t = t.clamp(at, end);
            let d = t - at;
            at = t;
            d
        };
        Self { post0: part(r0.send_done), leg01: part(r1.seen), turn1: part(r1.send_done), leg10: part(end) }
    }
}

/// One rank's resources. Field order is drop order: MRs before the QP and the buffers they cover.
struct Rank {
    /// 0 or 1.
    id: u32,
    /// The peer's receive buffer and semaphore.
    peer_recv: RemoteMr,
    peer_sem: RemoteMr,
    send_mr: Mr,
    recv_mr: Mr,
    sem_mr: Mr,
    scratch_mr: Mr,
    qp: Qp,
    _cq: Cq,
    send: DataBuf,
    recv: DataBuf,
}

impl Rank {
    /// Creates the rank's CQ and QP in `pd` and registers its buffers (`buf_len` bytes to send, twice that to
    /// receive into) and its control words (slot `slot` of `ctrl`). Not connected yet.
    fn new(nic: &Nic, pd: &Pd, exec: &Executor, id: u32, buf_len: usize, ctrl: &DataBuf, slot: usize) -> Result<Self> {
        let cq = nic.create_cq(WQE_CNT)?;
        let qp = nic.create_qp(pd, &cq, WQE_CNT)?;
        let send = exec.alloc_data(buf_len)?;
        // Two halves: iteration k's message lands in half k % 2 (see the kernel's module docs).
        let recv = exec.alloc_data(2 * buf_len)?;
        let at = ctrl.loc();
        let word = |off: usize| MemLoc { kind: at.kind, addr: at.addr + (slot * CTRL_STRIDE + off) as u64 };
        // SAFETY: every registered range is owned by the `PingPong` (buffers, `ctrl`) and outlives the MRs,
        // which are dropped first (field order of `Rank` and `PingPong`).
        let (send_mr, recv_mr, sem_mr, scratch_mr) = unsafe {
            (
                nic.reg_mr(pd, send.loc(), buf_len as u64, Access::LOCAL_WRITE)?,
                nic.reg_mr(pd, recv.loc(), 2 * buf_len as u64, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?,
                nic.reg_mr(pd, word(SEM), 8, Access::LOCAL_WRITE | Access::REMOTE_ATOMIC)?,
                nic.reg_mr(pd, word(SCRATCH), 8, Access::LOCAL_WRITE)?,
            )
        };
        let none = RemoteMr::default();
        Ok(Rank { id, peer_recv: none, peer_sem: none, send_mr, recv_mr, sem_mr, scratch_mr, qp, _cq: cq, send, recv })
    }

    /// What the peer needs: the QP's endpoint, the receive buffer and the semaphore.
    fn info(&self) -> PeerInfo {
        PeerInfo { endpoint: self.qp.endpoint(), recv: self.recv_mr.remote(), sem: self.sem_mr.remote() }
    }

    /// Connects to the peer described by `p`.
    fn connect(&mut self, p: &PeerInfo) -> Result<()> {
        self.qp.connect(&p.endpoint)?;
        self.peer_recv = p.recv;
        self.peer_sem = p.sem;
        Ok(())
    }
}

/// A rank's QP and MR info as the other rank needs it, and its byte form for a bootstrap exchange.
struct PeerInfo {
    endpoint: Endpoint,
    recv: RemoteMr,
    sem: RemoteMr,
}

/// Bytes of [`PeerInfo::to_bytes`]: magic, endpoint, two `RemoteMr`s.
const INFO_BYTES: usize = 8 + ENDPOINT_BYTES + 2 * std::mem::size_of::<RemoteMr>();
/// "GDKPPNG1": tells a ping-pong peer's info from other bytes on the same bootstrap.
const INFO_MAGIC: u64 = 0x4744_4b50_504e_4731;

/// What a rank sends in place of its info or its setup status when its own setup failed: this prefix, then the
/// reason as text.
const FAILED_MAGIC: &[u8] = b"GDKPPFAIL:";
/// A rank's setup status when it connected.
const SETUP_OK: &[u8] = b"GDKPPOK";

/// The bytes that tell the peer this rank's setup failed with `e`.
fn failure_bytes(e: &Error) -> Vec<u8> {
    [FAILED_MAGIC, e.to_string().as_bytes()].concat()
}

/// The error of a peer that sent `b` instead of what its setup should have sent: its reason if `b` is
/// [`failure_bytes`], else what `b` is, never the bytes themselves.
fn peer_failed(b: &[u8]) -> Error {
    match b.strip_prefix(FAILED_MAGIC) {
        Some(why) => Error::Bootstrap(format!("the peer's setup failed: {}", String::from_utf8_lossy(why))),
        None => Error::InvalidArgument(format!(
            "ping-pong peer: {} bytes that are not a ping-pong setup's (is the peer a pingpong of this version?)",
            b.len()
        )),
    }
}

impl PeerInfo {
    fn to_bytes(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(INFO_BYTES);
        b.extend_from_slice(&INFO_MAGIC.to_le_bytes());
        b.extend_from_slice(&self.endpoint.to_bytes());
        b.extend_from_slice(bytemuck::bytes_of(&self.recv));
        b.extend_from_slice(bytemuck::bytes_of(&self.sem));
        b
    }

    fn from_bytes(b: &[u8]) -> Result<Self> {
        if b.len() != INFO_BYTES || b[..8] != INFO_MAGIC.to_le_bytes() {
            return Err(peer_failed(b));
        }
        let e = 8 + ENDPOINT_BYTES;
        let r = std::mem::size_of::<RemoteMr>();
        Ok(Self {
            endpoint: Endpoint::from_bytes(&b[8..e])?,
            recv: bytemuck::pod_read_unaligned(&b[e..e + r]),
            sem: bytemuck::pod_read_unaligned(&b[e + r..e + 2 * r]),
        })
    }
}

/// How a rank of a two-process ping-pong swaps bytes with its peer (a bootstrap's all-gather, or a pipe in
/// tests): called with this rank's bytes, returns the peer's. Also the barrier before each run.
pub type Exchange = Box<dyn FnMut(&[u8]) -> Result<Vec<u8>> + Send>;

/// Connected ranks, ready to run ping-pongs of up to `max_size` bytes: both ranks, or this process's one.
pub struct PingPong {
    exec: Executor,
    nic: Nic,
    _pd: Vec<Pd>,
    /// The ranks that run here (slot `i` of the control buffer is `ranks[i]`).
    ranks: Vec<Rank>,
    /// For a rank whose peer is in another process: the exchange with it.
    exchange: Option<Exchange>,
    /// Control words of both ranks, where the ranks' payloads are (GPU memory for the `gpu` executor, as a
    /// user's kernel keeps its signals): the semaphore each rank polls and the NIC's fetch-add targets, and
    /// the counters and report the host reads once the run is over. In host memory, the rank's stores to
    /// them would cross PCIe just before its next post, whose release waits for them.
    ctrl: DataBuf,
    /// Per-iteration [`Phases`] of each rank here (slot order, `max_iters` records each), beside `ctrl`.
    times: DataBuf,
    max_iters: usize,
    /// GPU only: QP handles and kernel arguments in GPU memory (the device updates the handles' counters on
    /// every post, so they must not live across PCIe).
    gpu_state: Option<DeviceBuffer>,
    /// A run failed: its WQEs may still land, and the QPs are in the error state.
    failed: bool,
}

impl PingPong {
    /// Opens an emulated NIC for `exec`, creates two PDs, CQs and RC QPs, connects them, and registers each
    /// rank's send buffer (`max_size` bytes rounded up to 8), receive buffer (two halves of that size),
    /// semaphore and fetch-add result.
    /// Room for `max_iters` timed iterations (warm-up included).
    ///
    /// # Errors
    /// Allocation, registration or CUDA errors; [`Error::InvalidArgument`] for a zero size.
    pub fn new(exec: Executor, max_size: usize, max_iters: usize) -> Result<Self> {
        Self::new_on(&NicSpec::Emu, exec, max_size, max_iters)
    }

    /// [`PingPong::new`] on the NIC `nic` names: the emulated NIC, or a real one (both ranks' QPs on its port,
    /// connected to each other through it).
    ///
    /// # Errors
    /// As [`PingPong::new`]; what [`Nic::open`] returns ([`Error::Unavailable`], one line, for a real NIC that
    /// is not there or a build without the `mlx5` feature).
    pub fn new_on(nic: &NicSpec, exec: Executor, max_size: usize, max_iters: usize) -> Result<Self> {
        let (buf_len, times_len) = Self::lengths(max_size, max_iters)?;
        let nic = Nic::open(nic, &exec, None)?;
        let ctrl = exec.alloc_data(2 * CTRL_STRIDE)?;
        let times = exec.alloc_data(times_len)?;
        let pds = vec![nic.alloc_pd()?, nic.alloc_pd()?];
        let mut ranks = vec![
            Rank::new(&nic, &pds[0], &exec, 0, buf_len, &ctrl, 0)?,
            Rank::new(&nic, &pds[1], &exec, 1, buf_len, &ctrl, 1)?,
        ];
        let (i0, i1) = (ranks[0].info(), ranks[1].info());
        ranks[0].connect(&i1)?;
        ranks[1].connect(&i0)?;
        let gpu_state = Self::handles(&exec, &ranks, &ctrl)?;
        Ok(Self { exec, nic, _pd: pds, ranks, exchange: None, ctrl, times, max_iters, gpu_state, failed: false })
    }

    /// One rank (`rank` 0 or 1) of a ping-pong whose other rank is another process, possibly on another host:
    /// opens an emulated NIC with `wire`, creates this rank's QP and buffers, swaps QP and MR info with the
    /// peer through `exchange`, and connects. Rank 0 measures; both check every payload they receive.
    ///
    /// # Errors
    /// As [`PingPong::new`]; [`Error::InvalidArgument`] for a rank other than 0 or 1 or peer info that is not a
    /// ping-pong's; the exchange's error; [`Error::Emu`] when the wire cannot listen.
    pub fn new_rank(
        exec: Executor,
        rank: u32,
        max_size: usize,
        max_iters: usize,
        wire: WireConfig,
        exchange: Exchange,
    ) -> Result<Self> {
        Self::new_rank_on(&NicSpec::Emu, exec, rank, max_size, max_iters, wire, exchange)
    }

    /// [`PingPong::new_rank`] on the NIC `nic` names (`wire` serves the emulated NIC only; real NICs reach
    /// their peer through the fabric). Both ranks must use the same kind of NIC.
    ///
    /// Every step that can fail takes part in the exchanges all the same, so that the two ranks stay in step and
    /// each reports why: a rank whose own setup failed sends that reason where its info would go, and after
    /// connecting both swap whether they could; a rank then returns its own error, or the peer's reason.
    ///
    /// # Errors
    /// As [`PingPong::new_rank`] and [`Nic::open`]; [`Error::Bootstrap`] naming the peer's reason when the
    /// peer's setup failed.
    pub fn new_rank_on(
        nic: &NicSpec,
        exec: Executor,
        rank: u32,
        max_size: usize,
        max_iters: usize,
        wire: WireConfig,
        mut exchange: Exchange,
    ) -> Result<Self> {
        if rank > 1 {
            return Err(Error::InvalidArgument(format!("ping-pong rank {rank}: must be 0 or 1")));
        }
        let local = (|| {
            let (buf_len, times_len) = Self::lengths(max_size, max_iters)?;
            let nic = Nic::open(nic, &exec, Some(wire))?;
            let ctrl = exec.alloc_data(CTRL_STRIDE)?;
            let times = exec.alloc_data(times_len)?;
            let pd = nic.alloc_pd()?;
            let me = Rank::new(&nic, &pd, &exec, rank, buf_len, &ctrl, 0)?;
            Ok((buf_len, nic, ctrl, times, pd, me))
        })();
        let mine = match &local {
            Ok((.., me)) => me.info().to_bytes(),
            Err(e) => failure_bytes(e),
        };
        let theirs = exchange(&mine)?;
        let (buf_len, nic, ctrl, times, pd, mut me) = local?;
        let peer = PeerInfo::from_bytes(&theirs)?;
        let connected = if peer.recv.length / 2 < buf_len as u64 {
            Err(Error::InvalidArgument(format!(
                "the peer's receive buffer holds two halves of {} bytes, this rank sends up to {buf_len}: run both \
                 with the same sizes",
                peer.recv.length / 2
            )))
        } else {
            me.connect(&peer)
        };
        let status = match &connected {
            Ok(()) => SETUP_OK.to_vec(),
            Err(e) => failure_bytes(e),
        };
        let theirs = exchange(&status)?;
        connected?;
        if theirs != SETUP_OK {
            return Err(peer_failed(&theirs));
        }
        let ranks = vec![me];
        let gpu_state = Self::handles(&exec, &ranks, &ctrl)?;
        Ok(Self {
            exec,
            nic,
            _pd: vec![pd],
            ranks,
            exchange: Some(exchange),
            ctrl,
            times,
            max_iters,
            gpu_state,
            failed: false,
        })
    }

    /// Buffer bytes (`max_size` rounded up to 8) and bytes of the times array.
    fn lengths(max_size: usize, max_iters: usize) -> Result<(usize, usize)> {
        let too_large = || Error::InvalidArgument(format!("ping-pong of {max_size} bytes × {max_iters} iterations"));
        if max_size == 0 || max_iters == 0 {
            return Err(Error::InvalidArgument("ping-pong size and iterations must be at least 1".into()));
        }
        let buf_len = max_size.checked_next_multiple_of(8).ok_or_else(too_large)?;
        let times_len = max_iters.checked_mul(2 * std::mem::size_of::<Phases>()).ok_or_else(too_large)?;
        Ok((buf_len, times_len))
    }

    /// Puts the ranks' QP handles where device code reads and updates them: GPU memory for the `gpu` executor
    /// (returned), the control buffer for `cpu`.
    fn handles(exec: &Executor, ranks: &[Rank], ctrl: &DataBuf) -> Result<Option<DeviceBuffer>> {
        let handles: Vec<QpHandle> = ranks.iter().map(|r| r.qp.handle()).collect();
        match exec {
            Executor::Gpu(g) => {
                let b = g.alloc_device(GPU_ARGS + 2 * std::mem::size_of::<PingPongArgs>())?;
                b.copy_from_host(0, bytemuck::cast_slice(&handles))?;
                Ok(Some(b))
            }
            Executor::Cpu => {
                for (r, h) in handles.iter().enumerate() {
                    // The handle slot is 64-aligned and fits (the assert at `QP_HANDLE`).
                    ctrl.write(r * CTRL_STRIDE + QP_HANDLE, bytemuck::bytes_of(h))?;
                }
                Ok(None)
            }
        }
    }

    /// The NIC ([`Nic::as_emu`] for the emulated NIC's statistics).
    pub fn nic(&self) -> &Nic {
        &self.nic
    }

    /// The device arguments of each rank here (index = control-buffer slot).
    fn args(&self, cfg: &RunConfig) -> Vec<PingPongArgs> {
        let ctrl_addr = |r: usize, off: usize| self.ctrl.loc().addr + (r * CTRL_STRIDE + off) as u64;
        let qp_addr = |r: usize| match &self.gpu_state {
            Some(b) => b.device_addr() + (r * std::mem::size_of::<QpHandle>()) as u64,
            None => ctrl_addr(r, QP_HANDLE),
        };
        self.ranks
            .iter()
            .enumerate()
            .map(|(slot, me)| PingPongArgs {
                qp: qp_addr(slot),
                send: me.send_mr.handle(),
                recv: me.recv_mr.handle(),
                scratch: me.scratch_mr.handle(),
                peer_recv: me.peer_recv,
                peer_sem: me.peer_sem,
                sem: ctrl_addr(slot, SEM),
                times: self.times.loc().addr + (slot * self.max_iters * std::mem::size_of::<Phases>()) as u64,
                report: ctrl_addr(slot, REPORT),
                checked: ctrl_addr(slot, CHECKED),
                size: cfg.size as u64,
                seed: cfg.seed,
                timeout_ns: cfg.timeout.as_nanos().min(u64::MAX as u128) as u64,
                iters: cfg.warmup + cfg.iters,
                rank: me.id,
                blueflame: u32::from(cfg.blueflame),
                pad: 0,
            })
            .collect()
    }

    /// The ranks that run in this process (0 and 1, or this process's one).
    pub fn local_ranks(&self) -> Vec<u32> {
        self.ranks.iter().map(|r| r.id).collect()
    }

    /// Runs `cfg.warmup + cfg.iters` round trips and returns the measured ones.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a size or iteration count beyond what [`PingPong::new`] set up;
    /// [`Error::Device`] when device code reported an error (error CQE, timed-out wait, wrong payload: the
    /// QPs are then in the error state, and later runs return [`Error::InvalidArgument`]); CUDA errors; with a
    /// peer in another process, [`Error::InvalidArgument`] when it runs another configuration and
    /// [`Error::Bootstrap`] when it sent something else (it stopped).
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
        if cfg.blueflame && cfg.size != BLUEFLAME_SIZE {
            return Err(Error::InvalidArgument(format!(
                "size {} by BlueFlame: the peer polls the payload's one word, {BLUEFLAME_SIZE} bytes",
                cfg.size
            )));
        }
        for (r, rank) in self.ranks.iter().enumerate() {
            // Semaphore, fetch-add result, counter and report start at zero (no device code runs between runs).
            self.ctrl.write(r * CTRL_STRIDE, &[0; QP_HANDLE])?;
            if cfg.blueflame {
                // The word a BlueFlame run polls, in both halves: an earlier run with the same seed may have
                // left there the very value this run's first messages carry.
                let half = rank.recv_mr.handle().length / 2;
                rank.recv.write(0, &[0; 8])?;
                rank.recv.write(half as usize, &[0; 8])?;
            }
        }
        // Cleared only when the run ends without error (a CUDA error returns early, too).
        self.failed = true;
        if let Some(x) = self.exchange.as_mut() {
            // Both processes have reset their semaphores before either rank sends: a ping must not be wiped out
            // by the peer's reset. The bytes also check that both run the same configuration.
            let mine = format!("run {} {} {} {} {}", cfg.size, cfg.warmup, cfg.iters, cfg.seed, cfg.blueflame);
            let theirs = x(mine.as_bytes())?;
            if theirs != mine.as_bytes() {
                // A peer that stopped (its own error said why) sends what comes after its runs instead.
                let Some(run) = std::str::from_utf8(&theirs).ok().filter(|t| t.starts_with("run ")) else {
                    return Err(Error::Bootstrap(format!(
                        "the peer sent {} bytes that are not a run's configuration: it stopped before this run",
                        theirs.len()
                    )));
                };
                return Err(Error::InvalidArgument(format!(
                    "the peer runs `{run}`, this rank `{mine}` (size, warmup, iters, seed, blueflame): give both the \
                     same flags"
                )));
            }
        }
        let args = self.args(cfg);
        // One block per local rank, so that both ranks run at once: a CTA of `CTA_THREADS` on the GPU (they fill
        // and check payloads together), one host thread on the cpu executor.
        let (args_addr, threads) = match (&self.exec, &self.gpu_state) {
            (Executor::Gpu(_), Some(state)) => {
                state.copy_from_host(GPU_ARGS, bytemuck::cast_slice(&args))?;
                (state.device_addr() + GPU_ARGS as u64, CTA_THREADS)
            }
            _ => (args.as_ptr() as u64, 1),
        };
        let kernel = Module::load(&self.exec, crate::ptx::PTX)?.kernel(&entries::GDAKI_PINGPONG)?;
        // SAFETY: the argument blocks (GPU memory, or `args` here) name live buffers, handles and control words
        // owned by `self`; the peer of a single rank runs in its process; the launch is waited for. Device waits
        // are bounded by `cfg.timeout` each; a kernel that outlives many of them is hung.
        unsafe {
            kernel.launch(
                &LaunchConfig::linear(args.len() as u32, threads).co_resident(),
                (DevPtr::new(args_addr),),
                cfg.timeout.saturating_mul(4).saturating_add(Duration::from_secs(10)),
            )?
        };
        let mut errors = Vec::new();
        let mut checked = 0;
        let ctrl = self.ctrl.to_vec()?;
        for r in 0..self.ranks.len() {
            let word = |off: usize, len: usize| &ctrl[r * CTRL_STRIDE + off..][..len];
            let report: ErrorReport = bytemuck::pod_read_unaligned(word(REPORT, std::mem::size_of::<ErrorReport>()));
            let n: u64 = bytemuck::pod_read_unaligned(word(CHECKED, 8));
            checked += n;
            match gdaki_device::Error::from_report(&report) {
                Some(e) => errors.push(format!("rank {}: {e}", self.ranks[r].id)),
                None if report.kind != 0 => {
                    errors.push(format!("rank {}: error report of unknown kind {report:?}", self.ranks[r].id))
                }
                None => {}
            }
        }
        if !errors.is_empty() {
            return Err(Error::Device(format!("{} ({checked} payloads checked before)", errors.join("; "))));
        }
        self.failed = false;
        let bytes = self.times.to_vec()?;
        let times: Vec<Phases> =
            bytes.chunks_exact(std::mem::size_of::<Phases>()).map(bytemuck::pod_read_unaligned).collect();
        let records = |slot: usize| &times[slot * self.max_iters..][..total];
        let slot_of = |id: u32| self.ranks.iter().position(|r| r.id == id);
        let Some(r0) = slot_of(0).map(records) else {
            // Rank 0 measures, in its own process.
            return Ok(RunResult { round_trip_ns: Vec::new(), split: Vec::new(), checked });
        };
        let w = cfg.warmup as usize;
        let round_trip_ns = r0[w..].iter().map(|p| p.seen.saturating_sub(p.send_start)).collect();
        let split = slot_of(1)
            .map(records)
            .map_or(Vec::new(), |r1| r0[w..].iter().zip(&r1[w..]).map(|(a, b)| Split::of(a, b)).collect());
        Ok(RunResult { round_trip_ns, split, checked })
    }
}

/// Offset of the kernel arguments in the GPU state buffer (after up to two QP handles, 256-byte aligned).
const GPU_ARGS: usize = 512;
const _: () = assert!(2 * std::mem::size_of::<QpHandle>() <= GPU_ARGS);

#[cfg(test)]
mod tests {
    use super::*;

    fn phases(send_start: u64, send_done: u64, seen: u64) -> Phases {
        Phases { send_start, send_done, seen, pad: 0 }
    }

    #[test]
    fn a_split_of_readings_in_order_is_their_differences() {
        // Rank 0 sends at 100..130, rank 1 sees at 1,100 and has sent at 1,150, rank 0 sees at 2,000.
        let s = Split::of(&phases(100, 130, 2_000), &phases(0, 1_150, 1_100));
        assert_eq!(s, Split { post0: 30, leg01: 970, turn1: 50, leg10: 850 });
    }

    #[test]
    fn a_reading_before_the_previous_cut_counts_in_the_part_before_it() {
        // Rank 0's thread read its clock after its send at 900, after rank 1 had seen the semaphore (600): the
        // leg to rank 1 is 0 and rank 0's post takes the 800 ns; the parts still add up to the 1,900.
        let s = Split::of(&phases(100, 900, 2_000), &phases(0, 1_000, 600));
        assert_eq!(s, Split { post0: 800, leg01: 0, turn1: 100, leg10: 1_000 });
        // Rank 1's send returning after rank 0 saw its semaphore: the last leg is 0.
        let s = Split::of(&phases(100, 130, 2_000), &phases(0, 2_100, 1_100));
        assert_eq!(s, Split { post0: 30, leg01: 970, turn1: 900, leg10: 0 });
    }
}
