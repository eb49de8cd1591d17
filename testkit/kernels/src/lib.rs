//! gdaki's own device code and kernels, built the way a user builds theirs: a `no_std` crate over
//! `gdaki-device`, its kernels `#[kernel]` functions ([`entries`]), compiled to PTX by `gdaki-build` from the
//! `gdaki-testkit` crate's build script and, for the `cpu` executor, linked into the host as an ordinary
//! crate.
//!
//! [`pingpong`] (the example's rank loop), [`porttest`] (MSCCL++'s one-to-one PortChannel tests),
//! [`postrate`] (the post-rate microbenchmark), [`samples`] (one WQE of each builder, for the GPU test that
//! compares the PTX's bytes with the host's).
#![no_std]
#![cfg_attr(target_arch = "nvptx64", feature(abi_ptx))]
#![deny(missing_docs)]

pub mod entries;
pub mod pingpong;
pub mod porttest;
pub mod postrate;
pub mod samples;
