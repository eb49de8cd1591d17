//! The command line: one subcommand per group of rows, perftest-style flags shared by all.

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use gdaki::exec::ExecutorKind;
use gdaki::nic::NicSpec;
use gdaki_testkit::porttest::Mode;

/// gdaki-perf: MSCCL++'s PortChannel tests (its GPUNetIO comparison) in Host, HostNoAtomic and Device modes,
/// side by side in one run on one NIC; ratios against Host; every payload checked.
#[derive(Parser, Debug)]
#[command(name = "gdaki-perf", version)]
pub struct Cli {
    #[command(subcommand)]
    pub cmd: Cmd,
}

/// Which rows to run.
#[derive(Subcommand, Debug)]
pub enum Cmd {
    /// Everything: PingPong, PacketPingPong (LL16, LL8), bidirectional bandwidth, 1-QP and 4-QP bandwidth,
    /// flush stress and same-channel concurrent flush.
    All(Opts),
    /// PingPong latency (put_with_signal + wait + flush each way).
    Pingpong(Opts),
    /// PacketPingPong latency with LL16 and LL8 packets (MSCCL++'s LL protocol).
    Packet(Opts),
    /// One-way bandwidth, 1 QP and 4 QPs.
    Bw(Opts),
    /// Bidirectional bandwidth, 1 QP.
    Bibw(Opts),
    /// Flush stress (4 QPs) and same-channel concurrent flush (4 threads, 1 QP).
    Flush(Opts),
    /// Collectives (broadcast, reduce, all_reduce, all_reduce_ring, all_to_all_v) over a size range, in nccl-tests' table
    /// shape: time, algbw, busbw and wrong elements, out-of-place and in-place.
    Coll(crate::coll::CollOpts),
}

impl Cmd {
    /// The subcommand's name and its options (`None` for `coll`, which has its own).
    pub fn split(&self) -> Option<(&'static str, &Opts)> {
        Some(match self {
            Cmd::All(o) => ("all", o),
            Cmd::Pingpong(o) => ("pingpong", o),
            Cmd::Packet(o) => ("packet", o),
            Cmd::Bw(o) => ("bw", o),
            Cmd::Bibw(o) => ("bibw", o),
            Cmd::Flush(o) => ("flush", o),
            Cmd::Coll(_) => return None,
        })
    }
}

/// Flags every subcommand takes.
#[derive(clap::Args, Debug, Clone)]
pub struct Opts {
    /// Modes, comma-separated: host, host-no-atomic (the CPU proxy posts), exclusive, warp, block, device
    /// (device code posts, with that sharing of a QP; warp with a team of at most 32 threads).
    #[arg(long, value_delimiter = ',', default_value = "host,host-no-atomic,exclusive,block,device")]
    pub mode: Vec<Mode>,
    /// cpu or gpu (default: the GPU if there is one, else cpu with a note).
    #[arg(long)]
    pub executor: Option<ExecutorKind>,
    /// Where the emulated NIC keeps its SQ/CQ rings and dbrecs: gpu (GPU memory, the default on the gpu
    /// executor; simulated on the cpu executor) or host (pinned host memory); sets GDAKI_QUEUES.
    #[arg(long, value_enum)]
    pub queues: Option<gdaki_examples::Queues>,
    /// NIC: emu (the emulated mlx5 NIC) or an RDMA device, DEVICE[:PORT[:GID_INDEX]] (a build with
    /// --features mlx5 and a ConnectX NIC).
    #[arg(long, default_value = "emu")]
    pub nic: NicSpec,
    /// Both ranks (in this process) on ONE NIC, whose QPs then meet on its direct path with no wire between
    /// them: the rows then differ by the posting path more than by the emulated wire.
    #[arg(long)]
    pub one_nic: bool,
    /// One size for every row, bytes (bandwidth rows: all QPs together per iteration), at most 1073741824
    /// (1 GiB).
    // Bounded: no default row is above 512 MiB, and far larger sizes ask each rank for buffers no host has (or
    // that do not fit the address space), found only once both ranks set up.
    #[arg(short = 's', long, conflicts_with = "all_sizes",
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1 << 30))]
    pub size: Option<usize>,
    /// Timed iterations of a latency row; the most a bandwidth row gets [default: 1000; 50 with --quick].
    #[arg(short = 'n', long, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub iters: Option<u32>,
    /// All sizes: latency 8 B to 1 MiB (×2); bandwidth by ×4, 1-QP and bibw 1 KiB to 128 MiB, 4-QP 4 KiB to
    /// 512 MiB; the flush tests stay at 1 KiB.
    #[arg(short = 'a', long = "all")]
    pub all_sizes: bool,
    /// Untimed iterations before each row (at most a tenth of the row's).
    #[arg(long, default_value_t = 100)]
    pub warmup: u32,
    /// Most MiB a bandwidth row moves; rows of large messages get fewer iterations (at least 3)
    /// [default: 512; 16 with --quick].
    #[arg(long, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub row_mib: Option<usize>,
    /// A CI-sized run: one latency size, the two smallest bandwidth sizes, 50 iterations.
    #[arg(long)]
    pub quick: bool,
    /// Threads per team: a CTA's size on the GPU (default 128), host threads per channel on cpu (default 4);
    /// 1 to 1024, the most threads of a block on either executor.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub team: Option<u32>,
    /// Bound of every device-side wait, ms (1 to 86,400,000: at most a day, as pingpong and port_channel).
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=86_400_000))]
    pub timeout_ms: u64,
    /// Payloads up to this many bytes go by BlueFlame in Exclusive sharing (0: never).
    #[arg(long, default_value_t = 512 << 10)]
    pub blue_flame_limit: u64,
    /// Under each row, what the emulated NIC did per timed iteration: doorbells, WQEs, CQEs, SQ ranges from
    /// the ring's mirror and the wait for it, fetches, host synchronizes, the NIC thread's busy time (the JSON
    /// has them in every row).
    #[arg(long)]
    pub nic_stats: bool,
    /// Write the run (machine, commit, every row with medians and tails, ratios, summary) as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Draw latency vs size to PATH (PNG) and bandwidth vs size to PATH's stem + "-bw.png" beside it.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    #[command(flatten)]
    pub launch: gdaki_examples::LaunchArgs,
}
