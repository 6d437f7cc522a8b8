//! The fleet page (`/ui/fleet`) and its JSON twin (`GET /v1/fleet`): per baseline key (device
//! model, check, metric and conditions), the distribution of the headline figure over its
//! window as an SVG histogram with the baseline's centre and floor marked, and the nodes
//! furthest below it. No script: the SVG is drawn here (the pages' Content-Security-Policy).

use std::sync::Arc;

use askama::Template;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use axum::{Extension, Json};
use gpusanity_common::fleet::{Key, Policy};
use serde::Serialize;
use utoipa::ToSchema;

use super::render::{db_error, page};
use super::session::SessionView;
use super::{node_href, Browser};
use crate::fleet::{view, KeyView};
use crate::http::error::{ApiError, ErrorBody};
use crate::http::scope::Scope;

const WIDTH: f64 = 480.0;
const HEIGHT: f64 = 120.0;

/// The fleet's baselines as the service learned them.
#[derive(Serialize, ToSchema)]
pub struct Fleet {
    keys: Vec<KeyView>,
}

/// Per baseline key: the window's histogram, the baseline and the nodes lowest in it.
#[utoipa::path(get, path = "/v1/fleet", responses(
    (status = 200, description = "Every key's distribution and baseline; node names for the admin token only", body = Fleet),
    (status = 401, description = "Missing or wrong bearer token", body = ErrorBody)))]
pub async fn fleet(State(b): State<Arc<Browser>>, Extension(scope): Extension<Scope>) -> Result<Json<Fleet>, ApiError> {
    let keys = view(&b.db, Policy::default(), scope.workspace().is_none()).await?;
    Ok(Json(Fleet { keys }))
}

/// One key as drawn.
struct Chart {
    title: String,
    samples: usize,
    baseline: String,
    /// (x, y, width, height, tooltip) per bar.
    bars: Vec<(f64, f64, f64, f64, String)>,
    /// The centre's and the floor's x, when there is a baseline.
    centre: Option<f64>,
    floor: Option<f64>,
    /// (its page, node, mean, z).
    lowest: Vec<(String, String, String, String)>,
}

/// A key as a heading: device, check, metric and conditions.
pub(super) fn key_title(key: &Key) -> String {
    let mut cond = Vec::new();
    if let Some(s) = key.size {
        cond.push(format!("size {s}"));
    }
    if let Some(m) = key.max_bytes {
        cond.push(format!("max {m} B"));
    }
    if let Some(r) = key.ranks_per_node {
        cond.push(format!("{r} ranks/node"));
    }
    if let Some(d) = key.driver {
        cond.push(format!("driver {d}"));
    }
    format!("{} · {} · {} ({})", key.device, key.check.as_str(), key.metric, cond.join(", "))
}

fn chart(k: KeyView) -> Chart {
    let title = key_title(&k.key);
    let (lo, hi) = match (k.histogram.first(), k.histogram.last()) {
        (Some(f), Some(l)) => (f.lo.min(k.floor.unwrap_or(f.lo)), l.hi),
        _ => (0.0, 1.0),
    };
    let span = (hi - lo).max(f64::EPSILON);
    let x = |v: f64| (v - lo) / span * WIDTH;
    let top = k.histogram.iter().map(|b| b.n).max().unwrap_or(1).max(1) as f64;
    let bars = k
        .histogram
        .iter()
        .map(|b| {
            let h = b.n as f64 / top * (HEIGHT - 10.0);
            (x(b.lo), HEIGHT - h, (x(b.hi) - x(b.lo) - 1.0).max(1.0), h, format!("{:.4}–{:.4}: {}", b.lo, b.hi, b.n))
        })
        .collect();
    let baseline = match k.baseline {
        Some(b) => format!(
            "centre {:.4}, spread {:.4}, floor {:.4}; {} samples from {} nodes",
            b.centre,
            b.spread,
            k.floor.unwrap_or(f64::NAN),
            b.samples,
            b.nodes
        ),
        None => "no baseline yet (too few samples or nodes)".into(),
    };
    Chart {
        title,
        samples: k.samples,
        baseline,
        bars,
        centre: k.baseline.map(|b| x(b.centre)),
        floor: k.floor.map(x),
        lowest: k
            .lowest
            .into_iter()
            .map(|n| {
                let z = n.z.map(|z| format!("{z:+.1}")).unwrap_or_else(|| "-".into());
                (node_href(&n.node), n.node, format!("{:.4} ({} samples)", n.mean, n.samples), z)
            })
            .collect(),
    }
}

#[derive(Template)]
#[template(path = "browser_fleet.html")]
struct FleetPage {
    charts: Vec<Chart>,
    width: f64,
    height: f64,
}

pub async fn fleet_page(State(b): State<Arc<Browser>>, Extension(v): Extension<SessionView>) -> Response {
    match view(&b.db, Policy::default(), v.scope.workspace().is_none()).await {
        Ok(keys) => page(
            StatusCode::OK,
            &FleetPage { charts: keys.into_iter().map(chart).collect(), width: WIDTH, height: HEIGHT },
        ),
        Err(e) => db_error(e),
    }
}
