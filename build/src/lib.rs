//! `gdaki-build`: turns a `no_std` device crate (one that depends on `gdaki-device` and writes its kernels with
//! `#[gdaki_device::kernel]`) into one self-contained, validated PTX module, from a build script. The
//! counterpart of Rust-CUDA's `cuda_builder`, over rustc's own `nvptx64-nvidia-cuda` target.
//!
//! ```no_run
//! // build.rs of the host crate; the device crate is in ../kernels.
//! fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     gdaki_build::PtxBuilder::new("../kernels").build()?;
//!     Ok(())
//! }
//! ```
//! and in the host crate: `const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/kernels.ptx"));` (the
//! file is named after the device crate's library).
//!
//! What [`PtxBuilder::build`] does:
//! - [`toolchain::ensure_components`] makes sure the active toolchain has `rust-src`, `llvm-tools` and
//!   `llvm-bitcode-linker`, running `rustup component add` if not (rustup does not add the components of
//!   `rust-toolchain.toml` to a toolchain that is already installed), and says so in one line;
//! - a nested `cargo rustc` builds the crate as a `cdylib` for `nvptx64-nvidia-cuda` with `-Zbuild-std=core`
//!   (under `RUSTC_BOOTSTRAP=1`: rustup ships no prebuilt `core` for that target), fat LTO, one codegen unit
//!   and `panic = "abort"`, `-Ctarget-cpu=sm_90 -Ctarget-feature=+ptx86` ([`PtxBuilder::arch`],
//!   [`PtxBuilder::ptx_isa`]), in a target directory of its own and an environment cleaned of the outer build's
//!   flags ([`builder::clean_cargo_env`]); rustc's `llvm-bitcode-linker` links every crate's bitcode into one
//!   `.ptx`;
//! - [`validate::validate`] checks it: the expected `.target`, a recent enough `.version`, at least one
//!   `.entry`, and no `.extern` (the CUDA driver links nothing in);
//! - in a build script, it writes `OUT_DIR/<lib>.ptx` and prints `cargo:rerun-if-changed` for the device crate
//!   and each path crate it uses (their manifests, `src` folders and every other source file the build read, as
//!   cargo's dep-info lists them), so the PTX is rebuilt only when one of them changed.
//!
//! The device crate needs `#![no_std]` and, for the kernels' `extern "ptx-kernel"` entries,
//! `#![cfg_attr(target_arch = "nvptx64", feature(abi_ptx))]`; the toolchain must be one that has the nvptx
//! target's components (the workspace pins Rust 1.95.0).
#![deny(missing_docs)]

pub mod builder;
pub mod toolchain;
pub mod validate;

/// Re-exported so that build scripts using this crate need no `anyhow` dependency of their own.
pub use anyhow;
pub use builder::{BuiltPtx, PtxBuilder};
pub use validate::{validate, PtxInfo, ValidationError, Violation};

/// The error type of this crate: every failure is one readable chain of causes, printed with `{:#}` as one line.
pub type Result<T, E = anyhow::Error> = std::result::Result<T, E>;

/// Rust target triple of the PTX build.
pub const TARGET_TRIPLE: &str = "nvptx64-nvidia-cuda";

/// GPU architecture the PTX is generated for by default (H100/H200).
pub const ARCH: &str = "sm_90";

/// Oldest PTX ISA version the device code is emitted as by default: 8.6, the first with `fence.release` (a
/// release fence without the L1 invalidate of `fence.acq_rel`), which every doorbell post uses; `st.mmio` (the
/// doorbell store) needs 8.2. A driver of CUDA 12.8 (r570) or newer loads it.
pub const PTX_ISA: (u32, u32) = (8, 6);
