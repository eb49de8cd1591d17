//! What a `#[kernel]` function's launch needs on both sides: the types its parameters may have
//! ([`DeviceRepr`], [`DevPtr`]), how its result becomes an [`ErrorReport`] the host reads ([`KernelReturn`]),
//! and, on the host, the kernel's descriptor ([`KernelFn`]) and the `cpu` executor's launcher
//! ([`run_on_host`]).
//!
//! The ABI of a kernel `#[kernel] fn name(t: &Thread, p0: T0, .., pn: Tn)`: a PTX `.entry name` whose
//! parameters are the `Ti` by value (a reference or raw pointer parameter is a [`DevPtr`], one `.u64` device
//! address) followed by one hidden `.u64`, the address of an [`ErrorReport`] (0: none) where the kernel's
//! first error goes. The host's `gdaki::launch` passes exactly that.

use crate::error::{kind, Error, InvalidArgument};
use crate::scope::{Device, Scope};
use gdaki_shared::handle::ErrorReport;

/// A value that can be passed to a kernel by value: `#[repr(C)]` (or a primitive), `Copy`, no padding bytes,
/// no references, and meaningful on the device (addresses are device addresses). As cudarc's `DeviceRepr`.
///
/// # Safety
/// Implement it only for types whose every byte is initialized (no padding), which hold no host-only
/// pointers or references, and whose layout is the same on the host and on nvptx64 (both 64-bit
/// little-endian): the launch copies the value's bytes into the kernel's parameter.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a kernel parameter (it is not `DeviceRepr`)",
    label = "a kernel parameter must be `DeviceRepr`",
    note = "kernel parameters are fixed-size primitives (u8..u64, i8..i64, f32, f64), references or raw \
            pointers (passed as `DevPtr`), gdaki-shared handles and arrays of these: pass a length or an index \
            as `u64`, a flag as `u32`, and anything larger by reference"
)]
pub unsafe trait DeviceRepr: Copy + Send + Sync + 'static {}

macro_rules! device_repr {
    ($($t:ty),*) => {$(
        // SAFETY: a primitive (or a `Pod` handle of gdaki-shared, whose size asserts rule out padding).
        unsafe impl DeviceRepr for $t {}
    )*};
}
device_repr!(u8, u16, u32, u64, i8, i16, i32, i64, f32, f64);
device_repr!(
    gdaki_shared::channel::PortChannelHandle,
    gdaki_shared::handle::SqState,
    gdaki_shared::coll::CollHandle,
    gdaki_shared::handle::QpHandle,
    gdaki_shared::handle::CqHandle,
    gdaki_shared::handle::MrHandle,
    gdaki_shared::handle::RemoteMr,
    gdaki_shared::proxy::FifoHandle
);

// SAFETY: an array has no padding between or around its elements (each one's size is a multiple of its
// alignment) and the layout of its elements, which are `DeviceRepr`: e.g. one channel handle per peer,
// uploaded with `Executor::upload` and passed as `&[PortChannelHandle; N]`.
unsafe impl<T: DeviceRepr, const N: usize> DeviceRepr for [T; N] {}

/// A device address of a `T` (or of the first of several): what a `&T` or `*const T`/`*mut T` parameter of a
/// kernel is at launch, one 8-byte word. On the `cpu` executor device addresses are host addresses.
#[repr(transparent)]
pub struct DevPtr<T> {
    addr: u64,
    _t: core::marker::PhantomData<*const T>,
}

impl<T> DevPtr<T> {
    /// The address `addr` (a device address of memory holding `T`s: a GPU allocation, pinned host memory
    /// mapped into the GPU, or host memory on the `cpu` executor).
    pub const fn new(addr: u64) -> Self {
        DevPtr { addr, _t: core::marker::PhantomData }
    }

    /// The address.
    pub const fn addr(&self) -> u64 {
        self.addr
    }
}

impl<T> Clone for DevPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for DevPtr<T> {}
impl<T> core::fmt::Debug for DevPtr<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "DevPtr({:#x})", self.addr)
    }
}
// SAFETY: an address is a number; what it points to is the kernel's contract.
unsafe impl<T> Send for DevPtr<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for DevPtr<T> {}
// SAFETY: one initialized `u64` (`repr(transparent)`), a device address.
unsafe impl<T: 'static> DeviceRepr for DevPtr<T> {}

/// What a kernel function may return: `()`, or `Result<(), E>` with `E: Into<Error>`, whose error becomes the
/// launch's [`ErrorReport`] (the first one of the launch wins) and, on the host, a `gdaki::Error`.
#[diagnostic::on_unimplemented(
    message = "a kernel cannot return `{Self}`",
    label = "a kernel returns `()` or `Result<(), E>`",
    note = "return `()`, or `gdaki_device::Result<()>` (any `Result<(), E>` with `E: Into<gdaki_device::Error>`, \
            such as `AppError` for the kernel's own checks); hand values back through memory the host reads"
)]
pub trait KernelReturn {
    /// Records `self` in the report at `report` (an [`ErrorReport`]'s address; 0: nowhere).
    fn report(self, report: u64);
}

impl KernelReturn for () {
    #[inline(always)]
    fn report(self, _: u64) {}
}

impl<E: Into<Error>> KernelReturn for Result<(), E> {
    #[inline(always)]
    fn report(self, report: u64) {
        if let Err(e) = self {
            report_error(report, e.into());
        }
    }
}

/// Writes `e` to the report at `report` unless an earlier error of the launch got there first (a CAS on its
/// first word claims it). [`InvalidArgument::Team`] is the exception: a team member gets it when another
/// member could not post, so it is written with that one CAS alone (its report is one word, [`kind::TEAM`]),
/// and any other error of the launch replaces it: the host reads the cause, not the members it failed.
pub fn report_error(report: u64, e: Error) {
    if report == 0 {
        return;
    }
    let word = report as *mut u64;
    if matches!(e, Error::InvalidArgument(InvalidArgument::Team)) {
        // SAFETY: the launch's report (the host allocated it, 8-byte aligned, and passed its address); its first
        // word is only accessed atomically while the launch runs.
        unsafe { Device::cas(word, 0, u64::from(kind::TEAM)) };
        return;
    }
    // SAFETY: as above; the thread whose CAS takes the word (from nothing, or from a Team report) is then the
    // only one to write the report (a Team reporter writes nothing after its CAS).
    unsafe {
        let old = Device::cas(word, 0, CLAIMED);
        let claimed = old == 0 || (old == u64::from(kind::TEAM) && Device::cas(word, old, CLAIMED) == old);
        if claimed {
            (report as *mut ErrorReport).write_volatile(e.to_report());
        }
    }
}

/// The report's first word while its claimant writes it: not 0 (no error) nor a Team report.
const CLAIMED: u64 = u64::MAX;

#[cfg(not(target_arch = "nvptx64"))]
pub use host_side::*;

#[cfg(not(target_arch = "nvptx64"))]
mod host_side {
    use super::DeviceRepr;
    use crate::thread::{host, Dim3, Thread};
    use std::format;
    use std::string::String;
    use std::vec::Vec;

    /// A `#[kernel]` function as the host launches it: its PTX entry's name and, for the `cpu` executor, the
    /// same function called on host threads. `A` is the tuple of its parameters at launch (references and raw
    /// pointers as [`super::DevPtr`]). `#[kernel] fn ping(..)` defines `PING: KernelFn<..>` beside `ping`.
    pub struct KernelFn<A: LaunchArgs> {
        /// The PTX `.entry` name (the function's name).
        pub name: &'static str,
        /// Runs the kernel body for one thread: `(thread, arguments, report address)`.
        pub host: fn(&Thread, &A, u64),
    }

    /// The arguments of a launch: a tuple of up to 8 [`DeviceRepr`] values, in parameter order.
    pub trait LaunchArgs: Copy + Send + Sync + 'static {
        /// The number of arguments (the kernel's PTX entry has one parameter more: the report address).
        const COUNT: usize;
        /// Calls `f` with each argument's bytes, in order.
        fn for_each(&self, f: &mut dyn FnMut(&[u8]));
    }

    /// The bytes of a [`DeviceRepr`] value.
    fn bytes_of<T: DeviceRepr>(v: &T) -> &[u8] {
        // SAFETY: `DeviceRepr` promises every byte of `T` is initialized; the slice borrows `v`.
        unsafe { core::slice::from_raw_parts(v as *const T as *const u8, size_of::<T>()) }
    }

    macro_rules! launch_args {
        ($($n:tt $t:ident),*) => {
            impl<$($t: DeviceRepr),*> LaunchArgs for ($($t,)*) {
                const COUNT: usize = <[&str]>::len(&[$(stringify!($t)),*]);
                #[allow(unused_variables)]
                fn for_each(&self, f: &mut dyn FnMut(&[u8])) {
                    $(f(bytes_of(&self.$n));)*
                }
            }
        };
    }
    launch_args!();
    launch_args!(0 A);
    launch_args!(0 A, 1 B);
    launch_args!(0 A, 1 B, 2 C);
    launch_args!(0 A, 1 B, 2 C, 3 D);
    launch_args!(0 A, 1 B, 2 C, 3 D, 4 E);
    launch_args!(0 A, 1 B, 2 C, 3 D, 4 E, 5 F);
    launch_args!(0 A, 1 B, 2 C, 3 D, 4 E, 5 F, 6 G);
    launch_args!(0 A, 1 B, 2 C, 3 D, 4 E, 5 F, 6 G, 7 H);

    /// Most threads a `cpu` launch runs (each is a host thread, all at once), and most the launches of one
    /// process run at once, together ([`run_on_host`] refuses a launch that would pass it).
    pub const MAX_HOST_THREADS: u64 = 8192;

    /// Kernel threads of `cpu` launches running now in this process (claimed before a launch's threads start,
    /// given back when they have all ended). The OS's limits on a process's threads and memory mappings are
    /// met well before 10^5 threads: seen on a 2-core VM, 16,384 at once made a new thread's stack guard page
    /// fail to map, which aborts the whole process from inside that thread, where a launch cannot catch it.
    static RUNNING_HOST_THREADS: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(0);

    /// The kernel threads of one `cpu` launch in the shape `grid × block`, claimed from the process's budget
    /// ([`MAX_HOST_THREADS`]) and given back when dropped. Claiming before a launch's threads start lets a
    /// launcher refuse the launch at once, while its caller still waits for nothing ([`run_claimed`]).
    #[derive(Debug)]
    pub struct HostThreads {
        grid: Dim3,
        block: Dim3,
    }

    impl HostThreads {
        /// Claims the threads of a launch of kernel `name` in the shape `grid × block`.
        ///
        /// # Errors
        /// [`check_host_shape`]'s message for a shape the executor does not run; a message naming the kernel,
        /// its threads and the threads other launches of the process hold, when together they would pass
        /// [`MAX_HOST_THREADS`]. Nothing is claimed then.
        pub fn claim(name: &str, grid: Dim3, block: Dim3) -> Result<HostThreads, String> {
            use core::sync::atomic::Ordering::Relaxed;
            check_host_shape(name, grid, block)?;
            let n = grid.count().saturating_mul(block.count());
            RUNNING_HOST_THREADS
                .fetch_update(Relaxed, Relaxed, |running| {
                    (running.saturating_add(n) <= MAX_HOST_THREADS).then_some(running + n)
                })
                .map(|_| HostThreads { grid, block })
                .map_err(|running| {
                    format!(
                        "launch of `{name}` with {n} threads while {running} threads of other launches run: the \
                         cpu executor runs at most {MAX_HOST_THREADS} kernel threads at once in a process"
                    )
                })
        }
    }

    impl Drop for HostThreads {
        fn drop(&mut self) {
            let n = self.grid.count() * self.block.count();
            RUNNING_HOST_THREADS.fetch_sub(n, core::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Runs `k` on host threads in the shape `grid × block`, every thread at once (one host thread per GPU
    /// thread: kernels may wait on each other, as two ranks' CTAs do), and returns when all have returned. A
    /// panic of a kernel thread is passed on after the others have finished.
    ///
    /// # Errors
    /// A message when a dimension is 0, the block is deeper than [`MAX_BLOCK_Z`] or has more than 1024
    /// threads, or the launch more than [`MAX_HOST_THREADS`], or the launch's threads and those of other
    /// `cpu` launches of the process running now more than [`MAX_HOST_THREADS`] together (nothing runs);
    /// or when the OS refuses to start one of the threads (none runs the kernel then).
    ///
    /// # Safety
    /// `args` must be what the kernel's contract asks for (its pointers valid host memory for the run);
    /// `report` 0 or the address of a writable [`crate::ErrorReport`](gdaki_shared::handle::ErrorReport).
    pub unsafe fn run_on_host<A: LaunchArgs>(
        k: &KernelFn<A>,
        grid: Dim3,
        block: Dim3,
        args: A,
        report: u64,
    ) -> Result<(), String> {
        let threads = HostThreads::claim(k.name, grid, block)?;
        // SAFETY: the caller's contract.
        unsafe { run_claimed(threads, k, args, report) }
    }

    /// [`run_on_host`] in the shape of `claimed`, claimed earlier; the claim is given back when the kernel's
    /// threads have all ended (`claimed` lives to the end of this call, after they are joined).
    ///
    /// # Errors
    /// A message when the OS refuses to start one of the threads (none runs the kernel then).
    ///
    /// # Safety
    /// As [`run_on_host`].
    pub unsafe fn run_claimed<A: LaunchArgs>(
        claimed: HostThreads,
        k: &KernelFn<A>,
        args: A,
        report: u64,
    ) -> Result<(), String> {
        let (grid, block) = (claimed.grid, claimed.block);
        let (blocks, threads) = (grid.count(), block.count());
        let host_fn = k.host;
        // Every thread waits at this gate until all are spawned (GATE_SHUT): if one cannot be, none runs the
        // kernel (a block whose threads are not all there would wait forever in its barrier). Threads park
        // rather than share a mutex, so that thousands of them start without contending.
        const GATE_SHUT: u8 = 0;
        const GATE_RUN: u8 = 1;
        const GATE_ABORT: u8 = 2;
        let gate = std::sync::atomic::AtomicU8::new(GATE_SHUT);
        let launch = host::next_launch();
        let mut failed = None;
        std::thread::scope(|s| {
            let mut handles = Vec::with_capacity((blocks * threads) as usize);
            'spawn: for b in 0..blocks {
                let barrier = std::sync::Arc::new(host::BlockBarrier::new(threads as u32));
                let block_idx = unlinear(grid, b);
                for t in 0..threads {
                    let ctx = host::Context {
                        launch,
                        thread_idx: unlinear(block, t),
                        block_idx,
                        block_dim: block,
                        grid_dim: grid,
                        block: barrier.clone(),
                    };
                    let (args, gate) = (&args, &gate);
                    let spawned = std::thread::Builder::new().spawn_scoped(s, move || {
                        let thread = Thread::on_host(ctx);
                        let mut state = gate.load(std::sync::atomic::Ordering::Acquire);
                        while state == GATE_SHUT {
                            // Woken by the spawner's unpark (or spuriously: the loop checks again).
                            std::thread::park();
                            state = gate.load(std::sync::atomic::Ordering::Acquire);
                        }
                        if state == GATE_RUN {
                            host_fn(&thread, args, report)
                        }
                    });
                    match spawned {
                        Ok(h) => handles.push(h),
                        Err(e) => {
                            failed = Some(format!(
                                "launch of `{}`: cannot start host thread {} of {}: {e}",
                                k.name,
                                b * threads + t,
                                blocks * threads
                            ));
                            break 'spawn;
                        }
                    }
                }
            }
            let open = if failed.is_none() { GATE_RUN } else { GATE_ABORT };
            gate.store(open, std::sync::atomic::Ordering::Release);
            for h in &handles {
                h.thread().unpark();
            }
            let mut panic = None;
            for h in handles {
                if let Err(p) = h.join() {
                    panic.get_or_insert(p);
                }
            }
            if let Some(p) = panic {
                std::panic::resume_unwind(p);
            }
        });
        if let Some(f) = failed {
            return Err(f);
        }
        Ok(())
    }

    /// The deepest block a launch takes (CUDA's `maxBlockDimZ`, the same on every GPU).
    pub const MAX_BLOCK_Z: u32 = 64;

    /// Whether [`run_on_host`] runs kernel `name` in this shape: no dimension 0, a block's z at most
    /// [`MAX_BLOCK_Z`] (as the GPU requires), at most 1024 threads per block and [`MAX_HOST_THREADS`] in all.
    ///
    /// # Errors
    /// A message naming the kernel, the shape and the limit it breaks.
    pub fn check_host_shape(name: &str, grid: Dim3, block: Dim3) -> Result<(), String> {
        let (blocks, threads) = (grid.count(), block.count());
        if blocks == 0 || threads == 0 {
            return Err(format!("launch of `{name}` with grid {grid:?} and block {block:?}: a dimension is 0"));
        }
        // Every GPU refuses a block deeper than 64 (CUDA's maxBlockDimZ) at launch, 1024 threads or not: refused
        // here too, so that a shape tested on host threads launches on the GPU. (The other per-dimension limits,
        // 1024 in x and y and 65,535 blocks in y and z, cannot be broken by a launch within the totals below.)
        if block.z > MAX_BLOCK_Z {
            return Err(format!(
                "launch of `{name}` with block {block:?}: a block has a z of at most {MAX_BLOCK_Z} (on the GPU too)"
            ));
        }
        if threads > 1024 || blocks.saturating_mul(threads) > MAX_HOST_THREADS {
            return Err(format!(
                "launch of `{name}` with {blocks} block(s) of {threads} threads: the cpu executor runs at most 1024 \
                 threads per block and {MAX_HOST_THREADS} in all"
            ));
        }
        Ok(())
    }

    /// The index of linear number `i` in a box of size `d`.
    fn unlinear(d: Dim3, i: u64) -> Dim3 {
        let (x, y) = (d.x as u64, d.y as u64);
        Dim3::new((i % x) as u32, ((i / x) % y) as u32, (i / (x * y)) as u32)
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        use crate::launch::{report_error, DevPtr, KernelReturn};
        use gdaki_shared::handle::ErrorReport;
        use std::sync::atomic::{AtomicU64, Ordering};
        use std::vec::Vec;

        fn sum_kernel(t: &Thread, a: &(DevPtr<AtomicU64>, u64), report: u64) {
            // SAFETY: the test passes the address of a live atomic.
            let total = unsafe { &*(a.0.addr() as *const AtomicU64) };
            total.fetch_add(t.global_id() + a.1, Ordering::Relaxed);
            // Every thread of the block sees the others' adds after the barrier, and the OR of "am I thread 1".
            let any = t.sync_threads_or(t.tid() == 1);
            let r: Result<(), crate::Error> =
                if any { Ok(()) } else { Err(crate::Error::InvalidArgument(crate::error::InvalidArgument::Handle)) };
            r.report(report);
        }

        /// Waits until the word at `a.0` is nonzero (bounded: 30 s).
        fn wait_kernel(_: &Thread, a: &(DevPtr<AtomicU64>,), _: u64) {
            // SAFETY: the test passes the address of a live atomic.
            let flag = unsafe { &*(a.0.addr() as *const AtomicU64) };
            let t = std::time::Instant::now();
            while flag.load(Ordering::Acquire) == 0 && t.elapsed() < std::time::Duration::from_secs(30) {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }

        /// Launches running at once share the process's budget of kernel threads: while one of 1024 threads
        /// waits, another of 7169 (each within the limit alone) is refused before any of its threads starts,
        /// naming the budget. Before, launches in one process could together start more threads than the OS
        /// allows, and one thread's failure to set up its stack aborted the process. (Other tests' launches
        /// running meanwhile only take more of the budget.)
        #[test]
        fn launches_running_at_once_share_the_thread_budget() {
            let flag = AtomicU64::new(0);
            let k = KernelFn { name: "wait", host: wait_kernel };
            let args = (DevPtr::new(&flag as *const AtomicU64 as u64),);
            std::thread::scope(|s| {
                // SAFETY: `flag` outlives the scope, which joins the launch.
                let waiting = s.spawn(|| unsafe { run_on_host(&k, Dim3::x(1), Dim3::x(1024), args, 0) });
                let t = std::time::Instant::now();
                while RUNNING_HOST_THREADS.load(Ordering::Relaxed) < 1024 {
                    assert!(!waiting.is_finished(), "the launch of 1024 threads ended before it was seen running");
                    assert!(t.elapsed() < std::time::Duration::from_secs(30), "the launch of 1024 threads never ran");
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                // SAFETY: refused before any thread starts.
                let refused = unsafe { run_on_host(&k, Dim3::x(7169), Dim3::x(1), args, 0) };
                flag.store(1, Ordering::Release);
                let msg = refused.expect_err("7169 threads beside 1024 running");
                assert!(msg.contains("at most 8192 kernel threads at once in a process"), "{msg}");
                waiting.join().unwrap().unwrap();
            });
        }

        #[test]
        fn every_thread_runs_once_with_its_indices_and_the_barrier_ors() {
            let total = AtomicU64::new(0);
            let k = KernelFn { name: "sum", host: sum_kernel };
            let args = (DevPtr::new(&total as *const AtomicU64 as u64), 1000);
            let mut report = gdaki_shared::handle::ErrorReport::default();
            // SAFETY: `total` and `report` outlive the run.
            unsafe { run_on_host(&k, Dim3::new(3, 2, 1), Dim3::new(4, 2, 1), args, &mut report as *mut _ as u64) }
                .unwrap();
            // 48 threads: global ids 0..48, each adds its id + 1000.
            assert_eq!(total.load(Ordering::Relaxed), (0..48).sum::<u64>() + 48 * 1000);
            assert_eq!(report.kind, 0, "every block has a thread 1");
            // One thread per block: nobody is thread 1, every thread reports, the first wins.
            // SAFETY: as above.
            unsafe { run_on_host(&k, Dim3::x(2), Dim3::x(1), args, &mut report as *mut _ as u64) }.unwrap();
            assert_eq!(
                crate::Error::from_report(&report),
                Some(crate::Error::InvalidArgument(crate::error::InvalidArgument::Handle))
            );
            let _ = report_error;
        }

        #[test]
        fn shapes_the_cpu_executor_refuses() {
            let k = KernelFn { name: "k", host: |_: &Thread, _: &(), _| {} };
            // SAFETY: the kernel touches nothing.
            unsafe {
                assert!(run_on_host(&k, Dim3::x(0), Dim3::x(1), (), 0).unwrap_err().contains("a dimension is 0"));
                assert!(run_on_host(&k, Dim3::x(1), Dim3::x(1025), (), 0).unwrap_err().contains("1024 threads"));
                assert!(run_on_host(&k, Dim3::x(9), Dim3::x(1024), (), 0).unwrap_err().contains("8192 in all"));
                // The GPU's block is at most 64 threads deep (CUDA's maxBlockDimZ): the driver refuses a deeper
                // one at launch, so the cpu executor does too, although 1024 threads would fit.
                assert!(run_on_host(&k, Dim3::x(1), Dim3::new(1, 1, 65), (), 0)
                    .unwrap_err()
                    .contains("z of at most 64"));
                assert!(run_on_host(&k, Dim3::x(1), Dim3::new(2, 2, 64), (), 0).is_ok());
            }
            // Counts past u64 (2^96 blocks) and products past it (2^64 blocks of 2 threads) are refused, not
            // an overflow panic.
            for (grid, block) in
                [(Dim3::new(u32::MAX, u32::MAX, u32::MAX), Dim3::x(1)), (Dim3::new(u32::MAX, u32::MAX, 1), Dim3::x(2))]
            {
                assert!(check_host_shape("k", grid, block).unwrap_err().contains("8192 in all"), "{grid:?} {block:?}");
            }
        }

        #[test]
        fn a_thread_that_returns_early_does_not_stall_the_barrier() {
            let k = KernelFn {
                name: "early",
                host: |t: &Thread, _: &(), _| {
                    if t.tid() == 0 {
                        return;
                    }
                    t.sync_threads();
                    t.sync_threads();
                },
            };
            // On a thread of its own, so that a barrier that stalls fails the test in bounded time rather than
            // hanging it (the stalled threads are left behind; the failure ends the test binary).
            let (done, ended) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                // SAFETY: the kernel touches nothing.
                let r = unsafe { run_on_host(&k, Dim3::x(2), Dim3::x(8), (), 0) };
                let _ = done.send(r);
            });
            match ended.recv_timeout(std::time::Duration::from_secs(30)) {
                Ok(r) => r.unwrap(),
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => panic!(
                    "the launch did not end within 30 s: the threads that still sync wait for the one that returned"
                ),
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => panic!("the launch panicked"),
            }
        }

        /// The report after `errors` are reported in this order.
        fn reported(errors: &[crate::Error]) -> Option<crate::Error> {
            let mut report = ErrorReport::default();
            for &e in errors {
                report_error(&mut report as *mut ErrorReport as u64, e);
            }
            crate::Error::from_report(&report)
        }

        #[test]
        fn a_team_error_gives_way_to_its_cause() {
            use crate::error::{CqeError, InvalidArgument::*, RangeError};
            use crate::Error::{Cqe, InvalidArgument as Inval};
            let cqe = Cqe(CqeError { syndrome: 0x13, vendor_err_synd: 0x32, wqe_counter: 5, qpn: 0xab_cdef });
            let (remote, local) = (RangeError::remote(4088, 16, 4096).into(), RangeError::local(1 << 40, 1, 64).into());
            assert_eq!(reported(&[Inval(Team), remote, Inval(Team)]), Some(remote));
            assert_eq!(reported(&[Inval(Length), Inval(Team)]), Some(Inval(Length)));
            assert_eq!(reported(&[Inval(Team), Inval(Team)]), Some(Inval(Team)));
            // Between two causes the first one stays.
            assert_eq!(reported(&[Inval(Team), cqe, local]), Some(cqe));
            assert_eq!(reported(&[]), None);
        }

        /// A CTA of 64 threads whose thread `bad` fails with a range error and every other with `Team` (as a
        /// team put reports them): the launch's report is the range error, whichever thread gets there first.
        fn team_kernel(t: &Thread, bad: &(u32,), report: u64) {
            let e = if t.tid() == bad.0 {
                crate::error::RangeError::remote(u64::from(bad.0), 64, 32).into()
            } else {
                crate::Error::InvalidArgument(crate::error::InvalidArgument::Team)
            };
            Err::<(), _>(e).report(report);
        }

        #[test]
        fn a_launch_reports_the_member_that_failed_a_team_not_the_others() {
            let k = KernelFn { name: "team", host: team_kernel };
            for bad in [0u32, 1, 31, 63] {
                for _ in 0..5 {
                    let mut report = ErrorReport::default();
                    // SAFETY: the kernel writes the report only.
                    unsafe { run_on_host(&k, Dim3::x(1), Dim3::x(64), (bad,), &mut report as *mut _ as u64) }.unwrap();
                    let got = crate::Error::from_report(&report);
                    assert_eq!(got, Some(crate::error::RangeError::remote(u64::from(bad), 64, 32).into()));
                }
            }
        }

        #[test]
        fn launch_args_are_their_bytes_in_order() {
            let mut seen = Vec::new();
            (7u32, DevPtr::<u8>::new(0x1122), -1i64).for_each(&mut |b| seen.push(b.to_vec()));
            assert_eq!(
                seen,
                [7u32.to_ne_bytes().to_vec(), 0x1122u64.to_ne_bytes().to_vec(), (-1i64).to_ne_bytes().to_vec()]
            );
        }
    }
}
