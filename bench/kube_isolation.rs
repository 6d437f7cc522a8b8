//! Time from a NodeIsolated event published on the output topic to gpusanity's taint visible on
//! the Node, through 1 and 3 replicas of `gpusanity serve` with the Kubernetes isolation backend
//! (bench/kube_isolation.sh runs it against scripts/kube-apiserver.sh, Kafka and PostgreSQL).
//!
//! For each replica count: fresh topics of 6 partitions, the replicas started and ready, a few
//! warm-up isolations until every replica's isolation consumer has its partitions; then, one at
//! a time, a Node is created, a NodeIsolated naming it is published (keyed by the node, so
//! spread over the partitions and replicas), and the Node is read every 10 ms until the taint
//! is there. p50 and p99 of those times.

use std::time::{Duration, Instant};

use gpusanity_common::wire::output::{OutputBody, OutputEvent};
use gpusanity_kube::TAINT_KEY;
use gpusanity_testkit::svc::bench::Replicas;
use gpusanity_testkit::svc::kube::{Cluster, KubeServer};
use rdkafka::config::ClientConfig;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

const PARTITIONS: i32 = 6;
const POLL: Duration = Duration::from_millis(10);

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().collect();
    let (Some(boot), Some(bin), Some(db), Some(kubeconfig)) = (args.get(1), args.get(2), args.get(3), args.get(4))
    else {
        return Err("usage: kube_isolation BOOTSTRAP GPUSANITY_BIN POSTGRES_URL KUBECONFIG [ISOLATIONS]".into());
    };
    let count: usize = args.get(5).map(|s| s.parse()).transpose()?.unwrap_or(50);
    let server = KubeServer { kubeconfig: kubeconfig.into(), limited_token: Default::default() };
    let cluster = Cluster::new(&server);
    for n in [1, 3] {
        let mut ms = round(boot, bin, db, &cluster, count, n)?;
        ms.sort_by(f64::total_cmp);
        let pct = |p: f64| ms[((ms.len() as f64 * p).ceil() as usize).clamp(1, ms.len()) - 1];
        println!(
            "  {n} replica(s): p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms ({} isolations, {PARTITIONS} partitions)",
            pct(0.5),
            pct(0.99),
            ms.last().copied().unwrap_or(0.0),
            ms.len()
        );
    }
    Ok(())
}

/// One measurement with `n` replicas; the times (ms) of `count` isolations.
fn round(boot: &str, bin: &str, db: &str, cluster: &Cluster, count: usize, n: usize) -> Res<Vec<f64>> {
    let tag = format!("kb{}x{n}", std::process::id());
    let isolation = format!(
        "[isolation]\nbackend = \"kubernetes\"\n[isolation.kubernetes]\nkubeconfig = \"{}\"\n\
         [isolation.kubernetes.breaker]\nmax_share = 1.0\nmin_nodes = 100000\n",
        cluster.kubeconfig.display()
    );
    let replicas = Replicas::start(bin, boot, db, &tag, n, PARTITIONS, &isolation)?;
    let producer: ThreadedProducer<DefaultProducerContext> =
        ClientConfig::new().set("bootstrap.servers", boot).set("linger.ms", "0").create()?;
    let topic = format!("{tag}.check-events");
    // Warm-up: every partition's consumer assigned (a rebalance among the replicas settles).
    for i in 0..3 * PARTITIONS as usize {
        isolate_one(cluster, &producer, &topic, &format!("{tag}-warm-{i}"), Duration::from_secs(60))?;
    }
    let mut times = Vec::with_capacity(count);
    for i in 0..count {
        times.push(isolate_one(cluster, &producer, &topic, &format!("{tag}-n{i}"), Duration::from_secs(30))?);
    }
    drop(replicas);
    Ok(times)
}

/// Creates Node `node`, publishes its NodeIsolated and reads the Node every 10 ms until the
/// taint shows; the time from just before the publish (ms).
fn isolate_one(
    cluster: &Cluster,
    producer: &ThreadedProducer<DefaultProducerContext>,
    topic: &str,
    node: &str,
    limit: Duration,
) -> Res<f64> {
    cluster.create(node, serde_json::json!({}));
    let ev = OutputEvent {
        version: 1,
        event_id: format!("{node}-iso"),
        job_id: format!("{node}-job"),
        workspace_id: "ws".into(),
        run_id: Some(format!("{node}-run")),
        cause_event_id: format!("{node}-cause"),
        at: chrono::Utc::now(),
        body: OutputBody::NodeIsolated {
            node: node.into(),
            codes: vec![gpusanity_common::findings::Code::GemmWrongResult],
            reason: "benchmark".into(),
            decision: None,
            gpus: Vec::new(),
        },
    };
    let payload = serde_json::to_vec(&ev)?;
    let t0 = Instant::now();
    producer.send(BaseRecord::to(topic).key(node).payload(&payload)).map_err(|(e, _)| e)?;
    producer.flush(Duration::from_secs(10))?;
    loop {
        let spec = cluster.get(node).spec.unwrap_or_default();
        if spec.taints.unwrap_or_default().iter().any(|t| t.key == TAINT_KEY) {
            return Ok(t0.elapsed().as_secs_f64() * 1000.0);
        }
        if t0.elapsed() > limit {
            return Err(format!("{node} was not tainted within {limit:?}").into());
        }
        std::thread::sleep(POLL);
    }
}
