//! The run page from synthetic reports: what it shows, its charts, and hostile strings.

use chrono::{DateTime, Utc};
use gpusanity_common::events::{CheckState, StateEvent};
use gpusanity_common::report::*;

use super::{run_page, Link, RunContext, TimelineEntry};

fn at(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s).expect("time").with_timezone(&Utc)
}

fn rank(rank: usize, metrics: &[(&str, f64)]) -> RankResult {
    let mut r = RankResult::new(rank, CheckStatus::Passed);
    r.metrics = metrics.iter().map(|(k, v)| (k.to_string(), *v)).collect();
    r
}

fn check(name: &str, status: CheckStatus, config: serde_json::Value, ranks: Vec<RankResult>) -> CheckReport {
    CheckReport { name: name.parse().expect("a check's name"), status, duration_s: 1.5, config, ranks }
}

pub(super) fn sweep(scale: f64) -> Vec<SweepPoint> {
    [4096u64, 16384, 65536]
        .iter()
        .enumerate()
        .map(|(i, b)| SweepPoint {
            bytes: *b,
            time_us: 10.0,
            algbw_gbps: scale * (i + 1) as f64,
            busbw_gbps: 1.5 * scale * (i + 1) as f64,
            wrong: 0,
        })
        .collect()
}

/// Two nodes of two H200s each; rank 3 (node 1, gpu-b) is slow in gemm.
pub(super) fn report(host_b: &str) -> Report {
    let ranks: Vec<RankInfo> = (0..4)
        .map(|r| RankInfo {
            rank: r,
            node_rank: r / 2,
            local_rank: r % 2,
            host: if r < 2 { "gpu-a".into() } else { host_b.into() },
            device: "NVIDIA H200".into(),
            pid: 100 + r as u32,
            link: None,
        })
        .collect();
    let gemm = check(
        "gemm",
        CheckStatus::Failed,
        serde_json::json!({"size": 8192, "iters": 50}),
        vec![
            rank(0, &[("tflops", 760.0)]),
            rank(1, &[("tflops", 758.0)]),
            rank(2, &[("tflops", f64::NAN)]),
            rank(3, &[("tflops", 401.5)]),
        ],
    );
    let mut ar = check("all-reduce", CheckStatus::Passed, serde_json::json!({"max_bytes": 65536}), vec![]);
    for r in 0..4 {
        let mut x = rank(r, &[("busbw_gbps", 3.0)]);
        x.sweep = sweep(1.0 + r as f64);
        ar.ranks.push(x);
    }
    let mut gpt = check("mini-gpt", CheckStatus::Passed, serde_json::Value::Null, vec![]);
    for r in 0..2 {
        let mut x = rank(r, &[("step_ms_median", 12.0), ("tokens_per_s", 5000.0), ("mfu", 0.41)]);
        x.detail = Some(CheckDetail::Model {
            losses: vec![Some(4.15), Some(3.80), None, Some(2.10), Some(1.05)],
            loss_finding: None,
            dp_group: 0,
            param_checksum: "00000000000000aa".into(),
            changed_at_rest: None,
        });
        gpt.ranks.push(x);
    }
    let mut conn = check("network-connectivity", CheckStatus::Failed, serde_json::Value::Null, vec![rank(0, &[])]);
    conn.ranks[0].detail = Some(CheckDetail::Connectivity {
        front_end: Some(vec![vec!["-".into(), "FAIL".into()], vec!["0.30ms".into(), "-".into()]]),
        back_end: None,
        front_end_failed: Vec::new(),
        back_end_failed: Vec::new(),
        front_end_probers: None,
        back_end_peers: None,
        ib_ports_not_active: Vec::new(),
    });
    let mut f = Finding::new(
        Severity::Critical,
        Code::GemmSlow,
        CheckId::Gemm,
        "401.5 TFLOP/s, 53% of the peers' median 759".into(),
    );
    f.node_rank = Some(1);
    f.host = Some(host_b.into());
    f.rank = Some(3);
    f.measured = Some(401.5);
    f.peers_median = Some(759.0);
    f.expected = Some(769.0);
    f.peers_mad = Some(1.0);
    f.score = Some(-241.1);
    f.evidence = vec!["slow in both measurements".into(), format!("host said {host_b}")];
    f.action = Some("exclude the node".into());
    Report {
        schema_version: REPORT_SCHEMA_VERSION,
        gpusanity_version: "0.1.0".into(),
        run_id: "run-1".into(),
        started_at: at("2026-11-30T10:00:00Z"),
        finished_at: at("2026-11-30T10:00:12Z"),
        status: RunStatus::Failed,
        summary: format!("GEMM_SLOW in gemm (rank 3 on {host_b})"),
        settings: gpusanity_common::Settings::default(),
        backend: DeviceKind::Cuda,
        nodes: (0..2)
            .map(|n| NodeInfo {
                node_rank: n,
                hostname: if n == 0 { "gpu-a".into() } else { host_b.into() },
                addr: "10.0.0.1".into(),
                nproc: 2,
            })
            .collect(),
        ranks,
        checks: vec![gemm, ar, gpt, conn],
        findings: vec![f],
        events: vec![
            StateEvent {
                state: CheckState::Checking,
                at: at("2026-11-30T10:00:00Z"),
                detail: "cuda on 4 rank(s)".into(),
            },
            StateEvent { state: CheckState::CheckFailed, at: at("2026-11-30T10:00:12Z"), detail: "GEMM_SLOW".into() },
        ],
        node_verdicts: vec![
            NodeVerdict { node_rank: 0, host: "gpu-a".into(), health: NodeHealth::Healthy, codes: vec![] },
            NodeVerdict { node_rank: 1, host: host_b.into(), health: NodeHealth::Faulty, codes: vec![Code::GemmSlow] },
        ],
        faulty_nodes: vec![1],
        remeasured: vec![],
        pair_bandwidth: vec![PairBandwidth { nodes: [0, 1], busbw_gbps: 41.5, round: 1 }],
        sweep_summaries: Vec::new(),
        hosts: Vec::new(),
    }
}

pub(super) fn page(r: &Report, ctx: &RunContext) -> String {
    run_page(r, ctx).expect("renders")
}

#[test]
fn verdict_faulty_node_and_findings_come_first() {
    let html = page(&report("gpu-b"), &RunContext::default());
    let verdict = html.find("id=\"verdict\"").expect("verdict");
    let faulty = html.find("Faulty nodes — isolate: node 1 (gpu-b)").expect("faulty node named");
    let finding = html.find("GEMM_SLOW</span> in gemm").expect("finding");
    let checks = html.find("id=\"checks\"").expect("checks");
    assert!(verdict < faulty && faulty < finding && finding < checks);
    assert!(html.contains(">FAILED<"));
    for figure in [
        "<dt>measured</dt><dd>402</dd>",
        "<dt>expected</dt><dd>769</dd>",
        "<dt>peers&#39; median</dt><dd>759</dd>",
        "<dt>peers&#39; MAD</dt><dd>1</dd>",
        "<dt>score</dt><dd>-241</dd>",
    ] {
        assert!(html.contains(figure), "{figure}");
    }
    assert!(html.contains("node 1 · host gpu-b · rank 3"));
    assert!(html.contains("slow in both measurements"));
    assert!(html.contains("exclude the node"));
}

#[test]
fn charts_mark_the_slow_rank_the_expected_value_and_the_median() {
    let html = page(&report("gpu-b"), &RunContext::default());
    // gemm bars, all-reduce bars + sweep, three mini-gpt bars + loss curve, connectivity and
    // pair heat maps, one timeline strip.
    assert_eq!(html.matches("<svg").count(), 1 + 2 + 4 + 1 + 1 + 1, "{html}");
    // Rank 3's bar is critical; rank 2 (NaN) has no bar; 3 gemm bars.
    let gemm = &html[html.find("gemm: TFLOP/s").expect("gemm chart")..];
    let gemm = &gemm[..gemm.find("</svg>").expect("end")];
    assert_eq!(gemm.matches("<rect class=\"bar\"").count(), 3);
    assert!(
        gemm.contains("<g class=\"bar-critical\"><rect class=\"bar\"") && gemm.contains("<title>rank 3: 402</title>")
    );
    assert!(!gemm.contains("rank 2:"));
    assert!(gemm.contains("expected 690") && gemm.contains("median 758"));
    // The table row of rank 3 is flagged with the finding's code.
    assert!(html.contains("<tr class=\"flag-critical\"><td class=\"num\">3</td>"));
    assert!(html.contains("<span class=\"sev-critical\">GEMM_SLOW</span>"));
    assert_eq!(html.matches("<tr class=\"flag-critical\">").count(), 1);
    // Notes alike on every rank are listed once.
    let mut r = report("gpu-b");
    for x in &mut r.checks[0].ranks {
        x.notes.insert("dtype".into(), "bf16".into());
    }
    r.checks[0].ranks[3].notes.insert("hash".into(), "abc".into());
    let html = page(&r, &RunContext::default());
    assert!(html.contains("<tr><td class=\"num\">all</td><td>dtype</td><td>bf16</td></tr>"), "{html}");
    assert!(html.contains("<tr><td class=\"num\">3</td><td>hash</td><td>abc</td></tr>"));
    // The sweep: busbw and (differing) algbw per rank, log2 axis labels.
    assert!(html.contains("all-reduce: bandwidth vs message size"));
    assert_eq!(html.matches("<polyline").count(), 4 * 2 + 2);
    assert!(html.contains(">4 KiB<") && html.contains(">64 KiB<"));
    // Loss curves skip the NaN step.
    let loss = &html[html.find("mini-gpt: training loss").expect("loss chart")..];
    let points = loss[loss.find("points=\"").expect("points") + 8..].split('"').next().expect("attr").to_string();
    assert_eq!(points.split(' ').count(), 4);
    // Heat maps: a failed probe is red, the pair figure is there.
    assert!(html.contains("node0 (gpu-a) → node1 (gpu-b): FAIL"));
    assert!(html.contains("41.5 GB/s"));
}

#[test]
fn sections_timeline_settings_and_facts() {
    let ctx = RunContext {
        job: Some("train-7b".into()),
        workspace: Some("research".into()),
        timeline: vec![TimelineEntry {
            state: "Pending".into(),
            at: at("2026-11-30T09:59:58Z"),
            detail: "queued".into(),
        }],
        links: vec![Link { label: "all runs".into(), href: "/runs".into() }],
        left_out: Vec::new(),
    };
    let html = page(&report("gpu-b"), &ctx);
    for id in ["findings", "nodes", "checks", "pairs", "timeline", "settings", "facts"] {
        assert!(html.contains(&format!("<section id=\"{id}\"")), "{id}");
    }
    assert!(html.contains("<h1>gpusanity report: train-7b</h1>") && html.contains("workspace research"));
    assert!(html.contains("service state <b id=\"service-state\">Pending</b>"));
    assert!(html.contains("<h3>service</h3>") && html.contains("<h3>check run</h3>"));
    assert!(html.contains("<td>CheckFailed</td><td class=\"at\">2026-11-30 10:00:12.000</td>"));
    assert!(html.contains("<th>micro_benchmarks</th>"));
    assert!(html.contains("<td>NVIDIA H200</td><td class=\"num\">103</td>"));
    assert!(html.contains("<a href=\"/runs\">all runs</a>"));
}

#[test]
fn hostile_strings_render_as_text() {
    let evil = "<script>alert(1)</script>\"'&\"><img src=x onerror=alert(2)>";
    let mut r = report(evil);
    r.findings[0].message = evil.into();
    r.findings[0].action = Some(evil.into());
    r.checks[0].ranks[0].notes.insert(evil.into(), evil.into());
    let ctx = RunContext {
        job: Some(evil.into()),
        workspace: Some(evil.into()),
        timeline: vec![TimelineEntry { state: evil.into(), at: at("2026-11-30T09:59:58Z"), detail: evil.into() }],
        links: vec![Link { label: evil.into(), href: evil.into() }],
        left_out: vec![evil.into()],
    };
    let html = page(&r, &ctx);
    assert!(!html.contains("<script"), "a raw script tag");
    assert!(!html.contains("<img"), "a raw img tag");
    assert!(!html.contains("onerror=alert(2)>"), "an attribute broken out of");
    assert!(
        html.contains("&#60;script&#62;alert(1)&#60;/script&#62;")
            || html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
        "escaped"
    );
    assert!(html.contains("&#38;") || html.contains("&amp;"));
}

#[test]
fn an_empty_report_renders_without_charts() {
    let mut r = report("gpu-b");
    r.checks.clear();
    r.findings.clear();
    r.node_verdicts.clear();
    r.pair_bandwidth.clear();
    r.events.clear();
    r.status = RunStatus::Passed;
    let html = page(&r, &RunContext::default());
    assert_eq!(html.matches("<svg").count(), 0);
    assert!(html.contains("No findings.") && html.contains("No state changes recorded.") && html.contains(">PASSED<"));
}

#[test]
fn a_rank_judged_against_the_fleet_shows_its_percentile_and_baseline() {
    let mut r = report("gpu-b");
    let gemm = r.checks.iter_mut().find(|c| c.name.as_str() == "gemm").expect("gemm");
    let b = gpusanity_common::fleet::Learned { centre: 680.0, spread: 5.0, samples: 150, nodes: 9, window: 200 };
    let judging = gpusanity_common::fleet::Judging::DEFAULT;
    gemm.ranks[0].fleet = Some(Box::new(gpusanity_common::fleet::judge("tflops", 690.0, &b, judging, "fleet")));
    gemm.ranks[3].fleet = Some(Box::new(gpusanity_common::fleet::judge("tflops", 402.0, &b, judging, "fleet")));
    let html = page(&r, &RunContext::default());
    assert!(html.contains("passed figures\">fleet pct</th><th>status</th>"), "{html}");
    assert!(html.contains(">97.7</span>"), "rank 0 at +2 spreads");
    assert!(html.contains(">0.0 (below)</span>"), "rank 3 far below");
    assert!(html.contains("150 samples of 9 nodes, window 200"));
    // Ranks 1 and 2 were not judged: a dash in the column, the row as wide as the header.
    let gemm = &html[html.find("id=\"checks\"").expect("checks")..];
    let row = |rank: usize| {
        let start = gemm.find(&format!("<td class=\"num\">{rank}</td><td>gpu-")).expect("row");
        gemm[start..].split("</tr>").next().unwrap_or_default().to_string()
    };
    assert_eq!(row(1).matches("<td").count(), row(0).matches("<td").count(), "{}\n{}", row(0), row(1));
    assert!(row(1).contains("<td class=\"num\">-</td><td class=\"ok\">"), "{}", row(1));
    // A report without fleet judgements has no such column.
    assert!(!page(&report("gpu-b"), &RunContext::default()).contains("fleet pct"));
}
