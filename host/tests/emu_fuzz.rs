//! Any bytes in the SQ ring and any doorbell or dbrec value: the emulated NIC never panics, never hangs,
//! never writes outside a registered region (nor into a region without the rights to), and completes each WQE
//! once at most, in order.
//!
//! Each case drives a fresh NIC with a random sequence of actions: WQEs that are partly well-formed (valid
//! opcodes, keys and addresses near the buffers, mostly right QPN and index) or wholly random, random bytes
//! scribbled over the ring, random or stale doorbells, random dbrec and CQ dbrec values, CQ polls. After every
//! doorbell the test waits until the NIC has acted on it (a hang fails the case).

mod emu_util;

use emu_util::fuzz::*;
use emu_util::*;
use gdaki::nic::emu::Access;
use gdaki_shared::prm::opcode;
use gdaki_shared::prm::wqe::CtrlSeg;
use gdaki_shared::Be32;
use proptest::prelude::*;

const WQE_CNT: u32 = 16;

#[derive(Clone, Debug)]
enum Doorbell {
    /// The ctrl bits of the last posted WQE (a correct doorbell).
    Last,
    /// A doorbell built from an index and ds of choice.
    Ctrl(u16, u8),
    Random(u64),
}

#[derive(Clone, Debug)]
enum Action {
    Post(GenWqe),
    /// Post a well-formed WQE; with `true`, also update the dbrec and ring its doorbell (the usual post).
    PostShaped(Shaped, bool),
    Ring(Doorbell),
    BlueFlame,
    Dbrec(Option<u32>),
    Scribble(u16, Vec<u8>),
    FillRing(Vec<u8>),
    PollCq,
    CqDbrec(u32),
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        8 => (shaped(), prop::bool::weighted(0.7)).prop_map(|(w, ring)| Action::PostShaped(w, ring)),
        2 => gen_wqe().prop_map(Action::Post),
        4 => prop_oneof![
            4 => Just(Doorbell::Last),
            1 => (any::<u16>(), any::<u8>()).prop_map(|(i, d)| Doorbell::Ctrl(i, d)),
            1 => any::<u64>().prop_map(Doorbell::Random),
        ]
        .prop_map(Action::Ring),
        1 => Just(Action::BlueFlame),
        2 => prop::option::weighted(0.8, any::<u32>()).prop_map(Action::Dbrec),
        1 => (any::<u16>(), prop::collection::vec(any::<u8>(), 1..64)).prop_map(|(o, b)| Action::Scribble(o, b)),
        1 => prop::collection::vec(any::<u8>(), WQE_CNT as usize * 64).prop_map(Action::FillRing),
        2 => Just(Action::PollCq),
        1 => any::<u32>().prop_map(Action::CqDbrec),
    ]
}

fn run_case(actions: &[Action]) -> Result<(), TestCaseError> {
    let p = Pair::new(WQE_CNT, 16);
    let world = World::buffers();
    let lmr = world.local.register(&p.nic, &p.pd, Access::LOCAL_WRITE);
    let rmr = world.remote.register(&p.nic, &p.pd, Access::ALL);
    let romr = world.ro.register(&p.nic, &p.pd, Access::REMOTE_READ);
    let world = World { keys: (lmr.lkey(), rmr.rkey(), romr.rkey()), ..world };
    let mut sq = Sq::new(&p.a);
    let mut cq = CqPoll::new(&p.cq_a);
    let mut peer_cq = CqPoll::new(&p.cq_b);
    // The send CQEs read, in order; checked only when the CQ's dbrec was left to the poller (a random consumer
    // index lets the NIC write over CQEs not read yet, as hardware would).
    let mut sent = Vec::new();
    let mut cq_dbrec_kept = true;
    let mut last_at = 0u64;
    let mut db_value = 0u64; // connect cleared the register
    let mut doorbells = 0u64;
    let mut ring = |bits: u64, sq: &Sq| {
        sq.doorbell_bits(bits);
        if bits != db_value {
            db_value = bits;
            doorbells += 1;
            let want = doorbells;
            wait_until("the NIC to see the doorbell", || p.nic.stats().doorbells >= want);
            // Taking the SQ progress lock waits until the NIC has finished with this doorbell.
            let _ = p.a.sq_consumed();
        }
    };
    for a in actions {
        match a {
            Action::Post(w) => {
                let bytes = world.bytes(w, &sq);
                last_at = sq.put_bytes(&bytes);
            }
            Action::PostShaped(w, ring_it) => {
                let bytes = world.shaped_bytes(w, &sq);
                last_at = sq.put_bytes(&bytes);
                if *ring_it {
                    sq.dbrec();
                    ring(sq.ctrl_bits(last_at), &sq);
                }
            }
            Action::Ring(Doorbell::Last) => ring(sq.ctrl_bits(last_at), &sq),
            Action::Ring(Doorbell::Ctrl(idx, ds)) => {
                ring(CtrlSeg::new(*idx, opcode::RDMA_WRITE, 0, sq.qpn(), 0, *ds, 0, Be32::ZERO).doorbell_bits(), &sq)
            }
            Action::Ring(Doorbell::Random(v)) => ring(*v, &sq),
            Action::BlueFlame => {
                sq.blueflame(last_at);
                ring(sq.ctrl_bits(last_at), &sq);
            }
            Action::Dbrec(None) => sq.dbrec(),
            Action::Dbrec(Some(v)) => sq.dbrec_word(1, *v),
            Action::Scribble(off, bytes) => {
                // Whole 8-byte words only (the ring is written with word stores).
                let mut b = bytes.clone();
                b.resize(b.len().div_ceil(16) * 16, 0);
                let saved = sq.pi;
                sq.pi = (*off as u64 % WQE_CNT as u64) + saved / WQE_CNT as u64 * WQE_CNT as u64;
                sq.put_bytes(&b);
                sq.pi = saved;
            }
            Action::FillRing(bytes) => {
                let saved = sq.pi;
                sq.pi = 0;
                sq.put_bytes(bytes);
                sq.pi = saved;
            }
            Action::PollCq => {
                while let Some(c) = cq.poll() {
                    sent.push(c.wqe_counter.get());
                }
                while peer_cq.poll().is_some() {}
            }
            Action::CqDbrec(v) => {
                cq_dbrec_kept = false;
                // SAFETY: word 0 of the CQ dbrec.
                unsafe { std::sync::atomic::AtomicU32::from_ptr(cq.h.dbrec as *mut u32) }
                    .store(Be32::new(*v).to_bits(), std::sync::atomic::Ordering::Release);
            }
        }
    }
    prop_assert!(p.nic.executor_alive(), "executor thread died");
    while let Some(c) = cq.poll() {
        sent.push(c.wqe_counter.get());
    }
    // Fewer than 2^16 WQEBBs are consumed in a case: the counters of WQEs completed in order only ascend.
    prop_assert!(
        !cq_dbrec_kept || sent.windows(2).all(|w| w[0] < w[1]),
        "a WQE completed twice or out of order: wqe_counter {sent:?}"
    );
    for (name, b) in [("local", &world.local), ("remote", &world.remote), ("ro", &world.ro), ("canary", &world.canary)]
    {
        prop_assert!(b.guards_intact(), "guard bytes of {name} written");
    }
    prop_assert!(world.ro.read().iter().all(|&b| b == 0x33), "MR without write rights was written");
    prop_assert!(world.canary.read().iter().all(|&b| b == 0x44), "unregistered memory was written");
    drop((lmr, rmr, romr));
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 192, max_shrink_iters: 200, ..ProptestConfig::default() })]

    #[test]
    fn random_rings_and_doorbells_never_panic_hang_or_stray(actions in prop::collection::vec(action(), 1..24)) {
        run_case(&actions)?;
    }
}

#[test]
fn fully_random_ring_and_random_doorbells() {
    // The plainest form of the property: the whole ring random, then random doorbells, many times over.
    let mut rng = rng();
    use rand::RngExt;
    for _ in 0..50 {
        let mut actions = vec![Action::FillRing(random_bytes(&mut rng, WQE_CNT as usize * 64))];
        for _ in 0..8 {
            actions.push(Action::Ring(Doorbell::Random(rng.random())));
            actions.push(Action::Dbrec(Some(rng.random())));
        }
        run_case(&actions).unwrap();
    }
}
