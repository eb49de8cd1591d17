//! Model checking of device code's concurrent protocols on their host twins, with `loom`: every interleaving
//! (up to a preemption bound) of the real `SharedQp` posting / ringing / CQ retiring code and of the real
//! proxy-FIFO push and pop, against a minimal NIC that acts on the doorbell as the emulated NIC does.
//!
//! Run with `cargo xtask loom` (`RUSTFLAGS="--cfg loom" cargo test -p gdaki-device --test loom --release`,
//! in its own target directory). `LOOM_MAX_PREEMPTIONS` overrides the bound each model sets.
#![cfg(loom)]

use gdaki_device::fifo;
use gdaki_device::scope::{Block, Device, Scope};
use gdaki_device::shared_qp::SharedQp;
use gdaki_device::sync;
use gdaki_device::wqe;
use gdaki_shared::channel::SharedQpState;
use gdaki_shared::handle::{CqHandle, QpHandle};
use gdaki_shared::prm::cqe::{Cqe64, OP_OWN_INVALID};
use gdaki_shared::prm::opcode;
use gdaki_shared::prm::wqe::{wqebbs, CtrlSeg, Seg};
use gdaki_shared::proxy::{FifoHandle, Trigger};
use gdaki_shared::{Be16, Be32};
use loom::thread;

/// Bound of every device-side wait in the models: the twins' clock advances 1 µs per read, so this is about
/// 200 tries, far beyond what any interleaving needs (each try yields to the other threads); a timeout is a
/// failure, and so is a NIC or poller loop of more than [`SPINS`] tries.
const TIMEOUT_NS: u64 = 5_000_000;
const SPINS: u32 = 5000;

const QPN: u32 = 0x00_0abc;
const WQE_CNT: u32 = 16;
const NCQE: u32 = 16;

/// One QP's queue memory in host memory: SQ, UAR register, CQ, dbrecs, shared-QP state.
#[repr(C, align(64))]
struct Queues {
    sq: [[Seg; 4]; WQE_CNT as usize],
    bf: [u64; 8],
    cq: [[u64; 8]; NCQE as usize],
    dbrec: [u32; 2],
    cq_dbrec: [u32; 2],
    state: SharedQpState,
    handle: QpHandle,
}

/// A raw pointer that model threads share (every access to what it points to goes through the twins).
struct Ptr<T>(*mut T);
impl<T> Clone for Ptr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Ptr<T> {}
// SAFETY: the pointee outlives every model thread (joined before it is freed), and all concurrent accesses
// to it go through the twins' atomics.
unsafe impl<T> Send for Ptr<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for Ptr<T> {}

impl Queues {
    fn new() -> Ptr<Queues> {
        // SAFETY: all fields are plain integers for which zero is valid.
        let mut q: Box<Queues> = Box::new(unsafe { core::mem::zeroed() });
        for c in q.cq.iter_mut() {
            c[7] = (OP_OWN_INVALID as u64) << 56;
        }
        q.handle = QpHandle {
            sq_buf: q.sq.as_ptr() as u64,
            dbrec: q.dbrec.as_ptr() as u64,
            bf_reg: q.bf.as_ptr() as u64,
            wqe_cnt: WQE_CNT,
            qpn: QPN,
            cq: CqHandle { buf: q.cq.as_ptr() as u64, dbrec: q.cq_dbrec.as_ptr() as u64, ncqe: NCQE, cqn: 1, cons_index: 0 },
            ..Default::default()
        };
        let p = Box::into_raw(q);
        // SAFETY: the whole struct, live until the iteration frees it; 64-byte aligned, a multiple of 64 long.
        unsafe { gdaki_device::loom_register(p as *const u8, size_of::<Queues>()) };
        Ptr(p)
    }
}

/// The NIC: waits for doorbells (the UAR register's word 0, as the emulated NIC watches it), executes each
/// announced WQE as a no-op after checking its ctrl segment, and writes its CQE (words 4..7, `op_own` last
/// with release order), until `total` WQEBBs are done.
fn nic(q: Ptr<Queues>, total: u64) {
    let q = q.0;
    // SAFETY (of the raw accesses below): `q` is live for the model's run; every word goes through the twins.
    let (bf, sq, cq, state) = unsafe {
        ((*q).bf.as_ptr(), (*q).sq.as_ptr() as *const u64, (*q).cq.as_mut_ptr() as *mut u64, &raw const (*q).state)
    };
    let (mut consumed, mut cqes, mut last_db, mut spins) = (0u64, 0u64, 0u64, 0u32);
    while consumed < total {
        // SAFETY: the register word, 8-byte aligned.
        let db = unsafe { sync::load_acquire_u64(bf) };
        if db == last_db {
            spins += 1;
            // SAFETY: the state, for the message.
            assert!(spins < SPINS, "no doorbell for WQE {consumed}: {:?}", unsafe { &(*state).clone() });
            thread::yield_now();
            continue;
        }
        last_db = db;
        let ctrl = CtrlSeg::from(Seg([db, 0]));
        let end = ctrl.wqe_index().wrapping_add(wqebbs(ctrl.ds() as u32) as u16);
        let ahead = end.wrapping_sub(consumed as u16) as u64;
        assert!(ahead <= WQE_CNT as u64, "doorbell for index {end} with {consumed} consumed");
        let pi = consumed + ahead;
        while consumed < pi {
            let slot = (consumed % WQE_CNT as u64) as usize;
            // SAFETY: the ctrl segment's first word in the ring.
            let w0 = unsafe { sync::load_word_u64(sq.add(slot * 8)) };
            // SAFETY: its second word.
            let w1 = unsafe { sync::load_word_u64(sq.add(slot * 8 + 1)) };
            let c = CtrlSeg::from(Seg([w0, w1]));
            assert_eq!((c.qpn(), c.wqe_index(), c.opcode()), (QPN, consumed as u16, opcode::NOP), "WQE at {consumed}");
            let mut e = Cqe64 {
                sop_drop_qpn: Be32::new(QPN),
                wqe_counter: Be16::new(consumed as u16),
                op_own: (opcode::cqe::REQ << 4) | ((cqes / NCQE as u64) & 1) as u8,
                ..bytemuck::Zeroable::zeroed()
            };
            e.signature = 0;
            let words: [u64; 8] = bytemuck::cast(e);
            let at = (cqes % NCQE as u64) as usize * 8;
            // SAFETY: the CQE's words; its slot is free (fewer CQEs than entries in every model).
            unsafe {
                for (i, w) in words.iter().enumerate().take(7).skip(4) {
                    sync::store_word_u64(cq.add(at + i), *w);
                }
                sync::store_release_u64(cq.add(at + 7), words[7]);
            }
            cqes += 1;
            consumed += wqebbs(c.ds() as u32) as u64;
        }
    }
}

/// `posters` threads post one NOP each to a shared QP of scope `S`, while another thread only polls the CQ
/// (`progress`) until every WQE is retired, and the NIC runs: no poller may ever report a legitimate CQE
/// as unexpected, and every WQE must be rung, executed once and retired.
fn post_and_poll<S: Scope + 'static>(posters: usize) {
    let b = builder();
    b.check(move || {
        gdaki_device::loom_reset();
        let q = Queues::new();
        let total = posters as u64;
        let mut hs = Vec::new();
        for _ in 0..posters {
            hs.push(thread::spawn(move || {
                let q = q.0;
                // SAFETY: the handle and state of the model's QP, used by shared posters of scope `S` only.
                let qp = unsafe { SharedQp::<S>::new(&(*q).handle, &raw mut (*q).state, TIMEOUT_NS) };
                let _ticket = qp.post(true, wqe::nop()).unwrap_or_else(|e| panic!("post: {e}"));
            }));
        }
        hs.push(thread::spawn(move || {
            let q = q.0;
            // SAFETY: as above.
            let qp = unsafe { SharedQp::<S>::new(&(*q).handle, &raw mut (*q).state, TIMEOUT_NS) };
            for spin in 0.. {
                qp.progress().unwrap_or_else(|e| panic!("progress: {e}"));
                // SAFETY: the state's `retired` word.
                if unsafe { sync::load_acquire_u64(&raw const (*q).state.retired) } >= total {
                    break;
                }
                // SAFETY: a plain read of the written-through state, for the message.
                assert!(spin < SPINS, "poller: not all retired: {:?}", unsafe { &(*q).state.clone() });
                thread::yield_now();
            }
        }));
        // The NIC is the model's main thread (loom runs at most 5 threads).
        nic(q, total);
        for h in hs {
            h.join().unwrap();
        }
        // SAFETY: every model thread has finished.
        let q = unsafe { Box::from_raw(q.0) };
        let st = q.state;
        assert_eq!((st.resv, st.ready, st.retired, st.err_idx), (total, total, total, 0), "{st:?}");
        assert!(st.rung >= total, "every WQE rung: {st:?}");
        gdaki_device::loom_reset();
    });
}

/// loom's settings for these models: a preemption bound of 2 unless `LOOM_MAX_PREEMPTIONS` says otherwise,
/// and room for the spin loops of bounded waits (each try is a few branches).
fn builder() -> loom::model::Builder {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = b.preemption_bound.or(Some(2));
    b.max_branches = 100_000;
    b
}

#[test]
fn device_scope_two_posters_and_a_poller() {
    post_and_poll::<Device>(2);
}

#[test]
fn block_scope_three_posters_and_a_poller() {
    post_and_poll::<Block>(3);
}

/// Two pushers push two triggers each through a FIFO of two slots (so every push but the first two waits for
/// room), while the proxy's twin pops them: every trigger arrives exactly once, whole, each pusher's in its
/// order, and `tail` counts them all.
#[test]
fn fifo_two_pushers_and_the_proxy() {
    const SIZE: u32 = 2;
    const EACH: u64 = 2;
    let b = builder();
    b.check(|| {
        gdaki_device::loom_reset();
        #[repr(C, align(64))]
        struct Mem {
            ring: [[u64; 2]; SIZE as usize],
            head: u64,
            tail: u64,
            tail_cache: u64,
        }
        let m = Ptr(Box::into_raw(Box::new(Mem { ring: [[0; 2]; SIZE as usize], head: 0, tail: 0, tail_cache: 0 })));
        // SAFETY: the whole struct, live until the iteration frees it, 64-byte aligned and sized.
        unsafe { gdaki_device::loom_register(m.0 as *const u8, size_of::<Mem>()) };
        // SAFETY: `m` is live until the end of the iteration.
        let f = unsafe {
            let m = m.0;
            FifoHandle {
                triggers: (*m).ring.as_ptr() as u64,
                head: &raw mut (*m).head as u64,
                tail: &raw mut (*m).tail as u64,
                tail_cache: &raw mut (*m).tail_cache as u64,
                size: SIZE,
                pad: 0,
            }
        };
        let pushers: Vec<_> = (0..2u16)
            .map(|p| {
                thread::spawn(move || {
                    for k in 0..EACH {
                        let t = Trigger::new(Trigger::PUT, p, k, 0, 1 + k);
                        // SAFETY: the model's live FIFO.
                        unsafe { fifo::push(&f, t, TIMEOUT_NS) }.unwrap_or_else(|e| panic!("push: {e}"));
                    }
                })
            })
            .collect();
        // The proxy is the model's main thread.
        let mut got = Vec::new();
        let mut tail = 0u64;
        while got.len() < 2 * EACH as usize {
            let slot = (f.triggers as *mut [u64; 2]).wrapping_add((tail % SIZE as u64) as usize);
            // SAFETY: a slot of the live ring, and its tail word, written by this thread only.
            match unsafe { fifo::peek_slot(slot) } {
                Some(t) => {
                    tail += 1;
                    // SAFETY: as above.
                    unsafe { fifo::retire_slot(slot, f.tail as *mut u64, tail) };
                    got.push(t);
                }
                None => thread::yield_now(),
            }
        }
        for h in pushers {
            h.join().unwrap();
        }
        for p in 0..2u16 {
            let mine: Vec<(u64, u64)> =
                got.iter().filter(|t| t.channel() == p).map(|t| (t.dst_offset(), t.size())).collect();
            assert_eq!(mine, [(0, 1), (1, 2)], "pusher {p}'s triggers, whole and in order: {got:?}");
        }
        // SAFETY: every model thread has finished.
        let m = unsafe { Box::from_raw(m.0) };
        assert_eq!((m.head, m.tail), (4, 4));
        gdaki_device::loom_reset();
    });
}
