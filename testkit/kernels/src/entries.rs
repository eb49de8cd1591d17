//! The project's kernels, written as a user writes theirs: `#[kernel]` functions of a device crate, built to
//! PTX by `gdaki-build` (testkit's build.rs) and launched on either executor by `gdaki::launch`.

use gdaki_device::channel::{Exclusive, PortChannel, Warp};
use gdaki_device::coll::{self, Algorithm, CollHandle};
use gdaki_device::error::AppError;
use gdaki_device::error::InvalidArgument;
use gdaki_device::grid::GridBarrier;
use gdaki_device::launch::DevPtr;
use gdaki_device::qp::Qp;
use gdaki_device::scope::{Block, Device};
use gdaki_device::shared_qp::SharedQp;
use gdaki_device::sync;
use gdaki_device::warp_qp::WarpQp;
use gdaki_device::wqe::{self, Raddr, Sge, Wqe};
use gdaki_device::{kernel, Error, Thread};
use gdaki_shared::channel::PortChannelHandle;
use gdaki_shared::handle::QpHandle;
use gdaki_shared::prm::wqe::Seg;
use gdaki_shared::Be32;

use crate::pingpong::{self, PingPongArgs, Team};
use crate::porttest::{self, PortTestArgs};
use crate::postrate::{self, PostRateArgs};
use crate::samples::{self, SampleParams, SAMPLES};

/// A block is a team: thread 0 drives the QP, every thread fills and checks payloads.
impl Team for Thread {
    fn tid(&self) -> usize {
        Thread::tid(self) as usize
    }
    fn size(&self) -> usize {
        self.block_size() as usize
    }
    fn sync_or(&self, flag: bool) -> bool {
        self.sync_threads_or(flag)
    }
}

/// Ping-pong: block `b` runs rank `b` with `args[b]` (launch 2 blocks, so that both ranks run at once).
/// `args` points to two [`PingPongArgs`] built by the host (see [`pingpong::run`]).
#[kernel]
pub fn gdaki_pingpong(t: &Thread, args: *const PingPongArgs) {
    // SAFETY: the host passes one argument block per block of the launch; `run`'s contract is the host's.
    unsafe { pingpong::run(t, &*args.add(t.block() as usize)) }
}

/// Port-channel test with sharing `M`: block `b` runs channel `b % nchannels` of the launch's rank.
///
/// # Safety
/// `args` must point to the [`PortTestArgs`] the host built for this launch.
unsafe fn port<M: gdaki_device::channel::Sharing>(t: &Thread, args: *const PortTestArgs) {
    // SAFETY: the caller's contract; `run`'s is the host's.
    unsafe {
        let n = (*args).nchannels.max(1) as u64;
        porttest::run::<M>(t, &*args, (t.block() % n) as u32)
    }
}

/// [`porttest::run`] in Exclusive sharing (thread 0 of each block owns its channel's QP); `args` as `port`.
#[kernel]
pub fn gdaki_port_exclusive(t: &Thread, args: *const PortTestArgs) {
    // SAFETY: the launch's contract.
    unsafe { port::<Exclusive>(t, args) }
}

/// [`porttest::run`] in Warp sharing (the lanes of a block of at most 32 threads, one warp, share its channel's
/// QP); `args` as `port`.
#[kernel]
pub fn gdaki_port_warp(t: &Thread, args: *const PortTestArgs) {
    // SAFETY: the launch's contract.
    unsafe { port::<Warp>(t, args) }
}

/// [`porttest::run`] in Block sharing (the threads of a block share its channel's QP).
#[kernel]
pub fn gdaki_port_block(t: &Thread, args: *const PortTestArgs) {
    // SAFETY: the launch's contract.
    unsafe { port::<Block>(t, args) }
}

/// [`porttest::run`] in Device sharing (GPU-scope atomics on the QPs).
#[kernel]
pub fn gdaki_port_device(t: &Thread, args: *const PortTestArgs) {
    // SAFETY: the launch's contract.
    unsafe { port::<Device>(t, args) }
}

/// The post-rate microbenchmark ([`postrate::run`]) in the Exclusive shape: block `b` is team `b`.
#[kernel]
pub fn gdaki_post_rate_exclusive(t: &Thread, args: &PostRateArgs) {
    // SAFETY: the host's arguments (`run`'s contract).
    unsafe { postrate::run::<{ postrate::shape::EXCLUSIVE }>(t, args, t.block() as u32) }
}

/// [`gdaki_post_rate_exclusive`] with each post rung by BlueFlame.
#[kernel]
pub fn gdaki_post_rate_blueflame(t: &Thread, args: &PostRateArgs) {
    // SAFETY: as in `gdaki_post_rate_exclusive`.
    unsafe { postrate::run::<{ postrate::shape::BLUEFLAME }>(t, args, t.block() as u32) }
}

/// The floor under [`gdaki_post_rate_exclusive`] and [`gdaki_post_rate_blueflame`]: each post's ordering alone.
#[kernel]
pub fn gdaki_post_rate_ordering(t: &Thread, args: &PostRateArgs) {
    // SAFETY: as in `gdaki_post_rate_exclusive`.
    unsafe { postrate::run::<{ postrate::shape::ORDERING }>(t, args, t.block() as u32) }
}

/// [`gdaki_post_rate_exclusive`] in the WarpPart shape (one warp per QP, some lanes without a WQE).
#[kernel]
pub fn gdaki_post_rate_warp_part(t: &Thread, args: &PostRateArgs) {
    // SAFETY: as in `gdaki_post_rate_exclusive`.
    unsafe { postrate::run::<{ postrate::shape::WARP_PART }>(t, args, t.block() as u32) }
}

/// The floor under [`gdaki_post_rate_warp`]: each warp post's WQE stores and ordering alone.
#[kernel]
pub fn gdaki_post_rate_warp_ordering(t: &Thread, args: &PostRateArgs) {
    // SAFETY: as in `gdaki_post_rate_exclusive`.
    unsafe { postrate::run::<{ postrate::shape::WARP_ORDERING }>(t, args, t.block() as u32) }
}

/// [`gdaki_post_rate_exclusive`] in the shared shape (one Device-scope QP).
#[kernel]
pub fn gdaki_post_rate_shared(t: &Thread, args: &PostRateArgs) {
    // SAFETY: as in `gdaki_post_rate_exclusive`.
    unsafe { postrate::run::<{ postrate::shape::SHARED }>(t, args, t.block() as u32) }
}

/// [`gdaki_post_rate_exclusive`] in the Batch shape (one thread per QP, `Qp::post_batch`).
#[kernel]
pub fn gdaki_post_rate_batch(t: &Thread, args: &PostRateArgs) {
    // SAFETY: as in `gdaki_post_rate_exclusive`.
    unsafe { postrate::run::<{ postrate::shape::BATCH }>(t, args, t.block() as u32) }
}

/// [`gdaki_post_rate_exclusive`] in the Warp shape (one warp per QP).
#[kernel]
pub fn gdaki_post_rate_warp(t: &Thread, args: &PostRateArgs) {
    // SAFETY: as in `gdaki_post_rate_exclusive`.
    unsafe { postrate::run::<{ postrate::shape::WARP }>(t, args, t.block() as u32) }
}

/// One Exclusive `put` on channel `h` (one thread): a kernel of its own so that its SASS is the put path alone
/// (`cargo xtask sass`). Errors are dropped: this is for reading code.
#[kernel]
pub fn gdaki_sass_put(_t: &Thread, h: &PortChannelHandle, bytes: u64) {
    // SAFETY: the launch's contract: a live channel whose QP this one thread uses.
    let _ = unsafe { PortChannel::<Exclusive>::new(h) }.put(0, 0, bytes);
}

/// `n` Exclusive `put`s of `bytes` bytes each on channel `h`, one after the other in both memories (a range
/// streamed in pieces), as [`gdaki_sass_put`]: its loop's iteration is what a put costs once the channel's
/// state is in registers (`cargo xtask sass`'s posting-loop table).
#[kernel]
pub fn gdaki_sass_put_loop(_t: &Thread, h: &PortChannelHandle, bytes: u64, n: u32) {
    // SAFETY: as in `gdaki_sass_put`.
    let mut ch = unsafe { PortChannel::<Exclusive>::new(h) };
    let mut at = 0u64;
    for _ in 0..n {
        if ch.put(at, at, bytes).is_err() {
            return;
        }
        at = at.wrapping_add(bytes);
    }
}

/// One Exclusive `put_with_signal` on channel `h`, as [`gdaki_sass_put`].
#[kernel]
pub fn gdaki_sass_put_with_signal(_t: &Thread, h: &PortChannelHandle, bytes: u64) {
    // SAFETY: as in `gdaki_sass_put`.
    let _ = unsafe { PortChannel::<Exclusive>::new(h) }.put_with_signal(0, 0, bytes);
}

/// The remote and local buffers of the `gdaki_sass_*_post` kernels' 8-byte RDMA WRITE: addresses and keys
/// (as the handles store them, big-endian).
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct SassWrite {
    /// Remote address.
    pub raddr: u64,
    /// Local address.
    pub laddr: u64,
    /// Remote key.
    pub rkey: Be32,
    /// Local key.
    pub lkey: Be32,
}

/// The WQE of `a`.
fn sass_write(a: &SassWrite) -> Option<Wqe<3>> {
    let r = Raddr { addr: a.raddr, rkey: a.rkey };
    Some(wqe::rdma_write(r, Sge::new(a.laddr, 8, a.lkey).ok()?))
}

/// One Exclusive [`Qp::post`] of an 8-byte RDMA WRITE and its [`Qp::ring_db`] on the QP `h` (one thread), as
/// [`gdaki_sass_put`]: the raw post path, without the channel's checks.
#[kernel]
pub fn gdaki_sass_qp_post(_t: &Thread, h: *mut QpHandle, a: &SassWrite) {
    let Some(w) = sass_write(a) else { return };
    // SAFETY: the launch's contract: a live QP that this one thread uses.
    let mut qp = unsafe { Qp::new(&mut *h, 1 << 30) };
    let _ = qp.post(false, w);
    qp.ring_db();
}

/// `n` Exclusive 8-byte RDMA WRITEs on the QP `h` by one [`Qp::post_batch`] and one [`Qp::ring_db`].
#[kernel]
pub fn gdaki_sass_qp_post_batch(_t: &Thread, h: *mut QpHandle, a: &SassWrite, n: u32) {
    let Some(w) = sass_write(a) else { return };
    // SAFETY: as in `gdaki_sass_qp_post`.
    let mut qp = unsafe { Qp::new(&mut *h, 1 << 30) };
    if qp.post_batch(n, false, |_| w).is_err() {
        return;
    }
    qp.ring_db();
}

/// `n` Exclusive [`Qp::post`]s of an 8-byte RDMA WRITE on the QP `h`, each rung by [`Qp::ring_db`], from one
/// `Qp`: the loop a user's kernel runs, whose body is the cost of one post in steady state (the counters in
/// registers, the handle read once before it and written once after it).
#[kernel]
pub fn gdaki_sass_qp_post_loop(_t: &Thread, h: *mut QpHandle, a: &SassWrite, n: u32) {
    let Some(w) = sass_write(a) else { return };
    // SAFETY: as in `gdaki_sass_qp_post`.
    let mut qp = unsafe { Qp::new(&mut *h, 1 << 30) };
    for _ in 0..n {
        if qp.post(false, w).is_err() {
            return;
        }
        qp.ring_db();
    }
}

/// One Exclusive [`Qp::post_bf`] of an 8-byte RDMA WRITE on the QP `h`, as [`gdaki_sass_qp_post`].
#[kernel]
pub fn gdaki_sass_qp_post_bf(_t: &Thread, h: *mut QpHandle, a: &SassWrite) {
    let Some(w) = sass_write(a) else { return };
    // SAFETY: as in `gdaki_sass_qp_post`.
    let _ = unsafe { Qp::new(&mut *h, 1 << 30) }.post_bf(false, w);
}

/// One [`WarpQp::post`] of an 8-byte RDMA WRITE per lane on the QP `h` (one warp), as [`gdaki_sass_qp_post`].
#[kernel]
pub fn gdaki_sass_warp_post(_t: &Thread, h: *mut QpHandle, a: &SassWrite) {
    let Some(w) = sass_write(a) else { return };
    // SAFETY: the launch's contract: a live QP that this one warp uses, its lanes together.
    let _ = unsafe { WarpQp::new(h, 1 << 30) }.post(false, w);
}

/// One [`WarpQp::post_some`] of an 8-byte RDMA WRITE by lanes `0 .. lanes` of the warp (the others pass none)
/// on the QP `h`, as [`gdaki_sass_warp_post`]: a batch that not every lane fills (a range in fewer pieces than
/// lanes, a lone signal).
#[kernel]
pub fn gdaki_sass_warp_post_some(t: &Thread, h: *mut QpHandle, a: &SassWrite, lanes: u32) {
    let Some(w) = sass_write(a) else { return };
    // SAFETY: the launch's contract: a live QP that this one warp uses, its lanes together.
    let _ = unsafe { WarpQp::new(h, 1 << 30) }.post_some(false, (t.lane() < lanes).then_some(w));
}

/// One Device-scope [`SharedQp::post`] of an 8-byte RDMA WRITE on the QP `h`, as [`gdaki_sass_qp_post`].
#[kernel]
pub fn gdaki_sass_shared_post(_t: &Thread, h: *mut QpHandle, a: &SassWrite) {
    let Some(w) = sass_write(a) else { return };
    // SAFETY: the launch's contract: a live QP whose every poster is a Device-scope shared poster.
    let _ = unsafe { SharedQp::<Device>::new(h, 1 << 30) }.post(true, w);
}

/// Builds [`SAMPLES`] WQEs from `*p` into `out` (one thread; see [`samples::build`]).
#[kernel]
pub fn gdaki_wqe_samples(_t: &Thread, p: &SampleParams, out: *mut [[Seg; gdaki_device::wqe::MAX_DS]; SAMPLES]) {
    // SAFETY: the launch passes room for every sample.
    unsafe { samples::build(p, &mut *out) }
}

/// `rounds` rounds of a grid-wide barrier ([`GridBarrier`] on `counter`, zero at the start): each round every
/// thread stores the round's number in its slot of `slots` (one `u64` per thread of the launch, in GPU memory on
/// the GPU), passes the barrier, reads the slots of the same thread in up to eight other CTAs (each must hold the
/// round: a stale one is `AppError { code: 1, value: its index }`), and passes the barrier again.
#[kernel]
pub fn gdaki_grid_rounds(
    t: &Thread,
    counter: DevPtr<u64>,
    slots: *mut u64,
    rounds: u32,
    timeout_ns: u64,
) -> gdaki_device::Result<()> {
    let threads = t.grid_dim().count() * u64::from(t.block_size());
    let me = t.global_id();
    // SAFETY: the launch's zeroed counter, used by this launch's barriers only.
    let mut barrier = unsafe { GridBarrier::new(t, counter, timeout_ns) };
    for r in 1..=u64::from(rounds) {
        // SAFETY: the launch passes one slot per thread of the launch.
        unsafe { sync::store_volatile(slots.add(me as usize), r) };
        barrier.wait(t)?;
        for k in 1..=t.grid_dim().count().saturating_sub(1).min(8) {
            let other = (me + k * u64::from(t.block_size())) % threads;
            // SAFETY: as above.
            if unsafe { sync::load_volatile(slots.add(other as usize)) } != r {
                return Err(Error::App(AppError { code: 1, value: other }));
            }
        }
        barrier.wait(t)?;
    }
    Ok(())
}

/// Writes 1 to `*flag` from thread 0: proves a module loads and a kernel runs.
#[kernel]
pub fn gdaki_smoke(t: &Thread, flag: *mut u32) {
    if t.tid() == 0 {
        // SAFETY: the launch passes a writable `u32`.
        unsafe { core::ptr::write_volatile(flag, 1) }
    }
}

/// Writes the sum of `v` to `*out` from thread 0: an array parameter by value (a `.param` byte array in PTX).
#[kernel]
pub fn gdaki_array_sum(t: &Thread, out: *mut u64, v: [u64; 4]) {
    if t.global_id() == 0 {
        // SAFETY: the launch passes a writable `u64`.
        unsafe { core::ptr::write_volatile(out, v.iter().fold(0u64, |a, x| a.wrapping_add(*x))) }
    }
}

/// The platform floor of every emulated-NIC path: thread 0 answers `iters` pings through host-visible memory.
/// `flags[0]` is the ping the host raises to `k`, `flags[1]` the pong thread 0 then sets to `k`, for
/// `k = 1..=iters`; each wait is bounded by `timeout_ns`.
#[kernel]
pub fn gdaki_flag_echo(t: &Thread, flags: *mut u64, iters: u32, timeout_ns: u64) -> gdaki_device::Result<()> {
    if t.global_id() != 0 {
        return Ok(());
    }
    for k in 1..=iters as u64 {
        // SAFETY: the launch passes two 8-byte-aligned words of mapped memory that live for the whole launch.
        unsafe {
            gdaki_device::wait::semaphore_ge(flags, k, timeout_ns)?;
            gdaki_device::sync::store_release_u64(flags.add(1), k);
        }
    }
    Ok(())
}

/// One [`coll::broadcast`] by thread 0 of the launch (the others return at once): `algorithm` is an
/// [`Algorithm`] code, `chunk` 0 for [`coll::default_chunk`]; the other arguments as [`coll::Broadcast`].
#[kernel]
pub fn gdaki_coll_broadcast(
    t: &Thread,
    h: &CollHandle,
    algorithm: u32,
    root: u32,
    offset: u64,
    bytes: u64,
    chunk: u64,
) -> gdaki_device::Result<()> {
    if t.global_id() != 0 {
        return Ok(());
    }
    let algorithm = Algorithm::from_code(algorithm).ok_or(Error::InvalidArgument(InvalidArgument::Collective))?;
    // SAFETY: the launch's contract: `h` is this rank's live handle, its channels used by this thread only.
    unsafe { coll::broadcast(h, &coll::Broadcast { root, offset, bytes, chunk, algorithm }) }
}

/// One [`coll::all_to_all_v`] by thread 0 of the launch: `send_counts` and `recv_counts` point to
/// [`coll::MAX_RANKS`] `u64`s each (the first `nranks` used); the offsets as [`coll::AllToAllV`].
#[kernel]
pub fn gdaki_coll_all_to_all_v(
    t: &Thread,
    h: &CollHandle,
    send_counts: *const u64,
    recv_counts: *mut u64,
    send_offset: u64,
    recv_offset: u64,
) -> gdaki_device::Result<()> {
    if t.global_id() != 0 {
        return Ok(());
    }
    // SAFETY: the launch's contract: two arrays of MAX_RANKS words, the second used by this thread only.
    let (send, recv) = unsafe {
        (
            core::slice::from_raw_parts(send_counts, coll::MAX_RANKS),
            core::slice::from_raw_parts_mut(recv_counts, coll::MAX_RANKS),
        )
    };
    // SAFETY: as in `gdaki_coll_broadcast`.
    unsafe { coll::all_to_all_v(h, &coll::AllToAllV { send_offset, recv_offset }, send, recv) }
}

/// One [`coll::reduce`] by thread 0 of the launch; the arguments as [`coll::Reduce`].
#[kernel]
#[allow(clippy::too_many_arguments)]
pub fn gdaki_coll_reduce(
    t: &Thread,
    h: &CollHandle,
    root: u32,
    offset: u64,
    count: u64,
    acc_offset: u64,
    out_offset: u64,
    max_abs: f32,
) -> gdaki_device::Result<()> {
    if t.global_id() != 0 {
        return Ok(());
    }
    // SAFETY: as in `gdaki_coll_broadcast`.
    unsafe { coll::reduce(h, &coll::Reduce { root, offset, count, acc_offset, out_offset, max_abs }) }
}

/// One [`coll::all_reduce`] by thread 0 of the launch, broadcasting with the [`Algorithm`] of code
/// `algorithm`; the other arguments as [`coll::Reduce`].
#[kernel]
#[allow(clippy::too_many_arguments)]
pub fn gdaki_coll_all_reduce(
    t: &Thread,
    h: &CollHandle,
    algorithm: u32,
    root: u32,
    offset: u64,
    count: u64,
    acc_offset: u64,
    out_offset: u64,
    max_abs: f32,
) -> gdaki_device::Result<()> {
    if t.global_id() != 0 {
        return Ok(());
    }
    let algorithm = Algorithm::from_code(algorithm).ok_or(Error::InvalidArgument(InvalidArgument::Collective))?;
    let r = coll::Reduce { root, offset, count, acc_offset, out_offset, max_abs };
    // SAFETY: as in `gdaki_coll_broadcast`.
    unsafe { coll::all_reduce(h, &r, algorithm) }
}

/// One [`coll::all_reduce_ring`] by the threads `0 .. callers` of each block (all of them, in a launch of one
/// block, is the call as it should be made; fewer, or more blocks, are the mistakes it refuses): thread 0
/// posts and waits, every thread adds. `r` as [`coll::RingAllReduce`]; thread 0 returns the call's error (the
/// others' `Team` only repeats that it failed).
#[kernel]
pub fn gdaki_coll_all_reduce_ring(
    t: &Thread,
    h: &CollHandle,
    r: &coll::RingAllReduce,
    callers: u32,
) -> gdaki_device::Result<()> {
    if t.tid() >= callers {
        return Ok(());
    }
    // SAFETY: the launch's contract: `h` is this rank's live handle, its channels used by this call only; a
    // launch that breaks the call's shape (threads that return, a second block) is refused before any post.
    let res = unsafe { coll::all_reduce_ring(h, r, t) };
    if t.tid() == 0 {
        res
    } else {
        Ok(())
    }
}
