//! Headless Chromium for the browser tests: a page's DOM after its scripts ran, or a screenshot
//! of it, each run in a fresh profile and its own process group, killed if it hangs.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gpusanity_testkit::skip::{or_skip, Prereq};
use gpusanity_testkit::svc::World;

/// Debian's Chromium, or None (a counted skip, or a failure where GPUSANITY_REQUIRE lists
/// `chromium`) when it is not installed.
pub fn chromium() -> Option<PathBuf> {
    let p = PathBuf::from("/usr/bin/chromium");
    let found = p.exists().then_some(p).ok_or_else(|| {
        "/usr/bin/chromium is missing (apt-get install -y chromium); the pages are not rendered".to_string()
    });
    or_skip(Prereq::Chromium, found)
}

/// Headless Chromium on `url` with `args` (--dump-dom or --screenshot=...): its stdout, after
/// checking that its console (its log on stderr) names no Content-Security-Policy violation: a
/// policy that stops a page's styles is a defect. A fresh profile, no network beyond the page,
/// its process group killed after 60 s.
fn chromium_run(bin: &Path, args: &[String], url: &str) -> String {
    let profile = tempfile::tempdir().expect("tempdir");
    let out_path = profile.path().join("stdout");
    let out = std::fs::File::create(&out_path).expect("stdout file");
    let log_path = profile.path().join("stderr");
    let log = std::fs::File::create(&log_path).expect("stderr file");
    let mut child = Command::new(bin)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
        ])
        .args(["--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"])
        .args(["--enable-logging=stderr", "--v=0"])
        .arg(format!("--user-data-dir={}", profile.path().join("profile").display()))
        .args(args)
        .arg(url)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(log)
        // Its own process group, so that a hung browser goes with its helper processes.
        .process_group(0)
        .spawn()
        .expect("spawn chromium");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match child.try_wait().expect("wait for chromium") {
            Some(st) => {
                assert!(st.success(), "chromium on {url} exited with {st}");
                break;
            }
            None if Instant::now() > deadline => {
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(child.id() as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
                let _ = child.wait();
                panic!("chromium on {url} hung for 60 s (killed)");
            }
            None => std::thread::sleep(Duration::from_millis(50)),
        }
    }
    let console = std::fs::read_to_string(log_path).unwrap_or_default();
    let refused: Vec<&str> = console.lines().filter(|l| l.contains("Content Security Policy")).collect();
    assert!(refused.is_empty(), "{url}: the page's Content-Security-Policy stops part of it:\n{}", refused.join("\n"));
    std::fs::read_to_string(out_path).expect("chromium output")
}

pub fn dom(bin: &Path, w: &World, path: &str) -> String {
    chromium_run(bin, &["--dump-dom".to_string()], &format!("http://127.0.0.1:{}{path}", w.http))
}

pub fn screenshot(bin: &Path, w: &World, path: &str, name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-artifacts");
    std::fs::create_dir_all(&dir).expect("artifacts dir");
    let file = dir.join(name);
    let _ = std::fs::remove_file(&file);
    chromium_run(
        bin,
        &[format!("--screenshot={}", file.display()), "--window-size=1300,2400".to_string()],
        &format!("http://127.0.0.1:{}{path}", w.http),
    );
    assert!(std::fs::metadata(&file).map(|m| m.len() > 10_000).unwrap_or(false), "no screenshot at {}", file.display());
    file
}
