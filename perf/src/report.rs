//! What `--json` writes: the machine, the build, the plan and every row with its medians and tails, its ratio
//! against Host, and the summary.

use std::path::Path;

use gdaki::exec::Executor;
use gdaki_testkit::porttest::bench::Row;

use crate::table::Ratio;

/// The GPU of a gpu-executor run.
#[derive(Clone, Debug, serde::Serialize)]
pub struct GpuInfo {
    /// `cuDeviceGetName`, e.g. "NVIDIA H200".
    pub name: String,
    /// CUDA version the driver implements (`cuDriverGetVersion`), e.g. "13.0".
    pub cuda_driver: String,
    /// The kernel module's release from /proc/driver/nvidia/version, e.g. "580.159.04", where readable.
    pub driver: Option<String>,
    /// Compute capability, e.g. "9.0".
    pub compute_capability: String,
}

impl GpuInfo {
    /// The GPU of `exec`, or `None` for the cpu executor.
    pub fn of(exec: &Executor) -> Option<Self> {
        let Executor::Gpu(g) = exec else { return None };
        let version = std::fs::read_to_string("/proc/driver/nvidia/version").unwrap_or_default();
        // "NVRM version: NVIDIA UNIX [Open Kernel Module for] x86_64 ... 580.159.04  Release Build ...": the
        // first word of digits and dots.
        let driver = version.lines().next().and_then(|l| {
            l.split_whitespace()
                .find(|w| w.contains('.') && w.chars().all(|c| c.is_ascii_digit() || c == '.'))
                .map(str::to_string)
        });
        let ((cmaj, cmin), (maj, min)) = (g.driver_version(), g.compute_capability());
        Some(Self {
            name: g.name().to_string(),
            cuda_driver: format!("{cmaj}.{cmin}"),
            driver,
            compute_capability: format!("{maj}.{min}"),
        })
    }
}

/// A row as written: the row and its ratio against Host.
#[derive(serde::Serialize)]
pub struct JsonRow<'a> {
    #[serde(flatten)]
    pub row: &'a Row,
    /// Latency rows: t_typical / Host's; bandwidth rows: gbps / Host's; `null` without a Host row.
    pub vs_host: Option<f64>,
}

/// The whole `--json` document.
#[derive(serde::Serialize)]
pub struct Report<'a> {
    /// "gdaki-perf".
    pub program: &'static str,
    /// The subcommand (all, pingpong, packet, bw, bibw, flush).
    pub subcommand: &'a str,
    /// Commit the binary was built from (`-dirty` when the tree had changes; "unknown" without git).
    pub commit: &'static str,
    /// When the run ended, RFC 3339 UTC.
    pub date: String,
    /// Host name of the machine.
    pub host: String,
    /// "cpu" or "gpu".
    pub executor: &'a str,
    /// Where the emulated NIC's queues were: "gpu", "host" or "gpu (simulated)".
    pub queues: &'a str,
    /// The GPU, for the gpu executor.
    pub gpu: Option<GpuInfo>,
    /// Host threads available to the process.
    pub host_threads: usize,
    /// The NIC (`emu`: the emulated mlx5 NIC; else the RDMA device).
    pub nic: String,
    /// Whether both ranks ran in this process.
    pub ranks_in_process: bool,
    /// Whether they shared one NIC (`--one-nic`, with both ranks in this process).
    pub one_nic: bool,
    /// `--quick`.
    pub quick: bool,
    /// Timed iterations of latency rows (most of bandwidth rows).
    pub iters: u32,
    /// The most warm-up iterations a row ran (each row's own count is its `warmup`): `warmup_cap`, or a
    /// tenth of the row's iterations if that is less (at least 1 unless `warmup_cap` is 0).
    pub warmup: u32,
    /// `--warmup`: the most warm-up iterations a row may run.
    pub warmup_cap: u32,
    /// Most bytes a bandwidth row moves.
    pub row_bytes: usize,
    /// Threads per team.
    pub team: u32,
    /// Bound of device-side waits, ms.
    pub timeout_ms: u128,
    /// The modes run, in order.
    pub modes: Vec<&'static str>,
    /// "latency: us per round trip (PingPong, PacketPingPong) or per put + flush (flush tests); bandwidth:
    /// us per iteration, GB/s = 1e9 bytes/s".
    pub units: &'static str,
    /// Every row of rank 0 (checked: payloads checked by the ranks in this process).
    pub rows: Vec<JsonRow<'a>>,
    /// Device/Host latency ratios of PingPong and the PacketPingPongs, with the targets.
    pub summary: &'a [Ratio],
    /// Payloads received and checked byte for byte.
    pub passed: u64,
    /// Rows (or rank setups) that failed.
    pub failed: u64,
}

/// The host name, or "unknown".
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map_or_else(|_| "unknown".into(), |h| h.trim().into())
}

/// Writes `report` to `path`, pretty-printed.
///
/// # Errors
/// The file's error, as one line naming the path.
pub fn write(path: &Path, report: &Report<'_>) -> Result<(), String> {
    let file = std::fs::File::create(path).map_err(|e| format!("--json {}: {e}", path.display()))?;
    serde_json::to_writer_pretty(std::io::BufWriter::new(file), report)
        .map_err(|e| format!("writing {}: {e}", path.display()))
}
