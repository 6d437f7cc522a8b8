//! Node x node heat maps (connectivity, pair bandwidth) and the state timeline's strip.

use chrono::{DateTime, Utc};

use super::{heat_colour, round, Scale, Tick};

/// One cell before layout: how good it is (0 bad .. 1 good; None: no figure) and its text.
#[derive(Debug, Clone, PartialEq)]
pub struct HeatInput {
    pub t: Option<f64>,
    pub text: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct HeatCell {
    pub x: f64,
    pub y: f64,
    pub size: f64,
    pub fill: String,
    pub text: String,
    /// The tooltip: row, column and text.
    pub title: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct HeatMap {
    pub title: String,
    pub width: f64,
    pub height: f64,
    pub cells: Vec<HeatCell>,
    pub rows: Vec<Tick>,
    pub cols: Vec<Tick>,
    /// Where the grid starts (right of the row labels, below the column labels).
    pub left: f64,
    pub top: f64,
}

/// A square grid, `cells[row][col]`, labelled with `labels` on both axes. None when empty.
pub fn heat_map(title: &str, labels: &[String], cells: &[Vec<HeatInput>]) -> Option<HeatMap> {
    let n = cells.len();
    if n == 0 {
        return None;
    }
    // Many nodes: smaller cells (down to 6 units), labels on every k-th row and column.
    let size = (640.0 / n as f64).clamp(6.0, 72.0);
    let every = (14.0 / size).ceil() as usize;
    let (left, top) = (90.0, 44.0);
    let label = |i: usize| labels.get(i).cloned().unwrap_or_else(|| i.to_string());
    let mut out = Vec::new();
    for (i, row) in cells.iter().enumerate() {
        for (j, c) in row.iter().enumerate().take(n) {
            out.push(HeatCell {
                x: round(left + size * j as f64),
                y: round(top + size * i as f64),
                size: round(size - 2.0),
                fill: heat_colour(c.t),
                text: if size >= 40.0 { c.text.clone() } else { String::new() },
                title: format!("{} → {}: {}", label(i), label(j), c.text),
            });
        }
    }
    let ticks = |origin: f64| {
        (0..n)
            .step_by(every.max(1))
            .map(|i| Tick { pos: round(origin + size * (i as f64 + 0.5)), label: label(i) })
            .collect()
    };
    Some(HeatMap {
        title: title.into(),
        width: left + size * n as f64 + 20.0,
        height: top + size * n as f64 + 10.0,
        cells: out,
        rows: ticks(top),
        cols: ticks(left),
        left,
        top,
    })
}

/// One state of the timeline strip.
#[derive(Debug, Clone, PartialEq)]
pub struct Segment {
    pub x: f64,
    pub w: f64,
    pub class: String,
    /// The state's name when the segment is wide enough to hold it.
    pub label: String,
    pub title: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Strip {
    pub width: f64,
    pub segments: Vec<Segment>,
    /// Time marks: seconds since the first state.
    pub ticks: Vec<Tick>,
}

/// A strip of the states in time order: each spans until the next; the last one is a
/// fixed-width mark at the end. None without states.
pub fn strip(states: &[(String, DateTime<Utc>, String)]) -> Option<Strip> {
    let (first, last) = (states.first()?.1, states.last()?.1);
    let (left, right, end) = (10.0, 820.0, 110.0);
    let total = (last - first).num_milliseconds().max(0) as f64 / 1e3;
    let x = Scale::linear(0.0, total, left, right);
    let secs = |t: DateTime<Utc>| (t - first).num_milliseconds().max(0) as f64 / 1e3;
    let segments = states
        .iter()
        .enumerate()
        .map(|(i, (state, at, detail))| {
            let x0 =
                if total == 0.0 { left + (right - left) * i as f64 / states.len() as f64 } else { x.map(secs(*at)) };
            let x1 = match states.get(i + 1) {
                Some(next) if total > 0.0 => x.map(secs(next.1)),
                Some(_) => left + (right - left) * (i + 1) as f64 / states.len() as f64,
                None => right + end,
            };
            let w = round((x1 - x0).max(2.0));
            Segment {
                x: x0,
                w,
                class: state.chars().filter(char::is_ascii_alphanumeric).collect(),
                label: if w >= 8.0 * state.len() as f64 { state.clone() } else { String::new() },
                title: format!("{state} at {}: {detail}", at.format("%H:%M:%S%.3f")),
            }
        })
        .collect();
    let ticks = if total > 0.0 {
        super::ticks(super::nice_ticks(0.0, total, 6), &x, |s| format!("{}s", super::fmt_num(s)))
    } else {
        Vec::new()
    };
    Some(Strip { width: right + end + 10.0, segments, ticks })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heat_cells_take_their_colour_from_how_good_they_are() {
        let cell = |t: Option<f64>, s: &str| HeatInput { t, text: s.into() };
        let m = heat_map(
            "pairs",
            &["node0".into(), "node1".into()],
            &[vec![cell(None, "-"), cell(Some(0.0), "FAIL")], vec![cell(Some(1.0), "2.10"), cell(None, "-")]],
        )
        .expect("map");
        assert_eq!(m.cells.len(), 4);
        assert_eq!(m.cells[1].fill, heat_colour(Some(0.0)));
        assert_eq!(m.cells[2].fill, heat_colour(Some(1.0)));
        assert_eq!(m.cells[0].fill, heat_colour(None));
        assert_eq!(m.cells[1].title, "node0 → node1: FAIL");
        assert_eq!(m.cells[2].y, m.cells[3].y);
        assert_eq!(m.rows.len(), 2);
        assert!(heat_map("x", &[], &[]).is_none());
        // 200 nodes: small cells, every k-th node labelled.
        let grid: Vec<Vec<HeatInput>> = (0..200).map(|_| (0..200).map(|_| cell(Some(1.0), "1")).collect()).collect();
        let big = heat_map("pairs", &[], &grid).expect("map");
        assert_eq!(big.cells.len(), 40_000);
        assert!(big.width < 1400.0 && big.cells.iter().all(|c| c.text.is_empty()));
        assert_eq!(big.rows.len(), 200usize.div_ceil(3));
    }

    #[test]
    fn strip_segments_span_until_the_next_state() {
        let t0 = DateTime::parse_from_rfc3339("2026-11-30T10:00:00Z").expect("time").with_timezone(&Utc);
        let s = |name: &str, secs: i64| (name.to_string(), t0 + chrono::Duration::seconds(secs), String::new());
        let st = strip(&[s("Checking", 0), s("CheckPassed", 10), s("Running", 20)]).expect("strip");
        assert_eq!(st.segments.len(), 3);
        assert_eq!(st.segments[0].x, 10.0);
        assert_eq!(st.segments[0].w, st.segments[1].w);
        assert_eq!(st.segments[1].class, "CheckPassed");
        assert_eq!(st.segments[2].x, 820.0);
        assert!(strip(&[]).is_none());
        // All at one instant: equal shares, no division by zero.
        let same = strip(&[s("Checking", 0), s("CheckFailed", 0)]).expect("strip");
        assert!(same.segments.iter().all(|g| g.x.is_finite() && g.w > 0.0));
        assert!(same.ticks.is_empty());
    }
}
