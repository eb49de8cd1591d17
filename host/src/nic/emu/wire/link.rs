//! Connections between QPs of different NICs: the links, the dialer, the hello handshake, and the reader
//! threads that turn the byte stream into frames for the executor (the listener is [`super::acceptor`]).
//!
//! Threads here never touch memory, CQEs or QP state: they hand complete frames (and "connection lost") to
//! the executor through the NIC's inbound queue ([`Mailbox`]) and wake it. They hold a [`Link`] (sockets
//! only), never a QP nor the NIC's shared state (the acceptor's hello threads, [`super::acceptor`], hold a
//! `Weak` reference to it), so that a QP's queue memory is still freed by the thread that destroys it.
//!
//! # Backpressure, and why it cannot deadlock
//!
//! The inbound queue holds at most [`WireConfig::inbound_bytes`](super::WireConfig::inbound_bytes) of frames. A
//! reader whose frame does not fit waits for the executor to take some; meanwhile it reads nothing more from its
//! socket, so the peer's kernel buffers fill and the peer's NIC stops being able to write: TCP's flow control, end
//! to end, and never more memory than the bound. Readers, dialers and the acceptor's hello threads put into the queue; only the
//! executor takes from it, and the executor never puts into it.
//!
//! A wait is only safe if what it waits for never waits back. A reader waits for its executor's next pass. The
//! executor waits for nothing on the network: its writes are non-blocking ([`Link::try_send`]); what a socket does
//! not take stays in the QP's outbox, and while a QP's outbox is full the QP produces nothing more (it takes no new
//! WQE, sends no further chunk of a WRITE, generates no further READ response: see [`super::requester`] and
//! [`super::responder`]), so that the outbox stays bounded too. Every inbound frame can be handled without room to
//! send (a WRITE is placed, a READ or atomic request becomes a small record of the response due, bounded by
//! [`super::packet::MAX_RD_ATOMIC`]; a response only completes WQEs). So the executor always comes back for the
//! queue, within one pass, whatever its peers do, and no chain of waits (reader → executor → peer's reader → peer's
//! executor → ...) can close into a cycle, on one NIC or across NICs. A peer that stops reading for
//! [`WireConfig::retry_timeout`](super::WireConfig::retry_timeout) fails its QP (0x15), as before.

use std::io::{self, BufRead, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

use super::packet::{self, reject, Packet, HEADER, MAX_FRAME, VERSION};
use crate::deadline::{self, ReadBy};
use crate::nic::emu::guard::lock;
use crate::nic::emu::qp::Endpoint;

/// What reader threads hand to the executor.
#[derive(Debug)]
pub(crate) enum Inbound {
    /// One frame body (length prefix removed, at most [`MAX_FRAME`] bytes) for local QP `qpn`.
    Frame { qpn: u32, body: Vec<u8> },
    /// The connection of local QP `qpn` is gone (or never came up).
    Down { qpn: u32, reason: String },
    /// The peer's offered allocation `handle` was mapped here (`mapped`), or could not be: local QP `qpn`
    /// answers the offer ([`super::requester::on_offer`]).
    Mapped { qpn: u32, handle: [u8; crate::mem::EXPORT_HANDLE_BYTES], mapped: bool },
}

/// What one queued message counts against [`WireConfig::inbound_bytes`](super::WireConfig::inbound_bytes): its bytes
/// plus this, for the message itself and the allocation around them (so that many tiny frames are bounded too).
const MESSAGE_OVERHEAD: usize = 64;

impl Inbound {
    /// Bytes this message counts for in the inbound queue.
    pub(crate) fn cost(&self) -> usize {
        MESSAGE_OVERHEAD
            + match self {
                Inbound::Frame { body, .. } => body.len(),
                Inbound::Down { reason, .. } => reason.len(),
                Inbound::Mapped { handle, .. } => handle.len(),
            }
    }
}

const CONNECTING: u8 = 0;
const UP: u8 = 1;
const DOWN: u8 = 2;
/// An accepted hello took the link ([`Link::claim`]) and is answering it: a second hello is refused.
const ACCEPTING: u8 = 3;

/// How long an accepted connection may take to say hello.
pub(super) const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// Pause between two dial attempts, and between two looks for the local QP during a hello.
pub(super) const RETRY_PAUSE: Duration = Duration::from_millis(5);

/// The connection of one QP to its peer on another NIC.
#[derive(Debug)]
pub(crate) struct Link {
    /// This QP.
    pub local: Endpoint,
    /// The peer QP.
    pub remote: Endpoint,
    state: AtomicU8,
    /// Write side of the connection, once up. The executor is the only writer.
    stream: Mutex<Option<TcpStream>>,
    /// Set when the QP is destroyed: the threads stop, and losing the connection is no longer news.
    closed: AtomicBool,
    /// Why the connection went down, once the executor took it down (for
    /// [`Qp::wire_error`](crate::nic::emu::Qp::wire_error)).
    error: Mutex<Option<String>>,
    /// Why the dialer's latest attempt did not connect, while it keeps trying (the error of `connect`, or of
    /// the hello's exchange, or the peer's "not connected back yet"): the timeout of a link that never came up
    /// names it.
    last_try: Mutex<Option<String>>,
}

impl Link {
    pub(crate) fn new(local: Endpoint, remote: Endpoint) -> Self {
        Self {
            local,
            remote,
            state: AtomicU8::new(CONNECTING),
            stream: Mutex::new(None),
            closed: AtomicBool::new(false),
            error: Mutex::new(None),
            last_try: Mutex::new(None),
        }
    }

    /// Why the dialer's latest attempt failed, if this end dials and one did.
    pub(crate) fn last_try(&self) -> Option<String> {
        lock(&self.last_try).clone()
    }

    /// Records why the connection went down (the first reason only).
    pub(crate) fn set_error(&self, reason: &str) {
        lock(&self.error).get_or_insert_with(|| reason.to_string());
    }

    /// Why the connection went down, if it did.
    pub(crate) fn error(&self) -> Option<String> {
        lock(&self.error).clone()
    }

    /// Whether this end dials (the smaller `(nic, qpn)`); the other end waits for the hello.
    pub(crate) fn dials(&self) -> bool {
        (self.local.nic, self.local.qpn) < (self.remote.nic, self.remote.qpn)
    }

    pub(crate) fn is_up(&self) -> bool {
        self.state.load(Ordering::Acquire) == UP
    }

    /// Takes a link that has not come up yet (nor gone down, nor been taken by another hello) for the hello
    /// being answered, so that a second hello, even one that arrives before the answer goes out, finds it
    /// taken. Returns whether it took it.
    pub(super) fn claim(&self) -> bool {
        !self.is_closed()
            && self.state.compare_exchange(CONNECTING, ACCEPTING, Ordering::AcqRel, Ordering::Acquire).is_ok()
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Whether the connection is gone (lost, refused for good, or closed after a failed send).
    pub(crate) fn is_down(&self) -> bool {
        self.state.load(Ordering::Acquire) == DOWN
    }

    /// Makes `stream` the write side of a link being connected (the dialer's) or claimed (the acceptor's).
    /// Fails when the link was already up or is down or closed.
    pub(super) fn set_up(&self, stream: TcpStream) -> bool {
        let mut s = lock(&self.stream);
        if self.is_closed() || !matches!(self.state.load(Ordering::Acquire), CONNECTING | ACCEPTING) {
            return false;
        }
        *s = Some(stream);
        self.state.store(UP, Ordering::Release);
        true
    }

    pub(super) fn set_down(&self) {
        self.state.store(DOWN, Ordering::Release);
        if let Some(s) = lock(&self.stream).take() {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    /// Writes as much of `bytes` as the socket takes now, without waiting, and returns how much that was (0
    /// when its buffer is full: the peer is not reading fast enough, or not at all). Never blocks, so that the
    /// executor, the only writer, never waits for a peer (see the module docs).
    pub(crate) fn try_send(&self, bytes: &[u8]) -> io::Result<usize> {
        use std::os::fd::AsRawFd;
        let s = lock(&self.stream);
        let Some(stream) = s.as_ref() else {
            return Err(io::Error::new(io::ErrorKind::NotConnected, "link is not up"));
        };
        loop {
            // SAFETY: `bytes` is valid for reads of `bytes.len()` bytes; the descriptor is this socket's, open
            // while the lock keeps `stream` in place. MSG_DONTWAIT makes this one call non-blocking without
            // O_NONBLOCK (which the reader's clone of the socket would share); MSG_NOSIGNAL turns a reset
            // connection into EPIPE instead of SIGPIPE.
            let n = unsafe {
                libc::send(
                    stream.as_raw_fd(),
                    bytes.as_ptr().cast(),
                    bytes.len(),
                    libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                )
            };
            if n >= 0 {
                return Ok(n as usize);
            }
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::WouldBlock => return Ok(0),
                io::ErrorKind::Interrupted => continue,
                _ => return Err(e),
            }
        }
    }

    /// Closes the connection for good (QP destroyed): the peer sees it end, the threads stop.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.set_down();
    }

    /// Closes the connection for good once `rest` (what the socket did not take of the QP's last frames) is
    /// written: a thread of its own writes it, waiting up to `timeout` for the peer to take it (a peer that
    /// takes nothing for that long is dead by the wire's rule), then ends the connection as [`Link::close`]
    /// does. The executor hands its last bytes over instead of writing them itself, as it never waits for a
    /// peer (see the module docs). The link counts as closed at once: nothing else writes to it.
    pub(crate) fn close_after(&self, rest: Vec<u8>, timeout: Duration) {
        let stream = {
            let mut s = lock(&self.stream);
            self.closed.store(true, Ordering::Release);
            self.state.store(DOWN, Ordering::Release);
            s.take()
        };
        let Some(stream) = stream else { return };
        // A second handle for the thread: if it cannot start, this one still ends the connection (dropping a
        // handle alone would not, as the reader thread holds another).
        let spawned = stream.try_clone().is_ok_and(|mut w| {
            let name = format!("emu-wire-last-{:x}", self.local.qpn);
            thread::Builder::new()
                .name(name)
                .spawn(move || {
                    let _ = w.set_write_timeout(Some(socket_timeout(timeout))).and_then(|()| w.write_all(&rest));
                    let _ = w.shutdown(Shutdown::Both);
                })
                .is_ok()
        });
        if !spawned {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }
}

/// Where reader threads deliver, and how they wake the executor.
#[derive(Clone, Debug)]
pub(crate) struct Mailbox {
    pub tx: Sender<Inbound>,
    pub executor: Thread,
    /// How much the queue holds, bounded by [`WireConfig::inbound_bytes`](super::WireConfig::inbound_bytes).
    pub inflow: Arc<Inflow>,
}

impl Mailbox {
    /// Queues `m` for the executor, first waiting (see [`Inflow::admit`]) while the queue is too full to take
    /// it. Returns false when the executor is gone (the NIC was dropped): the caller stops.
    pub(crate) fn post(&self, m: Inbound) -> bool {
        let cost = m.cost();
        if !self.inflow.admit(cost, &self.executor) {
            return false;
        }
        // The executor owns the receiver for the NIC's lifetime; a send error means the NIC is gone.
        if self.tx.send(m).is_err() {
            self.inflow.release(cost);
            return false;
        }
        self.executor.unpark();
        true
    }
}

/// The inbound queue's fill level in bytes ([`Inbound::cost`]), and the wait of readers for room.
///
/// Readers add before they queue a message and the executor subtracts once it has handled it. A reader whose
/// message does not fit waits on `room`, in arrival order (tickets), so that a large frame is not overtaken
/// for ever by small ones: while any reader waits, no other reader takes room without waiting its turn, and
/// the first in line is taken once its message fits, at the latest when the queue is empty. The executor
/// signals `room` after subtracting whenever a reader waits. No wake-up is lost: a reader announces itself in
/// `waiting` before it checks the level (both sequentially consistent), so an executor that subtracted after
/// that check sees the announcement and signals, under the lock the reader holds from its check until it
/// sleeps.
#[derive(Debug)]
pub(crate) struct Inflow {
    cap: usize,
    queued: AtomicUsize,
    /// Readers waiting for room.
    waiting: AtomicUsize,
    /// The waiters' order.
    line: Mutex<Tickets>,
    room: Condvar,
    /// Set when the executor exits: waiting readers give up.
    stopped: AtomicBool,
    /// Most bytes queued at once.
    peak: AtomicUsize,
    /// Times a reader had to wait for room.
    waits: AtomicU64,
}

/// The next ticket to hand out, and the ticket whose holder may take room now.
#[derive(Debug, Default)]
struct Tickets {
    next: u64,
    serving: u64,
}

impl Inflow {
    /// A queue of at most `cap` bytes (one message is always taken into an empty queue).
    pub(crate) fn new(cap: usize) -> Inflow {
        Inflow {
            cap,
            queued: AtomicUsize::new(0),
            waiting: AtomicUsize::new(0),
            line: Mutex::new(Tickets::default()),
            room: Condvar::new(),
            stopped: AtomicBool::new(false),
            peak: AtomicUsize::new(0),
            waits: AtomicU64::new(0),
        }
    }

    /// Reserves `cost` bytes, waiting its turn while they do not fit. Returns false when the executor
    /// stopped.
    fn admit(&self, cost: usize, executor: &Thread) -> bool {
        if self.waiting.load(Ordering::SeqCst) == 0 && self.try_reserve(cost) {
            return true;
        }
        self.waits.fetch_add(1, Ordering::Relaxed);
        self.waiting.fetch_add(1, Ordering::SeqCst);
        // The executor may be asleep between passes: the queue is full, so it has work.
        executor.unpark();
        let mut line = lock(&self.line);
        let ticket = line.next;
        line.next += 1;
        let admitted = loop {
            if self.stopped.load(Ordering::SeqCst) {
                break false;
            }
            if line.serving == ticket && self.try_reserve(cost) {
                break true;
            }
            // The timeout only bounds a wait for `stopped`, which is signalled too; room is always signalled.
            line = self.room.wait_timeout(line, Duration::from_millis(100)).unwrap_or_else(|e| e.into_inner()).0;
        };
        line.serving += 1;
        drop(line);
        // The next in line may fit too.
        self.room.notify_all();
        self.waiting.fetch_sub(1, Ordering::SeqCst);
        admitted
    }

    fn try_reserve(&self, cost: usize) -> bool {
        let mut cur = self.queued.load(Ordering::SeqCst);
        loop {
            if cur > 0 && cur + cost > self.cap {
                return false;
            }
            match self.queued.compare_exchange_weak(cur, cur + cost, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => {
                    // Written only when it grows: the line is shared with the executor's releases.
                    if self.peak.load(Ordering::Relaxed) < cur + cost {
                        self.peak.fetch_max(cur + cost, Ordering::Relaxed);
                    }
                    return true;
                }
                Err(now) => cur = now,
            }
        }
    }

    /// The executor handled messages of `cost` bytes in all.
    pub(crate) fn release(&self, cost: usize) {
        self.queued.fetch_sub(cost, Ordering::SeqCst);
        if self.waiting.load(Ordering::SeqCst) > 0 {
            let _line = lock(&self.line);
            self.room.notify_all();
        }
    }

    /// The executor exited: nothing will be taken any more.
    pub(crate) fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        let _line = lock(&self.line);
        self.room.notify_all();
    }

    /// Bytes queued now, the most queued at once, and how many times a reader waited for room.
    pub(crate) fn levels(&self) -> (usize, usize, u64) {
        (self.queued.load(Ordering::Relaxed), self.peak.load(Ordering::Relaxed), self.waits.load(Ordering::Relaxed))
    }
}

/// How long a reader polls its socket without blocking before it sleeps in `read`: a packet that arrives within
/// this time is picked up without a scheduler wake-up (several µs on a busy host), as the executor's own idle
/// loop spins before it sleeps.
const SPIN_READ: Duration = Duration::from_micros(100);

/// A socket read that polls (non-blocking `recv`, yielding between tries) for [`SPIN_READ`] before it blocks.
/// Polls with `MSG_DONTWAIT` per call rather than `O_NONBLOCK`, which the write side (a clone of the same
/// socket) would share. With a `deadline` (inside a frame), no read waits past it: it fails with `TimedOut`.
struct SpinRead {
    stream: TcpStream,
    deadline: Option<Instant>,
    /// Whether the socket has a read timeout set now.
    timed: bool,
}

impl Read for SpinRead {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        use std::os::fd::AsRawFd;
        let start = Instant::now();
        loop {
            // SAFETY: `buf` is valid for writes of `buf.len()` bytes; the descriptor is this socket's, open
            // while `self` lives.
            let n =
                unsafe { libc::recv(self.stream.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
            if n >= 0 {
                return Ok(n as usize);
            }
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::WouldBlock if start.elapsed() < SPIN_READ => thread::yield_now(),
                io::ErrorKind::WouldBlock => return self.blocking_read(buf),
                io::ErrorKind::Interrupted => {}
                _ => return Err(e),
            }
        }
    }
}

impl SpinRead {
    fn blocking_read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let Some(d) = self.deadline else {
            if self.timed {
                self.stream.set_read_timeout(None)?;
                self.timed = false;
            }
            return self.stream.read(buf);
        };
        self.timed = true;
        ReadBy { stream: &self.stream, deadline: d }.read(buf)
    }
}

/// Why a frame could not be read.
enum FrameError {
    /// The connection ended between frames.
    Closed,
    /// A frame began, and `got` of its `of` bytes (length prefix included; `None` while the prefix itself was
    /// incomplete) came before the stall bound passed.
    Stalled { got: usize, of: Option<usize> },
    /// The length prefix is out of range, or the socket failed (including an end in the middle of a frame).
    Io(io::Error),
}

/// Reads one frame body into `buf`, refusing a length outside `HEADER..=MAX_FRAME` before allocating. Waits
/// for the frame's first byte as long as it takes (an idle link is silent); the rest must then come within
/// `stall` from when the reader finds it missing (right after the first byte, unless the reader had other
/// frames of the same read to hand on first).
fn read_frame_bounded(r: &mut io::BufReader<SpinRead>, buf: &mut Vec<u8>, stall: Duration) -> Result<(), FrameError> {
    r.get_mut().deadline = None;
    loop {
        match r.fill_buf() {
            Ok([]) => return Err(FrameError::Closed),
            Ok(_) => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(FrameError::Io(e)),
        }
    }
    // The common case: the whole frame came with the same read (a burst of small frames).
    let b = r.buffer();
    if b.len() >= 4 {
        let n = u32::from_le_bytes(b[..4].try_into().unwrap()) as usize;
        if !(HEADER..=MAX_FRAME).contains(&n) {
            return Err(FrameError::Io(io::Error::new(io::ErrorKind::InvalidData, format!("frame of {n} bytes"))));
        }
        if b.len() >= 4 + n {
            buf.clear();
            buf.extend_from_slice(&b[4..4 + n]);
            r.consume(4 + n);
            return Ok(());
        }
    }
    r.get_mut().deadline = Some(deadline::after(stall));
    let mut len = [0u8; 4];
    fill(r, &mut len, 0, None)?;
    let n = u32::from_le_bytes(len) as usize;
    if !(HEADER..=MAX_FRAME).contains(&n) {
        return Err(FrameError::Io(io::Error::new(io::ErrorKind::InvalidData, format!("frame of {n} bytes"))));
    }
    buf.resize(n, 0);
    fill(r, buf, 4, Some(4 + n))?;
    r.get_mut().deadline = None;
    Ok(())
}

/// Fills `buf` from `r`; `before` bytes of the frame (of `of`) came before it, for a stall's report.
fn fill(r: &mut impl Read, buf: &mut [u8], before: usize, of: Option<usize>) -> Result<(), FrameError> {
    let mut done = 0;
    while done < buf.len() {
        match r.read(&mut buf[done..]) {
            Ok(0) => return Err(FrameError::Io(io::ErrorKind::UnexpectedEof.into())),
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                return Err(FrameError::Stalled { got: before + done, of })
            }
            Err(e) => return Err(FrameError::Io(e)),
        }
    }
    Ok(())
}

/// Reads one frame body into `buf` (the hello exchange, through a [`ReadBy`] that bounds it in all), refusing
/// a length outside `HEADER..=MAX_FRAME` before allocating.
pub(super) fn read_frame(stream: &mut impl Read, buf: &mut Vec<u8>) -> io::Result<()> {
    let mut len = [0u8; 4];
    stream.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len) as usize;
    if !(HEADER..=MAX_FRAME).contains(&len) {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("frame of {len} bytes")));
    }
    buf.resize(len, 0);
    stream.read_exact(buf)
}

pub(super) fn send_packet(stream: &mut TcpStream, p: &Packet<'_>) -> io::Result<()> {
    let mut b = Vec::with_capacity(HEADER + 4);
    packet::encode(p, &mut b);
    stream.write_all(&b)
}

/// Hands every frame of an up link to the executor until the connection ends; then reports the link down
/// unless the QP was destroyed. A frame must be complete within `stall` of its first byte: a peer that stops
/// in the middle of one (a half-open connection) takes the link down, naming it.
pub(super) fn read_loop(stream: TcpStream, link: Arc<Link>, mb: Mailbox, stall: Duration) {
    let qpn = link.local.qpn;
    // Buffered: a burst of small frames (doorbell batches, ACKs) costs one read, not two per frame.
    let mut stream = io::BufReader::with_capacity(1 << 16, SpinRead { stream, deadline: None, timed: false });
    let reason = loop {
        let mut body = Vec::new();
        match read_frame_bounded(&mut stream, &mut body, stall) {
            Ok(()) => {
                if !mb.post(Inbound::Frame { qpn, body }) {
                    // The NIC is gone.
                    return;
                }
            }
            Err(FrameError::Closed) => break "the peer closed the connection".to_string(),
            Err(FrameError::Io(e)) if e.kind() == io::ErrorKind::UnexpectedEof => {
                break "the peer closed the connection in the middle of a frame".to_string()
            }
            Err(FrameError::Io(e)) => break format!("connection error: {e}"),
            Err(FrameError::Stalled { got, of }) => {
                let what = match of {
                    Some(of) => format!("{got} of the {of} bytes of a frame"),
                    None => format!("{got} of the 4 bytes of a frame's length"),
                };
                break format!(
                    "{} stalled mid-frame: sent {what}, and the rest did not come within {stall:?} (a half-open \
                     connection?)",
                    peer_name(&link)
                );
            }
        }
    };
    if !link.is_closed() {
        let reason = if reason.starts_with("peer QP") { reason } else { format!("{reason} ({})", peer_name(&link)) };
        // The reason first: the executor may see the link down (a send failing) before it takes the message,
        // and the first reason recorded is the one `Qp::wire_error` gives.
        link.set_error(&reason);
        link.set_down();
        mb.post(Inbound::Down { qpn, reason });
    }
}

/// "peer QP 0x… at ADDR", for messages.
pub(crate) fn peer_name(link: &Link) -> String {
    match link.remote.wire {
        Some(a) => format!("peer QP {:#x} at {a}", link.remote.qpn),
        None => format!("peer QP {:#x}", link.remote.qpn),
    }
}

/// Starts the dialing end of `link`: connects to the peer NIC's listener and says hello, retrying while the peer
/// is not there or not connected back yet (as an RC QP in RTS keeps its peer's address until it needs it), then
/// reads frames. Requests that wait meanwhile are failed by the executor after `timeout` without progress; the
/// thread stops when the link is closed or refused for good.
pub(crate) fn spawn_dialer(link: Arc<Link>, mb: Mailbox, timeout: Duration) -> io::Result<()> {
    let name = format!("emu-wire-{:x}", link.local.qpn);
    thread::Builder::new().name(name).spawn(move || {
        let qpn = link.local.qpn;
        match dial(&link, timeout) {
            Ok(stream) => read_loop(stream, link, mb, socket_timeout(timeout)),
            Err(reason) if !link.is_closed() && !link.is_down() => {
                link.set_error(&reason);
                link.set_down();
                mb.post(Inbound::Down { qpn, reason });
            }
            Err(_) => {}
        }
    })?;
    Ok(())
}

/// One dialing attempt's outcome.
enum Attempt {
    Up(TcpStream),
    /// Not there yet (refused, unreachable, not connected back; the error says which): try again.
    Retry(String),
    /// Refused for good.
    Fail(String),
}

/// Longest pause between two dialing attempts.
const MAX_RETRY_PAUSE: Duration = Duration::from_millis(100);

fn dial(link: &Link, timeout: Duration) -> Result<TcpStream, String> {
    let Some(addr) = link.remote.wire else {
        return Err(format!("{} has no wire address", peer_name(link)));
    };
    let mut pause = RETRY_PAUSE;
    loop {
        if link.is_closed() || link.is_down() {
            return Err("link closed".into());
        }
        match attempt(link, addr, timeout) {
            Attempt::Up(s) => return Ok(s),
            Attempt::Fail(why) => return Err(why),
            Attempt::Retry(why) => {
                *lock(&link.last_try) = Some(why);
                thread::sleep(pause);
                pause = (pause * 2).min(MAX_RETRY_PAUSE);
            }
        }
    }
}

fn attempt(link: &Link, addr: SocketAddr, timeout: Duration) -> Attempt {
    let mut stream = match TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
        Ok(s) => s,
        Err(e) => return Attempt::Retry(format!("connecting to {addr}: {e}")),
    };
    let hello = Packet::Hello {
        src_nic: link.local.nic,
        src_qpn: link.local.qpn,
        dst_nic: link.remote.nic,
        dst_qpn: link.remote.qpn,
        version: VERSION,
    };
    // The peer answers once its QP is connected back to us, which may take until its timeout.
    let answer_by = deadline::after(socket_timeout(timeout).max(HELLO_TIMEOUT));
    let mut body = Vec::new();
    let asked = stream
        .set_nodelay(true)
        .and_then(|()| send_packet(&mut stream, &hello))
        .and_then(|()| read_frame(&mut ReadBy { stream: &stream, deadline: answer_by }, &mut body));
    if let Err(e) = asked {
        return Attempt::Retry(format!("the hello to {addr}: {e}"));
    }
    match packet::decode(&body) {
        Ok(Packet::HelloAck) => {}
        Ok(Packet::Reject { why: reject::NOT_CONNECTED }) => {
            return Attempt::Retry(format!("{} is not connected back to this QP yet", peer_name(link)))
        }
        Ok(Packet::Reject { why }) => {
            return Attempt::Fail(format!("{} refused the connection: {}", peer_name(link), why_text(why)))
        }
        _ => return Attempt::Fail(format!("{} answered the hello with something else", peer_name(link))),
    }
    let ready = stream.set_read_timeout(None).and_then(|()| stream.try_clone());
    match ready.map(|writer| link.set_up(writer)) {
        Ok(true) => Attempt::Up(stream),
        Ok(false) => Attempt::Fail("link closed".into()),
        Err(e) => Attempt::Fail(format!("connection to {} failed: {e}", peer_name(link))),
    }
}

/// `timeout` as a socket timeout: at least 1 ms (0 means "none" to the OS) and at most an hour.
pub(super) fn socket_timeout(timeout: Duration) -> Duration {
    timeout.clamp(Duration::from_millis(1), Duration::from_secs(3600))
}

pub(super) fn why_text(why: u8) -> &'static str {
    match why {
        reject::WRONG_NIC => "no such NIC there",
        reject::NO_QP => "no such QP there",
        reject::NOT_CONNECTED => "its QP is not connected to this one yet",
        reject::OTHER_PEER => "its QP is connected to another QP",
        reject::BUSY => "its QP already has a connection",
        reject::VERSION => "different wire version",
        _ => "unknown reason",
    }
}

impl Packet<'_> {
    /// Whether this is a request (the responder's side handles it) rather than a response.
    pub(crate) fn is_request(&self) -> bool {
        matches!(self, Packet::Write { .. } | Packet::WriteIpc { .. } | Packet::Read { .. } | Packet::Atomic { .. })
    }
}
