//! The notifier of `gpusanity serve`: workspace notification rules, and their deliveries by
//! webhook (generic JSON, DingTalk, Slack, Feishu) and email, exactly once as the user sees it.
//!
//! Data flows one way: the coordinator writes output events into the outbox (db), the planner
//! ([`plan`]) turns the ones the rules ask for into deliveries, the sender ([`send`]) sends them
//! and logs every attempt. Neither the coordinator nor the publisher waits on any of it.
//! docs/notifications.md describes the API, the formats, the signature and the guarantee.

pub mod config;
pub mod email;
pub mod escape;
pub mod guard;
pub mod notice;
pub mod plan;
pub mod rules;
pub mod send;
pub mod store;
pub mod target;
pub mod webhook;

use std::sync::Arc;
use std::time::Duration;

use gpusanity_db::Db;
use thiserror::Error;
use tokio::sync::Notify;

pub use config::NotifierConfig;

#[derive(Debug, Error)]
pub enum NotifyError {
    #[error("{0}")]
    Config(String),
    #[error("building the message: {0}")]
    Message(String),
}

/// The planner and the sender, ready to run.
pub struct Notifier {
    db: Db,
    config: NotifierConfig,
    output_topic: String,
    sender: Arc<send::Sender>,
}

impl Notifier {
    /// `output_topic`: the topic whose outbox rows are output events; `report_url`: the
    /// `coordinator.report_url` template, for events that carry no link. Fails on a bad SMTP
    /// configuration (an unreadable CA file, a malformed sender). `holder`: this replica's
    /// name, for the claims on deliveries.
    pub fn new(
        db: Db,
        config: NotifierConfig,
        output_topic: String,
        report_url: String,
        holder: String,
    ) -> Result<Notifier, NotifyError> {
        config.validate().map_err(NotifyError::Config)?;
        let mailer = email::Mailer::new(&config.smtp, Duration::from_secs_f64(config.email_timeout_s))?;
        let policy = Arc::new(config.policy());
        // No redirects (a 3xx is logged as such) and no proxy from the environment: every
        // connection goes to an address the guard checked.
        let client = reqwest::Client::builder()
            .user_agent(concat!("gpusanity/", env!("CARGO_PKG_VERSION")))
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .dns_resolver(Arc::new(guard::GuardedResolver { policy: policy.clone() }))
            .connect_timeout(Duration::from_secs_f64(config.webhook_timeout_s))
            .build()
            .map_err(|e| NotifyError::Config(format!("HTTP client: {e}")))?;
        let sender = Arc::new(send::Sender {
            db: db.clone(),
            config: config.clone(),
            report_url,
            client,
            policy,
            mailer,
            wake: Arc::new(Notify::new()),
            inflight: Arc::default(),
            slots: Arc::new(tokio::sync::Semaphore::new(config.concurrency)),
            holder,
        });
        Ok(Notifier { db, config, output_topic, sender })
    }

    /// Plans and sends until the process ends. An error (the database gone) is logged and the
    /// part that failed starts again a second later: the service goes on either way.
    pub async fn run(self) {
        if !self.config.enabled {
            tracing::info!("notifier off (notifier.enabled = false): output events stay unplanned");
            return;
        }
        let poll = Duration::from_millis(self.config.poll_ms);
        let (db, topic, wake) = (self.db.clone(), self.output_topic.clone(), self.sender.wake.clone());
        let planner = async move {
            loop {
                if let Err(e) = plan::run(&db, &topic, poll, &wake).await {
                    tracing::error!("notifier planner: {e}; starting again in 1 s");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        };
        let sender = self.sender.clone();
        let sending = async move {
            loop {
                if let Err(e) = sender.clone().run().await {
                    tracing::error!("notifier sender: {e}; starting again in 1 s");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        };
        tokio::join!(planner, sending);
    }
}
