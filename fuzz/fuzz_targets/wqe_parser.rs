//! Fuzzes the emulated NIC's send-WQE parser and validator (`parse_ctrl` + `parse_body`).
//!
//! Input: byte 0 picks the ring (`wqe_cnt` = 2^(bits 3:0)) and, with bit 7 set, a QPN and WQE index other than
//! the ctrl segment's own (so that those checks fail too); byte 1 is the WQEBBs the doorbell announced; the rest
//! is the WQE (ctrl segment first), of any length.
#![no_main]

use gdaki::nic::emu::fuzzing::parse_wqe;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&[ring, avail], wqe)) = data.split_first_chunk::<2>() else {
        return;
    };
    let (mut qpn, mut index) = (0x00_0123, 0);
    if ring & 0x80 == 0 && wqe.len() >= 8 {
        // The ctrl segment's own: bytes 0..4 `opmod_idx_opcode`, 4..8 `qpn_ds`, big-endian.
        index = u16::from_be_bytes([wqe[1], wqe[2]]);
        qpn = u32::from_be_bytes([0, wqe[4], wqe[5], wqe[6]]);
    }
    let _ = parse_wqe(wqe, qpn, 1 << (ring & 0x0f), index, avail as u64);
});
