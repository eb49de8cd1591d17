//! The UAR (user access region) page: where software rings the doorbell or writes a BlueFlame WQE.

/// Size of one UAR page in bytes (a 4 KiB system page, as mlx5 maps it).
pub const UAR_PAGE_SIZE: usize = 4096;

/// Offset of the first BlueFlame register in the UAR page (`MLX5_BF_OFFSET` in rdma-core's mlx5 provider).
/// The 8-byte doorbell is written to the same address as a BlueFlame WQE.
pub const BF_OFFSET: usize = 0x800;

/// Bytes of one BlueFlame write: one whole WQEBB.
pub const BF_WRITE_SIZE: usize = 64;

/// Bytes of one half of a QP's BlueFlame buffer on a ConnectX (`bf_reg_size` 512 split in two, as rdma-core's
/// mlx5 provider sets `bf->buf_size`): the most a BlueFlame write at [`BF_OFFSET`] can reach.
pub const BF_BUF_SIZE: usize = 256;

const _: () = assert!(BF_OFFSET + BF_BUF_SIZE <= UAR_PAGE_SIZE && BF_WRITE_SIZE <= BF_BUF_SIZE);

/// Word 1 (WQE bytes 8..16) of a BlueFlame write as gdaki's device code stores it: the WQE's own word 1 with
/// the ctrl segment's `signature` byte (WQE byte 8) replaced by the low 8 bits of the WQE index, taken from
/// `word0` (the doorbell value: `opmod_idx_opcode`, `qpn_ds`, as stored). `word1` is the WQE's word 1 as
/// stored.
///
/// Why: a NIC that watches memory, as the emulated one does, sees the register's eight words one by one and
/// cannot tell, from the words alone, a complete write of this WQE from words another write left there (a
/// plain doorbell stores word 0 only) or words of the next write arriving while it reads. Device code stores
/// words 1..8 first, word 1 (this tag) first of all, and word 0 last; the emulated NIC takes the WQE from the
/// register only when word 0 names the next WQE it expects, word 1, read after the others, carries that
/// WQE's tag, and word 0 still names it after that read (the tag alone cannot tell WQE `idx` from `idx + 256`).
/// Hardware ignores the byte: the PRM gives `signature` a meaning only on a QP created with WQE
/// signatures (`wq_signature` in the QPC; rdma-core's mlx5 provider and the kernel compute it only then),
/// which gdaki never enables. The copy of the WQE in the SQ ring keeps its own byte 8.
#[inline(always)]
pub const fn blueflame_word1(word0: u64, word1: u64) -> u64 {
    let mut b = word1.to_ne_bytes();
    b[0] = blueflame_tag(word0);
    u64::from_ne_bytes(b)
}

/// The tag [`blueflame_word1`] puts in word 1 for the WQE whose doorbell value is `word0`: the low 8 bits of
/// its WQE index (byte 2 of `opmod_idx_opcode`, which is big-endian).
#[inline(always)]
pub const fn blueflame_tag(word0: u64) -> u8 {
    word0.to_ne_bytes()[2]
}

/// Whether `word1`, read from the BlueFlame register, carries the tag of the WQE whose doorbell value is
/// `word0` (see [`blueflame_word1`]).
#[inline(always)]
pub const fn blueflame_tagged(word0: u64, word1: u64) -> bool {
    word1.to_ne_bytes()[0] == blueflame_tag(word0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prm::wqe::CtrlSeg;
    use crate::Be32;

    #[test]
    fn the_tag_is_the_low_byte_of_the_wqe_index_in_the_signature_byte() {
        let c = CtrlSeg::new(0x12ab, 0x08, 0, 0x00_0102, 0x08, 3, 0, Be32::new(0xdead_beef));
        let words: [u64; 2] = bytemuck::cast(c);
        let w1 = blueflame_word1(words[0], words[1]);
        let mut expect = bytemuck::bytes_of(&c)[8..16].to_vec();
        expect[0] = 0xab;
        assert_eq!(&w1.to_ne_bytes()[..], &expect[..]);
        assert!(blueflame_tagged(words[0], w1));
        assert!(!blueflame_tagged(words[0], words[1]), "the untagged word (signature 0) is not tagged for 0xab");
        let next = CtrlSeg::new(0x12ac, 0x08, 0, 0x00_0102, 0x08, 3, 0, Be32::ZERO);
        assert!(!blueflame_tagged(bytemuck::cast::<_, [u64; 2]>(next)[0], w1), "another WQE's tag");
    }
}
