//! gdaki device code: what a GPU kernel (or a host thread, for the `cpu` executor) runs to drive an mlx5 NIC
//! without the CPU: build WQEs, ring the doorbell or BlueFlame, poll CQEs, wait on semaphores.
//!
//! `no_std`; builds for `nvptx64-nvidia-cuda` (PTX, see `cargo xtask build-ptx`) and for the host (the `std`
//! feature adds a clock and yielding spin loops).
#![no_std]
#![cfg_attr(target_arch = "nvptx64", feature(abi_ptx, asm_experimental_arch, stdarch_nvptx))]
#![deny(missing_docs)]

#[cfg(feature = "std")]
extern crate std;

#[cfg(target_arch = "nvptx64")]
pub mod kernels;

#[cfg(target_arch = "nvptx64")]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    // SAFETY: `trap` aborts the kernel; device code never panics by design, this is the last resort.
    unsafe { core::arch::nvptx::trap() }
}
