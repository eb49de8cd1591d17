//! Fuzzes the emulated NIC's wire frame decoder (`packet::decode`, and `encode` on what it accepts).
//!
//! Input: one frame body (the bytes after the 4-byte length prefix), of any length.
#![no_main]

use gdaki::nic::emu::fuzzing::decode_frame;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    decode_frame(data);
});
