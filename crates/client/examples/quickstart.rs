//! The README's example: create a stream, produce exactly once, append a record
//! with a header, and follow every record from an hour ago on.
//!
//! ```sh
//! cargo run --release -- serve &
//! cargo run --release -p picomq-client --example quickstart
//! ```

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use picomq_client::{CreateOptions, FollowOptions, NewRecord, PicoMq, ProducerConfig, ReadFrom};
use serde_json::json;

// An application reads the wall clock (the server's own code goes through its Clock).
#[allow(clippy::disallowed_methods)]
#[tokio::main]
async fn main() -> Result<(), picomq_client::Error> {
    let mq = PicoMq::new("http://127.0.0.1:4437");
    let orders = mq.stream("orders");
    orders.create(CreateOptions::json()).await?;
    // Batched, pipelined, retried with exactly-once stamps.
    let producer = orders.producer(ProducerConfig::new("checkout-1")).await?;
    producer.send_json(&json!({"id": 1})).await?;
    producer.close().await?;
    let record = NewRecord::json(&json!({"id": 2}))?.header("type", "created");
    orders.append_records(&[record], None).await?;
    // Every record from an hour ago on, then new ones as they come, across restarts.
    let hour_ago = SystemTime::now() - Duration::from_secs(3600);
    let ms = hour_ago.duration_since(UNIX_EPOCH).unwrap().as_millis() as u64;
    let from = ReadFrom::Timestamp(ms);
    let mut records = orders.follow_records(from, Default::default(), FollowOptions::default());
    while let Some(record) = records.next().await {
        let record = record?;
        println!("#{} at {}: {:?}", record.seq, record.timestamp, record.body);
    }
    Ok(())
}
