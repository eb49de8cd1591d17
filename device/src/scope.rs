//! Concurrency scopes of a shared QP, chosen at compile time: [`Block`] (the threads of one CTA post to the QP)
//! and [`Device`] (any thread of the grid). They differ only in the scope of the atomics on the QP's
//! send-queue state ([`SqState`](gdaki_shared::handle::SqState)) (PTX `.cta` or `.gpu`); the third scope, Exclusive,
//! needs no atomics and is [`crate::qp::Qp`]. DOCA GPUNetIO names them `DOCA_GPUNETIO_VERBS_RESOURCE_SHARING_MODE_
//! EXCLUSIVE/CTA/GPU`.
//!
//! On nvptx every operation is inline PTX, since `core`'s read-modify-writes lose their ordering there
//! (docs/guide.md, "Toolchain"). On the host (the `cpu` executor) both scopes are `core::sync::atomic` with the
//! same orderings.

/// The atomics a shared QP's posters and CQ poller use, at one scope. Two real implementations, [`Block`] and
/// [`Device`]; sealed, since the shared-QP protocol is proven for these orderings only.
pub trait Scope: sealed::Sealed {
    /// The PTX scope qualifier (`cta` or `gpu`), for messages and docs.
    const PTX: &'static str;

    /// Whether the sharers are the threads of one CTA ([`Block`]): on the `cpu` executor a QP of this scope
    /// refuses posts from a second CTA of a launch, which the GPU's `.cta` atomics would not order.
    const ONE_CTA: bool;

    /// Relaxed fetch-and-add on a `u64`; returns the old value.
    ///
    /// # Safety
    /// `p` must be valid, 8-byte aligned and only accessed atomically meanwhile.
    unsafe fn fetch_add(p: *mut u64, v: u64) -> u64;

    /// Acquire load of a `u64`.
    ///
    /// # Safety
    /// As [`Scope::fetch_add`].
    unsafe fn load_acquire(p: *const u64) -> u64;

    /// Release store of a `u64`.
    ///
    /// # Safety
    /// As [`Scope::fetch_add`].
    unsafe fn store_release(p: *mut u64, v: u64);

    /// Release fence at this scope: every access before it is performed for the scope's threads before any
    /// store after it. Followed by a relaxed [`Scope::cas`], it makes that CAS a release (PTX's release
    /// pattern; C++'s release fence before an atomic write), so a poster can fence once and then retry the CAS.
    fn fence_release();

    /// Relaxed compare-and-swap of a `u64`: stores `new` if the value is `cur`; returns the value found (`cur`
    /// when it swapped).
    ///
    /// # Safety
    /// As [`Scope::fetch_add`].
    unsafe fn cas(p: *mut u64, cur: u64, new: u64) -> u64;

    /// Takes the lock word `p` (0 → 1, acquire) if it is free; returns whether it did.
    ///
    /// # Safety
    /// `p` must be valid, 4-byte aligned and only accessed atomically meanwhile.
    unsafe fn try_lock(p: *mut u32) -> bool;

    /// Releases the lock word `p` (store 0, release).
    ///
    /// # Safety
    /// As [`Scope::try_lock`], held by the caller.
    unsafe fn unlock(p: *mut u32);
}

mod sealed {
    /// Only this crate's scopes implement [`super::Scope`].
    pub trait Sealed {}
    impl Sealed for super::Block {}
    impl Sealed for super::Device {}
}

/// The threads of one CTA share the QP (block-scope atomics). Threads of several CTAs must use [`Device`]:
/// `.cta` atomics order nothing between CTAs on the GPU. On the `cpu` executor, where both scopes are the
/// same atomics, the QP takes posts from the first CTA of a launch that posts and refuses the others'
/// ([`crate::error::InvalidArgument::Sharing`]), so that a test there fails where the GPU would corrupt the QP.
#[derive(Clone, Copy, Debug, Default)]
pub struct Block;

/// Any thread of the grid shares the QP (GPU-scope atomics).
#[derive(Clone, Copy, Debug, Default)]
pub struct Device;

macro_rules! scope_impl {
    ($t:ty, $s:literal, $one_cta:literal) => {
        impl Scope for $t {
            const PTX: &'static str = $s;
            const ONE_CTA: bool = $one_cta;

            #[inline(always)]
            unsafe fn fetch_add(p: *mut u64, v: u64) -> u64 {
                #[cfg(target_arch = "nvptx64")]
                {
                    let old: u64;
                    // SAFETY: the caller guarantees `p`.
                    unsafe {
                        core::arch::asm!(concat!("atom.relaxed.", $s, ".add.u64 {o}, [{p}], {v};"),
                            o = out(reg64) old, p = in(reg64) p, v = in(reg64) v, options(nostack))
                    };
                    old
                }
                #[cfg(not(target_arch = "nvptx64"))]
                // SAFETY: the caller guarantees `p`.
                unsafe {
                    crate::twin::fetch_add_u64(p, v, core::sync::atomic::Ordering::Relaxed)
                }
            }

            #[inline(always)]
            unsafe fn load_acquire(p: *const u64) -> u64 {
                #[cfg(target_arch = "nvptx64")]
                {
                    let v: u64;
                    // SAFETY: the caller guarantees `p`.
                    unsafe {
                        core::arch::asm!(concat!("ld.acquire.", $s, ".u64 {v}, [{p}];"),
                            v = out(reg64) v, p = in(reg64) p, options(nostack))
                    };
                    v
                }
                #[cfg(not(target_arch = "nvptx64"))]
                // SAFETY: the caller guarantees `p`.
                unsafe {
                    crate::twin::load_u64(p, core::sync::atomic::Ordering::Acquire)
                }
            }

            #[inline(always)]
            unsafe fn store_release(p: *mut u64, v: u64) {
                #[cfg(target_arch = "nvptx64")]
                // SAFETY: the caller guarantees `p`.
                unsafe {
                    core::arch::asm!(concat!("st.release.", $s, ".u64 [{p}], {v};"),
                        p = in(reg64) p, v = in(reg64) v, options(nostack))
                };
                #[cfg(not(target_arch = "nvptx64"))]
                // SAFETY: the caller guarantees `p`.
                unsafe {
                    crate::twin::store_u64(p, v, core::sync::atomic::Ordering::Release)
                }
            }

            #[inline(always)]
            fn fence_release() {
                #[cfg(target_arch = "nvptx64")]
                // SAFETY: a fence has no operands and no memory effects besides ordering.
                unsafe {
                    core::arch::asm!(concat!("fence.release.", $s, ";"), options(nostack))
                };
                #[cfg(not(target_arch = "nvptx64"))]
                crate::twin::fence(core::sync::atomic::Ordering::Release);
            }

            #[inline(always)]
            unsafe fn cas(p: *mut u64, cur: u64, new: u64) -> u64 {
                #[cfg(target_arch = "nvptx64")]
                {
                    let old: u64;
                    // SAFETY: the caller guarantees `p`.
                    unsafe {
                        core::arch::asm!(concat!("atom.relaxed.", $s, ".cas.b64 {o}, [{p}], {c}, {n};"),
                            o = out(reg64) old, p = in(reg64) p, c = in(reg64) cur, n = in(reg64) new,
                            options(nostack))
                    };
                    old
                }
                #[cfg(not(target_arch = "nvptx64"))]
                // SAFETY: the caller guarantees `p`.
                unsafe {
                    crate::twin::cas_u64(p, cur, new, core::sync::atomic::Ordering::Relaxed)
                }
            }

            #[inline(always)]
            unsafe fn try_lock(p: *mut u32) -> bool {
                #[cfg(target_arch = "nvptx64")]
                {
                    let old: u32;
                    // SAFETY: the caller guarantees `p`.
                    unsafe {
                        core::arch::asm!(concat!("atom.acquire.", $s, ".cas.b32 {o}, [{p}], {z}, {one};"),
                            o = out(reg32) old, p = in(reg64) p, z = in(reg32) 0u32, one = in(reg32) 1u32,
                            options(nostack))
                    };
                    old == 0
                }
                #[cfg(not(target_arch = "nvptx64"))]
                // SAFETY: the caller guarantees `p`.
                unsafe {
                    crate::twin::cas_u32(p, 0, 1, core::sync::atomic::Ordering::Acquire)
                }
            }

            #[inline(always)]
            unsafe fn unlock(p: *mut u32) {
                #[cfg(target_arch = "nvptx64")]
                // SAFETY: the caller guarantees `p`.
                unsafe {
                    core::arch::asm!(concat!("st.release.", $s, ".u32 [{p}], {z};"),
                        p = in(reg64) p, z = in(reg32) 0u32, options(nostack))
                };
                #[cfg(not(target_arch = "nvptx64"))]
                // SAFETY: the caller guarantees `p`.
                unsafe {
                    crate::twin::store_u32(p, 0, core::sync::atomic::Ordering::Release)
                }
            }
        }
    };
}

scope_impl!(Block, "cta", true);
scope_impl!(Device, "gpu", false);
