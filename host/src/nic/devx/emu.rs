//! The emulated NIC as a DevX [`Transport`]: every call is [`EmuNic::devx_cmd`], after the checks the kernel
//! makes before a DevX command reaches the firmware: `obj_create` takes only a creating command,
//! `obj_modify` and `obj_query` only a command that modifies or queries the object they are given (its kind
//! and its number, as the kernel checks a DevX object's type and id), and `general_cmd` no command that
//! belongs to an object. A call that fails these checks is refused with [`Error::InvalidArgument`] (the
//! kernel's `EINVAL`) and changes nothing.

use gdaki_shared::prm::cmd::{
    create_cq_out, create_qp_out, destroy_cq_in as destroy_cq_layout, destroy_cq_out,
    destroy_qp_in as destroy_qp_layout, destroy_qp_out, mbox_in, opcode, qp_2err_in, query_qp_in, rst2init_qp_in,
    Field,
};

use super::{destroy_cq_in, destroy_qp_in, Transport};
use crate::nic::emu::EmuNic;
use crate::{Error, Result};

/// An object the emulated NIC's firmware made: what DESTROY_CQ or DESTROY_QP destroys.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EmuObj {
    /// CQ `cqn`.
    Cq(u32),
    /// QP `qpn`.
    Qp(u32),
}

// Every command on a QP names it in the same field (`qpn`, bits 0x48..0x60), and DESTROY_CQ its CQ there too.
const _: () = assert!(
    rst2init_qp_in::QPN.off() == qp_2err_in::QPN.off()
        && rst2init_qp_in::QPN.off() == query_qp_in::QPN.off()
        && rst2init_qp_in::QPN.off() == destroy_qp_layout::QPN.off()
        && rst2init_qp_in::QPN.off() == destroy_cq_layout::CQN.off()
);

/// The field that names the object of an object's command.
const OBJ_ID: Field = rst2init_qp_in::QPN;

/// The commands `mlx5dv_devx_obj_modify` runs on a QP.
const QP_MODIFY: [u16; 4] = [opcode::RST2INIT_QP, opcode::INIT2RTR_QP, opcode::RTR2RTS_QP, opcode::QP_2ERR];

/// Commands that belong to an object (create, destroy, modify, query it), which `mlx5dv_devx_general_cmd`
/// does not run.
const OBJECT_COMMANDS: [u16; 9] = [
    opcode::CREATE_CQ,
    opcode::DESTROY_CQ,
    opcode::CREATE_QP,
    opcode::DESTROY_QP,
    opcode::RST2INIT_QP,
    opcode::INIT2RTR_QP,
    opcode::RTR2RTS_QP,
    opcode::QP_2ERR,
    opcode::QUERY_QP,
];

/// The opcode of `inbox` (0 when it has no 2 bytes).
fn op_of(inbox: &[u8]) -> u16 {
    mbox_in::OPCODE.try_get(inbox).map_or(0, |v| v as u16)
}

/// "CREATE_QP" or "opcode 0x123".
fn op_name(op: u16) -> String {
    opcode::name(op).map_or_else(|| format!("opcode {op:#x}"), str::to_string)
}

/// Checks that `inbox` is one of `ops` and names QP `obj`, as the kernel checks a command given with a DevX
/// object (`call`).
fn check_qp_cmd(call: &str, obj: &EmuObj, inbox: &[u8], ops: &[u16]) -> Result<()> {
    let op = op_of(inbox);
    if inbox.len() < mbox_in::SIZE || !ops.contains(&op) {
        return Err(Error::InvalidArgument(format!("{call} of {} on {obj:?}: not a command {call} runs", op_name(op))));
    }
    // The input holds the 16-byte header, so the field is there.
    let named = OBJ_ID.try_get(inbox).unwrap_or(0) as u32;
    match *obj {
        EmuObj::Qp(qpn) if qpn == named => Ok(()),
        _ => Err(Error::InvalidArgument(format!(
            "{call} of {} for QP {named:#x} on {obj:?}: the command names another object",
            op_name(op)
        ))),
    }
}

impl Transport for EmuNic {
    type Obj = EmuObj;

    fn obj_create(&self, inbox: &[u8], outbox: &mut [u8]) -> Result<EmuObj> {
        let op = op_of(inbox);
        if op != opcode::CREATE_CQ && op != opcode::CREATE_QP {
            return Err(Error::InvalidArgument(format!(
                "obj_create of {}: not a command that creates an object",
                op_name(op)
            )));
        }
        self.devx_cmd(inbox, outbox)?;
        // The command succeeded, so the output held its whole layout.
        Ok(match op {
            opcode::CREATE_CQ => EmuObj::Cq(create_cq_out::cqn(outbox)),
            _ => EmuObj::Qp(create_qp_out::qpn(outbox)),
        })
    }

    fn obj_modify(&self, obj: &EmuObj, inbox: &[u8], outbox: &mut [u8]) -> Result<()> {
        check_qp_cmd("obj_modify", obj, inbox, &QP_MODIFY)?;
        self.devx_cmd(inbox, outbox)
    }

    fn obj_query(&self, obj: &EmuObj, inbox: &[u8], outbox: &mut [u8]) -> Result<()> {
        check_qp_cmd("obj_query", obj, inbox, &[opcode::QUERY_QP])?;
        self.devx_cmd(inbox, outbox)
    }

    fn obj_destroy(&self, obj: EmuObj) -> Result<()> {
        match obj {
            EmuObj::Cq(cqn) => self.devx_cmd(&destroy_cq_in(cqn)?, &mut [0u8; destroy_cq_out::SIZE]),
            EmuObj::Qp(qpn) => self.devx_cmd(&destroy_qp_in(qpn)?, &mut [0u8; destroy_qp_out::SIZE]),
        }
    }

    fn general_cmd(&self, inbox: &[u8], outbox: &mut [u8]) -> Result<()> {
        let op = op_of(inbox);
        if OBJECT_COMMANDS.contains(&op) {
            return Err(Error::InvalidArgument(format!(
                "general_cmd of {}: a command of an object (obj_create, obj_modify, obj_query, obj_destroy run it)",
                op_name(op)
            )));
        }
        self.devx_cmd(inbox, outbox)
    }
}
