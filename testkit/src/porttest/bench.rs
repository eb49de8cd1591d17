//! MSCCL++'s PortChannel tests as benchmark rows, shared by `gdaki-perf` and the `port_channel` example: the
//! tests ([`Test`]), how many iterations a row gets ([`Plan`]), and one rank's run of one test over its sizes
//! in one mode ([`run_test`]), one [`Row`] per size: perftest's latency statistics ([`LatencyRow`]) or
//! bandwidth ([`BandwidthRow`]), with the payloads checked.

use std::sync::Arc;
use std::time::Duration;

use super::{max_size_for, op, Mode, PortTest, RunConfig};
use crate::perftest::{BandwidthRow, LatencyRow};
use gdaki::channel::Communicator;
use gdaki::{Error, Result};

/// One of MSCCL++'s one-to-one PortChannel tests (its GPUNetIO comparison), in the order tables list them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Test {
    /// Ping-pong on 1 QP: `put_with_signal` + `wait` + `flush` each way ([`op::PINGPONG`]).
    PingPong,
    /// PacketPingPong with LL16 packets on 1 QP ([`op::PACKET_PINGPONG`]): sizes are multiples of 8 bytes.
    PacketLl16,
    /// PacketPingPong with LL8 packets on 1 QP ([`op::PACKET_PINGPONG_LL8`]): sizes are multiples of 4 bytes.
    PacketLl8,
    /// One-way bandwidth on 1 QP ([`op::BW`]).
    Bw1Qp,
    /// One-way bandwidth on 4 QPs, the size split evenly over them ([`op::BW`]).
    Bw4Qp,
    /// Bidirectional bandwidth on 1 QP ([`op::BIBW`]).
    Bibw,
    /// Flush stress: put + flush on each of 4 QPs ([`op::FLUSH_STRESS`]).
    FlushStress,
    /// Same-channel concurrent flush: 4 threads put + flush on 1 QP ([`op::SAME_CHANNEL_FLUSH`]).
    SameChannelFlush,
}

impl Test {
    /// All eight, in table order.
    pub const ALL: [Test; 8] = [
        Test::PingPong,
        Test::PacketLl16,
        Test::PacketLl8,
        Test::Bw1Qp,
        Test::Bw4Qp,
        Test::Bibw,
        Test::FlushStress,
        Test::SameChannelFlush,
    ];

    /// "PingPong", "PacketPingPong (LL16)", "PacketPingPong (LL8)", "bw 1-QP", "bw 4-QP", "bibw 1-QP",
    /// "flush stress 4-QP" or "concurrent flush 1-QP".
    pub fn name(self) -> &'static str {
        match self {
            Test::PingPong => "PingPong",
            Test::PacketLl16 => "PacketPingPong (LL16)",
            Test::PacketLl8 => "PacketPingPong (LL8)",
            Test::Bw1Qp => "bw 1-QP",
            Test::Bw4Qp => "bw 4-QP",
            Test::Bibw => "bibw 1-QP",
            Test::FlushStress => "flush stress 4-QP",
            Test::SameChannelFlush => "concurrent flush 1-QP",
        }
    }

    /// The device operation ([`op`]).
    pub fn op(self) -> u32 {
        match self {
            Test::PingPong => op::PINGPONG,
            Test::PacketLl16 => op::PACKET_PINGPONG,
            Test::PacketLl8 => op::PACKET_PINGPONG_LL8,
            Test::Bw1Qp | Test::Bw4Qp => op::BW,
            Test::Bibw => op::BIBW,
            Test::FlushStress => op::FLUSH_STRESS,
            Test::SameChannelFlush => op::SAME_CHANNEL_FLUSH,
        }
    }

    /// Channels (one QP each).
    pub fn channels(self) -> u32 {
        match self {
            Test::Bw4Qp | Test::FlushStress => 4,
            _ => 1,
        }
    }

    /// Whether rows are bandwidth ([`BandwidthRow`]: a row's bytes are all QPs' per iteration) rather than
    /// latency ([`LatencyRow`]: a row's bytes are one put's).
    pub fn is_bandwidth(self) -> bool {
        matches!(self, Test::Bw1Qp | Test::Bw4Qp | Test::Bibw)
    }

    /// Bytes each channel puts per iteration for a row of `bytes`.
    pub fn per_channel(self, bytes: usize) -> usize {
        if self.is_bandwidth() {
            bytes / self.channels() as usize
        } else {
            bytes
        }
    }

    /// Checks that a row of `bytes` can run: at least one byte per channel, a multiple of the QPs for
    /// bandwidth on several QPs, of 8 (LL16) or 4 (LL8) bytes for packets.
    ///
    /// # Errors
    /// A one-line message naming the test, the size and what it must be.
    pub fn check_size(self, bytes: usize) -> std::result::Result<(), String> {
        let unit = match self {
            Test::PacketLl16 => 8,
            Test::PacketLl8 => 4,
            t if t.is_bandwidth() => t.channels() as usize,
            _ => 1,
        };
        if bytes == 0 || !bytes.is_multiple_of(unit) {
            return Err(format!("{}: {bytes} bytes must be a nonzero multiple of {unit}", self.name()));
        }
        Ok(())
    }
}

/// Serialises as [`Test::name`].
impl serde::Serialize for Test {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

/// How many iterations rows get, and the channels' settings.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    /// Timed iterations of a latency row; the most a bandwidth row gets.
    pub iters: u32,
    /// Untimed iterations before each row: at most this many, and at most a tenth of the row's (at least 1
    /// unless this is 0).
    pub warmup: u32,
    /// Most bytes a bandwidth row moves in its timed iterations (all QPs, one direction): its iterations are
    /// `byte_budget / bytes`, at least 3 (or `iters` if fewer) and at most `iters`.
    pub byte_budget: usize,
    /// Threads per team: a CTA's size on the GPU, host threads per channel on the `cpu` executor (Warp sharing
    /// takes at most 32 of them, [`Mode::fit_team`]).
    pub team: u32,
    /// Bound of every device-side wait.
    pub timeout: Duration,
    /// Payloads up to this many bytes go by BlueFlame in Exclusive sharing (0: never).
    pub blue_flame_limit: u64,
}

impl Plan {
    /// Timed iterations of `test`'s row of `bytes`.
    pub fn iters_for(&self, test: Test, bytes: usize) -> u32 {
        if test.is_bandwidth() {
            let fit = (self.byte_budget / bytes.max(1)).min(u32::MAX as usize) as u32;
            fit.max(3).min(self.iters)
        } else {
            self.iters
        }
    }

    /// Warm-up iterations before a row of `iters` timed ones.
    pub fn warmup_for(&self, iters: u32) -> u32 {
        self.warmup.min((iters / 10).max(1))
    }
}

/// What one row measured.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Measure {
    /// Per-iteration times of a ping-pong (one round trip) or a flush test (one put + flush per channel).
    Latency(LatencyRow),
    /// A bandwidth test's time per iteration and throughput.
    Bandwidth(BandwidthRow),
}

/// One size of one test in one mode, as one rank saw it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Row {
    /// The test.
    pub test: Test,
    /// Who posted: the CPU proxy or device code, and how device threads shared the QPs.
    pub mode: Mode,
    /// Bytes: one put's for latency tests, all QPs' per iteration for bandwidth ([`Test::is_bandwidth`]).
    pub bytes: usize,
    /// Untimed iterations run first.
    pub warmup: u32,
    /// Payloads this rank received and checked byte for byte (warm-up included).
    pub checked: u64,
    /// The times (rank 0; `None` on rank 1, which does not time).
    pub measure: Option<Measure>,
    /// What this rank's emulated NIC did during the timed iterations, per iteration (`None` on another NIC).
    /// With both ranks on one NIC it counts both ranks' work.
    pub nic: Option<NicWork>,
}

/// The emulated NIC's work per timed iteration of a row, from its [`Stats`](gdaki::nic::emu::Stats) before and
/// after: the measured cause behind a row whose device code does not explain its time (doorbells that waited
/// for a ring's mirror, fetches from GPU memory, host synchronizes).
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct NicWork {
    /// Doorbell register changes acted on (doorbells and BlueFlame writes).
    pub doorbells: f64,
    /// BlueFlame writes whose WQE came from the register.
    pub blueflame: f64,
    /// WQEs executed.
    pub wqes: f64,
    /// CQEs written.
    pub cqes: f64,
    /// Rung SQ ranges read from the ring's mirror.
    pub mirrored: f64,
    /// µs the NIC's thread waited for a ring's mirror to cover a rung range.
    pub mirror_wait_us: f64,
    /// Rung SQ ranges fetched from GPU memory.
    pub fetches: f64,
    /// Host synchronizes with the GPU (fetches included).
    pub host_syncs: f64,
    /// µs the NIC's thread waited in them.
    pub host_sync_us: f64,
    /// Passes of the NIC's thread over its QPs.
    pub passes: f64,
    /// µs of the NIC's thread in passes that found work.
    pub busy_us: f64,
    /// WRITE pieces sent as references to GPU memory that the peer process copied itself (the wire's
    /// same-host path).
    pub ipc_pieces: f64,
    /// MB (10^6 bytes) of those pieces.
    pub ipc_mb: f64,
}

impl NicWork {
    /// The work between two snapshots of one NIC's counters, per each of `iters` iterations.
    pub fn between(before: &gdaki::nic::emu::Stats, after: &gdaki::nic::emu::Stats, iters: u32) -> Self {
        let n = f64::from(iters.max(1));
        let per = |a: u64, b: u64| b.saturating_sub(a) as f64 / n;
        let us = |a: u64, b: u64| per(a, b) / 1e3;
        NicWork {
            doorbells: per(before.doorbells, after.doorbells),
            blueflame: per(before.blueflame, after.blueflame),
            wqes: per(before.wqes, after.wqes),
            cqes: per(before.cqes, after.cqes),
            mirrored: per(before.ring_mirrored, after.ring_mirrored),
            mirror_wait_us: us(before.ring_mirror_wait_ns, after.ring_mirror_wait_ns),
            fetches: per(before.ring_fetches, after.ring_fetches),
            host_syncs: per(before.host_syncs, after.host_syncs),
            host_sync_us: us(before.host_sync_ns, after.host_sync_ns),
            passes: per(before.executor_passes, after.executor_passes),
            busy_us: us(before.busy_ns, after.busy_ns),
            ipc_pieces: per(before.ipc_pieces, after.ipc_pieces),
            ipc_mb: per(before.ipc_bytes, after.ipc_bytes) / 1e6,
        }
    }

    /// One line for a table: the figures above, per iteration.
    pub fn line(&self) -> String {
        format!(
            "# NIC per iteration: {:.2} doorbells ({:.2} BlueFlame), {:.2} WQEs, {:.2} CQEs, {:.2} ranges from the \
             mirror ({:.2} µs waiting), {:.2} fetches, {:.2} host syncs ({:.2} µs), {:.1} passes, {:.2} µs busy, \
             {:.2} WRITE pieces by mapping ({:.3} MB)",
            self.doorbells,
            self.blueflame,
            self.wqes,
            self.cqes,
            self.mirrored,
            self.mirror_wait_us,
            self.fetches,
            self.host_syncs,
            self.host_sync_us,
            self.passes,
            self.busy_us,
            self.ipc_pieces,
            self.ipc_mb,
        )
    }
}

/// This rank's emulated NIC's counters (`None` on another NIC).
fn emu_stats(comm: &Communicator) -> Option<gdaki::nic::emu::Stats> {
    match comm.nic() {
        gdaki::nic::Nic::Emu(n) => Some(n.stats()),
        #[allow(unreachable_patterns)]
        _ => None,
    }
}

/// What [`run_test`] is at, for progress reports.
#[derive(Clone, Copy, Debug)]
pub enum Step<'a> {
    /// A row starts: `iters` timed iterations (after its warm-up) of `test` with `bytes` in `mode`.
    Start {
        /// The test.
        test: Test,
        /// The mode.
        mode: Mode,
        /// The row's bytes ([`Row::bytes`]).
        bytes: usize,
        /// Timed iterations.
        iters: u32,
    },
    /// A row is done.
    Done(&'a Row),
}

/// Runs `test` in `mode` for each of `sizes` (bytes as [`Row::bytes`]) on this rank, on fresh channels to
/// the peer (one [`PortTest`] sized for the largest); the peer calls it with the same arguments at the same
/// time. `step` hears of each row's start and end. Returns the rows in `sizes`' order.
///
/// # Errors
/// [`Error::InvalidArgument`] for a size [`Test::check_size`] refuses; [`PortTest::new`]'s and
/// [`PortTest::run`]'s errors (a payload that fails its check is [`Error::Device`]).
pub fn run_test(
    comm: &Arc<Communicator>,
    mode: Mode,
    test: Test,
    sizes: &[usize],
    plan: &Plan,
    mut step: impl FnMut(Step<'_>),
) -> Result<Vec<Row>> {
    for &bytes in sizes {
        test.check_size(bytes).map_err(Error::InvalidArgument)?;
    }
    let (Some(max), Some(max_iters)) = (
        sizes.iter().map(|&b| max_size_for(test.op(), test.per_channel(b))).max(),
        sizes.iter().map(|&b| plan.iters_for(test, b)).max(),
    ) else {
        return Ok(Vec::new());
    };
    let mut t = PortTest::new(comm.clone(), mode, test.channels(), max, max_iters as usize)?;
    t.set_blue_flame_limit(plan.blue_flame_limit)?;
    let mut rows = Vec::with_capacity(sizes.len());
    for &bytes in sizes {
        let iters = plan.iters_for(test, bytes);
        let warmup = plan.warmup_for(iters);
        step(Step::Start { test, mode, bytes, iters });
        let per = test.per_channel(bytes);
        let cfg = |iters| RunConfig {
            op: test.op(),
            size: per,
            iters,
            team: mode.fit_team(plan.team),
            seed: 0x5eed_0000 ^ bytes as u64 ^ ((test.op() as u64) << 40),
            timeout: plan.timeout,
        };
        let mut checked = 0;
        if warmup > 0 {
            checked += t.run(&cfg(warmup))?.checked;
        }
        let before = emu_stats(comm);
        let r = t.run(&cfg(iters))?;
        let nic = before.zip(emu_stats(comm)).map(|(b, a)| NicWork::between(&b, &a, iters));
        checked += r.checked;
        let measure = if test.is_bandwidth() {
            let directions = if test == Test::Bibw { 2 } else { 1 };
            BandwidthRow::from_ns(bytes as u64, test.channels(), directions, &r.iter_ns).map(Measure::Bandwidth)
        } else {
            LatencyRow::from_ns(bytes as u64, &r.iter_ns).map(Measure::Latency)
        };
        let row = Row { test, mode, bytes, warmup, checked, measure, nic };
        step(Step::Done(&row));
        rows.push(row);
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bandwidth_iterations_follow_the_budget() {
        let plan = Plan {
            iters: 1000,
            warmup: 100,
            byte_budget: 512 << 20,
            team: 4,
            timeout: Duration::from_secs(1),
            blue_flame_limit: 0,
        };
        // 512 MiB / 1 MiB = 512; 128 MiB fits 4 times; 512 MiB once, raised to the floor of 3; 1 KiB capped at
        // `iters`; latency rows always get `iters`.
        assert_eq!(plan.iters_for(Test::Bw1Qp, 1 << 20), 512);
        assert_eq!(plan.iters_for(Test::Bw1Qp, 128 << 20), 4);
        assert_eq!(plan.iters_for(Test::Bw4Qp, 512 << 20), 3);
        assert_eq!(plan.iters_for(Test::Bibw, 1024), 1000);
        assert_eq!(plan.iters_for(Test::PingPong, 128 << 20), 1000);
        assert_eq!((plan.warmup_for(1000), plan.warmup_for(4), plan.warmup_for(50)), (100, 1, 5));
        assert_eq!(Plan { iters: 2, ..plan }.iters_for(Test::Bw1Qp, 512 << 20), 2);
        assert_eq!(Plan { warmup: 0, ..plan }.warmup_for(1000), 0);
    }

    #[test]
    fn nic_work_is_the_counters_difference_per_iteration() {
        let mut before = gdaki::nic::emu::Stats::default();
        (before.doorbells, before.wqes, before.ring_mirror_wait_ns, before.busy_ns) = (7, 100, 5_000, 1_000_000);
        let mut after = before;
        (after.doorbells, after.blueflame, after.wqes, after.cqes) = (47, 8, 900, 400);
        (after.ring_mirrored, after.ring_mirror_wait_ns, after.ring_fetches) = (20, 45_000, 4);
        (after.host_syncs, after.host_sync_ns, after.executor_passes, after.busy_ns) = (2, 16_000, 1_200, 3_000_000);
        let w = NicWork::between(&before, &after, 400);
        assert_eq!((w.doorbells, w.blueflame, w.wqes, w.cqes), (0.1, 0.02, 2.0, 1.0));
        assert_eq!((w.mirrored, w.mirror_wait_us, w.fetches), (0.05, 0.1, 0.01));
        assert_eq!((w.host_syncs, w.host_sync_us, w.passes, w.busy_us), (0.005, 0.04, 3.0, 5.0));
        // Counters that went back (another NIC's snapshot, say) read as no work, never as a huge number.
        assert_eq!(NicWork::between(&after, &before, 400).wqes, 0.0);
        // Zero iterations count as one.
        assert_eq!(NicWork::between(&before, &after, 0).wqes, 800.0);
    }

    #[test]
    fn sizes_are_checked_per_test() {
        assert!(Test::PacketLl16.check_size(12).is_err());
        assert!(Test::PacketLl8.check_size(12).is_ok());
        assert!(Test::Bw4Qp.check_size(4098).is_err());
        assert_eq!(Test::Bw4Qp.per_channel(4096), 1024);
        assert_eq!(Test::FlushStress.per_channel(1024), 1024);
        assert!(Test::PingPong.check_size(0).is_err());
        assert!(Test::PingPong.check_size(1).is_ok());
    }
}
