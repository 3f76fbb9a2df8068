//! Writes 100,000 small JSON messages to a stream with an idempotent producer
//! (batched, pipelined, retried with exactly-once stamps) and prints the rate.
//!
//! ```text
//! cargo run --release -- serve                                  # a server on 127.0.0.1:4437
//! cargo run --release -p picomq-client --example produce -- demo 100000
//! ```
//!
//! Kill the server (`kill -9`) and start it again while this runs: every message
//! still lands exactly once. `PICOMQ_URL` sets another server, `PICOMQ_TOKEN` a
//! bearer token.

use std::time::Instant;

use picomq_client::{CreateOptions, PicoMq, ProducerConfig};

#[derive(serde::Serialize)]
struct Reading {
    n: u64,
    sensor: &'static str,
    celsius: f64,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let name = args.next().unwrap_or_else(|| "demo".into());
    let count: u64 = args
        .next()
        .map(|n| n.parse())
        .transpose()?
        .unwrap_or(100_000);
    let url = std::env::var("PICOMQ_URL").unwrap_or_else(|_| "http://127.0.0.1:4437".into());
    let mut builder = PicoMq::builder(&url);
    if let Ok(token) = std::env::var("PICOMQ_TOKEN") {
        builder = builder.token(token);
    }
    let mq = builder.build()?;
    let stream = mq.stream(&name);
    stream.create(CreateOptions::json()).await?;

    let config = ProducerConfig::new(format!("produce-example-{}", std::process::id()))
        .batch_records_max(5_000)
        .in_flight_max(4);
    let producer = stream.producer(config).await?;
    let started = Instant::now();
    for n in 0..count {
        let celsius = 20.0 + (n % 100) as f64 / 10.0;
        producer
            .send_json(&Reading {
                n,
                sensor: "hall",
                celsius,
            })
            .await?;
    }
    let stats = producer.close().await?;
    let secs = started.elapsed().as_secs_f64();
    println!(
        "{} messages in {secs:.2} s: {:.0} messages/s ({} batches, {} retried, {} duplicates)",
        stats.records_acked,
        stats.records_acked as f64 / secs,
        stats.batches_acked,
        stats.failures + stats.gaps,
        stats.duplicates,
    );
    Ok(())
}
