//! The Exclusive poster's counters (pi, ci, room, the CQE countdown) live in registers and are handed to its
//! slow paths (waiting for room, `poll_cq`, `wait`, `flush`, `progress`, `wait_semaphore`) through the handle
//! (`Qp::cold`: `Sq::store_pi`, `out_of_line`, `Sq::load`). These tests drive that hand-off hard on the `cpu`
//! executor against the emulated NIC: a 16-WQEBB ring on which many posts wait for room, every kind of
//! post and slow path interleaved, posters of every kind following each other on one handle, an error CQE in
//! the middle, timeouts, and handles of sizes device code cannot post to.
//!
//! Every expected value comes from a model kept here (producer index, the CQE policy written as "a quarter of
//! the ring posted since the last WQE that asked for one", the WQEs that asked for a CQE), never from the code
//! under test. Payloads are random and checked byte for byte. Replay a failure with its `GDAKI_TEST_SEED`.

mod emu_util;

use std::time::{Duration, Instant};

use emu_util::{random_bytes, rng, wait_until, GuardedBuf, Pair};
use gdaki::nic::emu::{vendor, Access, Mr, Stats};
use gdaki_device::error::{CqeError, InvalidArgument, Timeout, WaitOn};
use gdaki_device::qp::{Qp as DevQp, Ticket};
use gdaki_device::scope::{Block, Device};
use gdaki_device::shared_qp::SharedQp;
use gdaki_device::warp_qp::WarpQp;
use gdaki_device::wqe::{self, Raddr, Sge, Wqe, MAX_INLINE};
use gdaki_device::Error;
use gdaki_shared::handle::{MrHandle, QpHandle, RemoteMr};
use gdaki_shared::prm::opcode::{self, syndrome};
use gdaki_shared::prm::wqe::WQEBB;
use gdaki_shared::Be32;
use rand::rngs::SmallRng;
use rand::RngExt;

const TIMEOUT_NS: u64 = 10_000_000_000;
const SHORT_NS: u64 = 30_000_000;
const RING: u32 = 16;
const SLOT: usize = 256;

/// WQEBBs of an inline RDMA WRITE of `len` bytes, by hand from the PRM layout: ctrl 16 + raddr 16 + header 4 +
/// data, rounded up to 64-byte WQEBBs.
fn inline_wqebbs(len: usize) -> u64 {
    (32 + 4 + len as u64).div_ceil(WQEBB as u64)
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Unrung {
    No,
    Yes,
    Maybe,
}

/// What the handle's send-queue state must be, kept independently of the code under test.
#[derive(Debug)]
struct Model {
    cnt: u64,
    pi: u64,
    sig_end: u64,
    sig_first: u64,
    /// Every WQE index that asked for a CQE, in posting order.
    asked: Vec<u64>,
    /// Every WQE's first WQEBB index, in order.
    starts: Vec<u64>,
    unrung: Unrung,
    bf_max: u64,
    /// WQEBBs free as the `Qp` last reported (set before a step), and the posts that found too few: they
    /// waited for room out of line.
    free: u64,
    slow: u64,
    posts: u64,
    /// The most `rung` may say: the producer index at the last point a doorbell may have been rung.
    rung_max: u64,
}

impl Model {
    fn new(cnt: u32) -> Self {
        Model {
            cnt: cnt as u64,
            pi: 0,
            sig_end: 0,
            sig_first: 0,
            asked: vec![],
            starts: vec![],
            unrung: Unrung::No,
            bf_max: 0,
            free: 0,
            slow: 0,
            posts: 0,
            rung_max: 0,
        }
    }

    fn note(&mut self, reserved: u64) {
        self.posts += 1;
        if reserved > self.free {
            // It waits for room, ringing what is unrung first.
            self.rung_max = self.pi;
            self.slow += 1;
            self.free = 0;
        } else {
            self.free -= reserved;
        }
    }

    fn record(&mut self, t: u64, nbb: u64, asks: bool) {
        assert_eq!(t, self.pi);
        self.starts.push(t);
        self.pi += nbb;
        if asks {
            self.asked.push(t);
            self.sig_first = t + 1;
            self.sig_end = self.pi;
        }
    }

    /// An Exclusive (or warp) post of `nbb` WQEBBs: it asks for a CQE when the caller asks, or when the
    /// WQEBBs posted since the end of the last WQE that asked, with its own, make a quarter of the ring.
    fn exclusive(&mut self, nbb: u64, signaled: bool) -> u64 {
        let since = self.pi - self.sig_end;
        let asks = signaled || since + nbb >= self.cnt / 4;
        let t = self.pi;
        self.note(nbb);
        self.record(t, nbb, asks);
        self.unrung = Unrung::Yes;
        t
    }

    /// An Exclusive batch: the policy is decided for the WQEBBs reserved (`reserved`), the WQEs take `sizes`;
    /// only the last may ask. Returns the last WQE's index.
    fn batch(&mut self, sizes: &[u64], reserved: u64, signaled: bool) -> u64 {
        let since = self.pi - self.sig_end;
        let asks = signaled || since + reserved >= self.cnt / 4;
        self.note(reserved);
        for (i, &n) in sizes.iter().enumerate() {
            let t = self.pi;
            self.record(t, n, asks && i == sizes.len() - 1);
        }
        self.unrung = Unrung::Yes;
        *self.starts.last().unwrap()
    }

    /// A shared post: asks when the caller asks, or when it covers the last WQEBB of an aligned quarter of the
    /// ring.
    fn shared(&mut self, nbb: u64, signaled: bool) -> u64 {
        let q = self.cnt / 4;
        let t = self.pi;
        let asks = signaled || (t..t + nbb).any(|k| (k + 1) % q == 0);
        self.record(t, nbb, asks);
        self.unrung = Unrung::No;
        t
    }

    /// A signaled NOP a wait or flush posted.
    fn nop(&mut self) {
        let t = self.pi;
        self.record(t, 1, true);
    }

    /// Checks the send-queue words of `h` and the consumer indices against the model (`rung` only when known).
    fn check(&mut self, h: &QpHandle, what: &str) {
        let s = h.sq;
        if self.unrung != Unrung::Yes {
            self.rung_max = self.pi;
        }
        // `rung` never claims WQEBBs no doorbell announced.
        assert!(s.rung <= self.rung_max, "{what}: rung {} but at most {} can have been rung", s.rung, self.rung_max);
        assert_eq!(
            (s.pi, s.ready, s.sig_end, s.sig_first, s.err_idx),
            (self.pi, self.pi, self.sig_end, self.sig_first, 0),
            "{what}: handle state {s:?}"
        );
        assert!(s.ci <= s.pi && s.pi - s.ci <= self.cnt, "{what}: ci {} pi {}", s.ci, s.pi);
        // The consumer index moves only to just past a WQE that asked for a CQE.
        let k = self.asked.iter().filter(|&&a| a < s.ci).count();
        assert!(s.ci == 0 || self.asked.contains(&(s.ci - 1)), "{what}: ci {} is past no signaled WQE", s.ci);
        // CQEs are consumed in order, one per signaled WQE: exactly those of the WQEs below ci.
        assert_eq!(h.cq.cons_index, k as u64, "{what}: CQ consumer index vs ci {}", s.ci);
        if self.unrung == Unrung::No {
            assert_eq!(s.rung, self.pi, "{what}: rung");
        }
        // The room an Exclusive poster of this state has: what the next posts are judged by.
        self.free = self.cnt - (s.pi - s.ci);
    }
}

/// Buffers for many one-shot writes: slot `k` of the destination gets (a prefix of) slot `k` of the source.
/// Field order is drop order: MRs first.
struct Fx {
    _mrs: Vec<Mr>,
    p: Pair,
    src: GuardedBuf,
    dst: GuardedBuf,
    sem: GuardedBuf,
    res: GuardedBuf,
    srcb: Vec<u8>,
    want: Vec<u8>,
    local: MrHandle,
    remote: RemoteMr,
    sem_r: RemoteMr,
    res_l: MrHandle,
    next: usize,
    slots: usize,
    signals: u64,
}

impl Fx {
    fn new(rng: &mut SmallRng, slots: usize, ring: u32, ncqe: u32) -> Self {
        let p = Pair::new(ring, ncqe);
        let (src, dst) = (GuardedBuf::new(slots * SLOT, 0), GuardedBuf::new(slots * SLOT, 0xee));
        let srcb = random_bytes(rng, slots * SLOT);
        src.copy_in(&srcb);
        let sem = GuardedBuf::new(8, 0);
        let res = GuardedBuf::new(8 * 4096, 0xa5);
        let lmr = src.register(&p.nic, &p.pd, Access::NONE);
        let rmr = dst.register(&p.nic, &p.pd, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
        let smr = sem.register(&p.nic, &p.pd, Access::LOCAL_WRITE | Access::REMOTE_ATOMIC);
        let qmr = res.register(&p.nic, &p.pd, Access::LOCAL_WRITE);
        let (local, remote, sem_r, res_l) = (lmr.handle(), rmr.remote(), smr.remote(), qmr.handle());
        Fx {
            _mrs: vec![lmr, rmr, smr, qmr],
            p,
            src,
            dst,
            sem,
            res,
            srcb,
            want: vec![0xee; slots * SLOT],
            local,
            remote,
            sem_r,
            res_l,
            next: 0,
            slots,
            signals: 0,
        }
    }

    fn left(&self) -> usize {
        self.slots - self.next
    }

    /// Takes the next slot for a payload of `len` bytes; records what the destination must hold.
    fn take(&mut self, len: usize) -> usize {
        let k = self.next;
        assert!(k < self.slots);
        self.next += 1;
        let r = k * SLOT..k * SLOT + len;
        self.want[r.clone()].copy_from_slice(&self.srcb[r]);
        k
    }

    fn write(&mut self, len: usize) -> Wqe<3> {
        let k = self.take(len);
        let off = (k * SLOT) as u64;
        wqe::rdma_write(
            Raddr { addr: self.remote.addr + off, rkey: self.remote.rkey },
            Sge::new(self.local.addr + off, len as u32, self.local.lkey).unwrap(),
        )
    }

    /// An inline write of slot bytes; returns the WQE and its WQEBBs.
    fn inline(&mut self, len: usize) -> (Wqe<{ wqe::MAX_DS }>, u64) {
        let k = self.take(len);
        let data = &self.srcb[k * SLOT..k * SLOT + len];
        let r = Raddr { addr: self.remote.addr + (k * SLOT) as u64, rkey: self.remote.rkey };
        (wqe::rdma_write_inline(r, data).unwrap(), inline_wqebbs(len))
    }

    fn raddr(&self, k: usize) -> Raddr {
        Raddr { addr: self.remote.addr + (k * SLOT) as u64, rkey: self.remote.rkey }
    }

    fn check_dst(&self, what: &str) {
        let got = self.dst.copy_out();
        if got != self.want {
            let i = got.iter().zip(&self.want).position(|(a, b)| a != b).unwrap();
            panic!("{what}: destination byte {i} (slot {}) is {:#x}, want {:#x}", i / SLOT, got[i], self.want[i]);
        }
    }

    /// The NIC's counters once it has counted `wqes` WQEs and `cqes` CQEs, asserted to be exactly those: a CQE
    /// is counted just after the NIC writes it or queues it behind the data it reports, so the count may trail
    /// the CQEs software has polled.
    fn counted(&self, wqes: u64, cqes: u64, what: &str) -> Stats {
        let s = emu_util::stats_counted(&self.p.nic, wqes, cqes);
        assert_eq!((s.wqes, s.cqes), (wqes, cqes), "{what}: {s:?}");
        s
    }

    fn check_stats_clean(&self, what: &str) {
        let s = self.p.nic.stats();
        assert_eq!(
            (s.error_cqes, s.flush_cqes, s.bad_doorbells, s.stale_doorbells, s.dbrec_mismatches, s.cq_overruns),
            (0, 0, 0, 0, 0, 0),
            "{what}: {s:?}"
        );
        assert_eq!(s.blueflame_mismatches, 0, "{what}: {s:?}");
    }
}

/// `Qp::poll_cq` where no error CQE can come: a completion taken, or none there.
fn poll_ok(qp: &mut DevQp<'_>) {
    if let Some(r) = qp.poll_cq() {
        r.unwrap_or_else(|e| panic!("poll_cq: {e}"));
    }
}

fn dev_qp(h: &mut QpHandle, timeout: u64) -> DevQp<'_> {
    // SAFETY: every handle here is a live emulated QP's (its pair outlives the borrow), host queue memory,
    // used by this thread only while the `Qp` lives.
    unsafe { DevQp::new(h, timeout) }
}

/// One random step on an Exclusive `Qp`, checked against the model. Returns a label for messages.
fn exclusive_step(qp: &mut DevQp<'_>, m: &mut Model, fx: &mut Fx, rng: &mut SmallRng, issued: &mut Vec<u64>) -> String {
    let sig: bool = rng.random_bool(0.3);
    // Mostly posts (0..=10), so that the ring fills between the slow paths (11..=16) that retire it.
    let op = if rng.random_bool(0.88) { rng.random_range(0..11u32) } else { rng.random_range(11..17u32) };
    let hs = qp.handle();
    m.free = m.cnt - (hs.sq.pi - hs.sq.ci);
    let label = format!("op {op} sig {sig} at pi {}", m.pi);
    match op {
        0 | 1 => {
            let len = rng.random_range(1..=SLOT);
            let w = fx.write(len);
            let t = qp.post(sig, w).unwrap();
            assert_eq!(t, Ticket(m.exclusive(1, sig)), "{label}");
            issued.push(t.0);
            if rng.random_bool(0.5) {
                qp.ring_db();
                m.unrung = Unrung::No;
            }
        }
        2 => {
            let len = rng.random_range(1..=SLOT);
            let w = fx.write(len);
            let before = m.unrung;
            let t = qp.post_bf(sig, w).unwrap();
            assert_eq!(t, Ticket(m.exclusive(1, sig)), "{label}");
            issued.push(t.0);
            match before {
                Unrung::No => m.bf_max += 1,
                Unrung::Maybe => m.bf_max += 1,
                Unrung::Yes => {}
            }
            m.unrung = Unrung::No;
        }
        3 | 4 => {
            let len = rng.random_range(1..=MAX_INLINE);
            let k = fx.take(len);
            let data = fx.srcb[k * SLOT..k * SLOT + len].to_vec();
            let t = qp.post_write_inline(sig, fx.raddr(k), &data).unwrap();
            assert_eq!(t, Ticket(m.exclusive(inline_wqebbs(len), sig)), "{label} inline {len}");
            issued.push(t.0);
        }
        5 => {
            let len = rng.random_range(1..=MAX_INLINE);
            let (w, nbb) = fx.inline(len);
            let before = m.unrung;
            let t = qp.post_bf(sig, w).unwrap();
            assert_eq!(t, Ticket(m.exclusive(nbb, sig)), "{label} bf inline {len}");
            issued.push(t.0);
            if nbb == 1 {
                match before {
                    Unrung::No => m.bf_max += 1,
                    Unrung::Maybe => m.bf_max += 1,
                    Unrung::Yes => {}
                }
            }
            m.unrung = Unrung::No;
        }
        6 | 7 => {
            let n = rng.random_range(1..=(RING / 2) as usize).min(fx.left());
            let ws: Vec<Wqe<3>> = (0..n)
                .map(|_| {
                    let len = rng.random_range(1..=SLOT);
                    fx.write(len)
                })
                .collect();
            let mut built = vec![];
            let t = qp
                .post_batch(n as u32, sig, |i| {
                    built.push(i);
                    ws[i as usize]
                })
                .unwrap();
            assert_eq!(built, (0..n as u32).collect::<Vec<_>>());
            assert_eq!(t, Ticket(m.batch(&vec![1; n], n as u64, sig)), "{label} batch {n}");
            issued.push(t.0);
        }
        8 => {
            let n = rng.random_range(1..=2usize).min(fx.left());
            let ws: Vec<(Wqe<{ wqe::MAX_DS }>, u64)> =
                (0..n).map(|_| fx.inline(rng.random_range(1..=MAX_INLINE))).collect();
            let t = qp.post_batch(n as u32, sig, |i| ws[i as usize].0).unwrap();
            let sizes: Vec<u64> = ws.iter().map(|w| w.1).collect();
            assert_eq!(t, Ticket(m.batch(&sizes, 4 * n as u64, sig)), "{label} inline batch {sizes:?}");
            issued.push(t.0);
        }
        9 => {
            // A batch whose builder refuses its WQE `bad`: nothing posted (it may have waited for room first).
            let n = rng.random_range(1..=8u32);
            let bad = rng.random_range(0..n);
            let r = qp.try_post_batch(n, sig, |i| {
                if i == bad {
                    Err(Error::InvalidArgument(InvalidArgument::AtomicAlignment))
                } else {
                    Ok(wqe::nop())
                }
            });
            assert_eq!(r, Err(Error::InvalidArgument(InvalidArgument::AtomicAlignment)), "{label}");
            if m.unrung == Unrung::Yes {
                m.unrung = Unrung::Maybe;
            }
        }
        10 => {
            let len = rng.random_range(1..=SLOT) as u64;
            let k = fx.take(len as usize);
            let off = (k * SLOT) as u64;
            if rng.random_bool(0.5) {
                qp.put(&fx.remote, off, &fx.local, off, len).unwrap();
                let t = m.exclusive(1, false);
                issued.push(t);
            } else {
                let s = fx.signals;
                let t =
                    qp.put_with_signal(&fx.remote, off, &fx.local, off, len, &fx.sem_r, 0, &fx.res_l, 8 * s).unwrap();
                fx.signals += 1;
                issued.push(m.exclusive(1, false));
                assert_eq!(t, Ticket(m.exclusive(1, true)), "{label} put_with_signal");
                issued.push(t.0);
            }
            m.unrung = Unrung::No;
        }
        11 => {
            if issued.is_empty() {
                return label;
            }
            let t = issued[rng.random_range(0..issued.len())];
            // A NOP that asks for a CQE when `t` is not retired yet and no WQE from `t` on asked for one.
            let ci0 = qp.handle().sq.ci;
            let (pi0, nop) = (m.pi, ci0 <= t && m.sig_first <= t);
            qp.wait(Ticket(t)).unwrap_or_else(|e| panic!("{label}: wait({t}): {e}"));
            let pi1 = qp.handle().sq.pi;
            assert_eq!(pi1, pi0 + nop as u64, "{label}: wait({t}) with ci {ci0}, sig_first {}", m.sig_first);
            if nop {
                m.nop();
                m.unrung = Unrung::No;
            } else if m.unrung == Unrung::Yes {
                m.unrung = Unrung::Maybe;
            }
            assert!(qp.handle().sq.ci > t, "{label}: wait({t}) returned with ci {}", qp.handle().sq.ci);
        }
        12 => {
            let nop = m.sig_end != m.pi;
            qp.flush().unwrap_or_else(|e| panic!("{label}: flush: {e}"));
            if nop {
                m.nop();
            }
            m.unrung = Unrung::No;
            // A CQE retires up to its WQE's first WQEBB + 1: the last WQE that asked for one.
            assert_eq!(qp.handle().sq.ci, m.sig_first, "{label}: flush left WQEs unretired");
            fx.check_dst(&label);
        }
        13 => {
            qp.progress().unwrap();
            m.unrung = Unrung::No;
        }
        14 => {
            // Every completion the CQ holds: each is the next signaled WQE's, in order.
            while let Some(c) = qp.poll_cq() {
                let c = c.unwrap_or_else(|e| panic!("{label}: poll_cq: {e}"));
                let h = qp.handle();
                // `h.cq.cons_index` counts this CQE now: it was the one of asked[cons_index - 1].
                let a = m.asked[h.cq.cons_index as usize - 1];
                assert_eq!((c.opcode, c.wqe_counter, c.qpn), (opcode::cqe::REQ, a as u16, fx.p.a.qpn()), "{label}");
                assert_eq!(h.sq.ci, a + 1, "{label}: poll_cq retired to the CQE's WQE");
            }
        }
        15 => {
            // The semaphore reaches the signals posted (none pending is fine: it returns at once).
            let want = fx.signals;
            // SAFETY: the semaphore word is 8-aligned registered host memory that outlives the wait.
            let seen = unsafe { qp.wait_semaphore(fx.sem.addr() as *const u64, want) }.unwrap();
            assert_eq!(seen, want, "{label}: semaphore");
            m.unrung = Unrung::No;
        }
        _ => {
            // Tickets this QP never issued: refused, nothing moves.
            let h0 = qp.handle();
            assert_eq!(qp.wait(Ticket(m.pi)), Err(Error::InvalidArgument(InvalidArgument::Ticket)), "{label}");
            assert_eq!(qp.wait(Ticket(m.pi + 1000)), Err(Error::InvalidArgument(InvalidArgument::Ticket)));
            let h1 = qp.handle();
            assert_eq!((h0.sq.pi, h0.sq.sig_end), (h1.sq.pi, h1.sq.sig_end), "{label}");
        }
    }
    label
}

/// Hundreds of random operations on a 16-WQEBB ring (nearly every post waits for room): every kind of post,
/// signaled and not, WQEs of 1-4 WQEBBs wrapping the ring, batches, and every slow path between them; the
/// `Qp` is dropped and made again from the handle at random points. After every step the state the `Qp`
/// reports, and after every drop the handle in memory, are what the model says; at the end every payload
/// byte, every CQE and every fetch-add result.
#[test]
fn a_small_ring_under_every_post_and_slow_path_keeps_its_counters() {
    let mut rng = rng();
    for round in 0..3 {
        let mut fx = Fx::new(&mut rng, 1600, RING, 16);
        let mut h = Box::new(fx.p.a.handle());
        let mut m = Model::new(RING);
        let mut issued = vec![];
        let mut steps = 0;
        let mut segments = 0;
        while fx.left() > 20 {
            segments += 1;
            let mut qp = dev_qp(&mut h, TIMEOUT_NS);
            m.check(&qp.handle(), "new Qp");
            let len = rng.random_range(1..120);
            for _ in 0..len {
                if fx.left() <= 20 {
                    break;
                }
                let label = exclusive_step(&mut qp, &mut m, &mut fx, &mut rng, &mut issued);
                steps += 1;
                m.check(&qp.handle(), &format!("round {round} step {steps}: {label}"));
            }
            drop(qp);
            m.unrung = Unrung::No;
            m.check(&h, &format!("round {round}: handle in memory after segment {segments}"));
        }
        let mut qp = dev_qp(&mut h, TIMEOUT_NS);
        let nop = m.sig_end != m.pi;
        qp.flush().unwrap();
        if nop {
            m.nop();
        }
        m.unrung = Unrung::No;
        m.check(&qp.handle(), "final flush");
        drop(qp);
        assert_eq!(h.sq.ci, m.sig_first, "round {round}: final flush retired everything");
        assert_eq!(m.sig_end, m.pi);
        assert_eq!(fx.p.a.sq_consumed(), m.pi);
        fx.check_dst(&format!("round {round}: end"));
        wait_until("the semaphore", || fx.sem.load_u64(0) == fx.signals);
        for s in 0..fx.signals {
            assert_eq!(fx.res.u64_at(8 * s as usize), s, "round {round}: fetch-add result {s}");
        }
        let st = fx.counted(m.starts.len() as u64, m.asked.len() as u64, &format!("round {round}"));
        fx.check_stats_clean(&format!("round {round}"));
        assert_eq!(h.cq.cons_index, m.asked.len() as u64);
        assert!(st.blueflame <= m.bf_max, "round {round}: {} BlueFlame writes, at most {}", st.blueflame, m.bf_max);
        assert!(fx.src.guards_intact() && fx.dst.guards_intact() && fx.res.guards_intact() && fx.sem.guards_intact());
        assert!(m.slow * 8 > m.posts, "round {round}: only {} of {} posts waited for room", m.slow, m.posts);
        eprintln!(
            "round {round}: {} of {} posts waited for room; {steps} steps, {segments} Qps, {} WQEs, {} WQEBBs, {} CQEs, {} BF (at most {}), {st:?}",
            m.slow,
            m.posts,
            m.starts.len(),
            m.pi,
            m.asked.len(),
            st.blueflame,
            m.bf_max
        );
    }
}

/// Every kind of poster after every other on one handle of a 16-WQEBB ring, each doing up to 39 posts (many
/// of which wait for room) and left without a flush, after a slow path or a post: the next one continues from
/// the handle in memory.
#[test]
fn posters_of_every_kind_continue_after_each_others_slow_paths() {
    let mut rng = rng();
    let mut fx = Fx::new(&mut rng, 1500, RING, 16);
    let mut h = Box::new(fx.p.a.handle());
    let mut m = Model::new(RING);
    let mut issued = vec![];
    let mut kinds = [0u32; 4];
    while fx.left() > 40 {
        let kind = rng.random_range(0..4usize);
        kinds[kind] += 1;
        let posts = rng.random_range(1..40usize);
        match kind {
            0 => {
                let mut qp = dev_qp(&mut h, TIMEOUT_NS);
                // A step takes up to 8 slots (a batch): stop while the post after the loop still finds one.
                for _ in 0..posts {
                    if fx.left() <= 16 {
                        break;
                    }
                    let _ = exclusive_step(&mut qp, &mut m, &mut fx, &mut rng, &mut issued);
                }
                // End on a slow path or a post, left unflushed.
                match rng.random_range(0..4u32) {
                    0 => {
                        poll_ok(&mut qp);
                    }
                    1 => qp.progress().unwrap(),
                    _ => {
                        let w = fx.write(rng.random_range(1..=SLOT));
                        issued.push(qp.post(false, w).unwrap().0);
                        assert_eq!(issued.last(), Some(&m.exclusive(1, false)));
                    }
                }
            }
            1 => {
                // SAFETY: the live pair's handle, used by this thread (a warp of one lane) only.
                let mut wq = unsafe { WarpQp::new(&mut *h, TIMEOUT_NS) };
                for _ in 0..posts {
                    let sig = rng.random_bool(0.3);
                    let (t, exp) = if rng.random_bool(0.7) {
                        let w = fx.write(rng.random_range(1..=SLOT));
                        (wq.post(sig, w).unwrap(), m.exclusive(1, sig))
                    } else {
                        let (w, nbb) = fx.inline(rng.random_range(1..=MAX_INLINE));
                        (wq.post(sig, w).unwrap(), m.exclusive(nbb, sig))
                    };
                    m.unrung = Unrung::No;
                    assert_eq!(t, Ticket(exp), "warp post");
                    issued.push(t.0);
                    if !m.asked.is_empty() && rng.random_bool(0.1) {
                        // A WQE that asked for a CQE: no NOP is needed to wait for it.
                        let t = m.asked[rng.random_range(0..m.asked.len())];
                        wq.wait(Ticket(t)).unwrap();
                    }
                }
                if rng.random_bool(0.5) {
                    wq.progress().unwrap();
                }
            }
            _ => {
                let p: *mut QpHandle = &mut *h;
                for _ in 0..posts {
                    let sig = rng.random_bool(0.3);
                    let (r, exp) = if rng.random_bool(0.7) {
                        let w = fx.write(rng.random_range(1..=SLOT));
                        let r = if kind == 2 {
                            // SAFETY: the live pair's handle, used by this thread only while the poster lives.
                            unsafe { SharedQp::<Block>::new(p, TIMEOUT_NS) }.post(sig, w)
                        } else {
                            // SAFETY: as above.
                            unsafe { SharedQp::<Device>::new(p, TIMEOUT_NS) }.post(sig, w)
                        };
                        (r, m.shared(1, sig))
                    } else {
                        let (w, nbb) = fx.inline(rng.random_range(1..=MAX_INLINE));
                        // SAFETY: as above.
                        let r = unsafe { SharedQp::<Block>::new(p, TIMEOUT_NS) }.post(sig, w);
                        (r, m.shared(nbb, sig))
                    };
                    let t = r.unwrap();
                    assert_eq!(t, Ticket(exp), "shared post");
                    issued.push(t.0);
                }
                if rng.random_bool(0.5) {
                    // SAFETY: as above.
                    let _ = unsafe { SharedQp::<Device>::new(p, TIMEOUT_NS) }.progress().unwrap();
                }
            }
        }
        m.unrung = Unrung::No;
        m.check(&h, &format!("after a poster of kind {kind} ({kinds:?})"));
    }
    assert!(kinds.iter().all(|&k| k > 0), "every kind of poster took a turn: {kinds:?}");
    let mut qp = dev_qp(&mut h, TIMEOUT_NS);
    let nop = m.sig_end != m.pi;
    qp.flush().unwrap();
    if nop {
        m.nop();
    }
    drop(qp);
    m.check(&h, "final flush");
    assert_eq!((h.sq.ci, m.sig_end), (m.sig_first, m.pi));
    fx.check_dst("end");
    let st = fx.counted(m.starts.len() as u64, m.asked.len() as u64, &format!("{kinds:?}"));
    fx.check_stats_clean("end");
    assert_eq!(fx.p.a.sq_consumed(), m.pi, "{kinds:?}");
    eprintln!("kinds {kinds:?}, {} WQEBBs, {st:?}", m.pi);
}

/// A post whose BlueFlame write follows a wait for room: the ring is filled exactly, rung, and `post_bf`
/// must wait, then come back and write the WQE to the register. Every one is taken from the register and
/// equals the ring's copy; every payload lands.
#[test]
fn blueflame_after_waiting_for_room_carries_the_right_wqe() {
    let mut rng = rng();
    let mut fx = Fx::new(&mut rng, 3000, RING, 16);
    let mut h = fx.p.a.handle();
    let mut qp = dev_qp(&mut h, TIMEOUT_NS);
    let mut m = Model::new(RING);
    let rounds = 100;
    for r in 0..rounds {
        // Fill the ring to the last WQEBB with WQEs of 1-4 WQEBBs.
        let mut free = RING as u64 - (m.pi - qp.handle().sq.ci);
        assert_eq!(free, RING as u64, "round {r}: the last wait retired everything");
        while free > 0 {
            if rng.random_bool(0.5) || free < 4 {
                let w = fx.write(rng.random_range(1..=SLOT));
                assert_eq!(qp.post(false, w).unwrap(), Ticket(m.exclusive(1, false)));
                free -= 1;
            } else {
                let (w, nbb) = fx.inline(rng.random_range(29..=MAX_INLINE));
                assert_eq!(qp.post(false, w).unwrap(), Ticket(m.exclusive(nbb, false)));
                free -= nbb;
            }
        }
        qp.ring_db();
        m.unrung = Unrung::No;
        let t = if rng.random_bool(0.5) {
            let w = fx.write(rng.random_range(1..=SLOT));
            qp.post_bf(true, w).unwrap()
        } else {
            let (w, nbb) = fx.inline(rng.random_range(1..=28));
            assert_eq!(nbb, 1);
            qp.post_bf(true, w).unwrap()
        };
        assert_eq!(t, Ticket(m.exclusive(1, true)), "round {r}");
        m.unrung = Unrung::No;
        m.check(&qp.handle(), &format!("round {r}"));
        qp.wait(t).unwrap();
        m.check(&qp.handle(), &format!("round {r} after wait"));
    }
    drop(qp);
    fx.check_dst("end");
    let st = fx.counted(m.starts.len() as u64, m.asked.len() as u64, "end");
    fx.check_stats_clean("end");
    assert_eq!((st.blueflame, st.blueflame_fallbacks), (rounds, 0), "{st:?}");
}

/// A WRITE with a bad rkey in the middle of hundreds of posts on a 16-WQEBB ring, posts waiting for room all
/// along (they retire the error and the flushed WQEs): every post succeeds, nothing hangs; the first error is
/// sticky for wait and flush; the WRITEs before it land and none after; every WQE after it is flushed (0x05).
#[test]
fn an_error_cqe_while_posts_wait_for_room_is_sticky_and_flushes_the_rest() {
    let mut rng = rng();
    for round in 0..4 {
        let mut fx = Fx::new(&mut rng, 1500, RING, 16);
        let mut h = Box::new(fx.p.a.handle());
        let mut m = Model::new(RING);
        let total = 300;
        let bad_at = rng.random_range(10..total - 40);
        let mut bad_idx = None;
        let mut tickets = vec![];
        let t0 = Instant::now();
        {
            let mut qp = dev_qp(&mut h, TIMEOUT_NS);
            for i in 0..total {
                let sig = rng.random_bool(0.2);
                if i == bad_at {
                    let k = fx.take(0);
                    let r = Raddr {
                        addr: fx.remote.addr + (k * SLOT) as u64,
                        rkey: Be32::new(fx.remote.rkey.get() ^ 0x40),
                    };
                    let w = wqe::rdma_write(r, Sge::new(fx.local.addr, 64, fx.local.lkey).unwrap());
                    let t = if rng.random_bool(0.5) { qp.post_bf(sig, w) } else { qp.post(sig, w) }.unwrap();
                    assert_eq!(t, Ticket(m.exclusive(1, sig)));
                    bad_idx = Some(t.0);
                    tickets.push(t.0);
                    continue;
                }
                let after = bad_idx.is_some();
                let t = match rng.random_range(0..4u32) {
                    0 | 1 => {
                        let len = rng.random_range(1..=SLOT);
                        let w = if after {
                            // Its slot stays untouched: the WQE is flushed.
                            let k = fx.next;
                            fx.next += 1;
                            wqe::rdma_write(fx.raddr(k), Sge::new(fx.local.addr, len as u32, fx.local.lkey).unwrap())
                        } else {
                            fx.write(len)
                        };
                        let t = qp.post(sig, w).unwrap();
                        assert_eq!(t, Ticket(m.exclusive(1, sig)));
                        t
                    }
                    2 => {
                        let len = rng.random_range(1..=MAX_INLINE);
                        let (w, nbb) = if after {
                            let k = fx.next;
                            fx.next += 1;
                            (wqe::rdma_write_inline(fx.raddr(k), &vec![0x42; len]).unwrap(), inline_wqebbs(len))
                        } else {
                            fx.inline(len)
                        };
                        let t = qp.post(sig, w).unwrap();
                        assert_eq!(t, Ticket(m.exclusive(nbb, sig)));
                        t
                    }
                    _ => {
                        let n = rng.random_range(1..=8usize);
                        let ws: Vec<Wqe<3>> = (0..n)
                            .map(|_| {
                                let len = rng.random_range(1..=SLOT);
                                if after {
                                    let k = fx.next;
                                    fx.next += 1;
                                    wqe::rdma_write(
                                        fx.raddr(k),
                                        Sge::new(fx.local.addr, len as u32, fx.local.lkey).unwrap(),
                                    )
                                } else {
                                    fx.write(len)
                                }
                            })
                            .collect();
                        let t = qp.post_batch(n as u32, sig, |i| ws[i as usize]).unwrap();
                        assert_eq!(t, Ticket(m.batch(&vec![1; n], n as u64, sig)));
                        t
                    }
                };
                tickets.push(t.0);
                if rng.random_bool(0.3) {
                    qp.ring_db();
                }
                if rng.random_bool(0.05) {
                    qp.progress().unwrap();
                }
                let hs = qp.handle();
                assert_eq!(
                    (hs.sq.pi, hs.sq.ready, hs.sq.sig_end, hs.sq.sig_first),
                    (m.pi, m.pi, m.sig_end, m.sig_first)
                );
            }
            let bad = bad_idx.unwrap();
            let first = Error::Cqe(CqeError {
                syndrome: syndrome::REMOTE_ACCESS_ERR,
                vendor_err_synd: vendor::BAD_RKEY,
                wqe_counter: bad as u16,
                qpn: qp.handle().qpn,
            });
            // 40+ posts after the bad one on a 16-WQEBB ring: its CQE was polled while they waited for room.
            assert_eq!(qp.handle().sq.err_idx, bad + 1, "round {round}: the sticky error names the bad WQE");
            assert_eq!(qp.flush(), Err(first), "round {round}");
            assert_eq!(qp.handle().sq.pi, m.pi, "round {round}: a flush of an errored QP posted a NOP");
            assert_eq!(qp.flush(), Err(first), "round {round}: sticky");
            for &t in &tickets {
                let r = qp.wait(Ticket(t));
                if t < bad {
                    assert_eq!(r, Ok(()), "round {round}: wait({t}) before the bad WQE {bad}");
                } else {
                    assert_eq!(r, Err(first), "round {round}: wait({t}) at or after the bad WQE {bad}");
                }
            }
            assert_eq!(
                qp.error(),
                Some(CqeError {
                    syndrome: syndrome::REMOTE_ACCESS_ERR,
                    vendor_err_synd: vendor::BAD_RKEY,
                    wqe_counter: bad as u16,
                    qpn: qp.handle().qpn
                })
            );
            assert_eq!(qp.handle().sq.pi, m.pi, "round {round}: no wait posted anything");
            // The WQEs after the bad one: every one flushed (the last ones may be unrung: a wait or flush that
            // reports the error returns before ringing).
            qp.ring_db();
            // What is left in the CQ: flush errors of later WQEs, in order, polled until the last WQE retires
            // (not until the NIC's count of flush CQEs is reached: it counts a CQE queued behind earlier
            // placements before software can see it).
            let end = *m.starts.last().unwrap() + 1;
            let mut last_seen = bad;
            wait_until("the flush CQE of the last WQE", || {
                while let Some(c) = qp.poll_cq() {
                    match c {
                        Err(Error::Cqe(e)) => {
                            assert_eq!(e.syndrome, syndrome::WR_FLUSH_ERR, "round {round}: {e:?}");
                            let w = qp.handle().sq.ci - 1;
                            assert!(w > last_seen && m.starts.contains(&w), "round {round}: flush CQE for {w}");
                            assert_eq!(w as u16, e.wqe_counter);
                            last_seen = w;
                        }
                        other => panic!("round {round}: poll_cq after the error: {other:?}"),
                    }
                }
                qp.handle().sq.ci == end
            });
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "round {round}: {:?}", t0.elapsed());
        let after = m.starts.iter().filter(|&&s| s > bad_idx.unwrap()).count() as u64;
        // The counts may trail the CQEs polled (as in `Fx::counted`).
        wait_until("the NIC's error counts", || {
            let s = fx.p.nic.stats();
            s.error_cqes >= 1 && s.flush_cqes >= after
        });
        let st = fx.p.nic.stats();
        assert_eq!(
            (st.error_cqes, st.flush_cqes, st.cq_overruns, st.bad_doorbells),
            (1, after, 0, 0),
            "round {round}: {st:?}"
        );
        fx.check_dst(&format!("round {round}: WRITEs before the error land, none after"));
        assert_eq!((h.sq.pi, h.sq.ready, h.sq.rung), (m.pi, m.pi, m.pi));
        assert!(fx.dst.guards_intact());
    }
}

/// `post` again while it times out waiting for room (at most 1,000 tries): this `Qp`'s short timeout is for
/// the timeouts the test provokes, and on a loaded machine the NIC's thread may not retire a WQE within it
/// after it resumes. A timed-out post stores nothing and leaves the counters as they were (the test below checks
/// it), so trying again posts the same WQE once.
fn past_room_timeouts(mut post: impl FnMut() -> Result<Ticket, Error>) -> Result<Ticket, Error> {
    for _ in 0..1000 {
        match post() {
            Err(Error::Timeout(Timeout { on: WaitOn::SqSpace { .. }, .. })) => continue,
            r => return r,
        }
    }
    post()
}

/// A wait for room that times out (the NIC is held, the ring full) returns `Timeout` naming the room wanted,
/// for every kind of post; stores nothing; leaves the counters as they were; and once the NIC runs again the
/// same `Qp` (and a fresh one after it) continues: everything posted before lands, nothing of the timed-out
/// posts does.
#[test]
fn a_timeout_waiting_for_room_leaves_the_qp_usable() {
    let mut rng = rng();
    let mut fx = Fx::new(&mut rng, 800, RING, 16);
    let mut h = Box::new(fx.p.a.handle());
    let mut m = Model::new(RING);
    {
        let mut qp = dev_qp(&mut h, TIMEOUT_NS);
        // Some history first, so the indices are not at 0.
        for _ in 0..37 {
            let sig = rng.random_bool(0.2);
            let w = fx.write(rng.random_range(1..=SLOT));
            assert_eq!(qp.post(sig, w).unwrap(), Ticket(m.exclusive(1, sig)));
        }
        let nop = m.sig_end != m.pi;
        qp.flush().unwrap();
        if nop {
            m.nop();
        }
        m.unrung = Unrung::No;
        m.check(&qp.handle(), "history");
    }
    let cons0 = h.cq.cons_index;
    let wqes0 = fx.p.nic.stats().wqes;
    fx.p.nic.hold_executor(true);
    let mut qp = dev_qp(&mut h, SHORT_NS);
    // Fill the ring: 1..4-WQEBB WQEs, some rung, some not.
    let mut free = RING as u64;
    let mut filled = vec![];
    while free > 0 {
        let t = if free >= 4 && rng.random_bool(0.4) {
            let (w, nbb) = fx.inline(rng.random_range(29..=MAX_INLINE));
            free -= nbb;
            let t = qp.post(false, w).unwrap();
            assert_eq!(t, Ticket(m.exclusive(nbb, false)));
            t
        } else {
            free -= 1;
            let w = fx.write(rng.random_range(1..=SLOT));
            let t = qp.post(false, w).unwrap();
            assert_eq!(t, Ticket(m.exclusive(1, false)));
            t
        };
        filled.push(t);
        if rng.random_bool(0.3) {
            qp.ring_db();
        }
    }
    let before = qp.handle();
    let pristine = fx.want.clone();
    let spare = fx.next;
    let qpn = before.qpn;
    let is_room_timeout = |e: Option<&Error>, n: u32| matches!(e, Some(Error::Timeout(Timeout { on: WaitOn::SqSpace { qpn: q, wqebbs }, waited_ns })) if *wqebbs == n && *q == qpn && *waited_ns >= SHORT_NS);
    let dummy = |k: usize, len: u32| wqe::rdma_write(fx.raddr(k), Sge::new(fx.local.addr, len, fx.local.lkey).unwrap());
    let r = qp.post(true, dummy(spare, 64));
    assert!(is_room_timeout(r.as_ref().err(), 1), "post: {r:?}");
    let r = qp.post_bf(true, dummy(spare, 64));
    assert!(is_room_timeout(r.as_ref().err(), 1), "post_bf: {r:?}");
    let r = qp.post_write_inline(false, fx.raddr(spare), &[0x42; MAX_INLINE]);
    assert!(is_room_timeout(r.as_ref().err(), 4), "inline: {r:?}");
    let r = qp.post_batch(5, true, |_| dummy(spare, 8));
    assert!(is_room_timeout(r.as_ref().err(), 5), "batch: {r:?}");
    let r = qp.post_batch(2, false, |_| wqe::rdma_write_inline(fx.raddr(spare), &[1; 100]).unwrap());
    assert!(is_room_timeout(r.as_ref().err(), 8), "inline batch: {r:?}");
    let r = qp.put(&fx.remote, (spare * SLOT) as u64, &fx.local, 0, 32);
    assert!(is_room_timeout(r.as_ref().err(), 1), "put: {r:?}");
    // A flush needs a NOP when the last WQE asked for no CQE: that NOP finds no room. Otherwise it waits for
    // the last CQE asked for and times out naming it.
    let r = qp.flush();
    if m.sig_end != m.pi {
        assert!(is_room_timeout(r.as_ref().err(), 1), "flush: {r:?}");
    } else {
        let last_asked = *m.asked.last().unwrap();
        assert!(
            matches!(r, Err(Error::Timeout(Timeout { on: WaitOn::Cqe { qpn: q, wqe_index }, .. })) if wqe_index == last_asked && q == qpn),
            "flush: {r:?} (last asked {last_asked}, pi {})",
            m.pi
        );
    }
    let t = filled[0];
    let r = qp.wait(t);
    assert!(
        matches!(r, Err(Error::Timeout(Timeout { on: WaitOn::Cqe { qpn: q, wqe_index }, .. })) if wqe_index == t.0 && q == qpn),
        "wait: {r:?}"
    );
    assert_eq!(qp.progress(), Ok(()));
    assert!(qp.poll_cq().is_none());
    // Nothing moved: the handle is as it was before the timeouts (but for rung: the waits rang).
    let after = qp.handle();
    assert_eq!(
        (after.sq.pi, after.sq.ready, after.sq.ci, after.sq.sig_end, after.sq.sig_first, after.cq.cons_index),
        (before.sq.pi, before.sq.ready, before.sq.ci, before.sq.sig_end, before.sq.sig_first, cons0),
        "the timeouts changed the counters"
    );
    assert_eq!(after.sq.rung, m.pi, "a wait for room rings what is unrung");
    m.unrung = Unrung::No;
    m.check(&after, "after the timeouts");
    assert_eq!(fx.p.nic.stats().wqes, wqes0, "the NIC is held");
    // The NIC runs again: the same Qp posts, waiting for room as needed, and everything lands.
    fx.p.nic.hold_executor(false);
    fx.next = spare + 1;
    for _ in 0..100 {
        let sig = rng.random_bool(0.2);
        if rng.random_bool(0.5) {
            let w = fx.write(rng.random_range(1..=SLOT));
            assert_eq!(past_room_timeouts(|| qp.post(sig, w)).unwrap(), Ticket(m.exclusive(1, sig)));
        } else {
            let (w, nbb) = fx.inline(rng.random_range(1..=MAX_INLINE));
            assert_eq!(past_room_timeouts(|| qp.post_bf(sig, w)).unwrap(), Ticket(m.exclusive(nbb, sig)));
            m.unrung = Unrung::No;
        }
        m.check(&qp.handle(), "after the NIC resumed");
    }
    drop(qp);
    m.unrung = Unrung::No;
    m.check(&h, "dropped");
    let mut qp = dev_qp(&mut h, TIMEOUT_NS);
    let nop = m.sig_end != m.pi;
    qp.flush().unwrap();
    if nop {
        m.nop();
    }
    m.check(&qp.handle(), "flushed");
    drop(qp);
    // The spare slot (every timed-out post aimed there) is untouched.
    let slot = spare * SLOT..(spare + 1) * SLOT;
    assert_eq!(&fx.dst.copy_out()[slot.clone()], &pristine[slot], "the spare slot");
    fx.check_dst("end");
    fx.check_stats_clean("end");
}

/// A handle whose ring size device code cannot post to (not a power of two in 16 ..= 32768): every post, BlueFlame
/// post, inline post, batch (of any size but 0) and put is `InvalidArgument::Handle`, before and after slow paths
/// that poll the CQ; nothing is stored in or around the ring, no doorbell is rung, and the handle's counters
/// do not move.
#[test]
fn a_ring_of_an_invalid_size_refuses_every_post() {
    let sizes = [
        0u32,
        1,
        2,
        4,
        8,
        12,
        15,
        17,
        24,
        31,
        33,
        48,
        100,
        3 << 10,
        (1 << 15) + 1,
        1 << 16,
        1 << 20,
        1 << 31,
        u32::MAX,
    ];
    for cnt in sizes {
        let mut rng = rng();
        let mut fx = Fx::new(&mut rng, 64, 64, 64);
        let mut h = fx.p.a.handle();
        // History under the real size: 12 WQEs (fewer than the 16 WQEBBs the slow paths' CQ arithmetic then
        // uses), some asking for CQEs, left in the CQ.
        {
            let mut qp = dev_qp(&mut h, TIMEOUT_NS);
            for _ in 0..12 {
                let w = fx.write(16);
                let _ = qp.post(rng.random_bool(0.25), w).unwrap();
            }
        }
        wait_until("12 WQEs", || fx.p.nic.stats().wqes >= 12);
        let st0 = fx.p.nic.stats();
        let room = 64 * WQEBB * (2 + cnt.min(64) as usize);
        let fake = vec![0x5cu8; room];
        h.wqe_cnt = cnt;
        h.sq_buf = fake.as_ptr() as u64 + 64 * WQEBB as u64;
        let before = h.sq;
        let handle = || Err::<Ticket, Error>(Error::InvalidArgument(InvalidArgument::Handle));
        {
            let mut qp = dev_qp(&mut h, SHORT_NS);
            for pass in 0..3 {
                let w = fx.write(8);
                assert_eq!(qp.post(false, w), handle(), "cnt {cnt} pass {pass}: post");
                assert_eq!(qp.post(true, wqe::nop()), handle(), "cnt {cnt} pass {pass}: signaled post");
                assert_eq!(qp.post_bf(true, wqe::nop()), handle(), "cnt {cnt} pass {pass}: post_bf");
                assert_eq!(qp.post_write_inline(true, fx.raddr(0), &[7; 150]), handle(), "cnt {cnt}: inline");
                for n in [1u32, 2, 8, 9, 100, u32::MAX] {
                    assert_eq!(qp.post_batch(n, false, |_| wqe::nop()), handle(), "cnt {cnt} pass {pass}: batch {n}");
                    assert_eq!(
                        qp.post_batch(n, true, |_| wqe::rdma_write_inline(fx.raddr(0), &[1; 200]).unwrap()),
                        handle(),
                        "cnt {cnt}: inline batch {n}"
                    );
                }
                assert_eq!(
                    qp.post_batch(0, false, |_| wqe::nop()),
                    Err(Error::InvalidArgument(InvalidArgument::Batch))
                );
                assert_eq!(
                    qp.put(&fx.remote, 0, &fx.local, 0, 8),
                    Err(Error::InvalidArgument(InvalidArgument::Handle)),
                    "cnt {cnt}: put"
                );
                match pass {
                    0 => {
                        for _ in 0..40 {
                            match qp.poll_cq() {
                                None => break,
                                Some(Ok(_)) => {}
                                Some(Err(e)) => panic!("cnt {cnt}: poll_cq: {e}"),
                            }
                        }
                    }
                    1 => qp.progress().unwrap(),
                    _ => {}
                }
                let hs = qp.handle();
                assert_eq!(
                    (hs.sq.pi, hs.sq.ready, hs.sq.sig_end, hs.sq.sig_first),
                    (before.pi, before.ready, before.sig_end, before.sig_first),
                    "cnt {cnt} pass {pass}"
                );
            }
        }
        // SAFETY: `fake` is plain memory device code may have stored to: read it volatile.
        let changed = (0..room).filter(|&i| unsafe { fake.as_ptr().add(i).read_volatile() } != 0x5c).count();
        assert_eq!(changed, 0, "cnt {cnt}: bytes stored in or around the forged ring");
        assert_eq!(
            (h.sq.pi, h.sq.ready, h.sq.sig_end, h.sq.sig_first, h.sq.err_idx),
            (before.pi, before.ready, before.sig_end, before.sig_first, 0),
            "cnt {cnt}"
        );
        let st = fx.p.nic.stats();
        assert_eq!(
            (st.doorbells, st.wqes, st.error_cqes, st.bad_doorbells),
            (st0.doorbells, st0.wqes, 0, 0),
            "cnt {cnt}: {st:?}"
        );
        // A shared poster on the same handle refuses too.
        // SAFETY: the live pair's handle, this thread only.
        let sq = unsafe { SharedQp::<Block>::new(&mut h, SHORT_NS) };
        assert_eq!(sq.post(true, wqe::nop()), handle(), "cnt {cnt}: shared post");
        drop(fake);
        // Back to the real ring: the QP continues from where it stopped.
        h = QpHandle { sq: h.sq, cq: h.cq, ..fx.p.a.handle() };
        let mut qp = dev_qp(&mut h, TIMEOUT_NS);
        let w = fx.write(64);
        let t = qp.post(true, w).unwrap();
        assert_eq!(t.0, before.pi);
        qp.flush().unwrap();
        drop(qp);
        assert_eq!(h.sq.ci, h.sq.pi);
        // The slots written before the forged ring and the last one landed; those the refused posts
        // named never did (they were aimed at slots 0 and at slots taken but never posted).
        let got = fx.dst.copy_out();
        for k in 0..12 {
            assert_eq!(&got[k * SLOT..k * SLOT + 16], &fx.srcb[k * SLOT..k * SLOT + 16], "cnt {cnt}: slot {k}");
        }
        let last = fx.next - 1;
        assert_eq!(&got[last * SLOT..last * SLOT + 64], &fx.srcb[last * SLOT..last * SLOT + 64]);
        for k in 12..last {
            assert!(got[k * SLOT..(k + 1) * SLOT].iter().all(|&b| b == 0xee), "cnt {cnt}: refused slot {k} written");
        }
    }
}

/// An Exclusive `Qp` after a shared poster whose wait for room timed out (its reservation left unpublished):
/// the `Qp` posts over the reservation from `ready`, its slow paths keep that producer index (they reload it
/// from `ready`), and everything completes.
#[test]
fn a_qp_after_a_timed_out_shared_reservation_posts_over_it() {
    let mut rng = rng();
    let mut fx = Fx::new(&mut rng, 600, RING, 16);
    let mut h = Box::new(fx.p.a.handle());
    let mut m = Model::new(RING);
    fx.p.nic.hold_executor(true);
    let p: *mut QpHandle = &mut *h;
    for _ in 0..RING {
        let w = fx.write(rng.random_range(1..=SLOT));
        // SAFETY: the live pair's handle, this thread only while the poster lives.
        let t = unsafe { SharedQp::<Block>::new(p, SHORT_NS) }.post(false, w).unwrap();
        assert_eq!(t, Ticket(m.shared(1, false)));
    }
    let spare = fx.next;
    fx.next += 1;
    let w = wqe::rdma_write(fx.raddr(spare), Sge::new(fx.local.addr, 64, fx.local.lkey).unwrap());
    // SAFETY: as above.
    let r = unsafe { SharedQp::<Block>::new(p, SHORT_NS) }.post(true, w);
    assert!(
        matches!(r, Err(Error::Timeout(Timeout { on: WaitOn::SqSpace { qpn, wqebbs: 1 }, .. })) if qpn == h.qpn),
        "{r:?}"
    );
    assert_eq!((h.sq.pi, h.sq.ready), (m.pi + 1, m.pi), "the shared reservation is left unpublished");
    fx.p.nic.hold_executor(false);
    // The NIC runs the 16 published WQEs; a shared poller retires them, so that the `Qp`'s first posts find
    // room (fast path) and take their CQE countdown from the state as loaded (`ready`, not the reservation).
    // The NIC counts a CQE when it writes it or queues it behind the data it reports, so the count may lead
    // what is visible: poll until the last of the four CQEs retires the 16th WQE.
    wait_until("the shared poller to retire 16 WQEs", || {
        // SAFETY: as above.
        assert_eq!(unsafe { SharedQp::<Device>::new(p, SHORT_NS) }.progress(), Ok(true));
        // SAFETY: `p` points at the live handle; no poster lives here.
        let ci = unsafe { (*p).sq.ci };
        ci == m.pi
    });
    assert_eq!((h.sq.ci, h.sq.pi, h.sq.ready), (m.pi, m.pi + 1, m.pi), "retired by the shared poller");
    let mut qp = dev_qp(&mut h, TIMEOUT_NS);
    for i in 0..200 {
        // The first ones unsignaled: their CQE countdown is the loaded state's.
        let sig = i >= 4 && rng.random_bool(0.2);
        let w = fx.write(rng.random_range(1..=SLOT));
        assert_eq!(qp.post(sig, w).unwrap(), Ticket(m.exclusive(1, sig)));
        if rng.random_bool(0.1) {
            poll_ok(&mut qp);
        }
        m.check(&qp.handle(), "Exclusive after the timed-out reservation");
    }
    let nop = m.sig_end != m.pi;
    qp.flush().unwrap();
    if nop {
        m.nop();
    }
    drop(qp);
    m.unrung = Unrung::No;
    m.check(&h, "end");
    fx.check_dst("end");
    fx.check_stats_clean("end");
}

/// A slow path that rings (`progress`, `wait`, `flush`, `wait_semaphore`) leaves nothing unrung: the next
/// `post_bf` goes by BlueFlame (taken from the register). `poll_cq` rings nothing: a `post_bf` after it, with a
/// WQE still unrung, goes by doorbell for both. Checked against the NIC's counts, one case at a time.
#[test]
fn slow_paths_that_ring_leave_nothing_unrung_for_blueflame() {
    let mut rng = rng();
    let mut fx = Fx::new(&mut rng, 1000, RING, 16);
    let mut h = Box::new(fx.p.a.handle());
    let mut m = Model::new(RING);
    let mut qp = dev_qp(&mut h, TIMEOUT_NS);
    for round in 0..60 {
        let case = round % 5;
        // Some WQEs, the last left unrung (a random number of them waiting for room on the way).
        for _ in 0..rng.random_range(1..12) {
            let sig = rng.random_bool(0.2);
            let w = fx.write(rng.random_range(1..=SLOT));
            assert_eq!(qp.post(sig, w).unwrap(), Ticket(m.exclusive(1, sig)));
        }
        match case {
            0 => qp.progress().unwrap(),
            1 => {
                // A wait on the last WQE (asks for a NOP when it asked for no CQE itself).
                let t = m.pi - 1;
                let nop = m.sig_first <= t;
                qp.wait(Ticket(t)).unwrap();
                if nop {
                    m.nop();
                }
            }
            2 => {
                let nop = m.sig_end != m.pi;
                qp.flush().unwrap();
                if nop {
                    m.nop();
                }
            }
            3 => {
                // SAFETY: the semaphore word is 8-aligned registered memory that outlives the wait; 0 is
                // reached at once, but the call rings first.
                assert_eq!(unsafe { qp.wait_semaphore(fx.sem.addr() as *const u64, 0) }, Ok(0));
            }
            _ => {
                poll_ok(&mut qp);
            }
        }
        let rang = case != 4;
        m.unrung = if rang { Unrung::No } else { Unrung::Yes };
        m.check(&qp.handle(), &format!("round {round} case {case}"));
        // Let the NIC catch up with what was rung, so that the register is free for a whole BlueFlame write.
        let want = if rang { m.pi } else { fx.p.a.sq_consumed() };
        wait_until("the NIC to consume what was rung", || fx.p.a.sq_consumed() == want);
        std::thread::sleep(Duration::from_millis(1));
        let s0 = fx.p.nic.stats();
        let w = fx.write(rng.random_range(1..=SLOT));
        let t = qp.post_bf(true, w).unwrap();
        assert_eq!(t, Ticket(m.exclusive(1, true)));
        m.unrung = Unrung::No;
        qp.wait(t).unwrap();
        m.check(&qp.handle(), &format!("round {round} case {case} after post_bf"));
        let s1 = fx.p.nic.stats();
        assert_eq!(
            (s1.blueflame - s0.blueflame, s1.blueflame_fallbacks - s0.blueflame_fallbacks),
            (rang as u64, 0),
            "round {round} case {case}: BlueFlame after a slow path that {} rung",
            if rang { "has" } else { "has not" }
        );
    }
    drop(qp);
    fx.check_dst("end");
    fx.check_stats_clean("end");
}
