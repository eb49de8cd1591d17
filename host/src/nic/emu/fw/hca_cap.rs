//! QUERY_HCA_CAP: the general capabilities (`cmd_hca_cap`), the emulated NIC's own limits, for `op_mod`
//! general capabilities, maximum or current (both the same).

use gdaki_shared::prm::cmd::{cmd_hca_cap as cap, mbox_in, opcode, query_hca_cap_in, query_hca_cap_out};
use gdaki_shared::prm::wqe::SEG;

use super::super::cq::MAX_CQE;
use super::super::qp::MAX_WQE_CNT;
use super::syndrome::{cmd_syndrome as syn, Fail};
use super::{get, put, Command, Ctx, QUERY_HEADER};

pub(super) const QUERY_HCA_CAP: Command = Command {
    opcode: opcode::QUERY_HCA_CAP,
    in_size: query_hca_cap_in::SIZE,
    out_size: query_hca_cap_out::SIZE,
    op_mod: true,
    head: &QUERY_HEADER,
    taken: &[],
    named: &[(mbox_in::FIELDS, 0), (query_hca_cap_in::FIELDS, 0)],
    named_bytes: &[],
    run: query_hca_cap,
};

/// The capabilities: each field with the emulated NIC's value.
const CAPS: &[(gdaki_shared::prm::cmd::Field, u64)] = &[
    // 2^15 WQEBBs per SQ, 2^24 QPs and CQs (24-bit numbers), 2^22 CQEs per CQ.
    (cap::LOG_MAX_QP_SZ, MAX_WQE_CNT.ilog2() as u64),
    (cap::LOG_MAX_QP, 24),
    (cap::LOG_MAX_CQ_SZ, MAX_CQE.ilog2() as u64),
    (cap::LOG_MAX_CQ, 24),
    // `qpc.log_sra_max` and `log_rra_max` are 3 bits; the wire keeps up to 2^15 READs and atomics in flight.
    (cap::LOG_MAX_RA_REQ_QP, 7),
    (cap::LOG_MAX_RA_RES_QP, 7),
    // Encoded sizes: 0 is 8 GIDs (only index 0 is set) and 128 P_Keys (only index 0, the default).
    (cap::GID_TABLE_SIZE, 0),
    (cap::PKEY_TABLE_SIZE, 0),
    (cap::PORT_TYPE, cap::port_type::ETH as u64),
    (cap::NUM_PORTS, 1),
    // Messages up to 2^31 bytes (a data segment's byte count).
    (cap::LOG_MAX_MSG, 31),
    (cap::CQE_VERSION, 0),
    (cap::RC, 1),
    // One 4096-byte UAR per page.
    (cap::UAR_4K, 1),
    (cap::UMEM_UID_0, 1),
    (cap::BF, 1),
    // The NIC takes one WQEBB from the register.
    (cap::LOG_BF_REG_SIZE, 6),
    // `ds` is 6 bits: 63 segments of 16 bytes.
    (cap::MAX_WQE_SZ_SQ, 63 * SEG as u64),
    (cap::LOG_MAX_PD, 24),
    (cap::SQ_TS_FORMAT, cap::ts_format_cap::FREE_RUNNING as u64),
    (cap::RQ_TS_FORMAT, cap::ts_format_cap::FREE_RUNNING as u64),
    (cap::LOG_MAX_UMEM, 24),
    (cap::LOG_UAR_PAGE_SZ, 0),
    // CQE timestamps are nanoseconds: a 1 GHz clock.
    (cap::DEVICE_FREQUENCY_KHZ, 1_000_000),
    (cap::NUM_OF_UARS_PER_PAGE, 1),
];

fn query_hca_cap(_c: &mut Ctx<'_>, inbox: &[u8], out: &mut [u8]) -> Result<(), Fail> {
    use query_hca_cap_in::{op_mod, CAP_GENERAL, GET_CUR, GET_MAX};
    let m = get(inbox, query_hca_cap_in::OP_MOD) as u16;
    if m != op_mod(CAP_GENERAL, GET_MAX) && m != op_mod(CAP_GENERAL, GET_CUR) {
        return Err(Fail::of(syn::BAD_OP_MOD));
    }
    for &(f, v) in CAPS {
        put(out, query_hca_cap_out::capability(f), v);
    }
    Ok(())
}
