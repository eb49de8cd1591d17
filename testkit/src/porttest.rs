//! Host side of MSCCL++'s one-to-one PortChannel tests (the `port_channel` example and its tests): one rank's
//! channels to its peer, and runs of `gdaki_testkit_kernels::porttest` on the GPU (kernels
//! `gdaki_port_{exclusive,warp,block,device}`) or on host threads (a team of threads per channel).
//!
//! A [`PortTest`] owns `nchannels` connections (one QP each), a buffer of `2 × max_size` bytes per channel
//! (send half, receive half), a semaphore and a channel per connection, all set up for one [`Mode`] (the Host
//! modes' channels go through a proxy; the Device modes' kernels post themselves).

use std::sync::Arc;
use std::time::Duration;

use gdaki_device::launch::{DevPtr, KernelFn};
use gdaki_shared::channel::PortChannelHandle;
use gdaki_shared::handle::ErrorReport;
use gdaki_testkit_kernels::entries;
use gdaki_testkit_kernels::porttest::{self, PortTestArgs};

use gdaki::channel::{Communicator, EndpointConfig, IbMode, PortChannel, RegisteredMemory, Semaphore};
use gdaki::cuda::DeviceBuffer;
use gdaki::exec::Executor;
use gdaki::launch::{LaunchConfig, Module};
use gdaki::mem::MappedBuf;
use gdaki::{Error, Result};

pub use gdaki_testkit_kernels::porttest::op;

pub mod bench;

/// Who posts each channel's WQEs: the CPU proxy (Host modes, MSCCL++'s default), or device code, with the
/// threads sharing the QP as one of the device's [`Sharing`](gdaki_device::channel::Sharing) types (chosen per run at run time here).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// The proxy posts (device code pushes triggers from one thread per channel); signals are fetch-adds.
    Host,
    /// As `Host`, with signals written as the semaphore's new value (no atomics).
    HostNoAtomic,
    /// One thread per QP.
    Exclusive,
    /// The lanes of one warp share its QP (DOCA GPUNetIO's `put_warp`): a team of at most 32 threads, one warp
    /// on the GPU; on host threads, each a warp of one lane, the same limit (the `cpu` executor refuses a
    /// Warp handle used by more than one warp of a launch).
    Warp,
    /// The threads of one team (CTA) share its QP.
    Block,
    /// Any thread shares any QP (GPU-scope atomics).
    Device,
}

impl Mode {
    /// MSCCL++'s five (its GPUNetIO comparison), in the order tables list them: the proxy baseline first.
    /// [`Mode::Warp`], which MSCCL++ lacks and which takes a team of one warp on the GPU, is in
    /// [`Mode::DEVICE`] only.
    pub const ALL: [Mode; 5] = [Mode::Host, Mode::HostNoAtomic, Mode::Exclusive, Mode::Block, Mode::Device];

    /// The four Device modes (no proxy).
    pub const DEVICE: [Mode; 4] = [Mode::Exclusive, Mode::Warp, Mode::Block, Mode::Device];

    /// "Host", "HostNoAtomic", "Exclusive", "Warp", "Block" or "Device".
    pub fn name(self) -> &'static str {
        match self {
            Mode::Host => "Host",
            Mode::HostNoAtomic => "HostNoAtomic",
            Mode::Exclusive => "Exclusive",
            Mode::Warp => "Warp",
            Mode::Block => "Block",
            Mode::Device => "Device",
        }
    }

    /// MSCCL++'s name of the mode in its GPUNetIO comparison: "Host", "HostNoAtomic", "Device-Exclusive",
    /// "Device-Block" or "Device-Device", and "Device-Warp" for the mode MSCCL++ lacks (what `--json` output
    /// and tables of `gdaki-perf` say).
    pub fn label(self) -> &'static str {
        match self {
            Mode::Host => "Host",
            Mode::HostNoAtomic => "HostNoAtomic",
            Mode::Exclusive => "Device-Exclusive",
            Mode::Warp => "Device-Warp",
            Mode::Block => "Device-Block",
            Mode::Device => "Device-Device",
        }
    }

    /// The team a run of this mode takes where `team` threads are wanted: at most 32 (one warp) in Warp
    /// sharing, `team` otherwise.
    pub fn fit_team(self, team: u32) -> u32 {
        if self == Mode::Warp {
            team.min(32)
        } else {
            team
        }
    }

    /// "team of `team` threads per channel" for a run of `modes`, saying where Warp sharing's rows take fewer
    /// ([`Mode::fit_team`]): a header's words.
    pub fn team_words(modes: &[Mode], team: u32) -> String {
        let warp = Mode::Warp.fit_team(team);
        if modes.contains(&Mode::Warp) && warp != team {
            format!("team of {team} threads per channel ({warp} in Warp sharing)")
        } else {
            format!("team of {team} threads per channel")
        }
    }

    /// "Host mode (CPU proxy)", …, "Device mode, Exclusive sharing", …: a table's heading.
    pub fn title(self) -> String {
        match self {
            Mode::Host | Mode::HostNoAtomic => format!("{} mode (CPU proxy)", self.name()),
            _ => format!("Device mode, {} sharing", self.name()),
        }
    }

    fn kernel(self) -> &'static KernelFn<(DevPtr<PortTestArgs>,)> {
        match self {
            // One pushing thread per channel, as MSCCL++'s proxy channels are used.
            Mode::Host | Mode::HostNoAtomic | Mode::Exclusive => &entries::GDAKI_PORT_EXCLUSIVE,
            Mode::Warp => &entries::GDAKI_PORT_WARP,
            Mode::Block => &entries::GDAKI_PORT_BLOCK,
            Mode::Device => &entries::GDAKI_PORT_DEVICE,
        }
    }
}

/// Serialises as [`Mode::label`].
impl serde::Serialize for Mode {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.label())
    }
}

impl std::str::FromStr for Mode {
    type Err = String;

    /// `host`, `host-no-atomic`, `exclusive`, `warp`, `block` or `device` (any case).
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "host" => Ok(Mode::Host),
            "host-no-atomic" | "hostnoatomic" => Ok(Mode::HostNoAtomic),
            "exclusive" => Ok(Mode::Exclusive),
            "warp" => Ok(Mode::Warp),
            "block" => Ok(Mode::Block),
            "device" => Ok(Mode::Device),
            other => Err(format!("mode {other:?}: expected host, host-no-atomic, exclusive, warp, block or device")),
        }
    }
}

/// The `max_size` a [`PortTest`] needs to run `op` with `size` bytes: `size`, or for the packet ping-pongs
/// enough for the data, the outgoing and the incoming packets ([`porttest::packet_layout`]).
pub fn max_size_for(op: u32, size: usize) -> usize {
    match op {
        op::PACKET_PINGPONG | op::PACKET_PINGPONG_LL8 => {
            (porttest::packet_layout(size as u64).end as usize).div_ceil(2)
        }
        _ => size,
    }
}

/// One run.
#[derive(Clone, Copy, Debug)]
pub struct RunConfig {
    /// One of [`op`].
    pub op: u32,
    /// Bytes per channel per iteration (1 ..= the `max_size` of [`PortTest::new`]; packet ping-pongs: a multiple
    /// of 8 (LL16) or 4 (LL8) bytes, with a `max_size` of at least [`max_size_for`]).
    pub size: usize,
    /// Iterations.
    pub iters: u32,
    /// Threads per team: a CTA's size on the GPU, host threads per channel on the `cpu` executor.
    pub team: u32,
    /// Seed of the payload generator (both ranks must use the same).
    pub seed: u64,
    /// Bound of every device-side wait of the run (each channel's `timeout_ns`, which [`PortTest::run`] sets);
    /// the launch as a whole is bounded by 4 × this + 10 s. More than zero.
    pub timeout: Duration,
}

/// What one run measured on this rank.
#[derive(Clone, Debug)]
pub struct RunResult {
    /// Time of each iteration, ns (rank 0 only; empty on rank 1).
    pub iter_ns: Vec<u64>,
    /// Payloads this rank received and checked.
    pub checked: u64,
}

/// Control words in queue memory: report, checked and finished counters; then the times.
const REPORT: usize = 0;
const CHECKED: usize = 64;
const FINISHED: usize = 72;
const TIMES: usize = 128;

/// One rank's channels of a port-channel test.
pub struct PortTest {
    mode: Mode,
    nchannels: u32,
    max_size: usize,
    max_iters: usize,
    /// Field order is drop order: channels before what they name.
    chans: Vec<PortChannel>,
    _sems: Vec<Semaphore>,
    _mems: Vec<RegisteredMemory>,
    /// The channel handles where device code reads them (GPU memory for the `gpu` executor).
    gpu_handles: Option<DeviceBuffer>,
    host_handles: Vec<PortChannelHandle>,
    ctrl: MappedBuf,
    comm: Arc<Communicator>,
    failed: bool,
    device_error: Option<gdaki_device::Error>,
    /// Packet rounds run so far: the next run's flag base, so that its flags match no earlier packet.
    packet_rounds: u64,
}

impl PortTest {
    /// Sets up `nchannels` channels to the peer (rank `1 - comm.rank()`), each with its own QP (the default
    /// [`EndpointConfig`]), a `2 × max_size` buffer, a semaphore; room for `max_iters` timed iterations. Both ranks call
    /// it with the same arguments (the calls pair up through the bootstrap).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a world that is not two ranks, zero sizes or counts; the communicator's
    /// errors.
    pub fn new(comm: Arc<Communicator>, mode: Mode, nchannels: u32, max_size: usize, max_iters: usize) -> Result<Self> {
        Self::with_qps(comm, mode, nchannels, nchannels, max_size, max_iters)
    }

    /// As [`PortTest::new`], with the channels spread over `qps` connections (channel `c` on QP `c % qps`): with
    /// one QP, every team posts to the same QP (Device sharing; Block sharing is for one team per QP).
    ///
    /// # Errors
    /// As [`PortTest::new`]; [`Error::InvalidArgument`] for `qps` of 0 or more than `nchannels`, two teams
    /// on one QP in Exclusive or Block sharing, or a `max_size` whose doubled buffer overflows.
    pub fn with_qps(
        comm: Arc<Communicator>,
        mode: Mode,
        nchannels: u32,
        qps: u32,
        max_size: usize,
        max_iters: usize,
    ) -> Result<Self> {
        if qps == 0 || qps > nchannels || (mode != Mode::Device && qps < nchannels) {
            return Err(Error::InvalidArgument(format!(
                "{nchannels} channels on {qps} QPs in {} sharing: 1..=channels QPs, and one team per QP but in Device",
                mode.name()
            )));
        }
        if comm.world_size() != 2 || nchannels == 0 || max_size == 0 || max_iters == 0 {
            return Err(Error::InvalidArgument(format!(
                "port test of {nchannels} channels, {max_size} bytes, {max_iters} iterations, world of {}: needs 2 \
                 ranks and nonzero sizes",
                comm.world_size()
            )));
        }
        // Both halves of a channel's buffer, each rounded up to 8 bytes; checked before anything is exchanged, so
        // that both ranks refuse the same sizes alike.
        let Some(half) = max_size.checked_next_multiple_of(8).filter(|h| h.checked_mul(2).is_some()) else {
            return Err(Error::InvalidArgument(format!(
                "a max_size of {max_size} bytes: a buffer of twice that does not fit the address space"
            )));
        };
        let peer = 1 - comm.rank();
        let cfg = EndpointConfig::with_mode(match mode {
            Mode::Host => IbMode::Host,
            Mode::HostNoAtomic => IbMode::HostNoAtomic,
            _ => IbMode::Device,
        });
        let conns = (0..qps).map(|q| comm.connect(&cfg, peer, 16 * q + 1)).collect::<Result<Vec<_>>>()?;
        let (mut chans, mut sems, mut mems) = (Vec::new(), Vec::new(), Vec::new());
        for c in 0..nchannels {
            let tag = 16 * c;
            let mem = comm.register_buffer(comm.executor().alloc_data(2 * half)?)?;
            comm.send_memory(&mem, peer, tag)?;
            let dst = comm.recv_memory(peer, tag)?;
            let conn = &conns[(c % qps) as usize];
            let sem = comm.semaphore(conn, peer, tag + 2)?;
            chans.push(PortChannel::new(conn, &sem, dst, &mem)?);
            sems.push(sem);
            mems.push(mem);
        }
        let host_handles: Vec<PortChannelHandle> = chans.iter().map(|c| c.device_handle()).collect();
        let gpu_handles = match comm.executor() {
            Executor::Gpu(g) => {
                let b = g.alloc_device(std::mem::size_of_val(&host_handles[..]) + 256)?;
                b.copy_from_host(0, bytemuck::cast_slice(&host_handles))?;
                Some(b)
            }
            Executor::Cpu => None,
        };
        let ctrl = comm.executor().queue_memory().alloc(TIMES + 8 * max_iters)?;
        Ok(Self {
            mode,
            nchannels,
            max_size,
            max_iters,
            chans,
            _sems: sems,
            _mems: mems,
            gpu_handles,
            host_handles,
            ctrl,
            comm,
            failed: false,
            device_error: None,
            packet_rounds: 0,
        })
    }

    /// Sets every channel's BlueFlame limit (payloads up to it go by BlueFlame in Exclusive sharing; 0: never).
    ///
    /// # Errors
    /// CUDA errors copying the handles to the GPU.
    pub fn set_blue_flame_limit(&mut self, bytes: u64) -> Result<()> {
        self.edit_handles(|_, h| h.blue_flame_limit = bytes)
    }

    /// Lets `edit(channel, handle)` change the device handles the next runs use, e.g. a key, to see what
    /// device code reports for it ([`PortTest::device_error`]).
    ///
    /// # Errors
    /// CUDA errors copying the handles to the GPU.
    pub fn edit_handles(&mut self, mut edit: impl FnMut(u32, &mut PortChannelHandle)) -> Result<()> {
        for (c, h) in self.host_handles.iter_mut().enumerate() {
            edit(c as u32, h);
        }
        if let Some(b) = &self.gpu_handles {
            b.copy_from_host(0, bytemuck::cast_slice(&self.host_handles))?;
        }
        Ok(())
    }

    /// What device code reported in the last run, when it failed with [`Error::Device`].
    pub fn device_error(&self) -> Option<gdaki_device::Error> {
        self.device_error
    }

    /// The communicator (for its bootstrap and NIC).
    pub fn communicator(&self) -> &Communicator {
        &self.comm
    }

    /// The channels' sharing mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    fn word(&self, off: usize) -> *mut u64 {
        // SAFETY: offsets stay inside `ctrl` (REPORT, CHECKED, TIMES + 8 × max_iters).
        unsafe { self.ctrl.host_ptr().add(off) as *mut u64 }
    }

    /// Runs `cfg` on this rank (the peer runs the same `cfg` at the same time).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a size or iteration count beyond the setup (packet ping-pongs: see
    /// [`RunConfig::size`]), a team of 0 (or, in Warp sharing, of more than 32), or after a failed run; [`Error::Device`] when device code reported an error; CUDA and bootstrap errors.
    pub fn run(&mut self, cfg: &RunConfig) -> Result<RunResult> {
        if self.failed {
            return Err(Error::InvalidArgument("an earlier run failed: make a new PortTest".into()));
        }
        let refused = if cfg.size == 0 || cfg.size > self.max_size {
            Some(format!("a size of {} bytes: 1..={} for this setup", cfg.size, self.max_size))
        } else if cfg.iters as usize > self.max_iters {
            Some(format!("{} iterations: at most {} for this setup", cfg.iters, self.max_iters))
        } else if cfg.team == 0 {
            Some("a team of 0 threads: at least 1".to_string())
        } else {
            None
        };
        if let Some(why) = refused {
            return Err(Error::InvalidArgument(why));
        }
        if self.mode == Mode::Warp && cfg.team > 32 {
            return Err(Error::InvalidArgument(format!(
                "a team of {} threads in Warp sharing: its team is one warp on the GPU, at most 32 threads",
                cfg.team
            )));
        }
        let packet = match cfg.op {
            op::PACKET_PINGPONG => Some(8),
            op::PACKET_PINGPONG_LL8 => Some(4),
            _ => None,
        };
        if let Some(unit) = packet {
            let need = porttest::packet_layout(cfg.size as u64).end;
            let have = 2 * self.max_size.next_multiple_of(8) as u64;
            if !cfg.size.is_multiple_of(unit) || need > have {
                return Err(Error::InvalidArgument(format!(
                    "packet ping-pong of {} bytes: a multiple of {unit} bytes whose data and packets ({need} bytes) \
                     fit the {have}-byte buffer (max_size of at least 2.5 × size)",
                    cfg.size
                )));
            }
        }
        let timeout_ns = u64::try_from(cfg.timeout.as_nanos()).unwrap_or(u64::MAX);
        if timeout_ns == 0 {
            return Err(Error::InvalidArgument("a run's timeout must be more than zero".into()));
        }
        if self.host_handles.iter().any(|h| h.timeout_ns != timeout_ns) {
            self.edit_handles(|_, h| h.timeout_ns = timeout_ns)?;
        }
        let rank = self.comm.rank();
        // SAFETY: no device code runs between runs; the words are ours and aligned.
        unsafe {
            (self.word(REPORT) as *mut ErrorReport).write_volatile(ErrorReport::default());
            self.word(CHECKED).write_volatile(0);
            self.word(FINISHED).write_volatile(0);
        }
        // On the cpu executor the handles and the argument block go to executor memory as well, not to `self`
        // and this frame: a kernel that outlives the launch's wait (a run far past its bound) reads them after
        // `run` has returned and `self` may be gone, and the executor keeps its memory, never a frame or a Vec,
        // while such a kernel runs. (A kernel left reading a returned frame took garbage for its pointers, and
        // the process aborted, every other test of the binary with it.)
        let args_at = std::mem::size_of_val(&self.host_handles[..]);
        let args_of = |channels| PortTestArgs {
            channels,
            times: if rank == 0 { self.ctrl.device_addr() + TIMES as u64 } else { 0 },
            report: self.ctrl.device_addr() + REPORT as u64,
            checked: self.ctrl.device_addr() + CHECKED as u64,
            finished: self.ctrl.device_addr() + FINISHED as u64,
            size: cfg.size as u64,
            seed: cfg.seed,
            iters: cfg.iters,
            op: cfg.op,
            rank,
            nchannels: self.nchannels,
            flag_base: (self.packet_rounds % u32::MAX as u64) as u32,
            pad: 0,
        };
        // Everything that may block while a kernel runs (module load, copies) happens before the barrier: the
        // peer may be another rank of this process, whose kernel starts as soon as both pass it.
        let mut cpu_block = None; // kept until the launch has been waited for
        let args_addr = match &self.gpu_handles {
            Some(b) => {
                b.copy_from_host(args_at, bytemuck::bytes_of(&args_of(b.device_addr())))?;
                b.device_addr() + args_at as u64
            }
            None => {
                let b = self.comm.executor().alloc_data(args_at + std::mem::size_of::<PortTestArgs>())?;
                b.write(0, bytemuck::cast_slice(&self.host_handles))?;
                b.write(args_at, bytemuck::bytes_of(&args_of(b.loc().addr)))?;
                cpu_block.insert(b).loc().addr + args_at as u64
            }
        };
        if packet.is_some() {
            self.packet_rounds += cfg.iters as u64;
        }
        let kernel = Module::load(self.comm.executor(), crate::ptx::PTX)?.kernel(self.mode.kernel())?;
        // Both ranks start together, so that neither waits out its bound for a peer still setting up.
        self.comm.bootstrap().barrier()?;
        self.failed = true;
        // SAFETY: the argument block and the handles are in memory the executor reaches (GPU memory, or the
        // executor's host memory on the cpu executor) and name live channels, buffers and control words owned by
        // `self`; one block per channel keeps every team running at once; the launch is waited for here.
        let launched = unsafe {
            kernel.launch(
                &LaunchConfig::linear(self.nchannels, cfg.team).co_resident(),
                (DevPtr::new(args_addr),),
                cfg.timeout.saturating_mul(4).saturating_add(Duration::from_secs(10)),
            )
        };
        // Both ranks end together too: a rank must not free anything (the launch's error report when `kernel`
        // drops, its channels) nor start its next run's setup while the peer's kernel may still wait on a NIC
        // of this process. A free waits for every running kernel of the GPU and meanwhile holds up the other
        // threads' CUDA calls, the NICs' among them: a NIC that needs the GPU for the peer's last CQE (an
        // atomic's old value into GPU memory) would stall until that kernel's bounded wait gave up.
        let ended = self.comm.bootstrap().barrier();
        launched?;
        // SAFETY: the device code has finished; the words are ours and aligned.
        let (report, checked) =
            unsafe { ((self.word(REPORT) as *const ErrorReport).read_volatile(), self.word(CHECKED).read_volatile()) };
        self.device_error = gdaki_device::Error::from_report(&report);
        if let Some(e) = self.device_error {
            // The emulated NIC's counters say what the NIC saw (overruns, error CQEs, doorbells).
            let nic = match self.comm.nic() {
                gdaki::nic::Nic::Emu(n) => format!("; emulated NIC: {}", nic_counters(&n.stats())),
                #[allow(unreachable_patterns)]
                _ => String::new(),
            };
            return Err(Error::Device(format!("rank {rank}: {e} ({checked} payloads checked before{nic})")));
        }
        ended?;
        self.failed = false;
        let iter_ns = if rank == 0 {
            // SAFETY: rank 0's team 0 wrote `iters` times; the device code has finished.
            unsafe { std::slice::from_raw_parts(self.word(TIMES), cfg.iters as usize) }.to_vec()
        } else {
            Vec::new()
        };
        Ok(RunResult { iter_ns, checked })
    }

    /// The channels, e.g. to read a semaphore.
    pub fn channels(&self) -> &[PortChannel] {
        &self.chans
    }
}

/// The emulated NIC's counters that explain a failed run, on one short line: what it executed and completed,
/// and the anomalies it saw (only those that happened).
fn nic_counters(s: &gdaki::nic::emu::Stats) -> String {
    let mut line = format!(
        "{} doorbells, {} WQEs, {} CQEs ({} error, {} flushed)",
        s.doorbells, s.wqes, s.cqes, s.error_cqes, s.flush_cqes
    );
    let anomalies = [
        ("CQ overruns", s.cq_overruns),
        ("stale doorbells", s.stale_doorbells),
        ("bad doorbells", s.bad_doorbells),
        ("dbrec mismatches", s.dbrec_mismatches),
        ("BlueFlame mismatches", s.blueflame_mismatches),
    ];
    for (name, n) in anomalies.into_iter().filter(|&(_, n)| n > 0) {
        line += &format!(", {n} {name}");
    }
    line
}

#[cfg(test)]
mod tests {
    use super::nic_counters;

    #[test]
    fn a_failed_runs_nic_counters_fit_one_short_line() {
        let mut s = gdaki::nic::emu::Stats::default();
        (s.doorbells, s.wqes, s.cqes, s.error_cqes, s.flush_cqes) = (7, 12, 5, 1, 3);
        assert_eq!(nic_counters(&s), "7 doorbells, 12 WQEs, 5 CQEs (1 error, 3 flushed)");
        (s.cq_overruns, s.dbrec_mismatches) = (2, 9);
        assert_eq!(
            nic_counters(&s),
            "7 doorbells, 12 WQEs, 5 CQEs (1 error, 3 flushed), 2 CQ overruns, 9 dbrec mismatches"
        );
    }
}
