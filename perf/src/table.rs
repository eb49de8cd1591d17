//! The printed tables (one per test, every mode side by side, a ratio column against Host), the ratios
//! themselves and the summary of the Device/Host latency ratios against the project's targets.

use gdaki_testkit::perftest::{BandwidthRow, LatencyRow};
use gdaki_testkit::porttest::bench::{Measure, Row, Test};
use gdaki_testkit::porttest::Mode;

/// A row against Host's row of the same test and size: latency rows t_typical / Host's (below 1: faster than
/// Host), bandwidth rows algbw / Host's (above 1: faster). `None` without a Host row or a time.
pub fn vs_host(rows: &[Row], row: &Row) -> Option<f64> {
    let host = rows.iter().find(|h| h.mode == Mode::Host && h.test == row.test && h.bytes == row.bytes)?;
    match (&row.measure, &host.measure) {
        (Some(Measure::Latency(r)), Some(Measure::Latency(h))) if h.t_typical > 0.0 => Some(r.t_typical / h.t_typical),
        (Some(Measure::Bandwidth(r)), Some(Measure::Bandwidth(h))) if h.gbps > 0.0 => Some(r.gbps / h.gbps),
        _ => None,
    }
}

/// Prints one table per test in `tests` that has rows: perftest's columns, then mode, ratio and payloads
/// checked, sizes ascending and modes in run order within a size; with `nic`, each row followed by what the
/// emulated NIC did per iteration ([`NicWork::line`](gdaki_testkit::porttest::bench::NicWork::line)).
pub fn print(tests: &[Test], rows: &[Row], nic: bool) {
    for &test in tests {
        let mut mine: Vec<&Row> = rows.iter().filter(|r| r.test == test && r.measure.is_some()).collect();
        if mine.is_empty() {
            continue;
        }
        mine.sort_by_key(|r| r.bytes);
        let (what, header, ratio) = if test.is_bandwidth() {
            ("bytes per iteration over all QPs", BandwidthRow::header(), "bw/Host")
        } else if matches!(test, Test::FlushStress | Test::SameChannelFlush) {
            ("µs per put + flush, bytes per put", LatencyRow::header(), "t/Host")
        } else {
            ("µs per round trip", LatencyRow::header(), "t/Host")
        };
        gdaki_examples::outln!("\n## {} ({what})", test.name());
        gdaki_examples::outln!("{header}  {:<17} {:>8} {:>9}", "mode", ratio, "checked");
        for r in mine {
            let line = match &r.measure {
                Some(Measure::Latency(l)) => l.line(),
                Some(Measure::Bandwidth(b)) => b.line(),
                None => continue,
            };
            let ratio = vs_host(rows, r).map_or("-".to_string(), |x| format!("{x:.2}"));
            gdaki_examples::outln!("{line}  {:<17} {ratio:>8} {:>9}", r.mode.label(), r.checked);
            if let (true, Some(w)) = (nic, &r.nic) {
                gdaki_examples::outln!("{}", w.line());
            }
        }
    }
}

/// The project's targets on the emulated NIC (docs/architecture.md, "Performance targets"): Device-Exclusive's
/// typical latency at most this fraction of Host's: PingPong 0.75, LL (PacketPingPong) 0.7.
fn target(test: Test) -> Option<f64> {
    match test {
        Test::PingPong => Some(0.75),
        Test::PacketLl16 | Test::PacketLl8 => Some(0.7),
        _ => None,
    }
}

/// One line of the summary: a Device mode's latency ratio to Host at the test's smallest size.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Ratio {
    /// The test (PingPong or a PacketPingPong).
    pub test: Test,
    /// The Device mode.
    pub mode: Mode,
    /// Message size, bytes.
    pub bytes: usize,
    /// t_typical / Host's t_typical.
    pub ratio: f64,
    /// The most the ratio may be (Device-Exclusive only).
    pub target: Option<f64>,
    /// Whether the ratio is at most the target.
    pub met: Option<bool>,
}

/// The Device/Host latency ratios of PingPong and the PacketPingPongs at each one's smallest size.
pub fn summary(rows: &[Row]) -> Vec<Ratio> {
    let mut out = Vec::new();
    for test in [Test::PingPong, Test::PacketLl16, Test::PacketLl8] {
        let Some(bytes) = rows.iter().filter(|r| r.test == test).map(|r| r.bytes).min() else { continue };
        for r in rows.iter().filter(|r| r.test == test && r.bytes == bytes && Mode::DEVICE.contains(&r.mode)) {
            if let Some(ratio) = vs_host(rows, r) {
                let target = target(test).filter(|_| r.mode == Mode::Exclusive);
                out.push(Ratio { test, mode: r.mode, bytes, ratio, target, met: target.map(|t| ratio <= t) });
            }
        }
    }
    out
}

/// Prints the summary block.
pub fn print_summary(ratios: &[Ratio]) {
    if ratios.is_empty() {
        return;
    }
    gdaki_examples::outln!("\n## Summary: typical latency, Device / Host (targets on the emulated NIC)");
    for r in ratios {
        let target = match (r.target, r.met) {
            (Some(t), Some(met)) => format!(" (target <= {t:.2}: {})", if met { "met" } else { "NOT met" }),
            _ => String::new(),
        };
        gdaki_examples::outln!(
            "{:<22} {:>6} B  {}/Host = {:.2}{target}",
            r.test.name(),
            r.bytes,
            r.mode.label(),
            r.ratio
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(test: Test, mode: Mode, us: u64) -> Row {
        let measure = if test.is_bandwidth() {
            // 1 MB in `us` µs.
            gdaki_testkit::perftest::BandwidthRow::from_ns(1_000_000, 1, 1, &[us * 1000]).map(Measure::Bandwidth)
        } else {
            LatencyRow::from_ns(8, &[us * 1000]).map(Measure::Latency)
        };
        Row { test, mode, bytes: 8, warmup: 0, checked: 1, measure, nic: None }
    }

    #[test]
    fn ratios_against_host_and_targets() {
        let rows = [
            row(Test::PingPong, Mode::Host, 40),
            row(Test::PingPong, Mode::Exclusive, 30),
            row(Test::PingPong, Mode::Block, 50),
            row(Test::PacketLl16, Mode::Host, 20),
            row(Test::PacketLl16, Mode::Exclusive, 15),
            row(Test::PacketLl8, Mode::Exclusive, 10),
            row(Test::Bw1Qp, Mode::Host, 100),
            row(Test::Bw1Qp, Mode::Exclusive, 50),
        ];
        // Latency: time over Host's; bandwidth: GB/s over Host's (half the time is twice the bandwidth).
        assert_eq!(vs_host(&rows, &rows[1]), Some(0.75));
        assert_eq!(vs_host(&rows, &rows[0]), Some(1.0));
        assert_eq!(vs_host(&rows, &rows[7]), Some(2.0));
        // No Host row for LL8.
        assert_eq!(vs_host(&rows, &rows[5]), None);
        let s = summary(&rows);
        let got: Vec<_> = s.iter().map(|r| (r.test, r.mode, r.ratio, r.target, r.met)).collect();
        assert_eq!(
            got,
            [
                (Test::PingPong, Mode::Exclusive, 0.75, Some(0.75), Some(true)),
                (Test::PingPong, Mode::Block, 1.25, None, None),
                (Test::PacketLl16, Mode::Exclusive, 0.75, Some(0.7), Some(false)),
            ]
        );
    }
}
