//! Ingest of job events needing no check with 1, 2 and 3 replicas of `gpusanity serve` on one
//! PostgreSQL and a 6-partition job-events topic (bench/replicas_bench.sh runs it).
//!
//! For each replica count: fresh topics, the replicas started and ready (each has partitions),
//! then EVENTS job events keyed by job id published at once; the figure is the events divided
//! by the time from the first CheckSkipped to the last, read back from every partition.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

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
    let dir = std::env::temp_dir().join(format!("gpusanity-{tag}"));
    std::fs::create_dir_all(&dir)?;
    let keys = dir.join("agent-keys.toml");
    gpusanity_testkit::svc::write_agent_keys(&keys);
    let p = format!("{tag}.");
    let mut procs = Vec::new();
    let mut ports = Vec::new();
    for i in 0..n {
        let port = free_port()?;
        let config = dir.join(format!("replica-{i}.toml"));
        std::fs::write(
            &config,
            format!(
                "[kafka]\nbootstrap = \"{boot}\"\ngroup = \"{p}service\"\npartitions = {PARTITIONS}\n[topics]\njob_events = \"{p}job-events\"\n\
                 output = \"{p}check-events\"\ndead_letter = \"{p}dead-letter\"\nagent_tasks = \"{p}agent-tasks\"\nagent_reports = \"{p}agent-reports\"\n\
                 [database]\nurl = \"{db}\"\n[http]\nlisten = \"127.0.0.1:{port}\"\ntoken = \"bench-token-0123456789\"\n\
                 [agent_auth]\nkeys_file = \"{}\"\n[replica]\nid = \"{tag}-r{i}\"\n",
                keys.display()
            ),
        )?;
        let log = std::fs::File::create(dir.join(format!("replica-{i}.log")))?;
        procs.push(Procs(
            Command::new(bin)
                .args(["serve", "--config"])
                .arg(&config)
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .spawn()?,
        ));
        ports.push(port);
    }
    // Ready: each replica has partitions of the job-events topic.
    let start = Instant::now();
    for port in &ports {
        while get_status(*port, "/ready") != Some(200) {
            if start.elapsed() > Duration::from_secs(120) {
                return Err(format!("a replica never became ready (logs in {})", dir.display()).into());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
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
    drop(procs);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(events as f64 / ((hi - lo).max(1) as f64 / 1000.0))
}

/// A process ended by SIGTERM (then SIGKILL) when dropped.
struct Procs(Child);

impl Drop for Procs {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.0.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let end = Instant::now() + Duration::from_secs(10);
        while Instant::now() < end {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> Res<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn get_status(port: u16, path: &str) -> Option<u16> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").ok()?;
    let mut resp = String::new();
    s.read_to_string(&mut resp).ok()?;
    resp.split(' ').nth(1).and_then(|c| c.parse().ok())
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
