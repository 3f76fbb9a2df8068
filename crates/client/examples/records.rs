//! PicoMQ's native record API: appends records with headers and a client
//! timestamp, then reads them back by sequence number, by time and from the tail.
//!
//! ```text
//! cargo run --release -- serve                              # a server on 127.0.0.1:4437
//! cargo run -p picomq-client --example records -- orders-demo
//! ```
//!
//! `PICOMQ_URL` sets another server, `PICOMQ_TOKEN` a bearer token.

use picomq_client::{CreateOptions, NewRecord, PicoMq, ReadBounds, ReadFrom};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let name = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "orders-demo".into());
    let url = std::env::var("PICOMQ_URL").unwrap_or_else(|_| "http://127.0.0.1:4437".into());
    let mut builder = PicoMq::builder(&url);
    if let Ok(token) = std::env::var("PICOMQ_TOKEN") {
        builder = builder.token(token);
    }
    let mq = builder.build()?;
    let stream = mq.stream(&name);
    stream
        .create(CreateOptions::content_type("text/plain"))
        .await?;

    let info = stream.info().await?;
    let records = [
        NewRecord::text("order 1 created")
            .header("type", "created")
            .header("trace-id", "ab12"),
        NewRecord::text("order 1 paid").header("type", "paid"),
        NewRecord::bytes(vec![0u8, 1, 2, 255]).header("type", "binary"),
    ];
    // Only if nobody appended since `info`: a 412 (Reason::SeqMismatch) otherwise.
    let ack = stream.append_records(&records, Some(info.next_seq)).await?;
    println!(
        "appended seq {:?}..={:?} at {:?} ms",
        ack.first_seq, ack.last_seq, ack.first_timestamp
    );

    let since = ack.first_timestamp.unwrap_or(0);
    let by_time = stream
        .read_records(&ReadFrom::Timestamp(since), &ReadBounds::default())
        .await?;
    for r in &by_time.records {
        println!(
            "seq {} at {} [{}]: {:?}",
            r.seq,
            r.timestamp,
            r.header("type").unwrap_or("-"),
            r.body_str().unwrap_or("(binary)")
        );
    }

    let last = stream
        .read_records(&ReadFrom::Tail(1), &ReadBounds::count(1))
        .await?;
    println!(
        "the last record: seq {:?}",
        last.records.first().map(|r| r.seq)
    );
    Ok(())
}
