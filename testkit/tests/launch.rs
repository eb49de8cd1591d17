//! The launch API's checks, the same on both executors (on the `cpu` executor no driver checks anything): a
//! kernel must be in the PTX module it is taken from, with the parameter count of its host build, and text
//! without kernels is no module; a real kernel then runs in the launch's shape. The kernels are
//! gdaki-testkit-kernels', built by testkit's build script. The GPU run is `--ignored`.

use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

use gdaki::exec::{Executor, ExecutorKind};
use gdaki::launch::{LaunchConfig, Module};
use gdaki::Error;
use gdaki_device::launch::{DevPtr, KernelFn};
use gdaki_device::Dim3;
use gdaki_shared::coll::CollHandle;
use gdaki_testkit_kernels::entries::{
    GDAKI_ARRAY_SUM, GDAKI_COLL_BROADCAST, GDAKI_FLAG_ECHO, GDAKI_GRID_ROUNDS, GDAKI_SMOKE,
};

/// What `cpu_memory_of_a_kernel_that_outlived_its_wait_is_not_freed_under_it` measures belongs to the whole
/// process: while any `cpu` kernel of the process outlives its launch's wait (as the one of
/// `cpu_launch_wait_is_bounded_and_sees_the_end` does for a moment), every drop of executor memory is leaked (a
/// count the library keeps for the process), and the test's check of that reads the process's virtual size. It
/// runs alone ([`alone`]); every other test of this binary may run beside the others ([`beside`]).
static ONE_AT_A_TIME: RwLock<()> = RwLock::new(());

/// The lock of a test that may run beside the others of this binary but not beside the memory test.
fn beside() -> RwLockReadGuard<'static, ()> {
    // A test that panicked while holding it leaves nothing to repair.
    ONE_AT_A_TIME.read().unwrap_or_else(|p| p.into_inner())
}

/// The lock of the test that runs alone.
fn alone() -> RwLockWriteGuard<'static, ()> {
    ONE_AT_A_TIME.write().unwrap_or_else(|p| p.into_inner())
}

/// A descriptor whose name is not in the PTX.
static ABSENT: KernelFn<(u64,)> = KernelFn { name: "no_such_kernel", host: |_, _, _| {} };
/// `gdaki_smoke`'s name with one parameter more than its PTX entry.
static STALE: KernelFn<(DevPtr<u32>, u64)> = KernelFn { name: "gdaki_smoke", host: |_, _, _| {} };

fn module_checks_kernels_against_the_ptx(kind: ExecutorKind) {
    let (exec, _) = Executor::open(Some(kind)).expect("executor");
    let m = Module::load(&exec, gdaki_testkit::ptx::PTX).expect("the testkit's PTX loads");
    match m.kernel(&ABSENT) {
        Err(Error::InvalidArgument(msg)) => assert!(msg.contains("no kernel `no_such_kernel`"), "{msg}"),
        other => panic!("absent kernel: {:?}", other.err()),
    }
    match m.kernel(&STALE) {
        Err(Error::InvalidArgument(msg)) => {
            assert!(msg.contains("2 parameters, the host build 2 and the report"), "{msg}")
        }
        other => panic!("stale kernel: {:?}", other.err()),
    }
    assert!(matches!(Module::load(&exec, "not ptx"), Err(Error::InvalidArgument(_))));
    // A shape no executor runs is refused when the kernel is started, not when it is waited for.
    let k = m.kernel(&GDAKI_SMOKE).expect("gdaki_smoke is in the PTX");
    let flag = exec.alloc_data(4).expect("buffer");
    // SAFETY: refused before anything runs.
    let zero = unsafe { k.start(&LaunchConfig::linear(0, 4), (flag.dev_ptr::<u32>(),)) };
    assert!(matches!(zero, Err(Error::InvalidArgument(_))), "{:?}", zero.err());
    drop(flag);
    // The real descriptor passes and runs.
    let flag = exec.alloc_data(4).expect("buffer");
    let k = m.kernel(&GDAKI_SMOKE).expect("gdaki_smoke is in the PTX");
    // SAFETY: `flag` is a live 4-byte host buffer for the whole launch.
    unsafe { k.launch(&LaunchConfig::linear(2, 4), (flag.dev_ptr::<u32>(),), Duration::from_secs(10)) }.expect("runs");
    assert_eq!(flag.to_vec().expect("read back"), 1u32.to_ne_bytes());
    // An array by value: its bytes reach the kernel whole.
    let v = [0x0123_4567_89ab_cdef_u64, 1 << 63, 0xfedc_ba98_7654_3210, 7];
    let sum = m.kernel(&GDAKI_ARRAY_SUM).expect("gdaki_array_sum is in the PTX");
    let out = exec.alloc_data(8).expect("buffer");
    // SAFETY: `out` is a live 8-byte buffer for the whole launch.
    unsafe { sum.launch(&LaunchConfig::linear(1, 32), (out.dev_ptr::<u64>(), v), Duration::from_secs(10)) }
        .expect("runs");
    let want = v.iter().fold(0u64, |a, x| a.wrapping_add(*x));
    assert_eq!(out.to_vec().expect("read back"), want.to_ne_bytes());
    // Co-resident launches: as many CTAs as the executor holds at once run (on the GPU, a cooperative launch at
    // the driver's occupancy times the SMs; on the cpu executor two, its limit being thousands of threads); one
    // CTA more is refused when started, naming the limit.
    let most = k.max_co_resident_blocks(Dim3::x(32), 0).expect("the occupancy");
    let ran = match kind {
        ExecutorKind::Cpu => {
            assert_eq!(u64::from(most), gdaki_device::launch::MAX_HOST_THREADS / 32);
            2
        }
        // Every SM of a GPU holds more than one CTA of a warp of this kernel.
        ExecutorKind::Gpu => {
            assert!(most > 16, "{most} CTAs of one warp at once");
            most
        }
    };
    let flag = exec.alloc_data(4).expect("buffer");
    let cfg = LaunchConfig::linear(ran, 32).co_resident();
    // SAFETY: `flag` is a live 4-byte buffer for the whole launch.
    unsafe { k.launch(&cfg, (flag.dev_ptr::<u32>(),), Duration::from_secs(10)) }.expect("a co-resident launch runs");
    assert_eq!(flag.to_vec().expect("read back"), 1u32.to_ne_bytes());
    // SAFETY: refused before anything runs.
    let over = unsafe { k.start(&LaunchConfig::linear(most + 1, 32).co_resident(), (flag.dev_ptr::<u32>(),)) };
    match (kind, over) {
        (ExecutorKind::Gpu, Err(Error::InvalidArgument(msg))) => {
            assert!(msg.contains(&format!("{} CTAs of 32 threads", most + 1)), "{msg}");
            assert!(msg.contains(&format!("cannot all be resident on this GPU, which holds at most {most}")), "{msg}");
        }
        (ExecutorKind::Cpu, Err(Error::InvalidArgument(msg))) => assert!(msg.contains("8192 in all"), "{msg}"),
        (_, other) => panic!("{} co-resident CTAs of 32 threads: {:?}", most + 1, other.err()),
    }
    // On the cpu executor no CTA of a block it does not run is resident.
    if kind == ExecutorKind::Cpu {
        assert_eq!(k.max_co_resident_blocks(Dim3::x(1025), 0).expect("no driver to ask"), 0);
        assert_eq!(k.max_co_resident_blocks(Dim3::new(1, 1, 65), 0).expect("no driver to ask"), 0);
    }
}

/// A kernel's launches reuse their error reports (a free after each launch would wait for every running
/// kernel of the GPU): a launch that fails, then one that succeeds, alternately, each report read as its own
/// launch left it. The kernel is the collectives' broadcast on a handle of 0 ranks (refused:
/// `InvalidArgument::Collective`) and of 1 rank (nothing to do).
fn reports_are_reused_and_start_clean(kind: ExecutorKind) {
    let (exec, _) = Executor::open(Some(kind)).expect("executor");
    let m = Module::load(&exec, gdaki_testkit::ptx::PTX).expect("the testkit's PTX loads");
    let k = m.kernel(&GDAKI_COLL_BROADCAST).expect("in the PTX");
    let bad = exec.upload(&CollHandle { nranks: 0, ..bytemuck::Zeroable::zeroed() }).expect("upload");
    let alone = exec.upload(&CollHandle { nranks: 1, ..bytemuck::Zeroable::zeroed() }).expect("upload");
    for round in 0..3 {
        for (h, fails) in [(&bad, true), (&alone, false)] {
            let args = (h.dev_ptr::<CollHandle>(), 0u32, 0u32, 0u64, 0u64, 0u64);
            // SAFETY: `h` is a live uploaded handle; with 0 or 1 ranks the kernel reads nothing else.
            let r = unsafe { k.launch(&LaunchConfig::linear(1, 1), args, Duration::from_secs(10)) };
            match (fails, r) {
                (true, Err(Error::Kernel { error: gdaki_device::Error::InvalidArgument(a), .. })) => {
                    assert_eq!(a, gdaki_device::error::InvalidArgument::Collective, "round {round}")
                }
                (false, Ok(())) => {}
                (f, r) => panic!("round {round}: expected failure {f}, got {r:?}"),
            }
        }
    }
}

#[test]
fn cpu_reports_are_reused_and_start_clean() {
    let _turn = beside();
    reports_are_reused_and_start_clean(ExecutorKind::Cpu);
}

#[test]
#[ignore = "needs a GPU: run on the H200 with --ignored"]
fn gpu_reports_are_reused_and_start_clean() {
    let _turn = beside();
    let _gpu = gdaki_testkit::gpu_turn();
    reports_are_reused_and_start_clean(ExecutorKind::Gpu);
}

/// A grid-wide barrier (`gdaki_device::grid::GridBarrier`) in a co-resident launch: every thread sees the
/// other CTAs' stores of each round after it. On the GPU with as many CTAs of 64 threads as the GPU holds at
/// once (no emulated NIC runs here, whose engine would take room), on the cpu executor 8.
fn grid_barrier_rounds(kind: ExecutorKind) {
    let (exec, _) = Executor::open(Some(kind)).expect("executor");
    let m = Module::load(&exec, gdaki_testkit::ptx::PTX).expect("the testkit's PTX loads");
    let k = m.kernel(&GDAKI_GRID_ROUNDS).expect("in the PTX");
    let ctas = match kind {
        ExecutorKind::Cpu => 8,
        ExecutorKind::Gpu => k.max_co_resident_blocks(Dim3::x(64), 0).expect("the occupancy"),
    };
    let counter = exec.alloc_data(8).expect("counter");
    let slots = exec.alloc_data(8 * 64 * ctas as usize).expect("slots");
    // SAFETY: the counter (zeroed by the allocation) and one slot per thread live for the whole launch.
    unsafe {
        k.launch(
            &LaunchConfig::linear(ctas, 64).co_resident(),
            (counter.dev_ptr::<u64>(), slots.dev_ptr::<u64>(), 5, 5_000_000_000),
            Duration::from_secs(60),
        )
    }
    .unwrap_or_else(|e| panic!("{ctas} CTAs: {e}"));
    // Every CTA arrived at 10 barriers.
    let mut word = [0u8; 8];
    counter.read(0, &mut word).expect("read back");
    assert_eq!(u64::from_ne_bytes(word), 10 * u64::from(ctas));
}

#[test]
fn cpu_grid_barrier_orders_every_ctas_stores() {
    let _turn = beside();
    grid_barrier_rounds(ExecutorKind::Cpu);
}

#[test]
#[ignore = "needs a GPU: run on the H200 with --ignored"]
fn gpu_grid_barrier_orders_every_ctas_stores() {
    let _turn = beside();
    let _gpu = gdaki_testkit::gpu_turn();
    grid_barrier_rounds(ExecutorKind::Gpu);
}

#[test]
fn cpu_module_checks_kernels_against_the_ptx() {
    let _turn = beside();
    module_checks_kernels_against_the_ptx(ExecutorKind::Cpu);
}

#[test]
#[ignore = "needs a GPU: run on the H200 with --ignored"]
fn gpu_module_checks_kernels_against_the_ptx() {
    let _turn = beside();
    let _gpu = gdaki_testkit::gpu_turn();
    module_checks_kernels_against_the_ptx(ExecutorKind::Gpu);
}

/// On the `cpu` executor a launch whose kernel outlives the host's bound is an error naming it, given when the
/// bound passes (not before, and not long after), and a kernel that ends is seen ending: `gdaki_flag_echo`
/// waits for a flag that is raised only after the timed-out launch, then answers it.
#[test]
fn cpu_launch_wait_is_bounded_and_sees_the_end() {
    let _turn = beside();
    let (exec, _) = Executor::open(Some(ExecutorKind::Cpu)).expect("cpu executor");
    let m = Module::load(&exec, gdaki_testkit::ptx::PTX).expect("the testkit's PTX loads");
    let k = m.kernel(&GDAKI_FLAG_ECHO).expect("in the PTX");
    let flags = exec.queue_memory().alloc(16).expect("two words");
    let words = flags.host_ptr() as *mut u64;
    let bound = Duration::from_millis(300);
    let t0 = Instant::now();
    // SAFETY: two 8-byte-aligned words of host memory, alive until the kernel has answered (below).
    let r = unsafe {
        k.launch(&LaunchConfig::linear(1, 1), (DevPtr::new(flags.device_addr()), 1u32, 20_000_000_000u64), bound)
    };
    let waited = t0.elapsed();
    match r {
        Err(Error::Device(msg)) => assert!(msg.contains("still running on the cpu executor after 0.300 s"), "{msg}"),
        other => panic!("expected the bound's error, got {other:?}"),
    }
    assert!(waited >= bound && waited < bound + Duration::from_secs(2), "waited {waited:?} for a {bound:?} bound");
    // The kernel goes on: raise the ping and wait (bounded) for its answer before the words are freed.
    // SAFETY: the words are live; the kernel reads the first with acquire loads.
    unsafe { std::ptr::write_volatile(words, 1) };
    let t1 = Instant::now();
    // SAFETY: as above; the kernel stores the second with a release store.
    while unsafe { std::ptr::read_volatile(words.add(1)) } != 1 {
        assert!(t1.elapsed() < Duration::from_secs(20), "the kernel never answered the ping");
        std::thread::yield_now();
    }
    // A launch that can end at once ends, and is waited for, well within a generous bound.
    // SAFETY: as above (the ping is already 1, so the kernel answers without waiting).
    unsafe {
        k.launch(
            &LaunchConfig::linear(1, 1),
            (DevPtr::new(flags.device_addr()), 1u32, 1_000_000_000u64),
            Duration::from_secs(20),
        )
    }
    .expect("an echo whose ping is already up ends");
}

/// A `cpu` launch whose threads and those of a launch still running pass the process's budget (8192) is refused
/// by `start`, before any of its threads runs, with `Unavailable` naming the budget; once the running launch has
/// ended, the same launch runs. Before, the refusal came only from the launch's wait. Runs alone: the running
/// launch holds 1024 threads of the budget the other tests' launches share.
#[test]
fn cpu_launch_past_the_thread_budget_is_refused_at_start() {
    let _alone = alone();
    let (exec, _) = Executor::open(Some(ExecutorKind::Cpu)).expect("cpu executor");
    let m = Module::load(&exec, gdaki_testkit::ptx::PTX).expect("the testkit's PTX loads");
    let k = m.kernel(&GDAKI_FLAG_ECHO).expect("in the PTX");
    let flags = exec.queue_memory().alloc(16).expect("two words");
    let words = flags.host_ptr() as *mut u64;
    let args = (DevPtr::new(flags.device_addr()), 1u32, 20_000_000_000u64);
    // SAFETY: two 8-byte-aligned words of host memory, alive until the kernel has ended (its wait below).
    let running = unsafe { k.start(&LaunchConfig::linear(1, 1024), args) }.expect("1024 threads start");
    let t0 = Instant::now();
    // SAFETY: as above; refused before anything of it runs.
    let refused = unsafe { k.start(&LaunchConfig::linear(7169, 1), args) };
    let took = t0.elapsed();
    // SAFETY: the words are live; the kernel's thread 0 reads the first with acquire loads and then answers.
    unsafe { std::ptr::write_volatile(words, 1) };
    running.wait(Duration::from_secs(30)).expect("the running launch ends once pinged");
    match refused {
        Err(Error::Unavailable(msg)) => {
            // 1024 or more: a launch of another test whose thread outlived its wait may still hold one.
            assert!(msg.contains("with 7169 threads while 10"), "{msg}");
            assert!(msg.contains("at most 8192 kernel threads at once in a process"), "{msg}");
        }
        other => panic!("7169 threads beside 1024 running: {:?}", other.map(|_| ())),
    }
    assert!(took < Duration::from_secs(1), "the refusal took {took:?}: it waited for something");
    // SAFETY: as above; the ping is already 1, so thread 0 answers without waiting.
    unsafe { k.launch(&LaunchConfig::linear(7169, 1), args, Duration::from_secs(60)) }
        .expect("the same launch runs once the budget is free");
}

/// A `cpu` kernel that outlives its launch's wait (a launch timeout shorter than the kernel's own bounded
/// wait) while the host drops the memory it polls, as a `launch(..)?` that returns early does: the memory is
/// leaked rather than freed under the kernel's threads, so the process goes on (a free there unmapped the
/// megabyte and the kernel's next poll crashed the process); the kernel ends on its own bound.
#[test]
fn cpu_memory_of_a_kernel_that_outlived_its_wait_is_not_freed_under_it() {
    let _alone = alone();
    let (exec, _) = Executor::open(Some(ExecutorKind::Cpu)).expect("executor");
    let m = Module::load(&exec, gdaki_testkit::ptx::PTX).expect("the testkit's PTX loads");
    let k = m.kernel(&GDAKI_FLAG_ECHO).expect("in the PTX");
    // A megabyte: the allocator returns it to the system when freed, so a read after the free faults.
    let flags = exec.alloc_data(1 << 20).expect("flags");
    let bound = Duration::from_millis(1500);
    let args = (flags.dev_ptr::<u64>(), 1u32, bound.as_nanos() as u64);
    let t0 = Instant::now();
    // SAFETY: `flags` is two 8-byte words of the executor's memory, which the executor keeps for the kernel's
    // threads once the wait gives up on them.
    let r = unsafe { k.launch(&LaunchConfig::linear(1, 1), args, Duration::from_millis(100)) };
    match r {
        Err(Error::Device(msg)) => assert!(msg.contains("still running on the cpu executor"), "{msg}"),
        other => panic!("expected the launch's wait to give up: {other:?}"),
    }
    drop(flags);
    // The kernel polls the dropped words until its bound ends it; only then are drops freed again (waited for
    // rather than slept for: the kernel's end depends on how soon its thread runs).
    until_drops_free(&exec, bound + STRAY_END, "memory is not freed after the kernel ended");
    assert!(t0.elapsed() >= bound, "memory was freed after {:?}, before the kernel's bound", t0.elapsed());
    // Memory is freed again once no kernel outlives its wait: a launch that is waited for runs as ever.
    let flag = exec.alloc_data(4).expect("buffer");
    let smoke = m.kernel(&GDAKI_SMOKE).expect("in the PTX");
    // SAFETY: `flag` is a live 4-byte buffer for the whole launch.
    unsafe { smoke.launch(&LaunchConfig::linear(1, 1), (flag.dev_ptr::<u32>(),), Duration::from_secs(10)) }
        .expect("runs");
    assert!(churn_grows_kib(&exec, 4) < 256 << 10, "memory is not freed after the kernel ended");
    // A kernel that outlives its wait and then panics ends too: memory is freed again after it.
    let panics = m.kernel(&PANICS_LATE).expect("gdaki_smoke's name and parameters");
    // SAFETY: the kernel touches nothing.
    let r = unsafe { panics.launch(&LaunchConfig::linear(1, 1), (flag.dev_ptr::<u32>(),), Duration::from_millis(50)) };
    assert!(matches!(r, Err(Error::Device(_))), "expected the launch's wait to give up: {r:?}");
    // Its 300 ms, then the panic, whose backtrace (RUST_BACKTRACE=1) a debug build symbolizes: with many busy
    // processes on a 2-core machine the kernel ended up to 0.96 s after the launch's wait, 40 ms short of the
    // 1 s sleep that stood here for its end.
    until_drops_free(&exec, STRAY_END, "memory is leaked for good after a stray kernel panicked");
}

/// A kernel of `gdaki_smoke`'s signature whose host build sleeps 300 ms, then panics.
static PANICS_LATE: KernelFn<(DevPtr<u32>,)> = KernelFn {
    name: "gdaki_smoke",
    host: |_, _, _| {
        std::thread::sleep(Duration::from_millis(300));
        panic!("a kernel that panics after its launch's wait gave up");
    },
};

/// How long a stray `cpu` kernel may take to end once its own work is done, before its memory is freed again:
/// far more than the 1 s measured on a loaded 2-core machine in a debug build, so that only memory leaked for
/// good fails the test.
const STRAY_END: Duration = Duration::from_secs(20);

/// Waits until a drop of executor memory frees it again (polling [`churn_grows_kib`]), that is until no kernel
/// of the process outlives its launch's wait; panics with `what` if that takes longer than `within`.
fn until_drops_free(exec: &Executor, within: Duration, what: &str) {
    let t = Instant::now();
    // One allocation a poll: a drop leaks while the kernel runs, and 256 MiB a poll is plenty of leak.
    while churn_grows_kib(exec, 1) >= 128 << 10 {
        assert!(t.elapsed() < within, "{what} (waited {:?})", t.elapsed());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// How much the process's virtual size grows over `allocs` allocations of 256 MiB of the executor's memory,
/// each dropped before the next (KiB): about 0 when drops free, `allocs` × 256 MiB when they leak.
fn churn_grows_kib(exec: &Executor, allocs: usize) -> u64 {
    let vm = || {
        let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
        let line = status.lines().find(|l| l.starts_with("VmSize:")).expect("VmSize");
        line.split_whitespace().nth(1).and_then(|v| v.parse::<u64>().ok()).expect("a size in KiB")
    };
    let before = vm();
    for _ in 0..allocs {
        drop(exec.alloc_data(256 << 20).expect("256 MiB"));
    }
    vm().saturating_sub(before)
}
