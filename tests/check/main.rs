//! The data plane through the real binary: `gpusanity check` on CPU workers end to end, its
//! faults and bad input, the micro-benchmarks, the model checks, re-measure, and the HTML
//! run page.

mod bandwidth;
mod faults;
mod fleet;
mod health;
mod host;
mod job_settings;
mod kube_manifests;
mod kubernetes;
mod micro_checks;
mod models;
mod one_rank;
mod readiness;
mod remeasure;
mod rendezvous_auth;
mod report_page;
mod run;
mod scale;
mod slurm;
mod stall;
