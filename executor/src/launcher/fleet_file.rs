//! Rank 0's share of the run's fleet baseline (`check --baseline FILE`): the entries of the
//! run's checks, written to a private file that only rank 0's spec names. The spec itself
//! travels in one environment variable, which Linux caps at 128 KiB, and a baseline file may
//! hold 16 MiB; the file lives in a directory of its own (mode 0700, the file 0600) that the
//! launcher removes when its workers are done. Anything that goes wrong here is a warning: the
//! re-measure then judges without the fleet, and node 0's diagnosis judges with it as before.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use gpusanity_common::fleet::file::{BaselineFile, MAX_FILE_BYTES};
use gpusanity_common::registry::CheckId;

/// The file, removed with its directory when dropped.
#[derive(Debug)]
pub(crate) struct FleetFile {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

impl FleetFile {
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

/// Writes the entries of `baseline` for `checks` to a private file; None when it holds none
/// of them, or (with a warning) when the file cannot be written.
pub(crate) fn write(baseline: &BaselineFile, checks: &[CheckId]) -> Option<FleetFile> {
    write_in(&std::env::temp_dir(), baseline, checks).unwrap_or_else(|e| {
        tracing::warn!("the re-measure judges without the fleet: {e:#}");
        None
    })
}

fn write_in(parent: &Path, baseline: &BaselineFile, checks: &[CheckId]) -> Result<Option<FleetFile>> {
    let entries: Vec<_> = baseline.entries.iter().filter(|e| checks.contains(&e.check)).cloned().collect();
    if entries.is_empty() {
        return Ok(None);
    }
    let subset = BaselineFile { judging: baseline.judging, entries };
    let text = subset.to_text("the fleet baseline's entries of this run's checks, for its rank 0")?;
    if text.len() as u64 > MAX_FILE_BYTES {
        anyhow::bail!(
            "the baseline's entries of this run's checks take {} bytes, more than {MAX_FILE_BYTES}",
            text.len()
        );
    }
    let dir = tempfile::Builder::new()
        .prefix("gpusanity-fleet-")
        .permissions(std::fs::Permissions::from_mode(0o700))
        .tempdir_in(parent)
        .with_context(|| format!("creating a directory in {}", parent.display()))?;
    let path = dir.path().join("baseline.toml");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .with_context(|| format!("creating {}", path.display()))?;
    file.write_all(text.as_bytes()).with_context(|| format!("writing {}", path.display()))?;
    Ok(Some(FleetFile { _dir: dir, path }))
}

#[cfg(test)]
mod tests {
    use gpusanity_common::fleet::file::BaselineEntry;
    use gpusanity_common::fleet::Judging;

    use super::*;

    fn entry(check: CheckId, metric: &str) -> BaselineEntry {
        crate::checks::remeasure::tests::entry("cpu", check, metric, 2, None)
    }

    #[test]
    fn rank_0_gets_the_entries_of_the_run_s_checks_in_a_private_file_removed_after_the_run() {
        let parent = tempfile::tempdir().unwrap();
        let baseline = BaselineFile {
            judging: Some(Judging { k: 3.0, min_gap: 0.05 }),
            entries: vec![entry(CheckId::Gemm, "tflops_cpu"), entry(CheckId::MemoryBandwidth, "gbps_cpu")],
        };
        let file = write_in(parent.path(), &baseline, &[CheckId::Gemm]).unwrap().expect("a file");
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(file.path()), 0o600);
        assert_eq!(mode(file.path().parent().unwrap()), 0o700);
        let read = BaselineFile::read(file.path()).expect("the worker reads it back");
        assert_eq!(read.judging, baseline.judging, "the file's judging travels with its entries");
        assert_eq!(read.entries, [baseline.entries[0].clone()], "only the run's checks");
        let dir = file.path().parent().unwrap().to_path_buf();
        drop(file);
        assert!(!dir.exists(), "removed with the run");
        // No entry of the run's checks: no file.
        assert!(write_in(parent.path(), &baseline, &[CheckId::AllReduce]).unwrap().is_none());
        // A directory that cannot be written: an error, which `write` turns into a warning.
        assert!(write_in(Path::new("/nonexistent/dir"), &baseline, &[CheckId::Gemm]).is_err());
    }
}
