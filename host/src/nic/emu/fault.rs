//! Why a WQE failed: the PRM syndrome that its error CQE carries, plus an emulator-specific vendor syndrome
//! that names the exact check.

use gdaki_shared::prm::opcode::syndrome;

/// Vendor error syndromes (`mlx5_err_cqe.vendor_err_synd`) written by the emulated NIC.
///
/// These codes are the emulator's own: real ConnectX adapters use other (undocumented) values. Each names the
/// check that failed, so that a test or a log can tell "bad lkey" from "lkey of another PD".
pub mod vendor {
    /// The opcode is not one the emulated NIC executes (syndrome `LOCAL_QP_OP_ERR`).
    pub const BAD_OPCODE: u8 = 0x01;
    /// `opmod` is not zero (syndrome `LOCAL_QP_OP_ERR`).
    pub const BAD_OPMOD: u8 = 0x02;
    /// The ctrl segment's QPN is not this QP's, or a doorbell written to this QP's register that would have it
    /// take WQEs names another QPN (syndrome `LOCAL_QP_OP_ERR`; a doorbell's error CQE names the WQE at the
    /// consumer index and retires it, as [`BAD_DOORBELL`]'s does; a stale doorbell is ignored whatever it names).
    pub const BAD_QPN: u8 = 0x03;
    /// The ctrl segment's WQE index is not the index the NIC expects next (syndrome `LOCAL_QP_OP_ERR`).
    pub const BAD_WQE_INDEX: u8 = 0x04;
    /// `fm_ce_se` has reserved bits or an undefined fence mode (syndrome `LOCAL_QP_OP_ERR`).
    pub const BAD_FLAGS: u8 = 0x05;
    /// `ds` is zero, does not fit the opcode's shape, or the ring (syndrome `LOCAL_QP_OP_ERR`).
    pub const BAD_DS: u8 = 0x06;
    /// The WQE reaches past the producer index the doorbell announced (syndrome `LOCAL_QP_OP_ERR`).
    pub const PAST_DOORBELL: u8 = 0x07;
    /// An inline segment whose length does not match `ds`, or inline data where only SGEs are allowed
    /// (syndrome `LOCAL_QP_OP_ERR`).
    pub const BAD_INLINE: u8 = 0x08;
    /// The doorbell announced more WQEBBs than the ring holds (syndrome `LOCAL_QP_OP_ERR`). Its error CQE names
    /// the WQE at the consumer index and retires it, as a WQE failing there would: it gets no flush CQE later.
    pub const BAD_DOORBELL: u8 = 0x09;
    /// A BlueFlame write larger than the register's one WQEBB (the handle's `bf_size`): words past it were
    /// stored (syndrome `LOCAL_QP_OP_ERR`; the PRM defines no outcome, so the emulator fails the QP).
    pub const BLUEFLAME_TOO_LARGE: u8 = 0x0a;
    /// A BlueFlame write on a doorbell-only UAR page (the handle's `bf_size` is 0; syndrome
    /// `LOCAL_QP_OP_ERR`: the page has no BlueFlame buffer, and the emulator fails the QP rather than guess).
    pub const BLUEFLAME_NO_BUFFER: u8 = 0x0b;
    /// The message is longer than 2^31 bytes, or than the QP's `qpc.log_msg_max` allows (syndrome
    /// `LOCAL_LENGTH_ERR`).
    pub const MSG_TOO_LONG: u8 = 0x10;
    /// An atomic's local SGE is not exactly 8 bytes (syndrome `LOCAL_LENGTH_ERR`).
    pub const ATOMIC_SGE_LEN: u8 = 0x11;
    /// No MR has this lkey (syndrome `LOCAL_PROT_ERR`).
    pub const BAD_LKEY: u8 = 0x20;
    /// The lkey's MR belongs to another PD than the QP (syndrome `LOCAL_PROT_ERR`).
    pub const LKEY_PD: u8 = 0x21;
    /// The local range is outside the lkey's MR (syndrome `LOCAL_PROT_ERR`).
    pub const LOCAL_BOUNDS: u8 = 0x22;
    /// The local MR lacks `LOCAL_WRITE` for a READ or atomic result (syndrome `LOCAL_PROT_ERR`).
    pub const LOCAL_ACCESS: u8 = 0x23;
    /// No MR has this rkey (syndrome `REMOTE_ACCESS_ERR`).
    pub const BAD_RKEY: u8 = 0x30;
    /// The rkey's MR belongs to another PD than the responder QP (syndrome `REMOTE_ACCESS_ERR`).
    pub const RKEY_PD: u8 = 0x31;
    /// The remote range is outside the rkey's MR (syndrome `REMOTE_ACCESS_ERR`).
    pub const REMOTE_BOUNDS: u8 = 0x32;
    /// The remote MR lacks the right the operation needs (syndrome `REMOTE_ACCESS_ERR`).
    pub const REMOTE_ACCESS: u8 = 0x33;
    /// The responder QP does not enable the operation: its RST2INIT left `qpc.rre`, `rwe` or `rae` clear
    /// (syndrome `REMOTE_ACCESS_ERR`).
    pub const QP_ACCESS: u8 = 0x34;
    /// An atomic's remote address is not 8-byte aligned (syndrome `REMOTE_INVAL_REQ_ERR`).
    pub const ATOMIC_ALIGN: u8 = 0x40;
    /// The responder QP is gone, not connected back to this QP, or not in RTR/RTS (syndrome
    /// `TRANSPORT_RETRY_EXC_ERR`: hardware would retry until its retry count runs out).
    pub const NO_PEER: u8 = 0x50;
    /// The responder's CQ overran while it took a RESP_WR_IMM completion (syndrome `REMOTE_OP_ERR`).
    pub const RESP_CQ_OVERRUN: u8 = 0x51;
    /// A CUDA copy into or out of GPU memory failed (syndrome `LOCAL_ACCESS_ERR`).
    pub const GPU_COPY: u8 = 0x60;
    /// The QP was already in the error state (syndrome `WR_FLUSH_ERR`).
    pub const FLUSHED: u8 = 0x70;
}

/// A failed WQE: syndrome and vendor syndrome for its error CQE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Fault {
    /// `MLX5_CQE_SYNDROME_*`.
    pub syndrome: u8,
    /// One of [`vendor`].
    pub vendor: u8,
}

impl Fault {
    const fn new(syndrome: u8, vendor: u8) -> Self {
        Self { syndrome, vendor }
    }

    /// Malformed WQE: `LOCAL_QP_OP_ERR` (0x02).
    pub const fn qp_op(vendor: u8) -> Self {
        Self::new(syndrome::LOCAL_QP_OP_ERR, vendor)
    }

    /// Bad length: `LOCAL_LENGTH_ERR` (0x01).
    pub const fn length(vendor: u8) -> Self {
        Self::new(syndrome::LOCAL_LENGTH_ERR, vendor)
    }

    /// Bad lkey, local bounds or local rights: `LOCAL_PROT_ERR` (0x04).
    pub const fn local_prot(vendor: u8) -> Self {
        Self::new(syndrome::LOCAL_PROT_ERR, vendor)
    }

    /// Bad rkey, remote bounds or remote rights: `REMOTE_ACCESS_ERR` (0x13).
    pub const fn remote_access(vendor: u8) -> Self {
        Self::new(syndrome::REMOTE_ACCESS_ERR, vendor)
    }

    /// Invalid request at the responder (misaligned atomic): `REMOTE_INVAL_REQ_ERR` (0x12).
    pub const fn remote_inval(vendor: u8) -> Self {
        Self::new(syndrome::REMOTE_INVAL_REQ_ERR, vendor)
    }

    /// The responder failed the operation: `REMOTE_OP_ERR` (0x14).
    pub const fn remote_op(vendor: u8) -> Self {
        Self::new(syndrome::REMOTE_OP_ERR, vendor)
    }

    /// No responder answered: `TRANSPORT_RETRY_EXC_ERR` (0x15).
    pub const fn retry_exceeded() -> Self {
        Self::new(syndrome::TRANSPORT_RETRY_EXC_ERR, vendor::NO_PEER)
    }

    /// A GPU copy failed: `LOCAL_ACCESS_ERR` (0x11).
    pub const fn gpu_copy() -> Self {
        Self::new(syndrome::LOCAL_ACCESS_ERR, vendor::GPU_COPY)
    }

    /// The QP is in the error state: `WR_FLUSH_ERR` (0x05).
    pub const fn flushed() -> Self {
        Self::new(syndrome::WR_FLUSH_ERR, vendor::FLUSHED)
    }
}
