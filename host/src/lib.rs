//! gdaki host library (placeholder while the skeleton lands).
