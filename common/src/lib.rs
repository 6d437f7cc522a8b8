//! Domain types shared by every part of gpusanity: the seven check settings and their
//! `SanityCheckArgs` parser, the check items' names and descriptors, the versioned report schema, run
//! state events, exit codes and the collective bandwidth formulas.

pub mod bandwidth;
pub mod checks;
pub mod config;
pub mod detail;
pub mod device;
pub mod envs;
pub mod events;
pub mod exit;
pub mod expected;
pub mod findings;
pub mod fleet;
pub mod health;
pub mod host;
pub mod hostlist;
pub mod kinds;
pub mod peers;
pub mod rank_end;
pub mod registry;
pub mod report;
pub mod secret;
pub mod settings;
pub mod stats;
pub mod timing;
pub mod verdict;
pub mod wire;

pub use checks::Descriptor;
pub use exit::ExitCode;
pub use registry::{CheckGroup, CheckId};
pub use settings::{Settings, SettingsError, TimeoutOps, Timing};
