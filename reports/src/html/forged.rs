//! Forged reports: indexes out of range, figures that are not finite, empty lists, long
//! strings. None may panic; an invalid one is an error naming what is wrong.

use gpusanity_common::detail;
use gpusanity_common::report::*;

use super::sections::pair_map;
use super::{run_page, RenderError, RunContext};
use crate::validate::{validate, InvalidReport, MAX_ITEMS, MAX_NAME, MAX_NODES};

fn example() -> Report {
    serde_json::from_str(include_str!("../../../docs/examples/report-cpu.json")).expect("example report")
}

fn invalid(r: &Report) -> InvalidReport {
    match run_page(r, &RunContext::default()) {
        Err(RenderError::Invalid(e)) => e,
        Err(e) => panic!("not a validation error: {e}"),
        Ok(_) => panic!("an invalid report rendered"),
    }
}

#[test]
fn the_example_is_valid() {
    assert_eq!(validate(&example()), Ok(()));
    assert!(run_page(&example(), &RunContext::default()).is_ok());
}

#[test]
fn a_pair_index_of_u64_max_is_an_error_not_a_panic() {
    let json = include_str!("../../../docs/examples/report-cpu.json").replacen(
        r#""nodes": [
        0,
        1
      ]"#,
        r#""nodes": [18446744073709551615, 0]"#,
        1,
    );
    let mut r: Report = serde_json::from_str(&json).expect("still a report");
    if r.pair_bandwidth.first().map(|p| p.nodes) != Some([usize::MAX, 0]) {
        r.pair_bandwidth[0].nodes = [usize::MAX, 0];
    }
    let e = invalid(&r);
    assert_eq!(
        e,
        InvalidReport::NodeOutOfRange { what: "pair_bandwidth[0].nodes[0]".into(), value: usize::MAX, len: 3 }
    );
    assert!(e.to_string().contains("out of range"), "{e}");
    // The map itself, reached without validation, neither panics nor allocates the index.
    assert!(pair_map(&r).is_none());
    r.pair_bandwidth[0].nodes = [7, 0];
    let m = pair_map(&r).expect("an 8 x 8 map");
    assert_eq!(m.cells.len(), 64);
}

/// Makes one index of a report point past its nodes.
type Forge = fn(&mut Report);

#[test]
fn every_node_index_is_checked() {
    let cases: [(&str, Forge); 6] = [
        ("faulty_nodes[0]", |r| r.faulty_nodes = vec![3]),
        ("findings[0].node_rank", |r| r.findings[0].node_rank = Some(usize::MAX)),
        ("findings[0].pair[1]", |r| r.findings[0].pair = Some([0, 9])),
        ("node_verdicts[0].node_rank", |r| r.node_verdicts[0].node_rank = 3),
        ("ranks[0].node_rank", |r| r.ranks[0].node_rank = 42),
        ("nodes[0].node_rank", |r| r.nodes[0].node_rank = 3),
    ];
    for (what, forge) in cases {
        let mut r = example();
        forge(&mut r);
        match invalid(&r) {
            InvalidReport::NodeOutOfRange { what: w, .. } => assert_eq!(w, what),
            other => panic!("{what}: {other}"),
        }
    }
    let mut r = example();
    r.checks[0].ranks[0].rank = usize::MAX;
    assert!(matches!(invalid(&r), InvalidReport::RankOutOfRange { .. }));
}

#[test]
fn durations_must_be_finite_and_measurements_may_be_not() {
    for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        let mut r = example();
        r.checks[0].duration_s = bad;
        assert!(matches!(invalid(&r), InvalidReport::NotFinite { .. }), "{bad}");
    }
    let mut r = example();
    for c in &mut r.checks {
        for x in &mut c.ranks {
            for v in x.metrics.values_mut() {
                *v = f64::NAN;
            }
            for p in &mut x.sweep {
                p.busbw_gbps = f64::INFINITY;
                p.algbw_gbps = f64::NAN;
            }
        }
    }
    for f in &mut r.findings {
        f.measured = Some(f64::NAN);
        f.score = Some(f64::NEG_INFINITY);
    }
    for p in &mut r.pair_bandwidth {
        p.busbw_gbps = f64::NAN;
    }
    let html = run_page(&r, &RunContext::default()).expect("measurements that are not finite render");
    assert!(html.contains("n/a"));
}

#[test]
fn empty_lists_render() {
    let mut r = example();
    r.nodes.clear();
    r.ranks.clear();
    r.checks.clear();
    r.findings.clear();
    r.events.clear();
    r.node_verdicts.clear();
    r.faulty_nodes.clear();
    r.pair_bandwidth.clear();
    r.remeasured.clear();
    run_page(&r, &RunContext::default()).expect("an empty report renders");
    // Checks with no ranks, ranks with no metrics, sweeps or notes.
    let mut r = example();
    for c in &mut r.checks {
        c.ranks.truncate(1);
        for x in &mut c.ranks {
            x.metrics.clear();
            x.sweep.clear();
            x.notes.clear();
        }
    }
    r.checks.push(CheckReport {
        name: CheckId::Gemm,
        status: CheckStatus::Passed,
        duration_s: 0.0,
        config: serde_json::Value::Null,
        ranks: vec![],
    });
    run_page(&r, &RunContext::default()).expect("empty checks render");
    // Nodes but findings pointing at none of them.
    let mut r = example();
    r.nodes.clear();
    assert!(matches!(invalid(&r), InvalidReport::NodeOutOfRange { .. }));
}

#[test]
fn bounds_on_lengths_and_counts() {
    let mut r = example();
    r.nodes[0].hostname = "h".repeat(MAX_NAME + 1);
    assert!(matches!(invalid(&r), InvalidReport::TooLong { .. }));
    let mut r = example();
    let node = r.nodes[0].clone();
    r.nodes = (0..=MAX_NODES).map(|k| NodeInfo { node_rank: k, ..node.clone() }).collect();
    let e = invalid(&r);
    assert_eq!(e.to_string(), format!("nodes has {} entries (at most {MAX_NODES})", MAX_NODES + 1));
}

#[test]
fn details_of_any_shape_render() {
    let mut r = example();
    let odd: [Vec<Vec<&str>>; 4] =
        [vec![], vec![vec![]], vec![vec!["ok"], vec!["FAIL", "ok", "x", "1.5ms"]], vec![vec!["-1e308ms", "NaNms"]]];
    for (i, cells) in odd.iter().enumerate() {
        let grid: Vec<Vec<detail::GridCell>> =
            cells.iter().map(|row| row.iter().map(|c| detail::GridCell::from(*c)).collect()).collect();
        // Any detail on any check: the connectivity grids on the first, losses on the second.
        for (k, c) in r.checks.iter_mut().enumerate() {
            if let Some(x) = c.ranks.first_mut() {
                x.detail = Some(if k % 2 == 0 {
                    CheckDetail::Connectivity {
                        front_end: Some(grid.clone()),
                        back_end: Some(vec![vec!["FAIL 1/0".into()]; i]),
                        front_end_failed: vec![detail::Probe { from: MAX_NODES, to: 0, ms: f64::NAN, error: None }],
                        back_end_failed: Vec::new(),
                        front_end_probers: Some(vec![usize::MAX]),
                        back_end_peers: None,
                        ib_ports_not_active: vec!["<script>x</script>".repeat(i)],
                    }
                } else {
                    CheckDetail::Model {
                        losses: vec![Some(1.0), None, Some(f64::INFINITY), Some(-3.0), Some(i as f64)],
                        loss_finding: Some(Code::GemmSlow),
                        dp_group: usize::MAX,
                        param_checksum: String::new(),
                        changed_at_rest: None,
                    }
                });
            }
        }
        run_page(&r, &RunContext::default()).expect("renders");
    }
    // A detail past the bound on items is refused before rendering.
    let mut r = example();
    if let Some(x) = r.checks.first_mut().and_then(|c| c.ranks.first_mut()) {
        x.detail = Some(CheckDetail::PairBandwidth {
            pairs: vec![PairBandwidth { nodes: [0, 0], busbw_gbps: 1.0, round: 1 }; MAX_ITEMS + 1],
        });
    }
    assert!(matches!(invalid(&r), InvalidReport::TooMany { .. }));
}
