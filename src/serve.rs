//! `gpusanity serve`: its flags, laid over the configuration file; the service itself is
//! `gpusanity_service::serve`.

use std::path::PathBuf;

use clap::Args;
use gpusanity_common::ExitCode;
use gpusanity_service::{ServiceConfig, UsageError};

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// TOML configuration file (docs/service.md lists every key).
    #[arg(long, env = "GPUSANITY_CONFIG")]
    config: Option<PathBuf>,
    /// Kafka bootstrap servers (overrides kafka.bootstrap).
    #[arg(long, env = "GPUSANITY_KAFKA_BOOTSTRAP")]
    kafka: Option<String>,
    /// sqlite://PATH or postgres://... (overrides database.url).
    #[arg(long, env = "GPUSANITY_DATABASE_URL")]
    database_url: Option<String>,
    /// HTTP listen address (overrides http.listen).
    #[arg(long, env = "GPUSANITY_HTTP_LISTEN")]
    listen: Option<String>,
    /// Bearer token of the HTTP API (overrides http.token).
    #[arg(long, env = "GPUSANITY_API_TOKEN", hide_env_values = true)]
    api_token: Option<String>,
    /// The agent key file (overrides agent_auth.keys_file; docs/security.md).
    #[arg(long, env = "GPUSANITY_AGENT_KEYS")]
    agent_keys: Option<PathBuf>,
}

impl ServeArgs {
    pub fn config_file(&self) -> Option<PathBuf> {
        self.config.clone()
    }

    fn config(&self) -> Result<ServiceConfig, UsageError> {
        let mut c = ServiceConfig::load(self.config.as_deref()).map_err(UsageError)?;
        if let Some(v) = &self.kafka {
            c.kafka.bootstrap = v.clone();
        }
        if let Some(v) = &self.database_url {
            c.database.url = v.clone();
        }
        if let Some(v) = &self.listen {
            c.http.listen = v.clone();
        }
        if let Some(v) = &self.api_token {
            c.http.token = Some(v.clone());
        }
        if let Some(v) = &self.agent_keys {
            c.agent_auth.keys_file = Some(v.clone());
        }
        c.validate().map_err(UsageError)?;
        Ok(c)
    }
}

pub fn serve(args: &ServeArgs) -> ExitCode {
    let result = args.config().map_err(anyhow::Error::from).and_then(|cfg| {
        let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
        rt.block_on(gpusanity_service::serve::run(cfg))
    });
    match result {
        Ok(()) => ExitCode::Passed,
        Err(e) => crate::report_error(&e),
    }
}
