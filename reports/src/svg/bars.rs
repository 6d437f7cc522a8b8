//! Per-rank bar charts with the expected value and the peers' median drawn as marked lines.

use super::{fmt_num, nice_ticks, round, ticks, Plot, Scale, Tick};

/// One rank's bar before layout: its label, figure and CSS class (`ok`, `warning`, `critical`).
#[derive(Debug, Clone, PartialEq)]
pub struct BarInput {
    pub label: String,
    pub value: f64,
    pub class: &'static str,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Bar {
    pub x: f64,
    pub y: f64,
    pub w: f64,
    pub h: f64,
    /// The middle of the bar, for its labels.
    pub cx: f64,
    pub class: &'static str,
    pub label: String,
    pub value: String,
    /// Whether the bar is wide enough for its value above it.
    pub show_value: bool,
    /// Whether its label is drawn below it (every k-th when bars are narrow).
    pub show_label: bool,
}

/// A horizontal reference line across the plot (the expected value, the peers' median).
#[derive(Debug, Clone, PartialEq)]
pub struct RefLine {
    pub y: f64,
    pub class: &'static str,
    pub label: String,
    /// Where its label sits: at the line, or moved apart from a label too close to it.
    pub label_y: f64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct BarChart {
    pub title: String,
    pub width: f64,
    pub height: f64,
    pub plot: Plot,
    pub bars: Vec<Bar>,
    pub lines: Vec<RefLine>,
    pub y_ticks: Vec<Tick>,
}

const HEIGHT: f64 = 220.0;

/// The least vertical distance between the labels of two reference lines.
const LABEL_GAP: f64 = 13.0;

/// Bars from zero for every finite figure (others are left out), scaled to the largest of the
/// figures and the reference values. None when no figure is finite.
pub fn bar_chart(title: &str, input: &[BarInput], expected: Option<f64>, median: Option<f64>) -> Option<BarChart> {
    let bars: Vec<&BarInput> = input.iter().filter(|b| b.value.is_finite()).collect();
    if bars.is_empty() {
        return None;
    }
    let refs = [expected, median].into_iter().flatten().filter(|v| v.is_finite());
    let top = bars.iter().map(|b| b.value).chain(refs).fold(0.0, f64::max);
    let bottom = bars.iter().map(|b| b.value).fold(0.0, f64::min);
    let top = if top == bottom { bottom + 1.0 } else { top * 1.08 };
    // Many ranks: narrower slots (the chart stays under ~800 units wide), labels thinned.
    let slot = (720.0 / bars.len() as f64).clamp(2.0, 90.0);
    let every = (28.0 / slot).ceil() as usize;
    let fill = if slot < 8.0 { 0.9 } else { 0.64 };
    let plot = Plot { left: 56.0, top: 26.0, right: 56.0 + slot * bars.len() as f64, bottom: HEIGHT - 34.0 };
    let y = Scale::linear(bottom, top, plot.bottom, plot.top);
    let y_ticks = ticks(nice_ticks(bottom, top, 4), &y, fmt_num);
    let zero = y.map(0.0);
    let bars = bars
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let x = plot.left + slot * i as f64 + slot * (1.0 - fill) / 2.0;
            let top = y.map(b.value);
            Bar {
                x: round(x),
                y: top.min(zero),
                w: round(slot * fill),
                h: round((zero - top).abs()),
                cx: round(x + slot * fill / 2.0),
                class: b.class,
                label: b.label.clone(),
                value: fmt_num(b.value),
                show_value: slot >= 28.0,
                show_label: i % every.max(1) == 0,
            }
        })
        .collect();
    let mut lines = Vec::new();
    if let Some(e) = expected.filter(|v| v.is_finite()) {
        lines.push(RefLine {
            y: y.map(e),
            label_y: y.map(e),
            class: "expected",
            label: format!("expected {}", fmt_num(e)),
        });
    }
    if let Some(m) = median.filter(|v| v.is_finite()) {
        lines.push(RefLine {
            y: y.map(m),
            label_y: y.map(m),
            class: "median",
            label: format!("median {}", fmt_num(m)),
        });
    }
    // Two reference values close together (a median at its expected value): their labels
    // move apart so both stay readable.
    if let [a, b] = &mut lines[..] {
        let gap = (a.y - b.y).abs();
        if gap < LABEL_GAP {
            let mid = (a.y + b.y) / 2.0;
            let (upper, lower) = if a.y <= b.y { (a, b) } else { (b, a) };
            upper.label_y = round(mid - LABEL_GAP / 2.0);
            lower.label_y = round(mid + LABEL_GAP / 2.0);
        }
    }
    Some(BarChart {
        // Wide enough for the title (about 7 units per character at its size).
        width: (plot.right + 100.0).max(plot.left + 7.0 * title.chars().count() as f64),
        title: title.into(),
        height: HEIGHT,
        plot,
        bars,
        lines,
        y_ticks,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(values: &[f64]) -> Vec<BarInput> {
        values
            .iter()
            .enumerate()
            .map(|(i, v)| BarInput { label: format!("rank {i}"), value: *v, class: "ok" })
            .collect()
    }

    #[test]
    fn bars_scale_to_the_largest_figure_and_reference_lines() {
        let c = bar_chart("t", &input(&[10.0, 5.0]), Some(20.0), Some(7.5)).expect("chart");
        assert_eq!(c.bars.len(), 2);
        // The expected value is the top of the domain (x 1.08): the full bar is half its height.
        let full = c.plot.bottom - c.plot.top;
        let expected_y = c.lines[0].y;
        assert!((c.plot.bottom - expected_y - full / 1.08).abs() < 0.2);
        assert!((c.bars[0].h - full / 1.08 / 2.0).abs() < 0.2, "{:?}", c.bars[0]);
        assert!((c.bars[1].h * 2.0 - c.bars[0].h).abs() < 0.3);
        assert_eq!(c.bars[0].y + c.bars[0].h, c.plot.bottom);
        assert_eq!(c.lines[0].label, "expected 20");
        assert_eq!(c.lines[1].class, "median");
    }

    #[test]
    fn empty_non_finite_and_single_figures() {
        assert!(bar_chart("t", &[], None, None).is_none());
        assert!(bar_chart("t", &input(&[f64::NAN, f64::INFINITY]), Some(1.0), None).is_none());
        let c = bar_chart("t", &input(&[f64::NAN, 3.0]), None, Some(f64::NAN)).expect("chart");
        assert_eq!(c.bars.len(), 1);
        assert_eq!(c.bars[0].label, "rank 1");
        assert!(c.lines.is_empty());
        // One rank, zero: a flat bar on the axis, not a division by zero.
        let z = bar_chart("t", &input(&[0.0]), None, None).expect("chart");
        assert_eq!(z.bars[0].h, 0.0);
        assert!(z.bars[0].y.is_finite());
    }

    #[test]
    fn close_reference_labels_move_apart_and_the_title_fits() {
        let input: Vec<BarInput> = [694.0, 679.0]
            .iter()
            .enumerate()
            .map(|(i, &v)| BarInput { label: format!("rank {i}"), value: v, class: "ok" })
            .collect();
        let title = "all-reduce: busbw GB/s at the largest message";
        let c = bar_chart(title, &input, Some(690.0), Some(686.5)).expect("a chart");
        let (e, m) = (&c.lines[0], &c.lines[1]);
        assert!((e.label_y - m.label_y).abs() >= LABEL_GAP - 0.01, "{e:?} {m:?}");
        assert!(e.label_y < m.label_y, "the higher value's label stays above");
        assert!(c.width >= c.plot.left + 7.0 * title.len() as f64);
        let far = bar_chart("t", &input, Some(300.0), Some(686.5)).expect("a chart");
        assert!(far.lines.iter().all(|l| l.label_y == l.y));
    }

    #[test]
    fn many_ranks_keep_the_chart_narrow_and_thin_the_labels() {
        let values: Vec<f64> = (0..512).map(|i| 700.0 + (i % 7) as f64).collect();
        let c = bar_chart("t", &input(&values), Some(769.0), Some(703.0)).expect("chart");
        assert_eq!(c.bars.len(), 512);
        assert!(c.width < 1200.0, "{}", c.width);
        assert!(c.bars.iter().all(|b| !b.show_value && b.w > 0.0));
        let labelled = c.bars.iter().filter(|b| b.show_label).count();
        assert!((20..=40).contains(&labelled), "{labelled}");
        let few = bar_chart("t", &input(&[1.0, 2.0]), None, None).expect("chart");
        assert!(few.bars.iter().all(|b| b.show_value && b.show_label));
    }
}
