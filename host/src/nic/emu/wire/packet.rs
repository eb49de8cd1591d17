//! The RC packets emulated NICs exchange over a byte stream, and their encoding.
//!
//! One frame = a little-endian `u32` length of what follows, then a 40-byte header, then the payload:
//!
//! | bytes | field |
//! |---|---|
//! | 0 | kind ([`kind`]) |
//! | 1 | flags: bit 0 last packet of the message, bit 1 immediate present |
//! | 2..4 | reserved, 0 |
//! | 4..8 | PSN (24 bits), or the responder's QPN in a hello |
//! | 8..12 | rkey, or the requester's QPN in a hello |
//! | 12..16 | immediate (as carried in the WQE, wire order), syndrome and vendor syndrome in a NAK, or
//! [`HELLO_MAGIC`] |
//! | 16..24 | remote address, or the requester's NIC in a hello |
//! | 24..32 | message length (WRITE), READ length, fetch-add addend / swap value, old value, or the
//! responder's NIC in a hello |
//! | 32..40 | byte offset of this packet in its message, or the compare value of a compare-and-swap |
//!
//! As in InfiniBand RC, a WRITE or READ response longer than one packet is split ([`MAX_CHUNK`] payload
//! bytes each); unlike InfiniBand, all packets of one message carry the message's PSN (the stream is reliable
//! and ordered, so PSNs number messages). [`decode`] is a pure function of its input: any byte pattern gives
//! a packet or a [`DecodeError`], never a panic, and the payload it returns is a sub-slice of the input.

use crate::nic::emu::access::AtomicOp;

/// Header bytes after the length prefix.
pub(crate) const HEADER: usize = 40;

/// Most READ and atomic requests a requester keeps outstanding on one QP, and that a responder takes without
/// having answered them (InfiniBand's `max_rd_atomic` and `max_dest_rd_atomic`; ConnectX allows 16). The
/// responder holds a record of some 40 bytes per unanswered request until its answer has room in the outbox
/// (a READ's data is read then), so the bound caps what a requester can make it hold (about 1.3 MiB per QP).
/// It equals the deepest SQ ([`MAX_WQE_CNT`](crate::nic::emu::MAX_WQE_CNT) WQEBBs, a READ or atomic taking
/// at least one), so that it never slows a pipeline of atomics from a well-behaved requester. Part of wire
/// [`VERSION`] 1: a requester with more outstanding breaks the protocol.
pub(crate) const MAX_RD_ATOMIC: usize = crate::nic::emu::MAX_WQE_CNT as usize;

/// Largest payload of one packet, bytes (256 KiB: a frame is read into one buffer before it is decoded).
pub(crate) const MAX_CHUNK: usize = 256 * 1024;

/// Largest frame after the length prefix, bytes.
pub(crate) const MAX_FRAME: usize = HEADER + MAX_CHUNK;

/// Largest RDMA message, bytes (mlx5's `max_msg_sz`, 2^31).
pub(crate) const MAX_MESSAGE: u64 = 1 << 31;

/// PSNs are 24 bits, as in the BTH.
pub(crate) const PSN_MASK: u32 = 0x00ff_ffff;

/// "GDKW": first word of a hello, so that a stray connection is told apart from a peer NIC.
pub(crate) const HELLO_MAGIC: u32 = 0x4744_4b57;

/// Version of this encoding, carried in a hello.
pub(crate) const VERSION: u64 = 1;

/// Packet kinds (byte 0 of the header).
pub(crate) mod kind {
    /// RDMA WRITE (with or without immediate), one packet of it.
    pub const WRITE: u8 = 1;
    /// RDMA READ request.
    pub const READ: u8 = 2;
    /// Fetch-and-add.
    pub const FETCH_ADD: u8 = 3;
    /// Compare-and-swap.
    pub const COMPARE_SWAP: u8 = 4;
    /// Positive acknowledgement of every message up to the PSN.
    pub const ACK: u8 = 16;
    /// Negative acknowledgement of the message with the PSN, with the syndrome the requester reports.
    pub const NAK: u8 = 17;
    /// One packet of an RDMA READ response.
    pub const READ_RESP: u8 = 18;
    /// Atomic response: the old value.
    pub const ATOMIC_RESP: u8 = 19;
    /// Opens a connection: requester NIC and QP, responder NIC and QP.
    pub const HELLO: u8 = 32;
    /// The hello was accepted.
    pub const HELLO_ACK: u8 = 33;
    /// The hello was refused; the syndrome byte says why ([`super::reject`]).
    pub const REJECT: u8 = 34;
}

/// Why a hello was refused (carried in a [`Packet::Reject`]).
pub(crate) mod reject {
    /// No such NIC here (the hello named another NIC id).
    pub const WRONG_NIC: u8 = 1;
    /// No QP with that number on this NIC, or it was destroyed.
    pub const NO_QP: u8 = 2;
    /// The QP is not connected (back to the QP that said hello) yet: the dialer tries again.
    pub const NOT_CONNECTED: u8 = 3;
    /// The QP already has a live connection.
    pub const BUSY: u8 = 4;
    /// The hello's encoding version is not ours.
    pub const VERSION: u8 = 5;
    /// The QP is connected to another QP than the one that said hello.
    pub const OTHER_PEER: u8 = 6;
}

const FLAG_LAST: u8 = 1;
const FLAG_IMM: u8 = 2;

/// One decoded packet. Payloads borrow from the decoded buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Packet<'a> {
    /// One packet of an RDMA WRITE of `total` bytes to `raddr`: `data` goes to `raddr + offset`.
    Write { psn: u32, rkey: u32, raddr: u64, total: u64, offset: u64, imm: Option<u32>, last: bool, data: &'a [u8] },
    /// RDMA READ of `len` bytes at `raddr`.
    Read { psn: u32, rkey: u32, raddr: u64, len: u64 },
    /// An atomic on the 8-byte word at `raddr`.
    Atomic { psn: u32, rkey: u32, raddr: u64, op: AtomicOp },
    /// Every message up to and including `psn` is complete at the responder.
    Ack { psn: u32 },
    /// The message `psn` failed at the responder with `syndrome` (PRM `MLX5_CQE_SYNDROME_*`) and `vendor`.
    Nak { psn: u32, syndrome: u8, vendor: u8 },
    /// READ response data for message `psn`, to local byte `offset`.
    ReadResp { psn: u32, offset: u64, last: bool, data: &'a [u8] },
    /// Atomic response: the word's value before the operation (host order).
    AtomicResp { psn: u32, old: u64 },
    /// Opens a connection from QP `src_qpn` of NIC `src_nic` to QP `dst_qpn` of NIC `dst_nic`.
    Hello { src_nic: u64, src_qpn: u32, dst_nic: u64, dst_qpn: u32, version: u64 },
    /// The hello was accepted.
    HelloAck,
    /// The hello was refused ([`reject`]).
    Reject { why: u8 },
}

/// Why bytes are not a packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DecodeError {
    /// Fewer than [`HEADER`] bytes, or more than [`MAX_FRAME`].
    Size(usize),
    /// Unknown kind byte.
    Kind(u8),
    /// Reserved bits set, a PSN over 24 bits, a payload on a kind without one, or a payload that does not fit
    /// the message it claims to be part of.
    Field(&'static str),
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecodeError::Size(n) => write!(f, "frame of {n} bytes (must be {HEADER}..={MAX_FRAME})"),
            DecodeError::Kind(k) => write!(f, "unknown packet kind {k}"),
            DecodeError::Field(what) => write!(f, "malformed packet: {what}"),
        }
    }
}

#[derive(Default)]
struct Header {
    kind: u8,
    flags: u8,
    w1: u32,
    w2: u32,
    w3: u32,
    q2: u64,
    q3: u64,
    q4: u64,
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(w)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

/// Decodes one frame body (without its length prefix).
pub(crate) fn decode(b: &[u8]) -> Result<Packet<'_>, DecodeError> {
    if b.len() < HEADER || b.len() > MAX_FRAME {
        return Err(DecodeError::Size(b.len()));
    }
    let h = Header {
        kind: b[0],
        flags: b[1],
        w1: u32_at(b, 4),
        w2: u32_at(b, 8),
        w3: u32_at(b, 12),
        q2: u64_at(b, 16),
        q3: u64_at(b, 24),
        q4: u64_at(b, 32),
    };
    let data = &b[HEADER..];
    if b[2] != 0 || b[3] != 0 || h.flags & !(FLAG_LAST | FLAG_IMM) != 0 {
        return Err(DecodeError::Field("reserved bits set"));
    }
    let last = h.flags & FLAG_LAST != 0;
    let has_data = matches!(h.kind, kind::WRITE | kind::READ_RESP);
    if !has_data && (!data.is_empty() || h.flags != 0) {
        return Err(DecodeError::Field("payload or flags on a packet kind without them"));
    }
    let psn = h.w1;
    if h.kind < kind::HELLO && psn & !PSN_MASK != 0 {
        return Err(DecodeError::Field("PSN over 24 bits"));
    }
    let p = match h.kind {
        kind::WRITE => {
            let (total, offset) = (h.q3, h.q4);
            let end = offset.checked_add(data.len() as u64).ok_or(DecodeError::Field("offset overflows"))?;
            if total > MAX_MESSAGE || end > total || last != (end == total) {
                return Err(DecodeError::Field("WRITE packet outside its message"));
            }
            let imm = (h.flags & FLAG_IMM != 0).then_some(h.w3);
            if imm.is_none() && h.w3 != 0 {
                return Err(DecodeError::Field("immediate without its flag"));
            }
            Packet::Write { psn, rkey: h.w2, raddr: h.q2, total, offset, imm, last, data }
        }
        kind::READ => {
            if h.q3 > MAX_MESSAGE {
                return Err(DecodeError::Field("READ longer than 2^31 bytes"));
            }
            Packet::Read { psn, rkey: h.w2, raddr: h.q2, len: h.q3 }
        }
        kind::FETCH_ADD => Packet::Atomic { psn, rkey: h.w2, raddr: h.q2, op: AtomicOp::FetchAdd(h.q3) },
        kind::COMPARE_SWAP => {
            Packet::Atomic { psn, rkey: h.w2, raddr: h.q2, op: AtomicOp::CompareSwap { swap: h.q3, compare: h.q4 } }
        }
        kind::ACK => Packet::Ack { psn },
        kind::NAK => Packet::Nak { psn, syndrome: h.w3 as u8, vendor: (h.w3 >> 8) as u8 },
        kind::READ_RESP => {
            if h.q4.checked_add(data.len() as u64).is_none_or(|end| end > MAX_MESSAGE) {
                return Err(DecodeError::Field("READ response past 2^31 bytes"));
            }
            Packet::ReadResp { psn, offset: h.q4, last, data }
        }
        kind::ATOMIC_RESP => Packet::AtomicResp { psn, old: h.q3 },
        kind::HELLO => {
            if h.w3 != HELLO_MAGIC {
                return Err(DecodeError::Field("hello without the magic word"));
            }
            Packet::Hello { src_nic: h.q2, src_qpn: h.w2, dst_nic: h.q3, dst_qpn: psn, version: h.q4 }
        }
        kind::HELLO_ACK => Packet::HelloAck,
        kind::REJECT => Packet::Reject { why: h.w3 as u8 },
        k => return Err(DecodeError::Kind(k)),
    };
    Ok(p)
}

/// Appends `p` to `out` as one frame (length prefix included).
pub(crate) fn encode(p: &Packet<'_>, out: &mut Vec<u8>) {
    let mut h = Header::default();
    let data: &[u8] = match *p {
        Packet::Write { psn, rkey, raddr, total, offset, imm, last, data } => {
            h = Header {
                kind: kind::WRITE,
                w1: psn,
                w2: rkey,
                w3: imm.unwrap_or(0),
                q2: raddr,
                q3: total,
                q4: offset,
                ..h
            };
            h.flags = if last { FLAG_LAST } else { 0 } | if imm.is_some() { FLAG_IMM } else { 0 };
            data
        }
        Packet::Read { psn, rkey, raddr, len } => {
            h = Header { kind: kind::READ, w1: psn, w2: rkey, q2: raddr, q3: len, ..h };
            &[]
        }
        Packet::Atomic { psn, rkey, raddr, op } => {
            h = match op {
                AtomicOp::FetchAdd(add) => Header { kind: kind::FETCH_ADD, q3: add, ..h },
                AtomicOp::CompareSwap { compare, swap } => {
                    Header { kind: kind::COMPARE_SWAP, q3: swap, q4: compare, ..h }
                }
            };
            h = Header { w1: psn, w2: rkey, q2: raddr, ..h };
            &[]
        }
        Packet::Ack { psn } => {
            h = Header { kind: kind::ACK, w1: psn, ..h };
            &[]
        }
        Packet::Nak { psn, syndrome, vendor } => {
            h = Header { kind: kind::NAK, w1: psn, w3: syndrome as u32 | (vendor as u32) << 8, ..h };
            &[]
        }
        Packet::ReadResp { psn, offset, last, data } => {
            h = Header { kind: kind::READ_RESP, w1: psn, q4: offset, flags: if last { FLAG_LAST } else { 0 }, ..h };
            data
        }
        Packet::AtomicResp { psn, old } => {
            h = Header { kind: kind::ATOMIC_RESP, w1: psn, q3: old, ..h };
            &[]
        }
        Packet::Hello { src_nic, src_qpn, dst_nic, dst_qpn, version } => {
            h = Header {
                kind: kind::HELLO,
                w1: dst_qpn,
                w2: src_qpn,
                w3: HELLO_MAGIC,
                q2: src_nic,
                q3: dst_nic,
                q4: version,
                ..h
            };
            &[]
        }
        Packet::HelloAck => {
            h.kind = kind::HELLO_ACK;
            &[]
        }
        Packet::Reject { why } => {
            h = Header { kind: kind::REJECT, w3: why as u32, ..h };
            &[]
        }
    };
    out.extend_from_slice(&((HEADER + data.len()) as u32).to_le_bytes());
    out.extend_from_slice(&[h.kind, h.flags, 0, 0]);
    for w in [h.w1, h.w2, h.w3] {
        out.extend_from_slice(&w.to_le_bytes());
    }
    for q in [h.q2, h.q3, h.q4] {
        out.extend_from_slice(&q.to_le_bytes());
    }
    out.extend_from_slice(data);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn packet() -> impl Strategy<Value = (u8, u32, u32, u64, u64, u64, Option<u32>, Vec<u8>)> {
        (
            0u8..10,
            0..=PSN_MASK,
            any::<u32>(),
            any::<u64>(),
            0..=MAX_MESSAGE,
            any::<u64>(),
            proptest::option::of(any::<u32>()),
            proptest::collection::vec(any::<u8>(), 0..600),
        )
    }

    fn build(
        (k, psn, key, addr, len, x, imm, data): &(u8, u32, u32, u64, u64, u64, Option<u32>, Vec<u8>),
    ) -> Packet<'_> {
        let (psn, key, addr, len, x, imm) = (*psn, *key, *addr, *len, *x, *imm);
        match k {
            0 => {
                // A packet somewhere inside a message long enough for it.
                let total = (data.len() as u64).max(len);
                let offset = x % (total - data.len() as u64 + 1);
                let last = offset + data.len() as u64 == total;
                Packet::Write { psn, rkey: key, raddr: addr, total, offset, imm, last, data }
            }
            1 => Packet::Read { psn, rkey: key, raddr: addr, len },
            2 => Packet::Atomic { psn, rkey: key, raddr: addr, op: AtomicOp::FetchAdd(x) },
            3 => Packet::Atomic { psn, rkey: key, raddr: addr, op: AtomicOp::CompareSwap { compare: x, swap: len } },
            4 => Packet::Ack { psn },
            5 => Packet::Nak { psn, syndrome: key as u8, vendor: (key >> 8) as u8 },
            6 => Packet::ReadResp { psn, offset: len.min(MAX_MESSAGE - data.len() as u64), last: x & 1 == 1, data },
            7 => Packet::AtomicResp { psn, old: x },
            8 => Packet::Hello { src_nic: addr, src_qpn: key, dst_nic: x, dst_qpn: psn, version: len },
            _ => Packet::Reject { why: key as u8 },
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]

        /// encode → decode gives back the same packet, and the length prefix counts the rest of the frame.
        #[test]
        fn encode_decode_round_trip(fields in packet()) {
            let p = build(&fields);
            let mut buf = Vec::new();
            encode(&p, &mut buf);
            prop_assert_eq!(u32_at(&buf, 0) as usize, buf.len() - 4);
            prop_assert_eq!(decode(&buf[4..]), Ok(p));
        }

        /// Any bytes decode to a packet or an error, never a panic; a payload is a sub-slice of the input.
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200), kind in 0u8..40) {
            let mut b = bytes;
            if !b.is_empty() {
                b[0] = kind;
            }
            if let Ok(Packet::Write { data, .. } | Packet::ReadResp { data, .. }) = decode(&b) {
                prop_assert!(data.len() + HEADER == b.len());
            }
        }
    }

    #[test]
    fn rejects_what_does_not_fit() {
        let mut buf = Vec::new();
        encode(
            &Packet::Write { psn: 1, rkey: 2, raddr: 3, total: 8, offset: 0, imm: None, last: true, data: &[7; 8] },
            &mut buf,
        );
        let body = &mut buf[4..];
        assert!(decode(body).is_ok());
        body[1] = 0; // not marked last, though it ends the message
        assert_eq!(decode(body), Err(DecodeError::Field("WRITE packet outside its message")));
        body[1] = 1;
        body[4..8].copy_from_slice(&(PSN_MASK + 1).to_le_bytes());
        assert_eq!(decode(body), Err(DecodeError::Field("PSN over 24 bits")));
        assert_eq!(decode(&[0; HEADER - 1]), Err(DecodeError::Size(HEADER - 1)));
        let mut ack = [0u8; HEADER + 1];
        ack[0] = kind::ACK;
        assert!(matches!(decode(&ack), Err(DecodeError::Field(_))));
        ack[0] = 99;
        assert_eq!(decode(&ack[..HEADER]), Err(DecodeError::Kind(99)));
    }
}
