//! What every command's input is checked for before it is executed: lengths, and that no bit is set outside
//! the fields the command takes.
//!
//! A command declares the fields it takes (a list of [`Span`]s at their place in the input); every other bit
//! of the input must be zero. A set bit inside a field that gdaki's layouts name (`prm::cmd`'s `FIELDS`, in any
//! of the command's layouts) but the command does not take fails with [`NOT_TAKEN`] and the field's offset; any
//! other set bit (outside every field those layouts name, or past the layout) fails with [`RESERVED`] and its
//! own offset. gdaki's layouts name the fields it uses and some next to them, not every field of the PRM:
//! a bit of a field they leave out (`qpc.q_key`, `qpc.user_index`, ...) is reported as [`RESERVED`], with the
//! same status.

use gdaki_shared::prm::cmd::{Bytes, Field};

use super::syndrome::cmd_syndrome::{BIT_MASK, NOT_TAKEN, RESERVED};
use super::syndrome::Fail;

/// A run of bits of an input layout: a [`Field`] or a [`Bytes`] string, at its place in the input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Span {
    /// Bit offset of the first bit.
    pub off: u32,
    /// Width in bits.
    pub bits: u32,
}

impl Span {
    /// The bits of field `f`.
    pub(super) const fn field(f: Field) -> Span {
        Span { off: f.off(), bits: f.width() }
    }

    /// The bits of byte string `b`.
    pub(super) const fn bytes(b: Bytes) -> Span {
        Span { off: b.off(), bits: b.len() as u32 * 8 }
    }

    fn contains(self, bit: u32) -> bool {
        (self.off..self.off + self.bits).contains(&bit)
    }
}

/// A layout whose named fields count as "named" for the check: its `FIELDS` moved to bit offset `base`.
pub(super) type Named = (&'static [(&'static str, Field)], u32);

/// Sets the bits of `s` in `mask` (as many as fit).
fn mark(mask: &mut [u8], s: Span) {
    for bit in s.off..s.off + s.bits {
        if let Some(b) = mask.get_mut(bit as usize / 8) {
            *b |= 0x80 >> (bit % 8);
        }
    }
}

/// Checks that every bit of `inbox` outside `taken` is zero. `named` and `named_bytes` are every field gdaki's
/// layouts of the command name, to tell a field the command does not take ([`NOT_TAKEN`] with the field's first bit)
/// from a reserved bit ([`RESERVED`] with the bit); bytes past `size` are reserved.
pub(super) fn check_bits(
    inbox: &[u8],
    size: usize,
    taken: &[&[Span]],
    named: &[Named],
    named_bytes: &[Span],
) -> Result<(), Fail> {
    let mut mask = vec![0u8; size];
    for &s in taken.iter().copied().flatten() {
        mark(&mut mask, s);
    }
    let Some((i, bad)) =
        inbox.iter().enumerate().map(|(i, &b)| (i, b & !mask.get(i).copied().unwrap_or(0))).find(|&(_, b)| b != 0)
    else {
        return Ok(());
    };
    let bit = (i * 8) as u32 + bad.leading_zeros();
    let fields = named.iter().flat_map(|&(fields, base)| fields.iter().map(move |&(_, f)| Span::field(f.at(base))));
    let hit = fields.chain(named_bytes.iter().copied()).find(|s| (bit as usize) < size * 8 && s.contains(bit));
    Err(match hit {
        Some(s) => Fail::of(NOT_TAKEN | (s.off & BIT_MASK)),
        None => Fail::of(RESERVED | (bit & BIT_MASK)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use gdaki_shared::prm::cmd::{cqc, create_cq_in};

    const NAMED: &[Named] = &[(create_cq_in::FIELDS, 0), (cqc::FIELDS, create_cq_in::CQ_CONTEXT)];

    #[test]
    fn a_taken_field_passes_a_named_one_is_not_taken_a_gap_is_reserved() {
        let taken = [Span::field(create_cq_in::OPCODE), Span::field(create_cq_in::cq_context(cqc::LOG_CQ_SIZE))];
        let mut inbox = [0u8; create_cq_in::SIZE];
        create_cq_in::OPCODE.set(&mut inbox, 0x400).unwrap();
        create_cq_in::cq_context(cqc::LOG_CQ_SIZE).set(&mut inbox, 31).unwrap();
        assert_eq!(check_bits(&inbox, create_cq_in::SIZE, &[&taken], NAMED, &[]), Ok(()));
        // `cqc.oi` is a field of the layout that the command does not take: its offset.
        let oi = create_cq_in::cq_context(cqc::OI);
        oi.set(&mut inbox, 1).unwrap();
        assert_eq!(check_bits(&inbox, create_cq_in::SIZE, &[&taken], NAMED, &[]), Err(Fail::of(NOT_TAKEN | oi.off())));
        oi.set(&mut inbox, 0).unwrap();
        // Bit 0x62 of the cqc (just before log_cq_size) is reserved.
        let gap = create_cq_in::CQ_CONTEXT + 0x62;
        inbox[gap as usize / 8] |= 0x80 >> (gap % 8);
        assert_eq!(check_bits(&inbox, create_cq_in::SIZE, &[&taken], NAMED, &[]), Err(Fail::of(RESERVED | gap)));
    }

    #[test]
    fn bytes_past_the_layout_are_reserved() {
        let mut inbox = vec![0u8; create_cq_in::SIZE + 8];
        inbox[create_cq_in::SIZE + 1] = 0x01;
        let bit = (create_cq_in::SIZE as u32 + 1) * 8 + 7;
        assert_eq!(check_bits(&inbox, create_cq_in::SIZE, &[], NAMED, &[]), Err(Fail::of(RESERVED | bit)));
    }
}
