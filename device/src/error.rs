//! Errors device code returns: an error CQE, or a bounded wait that ran out. No panics, no formatting on the
//! device: errors are values, and [`Error::to_report`] packs one for the host.

use gdaki_shared::handle::ErrorReport;

/// An error completion (`mlx5_err_cqe`) as device code sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CqeError {
    /// `MLX5_CQE_SYNDROME_*` (see `gdaki_shared::prm::opcode::syndrome`).
    pub syndrome: u8,
    /// Vendor error syndrome.
    pub vendor_err_synd: u8,
    /// WQE index (WQEBBs, low 16 bits) of the failed WQE.
    pub wqe_counter: u16,
    /// QPN (24 bits) of the QP whose WQE failed: the error CQE's own (`s_wqe_opcode_qpn`), or the handle's for
    /// a sticky error read back, so that an error of one QP among many says which. 0 where device code cannot
    /// know it (a hand-made report).
    pub qpn: u32,
}

/// What a bounded wait was waiting for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitOn {
    /// A CQE retiring the WQE at this 64-bit WQEBB index.
    Cqe {
        /// QPN (24 bits) of the QP whose SQ held the WQE, so that a wait among many QPs says which.
        qpn: u32,
        /// WQEBB index (64-bit) whose completion was awaited.
        wqe_index: u64,
    },
    /// Room in the SQ for this many WQEBBs.
    SqSpace {
        /// QPN (24 bits) of the QP whose SQ was full.
        qpn: u32,
        /// WQEBBs needed.
        wqebbs: u32,
    },
    /// Earlier posters of a shared QP publishing their WQEs (in order) up to this WQEBB index.
    Publish {
        /// QPN (24 bits) of the shared QP.
        qpn: u32,
        /// WQEBB index (64-bit) of this poster's WQE.
        wqe_index: u64,
    },
    /// Room in the proxy FIFO for the trigger at this index (Host modes).
    FifoSpace {
        /// The trigger's index (64-bit count of pushes).
        index: u64,
    },
    /// The proxy doing the trigger at `index` (Host modes: `flush`).
    Proxy {
        /// The trigger's index.
        index: u64,
        /// Triggers the proxy had done when the wait ended.
        done: u64,
    },
    /// A semaphore reaching a value.
    Semaphore {
        /// Address of the semaphore.
        addr: u64,
        /// Value awaited (`>=`).
        expected: u64,
        /// Last value read.
        seen: u64,
    },
    /// An LL packet carrying the round's flag in every flag word ([`crate::packet`]).
    Packet {
        /// Address of the packet.
        addr: u64,
        /// Flag awaited.
        flag: u32,
        /// The first flag word read that differed, at the last try.
        seen: u32,
    },
    /// A signal from one peer on a port channel whose handle records the peer's rank
    /// ([`crate::channel::PortChannel::wait`], a collective's channels in [`crate::coll`]), counted by the
    /// channel's semaphore. Names the rank the caller waited for.
    Peer {
        /// The peer's rank in the communicator.
        rank: u32,
        /// Semaphore value awaited (`>=`).
        expected: u64,
        /// Last value read.
        seen: u64,
    },
    /// The root of a broadcast waiting for its group acknowledgment ([`crate::coll`]): one counter that every
    /// receiver advances by 1, so `expected - seen` receivers had not acknowledged (which ones, one word
    /// cannot say).
    GroupAck {
        /// Address of the counter.
        addr: u64,
        /// Value awaited (`>=`).
        expected: u64,
        /// Last value read.
        seen: u64,
    },
    /// A host thread's turn on a QP whose Warp-sharing handle other host threads share (on the `cpu`
    /// executor each thread is a warp of one lane, [`crate::warp_qp`]): the turns are tickets, served in order;
    /// the ticket of a wait that ran out is given up, and the turn passes over it.
    Turn {
        /// Address of the handle's `host_next` word (in its send-queue state).
        addr: u64,
        /// This thread's ticket.
        ticket: u32,
        /// The ticket being served when the wait ended.
        serving: u32,
    },
}

/// A bounded wait that ran past its limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeout {
    /// What it waited for.
    pub on: WaitOn,
    /// Nanoseconds it waited.
    pub waited_ns: u64,
}

/// A CQE this QP did not expect, left unconsumed in the CQ: another QP's (the CQ is shared, which an
/// Exclusive [`crate::qp::Qp`] does not support), or one whose WQE index is not outstanding (a stale CQE).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnexpectedCqe {
    /// The QPN the CQE names.
    pub qpn: u32,
    /// Its WQE index (low 16 bits).
    pub wqe_counter: u16,
}

/// A received payload did not hold the bytes the peer wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PayloadMismatch {
    /// Iteration (round trip) number.
    pub iter: u64,
    /// Byte offset of the first wrong 8-byte word.
    pub offset: u64,
    /// Word expected.
    pub expected: u64,
    /// Word seen.
    pub seen: u64,
}

/// A range of bytes that lies outside the registered memory it names (or whose address, the handle's `addr`
/// plus `offset`, would pass 2^64: a handle whose address is wrong), found by device code before it posted
/// anything (a real NIC would answer it with an error CQE and move the QP to the error state: syndrome 0x04,
/// local protection, for a local range; 0x13, remote access, for a remote one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RangeError {
    /// `false`: local memory (an `MrHandle`: a put's source, a get's destination, a result word, a packet
    /// buffer); `true`: the peer's memory (a `RemoteMr`: a put's destination, a semaphore).
    pub remote: bool,
    /// Offset of the range in the memory, bytes.
    pub offset: u64,
    /// Length of the range, bytes.
    pub bytes: u64,
    /// Length of the memory, bytes (its handle's `length`).
    pub length: u64,
}

/// A failure of the application's own kernel code, in its own terms: gdaki only carries it to the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AppError {
    /// What failed, in the application's numbering.
    pub code: u32,
    /// A value that goes with it (an index, a count, the word seen).
    pub value: u64,
}

/// A peer that a wait was for is gone, as far as the session can tell: it left the session, or the session
/// broke (the host learned it from the bootstrap session and wrote the channel's `departed` word, after a
/// grace period for what the peer had sent to land).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerGone {
    /// The peer's rank.
    pub rank: u32,
    /// `false`: the peer left the session (said goodbye). `true`: the session broke (a rank or the root died,
    /// or a collective failed; the host's bootstrap errors name the cause), which ends every wait of every
    /// peer as NCCL's abort does: this peer may be alive, but what was awaited from it may never come.
    pub broken: bool,
}

/// Everything device code can fail with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub enum Error {
    /// The NIC completed a WQE in error.
    Cqe(CqeError),
    /// A bounded wait ran out.
    Timeout(Timeout),
    /// The CQ holds a completion this QP cannot account for.
    UnexpectedCqe(UnexpectedCqe),
    /// A payload check failed.
    Payload(PayloadMismatch),
    /// A range outside its registered memory ([`RangeError`]: which memory, the offset, the length and the
    /// memory's length). Nothing was posted.
    Range(RangeError),
    /// An argument was out of range (e.g. a zero length, or an inline payload too large); the code names
    /// which.
    InvalidArgument(InvalidArgument),
    /// The application's kernel code failed ([`AppError`]): what a user's kernel returns for its own checks.
    App(AppError),
    /// The peer a wait was for left, or the session broke ([`PeerGone`]): its signal may never come.
    PeerGone(PeerGone),
}

/// Which argument device code rejected before posting anything. The discriminants are the codes an
/// `gdaki_shared::handle::ErrorReport` carries; 1 and 2 are not used (they named ranges outside their
/// memory, which are [`Error::Range`] with the offsets now) nor is 10 (it named a check that the QP's one
/// send-queue state made unnecessary): each is read back as no error kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum InvalidArgument {
    /// An inline payload is longer than [`crate::wqe::MAX_INLINE`].
    InlineTooLong = 3,
    /// An atomic target or result is not 8-byte aligned.
    AtomicAlignment = 4,
    /// A byte count device code cannot post: 0, one that does not fit 31 bits (a data segment's own limit,
    /// [`crate::wqe::MAX_SGE_LEN`]), a team member's piece over the channel's `max_wqe_bytes`, or an atomic's
    /// result buffer that is not 8 bytes.
    Length = 5,
    /// A ticket beyond every WQE posted on this QP.
    Ticket = 6,
    /// A QP handle whose SQ is not a power of two of 16 ..= 2^15 WQEBBs.
    Handle = 7,
    /// An operation the channel's mode cannot do (`put_with_accumulate` in HostNoAtomic mode), or a range
    /// past 4 GiB of a memory in the proxy's modes (a trigger carries 32-bit offsets).
    Unsupported = 9,
    /// An LL packet request that breaks the layout ([`crate::packet`]): data not a multiple of the packet's
    /// data bytes, a data address not aligned to them, a packet address not aligned to the packet, a flag of
    /// 0, or a thread index not below the thread count.
    Packet = 8,
    /// This member's part of a call shared by a team (the lanes of a warp, the threads of a CTA, the CTAs of a
    /// grid barrier) was not done because another member failed or never made the call: that member's error
    /// is the cause, and a launch's report names it instead ([`crate::launch::report_error`]). Returned by a
    /// team post ([`crate::shared_qp::SharedQp::post_team`], [`crate::channel::PortChannel::put_team`]) whose
    /// batch another member refused (nothing is posted), by the other threads of a block whose thread 0
    /// failed in [`crate::coll::all_reduce_ring`] or a [`crate::grid::GridBarrier`], and by every wait of a
    /// grid barrier once it is broken.
    Team = 11,
    /// A collective call ([`crate::coll`]) on a communicator handle that is out of range: 0 or more than
    /// [`MAX_RANKS`](gdaki_shared::coll::MAX_RANKS) ranks, a rank or root not below `nranks`, a block-wide
    /// collective ([`crate::coll::all_reduce_ring`]) called by part of a block or by more than one block; also
    /// what a kernel that takes the algorithm as a number returns for a code
    /// [`Algorithm::from_code`](crate::coll::Algorithm::from_code) does not know.
    Collective = 12,
    /// A value a [`crate::coll::reduce`] would quantize lies outside its bound (`|x| > max_abs`), or is a NaN
    /// or an infinity. Checked on every value before anything is sent.
    Value = 13,
    /// A [`crate::grid::GridBarrier`]'s counter that already held an arrival this launch cannot have made: it
    /// was not zero when the launch started, or another launch uses it. Caught for sure when the counter held
    /// at least the launch's CTA count (a second launch of the same grid on it); one left lower lets some CTAs
    /// pass a barrier early before a later arrival finds it, or passes unnoticed.
    Counter = 14,
    /// A team call that breaks the team's rules. Of a shared team post, to each member whose own piece breaks
    /// them (the others get [`InvalidArgument::Team`]): a WQE from a rank not below the number of members with
    /// one (the members with a WQE must be ranks `0 .. k`), a WQE over one WQEBB, a channel other than member
    /// 0's. To every member or caller alike: a team in Warp sharing ([`crate::channel::Warp`]) wider than a
    /// warp, a [`crate::warp_qp::WarpQp`] call that the warp's leading lane does not make.
    TeamRules = 15,
    /// A handle posted to by more of the launch than its sharing allows: a Warp-sharing handle
    /// ([`crate::warp_qp::WarpQp`], `PortChannel::<Warp>`) by a second warp, a Block-scope QP
    /// ([`crate::scope::Block`]) by a second CTA, or one QP by Block scope and Warp sharing in one launch. On the
    /// GPU each would keep counters of its own on one ring and overwrite the other's WQEs; the `cpu` executor
    /// refuses it (the first to post owns the QP for the launch) so that a test there fails as the GPU would.
    Sharing = 16,
    /// A QP with two posters at once where it allows one (`cpu` executor): a second Exclusive
    /// [`crate::qp::Qp`] (or `PortChannel::<Exclusive>`) of a handle while the first lives (refused to both
    /// while both live), a shared poster's call while an Exclusive `Qp` of the handle lives, or a `Qp` made
    /// while a shared poster's call is under way (refused for its life; a live `Qp`'s calls are refused while
    /// one is).
    Posters = 17,
    /// A raw WQE ([`crate::qp::Qp::post_raw`]) that device code cannot post: a `ds` of 0, or of more than its
    /// builder holds or than [`MAX_DS`](crate::wqe::MAX_DS) (4 WQEBBs, the largest WQE the room accounting
    /// covers).
    WqeSize = 18,
    /// A batch device code cannot post as one: no WQEs ([`crate::qp::Qp::post_batch`]), WQEs of different
    /// sizes (a warp's batch, [`crate::warp_qp`]), or more WQEBBs than half the SQ ring (a batch, a warp's,
    /// a team's).
    Batch = 19,
    /// A collective's regions that do not fit the data buffer or break its layout: a count slice shorter than
    /// `nranks`, a region outside the buffer (or counts whose sum overflows, received ones included), regions
    /// that overlap where they may not, or a reduce's or ring all-reduce's misaligned region (checked before
    /// anything is posted, as far as this rank can tell: received counts are checked once they arrive).
    Regions = 20,
    /// A [`crate::coll::reduce`] bound (`max_abs`) that is not positive and finite.
    Bound = 21,
}

/// Codes of [`ErrorReport::kind`].
pub mod kind {
    /// No error.
    pub const NONE: u32 = 0;
    /// [`super::Error::Cqe`]; `addr` holds the QPN.
    pub const CQE: u32 = 1;
    /// [`super::Error::Timeout`] on a CQE; `addr` holds the QPN, `expected` the WQEBB index.
    pub const TIMEOUT_CQE: u32 = 2;
    /// [`super::Error::Timeout`] on SQ space; `addr` holds the QPN, `expected` the WQEBBs needed.
    pub const TIMEOUT_SQ_SPACE: u32 = 3;
    /// [`super::Error::Timeout`] on a semaphore.
    pub const TIMEOUT_SEMAPHORE: u32 = 4;
    /// [`super::Error::Payload`].
    pub const PAYLOAD: u32 = 5;
    /// [`super::Error::InvalidArgument`]; `expected` holds the [`super::InvalidArgument`] code.
    pub const INVALID_ARGUMENT: u32 = 6;
    /// [`super::Error::UnexpectedCqe`]; `addr` holds the QPN, `wqe_counter` the WQE index.
    pub const UNEXPECTED_CQE: u32 = 7;
    /// [`super::Error::Timeout`] on earlier posters' publication; `addr` holds the QPN, `expected` the WQEBB
    /// index.
    pub const TIMEOUT_PUBLISH: u32 = 8;
    /// [`super::Error::Timeout`] on room in the proxy FIFO; `expected` holds the trigger index.
    pub const TIMEOUT_FIFO_SPACE: u32 = 10;
    /// [`super::Error::Timeout`] on the proxy; `expected` holds the trigger index, `seen` the proxy's count.
    pub const TIMEOUT_PROXY: u32 = 11;
    /// [`super::Error::Timeout`] on an LL packet; `addr` holds its address, `expected` the flag awaited,
    /// `seen` the flag read.
    pub const TIMEOUT_PACKET: u32 = 9;
    /// [`super::Error::App`]; `expected` holds the code, `seen` the value.
    pub const APP: u32 = 12;
    /// [`super::Error::Timeout`] on a channel's peer ([`super::WaitOn::Peer`]); `addr` holds its rank,
    /// `expected` and `seen` the semaphore values.
    pub const TIMEOUT_PEER: u32 = 13;
    /// [`super::Error::Timeout`] on a broadcast's group acknowledgment ([`super::WaitOn::GroupAck`]); `addr`
    /// holds the counter's address, `expected` and `seen` its values.
    pub const TIMEOUT_GROUP_ACK: u32 = 14;
    /// [`super::Error::Timeout`] on a host thread's turn ([`super::WaitOn::Turn`]); `addr` holds the state's
    /// address, `expected` the ticket, `seen` the ticket served.
    pub const TIMEOUT_TURN: u32 = 16;
    /// [`super::InvalidArgument::Team`], alone in the report (every other word 0): a team member that failed
    /// because another member could not post. One word, so that a launch's report of it can be replaced by
    /// the cause ([`crate::launch::report_error`]).
    pub const TEAM: u32 = 15;
    /// [`super::Error::PeerGone`]; `addr` holds the peer's rank, `expected` 1 when the session broke (0: the
    /// peer left).
    pub const PEER_GONE: u32 = 17;
    /// [`super::Error::Range`]; `addr` holds the offset, `seen` the range's bytes, `expected` the memory's
    /// length, `detail` 1 for the peer's memory (0: local).
    pub const RANGE: u32 = 18;
}

impl RangeError {
    /// `bytes` bytes at `offset` of local memory of `length` bytes. Cold: the range checks sit on the posting
    /// fast paths, and their error's words should not shape them.
    #[cold]
    pub const fn local(offset: u64, bytes: u64, length: u64) -> RangeError {
        RangeError { remote: false, offset, bytes, length }
    }

    /// `bytes` bytes at `offset` of the peer's memory of `length` bytes (cold, as [`RangeError::local`]).
    #[cold]
    pub const fn remote(offset: u64, bytes: u64, length: u64) -> RangeError {
        RangeError { remote: true, offset, bytes, length }
    }
}

impl From<RangeError> for Error {
    fn from(e: RangeError) -> Error {
        Error::Range(e)
    }
}

impl CqeError {
    /// Packs it as `syndrome << 24 | vendor_err_synd << 16 | wqe_counter` (the handle's sticky error, which
    /// leaves the QPN out: the handle has it).
    pub const fn pack(self) -> u32 {
        (self.syndrome as u32) << 24 | (self.vendor_err_synd as u32) << 16 | self.wqe_counter as u32
    }

    /// Unpacks [`CqeError::pack`], for the QP numbered `qpn`.
    pub const fn unpack(v: u32, qpn: u32) -> Self {
        Self { syndrome: (v >> 24) as u8, vendor_err_synd: (v >> 16) as u8, wqe_counter: v as u16, qpn }
    }
}

impl Error {
    /// Packs the error into the `#[repr(C)]` report the host reads.
    pub fn to_report(self) -> ErrorReport {
        let mut r = ErrorReport::default();
        match self {
            Error::Cqe(e) => {
                r.kind = kind::CQE;
                r.syndrome = e.syndrome;
                r.vendor_err_synd = e.vendor_err_synd;
                r.wqe_counter = e.wqe_counter;
                r.addr = e.qpn as u64;
            }
            Error::Timeout(t) => {
                r.detail = t.waited_ns;
                match t.on {
                    WaitOn::Cqe { qpn, wqe_index } => {
                        r.kind = kind::TIMEOUT_CQE;
                        r.addr = qpn as u64;
                        r.expected = wqe_index;
                    }
                    WaitOn::SqSpace { qpn, wqebbs } => {
                        r.kind = kind::TIMEOUT_SQ_SPACE;
                        r.addr = qpn as u64;
                        r.expected = wqebbs as u64;
                    }
                    WaitOn::Publish { qpn, wqe_index } => {
                        r.kind = kind::TIMEOUT_PUBLISH;
                        r.addr = qpn as u64;
                        r.expected = wqe_index;
                    }
                    WaitOn::FifoSpace { index } => {
                        r.kind = kind::TIMEOUT_FIFO_SPACE;
                        r.expected = index;
                    }
                    WaitOn::Proxy { index, done } => {
                        r.kind = kind::TIMEOUT_PROXY;
                        r.expected = index;
                        r.seen = done;
                    }
                    WaitOn::Semaphore { addr, expected, seen } => {
                        r.kind = kind::TIMEOUT_SEMAPHORE;
                        r.expected = expected;
                        r.seen = seen;
                        r.addr = addr;
                    }
                    WaitOn::Packet { addr, flag, seen } => {
                        r.kind = kind::TIMEOUT_PACKET;
                        r.expected = flag as u64;
                        r.seen = seen as u64;
                        r.addr = addr;
                    }
                    WaitOn::Peer { rank, expected, seen } => {
                        r.kind = kind::TIMEOUT_PEER;
                        r.expected = expected;
                        r.seen = seen;
                        r.addr = rank as u64;
                    }
                    WaitOn::GroupAck { addr, expected, seen } => {
                        r.kind = kind::TIMEOUT_GROUP_ACK;
                        r.expected = expected;
                        r.seen = seen;
                        r.addr = addr;
                    }
                    WaitOn::Turn { addr, ticket, serving } => {
                        r.kind = kind::TIMEOUT_TURN;
                        r.expected = ticket as u64;
                        r.seen = serving as u64;
                        r.addr = addr;
                    }
                }
            }
            Error::UnexpectedCqe(u) => {
                r.kind = kind::UNEXPECTED_CQE;
                r.addr = u.qpn as u64;
                r.wqe_counter = u.wqe_counter;
            }
            Error::Payload(p) => {
                r.kind = kind::PAYLOAD;
                r.expected = p.expected;
                r.seen = p.seen;
                r.detail = p.iter;
                r.addr = p.offset;
            }
            Error::Range(e) => {
                r.kind = kind::RANGE;
                r.addr = e.offset;
                r.seen = e.bytes;
                r.expected = e.length;
                r.detail = e.remote as u64;
            }
            Error::InvalidArgument(InvalidArgument::Team) => r.kind = kind::TEAM,
            Error::InvalidArgument(a) => {
                r.kind = kind::INVALID_ARGUMENT;
                r.expected = a as u32 as u64;
            }
            Error::App(a) => {
                r.kind = kind::APP;
                r.expected = a.code as u64;
                r.seen = a.value;
            }
            Error::PeerGone(p) => {
                r.kind = kind::PEER_GONE;
                r.addr = p.rank as u64;
                r.expected = p.broken as u64;
            }
        }
        r
    }
}

impl Error {
    /// Unpacks a report written by [`Error::to_report`]; `None` when it says "no error" or holds an unknown
    /// kind.
    pub fn from_report(r: &ErrorReport) -> Option<Error> {
        let timeout = |on| Some(Error::Timeout(Timeout { on, waited_ns: r.detail }));
        match r.kind {
            kind::CQE => Some(Error::Cqe(CqeError {
                syndrome: r.syndrome,
                vendor_err_synd: r.vendor_err_synd,
                wqe_counter: r.wqe_counter,
                qpn: r.addr as u32,
            })),
            kind::TIMEOUT_CQE => timeout(WaitOn::Cqe { qpn: u32::try_from(r.addr).ok()?, wqe_index: r.expected }),
            kind::TIMEOUT_SQ_SPACE => {
                timeout(WaitOn::SqSpace { qpn: u32::try_from(r.addr).ok()?, wqebbs: u32::try_from(r.expected).ok()? })
            }
            kind::TIMEOUT_PUBLISH => {
                timeout(WaitOn::Publish { qpn: u32::try_from(r.addr).ok()?, wqe_index: r.expected })
            }
            kind::TIMEOUT_FIFO_SPACE => timeout(WaitOn::FifoSpace { index: r.expected }),
            kind::TIMEOUT_PROXY => timeout(WaitOn::Proxy { index: r.expected, done: r.seen }),
            kind::TIMEOUT_SEMAPHORE => timeout(WaitOn::Semaphore { addr: r.addr, expected: r.expected, seen: r.seen }),
            kind::TIMEOUT_PACKET => {
                timeout(WaitOn::Packet { addr: r.addr, flag: r.expected as u32, seen: r.seen as u32 })
            }
            kind::TIMEOUT_PEER => {
                timeout(WaitOn::Peer { rank: u32::try_from(r.addr).ok()?, expected: r.expected, seen: r.seen })
            }
            kind::TIMEOUT_GROUP_ACK => timeout(WaitOn::GroupAck { addr: r.addr, expected: r.expected, seen: r.seen }),
            kind::TIMEOUT_TURN => timeout(WaitOn::Turn {
                addr: r.addr,
                ticket: u32::try_from(r.expected).ok()?,
                serving: u32::try_from(r.seen).ok()?,
            }),
            kind::UNEXPECTED_CQE => {
                Some(Error::UnexpectedCqe(UnexpectedCqe { qpn: r.addr as u32, wqe_counter: r.wqe_counter }))
            }
            kind::PAYLOAD => Some(Error::Payload(PayloadMismatch {
                iter: r.detail,
                offset: r.addr,
                expected: r.expected,
                seen: r.seen,
            })),
            kind::APP => Some(Error::App(AppError { code: r.expected as u32, value: r.seen })),
            kind::PEER_GONE => Some(Error::PeerGone(PeerGone {
                rank: u32::try_from(r.addr).ok()?,
                broken: match r.expected {
                    0 => false,
                    1 => true,
                    _ => return None,
                },
            })),
            kind::RANGE => Some(Error::Range(RangeError {
                remote: match r.detail {
                    0 => false,
                    1 => true,
                    _ => return None,
                },
                offset: r.addr,
                bytes: r.seen,
                length: r.expected,
            })),
            kind::INVALID_ARGUMENT => Some(Error::InvalidArgument(match r.expected {
                3 => InvalidArgument::InlineTooLong,
                4 => InvalidArgument::AtomicAlignment,
                5 => InvalidArgument::Length,
                6 => InvalidArgument::Ticket,
                7 => InvalidArgument::Handle,
                9 => InvalidArgument::Unsupported,
                8 => InvalidArgument::Packet,
                12 => InvalidArgument::Collective,
                13 => InvalidArgument::Value,
                14 => InvalidArgument::Counter,
                15 => InvalidArgument::TeamRules,
                16 => InvalidArgument::Sharing,
                17 => InvalidArgument::Posters,
                18 => InvalidArgument::WqeSize,
                19 => InvalidArgument::Batch,
                20 => InvalidArgument::Regions,
                21 => InvalidArgument::Bound,
                _ => return None,
            })),
            kind::TEAM => Some(Error::InvalidArgument(InvalidArgument::Team)),
            _ => None,
        }
    }
}

impl core::fmt::Display for Error {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Error::Cqe(e) => {
                write!(f, "error CQE on QP {:#x}: syndrome {:#04x}", e.qpn, e.syndrome)?;
                if let Some(what) = gdaki_shared::prm::opcode::syndrome::describe(e.syndrome) {
                    write!(f, " ({what})")?;
                }
                write!(
                    f,
                    ", vendor syndrome {:#04x}, WQE index {} (sticky: every later call on the QP returns it, in \
                     later launches too)",
                    e.vendor_err_synd, e.wqe_counter
                )
            }
            Error::Timeout(t) => {
                let ms = t.waited_ns as f64 / 1e6;
                match t.on {
                    WaitOn::Cqe { qpn, wqe_index } => {
                        write!(f, "timed out after {ms:.1} ms waiting for the CQE of WQE {wqe_index} on QP {qpn:#x}")
                    }
                    WaitOn::SqSpace { qpn, wqebbs } => {
                        write!(
                            f,
                            "timed out after {ms:.1} ms waiting for {wqebbs} free WQEBBs in the SQ of QP {qpn:#x}"
                        )
                    }
                    WaitOn::Publish { qpn, wqe_index } => write!(
                        f,
                        "timed out after {ms:.1} ms waiting for earlier posters on QP {qpn:#x} to publish up to WQE \
                         {wqe_index}"
                    ),
                    WaitOn::FifoSpace { index } => write!(
                        f,
                        "timed out after {ms:.1} ms waiting for room in the proxy FIFO for trigger {index} (is the \
                         proxy running?)"
                    ),
                    WaitOn::Proxy { index, done } => write!(
                        f,
                        "timed out after {ms:.1} ms waiting for the proxy to do trigger {index} (it had done {done})"
                    ),
                    WaitOn::Semaphore { addr, expected, seen } => write!(
                        f,
                        "timed out after {ms:.1} ms waiting for semaphore {addr:#x} to reach {expected} (saw {seen})"
                    ),
                    WaitOn::Packet { addr, flag, seen } => write!(
                        f,
                        "timed out after {ms:.1} ms waiting for the LL packet at {addr:#x} to carry flag {flag} (saw \
                         {seen})"
                    ),
                    WaitOn::Peer { rank, expected, seen } => write!(
                        f,
                        "timed out after {ms:.1} ms waiting for rank {rank} (its signal count to reach {expected}, \
                         saw {seen})"
                    ),
                    WaitOn::GroupAck { addr, expected, seen } => write!(
                        f,
                        "timed out after {ms:.1} ms waiting for the group acknowledgment at {addr:#x} to reach \
                         {expected} (saw {seen}: {} receivers had not acknowledged)",
                        expected.saturating_sub(seen)
                    ),
                    WaitOn::Turn { addr, ticket, serving } => write!(
                        f,
                        "timed out after {ms:.1} ms waiting for this host thread's turn on the warp QP at {addr:#x} \
                         (ticket {ticket}, serving {serving}: other threads sharing the handle held it)"
                    ),
                }
            }
            Error::App(a) => write!(f, "application error {} (value {})", a.code, a.value),
            Error::PeerGone(PeerGone { rank, broken: false }) => {
                write!(f, "rank {rank} left the session before what was awaited from it came")
            }
            Error::PeerGone(PeerGone { rank, broken: true }) => write!(
                f,
                "the bootstrap session broke while waiting for rank {rank} (a rank, perhaps another, or the root \
                 died, or a collective failed: the error of this rank's next bootstrap call, a barrier say, names \
                 it); what was awaited from rank {rank} may never come"
            ),
            Error::UnexpectedCqe(u) => write!(
                f,
                "unexpected CQE for QPN {:#x}, WQE index {} (a CQ shared between QPs, or a stale completion)",
                u.qpn, u.wqe_counter
            ),
            Error::Payload(p) => write!(
                f,
                "payload mismatch in iteration {} at byte {}: expected {:#018x}, saw {:#018x}",
                p.iter, p.offset, p.expected, p.seen
            ),
            Error::Range(RangeError { remote, offset, bytes, length }) => {
                let (whose, side) = if *remote { ("the peer's", "remote") } else { ("its", "local") };
                if offset.checked_add(*bytes).is_some_and(|end| end <= *length) {
                    // Inside the length: the address is what wrapped.
                    return write!(
                        f,
                        "{side} range of {bytes} bytes at offset {offset} of {whose} registered memory of {length} \
                         bytes has an address past 2^64 (the handle's address is wrong; nothing was posted)"
                    );
                }
                write!(
                    f,
                    "{side} range of {bytes} bytes at offset {offset} lies outside {whose} registered memory of \
                     {length} bytes (nothing was posted)"
                )
            }
            Error::InvalidArgument(a) => write!(f, "invalid argument: {a:?} ({})", a.describe()),
        }
    }
}

impl InvalidArgument {
    /// What the code means, in a few words: the host's message carries it after the variant's name, so that
    /// a kernel's `invalid argument: TeamRules` says which rules there are without a look at the docs.
    pub const fn describe(self) -> &'static str {
        match self {
            InvalidArgument::InlineTooLong => "an inline payload is longer than MAX_INLINE",
            InvalidArgument::AtomicAlignment => "an atomic target or result is not 8-byte aligned",
            InvalidArgument::Length => {
                "a byte count of 0 or of 2^31 or more, a team piece over max_wqe_bytes, or an atomic result buffer \
                 that is not 8 bytes"
            }
            InvalidArgument::Ticket => "a ticket beyond every WQE posted on this QP",
            InvalidArgument::Handle => "a QP handle whose SQ is not a power of two of 16 to 32768 WQEBBs",
            InvalidArgument::Unsupported => {
                "an operation the channel's mode cannot do, or a proxy trigger's offset past 4 GiB"
            }
            InvalidArgument::Packet => "an LL packet request that breaks the packet layout",
            InvalidArgument::Team => {
                "another member of this team call (a lane, a thread of the CTA, a CTA of the grid barrier) failed \
                 or never made the call; its error is the cause"
            }
            InvalidArgument::Collective => {
                "a communicator of 0 or too many ranks, a rank or root not below the rank count, a block-wide \
                 collective called by part of a block or by several blocks, or an unknown algorithm code"
            }
            InvalidArgument::Value => "a value to reduce lies outside its bound, or is not finite",
            InvalidArgument::Counter => {
                "a grid barrier's counter was not zero when the launch started, or another launch uses it"
            }
            InvalidArgument::TeamRules => {
                "this member broke the team's rules: a WQE from a rank not below the count of members with one, \
                 a WQE over one WQEBB, members on different channels, a Warp-sharing team wider than a warp, or \
                 a WarpQp call without its leading lane"
            }
            InvalidArgument::Sharing => {
                "a handle posted to by more of the launch than its sharing allows: a Warp-sharing handle by a \
                 second warp, a Block-scope QP by a second CTA, or one QP by Block scope and Warp sharing"
            }
            InvalidArgument::Posters => {
                "two posters of one QP at once: a second Exclusive Qp of the handle, or an Exclusive Qp and a \
                 shared poster's call"
            }
            InvalidArgument::WqeSize => {
                "a raw WQE of 0 segments, or of more than its builder holds or than MAX_DS (4 WQEBBs)"
            }
            InvalidArgument::Batch => {
                "a batch of no WQEs, of WQEs of different sizes, or of more WQEBBs than half the SQ ring"
            }
            InvalidArgument::Regions => {
                "a collective's regions do not fit the data buffer: counts too short or overflowing, a region \
                 outside the buffer, overlapping or misaligned regions"
            }
            InvalidArgument::Bound => "a reduce's bound (max_abs) is not positive and finite",
        }
    }
}

impl core::error::Error for Error {}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = core::result::Result<T, E>;
