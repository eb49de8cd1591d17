//! The aggregation both workloads sum through, on the `cpu` executor: what it refuses.

use gdaki::channel::RankSetup;
use gdaki::exec::ExecutorKind;
use gdaki_workloads::{on_ranks, Path};

/// A value that is not finite is refused on the ring path whatever the bound, as on the NIC path: with an
/// infinite bound (or a NaN one) the ring would otherwise sum infinities into infinities and NaNs. Every rank
/// holds such a value, so every rank refuses before any call (none waits for another).
#[test]
fn cpu_ring_path_refuses_values_that_are_not_finite_whatever_the_bound() {
    for (bound, bad) in [(f32::INFINITY, f32::INFINITY), (f32::INFINITY, f32::NEG_INFINITY), (f32::INFINITY, f32::NAN)]
    {
        let out = on_ranks(RankSetup::local(2, ExecutorKind::Cpu), Path::Ring, |a| {
            let mut v = vec![1.0, bad, -2.5];
            Ok(a.all_reduce_sum(&mut v, bound).map(|()| v))
        })
        .expect("ranks");
        for (rank, r) in out.into_iter().enumerate() {
            let e = r.expect_err(&format!("rank {rank}: {bad} summed with bound {bound}"));
            assert!(e.contains("is not within the bound"), "rank {rank}: {e}");
        }
    }
    // A NaN bound holds no value.
    let out = on_ranks(RankSetup::local(2, ExecutorKind::Cpu), Path::Ring, |a| {
        let mut v = vec![1.0f32, 2.0];
        Ok(a.all_reduce_sum(&mut v, f32::NAN).map(|()| v))
    })
    .expect("ranks");
    for (rank, r) in out.into_iter().enumerate() {
        assert!(r.is_err(), "rank {rank}: summed with a NaN bound: {r:?}");
    }
}
