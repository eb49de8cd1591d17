//! What `ibv_create_cq`, `ibv_create_qp` and `ibv_modify_qp` are asked for: pure functions from our sizes,
//! rights and the two ends' [`Endpoint`]s to zeroed-then-filled verbs attribute structs and their masks.
//!
//! The masks are the required ones of `ibv_modify_qp(3)` for an RC QP, one per transition:
//!
//! | transition | attributes (mask bits) |
//! |---|---|
//! | RESET → INIT | `qp_state`, `pkey_index`, `port_num`, `qp_access_flags` |
//! | INIT → RTR | `qp_state`, `ah_attr` (AV), `path_mtu`, `dest_qp_num`, `rq_psn`, `max_dest_rd_atomic`, `min_rnr_timer` |
//! | RTR → RTS | `qp_state`, `sq_psn`, `timeout`, `retry_cnt`, `rnr_retry`, `max_rd_atomic` |
//! | any → ERR | `qp_state` |

// Each builder zeroes its struct (`Default` of the bindgen structs is all-zero bytes, padding included) and then
// sets fields one by one, the verbs idiom (`memset` then assign) that the man pages and the tests follow; nested
// unions (`ah_attr.grh.dgid`) do not fit struct-update syntax.
#![allow(clippy::field_reassign_with_default)]

use gdaki_device::sq::{valid_ring, MAX_WQE_CNT, MIN_WQE_CNT};
use gdaki_mlx5_sys as sys;

use super::endpoint::{Endpoint, LinkLayer};
use crate::nic::emu::Access;
use crate::{Error, Result};

/// Local ACK timeout exponent: the requester waits `4.096 µs × 2^timeout` for an ACK before it retries
/// (`ibv_modify_qp(3)`, `timeout`): 14 is 67 ms, what NCCL and perftest use on a fabric of a few hops.
pub const ACK_TIMEOUT: u8 = 14;
/// Transport retries before the QP fails with syndrome 0x15 (retry exceeded); 7 is the most (3 bits).
pub const RETRY_CNT: u8 = 7;
/// RNR retries; 7 means "retry forever" (`ibv_modify_qp(3)`, `rnr_retry`).
pub const RNR_RETRY: u8 = 7;
/// Minimal RNR NAK timer this QP's responder asks peers to wait: code 12 = 0.64 ms (IB spec table 45).
pub const MIN_RNR_TIMER: u8 = 12;
/// GRH hop limit of RoCE v2 packets (IPv4 TTL / IPv6 hop limit): 255 lets them cross any routed fabric, as
/// perftest and NCCL set it.
pub const HOP_LIMIT: u8 = 255;

/// RC QP access flags at INIT: what peers may do to this QP's responder (MR rights still apply): RDMA WRITE,
/// RDMA READ and atomics, as the emulated NIC's connected QPs allow.
pub const QP_ACCESS: u32 = sys::IBV_ACCESS_REMOTE_WRITE | sys::IBV_ACCESS_REMOTE_READ | sys::IBV_ACCESS_REMOTE_ATOMIC;

/// `IBV_ACCESS_*` bits of `ibv_reg_mr` for `access`. [`Access`] carries the verbs values, so this only checks
/// that they are the header's (a unit test) and that no unknown bit gets through.
///
/// # Errors
/// [`Error::InvalidArgument`] for bits other than the four rights.
pub fn mr_access(access: Access) -> Result<u32> {
    let known = sys::IBV_ACCESS_LOCAL_WRITE
        | sys::IBV_ACCESS_REMOTE_WRITE
        | sys::IBV_ACCESS_REMOTE_READ
        | sys::IBV_ACCESS_REMOTE_ATOMIC;
    if access.bits() & !known != 0 {
        return Err(Error::InvalidArgument(format!("unknown access bits {:#x}", access.bits())));
    }
    Ok(access.bits())
}

/// The `cqe` argument of `ibv_create_cq` that gives a ring of exactly `ncqe` entries: rdma-core's mlx5 provider
/// allocates `cqe + 1` entries rounded up to a power of two (`mlx5_create_cq`), so ask for `ncqe - 1`.
///
/// # Errors
/// [`Error::InvalidArgument`] unless `ncqe` is a power of two in `2..=max_cqe + 1` (`max_cqe` from
/// `ibv_query_device`).
pub fn cq_request(ncqe: u32, max_cqe: u32) -> Result<i32> {
    if !ncqe.is_power_of_two() || ncqe < 2 || ncqe - 1 > max_cqe {
        return Err(Error::InvalidArgument(format!(
            "ncqe {ncqe} must be a power of two in 2..={} (the device's max_cqe + 1)",
            max_cqe.saturating_add(1)
        )));
    }
    i32::try_from(ncqe - 1).map_err(|_| Error::InvalidArgument(format!("ncqe {ncqe} does not fit ibv_create_cq")))
}

/// log2 of an SQ of `wqe_cnt` WQEBBs on a device that takes at most `max_wqe_cnt`: a ring device code posts
/// to ([`valid_ring`]: a power of two in [`MIN_WQE_CNT`]`..=`[`MAX_WQE_CNT`]) within the device's limit
/// (`max_qp_wr`, or `2^log_max_qp_sz` on the DevX path). A larger limit does not make a larger ring usable.
///
/// # Errors
/// [`Error::InvalidArgument`] for any other size, naming the sizes there are.
pub fn sq_log2(wqe_cnt: u32, max_wqe_cnt: u32) -> Result<u8> {
    if !valid_ring(wqe_cnt) || wqe_cnt > max_wqe_cnt {
        return Err(Error::InvalidArgument(format!(
            "wqe_cnt {wqe_cnt} must be a power of two in {MIN_WQE_CNT}..={} (the ring sizes device code posts to, \
             within the device's limit {max_wqe_cnt})",
            max_wqe_cnt.min(MAX_WQE_CNT)
        )));
    }
    Ok(wqe_cnt.trailing_zeros() as u8)
}

/// `ibv_qp_init_attr` of an RC QP whose SQ holds `wqe_cnt` WQEBBs, both CQs `cq`, no inline data, one SGE,
/// a receive queue of one WQE (no receive WQE is ever posted: inbound WRITEs need none), and completions only
/// for WQEs that ask for one (`sq_sig_all = 0`: the device code sets CQ_UPDATE itself).
///
/// rdma-core's mlx5 provider sizes an RC send WQE as ctrl + raddr + atomic + one data segment = 64 bytes (one
/// WQEBB) and rounds `max_send_wr` WQEs up to a power of two, so `max_send_wr = wqe_cnt` gives a ring of
/// `wqe_cnt` WQEBBs; the QP's `mlx5dv_qp.sq.wqe_cnt` is checked after creation.
///
/// # Errors
/// As [`sq_log2`] with the device's `max_qp_wr` (`ibv_query_device`).
pub fn qp_init_attr(cq: *mut sys::ibv_cq, wqe_cnt: u32, max_qp_wr: u32) -> Result<sys::ibv_qp_init_attr> {
    sq_log2(wqe_cnt, max_qp_wr)?;
    let mut a = sys::ibv_qp_init_attr::default();
    a.send_cq = cq;
    a.recv_cq = cq;
    a.cap.max_send_wr = wqe_cnt;
    a.cap.max_recv_wr = 1;
    a.cap.max_send_sge = 1;
    a.cap.max_recv_sge = 1;
    a.cap.max_inline_data = 0;
    a.qp_type = sys::IBV_QPT_RC;
    a.sq_sig_all = 0;
    Ok(a)
}

/// RESET → INIT: `port`, P_Key index 0, [`QP_ACCESS`].
pub fn init(port: u8) -> (sys::ibv_qp_attr, u32) {
    let mut a = sys::ibv_qp_attr::default();
    a.qp_state = sys::IBV_QPS_INIT;
    a.pkey_index = 0;
    a.port_num = port;
    a.qp_access_flags = QP_ACCESS;
    (a, sys::IBV_QP_STATE | sys::IBV_QP_PKEY_INDEX | sys::IBV_QP_PORT | sys::IBV_QP_ACCESS_FLAGS)
}

/// INIT → RTR towards `remote`, from `local` on `port`: path MTU the smaller of the two ends' active MTUs,
/// the peer's QPN and first PSN, `max_dest_rd_atomic` (READs/atomics the peer may have outstanding at this
/// responder; the device's `max_qp_rd_atom`), [`MIN_RNR_TIMER`], and the address vector: on InfiniBand the
/// peer's LID (no GRH: one subnet); on RoCE (Ethernet) a GRH to the peer's GID from local GID index
/// `local.gid_index`, [`HOP_LIMIT`].
///
/// # Errors
/// [`Error::InvalidArgument`] when the two ends' link layers differ, or an InfiniBand peer has LID 0.
pub fn rtr(local: &Endpoint, remote: &Endpoint, port: u8, max_dest_rd_atomic: u8) -> Result<(sys::ibv_qp_attr, u32)> {
    if local.link != remote.link {
        return Err(Error::InvalidArgument(format!(
            "local port is {:?}, the peer's is {:?}: both ends of an RC QP need the same link layer",
            local.link, remote.link
        )));
    }
    let mut a = sys::ibv_qp_attr::default();
    a.qp_state = sys::IBV_QPS_RTR;
    a.path_mtu = local.mtu.min(remote.mtu) as sys::ibv_mtu;
    a.dest_qp_num = remote.qpn;
    a.rq_psn = remote.psn;
    a.max_dest_rd_atomic = max_dest_rd_atomic;
    a.min_rnr_timer = MIN_RNR_TIMER;
    a.ah_attr.port_num = port;
    a.ah_attr.sl = 0;
    a.ah_attr.src_path_bits = 0;
    match remote.link {
        LinkLayer::InfiniBand => {
            if remote.lid == 0 {
                return Err(Error::InvalidArgument(format!(
                    "the peer QP {:#x} is on InfiniBand with LID 0 (is its port active and its subnet manager up?)",
                    remote.qpn
                )));
            }
            a.ah_attr.dlid = remote.lid;
            a.ah_attr.is_global = 0;
        }
        LinkLayer::Ethernet => {
            a.ah_attr.dlid = 0;
            a.ah_attr.is_global = 1;
            a.ah_attr.grh.dgid.raw = remote.gid;
            a.ah_attr.grh.sgid_index = local.gid_index;
            a.ah_attr.grh.hop_limit = HOP_LIMIT;
            a.ah_attr.grh.traffic_class = 0;
            a.ah_attr.grh.flow_label = 0;
        }
    }
    let mask = sys::IBV_QP_STATE
        | sys::IBV_QP_AV
        | sys::IBV_QP_PATH_MTU
        | sys::IBV_QP_DEST_QPN
        | sys::IBV_QP_RQ_PSN
        | sys::IBV_QP_MAX_DEST_RD_ATOMIC
        | sys::IBV_QP_MIN_RNR_TIMER;
    Ok((a, mask))
}

/// RTR → RTS: this QP's first PSN `sq_psn` (what the peer got as our endpoint's `psn`), [`ACK_TIMEOUT`],
/// [`RETRY_CNT`], [`RNR_RETRY`], and `max_rd_atomic` (READs/atomics this requester keeps outstanding; the
/// device's `max_qp_init_rd_atom`).
pub fn rts(sq_psn: u32, max_rd_atomic: u8) -> (sys::ibv_qp_attr, u32) {
    let mut a = sys::ibv_qp_attr::default();
    a.qp_state = sys::IBV_QPS_RTS;
    a.sq_psn = sq_psn;
    a.timeout = ACK_TIMEOUT;
    a.retry_cnt = RETRY_CNT;
    a.rnr_retry = RNR_RETRY;
    a.max_rd_atomic = max_rd_atomic;
    let mask = sys::IBV_QP_STATE
        | sys::IBV_QP_SQ_PSN
        | sys::IBV_QP_TIMEOUT
        | sys::IBV_QP_RETRY_CNT
        | sys::IBV_QP_RNR_RETRY
        | sys::IBV_QP_MAX_QP_RD_ATOMIC;
    (a, mask)
}

/// Any state → ERR (a connect that failed after RESET → INIT): `qp_state` alone.
pub fn err() -> (sys::ibv_qp_attr, u32) {
    let mut a = sys::ibv_qp_attr::default();
    a.qp_state = sys::IBV_QPS_ERR;
    (a, sys::IBV_QP_STATE)
}

/// The device's limit of outstanding RDMA READs/atomics (`max_qp_rd_atom` or `max_qp_init_rd_atom`, an `int`)
/// as the `u8` of `ibv_qp_attr`, at least 1 (atomics need one) and at most 255.
pub fn rd_atomic(limit: i32) -> u8 {
    limit.clamp(1, 255) as u8
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nic::mlx5::endpoint::Mtu;

    fn ep(link: LinkLayer, qpn: u32, mtu: Mtu) -> Endpoint {
        Endpoint {
            link,
            qpn,
            psn: 0x12_3456,
            lid: 0x2a,
            gid: [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8],
            gid_index: 3,
            mtu,
        }
    }

    /// Bytes of an attribute struct, to check that what a builder did not set is zero.
    fn bytes<T>(v: &T) -> Vec<u8> {
        // SAFETY: the verbs attribute structs are plain C data; padding was zeroed by `Default` (zeroed) and no
        // field was written through a path that leaves padding undefined.
        unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), size_of::<T>()) }.to_vec()
    }

    #[test]
    fn access_bits_are_the_headers() {
        assert_eq!(mr_access(Access::LOCAL_WRITE).unwrap(), sys::IBV_ACCESS_LOCAL_WRITE);
        assert_eq!(mr_access(Access::REMOTE_WRITE).unwrap(), sys::IBV_ACCESS_REMOTE_WRITE);
        assert_eq!(mr_access(Access::REMOTE_READ).unwrap(), sys::IBV_ACCESS_REMOTE_READ);
        assert_eq!(mr_access(Access::REMOTE_ATOMIC).unwrap(), sys::IBV_ACCESS_REMOTE_ATOMIC);
        assert_eq!(mr_access(Access::ALL).unwrap(), 1 | 2 | 4 | 8);
        assert_eq!(mr_access(Access::NONE).unwrap(), 0);
        assert_eq!(QP_ACCESS, 2 | 4 | 8);
    }

    #[test]
    fn cq_request_gives_exact_power_of_two_rings() {
        assert_eq!(cq_request(64, 4_194_303).unwrap(), 63);
        assert_eq!(cq_request(2, 1).unwrap(), 1);
        assert_eq!(cq_request(1 << 22, (1 << 22) - 1).unwrap(), (1 << 22) - 1);
        assert!(cq_request(1 << 23, (1 << 22) - 1).is_err());
        assert!(cq_request(48, 1 << 22).is_err());
        assert!(cq_request(1, 1 << 22).is_err());
        assert!(cq_request(0, 1 << 22).is_err());
    }

    #[test]
    fn qp_init_attr_is_rc_one_sge_no_inline() {
        let cq = 0x1000 as *mut sys::ibv_cq;
        let a = qp_init_attr(cq, 64, 32768).unwrap();
        assert_eq!((a.send_cq, a.recv_cq), (cq, cq));
        assert_eq!((a.cap.max_send_wr, a.cap.max_send_sge, a.cap.max_inline_data), (64, 1, 0));
        assert_eq!((a.cap.max_recv_wr, a.cap.max_recv_sge), (1, 1));
        assert_eq!(a.qp_type, 2, "IBV_QPT_RC is 2 in verbs.h");
        assert_eq!(a.sq_sig_all, 0);
        assert!(a.srq.is_null() && a.qp_context.is_null());
        assert!(qp_init_attr(cq, 8, 32768).is_err());
        assert!(qp_init_attr(cq, 100, 32768).is_err());
        assert!(qp_init_attr(cq, 65536, 32768).is_err());
    }

    /// Device code posts only to rings of 16 ..= 32768 WQEBBs (`gdaki_device::sq::valid_ring`): a device whose
    /// `max_qp_wr` (or DevX `2^log_max_qp_sz`) is larger does not make a larger ring usable, and the DevX path
    /// has no lower bound of its own.
    #[test]
    fn sq_sizes_are_the_ones_device_code_posts_to() {
        let cq = 0x1000 as *mut sys::ibv_cq;
        assert_eq!(sq_log2(16, 1 << 20).unwrap(), 4);
        assert_eq!(sq_log2(32768, 1 << 20).unwrap(), 15);
        for w in [0, 1, 2, 4, 8, 24, 65536, 1 << 20, 1 << 31, u32::MAX] {
            let e = sq_log2(w, 1 << 20).unwrap_err().to_string();
            assert!(e.contains(&format!("wqe_cnt {w} ")) && e.contains("16..=32768"), "{e}");
            assert!(qp_init_attr(cq, w, 1 << 20).is_err(), "{w} WQEBBs on a device of max_qp_wr 2^20");
        }
        // The device's limit, where it is the smaller one.
        assert_eq!(sq_log2(64, 64).unwrap(), 6);
        let e = sq_log2(128, 64).unwrap_err().to_string();
        assert!(e.contains("16..=64"), "{e}");
        // A device limit below device code's smallest ring leaves no size at all.
        assert!(sq_log2(16, 8).is_err());
    }

    #[test]
    fn init_sets_exactly_its_attributes() {
        let (a, mask) = init(1);
        // IBV_QP_STATE 1, PKEY_INDEX 16, PORT 32, ACCESS_FLAGS 8 (verbs.h enum ibv_qp_attr_mask).
        assert_eq!(mask, 1 | 8 | 16 | 32);
        assert_eq!((a.qp_state, a.port_num, a.pkey_index, a.qp_access_flags), (1, 1, 0, 14));
        let mut expect = sys::ibv_qp_attr::default();
        expect.qp_state = 1;
        expect.port_num = 1;
        expect.qp_access_flags = 14;
        assert_eq!(bytes(&a), bytes(&expect), "nothing else set");
    }

    #[test]
    fn err_sets_the_state_alone() {
        let (a, mask) = err();
        assert_eq!(mask, 1, "IBV_QP_STATE");
        let mut expect = sys::ibv_qp_attr::default();
        expect.qp_state = 6; // IBV_QPS_ERR
        assert_eq!(bytes(&a), bytes(&expect), "nothing else set");
    }

    #[test]
    fn rtr_on_infiniband_uses_the_lid_and_no_grh() {
        let local = ep(LinkLayer::InfiniBand, 0x100, Mtu::M4096);
        let mut remote = ep(LinkLayer::InfiniBand, 0x200, Mtu::M2048);
        remote.lid = 7;
        let (a, mask) = rtr(&local, &remote, 1, 16).unwrap();
        // STATE 1, AV 128, PATH_MTU 256, RQ_PSN 4096, MAX_DEST_RD_ATOMIC 131072, MIN_RNR_TIMER 32768,
        // DEST_QPN 1048576.
        assert_eq!(mask, 1 | 128 | 256 | 4096 | 32768 | 131072 | 1048576);
        assert_eq!(a.qp_state, 2, "IBV_QPS_RTR");
        assert_eq!(a.path_mtu, 4, "the smaller MTU: IBV_MTU_2048 = 4");
        assert_eq!((a.dest_qp_num, a.rq_psn), (0x200, 0x12_3456));
        assert_eq!((a.max_dest_rd_atomic, a.min_rnr_timer), (16, 12));
        assert_eq!((a.ah_attr.dlid, a.ah_attr.is_global, a.ah_attr.port_num), (7, 0, 1));
        // SAFETY: reading the raw bytes of a zeroed union.
        assert_eq!(unsafe { a.ah_attr.grh.dgid.raw }, [0; 16]);
        remote.lid = 0;
        assert!(rtr(&local, &remote, 1, 16).is_err(), "LID 0 is no address");
    }

    #[test]
    fn rtr_on_roce_uses_a_grh_to_the_gid() {
        let local = ep(LinkLayer::Ethernet, 0x100, Mtu::M1024);
        let mut remote = ep(LinkLayer::Ethernet, 0x200, Mtu::M4096);
        remote.gid = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 2];
        remote.lid = 0;
        let (a, _) = rtr(&local, &remote, 2, 8).unwrap();
        assert_eq!(a.path_mtu, 3, "IBV_MTU_1024 = 3");
        assert_eq!((a.ah_attr.is_global, a.ah_attr.dlid, a.ah_attr.port_num), (1, 0, 2));
        // SAFETY: `raw` is the union member the builder wrote.
        assert_eq!(unsafe { a.ah_attr.grh.dgid.raw }, remote.gid);
        assert_eq!((a.ah_attr.grh.sgid_index, a.ah_attr.grh.hop_limit), (3, 255), "local GID index");
        let ib = ep(LinkLayer::InfiniBand, 0x200, Mtu::M4096);
        assert!(rtr(&local, &ib, 1, 8).is_err(), "mixed link layers");
    }

    #[test]
    fn rts_sets_psn_timeouts_and_retries() {
        let (a, mask) = rts(0xab_cdef, 16);
        // STATE 1, TIMEOUT 512, RETRY_CNT 1024, RNR_RETRY 2048, SQ_PSN 65536, MAX_QP_RD_ATOMIC 8192.
        assert_eq!(mask, 1 | 512 | 1024 | 2048 | 8192 | 65536);
        assert_eq!((a.qp_state, a.sq_psn, a.max_rd_atomic), (3, 0xab_cdef, 16));
        assert_eq!((a.timeout, a.retry_cnt, a.rnr_retry), (14, 7, 7));
        assert_eq!(a.rq_psn, 0);
    }

    #[test]
    fn rd_atomic_clamps() {
        assert_eq!((rd_atomic(16), rd_atomic(0), rd_atomic(-1), rd_atomic(1000)), (16, 1, 1, 255));
    }
}
