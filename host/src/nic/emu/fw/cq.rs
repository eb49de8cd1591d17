//! CREATE_CQ and DESTROY_CQ.
//!
//! CREATE_CQ takes a ring of `2^log_cq_size` 64-byte CQEs in a umem (`cq_umem_valid`, `cq_umem_id`,
//! `cq_umem_offset`), a doorbell record in a umem (`cqc.dbr_umem_valid`, `dbr_umem_id`, `dbr_addr` as the
//! offset), and a UAR page. It does not touch the ring: software fills it before (gdaki's host code writes
//! `op_own = 0xF1` in every entry), as on hardware. The event fields (`c_eqn`, `cq_period`, `cq_max_count`,
//! `cq_period_mode`, `scqe_break_moderation_en`) and `log_page_size` are taken and ignored: the emulated NIC
//! raises no completion events and needs no pages.

use std::sync::Arc;

use gdaki_shared::prm::cmd::{cqc, create_cq_in, create_cq_out, destroy_cq_in, destroy_cq_out, mbox_in, opcode};
use gdaki_shared::prm::cqe::CQE_SIZE;
use gdaki_shared::prm::dbrec::CqDbrec;

use super::super::cq::{CqInner, MAX_CQE};
use super::mailbox::Span;
use super::resources::Lookup;
use super::syndrome::{cmd_syndrome as syn, Fail};
use super::{get, put, Command, Ctx, HEADER};

/// A [`cqc`] field in CREATE_CQ's input.
const fn ctx(f: gdaki_shared::prm::cmd::Field) -> Span {
    Span::field(create_cq_in::cq_context(f))
}

/// How the CQ ring is looked up: the NIC writes it.
pub(super) const RING: Lookup = Lookup {
    unknown: syn::UMEM_UNKNOWN,
    range: syn::UMEM_RANGE,
    align: syn::UMEM_ALIGN,
    align_to: CQE_SIZE as u64,
    write: Some(syn::UMEM_ACCESS),
};

/// How a doorbell record (CQ's or QP's) is looked up: 8 bytes, 8-byte aligned.
pub(super) const DBR: Lookup =
    Lookup { unknown: syn::DBR_UMEM_UNKNOWN, range: syn::DBR_RANGE, align: syn::DBR_ALIGN, align_to: 8, write: None };

/// Bytes of a doorbell record (CQ: `set_ci`, `arm_db`; QP: receive and send counters).
pub(super) const DBR_BYTES: u64 = size_of::<CqDbrec>() as u64;

pub(super) const CREATE_CQ: Command = Command {
    opcode: opcode::CREATE_CQ,
    in_size: create_cq_in::SIZE,
    out_size: create_cq_out::SIZE,
    op_mod: false,
    head: &HEADER,
    taken: &[
        ctx(cqc::DBR_UMEM_VALID),
        ctx(cqc::CQE_SZ),
        ctx(cqc::SCQE_BREAK_MODERATION_EN),
        ctx(cqc::CQ_PERIOD_MODE),
        ctx(cqc::DBR_UMEM_ID),
        ctx(cqc::LOG_CQ_SIZE),
        ctx(cqc::UAR_PAGE),
        ctx(cqc::CQ_PERIOD),
        ctx(cqc::CQ_MAX_COUNT),
        ctx(cqc::C_EQN),
        ctx(cqc::LOG_PAGE_SIZE),
        ctx(cqc::DBR_ADDR),
        Span::field(create_cq_in::CQ_UMEM_OFFSET),
        Span::field(create_cq_in::CQ_UMEM_ID),
        Span::field(create_cq_in::CQ_UMEM_VALID),
    ],
    named: &[(create_cq_in::FIELDS, 0), (cqc::FIELDS, create_cq_in::CQ_CONTEXT)],
    named_bytes: &[],
    run: create_cq,
};

fn create_cq(c: &mut Ctx<'_>, inbox: &[u8], out: &mut [u8]) -> Result<(), Fail> {
    let cq = |f| get(inbox, create_cq_in::cq_context(f));
    if get(inbox, create_cq_in::CQ_UMEM_VALID) == 0 {
        return Err(Fail::of(syn::PAGE_LIST));
    }
    if cq(cqc::DBR_UMEM_VALID) == 0 {
        return Err(Fail::of(syn::DBR_NOT_UMEM));
    }
    if cq(cqc::CQE_SZ) != u64::from(cqc::cqe_sz::BYTES_64) {
        return Err(Fail::of(syn::CQE_SZ));
    }
    let log = cq(cqc::LOG_CQ_SIZE) as u32;
    if log > MAX_CQE.ilog2() {
        return Err(Fail::of(syn::LOG_CQ_SIZE));
    }
    let ncqe = 1u32 << log;
    let uar = cq(cqc::UAR_PAGE) as u32;
    if c.fw.uar(uar).is_none() {
        return Err(Fail::of(syn::UAR_UNKNOWN));
    }
    let (ring_id, ring_off) = (get(inbox, create_cq_in::CQ_UMEM_ID) as u32, get(inbox, create_cq_in::CQ_UMEM_OFFSET));
    let ring = c.fw.view(ring_id, ring_off, u64::from(ncqe) * CQE_SIZE as u64, RING)?;
    let dbr_id = cq(cqc::DBR_UMEM_ID) as u32;
    let dbrec = c.fw.view(dbr_id, cq(cqc::DBR_ADDR), DBR_BYTES, DBR)?;
    let cqn = c.fab.alloc_cqn().ok_or(Fail::of(syn::CQ_NUMBERS))?;
    c.fw.add_cq(cqn, Arc::new(CqInner::new(cqn, ncqe, ring, dbrec)), [ring_id, dbr_id], uar);
    put(out, create_cq_out::CQN, cqn.into());
    Ok(())
}

pub(super) const DESTROY_CQ: Command = Command {
    opcode: opcode::DESTROY_CQ,
    in_size: destroy_cq_in::SIZE,
    out_size: destroy_cq_out::SIZE,
    op_mod: false,
    head: &HEADER,
    taken: &[Span::field(destroy_cq_in::CQN)],
    named: &[(mbox_in::FIELDS, 0), (destroy_cq_in::FIELDS, 0)],
    named_bytes: &[],
    run: destroy_cq,
};

fn destroy_cq(c: &mut Ctx<'_>, inbox: &[u8], _out: &mut [u8]) -> Result<(), Fail> {
    match c.fw.remove_cq(get(inbox, destroy_cq_in::CQN) as u32) {
        Ok(true) => Ok(()),
        Ok(false) => Err(Fail::of(syn::CQN_UNKNOWN)),
        Err(()) => Err(Fail::of(syn::CQ_IN_USE)),
    }
}
