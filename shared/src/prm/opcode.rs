//! Send WQE opcodes (`MLX5_OPCODE_*` in `mlx5dv.h`), CQE opcodes (`MLX5_CQE_*`) and error syndromes
//! (`MLX5_CQE_SYNDROME_*`).

/// `MLX5_OPCODE_NOP`.
pub const NOP: u8 = 0x00;
/// `MLX5_OPCODE_RDMA_WRITE`.
pub const RDMA_WRITE: u8 = 0x08;
/// `MLX5_OPCODE_RDMA_WRITE_IMM`.
pub const RDMA_WRITE_IMM: u8 = 0x09;
/// `MLX5_OPCODE_SEND`.
pub const SEND: u8 = 0x0a;
/// `MLX5_OPCODE_SEND_IMM`.
pub const SEND_IMM: u8 = 0x0b;
/// `MLX5_OPCODE_RDMA_READ`.
pub const RDMA_READ: u8 = 0x10;
/// `MLX5_OPCODE_ATOMIC_CS` (8-byte compare-and-swap).
pub const ATOMIC_CS: u8 = 0x11;
/// `MLX5_OPCODE_ATOMIC_FA` (8-byte fetch-and-add).
pub const ATOMIC_FA: u8 = 0x12;
/// `MLX5_OPCODE_ATOMIC_MASKED_CS`.
pub const ATOMIC_MASKED_CS: u8 = 0x14;
/// `MLX5_OPCODE_ATOMIC_MASKED_FA`.
pub const ATOMIC_MASKED_FA: u8 = 0x15;

/// CQE opcodes: bits 7:4 of `mlx5_cqe64.op_own`.
pub mod cqe {
    /// `MLX5_CQE_REQ`: a send WQE completed successfully.
    pub const REQ: u8 = 0;
    /// `MLX5_CQE_RESP_WR_IMM`: an inbound RDMA WRITE with immediate.
    pub const RESP_WR_IMM: u8 = 1;
    /// `MLX5_CQE_RESP_SEND`.
    pub const RESP_SEND: u8 = 2;
    /// `MLX5_CQE_REQ_ERR`: a send WQE completed in error (`mlx5_err_cqe`).
    pub const REQ_ERR: u8 = 13;
    /// `MLX5_CQE_RESP_ERR`.
    pub const RESP_ERR: u8 = 14;
    /// `MLX5_CQE_INVALID`: the entry holds no completion (fresh rings are filled with it).
    pub const INVALID: u8 = 15;
}

/// Error CQE syndromes (`mlx5_err_cqe.syndrome`, `MLX5_CQE_SYNDROME_*`).
pub mod syndrome {
    /// `MLX5_CQE_SYNDROME_LOCAL_LENGTH_ERR`.
    pub const LOCAL_LENGTH_ERR: u8 = 0x01;
    /// `MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR`: malformed WQE (bad opcode, ds, QPN or WQE index).
    pub const LOCAL_QP_OP_ERR: u8 = 0x02;
    /// `MLX5_CQE_SYNDROME_LOCAL_PROT_ERR`: bad lkey, or local address outside the MR / without access.
    pub const LOCAL_PROT_ERR: u8 = 0x04;
    /// `MLX5_CQE_SYNDROME_WR_FLUSH_ERR`: the QP was in the error state.
    pub const WR_FLUSH_ERR: u8 = 0x05;
    /// `MLX5_CQE_SYNDROME_MW_BIND_ERR`.
    pub const MW_BIND_ERR: u8 = 0x06;
    /// `MLX5_CQE_SYNDROME_BAD_RESP_ERR`.
    pub const BAD_RESP_ERR: u8 = 0x10;
    /// `MLX5_CQE_SYNDROME_LOCAL_ACCESS_ERR`.
    pub const LOCAL_ACCESS_ERR: u8 = 0x11;
    /// `MLX5_CQE_SYNDROME_REMOTE_INVAL_REQ_ERR`: e.g. a misaligned atomic.
    pub const REMOTE_INVAL_REQ_ERR: u8 = 0x12;
    /// `MLX5_CQE_SYNDROME_REMOTE_ACCESS_ERR`: bad rkey, or remote address outside the MR / without access.
    pub const REMOTE_ACCESS_ERR: u8 = 0x13;
    /// `MLX5_CQE_SYNDROME_REMOTE_OP_ERR`.
    pub const REMOTE_OP_ERR: u8 = 0x14;
    /// `MLX5_CQE_SYNDROME_TRANSPORT_RETRY_EXC_ERR`: the peer QP did not answer within the retries (its process
    /// gone, its QP destroyed or not connected back, or the peer unreachable).
    pub const TRANSPORT_RETRY_EXC_ERR: u8 = 0x15;
    /// `MLX5_CQE_SYNDROME_RNR_RETRY_EXC_ERR`.
    pub const RNR_RETRY_EXC_ERR: u8 = 0x16;
    /// `MLX5_CQE_SYNDROME_REMOTE_ABORTED_ERR`.
    pub const REMOTE_ABORTED_ERR: u8 = 0x22;

    /// What the syndrome `s` says, in a few words for a message (the `ibv_wc_status` rdma-core's mlx5 provider
    /// maps it to, with the usual cause where one is common); `None` for a value no constant above names.
    pub const fn describe(s: u8) -> Option<&'static str> {
        Some(match s {
            LOCAL_LENGTH_ERR => "local length error",
            LOCAL_QP_OP_ERR => "local QP operation error",
            LOCAL_PROT_ERR => "local protection error (bad lkey or local range)",
            WR_FLUSH_ERR => "work request flushed (the QP is in the error state)",
            MW_BIND_ERR => "memory window bind error",
            BAD_RESP_ERR => "bad response error",
            LOCAL_ACCESS_ERR => "local access error",
            REMOTE_INVAL_REQ_ERR => "remote invalid request error",
            REMOTE_ACCESS_ERR => "remote access error (bad rkey or remote range)",
            REMOTE_OP_ERR => "remote operation error",
            TRANSPORT_RETRY_EXC_ERR => {
                "transport retry counter exceeded (no answer from the peer QP: its process gone, its QP destroyed \
                 or not connected back, or the peer unreachable)"
            }
            RNR_RETRY_EXC_ERR => "RNR retry counter exceeded",
            REMOTE_ABORTED_ERR => "remote aborted error",
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::syndrome::*;

    #[test]
    fn every_named_syndrome_has_its_own_description_and_no_other_value_has_one() {
        let named = [
            LOCAL_LENGTH_ERR,
            LOCAL_QP_OP_ERR,
            LOCAL_PROT_ERR,
            WR_FLUSH_ERR,
            MW_BIND_ERR,
            BAD_RESP_ERR,
            LOCAL_ACCESS_ERR,
            REMOTE_INVAL_REQ_ERR,
            REMOTE_ACCESS_ERR,
            REMOTE_OP_ERR,
            TRANSPORT_RETRY_EXC_ERR,
            RNR_RETRY_EXC_ERR,
            REMOTE_ABORTED_ERR,
        ];
        let mut seen: [&str; 13] = [""; 13];
        let mut n = 0;
        for s in 0..=u8::MAX {
            match describe(s) {
                Some(d) => {
                    assert!(named.contains(&s) && !seen.contains(&d), "{s:#04x}: {d}");
                    seen[n] = d;
                    n += 1;
                }
                None => assert!(!named.contains(&s), "{s:#04x} has no description"),
            }
        }
        assert_eq!(n, named.len());
        assert!(describe(REMOTE_ACCESS_ERR).unwrap().contains("rkey"));
    }
}
