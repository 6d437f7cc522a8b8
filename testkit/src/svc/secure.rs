//! Transport security for the service tests: a Kafka broker with a SASL_SSL listener (SCRAM
//! users, a throwaway CA) and a PostgreSQL server that takes TLS connections only, and a
//! [`World`] whose service, agents and test clients go through them.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};

pub use super::backends::with_database;
use super::backends::{broker, fresh_database, script_value, start_script_output, BROKER};
use super::World;

/// A broker's SASL_SSL listener and what a client needs to use it.
#[derive(Debug, Clone)]
pub struct SecureKafka {
    /// The SASL_SSL listener, `127.0.0.1:PORT`.
    pub bootstrap: String,
    /// The CA that signed the broker's certificate.
    pub ca: PathBuf,
    /// The SCRAM-SHA-512 and SCRAM-SHA-256 user.
    pub user: String,
    /// The user's password, on the file's first line.
    pub password_file: PathBuf,
}

impl SecureKafka {
    /// The client properties for SASL_SSL with `mechanism`, without the password.
    pub fn properties(&self, mechanism: &str) -> Vec<(String, String)> {
        [
            ("security.protocol", "SASL_SSL"),
            ("sasl.mechanism", mechanism),
            ("sasl.username", self.user.as_str()),
            ("ssl.ca.location", &self.ca.to_string_lossy()),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    }
}

/// A client configuration: `client` (with its bootstrap servers), or the plaintext test broker.
pub(super) fn client_config(client: &[(String, String)]) -> ClientConfig {
    let mut c = ClientConfig::new();
    if client.is_empty() {
        c.set("bootstrap.servers", broker());
    }
    for (k, v) in client {
        c.set(k, v);
    }
    c
}

/// Publishes raw bytes on `topic` through a client with `client`'s properties.
pub(super) fn publish_with(client: &[(String, String)], topic: &str, payload: &[u8]) {
    // Up to the broker's default limit (1 MiB), for the tests of large events.
    let p: ThreadedProducer<DefaultProducerContext> =
        client_config(client).set("message.max.bytes", "1048576").create().expect("producer");
    p.send(BaseRecord::<(), [u8]>::to(topic).payload(payload)).map_err(|(e, _)| e).expect("send");
    p.flush(Duration::from_secs(10)).expect("flush");
}

fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
}

fn answers(what: &str, addr: &str) {
    let a = addr.parse().unwrap_or_else(|_| panic!("{what}={addr}: expected host:port"));
    std::net::TcpStream::connect_timeout(&a, Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("{what}={addr} is set but does not answer: {e}"));
}

/// GPUSANITY_TEST_KAFKA_SASL_SSL with GPUSANITY_TEST_KAFKA_CA, GPUSANITY_TEST_KAFKA_SASL_USER and
/// GPUSANITY_TEST_KAFKA_SASL_PASSWORD_FILE (as `.ci/run` sets them; it must answer), else a
/// broker started by `KAFKA_SASL_SSL=1 scripts/kafka.sh start` for this test binary (its
/// PLAINTEXT listener becomes [`broker`] unless GPUSANITY_TEST_KAFKA names one). Err: why
/// neither could be had.
pub fn secure_kafka() -> Result<&'static SecureKafka, String> {
    static K: OnceLock<Result<SecureKafka, String>> = OnceLock::new();
    K.get_or_init(|| {
        if let Ok(b) = std::env::var("GPUSANITY_TEST_KAFKA_SASL_SSL") {
            let var = |n: &str| {
                std::env::var(n).unwrap_or_else(|_| panic!("GPUSANITY_TEST_KAFKA_SASL_SSL is set but {n} is not"))
            };
            answers("GPUSANITY_TEST_KAFKA_SASL_SSL", &b);
            return Ok(SecureKafka {
                bootstrap: b,
                ca: var("GPUSANITY_TEST_KAFKA_CA").into(),
                user: var("GPUSANITY_TEST_KAFKA_SASL_USER"),
                password_file: var("GPUSANITY_TEST_KAFKA_SASL_PASSWORD_FILE").into(),
            });
        }
        for tool in ["java", "openssl"] {
            if !on_path(tool) {
                return Err(format!("no `{tool}` to start a broker with a SASL_SSL listener (scripts/kafka.sh)"));
            }
        }
        let text = start_script_output("kafka.sh", "KAFKA_STATE", &[("KAFKA_SASL_SSL", "1")])?;
        let v = |k: &str| script_value(&text, k).ok_or_else(|| format!("no {k} line in: {text}"));
        if std::env::var_os("GPUSANITY_TEST_KAFKA").is_none() {
            // One broker for this binary: the same one answers the plaintext clients.
            let _ = BROKER.set((v("KAFKA_BOOTSTRAP=")?, None));
        }
        Ok(SecureKafka {
            bootstrap: v("KAFKA_SASL_SSL=")?,
            ca: v("KAFKA_CA=")?.into(),
            user: v("KAFKA_SASL_USER=")?,
            password_file: v("KAFKA_SASL_PASSWORD_FILE=")?.into(),
        })
    })
    .as_ref()
    .map_err(Clone::clone)
}

/// A TLS-only PostgreSQL server's admin URL (sslmode=verify-full, sslrootcert=its CA):
/// GPUSANITY_TEST_POSTGRES_TLS when set (it must answer), else a cluster started by
/// `PG_TLS=1 scripts/postgres.sh start` for this test binary. Err: why neither could be had.
pub fn tls_postgres_admin() -> Result<&'static str, String> {
    static PG: OnceLock<Result<String, String>> = OnceLock::new();
    PG.get_or_init(|| {
        if let Ok(u) = std::env::var("GPUSANITY_TEST_POSTGRES_TLS") {
            return Ok(u);
        }
        if !on_path("openssl") {
            return Err("no `openssl` to make the certificate of a TLS-only PostgreSQL (scripts/postgres.sh)".into());
        }
        let text = start_script_output("postgres.sh", "PG_STATE", &[("PG_TLS", "1")])?;
        script_value(&text, "DATABASE_URL=").ok_or_else(|| format!("no DATABASE_URL= line in: {text}"))
    })
    .as_ref()
    .map(String::as_str)
    .map_err(Clone::clone)
}

/// `url` with `sslmode=MODE` instead of its own (and no other TLS parameter).
pub fn with_sslmode(url: &str, mode: &str) -> String {
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let mut kept: Vec<&str> = query.split('&').filter(|p| !p.is_empty() && !p.starts_with("ssl")).collect();
    let m = format!("sslmode={mode}");
    kept.push(&m);
    format!("{base}?{}", kept.join("&"))
}

/// A fresh, empty database on the TLS-only server; its URL (verify-full).
pub fn tls_postgres_database(name: &str) -> Result<String, String> {
    Ok(fresh_database(tls_postgres_admin()?, name, "the TLS-only PostgreSQL"))
}

impl World {
    /// Points this world's service and agents at `kafka`'s SASL_SSL listener with `mechanism`,
    /// their SASL password from `password_file` (`kafka.sasl_password_file`), and the test's own
    /// clients (publish, read) at it with the right password.
    pub fn use_secure_kafka(&mut self, kafka: &SecureKafka, mechanism: &str, password_file: &Path) {
        let text = std::fs::read_to_string(&self.config).expect("config");
        let old = format!("bootstrap = \"{}\"\n", broker());
        assert!(text.contains(&old), "no `{}` in the config: {text}", old.trim());
        let new =
            format!("bootstrap = \"{}\"\nsasl_password_file = \"{}\"\n", kafka.bootstrap, password_file.display());
        let props = kafka.properties(mechanism);
        let table: String = props.iter().map(|(k, v)| format!("\"{k}\" = \"{v}\"\n")).collect();
        let text = format!("{}\n[kafka.properties]\n{table}", text.replacen(&old, &new, 1));
        std::fs::write(&self.config, text).expect("config");
        let password = std::fs::read_to_string(&kafka.password_file).expect("the broker's SASL password file");
        self.client = props;
        self.client.push(("bootstrap.servers".into(), kafka.bootstrap.clone()));
        self.client.push(("sasl.password".into(), password.lines().next().unwrap_or_default().to_string()));
    }
}
