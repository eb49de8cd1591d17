//! Big-endian bit fields addressed the way the PRM's `mlx5_ifc_*_bits` structs address them.
//!
//! A field is a bit offset from the start of its layout and a width in bits. Bits are numbered MSB first
//! within big-endian 32-bit dwords: bit offset 0 is the most significant bit of byte 0, bit offset 31 the least
//! significant bit of byte 3, bit offset 32 the most significant bit of byte 4. This is the numbering of the
//! `u8 name[width]` members of mlx5_ifc.h, and of rdma-core's `DEVX_SET`/`DEVX_GET` (`infiniband/mlx5dv.h`),
//! which read the dword holding the field, shift right by `32 - width - (offset % 32)` and mask.

use core::fmt;
use core::ops::Range;

/// Why a [`Field`] or [`Bytes`] access was refused. Nothing is written when an access fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FieldError {
    /// The value has bits set above the field's width (`value > field.max()`).
    TooWide {
        /// The field's width in bits.
        width: u32,
        /// The value that was refused.
        value: u64,
    },
    /// The buffer ends before the dword(s) (or bytes) that hold the field.
    ShortBuffer {
        /// Bytes the access needs: the end of the last dword (or byte) it touches.
        needed: usize,
        /// Bytes the buffer has.
        len: usize,
    },
    /// A byte string to store into a [`Bytes`] field does not have the field's length.
    WrongLength {
        /// The field's length in bytes.
        expected: usize,
        /// The length of the bytes given.
        got: usize,
    },
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            FieldError::TooWide { width, value } => write!(f, "value {value:#x} does not fit in {width} bits"),
            FieldError::ShortBuffer { needed, len } => {
                write!(f, "buffer of {len} bytes is too short for the field (needs {needed})")
            }
            FieldError::WrongLength { expected, got } => write!(f, "expected {expected} bytes, got {got}"),
        }
    }
}

/// A scalar bit field of a PRM layout: `width` bits starting `off` bits from the start of the layout.
///
/// Bits are numbered MSB first within big-endian 32-bit dwords: bit offset 0 is the most significant bit of
/// byte 0, 31 the least significant bit of byte 3, 32 the most significant bit of byte 4 (the numbering of
/// mlx5_ifc.h's `u8 name[width]` members and of rdma-core's `DEVX_SET`/`DEVX_GET`).
///
/// A field is 1 to 32 bits inside one dword, or 64 bits starting on a dword boundary (two big-endian dwords,
/// high dword first: one big-endian `u64`). mlx5_ifc.h never lets a field of 32 bits or fewer cross a dword, and
/// places its 64-bit fields on 64-bit boundaries (`DEVX_SET64` requires that); [`Field::new`] enforces the
/// first rule and the weaker dword alignment for 64-bit fields. Wider members (GIDs, MACs) are [`Bytes`].
///
/// [`set`](Field::set) refuses a value wider than the field with [`FieldError::TooWide`]; it never masks
/// silently, unlike `DEVX_SET`, which drops the high bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Field {
    off: u32,
    width: u32,
}

impl Field {
    /// The field of `width` bits at bit offset `off`.
    ///
    /// # Panics
    /// If `width` is 0, above 32 and not 64, a field of 32 bits or fewer crosses a dword boundary, or a 64-bit
    /// field does not start on a dword boundary. The layouts in this module are constants, so such a mistake
    /// stops the build rather than a run.
    pub const fn new(off: u32, width: u32) -> Field {
        if width == 64 {
            assert!(off.is_multiple_of(32), "a 64-bit field must start on a dword boundary");
        } else {
            assert!(width >= 1 && width <= 32, "a field is 1..=32 or 64 bits wide");
            assert!(off % 32 + width <= 32, "a field of 32 bits or fewer must not cross a dword boundary");
        }
        Field { off, width }
    }

    /// Bit offset of the field's most significant bit from the start of the layout.
    pub const fn off(self) -> u32 {
        self.off
    }

    /// Width in bits (1..=32, or 64).
    pub const fn width(self) -> u32 {
        self.width
    }

    /// The same field inside a layout that embeds this field's layout at bit offset `base`: e.g. a `qpc`
    /// field inside CREATE_QP's input is `qpc::PD.at(create_qp_in::QPC)`.
    ///
    /// # Panics
    /// If the moved field would break [`Field::new`]'s rules (a `base` that is not a multiple of 32 can).
    pub const fn at(self, base: u32) -> Field {
        Field::new(base + self.off, self.width)
    }

    /// The largest value the field holds: `width` one bits.
    pub const fn max(self) -> u64 {
        if self.width == 64 {
            u64::MAX
        } else {
            (1u64 << self.width) - 1
        }
    }

    /// Index of the first dword the field touches (`off / 32`).
    pub const fn dword(self) -> usize {
        (self.off / 32) as usize
    }

    /// Bytes a buffer needs for an access: the end of the last dword the field touches. Accesses read (and
    /// write back) whole big-endian dwords, as `DEVX_SET` does.
    pub const fn end(self) -> usize {
        (self.dword() + if self.width == 64 { 2 } else { 1 }) * 4
    }

    /// The field's value in `buf` (a layout starting at byte 0), or [`FieldError::ShortBuffer`].
    pub fn try_get(self, buf: &[u8]) -> Result<u64, FieldError> {
        let end = self.end();
        let Some(bytes) = buf.get(self.dword() * 4..end) else {
            return Err(FieldError::ShortBuffer { needed: end, len: buf.len() });
        };
        if self.width == 64 {
            let mut b = [0u8; 8];
            b.copy_from_slice(bytes);
            return Ok(u64::from_be_bytes(b));
        }
        let dw = u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        Ok(u64::from(dw >> self.shift()) & self.max())
    }

    /// The field's value in `buf` (a layout starting at byte 0).
    ///
    /// # Panics
    /// If `buf` is shorter than [`end`](Field::end); [`try_get`](Field::try_get) returns an error instead.
    pub fn get(self, buf: &[u8]) -> u64 {
        match self.try_get(buf) {
            Ok(v) => v,
            Err(e) => panic!("Field {{ off: {:#x}, width: {} }}: {e}", self.off, self.width),
        }
    }

    /// Stores `value` into the field in `buf`, leaving every other bit as it was.
    ///
    /// Refuses (and writes nothing) a value above [`max`](Field::max) ([`FieldError::TooWide`]) or a buffer
    /// shorter than [`end`](Field::end) ([`FieldError::ShortBuffer`]).
    pub fn set(self, buf: &mut [u8], value: u64) -> Result<(), FieldError> {
        if value > self.max() {
            return Err(FieldError::TooWide { width: self.width, value });
        }
        let end = self.end();
        let len = buf.len();
        let Some(bytes) = buf.get_mut(self.dword() * 4..end) else {
            return Err(FieldError::ShortBuffer { needed: end, len });
        };
        if self.width == 64 {
            bytes.copy_from_slice(&value.to_be_bytes());
            return Ok(());
        }
        let old = u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        // `max` and `value` fit in 32 bits here (width <= 32), so the casts are exact.
        let mask = (self.max() as u32) << self.shift();
        let new = (old & !mask) | ((value as u32) << self.shift());
        bytes.copy_from_slice(&new.to_be_bytes());
        Ok(())
    }

    /// Right shift that brings the field to bit 0 of its dword (fields of 32 bits or fewer).
    const fn shift(self) -> u32 {
        32 - self.width - self.off % 32
    }
}

/// A byte-string member of a PRM layout (`u8 name[n][0x8]` in mlx5_ifc.h, e.g. a GID): `len` bytes starting
/// `off` bits (a multiple of 8) from the start of the layout, stored in order, byte 0 first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Bytes {
    off: u32,
    len: u32,
}

impl Bytes {
    /// The `len` bytes at bit offset `off`.
    ///
    /// # Panics
    /// If `off` is not a multiple of 8 or `len` is 0 (a build error for the constants of this module).
    pub const fn new(off: u32, len: u32) -> Bytes {
        assert!(off.is_multiple_of(8), "a byte string starts on a byte boundary");
        assert!(len > 0, "a byte string has at least one byte");
        Bytes { off, len }
    }

    /// Bit offset of the first byte from the start of the layout.
    pub const fn off(self) -> u32 {
        self.off
    }

    /// Length in bytes.
    pub const fn len(self) -> usize {
        self.len as usize
    }

    /// Always `false`: a byte string has at least one byte.
    pub const fn is_empty(self) -> bool {
        false
    }

    /// The same bytes inside a layout that embeds this one's layout at bit offset `base` (see [`Field::at`]).
    ///
    /// # Panics
    /// If `base` is not a multiple of 8.
    pub const fn at(self, base: u32) -> Bytes {
        Bytes::new(base + self.off, self.len)
    }

    /// The byte range in a buffer holding the layout.
    pub const fn range(self) -> Range<usize> {
        let start = (self.off / 8) as usize;
        start..start + self.len as usize
    }

    /// The bytes in `buf`, or [`FieldError::ShortBuffer`].
    pub fn try_get(self, buf: &[u8]) -> Result<&[u8], FieldError> {
        let r = self.range();
        let (needed, len) = (r.end, buf.len());
        buf.get(r).ok_or(FieldError::ShortBuffer { needed, len })
    }

    /// The bytes in `buf`.
    ///
    /// # Panics
    /// If `buf` ends before the field does; [`try_get`](Bytes::try_get) returns an error instead.
    pub fn get(self, buf: &[u8]) -> &[u8] {
        match self.try_get(buf) {
            Ok(b) => b,
            Err(e) => panic!("Bytes {{ off: {:#x}, len: {} }}: {e}", self.off, self.len),
        }
    }

    /// Copies `src` (exactly [`len`](Bytes::len) bytes) into the field in `buf`; writes nothing on error.
    pub fn set(self, buf: &mut [u8], src: &[u8]) -> Result<(), FieldError> {
        if src.len() != self.len() {
            return Err(FieldError::WrongLength { expected: self.len(), got: src.len() });
        }
        let r = self.range();
        let (needed, len) = (r.end, buf.len());
        let dst = buf.get_mut(r).ok_or(FieldError::ShortBuffer { needed, len })?;
        dst.copy_from_slice(src);
        Ok(())
    }
}

/// Whether a field's mlx5_ifc name and its constant's name are the same up to ASCII case (`log_sq_size` and
/// `LOG_SQ_SIZE`): the layout tables are checked with it at compile time.
pub(crate) const fn same_name(ifc: &str, constant: &str) -> bool {
    let (a, b) = (ifc.as_bytes(), constant.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i].to_ascii_uppercase() != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nibble_at_bit_4_is_the_low_nibble_of_byte_0() {
        let f = Field::new(4, 4);
        let mut buf = [0u8; 4];
        f.set(&mut buf, 0xa).unwrap();
        assert_eq!(buf, [0x0a, 0, 0, 0]);
        assert_eq!(f.get(&[0x5c, 0xff, 0xff, 0xff]), 0xc);
        // The other bits of the dword are kept.
        let mut buf = [0xff; 4];
        f.set(&mut buf, 0).unwrap();
        assert_eq!(buf, [0xf0, 0xff, 0xff, 0xff]);
    }

    #[test]
    fn bit_offsets_count_msb_first_within_big_endian_dwords() {
        // Bit 0: the MSB of byte 0; bit 31: the LSB of byte 3; bit 32: the MSB of byte 4.
        let mut buf = [0u8; 8];
        Field::new(0, 1).set(&mut buf, 1).unwrap();
        Field::new(31, 1).set(&mut buf, 1).unwrap();
        Field::new(32, 1).set(&mut buf, 1).unwrap();
        assert_eq!(buf, [0x80, 0, 0, 0x01, 0x80, 0, 0, 0]);
        // A 24-bit field at bit 8 of the second dword (a QPN after an 8-bit reserved byte): bytes 5..8.
        let mut buf = [0u8; 8];
        Field::new(0x28, 24).set(&mut buf, 0x12_3456).unwrap();
        assert_eq!(buf, [0, 0, 0, 0, 0, 0x12, 0x34, 0x56]);
        assert_eq!(Field::new(0x28, 24).get(&buf), 0x12_3456);
        // A 16-bit field at bit 16: bytes 2..4, big-endian.
        let mut buf = [0u8; 4];
        Field::new(16, 16).set(&mut buf, 0xbeef).unwrap();
        assert_eq!(buf, [0, 0, 0xbe, 0xef]);
    }

    #[test]
    fn sixty_four_bit_fields_are_one_big_endian_u64() {
        let f = Field::new(64, 64);
        let mut buf = [0u8; 16];
        f.set(&mut buf, 0x0102_0304_0506_0708).unwrap();
        assert_eq!(buf[8..], [1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(buf[..8], [0; 8]);
        assert_eq!(f.get(&buf), 0x0102_0304_0506_0708);
        assert_eq!(f.max(), u64::MAX);
        assert_eq!(f.end(), 16);
    }

    #[test]
    fn too_wide_values_are_refused_and_nothing_is_written() {
        let f = Field::new(4, 4);
        let mut buf = [0x11u8; 4];
        assert_eq!(f.set(&mut buf, 0x10), Err(FieldError::TooWide { width: 4, value: 0x10 }));
        assert_eq!(buf, [0x11; 4]);
        assert_eq!(Field::new(0, 32).set(&mut buf, 1 << 32), Err(FieldError::TooWide { width: 32, value: 1 << 32 }));
        assert_eq!(buf, [0x11; 4]);
        // The largest value fits.
        f.set(&mut buf, f.max()).unwrap();
        assert_eq!(buf, [0x1f, 0x11, 0x11, 0x11]);
    }

    #[test]
    fn short_buffers_are_refused() {
        let f = Field::new(0x28, 24);
        let mut buf = [0u8; 7];
        assert_eq!(f.set(&mut buf, 1), Err(FieldError::ShortBuffer { needed: 8, len: 7 }));
        assert_eq!(f.try_get(&buf), Err(FieldError::ShortBuffer { needed: 8, len: 7 }));
        assert_eq!(buf, [0; 7]);
    }

    #[test]
    #[should_panic(expected = "too short")]
    fn get_on_a_short_buffer_panics() {
        Field::new(32, 8).get(&[0u8; 4]);
    }

    #[test]
    fn at_moves_a_field_by_whole_bits() {
        let f = Field::new(0x63, 5).at(0x80);
        assert_eq!((f.off(), f.width()), (0xe3, 5));
    }

    #[test]
    fn bytes_are_stored_in_order() {
        let gid = Bytes::new(0x80, 16);
        let mut buf = [0u8; 32];
        let src: [u8; 16] = core::array::from_fn(|i| i as u8 + 1);
        gid.set(&mut buf, &src).unwrap();
        assert_eq!(buf[16..], src);
        assert_eq!(gid.get(&buf), &src);
        assert_eq!(gid.range(), 16..32);
        assert_eq!(gid.set(&mut buf, &src[..15]), Err(FieldError::WrongLength { expected: 16, got: 15 }));
        assert_eq!(gid.set(&mut buf[..31], &src), Err(FieldError::ShortBuffer { needed: 32, len: 31 }));
    }

    #[test]
    fn names_compare_up_to_case() {
        assert!(same_name("log_sq_size", "LOG_SQ_SIZE"));
        assert!(!same_name("log_sq_size", "LOG_RQ_SIZE"));
        assert!(!same_name("pd", "PDN"));
    }
}
