//! The emulated NIC's two pure parsers on arbitrary bytes, for the cargo-fuzz targets in `fuzz/` and for the
//! WQE round-trip properties below. Not part of gdaki's API: compiled only with the `fuzzing` feature (and in
//! gdaki's own tests), and hidden from the docs.
//!
//! Each entry point turns what the parser returns into owned values, so that every field is read, and asserts
//! what the parser promises (payloads are sub-slices of the input, sizes agree with `ds`, re-encoding a decoded
//! frame decodes to the same packet): a broken promise is a panic, which the fuzzer reports like any other.

use gdaki_shared::prm::opcode;
use gdaki_shared::prm::wqe::{fm_ce_se, wqebbs, CtrlSeg, SEG};
use gdaki_shared::Be32;

use super::access::AtomicOp;
use super::fault::Fault;
use super::wire::packet::{self, Packet, HEADER};
use super::wqe::{self, Expect, Header, Op, Payload, SgeList, MAX_WQE_BYTES};

/// A WQE the parser accepted, every field copied out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wqe {
    /// `MLX5_OPCODE_*`.
    pub opcode: u8,
    /// Size in 16-byte segments.
    pub ds: u8,
    /// WQEBBs the WQE occupies.
    pub wqebbs: u32,
    /// The WQE asks for a CQE.
    pub cq_update: bool,
    /// The ctrl segment's immediate (the value of the big-endian field).
    pub imm: u32,
    /// What the body says.
    pub op: WqeOp,
}

/// One local buffer of a data segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sge {
    /// Bytes (a `byte_count` of 0 reads as 2^31).
    pub len: u64,
    /// Local key.
    pub lkey: u32,
    /// Local address.
    pub addr: u64,
}

/// The parsed body of a [`Wqe`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WqeOp {
    /// NOP.
    Nop,
    /// RDMA WRITE, with the immediate for WRITE_IMM.
    Write {
        /// Remote address.
        raddr: u64,
        /// Remote key.
        rkey: u32,
        /// The immediate of a WRITE_IMM.
        imm: Option<u32>,
        /// Where the bytes come from.
        data: WriteData,
    },
    /// RDMA READ into `sges`.
    Read {
        /// Remote address.
        raddr: u64,
        /// Remote key.
        rkey: u32,
        /// Local buffers, in order.
        sges: Vec<Sge>,
    },
    /// Fetch-and-add.
    FetchAdd {
        /// Remote address.
        raddr: u64,
        /// Remote key.
        rkey: u32,
        /// The addend.
        add: u64,
        /// Where the old value goes.
        sge: Sge,
    },
    /// Compare-and-swap.
    CompareSwap {
        /// Remote address.
        raddr: u64,
        /// Remote key.
        rkey: u32,
        /// Value compared with.
        compare: u64,
        /// Value swapped in.
        swap: u64,
        /// Where the old value goes.
        sge: Sge,
    },
}

/// Where an RDMA WRITE's bytes come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WriteData {
    /// Inline bytes.
    Inline(Vec<u8>),
    /// Local buffers, in order.
    Sges(Vec<Sge>),
}

/// Why [`parse_wqe`] gave no WQE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WqeError {
    /// Fewer than 16 bytes: no ctrl segment.
    Short(usize),
    /// The parser's verdict: the error CQE's syndrome and vendor syndrome.
    Fault {
        /// `MLX5_CQE_SYNDROME_*`.
        syndrome: u8,
        /// The emulator's vendor syndrome (`gdaki::nic::emu::vendor`).
        vendor: u8,
    },
}

fn fault(f: Fault) -> WqeError {
    WqeError::Fault { syndrome: f.syndrome, vendor: f.vendor }
}

/// Runs `parse_ctrl` and `parse_body` on `bytes` as the send-queue engine (`sq::step`) does for the WQE at
/// index `index` of QP `qpn` (`wqe_cnt` WQEBBs, `avail` WQEBBs announced by the doorbell): the ctrl segment is
/// the first 16 bytes, the body the first `ds * 16` bytes of a 63-segment buffer holding the input (cut there,
/// zero-padded: the rest of the ring). Any length is fine.
///
/// Also runs `parse_body` on the raw input against a header taken from it unchecked (any opcode, any `ds`
/// byte): the parser's own guard must reject what `parse_ctrl` would have.
pub fn parse_wqe(bytes: &[u8], qpn: u32, wqe_cnt: u32, index: u16, avail: u64) -> Result<Wqe, WqeError> {
    let head = bytes.get(..SEG).ok_or(WqeError::Short(bytes.len()))?;
    let ctrl: CtrlSeg = bytemuck::pod_read_unaligned(head);

    let raw = Header {
        opcode: ctrl.opcode(),
        ds: ctrl.qpn_ds.get() as u8,
        wqebbs: wqebbs(ctrl.qpn_ds.get() & 0xff),
        cq_update: ctrl.fm_ce_se & fm_ce_se::CQ_UPDATE != 0,
        imm: ctrl.imm,
    };
    if let Ok(op) = wqe::parse_body(&raw, bytes) {
        assert_eq!(bytes.len(), raw.ds as usize * SEG, "parse_body accepted a WQE of the wrong size");
        summary(&raw, &op, bytes);
    }

    let h = wqe::parse_ctrl(&ctrl, &Expect { qpn, wqe_cnt, index, avail }).map_err(fault)?;
    assert!(h.wqebbs == wqebbs(h.ds as u32) && h.wqebbs <= wqe_cnt && h.wqebbs as u64 <= avail, "{h:?}");
    let mut ring = [0u8; MAX_WQE_BYTES];
    let n = bytes.len().min(MAX_WQE_BYTES);
    ring[..n].copy_from_slice(&bytes[..n]);
    let wqe = &ring[..h.ds as usize * SEG];
    let op = wqe::parse_body(&h, wqe).map_err(fault)?;
    Ok(summary(&h, &op, wqe))
}

/// Copies every field out of a parsed WQE, checking that inline data lies inside `wqe`.
fn summary(h: &Header, op: &Op<'_>, wqe: &[u8]) -> Wqe {
    let sges = |l: SgeList<'_>| l.iter().map(|s| Sge { len: s.len, lkey: s.lkey, addr: s.addr }).collect::<Vec<_>>();
    let op = match *op {
        Op::Nop => WqeOp::Nop,
        Op::Write { remote, payload, imm } => {
            let data = match payload {
                Payload::Inline(d) => {
                    assert!(within(wqe, d), "inline data outside the WQE");
                    WriteData::Inline(d.to_vec())
                }
                Payload::Sges(l) => {
                    assert_eq!(l.iter().count(), h.ds as usize - 2);
                    WriteData::Sges(sges(l))
                }
            };
            WqeOp::Write { raddr: remote.addr, rkey: remote.rkey, imm: imm.map(Be32::get), data }
        }
        Op::Read { remote, sges: l } => {
            assert_eq!(l.iter().count(), h.ds as usize - 2);
            WqeOp::Read { raddr: remote.addr, rkey: remote.rkey, sges: sges(l) }
        }
        Op::Atomic { remote, op, sge } => {
            let sge = Sge { len: sge.len, lkey: sge.lkey, addr: sge.addr };
            match op {
                AtomicOp::FetchAdd(add) => WqeOp::FetchAdd { raddr: remote.addr, rkey: remote.rkey, add, sge },
                AtomicOp::CompareSwap { compare, swap } => {
                    WqeOp::CompareSwap { raddr: remote.addr, rkey: remote.rkey, compare, swap, sge }
                }
            }
        }
    };
    let expected = match op {
        WqeOp::Nop => opcode::NOP,
        WqeOp::Write { imm: Some(_), .. } => opcode::RDMA_WRITE_IMM,
        WqeOp::Write { .. } => opcode::RDMA_WRITE,
        WqeOp::Read { .. } => opcode::RDMA_READ,
        WqeOp::FetchAdd { .. } => opcode::ATOMIC_FA,
        WqeOp::CompareSwap { .. } => opcode::ATOMIC_CS,
    };
    assert_eq!(h.opcode, expected, "{op:?}");
    Wqe { opcode: h.opcode, ds: h.ds, wqebbs: h.wqebbs, cq_update: h.cq_update, imm: h.imm.get(), op }
}

/// `inner` is a sub-slice of `outer`.
fn within(outer: &[u8], inner: &[u8]) -> bool {
    let (o, i) = (outer.as_ptr_range(), inner.as_ptr_range());
    o.start <= i.start && i.end <= o.end
}

/// Decodes `bytes` as one frame body (after the length prefix) with the wire decoder; returns whether it is a
/// packet. An accepted packet's payload (or handle) must be (in) the input after the header, and encoding the packet again must
/// give a frame that decodes to the same packet.
pub fn decode_frame(bytes: &[u8]) -> bool {
    let Ok(p) = packet::decode(bytes) else {
        return false;
    };
    if let Packet::Write { data, .. } | Packet::ReadResp { data, .. } = p {
        assert!(within(bytes, data) && data.len() + HEADER == bytes.len(), "payload is not the rest of the frame");
    }
    if let Packet::WriteIpc { handle, .. } | Packet::IpcOffer { handle } | Packet::IpcAnswer { handle, .. } = p {
        assert!(within(&bytes[HEADER..], handle), "handle outside the payload");
    }
    let mut frame = Vec::with_capacity(bytes.len() + 4);
    packet::encode(&p, &mut frame);
    assert_eq!(frame[..4], ((frame.len() - 4) as u32).to_le_bytes(), "length prefix");
    assert_eq!(packet::decode(&frame[4..]), Ok(p), "decode(encode(p)) != p");
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use gdaki_device::wqe as dev;
    use gdaki_shared::prm::wqe::{ds as wqe_ds, AtomicSeg, DataSeg, InlineSeg, RaddrSeg, Seg};
    use proptest::prelude::*;

    use crate::nic::emu::fault::vendor;

    /// Largest SGE count of a WRITE/READ: 63 segments less ctrl and raddr.
    const MAX_SGES: usize = 61;

    /// The fields every ctrl segment carries, drawn at random: index, QPN (24 bits), flags (any fence mode,
    /// completion mode 0 or 2, solicited or not), immediate.
    fn ctrl_fields() -> impl Strategy<Value = (u16, u32, u8, u32)> {
        (any::<u16>(), 0..=0xff_ffffu32, 0u8..=4, any::<bool>(), any::<bool>(), any::<u32>()).prop_map(
            |(idx, qpn, fence, cqe, solicited, imm)| {
                let flags = (fence << 5)
                    | if cqe { fm_ce_se::CQ_UPDATE } else { 0 }
                    | if solicited { fm_ce_se::SOLICITED } else { 0 };
                (idx, qpn, flags, imm)
            },
        )
    }

    /// 0..=61 SGEs (none: a zero-length message, ds 2) whose lengths add up to at most 2^31 (a single one may be
    /// 0, which reads as 2^31).
    fn sges() -> impl Strategy<Value = Vec<Sge>> {
        (0..=MAX_SGES)
            .prop_flat_map(|n| {
                let most = if n <= 1 { 0..=(1u32 << 31) - 1 } else { 1..=(1u32 << 31) / n as u32 };
                proptest::collection::vec((most, any::<u32>(), any::<u64>()), n)
            })
            .prop_map(|v| {
                v.into_iter()
                    .map(|(len, lkey, addr)| Sge { len: if len == 0 { 1 << 31 } else { len as u64 }, lkey, addr })
                    .collect()
            })
    }

    fn data_seg(s: &Sge) -> Seg {
        DataSeg::new(s.len as u32, Be32::new(s.lkey), s.addr).into()
    }

    fn bytes(segs: &[Seg]) -> Vec<u8> {
        bytemuck::cast_slice(segs).to_vec()
    }

    /// The WQE as `sq::step` sees it: `wqe` then `tail` (the next WQE's bytes, ignored), at the index, QPN and
    /// producer index (`wqebbs` ahead, exactly) the WQE names.
    fn parse(wqe: &[u8], tail: &[u8], idx: u16, qpn: u32) -> Result<Wqe, WqeError> {
        let ds = wqe.len() / SEG;
        let mut b = wqe.to_vec();
        b.extend_from_slice(tail);
        parse_wqe(&b, qpn, 64, idx, wqebbs(ds as u32) as u64)
    }

    /// The expected summary of a WQE built from these fields.
    fn want(opcode: u8, ds: usize, flags: u8, imm: u32, op: WqeOp) -> Wqe {
        let ds = ds as u8;
        let wqebbs = wqebbs(ds as u32);
        Wqe { opcode, ds, wqebbs, cq_update: flags & fm_ce_se::CQ_UPDATE != 0, imm, op }
    }

    /// The WQE shapes the shared segment builders make, with `n` SGEs or inline data.
    #[derive(Clone, Debug)]
    enum Shape {
        Nop,
        Write { imm: bool, sges: Vec<Sge> },
        Inline(Vec<u8>),
        Read(Vec<Sge>),
        FetchAdd(u64),
        CompareSwap(u64, u64),
    }

    fn shape() -> impl Strategy<Value = Shape> {
        // Longest inline payload: 61 segments less the 4-byte header.
        let max_inline = MAX_SGES * SEG - 4;
        prop_oneof![
            Just(Shape::Nop),
            (any::<bool>(), sges()).prop_map(|(imm, sges)| Shape::Write { imm, sges }),
            proptest::collection::vec(any::<u8>(), 0..=max_inline).prop_map(Shape::Inline),
            sges().prop_map(Shape::Read),
            any::<u64>().prop_map(Shape::FetchAdd),
            (any::<u64>(), any::<u64>()).prop_map(|(c, s)| Shape::CompareSwap(c, s)),
        ]
    }

    /// Builds `shape` with the shared segment builders; returns the bytes and the summary they must parse to.
    fn build(
        shape: &Shape,
        (idx, qpn, flags, imm): (u16, u32, u8, u32),
        remote: (u64, u32),
        atomic: Sge,
    ) -> (Vec<u8>, Wqe) {
        let (raddr, rkey) = remote;
        let ctrl =
            |op: u8, ds: usize| -> Seg { CtrlSeg::new(idx, op, 0, qpn, flags, ds as u8, 0, Be32::new(imm)).into() };
        let raddr_seg: Seg = RaddrSeg::new(raddr, Be32::new(rkey)).into();
        let mut segs = Vec::new();
        let (op, ds, body) = match shape {
            Shape::Nop => (opcode::NOP, 1, WqeOp::Nop),
            Shape::Write { imm: with_imm, sges } => {
                let op = if *with_imm { opcode::RDMA_WRITE_IMM } else { opcode::RDMA_WRITE };
                segs.push(raddr_seg);
                segs.extend(sges.iter().map(data_seg));
                let data = WriteData::Sges(sges.clone());
                (op, 2 + sges.len(), WqeOp::Write { raddr, rkey, imm: with_imm.then_some(imm), data })
            }
            Shape::Inline(data) => {
                let ds = wqe_ds::rdma_write_inline(data.len() as u32) as usize;
                let mut tail = bytemuck::bytes_of(&InlineSeg::new(data.len() as u32)).to_vec();
                tail.extend_from_slice(data);
                tail.resize((ds - 2) * SEG, 0);
                segs.push(raddr_seg);
                segs.extend(tail.chunks_exact(SEG).map(bytemuck::pod_read_unaligned::<Seg>));
                let data = WriteData::Inline(data.clone());
                (opcode::RDMA_WRITE, ds, WqeOp::Write { raddr, rkey, imm: None, data })
            }
            Shape::Read(sges) => {
                segs.push(raddr_seg);
                segs.extend(sges.iter().map(data_seg));
                (opcode::RDMA_READ, 2 + sges.len(), WqeOp::Read { raddr, rkey, sges: sges.clone() })
            }
            Shape::FetchAdd(add) => {
                segs.extend([raddr_seg, AtomicSeg::fetch_add(*add).into(), data_seg(&atomic)]);
                (opcode::ATOMIC_FA, 4, WqeOp::FetchAdd { raddr, rkey, add: *add, sge: atomic })
            }
            Shape::CompareSwap(compare, swap) => {
                segs.extend([raddr_seg, AtomicSeg::compare_swap(*compare, *swap).into(), data_seg(&atomic)]);
                let (compare, swap) = (*compare, *swap);
                (opcode::ATOMIC_CS, 4, WqeOp::CompareSwap { raddr, rkey, compare, swap, sge: atomic })
            }
        };
        segs.insert(0, ctrl(op, ds));
        assert_eq!(segs.len(), ds);
        (bytes(&segs), want(op, ds, flags, imm, body))
    }

    /// One output of gdaki-device's builders, by size, and the summary the parser must give for it (with
    /// `cq_update` false: the poster decides that).
    #[derive(Clone, Debug)]
    struct DevWqe {
        wqe: DevBuilt,
        want: Wqe,
    }

    #[derive(Clone, Copy, Debug)]
    enum DevBuilt {
        W1(dev::Wqe<1>),
        W3(dev::Wqe<3>),
        W4(dev::Wqe<4>),
        W16(dev::Wqe<{ dev::MAX_DS }>),
    }

    /// Calls `$f` with the builder output inside a [`DevBuilt`], whatever its size.
    macro_rules! with_wqe {
        ($b:expr, $w:ident => $e:expr) => {
            match $b {
                DevBuilt::W1($w) => $e,
                DevBuilt::W3($w) => $e,
                DevBuilt::W4($w) => $e,
                DevBuilt::W16($w) => $e,
            }
        };
    }

    impl DevWqe {
        fn ds(&self) -> usize {
            with_wqe!(self.wqe, w => w.ds() as usize)
        }

        /// The segments as a poster stores them (the first `ds`).
        fn encode(&self, c: dev::Ctrl) -> Vec<Seg> {
            with_wqe!(self.wqe, w => w.encode(c).to_vec())
        }
    }

    /// Every builder of gdaki-device with random inputs (lengths in 1 ..= 2^31 − 1, atomics 8-byte aligned,
    /// inline payloads of 1 ..= MAX_INLINE bytes).
    fn device_wqe() -> impl Strategy<Value = DevWqe> {
        (
            0u8..7,
            (any::<u64>(), any::<u32>()),
            (1..=dev::MAX_SGE_LEN, any::<u32>(), any::<u64>()),
            (any::<u64>(), any::<u64>(), any::<u32>()),
            proptest::collection::vec(any::<u8>(), 1..=dev::MAX_INLINE),
        )
            .prop_map(|(kind, (raddr, rkey), (len, lkey, addr), (x, y, imm), inline)| {
                let remote = dev::Raddr { addr: raddr, rkey: Be32::new(rkey) };
                let local = dev::Sge::new(addr, len, Be32::new(lkey)).unwrap();
                let sge = Sge { len: len as u64, lkey, addr };
                let (raddr8, addr8) = (raddr & !7, addr & !7);
                let remote8 = dev::Raddr { addr: raddr8, ..remote };
                let result = dev::Sge::new(addr8, 8, Be32::new(lkey)).unwrap();
                let result_sge = Sge { len: 8, lkey, addr: addr8 };
                let write = |imm: Option<u32>, data| WqeOp::Write { raddr, rkey, imm, data };
                let (wqe, op, body, ctrl_imm) = match kind {
                    0 => (DevBuilt::W1(dev::nop()), opcode::NOP, WqeOp::Nop, 0),
                    1 => (
                        DevBuilt::W3(dev::rdma_write(remote, local)),
                        opcode::RDMA_WRITE,
                        write(None, WriteData::Sges(vec![sge])),
                        0,
                    ),
                    2 => (
                        DevBuilt::W3(dev::rdma_write_imm(remote, local, Be32::new(imm))),
                        opcode::RDMA_WRITE_IMM,
                        write(Some(imm), WriteData::Sges(vec![sge])),
                        imm,
                    ),
                    3 => (
                        DevBuilt::W3(dev::rdma_read(remote, local)),
                        opcode::RDMA_READ,
                        WqeOp::Read { raddr, rkey, sges: vec![sge] },
                        0,
                    ),
                    4 => (
                        DevBuilt::W4(dev::atomic_fetch_add(remote8, result, x).unwrap()),
                        opcode::ATOMIC_FA,
                        WqeOp::FetchAdd { raddr: raddr8, rkey, add: x, sge: result_sge },
                        0,
                    ),
                    5 => (
                        DevBuilt::W4(dev::atomic_compare_swap(remote8, result, x, y).unwrap()),
                        opcode::ATOMIC_CS,
                        WqeOp::CompareSwap { raddr: raddr8, rkey, compare: x, swap: y, sge: result_sge },
                        0,
                    ),
                    _ => (
                        DevBuilt::W16(dev::rdma_write_inline(remote, &inline).unwrap()),
                        opcode::RDMA_WRITE,
                        write(None, WriteData::Inline(inline.clone())),
                        0,
                    ),
                };
                let ds = with_wqe!(wqe, w => w.ds()) as usize;
                DevWqe { wqe, want: want(op, ds, 0, ctrl_imm, body) }
            })
    }

    /// Queue memory of one QP in host memory, as the emulated NIC lays it out for the `cpu` executor: a
    /// 64-WQEBB SQ, its dbrec, a UAR register, a 64-entry CQ (no CQE ever arrives) .
    #[derive(Clone, Copy, bytemuck::Zeroable)]
    #[repr(C, align(64))]
    struct Queues {
        sq: [[Seg; 4]; 64],
        bf: [u64; 8],
        cq: [[u64; 8]; 64],
        dbrec: [u32; 2],
        cq_dbrec: [u32; 2],
    }

    const QPN: u32 = 0x0a_bcde;

    /// Posts `wqes` in order through poster `poster` (0 Exclusive `post` + `ring_db`, 1 Exclusive `post_bf`,
    /// 2 shared Block, 3 shared Device) on a fresh QP whose counters start at `start`; returns each WQE's
    /// ticket and what the emulated NIC's parser reads at it. Also checks that the dbrec announces the end of
    /// the last WQE and, for BlueFlame, that the register holds the ring's copy of the WQE's first WQEBB.
    fn post_through(poster: u8, start: u64, wqes: &[DevWqe]) -> Vec<(u64, Result<Wqe, WqeError>)> {
        use gdaki_device::scope::{Block, Device};
        use gdaki_device::shared_qp::SharedQp;
        use gdaki_shared::handle::{CqHandle, QpHandle};

        let mut q: Box<Queues> = Box::new(bytemuck::Zeroable::zeroed());
        for c in q.cq.iter_mut() {
            c[7] = 0xf1u64 << 56; // op_own = 0xF1: invalid, hardware-owned.
        }
        let cq = CqHandle {
            buf: q.cq.as_ptr() as u64,
            dbrec: q.cq_dbrec.as_ptr() as u64,
            ncqe: 64,
            cqn: 1,
            cons_index: 0,
            ..Default::default()
        };
        let mut h = QpHandle {
            sq_buf: q.sq.as_ptr() as u64,
            dbrec: q.dbrec.as_ptr() as u64,
            bf_reg: q.bf.as_ptr() as u64,
            bf_size: gdaki_shared::prm::uar::BF_WRITE_SIZE as u32,
            wqe_cnt: 64,
            qpn: QPN,
            cq,
            sq: gdaki_shared::handle::SqState::at(start),
            ..Default::default()
        };
        let mut tickets = Vec::new();
        {
            let hp = &raw mut h;
            for w in wqes {
                let t = match poster {
                    0 | 1 => {
                        // SAFETY: `h` describes `q`'s queues, used by this thread only.
                        let mut qp = unsafe { gdaki_device::qp::Qp::new(&mut *hp, 1_000_000_000) };
                        let t = if poster == 0 {
                            let t = with_wqe!(w.wqe, x => qp.post(false, x));
                            qp.ring_db();
                            t
                        } else {
                            with_wqe!(w.wqe, x => qp.post_bf(false, x))
                        };
                        t.unwrap().0
                    }
                    2 => {
                        // SAFETY: as above; used by shared posters only.
                        let qp = unsafe { SharedQp::<Block>::new(hp, 1_000_000_000) };
                        with_wqe!(w.wqe, x => qp.post(true, x)).unwrap().0
                    }
                    _ => {
                        // SAFETY: as above.
                        let qp = unsafe { SharedQp::<Device>::new(hp, 1_000_000_000) };
                        with_wqe!(w.wqe, x => qp.post(true, x)).unwrap().0
                    }
                };
                if poster == 1 && w.ds() <= 4 {
                    let slot = (t % 64) as usize;
                    let mut ring: [u64; 8] = bytemuck::cast(q.sq[slot]);
                    // Word 1 as `ring_bf` tags it (the WQE index in the signature byte).
                    ring[1] = gdaki_shared::prm::uar::blueflame_word1(ring[0], ring[1]);
                    assert_eq!(q.bf, ring, "the BlueFlame register holds the WQE's first WQEBB");
                }
                tickets.push(t);
            }
        }
        let end = tickets.last().unwrap() + wqebbs(wqes.last().unwrap().ds() as u32) as u64;
        assert_eq!(u32::from_be(q.dbrec[1]), end as u32 & 0xffff, "the dbrec announces every WQE");
        let ring: &[u8] = bytemuck::cast_slice(&q.sq[..]);
        tickets
            .iter()
            .map(|&t| {
                // The WQE's bytes from its slot on, wrapping at the ring's end (as the NIC reads them).
                let from = (t % 64) as usize * 64;
                let bytes: Vec<u8> = ring[from..].iter().chain(&ring[..from]).take(MAX_WQE_BYTES).copied().collect();
                (t, parse_wqe(&bytes, QPN, 64, t as u16, end - t))
            })
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2048))]

        /// Shared builders → parse → the same fields, whatever follows the WQE in the ring.
        #[test]
        fn shared_builders_round_trip(
            shape in shape(),
            ctrl in ctrl_fields(),
            remote in (any::<u64>(), any::<u32>()),
            atomic in (any::<u32>(), any::<u64>()),
            tail in proptest::collection::vec(any::<u8>(), 0..80),
        ) {
            let atomic = Sge { len: 8, lkey: atomic.0, addr: atomic.1 };
            let (wqe, want) = build(&shape, ctrl, remote, atomic);
            prop_assert_eq!(parse(&wqe, &tail, ctrl.0, ctrl.1), Ok(want));
        }

        /// gdaki-device's builders (what device code posts) → parse → the same fields.
        #[test]
        fn device_builders_round_trip(
            b in device_wqe(),
            (idx, qpn, flags, _) in ctrl_fields(),
        ) {
            let c = dev::Ctrl { idx, qpn, fm_ce_se: flags };
            let segs = b.encode(c);
            let want = Wqe { cq_update: flags & fm_ce_se::CQ_UPDATE != 0, ..b.want.clone() };
            prop_assert_eq!(parse(&bytes(&segs[..b.ds()]), &[], idx, qpn), Ok(want));
        }

        /// Any sequence of builder outputs, posted through any poster (Exclusive `post`, `post_bf`, shared
        /// Block and Device `post`), is parsed back from the ring by the emulated NIC with the fields it was
        /// built with, each WQE at the index its ticket names and occupying exactly the WQEBBs reserved for it
        /// (the next WQE starts right after it), across the ring's wrap.
        #[test]
        fn every_poster_stores_what_the_builders_made(
            wqes in proptest::collection::vec(device_wqe(), 1..=16),
            poster in 0u8..4,
            start in 0u64..64,
        ) {
            let got = post_through(poster, start, &wqes);
            prop_assert_eq!(got.len(), wqes.len());
            let mut at = start;
            for (i, (b, (ticket, parsed))) in wqes.iter().zip(got).enumerate() {
                prop_assert_eq!(ticket, at, "WQE {} starts where the one before it ended", i);
                // Exclusive posts ask for a CQE only on request (or every quarter ring); shared ones always.
                prop_assert_eq!(parsed.map(|w| Wqe { cq_update: false, ..w }), Ok(b.want.clone()), "WQE {}", i);
                at += wqebbs(b.ds() as u32) as u64;
            }
        }

        /// Any bytes, any expectations: a WQE or a fault, never a panic (the entry point's own checks included).
        #[test]
        fn any_bytes_parse_or_fault(
            b in proptest::collection::vec(any::<u8>(), 0..200),
            wqe_cnt in 0u32..40,
            avail in 0u64..20,
        ) {
            let ctrl = b.get(..SEG).map(bytemuck::pod_read_unaligned::<CtrlSeg>).unwrap_or_default();
            let _ = parse_wqe(&b, ctrl.qpn(), wqe_cnt, ctrl.wqe_index(), avail);
        }
    }

    #[test]
    fn short_and_misfit_inputs() {
        assert_eq!(parse_wqe(&[0; 15], 0, 64, 0, 64), Err(WqeError::Short(15)));
        // A NOP whose QPN and index match, with and without trailing bytes of a partial segment.
        let nop = bytes(&[CtrlSeg::new(3, opcode::NOP, 0, 9, 0, 1, 0, Be32::ZERO).into()]);
        let want = Ok(want(opcode::NOP, 1, 0, 0, WqeOp::Nop));
        assert_eq!(parse_wqe(&nop, 9, 64, 3, 1), want);
        assert_eq!(parse_wqe(&[&nop[..], &[1, 2, 3]].concat(), 9, 64, 3, 1), want);
        // A 3-segment WRITE given only its ctrl segment: the rest of the "ring" is zero, a 2^31-byte SGE.
        let w = bytes(&[CtrlSeg::new(0, opcode::RDMA_WRITE, 0, 9, 0, 3, 0, Be32::ZERO).into()]);
        let got = parse_wqe(&w, 9, 64, 0, 1).unwrap();
        assert_eq!(
            got.op,
            WqeOp::Write {
                raddr: 0,
                rkey: 0,
                imm: None,
                data: WriteData::Sges(vec![Sge { len: 1 << 31, lkey: 0, addr: 0 }])
            }
        );
        let past = parse_wqe(&w, 9, 64, 0, 0);
        assert_eq!(past, Err(fault(Fault::qp_op(vendor::PAST_DOORBELL))));
    }

    /// Valid inputs the fuzz targets start from, by target: WQEs of every shape (behind the `wqe_parser`
    /// target's two parameter bytes: a 64-WQEBB ring, 64 WQEBBs announced) and frames of every packet kind.
    fn seeds() -> Vec<(&'static str, String, Vec<u8>)> {
        let c = dev::Ctrl { idx: 0x1234, qpn: 0x00_0123, fm_ce_se: fm_ce_se::CQ_UPDATE };
        let remote = dev::Raddr { addr: 0x7f00_0000_1000, rkey: Be32::new(0x155) };
        let local = dev::Sge::new(0x7f00_0000_2000, 4096, Be32::new(0x255)).unwrap();
        let result = dev::Sge::new(0x7f00_0000_2000, 8, Be32::new(0x255)).unwrap();
        let inline = dev::rdma_write_inline(remote, &[0xa5; 40]).unwrap();
        let sges = [data_seg(&Sge { len: 64, lkey: 0x255, addr: 0x2000 }); 5];
        let mut read5 = vec![CtrlSeg::new(c.idx, opcode::RDMA_READ, 0, c.qpn, 0, 7, 0, Be32::ZERO).into()];
        read5.push(RaddrSeg::new(0x1000, Be32::new(0x155)).into());
        read5.extend(sges);
        let empty = vec![
            CtrlSeg::new(c.idx, opcode::RDMA_WRITE, 0, c.qpn, 0, 2, 0, Be32::ZERO).into(),
            RaddrSeg::new(0x1000, Be32::new(0x155)).into(),
        ];
        let wqes: [(&str, Vec<Seg>); 9] = [
            ("write-empty", empty),
            ("nop", dev::nop().encode(c).to_vec()),
            ("write", dev::rdma_write(remote, local).encode(c).to_vec()),
            ("write-imm", dev::rdma_write_imm(remote, local, Be32::new(7)).encode(c).to_vec()),
            ("write-inline", inline.encode(c)[..inline.ds() as usize].to_vec()),
            ("read", dev::rdma_read(remote, local).encode(c).to_vec()),
            ("read-5-sges", read5),
            ("fetch-add", dev::atomic_fetch_add(remote, result, 1).unwrap().encode(c).to_vec()),
            ("compare-swap", dev::atomic_compare_swap(remote, result, 0, 1).unwrap().encode(c).to_vec()),
        ];
        let mut out: Vec<_> = wqes
            .into_iter()
            .map(|(name, segs)| ("wqe_parser", name.into(), [&[6, 64], &bytes(&segs)[..]].concat()))
            .collect();
        let data = [0x5a; 100];
        let frames = [
            (
                "write",
                Packet::Write {
                    psn: 1,
                    rkey: 0x155,
                    raddr: 0x1000,
                    total: 300,
                    offset: 200,
                    imm: Some(7),
                    last: true,
                    data: &data,
                },
            ),
            ("read", Packet::Read { psn: 2, rkey: 0x155, raddr: 0x1000, len: 4096 }),
            ("fetch-add", Packet::Atomic { psn: 3, rkey: 0x155, raddr: 0x1000, op: AtomicOp::FetchAdd(1) }),
            (
                "compare-swap",
                Packet::Atomic {
                    psn: 4,
                    rkey: 0x155,
                    raddr: 0x1000,
                    op: AtomicOp::CompareSwap { compare: 0, swap: 1 },
                },
            ),
            ("ack", Packet::Ack { psn: 4 }),
            ("nak", Packet::Nak { psn: 5, syndrome: 0x13, vendor: 0x30 }),
            ("read-resp", Packet::ReadResp { psn: 2, offset: 0, last: false, data: &data }),
            ("atomic-resp", Packet::AtomicResp { psn: 3, old: 41 }),
            (
                "hello",
                Packet::Hello { src_nic: 1, src_qpn: 0x123, dst_nic: 2, dst_qpn: 0x124, version: packet::VERSION },
            ),
            ("hello-ack", Packet::HelloAck),
            ("reject", Packet::Reject { why: packet::reject::NO_QP }),
            (
                "write-ipc",
                Packet::WriteIpc {
                    psn: 6,
                    rkey: 0x155,
                    raddr: 0x1000,
                    total: 4096,
                    offset: 0,
                    imm: None,
                    last: true,
                    handle: &[0x5a; 64],
                    src: 0x2000,
                    len: 4096,
                },
            ),
            ("ipc-offer", Packet::IpcOffer { handle: &[0x5a; 64] }),
            ("ipc-answer", Packet::IpcAnswer { handle: &[0x5a; 64], mapped: true }),
        ];
        for (name, p) in frames {
            let mut f = Vec::new();
            packet::encode(&p, &mut f);
            out.push(("wire_decoder", name.into(), f[4..].to_vec()));
        }
        out
    }

    /// The seeds committed under fuzz/corpus/<target>/seed-* are the ones [`seeds`] makes, and each is accepted.
    /// `GDAKI_WRITE_FUZZ_SEEDS=1 cargo test -p gdaki --lib fuzzing::tests::seed_corpus` rewrites them.
    #[test]
    fn seed_corpus() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus");
        let write = std::env::var_os("GDAKI_WRITE_FUZZ_SEEDS").is_some();
        for (target, name, input) in seeds() {
            match target {
                "wqe_parser" => {
                    let ctrl: CtrlSeg = bytemuck::pod_read_unaligned(&input[2..2 + SEG]);
                    let got = parse_wqe(&input[2..], ctrl.qpn(), 1 << input[0], ctrl.wqe_index(), input[1] as u64);
                    assert!(got.is_ok(), "seed {name}: {got:?}");
                }
                _ => assert!(decode_frame(&input), "seed {name}"),
            }
            let path = root.join(target).join(format!("seed-{name}"));
            if write {
                std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                std::fs::write(&path, &input).unwrap();
            } else {
                let committed = std::fs::read(&path).unwrap_or_default();
                assert!(committed == input, "{} is stale: run with GDAKI_WRITE_FUZZ_SEEDS=1", path.display());
            }
        }
    }

    #[test]
    fn frames() {
        assert!(!decode_frame(&[]));
        assert!(!decode_frame(&[0; HEADER]));
        let mut f = Vec::new();
        packet::encode(
            &Packet::Write { psn: 1, rkey: 2, raddr: 3, total: 8, offset: 0, imm: Some(4), last: true, data: &[7; 8] },
            &mut f,
        );
        assert!(decode_frame(&f[4..]));
    }
}
