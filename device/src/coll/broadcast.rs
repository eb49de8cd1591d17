//! Broadcast: the root's bytes into every rank's buffer at the same offset, by direct puts, a pipelined
//! chain or a binary tree, completed by a group acknowledgment at the root.

use super::{acknowledge, fits, wait_acks, Comm, BAD_COMM, BAD_REGIONS, MAX_RANKS};
use crate::error::Result;
use gdaki_shared::coll::CollHandle;

/// How a broadcast moves the data. Ranks are counted from the root: rank `(root + v) % nranks` is the
/// `v`-th.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Algorithm {
    /// The root puts the whole range to every other rank, one after the other (one signal each): least
    /// latency for small ranges, the root's link carries `nranks - 1` copies.
    Direct = 0,
    /// A pipelined chain: the `v`-th rank waits for chunk `k` from the `v - 1`-th and puts it to the
    /// `v + 1`-th at once, while chunk `k + 1` is on its way: every link carries one copy, and the time is
    /// about one range plus `nranks - 2` chunks.
    Chain = 1,
    /// A binary tree: the `v`-th rank waits for chunk `k` from the `(v - 1) / 2`-th and puts it to the
    /// `2v + 1`-th and `2v + 2`-th: depth `log2(nranks)`, pipelined by chunks like the chain.
    Tree = 2,
}

impl Algorithm {
    /// Every algorithm, in code order.
    pub const ALL: [Algorithm; 3] = [Algorithm::Direct, Algorithm::Chain, Algorithm::Tree];

    /// The algorithm of code `c` (its `repr(u32)` value, as a kernel parameter carries it), or `None`.
    pub const fn from_code(c: u32) -> Option<Self> {
        match c {
            0 => Some(Self::Direct),
            1 => Some(Self::Chain),
            2 => Some(Self::Tree),
            _ => None,
        }
    }
}

/// One broadcast call, the same on every rank (`#[repr(C)]`, 32 bytes: a kernel may take it by value or by
/// reference).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct Broadcast {
    /// Byte offset of the range in every rank's data buffer.
    pub offset: u64,
    /// Bytes in the range (0: the call does nothing, on every rank).
    pub bytes: u64,
    /// Bytes per chunk of the chain and the tree (each chunk is one put and one signal per link); 0 for
    /// [`default_chunk`]. Unused by [`Algorithm::Direct`], which puts the range whole. The last chunk may be
    /// shorter.
    pub chunk: u64,
    /// The rank whose bytes are sent, below `nranks`.
    pub root: u32,
    /// How the data moves.
    pub algorithm: Algorithm,
}

const _: () = assert!(core::mem::size_of::<Broadcast>() == 32);

// SAFETY: `#[repr(C)]` of three `u64`s, a `u32` and a `#[repr(u32)]` enum (no padding, the size asserted
// above), no pointers: the same layout on the host and on nvptx64. A kernel's copy holds the host's value,
// so its `algorithm` is one of the enum's.
unsafe impl crate::launch::DeviceRepr for Broadcast {}

/// Chunk size of a chain or tree broadcast of `bytes` bytes when none is given: the whole range up to
/// 64 KiB (a signal per chunk costs more than pipelining saves there), else an eighth of it rounded up to a
/// multiple of 4 KiB, at least 64 KiB and at most 4 MiB: at most eight chunks up to 32 MiB, more above, where
/// the 4 MiB cap applies.
pub const fn default_chunk(bytes: u64) -> u64 {
    const SMALL: u64 = 64 << 10;
    if bytes <= SMALL {
        return if bytes == 0 { 1 } else { bytes };
    }
    // Rounded up: an eighth rounded down leaves a ninth chunk of 1 to 7 bytes (a put and a signal more on
    // every link) whenever `bytes` is not a multiple of 8 and its eighth is one of 4 KiB.
    let c = bytes.div_ceil(8);
    let c = if c < SMALL {
        SMALL
    } else if c > 4 << 20 {
        4 << 20
    } else {
        c
    };
    c.next_multiple_of(4096)
}

/// Broadcasts `b.bytes` bytes at `b.offset` of the root's data buffer into every other rank's buffer at the
/// same offset. Every rank calls it with the same `b`, from one thread. Returns on a receiver once its
/// range is complete and its own forwards have completed, and on the root once every receiver has
/// acknowledged: each adds 1 to the root's one acknowledgment counter by RDMA fetch-add after it has its
/// data and its forwards are flushed, and the root waits until the counter reaches `nranks - 1` more than at
/// its previous broadcast as root, so nothing is reset between calls.
///
/// Calls that follow each other in one kernel may overlap across ranks (a rank that returned may start the
/// next call's puts while another still forwards this call's chunks): give consecutive calls disjoint ranges,
/// or separate them (a kernel boundary, a barrier), when a rank may write where another still reads.
///
/// # Errors
/// [`InvalidArgument::Collective`](crate::error::InvalidArgument::Collective) for a bad handle or a root not
/// below `nranks`, [`InvalidArgument::Regions`](crate::error::InvalidArgument::Regions) for a range outside
/// the data buffer (nothing posted);
/// [`Error::Timeout`](crate::error::Error::Timeout) with [`WaitOn::Peer`](crate::error::WaitOn::Peer) naming
/// the rank a receiver waited for, or [`WaitOn::GroupAck`](crate::error::WaitOn::GroupAck) on the root;
/// [`Error::PeerGone`](crate::error::Error::PeerGone) when a rank waited for (any, for the root) left or died;
/// the channels' errors (error CQEs, SQ timeouts).
///
/// # Safety
/// `h` must be a handle the host built for this rank of a live communicator (`gdaki::coll::Collectives`),
/// whose channels no other thread uses during the call.
pub unsafe fn broadcast(h: &CollHandle, b: &Broadcast) -> Result<()> {
    let c = Comm::new(h)?;
    if b.root >= c.n {
        return Err(BAD_COMM);
    }
    if !fits(h.buf.length, b.offset, b.bytes) {
        return Err(BAD_REGIONS);
    }
    if b.bytes == 0 || c.n == 1 {
        return Ok(());
    }
    let chunk = match b.algorithm {
        Algorithm::Direct => b.bytes,
        _ if b.chunk == 0 => default_chunk(b.bytes),
        _ => b.chunk.min(b.bytes),
    };
    let l = Links::of(b.algorithm, (c.rank + c.n - b.root) % c.n, c.n, b.root);
    // SAFETY: the caller's contract; `relay` and the acknowledgment hold one channel per peer at a time.
    unsafe {
        relay(&c, &l, b.offset, b.bytes, chunk)?;
        if c.rank == b.root {
            wait_acks(&c)
        } else {
            acknowledge(&c, b.root)
        }
    }
}

/// Whom a rank receives from and forwards to in one broadcast (real ranks).
struct Links {
    parent: Option<u32>,
    children: [u32; MAX_RANKS],
    nchildren: usize,
}

impl Links {
    /// The links of the `v`-th rank from `root` of `n` under `alg`.
    fn of(alg: Algorithm, v: u32, n: u32, root: u32) -> Self {
        let real = |x: u32| (x + root) % n;
        let mut l = Links { parent: None, children: [0; MAX_RANKS], nchildren: 0 };
        let (parent, first, last) = match alg {
            Algorithm::Direct if v == 0 => (None, 1, n - 1),
            Algorithm::Direct => (Some(0), 1, 0),
            Algorithm::Chain => (v.checked_sub(1), v + 1, v + 1),
            Algorithm::Tree => (v.checked_sub(1).map(|p| p / 2), 2 * v + 1, 2 * v + 2),
        };
        l.parent = parent.map(real);
        for x in first..=last.min(n - 1) {
            l.children[l.nchildren] = real(x);
            l.nchildren += 1;
        }
        l
    }
}

/// Moves the range in chunks of `chunk` bytes: per chunk, waits for it from the parent (if any), then puts it
/// with a signal to each child; then flushes the children's QPs.
///
/// # Safety
/// As [`broadcast`].
unsafe fn relay(c: &Comm<'_>, l: &Links, offset: u64, bytes: u64, chunk: u64) -> Result<()> {
    let children = &l.children[..l.nchildren];
    let mut done = 0;
    while done < bytes {
        let (off, len) = (offset + done, chunk.min(bytes - done));
        if let Some(p) = l.parent {
            // SAFETY: the caller's contract; this is the only channel alive.
            unsafe { c.channel(p) }.wait()?;
        }
        for &ch in children {
            // SAFETY: as above.
            unsafe { c.channel(ch) }.put_with_signal(off, off, len)?;
        }
        done += len;
    }
    for &ch in children {
        // SAFETY: as above.
        unsafe { c.channel(ch) }.flush()?;
    }
    Ok(())
}
