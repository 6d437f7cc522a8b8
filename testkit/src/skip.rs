//! Tests that need what a machine may lack (root and the test bed's tools, Slurm, a secure
//! broker, Chromium, ...). A missing prerequisite is a counted skip on a developer's machine,
//! and a failure where `GPUSANITY_REQUIRE` lists it: `.ci/run` lists every prerequisite it
//! provides, so a CI machine that lost one goes red instead of green.
//!
//! A skip is written past the test harness's capture (`SKIPPED [prereq] test: why` on stderr)
//! and, when `GPUSANITY_SKIP_LOG` names a file, appended to it as one line, which `.ci/run`
//! counts in its summary. The test then returns: libtest has no runtime skip of its own.

use std::fmt;
use std::io::Write;

/// The variable listing the prerequisites whose absence fails a test (comma-separated names).
pub const REQUIRE_ENV: &str = "GPUSANITY_REQUIRE";
/// The file each skip is appended to, one line per skipped test.
pub const SKIP_LOG_ENV: &str = "GPUSANITY_SKIP_LOG";

/// What a test may need that a machine may lack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prereq {
    /// Root, iproute2, tc and cgroup v1 cpu: the network-namespace test bed.
    Root,
    /// Debian's Slurm and munge daemons and clients.
    Slurm,
    /// A Kafka broker (started by the tests themselves when GPUSANITY_TEST_KAFKA is unset).
    Kafka,
    /// A PostgreSQL server (likewise GPUSANITY_TEST_POSTGRES).
    Postgres,
    /// A broker with a SASL_SSL listener and a PostgreSQL server that takes TLS only.
    Tls,
    /// Headless Chromium (/usr/bin/chromium) for the browser tests.
    Chromium,
    /// A non-loopback IPv4 address on this host.
    Network,
    /// No GPU on this host (the tests of the CPU fallback and of a missing GPU).
    NoGpu,
    /// A Kubernetes API server (scripts/kube-apiserver.sh, built with Go, or
    /// GPUSANITY_TEST_KUBECONFIG).
    Kubernetes,
    /// A CPU quiet enough that its figures' spread shows a 10% slower node.
    QuietCpu,
    /// The gpusanity image built by scripts/image.sh (GPUSANITY_TEST_IMAGE) and podman to run it.
    Image,
}

impl Prereq {
    pub const ALL: [Prereq; 11] = [
        Prereq::Root,
        Prereq::Slurm,
        Prereq::Kafka,
        Prereq::Postgres,
        Prereq::Tls,
        Prereq::Chromium,
        Prereq::Network,
        Prereq::NoGpu,
        Prereq::Kubernetes,
        Prereq::QuietCpu,
        Prereq::Image,
    ];

    /// The name `GPUSANITY_REQUIRE` lists it by.
    pub fn name(self) -> &'static str {
        match self {
            Prereq::Root => "root",
            Prereq::Slurm => "slurm",
            Prereq::Kafka => "kafka",
            Prereq::Postgres => "postgres",
            Prereq::Tls => "tls",
            Prereq::Chromium => "chromium",
            Prereq::Network => "network",
            Prereq::NoGpu => "no-gpu",
            Prereq::Kubernetes => "kubernetes",
            Prereq::QuietCpu => "quiet-cpu",
            Prereq::Image => "image",
        }
    }

    fn parse(name: &str) -> Option<Prereq> {
        Prereq::ALL.into_iter().find(|p| p.name() == name)
    }
}

impl fmt::Display for Prereq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The prerequisites a `GPUSANITY_REQUIRE` value lists; an unknown name is an error (a typo
/// must not turn a required scenario back into a skip).
pub fn parse_required(list: &str) -> Result<Vec<Prereq>, String> {
    list.split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(|n| {
            Prereq::parse(n).ok_or_else(|| {
                let known: Vec<&str> = Prereq::ALL.iter().map(|p| p.name()).collect();
                format!("{REQUIRE_ENV}: unknown prerequisite `{n}` (known: {})", known.join(", "))
            })
        })
        .collect()
}

/// The prerequisites this run requires (none when `GPUSANITY_REQUIRE` is unset).
fn required() -> Vec<Prereq> {
    match std::env::var(REQUIRE_ENV) {
        Ok(list) => parse_required(&list).unwrap_or_else(|e| panic!("{e}")),
        Err(_) => Vec::new(),
    }
}

/// This test lacks `p` (because of `why`): it fails when `GPUSANITY_REQUIRE` lists `p`, else
/// the skip is recorded and the caller returns. The test's name is its thread's (libtest names
/// each test's thread after it).
pub fn missing(p: Prereq, why: &str) {
    let name = std::thread::current().name().unwrap_or("?").to_string();
    missing_in(&name, p, why);
}

/// [`missing`] for the test `test`.
pub fn missing_in(test: &str, p: Prereq, why: &str) {
    if required().contains(&p) {
        panic!("{test} needs {p}, which {REQUIRE_ENV} requires, but: {why}");
    }
    let line = format!("SKIPPED [{p}] {test}: {why}\n");
    // Past the harness's capture of print!/eprint!, so that `cargo test` shows it.
    let _ = std::io::stderr().write_all(line.as_bytes());
    if let Some(path) = std::env::var_os(SKIP_LOG_ENV) {
        // One write in append mode: lines of tests running in parallel do not interleave.
        let file = std::fs::OpenOptions::new().create(true).append(true).open(&path);
        if let Err(e) = file.and_then(|mut f| f.write_all(line.as_bytes())) {
            panic!("{SKIP_LOG_ENV}={}: cannot record the skip: {e}", path.to_string_lossy());
        }
    }
}

/// `Some(value)`, or the skip (or failure) of [`missing`] and `None`.
pub fn or_skip<T>(p: Prereq, r: Result<T, String>) -> Option<T> {
    r.map_err(|why| missing(p, &why)).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_list_is_parsed_and_a_typo_is_refused() {
        assert_eq!(parse_required(" root, tls ,,").unwrap(), [Prereq::Root, Prereq::Tls]);
        assert_eq!(parse_required("").unwrap(), []);
        let all: Vec<&str> = Prereq::ALL.iter().map(|p| p.name()).collect();
        assert_eq!(parse_required(&all.join(",")).unwrap(), Prereq::ALL);
        let e = parse_required("root,kafak").unwrap_err();
        assert!(e.contains("`kafak`") && e.contains("kafka"), "{e}");
    }
}
