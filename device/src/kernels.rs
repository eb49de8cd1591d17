//! PTX entry points (`.entry`), one per kernel the host launches.

/// Placeholder kernel while the skeleton lands: writes 1 to `*flag`.
///
/// # Safety
/// `flag` must be a valid device pointer to a `u32`.
#[no_mangle]
pub unsafe extern "ptx-kernel" fn gdaki_smoke(flag: *mut u32) {
    // SAFETY: the caller passes a valid pointer.
    unsafe { core::ptr::write_volatile(flag, 1) }
}
