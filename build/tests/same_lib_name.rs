//! Two device crates with the same library name, built into one nested target directory (as the build scripts of
//! one workspace do): each build must return its own crate's PTX.
//!
//! Cargo names a path crate's `cdylib` without a hash (`deps/kernels.ptx`), so the two crates' builds write the
//! same file; the crate built first is still fresh by its own fingerprint afterwards, and cargo would hand back
//! the other crate's module. The first run builds `core` for nvptx64 (about 20 s on two cores); later runs reuse
//! it.

use std::fs;
use std::path::Path;

use gdaki_build::PtxBuilder;

/// A `no_std` crate in `dir` whose library is `kernels` and whose one kernel is `kernel_from_<tag>`.
fn device_crate(dir: &Path, tag: &str) {
    fs::create_dir_all(dir.join("src")).expect("mkdir");
    // `[workspace]`: a package of its own, not a stray member of the repository's workspace above it.
    let manifest = format!(
        "[package]\nname = \"device-{tag}\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[lib]\nname = \"kernels\"\n\n\
         [workspace]\n"
    );
    fs::write(dir.join("Cargo.toml"), manifest).expect("write Cargo.toml");
    // Written on every run: sources newer than the last build's outputs, so that both crates are compiled again
    // before the third build, whatever an earlier run left in the target directory.
    let source = format!(
        "#![no_std]\n#![feature(abi_ptx)]\n\n#[no_mangle]\npub unsafe extern \"ptx-kernel\" fn kernel_from_{tag}(p: \
         *mut u32) {{\n    unsafe {{ *p = 1 }};\n}}\n\n#[panic_handler]\nfn panic(_: &core::panic::PanicInfo) -> ! \
         {{\n    loop {{}}\n}}\n"
    );
    fs::write(dir.join("src/lib.rs"), source).expect("write lib.rs");
}

#[test]
fn crates_with_one_library_name_each_get_their_own_ptx() {
    // Under the workspace's target folder, so that its rust-toolchain.toml (with the nvptx components) applies.
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("same-lib-name");
    let (a, b) = (root.join("a"), root.join("b"));
    device_crate(&a, "a");
    device_crate(&b, "b");
    // Kept between runs, so that only the first builds `core`.
    let target = root.join("ptx-build");
    // A, then B (which overwrites the shared output), then A again, which cargo finds fresh.
    for (dir, tag) in [(&a, "a"), (&b, "b"), (&a, "a")] {
        let built = PtxBuilder::new(dir).target_dir(&target).quiet(true).build().expect("PTX build");
        assert_eq!(built.lib_name, "kernels");
        assert_eq!(built.info.entries, [format!("kernel_from_{tag}")], "the PTX built from {}", dir.display());
    }
}
