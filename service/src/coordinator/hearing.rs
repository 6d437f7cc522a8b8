//! Whether the coordinator can hear its agents: silence is evidence only while it could.
//!
//! The proof is the service's own: a probe asks the broker for the end (high watermark) of
//! every partition of the agent-reports topic, then waits until the coordinator's consumer has
//! handed every message below those ends to the coordinator. When it has, everything an agent
//! had delivered to the broker before the probe began has been heard: the service *heard up
//! to* that instant. A broker away (no watermarks), a consumer that cannot fetch, or a
//! coordinator held up by its database (it does not read while a report waits for a write)
//! all leave the proof where it was.
//!
//! The clock of every judgement of silence (an agent lost, a run's phase overdue, node 0's
//! peers late) is [`Hearing::silence`]: the time from an event to the last proof, counted from
//! the end of the last blind spell at the earliest. While blind nothing is judged, and after a
//! blind spell every agent gets a whole `agent_timeout_s` to be heard again (its producer
//! reconnects and delivers what it queued); one that is not is named then. Run deadlines move
//! by the blind time since the run was created ([`Hearing::blind_since`]).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::watch;

/// A proof older than this means the service is blind (probes normally land every 250 ms).
pub const BLIND_AFTER: Duration = Duration::from_secs(3);
/// Between two probes.
const PROBE_EVERY: Duration = Duration::from_millis(250);
/// How long one broker request of a probe may take.
const PROBE_WAIT: Duration = Duration::from_secs(1);
/// How long a probe waits for the consumer to reach the ends it read.
const CATCH_UP: Duration = Duration::from_secs(2);
/// Blind spells remembered for the report of the runs they overlapped.
const KEEP_SPELLS: usize = 32;

/// A time the service could not hear its agents.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spell {
    pub from: Instant,
    pub to: Instant,
    pub from_wall: DateTime<Utc>,
    pub to_wall: DateTime<Utc>,
}

impl Spell {
    pub fn length(&self) -> Duration {
        self.to.saturating_duration_since(self.from)
    }
}

/// The coordinator's view of its own hearing.
#[derive(Debug)]
pub struct Hearing {
    proofs: watch::Receiver<Option<Instant>>,
    /// The last proof: everything delivered to the broker before it has been heard.
    heard_upto: Option<Instant>,
    /// When hearing came back after the last blind spell (the first proof after start-up).
    resumed_at: Option<Instant>,
    blind_total: Duration,
    spells: VecDeque<Spell>,
}

impl Hearing {
    /// A hearing fed by `proofs` (see [`spawn_probe`]); blind until the first proof.
    pub fn new(proofs: watch::Receiver<Option<Instant>>) -> Self {
        Hearing { proofs, heard_upto: None, resumed_at: None, blind_total: Duration::ZERO, spells: VecDeque::new() }
    }

    /// Takes in the newest proof; a gap longer than [`BLIND_AFTER`] since the one before is a
    /// blind spell.
    pub fn update(&mut self) {
        let Some(proof) = *self.proofs.borrow_and_update() else { return };
        self.record(proof);
    }

    fn record(&mut self, proof: Instant) {
        match self.heard_upto {
            Some(last) if proof <= last => return,
            Some(last) if proof.duration_since(last) > BLIND_AFTER => {
                let length = proof.duration_since(last);
                let now = Utc::now();
                let to_wall = now - chrono::Duration::from_std(proof.elapsed()).unwrap_or_default();
                let from_wall = to_wall - chrono::Duration::from_std(length).unwrap_or_default();
                self.blind_total += length;
                tracing::warn!(
                    blind_s = length.as_secs_f64(),
                    blind_total_s = self.blind_total.as_secs_f64(),
                    "the coordinator heard its agents again after a blind spell: no silence in it is held against them"
                );
                self.spells.push_back(Spell { from: last, to: proof, from_wall, to_wall });
                if self.spells.len() > KEEP_SPELLS {
                    self.spells.pop_front();
                }
                self.resumed_at = Some(proof);
            }
            Some(_) => {}
            None => self.resumed_at = Some(proof),
        }
        self.heard_upto = Some(proof);
    }

    /// Whether the service cannot hear now (no proof for [`BLIND_AFTER`], or none yet).
    pub fn blind(&self) -> bool {
        self.heard_upto.is_none_or(|h| h.elapsed() > BLIND_AFTER)
    }

    /// How long the service has heard nothing since `since` (a message's arrival, a phase's
    /// start), counting only from the end of the last blind spell and up to the last proof.
    pub fn silence(&self, since: Instant) -> Duration {
        let (Some(upto), Some(resumed)) = (self.heard_upto, self.resumed_at) else { return Duration::ZERO };
        upto.saturating_duration_since(since.max(resumed))
    }

    /// Whether a silence that began at `since` overlapped a blind spell.
    pub fn overlapped(&self, since: Instant) -> bool {
        self.resumed_at.is_some_and(|r| since < r) && !self.spells.is_empty()
    }

    /// The blind time since start-up, in spells that ended.
    #[cfg(test)]
    pub fn blind_total(&self) -> Duration {
        self.blind_total
    }

    /// The blind spells that ended after `since_ms` (Unix ms: a run's creation).
    pub fn spells_since(&self, since_ms: i64) -> Vec<Spell> {
        self.spells.iter().filter(|s| s.to_wall.timestamp_millis() > since_ms).copied().collect()
    }

    /// [`Hearing::spells_since`] and, while blind, the spell under way (a result read back
    /// from the broker before the first proof after an outage ends its run inside it).
    pub fn spells_with_current(&self, since_ms: i64) -> Vec<Spell> {
        let mut spells = self.spells_since(since_ms);
        if let (true, Some(last)) = (self.blind(), self.heard_upto) {
            let now = Utc::now();
            let from_wall = now - chrono::Duration::from_std(last.elapsed()).unwrap_or_default();
            spells.push(Spell { from: last, to: Instant::now(), from_wall, to_wall: now });
        }
        spells
    }

    /// The blind time after `since_ms` (Unix ms), in spells that ended: what a run created
    /// then adds to its deadline.
    pub fn blind_since(&self, since_ms: i64) -> Duration {
        self.spells_since(since_ms)
            .iter()
            .map(|s| {
                let from = s.from_wall.timestamp_millis().max(since_ms);
                let ms = s.to_wall.timestamp_millis().saturating_sub(from).max(0);
                Duration::from_millis(u64::try_from(ms).unwrap_or(0))
            })
            .sum()
    }
}

/// What a run's event and report say of the blind spells its verdict was reached across.
pub fn across(spells: &[Spell]) -> Option<String> {
    if spells.is_empty() {
        return None;
    }
    let total: Duration = spells.iter().map(Spell::length).sum();
    let list: Vec<String> = spells
        .iter()
        .map(|s| {
            let fmt = |t: DateTime<Utc>| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
            format!("{} to {}", fmt(s.from_wall), fmt(s.to_wall))
        })
        .collect();
    Some(format!(
        "verdict reached across an outage of the service's own connections: blind {:.1} s ({})",
        total.as_secs_f64(),
        list.join(", ")
    ))
}

/// Starts the probe of `consumer` on `topic` (on a blocking thread, librdkafka's calls being
/// blocking); it ends when the returned receiver is dropped.
pub fn spawn_probe(consumer: Arc<StreamConsumer>, topic: String) -> watch::Receiver<Option<Instant>> {
    let (tx, rx) = watch::channel(None);
    std::thread::Builder::new()
        .name("hearing-probe".into())
        .spawn(move || {
            while !tx.is_closed() {
                let began = Instant::now();
                match caught_up(&consumer, &topic, began + CATCH_UP) {
                    Ok(true) => {
                        tx.send_replace(Some(began));
                    }
                    Ok(false) => tracing::debug!("hearing probe: the agent reports are not read up to their end yet"),
                    Err(e) => tracing::debug!("hearing probe: {e}"),
                }
                std::thread::sleep(PROBE_EVERY);
            }
        })
        .map_err(|e| tracing::error!("the hearing probe could not start: {e}"))
        .ok();
    rx
}

/// Whether the consumer, before `deadline`, handed out every message that the broker held in
/// `topic` when this was called.
fn caught_up(c: &StreamConsumer, topic: &str, deadline: Instant) -> Result<bool, rdkafka::error::KafkaError> {
    let md = c.fetch_metadata(Some(topic), PROBE_WAIT)?;
    let mut ends = Vec::new();
    for t in md.topics() {
        for p in t.partitions() {
            let (low, high) = c.fetch_watermarks(topic, p.id(), PROBE_WAIT)?;
            ends.push((p.id(), low, high));
        }
    }
    if ends.is_empty() {
        return Ok(false);
    }
    let mut committed: Option<TopicPartitionList> = None;
    loop {
        let positions = c.position()?;
        let mut all = true;
        for &(p, low, high) in &ends {
            if high <= low {
                continue;
            }
            let at = match positions.find_partition(topic, p).map(|e| e.offset()) {
                Some(Offset::Offset(o)) => o,
                // Assigned, nothing read since: where the group's commit left it.
                Some(_) => {
                    if committed.is_none() {
                        committed = Some(c.committed(PROBE_WAIT)?);
                    }
                    match committed.as_ref().and_then(|t| t.find_partition(topic, p)).map(|e| e.offset()) {
                        Some(Offset::Offset(o)) => o,
                        _ => low,
                    }
                }
                // Not assigned (yet): not heard.
                None => return Ok(false),
            };
            all &= at >= high;
        }
        if all {
            return Ok(true);
        }
        if Instant::now() >= deadline {
            return Ok(false);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hearing() -> (watch::Sender<Option<Instant>>, Hearing) {
        let (tx, rx) = watch::channel(None);
        (tx, Hearing::new(rx))
    }

    #[test]
    fn blind_until_the_first_proof_and_silence_counts_from_it() {
        let (tx, mut h) = hearing();
        let before = Instant::now();
        h.update();
        assert!(h.blind());
        assert_eq!(h.silence(before), Duration::ZERO);
        let t0 = before + Duration::from_secs(1);
        tx.send_replace(Some(t0));
        h.update();
        tx.send_replace(Some(t0 + Duration::from_secs(2)));
        h.update();
        // Silence since before the first proof counts from the first proof.
        assert_eq!(h.silence(before), Duration::from_secs(2));
        assert_eq!(h.blind_total(), Duration::ZERO);
        assert!(!h.overlapped(before));
    }

    #[test]
    fn a_blind_spell_is_not_silence_and_moves_deadlines() {
        let (tx, mut h) = hearing();
        let t0 = Instant::now();
        tx.send_replace(Some(t0));
        h.update();
        let seen = t0 + Duration::from_millis(500);
        // 30 s without a proof: the agent seen at 0.5 s is not silent for 30 s.
        let back = t0 + Duration::from_secs(30);
        tx.send_replace(Some(back));
        h.update();
        assert_eq!(h.silence(seen), Duration::ZERO);
        assert_eq!(h.blind_total(), Duration::from_secs(30));
        assert!(h.overlapped(seen));
        let start_ms = Utc::now().timestamp_millis() - 60_000;
        assert_eq!(h.spells_since(start_ms).len(), 1);
        let blind = h.blind_since(start_ms).as_millis().abs_diff(30_000);
        assert!(blind <= 5, "{blind}");
        // After the spell, silence counts again from its end.
        for s in [2, 4, 6, 7] {
            tx.send_replace(Some(back + Duration::from_secs(s)));
            h.update();
        }
        assert_eq!(h.silence(seen), Duration::from_secs(7));
        // An agent heard after the spell did not overlap it.
        assert!(!h.overlapped(back + Duration::from_secs(1)));
        // Short gaps between proofs are no spell.
        assert_eq!(h.blind_total(), Duration::from_secs(30));
    }

    #[test]
    fn spells_are_bounded() {
        let (tx, mut h) = hearing();
        let t0 = Instant::now();
        for i in 0..100u64 {
            tx.send_replace(Some(t0 + Duration::from_secs(10 * i)));
            h.update();
        }
        assert_eq!(h.spells_since(0).len(), KEEP_SPELLS);
        assert_eq!(h.blind_total(), Duration::from_secs(990));
    }
}
