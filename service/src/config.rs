//! The service's configuration: a TOML file, then environment variables and flags on top
//! (flag > environment > file > default).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::coordinator::CoordinatorConfig;
use crate::http::browser::session::SessionConfig;
use crate::http::browser::BrowserConfig;
use crate::http::scope::{read_token_file, Tokens};
use gpusanity_bus::kafka::KafkaConn;
use gpusanity_common::wire::Topics;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct ServiceConfig {
    pub kafka: KafkaConfig,
    pub topics: Topics,
    pub database: DatabaseConfig,
    pub http: HttpConfig,
    pub coordinator: CoordinatorConfig,
    pub notifier: gpusanity_notifier::NotifierConfig,
    pub agent_auth: crate::auth::AgentAuthConfig,
    pub jobs: JobsConfig,
    pub log: crate::ops::LogConfig,
    pub replica: crate::replica::ReplicaConfig,
    /// `[isolation]`: act on NodeIsolated (drain the node through Slurm); off by default.
    pub isolation: crate::isolation::IsolationConfig,
    /// The watch while a job runs (docs/watch.md).
    pub watch: crate::watch::WatchConfig,
}

/// `[jobs]`: what a job's settings may ask of the check.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct JobsConfig {
    /// Patterns of the variables `--sanity-check-envs` may set (empty: the documented defaults,
    /// gpusanity_common::envs::DEFAULT_ALLOW); loader, file, path, plugin and gpusanity
    /// variables are refused whatever is listed.
    pub allowed_envs: Vec<String>,
    /// Test rigs only: let jobs inject faults (GPUSANITY_FAULT). The agents need --test-faults too.
    pub test_faults: bool,
}

impl JobsConfig {
    pub fn env_policy(&self) -> Result<gpusanity_common::envs::EnvPolicy, String> {
        gpusanity_common::envs::EnvPolicy::new(&self.allowed_envs, self.test_faults)
            .map_err(|e| format!("jobs.allowed_envs: {e}"))
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KafkaConfig {
    /// Bootstrap servers, `host:port[,host:port...]`.
    pub bootstrap: String,
    /// Consumer group of the job-events consumer (shared by the replicas); each replica's
    /// agent-reports consumer uses a group of its own, `GROUP-agents-REPLICA`.
    pub group: String,
    /// librdkafka properties set on every client of the service and the agents (TLS, SASL:
    /// `security.protocol`, `sasl.mechanism`, `sasl.username`, `ssl.ca.location`...); those
    /// gpusanity sets itself and inline secrets are refused.
    pub properties: BTreeMap<String, String>,
    /// A file holding the SASL password (its first line); GPUSANITY_KAFKA_SASL_PASSWORD wins.
    pub sasl_password_file: Option<PathBuf>,
    /// Partitions of the topics the service creates (existing topics are left as they are).
    pub partitions: i32,
    /// Replication factor of the topics the service creates.
    pub replication_factor: i32,
    /// How long start-up waits for the broker (0: for ever).
    pub startup_wait_s: f64,
}

impl Default for KafkaConfig {
    fn default() -> Self {
        KafkaConfig {
            bootstrap: "127.0.0.1:9092".into(),
            group: "gpusanity-service".into(),
            properties: BTreeMap::new(),
            sasl_password_file: None,
            partitions: 1,
            replication_factor: 1,
            startup_wait_s: 300.0,
        }
    }
}

/// The environment variable of the SASL password.
pub const SASL_PASSWORD_ENV: &str = "GPUSANITY_KAFKA_SASL_PASSWORD";

impl KafkaConfig {
    /// The connection every Kafka client uses: the properties checked, the SASL password from
    /// GPUSANITY_KAFKA_SASL_PASSWORD or else `sasl_password_file`.
    pub fn connection(&self) -> Result<KafkaConn, String> {
        let password = match std::env::var(SASL_PASSWORD_ENV) {
            Ok(p) if !p.is_empty() => Some(p),
            _ => match &self.sasl_password_file {
                Some(f) => Some(read_secret(f)?),
                None => None,
            },
        };
        KafkaConn::new(&self.bootstrap, self.properties.clone(), password).map_err(|e| e.to_string())
    }

    /// How missing topics are created and how long start-up waits for the broker.
    pub fn topic_spec(&self) -> Result<gpusanity_bus::kafka::TopicSpec, String> {
        if self.partitions < 1 || self.replication_factor < 1 {
            return Err("kafka.partitions and kafka.replication_factor must be at least 1".into());
        }
        if !self.startup_wait_s.is_finite() || self.startup_wait_s < 0.0 || self.startup_wait_s > 1e9 {
            return Err("kafka.startup_wait_s must be a number of seconds, 0 or more".into());
        }
        Ok(gpusanity_bus::kafka::TopicSpec {
            partitions: self.partitions,
            replication_factor: self.replication_factor,
            startup_wait: (self.startup_wait_s > 0.0).then(|| Duration::from_secs_f64(self.startup_wait_s)),
        })
    }
}

/// The first line of a secret file (without its line ending); an empty one is an error.
fn read_secret(path: &Path) -> Result<String, String> {
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("kafka.sasl_password_file {}: {e}", path.display()))?;
    let line = text.lines().next().unwrap_or_default().to_string();
    if line.is_empty() {
        return Err(format!("kafka.sasl_password_file {}: empty", path.display()));
    }
    Ok(line)
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DatabaseConfig {
    /// `sqlite://PATH` (created when missing) or `postgres://USER@HOST:PORT/DB`.
    pub url: String,
}

impl Default for DatabaseConfig {
    fn default() -> Self {
        DatabaseConfig { url: "sqlite://gpusanity.db".into() }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpConfig {
    pub listen: String,
    /// The admin token: sees every workspace (better from GPUSANITY_API_TOKEN than from the file).
    pub token: Option<String>,
    /// Tokens limited to one workspace each.
    pub workspace_tokens: Vec<WorkspaceToken>,
    /// Open the report browser's read-only pages (`/ui`) without a login; `/v1` keeps its token.
    pub browser_public: bool,
    /// Cookies always get `Secure` (set it when the service is reached over HTTPS).
    pub secure_cookies: bool,
    /// A browser session ends this long after its login.
    pub session_ttl_s: u64,
    /// And this long after its last page (0: no idle expiry).
    pub session_idle_s: u64,
    /// At most this many browser sessions at once (a login beyond it ends the least recently used).
    pub max_sessions: usize,
    /// Failed logins per client address per minute, then 429 until the minute is over.
    pub login_failures_per_client: u32,
    /// Failed logins per minute from all clients together.
    pub login_failures_global: u32,
    /// A token that may read `/metrics` (besides the admin token); better GPUSANITY_METRICS_TOKEN.
    pub metrics_token: Option<String>,
}

/// `[[http.workspace_tokens]]`: a token for one workspace, inline or (better) in a file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkspaceToken {
    pub workspace: String,
    pub token: Option<String>,
    /// A file whose first line is the token.
    pub token_file: Option<PathBuf>,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            listen: "127.0.0.1:8088".into(),
            token: None,
            workspace_tokens: Vec::new(),
            browser_public: false,
            secure_cookies: false,
            session_ttl_s: 12 * 3600,
            session_idle_s: 3600,
            max_sessions: 10_000,
            login_failures_per_client: 5,
            login_failures_global: 100,
            metrics_token: None,
        }
    }
}

impl HttpConfig {
    /// The tokens with their scopes: files read, lengths and repeats checked.
    pub fn tokens(&self) -> Result<Tokens, String> {
        let Some(admin) = &self.token else {
            return Err("no API token: set GPUSANITY_API_TOKEN (or http.token in the config file)".into());
        };
        let mut ws = Vec::with_capacity(self.workspace_tokens.len());
        for t in &self.workspace_tokens {
            let token = match (&t.token, &t.token_file) {
                (Some(v), None) => v.clone(),
                (None, Some(f)) => read_token_file(f)?,
                _ => {
                    return Err(format!(
                        "http.workspace_tokens: workspace `{}` needs exactly one of token and token_file",
                        t.workspace
                    ))
                }
            };
            ws.push((t.workspace.clone(), token));
        }
        Tokens::new(admin, &ws)
    }

    /// The browser's settings.
    pub fn browser(&self) -> BrowserConfig {
        BrowserConfig {
            public: self.browser_public,
            secure_cookies: self.secure_cookies,
            sessions: SessionConfig {
                ttl: Duration::from_secs(self.session_ttl_s),
                idle: (self.session_idle_s > 0).then(|| Duration::from_secs(self.session_idle_s)),
                max: self.max_sessions,
            },
            login_failures_per_client: self.login_failures_per_client,
            login_failures_global: self.login_failures_global,
        }
    }
}

impl ServiceConfig {
    /// Reads `path` when given (a missing or malformed file is an error), else the defaults.
    pub fn load(path: Option<&Path>) -> Result<ServiceConfig, String> {
        let Some(p) = path else { return Ok(ServiceConfig::default()) };
        let text = std::fs::read_to_string(p).map_err(|e| format!("reading config {}: {e}", p.display()))?;
        toml::from_str(&text).map_err(|e| format!("config {}: {}", p.display(), e.to_string().replace('\n', " ")))
    }

    pub fn validate(&self) -> Result<(), String> {
        self.coordinator.validate()?;
        self.watch.validate()?;
        self.replica.validate()?;
        self.agent_auth.validate()?;
        self.jobs.env_policy()?;
        self.isolation.scontrol()?;
        self.notifier.validate()?;
        self.http.tokens()?;
        let h = &self.http;
        if h.session_ttl_s == 0
            || h.max_sessions == 0
            || h.login_failures_per_client == 0
            || h.login_failures_global == 0
        {
            return Err("http.session_ttl_s, max_sessions, login_failures_per_client and login_failures_global must be at least 1".into());
        }
        if self.kafka.bootstrap.trim().is_empty() {
            return Err("no Kafka bootstrap servers".into());
        }
        self.kafka.connection()?;
        self.kafka.topic_spec()?;
        if self.http.metrics_token.as_ref().is_some_and(|t| t.len() < 16) {
            return Err("http.metrics_token must be at least 16 characters".into());
        }
        self.isolation.check()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_file_and_rejects_unknown_keys() {
        let c: ServiceConfig = toml::from_str(
            "[kafka]\nbootstrap = \"k:1\"\n[topics]\noutput = \"out\"\n[coordinator]\nagent_timeout_s = 2.5\n[http]\ntoken = \"0123456789abcdef\"\n",
        )
        .unwrap();
        assert_eq!(c.kafka.bootstrap, "k:1");
        assert_eq!(c.topics.output, "out");
        assert_eq!(c.topics.job_events, Topics::default().job_events);
        assert_eq!(c.coordinator.agent_timeout_s, 2.5);
        assert!(c.validate().is_ok());
        assert!(toml::from_str::<ServiceConfig>("[kafka]\nbootstrapp = \"x\"\n").is_err());
        let mut bad = c.clone();
        bad.coordinator.agent_wait_s = -1.0;
        assert!(bad.validate().is_err());
        bad = c.clone();
        bad.http.token = None;
        assert!(bad.validate().is_err());
        let ws: ServiceConfig = toml::from_str(
            "[http]\ntoken = \"0123456789abcdef\"\nsession_ttl_s = 1\nsecure_cookies = true\n\
             [[http.workspace_tokens]]\nworkspace = \"ws-a\"\ntoken = \"ws-a-token-0123456789\"\n",
        )
        .unwrap();
        assert!(ws.validate().is_ok());
        assert_eq!(ws.http.browser().sessions.ttl, Duration::from_secs(1));
        let t = ws.http.tokens().unwrap();
        assert_eq!(t.scope("ws-a-token-0123456789"), Some(crate::http::scope::Scope::Workspace("ws-a".into())));
        let mut both = ws.clone();
        both.http.workspace_tokens[0].token_file = Some("/nonexistent".into());
        assert!(both.validate().is_err());
        let mut file = ws.clone();
        let dir = std::env::temp_dir().join(format!("gpusanity-token-{}", std::process::id()));
        std::fs::write(&dir, "from-a-file-0123456789\n").unwrap();
        file.http.workspace_tokens[0] =
            WorkspaceToken { workspace: "ws-b".into(), token: None, token_file: Some(dir.clone()) };
        assert!(file.http.tokens().unwrap().scope("from-a-file-0123456789").is_some());
        let _ = std::fs::remove_file(dir);
        let mut short = ws;
        short.http.workspace_tokens[0].token = Some("short".into());
        assert!(short.validate().is_err());
    }

    #[test]
    fn kafka_properties_refuse_owned_keys_and_inline_secrets() {
        let base = "[http]\ntoken = \"0123456789abcdef\"\n[kafka]\nbootstrap = \"k:1\"\n";
        let parse = |extra: &str| toml::from_str::<ServiceConfig>(&format!("{base}{extra}")).unwrap();
        let c = parse("properties = { \"security.protocol\" = \"SSL\", \"ssl.ca.location\" = \"/ca.pem\" }\n");
        assert_eq!(c.kafka.properties["security.protocol"], "SSL");
        assert!(c.validate().is_ok());
        for owned in ["bootstrap.servers", "group.id", "enable.auto.commit", "enable.auto.offset.store", "acks"] {
            let e = parse(&format!("properties = {{ \"{owned}\" = \"x\" }}\n")).validate().unwrap_err();
            assert!(e.contains(owned) && e.contains("set by gpusanity"), "{e}");
        }
        let e = parse("properties = { \"sasl.password\" = \"x\" }\n").validate().unwrap_err();
        assert!(e.contains("GPUSANITY_KAFKA_SASL_PASSWORD"), "{e}");
        let file = std::env::temp_dir().join(format!("gpusanity-config-test-{}.pw", std::process::id()));
        std::fs::write(&file, "s3cret\n").unwrap();
        let sasl = format!(
            "sasl_password_file = \"{}\"\nproperties = {{ \"security.protocol\" = \"SASL_SSL\", \
             \"sasl.mechanism\" = \"SCRAM-SHA-512\", \"sasl.username\" = \"u\" }}\n",
            file.display()
        );
        let conn = parse(&sasl).kafka.connection().unwrap();
        assert_eq!(conn.client_config().get("sasl.password"), Some("s3cret"));
        std::fs::write(&file, "").unwrap();
        assert!(parse(&sasl).kafka.connection().unwrap_err().contains("empty"));
        let _ = std::fs::remove_file(&file);
    }
}
