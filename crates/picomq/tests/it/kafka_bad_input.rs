//! Bad input on the Kafka listener: malformed, oversized and stalled frames,
//! unknown APIs and versions, damaged record batches and too many connections get
//! the protocol's error codes or a closed connection, never a crash or a hang,
//! and the server goes on serving.

use std::time::Duration;

use bytes::{BufMut, BytesMut};
use picomq_testkit as support;
use support::{free_port, Server, TempDir};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A request frame with a v1 header (api key, version, correlation id, client id).
fn frame(key: i16, version: i16, corr: i32, body: &[u8]) -> Vec<u8> {
    let mut b = BytesMut::new();
    b.put_i16(key);
    b.put_i16(version);
    b.put_i32(corr);
    b.put_i16(2);
    b.put_slice(b"it");
    b.put_slice(body);
    let mut out = (b.len() as i32).to_be_bytes().to_vec();
    out.extend_from_slice(&b);
    out
}

/// The next response frame, or `None` when the server closed the connection.
async fn response(s: &mut TcpStream) -> Option<Vec<u8>> {
    let mut len = [0u8; 4];
    let read = tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut len))
        .await
        .expect("the server neither answered nor closed within 10 s");
    read.ok()?;
    let mut body = vec![0; i32::from_be_bytes(len) as usize];
    s.read_exact(&mut body).await.ok()?;
    Some(body)
}

async fn closed(s: &mut TcpStream) -> bool {
    response(s).await.is_none()
}

/// ApiVersions v0 on a fresh connection: the server still serves.
async fn serves(addr: &str) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(&frame(18, 0, 7, &[])).await.unwrap();
    let r = response(&mut s).await.expect("an ApiVersions answer");
    assert_eq!(&r[0..4], &7i32.to_be_bytes(), "correlation id");
    assert_eq!(&r[4..6], &0i16.to_be_bytes(), "ApiVersions error code");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_kafka_requests_close_or_answer_with_errors() {
    let dir = TempDir::new("kafka-bad-input");
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    // The real binary, with its allocator (see main.rs: a lying array count in
    // a request must not abort the process).
    let server = Server::start_process(
        dir.path(),
        &[
            "--kafka-listen",
            &addr,
            "--kafka-max-request-bytes",
            "65536",
            "--kafka-request-read-timeout",
            "1s",
            "--kafka-max-connections",
            "8",
        ],
    )
    .await;
    serves(&addr).await;

    // An ApiVersions version the server does not know: error 35 in a v0 answer
    // that lists what it serves. (Its header is the flexible one: no tagged fields.)
    let mut s = TcpStream::connect(&addr).await.unwrap();
    s.write_all(&frame(18, 99, 1, &[0])).await.unwrap();
    let r = response(&mut s).await.expect("an answer");
    assert_eq!(&r[4..6], &35i16.to_be_bytes(), "UNSUPPORTED_VERSION");
    let listed = i32::from_be_bytes(r[6..10].try_into().unwrap());
    assert!(listed > 10, "{listed} APIs listed");
    drop(s);

    // Unknown API keys, unsupported versions of known ones: the connection closes.
    for (key, version) in [(999, 0), (-1, 0), (0, 2), (1, 3), (0, 99), (57, 0)] {
        let mut s = TcpStream::connect(&addr).await.unwrap();
        s.write_all(&frame(key, version, 1, &[])).await.unwrap();
        assert!(closed(&mut s).await, "api {key} v{version}");
    }

    // Frame lengths: negative, too short, over the limit.
    for len in [-5i32, 0, 3, 65537, i32::MAX] {
        let mut s = TcpStream::connect(&addr).await.unwrap();
        s.write_all(&len.to_be_bytes()).await.unwrap();
        assert!(closed(&mut s).await, "frame length {len}");
    }

    // A Metadata v1 body that lies about its array (a billion topics).
    let mut s = TcpStream::connect(&addr).await.unwrap();
    s.write_all(&frame(3, 1, 1, &1_000_000_000i32.to_be_bytes()))
        .await
        .unwrap();
    assert!(closed(&mut s).await, "lying Metadata body");
    // Truncated header: a client id longer than the frame.
    let mut s = TcpStream::connect(&addr).await.unwrap();
    s.write_all(&[0, 0, 0, 10, 0, 18, 0, 0, 0, 0, 0, 1, 0x7f, 0x7f])
        .await
        .unwrap();
    assert!(closed(&mut s).await, "truncated header");

    // A frame that stalls half way is cut off after --kafka-request-read-timeout.
    let mut s = TcpStream::connect(&addr).await.unwrap();
    s.write_all(&100i32.to_be_bytes()).await.unwrap();
    s.write_all(&[0; 10]).await.unwrap();
    let t0 = std::time::Instant::now();
    assert!(closed(&mut s).await, "stalled frame");
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());

    // A produce whose batch fails its CRC: CORRUPT_MESSAGE (2) for the partition,
    // the connection stays open; nothing is written.
    let topic = b"bad-crc";
    let created = server
        .client
        .put(
            "/bad-crc",
            &[("content-type", "application/octet-stream")],
            "",
        )
        .await
        .unwrap();
    assert_eq!(created.status.as_u16(), 201);
    let mut batch = BytesMut::new();
    picomq_kafka::batch::encode(
        &mut batch,
        &[picomq_kafka::batch::OutRecord {
            offset: 0,
            timestamp: 0,
            key: None,
            value: Some(b"v"),
            headers: &[],
        }],
    );
    let mut damaged = batch.to_vec();
    let last = damaged.len() - 1;
    damaged[last] ^= 0xff;
    for (records, want) in [(damaged, 2i16), (vec![1, 2, 3], 2)] {
        let mut body = BytesMut::new();
        body.put_i16(-1); // no transactional id
        body.put_i16(-1); // acks=all
        body.put_i32(5000);
        body.put_i32(1);
        body.put_i16(topic.len() as i16);
        body.put_slice(topic);
        body.put_i32(1);
        body.put_i32(0);
        body.put_i32(records.len() as i32);
        body.put_slice(&records);
        let mut s = TcpStream::connect(&addr).await.unwrap();
        s.write_all(&frame(0, 3, 9, &body)).await.unwrap();
        let r = response(&mut s).await.expect("a produce answer");
        // corr(4) topics(4) name(2+7) partitions(4) index(4) error(2)
        let at = 4 + 4 + 2 + topic.len() + 4 + 4;
        assert_eq!(
            i16::from_be_bytes([r[at], r[at + 1]]),
            want,
            "produce error code"
        );
        s.write_all(&frame(18, 0, 10, &[])).await.unwrap();
        assert!(
            response(&mut s).await.is_some(),
            "the connection stays open"
        );
    }
    let info = server
        .client
        .get("/__picomq/streams/bad-crc/info")
        .await
        .unwrap();
    let info: serde_json::Value = serde_json::from_slice(&info.body).unwrap();
    assert_eq!(info["next_seq"], 0, "{info}");

    // Past --kafka-max-connections, connections are refused.
    let mut held = Vec::new();
    for _ in 0..8 {
        let mut s = TcpStream::connect(&addr).await.unwrap();
        s.write_all(&frame(18, 0, 1, &[])).await.unwrap();
        assert!(response(&mut s).await.is_some());
        held.push(s);
    }
    let mut extra = TcpStream::connect(&addr).await.unwrap();
    let _ = extra.write_all(&frame(18, 0, 1, &[])).await;
    assert!(closed(&mut extra).await, "a ninth connection");
    drop(held);
    tokio::time::sleep(Duration::from_millis(200)).await;
    serves(&addr).await;
    // The HTTP side never noticed.
    let r = server.client.get("/readyz").await.unwrap();
    assert_eq!(r.status.as_u16(), 200);
}
