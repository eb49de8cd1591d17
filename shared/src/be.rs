//! Big-endian integers with native alignment.
//!
//! Like zerocopy's `U32<BigEndian>`, but `#[repr(transparent)]` over the native integer, so a segment made of
//! them keeps 4/8-byte alignment and is stored with word or vector stores. The stored bits are the
//! big-endian bytes; [`Be32::get`] swaps them to host order.

use bytemuck::{Pod, Zeroable};

macro_rules! be_int {
    ($name:ident, $int:ty, $bytes:literal) => {
        #[doc = concat!("A big-endian `", stringify!($int), "` (", stringify!($bytes), " bytes, native alignment).")]
        #[derive(Clone, Copy, PartialEq, Eq, Hash, Default, Pod, Zeroable)]
        #[repr(transparent)]
        pub struct $name($int);

        impl $name {
            /// The value zero (all bytes zero).
            pub const ZERO: Self = Self(0);

            /// Wraps the host-order value `v`, storing it big-endian.
            #[inline(always)]
            pub const fn new(v: $int) -> Self {
                Self(v.to_be())
            }

            /// The value in host order.
            #[inline(always)]
            pub const fn get(self) -> $int {
                <$int>::from_be(self.0)
            }

            /// Replaces the value with the host-order `v`.
            #[inline(always)]
            pub fn set(&mut self, v: $int) {
                self.0 = v.to_be();
            }

            /// The raw stored bits, i.e. the big-endian bytes read as a host-order integer. This is what a
            /// store of this field writes to memory.
            #[inline(always)]
            pub const fn to_bits(self) -> $int {
                self.0
            }

            /// Reinterprets raw stored bits (as loaded from memory) as a big-endian value.
            #[inline(always)]
            pub const fn from_bits(bits: $int) -> Self {
                Self(bits)
            }

            /// The big-endian bytes, as they lie in memory.
            #[inline(always)]
            pub const fn to_bytes(self) -> [u8; $bytes] {
                self.0.to_ne_bytes()
            }
        }

        impl core::fmt::Debug for $name {
            fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                write!(f, "{}({:#x})", stringify!($name), self.get())
            }
        }
    };
}

be_int!(Be16, u16, 2);
be_int!(Be32, u32, 4);
be_int!(Be64, u64, 8);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_are_big_endian() {
        assert_eq!(Be32::new(0x0102_0304).to_bytes(), [1, 2, 3, 4]);
        assert_eq!(Be16::new(0xabcd).to_bytes(), [0xab, 0xcd]);
        assert_eq!(Be64::new(0x0102_0304_0506_0708).to_bytes(), [1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(Be32::new(7).get(), 7);
    }
}
