//! The control plane through real processes: `gpusanity serve` and `gpusanity agent` over a
//! real Kafka broker, on SQLite and PostgreSQL, under faults; the outbox; notifications to
//! webhook receivers and an SMTP server; the report browser; isolation through Slurm and a
//! real Kubernetes API server.

mod api_security;
mod breaker;
mod browser;
mod chaos;
mod faults;
mod fleet;
mod fleet_drift;
mod fleet_judging;
mod fleet_replicas;
mod fleet_trust;
mod flow;
mod forgery;
mod gpu_ids;
mod image;
mod isolation;
mod kubelet_gpus;
mod kubernetes;
mod notify_email;
mod notify_restart;
mod notify_webhook;
mod ops;
mod outages;
mod outbox;
mod pods;
mod poison;
mod ports;
mod postgres;
mod readiness;
mod replicas;
mod report_chunks;
mod reputation;
mod scale_job;
mod tls;
mod watch;
