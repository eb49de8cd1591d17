//! The QP state machine: RST2INIT, INIT2RTR, RTR2RTS and 2ERR.
//!
//! RST → INIT → RTR → RTS, each transition from its one state, and any state → ERR; anything else fails with
//! `BAD_QP_STATE`. A transition checks the state, makes its changes and moves the QP under the QP's state
//! lock, which the executor's moves to ERR take too: one refused because the executor moved the QP to ERR
//! after the command began has changed nothing. The transitions take what rdma-core's DevX tests set:
//! - RST2INIT: the primary path's `vhca_port_num` (port 1) and `pkey_index` (0), `rre`, `rwe`, `rae` (the
//!   remote rights the QP allows as responder; a request it does not allow fails with REMOTE_ACCESS_ERR).
//! - INIT2RTR: `mtu`, `log_msg_max`, `remote_qpn`, `next_rcv_psn`, `min_rnr_nak`, `log_rra_max` and the
//!   primary path of the emulated RoCE port: `rgid_rip` names the peer's NIC (its GID, `fe80::` and the NIC's
//!   identifier), `src_addr_index` 0, a nonzero `hop_limit`, `rlid` 0; `rmac`, `udp_sport`, `tclass`,
//!   `flow_label`, `eth_prio`, `sl`, `stat_rate` and `grh` are taken and not used. A peer on this NIC is
//!   reached directly and must be a live QP; a peer on another NIC over the wire, at the address the neighbour
//!   table has for its GID (`EmuNic::add_neighbor`), which the QP with the smaller `(NIC, QPN)` dials.
//! - RTR2RTS: `next_send_psn`, `retry_count`, `rnr_retry`, `log_sra_max`, `log_ack_req_freq`, the path's
//!   `ack_timeout` and `vhca_port_num`. The NIC acts on doorbells from here on; doorbells written before are
//!   ignored, and the first WQE must carry index 0. The retry attributes are not used: the wire's retry
//!   timeout is the NIC's ([`WireConfig::retry_timeout`](super::super::WireConfig::retry_timeout)).
//! - 2ERR: no `qpc`; every later WQE completes flushed.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use gdaki_shared::prm::cmd::{
    ads, init2rtr_qp_in, init2rtr_qp_out, mbox_in, opcode, qp_2err_in, qp_2err_out, qpc, rst2init_qp_in,
    rst2init_qp_out, rtr2rts_qp_in, rtr2rts_qp_out, Field,
};

use super::super::fabric::Fabric;
use super::super::guard::{lock, read};
use super::super::mr::Access;
use super::super::qp::{nic_of_gid, Endpoint, QpInner, QpState, StateLock};
use super::super::wire::{link, Link};
use super::mailbox::{Named, Span};
use super::qp::{live_qp, qpc_bytes, qpc_named};
use super::resources::Firmware;
use super::syndrome::{cmd_syndrome as syn, Fail};
use super::{get, Command, Ctx, HEADER};

// The three transitions that carry a `qpc` share one layout (`modify_qp_in!` in prm::cmd).
const _: () = assert!(
    rst2init_qp_in::QPC == init2rtr_qp_in::QPC
        && rst2init_qp_in::QPC == rtr2rts_qp_in::QPC
        && rst2init_qp_in::QPN.off() == rtr2rts_qp_in::QPN.off()
        && rst2init_qp_in::QPN.off() == init2rtr_qp_in::QPN.off()
        && rst2init_qp_in::OPT_PARAM_MASK.off() == init2rtr_qp_in::OPT_PARAM_MASK.off()
        && rst2init_qp_in::OPT_PARAM_MASK.off() == rtr2rts_qp_in::OPT_PARAM_MASK.off()
);

/// Bit offset of the `qpc` in the three transitions' inputs.
const QPC: u32 = rst2init_qp_in::QPC;

/// A [`qpc`] field in a transition's input.
const fn ctx(f: Field) -> Span {
    Span::field(f.at(QPC))
}

/// An [`ads`] field of the primary path in a transition's input.
const fn path(f: Field) -> Span {
    Span::field(f.at(QPC + qpc::PRIMARY_ADDRESS_PATH))
}

/// The named fields of a transition's input with layout `fields`.
const fn named(fields: &'static [(&'static str, Field)]) -> [Named; 4] {
    let q = qpc_named!(QPC);
    [(fields, 0), q[0], q[1], q[2]]
}

const RST2INIT_NAMED: [Named; 4] = named(rst2init_qp_in::FIELDS);
const INIT2RTR_NAMED: [Named; 4] = named(init2rtr_qp_in::FIELDS);
const RTR2RTS_NAMED: [Named; 4] = named(rtr2rts_qp_in::FIELDS);
const QPC_BYTES: [Span; 2] = qpc_bytes!(QPC);

/// The header, `qpn` and `opt_param_mask`, which every transition with a `qpc` takes.
const MODIFY_HEADER: [Span; 5] =
    [HEADER[0], HEADER[1], HEADER[2], Span::field(rst2init_qp_in::QPN), Span::field(rst2init_qp_in::OPT_PARAM_MASK)];

pub(super) const RST2INIT: Command = Command {
    opcode: opcode::RST2INIT_QP,
    in_size: rst2init_qp_in::SIZE,
    out_size: rst2init_qp_out::SIZE,
    op_mod: false,
    head: &MODIFY_HEADER,
    taken: &[ctx(qpc::RRE), ctx(qpc::RWE), ctx(qpc::RAE), path(ads::PKEY_INDEX), path(ads::VHCA_PORT_NUM)],
    named: &RST2INIT_NAMED,
    named_bytes: &QPC_BYTES,
    run: rst2init,
};

pub(super) const INIT2RTR: Command = Command {
    opcode: opcode::INIT2RTR_QP,
    in_size: init2rtr_qp_in::SIZE,
    out_size: init2rtr_qp_out::SIZE,
    op_mod: false,
    head: &MODIFY_HEADER,
    taken: &[
        ctx(qpc::MTU),
        ctx(qpc::LOG_MSG_MAX),
        ctx(qpc::REMOTE_QPN),
        ctx(qpc::LOG_RRA_MAX),
        ctx(qpc::MIN_RNR_NAK),
        ctx(qpc::NEXT_RCV_PSN),
        path(ads::PKEY_INDEX),
        path(ads::GRH),
        path(ads::RLID),
        path(ads::SRC_ADDR_INDEX),
        path(ads::STAT_RATE),
        path(ads::HOP_LIMIT),
        path(ads::TCLASS),
        path(ads::FLOW_LABEL),
        Span::bytes(ads::RGID_RIP.at(QPC + qpc::PRIMARY_ADDRESS_PATH)),
        path(ads::UDP_SPORT),
        path(ads::ETH_PRIO),
        path(ads::SL),
        path(ads::VHCA_PORT_NUM),
        path(ads::RMAC_47_32),
        path(ads::RMAC_31_0),
    ],
    named: &INIT2RTR_NAMED,
    named_bytes: &QPC_BYTES,
    run: init2rtr,
};

pub(super) const RTR2RTS: Command = Command {
    opcode: opcode::RTR2RTS_QP,
    in_size: rtr2rts_qp_in::SIZE,
    out_size: rtr2rts_qp_out::SIZE,
    op_mod: false,
    head: &MODIFY_HEADER,
    taken: &[
        path(ads::ACK_TIMEOUT),
        path(ads::VHCA_PORT_NUM),
        ctx(qpc::LOG_ACK_REQ_FREQ),
        ctx(qpc::LOG_SRA_MAX),
        ctx(qpc::RETRY_COUNT),
        ctx(qpc::RNR_RETRY),
        ctx(qpc::NEXT_SEND_PSN),
    ],
    named: &RTR2RTS_NAMED,
    named_bytes: &QPC_BYTES,
    run: rtr2rts,
};

pub(super) const QP_2ERR: Command = Command {
    opcode: opcode::QP_2ERR,
    in_size: qp_2err_in::SIZE,
    out_size: qp_2err_out::SIZE,
    op_mod: false,
    head: &HEADER,
    taken: &[Span::field(qp_2err_in::QPN)],
    named: &[(mbox_in::FIELDS, 0), (qp_2err_in::FIELDS, 0)],
    named_bytes: &[],
    run: qp_2err,
};

/// The QP a transition names, its `opt_param_mask` (0) and its state (`from`) checked.
fn start(c: &Ctx<'_>, inbox: &[u8], from: QpState) -> Result<Arc<QpInner>, Fail> {
    let qp = live_qp(c, get(inbox, rst2init_qp_in::QPN) as u32)?;
    if get(inbox, rst2init_qp_in::OPT_PARAM_MASK) != 0 {
        return Err(Fail::of(syn::OPT_PARAM_MASK));
    }
    if qp.state() != from {
        return Err(Fail::of(syn::BAD_STATE));
    }
    Ok(qp)
}

/// The QP's state lock, the QP still in `from`: the executor may have moved it to ERR since [`start`] looked.
/// A transition makes its changes under this lock, then moves the QP: refused, it has changed nothing.
fn moving(qp: &QpInner, from: QpState) -> Result<StateLock<'_>, Fail> {
    let st = qp.lock_state();
    if st.get() != from {
        return Err(Fail::of(syn::BAD_STATE));
    }
    Ok(st)
}

/// A primary-path field of the input.
fn path_get(inbox: &[u8], f: Field) -> u64 {
    get(inbox, f.at(QPC + qpc::PRIMARY_ADDRESS_PATH))
}

/// Checks the path's port: 1, or 0 (unchanged) where `unchanged` allows it.
fn check_port(inbox: &[u8], unchanged: bool) -> Result<(), Fail> {
    match path_get(inbox, ads::VHCA_PORT_NUM) {
        1 => Ok(()),
        0 if unchanged => Ok(()),
        _ => Err(Fail::of(syn::PORT)),
    }
}

/// Copies the `qpc` fields of `taken` from the input into the QP's `qpc` as QUERY_QP reports it, but a port of 0,
/// which [`check_port`] takes for "unchanged": the QP keeps the port it has.
fn record(qp: &QpInner, inbox: &[u8], taken: &[Span]) {
    let qpc_bits = QPC..QPC + qpc::SIZE as u32 * 8;
    let port_kept = path_get(inbox, ads::VHCA_PORT_NUM) == 0;
    let mut image = lock(&qp.qpc);
    for s in taken.iter().filter(|&&s| qpc_bits.contains(&s.off) && !(port_kept && s == path(ads::VHCA_PORT_NUM))) {
        for bit in s.off..s.off + s.bits {
            let (i, m) = (bit as usize / 8, 0x80u8 >> (bit % 8));
            let j = i - QPC as usize / 8;
            image[j] = (image[j] & !m) | (inbox[i] & m);
        }
    }
}

fn rst2init(c: &mut Ctx<'_>, inbox: &[u8], _out: &mut [u8]) -> Result<(), Fail> {
    let qp = start(c, inbox, QpState::Reset)?;
    check_port(inbox, false)?;
    if path_get(inbox, ads::PKEY_INDEX) != 0 {
        return Err(Fail::of(syn::PKEY_INDEX));
    }
    let q = |f: Field| get(inbox, f.at(QPC)) != 0;
    let rights = [(qpc::RRE, Access::REMOTE_READ), (qpc::RWE, Access::REMOTE_WRITE), (qpc::RAE, Access::REMOTE_ATOMIC)]
        .into_iter()
        .filter(|&(f, _)| q(f))
        .fold(Access::NONE, |a, (_, r)| a | r);
    let mut st = moving(&qp, QpState::Reset)?;
    qp.set_rights(rights);
    record(&qp, inbox, RST2INIT.taken);
    st.set(QpState::Init);
    Ok(())
}

/// Where an INIT2RTR's peer is: a QP of this NIC, or of NIC `nic` whose wire listens at the address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Peer {
    /// QP `remote_qpn` of this NIC.
    Local,
    /// A QP of NIC `.0`, whose wire listens at `.1`.
    Wire(u64, SocketAddr),
}

/// Where QP `qpn` of NIC `nic` is reached from this NIC, or the syndrome that says why it is not: a live QP of
/// this NIC ([`syn::REMOTE_QPN`]), or a NIC this one has a wire to and knows the address of
/// ([`syn::NO_WIRE`], [`syn::NO_NEIGHBOR`]).
pub(crate) fn reach(fab: &Fabric, fw: &Firmware, nic: u64, qpn: u32) -> Result<Peer, u32> {
    if nic == fab.id {
        return match read(&fab.qps).get(&qpn) {
            Some(q) if !q.is_destroyed() => Ok(Peer::Local),
            _ => Err(syn::REMOTE_QPN),
        };
    }
    if fab.wire.is_none() {
        return Err(syn::NO_WIRE);
    }
    fw.neighbor(nic).map(|a| Peer::Wire(nic, a)).ok_or(syn::NO_NEIGHBOR)
}

fn init2rtr(c: &mut Ctx<'_>, inbox: &[u8], _out: &mut [u8]) -> Result<(), Fail> {
    let qp = start(c, inbox, QpState::Init)?;
    let q = |f: Field| get(inbox, f.at(QPC));
    if !(1..=5).contains(&q(qpc::MTU)) {
        return Err(Fail::of(syn::MTU));
    }
    check_port(inbox, true)?;
    if path_get(inbox, ads::PKEY_INDEX) != 0 {
        return Err(Fail::of(syn::PKEY_INDEX));
    }
    if path_get(inbox, ads::RLID) != 0 {
        return Err(Fail::of(syn::RLID));
    }
    if path_get(inbox, ads::SRC_ADDR_INDEX) != 0 {
        return Err(Fail::of(syn::SRC_ADDR_INDEX));
    }
    if path_get(inbox, ads::HOP_LIMIT) == 0 {
        return Err(Fail::of(syn::HOP_LIMIT));
    }
    let rgid = ads::RGID_RIP.at(QPC + qpc::PRIMARY_ADDRESS_PATH).try_get(inbox).unwrap_or(&[]);
    let nic = nic_of_gid(rgid).ok_or(Fail::of(syn::RGID))?;
    let (remote_qpn, rq_psn) = (q(qpc::REMOTE_QPN) as u32, q(qpc::NEXT_RCV_PSN) as u32);
    let peer = reach(c.fab, c.fw, nic, remote_qpn).map_err(Fail::of)?;
    // The peer (or link) first, then RTR: whoever sees the QP in RTR sees whom it answers.
    let mut st = moving(&qp, QpState::Init)?;
    let dialer = match peer {
        Peer::Local => {
            let _ = qp.peer.set(remote_qpn);
            None
        }
        Peer::Wire(nic, addr) => {
            let local = Endpoint { nic: c.fab.id, qpn: qp.qpn, psn: 0, wire: c.fab.wire_addr() };
            let remote = Endpoint { nic, qpn: remote_qpn, psn: rq_psn, wire: Some(addr) };
            let link = Arc::new(Link::new(local, remote));
            let _ = qp.link.set(link.clone());
            link.dials().then_some(link)
        }
    };
    qp.set_log_msg_max(q(qpc::LOG_MSG_MAX) as u8);
    record(&qp, inbox, INIT2RTR.taken);
    st.set(QpState::Rtr);
    drop(st);
    // The dialer starts once the QP answers requests: frames it reads from the peer (requests already queued
    // there) would be dropped by a QP still in INIT.
    if let Some(link) = dialer {
        let mailbox = c.nic.mailbox().map_err(|_| Fail::of(syn::WIRE_THREAD))?;
        if c.fab.fail_dialer.swap(false, Ordering::SeqCst) {
            return Err(Fail::of(syn::WIRE_THREAD));
        }
        link::spawn_dialer(link, mailbox, c.nic.retry_timeout()).map_err(|_| Fail::of(syn::WIRE_THREAD))?;
    }
    tracing::debug!(qpn = qp.qpn, peer = remote_qpn, "emulated NIC: QP in RTR");
    Ok(())
}

fn rtr2rts(c: &mut Ctx<'_>, inbox: &[u8], _out: &mut [u8]) -> Result<(), Fail> {
    let qp = start(c, inbox, QpState::Rtr)?;
    check_port(inbox, true)?;
    // The progress lock before the state lock (`StateCell`'s order).
    let mut p = lock(&qp.progress);
    let mut st = moving(&qp, QpState::Rtr)?;
    qp.set_sq_psn(get(inbox, qpc::NEXT_SEND_PSN.at(QPC)) as u32);
    // Doorbells written before RTS are ignored (as hardware ignores them in RESET): the register is cleared,
    // and the next write, even of the same value, is a change.
    qp.reset_doorbell(&mut p, c.fab.bf_sentinel);
    record(&qp, inbox, RTR2RTS.taken);
    st.set(QpState::Rts);
    tracing::debug!(qpn = qp.qpn, "emulated NIC: QP in RTS");
    Ok(())
}

fn qp_2err(c: &mut Ctx<'_>, inbox: &[u8], _out: &mut [u8]) -> Result<(), Fail> {
    let qp = live_qp(c, get(inbox, qp_2err_in::QPN) as u32)?;
    // The progress lock before the state lock (`StateCell`'s order): a QP in RTS moves between two of the
    // executor's batches.
    let mut p = lock(&qp.progress);
    let mut st = qp.lock_state();
    // A QP the executor did not watch yet (RST, INIT, RTR) starts being watched in ERR: doorbells written
    // before are ignored, as in RTR2RTS.
    if matches!(st.get(), QpState::Reset | QpState::Init | QpState::Rtr) {
        qp.reset_doorbell(&mut p, c.fab.bf_sentinel);
    }
    st.set(QpState::Error);
    Ok(())
}
