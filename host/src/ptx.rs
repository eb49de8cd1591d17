//! The device code as PTX, built from `gdaki-device` by `build.rs` (`cargo build` needs no manual step).
//!
//! One self-contained module for [`ARCH`] (PTX ISA 8.2 or newer), checked at build time: it has at least one
//! `.entry` and no `.extern` for the CUDA driver to resolve. Load it with `cuModuleLoadData` (e.g. through
//! `gdaki::cuda`); the driver JIT-compiles it for the GPU at hand. `cargo xtask build-ptx` writes the same module
//! to `target/ptx/gdaki_device.ptx` and reports registers and spills per kernel with ptxas.

/// The PTX module's text.
pub const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/gdaki_device.ptx"));

/// Names of the kernels (`.entry` functions) in [`PTX`], in file order: the names to launch.
pub const ENTRIES: &[&str] = include!(concat!(env!("OUT_DIR"), "/gdaki_device_entries.rs"));

/// GPU architecture [`PTX`] was generated for (its `.target`).
pub const ARCH: &str = "sm_90";

/// Whether [`PTX`] has a kernel called `name`.
pub fn has_entry(name: &str) -> bool {
    ENTRIES.contains(&name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_matches_its_entry_list() {
        assert!(!ENTRIES.is_empty());
        assert!(PTX.lines().any(|l| l.trim() == format!(".target {ARCH}")));
        for name in ENTRIES {
            assert!(PTX.contains(&format!(".entry {name}(")), "{name} is not an .entry of the PTX");
        }
        // The kernels the host launches by name (pingpong, the GPU tests) are there.
        for name in ["gdaki_pingpong", "gdaki_wqe_samples", "gdaki_smoke"] {
            assert!(has_entry(name), "{name} missing from {ENTRIES:?}");
        }
        assert!(!has_entry("no_such_kernel"));
    }
}
