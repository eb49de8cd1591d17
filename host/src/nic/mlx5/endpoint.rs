//! What RC peers on real NICs exchange before connecting (the QP info of `ibv_modify_qp`'s RTR and RTS
//! attributes): link layer, QPN, first PSN, LID, GID and active MTU, and its fixed byte form.

use crate::{Error, Result};

/// A port's link layer (`ibv_port_attr.link_layer`): how peers are addressed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LinkLayer {
    /// InfiniBand: peers are addressed by LID (`IBV_LINK_LAYER_INFINIBAND`).
    InfiniBand,
    /// Ethernet (RoCE): peers are addressed by GID, in a GRH (`IBV_LINK_LAYER_ETHERNET`).
    Ethernet,
}

impl LinkLayer {
    /// From `ibv_port_attr.link_layer`; `IBV_LINK_LAYER_UNSPECIFIED` (0) is InfiniBand, as verbs documents
    /// for old kernels.
    pub fn from_verbs(v: u8) -> Option<Self> {
        match v {
            0 | 1 => Some(Self::InfiniBand),
            2 => Some(Self::Ethernet),
            _ => None,
        }
    }
}

/// A path MTU (`enum ibv_mtu`: `IBV_MTU_256` = 1 … `IBV_MTU_4096` = 5). Ordered by size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum Mtu {
    /// 256 bytes.
    M256 = 1,
    /// 512 bytes.
    M512 = 2,
    /// 1024 bytes.
    M1024 = 3,
    /// 2048 bytes.
    M2048 = 4,
    /// 4096 bytes.
    M4096 = 5,
}

impl Mtu {
    /// From an `enum ibv_mtu` value.
    pub fn from_verbs(v: u32) -> Option<Self> {
        Some(match v {
            1 => Self::M256,
            2 => Self::M512,
            3 => Self::M1024,
            4 => Self::M2048,
            5 => Self::M4096,
            _ => return None,
        })
    }

    /// Payload bytes per packet.
    pub fn bytes(self) -> u32 {
        128 << self as u32
    }
}

/// One end of an RC connection on a real NIC.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Endpoint {
    /// The port's link layer; both ends must have the same.
    pub link: LinkLayer,
    /// QP number (24 bits).
    pub qpn: u32,
    /// First PSN of this QP's requests (24 bits): its `sq_psn`, the peer's `rq_psn`.
    pub psn: u32,
    /// The port's LID (InfiniBand; 0 on Ethernet).
    pub lid: u16,
    /// The GID this QP sends from (RoCE: the peer's `dgid`), network byte order.
    pub gid: [u8; 16],
    /// Index of `gid` in its port's GID table: this QP's own `sgid_index` (meaningless to the peer).
    pub gid_index: u8,
    /// The port's active MTU; the connection uses the smaller of the two ends'.
    pub mtu: Mtu,
}

/// Bytes of [`Endpoint::to_bytes`].
pub const ENDPOINT_BYTES: usize = 32;

impl Endpoint {
    /// A fixed 32-byte encoding: link (1 = InfiniBand, 2 = Ethernet), MTU, LID (LE), QPN (LE), PSN (LE),
    /// GID index, 3 zero bytes, GID (16 bytes as on the wire).
    pub fn to_bytes(&self) -> [u8; ENDPOINT_BYTES] {
        let mut b = [0u8; ENDPOINT_BYTES];
        b[0] = match self.link {
            LinkLayer::InfiniBand => 1,
            LinkLayer::Ethernet => 2,
        };
        b[1] = self.mtu as u8;
        b[2..4].copy_from_slice(&self.lid.to_le_bytes());
        b[4..8].copy_from_slice(&self.qpn.to_le_bytes());
        b[8..12].copy_from_slice(&self.psn.to_le_bytes());
        b[12] = self.gid_index;
        b[16..32].copy_from_slice(&self.gid);
        b
    }

    /// Decodes [`Endpoint::to_bytes`].
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for another length, an unknown link layer or MTU, a QPN or PSN over 24 bits,
    /// or nonzero padding.
    pub fn from_bytes(b: &[u8]) -> Result<Self> {
        let bad = |what: &str| Error::InvalidArgument(format!("mlx5 endpoint bytes: {what}"));
        let b: &[u8; ENDPOINT_BYTES] =
            b.try_into().map_err(|_| bad(&format!("{} bytes, not {ENDPOINT_BYTES}", b.len())))?;
        let link = match b[0] {
            1 => LinkLayer::InfiniBand,
            2 => LinkLayer::Ethernet,
            v => return Err(bad(&format!("unknown link layer {v}"))),
        };
        let mtu = Mtu::from_verbs(b[1].into()).ok_or_else(|| bad(&format!("unknown MTU code {}", b[1])))?;
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let (qpn, psn) = (u32_at(4), u32_at(8));
        if qpn > 0x00ff_ffff || psn > 0x00ff_ffff {
            return Err(bad("QPN or PSN over 24 bits"));
        }
        if b[13..16] != [0; 3] {
            return Err(bad("padding not zero"));
        }
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[16..32]);
        Ok(Self { link, qpn, psn, lid: u16::from_le_bytes([b[2], b[3]]), gid, gid_index: b[12], mtu })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn mtu_codes_and_sizes() {
        assert_eq!(Mtu::from_verbs(5).map(Mtu::bytes), Some(4096));
        assert_eq!(Mtu::from_verbs(1).map(Mtu::bytes), Some(256));
        assert_eq!(Mtu::from_verbs(0), None);
        assert_eq!(Mtu::from_verbs(6), None);
        assert!(Mtu::M1024 < Mtu::M4096);
    }

    #[cfg(feature = "mlx5")]
    #[test]
    fn link_layer_codes() {
        assert_eq!(LinkLayer::from_verbs(gdaki_mlx5_sys::IBV_LINK_LAYER_INFINIBAND as u8), Some(LinkLayer::InfiniBand));
        assert_eq!(LinkLayer::from_verbs(gdaki_mlx5_sys::IBV_LINK_LAYER_ETHERNET as u8), Some(LinkLayer::Ethernet));
        assert_eq!(
            LinkLayer::from_verbs(gdaki_mlx5_sys::IBV_LINK_LAYER_UNSPECIFIED as u8),
            Some(LinkLayer::InfiniBand)
        );
        assert_eq!(LinkLayer::from_verbs(3), None);
    }

    #[test]
    fn known_bytes() {
        let e = Endpoint {
            link: LinkLayer::Ethernet,
            qpn: 0x00ab_cdef,
            psn: 0x12_3456,
            lid: 0x0102,
            gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 168, 1, 7],
            gid_index: 3,
            mtu: Mtu::M1024,
        };
        let b = e.to_bytes();
        assert_eq!(&b[..16], &[2, 3, 0x02, 0x01, 0xef, 0xcd, 0xab, 0, 0x56, 0x34, 0x12, 0, 3, 0, 0, 0]);
        assert_eq!(&b[28..], &[192, 168, 1, 7]);
        assert_eq!(Endpoint::from_bytes(&b).unwrap(), e);
    }

    proptest! {
        #[test]
        fn round_trip(link in prop_oneof![Just(LinkLayer::InfiniBand), Just(LinkLayer::Ethernet)],
                      mtu in 1u32..=5, qpn in 0u32..1 << 24, psn in 0u32..1 << 24, lid: u16,
                      gid: [u8; 16], gid_index: u8) {
            let e = Endpoint { link, qpn, psn, lid, gid, gid_index, mtu: Mtu::from_verbs(mtu).unwrap() };
            prop_assert_eq!(Endpoint::from_bytes(&e.to_bytes()).unwrap(), e);
        }

        #[test]
        fn any_bytes_decode_or_fail_cleanly(b in proptest::collection::vec(any::<u8>(), 0..40)) {
            if let Ok(e) = Endpoint::from_bytes(&b) {
                prop_assert_eq!(e.to_bytes().to_vec(), b);
            }
        }
    }
}
