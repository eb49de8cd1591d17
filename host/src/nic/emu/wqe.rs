//! Parses and validates one send WQE as the PRM lays it out (`mlx5_wqe_ctrl_seg`, `mlx5_wqe_raddr_seg`,
//! `mlx5_wqe_data_seg`, `mlx5_wqe_inl_data_seg`, `mlx5_wqe_atomic_seg`; all fields big-endian).
//!
//! Shapes accepted (in 16-byte segments, `ds`):
//!
//! | opcode | segments | ds |
//! |---|---|---|
//! | NOP | ctrl | 1 |
//! | RDMA_WRITE, RDMA_WRITE_IMM | ctrl, raddr, data × n or inline header + data padded to 16 B | ≥ 2 |
//! | RDMA_READ | ctrl, raddr, data × n | ≥ 2 |
//! | ATOMIC_CS, ATOMIC_FA | ctrl, raddr, atomic, data (8 bytes) | 4 |
//!
//! A WRITE or READ without data segment (ds 2) moves zero bytes: rdma-core's mlx5 provider posts a zero-length
//! message that way (it skips SGEs of length 0), and hardware completes it.
//!
//! Pure functions of the bytes: no memory is touched here, so any byte pattern gives a [`Fault`] or a
//! parsed WQE, never a panic.

use gdaki_shared::prm::opcode;
use gdaki_shared::prm::wqe::{
    ds as wqe_ds, fm_ce_se, wqebbs, AtomicSeg, CtrlSeg, DataSeg, InlineSeg, RaddrSeg, INLINE_SEG, SEG,
};
use gdaki_shared::Be32;

use super::access::AtomicOp;
use super::fault::{vendor, Fault};

/// Largest message, bytes (2^31, mlx5's `max_msg_sz`). A data segment's `byte_count` of 0 means 2^31.
pub(crate) const MAX_MSG: u64 = 1 << 31;

/// Largest WQE, bytes: `ds` is 6 bits (at most 63 segments).
pub(crate) const MAX_WQE_BYTES: usize = 63 * SEG;

/// What the NIC expects of the next WQE of a QP.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Expect {
    /// This QP's number.
    pub qpn: u32,
    /// SQ size in WQEBBs.
    pub wqe_cnt: u32,
    /// The WQE index (low 16 bits of the NIC's consumer count) the ctrl segment must carry.
    pub index: u16,
    /// WQEBBs between this WQE's start and the producer index the doorbell announced.
    pub avail: u64,
}

/// The validated ctrl segment.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Header {
    pub opcode: u8,
    /// WQE size in 16-byte segments.
    pub ds: u8,
    /// WQEBBs the WQE occupies: `ceil(ds / 4)`.
    pub wqebbs: u32,
    /// `fm_ce_se` asks for a CQE (completion mode 2 or 3).
    pub cq_update: bool,
    /// Immediate data, wire order.
    pub imm: Be32,
}

/// One local buffer of a data segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Sge {
    /// Bytes (a `byte_count` of 0 is 2^31).
    pub len: u64,
    pub lkey: u32,
    pub addr: u64,
}

/// The target of an RDMA operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Remote {
    pub addr: u64,
    pub rkey: u32,
}

/// A list of data segments (16 bytes each), parsed on iteration.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SgeList<'a>(&'a [u8]);

impl<'a> SgeList<'a> {
    pub(crate) fn iter(self) -> impl Iterator<Item = Sge> + 'a {
        self.0.chunks_exact(SEG).map(sge)
    }

    /// Sum of the SGE lengths.
    pub(crate) fn total(self) -> u64 {
        self.iter().map(|s| s.len).sum()
    }
}

/// Where an RDMA WRITE's bytes come from.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Payload<'a> {
    /// Inline data carried in the WQE.
    Inline(&'a [u8]),
    /// Local buffers.
    Sges(SgeList<'a>),
}

/// A parsed WQE body.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Op<'a> {
    Nop,
    Write { remote: Remote, payload: Payload<'a>, imm: Option<Be32> },
    Read { remote: Remote, sges: SgeList<'a> },
    Atomic { remote: Remote, op: AtomicOp, sge: Sge },
}

impl Op<'_> {
    /// The message's length in bytes, as the QP's `log_msg_max` bounds it: the data of a WRITE or READ, 8 for
    /// an atomic, 0 for a NOP.
    pub(crate) fn len(&self) -> u64 {
        match *self {
            Op::Nop => 0,
            Op::Write { payload: Payload::Inline(d), .. } => d.len() as u64,
            Op::Write { payload: Payload::Sges(l), .. } => l.total(),
            Op::Read { sges, .. } => sges.total(),
            Op::Atomic { .. } => 8,
        }
    }
}

/// Checks the ctrl segment: QPN, WQE index, opcode, opmod, `fm_ce_se`, and `ds` against the opcode's shape,
/// the ring and the doorbell. Every failure is `LOCAL_QP_OP_ERR` (0x02).
pub(crate) fn parse_ctrl(ctrl: &CtrlSeg, e: &Expect) -> Result<Header, Fault> {
    if ctrl.qpn() != e.qpn {
        return Err(Fault::qp_op(vendor::BAD_QPN));
    }
    if ctrl.wqe_index() != e.index {
        return Err(Fault::qp_op(vendor::BAD_WQE_INDEX));
    }
    let op = ctrl.opcode();
    let shape_ok: fn(u8) -> bool = match op {
        opcode::NOP => |ds| ds == 1,
        opcode::RDMA_WRITE | opcode::RDMA_WRITE_IMM | opcode::RDMA_READ => |ds| ds >= 2,
        opcode::ATOMIC_CS | opcode::ATOMIC_FA => |ds| ds == 4,
        _ => return Err(Fault::qp_op(vendor::BAD_OPCODE)),
    };
    if ctrl.opmod() != 0 {
        return Err(Fault::qp_op(vendor::BAD_OPMOD));
    }
    let flags = ctrl.fm_ce_se;
    // Fence modes 0..=4 are defined (none, initiator small fence, -, strong ordering, fence); bits 4 and 0
    // are reserved.
    if flags & !fm_ce_se::VALID_MASK != 0 || flags >> 5 > 4 {
        return Err(Fault::qp_op(vendor::BAD_FLAGS));
    }
    // qpn_ds carries ds in bits 5:0; bits 7:6 are reserved.
    let ds_byte = ctrl.qpn_ds.get() as u8;
    let ds = ctrl.ds();
    if ds_byte != ds || ds == 0 || !shape_ok(ds) {
        return Err(Fault::qp_op(vendor::BAD_DS));
    }
    let n = wqebbs(ds as u32);
    if n > e.wqe_cnt {
        return Err(Fault::qp_op(vendor::BAD_DS));
    }
    if n as u64 > e.avail {
        return Err(Fault::qp_op(vendor::PAST_DOORBELL));
    }
    Ok(Header { opcode: op, ds, wqebbs: n, cq_update: flags & fm_ce_se::CQ_UPDATE != 0, imm: ctrl.imm })
}

fn sge(seg: &[u8]) -> Sge {
    let d: DataSeg = bytemuck::pod_read_unaligned(seg);
    let len = match d.byte_count.get() {
        0 => MAX_MSG,
        n => n as u64,
    };
    Sge { len, lkey: d.lkey.get(), addr: d.addr.get() }
}

fn remote(seg: &[u8]) -> Remote {
    let r: RaddrSeg = bytemuck::pod_read_unaligned(seg);
    Remote { addr: r.raddr.get(), rkey: r.rkey.get() }
}

fn is_inline(seg: &[u8]) -> bool {
    let h: InlineSeg = bytemuck::pod_read_unaligned(&seg[..4]);
    h.byte_count.get() & INLINE_SEG != 0
}

/// Data segments `segs` (ds - 2 of them, possibly none): none may carry the inline bit, and together they may
/// not exceed [`MAX_MSG`].
fn sge_list(segs: &[u8]) -> Result<SgeList<'_>, Fault> {
    if segs.chunks_exact(SEG).any(is_inline) {
        return Err(Fault::qp_op(vendor::BAD_INLINE));
    }
    let list = SgeList(segs);
    if list.total() > MAX_MSG {
        return Err(Fault::length(vendor::MSG_TOO_LONG));
    }
    Ok(list)
}

/// Parses the segments after the ctrl segment. `wqe` holds the whole WQE: exactly `h.ds * 16` bytes.
pub(crate) fn parse_body<'a>(h: &Header, wqe: &'a [u8]) -> Result<Op<'a>, Fault> {
    // parse_ctrl checked the shape; checked again here so that no slice below can be out of range.
    let min_ds = match h.opcode {
        opcode::NOP => 1,
        opcode::ATOMIC_CS | opcode::ATOMIC_FA => 4,
        _ => 2,
    };
    if wqe.len() != h.ds as usize * SEG || (h.ds as usize) < min_ds {
        return Err(Fault::qp_op(vendor::BAD_DS));
    }
    match h.opcode {
        opcode::NOP => Ok(Op::Nop),
        opcode::RDMA_WRITE | opcode::RDMA_WRITE_IMM => {
            let remote = remote(&wqe[SEG..2 * SEG]);
            let data = &wqe[2 * SEG..];
            let payload = if !data.is_empty() && is_inline(data) {
                let h4: InlineSeg = bytemuck::pod_read_unaligned(&data[..4]);
                let len = (h4.byte_count.get() & !INLINE_SEG) as usize;
                // The header plus data, padded to 16 B, must fill the rest of the WQE exactly. (The length
                // check first keeps the ds arithmetic far from overflow.)
                if len > MAX_WQE_BYTES || wqe_ds::rdma_write_inline(len as u32) as usize != h.ds as usize {
                    return Err(Fault::qp_op(vendor::BAD_INLINE));
                }
                Payload::Inline(data.get(4..4 + len).ok_or(Fault::qp_op(vendor::BAD_INLINE))?)
            } else {
                Payload::Sges(sge_list(data)?)
            };
            let imm = (h.opcode == opcode::RDMA_WRITE_IMM).then_some(h.imm);
            Ok(Op::Write { remote, payload, imm })
        }
        opcode::RDMA_READ => Ok(Op::Read { remote: remote(&wqe[SEG..2 * SEG]), sges: sge_list(&wqe[2 * SEG..])? }),
        opcode::ATOMIC_CS | opcode::ATOMIC_FA => {
            let remote = remote(&wqe[SEG..2 * SEG]);
            let a: AtomicSeg = bytemuck::pod_read_unaligned(&wqe[2 * SEG..3 * SEG]);
            let d = &wqe[3 * SEG..4 * SEG];
            if is_inline(d) {
                return Err(Fault::qp_op(vendor::BAD_INLINE));
            }
            let sge = sge(d);
            if sge.len != 8 {
                return Err(Fault::length(vendor::ATOMIC_SGE_LEN));
            }
            let op = if h.opcode == opcode::ATOMIC_FA {
                AtomicOp::FetchAdd(a.swap_add.get())
            } else {
                AtomicOp::CompareSwap { compare: a.compare.get(), swap: a.swap_add.get() }
            };
            Ok(Op::Atomic { remote, op, sge })
        }
        // parse_ctrl admits no other opcode.
        _ => Err(Fault::qp_op(vendor::BAD_OPCODE)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gdaki_shared::prm::wqe::{fm_ce_se::CQ_UPDATE, Seg};

    const QPN: u32 = 0x123;

    fn expect(index: u16) -> Expect {
        Expect { qpn: QPN, wqe_cnt: 64, index, avail: 64 }
    }

    fn bytes(segs: &[Seg]) -> Vec<u8> {
        segs.iter().flat_map(|s| bytemuck::bytes_of(s).to_vec()).collect()
    }

    #[test]
    fn ctrl_checks_each_field() {
        let ok = CtrlSeg::new(7, opcode::RDMA_WRITE, 0, QPN, CQ_UPDATE, 3, 0, Be32::ZERO);
        let h = parse_ctrl(&ok, &expect(7)).unwrap();
        assert_eq!((h.opcode, h.ds, h.wqebbs, h.cq_update), (opcode::RDMA_WRITE, 3, 1, true));
        let cases = [
            (CtrlSeg::new(7, opcode::RDMA_WRITE, 0, QPN + 1, 0, 3, 0, Be32::ZERO), vendor::BAD_QPN),
            (CtrlSeg::new(8, opcode::RDMA_WRITE, 0, QPN, 0, 3, 0, Be32::ZERO), vendor::BAD_WQE_INDEX),
            (CtrlSeg::new(7, opcode::SEND, 0, QPN, 0, 3, 0, Be32::ZERO), vendor::BAD_OPCODE),
            (CtrlSeg::new(7, opcode::RDMA_WRITE, 1, QPN, 0, 3, 0, Be32::ZERO), vendor::BAD_OPMOD),
            (CtrlSeg::new(7, opcode::RDMA_WRITE, 0, QPN, 0x01, 3, 0, Be32::ZERO), vendor::BAD_FLAGS),
            (CtrlSeg::new(7, opcode::RDMA_WRITE, 0, QPN, 5 << 5, 3, 0, Be32::ZERO), vendor::BAD_FLAGS),
            (CtrlSeg::new(7, opcode::RDMA_WRITE, 0, QPN, 0, 1, 0, Be32::ZERO), vendor::BAD_DS),
            (CtrlSeg::new(7, opcode::NOP, 0, QPN, 0, 2, 0, Be32::ZERO), vendor::BAD_DS),
            (CtrlSeg::new(7, opcode::ATOMIC_FA, 0, QPN, 0, 3, 0, Be32::ZERO), vendor::BAD_DS),
            (CtrlSeg::new(7, opcode::RDMA_WRITE, 0, QPN, 0, 0, 0, Be32::ZERO), vendor::BAD_DS),
        ];
        for (c, v) in cases {
            assert_eq!(parse_ctrl(&c, &expect(7)).unwrap_err(), Fault::qp_op(v), "{c:?}");
        }
        let big = CtrlSeg::new(7, opcode::RDMA_WRITE, 0, QPN, 0, 9, 0, Be32::ZERO);
        let short = Expect { avail: 2, ..expect(7) };
        assert_eq!(parse_ctrl(&big, &short).unwrap_err(), Fault::qp_op(vendor::PAST_DOORBELL));
        let tiny_ring = Expect { wqe_cnt: 2, ..expect(7) };
        assert_eq!(parse_ctrl(&big, &tiny_ring).unwrap_err(), Fault::qp_op(vendor::BAD_DS));
    }

    #[test]
    fn inline_write_parses_data_and_rejects_wrong_ds() {
        let data: Vec<u8> = (0..40u8).collect();
        let ctrl = CtrlSeg::new(0, opcode::RDMA_WRITE, 0, QPN, 0, 5, 0, Be32::ZERO);
        let mut w = bytes(&[ctrl.into(), RaddrSeg::new(0x1000, Be32::new(0x155)).into()]);
        w.extend_from_slice(bytemuck::bytes_of(&InlineSeg::new(40)));
        w.extend_from_slice(&data);
        w.resize(5 * SEG, 0);
        let h = parse_ctrl(&ctrl, &expect(0)).unwrap();
        match parse_body(&h, &w).unwrap() {
            Op::Write { remote, payload: Payload::Inline(d), imm: None } => {
                assert_eq!(remote, Remote { addr: 0x1000, rkey: 0x155 });
                assert_eq!(d, &data[..]);
            }
            other => panic!("{other:?}"),
        }
        // 41 bytes need 4 + 41 = 45 → 3 segments: still ds 5; 45 bytes need 4 + 45 = 49 → 4 segments.
        w[2 * SEG..2 * SEG + 4].copy_from_slice(bytemuck::bytes_of(&InlineSeg::new(45)));
        assert_eq!(parse_body(&h, &w).unwrap_err(), Fault::qp_op(vendor::BAD_INLINE));
        w[2 * SEG..2 * SEG + 4].copy_from_slice(bytemuck::bytes_of(&InlineSeg::new(0x7fff_ffff)));
        assert_eq!(parse_body(&h, &w).unwrap_err(), Fault::qp_op(vendor::BAD_INLINE));
    }

    #[test]
    fn sges_and_atomics() {
        let ctrl = CtrlSeg::new(0, opcode::RDMA_READ, 0, QPN, 0, 4, 0, Be32::ZERO);
        let w = bytes(&[
            ctrl.into(),
            RaddrSeg::new(0x2000, Be32::new(0x255)).into(),
            DataSeg::new(16, Be32::new(0x355), 0x3000).into(),
            DataSeg::new(0, Be32::new(0x355), 0x4000).into(),
        ]);
        let h = parse_ctrl(&ctrl, &expect(0)).unwrap();
        // 16 + 2^31 bytes: over the message limit.
        assert_eq!(parse_body(&h, &w).unwrap_err(), Fault::length(vendor::MSG_TOO_LONG));

        let ctrl = CtrlSeg::new(0, opcode::ATOMIC_CS, 0, QPN, 0, 4, 0, Be32::ZERO);
        let mut w = bytes(&[
            ctrl.into(),
            RaddrSeg::new(0x2000, Be32::new(0x255)).into(),
            AtomicSeg::compare_swap(5, 9).into(),
            DataSeg::new(8, Be32::new(0x355), 0x3000).into(),
        ]);
        let h = parse_ctrl(&ctrl, &expect(0)).unwrap();
        match parse_body(&h, &w).unwrap() {
            Op::Atomic { op, sge, .. } => {
                assert_eq!(op, AtomicOp::CompareSwap { compare: 5, swap: 9 });
                assert_eq!(sge, Sge { len: 8, lkey: 0x355, addr: 0x3000 });
            }
            other => panic!("{other:?}"),
        }
        w[3 * SEG..4 * SEG].copy_from_slice(bytemuck::bytes_of(&DataSeg::new(4, Be32::new(0x355), 0x3000)));
        assert_eq!(parse_body(&h, &w).unwrap_err(), Fault::length(vendor::ATOMIC_SGE_LEN));
    }
}
