//! `--plot`: latency vs size and bandwidth vs size, one panel per test, one line per mode, sizes on a log
//! axis and times or GB/s on a linear one from 0, to PNG (plotters' bitmap backend; text in DejaVu Sans, embedded, so no system font is needed).

use std::path::{Path, PathBuf};

use gdaki_testkit::porttest::bench::{Measure, Row, Test};
use gdaki_testkit::porttest::Mode;
use plotters::prelude::*;
use plotters::style::FontStyle;

/// One panel: a test's rows, one line per mode.
struct Panel {
    title: &'static str,
    /// (mode, points (bytes, value)), points in size order.
    lines: Vec<(Mode, Vec<(f64, f64)>)>,
}

/// Where the bandwidth chart of `--plot PATH` goes: PATH's stem + "-bw.png", beside it.
pub fn bandwidth_path(path: &Path) -> PathBuf {
    let stem = path.file_stem().map_or_else(|| "gdaki-perf".into(), |s| s.to_string_lossy().into_owned());
    path.with_file_name(format!("{stem}-bw.png"))
}

/// Draws the latency chart (t_typical, µs) to `path` and the bandwidth chart (algbw, GB/s) to
/// [`bandwidth_path`], each only when the run has such rows. Returns the files written.
///
/// # Errors
/// One line: the font could not be loaded, or drawing/encoding/writing a PNG failed.
pub fn draw(path: &Path, tests: &[Test], rows: &[Row]) -> Result<Vec<PathBuf>, String> {
    plotters::style::register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular())
        .map_err(|_| "the embedded DejaVu Sans font does not load".to_string())?;
    let panels = |bandwidth: bool| -> Vec<Panel> {
        tests
            .iter()
            .filter(|t| t.is_bandwidth() == bandwidth)
            .map(|&test| Panel { title: test.name(), lines: lines(test, rows) })
            .filter(|p| !p.lines.is_empty())
            .collect()
    };
    let mut written = Vec::new();
    for (file, bandwidth, y_desc) in
        [(path.to_path_buf(), false, "t_typical [µs]"), (bandwidth_path(path), true, "algbw [GB/s]")]
    {
        let panels = panels(bandwidth);
        if !panels.is_empty() {
            draw_panels(&file, &panels, y_desc).map_err(|e| format!("--plot {}: {e}", file.display()))?;
            written.push(file);
        }
    }
    Ok(written)
}

/// `test`'s points per mode (modes in run order): bytes against t_typical or algbw.
fn lines(test: Test, rows: &[Row]) -> Vec<(Mode, Vec<(f64, f64)>)> {
    let mut out: Vec<(Mode, Vec<(f64, f64)>)> = Vec::new();
    for r in rows.iter().filter(|r| r.test == test) {
        let y = match &r.measure {
            Some(Measure::Latency(l)) => l.t_typical,
            Some(Measure::Bandwidth(b)) => b.gbps,
            None => continue,
        };
        match out.iter_mut().find(|(m, _)| *m == r.mode) {
            Some((_, pts)) => pts.push((r.bytes as f64, y)),
            None => out.push((r.mode, vec![(r.bytes as f64, y)])),
        }
    }
    for (_, pts) in &mut out {
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    out
}

/// The size axis' range around `values`: a factor of 2 either side of a single value, else 10% margins.
fn log_range(values: impl Iterator<Item = f64>) -> std::ops::Range<f64> {
    let (lo, hi) = values.filter(|v| *v > 0.0).fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if lo > hi {
        return 1.0..10.0;
    }
    if lo == hi {
        return lo / 2.0..hi * 2.0;
    }
    lo / 1.1..hi * 1.1
}

fn mode_color(mode: Mode) -> RGBColor {
    match mode {
        Mode::Host => RGBColor(0, 0, 0),
        Mode::HostNoAtomic => RGBColor(128, 128, 128),
        Mode::Exclusive => RGBColor(214, 39, 40),
        Mode::Block => RGBColor(31, 119, 180),
        Mode::Device => RGBColor(44, 160, 44),
    }
}

fn draw_panels(file: &Path, panels: &[Panel], y_desc: &str) -> Result<(), Box<dyn std::error::Error>> {
    let cols = panels.len().min(3);
    let nrows = panels.len().div_ceil(cols);
    let root = BitMapBackend::new(file, (560 * cols as u32, 420 * nrows as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    for (panel, area) in panels.iter().zip(root.split_evenly((nrows, cols))) {
        let xs = log_range(panel.lines.iter().flat_map(|(_, p)| p.iter().map(|q| q.0)));
        let top = panel.lines.iter().flat_map(|(_, p)| p.iter().map(|q| q.1)).fold(0.0, f64::max);
        let mut chart = ChartBuilder::on(&area)
            .caption(panel.title, ("sans-serif", 22))
            .margin(12)
            .x_label_area_size(45)
            .y_label_area_size(70)
            .build_cartesian_2d(xs.log_scale(), 0.0..(top * 1.15).max(1e-3))?;
        chart
            .configure_mesh()
            .x_desc("bytes (k = 1000)")
            .y_desc(y_desc)
            .x_label_formatter(&|x| label(*x))
            .y_label_formatter(&|y| label(*y))
            .label_style(("sans-serif", 13))
            .draw()?;
        for (mode, pts) in &panel.lines {
            let color = mode_color(*mode);
            chart
                .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))?
                .label(mode.label())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
            chart.draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 13))
            .draw()?;
    }
    root.present()?;
    Ok(())
}

/// An axis label: up to 3 significant digits, no float noise; sizes with k/M/G (powers of 1000, where the log
/// axis puts its marks).
fn label(x: f64) -> String {
    let (v, unit) = match x.abs() {
        a if a >= 1e9 => (x / 1e9, "G"),
        a if a >= 1e6 => (x / 1e6, "M"),
        a if a >= 1e3 => (x / 1e3, "k"),
        _ => (x, ""),
    };
    let digits = if v.abs() >= 100.0 || v == v.trunc() {
        0
    } else if v.abs() >= 10.0 {
        1
    } else {
        2
    };
    let s = format!("{v:.digits$}");
    let s = if s.contains('.') { s.trim_end_matches('0').trim_end_matches('.') } else { &s };
    format!("{s}{unit}")
}

#[cfg(test)]
mod tests {
    #[test]
    fn labels_have_no_float_noise() {
        let got: Vec<String> =
            [0.030000000000000002, 1.2, 1000.0, 100_000_000.0, 0.0, 12.5, 1.5e6].map(super::label).into();
        assert_eq!(got, ["0.03", "1.2", "1k", "100M", "0", "12.5", "1.5M"]);
    }
}
