//! Compiles `c/mlx5dv_ref.c` and `c/ifc.c` against the system's `<infiniband/mlx5dv.h>` (rdma-core, Debian
//! `libibverbs-dev`).
//!
//! Before that it probes the header: if it cannot be included, the build stops with one line that says what to
//! install; items that only some rdma-core releases have are probed one by one and passed to the C file as
//! `GOLDEN_HAVE_*` macros, so that an older or newer header still builds and the tests report what it lacks.

use std::path::{Path, PathBuf};

/// The one line printed when the header is missing.
const MISSING_HEADER: &str = "golden tests need rdma-core's mlx5dv.h: apt-get install libibverbs-dev";

/// Header items that some rdma-core releases lack: the macro defined when present, and a C statement that
/// compiles only when the item exists. `MLX5_BF_OFFSET`, `MLX5_SEND_WQE_DS`, `MLX5_CQ_*` and
/// `MLX5_WQE_CTRL_STRONG_ORDERING` live in the provider's private headers in the releases we know of, and
/// `mlx5_err_cqe.hw_err_synd`/`hw_synd_type` were carved out of a reserved field in later releases.
const OPTIONAL: &[(&str, &str)] = &[
    ("GOLDEN_HAVE_BF_OFFSET", "long x = MLX5_BF_OFFSET;"),
    ("GOLDEN_HAVE_SEND_WQE_DS", "long x = MLX5_SEND_WQE_DS;"),
    ("GOLDEN_HAVE_CQ_SET_CI", "long x = MLX5_CQ_SET_CI;"),
    ("GOLDEN_HAVE_CQ_ARM_DB", "long x = MLX5_CQ_ARM_DB;"),
    ("GOLDEN_HAVE_WQE_CTRL_STRONG_ORDERING", "long x = MLX5_WQE_CTRL_STRONG_ORDERING;"),
    ("GOLDEN_HAVE_ERR_CQE_HW_ERR_SYND", "size_t x = offsetof(struct mlx5_err_cqe, hw_err_synd);"),
    ("GOLDEN_HAVE_ERR_CQE_HW_SYND_TYPE", "size_t x = offsetof(struct mlx5_err_cqe, hw_synd_type);"),
];

fn main() {
    println!("cargo::rerun-if-changed=c/mlx5dv_ref.c");
    println!("cargo::rerun-if-changed=c/ifc.c");
    println!("cargo::rerun-if-changed=build.rs");
    // The header can appear or change (apt-get install/upgrade) without any file of ours changing.
    println!("cargo::rerun-if-changed=/usr/include/infiniband/mlx5dv.h");

    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));

    // Tell "no C compiler" apart from "no header", so that the message names the right package.
    if !compiles(&out, "cc", "int golden_probe;\n") {
        println!("cargo::error=golden tests need a C compiler: apt-get install gcc");
        return;
    }
    if !compiles(&out, "header", "#include <infiniband/mlx5dv.h>\n") {
        println!("cargo::error={MISSING_HEADER}");
        return;
    }

    // Control probes: items every header has. If these fail, the probe itself is broken, and every optional
    // item below would be silently skipped instead of checked.
    assert!(
        has_item(&out, "control_enum", "long x = MLX5_SEND_WQE_BB;")
            && has_item(&out, "control_field", "size_t x = offsetof(struct mlx5_err_cqe, syndrome);"),
        "build.rs probe of mlx5dv.h is broken: it rejects items the header has"
    );

    let mut build = cc::Build::new();
    build.file("c/mlx5dv_ref.c").file("c/ifc.c").warnings(true);
    for (i, (define, statement)) in OPTIONAL.iter().enumerate() {
        if has_item(&out, &format!("opt{i}"), statement) {
            build.define(define, None);
        }
    }
    build.compile("mlx5dv_ref");
}

/// Whether the header has the item that C `statement` (which declares `x`) uses.
fn has_item(out: &Path, name: &str, statement: &str) -> bool {
    let src = format!(
        "#include <stddef.h>\n#include <infiniband/mlx5dv.h>\nvoid golden_probe(void) {{ {statement} (void)x; }}\n"
    );
    compiles(out, name, &src)
}

/// Whether `src` compiles with the C compiler `cc` picks (same compiler and flags as the real build). The probe
/// leaves no link directives behind: only the real build's library is linked.
fn compiles(out: &Path, name: &str, src: &str) -> bool {
    let path = out.join(format!("probe_{name}.c"));
    let dir = out.join(format!("probe_{name}"));
    std::fs::create_dir_all(&dir).expect("create probe folder in OUT_DIR");
    std::fs::write(&path, src).expect("write probe source into OUT_DIR");
    cc::Build::new()
        .file(&path)
        .cargo_metadata(false)
        .cargo_warnings(false)
        .warnings(false)
        .out_dir(dir)
        .try_compile(&format!("probe_{name}"))
        .is_ok()
}
