/*
 * Layout reference for gdaki-mlx5-sys's tests: sizeof/_Alignof of the structs gdaki fills or reads, and
 * offsetof/sizeof of the fields it touches, as the C compiler (not bindgen's libclang) lays them out against the
 * system's rdma-core headers. The tests compare bindgen's Rust structs (and the hand-defined
 * mlx5_wqe_ctrl_seg) with these numbers.
 */
#include <stddef.h>
#include <stdint.h>

#include <infiniband/verbs.h>
#include <infiniband/mlx5dv.h>

/* Layout must match `CEntry` in src/lib.rs. For a struct row, `field` is NULL, `offset` is sizeof and `size`
 * is _Alignof. */
struct gdaki_layout_entry {
	const char *strukt;
	const char *field;
	uint32_t offset;
	uint32_t size;
};

#define STRUCT(T) { #T, NULL, (uint32_t)sizeof(struct T), (uint32_t)_Alignof(struct T) }
#define FIELD(T, f) { #T, #f, (uint32_t)offsetof(struct T, f), (uint32_t)sizeof(((struct T *)0)->f) }

const struct gdaki_layout_entry gdaki_mlx5_layout[] = {
	STRUCT(mlx5_wqe_ctrl_seg),
	FIELD(mlx5_wqe_ctrl_seg, opmod_idx_opcode),
	FIELD(mlx5_wqe_ctrl_seg, qpn_ds),
	FIELD(mlx5_wqe_ctrl_seg, signature),
	FIELD(mlx5_wqe_ctrl_seg, dci_stream_channel_id),
	FIELD(mlx5_wqe_ctrl_seg, fm_ce_se),
	FIELD(mlx5_wqe_ctrl_seg, imm),

	STRUCT(mlx5dv_qp),
	FIELD(mlx5dv_qp, dbrec),
	FIELD(mlx5dv_qp, sq.buf),
	FIELD(mlx5dv_qp, sq.wqe_cnt),
	FIELD(mlx5dv_qp, sq.stride),
	FIELD(mlx5dv_qp, bf.reg),
	FIELD(mlx5dv_qp, bf.size),
	FIELD(mlx5dv_qp, comp_mask),

	STRUCT(mlx5dv_cq),
	FIELD(mlx5dv_cq, buf),
	FIELD(mlx5dv_cq, dbrec),
	FIELD(mlx5dv_cq, cqe_cnt),
	FIELD(mlx5dv_cq, cqe_size),
	FIELD(mlx5dv_cq, cqn),

	STRUCT(mlx5dv_obj),
	FIELD(mlx5dv_obj, qp.in),
	FIELD(mlx5dv_obj, qp.out),
	FIELD(mlx5dv_obj, cq.in),
	FIELD(mlx5dv_obj, cq.out),

	STRUCT(ibv_qp_attr),
	FIELD(ibv_qp_attr, qp_state),
	FIELD(ibv_qp_attr, path_mtu),
	FIELD(ibv_qp_attr, rq_psn),
	FIELD(ibv_qp_attr, sq_psn),
	FIELD(ibv_qp_attr, dest_qp_num),
	FIELD(ibv_qp_attr, qp_access_flags),
	FIELD(ibv_qp_attr, ah_attr),
	FIELD(ibv_qp_attr, pkey_index),
	FIELD(ibv_qp_attr, max_rd_atomic),
	FIELD(ibv_qp_attr, max_dest_rd_atomic),
	FIELD(ibv_qp_attr, min_rnr_timer),
	FIELD(ibv_qp_attr, port_num),
	FIELD(ibv_qp_attr, timeout),
	FIELD(ibv_qp_attr, retry_cnt),
	FIELD(ibv_qp_attr, rnr_retry),

	STRUCT(ibv_ah_attr),
	FIELD(ibv_ah_attr, grh),
	FIELD(ibv_ah_attr, dlid),
	FIELD(ibv_ah_attr, sl),
	FIELD(ibv_ah_attr, is_global),
	FIELD(ibv_ah_attr, port_num),

	STRUCT(ibv_global_route),
	FIELD(ibv_global_route, dgid),
	FIELD(ibv_global_route, flow_label),
	FIELD(ibv_global_route, sgid_index),
	FIELD(ibv_global_route, hop_limit),
	FIELD(ibv_global_route, traffic_class),

	STRUCT(ibv_qp_init_attr),
	FIELD(ibv_qp_init_attr, send_cq),
	FIELD(ibv_qp_init_attr, recv_cq),
	FIELD(ibv_qp_init_attr, cap),
	FIELD(ibv_qp_init_attr, qp_type),
	FIELD(ibv_qp_init_attr, sq_sig_all),

	STRUCT(ibv_port_attr),
	FIELD(ibv_port_attr, state),
	FIELD(ibv_port_attr, max_mtu),
	FIELD(ibv_port_attr, active_mtu),
	FIELD(ibv_port_attr, gid_tbl_len),
	FIELD(ibv_port_attr, lid),
	FIELD(ibv_port_attr, link_layer),

	STRUCT(ibv_device_attr),
	FIELD(ibv_device_attr, fw_ver),
	FIELD(ibv_device_attr, max_qp),
	FIELD(ibv_device_attr, max_qp_wr),
	FIELD(ibv_device_attr, max_cq),
	FIELD(ibv_device_attr, max_cqe),
	FIELD(ibv_device_attr, max_mr_size),
	FIELD(ibv_device_attr, max_qp_rd_atom),
	FIELD(ibv_device_attr, max_qp_init_rd_atom),
	FIELD(ibv_device_attr, atomic_cap),
	FIELD(ibv_device_attr, phys_port_cnt),

	STRUCT(ibv_gid_entry),
	FIELD(ibv_gid_entry, gid),
	FIELD(ibv_gid_entry, gid_index),
	FIELD(ibv_gid_entry, port_num),
	FIELD(ibv_gid_entry, gid_type),
	FIELD(ibv_gid_entry, ndev_ifindex),
	{ NULL, NULL, 0, 0 },
};
