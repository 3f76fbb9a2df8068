//! Follows a JSON stream from its start and prints every message, live, riding out
//! disconnects and server restarts.
//!
//! ```text
//! cargo run --release -- serve                              # a server on 127.0.0.1:4437
//! cargo run -p picomq-client --example follow -- demo       # follow the stream `demo`
//! cargo run -p picomq-client --example produce -- demo      # (elsewhere) write to it
//! ```
//!
//! `PICOMQ_URL` sets another server and `PICOMQ_TOKEN` a bearer token.

use futures::StreamExt;
use picomq_client::{CreateOptions, FollowOptions, Offset, PicoMq};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let name = std::env::args().nth(1).unwrap_or_else(|| "demo".into());
    let url = std::env::var("PICOMQ_URL").unwrap_or_else(|_| "http://127.0.0.1:4437".into());
    let mut builder = PicoMq::builder(&url);
    if let Ok(token) = std::env::var("PICOMQ_TOKEN") {
        builder = builder.token(token);
    }
    let mq = builder.build()?;
    let stream = mq.stream(&name);
    // Idempotent: an existing JSON stream is fine.
    stream.create(CreateOptions::json()).await?;

    let mut follow = stream.follow(Offset::start(), FollowOptions::default());
    while let Some(chunk) = follow.next().await {
        let chunk = chunk?;
        for message in chunk.messages::<serde_json::Value>()? {
            println!("{message}");
        }
        // A real consumer would store this to resume from after its own restart.
        eprintln!("(next offset {})", chunk.next_offset);
    }
    eprintln!("the stream was closed");
    Ok(())
}
