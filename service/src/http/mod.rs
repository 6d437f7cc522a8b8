//! The service's HTTP API.

pub mod browser;
mod rules;
mod runs;

pub use runs::{router, Api};
