//! The HTML run page through the real binary: a CPU `gpusanity check` with a slow gemm rank
//! writes report.html naming the faulty node and rank with its charts, `gpusanity report`
//! renders the same page again, bad input is one line and exit code 2, and a run of every
//! check renders every section.

use gpusanity_testkit::common;

use std::process::Command;
use std::time::Duration;

use common::*;

const LIMIT: Duration = Duration::from_secs(90);

/// `gpusanity report INPUT -o OUT`.
fn report_cmd(input: &std::path::Path, out: &std::path::Path) -> Command {
    let mut c = Command::new(bin());
    c.arg("report").arg(input).arg("-o").arg(out);
    c
}

/// The text of the `<svg>` that carries `title`.
fn chart<'a>(html: &'a str, title: &str) -> &'a str {
    let at = html.find(title).unwrap_or_else(|| panic!("no chart {title}"));
    let start = html[..at].rfind("<svg").expect("svg start");
    let end = at + html[at..].find("</svg>").expect("svg end");
    &html[start..end]
}

#[test]
fn a_slow_gemm_rank_is_named_on_the_page_and_report_renders_the_same_page() {
    let _g = serial();
    let run = Run::new();
    let out = run_with_timeout(
        run.command(&[
            "--test-faults",
            "--sanity-check-envs=GPUSANITY_FAULT=gemm-slow@1",
            "--micro-benchmarks=gemm,all-reduce",
            "--check-param",
            "diagnosis.slow-fraction=0.8",
        ]),
        LIMIT,
    );
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    let dir = run.report_dir();
    let html = std::fs::read_to_string(dir.join("report.html")).expect("report.html");
    assert!(html.contains(">FAILED</span>"), "verdict");
    let host = run.report()["ranks"][1]["host"].as_str().expect("host").to_string();
    assert!(html.contains(&format!("Faulty nodes — isolate: node 0 ({host})")), "faulty node named");
    assert!(html.contains("GEMM_SLOW</span> in gemm"), "finding");
    assert!(html.contains(&format!("node 0 · host {host} · rank 1")), "finding's place");
    // The gemm chart: rank 1's bar is critical, the others are not, the median is drawn.
    let gemm = chart(&html, "gemm: TFLOP/s");
    let bars: Vec<&str> =
        gemm.split("<g class=\"bar-").skip(1).map(|g| &g[..g.find("</g>").unwrap_or(g.len())]).collect();
    let bar_of = |r: usize| {
        bars.iter()
            .find(|g| g.contains(&format!("<title>rank {r}: ")))
            .unwrap_or_else(|| panic!("no bar of rank {r}: {gemm}"))
    };
    assert!(bar_of(1).starts_with("critical\""), "{gemm}");
    assert!(bar_of(0).starts_with("ok\""), "{gemm}");
    assert_eq!(gemm.matches("bar-critical").count(), 1, "{gemm}");
    assert!(gemm.contains("median "), "{gemm}");
    // All-reduce: per-rank bars and bandwidth against message size on a log2 axis.
    let sweep = chart(&html, "all-reduce: bandwidth vs message size");
    assert_eq!(sweep.matches("<polyline").count(), 2, "two ranks' busbw (algbw equals busbw on 2 ranks)");
    assert!(sweep.contains(">4 KiB<") && sweep.contains(">4 MiB<"), "{sweep}");
    assert!(html.matches("<svg").count() >= 4, "gemm, all-reduce bars and sweep, the timeline strip");

    // `gpusanity report` renders the very same page.
    let again = run.dir.path().join("again.html");
    let out = run_with_timeout(report_cmd(&dir.join("report.json"), &again), LIMIT);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(std::fs::read(&again).expect("again.html"), html.as_bytes(), "byte-equal pages");

    // Hostile strings in a report render as text.
    let evil = "<script>alert(1)</script>\"'&\"><img src=x onerror=alert(2)>";
    let mut hostile = run.report();
    hostile["summary"] = evil.into();
    hostile["findings"][0]["message"] = evil.into();
    hostile["findings"][0]["evidence"] = serde_json::json!([evil]);
    for r in hostile["ranks"].as_array_mut().expect("ranks") {
        r["host"] = evil.into();
        r["device"] = evil.into();
    }
    hostile["node_verdicts"][0]["host"] = evil.into();
    let (input, page) = (run.dir.path().join("hostile.json"), run.dir.path().join("hostile.html"));
    std::fs::write(&input, hostile.to_string()).expect("write");
    let out = run_with_timeout(report_cmd(&input, &page), LIMIT);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let page = std::fs::read_to_string(&page).expect("hostile.html");
    assert!(!page.contains("<script") && !page.contains("<img"), "raw tags on the page");
    assert!(
        page.contains("&#60;script&#62;alert(1)&#60;/script&#62;")
            || page.contains("&lt;script&gt;alert(1)&lt;/script&gt;")
    );

    // A malformed or missing file: one line, exit 2, no page written.
    let bad = run.dir.path().join("bad.json");
    std::fs::write(&bad, "{\"schema_version\": 1, \"run_id\": ").expect("write");
    for input in [bad.clone(), run.dir.path().join("missing.json")] {
        let out_html = run.dir.path().join("bad.html");
        let out = run_with_timeout(report_cmd(&input, &out_html), LIMIT);
        assert_eq!(code(&out), 2, "{}", stderr(&out));
        assert_eq!(stderr(&out).trim_end().lines().count(), 1, "{}", stderr(&out));
        assert!(!out_html.exists());
    }
    run.assert_nothing_left();
}

const EVERY_CHECK: [&str; 4] = [
    "--micro-benchmarks=gemm,kernel-launch,all-reduce,all-to-all,all-gather,multi-all-reduce,network-connectivity,matmul-all-reduce-overlap",
    "--model-benchmarks=mini-gpt,megatron-gpt,resnet",
    "--check-param",
    "diagnosis.slow-fraction=0.05",
];

#[test]
fn every_check_on_three_nodes_renders_every_section() {
    let _g = serial();
    let run = Run::new();
    // Three single-worker nodes on loopback: the launcher adds the link test (pair-bandwidth).
    let port = free_port();
    let nodes: Vec<_> = (0..3).rev().map(|n| run.spawn_node(&EVERY_CHECK, 3, n, port)).collect();
    for out in nodes.into_iter().map(|c| wait_output(c, LIMIT)) {
        assert!(matches!(code(&out), 0 | 1), "{}", stderr(&out));
    }
    let html = std::fs::read_to_string(run.report_dir().join("report.html")).expect("report.html");
    for id in ["findings", "nodes", "checks", "pairs", "timeline", "settings", "facts"] {
        assert!(html.contains(&format!("<section id=\"{id}\"")), "section {id}");
    }
    assert_eq!(html.matches("<div class=\"check\" id=\"check-").count(), 12, "11 checks and the link test");
    for title in [
        "gemm: TFLOP/s",
        "all-reduce: bandwidth vs message size",
        "all-gather: bandwidth vs message size",
        "all-to-all: bandwidth vs message size",
        "multi-all-reduce: min group busbw GB/s",
        "network-connectivity: front-end network",
        "network-connectivity: back-end network",
        "matmul-all-reduce-overlap: overlapped step ms",
        "mini-gpt: training loss",
        "megatron-gpt: training loss",
        "resnet: training loss",
        "resnet: images/s",
        "mini-gpt: tokens/s",
        "link test: busbw GB/s per node pair",
    ] {
        let c = chart(&html, title);
        assert!(c.contains("<rect") || c.contains("<polyline"), "{title} draws nothing: {c}");
    }
    // Every node pair of the link test is in its heat map.
    let pairs = chart(&html, "link test: busbw GB/s per node pair");
    for (a, b) in [(0, 1), (0, 2), (1, 2)] {
        assert!(pairs.contains(&format!("node{a} (")) && pairs.contains(&format!("node{b} (")));
    }
    assert_eq!(pairs.matches(" GB/s</title>").count(), 6, "{pairs}");
    assert!(html.contains("the CPU backend has no device kernels"), "kernel-launch says why it does not apply");
    run.assert_nothing_left();
}
