//! Counters the executor keeps, and the snapshot tests and diagnostics read.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// What the emulated NIC has seen and done since it was opened (all QPs together). A snapshot: counters are
/// read one by one, so a snapshot taken while WQEs run may mix moments. A CQE is counted by the NIC's thread
/// just after it writes it, or just after it queues it behind the data it reports (queues in GPU memory):
/// the CQE counts may trail the CQEs software has polled, or lead the ones it can see.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Doorbell register changes acted on (8-byte doorbells and BlueFlame writes alike).
    pub doorbells: u64,
    /// BlueFlame writes whose WQE the NIC took from the register (see the [`emu`](super) module docs).
    pub blueflame: u64,
    /// Doorbells after which the BlueFlame register held words written since the NIC last looked that were
    /// not a whole write of the announced WQE (a torn write, words a later doorbell overtook, an untagged
    /// write): the WQEs were read from the ring.
    pub blueflame_fallbacks: u64,
    /// BlueFlame WQEs that differed from the ring's copy (compared for rings in host memory only); the
    /// register's was executed, as on hardware.
    pub blueflame_mismatches: u64,
    /// Times the NIC fetched a range of an SQ ring in GPU memory (one copy and one synchronize each, with the
    /// dbrec).
    pub ring_fetches: u64,
    /// Nanoseconds the NIC's thread spent in those fetches, waiting for the GPU.
    pub ring_fetch_ns: u64,
    /// Times the NIC took a rung range of an SQ ring in GPU memory from the ring's mirror in host memory
    /// instead (the GPU copier copies each batch of WQEBBs there as the dbrec passes it; see
    /// `GpuCopier::mirror_sq`).
    pub ring_mirrored: u64,
    /// Nanoseconds the NIC's thread spent waiting for a ring's mirror to cover a rung range (the doorbell
    /// reached the NIC before the mirror's copy did).
    pub ring_mirror_wait_ns: u64,
    /// Nanoseconds the NIC's thread spent in passes that found work: from the pass's start to the GPU submit
    /// of what it enqueued (taking doorbells, reading and validating WQEs, enqueuing their data movement,
    /// handling wire messages), mirror and host waits included.
    pub busy_ns: u64,
    /// Times the NIC's thread waited for every GPU operation it had enqueued (a ring fetch, an atomic whose
    /// old value it needs, a READ, an access to host memory behind GPU writes of the same QP): on the `gpu`
    /// executor, the host synchronizes of the emulated data path. 0 with no GPU.
    pub host_syncs: u64,
    /// Nanoseconds spent in those waits (ring fetches included).
    pub host_sync_ns: u64,
    /// Doorbells whose producer index was behind the NIC's (e.g. two posters' doorbells landing out of order);
    /// ignored, as hardware ignores them.
    pub stale_doorbells: u64,
    /// Doorbells that announced more WQEBBs than the ring holds, or named another QP (the QP moved to the error
    /// state).
    pub bad_doorbells: u64,
    /// Doorbells whose dbrec SQ counter (word 1) was behind the doorbell's producer index: the dbrec was not
    /// written, or written to the wrong word.
    pub dbrec_mismatches: u64,
    /// WQEs executed successfully (NOPs included).
    pub wqes: u64,
    /// Successful CQEs written or queued (requester and responder).
    pub cqes: u64,
    /// Error CQEs written for failed WQEs (flushes not included).
    pub error_cqes: u64,
    /// Flush error CQEs (syndrome 0x05) written for WQEs posted to a QP in the error state.
    pub flush_cqes: u64,
    /// CQ overruns: a CQE was due but software had not consumed the entry (the CQ and QP moved to error).
    pub cq_overruns: u64,
    /// Bytes the wire's inbound queue (reader threads → executor) holds now, each frame counted as its length
    /// plus 64; at most [`WireConfig::inbound_bytes`](super::WireConfig::inbound_bytes) (or one frame).
    pub inbound_queued: u64,
    /// Most bytes the inbound queue held at once (as [`Stats::inbound_queued`]).
    pub inbound_peak: u64,
    /// Times a reader thread found the inbound queue full and waited, leaving its peer's bytes in the socket.
    pub inbound_waits: u64,
    /// WRITE pieces this NIC's requesters sent as references to their GPU memory, for the peer process to
    /// copy itself (the wire's same-host path, [`WireConfig::gpu_ipc`](super::WireConfig::gpu_ipc)).
    pub ipc_pieces: u64,
    /// Bytes of [`Stats::ipc_pieces`].
    pub ipc_bytes: u64,
    /// Offers of peers' allocations for that path that this NIC answered as mapped (one per offering QP).
    pub ipc_mapped: u64,
    /// Passes the NIC's thread has made through its loop (inbound messages, then every QP's doorbells and
    /// wire state): a count that stops growing while work waits says the thread is stuck, and
    /// [`Stats::executor_step`] says where.
    pub executor_passes: u64,
    /// What the NIC's thread was doing when the snapshot was taken: one of [`Stats::EXECUTOR_STEPS`].
    pub executor_step: &'static str,
}

impl Stats {
    /// The steps of the NIC thread's pass, as [`Stats::executor_step`] names them: between passes (idle or
    /// backing off), taking the QP list's changes, handling inbound wire messages, polling the SQs'
    /// doorbells and executing their WQEs, advancing the wire's requesters (retries, timeouts, outboxes),
    /// starting the GPU operations the pass enqueued.
    pub const EXECUTOR_STEPS: [&'static str; 6] =
        ["between passes", "QP list", "inbound", "send queues", "wire", "GPU submit"];
}

/// The live counters behind [`Stats`].
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub doorbells: AtomicU64,
    pub blueflame: AtomicU64,
    pub blueflame_fallbacks: AtomicU64,
    pub blueflame_mismatches: AtomicU64,
    pub ring_fetches: AtomicU64,
    pub ring_fetch_ns: AtomicU64,
    pub ring_mirrored: AtomicU64,
    pub ring_mirror_wait_ns: AtomicU64,
    pub busy_ns: AtomicU64,
    pub host_syncs: AtomicU64,
    pub host_sync_ns: AtomicU64,
    pub stale_doorbells: AtomicU64,
    pub bad_doorbells: AtomicU64,
    pub dbrec_mismatches: AtomicU64,
    pub wqes: AtomicU64,
    pub cqes: AtomicU64,
    pub error_cqes: AtomicU64,
    pub flush_cqes: AtomicU64,
    pub cq_overruns: AtomicU64,
    pub ipc_pieces: AtomicU64,
    pub ipc_bytes: AtomicU64,
    pub ipc_mapped: AtomicU64,
    pub executor_passes: AtomicU64,
    /// Index into [`Stats::EXECUTOR_STEPS`].
    pub executor_step: std::sync::atomic::AtomicU8,
}

/// Records that the NIC's thread enters step `i` of [`Stats::EXECUTOR_STEPS`] (relaxed: for diagnostics).
pub(crate) fn step(c: &Counters, i: u8) {
    c.executor_step.store(i, Relaxed);
}

/// Adds `d` in nanoseconds to a counter (relaxed, as [`bump`]).
pub(crate) fn add_ns(c: &AtomicU64, d: std::time::Duration) {
    c.fetch_add(d.as_nanos() as u64, Relaxed);
}

/// Adds one to a counter (relaxed: counters order nothing).
pub(crate) fn bump(c: &AtomicU64) {
    c.fetch_add(1, Relaxed);
}

impl Counters {
    pub(crate) fn snapshot(&self) -> Stats {
        Stats {
            doorbells: self.doorbells.load(Relaxed),
            blueflame: self.blueflame.load(Relaxed),
            blueflame_fallbacks: self.blueflame_fallbacks.load(Relaxed),
            blueflame_mismatches: self.blueflame_mismatches.load(Relaxed),
            ring_fetches: self.ring_fetches.load(Relaxed),
            ring_fetch_ns: self.ring_fetch_ns.load(Relaxed),
            ring_mirrored: self.ring_mirrored.load(Relaxed),
            ring_mirror_wait_ns: self.ring_mirror_wait_ns.load(Relaxed),
            busy_ns: self.busy_ns.load(Relaxed),
            host_syncs: self.host_syncs.load(Relaxed),
            host_sync_ns: self.host_sync_ns.load(Relaxed),
            stale_doorbells: self.stale_doorbells.load(Relaxed),
            bad_doorbells: self.bad_doorbells.load(Relaxed),
            dbrec_mismatches: self.dbrec_mismatches.load(Relaxed),
            wqes: self.wqes.load(Relaxed),
            cqes: self.cqes.load(Relaxed),
            error_cqes: self.error_cqes.load(Relaxed),
            flush_cqes: self.flush_cqes.load(Relaxed),
            cq_overruns: self.cq_overruns.load(Relaxed),
            inbound_queued: 0,
            inbound_peak: 0,
            inbound_waits: 0,
            ipc_pieces: self.ipc_pieces.load(Relaxed),
            ipc_bytes: self.ipc_bytes.load(Relaxed),
            ipc_mapped: self.ipc_mapped.load(Relaxed),
            executor_passes: self.executor_passes.load(Relaxed),
            executor_step: Stats::EXECUTOR_STEPS
                .get(usize::from(self.executor_step.load(Relaxed)))
                .copied()
                .unwrap_or("between passes"),
        }
    }
}
