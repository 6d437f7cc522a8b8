//! `gpusanity serve`: the control plane. Wires the database, the job-event consumer, the
//! coordinator, the outbox publisher, the notifier and the HTTP API, and runs them until
//! SIGTERM/SIGINT or until one of them fails (then the process exits 4 and a restart resumes
//! from the database).

use std::sync::Arc;

use std::future::IntoFuture;

use anyhow::{Context, Result};
use gpusanity_bus::kafka::{self, KafkaConn, TopicSpec};
use gpusanity_common::envs::EnvPolicy;
use gpusanity_db::Db;
use gpusanity_ingest::consume::{self, Ingest, Owner};
use gpusanity_ingest::Notice;
use rdkafka::consumer::StreamConsumer;
use tokio::sync::{mpsc, Notify};
use tokio::task::JoinHandle;

use crate::auth::{Keyring, Verifier};
use crate::coordinator::Replica;
use crate::coordinator::{self, Coordinator};
use crate::ops::health::Health;
use crate::outbox::lease::Keeper;
use crate::outbox::Publisher;
use crate::{http, ServiceConfig, UsageError};

/// Runs the service under `cfg` (already validated) until a signal or a failure.
pub async fn run(cfg: ServiceConfig) -> Result<()> {
    // Held for the process's life: a second replica on one SQLite file is refused.
    let _sqlite_lock = crate::replica::sqlite_lock(&cfg.database.url).map_err(|e| UsageError(e.to_string()))?;
    let replica = Replica { id: cfg.replica.id(&cfg.http.listen), lease: cfg.replica.lease() };
    let Opened { db, ring, env_policy, conn, spec, listener } = open(&cfg).await?;
    let wake = Arc::new(Notify::new());
    let health = Arc::new(Health::default());
    // The HTTP API answers from here on (/health, and /ready saying what is not ready while
    // the broker is waited for).
    let mut http_server = serve_http(listener, api(&cfg, &db, &wake, &health)?)?;
    kafka::ensure_topics(&conn, &cfg.topics.all(), &spec).await.map_err(crate::agent::topics_error)?;
    let keeper = spawn_outbox_tasks(&db, &wake, &replica);
    let parts = build_parts(&cfg, &db, &conn, ring, env_policy, &replica, &wake, &keeper).await?;
    spawn_tasks(&cfg, &db, &conn, &replica, health, &parts).await?;
    tracing::info!(replica = replica.id, kafka = conn.bootstrap(), kafka_security = conn.protocol(), database = %cfg.database.url.split('@').next_back().unwrap_or_default(), listen = cfg.http.listen, "serving");
    let ended = run_parts(parts, &mut http_server).await;
    hand_over(&keeper, &db, &replica).await;
    ended
}

/// What `serve` opens before anything runs: each one refused with a usage error where the
/// configuration is at fault.
struct Opened {
    db: Db,
    ring: Keyring,
    env_policy: EnvPolicy,
    conn: KafkaConn,
    spec: TopicSpec,
    listener: tokio::net::TcpListener,
}

/// Opens the database, reads the agents' keys, the jobs' environment policy and the broker's
/// settings, and binds the HTTP listener.
async fn open(cfg: &ServiceConfig) -> Result<Opened> {
    let db = open_db(&cfg.database.url).await?;
    let ring = cfg.agent_auth.keyring().map_err(|e| UsageError(e.to_string()))?;
    let env_policy = cfg.jobs.env_policy().map_err(UsageError)?;
    let conn = cfg.kafka.connection().map_err(UsageError)?;
    let spec = cfg.kafka.topic_spec().map_err(UsageError)?;
    let listener = tokio::net::TcpListener::bind(&cfg.http.listen)
        .await
        .map_err(|e| UsageError(format!("cannot listen on {}: {e}", cfg.http.listen)))?;
    Ok(Opened { db, ring, env_policy, conn, spec, listener })
}

/// Connects to the database: a URL, options or TLS settings that cannot work, or a refusal,
/// are usage errors.
async fn open_db(url: &str) -> Result<Db> {
    Db::connect(url).await.map_err(|e| match e {
        gpusanity_db::DbError::BadUrl(_)
        | gpusanity_db::DbError::Options(_)
        | gpusanity_db::DbError::Tls(_)
        | gpusanity_db::DbError::Refused(_) => anyhow::Error::from(UsageError(e.to_string())),
        e => anyhow::Error::from(e).context("opening the database"),
    })
}

/// The HTTP API's state.
fn api(cfg: &ServiceConfig, db: &Db, wake: &Arc<Notify>, health: &Arc<Health>) -> Result<Arc<http::Api>> {
    Ok(Arc::new(http::Api {
        db: db.clone(),
        topics: cfg.topics.clone(),
        tokens: Arc::new(cfg.http.tokens().map_err(UsageError)?),
        report_url: cfg.coordinator.report_url.clone(),
        outbox_wake: wake.clone(),
        browser: cfg.http.browser(),
        webhook_policy: cfg.notifier.policy(),
        health: health.clone(),
        metrics_token: std::env::var(METRICS_TOKEN_ENV)
            .ok()
            .filter(|t| !t.is_empty())
            .or(cfg.http.metrics_token.clone()),
    }))
}

/// Starts the HTTP server on `listener`. The peer address is the login limiter's client key.
fn serve_http(listener: tokio::net::TcpListener, api: Arc<http::Api>) -> Result<JoinHandle<std::io::Result<()>>> {
    let app = http::router(api);
    eprintln!("gpusanity serve: listening on {}", listener.local_addr()?);
    Ok(tokio::spawn(
        axum::serve(listener, app.into_make_service_with_connect_info::<std::net::SocketAddr>()).into_future(),
    ))
}

/// Starts what the outbox publisher leans on: the wake-ups by the other replicas' commits and
/// the keeper of the publisher's lease, which it returns.
fn spawn_outbox_tasks(db: &Db, wake: &Arc<Notify>, replica: &Replica) -> Keeper {
    // Commits of the other replicas that queue output events wake this one's publisher too.
    tokio::spawn({
        let (db, wake) = (db.clone(), wake.clone());
        async move { db.wake_on_outbox(wake).await }
    });
    let keeper = Keeper::new(db.clone(), replica.id.clone(), replica.lease);
    tokio::spawn(keeper.clone().run());
    keeper
}

/// The parts that end the service when one of them ends ([`run_parts`]).
struct Parts {
    publisher: Publisher,
    coord: Coordinator,
    notices: mpsc::UnboundedReceiver<Notice>,
    ingest: Ingest,
    /// The agents' reports, for the coordinator.
    reports: Arc<StreamConsumer>,
    /// The job events, for the ingest (and the coordinator's look at its lag).
    events: Arc<StreamConsumer>,
    /// The watch's judgement and its consumer, unless `watch.enabled` is off.
    watcher: Option<(crate::watch::Watcher, StreamConsumer)>,
}

/// Builds the outbox publisher, the coordinator (resuming the runs this replica holds) and the
/// ingest, with their consumers.
#[allow(clippy::too_many_arguments)]
async fn build_parts(
    cfg: &ServiceConfig,
    db: &Db,
    conn: &KafkaConn,
    ring: Keyring,
    env_policy: EnvPolicy,
    replica: &Replica,
    wake: &Arc<Notify>,
    keeper: &Keeper,
) -> Result<Parts> {
    let publisher = Publisher {
        db: db.clone(),
        producer: kafka::producer_with_timeout(conn, keeper.message_timeout())?,
        kafka: conn.clone(),
        wake: wake.clone(),
        keeper: keeper.clone(),
    };
    let (notices_tx, notices) = mpsc::unbounded_channel();
    let mut coord = coordinator(cfg, db, conn, ring.clone(), replica, wake)?;
    coord.resume().await?;
    let reports_group = format!("{}-agents-{}", cfg.kafka.group, replica.id);
    let reports = Arc::new(coordinator::subscribe(conn, &reports_group, &cfg.topics.agent_reports)?);
    let ingest = Ingest {
        db: db.clone(),
        topics: cfg.topics.clone(),
        notices: notices_tx,
        outbox_wake: wake.clone(),
        env_policy,
        owner: Owner { id: replica.id.clone(), lease: replica.lease },
        check_suspected_at_restart: cfg.watch.enabled
            && cfg.watch.policy == crate::watch::config::WatchPolicy::CheckAtRestart,
    };
    let events = Arc::new(consume::subscribe(conn, &cfg.kafka.group, &replica.id, &cfg.topics.job_events)?);
    let watcher = if cfg.watch.enabled { Some(watcher(cfg, db, conn, ring, wake)?) } else { None };
    Ok(Parts { publisher, coord, notices, ingest, reports, events, watcher })
}

/// The watch's judgement (docs/watch.md), with its consumer of the telemetry topic.
fn watcher(
    cfg: &ServiceConfig,
    db: &Db,
    conn: &KafkaConn,
    ring: Keyring,
    wake: &Arc<Notify>,
) -> Result<(crate::watch::Watcher, StreamConsumer)> {
    let watcher = crate::watch::Watcher {
        db: db.clone(),
        producer: kafka::producer_with_timeout(conn, std::time::Duration::from_secs(cfg.watch.lease_s))?,
        topics: cfg.topics.clone(),
        config: cfg.watch.clone(),
        auth: Verifier::new(ring, std::time::Duration::from_secs(cfg.agent_auth.max_age_s)),
        outbox_wake: wake.clone(),
    };
    let consumer = crate::watch::subscribe(conn, &format!("{}-watch", cfg.kafka.group), &cfg.topics.telemetry)?;
    Ok((watcher, consumer))
}

/// The coordinator, with its own producer for the agents' commands.
fn coordinator(
    cfg: &ServiceConfig,
    db: &Db,
    conn: &KafkaConn,
    ring: Keyring,
    replica: &Replica,
    wake: &Arc<Notify>,
) -> Result<Coordinator> {
    let max_age = std::time::Duration::from_secs(cfg.agent_auth.max_age_s);
    Ok(Coordinator::new(
        db.clone(),
        cfg.topics.clone(),
        cfg.coordinator.clone(),
        // Commands wait out a broker outage in the producer's queue as long as an agent takes them.
        kafka::producer_with_timeout(conn, max_age)?,
        wake.clone(),
        Verifier::new(ring, max_age),
        replica.clone(),
    ))
}

/// Starts the background tasks beside the parts: the consumers' health probe, the notifier and
/// the isolation backends. None of them ends the service.
async fn spawn_tasks(
    cfg: &ServiceConfig,
    db: &Db,
    conn: &KafkaConn,
    replica: &Replica,
    health: Arc<Health>,
    parts: &Parts,
) -> Result<()> {
    tokio::spawn(crate::ops::health::probe(
        health,
        vec![
            (parts.events.clone(), cfg.topics.job_events.clone()),
            (parts.reports.clone(), cfg.topics.agent_reports.clone()),
        ],
    ));
    tokio::spawn(notifier(cfg, db, replica)?.run());
    spawn_isolation(cfg, db, conn, replica).await
}

/// The notifier: beside the publisher; it never stops the service (its errors are logged and
/// it goes on).
fn notifier(cfg: &ServiceConfig, db: &Db, replica: &Replica) -> Result<gpusanity_notifier::Notifier> {
    Ok(gpusanity_notifier::Notifier::new(
        db.clone(),
        cfg.notifier.clone(),
        cfg.topics.output.clone(),
        cfg.coordinator.report_url.clone(),
        replica.id.clone(),
    )
    .map_err(|e| UsageError(e.to_string()))?)
}

/// Starts the configured isolation backends: beside NodeIsolated itself, each in a group of its
/// own; off by default.
async fn spawn_isolation(cfg: &ServiceConfig, db: &Db, conn: &KafkaConn, replica: &Replica) -> Result<()> {
    let breaker = crate::isolation::breaker::Breaker {
        db: db.clone(),
        replica: replica.id.clone(),
        settings: cfg.isolation.breaker_settings().clone(),
        max_age: std::time::Duration::from_secs(cfg.isolation.max_event_age_s),
    };
    let group = format!("{}-isolation", cfg.kafka.group);
    if let Some(scontrol) = cfg.isolation.scontrol().map_err(UsageError)? {
        let consumer = crate::isolation::subscribe(conn, &group, &cfg.topics.output)?;
        tokio::spawn(crate::isolation::run(consumer, scontrol, breaker.clone()));
    }
    if cfg.isolation.backend == crate::isolation::IsolationBackend::Kubernetes {
        let k = &cfg.isolation.kubernetes;
        let client = k.client_settings().client().await.map_err(|e| UsageError(e.to_string()))?;
        let isolator = gpusanity_kube::Isolator::new(client, k.taint_effect, cfg.isolation.dry_run);
        let consumer = crate::isolation::subscribe(conn, &group, &cfg.topics.output)?;
        tokio::spawn(crate::isolation::kubernetes::run(consumer, isolator, k.clone(), breaker));
    }
    Ok(())
}

/// Runs the parts until one of them or the HTTP server ends, or a stop signal comes, and
/// stops the others.
async fn run_parts(parts: Parts, http_server: &mut JoinHandle<std::io::Result<()>>) -> Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    // Outages of the broker or the database are waited out inside each part: none of them
    // ends on one. Each part is a task of its own, so that the runtime's threads run them side
    // by side: a coordinator busy with a wave of verdicts and their reports does not hold up
    // the ingest's transactions or the publisher's sends.
    let Parts { publisher, coord, notices, ingest, reports, events, watcher } = parts;
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(async move { publisher.run().await.context("outbox publisher") });
    let consumer = events.clone();
    tasks.spawn(async move { ingest.run(&consumer).await.context("job-event consumer") });
    tasks.spawn(async move { coord.run(notices, reports, events).await.context("coordinator") });
    if let Some((watcher, consumer)) = watcher {
        tasks.spawn(async move { watcher.run(consumer).await.context("watch") });
    }
    let ended = tokio::select! {
        Some(r) = tasks.join_next() => match r {
            Ok(r) => r,
            Err(e) => Err(anyhow::Error::from(e).context("a part of the service ended abnormally")),
        },
        r = http_server => match r {
            Ok(r) => r.context("HTTP server"),
            Err(e) => Err(anyhow::Error::from(e).context("HTTP server")),
        },
        _ = stop_signal(&mut term) => Ok(()),
    };
    // Stop the other parts and wait until they are dropped (a transaction under way is
    // finished or rolled back as it is dropped).
    tasks.shutdown().await;
    ended
}

/// Hands the runs and the publisher's lease over at once, so that another replica takes them
/// without waiting for the leases to run out.
async fn hand_over(keeper: &Keeper, db: &Db, replica: &Replica) {
    keeper.release().await;
    match db.release_runs_of(&replica.id).await {
        Ok(n) if n > 0 => tracing::info!(runs = n, "runs handed over"),
        Ok(_) => {}
        Err(e) => tracing::warn!("handing the runs over: {e}"),
    }
}

/// The environment variable of the metrics token (wins over `http.metrics_token`).
pub const METRICS_TOKEN_ENV: &str = "GPUSANITY_METRICS_TOKEN";

/// Waits for SIGTERM or SIGINT and starts the exit watchdog before the other parts are dropped
/// (the select drops them before its branch runs).
async fn stop_signal(term: &mut tokio::signal::unix::Signal) {
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    tracing::info!("stop signal: stopping");
    crate::shutdown::exit_after(SHUTDOWN_GRACE, "serve");
}

/// How long `serve` may take to stop after a signal.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(5);
