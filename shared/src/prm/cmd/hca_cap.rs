//! QUERY_HCA_CAP and the general device capabilities (`cmd_hca_cap`) a DevX QP/CQ creator checks.

/// QUERY_HCA_CAP's input (`mlx5_ifc_query_hca_cap_in_bits`): 16 bytes. It has no `uid`; `op_mod` selects the
/// capability page and whether the device's maximum or current values are returned
/// ([`op_mod`](query_hca_cap_in::op_mod)).
pub mod query_hca_cap_in {
    /// Bytes in the input (`DEVX_ST_SZ_BYTES(query_hca_cap_in)`).
    pub const SIZE: usize = 16;

    crate::prm::cmd::fields! {
        /// `mlx5_ifc_query_hca_cap_in_bits.opcode`, 16 bits:
        /// [`opcode::QUERY_HCA_CAP`](crate::prm::cmd::opcode::QUERY_HCA_CAP).
        OPCODE = "opcode", 0x0, 16;
        /// `mlx5_ifc_query_hca_cap_in_bits.op_mod`, 16 bits: [`op_mod`]`(cap_type, mode)`.
        OP_MOD = "op_mod", 0x30, 16;
        /// `mlx5_ifc_query_hca_cap_in_bits.other_function`, 1 bit: query another function's capabilities
        /// (a device manager only); 0.
        OTHER_FUNCTION = "other_function", 0x40, 1;
        /// `mlx5_ifc_query_hca_cap_in_bits.function_id`, 16 bits: that function, with [`OTHER_FUNCTION`].
        FUNCTION_ID = "function_id", 0x50, 16;
    }

    /// Capability type of the general device capabilities, [`cmd_hca_cap`](super::cmd_hca_cap)
    /// (`MLX5_CAP_GENERAL` of `enum mlx5_cap_type`).
    pub const CAP_GENERAL: u16 = 0x0;
    /// Mode: the largest values the device supports (`HCA_CAP_OPMOD_GET_MAX`).
    pub const GET_MAX: u16 = 0x0;
    /// Mode: the values currently in effect (`HCA_CAP_OPMOD_GET_CUR`).
    pub const GET_CUR: u16 = 0x1;

    /// The `op_mod` that reads capability page `cap_type` in `mode` ([`GET_MAX`] or [`GET_CUR`]): the type in
    /// bits 15..1 and the mode in bit 0, as the kernel and rdma-core compose it
    /// (`MLX5_SET_HCA_CAP_OP_MOD_GENERAL_DEVICE` is `0x0 << 1`).
    pub const fn op_mod(cap_type: u16, mode: u16) -> u16 {
        (cap_type << 1) | (mode & 1)
    }
}

/// QUERY_HCA_CAP's output (`mlx5_ifc_query_hca_cap_out_bits`): the 16-byte header, then the 4096-byte
/// capability page at byte 16 (`union mlx5_ifc_hca_cap_union_bits`; for [`CAP_GENERAL`] a
/// [`cmd_hca_cap`](super::cmd_hca_cap)). 4112 bytes.
///
/// [`CAP_GENERAL`]: super::query_hca_cap_in::CAP_GENERAL
pub mod query_hca_cap_out {
    use super::super::Field;

    /// Bytes in the output (`DEVX_ST_SZ_BYTES(query_hca_cap_out)`).
    pub const SIZE: usize = 4112;

    /// Bit offset of `mlx5_ifc_query_hca_cap_out_bits.capability`, the capability page (byte 16).
    pub const CAPABILITY: u32 = 0x80;

    /// A capability-page field (e.g. of [`cmd_hca_cap`](super::cmd_hca_cap)) moved to where it sits in this
    /// output.
    pub const fn capability(f: Field) -> Field {
        f.at(CAPABILITY)
    }

    crate::prm::cmd::fields! {
        /// `mlx5_ifc_query_hca_cap_out_bits.status`, 8 bits: [`status`](crate::prm::cmd::status).
        STATUS = "status", 0x0, 8;
        /// `mlx5_ifc_query_hca_cap_out_bits.syndrome`, 32 bits.
        SYNDROME = "syndrome", 0x20, 32;
    }
}

/// The general device capabilities (`mlx5_ifc_cmd_hca_cap_bits`): the 256-byte capability page QUERY_HCA_CAP
/// returns for [`CAP_GENERAL`], at [`query_hca_cap_out::CAPABILITY`](super::query_hca_cap_out::CAPABILITY).
///
/// The `log_max_*` fields are log2 of a count (`log_max_qp = 17`: at most 2^17 QPs). Offsets are those of the
/// Linux kernel's and rdma-core's mlx5_ifc.h, which agree on every field here except `log_max_uctx` and
/// `log_max_umem`, which only the kernel's names (rdma-core leaves those bits reserved).
///
/// [`CAP_GENERAL`]: super::query_hca_cap_in::CAP_GENERAL
pub mod cmd_hca_cap {
    /// Bytes in the capability page (`DEVX_ST_SZ_BYTES(cmd_hca_cap)`).
    pub const SIZE: usize = 256;

    crate::prm::cmd::fields! {
        /// `mlx5_ifc_cmd_hca_cap_bits.log_max_qp_sz`, 8 bits: log2 of the most WQEs (send queue: WQEBBs) in
        /// one QP work queue; bounds `qpc.log_sq_size` and `qpc.log_rq_size`.
        LOG_MAX_QP_SZ = "log_max_qp_sz", 0x88, 8;
        /// `mlx5_ifc_cmd_hca_cap_bits.log_max_qp`, 5 bits: log2 of the most QPs.
        LOG_MAX_QP = "log_max_qp", 0x9b, 5;
        /// `mlx5_ifc_cmd_hca_cap_bits.log_max_cq_sz`, 8 bits: log2 of the most CQEs in one CQ; bounds
        /// `cqc.log_cq_size`.
        LOG_MAX_CQ_SZ = "log_max_cq_sz", 0xc8, 8;
        /// `mlx5_ifc_cmd_hca_cap_bits.log_max_cq`, 5 bits: log2 of the most CQs.
        LOG_MAX_CQ = "log_max_cq", 0xdb, 5;
        /// `mlx5_ifc_cmd_hca_cap_bits.log_max_ra_req_qp`, 6 bits: log2 of the most RDMA READs/atomics a QP
        /// may have in flight as requester; bounds `qpc.log_sra_max`.
        LOG_MAX_RA_REQ_QP = "log_max_ra_req_qp", 0x14a, 6;
        /// `mlx5_ifc_cmd_hca_cap_bits.log_max_ra_res_qp`, 6 bits: the same as responder; bounds
        /// `qpc.log_rra_max`.
        LOG_MAX_RA_RES_QP = "log_max_ra_res_qp", 0x15a, 6;
        /// `mlx5_ifc_cmd_hca_cap_bits.gid_table_size`, 16 bits: GID table entries per port, encoded
        /// (`MLX5_CMD_HCA_CAP_GID_TABLE_SIZE_*` in the kernel's mlx5_ifc.h: 0 is 8 entries, each step doubles).
        GID_TABLE_SIZE = "gid_table_size", 0x170, 16;
        /// `mlx5_ifc_cmd_hca_cap_bits.pkey_table_size`, 16 bits: P_Key table entries, encoded
        /// (`MLX5_CMD_HCA_CAP_PKEY_TABLE_SIZE_*`: 0 is 128 entries, each step doubles).
        PKEY_TABLE_SIZE = "pkey_table_size", 0x190, 16;
        /// `mlx5_ifc_cmd_hca_cap_bits.port_type`, 2 bits: the link layer ([`port_type`](self::port_type)).
        PORT_TYPE = "port_type", 0x1b6, 2;
        /// `mlx5_ifc_cmd_hca_cap_bits.num_ports`, 8 bits: physical ports of the device.
        NUM_PORTS = "num_ports", 0x1b8, 8;
        /// `mlx5_ifc_cmd_hca_cap_bits.log_max_msg`, 5 bits: log2 of the largest message in bytes; bounds
        /// `qpc.log_msg_max`.
        LOG_MAX_MSG = "log_max_msg", 0x1c3, 5;
        /// `mlx5_ifc_cmd_hca_cap_bits.cqe_version`, 4 bits: the newest CQE format the device writes (1: CQEs
        /// carry the QP's `user_index`).
        CQE_VERSION = "cqe_version", 0x1fc, 4;
        /// `mlx5_ifc_cmd_hca_cap_bits.rc`, 1 bit: the RC transport is supported.
        RC = "rc", 0x23f, 1;
        /// `mlx5_ifc_cmd_hca_cap_bits.uar_4k`, 1 bit: UARs are 4 KiB each, several to a system page
        /// ([`NUM_OF_UARS_PER_PAGE`]).
        UAR_4K = "uar_4k", 0x240, 1;
        /// `mlx5_ifc_cmd_hca_cap_bits.umem_uid_0`, 1 bit: umems may be registered with uid 0 (outside a DevX
        /// user context).
        UMEM_UID_0 = "umem_uid_0", 0x252, 1;
        /// `mlx5_ifc_cmd_hca_cap_bits.bf`, 1 bit: BlueFlame (WQEs written through the UAR) is supported.
        BF = "bf", 0x260, 1;
        /// `mlx5_ifc_cmd_hca_cap_bits.log_bf_reg_size`, 5 bits: log2 of a BlueFlame register's size in bytes.
        LOG_BF_REG_SIZE = "log_bf_reg_size", 0x26b, 5;
        /// `mlx5_ifc_cmd_hca_cap_bits.max_wqe_sz_sq`, 16 bits: the largest send WQE in bytes.
        MAX_WQE_SZ_SQ = "max_wqe_sz_sq", 0x290, 16;
        /// `mlx5_ifc_cmd_hca_cap_bits.max_wqe_sz_rq`, 16 bits: the largest receive WQE in bytes.
        MAX_WQE_SZ_RQ = "max_wqe_sz_rq", 0x2b0, 16;
        /// `mlx5_ifc_cmd_hca_cap_bits.log_max_pd`, 5 bits: log2 of the most protection domains.
        LOG_MAX_PD = "log_max_pd", 0x32b, 5;
        /// `mlx5_ifc_cmd_hca_cap_bits.general_obj_types`, 64 bits: bit `n` set when general object type `n`
        /// is supported.
        GENERAL_OBJ_TYPES = "general_obj_types", 0x400, 64;
        /// `mlx5_ifc_cmd_hca_cap_bits.sq_ts_format`, 2 bits: the timestamp formats send queues support
        /// ([`ts_format_cap`](self::ts_format_cap)); constrains `qpc.ts_format`.
        SQ_TS_FORMAT = "sq_ts_format", 0x440, 2;
        /// `mlx5_ifc_cmd_hca_cap_bits.rq_ts_format`, 2 bits: the same for receive queues.
        RQ_TS_FORMAT = "rq_ts_format", 0x442, 2;
        /// `mlx5_ifc_cmd_hca_cap_bits.log_max_uctx`, 5 bits: log2 of the most DevX user contexts (the
        /// kernel's mlx5_ifc.h).
        LOG_MAX_UCTX = "log_max_uctx", 0x463, 5;
        /// `mlx5_ifc_cmd_hca_cap_bits.log_max_umem`, 5 bits: log2 of the most umems (the kernel's mlx5_ifc.h).
        LOG_MAX_UMEM = "log_max_umem", 0x46b, 5;
        /// `mlx5_ifc_cmd_hca_cap_bits.log_uar_page_sz`, 16 bits: log2 of the UAR page size in 4 KiB units.
        LOG_UAR_PAGE_SZ = "log_uar_page_sz", 0x490, 16;
        /// `mlx5_ifc_cmd_hca_cap_bits.device_frequency_khz`, 32 bits: the device clock (CQE timestamps) in kHz.
        DEVICE_FREQUENCY_KHZ = "device_frequency_khz", 0x4e0, 32;
        /// `mlx5_ifc_cmd_hca_cap_bits.num_of_uars_per_page`, 32 bits: UARs in one system page, with [`UAR_4K`].
        NUM_OF_UARS_PER_PAGE = "num_of_uars_per_page", 0x520, 32;
    }

    /// Encodings of [`PORT_TYPE`] (`MLX5_CAP_PORT_TYPE_*` in mlx5_ifc.h).
    pub mod port_type {
        /// `MLX5_CAP_PORT_TYPE_IB`: InfiniBand.
        pub const IB: u8 = 0x0;
        /// `MLX5_CAP_PORT_TYPE_ETH`: Ethernet (RoCE).
        pub const ETH: u8 = 0x1;
    }

    /// Encodings of [`SQ_TS_FORMAT`] and [`RQ_TS_FORMAT`] (`MLX5_TIMESTAMP_FORMAT_CAP_*` in the Linux kernel).
    pub mod ts_format_cap {
        /// `MLX5_TIMESTAMP_FORMAT_CAP_FREE_RUNNING`: free-running clock only.
        pub const FREE_RUNNING: u8 = 0x0;
        /// `MLX5_TIMESTAMP_FORMAT_CAP_REAL_TIME`: real time only.
        pub const REAL_TIME: u8 = 0x1;
        /// `MLX5_TIMESTAMP_FORMAT_CAP_FREE_RUNNING_AND_REAL_TIME`: either.
        pub const FREE_RUNNING_AND_REAL_TIME: u8 = 0x2;
    }
}
