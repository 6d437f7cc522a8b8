//! A node's headline figures over time: `GET /v1/nodes/{name}/figures` and the sparklines of
//! its page, each against the fleet's baseline of its key (centre and BELOW_FLEET floor). No
//! script: the SVG is drawn here (the pages' Content-Security-Policy).

use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::{Extension, Json};
use gpusanity_common::fleet::Policy;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::fleet::key_title;
use super::Browser;
use crate::fleet::{node_figures, NodeKeyFigures, NODE_FIGURES_MAX};
use crate::http::error::{ApiError, ErrorBody};
use crate::http::scope::Scope;

/// The node's figures the page draws.
pub const PAGE_FIGURES: u32 = 500;
const WIDTH: f64 = 200.0;
const HEIGHT: f64 = 36.0;

/// How many of the node's newest figures, over every key (1 to 2000, default 500).
#[derive(Debug, Clone, Default, Deserialize, utoipa::IntoParams)]
#[serde(default)]
#[into_params(parameter_in = Query)]
pub struct Limit {
    limit: Option<u32>,
}

impl Limit {
    fn parse(&self) -> Result<u32, String> {
        match self.limit {
            None => Ok(PAGE_FIGURES),
            Some(n) if (1..=NODE_FIGURES_MAX).contains(&n) => Ok(n),
            Some(n) => Err(format!("limit must be 1 to {NODE_FIGURES_MAX}, got {n}")),
        }
    }
}

/// A node's headline figures by baseline key, oldest first, with each key's baseline.
#[derive(Serialize, ToSchema)]
pub struct NodeFigures {
    node: String,
    keys: Vec<NodeKeyFigures>,
}

/// The node's learned figures over time by key, against the fleet's baseline of each key.
#[utoipa::path(get, path = "/v1/nodes/{name}/figures", params(("name" = String, Path, description = "The node's name"), Limit), responses(
    (status = 200, description = "The node's figures by key (empty for a node never seen; a workspace token sees its workspace's runs only)", body = NodeFigures),
    (status = 400, description = "A malformed limit", body = ErrorBody),
    (status = 401, description = "Missing or wrong bearer token", body = ErrorBody)))]
pub async fn figures(
    State(b): State<Arc<Browser>>,
    Extension(scope): Extension<Scope>,
    Path(name): Path<String>,
    q: Result<Query<Limit>, QueryRejection>,
) -> Result<Json<NodeFigures>, ApiError> {
    let Ok(Query(q)) = q else { return Err(ApiError::bad_request("malformed query string")) };
    let limit = q.parse().map_err(ApiError::bad_request)?;
    let keys = node_figures(&b.db, &name, scope.workspace(), limit, Policy::default()).await?;
    Ok(Json(NodeFigures { node: name, keys }))
}

/// One key's sparkline as drawn.
pub struct Spark {
    pub title: String,
    /// Figures drawn.
    pub n: usize,
    /// The polyline's points, "x,y x,y ...".
    pub points: String,
    /// The newest figure's dot.
    pub last_xy: (f64, f64),
    pub centre_y: Option<f64>,
    pub floor_y: Option<f64>,
    pub last: String,
    pub percentile: String,
    /// The baseline in words, or why there is none.
    pub basis: String,
    pub width: f64,
    pub height: f64,
}

/// The sparkline of one key: figures left to right, oldest first, on a scale that holds the
/// figures, the centre and the floor.
pub fn spark(k: &NodeKeyFigures) -> Spark {
    let values: Vec<f64> = k.points.iter().map(|p| p.value).collect();
    let marks = k.baseline.map(|b| b.centre).into_iter().chain(k.floor);
    let (lo, hi) =
        values.iter().copied().chain(marks).fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| (a.min(v), b.max(v)));
    let span = (hi - lo).max(f64::EPSILON * hi.abs().max(1.0));
    let y = |v: f64| 2.0 + (hi - v) / span * (HEIGHT - 4.0);
    let step = if values.len() > 1 { (WIDTH - 4.0) / (values.len() - 1) as f64 } else { 0.0 };
    let xy: Vec<(f64, f64)> = values.iter().enumerate().map(|(i, v)| (2.0 + step * i as f64, y(*v))).collect();
    let points = xy.iter().map(|(x, y)| format!("{x:.1},{y:.1}")).collect::<Vec<_>>().join(" ");
    let basis = match k.baseline {
        Some(b) => format!(
            "fleet centre {:.4}, floor {:.4}; {} samples from {} nodes, window {}",
            b.centre,
            k.floor.unwrap_or(f64::NAN),
            b.samples,
            b.nodes,
            b.window
        ),
        None => "no fleet baseline yet".into(),
    };
    Spark {
        title: key_title(&k.key),
        n: values.len(),
        points,
        last_xy: xy.last().copied().unwrap_or((2.0, HEIGHT / 2.0)),
        centre_y: k.baseline.map(|b| y(b.centre)),
        floor_y: k.floor.map(y),
        last: values.last().map_or("-".into(), |v| format!("{v:.4}")),
        percentile: k.percentile.map_or("-".into(), |p| format!("{p:.1}")),
        basis,
        width: WIDTH,
        height: HEIGHT,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::Point;
    use gpusanity_common::expected::Conditions;
    use gpusanity_common::fleet::{Key, Learned};
    use gpusanity_common::registry::CheckId;

    fn figures(values: &[f64], baseline: Option<Learned>) -> NodeKeyFigures {
        NodeKeyFigures {
            key: Key::new("NVIDIA H200", Some(580), CheckId::Gemm, "tflops", Conditions::default()),
            baseline,
            floor: baseline.map(|b| b.centre - 4.0 * b.spread),
            percentile: baseline.map(|_| 2.5),
            points: values
                .iter()
                .enumerate()
                .map(|(i, v)| Point { at: i as i64, value: *v, run_id: format!("r{i}") })
                .collect(),
        }
    }

    #[test]
    fn a_sparkline_holds_its_figures_the_centre_and_the_floor_on_its_canvas() {
        let b = Learned { centre: 680.0, spread: 4.0, samples: 120, nodes: 8, window: 200 };
        // A node drifting 10% slower over 30 runs.
        let drift: Vec<f64> = (0..30).map(|i| 680.0 * (1.0 - 0.1 * i as f64 / 29.0)).collect();
        let s = spark(&figures(&drift, Some(b)));
        assert_eq!((s.n, s.points.split(' ').count()), (30, 30));
        let ys: Vec<f64> = s.points.split(' ').filter_map(|p| p.split(',').nth(1)?.parse().ok()).collect();
        assert!(ys.iter().all(|y| (0.0..=HEIGHT).contains(y)), "{ys:?}");
        assert!(ys.windows(2).all(|w| w[1] >= w[0]), "slower is lower on the canvas: {ys:?}");
        let (centre, floor) = (s.centre_y.expect("centre"), s.floor_y.expect("floor"));
        assert!(centre < floor && floor < s.last_xy.1, "{centre} {floor} {:?}", s.last_xy);
        assert_eq!((s.last.as_str(), s.percentile.as_str()), ("612.0000", "2.5"));
        assert!(s.basis.contains("120 samples from 8 nodes, window 200"), "{}", s.basis);
        // One figure, equal figures, no baseline: no panic, nothing off the canvas.
        for values in [&[650.0][..], &[1.0, 1.0, 1.0][..], &[][..]] {
            let s = spark(&figures(values, None));
            assert!(s.centre_y.is_none() && s.basis.starts_with("no fleet baseline"));
            assert!(s
                .points
                .split(' ')
                .filter_map(|p| p.split(',').nth(1)?.parse::<f64>().ok())
                .all(|y| y.is_finite()));
        }
    }

    #[test]
    fn the_limit_is_bounded() {
        assert_eq!(Limit { limit: None }.parse(), Ok(PAGE_FIGURES));
        assert_eq!(Limit { limit: Some(2000) }.parse(), Ok(2000));
        assert!(Limit { limit: Some(0) }.parse().is_err());
        assert!(Limit { limit: Some(2001) }.parse().is_err());
    }
}
