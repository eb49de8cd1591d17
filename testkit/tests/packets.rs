//! LL packets (`gdaki_device::packet`) in memory, no NIC: `write_packets` lays packets out byte for byte as
//! MSCCL++'s `LL16Packet` / `LL8Packet` (computed here from the layout, not with the device code), any number
//! of threads' shares round-trip through `read_packets`, a packet whose flag is stale or torn makes
//! `read_packets` time out naming that packet, and bad requests write nothing. The packet ping-pongs over the
//! emulated NIC are in tests/porttest.rs.

#[path = "../../host/tests/emu_util/mod.rs"]
mod emu_util;

use std::time::Duration;

use emu_util::{random_bytes, rng, GuardedBuf};
use gdaki_device::error::{InvalidArgument, RangeError, Timeout, WaitOn};
use gdaki_device::packet::{packet_bytes, Packet, Packets};
use gdaki_device::Error;
use gdaki_shared::handle::MrHandle;
use gdaki_shared::packet::{LL16Packet, LL8Packet};
use gdaki_testkit_kernels::porttest::packet_flag;
use proptest::prelude::*;

/// Bound of the waits that are meant to time out.
const TIMEOUT_NS: u64 = 20_000_000;

/// LL16 packets of `data` (a multiple of 8 bytes): per 8 data bytes, bytes 0..4, the flag, bytes 4..8, the
/// flag (little-endian words).
fn ll16_bytes(data: &[u8], flag: u32) -> Vec<u8> {
    data.chunks(8).flat_map(|c| [&c[..4], &flag.to_le_bytes()[..], &c[4..], &flag.to_le_bytes()[..]].concat()).collect()
}

/// LL8 packets of `data` (a multiple of 4 bytes): per 4 data bytes, the bytes, then the flag.
fn ll8_bytes(data: &[u8], flag: u32) -> Vec<u8> {
    data.chunks(4).flat_map(|c| [c, &flag.to_le_bytes()[..]].concat()).collect()
}

/// A buffer for `n` data bytes: data at `src`, packets at `pkt` (16-byte aligned address), data out at `dst`.
struct Rig {
    buf: GuardedBuf,
    mr: MrHandle,
    src: u64,
    pkt: u64,
    dst: u64,
}

impl Rig {
    fn new(n: usize) -> Self {
        let buf = GuardedBuf::new(16 + n.next_multiple_of(16) + 2 * n + n, 0);
        let mr = MrHandle { addr: buf.addr(), length: buf.len() as u64, ..MrHandle::default() };
        let src = (16 - buf.addr() % 16) % 16;
        let pkt = src + n.next_multiple_of(16) as u64;
        Self { src, pkt, dst: pkt + 2 * n as u64, buf, mr }
    }

    fn packets(&self) -> Packets<'_> {
        // SAFETY: the MR is the buffer's middle, alive as long as `self`.
        unsafe { Packets::new(&self.mr, TIMEOUT_NS) }
    }

    fn bytes(&self, off: u64, len: usize) -> Vec<u8> {
        self.buf.read()[off as usize..off as usize + len].to_vec()
    }
}

/// Writes `data` as packets of type `T` from `threads` threads' shares (in a scrambled order), checks their
/// bytes against `layout`, reads them back from every share into `dst` and checks the data.
fn round_trip<T: Packet>(data: &[u8], flag: u32, threads: u32, layout: fn(&[u8], u32) -> Vec<u8>) {
    let n = data.len();
    let r = Rig::new(n);
    r.buf.write(r.src as usize, data);
    let before = r.buf.read();
    let p = r.packets();
    for t in (0..threads).rev() {
        p.write_packets::<T>(r.pkt, r.src, n as u64, flag, t, threads).expect("write_packets");
    }
    assert_eq!(packet_bytes::<T>(n as u64), 2 * n as u64);
    assert_eq!(r.bytes(r.pkt, 2 * n), layout(data, flag), "packet bytes");
    for t in 0..threads {
        p.read_packets::<T>(r.dst, r.pkt, n as u64, flag, t, threads).expect("read_packets");
    }
    assert_eq!(r.bytes(r.dst, n), data, "data read back");
    // Nothing else moved: the source and the padding are as before, the guards intact.
    let after = r.buf.read();
    assert_eq!(after[..r.pkt as usize], before[..r.pkt as usize]);
    assert!(r.buf.guards_intact());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn ll16_round_trips(words in proptest::collection::vec(any::<u64>(), 1..80), flag in 1u32.., threads in 1u32..6) {
        let data: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        round_trip::<LL16Packet>(&data, flag, threads, ll16_bytes);
    }

    #[test]
    fn ll8_round_trips(words in proptest::collection::vec(any::<u32>(), 1..160), flag in 1u32.., threads in 1u32..6) {
        let data: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        round_trip::<LL8Packet>(&data, flag, threads, ll8_bytes);
    }
}

#[test]
fn packet_new_matches_the_layout() {
    let p = LL16Packet::new(0x1122_3344_5566_7788, 0xa5a5_0001);
    assert_eq!(bytemuck::bytes_of(&p), &ll16_bytes(&0x1122_3344_5566_7788u64.to_le_bytes(), 0xa5a5_0001)[..]);
    let p = LL8Packet::new(0x1234_5678, 7);
    assert_eq!(bytemuck::bytes_of(&p), &[0x78, 0x56, 0x34, 0x12, 7, 0, 0, 0]);
}

/// The timeout `r` must be: on the packet at `addr`, awaiting `flag`, having seen `seen`, after the bound.
fn assert_packet_timeout(r: gdaki_device::Result<()>, addr: u64, flag: u32, seen: u32) {
    let Err(e @ Error::Timeout(Timeout { on, waited_ns })) = r else { panic!("expected a packet timeout, got {r:?}") };
    assert_eq!(on, WaitOn::Packet { addr, flag, seen });
    assert!(waited_ns >= TIMEOUT_NS, "waited {waited_ns} ns");
    assert!(e.to_string().contains(&format!("LL packet at {addr:#x} to carry flag {flag} (saw {seen})")), "{e}");
}

#[test]
fn a_stale_round_times_out_on_its_first_packet() {
    let data = random_bytes(&mut rng(), 64);
    let r = Rig::new(64);
    r.buf.write(r.src as usize, &data);
    let p = r.packets();
    // Last round's packets (flag 7) are in the buffer; this round awaits flag 8.
    p.write_packets::<LL16Packet>(r.pkt, r.src, 64, 7, 0, 1).unwrap();
    assert_packet_timeout(p.read_packets::<LL16Packet>(r.dst, r.pkt, 64, 8, 0, 1), r.mr.addr + r.pkt, 8, 7);
    // Never-written (zeroed) packets do not match either.
    assert_packet_timeout(p.read_packets::<LL8Packet>(r.src, r.dst, 4, 1, 0, 1), r.mr.addr + r.dst, 1, 0);
}

#[test]
fn a_torn_packet_times_out_naming_it() {
    let data = random_bytes(&mut rng(), 64);
    for (word, stale_at) in [("flag1", 4usize), ("flag2", 12)] {
        let r = Rig::new(64);
        r.buf.write(r.src as usize, &data);
        let p = r.packets();
        p.write_packets::<LL16Packet>(r.pkt, r.src, 64, 8, 0, 1).unwrap();
        // Packet 3 has its data but one stale flag word: half of it is from the last round.
        r.buf.write(r.pkt as usize + 3 * 16 + stale_at, &7u32.to_le_bytes());
        let at = r.mr.addr + r.pkt + 3 * 16;
        assert_packet_timeout(p.read_packets::<LL16Packet>(r.dst, r.pkt, 64, 8, 0, 1), at, 8, 7);
        // With two threads, thread 0's share (packets 0, 2, ...) is complete; thread 1's stops at packet 3.
        p.read_packets::<LL16Packet>(r.dst, r.pkt, 64, 8, 0, 2).unwrap_or_else(|e| panic!("{word}: {e}"));
        assert_packet_timeout(p.read_packets::<LL16Packet>(r.dst, r.pkt, 64, 8, 1, 2), at, 8, 7);
    }
    // LL8: packet 5's flag is stale.
    let r = Rig::new(64);
    r.buf.write(r.src as usize, &data);
    let p = r.packets();
    p.write_packets::<LL8Packet>(r.pkt, r.src, 64, 3, 0, 1).unwrap();
    r.buf.write(r.pkt as usize + 5 * 8 + 4, &2u32.to_le_bytes());
    assert_packet_timeout(p.read_packets::<LL8Packet>(r.dst, r.pkt, 64, 3, 0, 1), r.mr.addr + r.pkt + 40, 3, 2);
}

#[test]
fn a_reader_polls_until_a_slow_writer_is_done() {
    let n = 4096usize;
    let data = random_bytes(&mut rng(), n);
    let r = Rig::new(n);
    r.buf.write(r.src as usize, &data);
    // SAFETY: the MR is the buffer's middle, alive for the scope.
    let (reader, writer) = unsafe { (Packets::new(&r.mr, 10_000_000_000), Packets::new(&r.mr, 0)) };
    std::thread::scope(|s| {
        let h = s.spawn(|| reader.read_packets::<LL16Packet>(r.dst, r.pkt, n as u64, 9, 0, 1));
        // Eight shares, last first, with pauses: the reader sees packets arrive out of order.
        for t in (0..8).rev() {
            std::thread::sleep(Duration::from_millis(2));
            writer.write_packets::<LL16Packet>(r.pkt, r.src, n as u64, 9, t, 8).unwrap();
        }
        h.join().unwrap().expect("read_packets");
    });
    assert_eq!(r.bytes(r.dst, n), data);
}

#[test]
fn bad_requests_write_nothing() {
    let r = Rig::new(64);
    r.buf.write(r.src as usize, &random_bytes(&mut rng(), 64));
    let before = r.buf.read();
    let p = r.packets();
    let len = r.mr.length;
    let bad = |e| Err::<(), _>(Error::InvalidArgument(e));
    use InvalidArgument::{Length, Packet as Layout};
    // `bytes` bytes at `offset` outside the memory (16 bytes of LL16 packets carry 8 of data).
    let outside = |offset, bytes| Error::Range(RangeError { remote: false, offset, bytes, length: len });
    let inval = Error::InvalidArgument;
    let cases: [(&str, u64, u64, u64, u32, u32, u32, _); 12] = [
        ("0 bytes", r.pkt, r.src, 0, 1, 0, 1, inval(Length)),
        ("not whole packets", r.pkt, r.src, 12, 1, 0, 1, inval(Layout)),
        ("misaligned data", r.pkt, r.src + 4, 8, 1, 0, 1, inval(Layout)),
        ("misaligned packets", r.pkt + 8, r.src, 8, 1, 0, 1, inval(Layout)),
        ("flag 0", r.pkt, r.src, 8, 0, 0, 1, inval(Layout)),
        ("thread beyond the count", r.pkt, r.src, 8, 1, 2, 2, inval(Layout)),
        ("packets past the end", len - 8, r.src, 8, 1, 0, 1, outside(len - 8, 16)),
        ("data past the end", r.pkt, len - 4, 8, 1, 0, 1, outside(len - 4, 8)),
        ("offset overflow", u64::MAX - 7, r.src, 8, 1, 0, 1, outside(u64::MAX - 7, 16)),
        // Data and packets overlapping (16 bytes of data make 32 of LL16 packets): the same place, the data in
        // the packets' second half, and the data's last 8 bytes on the packets' first.
        ("data on the packets", r.pkt, r.pkt, 8, 1, 0, 1, inval(Layout)),
        ("data in the packets", r.pkt, r.pkt + 16, 16, 1, 0, 1, inval(Layout)),
        ("data ending in the packets", r.pkt, r.pkt - 8, 16, 1, 0, 1, inval(Layout)),
    ];
    for (what, pkt, src, bytes, flag, t, n, want) in cases {
        assert_eq!(p.write_packets::<LL16Packet>(pkt, src, bytes, flag, t, n), Err(want), "write: {what}");
        assert_eq!(p.read_packets::<LL16Packet>(src, pkt, bytes, flag, t, n), Err(want), "read: {what}");
    }
    // LL8 takes 4-byte data units.
    assert_eq!(p.write_packets::<LL8Packet>(r.pkt, r.src, 6, 1, 0, 1), bad(Layout));
    assert_eq!(r.buf.read(), before, "a rejected request wrote something");
    assert!(r.buf.guards_intact());
}

proptest! {
    #[test]
    fn packet_flags_are_nonzero_and_new_each_round(base in any::<u32>(), k in any::<u32>()) {
        let (a, b) = (packet_flag(base, k as u64), packet_flag(base, k as u64 + 1));
        prop_assert!(a != 0 && b != 0);
        prop_assert_ne!(a, b);
    }
}
