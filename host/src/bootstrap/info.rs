//! The records ranks exchange to connect QPs and reach each other's memory, as plain bytes
//! ([`bytemuck::Pod`]) for [`Bootstrap::all_gather_pod`](super::Bootstrap::all_gather_pod) and
//! [`send_pod`](super::Bootstrap::send_pod). Fields are in the host's byte order, which is little-endian on
//! every host gdaki builds for; explicit `reserved` fields leave no padding, so every byte is defined.

use bytemuck::{Pod, Zeroable};

/// What a peer needs to connect its RC QP to ours (as `ibv_qp_attr`'s `dest_qp_num`/`rq_psn` and, for the
/// emulated NIC, which NIC to reach): 32 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct QpInfo {
    /// Identifier of the NIC the QP lives on (the emulated NIC's id; 0 where the transport does not need it).
    pub nic: u64,
    /// QP number (24 bits).
    pub qpn: u32,
    /// First packet sequence number this QP sends with (24 bits): the peer's receive PSN at RTR.
    pub psn: u32,
    /// Address of the send-queue ring, where the peer's side needs it (e.g. a NIC that serves both ends);
    /// 0 otherwise.
    pub sq_addr: u64,
    /// Address of the completion-queue ring, where the peer's side needs it; 0 otherwise.
    pub cq_addr: u64,
}

/// What a peer needs to RDMA into one of our memory regions (the remote half of a WQE's raddr segment):
/// 24 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct MrInfo {
    /// Address of the region's first byte, as the peer puts it in the raddr segment.
    pub addr: u64,
    /// Length of the region in bytes.
    pub len: u64,
    /// Remote key of the region.
    pub rkey: u32,
    /// Zero; keeps the record free of padding.
    pub reserved: u32,
}

const _: () = assert!(size_of::<QpInfo>() == 32);
const _: () = assert!(size_of::<MrInfo>() == 24);
