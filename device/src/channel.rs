//! MSCCL++'s PortChannel device API on a [`PortChannelHandle`]: `put`, `signal`, `put_with_signal`,
//! `put_with_accumulate`, `flush`, `wait` and `poll`, with every wait bounded.
//!
//! In Device mode (MSCCL++'s GPUNetIO backend) a channel posts through a [`Poster`]: a [`Qp`] (Exclusive: one
//! thread owns the QP; BlueFlame, from registers, for puts up to the handle's `blue_flame_limit`), a [`WarpQp`]
//! ([`Warp`]: the lanes of one warp post together, one WQE per lane and one doorbell per call) or a
//! [`SharedQp`] of [`Block`] or [`Device`] scope (any number of threads, and channels, share the QP). The
//! sharing mode is the poster's type, so it is chosen at compile time: `PortChannel::<Exclusive>::new(h)`.
//! Every poster keeps the QP's one send-queue state (see [`Sharing`]), so channels of one connection may use
//! different modes kernel after kernel. In the Host modes (the handle's `proxy` field) the same calls push triggers into the proxy's FIFO instead
//! ([`crate::fifo`]), and `flush` waits for the proxy.
//!
//! Signals are RDMA fetch-adds of 1 on the peer's inbound semaphore; the NIC applies them after every earlier
//! WRITE of the QP, so a peer that sees the new value sees the data. The fetch-add's old value lands in the
//! QP's scratch word, never in user memory. (In HostNoAtomic the proxy sends a signal as an RDMA WRITE of the
//! new count instead.)

use crate::error::{CqeError, Error, InvalidArgument, PeerGone, Result, WaitOn};
use crate::fifo;
use crate::onesided::{atomic_target, remote};
use crate::qp::Qp;
use crate::scope::Scope;
/// The shared sharing modes, also scopes of [`SharedQp`]: `PortChannel::<Block>` and `PortChannel::<Device>`
/// take them from here as `PortChannel::<Exclusive>` takes [`Exclusive`].
pub use crate::scope::{Block, Device};
use crate::shared_qp::SharedQp;
use crate::sync;
use crate::thread::{CtaGroup, WARP_SIZE};
use crate::wait::{bounded_watching, Watch};
use crate::warp_qp::WarpQp;
use crate::wqe::{self, Raddr, Sge, Wqe};
pub use gdaki_shared::channel::PortChannelHandle;
use gdaki_shared::channel::DEPARTED_BROKEN;
use gdaki_shared::handle::QpHandle;
use gdaki_shared::proxy::{mode, Trigger};

/// Largest payload of one RDMA WRITE the device code builds: a data segment's `byte_count` of 0 would mean
/// 2^31, so one less.
const MAX_WRITE: u64 = wqe::MAX_SGE_LEN as u64;

/// Bytes an RDMA atomic moves: what [`PortChannelHandle::blue_flame_limit`] is compared with for a signal.
const ATOMIC_BYTES: u64 = 8;

/// What a channel posts through. Two real implementations: the Exclusive [`Qp`] and the shared [`SharedQp`].
pub trait Poster {
    /// Posts a WQE that may wait for a later doorbell (Exclusive: until [`Poster::submit`] or a wait; shared
    /// scopes ring at once).
    ///
    /// # Errors
    /// As [`Qp::post`] / [`SharedQp::post`].
    fn stage<const N: usize>(&mut self, w: Wqe<N>) -> Result<()>;

    /// Posts a WQE and rings for it and every staged one; by BlueFlame when `bf` is set and the poster can.
    /// With `signaled` it asks for a CQE (shared posters always do), so that a later flush need not post a
    /// NOP to get one.
    ///
    /// # Errors
    /// As [`Poster::stage`].
    fn submit<const N: usize>(&mut self, bf: bool, signaled: bool, w: Wqe<N>) -> Result<()>;

    /// Posts the WQEs of one team call ([`PortChannel::put_team`]): `w` is the calling member's (`Ok(None)`:
    /// none; `Err`: refused while it was built), `key` its channel's, the same for every member (the shared
    /// posters check it with the leader's, [`SharedQp::post_team_keyed`]). The shared posters batch the members' WQEs into one
    /// reservation, one CQE and one doorbell ([`SharedQp::post_team`]); the Exclusive and Warp posters post
    /// the caller's own WQE as [`Poster::submit`] does (unsignaled, no BlueFlame) and use no barrier of `g`.
    ///
    /// # Errors
    /// As [`SharedQp::post_team`] / [`Poster::submit`]; the caller's own `Err` as it is; for the Warp poster,
    /// [`InvalidArgument::TeamRules`] when `g` has more members than a warp has lanes.
    fn submit_team<const N: usize>(&mut self, g: &impl CtaGroup, key: u64, w: Result<Option<Wqe<N>>>) -> Result<()>;

    /// Waits until every WQE posted so far has completed.
    ///
    /// # Errors
    /// The QP's first error CQE (sticky); a timeout; an unexpected CQE.
    fn flush(&mut self) -> Result<()>;

    /// The QP's first error CQE, if any.
    fn error(&self) -> Option<CqeError>;

    /// Looks at the CQ once without waiting, so that an error CQE becomes visible to [`Poster::error`]; rings
    /// staged WQEs first.
    ///
    /// # Errors
    /// An unexpected CQE.
    fn progress(&mut self) -> Result<()>;

    /// Rings the doorbell for staged WQEs, if any (only the Exclusive poster stages: the others ring at once).
    #[inline(always)]
    fn ring(&mut self) {}

    /// Whether a try of a wait for a peer's signal looks at the CQ ([`crate::wait::bounded_watching`]): the
    /// Exclusive poster skips [`Watch::IfDue`] tries once no CQE of its own is due; the others look on them
    /// (a shared QP's CQEs may be any member's).
    #[inline(always)]
    fn looks(&self, watch: Watch) -> bool {
        watch != Watch::Skip
    }
}

impl Poster for Qp<'_> {
    #[inline(always)]
    fn stage<const N: usize>(&mut self, w: Wqe<N>) -> Result<()> {
        self.post(false, w).map(|_| ())
    }

    #[inline(always)]
    fn submit<const N: usize>(&mut self, bf: bool, signaled: bool, w: Wqe<N>) -> Result<()> {
        if bf {
            return self.post_bf(signaled, w).map(|_| ());
        }
        let _ticket = self.post(signaled, w)?;
        self.ring_db();
        Ok(())
    }

    #[inline(always)]
    fn submit_team<const N: usize>(&mut self, _g: &impl CtaGroup, _key: u64, w: Result<Option<Wqe<N>>>) -> Result<()> {
        w?.map_or(Ok(()), |w| Poster::submit(self, false, false, w))
    }

    fn flush(&mut self) -> Result<()> {
        Qp::flush(self)
    }

    fn error(&self) -> Option<CqeError> {
        Qp::error(self)
    }

    fn progress(&mut self) -> Result<()> {
        Qp::progress(self)
    }

    #[inline(always)]
    fn ring(&mut self) {
        self.ring_db();
    }

    #[inline(always)]
    fn looks(&self, watch: Watch) -> bool {
        Qp::looks(self, watch)
    }
}

/// A warp's poster: every call posts one WQE per calling lane and rings once ([`WarpQp::post`]); nothing is
/// staged across calls, and never by BlueFlame (a doorbell's single WQE only).
impl Poster for WarpQp<'_> {
    #[inline(always)]
    fn stage<const N: usize>(&mut self, w: Wqe<N>) -> Result<()> {
        self.post(false, w).map(|_| ())
    }

    #[inline(always)]
    fn submit<const N: usize>(&mut self, _bf: bool, signaled: bool, w: Wqe<N>) -> Result<()> {
        self.post(signaled, w).map(|_| ())
    }

    #[inline(always)]
    fn submit_team<const N: usize>(&mut self, g: &impl CtaGroup, _key: u64, w: Result<Option<Wqe<N>>>) -> Result<()> {
        // The team is the CTA and its members share one channel: on the GPU a CTA of more than one warp would
        // have a leader (and counters) per warp on one QP. Refused alike on host threads, where each thread's
        // turn would hide it, so that a test on the cpu executor fails as the GPU would.
        if g.members() > WARP_SIZE {
            return Err(Error::InvalidArgument(InvalidArgument::TeamRules));
        }
        #[cfg(not(target_arch = "nvptx64"))]
        if let Ok(Some(piece)) = &w {
            self.check_team_piece(g.rank(), piece)?;
        }
        // Every lane makes the call, with a WQE or without ([`WarpQp::post_some`]).
        self.post_some(false, w?).map(|_| ())
    }

    fn flush(&mut self) -> Result<()> {
        WarpQp::flush(self)
    }

    fn error(&self) -> Option<CqeError> {
        WarpQp::error(self)
    }

    fn progress(&mut self) -> Result<()> {
        WarpQp::progress(self)
    }
}

impl<S: Scope> Poster for SharedQp<'_, S> {
    #[inline(always)]
    fn stage<const N: usize>(&mut self, w: Wqe<N>) -> Result<()> {
        self.post(false, w).map(|_| ())
    }

    #[inline(always)]
    fn submit<const N: usize>(&mut self, _bf: bool, signaled: bool, w: Wqe<N>) -> Result<()> {
        self.post(signaled, w).map(|_| ())
    }

    #[inline(always)]
    fn submit_team<const N: usize>(&mut self, g: &impl CtaGroup, key: u64, w: Result<Option<Wqe<N>>>) -> Result<()> {
        self.post_team_keyed(g, key, w).map(|_| ())
    }

    fn flush(&mut self) -> Result<()> {
        SharedQp::flush(self)
    }

    fn error(&self) -> Option<CqeError> {
        SharedQp::error(self)
    }

    fn progress(&mut self) -> Result<()> {
        SharedQp::progress(self).map(|_| ())
    }
}

/// How the threads of a launch share a channel's QP, chosen at compile time: [`Exclusive`] (one thread per QP),
/// [`Warp`] (the lanes of one warp, together), [`Block`] (the threads of one CTA) or [`Device`] (any thread).
/// Four real implementations; sealed.
///
/// Every mode keeps the SQ counters in the one [`SqState`](gdaki_shared::handle::SqState) of the QP's handle
/// and keeps every word the others read, so modes may follow each other on a QP kernel after kernel (a
/// channel of another mode in a later kernel on the same connection, say: Exclusive, then Device, then Warp),
/// never run at the same time.
pub trait Sharing: sealed::Sealed {
    /// The poster each posting thread uses.
    type Poster<'a>: Poster;
    /// Whether several threads post (Warp, Block, Device) rather than one (Exclusive).
    const SHARED: bool;
    /// Whether the members make a team's calls together (Warp: the lanes of one warp, one batch for all of
    /// them), so that a WQE that one member posts for the team (a block put's signal) is posted in a call of
    /// all of them, the others passing none.
    const TOGETHER: bool;
    /// A poster on `h`'s QP for the calling thread.
    ///
    /// # Safety
    /// `h` must be a live channel (see [`PortChannel::new`]). Exclusive: no other poster of the QP, in this
    /// thread or another, lives while this one does. Block / Device: every user of the QP meanwhile is a shared
    /// poster of this scope.
    unsafe fn poster<'a>(h: &'a PortChannelHandle) -> Self::Poster<'a>;
}

mod sealed {
    /// Only this crate's sharing modes implement [`super::Sharing`].
    pub trait Sealed {}
    impl Sealed for super::Exclusive {}
    impl Sealed for super::Warp {}
    impl Sealed for super::Block {}
    impl Sealed for super::Device {}
}

/// One thread owns the QP: no atomics on the SQ counters, BlueFlame for puts up to the channel's
/// `blue_flame_limit`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Exclusive;

impl Sharing for Exclusive {
    type Poster<'a> = Qp<'a>;
    const SHARED: bool = false;
    const TOGETHER: bool = false;
    unsafe fn poster<'a>(h: &'a PortChannelHandle) -> Qp<'a> {
        // SAFETY: the caller's contract: `h.qp` is the QP's handle, used by this thread only.
        unsafe { Qp::new(&mut *(h.qp as *mut QpHandle), h.timeout_ns) }
    }
}

/// One warp owns the QP (DOCA GPUNetIO's `put_warp` on an EXCLUSIVE QP): the lanes that call a channel
/// operation together post one WQE each and ring one doorbell; no atomics, no BlueFlame. Every lane of the
/// warp makes its own `PortChannel::<Warp>` of the handle; each later call that posts or flushes is made by
/// the lanes that take part in it, together, the lowest lane that made the channel always among them (see
/// [`WarpQp::new`]): the whole warp for a put of 32 pieces, lane 0 alone for a signal. `wait` and `poll`
/// count once for each lane that calls them, as in every mode. On the host a thread is a warp of one lane.
/// A team call ([`PortChannel::put_team`], [`PortChannel::put_block`]) takes a CTA of at most one warp
/// ([`WARP_SIZE`] threads); a larger one is refused on both executors. A handle used by more than one warp
/// of a launch (the warps of a larger CTA, or CTAs of one warp each) would have a leader per warp on the GPU,
/// whose WQEs overwrite one another's; nothing checks that there, and the `cpu` executor, whose threads would
/// take turns on the QP, refuses the calls of every warp but the first to post with
/// [`InvalidArgument::Sharing`], so that a test there fails.
#[derive(Clone, Copy, Debug, Default)]
pub struct Warp;

impl Sharing for Warp {
    type Poster<'a> = WarpQp<'a>;
    const SHARED: bool = true;
    const TOGETHER: bool = true;
    unsafe fn poster<'a>(h: &'a PortChannelHandle) -> WarpQp<'a> {
        // SAFETY: the caller's contract: `h.qp` is the QP's handle, used by this warp's lanes only (those that
        // make their channels of it together).
        unsafe { WarpQp::new(h.qp as *mut QpHandle, h.timeout_ns) }
    }
}

macro_rules! shared_sharing {
    ($t:ty) => {
        impl Sharing for $t {
            type Poster<'a> = SharedQp<'a, $t>;
            const SHARED: bool = true;
            const TOGETHER: bool = false;
            unsafe fn poster<'a>(h: &'a PortChannelHandle) -> SharedQp<'a, $t> {
                // SAFETY: the caller's contract: `h.qp` is the QP's handle, used by shared posters of this scope
                // only.
                unsafe { SharedQp::new(h.qp as *mut QpHandle, h.timeout_ns) }
            }
        }
    };
}

shared_sharing!(Block);
shared_sharing!(Device);

/// One port channel in sharing mode `M`, used by one thread at a time (in Block and Device sharing, several
/// threads may each hold a `PortChannel` of the same handle).
pub struct PortChannel<'h, M: Sharing> {
    h: &'h PortChannelHandle,
    qp: M::Poster<'h>,
}

impl<'h, M: Sharing> PortChannel<'h, M> {
    /// The channel `h` for the calling thread: `let mut ch = unsafe { PortChannel::<Exclusive>::new(h) };`.
    ///
    /// # Safety
    /// `h` must come from the host's `PortChannel::device_handle` for a live channel (its QP, memory handles,
    /// semaphore words, `expected` word and, when not 0, `departed` word valid for `'h`), set up for this sharing mode: in Exclusive sharing
    /// no other poster of the QP lives while this channel does, in this thread or another (two Exclusive
    /// channels of one connection, each with its own memory pair, are two posters: each keeps its own producer
    /// index, and both would write the same WQEBBs; drop one before taking the other: the `cpu` executor
    /// refuses both's calls with [`InvalidArgument::Posters`] while both live, see [`Qp::new`]); in Block / Device
    /// sharing every user of the QP meanwhile is a channel (or [`SharedQp`]) of this scope. A zeroed handle
    /// (`PortChannelHandle::default()`, say the own rank's slot of a per-peer array) names no channel: nothing
    /// checks it, and a channel made of it reads address 0: an illegal-address fault on the GPU (the context
    /// is lost), a segmentation fault of the process on the `cpu` executor.
    #[inline(always)]
    pub unsafe fn new(h: &'h PortChannelHandle) -> Self {
        // SAFETY: the caller's contract is the poster's.
        Self { h, qp: unsafe { M::poster(h) } }
    }

    /// The channel's handle.
    pub fn handle(&self) -> &'h PortChannelHandle {
        self.h
    }

    /// The poster, e.g. to flush the QP once for several channels, or in Exclusive sharing the channel's
    /// [`Qp`] for what the channel's calls do not cover ([`Qp::post_batch`], any builder of [`crate::wqe`]),
    /// with the addresses and keys of the channel's handle (`dst`, `src`, `remote_sem`).
    pub fn poster(&mut self) -> &mut M::Poster<'h> {
        &mut self.qp
    }

    /// Stages the RDMA WRITEs of `bytes` bytes from `src + src_offset` to `dst + dst_offset`, split into
    /// WQEs of at most `max_wqe_bytes`; the last one is submitted when `last` is set.
    ///
    /// A put that fits one WQE inside both memories (the common case) is tested once, all checks together,
    /// and built directly; anything else (an error, several WQEs) takes the general path, which checks the whole
    /// range once before anything is posted.
    #[inline(always)]
    fn writes(&mut self, dst_offset: u64, src_offset: u64, bytes: u64, last: bool) -> Result<()> {
        if let Some((r, l)) = self.one_write(dst_offset, src_offset, bytes) {
            return self.write(r, l, bytes, last);
        }
        self.split_writes(dst_offset, src_offset, bytes, last)
    }

    /// The remote start and the SGE of a put that one WQE takes, `None` if it does not (too long, empty, or
    /// outside either memory: [`PortChannel::split_writes`] tells which); the test is [`one_wqe`].
    #[inline(always)]
    fn one_write(&self, dst_offset: u64, src_offset: u64, bytes: u64) -> Option<(Raddr, Sge)> {
        let h = self.h;
        let (d_addr, s_addr) = one_wqe(&h.dst, &h.src, h.max_wqe_bytes, dst_offset, src_offset, bytes)?;
        Some((Raddr { addr: d_addr, rkey: h.dst.rkey }, Sge::tested(s_addr, bytes as u32, h.src.lkey)))
    }

    /// [`PortChannel::writes`] for what one WQE does not take: checks the whole range (errors), then posts it
    /// in pieces of at most the handle's `max_wqe_bytes`, each inside the checked range.
    #[inline(always)]
    fn split_writes(&mut self, dst_offset: u64, src_offset: u64, bytes: u64, last: bool) -> Result<()> {
        let (r, src) = self.ranges(dst_offset, src_offset, bytes)?;
        let (lkey, max) = (self.h.src.lkey, self.wqe_limit());
        // `ranges` refused a zero length, so the loop posts at least one piece and ends at the last.
        let mut done = 0;
        loop {
            let n = (bytes - done).min(max);
            // Wrapping: `done` is inside the checked range, but the memory of a hand-made handle may run past
            // the top of the address space (its length a lie); such a piece goes to the NIC, which refuses it
            // as it does one WQE of that handle.
            let piece = Raddr { addr: r.addr.wrapping_add(done), rkey: r.rkey };
            let l = Sge::new(src.wrapping_add(done), n as u32, lkey)?;
            done += n;
            if done == bytes {
                return self.write(piece, l, bytes, last);
            }
            self.qp.stage(wqe::rdma_write(piece, l))?;
        }
    }

    /// Checks a put's whole range in both memories (a zero length is [`InvalidArgument::Length`]) and returns
    /// its remote start and local address, before anything of it is posted.
    #[inline(always)]
    fn ranges(&self, dst_offset: u64, src_offset: u64, bytes: u64) -> Result<(Raddr, u64)> {
        Ok((remote(&self.h.dst, dst_offset, bytes)?, local_range(&self.h.src, src_offset, bytes)?))
    }

    /// Largest WRITE the channel builds: the handle's `max_wqe_bytes`, at least 1 and below 2^31.
    #[inline(always)]
    fn wqe_limit(&self) -> u64 {
        self.h.max_wqe_bytes.clamp(1, MAX_WRITE)
    }

    /// Members of the team `g` that take a piece in each batch of a block put: all of them, but in Device mode
    /// at most as many WQEs as a team post may take (half the QP's ring, [`SharedQp::post_team`]), so that
    /// a large team on a small ring sends a range in more batches rather than failing. At least 1.
    #[inline(always)]
    fn team_width(&self, g: &impl CtaGroup) -> u64 {
        let members = u64::from(g.members().max(1));
        if self.proxied() {
            return members;
        }
        // SAFETY: a live channel's QP handle (contract of `new`); `wqe_cnt` is a field nobody writes meanwhile.
        let cnt = unsafe { (*(self.h.qp as *const QpHandle)).wqe_cnt };
        members.min(u64::from(cnt / 2)).max(1)
    }

    /// Stages the last WRITE of a put of `bytes` bytes, or submits it when the put is `last` (by BlueFlame up
    /// to the channel's `blue_flame_limit`).
    #[inline(always)]
    fn write(&mut self, r: Raddr, l: Sge, bytes: u64, last: bool) -> Result<()> {
        let w = wqe::rdma_write(r, l);
        if !last {
            return self.qp.stage(w);
        }
        // Unsignaled: a put alone is followed by more puts (LL rounds, bandwidth loops), and a CQE for each
        // would make the SQ retire one WQE per CQ poll.
        self.qp.submit(bytes <= self.h.blue_flame_limit, false, w)
    }

    /// RDMA WRITE of `bytes` bytes from the local memory at `src_offset` to the peer's memory at
    /// `dst_offset` (MSCCL++ `put`). Returns once posted; [`PortChannel::flush`] tells when it completed.
    ///
    /// The calling thread's stores of the source range before the call are ordered before the NIC reads it
    /// (the post's releases, at the queues' scope); other threads' stores need their own release and a barrier
    /// before the call, and a source in host memory written by device code on GPU-memory queues a
    /// [`sync::fence_release_sys`] (the guide's "Port channels: device side").
    ///
    /// # Errors
    /// Nothing posted: [`Error::Range`] for a range outside the peer's memory (checked first),
    /// [`InvalidArgument::Length`] for a zero length, [`Error::Range`] for a range outside the local memory
    /// (the error says which memory, with the offset and lengths), and in the Host modes
    /// [`InvalidArgument::Unsupported`] for a range past 4 GiB (triggers carry 32-bit offsets); timeouts and
    /// unexpected CQEs of the poster.
    #[inline(always)]
    pub fn put(&mut self, dst_offset: u64, src_offset: u64, bytes: u64) -> Result<()> {
        if self.proxied() {
            return self.push_writes(dst_offset, src_offset, bytes, 0);
        }
        self.writes(dst_offset, src_offset, bytes, true)
    }

    /// One piece of a put that the members of the team `g` (the threads of one CTA) make together, each
    /// with its own piece: an RDMA WRITE of `bytes` bytes from the local memory at `src_offset` to the
    /// peer's at `dst_offset` (`bytes` 0: this member has no piece). Every member of `g` calls it, with a
    /// channel of the same handle; the members with a piece must be ranks `0 .. k` (as a range split over
    /// the threads in order gives), and each piece goes out as one WQE (at most the handle's
    /// `max_wqe_bytes`, and below 2^31 bytes). Returns once posted; [`PortChannel::flush`] tells when it
    /// completed.
    ///
    /// In Block and Device sharing the pieces go out as one batch ([`SharedQp::post_team`]): one reservation, one CQE
    /// (the last WQE's), one doorbell for the whole call, where a [`PortChannel::put`] per thread costs a reservation
    /// each and up to a doorbell each. In Exclusive sharing the one member posts its piece as `put` does; in Warp
    /// sharing the lanes' pieces go out as one batch of the lanes that have one ([`WarpQp::post_some`]: every
    /// lane makes the call); in the Host modes each member pushes its own triggers. None of them uses the
    /// barriers, so there a member that never makes the call leaves its piece unwritten, undetected (a signal
    /// after it is the caller's to hold back; [`PortChannel::put_block_with_signal`] does).
    ///
    /// # Errors
    /// A member whose piece is out of range gets what [`PortChannel::put`] returns for it
    /// ([`Error::Range`]) and, in Device mode,
    /// [`InvalidArgument::Length`] for a piece longer than one WQE takes (in the Host modes the proxy splits a
    /// long piece as it splits a put's); in Block and Device sharing every other member then gets
    /// [`InvalidArgument::Team`], and nothing is posted, as every member does when some threads of the block
    /// never make the call (they returned from the kernel first); when the members' channels are not all one
    /// channel (of one QP and one memory pair), those of another channel than member 0's get
    /// [`InvalidArgument::TeamRules`] and the others `Team`; the other errors of [`SharedQp::post_team`]. In
    /// Warp sharing outside the Host modes, [`InvalidArgument::TeamRules`] for every member of a team larger
    /// than a warp, nothing posted.
    #[inline(always)]
    pub fn put_team(&mut self, g: &impl CtaGroup, dst_offset: u64, src_offset: u64, bytes: u64) -> Result<()> {
        if self.proxied() {
            return if bytes == 0 { Ok(()) } else { self.push_writes(dst_offset, src_offset, bytes, 0) };
        }
        let w = if bytes == 0 { Ok(None) } else { self.piece(dst_offset, src_offset, bytes).map(Some) };
        self.qp.submit_team(g, self.team_key(), w)
    }

    /// A put of one range that the members of the team `g` (the threads of one CTA) make together, as
    /// NVSHMEM's `nvshmemx_putmem_block`: every member calls it with the same arguments, `bytes` bytes from the
    /// local memory at `src_offset` to the peer's at `dst_offset`. The range goes out in WQEs of at most the
    /// handle's `max_wqe_bytes` (below 2^31 bytes), member `r` posting the `r`-th of each team's worth, with
    /// [`PortChannel::put_team`]: in Block and Device sharing one reservation, one CQE and one doorbell per
    /// `members()` WQEs (one for any range up to `members() * max_wqe_bytes`). Returns once posted.
    ///
    /// In Exclusive and Warp sharing the chunks go out as `put_team` posts them there: call it only from a team
    /// that may post to the QP that way (one thread for Exclusive; for Warp a CTA of one warp, whose lanes post
    /// together: a larger CTA gets [`InvalidArgument::TeamRules`] for every member, nothing posted). A team with more
    /// members than half the QP's ring has WQEBBs posts with the lowest half-ring of them in each batch.
    ///
    /// # Errors
    /// The whole range is checked first, by every member alike: a zero length is [`InvalidArgument::Length`],
    /// a range outside either memory [`Error::Range`] (the peer's checked first), for
    /// every member, and nothing is posted. Then as [`PortChannel::put_team`]. The members must pass the same
    /// arguments: nothing detects different ones; each member posts the pieces its own arguments give (so
    /// part of the range may stay unwritten with no error), and members that make different numbers of team
    /// calls mismatch the team's barriers.
    #[inline(always)]
    pub fn put_block(&mut self, g: &impl CtaGroup, dst_offset: u64, src_offset: u64, bytes: u64) -> Result<()> {
        self.ranges(dst_offset, src_offset, bytes)?;
        let chunk = self.wqe_limit();
        let (width, rank) = (self.team_width(g), u64::from(g.rank()));
        let round = chunk.saturating_mul(width);
        let mut at = 0u64;
        while at < bytes {
            // The range is inside both memories (checked above), so no offset below overflows.
            let off = at + rank.saturating_mul(chunk);
            let len = if rank < width && off < bytes { chunk.min(bytes - off) } else { 0 };
            self.put_team(g, dst_offset.wrapping_add(off), src_offset.wrapping_add(off), len)?;
            at = at.saturating_add(round);
        }
        Ok(())
    }

    /// [`PortChannel::put_block`] then [`PortChannel::signal`], as NVSHMEM's `nvshmemx_putmem_signal_block`
    /// with a signal add of 1 on the peer's semaphore: every member of the team `g` calls it with the same
    /// arguments; the peer that sees the signal sees the whole range.
    ///
    /// The signal's fetch-add goes out in the range's last batch ([`PortChannel::put_team`]), after its last
    /// WRITE, posted by the first member without a piece there: in Block and Device sharing a range of fewer
    /// than `members()` WQEs costs one reservation, one CQE and one doorbell in all, where `put_block` and then
    /// `signal` cost two of each (two passes of the NIC). When every member has a piece in the last batch, the
    /// signal follows, posted by member 0 alone as `signal` posts it. In Exclusive sharing the batches are
    /// posted as `put_team` posts them there. In Warp sharing and the Host modes every member posts (pushes) its
    /// pieces and, after a barrier of the team that counts the members whose pieces went out (so that the
    /// signal comes after every piece), member 0's signal goes: in Warp sharing in Device mode every lane makes
    /// that call, lane 0 with the signal (on host threads, each a warp of one lane, the barrier is what orders
    /// the threads' pieces before it); in the Host modes member 0 pushes it, whatever the sharing (the proxy
    /// is the QP's only poster).
    ///
    /// # Errors
    /// As [`PortChannel::put_block`] and [`PortChannel::signal`] (a bad range, semaphore or scratch word is the
    /// same error for every member, before anything is posted). In Warp sharing and the Host modes every member
    /// gets an error when any member's pieces were refused or some members never make the call (they returned from the
    /// kernel first): [`InvalidArgument::Team`] for those whose own pieces went out; no signal is pushed (the
    /// pieces pushed go out). Members that pass different arguments break the call, undetected: which of them posts
    /// the signal follows each one's own length, so the peer may see no signal, two, or the signal with part of
    /// the range unwritten.
    pub fn put_block_with_signal(
        &mut self,
        g: &impl CtaGroup,
        dst_offset: u64,
        src_offset: u64,
        bytes: u64,
    ) -> Result<()> {
        if bytes == 0 {
            return Err(Error::InvalidArgument(InvalidArgument::Length));
        }
        if self.proxied() || M::TOGETHER {
            // The members' pieces go out each from its own pushes (Host modes) or in batches of the lanes that
            // have one (Warp: on host threads, each thread's own), so the signal waits for a barrier. In the
            // Host modes the signal is pushed too, whatever the sharing: the proxy is the QP's only poster.
            let target = if M::TOGETHER && !self.proxied() { self.signal_target().map(Some)? } else { None };
            let r = self.put_block(g, dst_offset, src_offset, bytes);
            // Counting the members whose pieces went out, not OR-ing the refusals: a member that never makes the
            // call (it returned first; the barrier no longer waits for it) leaves its pieces unposted, and the
            // signal must not tell the peer that the range is there.
            if g.barrier_count(r.is_ok()) != g.members() {
                return r.and(Err(Error::InvalidArgument(InvalidArgument::Team)));
            }
            return match target {
                // Warp in Device mode: every lane makes the call, lane 0 with the signal.
                Some((r, l)) => {
                    let signal = (g.rank() == 0).then(|| wqe::atomic_fetch_add_tested(r, l, 1));
                    self.qp.submit_team(g, self.team_key(), Ok(signal))
                }
                None if g.rank() == 0 => self.signal(),
                None => Ok(()),
            };
        }
        let (r, l) = self.signal_target()?;
        let signal = wqe::atomic_fetch_add_tested(r, l, 1);
        self.ranges(dst_offset, src_offset, bytes)?;
        let chunk = self.wqe_limit();
        let (width, rank) = (self.team_width(g), u64::from(g.rank()));
        let round = chunk.saturating_mul(width);
        let mut at = 0u64;
        loop {
            // The range is inside both memories (checked above), so no offset below overflows.
            let off = at + rank.saturating_mul(chunk);
            // Members with a piece in this batch; the batch is the last when the range ends inside it. The
            // signal rides in it only when it has room for one more WQE (fewer pieces than `width`), so the
            // batch never exceeds what a team post takes.
            let pieces = (bytes - at).div_ceil(chunk).min(width);
            let last = bytes - at <= round;
            let w = if rank < width && off < bytes {
                self.piece(dst_offset.wrapping_add(off), src_offset.wrapping_add(off), chunk.min(bytes - off))
                    .map(|w| Some(w.widen::<4>()))
            } else {
                Ok((last && rank == pieces && pieces < width).then_some(signal))
            };
            self.qp.submit_team(g, self.team_key(), w)?;
            if last {
                // A full last batch: member 0 signals alone, after it (as `signal` does, asking for a CQE).
                return if pieces == width && rank == 0 { self.fetch_add(r, l, 1) } else { Ok(()) };
            }
            at = at.saturating_add(round);
        }
    }

    /// What the members of a team call must agree on besides the QP: the channel's memory pair (both addresses
    /// in one word; two channels of one QP differ in at least one), so that a team split between two channels
    /// is refused.
    #[inline(always)]
    fn team_key(&self) -> u64 {
        self.h.dst.addr ^ self.h.src.addr.rotate_left(32)
    }

    /// The one WRITE of a team member's piece, its ranges checked: by [`PortChannel::one_write`]'s single
    /// test, and only when that fails, one check at a time to tell which (or to take a `max_wqe_bytes` of 0
    /// as 1).
    #[inline(always)]
    fn piece(&self, dst_offset: u64, src_offset: u64, bytes: u64) -> Result<Wqe<3>> {
        if let Some((r, l)) = self.one_write(dst_offset, src_offset, bytes) {
            return Ok(wqe::rdma_write(r, l));
        }
        let (r, src) = self.ranges(dst_offset, src_offset, bytes)?;
        if bytes > self.wqe_limit() {
            return Err(Error::InvalidArgument(InvalidArgument::Length));
        }
        Ok(wqe::rdma_write(r, Sge::new(src, bytes as u32, self.h.src.lkey)?))
    }

    /// Whether the proxy posts this channel's WQEs (Host and HostNoAtomic modes).
    #[inline(always)]
    pub(crate) fn proxied(&self) -> bool {
        self.h.proxy != mode::DEVICE
    }

    /// The channel's id in the proxy's triggers, which carry 16 bits.
    ///
    /// # Errors
    /// [`InvalidArgument::Handle`] for an id that does not fit (a handle made or edited by hand): cut to 16
    /// bits it would name another channel.
    fn channel_id(&self) -> Result<u16> {
        u16::try_from(self.h.channel_id).map_err(|_| Error::InvalidArgument(InvalidArgument::Handle))
    }

    /// Pushes `t` into the proxy's FIFO.
    fn push(&self, t: Trigger) -> Result<u64> {
        // SAFETY: a proxied channel's handle names a live FIFO (contract of `new`).
        unsafe { fifo::push(&self.h.fifo, t, self.h.timeout_ns) }
    }

    /// The proxy's first error CQE on this channel's QP, if any.
    fn proxy_error(&self) -> Option<CqeError> {
        // SAFETY: a proxied channel's error word (contract of `new`), written by the proxy.
        let v = unsafe { sync::load_acquire_u64(self.h.proxy_err as *const u64) };
        (v >> 32 != 0).then(|| CqeError::unpack(v as u32, (v >> 32) as u32 & 0x00ff_ffff))
    }

    /// Pushes the `PUT` triggers of `bytes` bytes (pieces of at most 4 GiB − 1, which the proxy splits at
    /// `max_wqe_bytes`), the last one with `last_ops` too.
    fn push_writes(&mut self, dst_offset: u64, src_offset: u64, bytes: u64, last_ops: u8) -> Result<()> {
        let ch = self.proxy_put(dst_offset, src_offset, bytes)?;
        let mut done = 0;
        while done < bytes {
            let n = (bytes - done).min(Trigger::MAX_FIELD);
            let ops = Trigger::PUT | if done + n == bytes { last_ops } else { 0 };
            self.push(Trigger::new(ops, ch, dst_offset + done, src_offset + done, n))?;
            done += n;
        }
        Ok(())
    }

    /// Checks a put in the Host modes before anything of it is pushed: its range in both memories, the 32-bit
    /// offsets the triggers carry and the channel's id; returns the id.
    ///
    /// # Errors
    /// As [`PortChannel::ranges`]; [`InvalidArgument::Unsupported`] for a range past 4 GiB;
    /// [`InvalidArgument::Handle`] as [`PortChannel::channel_id`].
    pub(crate) fn proxy_put(&self, dst_offset: u64, src_offset: u64, bytes: u64) -> Result<u16> {
        self.ranges(dst_offset, src_offset, bytes)?;
        // Triggers carry 32-bit offsets (as MSCCL++'s): memory beyond 4 GiB needs Device mode. No sum overflows:
        // `ranges` checked them.
        let limit = Trigger::MAX_FIELD + 1;
        if dst_offset + bytes > limit || src_offset + bytes > limit {
            return Err(Error::InvalidArgument(InvalidArgument::Unsupported));
        }
        self.channel_id()
    }

    /// Adds 1 to the peer's inbound semaphore (RDMA fetch-add, placed after every earlier WRITE of the QP;
    /// MSCCL++ `signal`).
    ///
    /// # Errors
    /// As [`PortChannel::put`]; for a semaphore or scratch word of the handle that is not 8 bytes, 8-byte
    /// aligned, [`Error::Range`] (shorter) or [`Error::InvalidArgument`] (misaligned), with nothing posted (as
    /// [`crate::onesided::atomic_target`] tells it).
    pub fn signal(&mut self) -> Result<()> {
        if self.proxied() {
            return self.push(Trigger::new(Trigger::SIGNAL, self.channel_id()?, 0, 0, 0)).map(|_| ());
        }
        let (r, l) = self.signal_target()?;
        self.fetch_add(r, l, 1)
    }

    /// A signal's operands: the peer's semaphore word and the QP's scratch word, each 8 bytes and 8-byte
    /// aligned. Tested on every call, all together with one branch (the same checks as [`atomic_target`],
    /// which tells the error): the NIC would not catch every bad word of a hand-made handle, since it checks
    /// only the remote word's alignment and the MRs' bounds, so a scratch word that is misaligned or shorter
    /// than 8 bytes inside a larger MR would take the old value silently.
    ///
    /// # Errors
    /// [`Error::Range`] for a semaphore word of fewer than 8 bytes (remote) or such a scratch word (local),
    /// [`InvalidArgument::AtomicAlignment`] for a
    /// misaligned one.
    #[inline(always)]
    fn signal_target(&self) -> Result<(Raddr, Sge)> {
        let (sem, scratch) = (&self.h.remote_sem, &self.h.scratch);
        let aligned = (sem.addr | scratch.addr).is_multiple_of(ATOMIC_BYTES);
        if aligned & (sem.length >= ATOMIC_BYTES) & (scratch.length >= ATOMIC_BYTES) {
            let l = Sge::tested(scratch.addr, ATOMIC_BYTES as u32, scratch.lkey);
            return Ok((Raddr { addr: sem.addr, rkey: sem.rkey }, l));
        }
        atomic_target(sem, 0, scratch, 0)
    }

    /// Fetch-add of `add` on the remote word `r`, its old value to the local word `l` (the QP's scratch word),
    /// both 8 bytes and 8-byte aligned ([`atomic_target`] or [`PortChannel::signal_target`] checked them).
    #[inline(always)]
    fn fetch_add(&mut self, r: Raddr, l: Sge, add: u64) -> Result<()> {
        // Signaled: a signal ends an exchange that a flush usually follows, which then needs no NOP (on the H200
        // that NOP cost a Device-Exclusive ping-pong 11 µs). By BlueFlame as a put of its 8 bytes would be, so
        // that `blue_flame_limit` 0 means no BlueFlame at all.
        let bf = ATOMIC_BYTES <= self.h.blue_flame_limit;
        self.qp.submit(bf, true, wqe::atomic_fetch_add_tested(r, l, add))
    }

    /// [`PortChannel::put`] then [`PortChannel::signal`], one doorbell (MSCCL++ `putWithSignal`): the peer that
    /// sees the signal sees the data.
    ///
    /// # Errors
    /// As [`PortChannel::put`] and [`PortChannel::signal`]; nothing is posted for a bad range or signal word.
    #[inline(always)]
    pub fn put_with_signal(&mut self, dst_offset: u64, src_offset: u64, bytes: u64) -> Result<()> {
        if self.proxied() {
            return self.push_writes(dst_offset, src_offset, bytes, Trigger::SIGNAL);
        }
        let (r, l) = self.signal_target()?;
        self.writes(dst_offset, src_offset, bytes, false)?;
        self.fetch_add(r, l, 1)
    }

    /// [`PortChannel::put`] then an RDMA fetch-add of `add` on the 8-byte word at `acc_offset` of the peer's
    /// memory (8-byte aligned), posted together: the responder applies the atomic only after the WRITE is
    /// placed, so a peer that observes the accumulated word sees the data.
    ///
    /// # Errors
    /// As [`PortChannel::put`]; [`InvalidArgument::AtomicAlignment`] for a misaligned word. The put's range is
    /// checked first, so an error names the first bad argument in their order; nothing is posted for either.
    pub fn put_with_accumulate(
        &mut self,
        dst_offset: u64,
        src_offset: u64,
        bytes: u64,
        acc_offset: u64,
        add: u64,
    ) -> Result<()> {
        self.ranges(dst_offset, src_offset, bytes)?;
        let (r, l) = atomic_target(&self.h.dst, acc_offset, &self.h.scratch, 0)?;
        if self.proxied() {
            if self.h.proxy == mode::HOST_NO_ATOMIC || acc_offset > Trigger::MAX_FIELD {
                return Err(Error::InvalidArgument(InvalidArgument::Unsupported));
            }
            self.push_writes(dst_offset, src_offset, bytes, 0)?;
            return self.push(Trigger::accumulate(self.channel_id()?, acc_offset, add)).map(|_| ());
        }
        self.writes(dst_offset, src_offset, bytes, false)?;
        self.fetch_add(r, l, add)
    }

    /// Waits until everything posted on the QP so far has completed (MSCCL++ `flush`).
    ///
    /// # Errors
    /// [`Error::Cqe`] with the QP's first error CQE (e.g. syndrome 0x13 for a bad key), from then on every
    /// time; a timeout; an unexpected CQE.
    pub fn flush(&mut self) -> Result<()> {
        if self.proxied() {
            let i = self.push(Trigger::new(Trigger::FLUSH, self.channel_id()?, 0, 0, 0))?;
            // SAFETY: as in `push`.
            unsafe { fifo::sync(&self.h.fifo, i, self.h.timeout_ns) }?;
            return self.proxy_error().map_or(Ok(()), |e| Err(Error::Cqe(e)));
        }
        self.qp.flush()
    }

    /// Waits until the inbound semaphore reaches one more than this side has waited for so far (MSCCL++
    /// `wait`), watching the QP once the signal is late ([`crate::wait::bounded_watching`]): an error CQE of
    /// the QP (a dead peer with work outstanding) ends the wait with it rather than a timeout. In Warp sharing the CQ is polled by the waits that the lowest lane takes part
    /// in: lanes that wait without it see only an error CQE polled already, and may time out instead.
    ///
    /// # Errors
    /// [`Error::Timeout`] after the channel's timeout, with [`WaitOn::Peer`] naming the peer's rank when the
    /// handle records it (a host-built channel's does), [`WaitOn::Semaphore`] otherwise; [`Error::Cqe`];
    /// [`Error::PeerGone`] once the signal is late and the host has marked the peer gone (it left, or the
    /// session broke), unless the signal has landed by then. A
    /// wait that fails gives its count back, so that a retry waits for the same signal, unless another waiter
    /// of the channel has taken the next count meanwhile (shared waiters): then the counts stay as taken.
    pub fn wait(&mut self) -> Result<()> {
        // SAFETY: `expected` is this side's counter (contract of `new`); GPU-scope atomic, so that waiters of
        // any scope each take their own count.
        let target = unsafe { Device::fetch_add(self.h.expected as *mut u64, 1) } + 1;
        let (sem, peer) = (self.h.local_sem as *const u64, self.h.peer());
        let seen = core::cell::Cell::new(0);
        self.ring_staged();
        let waited = bounded_watching(
            self.h.timeout_ns,
            |watch| {
                // SAFETY: the inbound semaphore word (contract of `new`), written by the NIC.
                seen.set(unsafe { sync::load_acquire_u64(sem) });
                if seen.get() >= target {
                    return Ok(Some(()));
                }
                self.watch(watch)?;
                Ok(None)
            },
            || match peer {
                Some(rank) => WaitOn::Peer { rank, expected: target, seen: seen.get() },
                None => WaitOn::Semaphore { addr: sem as u64, expected: target, seen: seen.get() },
            },
        );
        if waited.is_err() {
            // The signal this wait counted on has not been seen: the count goes back, if it is still the last
            // one taken.
            // SAFETY: as above.
            unsafe { Device::cas(self.h.expected as *mut u64, target, target - 1) };
        }
        waited
    }

    /// Before a wait for the peer: staged WQEs go now (Device mode), since what the wait is for may answer
    /// them, and a look at the CQ (which rings too) may not come soon.
    #[inline(always)]
    pub(crate) fn ring_staged(&mut self) {
        if !self.proxied() {
            self.qp.ring();
        }
    }

    /// One try of a wait for the peer ([`crate::wait::bounded_watching`]): when `watch` says to look, the QP's
    /// first error CQE ends the wait. In the Host modes the QP's CQ is the proxy's, and its error word tells
    /// instead. Once the wait is late ([`Watch::Look`]) the handle's `departed` word is read too: a peer that
    /// left, or a session that broke, ends it at once rather than after its timeout, as NCCL's kernels poll
    /// their abort flag ([`crate::wait::bounded_watching`] then looks once more for what the wait awaits).
    ///
    /// # Errors
    /// [`Error::Cqe`] with the QP's first error CQE; the errors of polling the CQ; [`Error::PeerGone`].
    pub(crate) fn watch(&mut self, watch: Watch) -> Result<()> {
        if !self.qp.looks(watch) {
            return Ok(());
        }
        let error = if self.proxied() {
            self.proxy_error()
        } else {
            self.qp.progress()?;
            self.qp.error()
        };
        if let Some(e) = error {
            return Err(Error::Cqe(e));
        }
        match watch {
            Watch::Look => self.departed().map_or(Ok(()), |gone| Err(Error::PeerGone(gone))),
            _ => Ok(()),
        }
    }

    /// The peer's departure, once the host has written the handle's `departed` word ([`departed`]).
    fn departed(&self) -> Option<PeerGone> {
        // SAFETY: the handle's `departed` word, when not 0, is live (contract of `new`).
        unsafe { departed(self.h) }
    }

    /// Whether a signal beyond those waited for has arrived; if so it counts as waited for (MSCCL++ `poll`).
    /// One thread at a time polls or waits on a channel's semaphore.
    pub fn poll(&mut self) -> bool {
        // SAFETY: as in `wait`.
        unsafe {
            let seen = sync::load_acquire_u64(self.h.local_sem as *const u64);
            let expected = sync::load_acquire_u64(self.h.expected as *const u64);
            if seen <= expected {
                return false;
            }
            Device::fetch_add(self.h.expected as *mut u64, 1);
        }
        true
    }
}

/// The departure of `h`'s peer once the host has written the handle's `departed` word (the peer left, or the
/// session broke: [`DEPARTED_BROKEN`]); `None` while the word is 0 or the handle has none.
///
/// # Safety
/// A non-zero `h.departed` must name an 8-byte word, 8-byte aligned, live for the call (a host-built handle's).
pub(crate) unsafe fn departed(h: &PortChannelHandle) -> Option<PeerGone> {
    if h.departed == 0 {
        return None;
    }
    // SAFETY: the caller's contract; the host writes the word with a release store.
    let v = unsafe { sync::load_acquire_u64(h.departed as *const u64) };
    let rank = (v as u32).checked_sub(1)?;
    Some(PeerGone { rank, broken: v & DEPARTED_BROKEN != 0 })
}

/// The remote and local start addresses of a put of `bytes` bytes from `src + src_offset` to `dst + dst_offset`
/// that one WQE takes (1 ..= `max_wqe_bytes` bytes, and below 2^31), inside both memories; `None` otherwise.
///
/// The checks of [`remote`], [`local_range`] and [`Sge::new`], combined with `&` rather than `&&` so that a
/// put's fast path branches once for all of them instead of once each, and with no overflow to test:
/// `len - bytes` is only used where `bytes <= len`. Unlike `remote` and `local_range` it does not test
/// `addr + offset` for wrapping: an offset inside a memory cannot wrap the address of memory the host
/// registered, and a hand-made handle whose address wraps is wrong as one with any other wrong address is,
/// which no test of the handle against itself catches; the NIC's key check bounds what either reaches (as for
/// a piece of a longer put).
#[inline(always)]
fn one_wqe(
    dst: &gdaki_shared::handle::RemoteMr,
    src: &gdaki_shared::handle::MrHandle,
    max_wqe_bytes: u64,
    dst_offset: u64,
    src_offset: u64,
    bytes: u64,
) -> Option<(u64, u64)> {
    let one = (bytes.wrapping_sub(1) < MAX_WRITE) & (bytes <= max_wqe_bytes);
    let d_in = (bytes <= dst.length) & (dst_offset <= dst.length.wrapping_sub(bytes));
    let s_in = (bytes <= src.length) & (src_offset <= src.length.wrapping_sub(bytes));
    (one & d_in & s_in).then(|| (dst.addr.wrapping_add(dst_offset), src.addr.wrapping_add(src_offset)))
}

/// Checks a local range for a put (the whole of it, which may be longer than one WQE takes) and returns its
/// device address.
#[inline(always)]
fn local_range(mr: &gdaki_shared::handle::MrHandle, off: u64, len: u64) -> Result<u64> {
    if len == 0 {
        return Err(Error::InvalidArgument(InvalidArgument::Length));
    }
    match (off.checked_add(len), mr.addr.checked_add(off)) {
        (Some(end), Some(addr)) if end <= mr.length => Ok(addr),
        _ => Err(crate::error::RangeError::local(off, len, mr.length).into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gdaki_shared::be::Be32;
    use gdaki_shared::handle::{MrHandle, RemoteMr};

    /// `one_wqe` against the checked arithmetic of the general path, on every combination of boundary values:
    /// `Some` exactly when the put is 1 ..= min(`max_wqe_bytes`, 2^31 - 1) bytes and its end fits in both
    /// memories without overflow, with the addresses `remote` and `local_range` give (where they do not wrap).
    #[test]
    fn one_wqe_takes_exactly_the_puts_the_checked_path_would_post_as_one_wqe() {
        let lens = [0u64, 1, 8, 4096, MAX_WRITE, MAX_WRITE + 1, u64::MAX - 1, u64::MAX];
        let addrs = [0u64, 0x7f00_0000_1000, u64::MAX - 4095];
        let values = |len: u64| {
            let mut v = std::vec![0u64, 1, 7, 8, 4095, 4096, MAX_WRITE, MAX_WRITE + 1, u64::MAX - 1, u64::MAX];
            v.extend([len.wrapping_sub(1), len, len.wrapping_add(1), len / 2]);
            v
        };
        let mut checked = 0u32;
        for (&d_len, &s_len) in lens.iter().zip(lens.iter().rev()).chain(lens.iter().zip(lens.iter())) {
            for &addr in &addrs {
                let dst = RemoteMr { addr, length: d_len, rkey: Be32::new(7), pad: 0 };
                let src = MrHandle { addr: addr ^ 0x10, length: s_len, lkey: Be32::new(9), rkey: Be32::ZERO };
                for max in [0u64, 1, 8, 4096, MAX_WRITE, MAX_WRITE + 1, u64::MAX] {
                    for bytes in values(d_len.min(s_len)) {
                        for d_off in values(d_len) {
                            for s_off in values(s_len) {
                                let fits = (1..=MAX_WRITE.min(max)).contains(&bytes);
                                let inside = |off: u64, len: u64| off.checked_add(bytes).is_some_and(|e| e <= len);
                                let want = (fits && inside(d_off, d_len) && inside(s_off, s_len))
                                    .then(|| (addr.wrapping_add(d_off), src.addr.wrapping_add(s_off)));
                                let got = one_wqe(&dst, &src, max, d_off, s_off, bytes);
                                assert_eq!(got, want, "dst {dst:?} src {src:?} max {max} {d_off} {s_off} {bytes}");
                                if let Some((d, s)) = got {
                                    if let Ok(r) = remote(&dst, d_off, bytes) {
                                        assert_eq!(r.addr, d);
                                    }
                                    if let Ok(l) = local_range(&src, s_off, bytes) {
                                        assert_eq!(l, s);
                                    }
                                }
                                checked += 1;
                            }
                        }
                    }
                }
            }
        }
        // 16 pairs of lengths, 3 addresses, 7 limits, 14 values each of bytes and the two offsets.
        assert_eq!(checked, 16 * 3 * 7 * 14 * 14 * 14);
    }
}
