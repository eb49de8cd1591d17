//! The emulated NIC as a DevX [`Transport`]: every call is [`EmuNic::devx_cmd`].

use gdaki_shared::prm::cmd::{create_cq_out, create_qp_out, destroy_cq_out, destroy_qp_out, mbox_in, opcode};

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

impl Transport for EmuNic {
    type Obj = EmuObj;

    fn obj_create(&self, inbox: &[u8], outbox: &mut [u8]) -> Result<EmuObj> {
        let op = mbox_in::OPCODE.try_get(inbox).map_or(0, |v| v as u16);
        if op != opcode::CREATE_CQ && op != opcode::CREATE_QP {
            return Err(Error::InvalidArgument(format!(
                "obj_create of {}: not a command that creates an object",
                opcode::name(op).map_or_else(|| format!("opcode {op:#x}"), str::to_string)
            )));
        }
        self.devx_cmd(inbox, outbox)?;
        // The command succeeded, so the output held its whole layout.
        Ok(match op {
            opcode::CREATE_CQ => EmuObj::Cq(create_cq_out::cqn(outbox)),
            _ => EmuObj::Qp(create_qp_out::qpn(outbox)),
        })
    }

    fn obj_modify(&self, _obj: &EmuObj, inbox: &[u8], outbox: &mut [u8]) -> Result<()> {
        self.devx_cmd(inbox, outbox)
    }

    fn obj_query(&self, _obj: &EmuObj, inbox: &[u8], outbox: &mut [u8]) -> Result<()> {
        self.devx_cmd(inbox, outbox)
    }

    fn obj_destroy(&self, obj: EmuObj) -> Result<()> {
        match obj {
            EmuObj::Cq(cqn) => self.devx_cmd(&destroy_cq_in(cqn)?, &mut [0u8; destroy_cq_out::SIZE]),
            EmuObj::Qp(qpn) => self.devx_cmd(&destroy_qp_in(qpn)?, &mut [0u8; destroy_qp_out::SIZE]),
        }
    }

    fn general_cmd(&self, inbox: &[u8], outbox: &mut [u8]) -> Result<()> {
        self.devx_cmd(inbox, outbox)
    }
}
