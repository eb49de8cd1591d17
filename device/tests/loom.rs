//! Model checking of device code's concurrent protocols on their host twins, with `loom`: every interleaving
//! (up to a preemption bound) of the real `SharedQp` posting / ringing / CQ retiring code and of the real
//! proxy-FIFO push and pop, against a minimal NIC that acts on the doorbell as the emulated NIC does.
//!
//! Run with `cargo xtask loom` (`RUSTFLAGS="--cfg loom" cargo test -p gdaki-device --test loom --release`,
//! in its own target directory). `LOOM_MAX_PREEMPTIONS` overrides the bound each model sets.
//!
//! Bounded waits spin, and loom lets a spinning thread run while the one it waits for starves. Such an
//! execution ends early: a wait of device code times out after [`TIMEOUT_NS`] (about 10 tries), the NIC
//! and the poller give up after [`SPINS`] tries, and the execution counts as starved, with its safety checks
//! (no unexpected CQE, no error, every WQE checked by the NIC) made up to that point and its end-state
//! checks skipped. Each model asserts how many executions ran to the end and prints both counts.
#![cfg(loom)]

use gdaki_device::fifo;
use gdaki_device::scope::{Block, Device, Scope};
use gdaki_device::shared_qp::SharedQp;
use gdaki_device::sync;
use gdaki_device::wqe;
use gdaki_shared::handle::{CqHandle, QpHandle};
use gdaki_shared::prm::cqe::{Cqe64, OP_OWN_INVALID};
use gdaki_shared::prm::opcode;
use gdaki_shared::prm::wqe::{wqebbs, CtrlSeg, Seg};
use gdaki_shared::proxy::{FifoHandle, Trigger};
use gdaki_shared::{Be16, Be32};
use loom::thread;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

/// Bound of every device-side wait in the models: the twins' clock advances 1 µs per read, so this is
/// about 10 tries (each yields to the other threads).
const TIMEOUT_NS: u64 = 20_000;
/// Tries of the NIC's and the poller's loops before they give up on a starved execution.
const SPINS: u32 = 10;

/// Executions of one model: how many ran to the end, how many were starved (see the module docs).
#[derive(Default)]
struct Runs {
    complete: std::sync::atomic::AtomicUsize,
    starved: std::sync::atomic::AtomicUsize,
}

impl Runs {
    fn count(&self, starved: bool) {
        let c = if starved { &self.starved } else { &self.complete };
        c.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Prints the counts and asserts that at least `min` executions ran to the end.
    fn report(&self, model: &str, min: usize) {
        let (c, s) = (self.complete.load(Relaxed), self.starved.load(Relaxed));
        println!("{model}: {c} complete executions, {s} starved");
        assert!(c >= min, "{model}: only {c} executions ran to the end ({s} starved)");
    }
}

/// Set by any thread of the current execution that gave up on a starved wait. A std atomic: the model does
/// not need to see it, only the test's bookkeeping.
#[derive(Clone, Default)]
struct Starved(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl Starved {
    fn set(&self) {
        self.0.store(true, Relaxed);
    }
    fn get(&self) -> bool {
        self.0.load(Relaxed)
    }
}

const QPN: u32 = 0x00_0abc;
const WQE_CNT: u32 = 16;
const NCQE: u32 = 16;

/// One QP's queue memory in host memory: SQ, UAR register, CQ, dbrecs, the QP's handle.
#[repr(C, align(64))]
struct Queues {
    sq: [[Seg; 4]; WQE_CNT as usize],
    bf: [u64; 8],
    cq: [[u64; 8]; NCQE as usize],
    dbrec: [u32; 2],
    cq_dbrec: [u32; 2],
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
            cq: CqHandle {
                buf: q.cq.as_ptr() as u64,
                dbrec: q.cq_dbrec.as_ptr() as u64,
                ncqe: NCQE,
                cqn: 1,
                cons_index: 0,
                ..Default::default()
            },
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
/// with release order), until `total` WQEBBs are done or the execution starves.
fn nic(q: Ptr<Queues>, total: u64, starved: &Starved) {
    let q = q.0;
    // SAFETY: `q` is live for the model's run; only addresses are taken (every word goes through the twins).
    let (bf, sq, cq) = unsafe { ((*q).bf.as_ptr(), (*q).sq.as_ptr() as *const u64, (*q).cq.as_mut_ptr() as *mut u64) };
    let (mut consumed, mut cqes, mut last_db, mut spins) = (0u64, 0u64, 0u64, 0u32);
    while consumed < total {
        // SAFETY: the register word, 8-byte aligned.
        let db = unsafe { sync::load_acquire_u64(bf) };
        if db == last_db {
            spins += 1;
            if spins > SPINS || starved.get() {
                starved.set();
                return;
            }
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
fn post_and_poll<S: Scope + 'static>(model: &str, posters: usize, preemptions: usize) {
    let runs = Arc::new(Runs::default());
    let r = runs.clone();
    builder(preemptions).check(move || {
        gdaki_device::loom_reset();
        let q = Queues::new();
        let total = posters as u64;
        let starved = Starved::default();
        let mut hs = Vec::new();
        for _ in 0..posters {
            let starved = starved.clone();
            hs.push(thread::spawn(move || {
                let q = q.0;
                // SAFETY: the handle of the model's QP, used by shared posters of scope `S` only.
                let qp = unsafe { SharedQp::<S>::new(&raw mut (*q).handle, TIMEOUT_NS) };
                match qp.post(true, wqe::nop()) {
                    Ok(_) => {}
                    Err(gdaki_device::Error::Timeout(_)) => starved.set(),
                    Err(e) => panic!("post: {e}"),
                }
            }));
        }
        let s = starved.clone();
        hs.push(thread::spawn(move || {
            let q = q.0;
            // SAFETY: as above.
            let qp = unsafe { SharedQp::<S>::new(&raw mut (*q).handle, TIMEOUT_NS) };
            for spin in 0.. {
                // The property checked: a poller never takes a legitimate CQE for an unexpected one.
                qp.progress().unwrap_or_else(|e| panic!("progress: {e}"));
                // SAFETY: the state's `ci` word.
                if unsafe { sync::load_acquire_u64(&raw const (*q).handle.sq.ci) } >= total {
                    break;
                }
                if spin > SPINS || s.get() {
                    s.set();
                    break;
                }
                thread::yield_now();
            }
        }));
        // The NIC is the model's main thread (loom runs at most 5 threads).
        nic(q, total, &starved);
        for h in hs {
            h.join().unwrap();
        }
        // SAFETY: every model thread has finished.
        let q = unsafe { Box::from_raw(q.0) };
        if !starved.get() {
            let st = q.handle.sq;
            assert_eq!((st.pi, st.ready, st.ci, st.err_idx), (total, total, total, 0), "{st:?}");
            assert!(st.rung >= total, "every WQE rung: {st:?}");
        }
        r.count(starved.get());
        gdaki_device::loom_reset();
    });
    runs.report(model, 1);
}

/// loom's settings for these models: a preemption bound of `preemptions` unless `LOOM_MAX_PREEMPTIONS` says
/// otherwise, and room for the spin loops of bounded waits (each try is a few branches).
fn builder(preemptions: usize) -> loom::model::Builder {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = b.preemption_bound.or(Some(preemptions));
    b.max_branches = 100_000;
    b
}

/// The race of the first shared-QP poller: it read `pi` before a poster reserved, then met that poster's
/// CQE and called it unexpected. One preemption finds it in the old code; two are explored here (about 9,000
/// executions). Block and Device scope differ only in the PTX scope of their atomics, which the host twins do
/// not have, so one scope is modelled.
#[test]
fn shared_qp_one_poster_and_a_poller() {
    post_and_poll::<Device>("shared QP, 1 poster", 1, 2);
}

/// Two posters (in-order publication, doorbells batched under the lock, the later poster ringing for both),
/// the poller and the NIC, with one preemption (about 650,000 executions).
#[test]
fn shared_qp_two_posters_and_a_poller() {
    post_and_poll::<Block>("shared QP, 2 posters", 2, 1);
}

/// Two pushers push two triggers each through a FIFO of two slots (so every push but the first two waits for
/// room), while the proxy's twin pops them: every trigger arrives exactly once, whole, each pusher's in its
/// order, and `tail` counts them all.
#[test]
fn fifo_two_pushers_and_the_proxy() {
    const SIZE: u32 = 2;
    const EACH: u64 = 2;
    let runs = Arc::new(Runs::default());
    let r = runs.clone();
    builder(2).check(move || {
        gdaki_device::loom_reset();
        let starved = Starved::default();
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
                let starved = starved.clone();
                thread::spawn(move || {
                    for k in 0..EACH {
                        let t = Trigger::new(Trigger::PUT, p, k, 0, 1 + k);
                        // SAFETY: the model's live FIFO.
                        match unsafe { fifo::push(&f, t, TIMEOUT_NS) } {
                            Ok(_) => {}
                            Err(gdaki_device::Error::Timeout(_)) => return starved.set(),
                            Err(e) => panic!("push: {e}"),
                        }
                    }
                })
            })
            .collect();
        // The proxy is the model's main thread.
        let mut got = Vec::new();
        let (mut tail, mut spins) = (0u64, 0u32);
        while got.len() < 2 * EACH as usize && !starved.get() {
            let slot = (f.triggers as *mut [u64; 2]).wrapping_add((tail % SIZE as u64) as usize);
            // SAFETY: a slot of the live ring, and its tail word, written by this thread only.
            match unsafe { fifo::peek_slot(slot) } {
                Some(t) => {
                    tail += 1;
                    // SAFETY: as above.
                    unsafe { fifo::retire_slot(slot, f.tail as *mut u64, tail) };
                    got.push(t);
                }
                None => {
                    spins += 1;
                    if spins > SPINS {
                        starved.set();
                    }
                    thread::yield_now()
                }
            }
        }
        for h in pushers {
            h.join().unwrap();
        }
        // Whatever was popped is whole, once, and in each pusher's order (also in a starved execution).
        for p in 0..2u16 {
            let mine: Vec<(u64, u64)> =
                got.iter().filter(|t| t.channel() == p).map(|t| (t.dst_offset(), t.size())).collect();
            assert_eq!(mine, [(0, 1), (1, 2)][..mine.len()], "pusher {p}'s triggers, whole and in order: {got:?}");
        }
        // SAFETY: every model thread has finished.
        let m = unsafe { Box::from_raw(m.0) };
        if !starved.get() {
            assert_eq!((m.head, m.tail, got.len()), (4, 4, 4));
        }
        r.count(starved.get());
        gdaki_device::loom_reset();
    });
    runs.report("FIFO, 2 pushers", 1);
}
