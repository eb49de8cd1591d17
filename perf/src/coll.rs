//! `gdaki-perf coll`: the collectives (broadcast, reduce, all-reduce on the NIC and by the ring, all-to-all-v) timed and checked over a
//! range of sizes, printed in nccl-tests' table shape.
//!
//! N ranks in this process (threads, each with its own emulated NIC over the wire; 8 share one NIC, as the
//! collectives' tests do), or one rank per process (`--world-size/--rank/--bootstrap` or mpirun's
//! environment). Every iteration refills every rank's buffer from a seed and checks every output byte (every
//! reduced value within the NIC reduce's error bound) against what is computed here on the host.
//!
//! Timing: each iteration is one call of the harness ([`CollRank`]), which waits at the bootstrap barrier and
//! then launches the kernel; each rank times its call on the host from the launch to the kernel's end (the
//! barrier left out), the iteration's time is the largest over the ranks, and a row's time is the median over
//! its iterations (the JSON keeps the 99th percentile too). A rank's kernel may start before its peers' and
//! wait for them inside the call: that wait is in its time, as it is in nccl-tests' event-timed loops. Not
//! CUDA events, nor the kernel's own clock: with 8 ranks on one GPU either stalled the ranks.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use gdaki::bootstrap::Launch;
use gdaki::channel::{Communicator, RankSetup};
use gdaki::coll::CollConfig;
use gdaki::exec::{Executor, ExecutorKind};
use gdaki_device::coll::{Algorithm, Broadcast, Reduce, RingAllReduce};
use gdaki_testkit::coll::CollRank;
use serde::Serialize;

/// A collective of the benchmark. Adding one: a variant here, its name in [`Op::name`] and `value_enum`, its
/// shape in [`Op::shape`], and its call and check in [`run_op`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    /// Broadcast of bytes from `--root` (by each `--algorithm`).
    Broadcast,
    /// Sum of `f32`s into `--root`'s output, on the NIC.
    Reduce,
    /// Sum of `f32`s into every rank's output (the reduce, then a broadcast by each `--algorithm`).
    #[value(name = "all_reduce")]
    AllReduce,
    /// All-to-all with per-peer byte counts (split unevenly by a seeded pattern).
    #[value(name = "all_to_all_v")]
    AllToAllV,
    /// Sum of `f32`s into every rank's output, by the ring (reduce-scatter then all-gather, the adds made
    /// by device code).
    #[value(name = "all_reduce_ring")]
    AllReduceRing,
}

impl Op {
    /// The op's name in tables and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Op::Broadcast => "broadcast",
            Op::Reduce => "reduce",
            Op::AllReduce => "all_reduce",
            Op::AllToAllV => "all_to_all_v",
            Op::AllReduceRing => "all_reduce_ring",
        }
    }

    /// (element type, its bytes, reduction, whether it has a root, whether it takes an algorithm,
    /// out-of-place supported, in-place supported).
    fn shape(self) -> Shape {
        match self {
            Op::Broadcast => {
                Shape { ty: "uint8", elem: 1, redop: "none", rooted: true, algorithm: true, oop: false, ip: true }
            }
            Op::Reduce => {
                Shape { ty: "float", elem: 4, redop: "sum", rooted: true, algorithm: false, oop: true, ip: true }
            }
            Op::AllReduce => {
                Shape { ty: "float", elem: 4, redop: "sum", rooted: false, algorithm: true, oop: true, ip: true }
            }
            Op::AllReduceRing => {
                Shape { ty: "float", elem: 4, redop: "sum", rooted: false, algorithm: false, oop: true, ip: true }
            }
            Op::AllToAllV => {
                Shape { ty: "uint8", elem: 1, redop: "none", rooted: false, algorithm: false, oop: true, ip: false }
            }
        }
    }

    /// nccl-tests' bus-bandwidth factor on `n` ranks: busbw = algbw × factor.
    fn bus_factor(self, n: u32) -> f64 {
        let n = f64::from(n);
        match self {
            Op::Broadcast | Op::Reduce => 1.0,
            Op::AllReduce | Op::AllReduceRing => 2.0 * (n - 1.0) / n,
            Op::AllToAllV => (n - 1.0) / n,
        }
    }
}

/// How an op's rows look.
struct Shape {
    ty: &'static str,
    elem: usize,
    redop: &'static str,
    rooted: bool,
    algorithm: bool,
    /// Out-of-place supported (broadcast is in place by nature: one range on every rank).
    oop: bool,
    /// In-place supported (all-to-all-v's receive region is apart from its send region).
    ip: bool,
}

/// A broadcast algorithm on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum AlgArg {
    /// The root puts to every rank.
    Direct,
    /// A pipelined chain.
    Chain,
    /// A pipelined binary tree.
    Tree,
}

impl AlgArg {
    fn algorithm(self) -> Algorithm {
        match self {
            AlgArg::Direct => Algorithm::Direct,
            AlgArg::Chain => Algorithm::Chain,
            AlgArg::Tree => Algorithm::Tree,
        }
    }
    fn name(self) -> &'static str {
        match self {
            AlgArg::Direct => "direct",
            AlgArg::Chain => "chain",
            AlgArg::Tree => "tree",
        }
    }
}

/// A byte count with nccl-tests' suffixes: `8`, `1K`, `1M`, `128M`, `1G` (binary: K = 1024).
pub fn parse_bytes(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let (num, mul) = match t.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&t[..t.len() - 1], 1usize << 10),
        Some('M') => (&t[..t.len() - 1], 1 << 20),
        Some('G') => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    let n: usize = num.parse().map_err(|_| format!("'{s}' is not a byte count (e.g. 8, 1K, 1M, 128M)"))?;
    n.checked_mul(mul).ok_or_else(|| format!("'{s}' is too large"))
}

/// The largest `-b`/`-e`, bytes per rank (1 GiB): each rank's buffer is four times the largest size
/// ([`layout`]), and every iteration copies all of it to the host besides the sizes it fills there, so a
/// limit keeps each rank's memory within a host's, and the layout's sums far from overflowing.
const MAX_BYTES: usize = 1 << 30;

/// A size of `-b`/`-e`: a byte count as [`parse_bytes`] reads it, at most [`MAX_BYTES`].
fn parse_size(s: &str) -> Result<usize, String> {
    let n = parse_bytes(s)?;
    if n > MAX_BYTES {
        return Err(format!("{n} bytes per rank is above the most coll takes, 1G ({MAX_BYTES} bytes)"));
    }
    Ok(n)
}

/// A duration in seconds (`2`, `0.5`) or with a unit (`2s`, `500ms`), more than 0 and less than 10^6 s either
/// way (the collectives refuse a zero timeout, only once every rank has set up).
fn parse_timeout(s: &str) -> Result<Duration, String> {
    let d = match s.parse::<f64>() {
        Ok(secs) => Duration::try_from_secs_f64(secs).map_err(|e| format!("bad timeout '{s}': {e}"))?,
        Err(_) => humantime::parse_duration(s).map_err(|e| format!("bad timeout '{s}': {e}"))?,
    };
    if d.is_zero() || d >= Duration::from_secs(1_000_000) {
        return Err(format!("bad timeout '{s}': more than 0 and less than 1000000 s"));
    }
    Ok(d)
}

/// `gdaki-perf coll`'s flags.
#[derive(clap::Args, Debug, Clone)]
pub struct CollOpts {
    /// Collectives, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "broadcast,reduce,all_reduce,all_reduce_ring,all_to_all_v")]
    pub op: Vec<Op>,
    /// Broadcast algorithms (of broadcast and of all_reduce's broadcast step), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "direct,chain,tree")]
    pub algorithm: Vec<AlgArg>,
    /// Smallest size, bytes per rank (suffixes K, M, G; at most 1G) [default: 8; 8 with --quick].
    #[arg(short = 'b', long, value_parser = parse_size)]
    pub minbytes: Option<usize>,
    /// Largest size, bytes per rank (at most 1G) [default: 1M; 64K with --quick].
    #[arg(short = 'e', long, value_parser = parse_size)]
    pub maxbytes: Option<usize>,
    /// Multiplication factor between sizes [default: 2; 8 with --quick].
    #[arg(short = 'f', long, value_parser = clap::value_parser!(u64).range(2..))]
    pub stepfactor: Option<u64>,
    /// Timed iterations per size [default: 20; 3 with --quick].
    #[arg(short = 'n', long, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub iters: Option<u32>,
    /// Untimed iterations before each size's timed ones, at most 1000000 [default: 2; 1 with --quick].
    // Bounded like -n, so that `warmup + iters` (the loop of each placement) fits a u32.
    #[arg(short = 'w', long, value_parser = clap::value_parser!(u32).range(0..=1_000_000))]
    pub warmup: Option<u32>,
    /// A CI-sized run: 8 B to 64 KiB by 8, 3 iterations after 1 warm-up.
    #[arg(long)]
    pub quick: bool,
    /// cpu or gpu (default: the GPU if there is one, else cpu with a note).
    #[arg(long)]
    pub executor: Option<ExecutorKind>,
    /// Ranks in this process (2..=8; 8 share one emulated NIC). Ignored with one rank per process.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(2..=8))]
    pub nranks: u32,
    /// The ranks of this process share one emulated NIC (no wire between them), whatever their number;
    /// without it each has its own NIC and they talk over the wire, except 8 ranks, which always share one.
    /// Refused with one rank per process.
    #[arg(long)]
    pub one_nic: bool,
    /// Root of broadcast and reduce.
    #[arg(long, default_value_t = 0)]
    pub root: u32,
    /// Bound of every device-side wait of a collective (seconds, or with a unit: 2s, 500ms).
    #[arg(long, value_parser = parse_timeout, default_value = "10s")]
    pub timeout: Duration,
    /// Write the setup and every row (medians and p99s) as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Draw bus bandwidth vs size, one panel per op, to this PNG.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    #[command(flatten)]
    pub launch: gdaki_examples::LaunchArgs,
}

/// The timings of one placement (out-of-place or in-place) of one row.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Timing {
    /// Median over the iterations of the largest time over the ranks, µs.
    pub time_us: f64,
    /// 99th percentile of the same, µs.
    pub p99_us: f64,
    /// size / time, GB/s (1e9 bytes/s).
    pub algbw: f64,
    /// algbw × the op's bus factor, GB/s.
    pub busbw: f64,
    /// Wrong elements, summed over ranks and iterations.
    pub wrong: u64,
}

/// One row: an op (with its algorithm) at one size.
#[derive(Clone, Debug, Serialize)]
pub struct CollRow {
    /// The op's name.
    pub op: &'static str,
    /// The broadcast algorithm (broadcast, all_reduce), else none.
    pub algorithm: Option<&'static str>,
    /// Bytes per rank.
    pub size: usize,
    /// Elements per rank.
    pub count: usize,
    /// Element type: "float" or "uint8".
    pub r#type: &'static str,
    /// Reduction: "sum" or "none".
    pub redop: &'static str,
    /// The root, -1 for ops without one.
    pub root: i64,
    /// Out-of-place timings; none where unsupported.
    pub out_of_place: Option<Timing>,
    /// In-place timings; none where unsupported.
    pub in_place: Option<Timing>,
}

/// The `--json` document.
#[derive(Serialize)]
struct CollReport<'a> {
    program: &'static str,
    subcommand: &'static str,
    commit: &'static str,
    date: String,
    executor: &'static str,
    nranks: u32,
    ranks_in_process: bool,
    /// By rank: process, host and device, as under "Using devices".
    devices: &'a [RankDevice],
    nic: String,
    iters: u32,
    warmup: u32,
    timeout_ms: u128,
    timing: &'static str,
    units: &'static str,
    rows: &'a [CollRow],
    avg_busbw: f64,
    wrong: u64,
    errors: u64,
}

/// One unit of work: an op with its algorithm (if any).
#[derive(Clone, Copy, Debug)]
struct Job {
    op: Op,
    alg: Option<AlgArg>,
}

impl Job {
    fn label(&self) -> String {
        match self.alg {
            Some(a) => format!("{} ({})", self.op.name(), a.name()),
            None => self.op.name().to_string(),
        }
    }
}

/// splitmix64: the payload and count generator (seeded, the same on every rank and on the host check).
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// `len` bytes from `seed`.
fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut v: Vec<u8> = (0..len.div_ceil(8) as u64).flat_map(|i| mix(seed ^ mix(i)).to_le_bytes()).collect();
    v.truncate(len);
    v
}

/// Value `i` of `rank`'s reduce input for `seed`: uniform in [-1, 1) (24 random bits).
fn value(seed: u64, rank: u32, i: usize) -> f32 {
    let r = mix(seed ^ (u64::from(rank) << 48) ^ mix(i as u64));
    ((r >> 40) as f32 / (1u64 << 23) as f32) - 1.0
}

/// Bound of every reduce input.
const MAX_ABS: f32 = 1.0;

/// The most the NIC reduce's result may differ from the `f64` sum `reference` of `n` values bounded by
/// `max_abs` (the bound of the reduce's documentation): the quantization of each value (half of 1/s, s the
/// scale), the integer sum's conversion to `f64`, the reference's own roundings, and the final rounding to
/// `f32` (absolute 2^-150 below the normal range).
fn error_bound(n: u32, max_abs: f32, reference: f64) -> f64 {
    let s = gdaki_device::coll::scale(n, max_abs).unwrap_or(1.0);
    let (nf, m) = (f64::from(n), f64::from(n) * f64::from(max_abs));
    let sums = nf / (2.0 * s) + nf * m * 2f64.powi(-53);
    2f64.powi(-24) * (reference.abs() + sums) + sums + 2f64.powi(-150)
}

/// The bytes rank `src` sends rank `dst` at size `size` (bytes each rank sends in all): each peer (itself
/// included) gets a share by weight `1 + mix(seed, src, dst) % 4` of the total, rounded down, the last peer
/// the rest. Every rank computes the whole matrix alike.
fn a2a_counts(size: usize, n: u32, src: u32) -> Vec<u64> {
    let w: Vec<u64> = (0..n).map(|d| 1 + mix(0xa2a ^ (u64::from(src) << 8) ^ u64::from(d)) % 4).collect();
    let total: u64 = w.iter().sum();
    let mut c: Vec<u64> = w.iter().map(|&x| size as u64 * x / total).collect();
    let given: u64 = c.iter().sum();
    if let Some(last) = c.last_mut() {
        *last += size as u64 - given;
    }
    c
}

/// The buffer layout for the largest size `s` (bytes per rank): input at 0, output at `s`, accumulation
/// area (8 B per `f32`) at `2s`: `4s` in all; all-to-all-v sends from 0 and receives at `s` (its receive
/// total stays below `3s`: at most `4n / (n + 3)` times the size with the weights above). `Err` for a
/// size whose buffer does not fit a `usize`.
fn layout(max: usize) -> Result<Layout, String> {
    let s = max.checked_next_multiple_of(8);
    let total = s.and_then(|s| s.checked_mul(4)).and_then(|b| b.checked_add(64));
    match (s, total) {
        (Some(s), Some(total)) => Ok(Layout { out: s as u64, acc: 2 * s as u64, bytes: total }),
        _ => Err(format!("-e {max}: a buffer of four times that does not fit the address space")),
    }
}

/// Where a rank's buffer holds what ([`layout`]).
#[derive(Clone, Copy, Debug)]
struct Layout {
    /// Offset of the output.
    out: u64,
    /// Offset of the accumulation area.
    acc: u64,
    /// The buffer's size.
    bytes: usize,
}

/// What one rank measured at one size and placement: times of the timed iterations (µs) and wrong elements.
type Sample = (Vec<f64>, u64);

/// The sizes from `min` to `max` by `factor`, rounded down to whole elements of `elem` bytes (0s and
/// repeats left out).
fn sizes(min: usize, max: usize, factor: u64, elem: usize) -> Vec<usize> {
    let mut v = Vec::new();
    let mut s = min.max(1);
    while s <= max {
        let r = s / elem * elem;
        if r > 0 && v.last() != Some(&r) {
            v.push(r);
        }
        s = match s.checked_mul(factor as usize) {
            Some(x) => x,
            None => break,
        };
    }
    v
}

/// `len` bytes of `buf` from byte `off` on: only the range a check reads (a copy of the whole buffer, four
/// times the largest size, on every iteration held `-e 1G` to hosts with room for one more such copy per rank).
fn range(buf: &gdaki::exec::DataBuf, off: usize, len: usize) -> gdaki::Result<Vec<u8>> {
    let mut v = vec![0; len];
    buf.read(off, &mut v)?;
    Ok(v)
}

/// Runs one placement of `job` at `size` on this rank: `warmup + iters` calls, each after refilling the
/// buffer, each checked. Returns the timed iterations' times and the wrong elements.
fn run_op(
    r: &CollRank,
    job: Job,
    size: usize,
    in_place: bool,
    root: u32,
    plan: (u32, u32, Layout),
    seq: u64,
) -> gdaki::Result<Sample> {
    let (warmup, iters, Layout { out: out_off, acc: acc_off, .. }) = plan;
    let comm = r.communicator();
    let (rank, n) = (comm.rank(), comm.world_size());
    let buf = r.collectives().buffer();
    let mut times = Vec::with_capacity(iters as usize);
    let mut wrong = 0u64;
    for it in 0..warmup + iters {
        let seed = mix(seq << 24 ^ u64::from(it) << 1 ^ u64::from(in_place));
        let t;
        match job.op {
            Op::Broadcast => {
                // The root's range holds the payload, every other rank's noise.
                let payload = bytes(seed, size);
                let mine = if rank == root { payload.clone() } else { bytes(seed ^ 0x5eed ^ u64::from(rank), size) };
                buf.write(0, &mine)?;
                let alg = job.alg.map_or(Algorithm::Direct, AlgArg::algorithm);
                let b = Broadcast { root, offset: 0, bytes: size as u64, chunk: 0, algorithm: alg };
                t = r.broadcast(&b)?;
                let got = range(buf, 0, size)?;
                wrong += got.iter().zip(&payload).filter(|(a, b)| a != b).count() as u64;
            }
            Op::Reduce | Op::AllReduce => {
                let count = size / 4;
                let x: Vec<f32> = (0..count).map(|i| value(seed, rank, i)).collect();
                buf.write(0, bytemuck::cast_slice(&x))?;
                let out = if in_place { 0 } else { out_off };
                // Noise in the output range, so that a value not written shows.
                if !in_place {
                    buf.write(out as usize, &bytes(seed ^ 0x0ff, size))?;
                }
                let red = Reduce {
                    root,
                    offset: 0,
                    count: count as u64,
                    acc_offset: acc_off,
                    out_offset: out,
                    max_abs: MAX_ABS,
                };
                t = if job.op == Op::AllReduce {
                    r.all_reduce(&red, job.alg.map_or(Algorithm::Direct, AlgArg::algorithm))?
                } else {
                    r.reduce(&red)?
                };
                if job.op == Op::AllReduce || rank == root {
                    let got = range(buf, out as usize, 4 * count)?;
                    let y: &[f32] = bytemuck::cast_slice(&got);
                    for (i, &g) in y.iter().enumerate() {
                        let want: f64 = (0..n).map(|q| f64::from(value(seed, q, i))).sum();
                        let err = (f64::from(g) - want).abs();
                        if err.is_nan() || err > error_bound(n, MAX_ABS, want) {
                            wrong += 1;
                        }
                    }
                }
            }
            Op::AllReduceRing => {
                let count = size / 4;
                let x: Vec<f32> = (0..count).map(|i| value(seed, rank, i)).collect();
                buf.write(0, bytemuck::cast_slice(&x))?;
                let out = if in_place { 0 } else { out_off };
                if !in_place {
                    buf.write(out as usize, &bytes(seed ^ 0x0ff, size))?;
                }
                let ring = RingAllReduce {
                    in_offset: 0,
                    out_offset: out,
                    count: count as u64,
                    scratch_offset: acc_off,
                    chunk: 0,
                };
                t = r.all_reduce_ring(&ring)?;
                let got = range(buf, out as usize, 4 * count)?;
                let y: &[f32] = bytemuck::cast_slice(&got);
                for (i, &g) in y.iter().enumerate() {
                    let terms: Vec<f64> = (0..n).map(|q| f64::from(value(seed, q, i))).collect();
                    let want: f64 = terms.iter().sum();
                    let abs: f64 = terms.iter().map(|t| t.abs()).sum();
                    let err = (f64::from(g) - want).abs();
                    if err.is_nan() || err > ring_bound(n, abs) {
                        wrong += 1;
                    }
                }
            }
            Op::AllToAllV => {
                let counts = a2a_counts(size, n, rank);
                let mut send = Vec::with_capacity(size);
                for (dst, &c) in counts.iter().enumerate() {
                    send.extend(bytes(seed ^ u64::from(rank) << 40 ^ (dst as u64) << 32, c as usize));
                }
                buf.write(0, &send)?;
                let got_counts;
                (got_counts, t) = r.all_to_all_v(&counts, 0, out_off)?;
                let received: u64 = (0..n).map(|src| a2a_counts(size, n, src)[rank as usize]).sum();
                let got = range(buf, out_off as usize, received as usize)?;
                let mut at = 0;
                for src in 0..n {
                    let c = a2a_counts(size, n, src)[rank as usize];
                    let want = bytes(seed ^ u64::from(src) << 40 ^ u64::from(rank) << 32, c as usize);
                    if got_counts.get(src as usize) != Some(&c) {
                        wrong += c.max(1);
                    } else {
                        wrong += got[at..at + c as usize].iter().zip(&want).filter(|(a, b)| a != b).count() as u64;
                    }
                    at += c as usize;
                }
            }
        }
        if it >= warmup {
            times.push(t.as_secs_f64() * 1e6);
        }
    }
    Ok((times, wrong))
}

/// The ring's error bound for `n` terms of absolute sum `abs`: `n - 1` `f32` additions, each off by at most
/// half an ulp, so `gamma(n - 1) * abs` with `gamma(k) = k u / (1 - k u)`, `u = 2^-24` (the classic bound of a
/// recursive sum), plus the inputs' own `f64` sum's rounding.
fn ring_bound(n: u32, abs: f64) -> f64 {
    let ku = f64::from(n.saturating_sub(1)) * f64::powi(2.0, -24);
    ku / (1.0 - ku) * abs + abs * f64::powi(2.0, -50)
}

/// Median and 99th percentile (nearest rank) of `v`.
fn median_p99(v: &[f64]) -> (f64, f64) {
    if v.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let mid = if s.len() % 2 == 1 { s[s.len() / 2] } else { (s[s.len() / 2 - 1] + s[s.len() / 2]) / 2.0 };
    let k = ((0.99 * s.len() as f64).ceil() as usize).clamp(1, s.len()) - 1;
    (mid, s[k])
}

/// Every rank's sample gathered on every rank (the bootstrap's all-gather): the per-iteration maximum of the
/// times, and the wrong elements summed.
/// Where a rank runs: what "Using devices" lists, as nccl-tests does, and the JSON's `devices`.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct RankDevice {
    /// The rank's process.
    pub pid: u32,
    /// Its host's name.
    pub host: String,
    /// `cpu`, or the GPU's ordinal in its process (after `CUDA_VISIBLE_DEVICES`).
    pub device: String,
    /// The GPU's PCI address (`nvidia-smi`'s form); empty on the CPU.
    pub pci: String,
    /// The GPU's name; empty on the CPU.
    pub name: String,
}

impl RankDevice {
    /// This rank's.
    fn of(comm: &Communicator) -> Self {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default().trim().to_string();
        let (device, pci, name) = match comm.executor() {
            Executor::Gpu(g) => (g.ordinal().to_string(), g.pci_address(), g.name().to_string()),
            Executor::Cpu => ("cpu".into(), String::new(), String::new()),
        };
        RankDevice { pid: std::process::id(), host, device, pci, name }
    }

    /// Its line under "Using devices" (after the rank).
    fn line(&self) -> String {
        let gpu = if self.pci.is_empty() { String::new() } else { format!(" [{}] {}", self.pci, self.name) };
        format!("Pid {:>7} on {} device {}{gpu}", self.pid, self.host, self.device)
    }
}

fn gather(comm: &Communicator, s: &Sample) -> gdaki::Result<Sample> {
    let mut mine: Vec<u8> = s.1.to_le_bytes().to_vec();
    mine.extend(s.0.iter().flat_map(|t| t.to_le_bytes()));
    let all = comm.bootstrap().all_gather(&mine)?;
    let mut times = s.0.clone();
    let mut wrong = 0;
    for a in &all {
        let words: Vec<[u8; 8]> = a.chunks_exact(8).map(|c| c.try_into().unwrap_or_default()).collect();
        wrong += words.first().map_or(0, |w| u64::from_le_bytes(*w));
        for (t, w) in times.iter_mut().zip(words.iter().skip(1)) {
            *t = t.max(f64::from_le_bytes(*w));
        }
    }
    Ok((times, wrong))
}

fn timing(s: &Sample, size: usize, factor: f64) -> Timing {
    let (time_us, p99_us) = median_p99(&s.0);
    let algbw = size as f64 / (time_us * 1e-6) / 1e9;
    Timing { time_us, p99_us, algbw, busbw: algbw * factor, wrong: s.1 }
}

/// One rank's run: its rows (the same on every rank: the samples are gathered), or the first error with
/// what it was doing.
fn rank_main(
    comm: Arc<Communicator>,
    opts: &CollOpts,
    jobs: &[Job],
    plan: (u32, u32, Layout),
) -> Result<(Vec<RankDevice>, Vec<CollRow>), String> {
    let rank = comm.rank();
    let n = comm.world_size();
    let gather_devices = || -> Result<Vec<RankDevice>, String> {
        let mine = serde_json::to_vec(&RankDevice::of(&comm)).map_err(|e| e.to_string())?;
        let all = comm.bootstrap().all_gather(&mine).map_err(|e| e.to_string())?;
        all.iter().map(|d| serde_json::from_slice(d).map_err(|e| e.to_string())).collect()
    };
    let devices = gather_devices().map_err(|e| format!("rank {rank}: gathering the ranks' devices: {e}"))?;
    if rank == 0 {
        gdaki_examples::outln!("# Using devices");
        for (r, d) in devices.iter().enumerate() {
            gdaki_examples::outln!("#  Rank {r:>2} {}", d.line());
        }
    }
    let cfg = CollConfig { timeout: opts.timeout, ..CollConfig::new(plan.2.bytes) };
    let r = CollRank::new(comm.clone(), &cfg).map_err(|e| format!("rank {rank}: setting up the collectives: {e}"))?;
    let (min, max, factor) = bounds(opts);
    let mut rows = Vec::new();
    let mut seq = 0u64;
    for &job in jobs {
        let sh = job.op.shape();
        for size in sizes(min, max, factor, sh.elem) {
            let mut place = |ip: bool| -> Result<Timing, String> {
                seq += 1;
                let s = run_op(&r, job, size, ip, opts.root, plan, seq).map_err(|e| {
                    let p = if ip { "in-place" } else { "out-of-place" };
                    // A timeout may not say which peer is missing (the group acknowledgment counts them all):
                    // the links that went down do.
                    let down: String = r
                        .collectives()
                        .failed_peers()
                        .iter()
                        .map(|(peer, why)| format!("; rank {peer}'s link is down: {why}"))
                        .collect();
                    format!("rank {rank}: {}, {size} B, {p}: {e}{down}", job.label())
                })?;
                let g = gather(&comm, &s)
                    .map_err(|e| format!("rank {rank}: {}, {size} B: gathering times: {e}", job.label()))?;
                Ok(timing(&g, size, job.op.bus_factor(n)))
            };
            let out_of_place = if sh.oop { Some(place(false)?) } else { None };
            let in_place = if sh.ip { Some(place(true)?) } else { None };
            rows.push(CollRow {
                op: job.op.name(),
                algorithm: job.alg.map(AlgArg::name),
                size,
                count: size / sh.elem,
                r#type: sh.ty,
                redop: sh.redop,
                root: if sh.rooted { i64::from(opts.root) } else { -1 },
                out_of_place,
                in_place,
            });
        }
    }
    // Nobody's memory goes before everyone is done.
    r.barrier().map_err(|e| format!("rank {rank}: closing barrier: {e}"))?;
    Ok((devices, rows))
}

/// (minbytes, maxbytes, stepfactor) with the `--quick` defaults.
fn bounds(o: &CollOpts) -> (usize, usize, u64) {
    let (min, max, f) = if o.quick { (8, 64 << 10, 8) } else { (8, 1 << 20, 2) };
    (o.minbytes.unwrap_or(min), o.maxbytes.unwrap_or(max), o.stepfactor.unwrap_or(f))
}

/// This process's rank of a launch of any world size (flags or a launcher's environment), or `None` for
/// all ranks here.
fn launch_of(a: &gdaki_examples::LaunchArgs) -> Result<Option<Launch>, String> {
    match Launch::resolve_from_process_env(a.flags()).map_err(|e| e.to_string())? {
        Some(l) if l.world_size > 1 => Ok(Some(l)),
        _ => Ok(None),
    }
}

fn fmt_place(t: &Option<Timing>) -> String {
    match t {
        Some(t) => format!("{:>10.2} {:>8.4} {:>8.4} {:>6}", t.time_us, t.algbw, t.busbw, t.wrong),
        None => format!("{:>10} {:>8} {:>8} {:>6}", "N/A", "N/A", "N/A", "N/A"),
    }
}

/// `gdaki-perf coll`: returns the exit code (1: a wrong element or an error), `Err` for bad flags.
pub fn run(opts: &CollOpts) -> Result<ExitCode, String> {
    let launch = launch_of(&opts.launch)?;
    let n = launch.as_ref().map_or(opts.nranks, |l| l.world_size);
    if !(2..=8).contains(&n) {
        return Err(format!("coll takes 2 to 8 ranks, the launch has {n}"));
    }
    if opts.root >= n {
        return Err(format!("--root {} is not a rank of {n}", opts.root));
    }
    if opts.op.is_empty() || opts.algorithm.is_empty() {
        return Err("--op and --algorithm need at least one value each".into());
    }
    gdaki_examples::refuse_repeats("--op", &opts.op, |o| o.name())?;
    gdaki_examples::refuse_repeats("--algorithm", &opts.algorithm, |a| a.name())?;
    let (min, max, factor) = bounds(opts);
    if min > max {
        return Err(format!("-b {min} is above -e {max}"));
    }
    // Sizes round down to whole elements: an op with none would print an empty table that passes.
    if let Some(op) = opts.op.iter().find(|op| sizes(min, max, factor, op.shape().elem).is_empty()) {
        return Err(format!(
            "--op {}: no size from -b {min} to -e {max} holds a whole element of {} bytes",
            op.name(),
            op.shape().elem
        ));
    }
    let lay = layout(max)?;
    let iters = opts.iters.unwrap_or(if opts.quick { 3 } else { 20 });
    let warmup = opts.warmup.unwrap_or(if opts.quick { 1 } else { 2 });
    let (exec, notice) =
        Executor::open_on(opts.executor, opts.launch.gpu_of(launch.as_ref())).map_err(|e| e.to_string())?;
    if let Some(note) = notice {
        gdaki_examples::eprintln_line!("note: {note}");
    }
    let kind = exec.kind();
    drop(exec);
    let executor = if kind == ExecutorKind::Gpu { "gpu" } else { "cpu" };
    let prints = launch.as_ref().is_none_or(|l| l.rank == 0);
    // A --json or --plot file that cannot be written is an error before the run, not after it (rank 0
    // writes them).
    if prints {
        if let Some(path) = &opts.json {
            gdaki_examples::create_json(Some(path))?;
        }
        if let Some(path) = &opts.plot {
            crate::plot::check_file(path)?;
        }
    }
    let in_process = launch.is_none();
    if opts.one_nic && !in_process {
        return Err("--one-nic is for ranks in one process (--nranks); one rank per process talks over the wire".into());
    }
    let one_nic = in_process && (opts.one_nic || n == 8);
    let nic = match (in_process, one_nic) {
        (true, true) => "one emulated mlx5 NIC shared by all ranks (no wire)",
        (true, false) => "an emulated mlx5 NIC per rank, over the wire (loopback TCP)",
        (false, _) => "an emulated mlx5 NIC per process, over the wire",
    };
    let mut jobs = Vec::new();
    for &op in &opts.op {
        if op.shape().algorithm {
            jobs.extend(opts.algorithm.iter().map(|&a| Job { op, alg: Some(a) }));
        } else {
            jobs.push(Job { op, alg: None });
        }
    }
    if prints {
        gdaki_examples::outln!("# gdaki-perf coll ({})", gdaki_examples::COMMIT);
        gdaki_examples::outln!("# nranks {n}, {executor} executor, {nic}");
        gdaki_examples::outln!(
            "# minBytes {min} maxBytes {max} step: {} (factor) warmup iters: {warmup} iters: {iters} validation: every \
             iteration, every element",
            factor
        );
        gdaki_examples::outln!("# timeout of every device-side wait: {:?}", opts.timeout);
        gdaki_examples::outln!(
            "# time: median over iterations of the slowest rank's call, from its launch to its end on the host (the barrier before it left out)"
        );
        gdaki_examples::outln!("#");
    }
    let plan = (warmup, iters, lay);
    let setup = RankSetup {
        launch: launch.clone(),
        one_nic,
        gpu: opts.launch.gpu,
        timeout: opts.launch.bootstrap_timeout(),
        wire: opts.launch.wire_config(),
        ..RankSetup::local(n, kind)
    };
    let results =
        gdaki::channel::run_ranks(&setup, |comm| rank_main(comm, opts, &jobs, plan)).map_err(|e| e.to_string())?;
    let mut errors = 0u64;
    let mut rows: Option<Vec<CollRow>> = None;
    let mut devices = Vec::new();
    for (rank, res) in results {
        match res {
            Ok(Ok((d, r))) => {
                if rank == 0 || rows.is_none() {
                    rows = Some(r);
                    devices = d;
                }
            }
            Ok(Err(e)) => {
                gdaki_examples::eprintln_line!("error: {e}");
                errors += 1;
            }
            Err(e) => {
                gdaki_examples::eprintln_line!("error: rank {rank}: {e}");
                errors += 1;
            }
        }
    }
    let rows = rows.unwrap_or_default();
    let wrong: u64 = rows.iter().flat_map(|r| [&r.out_of_place, &r.in_place]).flatten().map(|t| t.wrong).sum();
    let busbws: Vec<f64> = rows
        .iter()
        .flat_map(|r| [&r.out_of_place, &r.in_place])
        .flatten()
        .map(|t| t.busbw)
        .filter(|b| b.is_finite())
        .collect();
    let avg = if busbws.is_empty() { 0.0 } else { busbws.iter().sum::<f64>() / busbws.len() as f64 };
    if !prints {
        return Ok(if errors + wrong == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE });
    }
    for job in &jobs {
        let mine: Vec<&CollRow> =
            rows.iter().filter(|r| r.op == job.op.name() && r.algorithm == job.alg.map(AlgArg::name)).collect();
        gdaki_examples::outln!("#");
        gdaki_examples::outln!("# {}", job.label());
        gdaki_examples::outln!(
            "# {:>10} {:>12} {:>8} {:>6} {:>6}   {:>35}   {:>35}",
            "",
            "",
            "",
            "",
            "",
            "out-of-place",
            "in-place"
        );
        gdaki_examples::outln!(
            "# {:>10} {:>12} {:>8} {:>6} {:>6}   {:>10} {:>8} {:>8} {:>6}   {:>10} {:>8} {:>8} {:>6}",
            "size",
            "count",
            "type",
            "redop",
            "root",
            "time",
            "algbw",
            "busbw",
            "#wrong",
            "time",
            "algbw",
            "busbw",
            "#wrong"
        );
        gdaki_examples::outln!(
            "# {:>10} {:>12} {:>8} {:>6} {:>6}   {:>10} {:>8} {:>8} {:>6}   {:>10} {:>8} {:>8} {:>6}",
            "(B)",
            "(elements)",
            "",
            "",
            "",
            "(us)",
            "(GB/s)",
            "(GB/s)",
            "",
            "(us)",
            "(GB/s)",
            "(GB/s)",
            ""
        );
        for r in mine {
            gdaki_examples::outln!(
                "  {:>10} {:>12} {:>8} {:>6} {:>6}   {}   {}",
                r.size,
                r.count,
                r.r#type,
                r.redop,
                r.root,
                fmt_place(&r.out_of_place),
                fmt_place(&r.in_place)
            );
        }
    }
    if errors > 0 {
        // The rows a failed rank never ran are missing: not a pass.
        gdaki_examples::outln!("# Errors               : {errors} (on standard error) FAILED");
    }
    gdaki_examples::outln!(
        "# Out of bounds values : {wrong} {}",
        if wrong == 0 && errors == 0 { "OK" } else { "FAILED" }
    );
    gdaki_examples::outln!("# Avg bus bandwidth    : {avg:.6} ");
    gdaki_examples::outln!("#");
    if let Some(path) = &opts.json {
        let report = CollReport {
            program: "gdaki-perf",
            subcommand: "coll",
            commit: gdaki_examples::COMMIT,
            date: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
            executor,
            nranks: n,
            ranks_in_process: in_process,
            devices: &devices,
            nic: nic.to_string(),
            iters,
            warmup,
            timeout_ms: opts.timeout.as_millis(),
            timing: "per iteration: the slowest rank's call, from its launch to its end on the host (no barrier); per row: median and p99",
            units: "size: bytes per rank; time: us; algbw, busbw: GB/s (1e9 bytes/s)",
            rows: &rows,
            avg_busbw: avg,
            wrong,
            errors,
        };
        let text = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
        if let Err(e) = std::fs::write(path, text + "\n") {
            gdaki_examples::eprintln_line!("error: --json {}: {e}", path.display());
            errors += 1;
        }
    }
    if let Some(path) = &opts.plot {
        let panels: Vec<(String, Vec<(f64, f64)>)> = jobs
            .iter()
            .map(|j| {
                let pts = rows
                    .iter()
                    .filter(|r| r.op == j.op.name() && r.algorithm == j.alg.map(AlgArg::name))
                    .filter_map(|r| {
                        let t = r.out_of_place.as_ref().or(r.in_place.as_ref())?;
                        (t.busbw > 0.0 && t.busbw.is_finite()).then(|| ((r.size as f64).log2(), t.busbw.log10()))
                    })
                    .collect();
                (j.label(), pts)
            })
            .collect();
        match crate::plot::draw_coll(path, &panels) {
            Ok(()) => gdaki_examples::eprintln_line!("wrote {}", path.display()),
            Err(e) => {
                gdaki_examples::eprintln_line!("error: {e}");
                errors += 1;
            }
        }
    }
    Ok(if errors + wrong == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_four_sizes_and_refuses_what_overflows() {
        // 12 B rounds up to 16: output at 16, accumulation at 32, 4 × 16 + 64 bytes in all.
        let l = layout(12).unwrap();
        assert_eq!((l.out, l.acc, l.bytes), (16, 32, 128));
        let l = layout(MAX_BYTES).unwrap();
        assert_eq!((l.out, l.acc, l.bytes), (1 << 30, 2 << 30, (4 << 30) + 64));
        // 2^62 × 4 wrapped to a 64-byte buffer, and usize::MAX's rounding up to 8 to 0.
        assert!(layout(1 << 62).is_err());
        assert!(layout(usize::MAX).is_err());
        assert!(layout(usize::MAX / 4 - 15).is_err());
    }
}
