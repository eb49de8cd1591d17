//! Why a firmware command failed: the PRM's command status (`mbox_out.status`) and a 32-bit syndrome
//! (`mbox_out.syndrome`) of the emulated NIC's own that names the exact check.

use gdaki_shared::prm::cmd::status;

/// Syndromes (`mlx5_ifc_mbox_out_bits.syndrome`) the emulated NIC's firmware commands fail with, each with the
/// command status it comes with.
///
/// These codes are the emulator's own: ConnectX firmware uses other (undocumented) values. Each names one
/// check, so that a test or a log can tell "unknown umem" from "umem offset past the registration";
/// [`describe`](cmd_syndrome::describe) gives the line. Two of them carry a bit offset in their low 24 bits
/// ([`BIT_MASK`](cmd_syndrome::BIT_MASK)): [`RESERVED`](cmd_syndrome::RESERVED) and
/// [`NOT_TAKEN`](cmd_syndrome::NOT_TAKEN).
pub mod cmd_syndrome {
    /// The low bits of [`RESERVED`] and [`NOT_TAKEN`] syndromes: a bit offset in the input mailbox (MSB-first
    /// numbering of big-endian dwords, as `prm::cmd::Field` counts).
    pub const BIT_MASK: u32 = 0x00ff_ffff;

    /// The input mailbox is shorter than the command's input layout, or than the 16-byte header
    /// (status `BAD_INP_LEN`).
    pub const SHORT_INBOX: u32 = 0x0001_0001;
    /// The output mailbox is shorter than the command's output layout (status `BAD_OUTP_LEN`).
    pub const SHORT_OUTBOX: u32 = 0x0001_0002;
    /// The opcode is not a command the emulated NIC executes (status `BAD_OP`).
    pub const BAD_OPCODE: u32 = 0x0001_0003;
    /// `op_mod` is not 0 (for QUERY_HCA_CAP: not the general capabilities, maximum or current) (status
    /// `BAD_OP`).
    pub const BAD_OP_MOD: u32 = 0x0001_0004;
    /// `opt_param_mask` is not 0: the emulated NIC takes no optional attributes (status `BAD_PARAM`).
    pub const OPT_PARAM_MASK: u32 = 0x0001_0005;

    /// `RESERVED | bit`: a bit outside every field gdaki's layouts of the command name (one the PRM reserves,
    /// one of a PRM field those layouts leave out such as `qpc.q_key`, or one past the layout, e.g. a page
    /// list) is set; the low 24 bits are its offset (status `BAD_PARAM`).
    pub const RESERVED: u32 = 0x0100_0000;
    /// `NOT_TAKEN | bit`: a field the command does not take, or that the emulated NIC does not model (e.g.
    /// `cqc.oi`, `qpc.no_sq`, a transition's fields in CREATE_QP), is not zero; the low 24 bits are the
    /// offset of the field's first bit (status `BAD_PARAM`).
    pub const NOT_TAKEN: u32 = 0x0200_0000;

    /// `cq_umem_valid` or `wq_umem_valid` is 0: the ring would follow as a page list, which the emulated NIC
    /// does not take (status `BAD_PARAM`).
    pub const PAGE_LIST: u32 = 0x0002_0001;
    /// `cq_umem_id` or `wq_umem_id` names no registered umem (status `BAD_RES`).
    pub const UMEM_UNKNOWN: u32 = 0x0002_0002;
    /// The ring (the CQ ring; the QP's receive queue and send queue) at the umem offset reaches past the
    /// umem's registration (status `BAD_PARAM`).
    pub const UMEM_RANGE: u32 = 0x0002_0003;
    /// The ring's offset in its umem is not a multiple of 64 bytes (a CQE; for a QP, where the send queue
    /// starts) (status `BAD_PARAM`).
    pub const UMEM_ALIGN: u32 = 0x0002_0004;
    /// The CQ ring's umem was registered without `LOCAL_WRITE`, and the NIC writes CQEs into it (status
    /// `BAD_PARAM`).
    pub const UMEM_ACCESS: u32 = 0x0002_0005;
    /// `dbr_umem_valid` is 0: a doorbell record at a device address, which the emulated NIC does not take
    /// (status `BAD_PARAM`).
    pub const DBR_NOT_UMEM: u32 = 0x0002_0006;
    /// `dbr_umem_id` names no registered umem (status `BAD_RES`).
    pub const DBR_UMEM_UNKNOWN: u32 = 0x0002_0007;
    /// The 8-byte doorbell record at `dbr_addr` reaches past its umem's registration (status `BAD_PARAM`).
    pub const DBR_RANGE: u32 = 0x0002_0008;
    /// `dbr_addr` is not a multiple of 8 (status `BAD_PARAM`).
    pub const DBR_ALIGN: u32 = 0x0002_0009;
    /// `uar_page` names no allocated UAR page (status `BAD_RES`).
    pub const UAR_UNKNOWN: u32 = 0x0002_000a;
    /// `uar_page` is the UAR page of another live QP: the emulated NIC watches one QP's doorbells per page
    /// (status `RES_BUSY`).
    pub const UAR_IN_USE: u32 = 0x0002_000b;

    /// `cqc.cqe_sz` is not 64 bytes (status `BAD_PARAM`).
    pub const CQE_SZ: u32 = 0x0003_0001;
    /// `cqc.log_cq_size` is over log2 of `MAX_CQE` (22) (status `BAD_PARAM`).
    pub const LOG_CQ_SIZE: u32 = 0x0003_0002;
    /// The `cqn` names no CQ (status `BAD_RES`).
    pub const CQN_UNKNOWN: u32 = 0x0003_0003;
    /// DESTROY_CQ of a CQ that a QP still completes into (status `RES_BUSY`).
    pub const CQ_IN_USE: u32 = 0x0003_0004;
    /// All 2^24 CQ numbers are used (status `LIM`).
    pub const CQ_NUMBERS: u32 = 0x0003_0005;

    /// `qpc.st` is not RC (status `BAD_PARAM`).
    pub const ST: u32 = 0x0004_0001;
    /// `qpc.pm_state` is not MIGRATED (status `BAD_PARAM`).
    pub const PM_STATE: u32 = 0x0004_0002;
    /// `qpc.pd` names no allocated PD (status `BAD_RES`).
    pub const PD_UNKNOWN: u32 = 0x0004_0003;
    /// `qpc.log_sq_size` is below log2 of `MIN_WQE_CNT` (4) (status `BAD_PARAM`); the 4-bit field cannot be
    /// above log2 of `MAX_WQE_CNT` (15).
    pub const LOG_SQ_SIZE: u32 = 0x0004_0004;
    /// `qpc.rq_type` is neither a receive queue of the QP's own nor none (an SRQ, or undefined) (status
    /// `BAD_PARAM`).
    pub const RQ_TYPE: u32 = 0x0004_0005;
    /// `qpc.cqn_snd` names no CQ (status `BAD_RES`).
    pub const CQN_SND_UNKNOWN: u32 = 0x0004_0006;
    /// `qpc.cqn_rcv` names no CQ (status `BAD_RES`).
    pub const CQN_RCV_UNKNOWN: u32 = 0x0004_0007;
    /// The send CQ has fewer entries than the SQ has WQEBBs, so that it could overrun (status `BAD_PARAM`).
    pub const CQ_TOO_SMALL: u32 = 0x0004_0008;
    /// `qpc.ts_format` is not FREE_RUNNING or DEFAULT (status `BAD_PARAM`).
    pub const TS_FORMAT: u32 = 0x0004_0009;
    /// All 2^24 QP numbers are used (status `LIM`).
    pub const QP_NUMBERS: u32 = 0x0004_000a;
    /// `qpc.log_rq_size` or `log_rq_stride` is set for a QP without a receive queue (`rq_type` ZERO_LEN)
    /// (status `BAD_PARAM`).
    pub const RQ_SHAPE: u32 = 0x0004_000b;

    /// The `qpn` names no QP (status `BAD_RES`).
    pub const QPN_UNKNOWN: u32 = 0x0005_0001;
    /// The QP is not in the state the transition starts from (RST2INIT: RST, INIT2RTR: INIT, RTR2RTS: RTR)
    /// (status `BAD_QP_STATE`).
    pub const BAD_STATE: u32 = 0x0005_0002;
    /// The address path's `vhca_port_num` is not port 1 (0 is taken for "unchanged" after RST2INIT) (status
    /// `BAD_PARAM`).
    pub const PORT: u32 = 0x0005_0003;
    /// The address path's `pkey_index` is not 0, the one P_Key (status `BAD_PARAM`).
    pub const PKEY_INDEX: u32 = 0x0005_0004;
    /// `qpc.mtu` is not one of 256 ..= 4096 bytes (status `BAD_PARAM`).
    pub const MTU: u32 = 0x0005_0005;
    /// `qpc.remote_qpn` names no live QP of this NIC, whose GID the path names (status `BAD_PARAM`).
    pub const REMOTE_QPN: u32 = 0x0005_0006;
    /// The path's `rgid_rip` is not the GID of an emulated NIC (`fe80::` and the NIC's identifier) (status
    /// `BAD_PARAM`).
    pub const RGID: u32 = 0x0005_0007;
    /// The path's `rlid` is not 0: the emulated port is RoCE, which has no LIDs (status `BAD_PARAM`).
    pub const RLID: u32 = 0x0005_0008;
    /// The path's `src_addr_index` is not 0, the port's one GID (status `BAD_PARAM`).
    pub const SRC_ADDR_INDEX: u32 = 0x0005_0009;
    /// The path's `hop_limit` is 0: no packet would leave (status `BAD_PARAM`).
    pub const HOP_LIMIT: u32 = 0x0005_000a;
    /// The path names another NIC, and this one has no wire (status `BAD_PARAM`).
    pub const NO_WIRE: u32 = 0x0005_000b;
    /// The path names another NIC whose wire address was never given (`EmuNic::add_neighbor`): the emulated
    /// neighbour table has no entry for its GID (status `BAD_PARAM`).
    pub const NO_NEIGHBOR: u32 = 0x0005_000c;
    /// The thread that dials the peer's NIC could not be started (status `INTERNAL_ERR`).
    pub const WIRE_THREAD: u32 = 0x0005_000d;

    /// The command status that comes with `syndrome`, or `None` for a value this module does not define.
    pub const fn status(syndrome: u32) -> Option<u8> {
        use gdaki_shared::prm::cmd::status::*;
        Some(match syndrome & !BIT_MASK {
            RESERVED | NOT_TAKEN => BAD_PARAM,
            0 => match syndrome {
                SHORT_INBOX => BAD_INP_LEN,
                SHORT_OUTBOX => BAD_OUTP_LEN,
                BAD_OPCODE | BAD_OP_MOD => BAD_OP,
                UMEM_UNKNOWN | DBR_UMEM_UNKNOWN | UAR_UNKNOWN | CQN_UNKNOWN | PD_UNKNOWN | CQN_SND_UNKNOWN
                | CQN_RCV_UNKNOWN | QPN_UNKNOWN => BAD_RES,
                UAR_IN_USE | CQ_IN_USE => RES_BUSY,
                CQ_NUMBERS | QP_NUMBERS => LIM,
                BAD_STATE => BAD_QP_STATE,
                WIRE_THREAD => INTERNAL_ERR,
                OPT_PARAM_MASK | PAGE_LIST | UMEM_RANGE | UMEM_ALIGN | UMEM_ACCESS | DBR_NOT_UMEM | DBR_RANGE
                | DBR_ALIGN | CQE_SZ | LOG_CQ_SIZE | ST | PM_STATE | LOG_SQ_SIZE | RQ_TYPE | CQ_TOO_SMALL
                | TS_FORMAT | RQ_SHAPE | PORT | PKEY_INDEX | MTU | REMOTE_QPN | RGID | RLID | SRC_ADDR_INDEX
                | HOP_LIMIT | NO_WIRE | NO_NEIGHBOR => BAD_PARAM,
                _ => return None,
            },
            _ => return None,
        })
    }

    /// One line saying what failed for `syndrome`, or `None` for a value this module does not define.
    pub const fn describe(syndrome: u32) -> Option<&'static str> {
        Some(match syndrome & !BIT_MASK {
            RESERVED => "a reserved bit is set (the low 24 bits are its offset)",
            NOT_TAKEN => "a field the command does not take is set (the low 24 bits are its offset)",
            0 => match syndrome {
                SHORT_INBOX => "the input mailbox is shorter than the command's input",
                SHORT_OUTBOX => "the output mailbox is shorter than the command's output",
                BAD_OPCODE => "the emulated NIC does not execute this opcode",
                BAD_OP_MOD => "op_mod is not one the command takes",
                OPT_PARAM_MASK => "opt_param_mask is not 0",
                PAGE_LIST => "the ring is not in a umem (*_umem_valid = 0)",
                UMEM_UNKNOWN => "the ring's umem id names no registered umem",
                UMEM_RANGE => "the ring reaches past its umem's registration",
                UMEM_ALIGN => "the ring's umem offset is not 64-byte aligned",
                UMEM_ACCESS => "the CQ ring's umem was registered without LOCAL_WRITE",
                DBR_NOT_UMEM => "the doorbell record is not in a umem (dbr_umem_valid = 0)",
                DBR_UMEM_UNKNOWN => "dbr_umem_id names no registered umem",
                DBR_RANGE => "the doorbell record reaches past its umem's registration",
                DBR_ALIGN => "dbr_addr is not 8-byte aligned",
                UAR_UNKNOWN => "uar_page names no allocated UAR page",
                UAR_IN_USE => "uar_page is another live QP's UAR page",
                CQE_SZ => "cqe_sz is not 64 bytes",
                LOG_CQ_SIZE => "log_cq_size is over 22",
                CQN_UNKNOWN => "cqn names no CQ",
                CQ_IN_USE => "a QP still completes into the CQ",
                CQ_NUMBERS => "all CQ numbers are used",
                ST => "st is not RC",
                PM_STATE => "pm_state is not MIGRATED",
                PD_UNKNOWN => "pd names no allocated PD",
                LOG_SQ_SIZE => "log_sq_size is below 4",
                RQ_TYPE => "rq_type is not a receive queue of the QP's own or none",
                CQN_SND_UNKNOWN => "cqn_snd names no CQ",
                CQN_RCV_UNKNOWN => "cqn_rcv names no CQ",
                CQ_TOO_SMALL => "the send CQ has fewer entries than the SQ has WQEBBs",
                TS_FORMAT => "ts_format is not FREE_RUNNING or DEFAULT",
                QP_NUMBERS => "all QP numbers are used",
                RQ_SHAPE => "log_rq_size or log_rq_stride is set for a QP without a receive queue",
                QPN_UNKNOWN => "qpn names no QP",
                BAD_STATE => "the QP is not in the state the transition starts from",
                PORT => "vhca_port_num is not port 1",
                PKEY_INDEX => "pkey_index is not 0",
                MTU => "mtu is not 256..=4096 bytes",
                REMOTE_QPN => "remote_qpn names no live QP of this NIC",
                RGID => "rgid_rip is not the GID of an emulated NIC",
                RLID => "rlid is not 0 on the RoCE port",
                SRC_ADDR_INDEX => "src_addr_index is not 0",
                HOP_LIMIT => "hop_limit is 0",
                NO_WIRE => "the path names another NIC and this one has no wire",
                NO_NEIGHBOR => "the path names a NIC whose wire address is unknown (add_neighbor)",
                WIRE_THREAD => "the thread that dials the peer could not be started",
                _ => return None,
            },
            _ => return None,
        })
    }
}

/// A failed command: what goes into the output mailbox.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Fail {
    /// `mbox_out.status` ([`status`]).
    pub status: u8,
    /// `mbox_out.syndrome` ([`cmd_syndrome`]).
    pub syndrome: u32,
}

impl Fail {
    /// The failure `syndrome` names, with its status.
    pub(crate) const fn of(syndrome: u32) -> Fail {
        let status = match cmd_syndrome::status(syndrome) {
            Some(s) => s,
            None => status::INTERNAL_ERR,
        };
        Fail { status, syndrome }
    }
}

#[cfg(test)]
mod tests {
    use super::cmd_syndrome::*;

    /// Every syndrome of the module, for the checks below.
    const ALL: &[u32] = &[
        SHORT_INBOX,
        SHORT_OUTBOX,
        BAD_OPCODE,
        BAD_OP_MOD,
        OPT_PARAM_MASK,
        RESERVED,
        NOT_TAKEN,
        PAGE_LIST,
        UMEM_UNKNOWN,
        UMEM_RANGE,
        UMEM_ALIGN,
        UMEM_ACCESS,
        DBR_NOT_UMEM,
        DBR_UMEM_UNKNOWN,
        DBR_RANGE,
        DBR_ALIGN,
        UAR_UNKNOWN,
        UAR_IN_USE,
        CQE_SZ,
        LOG_CQ_SIZE,
        CQN_UNKNOWN,
        CQ_IN_USE,
        CQ_NUMBERS,
        ST,
        PM_STATE,
        PD_UNKNOWN,
        LOG_SQ_SIZE,
        RQ_TYPE,
        CQN_SND_UNKNOWN,
        CQN_RCV_UNKNOWN,
        CQ_TOO_SMALL,
        TS_FORMAT,
        QP_NUMBERS,
        RQ_SHAPE,
        QPN_UNKNOWN,
        BAD_STATE,
        PORT,
        PKEY_INDEX,
        MTU,
        REMOTE_QPN,
        RGID,
        RLID,
        SRC_ADDR_INDEX,
        HOP_LIMIT,
        NO_WIRE,
        NO_NEIGHBOR,
        WIRE_THREAD,
    ];

    #[test]
    fn every_syndrome_is_distinct_has_a_status_and_a_line() {
        let mut seen = std::collections::HashSet::new();
        for &s in ALL {
            assert!(seen.insert(s), "{s:#x} twice");
            assert!(status(s).is_some(), "{s:#x} has no status");
            assert!(describe(s).is_some_and(|d| !d.is_empty()), "{s:#x} has no description");
        }
        assert_eq!(status(RESERVED | 0x123), status(RESERVED));
        assert_eq!(status(0x7777), None);
        assert_eq!(describe(0x0400_0000), None);
    }
}
