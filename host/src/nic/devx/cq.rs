//! CREATE_CQ and DESTROY_CQ.

use gdaki_shared::prm::cmd::{cqc, create_cq_in, create_cq_out, destroy_cq_in, opcode};

use super::{set, start, Created, Transport};
use crate::Result;

/// What CREATE_CQ creates: a CQ of `2^log_cq_size` 64-byte CQEs whose ring and doorbell record are in umems.
/// Software fills the ring before (every entry's `op_own` with opcode INVALID, 0xF0 or 0xF1), as rdma-core's
/// provider does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CqAttr {
    /// `cqc.log_cq_size`: log2 of the CQEs in the ring.
    pub log_cq_size: u8,
    /// `cqc.uar_page`: the UAR page whose doorbell arms the CQ (`mlx5dv_devx_uar.page_id`).
    pub uar_page: u32,
    /// `cqc.c_eqn`: the EQ of the CQ's completion events (`mlx5dv_devx_query_eqn`; 0 where none are used).
    pub c_eqn: u8,
    /// `cq_umem_id`: the umem holding the ring.
    pub umem_id: u32,
    /// `cq_umem_offset`: the ring's byte offset in it.
    pub umem_offset: u64,
    /// `cqc.dbr_umem_id`: the umem holding the 8-byte doorbell record.
    pub dbr_umem_id: u32,
    /// `cqc.dbr_addr`: the doorbell record's byte offset in its umem (8-byte aligned).
    pub dbr_offset: u64,
}

/// CREATE_CQ's input: `cq_umem_valid` and `cqc.dbr_umem_valid` set, 64-byte CQEs (`cqe_sz` 0), no
/// moderation.
///
/// # Errors
/// [`Error::InvalidArgument`](crate::Error::InvalidArgument) naming the field whose value does not fit it.
pub fn create_cq_in(a: &CqAttr) -> Result<[u8; create_cq_in::SIZE]> {
    let op = opcode::CREATE_CQ;
    let mut b = start(op);
    let ctx = create_cq_in::cq_context;
    set(&mut b, op, "cq_umem_valid", create_cq_in::CQ_UMEM_VALID, 1)?;
    set(&mut b, op, "cq_umem_id", create_cq_in::CQ_UMEM_ID, a.umem_id.into())?;
    set(&mut b, op, "cq_umem_offset", create_cq_in::CQ_UMEM_OFFSET, a.umem_offset)?;
    set(&mut b, op, "cqc.log_cq_size", ctx(cqc::LOG_CQ_SIZE), a.log_cq_size.into())?;
    set(&mut b, op, "cqc.uar_page", ctx(cqc::UAR_PAGE), a.uar_page.into())?;
    set(&mut b, op, "cqc.c_eqn", ctx(cqc::C_EQN), a.c_eqn.into())?;
    set(&mut b, op, "cqc.cqe_sz", ctx(cqc::CQE_SZ), cqc::cqe_sz::BYTES_64.into())?;
    set(&mut b, op, "cqc.dbr_umem_valid", ctx(cqc::DBR_UMEM_VALID), 1)?;
    set(&mut b, op, "cqc.dbr_umem_id", ctx(cqc::DBR_UMEM_ID), a.dbr_umem_id.into())?;
    set(&mut b, op, "cqc.dbr_addr", ctx(cqc::DBR_ADDR), a.dbr_offset)?;
    Ok(b)
}

/// Creates the CQ `a` describes; its number is [`Created::id`] (`create_cq_out.cqn`).
///
/// # Errors
/// As [`create_cq_in()`]; the transport's ([`Error::DevxCmd`](crate::Error::DevxCmd) when the command fails).
pub fn create_cq<T: Transport>(t: &T, a: &CqAttr) -> Result<Created<T::Obj>> {
    let mut out = [0u8; create_cq_out::SIZE];
    let obj = t.obj_create(&create_cq_in(a)?, &mut out)?;
    Ok(Created { obj, id: create_cq_out::cqn(&out) })
}

/// DESTROY_CQ's input for CQ `cqn`.
///
/// # Errors
/// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for a CQN over 24 bits.
pub fn destroy_cq_in(cqn: u32) -> Result<[u8; destroy_cq_in::SIZE]> {
    let op = opcode::DESTROY_CQ;
    let mut b = start(op);
    set(&mut b, op, "cqn", destroy_cq_in::CQN, cqn.into())?;
    Ok(b)
}
