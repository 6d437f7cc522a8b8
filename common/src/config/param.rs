//! One `--check-param CHECK.KEY=VALUE` as each configuration parses it ([`Param`]), its errors,
//! and the largest values it takes.

use thiserror::Error;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ParamError {
    #[error("bad --check-param `{0}`: expected CHECK.KEY=VALUE")]
    Syntax(String),
    #[error("unknown --check-param key `{0}` (known: {1})")]
    UnknownKey(String, String),
    #[error("bad value `{value}` for --check-param {key}: {why}")]
    BadValue { key: String, value: String, why: String },
}

/// The largest byte count or time a `--check-param` takes: 1 TiB.
pub const MAX_INT: u64 = 1 << 40;
/// The largest count of iterations, steps or streams.
pub const MAX_COUNT: u64 = 1 << 20;
/// The largest matrix side or model dimension.
pub const MAX_DIM: u64 = 1 << 16;

/// One `--check-param CHECK.KEY=VALUE`: the whole key, the field after the check's name, and
/// the value, with the parsers the configurations share.
#[derive(Debug, Clone, Copy)]
pub struct Param<'a> {
    /// `CHECK.KEY`, for error messages.
    pub key: &'a str,
    /// `KEY`.
    pub field: &'a str,
    pub value: &'a str,
}

impl Param<'_> {
    pub fn bad(&self, why: &str) -> ParamError {
        ParamError::BadValue { key: self.key.into(), value: self.value.into(), why: why.into() }
    }

    /// A positive integer up to `max`.
    pub fn bounded(&self, max: u64) -> Result<u64, ParamError> {
        self.value
            .parse::<u64>()
            .ok()
            .filter(|v| (1..=max).contains(v))
            .ok_or_else(|| self.bad(&format!("a positive integer up to {max}")))
    }

    /// A positive integer: a byte count or a time (at most [`MAX_INT`]).
    pub fn int(&self) -> Result<u64, ParamError> {
        self.bounded(MAX_INT)
    }

    /// A positive integer, as a count of iterations, steps or streams (at most [`MAX_COUNT`]).
    pub fn count(&self) -> Result<usize, ParamError> {
        self.bounded(MAX_COUNT).map(|v| v as usize)
    }

    /// A positive integer, as one side of a matrix or a model dimension (at most
    /// [`MAX_DIM`]), so that products of two of them never overflow.
    pub fn dim(&self) -> Result<usize, ParamError> {
        self.bounded(MAX_DIM).map(|v| v as usize)
    }

    /// A number strictly between 0 and 1, `what` naming it in the error.
    pub fn fraction(&self, what: &str) -> Result<f64, ParamError> {
        self.value.parse::<f64>().ok().filter(|v| *v > 0.0 && *v < 1.0).ok_or_else(|| self.bad(what))
    }
}
