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
//! A WRITE between processes of one host whose source is GPU memory the responder has mapped ([`Packet::IpcOffer`],
//! [`Packet::IpcAnswer`]) may instead go as [`Packet::WriteIpc`] pieces: the same header, and as payload the
//! 64-byte handle of the source's allocation, the source's offset in it and the piece's length (little-endian
//! `u64`s); the responder copies the bytes itself.
//!
//! As in InfiniBand RC, a WRITE or READ response longer than one packet is split ([`MAX_CHUNK`] payload
//! bytes each); unlike InfiniBand, all packets of one message carry the message's PSN (the stream is reliable
//! and ordered, so PSNs number messages). [`decode`] is a pure function of its input: any byte pattern gives
//! a packet or a [`DecodeError`], never a panic, and the payload it returns is a sub-slice of the input.

use crate::mem::EXPORT_HANDLE_BYTES;
use crate::nic::emu::access::AtomicOp;

/// Header bytes after the length prefix.
pub(crate) const HEADER: usize = 40;

/// Most READ and atomic requests a requester keeps outstanding on one QP, and that a responder takes without
/// having answered them (InfiniBand's `max_rd_atomic` and `max_dest_rd_atomic`; ConnectX allows 16). The
/// responder holds a record of some 40 bytes per unanswered request until its answer has room in the outbox
/// (a READ's data is read then), so the bound caps what a requester can make it hold (about 1.3 MiB per QP).
/// It equals the deepest SQ ([`MAX_WQE_CNT`](crate::nic::emu::MAX_WQE_CNT) WQEBBs, a READ or atomic taking
/// at least one), so that it never slows a pipeline of atomics from a well-behaved requester. Part of wire
/// [`VERSION`] since 1: a requester with more outstanding breaks the protocol.
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

/// Version of this encoding, carried in a hello (2: the IPC kinds).
pub(crate) const VERSION: u64 = 2;

/// Payload of a [`Packet::WriteIpc`]: handle, offset in the allocation, length.
const WRITE_IPC_PAYLOAD: usize = EXPORT_HANDLE_BYTES + 16;

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
    /// One piece of an RDMA WRITE whose bytes the responder copies from a mapping of the requester's GPU
    /// memory.
    pub const WRITE_IPC: u8 = 5;
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
    /// The requester offers the handle of an allocation its WRITEs read from.
    pub const IPC_OFFER: u8 = 35;
    /// The responder mapped an offered allocation, or could not.
    pub const IPC_ANSWER: u8 = 36;
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
    /// One piece of an RDMA WRITE of `total` bytes to `raddr`: the `len` bytes at offset `src` of the
    /// requester's allocation `handle` (offered and mapped before) go to `raddr + offset`.
    WriteIpc {
        psn: u32,
        rkey: u32,
        raddr: u64,
        total: u64,
        offset: u64,
        imm: Option<u32>,
        last: bool,
        handle: &'a [u8; EXPORT_HANDLE_BYTES],
        src: u64,
        len: u64,
    },
    /// The requester's WRITEs may read GPU memory of the allocation `handle`: may the responder map it?
    IpcOffer { handle: &'a [u8; EXPORT_HANDLE_BYTES] },
    /// The responder mapped the offered allocation `handle` (`mapped`), or could not.
    IpcAnswer { handle: &'a [u8; EXPORT_HANDLE_BYTES], mapped: bool },
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
    let has_data =
        matches!(h.kind, kind::WRITE | kind::READ_RESP | kind::WRITE_IPC | kind::IPC_OFFER | kind::IPC_ANSWER);
    let has_flags = matches!(h.kind, kind::WRITE | kind::READ_RESP | kind::WRITE_IPC);
    if (!has_data && !data.is_empty()) || (!has_flags && h.flags != 0) {
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
        kind::WRITE_IPC => {
            let Some((handle, rest)) = data.split_first_chunk::<EXPORT_HANDLE_BYTES>() else {
                return Err(DecodeError::Field("WRITE_IPC payload is not a handle, an offset and a length"));
            };
            if data.len() != WRITE_IPC_PAYLOAD {
                return Err(DecodeError::Field("WRITE_IPC payload is not a handle, an offset and a length"));
            }
            let (src, len) = (u64_at(rest, 0), u64_at(rest, 8));
            let (total, offset) = (h.q3, h.q4);
            let end = offset.checked_add(len).ok_or(DecodeError::Field("offset overflows"))?;
            if len == 0 || total > MAX_MESSAGE || end > total || last != (end == total) {
                return Err(DecodeError::Field("WRITE_IPC piece outside its message"));
            }
            let imm = (h.flags & FLAG_IMM != 0).then_some(h.w3);
            if imm.is_none() && h.w3 != 0 {
                return Err(DecodeError::Field("immediate without its flag"));
            }
            Packet::WriteIpc { psn, rkey: h.w2, raddr: h.q2, total, offset, imm, last, handle, src, len }
        }
        kind::IPC_OFFER | kind::IPC_ANSWER => {
            let handle = data.try_into().map_err(|_| DecodeError::Field("IPC offer or answer without a handle"))?;
            if (h.w1, h.w2, h.q2, h.q3, h.q4) != (0, 0, 0, 0, 0) || h.w3 > u32::from(h.kind == kind::IPC_ANSWER) {
                return Err(DecodeError::Field("reserved bits set"));
            }
            match h.kind {
                kind::IPC_OFFER => Packet::IpcOffer { handle },
                _ => Packet::IpcAnswer { handle, mapped: h.w3 == 1 },
            }
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

/// The header of a WRITE's packet or piece (`kind`): PSN, rkey and remote address, then the message's length,
/// this part's offset in it, the immediate and whether the part is the message's last.
fn write_header(
    kind: u8,
    (psn, rkey, raddr): (u32, u32, u64),
    (total, offset, imm, last): (u64, u64, Option<u32>, bool),
) -> Header {
    let flags = if last { FLAG_LAST } else { 0 } | if imm.is_some() { FLAG_IMM } else { 0 };
    Header { kind, flags, w1: psn, w2: rkey, w3: imm.unwrap_or(0), q2: raddr, q3: total, q4: offset }
}

/// Appends `p` to `out` as one frame (length prefix included).
pub(crate) fn encode(p: &Packet<'_>, out: &mut Vec<u8>) {
    let mut h = Header::default();
    let mut ipc = [0u8; WRITE_IPC_PAYLOAD];
    let data: &[u8] = match *p {
        Packet::WriteIpc { psn, rkey, raddr, total, offset, imm, last, handle, src, len } => {
            h = write_header(kind::WRITE_IPC, (psn, rkey, raddr), (total, offset, imm, last));
            ipc[..EXPORT_HANDLE_BYTES].copy_from_slice(handle);
            ipc[EXPORT_HANDLE_BYTES..EXPORT_HANDLE_BYTES + 8].copy_from_slice(&src.to_le_bytes());
            ipc[EXPORT_HANDLE_BYTES + 8..].copy_from_slice(&len.to_le_bytes());
            &ipc
        }
        Packet::IpcOffer { handle } => {
            h.kind = kind::IPC_OFFER;
            handle
        }
        Packet::IpcAnswer { handle, mapped } => {
            h = Header { kind: kind::IPC_ANSWER, w3: u32::from(mapped), ..h };
            handle
        }
        Packet::Write { psn, rkey, raddr, total, offset, imm, last, data } => {
            h = write_header(kind::WRITE, (psn, rkey, raddr), (total, offset, imm, last));
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
            0u8..13,
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
            9 => Packet::Reject { why: key as u8 },
            10 => {
                // A piece of `n` bytes somewhere inside a message long enough for it.
                let n = (data.len() as u64).max(1);
                let total = n.max(len);
                let offset = x % (total - n + 1);
                let last = offset + n == total;
                Packet::WriteIpc {
                    psn,
                    rkey: key,
                    raddr: addr,
                    total,
                    offset,
                    imm,
                    last,
                    handle: &HANDLE,
                    src: x,
                    len: n,
                }
            }
            11 => Packet::IpcOffer { handle: &HANDLE },
            _ => Packet::IpcAnswer { handle: &HANDLE, mapped: x & 1 == 1 },
        }
    }

    /// A handle with every byte distinct, so that a misplaced byte shows.
    const HANDLE: [u8; EXPORT_HANDLE_BYTES] = {
        let mut h = [0u8; EXPORT_HANDLE_BYTES];
        let mut i = 0;
        while i < EXPORT_HANDLE_BYTES {
            h[i] = 0x80 + i as u8;
            i += 1;
        }
        h
    };

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
            match decode(&b) {
                Ok(Packet::Write { data, .. } | Packet::ReadResp { data, .. }) => {
                    prop_assert!(data.len() + HEADER == b.len());
                }
                Ok(Packet::WriteIpc { .. }) => prop_assert_eq!(b.len(), HEADER + WRITE_IPC_PAYLOAD),
                Ok(Packet::IpcOffer { .. } | Packet::IpcAnswer { .. }) => {
                    prop_assert_eq!(b.len(), HEADER + EXPORT_HANDLE_BYTES);
                }
                _ => {}
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

    /// The IPC kinds: a WRITE_IPC piece's payload is exactly a handle, an offset and a length, its piece
    /// inside its message and not empty; an offer or answer carries exactly a handle, nothing else.
    #[test]
    fn ipc_packets_are_checked() {
        let piece = |offset, len, last| Packet::WriteIpc {
            psn: 1,
            rkey: 2,
            raddr: 3,
            total: 64,
            offset,
            imm: None,
            last,
            handle: &HANDLE,
            src: 4096,
            len,
        };
        let frame = |p: &Packet<'_>| {
            let mut buf = Vec::new();
            encode(p, &mut buf);
            buf.split_off(4)
        };
        let body = frame(&piece(32, 32, true));
        assert_eq!(body.len(), HEADER + 80);
        assert_eq!(&body[HEADER..HEADER + 64], &HANDLE[..]);
        assert_eq!(u64_at(&body, HEADER + 64), 4096);
        assert_eq!(u64_at(&body, HEADER + 72), 32);
        assert_eq!(decode(&body), Ok(piece(32, 32, true)));
        let outside = Err(DecodeError::Field("WRITE_IPC piece outside its message"));
        assert_eq!(decode(&frame(&piece(32, 33, true))), outside);
        assert_eq!(decode(&frame(&piece(0, 32, true))), outside, "marked last, ends before the message");
        assert_eq!(decode(&frame(&piece(0, 0, false))), outside, "empty piece");
        let short = Err(DecodeError::Field("WRITE_IPC payload is not a handle, an offset and a length"));
        assert_eq!(decode(&body[..body.len() - 1]), short);
        let offer = frame(&Packet::IpcOffer { handle: &HANDLE });
        assert_eq!(decode(&offer), Ok(Packet::IpcOffer { handle: &HANDLE }));
        assert_eq!(decode(&offer[..offer.len() - 1]), Err(DecodeError::Field("IPC offer or answer without a handle")));
        let mut answer = frame(&Packet::IpcAnswer { handle: &HANDLE, mapped: true });
        assert_eq!(u32_at(&answer, 12), 1);
        answer[12] = 2;
        assert_eq!(decode(&answer), Err(DecodeError::Field("reserved bits set")));
        let mut offer = offer;
        offer[12] = 1;
        assert_eq!(decode(&offer), Err(DecodeError::Field("reserved bits set")), "an offer has no answer bit");
        offer[12] = 0;
        offer[1] = FLAG_LAST;
        assert_eq!(decode(&offer), Err(DecodeError::Field("payload or flags on a packet kind without them")));
    }
}
