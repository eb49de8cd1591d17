//! The PortChannel device API (`gdaki_device::channel`) on the `cpu` executor, against the emulated NIC, with
//! channel handles built by hand here (the host API has its own tests): Exclusive, Block and Device scopes;
//! many threads on one shared QP with every payload checked and the semaphore count exact; SQ wrap-around past
//! 65,536 WQEs; `flush` reporting a bad key's syndrome; `put_with_signal` never showing the signal before the
//! data; a connection refusing channels of the other sharing side than its first post's. Replay a failure
//! with the `GDAKI_TEST_SEED` it printed.

mod emu_util;

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use emu_util::{random_bytes, rng, GuardedBuf};
use gdaki::nic::emu::{Access, Cq, EmuConfig, EmuNic, Mr, Pd, Qp, WireConfig};
use gdaki_device::channel::Sharing;
use gdaki_device::channel::{Exclusive, PortChannel, Poster};
use gdaki_device::error::{InvalidArgument, RangeError, WaitOn};
use gdaki_device::packet::{LL16Packet, LL8Packet};
use gdaki_device::scope::{Block, Device};
use gdaki_device::Error;
use gdaki_shared::channel::PortChannelHandle;
use gdaki_shared::handle::QpHandle;
use gdaki_shared::prm::opcode::syndrome;
use rand::RngExt;

const TIMEOUT_NS: u64 = 10_000_000_000;

/// One direction of a connection, A → B: A posts, B's memory receives, B's semaphore counts A's signals.
/// Field order is drop order: MRs first.
struct Link {
    src_mr: Mr,
    dst_mr: Mr,
    sem_mr: Mr,
    scratch_mr: Mr,
    a: Qp,
    _b: Qp,
    _cqs: (Cq, Cq),
    _pds: (Pd, Pd),
    _nics: Vec<Arc<EmuNic>>,
    src: GuardedBuf,
    dst: GuardedBuf,
    sem: GuardedBuf,
    scratch: GuardedBuf,
    /// A's QP handle and B's expected count, where device code updates them.
    qp_h: Box<QpHandle>,
    expected: Box<AtomicU64>,
}

/// A link for team puts: 4 KiB of random source bytes (returned), QPs of `wqe_cnt` WQEBBs, and a channel handle
/// whose WQEs carry at most 256 bytes, so that a team put of a few hundred bytes spreads over the members.
fn team_link(wqe_cnt: u32) -> (Link, Vec<u8>, PortChannelHandle) {
    let l = Link::new(4096, wqe_cnt, false);
    let data = random_bytes(&mut rng(), 4096);
    l.src.write(0, &data);
    let mut h = l.handle();
    h.max_wqe_bytes = 256;
    (l, data, h)
}

impl Link {
    /// `len` bytes of source and destination; QPs of `wqe_cnt` WQEBBs; over the wire when `wire`.
    fn new(len: usize, wqe_cnt: u32, wire: bool) -> Self {
        let cfg = || {
            if wire {
                EmuConfig::host_or_env().unwrap().with_wire(WireConfig::loopback())
            } else {
                EmuConfig::host_or_env().unwrap()
            }
        };
        let na = EmuNic::open(cfg()).unwrap();
        let nb = if wire { EmuNic::open(cfg()).unwrap() } else { na.clone() };
        let (pa, pb) = (na.alloc_pd().unwrap(), nb.alloc_pd().unwrap());
        let (ca, cb) = (na.create_cq(wqe_cnt).unwrap(), nb.create_cq(wqe_cnt).unwrap());
        let a = na.create_qp(&pa, &ca, wqe_cnt).unwrap();
        let b = nb.create_qp(&pb, &cb, wqe_cnt).unwrap();
        a.connect(&b.endpoint()).unwrap();
        b.connect(&a.endpoint()).unwrap();
        let (src, dst, sem, scratch) =
            (GuardedBuf::new(len, 0), GuardedBuf::new(len, 0xee), GuardedBuf::new(8, 0), GuardedBuf::new(8, 0x77));
        Link {
            src_mr: src.register(&na, &pa, Access::NONE),
            dst_mr: dst.register(&nb, &pb, Access::ALL),
            sem_mr: sem.register(&nb, &pb, Access::ALL),
            scratch_mr: scratch.register(&na, &pa, Access::LOCAL_WRITE),
            qp_h: Box::new(a.handle()),
            expected: Box::new(AtomicU64::new(0)),
            a,
            _b: b,
            _cqs: (ca, cb),
            _pds: (pa, pb),
            _nics: if wire { vec![na, nb] } else { vec![na] },
            src,
            dst,
            sem,
            scratch,
        }
    }

    /// The channel handle of A → B (B waits on `sem`).
    fn handle(&self) -> PortChannelHandle {
        PortChannelHandle {
            qp: &*self.qp_h as *const QpHandle as u64,
            dst: self.dst_mr.remote(),
            src: self.src_mr.handle(),
            remote_sem: self.sem_mr.remote(),
            local_sem: self.sem.addr(),
            expected: &*self.expected as *const AtomicU64 as u64,
            scratch: self.scratch_mr.handle(),
            max_wqe_bytes: 1 << 30,
            timeout_ns: TIMEOUT_NS,
            blue_flame_limit: 512 << 10,
            // Device mode: no proxy.
            ..PortChannelHandle::default()
        }
    }
}

/// A shared-QP channel of scope `S` on `h`, for one thread.
fn shared<S: Sharing>(h: &PortChannelHandle) -> PortChannel<'_, S> {
    // SAFETY: `h` names the live link's QP handle and state (host memory, the `cpu` executor); only channels
    // of one scope post to that QP at a time.
    unsafe { PortChannel::new(h) }
}

/// Threads × puts of random payloads into disjoint slots, each followed by a signal; then every payload,
/// the exact semaphore count and the untouched scratch-free user memory are checked.
fn many_threads<S: Sharing>(wire: bool) {
    let mut rng = rng();
    let (threads, puts, slot) = (8usize, 400usize, 64usize);
    let l = Link::new(threads * puts * slot, 64, wire);
    let payload = random_bytes(&mut rng, threads * puts * slot);
    l.src.write(0, &payload);
    let h = l.handle();
    std::thread::scope(|s| {
        for t in 0..threads {
            let h = &h;
            s.spawn(move || {
                let mut ch = shared::<S>(h);
                for i in 0..puts {
                    let off = ((t * puts + i) * slot) as u64;
                    // Sizes 1..=64: a partial word, a whole one, a whole slot.
                    let len = 1 + ((t * 7 + i * 13) % slot) as u64;
                    ch.put_with_signal(off, off, len).unwrap_or_else(|e| panic!("thread {t} put {i}: {e}"));
                }
                ch.flush().unwrap_or_else(|e| panic!("thread {t} flush: {e}"));
            });
        }
    });
    let got = l.dst.read();
    for t in 0..threads {
        for i in 0..puts {
            let off = (t * puts + i) * slot;
            let len = 1 + (t * 7 + i * 13) % slot;
            assert_eq!(&got[off..off + len], &payload[off..off + len], "thread {t} put {i}");
            assert!(got[off + len..off + slot].iter().all(|&b| b == 0xee), "thread {t} put {i}: bytes past it");
        }
    }
    assert_eq!(l.sem.load_u64(0), (threads * puts) as u64, "every signal counted once");
    // Every fetch-add's old value went to the QP's scratch word (the last one written is some count below the
    // total), none into user memory.
    assert!(l.scratch.u64_at(0) < (threads * puts) as u64, "scratch holds a fetch-add result");
    assert!(l.dst.guards_intact() && l.src.guards_intact() && l.sem.guards_intact());
    // The fetch-add results went to the scratch word: nothing else of A changed.
    assert_eq!(l.src.read(), payload);
    // SAFETY: every thread has finished; the state is plain memory.
    let st = unsafe { std::ptr::read_volatile(&l.qp_h.sq) };
    assert_eq!((st.pi, st.err_idx), (st.ready, 0), "all published, no error: {st:?}");
    assert!(st.ci >= st.sig_first, "all retired: {st:?}");
    assert!(st.rung >= st.ready, "every published WQE rung: {st:?}");
    let nic = l._nics[0].stats();
    assert_eq!((nic.dbrec_mismatches, nic.bad_doorbells, nic.error_cqes), (0, 0, 0), "{nic:?}");
    eprintln!("{} WQEs, {} doorbells", st.ready, nic.doorbells);
}

#[test]
fn device_scope_many_threads_one_qp() {
    many_threads::<Device>(false);
}

#[test]
fn block_scope_many_threads_one_qp() {
    many_threads::<Block>(false);
}

#[test]
fn device_scope_many_threads_one_qp_over_the_wire() {
    many_threads::<Device>(true);
}

#[test]
fn sq_wraps_past_65536_wqes() {
    let l = Link::new(4096, 64, false);
    let h = l.handle();
    let per = 17_600usize;
    std::thread::scope(|s| {
        for t in 0..4 {
            let h = &h;
            s.spawn(move || {
                let mut ch = shared::<Device>(h);
                for i in 0..per {
                    ch.put(((t * 8 + i % 8) * 8) as u64, 0, 8).unwrap_or_else(|e| panic!("thread {t} put {i}: {e}"));
                }
                ch.flush().unwrap();
            });
        }
    });
    // SAFETY: as above.
    let st = unsafe { std::ptr::read_volatile(&l.qp_h.sq) };
    assert!(st.ready > 65_536, "{} WQEBBs: the 16-bit index wrapped", st.ready);
    // Each flush may add a NOP (when the QP's last WQE then was an unsignaled put).
    assert!((4 * per as u64..=4 * per as u64 + 4).contains(&st.ready), "{st:?}");
    assert_eq!(l.a.sq_consumed(), st.ready, "the NIC consumed every WQE");
}

/// Unsignaled shared puts ask for a CQE once per quarter ring: one thread's 401 one-WQEBB puts on a ring of 64
/// WQEBBs ask at WQEs 15, 31, .., 399 (25 CQEs, not 401), and the flush adds a signaled NOP for the last,
/// unsignaled put (one more WQE and CQE). Every payload arrives before the flush returns.
#[test]
fn shared_puts_ask_for_a_cqe_once_per_quarter_ring() {
    let mut rng = rng();
    let (puts, slot) = (401usize, 8usize);
    let l = Link::new(puts * slot, 64, false);
    let payload = random_bytes(&mut rng, puts * slot);
    l.src.write(0, &payload);
    let h = l.handle();
    let mut ch = shared::<Device>(&h);
    for i in 0..puts {
        let off = (i * slot) as u64;
        ch.put(off, off, slot as u64).unwrap_or_else(|e| panic!("put {i}: {e}"));
    }
    ch.flush().unwrap();
    assert_eq!(l.dst.read(), payload, "every payload placed before the flush returned");
    let nic = emu_util::stats_counted(&l._nics[0], puts as u64 + 1, puts as u64 / 16 + 1);
    assert_eq!((nic.wqes, nic.cqes, nic.error_cqes), (puts as u64 + 1, puts as u64 / 16 + 1, 0), "{nic:?}");
    // A second flush finds the NOP's CQE and posts nothing.
    ch.flush().unwrap();
    assert_eq!(l._nics[0].stats().wqes, puts as u64 + 1);
    // SAFETY: the only poster has finished; the state is plain memory.
    let st = unsafe { std::ptr::read_volatile(&l.qp_h.sq) };
    assert_eq!((st.ready, st.ci, st.sig_first), (puts as u64 + 1, puts as u64 + 1, puts as u64 + 1), "{st:?}");
}

/// Four threads put random payloads into their own slots of a 16-WQEBB ring (the smallest; it wraps hundreds
/// of times) and flush after every round of puts, checking that their payloads arrived: a flush after unsignaled
/// puts waits for all of them while the other threads keep posting and flushing, and nobody waits for room
/// forever. Far fewer CQEs than WQEs.
#[test]
fn shared_puts_and_flushes_of_many_threads_on_a_small_ring() {
    let (threads, rounds, slots, slot) = (4usize, 200usize, 16usize, 32usize);
    let region = slots * slot;
    let l = Link::new(threads * region, 16, false);
    let h = l.handle();
    let seed = rng().random::<u64>();
    std::thread::scope(|s| {
        for t in 0..threads {
            let (h, l) = (&h, &l);
            s.spawn(move || {
                let mut rng = <rand::rngs::SmallRng as rand::SeedableRng>::seed_from_u64(seed ^ t as u64);
                let mut ch = shared::<Device>(h);
                for r in 0..rounds {
                    // The last flush finished every put reading these bytes.
                    let data = random_bytes(&mut rng, region);
                    l.src.write(t * region, &data);
                    let puts = rng.random_range(1..=slots);
                    for k in 0..puts {
                        let off = (t * region + k * slot) as u64;
                        ch.put(off, off, slot as u64).unwrap_or_else(|e| panic!("thread {t} round {r} put {k}: {e}"));
                    }
                    ch.flush().unwrap_or_else(|e| panic!("thread {t} round {r} flush: {e}"));
                    let got = l.dst.read();
                    let mine = &got[t * region..t * region + puts * slot];
                    assert_eq!(mine, &data[..puts * slot], "thread {t} round {r}: flushed puts placed");
                }
            });
        }
    });
    // SAFETY: every thread has finished; the state is plain memory.
    let st = unsafe { std::ptr::read_volatile(&l.qp_h.sq) };
    assert_eq!((st.pi, st.err_idx), (st.ready, 0), "{st:?}");
    assert!(st.ready > 16 * 200, "the ring wrapped hundreds of times: {st:?}");
    let nic = l._nics[0].stats();
    assert_eq!((nic.wqes, nic.error_cqes, nic.dbrec_mismatches, nic.bad_doorbells), (st.ready, 0, 0, 0), "{nic:?}");
    // One CQE per 4 WQEBBs, plus one per flush that found its last WQE unsignaled (its NOP).
    assert!(nic.cqes <= st.ready / 4 + (threads * rounds) as u64, "{nic:?}");
    assert!(nic.cqes * 2 < nic.wqes, "{nic:?}");
}

#[test]
fn flush_reports_a_bad_key_and_keeps_reporting_it() {
    let l = Link::new(4096, 64, false);
    let mut h = l.handle();
    let good = h;
    h.dst.rkey = gdaki_shared::Be32::new(h.dst.rkey.get() ^ 0x100);
    let mut ch = shared::<Device>(&good);
    ch.put(0, 0, 64).unwrap();
    ch.flush().unwrap();
    let mut bad = shared::<Device>(&h);
    // Unsignaled (no quarter of the 64-WQEBB ring ends at WQEs 2 and 3): the error CQE comes anyway.
    bad.put(64, 64, 64).unwrap();
    ch.put(0, 0, 64).unwrap();
    let e = bad.flush().unwrap_err();
    assert!(matches!(e, Error::Cqe(c) if c.syndrome == syndrome::REMOTE_ACCESS_ERR), "{e}");
    // Sticky: the good channel on the same QP reports it too, and later puts are flushed, not executed.
    ch.put(128, 128, 64).unwrap();
    assert!(matches!(ch.flush(), Err(Error::Cqe(c)) if c.syndrome == syndrome::REMOTE_ACCESS_ERR));
    assert!(l.dst.read()[64..].iter().all(|&b| b == 0xee), "nothing placed after the bad put");
}

#[test]
fn exclusive_put_with_signal_and_wait() {
    let mut rng = rng();
    let l = Link::new(1 << 20, 64, false);
    let h = l.handle();
    let data = random_bytes(&mut rng, 1 << 20);
    l.src.write(0, &data);
    let mut qh = *l.qp_h;
    // Split: 1 MiB in WQEs of 100,000 bytes.
    let mut h2 = h;
    h2.max_wqe_bytes = 100_000;
    h2.qp = &mut qh as *mut _ as u64;
    // SAFETY: `qh` is a copy of A's handle used by this thread only (no shared poster runs meanwhile); the
    // link outlives the channel.
    let mut ch = unsafe { PortChannel::<Exclusive>::new(&h2) };
    ch.put_with_signal(0, 0, 1 << 20).unwrap();
    ch.flush().unwrap();
    assert_eq!(l.dst.read(), data);
    assert_eq!(l.sem.load_u64(0), 1);
    // 11 WRITEs (10 of 100,000 bytes and one of 48,576) and the fetch-add reached the NIC; the fetch-add asks
    // for a CQE, so `flush` needed no NOP.
    assert_eq!(l.a.sq_consumed(), 12);
}

/// Two `PortChannel::<Exclusive>` of one handle alive at once (a ring's next and previous channels when they
/// are the same peer): each would keep its own producer index, so their WQEs would overwrite each other. On
/// the host both are refused with `Posters` while both live, the second's drop writes nothing back, and the
/// first goes on once the second is gone: its puts land whole.
#[test]
fn two_exclusive_channels_of_one_handle_are_refused_while_both_live() {
    let team = Error::InvalidArgument(InvalidArgument::Posters);
    let l = Link::new(4096, 64, false);
    let data = random_bytes(&mut rng(), 4096);
    l.src.write(0, &data);
    let h = l.handle();
    // SAFETY: the link's QP handle, used by this thread only; the link outlives the channels.
    let mut first = unsafe { PortChannel::<Exclusive>::new(&h) };
    first.put(0, 0, 1024).unwrap();
    {
        // SAFETY: as above; the misuse under test.
        let mut second = unsafe { PortChannel::<Exclusive>::new(&h) };
        assert_eq!(second.put(1024, 1024, 1024), Err(team));
        assert_eq!(second.flush(), Err(team));
        assert_eq!(first.put(2048, 2048, 1024), Err(team));
        assert_eq!(first.flush(), Err(team));
    }
    first.put(3072, 3072, 1024).unwrap();
    first.flush().unwrap();
    let got = l.dst.read();
    assert_eq!(got[..1024], data[..1024]);
    assert!(got[1024..3072].iter().all(|&b| b == 0xee), "the refused puts placed nothing");
    assert_eq!(got[3072..], data[3072..]);
    drop(first);
    // The handle's count is back to none: a new channel of it posts.
    // SAFETY: as above.
    let mut again = unsafe { PortChannel::<Exclusive>::new(&h) };
    again.put(1024, 1024, 1024).unwrap();
    again.flush().unwrap();
    assert_eq!(l.dst.read()[1024..2048], data[1024..2048]);
}

/// A shared channel (Block or Device scope) of a handle whose Exclusive channel still lives: the Exclusive
/// one's `Qp` keeps its counters apart and writes them back when dropped, over the shared poster's WQEs. On the
/// host the shared channel's put and flush are refused with `Posters` while the Exclusive one lives; once it is
/// dropped the shared channel posts after its WQEs, and every put lands whole.
#[test]
fn a_shared_channel_is_refused_while_an_exclusive_one_of_its_handle_lives() {
    fn case<S: Sharing>() {
        let team = Error::InvalidArgument(InvalidArgument::Posters);
        let (l, data, h) = team_link(64);
        // SAFETY: the link's QP handle, used by this thread only; the link outlives the channels.
        let mut first = unsafe { PortChannel::<Exclusive>::new(&h) };
        first.put(0, 0, 1024).unwrap();
        let mut other = shared::<S>(&h);
        assert_eq!(other.put(1024, 1024, 1024), Err(team), "{}", std::any::type_name::<S>());
        assert_eq!(other.flush(), Err(team));
        first.put(1024, 1024, 1024).unwrap();
        drop(first);
        other.put(2048, 2048, 2048).unwrap();
        other.flush().unwrap();
        assert_eq!(l.dst.read(), data, "{}", std::any::type_name::<S>());
    }
    case::<Block>();
    case::<Device>();
}

/// `put_packets` with a length no memory holds, or with a destination whose address in the peer's memory is
/// not a multiple of the packet size: refused, nothing written locally or remotely and nothing posted. (A
/// length near `u64::MAX` overflowed the packets' size before any check: a panic where overflow checks are
/// on, and an error naming the peer's range, not the length, where they are off. A misaligned destination was
/// posted, where the peer's reads could never find the packets.) An aligned put after them lands whole.
#[test]
fn put_packets_refuses_huge_lengths_and_misaligned_destinations() {
    let l = Link::new(4096, 64, false);
    let data = random_bytes(&mut rng(), 4096);
    l.src.write(0, &data);
    let h = l.handle();
    // SAFETY: the link's handle, used by this thread only; the link outlives the channel.
    let mut ch = unsafe { PortChannel::<Exclusive>::new(&h) };
    for bytes in [u64::MAX - 7, (1 << 63) + 8, u64::MAX / 2 + 1] {
        let got = ch.put_packets::<LL16Packet>(0, 1024, 0, bytes, 1, 0, 1);
        assert_eq!(got, emu_util::local_range(0, bytes, 4096), "LL16, {bytes} bytes");
        let got = ch.put_packets::<LL8Packet>(0, 1024, 0, bytes & !3, 1, 0, 1);
        assert_eq!(got, emu_util::local_range(0, bytes & !3, 4096), "LL8, {bytes} bytes");
    }
    // Offsets in the peer's memory whose addresses are 16-byte aligned plus 4 (LL16), 8-byte aligned plus 4
    // (LL8).
    let base = h.dst.addr;
    let at16 = (16 - base % 16) % 16 + 16;
    let packet = Err(Error::InvalidArgument(InvalidArgument::Packet));
    assert_eq!(ch.put_packets::<LL16Packet>(at16 + 4, 1024, 0, 64, 3, 0, 1), packet);
    assert_eq!(ch.put_packets::<LL8Packet>(at16 + 1004, 2048, 0, 64, 3, 0, 1), packet);
    ch.flush().unwrap();
    assert_eq!(l.src.read(), data, "no packet written locally");
    assert_eq!(l.dst.read(), vec![0xee; 4096], "nothing placed at the peer");
    assert_eq!(l.a.sq_consumed(), 0, "nothing posted");
    // 64 bytes in LL16 packets: 128 bytes, each 16-byte packet carrying 8 data bytes and the flag twice.
    ch.put_packets::<LL16Packet>(at16, 1024, 0, 64, 3, 0, 1).unwrap();
    ch.flush().unwrap();
    let (landed, sent) = (l.dst.read(), l.src.read());
    assert_eq!(&landed[at16 as usize..at16 as usize + 128], &sent[1024..1152]);
    for (i, p) in sent[1024..1152].chunks(16).enumerate() {
        assert_eq!(&p[..4], &data[8 * i..8 * i + 4], "packet {i}'s first data word");
        assert_eq!(&p[8..12], &data[8 * i + 4..8 * i + 8], "packet {i}'s second data word");
    }
}

/// A wait that timed out gives its count back: the signal that arrives after it satisfies the retried wait,
/// and the counts stay matched (the next wait is for the second signal). Before, the timed-out wait kept its
/// count, so the retry waited for a second signal that never came.
#[test]
fn a_wait_that_timed_out_is_retried_for_the_same_signal() {
    let l = Link::new(4096, 64, false);
    let mut h = l.handle();
    h.timeout_ns = 50_000_000;
    // SAFETY: the link's handle, used by this thread only; the link outlives the channel.
    let mut ch = unsafe { PortChannel::<Exclusive>::new(&h) };
    let timed_out = |r, want: (u64, u64)| match r {
        Err(Error::Timeout(t)) => match t.on {
            WaitOn::Semaphore { expected, seen, .. } => assert_eq!((expected, seen), want),
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    };
    timed_out(ch.wait(), (1, 0));
    // This channel signals the semaphore it waits on (one direction of a link): the late signal.
    ch.signal().unwrap();
    ch.flush().unwrap();
    assert_eq!(ch.wait(), Ok(()));
    timed_out(ch.wait(), (2, 1));
}

/// Warp sharing on the host: a thread is a warp of one lane, so each call is its own batch of one WQE and one
/// doorbell (no staging, no BlueFlame).
#[test]
fn warp_put_with_signal_and_flush() {
    let mut rng = rng();
    let l = Link::new(1 << 16, 64, false);
    let data = random_bytes(&mut rng, 1 << 16);
    l.src.write(0, &data);
    let mut qh = *l.qp_h;
    let mut h = l.handle();
    h.max_wqe_bytes = 10_000;
    h.qp = &mut qh as *mut _ as u64;
    // SAFETY: `qh` is a copy of A's handle used by this thread (a warp of one lane) only; the link outlives
    // the channel.
    let mut ch = unsafe { PortChannel::<gdaki_device::channel::Warp>::new(&h) };
    ch.put_with_signal(0, 0, 1 << 16).unwrap();
    ch.signal().unwrap();
    ch.flush().unwrap();
    assert_eq!(l.dst.read(), data);
    assert_eq!(l.sem.load_u64(0), 2);
    let s = l._nics[0].stats();
    // 7 WRITEs (6 of 10,000 bytes, one of 5,536) and two fetch-adds, none by BlueFlame; the fetch-adds asked
    // for CQEs, so `flush` needed no NOP.
    assert_eq!((l.a.sq_consumed(), qh.sq.pi, s.blueflame + s.blueflame_fallbacks), (9, 9, 0), "{s:?}");
}

/// The threads of one block each put their own 64-byte piece `rounds` times through their own
/// `PortChannel::<Warp>` of `ch` (on the GPU, the lanes of one warp, together), then flush; each stores its
/// flush's error kind + 1 (1: none) at `out[tid]`.
#[gdaki_device::kernel]
pub fn warp_pieces(t: &gdaki_device::Thread, ch: &PortChannelHandle, rounds: u32, out: *mut u64) {
    // SAFETY: the test's live link; the block's threads (one warp on the GPU) are the QP's only posters.
    let mut c = unsafe { PortChannel::<gdaki_device::channel::Warp>::new(ch) };
    let n = t.block_size() as u64;
    let r = (0..rounds as u64)
        .try_for_each(|k| {
            let off = (k * n + t.tid() as u64) * 64;
            c.put(off, off, 64)
        })
        .and_then(|()| c.flush());
    // SAFETY: `out` holds a word per thread of the block (the test's contract).
    unsafe { out.add(t.tid() as usize).write_volatile(1 + r.err().map_or(0, |e| e.to_report().kind as u64)) };
}

/// A block of 32 threads, one warp on the GPU, sharing one Warp-sharing handle: on the `cpu` executor each
/// thread is a warp of one lane, and the threads take turns on the QP (tickets in the handle's state, served in order) instead of
/// racing on its counters. Before, each thread kept its own leader `Qp` of the handle: posts overwrote one
/// another, CQEs came for WQEs a thread never posted (an unexpected CQE), and pieces never landed.
#[test]
fn the_threads_of_a_warp_share_a_warp_handle_on_host_threads() {
    const ROUNDS: u32 = 8;
    let len = ROUNDS as usize * 32 * 64;
    let l = Link::new(len, 64, false);
    let data = random_bytes(&mut rng(), len);
    l.src.write(0, &data);
    let h = Box::new(l.handle());
    let mut out = [0u64; 32];
    let (hp, outp) = (&*h as *const PortChannelHandle as u64, out.as_mut_ptr() as u64);
    let args = (gdaki_device::DevPtr::new(hp), ROUNDS, gdaki_device::DevPtr::new(outp));
    // SAFETY: the handle and `out` outlive the launch; the link's QP is this block's alone.
    unsafe {
        gdaki_device::launch::run_on_host(&WARP_PIECES, gdaki_device::Dim3::x(1), gdaki_device::Dim3::x(32), args, 0)
    }
    .unwrap();
    assert_eq!(out, [1; 32], "every thread's puts and flush");
    assert_eq!(l.dst.read(), data);
    // One WRITE per piece (and a NOP per flush that found the last WQE unsignaled at most).
    let consumed = l.a.sq_consumed();
    assert!((256..=256 + 32).contains(&consumed), "{consumed} WQEs");
}

/// Each thread of the launch puts its own 64-byte piece `rounds` times through its own channel of `ch`, in Warp
/// sharing when `warp` is 1, else Block, then flushes (with `warp` 2, Warp sharing, each CTA puts 256 bytes a
/// round together, `put_block`, whose one WQE is member 0's: the other members make the call with none); it
/// stores at `out[global id]` 1 on success, else (with 2^20 added when it is the flush's) 2 +
/// its error's report kind << 8 + the report's `expected` word (an `InvalidArgument`'s code). With `only`
/// below `u32::MAX`, only the threads of unit `only` (threads `only * unit ..` of `unit` each) post; the
/// others store 0.
#[gdaki_device::kernel]
pub fn shared_pieces(
    t: &gdaki_device::Thread,
    ch: &PortChannelHandle,
    warp: u32,
    rounds: u32,
    only: u32,
    unit: u32,
    out: *mut u64,
) {
    /// The first error of the puts, or the flush's as `Err(Err(e))`.
    fn run<S: Sharing>(
        t: &gdaki_device::Thread,
        ch: &PortChannelHandle,
        rounds: u32,
        block: bool,
    ) -> Result<(), Result<Error, Error>> {
        // SAFETY: the test's live link; the contract's one CTA (Block) or one warp (Warp) is what the test breaks
        // and the cpu executor must refuse.
        let mut c = unsafe { PortChannel::<S>::new(ch) };
        let (ctas, n) = (t.grid_dim().count(), t.grid_dim().count() * t.block_size() as u64);
        let cta = t.global_id() / t.block_size() as u64;
        (0..rounds as u64)
            .try_for_each(|k| {
                if block {
                    let off = (k * ctas + cta) * 256;
                    return c.put_block(t, off, off, 256);
                }
                let off = (k * n + t.global_id()) * 64;
                c.put(off, off, 64)
            })
            .map_err(Ok)?;
        c.flush().map_err(Err)
    }
    let code = if only != u32::MAX && t.global_id() / u64::from(unit) != u64::from(only) {
        0
    } else {
        let r = match warp {
            0 => run::<Block>(t, ch, rounds, false),
            // Both modes on one QP in one launch: CTA 1 by Block scope, warp 1 of CTA 0 by Warp sharing
            // (warp 0 of CTA 0 does nothing).
            3 if t.global_id() / t.block_size() as u64 == 1 => run::<Block>(t, ch, rounds, false),
            3 if t.tid() / 32 == 1 => run::<gdaki_device::channel::Warp>(t, ch, rounds, false),
            3 => return,
            _ => run::<gdaki_device::channel::Warp>(t, ch, rounds, warp == 2),
        };
        let code = |e: Error| 2 + (u64::from(e.to_report().kind) << 8 | e.to_report().expected);
        match r {
            Ok(()) => 1,
            Err(Ok(e)) => code(e),
            // The flush's error: set apart, so that a team call that let a member through shows.
            Err(Err(e)) => 1 << 20 | code(e),
        }
    };
    // SAFETY: `out` holds a word per thread of the launch (the test's contract).
    unsafe { out.add(t.global_id() as usize).write_volatile(code) };
}

/// Runs [`shared_pieces`] on host threads in `ctas` CTAs of `threads` on the channel `h` with its `warp`,
/// `rounds`, `only` and `unit` arguments; returns each thread's code (`fill` where a thread wrote none).
fn shared_pieces_on_host(
    h: &PortChannelHandle,
    (ctas, threads): (u32, u32),
    a: (u32, u32, u32, u32),
    fill: u64,
) -> Vec<u64> {
    let (warp, rounds, only, unit) = a;
    let mut out = vec![fill; (ctas * threads) as usize];
    let (hp, outp) = (h as *const PortChannelHandle as u64, out.as_mut_ptr() as u64);
    let args = (gdaki_device::DevPtr::new(hp), warp, rounds, only, unit, gdaki_device::DevPtr::new(outp));
    // SAFETY: the handle and `out` outlive the launch; the handle's QP is this launch's alone.
    unsafe {
        gdaki_device::launch::run_on_host(
            &SHARED_PIECES,
            gdaki_device::Dim3::x(ctas),
            gdaki_device::Dim3::x(threads),
            args,
            0,
        )
    }
    .unwrap();
    out
}

/// On the `cpu` executor a Block-scope QP takes posts from one CTA of a launch, and a Warp-sharing handle from
/// one warp (`tid / 32` of one CTA): on the GPU a second CTA's `.cta` atomics, or a second warp's own leader,
/// would corrupt the QP, while host threads would take turns and pass every byte. The first unit to post owns
/// the QP for the launch; the others get `Sharing` and post nothing; a later launch may be another unit's.
#[test]
fn a_block_qp_takes_one_cta_and_a_warp_handle_one_warp_of_a_launch() {
    const ROUNDS: u32 = 4;
    let r = Error::InvalidArgument(InvalidArgument::Sharing).to_report();
    let team = 2 + (u64::from(r.kind) << 8 | r.expected);
    // (Block 0, Warp 1, Warp team calls 2; CTAs; threads a CTA; threads a unit)
    for (warp, ctas, threads, unit) in [(0u32, 2u32, 4u32, 4usize), (1, 1, 64, 32), (1, 2, 32, 32), (2, 2, 32, 32)] {
        let len = (ROUNDS * ctas * threads) as usize * 64;
        let l = Link::new(len, 256, false);
        let data = random_bytes(&mut rng(), len);
        l.src.write(0, &data);
        let before = l.dst.read();
        let h = Box::new(l.handle());
        let launch = |only: u32| shared_pieces_on_host(&h, (ctas, threads), (warp, ROUNDS, only, unit as u32), 0);
        let out = launch(u32::MAX);
        let what = ["Block", "Warp", "Warp team"][warp as usize];
        let owners: Vec<usize> =
            (0..out.len() / unit).filter(|&u| out[u * unit..][..unit] == vec![1; unit][..]).collect();
        assert_eq!(owners.len(), 1, "{what}: one unit posts: {out:?}");
        let owner = owners[0];
        for (i, &code) in out.iter().enumerate() {
            assert_eq!(code, if i / unit == owner { 1 } else { team }, "{what}: thread {i}: {out:?}");
        }
        // The owner's pieces landed; nothing else changed.
        let mut want = before.clone();
        let units = out.len() / unit;
        for k in 0..ROUNDS as usize {
            let ranges: Vec<usize> = if warp == 2 {
                vec![(k * units + owner) * 256, 256]
            } else {
                (owner * unit..(owner + 1) * unit).flat_map(|i| [(k * out.len() + i) * 64, 64]).collect()
            };
            for r in ranges.chunks(2) {
                want[r[0]..r[0] + r[1]].copy_from_slice(&data[r[0]..r[0] + r[1]]);
            }
        }
        assert!(l.dst.read() == want, "{what}: the owner's pieces and nothing else");
        // In a later launch another unit posts (the claim lasts one launch).
        let other = (owner + 1) % units;
        let again = launch(other as u32);
        for (i, &code) in again.iter().enumerate() {
            assert_eq!(code, u64::from(i / unit == other), "{what}: a later launch of unit {other}: {again:?}");
        }
    }
}

/// One QP used in one launch by Block scope (CTA 1) and by Warp sharing (warp 1 of CTA 0): on the GPU the
/// CTA's `.cta` atomics and the warp's own leader would corrupt it, so on the `cpu` executor whichever posts
/// first owns the QP for the launch and the other gets `Sharing`. (CTA 1 and warp 1 are both unit 1 of their
/// kind: a claim that did not tell the kinds apart let both post.)
#[test]
fn a_qp_takes_one_sharing_mode_in_a_launch() {
    let r = Error::InvalidArgument(InvalidArgument::Sharing).to_report();
    let team = 2 + (u64::from(r.kind) << 8 | r.expected);
    let (ctas, threads) = (2u32, 64u32);
    let len = (ctas * threads) as usize * 64;
    let l = Link::new(len, 256, false);
    let h = Box::new(l.handle());
    let out = shared_pieces_on_host(&h, (ctas, threads), (3, 1, u32::MAX, 32), u64::MAX);
    let (idle, warp, cta) = (&out[..32], &out[32..64], &out[64..]);
    assert!(idle.iter().all(|&c| c == u64::MAX), "warp 0 of CTA 0 posts nothing: {out:?}");
    let warp_owns = warp.iter().all(|&c| c == 1) && cta.iter().all(|&c| c == team);
    let cta_owns = cta.iter().all(|&c| c == 1) && warp.iter().all(|&c| c == team);
    assert!(warp_owns || cta_owns, "one of the two posts, the other gets Sharing: {out:?}");
}

/// The host turns of `l`'s QP: (`host_next`, `host_serving`), read as the library accesses them (the serving
/// ticket in the low half of a 64-bit word with `host_given_up`).
fn turn_words(l: &Link) -> (u32, u32) {
    use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
    let state = &l.qp_h.sq as *const gdaki_shared::handle::SqState;
    // SAFETY: the turn words of the live link's state, only ever accessed atomically, in these sizes.
    unsafe {
        let next = AtomicU32::from_ptr(std::ptr::addr_of!((*state).host_next) as *mut u32);
        let turn = AtomicU64::from_ptr(std::ptr::addr_of!((*state).host_serving) as *mut u64);
        (next.load(Ordering::Acquire), turn.load(Ordering::Acquire) as u32)
    }
}

/// A host thread whose wait for its turn runs out (its channel's timeout is shorter than the holder's, two
/// channels of one QP) gives its ticket up, and the turn passes over it: the holder and every later call go on.
/// Before, the abandoned ticket was never served nor passed, and every later call on the QP timed out on its
/// turn.
#[test]
fn a_ticket_given_up_is_passed_over() {
    let l = Link::new(4096, 64, false);
    let h = l.handle();
    let short = PortChannelHandle { timeout_ns: 20_000_000, ..h };
    use gdaki_device::channel::Warp;
    l._nics[0].hold_executor(true);
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| {
            let mut ch = shared::<Warp>(&h);
            ch.put(0, 0, 64).and_then(|()| ch.flush())
        });
        // A's put took ticket 0; its flush holds ticket 1 until the NIC runs again.
        emu_util::wait_until("A's flush holding its turn", || turn_words(&l) == (2, 1));
        // B's put waits out its 20 ms bound (a few times over) behind A's flush and gives ticket 2 up.
        let b = shared::<Warp>(&short).put(64, 64, 64);
        l._nics[0].hold_executor(false);
        (a.join().unwrap(), b)
    });
    assert_eq!(a, Ok(()));
    assert!(matches!(b, Err(Error::Timeout(t)) if matches!(t.on, WaitOn::Turn { ticket: 2, serving: 1, .. })), "{b:?}");
    // Ticket 2 was passed over: the next call takes 3 and is served at once.
    let mut ch = shared::<Warp>(&h);
    assert_eq!(ch.put(128, 128, 64).and_then(|()| ch.flush()), Ok(()));
    assert_eq!(turn_words(&l), (5, 5));
    assert_eq!(l.dst.read()[..64], l.src.read()[..64]);
    assert_eq!(l.dst.read()[128..192], l.src.read()[128..192]);
}

/// Host threads sharing a Warp-sharing handle take their turns in order: a thread that waits for its turn
/// while another holds the QP (a flush the NIC does not answer yet) posts before the holder's next call. With a
/// lock that the holder could take straight back, it kept the QP call after call while the others waited out
/// their timeouts (seen with eight threads on a loaded 2-core machine).
#[test]
fn a_host_thread_waiting_for_its_turn_posts_before_the_holders_next_call() {
    let l = Link::new(4096, 64, false);
    let h = l.handle();
    let turns = || turn_words(&l);
    let warp = || shared::<gdaki_device::channel::Warp>(&h);
    l._nics[0].hold_executor(true);
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| {
            let mut ch = warp();
            // The flush holds the turn until the NIC runs again; the next put takes a turn at once after it.
            (ch.put(0, 0, 64).and_then(|()| ch.flush()), ch.put(128, 128, 64).and_then(|()| ch.flush()))
        });
        // Tickets: A's first put took 0 and ended its turn (serving 1); its flush holds 1; B's put takes 2.
        emu_util::wait_until("A's flush holding its turn", || turns() == (2, 1));
        let b = s.spawn(|| {
            let mut ch = warp();
            ch.put(64, 64, 64).and_then(|()| ch.flush())
        });
        emu_util::wait_until("B waiting for its turn", || turns() == (3, 1));
        l._nics[0].hold_executor(false);
        (a.join().unwrap(), b.join().unwrap())
    });
    assert_eq!((a, b), ((Ok(()), Ok(())), Ok(())));
    // The WRITEs in ring order, by their offsets at the peer: A's first, B's, A's second (NOPs between).
    let (ring, pi) = (l.qp_h.sq_buf as *const [u8; 64], l.qp_h.sq.pi);
    let offsets: Vec<u64> = (0..pi)
        .filter_map(|i| {
            // SAFETY: WQEBB `i` of the live link's 64-WQEBB ring (`pi` is below 64 here).
            let wqebb = unsafe { *ring.add(i as usize) };
            let opcode = wqebb[3];
            let raddr = u64::from_be_bytes(wqebb[16..24].try_into().unwrap());
            (opcode == gdaki_shared::prm::opcode::RDMA_WRITE).then(|| raddr - h.dst.addr)
        })
        .collect();
    assert_eq!(offsets, [0, 64, 128], "ring of {pi} WQEBBs");
    assert_eq!(l.dst.read()[..192], l.src.read()[..192]);
}

/// Warp sharing on host threads (each a warp of one lane): a block put with a signal whose members come late
/// (the others sleep before the call) signals only once every member's pieces are posted, so the member that
/// signals sees the whole range at the peer once its flush returns. Before, member 0 posted its piece and the
/// signal at once, and the peer saw the signal with a quarter of the range.
#[test]
fn a_warp_block_put_signals_after_every_members_pieces() {
    let (l, data, h) = team_link(64);
    let seen = std::sync::Mutex::new(Vec::new());
    teams(1, 4, |_, m| {
        if m.rank != 0 {
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let mut ch = shared::<gdaki_device::channel::Warp>(&h);
        let r = ch.put_block_with_signal(m, 0, 0, 1024).and_then(|()| ch.flush());
        let at_flush = (m.rank == 0).then(|| (l.sem.load_u64(0), l.dst.read()[..1024] == data[..1024]));
        seen.lock().unwrap().push((m.rank, r, at_flush));
    });
    for (rank, r, at_flush) in seen.into_inner().unwrap() {
        assert_eq!(r, Ok(()), "rank {rank}");
        if let Some((sem, whole)) = at_flush {
            assert_eq!((sem, whole), (1, true), "the signal and the range when member 0's flush returned");
        }
    }
    assert_eq!(l.sem.load_u64(0), 1);
    assert_eq!(l.dst.read()[..1024], data[..1024]);
}

/// Warp sharing's team calls take a CTA of one warp: on the GPU the warps of a larger CTA would each keep a
/// leader and counters of one QP and overwrite one another's WQEs. Host threads take turns and would hide it,
/// so a team of 33 is refused there too, every member alike, before anything is posted; a team of 32 posts.
#[test]
fn a_warp_team_call_from_more_than_one_warp_is_refused() {
    let (l, data, h) = team_link(64);
    let before = l.dst.read();
    let results = std::sync::Mutex::new(Vec::new());
    teams(1, 33, |_, m| {
        let mut ch = shared::<gdaki_device::channel::Warp>(&h);
        let r = (ch.put_block(m, 0, 0, 1024), ch.put_block_with_signal(m, 0, 0, 1024));
        results.lock().unwrap().push(r);
    });
    let refused = Err(Error::InvalidArgument(InvalidArgument::TeamRules));
    assert_eq!(results.into_inner().unwrap(), vec![(refused, refused); 33]);
    // SAFETY: the threads have ended; the state is plain memory of the link.
    let st = unsafe { std::ptr::read_volatile(&l.qp_h.sq) };
    assert_eq!((st.pi, l.a.sq_consumed(), l.sem.load_u64(0)), (0, 0, 0), "nothing posted, no signal");
    assert!(l.dst.read() == before);

    teams(1, 32, |_, m| {
        let mut ch = shared::<gdaki_device::channel::Warp>(&h);
        ch.put_block_with_signal(m, 0, 0, 1024).and_then(|()| ch.flush()).unwrap();
    });
    assert_eq!((l.sem.load_u64(0), &l.dst.read()[..1024]), (1, &data[..1024]));
}

/// A Warp-sharing team put of 32 pieces on a ring of 16 WQEBBs: one batch of 32 WQEBBs on the GPU, over half
/// the ring, `Batch` for every lane there. Host threads post one at a time, so the member whose rank puts the
/// batch over half the ring (ranks 8 and up: pieces of ranks 0 ..= 8 take 9 WQEBBs) is refused there too, and
/// the test fails as the GPU's would; the members below pass. Before, every member passed on the host.
#[test]
fn a_warp_team_batch_over_half_the_ring_is_refused_on_host_threads_too() {
    let (l, data, h) = team_link(16);
    let results = std::sync::Mutex::new(Vec::new());
    teams(1, 32, |_, m| {
        let mut ch = shared::<gdaki_device::channel::Warp>(&h);
        let at = 64 * u64::from(m.rank);
        let r = ch.put_team(m, at, at, 64);
        let f = ch.flush();
        results.lock().unwrap().push((m.rank, r, f));
    });
    let length = Err(Error::InvalidArgument(InvalidArgument::Batch));
    for (rank, r, f) in results.into_inner().unwrap() {
        assert_eq!(r, if rank < 8 { Ok(()) } else { length }, "rank {rank}");
        assert_eq!(f, Ok(()), "rank {rank}'s flush");
    }
    assert_eq!(l.dst.read()[..512], data[..512], "the pieces of ranks 0 to 7");
}

#[test]
fn signal_never_overtakes_the_data() {
    let mut rng = rng();
    let l = Link::new(4096, 64, true);
    let h = l.handle();
    let rounds = 300u64;
    let words: Vec<u64> = (0..rounds).map(|_| rng.random()).collect();
    std::thread::scope(|s| {
        let h = &h;
        let words = &words;
        let src = &l.src;
        s.spawn(move || {
            let mut ch = shared::<Device>(h);
            for (k, w) in words.iter().enumerate() {
                // Each round overwrites all 4 KiB with a new pattern, then signals.
                src.write(0, &w.to_ne_bytes().repeat(512));
                ch.put_with_signal(0, 0, 4096).unwrap();
                ch.flush().unwrap_or_else(|e| panic!("round {k}: {e}"));
            }
        });
        // The receiver: after each signal, the whole 4 KiB holds that round's pattern or a later one.
        let mut rx = shared::<Device>(h);
        for k in 0..words.len() {
            rx.wait().unwrap_or_else(|e| panic!("wait {k}: {e}"));
            // Later rounds may be placed in part already; none of round k's bytes may be older.
            // Word loads: the NIC stores aligned words whole, while bytes of the next round may be landing.
            for i in 0..512 {
                let w = l.dst.load_u64(i * 8);
                let pos = words
                    .iter()
                    .position(|x| *x == w)
                    .unwrap_or_else(|| panic!("round {k}, word {i}: {w:#x} was never sent"));
                assert!(pos >= k, "round {k}, word {i}: signal seen before its data (pattern of round {pos})");
            }
        }
    });
}

/// Exclusive sharing with a BlueFlame limit of 0 never writes the BlueFlame register, for puts and for the
/// fetch-adds of `signal`, `put_with_signal` and `put_with_accumulate`; with the default limit the same
/// sequence does (so that the count of 0 is not the emulator failing to notice).
#[test]
fn blue_flame_limit_zero_means_no_blue_flame_for_signals_too() {
    for (limit, expect_bf) in [(0u64, false), (512 << 10, true)] {
        let l = Link::new(4096, 64, false);
        l.src.write(0, &[0x5a; 4096]);
        l.dst.write(1024, &[0; 8]);
        let mut qh = *l.qp_h;
        let mut h = l.handle();
        h.qp = &mut qh as *mut _ as u64;
        h.blue_flame_limit = limit;
        // SAFETY: `qh` is a copy of A's handle used by this thread only; the link outlives the channel.
        let mut ch = unsafe { PortChannel::<Exclusive>::new(&h) };
        for _ in 0..4 {
            ch.signal().unwrap();
            ch.put_with_signal(0, 0, 64).unwrap();
            ch.put_with_accumulate(64, 64, 64, 1024, 3).unwrap();
        }
        ch.flush().unwrap();
        assert_eq!(l.sem.load_u64(0), 8, "limit {limit}: every signal counted");
        assert_eq!(l.dst.u64_at(1024), 12, "limit {limit}: every accumulate applied");
        let s = l._nics[0].stats();
        // Taken from the register or not (the poster may overtake the NIC): a BlueFlame write seen.
        assert_eq!(s.blueflame + s.blueflame_fallbacks > 0, expect_bf, "limit {limit}: {s:?}");
    }
}

/// A channel's `read_packets` watches its QP: with the peer's QP gone, the put of this side's packets fails
/// with syndrome 0x15 (transport retry exceeded), and a read of the answer ends with that error CQE long before
/// the channel's timeout, where `Packets::read_packets`, which knows no QP, waits the timeout out.
#[test]
fn read_packets_of_a_channel_ends_with_its_qps_error_when_the_peer_is_gone() {
    let l = Link::new(4096, 64, false);
    let qpn = l.a.qpn();
    let mut h = l.handle();
    drop(l._b);
    // SAFETY: `h` names the link's live QP handle and memories, used by this thread only; the link outlives the
    // channel.
    let mut ch = unsafe { PortChannel::<Exclusive>::new(&h) };
    ch.put_packets::<LL16Packet>(0, 2048, 0, 64, 1, 0, 1).unwrap();
    let t0 = std::time::Instant::now();
    let r = ch.read_packets::<LL16Packet>(0, 1024, 64, 2, 0, 1);
    let took = t0.elapsed();
    match r {
        Err(Error::Cqe(e)) => assert_eq!((e.syndrome, e.qpn), (syndrome::TRANSPORT_RETRY_EXC_ERR, qpn)),
        other => panic!("the read returned {other:?}"),
    }
    assert!(took < std::time::Duration::from_nanos(TIMEOUT_NS / 2), "the read took {took:?}");
    drop(ch);
    h.timeout_ns = 200_000_000;
    // SAFETY: as above; the channel before it is dropped.
    let ch = unsafe { PortChannel::<Exclusive>::new(&h) };
    match ch.packets().read_packets::<LL16Packet>(0, 1024, 64, 2, 0, 1) {
        Err(Error::Timeout(t)) => assert!(matches!(t.on, WaitOn::Packet { flag: 2, .. }), "{t:?}"),
        other => panic!("the memory's read returned {other:?}"),
    }
}

/// `put_with_accumulate` checks its arguments in their order: a put range outside the memories is the range
/// error even when the accumulated word is misaligned too, and a good range with a misaligned word is the
/// alignment error; either way nothing is posted (the CQ stays empty, the destination untouched).
#[test]
fn put_with_accumulate_names_the_put_range_before_the_word() {
    let l = Link::new(4096, 64, false);
    l.dst.fill(0);
    let h = l.handle();
    // SAFETY: `h` names the link's live QP and memories, used by this thread only; the link outlives the channel.
    let mut ch = unsafe { PortChannel::<Exclusive>::new(&h) };
    let bad_range = ch.put_with_accumulate(4000, 0, 200, 1027, 1).unwrap_err();
    assert_eq!(Err(bad_range), emu_util::remote_range::<()>(4000, 200, 4096), "{bad_range}");
    let bad_word = ch.put_with_accumulate(0, 0, 64, 1027, 1).unwrap_err();
    assert_eq!(bad_word, Error::InvalidArgument(InvalidArgument::AtomicAlignment), "{bad_word}");
    ch.flush().unwrap();
    assert!(l.dst.read().iter().all(|&b| b == 0), "nothing placed");
}

/// A hand-made handle whose signal words are not 8 bytes, 8-byte aligned: `signal`, `put_with_signal` and
/// `put_block_with_signal` refuse it with the argument error, before anything is posted, in every sharing mode.
/// The NIC alone would not catch all of them: it checks only the remote word's alignment and the MRs' bounds,
/// so a scratch word that is misaligned, or shorter than 8 bytes, inside a larger `LOCAL_WRITE` MR took the
/// fetch-add's old value silently (8 bytes at an odd address, or past the word's end), and a semaphore word
/// of fewer than 8 bytes was added to.
#[test]
fn signal_words_that_are_not_8_aligned_bytes_are_refused_before_anything_is_posted() {
    fn run<S: Sharing>(members: u32) {
        let mut rng = rng();
        // The 8-byte word at offset 0 of a memory of `length` bytes, the peer's or local.
        let word = |remote, length| Error::Range(RangeError { remote, offset: 0, bytes: 8, length });
        let align = Error::InvalidArgument(InvalidArgument::AtomicAlignment);
        let cases: [(&str, Error, Spoil); 6] = [
            ("scratch misaligned in a larger MR", align, |h, big| h.scratch = part_of(big, 3, 8)),
            ("scratch of 4 bytes in a larger MR", word(false, 4), |h, big| h.scratch = part_of(big, 8, 4)),
            ("scratch of 0 bytes", word(false, 0), |h, _| h.scratch.length = 0),
            ("semaphore of 4 bytes", word(true, 4), |h, _| h.remote_sem.length = 4),
            ("semaphore of 0 bytes", word(true, 0), |h, _| h.remote_sem.length = 0),
            ("semaphore misaligned", align, |h, _| h.remote_sem.addr += 4),
        ];
        for (what, want, bad) in cases {
            for op in ["signal", "put_with_signal", "put_block_with_signal"] {
                let l = Link::new(4096, 64, false);
                let data = random_bytes(&mut rng, 4096);
                l.src.write(0, &data);
                // Another `LOCAL_WRITE` MR of A, where a misplaced scratch word lies inside registered memory.
                let big = GuardedBuf::new(64, 0x11);
                let big_mr = big.register(&l._nics[0], &l._pds.0, Access::LOCAL_WRITE);
                let mut h = l.handle();
                h.max_wqe_bytes = 1000;
                bad(&mut h, &big_mr);
                let results = std::sync::Mutex::new(Vec::new());
                teams(1, members, |_, m| {
                    let mut ch = shared::<S>(&h);
                    let r = match op {
                        "signal" => ch.signal(),
                        "put_with_signal" => ch.put_with_signal(0, 0, 4096),
                        _ => ch.put_block_with_signal(m, 0, 0, 4096),
                    };
                    results.lock().unwrap().push((r, ch.flush()));
                });
                let what = format!("{} x{members}: {what}, {op}", std::any::type_name::<S>());
                let results = results.into_inner().unwrap();
                assert!(results.iter().all(|r| *r == (Err(want), Ok(()))), "{what}: {results:?}");
                assert_eq!(l._nics[0].stats().wqes, 0, "{what}: something was posted");
                assert!(l.dst.read().iter().all(|&b| b == 0xee), "{what}: the put was placed");
                assert_eq!(l.sem.load_u64(0), 0, "{what}: the semaphore moved");
                assert!(big.read().iter().all(|&b| b == 0x11), "{what}: a fetch-add result landed in the other MR");
                assert_eq!(l.scratch.u64_at(0), 0x7777_7777_7777_7777, "{what}: the scratch word changed");
                assert!(big.guards_intact() && l.scratch.guards_intact() && l.sem.guards_intact(), "{what}");
            }
        }
    }
    run::<Exclusive>(1);
    run::<Block>(3);
    run::<Device>(3);
}

/// Makes a handle bad, given another MR of the posting side.
type Spoil = fn(&mut PortChannelHandle, &Mr);

/// A handle of the `len` bytes at `off` of `mr`.
fn part_of(mr: &Mr, off: u64, len: u64) -> gdaki_shared::handle::MrHandle {
    let h = mr.handle();
    gdaki_shared::handle::MrHandle { addr: h.addr + off, length: len, ..h }
}

/// A hand-made handle whose memory runs past the top of the address space (its address near `u64::MAX`, its
/// length a lie): the offsets are inside the range, so the device code cannot tell, and a put of several WQEs
/// goes to the NIC, which refuses it (its MRs' bounds) with an error CQE, as it does a put of one WQE. Before,
/// the pieces' addresses were added with overflow checks, and in a debug build the put panicked.
#[test]
fn a_multi_wqe_put_past_the_top_of_the_address_space_is_refused_by_the_nic_not_a_panic() {
    for remote in [true, false] {
        for signal in [false, true] {
            let l = Link::new(4096, 64, false);
            l.src.write(0, &random_bytes(&mut rng(), 4096));
            let mut qh = *l.qp_h;
            let mut h = l.handle();
            h.qp = &mut qh as *mut _ as u64;
            h.max_wqe_bytes = 16;
            if remote {
                h.dst.addr = u64::MAX - 100;
            } else {
                h.src.addr = u64::MAX - 100;
            }
            let what = format!("remote {remote}, signal {signal}");
            // SAFETY: `qh` is a copy of A's handle used by this thread only; the link outlives the channel.
            let mut ch = unsafe { PortChannel::<Exclusive>::new(&h) };
            // 13 WQEs, the pieces after the seventh past the top.
            let r = if signal { ch.put_with_signal(0, 0, 200) } else { ch.put(0, 0, 200) };
            assert_eq!(r, Ok(()), "{what}");
            let want = if remote { syndrome::REMOTE_ACCESS_ERR } else { syndrome::LOCAL_PROT_ERR };
            assert!(matches!(ch.flush(), Err(Error::Cqe(c)) if c.syndrome == want), "{what}");
            assert!(l.dst.read().iter().all(|&b| b == 0xee), "{what}: bytes placed");
            assert_eq!(l.sem.load_u64(0), 0, "{what}: the semaphore moved");
            assert!(l.dst.guards_intact() && l.src.guards_intact(), "{what}");
        }
    }
}

/// Randomized stress of the shared-QP protocol, the shape that once made `progress` call a legitimate CQE
/// unexpected: four threads put (random sizes, random payloads, each into its own slots, each put signalled)
/// on one Device-scope QP of a 16-WQEBB ring, each flushing before it reuses its source bytes, while a fifth
/// thread calls `progress` in a loop, for `GDAKI_STRESS_SECS` seconds (default 5; CI runs it longer). Any
/// error is a failure; at the end every slot holds the last payload put there and the semaphore counts every
/// signal.
#[test]
fn shared_qp_posters_and_pollers_stress() {
    use std::sync::atomic::{AtomicBool, AtomicU64 as StdU64, Ordering::Relaxed};
    let secs: u64 = std::env::var("GDAKI_STRESS_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(5);
    let (posters, slots, slot) = (4usize, 16usize, 256usize);
    let region = slots * slot;
    let l = Link::new(posters * region, 16, false);
    let h = l.handle();
    let stop = AtomicBool::new(false);
    let signals = StdU64::new(0);
    let seed = rng().random::<u64>();
    let last: Vec<Vec<Vec<u8>>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..posters)
            .map(|p| {
                let (h, stop, signals, l) = (&h, &stop, &signals, &l);
                s.spawn(move || {
                    let mut rng = <rand::rngs::SmallRng as rand::SeedableRng>::seed_from_u64(seed ^ p as u64);
                    let mut ch = shared::<Device>(h);
                    let mut last = vec![Vec::new(); slots];
                    while !stop.load(Relaxed) {
                        let k = rng.random_range(0..slots);
                        let len = rng.random_range(1..=slot);
                        let off = p * region + k * slot;
                        let data = random_bytes(&mut rng, len);
                        // The previous put from this slot must be done before its source bytes change.
                        ch.flush().unwrap_or_else(|e| panic!("poster {p}: flush: {e}"));
                        l.src.write(off, &data);
                        ch.put_with_signal(off as u64, off as u64, len as u64)
                            .unwrap_or_else(|e| panic!("poster {p}: put_with_signal: {e}"));
                        signals.fetch_add(1, Relaxed);
                        last[k] = data;
                    }
                    ch.flush().unwrap_or_else(|e| panic!("poster {p}: last flush: {e}"));
                    last
                })
            })
            .collect();
        let (h2, stop2) = (&h, &stop);
        s.spawn(move || {
            let mut ch = shared::<Device>(h2);
            let mut polls = 0u64;
            while !stop2.load(Relaxed) {
                ch.poster().progress().unwrap_or_else(|e| panic!("progress after {polls} polls: {e}"));
                polls += 1;
                std::hint::spin_loop();
            }
        });
        std::thread::sleep(std::time::Duration::from_secs(secs));
        stop.store(true, Relaxed);
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    let got = l.dst.read();
    for (p, slots_of) in last.iter().enumerate() {
        for (k, data) in slots_of.iter().enumerate() {
            let off = p * region + k * slot;
            assert_eq!(&got[off..off + data.len()], &data[..], "poster {p} slot {k}");
        }
    }
    assert_eq!(l.sem.load_u64(0), signals.load(Relaxed), "every signal counted once");
    let nic = l._nics[0].stats();
    assert_eq!((nic.dbrec_mismatches, nic.bad_doorbells, nic.error_cqes), (0, 0, 0), "{nic:?}");
    eprintln!("{} puts with signal in {secs} s", signals.load(Relaxed));
}

/// One send-queue state for every sharing mode: the channels of one connection, as later kernels on it would
/// make them, change mode from use to use (Exclusive with BlueFlame, Exclusive split into 4 WQEs by doorbell,
/// Warp, Block, Device, and an Exclusive `Qp` dropped with its WQEs unrung, which its drop rings), for
/// several turns of a 64-WQEBB ring: every put lands, every signal counts once, and the NIC sees no dbrec
/// mismatch, no bad doorbell and no error CQE.
#[test]
fn a_connection_changes_sharing_mode_between_uses() {
    use gdaki_device::channel::Warp;
    use gdaki_device::wqe;
    let mut rng = rng();
    const SLOT: usize = 1024;
    let l = Link::new(16 * SLOT, 64, false);
    let h = l.handle();
    let (mut signals, mut want) = (0u64, vec![0xeeu8; 16 * SLOT]);
    for round in 0..100usize {
        let off = (round % 16) * SLOT;
        let data = random_bytes(&mut rng, SLOT);
        l.src.write(off, &data);
        want[off..off + SLOT].copy_from_slice(&data);
        let o = off as u64;
        let mode = rng.random_range(0..6u32);
        let r = match mode {
            0 => {
                // SAFETY: the link's QP, used by this thread only; the link outlives the channel.
                let mut ch = unsafe { PortChannel::<Exclusive>::new(&h) };
                ch.put_with_signal(o, o, SLOT as u64).and_then(|()| ch.flush())
            }
            1 => {
                let split = PortChannelHandle { max_wqe_bytes: 256, blue_flame_limit: 0, ..h };
                // SAFETY: as above.
                let mut ch = unsafe { PortChannel::<Exclusive>::new(&split) };
                ch.put_with_signal(o, o, SLOT as u64).and_then(|()| ch.flush())
            }
            2 => {
                // SAFETY: as above; this thread is a warp of one lane.
                let mut ch = unsafe { PortChannel::<Warp>::new(&h) };
                ch.put_with_signal(o, o, SLOT as u64).and_then(|()| ch.flush())
            }
            3 => {
                let mut ch = shared::<Block>(&h);
                ch.put_with_signal(o, o, SLOT as u64).and_then(|()| ch.flush())
            }
            4 => {
                let mut ch = shared::<Device>(&h);
                ch.put_with_signal(o, o, SLOT as u64).and_then(|()| ch.flush())
            }
            _ => {
                // An Exclusive poster that posts the put and the signal and never calls `ring_db`: its drop rings
                // them, and a shared flush waits for them.
                {
                    // SAFETY: as above.
                    let mut qp = unsafe { gdaki_device::qp::Qp::new(&mut *(h.qp as *mut QpHandle), h.timeout_ns) };
                    let put = wqe::rdma_write(
                        wqe::Raddr { addr: h.dst.addr + o, rkey: h.dst.rkey },
                        wqe::Sge::new(h.src.addr + o, SLOT as u32, h.src.lkey).unwrap(),
                    );
                    let _ = qp.post(false, put).unwrap();
                    let add = wqe::atomic_fetch_add(
                        wqe::Raddr { addr: h.remote_sem.addr, rkey: h.remote_sem.rkey },
                        wqe::Sge::new(h.scratch.addr, 8, h.scratch.lkey).unwrap(),
                        1,
                    )
                    .unwrap();
                    let _ = qp.post(false, add).unwrap();
                }
                shared::<Device>(&h).flush()
            }
        };
        r.unwrap_or_else(|e| panic!("round {round}, mode {mode}: {e}"));
        signals += 1;
        assert_eq!(l.sem.load_u64(0), signals, "round {round}, mode {mode}: every signal counted once");
        assert!(l.dst.read() == want, "round {round}, mode {mode}: destination differs");
    }
    // SAFETY: no poster runs now.
    let st = unsafe { (*(h.qp as *const QpHandle)).sq };
    assert!(st.pi > 3 * 64, "the ring turned over three times: {st:?}");
    assert_eq!((st.pi, st.ready, st.ci, st.rung), (st.pi, st.pi, st.pi, st.pi), "all published, rung, retired");
    assert_eq!(l.a.sq_consumed(), st.pi, "the NIC consumed every WQEBB");
    let nic = l._nics[0].stats();
    assert_eq!((nic.dbrec_mismatches, nic.bad_doorbells, nic.error_cqes), (0, 0, 0), "{nic:?}");
}

// ---------------------------------------------------------------------------------------------------------
// Team puts: the threads of one CTA posting their pieces together (`PortChannel::put_team`)
// ---------------------------------------------------------------------------------------------------------

/// The barrier of a team of host threads that stands for a CTA: a round counter under a mutex, as the `cpu`
/// executor's block barrier keeps one, and like it (and a CTA barrier on the GPU) no longer waiting for a member
/// that has left ([`TeamSync::leave`]: a thread that returned from the kernel).
struct TeamSync {
    members: u32,
    state: std::sync::Mutex<Round>,
    changed: std::sync::Condvar,
}

/// A [`TeamSync`]'s barrier state.
#[derive(Default)]
struct Round {
    /// Members that have not left.
    live: u32,
    arrived: u32,
    count: u32,
    round: u64,
    last_count: u32,
    /// The words rank 0 handed over this round, and those of the last completed round.
    words: [u64; 4],
    last_words: [u64; 4],
}

impl TeamSync {
    fn new(members: u32) -> Self {
        let round = Round { live: members, ..Round::default() };
        TeamSync { members, state: std::sync::Mutex::new(round), changed: std::sync::Condvar::new() }
    }

    /// Ends the round when every member still here has arrived.
    fn complete_if_full(&self, s: &mut Round) {
        if s.arrived > 0 && s.arrived >= s.live {
            (s.last_count, s.last_words) = (s.count, s.words);
            (s.arrived, s.count, s.round) = (0, 0, s.round + 1);
            self.changed.notify_all();
        }
    }

    /// Waits for every member still here; returns how many passed `true` and the `words` of the member that
    /// passed `from = true`.
    fn sync(&self, flag: bool, from: Option<[u64; 4]>) -> (u32, [u64; 4]) {
        let mut s = self.state.lock().unwrap();
        s.arrived += 1;
        s.count += flag as u32;
        if let Some(w) = from {
            s.words = w;
        }
        let round = s.round;
        self.complete_if_full(&mut s);
        while s.round == round {
            s = self.changed.wait(s).unwrap();
        }
        (s.last_count, s.last_words)
    }

    /// A member leaves (returns from the kernel): later barriers stop waiting for it.
    fn leave(&self) {
        let mut s = self.state.lock().unwrap();
        s.live -= 1;
        self.complete_if_full(&mut s);
    }
}

/// One member of a [`TeamSync`] team.
struct Member<'a> {
    rank: u32,
    team: &'a TeamSync,
}

// SAFETY: distinct ranks below `members` (the spawning loops), every member calls every barrier (the tests'
// loops are the same for all), and the mutex orders every access before a barrier before those after it.
unsafe impl gdaki_device::thread::CtaGroup for Member<'_> {
    fn rank(&self) -> u32 {
        self.rank
    }
    fn members(&self) -> u32 {
        self.team.members
    }
    fn barrier_or(&self, flag: bool) -> bool {
        self.team.sync(flag, None).0 != 0
    }
    fn barrier_count(&self, flag: bool) -> u32 {
        self.team.sync(flag, None).0
    }
    fn barrier_broadcast(&self, words: [u64; 4]) -> [u64; 4] {
        self.team.sync(false, (self.rank == 0).then_some(words)).1
    }
}

/// Runs `f(team, member)` on `teams` teams of `members` host threads each.
fn teams(teams: usize, members: u32, f: impl Fn(usize, &Member<'_>) + Sync) {
    let syncs: Vec<TeamSync> = (0..teams).map(|_| TeamSync::new(members)).collect();
    std::thread::scope(|s| {
        for (t, sync) in syncs.iter().enumerate() {
            for rank in 0..members {
                let f = &f;
                s.spawn(move || f(t, &Member { rank, team: sync }));
            }
        }
    });
}

/// `teams` teams of `members` threads each make `calls` team puts on ONE QP (64 WQEBBs: the ring wraps many
/// times), call `i` with pieces of random lengths for ranks `0 .. k` (k = 1 + i % members, the rest pass
/// none); every byte is checked, and the NIC saw one CQE per call. With `flush_each` every member flushes
/// after each call, so that the NIC acts on each call's doorbells before the next call rings (it counts the
/// register's changes it sees, and a burst of doorbells is one change): it must then have seen exactly one
/// doorbell per call.
fn team_puts<S: Sharing>(nteams: usize, members: u32, calls: usize, flush_each: bool) {
    let mut rng = rng();
    let slot = 48usize;
    let per_team = calls * members as usize * slot;
    let l = Link::new(nteams * per_team, 64, false);
    let payload = random_bytes(&mut rng, nteams * per_team);
    l.src.write(0, &payload);
    let lens: Vec<u64> = (0..nteams * calls * members as usize).map(|_| rng.random_range(1..=slot as u64)).collect();
    let len_of = |t: usize, i: usize, r: u32| {
        let k = 1 + i as u32 % members;
        if r < k {
            lens[(t * calls + i) * members as usize + r as usize]
        } else {
            0
        }
    };
    let off_of = |t: usize, i: usize, r: u32| (t * per_team + (i * members as usize + r as usize) * slot) as u64;
    let h = l.handle();
    teams(nteams, members, |t, m| {
        let mut ch = shared::<S>(&h);
        for i in 0..calls {
            let off = off_of(t, i, m.rank);
            ch.put_team(m, off, off, len_of(t, i, m.rank))
                .unwrap_or_else(|e| panic!("team {t} rank {} call {i}: {e}", m.rank));
            if flush_each {
                ch.flush().unwrap_or_else(|e| panic!("team {t} rank {} flush {i}: {e}", m.rank));
                // Every member's flush is over before the next call rings.
                m.team.sync(false, None);
            }
        }
        ch.flush().unwrap_or_else(|e| panic!("team {t} rank {} flush: {e}", m.rank));
    });
    let got = l.dst.read();
    let mut wqes = 0u64;
    for t in 0..nteams {
        for i in 0..calls {
            for r in 0..members {
                let (off, len) = (off_of(t, i, r) as usize, len_of(t, i, r) as usize);
                wqes += (len > 0) as u64;
                assert_eq!(&got[off..off + len], &payload[off..off + len], "team {t} call {i} rank {r}");
                assert!(got[off + len..off + slot].iter().all(|&b| b == 0xee), "team {t} call {i} rank {r}: past it");
            }
        }
    }
    assert!(l.dst.guards_intact() && l.src.guards_intact());
    // SAFETY: every thread has finished; the state is plain memory.
    let st = unsafe { std::ptr::read_volatile(&l.qp_h.sq) };
    assert_eq!((st.pi, st.ready, st.err_idx), (wqes, wqes, 0), "{st:?}");
    assert!(st.ci >= st.sig_first && st.rung == st.ready, "all retired and rung: {st:?}");
    let team_calls = (nteams * calls) as u64;
    let nic = emu_util::stats_counted(&l._nics[0], wqes, team_calls);
    assert_eq!((nic.wqes, nic.cqes, nic.error_cqes), (wqes, team_calls, 0), "one CQE per team call: {nic:?}");
    if flush_each {
        assert_eq!(nic.doorbells, team_calls, "one doorbell per team call: {nic:?}");
    } else {
        assert!(nic.doorbells <= team_calls, "at most one doorbell per team call: {nic:?}");
    }
    assert_eq!((nic.dbrec_mismatches, nic.stale_doorbells), (0, 0), "{nic:?}");
}

#[test]
fn block_team_put_one_doorbell_and_one_cqe_per_call() {
    team_puts::<Block>(1, 8, 150, true);
    team_puts::<Block>(1, 8, 150, false);
}

#[test]
fn device_team_put_one_doorbell_and_one_cqe_per_call() {
    team_puts::<Device>(1, 8, 100, true);
}

#[test]
fn device_team_puts_of_two_teams_share_one_qp() {
    team_puts::<Device>(2, 4, 150, false);
}

/// A bad piece in one member's part of a team put: that member gets its range error, the others `Team`, the
/// NIC sees nothing, and the next team put on the QP goes out whole. Members with a piece that are not the
/// lowest ranks (those at or past the count of pieces get `TeamRules`), and a piece over `max_wqe_bytes`
/// (`Length`), are
/// refused the same way.
#[test]
fn a_bad_piece_fails_the_whole_team_put_with_nothing_posted() {
    let (l, _, h) = team_link(64);
    let results = std::sync::Mutex::new(Vec::new());
    teams(1, 4, |_, m| {
        let mut ch = shared::<Block>(&h);
        let r = m.rank as u64;
        // Rank 2's source range runs past the 4 KiB MR.
        let bad_src = if r == 2 { 4090 } else { r * 64 };
        let e1 = ch.put_team(m, r * 64, bad_src, 64);
        // Rank 0 has no piece while rank 1 has one.
        let e2 = ch.put_team(m, r * 64, r * 64, if r == 0 { 0 } else { 64 });
        // Rank 3's piece is longer than one WQE takes.
        let e3 = ch.put_team(m, r * 64, r * 64, if r == 3 { 512 } else { 64 });
        let good = ch.put_team(m, 1024 + r * 64, 1024 + r * 64, 64).and_then(|()| ch.flush());
        results.lock().unwrap().push((m.rank, e1, e2, e3, good));
    });
    let mut results = results.into_inner().unwrap();
    results.sort_by_key(|r| r.0);
    let team = Err(Error::InvalidArgument(InvalidArgument::Team));
    for (rank, e1, e2, e3, good) in results {
        let want1 = if rank == 2 { emu_util::local_range(4090, 64, 4096) } else { team };
        assert_eq!(e1, want1, "rank {rank}: bad range");
        let want2 = if rank == 3 { Err(Error::InvalidArgument(InvalidArgument::TeamRules)) } else { team };
        assert_eq!(e2, want2, "rank {rank}: not a prefix");
        let want3 = if rank == 3 { Err(Error::InvalidArgument(InvalidArgument::Length)) } else { team };
        assert_eq!(e3, want3, "rank {rank}: piece over max_wqe_bytes");
        assert_eq!(good, Ok(()), "rank {rank}: the next team put");
    }
    let got = l.dst.read();
    assert!(got[..1024].iter().all(|&b| b == 0xee), "nothing of the refused puts was placed");
    assert_eq!(&got[1024..1280], &l.src.read()[1024..1280]);
    let nic = emu_util::stats_counted(&l._nics[0], 4, 1);
    assert_eq!((nic.wqes, nic.cqes, nic.doorbells), (4, 1, 1), "only the last team put reached the NIC: {nic:?}");
}

/// A team post (`SharedQp::post_team`, which takes any one-WQEBB WQE) in which one member passes a WQE of four
/// WQEBBs (an inline WRITE of `MAX_INLINE` bytes): that member gets `TeamRules`, the others `Team`, in both
/// scopes; nothing reaches the NIC, and a team post of one-WQEBB WRITEs then lands whole.
#[test]
fn a_team_post_with_a_wqe_over_one_wqebb_is_the_rules_for_its_member() {
    fn run<S: gdaki_device::scope::Scope>() {
        use gdaki_device::wqe::{self, Raddr, Sge, MAX_INLINE};
        let (l, data, h) = team_link(64);
        let results = std::sync::Mutex::new(Vec::new());
        teams(1, 4, |_, m| {
            // SAFETY: the link's QP handle and state (host memory, the `cpu` executor), posted to by this team
            // alone, of one scope.
            let qp = unsafe { gdaki_device::shared_qp::SharedQp::<S>::new(h.qp as *mut QpHandle, 1_000_000_000) };
            let at = 64 * u64::from(m.rank);
            let raddr = |off: u64| Raddr { addr: h.dst.addr + off, rkey: h.dst.rkey };
            let write = |off: u64| wqe::rdma_write(raddr(off), Sge::new(h.src.addr + off, 64, h.src.lkey).unwrap());
            let w =
                if m.rank == 1 { wqe::rdma_write_inline(raddr(at), &[7; MAX_INLINE]) } else { Ok(write(at).widen()) };
            let refused = qp.post_team(m, w.map(Some));
            let good = qp.post_team(m, Ok(Some(write(1024 + at)))).and_then(|_| qp.flush());
            results.lock().unwrap().push((m.rank, refused, good));
        });
        let what = std::any::type_name::<S>();
        for (rank, refused, good) in results.into_inner().unwrap() {
            let why = if rank == 1 { InvalidArgument::TeamRules } else { InvalidArgument::Team };
            assert_eq!(refused, Err(Error::InvalidArgument(why)), "{what}: rank {rank}");
            assert!(good.is_ok(), "{what}: rank {rank}: the next team post: {good:?}");
        }
        let got = l.dst.read();
        assert!(got[..1024].iter().all(|&b| b == 0xee), "{what}: the refused post placed bytes");
        assert_eq!(&got[1024..1280], &data[1024..1280], "{what}");
        let nic = emu_util::stats_counted(&l._nics[0], 4, 1);
        assert_eq!((nic.wqes, nic.cqes), (4, 1), "{what}: only the second post reached the NIC: {nic:?}");
    }
    run::<Block>();
    run::<Device>();
}

/// A team put whose batch needs more than half the ring (9 pieces on a 16-WQEBB ring) is `Batch` for every
/// member, in both scopes, as a warp's batch and `Qp::post_batch` are: nothing is placed, and a team put of 8
/// pieces then goes out.
#[test]
fn a_team_put_over_half_the_ring_is_batch_for_every_member() {
    fn run<S: Sharing>() {
        let (l, data, h) = team_link(16);
        let results = std::sync::Mutex::new(Vec::new());
        teams(1, 9, |_, m| {
            let mut ch = shared::<S>(&h);
            let r = m.rank as u64;
            let over = ch.put_team(m, r * 64, r * 64, 64);
            let fits = ch.put_team(m, 1024 + r * 64, 1024 + r * 64, if r < 8 { 64 } else { 0 });
            results.lock().unwrap().push((over, fits.and_then(|()| ch.flush())));
        });
        let length = Err(Error::InvalidArgument(InvalidArgument::Batch));
        assert!(results.into_inner().unwrap().iter().all(|r| *r == (length, Ok(()))), "{}", std::any::type_name::<S>());
        let got = l.dst.read();
        assert!(got[..1024].iter().all(|&b| b == 0xee), "{}: the refused put placed bytes", std::any::type_name::<S>());
        assert_eq!(&got[1024..1536], &data[1024..1536], "{}", std::any::type_name::<S>());
    }
    run::<Block>();
    run::<Device>();
}

/// A team put with a bad rkey: the first WQE fails at the NIC though it asked for no CQE, and `flush` reports
/// its syndrome (sticky), as for single posts.
#[test]
fn flush_reports_a_bad_key_of_an_unsignaled_team_piece() {
    let l = Link::new(4096, 64, false);
    let mut h = l.handle();
    h.dst.rkey = gdaki_shared::Be32::new(h.dst.rkey.get() ^ 0x100);
    let results = std::sync::Mutex::new(Vec::new());
    teams(1, 4, |_, m| {
        let mut ch = shared::<Block>(&h);
        let r = m.rank as u64;
        let put = ch.put_team(m, r * 64, r * 64, 64);
        let f1 = ch.flush();
        let f2 = ch.flush();
        results.lock().unwrap().push((put, f1, f2));
    });
    for (put, f1, f2) in results.into_inner().unwrap() {
        assert_eq!(put, Ok(()));
        for f in [f1, f2] {
            assert!(matches!(f, Err(Error::Cqe(c)) if c.syndrome == syndrome::REMOTE_ACCESS_ERR), "{f:?}");
        }
    }
    assert!(l.dst.read().iter().all(|&b| b == 0xee));
}

/// A block put: every member passes the same range, which goes out in WQEs of `max_wqe_bytes` (here 256
/// bytes), one per member per team call, so 1,000 bytes over 4 members is one call (4 WQEs, one CQE, one
/// doorbell) and 2,600 bytes three calls (11 WQEs); every byte lands where it belongs, nothing outside.
#[test]
fn a_block_put_splits_one_range_over_the_members() {
    for (bytes, calls, wqes) in [(1000u64, 1u64, 4u64), (2600, 3, 11), (8, 1, 1)] {
        let l = block_put_case::<Block>(bytes, |ch, m| ch.put_block(m, 1024, 8, bytes));
        let nic = emu_util::stats_counted(&l._nics[0], wqes, calls);
        assert_eq!((nic.wqes, nic.cqes), (wqes, calls), "{bytes} bytes: {nic:?}");
    }
}

/// Runs `put` (a block put of `bytes` bytes from source offset 8 to destination offset 1024) and a flush on a
/// team of 4 members in sharing `S`, over a fresh link whose channel takes WQEs of at most 256 bytes; checks
/// that every member got `Ok`, that the range landed and nothing outside it. Returns the link, for the NIC's
/// counts.
fn block_put_case<S: Sharing>(
    bytes: u64,
    put: impl Fn(&mut PortChannel<'_, S>, &Member<'_>) -> Result<(), Error> + Sync,
) -> Link {
    let (l, data, h) = team_link(64);
    let results = std::sync::Mutex::new(Vec::new());
    teams(1, 4, |_, m| {
        let mut ch = shared::<S>(&h);
        let r = put(&mut ch, m).and_then(|()| ch.flush());
        results.lock().unwrap().push(r);
    });
    assert!(results.into_inner().unwrap().iter().all(|r| r.is_ok()), "{bytes} bytes");
    let got = l.dst.read();
    let end = 1024 + bytes as usize;
    assert_eq!(&got[1024..end], &data[8..8 + bytes as usize], "{bytes} bytes");
    assert!(got[..1024].iter().chain(&got[end..]).all(|&b| b == 0xee), "{bytes} bytes: nothing outside");
    l
}

/// A block put of zero bytes is a length error for every member, with nothing posted.
#[test]
fn a_block_put_of_nothing_is_a_length_error() {
    let l = Link::new(4096, 64, false);
    let h = l.handle();
    let results = std::sync::Mutex::new(Vec::new());
    teams(1, 4, |_, m| {
        let mut ch = shared::<Block>(&h);
        results.lock().unwrap().push(ch.put_block(m, 0, 0, 0));
    });
    assert!(results.into_inner().unwrap().iter().all(|r| *r == Err(Error::InvalidArgument(InvalidArgument::Length))));
    assert_eq!(l._nics[0].stats().wqes, 0);
}

/// A block put with its signal, in Block and Device sharing, 4 members, WQEs of 256 bytes: a range of fewer
/// pieces than members carries the signal in its last batch (one CQE and one doorbell for 8 or 700 bytes; 11
/// WRITEs and the signal in 3 batches for 2,600 bytes), a range that fills its last batch (1,000 bytes) is
/// followed by member 0's signal. Every byte lands, nothing outside, and the peer's semaphore counts one signal.
#[test]
fn a_block_put_with_signal_carries_the_signal_in_its_last_batch() {
    fn run<S: Sharing>(bytes: u64, wqes: u64, cqes: u64, doorbells: Option<u64>) {
        let l = block_put_case::<S>(bytes, |ch, m| ch.put_block_with_signal(m, 1024, 8, bytes));
        assert_eq!(l.sem.load_u64(0), 1, "{bytes} bytes: one signal");
        let nic = emu_util::stats_counted(&l._nics[0], wqes, cqes);
        assert_eq!((nic.wqes, nic.cqes, nic.error_cqes), (wqes, cqes, 0), "{bytes} bytes: {nic:?}");
        if let Some(d) = doorbells {
            assert_eq!(nic.doorbells, d, "{bytes} bytes: {nic:?}");
        }
    }
    run::<Block>(8, 2, 1, Some(1));
    run::<Block>(700, 4, 1, Some(1));
    run::<Device>(700, 4, 1, Some(1));
    run::<Block>(2600, 12, 3, None);
    run::<Block>(1000, 5, 2, None);
    run::<Device>(1000, 5, 2, None);
}

/// In Exclusive sharing (a team of one) a block put with its signal is the put and then `signal`: the data
/// lands and the semaphore counts one.
#[test]
fn an_exclusive_block_put_with_signal_is_a_put_then_a_signal() {
    let (l, data, h) = team_link(64);
    teams(1, 1, |_, m| {
        // SAFETY: the live link's handle, used by this one thread.
        let mut ch = unsafe { PortChannel::<Exclusive>::new(&h) };
        ch.put_block_with_signal(m, 0, 0, 1000).and_then(|()| ch.flush()).unwrap();
    });
    assert_eq!(&l.dst.read()[..1000], &data[..1000]);
    assert_eq!(l.sem.load_u64(0), 1);
    assert_eq!(l._nics[0].stats().wqes, 5, "four WRITEs and the fetch-add");
}

/// A block put (with or without its signal) whose range leaves either memory is refused as a whole, before
/// anything is posted: every member gets the range error (the same arguments, the same check), no WQE reaches
/// the NIC and the peer's semaphore stays 0, in Block, Device and Exclusive sharing alike. Before, each batch
/// was checked alone, and the batches before the one that left the memory were placed.
#[test]
fn a_block_put_past_the_end_of_either_memory_posts_nothing() {
    fn run<S: Sharing>(members: u32, signal: bool) {
        let (remote, local) = (emu_util::remote_range, emu_util::local_range);
        for (dst, src, bytes, want) in [
            (1u64, 0u64, 4096u64, remote(1, 4096, 4096)),
            (0, 1, 4096, local(1, 4096, 4096)),
            (0, 0, 4097, remote(0, 4097, 4096)),
            (0, 0, u64::MAX, remote(0, u64::MAX, 4096)),
            (u64::MAX - 100, 0, 50, remote(u64::MAX - 100, 50, 4096)),
            (0, u64::MAX - 100, 50, local(u64::MAX - 100, 50, 4096)),
        ] {
            let (l, _, h) = team_link(64);
            let results = std::sync::Mutex::new(Vec::new());
            teams(1, members, |_, m| {
                let mut ch = shared::<S>(&h);
                let r = if signal {
                    ch.put_block_with_signal(m, dst, src, bytes)
                } else {
                    ch.put_block(m, dst, src, bytes)
                };
                results.lock().unwrap().push((r, ch.flush()));
            });
            let what = format!("{} x{members}, signal {signal}: ({dst}, {src}, {bytes})", std::any::type_name::<S>());
            assert!(results.into_inner().unwrap().iter().all(|r| *r == (want, Ok(()))), "{what}");
            assert_eq!(l._nics[0].stats().wqes, 0, "{what}");
            assert!(l.dst.read().iter().all(|&b| b == 0xee), "{what}: a refused block put placed bytes");
            assert_eq!(l.sem.load_u64(0), 0, "{what}: a refused block put signalled");
        }
    }
    for signal in [false, true] {
        run::<Block>(4, signal);
        run::<Device>(4, signal);
        run::<Exclusive>(1, signal);
    }
}

/// A team put whose members' channels are of two handles (one block split between two peers in one call):
/// the members of the second handle get `TeamRules`, the others `Team`, neither peer's memory changes, the second
/// handle's NIC sees nothing, and the first QP goes on (the leader's reservation went out as NOPs): the next team put
/// on it lands whole. Before, the members of the second handle stored into its ring at the first's indices, published
/// nothing there and returned Ok; the first QP published WQEBBs nobody stored and went to the error state.
#[test]
fn a_team_put_over_two_handles_is_refused_for_all() {
    let ((x, _, hx), (y, _, hy)) = (team_link(64), team_link(64));
    let results = std::sync::Mutex::new(Vec::new());
    teams(1, 8, |_, m| {
        let r = m.rank as u64;
        let mut ch = shared::<Block>(if r < 4 { &hx } else { &hy });
        let split = ch.put_team(m, r * 64, r * 64, 64);
        let flushed = ch.flush();
        let mut on_x = shared::<Block>(&hx);
        let good = on_x.put_team(m, 1024 + r * 64, 1024 + r * 64, 64).and_then(|()| on_x.flush());
        results.lock().unwrap().push((m.rank, split, flushed, good));
    });
    for (rank, split, flushed, good) in results.into_inner().unwrap() {
        let why = if rank < 4 { InvalidArgument::Team } else { InvalidArgument::TeamRules };
        assert_eq!((split, flushed, good), (Err(Error::InvalidArgument(why)), Ok(()), Ok(())), "rank {rank}");
    }
    let (got_x, got_y) = (x.dst.read(), y.dst.read());
    assert!(got_x[..1024].iter().all(|&b| b == 0xee), "nothing of the split put was placed at X's peer");
    assert_eq!(&got_x[1024..1536], &x.src.read()[1024..1536], "the next team put on X");
    assert!(got_y.iter().all(|&b| b == 0xee), "nothing was placed at Y's peer");
    // X: the 8 NOPs of the refused batch and the 8 WRITEs after it, a CQE each batch, no error.
    let nic_x = emu_util::stats_counted(&x._nics[0], 16, 2);
    assert_eq!((nic_x.wqes, nic_x.cqes, nic_x.error_cqes), (16, 2, 0), "{nic_x:?}");
    let nic_y = y._nics[0].stats();
    assert_eq!((nic_y.wqes, nic_y.doorbells), (0, 0), "{nic_y:?}");
    assert_eq!(y.qp_h.sq.pi, 0, "Y's state untouched");
}

/// A team post refused before any reservation whose members are on two handles of different ring sizes
/// (10 one-WQEBB WRITEs: over half of a 16-WQEBB ring, under half of a 64-WQEBB one): the members on
/// another handle than member 0's get `TeamRules`, however their own ring judges the batch, and member 0's
/// get what the batch is on member 0's ring (`Batch` over half of it, else `Team`); nothing reaches either
/// NIC. Before, the members on the small ring got `Batch` whichever handle was member 0's.
#[test]
fn a_team_post_over_two_handles_of_different_rings_blames_the_members_off_member_0s() {
    for first_small in [false, true] {
        let ((big, _, hb), (small, _, hs)) = (team_link(64), team_link(16));
        let results = std::sync::Mutex::new(Vec::new());
        teams(1, 10, |_, m| {
            let h = if (m.rank < 5) == first_small { &hs } else { &hb };
            // SAFETY: live handles of the links, posted to by this team only.
            let qp = unsafe { gdaki_device::shared_qp::SharedQp::<Device>::new(h.qp as *mut QpHandle, 1_000_000_000) };
            let off = 64 * u64::from(m.rank);
            let r = gdaki_device::onesided::remote(&h.dst, off, 64);
            let w =
                r.and_then(|r| Ok(gdaki_device::wqe::rdma_write(r, gdaki_device::onesided::local(&h.src, off, 64)?)));
            // Posted before the results' lock is taken: the post's barriers wait for every member.
            let posted = qp.post_team(m, w.map(Some));
            results.lock().unwrap().push((m.rank, posted));
        });
        for (rank, got) in results.into_inner().unwrap() {
            let want = match (rank < 5, first_small) {
                (false, _) => InvalidArgument::TeamRules,
                (true, true) => InvalidArgument::Batch,
                (true, false) => InvalidArgument::Team,
            };
            assert_eq!(
                got,
                Err(Error::InvalidArgument(want)),
                "member 0 on the small ring: {first_small}, rank {rank}"
            );
        }
        for (what, l) in [("64", &big), ("16", &small)] {
            let nic = l._nics[0].stats();
            assert_eq!((nic.wqes, nic.doorbells, l.qp_h.sq.pi), (0, 0, 0), "the {what}-WQEBB QP: {nic:?}");
        }
    }
}

/// A team put whose members' channels are two channels of one QP (the second's destination 1 KiB further):
/// the members of the second channel get `TeamRules`, the others `Team`, and nothing lands, as for two QPs;
/// the QP goes on. Before, the members with the second channel put their pieces at its destination and every
/// member returned Ok, the range split between the two.
#[test]
fn a_team_put_over_two_channels_of_one_qp_is_refused_for_all() {
    let (l, _, h) = team_link(64);
    let mut other = h;
    other.dst.addr += 1024;
    other.dst.length -= 1024;
    let results = std::sync::Mutex::new(Vec::new());
    teams(1, 4, |_, m| {
        let r = m.rank as u64;
        let mut ch = shared::<Block>(if r < 2 { &h } else { &other });
        let split = ch.put_block_with_signal(m, 0, 0, 1000);
        let mut one = shared::<Block>(&h);
        let good = one.put_team(m, 2048 + r * 64, 2048 + r * 64, 64).and_then(|()| one.flush());
        results.lock().unwrap().push((m.rank, split, good));
    });
    for (rank, split, good) in results.into_inner().unwrap() {
        let why = if rank < 2 { InvalidArgument::Team } else { InvalidArgument::TeamRules };
        assert_eq!((split, good), (Err(Error::InvalidArgument(why)), Ok(())), "rank {rank}");
    }
    let got = l.dst.read();
    assert!(got[..2048].iter().all(|&b| b == 0xee), "nothing of the split put landed");
    assert_eq!(&got[2048..2304], &l.src.read()[2048..2304], "the next team put");
    assert_eq!(l.sem.load_u64(0), 0, "no signal");
}

/// A block put that some members of the team never make (they returned from the kernel first, and the barrier
/// no longer waits for them): every member that makes it gets `Team`, nothing reaches the NIC and the peer's
/// semaphore stays 0, in Block and Device sharing, with the leader there or not. Before, the members there
/// posted their own pieces and the signal, and the peer saw the signal with the others' pieces unwritten.
#[test]
fn a_block_put_that_some_members_never_make_posts_nothing() {
    fn run<S: Sharing>(gone: &[u32]) {
        let (l, _, h) = team_link(64);
        let results = std::sync::Mutex::new(Vec::new());
        teams(1, 4, |_, m| {
            if gone.contains(&m.rank) {
                m.team.leave();
                return;
            }
            let mut ch = shared::<S>(&h);
            let r = ch.put_block_with_signal(m, 0, 0, 1000);
            results.lock().unwrap().push((m.rank, r));
        });
        let what = format!("{} without ranks {gone:?}", std::any::type_name::<S>());
        let results = results.into_inner().unwrap();
        assert_eq!(results.len(), 4 - gone.len(), "{what}");
        for (rank, r) in results {
            assert_eq!(r, Err(Error::InvalidArgument(InvalidArgument::Team)), "{what}: rank {rank}");
        }
        assert_eq!(l._nics[0].stats().wqes, 0, "{what}");
        assert!(l.dst.read().iter().all(|&b| b == 0xee), "{what}: bytes were placed");
        assert_eq!(l.sem.load_u64(0), 0, "{what}: the peer was signalled");
    }
    for gone in [&[2, 3][..], &[0], &[3]] {
        run::<Block>(gone);
        run::<Device>(gone);
    }
}

/// A team with more members than half the ring has WQEBBs (9 on a 16-WQEBB ring, where a team post takes at
/// most 8 WQEs): a block put sends its range in batches of 8 pieces, members 0-7 posting, rather than failing
/// every member with `Team`; with its signal, a last batch of 8 pieces is followed by member 0's signal instead
/// of carrying it as a ninth WQE. Every byte lands and the semaphore counts one.
#[test]
fn a_block_put_of_a_team_wider_than_half_the_ring_goes_in_batches_it_takes() {
    for (bytes, signal) in [(9 * 256u64, false), (8 * 256, true), (9 * 256, true), (3000, true)] {
        let (l, data, h) = team_link(16);
        let results = std::sync::Mutex::new(Vec::new());
        teams(1, 9, |_, m| {
            let mut ch = shared::<Block>(&h);
            let r = if signal { ch.put_block_with_signal(m, 0, 0, bytes) } else { ch.put_block(m, 0, 0, bytes) };
            results.lock().unwrap().push(r.and_then(|()| ch.flush()));
        });
        assert!(results.into_inner().unwrap().iter().all(|r| r.is_ok()), "{bytes} bytes, signal {signal}");
        assert_eq!(&l.dst.read()[..bytes as usize], &data[..bytes as usize], "{bytes} bytes, signal {signal}");
        assert_eq!(l.sem.load_u64(0), u64::from(signal), "{bytes} bytes");
        assert_eq!(l._nics[0].stats().error_cqes, 0);
    }
}

/// A handle whose `max_wqe_bytes` is 0 is read as 1 by every put: a team put of one byte per member and a
/// block put of a few bytes go out as one-byte WQEs, where the team's piece check used to refuse them with
/// `Length`.
#[test]
fn max_wqe_bytes_zero_means_one_byte_wqes_for_team_puts_too() {
    let l = Link::new(4096, 64, false);
    let data = random_bytes(&mut rng(), 4096);
    l.src.write(0, &data);
    let mut h = l.handle();
    h.max_wqe_bytes = 0;
    let results = std::sync::Mutex::new(Vec::new());
    teams(1, 4, |_, m| {
        let mut ch = shared::<Block>(&h);
        let r = m.rank as u64;
        let one = ch.put_team(m, 100 + r, 100 + r, 1);
        let block = ch.put_block(m, 200, 200, 10);
        results.lock().unwrap().push((one, block, ch.flush()));
    });
    assert!(results.into_inner().unwrap().iter().all(|r| *r == (Ok(()), Ok(()), Ok(()))));
    let got = l.dst.read();
    assert_eq!((&got[100..104], &got[200..210]), (&data[100..104], &data[200..210]));
    assert_eq!(l._nics[0].stats().wqes, 4 + 10, "one-byte WQEs");
}
