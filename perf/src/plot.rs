//! `--plot`: latency vs size and bandwidth vs size, one panel per test, one line per mode, to PNG (plotters'
//! bitmap backend; text in DejaVu Sans, embedded, so no system font is needed).
//!
//! Sizes go on a log2 axis with ticks at powers of two, labelled in binary units (8, 512, 1K = 1 KiB, 64K,
//! 1M = 1 MiB): the sizes of the rows are powers of two, and powers of ten would put no tick on any of them.
//! Latency goes on a linear axis from 0; bandwidth on a log10 axis, since its rows span decades (a 1 KiB row
//! and a 128 MiB row differ a thousandfold, and so do the proxy and the shared-QP modes at 1 KiB), which a
//! linear axis would flatten to 0. Tick labels have the precision their spacing needs. One legend for the whole
//! figure, in a strip above the panels, where it covers no data.

use std::ops::Range;
use std::path::{Path, PathBuf};

use gdaki_testkit::porttest::bench::{Measure, Row, Test};
use gdaki_testkit::porttest::Mode;
use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint};
use plotters::prelude::*;
use plotters::style::FontStyle;

/// One panel: a test's rows, one line per mode.
struct Panel {
    title: &'static str,
    /// (mode, points (log2 bytes, y in axis units)), points in size order.
    lines: Vec<(Mode, Vec<(f64, f64)>)>,
}

/// Pixels of one panel.
const PANEL: (u32, u32) = (560, 420);
/// The legend strip above the panels: its padding (top and bottom together), the height of one row of entries,
/// and an entry's parts: the swatch (a line and a dot), the gap to its label, the space to the next entry.
const LEGEND_PAD: u32 = 18;
const LEGEND_ROW: u32 = 26;
const SWATCH: i32 = 28;
const SWATCH_GAP: i32 = 8;
const ENTRY_SPACE: i32 = 30;
/// Space around a panel's plot (margin) and for its y labels: what is left of [`PANEL`]'s width is the plot.
const MARGIN: u32 = 14;
const Y_LABELS: u32 = 72;
/// Least pixels from one size tick to the next (the widest label, "512K", is about 39 at the label size).
const TICK_SPACING: u32 = 50;
/// Font sizes: panel titles, axis descriptions, tick labels, legend.
const TITLE_PT: u32 = 21;
const DESC_PT: u32 = 15;
const LABEL_PT: u32 = 15;
const LEGEND_PT: u32 = 16;

/// Where the bandwidth chart of `--plot PATH` goes: PATH's stem + "-bw.png", beside it.
pub fn bandwidth_path(path: &Path) -> PathBuf {
    let stem = path.file_stem().map_or_else(|| "gdaki-perf".into(), |s| s.to_string_lossy().into_owned());
    path.with_file_name(format!("{stem}-bw.png"))
}

/// The charts `--plot path` draws for `tests`: the latency chart at `path` if a test is a latency one,
/// the bandwidth chart at [`bandwidth_path`] if one is a bandwidth one; `true` marks the bandwidth chart.
pub fn files(path: &Path, tests: &[Test]) -> Vec<(PathBuf, bool)> {
    [(path.to_path_buf(), false), (bandwidth_path(path), true)]
        .into_iter()
        .filter(|&(_, bandwidth)| tests.iter().any(|t| t.is_bandwidth() == bandwidth))
        .collect()
}

/// Refuses a `--plot` name that is not `.png` (the only format drawn), before a run: also the name given,
/// whose stem names a bandwidth-only run's chart (`PATH-bw.png`) whatever PATH ends in.
///
/// # Errors
/// One line naming the file.
pub fn check_name(file: &Path) -> Result<(), String> {
    match file.extension().is_some_and(|e| e.eq_ignore_ascii_case("png")) {
        true => Ok(()),
        false => Err(format!("--plot {}: charts are drawn as PNG: name a .png file", file.display())),
    }
}

/// Refuses, before a run, a chart file the run could not write at its end: one not named `.png` (the only
/// format drawn) or one that cannot be created. Opening it (without truncating) is the test; a file that was
/// not there is removed again, so that a chart whose rows all failed leaves no empty file behind.
///
/// # Errors
/// One line naming the file and why.
pub fn check_file(file: &Path) -> Result<(), String> {
    check_name(file)?;
    let existed = file.exists();
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(file)
        .map_err(|e| format!("--plot {}: {e}", file.display()))?;
    if !existed {
        // Best effort: an empty file left by a failed removal is overwritten by the chart or harmless.
        std::fs::remove_file(file).ok();
    }
    Ok(())
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
    for (file, bandwidth) in files(path, tests) {
        let panels = panels(bandwidth);
        if !panels.is_empty() {
            let (scale, x_desc, y_desc) = if bandwidth {
                (Scale::Log, "bytes per iteration, all QPs (1K = 1 KiB, 1M = 1 MiB)", "algbw [GB/s], log scale")
            } else {
                (Scale::Linear, "bytes per message (1K = 1 KiB = 1024 B, 1M = 1 MiB)", "t_typical [µs]")
            };
            draw_panels(&file, &panels, scale, x_desc, y_desc)
                .map_err(|e| format!("--plot {}: {e}", file.display()))?;
            written.push(file);
        }
    }
    Ok(written)
}

/// `test`'s points per mode (modes in run order): log2 of the bytes against t_typical, or against log10 of the
/// algbw (rows without a positive, finite algbw are left out: a log axis has no place for them).
fn lines(test: Test, rows: &[Row]) -> Vec<(Mode, Vec<(f64, f64)>)> {
    let mut out: Vec<(Mode, Vec<(f64, f64)>)> = Vec::new();
    for r in rows.iter().filter(|r| r.test == test && r.bytes > 0) {
        let y = match &r.measure {
            Some(Measure::Latency(l)) => l.t_typical,
            Some(Measure::Bandwidth(b)) if b.gbps > 0.0 => b.gbps.log10(),
            _ => continue,
        };
        if !y.is_finite() {
            continue;
        }
        let p = ((r.bytes as f64).log2(), y);
        match out.iter_mut().find(|(m, _)| *m == r.mode) {
            Some((_, pts)) => pts.push(p),
            None => out.push((r.mode, vec![p])),
        }
    }
    for (_, pts) in &mut out {
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    out
}

/// How a value axis maps its values.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Scale {
    /// From 0, linear.
    Linear,
    /// log10: the points' y are log10 of the value.
    Log,
}

/// An axis: its range (in axis units: log2 bytes, the value, or log10 of the value), where the labelled
/// ticks and the unlabelled grid lines go, and each tick's label.
#[derive(Clone, Debug, PartialEq)]
struct Axis {
    range: Range<f64>,
    ticks: Vec<f64>,
    light: Vec<f64>,
    labels: Vec<String>,
}

impl Axis {
    /// The label of the tick at `v` (the nearest tick: plotters hands back the values it was given).
    fn label(&self, v: f64) -> String {
        self.ticks
            .iter()
            .zip(&self.labels)
            .min_by(|a, b| (a.0 - v).abs().total_cmp(&(b.0 - v).abs()))
            .map_or_else(String::new, |(_, l)| l.clone())
    }
}

/// The axis as plotters' coordinate: linear in axis units, its ticks bold (and labelled), the rest light.
impl Ranged for Axis {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, v: &f64, limit: (i32, i32)) -> i32 {
        let span = self.range.end - self.range.start;
        if span <= 0.0 || !v.is_finite() {
            return (limit.0 + limit.1) / 2;
        }
        let f = ((v - self.range.start) / span).clamp(-1.0, 2.0);
        limit.0 + (f64::from(limit.1 - limit.0) * f).round() as i32
    }

    fn key_points<H: KeyPointHint>(&self, hint: H) -> Vec<f64> {
        if hint.weight().allow_light_points() {
            self.light.clone()
        } else {
            self.ticks.clone()
        }
    }

    fn range(&self) -> Range<f64> {
        self.range.clone()
    }
}

/// The size axis over `values` (log2 bytes): a margin either side (an octave around a single size), ticks at
/// powers of two every 1, 2, 4, 10 or 20 octaves, whichever is the densest with at most `max_ticks`, grid
/// lines at the other powers of two.
fn size_axis(values: impl Iterator<Item = f64>, max_ticks: usize) -> Axis {
    let (lo, hi) = values.fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let (lo, hi) = if lo > hi { (0.0, 10.0) } else { (lo, hi) };
    let margin = if hi - lo < 1e-9 { 1.0 } else { ((hi - lo) * 0.04).max(0.35) };
    let range = (lo - margin).max(-0.5)..hi + margin;
    let (first, last) = (range.start.ceil().max(0.0) as i32, range.end.floor() as i32);
    let count = |stride: i32| (first..=last).filter(|e| e % stride == 0).count();
    let stride = [1, 2, 4, 10, 20].into_iter().find(|&s| count(s) <= max_ticks.max(1)).unwrap_or(20);
    let (ticks, light): (Vec<i32>, Vec<i32>) = (first..=last).partition(|e| e % stride == 0);
    Axis {
        range,
        labels: ticks.iter().map(|&e| size_label(e)).collect(),
        ticks: ticks.into_iter().map(f64::from).collect(),
        light: light.into_iter().map(f64::from).collect(),
    }
}

/// 2^`exp` bytes in binary units: "8", "512", "1K" (KiB), "64K", "1M" (MiB), "2G" (GiB), "4T".
fn size_label(exp: i32) -> String {
    if !(0..64).contains(&exp) {
        return format!("2^{exp}");
    }
    let unit = (exp / 10).min(4);
    let value = 1u64 << (exp - 10 * unit);
    format!("{value}{}", ["", "K", "M", "G", "T"][unit as usize])
}

/// A linear axis from 0 to a little above `top`, ticks every 1, 2, 2.5 or 5 × 10^k (about six of them), each
/// label with as many decimals as that step needs and no more.
fn linear_axis(top: f64) -> Axis {
    let top = if top.is_finite() && top > 0.0 { top * 1.12 } else { 1.0 };
    let raw = top / 6.0;
    let exp = raw.log10().floor() as i32;
    let mag = 10f64.powi(exp);
    // (step in units of 10^exp, decimals it needs): 2.5 × 10^k needs one more than 10^k, 10 × 10^k one fewer.
    let (m, decimals) = [(1.0, -exp), (2.0, -exp), (2.5, 1 - exp), (5.0, -exp), (10.0, -exp - 1)]
        .into_iter()
        .find(|&(m, _)| m * mag >= raw)
        .unwrap_or((10.0, -exp - 1));
    let (step, decimals) = (m * mag, decimals.max(0) as usize);
    let n = (top / step + 1e-9).floor() as usize;
    let ticks: Vec<f64> = (0..=n).map(|i| i as f64 * step).collect();
    let light = ticks.iter().map(|t| t + step / 2.0).filter(|&t| t <= top).collect();
    Axis { range: 0.0..top, labels: ticks.iter().map(|t| format!("{t:.decimals$}")).collect(), ticks, light }
}

/// A log10 axis over `values` (log10 of the values): a margin either side (half a decade around a single
/// value), ticks at the powers of ten, or at 1, 2 and 5 × 10^k, or at most integers × 10^k, whichever is the
/// sparsest with enough ticks to read values off, grid lines at the other integers × 10^k; labels in plain
/// decimal notation ("0.002", "20", "1000").
fn log_axis(values: impl Iterator<Item = f64>) -> Axis {
    let (lo, hi) = values.fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let (lo, hi) = if lo > hi { (0.0, 1.0) } else { (lo, hi) };
    let margin = if hi - lo < 1e-9 { 0.5 } else { ((hi - lo) * 0.06).max(0.12) };
    let range = lo - margin..hi + margin;
    let decades = range.start.floor() as i32..=range.end.ceil() as i32;
    let in_range = |mantissas: &[i32]| {
        decades
            .clone()
            .flat_map(|k| mantissas.iter().map(move |&m| f64::from(m).log10() + f64::from(k)))
            .filter(|t| range.contains(t))
            .count()
    };
    // Powers of ten; with 1-2-5 when there are fewer than four; 1-2-3-4-5-6-8 when 1-2-5 gives fewer than
    // three (a range narrower than a decade; 7 and 9 would crowd their neighbours at the top of a decade).
    let mantissas: &[i32] = if in_range(&[1]) >= 4 {
        &[1]
    } else if in_range(&[1, 2, 5]) >= 3 {
        &[1, 2, 5]
    } else {
        &[1, 2, 3, 4, 5, 6, 8]
    };
    let mut axis = Axis { range: range.clone(), ticks: Vec::new(), light: Vec::new(), labels: Vec::new() };
    for k in decades {
        for m in 1..10 {
            let t = f64::from(m).log10() + f64::from(k);
            if !range.contains(&t) {
                continue;
            }
            if mantissas.contains(&m) {
                let decimals = (-k).max(0) as usize;
                axis.labels.push(format!("{:.decimals$}", f64::from(m) * 10f64.powi(k)));
                axis.ticks.push(t);
            } else {
                axis.light.push(t);
            }
        }
    }
    axis
}

fn mode_color(mode: Mode) -> RGBColor {
    match mode {
        Mode::Host => RGBColor(0, 0, 0),
        Mode::HostNoAtomic => RGBColor(128, 128, 128),
        Mode::Exclusive => RGBColor(214, 39, 40),
        Mode::Warp => RGBColor(255, 127, 14),
        Mode::Block => RGBColor(31, 119, 180),
        Mode::Device => RGBColor(44, 160, 44),
    }
}

fn draw_panels(
    file: &Path,
    panels: &[Panel],
    scale: Scale,
    x_desc: &str,
    y_desc: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    let cols = panels.len().min(3);
    let nrows = panels.len().div_ceil(cols);
    let mut modes: Vec<Mode> = Vec::new();
    for (mode, _) in panels.iter().flat_map(|p| &p.lines) {
        if !modes.contains(mode) {
            modes.push(*mode);
        }
    }
    let width = PANEL.0 * cols as u32;
    // The strip's height before any text can be measured: labels at a generous 10 px per character (DejaVu Sans
    // at the legend's size averages less), so that the measured entries need no more rows than this.
    let rough: Vec<i32> = modes.iter().map(|m| 10 * m.label().chars().count() as i32).collect();
    let legend_h = LEGEND_PAD + LEGEND_ROW * legend_rows(&rough, width as i32).len() as u32;
    let root = BitMapBackend::new(file, (width, legend_h + PANEL.1 * nrows as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    let (legend, body) = root.split_vertically(legend_h);
    draw_legend(&legend, &modes)?;
    let max_ticks = ((PANEL.0 - 2 * MARGIN - Y_LABELS) / TICK_SPACING) as usize;
    for (panel, area) in panels.iter().zip(body.split_evenly((nrows, cols))) {
        let points = || panel.lines.iter().flat_map(|(_, p)| p.iter().copied());
        let x = size_axis(points().map(|p| p.0), max_ticks);
        let y = match scale {
            Scale::Linear => linear_axis(points().map(|p| p.1).fold(0.0, f64::max)),
            Scale::Log => log_axis(points().map(|p| p.1)),
        };
        let mut chart = ChartBuilder::on(&area)
            .caption(panel.title, ("sans-serif", TITLE_PT))
            .margin(MARGIN)
            .x_label_area_size(48)
            .y_label_area_size(Y_LABELS)
            .build_cartesian_2d(x.clone(), y.clone())?;
        chart
            .configure_mesh()
            .x_desc(x_desc)
            .y_desc(y_desc)
            .x_label_formatter(&|v| x.label(*v))
            .y_label_formatter(&|v| y.label(*v))
            .label_style(("sans-serif", LABEL_PT))
            .axis_desc_style(("sans-serif", DESC_PT))
            .bold_line_style(BLACK.mix(0.18))
            .light_line_style(BLACK.mix(0.06))
            .draw()?;
        for (mode, pts) in &panel.lines {
            let color = mode_color(*mode);
            chart.draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))?;
            chart.draw_series(pts.iter().map(|&p| Circle::new(p, 4, color.filled())))?;
        }
    }
    root.present()?;
    Ok(())
}

/// Rows of legend entries whose labels are `widths` pixels wide, as many in a row as fit in `avail` (at least
/// one), in order: index ranges into `widths`.
fn legend_rows(widths: &[i32], avail: i32) -> Vec<Range<usize>> {
    let mut rows = Vec::new();
    let (mut start, mut used) = (0, 0);
    for (i, w) in widths.iter().enumerate() {
        let entry = SWATCH + SWATCH_GAP + w;
        if i > start && used + ENTRY_SPACE + entry > avail {
            rows.push(start..i);
            (start, used) = (i, 0);
        }
        used += if i > start { ENTRY_SPACE + entry } else { entry };
    }
    if start < widths.len() {
        rows.push(start..widths.len());
    }
    rows
}

/// The legend: one entry per mode (a line and a dot in its colour, its label), in centred rows across `area`.
fn draw_legend(
    area: &DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>,
    modes: &[Mode],
) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::style::text_anchor::{HPos, Pos, VPos};
    let font = ("sans-serif", LEGEND_PT).into_font().color(&BLACK).pos(Pos::new(HPos::Left, VPos::Center));
    let widths: Vec<i32> = modes
        .iter()
        .map(|m| area.estimate_text_size(m.label(), &font).map(|(w, _)| w as i32))
        .collect::<Result<_, _>>()?;
    let (w, _) = area.dim_in_pixel();
    for (row, range) in legend_rows(&widths, w as i32 - 8).into_iter().enumerate() {
        let total: i32 =
            widths[range.clone()].iter().map(|w| SWATCH + SWATCH_GAP + w + ENTRY_SPACE).sum::<i32>() - ENTRY_SPACE;
        let mut x = ((w as i32 - total) / 2).max(4);
        let y = (LEGEND_PAD / 2 + LEGEND_ROW * row as u32 + LEGEND_ROW / 2) as i32;
        for i in range {
            let color = mode_color(modes[i]);
            area.draw(&PathElement::new(vec![(x, y), (x + SWATCH, y)], color.stroke_width(3)))?;
            area.draw(&Circle::new((x + SWATCH / 2, y), 4, color.filled()))?;
            area.draw(&Text::new(modes[i].label(), (x + SWATCH + SWATCH_GAP, y), font.clone()))?;
            x += SWATCH + SWATCH_GAP + widths[i] + ENTRY_SPACE;
        }
    }
    Ok(())
}

/// `gdaki-perf coll --plot`: bus bandwidth vs size to `path` (PNG), one panel per op and algorithm, each
/// `(title, points)` with points (log2 bytes per rank, log10 busbw in GB/s), the style of the other charts.
///
/// # Errors
/// One line: the font could not be loaded, or drawing/encoding/writing the PNG failed.
pub fn draw_coll(path: &Path, panels: &[(String, Vec<(f64, f64)>)]) -> Result<(), String> {
    plotters::style::register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular())
        .map_err(|_| "the embedded DejaVu Sans font does not load".to_string())?;
    let panels: Vec<&(String, Vec<(f64, f64)>)> = panels.iter().filter(|p| !p.1.is_empty()).collect();
    if panels.is_empty() {
        return Err(format!("--plot {}: no rows with a bandwidth to draw", path.display()));
    }
    let draw = || -> Result<(), Box<dyn std::error::Error>> {
        let cols = panels.len().min(3);
        let nrows = panels.len().div_ceil(cols);
        let root = BitMapBackend::new(path, (PANEL.0 * cols as u32, PANEL.1 * nrows as u32)).into_drawing_area();
        root.fill(&WHITE)?;
        let max_ticks = ((PANEL.0 - 2 * MARGIN - Y_LABELS) / TICK_SPACING) as usize;
        for ((title, pts), area) in panels.iter().map(|p| (&p.0, &p.1)).zip(root.split_evenly((nrows, cols))) {
            let x = size_axis(pts.iter().map(|p| p.0), max_ticks);
            let y = log_axis(pts.iter().map(|p| p.1));
            let mut chart = ChartBuilder::on(&area)
                .caption(title.as_str(), ("sans-serif", TITLE_PT))
                .margin(MARGIN)
                .x_label_area_size(48)
                .y_label_area_size(Y_LABELS)
                .build_cartesian_2d(x.clone(), y.clone())?;
            chart
                .configure_mesh()
                .x_desc("bytes per rank (1K = 1 KiB, 1M = 1 MiB)")
                .y_desc("busbw [GB/s], log scale")
                .x_label_formatter(&|v| x.label(*v))
                .y_label_formatter(&|v| y.label(*v))
                .label_style(("sans-serif", LABEL_PT))
                .axis_desc_style(("sans-serif", DESC_PT))
                .bold_line_style(BLACK.mix(0.18))
                .light_line_style(BLACK.mix(0.06))
                .draw()?;
            let color = RGBColor(31, 119, 180);
            chart.draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))?;
            chart.draw_series(pts.iter().map(|&p| Circle::new(p, 4, color.filled())))?;
        }
        root.present()?;
        Ok(())
    };
    draw().map_err(|e| format!("--plot {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn legend_rows_wrap_to_fit() {
        // An entry is 36 px + its label, 30 px between entries.
        assert_eq!(legend_rows(&[40, 40, 40], 1000), vec![0..3]);
        assert_eq!(legend_rows(&[40, 40, 40], 76 + 30 + 76), [0..2, 2..3]);
        assert_eq!(legend_rows(&[40, 40, 40], 76 + 30 + 75), [0..1, 1..2, 2..3]);
        // Wider than the space: alone in its row.
        assert_eq!(legend_rows(&[500, 40], 100), [0..1, 1..2]);
        assert!(legend_rows(&[], 100).is_empty());
    }

    #[test]
    fn sizes_are_powers_of_two_in_binary_units() {
        let got: Vec<String> = [0, 3, 9, 10, 12, 19, 20, 27, 30, 40].map(size_label).into();
        assert_eq!(got, ["1", "8", "512", "1K", "4K", "512K", "1M", "128M", "1G", "1T"]);
    }

    #[test]
    fn size_ticks_thin_out_to_fit() {
        // The default latency sizes (8 B, 1 KiB, 4 KiB): every power of two from 8 to 4K fits in 10 ticks.
        let a = size_axis([3.0, 10.0, 12.0].into_iter(), 10);
        assert_eq!(a.labels, ["8", "16", "32", "64", "128", "256", "512", "1K", "2K", "4K"]);
        assert!(a.light.is_empty());
        // `-a` latency (8 B to 1 MiB) with room for 7: every 4th octave, the others as grid lines.
        let a = size_axis((3..=20).map(f64::from), 7);
        assert_eq!(a.labels, ["16", "256", "4K", "64K", "1M"]);
        assert_eq!(a.light.len(), 18 - 5);
        // Bandwidth, 1 KiB to 128 MiB, room for 7.
        let a = size_axis([10.0, 16.0, 20.0, 22.0, 27.0].into_iter(), 7);
        assert_eq!(a.labels, ["4K", "64K", "1M", "16M"]);
        // One size: an octave either side.
        let a = size_axis([10.0].into_iter(), 7);
        assert_eq!((a.range.clone(), a.labels.clone()), (9.0..11.0, vec!["512".into(), "1K".into(), "2K".into()]));
        assert_eq!(a.label(10.0), "1K");
    }

    #[test]
    fn linear_labels_have_the_step_precision() {
        // 0..45 µs: steps of 10, no decimals.
        let a = linear_axis(45.0);
        assert_eq!(a.labels, ["0", "10", "20", "30", "40", "50"]);
        // Small values keep enough digits to tell ticks apart (no "0.01, 0.01, 0.02").
        let a = linear_axis(0.0042);
        assert_eq!(a.labels, ["0.000", "0.001", "0.002", "0.003", "0.004"]);
        let a = linear_axis(1.2);
        assert_eq!(a.labels, ["0.00", "0.25", "0.50", "0.75", "1.00", "1.25"]);
        let a = linear_axis(0.9);
        assert_eq!(a.labels, ["0.0", "0.2", "0.4", "0.6", "0.8", "1.0"]);
        let a = linear_axis(13.0);
        assert_eq!(a.labels, ["0.0", "2.5", "5.0", "7.5", "10.0", "12.5"]);
        assert_eq!(linear_axis(0.0).range, 0.0..1.0);
        let labels = linear_axis(f64::NAN).labels;
        assert!(labels.windows(2).all(|w| w[0] != w[1]), "{labels:?}");
    }

    #[test]
    fn log_ticks_are_decades_with_plain_labels() {
        // bibw at 1 KiB: proxy modes near 0.09 GB/s, the shared-QP modes near 0.0008: two decades, so 1-2-5.
        let a = log_axis([0.09f64.log10(), 0.0008f64.log10()].into_iter());
        assert_eq!(a.labels, ["0.001", "0.002", "0.005", "0.01", "0.02", "0.05", "0.1"]);
        // 0.05 to 1500 GB/s: decades only.
        let a = log_axis([0.05f64.log10(), 1500f64.log10()].into_iter());
        assert_eq!(a.labels, ["0.1", "1", "10", "100", "1000"]);
        assert!(a.labels.windows(2).all(|w| w[0] != w[1]));
        // One value: half a decade either side, still at least two ticks.
        let a = log_axis([2f64.log10()].into_iter());
        assert_eq!(a.labels, ["1", "2", "5"]);
        // Less than a decade, with one 1-2-5 in it: most integers × 10^k.
        let a = log_axis([0.0046f64.log10(), 0.0062f64.log10()].into_iter());
        assert_eq!(a.labels, ["0.004", "0.005", "0.006", "0.008"]);
        assert_eq!(a.light.len(), 1);
    }
}
