//! gdaki's own harnesses, outside the library and on its public API, as any user's program: the ping-pong
//! ([`pingpong`]), MSCCL++'s one-to-one PortChannel tests and their benchmark rows ([`porttest`]), the
//! post-rate microbenchmark ([`postrate`]), the emulated NIC's fault catalogue ([`faults`]), the
//! platform floors the benchmarks are set against ([`floors`]) and the perftest-style tables they print
//! ([`perftest`]). Their kernels are the `gdaki-testkit-kernels` crate, built
//! by this crate's build script with `gdaki-build` ([`ptx::PTX`]) and launched with `gdaki::launch`.
#![deny(missing_docs)]

/// Prints the library's `tracing` events to stderr as `RUST_LOG` selects them (e.g. `RUST_LOG=gdaki=warn`: the
/// emulated NIC's warnings about failed WQEs, CQ overruns, dbrec mismatches or long waits on the GPU); nothing
/// when it is unset. Once per process: later calls do nothing.
pub fn init_tracing() {
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .try_init();
    }
}

/// The GPU for one test: a test binary's GPU tests take it in turn, whatever `--test-threads` says. Run at once
/// (libtest's default), several two-rank runs, each with its own emulated NICs, engines and streams, failed on
/// the H200 with bounded-wait timeouts (docs/guide.md, "GPU hazards", many NICs at once).
pub fn gpu_turn() -> std::sync::MutexGuard<'static, ()> {
    static GPU: std::sync::Mutex<()> = std::sync::Mutex::new(());
    // A test that panicked while holding it leaves nothing to repair.
    GPU.lock().unwrap_or_else(|p| p.into_inner())
}

pub mod coll;
pub mod faults;
pub mod floors;
pub mod perftest;
pub mod pingpong;
pub mod porttest;
pub mod postrate;
pub mod ptx;
