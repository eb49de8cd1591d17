//! Deadlines from caller-given timeouts, and socket reads bounded by one deadline in all.

use std::io::{self, Read};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// How far away [`after`] puts a deadline that the clock cannot hold: about 136 years.
const FAR: Duration = Duration::from_secs(u32::MAX as u64);

/// The instant `timeout` from now. A timeout the clock cannot add (`Duration::MAX`, say) gives a deadline
/// about 136 years away, as good as none, where `Instant + Duration` would panic on the overflow.
pub(crate) fn after(timeout: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(timeout).unwrap_or_else(|| now + FAR)
}

/// Reads of `stream` that together wait no longer than until `deadline`, however the peer spaces its bytes:
/// each read sets the socket's read timeout to the time left (a timeout per read would let a peer that sends
/// a byte now and then hold a reader forever), and fails with [`io::ErrorKind::TimedOut`] once the deadline
/// has passed. The socket's read timeout stays set: a caller that reads on without a bound clears it.
pub(crate) struct ReadBy<'a> {
    /// The socket read.
    pub(crate) stream: &'a TcpStream,
    /// When reads stop waiting.
    pub(crate) deadline: Instant,
}

impl Read for ReadBy<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let left = self.deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::ErrorKind::TimedOut.into());
            }
            // At least 1 ms: a zero timeout means "none" to the OS.
            self.stream.set_read_timeout(Some(left.max(Duration::from_millis(1))))?;
            match (&mut &*self.stream).read(buf) {
                // The OS's timer may end a little early: only the deadline says the time is up.
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => continue,
                r => return r,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::TcpListener;

    #[test]
    fn a_timeout_the_clock_cannot_add_is_far_away_not_a_panic() {
        let d = after(Duration::MAX);
        assert!(d > Instant::now() + Duration::from_secs(100 * 365 * 24 * 3600));
        let t = Instant::now();
        assert!(after(Duration::from_millis(50)) >= t + Duration::from_millis(50));
    }

    /// A peer that sends a byte every 100 ms (20 bytes would take 2 s): the reads end at the deadline, 500 ms
    /// in all, with `TimedOut`, though bytes keep coming.
    #[test]
    fn a_trickling_peer_is_cut_off_at_the_deadline() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let sender = std::thread::spawn(move || {
            let mut s = TcpStream::connect(addr).unwrap();
            for _ in 0..20 {
                if s.write_all(&[7]).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        let (stream, _) = listener.accept().unwrap();
        let start = Instant::now();
        let mut buf = [0u8; 20];
        let r = ReadBy { stream: &stream, deadline: start + Duration::from_millis(500) }.read_exact(&mut buf);
        let took = start.elapsed();
        assert_eq!(r.map_err(|e| e.kind()), Err(io::ErrorKind::TimedOut));
        assert!(took >= Duration::from_millis(500) && took < Duration::from_millis(1500), "{took:?}");
        drop(stream);
        sender.join().unwrap();
    }
}
