//! `gpusanity`: compute health check for distributed GPU training.

mod agent;
mod baseline;
mod cli;
mod device_arg;
mod k8s;
mod serve;
mod slurm;

use std::process::ExitCode as ProcessExit;

use clap::{CommandFactory, FromArgMatches};
use gpusanity_common::ExitCode;

fn main() -> ProcessExit {
    let mut command = cli::Cli::command();
    // The bundled libraries are read only when asked for.
    if std::env::args_os().any(|a| a == "--version") {
        command = command.long_version(cli::long_version());
    }
    let matches = command.get_matches();
    let cli = cli::Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    init_logging(&cli);
    let code = cli::run(cli);
    ProcessExit::from(code.code() as u8)
}

/// The log on stderr: text (ANSI colours only when stderr is a terminal) or JSON lines.
fn init_logging(cli: &cli::Cli) {
    use std::io::IsTerminal;
    let format = cli.log_format.or_else(|| cli.config_file().and_then(|p| gpusanity_service::ops::log_format_of(&p)));
    let filter = tracing_subscriber::EnvFilter::try_from_env("GPUSANITY_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(if cli.verbose { "info" } else { "warn" }));
    let base = tracing_subscriber::fmt().with_writer(std::io::stderr).with_env_filter(filter);
    match format.unwrap_or_default() {
        gpusanity_service::ops::LogFormat::Json => base.json().with_current_span(false).init(),
        gpusanity_service::ops::LogFormat::Text => base.with_ansi(std::io::stderr().is_terminal()).init(),
    }
}

/// Prints the one-line error for `e` and picks its exit code.
pub fn report_error(e: &anyhow::Error) -> ExitCode {
    let usage = e.chain().any(|c| {
        c.is::<gpusanity_executor::launcher::UsageError>()
            || c.is::<gpusanity_service::UsageError>()
            || c.is::<gpusanity_common::SettingsError>()
            || c.is::<gpusanity_common::config::ParamError>()
    });
    eprintln!("gpusanity: error: {}", format!("{e:#}").replace('\n', " "));
    if usage {
        ExitCode::Usage
    } else {
        ExitCode::Internal
    }
}
