//! Lists the host's RDMA devices as the mlx5 backend sees them: per device its limits (max QP/CQ sizes,
//! outstanding READs/atomics, atomic capability) and per port its state, link layer, LID, MTU and GID table,
//! then which GID `--nic DEVICE:PORT` would send from.
//!
//! `cargo run --example devices --features mlx5` (`-- --help` for this text)
//!
//! Exit codes: 0 with a listing; 2 with one line when there is nothing to list (no RDMA device: "no RDMA
//! devices found: ..."; or a build without the `mlx5` feature); 1 when a query fails; 2 also for an unknown
//! argument (with clap's usage message).

use std::process::ExitCode;

use clap::Parser;

/// The command line: no arguments, only `--help` (and `--version`).
#[derive(Parser, Debug)]
#[command(
    version,
    about = "Lists the host's RDMA devices as gdaki's mlx5 backend sees them (needs a build with --features mlx5)",
    long_about = "Lists the host's RDMA devices as gdaki's mlx5 backend sees them: per device its limits (max QP/CQ \
                  sizes, outstanding READs/atomics, atomic capability), per port its state, link layer, LID, MTU \
                  and GID table, then which GID `--nic DEVICE:PORT` would send from.\n\n\
                  Build: cargo build --features mlx5 -p gdaki-examples --example devices (needs rdma-core's \
                  libibverbs-dev and libclang-dev).\n\n\
                  Exit codes: 0 with a listing; 2 with one line when there is nothing to list (no RDMA device: \
                  \"no RDMA devices found: ...\"; or a build without the mlx5 feature); 1 when a query fails; 2 \
                  also for an unknown argument."
)]
struct Args {}

fn main() -> ExitCode {
    Args::parse();
    list()
}

#[cfg(feature = "mlx5")]
fn list() -> ExitCode {
    use gdaki::nic::mlx5::{self, LinkLayer};
    match mlx5::list() {
        Ok(devices) => {
            for d in &devices {
                gdaki_examples::write_stdout(format!("{d}"));
                for p in &d.ports {
                    let link = p.link.unwrap_or(LinkLayer::InfiniBand);
                    match mlx5::gid::select(&p.gids, link, None) {
                        Ok(g) => gdaki_examples::outln!(
                            "  --nic {}:{} sends from gid[{}] {}",
                            d.name,
                            p.num,
                            g.index,
                            g.ip()
                        ),
                        Err(e) => gdaki_examples::outln!("  --nic {}:{}: {e}", d.name, p.num),
                    }
                }
            }
            ExitCode::SUCCESS
        }
        Err(gdaki::Error::Unavailable(why)) => {
            gdaki_examples::eprintln_line!("error: {why}");
            ExitCode::from(2)
        }
        Err(e) => {
            gdaki_examples::eprintln_line!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(not(feature = "mlx5"))]
fn list() -> ExitCode {
    gdaki_examples::eprintln_line!(
        "error: this build has no mlx5 backend: run `cargo run --example devices --features mlx5` (needs rdma-core's \
         libibverbs-dev and libclang-dev)"
    );
    ExitCode::from(2)
}
