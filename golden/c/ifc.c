/*
 * Reference for gdaki-shared's prm::cmd: the mlx5 firmware command layouts (DevX mailboxes) as rdma-core's own
 * DEVX_SET/DEVX_GET/DEVX_SET64/DEVX_GET64/DEVX_ST_SZ_BYTES macros (<infiniband/mlx5dv.h>) see them.
 *
 * Those macros work on `struct mlx5_ifc_<name>_bits`, whose members are `u8 name[width]` arrays: with a
 * one-byte `u8`, sizeof of a member is its width in bits and offsetof its bit offset. mlx5dv.h declares no such
 * struct, so this file declares the ones gdaki uses, member by member with the names and widths of the PRM
 * structs in mlx5_ifc.h (the Linux kernel's and rdma-core's provider header). Bits that gdaki-shared does not
 * name are declared as reserved runs `reserved_at_<hex bit offset>`, even where mlx5_ifc.h names fields in
 * them; the tests check that every such label is the offset the compiler gives the run, so the hand-written
 * offsets and the widths cannot disagree.
 *
 * Each layout is written once, as a list of members, and expanded three times: into the struct declaration,
 * into the table of members (bit offset and width from the header's __devx_bit_off/__devx_bit_sz), and into
 * a DEVX_SET/DEVX_GET (or DEVX_SET64/DEVX_GET64) pair for every named scalar member. Member kinds:
 *   M(T, name, width)  a named field of 1..32 bits
 *   Q(T, name)         a named 64-bit field
 *   R(T, hex, width)   reserved bits at bit offset 0x<hex>
 *   S(T, type, name)   an embedded struct mlx5_ifc_<type>_bits
 *   U(T, type, name)   an embedded union mlx5_ifc_<type>_bits
 *   A(T, name, bytes)  a byte string, u8 name[bytes][0x8]
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <infiniband/mlx5dv.h>

/* The element type of the _bits structs: one byte, so that sizeof and offsetof count bits. */
typedef uint8_t u8;

/* The header of every command input, and of every output. */
#define L_mbox_in(T, M, Q, R, S, U, A)                                                                      \
	M(T, opcode, 0x10) M(T, uid, 0x10) R(T, 20, 0x10) M(T, op_mod, 0x10)                                  \
	R(T, 40, 0x40)
#define L_mbox_out(T, M, Q, R, S, U, A)                                                                     \
	M(T, status, 0x8) R(T, 8, 0x18) M(T, syndrome, 0x20)                                                  \
	R(T, 40, 0x40)

/* CQ context and the CQ commands. */
#define L_cqc(T, M, Q, R, S, U, A)                                                                          \
	M(T, status, 0x4) R(T, 4, 0x2) M(T, dbr_umem_valid, 0x1) R(T, 7, 0x1) M(T, cqe_sz, 0x3) M(T, cc, 0x1) \
	R(T, c, 0x1) M(T, scqe_break_moderation_en, 0x1) M(T, oi, 0x1) M(T, cq_period_mode, 0x2)              \
	M(T, cqe_comp_en, 0x1) M(T, mini_cqe_res_format, 0x2) M(T, st, 0x4) R(T, 18, 0x8)                     \
	M(T, dbr_umem_id, 0x20)                                                                               \
	R(T, 40, 0x23) M(T, log_cq_size, 0x5) M(T, uar_page, 0x18)                                            \
	R(T, 80, 0x4) M(T, cq_period, 0xc) M(T, cq_max_count, 0x10)                                           \
	R(T, a0, 0x18) M(T, c_eqn, 0x8)                                                                       \
	R(T, c0, 0x3) M(T, log_page_size, 0x5) R(T, c8, 0x80)                                                 \
	M(T, consumer_counter, 0x18)                                                                          \
	R(T, 160, 0x8) M(T, producer_counter, 0x18)                                                           \
	R(T, 180, 0x40)                                                                                       \
	Q(T, dbr_addr)
#define L_create_cq_in(T, M, Q, R, S, U, A)                                                                 \
	M(T, opcode, 0x10) M(T, uid, 0x10) R(T, 20, 0x10) M(T, op_mod, 0x10)                                  \
	R(T, 40, 0x40)                                                                                        \
	S(T, cqc, cq_context)                                                                                 \
	Q(T, cq_umem_offset)                                                                                  \
	M(T, cq_umem_id, 0x20)                                                                                \
	M(T, cq_umem_valid, 0x1) R(T, 2e1, 0x1f)                                                              \
	R(T, 300, 0x580)
#define L_create_cq_out(T, M, Q, R, S, U, A)                                                                \
	M(T, status, 0x8) R(T, 8, 0x18) M(T, syndrome, 0x20) R(T, 40, 0x8) M(T, cqn, 0x18) R(T, 60, 0x20)
#define L_destroy_cq_in(T, M, Q, R, S, U, A)                                                                \
	M(T, opcode, 0x10) M(T, uid, 0x10) R(T, 20, 0x20) R(T, 40, 0x8) M(T, cqn, 0x18) R(T, 60, 0x20)
#define L_destroy_cq_out L_mbox_out

/* Address path, QP context and the QP commands. */
#define L_ads(T, M, Q, R, S, U, A)                                                                          \
	M(T, fl, 0x1) M(T, free_ar, 0x1) R(T, 2, 0xe) M(T, pkey_index, 0x10)                                  \
	R(T, 20, 0x8) M(T, grh, 0x1) M(T, mlid, 0x7) M(T, rlid, 0x10)                                         \
	M(T, ack_timeout, 0x5) R(T, 45, 0x3) M(T, src_addr_index, 0x8) R(T, 50, 0x4) M(T, stat_rate, 0x4)     \
	M(T, hop_limit, 0x8)                                                                                  \
	R(T, 60, 0x4) M(T, tclass, 0x8) M(T, flow_label, 0x14)                                                \
	A(T, rgid_rip, 16)                                                                                    \
	R(T, 100, 0x10) M(T, udp_sport, 0x10)                                                                 \
	R(T, 120, 0x1) M(T, eth_prio, 0x3) M(T, sl, 0x4) M(T, vhca_port_num, 0x8) M(T, rmac_47_32, 0x10)      \
	M(T, rmac_31_0, 0x20)
#define L_qpc(T, M, Q, R, S, U, A)                                                                          \
	M(T, state, 0x4) R(T, 4, 0x4) M(T, st, 0x8) R(T, 10, 0x3) M(T, pm_state, 0x2) R(T, 15, 0xb)           \
	R(T, 20, 0x8) M(T, pd, 0x18)                                                                          \
	M(T, mtu, 0x3) M(T, log_msg_max, 0x5) R(T, 48, 0x1) M(T, log_rq_size, 0x4) M(T, log_rq_stride, 0x3)   \
	M(T, no_sq, 0x1) M(T, log_sq_size, 0x4) R(T, 55, 0x3) M(T, ts_format, 0x2) R(T, 5a, 0x6)              \
	M(T, counter_set_id, 0x8) M(T, uar_page, 0x18)                                                        \
	R(T, 80, 0x8) M(T, user_index, 0x18)                                                                  \
	R(T, a0, 0x3) M(T, log_page_size, 0x5) M(T, remote_qpn, 0x18)                                         \
	S(T, ads, primary_address_path)                                                                       \
	S(T, ads, secondary_address_path)                                                                     \
	M(T, log_ack_req_freq, 0x4) R(T, 384, 0x4) M(T, log_sra_max, 0x3) R(T, 38b, 0x2) M(T, retry_count, 0x3) \
	M(T, rnr_retry, 0x3) R(T, 393, 0x2) M(T, cur_rnr_retry, 0x3) M(T, cur_retry_count, 0x3)               \
	R(T, 39b, 0x2d) M(T, next_send_psn, 0x18)                                                             \
	R(T, 3e0, 0x8) M(T, cqn_snd, 0x18)                                                                    \
	R(T, 400, 0x48) M(T, last_acked_psn, 0x18)                                                            \
	R(T, 460, 0x28) M(T, log_rra_max, 0x3) R(T, 48b, 0x1) M(T, atomic_mode, 0x4) M(T, rre, 0x1)           \
	M(T, rwe, 0x1) M(T, rae, 0x1) R(T, 493, 0x10) M(T, min_rnr_nak, 0x5) M(T, next_rcv_psn, 0x18)         \
	R(T, 4c0, 0x28) M(T, cqn_rcv, 0x18)                                                                   \
	Q(T, dbr_addr)                                                                                        \
	R(T, 540, 0x25) M(T, rq_type, 0x3) M(T, srqn_rmpn_xrqn, 0x18)                                         \
	R(T, 580, 0x20)                                                                                       \
	M(T, hw_sq_wqebb_counter, 0x10) M(T, sw_sq_wqebb_counter, 0x10)                                       \
	M(T, hw_rq_counter, 0x20)                                                                             \
	M(T, sw_rq_counter, 0x20)                                                                             \
	R(T, 600, 0x83) M(T, dbr_umem_valid, 0x1) R(T, 684, 0x9c)                                             \
	M(T, dbr_umem_id, 0x20)
#define L_create_qp_in(T, M, Q, R, S, U, A)                                                                 \
	M(T, opcode, 0x10) M(T, uid, 0x10) R(T, 20, 0x10) M(T, op_mod, 0x10)                                  \
	R(T, 40, 0x40)                                                                                        \
	M(T, opt_param_mask, 0x20)                                                                            \
	R(T, a0, 0x20)                                                                                        \
	S(T, qpc, qpc)                                                                                        \
	Q(T, wq_umem_offset)                                                                                  \
	M(T, wq_umem_id, 0x20)                                                                                \
	M(T, wq_umem_valid, 0x1) R(T, 861, 0x1f)
#define L_create_qp_out(T, M, Q, R, S, U, A)                                                                \
	M(T, status, 0x8) R(T, 8, 0x18) M(T, syndrome, 0x20) R(T, 40, 0x8) M(T, qpn, 0x18) R(T, 60, 0x20)
#define L_destroy_qp_in(T, M, Q, R, S, U, A)                                                                \
	M(T, opcode, 0x10) M(T, uid, 0x10) R(T, 20, 0x20) R(T, 40, 0x8) M(T, qpn, 0x18) R(T, 60, 0x20)
#define L_destroy_qp_out L_mbox_out
/* RST2INIT, INIT2RTR and RTR2RTS inputs have one layout. */
#define L_modify_qp_in(T, M, Q, R, S, U, A)                                                                 \
	M(T, opcode, 0x10) M(T, uid, 0x10) R(T, 20, 0x10) M(T, op_mod, 0x10)                                  \
	R(T, 40, 0x8) M(T, qpn, 0x18)                                                                         \
	R(T, 60, 0x20)                                                                                        \
	M(T, opt_param_mask, 0x20)                                                                            \
	R(T, a0, 0x20)                                                                                        \
	S(T, qpc, qpc)                                                                                        \
	R(T, 800, 0x80)
#define L_rst2init_qp_in L_modify_qp_in
#define L_rst2init_qp_out L_mbox_out
#define L_init2rtr_qp_in L_modify_qp_in
#define L_init2rtr_qp_out L_mbox_out
#define L_rtr2rts_qp_in L_modify_qp_in
#define L_rtr2rts_qp_out L_mbox_out
#define L_qp_2err_in(T, M, Q, R, S, U, A)                                                                   \
	M(T, opcode, 0x10) M(T, uid, 0x10) R(T, 20, 0x10) M(T, op_mod, 0x10) R(T, 40, 0x8) M(T, qpn, 0x18)    \
	R(T, 60, 0x20)
#define L_qp_2err_out L_mbox_out
#define L_query_qp_in(T, M, Q, R, S, U, A)                                                                  \
	M(T, opcode, 0x10) R(T, 10, 0x10) R(T, 20, 0x10) M(T, op_mod, 0x10) R(T, 40, 0x8) M(T, qpn, 0x18)     \
	R(T, 60, 0x20)
#define L_query_qp_out(T, M, Q, R, S, U, A)                                                                 \
	M(T, status, 0x8) R(T, 8, 0x18) M(T, syndrome, 0x20)                                                  \
	R(T, 40, 0x40)                                                                                        \
	M(T, opt_param_mask, 0x20)                                                                            \
	R(T, a0, 0x20)                                                                                        \
	S(T, qpc, qpc)                                                                                        \
	R(T, 800, 0x80)

/* General device capabilities and QUERY_HCA_CAP. */
#define L_cmd_hca_cap(T, M, Q, R, S, U, A)                                                                  \
	R(T, 0, 0x88) M(T, log_max_qp_sz, 0x8) R(T, 90, 0xb) M(T, log_max_qp, 0x5)                            \
	R(T, a0, 0x28) M(T, log_max_cq_sz, 0x8) R(T, d0, 0xb) M(T, log_max_cq, 0x5)                           \
	R(T, e0, 0x6a) M(T, log_max_ra_req_qp, 0x6) R(T, 150, 0xa) M(T, log_max_ra_res_qp, 0x6)               \
	R(T, 160, 0x10) M(T, gid_table_size, 0x10)                                                            \
	R(T, 180, 0x10) M(T, pkey_table_size, 0x10)                                                           \
	R(T, 1a0, 0x16) M(T, port_type, 0x2) M(T, num_ports, 0x8)                                             \
	R(T, 1c0, 0x3) M(T, log_max_msg, 0x5) R(T, 1c8, 0x34) M(T, cqe_version, 0x4)                          \
	R(T, 200, 0x3f) M(T, rc, 0x1)                                                                         \
	M(T, uar_4k, 0x1) R(T, 241, 0x11) M(T, umem_uid_0, 0x1) R(T, 253, 0xd)                                \
	M(T, bf, 0x1) R(T, 261, 0xa) M(T, log_bf_reg_size, 0x5)                                               \
	R(T, 270, 0x20) M(T, max_wqe_sz_sq, 0x10)                                                             \
	R(T, 2a0, 0x10) M(T, max_wqe_sz_rq, 0x10)                                                             \
	R(T, 2c0, 0x6b) M(T, log_max_pd, 0x5)                                                                 \
	R(T, 330, 0xd0)                                                                                       \
	Q(T, general_obj_types)                                                                               \
	M(T, sq_ts_format, 0x2) M(T, rq_ts_format, 0x2) R(T, 444, 0x1f) M(T, log_max_uctx, 0x5)               \
	R(T, 468, 0x3) M(T, log_max_umem, 0x5)                                                                \
	R(T, 470, 0x20) M(T, log_uar_page_sz, 0x10)                                                           \
	R(T, 4a0, 0x40)                                                                                       \
	M(T, device_frequency_khz, 0x20)                                                                      \
	R(T, 500, 0x20)                                                                                       \
	M(T, num_of_uars_per_page, 0x20)                                                                      \
	R(T, 540, 0x2c0)
/* A union: its members overlap, at bit 0 each. */
#define L_hca_cap_union(T, M, Q, R, S, U, A) S(T, cmd_hca_cap, cmd_hca_cap) R(T, 0, 0x8000)
#define L_query_hca_cap_in(T, M, Q, R, S, U, A)                                                             \
	M(T, opcode, 0x10) R(T, 10, 0x10) R(T, 20, 0x10) M(T, op_mod, 0x10)                                   \
	M(T, other_function, 0x1) R(T, 41, 0xf) M(T, function_id, 0x10)                                      \
	R(T, 60, 0x20)
#define L_query_hca_cap_out(T, M, Q, R, S, U, A)                                                            \
	M(T, status, 0x8) R(T, 8, 0x18) M(T, syndrome, 0x20)                                                  \
	R(T, 40, 0x40)                                                                                        \
	U(T, hca_cap_union, capability)

/* Every layout, embedded ones first: X(name) or XU(name) for the union. */
#define LAYOUTS(X, XU)                                                                                      \
	X(mbox_in) X(mbox_out)                                                                                \
	X(cqc) X(create_cq_in) X(create_cq_out) X(destroy_cq_in) X(destroy_cq_out)                            \
	X(ads) X(qpc) X(create_qp_in) X(create_qp_out) X(destroy_qp_in) X(destroy_qp_out)                     \
	X(rst2init_qp_in) X(rst2init_qp_out) X(init2rtr_qp_in) X(init2rtr_qp_out)                             \
	X(rtr2rts_qp_in) X(rtr2rts_qp_out) X(qp_2err_in) X(qp_2err_out) X(query_qp_in) X(query_qp_out)        \
	X(cmd_hca_cap) XU(hca_cap_union) X(query_hca_cap_in) X(query_hca_cap_out)

/* Expansion 1: the declarations. */
#define D_M(T, n, w) u8 n[w];
#define D_Q(T, n) u8 n[0x40];
#define D_R(T, h, w) u8 reserved_at_##h[w];
#define D_S(T, t, n) struct mlx5_ifc_##t##_bits n;
#define D_U(T, t, n) union mlx5_ifc_##t##_bits n;
#define D_A(T, n, b) u8 n[b][0x8];
#define DECLARE(T) struct mlx5_ifc_##T##_bits { L_##T(T, D_M, D_Q, D_R, D_S, D_U, D_A) };
#define DECLARE_UNION(T) union mlx5_ifc_##T##_bits { L_##T(T, D_M, D_Q, D_R, D_S, D_U, D_A) };
LAYOUTS(DECLARE, DECLARE_UNION)

/* Expansion 2: DEVX_SET/DEVX_GET of every named scalar member, on a buffer holding the layout. */
#define F_M(T, n, w)                                                                                        \
	static void set_##T##_##n(void *p, uint64_t v) { DEVX_SET(T, p, n, (uint32_t)v); }                    \
	static uint64_t get_##T##_##n(const void *p) { return DEVX_GET(T, p, n); }
#define F_Q(T, n)                                                                                           \
	static void set_##T##_##n(void *p, uint64_t v) { DEVX_SET64(T, p, n, v); }                            \
	static uint64_t get_##T##_##n(const void *p) { return DEVX_GET64(T, p, n); }
#define F_NONE3(T, a, b)
#define F_NONE2(T, a)
#define FUNCTIONS(T) L_##T(T, F_M, F_Q, F_NONE3, F_NONE3, F_NONE3, F_NONE3)
LAYOUTS(FUNCTIONS, FUNCTIONS)

/* Expansion 3: the member table. Layout must match `RawRow` in src/ifc.rs. */
enum golden_ifc_kind {
	GOLDEN_IFC_STRUCT = 0,   /* a layout: bit_sz is its size in bits */
	GOLDEN_IFC_UNION = 1,    /* a union layout */
	GOLDEN_IFC_SCALAR = 2,   /* a named field of 1..32 bits */
	GOLDEN_IFC_U64 = 3,      /* a named 64-bit field */
	GOLDEN_IFC_RESERVED = 4, /* reserved_at_<hex> */
	GOLDEN_IFC_SUB = 5,      /* an embedded struct or union */
	GOLDEN_IFC_BYTES = 6,    /* a byte string */
};

struct golden_ifc_row {
	const char *layout;
	const char *member; /* NULL for the layout's own row */
	uint32_t bit_off;
	uint32_t bit_sz;
	uint32_t kind;
};

#define ROW(T, name, n, kind) { #T, name, (uint32_t)__devx_bit_off(T, n), (uint32_t)__devx_bit_sz(T, n), kind },
#define T_M(T, n, w) ROW(T, #n, n, GOLDEN_IFC_SCALAR)
#define T_Q(T, n) ROW(T, #n, n, GOLDEN_IFC_U64)
#define T_R(T, h, w) ROW(T, "reserved_at_" #h, reserved_at_##h, GOLDEN_IFC_RESERVED)
#define T_S(T, t, n) ROW(T, #n, n, GOLDEN_IFC_SUB)
#define T_A(T, n, b) ROW(T, #n, n, GOLDEN_IFC_BYTES)
#define TABLE(T) { #T, NULL, 0, (uint32_t)__devx_st_sz_bits(T), GOLDEN_IFC_STRUCT }, L_##T(T, T_M, T_Q, T_R, T_S, T_S, T_A)

/* A union's members: __devx_bit_off/__devx_bit_sz name `struct`, so unions get their own row macro. */
#define UROW(T, name, n, kind)                                                                              \
	{ #T, name, (uint32_t)offsetof(union mlx5_ifc_##T##_bits, n),                                         \
	  (uint32_t)sizeof(((union mlx5_ifc_##T##_bits *)0)->n), kind },
#define UT_R(T, h, w) UROW(T, "reserved_at_" #h, reserved_at_##h, GOLDEN_IFC_RESERVED)
#define UT_S(T, t, n) UROW(T, #n, n, GOLDEN_IFC_SUB)
#define TABLE_U(T)                                                                                          \
	{ #T, NULL, 0, (uint32_t)(sizeof(union mlx5_ifc_##T##_bits)), GOLDEN_IFC_UNION },                     \
	L_##T(T, F_NONE3, F_NONE2, UT_R, UT_S, UT_S, F_NONE3)

static const struct golden_ifc_row rows[] = { LAYOUTS(TABLE, TABLE_U) };

/* The setter and getter of each row (NULL for rows that are not named scalars), in the same order. */
struct golden_ifc_ops {
	void (*set)(void *p, uint64_t v);
	uint64_t (*get)(const void *p);
};

#define O_M(T, n, w) { set_##T##_##n, get_##T##_##n },
#define O_Q(T, n) { set_##T##_##n, get_##T##_##n },
#define O_NONE3(T, a, b) { NULL, NULL },
#define OPS(T) { NULL, NULL }, L_##T(T, O_M, O_Q, O_NONE3, O_NONE3, O_NONE3, O_NONE3)
#define OPS_U(T) { NULL, NULL }, L_##T(T, F_NONE3, F_NONE2, O_NONE3, O_NONE3, O_NONE3, F_NONE3)

static const struct golden_ifc_ops ops[] = { LAYOUTS(OPS, OPS_U) };

_Static_assert(sizeof(rows) / sizeof(rows[0]) == sizeof(ops) / sizeof(ops[0]), "rows and ops out of step");

/* The member table; *len receives its number of entries. */
const struct golden_ifc_row *golden_ifc_rows(size_t *len)
{
	*len = sizeof(rows) / sizeof(rows[0]);
	return rows;
}

/* The largest layout (query_hca_cap_out), in 8-byte words: the aligned copy DEVX_SET/DEVX_GET work on. */
#define GOLDEN_IFC_MAX_WORDS ((sizeof(struct mlx5_ifc_query_hca_cap_out_bits) / 8 + 7) / 8)

/*
 * DEVX_SET of row `i`'s member into the `len` bytes at `bytes` (a buffer holding the row's layout). The
 * macros store through __be32 / __be64 pointers, so they run on an 8-byte aligned copy of the caller's bytes.
 * Returns 0, or -1 when the row has no setter or `len` exceeds the largest layout.
 */
int golden_ifc_set(size_t i, uint8_t *bytes, size_t len, uint64_t v)
{
	uint64_t buf[GOLDEN_IFC_MAX_WORDS];

	if (i >= sizeof(ops) / sizeof(ops[0]) || !ops[i].set || len > sizeof(buf))
		return -1;
	memcpy(buf, bytes, len);
	ops[i].set(buf, v);
	memcpy(bytes, buf, len);
	return 0;
}

/* DEVX_GET of row `i`'s member from the `len` bytes at `bytes`, into *v. Returns 0 or -1 as golden_ifc_set. */
int golden_ifc_get(size_t i, const uint8_t *bytes, size_t len, uint64_t *v)
{
	uint64_t buf[GOLDEN_IFC_MAX_WORDS];

	if (i >= sizeof(ops) / sizeof(ops[0]) || !ops[i].get || len > sizeof(buf))
		return -1;
	memset(buf, 0, sizeof(buf));
	memcpy(buf, bytes, len);
	*v = ops[i].get(buf);
	return 0;
}

/* Constants of <infiniband/verbs.h> that the PRM encodings equal. Layout must match `RawConst` in src/ifc.rs. */
struct golden_ifc_const {
	const char *name;
	int64_t value;
};

#define IFC_CONST(c) { #c, (int64_t)(c) },

static const struct golden_ifc_const ifc_consts[] = {
	IFC_CONST(IBV_MTU_256) IFC_CONST(IBV_MTU_512) IFC_CONST(IBV_MTU_1024) IFC_CONST(IBV_MTU_2048)
	IFC_CONST(IBV_MTU_4096)
};

/* The constant table; *len receives its number of entries. */
const struct golden_ifc_const *golden_ifc_consts(size_t *len)
{
	*len = sizeof(ifc_consts) / sizeof(ifc_consts[0]);
	return ifc_consts;
}
