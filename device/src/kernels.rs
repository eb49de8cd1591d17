//! PTX entry points (`.entry`), one per kernel the host launches.

use crate::pingpong::{self, PingPongArgs, Team};
use core::arch::nvptx;

/// The threads of one CTA. Each thread holds its own `Cta` (the round counter of [`Team::sync_or`]).
struct Cta {
    round: core::cell::Cell<u32>,
}

impl Cta {
    /// Every thread of the CTA calls this first: the flags start cleared.
    fn new() -> Self {
        // SAFETY: the shared flag words (`team_flags`); the barrier orders the clearing before any use.
        unsafe {
            if nvptx::_thread_idx_x() == 0 {
                for i in 0..3 {
                    team_flags().add(i).write_volatile(0);
                }
            }
        }
        crate::sync::cta_barrier();
        Self { round: core::cell::Cell::new(0) }
    }
}

/// Generic address of the three shared flag words.
fn team_flags() -> *mut u32 {
    let flags: *mut u32;
    // SAFETY: `cvta` turns the shared array's address into a generic one; no memory is touched.
    unsafe {
        core::arch::asm!("cvta.shared.u64 {p}, gdaki_team_flags;", p = out(reg64) flags, options(nostack, nomem))
    };
    flags
}

/// The barrier of [`Cta::sync_or`]: the non-aligned [`crate::sync::cta_barrier`], since the threads of a warp
/// arrive diverged (the leader from posting, the others from waiting for it). In a function of its own (never
/// inlined), so that there is one barrier instruction for every caller.
#[inline(never)]
fn cta_sync_or(tid: u32, r: u32, flag: bool) -> bool {
    let flags = team_flags();
    // SAFETY: three words of this CTA's shared memory, used only here; the barrier orders the accesses of the
    // CTA's threads (it is a memory barrier among them).
    unsafe {
        if tid == 0 {
            flags.add(((r + 1) % 3) as usize).write_volatile(0);
        }
        if flag {
            flags.add((r % 3) as usize).write_volatile(1);
        }
    }
    crate::sync::cta_barrier();
    // SAFETY: as above.
    unsafe { flags.add((r % 3) as usize).read_volatile() != 0 }
}

// Three flag words in shared memory for `Cta::sync_or`, one per round modulo 3.
core::arch::global_asm!(".shared .align 4 .b32 gdaki_team_flags[3];");

impl Team for Cta {
    fn tid(&self) -> usize {
        // SAFETY: reading a special register.
        unsafe { nvptx::_thread_idx_x() as usize }
    }
    fn size(&self) -> usize {
        // SAFETY: reading a special register.
        unsafe { nvptx::_block_dim_x() as usize }
    }
    /// An OR over the CTA with one `barrier.sync 0` (`__syncthreads`), in [`cta_sync_or`].
    ///
    /// Round `r` uses flag `r % 3`: thread 0 clears flag `(r + 1) % 3` before the barrier (everyone read it in
    /// round `r - 2`, before reaching round `r - 1`'s barrier, which thread 0 has passed), and nobody sets it
    /// before passing this round's barrier.
    fn sync_or(&self, flag: bool) -> bool {
        let r = self.round.get();
        self.round.set(r.wrapping_add(1));
        // SAFETY: reading a special register.
        cta_sync_or(unsafe { nvptx::_thread_idx_x() }, r, flag)
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
        pingpong::run(&Cta::new(), a)
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
        let team = Cta::new();
        let b = nvptx::_block_idx_x() as u32;
        let n = (*args).nchannels.max(1);
        crate::porttest::run::<M>(&team, &*args.add((b / n) as usize), b % n)
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

/// The post-rate microbenchmark ([`crate::postrate::run`]): CTA `b` is team `b`.
///
/// # Safety
/// `args` must point to a [`crate::postrate::PostRateArgs`] built by the host.
#[no_mangle]
pub unsafe extern "ptx-kernel" fn gdaki_post_rate(args: *const crate::postrate::PostRateArgs) {
    // SAFETY: the host's arguments (`run`'s contract).
    unsafe { crate::postrate::run(&Cta::new(), &*args, nvptx::_block_idx_x() as u32) }
}

/// An Exclusive channel on `*h` for thread 0.
///
/// # Safety
/// `h` must point to a live channel's handle whose QP no other thread uses; launched with one thread.
unsafe fn exclusive(
    h: *const gdaki_shared::channel::PortChannelHandle,
) -> crate::channel::PortChannel<'static, crate::channel::Exclusive> {
    // SAFETY: the caller's contract.
    unsafe { crate::channel::PortChannel::new(&*h) }
}

/// One Exclusive `put` on channel `*h` (one thread): a kernel of its own so that its SASS is the put path
/// alone (`cuobjdump -sass`; docs/results count its instructions). Errors are dropped: this is for reading
/// code.
///
/// # Safety
/// As `exclusive`.
#[no_mangle]
pub unsafe extern "ptx-kernel" fn gdaki_sass_put(h: *const gdaki_shared::channel::PortChannelHandle, bytes: u64) {
    // SAFETY: the caller's contract.
    let _ = unsafe { exclusive(h) }.put(0, 0, bytes);
}

/// One Exclusive `put_with_signal` on channel `*h`, as [`gdaki_sass_put`].
///
/// # Safety
/// As `exclusive`.
#[no_mangle]
pub unsafe extern "ptx-kernel" fn gdaki_sass_put_with_signal(
    h: *const gdaki_shared::channel::PortChannelHandle,
    bytes: u64,
) {
    // SAFETY: the caller's contract.
    let _ = unsafe { exclusive(h) }.put_with_signal(0, 0, bytes);
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
