//! Sizes, alignments and field offsets of gdaki-shared's mlx5 layouts, and every `MLX5_*` constant it mirrors,
//! against the system's `<infiniband/mlx5dv.h>`.

use gdaki_golden::{c_const, c_field, c_fields, c_struct};
use gdaki_shared::prm::cqe::{Cqe64, ErrCqe};
use gdaki_shared::prm::dbrec::{CqDbrec, QpDbrec};
use gdaki_shared::prm::wqe::{self, AtomicSeg, CtrlSeg, DataSeg, InlineSeg, RaddrSeg};
use gdaki_shared::prm::{opcode, uar};
use std::mem::{align_of, offset_of, size_of, size_of_val};

/// Checks that Rust struct `$rust` and C `struct $c` have the same size and that each listed field has the
/// same offset and size in both. `$skip` lists Rust fields compared elsewhere (or with no C name).
///
/// The struct pattern is exhaustive on purpose: a field added to gdaki-shared without a golden check here
/// stops this test from compiling, so "every field is checked" stays true.
macro_rules! same_layout {
    ($rust:ident = $c:literal { $($field:ident),* $(,)? } $(skip { $($skip:ident),* $(,)? })?) => {{
        let v: $rust = bytemuck::Zeroable::zeroed();
        let $rust { $($field: _,)* $($($skip: _,)*)? } = v;
        let c = c_struct($c).unwrap_or_else(|| panic!("C file exports no struct {}", $c));
        assert_eq!(size_of::<$rust>(), c.size, "sizeof {} vs struct {}", stringify!($rust), $c);
        let mut checked = Vec::<&str>::new();
        $(
            let cf = c_field($c, stringify!($field))
                .unwrap_or_else(|| panic!("struct {} has no field {} in this header", $c, stringify!($field)));
            assert_eq!(
                (offset_of!($rust, $field), size_of_val(&v.$field)),
                (cf.offset, cf.size),
                "(offset, size) of {}::{} vs struct {}.{}",
                stringify!($rust), stringify!($field), $c, stringify!($field),
            );
            checked.push(stringify!($field));
        )*
        checked
    }};
}

/// The C table's fields of `strukt` that `checked` does not name: each must be accounted for by the caller.
fn unchecked(strukt: &str, checked: &[&str]) -> Vec<&'static str> {
    c_fields(strukt).into_iter().map(|(f, _)| f).filter(|f| !checked.contains(f)).collect()
}

#[test]
fn ctrl_seg_layout() {
    let checked = same_layout!(CtrlSeg = "mlx5_wqe_ctrl_seg" {
        opmod_idx_opcode, qpn_ds, signature, dci_stream_channel_id, fm_ce_se, imm,
    });
    assert!(unchecked("mlx5_wqe_ctrl_seg", &checked).is_empty());
}

#[test]
fn raddr_seg_layout() {
    let checked = same_layout!(RaddrSeg = "mlx5_wqe_raddr_seg" { raddr, rkey, reserved });
    assert!(unchecked("mlx5_wqe_raddr_seg", &checked).is_empty());
}

#[test]
fn data_seg_layout() {
    let checked = same_layout!(DataSeg = "mlx5_wqe_data_seg" { byte_count, lkey, addr });
    assert!(unchecked("mlx5_wqe_data_seg", &checked).is_empty());
}

#[test]
fn inline_seg_layout() {
    let checked = same_layout!(InlineSeg = "mlx5_wqe_inl_data_seg" { byte_count });
    assert!(unchecked("mlx5_wqe_inl_data_seg", &checked).is_empty());
}

#[test]
fn atomic_seg_layout() {
    let checked = same_layout!(AtomicSeg = "mlx5_wqe_atomic_seg" { swap_add, compare });
    assert!(unchecked("mlx5_wqe_atomic_seg", &checked).is_empty());
}

#[test]
fn cqe64_layout() {
    let checked = same_layout!(Cqe64 = "mlx5_cqe64" {
        srqn_uidx, imm_inval_pkey, app, app_op, app_info, byte_cnt, timestamp, sop_drop_qpn, wqe_counter,
        signature, op_own,
    } skip { rsvd0 });
    assert!(unchecked("mlx5_cqe64", &checked).is_empty());
    // In C, bytes 0..32 are an anonymous union whose member names vary by release: our `rsvd0` must be exactly
    // the bytes before the first named field.
    assert_eq!(offset_of!(Cqe64, rsvd0), 0);
    assert_eq!(size_of_val(&Cqe64::INVALID.rsvd0), c_field("mlx5_cqe64", "srqn_uidx").unwrap().offset);
}

/// `mlx5_err_cqe`. Older rdma-core headers (e.g. Debian's 44.0) have `rsvd1[18]` where newer ones and the PRM
/// have `rsvd1[16]; hw_err_synd; hw_synd_type`. Our layout follows the newer one; with an older header the
/// two named bytes must lie exactly at the end of C's reserve.
#[test]
fn err_cqe_layout() {
    let mut checked = same_layout!(ErrCqe = "mlx5_err_cqe" {
        rsvd0, srqn, vendor_err_synd, syndrome, s_wqe_opcode_qpn, wqe_counter, signature, op_own,
    } skip { rsvd1, hw_err_synd, hw_synd_type });
    let c_rsvd1 = c_field("mlx5_err_cqe", "rsvd1").unwrap();
    let ours = |off: usize, size: usize| (off, size);
    let v: ErrCqe = bytemuck::Zeroable::zeroed();
    let our_rsvd1 = ours(offset_of!(ErrCqe, rsvd1), size_of_val(&v.rsvd1));
    let our_hw = ours(offset_of!(ErrCqe, hw_err_synd), size_of_val(&v.hw_err_synd));
    let our_type = ours(offset_of!(ErrCqe, hw_synd_type), size_of_val(&v.hw_synd_type));
    match (c_field("mlx5_err_cqe", "hw_err_synd"), c_field("mlx5_err_cqe", "hw_synd_type")) {
        (Some(hw), Some(ty)) => {
            assert_eq!(our_rsvd1, (c_rsvd1.offset, c_rsvd1.size), "ErrCqe::rsvd1 vs mlx5_err_cqe.rsvd1");
            assert_eq!(our_hw, (hw.offset, hw.size), "ErrCqe::hw_err_synd vs mlx5_err_cqe.hw_err_synd");
            assert_eq!(our_type, (ty.offset, ty.size), "ErrCqe::hw_synd_type vs mlx5_err_cqe.hw_synd_type");
            checked.extend(["rsvd1", "hw_err_synd", "hw_synd_type"]);
        }
        (None, None) => {
            eprintln!(
                "note: this mlx5dv.h has no mlx5_err_cqe.hw_err_synd/hw_synd_type (rsvd1 is {} bytes); \
                 checking that ErrCqe's rsvd1 + hw_err_synd + hw_synd_type tile C's rsvd1 exactly",
                c_rsvd1.size
            );
            assert_eq!(our_rsvd1.0, c_rsvd1.offset);
            assert_eq!(our_hw.0, our_rsvd1.0 + our_rsvd1.1);
            assert_eq!(our_type.0, our_hw.0 + our_hw.1);
            assert_eq!(our_type.0 + our_type.1, c_rsvd1.offset + c_rsvd1.size);
            checked.push("rsvd1");
        }
        (hw, ty) => panic!("header has only one of hw_err_synd ({hw:?}) / hw_synd_type ({ty:?}): update ErrCqe"),
    }
    assert!(unchecked("mlx5_err_cqe", &checked).is_empty());
}

/// Alignment: the WQE segments and CQE64 match C exactly, so that a segment can be stored with the same word
/// or vector stores the C code uses. `ErrCqe` is deliberately stricter (8, C says 4): it is a view of the same
/// 8-byte-aligned CQE bytes as `Cqe64`, and `bytemuck::cast_ref` between the two needs equal alignment.
#[test]
fn alignments() {
    let align = |c: &str| c_struct(c).unwrap().align;
    assert_eq!(align_of::<CtrlSeg>(), align("mlx5_wqe_ctrl_seg"));
    assert_eq!(align_of::<RaddrSeg>(), align("mlx5_wqe_raddr_seg"));
    assert_eq!(align_of::<DataSeg>(), align("mlx5_wqe_data_seg"));
    assert_eq!(align_of::<InlineSeg>(), align("mlx5_wqe_inl_data_seg"));
    assert_eq!(align_of::<AtomicSeg>(), align("mlx5_wqe_atomic_seg"));
    assert_eq!(align_of::<Cqe64>(), align("mlx5_cqe64"));
    assert!(align_of::<ErrCqe>() >= align("mlx5_err_cqe"));
    assert_eq!(align_of::<ErrCqe>(), align_of::<Cqe64>());
}

/// `c_const(name)` that must exist in every header we support.
fn required(name: &str) -> i64 {
    c_const(name).unwrap_or_else(|| panic!("mlx5dv.h does not define {name}"))
}

/// The value of `MLX5_*` item `name`, which the installed mlx5dv.h may lack: rdma-core keeps it in a header it
/// does not install (its provider's `providers/mlx5/mlx5.h`) or only the kernel's `include/linux/mlx5/qp.h`
/// defines it. `reference` is its value there, copied by hand. When the header has the item, the header's value
/// must equal it and is returned; when it lacks the item, `reference` is returned, so that the caller compares
/// gdaki-shared with it instead of skipping the check.
fn header_or_reference(name: &str, reference: i64) -> i64 {
    match c_const(name) {
        Some(v) => {
            assert_eq!(v, reference, "{name}: mlx5dv.h says {v:#x}, the reference value is {reference:#x}");
            v
        }
        None => reference,
    }
}

/// Compares each `(ours, "MLX5_NAME")` pair, listing every mismatch at once.
fn check_consts(pairs: &[(i64, &str)]) {
    let bad: Vec<String> = pairs
        .iter()
        .filter(|&&(ours, name)| ours != required(name))
        .map(|&(ours, name)| format!("{name}: ours {ours:#x}, header {:#x}", required(name)))
        .collect();
    assert!(bad.is_empty(), "constants differ from mlx5dv.h:\n{}", bad.join("\n"));
}

#[test]
fn wqe_opcodes() {
    check_consts(&[
        (opcode::NOP.into(), "MLX5_OPCODE_NOP"),
        (opcode::RDMA_WRITE.into(), "MLX5_OPCODE_RDMA_WRITE"),
        (opcode::RDMA_WRITE_IMM.into(), "MLX5_OPCODE_RDMA_WRITE_IMM"),
        (opcode::SEND.into(), "MLX5_OPCODE_SEND"),
        (opcode::SEND_IMM.into(), "MLX5_OPCODE_SEND_IMM"),
        (opcode::RDMA_READ.into(), "MLX5_OPCODE_RDMA_READ"),
        (opcode::ATOMIC_CS.into(), "MLX5_OPCODE_ATOMIC_CS"),
        (opcode::ATOMIC_FA.into(), "MLX5_OPCODE_ATOMIC_FA"),
        (opcode::ATOMIC_MASKED_CS.into(), "MLX5_OPCODE_ATOMIC_MASKED_CS"),
        (opcode::ATOMIC_MASKED_FA.into(), "MLX5_OPCODE_ATOMIC_MASKED_FA"),
    ]);
}

#[test]
fn cqe_opcodes() {
    use opcode::cqe;
    check_consts(&[
        (cqe::REQ.into(), "MLX5_CQE_REQ"),
        (cqe::RESP_WR_IMM.into(), "MLX5_CQE_RESP_WR_IMM"),
        (cqe::RESP_SEND.into(), "MLX5_CQE_RESP_SEND"),
        (cqe::REQ_ERR.into(), "MLX5_CQE_REQ_ERR"),
        (cqe::RESP_ERR.into(), "MLX5_CQE_RESP_ERR"),
        (cqe::INVALID.into(), "MLX5_CQE_INVALID"),
    ]);
    // OP_OWN_INVALID = INVALID in bits 7:4 and the owner bit (MLX5_CQE_OWNER_MASK) set.
    let owner_mask = required("MLX5_CQE_OWNER_MASK");
    let invalid = required("MLX5_CQE_INVALID");
    assert_eq!(i64::from(gdaki_shared::prm::cqe::OP_OWN_INVALID), (invalid << 4) | owner_mask);
}

#[test]
fn syndromes() {
    use opcode::syndrome as s;
    check_consts(&[
        (s::LOCAL_LENGTH_ERR.into(), "MLX5_CQE_SYNDROME_LOCAL_LENGTH_ERR"),
        (s::LOCAL_QP_OP_ERR.into(), "MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR"),
        (s::LOCAL_PROT_ERR.into(), "MLX5_CQE_SYNDROME_LOCAL_PROT_ERR"),
        (s::WR_FLUSH_ERR.into(), "MLX5_CQE_SYNDROME_WR_FLUSH_ERR"),
        (s::MW_BIND_ERR.into(), "MLX5_CQE_SYNDROME_MW_BIND_ERR"),
        (s::BAD_RESP_ERR.into(), "MLX5_CQE_SYNDROME_BAD_RESP_ERR"),
        (s::LOCAL_ACCESS_ERR.into(), "MLX5_CQE_SYNDROME_LOCAL_ACCESS_ERR"),
        (s::REMOTE_INVAL_REQ_ERR.into(), "MLX5_CQE_SYNDROME_REMOTE_INVAL_REQ_ERR"),
        (s::REMOTE_ACCESS_ERR.into(), "MLX5_CQE_SYNDROME_REMOTE_ACCESS_ERR"),
        (s::REMOTE_OP_ERR.into(), "MLX5_CQE_SYNDROME_REMOTE_OP_ERR"),
        (s::TRANSPORT_RETRY_EXC_ERR.into(), "MLX5_CQE_SYNDROME_TRANSPORT_RETRY_EXC_ERR"),
        (s::RNR_RETRY_EXC_ERR.into(), "MLX5_CQE_SYNDROME_RNR_RETRY_EXC_ERR"),
        (s::REMOTE_ABORTED_ERR.into(), "MLX5_CQE_SYNDROME_REMOTE_ABORTED_ERR"),
    ]);
}

#[test]
fn ctrl_flags() {
    use wqe::fm_ce_se as f;
    check_consts(&[
        (f::CQ_UPDATE.into(), "MLX5_WQE_CTRL_CQ_UPDATE"),
        (f::SOLICITED.into(), "MLX5_WQE_CTRL_SOLICITED"),
        (f::FENCE.into(), "MLX5_WQE_CTRL_FENCE"),
        (f::INITIATOR_SMALL_FENCE.into(), "MLX5_WQE_CTRL_INITIATOR_SMALL_FENCE"),
    ]);
    // Fence mode 3 ("strong ordering") in bits 7:5, as in the PRM, SPDK's and DOCA's mlx5 headers.
    assert_eq!(
        i64::from(f::STRONG_ORDERING),
        header_or_reference("MLX5_WQE_CTRL_STRONG_ORDERING", 3 << 5),
        "MLX5_WQE_CTRL_STRONG_ORDERING"
    );
    // Every flag the header names lies inside the mask the emulated NIC accepts.
    for name in ["MLX5_WQE_CTRL_CQ_UPDATE", "MLX5_WQE_CTRL_SOLICITED", "MLX5_WQE_CTRL_FENCE"] {
        assert_eq!(required(name) & !i64::from(f::VALID_MASK), 0, "{name} outside fm_ce_se::VALID_MASK");
    }
}

#[test]
fn sizes_and_markers() {
    check_consts(&[
        (wqe::WQEBB as i64, "MLX5_SEND_WQE_BB"),
        (wqe::WQEBB.trailing_zeros().into(), "MLX5_SEND_WQE_SHIFT"),
        (wqe::INLINE_SEG.into(), "MLX5_INLINE_SEG"),
    ]);
    // Linux include/linux/mlx5/qp.h: `MLX5_SEND_WQE_DS = 16`.
    assert_eq!(wqe::SEG as i64, header_or_reference("MLX5_SEND_WQE_DS", 16), "MLX5_SEND_WQE_DS");
    // rdma-core providers/mlx5/mlx5.h: `MLX5_BF_OFFSET = 0x800`.
    assert_eq!(uar::BF_OFFSET as i64, header_or_reference("MLX5_BF_OFFSET", 0x800), "MLX5_BF_OFFSET");
}

/// `MLX5_RCV_DBR`/`MLX5_SND_DBR` are indices of 32-bit words in the QP dbrec: our fields must sit there.
#[test]
fn doorbell_record_words() {
    let word = |name| usize::try_from(required(name)).unwrap() * 4;
    assert_eq!(offset_of!(QpDbrec, rcv_counter), word("MLX5_RCV_DBR"), "QpDbrec::rcv_counter vs MLX5_RCV_DBR");
    assert_eq!(offset_of!(QpDbrec, snd_counter), word("MLX5_SND_DBR"), "QpDbrec::snd_counter vs MLX5_SND_DBR");
    // rdma-core providers/mlx5/mlx5.h: `MLX5_CQ_SET_CI = 0, MLX5_CQ_ARM_DB = 1` (32-bit words of the CQ dbrec).
    let private_word = |name, reference| usize::try_from(header_or_reference(name, reference)).unwrap() * 4;
    assert_eq!(offset_of!(CqDbrec, set_ci), private_word("MLX5_CQ_SET_CI", 0), "CqDbrec::set_ci");
    assert_eq!(offset_of!(CqDbrec, arm), private_word("MLX5_CQ_ARM_DB", 1), "CqDbrec::arm");
}
