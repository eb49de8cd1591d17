//! Joining a session: the root accepts and checks hellos; the other ranks dial it until it answers.

use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use super::launch::{Launch, Secret};
use super::session::{duration_ns, serve_peer, serve_root, Bootstrap, Link, Mailbox, Shared};
use super::wire::{
    self, one_line, rank_list, Fields, Greeting, Hello, Kind, WireError, HELLO_LEN, MAX_FRAME, MAX_WORLD_SIZE, VERSION,
};
use crate::deadline::ReadBy;
use crate::{Error, Result};

/// Longest the root waits for a connection's hello: a stray connection that says nothing costs one thread
/// for this long and never delays the real ranks.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the root looks for new connections while it waits for hellos.
const ACCEPT_POLL: Duration = Duration::from_millis(5);
/// Pause between a rank's attempts to reach a root that is not listening yet.
const DIAL_RETRY: Duration = Duration::from_millis(50);

/// What a hello reader hands the root's accept loop.
type Arrival = (TcpStream, SocketAddr, Result<Greeting, String>);

fn bad(msg: String) -> Error {
    Error::Bootstrap(msg)
}

fn timed_out(e: &WireError) -> bool {
    matches!(e, WireError::Io(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut))
}

impl Bootstrap {
    /// Joins the session `launch` describes: rank 0 binds `launch.root` (exactly that address, so loopback
    /// unless told otherwise) and waits for every other rank, as [`root_on`](Self::root_on); the other ranks
    /// dial the root, retrying until it listens, and send their hello (magic, protocol version, session
    /// secret, rank, world size). Everything, waiting for the last rank included, takes at most `timeout`,
    /// which also becomes the [`timeout`](Self::timeout) of later calls. Mirrors MSCCL++'s
    /// `TcpBootstrap::initialize` and NCCL's `bootstrapInit`. A world of one binds nothing.
    ///
    /// # Errors
    /// [`Error::Bootstrap`], naming the rank and the root's address, when: the launch is inconsistent (a rank
    /// out of range, a world size of 0 or over [`MAX_WORLD_SIZE`]); rank 0
    /// cannot bind; the root cannot be reached within `timeout`; the root rejects the hello (`"rejected by
    /// root HOST:PORT: wrong session secret"` and the like); not every rank joins within `timeout` (the root
    /// lists the missing ranks, and the others are rejected with that reason).
    pub fn connect(launch: &Launch, timeout: Duration) -> Result<Bootstrap> {
        check_launch(launch)?;
        let timeout = timeout.max(Duration::from_millis(1));
        if launch.rank != 0 {
            return join(launch, timeout);
        }
        if launch.world_size == 1 {
            return assemble(launch, launch.root.clone(), timeout, vec![None]);
        }
        let listener = TcpListener::bind(launch.root.as_str())
            .map_err(|e| bad(format!("rank 0: cannot bind the bootstrap address {}: {e}", launch.root)))?;
        Bootstrap::root_on(listener, launch, timeout)
    }

    /// Rank 0's side of [`connect`](Self::connect) on a listener the caller bound (e.g. to port 0 in tests;
    /// the other ranks' `launch.root` must then name the port it got). Accepts connections until ranks
    /// `1..world_size` have each sent a valid hello, then welcomes them all. A connection whose first frame is
    /// not a gdaki hello (garbage, an oversized length, silence for 5 s) is dropped and logged
    /// (`tracing::warn`); a hello with another version, the wrong secret, another world size, or a rank out of
    /// range or already joined (on a connection that is still open) gets a reject frame with the reason.
    /// Either way the root keeps waiting for the real ranks. A rank that joined and went away before the
    /// others came may join again, before or after the last of them.
    ///
    /// # Errors
    /// [`Error::Bootstrap`] when `launch.rank` is not 0 or the launch is inconsistent (as for `connect`), or
    /// when ranks are still missing after `timeout`
    /// (they are listed; the ranks that had joined are rejected with the same reason).
    pub fn root_on(listener: TcpListener, launch: &Launch, timeout: Duration) -> Result<Bootstrap> {
        check_launch(launch)?;
        if launch.rank != 0 {
            return Err(bad(format!("rank {}: only rank 0 listens (root_on)", launch.rank)));
        }
        let timeout = timeout.max(Duration::from_millis(1));
        let deadline = crate::deadline::after(timeout);
        let addr = listener.local_addr().map(|a| a.to_string()).unwrap_or_else(|_| launch.root.clone());
        let n = launch.world_size;
        // Non-blocking accept: the loop below also watches the deadline and the hellos.
        listener.set_nonblocking(true).map_err(|e| bad(format!("rank 0: root {addr}: set_nonblocking: {e}")))?;
        let hello_timeout = timeout.min(HELLO_TIMEOUT);
        let (tx, rx) = mpsc::channel::<Arrival>();
        let mut joined: Vec<Option<TcpStream>> = (0..n).map(|_| None).collect();
        loop {
            let missing: Vec<u32> = (1..n).filter(|&r| joined[r as usize].is_none()).collect();
            if missing.is_empty() {
                // A rank that joined and went away since (it gave up waiting for the others, or died) is missing
                // again, so that its restart may still take its place: welcomed, its dead connection broke the
                // session, and a restart that came after the last of the others was never answered. Looked at
                // once every rank is here, not on every poll.
                let gone: Vec<usize> = (1..n as usize).filter(|&r| !joined[r].as_ref().is_some_and(is_open)).collect();
                if gone.is_empty() {
                    break;
                }
                for r in gone {
                    tracing::warn!("gdaki bootstrap root {addr}: rank {r} went away before every rank joined");
                    joined[r] = None;
                }
                continue;
            }
            loop {
                match listener.accept() {
                    Ok((stream, peer)) => read_hello(stream, peer, hello_timeout, tx.clone()),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) => {
                        // E.g. out of file descriptors: wait a poll interval and try again.
                        tracing::warn!("gdaki bootstrap root {addr}: accept failed: {e}");
                        break;
                    }
                }
            }
            let now = Instant::now();
            if now >= deadline {
                let why = format!(
                    "timed out after {timeout:?} waiting for ranks {} to join root {addr}",
                    rank_list(&missing)
                );
                for stream in joined.iter().flatten() {
                    refuse(stream, &why);
                }
                return Err(bad(format!("rank 0: {why}")));
            }
            if let Ok((stream, peer, greeting)) = rx.recv_timeout((deadline - now).min(ACCEPT_POLL)) {
                admit(stream, peer, greeting, launch, &addr, &mut joined);
            }
        }

        for (rank, stream) in joined.iter().enumerate().skip(1) {
            let stream = stream.as_ref().expect("every rank joined");
            let welcome = [(rank as u32).to_le_bytes(), n.to_le_bytes()].concat();
            let sent = stream
                .set_write_timeout(Some(timeout))
                .and_then(|()| stream.set_read_timeout(None))
                .and_then(|()| wire::write_frame(&mut &*stream, Kind::Welcome, &[&welcome]));
            if let Err(e) = sent {
                let why = format!("cannot welcome rank {rank}: {e}");
                for stream in joined.iter().flatten() {
                    refuse(stream, &why);
                }
                return Err(bad(format!("rank 0: root {addr}: {why}")));
            }
        }
        assemble(launch, addr, timeout, joined)
    }
}

fn check_launch(launch: &Launch) -> Result<()> {
    if launch.world_size > MAX_WORLD_SIZE {
        return Err(bad(format!(
            "rank {}: world size {} (from {}) is over the bootstrap's limit of {MAX_WORLD_SIZE} ranks",
            launch.rank, launch.world_size, launch.source
        )));
    }
    if launch.world_size == 0 || launch.rank >= launch.world_size {
        return Err(bad(format!(
            "rank {} is out of range for world size {} (from {})",
            launch.rank, launch.world_size, launch.source
        )));
    }
    Ok(())
}

/// Reads a new connection's first frame on its own thread, so that a silent or slow peer never delays
/// the accept loop.
fn read_hello(stream: TcpStream, peer: SocketAddr, timeout: Duration, tx: mpsc::Sender<Arrival>) {
    let spawned = thread::Builder::new().name("gdaki-bootstrap-hello".into()).spawn(move || {
        // The whole hello within `timeout`, however its bytes are spaced.
        let deadline = crate::deadline::after(timeout);
        let setup = stream
            .set_nonblocking(false)
            .and_then(|()| stream.set_nodelay(true))
            .and_then(|()| stream.set_write_timeout(Some(timeout)));
        let greeting = match setup {
            Err(e) => Err(e.to_string()),
            // A hello is HELLO_LEN bytes; the slack lets a later protocol's longer hello get a readable
            // version reject instead of being dropped, without letting a stray make us allocate much.
            Ok(()) => match wire::read_frame(&mut ReadBy { stream: &stream, deadline }, 4 + HELLO_LEN as u32 + 1024) {
                Ok((kind, payload)) => Hello::decode(kind, &payload),
                Err(e) => Err(e.to_string()),
            },
        };
        // The root may be gone already (it finished or timed out): then the connection is just dropped.
        let _ = tx.send((stream, peer, greeting));
    });
    if let Err(e) = spawned {
        tracing::warn!("gdaki bootstrap: dropped a connection from {peer}: cannot start a thread for it: {e}");
    }
}

/// The root decides what to do with one hello.
fn admit(
    stream: TcpStream,
    peer: SocketAddr,
    greeting: Result<Greeting, String>,
    launch: &Launch,
    addr: &str,
    joined: &mut [Option<TcpStream>],
) {
    let n = launch.world_size;
    let why = match greeting {
        Err(why) => {
            tracing::warn!("gdaki bootstrap root {addr}: dropped a connection from {peer}: {why}");
            return;
        }
        Ok(Greeting::OtherVersion(v)) => format!("protocol version {v}, the root speaks version {VERSION}"),
        // Ranks on loopback without a secret derive it from the root's address and their world size, so one
        // that disagrees on the world size has another secret too: say what differs. A derived secret
        // authenticates nothing, so this tells no one anything a secret guards.
        Ok(Greeting::Hello(h))
            if h.world_size != n
                && launch.secret == Secret::derived(&launch.root, n)
                && Secret::from_bytes(h.secret) == Secret::derived(&launch.root, h.world_size) =>
        {
            format!("rank {} says world size {}, the root's is {n}", h.rank, h.world_size)
        }
        // The secret first: a peer without it learns nothing about the session.
        Ok(Greeting::Hello(h)) if Secret::from_bytes(h.secret) != launch.secret => {
            "wrong session secret (give every rank the same secret: --secret, --secret-file, GDAKI_SECRET or \
             GDAKI_SECRET_FILE; without one, on loopback, the same --bootstrap spelling)"
                .to_string()
        }
        Ok(Greeting::Hello(h)) if h.world_size != n => {
            format!("rank {} says world size {}, the root's is {n}", h.rank, h.world_size)
        }
        Ok(Greeting::Hello(h)) if h.rank == 0 => "rank 0 is the root; another process claims it".to_string(),
        Ok(Greeting::Hello(h)) if h.rank >= n => format!("rank {} is out of range for world size {n}", h.rank),
        Ok(Greeting::Hello(h)) if joined[h.rank as usize].as_ref().is_some_and(is_open) => {
            format!("rank {} already joined", h.rank)
        }
        // New, or a restart of a rank whose first connection is gone (it gave up or died): take this one.
        Ok(Greeting::Hello(h)) => {
            joined[h.rank as usize] = Some(stream);
            return;
        }
    };
    tracing::warn!("gdaki bootstrap root {addr}: rejected {peer}: {why}");
    refuse(&stream, &why);
}

/// Whether a joined rank's connection still stands: a peek that would block means open; end of stream or an
/// error means the rank went away while waiting for the others.
fn is_open(stream: &TcpStream) -> bool {
    let mut byte = [0u8; 1];
    let open = stream.set_nonblocking(true).is_ok()
        && matches!(stream.peek(&mut byte), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock);
    open && stream.set_nonblocking(false).is_ok()
}

/// Sends a reject frame (best effort) and closes the connection.
fn refuse(stream: &TcpStream, why: &str) {
    let _ = wire::write_frame(&mut &*stream, Kind::Reject, &[why.as_bytes()]);
    let _ = stream.shutdown(std::net::Shutdown::Both);
}

/// One attempt to reach the root at any of its addresses.
fn dial(root: &str, deadline: Instant) -> Result<TcpStream, String> {
    let addrs = root.to_socket_addrs().map_err(|e| format!("cannot resolve {root}: {e}"))?;
    let mut last = format!("{root} resolves to no address");
    for addr in addrs {
        let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
        match TcpStream::connect_timeout(&addr, left) {
            Ok(stream) => return Ok(stream),
            Err(e) => last = format!("{addr}: {e}"),
        }
    }
    Err(last)
}

/// A non-root rank's side of `connect`.
fn join(launch: &Launch, timeout: Duration) -> Result<Bootstrap> {
    let timeout = timeout.max(Duration::from_millis(1));
    let deadline = crate::deadline::after(timeout);
    let (rank, n, root) = (launch.rank, launch.world_size, launch.root.as_str());
    let stream = loop {
        let why = match dial(root, deadline) {
            Ok(stream) => break stream,
            Err(why) => why,
        };
        let now = Instant::now();
        if now >= deadline {
            return Err(bad(format!("rank {rank}: cannot reach the root at {root} within {timeout:?}: {why}")));
        }
        // The root may simply not listen yet.
        thread::sleep((deadline - now).min(DIAL_RETRY));
    };
    let left = || deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
    let hello = Hello { secret: *launch.secret.as_bytes(), rank, world_size: n };
    stream
        .set_nodelay(true)
        .and_then(|()| stream.set_write_timeout(Some(left())))
        .and_then(|()| wire::write_frame(&mut &stream, Kind::Hello, &[&hello.encode()]))
        .map_err(|e| bad(format!("rank {rank}: sending the hello to the root at {root}: {e}")))?;
    // The whole welcome by the deadline, however its bytes are spaced.
    match wire::read_frame(&mut ReadBy { stream: &stream, deadline }, MAX_FRAME) {
        Ok((Kind::Welcome, payload)) => {
            let mut f = Fields(&payload);
            let (r, w) = (f.u32("rank"), f.u32("world size"));
            if r != Ok(rank) || w != Ok(n) {
                return Err(bad(format!("rank {rank}: the root at {root} welcomed another rank or world size")));
            }
        }
        Ok((Kind::Reject, payload)) => {
            return Err(bad(format!("rank {rank}: rejected by root {root}: {}", one_line(&payload))));
        }
        Ok((kind, _)) => {
            return Err(bad(format!("rank {rank}: the root at {root} answered the hello with a {kind:?} frame")));
        }
        Err(WireError::Closed) => {
            return Err(bad(format!(
                "rank {rank}: the root at {root} closed the connection during the handshake (its process ended, \
                 its session had every rank already and started without this one, e.g. a rank started twice, or \
                 that address is not a gdaki root)"
            )));
        }
        Err(e) if timed_out(&e) => {
            return Err(bad(format!(
                "rank {rank}: the root at {root} did not welcome this rank within {timeout:?} (are all {n} ranks \
                 started?)"
            )));
        }
        Err(e) => return Err(bad(format!("rank {rank}: handshake with the root at {root}: {e}"))),
    }
    stream
        .set_read_timeout(None)
        .and_then(|()| stream.set_write_timeout(Some(timeout)))
        .map_err(|e| bad(format!("rank {rank}: socket to the root at {root}: {e}")))?;
    let mut links = vec![Some(stream)];
    links.resize_with(n as usize, || None);
    assemble(launch, root.to_string(), timeout, links)
}

/// Builds the session from its connections (indexed as [`Shared::links`]) and starts their readers.
fn assemble(launch: &Launch, root: String, timeout: Duration, streams: Vec<Option<TcpStream>>) -> Result<Bootstrap> {
    let rank = launch.rank;
    let mut links = Vec::with_capacity(streams.len());
    let mut readers = Vec::new();
    for (peer, stream) in streams.into_iter().enumerate() {
        let Some(stream) = stream else {
            links.push(None);
            continue;
        };
        let clone = |s: &TcpStream| s.try_clone().map_err(|e| bad(format!("rank {rank}: socket of rank {peer}: {e}")));
        let (writer, closer) = (clone(&stream)?, clone(&stream)?);
        links.push(Some(Link { writer: Mutex::new(writer), closer }));
        readers.push((peer as u32, stream));
    }
    let shared = Arc::new(Shared {
        rank,
        root,
        links,
        mailbox: Mutex::new(Mailbox::default()),
        arrived: Condvar::new(),
        closing: AtomicBool::new(false),
        aborted: AtomicBool::new(false),
        stall_ns: AtomicU64::new(duration_ns(timeout)),
    });
    let mut boot = Bootstrap {
        rank,
        world_size: launch.world_size,
        timeout,
        next_seq: AtomicU64::new(0),
        shared: shared.clone(),
        readers: Vec::new(),
    };
    for (peer, stream) in readers {
        let shared = shared.clone();
        let name = format!("gdaki-bootstrap-{rank}-{peer}");
        let spawned = if rank == 0 {
            thread::Builder::new().name(name).spawn(move || serve_peer(shared, peer, stream))
        } else {
            thread::Builder::new().name(name).spawn(move || serve_root(shared, stream))
        };
        // On failure, dropping `boot` shuts down the sockets and joins the readers already started.
        boot.readers.push(spawned.map_err(|e| bad(format!("rank {rank}: cannot start a reader thread: {e}")))?);
    }
    Ok(boot)
}
