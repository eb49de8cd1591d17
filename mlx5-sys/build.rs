//! Generates the bindings of `<infiniband/verbs.h>` and `<infiniband/mlx5dv.h>` with bindgen, compiles the
//! wrappers of their `static inline` functions and the C layout reference with cc, and links libibverbs and
//! libmlx5.
//!
//! The three pitfalls of these headers (docs/architecture.md, "Toolchain"):
//! 1. Many entry points are `static inline` (`___ibv_query_port`, `ibv_query_gid_table`, `mlx5dv_init_obj`'s
//!    helpers...): no symbol exists to link to. `wrap_static_fns` makes bindgen write a C file with one
//!    exported wrapper per such function (`<name>__extern`), which cc compiles here.
//! 2. `struct mlx5_wqe_ctrl_seg` is `packed` and `aligned(4)` at once, which bindgen renders as a packed Rust
//!    struct of alignment 1: it is blocklisted and defined by hand in `src/lib.rs`.
//! 3. `ibv_query_port` and `ibv_reg_mr` are macros over `___ibv_query_port` and `__ibv_reg_mr`; bindgen sees
//!    no function of the public name, so callers use the underscored ones (allowlist `_{0,3}ibv_.*`).
//!
//! A missing header or libclang stops the build with one line saying what to install.

use std::path::PathBuf;

/// The one line printed when rdma-core's headers are missing.
const MISSING_HEADERS: &str =
    "gdaki-mlx5-sys needs rdma-core's headers (infiniband/verbs.h, infiniband/mlx5dv.h): apt-get install libibverbs-dev";
/// The one line printed when bindgen cannot load libclang.
const MISSING_LIBCLANG: &str = "gdaki-mlx5-sys needs libclang for bindgen: apt-get install libclang-dev";

fn main() {
    println!("cargo::rerun-if-changed=wrapper.h");
    println!("cargo::rerun-if-changed=c/layout.c");
    println!("cargo::rerun-if-changed=build.rs");
    // The headers can appear or change (apt-get install/upgrade) without any file of ours changing.
    for h in ["verbs.h", "mlx5dv.h"] {
        println!("cargo::rerun-if-changed=/usr/include/infiniband/{h}");
    }
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let crate_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));

    if !["verbs.h", "mlx5dv.h"].iter().all(|h| std::path::Path::new("/usr/include/infiniband").join(h).exists())
        && std::env::var_os("GDAKI_RDMA_INCLUDE").is_none()
    {
        println!("cargo::error={MISSING_HEADERS}");
        return;
    }
    let extra_include = std::env::var_os("GDAKI_RDMA_INCLUDE").map(PathBuf::from);
    println!("cargo::rerun-if-env-changed=GDAKI_RDMA_INCLUDE");

    let static_fns = out.join("static_fns");
    let mut builder = bindgen::Builder::default()
        .header(crate_dir.join("wrapper.h").to_string_lossy())
        .allowlist_function("_{0,3}ibv_.*")
        .allowlist_function("mlx5dv_.*")
        .allowlist_type("ibv_.*")
        .allowlist_type("mlx5dv_.*")
        .allowlist_var("IBV_.*")
        .allowlist_var("MLX5DV_.*")
        // Pitfall 2: defined by hand.
        .blocklist_type("mlx5_wqe_ctrl_seg")
        // `IBV_QPS_INIT` rather than `ibv_qp_state_IBV_QPS_INIT`: the C names, as the man pages spell them.
        .prepend_enum_name(false)
        .derive_default(true)
        .wrap_static_fns(true)
        .wrap_static_fns_path(&static_fns)
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()));
    if let Some(dir) = &extra_include {
        builder = builder.clang_arg(format!("-I{}", dir.display()));
    }
    // bindgen panics when it cannot load libclang; turn that into the one-line message.
    let generated = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| builder.generate()));
    let bindings = match generated {
        Ok(Ok(b)) => b,
        Ok(Err(e)) => {
            println!("cargo::error=bindgen over verbs.h and mlx5dv.h failed: {e}");
            return;
        }
        Err(_) => {
            println!("cargo::error={MISSING_LIBCLANG}");
            return;
        }
    };
    bindings.write_to_file(out.join("bindings.rs")).expect("write bindings.rs into OUT_DIR");

    // Pitfall 1: the wrappers of the static inline functions.
    let mut wrappers = cc::Build::new();
    wrappers.file(static_fns.with_extension("c")).include(&crate_dir).warnings(false);
    let mut layout = cc::Build::new();
    layout.file(crate_dir.join("c/layout.c")).warnings(true);
    if let Some(dir) = &extra_include {
        wrappers.include(dir);
        layout.include(dir);
    }
    wrappers.compile("gdaki_mlx5_static_fns");
    layout.compile("gdaki_mlx5_layout");

    println!("cargo::rustc-link-lib=mlx5");
    println!("cargo::rustc-link-lib=ibverbs");
}
