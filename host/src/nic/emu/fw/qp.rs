//! CREATE_QP, QUERY_QP and DESTROY_QP.
//!
//! CREATE_QP makes an RC QP in RST over: a work queue in a umem (`wq_umem_valid`, `wq_umem_id`,
//! `wq_umem_offset`), laid out as the PRM lays it out, the receive queue first (`2^log_rq_size` WQEs of `16 <<
//! log_rq_stride` bytes, or none with `rq_type` ZERO_LEN) and the send queue of `2^log_sq_size` WQEBBs after
//! it; a doorbell record in a umem; a UAR page no other live QP rings; `cqn_snd` and `cqn_rcv`; a PD. The
//! receive queue's space is taken but not read: the emulated NIC has no receive WQEs (a WRITE with immediate
//! completes on `cqn_rcv` without one). `log_msg_max` bounds the QP's messages (longer ones fail with
//! LOCAL_LENGTH_ERR), `ts_format` must be FREE_RUNNING or DEFAULT (timestamps are nanoseconds either way),
//! `log_page_size` is ignored.
//!
//! QUERY_QP answers with the `qpc` as the QP's commands set it, its `state`, and `hw_sq_wqebb_counter` and
//! `sw_sq_wqebb_counter` at the WQEBBs the NIC has consumed. DESTROY_QP waits for the executor thread to let go
//! of the QP (no WQE of it runs afterwards), ends its wire connection, and releases its umems, UAR page and
//! CQs. It waits without the firmware lock: other commands and the umem and UAR calls go on meanwhile, find
//! no such QP, and find its umems, UAR page and CQs still taken until the wait has ended.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use gdaki_shared::prm::cmd::{
    create_qp_in, create_qp_out, destroy_qp_in, destroy_qp_out, mbox_in, opcode, qpc, query_qp_in, query_qp_out,
};
use gdaki_shared::prm::wqe::WQEBB;

use super::super::guard::{lock, write};
use super::super::qp::{self, QpInner, QpRes, MIN_WQE_CNT};
use super::cq::{DBR, DBR_BYTES};
use super::mailbox::{Named, Span};
use super::resources::Lookup;
use super::syndrome::{cmd_syndrome as syn, Fail};
use super::{get, put, Command, Ctx, HEADER, QUERY_HEADER};

/// A [`qpc`] field in CREATE_QP's input.
const fn ctx(f: gdaki_shared::prm::cmd::Field) -> Span {
    Span::field(create_qp_in::qpc(f))
}

/// How the send queue is looked up in the work queue's umem: it starts on a WQEBB.
const SQ: Lookup = Lookup {
    unknown: syn::UMEM_UNKNOWN,
    range: syn::UMEM_RANGE,
    align: syn::UMEM_ALIGN,
    align_to: WQEBB as u64,
    write: None,
};

/// Every field of a `qpc` at bit offset `base`, with its two address paths, for the reserved-bit check.
macro_rules! qpc_named {
    ($base:expr) => {
        [
            (qpc::FIELDS, $base),
            (gdaki_shared::prm::cmd::ads::FIELDS, $base + qpc::PRIMARY_ADDRESS_PATH),
            (gdaki_shared::prm::cmd::ads::FIELDS, $base + qpc::SECONDARY_ADDRESS_PATH),
        ]
    };
}
pub(super) use qpc_named;

/// The byte strings of a `qpc` at bit offset `base` (the address paths' GIDs), for the reserved-bit check.
macro_rules! qpc_bytes {
    ($base:expr) => {
        [
            Span::bytes(gdaki_shared::prm::cmd::ads::RGID_RIP.at($base + qpc::PRIMARY_ADDRESS_PATH)),
            Span::bytes(gdaki_shared::prm::cmd::ads::RGID_RIP.at($base + qpc::SECONDARY_ADDRESS_PATH)),
        ]
    };
}
pub(super) use qpc_bytes;

const CREATE_NAMED: [Named; 4] = {
    let q = qpc_named!(create_qp_in::QPC);
    [(create_qp_in::FIELDS, 0), q[0], q[1], q[2]]
};

pub(super) const CREATE_QP: Command = Command {
    opcode: opcode::CREATE_QP,
    in_size: create_qp_in::SIZE,
    out_size: create_qp_out::SIZE,
    op_mod: false,
    head: &HEADER,
    taken: &[
        Span::field(create_qp_in::OPT_PARAM_MASK),
        ctx(qpc::ST),
        ctx(qpc::PM_STATE),
        ctx(qpc::PD),
        ctx(qpc::LOG_MSG_MAX),
        ctx(qpc::LOG_RQ_SIZE),
        ctx(qpc::LOG_RQ_STRIDE),
        ctx(qpc::LOG_SQ_SIZE),
        ctx(qpc::TS_FORMAT),
        ctx(qpc::UAR_PAGE),
        ctx(qpc::LOG_PAGE_SIZE),
        ctx(qpc::CQN_SND),
        ctx(qpc::CQN_RCV),
        ctx(qpc::DBR_ADDR),
        ctx(qpc::RQ_TYPE),
        ctx(qpc::DBR_UMEM_VALID),
        ctx(qpc::DBR_UMEM_ID),
        Span::field(create_qp_in::WQ_UMEM_OFFSET),
        Span::field(create_qp_in::WQ_UMEM_ID),
        Span::field(create_qp_in::WQ_UMEM_VALID),
    ],
    named: &CREATE_NAMED,
    named_bytes: &qpc_bytes!(create_qp_in::QPC),
    run: create_qp,
};

fn create_qp(c: &mut Ctx<'_>, inbox: &[u8], out: &mut [u8]) -> Result<(), Fail> {
    let q = |f| get(inbox, create_qp_in::qpc(f));
    if get(inbox, create_qp_in::OPT_PARAM_MASK) != 0 {
        return Err(Fail::of(syn::OPT_PARAM_MASK));
    }
    if get(inbox, create_qp_in::WQ_UMEM_VALID) == 0 {
        return Err(Fail::of(syn::PAGE_LIST));
    }
    if q(qpc::DBR_UMEM_VALID) == 0 {
        return Err(Fail::of(syn::DBR_NOT_UMEM));
    }
    if q(qpc::ST) != u64::from(qpc::st::RC) {
        return Err(Fail::of(syn::ST));
    }
    if q(qpc::PM_STATE) != u64::from(qpc::pm_state::MIGRATED) {
        return Err(Fail::of(syn::PM_STATE));
    }
    let pdn = q(qpc::PD) as u32;
    if !c.fw.has_pd(pdn) {
        return Err(Fail::of(syn::PD_UNKNOWN));
    }
    // The 4-bit field holds at most 15, log2 of MAX_WQE_CNT.
    let log_sq = q(qpc::LOG_SQ_SIZE) as u32;
    if log_sq < MIN_WQE_CNT.ilog2() {
        return Err(Fail::of(syn::LOG_SQ_SIZE));
    }
    let wqe_cnt = 1u32 << log_sq;
    let (log_rq, log_stride) = (q(qpc::LOG_RQ_SIZE), q(qpc::LOG_RQ_STRIDE));
    let rq_bytes = match q(qpc::RQ_TYPE) as u8 {
        qpc::rq_type::ZERO_LEN if log_rq != 0 || log_stride != 0 => return Err(Fail::of(syn::RQ_SHAPE)),
        qpc::rq_type::ZERO_LEN => 0,
        qpc::rq_type::NON_ZERO => (1u64 << log_rq) << (4 + log_stride),
        _ => return Err(Fail::of(syn::RQ_TYPE)),
    };
    if !matches!(q(qpc::TS_FORMAT) as u8, qpc::ts_format::FREE_RUNNING | qpc::ts_format::DEFAULT) {
        return Err(Fail::of(syn::TS_FORMAT));
    }
    let uar_page = q(qpc::UAR_PAGE) as u32;
    match c.fw.uar(uar_page) {
        None => return Err(Fail::of(syn::UAR_UNKNOWN)),
        Some((_, Some(_))) => return Err(Fail::of(syn::UAR_IN_USE)),
        Some((_, None)) => {}
    }
    let (cqn_snd, cqn_rcv) = (q(qpc::CQN_SND) as u32, q(qpc::CQN_RCV) as u32);
    let cq = c.fw.cq(cqn_snd).ok_or(Fail::of(syn::CQN_SND_UNKNOWN))?.inner.clone();
    let rcq = c.fw.cq(cqn_rcv).ok_or(Fail::of(syn::CQN_RCV_UNKNOWN))?.inner.clone();
    if cq.ncqe < wqe_cnt {
        return Err(Fail::of(syn::CQ_TOO_SMALL));
    }
    let wq_id = get(inbox, create_qp_in::WQ_UMEM_ID) as u32;
    let wq_off = get(inbox, create_qp_in::WQ_UMEM_OFFSET);
    // The send queue follows the receive queue; the whole work queue must fit the registration.
    let sq_off = wq_off.checked_add(rq_bytes).ok_or(Fail::of(syn::UMEM_RANGE))?;
    let sq = c.fw.view(wq_id, sq_off, u64::from(wqe_cnt) * WQEBB as u64, SQ)?;
    let dbr_id = q(qpc::DBR_UMEM_ID) as u32;
    let dbrec = c.fw.view(dbr_id, q(qpc::DBR_ADDR), DBR_BYTES, DBR)?;
    let Some(uar) = c.fw.uar_view(uar_page) else { return Err(Fail::of(syn::UAR_UNKNOWN)) };
    let qpn = c.fab.alloc_qpn().ok_or(Fail::of(syn::QP_NUMBERS))?;
    // Doorbells a destroyed QP left in the page are not this QP's.
    qp::clear_doorbell(&uar, c.fab.bf_sentinel);
    let mut image = [0u8; qpc::SIZE];
    image.copy_from_slice(&inbox[create_qp_in::QPC as usize / 8..][..qpc::SIZE]);
    let res = QpRes { qpn, pdn, wqe_cnt, sq, dbrec, uar, cq, rcq, log_msg_max: q(qpc::LOG_MSG_MAX) as u8, qpc: image };
    let inner = Arc::new(QpInner::new(res));
    c.fw.add_qp(qpn, [wq_id, dbr_id], uar_page, [cqn_snd, cqn_rcv]);
    write(&c.fab.qps).insert(qpn, inner);
    c.fab.qp_gen.fetch_add(1, Ordering::Release);
    put(out, create_qp_out::QPN, qpn.into());
    Ok(())
}

pub(super) const QUERY_QP: Command = Command {
    opcode: opcode::QUERY_QP,
    in_size: query_qp_in::SIZE,
    out_size: query_qp_out::SIZE,
    op_mod: false,
    head: &QUERY_HEADER,
    taken: &[Span::field(query_qp_in::QPN)],
    named: &[(mbox_in::FIELDS, 0), (query_qp_in::FIELDS, 0)],
    named_bytes: &[],
    run: query_qp,
};

fn query_qp(c: &mut Ctx<'_>, inbox: &[u8], out: &mut [u8]) -> Result<(), Fail> {
    let qp = live_qp(c, get(inbox, query_qp_in::QPN) as u32)?;
    let at = query_qp_out::QPC as usize / 8;
    out[at..at + qpc::SIZE].copy_from_slice(&*lock(&qp.qpc));
    let consumed = lock(&qp.progress).consumed & 0xffff;
    put(out, query_qp_out::qpc(qpc::STATE), qp.state().prm().into());
    put(out, query_qp_out::qpc(qpc::HW_SQ_WQEBB_COUNTER), consumed);
    put(out, query_qp_out::qpc(qpc::SW_SQ_WQEBB_COUNTER), consumed);
    Ok(())
}

/// The QP `qpn` that CREATE_QP made and DESTROY_QP has not destroyed.
pub(super) fn live_qp(c: &Ctx<'_>, qpn: u32) -> Result<Arc<QpInner>, Fail> {
    if !c.fw.has_qp(qpn) {
        return Err(Fail::of(syn::QPN_UNKNOWN));
    }
    c.nic.qp(qpn).ok_or(Fail::of(syn::QPN_UNKNOWN))
}

pub(super) const DESTROY_QP: Command = Command {
    opcode: opcode::DESTROY_QP,
    in_size: destroy_qp_in::SIZE,
    out_size: destroy_qp_out::SIZE,
    op_mod: false,
    head: &HEADER,
    taken: &[Span::field(destroy_qp_in::QPN)],
    named: &[(mbox_in::FIELDS, 0), (destroy_qp_in::FIELDS, 0)],
    named_bytes: &[],
    run: destroy_qp,
};

fn destroy_qp(c: &mut Ctx<'_>, inbox: &[u8], _out: &mut [u8]) -> Result<(), Fail> {
    let qpn = get(inbox, destroy_qp_in::QPN) as u32;
    let qp = live_qp(c, qpn)?;
    qp.mark_destroyed();
    let gen = c.nic.remove_qp(qpn);
    // The rest runs once the firmware lock is released, so that the wait holds up no other command. Until it
    // ends, commands find no QP `qpn` (QPN_UNKNOWN), and what it holds stays taken.
    c.unlocked = Some(Box::new(move |nic| {
        // Until the executor has swept with a list that no longer holds this QP, it may still hold an `Arc`
        // of it (in its list, or as a peer it cached): wait, so that the QP's memory is never freed by it.
        nic.wait_for_executor(gen);
        // The peer across the wire sees the connection end (its outstanding WQEs fail), and the link's
        // threads stop. The executor's refresh has done so already, after sending what this QP owed the peer
        // for requests it executed (`requester::farewell`); this is for a link the executor never took up,
        // or an executor that did not answer.
        if let Some(link) = qp.link.get() {
            link.close();
        }
        lock(&nic.fab.fw).remove_qp(qpn);
    }));
    Ok(())
}
