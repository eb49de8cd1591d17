//! Golden reference for gdaki-shared: what rdma-core's `<infiniband/mlx5dv.h>` says about the mlx5 layouts,
//! constants and helpers that gdaki-shared mirrors.
//!
//! `c/mlx5dv_ref.c` is compiled against the system's header (build.rs) and exports three tables (struct sizes
//! and alignments, field offsets and sizes, `MLX5_*` constants) and thin wrappers around the header's inline
//! helpers (`mlx5dv_set_ctrl_seg`, `mlx5dv_set_data_seg`, `mlx5dv_get_cqe_*`). This crate turns them into safe
//! Rust; the tests in `tests/` compare them with gdaki-shared.
//!
//! `c/ifc.c` declares the PRM firmware command layouts (`mlx5_ifc_*_bits`) that gdaki-shared's `prm::cmd` names,
//! and exports each member's bit offset and width and rdma-core's `DEVX_SET`/`DEVX_GET` of each field ([`ifc`]).
//!
//! Items that the installed header lacks (some live only in rdma-core's private provider headers or the kernel's,
//! some only in newer releases) are absent from the tables: the lookups return `None`, and the tests then check
//! gdaki-shared against the value those other headers give (copied into the test) rather than skip the check.

#![deny(missing_docs)]

pub mod ifc;

use std::ffi::{c_char, CStr};
use std::sync::OnceLock;

/// Size and alignment of one C struct, from `sizeof` / `_Alignof`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StructLayout {
    /// `sizeof(struct T)`.
    pub size: usize,
    /// `_Alignof(struct T)`.
    pub align: usize,
}

/// Offset and size of one field of a C struct, from `offsetof` / `sizeof`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FieldLayout {
    /// `offsetof(struct T, f)`.
    pub offset: usize,
    /// `sizeof(((struct T *)0)->f)`.
    pub size: usize,
}

/// Mirrors `struct golden_struct` in `c/mlx5dv_ref.c`.
#[repr(C)]
struct RawStruct {
    name: *const c_char,
    size: u32,
    align: u32,
}

/// Mirrors `struct golden_field` in `c/mlx5dv_ref.c`.
#[repr(C)]
struct RawField {
    strukt: *const c_char,
    field: *const c_char,
    offset: u32,
    size: u32,
}

/// Mirrors `struct golden_const` in `c/mlx5dv_ref.c`.
#[repr(C)]
struct RawConst {
    name: *const c_char,
    value: i64,
}

extern "C" {
    fn golden_structs(len: *mut usize) -> *const RawStruct;
    fn golden_fields(len: *mut usize) -> *const RawField;
    fn golden_consts(len: *mut usize) -> *const RawConst;
    fn golden_set_ctrl_seg(
        bytes: *mut u8,
        pi: u16,
        opcode: u8,
        opmod: u8,
        qp_num: u32,
        fm_ce_se: u8,
        ds: u8,
        signature: u8,
        imm: u32,
    );
    fn golden_set_data_seg(bytes: *mut u8, length: u32, lkey: u32, address: usize);
    fn golden_get_cqe_owner(bytes: *const u8) -> u8;
    fn golden_get_cqe_opcode(bytes: *const u8) -> u8;
    fn golden_get_cqe_se(bytes: *const u8) -> u8;
    fn golden_get_cqe_format(bytes: *const u8) -> u8;
}

/// The C tables, read once: (struct, field) names are `&'static str` because the C strings are literals.
struct Tables {
    structs: Vec<(&'static str, StructLayout)>,
    fields: Vec<(&'static str, &'static str, FieldLayout)>,
    consts: Vec<(&'static str, i64)>,
}

/// Reads one C table of `len` entries at `ptr`.
///
/// # Safety
/// `ptr` must point to `len` valid, immutable `T`s that live for the whole program.
unsafe fn table<T>(ptr: *const T, len: usize) -> &'static [T] {
    // SAFETY: guaranteed by the caller; the C tables are `static const` arrays, never written.
    unsafe { std::slice::from_raw_parts(ptr, len) }
}

/// A C string literal from the tables as a `&'static str`.
///
/// # Safety
/// `p` must point to a NUL-terminated string that lives for the whole program.
unsafe fn name(p: *const c_char) -> &'static str {
    // SAFETY: guaranteed by the caller: every name in the tables is a C string literal (`#T`, `#f`, `#c`).
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str().expect("C identifiers are ASCII")
}

/// The C tables, converted on first use.
fn tables() -> &'static Tables {
    static TABLES: OnceLock<Tables> = OnceLock::new();
    TABLES.get_or_init(|| {
        let (mut ns, mut nf, mut nc) = (0usize, 0usize, 0usize);
        // SAFETY: each golden_* table function stores its entry count through the pointer (a valid local) and
        // returns a pointer to a `static const` array of that many entries, whose names are string literals.
        // The Raw* structs mirror the C structs field for field with #[repr(C)].
        unsafe {
            let structs = table(golden_structs(&mut ns), ns);
            let fields = table(golden_fields(&mut nf), nf);
            let consts = table(golden_consts(&mut nc), nc);
            Tables {
                structs: structs
                    .iter()
                    .map(|s| (name(s.name), StructLayout { size: s.size as usize, align: s.align as usize }))
                    .collect(),
                fields: fields
                    .iter()
                    .map(|f| {
                        (
                            name(f.strukt),
                            name(f.field),
                            FieldLayout { offset: f.offset as usize, size: f.size as usize },
                        )
                    })
                    .collect(),
                consts: consts.iter().map(|c| (name(c.name), c.value)).collect(),
            }
        }
    })
}

/// Size and alignment of `struct <name>` (e.g. `"mlx5_wqe_ctrl_seg"`), or `None` if the C file does not
/// export it.
pub fn c_struct(name: &str) -> Option<StructLayout> {
    tables().structs.iter().find(|(n, _)| *n == name).map(|&(_, l)| l)
}

/// Offset and size of `struct <strukt>`'s field `field`, or `None` if the installed header has no such field
/// (or the C file does not export it).
pub fn c_field(strukt: &str, field: &str) -> Option<FieldLayout> {
    tables().fields.iter().find(|(s, f, _)| *s == strukt && *f == field).map(|&(_, _, l)| l)
}

/// Every field the C file exports for `struct <strukt>`, as `(field, layout)`.
pub fn c_fields(strukt: &str) -> Vec<(&'static str, FieldLayout)> {
    tables().fields.iter().filter(|(s, _, _)| *s == strukt).map(|&(_, f, l)| (f, l)).collect()
}

/// Value of the header's constant `name` (e.g. `"MLX5_OPCODE_RDMA_WRITE"`), or `None` if the installed header
/// does not define it.
pub fn c_const(name: &str) -> Option<i64> {
    tables().consts.iter().find(|(n, _)| *n == name).map(|&(_, v)| v)
}

/// The 16 bytes `mlx5dv_set_ctrl_seg(seg, pi, opcode, opmod, qp_num, fm_ce_se, ds, signature, imm)` leaves in a
/// segment that held `init` before (the helper does not write `dci_stream_channel_id`, bytes 9..11).
///
/// `imm` is passed as the C helper takes it: already in wire order, stored verbatim.
#[allow(clippy::too_many_arguments)]
pub fn set_ctrl_seg(
    init: [u8; 16],
    pi: u16,
    opcode: u8,
    opmod: u8,
    qp_num: u32,
    fm_ce_se: u8,
    ds: u8,
    signature: u8,
    imm: u32,
) -> [u8; 16] {
    let mut bytes = init;
    // SAFETY: `bytes` is 16 writable bytes, exactly sizeof(struct mlx5_wqe_ctrl_seg); the wrapper copies
    // through an aligned local, so the array's alignment of 1 is fine.
    unsafe { golden_set_ctrl_seg(bytes.as_mut_ptr(), pi, opcode, opmod, qp_num, fm_ce_se, ds, signature, imm) };
    bytes
}

/// The 16 bytes `mlx5dv_set_data_seg(seg, length, lkey, address)` leaves in a segment that held `init` before.
/// `lkey` is in host order, as the C helper takes it.
pub fn set_data_seg(init: [u8; 16], length: u32, lkey: u32, address: usize) -> [u8; 16] {
    let mut bytes = init;
    // SAFETY: `bytes` is 16 writable bytes, exactly sizeof(struct mlx5_wqe_data_seg); the wrapper copies
    // through an aligned local. `usize` is `uintptr_t` on every platform Rust supports.
    unsafe { golden_set_data_seg(bytes.as_mut_ptr(), length, lkey, address) };
    bytes
}

/// `mlx5dv_get_cqe_owner` of the 64-byte CQE `cqe`.
pub fn cqe_owner(cqe: &[u8; 64]) -> u8 {
    // SAFETY: `cqe` is 64 readable bytes, sizeof(struct mlx5_cqe64); the wrapper only reads them.
    unsafe { golden_get_cqe_owner(cqe.as_ptr()) }
}

/// `mlx5dv_get_cqe_opcode` of the 64-byte CQE `cqe`.
pub fn cqe_opcode(cqe: &[u8; 64]) -> u8 {
    // SAFETY: as in `cqe_owner`.
    unsafe { golden_get_cqe_opcode(cqe.as_ptr()) }
}

/// `mlx5dv_get_cqe_se` (solicited event bit) of the 64-byte CQE `cqe`.
pub fn cqe_se(cqe: &[u8; 64]) -> u8 {
    // SAFETY: as in `cqe_owner`.
    unsafe { golden_get_cqe_se(cqe.as_ptr()) }
}

/// `mlx5dv_get_cqe_format` (CQE compression format) of the 64-byte CQE `cqe`.
pub fn cqe_format(cqe: &[u8; 64]) -> u8 {
    // SAFETY: as in `cqe_owner`.
    unsafe { golden_get_cqe_format(cqe.as_ptr()) }
}
