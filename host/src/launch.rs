//! Launching `#[kernel]` functions on either executor: [`Module::load`] takes the PTX a build script made with
//! `gdaki-build`, [`Module::kernel`] finds a kernel by its descriptor (the `NAME` static `#[kernel] fn name`
//! defines), and [`Kernel::start`] / [`Kernel::launch`] run it: on the `gpu` executor through the CUDA driver,
//! on the `cpu` executor as host threads in the same grid and block shape
//! ([`gdaki_device::launch::run_on_host`]). The first error a kernel returns comes back as
//! [`Error::Kernel`], a value.
//!
//! The whole of a two-rank program is gdaki's `templates/app/`; its launch, in short:
//!
//! ```ignore
//! const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/kernels.ptx")); // written by gdaki-build
//! let exchange = Module::load(&exec, PTX)?.kernel(&kernels::EXCHANGE)?;
//! let handle = exec.upload(&chan.device_handle())?; // a PortChannelHandle where the executor reaches it
//! // SAFETY: the handle is a live channel's; its QP is used by this kernel only, until the launch ends.
//! unsafe { exchange.launch(&LaunchConfig::linear(1, 32), (handle.dev_ptr(), bytes, rank), TIMEOUT)? };
//! ```

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gdaki_device::launch::{KernelFn, LaunchArgs};
use gdaki_device::Dim3;
use gdaki_shared::handle::ErrorReport;

use crate::cuda::{self, KernelArg};
use crate::exec::Executor;
use crate::mem::MappedBuf;
use crate::{Error, Result};

/// A launch's shape: blocks in the grid, threads per block, dynamic shared memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchConfig {
    /// Blocks (CTAs) in x, y, z; each at least 1.
    pub grid: Dim3,
    /// Threads per block in x, y, z; each at least 1, z at most 64, at most 1024 in all (the GPU's limits,
    /// which the `cpu` executor enforces too).
    pub block: Dim3,
    /// Dynamic shared memory per block, bytes (GPU only; the `cpu` executor has none).
    pub shared_mem_bytes: u32,
    /// The kernel needs every CTA of the launch resident at once: its CTAs wait on each other (a grid-wide
    /// barrier, a `Device`-scope team, one CTA per rank of a ping-pong). On the GPU the launch is then
    /// cooperative (`cuLaunchCooperativeKernel`, as NVSHMEM's `nvshmemx_collective_launch`), and a grid larger
    /// than the GPU can hold at once ([`Kernel::max_co_resident_blocks`]) is refused at launch instead of
    /// waiting until the kernel's bounded waits time out. The `cpu` executor runs every thread at once: its
    /// launches are co-resident whatever this says.
    pub co_resident: bool,
}

impl LaunchConfig {
    /// `blocks` blocks of `threads` threads, one-dimensional, no dynamic shared memory, not marked co-resident.
    pub fn linear(blocks: u32, threads: u32) -> Self {
        LaunchConfig { grid: Dim3::x(blocks), block: Dim3::x(threads), shared_mem_bytes: 0, co_resident: false }
    }

    /// This shape with [`LaunchConfig::co_resident`] set: every CTA resident at once, or the launch is refused.
    pub fn co_resident(self) -> Self {
        LaunchConfig { co_resident: true, ..self }
    }
}

/// A module of kernels for one executor: on the `gpu` executor the loaded PTX; on the `cpu` executor the PTX's
/// entry names and parameter counts, checked against the host build of each kernel taken from it (the kernels
/// run from their host build).
#[derive(Clone)]
pub struct Module {
    exec: Executor,
    gpu: Option<Arc<cuda::Module>>,
    entries: Arc<Vec<(String, usize)>>,
}

impl Module {
    /// Loads `ptx` (the text `gdaki-build` wrote, usually through `include_str!`) for `exec`. On the `gpu`
    /// executor the driver JIT-compiles it; loading a module waits for running kernels (a CUDA rule), so load
    /// before starting kernels that wait on each other. On the `cpu` executor only its entries are read.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for text with no `.entry` (not a PTX module); [`Error::Cuda`] when the driver
    /// refuses the PTX (its JIT log's first lines in the message).
    pub fn load(exec: &Executor, ptx: &str) -> Result<Module> {
        let entries = cuda::entry_param_counts(ptx);
        if entries.is_empty() {
            return Err(Error::InvalidArgument(
                "Module::load: the text has no .entry: not a PTX module of kernels".into(),
            ));
        }
        let gpu = match exec {
            Executor::Gpu(g) => Some(g.load_module(ptx)?),
            Executor::Cpu => None,
        };
        Ok(Module { exec: exec.clone(), gpu, entries: Arc::new(entries) })
    }

    /// The kernel `k` (the static `#[kernel]` made for it) of this module, on either executor.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the PTX has no entry of that name, or one whose parameter count is not
    /// the host build's (the PTX was built from other sources than the host code: rebuild both); on the GPU,
    /// [`Error::Cuda`].
    pub fn kernel<A: LaunchArgs>(&self, k: &'static KernelFn<A>) -> Result<Kernel<A>> {
        match self.entries.iter().find(|(n, _)| n == k.name) {
            None => {
                return Err(Error::InvalidArgument(format!(
                    "the PTX module has no kernel `{}` (is it the PTX of the crate that defines it?)",
                    k.name
                )))
            }
            // The PTX entry has one hidden parameter more: the error report's address.
            Some(&(_, n)) if n != A::COUNT + 1 => {
                return Err(Error::InvalidArgument(format!(
                    "kernel `{}`: the PTX entry has {n} parameters, the host build {} and the report address: \
                     the PTX is stale, rebuild it",
                    k.name,
                    A::COUNT
                )))
            }
            Some(_) => {}
        }
        let gpu = match &self.gpu {
            Some(m) => Some(m.kernel(k.name)?),
            None => None,
        };
        // On the GPU the reports outlive the kernel (its drop would free them while other kernels run); on the
        // host freeing memory waits for nothing.
        let reports = match &self.exec {
            Executor::Gpu(g) => g.launch_reports(),
            Executor::Cpu => Arc::default(),
        };
        Ok(Kernel { k, exec: self.exec.clone(), gpu, reports })
    }
}

/// One kernel of a [`Module`], with its parameter tuple `A`.
pub struct Kernel<A: LaunchArgs> {
    k: &'static KernelFn<A>,
    exec: Executor,
    gpu: Option<cuda::Kernel>,
    /// The launches' error reports, kept for later launches once a launch has ended ([`Kernel::report`]): on
    /// the GPU the pool of the `Gpu`, shared by its kernels.
    reports: Arc<Mutex<Vec<Arc<MappedBuf>>>>,
}

impl<A: LaunchArgs> Kernel<A> {
    /// The kernel's name.
    pub fn name(&self) -> &'static str {
        self.k.name
    }

    /// How many CTAs of `block` threads, with `shared_mem_bytes` of dynamic shared memory each, can be resident
    /// at once, the most a [`LaunchConfig::co_resident`] launch may have (NVSHMEM's
    /// `nvshmemx_collective_launch_query_gridsize`): on the GPU the driver's occupancy per SM for this kernel
    /// (its registers and shared memory) times the SMs; on the `cpu` executor the threads it runs at most
    /// ([`gdaki_device::launch::MAX_HOST_THREADS`]) divided by the block's (0 for a block it does not run, of
    /// more than 1024 threads or deeper than 64). Kernels running meanwhile take room
    /// from that number: on the GPU those of other streams (other ranks', the emulated NIC's engine: one CTA of
    /// 64 threads; leave them some), on the `cpu` executor the process's other `cpu` launches.
    ///
    /// # Errors
    /// On the GPU, the driver's error as [`Error::Cuda`] (for instance a block larger than the kernel takes).
    pub fn max_co_resident_blocks(&self, block: Dim3, shared_mem_bytes: u32) -> Result<u32> {
        match &self.gpu {
            Some(k) => k.max_co_resident_blocks(block.count().min(u64::from(u32::MAX)) as u32, shared_mem_bytes),
            // 0 for a block the executor does not run (a launch of it is refused whatever the grid).
            None => Ok(match gdaki_device::launch::check_host_shape(self.k.name, Dim3::x(1), block) {
                Ok(()) => (gdaki_device::launch::MAX_HOST_THREADS / block.count()) as u32,
                Err(_) => 0,
            }),
        }
    }

    /// Starts the kernel with `args` in the shape `cfg` and returns at once; [`Running::wait`] ends it.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a shape the executor cannot run (a zero dimension, more than 1024 threads
    /// per block, a block deeper than 64: on the GPU the driver refuses the last two, an [`Error::Cuda`], but
    /// a co-resident launch's block of more than 1024 threads is refused before, an `InvalidArgument`; on the
    /// `cpu` executor also more than 8192 threads in all), on the GPU for a [`LaunchConfig::co_resident`] grid
    /// larger than [`Kernel::max_co_resident_blocks`] (the message names both) or arguments whose sizes
    /// differ from the PTX's parameters; [`Error::Unavailable`] for a co-resident launch on a GPU without
    /// cooperative launches, and on the `cpu` executor for a launch whose threads and those of the process's
    /// other `cpu` launches still running would be more than 8192 together (nothing starts); [`Error::Cuda`].
    ///
    /// # Safety
    /// `args` must be what the kernel's contract asks for: its pointers device addresses of live memory of the
    /// right types (GPU or mapped memory on the `gpu` executor, host memory on the `cpu` executor) for the
    /// whole run, and no other code may use that memory in ways the kernel's contract forbids.
    pub unsafe fn start(&self, cfg: &LaunchConfig, args: A) -> Result<Running> {
        // SAFETY: the caller's contract.
        unsafe { self.start_with(cfg, args, false) }
    }

    /// [`Kernel::start`], with CUDA events recorded on the launch's stream right before and after the kernel
    /// when `timed` (on the GPU).
    ///
    /// # Safety
    /// As [`Kernel::start`].
    unsafe fn start_with(&self, cfg: &LaunchConfig, args: A, timed: bool) -> Result<Running> {
        let report = self.report()?;
        let at = report.device_addr();
        // Until `run` is set nothing runs, and a drop frees the report; from then on `Running` keeps it alive.
        let mut running = Running { name: self.k.name, report, run: None };
        match (&self.exec, &self.gpu) {
            (Executor::Gpu(g), Some(kernel)) => {
                let mut bytes: Vec<Vec<u8>> = Vec::new();
                args.for_each(&mut |b| bytes.push(b.to_vec()));
                let mut params: Vec<KernelArg<'_>> = bytes.iter().map(|b| KernelArg::Bytes(b)).collect();
                params.push(KernelArg::U64(at));
                let stream = g.new_stream()?;
                let c = cuda::LaunchConfig {
                    grid: [cfg.grid.x, cfg.grid.y, cfg.grid.z],
                    block: [cfg.block.x, cfg.block.y, cfg.block.z],
                    shared_mem_bytes: cfg.shared_mem_bytes,
                    co_resident: cfg.co_resident,
                };
                // Both events are made before the launch, so that after it only the end's record can fail.
                let events = if timed { Some((g.new_event()?, g.new_event()?)) } else { None };
                if let Some((start, _)) = &events {
                    start.record(&stream)?;
                }
                // SAFETY: the caller's contract covers the arguments; the report is live until `Running` ends.
                unsafe { kernel.launch(&stream, &c, &params)? };
                let end = events.as_ref().map(|(_, end)| end.record(&stream));
                // Set before the end's error returns: the dropped `Running` then leaks the report the kernel
                // still writes instead of freeing it.
                running.run = Some(Run::Gpu { stream, events });
                end.transpose()?;
            }
            _ => {
                // Refused here rather than at `wait`, as on the GPU, where the driver refuses a bad shape at
                // launch: first the shape, then the process's budget of kernel threads.
                gdaki_device::launch::check_host_shape(self.k.name, cfg.grid, cfg.block)
                    .map_err(Error::InvalidArgument)?;
                let threads = gdaki_device::launch::HostThreads::claim(self.k.name, cfg.grid, cfg.block)
                    .map_err(Error::Unavailable)?;
                let (k, report) = (self.k, running.report.clone());
                let name = self.k.name;
                // The end is signalled, not polled for: a waiter wakes as the kernel ends (a panic drops the
                // sender, which wakes it too).
                let (ended, end) = std::sync::mpsc::sync_channel(1);
                let stray = Arc::new(Stray::default());
                let at_end = Arc::clone(&stray);
                let handle = std::thread::Builder::new()
                    .name(format!("kernel {name}"))
                    .spawn(move || {
                        // Ends the stray count even when a kernel thread panicked: `run_on_host` joins them all
                        // and then raises the panic again here.
                        let at_end = EndsStray(at_end);
                        let t0 = Instant::now();
                        // SAFETY: the caller's contract covers the arguments; `report` (held by this thread) is
                        // the launch's report.
                        let r = unsafe { gdaki_device::launch::run_claimed(threads, k, args, report.device_addr()) }
                            .map(|()| t0.elapsed());
                        drop(at_end);
                        let _ = ended.send(());
                        r
                    })
                    .map_err(|e| Error::Unavailable(format!("cannot start the threads of kernel `{name}`: {e}")))?;
                running.run = Some(Run::Cpu { handle, end, stray });
            }
        }
        Ok(running)
    }

    /// A zeroed error report for one launch: one of the pool that no launch holds any more, else a new one.
    /// Reports are never freed after a launch, nor when the kernel drops: on the GPU the pool is the `Gpu`'s
    /// and lives as long as it. Freeing pinned memory (`cuMemFreeHost`) waits for every running kernel of
    /// the device, those of other ranks of the process included, and holds up other threads' CUDA calls
    /// meanwhile, the emulated NICs' among them, so a rank that freed its report after its launch (or
    /// dropped its `Kernel`, made for one launch) could stall a peer's NIC until that peer's kernel, waiting
    /// on the NIC, timed out.
    ///
    /// # Errors
    /// The allocation's.
    fn report(&self) -> Result<Arc<MappedBuf>> {
        let mut kept = self.reports.lock().unwrap_or_else(|p| p.into_inner());
        // A count of 1: only this list holds it (a launch dropped unfinished keeps a count for ever).
        if let Some(r) = kept.iter().find(|r| Arc::strong_count(r) == 1) {
            // SAFETY: a report of this kernel that no launch holds: nothing else reads or writes it.
            unsafe { (r.host_ptr() as *mut ErrorReport).write_volatile(ErrorReport::default()) };
            return Ok(Arc::clone(r));
        }
        let r = Arc::new(self.exec.queue_memory().alloc(size_of::<ErrorReport>())?);
        kept.push(Arc::clone(&r));
        Ok(r)
    }

    /// [`Kernel::start`] then [`Running::wait`] with `timeout`.
    ///
    /// # Errors
    /// As both.
    ///
    /// # Safety
    /// As [`Kernel::start`].
    pub unsafe fn launch(&self, cfg: &LaunchConfig, args: A, timeout: Duration) -> Result<()> {
        // SAFETY: the caller's contract.
        unsafe { self.start(cfg, args) }?.wait(timeout)
    }

    /// [`Kernel::launch`], timed: returns the launch's time. On the GPU that is the time between two CUDA events
    /// recorded on the launch's stream right before and after the kernel (`cuEventElapsedTime`, a resolution
    /// of about 0.5 µs), the kernel's time on the GPU with its start-up there and without the host's launch
    /// call; on the `cpu` executor it is the wall time from starting the kernel's host threads to the last
    /// one's end.
    ///
    /// Hazard: avoid it for a kernel that waits for kernels of other streams (another rank's, the emulated
    /// NIC's engine). Seen on an H200: 8 ranks' collective kernels on one GPU and one emulated NIC, each
    /// launch timed, stalled until their bounded waits failed; launched with [`Kernel::launch`] and timed on
    /// the host, they pass. Not understood; streams share the GPU's hardware work queues
    /// (`CUDA_DEVICE_MAX_CONNECTIONS`, 8 by default), so an event recorded behind a spinning kernel may hold up
    /// work queued after it in the same queue.
    ///
    /// # Errors
    /// As [`Kernel::launch`] (the kernel's error first); [`Error::Cuda`] when an event cannot be made,
    /// recorded or read.
    ///
    /// # Safety
    /// As [`Kernel::start`].
    pub unsafe fn launch_timed(&self, cfg: &LaunchConfig, args: A, timeout: Duration) -> Result<Duration> {
        // SAFETY: the caller's contract.
        let elapsed = unsafe { self.start_with(cfg, args, true) }?.finish(timeout)?;
        elapsed.ok_or_else(|| Error::Cuda {
            message: format!("kernel `{}`: no events timed its launch", self.k.name),
            status: None,
        })
    }
}

enum Run {
    /// The launch's stream, and the events recorded before and after the kernel when it is timed.
    Gpu { stream: cuda::Stream, events: Option<(cuda::Event, cuda::Event)> },
    /// The thread that runs the kernel's host threads (it returns their wall time), the channel on which it
    /// says that they have ended, and whether they outlived the launch's wait.
    Cpu {
        handle: std::thread::JoinHandle<std::result::Result<Duration, String>>,
        end: std::sync::mpsc::Receiver<()>,
        stray: Arc<Stray>,
    },
}

/// Whether a `cpu`-executor kernel outlived its launch's wait: running, stray (the wait timed out or the
/// `Running` was dropped while it ran: counted by [`crate::mem::stray_kernel_started`], so that the memory it
/// may touch is not freed under it) or ended.
#[derive(Default)]
struct Stray(std::sync::atomic::AtomicU8);

impl Stray {
    const RUNNING: u8 = 0;
    const STRAY: u8 = 1;
    const ENDED: u8 = 2;

    /// The wait gave up on the kernel: if it still runs, it is counted until it ends.
    fn abandoned(&self) {
        use std::sync::atomic::Ordering::SeqCst;
        if self.0.compare_exchange(Self::RUNNING, Self::STRAY, SeqCst, SeqCst).is_ok() {
            crate::mem::stray_kernel_started();
        }
    }

    /// The kernel's threads have ended.
    fn ended(&self) {
        if self.0.swap(Self::ENDED, std::sync::atomic::Ordering::SeqCst) == Self::STRAY {
            crate::mem::stray_kernel_ended();
        }
    }
}

/// Marks its kernel [`Stray::ended`] when dropped: at the end of the thread that runs the kernel, panic or not.
struct EndsStray(Arc<Stray>);

impl Drop for EndsStray {
    fn drop(&mut self) {
        self.0.ended();
    }
}

/// A started kernel: [`Running::wait`] for its end and its error. Dropped without waiting, a GPU launch's
/// report memory is leaked rather than freed (a free would wait for the kernel); a `cpu` launch's threads go
/// on, and until they end the `cpu` executor's memory (data buffers, queues) is leaked rather than freed when
/// dropped, since they may still use it.
pub struct Running {
    name: &'static str,
    report: Arc<MappedBuf>,
    run: Option<Run>,
}

impl Running {
    /// Waits at most `timeout` for the kernel to end, then reads its report.
    ///
    /// # Errors
    /// [`Error::Kernel`] with the first error a thread of the kernel returned; [`Error::Device`] when
    /// `timeout` passed first (on the GPU the kernel cannot be stopped, see [`cuda::Stream::wait`]; on the
    /// `cpu` executor its threads go on, and the executor's memory dropped before they end is leaked, not
    /// freed under them: give the launch a timeout longer than the kernel's own bounded waits), and when a
    /// kernel thread panicked on the `cpu` executor (the message names the kernel and the panic);
    /// [`Error::Unavailable`] when the OS refused to start one of the `cpu` executor's host threads (none ran
    /// the kernel); [`Error::Cuda`].
    pub fn wait(self, timeout: Duration) -> Result<()> {
        self.finish(timeout).map(|_| ())
    }

    /// [`Running::wait`], returning the launch's time when it was taken: the events' on the GPU (a timed
    /// launch), the host threads' wall time on the `cpu` executor.
    fn finish(mut self, timeout: Duration) -> Result<Option<Duration>> {
        // Read after the report: the kernel's own error comes first.
        let elapsed = match self.run.take() {
            Some(Run::Gpu { stream, events }) => {
                stream.wait(timeout)?;
                events.map(|(start, end)| end.elapsed_since(&start)).transpose()
            }
            Some(Run::Cpu { handle, end, stray }) => {
                if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = end.recv_timeout(timeout) {
                    stray.abandoned();
                    return Err(Error::Device(format!(
                        "kernel `{}` still running on the cpu executor after {:.3} s (its threads go on)",
                        self.name,
                        timeout.as_secs_f64()
                    )));
                }
                match handle.join() {
                    Ok(Ok(wall)) => Ok(Some(wall)),
                    // The shape and the budget were checked at the launch: what is left is a thread the OS did
                    // not start.
                    Ok(Err(why)) => return Err(Error::Unavailable(why)),
                    Err(p) => {
                        let why = p
                            .downcast_ref::<&str>()
                            .map(|s| s.to_string())
                            .or_else(|| p.downcast_ref::<String>().cloned())
                            .unwrap_or_else(|| "a panic".into());
                        return Err(Error::Device(format!(
                            "kernel `{}` panicked on the cpu executor: {why}",
                            self.name
                        )));
                    }
                }
            }
            None => Ok(None),
        };
        // SAFETY: the kernel has ended; the report is an `ErrorReport` of this launch.
        let report = unsafe { (self.report.host_ptr() as *const ErrorReport).read_volatile() };
        match gdaki_device::Error::from_report(&report) {
            Some(error) => Err(Error::Kernel { kernel: self.name, error }),
            None => elapsed,
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        match &self.run {
            // The kernel may still write the report: keep its memory.
            Some(Run::Gpu { .. }) => std::mem::forget(Arc::clone(&self.report)),
            // Its threads may still use the launch's memory: none is freed until they end.
            Some(Run::Cpu { stray, .. }) => stray.abandoned(),
            None => {}
        }
    }
}
