//! Port channels, host side (`gdaki::channel`): two ranks as two threads, each with its own bootstrap,
//! communicator and emulated NIC (cpu executor, the wire over loopback TCP). The handles the host builds are
//! driven with the existing Exclusive device QP (`gdaki_device::qp::Qp` + `put` / `signal` / `flush` /
//! `wait_semaphore`), using only the addresses and keys in each `PortChannelHandle`, and by a kernel of a block
//! on the cpu executor where a team's threads take part. Payloads are random
//! (replay with `GDAKI_TEST_SEED`) and checked byte for byte; every expected value is computed here.

use std::sync::Barrier;
use std::time::{Duration, Instant};

mod ranks;

use gdaki::channel::{
    Communicator, Connection, EndpointConfig, IbConfig, IbMode, PortChannel, RegisteredMemory, Semaphore,
};
use gdaki::exec::{DataBuf, Executor, ExecutorKind};
use gdaki::nic::emu::{QpState, WireConfig};
use gdaki::Error;
use gdaki_device::channel::{Exclusive, PortChannel as DevChannel};
use gdaki_device::error::{InvalidArgument, WaitOn};
use gdaki_device::packet::{LL16Packet, LL8Packet};
use gdaki_device::qp::Qp as DevQp;
use gdaki_device::Error as DevError;
use gdaki_shared::channel::PortChannelHandle;
use gdaki_shared::handle::{QpHandle, SqState};
use gdaki_shared::prm::opcode::syndrome;
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};

/// Bound of bootstrap calls.
const BOOT_TIMEOUT: Duration = Duration::from_secs(20);
/// Bound of every device-side wait: long enough for a loaded 2-core machine, short enough to fail, not hang.
const TIMEOUT_NS: u64 = 10_000_000_000;

/// A seeded generator; the seed is printed so that a failure can be replayed with `GDAKI_TEST_SEED`.
fn rng() -> SmallRng {
    let seed = std::env::var("GDAKI_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
    });
    eprintln!("GDAKI_TEST_SEED={seed}");
    SmallRng::seed_from_u64(seed)
}

fn random_bytes(rng: &mut SmallRng, n: usize) -> Vec<u8> {
    (0..n).map(|_| rng.random::<u8>()).collect()
}

/// Runs `f(communicator, barrier)` on two ranks (threads), each with its own communicator (cpu executor, loopback
/// wire) whose bootstrap calls are bounded by `boot_timeout`; returns the results by rank.
fn two_ranks<T: Send>(boot_timeout: Duration, f: impl Fn(Communicator, &Barrier) -> T + Sync) -> Vec<T> {
    two_ranks_on(ExecutorKind::Cpu, boot_timeout, f)
}

/// [`two_ranks`] on executor `kind`.
fn two_ranks_on<T: Send>(
    kind: ExecutorKind,
    boot_timeout: Duration,
    f: impl Fn(Communicator, &Barrier) -> T + Sync,
) -> Vec<T> {
    // Warnings of the library (and of its threads, which inherit the test's capture) show with a failure.
    let _ = tracing_subscriber::fmt().with_max_level(tracing::Level::WARN).with_test_writer().try_init();
    ranks::two_ranks(
        |mut boot| {
            boot.set_timeout(boot_timeout);
            let (exec, _) = Executor::open(Some(kind)).unwrap_or_else(|e| panic!("{e}"));
            Communicator::new(boot, exec, WireConfig::loopback()).unwrap_or_else(|e| panic!("communicator: {e}"))
        },
        |_, comm, barrier| f(comm, barrier),
    )
}

/// Registers `len` zeroed bytes of host memory.
fn register(comm: &Communicator, len: usize) -> RegisteredMemory {
    comm.register_buffer(comm.executor().alloc_data(len).unwrap()).unwrap()
}

/// Writes `bytes` at the start of `mem` (a host buffer no device code uses yet).
fn fill(mem: &RegisteredMemory, bytes: &[u8]) {
    let Some(DataBuf::Host(b)) = mem.buffer() else { panic!("expected a host buffer") };
    assert!(bytes.len() <= b.len());
    // SAFETY: in bounds of the buffer, which nothing else writes now.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), b.host_ptr(), bytes.len()) };
}

fn contents(mem: &RegisteredMemory) -> Vec<u8> {
    mem.buffer().unwrap().to_vec().unwrap()
}

/// The handle's QP as an Exclusive device QP.
///
/// # Safety
/// `h` must come from a live channel of the cpu executor, and no other thread may post to that QP meanwhile.
unsafe fn dev_qp(h: &PortChannelHandle) -> DevQp<'static> {
    // SAFETY: the caller's contract; `h.qp` is the connection's `QpHandle` in host memory.
    unsafe { DevQp::new(&mut *(h.qp as *mut QpHandle), TIMEOUT_NS) }
}

/// One put of a plan: `len` bytes from `src_off` of the sender's source to `dst_off` of the peer's buffer.
#[derive(Clone, Copy, Debug)]
struct Put {
    dst_off: u64,
    src_off: u64,
    len: u64,
}

/// Puts that cover `[start, end)` of the destination in random pieces, skipping about every third (so that
/// gaps must stay untouched), each from a random place in a source of `src_len` bytes.
fn plan(rng: &mut SmallRng, start: u64, end: u64, max_piece: u64, src_len: u64) -> Vec<Put> {
    let mut puts = Vec::new();
    let mut at = start;
    while at < end {
        let len = rng.random_range(1..=max_piece.min(end - at));
        if rng.random_range(0..3) != 0 {
            puts.push(Put { dst_off: at, src_off: rng.random_range(0..=src_len - len), len });
        }
        at += len;
    }
    puts
}

/// What the peer's buffer must hold after `puts` from a source holding `src`: their bytes, zero elsewhere.
fn expected(len: usize, puts: &[Put], src: &[u8]) -> Vec<u8> {
    let mut v = vec![0u8; len];
    for p in puts {
        let (d, s, n) = (p.dst_off as usize, p.src_off as usize, p.len as usize);
        v[d..d + n].copy_from_slice(&src[s..s + n]);
    }
    v
}

fn assert_same(got: &[u8], want: &[u8], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
        panic!("{what}: first difference at byte {i}: got {:#04x}, want {:#04x}", got[i], want[i]);
    }
}

fn message(e: Error) -> String {
    assert!(!e.to_string().contains('\n'), "multi-line error: {e}");
    match e {
        Error::InvalidArgument(m) | Error::Unavailable(m) | Error::Bootstrap(m) => m,
        other => panic!("unexpected error {other:?}"),
    }
}

/// Whether `[addr, addr + 8)` lies inside `mem`.
fn inside(addr: u64, mem: &RegisteredMemory) -> bool {
    addr + 8 > mem.loc().addr && addr < mem.loc().addr + mem.len()
}

#[test]
fn one_qp_payload_lands_semaphore_counts_and_fetch_add_result_goes_to_scratch() {
    const LEN: usize = 64 << 10;
    let mut rng = rng();
    let payloads = [random_bytes(&mut rng, LEN), random_bytes(&mut rng, LEN)];
    let plans = [plan(&mut rng, 0, LEN as u64, 5000, LEN as u64), plan(&mut rng, 0, LEN as u64, 5000, LEN as u64)];
    let results = two_ranks(BOOT_TIMEOUT, |comm, barrier| {
        let (me, peer) = (comm.rank() as usize, 1 - comm.rank());
        assert_eq!(comm.world_size(), 2);
        let src = register(&comm, LEN);
        fill(&src, &payloads[me]);
        let landing = register(&comm, LEN);
        comm.send_memory(&landing, peer, 0).unwrap();
        let dst = comm.recv_memory(peer, 0).unwrap();
        assert_eq!((dst.rank(), dst.len()), (peer, LEN as u64));
        let conn = comm.connect(&EndpointConfig::default(), peer, 1).unwrap();
        assert_eq!((conn.peer(), conn.tag(), conn.qp().state()), (peer, 1, QpState::Rts));
        let sem = comm.semaphore(&conn, peer, 2).unwrap();
        let chan = PortChannel::new(&conn, &sem, dst, &src).unwrap();
        let h = chan.device_handle();

        // Every field of the handle.
        assert_eq!(h.qp, conn.qp_handle_addr());
        assert!(h.qp.is_multiple_of(64), "{h:?}");
        let qh = conn.qp_handle().unwrap();
        assert_eq!((qh.qpn, qh.wqe_cnt, qh.sq.pi, qh.sq.ci, qh.cq.cons_index), (conn.qpn(), 1024, 0, 0, 0));
        assert_eq!(qh.cq.ncqe, 1024);
        assert_eq!(bytemuck::bytes_of(&qh.sq), bytemuck::bytes_of(&SqState::default()));
        let (d, r) = (h.dst, dst.remote());
        assert_eq!((d.addr, d.length, d.rkey.get()), (r.addr, LEN as u64, r.rkey.get()));
        let s = src.handle();
        assert_eq!((h.src.addr, h.src.length, h.src.lkey.get()), (s.addr, LEN as u64, s.lkey.get()));
        let rs = sem.remote_inbound();
        assert_eq!((h.remote_sem.addr, h.remote_sem.length, h.remote_sem.rkey.get()), (rs.addr, 8, rs.rkey.get()));
        assert_eq!((h.local_sem, h.expected), (sem.inbound_addr(), sem.expected_addr()));
        assert!(h.local_sem.is_multiple_of(8) && h.expected.is_multiple_of(8));
        assert_eq!((sem.inbound().unwrap(), sem.expected().unwrap()), (0, 0));
        assert_eq!((h.scratch.length, h.scratch.addr % 8), (8, 0));
        assert!(!inside(h.scratch.addr, &src) && !inside(h.scratch.addr, &landing), "scratch inside user memory");
        assert_eq!((h.max_wqe_bytes, h.timeout_ns, h.blue_flame_limit), (1 << 30, 5_000_000_000, 512 << 10));
        // Each rank's checks above read its own semaphore untouched: neither signals before both are done.
        barrier.wait();

        // Drive it: every put followed by a signal, then flush, then wait for the peer's signals.
        let n = plans[me].len() as u64;
        {
            // SAFETY: `chan` lives for this block; this thread alone posts to the QP.
            let mut qp = unsafe { dev_qp(&h) };
            for p in &plans[me] {
                qp.put(&h.dst, p.dst_off, &h.src, p.src_off, p.len).unwrap();
                let _ = qp.signal(&h.remote_sem, 0, &h.scratch, 0).unwrap();
            }
            qp.flush().unwrap();
            let peer_n = plans[peer as usize].len() as u64;
            // SAFETY: `local_sem` is the semaphore's inbound word, alive while `sem` is.
            assert_eq!(unsafe { qp.wait_semaphore(h.local_sem as *const u64, peer_n) }.unwrap(), peer_n);
        }
        let after = conn.qp_handle().unwrap();
        assert_eq!(after.sq.ci, after.sq.pi, "flushed: every WQEBB retired");
        assert_eq!(conn.qp().as_emu().expect("emulated NIC").sq_consumed(), after.sq.pi);
        // Both ranks are done: nothing more arrives.
        comm.bootstrap().barrier().unwrap();
        assert_eq!(sem.inbound().unwrap(), plans[peer as usize].len() as u64, "exact count of the peer's signals");
        assert_eq!(conn.scratch_value().unwrap(), n - 1, "the last fetch-add's old value is in the scratch word");
        assert_same(&contents(&src), &payloads[me], "source untouched (no fetch-add result in it)");
        let want = expected(LEN, &plans[peer as usize], &payloads[peer as usize]);
        assert_same(&contents(&landing), &want, "landing buffer");
        assert_eq!(comm.nic().as_emu().expect("emulated NIC").stats().error_cqes, 0);
        comm.bootstrap().barrier().unwrap();
        n
    });
    assert!(results.iter().all(|&n| n > 3), "plans too short: {results:?}");
}

#[test]
fn four_qps_with_two_channels_each_keep_payloads_and_counts_apart() {
    const QPS: usize = 4;
    const PART: u64 = 16 << 10;
    const LEN: usize = QPS * PART as usize;
    let mut rng = rng();
    let payloads = [random_bytes(&mut rng, LEN), random_bytes(&mut rng, LEN)];
    // plans[rank][qp][channel]: channel 0 fills the first half of the QP's part, channel 1 the second.
    let plans: Vec<Vec<[Vec<Put>; 2]>> = (0..2)
        .map(|_| {
            (0..QPS as u64)
                .map(|q| {
                    let (a, m) = (q * PART, q * PART + PART / 2);
                    [plan(&mut rng, a, m, 600, LEN as u64), plan(&mut rng, m, a + PART, 600, LEN as u64)]
                })
                .collect()
        })
        .collect();
    // The smallest SQ, so that every QP's ring wraps several times.
    let cfg = EndpointConfig { ib: IbConfig { max_send_wr: 16, ..IbConfig::default() }, ..EndpointConfig::default() };
    let qpns = two_ranks(BOOT_TIMEOUT, |comm, _| {
        let (me, peer) = (comm.rank() as usize, 1 - comm.rank());
        let src = register(&comm, LEN);
        fill(&src, &payloads[me]);
        let landing = register(&comm, LEN);
        comm.send_memory(&landing, peer, 0).unwrap();
        let dst = comm.recv_memory(peer, 0).unwrap();
        // Four connections on one tag pair up in call order.
        let conns: Vec<Connection> = (0..QPS).map(|_| comm.connect(&cfg, peer, 1).unwrap()).collect();
        let sems: Vec<Semaphore> =
            conns.iter().enumerate().map(|(i, c)| comm.semaphore(c, peer, 10 + i as u32).unwrap()).collect();
        let chans: Vec<[PortChannel; 2]> = conns
            .iter()
            .zip(&sems)
            .map(|(c, s)| [PortChannel::new(c, s, dst, &src).unwrap(), PortChannel::new(c, s, dst, &src).unwrap()])
            .collect();
        let hs: Vec<[PortChannelHandle; 2]> =
            chans.iter().map(|[a, b]| [a.device_handle(), b.device_handle()]).collect();
        for (i, [a, b]) in hs.iter().enumerate() {
            assert_eq!((a.qp, a.scratch.addr, a.local_sem), (b.qp, b.scratch.addr, b.local_sem));
            for [c, _] in &hs[i + 1..] {
                assert!(a.qp != c.qp && a.scratch.addr != c.scratch.addr, "QP {i}");
                assert!(a.local_sem != c.local_sem && a.expected != c.expected, "QP {i}");
            }
        }

        // One thread per QP (Exclusive), alternating between the QP's two channels.
        std::thread::scope(|s| {
            for (q, h) in hs.iter().enumerate() {
                let plans = &plans;
                s.spawn(move || {
                    // SAFETY: the channels outlive this scope; this thread alone posts to QP `q` (both
                    // channels' `qp` are the same handle).
                    let mut qp = unsafe { dev_qp(&h[0]) };
                    let mine = &plans[me][q];
                    for k in 0..mine[0].len().max(mine[1].len()) {
                        for c in 0..2 {
                            if let Some(p) = mine[c].get(k) {
                                qp.put(&h[c].dst, p.dst_off, &h[c].src, p.src_off, p.len).unwrap();
                                let _ = qp.signal(&h[c].remote_sem, 0, &h[c].scratch, 0).unwrap();
                            }
                        }
                    }
                    qp.flush().unwrap();
                    let theirs = &plans[peer as usize][q];
                    let n = (theirs[0].len() + theirs[1].len()) as u64;
                    // SAFETY: QP `q`'s semaphore word, alive while `sems` is.
                    assert_eq!(unsafe { qp.wait_semaphore(h[0].local_sem as *const u64, n) }.unwrap(), n);
                });
            }
        });
        comm.bootstrap().barrier().unwrap();
        let mut want = vec![0u8; LEN];
        for q in 0..QPS {
            let (mine, theirs) = (&plans[me][q], &plans[peer as usize][q]);
            let sent = (mine[0].len() + mine[1].len()) as u64;
            assert_eq!(
                sems[q].inbound().unwrap(),
                (theirs[0].len() + theirs[1].len()) as u64,
                "QP {q}: signals counted"
            );
            assert_eq!(conns[q].scratch_value().unwrap(), sent - 1, "QP {q}: last fetch-add's old value");
            assert_eq!(sems[q].expected().unwrap(), 0, "QP {q}");
            let qh = conns[q].qp_handle().unwrap();
            assert!(qh.sq.pi >= 2 * sent && qh.sq.ci == qh.sq.pi, "QP {q}: {qh:?}");
            assert!(qh.sq.pi > 3 * 16, "QP {q}: the ring of 16 wrapped");
            for p in theirs.iter().flatten() {
                let (d, s, n) = (p.dst_off as usize, p.src_off as usize, p.len as usize);
                want[d..d + n].copy_from_slice(&payloads[peer as usize][s..s + n]);
            }
        }
        assert_same(&contents(&landing), &want, "landing buffer");
        assert_same(&contents(&src), &payloads[me], "source untouched");
        assert_eq!(comm.nic().as_emu().expect("emulated NIC").stats().error_cqes, 0);
        comm.bootstrap().barrier().unwrap();
        conns.iter().map(|c| (c.qpn(), c.remote_endpoint().qpn())).collect::<Vec<_>>()
    });
    assert_eq!(qpns[0].len(), QPS);
    for (q, (r0, r1)) in qpns[0].iter().zip(&qpns[1]).enumerate() {
        assert_eq!(r0.1, r1.0, "rank 0's connection {q} goes to rank 1's connection {q}");
        assert_eq!(r1.1, r0.0, "rank 1's connection {q} goes to rank 0's connection {q}");
    }
}

#[test]
fn host_modes_connect_through_one_proxy_and_modes_must_match() {
    two_ranks(BOOT_TIMEOUT, |comm, _| {
        let peer = 1 - comm.rank();
        let bad =
            EndpointConfig { ib: IbConfig { max_send_wr: 100, ..IbConfig::default() }, ..EndpointConfig::default() };
        assert!(message(comm.connect(&bad, peer, 7).unwrap_err()).contains("max_send_wr 100"));
        // Nothing was queued on tag 7 by the refused connect: the first message there is the marker.
        comm.bootstrap().send(peer, 7, b"marker").unwrap();
        assert_eq!(comm.bootstrap().recv(peer, 7).unwrap(), b"marker");
        let mut proxies = Vec::new();
        for (tag, mode) in [(7, IbMode::Host), (8, IbMode::HostNoAtomic)] {
            let conn = comm.connect(&EndpointConfig::with_mode(mode), peer, tag).unwrap();
            assert_eq!(conn.qp().state(), QpState::Rts);
            proxies.push(conn.proxy().expect("a Host-mode connection has the proxy").clone());
        }
        assert!(std::sync::Arc::ptr_eq(&proxies[0], &proxies[1]), "one proxy per communicator");
        assert_eq!(proxies[0].fifo().size, gdaki::proxy::DEFAULT_FIFO_SIZE);
        let m = message(comm.start_proxy(64).unwrap_err());
        assert!(m.contains("already runs with a FIFO of 512 slots, not 64"), "{m}");
        let device = comm.connect(&EndpointConfig::with_mode(IbMode::Device), peer, 9).unwrap();
        assert!(device.proxy().is_none());
        // Both sides must pick the same mode.
        let mode = if comm.rank() == 0 { IbMode::Host } else { IbMode::Device };
        let m = message(comm.connect(&EndpointConfig::with_mode(mode), peer, 10).unwrap_err());
        assert!(m.contains("give both the same EndpointConfig"), "{m}");
        // The modes by name, as `IbMode` spells them, not by their wire codes.
        let (theirs, mine) = if comm.rank() == 0 { ("Device", "Host") } else { ("Host", "Device") };
        let said = format!("rank {peer} connects with EmuRc in mode {theirs}, this rank with EmuRc in mode {mine} (");
        assert!(m.contains(&said), "{m}");
        comm.bootstrap().barrier().unwrap();
    });
}

#[test]
fn calls_that_do_not_pair_up_and_bad_arguments_fail_with_one_line() {
    two_ranks(BOOT_TIMEOUT, |comm, _| {
        let (me, peer) = (comm.rank(), 1 - comm.rank());
        let mem = register(&comm, 256);
        let cfg = EndpointConfig::default();

        // Peers out of range.
        let m = message(comm.connect(&cfg, 2, 0).unwrap_err());
        assert!(m.contains("connect to rank 2 tag 0: peer rank 2 is out of range for world size 2"), "{m}");
        assert!(message(comm.send_memory(&mem, 5, 0).unwrap_err()).contains("peer rank 5 is out of range"));
        assert!(message(comm.recv_memory(9, 0).unwrap_err()).contains("peer rank 9 is out of range"));

        // Memory met by a connect, and the connect's endpoint then met by recv_memory: both ranks, tag 3.
        comm.send_memory(&mem, peer, 3).unwrap();
        let m = message(comm.connect(&cfg, peer, 3).unwrap_err());
        assert!(m.contains(&format!("rank {peer} tag 3: expected a connection endpoint")), "{m}");
        assert!(m.contains("received a registered memory (send_memory)") && m.contains("do not pair up"), "{m}");
        let m = message(comm.recv_memory(peer, 3).unwrap_err());
        assert!(m.contains("expected a registered memory") && m.contains("received a connection endpoint"), "{m}");

        // Bytes that are not a channel message, and a channel message of the wrong size.
        comm.bootstrap().send(peer, 4, b"garbage!").unwrap();
        let m = message(comm.recv_memory(peer, 4).unwrap_err());
        assert!(m.contains("8 bytes that are not a gdaki channel message"), "{m}");
        let mut short = b"GDCH".to_vec();
        short.extend_from_slice(&1u16.to_le_bytes());
        short.extend_from_slice(&2u16.to_le_bytes());
        short.extend_from_slice(&[0; 10]);
        comm.bootstrap().send(peer, 4, &short).unwrap();
        let m = message(comm.recv_memory(peer, 4).unwrap_err());
        assert!(m.contains("received 18 bytes, not 32"), "{m}");

        // Two QPs; semaphores built on connections that are not each other's peers.
        let c0 = comm.connect(&cfg, peer, 5).unwrap();
        let c1 = comm.connect(&cfg, peer, 5).unwrap();
        let m = message(comm.semaphore(&c0, me, 6).unwrap_err());
        assert!(m.contains(&format!("goes to rank {peer}, not {me}")), "{m}");
        let mine = if me == 0 { &c0 } else { &c1 };
        let m = message(comm.semaphore(mine, peer, 6).unwrap_err());
        assert!(m.contains("built its semaphore on its QP") && m.contains("matching connections"), "{m}");
        let s0 = comm.semaphore(&c0, peer, 7).unwrap();

        // Channels: a destination of the wrong rank, a semaphore of another connection.
        comm.send_memory(&mem, peer, 8).unwrap();
        let dst = comm.recv_memory(peer, 8).unwrap();
        comm.send_memory(&mem, me, 9).unwrap();
        let own = comm.recv_memory(me, 9).unwrap();
        let m = message(PortChannel::new(&c0, &s0, own, &mem).unwrap_err());
        assert!(m.contains(&format!("the destination is rank {me}'s memory, not the peer's")), "{m}");
        let m = message(PortChannel::new(&c1, &s0, dst, &mem).unwrap_err());
        assert!(m.contains("the semaphore was built on another connection"), "{m}");
        assert!(PortChannel::new(&c0, &s0, dst, &mem).is_ok());
        comm.bootstrap().barrier().unwrap();
    });
}

/// GPU memory on the `cpu` executor: refused by an emulated NIC without a GPU copier (the `cpu` executor's
/// default), accepted by one with the simulated GPU (`GDAKI_QUEUES=gpu` gives it one; set here explicitly, as
/// other tests of this binary read the variable), whose "GPU memory" is host memory.
#[test]
fn gpu_memory_on_the_cpu_executor_needs_the_simulated_gpu() {
    use gdaki::bootstrap::{Bootstrap, Launch, Secret};
    use gdaki::mem::{MemKind, MemLoc};
    use gdaki::nic::emu::{EmuConfig, EmuNic, SimGpu};
    use gdaki::nic::Nic;
    let buf = vec![0u64; 8];
    let loc = MemLoc { kind: MemKind::Gpu, addr: buf.as_ptr() as u64 };
    let comm = |cfg: EmuConfig| {
        let boot = Bootstrap::connect(&Launch::solo(Secret::random().unwrap()), BOOT_TIMEOUT).unwrap();
        Communicator::on_nic(boot, Executor::Cpu, Nic::Emu(EmuNic::open(cfg).unwrap())).unwrap()
    };
    let plain = comm(EmuConfig::host());
    // SAFETY: refused before the NIC could touch the memory.
    match unsafe { plain.register_memory(loc, 64) } {
        Err(e @ Error::InvalidArgument(_)) => assert!(e.to_string().contains("GPU"), "{e}"),
        other => panic!("GPU memory without a GPU copier: expected InvalidArgument, got {:?}", other.err()),
    }
    let simulated = comm(EmuConfig { gpu: Some(std::sync::Arc::new(SimGpu::new().unwrap())), ..EmuConfig::host() });
    // SAFETY: `buf` outlives the registration, dropped first.
    let mem = unsafe { simulated.register_memory(loc, 64) }.unwrap_or_else(|e| panic!("with SimGpu: {e}"));
    drop(mem);
    drop(buf);
}

#[test]
fn a_peer_that_never_answers_is_a_bootstrap_timeout_naming_the_call() {
    two_ranks(Duration::from_millis(300), |comm, barrier| {
        let peer = 1 - comm.rank();
        let e = comm.recv_memory(peer, 99).unwrap_err();
        // Neither rank drops its communicator (closing the connection the other is still waiting on, which
        // would end that wait as a closed connection instead) before both have timed out.
        barrier.wait();
        assert!(matches!(e, Error::Bootstrap(_)), "{e:?}");
        let m = message(e);
        assert!(m.starts_with(&format!("recv_memory from rank {peer} tag 99: ")) && m.contains("timed out"), "{m}");
        assert!(m.contains(&format!("(rank {peer} did not make the matching call")), "{m}");
    });
}

/// Setup calls that wait on each other in a cycle (here each rank first makes the call the other makes second)
/// end at the bootstrap's timeout with an error that names the call and says how to order them.
#[test]
fn setup_calls_in_a_cycle_time_out_saying_how_to_order_them() {
    two_ranks(Duration::from_millis(300), |comm, barrier| {
        let peer = 1 - comm.rank();
        let first = 1 + comm.rank();
        let e = comm.connect(&EndpointConfig::default(), peer, first).unwrap_err();
        barrier.wait();
        let m = message(e);
        assert!(m.starts_with(&format!("connect to rank {peer} tag {first}: ")), "{m}");
        assert!(m.contains("timed out after 300ms (rank"), "{m}");
        assert!(m.contains("order every rank's setup calls so that no cycle of ranks waits"), "{m}");
        // Each rank's message of the failed call stays queued at the other: a retry in a good order would take
        // it (an endpoint of a QP destroyed since). Every later setup exchange is refused at once instead.
        barrier.wait();
        let t = Instant::now();
        let e = comm.connect(&EndpointConfig::default(), peer, 1).map(drop).map_err(message).unwrap_err();
        assert!(t.elapsed() < Duration::from_millis(200), "the refusal took {:?}", t.elapsed());
        assert!(
            e.starts_with(&format!(
                "connect to rank {peer} tag 1: this rank's connect to rank {peer} tag {first} timed out"
            )) && e.ends_with("make a new bootstrap session and communicator on every rank"),
            "{e}"
        );
    });
}

/// Channels keep working once their communicator has left the session, by its drop or by `leave`; after
/// `leave`, the communicator's calls that exchange with a peer fail at once, saying that a rank left.
#[test]
fn channels_keep_working_after_the_communicator_is_dropped_or_has_left() {
    const LEN: usize = 4096;
    let mut rng = rng();
    let payloads = [random_bytes(&mut rng, LEN), random_bytes(&mut rng, LEN)];
    for leave in [false, true] {
        channels_keep_working_after_leaving(&payloads, leave);
    }
}

fn channels_keep_working_after_leaving(payloads: &[Vec<u8>; 2], leave: bool) {
    const LEN: usize = 4096;
    two_ranks(BOOT_TIMEOUT, |comm, barrier| {
        let (me, peer) = (comm.rank() as usize, 1 - comm.rank());
        let src = register(&comm, LEN);
        fill(&src, &payloads[me]);
        let landing = register(&comm, LEN);
        comm.send_memory(&landing, peer, 0).unwrap();
        let dst = comm.recv_memory(peer, 0).unwrap();
        let conn = comm.connect(&EndpointConfig::default(), peer, 1).unwrap();
        let sem = comm.semaphore(&conn, peer, 2).unwrap();
        let chan = PortChannel::new(&conn, &sem, dst, &src).unwrap();
        // Only the channel and the landing buffer stay: it holds the connection, semaphore and source.
        drop((conn, sem, src));
        comm.bootstrap().barrier().unwrap();
        if leave {
            comm.leave();
            let t = Instant::now();
            let e = comm.connect(&EndpointConfig::default(), peer, 3).map(drop).map_err(message);
            // The first cause is named: this rank's leaving, or rank 0's when the root left first.
            assert!(
                e.as_ref().is_err_and(|m| m.contains("left the session")) && t.elapsed() < Duration::from_secs(1),
                "{e:?}"
            );
            // No proxy is started for connections that cannot be made.
            let p = comm.proxy().map(drop).map_err(message);
            assert!(p.as_ref().is_err_and(|m| m.contains(&format!("rank {me} left the session"))), "{p:?}");
        }
        drop(comm);
        let h = chan.device_handle();
        {
            // SAFETY: `chan` lives for this block; this thread alone posts to the QP.
            let mut qp = unsafe { dev_qp(&h) };
            qp.put(&h.dst, 0, &h.src, 0, LEN as u64).unwrap();
            let _ = qp.signal(&h.remote_sem, 0, &h.scratch, 0).unwrap();
            qp.flush().unwrap();
            // SAFETY: the semaphore's inbound word, alive while `chan` is.
            assert_eq!(unsafe { qp.wait_semaphore(h.local_sem as *const u64, 1) }.unwrap(), 1);
        }
        assert_same(&contents(&landing), &payloads[peer as usize], "landing buffer");
        assert_eq!(chan.connection().scratch_value().unwrap(), 0);
        // Both flushed before either destroys its QP.
        barrier.wait();
    });
}

#[test]
#[ignore = "needs a GPU (cargo xtask test -- --ignored)"]
fn gpu_executor_keeps_qp_state_and_expected_counts_in_gpu_memory() {
    two_ranks_on(ExecutorKind::Gpu, BOOT_TIMEOUT, |comm, _| {
        let peer = 1 - comm.rank();
        let src = register(&comm, 4096);
        assert!(matches!(src.buffer(), Some(DataBuf::Gpu(_))));
        comm.send_memory(&src, peer, 0).unwrap();
        let dst = comm.recv_memory(peer, 0).unwrap();
        let conns: Vec<Connection> =
            (0..2).map(|_| comm.connect(&EndpointConfig::default(), peer, 1).unwrap()).collect();
        for c in &conns {
            let sem = comm.semaphore(c, peer, 2).unwrap();
            let h = PortChannel::new(c, &sem, dst, &src).unwrap().device_handle();
            // The handle and shared state were copied into GPU memory; reading them back gives what the NIC's
            // QP says.
            let qh = c.qp_handle().unwrap();
            let want = c.qp().handle();
            assert_eq!(
                (qh.sq_buf, qh.dbrec, qh.bf_reg, qh.qpn, qh.wqe_cnt),
                (want.sq_buf, want.dbrec, want.bf_reg, want.qpn, want.wqe_cnt)
            );
            assert_eq!((qh.cq.buf, qh.cq.ncqe, qh.sq.pi), (want.cq.buf, want.cq.ncqe, 0));
            assert_eq!(bytemuck::bytes_of(&qh.sq), bytemuck::bytes_of(&SqState::default()));
            assert!(h.qp.is_multiple_of(64) && h.qp == c.qp_handle_addr());
            assert_eq!((sem.expected().unwrap(), sem.inbound().unwrap(), c.scratch_value().unwrap()), (0, 0, 0));
            assert_eq!((h.local_sem, h.expected, h.scratch.length), (sem.inbound_addr(), sem.expected_addr(), 8));
        }
        comm.bootstrap().barrier().unwrap();
    });
}

/// A device-code channel of the cpu executor on `h`, in Exclusive sharing (one thread; what the proxy modes
/// use).
fn exclusive(h: &PortChannelHandle) -> DevChannel<'_, Exclusive> {
    // SAFETY: `h` comes from a live channel of the cpu executor, used by this thread only.
    unsafe { DevChannel::new(h) }
}

/// A device-code channel of the cpu executor on `h`, in Device sharing: for threads that push on one connection
/// at the same time (Exclusive sharing takes the connection's QP handle as the one poster's, even in the Host
/// modes).
fn device_shared(h: &PortChannelHandle) -> DevChannel<'_, gdaki_device::channel::Device> {
    // SAFETY: `h` comes from a live channel of the cpu executor; its connection is used only through Device
    // sharing channels while they live.
    unsafe { DevChannel::new(h) }
}

/// Host modes: puts and signals go through the proxy, with a 4-slot FIFO so that pushes wait for room; the
/// sender never flushes but drops everything, and the proxy's drop drains: every payload and every signal
/// has landed when the drop returns. `put_with_accumulate` works in Host mode and is refused in HostNoAtomic.
#[test]
fn host_modes_deliver_every_trigger_through_a_small_fifo_and_drain_on_drop() {
    const LEN: usize = 32 << 10;
    let mut rng = rng();
    let payload = random_bytes(&mut rng, LEN);
    let puts = plan(&mut rng, 0, LEN as u64 - 8, 3000, LEN as u64);
    for mode in [IbMode::Host, IbMode::HostNoAtomic] {
        two_ranks(BOOT_TIMEOUT, |comm, barrier| {
            let (me, peer) = (comm.rank(), 1 - comm.rank());
            let proxy = comm.start_proxy(4).unwrap();
            let src = register(&comm, LEN);
            if me == 0 {
                fill(&src, &payload);
            }
            let landing = register(&comm, LEN);
            comm.send_memory(&landing, peer, 0).unwrap();
            let dst = comm.recv_memory(peer, 0).unwrap();
            let conn = comm.connect(&EndpointConfig::with_mode(mode), peer, 1).unwrap();
            let sem = comm.semaphore(&conn, peer, 2).unwrap();
            let chan = PortChannel::new(&conn, &sem, dst, &src).unwrap();
            let h = chan.device_handle();
            assert_eq!((h.fifo, h.channel_id), (proxy.fifo(), 0), "{mode:?}");
            assert_ne!(h.proxy_err, 0);
            if me == 0 {
                let mut ch = exclusive(&h);
                for p in &puts {
                    ch.put_with_signal(p.dst_off, p.src_off, p.len).unwrap();
                }
                let acc = ch.put_with_accumulate(0, 0, 8, LEN as u64 - 8, 5);
                match mode {
                    IbMode::HostNoAtomic => {
                        assert_eq!(acc, Err(DevError::InvalidArgument(InvalidArgument::Unsupported)))
                    }
                    _ => acc.unwrap(),
                }
                // The last holder of the proxy goes last: its drop drains (no assertion may panic before the
                // barriers, or rank 1 would wait there forever).
                drop((chan, sem, conn, comm));
                drop(proxy);
                barrier.wait();
                barrier.wait();
            } else {
                barrier.wait();
                // Rank 0's proxy is gone: what it posted has landed.
                let mut want = expected(LEN, &puts, &payload);
                if mode == IbMode::Host {
                    want[..8].copy_from_slice(&payload[..8]);
                    let acc = u64::from_ne_bytes(want[LEN - 8..].try_into().unwrap()).wrapping_add(5);
                    want[LEN - 8..].copy_from_slice(&acc.to_ne_bytes());
                }
                assert_same(&contents(&landing), &want, &format!("{mode:?}: landing buffer"));
                assert_eq!(sem.inbound().unwrap(), puts.len() as u64, "{mode:?}: one signal per put");
                barrier.wait();
            }
        });
    }
}

/// One channel to the peer in `mode`, over `len`-byte buffers: this rank's source and landing buffer (the
/// peer's destination), and the connection and semaphore the channel uses.
struct Link {
    _src: RegisteredMemory,
    landing: Option<RegisteredMemory>,
    _conn: Connection,
    _sem: Semaphore,
    chan: PortChannel,
}

fn link(comm: &Communicator, mode: IbMode, len: usize) -> Link {
    let peer = 1 - comm.rank();
    let src = register(comm, len);
    let landing = register(comm, len);
    comm.send_memory(&landing, peer, 0).unwrap();
    let dst = comm.recv_memory(peer, 0).unwrap();
    let conn = comm.connect(&EndpointConfig::with_mode(mode), peer, 1).unwrap();
    let sem = comm.semaphore(&conn, peer, 2).unwrap();
    let chan = PortChannel::new(&conn, &sem, dst, &src).unwrap();
    Link { _src: src, landing: Some(landing), _conn: conn, _sem: sem, chan }
}

/// Host modes: a put to memory the peer has deregistered fails on the NIC with syndrome 0x13, and the
/// sender's `flush` (through the proxy's error word) returns it, naming the connection's QP, then keeps
/// returning it.
#[test]
fn host_modes_flush_reports_the_error_cqe_of_a_put() {
    for mode in [IbMode::Host, IbMode::HostNoAtomic] {
        two_ranks(BOOT_TIMEOUT, |comm, barrier| {
            let me = comm.rank();
            let Link { landing, chan, _conn, .. } = &mut link(&comm, mode, 4096);
            let qpn = _conn.qpn();
            barrier.wait();
            drop(landing.take());
            barrier.wait();
            if me == 0 {
                let h = chan.device_handle();
                let mut ch = exclusive(&h);
                ch.put(0, 0, 64).unwrap();
                for _ in 0..2 {
                    match ch.flush() {
                        Err(DevError::Cqe(c)) => {
                            assert_eq!((c.syndrome, c.qpn), (syndrome::REMOTE_ACCESS_ERR, qpn), "{mode:?}")
                        }
                        other => panic!("{mode:?}: flush returned {other:?}"),
                    }
                }
            }
            barrier.wait();
        });
    }
}

/// Host modes: a trigger that names no channel of the proxy (a handle edited by hand) is not dropped
/// silently: every QP the proxy serves gets its error (`WR_FLUSH_ERR`, vendor `VENDOR_PROXY_UNKNOWN_CHANNEL`),
/// so the forged handle's flush and the real channel's both return it. An id past 16 bits, which a trigger
/// cannot carry, is refused on the device first (cut to 16 bits it named channel 0, whose peer got the put).
#[test]
fn host_modes_fail_every_flush_after_a_trigger_for_no_channel() {
    for mode in [IbMode::Host, IbMode::HostNoAtomic] {
        let results = two_ranks(BOOT_TIMEOUT, |comm, barrier| {
            let me = comm.rank();
            let Link { chan, .. } = &link(&comm, mode, 4096);
            barrier.wait();
            // Checked after the last barrier, so that a failure never leaves the peer waiting there.
            let flushes = (me == 0).then(|| {
                let h = chan.device_handle();
                let wide = PortChannelHandle { channel_id: 1 << 16, ..h };
                let mut ch = exclusive(&wide);
                let refused = [ch.put(0, 0, 64), ch.signal(), ch.flush()];
                let forged = PortChannelHandle { channel_id: 999, ..h };
                let mut ch = exclusive(&forged);
                let put = ch.put(0, 0, 64);
                let forged = ch.flush();
                let real = exclusive(&h).flush();
                (refused, put, forged, real)
            });
            barrier.wait();
            flushes
        });
        let (refused, put, forged, real) = results[0].expect("rank 0's flushes");
        assert_eq!(refused, [Err(DevError::InvalidArgument(InvalidArgument::Handle)); 3], "{mode:?}: id 2^16");
        assert_eq!(put, Ok(()), "{mode:?}: the forged channel's put is pushed");
        let want = (syndrome::WR_FLUSH_ERR, gdaki::proxy::VENDOR_PROXY_UNKNOWN_CHANNEL);
        for (what, r) in [("forged", forged), ("real", real)] {
            match r {
                Err(DevError::Cqe(c)) => assert_eq!((c.syndrome, c.vendor_err_synd), want, "{mode:?} {what}"),
                other => panic!("{mode:?}: the {what} channel's flush returned {other:?}"),
            }
        }
    }
}

/// Threads below `callers` of the block call `put_block_with_signal(0, 0, bytes)` then `flush` on the channel
/// `ch` in Block sharing, and store their error kinds (+1; 1 for none) in `out[tid]`; the others return first.
#[gdaki_device::kernel]
pub fn block_put_signal_some_return(
    t: &gdaki_device::Thread,
    ch: &PortChannelHandle,
    callers: u32,
    bytes: u64,
    out: *mut u64,
) {
    if t.tid() >= callers {
        return;
    }
    // SAFETY: the host's live channel, used by this block's threads in Block sharing only.
    let mut c = unsafe { DevChannel::<gdaki_device::channel::Block>::new(ch) };
    let r = c.put_block_with_signal(t, 0, 0, bytes);
    let flushed = c.flush();
    let kind = |r: Result<(), DevError>| r.err().map_or(0, |e| e.to_report().kind as u64);
    // SAFETY: `out` holds a word per thread of the block (the host's contract).
    unsafe { out.add(t.tid() as usize).write_volatile(1 + kind(r) + 100 * kind(flushed)) };
}

/// Host modes: a block put with a signal that one thread of the block never makes (it returned first) pushes
/// no signal and fails for every thread that makes it (`Team`); the pieces pushed land, the missing one does
/// not. Before, the others returned Ok and the peer saw the signal with a fourth of the range unwritten.
#[test]
fn host_modes_send_no_signal_for_a_block_put_that_some_threads_never_make() {
    const BYTES: usize = 1000;
    let mut rng = rng();
    let payload = random_bytes(&mut rng, 1024);
    for mode in [IbMode::Host, IbMode::HostNoAtomic] {
        two_ranks(BOOT_TIMEOUT, |comm, barrier| {
            let (me, peer) = (comm.rank(), 1 - comm.rank());
            let src = register(&comm, 1024);
            fill(&src, &payload);
            let landing = register(&comm, 1024);
            fill(&landing, &[0xee; 1024]);
            comm.send_memory(&landing, peer, 0).unwrap();
            let dst = comm.recv_memory(peer, 0).unwrap();
            let conn = comm.connect(&EndpointConfig::with_mode(mode), peer, 1).unwrap();
            let sem = comm.semaphore(&conn, peer, 2).unwrap();
            let chan = PortChannel::new(&conn, &sem, dst, &src).unwrap().with_max_wqe_bytes(256).unwrap();
            let h = Box::new(chan.device_handle());
            let mut out = [0u64; 4];
            let launched = (me == 0).then(|| {
                let (hp, outp) = (&*h as *const PortChannelHandle as u64, out.as_mut_ptr() as u64);
                let args = (gdaki_device::DevPtr::new(hp), 3u32, BYTES as u64, gdaki_device::DevPtr::new(outp));
                // SAFETY: the handle and `out` outlive the launch; the channel is this block's alone.
                unsafe {
                    gdaki_device::launch::run_on_host(
                        &BLOCK_PUT_SIGNAL_SOME_RETURN,
                        gdaki_device::Dim3::x(1),
                        gdaki_device::Dim3::x(4),
                        args,
                        0,
                    )
                }
            });
            // Rank 0's threads flushed: whatever the proxy was given has landed.
            barrier.wait();
            let (inbound, got) = (sem.inbound().unwrap(), contents(&landing));
            // Both ranks have looked: no assertion below leaves the other waiting at a barrier.
            barrier.wait();
            if let Some(launched) = launched {
                assert!(launched.is_ok(), "{mode:?}: {launched:?}");
                let team = 1 + gdaki_device::error::kind::TEAM as u64;
                assert_eq!(out, [team, team, team, 0], "{mode:?}: the callers' results (thread 3 returned first)");
            } else {
                assert_eq!(inbound, 0, "{mode:?}: a signal without the whole range");
                assert_same(&got[..768], &payload[..768], &format!("{mode:?}: the pieces pushed"));
                assert!(got[768..].iter().all(|&b| b == 0xee), "{mode:?}: the missing thread's piece landed");
            }
        });
    }
}

/// Each thread of the block (on host threads, a warp of one lane each) makes its own Warp-sharing channel of
/// `ch` and calls `put_block_with_signal(0, 0, bytes)`, then `signal`, then `flush`, storing the three error
/// kinds (+1; 1 for none) in `out[3 * tid ..]`.
#[gdaki_device::kernel]
pub fn warp_put_block_signal(t: &gdaki_device::Thread, ch: &PortChannelHandle, bytes: u64, out: *mut u64) {
    // SAFETY: the host's live channel, used by this block's threads in Warp sharing only.
    let mut c = unsafe { DevChannel::<gdaki_device::channel::Warp>::new(ch) };
    let r = [c.put_block_with_signal(t, 0, 0, bytes), c.signal(), c.flush()];
    for (i, r) in r.into_iter().enumerate() {
        let kind = r.err().map_or(0, |e| e.to_report().kind as u64);
        // SAFETY: `out` holds three words per thread of the block (the host's contract).
        unsafe { out.add(3 * t.tid() as usize + i).write_volatile(1 + kind) };
    }
}

/// Host modes in Warp sharing: a block put with a signal pushes its signal to the proxy, as every other call of
/// the channel does, so the peer counts it with the signal after it and every byte lands. Before, the warp's
/// signal was posted by device code straight to the QP's ring, which the proxy owns: with the QP's handle
/// counters at zero (the proxy keeps its own) it overwrote the proxy's first WQE and rang a producer index the
/// NIC had seen already, so the signal never went out (and in HostNoAtomic it would have bypassed the proxy's
/// count of the semaphore's signals).
#[test]
fn host_modes_warp_block_put_with_signal_goes_through_the_proxy() {
    const BYTES: usize = 1000;
    let payload = random_bytes(&mut rng(), 1024);
    for mode in [IbMode::Host, IbMode::HostNoAtomic] {
        let results = two_ranks(BOOT_TIMEOUT, |comm, barrier| {
            let me = comm.rank();
            let link = link(&comm, mode, 1024);
            fill(&link._src, &payload);
            let chan = link.chan.clone().with_timeout(Duration::from_secs(2)).unwrap();
            let h = Box::new(chan.device_handle());
            barrier.wait();
            let sent = (me == 0).then(|| {
                let mut out = [0u64; 3];
                let (hp, outp) = (&*h as *const PortChannelHandle as u64, out.as_mut_ptr() as u64);
                let args = (gdaki_device::DevPtr::new(hp), BYTES as u64, gdaki_device::DevPtr::new(outp));
                // SAFETY: the handle and `out` outlive the launch; the channel is this thread's alone.
                let launched = unsafe {
                    gdaki_device::launch::run_on_host(
                        &WARP_PUT_BLOCK_SIGNAL,
                        gdaki_device::Dim3::x(1),
                        gdaki_device::Dim3::x(1),
                        args,
                        0,
                    )
                };
                let nic = comm.nic().as_emu().expect("emulated NIC").stats();
                (launched.is_ok(), out, nic.bad_doorbells + nic.dbrec_mismatches)
            });
            // Rank 0's thread flushed: whatever the proxy was given has landed.
            barrier.wait();
            let landed = (me == 1).then(|| (contents(link.landing.as_ref().unwrap()), link._sem.inbound().unwrap()));
            barrier.wait();
            (sent, landed)
        });
        let (launched, out, bad) = results[0].0.expect("rank 0's calls");
        let (landing, inbound) = results[1].1.clone().expect("rank 1's buffer");
        assert!(launched, "{mode:?}: the launch");
        assert_eq!(out, [1, 1, 1], "{mode:?}: put_block_with_signal, signal and flush all Ok");
        assert_eq!(bad, 0, "{mode:?}: doorbells the NIC refused");
        assert_same(&landing[..BYTES], &payload[..BYTES], &format!("{mode:?}: the range"));
        assert_eq!(inbound, 2, "{mode:?}: the block put's signal and the one after it");
    }
}

/// Host modes: a trigger whose range the proxy's copy of the channel does not hold (here a device handle edited
/// to claim 4 KiB of the peer's 1 KiB) posts none of it: the proxy checks the whole range before its first
/// piece, and the flush reports the refusal (`WR_FLUSH_ERR`, vendor `VENDOR_PROXY_POST`). Before, the proxy
/// checked each piece as it posted it: the pieces below the end of the peer's memory landed, and only the
/// first one past it was refused.
#[test]
fn host_modes_a_trigger_past_the_channels_memory_posts_nothing() {
    const LEN: usize = 1024;
    let payload = random_bytes(&mut rng(), LEN);
    for mode in [IbMode::Host, IbMode::HostNoAtomic] {
        let results = two_ranks(BOOT_TIMEOUT, |comm, barrier| {
            let me = comm.rank();
            let link = link(&comm, mode, LEN);
            fill(&link._src, &payload);
            // The proxy splits this channel's puts into 256-byte WRITEs.
            let chan = link.chan.clone().with_max_wqe_bytes(256).unwrap().with_timeout(Duration::from_secs(2)).unwrap();
            // `chan` lives until the end: a dropped channel's id goes back to the proxy.
            let h = chan.device_handle();
            barrier.wait();
            let sent = (me == 0).then(|| {
                let mut forged = h;
                forged.dst.length = 4 * LEN as u64;
                let mut ch = exclusive(&forged);
                (ch.put(512, 0, LEN as u64), ch.flush())
            });
            barrier.wait();
            let landed = (me == 1).then(|| contents(link.landing.as_ref().unwrap()));
            barrier.wait();
            (sent, landed)
        });
        let (put, flush) = results[0].0.expect("rank 0's calls");
        let landing = results[1].1.clone().expect("rank 1's buffer");
        assert_eq!(put, Ok(()), "{mode:?}: the device's check passes the forged range");
        let want = (syndrome::WR_FLUSH_ERR, gdaki::proxy::VENDOR_PROXY_POST);
        match flush {
            Err(DevError::Cqe(c)) => assert_eq!((c.syndrome, c.vendor_err_synd), want, "{mode:?}"),
            other => panic!("{mode:?}: the flush returned {other:?}"),
        }
        assert_same(&landing, &[0; LEN], &format!("{mode:?}: the peer's memory"));
    }
}

/// Host modes: a CQE that none of the proxy's WQEs asked for in its QP's CQ (what device code posting on the
/// connection's QP handle itself leaves there) stops every poll of that CQ, so nothing the proxy posted can
/// complete. The running proxy gives up on the QP at its next poll and reports `VENDOR_PROXY_POST`: a wait on
/// the channel ends with that error, not with its timeout for a signal. Before, the running proxy dropped the
/// poll's error, and the wait ran out its timeout.
#[test]
fn host_modes_a_foreign_cqe_fails_the_waits_instead_of_stalling_them() {
    let results = two_ranks(BOOT_TIMEOUT, |comm, barrier| {
        let me = comm.rank();
        let link = link(&comm, IbMode::Host, 4096);
        let chan = link.chan.clone().with_timeout(Duration::from_secs(5)).unwrap();
        let h = chan.device_handle();
        barrier.wait();
        let got = (me == 0).then(|| {
            let mut ch = exclusive(&h);
            // One WRITE that asks for no CQE: the proxy's QP has a WQE outstanding, which it polls for.
            ch.put(0, 0, 64).unwrap();
            std::thread::sleep(Duration::from_millis(200));
            // SAFETY: the connection's QP handle, host memory of the cpu executor, read only.
            let qh = unsafe { *(link._conn.qp_handle_addr() as *const QpHandle) };
            // The first entry the NIC has not written yet (lap 0: still `OP_OWN_INVALID`) gets a successful
            // requester CQE of this QP for a WQE index nothing posted; its `op_own` (owner 0: lap 0) last.
            let slot = (0..qh.cq.ncqe as u64)
                .map(|i| qh.cq.buf + 64 * i)
                // SAFETY: entries of the live CQ ring, host memory.
                .find(|&e| unsafe { *((e + 63) as *const u8) } == gdaki_shared::prm::cqe::OP_OWN_INVALID)
                .expect("a CQE slot the NIC has not written");
            // SAFETY: one 64-byte entry of the live CQ ring that the NIC does not write meanwhile (the proxy's
            // WRITE asked for no CQE); the proxy's thread reads it with acquire loads of `op_own`.
            unsafe {
                let e = slot as *mut u8;
                (e.add(56) as *mut u32).write_volatile((8u32 << 24 | qh.qpn).to_be());
                (e.add(60) as *mut u16).write_volatile(0x4000u16.to_be());
                std::sync::atomic::AtomicU8::from_ptr(e.add(63))
                    .store(gdaki_shared::prm::opcode::cqe::REQ << 4, std::sync::atomic::Ordering::Release);
            }
            let start = Instant::now();
            (ch.wait(), start.elapsed())
        });
        barrier.wait();
        got
    });
    let (waited, took) = results[0].expect("rank 0's wait");
    let want = (syndrome::WR_FLUSH_ERR, gdaki::proxy::VENDOR_PROXY_POST);
    match waited {
        Err(DevError::Cqe(c)) => assert_eq!((c.syndrome, c.vendor_err_synd), want),
        other => panic!("the wait returned {other:?} after {took:?}"),
    }
    assert!(took < Duration::from_secs(4), "the wait took {took:?}, near its 5 s timeout");
}

/// Host modes: `put_packets` refuses what the proxy's triggers cannot carry (a destination past 4 GiB, a channel
/// id past 16 bits) before it writes a packet, as it refuses a bad range: the local memory is unchanged.
/// Before, the packets were written into the channel's memory and only the put that followed was refused.
#[test]
fn host_modes_put_packets_refused_by_the_proxy_limits_writes_nothing() {
    const LEN: usize = 4096;
    let payload = random_bytes(&mut rng(), LEN);
    for mode in [IbMode::Host, IbMode::HostNoAtomic] {
        let results = two_ranks(BOOT_TIMEOUT, |comm, barrier| {
            let me = comm.rank();
            let link = link(&comm, mode, LEN);
            fill(&link._src, &payload);
            let h = link.chan.device_handle();
            barrier.wait();
            let out = (me == 0).then(|| {
                // A peer memory of 8 GiB (as the device handle says), the packets put at its 4 GiB mark.
                let mut far = h;
                far.dst.length = 8 << 30;
                let wide = PortChannelHandle { channel_id: 1 << 16, ..h };
                let r = [
                    exclusive(&far).put_packets::<LL8Packet>(4 << 30, 2048, 0, 64, 7, 0, 1),
                    exclusive(&far).put_packets::<LL16Packet>(4 << 30, 2048, 0, 64, 7, 0, 1),
                    exclusive(&wide).put_packets::<LL8Packet>(0, 2048, 0, 64, 7, 0, 1),
                    exclusive(&wide).put_packets::<LL16Packet>(0, 2048, 0, 64, 7, 0, 1),
                ];
                (r, contents(&link._src))
            });
            barrier.wait();
            out
        });
        let (r, local) = results[0].clone().expect("rank 0's calls");
        let (unsupported, handle) = (InvalidArgument::Unsupported, InvalidArgument::Handle);
        let want = [unsupported, unsupported, handle, handle].map(|e| Err(DevError::InvalidArgument(e)));
        assert_eq!(r, want, "{mode:?}");
        assert_same(&local, &payload, &format!("{mode:?}: the channel's local memory"));
    }
}

/// Host modes: a push that times out for want of room in the FIFO (the proxy held in a flush, its NIC stopped)
/// takes no index, so the FIFO goes on: every trigger pushed before and after it is done, and its data and
/// signal land. (An index taken before its room left an empty slot that the proxy waited on forever: every
/// later trigger of every channel was lost, and the next flush timed out.)
#[test]
fn host_modes_a_push_that_times_out_leaves_the_fifo_working() {
    use std::sync::atomic::{AtomicU64, Ordering};
    const LEN: usize = 4096;
    let payload = random_bytes(&mut rng(), LEN);
    for mode in [IbMode::Host, IbMode::HostNoAtomic] {
        let results = two_ranks(BOOT_TIMEOUT, |comm, barrier| {
            let me = comm.rank();
            let _proxy = comm.start_proxy(2).unwrap();
            let link = link(&comm, mode, LEN);
            fill(&link._src, &payload);
            barrier.wait();
            let out = (me == 0).then(|| {
                let h = link.chan.device_handle();
                let quick = link.chan.clone().with_timeout(Duration::from_millis(1)).unwrap().device_handle();
                let nic = comm.nic().as_emu().expect("emulated NIC").clone();
                // SAFETY: the FIFO's `head` word (host memory on the cpu executor), which pushers use atomically;
                // read only here.
                let head = unsafe { AtomicU64::from_ptr(h.fifo.head as *mut u64) };
                let taken = head.load(Ordering::Acquire);
                nic.hold_executor(true);
                std::thread::scope(|s| {
                    // The proxy takes this flush and waits in it (the NIC is stopped), keeping its slot.
                    let flusher = s.spawn(|| {
                        let mut ch = device_shared(&h);
                        (ch.put(0, 0, 64), ch.flush())
                    });
                    // The quick pushes go once the flusher's put and flush have taken their indices, whenever its
                    // thread runs: the flush's slot stays taken until the NIC resumes, so at most one slot of the
                    // two is free. (After a sleep instead, a flusher thread that had not run yet left the FIFO
                    // empty: every quick push went in, and none timed out.)
                    let deadline = Instant::now() + Duration::from_secs(10);
                    while head.load(Ordering::Acquire) < taken + 2 && Instant::now() < deadline {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    let mut ch = device_shared(&quick);
                    let pushes: Vec<_> = (0..4u64).map(|k| ch.put(64 + 64 * k, 64 + 64 * k, 64)).collect();
                    nic.hold_executor(false);
                    let first = flusher.join().unwrap();
                    let mut ch = exclusive(&h);
                    let later = (ch.put_with_signal(1024, 1024, 64), ch.flush());
                    (pushes, first, later)
                })
            });
            barrier.wait();
            let landed = (me == 1).then(|| (contents(link.landing.as_ref().unwrap()), link._sem.inbound().unwrap()));
            barrier.wait();
            (out, landed)
        });
        let (pushes, first, later) = results[0].0.clone().expect("rank 0's calls");
        let (landing, inbound) = results[1].1.clone().expect("rank 1's buffer");
        assert_eq!(first, (Ok(()), Ok(())), "{mode:?}: the put and flush the proxy waited in");
        assert_eq!(later, (Ok(()), Ok(())), "{mode:?}: the put_with_signal and flush after the timeout");
        let ok = pushes.iter().take_while(|r| r.is_ok()).count();
        assert!(
            matches!(pushes.get(ok), Some(Err(DevError::Timeout(t))) if matches!(t.on, WaitOn::FifoSpace { .. })),
            "{mode:?}: the pushes into the full FIFO: {pushes:?}"
        );
        for (what, r) in [("first put", 0..64), ("put_with_signal", 1024..1088)]
            .into_iter()
            .chain((0..ok).map(|k| ("quick put", 64 + 64 * k..128 + 64 * k)))
        {
            assert_same(&landing[r.clone()], &payload[r], &format!("{mode:?}: {what}"));
        }
        assert_eq!(inbound, 1, "{mode:?}: one signal");
    }
}

/// Host modes: a flush is done only once the NIC has completed the channel's WQEs, however long past the
/// proxy's own bound of a wait that takes (here the NIC is stopped for a second longer than it): before, the
/// proxy's flush timed out and counted the FLUSH done, and the device's `flush` returned `Ok` with the put not
/// yet made.
#[test]
fn host_mode_flush_waits_for_the_nic_past_the_proxy_timeout() {
    let hold = PortChannel::DEFAULT_TIMEOUT + Duration::from_secs(1);
    let payload = random_bytes(&mut rng(), 64);
    let results = two_ranks(BOOT_TIMEOUT, |comm, barrier| {
        let me = comm.rank();
        let link = link(&comm, IbMode::Host, 4096);
        fill(&link._src, &payload);
        barrier.wait();
        let out = (me == 0).then(|| {
            let h = link.chan.clone().with_timeout(hold * 3).unwrap().device_handle();
            let nic = comm.nic().as_emu().expect("emulated NIC").clone();
            nic.hold_executor(true);
            std::thread::scope(|s| {
                let resumed = s.spawn(|| {
                    std::thread::sleep(hold);
                    // Read before the NIC resumes: read after, a flush that returned at once could be ahead of
                    // this thread's clock reading and look early.
                    let at = Instant::now();
                    nic.hold_executor(false);
                    at
                });
                let mut ch = exclusive(&h);
                let r = (ch.put(0, 0, 64), ch.flush());
                (r, Instant::now() >= resumed.join().unwrap())
            })
        });
        barrier.wait();
        let landed = (me == 1).then(|| contents(link.landing.as_ref().unwrap())[..64].to_vec());
        barrier.wait();
        (out, landed)
    });
    let (r, after_resume) = results[0].0.expect("rank 0's calls");
    assert_eq!(r, (Ok(()), Ok(())));
    assert!(after_resume, "the flush returned before the NIC was resumed");
    assert_same(&results[1].1.clone().expect("rank 1's buffer"), &payload, "the put");
}

/// Host modes: a dropped channel's proxy id is given back, so a program that makes and drops channels goes on
/// past the 65,536 ids a trigger can name (each `with_max_wqe_bytes` registers a channel of its own); the
/// channels made last still deliver. Before, ids were never given back: the 65,536th registration failed, and so
/// did every later one, on any connection.
#[test]
fn host_modes_give_dropped_channels_ids_back() {
    const MADE: u64 = 70_000;
    let payload = random_bytes(&mut rng(), 64);
    for mode in [IbMode::Host, IbMode::HostNoAtomic] {
        let results = two_ranks(BOOT_TIMEOUT, |comm, barrier| {
            let me = comm.rank();
            let link = link(&comm, mode, 4096);
            fill(&link._src, &payload);
            let made = (0..MADE).try_for_each(|k| link.chan.clone().with_max_wqe_bytes(1 + k % 64).map(drop));
            barrier.wait();
            let sent = (me == 0 && made.is_ok()).then(|| {
                let chan = link.chan.clone().with_max_wqe_bytes(16).unwrap();
                let h = chan.device_handle();
                let mut ch = exclusive(&h);
                (h.channel_id, ch.put_with_signal(0, 0, 64), ch.flush())
            });
            barrier.wait();
            let landed = (me == 1).then(|| (contents(link.landing.as_ref().unwrap()), link._sem.inbound().unwrap()));
            barrier.wait();
            (made.map_err(|e| e.to_string()), sent, landed)
        });
        for (rank, (made, ..)) in results.iter().enumerate() {
            assert_eq!(made, &Ok(()), "{mode:?}: rank {rank}'s {MADE} registrations");
        }
        let (id, put, flush) = results[0].1.expect("rank 0's put");
        assert!(id < 1 << 16, "{mode:?}: id {id}");
        assert_eq!((put, flush), (Ok(()), Ok(())), "{mode:?}: the last channel's put_with_signal");
        let (landing, inbound) = results[1].2.clone().expect("rank 1's buffer");
        assert_same(&landing[..64], &payload, &format!("{mode:?}: the put"));
        assert_eq!(inbound, 1, "{mode:?}: one signal");
    }
}

/// Host modes: a channel dropped right after its put was pushed, while another pusher has taken the FIFO index
/// before that put's and not yet stored its trigger (done here by hand on the `cpu` executor's `head` word), keeps
/// its id until the proxy has done the put: the put lands, and the other channel's flush finds no error. Before,
/// the proxy gave the id back at its second moment with an empty slot at its tail, which the unstored index made
/// at once: the put then named no channel, was dropped, and failed every QP of the proxy (`WR_FLUSH_ERR`, vendor
/// `VENDOR_PROXY_UNKNOWN_CHANNEL`).
#[test]
fn host_modes_a_dropped_channels_id_waits_for_its_triggers_behind_an_unstored_one() {
    use gdaki_shared::proxy::Trigger;
    use std::sync::atomic::{AtomicU64, Ordering};
    let payload = random_bytes(&mut rng(), 4096);
    for mode in [IbMode::Host, IbMode::HostNoAtomic] {
        let results = two_ranks(BOOT_TIMEOUT, |comm, barrier| {
            let me = comm.rank();
            let link = link(&comm, mode, 4096);
            fill(&link._src, &payload);
            barrier.wait();
            let out = (me == 0).then(|| {
                let a = link.chan.device_handle();
                // A channel of its own (another id) on the same connection and memory.
                let chan_b = link.chan.clone().with_max_wqe_bytes(16).unwrap();
                let b = chan_b.device_handle();
                // A pusher of channel A takes index `j` and has not stored its trigger yet.
                // SAFETY: the FIFO's `head` word (host memory on the cpu executor), which pushers use atomically.
                let head = unsafe { AtomicU64::from_ptr(a.fifo.head as *mut u64) };
                let j = head.fetch_add(1, Ordering::AcqRel);
                // Channel B's put takes index `j + 1`; then B is dropped, and the proxy finds its tail slot empty
                // for a while.
                let put = exclusive(&b).put(0, 0, 64);
                drop(chan_b);
                std::thread::sleep(Duration::from_millis(200));
                // A's pusher stores its trigger: 64 bytes at offset 1024.
                let t = Trigger::new(Trigger::PUT, a.channel_id as u16, 1024, 1024, 64);
                let slot = (a.fifo.triggers + 16 * (j & (u64::from(a.fifo.size) - 1))) as *mut u64;
                // SAFETY: slot `j` of the live ring (pinned host memory), this pusher's: the index is taken and
                // the ring has room (two triggers in a 512-slot FIFO). Word 1, with the valid bit, last.
                unsafe {
                    slot.write_volatile(t.0[0]);
                    AtomicU64::from_ptr(slot.add(1)).store(t.0[1], Ordering::Release);
                }
                let flush = exclusive(&a).flush();
                (put, flush)
            });
            barrier.wait();
            let landed = (me == 1).then(|| contents(link.landing.as_ref().unwrap()));
            barrier.wait();
            (out, landed)
        });
        let (put, flush) = results[0].0.expect("rank 0's calls");
        let landing = results[1].1.clone().expect("rank 1's buffer");
        assert_eq!((put, flush), (Ok(()), Ok(())), "{mode:?}: B's put and A's flush");
        assert_same(&landing[..64], &payload[..64], &format!("{mode:?}: the dropped channel's put"));
        assert_same(&landing[1024..1088], &payload[1024..1088], &format!("{mode:?}: the late trigger's put"));
    }
}

/// Polls `proxy.qps()` until it is `want` or 10 s have passed; returns the last count seen.
fn wait_for_qps(proxy: &gdaki::proxy::ProxyService, want: usize) -> usize {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let n = proxy.qps();
        if n == want || Instant::now() > deadline {
            return n;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Host modes: rank 1 drops its channel (keeping the semaphore and connection), then every channel, semaphore and
/// clone of its connection, while its communicator and landing buffer live.
/// - With the connection kept, the proxy keeps serving its QP: a new channel on it delivers (its send queue goes
///   on where the dropped channel's left it), and rank 0's puts to it land.
/// - Once the connection's handles are gone too, the proxy serves no QP and the QP is destroyed: rank 0's next
///   put on its end fails with syndrome 0x15 (transport retry exceeded) and writes nothing.
///
/// Before, the proxy held every connection it ever served a channel of until its own drop: the QP stayed
/// connected, and rank 0's put landed.
#[test]
fn host_modes_destroy_a_dropped_connections_qp_while_the_communicator_lives() {
    let payload = random_bytes(&mut rng(), 4096);
    for mode in [IbMode::Host, IbMode::HostNoAtomic] {
        let results = two_ranks(BOOT_TIMEOUT, |comm, barrier| {
            let me = comm.rank();
            let proxy = comm.proxy().unwrap();
            let Link { _src: src, landing, _conn: conn, _sem: sem, chan } = link(&comm, mode, 4096);
            fill(&src, &payload);
            let put_flush = |chan: &PortChannel, off: u64| {
                let h = chan.device_handle();
                let mut ch = exclusive(&h);
                (ch.put(off, off, 64), ch.flush())
            };
            // Both ranks put bytes 0..64 to each other.
            let first = put_flush(&chan, 0);
            barrier.wait();
            // Rank 1 drops its channel and makes another on the same connection and semaphore.
            let (chan, kept) = if me == 1 {
                let dst = chan.dst();
                drop(chan);
                // The proxy takes the dropped channel's id back when it is idle.
                std::thread::sleep(Duration::from_millis(200));
                let kept = proxy.qps();
                (PortChannel::new(&conn, &sem, dst, &src).unwrap(), kept)
            } else {
                (chan, proxy.qps())
            };
            // Both put bytes 1024..1088.
            let second = put_flush(&chan, 1024);
            barrier.wait();
            let landed = contents(landing.as_ref().unwrap());
            barrier.wait();
            // Rank 1 drops everything of the connection; rank 0 keeps its channel.
            let (chan, released) = if me == 1 {
                drop((chan, sem, conn));
                (None, wait_for_qps(&proxy, 0))
            } else {
                (Some((chan, sem, conn)), proxy.qps())
            };
            barrier.wait();
            // Rank 0 puts bytes 2048..2112 to rank 1's landing buffer, which rank 1 keeps registered.
            let third = chan.as_ref().map(|(c, ..)| put_flush(c, 2048));
            barrier.wait();
            let after = contents(landing.as_ref().unwrap());
            barrier.wait();
            (first, kept, second, landed, released, third, after)
        });
        for (rank, (first, kept, second, landed, ..)) in results.iter().enumerate() {
            assert_eq!(*first, (Ok(()), Ok(())), "{mode:?}: rank {rank}'s first put");
            assert_eq!(*kept, 1, "{mode:?}: rank {rank}'s proxy QPs with the connection kept");
            assert_eq!(*second, (Ok(()), Ok(())), "{mode:?}: rank {rank}'s second put");
            for r in [0..64, 1024..1088] {
                assert_same(&landed[r.clone()], &payload[r], &format!("{mode:?}: rank {rank}'s landing"));
            }
        }
        assert_eq!(results[1].4, 0, "{mode:?}: rank 1's proxy QPs after the drop");
        assert_eq!(results[0].4, 1, "{mode:?}: rank 0's proxy QPs");
        match results[0].5.expect("rank 0's third put") {
            (Ok(()), Err(DevError::Cqe(c))) => {
                assert_eq!(c.syndrome, syndrome::TRANSPORT_RETRY_EXC_ERR, "{mode:?}: the third put's error {c:?}")
            }
            other => panic!("{mode:?}: rank 0's put to the dropped connection returned {other:?}"),
        }
        assert_same(&results[1].6[2048..2112], &[0; 64], &format!("{mode:?}: rank 1's landing after the drop"));
    }
}

/// Host modes: a program that connects, makes a channel, puts and drops it all, 50 times over, leaves its proxy
/// serving no QP, every rank's put delivered. Before, the proxy held each connection it had served: 50 QPs, CQs and
/// their queue memory, growing with every round.
#[test]
fn host_modes_connecting_and_dropping_again_and_again_leaves_the_proxy_no_qps() {
    const ROUNDS: usize = 50;
    let payload = random_bytes(&mut rng(), 256);
    for mode in [IbMode::Host, IbMode::HostNoAtomic] {
        let results = two_ranks(BOOT_TIMEOUT, |comm, barrier| {
            let proxy = comm.proxy().unwrap();
            let mut bad = Vec::new();
            for round in 0..ROUNDS {
                let link = link(&comm, mode, 256);
                fill(&link._src, &payload);
                let h = link.chan.device_handle();
                let mut ch = exclusive(&h);
                let r = (ch.put(0, 0, 256), ch.flush());
                barrier.wait();
                let landed = contents(link.landing.as_ref().unwrap());
                if r != (Ok(()), Ok(())) || landed != payload {
                    bad.push((round, r));
                }
                barrier.wait();
            }
            (bad, wait_for_qps(&proxy, 0))
        });
        for (rank, (bad, qps)) in results.iter().enumerate() {
            assert_eq!(bad, &[], "{mode:?}: rank {rank}'s failed rounds");
            assert_eq!(*qps, 0, "{mode:?}: rank {rank}'s proxy QPs after {ROUNDS} rounds");
        }
    }
}

/// A rank that leaves the session while its peer waits for its signal: the wait ends with `PeerGone` naming
/// it soon after the session reports the departure (the handle's `departed` word, written after the grace),
/// not after the channel's timeout, whichever rank leaves (a non-root rank's goodbye, or the root's, which
/// breaks the session), in Device and Host modes, by `wait` and by `read_packets`. Before, each wait ran its
/// whole timeout out: nothing of its QP was outstanding, so no error CQE could tell it.
#[test]
fn a_wait_for_a_rank_that_left_ends_naming_it_long_before_its_timeout() {
    const CHANNEL_TIMEOUT: Duration = Duration::from_secs(8);
    for (leaver, mode) in [(1, IbMode::Device), (0, IbMode::Device), (1, IbMode::Host)] {
        let waited = two_ranks(BOOT_TIMEOUT, |comm, barrier| {
            let peer = 1 - comm.rank();
            let mem = register(&comm, 4096);
            comm.send_memory(&mem, peer, 0).unwrap();
            let dst = comm.recv_memory(peer, 0).unwrap();
            let cfg = EndpointConfig { ib: IbConfig { mode, ..IbConfig::default() }, ..EndpointConfig::default() };
            let conn = comm.connect(&cfg, peer, 1).unwrap();
            let sem = comm.semaphore(&conn, peer, 2).unwrap();
            let chan = PortChannel::new(&conn, &sem, dst, &mem).unwrap().with_timeout(CHANNEL_TIMEOUT).unwrap();
            let h = chan.device_handle();
            assert_ne!(h.departed, 0, "a host-built handle names its peer's word");
            comm.bootstrap().barrier().unwrap();
            barrier.wait();
            if comm.rank() == leaver {
                drop((chan, sem, conn, comm));
                return None;
            }
            let mut ch = exclusive(&h);
            let t0 = Instant::now();
            let by_wait = ch.wait();
            let by_packets = ch.read_packets::<LL16Packet>(0, 1024, 64, 1, 0, 1);
            Some((by_wait, by_packets, t0.elapsed()))
        });
        let (by_wait, by_packets, took) = waited.into_iter().flatten().next().expect("the waiter's result");
        let gone = DevError::PeerGone(gdaki_device::error::PeerGone { rank: leaver, broken: false });
        assert_eq!((by_wait, by_packets), (Err(gone), Err(gone)), "rank {leaver} left, {mode:?}");
        assert!(took < CHANNEL_TIMEOUT / 4, "rank {leaver} left, {mode:?}: the waits took {took:?}");
        assert_eq!(gone.to_string(), format!("rank {leaver} left the session before what was awaited from it came"));
    }
}

/// Host modes: a rank whose last trigger is a signal behind a backlog of puts drops everything at once, without
/// a flush. Its communicator, the proxy's last holder, drains the proxy as it drops (every trigger done, every
/// WQE completed), and only then leaves the session: the peer's wait gets the signal, with every byte of the
/// puts, not `PeerGone`. Before, the goodbye went first, and a drain longer than `DEPARTURE_GRACE` lost the
/// signal to `PeerGone` although it landed.
///
/// The waiter holds its NIC's executor from before the puts until `LISTEN` after the other rank has begun to
/// drop: no put can complete meanwhile, so the drain outlasts the grace several times over whatever the build's
/// speed, and a goodbye said before it would be heard, and the wait ended by it, within the hold. Little data
/// moves, because the drain waits at most the proxy's timeout (5 s): the 192 MiB (24 puts of 8 MiB) that once
/// made this drain long took a debug build 1.9-2.6 s per mode on a busy 2-core machine, within 2x of that bound.
#[test]
fn host_modes_a_communicator_drains_its_proxy_before_it_leaves_the_session() {
    use std::sync::atomic::{AtomicBool, Ordering};
    const LEN: usize = 256 << 10;
    const PUTS: u64 = 24;
    // How long the waiter's NIC stays held once the other rank begins to drop: a goodbye said then is heard,
    // and the peer marked gone, within it.
    const LISTEN: Duration = Duration::from_millis(200);
    let payload = random_bytes(&mut rng(), LEN);
    for mode in [IbMode::Host, IbMode::HostNoAtomic] {
        // Set by rank 1 as it begins to drop its objects.
        let dropping = AtomicBool::new(false);
        let results = two_ranks(BOOT_TIMEOUT, |comm, barrier| {
            let peer = 1 - comm.rank();
            let src = register(&comm, LEN);
            let landing = register(&comm, LEN);
            comm.send_memory(&landing, peer, 0).unwrap();
            let dst = comm.recv_memory(peer, 0).unwrap();
            let conn = comm.connect(&EndpointConfig::with_mode(mode), peer, 1).unwrap();
            let sem = comm.semaphore(&conn, peer, 2).unwrap();
            let chan = PortChannel::new(&conn, &sem, dst, &src).unwrap().with_timeout(Duration::from_secs(20)).unwrap();
            let h = chan.device_handle();
            if comm.rank() == 1 {
                fill(&src, &payload);
            }
            comm.bootstrap().barrier().unwrap();
            let nic = comm.nic().as_emu().expect("emulated NIC");
            if comm.rank() == 0 {
                nic.hold_executor(true);
            }
            barrier.wait();
            let mut ch = exclusive(&h);
            if comm.rank() == 1 {
                for _ in 0..PUTS {
                    ch.put(0, 0, LEN as u64).unwrap();
                }
                ch.signal().unwrap();
                drop(ch);
                dropping.store(true, Ordering::SeqCst);
                // The memory goes after the communicator: the proxy reads the source until it has drained.
                drop((chan, sem, conn, comm));
                return None;
            }
            let (waited, held) = std::thread::scope(|s| {
                let release = s.spawn(|| {
                    let t = Instant::now();
                    while !dropping.load(Ordering::SeqCst) && t.elapsed() < BOOT_TIMEOUT {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    std::thread::sleep(LISTEN);
                    nic.hold_executor(false);
                    t.elapsed()
                });
                (ch.wait(), release.join().unwrap())
            });
            Some((waited, sem.inbound().unwrap(), contents(&landing), held))
        });
        let (waited, inbound, landed, held) = results.into_iter().flatten().next().expect("the waiter's result");
        assert_eq!((waited, inbound), (Ok(()), 1), "{mode:?} (the NIC held for {held:?})");
        assert_same(&landed, &payload, &format!("{mode:?}: landing buffer"));
    }
}

/// A Device-mode channel of `comm` to `peer` over 4 KiB buffers, its setup calls paired by tags `tag` to
/// `tag + 2`; with the memory, connection and semaphore it uses.
fn channel_to(comm: &Communicator, peer: u32, tag: u32) -> (RegisteredMemory, Connection, Semaphore, PortChannel) {
    let mem = register(comm, 4096);
    comm.send_memory(&mem, peer, tag).unwrap();
    let dst = comm.recv_memory(peer, tag).unwrap();
    let conn = comm.connect(&EndpointConfig::default(), peer, tag + 1).unwrap();
    let sem = comm.semaphore(&conn, peer, tag + 2).unwrap();
    let chan = PortChannel::new(&conn, &sem, dst, &mem).unwrap();
    (mem, conn, sem, chan)
}

/// In a session of three, the root's goodbye marks rank 0 alone gone: ranks 1 and 2 are still there, and each
/// one's wait for the other, late by several times `DEPARTURE_GRACE` after the goodbye, gets its signal, while
/// rank 1's wait for rank 0 ends with `PeerGone` naming rank 0 as left. Before, the root's goodbye marked every
/// rank gone, and the wait between two live ranks ended with `PeerGone` too.
#[test]
fn the_roots_goodbye_marks_rank_zero_alone_gone() {
    let grace = gdaki::channel::DEPARTURE_GRACE;
    let setup = gdaki::channel::RankSetup::local(3, ExecutorKind::Cpu);
    let results = gdaki::channel::run_ranks(&setup, |comm| {
        let me = comm.rank();
        // Rank 1 has a channel to each other rank; rank 2 to rank 1; rank 0 to rank 1.
        let to_root = (me != 2).then(|| channel_to(&comm, 1 - me, 10));
        let between = (me != 0).then(|| channel_to(&comm, 3 - me, 20));
        comm.bootstrap().barrier().unwrap();
        if me == 0 {
            drop((to_root, comm));
            return None;
        }
        let (_, _, _, chan) = between.as_ref().unwrap();
        let h = chan.device_handle();
        let mut ch = exclusive(&h);
        // Well after the root's words were written; then rank 2 signals late, and rank 1 answers late.
        std::thread::sleep(5 * grace);
        let (first, second) = if me == 2 {
            std::thread::sleep(2 * grace);
            ch.signal().unwrap();
            ch.flush().unwrap();
            (ch.wait(), Ok(()))
        } else {
            let got = ch.wait();
            std::thread::sleep(2 * grace);
            ch.signal().unwrap();
            ch.flush().unwrap();
            let hr = to_root.as_ref().unwrap().3.device_handle();
            let for_root = exclusive(&hr).wait();
            (got, for_root)
        };
        // Neither leaves (which would mark it gone to the other) before both are done.
        std::thread::sleep(5 * grace);
        Some((first, second))
    })
    .unwrap();
    let got: Vec<_> = results.into_iter().map(|(rank, r)| (rank, r.unwrap())).collect();
    let root_left = DevError::PeerGone(gdaki_device::error::PeerGone { rank: 0, broken: false });
    assert_eq!(got, [(0, None), (1, Some((Ok(()), Err(root_left)))), (2, Some((Ok(()), Ok(()))))]);
}

/// In a session of three whose rank 2 dies (its bootstrap connection ends without a goodbye), the session
/// breaks, and ranks 0 and 1, both alive, each end their wait for the other with `PeerGone` saying that the
/// session broke, not that the other rank is gone; their bootstrap calls name rank 2. Before, each said that
/// the other, alive, "is gone (it left the session or died)".
#[test]
fn a_rank_that_dies_breaks_every_wait_saying_the_session_broke() {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let root = listener.local_addr().unwrap().to_string();
    let secret = gdaki::bootstrap::Secret::random().unwrap();
    let launch = |rank| gdaki::bootstrap::Launch {
        rank,
        world_size: 3,
        local_rank: rank,
        root: root.clone(),
        secret,
        source: "test",
    };
    let mut listener = Some(listener);
    // `done`: neither rank says goodbye (its communicator's drop) before both waits have ended, so that each reads
    // the break, not the other's later goodbye, which replaces it in the departed word.
    let (ready, done, root) = (&Barrier::new(3), &Barrier::new(2), &root);
    std::thread::scope(|s| {
        let ranks: Vec<_> = (0..2u32)
            .map(|rank| {
                let (l, launch) = (if rank == 0 { listener.take() } else { None }, launch(rank));
                s.spawn(move || {
                    let boot = match l {
                        Some(l) => gdaki::bootstrap::Bootstrap::root_on(l, &launch, BOOT_TIMEOUT),
                        None => gdaki::bootstrap::Bootstrap::connect(&launch, BOOT_TIMEOUT),
                    }
                    .unwrap();
                    let comm = Communicator::new(boot, Executor::Cpu, WireConfig::loopback()).unwrap();
                    let (_mem, _conn, _sem, chan) = channel_to(&comm, 1 - rank, 0);
                    let h = chan.with_timeout(Duration::from_secs(8)).unwrap().device_handle();
                    ready.wait();
                    let t = Instant::now();
                    let waited = exclusive(&h).wait();
                    let took = t.elapsed();
                    let boot = message(comm.bootstrap().barrier().unwrap_err());
                    done.wait();
                    (waited, took, boot)
                })
            })
            .collect();
        // Rank 2 joins by hand (hello, welcome), then its "process" dies.
        let mut raw = std::net::TcpStream::connect(root).unwrap();
        let mut hello = vec![40, 0, 0, 0, 1, 0, 0, 0];
        hello.extend_from_slice(b"GDAKIBS1");
        hello.extend_from_slice(&1u32.to_le_bytes());
        hello.extend_from_slice(secret.as_bytes());
        hello.extend_from_slice(&2u32.to_le_bytes());
        hello.extend_from_slice(&3u32.to_le_bytes());
        raw.write_all(&hello).unwrap();
        raw.read_exact(&mut [0u8; 16]).unwrap();
        ready.wait();
        std::thread::sleep(Duration::from_millis(100));
        drop(raw);
        let died = "rank 2 closed its connection without leaving the session (did it die?)";
        for (rank, h) in ranks.into_iter().enumerate() {
            let (waited, took, boot) = h.join().unwrap();
            let peer = 1 - rank as u32;
            let e = waited.unwrap_err();
            assert_eq!(
                e,
                DevError::PeerGone(gdaki_device::error::PeerGone { rank: peer, broken: true }),
                "rank {rank}"
            );
            assert_eq!(
                e.to_string(),
                format!(
                    "the bootstrap session broke while waiting for rank {peer} (a rank, perhaps another, or the \
                     root died, or a collective failed: the error of this rank's next bootstrap call, a barrier \
                     say, names it); what was awaited from rank {peer} may never come"
                )
            );
            assert!(took < Duration::from_secs(2), "rank {rank} waited {took:?}");
            assert!(boot.starts_with(&format!("rank {rank}: barrier (all_gather #")) && boot.contains(died), "{boot}");
        }
    });
}

/// A wait that starts only after the peer has left and its word was written, and the retries after it: each
/// ends with `PeerGone` soon after it is late (not after the channel's timeout), and each gives its count
/// back, so that nothing is counted as waited for; in Device and Host modes.
#[test]
fn waits_begun_after_the_peer_left_and_their_retries_each_end_with_peer_gone_giving_the_count_back() {
    const CHANNEL_TIMEOUT: Duration = Duration::from_secs(8);
    for mode in [IbMode::Device, IbMode::Host] {
        let results = two_ranks(BOOT_TIMEOUT, |comm, barrier| {
            let peer = 1 - comm.rank();
            let mem = register(&comm, 4096);
            comm.send_memory(&mem, peer, 0).unwrap();
            let dst = comm.recv_memory(peer, 0).unwrap();
            let conn = comm.connect(&EndpointConfig::with_mode(mode), peer, 1).unwrap();
            let sem = comm.semaphore(&conn, peer, 2).unwrap();
            let chan = PortChannel::new(&conn, &sem, dst, &mem).unwrap().with_timeout(CHANNEL_TIMEOUT).unwrap();
            let h = chan.device_handle();
            comm.bootstrap().barrier().unwrap();
            barrier.wait();
            if comm.rank() == 1 {
                drop(comm);
                return None;
            }
            std::thread::sleep(5 * gdaki::channel::DEPARTURE_GRACE);
            let mut ch = exclusive(&h);
            let waits: Vec<_> = (0..3)
                .map(|_| {
                    let t = Instant::now();
                    (ch.wait(), t.elapsed() < CHANNEL_TIMEOUT / 4)
                })
                .collect();
            Some((waits, sem.expected().unwrap()))
        });
        let gone = DevError::PeerGone(gdaki_device::error::PeerGone { rank: 1, broken: false });
        let (waits, expected) = results.into_iter().flatten().next().expect("the waiter's result");
        assert_eq!(waits, vec![(Err(gone), true); 3], "{mode:?}");
        assert_eq!(expected, 0, "{mode:?}: every count given back");
    }
}

/// A world of one, whose channel is a loopback to itself: the communicator's drop is this rank's own leaving,
/// which marks no word, so the channel's wait afterwards times out naming rank 0 rather than ending with
/// `PeerGone`, and then gets the signal it sends itself.
#[test]
fn a_loopback_channel_is_never_told_its_own_rank_left() {
    let setup = gdaki::channel::RankSetup::local(1, ExecutorKind::Cpu);
    let results = gdaki::channel::run_ranks(&setup, |comm| {
        let (_mem, conn, sem, chan) = channel_to(&comm, 0, 0);
        let chan = chan.with_timeout(Duration::from_millis(200)).unwrap();
        let h = chan.device_handle();
        drop(comm);
        std::thread::sleep(5 * gdaki::channel::DEPARTURE_GRACE);
        let mut ch = exclusive(&h);
        let alone = ch.wait();
        ch.signal().unwrap();
        let signalled = ch.wait();
        drop(ch);
        (
            alone.map_err(|e| match e {
                DevError::Timeout(t) => Ok(t.on),
                other => Err(other),
            }),
            signalled,
            sem.expected().unwrap(),
            conn.peer(),
        )
    })
    .unwrap();
    let (rank, got) = results.into_iter().next().unwrap();
    let on = WaitOn::Peer { rank: 0, expected: 1, seen: 0 };
    assert_eq!((rank, got.unwrap()), (0, (Err(Ok(on)), Ok(()), 1, 0)));
}

/// Two threads of a rank call `leave` at once while its proxy, held last by the communicator, still has puts to
/// drain: neither says goodbye before the drain is done, so the peer hears of the leaving only once every put
/// has landed (its semaphore counts them all). The second `leave` said goodbye at once while the first still
/// drained, and the peer's waits for this rank would end with `PeerGone` while its puts were on their way.
///
/// Rank 0 holds its NIC's executor from before the puts until both `leave`s have been called: the drain is then
/// under way when the second `leave` comes, whatever the build's speed, and no goodbye may be heard while the
/// hold lasts (no put can complete). Little data moves, because the drain waits at most the proxy's timeout (5 s)
/// from the first `leave` on: the 256 MiB this test once moved to make the drain long took a debug build's
/// emulated NIC up to 5.2 s on an idle 2-core machine, and the goodbye then went out with signals still on their
/// way.
#[test]
fn a_second_leave_waits_for_the_first_ones_drain_of_the_proxy() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    const LEN: usize = 64 << 10;
    const PUTS: u64 = 64;
    // How long rank 0 listens, NIC held, once rank 1 calls its second `leave`: a goodbye said then arrives
    // within it.
    const LISTEN: Duration = Duration::from_millis(50);
    let payload = random_bytes(&mut rng(), LEN);
    // Rank 0's semaphore count when it heard that rank 1 left (u64::MAX: not heard).
    let at_departure = std::sync::Arc::new(AtomicU64::new(u64::MAX));
    // Set by rank 1 as it calls its second `leave`.
    let second = AtomicBool::new(false);
    // What rank 1 saw of its leaving, for the failure message: how long it took, and its NIC's error counts.
    let leaving = std::sync::Mutex::new(String::new());
    two_ranks(BOOT_TIMEOUT, |comm, barrier| {
        let l = link(&comm, IbMode::Host, LEN);
        if comm.rank() == 0 {
            let (sem, seen) = (l._sem.clone(), at_departure.clone());
            comm.bootstrap().on_departure(move |who| {
                if who == Some(1) {
                    seen.store(sem.inbound().unwrap(), Ordering::SeqCst);
                }
            });
            let nic = comm.nic().as_emu().expect("emulated NIC");
            nic.hold_executor(true);
            barrier.wait();
            let t = Instant::now();
            while !second.load(Ordering::SeqCst) && t.elapsed() < BOOT_TIMEOUT {
                std::thread::sleep(Duration::from_millis(1));
            }
            std::thread::sleep(LISTEN);
            let while_held = at_departure.load(Ordering::SeqCst);
            let held = t.elapsed();
            nic.hold_executor(false);
            while at_departure.load(Ordering::SeqCst) == u64::MAX && t.elapsed() < BOOT_TIMEOUT {
                std::thread::sleep(Duration::from_millis(1));
            }
            let heard = t.elapsed();
            let landed = contents(l.landing.as_ref().unwrap());
            // Rank 1 waits here: no assertion before it.
            barrier.wait();
            let rank1 = leaving.lock().unwrap().clone();
            assert_eq!(
                while_held,
                u64::MAX,
                "rank 1's leaving was heard while rank 0's NIC held its puts unanswered (signals landed then); the \
                 hold lasted {held:?}; rank 1: {rank1}"
            );
            assert_eq!(
                at_departure.load(Ordering::SeqCst),
                PUTS,
                "signals landed when rank 1's leaving was heard, {heard:?} after the puts began ({held:?} of it held); \
                 rank 1: {rank1}"
            );
            assert_same(&landed, &payload, "landing buffer");
        } else {
            fill(&l._src, &payload);
            barrier.wait();
            let t = Instant::now();
            {
                let h = l.chan.device_handle();
                let mut ch = exclusive(&h);
                for _ in 0..PUTS {
                    ch.put_with_signal(0, 0, LEN as u64).unwrap();
                }
            }
            // The memory stays; the channel, connection and semaphore go: the communicator holds the proxy last.
            let Link { _src, landing, _conn, _sem, chan } = l;
            drop((chan, _sem, _conn));
            std::thread::scope(|s| {
                let first = s.spawn(|| comm.leave());
                std::thread::sleep(Duration::from_millis(5));
                second.store(true, Ordering::SeqCst);
                comm.leave();
                first.join().unwrap();
            });
            let st = comm.nic().as_emu().expect("emulated NIC").stats();
            *leaving.lock().unwrap() = format!(
                "left {:?} after the puts began; its NIC: {} WQEs, {} error CQEs, {} flush CQEs, {} CQ overruns",
                t.elapsed(),
                st.wqes,
                st.error_cqes,
                st.flush_cqes,
                st.cq_overruns
            );
            barrier.wait();
            drop((_src, landing));
        }
    });
}
