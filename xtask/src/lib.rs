//! gdaki's chores, as a library (for `host/build.rs`) and as `cargo xtask` (the `cli` feature).
//!
//! The main chore is turning `gdaki-device` into one self-contained PTX module:
//! - [`build::PtxBuild`] runs a nested `cargo rustc` for `nvptx64-nvidia-cuda` with `-Zbuild-std=core` (under
//!   `RUSTC_BOOTSTRAP=1`, because rustup ships no prebuilt `core` for that target) and the `ptx` profile (fat
//!   LTO, one codegen unit, `panic = "abort"`). The crate is built as a `cdylib`, so rustc's
//!   `llvm-bitcode-linker` links the bitcode of `gdaki-device`, `gdaki-shared` and `core` into one module and
//!   emits one `.ptx` file with nothing left to resolve.
//! - before that, [`toolchain::ensure_components`] makes sure the active toolchain has `rust-src`, `llvm-tools`
//!   and `llvm-bitcode-linker`, running `rustup component add` if not (rustup does not add the components of
//!   `rust-toolchain.toml` to a toolchain that is already installed).
//! - [`validate::validate`] checks that file: the expected `.target`, a recent enough `.version`, at least one
//!   `.entry`, and no `.extern` (the CUDA driver cannot link anything in for us).
//! - the `ptxas` module (feature `cli`) finds NVIDIA's assembler (PATH, the wheel `cargo xtask test` installs
//!   into `target/ptxas-wheel`, or a pip-installed `nvidia-*` wheel),
//!   assembles the PTX for the target GPU and reports registers and spills per kernel.
//! - the `sass` module (feature `cli`) disassembles kernels (cuobjdump, nvdisasm) and counts the instructions
//!   of their fast path (`cargo xtask sass`).
//!
//! The nested cargo gets a clean environment ([`build::clean_cargo_env`]) and its own target directory, so that
//! it neither inherits the outer build's flags nor waits on the outer build's lock.
#![deny(missing_docs)]

pub mod build;
#[cfg(feature = "cli")]
pub mod prereq;
#[cfg(feature = "cli")]
pub mod ptxas;
#[cfg(feature = "cli")]
pub mod sass;
pub mod toolchain;
pub mod validate;
#[cfg(feature = "cli")]
pub mod workspace;

/// Re-exported so that build scripts using this crate need no `anyhow` dependency of their own.
pub use anyhow;
pub use build::{BuiltPtx, PtxBuild};
pub use validate::{validate, PtxInfo, ValidationError, Violation};

/// The error type of this crate: every failure is one readable chain of causes, printed with `{:#}` as one line.
pub type Result<T, E = anyhow::Error> = std::result::Result<T, E>;

/// Cargo package of the device code.
pub const DEVICE_PACKAGE: &str = "gdaki-device";

/// Rust target triple of the PTX build.
pub const TARGET_TRIPLE: &str = "nvptx64-nvidia-cuda";

/// GPU architecture the PTX is generated and assembled for (H100/H200).
pub const ARCH: &str = "sm_90";

/// Oldest PTX ISA version the device code may be emitted as: 8.2 is the first with `st.mmio`, which the
/// doorbell write uses.
pub const PTX_ISA: (u32, u32) = (8, 2);

/// Cargo profile of the PTX build, defined in the workspace's `Cargo.toml`.
pub const PROFILE: &str = "ptx";

/// File name of the PTX module, in `target/ptx/` (`cargo xtask build-ptx`) and in the host crate's `OUT_DIR`.
pub const PTX_FILE: &str = "gdaki_device.ptx";
