//! The executor thread: one per NIC, watching every QP's doorbell register.
//!
//! It sweeps its own list of the NIC's QPs ([`Watched`]), refreshed from the NIC's QP map only when that
//! changed, and after the first whole sweep with a refreshed list it publishes the list's generation
//! (`Fabric::acked_gen`). `Qp::drop` waits for that acknowledgement, so that this thread never holds the last
//! reference to a QP: the queue memory is never freed here (on the `gpu` executor that is `cuMemFreeHost`,
//! which blocks while any kernel runs, so a kernel spinning on this NIC would stall with it).
//!
//! Idle strategy: spin briefly (crossbeam's `Backoff`), then yield for a while, then sleep in short parks.
//! On a 2-core machine device code runs on host threads too, and a NIC that only spun would steal their
//! core; one that slept at once would add scheduler quanta to every round trip. With a real GPU (device code
//! runs there, not on host threads: `GpuCopier::device_code_on_gpu`) the thread spins with one pause per
//! look instead of backing off and yielding, until it starts sleeping: a backed-off spin pauses up to 64
//! times between looks (microseconds on CPUs whose pause is long), and a yield is a system call, both on the
//! path of every doorbell.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_utils::Backoff;

use std::sync::mpsc::Receiver;

use super::access::{DataPath, Waits, SCRATCH_BYTES};
use super::fabric::Fabric;
use super::guard::read;
use super::sq::{self, Engine, Watched};
use super::stats::{add_ns, bump, step};
use super::wire::link::Inflow;
use super::wire::packet::{self, Packet};
use super::wire::{requester, Inbound};
use crate::mem::MemKind;

/// How long the thread keeps yielding after its last work before it starts sleeping.
const YIELD_FOR: Duration = Duration::from_micros(200);
/// One sleep once idle longer than [`YIELD_FOR`]; also the longest a doorbell then waits to be seen.
const SLEEP: Duration = Duration::from_micros(50);

/// Inbound wire messages handled per pass at most, so that doorbells are not starved by a busy link.
const INBOUND_PER_PASS: usize = 256;

/// Starts the executor thread of `fab`; it takes the wire's inbound messages from `inbound`, and gives back
/// their room in `inflow` once each is handled.
pub(crate) fn spawn(
    fab: Arc<Fabric>,
    inbound: Receiver<Inbound>,
    inflow: Arc<Inflow>,
) -> std::io::Result<thread::JoinHandle<()>> {
    thread::Builder::new().name(format!("emu-nic-{:x}", fab.id & 0xffff)).spawn(move || {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(&fab, &inbound, &inflow)));
        // Readers waiting for room stop waiting: nothing will take from the queue any more.
        inflow.stop();
        fab.running.store(false, Ordering::Release);
        if r.is_err() {
            tracing::error!("emulated NIC {}: executor thread panicked; the NIC stopped", fab.id);
        }
    })
}

struct Idle {
    backoff: Backoff,
    since: Option<Instant>,
    /// Look again after one pause instead of backing off and yielding (the NIC has a GPU).
    spin: bool,
}

impl Idle {
    fn reset(&mut self) {
        self.backoff.reset();
        self.since = None;
    }

    fn wait(&mut self) {
        if self.spin {
            let since = *self.since.get_or_insert_with(Instant::now);
            if since.elapsed() < YIELD_FOR {
                std::hint::spin_loop();
            } else {
                thread::park_timeout(SLEEP);
            }
            return;
        }
        if !self.backoff.is_completed() {
            self.backoff.snooze();
            return;
        }
        let since = *self.since.get_or_insert_with(Instant::now);
        if since.elapsed() < YIELD_FOR {
            thread::yield_now();
        } else {
            // park_timeout, not sleep: the NIC's drop unparks the thread to stop it at once.
            thread::park_timeout(SLEEP);
        }
    }
}

/// The executor's list of QPs and the QP-map generation it reflects.
struct List {
    qps: Vec<Watched>,
    gen: u64,
    /// The list was refreshed and its generation is not acknowledged yet.
    unacked: bool,
}

impl List {
    /// Refreshes the list if the NIC's QP map changed since.
    fn sync(&mut self, fab: &Fabric, data: &mut DataPath) {
        let g = fab.qp_gen.load(Ordering::Acquire);
        if g != self.gen {
            refresh(fab, &mut self.qps, data);
            self.gen = g;
            self.unacked = true;
        }
    }

    /// The entry of QP `qpn`, refreshing the list once if it is not there (the QP may be newer than it).
    fn find(&mut self, fab: &Fabric, data: &mut DataPath, qpn: u32) -> Option<&mut Watched> {
        let mut i = self.qps.binary_search_by_key(&qpn, |w| w.qp.qpn);
        if i.is_err() {
            self.sync(fab, data);
            i = self.qps.binary_search_by_key(&qpn, |w| w.qp.qpn);
        }
        self.qps.get_mut(i.ok()?)
    }
}

fn run(fab: &Fabric, inbound: &Receiver<Inbound>, inflow: &Inflow) {
    // A failed allocation leaves atomics answered over the wire on GPU memory failing (local QP error).
    let scratch =
        fab.gpu.as_ref().and_then(|_| fab.alloc_queue(SCRATCH_BYTES, MemKind::Gpu).ok()).and_then(|m| m.into_view());
    let mut eng = Engine::new(DataPath::new(fab.gpu.clone(), scratch));
    let mut list = List { qps: Vec::new(), gen: u64::MAX, unacked: false };
    let timeout = fab.retry_timeout();
    let spin = fab.gpu.as_ref().is_some_and(|g| g.device_code_on_gpu());
    let mut idle = Idle { backoff: Backoff::new(), since: None, spin };
    while !fab.stop.load(Ordering::Acquire) {
        // Sequentially consistent with `hold_executor`'s store of `held` and load of `holding`: a holder that
        // sees `holding` set saw it before this thread cleared it, so this thread's load of `held` after the
        // clearing sees the hold and runs no pass.
        if fab.held.load(Ordering::SeqCst) {
            fab.holding.store(true, Ordering::SeqCst);
            thread::park_timeout(SLEEP);
            continue;
        }
        fab.holding.store(false, Ordering::SeqCst);
        if fab.held.load(Ordering::SeqCst) {
            continue;
        }
        bump(&fab.stats.executor_passes);
        let t0 = Instant::now();
        step(&fab.stats, 1);
        list.sync(fab, &mut eng.data);
        let mut worked = false;
        let mut handled = 0;
        step(&fab.stats, 2);
        for m in inbound.try_iter().take(INBOUND_PER_PASS) {
            handled += m.cost();
            deliver(fab, &mut list, &mut eng, m);
            worked = true;
        }
        // Once per batch (one write to the line the readers share, not one per frame), after the frames'
        // bytes are dropped: the bound counts what is really held.
        if handled > 0 {
            inflow.release(handled);
        }
        // QPs take turns by way of GPU operation only when two or more have WQEs waiting.
        eng.interleave = list.qps.iter().filter(|w| w.has_work()).nth(1).is_some();
        for w in &mut list.qps {
            step(&fab.stats, 3);
            worked |= sq::poll(fab, w, &mut eng);
            if let Some((qp, ws)) = w.wire() {
                step(&fab.stats, 4);
                worked |= requester::tick(fab, qp, ws, &mut eng.data, timeout);
            }
        }
        // What this pass enqueued on the GPU starts now, as one batch.
        step(&fab.stats, 5);
        eng.data.submit();
        step(&fab.stats, 0);
        if worked {
            add_ns(&fab.stats.busy_ns, t0.elapsed());
        }
        if list.unacked {
            // After a whole sweep: no poll that could have seen a QP removed before `gen` is still running.
            fab.acked_gen.store(list.gen, Ordering::Release);
            list.unacked = false;
        }
        if worked {
            publish_waits(fab, eng.data.waits());
            idle.reset();
        } else {
            idle.wait();
        }
    }
    // The copier stops reading the rings before their memory can go, and enqueued GPU copies finish before
    // the NIC (and the memory its MRs name) goes away.
    for w in &mut list.qps {
        w.release(&eng.data);
    }
    let _ = eng.data.fence();
}

/// Makes the data path's wait tallies visible in the NIC's [`Stats`](super::Stats) (the executor is their
/// only writer, so plain stores of the running totals).
fn publish_waits(fab: &Fabric, w: Waits) {
    fab.stats.host_syncs.store(w.syncs, Ordering::Relaxed);
    fab.stats.host_sync_ns.store(w.sync_ns, Ordering::Relaxed);
    fab.stats.ring_fetch_ns.store(w.fetch_ns, Ordering::Relaxed);
}

/// Hands one wire message to the requester or responder side of its QP.
fn deliver(fab: &Fabric, list: &mut List, eng: &mut Engine, m: Inbound) {
    let qpn = match &m {
        Inbound::Frame { qpn, .. } | Inbound::Down { qpn, .. } | Inbound::Mapped { qpn, .. } => *qpn,
    };
    // A message for a destroyed QP (or one destroyed since) has nobody to go to.
    let Some((qp, ws)) = list.find(fab, &mut eng.data, qpn).and_then(|w| w.wire()) else { return };
    let dp = &mut eng.data;
    match m {
        Inbound::Frame { body, .. } => match packet::decode(&body) {
            Ok(Packet::IpcOffer { handle }) => requester::on_offer(fab, qp, ws, dp, handle),
            Ok(Packet::IpcAnswer { handle, mapped }) => requester::on_ipc_answer(fab, qp, ws, dp, (handle, mapped)),
            Ok(p) if p.is_request() => requester::on_request(fab, qp, ws, dp, p),
            Ok(p) => requester::on_response(fab, qp, ws, dp, p),
            Err(e) => {
                ws.link.close();
                requester::link_down(
                    fab,
                    qp,
                    ws,
                    dp,
                    format!("peer QP {:#x} sent a malformed frame: {e}", ws.link.remote.qpn),
                );
            }
        },
        Inbound::Down { reason, .. } => requester::link_down(fab, qp, ws, dp, reason),
        Inbound::Mapped { handle, mapped, .. } => requester::answer_offer(fab, ws, &handle, mapped),
    }
}

/// Rebuilds `qps` from the NIC's QP map, keeping the executor-side state of QPs that stay and forgetting
/// every cached peer (a peer may be among the removed QPs). The entries of removed QPs are dropped here,
/// while their `Qp::drop` still holds a reference and waits for this refresh to be acknowledged; a removed
/// QP's connection ends here too, once what it owes its peer is sent ([`requester::farewell`]).
fn refresh(fab: &Fabric, qps: &mut Vec<Watched>, data: &mut DataPath) {
    let live: Vec<_> = read(&fab.qps).values().cloned().collect();
    let mut old: HashMap<u32, Watched> = qps.drain(..).map(|w| (w.qp.qpn, w)).collect();
    for qp in live {
        let w = match old.remove(&qp.qpn) {
            Some(mut w) => {
                w.forget_peer();
                w
            }
            None => Watched::new(qp, data),
        };
        qps.push(w);
    }
    // Their rings' mirrors stop before `Qp::drop` (waiting for this refresh) lets the memory go.
    for w in old.values_mut() {
        w.release(data);
    }
    // A stable order (by QPN) rather than the map's: sweeps visit QPs in creation order.
    qps.sort_unstable_by_key(|w| w.qp.qpn);
    let timeout = fab.retry_timeout();
    for ws in old.into_values().filter_map(|w| w.wire) {
        requester::farewell(fab, ws, data, timeout);
    }
}
