//! The project's kernels as PTX, built by `build.rs` with `gdaki-build` from the `gdaki-testkit-kernels`
//! crate: one self-contained module for sm_90 (PTX ISA 8.6 or newer), validated at build time (at least one
//! `.entry`, no `.extern`). Load it with `gdaki::launch::Module::load`.

/// The PTX module's text.
pub const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/gdaki_testkit_kernels.ptx"));

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_has_every_kernel_of_the_crate() {
        assert!(PTX.lines().any(|l| l.trim() == ".target sm_90"));
        for name in [
            "gdaki_pingpong",
            "gdaki_port_exclusive",
            "gdaki_port_block",
            "gdaki_port_device",
            "gdaki_post_rate_exclusive",
            "gdaki_post_rate_blueflame",
            "gdaki_post_rate_ordering",
            "gdaki_post_rate_warp_ordering",
            "gdaki_post_rate_warp_part",
            "gdaki_post_rate_shared",
            "gdaki_post_rate_warp",
            "gdaki_post_rate_batch",
            "gdaki_sass_put",
            "gdaki_sass_put_loop",
            "gdaki_sass_put_with_signal",
            "gdaki_sass_qp_post",
            "gdaki_sass_qp_post_loop",
            "gdaki_sass_qp_post_batch",
            "gdaki_sass_qp_post_bf",
            "gdaki_sass_warp_post",
            "gdaki_sass_warp_post_some",
            "gdaki_port_warp",
            "gdaki_sass_shared_post",
            "gdaki_wqe_samples",
            "gdaki_smoke",
            "gdaki_array_sum",
            "gdaki_grid_rounds",
            "gdaki_flag_echo",
            "gdaki_coll_broadcast",
            "gdaki_coll_all_to_all_v",
            "gdaki_coll_reduce",
            "gdaki_coll_all_reduce",
            "gdaki_coll_all_reduce_ring",
        ] {
            assert!(PTX.contains(&format!(".entry {name}(")), "{name} is not an .entry of the PTX");
        }
        // gdaki-device itself exports no kernel: every entry is one of this crate's.
        assert_eq!(PTX.matches(".entry ").count(), 33);
    }
}
