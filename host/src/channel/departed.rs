//! The words that tell device code a peer is gone: one per rank, in host memory mapped for device code, written
//! once the bootstrap session reports the rank's departure (or its own break) and a grace period has passed. A
//! channel's handle names its peer's word (`PortChannelHandle::departed`); a wait for the peer that is late
//! reads it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use gdaki_shared::channel::DEPARTED_BROKEN;

use crate::bootstrap::Bootstrap;
use crate::exec::Executor;
use crate::mem::MappedBuf;
use crate::Result;

/// How long after the session reports a departure the peer's word is written: time for what the peer sent
/// before it left to land (its last signal may still be on the NIC's wire when its goodbye arrives through the
/// session's), and far shorter than a wait's timeout (5 s for a channel by default).
pub const DEPARTURE_GRACE: Duration = Duration::from_millis(20);

/// One word per rank of the session, 8 bytes each: 0 while the rank is there, its rank plus one once it left,
/// that with [`DEPARTED_BROKEN`] once the session broke.
#[derive(Debug)]
pub(super) struct Departed {
    words: Arc<MappedBuf>,
}

impl Departed {
    /// Allocates the words (queue memory of `exec`: mapped for its device code) and has `boot` report to them.
    ///
    /// # Errors
    /// The executor's error allocating the words.
    pub(super) fn watch(boot: &Bootstrap, exec: &Executor) -> Result<Self> {
        let (me, world) = (boot.rank(), boot.world_size());
        let words = Arc::new(exec.queue_memory().alloc(8 * world as usize)?);
        let to_mark = words.clone();
        boot.on_departure(move |who| {
            // A broken session loses every other rank; this rank's own word is never read.
            let ranks: Vec<u32> = match who {
                Some(rank) => vec![rank],
                None => (0..world).filter(|&r| r != me).collect(),
            };
            let broken = who.is_none();
            // The grace runs on a thread of its own: the session's reader must not sleep.
            let (words, later) = (to_mark.clone(), ranks.clone());
            let spawned = std::thread::Builder::new().name("gdaki-departed".into()).spawn(move || {
                std::thread::sleep(DEPARTURE_GRACE);
                later.iter().for_each(|&r| mark(&words, r, broken));
            });
            if let Err(e) = spawned {
                tracing::debug!("gdaki: no thread for the departure grace ({e}); the words are written at once");
                ranks.iter().for_each(|&r| mark(&to_mark, r, broken));
            }
        });
        Ok(Self { words })
    }

    /// The device address of `peer`'s word.
    pub(super) fn addr(&self, peer: u32) -> u64 {
        self.words.device_addr() + 8 * peer as u64
    }
}

/// Writes `rank`'s word: its rank plus one, with [`DEPARTED_BROKEN`] when the session `broken`, with release
/// stores (device code reads it with an acquire load). A break marks only a word still 0: that the rank left,
/// heard first, says more (the break is then another rank's doing); a goodbye heard after a break replaces it.
fn mark(words: &MappedBuf, rank: u32, broken: bool) {
    // The bootstrap names only ranks of its world; a word past the buffer is never written all the same.
    if (rank as usize + 1) * 8 > words.len() {
        return;
    }
    // SAFETY: the 8-byte word of `rank` lies inside `words` (checked above; 8 bytes per rank, 4096-byte
    // aligned); the word is only accessed atomically, by this function and device code.
    let word = unsafe { AtomicU64::from_ptr(words.host_ptr().add(8 * rank as usize).cast()) };
    let left = rank as u64 + 1;
    if broken {
        let _ = word.compare_exchange(0, DEPARTED_BROKEN | left, Ordering::Release, Ordering::Relaxed);
    } else {
        word.store(left, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::{HostQueueMemory, QueueMemory};

    /// A rank's word is its rank plus one; a rank whose word lies past the buffer writes nothing.
    #[test]
    fn marks_only_words_inside_the_buffer() {
        let words = HostQueueMemory.alloc(4096).unwrap();
        let word = |i: usize| {
            // SAFETY: an aligned word inside the page, only accessed atomically here.
            unsafe { AtomicU64::from_ptr(words.host_ptr().add(8 * i).cast()) }.load(Ordering::Acquire)
        };
        mark(&words, 3, false);
        mark(&words, 512, false);
        mark(&words, 0xdead_beef, true);
        assert_eq!(
            (0..512).map(word).collect::<Vec<_>>(),
            (0..512).map(|i| if i == 3 { 4 } else { 0 }).collect::<Vec<_>>()
        );
    }
}
