//! The outbox's guarantee against a crash between Kafka's acknowledgement and the `sent` mark:
//! at start-up the publisher finds the event already on the topic and does not send it again.

use gpusanity_testkit::svc;

use std::sync::Arc;
use std::time::Duration;

use gpusanity_bus::kafka;
use gpusanity_common::wire::output::OutputBody;
use gpusanity_db::{outbox, Db};
use gpusanity_ingest::consume::output_event;
use gpusanity_service::outbox::lease::Keeper;
use gpusanity_service::outbox::Publisher;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::FutureRecord;

#[test]
fn an_event_sent_before_a_crash_is_marked_not_sent_again() {
    let w = svc::World::new(None, "");
    let topic = w.topic("check-events");
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let conn = kafka::KafkaConn::plain(svc::broker());
    rt.block_on(async {
        let db = Db::connect(&w.db_url).await.unwrap();
        kafka::ensure_topics(&conn, &[&topic], &kafka::TopicSpec::default()).await.unwrap();
        let events: Vec<_> = (0..3)
            .map(|i| {
                output_event(
                    &format!("job-{i}"),
                    "ws",
                    None,
                    &format!("cause-{i}"),
                    OutputBody::CheckSkipped { reason: "test".into() },
                )
            })
            .collect();
        let mut tx = db.begin().await.unwrap();
        for e in &events {
            outbox::enqueue(&mut tx, &topic, e).await.unwrap();
        }
        tx.commit().await.unwrap();
        // The crash: the first event reached Kafka, its row was never marked sent.
        let producer = kafka::producer(&conn).unwrap();
        let payload = serde_json::to_string(&events[0]).unwrap();
        let rec = FutureRecord::to(&topic).key(&events[0].job_id).payload(&payload).headers(
            OwnedHeaders::new().insert(Header { key: "event_id", value: Some(events[0].event_id.as_bytes()) }),
        );
        producer.send(rec, Duration::from_secs(10)).await.map_err(|(e, _)| e).unwrap();
        assert_eq!(db.unsent(100).await.unwrap().len(), 3);

        let keeper = Keeper::new(db.clone(), "test".into(), Duration::from_secs(10));
        assert!(keeper.renew().await, "the publisher's lease was free");
        let wake = Arc::new(tokio::sync::Notify::new());
        let publisher = Publisher { db: db.clone(), producer, kafka: conn.clone(), wake, keeper };
        assert_eq!(publisher.recover().await.unwrap(), 1, "the event already on the topic was not found");
        let left: Vec<String> = db.unsent(100).await.unwrap().into_iter().map(|r| r.event_id).collect();
        assert_eq!(left, [events[1].event_id.clone(), events[2].event_id.clone()]);
        let _ = tokio::time::timeout(Duration::from_secs(3), publisher.run()).await;
        assert!(db.unsent(100).await.unwrap().is_empty());
    });
    let mut reader = svc::Reader::new(&topic);
    reader.drain(Duration::from_secs(3));
    let ids: Vec<&str> = reader.seen.iter().filter_map(|v| v["event_id"].as_str()).collect();
    assert_eq!(ids.len(), 3, "{:#?}", reader.seen);
    let unique: std::collections::HashSet<&&str> = ids.iter().collect();
    assert_eq!(unique.len(), 3, "an event was sent twice: {ids:?}");
}
