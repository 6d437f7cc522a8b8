//! The watch's judgement (docs/watch.md): given the telemetry summaries of a job's nodes, which
//! node the service suspects, on which GPU, for what, and since when.
//!
//! Two kinds of rule:
//! - **of one GPU alone** ([`rules`]), judged on each summary as it comes: a fatal XID, a
//!   hardware slowdown or thermal brake while busy, a foreign process computing, counters
//!   rising;
//! - **against the job's other GPUs** ([`peers`]), judged per sampling instant once every GPU
//!   of the job has reported it: an SM clock or power draw below the job's median by more
//!   than both a robust spread (median absolute deviation) and a relative gap, or an SM clock
//!   whose ratio to that median fell below the GPU's own usual ratio ([`baseline`]) by more
//!   than both the gap and the robust spread of the other GPUs' such changes, in most of the
//!   last few busy instants; and an enforced power limit below the others'. A job's own phases
//!   (checkpoints, evaluation, data loading) move all its GPUs together and so never make one
//!   of them stand out; an instant when the job's GPUs are not busy is not judged.
//!
//! A [`JobJudge`] is one job start's state; it names each (node, code) once. It is pure: no
//! clock, no I/O; the service feeds it from the telemetry topic, the fleet simulation
//! (bench/watch_sim.rs) from generated telemetry.

mod baseline;
mod config;
mod judge;
mod peers;
mod rules;
mod stats;
mod tick;

pub use config::JudgeConfig;
pub use judge::{JobJudge, Suspicion};
