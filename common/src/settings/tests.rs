use super::*;

#[test]
fn defaults_are_the_specified_ones() {
    let s = Settings::default();
    assert_eq!(s.timing, Timing::BeforeJobRunning);
    assert_eq!(s.max_time_minutes, 30.0);
    assert_eq!(s.timeout_ops, TimeoutOps::MarkJobFail);
    assert!(s.envs.is_empty());
    assert_eq!(s.timeout_per_test_minutes, 6.0);
    assert_eq!(s.micro_benchmarks, [CheckId::Gemm, CheckId::AllReduce, CheckId::GpuHealth]);
    assert!(s.model_benchmarks.is_empty());
    assert_eq!(s.max_time(), Duration::from_secs(1800));
}

#[test]
fn a_jobs_example_string() {
    let s =
        Settings::from_args_str("--sanity-check-timing=AfterJobFaultTolerant --sanity-check-timeout-ops=MarkJobFail")
            .unwrap();
    assert_eq!(s.timing, Timing::AfterJobFaultTolerant);
    assert_eq!(s.timeout_ops, TimeoutOps::MarkJobFail);
    assert_eq!(s.micro_benchmarks, [CheckId::Gemm, CheckId::AllReduce, CheckId::GpuHealth]);
}

#[test]
fn every_option_both_spellings() {
    let s = Settings::from_args_str(
        "--sanity-check-timing BeforeJobRunning --sanity-check-max-time=2.5 \
         --sanity-check-timeout-ops KeepJobHang --sanity-check-envs='A=1,B_2=x y' \
         --sanity-check-timeout-per-test 0.5 --micro-benchmarks=all-reduce --model-benchmarks=",
    )
    .unwrap();
    assert_eq!(s.max_time_minutes, 2.5);
    assert_eq!(s.timeout_ops, TimeoutOps::KeepJobHang);
    assert_eq!(s.envs, [("A".into(), "1".into()), ("B_2".into(), "x y".into())]);
    assert_eq!(s.timeout_per_test(), Duration::from_secs(30));
    assert_eq!(s.micro_benchmarks, [CheckId::AllReduce]);
    // Round trip through the string form.
    assert_eq!(Settings::from_args_str(&s.to_args_string()).unwrap(), s);
}

#[test]
fn empty_string_is_defaults() {
    assert_eq!(Settings::from_args_str("  ").unwrap(), Settings::default());
}

#[test]
fn bad_inputs_give_clear_errors() {
    let cases = [
        ("--sanity-check-timing=Sometimes", "bad value `Sometimes` for --sanity-check-timing"),
        ("--sanity-check-max-time=-5", "positive number of minutes"),
        ("--sanity-check-max-time=0", "positive number of minutes"),
        ("--sanity-check-max-time=NaN", "positive number of minutes"),
        ("--sanity-check-timeout-per-test=abc", "positive number of minutes"),
        ("--sanity-check-timeout-ops=Retry", "one of: MarkJobFail KeepJobHang"),
        ("--sanity-check-envs=NOEQUALS", "KEY=VALUE"),
        ("--sanity-check-envs=1A=2", "KEY=VALUE"),
        ("--micro-benchmarks=gemm,warp-drive", "unknown check `warp-drive`"),
        ("--model-benchmarks=gemm", "unknown check `gemm` in --model-benchmarks"),
        ("--micro-benchmarks=gemm,gemm", "check `gemm` is listed twice in --micro-benchmarks"),
        ("--model-benchmarks=resnet,mini-gpt,resnet", "check `resnet` is listed twice"),
        ("--micro-benchmarks= --model-benchmarks=", "no check selected"),
        ("--sanity-check-colour=red", "unknown option `--sanity-check-colour`"),
        ("--sanity-check-timing", "needs a value"),
        ("gemm", "not an option"),
        ("--sanity-check-envs='A=1", "unbalanced quotes"),
    ];
    for (input, want) in cases {
        let err = Settings::from_args_str(input).unwrap_err().to_string();
        assert!(err.contains(want), "{input}: got `{err}`, want `{want}`");
    }
}
