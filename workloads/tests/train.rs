//! Data-parallel training on the `cpu` executor, gradients summed on the NIC or by the ring: a few ranks, a few
//! epochs.

use gdaki::exec::ExecutorKind;
use gdaki_workloads::train::{run, TrainConfig};
use gdaki_workloads::Path;

#[test]
fn cpu_two_ranks_agree_and_the_loss_falls() {
    let cfg =
        TrainConfig { nranks: 2, executor: ExecutorKind::Cpu, path: Path::Nic, epochs: 3, ..TrainConfig::default() };
    let r = run(&cfg).expect("train").expect("rank 0 runs here");
    assert_eq!(r.max_rank_weight_diff, 0.0, "the ranks' weights differ");
    let (d, s) = (&r.distributed.curve, &r.single.curve);
    assert_eq!((d.len(), s.len()), (3, 3));
    assert!(d[2].train_loss < d[0].train_loss, "loss did not fall: {d:?}");
    assert!(s[2].train_loss < s[0].train_loss, "single-rank loss did not fall: {s:?}");
    // Both runs take the same batches from the same weights; only the fixed-point sum and the order of
    // additions differ, so the curves stay close.
    for (a, b) in d.iter().zip(s) {
        assert!((a.train_loss - b.train_loss).abs() < 1e-3, "curves apart: {a:?} vs {b:?}");
    }
    assert!(r.max_single_weight_diff < 1e-3, "weights apart from the single-rank run by {}", r.max_single_weight_diff);
}

#[test]
fn cpu_ring_path_agrees_with_the_single_rank_run() {
    let cfg =
        TrainConfig { nranks: 3, executor: ExecutorKind::Cpu, path: Path::Ring, epochs: 2, ..TrainConfig::default() };
    let r = run(&cfg).expect("train on the ring").expect("rank 0 runs here");
    // The ring's sums are computed once per segment and copied: every rank applies the same bits.
    assert_eq!(r.max_rank_weight_diff, 0.0, "the ranks' weights differ");
    assert!(r.max_single_weight_diff < 1e-3, "weights apart from the single-rank run by {}", r.max_single_weight_diff);
}

#[test]
fn bad_settings_are_refused() {
    for cfg in [
        TrainConfig { nranks: 9, epochs: 1, ..TrainConfig::default() },
        TrainConfig { nranks: 2, batch: 1000, epochs: 1, ..TrainConfig::default() },
        TrainConfig { nranks: 2, clip: f32::NAN, epochs: 1, ..TrainConfig::default() },
    ] {
        assert!(run(&cfg).is_err(), "{cfg:?} accepted");
    }
}

/// One process per rank (`train --processes 2`: two processes of the program, each one rank under
/// `--world-size`/`--rank`, as a launcher starts them on a host with a GPU per rank) trains exactly as the same
/// ranks on threads of one process: the same loss curve, bit for bit, and rank 0's report says the ranks agree.
#[test]
fn cpu_one_process_per_rank_trains_as_threads_do() {
    let cfg = TrainConfig { nranks: 2, executor: ExecutorKind::Cpu, epochs: 2, ..TrainConfig::default() };
    let threads = run(&cfg).expect("train").expect("rank 0 runs here");
    let dir = std::env::temp_dir().join(format!("gdaki-train-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a scratch folder");
    let json = dir.join("rank0.json");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_train"))
        .args(["--executor", "cpu", "--epochs", "2", "--processes", "2", "--json"])
        .arg(&json)
        .output()
        .expect("run train --processes 2");
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}\n{text}", out.status);
    // Only rank 0 reports.
    assert_eq!(text.matches("max weight difference between ranks: 0e0").count(), 1, "{text}");
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).expect("rank 0's JSON")).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(report["ranks_in"], "one process per rank (flags)");
    assert_eq!(report["nranks"], 2);
    assert_eq!(report["max_rank_weight_diff"], 0.0);
    let curve = report["distributed"]["curve"].as_array().expect("the curve");
    assert_eq!(curve.len(), threads.distributed.curve.len());
    for (p, t) in curve.iter().zip(&threads.distributed.curve) {
        // serde_json writes an f32 in its shortest form, which reads back as the same f32.
        let f32_of = |v: &serde_json::Value| v.as_f64().map(|x| x as f32);
        assert_eq!(f32_of(&p["train_loss"]), Some(t.train_loss), "epoch {}", t.epoch);
        assert_eq!(f32_of(&p["test_accuracy"]), Some(t.test_accuracy), "epoch {}", t.epoch);
    }
}

/// A learning rate that makes the weights overflow: the run fails saying the training diverged, on both
/// paths, not with a value out of the sum's bound (the clip), which is not what the user got wrong.
#[test]
fn cpu_a_diverging_run_says_so() {
    for path in [Path::Nic, Path::Ring] {
        for lr in [f32::INFINITY, 1e30] {
            let cfg =
                TrainConfig { nranks: 2, executor: ExecutorKind::Cpu, path, lr, epochs: 2, ..TrainConfig::default() };
            let e = run(&cfg).expect_err("a diverging run");
            assert!(e.contains("diverged") && e.contains("--lr"), "{path:?} lr {lr}: {e}");
        }
    }
}
