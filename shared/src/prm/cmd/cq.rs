//! CREATE_CQ and DESTROY_CQ, and the CQ context they carry.

/// The CQ context (`mlx5_ifc_cqc_bits`): 64 bytes, embedded in CREATE_CQ's input at
/// [`create_cq_in::CQ_CONTEXT`](super::create_cq_in::CQ_CONTEXT).
///
/// Offsets follow rdma-core's mlx5_ifc.h-style declarations of the CQC (its DevX tests' `SwCqc`) and the
/// Linux kernel's `mlx5_ifc_cqc_bits`; `dbr_umem_id` is named only by the former (the kernel leaves that dword
/// reserved, as it creates CQs without umems).
pub mod cqc {
    use super::super::Field;

    /// Bytes in the CQ context (`DEVX_ST_SZ_BYTES(cqc)`).
    pub const SIZE: usize = 64;

    crate::prm::cmd::fields! {
        /// `mlx5_ifc_cqc_bits.status`, 4 bits: the CQ's error status as QUERY_CQ reports it
        /// ([`status`](self::status)); 0 when creating.
        STATUS = "status", 0x0, 4;
        /// `mlx5_ifc_cqc_bits.dbr_umem_valid`, 1 bit: 1 when [`DBR_ADDR`] is an offset into the umem
        /// [`DBR_UMEM_ID`] (how a DevX user places the doorbell record); 0 when it is an address the device
        /// reaches directly.
        DBR_UMEM_VALID = "dbr_umem_valid", 0x6, 1;
        /// `mlx5_ifc_cqc_bits.cqe_sz`, 3 bits: CQE size, [`cqe_sz`](self::cqe_sz) (0: 64 bytes).
        CQE_SZ = "cqe_sz", 0x8, 3;
        /// `mlx5_ifc_cqc_bits.cc`, 1 bit: collapsed CQ, every CQE is written to entry 0. 0 for a ring.
        CC = "cc", 0xb, 1;
        /// `mlx5_ifc_cqc_bits.scqe_break_moderation_en`, 1 bit: a solicited CQE generates its event at once,
        /// ignoring [`CQ_PERIOD`]/[`CQ_MAX_COUNT`] moderation.
        SCQE_BREAK_MODERATION_EN = "scqe_break_moderation_en", 0xd, 1;
        /// `mlx5_ifc_cqc_bits.oi`, 1 bit: overrun ignore. 1: the NIC does not check for CQ overrun (writing
        /// over entries software has not consumed is then not reported); 0: an overrun is an error.
        OI = "oi", 0xe, 1;
        /// `mlx5_ifc_cqc_bits.cq_period_mode`, 2 bits: when the moderation timer starts (0: at the last
        /// event, 1: at the first new CQE; the kernel's `MLX5_CQ_PERIOD_MODE_START_FROM_EQE`/`_CQE`).
        CQ_PERIOD_MODE = "cq_period_mode", 0xf, 2;
        /// `mlx5_ifc_cqc_bits.cqe_comp_en`, 1 bit: CQE compression (receive CQEs only). 0 here.
        CQE_COMP_EN = "cqe_comp_en", 0x11, 1;
        /// `mlx5_ifc_cqc_bits.mini_cqe_res_format`, 2 bits: the mini-CQE format of compressed CQEs.
        MINI_CQE_RES_FORMAT = "mini_cqe_res_format", 0x12, 2;
        /// `mlx5_ifc_cqc_bits.st`, 4 bits: the CQ's arm state as QUERY_CQ reports it ([`st`](self::st)).
        ST = "st", 0x14, 4;
        /// `mlx5_ifc_cqc_bits.dbr_umem_id`, 32 bits (dword 1): the umem holding the doorbell record, when
        /// [`DBR_UMEM_VALID`] is set.
        DBR_UMEM_ID = "dbr_umem_id", 0x20, 32;
        /// `mlx5_ifc_cqc_bits.log_cq_size`, 5 bits: log2 of the number of CQEs in the ring.
        LOG_CQ_SIZE = "log_cq_size", 0x63, 5;
        /// `mlx5_ifc_cqc_bits.uar_page`, 24 bits: index of the UAR page whose doorbell arms the CQ (a DevX
        /// UAR's `page_id`).
        UAR_PAGE = "uar_page", 0x68, 24;
        /// `mlx5_ifc_cqc_bits.cq_period`, 12 bits: event moderation period in microseconds (0: none).
        CQ_PERIOD = "cq_period", 0x84, 12;
        /// `mlx5_ifc_cqc_bits.cq_max_count`, 16 bits: event moderation count, CQEs per event (0: none).
        CQ_MAX_COUNT = "cq_max_count", 0x90, 16;
        /// `mlx5_ifc_cqc_bits.c_eqn`, 8 bits (the low byte of dword 5): the EQ that receives the CQ's
        /// completion events (e.g. from `mlx5dv_devx_query_eqn`). Newer kernels widen it to the whole dword,
        /// [`C_EQN_OR_APU_ELEMENT`]; for EQ numbers below 256 both write the same bytes.
        C_EQN = "c_eqn", 0xb8, 8;
        /// `mlx5_ifc_cqc_bits.log_page_size`, 5 bits: log2 of the CQ buffer's page size in 4 KiB units (page
        /// shift minus 12, the kernel's `MLX5_ADAPTER_PAGE_SHIFT`).
        LOG_PAGE_SIZE = "log_page_size", 0xc3, 5;
        /// `mlx5_ifc_cqc_bits.consumer_counter`, 24 bits: the consumer index as QUERY_CQ reports it.
        CONSUMER_COUNTER = "consumer_counter", 0x148, 24;
        /// `mlx5_ifc_cqc_bits.producer_counter`, 24 bits: CQEs written, as QUERY_CQ reports it.
        PRODUCER_COUNTER = "producer_counter", 0x168, 24;
        /// `mlx5_ifc_cqc_bits.dbr_addr`, 64 bits (dwords 14-15): the CQ doorbell record (8 bytes, 8-byte
        /// aligned). With [`DBR_UMEM_VALID`]: its byte offset in the umem [`DBR_UMEM_ID`]; otherwise its
        /// device address.
        DBR_ADDR = "dbr_addr", 0x1c0, 64;
    }

    /// `mlx5_ifc_cqc_bits.c_eqn_or_apu_element`, 32 bits (dword 5): the whole dword that recent Linux kernels
    /// give to the EQ number (the upper 24 bits are reserved in older declarations, where the EQ number is
    /// [`C_EQN`]). Not in [`FIELDS`], as it overlaps `C_EQN`.
    pub const C_EQN_OR_APU_ELEMENT: Field = Field::new(0xa0, 32);

    /// Encodings of [`CQE_SZ`] (`MLX5_CQC_CQE_SZ_*` in mlx5_ifc.h).
    pub mod cqe_sz {
        /// `MLX5_CQC_CQE_SZ_64_BYTES`: 64-byte CQEs.
        pub const BYTES_64: u8 = 0x0;
        /// `MLX5_CQC_CQE_SZ_128_BYTES`: 128-byte CQEs.
        pub const BYTES_128: u8 = 0x1;
    }

    /// Encodings of [`STATUS`] (`MLX5_CQC_STATUS_*` in mlx5_ifc.h).
    pub mod status {
        /// `MLX5_CQC_STATUS_OK`.
        pub const OK: u8 = 0x0;
        /// `MLX5_CQC_STATUS_CQ_OVERFLOW`: the NIC found the ring full.
        pub const CQ_OVERFLOW: u8 = 0x9;
        /// `MLX5_CQC_STATUS_CQ_WRITE_FAIL`: a CQE write failed.
        pub const CQ_WRITE_FAIL: u8 = 0xa;
    }

    /// Encodings of [`ST`] (`MLX5_CQC_ST_*` in mlx5_ifc.h).
    pub mod st {
        /// `MLX5_CQC_ST_SOLICITED_NOTIFICATION_REQUEST_ARMED`: armed for the next solicited CQE.
        pub const SOLICITED_NOTIFICATION_REQUEST_ARMED: u8 = 0x6;
        /// `MLX5_CQC_ST_NOTIFICATION_REQUEST_ARMED`: armed for the next CQE.
        pub const NOTIFICATION_REQUEST_ARMED: u8 = 0x9;
        /// `MLX5_CQC_ST_FIRED`: an event was generated; not armed.
        pub const FIRED: u8 = 0xa;
    }
}

/// CREATE_CQ's input (`mlx5_ifc_create_cq_in_bits`): the header, the [`cqc`](super::cqc) at byte 16, then the
/// CQ buffer's umem. 272 bytes; a page list (`pas`) follows only when
/// [`CQ_UMEM_VALID`](create_cq_in::CQ_UMEM_VALID) is 0.
pub mod create_cq_in {
    use super::super::Field;

    /// Bytes in the input without the page list (`DEVX_ST_SZ_BYTES(create_cq_in)`).
    pub const SIZE: usize = 272;

    /// Bit offset of `mlx5_ifc_create_cq_in_bits.cq_context`, the embedded [`cqc`](super::cqc) (byte 16).
    pub const CQ_CONTEXT: u32 = 0x80;

    /// A [`cqc`](super::cqc) field moved to where it sits in this input.
    pub const fn cq_context(f: Field) -> Field {
        f.at(CQ_CONTEXT)
    }

    crate::prm::cmd::fields! {
        /// `mlx5_ifc_create_cq_in_bits.opcode`, 16 bits: [`opcode::CREATE_CQ`](crate::prm::cmd::opcode::CREATE_CQ).
        OPCODE = "opcode", 0x0, 16;
        /// `mlx5_ifc_create_cq_in_bits.uid`, 16 bits: the DevX user context (the kernel fills it in).
        UID = "uid", 0x10, 16;
        /// `mlx5_ifc_create_cq_in_bits.op_mod`, 16 bits: 0.
        OP_MOD = "op_mod", 0x30, 16;
        /// `mlx5_ifc_create_cq_in_bits.cq_umem_offset`, 64 bits: byte offset of the CQ ring in the umem
        /// [`CQ_UMEM_ID`].
        CQ_UMEM_OFFSET = "cq_umem_offset", 0x280, 64;
        /// `mlx5_ifc_create_cq_in_bits.cq_umem_id`, 32 bits: the umem holding the CQ ring.
        CQ_UMEM_ID = "cq_umem_id", 0x2c0, 32;
        /// `mlx5_ifc_create_cq_in_bits.cq_umem_valid`, 1 bit: 1 when the ring is in the umem (no page list
        /// follows the input).
        CQ_UMEM_VALID = "cq_umem_valid", 0x2e0, 1;
    }
}

/// CREATE_CQ's output (`mlx5_ifc_create_cq_out_bits`): 16 bytes.
pub mod create_cq_out {
    /// Bytes in the output (`DEVX_ST_SZ_BYTES(create_cq_out)`).
    pub const SIZE: usize = 16;

    crate::prm::cmd::fields! {
        /// `mlx5_ifc_create_cq_out_bits.status`, 8 bits: [`status`](crate::prm::cmd::status).
        STATUS = "status", 0x0, 8;
        /// `mlx5_ifc_create_cq_out_bits.syndrome`, 32 bits.
        SYNDROME = "syndrome", 0x20, 32;
        /// `mlx5_ifc_create_cq_out_bits.cqn`, 24 bits: the new CQ's number.
        CQN = "cqn", 0x48, 24;
    }

    /// The CQ number in output `buf`.
    ///
    /// # Panics
    /// If `buf` has fewer than 12 bytes.
    pub fn cqn(buf: &[u8]) -> u32 {
        CQN.get(buf) as u32
    }
}

/// DESTROY_CQ's input (`mlx5_ifc_destroy_cq_in_bits`): 16 bytes.
pub mod destroy_cq_in {
    /// Bytes in the input (`DEVX_ST_SZ_BYTES(destroy_cq_in)`).
    pub const SIZE: usize = 16;

    crate::prm::cmd::fields! {
        /// `mlx5_ifc_destroy_cq_in_bits.opcode`, 16 bits: [`opcode::DESTROY_CQ`](crate::prm::cmd::opcode::DESTROY_CQ).
        OPCODE = "opcode", 0x0, 16;
        /// `mlx5_ifc_destroy_cq_in_bits.uid`, 16 bits: the DevX user context.
        UID = "uid", 0x10, 16;
        /// `mlx5_ifc_destroy_cq_in_bits.cqn`, 24 bits: the CQ to destroy.
        CQN = "cqn", 0x48, 24;
    }
}

/// DESTROY_CQ's output (`mlx5_ifc_destroy_cq_out_bits`): the 16-byte header only.
pub mod destroy_cq_out {
    crate::prm::cmd::empty_out!("destroy_cq_out");
}
