//! Layouts of the mlx5 firmware commands that a DevX user builds and reads (`mlx5dv_devx_obj_create`,
//! `mlx5dv_devx_obj_modify`, `mlx5dv_devx_obj_query`, `mlx5dv_devx_general_cmd` take and return these
//! mailboxes).
//!
//! Each layout is a module named after its PRM struct (`mlx5_ifc_<name>_bits` in mlx5_ifc.h, as the Linux
//! kernel and rdma-core's mlx5 provider declare it) that holds:
//! - `SIZE`: the layout's size in bytes (a command's input or output without its trailing page list);
//! - one [`Field`] constant per field, named as the PRM names it in upper case (`qpc::LOG_SQ_SIZE` is
//!   `mlx5_ifc_qpc_bits.log_sq_size`), and [`Bytes`] constants for byte strings (GIDs, MACs);
//! - `FIELDS`: every [`Field`] constant of the module with its mlx5_ifc name, in layout order;
//! - for an embedded layout (the `qpc` inside CREATE_QP's input, the `ads` inside a `qpc`): a `u32` constant
//!   with its bit offset and a `const fn` that moves a field of the embedded layout there, e.g.
//!   `create_qp_in::qpc(qpc::PD)` is `qpc::PD.at(create_qp_in::QPC)`.
//!
//! Offsets are in bits from the start of the layout, MSB first within big-endian dwords, as in mlx5_ifc.h and
//! rdma-core's `DEVX_SET`/`DEVX_GET` (see [`Field`]). Every reserved bit of a command input must be zero: start
//! from a zeroed buffer ([`mbox_in::start`] zeroes it and writes the header).
//!
//! Only the fields that creating, connecting, querying and destroying an RC QP and its CQ need are named;
//! the bits between them are reserved here even where the PRM defines fields. gdaki-golden's `ifc` test checks
//! every offset, width and size against rdma-core's `DEVX_SET`/`DEVX_GET`/`DEVX_ST_SZ_BYTES` over C
//! declarations of the same structs.

/// Declares a layout's [`Field`] constants and its `FIELDS` table: `NAME = "mlx5_ifc name", off, width;`, each
/// with its doc comment. The table lists the fields in the order given, and a compile-time check ties each
/// constant's name to its mlx5_ifc name.
macro_rules! fields {
    ($($(#[$doc:meta])* $NAME:ident = $name:literal, $off:literal, $width:literal;)*) => {
        $(
            $(#[$doc])*
            pub const $NAME: $crate::prm::cmd::Field = $crate::prm::cmd::Field::new($off, $width);
        )*

        /// Every [`Field`](crate::prm::cmd::Field) constant of this module with its mlx5_ifc name, in layout
        /// order: for dumping a mailbox, and for the golden test that checks each against rdma-core's
        /// `DEVX_GET`.
        pub const FIELDS: &[(&str, $crate::prm::cmd::Field)] = &[$(($name, $NAME),)*];

        const _: () = {
            $(assert!($crate::prm::cmd::field::same_name($name, stringify!($NAME)), "constant name != mlx5_ifc name");)*
        };
    };
}
pub(crate) use fields;

/// An output layout that holds nothing but the header (`status`, `syndrome`, 8 reserved bytes).
macro_rules! empty_out {
    ($ifc:literal) => {
        #[doc = concat!("Bytes in the output (`DEVX_ST_SZ_BYTES(", $ifc, ")`).")]
        pub const SIZE: usize = 16;

        $crate::prm::cmd::fields! {
            #[doc = concat!("`mlx5_ifc_", $ifc, "_bits.status`, bits 0..8: [`status`](crate::prm::cmd::status).")]
            STATUS = "status", 0x0, 8;
            #[doc = concat!("`mlx5_ifc_", $ifc, "_bits.syndrome`, bits 32..64 (0 on success).")]
            SYNDROME = "syndrome", 0x20, 32;
        }
    };
}
pub(crate) use empty_out;

mod cq;
mod field;
mod hca_cap;
mod qp;

pub use cq::{cqc, create_cq_in, create_cq_out, destroy_cq_in, destroy_cq_out};
pub use field::{Bytes, Field, FieldError};
pub use hca_cap::{cmd_hca_cap, query_hca_cap_in, query_hca_cap_out};
pub use qp::{
    ads, create_qp_in, create_qp_out, destroy_qp_in, destroy_qp_out, init2rtr_qp_in, init2rtr_qp_out, qp_2err_in,
    qp_2err_out, qpc, query_qp_in, query_qp_out, rst2init_qp_in, rst2init_qp_out, rtr2rts_qp_in, rtr2rts_qp_out,
};

/// Command opcodes: the `opcode` field of every command input (`MLX5_CMD_OP_*` in mlx5_ifc.h).
pub mod opcode {
    /// `MLX5_CMD_OP_QUERY_HCA_CAP`: read a capability page ([`query_hca_cap_in`](super::query_hca_cap_in)).
    pub const QUERY_HCA_CAP: u16 = 0x100;
    /// `MLX5_CMD_OP_CREATE_CQ` ([`create_cq_in`](super::create_cq_in)).
    pub const CREATE_CQ: u16 = 0x400;
    /// `MLX5_CMD_OP_DESTROY_CQ` ([`destroy_cq_in`](super::destroy_cq_in)).
    pub const DESTROY_CQ: u16 = 0x401;
    /// `MLX5_CMD_OP_CREATE_QP` ([`create_qp_in`](super::create_qp_in)); the QP starts in RST.
    pub const CREATE_QP: u16 = 0x500;
    /// `MLX5_CMD_OP_DESTROY_QP` ([`destroy_qp_in`](super::destroy_qp_in)).
    pub const DESTROY_QP: u16 = 0x501;
    /// `MLX5_CMD_OP_RST2INIT_QP` ([`rst2init_qp_in`](super::rst2init_qp_in)).
    pub const RST2INIT_QP: u16 = 0x502;
    /// `MLX5_CMD_OP_INIT2RTR_QP` ([`init2rtr_qp_in`](super::init2rtr_qp_in)).
    pub const INIT2RTR_QP: u16 = 0x503;
    /// `MLX5_CMD_OP_RTR2RTS_QP` ([`rtr2rts_qp_in`](super::rtr2rts_qp_in)).
    pub const RTR2RTS_QP: u16 = 0x504;
    /// `MLX5_CMD_OP_2ERR_QP`: any state to ERR ([`qp_2err_in`](super::qp_2err_in)).
    pub const QP_2ERR: u16 = 0x507;
    /// `MLX5_CMD_OP_QUERY_QP` ([`query_qp_in`](super::query_qp_in)).
    pub const QUERY_QP: u16 = 0x50b;

    /// The name of command `op` (the suffix of its `MLX5_CMD_OP_*`, as the constants here spell it), or
    /// `None` for an opcode this module does not define.
    pub const fn name(op: u16) -> Option<&'static str> {
        Some(match op {
            QUERY_HCA_CAP => "QUERY_HCA_CAP",
            CREATE_CQ => "CREATE_CQ",
            DESTROY_CQ => "DESTROY_CQ",
            CREATE_QP => "CREATE_QP",
            DESTROY_QP => "DESTROY_QP",
            RST2INIT_QP => "RST2INIT_QP",
            INIT2RTR_QP => "INIT2RTR_QP",
            RTR2RTS_QP => "RTR2RTS_QP",
            QP_2ERR => "2ERR_QP",
            QUERY_QP => "QUERY_QP",
            _ => return None,
        })
    }
}

/// Command completion status: the `status` byte of every command output (`MLX5_CMD_STAT_*` in mlx5_ifc.h).
/// Anything but [`OK`](status::OK) comes with a 32-bit `syndrome` that names the exact check that failed.
pub mod status {
    /// `MLX5_CMD_STAT_OK`: the command succeeded.
    pub const OK: u8 = 0x0;
    /// `MLX5_CMD_STAT_INT_ERR`: internal firmware error.
    pub const INTERNAL_ERR: u8 = 0x1;
    /// `MLX5_CMD_STAT_BAD_OP_ERR`: unknown or unsupported opcode (or op_mod).
    pub const BAD_OP: u8 = 0x2;
    /// `MLX5_CMD_STAT_BAD_PARAM_ERR`: an input field has a value the command does not accept.
    pub const BAD_PARAM: u8 = 0x3;
    /// `MLX5_CMD_STAT_BAD_SYS_STATE_ERR`: the device is in a state that does not allow the command.
    pub const BAD_SYS_STATE: u8 = 0x4;
    /// `MLX5_CMD_STAT_BAD_RES_ERR`: a referenced resource (CQ, PD, UAR, umem...) does not exist or is not the
    /// caller's.
    pub const BAD_RES: u8 = 0x5;
    /// `MLX5_CMD_STAT_RES_BUSY`: the resource is in use (e.g. destroying a CQ that a QP still uses).
    pub const RES_BUSY: u8 = 0x6;
    /// `MLX5_CMD_STAT_LIM_ERR`: a limit was exceeded (number of objects, queue size).
    pub const LIM: u8 = 0x8;
    /// `MLX5_CMD_STAT_BAD_RES_STATE_ERR`: the resource is in a state that does not allow the command (e.g. a
    /// QP transition from the wrong state).
    pub const BAD_RES_STATE: u8 = 0x9;
    /// `MLX5_CMD_STAT_IX_ERR`: an index is out of range.
    pub const BAD_INDEX: u8 = 0xa;
    /// `MLX5_CMD_STAT_NO_RES_ERR`: out of resources (memory, ICM).
    pub const NO_RES: u8 = 0xf;
    /// `MLX5_CMD_STAT_BAD_QP_STATE_ERR`: the QP is not in the state the command expects.
    pub const BAD_QP_STATE: u8 = 0x10;
    /// `MLX5_CMD_STAT_BAD_PKT_ERR`: bad packet (MAD commands).
    pub const BAD_PKT: u8 = 0x30;
    /// `MLX5_CMD_STAT_BAD_SIZE_OUTS_CQES_ERR`: the CQ is too small for its outstanding CQEs (resize).
    pub const BAD_SIZE: u8 = 0x40;
    /// `MLX5_CMD_STAT_BAD_INP_LEN_ERR`: the input mailbox is shorter than the command needs.
    pub const BAD_INP_LEN: u8 = 0x50;
    /// `MLX5_CMD_STAT_BAD_OUTP_LEN_ERR`: the output mailbox is shorter than the command needs.
    pub const BAD_OUTP_LEN: u8 = 0x51;

    /// The name of status `s` (the suffix of its `MLX5_CMD_STAT_*`, as the constants here spell it), or `None`
    /// for a value mlx5_ifc.h does not define.
    pub const fn name(s: u8) -> Option<&'static str> {
        Some(match s {
            OK => "OK",
            INTERNAL_ERR => "INTERNAL_ERR",
            BAD_OP => "BAD_OP",
            BAD_PARAM => "BAD_PARAM",
            BAD_SYS_STATE => "BAD_SYS_STATE",
            BAD_RES => "BAD_RES",
            RES_BUSY => "RES_BUSY",
            LIM => "LIM",
            BAD_RES_STATE => "BAD_RES_STATE",
            BAD_INDEX => "BAD_INDEX",
            NO_RES => "NO_RES",
            BAD_QP_STATE => "BAD_QP_STATE",
            BAD_PKT => "BAD_PKT",
            BAD_SIZE => "BAD_SIZE",
            BAD_INP_LEN => "BAD_INP_LEN",
            BAD_OUTP_LEN => "BAD_OUTP_LEN",
            _ => return None,
        })
    }
}

/// The header every command input starts with (`mlx5_ifc_mbox_in_bits`): 16 bytes, of which commands use the
/// first 8 (`opcode`, `uid`, `op_mod`) and give the rest their own meaning.
pub mod mbox_in {
    use super::FieldError;

    /// Bytes in the header (`DEVX_ST_SZ_BYTES(mbox_in)`).
    pub const SIZE: usize = 16;

    crate::prm::cmd::fields! {
        /// `mlx5_ifc_mbox_in_bits.opcode`, bits 0..16: the command ([`opcode`](super::opcode)).
        OPCODE = "opcode", 0x0, 16;
        /// `mlx5_ifc_mbox_in_bits.uid`, bits 16..32: the DevX user context the object belongs to. The kernel
        /// fills it in for DevX commands; 0 here.
        UID = "uid", 0x10, 16;
        /// `mlx5_ifc_mbox_in_bits.op_mod`, bits 48..64: the command's modifier (e.g. which capability page
        /// QUERY_HCA_CAP reads); 0 for most commands.
        OP_MOD = "op_mod", 0x30, 16;
    }

    /// Zeroes `buf` (all reserved bits must be zero) and writes the header: `opcode`, `uid`, `op_mod`.
    /// [`FieldError::ShortBuffer`] if `buf` is shorter than the 8 bytes the header's fields take.
    pub fn start(buf: &mut [u8], opcode: u16, uid: u16, op_mod: u16) -> Result<(), FieldError> {
        if buf.len() < OP_MOD.end() {
            return Err(FieldError::ShortBuffer { needed: OP_MOD.end(), len: buf.len() });
        }
        buf.fill(0);
        OPCODE.set(buf, opcode.into())?;
        UID.set(buf, uid.into())?;
        OP_MOD.set(buf, op_mod.into())
    }
}

/// The header every command output starts with (`mlx5_ifc_mbox_out_bits`): 16 bytes, `status` and `syndrome`
/// first; commands put their results after them.
pub mod mbox_out {
    use super::{status, FieldError};
    use core::fmt;

    /// Bytes in the header (`DEVX_ST_SZ_BYTES(mbox_out)`).
    pub const SIZE: usize = 16;

    crate::prm::cmd::fields! {
        /// `mlx5_ifc_mbox_out_bits.status`, bits 0..8: [`status`] of the command.
        STATUS = "status", 0x0, 8;
        /// `mlx5_ifc_mbox_out_bits.syndrome`, bits 32..64: firmware's code for the failed check (0 on success).
        SYNDROME = "syndrome", 0x20, 32;
    }

    /// A command that completed with a status other than [`status::OK`].
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct CmdError {
        /// The `status` byte ([`status`]).
        pub status: u8,
        /// The `syndrome`.
        pub syndrome: u32,
    }

    impl fmt::Display for CmdError {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            match status::name(self.status) {
                Some(n) => write!(f, "command failed: status {n} ({:#x}), syndrome {:#x}", self.status, self.syndrome),
                None => write!(f, "command failed: status {:#x}, syndrome {:#x}", self.status, self.syndrome),
            }
        }
    }

    /// `Ok` if the output `buf` says the command succeeded, else its status and syndrome.
    /// [`FieldError::ShortBuffer`] (in the outer `Result`) if `buf` has fewer than 8 bytes.
    pub fn check(buf: &[u8]) -> Result<Result<(), CmdError>, FieldError> {
        let s = STATUS.try_get(buf)? as u8;
        let syndrome = SYNDROME.try_get(buf)? as u32;
        Ok(if s == status::OK { Ok(()) } else { Err(CmdError { status: s, syndrome }) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One layout: its name, its size in bytes, its `FIELDS`.
    type Layout = (&'static str, usize, &'static [(&'static str, Field)]);

    /// Every layout's `FIELDS`, with its size in bytes.
    const LAYOUTS: &[Layout] = &[
        ("mbox_in", mbox_in::SIZE, mbox_in::FIELDS),
        ("mbox_out", mbox_out::SIZE, mbox_out::FIELDS),
        ("cqc", cqc::SIZE, cqc::FIELDS),
        ("create_cq_in", create_cq_in::SIZE, create_cq_in::FIELDS),
        ("create_cq_out", create_cq_out::SIZE, create_cq_out::FIELDS),
        ("destroy_cq_in", destroy_cq_in::SIZE, destroy_cq_in::FIELDS),
        ("destroy_cq_out", destroy_cq_out::SIZE, destroy_cq_out::FIELDS),
        ("ads", ads::SIZE, ads::FIELDS),
        ("qpc", qpc::SIZE, qpc::FIELDS),
        ("create_qp_in", create_qp_in::SIZE, create_qp_in::FIELDS),
        ("create_qp_out", create_qp_out::SIZE, create_qp_out::FIELDS),
        ("destroy_qp_in", destroy_qp_in::SIZE, destroy_qp_in::FIELDS),
        ("destroy_qp_out", destroy_qp_out::SIZE, destroy_qp_out::FIELDS),
        ("rst2init_qp_in", rst2init_qp_in::SIZE, rst2init_qp_in::FIELDS),
        ("rst2init_qp_out", rst2init_qp_out::SIZE, rst2init_qp_out::FIELDS),
        ("init2rtr_qp_in", init2rtr_qp_in::SIZE, init2rtr_qp_in::FIELDS),
        ("init2rtr_qp_out", init2rtr_qp_out::SIZE, init2rtr_qp_out::FIELDS),
        ("rtr2rts_qp_in", rtr2rts_qp_in::SIZE, rtr2rts_qp_in::FIELDS),
        ("rtr2rts_qp_out", rtr2rts_qp_out::SIZE, rtr2rts_qp_out::FIELDS),
        ("qp_2err_in", qp_2err_in::SIZE, qp_2err_in::FIELDS),
        ("qp_2err_out", qp_2err_out::SIZE, qp_2err_out::FIELDS),
        ("query_qp_in", query_qp_in::SIZE, query_qp_in::FIELDS),
        ("query_qp_out", query_qp_out::SIZE, query_qp_out::FIELDS),
        ("query_hca_cap_in", query_hca_cap_in::SIZE, query_hca_cap_in::FIELDS),
        ("query_hca_cap_out", query_hca_cap_out::SIZE, query_hca_cap_out::FIELDS),
        ("cmd_hca_cap", cmd_hca_cap::SIZE, cmd_hca_cap::FIELDS),
    ];

    #[test]
    fn fields_are_in_order_disjoint_and_inside_their_layout() {
        for &(layout, size, fields) in LAYOUTS {
            assert!(size.is_multiple_of(4), "{layout}: size {size} is not whole dwords");
            let mut end = 0;
            for &(name, f) in fields {
                assert!(f.off() >= end, "{layout}.{name} at bit {:#x} overlaps or precedes the field before", f.off());
                end = f.off() + f.width();
                assert!(f.end() <= size, "{layout}.{name} ends past the layout's {size} bytes");
            }
        }
    }

    #[test]
    fn start_writes_the_header_over_a_zeroed_buffer() {
        let mut buf = [0xffu8; create_qp_in::SIZE];
        mbox_in::start(&mut buf, opcode::CREATE_QP, 0x1234, 0x0005).unwrap();
        assert_eq!(buf[..8], [0x05, 0x00, 0x12, 0x34, 0x00, 0x00, 0x00, 0x05]);
        assert!(buf[8..].iter().all(|&b| b == 0));
        assert_eq!(mbox_in::start(&mut buf[..7], 1, 0, 0), Err(FieldError::ShortBuffer { needed: 8, len: 7 }));
    }

    #[test]
    fn opcodes_have_their_mlx5_ifc_names() {
        assert_eq!(opcode::name(opcode::CREATE_QP), Some("CREATE_QP"));
        assert_eq!(opcode::name(opcode::QP_2ERR), Some("2ERR_QP"));
        assert_eq!(opcode::name(0x50a), None);
    }

    #[test]
    fn check_reads_status_and_syndrome() {
        let mut out = [0u8; mbox_out::SIZE];
        assert_eq!(mbox_out::check(&out), Ok(Ok(())));
        out[0] = status::BAD_PARAM;
        out[4..8].copy_from_slice(&0x1234_5678u32.to_be_bytes());
        let err = mbox_out::check(&out).unwrap().unwrap_err();
        assert_eq!(err, mbox_out::CmdError { status: 0x3, syndrome: 0x1234_5678 });
        assert_eq!(status::name(err.status), Some("BAD_PARAM"));
        assert_eq!(status::name(0x7), None);
        assert!(mbox_out::check(&out[..7]).is_err());
    }
}
