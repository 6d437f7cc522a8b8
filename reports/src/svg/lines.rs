//! Line charts: bandwidth against message size (log2 x axis) and loss against step.

use super::{bytes_label, fmt_num, log2_ticks, nice_ticks, round, series_colour, ticks, Plot, Scale, Tick};

/// One line before layout.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    /// Drawn dashed (algbw beside busbw).
    pub dashed: bool,
    /// Index into the palette: series of one rank share a colour.
    pub colour: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Path {
    pub name: String,
    /// The `points` attribute of the polyline.
    pub points: String,
    pub dots: Vec<(f64, f64)>,
    pub colour: &'static str,
    pub dashed: bool,
    /// Where the legend entry sits.
    pub legend_y: f64,
    /// Whether it has a legend entry (the first [`LEGEND`] series do).
    pub legend: bool,
}

/// Legend entries drawn at most; the rest are counted in `more`.
pub const LEGEND: usize = 12;

#[derive(Debug, Clone, PartialEq)]
pub struct LineChart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub width: f64,
    pub height: f64,
    pub plot: Plot,
    pub paths: Vec<Path>,
    pub x_ticks: Vec<Tick>,
    pub y_ticks: Vec<Tick>,
    /// Series without a legend entry, and where their count is written.
    pub more: usize,
    pub more_y: f64,
}

/// Lines through each series' finite points (on a log2 x axis of byte sizes when `log2_x`,
/// where points at or below zero are left out too). None when no point is left.
pub fn line_chart(title: &str, x_label: &str, y_label: &str, series: &[Series], log2_x: bool) -> Option<LineChart> {
    let keep = |&(x, y): &(f64, f64)| x.is_finite() && y.is_finite() && (!log2_x || x > 0.0);
    let series: Vec<(&Series, Vec<(f64, f64)>)> = series
        .iter()
        .map(|s| (s, s.points.iter().copied().filter(keep).collect::<Vec<_>>()))
        .filter(|(_, p)| !p.is_empty())
        .collect();
    let all: Vec<(f64, f64)> = series.iter().flat_map(|(_, p)| p.iter().copied()).collect();
    if all.is_empty() {
        return None;
    }
    let (x0, x1) = all.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), p| (a.min(p.0), b.max(p.0)));
    let y1 = all.iter().map(|p| p.1).fold(f64::NEG_INFINITY, f64::max);
    let y0 = all.iter().map(|p| p.1).fold(0.0, f64::min);
    let y1 = if y1 <= y0 { y0 + 1.0 } else { y1 * 1.08 };
    let plot = Plot { left: 60.0, top: 26.0, right: 520.0, bottom: 230.0 };
    let x =
        if log2_x { Scale::log2(x0, x1, plot.left, plot.right) } else { Scale::linear(x0, x1, plot.left, plot.right) };
    let y = Scale::linear(y0, y1, plot.bottom, plot.top);
    let x_ticks =
        if log2_x { ticks(log2_ticks(x0, x1, 8), &x, bytes_label) } else { ticks(nice_ticks(x0, x1, 6), &x, fmt_num) };
    let y_ticks = ticks(nice_ticks(y0, y1, 4), &y, fmt_num);
    let paths = series
        .iter()
        .enumerate()
        .map(|(i, (s, pts))| {
            let dots: Vec<(f64, f64)> = pts.iter().map(|&(a, b)| (x.map(a), y.map(b))).collect();
            Path {
                name: s.name.clone(),
                points: dots.iter().map(|(a, b)| format!("{a},{b}")).collect::<Vec<_>>().join(" "),
                // Dots only where they stay readable.
                dots: if pts.len() <= 24 && series.len() <= LEGEND { dots } else { Vec::new() },
                colour: series_colour(s.colour),
                dashed: s.dashed,
                legend_y: round(plot.top + 6.0 + 15.0 * i as f64),
                legend: i < LEGEND,
            }
        })
        .collect();
    let shown = series.len().min(LEGEND);
    let height = (plot.bottom + 40.0).max(plot.top + 15.0 * (shown + 1) as f64 + 10.0);
    Some(LineChart {
        title: title.into(),
        x_label: x_label.into(),
        y_label: y_label.into(),
        width: plot.right + 150.0,
        height,
        plot,
        paths,
        x_ticks,
        y_ticks,
        more: series.len() - shown,
        more_y: round(plot.top + 10.0 + 15.0 * shown as f64),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(points: Vec<(f64, f64)>) -> Series {
        Series { name: "rank 0 busbw".into(), points, dashed: false, colour: 0 }
    }

    #[test]
    fn log2_axis_spaces_doubling_sizes_evenly() {
        let c = line_chart("t", "bytes", "GB/s", &[series(vec![(1024.0, 1.0), (4096.0, 2.0), (16384.0, 4.0)])], true)
            .expect("chart");
        let d = &c.paths[0].dots;
        assert_eq!(d[0].0, c.plot.left);
        assert_eq!(d[2].0, c.plot.right);
        assert!((d[1].0 - (c.plot.left + c.plot.right) / 2.0).abs() < 0.2);
        assert_eq!(c.x_ticks.first().map(|t| t.label.as_str()), Some("1 KiB"));
        assert_eq!(c.x_ticks.last().map(|t| t.label.as_str()), Some("16 KiB"));
        assert!(d[2].1 < d[0].1, "larger values sit higher");
        assert_eq!(c.paths[0].points.split(' ').count(), 3);
    }

    #[test]
    fn the_legend_stops_at_twelve_series() {
        let many: Vec<Series> = (0..40).map(|i| Series { colour: i, ..series(vec![(1.0, i as f64)]) }).collect();
        let c = line_chart("t", "x", "y", &many, false).expect("chart");
        assert_eq!(c.paths.len(), 40);
        assert_eq!(c.paths.iter().filter(|p| p.legend).count(), LEGEND);
        assert_eq!(c.more, 28);
        assert!(c.height < 300.0);
    }

    #[test]
    fn non_finite_and_non_positive_points_are_skipped() {
        let pts = vec![(0.0, 1.0), (1024.0, f64::NAN), (2048.0, f64::INFINITY), (4096.0, 3.0)];
        let c = line_chart("t", "bytes", "GB/s", &[series(pts.clone())], true).expect("chart");
        assert_eq!(c.paths[0].dots.len(), 1);
        // On a linear axis zero is a valid x.
        let c = line_chart("t", "step", "loss", &[series(pts)], false).expect("chart");
        assert_eq!(c.paths[0].dots.len(), 2);
        assert!(line_chart("t", "x", "y", &[], true).is_none());
        assert!(line_chart("t", "x", "y", &[series(vec![(f64::NAN, 1.0)])], true).is_none());
        // One point: centred, no division by zero.
        let one = line_chart("t", "x", "y", &[series(vec![(8.0, 2.0)])], true).expect("chart");
        assert!(one.paths[0].dots[0].0.is_finite() && one.paths[0].dots[0].1.is_finite());
    }
}
