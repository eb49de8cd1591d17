//! gdaki's own harnesses, outside the library and on its public API, as any user's program: the ping-pong
//! ([`pingpong`]), MSCCL++'s one-to-one PortChannel tests and their benchmark rows ([`porttest`]), the
//! post-rate microbenchmark ([`postrate`]), the emulated NIC's fault catalogue ([`faults`]), the
//! platform floors the benchmarks are set against ([`floors`]) and the perftest-style tables they print
//! ([`perftest`]). Their kernels are the `gdaki-testkit-kernels` crate, built
//! by this crate's build script with `gdaki-build` ([`ptx::PTX`]) and launched with `gdaki::launch`.
#![deny(missing_docs)]

pub mod coll;
pub mod faults;
pub mod floors;
pub mod perftest;
pub mod pingpong;
pub mod porttest;
pub mod postrate;
pub mod ptx;
