//! Data-parallel training of a small MLP on the iris data set, gradients summed through gdaki, against a
//! single-rank run with the same seed (see the library's `train` module for the method).
//!
//! `cargo run --release -p gdaki-workloads --bin train -- --executor cpu [--nranks 4] [--json PATH]`, or one
//! process per rank (per GPU): `mpirun -np 4 target/release/train --executor gpu` (or torchrun, srun, or
//! `--world-size`/`--rank`); rank 0 prints the report.

use std::process::ExitCode;

use clap::Parser;
use gdaki::exec::ExecutorKind;
use gdaki_workloads::train::{run, TrainConfig};
use gdaki_workloads::{resolve_executor, Path};

/// Command line.
#[derive(Parser, Debug)]
#[command(about = "Data-parallel MLP training on iris, gradients all-reduced through gdaki")]
struct Args {
    /// Executor: cpu or gpu (default: the GPU if there is one, else cpu).
    #[arg(long)]
    executor: Option<ExecutorKind>,
    /// Ranks (threads of this process, 1 to 8), each with a shard of the training set; with a launch
    /// (mpirun, srun, torchrun or --world-size/--rank), one rank per process instead.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=gdaki_shared::coll::MAX_RANKS as i64))]
    nranks: u32,
    /// How gradients are summed: nic (fixed point, RDMA fetch-adds) or ring (ring reduce-scatter + all-gather, summed by device code).
    #[arg(long, value_enum, default_value_t = Path::Nic)]
    path: Path,
    /// Epochs.
    #[arg(long, default_value_t = TrainConfig::default().epochs)]
    epochs: usize,
    /// Examples per rank per step.
    #[arg(long, default_value_t = TrainConfig::default().batch)]
    batch: usize,
    /// Learning rate.
    #[arg(long, default_value_t = TrainConfig::default().lr)]
    lr: f32,
    /// Gradient clip: every element clipped to [-clip, clip] before the sum, which is its bound (max_abs).
    #[arg(long, default_value_t = TrainConfig::default().clip)]
    clip: f32,
    /// Seed of the split, the initial weights and the batches.
    #[arg(long, default_value_t = TrainConfig::default().seed)]
    seed: u64,
    /// Writes the curves and timings as JSON here.
    #[arg(long, value_name = "PATH")]
    json: Option<std::path::PathBuf>,
    #[command(flatten)]
    launch: gdaki_examples::LaunchArgs,
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(code) = args.launch.spawn_processes(2..=gdaki_shared::coll::MAX_RANKS as u32) {
        return code;
    }
    gdaki_examples::apply_queues(None);
    let launch = match gdaki::bootstrap::Launch::resolve_from_process_env(args.launch.flags()) {
        Ok(l) => l.filter(|l| l.world_size > 1),
        Err(e) => {
            gdaki_examples::eprintln_line!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let executor = match resolve_executor(args.executor, args.launch.gpu_of(launch.as_ref())) {
        Ok(k) => k,
        Err(e) => {
            gdaki_examples::eprintln_line!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let cfg = TrainConfig {
        nranks: args.nranks,
        launch,
        gpu: args.launch.gpu,
        bootstrap_timeout: args.launch.bootstrap_timeout(),
        wire: args.launch.wire_config(),
        executor,
        path: args.path,
        epochs: args.epochs,
        batch: args.batch,
        lr: args.lr,
        clip: args.clip,
        seed: args.seed,
        ..TrainConfig::default()
    };
    let r = match run(&cfg) {
        Ok(Some(r)) => r,
        // Another process's rank 0 reports (and fails when the weights differ).
        Ok(None) => return ExitCode::SUCCESS,
        Err(e) => {
            gdaki_examples::eprintln_line!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    gdaki_examples::outln!(
        "gdaki train (commit {}): iris MLP 4-{}-3 ({} parameters), {} ranks ({}) on the {} executor, path {}, \
         {} train / {} test examples, {} per shard, batch {} per rank, {} steps per epoch, lr {}, clip {}",
        r.commit,
        cfg.hidden,
        r.parameters,
        r.nranks,
        r.ranks_in,
        r.executor,
        r.path,
        r.train_examples,
        r.test_examples,
        r.shard_examples,
        cfg.batch,
        r.steps_per_epoch,
        cfg.lr,
        cfg.clip
    );
    gdaki_examples::outln!("{:>5}  {:>10} {:>9}  {:>10} {:>9}", "epoch", "loss", "test acc", "loss 1", "test acc 1");
    for (d, s) in r.distributed.curve.iter().zip(&r.single.curve) {
        gdaki_examples::outln!(
            "{:>5}  {:>10.5} {:>8.1}%  {:>10.5} {:>8.1}%",
            d.epoch,
            d.train_loss,
            100.0 * d.test_accuracy,
            s.train_loss,
            100.0 * s.test_accuracy
        );
    }
    let (d, s) = (r.distributed.curve.last(), r.single.curve.last());
    let fmt = |e: Option<&gdaki_workloads::train::EpochRow>| {
        e.map_or("-".to_string(), |e| {
            format!("loss {:.5}, test accuracy {:.1}%", e.train_loss, 100.0 * e.test_accuracy)
        })
    };
    gdaki_examples::outln!("summary:");
    gdaki_examples::outln!("  {} ranks ({}): {}", r.nranks, r.path, fmt(d));
    gdaki_examples::outln!("  single rank: {}", fmt(s));
    gdaki_examples::outln!(
        "  median step: {:.3} ms on {} ranks (of which the gradient sum {:.3} ms), {:.3} ms single-rank",
        r.distributed.step_ms_median,
        r.nranks,
        r.distributed.sum_ms_median,
        r.single.step_ms_median
    );
    gdaki_examples::outln!(
        "  gradient elements clipped: {} ({} ranks), {} (single rank)",
        r.distributed.clipped,
        r.nranks,
        r.single.clipped
    );
    gdaki_examples::outln!("  max weight difference between ranks: {:e}", r.max_rank_weight_diff);
    gdaki_examples::outln!("  max weight difference, ranks vs single rank: {:e}", r.max_single_weight_diff);
    if let Some(p) = &args.json {
        let text = match serde_json::to_string_pretty(&r) {
            Ok(t) => t,
            Err(e) => {
                gdaki_examples::eprintln_line!("error: --json: {e}");
                return ExitCode::FAILURE;
            }
        };
        if let Err(e) = std::fs::write(p, text + "\n") {
            gdaki_examples::eprintln_line!("error: --json {}: {e}", p.display());
            return ExitCode::FAILURE;
        }
    }
    if r.max_rank_weight_diff != 0.0 {
        gdaki_examples::eprintln_line!("error: the ranks' weights differ");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
