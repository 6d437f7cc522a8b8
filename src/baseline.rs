//! `gpusanity baseline export`: the fleet baselines the service learned, as the file `gpusanity
//! check --baseline FILE` reads.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use gpusanity_common::fleet::Policy;
use gpusanity_common::ExitCode;

#[derive(Debug, Subcommand)]
pub enum BaselineCommand {
    /// Write the baseline file from the service's database.
    Export(ExportArgs),
}

#[derive(Debug, Args)]
pub struct ExportArgs {
    /// The service's database: sqlite://PATH or postgres://...
    #[arg(long, env = "GPUSANITY_DATABASE_URL")]
    database: String,
    /// Where to write the file [default: standard output].
    #[arg(long)]
    out: Option<PathBuf>,
    /// The newest samples per key the baseline is computed over.
    #[arg(long, default_value_t = Policy::default().window)]
    window: usize,
    /// No entry for a key with fewer samples in its window.
    #[arg(long, default_value_t = Policy::default().min_samples)]
    min_samples: usize,
    /// No entry for a key whose window has fewer distinct nodes.
    #[arg(long, default_value_t = Policy::default().min_nodes)]
    min_nodes: usize,
}

pub fn baseline(cmd: &BaselineCommand) -> ExitCode {
    let BaselineCommand::Export(args) = cmd;
    match export(args) {
        Ok(()) => ExitCode::Passed,
        Err(e) => crate::report_error(&e),
    }
}

fn export(args: &ExportArgs) -> Result<()> {
    if args.window == 0 || args.min_samples > args.window {
        anyhow::bail!(gpusanity_executor::launcher::UsageError(
            "--window must be above 0 and at least --min-samples".into()
        ));
    }
    let policy = Policy { window: args.window, min_samples: args.min_samples, min_nodes: args.min_nodes };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let file = rt.block_on(async {
        let db = gpusanity_db::Db::connect(&args.database).await?;
        gpusanity_service::fleet::export(&db, policy).await
    })?;
    let header = format!(
        "gpusanity fleet baselines: {} entries, window {}, at least {} samples of {} nodes (gpusanity baseline export)",
        file.entries.len(),
        policy.window,
        policy.min_samples,
        policy.min_nodes
    );
    let text = file.to_text(&header).context("baseline file as TOML")?;
    match &args.out {
        Some(path) => std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?,
        None => print!("{text}"),
    }
    Ok(())
}
