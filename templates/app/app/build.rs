//! Builds the device crate in ../kernels to PTX: `OUT_DIR/kernels.ptx`, rebuilt when the kernels change.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    gdaki_build::PtxBuilder::new("../kernels").build()?;
    Ok(())
}
