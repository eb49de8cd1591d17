//! gdaki device code (placeholder while the skeleton lands).
#![no_std]
