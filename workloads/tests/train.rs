//! Data-parallel training on the `cpu` executor, gradients summed on the NIC or by the ring: a few ranks, a few
//! epochs.

use gdaki::exec::ExecutorKind;
use gdaki_workloads::train::{run, TrainConfig};
use gdaki_workloads::Path;

#[test]
fn cpu_two_ranks_agree_and_the_loss_falls() {
    let cfg =
        TrainConfig { nranks: 2, executor: ExecutorKind::Cpu, path: Path::Nic, epochs: 3, ..TrainConfig::default() };
    let r = run(&cfg).expect("train");
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
    let r = run(&cfg).expect("train on the ring");
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
