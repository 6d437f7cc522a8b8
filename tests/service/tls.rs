//! Transport security: the 2-node pass with every Kafka client of the service and the agents
//! over SASL_SSL (SCRAM-SHA-512, the broker's certificate checked against its CA) on a
//! PostgreSQL that takes TLS only (verify-full); a wrong SASL password ends `serve` and `agent`
//! at start-up with one error (exit 2); plaintext and an untrusted certificate are refused by
//! the database. Skipped (counted), saying why, where no secure broker or server can be had;
//! a failure where GPUSANITY_REQUIRE lists `tls` (`.ci/run` provides both and lists it).

use gpusanity_testkit::skip::{or_skip, Prereq};
use gpusanity_testkit::svc;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use svc::secure::{self, SecureKafka};
use svc::{World, TOKEN};

const FAST: &str = "agent_timeout_s = 2.0\nagent_wait_s = 20.0\ndeadline_grace_s = 10.0";

fn kafka_or_skip() -> Option<&'static SecureKafka> {
    or_skip(
        Prereq::Tls,
        secure::secure_kafka().map_err(|why| format!("no Kafka broker with a SASL_SSL listener: {why}")),
    )
}

fn database_or_skip(name: &str) -> Option<String> {
    or_skip(Prereq::Tls, secure::tls_postgres_database(name).map_err(|why| format!("no TLS-only PostgreSQL: {why}")))
}

/// `gpusanity ARGS --config CONFIG` with the test token and no inherited Kafka or database setting.
fn gpusanity(args: &[&str], config: Option<&Path>) -> Command {
    let mut c = Command::new(svc::common::bin());
    c.args(args);
    if let Some(cfg) = config {
        c.arg("--config").arg(cfg);
    }
    c.env("GPUSANITY_API_TOKEN", TOKEN)
        .env_remove("GPUSANITY_CONFIG")
        .env_remove("GPUSANITY_KAFKA_BOOTSTRAP")
        .env_remove("GPUSANITY_KAFKA_SASL_PASSWORD")
        .env_remove("GPUSANITY_DATABASE_URL")
        .env_remove("GPUSANITY_LOG")
        .stdin(Stdio::null());
    c
}

/// The `gpusanity: error:` lines of a run's stderr.
fn errors(out: &std::process::Output) -> Vec<String> {
    svc::common::stderr(out).lines().filter(|l| l.contains("error")).map(str::to_string).collect()
}

#[test]
fn two_node_pass_over_sasl_ssl_and_postgresql_verify_full() {
    let _g = svc::common::serial();
    let Some(kafka) = kafka_or_skip() else { return };
    let Some(url) = database_or_skip("gpusanity_tls_pass") else { return };
    assert!(url.contains("sslmode=verify-full") && url.contains("sslrootcert="), "{url}");
    let mut w = World::new(Some(url), FAST);
    w.use_secure_kafka(kafka, "SCRAM-SHA-512", &kafka.password_file);
    svc::two_node_pass(&mut w);
    assert!(w.log("serve").contains("SASL_SSL"), "{}", w.log("serve"));
    // Every connection to the run's database (the service's pool and this query) is TLS.
    let q = |cond: &str| {
        w.sql(&format!(
            "SELECT CAST(COUNT(*) AS TEXT) FROM pg_stat_ssl s JOIN pg_stat_activity a ON a.pid = s.pid \
             WHERE a.datname = 'gpusanity_tls_pass' AND {cond}"
        ))
    };
    assert_eq!(q("NOT s.ssl"), ["0"]);
    let tls: u32 = q("s.ssl")[0].parse().expect("a count");
    assert!(tls >= 2, "{tls} TLS connections: the service holds none");
    w.shutdown();
}

#[test]
fn a_wrong_sasl_password_ends_serve_and_agent_at_start_up_with_one_error() {
    let _g = svc::common::serial();
    let Some(kafka) = kafka_or_skip() else { return };
    let mut w = World::new(None, FAST);
    let wrong = w.dir.path().join("wrong-password");
    std::fs::write(&wrong, "not-the-password\n").unwrap();
    w.use_secure_kafka(kafka, "SCRAM-SHA-512", &wrong);
    let work = w.dir.path().join("agent-tls-a").to_string_lossy().into_owned();
    for args in [vec!["serve"], vec!["agent", "--node", "tls-a", "--device", "cpu", "--work-dir", &work]] {
        let args = &args[..];
        let start = Instant::now();
        let out = svc::common::run_with_timeout(gpusanity(args, Some(&w.config)), Duration::from_secs(40));
        let errs = errors(&out);
        assert_eq!(svc::common::code(&out), 2, "{args:?}: {}", svc::common::stderr(&out));
        assert_eq!(errs.len(), 1, "{args:?}: {}", svc::common::stderr(&out));
        assert!(errs[0].contains("refused the client") && errs[0].contains("uthentication"), "{args:?}: {}", errs[0]);
        // At once, not after the 20 s an unreachable broker is given.
        assert!(start.elapsed() < Duration::from_secs(15), "{args:?} took {:?}", start.elapsed());
    }

    // The environment's password wins over the file: the same configuration serves.
    let password = std::fs::read_to_string(&kafka.password_file).unwrap();
    let log = std::fs::File::create(w.dir.path().join("serve-env.log")).unwrap();
    let serve = gpusanity(&["serve"], Some(&w.config))
        .env("GPUSANITY_KAFKA_SASL_PASSWORD", password.trim_end())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    // Ready, not merely alive: /health answers while start-up still waits for the broker.
    w.wait_ready(200, Duration::from_secs(60));
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(serve.id() as i32), nix::sys::signal::Signal::SIGTERM).unwrap();
    let out = svc::common::wait_output(serve, Duration::from_secs(20));
    assert!(out.status.success(), "{}", std::fs::read_to_string(w.dir.path().join("serve-env.log")).unwrap());

    // Properties gpusanity owns are refused before anything connects.
    let text = std::fs::read_to_string(&w.config).unwrap();
    std::fs::write(&w.config, format!("{text}\"enable.auto.commit\" = \"false\"\n")).unwrap();
    let out = svc::common::run_with_timeout(gpusanity(&["serve"], Some(&w.config)), Duration::from_secs(20));
    assert_eq!(svc::common::code(&out), 2, "{}", svc::common::stderr(&out));
    assert!(
        svc::common::stderr(&out).contains("`enable.auto.commit` is set by gpusanity"),
        "{}",
        svc::common::stderr(&out)
    );
}

#[test]
fn the_tls_only_postgresql_refuses_plaintext_and_an_untrusted_certificate() {
    let _g = svc::common::serial();
    let Some(url) = database_or_skip("gpusanity_tls_refused") else { return };
    let serve = |db: &str| {
        let args = ["serve", "--database-url", db, "--kafka", "127.0.0.1:1", "--listen", "127.0.0.1:0"];
        svc::common::run_with_timeout(gpusanity(&args, None), Duration::from_secs(30))
    };
    let out = serve(&secure::with_sslmode(&url, "disable"));
    assert_eq!(svc::common::code(&out), 2, "{}", svc::common::stderr(&out));
    let errs = errors(&out);
    assert_eq!(errs.len(), 1, "{}", svc::common::stderr(&out));
    assert!(errs[0].contains("refused the connection") && errs[0].contains("no encryption"), "{}", errs[0]);

    // verify-full against another CA: the server's certificate is not trusted.
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("other");
    let made = Command::new("bash")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/tls-certs.sh"))
        .arg(&certs)
        .status()
        .expect("scripts/tls-certs.sh");
    assert!(made.success());
    let other = format!("{}&sslrootcert={}", secure::with_sslmode(&url, "verify-full"), certs.join("ca.pem").display());
    let out = serve(&other);
    assert_eq!(svc::common::code(&out), 2, "{}", svc::common::stderr(&out));
    let errs = errors(&out);
    assert_eq!(errs.len(), 1, "{}", svc::common::stderr(&out));
    assert!(errs[0].contains("database TLS"), "{}", errs[0]);
}
