//! GID selection: which entry of a port's GID table a QP sends from (`sgid_index`), as a pure function of the
//! table (`ibv_query_gid_table`), so that the rule is tested without a NIC.
//!
//! On InfiniBand the GID is not used for addressing within a subnet (the LID is), so the port GID (index 0) is
//! taken. On RoCE the GID is the packet's source IP address: the entry must be RoCE v2 (routable UDP/IP,
//! what RoCE fabrics run; RoCE v1 is layer 2 only), and among those an IPv4-mapped address
//! (`::ffff:a.b.c.d`) is preferred, then a global IPv6 address, then a link-local one (`fe80::/10`), each the
//! lowest index of its kind: NCCL's and perftest's order.

use super::endpoint::LinkLayer;
use crate::{Error, Result};

/// The type of a GID table entry (`enum ibv_gid_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GidType {
    /// `IBV_GID_TYPE_IB`.
    Ib,
    /// `IBV_GID_TYPE_ROCE_V1`.
    RoceV1,
    /// `IBV_GID_TYPE_ROCE_V2`.
    RoceV2,
}

impl GidType {
    /// From `ibv_gid_entry.gid_type`.
    pub fn from_verbs(v: u32) -> Option<Self> {
        match v {
            gdaki_mlx5_sys::IBV_GID_TYPE_IB => Some(Self::Ib),
            gdaki_mlx5_sys::IBV_GID_TYPE_ROCE_V1 => Some(Self::RoceV1),
            gdaki_mlx5_sys::IBV_GID_TYPE_ROCE_V2 => Some(Self::RoceV2),
            _ => None,
        }
    }
}

/// One valid entry of a port's GID table (`struct ibv_gid_entry`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GidEntry {
    /// Index in the table (`gid_index`): the QP's `sgid_index`.
    pub index: u32,
    /// The GID, network byte order.
    pub gid: [u8; 16],
    /// Its type.
    pub kind: GidType,
    /// Network device the entry belongs to (`ndev_ifindex`; RoCE), 0 for none.
    pub ifindex: u32,
}

impl GidEntry {
    /// The GID as an IPv6 address (RoCE GIDs are IP addresses; an IPv4 one is IPv4-mapped).
    pub fn ip(&self) -> std::net::Ipv6Addr {
        std::net::Ipv6Addr::from(self.gid)
    }
}

/// Picks the GID a QP on a port with link layer `link` sends from: `wanted` if given (it must be in `table`,
/// and on Ethernet be RoCE v2), else by the rule of the module's documentation. Entries with an all-zero GID
/// are never picked.
///
/// # Errors
/// [`Error::InvalidArgument`] for a `wanted` index that is not in the table or not RoCE v2 on Ethernet;
/// [`Error::Unavailable`] when the table has no usable entry (e.g. a RoCE port with no IP address).
pub fn select(table: &[GidEntry], link: LinkLayer, wanted: Option<u32>) -> Result<GidEntry> {
    let usable = |e: &&GidEntry| e.gid != [0; 16];
    if let Some(w) = wanted {
        let e = table.iter().filter(usable).find(|e| e.index == w).ok_or_else(|| {
            Error::InvalidArgument(format!("GID index {w} is not a valid entry of the port's GID table"))
        })?;
        if link == LinkLayer::Ethernet && e.kind != GidType::RoceV2 {
            return Err(Error::InvalidArgument(format!(
                "GID index {w} is {:?}; gdaki connects RoCE QPs with RoCE v2 GIDs only",
                e.kind
            )));
        }
        return Ok(*e);
    }
    let found = match link {
        LinkLayer::InfiniBand => table.iter().filter(usable).min_by_key(|e| e.index),
        LinkLayer::Ethernet => {
            let rank = |e: &GidEntry| {
                let ip = e.ip();
                if ip.to_ipv4_mapped().is_some() {
                    0
                } else if ip.is_unicast_link_local() {
                    2
                } else {
                    1
                }
            };
            table.iter().filter(usable).filter(|e| e.kind == GidType::RoceV2).min_by_key(|e| (rank(e), e.index))
        }
    };
    found.copied().ok_or_else(|| {
        Error::Unavailable(match link {
            LinkLayer::InfiniBand => "the port's GID table is empty".into(),
            LinkLayer::Ethernet => {
                "the RoCE port has no RoCE v2 GID (gdaki sends from RoCE v2 GIDs only: give its network \
                 interface an IP address)"
                    .into()
            }
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(index: u32, kind: GidType, gid: [u8; 16]) -> GidEntry {
        GidEntry { index, gid, kind, ifindex: 4 }
    }

    const LINK_LOCAL: [u8; 16] = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x02, 0x11, 0x22, 0xff, 0xfe, 0x33, 0x44, 0x55];
    const V4: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 1, 2, 3];
    const GLOBAL6: [u8; 16] = [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9];

    /// The usual table of a RoCE port with one IPv4 address: RoCE v1 and v2 pairs for the link-local address
    /// and the IPv4 one.
    fn roce_table() -> Vec<GidEntry> {
        vec![
            entry(0, GidType::RoceV1, LINK_LOCAL),
            entry(1, GidType::RoceV2, LINK_LOCAL),
            entry(2, GidType::RoceV1, V4),
            entry(3, GidType::RoceV2, V4),
        ]
    }

    #[test]
    fn roce_prefers_v2_ipv4() {
        assert_eq!(select(&roce_table(), LinkLayer::Ethernet, None).unwrap().index, 3);
    }

    #[test]
    fn roce_then_global_ipv6_then_link_local() {
        let mut t = roce_table();
        t.retain(|e| e.gid != V4);
        assert_eq!(select(&t, LinkLayer::Ethernet, None).unwrap().index, 1, "only link-local v2 left");
        t.push(entry(7, GidType::RoceV2, GLOBAL6));
        assert_eq!(select(&t, LinkLayer::Ethernet, None).unwrap().index, 7, "global before link-local");
        t.push(entry(9, GidType::RoceV2, V4));
        assert_eq!(select(&t, LinkLayer::Ethernet, None).unwrap().index, 9, "IPv4 before IPv6");
    }

    #[test]
    fn roce_never_picks_v1_or_zero() {
        let t = vec![entry(0, GidType::RoceV1, V4), entry(1, GidType::RoceV2, [0; 16])];
        assert!(matches!(select(&t, LinkLayer::Ethernet, None), Err(Error::Unavailable(_))));
        assert!(matches!(select(&[], LinkLayer::Ethernet, None), Err(Error::Unavailable(_))));
    }

    /// A RoCE port without a RoCE v2 GID has no index `--nic DEVICE:PORT:GID_INDEX` could name (a wanted index
    /// must be RoCE v2 too), so the error must not send the user there.
    #[test]
    fn no_roce_v2_gid_is_not_fixed_by_a_gid_index() {
        let t = vec![entry(0, GidType::RoceV1, LINK_LOCAL), entry(1, GidType::RoceV1, V4)];
        for i in 0..4 {
            assert!(matches!(select(&t, LinkLayer::Ethernet, Some(i)), Err(Error::InvalidArgument(_))), "{i}");
        }
        let e = select(&t, LinkLayer::Ethernet, None).unwrap_err().to_string();
        assert!(e.contains("no RoCE v2 GID") && e.contains("IP address"), "{e}");
        assert!(!e.contains("GID_INDEX") && !e.contains("GID index"), "advice that cannot work: {e}");
    }

    #[test]
    fn infiniband_takes_the_lowest_index() {
        let port_gid = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x50, 0x6b, 0x4b, 0x03, 0, 0x12, 0x34, 0x56];
        let t = vec![entry(1, GidType::Ib, GLOBAL6), entry(0, GidType::Ib, port_gid)];
        let e = select(&t, LinkLayer::InfiniBand, None).unwrap();
        assert_eq!((e.index, e.gid), (0, port_gid));
    }

    #[test]
    fn wanted_index_is_checked() {
        let t = roce_table();
        assert_eq!(select(&t, LinkLayer::Ethernet, Some(1)).unwrap().gid, LINK_LOCAL);
        assert!(matches!(select(&t, LinkLayer::Ethernet, Some(2)), Err(Error::InvalidArgument(_))), "RoCE v1");
        assert!(matches!(select(&t, LinkLayer::Ethernet, Some(8)), Err(Error::InvalidArgument(_))), "absent");
        assert_eq!(select(&t, LinkLayer::InfiniBand, Some(2)).unwrap().index, 2, "any type on InfiniBand");
    }

    #[test]
    fn gid_types_are_the_headers() {
        assert_eq!(GidType::from_verbs(0), Some(GidType::Ib));
        assert_eq!(GidType::from_verbs(1), Some(GidType::RoceV1));
        assert_eq!(GidType::from_verbs(2), Some(GidType::RoceV2));
        assert_eq!(GidType::from_verbs(3), None);
    }
}
