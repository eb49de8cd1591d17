//! The bindgen structs (and the hand-defined `mlx5_wqe_ctrl_seg`) against the C compiler's layout of the same
//! structs from the system's headers (`c/layout.c`): every struct and field gdaki fills or reads.

use core::mem::{align_of, offset_of, size_of};

use gdaki_mlx5_sys::*;

/// Compares `(offset_of!, size_of field)` of `$t.$f` with the C row `("$t", "$f")`.
macro_rules! field {
    ($t:ident, $($f:ident).+) => {{
        let v = $t::default();
        let rust = (offset_of!($t, $($f).+), core::mem::size_of_val(&v.$($f).+));
        let path = stringify!($($f).+).replace(' ', "");
        let c = c_layout(stringify!($t), Some(&path))
            .unwrap_or_else(|| panic!("c/layout.c has no row for {}.{}", stringify!($t), path));
        assert_eq!(rust, c, "{}.{}: (offset, size) in Rust vs C", stringify!($t), path);
    }};
}

/// Compares `(size_of, align_of)` of `$t` with the C row `("$t", NULL)`.
macro_rules! strukt {
    ($t:ident) => {{
        let c = c_layout(stringify!($t), None).expect(concat!("c/layout.c has no row for ", stringify!($t)));
        assert_eq!((size_of::<$t>(), align_of::<$t>()), c, "{}: (size, align) in Rust vs C", stringify!($t));
    }};
}

#[test]
fn ctrl_seg_matches_c() {
    strukt!(mlx5_wqe_ctrl_seg);
    field!(mlx5_wqe_ctrl_seg, opmod_idx_opcode);
    field!(mlx5_wqe_ctrl_seg, qpn_ds);
    field!(mlx5_wqe_ctrl_seg, signature);
    field!(mlx5_wqe_ctrl_seg, dci_stream_channel_id);
    field!(mlx5_wqe_ctrl_seg, fm_ce_se);
    field!(mlx5_wqe_ctrl_seg, imm);
    // The numbers themselves, from the PRM (16-byte segment, 4-byte aligned): a table that lost its rows
    // cannot make this pass.
    assert_eq!((size_of::<mlx5_wqe_ctrl_seg>(), align_of::<mlx5_wqe_ctrl_seg>()), (16, 4));
    assert_eq!(offset_of!(mlx5_wqe_ctrl_seg, dci_stream_channel_id), 9);
    assert_eq!(offset_of!(mlx5_wqe_ctrl_seg, fm_ce_se), 11);
}

#[test]
fn mlx5dv_objects_match_c() {
    strukt!(mlx5dv_qp);
    field!(mlx5dv_qp, dbrec);
    field!(mlx5dv_qp, sq.buf);
    field!(mlx5dv_qp, sq.wqe_cnt);
    field!(mlx5dv_qp, sq.stride);
    field!(mlx5dv_qp, bf.reg);
    field!(mlx5dv_qp, bf.size);
    field!(mlx5dv_qp, comp_mask);
    strukt!(mlx5dv_cq);
    field!(mlx5dv_cq, buf);
    field!(mlx5dv_cq, dbrec);
    field!(mlx5dv_cq, cqe_cnt);
    field!(mlx5dv_cq, cqe_size);
    field!(mlx5dv_cq, cqn);
    strukt!(mlx5dv_obj);
    // bindgen renames the C field `in` (a Rust keyword) to `in_`.
    let c = c_layout("mlx5dv_obj", Some("qp.in")).expect("row mlx5dv_obj.qp.in");
    assert_eq!((offset_of!(mlx5dv_obj, qp.in_), size_of::<*mut ibv_qp>()), c);
    field!(mlx5dv_obj, qp.out);
    field!(mlx5dv_obj, cq.out);
}

#[test]
fn verbs_attributes_match_c() {
    strukt!(ibv_qp_attr);
    field!(ibv_qp_attr, qp_state);
    field!(ibv_qp_attr, path_mtu);
    field!(ibv_qp_attr, rq_psn);
    field!(ibv_qp_attr, sq_psn);
    field!(ibv_qp_attr, dest_qp_num);
    field!(ibv_qp_attr, qp_access_flags);
    field!(ibv_qp_attr, ah_attr);
    field!(ibv_qp_attr, pkey_index);
    field!(ibv_qp_attr, max_rd_atomic);
    field!(ibv_qp_attr, max_dest_rd_atomic);
    field!(ibv_qp_attr, min_rnr_timer);
    field!(ibv_qp_attr, port_num);
    field!(ibv_qp_attr, timeout);
    field!(ibv_qp_attr, retry_cnt);
    field!(ibv_qp_attr, rnr_retry);
    strukt!(ibv_ah_attr);
    field!(ibv_ah_attr, grh);
    field!(ibv_ah_attr, dlid);
    field!(ibv_ah_attr, sl);
    field!(ibv_ah_attr, is_global);
    field!(ibv_ah_attr, port_num);
    strukt!(ibv_global_route);
    field!(ibv_global_route, dgid);
    field!(ibv_global_route, flow_label);
    field!(ibv_global_route, sgid_index);
    field!(ibv_global_route, hop_limit);
    field!(ibv_global_route, traffic_class);
    strukt!(ibv_qp_init_attr);
    field!(ibv_qp_init_attr, send_cq);
    field!(ibv_qp_init_attr, recv_cq);
    field!(ibv_qp_init_attr, cap);
    field!(ibv_qp_init_attr, qp_type);
    field!(ibv_qp_init_attr, sq_sig_all);
}

#[test]
fn verbs_queries_match_c() {
    strukt!(ibv_port_attr);
    field!(ibv_port_attr, state);
    field!(ibv_port_attr, max_mtu);
    field!(ibv_port_attr, active_mtu);
    field!(ibv_port_attr, gid_tbl_len);
    field!(ibv_port_attr, lid);
    field!(ibv_port_attr, link_layer);
    strukt!(ibv_device_attr);
    field!(ibv_device_attr, fw_ver);
    field!(ibv_device_attr, max_qp);
    field!(ibv_device_attr, max_qp_wr);
    field!(ibv_device_attr, max_cq);
    field!(ibv_device_attr, max_cqe);
    field!(ibv_device_attr, max_mr_size);
    field!(ibv_device_attr, max_qp_rd_atom);
    field!(ibv_device_attr, max_qp_init_rd_atom);
    field!(ibv_device_attr, atomic_cap);
    field!(ibv_device_attr, phys_port_cnt);
    strukt!(ibv_gid_entry);
    field!(ibv_gid_entry, gid);
    field!(ibv_gid_entry, gid_index);
    field!(ibv_gid_entry, port_num);
    field!(ibv_gid_entry, gid_type);
    field!(ibv_gid_entry, ndev_ifindex);
}

/// The table lookup itself: a row that does not exist is `None`, so the tests above cannot pass on a table
/// that answers everything.
#[test]
fn missing_rows_are_none() {
    assert_eq!(c_layout("mlx5dv_qp", Some("no_such_field")), None);
    assert_eq!(c_layout("no_such_struct", None), None);
}

/// The static-inline wrappers link and run: `ibv_query_port` is a macro over `___ibv_query_port`, which on a
/// null context must not be reached, so call one that needs no device: `mlx5dv_set_ctrl_seg` writes the
/// control segment, and its bytes are the PRM's.
#[test]
fn static_inline_wrapper_runs() {
    let mut seg = mlx5_wqe_ctrl_seg::default();
    // SAFETY: `seg` is a valid, writable control segment.
    unsafe { mlx5dv_set_ctrl_seg(&mut seg, 0x1234, 0x08, 0, 0xabcdef, 0x08, 3, 0, 0) };
    assert_eq!(u32::from_be(seg.opmod_idx_opcode), 0x0012_3408);
    assert_eq!(u32::from_be(seg.qpn_ds), 0xabcd_ef03);
    assert_eq!(seg.fm_ce_se, 0x08);
}
