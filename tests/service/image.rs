//! The image as users run it, built by scripts/image.sh from the very binary these tests ran
//! (no second compile): `gpusanity check` in a container, and the README's service quick start
//! with serve and two agents in containers against the test broker and PostgreSQL. Every
//! container runs as the manifests run it: user 65532, read-only root file system.

use std::time::Duration;

use gpusanity_testkit::image::{
    built_or_skip, give_to_image_user, image_or_skip, podman_output, podman_with, run_args, USER,
};
use gpusanity_testkit::svc::{self, postgres_database, World};

/// The pins of deploy/image/cuda-libs.txt: (package, version).
fn pinned_libraries() -> Vec<(String, String)> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/image/cuda-libs.txt");
    std::fs::read_to_string(path)
        .expect("deploy/image/cuda-libs.txt")
        .lines()
        .filter(|l| !l.trim_start().starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let pin = l.split_whitespace().next().expect("a pin");
            let (name, version) = pin.split_once("==").expect("NAME==VERSION");
            (name.to_string(), version.to_string())
        })
        .collect()
}

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn the_image_runs_the_check_as_its_own_user_on_a_read_only_root() {
    let Some(image) = image_or_skip() else { return };
    let _g = svc::common::serial();
    let inspect = podman_output(&["image", "inspect", "--format", "{{.Config.User}} {{.Config.Entrypoint}}", &image]);
    assert_eq!(stdout(&inspect).trim(), format!("{USER}:{USER} [gpusanity]"), "{inspect:?}");

    // The version names the commit and every bundled library at its pinned version.
    let mut args = run_args(&image, &svc::kube::unique("img-version"), &[], &[]);
    args.push("--version".into());
    let out = svc::common::run_with_timeout(podman_with(&args), Duration::from_secs(60));
    let version = stdout(&out);
    assert!(out.status.success(), "{out:?}");
    assert!(version.starts_with(&format!("gpusanity {} (commit ", env!("CARGO_PKG_VERSION"))), "{version}");
    assert!(version.contains("/usr/local/lib/gpusanity"), "{version}");
    for (package, v) in pinned_libraries() {
        assert!(version.contains(&format!("{package} {v}")), "{package} {v} missing from:\n{version}");
    }

    // Nothing can be written outside the volumes, and the user is not root.
    let out = svc::common::run_with_timeout(
        podman_with(&[
            "run",
            "--rm",
            "--read-only",
            "--entrypoint",
            "sh",
            &image,
            "-c",
            "id -u; touch /usr/x 2>&1 || true",
        ]),
        Duration::from_secs(60),
    );
    let text = stdout(&out);
    assert!(text.starts_with(&format!("{USER}\n")), "{text}");
    assert!(text.contains("Read-only file system"), "{text}");

    // The default check on CPU workers passes, its report in a bound folder.
    let dir = tempfile::tempdir().expect("tempdir");
    give_to_image_user(dir.path());
    let report = dir.path().join("report");
    let mut args = run_args(&image, &svc::kube::unique("img-check"), &[dir.path()], &[]);
    args.extend(["check", "--device", "cpu", "--report-dir"].map(String::from));
    args.push(report.display().to_string());
    let out = svc::common::run_with_timeout(podman_with(&args), Duration::from_secs(180));
    assert!(out.status.success(), "check in the image: {}\n{}", stdout(&out), svc::common::stderr(&out));
    let report = svc::common::read_json(&report.join("report.json"));
    assert_eq!(report["status"], "passed", "{:#}", report["findings"]);
    assert_eq!(report["backend"], "cpu");
    assert_eq!(report["ranks"].as_array().map(Vec::len), Some(2));
}

#[test]
fn the_service_quick_start_runs_in_containers_and_isolates_a_faulty_node() {
    let Some(image) = image_or_skip() else { return };
    let _g = svc::common::serial();
    let coordinator = "agent_timeout_s = 2.0\nagent_wait_s = 30.0\ndeadline_grace_s = 10.0";
    let mut w = World::new(Some(postgres_database("gpusanity_image")), coordinator);
    w.in_image(&image);
    let mut out = w.start(&["img-a", "img-b"]);

    w.allocate("img-1", "job-img-pass", "--sanity-check-max-time=3 --sanity-check-timeout-per-test=2");
    let end = out.wait_for(Duration::from_secs(120), "the first verdict", |v| {
        v["job_id"] == "job-img-pass" && (v["type"] == "CheckPassed" || v["type"] == "CheckFailed")
    });
    assert_eq!(end["type"], "CheckPassed", "{end:#}\nserve log:\n{}", w.log("serve"));

    // Test faults are the operator's switch: the world's service allows them and its agents run
    // with --test-faults. Node img-b's worker exits: a crash, isolated at once.
    let args = "--sanity-check-max-time=3 --sanity-check-timeout-per-test=2 --sanity-check-envs=GPUSANITY_FAULT=exit@1";
    w.allocate("img-2", "job-img-fail", args);
    let end = out.wait_for(Duration::from_secs(120), "the second verdict", |v| {
        v["job_id"] == "job-img-fail" && (v["type"] == "CheckPassed" || v["type"] == "CheckFailed")
    });
    assert_eq!(end["type"], "CheckFailed", "{end:#}");
    assert_eq!(end["faulty_nodes"], serde_json::json!(["img-b"]), "{end:#}");
    let isolated = out.wait_for(Duration::from_secs(30), "NodeIsolated", |v| v["type"] == "NodeIsolated");
    assert_eq!(isolated["node"], "img-b", "{isolated:#}");

    // Each of the three ran from the image as user 65532 on a read-only root file system.
    for name in ["serve", "img-a", "img-b"] {
        let container = format!("{}-{name}", w.tag);
        let format = "{{.Config.User}} {{.HostConfig.ReadonlyRootfs}} {{.ImageName}}";
        let info = podman_output(&["container", "inspect", "--format", format, &container]);
        assert_eq!(stdout(&info).trim(), format!("{USER}:{USER} true {image}"), "{name}: {info:?}");
    }
    w.shutdown();
}

#[test]
fn the_portable_binary_checks_on_glibc_2_31_with_openssl_1_1() {
    let Some(old) = built_or_skip("GPUSANITY_TEST_OLD_BASE", "Debian 11 image (scripts/image.sh old)") else { return };
    let _g = svc::common::serial();
    // The binary these tests ran, in Debian 11: glibc 2.31 and OpenSSL 1.1, as Ubuntu 20.04.
    let bin = svc::common::bin();
    let mount = format!("{bin}:/opt/gpusanity/bin/gpusanity:ro");
    let script = "ldd --version | head -n 1; ls /usr/lib/x86_64-linux-gnu | grep -c '^libssl.so.3' || true; \
                  /opt/gpusanity/bin/gpusanity check --device cpu --report-dir /tmp/report";
    let args = [
        "run",
        "--rm",
        "--read-only",
        "--network",
        "host",
        "--shm-size",
        "512m",
        "--tmpfs",
        "/tmp:rw,size=512m,mode=1777",
        "--volume",
        mount.as_str(),
        "--entrypoint",
        "sh",
        old.as_str(),
        "-c",
        script,
    ];
    let out = svc::common::run_with_timeout(podman_with(&args), Duration::from_secs(180));
    let text = stdout(&out);
    assert!(out.status.success(), "{text}\n{}", svc::common::stderr(&out));
    let mut lines = text.lines();
    assert!(lines.next().is_some_and(|l| l.ends_with(" 2.31")), "not glibc 2.31:\n{text}");
    assert_eq!(lines.next(), Some("0"), "the old base has no OpenSSL 3:\n{text}");
    assert!(text.contains("verdict: CheckPassed"), "{text}");
}
