//! The typed Rust SDK (`picomq_client::PicoMq`) against a real server: the Durable
//! Streams parts round-trip (create, append, read, follow, close, delete), a follow
//! rides out `kill -9` and restarts with nothing lost or repeated, the idempotent
//! producer writes a million records from 8 producers exactly once and in order
//! while the server is killed twice, and the consumer-group and pull-wake
//! subscription helpers work end to end. The native record API is `sdk_records`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use picomq_client::groups::GroupOptions;
use picomq_client::subscriptions::SubscriptionConfig;
use picomq_client::{CreateOptions, Error, FollowOptions, Offset, PicoMq, ProducerConfig, Reason};
use picomq_testkit as support;
use serde::Deserialize;
use serde_json::{json, Value};
use support::{eventually, Server, TempDir};

fn sdk(server: &Server) -> PicoMq {
    PicoMq::new(&server.url)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_round_trip_through_the_sdk() {
    let dir = TempDir::new("sdk-round-trip");
    let server = Server::start(dir.path(), &[]).await;
    let mq = sdk(&server);

    let orders = mq.stream("sdk/orders");
    let created = orders.create(CreateOptions::json()).await.unwrap();
    assert!(created.created);
    assert!(
        !orders.create(CreateOptions::json()).await.unwrap().created,
        "a second create of the same stream is idempotent"
    );
    orders.append_json(&json!({"id": 1})).await.unwrap();
    orders.append_json(&json!([1, 2])).await.unwrap();
    let ack = orders
        .append_json_batch(&[json!({"id": 2}), json!({"id": 3})])
        .await
        .unwrap();
    let meta = orders.head().await.unwrap();
    assert_eq!(Some(meta.next_offset), ack.next_offset);
    assert!(!meta.closed);

    let chunk = orders.read(&Offset::start()).await.unwrap();
    assert!(chunk.up_to_date && chunk.json);
    let messages: Vec<Value> = chunk.messages().unwrap();
    assert_eq!(
        messages,
        vec![
            json!({"id": 1}),
            json!([1, 2]),
            json!({"id": 2}),
            json!({"id": 3})
        ],
        "append_json keeps an array as one message"
    );
    let rest = orders.read(&chunk.next_offset).await.unwrap();
    assert!(rest.is_empty() && rest.up_to_date);

    // A follow from the start sees everything, then what comes live, and ends
    // when the stream is closed.
    let mut follow = orders.follow(Offset::start(), FollowOptions::default());
    let first = follow.next().await.unwrap().unwrap();
    assert_eq!(first.messages::<Value>().unwrap().len(), 4);
    let writer = orders.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        writer.append_json(&json!({"id": 4})).await.unwrap();
        writer.close().await.unwrap();
    });
    let live = follow.next().await.unwrap().unwrap();
    assert_eq!(live.messages::<Value>().unwrap(), vec![json!({"id": 4})]);
    assert!(
        follow.next().await.is_none(),
        "a follow ends at a closed stream's end"
    );
    let err = orders.append_json(&json!({"id": 5})).await.unwrap_err();
    assert!(
        matches!(err.reason(), Some(Reason::StreamClosed { .. })),
        "{err}"
    );

    // Byte streams take and return bytes as they are.
    let bytes = mq.stream("sdk/bytes");
    bytes.create(CreateOptions::bytes()).await.unwrap();
    bytes.append(&b"ab\x00"[..]).await.unwrap();
    bytes.append(&b"\xffcd"[..]).await.unwrap();
    let (chunks, _) = bytes.read_to_end().await.unwrap();
    let all: Vec<u8> = chunks.iter().flat_map(|c| c.data.to_vec()).collect();
    assert_eq!(all, b"ab\x00\xffcd");

    bytes.delete().await.unwrap();
    let err = bytes.head().await.unwrap_err();
    assert_eq!(err.reason(), Some(&Reason::NotFound), "{err}");
    assert_eq!(err.status().map(|s| s.as_u16()), Some(404));
}

#[derive(Deserialize, Debug, PartialEq)]
struct Counted {
    p: u64,
    n: u64,
}

/// One producer's records, `{"p":P,"n":N}`.
fn counted(p: u64, n: u64) -> bytes::Bytes {
    format!("{{\"p\":{p},\"n\":{n}}}").into()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follow_rides_out_kill_9_without_loss_or_repeats() {
    let dir = TempDir::new("sdk-follow-restart");
    let mut server = Server::start_process(dir.path(), &[]).await;
    let mq = sdk(&server);
    let stream = mq.stream("live");
    stream.create(CreateOptions::json()).await.unwrap();

    let follower = {
        let stream = stream.clone();
        tokio::spawn(async move {
            let mut seen = Vec::new();
            let options = FollowOptions::default().retry_for(Duration::from_secs(60));
            let mut follow = stream.follow(Offset::start(), options);
            while let Some(chunk) = follow.next().await {
                let chunk = chunk.expect("the follow recovers from every failure");
                seen.extend(chunk.messages::<Counted>().unwrap());
            }
            seen
        })
    };
    const TOTAL: u64 = 3_000;
    let sent = Arc::new(AtomicU64::new(0));
    let writer = {
        let (stream, sent) = (stream.clone(), sent.clone());
        tokio::spawn(async move {
            let config = ProducerConfig::new("follow-writer")
                .batch_records_max(20)
                .linger(Duration::from_millis(1));
            let producer = stream.producer(config).await.unwrap();
            for n in 0..TOTAL {
                producer.send(counted(0, n)).await.unwrap();
                sent.store(n + 1, Ordering::Relaxed);
                if n % 10 == 0 {
                    tokio::time::sleep(Duration::from_millis(3)).await;
                }
            }
            producer.close().await.unwrap()
        })
    };
    for at in [TOTAL / 3, 2 * TOTAL / 3] {
        eventually(Duration::from_secs(60), || async {
            (sent.load(Ordering::Relaxed) >= at).then_some(())
        })
        .await;
        server.restart().await; // kill -9, then start on the same port and data
    }
    let stats = writer.await.unwrap();
    assert_eq!(stats.records_acked, TOTAL);
    stream.close().await.unwrap();
    let seen = tokio::time::timeout(Duration::from_secs(60), follower)
        .await
        .expect("the follow ends once the stream is closed")
        .unwrap();
    let expected: Vec<Counted> = (0..TOTAL).map(|n| Counted { p: 0, n }).collect();
    assert_eq!(seen.len(), expected.len(), "writer: {stats:?}");
    assert!(seen == expected, "every record once, in order");
}

/// The test: 1,000,000 records from 8 producers to one stream while the
/// server is killed with `kill -9` twice; afterwards every record is there exactly
/// once, in order per producer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_producers_write_a_million_records_exactly_once_through_two_kill_9s() {
    const PRODUCERS: u64 = 8;
    const PER_PRODUCER: u64 = 125_000;
    const TOTAL: u64 = PRODUCERS * PER_PRODUCER;
    let dir = TempDir::new("sdk-million");
    let mut server = Server::start_process(dir.path(), &[]).await;
    let mq = sdk(&server);
    let stream = mq.stream("million");
    stream.create(CreateOptions::json()).await.unwrap();

    let sent = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for p in 0..PRODUCERS {
        let (stream, sent) = (stream.clone(), sent.clone());
        tasks.push(tokio::spawn(async move {
            let config = ProducerConfig::new(format!("million-{p}"))
                .batch_records_max(10_000)
                .batch_bytes_max(1 << 20)
                .in_flight_max(4)
                .queue_records_max(20_000);
            let producer = stream.producer(config).await.unwrap();
            for n in 0..PER_PRODUCER {
                producer.send(counted(p, n)).await.unwrap();
                if n % 1_000 == 999 {
                    sent.fetch_add(1_000, Ordering::Relaxed);
                }
            }
            producer.close().await.unwrap()
        }));
    }
    let mut kills = Vec::new();
    for at in [TOTAL * 3 / 10, TOTAL * 65 / 100] {
        eventually(Duration::from_secs(120), || async {
            (sent.load(Ordering::Relaxed) >= at).then_some(())
        })
        .await;
        let down = Instant::now();
        server.restart().await; // kill -9, then start on the same port and data
        kills.push(down.elapsed());
    }
    let mut stats = Vec::new();
    for t in tasks {
        stats.push(t.await.unwrap());
    }
    let elapsed = started.elapsed();
    let acked: u64 = stats.iter().map(|s| s.records_acked).sum();
    assert_eq!(acked, TOTAL);
    println!(
        "sdk producer: {TOTAL} records from {PRODUCERS} producers in {:.2} s = {:.0} records/s \
         (two kill -9 restarts of {:?}); per producer: {stats:?}",
        elapsed.as_secs_f64(),
        TOTAL as f64 / elapsed.as_secs_f64(),
        kills,
    );

    // Every record exactly once, and in order per producer.
    let (chunks, _) = stream.read_to_end().await.unwrap();
    let mut next: BTreeMap<u64, u64> = BTreeMap::new();
    let mut total = 0u64;
    for chunk in &chunks {
        for m in chunk.messages::<Counted>().unwrap() {
            let expected = next.entry(m.p).or_insert(0);
            assert_eq!(
                m.n, *expected,
                "producer {}: record out of order or repeated",
                m.p
            );
            *expected += 1;
            total += 1;
        }
    }
    assert_eq!(total, TOTAL);
    assert_eq!(next.len() as u64, PRODUCERS);
    assert!(next.values().all(|n| *n == PER_PRODUCER));
}

/// A stale epoch is fenced: the newer producer with the same id wins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_with_an_older_epoch_is_fenced() {
    let dir = TempDir::new("sdk-fenced");
    let server = Server::start(dir.path(), &[]).await;
    let stream = sdk(&server).stream("fenced");
    stream.create(CreateOptions::json()).await.unwrap();
    let newer = stream
        .producer(ProducerConfig::new("worker").epoch(2))
        .await
        .unwrap();
    newer.send_json(&json!({"from": "newer"})).await.unwrap();
    newer.close().await.unwrap();

    let older = stream
        .producer(ProducerConfig::new("worker").epoch(1))
        .await
        .unwrap();
    older.send_json(&json!({"from": "older"})).await.unwrap();
    let err = older.close().await.unwrap_err();
    assert_eq!(
        err.reason(),
        Some(&Reason::StaleEpoch { server_epoch: 2 }),
        "{err}"
    );
    let chunk = stream.read(&Offset::start()).await.unwrap();
    assert_eq!(
        chunk.messages::<Value>().unwrap(),
        vec![json!({"from": "newer"})]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_group_helpers_claim_ack_and_nack() {
    let dir = TempDir::new("sdk-groups");
    let server = Server::start(dir.path(), &[]).await;
    let mq = sdk(&server);
    let jobs = mq.stream("jobs");
    jobs.create(CreateOptions::json()).await.unwrap();
    let batch: Vec<Value> = (0..10).map(|n| json!({"n": n})).collect();
    jobs.append_json_batch(&batch).await.unwrap();

    let group = mq.group("workers");
    let info = group
        .create(
            &GroupOptions::new("jobs")
                .lease(Duration::from_secs(5))
                .max_deliveries(3),
        )
        .await
        .unwrap();
    assert_eq!(info.stream, "jobs");
    let claimed = group.claim("c1", 4, Duration::from_secs(1)).await.unwrap();
    assert_eq!(claimed.messages.len(), 4);
    assert_eq!(claimed.messages[0].json, Some(json!({"n": 0})));
    let ids: Vec<Offset> = claimed.messages.iter().map(|m| m.id.clone()).collect();
    assert_eq!(group.ack(&ids[..3]).await.unwrap(), 3);
    assert_eq!(group.nack(&ids[3..], Duration::ZERO).await.unwrap(), 1);

    // The stream helper hands the nacked message out again, then the rest.
    let mut messages = group.messages(
        "c2",
        10,
        Duration::from_millis(500),
        FollowOptions::default(),
    );
    let mut ns = Vec::new();
    while ns.len() < 7 {
        let m = messages.next().await.unwrap().unwrap();
        ns.push(m.json.as_ref().unwrap()["n"].as_u64().unwrap());
        group.ack(&[m.id]).await.unwrap();
    }
    ns.sort();
    assert_eq!(ns, (3..10).collect::<Vec<u64>>());
    let info = group.info().await.unwrap();
    assert_eq!((info.acked, info.in_flight, info.pending), (10, 0, 0));
    assert_eq!(info.redeliveries, 1);
    group.delete().await.unwrap();
    let err = group.info().await.unwrap_err();
    assert_eq!(err.code(), Some("group_not_found"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pull_wake_subscription_helpers_claim_and_ack() {
    let dir = TempDir::new("sdk-subscriptions");
    let server = Server::start(dir.path(), &[]).await;
    let mq = sdk(&server);
    mq.stream("s/wake/pool")
        .create(CreateOptions::json())
        .await
        .unwrap();
    let sub = mq.subscription_under("s", "jobs");
    let info = sub
        .create(
            &SubscriptionConfig::pull_wake("wake/pool")
                .stream("jobs/a")
                .lease(Duration::from_secs(5)),
        )
        .await
        .unwrap();
    assert_eq!(info.kind, "pull-wake");
    let jobs = mq.stream("s/jobs/a");
    jobs.create(CreateOptions::json()).await.unwrap();
    let ack = jobs.append_json(&json!({"job": 1})).await.unwrap();

    let wake = eventually(Duration::from_secs(10), || async {
        sub.claim("w1").await.ok()
    })
    .await;
    let link = wake
        .streams
        .iter()
        .find(|s| s.path == "jobs/a")
        .expect("the claim names the linked stream");
    assert_eq!(link.has_pending, Some(true));
    let err = sub.claim("w2").await.unwrap_err();
    assert_eq!(err.code(), Some("ALREADY_CLAIMED"), "{err}");
    // A heartbeat, then the ack of what was read; nothing is left pending.
    sub.ack(&wake, &[], false).await.unwrap();
    let tail = ack.next_offset.unwrap();
    let done = sub.ack(&wake, &[("jobs/a", &tail)], true).await.unwrap();
    assert!(!done.next_wake);
    let err = sub.ack(&wake, &[], true).await.unwrap_err();
    assert_eq!(err.code(), Some("FENCED"), "{err}");
    let err = sub.claim("w2").await.unwrap_err();
    assert_eq!(err.code(), Some("NO_PENDING_WORK"), "{err}");
    sub.delete().await.unwrap();
    assert!(matches!(sub.get().await, Err(Error::Api(e)) if e.status.as_u16() == 404));
}
