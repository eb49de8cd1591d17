//! Collectives (broadcast, all-to-all with variable sizes, reduce, all-reduce, the ring all-reduce): the
//! communicator handle the host builds (`gdaki::coll`) and device code takes (`gdaki_device::coll`). It names,
//! for each of up to [`MAX_RANKS`] ranks, a port channel to that peer, the rank's data buffer, and a small
//! control region per rank that the peers write into: the group-acknowledgment counter and the all-to-all count
//! matrix.

use crate::channel::PortChannelHandle;
use crate::handle::{MrHandle, RemoteMr};
use bytemuck::{Pod, Zeroable};

/// Most ranks a collective handle holds: its arrays have this many entries (8, so that one handle stays
/// under 2 KiB). A communicator of more ranks is refused by the host and by device code.
pub const MAX_RANKS: usize = 8;

/// Layout of a rank's control region ([`CollHandle::ctrl`]), byte offsets. 8-byte host-order words, all zero
/// when the host builds it.
pub mod ctrl {
    use super::MAX_RANKS;

    /// The group-acknowledgment counter: one `u64` that every receiver of a broadcast, and every peer of a
    /// reduce, this rank is the root of advances by 1 with an RDMA fetch-add. Monotone across calls, never
    /// reset.
    pub const ACK: u64 = 0;
    /// The all-to-all count matrix: [`MAX_RANKS`] rows of [`MAX_RANKS`] `u64`s; row `q`, column `p` is the
    /// number of bytes rank `q` sends to rank `p` in the current call (rank `q` puts its row here).
    pub const COUNTS: u64 = 64;
    /// Bytes of one row of the count matrix.
    pub const ROW_BYTES: u64 = 8 * MAX_RANKS as u64;
    /// Bytes of the whole region.
    pub const BYTES: u64 = COUNTS + ROW_BYTES * MAX_RANKS as u64;
}

/// One rank's view of a collective communicator, as device code uses it. 1,992 bytes, 8-byte aligned; built
/// by the host's `gdaki::coll::Collectives::handle`. Entry `rank` of the per-peer arrays, and every entry at
/// or beyond `nranks`, is all zero.
///
/// Every channel in `peers` runs in Device mode with Exclusive sharing: one thread of this rank posts to all
/// of them (a collective call is made by one thread).
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
#[repr(C)]
pub struct CollHandle {
    /// This rank, `0 .. nranks`.
    pub rank: u32,
    /// Ranks in the communicator, `1 ..= MAX_RANKS`.
    pub nranks: u32,
    /// Bound of every device-side wait of a collective call, ns (the channels carry the same bound).
    pub timeout_ns: u64,
    /// This rank's data buffer: what broadcast and all-to-all read from and write into (offsets count from
    /// its start). Every rank's buffer has the same length.
    pub buf: MrHandle,
    /// This rank's control region ([`ctrl`] layout, [`ctrl::BYTES`] bytes, 64-byte aligned, host memory the
    /// NIC writes directly: pinned and mapped into the GPU on `gpu`).
    pub ctrl: MrHandle,
    /// Address of this rank's expected acknowledgment count (one `u64`, device memory, initially 0): the
    /// root of a broadcast or a reduce adds `nranks - 1` to it, then waits until its [`ctrl::ACK`] counter reaches it.
    pub ack_expected: u64,
    /// Each peer's control region (entry `p`: rank `p`'s), the target of acknowledgments and count rows.
    pub peer_ctrl: [RemoteMr; MAX_RANKS],
    /// The port channel to each peer (entry `p`: to rank `p`): `dst` is rank `p`'s data buffer, `src` this
    /// rank's; its semaphore counts this pair's signals.
    pub peers: [PortChannelHandle; MAX_RANKS],
}

const _: () = {
    use core::mem::{offset_of, size_of};
    assert!(size_of::<CollHandle>() == 1992);
    assert!(offset_of!(CollHandle, buf) == 16);
    assert!(offset_of!(CollHandle, ctrl) == 40);
    assert!(offset_of!(CollHandle, peer_ctrl) == 72);
    assert!(offset_of!(CollHandle, peers) == 264);
};
