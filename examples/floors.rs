//! The platform floors of this machine (`gdaki_testkit::floors`): the GPU thread <-> host thread round trip
//! through flags in pinned host memory, an 8-byte device-to-device copy with a synchronize, and the
//! device-to-device copy bandwidth by size (on the `cpu` executor: host threads and memcpy). What every
//! emulated-NIC path pays at least; the benchmarks are set against them.
//!
//! `cargo run --release --example floors -- --executor gpu --json floors.json`

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use gdaki::exec::{Executor, ExecutorKind};
use gdaki_testkit::floors;

#[derive(Parser, Debug)]
#[command(about = "Platform floors: flag round trip through pinned memory, small copy + sync, copy bandwidth")]
struct Args {
    /// cpu or gpu (default: the GPU if there is one).
    #[arg(long)]
    executor: Option<ExecutorKind>,
    /// Timed round trips and small copies.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(1..=10_000_000))]
    iters: u32,
    /// Also write the floors as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let json = match gdaki_examples::create_json(args.json.as_deref()) {
        Ok(f) => f,
        Err(e) => {
            gdaki_examples::eprintln_line!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let (exec, note) = match Executor::open(args.executor) {
        Ok(e) => e,
        Err(e) => {
            gdaki_examples::eprintln_line!("error: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(n) = note {
        gdaki_examples::eprintln_line!("{n}");
    }
    let f = match floors::measure(&exec, gdaki_testkit::ptx::PTX, args.iters) {
        Ok(f) => f,
        Err(e) => {
            gdaki_examples::eprintln_line!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    gdaki_examples::write_stdout(floors::table(&f));
    if let (Some(file), Some(path)) = (json, &args.json) {
        let doc = serde_json::json!({ "commit": gdaki_examples::COMMIT, "floors": f });
        let mut out = std::io::BufWriter::new(file);
        let written =
            serde_json::to_writer_pretty(&mut out, &doc).map_err(std::io::Error::from).and_then(|()| out.flush());
        if let Err(e) = written {
            gdaki_examples::eprintln_line!("error: writing {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}
