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
//! core; one that slept at once would add scheduler quanta to every round trip.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_utils::Backoff;

use super::access::DataPath;
use super::fabric::{read, Fabric};
use super::sq::{self, Engine, Watched};

/// How long the thread keeps yielding after its last work before it starts sleeping.
const YIELD_FOR: Duration = Duration::from_micros(200);
/// One sleep once idle longer than [`YIELD_FOR`]; also the longest a doorbell then waits to be seen.
const SLEEP: Duration = Duration::from_micros(50);

/// Starts the executor thread of `fab`.
pub(crate) fn spawn(fab: Arc<Fabric>) -> std::io::Result<thread::JoinHandle<()>> {
    thread::Builder::new().name(format!("emu-nic-{}", fab.id)).spawn(move || {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(&fab)));
        fab.running.store(false, Ordering::Release);
        if r.is_err() {
            tracing::error!("emulated NIC {}: executor thread panicked; the NIC stopped", fab.id);
        }
    })
}

struct Idle {
    backoff: Backoff,
    since: Option<Instant>,
}

impl Idle {
    fn reset(&mut self) {
        self.backoff.reset();
        self.since = None;
    }

    fn wait(&mut self) {
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

fn run(fab: &Fabric) {
    let mut eng = Engine::new(DataPath::new(fab.gpu.clone()));
    let mut qps: Vec<Watched> = Vec::new();
    let mut gen = u64::MAX;
    // The list was refreshed and its generation is not acknowledged yet.
    let mut unacked = false;
    let mut idle = Idle { backoff: Backoff::new(), since: None };
    while !fab.stop.load(Ordering::Acquire) {
        let g = fab.qp_gen.load(Ordering::Acquire);
        if g != gen {
            refresh(fab, &mut qps);
            gen = g;
            unacked = true;
        }
        let mut worked = false;
        for w in &mut qps {
            worked |= sq::poll(fab, w, &mut eng);
        }
        if unacked {
            // After a whole sweep: no poll that could have seen a QP removed before `g` is still running.
            fab.acked_gen.store(gen, Ordering::Release);
            unacked = false;
        }
        if worked {
            idle.reset();
        } else {
            idle.wait();
        }
    }
    // Let enqueued GPU copies finish before the NIC (and the memory its MRs name) goes away.
    let _ = eng.data.fence();
}

/// Rebuilds `qps` from the NIC's QP map, keeping the executor-side state of QPs that stay and forgetting
/// every cached peer (a peer may be among the removed QPs). The entries of removed QPs are dropped here,
/// while their `Qp::drop` still holds a reference and waits for this refresh to be acknowledged.
fn refresh(fab: &Fabric, qps: &mut Vec<Watched>) {
    let live: Vec<_> = read(&fab.qps).values().cloned().collect();
    let mut old: HashMap<u32, Watched> = qps.drain(..).map(|w| (w.qp.qpn, w)).collect();
    for qp in live {
        let w = match old.remove(&qp.qpn) {
            Some(mut w) => {
                w.forget_peer();
                w
            }
            None => Watched::new(qp),
        };
        qps.push(w);
    }
    // A stable order (by QPN) rather than the map's: sweeps visit QPs in creation order.
    qps.sort_unstable_by_key(|w| w.qp.qpn);
}
