//! Connections between QPs of different NICs: the listener, the dialer, the hello handshake, and the reader
//! threads that turn the byte stream into frames for the executor.
//!
//! Threads here never touch memory, CQEs or QP state: they hand complete frames (and "connection lost") to
//! the executor through the NIC's inbound channel and wake it. They hold a [`Link`] (sockets only) and at
//! most a `Weak` reference to the NIC's shared state, never a QP, so that a QP's queue memory is still freed
//! by the thread that destroys it.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex, Weak};
use std::thread::{self, JoinHandle, Thread};
use std::time::{Duration, Instant};

use super::packet::{self, reject, Packet, HEADER, MAX_FRAME, VERSION};
use crate::nic::emu::fabric::{lock, read, Fabric};
use crate::nic::emu::qp::{Endpoint, QpState};

/// What reader threads hand to the executor.
#[derive(Debug)]
pub(crate) enum Inbound {
    /// One frame body (length prefix removed, at most [`MAX_FRAME`] bytes) for local QP `qpn`.
    Frame { qpn: u32, body: Vec<u8> },
    /// The connection of local QP `qpn` is gone (or never came up).
    Down { qpn: u32, reason: String },
}

const CONNECTING: u8 = 0;
const UP: u8 = 1;
const DOWN: u8 = 2;

/// How long an accepted connection may take to say hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// Pause between two dial attempts, and between two looks for the local QP during a hello.
const RETRY_PAUSE: Duration = Duration::from_millis(5);

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
}

impl Link {
    pub(crate) fn new(local: Endpoint, remote: Endpoint) -> Self {
        Self {
            local,
            remote,
            state: AtomicU8::new(CONNECTING),
            stream: Mutex::new(None),
            closed: AtomicBool::new(false),
        }
    }

    /// Whether this end dials (the smaller `(nic, qpn)`); the other end waits for the hello.
    pub(crate) fn dials(&self) -> bool {
        (self.local.nic, self.local.qpn) < (self.remote.nic, self.remote.qpn)
    }

    pub(crate) fn is_up(&self) -> bool {
        self.state.load(Ordering::Acquire) == UP
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Whether the connection is gone (lost, refused for good, or closed after a failed send).
    pub(crate) fn is_down(&self) -> bool {
        self.state.load(Ordering::Acquire) == DOWN
    }

    /// Makes `stream` the write side. Fails when the link was already up (a second hello) or closed.
    fn set_up(&self, stream: TcpStream) -> bool {
        let mut s = lock(&self.stream);
        if self.is_closed() || self.state.load(Ordering::Acquire) != CONNECTING {
            return false;
        }
        *s = Some(stream);
        self.state.store(UP, Ordering::Release);
        true
    }

    fn set_down(&self) {
        self.state.store(DOWN, Ordering::Release);
        if let Some(s) = lock(&self.stream).take() {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    /// Writes `bytes` (whole frames). Blocks while the peer's receive buffer is full: the peer's reader thread
    /// always drains its socket, so this cannot deadlock.
    pub(crate) fn send(&self, bytes: &[u8]) -> io::Result<()> {
        let mut s = lock(&self.stream);
        match s.as_mut() {
            Some(stream) => stream.write_all(bytes),
            None => Err(io::Error::new(io::ErrorKind::NotConnected, "link is not up")),
        }
    }

    /// Closes the connection for good (QP destroyed): the peer sees it end, the threads stop.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.set_down();
    }
}

/// Where reader threads deliver, and how they wake the executor.
#[derive(Clone, Debug)]
pub(crate) struct Mailbox {
    pub tx: Sender<Inbound>,
    pub executor: Thread,
}

impl Mailbox {
    fn post(&self, m: Inbound) {
        // The executor owns the receiver for the NIC's lifetime; a send error means the NIC is gone.
        if self.tx.send(m).is_ok() {
            self.executor.unpark();
        }
    }
}

/// Reads one frame body into `buf`, refusing a length outside `HEADER..=MAX_FRAME` before allocating.
fn read_frame(stream: &mut impl Read, buf: &mut Vec<u8>) -> io::Result<()> {
    let mut len = [0u8; 4];
    stream.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len) as usize;
    if !(HEADER..=MAX_FRAME).contains(&len) {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("frame of {len} bytes")));
    }
    buf.resize(len, 0);
    stream.read_exact(buf)
}

fn send_packet(stream: &mut TcpStream, p: &Packet<'_>) -> io::Result<()> {
    let mut b = Vec::with_capacity(HEADER + 4);
    packet::encode(p, &mut b);
    stream.write_all(&b)
}

/// How long a reader polls its socket without blocking before it sleeps in `read`: a packet that arrives within
/// this time is picked up without a scheduler wake-up (several µs on a busy host), as the executor's own idle
/// loop spins before it sleeps.
const SPIN_READ: Duration = Duration::from_micros(100);

/// A socket read that polls (non-blocking `recv`, yielding between tries) for [`SPIN_READ`] before it blocks.
/// Polls with `MSG_DONTWAIT` per call rather than `O_NONBLOCK`, which the write side (a clone of the same
/// socket) would share.
struct SpinRead(TcpStream);

impl Read for SpinRead {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        use std::os::fd::AsRawFd;
        let start = Instant::now();
        loop {
            // SAFETY: `buf` is valid for writes of `buf.len()` bytes; the descriptor is this socket's, open
            // while `self` lives.
            let n = unsafe { libc::recv(self.0.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
            if n >= 0 {
                return Ok(n as usize);
            }
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::WouldBlock if start.elapsed() < SPIN_READ => thread::yield_now(),
                io::ErrorKind::WouldBlock => return self.0.read(buf),
                io::ErrorKind::Interrupted => {}
                _ => return Err(e),
            }
        }
    }
}

/// Hands every frame of an up link to the executor until the connection ends; then reports the link down
/// unless the QP was destroyed.
fn read_loop(stream: TcpStream, link: Arc<Link>, mb: Mailbox) {
    let qpn = link.local.qpn;
    // Buffered: a burst of small frames (doorbell batches, ACKs) costs one read, not two per frame.
    let mut stream = io::BufReader::with_capacity(1 << 16, SpinRead(stream));
    let reason = loop {
        let mut body = Vec::new();
        match read_frame(&mut stream, &mut body) {
            Ok(()) => mb.post(Inbound::Frame { qpn, body }),
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => break "the peer closed the connection".to_string(),
            Err(e) => break format!("connection error: {e}"),
        }
    };
    if !link.is_closed() {
        link.set_down();
        mb.post(Inbound::Down { qpn, reason: format!("{reason} ({})", peer_name(&link)) });
    }
}

fn peer_name(link: &Link) -> String {
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
            Ok(stream) => read_loop(stream, link, mb),
            Err(reason) if !link.is_closed() && !link.is_down() => {
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
    /// Not there yet (refused, unreachable, not connected back): try again.
    Retry,
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
            Attempt::Retry => {
                thread::sleep(pause);
                pause = (pause * 2).min(MAX_RETRY_PAUSE);
            }
        }
    }
}

fn attempt(link: &Link, addr: SocketAddr, timeout: Duration) -> Attempt {
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_secs(1)) else { return Attempt::Retry };
    let hello = Packet::Hello {
        src_nic: link.local.nic,
        src_qpn: link.local.qpn,
        dst_nic: link.remote.nic,
        dst_qpn: link.remote.qpn,
        version: VERSION,
    };
    // The peer answers once its QP is connected back to us, which may take until its timeout.
    let wait = socket_timeout(timeout).max(HELLO_TIMEOUT);
    let mut body = Vec::new();
    let asked = stream
        .set_nodelay(true)
        .and_then(|()| send_packet(&mut stream, &hello))
        .and_then(|()| stream.set_read_timeout(Some(wait)))
        .and_then(|()| read_frame(&mut stream, &mut body));
    if asked.is_err() {
        return Attempt::Retry;
    }
    match packet::decode(&body) {
        Ok(Packet::HelloAck) => {}
        Ok(Packet::Reject { why: reject::NOT_CONNECTED }) => return Attempt::Retry,
        Ok(Packet::Reject { why }) => {
            return Attempt::Fail(format!("{} refused the connection: {}", peer_name(link), why_text(why)))
        }
        _ => return Attempt::Fail(format!("{} answered the hello with something else", peer_name(link))),
    }
    let ready = stream
        .set_read_timeout(None)
        .and_then(|()| stream.set_write_timeout(Some(socket_timeout(timeout))))
        .and_then(|()| stream.try_clone());
    match ready.map(|writer| link.set_up(writer)) {
        Ok(true) => Attempt::Up(stream),
        Ok(false) => Attempt::Fail("link closed".into()),
        Err(e) => Attempt::Fail(format!("connection to {} failed: {e}", peer_name(link))),
    }
}

/// `timeout` as a socket timeout: at least 1 ms (0 means "none" to the OS) and at most an hour.
fn socket_timeout(timeout: Duration) -> Duration {
    timeout.clamp(Duration::from_millis(1), Duration::from_secs(3600))
}

fn why_text(why: u8) -> &'static str {
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

/// Binds the NIC's listener.
pub(crate) fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    let l = TcpListener::bind(addr)?;
    // Non-blocking, so that the acceptor notices the NIC's drop without a connection to wake it.
    l.set_nonblocking(true)?;
    Ok(l)
}

/// Starts the NIC's acceptor thread: each connection gets its own thread for the hello, which then reads
/// its frames. Stops when the NIC is dropped.
pub(crate) fn spawn_acceptor(
    listener: TcpListener,
    fab: Weak<Fabric>,
    mb: Mailbox,
    timeout: Duration,
) -> io::Result<JoinHandle<()>> {
    let id = fab.upgrade().map_or(0, |f| f.id);
    thread::Builder::new().name(format!("emu-listen-{:x}", id & 0xffff)).spawn(move || loop {
        match fab.upgrade() {
            Some(f) if !f.stop.load(Ordering::Acquire) => {}
            _ => return,
        }
        match listener.accept() {
            Ok((stream, from)) => {
                let (fab, mb) = (fab.clone(), mb.clone());
                let spawned = thread::Builder::new()
                    .name("emu-wire-in".into())
                    .spawn(move || accept(stream, from, fab, mb, timeout));
                if let Err(e) = spawned {
                    tracing::warn!("emulated NIC: no thread for a connection from {from}: {e}");
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => thread::sleep(Duration::from_millis(2)),
            Err(e) => {
                tracing::warn!("emulated NIC: accept failed: {e}");
                thread::sleep(Duration::from_millis(2));
            }
        }
    })
}

/// The accepting end of a connection: checks the hello against the local QP it names (waiting up to
/// `timeout` for that QP to be connected), answers, then reads frames.
fn accept(mut stream: TcpStream, from: SocketAddr, fab: Weak<Fabric>, mb: Mailbox, timeout: Duration) {
    let mut setup = || -> io::Result<Option<Packet<'static>>> {
        stream.set_nonblocking(false)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(HELLO_TIMEOUT))?;
        let mut body = Vec::new();
        read_frame(&mut stream, &mut body)?;
        Ok(match packet::decode(&body) {
            Ok(Packet::Hello { src_nic, src_qpn, dst_nic, dst_qpn, version }) => {
                Some(Packet::Hello { src_nic, src_qpn, dst_nic, dst_qpn, version })
            }
            _ => None,
        })
    };
    let hello = match setup() {
        Ok(Some(h)) => h,
        Ok(None) => {
            tracing::warn!("emulated NIC: connection from {from} did not start with a hello; closed");
            return;
        }
        Err(e) => {
            tracing::warn!("emulated NIC: connection from {from} sent no valid hello ({e}); closed");
            return;
        }
    };
    let Packet::Hello { src_nic, src_qpn, dst_nic, dst_qpn, version } = hello else { return };
    let verdict = if version != VERSION {
        Err(reject::VERSION)
    } else {
        find_link(&fab, src_nic, src_qpn, dst_nic, dst_qpn, timeout)
    };
    let link = match verdict {
        Ok(link) => link,
        Err(why) => {
            tracing::warn!(
                "emulated NIC: refused a connection from {from} (QP {src_qpn:#x} → {dst_qpn:#x}): {}",
                why_text(why)
            );
            let _ = send_packet(&mut stream, &Packet::Reject { why });
            return;
        }
    };
    // The answer goes out before the link is up, so that it is the first frame the dialer reads.
    // A send blocked longer than the retry timeout (a peer that stopped reading) fails instead of hanging the
    // executor.
    let ok = send_packet(&mut stream, &Packet::HelloAck)
        .and_then(|()| stream.set_read_timeout(None))
        .and_then(|()| stream.set_write_timeout(Some(socket_timeout(timeout))))
        .and_then(|()| stream.try_clone());
    match ok {
        Ok(writer) => {
            if link.set_up(writer) {
                read_loop(stream, link, mb);
            }
        }
        Err(e) => {
            link.set_down();
            mb.post(Inbound::Down { qpn: dst_qpn, reason: format!("answering the hello of {from} failed: {e}") });
        }
    }
}

/// The link of local QP `dst_qpn` if it is connected to `src_qpn` of NIC `src_nic` and not up yet, waiting
/// up to `timeout` for `Qp::connect` to run.
fn find_link(
    fab: &Weak<Fabric>,
    src_nic: u64,
    src_qpn: u32,
    dst_nic: u64,
    dst_qpn: u32,
    timeout: Duration,
) -> Result<Arc<Link>, u8> {
    let start = Instant::now();
    loop {
        let fab = fab.upgrade().ok_or(reject::NO_QP)?;
        if dst_nic != fab.id {
            return Err(reject::WRONG_NIC);
        }
        let qp = read(&fab.qps).get(&dst_qpn).cloned().ok_or(reject::NO_QP)?;
        // `connect` sets the link before RTR: answer only once the QP takes requests.
        let ready = matches!(qp.state(), QpState::Rtr | QpState::Rts);
        if let (Some(link), true) = (qp.link.get(), ready) {
            if (link.remote.nic, link.remote.qpn) != (src_nic, src_qpn) {
                return Err(reject::OTHER_PEER);
            }
            if link.state.load(Ordering::Acquire) != CONNECTING || link.dials() {
                return Err(reject::BUSY);
            }
            return Ok(link.clone());
        }
        // Not connected (back to the sender) yet: the sender dials again, so answer within a few seconds.
        if start.elapsed() > timeout.min(HELLO_TIMEOUT) {
            return Err(reject::NOT_CONNECTED);
        }
        drop((qp, fab));
        thread::sleep(RETRY_PAUSE);
    }
}

impl Packet<'_> {
    /// Whether this is a request (the responder's side handles it) rather than a response.
    pub(crate) fn is_request(&self) -> bool {
        matches!(self, Packet::Write { .. } | Packet::Read { .. } | Packet::Atomic { .. })
    }
}
