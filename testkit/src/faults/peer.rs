//! A peer process killed with SIGKILL in the middle of a 64 MiB transfer: the peer's side ([`run_peer`]),
//! the parent's handle on it ([`Peer`]), and the case.
//!
//! The two exchange their QP endpoint and MR info as one line of hex each way through the child's stdin
//! and stdout (the child's lines start with [`LINE_PREFIX`], so that whatever else the child prints, such as a
//! test harness's banner, is skipped; the prefix may follow other text on its line).

use std::io::{self, BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use gdaki_device::wqe::{self, Raddr, Sge};
use gdaki_device::Error as DevError;
use gdaki_shared::handle::{MrHandle, RemoteMr};
use gdaki_shared::prm::opcode::syndrome;
use gdaki_shared::Be32;

use gdaki::mem::{MemKind, MemLoc};
use gdaki::nic::emu::{Access, EmuConfig, EmuNic, Endpoint, WireConfig, ENDPOINT_BYTES};
use gdaki::{Error, Result};

use super::guard::{Guarded, WORD0};
use super::rig::{dev_qp, next_cqe, outcome, setup, step, wired};
use super::{Check, Ctx, Observed};

/// Marks every line the peer writes for the parent (what follows it on the line is the message); anything
/// else on its stdout is ignored.
pub const LINE_PREFIX: &str = "gdaki-faults-peer:";

/// Bytes the peer receives (its receive MR), and the transfer the parent starts: 16 RDMA WRITEs of 4 MiB.
pub const TRANSFER: usize = 64 << 20;
const CHUNK: usize = 4 << 20;
const CHUNKS: usize = TRANSFER / CHUNK;

/// How long a peer lives at most, whatever happens to its parent.
const PEER_LIFETIME: Duration = Duration::from_secs(60);
/// How long the parent waits for each line of the peer.
const LINE_TIMEOUT: Duration = Duration::from_secs(10);

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect()
}

/// What the peer tells the parent: its QP's endpoint, its receive MR and its semaphore MR.
struct PeerInfo {
    ep: Endpoint,
    data: RemoteMr,
    sem: RemoteMr,
}

const REMOTE_BYTES: usize = 20;

fn put_remote(r: &RemoteMr, out: &mut Vec<u8>) {
    out.extend_from_slice(&r.addr.to_le_bytes());
    out.extend_from_slice(&r.length.to_le_bytes());
    out.extend_from_slice(&r.rkey.get().to_le_bytes());
}

fn get_remote(b: &[u8]) -> RemoteMr {
    let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or_default());
    let rkey = u32::from_le_bytes(b[16..20].try_into().unwrap_or_default());
    RemoteMr { addr: u64_at(0), length: u64_at(8), rkey: Be32::new(rkey), pad: 0 }
}

impl PeerInfo {
    fn encode(&self) -> String {
        let mut b = self.ep.to_bytes().to_vec();
        put_remote(&self.data, &mut b);
        put_remote(&self.sem, &mut b);
        hex(&b)
    }

    fn decode(s: &str) -> std::result::Result<PeerInfo, String> {
        let b = unhex(s).ok_or_else(|| format!("peer info is not hex: {s:?}"))?;
        if b.len() != ENDPOINT_BYTES + 2 * REMOTE_BYTES {
            return Err(format!("peer info of {} bytes", b.len()));
        }
        let ep = Endpoint::from_bytes(&b[..ENDPOINT_BYTES]).map_err(|e| e.to_string())?;
        let data = get_remote(&b[ENDPOINT_BYTES..ENDPOINT_BYTES + REMOTE_BYTES]);
        let sem = get_remote(&b[ENDPOINT_BYTES + REMOTE_BYTES..]);
        Ok(PeerInfo { ep, data, sem })
    }
}

/// The peer process's body (the SIGKILL case runs it in a child process, which the parent then kills).
///
/// Opens an emulated NIC with a loopback wire, creates a QP, registers a [`TRANSFER`]-byte receive MR
/// (`LOCAL_WRITE | REMOTE_WRITE`) and an 8-byte semaphore MR (`LOCAL_WRITE | REMOTE_ATOMIC`), and writes one
/// line to `output`: [`LINE_PREFIX`], ` info `, then the hex of its endpoint ([`Endpoint::to_bytes`]) and of
/// both MRs (address, length: u64 little-endian; rkey: u32 little-endian). Reads one line from `input`: the
/// hex of the parent QP's endpoint; connects to it and writes [`LINE_PREFIX`]` connected`. Then waits until
/// `input` ends (the parent closed it, or died) and returns. The process exits by itself after 60 s in any
/// case, so that a peer whose parent forgot it does not linger.
///
/// # Errors
/// [`Error::Emu`] from the NIC, [`Error::InvalidArgument`] for a malformed endpoint line, and
/// [`Error::Bootstrap`] when `input` or `output` fail or `input` ends before the endpoint line.
pub fn run_peer(input: impl BufRead, mut output: impl Write) -> Result<()> {
    std::thread::spawn(|| {
        std::thread::sleep(PEER_LIFETIME);
        std::process::exit(2);
    });
    let io_err = |e: io::Error| Error::Bootstrap(format!("faults peer: {e}"));
    let nic = EmuNic::open(EmuConfig::host_or_env()?.with_wire(WireConfig::loopback()))?;
    let pd = nic.alloc_pd()?;
    let cq = nic.create_cq(64)?;
    let qp = nic.create_qp(&pd, &cq, 64)?;
    let data = vec![0u64; TRANSFER / 8];
    let sem = vec![0u64; 1];
    let loc = |v: &Vec<u64>| MemLoc { kind: MemKind::Host, addr: v.as_ptr() as u64 };
    // SAFETY: `data` and `sem` are declared before the MRs, so they are dropped after them, and are never
    // moved or resized meanwhile; the NIC is their only writer.
    let data_mr = unsafe { nic.reg_mr(&pd, loc(&data), TRANSFER as u64, Access::LOCAL_WRITE | Access::REMOTE_WRITE) }?;
    // SAFETY: as above.
    let sem_mr = unsafe { nic.reg_mr(&pd, loc(&sem), 8, Access::LOCAL_WRITE | Access::REMOTE_ATOMIC) }?;
    let info = PeerInfo { ep: qp.endpoint(), data: data_mr.remote(), sem: sem_mr.remote() };
    writeln!(output, "{LINE_PREFIX} info {}", info.encode()).and_then(|()| output.flush()).map_err(io_err)?;
    let mut lines = input.lines();
    let line = lines
        .next()
        .ok_or_else(|| Error::Bootstrap("faults peer: input ended before the parent's endpoint".into()))?
        .map_err(io_err)?;
    let ep = unhex(line.trim()).ok_or_else(|| Error::InvalidArgument(format!("endpoint line {line:?}")))?;
    qp.connect(&Endpoint::from_bytes(&ep)?)?;
    writeln!(output, "{LINE_PREFIX} connected").and_then(|()| output.flush()).map_err(io_err)?;
    for l in lines {
        l.map_err(io_err)?;
    }
    Ok(())
}

/// The parent's handle on a peer process: its stdin, its prefixed stdout lines, and its reaping. Dropping it
/// kills the process (if it still runs) and waits for it, so that no peer outlives its case.
struct Peer {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
}

impl Peer {
    fn spawn(mut cmd: Command) -> std::result::Result<Peer, String> {
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::inherit());
        let mut child = cmd.spawn().map_err(|e| format!("cannot start the peer process {cmd:?}: {e}"))?;
        let (stdin, stdout) = (child.stdin.take(), child.stdout.take());
        let (tx, lines) = mpsc::channel();
        if let Some(out) = stdout {
            std::thread::spawn(move || {
                for l in BufReader::new(out).lines().map_while(|l| l.ok()) {
                    // Anywhere in the line: a test harness may have started it ("test peer_child ... ").
                    if let Some(i) = l.find(LINE_PREFIX) {
                        if tx.send(l[i + LINE_PREFIX.len()..].trim().to_string()).is_err() {
                            return;
                        }
                    }
                }
            });
        }
        Ok(Peer { child, stdin, lines })
    }

    /// The peer's next line (prefix removed).
    fn line(&self) -> std::result::Result<String, String> {
        self.lines.recv_timeout(LINE_TIMEOUT).map_err(|e| match e {
            RecvTimeoutError::Timeout => format!("the peer said nothing within {LINE_TIMEOUT:?}"),
            RecvTimeoutError::Disconnected => "the peer's output ended (did it start? see its stderr)".into(),
        })
    }

    fn send(&mut self, line: &str) -> std::result::Result<(), String> {
        let w = self.stdin.as_mut().ok_or("the peer has no stdin")?;
        writeln!(w, "{line}").and_then(|()| w.flush()).map_err(|e| format!("writing to the peer: {e}"))
    }

    /// SIGKILL (on Unix; `TerminateProcess` elsewhere), then reaps the process.
    fn kill(&mut self) -> io::Result<ExitStatus> {
        self.child.kill()?;
        self.child.wait()
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(unix)]
fn killed_by_sigkill(s: &ExitStatus) -> bool {
    use std::os::unix::process::ExitStatusExt;
    s.signal() == Some(9)
}

#[cfg(not(unix))]
fn killed_by_sigkill(s: &ExitStatus) -> bool {
    !s.success()
}

fn raddr(mr: &RemoteMr, off: usize) -> Raddr {
    Raddr { addr: mr.addr + off as u64, rkey: mr.rkey }
}

/// The catalogue's lengths are constants in 1 ..= 2^31 − 1.
fn sge(mr: &MrHandle, off: usize, len: usize) -> Sge {
    Sge::new(mr.addr + off as u64, len as u32, mr.lkey).expect("a catalogue SGE length")
}

/// The peer is killed with SIGKILL in the middle of a 64 MiB transfer (16 signaled 4 MiB RDMA WRITEs and a
/// signal, one doorbell, after a first 4 MiB WRITE completed), as soon as the NIC starts on that doorbell.
/// Device code then waits on a local semaphore the peer would have signaled (`Qp::wait_semaphore`): the wait
/// must end with the error CQE, not a timeout; the first WQE the peer did not acknowledge completes with 0x15
/// (transport retry exceeded: what the hardware reports for a peer that vanished), every later one with 0x05
/// (flushed), and the QP is in the error state. The retry timeout is 5 s, so the error must come from the
/// lost connection, not from the timer.
pub(crate) fn peer_killed(ctx: &Ctx) -> std::result::Result<Observed, String> {
    const TIMEOUT: Duration = Duration::from_secs(2);
    const RETRY: Duration = Duration::from_secs(5);
    let mut peer = Peer::spawn(ctx.peer_command())?;
    let line = peer.line()?;
    let info = PeerInfo::decode(line.strip_prefix("info ").ok_or_else(|| format!("peer said {line:?}"))?)?;
    let nic = setup(wired(RETRY).and_then(EmuNic::open))?;
    let pd = setup(nic.alloc_pd())?;
    let cq = setup(nic.create_cq(64))?;
    let qp = setup(nic.create_qp(&pd, &cq, 64))?;
    setup(qp.connect(&info.ep))?;
    peer.send(&hex(&qp.endpoint().to_bytes()))?;
    let line = peer.line()?;
    if line != "connected" {
        return Err(format!("peer said {line:?} instead of connected"));
    }
    let (src, res, sem) = (Guarded::new(TRANSFER, 14), Guarded::new(8, 15), Guarded::new(8, 16));
    sem.write_u64(0, 0);
    let src_mr = setup(src.register(&nic, &pd, Access::NONE))?;
    let res_mr = setup(res.register(&nic, &pd, Access::LOCAL_WRITE))?;
    // The local semaphore, registered for the peer's atomics as a ping-pong would (the peer dies first).
    let _sem_mr = setup(sem.register(&nic, &pd, Access::LOCAL_WRITE | Access::REMOTE_ATOMIC))?;
    let mut h = qp.handle();
    let (rung, abandon, doorbells) = (AtomicBool::new(false), AtomicBool::new(false), AtomicU64::new(0));

    let (device, killed) = std::thread::scope(|s| {
        // The killer: SIGKILL as soon as the NIC has started on the doorbell of the 16 WQEs.
        let killer = s.spawn(|| {
            let t = Instant::now();
            while !rung.load(Ordering::Acquire) || nic.stats().doorbells <= doorbells.load(Ordering::Acquire) {
                if abandon.load(Ordering::Acquire) || t.elapsed() > Duration::from_secs(10) {
                    return None;
                }
                // Yield rather than spin: on a 2-core machine the executor and device code need the cores.
                std::thread::yield_now();
            }
            Some(peer.kill())
        });
        let device = (|| {
            // SAFETY: `h` is `qp`'s handle (alive, host memory); only this thread uses it.
            let mut d = unsafe { dev_qp(&mut h, TIMEOUT) };
            let data = info.data;
            let t0 = step(
                "the first 4 MiB",
                d.post(true, wqe::rdma_write(raddr(&data, 0), sge(&src_mr.handle(), 0, CHUNK))),
            )?;
            d.ring_db();
            step("the first 4 MiB completing", d.wait(t0))?;
            doorbells.store(nic.stats().doorbells, Ordering::Release);
            for k in 1..CHUNKS {
                let (r, l) = (raddr(&data, k * CHUNK), sge(&src_mr.handle(), k * CHUNK, CHUNK));
                let _ = step("posting a 4 MiB WRITE", d.post(true, wqe::rdma_write(r, l)))?;
            }
            // The signal rings the doorbell for all of them.
            let _ = step("posting the signal", d.signal(&info.sem, 0, &res_mr.handle(), 0))?;
            rung.store(true, Ordering::Release);
            let start = Instant::now();
            // SAFETY: the semaphore word stays allocated and registered for the whole wait.
            let r = unsafe { d.wait_semaphore(sem.word_ptr(0), 1) };
            let waited = start.elapsed();
            let first = d.error();
            let mut rest = Vec::new();
            while d.handle().sq.ci < d.handle().sq.pi {
                match next_cqe(&mut d, TIMEOUT) {
                    Some(c) => rest.push(c),
                    None => break,
                }
            }
            let all_retired = d.handle().sq.ci == d.handle().sq.pi;
            Ok::<_, String>((r, waited, first, rest, all_retired, d.handle().sq.pi))
        })();
        abandon.store(true, Ordering::Release);
        (device, killer.join())
    });
    let (r, waited, first, rest, all_retired, pi) = device?;
    let status = match killed {
        Ok(Some(Ok(st))) => Some(st),
        Ok(Some(Err(e))) => return Err(format!("killing the peer: {e}")),
        Ok(None) => None,
        Err(_) => return Err("the killer thread panicked".into()),
    };
    let mut checks = vec![Check::new(
        format!("the peer died of SIGKILL during the transfer ({status:?})"),
        status.is_some_and(|s| killed_by_sigkill(&s)),
    )];
    // WQE 0 completed before; the one that failed first got 0x15; all later ones must be flushed in order.
    let k = first.map_or(0, |e| e.wqe_counter as u64);
    checks.push(Check::new(
        format!("{} of the {} WQEs rung together were acknowledged before the kill", k.saturating_sub(1), pi - 1),
        (1..pi).contains(&k),
    ));
    let flushed: Vec<_> = rest
        .iter()
        .map(|c| match c {
            Err(DevError::Cqe(e)) => Some((e.syndrome, e.wqe_counter as u64)),
            _ => None,
        })
        .collect();
    let want: Vec<_> = (k + 1..pi).map(|w| Some((syndrome::WR_FLUSH_ERR, w))).collect();
    checks.push(Check::new(
        format!("WQEs {}..={} flushed with 0x05 in order ({} flush CQEs)", k + 1, pi - 1, flushed.len()),
        flushed == want,
    ));
    checks.push(Check::new("every WQE completed (the SQ is empty)", all_retired));
    checks.push(Check::new(
        format!("noticed from the lost connection, not the {RETRY:?} retry timeout ({waited:?})"),
        waited < RETRY,
    ));
    let outside = src.changed_outside(&[]) + res.changed_outside(&[]) + sem.changed_outside(&[WORD0]);
    checks.push(Check::new("the local semaphore still reads 0", sem.u64_at(0) == 0));
    let qp_state = qp.state();
    drop(peer);
    Ok(Observed { outcome: outcome(&r), qp_state, outside_changed: outside, waited, bound: TIMEOUT, checks })
}
