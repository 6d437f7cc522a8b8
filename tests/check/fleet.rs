//! `gpusanity check --baseline FILE`: every rank's headline figure against its fleet baseline,
//! through the real binary on CPU workers. A baseline far above what the CPU measures names
//! every rank (BELOW_FLEET, exit 1); one that matches passes and shows each rank's percentile;
//! a malformed file is refused before any worker starts. CPU workers are judged per CPU-second
//! (`tflops_cpu`): an entry of the wall-clock figure judges nothing there. A rank below the
//! fleet's floor is re-measured before it is named: below only in its first measurement, or
//! only in the first two (measured again after a pause), it passes (the report says why it was
//! re-measured); below in all five, it is named with its figures.

use gpusanity_testkit::common;

use std::path::Path;
use std::time::Duration;

use common::*;
use serde_json::Value;

const LIMIT: Duration = Duration::from_secs(90);
const ARGS: [&str; 2] = ["--nproc-per-node=2", "--micro-benchmarks=gemm"];

fn gemm(r: &Value) -> &Value {
    r["checks"].as_array().unwrap().iter().find(|c| c["name"] == "gemm").expect("a gemm check")
}

/// A run without a baseline: its report, the device name it reports and the GEMM's size.
fn plain_run(args: &[&str]) -> (Value, String, u64) {
    let plain = Run::new();
    let out = run_with_timeout(plain.command(args), LIMIT);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let r = plain.report();
    let device = r["ranks"][0]["device"].as_str().expect("device").to_string();
    let size = gemm(&r)["config"]["size"].as_u64().expect("gemm size");
    (r, device, size)
}

/// A baseline file with one GEMM entry of `metric` for this run's device and shape.
fn write_baseline(path: &Path, device: &str, size: u64, metric: &str, centre: f64, spread: f64) {
    std::fs::write(path, entry(device, size, 2, metric, centre, spread)).expect("write the baseline");
}

/// One GEMM entry's text, for `ranks` ranks on one node.
fn entry(device: &str, size: u64, ranks: usize, metric: &str, centre: f64, spread: f64) -> String {
    format!(
        "[[entry]]\ndevice = {device:?}\ncheck = \"gemm\"\nmetric = {metric:?}\nvalue = {centre:e}\nspread = {spread:e}\n\
         samples = 40\nnodes = 5\nwindow = 200\nsize = {size}\nsingle_node = true\nranks_per_node = {ranks}\n\
         source = \"test fleet\"\n"
    )
}

#[test]
fn a_baseline_judges_every_rank_and_names_one_far_below_it() {
    let _g = serial();
    // First a run without a baseline: what this CPU measures, and the device name it reports.
    let (r, device, size) = plain_run(&ARGS);
    let figures: Vec<f64> =
        gemm(&r)["ranks"].as_array().unwrap().iter().map(|x| x["metrics"]["tflops_cpu"].as_f64().unwrap()).collect();
    let centre = figures.iter().sum::<f64>() / figures.len() as f64;
    assert!(gemm(&r)["ranks"][0].get("fleet").is_none(), "no baseline, no fleet entry");

    // A matching baseline (its spread wide enough for a shared CPU): passes, percentiles shown.
    let run = Run::new();
    let file = run.dir.path().join("baseline.toml");
    write_baseline(&file, &device, size, "tflops_cpu", centre, 0.3 * centre);
    let out = run_with_timeout(run.command(&[ARGS[0], ARGS[1], "--baseline", file.to_str().unwrap()]), LIMIT);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let r = run.report();
    assert_eq!(r["status"], "passed", "{}", r["summary"]);
    for rank in gemm(&r)["ranks"].as_array().unwrap() {
        let f = &rank["fleet"];
        let p = f["percentile"].as_f64().expect("a percentile");
        assert!((0.0..=100.0).contains(&p), "{f}");
        assert_eq!(
            (f["samples"].as_u64(), f["window"].as_u64(), f["below"].as_bool()),
            (Some(40), Some(200), Some(false))
        );
        assert_eq!((&f["source"], &f["metric"]), (&Value::from("test fleet"), &Value::from("tflops_cpu")));
    }
    let summary = String::from_utf8_lossy(&out.stdout).to_string() + &stderr(&out);
    assert!(summary.contains("fleet: percentile"), "the terminal summary shows it: {summary}");

    // A wall-clock baseline a thousand times above this CPU: not the figure a CPU is judged on.
    let run = Run::new();
    let file = run.dir.path().join("baseline.toml");
    write_baseline(&file, &device, size, "tflops", 1000.0 * centre, 10.0 * centre);
    let out = run_with_timeout(run.command(&[ARGS[0], ARGS[1], "--baseline", file.to_str().unwrap()]), LIMIT);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(gemm(&run.report())["ranks"][0].get("fleet").is_none(), "a wall-clock entry judged a CPU");

    // A baseline per CPU-second a thousand times above this CPU: every rank below, exit 1.
    let run = Run::new();
    let file = run.dir.path().join("baseline.toml");
    write_baseline(&file, &device, size, "tflops_cpu", 1000.0 * centre, 10.0 * centre);
    let out = run_with_timeout(run.command(&[ARGS[0], ARGS[1], "--baseline", file.to_str().unwrap()]), LIMIT);
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    let r = run.report();
    assert_eq!(r["status"], "failed");
    let below: Vec<(String, Option<u64>)> = findings(&r).into_iter().filter(|(c, _)| c == "BELOW_FLEET").collect();
    assert_eq!(
        below,
        [("BELOW_FLEET".to_string(), Some(0)), ("BELOW_FLEET".to_string(), Some(1))],
        "{}",
        r["findings"]
    );
    let f = r["findings"].as_array().unwrap().iter().find(|f| f["code"] == "BELOW_FLEET").unwrap();
    assert_eq!(f["check"], "gemm");
    assert!(f["evidence"][0].as_str().unwrap().contains("40 samples of 5 nodes (window 200)"), "{f}");
    assert_eq!(gemm(&r)["ranks"][0]["fleet"]["below"], true);
    run.assert_nothing_left();

    // Another shape (one rank per node): the entry does not hold, nothing is judged.
    let run = Run::new();
    let out =
        run_with_timeout(run.command(&["--nproc-per-node=1", ARGS[1], "--baseline", file.to_str().unwrap()]), LIMIT);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(gemm(&run.report())["ranks"][0].get("fleet").is_none());
}

#[test]
fn a_malformed_baseline_is_refused_before_any_worker_starts() {
    let _g = serial();
    let run = Run::new();
    let file = run.dir.path().join("baseline.toml");
    let cases = [
        ("[[entry]]\ndevice = \"x\"\ncheck = \"gemm\"\nmetric = \"tflops\"\nvalue = nan\nspread = 1.0\nsamples = 1\nnodes = 1\nwindow = 1\n", "value must be"),
        ("[judging]\nk = -3.0\n", "k must be"),
        ("not = [toml", "not valid"),
    ];
    for (text, want) in cases {
        std::fs::write(&file, text).unwrap();
        let out = run_with_timeout(run.command(&[ARGS[0], ARGS[1], "--baseline", file.to_str().unwrap()]), LIMIT);
        assert_eq!(code(&out), 2, "{want}: {}", stderr(&out));
        assert!(stderr(&out).contains(want), "{want}: {}", stderr(&out));
        assert!(!run.report_dir().join("report.json").exists(), "no run");
    }
    let out = run_with_timeout(run.command(&[ARGS[0], ARGS[1], "--baseline", "/nonexistent/baseline.toml"]), LIMIT);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
}

/// One rank alone (no peers, no expected figure on CPU: only the fleet can call for a
/// re-measure), with `fault` injected, against a baseline whose floor is half this CPU's own
/// figure per CPU-second (a least gap of 50%: far from a shared machine's noise, far above a
/// rank that does eight times the work).
fn one_rank_against_the_fleet(fault: &str) -> (std::process::Output, Value, Run) {
    let one = ["--nproc-per-node=1", ARGS[1]];
    let (r, device, size) = plain_run(&one);
    let centre = gemm(&r)["ranks"][0]["metrics"]["tflops_cpu"].as_f64().expect("a figure per CPU-second");

    let run = Run::new();
    let file = run.dir.path().join("baseline.toml");
    let text = format!(
        "[judging]\nk = 4.0\nmin_gap = 0.5\n\n{}",
        entry(&device, size, 1, "tflops_cpu", centre, 0.01 * centre)
    );
    std::fs::write(&file, text).expect("write the baseline");
    let envs = format!("--sanity-check-envs=GPUSANITY_FAULT={fault}");
    let args = [one[0], one[1], "--test-faults", &envs, "--baseline", file.to_str().unwrap()];
    let out = run_with_timeout(run.command(&args), LIMIT);
    let r = run.report();
    (out, r, run)
}

#[test]
fn a_rank_below_the_fleet_only_in_its_first_measurement_is_re_measured_and_passes() {
    let _g = serial();
    let (out, r, run) = one_rank_against_the_fleet("gemm-slow-once@0");
    assert_eq!(code(&out), 0, "{}\n{}", stderr(&out), r["findings"]);
    assert_eq!((&r["status"], findings(&r)), (&Value::from("passed"), vec![]));
    let notes = r["remeasured"].as_array().expect("remeasured");
    assert_eq!(notes.len(), 1, "{notes:?}");
    let note = notes[0].as_str().unwrap();
    assert!(note.starts_with("gemm: ") && note.contains("rank 0 at "), "{note}");
    assert!(note.contains("below the fleet floor") && note.contains("per CPU-second"), "{note}");
    assert!(!note.contains("peers"), "no peers to be slow against: {note}");
    assert!(!note.contains("measured again"), "cleared in the re-measure: {note}");
    // The diagnosis judged the second figure, the one that counts; the first is kept.
    let rank = &gemm(&r)["ranks"][0];
    let fleet = &rank["fleet"];
    let floor = fleet["floor"].as_f64().expect("a floor");
    let (first, second) = (
        rank["metrics"]["first_tflops_cpu"].as_f64().expect("the first figure kept"),
        fleet["value"].as_f64().unwrap(),
    );
    assert_eq!(Some(second), rank["metrics"]["tflops_cpu"].as_f64());
    assert_eq!(rank["metrics"]["measurements"].as_f64(), Some(2.0));
    assert!(first < floor && floor < second, "first {first}, floor {floor}, second {second}");
    assert_eq!(fleet["below"], false);
    run.assert_nothing_left();
}

#[test]
fn a_rank_below_the_fleet_in_its_first_two_measurements_clears_the_third_and_passes() {
    let _g = serial();
    // Contention that outlasts the re-measure: slow in the first two measurements only.
    let (out, r, run) = one_rank_against_the_fleet("gemm-slow-twice@0");
    assert_eq!(code(&out), 0, "{}\n{}", stderr(&out), r["findings"]);
    assert_eq!((&r["status"], findings(&r)), (&Value::from("passed"), vec![]));
    let note = r["remeasured"][0].as_str().unwrap_or_default();
    assert!(note.contains("measured again after 0.5 s (rank 0 at "), "{note}");
    assert!(!note.contains("measured again after 1 s"), "cleared in the third: {note}");
    let rank = &gemm(&r)["ranks"][0];
    assert_eq!(rank["metrics"]["measurements"].as_f64(), Some(3.0), "{rank}");
    let fleet = &rank["fleet"];
    let floor = fleet["floor"].as_f64().expect("a floor");
    let (first, last) = (
        rank["metrics"]["first_tflops_cpu"].as_f64().expect("the first figure kept"),
        fleet["value"].as_f64().unwrap(),
    );
    assert!(first < floor && floor < last, "first {first}, floor {floor}, judged {last}");
    run.assert_nothing_left();
}

#[test]
fn a_rank_below_the_fleet_in_every_measurement_is_named_with_its_figures() {
    let _g = serial();
    let (out, r, run) = one_rank_against_the_fleet("gemm-slow@0");
    assert_eq!(code(&out), 1, "{}\n{}", stderr(&out), r["findings"]);
    assert_eq!(findings(&r), [("BELOW_FLEET".to_string(), Some(0))]);
    let note = r["remeasured"][0].as_str().unwrap_or_default();
    assert!(note.contains("below the fleet floor"), "{}", r["remeasured"]);
    // Measured again after each pause (remeasure::PAUSES), five times in all.
    for pause in ["0.5 s", "1 s", "2 s"] {
        assert!(note.contains(&format!("measured again after {pause} (rank 0 at ")), "{note}");
    }
    assert_eq!(gemm(&r)["ranks"][0]["metrics"]["measurements"].as_f64(), Some(5.0));
    let f = r["findings"].as_array().unwrap().iter().find(|f| f["code"] == "BELOW_FLEET").unwrap();
    assert!(
        f["evidence"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e.as_str().unwrap_or("").starts_with("below the fleet floor in all 5 measurements: first ")),
        "{f}"
    );
    assert_eq!(gemm(&r)["ranks"][0]["fleet"]["below"], true);
    run.assert_nothing_left();
}
