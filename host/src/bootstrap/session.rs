//! A joined session: the collectives, and the reader threads that fill each rank's mailbox.

use std::collections::{HashMap, VecDeque};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytemuck::Pod;

use super::wire::{self, one_line, rank_list, Fields, FrameReader, Kind, WireError, MAX_FRAME};
use crate::{Error, Result};

/// The ranks of one session, connected as a TCP star through the root (rank 0), as MSCCL++'s
/// `TcpBootstrap` and NCCL's bootstrap ring are for exchanging connection info before the data path
/// exists. Built by [`Bootstrap::connect`] (or [`Bootstrap::root_on`]); it moves bytes only: QP info as
/// [`Endpoint::to_bytes`](crate::nic::emu::Endpoint::to_bytes) through [`all_gather`](Self::all_gather) or
/// [`send`](Self::send), MR info as a [`RemoteMr`](gdaki_shared::handle::RemoteMr) through
/// [`all_gather_pod`](Self::all_gather_pod) or [`send_pod`](Self::send_pod).
///
/// # Threading
/// Each rank runs one reader thread per connection (the root: one per other rank; the others: one, to the
/// root). A reader moves every arriving frame into the rank's mailbox, so a sender never waits for the
/// receiver to call [`recv`](Self::recv). The root's readers relay point-to-point frames to their
/// destination themselves, whatever the root's own thread is doing. Calls wait on the mailbox for at most
/// [`timeout`](Self::timeout), except that a rank other than the root waits for a collective's result a
/// quarter of it longer (at most 1 s more): the root gives up first, and its reason, naming the ranks it
/// waited for, reaches every rank. Writes use the timeout as the socket write timeout: a write that makes no
/// progress for that long cuts the connection and breaks the session, naming the peer. [`send`](Self::send) and
/// [`recv`](Self::recv) may be called from several threads at once; collectives
/// ([`all_gather`](Self::all_gather), [`barrier`](Self::barrier)) must be called in the same order on every
/// rank, from one thread at a time, as MPI's and NCCL's are.
///
/// # Leaving, and failures
/// Dropping a `Bootstrap` says goodbye on its connections, shuts its sockets down and joins its readers;
/// [`leave`](Bootstrap::leave) does the first two while the value lives on.
/// When a rank leaves so, the root tells the others: later `recv`s from it (once its queued messages are
/// taken), `send`s to it and collectives fail, naming it; everything else goes on. Since the root relays
/// everything, once it leaves no call that needs the network succeeds: end with a [`barrier`](Self::barrier)
/// so that it leaves last.
///
/// When a rank's connection ends without a goodbye (its process died) or breaks, or the rank stops in the middle of a
/// frame for longer than the timeout (a half-open connection: its host vanished, or it hangs mid-write), the root tells
/// every other rank, and every pending or later call on every rank fails with an error naming that rank (messages that
/// arrived before are still delivered). The same happens when the root dies, and when one of the root's collectives
/// fails. A rank whose collective gets no word from the root (a stopped or hung root: its connection stays open)
/// breaks its own session when it gives up, so that its later calls fail at once, naming the root. After an error,
/// drop the bootstrap.
pub struct Bootstrap {
    pub(super) rank: u32,
    pub(super) world_size: u32,
    pub(super) timeout: Duration,
    /// Number of the next collective (all the ranks count the same way, since they call them in order).
    pub(super) next_seq: AtomicU64,
    pub(super) shared: Arc<Shared>,
    pub(super) readers: Vec<JoinHandle<()>>,
}

/// What a rank's reader threads and its calls share.
pub(super) struct Shared {
    pub(super) rank: u32,
    /// The root's address, for messages.
    pub(super) root: String,
    /// The root: `links[r]` is the connection to rank `r` (`None` at 0). Other ranks: `links[0]` is the
    /// connection to the root and the rest are `None`. Its length is the world size.
    pub(super) links: Vec<Option<Link>>,
    pub(super) mailbox: Mutex<Mailbox>,
    pub(super) arrived: Condvar,
    /// Set by [`Bootstrap::leave`] (and so by the drop), so that readers that see their socket shut down leave
    /// quietly.
    pub(super) closing: AtomicBool,
    /// Root: whether an abort was sent already (only the first cause is).
    pub(super) aborted: AtomicBool,
    /// The session's [`timeout`](Bootstrap::timeout) in nanoseconds: also how long a frame may take from its
    /// first byte to its last before its sender counts as stalled.
    pub(super) stall_ns: AtomicU64,
}

/// One TCP connection of the star.
pub(super) struct Link {
    /// Writers take the lock for a whole frame, so that frames never interleave.
    pub(super) writer: Mutex<TcpStream>,
    /// Another handle on the socket, to shut it down without waiting for a writer.
    pub(super) closer: TcpStream,
}

/// Frames that arrived and were not asked for yet.
#[derive(Default)]
pub(super) struct Mailbox {
    /// Root only: contributions to all-gathers, by (sequence number, rank).
    gathers: HashMap<(u64, u32), Vec<u8>>,
    /// Non-root only: results of all-gathers, by sequence number.
    gathered: HashMap<u64, Vec<Vec<u8>>>,
    /// Point-to-point messages, by (source rank, tag), oldest first.
    p2p: HashMap<(u32, u32), VecDeque<Vec<u8>>>,
    /// Ranks that left the session on purpose, with the reason.
    gone: HashMap<u32, String>,
    /// Why the session is broken (the first cause), once it is.
    broken: Option<String>,
    /// Whether the watchers were told that the session broke (`None`: every other rank is lost to this one).
    /// Not so when the break is the root's goodbye ([`Shared::root_left`]): only rank 0 left then.
    lost: bool,
    /// Told of each departure ([`Bootstrap::on_departure`]).
    watchers: Vec<Arc<Departure>>,
}

/// A watcher of departures: `Some(rank)` for a rank gone, `None` for the session broken.
type Departure = dyn Fn(Option<u32>) + Send + Sync;

impl Mailbox {
    /// Fails when `rank` left the session.
    fn not_gone(&self, rank: u32) -> Result<(), String> {
        self.gone.get(&rank).map_or(Ok(()), |why| Err(why.clone()))
    }

    /// Records that `rank` left the session, telling the watchers the first time.
    fn mark_gone(&mut self, rank: u32, why: String) {
        if self.gone.insert(rank, why).is_none() {
            self.watchers.iter().for_each(|w| w(Some(rank)));
        }
    }
}

enum WaitError {
    TimedOut,
    Broken(String),
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic elsewhere while holding the lock leaves plain data behind; keep serving it.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    fn world_size(&self) -> u32 {
        self.links.len() as u32
    }

    /// How long a frame may take from its first byte to its last.
    fn stall(&self) -> Duration {
        Duration::from_nanos(self.stall_ns.load(Ordering::Relaxed))
    }

    /// Waits until `take` finds what it needs in the mailbox (`Ok(Some)`) or says it never will (`Err`, e.g.
    /// the rank it waits for left), the session breaks, or `deadline` passes.
    fn wait<T>(
        &self,
        deadline: Instant,
        mut take: impl FnMut(&mut Mailbox) -> Result<Option<T>, String>,
    ) -> Result<T, WaitError> {
        let mut mb = lock(&self.mailbox);
        loop {
            // What already arrived is delivered even after the session broke.
            if let Some(v) = take(&mut mb).map_err(WaitError::Broken)? {
                return Ok(v);
            }
            if let Some(why) = &mb.broken {
                return Err(WaitError::Broken(why.clone()));
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(WaitError::TimedOut);
            }
            mb = self.arrived.wait_timeout(mb, deadline - now).unwrap_or_else(PoisonError::into_inner).0;
        }
    }

    fn deliver(&self, src: u32, tag: u32, data: Vec<u8>) {
        lock(&self.mailbox).p2p.entry((src, tag)).or_default().push_back(data);
        self.arrived.notify_all();
    }

    /// Marks the session broken (keeping the first cause), tells the watchers once, and wakes every waiting
    /// call.
    fn break_session(&self, why: String) {
        let mut mb = lock(&self.mailbox);
        mb.broken.get_or_insert(why);
        if !mb.lost {
            mb.lost = true;
            mb.watchers.iter().for_each(|w| w(None));
        }
        drop(mb);
        self.arrived.notify_all();
    }

    /// Non-root: the root said goodbye. The session is broken (the root relays everything), but only rank 0
    /// left: the watchers hear of it alone, since the other ranks are still there and their QPs still reach
    /// this rank's.
    fn root_left(&self, why: String) {
        let mut mb = lock(&self.mailbox);
        mb.mark_gone(0, why.clone());
        mb.broken.get_or_insert(why);
        drop(mb);
        self.arrived.notify_all();
    }

    /// Writes one frame on the connection to `rank` (for a non-root: only 0 exists). A write that fails once
    /// bytes may have gone out (no progress within the socket's timeout: a peer that stopped reading; a reset)
    /// cuts the connection: the next frame would be read as the rest of the cut one, so the session breaks
    /// here, naming the peer, and the connection is shut down, as for a peer that died (the root tells the
    /// other ranks).
    fn write(&self, rank: u32, kind: Kind, parts: &[&[u8]]) -> Result<(), String> {
        let link = self.links.get(rank as usize).and_then(Option::as_ref);
        let link = link.ok_or_else(|| format!("no connection to rank {rank}"))?;
        // Checked first, so that every error of the write itself means a cut frame.
        wire::check_frame_len(parts.iter().map(|p| p.len()).sum::<usize>() + 4).map_err(|e| e.to_string())?;
        let Err(e) = wire::write_frame(&mut *lock(&link.writer), kind, parts) else { return Ok(()) };
        let what = match e.kind() {
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
                "timed out writing (the peer did not read)".to_string()
            }
            _ => e.to_string(),
        };
        // The reason first, then the shutdown: the reader that sees the connection end then finds the session
        // broken for this reason rather than giving its own ("closed the connection ... did it die?").
        if self.rank == 0 {
            self.abort(format!("rank {rank} stopped taking frames: {what}; the root cut its connection"), Some(rank));
        } else {
            self.break_session(format!(
                "the root at {} stopped taking frames: {what}; the connection is cut",
                self.root
            ));
        }
        let _ = link.closer.shutdown(Shutdown::Both);
        Err(format!("{what}; the connection is cut"))
    }

    /// Root: tells every other rank but `skip` why the session broke (once, for the first cause), then
    /// breaks it here. In that order: a call of ours that fails on it cannot return (and the root leave,
    /// saying goodbye) before the others got the reason. Once this rank has left, it only breaks it here.
    fn abort(&self, why: String, skip: Option<u32>) {
        if self.closing.load(Ordering::Acquire) {
            // This rank left ([`Bootstrap::leave`]) and its goodbye tells the others: a collective that another
            // of its threads was waiting in failed on that leaving. Its abort would race the goodbye, and a rank
            // that got it first would take every rank for lost, not only this one.
            self.break_session(why);
            return;
        }
        if self.aborted.swap(true, Ordering::AcqRel) {
            return;
        }
        for rank in (1..self.world_size()).filter(|&r| Some(r) != skip) {
            // Best effort: a rank we cannot tell learns from its own broken connection instead.
            let _ = self.write(rank, Kind::Abort, &[why.as_bytes()]);
        }
        self.break_session(why);
    }

    /// Root: the connection to `peer` ended without a goodbye, or is unusable.
    fn peer_lost(&self, peer: u32, why: String) {
        if self.closing.load(Ordering::Acquire) {
            return;
        }
        tracing::warn!("gdaki bootstrap root {}: {why}", self.root);
        if let Some(link) = self.links.get(peer as usize).and_then(Option::as_ref) {
            let _ = link.closer.shutdown(Shutdown::Both);
        }
        self.abort(why, Some(peer));
    }

    /// Root: rank `peer` said goodbye. The others learn it after every message `peer` sent them, since this
    /// runs on the thread that relays them.
    fn peer_left(&self, peer: u32) {
        if self.closing.load(Ordering::Acquire) {
            return;
        }
        let why = format!("rank {peer} left the session");
        tracing::debug!("gdaki bootstrap root {}: {why}", self.root);
        // The others first, as in `abort`.
        for rank in (1..self.world_size()).filter(|&r| r != peer) {
            // Best effort: a rank we cannot tell is gone itself.
            let _ = self.write(rank, Kind::Left, &[&peer.to_le_bytes(), why.as_bytes()]);
        }
        lock(&self.mailbox).mark_gone(peer, why);
        self.arrived.notify_all();
    }

    /// Root: one frame from rank `peer`.
    fn on_peer_frame(&self, peer: u32, kind: Kind, payload: Vec<u8>) -> Result<(), String> {
        match kind {
            Kind::Gather => {
                let mut f = Fields(&payload);
                let seq = f.u64("sequence number")?;
                let data = f.rest().to_vec();
                if lock(&self.mailbox).gathers.insert((seq, peer), data).is_some() {
                    return Err(format!("two contributions to all_gather #{seq}"));
                }
                self.arrived.notify_all();
            }
            Kind::P2p => {
                let mut f = Fields(&payload);
                let (src, dst, tag) = (f.u32("source")?, f.u32("destination")?, f.u32("tag")?);
                if src != peer {
                    return Err(format!("a message claims to come from rank {src}"));
                }
                if dst >= self.world_size() {
                    return Err(format!("a message to rank {dst}, out of range for world size {}", self.world_size()));
                }
                if dst == 0 {
                    self.deliver(src, tag, f.rest().to_vec());
                } else if let Err(why) = lock(&self.mailbox).not_gone(dst) {
                    // As a message to a process that exited: nobody will read it. The sender learns that
                    // `dst` left with its next call involving it.
                    tracing::debug!("gdaki bootstrap root {}: dropped a message from rank {peer}: {why}", self.root);
                } else if let Err(e) = self.write(dst, Kind::P2p, &[&payload]) {
                    self.peer_lost(dst, format!("rank {dst}: relaying a message from rank {peer} failed: {e}"));
                }
            }
            other => return Err(format!("unexpected {other:?} frame")),
        }
        Ok(())
    }

    /// Non-root: one frame from the root.
    fn on_root_frame(&self, kind: Kind, payload: &[u8]) -> Result<(), String> {
        let mut f = Fields(payload);
        match kind {
            Kind::Gathered => {
                let seq = f.u64("sequence number")?;
                let mut parts = Vec::with_capacity(self.world_size() as usize);
                for rank in 0..self.world_size() {
                    let len = f.u32("part length")? as usize;
                    parts.push(f.bytes(len, &format!("part of rank {rank}"))?.to_vec());
                }
                if !f.rest().is_empty() {
                    return Err(format!("all_gather #{seq} result has trailing bytes"));
                }
                lock(&self.mailbox).gathered.insert(seq, parts);
                self.arrived.notify_all();
            }
            Kind::P2p => {
                let (src, dst, tag) = (f.u32("source")?, f.u32("destination")?, f.u32("tag")?);
                if dst != self.rank || src >= self.world_size() {
                    return Err(format!("a message from rank {src} to rank {dst} reached rank {}", self.rank));
                }
                self.deliver(src, tag, f.rest().to_vec());
            }
            Kind::Abort => {
                self.break_session(format!("{} (reported by the root at {})", one_line(payload), self.root));
            }
            Kind::Left => {
                let rank = f.u32("rank")?;
                if rank >= self.world_size() || rank == self.rank {
                    return Err(format!("the root said that rank {rank} left, to rank {}", self.rank));
                }
                let why = format!("{} (reported by the root at {})", one_line(f.rest()), self.root);
                lock(&self.mailbox).mark_gone(rank, why);
                self.arrived.notify_all();
            }
            other => return Err(format!("unexpected {other:?} frame")),
        }
        Ok(())
    }
}

/// Root's reader for rank `peer`.
pub(super) fn serve_peer(shared: Arc<Shared>, peer: u32, stream: TcpStream) {
    let mut reader = FrameReader::new(stream);
    let why = loop {
        match reader.next(MAX_FRAME, shared.stall()) {
            Ok((Kind::Goodbye, _)) => return shared.peer_left(peer),
            Ok((kind, payload)) => {
                if let Err(e) = shared.on_peer_frame(peer, kind, payload) {
                    break format!("rank {peer} broke the protocol: {e}");
                }
            }
            Err(WireError::Closed) => {
                break format!("rank {peer} closed its connection without leaving the session (did it die?)")
            }
            Err(WireError::Malformed(e)) => break format!("rank {peer} sent a bad frame: {e}"),
            Err(e @ WireError::Stalled { .. }) => break format!("rank {peer} {e}"),
            Err(e) => break format!("rank {peer}: connection failed: {e}"),
        }
    };
    shared.peer_lost(peer, why);
}

/// A non-root rank's reader for its connection to the root.
pub(super) fn serve_root(shared: Arc<Shared>, stream: TcpStream) {
    let mut reader = FrameReader::new(stream);
    let root = &shared.root;
    let why = loop {
        match reader.next(MAX_FRAME, shared.stall()) {
            Ok((Kind::Goodbye, _)) => {
                if !shared.closing.load(Ordering::Acquire) {
                    shared.root_left(format!("the root (rank 0) at {root} left the session"));
                }
                return;
            }
            Ok((kind, payload)) => {
                if let Err(e) = shared.on_root_frame(kind, &payload) {
                    break format!("the root (rank 0) at {root} broke the protocol: {e}");
                }
            }
            Err(WireError::Closed) => {
                break format!(
                    "the root (rank 0) at {root} closed the connection without leaving the session (did it die?)"
                )
            }
            Err(WireError::Malformed(e)) => break format!("the root (rank 0) at {root} sent a bad frame: {e}"),
            Err(e @ WireError::Stalled { .. }) => break format!("the root (rank 0) at {root} {e}"),
            Err(e) => break format!("the connection to the root (rank 0) at {root} failed: {e}"),
        }
    };
    if !shared.closing.load(Ordering::Acquire) {
        shared.break_session(why);
    }
}

impl Bootstrap {
    /// This process's rank, `0..world_size()`; 0 is the root.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// Number of ranks in the session.
    pub fn world_size(&self) -> u32 {
        self.world_size
    }

    /// The root's address, `HOST:PORT`.
    pub fn root(&self) -> &str {
        &self.shared.root
    }

    /// How long one call waits (for the other ranks, or to write to a socket) before it fails.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Sets [`timeout`](Self::timeout) for later calls (initially the one given to `connect`; durations under
    /// 1 ms count as 1 ms).
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout.max(Duration::from_millis(1));
        self.shared.stall_ns.store(duration_ns(self.timeout), Ordering::Relaxed);
        for link in self.shared.links.iter().flatten() {
            let _ = lock(&link.writer).set_write_timeout(Some(self.timeout));
        }
    }

    /// Calls `f(Some(rank))` once for each rank that leaves the session (says goodbye; the root too: its
    /// goodbye breaks the session, but the other ranks are still there) and `f(None)` once if the session
    /// breaks otherwise (a rank or the root died, or one of the root's collectives failed: every rank is lost
    /// to this one), on the thread that learns it; for what happened before this call, at once. This
    /// process's own leaving (the drop) is not reported. `f` runs with the session's lock held: it must be
    /// quick and must not call this `Bootstrap`. The communicator uses it to end device-side waits for a rank
    /// that is gone.
    pub fn on_departure(&self, f: impl Fn(Option<u32>) + Send + Sync + 'static) {
        let f: Arc<Departure> = Arc::new(f);
        let mut mb = lock(&self.shared.mailbox);
        mb.gone.keys().for_each(|&rank| f(Some(rank)));
        if mb.lost {
            f(None);
        }
        mb.watchers.push(f);
    }

    /// Leaves the session now, as dropping it does, while this value lives on (MPI's `MPI_Finalize` before
    /// the process's memory goes): says goodbye on every connection and shuts the sockets down, so the peers
    /// learn at once that this rank left on purpose. Every later call that needs the network fails at once
    /// with "rank N left the session" (a message that arrived before is still delivered); a second `leave`,
    /// and the drop, which then only joins the reader threads, add nothing. Its own leaving is not reported to
    /// [`on_departure`](Self::on_departure)'s watchers. The root's leaving breaks the session for the others,
    /// as its drop does. A goodbye goes out between whole frames: when another thread of this rank is sending on
    /// a connection, `leave` waits for that send to end, which a peer that stopped reading (a stopped process)
    /// makes last up to [`timeout`](Self::timeout).
    pub fn leave(&self) {
        if self.shared.closing.swap(true, Ordering::AcqRel) {
            return;
        }
        // Before the goodbye, so that no call of this rank starts after the peers heard it. `lost` keeps a break
        // that the shut-down sockets cause from being reported as the others' departure.
        let mut mb = lock(&self.shared.mailbox);
        mb.broken.get_or_insert_with(|| format!("rank {} left the session", self.rank));
        mb.lost = true;
        drop(mb);
        self.shared.arrived.notify_all();
        for link in self.shared.links.iter().flatten() {
            // The goodbye tells the peer we left on purpose (not died); shutting the socket down wakes our
            // reader (its read returns 0). Both are best effort: the connection may be broken already.
            let _ = wire::write_frame(&mut *lock(&link.writer), Kind::Goodbye, &[]);
            let _ = link.closer.shutdown(Shutdown::Both);
        }
    }

    /// Whether this rank has left the session ([`Bootstrap::leave`]).
    pub(crate) fn has_left(&self) -> bool {
        self.shared.closing.load(Ordering::Acquire)
    }

    fn err(&self, what: &str, why: impl std::fmt::Display) -> Error {
        Error::Bootstrap(format!("rank {}: {what}: {why}", self.rank))
    }

    fn check_peer(&self, peer: u32, what: &str) -> Result<()> {
        if peer >= self.world_size {
            return Err(self.err(what, format!("rank {peer} is out of range for world size {}", self.world_size)));
        }
        Ok(())
    }

    /// Fails when the session is broken, or when `peer` (if any) left it.
    fn check_unbroken(&self, what: &str, peer: Option<u32>) -> Result<()> {
        let mb = lock(&self.shared.mailbox);
        match (&mb.broken, peer) {
            (Some(why), _) => Err(self.err(what, why)),
            (None, Some(peer)) => mb.not_gone(peer).map_err(|why| self.err(what, why)),
            (None, None) => Ok(()),
        }
    }

    /// Every rank contributes `mine`; every rank gets all contributions, indexed by rank (as
    /// `MPI_Allgatherv` / MSCCL++'s `Bootstrap::allGather`, with sizes that may differ per rank). The root
    /// collects the contributions and sends the result back; the sum of all contributions plus 4 bytes per
    /// rank and 12 bytes must fit [`MAX_FRAME`].
    ///
    /// # Errors
    /// [`Error::Bootstrap`] when the session is broken (naming the rank at fault), when it takes longer than
    /// [`timeout`](Self::timeout) (the root names the ranks it waited for, and tells the others; they wait for
    /// that up to a quarter of the timeout longer, at most 1 s), or when the result is too large. A rank other
    /// than the root that hears nothing from the root by then breaks its session: the root is not answering,
    /// and every later call of this rank fails at once saying so.
    pub fn all_gather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.gather(mine, None)
    }

    /// [`all_gather`](Self::all_gather) for the call named `call` (its errors name that call, then the
    /// all_gather it is made of), or for `all_gather` itself.
    fn gather(&self, mine: &[u8], call: Option<&str>) -> Result<Vec<Vec<u8>>> {
        let seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
        let what = match call {
            Some(c) => format!("{c} (all_gather #{seq})"),
            None => format!("all_gather #{seq}"),
        };
        self.check_unbroken(&what, None)?;
        let deadline = crate::deadline::after(self.timeout);
        let n = self.world_size;
        if n == 1 {
            // The result frame it would be with peers (kind, sequence number, one length and part): the same
            // limit in a world of one.
            wire::check_frame_len(16usize.saturating_add(mine.len())).map_err(|e| self.err(&what, e))?;
            return Ok(vec![mine.to_vec()]);
        }
        if self.rank != 0 {
            let root = &self.shared.root;
            self.shared
                .write(0, Kind::Gather, &[&seq.to_le_bytes(), mine])
                .map_err(|e| self.err(&what, format!("sending to the root at {root}: {e}")))?;
            // The root's verdict, when it gives up at its own deadline, is worth the wait.
            let deadline = deadline.checked_add(verdict_grace(self.timeout)).unwrap_or(deadline);
            let parts = self.shared.wait(deadline, |mb| Ok(mb.gathered.remove(&seq))).map_err(|e| match e {
                WaitError::TimedOut => {
                    // The root gives up at its own deadline and tells every rank why: no word from it within
                    // the grace past that means the root itself stopped answering (a stopped or hung process,
                    // whose connection stays open, so no reader notices). Every later call goes through it and
                    // would wait out its whole timeout again: break the session here, as the root breaks it
                    // when its own collective fails.
                    self.shared.break_session(format!(
                        "the root (rank 0) at {root} gave no result of {what} within {:?} (is it stopped or hung?)",
                        self.timeout
                    ));
                    self.err(
                        &what,
                        format!(
                            "timed out after {:?} waiting for the root at {root} to gather every rank",
                            self.timeout
                        ),
                    )
                }
                WaitError::Broken(why) => self.err(&what, why),
            })?;
            // The root echoes our own part: a mismatch means the ranks called collectives in different orders.
            if parts.get(self.rank as usize).map(Vec::as_slice) != Some(mine) {
                return Err(self.err(
                    &what,
                    "the root's result holds other bytes for this rank (collectives called in different orders?)",
                ));
            }
            return Ok(parts);
        }

        let mut missing = Vec::new();
        let others = self.shared.wait(deadline, |mb| {
            missing = (1..n).filter(|&r| !mb.gathers.contains_key(&(seq, r))).collect();
            if !missing.is_empty() {
                missing.iter().try_for_each(|&r| mb.not_gone(r))?;
                return Ok(None);
            }
            Ok(Some((1..n).map(|r| mb.gathers.remove(&(seq, r)).unwrap_or_default()).collect::<Vec<_>>()))
        });
        let others = match others {
            Ok(others) => others,
            Err(WaitError::Broken(why)) => {
                // The others wait for our result: tell them (a no-op when the session is broken already).
                self.shared.abort(format!("rank 0: {what}: {why}"), None);
                return Err(self.err(&what, why));
            }
            Err(WaitError::TimedOut) => {
                let why = format!("timed out after {:?} waiting for ranks {}", self.timeout, rank_list(&missing));
                self.shared.abort(format!("rank 0: {what}: {why}"), None);
                return Err(self.err(&what, why));
            }
        };
        let mut parts = Vec::with_capacity(n as usize);
        parts.push(mine.to_vec());
        parts.extend(others);
        let mut payload = Vec::with_capacity(8 + parts.iter().map(|p| 4 + p.len()).sum::<usize>());
        payload.extend_from_slice(&seq.to_le_bytes());
        for p in &parts {
            payload.extend_from_slice(&(p.len() as u32).to_le_bytes());
            payload.extend_from_slice(p);
        }
        for rank in 1..n {
            if let Err(e) = self.shared.write(rank, Kind::Gathered, &[&payload]) {
                let why = format!("sending the result to rank {rank} failed: {e}");
                self.shared.abort(format!("rank 0: {what}: {why}"), None);
                return Err(self.err(&what, why));
            }
        }
        Ok(parts)
    }

    /// Returns once every rank has called it (as `MPI_Barrier` / MSCCL++'s `Bootstrap::barrier`): an
    /// [`all_gather`](Self::all_gather) of nothing.
    ///
    /// # Errors
    /// As [`all_gather`](Self::all_gather).
    pub fn barrier(&self) -> Result<()> {
        self.gather(&[], Some("barrier")).map(drop)
    }

    /// Sends `data` to rank `peer` with `tag`, relayed by the root (as MSCCL++'s `Bootstrap::send`). Returns
    /// once the frame is written to the socket, without waiting for `peer` to receive it. Messages from one
    /// rank with one tag arrive in order. Sending to oneself is allowed.
    ///
    /// # Errors
    /// [`Error::Bootstrap`] when `peer` is out of range, the frame exceeds [`MAX_FRAME`] (`data` plus
    /// 16 bytes), the session is broken, or the write fails or takes longer than [`timeout`](Self::timeout).
    pub fn send(&self, peer: u32, tag: u32, data: &[u8]) -> Result<()> {
        let what = format!("send to rank {peer} tag {tag}");
        self.check_peer(peer, &what)?;
        self.check_unbroken(&what, Some(peer))?;
        if peer == self.rank {
            // The frame it would be to another rank (kind, source, destination, tag, data): the same limit.
            wire::check_frame_len(16usize.saturating_add(data.len())).map_err(|e| self.err(&what, e))?;
            self.shared.deliver(peer, tag, data.to_vec());
            return Ok(());
        }
        let via = if self.rank == 0 { peer } else { 0 };
        let header = [self.rank.to_le_bytes(), peer.to_le_bytes(), tag.to_le_bytes()].concat();
        self.shared.write(via, Kind::P2p, &[&header, data]).map_err(|e| match via {
            0 => self.err(&what, format!("via the root at {}: {e}", self.shared.root)),
            _ => self.err(&what, e),
        })
    }

    /// Receives the oldest message from rank `peer` with `tag` (as MSCCL++'s `Bootstrap::recv`). Messages
    /// with other tags, or from other ranks, stay queued for their own `recv`.
    ///
    /// # Errors
    /// [`Error::Bootstrap`] naming `peer` and `tag` when no such message arrives within
    /// [`timeout`](Self::timeout), when the session breaks first (naming the rank at fault), or when `peer`
    /// is out of range.
    pub fn recv(&self, peer: u32, tag: u32) -> Result<Vec<u8>> {
        self.recv_if(peer, tag, |_| Ok(()))
    }

    /// As [`recv`](Self::recv), but the oldest message is taken only if `accept` takes it; otherwise it stays
    /// queued (a later `recv` of the right shape still gets it) and `accept`'s error is returned.
    fn recv_if(&self, peer: u32, tag: u32, accept: impl Fn(&[u8]) -> Result<()>) -> Result<Vec<u8>> {
        let what = format!("recv from rank {peer} tag {tag}");
        self.check_peer(peer, &what)?;
        let deadline = crate::deadline::after(self.timeout);
        self.shared
            .wait(deadline, |mb| {
                let Some(queue) = mb.p2p.get_mut(&(peer, tag)) else {
                    return mb.not_gone(peer).map(|()| None);
                };
                // A queue in the map is never empty (it leaves the map with its last message).
                if let Some(Err(refused)) = queue.front().map(|m| accept(m)) {
                    return Ok(Some(Err(refused)));
                }
                let msg = queue.pop_front();
                if queue.is_empty() {
                    mb.p2p.remove(&(peer, tag));
                }
                Ok(msg.map(Ok))
            })
            .map_err(|e| match e {
                WaitError::TimedOut => self.err(&what, format!("timed out after {:?}", self.timeout)),
                WaitError::Broken(why) => self.err(&what, why),
            })?
    }

    /// [`all_gather`](Self::all_gather) of one plain-old-data value per rank (e.g. a [`RemoteMr`](gdaki_shared::handle::RemoteMr)).
    ///
    /// # Errors
    /// As [`all_gather`](Self::all_gather), and when a rank contributed a different number of bytes than
    /// `size_of::<T>()`.
    pub fn all_gather_pod<T: Pod>(&self, mine: &T) -> Result<Vec<T>> {
        let parts = self.all_gather(bytemuck::bytes_of(mine))?;
        parts.iter().enumerate().map(|(rank, p)| self.pod(p, rank as u32, "all_gather_pod")).collect()
    }

    /// [`send`](Self::send) of one plain-old-data value.
    ///
    /// # Errors
    /// As [`send`](Self::send).
    pub fn send_pod<T: Pod>(&self, peer: u32, tag: u32, value: &T) -> Result<()> {
        self.send(peer, tag, bytemuck::bytes_of(value))
    }

    /// [`recv`](Self::recv) of one plain-old-data value.
    ///
    /// # Errors
    /// As [`recv`](Self::recv), and when the message is not `size_of::<T>()` bytes long; that message stays
    /// queued, so a `recv` (or a `recv_pod` of the right type) still gets it.
    pub fn recv_pod<T: Pod>(&self, peer: u32, tag: u32) -> Result<T> {
        let what = format!("recv_pod tag {tag}");
        let bytes = self.recv_if(peer, tag, |m| self.pod::<T>(m, peer, &what).map(drop))?;
        self.pod(&bytes, peer, &what)
    }

    fn pod<T: Pod>(&self, bytes: &[u8], from: u32, what: &str) -> Result<T> {
        if bytes.len() != size_of::<T>() {
            let ty = std::any::type_name::<T>();
            let got = bytes.len();
            return Err(self.err(what, format!("rank {from} sent {got} bytes, expected {} for {ty}", size_of::<T>())));
        }
        Ok(bytemuck::pod_read_unaligned(bytes))
    }
}

/// How much longer than the root a rank waits for a collective's result: a quarter of the timeout, at most 1 s.
fn verdict_grace(timeout: Duration) -> Duration {
    (timeout / 4).min(Duration::from_secs(1))
}

/// `d` in nanoseconds, saturating (a timeout of centuries is as good as none).
pub(super) fn duration_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Drop for Bootstrap {
    fn drop(&mut self) {
        self.leave();
        for reader in self.readers.drain(..) {
            let _ = reader.join();
        }
    }
}

impl std::fmt::Debug for Bootstrap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bootstrap")
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .field("root", &self.shared.root)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}
