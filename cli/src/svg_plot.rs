//! Line charts written as SVG files, for the figures of the benchmarks.
//!
//! Built on `plotters` with its SVG backend only (no default features): text becomes SVG
//! `<text>` elements that the viewer lays out, with plotters' built-in size estimate for the
//! layout, so no font is loaded and no system library is needed. A chart is a set of labelled
//! series of (x, y) points drawn as lines with a dot on each point (so a single point shows);
//! either axis may be logarithmic, where points with a non-positive (or non-finite) coordinate
//! are left out. [`write_svg_grid`] puts several charts side by side as small multiples.

use std::error::Error;
use std::path::Path;

use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// Width and height of one chart (one panel of a grid), in SVG pixels.
pub const PANEL_WIDTH: u32 = 640;
pub const PANEL_HEIGHT: u32 = 420;

/// Series colours, in order: the Okabe-Ito palette (distinguishable with colour blindness).
const COLORS: [RGBColor; 8] = [
    RGBColor(0, 114, 178),
    RGBColor(213, 94, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(230, 159, 0),
    RGBColor(86, 180, 233),
    RGBColor(240, 228, 66),
    RGBColor(0, 0, 0),
];

/// One line of a chart.
#[derive(Clone, Debug, Default)]
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

/// One line chart.
#[derive(Clone, Debug, Default)]
pub struct Chart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub log_x: bool,
    pub log_y: bool,
    pub series: Vec<Series>,
}

/// Writes `chart` to `path` as an SVG of one panel.
pub fn write_svg(chart: &Chart, path: &Path) -> Result<(), Box<dyn Error>> {
    write_svg_grid(std::slice::from_ref(chart), 1, path)
}

/// Writes `charts` to `path` as one SVG, `cols` panels a row (row by row; an empty slice gives
/// an empty panel).
pub fn write_svg_grid(charts: &[Chart], cols: usize, path: &Path) -> Result<(), Box<dyn Error>> {
    write_panels(charts, cols, path, draw_chart)
}

/// Draws `items` into one SVG at `path`, `cols` panels a row, each panel by `draw`.
/// Draws one item into its panel.
type DrawPanel<T> = fn(&T, &Panel) -> Result<(), Box<dyn Error>>;

fn write_panels<T>(items: &[T], cols: usize, path: &Path, draw: DrawPanel<T>) -> Result<(), Box<dyn Error>> {
    let cols = cols.clamp(1, items.len().max(1));
    let rows = items.len().div_ceil(cols).max(1);
    let root = SVGBackend::new(path, (PANEL_WIDTH * cols as u32, PANEL_HEIGHT * rows as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    for (item, panel) in items.iter().zip(root.split_evenly((rows, cols))) {
        draw(item, &panel)?;
    }
    root.present().map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(())
}

type Panel<'a> = DrawingArea<SVGBackend<'a>, Shift>;

/// Every chart's frame: its caption, margins and axis label areas.
fn builder<'a, 'b>(plot: &'a Panel<'b>, title: &str) -> ChartBuilder<'a, 'b, SVGBackend<'b>> {
    let mut b = ChartBuilder::on(plot);
    b.caption(title, ("sans-serif", 22)).margin(12).margin_right(32).x_label_area_size(44).y_label_area_size(72);
    b
}

/// One grouped bar chart: a group of bars per category along x, one bar per series in each
/// (throughput per commit mode, per store, per operation).
#[derive(Clone, Debug, Default)]
pub struct Bars {
    pub title: String,
    pub y_label: String,
    pub log_y: bool,
    pub categories: Vec<String>,
    /// A label and one value per category (NaN where the series has none: no bar).
    pub series: Vec<(String, Vec<f64>)>,
}

/// Writes `charts` to `path` as one SVG, `cols` panels a row.
pub fn write_bars_grid(charts: &[Bars], cols: usize, path: &Path) -> Result<(), Box<dyn Error>> {
    write_panels(charts, cols, path, draw_bars)
}

/// Share of a category's width its bars take (the rest separates the groups).
const GROUP_WIDTH: f64 = 0.8;

fn draw_bars(chart: &Bars, panel: &Panel) -> Result<(), Box<dyn Error>> {
    let keep = |v: f64| v.is_finite() && (!chart.log_y || v > 0.0);
    let y = axis_range(chart.series.iter().flat_map(|(_, v)| v.iter().copied().filter(|&v| keep(v))), chart.log_y, true);
    // Categories sit at 0, 1, 2, ...: ticks at integers carry their names.
    let x = -0.5..chart.categories.len().max(1) as f64 - 0.5;
    if chart.log_y {
        draw_bars_in(chart, panel, x, y.clone().log_scale(), y.start, keep)
    } else {
        draw_bars_in(chart, panel, x, y.clone(), y.start.max(0.0), keep)
    }
}

fn draw_bars_in<Y>(
    chart: &Bars,
    panel: &Panel,
    x: std::ops::Range<f64>,
    y: Y,
    base: f64,
    keep: impl Fn(f64) -> bool,
) -> Result<(), Box<dyn Error>>
where
    Y: AsRangedCoord<Value = f64>,
    Y::CoordDescType: ValueFormatter<f64>,
{
    let legend_series: Vec<(&str, Vec<(f64, f64)>)> = chart.series.iter().map(|(l, _)| (l.as_str(), Vec::new())).collect();
    let height = panel.dim_in_pixel().1;
    let (plot, legend) = panel.split_vertically(height.saturating_sub(legend_height(&legend_series, panel)));
    let mut ctx = builder(&plot, &chart.title).build_cartesian_2d(x, y)?;
    let name = |v: &f64| {
        let i = v.round();
        if (v - i).abs() < 1e-9 && i >= 0.0 { chart.categories.get(i as usize).cloned().unwrap_or_default() } else { String::new() }
    };
    ctx.configure_mesh()
        .y_desc(&chart.y_label)
        .x_labels(chart.categories.len().max(1))
        .x_label_formatter(&name)
        .y_label_formatter(&|v| tick(*v))
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 16))
        .disable_x_mesh()
        .light_line_style(WHITE.mix(0.0))
        .draw()?;
    let width = GROUP_WIDTH / chart.series.len().max(1) as f64;
    for (s, (_, values)) in chart.series.iter().enumerate() {
        let color = COLORS[s % COLORS.len()];
        let bars = values.iter().enumerate().filter(|&(_, &v)| keep(v)).map(|(c, &v)| {
            let left = c as f64 - GROUP_WIDTH / 2.0 + s as f64 * width;
            Rectangle::new([(left, base), (left + width * 0.95, v)], color.filled())
        });
        ctx.draw_series(bars)?;
    }
    for (i, (label, x, y)) in legend_layout(&legend_series, panel).into_iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        legend.draw(&Rectangle::new([(x, y - 6), (x + LEGEND_LINE, y + 6)], color.filled()))?;
        let style = ("sans-serif", 15).into_font().color(&BLACK).pos(Pos::new(HPos::Left, VPos::Center));
        legend.draw(&Text::new(label, (x + LEGEND_LINE + 6, y), style))?;
    }
    Ok(())
}

fn draw_chart(chart: &Chart, panel: &Panel) -> Result<(), Box<dyn Error>> {
    let keep = |v: f64, log: bool| v.is_finite() && (!log || v > 0.0);
    let series: Vec<(&str, Vec<(f64, f64)>)> = chart
        .series
        .iter()
        .map(|s| {
            let points = s.points.iter().copied().filter(|&(x, y)| keep(x, chart.log_x) && keep(y, chart.log_y));
            (s.label.as_str(), points.collect())
        })
        .collect();
    let x = axis_range(series.iter().flat_map(|(_, p)| p.iter().map(|&(x, _)| x)), chart.log_x, false);
    let y = axis_range(series.iter().flat_map(|(_, p)| p.iter().map(|&(_, y)| y)), chart.log_y, true);
    // The four axis kinds are four coordinate types.
    match (chart.log_x, chart.log_y) {
        (false, false) => draw_in(chart, &series, panel, x, y),
        (false, true) => draw_in(chart, &series, panel, x, y.log_scale()),
        (true, false) => draw_in(chart, &series, panel, x.log_scale(), y),
        (true, true) => draw_in(chart, &series, panel, x.log_scale(), y.log_scale()),
    }
}

/// The axis range over `values` (already filtered): the data range, a y range padded by 5%
/// (and reaching down to 0 on a linear axis of non-negative values), never empty.
fn axis_range(values: impl Iterator<Item = f64>, log: bool, is_y: bool) -> std::ops::Range<f64> {
    let (lo, hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if lo > hi {
        return if log { 1.0..10.0 } else { 0.0..1.0 };
    }
    if log {
        let (lo, hi) = if is_y { (lo / 1.2, hi * 1.2) } else { (lo, hi) };
        return if lo < hi { lo..hi } else { lo / 2.0..hi * 2.0 };
    }
    let lo = if is_y && lo >= 0.0 { 0.0 } else { lo };
    let pad = if is_y { (hi - lo) * 0.05 } else { 0.0 };
    if lo < hi {
        lo - if lo == 0.0 { 0.0 } else { pad }..hi + pad
    } else {
        let half = if lo == 0.0 { 1.0 } else { lo.abs() / 2.0 };
        lo - half..hi + half
    }
}

fn draw_in<X, Y>(
    chart: &Chart,
    series: &[(&str, Vec<(f64, f64)>)],
    panel: &Panel,
    x: X,
    y: Y,
) -> Result<(), Box<dyn Error>>
where
    X: AsRangedCoord<Value = f64>,
    Y: AsRangedCoord<Value = f64>,
    X::CoordDescType: ValueFormatter<f64>,
    Y::CoordDescType: ValueFormatter<f64>,
{
    let height = panel.dim_in_pixel().1;
    let (plot, legend) = panel.split_vertically(height.saturating_sub(legend_height(series, panel)));
    let mut ctx = builder(&plot, &chart.title).build_cartesian_2d(x, y)?;
    ctx.configure_mesh()
        .x_desc(&chart.x_label)
        .y_desc(&chart.y_label)
        .x_label_formatter(&|v| tick(*v))
        .y_label_formatter(&|v| tick(*v))
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 16))
        .light_line_style(WHITE.mix(0.0))
        .draw()?;
    for (i, (_, points)) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        ctx.draw_series(LineSeries::new(points.iter().copied(), color.stroke_width(2)))?;
        ctx.draw_series(points.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
    }
    // The legend goes in a strip under the plot, where it hides no data.
    for (i, (label, x, y)) in legend_layout(series, panel).into_iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        legend.draw(&PathElement::new([(x, y), (x + LEGEND_LINE, y)], color.stroke_width(2)))?;
        legend.draw(&Circle::new((x + LEGEND_LINE / 2, y), 3, color.filled()))?;
        let style = ("sans-serif", 15).into_font().color(&BLACK).pos(Pos::new(HPos::Left, VPos::Center));
        legend.draw(&Text::new(label, (x + LEGEND_LINE + 6, y), style))?;
    }
    Ok(())
}

/// Legend geometry: a row is LEGEND_ROW pixels high; an entry is a line of LEGEND_LINE pixels,
/// its label (about LEGEND_CHAR pixels a character at 15 px) and LEGEND_GAP before the next.
const LEGEND_ROW: i32 = 22;
const LEGEND_LINE: i32 = 20;
const LEGEND_CHAR: i32 = 8;
const LEGEND_GAP: i32 = 24;

/// Each series' label and where its legend entry starts in the strip: entries left to right,
/// wrapping to a new row where the panel is full.
fn legend_layout<'s>(series: &[(&'s str, Vec<(f64, f64)>)], panel: &Panel) -> Vec<(&'s str, i32, i32)> {
    let width = panel.dim_in_pixel().0 as i32;
    let (mut x, mut row) = (LEGEND_GAP, 0);
    let mut entries = Vec::with_capacity(series.len());
    for &(label, _) in series {
        let w = LEGEND_LINE + 6 + LEGEND_CHAR * label.chars().count() as i32 + LEGEND_GAP;
        if x > LEGEND_GAP && x + w > width {
            (x, row) = (LEGEND_GAP, row + 1);
        }
        entries.push((label, x, row * LEGEND_ROW + LEGEND_ROW / 2));
        x += w;
    }
    entries
}

fn legend_height(series: &[(&str, Vec<(f64, f64)>)], panel: &Panel) -> u32 {
    let rows = legend_layout(series, panel).last().map_or(0, |&(_, _, y)| y / LEGEND_ROW + 1);
    (rows * LEGEND_ROW + if rows > 0 { 6 } else { 0 }) as u32
}

/// A tick label: short, with an exponent for very large or very small magnitudes.
fn tick(v: f64) -> String {
    let a = v.abs();
    if a == 0.0 {
        "0".into()
    } else if !(1e-3..1e5).contains(&a) {
        format!("{v:.1e}").replace(".0e", "e")
    } else if a >= 100.0 || v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chart(title: &str, log_x: bool, log_y: bool) -> Chart {
        Chart {
            title: title.into(),
            x_label: "snapshot interval (updates)".into(),
            y_label: "throughput (updates/s)".into(),
            log_x,
            log_y,
            series: vec![
                Series { label: "memcpy".into(), points: vec![(10.0, 5e6), (100.0, 7e6), (1000.0, 9e6)] },
                Series { label: "fork".into(), points: vec![(10.0, 1e5), (100.0, 2e6), (1000.0, 8e6)] },
            ],
        }
    }

    fn read(path: &Path) -> String {
        let svg = std::fs::read_to_string(path).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(80)]);
        assert!(svg.trim_end().ends_with("</svg>"));
        svg
    }

    /// The text elements' contents (plotters writes each on a line of its own).
    fn texts(svg: &str) -> Vec<&str> {
        svg.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('<')).collect()
    }

    /// Dots drawn: one per point, plus one in each legend entry.
    fn dots(svg: &str) -> usize {
        svg.matches("<circle").count()
    }

    #[test]
    fn a_chart_has_its_title_labels_and_series() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("chart.svg");
        write_svg(&chart("uniform & <co>", false, false), &path).unwrap();
        let svg = read(&path);
        let texts = texts(&svg);
        for text in
            ["uniform &amp; &lt;co&gt;", "memcpy", "fork", "snapshot interval (updates)", "throughput (updates/s)"]
        {
            assert!(texts.contains(&text), "{text} missing from {texts:?}");
        }
        assert!(svg.contains("stroke=\"#0072B2\" stroke-width=\"2\" points="), "no line drawn");
        assert_eq!(dots(&svg), 3 + 3 + 2);
    }

    #[test]
    fn a_bar_chart_has_a_bar_per_value_and_names_its_categories() {
        let dir = tempfile::tempdir().unwrap();
        for log_y in [false, true] {
            let path = dir.path().join(format!("bars-{log_y}.svg"));
            let bars = Bars {
                title: "txn/s per commit mode".into(),
                y_label: "txn/s".into(),
                log_y,
                categories: vec!["sync".into(), "async".into(), "off".into()],
                series: vec![("1 thread".into(), vec![5e3, 4e5, 6e5]), ("2 threads".into(), vec![7e3, f64::NAN, 9e5])],
            };
            write_bars_grid(&[bars.clone(), bars], 2, &path).unwrap();
            let svg = read(&path);
            let texts = texts(&svg);
            for text in ["sync", "async", "off", "1 thread", "2 threads", "txn/s", "txn/s per commit mode"] {
                assert!(texts.contains(&text), "{text} missing from {texts:?}");
            }
            // Five bars a panel (the NaN has none) and a legend swatch per series, two panels;
            // plus the background rectangle.
            assert_eq!(svg.matches("<rect").count(), 2 * (5 + 2) + 1, "log_y {log_y}");
        }
    }

    #[test]
    fn a_grid_has_every_panel() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("grid.svg");
        let charts: Vec<Chart> = ["uniform", "sorted", "zipf", "self-similar", "moving-cluster"]
            .iter()
            .map(|t| chart(t, true, true))
            .collect();
        write_svg_grid(&charts, 3, &path).unwrap();
        let svg = read(&path);
        let texts = texts(&svg);
        for title in ["uniform", "sorted", "zipf", "self-similar", "moving-cluster"] {
            assert_eq!(texts.iter().filter(|&&t| t == title).count(), 1, "{title} in {texts:?}");
        }
        for label in ["memcpy", "fork"] {
            assert_eq!(texts.iter().filter(|&&t| t == label).count(), 5, "{label}: one legend a panel");
        }
        assert_eq!(dots(&svg), 5 * (3 + 3 + 2));
        assert!(svg.contains(&format!("width=\"{}\"", 3 * PANEL_WIDTH)));
        assert!(svg.contains(&format!("height=\"{}\"", 2 * PANEL_HEIGHT)));
    }

    #[test]
    fn empty_and_degenerate_charts_do_not_panic() {
        let dir = tempfile::tempdir().unwrap();
        let p = |n: &str| dir.path().join(n);
        for (log_x, log_y) in [(false, false), (false, true), (true, false), (true, true)] {
            // No series, an empty series, a single point, a flat line at 0, NaN and infinity.
            let mut c = chart("degenerate", log_x, log_y);
            write_svg(&Chart { series: vec![], ..c.clone() }, &p("none.svg")).unwrap();
            c.series = vec![
                Series { label: "empty".into(), points: vec![] },
                Series { label: "one".into(), points: vec![(5.0, 5.0)] },
            ];
            write_svg(&c, &p("one.svg")).unwrap();
            assert_eq!(dots(&read(&p("one.svg"))), 1 + 2, "the single point shows");
            c.series =
                vec![Series { label: "flat".into(), points: vec![(0.0, 0.0), (1.0, 0.0), (f64::NAN, f64::INFINITY)] }];
            write_svg(&c, &p("flat.svg")).unwrap();
            let flat = read(&p("flat.svg"));
            assert!(texts(&flat).contains(&"flat"));
            // On a log axis the zeros are left out; NaN and infinity always are.
            let kept = match (log_x, log_y) {
                (false, false) => 2,
                (true, false) => 1,
                (_, true) => 0,
            };
            assert_eq!(dots(&flat), kept + 1);
        }
        write_svg_grid(&[], 3, &p("empty-grid.svg")).unwrap();
        read(&p("empty-grid.svg"));
        write_svg_grid(&[chart("a", false, false)], 0, &p("zero-cols.svg")).unwrap();
        read(&p("zero-cols.svg"));
    }

    #[test]
    fn log_axes_leave_out_non_positive_points() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log.svg");
        let mut c = chart("log", true, true);
        c.series[0].points.extend([(0.0, 1.0), (-5.0, 3.0), (20.0, 0.0), (30.0, -1.0)]);
        write_svg(&c, &path).unwrap();
        // Only the positive points are drawn: three a series, and the legend's two.
        assert_eq!(dots(&read(&path)), 3 + 3 + 2);
        // On linear axes all are.
        (c.log_x, c.log_y) = (false, false);
        write_svg(&c, &path).unwrap();
        assert_eq!(dots(&read(&path)), 7 + 3 + 2);
    }

    #[test]
    fn tick_labels_are_short() {
        assert_eq!(tick(0.0), "0");
        assert_eq!(tick(1000.0), "1000");
        assert_eq!(tick(2.5), "2.5");
        assert_eq!(tick(0.125), "0.125");
        assert_eq!(tick(1234.56), "1235");
        assert_eq!(tick(1e7), "1e7");
        assert_eq!(tick(2.5e5), "2.5e5");
        assert_eq!(tick(10_000.0), "10000");
    }
}
