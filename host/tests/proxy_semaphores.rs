//! HostNoAtomic semaphores whose peer word has the address and key of a dropped semaphore's. A test binary of
//! its own: the reuse depends on the allocator handing the dropped word back, which the threads of other tests
//! allocating at the same time would make a matter of chance.

use std::sync::Barrier;
use std::time::Duration;

mod ranks;

use gdaki::channel::{Communicator, EndpointConfig, IbMode, PortChannel, RegisteredMemory, Semaphore};
use gdaki::exec::{Executor, ExecutorKind};
use gdaki::nic::emu::WireConfig;
use gdaki_device::channel::{Exclusive, PortChannel as DevChannel};
use gdaki_shared::channel::PortChannelHandle;

/// Bound of bootstrap calls.
const BOOT_TIMEOUT: Duration = Duration::from_secs(20);

/// Runs `f(communicator, barrier)` on two ranks (threads), each with its own communicator (cpu executor,
/// loopback wire); returns the results by rank.
fn two_ranks<T: Send>(f: impl Fn(Communicator, &Barrier) -> T + Sync) -> Vec<T> {
    ranks::two_ranks(
        |mut boot| {
            boot.set_timeout(BOOT_TIMEOUT);
            let (exec, _) = Executor::open(Some(ExecutorKind::Cpu)).unwrap_or_else(|e| panic!("{e}"));
            Communicator::new(boot, exec, WireConfig::loopback()).unwrap_or_else(|e| panic!("communicator: {e}"))
        },
        |_, comm, barrier| f(comm, barrier),
    )
}

fn exclusive(h: &PortChannelHandle) -> DevChannel<'_, Exclusive> {
    // SAFETY: `h` comes from a live channel of the cpu executor, used by this thread only.
    unsafe { DevChannel::new(h) }
}

/// Registers `len` zeroed bytes of host memory.
fn register(comm: &Communicator, len: usize) -> RegisteredMemory {
    comm.register_buffer(comm.executor().alloc_data(len).unwrap()).unwrap()
}

/// HostNoAtomic: a semaphore counts its signals from 0, also when its peer word has the address and key of a
/// dropped semaphore's (memory and keys are reused): the proxy kept one count per peer word, so the new
/// semaphore's first signal wrote the old one's count + 1, and its peer's waits passed for signals never sent.
///
/// Semaphores are made and dropped one after another, every `EVERY`th signalled three times through a channel
/// of its own; the allocator and the key table hand a dropped word back (same address, same key variant)
/// some 256 semaphores later, in an order that the channels disturb, so several words are watched. The first
/// semaphore whose peer word is one signalled before is signalled once, and its peer must read 1.
#[test]
fn host_no_atomic_semaphore_counts_from_zero_where_a_dropped_ones_word_was() {
    use std::collections::HashSet;
    use std::sync::atomic::{AtomicBool, Ordering};
    const SIGNALS: u64 = 3;
    const EVERY: u32 = 97;
    // Rank 0's finding, which both ranks act on.
    let reused = AtomicBool::new(false);
    let results = two_ranks(|comm, barrier| {
        let (me, peer) = (comm.rank(), 1 - comm.rank());
        let src = register(&comm, 4096);
        let landing = register(&comm, 4096);
        comm.send_memory(&landing, peer, 0).unwrap();
        let dst = comm.recv_memory(peer, 0).unwrap();
        let conn = comm.connect(&EndpointConfig::with_mode(IbMode::HostNoAtomic), peer, 1).unwrap();
        let signal = |sem: &Semaphore, n: u64| {
            let chan = PortChannel::new(&conn, sem, dst, &src).unwrap();
            let sent = (me == 0).then(|| {
                let h = chan.device_handle();
                let mut ch = exclusive(&h);
                ((0..n).map(|_| ch.signal()).collect::<Vec<_>>(), ch.flush())
            });
            barrier.wait();
            sent
        };
        let mut signalled = HashSet::new();
        for tag in 2..20_000 {
            let sem = comm.semaphore(&conn, peer, tag).unwrap();
            let word = bytemuck::bytes_of(&sem.remote_inbound()).to_vec();
            if me == 0 && signalled.contains(&word) {
                reused.store(true, Ordering::Relaxed);
            }
            barrier.wait();
            if reused.load(Ordering::Relaxed) {
                let sent = signal(&sem, 1);
                let seen = sem.inbound().unwrap();
                barrier.wait();
                return Some((tag, sent, seen));
            }
            if tag % EVERY == 0 {
                // Checked at the end (a rank that panicked here would leave the other at a barrier).
                let sent = signal(&sem, SIGNALS);
                let ok = sent.is_none_or(|(s, f)| s.iter().all(Result::is_ok) && f.is_ok());
                let seen = sem.inbound().unwrap();
                barrier.wait();
                if !ok || (me == 1 && seen != SIGNALS) {
                    return Some((tag, None, seen));
                }
                signalled.insert(word);
            }
            drop(sem);
            barrier.wait();
        }
        None
    });
    let (tag, _, seen) = results[1].clone().expect("no semaphore met a signalled one's peer word");
    assert_eq!(results[0].clone().map(|r| r.1), Some(Some((vec![Ok(())], Ok(())))), "rank 0's signal ({tag})");
    assert_eq!(seen, 1, "semaphore {tag}'s inbound word after one signal");
}
