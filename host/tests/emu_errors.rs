//! Bad WQEs get the PRM's error CQE (syndrome, wqe_counter, opcode and QPN), the QP moves to the error state,
//! and every later WQE completes with a flush error (0x05). Nothing outside a registered region is written.

mod emu_util;

use std::time::Duration;

use emu_util::*;
use gdaki::nic::emu::{vendor, Access, Mr, QpState};
use gdaki_shared::prm::opcode::{self, syndrome};
use gdaki_shared::prm::wqe::{AtomicSeg, CtrlSeg, DataSeg, RaddrSeg, Seg};
use gdaki_shared::Be32;

/// A pair of connected QPs with a source buffer (local, no rights), a destination (remote, all rights) and
/// a results buffer (local, LOCAL_WRITE), all filled with known bytes.
struct Fixture {
    // Field order = drop order: MRs before the buffers they name, QPs before the NIC (held by Pair).
    src_mr: Mr,
    dst_mr: Mr,
    res_mr: Mr,
    src: GuardedBuf,
    dst: GuardedBuf,
    res: GuardedBuf,
    sq: Sq,
    cq: CqPoll,
    p: Pair,
}

impl Fixture {
    fn new() -> Self {
        let p = Pair::new(64, 64);
        let src = GuardedBuf::new(1024, 0x5a);
        let dst = GuardedBuf::new(1024, 0xc3);
        let res = GuardedBuf::new(64, 0x99);
        Fixture {
            src_mr: src.register(&p.nic, &p.pd, Access::NONE),
            dst_mr: dst.register(&p.nic, &p.pd, Access::ALL),
            res_mr: res.register(&p.nic, &p.pd, Access::LOCAL_WRITE),
            src,
            dst,
            res,
            sq: Sq::new(&p.a),
            cq: CqPoll::new(&p.cq_a),
            p,
        }
    }

    /// A good signaled 64-byte write from `src` to `dst`.
    fn good_write(&self) -> [Seg; 3] {
        self.sq.write(SIGNALED, (self.src_mr.lkey(), self.src.addr(), 64), self.dst.addr(), self.dst_mr.rkey())
    }

    /// Posts a good NOP (index 0), then `bad` (unsignaled, index 1) with the doorbell `db` (default: the
    /// ring's), then a good signaled write and an unsignaled NOP. Checks: a REQ CQE for the NOP; an error CQE
    /// with `synd`/`vend` and `opc` at index 1; flush CQEs for indices 2 and 3; the QP in the error state; no
    /// byte of any buffer or guard changed.
    fn run(&mut self, bad: impl FnOnce(&Self) -> Vec<u8>, db: Option<u64>, synd: u8, vend: u8, opc: u8) {
        let at = self.sq.post(&self.sq.nop(SIGNALED));
        assert_req(&self.cq.wait(), opcode::NOP, self.sq.qpn(), at, 0);
        let wqe = bad(self);
        let at = self.sq.put_bytes(&wqe);
        assert_eq!(at, 1);
        self.sq.dbrec();
        match db {
            Some(bits) => self.sq.doorbell_bits(bits),
            None => self.sq.doorbell(at),
        }
        let c = self.cq.wait();
        let e = assert_err(&c, synd, opc, self.sq.qpn(), 1);
        assert_eq!(e.vendor_err_synd, vend, "vendor syndrome");
        assert_eq!(self.p.a.state(), QpState::Error);
        // Later WQEs are flushed, signaled or not, and execute nothing.
        let w = self.good_write();
        let at_w = self.sq.put(&w);
        let at_n = self.sq.put(&self.sq.nop(0));
        self.sq.dbrec();
        self.sq.doorbell(at_n);
        assert_err(&self.cq.wait(), syndrome::WR_FLUSH_ERR, opcode::RDMA_WRITE, self.sq.qpn(), at_w);
        assert_err(&self.cq.wait(), syndrome::WR_FLUSH_ERR, opcode::NOP, self.sq.qpn(), at_n);
        self.cq.assert_none_for(Duration::from_millis(10));
        let s = stats_when(&self.p.nic, "the error and flush CQEs counted", |s| s.error_cqes >= 1 && s.flush_cqes >= 2);
        assert_eq!((s.error_cqes, s.flush_cqes, s.wqes), (1, 2, 1));
        assert!(self.dst.read().iter().all(|&b| b == 0xc3), "remote buffer untouched");
        assert!(self.src.read().iter().all(|&b| b == 0x5a), "source untouched");
        assert!(self.res.read().iter().all(|&b| b == 0x99), "result buffer untouched");
        assert!(self.src.guards_intact() && self.dst.guards_intact() && self.res.guards_intact());
        assert!(self.p.nic.executor_alive());
    }
}

fn bytes(segs: &[Seg]) -> Vec<u8> {
    segs.iter().flat_map(|s| bytemuck::bytes_of(s).to_vec()).collect()
}

fn ctrl(idx: u16, opc: u8, opmod: u8, qpn: u32, fm: u8, ds: u8) -> Seg {
    CtrlSeg::new(idx, opc, opmod, qpn, fm, ds, 0, Be32::ZERO).into()
}

/// A write from `src` to `dst` with the given ctrl and data segment fields.
fn write_with(c: Seg, lkey: u32, laddr: u64, len: u32, raddr: u64, rkey: u32) -> Vec<u8> {
    bytes(&[c, RaddrSeg::new(raddr, Be32::new(rkey)).into(), DataSeg::new(len, Be32::new(lkey), laddr).into()])
}

fn plain_write(f: &Fixture) -> Seg {
    ctrl(1, opcode::RDMA_WRITE, 0, f.sq.qpn(), 0, 3)
}

// ---- LOCAL_QP_OP_ERR (0x02) ----

#[test]
fn unsupported_opcode_is_local_qp_op_error() {
    for opc in [opcode::SEND, opcode::SEND_IMM, opcode::ATOMIC_MASKED_CS, 0x7f] {
        let mut f = Fixture::new();
        let bad = |f: &Fixture| {
            let c = ctrl(1, opc, 0, f.sq.qpn(), 0, 3);
            write_with(c, f.src_mr.lkey(), f.src.addr(), 8, f.dst.addr(), f.dst_mr.rkey())
        };
        f.run(bad, None, syndrome::LOCAL_QP_OP_ERR, vendor::BAD_OPCODE, opc);
    }
}

#[test]
fn wrong_qpn_is_local_qp_op_error() {
    let mut f = Fixture::new();
    let bad = |f: &Fixture| {
        let c = ctrl(1, opcode::RDMA_WRITE, 0, f.sq.qpn() ^ 1, 0, 3);
        write_with(c, f.src_mr.lkey(), f.src.addr(), 8, f.dst.addr(), f.dst_mr.rkey())
    };
    f.run(bad, None, syndrome::LOCAL_QP_OP_ERR, vendor::BAD_QPN, opcode::RDMA_WRITE);
}

#[test]
fn wrong_wqe_index_is_local_qp_op_error() {
    let mut f = Fixture::new();
    let bad = |f: &Fixture| {
        let c = ctrl(5, opcode::RDMA_WRITE, 0, f.sq.qpn(), 0, 3);
        write_with(c, f.src_mr.lkey(), f.src.addr(), 8, f.dst.addr(), f.dst_mr.rkey())
    };
    // The doorbell announces one WQEBB at index 1 (as a poster that computed the index right for the
    // doorbell but wrote a stale one into the WQE would).
    let db = CtrlSeg::new(1, opcode::RDMA_WRITE, 0, f.sq.qpn(), 0, 3, 0, Be32::ZERO).doorbell_bits();
    f.run(bad, Some(db), syndrome::LOCAL_QP_OP_ERR, vendor::BAD_WQE_INDEX, opcode::RDMA_WRITE);
}

#[test]
fn ds_that_does_not_fit_the_opcode_is_local_qp_op_error() {
    // A write of ds 1 (no raddr segment), a NOP of ds 4 and an atomic of ds 3, each in its own QP.
    let cases: [(u8, u8); 3] = [(opcode::RDMA_WRITE, 1), (opcode::NOP, 4), (opcode::ATOMIC_FA, 3)];
    for (opc, ds) in cases {
        let mut f = Fixture::new();
        let bad = |f: &Fixture| {
            let mut w = bytes(&[ctrl(1, opc, 0, f.sq.qpn(), 0, ds)]);
            w.resize(ds as usize * 16, 0);
            w
        };
        f.run(bad, None, syndrome::LOCAL_QP_OP_ERR, vendor::BAD_DS, opc);
    }
}

#[test]
fn reserved_fm_ce_se_bits_are_local_qp_op_error() {
    for fm in [0x01u8, 0x10, 0xa0] {
        let mut f = Fixture::new();
        let bad = |f: &Fixture| {
            let c = ctrl(1, opcode::RDMA_WRITE, 0, f.sq.qpn(), fm, 3);
            write_with(c, f.src_mr.lkey(), f.src.addr(), 8, f.dst.addr(), f.dst_mr.rkey())
        };
        f.run(bad, None, syndrome::LOCAL_QP_OP_ERR, vendor::BAD_FLAGS, opcode::RDMA_WRITE);
    }
}

#[test]
fn nonzero_opmod_is_local_qp_op_error() {
    let mut f = Fixture::new();
    let bad = |f: &Fixture| {
        let c = ctrl(1, opcode::RDMA_WRITE, 3, f.sq.qpn(), 0, 3);
        write_with(c, f.src_mr.lkey(), f.src.addr(), 8, f.dst.addr(), f.dst_mr.rkey())
    };
    f.run(bad, None, syndrome::LOCAL_QP_OP_ERR, vendor::BAD_OPMOD, opcode::RDMA_WRITE);
}

// ---- LOCAL_LENGTH_ERR (0x01) ----

#[test]
fn atomic_result_sge_of_4_bytes_is_local_length_error() {
    let mut f = Fixture::new();
    let bad = |f: &Fixture| {
        let mut w = bytes(&f.sq.atomic(
            opcode::ATOMIC_FA,
            0,
            AtomicSeg::fetch_add(1),
            (f.res_mr.lkey(), f.res.addr()),
            f.dst.addr(),
            f.dst_mr.rkey(),
        ));
        w[48..64].copy_from_slice(bytemuck::bytes_of(&DataSeg::new(4, Be32::new(f.res_mr.lkey()), f.res.addr())));
        w
    };
    f.run(bad, None, syndrome::LOCAL_LENGTH_ERR, vendor::ATOMIC_SGE_LEN, opcode::ATOMIC_FA);
}

// ---- LOCAL_PROT_ERR (0x04) ----

#[test]
fn bad_lkey_is_local_protection_error() {
    let mut f = Fixture::new();
    let bad = |f: &Fixture| {
        write_with(plain_write(f), f.src_mr.lkey() ^ 0x100, f.src.addr(), 8, f.dst.addr(), f.dst_mr.rkey())
    };
    f.run(bad, None, syndrome::LOCAL_PROT_ERR, vendor::BAD_LKEY, opcode::RDMA_WRITE);
}

#[test]
fn local_range_past_the_mr_is_local_protection_error() {
    let mut f = Fixture::new();
    // 1024-byte MR; bytes 1000..1025.
    let bad = |f: &Fixture| {
        write_with(plain_write(f), f.src_mr.lkey(), f.src.addr() + 1000, 25, f.dst.addr(), f.dst_mr.rkey())
    };
    f.run(bad, None, syndrome::LOCAL_PROT_ERR, vendor::LOCAL_BOUNDS, opcode::RDMA_WRITE);
}

#[test]
fn read_into_mr_without_local_write_is_local_protection_error() {
    let mut f = Fixture::new();
    let bad = |f: &Fixture| {
        bytes(&f.sq.read(0, (f.src_mr.lkey(), f.src.addr(), 64), f.dst.addr(), f.dst_mr.rkey())).into_iter().collect()
    };
    f.run(bad, None, syndrome::LOCAL_PROT_ERR, vendor::LOCAL_ACCESS, opcode::RDMA_READ);
}

#[test]
fn lkey_of_another_pd_is_local_protection_error() {
    let mut f = Fixture::new();
    let other_pd = f.p.nic.alloc_pd().unwrap();
    let other = GuardedBuf::new(64, 0x42);
    let other_mr = other.register(&f.p.nic, &other_pd, Access::ALL);
    let (key, addr) = (other_mr.lkey(), other.addr());
    let bad = move |f: &Fixture| write_with(plain_write(f), key, addr, 8, f.dst.addr(), f.dst_mr.rkey());
    f.run(bad, None, syndrome::LOCAL_PROT_ERR, vendor::LKEY_PD, opcode::RDMA_WRITE);
    drop(other_mr);
    assert!(other.read().iter().all(|&b| b == 0x42) && other.guards_intact());
}

// ---- REMOTE_ACCESS_ERR (0x13) ----

#[test]
fn bad_rkey_is_remote_access_error() {
    let mut f = Fixture::new();
    let bad = |f: &Fixture| {
        write_with(plain_write(f), f.src_mr.lkey(), f.src.addr(), 8, f.dst.addr(), f.dst_mr.rkey().wrapping_add(1))
    };
    f.run(bad, None, syndrome::REMOTE_ACCESS_ERR, vendor::BAD_RKEY, opcode::RDMA_WRITE);
}

#[test]
fn remote_range_one_byte_past_the_mr_is_remote_access_error() {
    let mut f = Fixture::new();
    let bad = |f: &Fixture| {
        write_with(plain_write(f), f.src_mr.lkey(), f.src.addr(), 64, f.dst.addr() + 1024 - 63, f.dst_mr.rkey())
    };
    f.run(bad, None, syndrome::REMOTE_ACCESS_ERR, vendor::REMOTE_BOUNDS, opcode::RDMA_WRITE);
}

#[test]
fn remote_address_before_the_mr_is_remote_access_error() {
    let mut f = Fixture::new();
    let bad =
        |f: &Fixture| write_with(plain_write(f), f.src_mr.lkey(), f.src.addr(), 8, f.dst.addr() - 8, f.dst_mr.rkey());
    f.run(bad, None, syndrome::REMOTE_ACCESS_ERR, vendor::REMOTE_BOUNDS, opcode::RDMA_WRITE);
}

#[test]
fn missing_remote_rights_are_remote_access_errors() {
    // The source MR has no remote rights: WRITE, READ and atomic to it all fail.
    let mut f = Fixture::new();
    let bad =
        |f: &Fixture| write_with(plain_write(f), f.src_mr.lkey(), f.src.addr(), 8, f.src.addr() + 512, f.src_mr.rkey());
    f.run(bad, None, syndrome::REMOTE_ACCESS_ERR, vendor::REMOTE_ACCESS, opcode::RDMA_WRITE);

    let mut f = Fixture::new();
    let bad = |f: &Fixture| bytes(&f.sq.read(0, (f.res_mr.lkey(), f.res.addr(), 8), f.src.addr(), f.src_mr.rkey()));
    f.run(bad, None, syndrome::REMOTE_ACCESS_ERR, vendor::REMOTE_ACCESS, opcode::RDMA_READ);

    let mut f = Fixture::new();
    let bad = |f: &Fixture| {
        bytes(&f.sq.atomic(
            opcode::ATOMIC_CS,
            0,
            AtomicSeg::compare_swap(0, 1),
            (f.res_mr.lkey(), f.res.addr()),
            f.src.addr(),
            f.src_mr.rkey(),
        ))
    };
    f.run(bad, None, syndrome::REMOTE_ACCESS_ERR, vendor::REMOTE_ACCESS, opcode::ATOMIC_CS);
}

// ---- REMOTE_INVAL_REQ_ERR (0x12) ----

#[test]
fn misaligned_atomic_is_remote_invalid_request() {
    let mut f = Fixture::new();
    let bad = |f: &Fixture| {
        bytes(&f.sq.atomic(
            opcode::ATOMIC_FA,
            0,
            AtomicSeg::fetch_add(1),
            (f.res_mr.lkey(), f.res.addr()),
            f.dst.addr() + 4,
            f.dst_mr.rkey(),
        ))
    };
    f.run(bad, None, syndrome::REMOTE_INVAL_REQ_ERR, vendor::ATOMIC_ALIGN, opcode::ATOMIC_FA);
}

// ---- other failures ----

#[test]
fn deregistered_mr_key_is_refused() {
    let mut f = Fixture::new();
    let gone = GuardedBuf::new(64, 0x10);
    let gone_mr = gone.register(&f.p.nic, &f.p.pd, Access::ALL);
    let (key, addr) = (gone_mr.rkey(), gone.addr());
    drop(gone_mr);
    let bad = move |f: &Fixture| write_with(plain_write(f), f.src_mr.lkey(), f.src.addr(), 8, addr, key);
    f.run(bad, None, syndrome::REMOTE_ACCESS_ERR, vendor::BAD_RKEY, opcode::RDMA_WRITE);
    assert!(gone.read().iter().all(|&b| b == 0x10));
}

#[test]
fn peer_not_connected_back_is_retry_exceeded() {
    let p = Pair::new(64, 64);
    let cq = p.nic.create_cq(64).unwrap();
    let c = p.nic.create_qp(&p.pd, &cq, 64).unwrap();
    c.connect(&p.b.endpoint()).unwrap(); // b is connected to a, not to c
    let (mut sq, mut poll) = (Sq::new(&c), CqPoll::new(&cq));
    let dst = GuardedBuf::new(64, 0);
    let rmr = dst.register(&p.nic, &p.pd, Access::ALL);
    let at = sq.post_bytes(&sq.inline_write(opcode::RDMA_WRITE, 0, &[1, 2, 3], dst.addr(), rmr.rkey(), 0));
    assert_err(&poll.wait(), syndrome::TRANSPORT_RETRY_EXC_ERR, opcode::RDMA_WRITE, c.qpn(), at);
    assert!(dst.read().iter().all(|&b| b == 0));
    // A peer that goes away: a's WQEs to b fail the same way once b is destroyed.
    let (mut sq_a, mut poll_a) = (Sq::new(&p.a), CqPoll::new(&p.cq_a));
    let Pair { a, b, cq_a: _cq_a, .. } = p;
    drop(b);
    let at = sq_a.post_bytes(&sq_a.inline_write(opcode::RDMA_WRITE, 0, &[1], dst.addr(), rmr.rkey(), 0));
    assert_err(&poll_a.wait(), syndrome::TRANSPORT_RETRY_EXC_ERR, opcode::RDMA_WRITE, a.qpn(), at);
}

#[test]
fn cq_overrun_is_an_error_and_overwrites_nothing() {
    let p = Pair::new(16, 16);
    let mut sq = Sq::new(&p.a);
    // 16 signaled NOPs fill the CQ; nobody consumes them (the CQ dbrec stays 0).
    for _ in 0..16 {
        sq.put(&sq.nop(SIGNALED));
    }
    sq.dbrec();
    sq.doorbell(15);
    wait_until("16 CQEs", || p.cq_a.produced() == 16);
    // Retire the SQ (software may: the CQEs are there) and post one more: its CQE has no room.
    let at = sq.post(&sq.nop(SIGNALED));
    wait_until("overrun", || p.nic.stats().cq_overruns == 1);
    assert!(p.cq_a.is_error());
    assert_eq!(p.a.state(), QpState::Error);
    // The 16 CQEs are intact: indices 0..16, none overwritten by the 17th.
    let mut poll = CqPoll::new(&p.cq_a);
    for i in 0..16 {
        assert_req(&poll.wait(), opcode::NOP, sq.qpn(), i, 0);
    }
    poll.assert_none_for(Duration::from_millis(20));
    assert_eq!(at, 16);
}

#[test]
fn error_cqe_is_written_for_an_unsignaled_wqe() {
    // Covered by every Fixture::run (the bad WQE is unsignaled); here the bad WQE is the very first one.
    let p = Pair::new(64, 64);
    let (mut sq, mut cq) = (Sq::new(&p.a), CqPoll::new(&p.cq_a));
    let at = sq.post(&sq.write(0, (0, 0x1000, 8), 0x2000, 0));
    let e = assert_err(&cq.wait(), syndrome::LOCAL_PROT_ERR, opcode::RDMA_WRITE, sq.qpn(), at);
    assert_eq!(e.vendor_err_synd, vendor::BAD_LKEY);
}
