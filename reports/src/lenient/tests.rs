use serde_json::json;

use super::*;
use crate::html::{run_page, RunContext};

fn example() -> Value {
    serde_json::from_str(include_str!("../../../docs/examples/report-cpu.json")).expect("example report")
}

#[test]
fn a_report_this_version_writes_reads_as_it_is() {
    let text = example().to_string();
    let got = read(&text).expect("reads");
    assert!(got.left_out.is_empty(), "{:?}", got.left_out);
    assert_eq!(got.report, serde_json::from_str::<Report>(&text).expect("strict"));
}

#[test]
fn unknown_checks_codes_and_details_are_left_out_and_the_rest_renders() {
    let mut v = example();
    let checks = v["checks"].as_array().expect("checks").len();
    // A check, a finding code, a scope, a detail kind and a check in the settings that a newer
    // version knows and this one does not.
    let mut newer = v["checks"][0].clone();
    newer["name"] = json!("x-future-check");
    v["checks"].as_array_mut().expect("checks").insert(1, newer);
    v["checks"][0]["ranks"][0]["detail"] = json!({"kind": "x_future", "cells": [1, 2]});
    let mut f = v["findings"][0].clone();
    f["code"] = json!("X_FUTURE_CODE");
    f["message"] = json!("a finding of the future");
    let mut g = v["findings"][0].clone();
    g["check"] = json!("x-future-check");
    v["findings"].as_array_mut().expect("findings").extend([f, g]);
    v["node_verdicts"][0]["codes"] = json!(["GEMM_SLOW", "X_FUTURE_CODE"]);
    v["settings"]["micro_benchmarks"].as_array_mut().expect("list").push(json!("x-future-check"));

    let strict = serde_json::from_value::<Report>(v.clone());
    assert!(strict.is_err(), "the strict reader refuses it");
    let got = read(&v.to_string()).expect("the lenient reader reads it");
    let said = got.left_out.join("\n");
    assert_eq!(got.left_out.len(), 6, "{said}");
    assert!(said.contains("check \"x-future-check\" (checks[1])"), "{said}");
    assert!(said.contains("checks[0].ranks[0].detail"), "{said}");
    assert!(said.contains("finding \"X_FUTURE_CODE\""), "{said}");
    assert!(said.contains("node_verdicts[0].codes[1]"), "{said}");
    assert!(said.contains("settings.micro_benchmarks"), "{said}");
    let r = &got.report;
    assert_eq!(r.checks.len(), checks);
    assert!(r.checks[0].ranks[0].detail.is_none());
    assert_eq!(r.node_verdicts[0].codes, [gpusanity_common::report::Code::GemmSlow]);
    // Everything known is kept: the first finding, every known check.
    assert_eq!(r.findings.len(), 1);

    let html = run_page(r, &RunContext { left_out: got.left_out.clone(), ..Default::default() }).expect("renders");
    assert!(html.contains("id=\"left-out\""), "the page lists what it left out");
    assert!(html.contains("x-future-check"));
    assert!(html.contains("X_FUTURE_CODE"));
    assert!(html.contains("kernel-launch") && html.contains("mini-gpt"), "known checks still render");
}

#[test]
fn what_cannot_be_left_out_is_an_error() {
    assert!(matches!(read("not json"), Err(LenientError::Malformed(_))));
    // A field of the report itself: nothing to leave out.
    let mut v = example();
    v["status"] = json!("x-future-status");
    assert!(matches!(read(&v.to_string()), Err(LenientError::Malformed(_))));
    let mut v = example();
    v["run_id"] = json!(7);
    assert!(matches!(read(&v.to_string()), Err(LenientError::Malformed(_))));
    // A report made of unknown parts: bounded work, then refused.
    let mut v = example();
    let f = json!({"severity": "critical", "code": "X", "check": "run", "node_rank": null, "host": null, "rank": null, "message": ""});
    v["findings"] = Value::Array(vec![f; MAX_LEFT_OUT + 1]);
    assert!(matches!(read(&v.to_string()), Err(LenientError::TooManyUnknown)));
    // A long unknown name is quoted short.
    let mut v = example();
    v["findings"][0]["code"] = json!("Y".repeat(10_000));
    let got = read(&v.to_string()).expect("reads");
    assert!(got.left_out[0].len() < 400, "{}", got.left_out[0].len());
}
