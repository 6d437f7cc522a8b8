//! Geometry of the page's inline SVG charts: scales, axis ticks, number formats and colours.
//! The builders here compute positions and labels only; the markup is written by the askama
//! macros in `templates/charts.html`, so every label is escaped like the rest of the page.
//! (Hand-written because the charts are few and simple, and no charting crate renders
//! escaped, dependency-free inline SVG through templates.)

mod bars;
mod heat;
mod lines;

pub use bars::{bar_chart, Bar, BarChart, BarInput, RefLine};
pub use heat::{heat_map, strip, HeatCell, HeatInput, HeatMap, Segment, Strip};
pub use lines::{line_chart, LineChart, Path, Series};

/// The drawing area inside a chart's frame, in SVG user units.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Plot {
    pub left: f64,
    pub top: f64,
    pub right: f64,
    pub bottom: f64,
}

/// An axis mark: its position along the axis and its label.
#[derive(Debug, Clone, PartialEq)]
pub struct Tick {
    pub pos: f64,
    pub label: String,
}

/// Marks at `values` placed by `scale`, labelled by `label`.
pub fn ticks(values: Vec<f64>, scale: &Scale, label: impl Fn(f64) -> String) -> Vec<Tick> {
    values.into_iter().map(|v| Tick { pos: scale.map(v), label: label(v) }).collect()
}

/// Maps a data interval onto a pixel interval, linearly or on a log2 scale.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scale {
    d0: f64,
    d1: f64,
    r0: f64,
    r1: f64,
    log2: bool,
}

impl Scale {
    pub fn linear(d0: f64, d1: f64, r0: f64, r1: f64) -> Scale {
        Scale { d0, d1, r0, r1, log2: false }
    }

    /// A log2 scale; the domain must be positive (callers drop points at or below zero).
    pub fn log2(d0: f64, d1: f64, r0: f64, r1: f64) -> Scale {
        Scale { d0: d0.log2(), d1: d1.log2(), r0, r1, log2: true }
    }

    /// The pixel position of `v`; the middle of the range for an empty domain.
    pub fn map(&self, v: f64) -> f64 {
        let x = if self.log2 { v.log2() } else { v };
        if self.d1 == self.d0 {
            return round((self.r0 + self.r1) / 2.0);
        }
        round(self.r0 + (x - self.d0) / (self.d1 - self.d0) * (self.r1 - self.r0))
    }
}

/// Rounds a coordinate to 0.1 unit: shorter markup, no visible difference.
pub fn round(v: f64) -> f64 {
    (v * 10.0).round() / 10.0
}

/// About `n` round tick values (steps of 1, 2 or 5 x 10^k) covering `lo..=hi`.
pub fn nice_ticks(lo: f64, hi: f64, n: usize) -> Vec<f64> {
    if !lo.is_finite() || !hi.is_finite() || hi <= lo || n == 0 {
        return if lo.is_finite() { vec![lo] } else { Vec::new() };
    }
    let raw = (hi - lo) / n as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let r = raw / mag;
    let step = mag
        * if r >= 7.07 {
            10.0
        } else if r >= 3.16 {
            5.0
        } else if r >= 1.41 {
            2.0
        } else {
            1.0
        };
    let first = (lo / step).ceil() as i64;
    let last = (hi / step + 1e-9).floor() as i64;
    (first..=last).map(|k| k as f64 * step).collect()
}

/// Powers of two within `lo..=hi`, thinned to at most `max` marks.
pub fn log2_ticks(lo: f64, hi: f64, max: usize) -> Vec<f64> {
    if !(lo > 0.0 && hi >= lo && hi.is_finite()) || max == 0 {
        return Vec::new();
    }
    let (a, b) = (lo.log2().ceil() as i32, hi.log2().floor() as i32);
    let count = (b - a + 1).max(0) as usize;
    let every = count.div_ceil(max).max(1);
    (a..=b).step_by(every).map(|e| 2f64.powi(e)).collect()
}

/// A byte count the way people read message sizes: 4 KiB, 1 MiB, 1 GiB.
pub fn bytes_label(b: f64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if v.fract() == 0.0 {
        format!("{v:.0} {}", UNITS[u])
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// A figure with about three significant digits (and no exponent for everyday sizes).
pub fn fmt_num(v: f64) -> String {
    if !v.is_finite() {
        return "n/a".into();
    }
    let a = v.abs();
    let s = if a == 0.0 {
        "0".into()
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else if a >= 0.001 {
        format!("{v:.3}")
    } else {
        return format!("{v:.2e}");
    };
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// The fill of a heat-map cell: `t` = 1 is good (green), 0 bad (red); grey without a figure.
pub fn heat_colour(t: Option<f64>) -> String {
    match t {
        Some(t) if t.is_finite() => {
            let t = t.clamp(0.0, 1.0);
            format!("hsl({:.0},62%,{:.0}%)", 120.0 * t, 52.0 + 8.0 * t)
        }
        _ => "#e6e9ed".into(),
    }
}

/// Distinct line colours, one per rank (repeating after eight).
pub fn series_colour(i: usize) -> &'static str {
    const PALETTE: [&str; 8] = ["#0969da", "#bc4c00", "#1a7f37", "#8250df", "#cf222e", "#1b7c83", "#9a6700", "#57606a"];
    PALETTE[i % PALETTE.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linear_and_log2_scales() {
        let s = Scale::linear(0.0, 10.0, 100.0, 0.0);
        assert_eq!((s.map(0.0), s.map(5.0), s.map(10.0)), (100.0, 50.0, 0.0));
        let l = Scale::log2(1024.0, 1048576.0, 0.0, 100.0);
        assert_eq!((l.map(1024.0), l.map(32768.0), l.map(1048576.0)), (0.0, 50.0, 100.0));
        // One value: the middle, not a division by zero.
        assert_eq!(Scale::linear(3.0, 3.0, 0.0, 10.0).map(3.0), 5.0);
    }

    #[test]
    fn ticks_are_round_and_cover_the_range() {
        assert_eq!(nice_ticks(0.0, 10.0, 5), vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
        let labels: Vec<String> = nice_ticks(0.0, 0.9, 4).into_iter().map(fmt_num).collect();
        assert_eq!(labels, ["0", "0.2", "0.4", "0.6", "0.8"]);
        assert_eq!(nice_ticks(2.0, 2.0, 4), vec![2.0]);
        assert!(nice_ticks(f64::NAN, 1.0, 4).is_empty());
        assert_eq!(log2_ticks(4096.0, 4194304.0, 12).len(), 11);
        let thin = log2_ticks(1024.0, 1073741824.0, 6);
        assert!(thin.len() <= 6 && thin[0] == 1024.0, "{thin:?}");
        assert!(log2_ticks(0.0, 8.0, 4).is_empty());
    }

    #[test]
    fn labels() {
        assert_eq!(bytes_label(4096.0), "4 KiB");
        assert_eq!(bytes_label(1536.0), "1.5 KiB");
        assert_eq!(bytes_label(1073741824.0), "1 GiB");
        assert_eq!(fmt_num(769.4), "769");
        assert_eq!(fmt_num(0.0123), "0.012");
        assert_eq!(fmt_num(f64::NAN), "n/a");
    }

    #[test]
    fn heat_colours_run_from_red_to_green() {
        assert_eq!(heat_colour(Some(0.0)), "hsl(0,62%,52%)");
        assert_eq!(heat_colour(Some(1.0)), "hsl(120,62%,60%)");
        assert_eq!(heat_colour(Some(7.0)), heat_colour(Some(1.0)));
        assert_eq!(heat_colour(None), "#e6e9ed");
        assert_eq!(heat_colour(Some(f64::NAN)), "#e6e9ed");
    }
}
