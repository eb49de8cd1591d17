//! Random WQEs for the emulated NIC's property tests (`emu_fuzz`, `emu_fuzz_wire`): WQEs that are partly
//! well-formed (valid opcodes, keys and addresses near the buffers, mostly right QPN and index) or wholly random,
//! and well-formed ones with an optional flipped byte, written against four buffers ([`World`]).

use super::{GuardedBuf, Sq, SIGNALED};
use gdaki_shared::prm::opcode;
use gdaki_shared::prm::wqe::{AtomicSeg, CtrlSeg, Seg, INLINE_SEG};
use gdaki_shared::Be32;
use proptest::prelude::*;

/// Bytes in each buffer of a [`World`].
pub const BUF: usize = 256;

/// Which buffer an address points into (offsets may run past either end).
#[derive(Clone, Copy, Debug)]
pub enum Addr {
    Local(i16),
    Remote(i16),
    ReadOnly(i16),
    Canary(i16),
    Raw(u64),
}

/// Which key a segment carries.
#[derive(Clone, Copy, Debug)]
pub enum Key {
    Local,
    Remote,
    ReadOnly,
    Raw(u32),
}

/// One 16-byte segment after the ctrl segment.
#[derive(Clone, Debug)]
pub enum Seg16 {
    Raddr(Addr, Key),
    Data(u32, Addr, Key),
    Inline(u16),
    Atomic(u64, u64),
    Raw([u8; 16]),
}

#[derive(Clone, Debug)]
pub struct GenWqe {
    pub opcode: u8,
    pub opmod: u8,
    pub qpn_ok: bool,
    pub idx_delta: u16,
    pub fm: u8,
    pub ds: u8,
    pub imm: u32,
    pub segs: Vec<Seg16>,
}

/// A well-formed WQE (in-range addresses, right keys, exact ds), optionally with one byte flipped.
#[derive(Clone, Debug)]
pub enum Shape {
    Nop,
    Write { len: u16, loff: u16, roff: u16, imm: Option<u32> },
    Inline { data: Vec<u8>, roff: u16, imm: Option<u32> },
    Read { len: u16, loff: u16, roff: u16 },
    Atomic { cs: bool, x: u64, y: u64, loff: u16, roff: u16 },
}

#[derive(Clone, Debug)]
pub struct Shaped {
    pub shape: Shape,
    pub signaled: bool,
    /// Target (or, for a READ, source) the MR that only allows REMOTE_READ instead of the one with all rights.
    pub to_ro: bool,
    /// XOR `mask` into byte `pos % len` of the WQE.
    pub flip: Option<(u16, u8)>,
}

pub fn addr() -> impl Strategy<Value = Addr> {
    let off = -80i16..(BUF as i16 + 80);
    prop_oneof![
        3 => off.clone().prop_map(Addr::Local),
        3 => off.clone().prop_map(Addr::Remote),
        1 => off.clone().prop_map(Addr::ReadOnly),
        1 => off.prop_map(Addr::Canary),
        1 => any::<u64>().prop_map(Addr::Raw),
    ]
}

pub fn key() -> impl Strategy<Value = Key> {
    prop_oneof![
        3 => Just(Key::Local),
        3 => Just(Key::Remote),
        1 => Just(Key::ReadOnly),
        1 => any::<u32>().prop_map(Key::Raw),
    ]
}

pub fn seg16() -> impl Strategy<Value = Seg16> {
    let len = prop_oneof![0u32..=(BUF as u32 + 64), Just(8u32), Just(0u32), any::<u32>()];
    prop_oneof![
        3 => (addr(), key()).prop_map(|(a, k)| Seg16::Raddr(a, k)),
        3 => (len, addr(), key()).prop_map(|(l, a, k)| Seg16::Data(l, a, k)),
        1 => prop_oneof![0u16..200, any::<u16>()].prop_map(Seg16::Inline),
        1 => (any::<u64>(), any::<u64>()).prop_map(|(a, b)| Seg16::Atomic(a, b)),
        1 => any::<[u8; 16]>().prop_map(Seg16::Raw),
    ]
}

pub fn gen_wqe() -> impl Strategy<Value = GenWqe> {
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

pub fn shaped() -> impl Strategy<Value = Shaped> {
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

pub fn bytes(segs: &[Seg]) -> Vec<u8> {
    segs.iter().flat_map(|s| bytemuck::bytes_of(s).to_vec()).collect()
}

pub struct World {
    pub local: GuardedBuf,
    pub remote: GuardedBuf,
    pub ro: GuardedBuf,
    pub canary: GuardedBuf,
    pub keys: (u32, u32, u32),
}

impl World {
    /// The four buffers of `BUF` bytes, each filled with its own byte (0x11, 0x22, 0x33, 0x44), and no keys yet:
    /// the caller registers them where its case needs them and sets `keys`.
    pub fn buffers() -> World {
        World {
            local: GuardedBuf::new(BUF, 0x11),
            remote: GuardedBuf::new(BUF, 0x22),
            ro: GuardedBuf::new(BUF, 0x33),
            canary: GuardedBuf::new(BUF, 0x44),
            keys: (0, 0, 0),
        }
    }

    pub fn addr(&self, a: Addr) -> u64 {
        let at = |b: &GuardedBuf, off: i16| b.addr().wrapping_add_signed(off as i64);
        match a {
            Addr::Local(o) => at(&self.local, o),
            Addr::Remote(o) => at(&self.remote, o),
            Addr::ReadOnly(o) => at(&self.ro, o),
            Addr::Canary(o) => at(&self.canary, o),
            Addr::Raw(v) => v,
        }
    }

    pub fn key(&self, k: Key) -> u32 {
        match k {
            Key::Local => self.keys.0,
            Key::Remote => self.keys.1,
            Key::ReadOnly => self.keys.2,
            Key::Raw(v) => v,
        }
    }

    /// The bytes of a well-formed WQE (then the flip, if any).
    pub fn shaped_bytes(&self, w: &Shaped, sq: &Sq) -> Vec<u8> {
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
    pub fn bytes(&self, w: &GenWqe, sq: &Sq) -> Vec<u8> {
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
