//! Ingest of job events needing no check with 1, 2 and 3 replicas of `gpusanity serve` on one
//! PostgreSQL and a 6-partition job-events topic (bench/replicas_bench.sh runs it).
//!
//! For each replica count: fresh topics, the replicas started and ready (each has partitions),
//! then EVENTS job events keyed by job id published at once; the figure is the events divided
//! by the time from the first CheckSkipped to the last, read back from every partition.

use std::time::{Duration, Instant};

use gpusanity_testkit::svc::bench::Replicas;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

const PARTITIONS: i32 = 6;

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().collect();
    let (Some(boot), Some(bin), Some(db)) = (args.get(1), args.get(2), args.get(3)) else {
        return Err("usage: replicas_bench BOOTSTRAP GPUSANITY_BIN POSTGRES_URL [EVENTS] [MAX_REPLICAS]".into());
    };
    let events: usize = args.get(4).map(|s| s.parse()).transpose()?.unwrap_or(20_000);
    let most: usize = args.get(5).map(|s| s.parse()).transpose()?.unwrap_or(3);
    for n in 1..=most {
        let rate = round(boot, bin, db, events, n)?;
        println!("  {n} replica(s): {rate:.0} events/s ({events} events, {PARTITIONS} partitions)");
    }
    Ok(())
}

/// One measurement with `n` replicas; events per second.
fn round(boot: &str, bin: &str, db: &str, events: usize, n: usize) -> Res<f64> {
    let tag = format!("rb{}x{n}", std::process::id());
    let p = format!("{tag}.");
    let replicas = Replicas::start(bin, boot, db, &tag, n, PARTITIONS, "")?;
    let producer: ThreadedProducer<DefaultProducerContext> =
        ClientConfig::new().set("bootstrap.servers", boot).set("linger.ms", "5").create()?;
    let jobs = format!("{p}job-events");
    for i in 0..events {
        let job = format!("skip-job-{i}");
        let ev = format!(
            r#"{{"version":1,"type":"JobResourcesAllocated","event_id":"{tag}-skip-{i}","job_id":"{job}","workspace_id":"ws","attempt":0,"framework":"PyTorch","nodes":[{{"name":"n","address":"127.0.0.1","gpus":1}}],"settings":{{"EnableSanityCheck":false,"SanityCheckArgs":""}}}}"#
        );
        while producer.send(BaseRecord::to(&jobs).key(&job).payload(&ev)).is_err() {
            producer.poll(Duration::from_millis(10));
        }
    }
    producer.flush(Duration::from_secs(60))?;
    let times = read_times(boot, &format!("{p}check-events"), events, Duration::from_secs(300))?;
    let (lo, hi) = (times.iter().min().copied().unwrap_or(0), times.iter().max().copied().unwrap_or(0));
    drop(replicas);
    Ok(events as f64 / ((hi - lo).max(1) as f64 / 1000.0))
}

/// The broker timestamps (ms) of the first `n` messages of every partition of `topic`.
fn read_times(boot: &str, topic: &str, n: usize, limit: Duration) -> Res<Vec<i64>> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", boot)
        .set("group.id", "replicas-bench-reader")
        .set("enable.auto.commit", "false")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        tpl.add_partition_offset(topic, p, Offset::Beginning)?;
    }
    c.assign(&tpl)?;
    let start = Instant::now();
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        if start.elapsed() > limit {
            return Err(format!("only {} of {n} messages on {topic} within {limit:?}", out.len()).into());
        }
        if let Some(m) = c.poll(Duration::from_millis(100)) {
            out.push(m?.timestamp().to_millis().unwrap_or(0));
        }
    }
    Ok(out)
}
