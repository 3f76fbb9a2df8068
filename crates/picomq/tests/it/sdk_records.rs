//! The SDK's native record API (docs/native-api.md) against a real server: records
//! with headers and client timestamps, reads by sequence number, time and tail,
//! `match_seq` (412), producer-stamped duplicates, trims by sequence number (410
//! below the start), and `follow_records` riding out `kill -9` with every record
//! once, in sequence order.

use std::time::Duration;

use futures::StreamExt;
use picomq_client::records::{ProducerStamp, ReadBounds};
use picomq_client::{CreateOptions, FollowOptions, NewRecord, Offset, PicoMq, ReadFrom, Reason};
use picomq_testkit as support;
use support::{Server, TempDir};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_carry_headers_and_read_by_seq_time_and_tail() {
    let dir = TempDir::new("sdk-records");
    let server = Server::start(dir.path(), &[]).await;
    let mq = PicoMq::new(&server.url);
    let stream = mq.stream("orders");
    stream
        .create(CreateOptions::content_type("text/plain"))
        .await
        .unwrap();

    let first = stream
        .append_records(
            &[
                NewRecord::text("created")
                    .header("type", "created")
                    .header("trace-id", "ab12")
                    .header("type", "again"),
                NewRecord::bytes(vec![0u8, 1, 2, 255]).client_timestamp(1_764_813_600_000),
                NewRecord::text("paid"),
            ],
            None,
        )
        .await
        .unwrap();
    assert_eq!(
        (first.first_seq, first.last_seq, first.next_seq),
        (Some(0), Some(2), 3)
    );
    assert!(!first.duplicate);
    let t1 = first.first_timestamp.unwrap();
    assert_eq!(first.last_timestamp, Some(t1), "one append, one timestamp");

    tokio::time::sleep(Duration::from_millis(20)).await;
    let second = stream
        .append_records(&[NewRecord::text("shipped")], None)
        .await
        .unwrap();
    let t2 = second.first_timestamp.unwrap();
    assert!(t2 > t1);

    let all = stream
        .read_records(&ReadFrom::Start, &ReadBounds::default())
        .await
        .unwrap();
    assert_eq!(all.records.len(), 4);
    assert!(all.up_to_date);
    assert_eq!((all.next_seq, all.tail_seq), (4, 4));
    let r0 = &all.records[0];
    assert_eq!(
        r0.headers,
        vec![
            ("type".to_string(), "created".to_string()),
            ("trace-id".to_string(), "ab12".to_string()),
            ("type".to_string(), "again".to_string()),
        ],
        "headers keep their order and repeats"
    );
    assert_eq!(r0.header("TYPE"), Some("created"));
    assert_eq!(r0.body_str(), Some("created"));
    let r1 = &all.records[1];
    assert_eq!(
        &r1.body[..],
        &[0u8, 1, 2, 255][..],
        "binary bodies round-trip"
    );
    assert_eq!(r1.client_timestamp, Some(1_764_813_600_000));
    assert_eq!(r1.timestamp, t1, "reads by time use the server's timestamp");

    let from_seq = stream
        .read_records(&ReadFrom::Seq(2), &ReadBounds::count(1))
        .await
        .unwrap();
    assert_eq!(from_seq.records.len(), 1);
    assert_eq!(from_seq.records[0].body_str(), Some("paid"));
    assert_eq!(from_seq.next_seq, 3);
    assert!(!from_seq.up_to_date);

    let by_time = stream
        .read_records(&ReadFrom::Timestamp(t2), &ReadBounds::default())
        .await
        .unwrap();
    let seqs: Vec<u64> = by_time.records.iter().map(|r| r.seq).collect();
    assert_eq!(seqs, vec![3]);
    let until = stream
        .read_records(&ReadFrom::Timestamp(t1), &ReadBounds::default().until(t2))
        .await
        .unwrap();
    assert_eq!(until.records.len(), 3);
    assert!(until.until_reached);

    let tail = stream
        .read_records(&ReadFrom::Tail(2), &ReadBounds::default())
        .await
        .unwrap();
    let seqs: Vec<u64> = tail.records.iter().map(|r| r.seq).collect();
    assert_eq!(seqs, vec![2, 3]);

    // The same records through Durable Streams: their bodies, in order; and a
    // Durable Streams read by time starts at the second append.
    let (chunks, _) = stream.read_to_end().await.unwrap();
    let bytes: Vec<u8> = chunks.iter().flat_map(|c| c.data.to_vec()).collect();
    assert_eq!(bytes, b"created\x00\x01\x02\xffpaidshipped");
    let chunk = stream.read_from_time(t2).await.unwrap();
    assert_eq!(&chunk.data[..], b"shipped");
    // A record that starts its own append is first from its offset.
    let at_offset = stream
        .read_records(
            &ReadFrom::Offset(all.records[3].offset.clone()),
            &ReadBounds::count(1),
        )
        .await
        .unwrap();
    assert_eq!(at_offset.records[0].seq, 3);

    let info = stream.info().await.unwrap();
    assert_eq!((info.first_seq, info.next_seq, info.records), (0, 4, 4));
    assert_eq!(info.first_timestamp, Some(t1));
    assert_eq!(info.last_timestamp, Some(t2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conditional_and_stamped_appends_and_trims() {
    let dir = TempDir::new("sdk-records-rules");
    let server = Server::start(dir.path(), &[]).await;
    let mq = PicoMq::new(&server.url);
    let stream = mq.stream("events");
    stream.create(CreateOptions::json()).await.unwrap();
    let record = |n: u64| NewRecord::json(&serde_json::json!({ "n": n })).unwrap();

    stream.append_records(&[record(0)], Some(0)).await.unwrap();
    let err = stream
        .append_records(&[record(1)], Some(0))
        .await
        .unwrap_err();
    assert_eq!(err.status().map(|s| s.as_u16()), Some(412), "{err}");
    assert_eq!(
        err.reason(),
        Some(&Reason::SeqMismatch { next_seq: 1 }),
        "{err}"
    );

    let stamp = ProducerStamp {
        id: "rules".into(),
        epoch: 0,
        seq: 0,
    };
    let batch: Vec<NewRecord> = (1..10).map(record).collect();
    let once = stream
        .append_records_stamped(&batch, None, Some(&stamp))
        .await
        .unwrap();
    assert_eq!((once.first_seq, once.next_seq), (Some(1), 10));
    let again = stream
        .append_records_stamped(&batch, None, Some(&stamp))
        .await
        .unwrap();
    assert!(again.duplicate);
    assert_eq!((again.first_seq, again.next_seq), (None, 10));

    let trimmed = stream.trim_before_seq(5).await.unwrap();
    assert_eq!(trimmed.first_seq, Some(5));
    let info = stream.info().await.unwrap();
    assert_eq!((info.first_seq, info.records), (5, 5));
    let err = stream
        .read_records(&ReadFrom::Seq(2), &ReadBounds::default())
        .await
        .unwrap_err();
    assert!(
        matches!(
            err.reason(),
            Some(Reason::Gone {
                first_seq: Some(5),
                ..
            })
        ),
        "{err}"
    );
    let first = stream
        .read_records(&ReadFrom::Start, &ReadBounds::count(1))
        .await
        .unwrap();
    assert_eq!(first.records[0].seq, 5);
    assert_eq!(
        first.records[0].json::<serde_json::Value>().unwrap(),
        serde_json::json!({"n": 5})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follow_records_rides_out_kill_9_in_sequence_order() {
    let dir = TempDir::new("sdk-records-follow");
    let mut server = Server::start_process(dir.path(), &[]).await;
    let mq = PicoMq::new(&server.url);
    let stream = mq.stream("feed");
    stream
        .create(CreateOptions::content_type("text/plain"))
        .await
        .unwrap();

    let follower = {
        let stream = stream.clone();
        tokio::spawn(async move {
            let options = FollowOptions::default().retry_for(Duration::from_secs(60));
            let follow = stream.follow_records(ReadFrom::Start, ReadBounds::default(), options);
            follow
                .map(|r| r.expect("the follow recovers from every failure"))
                .collect::<Vec<_>>()
                .await
        })
    };
    const BATCHES: u64 = 30;
    const PER_BATCH: u64 = 10;
    for b in 0..BATCHES {
        if b == 10 || b == 20 {
            server.restart().await; // kill -9, then start on the same port and data
        }
        let records: Vec<NewRecord> = (0..PER_BATCH)
            .map(|i| {
                NewRecord::text(format!("{}", b * PER_BATCH + i)).header("batch", b.to_string())
            })
            .collect();
        // Stamped, so a retry after a lost answer is not written twice.
        let stamp = ProducerStamp {
            id: "feed-writer".into(),
            epoch: 0,
            seq: b,
        };
        let mut tries = 0;
        loop {
            match stream
                .append_records_stamped(&records, None, Some(&stamp))
                .await
            {
                Ok(_) => break,
                Err(e) if e.is_retryable() && tries < 100 => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("append batch {b}: {e}"),
            }
        }
    }
    stream.close().await.unwrap();
    let seen = tokio::time::timeout(Duration::from_secs(60), follower)
        .await
        .expect("the follow ends once the stream is closed")
        .unwrap();
    let seqs: Vec<u64> = seen.iter().map(|r| r.seq).collect();
    assert_eq!(seqs, (0..BATCHES * PER_BATCH).collect::<Vec<u64>>());
    for r in &seen {
        assert_eq!(r.body_str(), Some(r.seq.to_string().as_str()));
        assert_eq!(
            r.header("batch"),
            Some((r.seq / PER_BATCH).to_string().as_str())
        );
    }
    let last = stream
        .read_records(&ReadFrom::Offset(Offset::start()), &ReadBounds::count(1))
        .await
        .unwrap();
    assert_eq!(last.records[0].seq, 0);
}
