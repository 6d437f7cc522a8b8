//! The service's metrics in the Prometheus text format (`GET /metrics`, the `prometheus`
//! crate). Counters and the latency histogram are kept as things happen; the database's counts
//! (runs by state, the outbox backlog, deliveries) are read at each scrape, so every replica
//! of a later multi-replica service reports the same shared totals for them, and its own
//! process's counters and consumer lag for the rest.

use std::sync::LazyLock;

use gpusanity_bus::signals::SIGNALS;
use gpusanity_db::Db;
use prometheus::{
    Encoder, GaugeVec, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

pub struct Metrics {
    registry: Registry,
    pub runs: IntGaugeVec,
    pub verdicts: IntCounterVec,
    pub verdict_latency: Histogram,
    pub consumer_lag: IntGaugeVec,
    pub partitions_assigned: IntGaugeVec,
    pub outbox_backlog: IntGauge,
    pub outbox_oldest_age: prometheus::Gauge,
    pub outbox_failed: IntGauge,
    pub outbox_refused: IntCounter,
    pub deliveries: IntGaugeVec,
    pub agents_live: IntGauge,
    pub kafka_errors: IntCounter,
    pub database_errors: IntCounter,
    pub ready: IntGauge,
    pub runs_taken_over: IntCounter,
    pub runs_owned: IntGauge,
    pub outbox_leader: IntGauge,
    pub isolation_actions: IntCounterVec,
    pub node_failures: IntGaugeVec,
    pub nodes_failing: IntGauge,
    pub node_fleet_percentile: GaugeVec,
    pub nodes_judged: IntGauge,
    pub nodes_suspected: IntCounterVec,
}

/// At most this many nodes get a `gpusanity_node_failures` series (the most failing first):
/// a fleet of 10,000 nodes must not make 10,000 series. `gpusanity_nodes_failing` counts all.
pub const NODE_SERIES_CAP: i64 = 100;
/// The window of `gpusanity_node_failures`.
pub const NODE_FAILURE_WINDOW_MS: i64 = 24 * 3600 * 1000;

fn gauge_vec(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    let g = IntGaugeVec::new(Opts::new(name, help), labels).expect("a valid metric");
    r.register(Box::new(g.clone())).expect("registered once");
    g
}

fn gauge(r: &Registry, name: &str, help: &str) -> IntGauge {
    let g = IntGauge::new(name, help).expect("a valid metric");
    r.register(Box::new(g.clone())).expect("registered once");
    g
}

fn counter_vec(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).expect("a valid metric");
    r.register(Box::new(c.clone())).expect("registered once");
    c
}

fn counter(r: &Registry, name: &str, help: &str) -> IntCounter {
    let c = IntCounter::new(name, help).expect("a valid metric");
    r.register(Box::new(c.clone())).expect("registered once");
    c
}

/// The process's metrics.
pub static METRICS: LazyLock<Metrics> = LazyLock::new(|| {
    let r = Registry::new();
    let verdicts = IntCounterVec::new(
        Opts::new("gpusanity_verdicts_total", "Runs ended by this process, by verdict and reason"),
        &["verdict", "reason"],
    )
    .expect("a valid metric");
    r.register(Box::new(verdicts.clone())).expect("registered once");
    let verdict_latency = Histogram::with_opts(
        HistogramOpts::new(
            "gpusanity_verdict_latency_seconds",
            "From the job event's arrival (the run stored) to the run's verdict",
        )
        .buckets(vec![1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0]),
    )
    .expect("a valid metric");
    r.register(Box::new(verdict_latency.clone())).expect("registered once");
    let outbox_oldest_age =
        prometheus::Gauge::new("gpusanity_outbox_oldest_age_seconds", "Age of the oldest unsent outbox row (0: none)")
            .expect("a valid metric");
    r.register(Box::new(outbox_oldest_age.clone())).expect("registered once");
    Metrics {
        runs: gauge_vec(
            &r,
            "gpusanity_runs",
            "Runs in the database by state (held: Checking under KeepJobHang)",
            &["state"],
        ),
        verdicts,
        verdict_latency,
        consumer_lag: gauge_vec(
            &r,
            "gpusanity_consumer_lag",
            "Messages not yet committed by the service's consumers (high watermark minus committed offset)",
            &["topic", "partition"],
        ),
        partitions_assigned: gauge_vec(
            &r,
            "gpusanity_partitions_assigned",
            "Partitions assigned to this process",
            &["topic"],
        ),
        outbox_backlog: gauge(&r, "gpusanity_outbox_backlog", "Outbox rows not yet sent"),
        outbox_oldest_age,
        outbox_failed: gauge(&r, "gpusanity_outbox_failed", "Outbox rows the broker refused for good (marked failed)"),
        outbox_refused: counter(
            &r,
            "gpusanity_outbox_refused_total",
            "Sends of an outbox row the broker refused for good (too large, invalid), by this process",
        ),
        deliveries: gauge_vec(
            &r,
            "gpusanity_deliveries",
            "Notification deliveries by channel and status",
            &["channel", "status"],
        ),
        agents_live: gauge(&r, "gpusanity_agents_live", "Agents heard from within the agent timeout"),
        kafka_errors: counter(&r, "gpusanity_kafka_errors_total", "Kafka errors seen by this process"),
        database_errors: counter(&r, "gpusanity_database_errors_total", "Database errors seen by this process"),
        ready: gauge(&r, "gpusanity_ready", "1 when /ready answers 200"),
        runs_taken_over: counter(
            &r,
            "gpusanity_runs_taken_over_total",
            "Runs this process took up from the database (after a restart, or from a replica that lost them)",
        ),
        runs_owned: gauge(&r, "gpusanity_runs_owned", "Runs this replica holds the lease of"),
        outbox_leader: gauge(&r, "gpusanity_outbox_leader", "1 while this replica holds the outbox publisher's lease"),
        nodes_suspected: counter_vec(
            &r,
            "gpusanity_nodes_suspected_total",
            "Nodes the watch suspected while their job ran, by code (docs/watch.md)",
            &["code"],
        ),
        isolation_actions: counter_vec(
            &r,
            "gpusanity_isolation_actions_total",
            "Isolation backend actions by this process, by outcome (isolated, already_isolated, returned, not_ours, refused_by_breaker, failed)",
            &["outcome"],
        ),
        node_failures: gauge_vec(
            &r,
            "gpusanity_node_failures",
            "Failed job runs of the node in the last 24 h (re-checks not counted); only the 100 most failing nodes",
            &["node"],
        ),
        nodes_failing: gauge(&r, "gpusanity_nodes_failing", "Nodes with a failed job run in the last 24 h, all of them"),
        node_fleet_percentile: {
            let help = "Fleet percentile (0-100) of the node's newest figure of the check in the last 24 h, lowest over \
                        the check's baseline keys; only the 100 lowest (node, check) pairs";
            let g = GaugeVec::new(Opts::new("gpusanity_node_fleet_percentile", help), &["node", "check"])
                .expect("a valid metric");
            r.register(Box::new(g.clone())).expect("registered once");
            g
        },
        nodes_judged: gauge(
            &r,
            "gpusanity_nodes_judged",
            "(node, check) pairs with a fleet percentile in the last 24 h, all of them",
        ),
        registry: r,
    }
});

impl Metrics {
    /// The watch suspected a node.
    pub fn suspected(&self, code: gpusanity_common::wire::watch::SuspectCode) {
        self.nodes_suspected.with_label_values(&[code.as_str()]).inc();
    }

    /// A run ended: its verdict and the time since the run was stored (`created_at_ms`).
    pub fn verdict(&self, verdict: &str, reason: &str, created_at_ms: i64) {
        self.verdicts.with_label_values(&[verdict, reason]).inc();
        let ms = gpusanity_db::now_ms().saturating_sub(created_at_ms).max(0);
        self.verdict_latency.observe(ms as f64 / 1000.0);
    }

    /// Reads the database's counts and the process's error counts, then encodes everything.
    pub async fn scrape(&self, db: &Db) -> String {
        self.refresh(db).await;
        let mut buf = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut buf) {
            tracing::warn!("encoding the metrics: {e}");
        }
        String::from_utf8(buf).unwrap_or_default()
    }

    async fn refresh(&self, db: &Db) {
        catch_up(&self.kafka_errors, SIGNALS.kafka_errors());
        match db.runs_by_state().await {
            Ok(rows) => {
                self.runs.reset();
                for s in ["Checking", "held", "CheckPassed", "CheckFailed", "CheckCancelled"] {
                    self.runs.with_label_values(&[s]).set(0);
                }
                for (state, n) in rows {
                    self.runs.with_label_values(&[&state]).set(n);
                }
            }
            Err(e) => SIGNALS.db_error_logged(&e),
        }
        match db.outbox_backlog().await {
            Ok((n, oldest, failed)) => {
                self.outbox_backlog.set(n);
                self.outbox_failed.set(failed);
                let age = oldest.map(|t| gpusanity_db::now_ms().saturating_sub(t).max(0) as f64 / 1000.0);
                self.outbox_oldest_age.set(age.unwrap_or(0.0));
            }
            Err(e) => SIGNALS.db_error_logged(&e),
        }
        match db.deliveries_by_status().await {
            Ok(rows) => {
                self.deliveries.reset();
                for (channel, status, n) in rows {
                    self.deliveries.with_label_values(&[&channel, &status]).set(n);
                }
            }
            Err(e) => SIGNALS.db_error_logged(&e),
        }
        let since = gpusanity_db::now_ms().saturating_sub(NODE_FAILURE_WINDOW_MS);
        match db.failing_nodes(since, NODE_SERIES_CAP).await {
            Ok((rows, total)) => {
                self.node_failures.reset();
                for (node, n) in rows {
                    self.node_failures.with_label_values(&[&node]).set(n);
                }
                self.nodes_failing.set(total);
            }
            Err(e) => SIGNALS.db_error_logged(&e),
        }
        let cap = usize::try_from(NODE_SERIES_CAP).unwrap_or(100);
        match crate::fleet::node_percentiles(db, since, cap, gpusanity_common::fleet::Policy::default()).await {
            Ok((rows, total)) => {
                self.node_fleet_percentile.reset();
                for p in rows {
                    self.node_fleet_percentile.with_label_values(&[&p.node, &p.check]).set(p.percentile);
                }
                self.nodes_judged.set(i64::try_from(total).unwrap_or(i64::MAX));
            }
            Err(e) => SIGNALS.db_error_logged(&e),
        }
        catch_up(&self.database_errors, SIGNALS.db_errors());
    }
}

/// Brings a counter up to a count kept elsewhere.
fn catch_up(c: &IntCounter, total: u64) {
    if let Some(d) = total.checked_sub(c.get()) {
        c.inc_by(d);
    }
}

trait Logged {
    fn db_error_logged(&self, e: &gpusanity_db::DbError);
}

impl Logged for gpusanity_bus::signals::Signals {
    fn db_error_logged(&self, e: &gpusanity_db::DbError) {
        self.db_error();
        tracing::debug!("reading the metrics' counts: {e}");
    }
}
