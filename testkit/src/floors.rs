//! Platform floors: what any path of the emulated NIC pays on this machine, measured in the same run as the
//! benchmarks they bound. On the `gpu` executor: the round trip between a GPU thread and a host thread through
//! flags in pinned host memory (the least a doorbell seen by the host and a CQE seen by the GPU can cost), the
//! latency of a small device-to-device copy and a synchronize (what the emulated NIC pays per ordering point
//! on GPU memory), and the device-to-device copy bandwidth by size. On the `cpu` executor the flag round trip
//! is between two host threads and the copies are `memcpy`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use gdaki::exec::Executor;
use gdaki::launch::{LaunchConfig, Module};
use gdaki::mem::{GpuCopier, MappedBuf, MemKind, MemLoc};
use gdaki::{Error, Result};
use gdaki_device::launch::DevPtr;
use gdaki_testkit_kernels::entries::GDAKI_FLAG_ECHO;

use crate::perftest::LatencyRow;

/// Sizes of the copy-bandwidth rows, bytes.
pub const COPY_SIZES: [usize; 4] = [64 << 10, 1 << 20, 16 << 20, 128 << 20];

/// One copy-bandwidth row.
#[derive(Clone, Debug, serde::Serialize)]
pub struct CopyRow {
    /// Bytes per copy.
    pub bytes: usize,
    /// Copies timed (one synchronize after all).
    pub copies: u32,
    /// Bytes per second over all copies, GB/s (10^9).
    pub gb_per_s: f64,
}

/// The floors of one executor.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Floors {
    /// `gpu` or `cpu`.
    pub executor: String,
    /// GPU thread (or host thread on `cpu`) <-> host thread round trip through flags in pinned (host) memory,
    /// µs; `bytes` is 8 (the flag).
    pub flag_round_trip: LatencyRow,
    /// An 8-byte device-to-device copy and a synchronize of its stream (GPU only), µs.
    pub small_copy_sync: Option<LatencyRow>,
    /// Device-to-device copy bandwidth by size (memcpy between host buffers on `cpu`).
    pub copy: Vec<CopyRow>,
}

/// Measures the floors on `exec`: `iters` flag round trips and small copies, and each copy size for about
/// 0.2 s. `ptx` is the module holding `gdaki_flag_echo` ([`crate::ptx::PTX`]).
///
/// # Errors
/// The executor's, or [`Error::Device`] when the echo kernel stopped answering (it waits at most 1 s per ping).
pub fn measure(exec: &Executor, ptx: &str, iters: u32) -> Result<Floors> {
    let flag_round_trip = flag_round_trip(exec, ptx, iters)?;
    let (small_copy_sync, copy) = match exec {
        Executor::Gpu(g) => {
            let copier = g.copier()?;
            let max = *COPY_SIZES.iter().max().unwrap_or(&(1 << 20));
            let (a, b) = (g.alloc_device(max)?, g.alloc_device(max)?);
            let loc = |d: &gdaki::cuda::DeviceBuffer| MemLoc { kind: MemKind::Gpu, addr: d.device_addr() };
            let (src, dst) = (loc(&a), loc(&b));
            let mut small = Vec::with_capacity(iters as usize);
            for _ in 0..iters {
                let t = Instant::now();
                // SAFETY: both buffers hold `max` >= 8 bytes and outlive the synchronize below.
                unsafe { copier.copy_async(dst, src, 8)? };
                copier.synchronize()?;
                small.push(t.elapsed().as_nanos() as u64);
            }
            let rows = COPY_SIZES
                .iter()
                .map(|&bytes| {
                    time_copies(
                        bytes,
                        || {
                            // SAFETY: as above; `bytes` <= `max`.
                            unsafe { copier.copy_async(dst, src, bytes) }
                        },
                        || copier.synchronize(),
                    )
                })
                .collect::<Result<Vec<_>>>()?;
            (LatencyRow::from_ns(8, &small), rows)
        }
        Executor::Cpu => {
            let max = *COPY_SIZES.iter().max().unwrap_or(&(1 << 20));
            let (src, mut dst) = (vec![1u8; max], vec![0u8; max]);
            let rows = COPY_SIZES
                .iter()
                .map(|&bytes| {
                    time_copies(
                        bytes,
                        || {
                            dst[..bytes].copy_from_slice(&src[..bytes]);
                            std::hint::black_box(&mut dst);
                            Ok(())
                        },
                        || Ok(()),
                    )
                })
                .collect::<Result<Vec<_>>>()?;
            (None, rows)
        }
    };
    Ok(Floors { executor: format!("{:?}", exec.kind()).to_lowercase(), flag_round_trip, small_copy_sync, copy })
}

/// Copies of `bytes` until about 0.2 s have passed (at least 4), one synchronize at the end.
fn time_copies(bytes: usize, mut copy: impl FnMut() -> Result<()>, sync: impl Fn() -> Result<()>) -> Result<CopyRow> {
    copy()?;
    sync()?;
    let start = Instant::now();
    let mut copies = 0u32;
    while copies < 4 || start.elapsed() < Duration::from_millis(200) {
        for _ in 0..4 {
            copy()?;
        }
        copies += 4;
        sync()?;
    }
    let secs = start.elapsed().as_secs_f64();
    Ok(CopyRow { bytes, copies, gb_per_s: bytes as f64 * copies as f64 / secs / 1e9 })
}

/// The two flags, as the host sees them.
fn flags(buf: &MappedBuf) -> &[AtomicU64; 2] {
    // SAFETY: the buffer is page aligned, at least 16 bytes, and outlives the borrow.
    unsafe { &*buf.host_ptr().cast::<[AtomicU64; 2]>() }
}

/// `iters` round trips through two flags in the executor's queue memory (pinned and mapped on the GPU).
fn flag_round_trip(exec: &Executor, ptx: &str, iters: u32) -> Result<LatencyRow> {
    let buf = exec.queue_memory().alloc(16)?;
    let f = flags(&buf);
    let echo = Module::load(exec, ptx)?.kernel(&GDAKI_FLAG_ECHO)?;
    let warmup = iters / 10 + 1;
    let total = warmup + iters;
    let timeout_ns = 1_000_000_000;
    // SAFETY: `buf` holds the two flags and outlives the run, which is waited for below.
    let run = unsafe { echo.start(&LaunchConfig::linear(1, 1), (DevPtr::new(buf.device_addr()), total, timeout_ns))? };
    let mut samples = Vec::with_capacity(iters as usize);
    let mut answered = true;
    for k in 1..=total as u64 {
        let t = Instant::now();
        f[0].store(k, Ordering::Release);
        while f[1].load(Ordering::Acquire) < k {
            if t.elapsed() > Duration::from_secs(2) {
                answered = false;
                break;
            }
            std::hint::spin_loop();
        }
        if !answered {
            break;
        }
        if k > warmup as u64 {
            samples.push(t.elapsed().as_nanos() as u64);
        }
    }
    run.wait(Duration::from_secs(5))?;
    if !answered {
        return Err(Error::Device("the flag echo kernel stopped answering".into()));
    }
    LatencyRow::from_ns(8, &samples).ok_or_else(|| Error::InvalidArgument("floors: 0 iterations".into()))
}

/// The floors as a table: one line per floor, µs and GB/s.
pub fn table(f: &Floors) -> String {
    let mut out = format!("platform floors ({} executor)\n", f.executor);
    let lat = |name: &str, r: &LatencyRow| {
        format!("  {name:<44} median {:>8.2} µs   99% {:>8.2} µs   ({} samples)\n", r.t_typical, r.p99, r.iterations)
    };
    out += &lat("flag round trip (pinned host memory)", &f.flag_round_trip);
    if let Some(r) = &f.small_copy_sync {
        out += &lat("8-byte D2D copy + synchronize", r);
    }
    for c in &f.copy {
        out += &format!(
            "  {:<44} {:>8.1} GB/s   ({} copies)\n",
            format!("copy of {} KiB", c.bytes >> 10),
            c.gb_per_s,
            c.copies
        );
    }
    out
}
