use super::file::{BaselineError, BaselineFile, MAX_FILE_BYTES};
use super::*;

fn samples(values: &[f64], nodes: usize) -> Vec<Sample> {
    values.iter().enumerate().map(|(i, v)| Sample { node: format!("n{}", i % nodes), value: *v }).collect()
}

#[test]
fn the_normal_cdf_and_quantile_agree_with_tables() {
    assert!((normal_cdf(0.0) - 0.5).abs() < 1e-7);
    assert!((normal_cdf(-1.0) - 0.158_655_25).abs() < 1e-6);
    assert!((normal_cdf(3.0) - 0.998_650_1).abs() < 1e-6);
    assert!((normal_quantile(0.999) - 3.090_232).abs() < 1e-4);
    assert!((normal_quantile(0.5)).abs() < 1e-6);
    assert!(normal_quantile(1.5).is_nan() && normal_cdf(f64::NAN).is_nan());
    assert_eq!(normal_quantile(0.0), f64::NEG_INFINITY);
}

#[test]
fn a_baseline_needs_enough_samples_and_nodes() {
    let p = Policy { window: 10, min_samples: 5, min_nodes: 3 };
    assert!(learn(&samples(&[1.0; 4], 4), p).is_none(), "4 samples");
    assert!(learn(&samples(&[1.0; 8], 2), p).is_none(), "2 nodes");
    let l = learn(&samples(&[1.0; 8], 3), p).expect("8 samples of 3 nodes");
    assert_eq!((l.centre, l.spread, l.samples, l.nodes, l.window), (1.0, 0.0, 8, 3, 10));
    // Non-finite and non-positive figures are not samples.
    assert!(learn(&samples(&[f64::NAN, 0.0, -1.0, 1.0, 1.0, 1.0, 1.0], 3), p).is_none());
}

#[test]
fn the_window_keeps_the_newest_samples_and_resists_outliers() {
    let p = Policy { window: 5, min_samples: 5, min_nodes: 1 };
    // Newest first: the five newest are 10..14, the old 100s fall out of the window.
    let mut v = vec![10.0, 11.0, 12.0, 13.0, 14.0];
    v.extend([100.0; 20]);
    let l = learn(&samples(&v, 5), p).expect("baseline");
    assert_eq!((l.centre, l.samples), (12.0, 5));
    assert!((l.spread - MAD_SCALE).abs() < 1e-12, "MAD 1 x 1.4826");
    // One wild figure moves neither the median nor the MAD much.
    let l = learn(&samples(&[10.0, 11.0, 12.0, 13.0, 1e9], 5), p).expect("baseline");
    assert_eq!(l.centre, 12.0);
    assert!((l.spread - MAD_SCALE).abs() < 1e-12);
}

#[test]
fn a_figure_below_k_spreads_or_the_least_gap_is_below_the_fleet() {
    let b = Learned { centre: 100.0, spread: 2.0, samples: 50, nodes: 5, window: 200 };
    let j = Judging { k: 4.0, min_gap: 0.03 };
    assert_eq!(j.floor(100.0, 2.0), 92.0);
    assert!(!judge("tflops", 92.5, &b, j, "").below);
    let low = judge("tflops", 91.0, &b, j, "");
    assert!(low.below && low.percentile < 0.01 && low.floor == 92.0);
    assert!((judge("tflops", 100.0, &b, j, "").percentile - 50.0).abs() < 1e-4);
    // A fleet that does not spread: the least gap decides, not a 0.1% dip.
    let flat = Learned { spread: 0.0, ..b };
    assert!(!judge("tflops", 99.9, &flat, j, "").below);
    assert!(judge("tflops", 96.9, &flat, j, "").below);
    assert_eq!(percentile(99.0, 100.0, 0.0), 0.0);
    for bad in
        [Judging { k: f64::NAN, ..j }, Judging { k: 0.0, ..j }, Judging { k: 51.0, ..j }, Judging { min_gap: 1.0, ..j }]
    {
        assert!(bad.validate().is_err(), "{bad:?}");
    }
    assert!(Judging::DEFAULT.validate().is_ok());
}

#[test]
fn driver_major_versions() {
    assert_eq!(driver_major("580.95.05"), Some(580));
    assert_eq!(driver_major(" 550 "), Some(550));
    assert_eq!(driver_major("unknown"), None);
}

const GOOD: &str = r#"
[judging]
k = 5.0
min_gap = 0.02

[[entry]]
device = "NVIDIA H200"
driver = 580
check = "gemm"
metric = "tflops"
value = 685.0
spread = 6.5
samples = 200
nodes = 16
window = 200
size = 8192
single_node = true
ranks_per_node = 8
link = "nvlink"
source = "fleet"
"#;

fn key() -> Key {
    let when = Conditions {
        size: Some(8192),
        max_bytes: None,
        nodes: 1,
        ranks_per_node: Some(8),
        link: Some(crate::kinds::Link::Nvlink),
    };
    Key::new("NVIDIA H200", Some(580), CheckId::Gemm, "tflops", when)
}

#[test]
fn a_baseline_file_parses_round_trips_and_matches_its_exact_key() {
    let f = BaselineFile::parse(GOOD).expect("parses");
    assert_eq!(f.judging(), Judging { k: 5.0, min_gap: 0.02 });
    let e = f.lookup(&key()).expect("its key");
    assert_eq!((e.value, e.spread, e.samples), (685.0, 6.5, 200));
    assert!(f.lookup(&Key { driver: Some(550), ..key() }).is_none(), "another driver");
    assert!(f.lookup(&Key { device: "NVIDIA H200 NVL".into(), ..key() }).is_none(), "another model");
    assert!(f.lookup(&Key { ranks_per_node: Some(4), ..key() }).is_none(), "another shape");
    let text = f.to_text("learned from 3 runs").expect("serialises");
    assert!(text.starts_with("# learned from 3 runs\n"));
    assert_eq!(BaselineFile::parse(&text).expect("round trip"), f);
    let e = BaselineEntry { ..f.entries[0].clone() };
    assert_eq!(file::BaselineEntry::new(&e.key(), &e.learned(), e.source.clone()), e);
    assert_eq!(BaselineFile::parse("").expect("empty file").judging(), Judging::DEFAULT);
}

use file::BaselineEntry;

#[test]
fn hostile_baseline_files_are_refused_with_one_error() {
    let with = |from: &str, to: &str| GOOD.replacen(from, to, 1);
    let cases: Vec<(String, &str)> = vec![
        (with("value = 685.0", "value = nan"), "value must be"),
        (with("value = 685.0", "value = inf"), "value must be"),
        (with("value = 685.0", "value = -1.0"), "value must be"),
        (with("spread = 6.5", "spread = 1e300"), "spread must be"),
        (with("spread = 6.5", "spread = -0.1"), "spread must be"),
        (with("samples = 200", "samples = 0"), "samples must be"),
        (with("samples = 200", "samples = -5"), "not valid"),
        (with("window = 200", "window = 10"), "samples must be"),
        (with("nodes = 16", "nodes = 500"), "nodes must be"),
        (with("metric = \"tflops\"", "metric = \"gbps\""), "headline metric"),
        (with("check = \"gemm\"", "check = \"rm -rf\""), "not valid"),
        (with("check = \"gemm\"", "check = \"gpu-health\""), "no headline metric"),
        (with("k = 5.0", "k = 0.0"), "[judging]"),
        (with("min_gap = 0.02", "min_gap = nan"), "[judging]"),
        (with("size = 8192", "size = 0"), "above 0"),
        (with("source = \"fleet\"", "sauce = 1"), "not valid"),
        (with("device = \"NVIDIA H200\"", &format!("device = \"{}\"", "x".repeat(300))), "device must be"),
        (format!("{GOOD}{}", &GOOD[GOOD.find("[[entry]]").unwrap_or(0)..]), "same key"),
        ("[[entry]\n".to_string(), "not valid"),
        ("\u{0}".to_string(), "not valid"),
    ];
    for (text, want) in cases {
        let err = BaselineFile::parse(&text).expect_err(want).to_string();
        assert!(err.contains(want), "{want}: {err}");
        assert_eq!(err.lines().count(), 1, "one line: {err}");
    }
    let huge = "#".repeat(MAX_FILE_BYTES as usize + 1);
    assert!(matches!(BaselineFile::parse(&huge), Err(BaselineError::TooLarge)));
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("big.toml");
    std::fs::write(&path, &huge).expect("write");
    assert!(matches!(BaselineFile::read(&path), Err(BaselineError::TooLarge)));
    std::fs::write(&path, [0xff, 0xfe]).expect("write");
    assert!(matches!(BaselineFile::read(&path), Err(BaselineError::Syntax(_))));
    assert!(matches!(BaselineFile::read(&dir.path().join("none")), Err(BaselineError::Io { .. })));
    std::fs::write(&path, GOOD).expect("write");
    assert_eq!(BaselineFile::read(&path).expect("reads").entries.len(), 1);
}

/// A gemm check of two CPU ranks on two nodes: `tflops` each, and `tflops_cpu` where given.
fn cpu_gemm(per_cpu: [Option<f64>; 2]) -> (crate::report::CheckReport, Vec<crate::report::RankInfo>) {
    let ranks: Vec<crate::report::RankInfo> = (0..2)
        .map(|r| {
            serde_json::from_value(serde_json::json!({
                "rank": r, "node_rank": r, "local_rank": 0, "host": format!("h{r}"), "device": "cpu", "pid": 1
            }))
            .expect("rank info")
        })
        .collect();
    let results: Vec<serde_json::Value> = per_cpu
        .iter()
        .enumerate()
        .map(|(r, cpu)| {
            let mut metrics = serde_json::json!({ "tflops": 0.05 });
            if let Some(c) = cpu {
                metrics["tflops_cpu"] = serde_json::json!(c);
            }
            serde_json::json!({ "rank": r, "status": "passed", "metrics": metrics })
        })
        .collect();
    let check = serde_json::json!({
        "name": "gemm", "status": "passed", "duration_s": 1.0, "config": { "size": 256 }, "ranks": results
    });
    (serde_json::from_value(check).expect("check report"), ranks)
}

#[test]
fn cpu_workers_are_learned_and_judged_per_cpu_second_under_a_key_that_says_so() {
    use crate::kinds::DeviceKind;
    let drivers = std::collections::BTreeMap::new();
    let (c, ranks) = cpu_gemm([Some(0.09), Some(0.08)]);
    let keys = samples::rank_keys(&c, &ranks, &drivers, DeviceKind::Cpu);
    let got: Vec<(usize, &str, f64)> = keys.iter().map(|(r, k, v)| (*r, k.metric.as_str(), *v)).collect();
    assert_eq!(got, vec![(0, "tflops_cpu", 0.09), (1, "tflops_cpu", 0.08)]);
    // A rank without a CPU time: the whole check falls back to the wall clock, as the peers do.
    let (c, ranks) = cpu_gemm([Some(0.09), None]);
    let keys = samples::rank_keys(&c, &ranks, &drivers, DeviceKind::Cpu);
    assert!(keys.iter().all(|(_, k, v)| k.metric == "tflops" && *v == 0.05), "{keys:?}");
    // GPUs time themselves: the wall clock, even were a per-CPU figure there.
    let (c, ranks) = cpu_gemm([Some(0.09), Some(0.08)]);
    let keys = samples::rank_keys(&c, &ranks, &drivers, DeviceKind::Cuda);
    assert!(keys.iter().all(|(_, k, _)| k.metric == "tflops"), "{keys:?}");
    // The file takes the per-CPU-second figure as its own key, never mixed with the wall clock.
    let cpu = GOOD.replacen("metric = \"tflops\"", "metric = \"tflops_cpu\"", 1);
    let both = format!("{GOOD}{}", &cpu[cpu.find("[[entry]]").unwrap_or(0)..]);
    let f = BaselineFile::parse(&both).expect("a wall-clock and a per-CPU-second entry");
    assert_eq!(f.lookup(&key()).map(|e| e.metric.as_str()), Some("tflops"));
    let per_cpu = Key { metric: "tflops_cpu".into(), ..key() };
    assert_eq!(f.lookup(&per_cpu).map(|e| e.metric.as_str()), Some("tflops_cpu"));
    for bad in ["gbps_cpu", "tflops_cpu_cpu", "cpu"] {
        let text = GOOD.replacen("metric = \"tflops\"", &format!("metric = \"{bad}\""), 1);
        let err = BaselineFile::parse(&text).expect_err(bad).to_string();
        assert!(err.contains("headline metric"), "{bad}: {err}");
    }
}
