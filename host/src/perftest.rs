//! Latency statistics in perftest's layout (`ib_write_lat`): one row per message size with t_min, t_max,
//! t_typical (median), t_avg, t_stdev, 99% and 99.9% percentiles, in µs.

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
}
