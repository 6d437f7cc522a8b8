//! The gpusanity data plane: a node launcher that rendezvouses with the other nodes, starts
//! one worker process per device, enforces deadlines from outside, gathers results, diagnoses
//! and hands over to the job; the workers run the checks over a CPU or CUDA backend.

pub mod backend;
pub mod checks;
pub mod diagnosis;
pub mod host;
pub mod launcher;
pub mod protocol;
pub mod store;
pub mod worker;
