//! The fleet's baselines in the service: a passed run's figures are learned when the run ends
//! (in the transaction that stores its results), and `gpusanity baseline export` writes the
//! baseline file from them (docs/fleet.md).

use gpusanity_common::fleet::file::{BaselineEntry, BaselineFile};
use gpusanity_common::fleet::samples::learnable;
use gpusanity_common::fleet::{learn as learn_baseline, Policy};
use gpusanity_common::report::Report;
use gpusanity_db::runs::RunRow;
use gpusanity_db::{fleet, Db, DbError, Tx};

/// Learns `report`'s figures for run `run`, which passed. The coordinator calls it only with
/// the report of node 0's agent, opened with an agent key that may speak for that node (an
/// unsigned or forged report never reaches a verdict); [`learnable`] leaves out fault-injected
/// runs and every rank or node a finding names.
pub async fn learn(tx: &mut Tx, run: &RunRow, report: &Report) -> Result<usize, DbError> {
    let names: Vec<String> = run.nodes.iter().map(|n| n.name.clone()).collect();
    let samples = learnable(report, &names);
    fleet::add_samples(tx, &run.run_id, &samples).await?;
    Ok(samples.len())
}

/// The baseline file of every key with enough samples under `policy`.
pub async fn export(db: &Db, policy: Policy) -> Result<BaselineFile, DbError> {
    let mut entries = Vec::new();
    for key in db.fleet_keys().await? {
        let window = db.fleet_window(&key, policy.window).await?;
        if let Some(learned) = learn_baseline(&window, policy) {
            let source = format!(
                "fleet: median and MAD x 1.4826 of the newest {} passed figures from {} nodes, exported {}",
                learned.samples,
                learned.nodes,
                chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ")
            );
            entries.push(BaselineEntry::new(&key, &learned, source));
        }
    }
    Ok(BaselineFile { judging: None, entries })
}
