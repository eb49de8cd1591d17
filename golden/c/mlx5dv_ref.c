/*
 * Reference values from the system's rdma-core header <infiniband/mlx5dv.h>, for gdaki's golden tests.
 *
 * The Rust side (gdaki-golden) compares gdaki-shared's layouts, constants and builders against what this file
 * reads out of the header. Everything here is taken from the header at compile time (sizeof, offsetof, the
 * MLX5_* enumerators) or computed by calling the header's own inline helpers, so that a wrong value in
 * gdaki-shared cannot be hidden by the same mistake being made twice.
 *
 * Items that some rdma-core releases lack (e.g. mlx5_err_cqe.hw_err_synd, MLX5_BF_OFFSET) are included only
 * when build.rs's probe found them and defined the matching GOLDEN_HAVE_* macro; a missing item is simply
 * absent from the tables, and the Rust test says so instead of failing.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <infiniband/mlx5dv.h>

/* One struct: its size and alignment in bytes. Layout must match `golden_struct` in src/lib.rs. */
struct golden_struct {
	const char *name;
	uint32_t size;
	uint32_t align;
};

/* One field of a struct: its offset and size in bytes. Layout must match `golden_field` in src/lib.rs. */
struct golden_field {
	const char *strukt;
	const char *field;
	uint32_t offset;
	uint32_t size;
};

/* One MLX5_* constant. int64_t holds every enumerator the header defines, including 0x80000000. */
struct golden_const {
	const char *name;
	int64_t value;
};

#define STRUCT(T) { #T, (uint32_t)sizeof(struct T), (uint32_t)_Alignof(struct T) }
#define FIELD(T, f) { #T, #f, (uint32_t)offsetof(struct T, f), (uint32_t)sizeof(((struct T *)0)->f) }
#define CONST(c) { #c, (int64_t)(c) }

static const struct golden_struct structs[] = {
	STRUCT(mlx5_wqe_ctrl_seg),
	STRUCT(mlx5_wqe_raddr_seg),
	STRUCT(mlx5_wqe_data_seg),
	STRUCT(mlx5_wqe_inl_data_seg),
	STRUCT(mlx5_wqe_atomic_seg),
	STRUCT(mlx5_cqe64),
	STRUCT(mlx5_err_cqe),
};

static const struct golden_field fields[] = {
	FIELD(mlx5_wqe_ctrl_seg, opmod_idx_opcode),
	FIELD(mlx5_wqe_ctrl_seg, qpn_ds),
	FIELD(mlx5_wqe_ctrl_seg, signature),
	FIELD(mlx5_wqe_ctrl_seg, dci_stream_channel_id),
	FIELD(mlx5_wqe_ctrl_seg, fm_ce_se),
	FIELD(mlx5_wqe_ctrl_seg, imm),

	FIELD(mlx5_wqe_raddr_seg, raddr),
	FIELD(mlx5_wqe_raddr_seg, rkey),
	FIELD(mlx5_wqe_raddr_seg, reserved),

	FIELD(mlx5_wqe_data_seg, byte_count),
	FIELD(mlx5_wqe_data_seg, lkey),
	FIELD(mlx5_wqe_data_seg, addr),

	FIELD(mlx5_wqe_inl_data_seg, byte_count),

	FIELD(mlx5_wqe_atomic_seg, swap_add),
	FIELD(mlx5_wqe_atomic_seg, compare),

	/*
	 * Bytes 0..32 of mlx5_cqe64 are an anonymous union (RX offload fields, tag matching) whose member
	 * names differ between releases; their extent is pinned by srqn_uidx sitting at 32.
	 */
	FIELD(mlx5_cqe64, srqn_uidx),
	FIELD(mlx5_cqe64, imm_inval_pkey),
	FIELD(mlx5_cqe64, app),
	FIELD(mlx5_cqe64, app_op),
	FIELD(mlx5_cqe64, app_info),
	FIELD(mlx5_cqe64, byte_cnt),
	FIELD(mlx5_cqe64, timestamp),
	FIELD(mlx5_cqe64, sop_drop_qpn),
	FIELD(mlx5_cqe64, wqe_counter),
	FIELD(mlx5_cqe64, signature),
	FIELD(mlx5_cqe64, op_own),

	FIELD(mlx5_err_cqe, rsvd0),
	FIELD(mlx5_err_cqe, srqn),
	/* 16 bytes when the header names hw_err_synd/hw_synd_type, 18 when it folds them into the reserve. */
	FIELD(mlx5_err_cqe, rsvd1),
#ifdef GOLDEN_HAVE_ERR_CQE_HW_ERR_SYND
	FIELD(mlx5_err_cqe, hw_err_synd),
#endif
#ifdef GOLDEN_HAVE_ERR_CQE_HW_SYND_TYPE
	FIELD(mlx5_err_cqe, hw_synd_type),
#endif
	FIELD(mlx5_err_cqe, vendor_err_synd),
	FIELD(mlx5_err_cqe, syndrome),
	FIELD(mlx5_err_cqe, s_wqe_opcode_qpn),
	FIELD(mlx5_err_cqe, wqe_counter),
	FIELD(mlx5_err_cqe, signature),
	FIELD(mlx5_err_cqe, op_own),
};

static const struct golden_const consts[] = {
	/* Send WQE opcodes. */
	CONST(MLX5_OPCODE_NOP),
	CONST(MLX5_OPCODE_RDMA_WRITE),
	CONST(MLX5_OPCODE_RDMA_WRITE_IMM),
	CONST(MLX5_OPCODE_SEND),
	CONST(MLX5_OPCODE_SEND_IMM),
	CONST(MLX5_OPCODE_RDMA_READ),
	CONST(MLX5_OPCODE_ATOMIC_CS),
	CONST(MLX5_OPCODE_ATOMIC_FA),
	CONST(MLX5_OPCODE_ATOMIC_MASKED_CS),
	CONST(MLX5_OPCODE_ATOMIC_MASKED_FA),

	/* CQE opcodes (op_own bits 7:4) and the owner mask (bit 0). */
	CONST(MLX5_CQE_REQ),
	CONST(MLX5_CQE_RESP_WR_IMM),
	CONST(MLX5_CQE_RESP_SEND),
	CONST(MLX5_CQE_REQ_ERR),
	CONST(MLX5_CQE_RESP_ERR),
	CONST(MLX5_CQE_INVALID),
	CONST(MLX5_CQE_OWNER_MASK),

	/* Error CQE syndromes. */
	CONST(MLX5_CQE_SYNDROME_LOCAL_LENGTH_ERR),
	CONST(MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR),
	CONST(MLX5_CQE_SYNDROME_LOCAL_PROT_ERR),
	CONST(MLX5_CQE_SYNDROME_WR_FLUSH_ERR),
	CONST(MLX5_CQE_SYNDROME_MW_BIND_ERR),
	CONST(MLX5_CQE_SYNDROME_BAD_RESP_ERR),
	CONST(MLX5_CQE_SYNDROME_LOCAL_ACCESS_ERR),
	CONST(MLX5_CQE_SYNDROME_REMOTE_INVAL_REQ_ERR),
	CONST(MLX5_CQE_SYNDROME_REMOTE_ACCESS_ERR),
	CONST(MLX5_CQE_SYNDROME_REMOTE_OP_ERR),
	CONST(MLX5_CQE_SYNDROME_TRANSPORT_RETRY_EXC_ERR),
	CONST(MLX5_CQE_SYNDROME_RNR_RETRY_EXC_ERR),
	CONST(MLX5_CQE_SYNDROME_REMOTE_ABORTED_ERR),

	/* Doorbell record words. */
	CONST(MLX5_RCV_DBR),
	CONST(MLX5_SND_DBR),
#ifdef GOLDEN_HAVE_CQ_SET_CI
	CONST(MLX5_CQ_SET_CI),
#endif
#ifdef GOLDEN_HAVE_CQ_ARM_DB
	CONST(MLX5_CQ_ARM_DB),
#endif

	/* ctrl segment fm_ce_se bits. */
	CONST(MLX5_WQE_CTRL_CQ_UPDATE),
	CONST(MLX5_WQE_CTRL_SOLICITED),
	CONST(MLX5_WQE_CTRL_FENCE),
	CONST(MLX5_WQE_CTRL_INITIATOR_SMALL_FENCE),
#ifdef GOLDEN_HAVE_WQE_CTRL_STRONG_ORDERING
	CONST(MLX5_WQE_CTRL_STRONG_ORDERING),
#endif

	/* Sizes. */
	CONST(MLX5_SEND_WQE_BB),
	CONST(MLX5_SEND_WQE_SHIFT),
#ifdef GOLDEN_HAVE_SEND_WQE_DS
	CONST(MLX5_SEND_WQE_DS),
#endif
	CONST(MLX5_INLINE_SEG),
#ifdef GOLDEN_HAVE_BF_OFFSET
	CONST(MLX5_BF_OFFSET),
#endif
};

/* The struct table; *len receives its number of entries. */
const struct golden_struct *golden_structs(size_t *len)
{
	*len = sizeof(structs) / sizeof(structs[0]);
	return structs;
}

/* The field table; *len receives its number of entries. */
const struct golden_field *golden_fields(size_t *len)
{
	*len = sizeof(fields) / sizeof(fields[0]);
	return fields;
}

/* The constant table; *len receives its number of entries. */
const struct golden_const *golden_consts(size_t *len)
{
	*len = sizeof(consts) / sizeof(consts[0]);
	return consts;
}

/*
 * Runs mlx5dv_set_ctrl_seg on the 16 bytes at `bytes`. The segment starts as the caller's bytes (so the
 * caller chooses what the helper leaves untouched: it never writes dci_stream_channel_id) and is copied
 * back after. The copies go through a local struct because the caller's bytes need not be 4-byte aligned.
 */
void golden_set_ctrl_seg(uint8_t *bytes, uint16_t pi, uint8_t opcode, uint8_t opmod, uint32_t qp_num,
			 uint8_t fm_ce_se, uint8_t ds, uint8_t signature, uint32_t imm)
{
	struct mlx5_wqe_ctrl_seg seg;

	memcpy(&seg, bytes, sizeof(seg));
	mlx5dv_set_ctrl_seg(&seg, pi, opcode, opmod, qp_num, fm_ce_se, ds, signature, imm);
	memcpy(bytes, &seg, sizeof(seg));
}

/* Runs mlx5dv_set_data_seg on the 16 bytes at `bytes`, as golden_set_ctrl_seg does. */
void golden_set_data_seg(uint8_t *bytes, uint32_t length, uint32_t lkey, uintptr_t address)
{
	struct mlx5_wqe_data_seg seg;

	memcpy(&seg, bytes, sizeof(seg));
	mlx5dv_set_data_seg(&seg, length, lkey, address);
	memcpy(bytes, &seg, sizeof(seg));
}

/*
 * The CQE accessors below copy the caller's 64 bytes into a properly aligned mlx5_cqe64 first and then ask the
 * header's helper, so the answer is the header's reading of exactly those bytes.
 */

/* mlx5dv_get_cqe_owner of the 64 bytes at `bytes`. */
uint8_t golden_get_cqe_owner(const uint8_t *bytes)
{
	struct mlx5_cqe64 cqe;

	memcpy(&cqe, bytes, sizeof(cqe));
	return mlx5dv_get_cqe_owner(&cqe);
}

/* mlx5dv_get_cqe_opcode of the 64 bytes at `bytes`. */
uint8_t golden_get_cqe_opcode(const uint8_t *bytes)
{
	struct mlx5_cqe64 cqe;

	memcpy(&cqe, bytes, sizeof(cqe));
	return mlx5dv_get_cqe_opcode(&cqe);
}

/* mlx5dv_get_cqe_se (solicited event bit) of the 64 bytes at `bytes`. */
uint8_t golden_get_cqe_se(const uint8_t *bytes)
{
	struct mlx5_cqe64 cqe;

	memcpy(&cqe, bytes, sizeof(cqe));
	return mlx5dv_get_cqe_se(&cqe);
}

/* mlx5dv_get_cqe_format (compression format, bits 3:2) of the 64 bytes at `bytes`. */
uint8_t golden_get_cqe_format(const uint8_t *bytes)
{
	struct mlx5_cqe64 cqe;

	memcpy(&cqe, bytes, sizeof(cqe));
	return mlx5dv_get_cqe_format(&cqe);
}
