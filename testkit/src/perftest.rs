//! Latency statistics in perftest's layout (`ib_write_lat`): one row per message size with t_min, t_max,
//! t_typical (median), t_avg, t_stdev, 99% and 99.9% percentiles, in µs; bandwidth rows in perftest's
//! (`ib_write_bw`) and nccl-tests' layout: bytes, QPs, iterations, time per iteration, algbw.

/// One row of a latency table. Times are µs.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct LatencyRow {
    /// Message size, bytes.
    pub bytes: u64,
    /// Iterations measured (warm-up excluded).
    pub iterations: usize,
    /// Fastest iteration, µs.
    pub t_min: f64,
    /// Slowest iteration, µs.
    pub t_max: f64,
    /// Median, µs (perftest's "typical").
    pub t_typical: f64,
    /// Mean, µs.
    pub t_avg: f64,
    /// Population standard deviation, µs.
    pub t_stdev: f64,
    /// 99th percentile (nearest rank), µs.
    pub p99: f64,
    /// 99.9th percentile (nearest rank), µs.
    pub p99_9: f64,
}

impl LatencyRow {
    /// Summarises `samples_ns` (one per iteration, ns) for messages of `bytes`. `None` when there are no
    /// samples.
    pub fn from_ns(bytes: u64, samples_ns: &[u64]) -> Option<Self> {
        if samples_ns.is_empty() {
            return None;
        }
        let mut us: Vec<f64> = samples_ns.iter().map(|&n| n as f64 / 1e3).collect();
        us.sort_by(f64::total_cmp);
        let n = us.len();
        let avg = us.iter().sum::<f64>() / n as f64;
        let var = us.iter().map(|x| (x - avg) * (x - avg)).sum::<f64>() / n as f64;
        // Nearest-rank percentile: the smallest sample with at least p‰ of samples at or below it (integer
        // arithmetic: 0.999 * 1000 is not 999 in floating point).
        let pct = |permille: usize| us[(permille * n).div_ceil(1000).clamp(1, n) - 1];
        Some(Self {
            bytes,
            iterations: n,
            t_min: us[0],
            t_max: us[n - 1],
            t_typical: pct(500),
            t_avg: avg,
            t_stdev: var.sqrt(),
            p99: pct(990),
            p99_9: pct(999),
        })
    }

    /// The table header, aligned with [`LatencyRow::line`].
    pub fn header() -> String {
        format!(
            "{:>10} {:>12} {:>10} {:>10} {:>12} {:>10} {:>10} {:>12} {:>12}",
            "#bytes",
            "#iterations",
            "t_min[us]",
            "t_max[us]",
            "t_typical[us]",
            "t_avg[us]",
            "t_stdev[us]",
            "99%[us]",
            "99.9%[us]"
        )
    }

    /// This row as one table line.
    pub fn line(&self) -> String {
        format!(
            "{:>10} {:>12} {:>10.2} {:>10.2} {:>12.2} {:>10.2} {:>10.2} {:>12.2} {:>12.2}",
            self.bytes,
            self.iterations,
            self.t_min,
            self.t_max,
            self.t_typical,
            self.t_avg,
            self.t_stdev,
            self.p99,
            self.p99_9
        )
    }
}

/// One row of a bandwidth table: `iterations` transfers of `bytes` each (all QPs together), timed back to back.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct BandwidthRow {
    /// Bytes per iteration, all QPs together, one direction.
    pub bytes: u64,
    /// QPs the bytes are split over, evenly.
    pub qps: u32,
    /// Directions: 1 (rank 0 sends) or 2 (both ranks send `bytes` at once, perftest's `--bidirectional`).
    pub directions: u32,
    /// Iterations measured (warm-up excluded).
    pub iterations: usize,
    /// Mean time per iteration, µs: the whole timed run, up to the last transfer's completion, over the
    /// iterations (nccl-tests' "time"). The iterations are pipelined (each is posted without waiting for the
    /// one before to complete), so a single iteration's time is how long its posting took, not its transfer:
    /// no per-iteration percentile is kept, since it would not be a transfer time.
    pub us_per_iter: f64,
    /// Bytes moved per second, all directions, in GB/s (10^9 bytes/s): nccl-tests' algbw (its busbw for a
    /// point-to-point transfer is the same number).
    pub gbps: f64,
}

impl BandwidthRow {
    /// Summarises `samples_ns` (one per iteration, ns; they add up to the whole transfer) of `bytes` per
    /// iteration over `qps` QPs in `directions` directions. Only their sum is used (see
    /// [`BandwidthRow::us_per_iter`]). `None` when there are no samples.
    pub fn from_ns(bytes: u64, qps: u32, directions: u32, samples_ns: &[u64]) -> Option<Self> {
        if samples_ns.is_empty() {
            return None;
        }
        let total: u64 = samples_ns.iter().sum();
        let n = samples_ns.len();
        Some(Self {
            bytes,
            qps,
            directions,
            iterations: n,
            us_per_iter: total as f64 / 1e3 / n as f64,
            // bytes per ns is GB/s.
            gbps: (directions as u64 * bytes * n as u64) as f64 / total.max(1) as f64,
        })
    }

    /// The table header, aligned with [`BandwidthRow::line`].
    pub fn header() -> String {
        format!(
            "{:>12} {:>5} {:>12} {:>8} {:>12} {:>12}",
            "#bytes", "#QPs", "bytes/QP", "#iters", "us/iter", "algbw[GB/s]"
        )
    }

    /// This row as one table line.
    pub fn line(&self) -> String {
        format!(
            "{:>12} {:>5} {:>12} {:>8} {:>12.2} {:>12.3}",
            self.bytes,
            self.qps,
            self.bytes / self.qps.max(1) as u64,
            self.iterations,
            self.us_per_iter,
            self.gbps
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_of_one_to_thousand() {
        // 1..=1000 µs: median 500, mean 500.5, p99 990, p99.9 999, stdev sqrt((n^2-1)/12).
        let ns: Vec<u64> = (1..=1000u64).rev().map(|i| i * 1000).collect();
        let r = LatencyRow::from_ns(8, &ns).unwrap();
        assert_eq!((r.t_min, r.t_max, r.t_typical), (1.0, 1000.0, 500.0));
        assert!((r.t_avg - 500.5).abs() < 1e-9);
        assert_eq!((r.p99, r.p99_9), (990.0, 999.0));
        assert!((r.t_stdev - ((1000.0f64 * 1000.0 - 1.0) / 12.0).sqrt()).abs() < 1e-6);
        assert!(LatencyRow::from_ns(8, &[]).is_none());
    }

    #[test]
    fn bandwidth_of_known_times() {
        // 4 iterations of 1 MB in 100, 100, 100, 700 µs (pipelined posts, the last one running to the
        // completion): 1 ms in all, so 4 GB/s one way and 8 both ways; mean 250 µs.
        let ns = [100_000, 100_000, 100_000, 700_000];
        let r = BandwidthRow::from_ns(1_000_000, 4, 1, &ns).unwrap();
        assert_eq!((r.iterations, r.us_per_iter), (4, 250.0));
        assert!((r.gbps - 4.0).abs() < 1e-12);
        assert!((BandwidthRow::from_ns(1_000_000, 1, 2, &ns).unwrap().gbps - 8.0).abs() < 1e-12);
        assert!(r.line().contains(" 250000 "), "bytes/QP column: {}", r.line());
        assert!(BandwidthRow::from_ns(8, 1, 1, &[]).is_none());
    }
}
