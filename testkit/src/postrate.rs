//! Host side of the device-side post-rate microbenchmark ([`gdaki_testkit_kernels::postrate`]): how many 8-byte RDMA
//! WRITE WQEs per second device code builds and submits, one thread per QP on many QPs (Exclusive; doorbell
//! per post, per 32 posts, or BlueFlame), one warp per QP, or many threads on one QP (Device scope), while
//! the emulated NIC consumes them as fast as it can ([`PostRate::new`]) or with nothing consuming them
//! ([`PostRate::without_consumer`]: the post path alone, the figure to set against DOCA GPUNetIO's).
//!
//! Every QP is connected to itself (a loopback QP of one emulated NIC) and writes 8 bytes into a pinned host
//! buffer, so that the NIC's side of each WQE is a plain memory copy: the numbers are the device's posting
//! cost, not the emulator's GPU copies. Without a consumer the QPs stay unconnected.
//!
//! Every round of a rate run is a launch of its own (after a warm-up launch) and starts at a grid-wide barrier,
//! so that a round's span (first poster's start to last poster's end) is the time of all posters posting at
//! once rather than of when each CTA started ([`PostRate::run_in_one_launch`] runs every round in one launch,
//! where the barrier also hides when the NIC let each poster leave the previous round's flush). Each launch is
//! also timed as a whole
//! ([`Kernel::launch_timed`](gdaki::launch::Kernel::launch_timed): CUDA events on the GPU, wall time on the
//! `cpu` executor), DOCA GPUNetIO's measure of its post path.

use std::time::Duration;

use gdaki_device::launch::DevPtr;
use gdaki_shared::handle::{ErrorReport, QpHandle};
use gdaki_testkit_kernels::entries;
use gdaki_testkit_kernels::postrate::{shape, PostRateArgs};

use gdaki::exec::Executor;
use gdaki::launch::{LaunchConfig, Module};
use gdaki::mem::{MappedBuf, MemKind, MemLoc};
use gdaki::nic::emu::{Access, Cq, EmuConfig, EmuNic, Mr, Pd, Qp};
use gdaki::{Error, Result};

/// SQ size of every QP, WQEBBs (the emulated NIC's largest; its CQ has as many CQEs): a round's WQEs must
/// fit without waiting.
pub const WQE_CNT: u32 = 32768;

/// Offset in a launch's control buffer of the times: after the 64-byte report, on a line of their own.
const TIMES_AT: usize = 128;

/// How one run posts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// One thread per QP on `qps` QPs; a doorbell every `db_batch` posts, or BlueFlame on every post.
    Exclusive {
        /// QPs (one CTA of one posting thread each).
        qps: u32,
        /// Posts per doorbell (ignored with `bf`).
        db_batch: u32,
        /// Ring every post by BlueFlame.
        bf: bool,
    },
    /// One thread per QP on `qps` QPs, posting `Qp::post_batch`es of `batch` WQEs (one reservation each) with a
    /// doorbell after each: the Exclusive shape of a doorbell every `batch` posts, through the batch call.
    Batch {
        /// QPs (one CTA of one posting thread each).
        qps: u32,
        /// WQEs per call and doorbell.
        batch: u32,
    },
    /// `ctas × threads` threads on one QP (Device-scope shared QP; every post rings, batched by the QP).
    Shared {
        /// CTAs (teams).
        ctas: u32,
        /// Threads per CTA.
        threads: u32,
    },
    /// The platform's floor under the Exclusive shape with the same `qps` and `bf`: one thread per QP runs
    /// each post's ordering alone (the dbrec's release store, the release fence, the doorbell or the eight
    /// BlueFlame stores) with no WQE built or stored. Only without a consumer
    /// ([`PostRate::without_consumer`]).
    Ordering {
        /// QPs (one CTA of one thread each).
        qps: u32,
        /// BlueFlame stores instead of the doorbell.
        bf: bool,
    },
    /// One warp per QP on `qps` QPs, `lanes` lanes posting together (a WQE each, one doorbell per post): 32 on
    /// the GPU; 1 on host threads, where a thread is a warp of one lane.
    Warp {
        /// QPs (one CTA of one warp each).
        qps: u32,
        /// Posting lanes per warp, 1 ..= 32.
        lanes: u32,
    },
    /// One warp of 32 lanes per QP on `qps` QPs, of which the first `lanes` (1 ..= 31) post a WQE each and the
    /// others make every call with none (`WarpQp::post_some`): batches that not every lane fills. GPU only.
    WarpPart {
        /// QPs (one CTA of one warp each).
        qps: u32,
        /// Lanes with a WQE.
        lanes: u32,
    },
    /// The platform's floor under the Warp shape with the same `qps` and `lanes`: each lane stores its WQE to
    /// its slot of the ring, the lanes sync, and the lowest runs one doorbell's ordering, with nothing
    /// reserved, checked or retired. Only without a consumer ([`PostRate::without_consumer`]).
    WarpOrdering {
        /// QPs (one CTA of one warp each).
        qps: u32,
        /// Lanes per warp, as in the Warp shape.
        lanes: u32,
    },
}

impl Shape {
    /// A row label, e.g. "Exclusive 132 QPs, db/32" or "Device 8x128 thr, 1 QP".
    pub fn label(&self) -> String {
        match *self {
            Shape::Exclusive { qps, bf: true, .. } => format!("Exclusive {qps} QP(s), BlueFlame"),
            Shape::Exclusive { qps, db_batch, .. } => format!("Exclusive {qps} QP(s), doorbell/{db_batch}"),
            Shape::Batch { qps, batch } => format!("Exclusive {qps} QP(s), post_batch/{batch}"),
            Shape::Ordering { qps, bf } => {
                format!("floor: ordering only, {qps} QP(s), {}", if bf { "BlueFlame" } else { "doorbell" })
            }
            Shape::Shared { ctas, threads } => format!("Device {ctas}x{threads} threads, 1 QP"),
            Shape::Warp { qps, lanes } => format!("Warp {qps} QP(s), {lanes} lanes"),
            Shape::WarpOrdering { qps, lanes } => format!("floor: warp post, {qps} QP(s), {lanes} lanes"),
            Shape::WarpPart { qps, lanes } => format!("Warp {qps} QP(s), {lanes} of 32 lanes"),
        }
    }

    fn teams(&self) -> (u32, u32, u32) {
        match *self {
            Shape::Exclusive { qps, .. } | Shape::Batch { qps, .. } | Shape::Ordering { qps, .. } => (qps, 1, 1),
            Shape::Shared { ctas, threads } => (ctas, threads, threads),
            Shape::Warp { qps, lanes } | Shape::WarpOrdering { qps, lanes } => (qps, lanes, lanes),
            Shape::WarpPart { qps, lanes } => (qps, 32, lanes),
        }
    }
}

/// What one run measured.
#[derive(Clone, Debug)]
pub struct RateResult {
    /// WQEs posted in the timed rounds.
    pub wqes: u64,
    /// Per round: from the first poster's start to the last poster's end (`%globaltimer` on the GPU), ns. In a
    /// rate run ([`PostRate::run`]) the posters start together (a grid-wide barrier), so this is the span of
    /// all of them posting at once.
    pub round_ns: Vec<u64>,
    /// Per poster and round: its own time per post, ns.
    pub post_ns: Vec<f64>,
    /// Per launch: its time, ns ([`Kernel::launch_timed`](gdaki::launch::Kernel::launch_timed): between CUDA
    /// events on the GPU, wall time on the `cpu` executor): one per timed round (the warm-up launch is left
    /// out), each with its flushes when the NIC consumes; from [`PostRate::run_in_one_launch`], the single
    /// launch of every round, the warm-up round and the untimed flushes included.
    pub launch_ns: Vec<u64>,
}

impl RateResult {
    /// WQEs per second over the median round.
    pub fn wqes_per_s(&self, posters: u32, posts: u32) -> f64 {
        let mut r = self.round_ns.clone();
        r.sort_unstable();
        let median = r.get(r.len() / 2).copied().unwrap_or(0).max(1);
        posters as f64 * posts as f64 / (median as f64 * 1e-9)
    }

    /// Median of the posters' ns per post.
    pub fn median_ns_per_post(&self) -> f64 {
        self.ns_per_post_at(0.5)
    }

    /// The slowest poster's ns per post over all rounds: the tail that sets a round's span, and with it the
    /// rate, when posters run together.
    pub fn max_ns_per_post(&self) -> f64 {
        self.ns_per_post_at(1.0)
    }

    /// The posters' ns per post at quantile `q` (0 ..= 1, nearest rank below); 0 without a sample.
    fn ns_per_post_at(&self, q: f64) -> f64 {
        let mut v = self.post_ns.clone();
        v.sort_by(f64::total_cmp);
        let i = ((v.len() as f64 * q) as usize).min(v.len().saturating_sub(1));
        v.get(i).copied().unwrap_or(0.0)
    }

    /// Median of the launches' times ([`RateResult::launch_ns`]), ns; 0 without a launch.
    pub fn median_launch_ns(&self) -> u64 {
        let mut v = self.launch_ns.clone();
        v.sort_unstable();
        v.get(v.len() / 2).copied().unwrap_or(0)
    }
}

/// The QPs and buffers of the benchmark, on one emulated NIC.
pub struct PostRate {
    exec: Executor,
    /// Field order is drop order: MRs and QPs before the NIC's memory they name.
    _mrs: (Mr, Mr),
    qps: Vec<Qp>,
    _cqs: Vec<Cq>,
    _pd: Pd,
    nic: std::sync::Arc<EmuNic>,
    _src: MappedBuf,
    _dst: MappedBuf,
    max_posters: u32,
    /// WQEBBs of each SQ (and CQEs of each CQ).
    wqe_cnt: u32,
    /// Whether the NIC consumes the rings (its QPs are connected); see [`PostRate::without_consumer`].
    consumer: bool,
}

impl PostRate {
    /// Opens an emulated NIC for `exec` with `nqps` loopback QPs and room for `max_posters` posting threads.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for zero counts; the NIC's and allocation errors.
    pub fn new(exec: Executor, nqps: u32, max_posters: u32) -> Result<Self> {
        Self::open(exec, nqps, max_posters, true, WQE_CNT)
    }

    /// As [`PostRate::new`], with SQs of `wqe_cnt` WQEBBs instead of [`WQE_CNT`] (for floods on small rings).
    ///
    /// # Errors
    /// As [`PostRate::new`]; the NIC's for a ring size it refuses.
    pub fn with_ring(exec: Executor, nqps: u32, max_posters: u32, wqe_cnt: u32) -> Result<Self> {
        Self::open(exec, nqps, max_posters, true, wqe_cnt)
    }

    /// As [`PostRate::new`], with nothing consuming the rings: the QPs are never connected, so the NIC never
    /// looks at their doorbells (DOCA GPUNetIO's post path is measured this way). Each timed round is a launch
    /// of its own on fresh counters (the rings are never retired), and nothing is flushed.
    ///
    /// # Errors
    /// As [`PostRate::new`].
    pub fn without_consumer(exec: Executor, nqps: u32, max_posters: u32) -> Result<Self> {
        Self::open(exec, nqps, max_posters, false, WQE_CNT)
    }

    fn open(exec: Executor, nqps: u32, max_posters: u32, consumer: bool, wqe_cnt: u32) -> Result<Self> {
        if nqps == 0 || max_posters == 0 {
            return Err(Error::InvalidArgument("post rate: at least one QP and one poster".into()));
        }
        let nic = EmuNic::open(EmuConfig::for_executor(&exec)?)?;
        let pd = nic.alloc_pd()?;
        let (mut cqs, mut qps) = (Vec::new(), Vec::new());
        for _ in 0..nqps {
            let cq = nic.create_cq(wqe_cnt)?;
            let qp = nic.create_qp(&pd, &cq, wqe_cnt)?;
            if consumer {
                qp.connect(&qp.endpoint())?;
            }
            cqs.push(cq);
            qps.push(qp);
        }
        let mem = exec.queue_memory();
        let (src, dst) = (mem.alloc(8)?, mem.alloc(8 * max_posters as usize)?);
        let loc = |b: &MappedBuf| MemLoc { kind: MemKind::Host, addr: b.device_addr() };
        // SAFETY: both buffers live in `self` and are dropped after the MRs (field order).
        let mrs = unsafe {
            (
                nic.reg_mr(&pd, loc(&src), 8, Access::NONE)?,
                nic.reg_mr(&pd, loc(&dst), 8 * max_posters as u64, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?,
            )
        };
        Ok(Self { exec, _mrs: mrs, qps, _cqs: cqs, _pd: pd, nic, _src: src, _dst: dst, max_posters, wqe_cnt, consumer })
    }

    /// Runs `rounds` rounds of `posts` WRITEs per poster in `shape`, each a launch of its own after one untimed
    /// warm-up launch, with and without a consumer alike, so that the two modes differ in the NIC alone (with a
    /// consumer each launch ends with its posters' flushes). Every round starts at a grid-wide barrier, so on
    /// the GPU the shape's CTAs must all be resident at once (as in every shape the `post_rate` program and the
    /// tests run: at most 264 CTAs of 32 threads).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the shape needs more QPs or posters than set up, or a round's WQEs do not
    /// fit one SQ; [`Error::Device`] for what device code reported (a barrier that timed out, with a grid too
    /// large to be resident, among them); CUDA errors.
    pub fn run(&mut self, shape: Shape, posts: u32, rounds: u32, timeout: Duration) -> Result<RateResult> {
        self.launch(shape, posts, 1, timeout, true, false)?;
        let mut all = RateResult { wqes: 0, round_ns: Vec::new(), post_ns: Vec::new(), launch_ns: Vec::new() };
        for _ in 0..rounds {
            let r = self.launch(shape, posts, 1, timeout, true, false)?;
            all.wqes += r.wqes;
            all.round_ns.extend(r.round_ns);
            all.post_ns.extend(r.post_ns);
            all.launch_ns.extend(r.launch_ns);
        }
        Ok(all)
    }

    /// As [`PostRate::run`], with every round (the warm-up round first) in one launch: each round after the
    /// first starts once every poster has flushed the one before, at the grid-wide barrier, as in a persistent
    /// kernel that posts, flushes and posts again. Measured on the H200, the two many-poster shapes that post
    /// most (132 QPs with a doorbell every 32 posts, 264 warps) post 1.4-1.5x slower in such rounds than in a
    /// launch of their own, with or without the NIC's engine on the GPU and with the NIC's thread asleep while
    /// they post; the cause is not known.
    ///
    /// # Errors
    /// As [`PostRate::run`]; [`Error::InvalidArgument`] without a consumer (nothing would retire the rings
    /// between rounds).
    pub fn run_in_one_launch(
        &mut self,
        shape: Shape,
        posts: u32,
        rounds: u32,
        timeout: Duration,
    ) -> Result<RateResult> {
        if !self.consumer {
            return Err(Error::InvalidArgument(
                "post rate: rounds in one launch need a consumer to retire the rings between them".into(),
            ));
        }
        self.launch(shape, posts, rounds + 1, timeout, true, false)
    }

    /// `ctas × threads` threads post `posts` WRITEs each to the one Device-scope QP in a single round, however
    /// far that oversubscribes its SQ: posters wait for room, and reservations may run more than 2^16 WQEBBs
    /// ahead of the retired ones (a full H200 grid has 270,336 threads). Not a rate: a correctness run, whose
    /// result says how many WQEs device code claims to have posted; [`PostRate::nic`]'s counters say how many
    /// the NIC executed. No barrier starts the round, so the grid need not be resident at once. With `mixed`,
    /// odd posters post a 32-byte inline WRITE (two WQEBBs) instead, so that the lanes of a GPU warp post WQEs
    /// of two sizes in one call (the posters then come in groups of four, each odd one writing its group's
    /// four slots).
    ///
    /// # Errors
    /// As [`PostRate::run`], except that the round need not fit the SQ; [`Error::InvalidArgument`] without a
    /// consumer (the posters would wait for room forever), or for `mixed` posters that are not a multiple of
    /// four.
    pub fn flood(&mut self, ctas: u32, threads: u32, posts: u32, mixed: bool, timeout: Duration) -> Result<RateResult> {
        if !self.consumer {
            return Err(Error::InvalidArgument("post rate: a flood needs a NIC that consumes".into()));
        }
        if mixed && !(ctas * threads).is_multiple_of(4) {
            return Err(Error::InvalidArgument("post rate: a mixed flood takes posters in groups of four".into()));
        }
        self.launch(Shape::Shared { ctas, threads }, posts, 1, timeout, false, mixed)
    }

    /// Runs `total_rounds` rounds (the first untimed when more than one); with `rate`, a rate run: refuses a
    /// round that does not fit the SQ and starts every round at the grid-wide barrier; `mixed` as for
    /// [`PostRate::flood`].
    fn launch(
        &mut self,
        shape: Shape,
        posts: u32,
        total_rounds: u32,
        timeout: Duration,
        rate: bool,
        mixed: bool,
    ) -> Result<RateResult> {
        let (teams, team_size, team_posters) = shape.teams();
        let posters = teams * team_posters;
        let per_qp = match shape {
            Shape::Exclusive { .. } | Shape::Batch { .. } | Shape::Ordering { .. } => posts as u64,
            Shape::Shared { .. } => posts as u64 * posters as u64,
            Shape::Warp { .. } | Shape::WarpOrdering { .. } | Shape::WarpPart { .. } => {
                posts as u64 * team_posters as u64
            }
        };
        let nqps = match shape {
            Shape::Exclusive { qps, .. }
            | Shape::Batch { qps, .. }
            | Shape::Ordering { qps, .. }
            | Shape::Warp { qps, .. }
            | Shape::WarpOrdering { qps, .. }
            | Shape::WarpPart { qps, .. } => qps,
            Shape::Shared { .. } => 1,
        };
        let warp_ok = |lanes: u32| (1..=32).contains(&lanes) && (lanes == 1 || matches!(self.exec, Executor::Gpu(_)));
        let shape_ok = match shape {
            Shape::Warp { lanes, .. } => warp_ok(lanes),
            // The floors name WQEs never stored or never reserved: no NIC may look at them.
            Shape::Ordering { .. } => !self.consumer,
            Shape::WarpOrdering { lanes, .. } => warp_ok(lanes) && !self.consumer,
            Shape::WarpPart { lanes, .. } => (1..32).contains(&lanes) && matches!(self.exec, Executor::Gpu(_)),
            // At most half the ring per call (`Qp::post_batch`).
            Shape::Batch { batch, .. } => (1..=self.wqe_cnt / 2).contains(&batch),
            _ => true,
        };
        let too_many = rate && per_qp + 2 > self.wqe_cnt as u64 / 2;
        let fits = nqps as usize <= self.qps.len() && posters <= self.max_posters && !too_many;
        if !fits || !shape_ok || posts == 0 || total_rounds == 0 {
            return Err(Error::InvalidArgument(format!(
                "post rate {}: {posters} posters × {posts} posts on {nqps} QPs (set up: {} QPs, {} posters, {} \
                 WQEBBs per SQ, half of which a round may take; a warp has 1 ..= 32 lanes, 1 on host threads; \
                 the ordering floor only without a consumer)",
                shape.label(),
                self.qps.len(),
                self.max_posters,
                self.wqe_cnt
            )));
        }
        // QP handles where device code keeps them; fresh ones each run (the NIC has consumed everything posted
        // before: every round ends with a flush).
        let handles: Vec<QpHandle> = self.qps[..nqps as usize].iter().map(|q| q.handle()).collect();
        let hbytes = bytemuck::cast_slice::<QpHandle, u8>(&handles);
        // The handles, then the barrier's counter on a line of its own (zeroed by the allocation), in the memory
        // device code keeps its data in: the teams poll the counter, and 132 CTAs polling a word in pinned host
        // memory flood PCIe with reads, so that they saw the last arrival 71-130 µs apart (measured on the H200).
        let barrier_at = hbytes.len().next_multiple_of(128);
        let state = self.exec.alloc_data(barrier_at + 128)?;
        state.write(0, hbytes)?;
        // The report (64 bytes) and the times, which the host reads back; zeroed by the allocation.
        let ctrl = self.exec.queue_memory().alloc(TIMES_AT + 16 * (total_rounds * posters) as usize)?;
        let base = state.loc().addr;
        let (bf, db_batch) = match shape {
            Shape::Exclusive { db_batch, .. } => (0, db_batch.max(1)),
            Shape::Batch { batch, .. } => (0, batch),
            Shape::Ordering { bf, .. } => (bf as u32, 1),
            Shape::Shared { .. } | Shape::Warp { .. } | Shape::WarpOrdering { .. } | Shape::WarpPart { .. } => (0, 1),
        };
        // Each shape is a kernel of its own (`postrate::run`), which checks that the arguments are for it.
        let (shape_id, entry) = match shape {
            Shape::Exclusive { bf: false, .. } => (shape::EXCLUSIVE, &entries::GDAKI_POST_RATE_EXCLUSIVE),
            Shape::Exclusive { bf: true, .. } => (shape::BLUEFLAME, &entries::GDAKI_POST_RATE_BLUEFLAME),
            Shape::Ordering { .. } => (shape::ORDERING, &entries::GDAKI_POST_RATE_ORDERING),
            Shape::Shared { .. } => (shape::SHARED, &entries::GDAKI_POST_RATE_SHARED),
            Shape::Warp { .. } => (shape::WARP, &entries::GDAKI_POST_RATE_WARP),
            Shape::WarpOrdering { .. } => (shape::WARP_ORDERING, &entries::GDAKI_POST_RATE_WARP_ORDERING),
            Shape::WarpPart { .. } => (shape::WARP_PART, &entries::GDAKI_POST_RATE_WARP_PART),
            Shape::Batch { .. } => (shape::BATCH, &entries::GDAKI_POST_RATE_BATCH),
        };
        let args = PostRateArgs {
            qps: base,
            dst: self._mrs.1.remote(),
            src: self._mrs.0.handle(),
            times: ctrl.device_addr() + TIMES_AT as u64,
            report: ctrl.device_addr(),
            barrier: if rate { base + barrier_at as u64 } else { 0 },
            timeout_ns: u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX),
            posts,
            rounds: total_rounds,
            shape: shape_id,
            db_batch,
            bf,
            team_posters,
            posters,
            no_consumer: u32::from(!self.consumer),
            teams,
            mixed: u32::from(mixed),
        };
        let args_at = match &self.exec {
            Executor::Gpu(g) => {
                let a = g.alloc_device(size_of::<PostRateArgs>())?;
                a.copy_from_host(0, bytemuck::bytes_of(&args))?;
                let addr = a.device_addr();
                (Some(a), addr)
            }
            Executor::Cpu => (None, &args as *const PostRateArgs as u64),
        };
        let kernel = Module::load(&self.exec, crate::ptx::PTX)?.kernel(entry)?;
        // Each round may wait out one bound (a flush); a barrier that runs out ends the launch, so it adds at
        // most one more.
        let bound = timeout.saturating_mul(total_rounds.saturating_add(1)).saturating_add(Duration::from_secs(10));
        // SAFETY: the arguments, handles, buffers and control words are live for the launch (owned by `self` and
        // this frame, the GPU copy of the arguments by `args_at`); one block per team; the launch is waited for.
        let elapsed =
            unsafe { kernel.launch_timed(&LaunchConfig::linear(teams, team_size), (DevPtr::new(args_at.1),), bound)? };
        drop(args_at);
        // SAFETY: the device code has finished; the report is the first 64 bytes of `ctrl`.
        let report = unsafe { (ctrl.host_ptr() as *const ErrorReport).read_volatile() };
        if let Some(e) = gdaki_device::Error::from_report(&report) {
            return Err(Error::Device(format!("post rate {}: {e}", shape.label())));
        }
        // SAFETY: rounds × posters × 2 words at `TIMES_AT`, written by the device code, which has finished.
        let times = unsafe {
            std::slice::from_raw_parts(
                ctrl.host_ptr().add(TIMES_AT) as *const u64,
                (2 * total_rounds * posters) as usize,
            )
        };
        let launch_ns = vec![u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX)];
        let mut result = RateResult { wqes: 0, round_ns: Vec::new(), post_ns: Vec::new(), launch_ns };
        // Round 0 warms up (module, caches, first touches of the rings) when there are more.
        let warmup = usize::from(total_rounds > 1);
        for round in times.chunks(2 * posters as usize).skip(warmup) {
            let (starts, ends): (Vec<u64>, Vec<u64>) = round.chunks(2).map(|w| (w[0], w[1])).unzip();
            let (first, last) = (starts.iter().min().copied().unwrap_or(0), ends.iter().max().copied().unwrap_or(0));
            result.round_ns.push(last.saturating_sub(first));
            result.post_ns.extend(starts.iter().zip(&ends).map(|(s, e)| e.saturating_sub(*s) as f64 / posts as f64));
            result.wqes += posters as u64 * posts as u64;
        }
        Ok(result)
    }

    /// The NIC's counters (doorbells, BlueFlame writes, WQEs).
    pub fn nic(&self) -> &EmuNic {
        &self.nic
    }
}

#[cfg(test)]
mod tests {
    use super::RateResult;

    #[test]
    fn median_and_slowest_poster() {
        let r =
            RateResult { wqes: 0, round_ns: vec![], post_ns: vec![30.0, 10.0, 50.0, 20.0, 40.0], launch_ns: vec![] };
        assert_eq!((r.median_ns_per_post(), r.max_ns_per_post()), (30.0, 50.0));
        let none = RateResult { wqes: 0, round_ns: vec![], post_ns: vec![], launch_ns: vec![] };
        assert_eq!((none.median_ns_per_post(), none.max_ns_per_post()), (0.0, 0.0));
    }
}
