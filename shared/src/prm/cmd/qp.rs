//! CREATE_QP, the QP state transitions, QUERY_QP and DESTROY_QP, with the QP context (`qpc`) and its address
//! paths (`ads`).
//!
//! Offsets follow the Linux kernel's and rdma-core's mlx5_ifc.h, which agree on every field named here;
//! `dbr_umem_id` (qpc) and `wq_umem_offset` (create_qp_in) are declared by rdma-core's provider header and its
//! DevX tests, where the kernel leaves those bits reserved.

use super::Field;

/// An address path (`mlx5_ifc_ads_bits`): 44 bytes, embedded twice in the [`qpc`](super::qpc) (primary and
/// alternate path). An RC QP's INIT2RTR sets the primary path: the local port, and the remote end (its LID
/// on InfiniBand; its GID, MAC and the local GID index on RoCE).
pub mod ads {
    use super::super::Bytes;

    /// Bytes in an address path (`DEVX_ST_SZ_BYTES(ads)`).
    pub const SIZE: usize = 44;

    crate::prm::cmd::fields! {
        /// `mlx5_ifc_ads_bits.fl`, 1 bit: force loopback, packets go back to the local port (InfiniBand paths).
        FL = "fl", 0x0, 1;
        /// `mlx5_ifc_ads_bits.free_ar`, 1 bit: the path may use adaptive routing (InfiniBand paths).
        FREE_AR = "free_ar", 0x1, 1;
        /// `mlx5_ifc_ads_bits.pkey_index`, 16 bits: index in the port's P_Key table.
        PKEY_INDEX = "pkey_index", 0x10, 16;
        /// `mlx5_ifc_ads_bits.grh`, 1 bit: InfiniBand packets carry a GRH, described by [`SRC_ADDR_INDEX`],
        /// [`HOP_LIMIT`], [`TCLASS`], [`FLOW_LABEL`] and [`RGID_RIP`]. The kernel sets it on InfiniBand paths
        /// only; on RoCE those fields describe the IP header, which every packet has.
        GRH = "grh", 0x28, 1;
        /// `mlx5_ifc_ads_bits.mlid`, 7 bits: source path bits, the low bits of the local LID (InfiniBand).
        MLID = "mlid", 0x29, 7;
        /// `mlx5_ifc_ads_bits.rlid`, 16 bits: the remote port's LID (InfiniBand; 0 on RoCE).
        RLID = "rlid", 0x30, 16;
        /// `mlx5_ifc_ads_bits.ack_timeout`, 5 bits: local ACK timeout, 4.096 us * 2^n (0: wait forever), the
        /// InfiniBand encoding of a QP's `timeout` attribute.
        ACK_TIMEOUT = "ack_timeout", 0x40, 5;
        /// `mlx5_ifc_ads_bits.src_addr_index`, 8 bits: the local GID table index (a QP's `sgid_index`).
        SRC_ADDR_INDEX = "src_addr_index", 0x48, 8;
        /// `mlx5_ifc_ads_bits.stat_rate`, 4 bits: static rate limit in the PRM's encoding (0: the port's rate).
        STAT_RATE = "stat_rate", 0x54, 4;
        /// `mlx5_ifc_ads_bits.hop_limit`, 8 bits: the GRH hop limit (RoCE: the IP TTL / hop limit).
        HOP_LIMIT = "hop_limit", 0x58, 8;
        /// `mlx5_ifc_ads_bits.tclass`, 8 bits: the GRH traffic class (RoCE: the IP DSCP and ECN bits).
        TCLASS = "tclass", 0x64, 8;
        /// `mlx5_ifc_ads_bits.flow_label`, 20 bits: the GRH flow label.
        FLOW_LABEL = "flow_label", 0x6c, 20;
        /// `mlx5_ifc_ads_bits.udp_sport`, 16 bits: the UDP source port of RoCE v2 packets.
        UDP_SPORT = "udp_sport", 0x110, 16;
        /// `mlx5_ifc_ads_bits.eth_prio`, 3 bits: the Ethernet priority (VLAN PCP) of RoCE packets.
        ETH_PRIO = "eth_prio", 0x121, 3;
        /// `mlx5_ifc_ads_bits.sl`, 4 bits: the InfiniBand service level.
        SL = "sl", 0x124, 4;
        /// `mlx5_ifc_ads_bits.vhca_port_num`, 8 bits: the local port, numbered from 1 as in verbs.
        VHCA_PORT_NUM = "vhca_port_num", 0x128, 8;
        /// `mlx5_ifc_ads_bits.rmac_47_32`, 16 bits: bits 47..32 of the remote MAC (RoCE); see [`RMAC`].
        RMAC_47_32 = "rmac_47_32", 0x130, 16;
        /// `mlx5_ifc_ads_bits.rmac_31_0`, 32 bits: bits 31..0 of the remote MAC (RoCE); see [`RMAC`].
        RMAC_31_0 = "rmac_31_0", 0x140, 32;
    }

    /// `mlx5_ifc_ads_bits.rgid_rip`, 16 bytes at byte 16: the remote GID (RoCE: the remote IP address in GID
    /// form), in wire order.
    pub const RGID_RIP: Bytes = Bytes::new(0x80, 16);

    /// The remote MAC as 6 bytes in wire order, at byte 38: [`RMAC_47_32`] and [`RMAC_31_0`] together (what
    /// the kernel's and rdma-core's drivers copy a MAC address into).
    pub const RMAC: Bytes = Bytes::new(0x130, 6);
}

/// The QP context (`mlx5_ifc_qpc_bits`): 232 bytes, embedded at byte 24 of CREATE_QP's input, of the
/// RST2INIT/INIT2RTR/RTR2RTS inputs and of QUERY_QP's output.
///
/// CREATE_QP takes the queues' shape and resources (`st`, `pm_state`, `pd`, `uar_page`, the sizes, the CQs,
/// the doorbell record); each transition takes the attributes of its step (RST2INIT: the port and remote
/// access rights; INIT2RTR: `mtu`, `log_msg_max`, `remote_qpn`, `next_rcv_psn`, `min_rnr_nak`, `log_rra_max`,
/// the primary path; RTR2RTS: `next_send_psn`, `retry_count`, `rnr_retry`, `log_sra_max`, the path's
/// `ack_timeout`). Fields a command does not use must be zero.
pub mod qpc {
    use super::Field;

    /// Bytes in the QP context (`DEVX_ST_SZ_BYTES(qpc)`).
    pub const SIZE: usize = 232;

    /// Bit offset of `mlx5_ifc_qpc_bits.primary_address_path`, an embedded [`ads`](super::ads) (byte 24).
    pub const PRIMARY_ADDRESS_PATH: u32 = 0xc0;
    /// Bit offset of `mlx5_ifc_qpc_bits.secondary_address_path`, the alternate path's [`ads`](super::ads)
    /// (byte 68).
    pub const SECONDARY_ADDRESS_PATH: u32 = 0x220;

    /// An [`ads`](super::ads) field moved into the primary path of this context.
    pub const fn primary_address_path(f: Field) -> Field {
        f.at(PRIMARY_ADDRESS_PATH)
    }

    /// An [`ads`](super::ads) field moved into the alternate path of this context.
    pub const fn secondary_address_path(f: Field) -> Field {
        f.at(SECONDARY_ADDRESS_PATH)
    }

    crate::prm::cmd::fields! {
        /// `mlx5_ifc_qpc_bits.state`, 4 bits: the QP state ([`state`](self::state)), as QUERY_QP reports it.
        STATE = "state", 0x0, 4;
        /// `mlx5_ifc_qpc_bits.st`, 8 bits: service type ([`st`](self::st); 0: RC).
        ST = "st", 0x8, 8;
        /// `mlx5_ifc_qpc_bits.pm_state`, 2 bits: path migration state ([`pm_state`](self::pm_state));
        /// MIGRATED (3) for a QP without an alternate path.
        PM_STATE = "pm_state", 0x13, 2;
        /// `mlx5_ifc_qpc_bits.pd`, 24 bits: the protection domain number.
        PD = "pd", 0x28, 24;
        /// `mlx5_ifc_qpc_bits.mtu`, 3 bits: path MTU ([`mtu`](self::mtu), the InfiniBand encoding of verbs'
        /// `IBV_MTU_*`: 1 = 256 bytes ... 5 = 4096 bytes).
        MTU = "mtu", 0x40, 3;
        /// `mlx5_ifc_qpc_bits.log_msg_max`, 5 bits: log2 of the largest message in bytes (at most
        /// `cmd_hca_cap.log_max_msg`).
        LOG_MSG_MAX = "log_msg_max", 0x43, 5;
        /// `mlx5_ifc_qpc_bits.log_rq_size`, 4 bits: log2 of the number of receive WQEs.
        LOG_RQ_SIZE = "log_rq_size", 0x49, 4;
        /// `mlx5_ifc_qpc_bits.log_rq_stride`, 3 bits: log2 of the receive WQE stride in 16-byte units (stride
        /// = 16 << n bytes).
        LOG_RQ_STRIDE = "log_rq_stride", 0x4d, 3;
        /// `mlx5_ifc_qpc_bits.no_sq`, 1 bit: the QP has no send queue.
        NO_SQ = "no_sq", 0x50, 1;
        /// `mlx5_ifc_qpc_bits.log_sq_size`, 4 bits: log2 of the send queue's size in 64-byte WQEBBs.
        LOG_SQ_SIZE = "log_sq_size", 0x51, 4;
        /// `mlx5_ifc_qpc_bits.ts_format`, 2 bits: timestamp format of the QP's CQEs ([`ts_format`](self::ts_format));
        /// it must be one that `cmd_hca_cap`'s `sq_ts_format`/`rq_ts_format` allow.
        TS_FORMAT = "ts_format", 0x58, 2;
        /// `mlx5_ifc_qpc_bits.counter_set_id`, 8 bits: the queue counter set the QP counts in (0: default).
        COUNTER_SET_ID = "counter_set_id", 0x60, 8;
        /// `mlx5_ifc_qpc_bits.uar_page`, 24 bits: index of the UAR page the QP's doorbells and BlueFlame writes
        /// go to (a DevX UAR's `page_id`).
        UAR_PAGE = "uar_page", 0x68, 24;
        /// `mlx5_ifc_qpc_bits.user_index`, 24 bits: a value the NIC copies into the QP's CQEs
        /// (`srqn_uidx`), when the context uses user indexes.
        USER_INDEX = "user_index", 0x88, 24;
        /// `mlx5_ifc_qpc_bits.log_page_size`, 5 bits: log2 of the work queue buffer's page size in 4 KiB units
        /// (page shift minus 12).
        LOG_PAGE_SIZE = "log_page_size", 0xa3, 5;
        /// `mlx5_ifc_qpc_bits.remote_qpn`, 24 bits: the peer QP's number (INIT2RTR).
        REMOTE_QPN = "remote_qpn", 0xa8, 24;
        /// `mlx5_ifc_qpc_bits.log_ack_req_freq`, 4 bits: the requester asks for an ACK every 2^n packets.
        LOG_ACK_REQ_FREQ = "log_ack_req_freq", 0x380, 4;
        /// `mlx5_ifc_qpc_bits.log_sra_max`, 3 bits: log2 of the RDMA READs and atomics the QP may have in
        /// flight as requester (verbs' `max_rd_atomic`, rounded up to a power of two; RTR2RTS).
        LOG_SRA_MAX = "log_sra_max", 0x388, 3;
        /// `mlx5_ifc_qpc_bits.retry_count`, 3 bits: transport retries before an error CQE (verbs' `retry_cnt`).
        RETRY_COUNT = "retry_count", 0x38d, 3;
        /// `mlx5_ifc_qpc_bits.rnr_retry`, 3 bits: RNR NAK retries (7: retry forever; verbs' `rnr_retry`).
        RNR_RETRY = "rnr_retry", 0x390, 3;
        /// `mlx5_ifc_qpc_bits.cur_rnr_retry`, 3 bits: RNR retries left, as QUERY_QP reports it.
        CUR_RNR_RETRY = "cur_rnr_retry", 0x395, 3;
        /// `mlx5_ifc_qpc_bits.cur_retry_count`, 3 bits: transport retries left, as QUERY_QP reports it.
        CUR_RETRY_COUNT = "cur_retry_count", 0x398, 3;
        /// `mlx5_ifc_qpc_bits.next_send_psn`, 24 bits: PSN of the first packet the QP sends (verbs' `sq_psn`;
        /// RTR2RTS).
        NEXT_SEND_PSN = "next_send_psn", 0x3c8, 24;
        /// `mlx5_ifc_qpc_bits.cqn_snd`, 24 bits: the CQ of the send queue.
        CQN_SND = "cqn_snd", 0x3e8, 24;
        /// `mlx5_ifc_qpc_bits.last_acked_psn`, 24 bits: the last PSN the responder acknowledged (QUERY_QP).
        LAST_ACKED_PSN = "last_acked_psn", 0x448, 24;
        /// `mlx5_ifc_qpc_bits.log_rra_max`, 3 bits: log2 of the RDMA READs and atomics the QP accepts in
        /// flight as responder (verbs' `max_dest_rd_atomic`, rounded up; INIT2RTR).
        LOG_RRA_MAX = "log_rra_max", 0x488, 3;
        /// `mlx5_ifc_qpc_bits.atomic_mode`, 4 bits: which atomic sizes the responder executes
        /// ([`atomic_mode`](self::atomic_mode)).
        ATOMIC_MODE = "atomic_mode", 0x48c, 4;
        /// `mlx5_ifc_qpc_bits.rre`, 1 bit: remote READ enabled (responder).
        RRE = "rre", 0x490, 1;
        /// `mlx5_ifc_qpc_bits.rwe`, 1 bit: remote WRITE enabled (responder).
        RWE = "rwe", 0x491, 1;
        /// `mlx5_ifc_qpc_bits.rae`, 1 bit: remote atomics enabled (responder).
        RAE = "rae", 0x492, 1;
        /// `mlx5_ifc_qpc_bits.min_rnr_nak`, 5 bits: the RNR NAK timer the responder sends, in the InfiniBand
        /// encoding of verbs' `min_rnr_timer` (INIT2RTR).
        MIN_RNR_NAK = "min_rnr_nak", 0x4a3, 5;
        /// `mlx5_ifc_qpc_bits.next_rcv_psn`, 24 bits: PSN of the first packet the QP expects (verbs' `rq_psn`;
        /// INIT2RTR).
        NEXT_RCV_PSN = "next_rcv_psn", 0x4a8, 24;
        /// `mlx5_ifc_qpc_bits.cqn_rcv`, 24 bits: the CQ of the receive queue.
        CQN_RCV = "cqn_rcv", 0x4e8, 24;
        /// `mlx5_ifc_qpc_bits.dbr_addr`, 64 bits: the QP doorbell record (8 bytes: receive counter, then send
        /// counter). With [`DBR_UMEM_VALID`]: its byte offset in the umem [`DBR_UMEM_ID`]; otherwise its device
        /// address.
        DBR_ADDR = "dbr_addr", 0x500, 64;
        /// `mlx5_ifc_qpc_bits.rq_type`, 3 bits: what the receive side is ([`rq_type`](self::rq_type)).
        RQ_TYPE = "rq_type", 0x565, 3;
        /// `mlx5_ifc_qpc_bits.srqn_rmpn_xrqn`, 24 bits: the SRQ (or RMP, XRQ) that feeds receives, when
        /// [`RQ_TYPE`] says so.
        SRQN_RMPN_XRQN = "srqn_rmpn_xrqn", 0x568, 24;
        /// `mlx5_ifc_qpc_bits.hw_sq_wqebb_counter`, 16 bits: WQEBBs the NIC has consumed (QUERY_QP).
        HW_SQ_WQEBB_COUNTER = "hw_sq_wqebb_counter", 0x5a0, 16;
        /// `mlx5_ifc_qpc_bits.sw_sq_wqebb_counter`, 16 bits: WQEBBs software has posted, as the NIC last saw
        /// the doorbell (QUERY_QP).
        SW_SQ_WQEBB_COUNTER = "sw_sq_wqebb_counter", 0x5b0, 16;
        /// `mlx5_ifc_qpc_bits.hw_rq_counter`, 32 bits: receive WQEs the NIC has consumed (QUERY_QP).
        HW_RQ_COUNTER = "hw_rq_counter", 0x5c0, 32;
        /// `mlx5_ifc_qpc_bits.sw_rq_counter`, 32 bits: receive WQEs software has posted (QUERY_QP).
        SW_RQ_COUNTER = "sw_rq_counter", 0x5e0, 32;
        /// `mlx5_ifc_qpc_bits.dbr_umem_valid`, 1 bit: [`DBR_ADDR`] is an offset into the umem [`DBR_UMEM_ID`].
        DBR_UMEM_VALID = "dbr_umem_valid", 0x683, 1;
        /// `mlx5_ifc_qpc_bits.dbr_umem_id`, 32 bits (the context's last dword): the umem holding the doorbell
        /// record, when [`DBR_UMEM_VALID`] is set.
        DBR_UMEM_ID = "dbr_umem_id", 0x720, 32;
    }

    /// Encodings of [`STATE`] (`MLX5_QPC_STATE_*`).
    pub mod state {
        /// `MLX5_QPC_STATE_RST`: reset, as created.
        pub const RST: u8 = 0x0;
        /// `MLX5_QPC_STATE_INIT`.
        pub const INIT: u8 = 0x1;
        /// `MLX5_QPC_STATE_RTR`: ready to receive.
        pub const RTR: u8 = 0x2;
        /// `MLX5_QPC_STATE_RTS`: ready to send.
        pub const RTS: u8 = 0x3;
        /// `MLX5_QPC_STATE_SQER`: send queue error (UD and raw QPs).
        pub const SQER: u8 = 0x4;
        /// `MLX5_QPC_STATE_SQDRAINED` (rdma-core's mlx5_ifc.h): the send queue is drained.
        pub const SQDRAINED: u8 = 0x5;
        /// `MLX5_QPC_STATE_ERR`: error; every WQE completes flushed.
        pub const ERR: u8 = 0x6;
        /// `MLX5_QPC_STATE_SQD` (the Linux kernel's mlx5_ifc.h): the send queue is draining.
        pub const SQD: u8 = 0x7;
        /// `MLX5_QPC_STATE_SUSPENDED` (the Linux kernel's mlx5_ifc.h).
        pub const SUSPENDED: u8 = 0x9;
    }

    /// Encodings of [`ST`], the service type (`MLX5_QPC_ST_*`).
    pub mod st {
        /// `MLX5_QPC_ST_RC`: reliable connected.
        pub const RC: u8 = 0x0;
        /// `MLX5_QPC_ST_UC`: unreliable connected.
        pub const UC: u8 = 0x1;
        /// `MLX5_QPC_ST_UD`: unreliable datagram.
        pub const UD: u8 = 0x2;
        /// `MLX5_QPC_ST_XRC`: extended reliable connected.
        pub const XRC: u8 = 0x3;
        /// `MLX5_QPC_ST_DCI`: dynamically connected initiator.
        pub const DCI: u8 = 0x5;
    }

    /// Encodings of [`PM_STATE`] (`MLX5_QPC_PM_STATE_*`).
    pub mod pm_state {
        /// `MLX5_QPC_PM_STATE_ARMED`: migration to the alternate path is armed.
        pub const ARMED: u8 = 0x0;
        /// `MLX5_QPC_PM_STATE_REARM`.
        pub const REARM: u8 = 0x1;
        /// `MLX5_QPC_PM_STATE_MIGRATED`: no migration pending; the state for a QP with one path.
        pub const MIGRATED: u8 = 0x3;
    }

    /// Encodings of [`MTU`] (`MLX5_QPC_MTU_*`; equal to verbs' `IBV_MTU_*`).
    pub mod mtu {
        /// `MLX5_QPC_MTU_256_BYTES`.
        pub const MTU_256: u8 = 0x1;
        /// `MLX5_QPC_MTU_512_BYTES`.
        pub const MTU_512: u8 = 0x2;
        /// `MLX5_QPC_MTU_1K_BYTES`.
        pub const MTU_1K: u8 = 0x3;
        /// `MLX5_QPC_MTU_2K_BYTES`.
        pub const MTU_2K: u8 = 0x4;
        /// `MLX5_QPC_MTU_4K_BYTES`.
        pub const MTU_4K: u8 = 0x5;
        /// `MLX5_QPC_MTU_RAW_ETHERNET_QP`: the value for raw Ethernet QPs.
        pub const RAW_ETHERNET_QP: u8 = 0x7;
    }

    /// Encodings of [`RQ_TYPE`] (the names of DPDK's mlx5 PRM header: `MLX5_NON_ZERO_RQ`, `MLX5_SRQ_RQ`,
    /// `MLX5_ZERO_LEN_RQ`).
    pub mod rq_type {
        /// `MLX5_NON_ZERO_RQ`: the QP has its own receive queue ([`LOG_RQ_SIZE`](super::LOG_RQ_SIZE)).
        pub const NON_ZERO: u8 = 0x0;
        /// `MLX5_SRQ_RQ`: receives come from the SRQ in [`SRQN_RMPN_XRQN`](super::SRQN_RMPN_XRQN).
        pub const SRQ: u8 = 0x1;
        /// `MLX5_ZERO_LEN_RQ`: no receive queue (a QP that only sends and is only written to).
        pub const ZERO_LEN: u8 = 0x3;
    }

    /// Encodings of [`TS_FORMAT`] (`MLX5_QPC_TIMESTAMP_FORMAT_*` in rdma-core's mlx5_ifc.h).
    pub mod ts_format {
        /// `MLX5_QPC_TIMESTAMP_FORMAT_FREE_RUNNING`: the device's free-running clock.
        pub const FREE_RUNNING: u8 = 0x0;
        /// `MLX5_QPC_TIMESTAMP_FORMAT_DEFAULT`: the device's default format.
        pub const DEFAULT: u8 = 0x1;
        /// `MLX5_QPC_TIMESTAMP_FORMAT_REAL_TIME`: real time (nanoseconds).
        pub const REAL_TIME: u8 = 0x2;
    }

    /// Encodings of [`ATOMIC_MODE`] (`MLX5_QPC_ATOMIC_MODE_*` in the Linux kernel's mlx5_ifc.h).
    pub mod atomic_mode {
        /// `MLX5_QPC_ATOMIC_MODE_IB_SPEC`: 8-byte atomics as the InfiniBand specification defines them.
        pub const IB_SPEC: u8 = 0x1;
        /// `MLX5_QPC_ATOMIC_MODE_ONLY_8B`: 8-byte atomics only.
        pub const ONLY_8B: u8 = 0x2;
        /// `MLX5_QPC_ATOMIC_MODE_UP_TO_8B`: atomics of up to 8 bytes.
        pub const UP_TO_8B: u8 = 0x3;
    }
}

/// CREATE_QP's input (`mlx5_ifc_create_qp_in_bits`): the header, `opt_param_mask`, the [`qpc`](super::qpc) at
/// byte 24, then the work queue buffer's umem. 272 bytes; a page list (`pas`) follows only when
/// [`WQ_UMEM_VALID`](create_qp_in::WQ_UMEM_VALID) is 0.
pub mod create_qp_in {
    use super::Field;

    /// Bytes in the input without the page list (`DEVX_ST_SZ_BYTES(create_qp_in)`).
    pub const SIZE: usize = 272;

    /// Bit offset of `mlx5_ifc_create_qp_in_bits.qpc`, the embedded [`qpc`](super::qpc) (byte 24).
    pub const QPC: u32 = 0xc0;

    /// A [`qpc`](super::qpc) field moved to where it sits in this input.
    pub const fn qpc(f: Field) -> Field {
        f.at(QPC)
    }

    crate::prm::cmd::fields! {
        /// `mlx5_ifc_create_qp_in_bits.opcode`, 16 bits: [`opcode::CREATE_QP`](crate::prm::cmd::opcode::CREATE_QP).
        OPCODE = "opcode", 0x0, 16;
        /// `mlx5_ifc_create_qp_in_bits.uid`, 16 bits: the DevX user context (the kernel fills it in).
        UID = "uid", 0x10, 16;
        /// `mlx5_ifc_create_qp_in_bits.op_mod`, 16 bits: 0.
        OP_MOD = "op_mod", 0x30, 16;
        /// `mlx5_ifc_create_qp_in_bits.opt_param_mask`, 32 bits: 0 for CREATE_QP.
        OPT_PARAM_MASK = "opt_param_mask", 0x80, 32;
        /// `mlx5_ifc_create_qp_in_bits.wq_umem_offset`, 64 bits: byte offset of the work queue buffer in the
        /// umem [`WQ_UMEM_ID`]. The buffer holds the receive queue first and the send queue after it.
        WQ_UMEM_OFFSET = "wq_umem_offset", 0x800, 64;
        /// `mlx5_ifc_create_qp_in_bits.wq_umem_id`, 32 bits: the umem holding the work queue buffer.
        WQ_UMEM_ID = "wq_umem_id", 0x840, 32;
        /// `mlx5_ifc_create_qp_in_bits.wq_umem_valid`, 1 bit: 1 when the buffer is in the umem (no page list
        /// follows the input).
        WQ_UMEM_VALID = "wq_umem_valid", 0x860, 1;
    }
}

/// CREATE_QP's output (`mlx5_ifc_create_qp_out_bits`): 16 bytes.
pub mod create_qp_out {
    /// Bytes in the output (`DEVX_ST_SZ_BYTES(create_qp_out)`).
    pub const SIZE: usize = 16;

    crate::prm::cmd::fields! {
        /// `mlx5_ifc_create_qp_out_bits.status`, 8 bits: [`status`](crate::prm::cmd::status).
        STATUS = "status", 0x0, 8;
        /// `mlx5_ifc_create_qp_out_bits.syndrome`, 32 bits.
        SYNDROME = "syndrome", 0x20, 32;
        /// `mlx5_ifc_create_qp_out_bits.qpn`, 24 bits: the new QP's number.
        QPN = "qpn", 0x48, 24;
    }

    /// The QP number in output `buf`.
    ///
    /// # Panics
    /// If `buf` has fewer than 12 bytes.
    pub fn qpn(buf: &[u8]) -> u32 {
        QPN.get(buf) as u32
    }
}

/// DESTROY_QP's input (`mlx5_ifc_destroy_qp_in_bits`): 16 bytes.
pub mod destroy_qp_in {
    /// Bytes in the input (`DEVX_ST_SZ_BYTES(destroy_qp_in)`).
    pub const SIZE: usize = 16;

    crate::prm::cmd::fields! {
        /// `mlx5_ifc_destroy_qp_in_bits.opcode`, 16 bits: [`opcode::DESTROY_QP`](crate::prm::cmd::opcode::DESTROY_QP).
        OPCODE = "opcode", 0x0, 16;
        /// `mlx5_ifc_destroy_qp_in_bits.uid`, 16 bits: the DevX user context.
        UID = "uid", 0x10, 16;
        /// `mlx5_ifc_destroy_qp_in_bits.qpn`, 24 bits: the QP to destroy.
        QPN = "qpn", 0x48, 24;
    }
}

/// DESTROY_QP's output (`mlx5_ifc_destroy_qp_out_bits`): the 16-byte header only.
pub mod destroy_qp_out {
    crate::prm::cmd::empty_out!("destroy_qp_out");
}

/// The input of a QP state transition that carries a QP context: `opcode`, `qpn`, `opt_param_mask` and the
/// `qpc` at byte 24, 272 bytes.
macro_rules! modify_qp_in {
    ($ifc:literal, $op:ident) => {
        use super::Field;

        #[doc = concat!("Bytes in the input (`DEVX_ST_SZ_BYTES(", $ifc, ")`).")]
        pub const SIZE: usize = 272;

        #[doc = concat!("Bit offset of `mlx5_ifc_", $ifc, "_bits.qpc`, the embedded [`qpc`](super::qpc) (byte 24).")]
        pub const QPC: u32 = 0xc0;

        /// A [`qpc`](super::qpc) field moved to where it sits in this input.
        pub const fn qpc(f: Field) -> Field {
            f.at(QPC)
        }

        crate::prm::cmd::fields! {
            #[doc = concat!("`mlx5_ifc_", $ifc, "_bits.opcode`, 16 bits: [`opcode::", stringify!($op),
                "`](crate::prm::cmd::opcode::", stringify!($op), ").")]
            OPCODE = "opcode", 0x0, 16;
            #[doc = concat!("`mlx5_ifc_", $ifc, "_bits.uid`, 16 bits: the DevX user context.")]
            UID = "uid", 0x10, 16;
            #[doc = concat!("`mlx5_ifc_", $ifc, "_bits.op_mod`, 16 bits: 0.")]
            OP_MOD = "op_mod", 0x30, 16;
            #[doc = concat!("`mlx5_ifc_", $ifc, "_bits.qpn`, 24 bits: the QP to move.")]
            QPN = "qpn", 0x48, 24;
            #[doc = concat!("`mlx5_ifc_", $ifc, "_bits.opt_param_mask`, 32 bits: which optional attributes of ",
                "the transition the `qpc` sets (the kernel's `MLX5_QP_OPTPAR_*` bits); 0 sets only the ",
                "required ones.")]
            OPT_PARAM_MASK = "opt_param_mask", 0x80, 32;
        }
    };
}

/// RST2INIT_QP's input (`mlx5_ifc_rst2init_qp_in_bits`): RST to INIT. In the [`qpc`](super::qpc): the primary
/// path's `vhca_port_num` and `pkey_index`, `rre`/`rwe`/`rae`, `pm_state`.
pub mod rst2init_qp_in {
    modify_qp_in!("rst2init_qp_in", RST2INIT_QP);
}

/// RST2INIT_QP's output (`mlx5_ifc_rst2init_qp_out_bits`): the 16-byte header only.
pub mod rst2init_qp_out {
    crate::prm::cmd::empty_out!("rst2init_qp_out");
}

/// INIT2RTR_QP's input (`mlx5_ifc_init2rtr_qp_in_bits`): INIT to RTR. In the [`qpc`](super::qpc): `mtu`,
/// `log_msg_max`, `remote_qpn`, `next_rcv_psn`, `min_rnr_nak`, `log_rra_max`, the primary path.
pub mod init2rtr_qp_in {
    modify_qp_in!("init2rtr_qp_in", INIT2RTR_QP);
}

/// INIT2RTR_QP's output (`mlx5_ifc_init2rtr_qp_out_bits`): the 16-byte header only.
pub mod init2rtr_qp_out {
    crate::prm::cmd::empty_out!("init2rtr_qp_out");
}

/// RTR2RTS_QP's input (`mlx5_ifc_rtr2rts_qp_in_bits`): RTR to RTS. In the [`qpc`](super::qpc):
/// `next_send_psn`, `retry_count`, `rnr_retry`, `log_sra_max`, `log_ack_req_freq`, the primary path's
/// `ack_timeout`.
pub mod rtr2rts_qp_in {
    modify_qp_in!("rtr2rts_qp_in", RTR2RTS_QP);
}

/// RTR2RTS_QP's output (`mlx5_ifc_rtr2rts_qp_out_bits`): the 16-byte header only.
pub mod rtr2rts_qp_out {
    crate::prm::cmd::empty_out!("rtr2rts_qp_out");
}

/// 2ERR_QP's input (`mlx5_ifc_qp_2err_in_bits`): any state to ERR. 16 bytes, no QP context.
pub mod qp_2err_in {
    /// Bytes in the input (`DEVX_ST_SZ_BYTES(qp_2err_in)`).
    pub const SIZE: usize = 16;

    crate::prm::cmd::fields! {
        /// `mlx5_ifc_qp_2err_in_bits.opcode`, 16 bits: [`opcode::QP_2ERR`](crate::prm::cmd::opcode::QP_2ERR).
        OPCODE = "opcode", 0x0, 16;
        /// `mlx5_ifc_qp_2err_in_bits.uid`, 16 bits: the DevX user context.
        UID = "uid", 0x10, 16;
        /// `mlx5_ifc_qp_2err_in_bits.op_mod`, 16 bits: 0.
        OP_MOD = "op_mod", 0x30, 16;
        /// `mlx5_ifc_qp_2err_in_bits.qpn`, 24 bits: the QP to move.
        QPN = "qpn", 0x48, 24;
    }
}

/// 2ERR_QP's output (`mlx5_ifc_qp_2err_out_bits`): the 16-byte header only.
pub mod qp_2err_out {
    crate::prm::cmd::empty_out!("qp_2err_out");
}

/// QUERY_QP's input (`mlx5_ifc_query_qp_in_bits`): 16 bytes. It has no `uid`.
pub mod query_qp_in {
    /// Bytes in the input (`DEVX_ST_SZ_BYTES(query_qp_in)`).
    pub const SIZE: usize = 16;

    crate::prm::cmd::fields! {
        /// `mlx5_ifc_query_qp_in_bits.opcode`, 16 bits: [`opcode::QUERY_QP`](crate::prm::cmd::opcode::QUERY_QP).
        OPCODE = "opcode", 0x0, 16;
        /// `mlx5_ifc_query_qp_in_bits.op_mod`, 16 bits: 0.
        OP_MOD = "op_mod", 0x30, 16;
        /// `mlx5_ifc_query_qp_in_bits.qpn`, 24 bits: the QP to query.
        QPN = "qpn", 0x48, 24;
    }
}

/// QUERY_QP's output (`mlx5_ifc_query_qp_out_bits`): the header, `opt_param_mask`, the QP's
/// [`qpc`](super::qpc) at byte 24 (its `state` says where it is). 272 bytes; a page list follows for QPs
/// created with one.
pub mod query_qp_out {
    use super::{qpc as ctx, Field};

    /// Bytes in the output without the page list (`DEVX_ST_SZ_BYTES(query_qp_out)`).
    pub const SIZE: usize = 272;

    /// Bit offset of `mlx5_ifc_query_qp_out_bits.qpc`, the embedded [`qpc`](super::qpc) (byte 24).
    pub const QPC: u32 = 0xc0;

    /// A [`qpc`](super::qpc) field moved to where it sits in this output.
    pub const fn qpc(f: Field) -> Field {
        f.at(QPC)
    }

    crate::prm::cmd::fields! {
        /// `mlx5_ifc_query_qp_out_bits.status`, 8 bits: [`status`](crate::prm::cmd::status).
        STATUS = "status", 0x0, 8;
        /// `mlx5_ifc_query_qp_out_bits.syndrome`, 32 bits.
        SYNDROME = "syndrome", 0x20, 32;
        /// `mlx5_ifc_query_qp_out_bits.opt_param_mask`, 32 bits.
        OPT_PARAM_MASK = "opt_param_mask", 0x80, 32;
    }

    /// The QP's state ([`qpc::state`](super::qpc::state)) in output `buf`.
    ///
    /// # Panics
    /// If `buf` has fewer than 28 bytes.
    pub fn state(buf: &[u8]) -> u8 {
        qpc(ctx::STATE).get(buf) as u8
    }
}
