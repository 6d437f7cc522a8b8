//! Domain types shared by every part of gpusanity: the seven check settings and their
//! `SanityCheckArgs` parser, the registry of check items, the versioned report schema, run
//! state events, exit codes and the collective bandwidth formulas.

pub mod bandwidth;
pub mod config;
pub mod config_micro;
pub mod config_models;
pub mod device;
pub mod events;
pub mod exit;
pub mod expected;
pub mod registry;
pub mod report;
pub mod secret;
pub mod settings;
pub mod stats;
pub mod timing;
pub mod wire;

pub use exit::ExitCode;
pub use registry::{CheckGroup, CheckInfo, CHECKS};
pub use settings::{Settings, SettingsError, TimeoutOps, Timing};
