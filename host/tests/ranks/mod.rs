//! Two ranks in one test process: each on a thread of its own, with its own bootstrap endpoint (rank 0 listening
//! on a free loopback port, a fresh secret) and the communicator `open` makes from it.

use std::net::TcpListener;
use std::sync::Barrier;
use std::thread;
use std::time::Duration;

use gdaki::bootstrap::{Bootstrap, Launch, Secret};
use gdaki::channel::Communicator;

/// Bound of the bootstrap's setup.
const SETUP: Duration = Duration::from_secs(20);

/// Runs `f(rank, communicator, barrier)` on two ranks at once; returns what each returned, by rank. The barrier
/// synchronizes the two threads without the bootstrap.
pub fn two_ranks<T: Send>(
    open: impl Fn(Bootstrap) -> Communicator + Sync,
    f: impl Fn(u32, Communicator, &Barrier) -> T + Sync,
) -> Vec<T> {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let root = listener.local_addr().unwrap().to_string();
    let secret = Secret::random().unwrap();
    let mut listener = Some(listener);
    let barrier = Barrier::new(2);
    let (open, f, barrier) = (&open, &f, &barrier);
    thread::scope(|s| {
        let hs: Vec<_> = (0..2u32)
            .map(|rank| {
                let launch =
                    Launch { rank, world_size: 2, local_rank: rank, root: root.clone(), secret, source: "test" };
                let l = if rank == 0 { listener.take() } else { None };
                s.spawn(move || {
                    let boot = match l {
                        Some(l) => Bootstrap::root_on(l, &launch, SETUP),
                        None => Bootstrap::connect(&launch, SETUP),
                    }
                    .unwrap_or_else(|e| panic!("rank {rank}: {e}"));
                    f(rank, open(boot), barrier)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("rank thread")).collect()
    })
}
