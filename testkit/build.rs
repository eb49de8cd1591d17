//! Builds the project's kernels (the `kernels/` device crate) to PTX, as a user's build script builds theirs:
//! `gdaki_build::PtxBuilder` writes `OUT_DIR/gdaki_testkit_kernels.ptx`, which `src/ptx.rs` embeds, and tells
//! cargo to run this again only when the kernels, gdaki-device or gdaki-shared changed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    gdaki_build::PtxBuilder::new("kernels").build()?;
    Ok(())
}
