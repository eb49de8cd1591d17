//! Framing of the bootstrap's TCP byte stream, and the hello a rank sends first.
//!
//! A frame is `len: u32 LE` (bytes after this field: the kind and the payload), `kind: u32 LE`, payload.
//! Integers inside payloads are little-endian too. The announced length is checked against [`MAX_FRAME`]
//! before anything is allocated, so a stray peer cannot make us reserve gigabytes.
//!
//! After the handshake, [`FrameReader`] reads a connection's frames: it waits as long as it takes for a frame
//! to begin (a rank may compute for hours between two calls), but once a frame's first byte is in, the whole
//! frame must follow within a bound. A peer that stops in the middle of a frame (a half-open connection: its
//! host went away without closing, or it hangs) is then reported as such instead of holding the reader forever.

use std::fmt;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// Largest frame the bootstrap sends or accepts, in bytes, counted as the frame's length field does (the
/// 4-byte kind plus the payload): 16 MiB. A peer announcing more is dropped before anything is allocated.
/// It bounds one [`send`](super::Bootstrap::send) and the sum of one
/// [`all_gather`](super::Bootstrap::all_gather)'s contributions; the bootstrap carries QP and MR info (tens of
/// bytes per rank), not data.
pub const MAX_FRAME: u32 = 16 << 20;

/// Most ranks a session may have: 65,536. The root keeps a connection and a reader thread per rank, and sizes
/// its tables by the world size before any rank has joined, so a world size that no job has (a stray value of
/// a launcher's variable, say) is refused at once rather than made into tables of billions of entries.
pub const MAX_WORLD_SIZE: u32 = 1 << 16;

/// `ranks` as a message lists them: all of them up to 16, else the first 8 and how many there are in all, so
/// that a timeout in a large world stays one short line.
pub(crate) fn rank_list(ranks: &[u32]) -> String {
    const SHOWN: usize = 8;
    if ranks.len() <= 2 * SHOWN {
        return format!("{ranks:?}");
    }
    let first: Vec<String> = ranks[..SHOWN].iter().map(u32::to_string).collect();
    format!("[{}, ... ({} ranks in all)]", first.join(", "), ranks.len())
}

/// First bytes of every hello; "1" is the framing generation, [`VERSION`] the protocol inside it.
pub(crate) const MAGIC: [u8; 8] = *b"GDAKIBS1";
/// Protocol version a hello announces; the root rejects any other with a reason.
pub(crate) const VERSION: u32 = 1;
/// Hello payload: magic, version, secret, rank, world size.
pub(crate) const HELLO_LEN: usize = 8 + 4 + 16 + 4 + 4;

/// What a frame is. The numbers are the wire values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Rank → root, first frame: [`Hello`].
    Hello = 1,
    /// Root → rank after every rank joined: `rank u32, world_size u32`.
    Welcome = 2,
    /// Root → would-be rank: UTF-8 reason; the root closes the connection after it.
    Reject = 3,
    /// Rank → root: `seq u64` then this rank's contribution to all-gather number `seq`.
    Gather = 4,
    /// Root → rank: `seq u64` then, per rank in rank order, `len u32` and that many bytes.
    Gathered = 5,
    /// Point-to-point, relayed by the root: `src u32, dst u32, tag u32`, data.
    P2p = 6,
    /// Root → rank: the session is broken; UTF-8 reason naming the rank at fault.
    Abort = 7,
    /// Either way, empty: the sender is leaving the session on purpose (its `Bootstrap` was dropped), as
    /// opposed to a connection that just ends (a process that died).
    Goodbye = 8,
    /// Root → rank: `rank u32` left the session on purpose; UTF-8 reason.
    Left = 9,
}

impl Kind {
    fn from_u32(v: u32) -> Option<Kind> {
        Some(match v {
            1 => Kind::Hello,
            2 => Kind::Welcome,
            3 => Kind::Reject,
            4 => Kind::Gather,
            5 => Kind::Gathered,
            6 => Kind::P2p,
            7 => Kind::Abort,
            8 => Kind::Goodbye,
            9 => Kind::Left,
            _ => return None,
        })
    }
}

/// Why reading a frame failed. Callers add the peer's name.
#[derive(Debug)]
pub(crate) enum WireError {
    /// The peer closed the stream cleanly between frames.
    Closed,
    /// The socket failed or timed out.
    Io(io::Error),
    /// The bytes are not a frame we accept.
    Malformed(String),
    /// A frame began but was not complete within the bound: `got` bytes of a frame of `of` bytes (length
    /// field included; `None` while the length field itself was incomplete) arrived within `within`.
    Stalled { got: usize, of: Option<usize>, within: Duration },
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireError::Closed => f.write_str("connection closed"),
            WireError::Io(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                f.write_str("timed out")
            }
            WireError::Io(e) if e.kind() == io::ErrorKind::UnexpectedEof => f.write_str("truncated frame"),
            WireError::Io(e) => write!(f, "{e}"),
            WireError::Malformed(m) => f.write_str(m),
            WireError::Stalled { got, of: Some(of), within } => write!(
                f,
                "stalled mid-frame: sent {got} of the {of} bytes of a frame, and the rest did not come within \
                 {within:?} (a half-open connection?)"
            ),
            WireError::Stalled { got, of: None, within } => write!(
                f,
                "stalled mid-frame: sent {got} of the 8 bytes of a frame header, and the rest did not come within \
                 {within:?} (a half-open connection?)"
            ),
        }
    }
}

/// Writes one frame as one buffer (one `write_all`, so that a frame is never interleaved with another
/// writer's; callers still hold the link's lock). Fails without writing when the frame exceeds [`MAX_FRAME`].
pub(crate) fn write_frame(w: &mut impl Write, kind: Kind, parts: &[&[u8]]) -> io::Result<()> {
    let payload: usize = parts.iter().map(|p| p.len()).sum();
    let len = payload + 4;
    check_frame_len(len)?;
    let mut buf = Vec::with_capacity(len + 4);
    buf.extend_from_slice(&(len as u32).to_le_bytes());
    buf.extend_from_slice(&(kind as u32).to_le_bytes());
    for p in parts {
        buf.extend_from_slice(p);
    }
    w.write_all(&buf)?;
    w.flush()
}

/// Fails, as [`write_frame`] does, when a frame whose length field is `len` (the 4-byte kind plus the payload)
/// exceeds [`MAX_FRAME`]: also for what the bootstrap delivers without a socket (to the rank itself), so that a
/// call passes or fails by its size alone, wherever its peer is.
pub(crate) fn check_frame_len(len: usize) -> io::Result<()> {
    if len > MAX_FRAME as usize {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("frame of {len} bytes exceeds the limit of {MAX_FRAME} bytes (MAX_FRAME)"),
        ));
    }
    Ok(())
}

/// Reads one frame whose length field is at most `limit` ([`MAX_FRAME`] after the handshake, less for a
/// hello). The length is checked before the payload buffer is allocated.
pub(crate) fn read_frame(r: &mut impl Read, limit: u32) -> Result<(Kind, Vec<u8>), WireError> {
    let mut header = [0u8; 8];
    // The first read tells a clean close (nothing of a next frame) from a truncated one.
    let first = loop {
        match r.read(&mut header) {
            Ok(n) => break n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(WireError::Io(e)),
        }
    };
    if first == 0 {
        return Err(WireError::Closed);
    }
    r.read_exact(&mut header[first..]).map_err(WireError::Io)?;
    let len = u32::from_le_bytes(header[0..4].try_into().unwrap());
    let kind = u32::from_le_bytes(header[4..8].try_into().unwrap());
    let (kind, payload_len) = check_header(len, kind, limit)?;
    let mut payload = vec![0u8; payload_len];
    r.read_exact(&mut payload).map_err(WireError::Io)?;
    Ok((kind, payload))
}

/// Reads the frames of one connection after the handshake, bounding the time from a frame's first byte to its
/// last (see the module docs). Silence between frames is not bounded: the socket has no read timeout then.
pub(crate) struct FrameReader {
    inner: BufReader<TcpStream>,
    /// Whether the socket has a read timeout set (mid-frame), to clear before waiting for the next frame.
    timed: bool,
}

impl FrameReader {
    pub(crate) fn new(stream: TcpStream) -> FrameReader {
        FrameReader { inner: BufReader::new(stream), timed: false }
    }

    /// Reads the next frame, of a length field of at most `limit`. Waits for its first byte without a bound,
    /// then for the rest until `stall` has passed since that byte ([`WireError::Stalled`] after that, however
    /// slowly bytes still trickle in).
    pub(crate) fn next(&mut self, limit: u32, stall: Duration) -> Result<(Kind, Vec<u8>), WireError> {
        if self.inner.buffer().is_empty() && self.timed {
            self.inner.get_ref().set_read_timeout(None).map_err(WireError::Io)?;
            self.timed = false;
        }
        // The first byte: a clean close here is between frames.
        loop {
            match self.inner.fill_buf() {
                Ok([]) => return Err(WireError::Closed),
                Ok(_) => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(WireError::Io(e)),
            }
        }
        let deadline = Instant::now() + stall;
        let mut header = [0u8; 8];
        self.fill(&mut header, 0, None, deadline, stall)?;
        let len = u32::from_le_bytes(header[0..4].try_into().unwrap());
        let kind = u32::from_le_bytes(header[4..8].try_into().unwrap());
        let (kind, payload_len) = check_header(len, kind, limit)?;
        let mut payload = vec![0u8; payload_len];
        self.fill(&mut payload, 8, Some(8 + payload_len), deadline, stall)?;
        Ok((kind, payload))
    }

    /// Fills `buf` by `deadline`; `before` bytes of the frame (of `of` in all) came before `buf`, for the
    /// stall report.
    fn fill(
        &mut self,
        buf: &mut [u8],
        before: usize,
        of: Option<usize>,
        deadline: Instant,
        stall: Duration,
    ) -> Result<(), WireError> {
        let mut done = 0;
        while done < buf.len() {
            if self.inner.buffer().is_empty() {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(WireError::Stalled { got: before + done, of, within: stall });
                }
                // At least 1 ms: a zero timeout means "none" to the OS.
                self.inner
                    .get_ref()
                    .set_read_timeout(Some(left.max(Duration::from_millis(1))))
                    .map_err(WireError::Io)?;
                self.timed = true;
            }
            let available = match self.inner.fill_buf() {
                Ok([]) => return Err(WireError::Io(io::ErrorKind::UnexpectedEof.into())),
                Ok(b) => b,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // The OS's timer may end a little early: the loop's deadline check decides.
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => continue,
                Err(e) => return Err(WireError::Io(e)),
            };
            let n = available.len().min(buf.len() - done);
            buf[done..done + n].copy_from_slice(&available[..n]);
            self.inner.consume(n);
            done += n;
        }
        Ok(())
    }
}

/// Checks a frame header (length field `len`, kind `kind`) against `limit`; returns the kind and the payload's
/// length.
fn check_header(len: u32, kind: u32, limit: u32) -> Result<(Kind, usize), WireError> {
    if len > limit {
        let name = if limit == MAX_FRAME { " (MAX_FRAME)" } else { "" };
        return Err(WireError::Malformed(format!(
            "frame of {len} bytes announced, over the limit of {limit} bytes{name}"
        )));
    }
    if len < 4 {
        return Err(WireError::Malformed(format!("frame length {len} is shorter than its 4-byte kind")));
    }
    let kind = Kind::from_u32(kind).ok_or_else(|| WireError::Malformed(format!("unknown frame kind {kind}")))?;
    Ok((kind, len as usize - 4))
}

/// Little-endian reader over a payload; every getter fails (with the field's name) instead of panicking.
pub(crate) struct Fields<'a>(pub(crate) &'a [u8]);

impl<'a> Fields<'a> {
    pub(crate) fn bytes(&mut self, n: usize, what: &str) -> Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err(format!("truncated payload: {what} needs {n} bytes, {} left", self.0.len()));
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }
    pub(crate) fn u32(&mut self, what: &str) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.bytes(4, what)?.try_into().unwrap()))
    }
    pub(crate) fn u64(&mut self, what: &str) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.bytes(8, what)?.try_into().unwrap()))
    }
    pub(crate) fn rest(self) -> &'a [u8] {
        self.0
    }
}

/// A peer's text (a reject or abort reason) as one printable line of at most 300 characters: it goes into our
/// error messages, and it comes from the network.
pub(crate) fn one_line(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).chars().take(300).map(|c| if c.is_control() { ' ' } else { c }).collect()
}

/// The first frame of a rank that is not the root.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Hello {
    pub(crate) secret: [u8; 16],
    pub(crate) rank: u32,
    pub(crate) world_size: u32,
}

/// What the root made of a connection's first frame.
#[derive(Debug)]
pub(crate) enum Greeting {
    /// A hello of our protocol version.
    Hello(Hello),
    /// A gdaki hello of another protocol version: rejected with a reason the peer can read.
    OtherVersion(u32),
}

impl Hello {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut p = Vec::with_capacity(HELLO_LEN);
        p.extend_from_slice(&MAGIC);
        p.extend_from_slice(&VERSION.to_le_bytes());
        p.extend_from_slice(&self.secret);
        p.extend_from_slice(&self.rank.to_le_bytes());
        p.extend_from_slice(&self.world_size.to_le_bytes());
        p
    }

    /// Parses a connection's first frame. Anything but a gdaki hello is an error (the root drops it).
    pub(crate) fn decode(kind: Kind, payload: &[u8]) -> Result<Greeting, String> {
        if kind != Kind::Hello {
            return Err(format!("first frame is {kind:?}, not a hello"));
        }
        let mut f = Fields(payload);
        if f.bytes(8, "magic").ok() != Some(&MAGIC[..]) {
            return Err("not a gdaki bootstrap hello (bad magic)".into());
        }
        let version = f.u32("version")?;
        if version != VERSION {
            return Ok(Greeting::OtherVersion(version));
        }
        if payload.len() != HELLO_LEN {
            return Err(format!("hello of {} bytes, expected {HELLO_LEN}", payload.len()));
        }
        let secret = f.bytes(16, "secret")?.try_into().unwrap();
        Ok(Greeting::Hello(Hello { secret, rank: f.u32("rank")?, world_size: f.u32("world size")? }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    #[test]
    fn frame_round_trip_golden_bytes() {
        let mut buf = Vec::new();
        write_frame(&mut buf, Kind::P2p, &[&[1, 2], &[3]]).unwrap();
        assert_eq!(buf, [7, 0, 0, 0, 6, 0, 0, 0, 1, 2, 3]);
        let (kind, payload) = read_frame(&mut Cursor::new(&buf), MAX_FRAME).unwrap();
        assert_eq!((kind, payload), (Kind::P2p, vec![1, 2, 3]));
    }

    #[test]
    fn oversized_length_rejected_before_allocating() {
        // Only the 8 header bytes exist: had the reader allocated and read, it would report a truncated
        // frame instead of the size.
        let mut header = u32::MAX.to_le_bytes().to_vec();
        header.extend_from_slice(&1u32.to_le_bytes());
        let err = read_frame(&mut Cursor::new(header), MAX_FRAME).unwrap_err().to_string();
        assert_eq!(err, "frame of 4294967295 bytes announced, over the limit of 16777216 bytes (MAX_FRAME)");
        let mut hello = 41u32.to_le_bytes().to_vec();
        hello.extend_from_slice(&1u32.to_le_bytes());
        let err = read_frame(&mut Cursor::new(hello), 40).unwrap_err().to_string();
        assert_eq!(err, "frame of 41 bytes announced, over the limit of 40 bytes");
    }

    #[test]
    fn write_refuses_oversized_frame() {
        let big = vec![0u8; MAX_FRAME as usize - 3];
        let err = write_frame(&mut Vec::new(), Kind::P2p, &[&big]).unwrap_err().to_string();
        assert_eq!(err, "frame of 16777217 bytes exceeds the limit of 16777216 bytes (MAX_FRAME)");
        let fits = vec![0u8; MAX_FRAME as usize - 4];
        let mut out = Vec::new();
        write_frame(&mut out, Kind::P2p, &[&fits]).unwrap();
        assert_eq!(out.len(), MAX_FRAME as usize + 4);
    }

    #[test]
    fn unknown_kind_short_length_and_truncation() {
        let e = |b: &[u8]| read_frame(&mut Cursor::new(b.to_vec()), MAX_FRAME).unwrap_err().to_string();
        assert_eq!(e(&[4, 0, 0, 0, 99, 0, 0, 0]), "unknown frame kind 99");
        assert_eq!(e(&[2, 0, 0, 0, 1, 0, 0, 0]), "frame length 2 is shorter than its 4-byte kind");
        assert_eq!(e(&[9, 0, 0, 0, 1, 0, 0, 0, 1]), "truncated frame");
        assert_eq!(e(&[9, 0, 0]), "truncated frame");
        assert_eq!(e(&[]), "connection closed");
    }

    #[test]
    fn hello_round_trip_and_rejections() {
        let h = Hello { secret: [7; 16], rank: 3, world_size: 4 };
        match Hello::decode(Kind::Hello, &h.encode()).unwrap() {
            Greeting::Hello(got) => assert_eq!(got, h),
            other => panic!("{other:?}"),
        }
        let mut v2 = h.encode();
        v2[8] = 2;
        assert!(matches!(Hello::decode(Kind::Hello, &v2), Ok(Greeting::OtherVersion(2))));
        let mut bad = h.encode();
        bad[0] = b'X';
        assert_eq!(Hello::decode(Kind::Hello, &bad).unwrap_err(), "not a gdaki bootstrap hello (bad magic)");
        assert_eq!(Hello::decode(Kind::Hello, &h.encode()[..20]).unwrap_err(), "hello of 20 bytes, expected 36");
        assert_eq!(Hello::decode(Kind::Gather, &h.encode()).unwrap_err(), "first frame is Gather, not a hello");
    }
}
