//! The floor probe measures what it says: as many flag round trips as asked (each one answered by the echo
//! kernel, or the probe fails), a small-copy row on the GPU only, and a bandwidth row per size. The GPU run is
//! `--ignored`.

use gdaki::exec::{Executor, ExecutorKind};
use gdaki_testkit::floors::{self, COPY_SIZES};

fn measures(kind: ExecutorKind) {
    let (exec, _) = Executor::open(Some(kind)).expect("executor");
    let f = floors::measure(&exec, gdaki_testkit::ptx::PTX, 300).expect("floors");
    assert_eq!(f.flag_round_trip.iterations, 300);
    assert!(f.flag_round_trip.t_min > 0.0 && f.flag_round_trip.t_min <= f.flag_round_trip.t_typical);
    assert_eq!(f.small_copy_sync.as_ref().map(|r| r.iterations), (kind == ExecutorKind::Gpu).then_some(300));
    assert_eq!(f.copy.iter().map(|c| c.bytes).collect::<Vec<_>>(), COPY_SIZES);
    assert!(f.copy.iter().all(|c| c.copies >= 4 && c.gb_per_s > 0.0), "{:?}", f.copy);
    let t = floors::table(&f);
    assert_eq!(t.lines().count(), 1 + 1 + usize::from(kind == ExecutorKind::Gpu) + COPY_SIZES.len(), "{t}");
}

#[test]
fn cpu_floors() {
    measures(ExecutorKind::Cpu);
}

#[test]
#[ignore = "needs a GPU: run on the H200 with --ignored"]
fn gpu_floors() {
    let _gpu = gdaki_testkit::gpu_turn();
    measures(ExecutorKind::Gpu);
}
