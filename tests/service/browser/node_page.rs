//! The fleet page's lowest nodes and a node's page with its sparklines, on a real `gpusanity
//! serve` over SQLite and PostgreSQL: figures seeded in its database (a slow node whose figures
//! are older than the baseline's window of the newest 200, a stale node from last month), read
//! back through `GET /v1/fleet` and drawn by headless Chromium.

use std::time::{SystemTime, UNIX_EPOCH};

use gpusanity_common::expected::Conditions;
use gpusanity_common::fleet::Key;
use gpusanity_common::registry::CheckId;
use gpusanity_testkit::svc::{self, World};
use serde_json::Value;

use super::chrome::{chromium, dom, screenshot};

const HOUR_MS: i64 = 3_600_000;

/// One multi-row insert of `rows`: (run, node, value, at).
fn insert(w: &World, key: &str, rows: &[(String, String, f64, i64)]) {
    let values: Vec<String> =
        rows.iter().map(|(run, node, v, at)| format!("('{run}', 0, '{key}', '{node}', {v}, {at})")).collect();
    w.sql(&format!(
        "INSERT INTO fleet_samples (run_id, rank, fkey, node_name, value, at) VALUES {}",
        values.join(", ")
    ));
}

/// Seeds one GEMM key: `gpu-slow` 10% slow (10 figures two hours ago), then 300 figures of 30
/// healthy nodes in the last hour (the baseline's window, the newest 200, holds none of
/// `gpu-slow`'s), and `gpu-stale`, far lower, last month (outside the lowest list's week).
fn seed(w: &World) {
    let key = Key::new(
        "NVIDIA H200",
        Some(580),
        CheckId::Gemm,
        "tflops",
        Conditions { size: Some(8192), ranks_per_node: Some(8), ..Conditions::default() },
    );
    let key = serde_json::to_string(&key).expect("key");
    let now = i64::try_from(SystemTime::now().duration_since(UNIX_EPOCH).expect("clock").as_millis()).expect("ms");
    let slow: Vec<_> = (0..10)
        .map(|i| (format!("s-{i}"), "gpu-slow".to_string(), 612.0 + f64::from(i % 5), now - 2 * HOUR_MS + i64::from(i)))
        .collect();
    let stale: Vec<_> = (0..10)
        .map(|i| (format!("o-{i}"), "gpu-stale".to_string(), 400.0, now - 30 * 24 * HOUR_MS + i64::from(i)))
        .collect();
    let healthy: Vec<_> = (0..300)
        .map(|i| (format!("h-{i}"), format!("gpu-h{}", i % 30), 680.0 + f64::from(i % 5), now - HOUR_MS + i64::from(i)))
        .collect();
    for rows in [&slow, &stale, &healthy] {
        insert(w, &key, rows);
    }
}

fn fleet_pages(mut w: World, shots: bool) {
    let cfg = std::fs::read_to_string(&w.config).expect("config");
    std::fs::write(&w.config, cfg.replace("[http]\n", "[http]\nbrowser_public = true\n")).expect("config");
    w.serve();
    seed(&w);
    let (code, fleet) = w.http_call("GET", "/v1/fleet", Some(svc::TOKEN), None).expect("HTTP");
    assert_eq!(code, 200, "{fleet:#}");
    let k = &fleet["keys"][0];
    assert_eq!((&k["samples"], &k["baseline"]["samples"]), (&Value::from(200), &Value::from(200)), "{fleet:#}");
    // The slow node is listed first although none of its figures is in the window; the stale
    // node, lower still but a month old, is not; ten nodes in all.
    let lowest: Vec<&str> =
        k["lowest"].as_array().map_or(Vec::new(), |a| a.iter().filter_map(|n| n["node"].as_str()).collect());
    assert_eq!((lowest.first().copied(), lowest.len()), (Some("gpu-slow"), 10), "{fleet:#}");
    assert!(!lowest.contains(&"gpu-stale"), "{lowest:?}");
    assert_eq!(
        (&k["lowest"][0]["mean"], &k["lowest"][0]["samples"]),
        (&Value::from(614.0), &Value::from(10)),
        "{fleet:#}"
    );
    assert!(k["lowest"][0]["z"].as_f64().is_some_and(|z| z < -4.0), "{fleet:#}");

    let Some(bin) = chromium() else { return w.shutdown() };
    let page = dom(&bin, &w, "/ui/fleet");
    assert!(page.contains("<a href=\"/ui/nodes/gpu-slow\">gpu-slow</a>"), "{page}");
    assert!(!page.contains("gpu-stale") && page.contains("class=\"histogram\""), "{page}");
    let node = dom(&bin, &w, "/ui/nodes/gpu-slow");
    sparkline_shows_the_slow_node(&node);
    if shots {
        screenshot(&bin, &w, "/ui/nodes/gpu-slow", "browser-node-figures.png");
    }
    w.shutdown();
}

/// The node page as Chromium drew it: one sparkline of its 10 figures, the fleet's centre and
/// floor, its newest figure under the floor, at the 0th percentile.
fn sparkline_shows_the_slow_node(node: &str) {
    assert_eq!(node.matches("<svg class=\"spark\"").count(), 1, "{node}");
    assert!(
        node.contains("aria-label=\"NVIDIA H200 · gemm · tflops (size 8192, 8 ranks/node, driver 580): 10 figure(s)\""),
        "{node}"
    );
    let attr = |name: &str, after: &str| -> f64 {
        let at = node.find(after).unwrap_or_else(|| panic!("no {after} in {node}"));
        let rest = &node[at..];
        let v = rest.split(&format!("{name}=\"")).nth(1).and_then(|s| s.split('"').next());
        v.and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("no {name} after {after}"))
    };
    let points = node.split("<polyline points=\"").nth(1).and_then(|s| s.split('"').next()).unwrap_or("");
    assert_eq!(points.split(' ').count(), 10, "{points}");
    let (centre, floor, dot) = (attr("y1", "class=\"centre\""), attr("y1", "class=\"floor\""), attr("cy", "<circle"));
    // SVG y grows downwards: the centre above the floor, the newest figure under both.
    assert!(centre < floor && floor < dot, "centre {centre}, floor {floor}, newest figure {dot}");
    assert!(node.contains("<td class=\"num\">616.0000</td><td class=\"num\">0.0</td>"), "{node}");
    assert!(node.contains("200 samples from 30 nodes, window 200"), "{node}");
}

#[test]
fn the_fleet_lists_a_slow_node_outside_the_window_and_its_page_draws_it_in_chromium() {
    let _g = svc::common::serial();
    fleet_pages(World::new(None, ""), true);
}

#[test]
fn the_fleet_lists_a_slow_node_outside_the_window_on_postgresql() {
    let _g = svc::common::serial();
    let url = svc::postgres_database("gpusanity_node_page");
    fleet_pages(World::new(Some(url), ""), false);
}
