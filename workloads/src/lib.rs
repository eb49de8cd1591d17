//! Two real workloads on gdaki's collectives, N ranks as threads of one process on either executor:
//! data-parallel training of a small classifier whose gradients are summed through gdaki ([`train`]), and a
//! MapReduce word count whose per-word counts are summed through gdaki ([`wordcount`]). Both sum `f32`
//! vectors through [`Aggregator`], which hides the aggregation path ([`Path`]).

pub mod train;
pub mod wordcount;

use std::sync::Arc;

use gdaki::channel::{run_ranks, Communicator, RankSetup};
use gdaki::coll::CollConfig;
use gdaki::exec::{Executor, ExecutorKind};
use gdaki_device::coll::{Algorithm, Reduce, RingAllReduce};
use gdaki_testkit::coll::CollRank;

/// The commit the programs were built from (as the examples record it).
pub const COMMIT: &str = gdaki_examples::COMMIT;

/// Values summed per collective call: the accumulation area and the in/out range of one call fit in
/// [`BUFFER_BYTES`], and one call's fetch-adds (one per value per peer) stay well within the wait bound.
pub const CHUNK: usize = 4096;
/// Bytes of each rank's collectives buffer: `CHUNK` `f32`s in and out (in place) at 0, then the
/// accumulation area of `CHUNK` `i64`s.
pub const BUFFER_BYTES: usize = 4 * CHUNK + 8 * CHUNK;
/// Offset of the accumulation area (8-byte aligned, after the in/out range).
const ACC_OFFSET: u64 = 4 * CHUNK as u64;

/// Which way the ranks' vectors are summed (`--path`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Path {
    /// On the NIC: every value quantized to 64-bit fixed point with a power-of-two scale from the rank
    /// count and the bound `max_abs`, added at rank 0 by RDMA fetch-adds, the sum broadcast back
    /// ([`CollRank::all_reduce`]).
    Nic,
    /// On the GPU: a ring reduce-scatter then all-gather over the port channels, the adds made by device
    /// code in a fixed order, exact `f32` arithmetic and the same bits on every rank
    /// ([`CollRank::all_reduce_ring`]); `max_abs` is not needed (values are still checked against it).
    Ring,
}

impl Path {
    /// The name `--path` takes.
    pub fn name(self) -> &'static str {
        match self {
            Path::Nic => "nic",
            Path::Ring => "ring",
        }
    }
}

/// One rank's aggregation: its collectives and the path they sum by.
pub struct Aggregator {
    rank: CollRank,
    path: Path,
}

impl Aggregator {
    /// Sets up `comm`'s collectives (every rank at once, with a buffer of [`BUFFER_BYTES`]) for `path`.
    ///
    /// # Errors
    /// A one-line message: what setting up the collectives returned.
    pub fn new(comm: Arc<Communicator>, path: Path) -> Result<Self, String> {
        let rank = comm.rank();
        let coll = CollRank::new(comm, &CollConfig::new(BUFFER_BYTES))
            .map_err(|e| format!("rank {rank}: setting up the collectives: {e}"))?;
        Ok(Self { rank: coll, path })
    }

    /// This rank.
    pub fn rank(&self) -> u32 {
        self.rank.communicator().rank()
    }

    /// The number of ranks.
    pub fn world_size(&self) -> u32 {
        self.rank.communicator().world_size()
    }

    /// The bootstrap (control plane) of the ranks.
    pub fn bootstrap(&self) -> &gdaki::bootstrap::Bootstrap {
        self.rank.communicator().bootstrap()
    }

    /// Replaces `values` by their element-wise sum over every rank (every rank calls it with as many values
    /// and the same `max_abs`), in calls of at most [`CHUNK`] values.
    ///
    /// On [`Path::Nic`] each result is the exact sum rounded to `f32`, up to the bound of the guide's
    /// "Collectives" section (relative `2^-53` terms); integers whose sums stay below `2^24` come out exact.
    ///
    /// # Errors
    /// A one-line message: a value with `|x| > max_abs` or not finite (that rank sends nothing, the others
    /// time out), or what the collective returned.
    pub fn all_reduce_sum(&self, values: &mut [f32], max_abs: f32) -> Result<(), String> {
        for (i, chunk) in values.chunks_mut(CHUNK).enumerate() {
            let r = self.rank();
            let fail = |e: gdaki::Error| format!("rank {r}: all-reduce of values {}..: {e}", i * CHUNK);
            match self.path {
                Path::Nic => {
                    let buf = self.rank.collectives().buffer();
                    buf.write(0, bytemuck::cast_slice(chunk)).map_err(fail)?;
                    let count = chunk.len() as u64;
                    let red = Reduce { root: 0, offset: 0, count, acc_offset: ACC_OFFSET, out_offset: 0, max_abs };
                    self.rank.all_reduce(&red, Algorithm::Direct).map_err(fail)?;
                    let out = buf.to_vec().map_err(fail)?;
                    chunk.copy_from_slice(bytemuck::cast_slice(&out[..4 * chunk.len()]));
                }
                Path::Ring => {
                    // As the NIC path refuses: an infinity even under an infinite bound, any value under a
                    // NaN one.
                    if let Some(x) = chunk.iter().find(|x| !x.is_finite() || max_abs.is_nan() || x.abs() > max_abs) {
                        return Err(format!("rank {r}: value {x} is not within the bound {max_abs}"));
                    }
                    let buf = self.rank.collectives().buffer();
                    buf.write(0, bytemuck::cast_slice(chunk)).map_err(fail)?;
                    let count = chunk.len() as u64;
                    // In place; the ring's scratch (at most 4 (n - 1) ceil(count / n) bytes) in the area the
                    // NIC path accumulates in.
                    let ring =
                        RingAllReduce { in_offset: 0, out_offset: 0, count, scratch_offset: ACC_OFFSET, chunk: 0 };
                    self.rank.all_reduce_ring(&ring).map_err(fail)?;
                    let out = buf.to_vec().map_err(fail)?;
                    chunk.copy_from_slice(bytemuck::cast_slice(&out[..4 * chunk.len()]));
                }
            }
        }
        Ok(())
    }
}

/// Opens `kind` on GPU `gpu` (`None`: the GPU if there is one, else the CPU, with a note on stderr) to see
/// that it is there, and returns the kind the ranks use.
///
/// # Errors
/// The one line to print, e.g. no usable GPU for `Some(Gpu)`.
pub fn resolve_executor(kind: Option<ExecutorKind>, gpu: usize) -> Result<ExecutorKind, String> {
    let (exec, notice) = Executor::open_on(kind, gpu).map_err(|e| e.to_string())?;
    if let Some(n) = notice {
        gdaki_examples::eprintln_line!("note: {n}");
    }
    Ok(exec.kind())
}

/// Runs `f` on the ranks of `setup` (each with its own NIC: `setup.one_nic` is not used here) and its
/// [`Aggregator`] for `path`: every rank as a thread of this process, or this process's rank of
/// `setup.launch` (one process per rank; on the `gpu` executor each on the GPU of its local rank unless
/// `setup.gpu` names one). Returns what each rank here returned, by rank.
///
/// # Errors
/// A one-line message: a rank count out of `1..=8`, the ranks' setup, or the first rank's error.
pub fn on_ranks<T: Send>(
    setup: RankSetup,
    path: Path,
    f: impl Fn(&Aggregator) -> Result<T, String> + Sync,
) -> Result<Vec<T>, String> {
    let max = gdaki_shared::coll::MAX_RANKS as u32;
    let nranks = setup.launch.as_ref().map_or(setup.ranks, |l| l.world_size);
    if !(1..=max).contains(&nranks) {
        return Err(format!("--nranks must be 1 to {max}, not {nranks}"));
    }
    let out = run_ranks(&setup, |comm| Aggregator::new(comm, path).and_then(|a| f(&a)))
        .map_err(|e| format!("starting the ranks: {e}"))?;
    out.into_iter().map(|(rank, r)| r.map_err(|e| format!("rank {rank}: {e}")).and_then(|x| x)).collect()
}
