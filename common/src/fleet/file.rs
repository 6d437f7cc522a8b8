//! The baseline file: `gpusanity baseline export` writes it from the service's samples,
//! `gpusanity check --baseline FILE` judges every rank with it. The format is that of
//! `common/data/expected.toml` (`[[entry]]` tables: device, check, metric, value and the
//! conditions) plus each baseline's `spread`, `samples`, `nodes` and `window`, the driver's
//! major version, and an optional `[judging]` table (k, min_gap).
//!
//! Unlike an expected figure, a baseline entry holds only for exactly the key it was learned
//! for ([`Key`]): the full device name, and every condition as the run had it (a field left
//! out means the run did not have it: no GEMM size for a collective, no link on CPU).
//!
//! The file comes from outside: it is bounded in size and entries, every number must be finite
//! and in range, and a malformed file is refused whole with one error naming the entry.

use std::collections::BTreeSet;
use std::io::Read;
use std::path::Path;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::{Judging, Key, Learned};
use crate::kinds::Link;
use crate::registry::CheckId;

/// The largest baseline file read (bytes): 200 bytes an entry, [`MAX_ENTRIES`] entries.
pub const MAX_FILE_BYTES: u64 = 16 << 20;
/// The most entries a file may hold.
pub const MAX_ENTRIES: usize = 50_000;
const MAX_NAME: usize = 256;
const MAX_SOURCE: usize = 2048;

#[derive(Debug, Error)]
pub enum BaselineError {
    #[error("baseline file {path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("baseline file is larger than {MAX_FILE_BYTES} bytes")]
    TooLarge,
    #[error("baseline file is not valid: {0}")]
    Syntax(String),
    #[error("baseline file has {0} entries, more than {MAX_ENTRIES}")]
    TooManyEntries(usize),
    #[error("baseline file's [judging]: {0}")]
    Judging(String),
    #[error("baseline file's entry {index} ({what}): {why}")]
    Entry { index: usize, what: String, why: String },
}

/// One learned baseline, as the file holds it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BaselineEntry {
    /// The device's full name as the worker reports it.
    pub device: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<u32>,
    pub check: CheckId,
    /// The figure judged: the check's headline metric (`tflops`, per wall-clock second), or on
    /// CPU workers its rate per CPU-second (`tflops_cpu`, [`crate::peers::cpu_key`]).
    pub metric: String,
    /// The centre: the median of the window.
    pub value: f64,
    /// MAD x 1.4826 over the window.
    pub spread: f64,
    pub samples: usize,
    pub nodes: usize,
    pub window: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<u64>,
    #[serde(default)]
    pub single_node: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ranks_per_node: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link: Option<Link>,
    #[serde(default)]
    pub source: String,
}

impl BaselineEntry {
    /// The entry of `key`'s baseline.
    pub fn new(key: &Key, learned: &Learned, source: String) -> BaselineEntry {
        BaselineEntry {
            device: key.device.clone(),
            driver: key.driver,
            check: key.check,
            metric: key.metric.clone(),
            value: learned.centre,
            spread: learned.spread,
            samples: learned.samples,
            nodes: learned.nodes,
            window: learned.window,
            size: key.size,
            max_bytes: key.max_bytes,
            single_node: key.single_node,
            ranks_per_node: key.ranks_per_node,
            link: key.link,
            source,
        }
    }

    pub fn key(&self) -> Key {
        Key {
            device: self.device.clone(),
            driver: self.driver,
            check: self.check,
            metric: self.metric.clone(),
            size: self.size,
            max_bytes: self.max_bytes,
            ranks_per_node: self.ranks_per_node,
            single_node: self.single_node,
            link: self.link,
        }
    }

    pub fn learned(&self) -> Learned {
        Learned {
            centre: self.value,
            spread: self.spread,
            samples: self.samples,
            nodes: self.nodes,
            window: self.window,
        }
    }

    fn validate(&self) -> Result<(), String> {
        if self.device.trim().is_empty() || self.device.len() > MAX_NAME {
            return Err(format!("device must be a name of 1 to {MAX_NAME} bytes"));
        }
        if self.metric.trim().is_empty() || self.metric.len() > MAX_NAME {
            return Err(format!("metric must be a name of 1 to {MAX_NAME} bytes"));
        }
        if self.source.len() > MAX_SOURCE {
            return Err(format!("source is longer than {MAX_SOURCE} bytes"));
        }
        match self.check.metric() {
            Some(m) if m.key == self.metric || crate::peers::cpu_key(m.key) == self.metric => {}
            Some(m) => {
                return Err(format!(
                    "check {} has headline metric {} (per CPU-second {}), not {}",
                    self.check,
                    m.key,
                    crate::peers::cpu_key(m.key),
                    self.metric
                ))
            }
            None => return Err(format!("check {} has no headline metric", self.check)),
        }
        if !(self.value.is_finite() && self.value > 0.0) {
            return Err(format!("value must be a finite number above 0, not {}", self.value));
        }
        if !(self.spread.is_finite() && self.spread >= 0.0 && self.spread <= self.value) {
            return Err(format!("spread must be a finite number from 0 to the value, not {}", self.spread));
        }
        if self.samples == 0 || self.window < self.samples {
            return Err(format!("samples must be at least 1 and at most window ({} > {})", self.samples, self.window));
        }
        if self.nodes == 0 || self.nodes > self.samples {
            return Err(format!("nodes must be from 1 to samples, not {}", self.nodes));
        }
        if self.ranks_per_node == Some(0) || self.size == Some(0) || self.max_bytes == Some(0) {
            return Err("size, max_bytes and ranks_per_node must be above 0 when given".into());
        }
        Ok(())
    }
}

/// A whole baseline file.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BaselineFile {
    /// How far below the centre a figure may fall; [`Judging::DEFAULT`] when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub judging: Option<Judging>,
    #[serde(rename = "entry", default)]
    pub entries: Vec<BaselineEntry>,
}

impl BaselineFile {
    /// Reads and validates the file at `path` (at most [`MAX_FILE_BYTES`]).
    pub fn read(path: &Path) -> Result<BaselineFile, BaselineError> {
        let io = |source| BaselineError::Io { path: path.display().to_string(), source };
        let file = std::fs::File::open(path).map_err(io)?;
        let mut bytes = Vec::new();
        file.take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes).map_err(io)?;
        if bytes.len() as u64 > MAX_FILE_BYTES {
            return Err(BaselineError::TooLarge);
        }
        let text = String::from_utf8(bytes).map_err(|_| BaselineError::Syntax("not UTF-8 text".into()))?;
        BaselineFile::parse(&text)
    }

    /// Parses and validates a file's text.
    pub fn parse(text: &str) -> Result<BaselineFile, BaselineError> {
        if text.len() as u64 > MAX_FILE_BYTES {
            return Err(BaselineError::TooLarge);
        }
        let file: BaselineFile =
            toml::from_str(text).map_err(|e| BaselineError::Syntax(e.message().trim().to_string()))?;
        file.validate()?;
        Ok(file)
    }

    /// Checks every entry (finite, positive figures; a bounded count), as [`BaselineFile::parse`] does.
    pub fn validate(&self) -> Result<(), BaselineError> {
        if self.entries.len() > MAX_ENTRIES {
            return Err(BaselineError::TooManyEntries(self.entries.len()));
        }
        if let Some(j) = &self.judging {
            j.validate().map_err(BaselineError::Judging)?;
        }
        let mut keys = BTreeSet::new();
        for (index, e) in self.entries.iter().enumerate() {
            let what = format!("{} {} of {}", e.check, e.metric, e.device.chars().take(64).collect::<String>());
            e.validate().map_err(|why| BaselineError::Entry { index, what: what.clone(), why })?;
            if !keys.insert(e.key()) {
                return Err(BaselineError::Entry { index, what, why: "a second entry for the same key".into() });
            }
        }
        Ok(())
    }

    /// The judging the file asks for, else the default.
    pub fn judging(&self) -> Judging {
        self.judging.unwrap_or_default()
    }

    /// The entry learned for exactly `key`.
    pub fn lookup(&self, key: &Key) -> Option<&BaselineEntry> {
        self.entries.iter().find(|e| e.key() == *key)
    }

    /// The file's text (TOML), with a header that says what it is.
    pub fn to_text(&self, header: &str) -> Result<String, toml::ser::Error> {
        let body = toml::to_string(self)?;
        let mut text: String = header.lines().map(|l| format!("# {l}\n")).collect();
        text.push('\n');
        text.push_str(&body);
        Ok(text)
    }
}
