//! The firmware command layouts of `c/ifc.c`: every member of the `mlx5_ifc_*_bits` structs that gdaki-shared's
//! `prm::cmd` defines, with its bit offset and width as rdma-core's `__devx_bit_off`/`__devx_bit_sz` give them,
//! and `DEVX_SET`/`DEVX_GET` (`DEVX_SET64`/`DEVX_GET64` for 64-bit fields) of each named field.

use std::ffi::{c_char, CStr};
use std::sync::OnceLock;

/// What a [`Row`] describes (`enum golden_ifc_kind` in `c/ifc.c`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A layout (a `struct mlx5_ifc_<name>_bits`); its [`Row::bit_sz`] is the struct's size in bits.
    Struct,
    /// A union layout; its members overlap.
    Union,
    /// A named field of 1 to 32 bits.
    Scalar,
    /// A named 64-bit field.
    U64,
    /// Reserved bits, named `reserved_at_<hex bit offset>`.
    Reserved,
    /// An embedded struct or union.
    Sub,
    /// A byte string (`u8 name[n][0x8]`).
    Bytes,
}

/// One row of the C table: a layout, or one member of a layout.
#[derive(Clone, Copy, Debug)]
pub struct Row {
    /// The layout's name: `qpc` for `struct mlx5_ifc_qpc_bits`.
    pub layout: &'static str,
    /// The member's name, or `None` for the layout's own row.
    pub member: Option<&'static str>,
    /// `__devx_bit_off(layout, member)` (0 for a layout row).
    pub bit_off: u32,
    /// `__devx_bit_sz(layout, member)`, or the layout's size in bits (`DEVX_ST_SZ_BYTES * 8`).
    pub bit_sz: u32,
    /// What the row is.
    pub kind: Kind,
    /// Index in the C table (the setters and getters are looked up by it).
    index: usize,
}

impl Row {
    /// Bytes a buffer needs for this member's `DEVX_SET`/`DEVX_GET`: the end of the 32-bit word (64-bit word
    /// for 64-bit fields) the macro loads and stores.
    pub fn access_end(&self) -> usize {
        let word = if self.kind == Kind::U64 { 64 } else { 32 };
        (self.bit_off as usize / word + 1) * word / 8
    }

    /// `DEVX_SET(layout, bytes, member, v)` (or `DEVX_SET64`), `bytes` holding the layout from byte 0.
    ///
    /// # Panics
    /// If the row is not a named field, or `bytes` is shorter than [`access_end`](Row::access_end).
    pub fn devx_set(&self, bytes: &mut [u8], v: u64) {
        assert!(bytes.len() >= self.access_end(), "{}.{:?}: buffer too short", self.layout, self.member);
        // SAFETY: golden_ifc_set reads and writes only the `bytes.len()` bytes at `bytes`, a valid, writable
        // slice of that length: it copies them into an aligned local of the largest layout's size, runs the
        // row's DEVX_SET there (every member lies inside that size) and copies them back; it refuses (returns
        // -1) rows without a setter and lengths above the local's size.
        let rc = unsafe { golden_ifc_set(self.index, bytes.as_mut_ptr(), bytes.len(), v) };
        assert_eq!(rc, 0, "{}.{:?} has no DEVX_SET", self.layout, self.member);
    }

    /// `DEVX_GET(layout, bytes, member)` (or `DEVX_GET64`), `bytes` holding the layout from byte 0.
    ///
    /// # Panics
    /// As [`devx_set`](Row::devx_set).
    pub fn devx_get(&self, bytes: &[u8]) -> u64 {
        assert!(bytes.len() >= self.access_end(), "{}.{:?}: buffer too short", self.layout, self.member);
        let mut v = 0u64;
        // SAFETY: golden_ifc_get only reads the `bytes.len()` bytes at `bytes` (a valid slice) into an aligned,
        // zeroed local and stores the result through `&mut v`, a valid local.
        let rc = unsafe { golden_ifc_get(self.index, bytes.as_ptr(), bytes.len(), &mut v) };
        assert_eq!(rc, 0, "{}.{:?} has no DEVX_GET", self.layout, self.member);
        v
    }
}

/// Mirrors `struct golden_ifc_row` in `c/ifc.c`.
#[repr(C)]
struct RawRow {
    layout: *const c_char,
    member: *const c_char,
    bit_off: u32,
    bit_sz: u32,
    kind: u32,
}

/// Mirrors `struct golden_ifc_const` in `c/ifc.c`.
#[repr(C)]
struct RawConst {
    name: *const c_char,
    value: i64,
}

extern "C" {
    fn golden_ifc_rows(len: *mut usize) -> *const RawRow;
    fn golden_ifc_consts(len: *mut usize) -> *const RawConst;
    fn golden_ifc_set(i: usize, bytes: *mut u8, len: usize, v: u64) -> i32;
    fn golden_ifc_get(i: usize, bytes: *const u8, len: usize, v: *mut u64) -> i32;
}

/// A C string literal of the tables as a `&'static str`.
///
/// # Safety
/// `p` must point to a NUL-terminated string that lives for the whole program.
unsafe fn name(p: *const c_char) -> &'static str {
    // SAFETY: guaranteed by the caller: the names are string literals (`#T`, `#n`, `"reserved_at_" #h`).
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str().expect("C identifiers are ASCII")
}

/// The C tables, converted on first use.
struct Tables {
    rows: Vec<Row>,
    consts: Vec<(&'static str, i64)>,
}

fn tables() -> &'static Tables {
    static TABLES: OnceLock<Tables> = OnceLock::new();
    TABLES.get_or_init(|| {
        let (mut nr, mut nc) = (0usize, 0usize);
        // SAFETY: each table function stores its entry count through the pointer (a valid local) and returns
        // a `static const` array of that many entries, never written, whose names are string literals (a
        // member name is NULL only in a layout's own row, checked before use). RawRow and RawConst mirror the
        // C structs field for field with #[repr(C)].
        unsafe {
            let rows = std::slice::from_raw_parts(golden_ifc_rows(&mut nr), nr);
            let consts = std::slice::from_raw_parts(golden_ifc_consts(&mut nc), nc);
            Tables {
                rows: rows
                    .iter()
                    .enumerate()
                    .map(|(index, r)| Row {
                        layout: name(r.layout),
                        member: if r.member.is_null() { None } else { Some(name(r.member)) },
                        bit_off: r.bit_off,
                        bit_sz: r.bit_sz,
                        kind: match r.kind {
                            0 => Kind::Struct,
                            1 => Kind::Union,
                            2 => Kind::Scalar,
                            3 => Kind::U64,
                            4 => Kind::Reserved,
                            5 => Kind::Sub,
                            6 => Kind::Bytes,
                            k => panic!("c/ifc.c: unknown row kind {k}"),
                        },
                        index,
                    })
                    .collect(),
                consts: consts.iter().map(|c| (name(c.name), c.value)).collect(),
            }
        }
    })
}

/// Every row of the C table, layouts and members, in the C file's order (each layout's row, then its members
/// in declaration order).
pub fn rows() -> &'static [Row] {
    &tables().rows
}

/// The layouts the C file declares, as their own rows.
pub fn layouts() -> impl Iterator<Item = &'static Row> {
    rows().iter().filter(|r| r.member.is_none())
}

/// The row of `layout` itself (its size), or `None` if the C file does not declare it.
pub fn layout(layout: &str) -> Option<&'static Row> {
    layouts().find(|r| r.layout == layout)
}

/// The members of `layout`, in declaration order.
pub fn members(layout: &str) -> Vec<&'static Row> {
    rows().iter().filter(|r| r.layout == layout && r.member.is_some()).collect()
}

/// The row of `layout`'s member `member`, or `None`.
pub fn member(layout: &str, member: &str) -> Option<&'static Row> {
    rows().iter().find(|r| r.layout == layout && r.member == Some(member))
}

/// Value of the `<infiniband/verbs.h>` constant `name` the C file exports, or `None`.
pub fn c_const(name: &str) -> Option<i64> {
    tables().consts.iter().find(|(n, _)| *n == name).map(|&(_, v)| v)
}
