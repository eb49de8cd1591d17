//! Any bytes in the SQ ring and any doorbell or dbrec value: the emulated NIC never panics, never hangs,
//! never writes outside a registered region (nor into a region without the rights to), and completes each WQE
//! once at most, in order.
//!
//! Each case drives a fresh NIC with a random sequence of actions: WQEs that are partly well-formed (valid
//! opcodes, keys and addresses near the buffers, mostly right QPN and index) or wholly random, random bytes
//! scribbled over the ring, random or stale doorbells, random dbrec and CQ dbrec values, CQ polls. After every
//! doorbell the test waits until the NIC has acted on it (a hang fails the case).

mod emu_util;

use emu_util::*;
use gdaki::nic::emu::Access;
use gdaki_shared::prm::opcode;
use gdaki_shared::prm::wqe::{AtomicSeg, CtrlSeg, Seg, INLINE_SEG};
use gdaki_shared::Be32;
use proptest::prelude::*;

const WQE_CNT: u32 = 16;
const BUF: usize = 256;

/// Which buffer an address points into (offsets may run past either end).
#[derive(Clone, Copy, Debug)]
enum Addr {
    Local(i16),
    Remote(i16),
    ReadOnly(i16),
    Canary(i16),
    Raw(u64),
}

/// Which key a segment carries.
#[derive(Clone, Copy, Debug)]
enum Key {
    Local,
    Remote,
    ReadOnly,
    Raw(u32),
}

/// One 16-byte segment after the ctrl segment.
#[derive(Clone, Debug)]
enum Seg16 {
    Raddr(Addr, Key),
    Data(u32, Addr, Key),
    Inline(u16),
    Atomic(u64, u64),
    Raw([u8; 16]),
}

#[derive(Clone, Debug)]
struct GenWqe {
    opcode: u8,
    opmod: u8,
    qpn_ok: bool,
    idx_delta: u16,
    fm: u8,
    ds: u8,
    imm: u32,
    segs: Vec<Seg16>,
}

/// A well-formed WQE (in-range addresses, right keys, exact ds), optionally with one byte flipped.
#[derive(Clone, Debug)]
enum Shape {
    Nop,
    Write { len: u16, loff: u16, roff: u16, imm: Option<u32> },
    Inline { data: Vec<u8>, roff: u16, imm: Option<u32> },
    Read { len: u16, loff: u16, roff: u16 },
    Atomic { cs: bool, x: u64, y: u64, loff: u16, roff: u16 },
}

#[derive(Clone, Debug)]
struct Shaped {
    shape: Shape,
    signaled: bool,
    /// Target (or, for a READ, source) the MR that only allows REMOTE_READ instead of the one with all rights.
    to_ro: bool,
    /// XOR `mask` into byte `pos % len` of the WQE.
    flip: Option<(u16, u8)>,
}

#[derive(Clone, Debug)]
enum Doorbell {
    /// The ctrl bits of the last posted WQE (a correct doorbell).
    Last,
    /// A doorbell built from an index and ds of choice.
    Ctrl(u16, u8),
    Random(u64),
}

#[derive(Clone, Debug)]
enum Action {
    Post(GenWqe),
    /// Post a well-formed WQE; with `true`, also update the dbrec and ring its doorbell (the usual post).
    PostShaped(Shaped, bool),
    Ring(Doorbell),
    BlueFlame,
    Dbrec(Option<u32>),
    Scribble(u16, Vec<u8>),
    FillRing(Vec<u8>),
    PollCq,
    CqDbrec(u32),
}

fn addr() -> impl Strategy<Value = Addr> {
    let off = -80i16..(BUF as i16 + 80);
    prop_oneof![
        3 => off.clone().prop_map(Addr::Local),
        3 => off.clone().prop_map(Addr::Remote),
        1 => off.clone().prop_map(Addr::ReadOnly),
        1 => off.prop_map(Addr::Canary),
        1 => any::<u64>().prop_map(Addr::Raw),
    ]
}

fn key() -> impl Strategy<Value = Key> {
    prop_oneof![
        3 => Just(Key::Local),
        3 => Just(Key::Remote),
        1 => Just(Key::ReadOnly),
        1 => any::<u32>().prop_map(Key::Raw),
    ]
}

fn seg16() -> impl Strategy<Value = Seg16> {
    let len = prop_oneof![0u32..=(BUF as u32 + 64), Just(8u32), Just(0u32), any::<u32>()];
    prop_oneof![
        3 => (addr(), key()).prop_map(|(a, k)| Seg16::Raddr(a, k)),
        3 => (len, addr(), key()).prop_map(|(l, a, k)| Seg16::Data(l, a, k)),
        1 => prop_oneof![0u16..200, any::<u16>()].prop_map(Seg16::Inline),
        1 => (any::<u64>(), any::<u64>()).prop_map(|(a, b)| Seg16::Atomic(a, b)),
        1 => any::<[u8; 16]>().prop_map(Seg16::Raw),
    ]
}

fn gen_wqe() -> impl Strategy<Value = GenWqe> {
    let op = prop_oneof![
        2 => Just(opcode::RDMA_WRITE),
        1 => Just(opcode::RDMA_WRITE_IMM),
        2 => Just(opcode::RDMA_READ),
        1 => Just(opcode::ATOMIC_FA),
        1 => Just(opcode::ATOMIC_CS),
        1 => Just(opcode::NOP),
        1 => any::<u8>(),
    ];
    let opmod = prop_oneof![8 => Just(0u8), 1 => any::<u8>()];
    let idx_delta = prop_oneof![8 => Just(0u16), 1 => any::<u16>()];
    let fm = prop_oneof![Just(0u8), Just(0x08u8), any::<u8>()];
    let ds = prop_oneof![4 => 1u8..=8, 1 => any::<u8>()];
    (op, opmod, prop::bool::weighted(0.9), idx_delta, fm, ds, any::<u32>(), prop::collection::vec(seg16(), 0..8))
        .prop_map(|(opcode, opmod, qpn_ok, idx_delta, fm, ds, imm, segs)| GenWqe {
            opcode,
            opmod,
            qpn_ok,
            idx_delta,
            fm,
            ds,
            imm,
            segs,
        })
}

fn shaped() -> impl Strategy<Value = Shaped> {
    let len = 1u16..=BUF as u16;
    let off = any::<u16>();
    let imm = prop::option::of(any::<u32>());
    let shape = prop_oneof![
        1 => Just(Shape::Nop),
        3 => (len.clone(), off, off, imm.clone())
            .prop_map(|(len, loff, roff, imm)| Shape::Write { len, loff, roff, imm }),
        3 => (prop::collection::vec(any::<u8>(), 0..120), off, imm)
            .prop_map(|(data, roff, imm)| Shape::Inline { data, roff, imm }),
        2 => (len, off, off).prop_map(|(len, loff, roff)| Shape::Read { len, loff, roff }),
        2 => (any::<bool>(), any::<u64>(), any::<u64>(), off, off)
            .prop_map(|(cs, x, y, loff, roff)| Shape::Atomic { cs, x, y, loff, roff }),
    ];
    let flip = prop_oneof![9 => Just(None), 1 => (any::<u16>(), 1u8..=255).prop_map(Some)];
    (shape, any::<bool>(), prop::bool::weighted(0.2), flip).prop_map(|(shape, signaled, to_ro, flip)| Shaped {
        shape,
        signaled,
        to_ro,
        flip,
    })
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        8 => (shaped(), prop::bool::weighted(0.7)).prop_map(|(w, ring)| Action::PostShaped(w, ring)),
        2 => gen_wqe().prop_map(Action::Post),
        4 => prop_oneof![
            4 => Just(Doorbell::Last),
            1 => (any::<u16>(), any::<u8>()).prop_map(|(i, d)| Doorbell::Ctrl(i, d)),
            1 => any::<u64>().prop_map(Doorbell::Random),
        ]
        .prop_map(Action::Ring),
        1 => Just(Action::BlueFlame),
        2 => prop::option::weighted(0.8, any::<u32>()).prop_map(Action::Dbrec),
        1 => (any::<u16>(), prop::collection::vec(any::<u8>(), 1..64)).prop_map(|(o, b)| Action::Scribble(o, b)),
        1 => prop::collection::vec(any::<u8>(), WQE_CNT as usize * 64).prop_map(Action::FillRing),
        2 => Just(Action::PollCq),
        1 => any::<u32>().prop_map(Action::CqDbrec),
    ]
}

fn bytes(segs: &[Seg]) -> Vec<u8> {
    segs.iter().flat_map(|s| bytemuck::bytes_of(s).to_vec()).collect()
}

struct World {
    local: GuardedBuf,
    remote: GuardedBuf,
    ro: GuardedBuf,
    canary: GuardedBuf,
    keys: (u32, u32, u32),
}

impl World {
    fn addr(&self, a: Addr) -> u64 {
        let at = |b: &GuardedBuf, off: i16| b.addr().wrapping_add_signed(off as i64);
        match a {
            Addr::Local(o) => at(&self.local, o),
            Addr::Remote(o) => at(&self.remote, o),
            Addr::ReadOnly(o) => at(&self.ro, o),
            Addr::Canary(o) => at(&self.canary, o),
            Addr::Raw(v) => v,
        }
    }

    fn key(&self, k: Key) -> u32 {
        match k {
            Key::Local => self.keys.0,
            Key::Remote => self.keys.1,
            Key::ReadOnly => self.keys.2,
            Key::Raw(v) => v,
        }
    }

    /// The bytes of a well-formed WQE (then the flip, if any).
    fn shaped_bytes(&self, w: &Shaped, sq: &Sq) -> Vec<u8> {
        let fm = if w.signaled { SIGNALED } else { 0 };
        let fit = |off: u16, len: u16| (off as usize % (BUF - len as usize + 1)) as u64;
        let l = &self.local;
        let lk = self.keys.0;
        let (r, rk) = if w.to_ro { (&self.ro, self.keys.2) } else { (&self.remote, self.keys.1) };
        let mut b: Vec<u8> = match &w.shape {
            Shape::Nop => bytes(&sq.nop(fm)),
            Shape::Write { len, loff, roff, imm } => {
                let mut s =
                    sq.write(fm, (lk, l.addr() + fit(*loff, *len), *len as u32), r.addr() + fit(*roff, *len), rk);
                if let Some(i) = imm {
                    s[0] = sq.ctrl(opcode::RDMA_WRITE_IMM, fm, 3, *i);
                }
                bytes(&s)
            }
            Shape::Inline { data, roff, imm } => {
                let opc = if imm.is_some() { opcode::RDMA_WRITE_IMM } else { opcode::RDMA_WRITE };
                let len = data.len().max(1) as u16;
                sq.inline_write(opc, fm, data, r.addr() + fit(*roff, len), rk, imm.unwrap_or(0))
            }
            Shape::Read { len, loff, roff } => {
                bytes(&sq.read(fm, (lk, l.addr() + fit(*loff, *len), *len as u32), r.addr() + fit(*roff, *len), rk))
            }
            Shape::Atomic { cs, x, y, loff, roff } => {
                let (opc, a) = if *cs {
                    (opcode::ATOMIC_CS, AtomicSeg::compare_swap(*x, *y))
                } else {
                    (opcode::ATOMIC_FA, AtomicSeg::fetch_add(*x))
                };
                bytes(&sq.atomic(opc, fm, a, (lk, l.addr() + fit(*loff, 8)), r.addr() + (fit(*roff, 8) & !7), rk))
            }
        };
        if let Some((pos, mask)) = w.flip {
            let n = b.len();
            b[pos as usize % n] ^= mask;
        }
        b
    }

    /// The WQE's bytes: `max(ds, 1)` segments (ds is taken modulo 64, as the 6-bit field holds it).
    fn bytes(&self, w: &GenWqe, sq: &Sq) -> Vec<u8> {
        let qpn = if w.qpn_ok { sq.qpn() } else { sq.qpn() ^ 0x5 };
        let idx = sq.idx().wrapping_add(w.idx_delta);
        let ctrl = CtrlSeg::new(idx, w.opcode, w.opmod, qpn, w.fm, w.ds, 0, Be32::new(w.imm));
        let nseg = (w.ds as usize & 0x3f).max(1);
        let mut out = bytemuck::bytes_of(&ctrl).to_vec();
        for s in w.segs.iter().take(nseg - 1) {
            let mut b = [0u8; 16];
            match *s {
                Seg16::Raddr(a, k) => {
                    b[..8].copy_from_slice(&self.addr(a).to_be_bytes());
                    b[8..12].copy_from_slice(&self.key(k).to_be_bytes());
                }
                Seg16::Data(len, a, k) => {
                    b[..4].copy_from_slice(&len.to_be_bytes());
                    b[4..8].copy_from_slice(&self.key(k).to_be_bytes());
                    b[8..].copy_from_slice(&self.addr(a).to_be_bytes());
                }
                Seg16::Inline(len) => b[..4].copy_from_slice(&(len as u32 | INLINE_SEG).to_be_bytes()),
                Seg16::Atomic(x, y) => {
                    b[..8].copy_from_slice(&x.to_be_bytes());
                    b[8..].copy_from_slice(&y.to_be_bytes());
                }
                Seg16::Raw(r) => b = r,
            }
            out.extend_from_slice(&b);
        }
        out.resize(nseg * 16, 0xa7);
        out
    }
}

fn run_case(actions: &[Action]) -> Result<(), TestCaseError> {
    let p = Pair::new(WQE_CNT, 16);
    let world = World {
        local: GuardedBuf::new(BUF, 0x11),
        remote: GuardedBuf::new(BUF, 0x22),
        ro: GuardedBuf::new(BUF, 0x33),
        canary: GuardedBuf::new(BUF, 0x44),
        keys: (0, 0, 0),
    };
    let lmr = world.local.register(&p.nic, &p.pd, Access::LOCAL_WRITE);
    let rmr = world.remote.register(&p.nic, &p.pd, Access::ALL);
    let romr = world.ro.register(&p.nic, &p.pd, Access::REMOTE_READ);
    let world = World { keys: (lmr.lkey(), rmr.rkey(), romr.rkey()), ..world };
    let mut sq = Sq::new(&p.a);
    let mut cq = CqPoll::new(&p.cq_a);
    let mut peer_cq = CqPoll::new(&p.cq_b);
    // The send CQEs read, in order; checked only when the CQ's dbrec was left to the poller (a random consumer
    // index lets the NIC write over CQEs not read yet, as hardware would).
    let mut sent = Vec::new();
    let mut cq_dbrec_kept = true;
    let mut last_at = 0u64;
    let mut db_value = 0u64; // connect cleared the register
    let mut doorbells = 0u64;
    let mut ring = |bits: u64, sq: &Sq| {
        sq.doorbell_bits(bits);
        if bits != db_value {
            db_value = bits;
            doorbells += 1;
            let want = doorbells;
            wait_until("the NIC to see the doorbell", || p.nic.stats().doorbells >= want);
            // Taking the SQ progress lock waits until the NIC has finished with this doorbell.
            let _ = p.a.sq_consumed();
        }
    };
    for a in actions {
        match a {
            Action::Post(w) => {
                let bytes = world.bytes(w, &sq);
                last_at = sq.put_bytes(&bytes);
            }
            Action::PostShaped(w, ring_it) => {
                let bytes = world.shaped_bytes(w, &sq);
                last_at = sq.put_bytes(&bytes);
                if *ring_it {
                    sq.dbrec();
                    ring(sq.ctrl_bits(last_at), &sq);
                }
            }
            Action::Ring(Doorbell::Last) => ring(sq.ctrl_bits(last_at), &sq),
            Action::Ring(Doorbell::Ctrl(idx, ds)) => {
                ring(CtrlSeg::new(*idx, opcode::RDMA_WRITE, 0, sq.qpn(), 0, *ds, 0, Be32::ZERO).doorbell_bits(), &sq)
            }
            Action::Ring(Doorbell::Random(v)) => ring(*v, &sq),
            Action::BlueFlame => {
                sq.blueflame(last_at);
                ring(sq.ctrl_bits(last_at), &sq);
            }
            Action::Dbrec(None) => sq.dbrec(),
            Action::Dbrec(Some(v)) => sq.dbrec_word(1, *v),
            Action::Scribble(off, bytes) => {
                // Whole 8-byte words only (the ring is written with word stores).
                let mut b = bytes.clone();
                b.resize(b.len().div_ceil(16) * 16, 0);
                let saved = sq.pi;
                sq.pi = (*off as u64 % WQE_CNT as u64) + saved / WQE_CNT as u64 * WQE_CNT as u64;
                sq.put_bytes(&b);
                sq.pi = saved;
            }
            Action::FillRing(bytes) => {
                let saved = sq.pi;
                sq.pi = 0;
                sq.put_bytes(bytes);
                sq.pi = saved;
            }
            Action::PollCq => {
                while let Some(c) = cq.poll() {
                    sent.push(c.wqe_counter.get());
                }
                while peer_cq.poll().is_some() {}
            }
            Action::CqDbrec(v) => {
                cq_dbrec_kept = false;
                // SAFETY: word 0 of the CQ dbrec.
                unsafe { std::sync::atomic::AtomicU32::from_ptr(cq.h.dbrec as *mut u32) }
                    .store(Be32::new(*v).to_bits(), std::sync::atomic::Ordering::Release);
            }
        }
    }
    prop_assert!(p.nic.executor_alive(), "executor thread died");
    while let Some(c) = cq.poll() {
        sent.push(c.wqe_counter.get());
    }
    // Fewer than 2^16 WQEBBs are consumed in a case: the counters of WQEs completed in order only ascend.
    prop_assert!(
        !cq_dbrec_kept || sent.windows(2).all(|w| w[0] < w[1]),
        "a WQE completed twice or out of order: wqe_counter {sent:?}"
    );
    for (name, b) in [("local", &world.local), ("remote", &world.remote), ("ro", &world.ro), ("canary", &world.canary)]
    {
        prop_assert!(b.guards_intact(), "guard bytes of {name} written");
    }
    prop_assert!(world.ro.read().iter().all(|&b| b == 0x33), "MR without write rights was written");
    prop_assert!(world.canary.read().iter().all(|&b| b == 0x44), "unregistered memory was written");
    drop((lmr, rmr, romr));
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 192, max_shrink_iters: 200, ..ProptestConfig::default() })]

    #[test]
    fn random_rings_and_doorbells_never_panic_hang_or_stray(actions in prop::collection::vec(action(), 1..24)) {
        run_case(&actions)?;
    }
}

#[test]
fn fully_random_ring_and_random_doorbells() {
    // The plainest form of the property: the whole ring random, then random doorbells, many times over.
    let mut rng = rng();
    use rand::RngExt;
    for _ in 0..50 {
        let mut actions = vec![Action::FillRing(random_bytes(&mut rng, WQE_CNT as usize * 64))];
        for _ in 0..8 {
            actions.push(Action::Ring(Doorbell::Random(rng.random())));
            actions.push(Action::Dbrec(Some(rng.random())));
        }
        run_case(&actions).unwrap();
    }
}
