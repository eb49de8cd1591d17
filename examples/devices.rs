//! Lists the host's RDMA devices as the mlx5 backend sees them: per device its limits (max QP/CQ sizes,
//! outstanding READs/atomics, atomic capability) and per port its state, link layer, LID, MTU and GID table,
//! then which GID `--nic DEVICE:PORT` would send from.
//!
//! `cargo run --example devices --features mlx5`
//!
//! Exit codes: 0 with a listing; 2 with one line when there is nothing to list (no RDMA device: "no RDMA
//! devices found: ..."; or a build without the `mlx5` feature); 1 when a query fails.

use std::process::ExitCode;

#[cfg(feature = "mlx5")]
fn main() -> ExitCode {
    use gdaki::nic::mlx5::{self, LinkLayer};
    match mlx5::list() {
        Ok(devices) => {
            for d in &devices {
                print!("{d}");
                for p in &d.ports {
                    let link = p.link.unwrap_or(LinkLayer::InfiniBand);
                    match mlx5::gid::select(&p.gids, link, None) {
                        Ok(g) => println!("  --nic {}:{} sends from gid[{}] {}", d.name, p.num, g.index, g.ip()),
                        Err(e) => println!("  --nic {}:{}: {e}", d.name, p.num),
                    }
                }
            }
            ExitCode::SUCCESS
        }
        Err(gdaki::Error::Unavailable(why)) => {
            eprintln!("error: {why}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(not(feature = "mlx5"))]
fn main() -> ExitCode {
    eprintln!(
        "error: this build has no mlx5 backend: run `cargo run --example devices --features mlx5` (needs rdma-core's \
         libibverbs-dev and libclang-dev)"
    );
    ExitCode::from(2)
}
