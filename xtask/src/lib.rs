//! gdaki's chores, as a library and as `cargo xtask` (the `cli` feature). The PTX build itself is
//! [`gdaki_build`]'s, which users' build scripts run too; this crate adds what only the project needs:
//! - the `ptxas` module (feature `cli`) finds NVIDIA's assembler (PATH, the wheel `cargo xtask test` installs
//!   into `target/ptxas-wheel`, or a pip-installed `nvidia-*` wheel), assembles the PTX for the target GPU and
//!   reports registers and spills per kernel;
//! - the `sass` module (feature `cli`) disassembles kernels (cuobjdump, nvdisasm) and counts the instructions
//!   of their fast path (`cargo xtask sass`);
//! - the `prereq` module (feature `cli`) installs what the tests need when it is missing (`cargo xtask test`).
#![deny(missing_docs)]

#[cfg(feature = "cli")]
pub mod prereq;
#[cfg(feature = "cli")]
pub mod ptxas;
#[cfg(feature = "cli")]
pub mod sass;
#[cfg(feature = "cli")]
pub mod workspace;

pub use gdaki_build::{
    anyhow, builder as build, validate, BuiltPtx, PtxBuilder, PtxInfo, ARCH, PTX_ISA, TARGET_TRIPLE,
};

/// The error type of this crate: every failure is one readable chain of causes, printed with `{:#}` as one line.
pub type Result<T, E = anyhow::Error> = std::result::Result<T, E>;

/// The project's own kernels crate (relative to the workspace root), which `cargo xtask build-ptx`, `test` and
/// `sass` build, check with ptxas and disassemble.
pub const KERNELS_CRATE: &str = "testkit/kernels";

/// File name of the project's PTX module in `target/ptx/` (`cargo xtask build-ptx`).
pub const PTX_FILE: &str = "gdaki_testkit_kernels.ptx";
