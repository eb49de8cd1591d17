//! DevX: the mlx5 firmware commands that create, connect, query and destroy RC QPs and their CQs, built from
//! typed attributes into the PRM's mailboxes (`gdaki_shared::prm::cmd`) and sent through a [`Transport`].
//!
//! A DevX user of a ConnectX builds these mailboxes and hands them to rdma-core (`mlx5dv_devx_obj_create`,
//! `_modify`, `_query`, `_destroy`, `mlx5dv_devx_general_cmd`), which passes them to the firmware; the
//! emulated NIC takes the same mailboxes ([`EmuNic::devx_cmd`]). Both run these builders: the emulated NIC's
//! own [`EmuNic::create_cq`], [`EmuNic::create_qp`] and [`Qp::connect`](crate::nic::emu::Qp::connect) are made
//! of them, so every test of the emulated NIC runs them.
//!
//! | step | builder | runner |
//! |---|---|---|
//! | CQ | [`create_cq_in()`], [`destroy_cq_in()`] | [`create_cq()`] |
//! | QP | [`create_qp_in()`], [`destroy_qp_in()`] | [`create_qp()`] |
//! | RST → INIT → RTR → RTS | [`rst2init_in()`], [`init2rtr_in()`], [`rtr2rts_in()`] | [`rst2init()`], [`init2rtr()`], [`rtr2rts()`] |
//! | any → ERR | [`qp_2err_in()`] | [`to_err()`]; [`to_err_on_failure()`] after a failed transition |
//! | state and attributes | [`query_qp_in()`] | [`query_qp()`] |
//! | capabilities | [`query_hca_cap_in()`] | [`query_hca_cap()`] |
//!
//! The transports: the emulated NIC (`impl Transport for EmuNic`, in every build), and with the `mlx5`
//! feature a ConnectX context opened with `mlx5dv_open_device(MLX5DV_CONTEXT_FLAGS_DEVX)`
//! (`gdaki::nic::mlx5::DevxContext`, from `Mlx5Nic::devx`), whose calls are the five `mlx5dv_devx_*` calls and
//! whose failures carry the output mailbox's status and syndrome with the call and errno
//! ([`Error::DevxCmd`]'s `via`). The mlx5 backend's DevX path makes its CQs and QPs with these same builders.
//!
//! [`EmuNic::devx_cmd`]: crate::nic::emu::EmuNic::devx_cmd
//! [`EmuNic::create_cq`]: crate::nic::emu::EmuNic::create_cq
//! [`EmuNic::create_qp`]: crate::nic::emu::EmuNic::create_qp

mod cq;
mod emu;
mod qp;

use gdaki_shared::prm::cmd::{cmd_hca_cap, mbox_in, opcode, query_hca_cap_in, query_hca_cap_out, Field};

use crate::{Error, Result};

pub use cq::{create_cq, create_cq_in, destroy_cq_in, CqAttr};
pub use emu::EmuObj;
pub use qp::{
    create_qp, create_qp_in, destroy_qp_in, init2rtr, init2rtr_in, qp_2err_in, query_qp, query_qp_in, rst2init,
    rst2init_in, rtr2rts, rtr2rts_in, to_err, to_err_on_failure, AddressPath, Grh, Init2Rtr, QpAttr, QpQuery, Rq,
    Rst2Init, Rtr2Rts,
};

/// Where firmware commands go: the calls of rdma-core's DevX API, over the mailboxes of
/// `gdaki_shared::prm::cmd` (inputs built by this module, outputs of the command's output size).
///
/// Every call fails with [`Error::DevxCmd`] when the command's output says so (its status and syndrome), or
/// with the transport's own error when the command could not be sent.
pub trait Transport {
    /// A firmware object the transport created (a CQ, a QP), as `struct mlx5dv_devx_obj` is: what
    /// [`Transport::obj_destroy`] destroys.
    type Obj;

    /// `mlx5dv_devx_obj_create`: runs a creating command (CREATE_CQ, CREATE_QP) and returns the object.
    ///
    /// # Errors
    /// [`Error::DevxCmd`], or the transport's error.
    fn obj_create(&self, inbox: &[u8], outbox: &mut [u8]) -> Result<Self::Obj>;

    /// `mlx5dv_devx_obj_modify`: runs a command that changes `obj` (the QP state transitions).
    ///
    /// # Errors
    /// [`Error::DevxCmd`], or the transport's error.
    fn obj_modify(&self, obj: &Self::Obj, inbox: &[u8], outbox: &mut [u8]) -> Result<()>;

    /// `mlx5dv_devx_obj_query`: runs a command that reads `obj` (QUERY_QP).
    ///
    /// # Errors
    /// [`Error::DevxCmd`], or the transport's error.
    fn obj_query(&self, obj: &Self::Obj, inbox: &[u8], outbox: &mut [u8]) -> Result<()>;

    /// `mlx5dv_devx_obj_destroy`: destroys `obj` with the destroying command of its kind (DESTROY_CQ,
    /// DESTROY_QP; rdma-core's kernel side builds it from the creating command).
    ///
    /// # Errors
    /// [`Error::DevxCmd`] (e.g. a CQ that a QP still uses: `RES_BUSY`), or the transport's error.
    fn obj_destroy(&self, obj: Self::Obj) -> Result<()>;

    /// `mlx5dv_devx_general_cmd`: runs a command that belongs to no object (QUERY_HCA_CAP).
    ///
    /// # Errors
    /// [`Error::DevxCmd`], or the transport's error.
    fn general_cmd(&self, inbox: &[u8], outbox: &mut [u8]) -> Result<()>;
}

/// An object a creating command made: the transport's object and its number (`cqn`, `qpn`).
#[derive(Debug)]
pub struct Created<O> {
    /// The transport's object (what destroys it).
    pub obj: O,
    /// The CQ or QP number from the command's output.
    pub id: u32,
}

/// Stores `v` into field `f` (named `name`, as mlx5_ifc.h names it) of command `op`'s input.
///
/// # Errors
/// [`Error::InvalidArgument`] naming the command, the field and the value when `v` does not fit the field.
fn set(inbox: &mut [u8], op: u16, name: &str, f: Field, v: u64) -> Result<()> {
    f.set(inbox, v)
        .map_err(|e| Error::InvalidArgument(format!("{} {name} = {v:#x}: {e}", opcode::name(op).unwrap_or("command"))))
}

/// A zeroed input of `N` bytes for command `op` with its header (`op_mod` 0).
fn start<const N: usize>(op: u16) -> [u8; N] {
    let mut inbox = [0u8; N];
    // Every input is longer than the header's 8 bytes, so this cannot fail.
    let _ = mbox_in::start(&mut inbox, op, 0, 0);
    inbox
}

/// QUERY_HCA_CAP's input for the general capabilities (`cmd_hca_cap`), the current values.
pub fn query_hca_cap_in() -> [u8; query_hca_cap_in::SIZE] {
    let mut inbox = start::<{ query_hca_cap_in::SIZE }>(opcode::QUERY_HCA_CAP);
    let m = query_hca_cap_in::op_mod(query_hca_cap_in::CAP_GENERAL, query_hca_cap_in::GET_CUR);
    let _ = query_hca_cap_in::OP_MOD.set(&mut inbox, m.into());
    inbox
}

/// The general capabilities (`mlx5_ifc_cmd_hca_cap_bits`) QUERY_HCA_CAP returned: read a field with
/// [`HcaCap::get`] (e.g. `cmd_hca_cap::LOG_MAX_QP_SZ`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HcaCap {
    page: Vec<u8>,
}

impl HcaCap {
    /// Field `f` of `cmd_hca_cap` (a constant of `gdaki_shared::prm::cmd::cmd_hca_cap`).
    pub fn get(&self, f: Field) -> u64 {
        f.try_get(&self.page).unwrap_or(0)
    }
}

/// Runs QUERY_HCA_CAP for the general capabilities.
///
/// # Errors
/// The transport's ([`Error::DevxCmd`] when the command fails).
pub fn query_hca_cap<T: Transport>(t: &T) -> Result<HcaCap> {
    let mut out = vec![0u8; query_hca_cap_out::SIZE];
    t.general_cmd(&query_hca_cap_in(), &mut out)?;
    let at = query_hca_cap_out::CAPABILITY as usize / 8;
    Ok(HcaCap { page: out[at..at + cmd_hca_cap::SIZE].to_vec() })
}
