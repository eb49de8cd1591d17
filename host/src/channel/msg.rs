//! The bytes ranks exchange through the bootstrap to set up channels: a 8-byte header (magic `"GDCH"`,
//! version, kind; little-endian) and a fixed body per kind. The kind tells a `connect` from a `send_memory`
//! or a `semaphore` on the same peer and tag, so that calls that do not pair up fail with a message that says
//! so instead of misreading each other's bytes.

use gdaki_shared::handle::RemoteMr;

use crate::nic::{Endpoint, ENDPOINT_BYTES};
use crate::{Error, Result};

const MAGIC: [u8; 4] = *b"GDCH";
const VERSION: u16 = 1;
const HEADER: usize = 8;
const MR_BYTES: usize = std::mem::size_of::<RemoteMr>();

/// What a message carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    /// `connect`: transport, mode and the QP's endpoint.
    Endpoint = 1,
    /// `send_memory`: a registered region.
    Memory = 2,
    /// `semaphore`: the sender's inbound semaphore word and the QPN of the connection it belongs to.
    Semaphore = 3,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Self::Endpoint => "a connection endpoint (connect)",
            Self::Memory => "a registered memory (send_memory)",
            Self::Semaphore => "a semaphore (semaphore)",
        }
    }

    fn from_u16(v: u16) -> Option<Self> {
        match v {
            1 => Some(Self::Endpoint),
            2 => Some(Self::Memory),
            3 => Some(Self::Semaphore),
            _ => None,
        }
    }

    fn body_len(self) -> usize {
        match self {
            Self::Endpoint => 8 + ENDPOINT_BYTES,
            Self::Memory => MR_BYTES,
            Self::Semaphore => MR_BYTES + 8,
        }
    }
}

fn header(kind: Kind) -> Vec<u8> {
    let mut b = Vec::with_capacity(HEADER + kind.body_len());
    b.extend_from_slice(&MAGIC);
    b.extend_from_slice(&VERSION.to_le_bytes());
    b.extend_from_slice(&(kind as u16).to_le_bytes());
    b
}

/// A `connect` message: transport code, mode code, 6 zero bytes, the endpoint.
pub(super) fn endpoint(transport: u8, mode: u8, ep: &Endpoint) -> Vec<u8> {
    let mut b = header(Kind::Endpoint);
    b.extend_from_slice(&[transport, mode, 0, 0, 0, 0, 0, 0]);
    b.extend_from_slice(&ep.to_bytes());
    b
}

/// A `send_memory` message.
pub(super) fn memory(mr: &RemoteMr) -> Vec<u8> {
    let mut b = header(Kind::Memory);
    b.extend_from_slice(bytemuck::bytes_of(mr));
    b
}

/// A `semaphore` message: the inbound word and the sender's QPN (as `u64`, little-endian).
pub(super) fn semaphore(inbound: &RemoteMr, qpn: u32) -> Vec<u8> {
    let mut b = header(Kind::Semaphore);
    b.extend_from_slice(bytemuck::bytes_of(inbound));
    b.extend_from_slice(&u64::from(qpn).to_le_bytes());
    b
}

/// Checks the header and length of a message from `peer` with `tag` that should be of kind `want`; returns
/// its body. Errors are [`Error::InvalidArgument`], one line, naming the peer, the tag and what was wrong.
pub(super) fn body(bytes: &[u8], want: Kind, peer: u32, tag: u32) -> Result<&[u8]> {
    let bad = |what: String| {
        Error::InvalidArgument(format!("channel: rank {peer} tag {tag}: expected {}, {what}", want.name()))
    };
    if bytes.len() < HEADER || bytes[..4] != MAGIC {
        return Err(bad(format!(
            "received {} bytes that are not a gdaki channel message (the peer used this tag for something else?)",
            bytes.len()
        )));
    }
    let version = u16::from_le_bytes([bytes[4], bytes[5]]);
    if version != VERSION {
        return Err(bad(format!("received protocol version {version}, this rank speaks {VERSION}")));
    }
    let kind = u16::from_le_bytes([bytes[6], bytes[7]]);
    match Kind::from_u16(kind) {
        Some(k) if k == want => {}
        Some(k) => {
            return Err(bad(format!(
                "received {} (the two ranks' calls with this peer and tag do not pair up)",
                k.name()
            )))
        }
        None => return Err(bad(format!("received a message of unknown kind {kind}"))),
    }
    let body = &bytes[HEADER..];
    if body.len() != want.body_len() {
        return Err(bad(format!("received {} bytes, not {}", bytes.len(), HEADER + want.body_len())));
    }
    Ok(body)
}

/// Decodes a `connect` body: transport code, mode code, endpoint.
pub(super) fn parse_endpoint(body: &[u8]) -> Result<(u8, u8, Endpoint)> {
    if body[2..8] != [0; 6] {
        return Err(Error::InvalidArgument("channel: endpoint message with nonzero padding".into()));
    }
    Ok((body[0], body[1], Endpoint::from_bytes(&body[8..])?))
}

/// Decodes a `send_memory` body.
pub(super) fn parse_memory(body: &[u8]) -> RemoteMr {
    bytemuck::pod_read_unaligned(body)
}

/// Decodes a `semaphore` body: the inbound word and the sender's QPN.
pub(super) fn parse_semaphore(body: &[u8]) -> Result<(RemoteMr, u32)> {
    let mr = bytemuck::pod_read_unaligned(&body[..MR_BYTES]);
    let mut q = [0u8; 8];
    q.copy_from_slice(&body[MR_BYTES..]);
    let qpn = u32::try_from(u64::from_le_bytes(q))
        .map_err(|_| Error::InvalidArgument("channel: semaphore message with a QPN over 32 bits".into()))?;
    Ok((mr, qpn))
}

#[cfg(test)]
mod tests {
    use super::*;
    use gdaki_shared::Be32;

    fn mr() -> RemoteMr {
        RemoteMr { addr: 0x1234_5678_9000, length: 4096, rkey: Be32::new(0xab01), pad: 0 }
    }

    #[test]
    fn channel_msg_round_trips() {
        let wire = Some("127.0.0.1:4000".parse().unwrap());
        let ep = Endpoint::Emu(crate::nic::emu::Endpoint { nic: 7, qpn: 0x42, psn: 0x12_3456, wire });
        let b = endpoint(0, 3, &ep);
        // Header (16 bytes) + backend byte + the emulated NIC's 40-byte endpoint.
        assert_eq!(b.len(), 57);
        assert_eq!(parse_endpoint(body(&b, Kind::Endpoint, 1, 9).unwrap()).unwrap(), (0, 3, ep));
        let b = memory(&mr());
        let got = parse_memory(body(&b, Kind::Memory, 1, 9).unwrap());
        assert_eq!((got.addr, got.length, got.rkey.get()), (mr().addr, 4096, 0xab01));
        let b = semaphore(&mr(), 0x77);
        let (got, qpn) = parse_semaphore(body(&b, Kind::Semaphore, 1, 9).unwrap()).unwrap();
        assert_eq!((got.addr, qpn), (mr().addr, 0x77));
    }

    #[test]
    fn channel_msg_rejects_what_does_not_pair_up() {
        let msg = |r: Result<&[u8]>| r.unwrap_err().to_string();
        let m = msg(body(&memory(&mr()), Kind::Endpoint, 1, 9));
        assert!(m.contains("rank 1 tag 9") && m.contains("registered memory") && m.contains("pair up"), "{m}");
        let m = msg(body(b"hello", Kind::Memory, 0, 2));
        assert!(m.contains("5 bytes") && m.contains("not a gdaki channel message"), "{m}");
        let mut long = memory(&mr());
        long.push(0);
        let m = msg(body(&long, Kind::Memory, 0, 2));
        assert!(m.contains("33 bytes, not 32"), "{m}");
        let mut v2 = memory(&mr());
        v2[4] = 2;
        assert!(msg(body(&v2, Kind::Memory, 0, 2)).contains("version 2"));
        let mut k9 = memory(&mr());
        k9[6] = 9;
        assert!(msg(body(&k9, Kind::Memory, 0, 2)).contains("unknown kind 9"));
        for m in [msg(body(&memory(&mr()), Kind::Endpoint, 1, 9)), msg(body(b"", Kind::Semaphore, 1, 9))] {
            assert!(!m.contains('\n'), "{m}");
        }
    }
}
