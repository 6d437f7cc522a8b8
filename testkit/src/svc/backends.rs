//! The backing services of the service tests: this test binary's Kafka broker and PostgreSQL
//! server (the ones GPUSANITY_TEST_KAFKA and GPUSANITY_TEST_POSTGRES name, or ones started by
//! scripts/kafka.sh and scripts/postgres.sh and stopped when the binary exits), and a fresh
//! database per test.

use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use super::common;

/// The broker's bootstrap address: GPUSANITY_TEST_KAFKA when set (it must answer), else a
/// broker started by scripts/kafka.sh for this test binary and stopped when it exits.
pub fn broker() -> &'static str {
    &BROKER
        .get_or_init(|| {
            if let Ok(b) = std::env::var("GPUSANITY_TEST_KAFKA") {
                let addr = b.split(',').next().unwrap_or_default().to_string();
                std::net::TcpStream::connect_timeout(
                    &addr.parse().expect("GPUSANITY_TEST_KAFKA: host:port"),
                    Duration::from_secs(5),
                )
                .unwrap_or_else(|e| panic!("GPUSANITY_TEST_KAFKA={b} is set but the broker does not answer: {e}"));
                return (b, None);
            }
            (start_script("kafka.sh", "KAFKA_STATE", "KAFKA_BOOTSTRAP="), None)
        })
        .0
}

/// This test binary's broker: (loopback bootstrap, the second listener's address if any).
pub(super) static BROKER: OnceLock<(String, Option<String>)> = OnceLock::new();

/// Starts this test binary's broker with a second listener on `addr` (KAFKA_LISTEN of
/// scripts/kafka.sh), an address of this host that network namespaces reach, and returns that
/// listener's ADDR:PORT; [`broker`] then returns its loopback listener. GPUSANITY_TEST_KAFKA is
/// not used: a broker started before `addr` existed cannot listen on it. Every call must name
/// the same `addr` (the listener stays bound to it when the address goes and comes back).
pub fn broker_listening_on(addr: &str) -> &'static str {
    let (_, external) = BROKER.get_or_init(|| {
        let external = format!("{addr}:{}", common::free_port());
        (
            start_script_env("kafka.sh", "KAFKA_STATE", "KAFKA_BOOTSTRAP=", &[("KAFKA_LISTEN", &external)]),
            Some(external),
        )
    });
    match external {
        Some(e) if e.rsplit_once(':').map(|(a, _)| a) == Some(addr) => e,
        other => panic!("this test binary's broker was started listening on {other:?}, not on {addr}"),
    }
}

/// Runs `scripts/SCRIPT start` with its state file in a temp dir and returns the value of its
/// `KEY...` line; a watchdog runs `SCRIPT stop` once this test binary has exited.
fn start_script(script: &str, state_var: &str, key: &str) -> String {
    start_script_env(script, state_var, key, &[])
}

/// [`start_script`] with `env` set for the script.
fn start_script_env(script: &str, state_var: &str, key: &str, env: &[(&str, &str)]) -> String {
    let text = start_script_output(script, state_var, env).unwrap_or_else(|e| panic!("{e}"));
    script_value(&text, key).unwrap_or_else(|| panic!("no {key} line in: {text}"))
}

/// The value of the `KEY...` line of a script's output.
pub(super) fn script_value(text: &str, key: &str) -> Option<String> {
    text.lines().find_map(|l| l.strip_prefix(key)).map(str::to_string)
}

/// Runs `scripts/SCRIPT start` as [`start_script`] does; its whole stdout, or why it failed.
pub(super) fn start_script_output(script: &str, state_var: &str, env: &[(&str, &str)]) -> Result<String, String> {
    start_script_state(script, state_var, env).map(|(text, _)| text)
}

/// [`start_script_output`], with the script's state file (for its other subcommands).
pub(super) fn start_script_state(
    script: &str,
    state_var: &str,
    env: &[(&str, &str)],
) -> Result<(String, std::path::PathBuf), String> {
    let dir = tempfile::tempdir().expect("tempdir").keep();
    // Readable by the `postgres` user the database server runs as under root.
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
    let state = dir.join("state");
    let script = crate::repo().join("scripts").join(script);
    let out = Command::new("bash")
        .arg(&script)
        .arg("start")
        .env(state_var, &state)
        .env("TMPDIR", &dir)
        .envs(env.iter().copied())
        .output()
        .expect("running a script");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        let _ = std::fs::remove_dir_all(&dir);
        return Err(format!("{} start failed: {text}{}", script.display(), String::from_utf8_lossy(&out.stderr)));
    }
    let watch = format!(
        "while kill -0 {} 2>/dev/null; do sleep 0.5; done; {state_var}='{}' TMPDIR='{}' bash '{}' stop; rm -rf '{}'",
        std::process::id(),
        state.display(),
        dir.display(),
        script.display(),
        dir.display()
    );
    // Started in the background of a shell that exits at once, so it is nobody's zombie.
    let status =
        Command::new("sh").arg("-c").arg(format!("({watch}) >/dev/null 2>&1 </dev/null &")).status().expect("watchdog");
    assert!(status.success(), "starting the watchdog failed");
    Ok((text, state))
}

/// A PostgreSQL server's admin URL: GPUSANITY_TEST_POSTGRES when set (it must answer), else a
/// throwaway cluster started by scripts/postgres.sh for this test binary and stopped when it exits.
fn postgres_admin() -> &'static str {
    static PG: OnceLock<String> = OnceLock::new();
    PG.get_or_init(|| {
        if let Ok(u) = std::env::var("GPUSANITY_TEST_POSTGRES") {
            return u;
        }
        start_script("postgres.sh", "PG_STATE", "DATABASE_URL=")
    })
}

/// A fresh, empty PostgreSQL database for one test; its URL.
pub fn postgres_database(name: &str) -> String {
    fresh_database(postgres_admin(), name, "PostgreSQL")
}

/// Drops and creates database `name` on the server of admin URL `admin` (`server` names it in
/// a panic when it does not answer); the database's URL.
pub(super) fn fresh_database(admin: &str, name: &str, server: &str) -> String {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        sqlx::any::install_default_drivers();
        let pool =
            sqlx::AnyPool::connect(admin).await.unwrap_or_else(|e| panic!("{server} at {admin} does not answer: {e}"));
        sqlx::query(&format!("DROP DATABASE IF EXISTS {name}")).execute(&pool).await.expect("drop database");
        sqlx::query(&format!("CREATE DATABASE {name}")).execute(&pool).await.expect("create database");
    });
    with_database(admin, name)
}

/// `url` (a server's URL) naming database `name` instead, its query kept.
pub fn with_database(url: &str, name: &str) -> String {
    let (base, query) = url.split_once('?').map_or((url, None), |(b, q)| (b, Some(q)));
    let base = base.rsplit_once('/').map_or(base, |(b, _)| b);
    match query {
        Some(q) => format!("{base}/{name}?{q}"),
        None => format!("{base}/{name}"),
    }
}
