//! Which rows a run has: the tests of each subcommand and each test's sizes (MSCCL++'s GPUNetIO comparison by
//! default), and the iteration plan.

use std::time::Duration;

use gdaki::exec::ExecutorKind;
use gdaki_testkit::porttest::bench::{Plan, Test};

use crate::cli::Opts;

/// The tests a subcommand runs, in table order.
pub fn tests(cmd: &str) -> Vec<Test> {
    match cmd {
        "pingpong" => vec![Test::PingPong],
        "packet" => vec![Test::PacketLl16, Test::PacketLl8],
        "bw" => vec![Test::Bw1Qp, Test::Bw4Qp],
        "bibw" => vec![Test::Bibw],
        "flush" => vec![Test::FlushStress, Test::SameChannelFlush],
        _ => Test::ALL.to_vec(),
    }
}

const KB: usize = 1 << 10;
const MB: usize = 1 << 20;

/// `test`'s sizes, bytes as `Row::bytes`: `-s`, else `-a`'s ladder, else the `--quick` or default set.
pub fn sizes(test: Test, opts: &Opts) -> Vec<usize> {
    if let Some(s) = opts.size {
        return vec![s];
    }
    // MSCCL++'s GPUNetIO comparison; latency rows at 8 B, 1 KiB, 4 KiB.
    let (default, quick): (&[usize], &[usize]) = match test {
        Test::PingPong | Test::PacketLl16 | Test::PacketLl8 => (&[8, KB, 4 * KB], &[8]),
        Test::Bw1Qp => (&[KB, 64 * KB, MB, 4 * MB, 128 * MB], &[KB, 64 * KB]),
        Test::Bw4Qp => (&[4 * KB, 256 * KB, 4 * MB, 512 * MB], &[4 * KB, 256 * KB]),
        Test::Bibw | Test::FlushStress | Test::SameChannelFlush => (&[KB], &[KB]),
    };
    if opts.all_sizes {
        let (first, step, last) = match test {
            Test::PingPong | Test::PacketLl16 | Test::PacketLl8 => (8, 2, MB),
            Test::Bw4Qp => (4 * KB, 4, 512 * MB),
            Test::Bw1Qp | Test::Bibw => (KB, 4, 128 * MB),
            Test::FlushStress | Test::SameChannelFlush => return default.to_vec(),
        };
        let mut v: Vec<usize> =
            std::iter::successors(Some(first), |s| Some(s * step)).take_while(|&s| s < last).collect();
        v.push(last);
        return v;
    }
    if opts.quick { quick } else { default }.to_vec()
}

/// The plan of a run with `opts` on `kind`.
pub fn plan(opts: &Opts, kind: ExecutorKind) -> Plan {
    Plan {
        iters: opts.iters.unwrap_or(if opts.quick { 50 } else { 1000 }),
        warmup: opts.warmup,
        byte_budget: opts.row_mib.unwrap_or(if opts.quick { 16 } else { 512 }).saturating_mul(MB),
        team: opts.team.unwrap_or(if kind == ExecutorKind::Gpu { 128 } else { 4 }),
        timeout: Duration::from_millis(opts.timeout_ms),
        blue_flame_limit: opts.blue_flame_limit,
    }
}
