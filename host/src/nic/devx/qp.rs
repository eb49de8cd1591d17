//! CREATE_QP, the state transitions, QUERY_QP and DESTROY_QP of an RC QP.

use gdaki_shared::prm::cmd::{
    ads, create_qp_in, create_qp_out, destroy_qp_in, init2rtr_qp_in, init2rtr_qp_out, opcode, qp_2err_in, qp_2err_out,
    qpc, query_qp_in, query_qp_out, rst2init_qp_in, rst2init_qp_out, rtr2rts_qp_in, rtr2rts_qp_out, Field,
};

use super::{set, start, Created, Transport};
use crate::{Error, Result};

/// The receive queue of a QP (`qpc.rq_type` and its size): in the work queue buffer before the send queue.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Rq {
    /// No receive queue (`rq_type` ZERO_LEN): a QP that only sends and is written to.
    #[default]
    None,
    /// A receive queue of the QP's own (`rq_type` NON_ZERO): `2^log_size` WQEs of `16 << log_stride` bytes.
    Own {
        /// `qpc.log_rq_size`.
        log_size: u8,
        /// `qpc.log_rq_stride`.
        log_stride: u8,
    },
}

impl Rq {
    /// Bytes the receive queue takes at the start of the work queue buffer (the send queue follows), or
    /// `None` for a receive queue `qpc` cannot describe (`log_size` over 15 or `log_stride` over 7, the
    /// widths of `log_rq_size` and `log_rq_stride`, which [`create_qp_in()`] refuses too).
    pub fn bytes(self) -> Option<u64> {
        match self {
            Rq::None => Some(0),
            Rq::Own { log_size, log_stride }
                if u64::from(log_size) > qpc::LOG_RQ_SIZE.max() || u64::from(log_stride) > qpc::LOG_RQ_STRIDE.max() =>
            {
                None
            }
            Rq::Own { log_size, log_stride } => Some(1u64 << (u32::from(log_size) + 4 + u32::from(log_stride))),
        }
    }
}

/// What CREATE_QP creates: an RC QP (`st` RC, `pm_state` MIGRATED) whose work queue and doorbell record are
/// in umems, in RST.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpAttr {
    /// `qpc.pd`: the protection domain number (`mlx5dv_pd.pdn`).
    pub pd: u32,
    /// `qpc.log_sq_size`: log2 of the send queue's 64-byte WQEBBs.
    pub log_sq_size: u8,
    /// The receive queue (`qpc.rq_type`, `log_rq_size`, `log_rq_stride`).
    pub rq: Rq,
    /// `qpc.cqn_snd`: the send CQ.
    pub cqn_snd: u32,
    /// `qpc.cqn_rcv`: the receive CQ (responder completions).
    pub cqn_rcv: u32,
    /// `qpc.uar_page`: the UAR page of the QP's doorbells (`mlx5dv_devx_uar.page_id`).
    pub uar_page: u32,
    /// `qpc.log_msg_max`: log2 of the longest message in bytes (at most `cmd_hca_cap.log_max_msg`).
    pub log_msg_max: u8,
    /// `qpc.ts_format`: the CQE timestamps' format (`qpc::ts_format`; DEFAULT, 1, as rdma-core's DevX tests
    /// set it, where the device requires one).
    pub ts_format: u8,
    /// `wq_umem_id`: the umem of the work queue buffer (receive queue, then send queue).
    pub wq_umem_id: u32,
    /// `wq_umem_offset`: the buffer's byte offset in it.
    pub wq_umem_offset: u64,
    /// `qpc.dbr_umem_id`: the umem of the 8-byte doorbell record (receive counter, send counter).
    pub dbr_umem_id: u32,
    /// `qpc.dbr_addr`: the doorbell record's byte offset in its umem (8-byte aligned).
    pub dbr_offset: u64,
}

/// A [`qpc`] field in CREATE_QP's input.
const fn cq(f: Field) -> Field {
    create_qp_in::qpc(f)
}

/// CREATE_QP's input for an RC QP: `wq_umem_valid` and `qpc.dbr_umem_valid` set.
///
/// # Errors
/// [`Error::InvalidArgument`] naming the field whose value does not fit it.
pub fn create_qp_in(a: &QpAttr) -> Result<[u8; create_qp_in::SIZE]> {
    let op = opcode::CREATE_QP;
    let mut b = start(op);
    let (rq_type, log_rq, stride) = match a.rq {
        Rq::None => (qpc::rq_type::ZERO_LEN, 0, 0),
        Rq::Own { log_size, log_stride } => (qpc::rq_type::NON_ZERO, log_size, log_stride),
    };
    let fields: [(&str, Field, u64); 17] = [
        ("qpc.st", cq(qpc::ST), qpc::st::RC.into()),
        ("qpc.pm_state", cq(qpc::PM_STATE), qpc::pm_state::MIGRATED.into()),
        ("qpc.pd", cq(qpc::PD), a.pd.into()),
        ("qpc.log_msg_max", cq(qpc::LOG_MSG_MAX), a.log_msg_max.into()),
        ("qpc.rq_type", cq(qpc::RQ_TYPE), rq_type.into()),
        ("qpc.log_rq_size", cq(qpc::LOG_RQ_SIZE), log_rq.into()),
        ("qpc.log_rq_stride", cq(qpc::LOG_RQ_STRIDE), stride.into()),
        ("qpc.log_sq_size", cq(qpc::LOG_SQ_SIZE), a.log_sq_size.into()),
        ("qpc.ts_format", cq(qpc::TS_FORMAT), a.ts_format.into()),
        ("qpc.uar_page", cq(qpc::UAR_PAGE), a.uar_page.into()),
        ("qpc.cqn_snd", cq(qpc::CQN_SND), a.cqn_snd.into()),
        ("qpc.cqn_rcv", cq(qpc::CQN_RCV), a.cqn_rcv.into()),
        ("qpc.dbr_umem_valid", cq(qpc::DBR_UMEM_VALID), 1),
        ("qpc.dbr_umem_id", cq(qpc::DBR_UMEM_ID), a.dbr_umem_id.into()),
        ("qpc.dbr_addr", cq(qpc::DBR_ADDR), a.dbr_offset),
        ("wq_umem_id", create_qp_in::WQ_UMEM_ID, a.wq_umem_id.into()),
        ("wq_umem_offset", create_qp_in::WQ_UMEM_OFFSET, a.wq_umem_offset),
    ];
    for (name, f, v) in fields {
        set(&mut b, op, name, f, v)?;
    }
    set(&mut b, op, "wq_umem_valid", create_qp_in::WQ_UMEM_VALID, 1)?;
    Ok(b)
}

/// Creates the QP `a` describes, in RST; its number is [`Created::id`] (`create_qp_out.qpn`).
///
/// # Errors
/// As [`create_qp_in()`]; the transport's ([`Error::DevxCmd`] when the command fails).
pub fn create_qp<T: Transport>(t: &T, a: &QpAttr) -> Result<Created<T::Obj>> {
    let mut out = [0u8; create_qp_out::SIZE];
    let obj = t.obj_create(&create_qp_in(a)?, &mut out)?;
    Ok(Created { obj, id: create_qp_out::qpn(&out) })
}

/// RST2INIT's attributes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Rst2Init {
    /// The primary path's `vhca_port_num`: the port, from 1.
    pub port: u8,
    /// The primary path's `pkey_index`.
    pub pkey_index: u16,
    /// `qpc.rre`: peers may RDMA READ (`IBV_ACCESS_REMOTE_READ` of `qp_access_flags`).
    pub remote_read: bool,
    /// `qpc.rwe`: peers may RDMA WRITE.
    pub remote_write: bool,
    /// `qpc.rae`: peers may run atomics.
    pub remote_atomic: bool,
}

/// The GRH of an address path: how to reach the peer by GID (RoCE v2: its IP address; InfiniBand: a routed or
/// global path).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Grh {
    /// `ads.rgid_rip`: the peer's GID, in wire order.
    pub rgid: [u8; 16],
    /// `ads.src_addr_index`: the local GID table index (`sgid_index`).
    pub src_addr_index: u8,
    /// `ads.hop_limit`: the IP TTL / hop limit.
    pub hop_limit: u8,
    /// `ads.tclass`: the traffic class (RoCE: DSCP and ECN).
    pub tclass: u8,
    /// `ads.flow_label`, 20 bits.
    pub flow_label: u32,
}

/// Where an INIT2RTR's primary path leads: the peer's address on the port's link layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AddressPath {
    /// InfiniBand: the peer's LID (`ads.rlid`) and service level (`ads.sl`), with a GRH (`ads.grh` set) for a
    /// routed path.
    Ib {
        /// `ads.rlid`.
        rlid: u16,
        /// `ads.sl`, 4 bits.
        sl: u8,
        /// The GRH, if any.
        grh: Option<Grh>,
    },
    /// RoCE v2: the peer's GID (`ads.rgid_rip`, with the GRH fields describing the IP header; `ads.grh` is
    /// not set, as rdma-core's DevX tests leave it on Ethernet), its MAC and the UDP source port.
    RoceV2 {
        /// The peer's GID and the IP header's fields.
        grh: Grh,
        /// `ads.rmac_47_32`, `ads.rmac_31_0`: the peer's (or the next hop's) MAC.
        rmac: [u8; 6],
        /// `ads.udp_sport`: the UDP source port (spreads flows over paths).
        udp_sport: u16,
        /// `ads.eth_prio`: the VLAN priority, 3 bits.
        eth_prio: u8,
    },
}

/// INIT2RTR's attributes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Init2Rtr {
    /// `qpc.remote_qpn`: the peer QP's number.
    pub remote_qpn: u32,
    /// `qpc.next_rcv_psn`: the PSN the peer's requests start at (verbs' `rq_psn`, the peer's `sq_psn`).
    pub rq_psn: u32,
    /// `qpc.mtu`: the path MTU (`qpc::mtu`, verbs' `IBV_MTU_*`).
    pub mtu: u8,
    /// `qpc.log_msg_max`: log2 of the longest message.
    pub log_msg_max: u8,
    /// `qpc.min_rnr_nak`: the RNR NAK timer this QP sends as responder (verbs' `min_rnr_timer`).
    pub min_rnr_nak: u8,
    /// `qpc.log_rra_max`: log2 of the READs and atomics accepted in flight as responder
    /// (`max_dest_rd_atomic`).
    pub log_rra_max: u8,
    /// The primary path's `vhca_port_num`.
    pub port: u8,
    /// The primary path's address fields.
    pub path: AddressPath,
}

/// RTR2RTS's attributes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Rtr2Rts {
    /// `qpc.next_send_psn`: the PSN this QP's requests start at (verbs' `sq_psn`).
    pub sq_psn: u32,
    /// The primary path's `ack_timeout`: 4.096 us * 2^n (verbs' `timeout`).
    pub ack_timeout: u8,
    /// `qpc.retry_count` (verbs' `retry_cnt`), 3 bits.
    pub retry_count: u8,
    /// `qpc.rnr_retry` (7: forever), 3 bits.
    pub rnr_retry: u8,
    /// `qpc.log_sra_max`: log2 of the READs and atomics in flight as requester (`max_rd_atomic`).
    pub log_sra_max: u8,
    /// The primary path's `vhca_port_num`.
    pub port: u8,
}

/// A `qpc` field in a transition's input (the three share one layout).
const fn ctx(f: Field) -> Field {
    f.at(rst2init_qp_in::QPC)
}

/// A primary-path field in a transition's input.
const fn path(f: Field) -> Field {
    f.at(rst2init_qp_in::QPC + qpc::PRIMARY_ADDRESS_PATH)
}

/// A transition's input for `qpn` with its `qpc` fields `fields` (`opt_param_mask` 0).
fn modify_in(op: u16, qpn: u32, fields: &[(&str, Field, u64)]) -> Result<[u8; rst2init_qp_in::SIZE]> {
    let mut b = start(op);
    set(&mut b, op, "qpn", rst2init_qp_in::QPN, qpn.into())?;
    for &(name, f, v) in fields {
        set(&mut b, op, name, f, v)?;
    }
    Ok(b)
}

/// RST2INIT's input for `qpn`.
///
/// # Errors
/// [`Error::InvalidArgument`] naming the field whose value does not fit it.
pub fn rst2init_in(qpn: u32, a: &Rst2Init) -> Result<[u8; rst2init_qp_in::SIZE]> {
    modify_in(
        opcode::RST2INIT_QP,
        qpn,
        &[
            ("ads.vhca_port_num", path(ads::VHCA_PORT_NUM), a.port.into()),
            ("ads.pkey_index", path(ads::PKEY_INDEX), a.pkey_index.into()),
            ("qpc.rre", ctx(qpc::RRE), a.remote_read.into()),
            ("qpc.rwe", ctx(qpc::RWE), a.remote_write.into()),
            ("qpc.rae", ctx(qpc::RAE), a.remote_atomic.into()),
        ],
    )
}

/// INIT2RTR's input for `qpn`.
///
/// # Errors
/// [`Error::InvalidArgument`] naming the field whose value does not fit it.
pub fn init2rtr_in(qpn: u32, a: &Init2Rtr) -> Result<[u8; init2rtr_qp_in::SIZE]> {
    let op = opcode::INIT2RTR_QP;
    let mut b = modify_in(
        op,
        qpn,
        &[
            ("qpc.remote_qpn", ctx(qpc::REMOTE_QPN), a.remote_qpn.into()),
            ("qpc.next_rcv_psn", ctx(qpc::NEXT_RCV_PSN), a.rq_psn.into()),
            ("qpc.mtu", ctx(qpc::MTU), a.mtu.into()),
            ("qpc.log_msg_max", ctx(qpc::LOG_MSG_MAX), a.log_msg_max.into()),
            ("qpc.min_rnr_nak", ctx(qpc::MIN_RNR_NAK), a.min_rnr_nak.into()),
            ("qpc.log_rra_max", ctx(qpc::LOG_RRA_MAX), a.log_rra_max.into()),
            ("ads.vhca_port_num", path(ads::VHCA_PORT_NUM), a.port.into()),
        ],
    )?;
    let grh = |b: &mut [u8], g: &Grh| -> Result<()> {
        let rgid = ads::RGID_RIP.at(init2rtr_qp_in::QPC + qpc::PRIMARY_ADDRESS_PATH);
        rgid.set(b, &g.rgid).map_err(|e| Error::InvalidArgument(format!("INIT2RTR_QP ads.rgid_rip: {e}")))?;
        set(b, op, "ads.src_addr_index", path(ads::SRC_ADDR_INDEX), g.src_addr_index.into())?;
        set(b, op, "ads.hop_limit", path(ads::HOP_LIMIT), g.hop_limit.into())?;
        set(b, op, "ads.tclass", path(ads::TCLASS), g.tclass.into())?;
        set(b, op, "ads.flow_label", path(ads::FLOW_LABEL), g.flow_label.into())
    };
    match &a.path {
        AddressPath::Ib { rlid, sl, grh: g } => {
            set(&mut b, op, "ads.rlid", path(ads::RLID), (*rlid).into())?;
            set(&mut b, op, "ads.sl", path(ads::SL), (*sl).into())?;
            if let Some(g) = g {
                set(&mut b, op, "ads.grh", path(ads::GRH), 1)?;
                grh(&mut b, g)?;
            }
        }
        AddressPath::RoceV2 { grh: g, rmac, udp_sport, eth_prio } => {
            grh(&mut b, g)?;
            let mac = ads::RMAC.at(init2rtr_qp_in::QPC + qpc::PRIMARY_ADDRESS_PATH);
            mac.set(&mut b, rmac).map_err(|e| Error::InvalidArgument(format!("INIT2RTR_QP ads.rmac: {e}")))?;
            set(&mut b, op, "ads.udp_sport", path(ads::UDP_SPORT), (*udp_sport).into())?;
            set(&mut b, op, "ads.eth_prio", path(ads::ETH_PRIO), (*eth_prio).into())?;
        }
    }
    Ok(b)
}

/// RTR2RTS's input for `qpn`.
///
/// # Errors
/// [`Error::InvalidArgument`] naming the field whose value does not fit it.
pub fn rtr2rts_in(qpn: u32, a: &Rtr2Rts) -> Result<[u8; rtr2rts_qp_in::SIZE]> {
    modify_in(
        opcode::RTR2RTS_QP,
        qpn,
        &[
            ("qpc.next_send_psn", ctx(qpc::NEXT_SEND_PSN), a.sq_psn.into()),
            ("ads.ack_timeout", path(ads::ACK_TIMEOUT), a.ack_timeout.into()),
            ("qpc.retry_count", ctx(qpc::RETRY_COUNT), a.retry_count.into()),
            ("qpc.rnr_retry", ctx(qpc::RNR_RETRY), a.rnr_retry.into()),
            ("qpc.log_sra_max", ctx(qpc::LOG_SRA_MAX), a.log_sra_max.into()),
            ("ads.vhca_port_num", path(ads::VHCA_PORT_NUM), a.port.into()),
        ],
    )
}

/// A 16-byte input of command `op` naming `qpn` in `field`.
fn qpn_in(op: u16, field: Field, qpn: u32) -> Result<[u8; 16]> {
    let mut b = start(op);
    set(&mut b, op, "qpn", field, qpn.into())?;
    Ok(b)
}

/// 2ERR_QP's input for `qpn`.
///
/// # Errors
/// [`Error::InvalidArgument`] for a QPN over 24 bits.
pub fn qp_2err_in(qpn: u32) -> Result<[u8; qp_2err_in::SIZE]> {
    qpn_in(opcode::QP_2ERR, qp_2err_in::QPN, qpn)
}

/// QUERY_QP's input for `qpn`.
///
/// # Errors
/// [`Error::InvalidArgument`] for a QPN over 24 bits.
pub fn query_qp_in(qpn: u32) -> Result<[u8; query_qp_in::SIZE]> {
    qpn_in(opcode::QUERY_QP, query_qp_in::QPN, qpn)
}

/// DESTROY_QP's input for `qpn`.
///
/// # Errors
/// [`Error::InvalidArgument`] for a QPN over 24 bits.
pub fn destroy_qp_in(qpn: u32) -> Result<[u8; destroy_qp_in::SIZE]> {
    qpn_in(opcode::DESTROY_QP, destroy_qp_in::QPN, qpn)
}

/// Moves QP `qpn` (the transport's `obj`) from RST to INIT.
///
/// # Errors
/// As [`rst2init_in()`]; the transport's ([`Error::DevxCmd`] when the command fails, e.g. `BAD_QP_STATE`).
pub fn rst2init<T: Transport>(t: &T, obj: &T::Obj, qpn: u32, a: &Rst2Init) -> Result<()> {
    t.obj_modify(obj, &rst2init_in(qpn, a)?, &mut [0u8; rst2init_qp_out::SIZE])
}

/// Moves QP `qpn` from INIT to RTR.
///
/// # Errors
/// As [`init2rtr_in()`]; the transport's ([`Error::DevxCmd`] when the command fails).
pub fn init2rtr<T: Transport>(t: &T, obj: &T::Obj, qpn: u32, a: &Init2Rtr) -> Result<()> {
    t.obj_modify(obj, &init2rtr_in(qpn, a)?, &mut [0u8; init2rtr_qp_out::SIZE])
}

/// Moves QP `qpn` from RTR to RTS.
///
/// # Errors
/// As [`rtr2rts_in()`]; the transport's ([`Error::DevxCmd`] when the command fails).
pub fn rtr2rts<T: Transport>(t: &T, obj: &T::Obj, qpn: u32, a: &Rtr2Rts) -> Result<()> {
    t.obj_modify(obj, &rtr2rts_in(qpn, a)?, &mut [0u8; rtr2rts_qp_out::SIZE])
}

/// Moves QP `qpn` to ERR, from any state.
///
/// # Errors
/// As [`qp_2err_in()`]; the transport's ([`Error::DevxCmd`] when the command fails).
pub fn to_err<T: Transport>(t: &T, obj: &T::Obj, qpn: u32) -> Result<()> {
    t.obj_modify(obj, &qp_2err_in(qpn)?, &mut [0u8; qp_2err_out::SIZE])
}

/// Runs `steps`, the transitions of QP `qpn` (the transport's `obj`) after its RST2INIT, and when one fails
/// moves the QP to ERR ([`to_err()`]) before returning that failure, as the RDMA connection manager does with
/// a QP it could not bring to RTS: in INIT or RTR the QP would silently never execute a WQE posted on it,
/// while in ERR each completes at once with a flush error CQE (syndrome 0x05, WR_FLUSH_ERR). A failed 2ERR is
/// logged as a `tracing` warning, and the transitions' error returned all the same.
///
/// # Errors
/// The error `steps` returned.
pub fn to_err_on_failure<T: Transport>(
    t: &T,
    obj: &T::Obj,
    qpn: u32,
    steps: impl FnOnce() -> Result<()>,
) -> Result<()> {
    let e = match steps() {
        Ok(()) => return Ok(()),
        Err(e) => e,
    };
    // The caller gets the transition's error, which says why the connect failed; the 2ERR's only says why the
    // QP may still be in INIT or RTR.
    if let Err(e2) = to_err(t, obj, qpn) {
        tracing::warn!("QP {qpn:#x} could not be moved to ERR after a failed transition ({e}): {e2}");
    }
    Err(e)
}

/// What QUERY_QP returned: the QP's `qpc`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QpQuery {
    qpc: [u8; qpc::SIZE],
}

impl QpQuery {
    /// `qpc.state` (`qpc::state`: RST 0, INIT 1, RTR 2, RTS 3, ERR 6).
    pub fn state(&self) -> u8 {
        self.get(qpc::STATE) as u8
    }

    /// Field `f` of the `qpc` (a constant of `gdaki_shared::prm::cmd::qpc`, or an `ads` field moved with
    /// `qpc::primary_address_path`).
    pub fn get(&self, f: Field) -> u64 {
        f.try_get(&self.qpc).unwrap_or(0)
    }

    /// The `qpc`'s bytes (232, big-endian).
    pub fn qpc(&self) -> &[u8; qpc::SIZE] {
        &self.qpc
    }
}

/// Queries QP `qpn`.
///
/// # Errors
/// As [`query_qp_in()`]; the transport's ([`Error::DevxCmd`] when the command fails).
pub fn query_qp<T: Transport>(t: &T, obj: &T::Obj, qpn: u32) -> Result<QpQuery> {
    let mut out = [0u8; query_qp_out::SIZE];
    t.obj_query(obj, &query_qp_in(qpn)?, &mut out)?;
    let at = query_qp_out::QPC as usize / 8;
    let mut q = QpQuery { qpc: [0; qpc::SIZE] };
    q.qpc.copy_from_slice(&out[at..at + qpc::SIZE]);
    Ok(q)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_qp_in_sets_the_fields_and_nothing_else_is_set() {
        let a = QpAttr {
            pd: 3,
            log_sq_size: 6,
            rq: Rq::Own { log_size: 2, log_stride: 1 },
            cqn_snd: 7,
            cqn_rcv: 8,
            uar_page: 9,
            log_msg_max: 30,
            ts_format: qpc::ts_format::DEFAULT,
            wq_umem_id: 10,
            wq_umem_offset: 4096,
            dbr_umem_id: 11,
            dbr_offset: 64,
        };
        let b = create_qp_in(&a).unwrap();
        assert_eq!(create_qp_in::OPCODE.get(&b), u64::from(opcode::CREATE_QP));
        assert_eq!(cq(qpc::PD).get(&b), 3);
        assert_eq!(cq(qpc::LOG_SQ_SIZE).get(&b), 6);
        assert_eq!(cq(qpc::RQ_TYPE).get(&b), u64::from(qpc::rq_type::NON_ZERO));
        assert_eq!(cq(qpc::PM_STATE).get(&b), u64::from(qpc::pm_state::MIGRATED));
        assert_eq!(create_qp_in::WQ_UMEM_OFFSET.get(&b), 4096);
        assert_eq!(create_qp_in::WQ_UMEM_VALID.get(&b), 1);
        assert_eq!(cq(qpc::DBR_ADDR).get(&b), 64);
        assert_eq!(Rq::Own { log_size: 2, log_stride: 1 }.bytes(), Some(128));
        assert_eq!(Rq::Own { log_size: 15, log_stride: 7 }.bytes(), Some(1 << 26));
        assert_eq!(Rq::None.bytes(), Some(0));
        // A value wider than its field is refused, naming the field.
        let e = create_qp_in(&QpAttr { log_sq_size: 16, ..a }).unwrap_err().to_string();
        assert!(e.contains("CREATE_QP") && e.contains("log_sq_size"), "{e}");
    }

    #[test]
    fn init2rtr_in_writes_the_path_of_either_link_layer() {
        let g = Grh { rgid: [0xab; 16], src_addr_index: 3, hop_limit: 64, tclass: 0, flow_label: 0 };
        let base = Init2Rtr {
            remote_qpn: 0x123,
            rq_psn: 0x456,
            mtu: qpc::mtu::MTU_4K,
            log_msg_max: 31,
            min_rnr_nak: 12,
            log_rra_max: 4,
            port: 1,
            path: AddressPath::RoceV2 { grh: g, rmac: [1, 2, 3, 4, 5, 6], udp_sport: 0xdcba, eth_prio: 0 },
        };
        let b = init2rtr_in(0x99, &base).unwrap();
        assert_eq!(init2rtr_qp_in::QPN.get(&b), 0x99);
        assert_eq!(ctx(qpc::REMOTE_QPN).get(&b), 0x123);
        assert_eq!(path(ads::GRH).get(&b), 0, "no grh bit on RoCE");
        assert_eq!(path(ads::SRC_ADDR_INDEX).get(&b), 3);
        assert_eq!(path(ads::UDP_SPORT).get(&b), 0xdcba);
        let rmac = ads::RMAC.at(init2rtr_qp_in::QPC + qpc::PRIMARY_ADDRESS_PATH);
        assert_eq!(rmac.get(&b), [1, 2, 3, 4, 5, 6]);
        let ib = Init2Rtr { path: AddressPath::Ib { rlid: 0x42, sl: 1, grh: Some(g) }, ..base };
        let b = init2rtr_in(0x99, &ib).unwrap();
        assert_eq!((path(ads::RLID).get(&b), path(ads::GRH).get(&b)), (0x42, 1));
        let rgid = ads::RGID_RIP.at(init2rtr_qp_in::QPC + qpc::PRIMARY_ADDRESS_PATH);
        assert_eq!(rgid.get(&b), [0xab; 16]);
    }

    #[test]
    fn rq_bytes_of_a_shape_the_fields_cannot_hold_is_none_not_a_panic() {
        assert_eq!(Rq::Own { log_size: 16, log_stride: 0 }.bytes(), None);
        assert_eq!(Rq::Own { log_size: 64, log_stride: 0 }.bytes(), None);
        assert_eq!(Rq::Own { log_size: 0, log_stride: 8 }.bytes(), None);
        assert_eq!(Rq::Own { log_size: 255, log_stride: 255 }.bytes(), None);
    }
}
