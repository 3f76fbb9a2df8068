//! The native record API (docs/native-api.md) against a real server: records with
//! sequence numbers, timestamps and headers on the same streams Durable Streams
//! clients read and write; reads by number, by time and from the tail, bounded by
//! count, bytes and time; conditional and exactly-once appends; trims by number;
//! reads by time in Durable Streams reads; and all of it across compaction, trims,
//! `kill -9` and a restart.

use picomq_testkit as support;

use std::time::Duration;

use base64::Engine as _;
use serde_json::{json, Value};
use support::{read_all, Client, Server, TempDir};

const JSON: &[(&str, &str)] = &[("content-type", "application/json")];
const BYTES: &[(&str, &str)] = &[("content-type", "application/octet-stream")];

fn body(r: &picomq_client::Response) -> Value {
    serde_json::from_slice(&r.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", r.text()))
}

fn records_path(stream: &str) -> String {
    format!("/__picomq/streams/{stream}/records")
}

async fn append(c: &Client, stream: &str, batch: Value) -> Value {
    let r = c
        .post(&records_path(stream), &[], batch.to_string())
        .await
        .unwrap();
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    body(&r)
}

async fn read(c: &Client, stream: &str, query: &str) -> Value {
    let r = c
        .get(&format!("{}?{query}", records_path(stream)))
        .await
        .unwrap();
    assert_eq!(r.status.as_u16(), 200, "{query}: {}", r.text());
    body(&r)
}

/// A records SSE of `stream` from `start` (`seq=0`, or "" for the first record).
async fn open_sse(c: &Client, stream: &str, start: &str) -> picomq_client::Streaming {
    let query = [start, "live=sse"].join("&");
    let path = format!("{}?{}", records_path(stream), query.trim_start_matches('&'));
    let sse = c
        .open(
            picomq_client::HttpMethod::GET,
            &path,
            &[],
            bytes::Bytes::new(),
        )
        .await
        .unwrap();
    assert_eq!(sse.status.as_u16(), 200, "{path}");
    sse
}

fn seqs(page: &Value) -> Vec<u64> {
    page["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["seq"].as_u64().unwrap())
        .collect()
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_written_through_one_api_read_through_the_other_byte_for_byte() {
    let dir = TempDir::new("native-both");
    let server = Server::start(dir.path(), &[]).await;
    let c = server.client.clone();
    // Bytes: every byte value, through Durable Streams, then natively.
    assert_eq!(c.put("/b", BYTES, "").await.unwrap().status.as_u16(), 201);
    let all: Vec<u8> = (0..=255u8).collect();
    assert_eq!(
        c.post("/b", BYTES, all.clone())
            .await
            .unwrap()
            .status
            .as_u16(),
        204
    );
    let native: Vec<u8> = (0..=255u8).rev().collect();
    let ack = append(
        &c,
        "b",
        json!({"records": [
            {"body_base64": b64(&native), "headers": [["trace", "t1"], ["trace", "t2"], ["type", "x"]], "timestamp": 42},
            {"body": "plain text"}
        ]}),
    )
    .await;
    assert_eq!(
        (ack["first_seq"].as_u64(), ack["last_seq"].as_u64()),
        (Some(1), Some(2)),
        "{ack}"
    );
    assert_eq!(ack["next_seq"], 3);
    assert_eq!(ack["duplicate"], false);
    let mut expected = all.clone();
    expected.extend(&native);
    expected.extend(b"plain text");
    assert_eq!(
        read_all(&c, "/b").await,
        expected,
        "Durable Streams sees the native bodies in order"
    );
    assert_eq!(
        ack["next_offset"],
        c.head("/b")
            .await
            .unwrap()
            .header("stream-next-offset")
            .unwrap()
    );

    let page = read(&c, "b", "seq=0").await;
    assert_eq!(seqs(&page), [0, 1, 2]);
    let r = &page["records"];
    assert_eq!(
        r[0]["body_base64"],
        b64(&all),
        "a Durable Streams append is one record"
    );
    assert_eq!(r[0]["headers"], json!([]));
    assert_eq!(r[1]["body_base64"], b64(&native));
    assert_eq!(
        r[1]["headers"],
        json!([["trace", "t1"], ["trace", "t2"], ["type", "x"]])
    );
    assert_eq!(r[1]["client_timestamp"], 42);
    assert_eq!(r[2]["body"], "plain text");
    assert!(r[2].get("client_timestamp").is_none());
    assert_eq!(page["up_to_date"], true);
    assert_eq!(page["next_seq"], 3);
    // Each record's offset is where a Durable Streams read returns it first.
    let from_second = c
        .get(&format!("/b?offset={}", r[1]["offset"].as_str().unwrap()))
        .await
        .unwrap();
    assert_eq!(from_second.body.to_vec(), expected[256..].to_vec());

    // JSON: a Durable Streams array is one record per message; native records are
    // messages to Durable Streams readers.
    assert_eq!(c.put("/j", JSON, "").await.unwrap().status.as_u16(), 201);
    c.post("/j", JSON, r#"[{"a":1},{"a":2}]"#).await.unwrap();
    append(
        &c,
        "j",
        json!({"records": [{"json": {"b": [1, 2]}}, {"body": "\"s\""}, {"json": [3]}]}),
    )
    .await;
    let ds: Value = serde_json::from_slice(&read_all(&c, "/j").await).unwrap();
    assert_eq!(ds, json!([{"a": 1}, {"a": 2}, {"b": [1, 2]}, "s", [3]]));
    let page = read(&c, "j", "seq=1&count=3").await;
    assert_eq!(seqs(&page), [1, 2, 3]);
    assert_eq!(page["records"][0]["body"], r#"{"a":2}"#);
    assert_eq!(page["records"][1]["body"], r#"{"b":[1,2]}"#);
    assert_eq!(
        (page["next_seq"].as_u64(), page["up_to_date"].as_bool()),
        (Some(4), Some(false))
    );
    // A read that stops inside a JSON batch resumes inside it.
    let page = read(&c, "j", "seq=0&count=1").await;
    assert_eq!(seqs(&page), [0]);
    let rest = read(&c, "j", "seq=1&count=1").await;
    assert_eq!(rest["records"][0]["body"], r#"{"a":2}"#);
    // Not one JSON value: refused, nothing written.
    let r = c
        .post(
            &records_path("j"),
            &[],
            json!({"records": [{"json": 1}, {"body": "{oops"}]}).to_string(),
        )
        .await
        .unwrap();
    assert_eq!(r.status.as_u16(), 400, "{}", r.text());
    assert!(r.text().contains("record 1"), "{}", r.text());
    let info = body(&c.get("/__picomq/streams/j/info").await.unwrap());
    assert_eq!(
        (
            info["first_seq"].as_u64(),
            info["next_seq"].as_u64(),
            info["records"].as_u64()
        ),
        (Some(0), Some(5), Some(5)),
        "{info}"
    );
    assert_eq!(info["content_type"], "application/json");
    assert_eq!(info["closed"], false);

    // A fork numbers its own records on from its source's at the fork point, and
    // reads its inherited ones with the source's numbers.
    let fork = c
        .put(
            "/f",
            &[
                ("content-type", "application/json"),
                ("stream-forked-from", "/j"),
            ],
            "",
        )
        .await
        .unwrap();
    assert_eq!(fork.status.as_u16(), 201, "{}", fork.text());
    let ack = append(&c, "f", json!({"records": [{"json": "mine"}]})).await;
    assert_eq!(ack["first_seq"], 5, "{ack}");
    let page = read(&c, "f", "seq=3").await;
    assert_eq!(seqs(&page), [3, 4, 5]);
    assert_eq!(page["records"][2]["body"], "\"mine\"");
    assert_eq!(read(&c, "f", "tail=1").await["records"][0]["seq"], 5);
    // Its metadata names its source and where its own records begin (the source's
    // tail when it was forked).
    let fork_info = body(&c.get("/__picomq/streams/f/info").await.unwrap());
    assert_eq!(fork_info["forked_from"]["stream"], "j", "{fork_info}");
    assert_eq!(fork_info["forked_from"]["seq"], 5, "{fork_info}");
    assert_eq!(
        fork_info["forked_from"]["offset"], info["next_offset"],
        "{fork_info}"
    );
    let r = c.get("/__picomq/streams/j/info").await.unwrap();
    assert!(body(&r).get("forked_from").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conditional_and_exactly_once_appends() {
    let dir = TempDir::new("native-cond");
    let server = Server::start(dir.path(), &[]).await;
    let c = server.client.clone();
    c.put("/s", BYTES, "").await.unwrap();
    append(&c, "s", json!({"records": [{"body": "a"}], "match_seq": 0})).await;
    let r = c
        .post(
            &records_path("s"),
            &[],
            json!({"records": [{"body": "b"}], "match_seq": 0}).to_string(),
        )
        .await
        .unwrap();
    assert_eq!(r.status.as_u16(), 412, "{}", r.text());
    let e = body(&r);
    assert_eq!(e["error"]["code"], "seq_mismatch");
    assert_eq!(e["error"]["next_seq"], 1);
    append(&c, "s", json!({"records": [{"body": "b"}], "match_seq": 1})).await;
    // Producer stamps: a retry is a duplicate, a gap is 409, nothing written twice.
    let stamp = |seq: &'static str| {
        [
            ("producer-id", "p1"),
            ("producer-epoch", "0"),
            ("producer-seq", seq),
        ]
    };
    let batch = json!({"records": [{"body": "c"}, {"body": "d"}]}).to_string();
    let first = c
        .post(&records_path("s"), &stamp("0"), batch.clone())
        .await
        .unwrap();
    assert_eq!(body(&first)["first_seq"], 2, "{}", first.text());
    let again = body(
        &c.post(&records_path("s"), &stamp("0"), batch.clone())
            .await
            .unwrap(),
    );
    assert_eq!(
        (again["duplicate"].as_bool(), again["next_seq"].as_u64()),
        (Some(true), Some(4)),
        "{again}"
    );
    let gap = c
        .post(&records_path("s"), &stamp("5"), batch)
        .await
        .unwrap();
    assert_eq!(gap.status.as_u16(), 409, "{}", gap.text());
    assert_eq!(read_all(&c, "/s").await, b"abcd");
}

/// Records in batches far enough apart in time that each batch has its own time.
async fn timed_batches(c: &Client, stream: &str, batches: usize, per: usize) -> Vec<u64> {
    let mut times = Vec::new();
    for b in 0..batches {
        let records: Vec<Value> = (0..per)
            .map(|i| json!({"body": format!("r{}", b * per + i)}))
            .collect();
        let ack = append(c, stream, json!({ "records": records })).await;
        times.push(ack["first_timestamp"].as_u64().unwrap());
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    times
}

/// Checks reads by number, time and tail of `s`, which holds `r{n}` as record `n`
/// for `first..next`, batches of `per` sharing the times in `times`.
async fn check_seeks(c: &Client, first: u64, next: u64, per: u64, times: &[u64]) {
    for n in [first, first + 1, (first + next) / 2, next - 1] {
        let page = read(c, "s", &format!("seq={n}&count=2")).await;
        assert_eq!(page["records"][0]["seq"], n, "seq={n}: {page}");
        assert_eq!(page["records"][0]["body"], format!("r{n}"));
    }
    for (b, t) in times.iter().enumerate() {
        let n = (b as u64 * per).max(first);
        if n >= next {
            continue;
        }
        let page = read(c, "s", &format!("timestamp={t}&count=1")).await;
        assert_eq!(
            page["records"][0]["seq"], n,
            "timestamp={t} (batch {b}): {page}"
        );
        assert!(page["records"][0]["timestamp"].as_u64().unwrap() >= *t);
        // Durable Streams reads by time start at the same record.
        let ds = c.get(&format!("/s?timestamp={t}")).await.unwrap();
        assert_eq!(ds.status.as_u16(), 200, "{}", ds.text());
        assert!(
            ds.text().starts_with(&format!("r{n}")),
            "DS timestamp={t}: {}",
            ds.text()
        );
        // `until` stops before the batch at `t`.
        if n > first {
            let page = read(c, "s", &format!("seq={first}&until={t}")).await;
            assert_eq!(
                page["records"].as_array().unwrap().len() as u64,
                n - first,
                "until={t}"
            );
            assert_eq!(
                (page["until_reached"].as_bool(), page["next_seq"].as_u64()),
                (Some(true), Some(n))
            );
        }
    }
    let tail = read(c, "s", "tail=3").await;
    assert_eq!(seqs(&tail), [next - 3, next - 2, next - 1]);
    let future = read(c, "s", "timestamp=9999999999999").await;
    assert_eq!(
        (
            future["records"].as_array().unwrap().len(),
            future["next_seq"].as_u64()
        ),
        (0, Some(next))
    );
    let gone = c
        .get(&format!(
            "{}?seq={}",
            records_path("s"),
            first.saturating_sub(1)
        ))
        .await
        .unwrap();
    if first > 0 {
        assert_eq!(gone.status.as_u16(), 410, "{}", gone.text());
        assert_eq!(body(&gone)["error"]["first_seq"], first);
    }
    let info = body(&c.get("/__picomq/streams/s/info").await.unwrap());
    assert_eq!(
        (info["first_seq"].as_u64(), info["next_seq"].as_u64()),
        (Some(first), Some(next)),
        "{info}"
    );
    assert_eq!(info["records"], next - first);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_by_number_and_time_hold_across_compaction_trims_and_kill_9() {
    let dir = TempDir::new("native-seek");
    // No tail cache and compaction on demand: seeks go through the index and the store.
    let flags = [
        "--tail-cache-bytes",
        "0",
        "--pack-delay",
        "0",
        "--compaction-interval",
        "0",
        "--compaction-delay",
        "0s",
    ];
    let mut server = Server::start_process(dir.path(), &flags).await;
    let c = server.client.clone();
    c.put("/s", BYTES, "").await.unwrap();
    let (batches, per) = (40usize, 5u64);
    let times = timed_batches(&c, "s", batches, per as usize).await;
    let next = batches as u64 * per;
    check_seeks(&c, 0, next, per, &times).await;

    let r = c.post("/__picomq/compact?delay=0s", &[], "").await.unwrap();
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    check_seeks(&c, 0, next, per, &times).await;

    // Trim inside a batch: numbers stay, reads below answer 410.
    let t = c
        .post("/__picomq/streams/s/trim?before_seq=52", &[], "")
        .await
        .unwrap();
    assert_eq!(t.status.as_u16(), 200, "{}", t.text());
    assert_eq!(body(&t)["first_seq"], 52);
    check_seeks(&c, 52, next, per, &times).await;
    let past = c
        .post(
            &format!("/__picomq/streams/s/trim?before_seq={}", next + 1),
            &[],
            "",
        )
        .await
        .unwrap();
    assert_eq!(past.status.as_u16(), 400, "{}", past.text());

    server.kill9();
    server.restart().await;
    let c = server.client.clone();
    check_seeks(&c, 52, next, per, &times).await;
    // Numbering goes on after the crash, and times never go back.
    let ack = append(&c, "s", json!({"records": [{"body": format!("r{next}")}]})).await;
    assert_eq!(ack["first_seq"], next);
    assert!(ack["first_timestamp"].as_u64().unwrap() >= *times.last().unwrap());
    let r = c.post("/__picomq/compact?delay=0s", &[], "").await.unwrap();
    assert_eq!(r.status.as_u16(), 200);
    check_seeks(&c, 52, next + 1, per, &times).await;
}

/// A reader paging by number starts each page where its last one ended (the server
/// remembers that point instead of seeking): pages must join up exactly, with the
/// same records, offsets and times as one whole read, also when a page ends inside
/// a Durable Streams batch, with two readers interleaved, and after trims.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paging_by_number_joins_up_across_batches_readers_and_trims() {
    let dir = TempDir::new("native-paging");
    // No tail cache: without the remembered points every page would seek the index.
    let server = Server::start(dir.path(), &["--tail-cache-bytes", "0"]).await;
    let c = server.client.clone();
    assert_eq!(c.put("/j", JSON, "").await.unwrap().status.as_u16(), 201);
    // 60 Durable Streams appends of 3 messages each: records 0..180.
    for b in 0..60 {
        let batch: Vec<Value> = (0..3).map(|i| json!({"n": b * 3 + i})).collect();
        let r = c
            .post("/j", JSON, Value::Array(batch).to_string())
            .await
            .unwrap();
        assert_eq!(r.status.as_u16(), 204, "{}", r.text());
    }
    let whole = read(&c, "j", "seq=0&count=1000").await;
    let whole = whole["records"].as_array().unwrap().clone();
    assert_eq!(whole.len(), 180);
    for (i, r) in whole.iter().enumerate() {
        assert_eq!(r["seq"], i as u64);
        assert_eq!(r["body"], format!("{{\"n\":{i}}}"));
    }

    // Two readers, pages of 7 and 11 (ending inside batches), interleaved.
    let (mut a, mut b) = (0u64, 0u64);
    let (mut got_a, mut got_b) = (Vec::new(), Vec::new());
    while a < 180 || b < 180 {
        for (at, got, count) in [(&mut a, &mut got_a, 7), (&mut b, &mut got_b, 11)] {
            if *at >= 180 {
                continue;
            }
            let page = read(&c, "j", &format!("seq={at}&count={count}")).await;
            got.extend(page["records"].as_array().unwrap().iter().cloned());
            *at = page["next_seq"].as_u64().unwrap();
            // The next page, asked for by offset, starts at the same record.
            if *at < 180 {
                let q = format!("offset={}&count=1", page["next_offset"].as_str().unwrap());
                assert_eq!(read(&c, "j", &q).await["records"][0]["seq"], *at);
            }
        }
    }
    assert_eq!(got_a, whole, "pages of 7");
    assert_eq!(got_b, whole, "pages of 11");

    // A page ends at record 40; a trim past it drops it: the next page is refused.
    let page = read(&c, "j", "seq=33&count=7").await;
    assert_eq!(page["next_seq"], 40);
    let t = c
        .post("/__picomq/streams/j/trim?before_seq=43", &[], "")
        .await
        .unwrap();
    assert_eq!(t.status.as_u16(), 200, "{}", t.text());
    let r = c
        .get(&format!("{}?seq=40", records_path("j")))
        .await
        .unwrap();
    assert_eq!(r.status.as_u16(), 410, "{}", r.text());
    assert_eq!(body(&r)["error"]["first_seq"], 43, "{}", r.text());
    // A page ending exactly at the new start still reads on from there.
    let page = read(&c, "j", "seq=43&count=7").await;
    assert_eq!(page["next_seq"], 50);
    let t = c
        .post("/__picomq/streams/j/trim?before_seq=50", &[], "")
        .await
        .unwrap();
    assert_eq!(t.status.as_u16(), 200, "{}", t.text());
    let page = read(&c, "j", "seq=50&count=3").await;
    assert_eq!(page["records"].as_array().unwrap(), &whole[50..53]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_poll_and_sse_follow_the_tail() {
    let dir = TempDir::new("native-live");
    let server = Server::start(dir.path(), &["--long-poll-timeout", "2s"]).await;
    let c = server.client.clone();
    c.put("/live", BYTES, "").await.unwrap();
    append(&c, "live", json!({"records": [{"body": "0"}]})).await;
    // Long-poll at the tail wakes on the append.
    let waiter = {
        let c = c.clone();
        tokio::spawn(async move { read(&c, "live", "seq=1&live=long-poll").await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    c.post("/live", BYTES, "1").await.unwrap();
    let page = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(seqs(&page), [1]);
    // Nothing comes: an empty page at the tail after the timeout.
    let idle = read(&c, "live", "seq=2&live=long-poll").await;
    assert_eq!(
        (
            idle["records"].as_array().unwrap().len(),
            idle["up_to_date"].as_bool()
        ),
        (0, Some(true))
    );

    // SSE: one `records` event per page, resumable by next_seq.
    let mut sse = open_sse(&c, "live", "seq=0").await;
    let mut parser = picomq_client::SseParser::default();
    let mut seen = Vec::new();
    let writer = {
        let c = c.clone();
        tokio::spawn(async move {
            for i in 2..6 {
                append(&c, "live", json!({"records": [{"body": i.to_string(), "headers": [["n", i.to_string()]]}]})).await;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            c.post("/live", &[("stream-closed", "true")], "")
                .await
                .unwrap();
        })
    };
    while let Some(chunk) = tokio::time::timeout(Duration::from_secs(10), sse.next_chunk())
        .await
        .unwrap()
    {
        for event in parser.feed(&chunk.unwrap()) {
            assert_eq!(event.event, "records");
            let page: Value = serde_json::from_str(&event.data).unwrap();
            seen.extend(seqs(&page));
            if page["closed"] == true {
                assert_eq!(page["next_seq"], 6);
            }
        }
    }
    writer.await.unwrap();
    assert_eq!(
        seen,
        [0, 1, 2, 3, 4, 5],
        "every record once, in order, then the end"
    );

    // An idle SSE gets a keep-alive comment every long-poll timeout, and no event.
    c.put("/quiet", BYTES, "").await.unwrap();
    let mut quiet = open_sse(&c, "quiet", "").await;
    let started = std::time::Instant::now();
    let chunk = tokio::time::timeout(Duration::from_secs(6), quiet.next_chunk())
        .await
        .expect("a keep-alive within the long-poll timeout")
        .unwrap()
        .unwrap();
    assert_eq!(&chunk[..], b": keep-alive\n\n");
    assert!(
        started.elapsed() >= Duration::from_millis(1500),
        "not before the timeout"
    );
    assert!(picomq_client::SseParser::default().feed(&chunk).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_a_clear_error() {
    let dir = TempDir::new("native-bad");
    let server = Server::start(dir.path(), &[]).await;
    let c = server.client.clone();
    c.put("/s", BYTES, "").await.unwrap();
    let post = |b: String| {
        let c = c.clone();
        async move { c.post(&records_path("s"), &[], b).await.unwrap() }
    };
    let many: Vec<Value> = (0..1001).map(|_| json!({"body": "x"})).collect();
    for (bad, why) in [
        ("not json".to_string(), "body must be"),
        (json!({"records": []}).to_string(), "1 to 1000 records"),
        (json!({ "records": many }).to_string(), "1 to 1000 records"),
        (
            json!({"records": [{"body": "x"}], "extra": 1}).to_string(),
            "unknown field",
        ),
        (
            json!({"records": [{"body": "x", "body_base64": "eA=="}]}).to_string(),
            "exactly one",
        ),
        (
            json!({"records": [{"body_base64": "%%%"}]}).to_string(),
            "not base64",
        ),
        (
            json!({"records": [{"body": "x", "headers": [["bad name", "v"]]}]}).to_string(),
            "header name",
        ),
        (
            json!({"records": [{"body": "x", "headers": [["a", 1]]}]}).to_string(),
            "body must be",
        ),
        (
            json!({"records": [{"body": "x"}], "match_seq": -1}).to_string(),
            "body must be",
        ),
    ] {
        let r = post(bad.clone()).await;
        assert_eq!(r.status.as_u16(), 400, "{bad}: {}", r.text());
        assert!(
            body(&r)["error"]["message"].as_str().unwrap().contains(why),
            "{bad}: {}",
            r.text()
        );
    }
    for (query, status) in [
        ("seq=1&tail=1", 400),
        ("count=0", 400),
        ("bytes=x", 400),
        ("timestamp=yesterday", 400),
        ("live=push", 400),
        ("nope=1", 400),
    ] {
        let r = c
            .get(&format!("{}?{query}", records_path("s")))
            .await
            .unwrap();
        assert_eq!(r.status.as_u16(), status, "{query}: {}", r.text());
        assert!(body(&r)["error"]["message"].is_string());
    }
    let missing = c.get(&records_path("none")).await.unwrap();
    assert_eq!(missing.status.as_u16(), 404, "{}", missing.text());
    let missing = c
        .post(
            &records_path("none"),
            &[],
            json!({"records": [{"body": "x"}]}).to_string(),
        )
        .await
        .unwrap();
    assert_eq!(missing.status.as_u16(), 404, "{}", missing.text());
    let wrong = c.delete(&records_path("s")).await.unwrap();
    assert_eq!(wrong.status.as_u16(), 405, "{}", wrong.text());
    let wrong = c.post("/__picomq/streams/s/info", &[], "").await.unwrap();
    assert_eq!(wrong.status.as_u16(), 405, "{}", wrong.text());
    let r = c.get("/s?timestamp=0&offset=-1").await.unwrap();
    assert_eq!(r.status.as_u16(), 400, "{}", r.text());
    // A read of an empty stream.
    let page = read(&c, "s", "").await;
    assert_eq!(
        (
            page["records"].as_array().unwrap().len(),
            page["next_seq"].as_u64(),
            page["up_to_date"].as_bool()
        ),
        (0, Some(0), Some(true))
    );
    let info = body(&c.get("/__picomq/streams/s/info").await.unwrap());
    assert_eq!(info["records"], 0);
    assert!(info.get("first_timestamp").is_none(), "{info}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_appends_and_reads_records() {
    let dir = TempDir::new("native-cli");
    let server = Server::start(dir.path(), &[]).await;
    let cli = support::cli::Cli::new(&server.url);
    assert_eq!(cli.run(&["create", "cli/r"]).await.code, 0);
    let lines: String = (0..2500).map(|i| format!("line {i}\n")).collect();
    let run = cli
        .run_with_stdin(
            &[
                "records", "append", "cli/r", "--header", "type=log", "--output", "json",
            ],
            lines.as_bytes(),
        )
        .await;
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(run.json(), json!({"first_seq": 0, "last_seq": 2499}));
    let run = cli
        .run(&[
            "records", "read", "cli/r", "--seq", "1234", "--limit", "2", "--output", "json",
        ])
        .await;
    assert_eq!(run.code, 0, "{run:?}");
    let got: Vec<Value> = run
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(got.len(), 2);
    assert_eq!(
        (got[0]["seq"].as_u64(), got[0]["body"].as_str()),
        (Some(1234), Some("line 1234"))
    );
    assert_eq!(got[1]["headers"], json!([["type", "log"]]));
    let all = cli.run(&["records", "read", "cli/r"]).await;
    assert_eq!(all.stdout.lines().count(), 2500, "a read pages to the tail");
    let tail = cli.run(&["records", "read", "cli/r", "--tail", "1"]).await;
    assert!(
        tail.stdout.starts_with("2499 ") && tail.stdout.trim_end().ends_with("type=log line 2499"),
        "{tail:?}"
    );
    let info = cli
        .run(&["records", "info", "cli/r", "--output", "json"])
        .await;
    assert_eq!(info.json()["records"], 2500);
    // Exit codes as for every command: 3 no such stream, 4 a failed condition, 2 bad input.
    assert_eq!(cli.run(&["records", "read", "cli/none"]).await.code, 3);
    assert_eq!(
        cli.run_with_stdin(&["records", "append", "cli/r", "--match-seq", "0"], b"x\n")
            .await
            .code,
        4
    );
    assert_eq!(
        cli.run(&["records", "read", "cli/r", "--timestamp", "soon"])
            .await
            .code,
        2
    );
}
