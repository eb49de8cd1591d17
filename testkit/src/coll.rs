//! Host side of the collectives' tests: one rank's [`Collectives`] and launches of the
//! `gdaki_testkit_kernels` collective kernels (thread 0 of one block makes the call; every thread of the block
//! for the ring all-reduce) on either executor.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use gdaki_device::coll::{Algorithm, Broadcast, Reduce, RingAllReduce};
use gdaki_device::launch::DevPtr;
use gdaki_shared::coll::{CollHandle, MAX_RANKS};
use gdaki_testkit_kernels::entries;

use gdaki::channel::Communicator;
use gdaki::coll::{CollConfig, Collectives};
use gdaki::exec::{DataBuf, ExecutorKind};
use gdaki::launch::{Kernel, LaunchConfig, Module};
use gdaki::{Error, Result};

/// Bytes of one array of counts.
const COUNTS_BYTES: usize = 8 * MAX_RANKS;

/// `gdaki_coll_broadcast`'s parameters: handle, algorithm code, root, offset, bytes, chunk.
type BroadcastArgs = (DevPtr<CollHandle>, u32, u32, u64, u64, u64);
/// `gdaki_coll_all_to_all_v`'s parameters: handle, send counts, receive counts, send and receive offsets.
type AllToAllVArgs = (DevPtr<CollHandle>, DevPtr<u64>, DevPtr<u64>, u64, u64);
/// `gdaki_coll_reduce`'s parameters: handle, root, offset, count, accumulation and output offsets, bound.
type ReduceArgs = (DevPtr<CollHandle>, u32, u64, u64, u64, u64, f32);
/// `gdaki_coll_all_reduce`'s parameters: handle, algorithm code, then those of [`ReduceArgs`] after the handle.
type AllReduceArgs = (DevPtr<CollHandle>, u32, u32, u64, u64, u64, u64, f32);
/// `gdaki_coll_all_reduce_ring`'s parameters: handle, the call's [`RingAllReduce`], the threads of each block
/// that make the call.
type RingArgs = (DevPtr<CollHandle>, DevPtr<RingAllReduce>, u32);

/// Threads of the ring all-reduce's block: 128 on the GPU (they add), 4 on CPU threads (enough to run the
/// block's barriers and strided shares, few enough for a small machine running 8 ranks).
fn ring_threads(kind: ExecutorKind) -> u32 {
    match kind {
        ExecutorKind::Gpu => 128,
        _ => 4,
    }
}

/// One rank's collectives and their kernels, loaded. Its calls may come from several threads: they take
/// turns (one call at a time on this rank, barrier and launch together), since the kernels of two calls at
/// once would post to the same channels from two threads.
pub struct CollRank {
    /// Field order is drop order: the uploaded handle before what it names.
    handle: DataBuf,
    coll: Collectives,
    comm: Arc<Communicator>,
    /// Send counts (`MAX_RANKS` words), then the receive counts the kernel writes.
    counts: DataBuf,
    broadcast: Kernel<BroadcastArgs>,
    all_to_all_v: Kernel<AllToAllVArgs>,
    reduce: Kernel<ReduceArgs>,
    all_reduce: Kernel<AllReduceArgs>,
    /// The ring all-reduce's arguments, written before each launch.
    ring_args: DataBuf,
    all_reduce_ring: Kernel<RingArgs>,
    launch_timeout: Duration,
    /// Set by [`CollRank::leave`]: the drop skips its barrier.
    leaving: bool,
    /// Held for the whole of each call: its barrier, its arguments (`counts`, `ring_args`) and its launch.
    /// Holds why the rank takes no more calls, once a launch ended without its kernel's own result (see
    /// [`CollRank::turn`]).
    turn: Mutex<Option<String>>,
}

impl Drop for CollRank {
    /// Waits at the bootstrap barrier before anything is freed: freeing GPU memory (`cuMemFree`), pinned
    /// memory or a module waits for every running kernel of the GPU and holds up the other threads' CUDA
    /// calls meanwhile, the NICs' copies among them, so a rank that finished its last call first and freed
    /// its buffers would stall the peers still in that call (their NICs could not place what arrives). A
    /// failed barrier (a peer gone) is ignored: the drop goes on.
    fn drop(&mut self) {
        if self.leaving {
            return;
        }
        if let Err(e) = self.barrier() {
            tracing::debug!("collectives of rank {}: the barrier before freeing failed: {e}", self.comm.rank());
        }
    }
}

impl CollRank {
    /// Sets up `comm`'s collectives with `cfg` (every rank at once) and loads the kernels.
    ///
    /// # Errors
    /// As [`Collectives::new`]; module load and upload errors.
    pub fn new(comm: Arc<Communicator>, cfg: &CollConfig) -> Result<Self> {
        let coll = Collectives::new(&comm, cfg)?;
        let exec = comm.executor();
        let handle = exec.upload(coll.handle())?;
        // Loaded before any rank launches: loading a module waits for running kernels.
        let module = Module::load(exec, crate::ptx::PTX)?;
        let broadcast = module.kernel(&entries::GDAKI_COLL_BROADCAST)?;
        let all_to_all_v = module.kernel(&entries::GDAKI_COLL_ALL_TO_ALL_V)?;
        let reduce = module.kernel(&entries::GDAKI_COLL_REDUCE)?;
        let all_reduce = module.kernel(&entries::GDAKI_COLL_ALL_REDUCE)?;
        let all_reduce_ring = module.kernel(&entries::GDAKI_COLL_ALL_REDUCE_RING)?;
        let counts = exec.alloc_data(2 * COUNTS_BYTES)?;
        let ring_args = exec.upload(&RingAllReduce::default())?;
        let launch_timeout = cfg.timeout.saturating_mul(4).saturating_add(Duration::from_secs(10));
        Ok(Self {
            handle,
            coll,
            comm,
            counts,
            broadcast,
            all_to_all_v,
            reduce,
            all_reduce,
            ring_args,
            all_reduce_ring,
            launch_timeout,
            leaving: false,
            turn: Mutex::new(None),
        })
    }

    /// Leaves the session now, as a rank that quits mid-run does ([`Communicator::leave`]): the other ranks'
    /// kernels that wait for this one end with `PeerGone`, and the drop skips its barrier. With ranks as threads
    /// of one process on one GPU, keep this value until the other ranks' calls have ended: freeing GPU memory
    /// waits for every running kernel of the GPU and holds up the other threads' CUDA calls meanwhile, the
    /// NICs' copies among them, so the other kernels would wait out their bounds (seen on an H100).
    pub fn leave(&mut self) {
        self.leaving = true;
        self.comm.leave();
    }

    /// Sets the bound of each call's wait for its kernel (by default four times the collectives' timeout and
    /// 10 s): a wait that ends first leaves the kernel running, and the rank takes no more calls
    /// ([`CollRank::turn`]).
    pub fn set_launch_timeout(&mut self, timeout: Duration) {
        self.launch_timeout = timeout;
    }

    /// This rank's turn to make a call: no other call of this rank runs until it is dropped. A call that
    /// panicked left nothing half-done that the next one reads (each writes its own arguments first).
    ///
    /// # Errors
    /// [`Error::Device`], before the call's barrier, once a launch of this rank ended without its kernel's own
    /// result (its wait timed out, or a CUDA or host-thread failure): that kernel may still run and post on
    /// the channels, and a new call's kernel beside it would mix their WQEs and counts.
    fn turn(&self) -> Result<MutexGuard<'_, Option<String>>> {
        let turn = self.turn.lock().unwrap_or_else(PoisonError::into_inner);
        match &*turn {
            Some(why) => Err(Error::Device(format!(
                "rank {}: no more collectives on this rank: an earlier call's kernel may still run ({why})",
                self.comm.rank()
            ))),
            None => Ok(turn),
        }
    }

    /// The collectives (buffer, acknowledgment counter).
    pub fn collectives(&self) -> &Collectives {
        &self.coll
    }

    /// The communicator.
    pub fn communicator(&self) -> &Communicator {
        &self.comm
    }

    /// Launches `k` as `blocks` blocks of `threads` and waits for it (bounded); returns the time from the
    /// launch call to its end as the host sees it.
    ///
    /// # Safety
    /// As [`Kernel::launch`] for `args`.
    unsafe fn timed<A: gdaki_device::launch::LaunchArgs>(
        &self,
        turn: &mut MutexGuard<'_, Option<String>>,
        k: &Kernel<A>,
        (blocks, threads): (u32, u32),
        args: A,
    ) -> Result<Duration> {
        let t0 = Instant::now();
        // SAFETY: the caller's contract.
        match unsafe { k.launch(&LaunchConfig::linear(blocks, threads), args, self.launch_timeout) } {
            Ok(()) => Ok(t0.elapsed()),
            // The kernel ended and said why: the next call may go.
            Err(e @ Error::Kernel { .. }) => Err(e),
            Err(e) => {
                **turn = Some(e.to_string());
                Err(e)
            }
        }
    }

    /// Waits at the bootstrap barrier with every rank, so that all kernels start together (none waits out
    /// its bound for a peer still setting up). A rank that sits a call out passes it too.
    ///
    /// # Errors
    /// Bootstrap errors.
    pub fn barrier(&self) -> Result<()> {
        self.comm.bootstrap().barrier()
    }

    /// [`CollRank::barrier`], then one broadcast `b` on this rank (every rank calls it with the same `b`).
    /// Returns the time from the launch call to the kernel's end as the host sees it (the barrier left out, as
    /// in every call here). Not CUDA events, nor the kernel's own clock: with 8 ranks on one GPU either
    /// stalled the ranks (see [`Kernel::launch_timed`](gdaki::launch::Kernel::launch_timed)).
    ///
    /// # Errors
    /// [`gdaki::Error::Kernel`] with what device code returned; launch and bootstrap errors.
    pub fn broadcast(&self, b: &Broadcast) -> Result<Duration> {
        let mut turn = self.turn()?;
        self.barrier()?;
        let args = (self.handle.dev_ptr(), b.algorithm as u32, b.root, b.offset, b.bytes, b.chunk);
        // SAFETY: the uploaded handle names this rank's live collectives (owned by `self`); one thread of
        // the launch uses their channels, and no other launch of this rank runs meanwhile (`_turn`); the
        // launch is waited for here.
        unsafe { self.timed(&mut turn, &self.broadcast, (1, 1), args) }
    }

    /// [`CollRank::barrier`], then one all-to-all on this rank: `send_counts[p]` bytes (one count per rank)
    /// from the send region at `send_offset` to rank `p`, packed; what every rank sends this one lands at
    /// `recv_offset`, packed by source. Returns the byte counts received, by source rank, and the call's
    /// time (as [`CollRank::broadcast`]).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a count per rank missing; as [`CollRank::broadcast`].
    pub fn all_to_all_v(
        &self,
        send_counts: &[u64],
        send_offset: u64,
        recv_offset: u64,
    ) -> Result<(Vec<u64>, Duration)> {
        let n = self.comm.world_size() as usize;
        if send_counts.len() != n {
            return Err(Error::InvalidArgument(format!("{} send counts for {n} ranks", send_counts.len())));
        }
        let mut turn = self.turn()?;
        let mut words = [0u64; 2 * MAX_RANKS];
        words[..n].copy_from_slice(send_counts);
        self.counts.write(0, bytemuck::cast_slice(&words))?;
        self.barrier()?;
        let base = self.counts.loc().addr;
        let args = (
            self.handle.dev_ptr(),
            DevPtr::new(base),
            DevPtr::new(base + COUNTS_BYTES as u64),
            send_offset,
            recv_offset,
        );
        // SAFETY: as in `broadcast`; the counts are two arrays of MAX_RANKS words owned by `self`.
        let time = unsafe { self.timed(&mut turn, &self.all_to_all_v, (1, 1), args) }?;
        let out = self.counts.to_vec()?;
        let got = out[COUNTS_BYTES..COUNTS_BYTES + 8 * n]
            .chunks_exact(8)
            .map(|w| u64::from_le_bytes(w.try_into().unwrap_or_default()))
            .collect();
        Ok((got, time))
    }

    /// [`CollRank::barrier`], then one reduce `r` on this rank (every rank calls it with the same `r`): the
    /// sum lands in the root's output range. Returns the call's time (as [`CollRank::broadcast`]).
    ///
    /// # Errors
    /// As [`CollRank::broadcast`].
    pub fn reduce(&self, r: &Reduce) -> Result<Duration> {
        let mut turn = self.turn()?;
        self.barrier()?;
        let args = (self.handle.dev_ptr(), r.root, r.offset, r.count, r.acc_offset, r.out_offset, r.max_abs);
        // SAFETY: as in `broadcast`.
        unsafe { self.timed(&mut turn, &self.reduce, (1, 1), args) }
    }

    /// [`CollRank::barrier`], then one all-reduce `r` on this rank, its broadcast by `algorithm`: the sum
    /// lands in every rank's output range. Returns the call's time (as [`CollRank::broadcast`]).
    ///
    /// # Errors
    /// As [`CollRank::broadcast`].
    pub fn all_reduce(&self, r: &Reduce, algorithm: Algorithm) -> Result<Duration> {
        let mut turn = self.turn()?;
        self.barrier()?;
        let (h, code) = (self.handle.dev_ptr(), algorithm as u32);
        let args = (h, code, r.root, r.offset, r.count, r.acc_offset, r.out_offset, r.max_abs);
        // SAFETY: as in `broadcast`.
        unsafe { self.timed(&mut turn, &self.all_reduce, (1, 1), args) }
    }

    /// [`CollRank::barrier`], then one ring all-reduce `r` on this rank, summed by the threads of one block
    /// (128 on the GPU, 4 on CPU threads): the sum lands in every rank's output range, the same bits on every
    /// rank. Returns the call's time (as [`CollRank::broadcast`]).
    ///
    /// # Errors
    /// As [`CollRank::broadcast`].
    pub fn all_reduce_ring(&self, r: &RingAllReduce) -> Result<Duration> {
        let threads = ring_threads(self.comm.executor().kind());
        self.all_reduce_ring_by(r, 1, threads)
    }

    /// [`CollRank::all_reduce_ring`] launched with `blocks` blocks of which the threads `0 .. callers` make
    /// the call: one block and every thread is the call as it should be made; a second block, or a call behind
    /// a thread test, are mistakes the call refuses.
    ///
    /// # Errors
    /// As [`CollRank::broadcast`].
    pub fn all_reduce_ring_by(&self, r: &RingAllReduce, blocks: u32, callers: u32) -> Result<Duration> {
        let mut turn = self.turn()?;
        self.ring_args.write(0, bytemuck::bytes_of(r))?;
        self.barrier()?;
        let threads = ring_threads(self.comm.executor().kind());
        let args = (self.handle.dev_ptr(), self.ring_args.dev_ptr(), callers);
        // SAFETY: as in `broadcast`: the call uses the channels from thread 0 of one block only, and refuses a
        // launch of another shape before posting; the arguments are owned by `self` and not written during
        // the launch.
        unsafe { self.timed(&mut turn, &self.all_reduce_ring, (blocks, threads), args) }
    }
}
