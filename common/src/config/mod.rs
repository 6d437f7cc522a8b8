//! The configurations of the checks: the types that several checks share or that are large
//! enough for a file: [`sweep`] (the collective sweeps), [`micro`] (gemm and the other
//! micro-benchmarks), [`models`] (the model checks), [`bandwidth`], [`health`]; what their
//! buffers take ([`buffers`], [`memory`]); the `--check-param` values they parse ([`param`]) and
//! the diagnosis's own settings ([`diagnosis`]). Each type parses its own `--check-param`
//! fields.
//!
//! The configuration of a run, [`CheckConfigs`] (one field per check, of the type its
//! descriptor module names), is gathered with the descriptors in [`crate::checks`], which
//! stand above this module; it is named here too, where its users have long found it.

pub mod bandwidth;
pub mod buffers;
pub mod diagnosis;
pub mod health;
pub mod memory;
pub mod micro;
pub mod models;
pub mod param;
pub mod sweep;

pub use crate::checks::CheckConfigs;
pub use diagnosis::{DEFAULT_STALL_S, DIAGNOSIS_PARAM_KEYS};
pub use param::{Param, ParamError, MAX_COUNT, MAX_DIM, MAX_INT};
