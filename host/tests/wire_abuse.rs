//! The wire under abuse: a raw TCP peer that speaks the emulated NIC's RC framing by hand (layout from
//! `host/src/nic/emu/wire/packet.rs`) and sends what no honest NIC would: garbage, hellos that name the
//! wrong NIC or QP, malformed frames, out-of-order PSNs, responses to nothing, READ responses longer than
//! asked, WRITEs outside their MR or into another PD's MR. The NIC under test must answer with a reject, a
//! NAK or a link-down (0x15 on its outstanding WQEs), never panic, never write outside a registered region,
//! and its other QPs must keep working. Also: QPs and MRs dropped while a large WRITE is in flight, odd retry
//! timeouts, a peer that stops reading, a peer that connects late, a peer that floods the NIC faster than it
//! handles frames (bounded inbound queue), a peer that stops in the middle of a frame, and the requester's
//! rules (READs and atomics a responder holds unanswered, a WRITE after a READ).
//!
//! Four of these reproduced bugs that are fixed: a peer that stops reading hung the executor (now the executor
//! never waits on a socket, and a peer that takes nothing for the retry timeout fails the link), a
//! `Duration::MAX` retry timeout panicked a thread (now refused), a peer that connects late killed the link
//! (now the dialer retries), and a NAK's syndrome was trusted (now checked).

mod emu_util;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use emu_util::*;
use gdaki::mem::MemKind;
use gdaki::nic::emu::{Access, Cq, EmuConfig, EmuNic, Endpoint, Pd, Qp, QpState, SimGpu, WireConfig};
use gdaki_shared::prm::opcode::{self, syndrome};
use gdaki_shared::prm::wqe::AtomicSeg;

// ---- the frame layout of packet.rs, by hand ----

const HEADER: usize = 40;
const HELLO_MAGIC: u32 = 0x4744_4b57;
/// The encoding's version a hello carries.
const VERSION: u64 = 2;
/// Bytes of an IPC handle.
const HANDLE: usize = 64;

mod kind {
    pub const WRITE: u8 = 1;
    pub const READ: u8 = 2;
    pub const FETCH_ADD: u8 = 3;
    pub const WRITE_IPC: u8 = 5;
    pub const ACK: u8 = 16;
    pub const NAK: u8 = 17;
    pub const READ_RESP: u8 = 18;
    pub const ATOMIC_RESP: u8 = 19;
    pub const HELLO: u8 = 32;
    pub const HELLO_ACK: u8 = 33;
    pub const REJECT: u8 = 34;
    pub const IPC_OFFER: u8 = 35;
    pub const IPC_ANSWER: u8 = 36;
}

const FLAG_LAST: u8 = 1;

/// One header's fields, as packet.rs's module docs lay them out.
#[derive(Clone, Copy, Default, Debug)]
struct H {
    kind: u8,
    flags: u8,
    w1: u32,
    w2: u32,
    w3: u32,
    q2: u64,
    q3: u64,
    q4: u64,
}

fn frame(h: H, data: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(4 + HEADER + data.len());
    b.extend_from_slice(&((HEADER + data.len()) as u32).to_le_bytes());
    b.extend_from_slice(&[h.kind, h.flags, 0, 0]);
    for w in [h.w1, h.w2, h.w3] {
        b.extend_from_slice(&w.to_le_bytes());
    }
    for q in [h.q2, h.q3, h.q4] {
        b.extend_from_slice(&q.to_le_bytes());
    }
    b.extend_from_slice(data);
    b
}

fn hello(src_nic: u64, src_qpn: u32, dst_nic: u64, dst_qpn: u32, version: u64) -> Vec<u8> {
    frame(
        H {
            kind: kind::HELLO,
            w1: dst_qpn,
            w2: src_qpn,
            w3: HELLO_MAGIC,
            q2: src_nic,
            q3: dst_nic,
            q4: version,
            ..H::default()
        },
        &[],
    )
}

/// One WRITE packet of a message of `total` bytes.
fn write_pkt(psn: u32, rkey: u32, raddr: u64, total: u64, offset: u64, data: &[u8]) -> Vec<u8> {
    let last = offset + data.len() as u64 == total;
    frame(
        H {
            kind: kind::WRITE,
            flags: if last { FLAG_LAST } else { 0 },
            w1: psn,
            w2: rkey,
            q2: raddr,
            q3: total,
            q4: offset,
            ..H::default()
        },
        data,
    )
}

/// Reads one frame: (header fields, payload). `None` when the connection ends (EOF or reset) first.
fn read_frame(s: &mut TcpStream) -> Option<(H, Vec<u8>)> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).ok()?;
    let len = u32::from_le_bytes(len) as usize;
    assert!((HEADER..=HEADER + 256 * 1024).contains(&len), "the NIC sent a frame of {len} bytes");
    let mut b = vec![0u8; len];
    s.read_exact(&mut b).ok()?;
    let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
    let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
    let h = H {
        kind: b[0],
        flags: b[1],
        w1: u32_at(4),
        w2: u32_at(8),
        w3: u32_at(12),
        q2: u64_at(16),
        q3: u64_at(24),
        q4: u64_at(32),
    };
    Some((h, b[HEADER..].to_vec()))
}

/// Asserts the NIC closes the connection (protocol violation) within a few seconds, reading away whatever
/// it still sends.
fn assert_closed(s: &mut TcpStream, what: &str) {
    s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return,
            Ok(_) => continue,
            Err(e) if matches!(e.kind(), std::io::ErrorKind::ConnectionReset) => return,
            Err(e) => panic!("{what}: the NIC did not close the connection: {e}"),
        }
    }
}

/// A NIC under test, with a PD, a CQ, and a second PD for cross-PD checks.
struct Victim {
    nic: Arc<EmuNic>,
    pd: Pd,
    other_pd: Pd,
    cq: Cq,
}

impl Victim {
    fn new(retry: Duration) -> Self {
        Self::open(wired(retry))
    }

    fn open(config: EmuConfig) -> Self {
        let nic = EmuNic::open(config).unwrap();
        let (pd, other_pd, cq) = (nic.alloc_pd().unwrap(), nic.alloc_pd().unwrap(), nic.create_cq(256).unwrap());
        Self { nic, pd, other_pd, cq }
    }
}

/// Fake NIC id that is smaller than any real one (ids are random and nonzero): the fake peer dials.
const SMALL_NIC: u64 = 1;
/// Fake NIC id larger than any real one: the NIC under test dials the fake peer.
const LARGE_NIC: u64 = u64::MAX;
const FAKE_QPN: u32 = 0x00ab_cdef;
const FAKE_PSN: u32 = 0x00ff_fffe; // wraps after two messages

/// Connects `qp` of the NIC under test to a fake peer that dials it, says a valid hello and gets the ack.
/// Returns the fake's stream.
fn fake_dials(v: &Victim, qp: &Qp) -> TcpStream {
    let ep = Endpoint { nic: SMALL_NIC, qpn: FAKE_QPN, psn: FAKE_PSN, wire: Some("127.0.0.1:9".parse().unwrap()) };
    qp.connect(&ep).unwrap();
    let mut s = TcpStream::connect(v.nic.wire_addr().unwrap()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(&hello(SMALL_NIC, FAKE_QPN, v.nic.id(), qp.qpn(), VERSION)).unwrap();
    let (h, _) = read_frame(&mut s).expect("answer to the hello");
    assert_eq!(h.kind, kind::HELLO_ACK, "{h:?}");
    s
}

/// Connects `qp` to a fake peer the NIC under test dials; the fake accepts, checks the hello, acks it.
fn nic_dials(qp: &Qp) -> TcpStream {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let ep = Endpoint { nic: LARGE_NIC, qpn: FAKE_QPN, psn: FAKE_PSN, wire: Some(l.local_addr().unwrap()) };
    qp.connect(&ep).unwrap();
    let (mut s, _) = l.accept().unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let (h, _) = read_frame(&mut s).expect("a hello");
    assert_eq!(
        (h.kind, h.w1, h.w2, h.w3, h.q3, h.q4),
        (kind::HELLO, FAKE_QPN, qp.qpn(), HELLO_MAGIC, LARGE_NIC, VERSION)
    );
    s.write_all(&frame(H { kind: kind::HELLO_ACK, ..H::default() }, &[])).unwrap();
    s
}

/// Two real NICs with one connected QP pair; checks a WRITE and a READ round trip still work.
fn assert_legit_pair_works(nic_a: &Arc<EmuNic>, nic_b: &Arc<EmuNic>) {
    let (pd_a, pd_b) = (nic_a.alloc_pd().unwrap(), nic_b.alloc_pd().unwrap());
    let (cq_a, cq_b) = (nic_a.create_cq(64).unwrap(), nic_b.create_cq(64).unwrap());
    let a = nic_a.create_qp(&pd_a, &cq_a, 64).unwrap();
    let b = nic_b.create_qp(&pd_b, &cq_b, 64).unwrap();
    a.connect(&b.endpoint()).unwrap();
    b.connect(&a.endpoint()).unwrap();
    let (src, dst, back) = (GuardedBuf::new(4096, 0x5a), GuardedBuf::new(4096, 0), GuardedBuf::new(4096, 0));
    let lmr = src.register(nic_a, &pd_a, Access::NONE);
    let bmr = back.register(nic_a, &pd_a, Access::LOCAL_WRITE);
    let rmr = dst.register(nic_b, &pd_b, Access::ALL);
    let (mut sq, mut cq) = (Sq::new(&a), CqPoll::new(&cq_a));
    let at = sq.post(&sq.write(SIGNALED, (lmr.lkey(), src.addr(), 4096), dst.addr(), rmr.rkey()));
    assert_req(&cq.wait(), opcode::RDMA_WRITE, sq.qpn(), at, 0);
    let at = sq.post(&sq.read(SIGNALED, (bmr.lkey(), back.addr(), 4096), dst.addr(), rmr.rkey()));
    assert_req(&cq.wait(), opcode::RDMA_READ, sq.qpn(), at, 4096);
    assert!(back.read().iter().all(|&b| b == 0x5a));
    assert!(src.guards_intact() && dst.guards_intact() && back.guards_intact());
}

// ---- 1. strangers on the listener ----

#[test]
fn garbage_on_the_listener_changes_nothing() {
    let (nic_a, nic_b) =
        (EmuNic::open(wired(Duration::from_secs(3))).unwrap(), EmuNic::open(wired(Duration::from_secs(3))).unwrap());
    let addr = nic_b.wire_addr().unwrap();
    let mut held = Vec::new();
    let send = |bytes: &[u8]| {
        let mut s = TcpStream::connect(addr).unwrap();
        let _ = s.write_all(bytes);
        s
    };
    // Random bytes; lengths out of range; a right-sized frame of an unknown kind; a hello without the magic;
    // a request kind as first frame; a truncated hello; nothing at all (held open: costs one thread for 5 s).
    let mut rng_state = 0x1234_5678_9abc_def0u64;
    let garbage: Vec<u8> = (0..4096)
        .map(|_| {
            rng_state ^= rng_state << 13;
            rng_state ^= rng_state >> 7;
            rng_state ^= rng_state << 17;
            rng_state as u8
        })
        .collect();
    held.push(send(&garbage));
    held.push(send(&u32::MAX.to_le_bytes()));
    held.push(send(&0u32.to_le_bytes()));
    held.push(send(&39u32.to_le_bytes()));
    held.push(send(&frame(H { kind: 99, ..H::default() }, &[])));
    let mut no_magic = hello(1, 2, nic_b.id(), 3, VERSION);
    no_magic[16..20].copy_from_slice(&0u32.to_le_bytes());
    held.push(send(&no_magic));
    held.push(send(&write_pkt(0, 0, 0, 8, 0, &[0; 8])));
    held.push(send(&hello(1, 2, nic_b.id(), 3, VERSION)[..20]));
    held.push(send(&[]));
    drop(send(&[])); // connect and leave at once
                     // Every connection that said something is closed by the NIC, without an answer (or with a reject).
                     // (The truncated hello is a slow sender: it gets HELLO_TIMEOUT, 5 s, to finish.)
    for (i, s) in held.iter_mut().take(7).enumerate() {
        s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        let mut b = [0u8; 64];
        match s.read(&mut b) {
            Ok(0) => {}
            Ok(n) => panic!("the NIC answered garbage #{i} with {n} bytes"),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            Err(e) => panic!("garbage connection #{i} left open: {e}"),
        }
    }
    assert!(nic_b.executor_alive() && nic_a.executor_alive());
    // While the silent connections are still open, a real pair on the same NICs works.
    assert_legit_pair_works(&nic_a, &nic_b);
    assert_legit_pair_works(&nic_b, &nic_a);
    assert!(nic_b.executor_alive() && nic_a.executor_alive());
    drop(held);
}

#[test]
fn hellos_naming_the_wrong_nic_qp_or_version_are_rejected_with_the_reason() {
    let v = Victim::new(Duration::from_millis(300));
    let qp = v.nic.create_qp(&v.pd, &v.cq, 64).unwrap();
    let ep = Endpoint { nic: SMALL_NIC, qpn: FAKE_QPN, psn: 0, wire: Some("127.0.0.1:9".parse().unwrap()) };
    qp.connect(&ep).unwrap();
    // A QP connected to a peer on a NIC with a larger id: the NIC under test dials that one, so an inbound
    // hello for it is refused.
    let dialing = v.nic.create_qp(&v.pd, &v.cq, 64).unwrap();
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    dialing.connect(&Endpoint { nic: LARGE_NIC, qpn: 7, psn: 0, wire: Some(l.local_addr().unwrap()) }).unwrap();
    // A QP never connected.
    let lonely = v.nic.create_qp(&v.pd, &v.cq, 64).unwrap();
    let ask = |bytes: Vec<u8>| -> u8 {
        let mut s = TcpStream::connect(v.nic.wire_addr().unwrap()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        s.write_all(&bytes).unwrap();
        let (h, data) = read_frame(&mut s).expect("an answer");
        assert!(data.is_empty());
        match h.kind {
            kind::REJECT => h.w3 as u8,
            kind::HELLO_ACK => 0,
            k => panic!("answer of kind {k}"),
        }
    };
    let me = v.nic.id();
    assert_eq!(ask(hello(SMALL_NIC, FAKE_QPN, me ^ 1, qp.qpn(), VERSION)), 1, "wrong NIC");
    assert_eq!(ask(hello(SMALL_NIC, FAKE_QPN, me, 0x00ff_fff0, VERSION)), 2, "no such QP");
    assert_eq!(ask(hello(SMALL_NIC, FAKE_QPN + 1, me, qp.qpn(), VERSION)), 6, "another source QP");
    assert_eq!(ask(hello(SMALL_NIC + 1, FAKE_QPN, me, qp.qpn(), VERSION)), 6, "another source NIC");
    assert_eq!(ask(hello(SMALL_NIC, FAKE_QPN, me, qp.qpn(), VERSION + 1)), 5, "other version");
    assert_eq!(ask(hello(LARGE_NIC, 7, me, dialing.qpn(), VERSION)), 4, "the NIC dials this one itself");
    let t = Instant::now();
    assert_eq!(ask(hello(SMALL_NIC, FAKE_QPN, me, lonely.qpn(), VERSION)), 3, "QP never connected");
    assert!(t.elapsed() < Duration::from_secs(2), "refused after the retry timeout, not later");
    // The valid hello still gets through after all that, and a second one is refused as busy.
    let mut first = TcpStream::connect(v.nic.wire_addr().unwrap()).unwrap();
    first.write_all(&hello(SMALL_NIC, FAKE_QPN, me, qp.qpn(), VERSION)).unwrap();
    first.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    assert_eq!(read_frame(&mut first).unwrap().0.kind, kind::HELLO_ACK);
    assert_eq!(ask(hello(SMALL_NIC, FAKE_QPN, me, qp.qpn(), VERSION)), 4, "second hello");
    assert!(v.nic.executor_alive());
    assert_eq!(qp.state(), QpState::Rts);
}

/// Two hellos for one QP at once: however their threads interleave, one is answered and the other refused as
/// busy (the first to find the link takes it before answering; a link merely not up yet is not enough).
#[test]
fn two_hellos_at_once_bring_the_link_up_once() {
    for round in 0..20 {
        let v = Victim::new(Duration::from_millis(300));
        let qp = v.nic.create_qp(&v.pd, &v.cq, 64).unwrap();
        let ep = Endpoint { nic: SMALL_NIC, qpn: FAKE_QPN, psn: 0, wire: Some("127.0.0.1:9".parse().unwrap()) };
        qp.connect(&ep).unwrap();
        let me = v.nic.id();
        let mut conns: Vec<TcpStream> =
            (0..2).map(|_| TcpStream::connect(v.nic.wire_addr().unwrap()).unwrap()).collect();
        for c in &mut conns {
            c.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
            c.write_all(&hello(SMALL_NIC, FAKE_QPN, me, qp.qpn(), VERSION)).unwrap();
        }
        let mut answers: Vec<(u8, u32)> =
            conns.iter_mut().map(|c| read_frame(c).expect("an answer")).map(|(h, _)| (h.kind, h.w3)).collect();
        answers.sort();
        assert_eq!(answers, [(kind::HELLO_ACK, 0), (kind::REJECT, 4)], "round {round}");
        assert_eq!(qp.state(), QpState::Rts);
    }
}

// ---- 2. a hostile requester: requests to the NIC under test's MRs ----

/// The NIC under test as responder, with an MR of 256 bytes (guarded), an MR of another PD, and a fresh QP
/// connected to a fake peer that dialed it. `f` sends frames on the stream.
fn with_responder(name: &str, f: impl FnOnce(&mut TcpStream, &Target)) {
    let v = Victim::new(Duration::from_secs(3));
    let qp = v.nic.create_qp(&v.pd, &v.cq, 64).unwrap();
    let buf = GuardedBuf::new(256, 0xc3);
    let other = GuardedBuf::new(256, 0x3c);
    let mr = buf.register(&v.nic, &v.pd, Access::ALL);
    let omr = other.register(&v.nic, &v.other_pd, Access::ALL);
    let mut s = fake_dials(&v, &qp);
    let t = Target { addr: buf.addr(), rkey: mr.rkey(), other_addr: other.addr(), other_rkey: omr.rkey() };
    f(&mut s, &t);
    assert!(v.nic.executor_alive(), "{name}: executor died");
    assert!(buf.guards_intact() && other.guards_intact(), "{name}: guard bytes written");
    assert!(other.read().iter().all(|&b| b == 0x3c), "{name}: another PD's MR was written");
    // The NIC's other QPs still work.
    let peer_nic = EmuNic::open(wired(Duration::from_secs(3))).unwrap();
    assert_legit_pair_works(&peer_nic, &v.nic);
    drop((mr, omr));
}

struct Target {
    addr: u64,
    rkey: u32,
    other_addr: u64,
    other_rkey: u32,
}

impl Target {
    /// Byte `off` of the 256-byte MR.
    fn byte(&self, off: u64) -> u8 {
        assert!(off < 256);
        // SAFETY: inside the registered middle of a live GuardedBuf (it outlives the closure given this).
        unsafe { ((self.addr + off) as *const u8).read_volatile() }
    }
}

fn expect_nak(s: &mut TcpStream, psn: u32, syn: u8, what: &str) {
    let (h, _) = read_frame(s).unwrap_or_else(|| panic!("{what}: no answer"));
    assert_eq!((h.kind, h.w1, h.w3 as u8), (kind::NAK, psn, syn), "{what}: {h:?}");
}

#[test]
fn hostile_requester_gets_naks_and_writes_nothing_outside_its_mr() {
    // A valid WRITE lands and is acknowledged; PSNs wrap at 24 bits.
    with_responder("valid", |s, t| {
        s.write_all(&write_pkt(FAKE_PSN, t.rkey, t.addr + 8, 8, 0, &[0xab; 8])).unwrap();
        s.write_all(&write_pkt((FAKE_PSN + 1) & 0xff_ffff, t.rkey, t.addr + 16, 4, 0, &[0xcd; 4])).unwrap();
        s.write_all(&write_pkt(0, t.rkey, t.addr + 24, 2, 0, &[0xef; 2])).unwrap();
        loop {
            let (h, _) = read_frame(s).expect("an ACK");
            assert_eq!(h.kind, kind::ACK, "{h:?}");
            if h.w1 == 0 {
                break;
            }
        }
        let got: Vec<u8> = (0..32).map(|i| t.byte(i)).collect();
        let mut want = vec![0xc3; 32];
        want[8..16].fill(0xab);
        want[16..20].fill(0xcd);
        want[24..26].fill(0xef);
        assert_eq!(got, want);
    });
    // Into an MR of another PD: NAK 0x13.
    with_responder("other PD", |s, t| {
        s.write_all(&write_pkt(FAKE_PSN, t.other_rkey, t.other_addr, 8, 0, &[1; 8])).unwrap();
        expect_nak(s, FAKE_PSN, syndrome::REMOTE_ACCESS_ERR, "other PD");
    });
    // Past the end of the MR, and straddling its start: NAK 0x13.
    with_responder("past the end", |s, t| {
        s.write_all(&write_pkt(FAKE_PSN, t.rkey, t.addr + 250, 8, 0, &[1; 8])).unwrap();
        expect_nak(s, FAKE_PSN, syndrome::REMOTE_ACCESS_ERR, "past the end");
    });
    with_responder("before the start", |s, t| {
        s.write_all(&write_pkt(FAKE_PSN, t.rkey, t.addr - 8, 16, 0, &[1; 16])).unwrap();
        expect_nak(s, FAKE_PSN, syndrome::REMOTE_ACCESS_ERR, "before the start");
    });
    // A multi-packet WRITE whose second packet names another (out-of-bounds) address: NAK, first packet only.
    with_responder("packets disagree", |s, t| {
        s.write_all(&write_pkt(FAKE_PSN, t.rkey, t.addr, 16, 0, &[1; 8])).unwrap();
        s.write_all(&write_pkt(FAKE_PSN, t.rkey, t.addr + 248, 16, 8, &[2; 8])).unwrap();
        expect_nak(s, FAKE_PSN, syndrome::REMOTE_ACCESS_ERR, "packets disagree");
    });
    // A huge `total` (2^31) whose packet lies inside the MR: the message as a whole is out of bounds.
    with_responder("huge total", |s, t| {
        s.write_all(&write_pkt(FAKE_PSN, t.rkey, t.addr, 1 << 31, 0, &[1; 8])).unwrap();
        expect_nak(s, FAKE_PSN, syndrome::REMOTE_ACCESS_ERR, "huge total");
    });
    // Misaligned atomic: NAK 0x12; READ longer than the MR: 0x13.
    with_responder("misaligned atomic", |s, t| {
        let fa = H { kind: kind::FETCH_ADD, w1: FAKE_PSN, w2: t.rkey, q2: t.addr + 4, q3: 1, ..H::default() };
        s.write_all(&frame(fa, &[])).unwrap();
        expect_nak(s, FAKE_PSN, syndrome::REMOTE_INVAL_REQ_ERR, "misaligned atomic");
    });
    with_responder("long READ", |s, t| {
        let rd = H { kind: kind::READ, w1: FAKE_PSN, w2: t.rkey, q2: t.addr, q3: 4096, ..H::default() };
        s.write_all(&frame(rd, &[])).unwrap();
        expect_nak(s, FAKE_PSN, syndrome::REMOTE_ACCESS_ERR, "long READ");
    });
    // After a NAK the responder ignores the connection's requests: nothing lands.
    with_responder("after a NAK", |s, t| {
        s.write_all(&write_pkt(FAKE_PSN, t.other_rkey, t.other_addr, 8, 0, &[1; 8])).unwrap();
        expect_nak(s, FAKE_PSN, syndrome::REMOTE_ACCESS_ERR, "first");
        s.write_all(&write_pkt((FAKE_PSN + 1) & 0xff_ffff, t.rkey, t.addr, 8, 0, &[1; 8])).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
        assert!(read_frame(s).is_none(), "answered a request after its NAK");
    });
}

#[test]
fn an_offer_of_gpu_memory_to_a_nic_that_cannot_map_it_is_declined_and_the_link_stays_up() {
    // The NIC under test has no GPU copier: it cannot map another process's GPU memory, says so at once, and
    // the peer's WRITEs then come as bytes, as before.
    with_responder("offer", |s, t| {
        s.write_all(&frame(H { kind: kind::IPC_OFFER, ..H::default() }, &[0x42; HANDLE])).unwrap();
        let (h, data) = read_frame(s).expect("an answer to the offer");
        assert_eq!((h.kind, h.w3, data), (kind::IPC_ANSWER, 0, vec![0x42; HANDLE]), "{h:?}");
        s.write_all(&write_pkt(FAKE_PSN, t.rkey, t.addr, 8, 0, &[0xab; 8])).unwrap();
        let (h, _) = read_frame(s).expect("an ACK");
        assert_eq!((h.kind, h.w1), (kind::ACK, FAKE_PSN), "{h:?}");
        assert_eq!((0..8).map(|i| t.byte(i)).collect::<Vec<_>>(), vec![0xab; 8]);
    });
}

#[test]
fn pieces_of_gpu_memory_whose_mr_is_gone_close_the_connection() {
    // A fake peer that NIC a offered its GPU memory to offers the same handle to NIC b (of this process,
    // where the simulated GPU's handles map) and sends it WRITE pieces of it: copied while NIC a's MR lives;
    // once the MR is deregistered and the memory freed, a piece of it is a protocol violation, never a read
    // of freed memory.
    const N: usize = 4 << 20;
    let ipc = |retry| {
        let wire = WireConfig { retry_timeout: retry, gpu_ipc: true, ..WireConfig::loopback() };
        let mut c = EmuConfig::host_or_env().unwrap().with_wire(wire);
        c.gpu.get_or_insert_with(|| Arc::new(SimGpu::new().unwrap()));
        c
    };
    let a = Victim::open(ipc(Duration::from_secs(3)));
    let qa = a.nic.create_qp(&a.pd, &a.cq, 64).unwrap();
    let mut sa = nic_dials(&qa);
    let src = GuardedBuf::new(N, 0x11);
    let smr = src.register_as(MemKind::Gpu, &a.nic, &a.pd, Access::NONE);
    let mut sq = Sq::new(&qa);
    sq.post(&sq.write(SIGNALED, (smr.lkey(), src.addr(), 8), 0x1000, 0x1234));
    let handle = loop {
        let (h, data) = read_frame(&mut sa).expect("the WRITE's frames");
        if h.kind == kind::IPC_OFFER {
            break data;
        }
    };
    let b = Victim::open(ipc(Duration::from_secs(3)));
    let qb = b.nic.create_qp(&b.pd, &b.cq, 64).unwrap();
    let dst = GuardedBuf::new(N, 0);
    let dmr = dst.register_as(MemKind::Gpu, &b.nic, &b.pd, Access::ALL);
    let mut sb = fake_dials(&b, &qb);
    sb.write_all(&frame(H { kind: kind::IPC_OFFER, ..H::default() }, &handle)).unwrap();
    let (h, _) = read_frame(&mut sb).expect("an answer to the offer");
    assert_eq!((h.kind, h.w3), (kind::IPC_ANSWER, 1), "NIC b mapped the allocation: {h:?}");
    let piece = |psn: u32| {
        let mut data = handle.clone();
        data.extend_from_slice(&0u64.to_le_bytes());
        data.extend_from_slice(&(N as u64).to_le_bytes());
        let h = H {
            kind: kind::WRITE_IPC,
            flags: FLAG_LAST,
            w1: psn,
            w2: dmr.rkey(),
            q2: dst.addr(),
            q3: N as u64,
            ..H::default()
        };
        frame(h, &data)
    };
    sb.write_all(&piece(FAKE_PSN)).unwrap();
    let (h, _) = read_frame(&mut sb).expect("an ACK");
    assert_eq!((h.kind, h.w1), (kind::ACK, FAKE_PSN), "{h:?}");
    assert!(dst.read().iter().all(|&b| b == 0x11), "the piece copied while the MR lives");
    drop(smr);
    drop(src);
    sb.write_all(&piece(FAKE_PSN + 1)).unwrap();
    assert_closed(&mut sb, "a piece of memory whose MR is gone");
    assert!(b.nic.executor_alive() && a.nic.executor_alive());
    assert!(dst.guards_intact());
    drop((dmr, qa, qb));
}

/// Builds a frame against the target MR.
type MakeFrame = dyn Fn(&Target) -> Vec<u8>;

#[test]
fn protocol_violations_close_the_connection() {
    let cases: Vec<(&str, Box<MakeFrame>)> = vec![
        ("PSN ahead", Box::new(|t| write_pkt(FAKE_PSN.wrapping_add(5) & 0xff_ffff, t.rkey, t.addr, 8, 0, &[1; 8]))),
        ("PSN behind", Box::new(|t| write_pkt(FAKE_PSN - 1, t.rkey, t.addr, 8, 0, &[1; 8]))),
        ("offset past total", Box::new(|t| write_pkt(FAKE_PSN, t.rkey, t.addr, 8, 8, &[1; 8]))),
        ("length u32::MAX", Box::new(|_| u32::MAX.to_le_bytes().to_vec())),
        ("length 0", Box::new(|_| 0u32.to_le_bytes().to_vec())),
        ("frame over the limit", Box::new(|_| (HEADER as u32 + 256 * 1024 + 1).to_le_bytes().to_vec())),
        ("unknown kind", Box::new(|_| frame(H { kind: 77, ..H::default() }, &[]))),
        (
            "reserved bits",
            Box::new(|t| {
                let mut f = write_pkt(FAKE_PSN, t.rkey, t.addr, 8, 0, &[1; 8]);
                f[6] = 1;
                f
            }),
        ),
        ("ACK of nothing", Box::new(|_| frame(H { kind: kind::ACK, w1: 5, ..H::default() }, &[]))),
        ("NAK of nothing", Box::new(|_| frame(H { kind: kind::NAK, w1: 5, w3: 0x13, ..H::default() }, &[]))),
        (
            "READ response to nothing",
            Box::new(|_| frame(H { kind: kind::READ_RESP, flags: FLAG_LAST, w1: 5, ..H::default() }, &[9; 64])),
        ),
        ("atomic response to nothing", Box::new(|_| frame(H { kind: kind::ATOMIC_RESP, w1: 5, ..H::default() }, &[]))),
        ("hello again", Box::new(|_| hello(SMALL_NIC, FAKE_QPN, 0, 0, VERSION))),
        (
            "WRITE piece of memory never mapped",
            Box::new(|t| {
                let mut piece = [7u8; HANDLE + 16];
                piece[HANDLE..HANDLE + 8].copy_from_slice(&0u64.to_le_bytes());
                piece[HANDLE + 8..].copy_from_slice(&8u64.to_le_bytes());
                let h = H {
                    kind: kind::WRITE_IPC,
                    flags: FLAG_LAST,
                    w1: FAKE_PSN,
                    w2: t.rkey,
                    q2: t.addr,
                    q3: 8,
                    ..H::default()
                };
                frame(h, &piece)
            }),
        ),
        (
            "IPC answer to no offer",
            Box::new(|_| frame(H { kind: kind::IPC_ANSWER, w3: 1, ..H::default() }, &[7; HANDLE])),
        ),
        (
            "an allocation offered twice",
            Box::new(|_| frame(H { kind: kind::IPC_OFFER, ..H::default() }, &[7; HANDLE]).repeat(2)),
        ),
        (
            "65 allocations offered",
            Box::new(|_| {
                (0..65u8).flat_map(|i| frame(H { kind: kind::IPC_OFFER, ..H::default() }, &[i; HANDLE])).collect()
            }),
        ),
    ];
    for (name, make) in cases {
        with_responder(name, |s, t| {
            s.write_all(&make(t)).unwrap();
            assert_closed(s, name);
        });
    }
}

// ---- 3. a hostile responder: answers to the NIC under test's requests ----

/// The NIC under test as requester: a QP connected to a fake peer it dialed, and the fake's stream (past the
/// hello).
struct Requester {
    v: Victim,
    qp: Qp,
    s: TcpStream,
}

impl Requester {
    fn new(retry: Duration) -> Self {
        Self::with_sq(retry, 64)
    }

    /// With an SQ of `wqe_cnt` WQEBBs.
    fn with_sq(retry: Duration, wqe_cnt: u32) -> Self {
        let mut v = Victim::new(retry);
        if wqe_cnt > 256 {
            v.cq = v.nic.create_cq(wqe_cnt).unwrap();
        }
        let qp = v.nic.create_qp(&v.pd, &v.cq, wqe_cnt).unwrap();
        let s = nic_dials(&qp);
        Self { v, qp, s }
    }

    /// "peer QP 0xabcdef at ADDR", as the NIC names the fake in its messages.
    fn peer(&self) -> String {
        format!("peer QP {FAKE_QPN:#x} at {}", self.s.local_addr().unwrap())
    }
}

#[test]
fn hostile_responder_answers_fail_the_wqe_with_retry_exceeded_and_write_nothing_extra() {
    // A READ of 64 bytes into the middle of a 256-byte local MR; the fake answers with 128 bytes.
    for (name, resp) in [
        ("longer than asked", vec![(0u64, 128usize, true)]),
        ("past the end in a second packet", vec![(0, 32, false), (32, 96, true)]),
        ("out of order", vec![(32, 32, true)]),
        ("not marked last", vec![(0, 64, false), (64, 8, true)]),
    ] {
        let mut r = Requester::new(Duration::from_secs(3));
        let local = GuardedBuf::new(256, 0x11);
        let lmr = local.register(&r.v.nic, &r.v.pd, Access::LOCAL_WRITE);
        let (mut sq, mut cq) = (Sq::new(&r.qp), CqPoll::new(&r.v.cq));
        let at = sq.post(&sq.read(SIGNALED, (lmr.lkey(), local.addr() + 64, 64), 0x1000, 0x4242));
        let psn = r.qp.endpoint().psn;
        let (h, _) = read_frame(&mut r.s).expect("the READ");
        assert_eq!((h.kind, h.w1, h.w2, h.q2, h.q3), (kind::READ, psn, 0x4242, 0x1000, 64));
        for (offset, len, last) in resp {
            let f = frame(
                H {
                    kind: kind::READ_RESP,
                    flags: if last { FLAG_LAST } else { 0 },
                    w1: psn,
                    q4: offset,
                    ..H::default()
                },
                &vec![0xee; len],
            );
            let _ = r.s.write_all(&f);
        }
        assert_err(&cq.wait(), syndrome::TRANSPORT_RETRY_EXC_ERR, opcode::RDMA_READ, sq.qpn(), at);
        let got = local.read();
        assert!(got[..64].iter().all(|&b| b == 0x11), "{name}: bytes before the READ's SGE written");
        assert!(got[128..].iter().all(|&b| b == 0x11), "{name}: bytes after the READ's SGE written");
        assert!(local.guards_intact(), "{name}");
        assert_eq!(r.qp.state(), QpState::Error, "{name}");
        assert!(r.v.nic.executor_alive(), "{name}");
        assert_closed(&mut r.s, name);
    }
}

/// Builds the fake responder's answer to the request with this PSN.
type Answer = fn(u32) -> Vec<u8>;

#[test]
fn hostile_responder_acks_and_naks_for_other_psns_break_the_link() {
    let cases: [(&str, Answer); 5] = [
        ("ACK of an earlier PSN", |psn| {
            frame(H { kind: kind::ACK, w1: (psn + 0xff_ffff) & 0xff_ffff, ..H::default() }, &[])
        }),
        ("NAK of another PSN", |psn| {
            frame(H { kind: kind::NAK, w1: (psn + 3) & 0xff_ffff, w3: 0x13, ..H::default() }, &[])
        }),
        ("atomic response to a WRITE", |psn| frame(H { kind: kind::ATOMIC_RESP, w1: psn, q3: 7, ..H::default() }, &[])),
        ("READ response to a WRITE", |psn| {
            frame(H { kind: kind::READ_RESP, flags: FLAG_LAST, w1: psn, ..H::default() }, &[1; 8])
        }),
        ("a request where a response is due", |psn| write_pkt(psn, 0, 0, 0, 0, &[])),
    ];
    for (name, answer) in cases {
        let mut r = Requester::new(Duration::from_secs(3));
        let psn = r.qp.endpoint().psn;
        let src = GuardedBuf::new(64, 0x11);
        let lmr = src.register(&r.v.nic, &r.v.pd, Access::NONE);
        let (mut sq, mut cq) = (Sq::new(&r.qp), CqPoll::new(&r.v.cq));
        let at = sq.post(&sq.write(SIGNALED, (lmr.lkey(), src.addr(), 64), 0x1000, 0x4242));
        let later = sq.post(&sq.nop(SIGNALED));
        let (h, data) = read_frame(&mut r.s).expect("the WRITE");
        assert_eq!((h.kind, h.w1, data.len()), (kind::WRITE, psn, 64));
        let answer = answer(psn);
        r.s.write_all(&answer).unwrap();
        assert_err(&cq.wait(), syndrome::TRANSPORT_RETRY_EXC_ERR, opcode::RDMA_WRITE, sq.qpn(), at);
        assert_err(&cq.wait(), syndrome::WR_FLUSH_ERR, opcode::NOP, sq.qpn(), later);
        assert!(r.v.nic.executor_alive(), "{name}");
        assert_closed(&mut r.s, name);
    }
}

/// A NAK carries the syndrome the requester reports. A responder can send any byte there, including 0
/// (which reads as "no error" to code that checks the syndrome) or 0x05 (flush, which device code treats as
/// "an earlier WQE failed"). Records what the NIC under test makes of it.
#[test]
fn nak_with_a_syndrome_no_responder_produces() {
    let mut seen = Vec::new();
    for syn in [0x00u8, 0x05, 0x15, 0xff] {
        let mut r = Requester::new(Duration::from_secs(3));
        let src = GuardedBuf::new(64, 0x11);
        let lmr = src.register(&r.v.nic, &r.v.pd, Access::NONE);
        let (mut sq, mut cq) = (Sq::new(&r.qp), CqPoll::new(&r.v.cq));
        let at = sq.post(&sq.write(SIGNALED, (lmr.lkey(), src.addr(), 64), 0x1000, 0x4242));
        let _ = read_frame(&mut r.s).expect("the WRITE");
        let psn = r.qp.endpoint().psn;
        r.s.write_all(&frame(H { kind: kind::NAK, w1: psn, w3: syn as u32, ..H::default() }, &[])).unwrap();
        let c = cq.wait();
        assert_eq!(c.opcode(), opcode::cqe::REQ_ERR);
        assert_eq!(c.as_err().wqe_counter.get(), at as u16);
        seen.push((syn, c.as_err().syndrome));
    }
    eprintln!("NAK syndrome -> CQE syndrome: {seen:x?}");
    // Only what a responder can produce (0x12 remote invalid request, 0x13 remote access, 0x14 remote
    // operation) should reach the CQE; anything else is a protocol violation (0x15 or 0x10 bad response).
    let passed_through: Vec<_> = seen.iter().filter(|(s, c)| s == c && !matches!(c, 0x12..=0x15)).collect();
    assert!(passed_through.is_empty(), "responder-chosen syndromes reach the CQE verbatim: {passed_through:x?}");
}

// ---- 4. a silent peer (SIGSTOP, or a hostile one that stops reading) ----

/// Runs `f` on a thread; returns whether it finished within `d`. A hung `f` is leaked.
fn finishes_within(d: Duration, f: impl FnOnce() + Send + 'static) -> bool {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        f();
        let _ = tx.send(());
    });
    rx.recv_timeout(d).is_ok()
}

/// The peer accepts the connection, acks the hello, then never reads again (as a SIGSTOPped process). A
/// WRITE larger than the socket buffers must still fail with 0x15 after the retry timeout, and the QP, its
/// MRs and the NIC must still be droppable.
#[test]
fn silent_peer_with_a_large_write_fails_after_the_retry_timeout() {
    let retry = Duration::from_millis(500);
    let r = Requester::new(retry);
    let n = 32 << 20;
    let src = Box::leak(Box::new(GuardedBuf::new(n, 0x11)));
    let lmr = src.register(&r.v.nic, &r.v.pd, Access::NONE);
    let (mut sq, mut cq) = (Sq::new(&r.qp), CqPoll::new(&r.v.cq));
    let at = sq.post(&sq.write(SIGNALED, (lmr.lkey(), src.addr(), n as u32), 0x1000, 0x4242));
    let t = Instant::now();
    let mut got = None;
    while t.elapsed() < retry * 4 + Duration::from_secs(2) {
        if let Some(c) = cq.poll() {
            got = Some(c);
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let Some(c) = got else {
        // Leak everything (dropping would hang), and report.
        let stuck = !finishes_within(Duration::from_secs(3), move || drop(lmr));
        std::mem::forget(r);
        panic!(
            "no CQE {:?} after posting a {n}-byte WRITE to a peer that stopped reading (retry timeout {retry:?}); \
             dropping its MR {}",
            t.elapsed(),
            if stuck { "hangs too" } else { "returns" }
        );
    };
    assert_err(&c, syndrome::TRANSPORT_RETRY_EXC_ERR, opcode::RDMA_WRITE, sq.qpn(), at);
    let Requester { v, qp, s } = r;
    assert!(finishes_within(Duration::from_secs(3), move || drop((lmr, qp, v, s))), "drop hangs");
}

// ---- 5. drops while a large WRITE is in flight ----

struct Big {
    nic_a: Arc<EmuNic>,
    nic_b: Arc<EmuNic>,
    pd_a: Pd,
    pd_b: Pd,
    cq_a: Cq,
    cq_b: Cq,
    a: Qp,
    b: Qp,
}

fn big_pair() -> Big {
    let (nic_a, nic_b) =
        (EmuNic::open(wired(Duration::from_secs(3))).unwrap(), EmuNic::open(wired(Duration::from_secs(3))).unwrap());
    let (pd_a, pd_b) = (nic_a.alloc_pd().unwrap(), nic_b.alloc_pd().unwrap());
    let (cq_a, cq_b) = (nic_a.create_cq(64).unwrap(), nic_b.create_cq(64).unwrap());
    let a = nic_a.create_qp(&pd_a, &cq_a, 64).unwrap();
    let b = nic_b.create_qp(&pd_b, &cq_b, 64).unwrap();
    a.connect(&b.endpoint()).unwrap();
    b.connect(&a.endpoint()).unwrap();
    Big { nic_a, nic_b, pd_a, pd_b, cq_a, cq_b, a, b }
}

const BIG: usize = 16 << 20;

/// Posts a 16 MiB WRITE a → b and waits until its first bytes landed in `dst`.
fn start_big_write(p: &Big, src: &GuardedBuf, dst: &GuardedBuf, lkey: u32, rkey: u32) -> (Sq, u64) {
    let mut sq = Sq::new(&p.a);
    let at = sq.post(&sq.write(SIGNALED, (lkey, src.addr(), BIG as u32), dst.addr(), rkey));
    wait_until("the first bytes of the WRITE", || dst.load_u64(0) != 0);
    (sq, at)
}

#[test]
fn mr_dropped_while_a_remote_write_targets_it_is_never_written_after() {
    let p = big_pair();
    let src = GuardedBuf::new(BIG, 0x77);
    let dst = GuardedBuf::new(BIG, 0);
    let lmr = src.register(&p.nic_a, &p.pd_a, Access::NONE);
    let rmr = dst.register(&p.nic_b, &p.pd_b, Access::ALL);
    let (sq, at) = start_big_write(&p, &src, &dst, lmr.lkey(), rmr.rkey());
    let t = Instant::now();
    drop(rmr);
    assert!(t.elapsed() < Duration::from_secs(2), "deregistration took {:?}", t.elapsed());
    // Mark the whole buffer: nothing may change it from now on.
    dst.fill(0x99);
    let c = CqPoll::new(&p.cq_a).wait();
    if c.opcode() == opcode::cqe::REQ {
        eprintln!("the WRITE finished before the MR went");
    } else {
        assert_err(&c, syndrome::REMOTE_ACCESS_ERR, opcode::RDMA_WRITE, sq.qpn(), at);
    }
    std::thread::sleep(Duration::from_millis(50));
    assert!(dst.read().iter().all(|&b| b == 0x99), "bytes placed after the MR was deregistered");
    assert!(dst.guards_intact());
    assert!(p.nic_a.executor_alive() && p.nic_b.executor_alive());
    drop(lmr);
}

#[test]
fn responder_qp_dropped_mid_write_fails_the_requester_with_retry_exceeded() {
    let p = big_pair();
    let src = GuardedBuf::new(BIG, 0x77);
    let dst = GuardedBuf::new(BIG, 0);
    let lmr = src.register(&p.nic_a, &p.pd_a, Access::NONE);
    let rmr = dst.register(&p.nic_b, &p.pd_b, Access::ALL);
    let (sq, at) = start_big_write(&p, &src, &dst, lmr.lkey(), rmr.rkey());
    let Big { nic_a, nic_b, pd_a, pd_b, cq_a, cq_b, a, b } = p;
    let t = Instant::now();
    drop(b);
    assert!(t.elapsed() < Duration::from_secs(2), "QP drop took {:?}", t.elapsed());
    let c = CqPoll::new(&cq_a).wait();
    if c.opcode() == opcode::cqe::REQ {
        eprintln!("the WRITE finished before the QP went");
    } else {
        assert_err(&c, syndrome::TRANSPORT_RETRY_EXC_ERR, opcode::RDMA_WRITE, sq.qpn(), at);
    }
    assert_eq!(a.state(), if c.opcode() == opcode::cqe::REQ { QpState::Rts } else { QpState::Error });
    let t = Instant::now();
    drop((rmr, cq_b, pd_b, nic_b));
    drop((a, lmr, cq_a, pd_a, nic_a));
    assert!(t.elapsed() < Duration::from_secs(2), "teardown took {:?}", t.elapsed());
}

#[test]
fn requester_side_torn_down_mid_write_ends_cleanly() {
    let p = big_pair();
    let src = GuardedBuf::new(BIG, 0x77);
    let dst = GuardedBuf::new(BIG, 0);
    let lmr = src.register(&p.nic_a, &p.pd_a, Access::NONE);
    let rmr = dst.register(&p.nic_b, &p.pd_b, Access::ALL);
    let _ = start_big_write(&p, &src, &dst, lmr.lkey(), rmr.rkey());
    let Big { nic_a, nic_b, pd_a, pd_b, cq_a, cq_b, a, b } = p;
    let t = Instant::now();
    // Everything of side a, the NIC last, while its executor streams the WRITE.
    drop(a);
    drop(lmr);
    drop((cq_a, pd_a));
    assert_eq!(Arc::strong_count(&nic_a), 1);
    drop(nic_a);
    assert!(t.elapsed() < Duration::from_secs(2), "teardown of the requester side took {:?}", t.elapsed());
    // b is idle (a responder only): it stays in RTS; a request from it now fails with 0x15 at once.
    let probe = GuardedBuf::new(8, 0);
    let pmr = probe.register(&nic_b, &pd_b, Access::LOCAL_WRITE);
    let (mut sq, mut cq) = (Sq::new(&b), CqPoll::new(&cq_b));
    let at = sq.post(&sq.read(SIGNALED, (pmr.lkey(), probe.addr(), 8), 0x1000, 1));
    assert_err(&cq.wait(), syndrome::TRANSPORT_RETRY_EXC_ERR, opcode::RDMA_READ, sq.qpn(), at);
    assert!(nic_b.executor_alive());
    assert!(dst.guards_intact());
    drop((pmr, rmr));
}

#[test]
fn atomic_after_a_hostile_write_storm_still_sees_every_write_placed() {
    // Many small valid WRITEs, then a fetch-add: all ACKed in order, the atomic's result after them.
    with_responder("storm", |s, t| {
        let mut psn = FAKE_PSN;
        let mut bytes = Vec::new();
        for i in 0..1000u32 {
            bytes.extend(write_pkt(psn, t.rkey, t.addr + 8 + (i as u64 % 30) * 8, 8, 0, &(i as u64).to_le_bytes()));
            psn = (psn + 1) & 0xff_ffff;
        }
        let fa = H { kind: kind::FETCH_ADD, w1: psn, w2: t.rkey, q2: t.addr, q3: 5, ..H::default() };
        bytes.extend(frame(fa, &[]));
        s.write_all(&bytes).unwrap();
        loop {
            let (h, _) = read_frame(s).expect("responses");
            match h.kind {
                kind::ACK => continue,
                kind::ATOMIC_RESP => {
                    assert_eq!((h.w1, h.q3), (psn, 0xc3c3_c3c3_c3c3_c3c3));
                    break;
                }
                k => panic!("kind {k}"),
            }
        }
    });
}

// ---- 6. odd retry timeouts ----

/// `WireConfig::retry_timeout` is user input: `Duration::MAX` (a "never time out" a user might try) is refused
/// by `EmuNic::open` with `InvalidArgument` naming the value and the limit (`WireConfig::MAX_RETRY_TIMEOUT`, a
/// day), and so is a day and a nanosecond; before the limit it panicked a wire thread and left the QP
/// connecting forever.
#[test]
fn retry_timeout_over_a_day_is_refused_at_open_naming_value_and_limit() {
    for (timeout, message) in [
        (Duration::MAX, "invalid argument: wire retry timeout 18446744073709551615.999999999s is over 86400s"),
        (
            Duration::from_secs(86_400) + Duration::from_nanos(1),
            "invalid argument: wire retry timeout 86400.000000001s is over 86400s",
        ),
    ] {
        let cfg = EmuConfig::host_or_env()
            .unwrap()
            .with_wire(WireConfig { retry_timeout: timeout, ..WireConfig::loopback() });
        match EmuNic::open(cfg) {
            Err(e @ gdaki::Error::InvalidArgument(_)) => assert_eq!(e.to_string(), message),
            Err(e) => panic!("{timeout:?}: expected InvalidArgument, got {e:?}"),
            Ok(_) => panic!("{timeout:?}: a retry timeout over a day was accepted"),
        }
    }
}

/// The longest retry timeout accepted, exactly a day, works: the NIC opens, connects and dials its peer (no
/// overflow in the deadline arithmetic of the dialer thread).
#[test]
fn retry_timeout_of_exactly_a_day_is_accepted_and_the_nic_dials() {
    let cfg = EmuConfig::host_or_env()
        .unwrap()
        .with_wire(WireConfig { retry_timeout: Duration::from_secs(86_400), ..WireConfig::loopback() });
    let nic = EmuNic::open(cfg).expect("a retry timeout of exactly a day is within the limit");
    let (pd, cq) = (nic.alloc_pd().unwrap(), nic.create_cq(64).unwrap());
    let qp = nic.create_qp(&pd, &cq, 64).unwrap();
    // A peer with a larger NIC id: this NIC dials it.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let ep = Endpoint { nic: LARGE_NIC, qpn: FAKE_QPN, psn: FAKE_PSN, wire: Some(l.local_addr().unwrap()) };
    qp.connect(&ep).unwrap();
    l.set_nonblocking(true).unwrap();
    let t = Instant::now();
    loop {
        match l.accept() {
            Ok(_) => break,
            Err(_) if t.elapsed() < Duration::from_secs(3) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => panic!("the NIC never dialed its peer ({e}): its dialer thread died"),
        }
    }
}

/// A retry timeout under a millisecond (zero, a nanosecond) is refused by `EmuNic::open` naming the value and
/// the limit: it accepted them, and then every request to a live peer failed at once with 0x15, the dead
/// peer's error. A millisecond opens.
#[test]
fn retry_timeout_under_a_millisecond_is_refused_at_open() {
    for (timeout, shown) in
        [(Duration::ZERO, "0ns"), (Duration::from_nanos(1), "1ns"), (Duration::from_micros(999), "999µs")]
    {
        match EmuNic::open(wired(timeout)) {
            Err(e @ gdaki::Error::InvalidArgument(_)) => assert_eq!(
                e.to_string(),
                format!(
                    "invalid argument: wire retry timeout {shown} is under 1ms: every request would fail (0x15) \
                     before a live peer could answer"
                )
            ),
            Err(e) => panic!("{timeout:?}: expected InvalidArgument, got {e:?}"),
            Ok(_) => panic!("{timeout:?}: a retry timeout under a millisecond was accepted"),
        }
    }
    EmuNic::open(wired(Duration::from_millis(1))).expect("a millisecond is accepted");
}

// ---- 7. a peer that connects late ----

/// On hardware a QP in RTS whose peer reaches RTR later is fine as long as it posts nothing before: only
/// outstanding requests time out. Here the early side is the one that dials (the smaller NIC id): its hellos
/// are refused (NOT_CONNECTED) while the peer QP is not connected back, and it keeps dialing, so the first
/// WRITE after both sides connected completes. The retry timeout (1 s) leaves the link room to come up after
/// the late connect (a refused dialer pauses at most 100 ms) even on a loaded machine; at 300 ms one run in a
/// hundred failed with 0x15 while four test binaries ran at once on two CPUs.
#[test]
fn peer_connecting_after_the_retry_timeout_still_works_when_nothing_was_posted() {
    let retry = Duration::from_secs(1);
    let (x, y) = (EmuNic::open(wired(retry)).unwrap(), EmuNic::open(wired(retry)).unwrap());
    // The early side is the one that dials: the smaller NIC id.
    let (early, late) = if x.id() < y.id() { (x, y) } else { (y, x) };
    let (pd_e, pd_l) = (early.alloc_pd().unwrap(), late.alloc_pd().unwrap());
    let (cq_e, cq_l) = (early.create_cq(64).unwrap(), late.create_cq(64).unwrap());
    let e = early.create_qp(&pd_e, &cq_e, 64).unwrap();
    let l = late.create_qp(&pd_l, &cq_l, 64).unwrap();
    e.connect(&l.endpoint()).unwrap();
    std::thread::sleep(retry * 2);
    l.connect(&e.endpoint()).unwrap();
    let (src, dst) = (GuardedBuf::new(64, 1), GuardedBuf::new(64, 0));
    let (lmr, rmr) = (src.register(&early, &pd_e, Access::NONE), dst.register(&late, &pd_l, Access::ALL));
    let (mut sq, mut cq) = (Sq::new(&e), CqPoll::new(&cq_e));
    let at = sq.post(&sq.write(SIGNALED, (lmr.lkey(), src.addr(), 64), dst.addr(), rmr.rkey()));
    assert_req(&cq.wait(), opcode::RDMA_WRITE, sq.qpn(), at, 0);
}

/// The other half: when the late side is the one that dials, a late connect works (the retry timeout as
/// above).
#[test]
fn late_peer_that_dials_connects_fine() {
    let retry = Duration::from_secs(1);
    let (x, y) = (EmuNic::open(wired(retry)).unwrap(), EmuNic::open(wired(retry)).unwrap());
    let (early, late) = if x.id() > y.id() { (x, y) } else { (y, x) };
    let (pd_e, pd_l) = (early.alloc_pd().unwrap(), late.alloc_pd().unwrap());
    let (cq_e, cq_l) = (early.create_cq(64).unwrap(), late.create_cq(64).unwrap());
    let e = early.create_qp(&pd_e, &cq_e, 64).unwrap();
    let l = late.create_qp(&pd_l, &cq_l, 64).unwrap();
    e.connect(&l.endpoint()).unwrap();
    std::thread::sleep(retry * 2);
    l.connect(&e.endpoint()).unwrap();
    let (src, dst) = (GuardedBuf::new(64, 1), GuardedBuf::new(64, 0));
    let (lmr, rmr) = (src.register(&early, &pd_e, Access::NONE), dst.register(&late, &pd_l, Access::ALL));
    let (mut sq, mut cq) = (Sq::new(&e), CqPoll::new(&cq_e));
    let at = sq.post(&sq.write(SIGNALED, (lmr.lkey(), src.addr(), 64), dst.addr(), rmr.rkey()));
    assert_req(&cq.wait(), opcode::RDMA_WRITE, sq.qpn(), at, 0);
    assert!(dst.read().iter().all(|&b| b == 1));
}

// ---- 8. a peer faster than the NIC: the bounded inbound queue ----

/// The name the NIC under test gives a fake peer that dialed it (its endpoint's made-up address).
const FAKE_DIALER: &str = "peer QP 0xabcdef at 127.0.0.1:9";

/// ACKs arrive with increasing PSNs until the one of `last`; returns how many came.
fn acks_until(s: &mut TcpStream, first: u32, last: u32) -> usize {
    let (mut n, mut prev) = (0, first.wrapping_sub(1) & 0xff_ffff);
    loop {
        let (h, _) = read_frame(s).expect("an ACK");
        assert_eq!(h.kind, kind::ACK, "{h:?}");
        let step = h.w1.wrapping_sub(prev) & 0xff_ffff;
        assert!(step > 0 && step <= 0x80_0000, "ACK of {:#x} after {prev:#x}", h.w1);
        prev = h.w1;
        n += 1;
        if h.w1 == last {
            return n;
        }
    }
}

#[test]
fn a_flood_fills_the_inbound_queue_to_its_bound_then_the_peer_waits_and_every_frame_lands_in_order() {
    let v = Victim::new(Duration::from_secs(30));
    let qp = v.nic.create_qp(&v.pd, &v.cq, 64).unwrap();
    let chunk = 256 * 1024;
    let buf = GuardedBuf::new(chunk, 0);
    let mr = buf.register(&v.nic, &v.pd, Access::ALL);
    let mut s = fake_dials(&v, &qp);
    // The NIC falls behind: its executor takes nothing while the peer writes 160 one-packet WRITEs of 256 KiB
    // (40 MiB, more than the queue and both sockets' buffers hold). Frame i fills the MR with i (its first 8
    // bytes: i as u64).
    v.nic.hold_executor(true);
    let frames = 160u32;
    let (rkey, addr) = (mr.rkey(), buf.addr());
    let mut out = s.try_clone().unwrap();
    let writer = std::thread::spawn(move || {
        for i in 0..frames {
            let mut data = vec![i as u8; chunk];
            data[..8].copy_from_slice(&(i as u64).to_le_bytes());
            out.write_all(&write_pkt((FAKE_PSN + i) & 0xff_ffff, rkey, addr, chunk as u64, 0, &data)).unwrap();
        }
    });
    // As the NIC counts a queued frame: its length (header and data) plus 64.
    let cost = (HEADER + chunk + 64) as u64;
    let full = WireConfig::INBOUND_BYTES as u64 / cost * cost;
    wait_until("the inbound queue to fill", || v.nic.stats().inbound_queued == full);
    // A reader thread finds the queue full (however late it runs), then time for the queue to grow past its
    // bound, were it to.
    wait_until("a reader thread waiting for room", || v.nic.stats().inbound_waits >= 1);
    std::thread::sleep(Duration::from_millis(300));
    let st = v.nic.stats();
    assert_eq!((st.inbound_queued, st.inbound_peak), (full, full), "the queue grew past its bound");
    assert!(st.inbound_waits >= 1, "{st:?}");
    assert!(!writer.is_finished(), "the peer wrote all 40 MiB: nothing pushed back");
    // Caught up, the NIC takes everything, in order: one WRITE after the other, ACKed up to the last.
    v.nic.hold_executor(false);
    let last = (FAKE_PSN + frames - 1) & 0xff_ffff;
    acks_until(&mut s, FAKE_PSN, last);
    writer.join().unwrap();
    let got = buf.read();
    assert_eq!(u64::from_le_bytes(got[..8].try_into().unwrap()), u64::from(frames - 1));
    assert!(got[8..].iter().all(|&b| b == (frames - 1) as u8));
    assert!(buf.guards_intact());
    let st = v.nic.stats();
    assert_eq!((st.inbound_queued, st.inbound_peak), (0, full));
    assert_eq!(qp.state(), QpState::Rts);
    drop(mr);
}

// ---- 9. a peer that stops in the middle of a frame (half-open connection) ----

#[test]
fn peer_stalled_mid_frame_takes_the_idle_link_down_naming_it() {
    let retry = Duration::from_millis(500);
    let v = Victim::new(retry);
    let qp = v.nic.create_qp(&v.pd, &v.cq, 64).unwrap();
    let mut s = fake_dials(&v, &qp);
    // 30 of the 144 bytes of a WRITE frame (4 + 40 + 100), then nothing, the connection left open.
    let t = Instant::now();
    s.write_all(&write_pkt(FAKE_PSN, 1, 0x1000, 100, 0, &[7; 100])[..30]).unwrap();
    wait_until("the link to go down", || qp.wire_error().is_some());
    let after = t.elapsed();
    assert!(after >= retry && after < retry + Duration::from_secs(3), "{after:?}");
    assert_eq!(
        qp.wire_error().unwrap(),
        format!(
            "{FAKE_DIALER} stalled mid-frame: sent 30 of the 144 bytes of a frame, and the rest did not come within \
             500ms (a half-open connection?)"
        )
    );
    assert_closed(&mut s, "stalled mid-frame");
    // Its next request fails at once.
    let src = GuardedBuf::new(64, 1);
    let lmr = src.register(&v.nic, &v.pd, Access::NONE);
    let (mut sq, mut cq) = (Sq::new(&qp), CqPoll::new(&v.cq));
    let at = sq.post(&sq.write(SIGNALED, (lmr.lkey(), src.addr(), 64), 0x1000, 1));
    assert_err(&cq.wait(), syndrome::TRANSPORT_RETRY_EXC_ERR, opcode::RDMA_WRITE, sq.qpn(), at);
}

#[test]
fn outstanding_write_fails_within_the_retry_timeout_when_the_peer_stalls_mid_frame() {
    let retry = Duration::from_millis(500);
    let mut r = Requester::new(retry);
    let src = GuardedBuf::new(64, 0x11);
    let lmr = src.register(&r.v.nic, &r.v.pd, Access::NONE);
    let (mut sq, mut cq) = (Sq::new(&r.qp), CqPoll::new(&r.v.cq));
    let t = Instant::now();
    let at = sq.post(&sq.write(SIGNALED, (lmr.lkey(), src.addr(), 64), 0x1000, 0x4242));
    let (h, _) = read_frame(&mut r.s).expect("the WRITE");
    assert_eq!(h.kind, kind::WRITE);
    // Half an ACK, then silence: the WRITE's wait ends at its bound, naming the peer.
    std::thread::sleep(Duration::from_millis(100));
    let ack = frame(H { kind: kind::ACK, w1: h.w1, ..H::default() }, &[]);
    r.s.write_all(&ack[..20]).unwrap();
    assert_err(&cq.wait(), syndrome::TRANSPORT_RETRY_EXC_ERR, opcode::RDMA_WRITE, sq.qpn(), at);
    let after = t.elapsed();
    assert!(after >= retry && after < retry + Duration::from_secs(3), "{after:?}");
    assert_eq!(r.qp.wire_error().unwrap(), format!("no response from {} within 500ms", r.peer()));
    assert_closed(&mut r.s, "stalled mid-ACK");
}

// ---- 10. the executor never waits on a peer ----

/// Posts a WRITE of `n` bytes from a leaked buffer; returns the WQE index and the MR.
fn post_big_write(r: &Requester, sq: &mut Sq, n: usize) -> (u64, gdaki::nic::emu::Mr) {
    let src = Box::leak(Box::new(GuardedBuf::new(n, 0x11)));
    let lmr = src.register(&r.v.nic, &r.v.pd, Access::NONE);
    let at = sq.post(&sq.write(SIGNALED, (lmr.lkey(), src.addr(), n as u32), 0x1000, 0x4242));
    (at, lmr)
}

#[test]
fn a_peer_that_stops_reading_stalls_only_its_own_qp() {
    let retry = Duration::from_secs(2);
    let r = Requester::new(retry);
    let (mut sq, mut cq) = (Sq::new(&r.qp), CqPoll::new(&r.v.cq));
    let t = Instant::now();
    let (at, lmr) = post_big_write(&r, &mut sq, 32 << 20);
    std::thread::sleep(Duration::from_millis(200));
    // Meanwhile another QP of the same NIC works at full speed.
    let other = Instant::now();
    let peer_nic = EmuNic::open(wired(retry)).unwrap();
    assert_legit_pair_works(&peer_nic, &r.v.nic);
    assert!(other.elapsed() < Duration::from_millis(800), "the other QP waited {:?}", other.elapsed());
    // The stuck QP fails at its retry timeout, its WRITE unanswered (and unsent).
    assert_err(&cq.wait(), syndrome::TRANSPORT_RETRY_EXC_ERR, opcode::RDMA_WRITE, sq.qpn(), at);
    assert!(t.elapsed() >= retry && t.elapsed() < retry + Duration::from_secs(3), "{:?}", t.elapsed());
    let e = r.qp.wire_error().unwrap();
    let prefix = format!("no response from {} within 2s (", r.peer());
    let n: usize = e
        .strip_prefix(&prefix)
        .and_then(|rest| rest.strip_suffix(" bytes still wait for its socket)"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{e}"));
    // What waited: at least one packet, at most the outbox's high-water mark and one packet.
    assert!((256 * 1024..=(1 << 20) + 256 * 1024 + 44).contains(&n), "{n}");
    let dropped = Instant::now();
    drop(lmr);
    assert!(dropped.elapsed() < Duration::from_millis(500));
}

#[test]
fn a_peer_that_stops_reading_read_responses_loses_the_link_at_the_retry_timeout() {
    let retry = Duration::from_secs(1);
    let v = Victim::new(retry);
    let qp = v.nic.create_qp(&v.pd, &v.cq, 64).unwrap();
    let n = 32 << 20;
    let buf = GuardedBuf::new(n, 0x5a);
    let mr = buf.register(&v.nic, &v.pd, Access::ALL);
    let mut s = fake_dials(&v, &qp);
    // A READ of 32 MiB whose answer the fake never reads: the NIC has nothing outstanding of its own, and its
    // socket stops taking bytes.
    let h = H { kind: kind::READ, w1: FAKE_PSN, w2: mr.rkey(), q2: buf.addr(), q3: n as u64, ..H::default() };
    let t = Instant::now();
    s.write_all(&frame(h, &[])).unwrap();
    wait_until("the link to go down", || qp.wire_error().is_some());
    assert!(t.elapsed() >= retry && t.elapsed() < retry + Duration::from_secs(3), "{:?}", t.elapsed());
    let e = qp.wire_error().unwrap();
    let waiting: usize = e
        .strip_prefix(&format!("{FAKE_DIALER} stopped reading: its socket took none of "))
        .and_then(|rest| rest.strip_suffix(" bytes within 1s"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{e}"));
    assert!((1..=(1 << 20) + 256 * 1024 + 44).contains(&waiting), "{waiting}");
    assert_closed(&mut s, "stopped reading");
    assert!(v.nic.executor_alive() && buf.guards_intact());
    drop(mr);
}

#[test]
fn local_mr_dropped_while_its_write_waits_for_the_peer_fails_the_write() {
    let mut r = Requester::new(Duration::from_secs(10));
    let (mut sq, mut cq) = (Sq::new(&r.qp), CqPoll::new(&r.v.cq));
    let (at, lmr) = post_big_write(&r, &mut sq, 32 << 20);
    std::thread::sleep(Duration::from_millis(200));
    // The WRITE is part-way, its sender waiting for the peer: deregistering its source does not wait for it.
    let t = Instant::now();
    drop(lmr);
    assert!(t.elapsed() < Duration::from_millis(500), "deregistration waited {:?}", t.elapsed());
    // The peer reads again: the WRITE cannot go on without its memory, and the half-sent message ends the link.
    assert_closed(&mut r.s, "a WRITE without its MR");
    let e = assert_err(&cq.wait(), syndrome::LOCAL_PROT_ERR, opcode::RDMA_WRITE, sq.qpn(), at);
    assert_eq!(
        r.qp.wire_error().unwrap(),
        format!("a WRITE to {} lost its local memory mid-message (syndrome 0x{:x})", r.peer(), e.syndrome)
    );
}

/// Every frame of `bytes` (a stream as the NIC wrote it), a partial one at the end left out.
fn frames_in(bytes: &[u8]) -> Vec<H> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + 4 + HEADER <= bytes.len() {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        if at + 4 + len > bytes.len() {
            break;
        }
        let b = &bytes[at + 4..at + 4 + len];
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
        out.push(H {
            kind: b[0],
            flags: b[1],
            w1: u32_at(4),
            w2: u32_at(8),
            w3: u32_at(12),
            q2: u64_at(16),
            q3: u64_at(24),
            q4: u64_at(32),
        });
        at += 4 + len;
    }
    out
}

/// Appends to `got` what `s` delivers until nothing comes for `quiet`, or the connection ends (then returns
/// true).
fn read_until_quiet(s: &mut TcpStream, got: &mut Vec<u8>, quiet: Duration) -> bool {
    s.set_read_timeout(Some(quiet)).unwrap();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                return false
            }
            Err(e) => panic!("reading from the NIC: {e}"),
        }
    }
}

#[test]
fn a_qp_destroyed_right_after_a_peer_request_took_effect_still_sends_its_answer() {
    // A process that sees the effect of its peer's last request (the semaphore a fetch-add advanced) and tears
    // its QP down at once must not cut that request off: on hardware its answer left with the effect. Here the
    // answer is owed still when the QP goes: it waits behind a WRITE the fake has not read, and the executor is
    // held while the fake catches up, so that only the teardown can send it.
    let r = Requester::new(Duration::from_secs(30));
    let word = GuardedBuf::new(8, 0);
    let wmr = word.register(&r.v.nic, &r.v.pd, Access::ALL);
    let mut sq = Sq::new(&r.qp);
    let (_, lmr) = post_big_write(&r, &mut sq, 32 << 20);
    // The WRITE fills the socket and the outbox: the answer to the fetch-add cannot go out after it yet.
    std::thread::sleep(Duration::from_millis(300));
    let Requester { v, qp, mut s } = r;
    let fa = H { kind: kind::FETCH_ADD, w1: FAKE_PSN, w2: wmr.rkey(), q2: word.addr(), q3: 5, ..H::default() };
    s.write_all(&frame(fa, &[])).unwrap();
    wait_until("the fetch-add to take effect", || word.u64_at(0) == 5);
    v.nic.hold_executor(true);
    std::thread::sleep(Duration::from_millis(100));
    let mut got = Vec::new();
    assert!(!read_until_quiet(&mut s, &mut got, Duration::from_millis(300)), "the connection ended early");
    assert!(!frames_in(&got).iter().any(|h| h.kind == kind::ATOMIC_RESP), "the answer came before the teardown");
    // The teardown, while the executor is held: it acts on it once it runs again.
    let dropper = std::thread::spawn(move || drop(qp));
    std::thread::sleep(Duration::from_millis(200));
    v.nic.hold_executor(false);
    dropper.join().unwrap();
    assert!(read_until_quiet(&mut s, &mut got, Duration::from_secs(5)), "the connection did not end");
    let answers: Vec<H> = frames_in(&got).into_iter().filter(|h| h.kind != kind::WRITE).collect();
    assert_eq!(answers.len(), 1, "{answers:?}");
    assert_eq!((answers[0].kind, answers[0].w1, answers[0].q3), (kind::ATOMIC_RESP, FAKE_PSN, 0), "{answers:?}");
    assert!(v.nic.executor_alive() && word.guards_intact());
    drop((lmr, wmr));
}

// ---- 11. what a requester may have outstanding ----

#[test]
fn reads_pipeline_and_a_write_after_them_waits_for_the_last_answer() {
    let mut r = Requester::with_sq(Duration::from_secs(10), 1024);
    let n = 300u32;
    let local = GuardedBuf::new(8 * n as usize + 8, 0);
    let lmr = local.register(&r.v.nic, &r.v.pd, Access::LOCAL_WRITE);
    let (mut sq, mut cq) = (Sq::new(&r.qp), CqPoll::new(&r.v.cq));
    let mut last_read = 0;
    for i in 0..n {
        let fm = if i == n - 1 { SIGNALED } else { 0 };
        let raddr = 0x1000 + 8 * i as u64;
        last_read = sq.put(&sq.read(fm, (lmr.lkey(), local.addr() + 8 * i as u64, 8), raddr, 0x4242));
    }
    let wr = sq.put(&sq.write(SIGNALED, (lmr.lkey(), local.addr() + 8 * n as u64, 8), 0x9000, 0x4242));
    sq.dbrec();
    sq.doorbell(wr);
    let psn0 = r.qp.endpoint().psn;
    // Every frame that comes within 300 ms of the last.
    let take = |s: &mut TcpStream| {
        s.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
        std::iter::from_fn(|| read_frame(s)).collect::<Vec<_>>()
    };
    let reads = take(&mut r.s);
    assert_eq!(reads.len(), n as usize, "all READs go out without waiting for answers");
    for (i, (h, _)) in reads.iter().enumerate() {
        let want = (kind::READ, (psn0 + i as u32) & 0xff_ffff, 0x1000 + 8 * i as u64, 8);
        assert_eq!((h.kind, h.w1, h.q2, h.q3), want, "request {i}");
    }
    let answer = |s: &mut TcpStream, h: &H| {
        let f = frame(H { kind: kind::READ_RESP, flags: FLAG_LAST, w1: h.w1, ..H::default() }, &h.q2.to_le_bytes());
        s.write_all(&f).unwrap();
    };
    // The WRITE waits for the last of them.
    for (h, _) in &reads[..n as usize - 1] {
        answer(&mut r.s, h);
    }
    assert!(take(&mut r.s).is_empty(), "the WRITE went out while a READ before it was unanswered");
    answer(&mut r.s, &reads[n as usize - 1].0);
    r.s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let (h, data) = read_frame(&mut r.s).expect("the WRITE");
    assert_eq!((h.kind, h.w1, h.q2, data), (kind::WRITE, (psn0 + n) & 0xff_ffff, 0x9000, vec![0; 8]));
    r.s.write_all(&frame(H { kind: kind::ACK, w1: h.w1, ..H::default() }, &[])).unwrap();
    assert_req(&cq.wait(), opcode::RDMA_READ, sq.qpn(), last_read, 8);
    assert_req(&cq.wait(), opcode::RDMA_WRITE, sq.qpn(), wr, 0);
    let got = local.read();
    for i in 0..n as usize {
        assert_eq!(u64::from_le_bytes(got[8 * i..8 * i + 8].try_into().unwrap()), 0x1000 + 8 * i as u64);
    }
}

#[test]
fn write_and_atomic_after_a_read_wait_for_its_response() {
    let mut r = Requester::new(Duration::from_secs(10));
    let local = GuardedBuf::new(64, 0x11);
    let lmr = local.register(&r.v.nic, &r.v.pd, Access::LOCAL_WRITE);
    let (mut sq, mut cq) = (Sq::new(&r.qp), CqPoll::new(&r.v.cq));
    let psn = r.qp.endpoint().psn;
    let rd = sq.put(&sq.read(SIGNALED, (lmr.lkey(), local.addr(), 8), 0x1000, 0x4242));
    let wr = sq.put(&sq.write(SIGNALED, (lmr.lkey(), local.addr() + 8, 8), 0x1000, 0x4242));
    let fa = sq.put(&sq.atomic(
        opcode::ATOMIC_FA,
        SIGNALED,
        AtomicSeg::fetch_add(1),
        (lmr.lkey(), local.addr() + 16),
        0x1008,
        0x4242,
    ));
    sq.dbrec();
    sq.doorbell(fa);
    let (h, _) = read_frame(&mut r.s).expect("the READ");
    assert_eq!((h.kind, h.w1), (kind::READ, psn));
    // Nothing else while the READ is unanswered: its data must not see the WRITE.
    r.s.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
    assert!(read_frame(&mut r.s).is_none(), "a request went out while the READ before it was unanswered");
    r.s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    r.s.write_all(&frame(H { kind: kind::READ_RESP, flags: FLAG_LAST, w1: psn, ..H::default() }, &[0x22; 8])).unwrap();
    let (h, data) = read_frame(&mut r.s).expect("the WRITE");
    assert_eq!((h.kind, h.w1, data), (kind::WRITE, (psn + 1) & 0xff_ffff, vec![0x11; 8]));
    let (h, _) = read_frame(&mut r.s).expect("the fetch-add");
    assert_eq!((h.kind, h.w1), (kind::FETCH_ADD, (psn + 2) & 0xff_ffff));
    r.s.write_all(&frame(H { kind: kind::ACK, w1: (psn + 1) & 0xff_ffff, ..H::default() }, &[])).unwrap();
    r.s.write_all(&frame(H { kind: kind::ATOMIC_RESP, w1: (psn + 2) & 0xff_ffff, q3: 41, ..H::default() }, &[]))
        .unwrap();
    assert_req(&cq.wait(), opcode::RDMA_READ, sq.qpn(), rd, 8);
    assert_req(&cq.wait(), opcode::RDMA_WRITE, sq.qpn(), wr, 0);
    assert_req(&cq.wait(), opcode::ATOMIC_FA, sq.qpn(), fa, 8);
    assert_eq!((local.u64_at(0), local.u64_at(16)), (u64::from_ne_bytes([0x22; 8]), 41));
}

#[test]
fn responder_refuses_more_unanswered_reads_than_the_deepest_sq_holds() {
    let v = Victim::new(Duration::from_secs(10));
    let qp = v.nic.create_qp(&v.pd, &v.cq, 64).unwrap();
    let buf = GuardedBuf::new(256 * 1024, 0x5a);
    let mr = buf.register(&v.nic, &v.pd, Access::ALL);
    let mut s = fake_dials(&v, &qp);
    // More READs of 256 KiB than an SQ of MAX_WQE_CNT WQEBBs can have outstanding, and the fake reads none of
    // the answers: they wait in the responder, which holds as many as that and no more.
    let max = gdaki::nic::emu::MAX_WQE_CNT;
    let mut reads = Vec::new();
    for i in 0..max + 1000 {
        let psn = (FAKE_PSN + i) & 0xff_ffff;
        reads.extend(frame(
            H { kind: kind::READ, w1: psn, w2: mr.rkey(), q2: buf.addr(), q3: 256 * 1024, ..H::default() },
            &[],
        ));
    }
    s.write_all(&reads).unwrap();
    wait_until("the link to go down", || qp.wire_error().is_some());
    assert_eq!(
        qp.wire_error().unwrap(),
        format!("{FAKE_DIALER} broke the protocol: more than {max} READs and atomics outstanding")
    );
    assert_closed(&mut s, "too many READs");
    assert!(v.nic.executor_alive() && buf.guards_intact());
    drop(mr);
}

/// The guide's "Known limits": any connection to the listener gets a thread for up to 5 s before its hello.
/// A stranger that sends its hello one byte per second, each within 5 s of the last, is cut off at 5 s (it was
/// served after 9 s: the bound applied to each read, not to the hello).
#[test]
fn a_trickled_hello_is_cut_off_after_5_s() {
    let v = Victim::new(Duration::from_secs(3));
    let mut s = TcpStream::connect(v.nic.wire_addr().unwrap()).unwrap();
    let start = Instant::now();
    // A well-formed hello naming a QP that does not exist: the NIC answers it with a reject once it has it all.
    let h = hello(SMALL_NIC, FAKE_QPN, v.nic.id(), 0x00ff_fff0, VERSION);
    let (head, rest) = h.split_at(9);
    for b in head {
        if s.write_all(&[*b]).is_err() {
            break;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    let _ = s.write_all(rest);
    s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let answered = read_frame(&mut s);
    assert!(
        answered.is_none(),
        "the NIC served a hello that took {:?} to arrive (answer {:?}): more than the 5 s a stranger gets",
        start.elapsed(),
        answered.map(|(h, _)| (h.kind, h.w3))
    );
}
