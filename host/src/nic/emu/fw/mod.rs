//! The emulated NIC's firmware: the PRM commands a DevX user sends to create, connect, query and destroy RC
//! QPs and their CQs (`mlx5dv_devx_obj_create`, `_modify`, `_query`, `_destroy`, `mlx5dv_devx_general_cmd`),
//! taken as the same input mailboxes and answered with the same output mailboxes, through
//! [`EmuNic::devx_cmd`].
//!
//! | opcode | module | what it does |
//! |---|---|---|
//! | QUERY_HCA_CAP (0x100) | `hca_cap` | the general capabilities: the emulator's limits |
//! | CREATE_CQ (0x400), DESTROY_CQ (0x401) | `cq` | a CQ over a ring and a doorbell record in umems |
//! | CREATE_QP (0x500), QUERY_QP (0x50b), DESTROY_QP (0x501) | `qp` | an RC QP over a work queue and a doorbell record in umems, a UAR page, CQs and a PD |
//! | RST2INIT (0x502), INIT2RTR (0x503), RTR2RTS (0x504), 2ERR (0x507) | `modify` | the QP state machine |
//!
//! Every command is checked before it changes anything, in this order: the input's and output's lengths
//! (`BAD_INP_LEN`, `BAD_OUTP_LEN`), the opcode (`BAD_OP`), `op_mod`, that no bit is set outside the fields the
//! command takes (`mailbox`), then the command's own checks (sizes, umems, UAR page, CQs, PD, state). A failed
//! command writes its status and a syndrome of [`cmd_syndrome`] into the output and leaves the NIC as it was.
//! What DevX gets from the kernel instead (umems, UAR pages, PDs) is in `resources`.

mod cq;
mod hca_cap;
mod mailbox;
mod modify;
mod qp;
pub(super) mod resources;
mod syndrome;

use gdaki_shared::prm::cmd::{mbox_in, mbox_out, opcode, status};

use crate::{Error, Result};

use super::fabric::Fabric;
use super::guard::lock;
use super::EmuNic;
use mailbox::{Named, Span};
use resources::Firmware;

pub(crate) use modify::reach;
pub use resources::{DevxUar, UmemBuf};
pub use syndrome::cmd_syndrome;
use syndrome::{cmd_syndrome as syn, Fail};

/// One command the firmware executes.
struct Command {
    opcode: u16,
    /// Bytes of its input (without a page list) and output.
    in_size: usize,
    out_size: usize,
    /// Whether `op_mod` may be other than 0 (the command checks it itself).
    op_mod: bool,
    /// The header fields it takes ([`HEADER`], [`QUERY_HEADER`] or a command group's own).
    head: &'static [Span],
    /// The other fields it takes, at their place in the input.
    taken: &'static [Span],
    /// Its layouts' named fields, for telling a field it does not take from a reserved bit.
    named: &'static [Named],
    named_bytes: &'static [Span],
    /// Executes it.
    run: Exec,
}

/// A command's execution: its input checked as [`run`] checks it (of the command's size), its output zeroed
/// and of the command's output size.
type Exec = fn(&mut Ctx<'_>, &[u8], &mut [u8]) -> Result<(), Fail>;

/// What a command runs against: the NIC and its firmware state (locked for the whole command).
struct Ctx<'a> {
    nic: &'a EmuNic,
    fab: &'a Fabric,
    fw: &'a mut Firmware,
    /// What the command does once the firmware lock is released, before it returns: DESTROY_QP's wait for the
    /// executor, so that the wait holds up no other command.
    unlocked: Option<Unlocked>,
}

/// The rest of a command, run without the firmware lock.
type Unlocked = Box<dyn FnOnce(&EmuNic)>;

/// Every command, by opcode.
const COMMANDS: &[&Command] = &[
    &hca_cap::QUERY_HCA_CAP,
    &cq::CREATE_CQ,
    &cq::DESTROY_CQ,
    &qp::CREATE_QP,
    &qp::DESTROY_QP,
    &qp::QUERY_QP,
    &modify::RST2INIT,
    &modify::INIT2RTR,
    &modify::RTR2RTS,
    &modify::QP_2ERR,
];

impl EmuNic {
    /// Executes the firmware command in `inbox` and writes its answer into `outbox`, as ConnectX firmware
    /// answers a DevX command (`mlx5dv_devx_obj_create(ctx, in, inlen, out, outlen)` and its `_modify`,
    /// `_query`, `mlx5dv_devx_general_cmd`): the layouts of `gdaki_shared::prm::cmd`, big-endian.
    ///
    /// The output's `status` and `syndrome` say how it went (when `outbox` holds at least their 8 bytes);
    /// on success it carries the command's results (`cqn`, `qpn`, QUERY_QP's `qpc` with its `state`,
    /// QUERY_HCA_CAP's capability page). A command that fails changes nothing.
    ///
    /// # Errors
    /// [`Error::DevxCmd`] for a command that did not succeed: its opcode, the status, the syndrome (one of
    /// [`cmd_syndrome`]) and what the syndrome means.
    pub fn devx_cmd(&self, inbox: &[u8], outbox: &mut [u8]) -> Result<()> {
        let opcode = mbox_in::OPCODE.try_get(inbox).map_or(0, |v| v as u16);
        let r = run(self, inbox, outbox);
        let fail = r.err();
        let (st, syndrome) = fail.map_or((status::OK, 0), |f| (f.status, f.syndrome));
        if fail.is_some() {
            if let Some(head) = outbox.get_mut(..mbox_out::SIZE.min(outbox.len())) {
                head.fill(0);
            }
        }
        // Both fit when the output holds 8 bytes; a shorter one gets nothing, as nothing fits.
        let _ = mbox_out::STATUS.set(outbox, st.into());
        let _ = mbox_out::SYNDROME.set(outbox, syndrome.into());
        match fail {
            None => Ok(()),
            Some(f) => {
                tracing::debug!(
                    opcode,
                    status = f.status,
                    syndrome = f.syndrome,
                    "emulated NIC: {} failed: {}",
                    opcode::name(opcode).unwrap_or("command"),
                    syn::describe(f.syndrome).unwrap_or("")
                );
                Err(Error::DevxCmd {
                    opcode,
                    status: f.status,
                    syndrome: f.syndrome,
                    detail: syn::describe(f.syndrome),
                    via: None,
                })
            }
        }
    }
}

/// Checks and executes one command.
fn run(nic: &EmuNic, inbox: &[u8], outbox: &mut [u8]) -> Result<(), Fail> {
    if inbox.len() < mbox_in::SIZE {
        return Err(Fail::of(syn::SHORT_INBOX));
    }
    let op = mbox_in::OPCODE.get(inbox) as u16;
    let cmd = COMMANDS.iter().find(|c| c.opcode == op).ok_or(Fail::of(syn::BAD_OPCODE))?;
    if inbox.len() < cmd.in_size {
        return Err(Fail::of(syn::SHORT_INBOX));
    }
    let out = outbox.get_mut(..cmd.out_size).ok_or(Fail::of(syn::SHORT_OUTBOX))?;
    if !cmd.op_mod && mbox_in::OP_MOD.get(inbox) != 0 {
        return Err(Fail::of(syn::BAD_OP_MOD));
    }
    mailbox::check_bits(inbox, cmd.in_size, &[cmd.head, cmd.taken], cmd.named, cmd.named_bytes)?;
    out.fill(0);
    let fab = &*nic.fab;
    let mut fw = lock(&fab.fw);
    let mut c = Ctx { nic, fab, fw: &mut fw, unlocked: None };
    let r = (cmd.run)(&mut c, &inbox[..cmd.in_size], out);
    let unlocked = c.unlocked.take();
    drop(fw);
    if let Some(rest) = unlocked {
        rest(nic);
    }
    r
}

/// A field's value in a checked input (the input is at least the command's size, which holds the field).
fn get(inbox: &[u8], f: gdaki_shared::prm::cmd::Field) -> u64 {
    f.try_get(inbox).unwrap_or(0)
}

/// Stores a result into a zeroed output of the command's size (which holds the field, and the value fits).
fn put(out: &mut [u8], f: gdaki_shared::prm::cmd::Field, v: u64) {
    let r = f.set(out, v);
    debug_assert!(r.is_ok(), "output field {f:?} := {v:#x}: {r:?}");
}

/// The header fields most commands take: `opcode`, `uid` (the kernel fills it in for DevX commands; the
/// emulated NIC ignores it) and `op_mod`.
const HEADER: [Span; 3] = [Span::field(mbox_in::OPCODE), Span::field(mbox_in::UID), Span::field(mbox_in::OP_MOD)];

/// The header fields of the query commands, whose inputs have no `uid`: `opcode` and `op_mod`.
const QUERY_HEADER: [Span; 2] = [Span::field(mbox_in::OPCODE), Span::field(mbox_in::OP_MOD)];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_opcode_is_once_in_the_table_and_named() {
        for (i, c) in COMMANDS.iter().enumerate() {
            assert!(COMMANDS[i + 1..].iter().all(|d| d.opcode != c.opcode), "{:#x} twice", c.opcode);
            assert!(opcode::name(c.opcode).is_some(), "{:#x} has no name", c.opcode);
            assert!(c.in_size >= mbox_in::SIZE && c.out_size >= mbox_out::SIZE);
        }
    }
}
