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
use crate::nic::emu::qp::Endpoint;

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
    /// When `Qp::connect` made the link: the start of the connection timeout.
    pub opened: Instant,
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
            opened: Instant::now(),
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

/// Starts the dialing end of `link`: connects to the peer NIC's listener (retrying until `timeout`), says
/// hello, waits for the answer, then reads frames.
pub(crate) fn spawn_dialer(link: Arc<Link>, mb: Mailbox, timeout: Duration) -> io::Result<()> {
    let name = format!("emu-wire-{:x}", link.local.qpn);
    thread::Builder::new().name(name).spawn(move || {
        let qpn = link.local.qpn;
        match dial(&link, timeout) {
            Ok(stream) => read_loop(stream, link, mb),
            Err(reason) if !link.is_closed() => {
                link.set_down();
                mb.post(Inbound::Down { qpn, reason });
            }
            Err(_) => {}
        }
    })?;
    Ok(())
}

fn dial(link: &Link, timeout: Duration) -> Result<TcpStream, String> {
    let Some(addr) = link.remote.wire else {
        return Err(format!("{} has no wire address", peer_name(link)));
    };
    let deadline = link.opened + timeout;
    let mut stream = loop {
        if link.is_closed() {
            return Err("QP destroyed".into());
        }
        let left = deadline.saturating_duration_since(Instant::now());
        match TcpStream::connect_timeout(&addr, left.clamp(Duration::from_millis(1), Duration::from_secs(1))) {
            Ok(s) => break s,
            Err(e) if Instant::now() >= deadline => {
                return Err(format!("peer unreachable: {e} ({} after {timeout:?})", peer_name(link)))
            }
            Err(_) => thread::sleep(RETRY_PAUSE),
        }
    };
    let fail = |e: io::Error| format!("hello to {} failed: {e}", peer_name(link));
    stream.set_nodelay(true).map_err(fail)?;
    let hello = Packet::Hello {
        src_nic: link.local.nic,
        src_qpn: link.local.qpn,
        dst_nic: link.remote.nic,
        dst_qpn: link.remote.qpn,
        version: VERSION,
    };
    send_packet(&mut stream, &hello).map_err(fail)?;
    // The peer answers once its QP is connected back to us, which may take until the timeout.
    stream.set_read_timeout(Some(timeout.max(Duration::from_millis(10)))).map_err(fail)?;
    let mut body = Vec::new();
    read_frame(&mut stream, &mut body).map_err(fail)?;
    match packet::decode(&body) {
        Ok(Packet::HelloAck) => {}
        Ok(Packet::Reject { why }) => {
            return Err(format!("{} refused the connection: {}", peer_name(link), why_text(why)))
        }
        _ => return Err(format!("{} answered the hello with something else", peer_name(link))),
    }
    stream.set_read_timeout(None).map_err(fail)?;
    let writer = stream.try_clone().map_err(fail)?;
    if !link.set_up(writer) {
        return Err("QP destroyed".into());
    }
    Ok(stream)
}

fn why_text(why: u8) -> &'static str {
    match why {
        reject::WRONG_NIC => "no such NIC there",
        reject::NO_QP => "no such QP there",
        reject::NOT_CONNECTED => "its QP is not connected to this one",
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
    let ok = send_packet(&mut stream, &Packet::HelloAck)
        .and_then(|()| stream.set_read_timeout(None))
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
        if let Some(link) = qp.link.get() {
            if (link.remote.nic, link.remote.qpn) != (src_nic, src_qpn) {
                return Err(reject::NOT_CONNECTED);
            }
            if link.state.load(Ordering::Acquire) != CONNECTING || link.dials() {
                return Err(reject::BUSY);
            }
            return Ok(link.clone());
        }
        if start.elapsed() > timeout {
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
