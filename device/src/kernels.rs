//! PTX entry points (`.entry`), one per kernel the host launches.

use crate::pingpong::{self, PingPongArgs, Team};
use core::arch::nvptx;

/// The threads of one CTA.
struct Cta;

impl Team for Cta {
    fn tid(&self) -> usize {
        // SAFETY: reading a special register.
        unsafe { nvptx::_thread_idx_x() as usize }
    }
    fn size(&self) -> usize {
        // SAFETY: reading a special register.
        unsafe { nvptx::_block_dim_x() as usize }
    }
    fn sync_or(&self, flag: bool) -> bool {
        let r: u32;
        // SAFETY: `bar.red.or.pred` is a CTA barrier every thread of the CTA reaches (the rank loop calls
        // `sync_or` unconditionally on every path), with a predicate reduction.
        unsafe {
            core::arch::asm!(
                "{{ .reg .pred p, q; setp.ne.u32 p, {f}, 0; bar.red.or.pred q, 0, p; selp.u32 {r}, 1, 0, q; }}",
                f = in(reg32) flag as u32,
                r = out(reg32) r,
                options(nostack)
            )
        };
        r != 0
    }
}

/// Ping-pong: CTA `b` runs rank `b` with `args[b]` (launch 2 CTAs, so that both ranks are resident at once).
///
/// # Safety
/// `args` must point to two [`PingPongArgs`] built by the host (see [`pingpong::run`]).
#[no_mangle]
pub unsafe extern "ptx-kernel" fn gdaki_pingpong(args: *const PingPongArgs) {
    // SAFETY: the host passes one argument block per CTA; `run`'s contract is the host's.
    unsafe {
        let a = &*args.add(nvptx::_block_idx_x() as usize);
        pingpong::run(&Cta, a)
    }
}

/// Port-channel test `op` with sharing `M`: CTA `b` runs channel `b % nchannels` of rank `b / nchannels`,
/// with `args[b / nchannels]` (launch `ranks × nchannels` CTAs, so that every team is resident at once).
///
/// # Safety
/// `args` must point to one [`crate::porttest::PortTestArgs`] per rank in the launch, built by the host.
unsafe fn port<M: crate::channel::Sharing>(args: *const crate::porttest::PortTestArgs) {
    // SAFETY: the host passes one argument block per rank; `run`'s contract is the host's.
    unsafe {
        let b = nvptx::_block_idx_x() as u32;
        let n = (*args).nchannels.max(1);
        crate::porttest::run::<M>(&Cta, &*args.add((b / n) as usize), b % n)
    }
}

/// [`crate::porttest::run`] in Exclusive sharing (thread 0 of each CTA owns its channel's QP).
///
/// # Safety
/// As `port`.
#[no_mangle]
pub unsafe extern "ptx-kernel" fn gdaki_port_exclusive(args: *const crate::porttest::PortTestArgs) {
    // SAFETY: the caller's contract.
    unsafe { port::<crate::channel::Exclusive>(args) }
}

/// [`crate::porttest::run`] in Block sharing (the threads of a CTA share its channel's QP).
///
/// # Safety
/// As `port`.
#[no_mangle]
pub unsafe extern "ptx-kernel" fn gdaki_port_block(args: *const crate::porttest::PortTestArgs) {
    // SAFETY: the caller's contract.
    unsafe { port::<crate::scope::Block>(args) }
}

/// [`crate::porttest::run`] in Device sharing (GPU-scope atomics on the QPs).
///
/// # Safety
/// As `port`.
#[no_mangle]
pub unsafe extern "ptx-kernel" fn gdaki_port_device(args: *const crate::porttest::PortTestArgs) {
    // SAFETY: the caller's contract.
    unsafe { port::<crate::scope::Device>(args) }
}

/// One Exclusive `put` on channel `*h` (thread 0): a kernel of its own so that its SASS is the put path alone
/// (`cuobjdump -sass`; docs/results count its instructions). Errors are dropped: this is for reading code.
///
/// # Safety
/// `h` must point to a live channel's handle whose QP no other thread uses.
#[no_mangle]
pub unsafe extern "ptx-kernel" fn gdaki_sass_put(h: *const gdaki_shared::channel::PortChannelHandle, bytes: u64) {
    // SAFETY: the caller's contract.
    unsafe {
        let h = &*h;
        let mut c =
            crate::channel::PortChannel::new(h, <crate::channel::Exclusive as crate::channel::Sharing>::poster(h));
        let _ = c.put(0, 0, bytes);
    }
}

/// One Exclusive `put_with_signal` on channel `*h`, as [`gdaki_sass_put`].
///
/// # Safety
/// As [`gdaki_sass_put`].
#[no_mangle]
pub unsafe extern "ptx-kernel" fn gdaki_sass_put_with_signal(
    h: *const gdaki_shared::channel::PortChannelHandle,
    bytes: u64,
) {
    // SAFETY: the caller's contract.
    unsafe {
        let h = &*h;
        let mut c =
            crate::channel::PortChannel::new(h, <crate::channel::Exclusive as crate::channel::Sharing>::poster(h));
        let _ = c.put_with_signal(0, 0, bytes);
    }
}

/// Builds [`crate::samples::SAMPLES`] WQEs from `*p` into `out` (one thread; see [`crate::samples::build`]).
///
/// # Safety
/// `p` must point to a [`crate::samples::SampleParams`] and `out` to `SAMPLES × MAX_DS` writable segments.
#[no_mangle]
pub unsafe extern "ptx-kernel" fn gdaki_wqe_samples(
    p: *const crate::samples::SampleParams,
    out: *mut [[gdaki_shared::prm::wqe::Seg; crate::wqe::MAX_DS]; crate::samples::SAMPLES],
) {
    // SAFETY: the caller passes valid pointers.
    unsafe { crate::samples::build(&*p, &mut *out) }
}

/// Writes 1 to `*flag`: proves a module loads and a kernel runs.
///
/// # Safety
/// `flag` must be a valid device pointer to a `u32`.
#[no_mangle]
pub unsafe extern "ptx-kernel" fn gdaki_smoke(flag: *mut u32) {
    // SAFETY: the caller passes a valid pointer.
    unsafe { core::ptr::write_volatile(flag, 1) }
}
