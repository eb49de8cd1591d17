//! Helpers for the emulated-NIC tests: drive the NIC as device code would (WQE bytes into the SQ ring through
//! the `QpHandle` addresses, dbrec word 1, 8-byte doorbell; poll the CQ ring and update the CQ dbrec), host
//! buffers with guard bytes on both sides, two QPs connected on one NIC ([`Pair`]) or across the wire
//! ([`WirePair`]), and the random WQEs of the property tests ([`fuzz`]).
#![allow(dead_code)] // each test file uses a different subset

pub mod fuzz;

use std::mem::offset_of;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gdaki::mem::{MemKind, MemLoc};
use gdaki::nic::emu::{Access, Cq, EmuConfig, EmuNic, Endpoint, Mr, Pd, Qp, WireConfig};
use gdaki_shared::handle::{CqHandle, QpHandle};
use gdaki_shared::prm::cqe::{is_sw_owned, Cqe64, ErrCqe};
use gdaki_shared::prm::dbrec::{CqDbrec, QpDbrec};
use gdaki_shared::prm::opcode;
use gdaki_shared::prm::wqe::{
    ds as wqe_ds, fm_ce_se::CQ_UPDATE, wqebbs, AtomicSeg, CtrlSeg, DataSeg, InlineSeg, RaddrSeg, Seg, SEG, WQEBB,
};
use gdaki_shared::Be32;
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};

/// How long a test waits for a CQE before failing.
pub const CQE_TIMEOUT: Duration = Duration::from_secs(10);

/// A seeded RNG; the seed is printed so that a failure can be replayed with `GDAKI_TEST_SEED`.
pub fn rng() -> SmallRng {
    let seed = std::env::var("GDAKI_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1)
    });
    eprintln!("GDAKI_TEST_SEED={seed}");
    SmallRng::seed_from_u64(seed)
}

/// Random bytes.
pub fn random_bytes(rng: &mut SmallRng, n: usize) -> Vec<u8> {
    (0..n).map(|_| rng.random::<u8>()).collect()
}

/// Guard bytes on each side of a [`GuardedBuf`].
pub const GUARD: usize = 64;

fn guard_byte(i: usize) -> u8 {
    (i as u8).wrapping_mul(7).wrapping_add(0x3d)
}

/// A host buffer of `len` bytes (8-byte aligned) between two [`GUARD`]-byte guards. Only the middle is
/// registered; [`GuardedBuf::guards_intact`] checks that nothing wrote the guards. Accessed through raw
/// pointers only, since the NIC writes it from its thread.
pub struct GuardedBuf {
    base: *mut u64,
    words: usize,
    len: usize,
}

// SAFETY: the buffer is plain memory owned by this value; tests access it only when the NIC is quiescent.
unsafe impl Send for GuardedBuf {}
// SAFETY: as above.
unsafe impl Sync for GuardedBuf {}

impl GuardedBuf {
    /// A buffer of `len` bytes, filled with `fill`.
    pub fn new(len: usize, fill: u8) -> Self {
        let words = (len + 2 * GUARD).div_ceil(8);
        let b: Box<[u64]> = vec![0u64; words].into_boxed_slice();
        let base = Box::into_raw(b) as *mut u64;
        let s = Self { base, words, len };
        for i in 0..GUARD {
            s.put_raw(i, guard_byte(i));
            s.put_raw(GUARD + len + i, guard_byte(GUARD + len + i));
        }
        // The allocation is zeroed already.
        if fill != 0 {
            s.fill(fill);
        }
        s
    }

    /// Copies `data` into the middle from offset 0 in one go (not byte by byte): only while the NIC touches
    /// none of it.
    pub fn copy_in(&self, data: &[u8]) {
        assert!(data.len() <= self.len);
        // SAFETY: the middle holds `len >= data.len()` bytes; nothing else accesses them meanwhile (callers'
        // contract).
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.addr() as *mut u8, data.len()) }
    }

    /// The middle's bytes, copied in one go: only while the NIC touches none of them.
    pub fn copy_out(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.len];
        // SAFETY: as in `copy_in`.
        unsafe { std::ptr::copy_nonoverlapping(self.addr() as *const u8, v.as_mut_ptr(), self.len) }
        v
    }

    fn put_raw(&self, i: usize, v: u8) {
        assert!(i < self.words * 8);
        // SAFETY: in bounds of the allocation (checked above); byte writes need no alignment.
        unsafe { (self.base as *mut u8).add(i).write_volatile(v) }
    }

    fn get_raw(&self, i: usize) -> u8 {
        assert!(i < self.words * 8);
        // SAFETY: in bounds of the allocation (checked above).
        unsafe { (self.base as *mut u8).add(i).read_volatile() }
    }

    /// Address of byte 0 of the registered middle.
    pub fn addr(&self) -> u64 {
        self.base as u64 + GUARD as u64
    }

    /// Length of the middle.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Sets every middle byte to `v`.
    pub fn fill(&self, v: u8) {
        for i in 0..self.len {
            self.put_raw(GUARD + i, v);
        }
    }

    /// Writes `data` at middle offset `off`.
    pub fn write(&self, off: usize, data: &[u8]) {
        assert!(off + data.len() <= self.len);
        for (i, b) in data.iter().enumerate() {
            self.put_raw(GUARD + off + i, *b);
        }
    }

    /// The middle's bytes.
    pub fn read(&self) -> Vec<u8> {
        (0..self.len).map(|i| self.get_raw(GUARD + i)).collect()
    }

    /// The 8 bytes at middle offset `off` as a host-order u64.
    pub fn u64_at(&self, off: usize) -> u64 {
        let mut b = [0u8; 8];
        for (i, x) in b.iter_mut().enumerate() {
            *x = self.get_raw(GUARD + off + i);
        }
        u64::from_ne_bytes(b)
    }

    /// The 8-byte word at middle offset `off` (8-aligned), loaded atomically with Acquire: for words the NIC
    /// may be writing right now (semaphores).
    pub fn load_u64(&self, off: usize) -> u64 {
        assert!(off.is_multiple_of(8) && off + 8 <= self.len);
        // SAFETY: 8-aligned (the middle starts 64 bytes into an 8-aligned allocation) and in bounds.
        unsafe { AtomicU64::from_ptr((self.addr() + off as u64) as *mut u64) }.load(Ordering::Acquire)
    }

    /// Whether both guards still hold their pattern.
    pub fn guards_intact(&self) -> bool {
        (0..GUARD).all(|i| self.get_raw(i) == guard_byte(i))
            && (0..GUARD).all(|i| self.get_raw(GUARD + self.len + i) == guard_byte(GUARD + self.len + i))
    }

    /// Registers the middle with `nic`.
    pub fn register(&self, nic: &Arc<EmuNic>, pd: &Pd, access: Access) -> Mr {
        self.register_as(MemKind::Host, nic, pd, access)
    }

    /// Registers the middle with `nic` as memory of `kind` (`Gpu`: reached through the NIC's copier, which
    /// in tests is a host-memory stand-in).
    pub fn register_as(&self, kind: MemKind, nic: &Arc<EmuNic>, pd: &Pd, access: Access) -> Mr {
        let loc = MemLoc { kind, addr: self.addr() };
        // SAFETY: the tests drop every Mr before the GuardedBuf it names (declared after it).
        unsafe { nic.reg_mr(pd, loc, self.len as u64, access) }.expect("reg_mr")
    }
}

impl Drop for GuardedBuf {
    fn drop(&mut self) {
        // SAFETY: `base` came from `Box::into_raw` of a `[u64]` of `words` elements and is freed once.
        unsafe { drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.base, self.words))) }
    }
}

/// Device code's side of one SQ, on a host thread: writes WQEs into the ring with wrap, then dbrec and
/// doorbell, with the PRM's order (WQE stores → fence → dbrec → fence → doorbell).
pub struct Sq {
    pub h: QpHandle,
    /// Producer index, WQEBBs, 64-bit.
    pub pi: u64,
}

impl Sq {
    pub fn new(qp: &Qp) -> Self {
        Self { h: qp.handle(), pi: 0 }
    }

    pub fn qpn(&self) -> u32 {
        self.h.qpn
    }

    /// The 16-bit index the next WQE carries.
    pub fn idx(&self) -> u16 {
        self.pi as u16
    }

    /// Writes `wqe` (a multiple of 16 bytes) at the producer index, wrapping at the ring's end, and advances
    /// the producer index by its WQEBBs. Returns the 64-bit index the WQE starts at.
    pub fn put_bytes(&mut self, wqe: &[u8]) -> u64 {
        assert!(wqe.len().is_multiple_of(SEG) && !wqe.is_empty());
        let ring = self.h.wqe_cnt as usize * WQEBB;
        let start = (self.pi as usize % self.h.wqe_cnt as usize) * WQEBB;
        for (i, w) in wqe.chunks(8).enumerate() {
            let off = (start + i * 8) % ring;
            let mut b = [0u8; 8];
            b.copy_from_slice(w);
            // SAFETY: `off` is inside the SQ ring (taken modulo its size) and 8-aligned.
            unsafe { AtomicU64::from_ptr((self.h.sq_buf + off as u64) as *mut u64) }
                .store(u64::from_ne_bytes(b), Ordering::Relaxed);
        }
        let at = self.pi;
        self.pi += wqebbs((wqe.len() / SEG) as u32) as u64;
        at
    }

    /// Writes the WQE made of `segs`; see [`Sq::put_bytes`].
    pub fn put(&mut self, segs: &[Seg]) -> u64 {
        let bytes: Vec<u8> = segs.iter().flat_map(|s| bytemuck::bytes_of(s).to_vec()).collect();
        self.put_bytes(&bytes)
    }

    /// Writes dbrec word 1 = `pi & 0xffff` (big-endian), after a release fence.
    pub fn dbrec(&self) {
        self.dbrec_word(1, self.pi as u32 & 0xffff);
    }

    /// Writes `v` (big-endian) to dbrec word `word` (0 = RQ counter: the known mistake; else the SQ counter).
    pub fn dbrec_word(&self, word: u64, v: u32) {
        let off = match word {
            0 => offset_of!(QpDbrec, rcv_counter),
            _ => offset_of!(QpDbrec, snd_counter),
        };
        fence(Ordering::Release);
        // SAFETY: the dbrec is 8 bytes, 8-aligned; both words are inside it.
        unsafe { AtomicU32::from_ptr((self.h.dbrec + off as u64) as *mut u32) }
            .store(Be32::new(v).to_bits(), Ordering::Release);
    }

    /// Writes the 8-byte doorbell: the first 8 bytes of the ctrl segment of the WQE starting at `at`.
    pub fn doorbell(&self, at: u64) {
        let bits = self.ctrl_bits(at);
        fence(Ordering::Release);
        // SAFETY: the BlueFlame register is 64 bytes inside the UAR page, 64-aligned.
        unsafe { AtomicU64::from_ptr(self.h.bf_reg as *mut u64) }.store(bits, Ordering::Release);
    }

    /// Writes `bits` to the doorbell register (for tests that need a doorbell other than the ring's).
    pub fn doorbell_bits(&self, bits: u64) {
        fence(Ordering::Release);
        // SAFETY: the BlueFlame register is 64 bytes inside the UAR page, 64-aligned.
        unsafe { AtomicU64::from_ptr(self.h.bf_reg as *mut u64) }.store(bits, Ordering::Release);
    }

    /// Rings the doorbell in the producer-index form (NVSHMEM IBGDA's, which gdaki's posters use): `wqe_index`
    /// = `pi` (16 bits) and `ds` 0.
    pub fn doorbell_pi(&self, pi: u64) {
        self.doorbell_bits(CtrlSeg::producer_doorbell(pi as u16, self.qpn()));
    }

    /// The first 8 bytes of the ring at WQE index `at`, as stored.
    pub fn ctrl_bits(&self, at: u64) -> u64 {
        self.ring_word(at, 0)
    }

    fn ring_word(&self, at: u64, word: usize) -> u64 {
        let off = (at as usize % self.h.wqe_cnt as usize) * WQEBB + word * 8;
        // SAFETY: inside the SQ ring, 8-aligned.
        unsafe { AtomicU64::from_ptr((self.h.sq_buf + off as u64) as *mut u64) }.load(Ordering::Relaxed)
    }

    /// BlueFlame: writes the WQE's first WQEBB (from the ring, where it was put) to the register as device code
    /// does (`gdaki_device::db::ring_bf`): word 1 first, tagged with the WQE index
    /// ([`blueflame_word1`](gdaki_shared::prm::uar::blueflame_word1)), then words 2..8, and word 0 (the
    /// doorbell) last.
    pub fn blueflame(&self, at: u64) {
        let mut words = self.ring_words(at);
        words[1] = gdaki_shared::prm::uar::blueflame_word1(words[0], words[1]);
        self.blueflame_words(&words, (1..8).chain([0]));
    }

    /// Stores `words` to the BlueFlame register in the order `order` gives (word indices), after a release
    /// fence: for tests of writes that are not whole.
    pub fn blueflame_words(&self, words: &[u64; 8], order: impl IntoIterator<Item = usize>) {
        fence(Ordering::Release);
        for w in order {
            // SAFETY: the BlueFlame register is 64 bytes inside the UAR page, 64-aligned.
            unsafe { AtomicU64::from_ptr((self.h.bf_reg + 8 * w as u64) as *mut u64) }
                .store(words[w], Ordering::Release);
        }
    }

    /// The WQE's first WQEBB as the ring holds it, as eight words.
    pub fn ring_words(&self, at: u64) -> [u64; 8] {
        std::array::from_fn(|w| self.ring_word(at, w))
    }

    /// Puts `segs`, then dbrec and doorbell. Returns the WQE's 64-bit index.
    pub fn post(&mut self, segs: &[Seg]) -> u64 {
        let at = self.put(segs);
        self.dbrec();
        self.doorbell(at);
        at
    }

    /// Puts raw WQE bytes, then dbrec and doorbell.
    pub fn post_bytes(&mut self, wqe: &[u8]) -> u64 {
        let at = self.put_bytes(wqe);
        self.dbrec();
        self.doorbell(at);
        at
    }

    pub fn ctrl(&self, opcode: u8, fm: u8, ds: u8, imm: u32) -> Seg {
        CtrlSeg::new(self.idx(), opcode, 0, self.qpn(), fm, ds, 0, Be32::new(imm)).into()
    }

    /// RDMA WRITE of one SGE.
    pub fn write(&self, fm: u8, local: (u32, u64, u32), raddr: u64, rkey: u32) -> [Seg; 3] {
        [
            self.ctrl(opcode::RDMA_WRITE, fm, 3, 0),
            RaddrSeg::new(raddr, Be32::new(rkey)).into(),
            DataSeg::new(local.2, Be32::new(local.0), local.1).into(),
        ]
    }

    /// RDMA READ into one SGE.
    pub fn read(&self, fm: u8, local: (u32, u64, u32), raddr: u64, rkey: u32) -> [Seg; 3] {
        let mut s = self.write(fm, local, raddr, rkey);
        s[0] = self.ctrl(opcode::RDMA_READ, fm, 3, 0);
        s
    }

    /// An atomic (`ATOMIC_FA` or `ATOMIC_CS`) with its 8-byte result SGE.
    pub fn atomic(&self, opc: u8, fm: u8, a: AtomicSeg, result: (u32, u64), raddr: u64, rkey: u32) -> [Seg; 4] {
        [
            self.ctrl(opc, fm, 4, 0),
            RaddrSeg::new(raddr, Be32::new(rkey)).into(),
            a.into(),
            DataSeg::new(8, Be32::new(result.0), result.1).into(),
        ]
    }

    /// NOP.
    pub fn nop(&self, fm: u8) -> [Seg; 1] {
        [self.ctrl(opcode::NOP, fm, 1, 0)]
    }

    /// The bytes of an inline RDMA WRITE (or WRITE_IMM) of `data`.
    pub fn inline_write(&self, opc: u8, fm: u8, data: &[u8], raddr: u64, rkey: u32, imm: u32) -> Vec<u8> {
        let ds = wqe_ds::rdma_write_inline(data.len() as u32) as u8;
        let mut w: Vec<u8> = Vec::new();
        w.extend_from_slice(bytemuck::bytes_of(&Seg::from(CtrlSeg::new(
            self.idx(),
            opc,
            0,
            self.qpn(),
            fm,
            ds,
            0,
            Be32::new(imm),
        ))));
        w.extend_from_slice(bytemuck::bytes_of(&Seg::from(RaddrSeg::new(raddr, Be32::new(rkey)))));
        w.extend_from_slice(bytemuck::bytes_of(&InlineSeg::new(data.len() as u32)));
        w.extend_from_slice(data);
        w.resize(ds as usize * SEG, 0);
        w
    }
}

/// Device code's side of one CQ: polls the ring (owner bit per lap) and updates the CQ dbrec.
pub struct CqPoll {
    pub h: CqHandle,
    /// Consumer index, CQEs, 64-bit.
    pub ci: u64,
}

impl CqPoll {
    pub fn new(cq: &Cq) -> Self {
        Self { h: cq.handle(), ci: 0 }
    }

    /// Whether the NIC has written CQE `idx` (counted from the CQ's start, less than `ci + ncqe`), without
    /// consuming anything: the NIC's CQE count may lead what is written when CQEs go through its copier.
    pub fn written(&self, idx: u64) -> bool {
        let base = self.h.buf + (idx % self.h.ncqe as u64) * 64;
        // SAFETY: the op_own byte of an entry inside the CQ ring.
        let op_own =
            unsafe { AtomicU8::from_ptr((base + offset_of!(Cqe64, op_own) as u64) as *mut u8) }.load(Ordering::Acquire);
        is_sw_owned(op_own, idx, self.h.ncqe)
    }

    /// The next CQE if the NIC has written it; consumes it and updates the dbrec.
    pub fn poll(&mut self) -> Option<Cqe64> {
        if !self.written(self.ci) {
            return None;
        }
        let base = self.h.buf + (self.ci % self.h.ncqe as u64) * 64;
        let mut words = [0u64; 8];
        for (i, w) in words.iter_mut().enumerate() {
            // SAFETY: an 8-aligned word inside the entry.
            *w = unsafe { AtomicU64::from_ptr((base + 8 * i as u64) as *mut u64) }.load(Ordering::Acquire);
        }
        self.ci += 1;
        // SAFETY: the consumer-index word of the CQ dbrec.
        unsafe { AtomicU32::from_ptr((self.h.dbrec + offset_of!(CqDbrec, set_ci) as u64) as *mut u32) }
            .store(Be32::new(self.ci as u32 & 0xff_ffff).to_bits(), Ordering::Release);
        Some(bytemuck::cast(words))
    }

    /// Waits for the next CQE ([`CQE_TIMEOUT`] at most, then panics naming what it waited for).
    pub fn wait(&mut self) -> Cqe64 {
        let t = Instant::now();
        loop {
            if let Some(c) = self.poll() {
                return c;
            }
            assert!(t.elapsed() < CQE_TIMEOUT, "no CQE {} on CQ {} within {CQE_TIMEOUT:?}", self.ci, self.h.cqn);
            std::thread::yield_now();
        }
    }

    /// Asserts that no CQE arrives within `d`.
    pub fn assert_none_for(&mut self, d: Duration) {
        let t = Instant::now();
        while t.elapsed() < d {
            if let Some(c) = self.poll() {
                panic!("unexpected CQE {c:?}");
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// Asserts a successful requester CQE for `opc` at WQE index `at` of QP `qpn`.
pub fn assert_req(c: &Cqe64, opc: u8, qpn: u32, at: u64, byte_cnt: u32) {
    assert_eq!(c.opcode(), opcode::cqe::REQ, "CQE opcode, CQE {c:?} (as error: {:?})", c.as_err());
    assert_eq!(c.wqe_counter.get(), at as u16, "wqe_counter");
    assert_eq!(c.sop_drop_qpn.get(), (opc as u32) << 24 | qpn, "sop_drop_qpn");
    assert_eq!(c.byte_cnt.get(), byte_cnt, "byte_cnt");
}

/// Asserts an error CQE (REQ_ERR) with `syndrome` at WQE index `at` of QP `qpn` for a WQE of opcode `opc`.
pub fn assert_err(c: &Cqe64, syndrome: u8, opc: u8, qpn: u32, at: u64) -> ErrCqe {
    let e = *c.as_err();
    assert_eq!(c.opcode(), opcode::cqe::REQ_ERR, "CQE opcode, {e:?}");
    assert_eq!(e.syndrome, syndrome, "syndrome, {e:?}");
    assert_eq!(e.wqe_counter.get(), at as u16, "wqe_counter, {e:?}");
    assert_eq!(e.s_wqe_opcode_qpn.get(), (opc as u32) << 24 | qpn, "s_wqe_opcode_qpn, {e:?}");
    e
}

/// Two connected QPs on one NIC, each with its own CQ, and a PD.
pub struct Pair {
    pub nic: Arc<EmuNic>,
    pub pd: Pd,
    pub cq_a: Cq,
    pub cq_b: Cq,
    pub a: Qp,
    pub b: Qp,
}

impl Pair {
    /// `wqe_cnt` WQEBBs per SQ, `ncqe` entries per CQ.
    pub fn new(wqe_cnt: u32, ncqe: u32) -> Self {
        Self::with_config(EmuConfig::host_or_env().unwrap(), wqe_cnt, ncqe)
    }

    /// As [`Pair::new`], on a NIC opened with `cfg`.
    pub fn with_config(cfg: EmuConfig, wqe_cnt: u32, ncqe: u32) -> Self {
        let nic = EmuNic::open(cfg).expect("open");
        let pd = nic.alloc_pd().unwrap();
        let cq_a = nic.create_cq(ncqe).unwrap();
        let cq_b = nic.create_cq(ncqe).unwrap();
        let a = nic.create_qp(&pd, &cq_a, wqe_cnt).unwrap();
        let b = nic.create_qp(&pd, &cq_b, wqe_cnt).unwrap();
        a.connect(&b.endpoint()).unwrap();
        b.connect(&a.endpoint()).unwrap();
        Self { nic, pd, cq_a, cq_b, a, b }
    }
}

/// A NIC config with a wire on loopback TCP whose requests fail after `retry` without progress.
pub fn wired(retry: Duration) -> EmuConfig {
    EmuConfig::host_or_env().unwrap().with_wire(WireConfig { retry_timeout: retry, ..WireConfig::loopback() })
}

/// Two NICs with a wire each (as in two processes), one QP on each, connected to each other.
pub struct WirePair {
    pub a: Qp,
    pub b: Qp,
    pub cq_a: Cq,
    pub cq_b: Cq,
    pub pd_a: Pd,
    pub pd_b: Pd,
    pub nic_a: Arc<EmuNic>,
    pub nic_b: Arc<EmuNic>,
}

impl WirePair {
    /// Both NICs opened with [`wired`]`(retry)`.
    pub fn new(retry: Duration) -> Self {
        Self::with(wired(retry), wired(retry))
    }

    /// NIC a opened with `a`, NIC b with `b`; 64 WQEBBs per SQ and 64 entries per CQ.
    pub fn with(a: EmuConfig, b: EmuConfig) -> Self {
        Self::sized(a, b, 64, 64)
    }

    /// As [`WirePair::with`], with `wqe_cnt` WQEBBs per SQ and `ncqe` entries per CQ.
    pub fn sized(a: EmuConfig, b: EmuConfig, wqe_cnt: u32, ncqe: u32) -> Self {
        let (nic_a, nic_b) = (EmuNic::open(a).unwrap(), EmuNic::open(b).unwrap());
        let (pd_a, pd_b) = (nic_a.alloc_pd().unwrap(), nic_b.alloc_pd().unwrap());
        let (cq_a, cq_b) = (nic_a.create_cq(ncqe).unwrap(), nic_b.create_cq(ncqe).unwrap());
        let a = nic_a.create_qp(&pd_a, &cq_a, wqe_cnt).unwrap();
        let b = nic_b.create_qp(&pd_b, &cq_b, wqe_cnt).unwrap();
        // Endpoints travel as bytes, as through a bootstrap.
        let (ea, eb) = (
            Endpoint::from_bytes(&a.endpoint().to_bytes()).unwrap(),
            Endpoint::from_bytes(&b.endpoint().to_bytes()).unwrap(),
        );
        assert_eq!((ea, eb), (a.endpoint(), b.endpoint()));
        a.connect(&eb).unwrap();
        b.connect(&ea).unwrap();
        Self { a, b, cq_a, cq_b, pd_a, pd_b, nic_a, nic_b }
    }
}

/// The NIC's counters once it has counted at least `wqes` WQEs and `cqes` CQEs ([`CQE_TIMEOUT`] at most): the
/// NIC counts a CQE just after it writes it (or queues it behind the data it reports), so right after software
/// polled a CQE its count may still trail. The caller asserts the exact counts.
pub fn stats_counted(nic: &EmuNic, wqes: u64, cqes: u64) -> gdaki::nic::emu::Stats {
    wait_until("the NIC's counts", || {
        let s = nic.stats();
        s.wqes >= wqes && s.cqes >= cqes
    });
    nic.stats()
}

/// The NIC's counters once `counted` holds of them ([`CQE_TIMEOUT`] at most), for counts of error and flush
/// CQEs as [`stats_counted`] is for successful ones: the NIC counts a CQE just after it writes it, so right after
/// software polled the last one its count may still trail. The caller asserts the exact counts.
pub fn stats_when(
    nic: &EmuNic,
    what: &str,
    counted: impl Fn(&gdaki::nic::emu::Stats) -> bool,
) -> gdaki::nic::emu::Stats {
    wait_until(what, || counted(&nic.stats()));
    nic.stats()
}

/// Waits until `cond` holds ([`CQE_TIMEOUT`] at most).
pub fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let t = Instant::now();
    while !cond() {
        assert!(t.elapsed() < CQE_TIMEOUT, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// `CQ_UPDATE`, re-exported for brevity.
pub const SIGNALED: u8 = CQ_UPDATE;

/// The error of a range of `bytes` bytes at `offset` outside a local memory of `length` bytes.
pub fn local_range<T>(offset: u64, bytes: u64, length: u64) -> Result<T, gdaki_device::Error> {
    Err(gdaki_device::error::RangeError::local(offset, bytes, length).into())
}

/// The error of a range of `bytes` bytes at `offset` outside the peer's memory of `length` bytes.
pub fn remote_range<T>(offset: u64, bytes: u64, length: u64) -> Result<T, gdaki_device::Error> {
    Err(gdaki_device::error::RangeError::remote(offset, bytes, length).into())
}
