//! gdaki device code: what a GPU kernel (or a host thread, for the `cpu` executor) runs to drive an mlx5 NIC
//! without the CPU: build WQEs, ring the doorbell or BlueFlame, poll CQEs, wait on semaphores.
//!
//! `no_std`; builds for `nvptx64-nvidia-cuda` (PTX, see `cargo xtask build-ptx`) and for the host, where it
//! links `std` for a clock and for yielding in spin loops.
//!
//! Layers, lowest first (each uses only those above it in this list): [`sync`] (fences, ordered loads and
//! stores, MMIO) → [`wqe`] (builders) → [`sq`] (ring stores) → [`db`] (dbrec, doorbell, BlueFlame) →
//! [`cq`] (polling) → [`wait`] (bounded waits) → [`qp`] (Exclusive QP: post, ring, retire, flush) →
//! [`onesided`] (put / signal / put_with_signal); [`warp`] (lanes, shuffles, votes) → [`warp_qp`] (a QP owned
//! by one warp: one WQE per lane, one doorbell). Shared QPs: [`scope`] (Block / Device atomics) →
//! [`shared_qp`] (posting from many threads) → [`channel`] (MSCCL++'s PortChannel device API over an Exclusive
//! or a shared QP) → [`packet`] (MSCCL++'s LL packets on a channel); [`coll`] (collectives on the channels
//! to every peer: broadcast, all-to-all with variable sizes, reduce and all-reduce summed by the NIC, and the
//! ring all-reduce summed by the GPU). Kernels: [`thread`] (the calling thread, its indices and the CTA
//! barrier), [`grid`] (a barrier over every CTA of a co-resident launch) and [`launch`] (parameter types,
//! error reports, the `cpu` executor's launcher) with the [`kernel`] attribute, which makes a function of a
//! user's device crate a kernel of both executors. The crate has no kernels of its own: a user's crate (built with `gdaki-build`) has them.
#![no_std]
#![cfg_attr(target_arch = "nvptx64", feature(abi_ptx, asm_experimental_arch, stdarch_nvptx))]
#![deny(missing_docs)]

#[cfg(not(target_arch = "nvptx64"))]
extern crate std;

/// Resets the `loom` model's memory (build with `--cfg loom`): call at the start and end of each
/// `loom::model` iteration of a test that runs device code under the model checker.
#[cfg(loom)]
pub fn loom_reset() {
    twin::reset();
}

/// Makes `[addr, addr + len)` memory the `loom` model tracks (build with `--cfg loom`): every word device
/// code's twins touch must be registered, by the model's main thread before it spawns the others.
///
/// # Safety
/// The range must be readable for the iteration, and `addr` and `len` multiples of 8.
#[cfg(loom)]
pub unsafe fn loom_register(addr: *const u8, len: usize) {
    // SAFETY: the caller's contract.
    unsafe { twin::register(addr, len) }
}

pub mod channel;
pub mod coll;
pub mod cq;
pub mod db;
pub mod error;
pub mod fifo;
pub mod grid;
pub mod launch;
pub mod onesided;
pub mod packet;
pub mod qp;
pub mod scope;
pub mod shared_qp;
pub mod sq;
pub mod sync;
pub mod thread;
#[cfg(not(target_arch = "nvptx64"))]
mod twin;
pub mod wait;
pub mod warp;
pub mod warp_qp;
pub mod wqe;

pub use error::{AppError, Error, Result};
pub use gdaki_macros::kernel;
/// The handles the host builds for device code (`QpHandle`, `MrHandle`, `RemoteMr`, `ErrorReport`...), so that
/// a kernel crate that depends on this one alone can name them.
pub use gdaki_shared::handle;
pub use launch::{DevPtr, DeviceRepr};
pub use thread::{Dim3, Thread};

#[cfg(target_arch = "nvptx64")]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    // SAFETY: `trap` aborts the kernel; device code never panics by design, this is the last resort.
    unsafe { core::arch::nvptx::trap() }
}
