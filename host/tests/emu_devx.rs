//! The emulated NIC's firmware commands (DevX mailboxes, `EmuNic::devx_cmd`): bad commands, each answered
//! with its status and syndrome and changing nothing; a QP created and moved RST → INIT → RTR → RTS by
//! commands alone, QUERY_QP reading each state back; traffic between QPs made purely of commands, on one NIC
//! and over the wire, with the queues in umems the test registered and handles the test built.

mod emu_util;

use std::sync::Arc;
use std::time::{Duration, Instant};

use emu_util::{assert_err, assert_req, random_bytes, rng, CqPoll, GuardedBuf, Sq, SIGNALED};
use gdaki::mem::MemKind;
use gdaki::nic::devx::{self, AddressPath, CqAttr, EmuObj, Grh, Init2Rtr, QpAttr, Rq, Rst2Init, Rtr2Rts, Transport};
use gdaki::nic::emu::{
    cmd_syndrome as syn, gid_of, Access, DevxUar, EmuConfig, EmuNic, Endpoint, Pd, QpState, WireConfig,
};
use gdaki::{EmuError, Error};
use gdaki_shared::handle::{CqHandle, Placement, QpHandle};
use gdaki_shared::prm::cmd::{
    ads, cmd_hca_cap, cqc, create_cq_in, create_cq_out, create_qp_in, create_qp_out, init2rtr_qp_in, mbox_out, opcode,
    qpc, query_qp_out, rst2init_qp_in, status, Field,
};
use gdaki_shared::prm::cqe::OP_OWN_INVALID;
use gdaki_shared::prm::opcode as wqe_op;
use gdaki_shared::prm::opcode::syndrome as cqe_syndrome;
use gdaki_shared::prm::wqe::AtomicSeg;
use gdaki_shared::Be64;
use rand::RngExt;

/// CQEs of the test's CQs, WQEBBs of its SQs.
const NCQE: u32 = 64;
const WQE_CNT: u32 = 64;

/// A CQ's umem: the ring at offset 0, the doorbell record after it.
struct CqMem {
    umem: u32,
    addr: u64,
    ncqe: u32,
}

/// A QP's umem: the SQ at offset 0 (no receive queue), the doorbell record after it.
struct QpMem {
    umem: u32,
    addr: u64,
    wqe_cnt: u32,
}

fn open() -> (Arc<EmuNic>, Pd) {
    let nic = EmuNic::open(EmuConfig::host()).unwrap();
    let pd = nic.alloc_pd().unwrap();
    (nic, pd)
}

/// Registers a umem for a CQ of `ncqe` entries plus 64 bytes for its doorbell record, with the ring prepared
/// as software prepares it (every `op_own` INVALID).
fn cq_mem(nic: &EmuNic, ncqe: u32, access: Access) -> CqMem {
    let buf = nic.alloc_umem_buf(ncqe as usize * 64 + 64, MemKind::Host).unwrap();
    let (addr, host) = (buf.device_addr(), buf.host_ptr().unwrap());
    for i in 0..ncqe as usize {
        // SAFETY: byte 63 of entry `i` of the ring, inside the buffer; no NIC uses it yet.
        unsafe { host.add(i * 64 + 63).write(OP_OWN_INVALID) };
    }
    CqMem { umem: nic.devx_umem_reg(buf, access).unwrap(), addr, ncqe }
}

/// Registers a umem for an SQ of `wqe_cnt` WQEBBs plus 64 bytes for its doorbell record.
fn qp_mem(nic: &EmuNic, wqe_cnt: u32) -> QpMem {
    let buf = nic.alloc_umem_buf(wqe_cnt as usize * 64 + 64, MemKind::Host).unwrap();
    let addr = buf.device_addr();
    QpMem { umem: nic.devx_umem_reg(buf, Access::LOCAL_WRITE).unwrap(), addr, wqe_cnt }
}

fn cq_attr(m: &CqMem, uar: u32) -> CqAttr {
    CqAttr {
        log_cq_size: m.ncqe.ilog2() as u8,
        uar_page: uar,
        c_eqn: 0,
        umem_id: m.umem,
        umem_offset: 0,
        dbr_umem_id: m.umem,
        dbr_offset: m.ncqe as u64 * 64,
    }
}

fn qp_attr(m: &QpMem, pd: u32, cqn: u32, uar: u32) -> QpAttr {
    QpAttr {
        pd,
        log_sq_size: m.wqe_cnt.ilog2() as u8,
        rq: Rq::None,
        cqn_snd: cqn,
        cqn_rcv: cqn,
        uar_page: uar,
        log_msg_max: 31,
        ts_format: qpc::ts_format::DEFAULT,
        wq_umem_id: m.umem,
        wq_umem_offset: 0,
        dbr_umem_id: m.umem,
        dbr_offset: m.wqe_cnt as u64 * 64,
    }
}

fn cq_handle(m: &CqMem, cqn: u32) -> CqHandle {
    CqHandle {
        buf: m.addr,
        dbrec: m.addr + m.ncqe as u64 * 64,
        ncqe: m.ncqe,
        cqn,
        cons_index: 0,
        placement: Placement::HOST,
        pad: 0,
    }
}

fn qp_handle(m: &QpMem, uar: &DevxUar, qpn: u32, cq: CqHandle) -> QpHandle {
    QpHandle {
        sq_buf: m.addr,
        dbrec: m.addr + m.wqe_cnt as u64 * 64,
        bf_reg: uar.reg_addr(),
        bf_size: gdaki_shared::prm::uar::BF_WRITE_SIZE as u32,
        wqe_cnt: m.wqe_cnt,
        qpn,
        cq,
        placement: Placement::HOST,
        ..QpHandle::default()
    }
}

/// Sets field `f` of `inbox` to `v` (a test's mutation of a valid command).
fn with(mut inbox: Vec<u8>, f: Field, v: u64) -> Vec<u8> {
    f.set(&mut inbox, v).unwrap();
    inbox
}

/// Runs `inbox` expecting failure with `st` and `syndrome`: the error names the command and the status, and
/// the output mailbox carries both.
fn refused(nic: &EmuNic, what: &str, inbox: &[u8], out_len: usize, st: u8, syndrome: u32) {
    let mut out = vec![0xa5u8; out_len];
    match nic.devx_cmd(inbox, &mut out) {
        Err(e @ Error::DevxCmd { .. }) => {
            let Error::DevxCmd { status: s, syndrome: y, opcode: op, .. } = e else { unreachable!() };
            assert_eq!((s, y), (st, syndrome), "{what}: {e}");
            let text = e.to_string();
            if let Some(name) = opcode::name(op) {
                assert!(text.contains(name), "{what}: {text:?} does not name {name}");
            }
            assert!(text.contains(status::name(st).unwrap()), "{what}: {text:?} does not name the status");
            assert!(text.contains(&format!("{syndrome:#x}")), "{what}: {text:?} does not give the syndrome");
        }
        other => panic!("{what}: expected status {st:#x} syndrome {syndrome:#x}, got {other:?}"),
    }
    if out_len >= 8 {
        assert_eq!(mbox_out::check(&out), Ok(Err(mbox_out::CmdError { status: st, syndrome })), "{what}: output");
    }
}

/// The QP's state as QUERY_QP reports it.
fn state(nic: &EmuNic, qpn: u32) -> u8 {
    devx::query_qp(nic, &EmuObj::Qp(qpn), qpn).unwrap().state()
}

fn all_rights() -> Rst2Init {
    Rst2Init { port: 1, pkey_index: 0, remote_read: true, remote_write: true, remote_atomic: true }
}

/// INIT2RTR's attributes to reach QP `remote_qpn` of the NIC whose GID is `rgid`.
fn rtr(remote_qpn: u32, rq_psn: u32, rgid: [u8; 16]) -> Init2Rtr {
    Init2Rtr {
        remote_qpn,
        rq_psn,
        mtu: qpc::mtu::MTU_1K,
        log_msg_max: 31,
        min_rnr_nak: 12,
        log_rra_max: 4,
        port: 1,
        path: AddressPath::RoceV2 {
            grh: Grh { rgid, src_addr_index: 0, hop_limit: 64, tclass: 0, flow_label: 0 },
            rmac: [2, 0, 0, 0, 0, 1],
            udp_sport: 0xc001,
            eth_prio: 0,
        },
    }
}

fn rts(sq_psn: u32) -> Rtr2Rts {
    Rtr2Rts { sq_psn, ack_timeout: 14, retry_count: 7, rnr_retry: 7, log_sra_max: 4, port: 1 }
}

/// Moves QP `qpn` to RTS with remote rights `rights`, INIT2RTR attributes `rtr` and first PSN `sq_psn`.
fn connect(nic: &EmuNic, qpn: u32, rights: &Rst2Init, rtr: &Init2Rtr, sq_psn: u32) {
    let obj = EmuObj::Qp(qpn);
    devx::rst2init(nic, &obj, qpn, rights).unwrap();
    devx::init2rtr(nic, &obj, qpn, rtr).unwrap();
    devx::rtr2rts(nic, &obj, qpn, &rts(sq_psn)).unwrap();
}

/// Destroys QP `qpn` through the transport (DESTROY_QP).
fn destroy_qp(nic: &EmuNic, qpn: u32) {
    nic.obj_destroy(EmuObj::Qp(qpn)).unwrap();
}

#[test]
fn bad_cq_commands_are_refused_with_their_status_and_syndrome_and_change_nothing() {
    let (nic, _pd) = open();
    let uar = nic.devx_alloc_uar().unwrap();
    let m = cq_mem(&nic, NCQE, Access::LOCAL_WRITE);
    let readonly = cq_mem(&nic, NCQE, Access::NONE);
    let good = devx::create_cq_in(&cq_attr(&m, uar.page_id)).unwrap().to_vec();
    let ctx = create_cq_in::cq_context;
    let out = create_cq_out::SIZE;
    let mut padded = good.clone();
    padded.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 1]);
    let cases: Vec<(&str, Vec<u8>, usize, u8, u32)> = vec![
        ("unknown opcode", with(good.clone(), create_cq_in::OPCODE, 0x7ff), out, status::BAD_OP, syn::BAD_OPCODE),
        ("op_mod not 0", with(good.clone(), create_cq_in::OP_MOD, 1), out, status::BAD_OP, syn::BAD_OP_MOD),
        ("inbox shorter than the header", good[..8].to_vec(), out, status::BAD_INP_LEN, syn::SHORT_INBOX),
        ("inbox shorter than CREATE_CQ", good[..100].to_vec(), out, status::BAD_INP_LEN, syn::SHORT_INBOX),
        ("outbox shorter than CREATE_CQ's output", good.clone(), 8, status::BAD_OUTP_LEN, syn::SHORT_OUTBOX),
        (
            "unknown cq_umem_id",
            with(good.clone(), create_cq_in::CQ_UMEM_ID, 999),
            out,
            status::BAD_RES,
            syn::UMEM_UNKNOWN,
        ),
        (
            "ring past the umem's registration",
            with(good.clone(), create_cq_in::CQ_UMEM_OFFSET, 4096),
            out,
            status::BAD_PARAM,
            syn::UMEM_RANGE,
        ),
        (
            "ring offset not 64-aligned",
            with(good.clone(), create_cq_in::CQ_UMEM_OFFSET, 32),
            out,
            status::BAD_PARAM,
            syn::UMEM_ALIGN,
        ),
        (
            "ring in a umem without LOCAL_WRITE",
            with(good.clone(), create_cq_in::CQ_UMEM_ID, readonly.umem.into()),
            out,
            status::BAD_PARAM,
            syn::UMEM_ACCESS,
        ),
        (
            "page list (cq_umem_valid 0)",
            with(good.clone(), create_cq_in::CQ_UMEM_VALID, 0),
            out,
            status::BAD_PARAM,
            syn::PAGE_LIST,
        ),
        (
            "dbr_addr not 8-aligned",
            with(good.clone(), ctx(cqc::DBR_ADDR), 4100),
            out,
            status::BAD_PARAM,
            syn::DBR_ALIGN,
        ),
        ("dbr past the umem", with(good.clone(), ctx(cqc::DBR_ADDR), 4160), out, status::BAD_PARAM, syn::DBR_RANGE),
        (
            "unknown dbr_umem_id",
            with(good.clone(), ctx(cqc::DBR_UMEM_ID), 999),
            out,
            status::BAD_RES,
            syn::DBR_UMEM_UNKNOWN,
        ),
        (
            "dbr not in a umem",
            with(good.clone(), ctx(cqc::DBR_UMEM_VALID), 0),
            out,
            status::BAD_PARAM,
            syn::DBR_NOT_UMEM,
        ),
        ("log_cq_size 23", with(good.clone(), ctx(cqc::LOG_CQ_SIZE), 23), out, status::BAD_PARAM, syn::LOG_CQ_SIZE),
        ("log_cq_size 31", with(good.clone(), ctx(cqc::LOG_CQ_SIZE), 31), out, status::BAD_PARAM, syn::LOG_CQ_SIZE),
        ("128-byte CQEs", with(good.clone(), ctx(cqc::CQE_SZ), 1), out, status::BAD_PARAM, syn::CQE_SZ),
        ("unknown uar_page", with(good.clone(), ctx(cqc::UAR_PAGE), 999), out, status::BAD_RES, syn::UAR_UNKNOWN),
        (
            "overrun ignore (not modelled)",
            with(good.clone(), ctx(cqc::OI), 1),
            out,
            status::BAD_PARAM,
            syn::NOT_TAKEN | ctx(cqc::OI).off(),
        ),
        (
            "reserved bit 0x62 of the cqc",
            with(good.clone(), Field::new(create_cq_in::CQ_CONTEXT + 0x62, 1), 1),
            out,
            status::BAD_PARAM,
            syn::RESERVED | (create_cq_in::CQ_CONTEXT + 0x62),
        ),
        (
            "a page list after the input",
            padded,
            out,
            status::BAD_PARAM,
            syn::RESERVED | ((create_cq_in::SIZE as u32 + 7) * 8 + 7),
        ),
    ];
    for (what, inbox, out_len, st, s) in &cases {
        refused(&nic, what, inbox, *out_len, *st, *s);
    }
    // Nothing was made: the next CQ gets the first CQN, both umems deregister (no CQ uses them), and the
    // valid command still works.
    let mut o = [0u8; create_cq_out::SIZE];
    nic.devx_cmd(&good, &mut o).unwrap();
    assert_eq!(create_cq_out::cqn(&o), 1, "no CQN was taken by a refused command");
    nic.devx_umem_dereg(readonly.umem).unwrap();
    // The CQ made last uses `m`'s umem: busy until it is destroyed.
    assert!(nic.devx_umem_dereg(m.umem).is_err());
    assert!(nic.devx_free_uar(uar.page_id).is_err());
    nic.devx_cmd(&devx::destroy_cq_in(1).unwrap(), &mut [0u8; 16]).unwrap();
    refused(&nic, "DESTROY_CQ twice", &devx::destroy_cq_in(1).unwrap(), 16, status::BAD_RES, syn::CQN_UNKNOWN);
    nic.devx_umem_dereg(m.umem).unwrap();
    nic.devx_free_uar(uar.page_id).unwrap();
}

#[test]
fn bad_qp_commands_are_refused_with_their_status_and_syndrome_and_change_nothing() {
    let (nic, pd) = open();
    let (cq_uar, qp_uar) = (nic.devx_alloc_uar().unwrap(), nic.devx_alloc_uar().unwrap());
    let cm = cq_mem(&nic, NCQE, Access::LOCAL_WRITE);
    let cq = devx::create_cq(&*nic, &cq_attr(&cm, cq_uar.page_id)).unwrap();
    let bm = cq_mem(&nic, 1 << 15, Access::LOCAL_WRITE);
    let big = devx::create_cq(&*nic, &cq_attr(&bm, cq_uar.page_id)).unwrap();
    let qm = qp_mem(&nic, WQE_CNT);
    let good = devx::create_qp_in(&qp_attr(&qm, pd.pdn(), cq.id, qp_uar.page_id)).unwrap().to_vec();
    let q = create_qp_in::qpc;
    let out = create_qp_out::SIZE;
    let cases: Vec<(&str, Vec<u8>, usize, u8, u32)> = vec![
        ("inbox shorter than CREATE_QP", good[..200].to_vec(), out, status::BAD_INP_LEN, syn::SHORT_INBOX),
        ("outbox of 12 bytes", good.clone(), 12, status::BAD_OUTP_LEN, syn::SHORT_OUTBOX),
        (
            "log_sq_size 3 (8 WQEBBs)",
            with(good.clone(), q(qpc::LOG_SQ_SIZE), 3),
            out,
            status::BAD_PARAM,
            syn::LOG_SQ_SIZE,
        ),
        // The 4-bit field cannot say more than 2^15 WQEBBs, the emulator's most: 2^15 are past this umem.
        (
            "log_sq_size 15 past the umem",
            with(with(good.clone(), q(qpc::LOG_SQ_SIZE), 15), q(qpc::CQN_SND), big.id.into()),
            out,
            status::BAD_PARAM,
            syn::UMEM_RANGE,
        ),
        (
            "SQ of 128 on a CQ of 64",
            with(good.clone(), q(qpc::LOG_SQ_SIZE), 7),
            out,
            status::BAD_PARAM,
            syn::CQ_TOO_SMALL,
        ),
        ("unknown cqn_snd", with(good.clone(), q(qpc::CQN_SND), 77), out, status::BAD_RES, syn::CQN_SND_UNKNOWN),
        ("unknown cqn_rcv", with(good.clone(), q(qpc::CQN_RCV), 77), out, status::BAD_RES, syn::CQN_RCV_UNKNOWN),
        ("unknown pd", with(good.clone(), q(qpc::PD), 0x4242), out, status::BAD_RES, syn::PD_UNKNOWN),
        ("st UD", with(good.clone(), q(qpc::ST), qpc::st::UD.into()), out, status::BAD_PARAM, syn::ST),
        ("pm_state ARMED", with(good.clone(), q(qpc::PM_STATE), 0), out, status::BAD_PARAM, syn::PM_STATE),
        ("an SRQ", with(good.clone(), q(qpc::RQ_TYPE), qpc::rq_type::SRQ.into()), out, status::BAD_PARAM, syn::RQ_TYPE),
        (
            "log_rq_size without an RQ",
            with(good.clone(), q(qpc::LOG_RQ_SIZE), 2),
            out,
            status::BAD_PARAM,
            syn::RQ_SHAPE,
        ),
        ("real-time timestamps", with(good.clone(), q(qpc::TS_FORMAT), 2), out, status::BAD_PARAM, syn::TS_FORMAT),
        (
            "opt_param_mask",
            with(good.clone(), create_qp_in::OPT_PARAM_MASK, 1),
            out,
            status::BAD_PARAM,
            syn::OPT_PARAM_MASK,
        ),
        (
            "page list (wq_umem_valid 0)",
            with(good.clone(), create_qp_in::WQ_UMEM_VALID, 0),
            out,
            status::BAD_PARAM,
            syn::PAGE_LIST,
        ),
        (
            "unknown wq_umem_id",
            with(good.clone(), create_qp_in::WQ_UMEM_ID, 999),
            out,
            status::BAD_RES,
            syn::UMEM_UNKNOWN,
        ),
        (
            "SQ past the umem",
            with(good.clone(), create_qp_in::WQ_UMEM_OFFSET, 128),
            out,
            status::BAD_PARAM,
            syn::UMEM_RANGE,
        ),
        (
            "SQ offset not 64-aligned",
            with(good.clone(), create_qp_in::WQ_UMEM_OFFSET, 8),
            out,
            status::BAD_PARAM,
            syn::UMEM_ALIGN,
        ),
        ("dbr_addr not 8-aligned", with(good.clone(), q(qpc::DBR_ADDR), 4097), out, status::BAD_PARAM, syn::DBR_ALIGN),
        ("dbr past the umem", with(good.clone(), q(qpc::DBR_ADDR), 1 << 20), out, status::BAD_PARAM, syn::DBR_RANGE),
        ("unknown uar_page", with(good.clone(), q(qpc::UAR_PAGE), 999), out, status::BAD_RES, syn::UAR_UNKNOWN),
        (
            "remote_qpn at create (INIT2RTR's field)",
            with(good.clone(), q(qpc::REMOTE_QPN), 5),
            out,
            status::BAD_PARAM,
            syn::NOT_TAKEN | q(qpc::REMOTE_QPN).off(),
        ),
        (
            "reserved bit 0 of create_qp_in's second dword after opcode",
            with(good.clone(), Field::new(0x20, 1), 1),
            out,
            status::BAD_PARAM,
            syn::RESERVED | 0x20,
        ),
        (
            "reserved bits inside the qpc (after pd's byte)",
            with(good.clone(), Field::new(create_qp_in::QPC + 0x20, 8), 0x10),
            out,
            status::BAD_PARAM,
            syn::RESERVED | (create_qp_in::QPC + 0x23),
        ),
    ];
    for (what, inbox, out_len, st, s) in &cases {
        refused(&nic, what, inbox, *out_len, *st, *s);
    }
    // Nothing was made: the valid command gets the first QPN, and the UAR page is then taken.
    let mut o = [0u8; create_qp_out::SIZE];
    nic.devx_cmd(&good, &mut o).unwrap();
    let qpn = create_qp_out::qpn(&o);
    assert_eq!(qpn, 0x100, "no QPN was taken by a refused command");
    refused(&nic, "a second QP on the same UAR page", &good, out, status::RES_BUSY, syn::UAR_IN_USE);
    // A CQ a QP completes into cannot be destroyed, nor its umem deregistered.
    let d = devx::destroy_cq_in(cq.id).unwrap();
    refused(&nic, "DESTROY_CQ of a CQ in use", &d, 16, status::RES_BUSY, syn::CQ_IN_USE);
    assert!(nic.devx_umem_dereg(cm.umem).is_err() && nic.devx_umem_dereg(qm.umem).is_err());
    assert_eq!(state(&nic, qpn), qpc::state::RST);
    destroy_qp(&nic, qpn);
    nic.devx_cmd(&d, &mut [0u8; 16]).unwrap();
    nic.obj_destroy(big.obj).unwrap();
    nic.devx_umem_dereg(qm.umem).unwrap();
    nic.devx_umem_dereg(cm.umem).unwrap();
    nic.devx_umem_dereg(bm.umem).unwrap();
}

/// A NIC with a PD, a CQ and a QP in RST made by commands.
struct OneQp {
    nic: Arc<EmuNic>,
    _pd: Pd,
    qpn: u32,
    cqn: u32,
}

impl OneQp {
    fn new() -> Self {
        let (nic, pd) = open();
        let (cu, qu) = (nic.devx_alloc_uar().unwrap(), nic.devx_alloc_uar().unwrap());
        let cm = cq_mem(&nic, NCQE, Access::LOCAL_WRITE);
        let cqn = devx::create_cq(&*nic, &cq_attr(&cm, cu.page_id)).unwrap().id;
        let qm = qp_mem(&nic, WQE_CNT);
        let qpn = devx::create_qp(&*nic, &qp_attr(&qm, pd.pdn(), cqn, qu.page_id)).unwrap().id;
        Self { nic, _pd: pd, qpn, cqn }
    }
}

#[test]
fn illegal_transitions_and_bad_attributes_are_refused_and_leave_the_state() {
    let t = OneQp::new();
    let (nic, qpn) = (&t.nic, t.qpn);
    let gid = nic.gid();
    let rtr_in = devx::init2rtr_in(qpn, &rtr(qpn, 1, gid)).unwrap().to_vec();
    let rts_in = devx::rtr2rts_in(qpn, &rts(2)).unwrap().to_vec();
    let init_in = devx::rst2init_in(qpn, &all_rights()).unwrap().to_vec();
    let out = 16;
    let bad = status::BAD_QP_STATE;
    refused(nic, "RST -> RTR", &rtr_in, out, bad, syn::BAD_STATE);
    refused(nic, "RST -> RTS", &rts_in, out, bad, syn::BAD_STATE);
    let path = |f: Field| f.at(rst2init_qp_in::QPC + qpc::PRIMARY_ADDRESS_PATH);
    refused(
        nic,
        "RST2INIT on port 2",
        &with(init_in.clone(), path(ads::VHCA_PORT_NUM), 2),
        out,
        status::BAD_PARAM,
        syn::PORT,
    );
    refused(
        nic,
        "RST2INIT with pkey_index 1",
        &with(init_in.clone(), path(ads::PKEY_INDEX), 1),
        out,
        status::BAD_PARAM,
        syn::PKEY_INDEX,
    );
    refused(
        nic,
        "RST2INIT with opt_param_mask",
        &with(init_in.clone(), rst2init_qp_in::OPT_PARAM_MASK, 4),
        out,
        status::BAD_PARAM,
        syn::OPT_PARAM_MASK,
    );
    refused(
        nic,
        "RST2INIT with mtu (INIT2RTR's field)",
        &with(init_in.clone(), qpc::MTU.at(rst2init_qp_in::QPC), 3),
        out,
        status::BAD_PARAM,
        syn::NOT_TAKEN | qpc::MTU.at(rst2init_qp_in::QPC).off(),
    );
    assert_eq!(state(nic, qpn), qpc::state::RST);
    nic.devx_cmd(&init_in, &mut [0u8; 16]).unwrap();
    assert_eq!(state(nic, qpn), qpc::state::INIT);
    refused(nic, "INIT -> INIT", &init_in, out, bad, syn::BAD_STATE);
    refused(nic, "INIT -> RTS", &rts_in, out, bad, syn::BAD_STATE);
    let rpath = |f: Field| f.at(init2rtr_qp_in::QPC + qpc::PRIMARY_ADDRESS_PATH);
    let rgid = ads::RGID_RIP.at(init2rtr_qp_in::QPC + qpc::PRIMARY_ADDRESS_PATH);
    let mut other_gid = rtr_in.clone();
    rgid.set(&mut other_gid, &gid_of(0x1234)).unwrap();
    let mut not_emulated = rtr_in.clone();
    rgid.set(&mut not_emulated, &[0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]).unwrap();
    let rtr_cases: Vec<(&str, Vec<u8>, u32)> = vec![
        ("mtu 0", with(rtr_in.clone(), qpc::MTU.at(init2rtr_qp_in::QPC), 0), syn::MTU),
        ("mtu 7 (raw Ethernet)", with(rtr_in.clone(), qpc::MTU.at(init2rtr_qp_in::QPC), 7), syn::MTU),
        ("remote_qpn of no QP", with(rtr_in.clone(), qpc::REMOTE_QPN.at(init2rtr_qp_in::QPC), 0x4321), syn::REMOTE_QPN),
        ("an rlid on RoCE", with(rtr_in.clone(), rpath(ads::RLID), 7), syn::RLID),
        ("src_addr_index 3", with(rtr_in.clone(), rpath(ads::SRC_ADDR_INDEX), 3), syn::SRC_ADDR_INDEX),
        ("hop_limit 0", with(rtr_in.clone(), rpath(ads::HOP_LIMIT), 0), syn::HOP_LIMIT),
        ("a GID that is no emulated NIC's", not_emulated, syn::RGID),
        ("another NIC, and no wire", other_gid, syn::NO_WIRE),
    ];
    for (what, inbox, s) in &rtr_cases {
        refused(nic, what, inbox, out, status::BAD_PARAM, *s);
    }
    assert_eq!(state(nic, qpn), qpc::state::INIT);
    nic.devx_cmd(&rtr_in, &mut [0u8; 16]).unwrap();
    assert_eq!(state(nic, qpn), qpc::state::RTR);
    refused(nic, "RTR -> INIT", &init_in, out, bad, syn::BAD_STATE);
    refused(nic, "RTR -> RTR", &rtr_in, out, bad, syn::BAD_STATE);
    refused(
        nic,
        "RTR2RTS on port 3",
        &with(rts_in.clone(), rpath(ads::VHCA_PORT_NUM), 3),
        out,
        status::BAD_PARAM,
        syn::PORT,
    );
    nic.devx_cmd(&rts_in, &mut [0u8; 16]).unwrap();
    assert_eq!(state(nic, qpn), qpc::state::RTS);
    refused(nic, "RTS -> INIT", &init_in, out, bad, syn::BAD_STATE);
    refused(nic, "RTS -> RTS", &rts_in, out, bad, syn::BAD_STATE);
    // Any state to ERR, ERR to ERR, and nothing out of ERR.
    let err_in = devx::qp_2err_in(qpn).unwrap();
    nic.devx_cmd(&err_in, &mut [0u8; 16]).unwrap();
    assert_eq!(state(nic, qpn), qpc::state::ERR);
    nic.devx_cmd(&err_in, &mut [0u8; 16]).unwrap();
    refused(nic, "ERR -> RTS", &rts_in, out, bad, syn::BAD_STATE);
    refused(nic, "ERR -> INIT", &init_in, out, bad, syn::BAD_STATE);
    // Unknown and destroyed QPs.
    let ghost = devx::rst2init_in(0x0bad, &all_rights()).unwrap();
    refused(nic, "RST2INIT of an unknown QPN", &ghost, out, status::BAD_RES, syn::QPN_UNKNOWN);
    destroy_qp(nic, qpn);
    refused(nic, "RST2INIT of a destroyed QP", &init_in, out, status::BAD_RES, syn::QPN_UNKNOWN);
    refused(nic, "2ERR of a destroyed QP", &err_in, out, status::BAD_RES, syn::QPN_UNKNOWN);
    refused(
        nic,
        "QUERY_QP of a destroyed QP",
        &devx::query_qp_in(qpn).unwrap(),
        query_qp_out::SIZE,
        status::BAD_RES,
        syn::QPN_UNKNOWN,
    );
    refused(nic, "DESTROY_QP twice", &devx::destroy_qp_in(qpn).unwrap(), 16, status::BAD_RES, syn::QPN_UNKNOWN);
    // Its CQ is free again.
    nic.devx_cmd(&devx::destroy_cq_in(t.cqn).unwrap(), &mut [0u8; 16]).unwrap();
}

#[test]
fn create_and_connect_by_commands_and_query_each_state() {
    let (nic, pd) = open();
    let cu = nic.devx_alloc_uar().unwrap();
    let cm = cq_mem(&nic, NCQE, Access::LOCAL_WRITE);
    let cqn = devx::create_cq(&*nic, &cq_attr(&cm, cu.page_id)).unwrap().id;
    let (ua, ub) = (nic.devx_alloc_uar().unwrap(), nic.devx_alloc_uar().unwrap());
    let (ma, mb) = (qp_mem(&nic, WQE_CNT), qp_mem(&nic, WQE_CNT));
    let a = devx::create_qp(&*nic, &qp_attr(&ma, pd.pdn(), cqn, ua.page_id)).unwrap().id;
    let b = devx::create_qp(&*nic, &qp_attr(&mb, pd.pdn(), cqn, ub.page_id)).unwrap().id;
    let q = devx::query_qp(&*nic, &EmuObj::Qp(a), a).unwrap();
    assert_eq!(q.state(), qpc::state::RST);
    assert_eq!((q.get(qpc::PD), q.get(qpc::LOG_SQ_SIZE), q.get(qpc::CQN_SND)), (pd.pdn().into(), 6, cqn.into()));
    assert_eq!((q.get(qpc::ST), q.get(qpc::UAR_PAGE)), (qpc::st::RC.into(), ua.page_id.into()));
    let obj = EmuObj::Qp(a);
    devx::rst2init(&*nic, &obj, a, &all_rights()).unwrap();
    let q = devx::query_qp(&*nic, &obj, a).unwrap();
    assert_eq!(q.state(), qpc::state::INIT);
    assert_eq!((q.get(qpc::RRE), q.get(qpc::RWE), q.get(qpc::RAE)), (1, 1, 1));
    devx::init2rtr(&*nic, &obj, a, &rtr(b, 0x777, nic.gid())).unwrap();
    let q = devx::query_qp(&*nic, &obj, a).unwrap();
    assert_eq!(q.state(), qpc::state::RTR);
    assert_eq!((q.get(qpc::REMOTE_QPN), q.get(qpc::NEXT_RCV_PSN)), (b.into(), 0x777));
    assert_eq!(q.get(qpc::MTU), qpc::mtu::MTU_1K.into());
    assert_eq!(q.get(qpc::primary_address_path(ads::HOP_LIMIT)), 64);
    devx::rtr2rts(&*nic, &obj, a, &rts(0x555)).unwrap();
    let q = devx::query_qp(&*nic, &obj, a).unwrap();
    assert_eq!(q.state(), qpc::state::RTS);
    assert_eq!((q.get(qpc::NEXT_SEND_PSN), q.get(qpc::RETRY_COUNT)), (0x555, 7));
    assert_eq!(q.get(qpc::HW_SQ_WQEBB_COUNTER), 0);
    // QUERY_HCA_CAP states the limits the commands were checked against.
    let cap = devx::query_hca_cap(&*nic).unwrap();
    assert_eq!(cap.get(cmd_hca_cap::LOG_MAX_QP_SZ), 15);
    assert_eq!(cap.get(cmd_hca_cap::LOG_MAX_CQ_SZ), 22);
    assert_eq!(cap.get(cmd_hca_cap::PORT_TYPE), cmd_hca_cap::port_type::ETH.into());
    assert_eq!(cap.get(cmd_hca_cap::RC), 1);
    let bad_cap = with(devx::query_hca_cap_in().to_vec(), gdaki_shared::prm::cmd::query_hca_cap_in::OP_MOD, 2);
    refused(
        &nic,
        "QUERY_HCA_CAP of another page",
        &bad_cap,
        gdaki_shared::prm::cmd::query_hca_cap_out::SIZE,
        status::BAD_OP,
        syn::BAD_OP_MOD,
    );
}

/// Two QPs made and connected by commands alone, posting through handles the test built from its own umems.
struct CmdPair {
    a: QpHandle,
    b: QpHandle,
    cq_a: CqHandle,
    cq_b: CqHandle,
}

/// Makes QP `a` on `na` and QP `b` on `nb` (possibly the same NIC), each with its own CQ, connected to each
/// other; `rights` are `b`'s remote rights, `log_msg_max` `a`'s (at CREATE_QP and INIT2RTR).
fn cmd_pair(na: &EmuNic, pa: u32, nb: &EmuNic, pb: u32, rights: Rst2Init, log_msg_max: u8) -> CmdPair {
    let make = |nic: &EmuNic, pd: u32, log_msg_max: u8| {
        let cu = nic.devx_alloc_uar().unwrap();
        let cm = cq_mem(nic, NCQE, Access::LOCAL_WRITE);
        let cqn = devx::create_cq(nic, &cq_attr(&cm, cu.page_id)).unwrap().id;
        let qu = nic.devx_alloc_uar().unwrap();
        let qm = qp_mem(nic, WQE_CNT);
        let qpn = devx::create_qp(nic, &QpAttr { log_msg_max, ..qp_attr(&qm, pd, cqn, qu.page_id) }).unwrap().id;
        let cq = cq_handle(&cm, cqn);
        (qp_handle(&qm, &qu, qpn, cq), cq)
    };
    let (a, cq_a) = make(na, pa, log_msg_max);
    let (b, cq_b) = make(nb, pb, 31);
    let mut r = rng();
    let (psn_a, psn_b) = (r.random::<u32>() & 0xff_ffff, r.random::<u32>() & 0xff_ffff);
    connect(na, a.qpn, &all_rights(), &Init2Rtr { log_msg_max, ..rtr(b.qpn, psn_b, nb.gid()) }, psn_a);
    connect(nb, b.qpn, &rights, &rtr(a.qpn, psn_a, na.gid()), psn_b);
    CmdPair { a, b, cq_a, cq_b }
}

/// Ping-pong of random payloads: `a` WRITEs into `b`'s buffer, `b` WRITEs it back into `a`'s, each leg
/// checked, then a fetch-add of `a` on `b`'s word.
fn ping_pong(
    p: &CmdPair,
    mrs: (&gdaki::nic::emu::Mr, &gdaki::nic::emu::Mr),
    bufs: (&GuardedBuf, &GuardedBuf),
    rounds: usize,
) {
    let (mut sa, mut sb) = (Sq { h: p.a, pi: 0 }, Sq { h: p.b, pi: 0 });
    let (mut ca, mut cb) = (CqPoll { h: p.cq_a, ci: 0 }, CqPoll { h: p.cq_b, ci: 0 });
    let (ma, mb) = mrs;
    let (ba, bb) = bufs;
    let mut r = rng();
    for _ in 0..rounds {
        let n = r.random_range(1..=1024usize);
        let payload = random_bytes(&mut r, n);
        ba.write(0, &payload);
        let at = sa.post(&sa.write(SIGNALED, (ma.lkey(), ba.addr(), n as u32), bb.addr() + 2048, mb.rkey()));
        assert_req(&ca.wait(), wqe_op::RDMA_WRITE, p.a.qpn, at, 0);
        assert_eq!(bb.read()[2048..2048 + n], payload[..], "a -> b");
        let at = sb.post(&sb.write(SIGNALED, (mb.lkey(), bb.addr() + 2048, n as u32), ba.addr() + 2048, ma.rkey()));
        assert_req(&cb.wait(), wqe_op::RDMA_WRITE, p.b.qpn, at, 0);
        assert_eq!(ba.read()[2048..2048 + n], payload[..], "b -> a");
    }
    let before = bb.u64_at(0);
    let fa = AtomicSeg { swap_add: Be64::new(5), compare: Be64::new(0) };
    let at = sa.post(&sa.atomic(wqe_op::ATOMIC_FA, SIGNALED, fa, (ma.lkey(), ba.addr() + 8), bb.addr(), mb.rkey()));
    assert_req(&ca.wait(), wqe_op::ATOMIC_FA, p.a.qpn, at, 8);
    assert_eq!(bb.u64_at(0), before + 5);
    assert_eq!(ba.u64_at(8), before, "the old value");
    assert!(ba.guards_intact() && bb.guards_intact());
}

#[test]
fn qps_made_purely_of_commands_carry_traffic_on_one_nic() {
    let (nic, pd) = open();
    let p = cmd_pair(&nic, pd.pdn(), &nic, pd.pdn(), all_rights(), 31);
    let (ba, bb) = (GuardedBuf::new(4096, 0), GuardedBuf::new(4096, 0));
    let (ma, mb) = (ba.register(&nic, &pd, Access::ALL), bb.register(&nic, &pd, Access::ALL));
    ping_pong(&p, (&ma, &mb), (&ba, &bb), 50);
    let q = devx::query_qp(&*nic, &EmuObj::Qp(p.a.qpn), p.a.qpn).unwrap();
    assert_eq!(q.get(qpc::HW_SQ_WQEBB_COUNTER), 51, "50 WRITEs and a fetch-add");
}

#[test]
fn qps_made_purely_of_commands_carry_traffic_over_the_wire() {
    let cfg = || EmuConfig::host().with_wire(WireConfig::loopback());
    let (na, nb) = (EmuNic::open(cfg()).unwrap(), EmuNic::open(cfg()).unwrap());
    let (pa, pb) = (na.alloc_pd().unwrap(), nb.alloc_pd().unwrap());
    na.add_neighbor(&nb.gid(), nb.wire_addr().unwrap()).unwrap();
    nb.add_neighbor(&na.gid(), na.wire_addr().unwrap()).unwrap();
    let p = cmd_pair(&na, pa.pdn(), &nb, pb.pdn(), all_rights(), 31);
    let (ba, bb) = (GuardedBuf::new(4096, 0), GuardedBuf::new(4096, 0));
    let (ma, mb) = (ba.register(&na, &pa, Access::ALL), bb.register(&nb, &pb, Access::ALL));
    ping_pong(&p, (&ma, &mb), (&ba, &bb), 20);
}

#[test]
fn a_neighbor_is_needed_to_reach_another_nic() {
    let cfg = || EmuConfig::host().with_wire(WireConfig::loopback());
    let (na, nb) = (EmuNic::open(cfg()).unwrap(), EmuNic::open(cfg()).unwrap());
    let pd = na.alloc_pd().unwrap();
    let cu = na.devx_alloc_uar().unwrap();
    let cm = cq_mem(&na, NCQE, Access::LOCAL_WRITE);
    let cqn = devx::create_cq(&*na, &cq_attr(&cm, cu.page_id)).unwrap().id;
    let qu = na.devx_alloc_uar().unwrap();
    let qm = qp_mem(&na, WQE_CNT);
    let qpn = devx::create_qp(&*na, &qp_attr(&qm, pd.pdn(), cqn, qu.page_id)).unwrap().id;
    devx::rst2init(&*na, &EmuObj::Qp(qpn), qpn, &all_rights()).unwrap();
    // A host-API connect refused because its QP has left RESET records no address: it replaced the entry for
    // the endpoint's NIC before the check, and the INIT2RTR below then went to that address.
    let (hcq, nb_pd) = (na.create_cq(16).unwrap(), nb.alloc_pd().unwrap());
    let own = na.create_qp(&pd, &hcq, 16).unwrap();
    own.connect(&own.endpoint()).unwrap();
    let far = nb.create_qp(&nb_pd, &nb.create_cq(16).unwrap(), 16).unwrap();
    let e = own.connect(&Endpoint { wire: Some("127.0.0.1:1".parse().unwrap()), ..far.endpoint() }).unwrap_err();
    assert!(e.to_string().contains("RESET"), "{e}");
    let inbox = devx::init2rtr_in(qpn, &rtr(0x100, 0, nb.gid())).unwrap();
    refused(&na, "INIT2RTR to a NIC of unknown address", &inbox, 16, status::BAD_PARAM, syn::NO_NEIGHBOR);
    assert!(na.add_neighbor(&na.gid(), na.wire_addr().unwrap()).is_err(), "its own GID");
    assert!(na.add_neighbor(&[0; 16], nb.wire_addr().unwrap()).is_err(), "not an emulated NIC's GID");
}

#[test]
fn rst2init_rights_and_log_msg_max_are_enforced_on_traffic() {
    let (nic, pd) = open();
    // `b` lets peers READ only; `a` sends messages of at most 2^8 bytes.
    let read_only = Rst2Init { remote_write: false, remote_atomic: false, ..all_rights() };
    let p = cmd_pair(&nic, pd.pdn(), &nic, pd.pdn(), read_only, 8);
    let (ba, bb) = (GuardedBuf::new(4096, 0x11), GuardedBuf::new(4096, 0x22));
    let (ma, mb) = (ba.register(&nic, &pd, Access::ALL), bb.register(&nic, &pd, Access::ALL));
    let mut sa = Sq { h: p.a, pi: 0 };
    let mut ca = CqPoll { h: p.cq_a, ci: 0 };
    let at = sa.post(&sa.read(SIGNALED, (ma.lkey(), ba.addr(), 64), bb.addr(), mb.rkey()));
    assert_req(&ca.wait(), wqe_op::RDMA_READ, p.a.qpn, at, 64);
    assert!(ba.read()[..64].iter().all(|&b| b == 0x22));
    let at = sa.post(&sa.write(SIGNALED, (ma.lkey(), ba.addr(), 64), bb.addr(), mb.rkey()));
    let e = assert_err(&ca.wait(), cqe_syndrome::REMOTE_ACCESS_ERR, wqe_op::RDMA_WRITE, p.a.qpn, at);
    assert_eq!(e.vendor_err_synd, gdaki::nic::emu::vendor::QP_ACCESS);
    assert!(bb.read()[..64].iter().all(|&b| b == 0x22), "nothing written");
    // A fresh pair for the length check (the first QP is in ERR now).
    let p = cmd_pair(&nic, pd.pdn(), &nic, pd.pdn(), all_rights(), 8);
    let mut sa = Sq { h: p.a, pi: 0 };
    let mut ca = CqPoll { h: p.cq_a, ci: 0 };
    let at = sa.post(&sa.write(SIGNALED, (ma.lkey(), ba.addr(), 256), bb.addr(), mb.rkey()));
    assert_req(&ca.wait(), wqe_op::RDMA_WRITE, p.a.qpn, at, 0);
    let at = sa.post(&sa.write(SIGNALED, (ma.lkey(), ba.addr(), 257), bb.addr(), mb.rkey()));
    let e = assert_err(&ca.wait(), cqe_syndrome::LOCAL_LENGTH_ERR, wqe_op::RDMA_WRITE, p.a.qpn, at);
    assert_eq!(e.vendor_err_synd, gdaki::nic::emu::vendor::MSG_TOO_LONG);
}

#[test]
fn the_host_api_goes_through_the_same_commands() {
    // A QP of `create_qp` is a firmware QP: QUERY_QP sees it and its CQ, and `connect` moves it with the
    // same transitions.
    let (nic, pd) = open();
    let cq = nic.create_cq(64).unwrap();
    let (a, b) = (nic.create_qp(&pd, &cq, 64).unwrap(), nic.create_qp(&pd, &cq, 64).unwrap());
    assert_eq!(state(&nic, a.qpn()), qpc::state::RST);
    a.connect(&b.endpoint()).unwrap();
    let q = devx::query_qp(&*nic, &EmuObj::Qp(a.qpn()), a.qpn()).unwrap();
    assert_eq!(q.state(), qpc::state::RTS);
    assert_eq!(q.get(qpc::REMOTE_QPN), b.qpn().into());
    assert_eq!(
        (q.get(qpc::NEXT_SEND_PSN), q.get(qpc::NEXT_RCV_PSN)),
        (a.endpoint().psn.into(), b.endpoint().psn.into())
    );
    assert_eq!(q.get(qpc::CQN_SND), cq.cqn().into());
    // Its CQ is busy while the QPs live; dropping the CQ first is fine (the QPs keep it).
    refused(
        &nic,
        "DESTROY_CQ under the host API's QPs",
        &devx::destroy_cq_in(cq.cqn()).unwrap(),
        16,
        status::RES_BUSY,
        syn::CQ_IN_USE,
    );
    let cqn = cq.cqn();
    drop(cq);
    let (qa, qb) = (a.qpn(), b.qpn());
    drop((a, b));
    refused(
        &nic,
        "QUERY_QP after the drop",
        &devx::query_qp_in(qa).unwrap(),
        query_qp_out::SIZE,
        status::BAD_RES,
        syn::QPN_UNKNOWN,
    );
    refused(
        &nic,
        "DESTROY_CQ after the last QP",
        &devx::destroy_cq_in(cqn).unwrap(),
        16,
        status::BAD_RES,
        syn::CQN_UNKNOWN,
    );
    refused(
        &nic,
        "QUERY_QP of the other",
        &devx::query_qp_in(qb).unwrap(),
        query_qp_out::SIZE,
        status::BAD_RES,
        syn::QPN_UNKNOWN,
    );
    assert!(nic.take_drop_error().is_none());
}

/// Every opcode the firmware executes, and one it does not.
const OPCODES: [u16; 11] = [
    opcode::QUERY_HCA_CAP,
    opcode::CREATE_CQ,
    opcode::DESTROY_CQ,
    opcode::CREATE_QP,
    opcode::DESTROY_QP,
    opcode::RST2INIT_QP,
    opcode::INIT2RTR_QP,
    opcode::RTR2RTS_QP,
    opcode::QP_2ERR,
    opcode::QUERY_QP,
    0x0801,
];

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 512, ..proptest::prelude::ProptestConfig::default() })]

    /// Any bytes under any opcode, of any length, with any output length, against a NIC that has a QP in
    /// RTS: the firmware answers (never panics), a failure is a `DevxCmd` whose output (when it holds 8
    /// bytes) carries the same status and syndrome, and the QP is still in RTS and still queried.
    #[test]
    fn any_mailbox_is_answered_and_a_refused_one_changes_nothing(
        op in 0..OPCODES.len(),
        body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..600),
        out_len in 0usize..4200,
        qpn_hit in proptest::prelude::any::<bool>(),
    ) {
        let t = OneQp::new();
        let nic = &t.nic;
        connect(nic, t.qpn, &all_rights(), &rtr(t.qpn, 0, nic.gid()), 0);
        let mut inbox = body;
        if inbox.len() >= 2 {
            inbox[..2].copy_from_slice(&OPCODES[op].to_be_bytes());
        }
        if qpn_hit && inbox.len() >= 12 {
            // Name the live QP, so that the commands on it get past the lookup.
            inbox[9..12].copy_from_slice(&t.qpn.to_be_bytes()[1..]);
        }
        let mut out = vec![0u8; out_len];
        match nic.devx_cmd(&inbox, &mut out) {
            Ok(()) => {}
            Err(Error::DevxCmd { status: s, syndrome: y, .. }) => {
                proptest::prop_assert_ne!(s, status::OK);
                if out_len >= 8 {
                    proptest::prop_assert_eq!(mbox_out::check(&out), Ok(Err(mbox_out::CmdError { status: s, syndrome: y })));
                }
                proptest::prop_assert_eq!(state(nic, t.qpn), qpc::state::RTS);
            }
            Err(e) => proptest::prop_assert!(false, "not a command error: {e}"),
        }
    }
}

/// A port of 0 in INIT2RTR and RTR2RTS means "unchanged" (RST2INIT's port stays): QUERY_QP reports port 1 after
/// both (it reported the 0 they carried).
#[test]
fn a_port_of_0_after_rst2init_leaves_the_port_unchanged() {
    let t = OneQp::new();
    let (nic, qpn) = (&t.nic, t.qpn);
    let obj = EmuObj::Qp(qpn);
    devx::rst2init(&**nic, &obj, qpn, &all_rights()).unwrap();
    let port =
        |nic: &EmuNic| devx::query_qp(nic, &obj, qpn).unwrap().get(qpc::primary_address_path(ads::VHCA_PORT_NUM));
    assert_eq!(port(nic), 1, "after RST2INIT");
    devx::init2rtr(&**nic, &obj, qpn, &Init2Rtr { port: 0, ..rtr(qpn, 0, nic.gid()) }).unwrap();
    assert_eq!(port(nic), 1, "after INIT2RTR with port 0");
    devx::rtr2rts(&**nic, &obj, qpn, &Rtr2Rts { port: 0, ..rts(0) }).unwrap();
    assert_eq!(port(nic), 1, "after RTR2RTS with port 0");
}

/// The transport's calls take only the commands the kernel lets through them: `obj_modify` and `obj_query` a
/// command on the object they are given (not another QP's, not a CQ's, not a destroy), `general_cmd` no
/// command of an object. Each refusal is an `InvalidArgument` that changes nothing.
#[test]
fn transport_calls_refuse_commands_on_other_objects_and_change_nothing() {
    let (nic, pd) = open();
    let (cu, ua, ub) = (nic.devx_alloc_uar().unwrap(), nic.devx_alloc_uar().unwrap(), nic.devx_alloc_uar().unwrap());
    let cm = cq_mem(&nic, NCQE, Access::LOCAL_WRITE);
    let cq = devx::create_cq(&*nic, &cq_attr(&cm, cu.page_id)).unwrap();
    let (ma, mb) = (qp_mem(&nic, WQE_CNT), qp_mem(&nic, WQE_CNT));
    let a = devx::create_qp(&*nic, &qp_attr(&ma, pd.pdn(), cq.id, ua.page_id)).unwrap();
    let b = devx::create_qp(&*nic, &qp_attr(&mb, pd.pdn(), cq.id, ub.page_id)).unwrap();
    let refused = |what: &str, r: gdaki::Result<()>| match r {
        Err(Error::InvalidArgument(_)) => {}
        other => panic!("{what}: expected InvalidArgument, got {other:?}"),
    };
    let init_b = devx::rst2init_in(b.id, &all_rights()).unwrap();
    let mut out = [0u8; 16];
    refused("RST2INIT of QP b given QP a", nic.obj_modify(&a.obj, &init_b, &mut out));
    refused("RST2INIT of QP b given the CQ", nic.obj_modify(&cq.obj, &init_b, &mut out));
    refused("DESTROY_QP through obj_modify", nic.obj_modify(&b.obj, &devx::destroy_qp_in(b.id).unwrap(), &mut out));
    refused("QUERY_QP through obj_modify", nic.obj_modify(&b.obj, &devx::query_qp_in(b.id).unwrap(), &mut out));
    let mut qout = [0u8; query_qp_out::SIZE];
    refused("QUERY_QP of QP b given QP a", nic.obj_query(&a.obj, &devx::query_qp_in(b.id).unwrap(), &mut qout));
    refused("DESTROY_QP through obj_query", nic.obj_query(&b.obj, &devx::destroy_qp_in(b.id).unwrap(), &mut qout));
    refused("RST2INIT through obj_query", nic.obj_query(&b.obj, &init_b, &mut qout));
    refused("DESTROY_CQ through general_cmd", nic.general_cmd(&devx::destroy_cq_in(cq.id).unwrap(), &mut out));
    refused("RST2INIT through general_cmd", nic.general_cmd(&init_b, &mut out));
    let mc = qp_mem(&nic, WQE_CNT);
    let uc = nic.devx_alloc_uar().unwrap();
    let create_c = devx::create_qp_in(&qp_attr(&mc, pd.pdn(), cq.id, uc.page_id)).unwrap();
    refused("CREATE_QP through general_cmd", nic.general_cmd(&create_c, &mut [0u8; create_qp_out::SIZE]));
    refused("an input shorter than the header", nic.obj_modify(&b.obj, &init_b[..8], &mut out));
    // Nothing changed: both QPs are in RST, the CQ is there, no QP was made on `uc`.
    assert_eq!((state(&nic, a.id), state(&nic, b.id)), (qpc::state::RST, qpc::state::RST));
    refused_busy_cq(&nic, cq.id);
    let c = devx::create_qp(&*nic, &qp_attr(&mc, pd.pdn(), cq.id, uc.page_id)).unwrap();
    assert_eq!(c.id, b.id + 1, "general_cmd made no QP");
    // The matching object still works.
    devx::rst2init(&*nic, &b.obj, b.id, &all_rights()).unwrap();
    assert_eq!((state(&nic, a.id), state(&nic, b.id)), (qpc::state::RST, qpc::state::INIT));
    // An opcode the firmware does not know goes to it through general_cmd, and it answers BAD_OP.
    let mut unknown = [0u8; 16];
    unknown[..2].copy_from_slice(&0x0801u16.to_be_bytes());
    match nic.general_cmd(&unknown, &mut out) {
        Err(Error::DevxCmd { status: s, syndrome: y, .. }) => assert_eq!((s, y), (status::BAD_OP, syn::BAD_OPCODE)),
        other => panic!("unknown opcode: {other:?}"),
    }
    for q in [a, b, c] {
        nic.obj_destroy(q.obj).unwrap();
    }
    nic.obj_destroy(cq.obj).unwrap();
}

/// DESTROY_CQ of `cqn`, which QPs use, is refused as busy: the CQ is still there.
fn refused_busy_cq(nic: &EmuNic, cqn: u32) {
    refused(nic, "DESTROY_CQ of a CQ in use", &devx::destroy_cq_in(cqn).unwrap(), 16, status::RES_BUSY, syn::CQ_IN_USE);
}

/// A host-API QP or CQ that a command destroyed first still releases its umem and UAR page when dropped:
/// the failed DESTROY is reported, and nothing it held stays registered.
#[test]
fn a_drop_after_a_destroy_by_command_releases_the_umem_and_the_uar_page() {
    let (nic, pd) = open();
    // A fresh NIC numbers umems and UAR pages from 1: the CQ takes umem 1 and UAR page 1 (the NIC's CQ
    // page), the QP umem 2 and UAR page 2.
    let cq = nic.create_cq(64).unwrap();
    let qp = nic.create_qp(&pd, &cq, 64).unwrap();
    nic.obj_destroy(EmuObj::Qp(qp.qpn())).unwrap();
    drop(qp);
    assert!(nic.take_drop_error().is_some(), "the failed DESTROY_QP is reported");
    let gone = |r: gdaki::Result<()>, what: &str| match r {
        Err(Error::InvalidArgument(m)) if m.starts_with("no ") => {}
        other => panic!("{what} is still there: {other:?}"),
    };
    gone(nic.devx_umem_dereg(2), "the QP's umem");
    gone(nic.devx_free_uar(2), "the QP's UAR page");
    nic.obj_destroy(EmuObj::Cq(cq.cqn())).unwrap();
    drop(cq);
    assert!(nic.take_drop_error().is_some(), "the failed DESTROY_CQ is reported");
    gone(nic.devx_umem_dereg(1), "the CQ's umem");
}

/// DESTROY_QP waits for the executor to let go of the QP without holding up the NIC's other commands: while
/// the executor is held, a destroy on one thread waits for it, and another thread's QUERY_HCA_CAP, QUERY_QP
/// and UAR allocation are answered at once. Until the wait ends, the QP is gone for commands (QPN_UNKNOWN) and
/// its umem is still taken. Resumed, the executor lets the destroy finish; one that never answers is reported
/// (`Unresponsive`) after the wait's 5 s, and the QP's umem is released all the same.
#[test]
fn a_destroy_waiting_for_the_executor_holds_up_no_other_command() {
    let (nic, pd) = open();
    let cu = nic.devx_alloc_uar().unwrap();
    let cm = cq_mem(&nic, NCQE, Access::LOCAL_WRITE);
    let cqn = devx::create_cq(&*nic, &cq_attr(&cm, cu.page_id)).unwrap().id;
    let make = || {
        let (m, u) = (qp_mem(&nic, WQE_CNT), nic.devx_alloc_uar().unwrap());
        (devx::create_qp(&*nic, &qp_attr(&m, pd.pdn(), cqn, u.page_id)).unwrap().id, m.umem)
    };
    let (a, a_umem) = make();
    let (b, b_umem) = make();
    let quick = Duration::from_secs(1);
    for (qpn, umem, resume) in [(a, a_umem, true), (b, b_umem, false)] {
        nic.hold_executor(true);
        let start = Instant::now();
        let destroyer = {
            let nic = nic.clone();
            std::thread::spawn(move || (nic.obj_destroy(EmuObj::Qp(qpn)), start.elapsed()))
        };
        // Until the destroy has begun, QUERY_QP finds the QP; each answer comes at once, also while it waits.
        loop {
            let t = Instant::now();
            let r = devx::query_qp(&*nic, &EmuObj::Qp(qpn), qpn);
            assert!(t.elapsed() < quick, "QUERY_QP took {:?} during a destroy", t.elapsed());
            match r {
                Ok(q) => assert_eq!(q.state(), qpc::state::RST),
                Err(Error::DevxCmd { status: s, syndrome: y, .. }) => {
                    assert_eq!((s, y), (status::BAD_RES, syn::QPN_UNKNOWN));
                    break;
                }
                Err(e) => panic!("QUERY_QP during a destroy: {e}"),
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let t = Instant::now();
        let cap = devx::query_hca_cap(&*nic).unwrap();
        assert_eq!(cap.get(cmd_hca_cap::LOG_MAX_QP_SZ), 15);
        nic.devx_free_uar(nic.devx_alloc_uar().unwrap().page_id).unwrap();
        assert!(t.elapsed() < quick, "QUERY_HCA_CAP and a UAR page took {:?} during a destroy", t.elapsed());
        // The QP's work queue is not released before the executor has let go of the QP.
        assert!(!destroyer.is_finished(), "the destroy did not wait for the held executor");
        match nic.devx_umem_dereg(umem) {
            Err(Error::InvalidArgument(m)) => assert!(m.contains("live CQs or QPs"), "{m}"),
            other => panic!("umem {umem} of a QP being destroyed: {other:?}"),
        }
        if resume {
            nic.hold_executor(false);
        }
        let (r, took) = destroyer.join().unwrap();
        r.unwrap();
        match nic.take_drop_error() {
            None if resume => assert!(took < Duration::from_secs(4), "the destroy took {took:?}"),
            Some(Error::Emu(EmuError::Unresponsive(d))) if !resume => {
                assert_eq!(d, Duration::from_secs(5));
                assert!(took >= d, "the destroy gave up after {took:?}");
            }
            other => panic!("executor resumed: {resume}; drop error {other:?}"),
        }
        nic.devx_umem_dereg(umem).unwrap();
    }
    nic.hold_executor(false);
    nic.obj_destroy(EmuObj::Cq(cqn)).unwrap();
}

/// A host-API QP that a raw DESTROY_QP destroyed reads as being in the error state, whatever state it was
/// in: QUERY_QP no longer finds it (as `ibv_query_qp` fails on a destroyed QP). `connect` refuses it before
/// anything changes, and the NIC's other QPs keep their state.
#[test]
fn a_qp_destroyed_by_command_reads_as_the_error_state() {
    let (nic, pd) = open();
    let cq = nic.create_cq(64).unwrap();
    let (a, b, c) = (
        nic.create_qp(&pd, &cq, 64).unwrap(),
        nic.create_qp(&pd, &cq, 64).unwrap(),
        nic.create_qp(&pd, &cq, 64).unwrap(),
    );
    a.connect(&b.endpoint()).unwrap();
    b.connect(&a.endpoint()).unwrap();
    assert_eq!((a.state(), c.state()), (QpState::Rts, QpState::Reset));
    for q in [&a, &c] {
        let mut out = [0u8; 16];
        nic.devx_cmd(&devx::destroy_qp_in(q.qpn()).unwrap(), &mut out).unwrap();
        assert_eq!(q.state(), QpState::Error, "QP {:#x}", q.qpn());
    }
    assert_eq!(b.state(), QpState::Rts);
    match c.connect(&b.endpoint()) {
        Err(Error::InvalidArgument(m)) => assert!(m.contains("destroyed"), "{m}"),
        other => panic!("connect of a destroyed QP: {other:?}"),
    }
    drop((a, c));
    assert!(nic.take_drop_error().is_some(), "the failed DESTROY_QPs are reported");
}
