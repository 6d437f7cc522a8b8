//! The page of 2,048 nodes × 8 ranks: what bounds its size, and that the outliers stay on it.

use gpusanity_common::report::*;

use super::tests::{page, report, sweep};
use super::RunContext;

const NODES: usize = 2048;
const PER_NODE: usize = 8;

/// The synthetic report of the other tests widened to 2,048 nodes of 8 ranks the way
/// bench/report_page.sh widens a real one: every check's ranks repeated (sweeps, losses and
/// notes included), node 1 faulty (rank 3 slow in gemm), and a warning on all-reduce's rank 5.
fn wide() -> Report {
    wide_of(NODES)
}

/// [`wide`] with `nodes` nodes.
fn wide_of(nodes: usize) -> Report {
    let mut r = report("gpu-b");
    let n = nodes * PER_NODE;
    r.nodes = (0..nodes)
        .map(|i| NodeInfo { node_rank: i, hostname: format!("node{i:04}"), addr: "10.0.0.1".into(), nproc: PER_NODE })
        .collect();
    let info = r.ranks[0].clone();
    r.ranks = (0..n)
        .map(|k| RankInfo {
            rank: k,
            node_rank: k / PER_NODE,
            local_rank: k % PER_NODE,
            host: format!("node{:04}", k / PER_NODE),
            ..info.clone()
        })
        .collect();
    for c in &mut r.checks {
        let src = std::mem::take(&mut c.ranks);
        c.ranks = (0..n)
            .map(|k| {
                let mut x = src[k % src.len()].clone();
                x.rank = k;
                if !x.sweep.is_empty() {
                    // Every rank a little different, as measured ones are.
                    x.sweep = sweep(1.0 + (k % 97) as f64 / 97.0);
                }
                x
            })
            .collect();
    }
    r.node_verdicts = (0..nodes)
        .map(|i| NodeVerdict {
            node_rank: i,
            host: format!("node{i:04}"),
            health: if i == 1 { NodeHealth::Faulty } else { NodeHealth::Healthy },
            codes: if i == 1 { vec![Code::GemmSlow] } else { vec![] },
        })
        .collect();
    let mut w = Finding::new(Severity::Warning, Code::AllreduceSlow, CheckId::AllReduce, "slow all-reduce".into());
    w.rank = Some(5);
    w.node_rank = Some(0);
    r.findings.push(w);
    r.pair_bandwidth = Vec::new();
    r
}

fn count(page: &str, what: &str) -> usize {
    page.matches(what).count()
}

#[test]
fn a_2048_node_page_draws_bands_and_the_flagged_ranks_only() {
    let r = wide();
    let html = page(&r, &RunContext::default());
    // Before the bands: one polyline per rank and sweep (16,384 × 2 for all-reduce, 16,384
    // losses), 12 MB for these two charts alone.
    assert!(html.len() < 1_000_000, "page of {} bytes", html.len());
    let lines = count(&html, "<polyline");
    // all-reduce: min / median / max and rank 5's busbw and algbw; mini-gpt: the band.
    assert_eq!(lines, 3 + 2 + 3, "{lines} lines");
    assert!(count(&html, "<rect") < 2_000, "{} rects", count(&html, "<rect"));
    // The node table and the facts list every node: two rows per node, a few hundred more.
    assert!(count(&html, "<tr") < 2 * NODES + 300, "{} rows", count(&html, "<tr"));
    eprintln!("{} bytes, {lines} lines, {} rects, {} rows", html.len(), count(&html, "<rect"), count(&html, "<tr"));
    for text in ["median busbw, 16384 ranks", "max loss, 16384 ranks", "<title>rank 5 busbw</title>", "ALLREDUCE_SLOW"]
    {
        assert!(html.contains(text), "{text} missing");
    }
    // The faulty node and the slow rank come first.
    let nodes = &html[html.find("id=\"nodes\"").expect("node table")..];
    assert!(nodes.find("node0001").expect("node 1") < nodes.find("node0000").expect("node 0"));
    let gemm = &html[html.find("id=\"check-0\"").expect("gemm")..];
    let gemm = &gemm[..gemm.find("</table>").expect("table end")];
    assert!(gemm.contains("GEMM_SLOW"), "{gemm}");
    assert!(gemm.contains("<td class=\"num\">402</td>"), "{gemm}");
}

#[test]
fn the_band_comes_from_the_sweep_summary_when_the_report_has_one() {
    let mut r = wide();
    let ar = r.checks.iter_mut().find(|c| c.name == CheckId::AllReduce).expect("all-reduce");
    for x in ar.ranks.iter_mut().filter(|x| x.rank != 5) {
        x.sweep = Vec::new();
    }
    r.sweep_summaries = vec![SweepSummary {
        check: CheckId::AllReduce,
        ranks_left_out: NODES * PER_NODE - 1,
        points: [4096u64, 65536]
            .iter()
            .map(|&bytes| SweepStats {
                bytes,
                ranks: 16_000,
                busbw_gbps_min: 1.0,
                busbw_gbps_median: 2.0,
                busbw_gbps_max: 3.0,
                wrong: 0,
            })
            .collect(),
    }];
    let html = page(&r, &RunContext::default());
    assert!(html.contains("median busbw, 16000 ranks"));
    assert!(html.contains("<title>rank 5 algbw</title>"));
    assert_eq!(count(&html, "<polyline"), 3 + 2 + 3);
}

#[test]
fn a_large_link_test_is_a_histogram_and_its_lowest_pairs_not_a_map() {
    let nodes = 256;
    let mut r = wide_of(nodes);
    // A ring and its chords, as the link test's rounds pair nodes; node 1's pairs slow, one
    // pair that measured nothing.
    r.pair_bandwidth = (0..nodes)
        .flat_map(|a| [1, 7].map(|d| [a, (a + d) % nodes]))
        .enumerate()
        .map(|(i, pair)| PairBandwidth {
            nodes: pair,
            busbw_gbps: if pair.contains(&1) { 20.0 } else { 40.0 + (i % 5) as f64 },
            round: 1,
        })
        .collect();
    r.pair_bandwidth[100].busbw_gbps = f64::NAN;
    let html = page(&r, &RunContext::default());
    let pairs = &html[html.find("id=\"pairs\"").expect("the link test")..];
    let pairs = &pairs[..pairs.find("</section>").expect("its end")];
    assert!(pairs.contains("512 pairs"), "{pairs}");
    // No node x node grid: a bar per bin, and 16 rows.
    assert!(count(pairs, "<rect") < 100, "{} rects", count(pairs, "<rect"));
    assert_eq!(count(pairs, "<tr class=\"flag-"), 16);
    // The pair that measured nothing first, then node 1's, marked with its faulty node.
    let first = pairs.find("<tr class=\"flag-").expect("a row");
    assert!(
        pairs[first..].starts_with(
            "<tr class=\"flag-ok\"><td>node50 (node0050)</td><td>node51 (node0051)</td><td class=\"num\">n/a</td>"
        ),
        "{}",
        &pairs[first..first + 200]
    );
    assert!(pairs.contains("<tr class=\"flag-critical\"><td>node0 (node0000)</td><td>node1 (node0001)</td><td class=\"num\">20</td><td class=\"num\">45%</td>"), "{pairs}");
    assert!(html.len() < 1_000_000, "page of {} bytes", html.len());
}
