//! All-to-all with variable sizes (the MoE dispatch shape): every rank sends its own number of bytes to
//! every rank, and learns on the device how many bytes each rank sends it.

use super::{ctrl, disjoint, fits, Comm, BAD_REGIONS, MAX_RANKS};
use crate::channel::{Exclusive, PortChannel};
use crate::error::Result;
use crate::sync;
use gdaki_shared::coll::CollHandle;

/// Where one [`all_to_all_v`] call's data lies in every rank's data buffer (the same on every rank; a call
/// whose two regions overlap on any rank is refused by every rank).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllToAllV {
    /// Byte offset of the send region: the bytes for rank 0, then those for rank 1, and so on, packed
    /// (`send_counts[p]` bytes for rank `p`, this rank's own block included).
    pub send_offset: u64,
    /// Byte offset of the receive region: what rank 0 sent this rank, then what rank 1 sent, and so on,
    /// packed in rank order (`recv_counts[q]` bytes from rank `q`).
    pub recv_offset: u64,
}

/// Sends `send_counts[p]` bytes (any of them 0) of this rank's send region to every rank `p` and receives
/// every rank's bytes for this one into its receive region, packed by source rank; writes the byte counts
/// received into `recv_counts[..nranks]`. Every rank calls it with the same `a`, from one thread; the counts
/// are each rank's own.
///
/// The counts travel on the device: each rank puts its row of counts (`nranks` `u64`s) into row `rank` of
/// every peer's count matrix ([`ctrl::COUNTS`]) with a signal, and waits for every peer's row; then every
/// rank knows where its bytes go in each receiver's region (after those of the lower ranks), puts them with
/// a signal (a signal alone for 0 bytes), copies its own block locally, and waits for every peer's data.
/// Returns once every byte for this rank is in place and its own puts have completed.
///
/// # Errors
/// [`InvalidArgument::Collective`](crate::error::InvalidArgument::Collective) for a bad handle and
/// [`InvalidArgument::Regions`](crate::error::InvalidArgument::Regions) for count slices shorter than
/// `nranks` (nothing posted; peers that made a good call time out); `Regions`, once the counts have
/// arrived, on every rank alike with no data moved, when any rank's send or receive region lies outside
/// the buffer (its counts' sum overflowing included) or the two overlap (every rank checks every rank's
/// regions; the ranks still exchange a signal each, as a call of 0 bytes does, so that the next call finds
/// the semaphores matched);
/// [`Error::Timeout`](crate::Error::Timeout) with [`WaitOn::Peer`](crate::error::WaitOn::Peer) naming the
/// rank waited for; the channels' errors.
///
/// # Safety
/// As [`super::broadcast`].
pub unsafe fn all_to_all_v(h: &CollHandle, a: &AllToAllV, send_counts: &[u64], recv_counts: &mut [u64]) -> Result<()> {
    let c = Comm::new(h)?;
    let (r, n) = (c.rank as usize, c.n as usize);
    if send_counts.len() < n || recv_counts.len() < n {
        return Err(BAD_REGIONS);
    }
    // A send region outside the buffer (or counts whose sum overflows) is refused below with every other
    // rank's regions, by every rank alike, rather than here alone while the peers wait for this rank's row.
    let send_at = offsets(&send_counts[..n]);
    let row = ctrl::COUNTS + r as u64 * ctrl::ROW_BYTES;
    let word =
        |q: usize, p: usize| (h.ctrl.addr + ctrl::COUNTS + (q as u64) * ctrl::ROW_BYTES + 8 * p as u64) as *mut u64;
    for (p, &count) in send_counts[..n].iter().enumerate() {
        // SAFETY: row `r` of this rank's count matrix, inside the control region (the handle's contract);
        // only this thread writes it, and no peer reads it before the put below.
        unsafe { sync::store_volatile(word(r, p), count) };
    }
    // The NIC reads the row from host memory.
    sync::fence_release_sys();
    let peers = || (0..c.n).filter(|&p| p != c.rank);
    for p in peers() {
        let ch = c.ctrl_handle(p, false);
        // SAFETY: the caller's contract; the only channel of `p` alive.
        unsafe { PortChannel::<Exclusive>::new(&ch) }.put_with_signal(row, row, 8 * n as u64)?;
    }
    for p in peers() {
        // SAFETY: as above.
        unsafe { c.channel(p) }.wait()?;
    }
    // The whole matrix is read before any data goes: a peer that has this rank's data may start its next
    // call and overwrite its row.
    let count = |q: usize, p: usize| {
        if q == r {
            return send_counts[p];
        }
        // SAFETY: row `q` of the matrix, placed by the NIC before rank `q`'s signal, which the waits above saw.
        unsafe { sync::load_acquire_u64(word(q, p)) }
    };
    // Every rank reads the same matrix, so every rank takes the same decision on every rank's regions. A
    // refused call still makes its signals and waits with no data, as one of 0 bytes everywhere would: the
    // semaphores stay matched for the next call, and no rank starts that call (writing its row into the
    // others' matrices) before every rank has read this one's.
    let ok = send_at.is_some()
        && (0..n).all(|q| regions_ok(h.buf.length, a, (0..n).map(|p| count(q, p)), (0..n).map(|p| count(p, q))));
    let send_at = send_at.unwrap_or_default();
    let mut dst_at = [0u64; MAX_RANKS];
    let mut recv_at = [0u64; MAX_RANKS + 1];
    if ok {
        for (p, at) in dst_at[..n].iter_mut().enumerate() {
            // Rank `p` packs by source: this rank's block follows those of ranks `0 .. r` (no overflow: rank
            // `p`'s receive region fits the buffer).
            *at = (0..r).fold(a.recv_offset, |s, q| s.saturating_add(count(q, p)));
        }
        for (q, out) in recv_counts[..n].iter_mut().enumerate() {
            *out = count(q, r);
        }
        recv_at = offsets(&recv_counts[..n]).ok_or(BAD_REGIONS)?;
    }
    for p in peers() {
        let (pi, bytes) = (p as usize, if ok { send_counts[p as usize] } else { 0 });
        // SAFETY: as above.
        let mut ch = unsafe { c.channel(p) };
        if bytes == 0 {
            ch.signal()?;
        } else {
            ch.put_with_signal(dst_at[pi], a.send_offset + send_at[pi], bytes)?;
        }
    }
    let own = if ok { send_counts[r] as usize } else { 0 };
    if own > 0 {
        let base = h.buf.addr;
        // SAFETY: both ranges lie inside the data buffer and apart (`regions_ok`); no peer writes this rank's
        // own block.
        unsafe {
            core::ptr::copy(
                (base + a.send_offset + send_at[r]) as *const u8,
                (base + a.recv_offset + recv_at[r]) as *mut u8,
                own,
            )
        };
    }
    for p in peers() {
        // SAFETY: as above.
        unsafe { c.channel(p) }.wait()?;
    }
    for p in peers() {
        // SAFETY: as above.
        unsafe { c.channel(p) }.flush()?;
    }
    if ok {
        Ok(())
    } else {
        Err(BAD_REGIONS)
    }
}

/// Whether one rank's regions of a call are good, given the bytes it sends to each rank and receives from
/// each: both inside the data buffer of `len` bytes (every rank's has that length; the collectives' setup
/// requires it), and apart. A total that overflows is not.
fn regions_ok(len: u64, a: &AllToAllV, sent: impl Iterator<Item = u64>, received: impl Iterator<Item = u64>) -> bool {
    let (Some(sent), Some(received)) = (total(sent), total(received)) else {
        return false;
    };
    fits(len, a.send_offset, sent)
        && fits(len, a.recv_offset, received)
        && disjoint(a.send_offset, sent, a.recv_offset, received)
}

/// The sum of `counts`; `None` on overflow.
fn total(mut counts: impl Iterator<Item = u64>) -> Option<u64> {
    counts.try_fold(0u64, u64::checked_add)
}

/// The packed offsets of blocks of `counts` bytes: entry `i` is the sum of the first `i` counts, and entry
/// `counts.len()` the total; `None` on overflow.
fn offsets(counts: &[u64]) -> Option<[u64; MAX_RANKS + 1]> {
    let mut at = [0u64; MAX_RANKS + 1];
    for (i, &c) in counts.iter().enumerate() {
        at[i + 1] = at[i].checked_add(c)?;
    }
    Some(at)
}
