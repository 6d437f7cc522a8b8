//! What the control plane's parts share to talk to Kafka and to wait out an outage: Kafka
//! clients on one connection ([`kafka::KafkaConn`]: bootstrap servers, TLS and SASL
//! properties) with the settings every part uses (producers, group and tail consumers, topic
//! creation), the [`backoff::Backoff`] between attempts, and the process's error
//! [`signals::SIGNALS`] that health and metrics read.
//!
//! Used by the job-event consumer (`gpusanity-ingest`), the service (outbox publisher,
//! coordinator, agent, isolation) and the tests; it knows nothing of jobs, runs or SQL. The
//! data plane (`gpusanity-executor`) never links it.

pub mod backoff;
pub mod kafka;
pub mod signals;
