//! The executor thread: one per NIC, watching every QP's doorbell register.
//!
//! Idle strategy: spin briefly (crossbeam's `Backoff`), then yield for a while, then sleep in short parks.
//! On a 2-core machine device code runs on host threads too, and a NIC that only spun would steal their
//! core; one that slept at once would add scheduler quanta to every round trip.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_utils::Backoff;

use super::access::DataPath;
use super::fabric::{read, Fabric};
use super::qp::QpInner;
use super::sq::{self, Engine};

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
    let mut qps: Vec<Arc<QpInner>> = Vec::new();
    let mut gen = u64::MAX;
    let mut idle = Idle { backoff: Backoff::new(), since: None };
    while !fab.stop.load(Ordering::Acquire) {
        let g = fab.qp_gen.load(Ordering::Acquire);
        if g != gen {
            qps = read(&fab.qps).values().cloned().collect();
            gen = g;
        }
        let mut worked = false;
        for qp in &qps {
            worked |= sq::poll(fab, qp, &mut eng);
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
