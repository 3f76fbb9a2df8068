//! The Rust client of PicoMQ, for PicoMQ and for any Durable Streams server.
//!
//! Two layers:
//!
//! - **The typed SDK**, from [`PicoMq`]: a [`DurableStream`] to create, append to,
//!   read and [follow](DurableStream::follow) (an async [`futures::Stream`] of
//!   chunks that resumes from its offset across disconnects and server restarts); an
//!   idempotent [`Producer`] that batches, pipelines and retries with exactly-once
//!   stamps; PicoMQ's native record API ([`NewRecord`], [`Record`], reads by
//!   sequence number, time or tail); [`ConsumerGroup`]s and Durable Streams
//!   [`Subscription`]s. The Durable Streams parts (create, append, read, follow,
//!   close, delete, the producer, subscriptions) speak the protocol and work
//!   against any Durable Streams server; records and consumer groups are PicoMQ's.
//! - **The low-level HTTP client**, [`Client`]: HTTP/1.1 or HTTP/2, TLS, one
//!   connection pool; status, headers and body, no protocol rules. The CLI, the
//!   benchmark and the tests use it; the SDK is built on it.
//!
//! ```no_run
//! use futures::StreamExt;
//! use picomq_client::{CreateOptions, FollowOptions, Offset, PicoMq};
//!
//! # async fn run() -> Result<(), picomq_client::Error> {
//! let mq = PicoMq::new("http://127.0.0.1:4437");
//! let orders = mq.stream("orders");
//! orders.create(CreateOptions::json()).await?;
//! orders.append_json(&serde_json::json!({"id": 1})).await?;
//! let mut follow = orders.follow(Offset::start(), FollowOptions::default());
//! while let Some(chunk) = follow.next().await {
//!     let chunk = chunk?;
//!     for order in chunk.messages::<serde_json::Value>()? {
//!         println!("{order} (resume from {})", chunk.next_offset);
//!     }
//! }
//! # Ok(())
//! # }
//! ```
//!
//! Errors are one enum, [`Error`]: what the server answered (status, its JSON
//! `error.code` and `message`, and a typed [`Reason`] where a client must react),
//! or why no answer came.

#![warn(missing_docs)]

mod backoff;
mod connection;
mod error;
mod follow;
pub mod groups;
mod offset;
mod path;
pub mod producer;
pub mod records;
mod stream;
pub mod subscriptions;
mod transport;

pub use backoff::Backoff;
pub use connection::{PicoMq, PicoMqBuilder};
pub use error::{ApiError, Error, Reason};
pub use follow::{Follow, FollowOptions};
pub use groups::ConsumerGroup;
pub use offset::Offset;
pub use path::stream_path;
pub use producer::{Producer, ProducerConfig, ProducerStats};
pub use records::{NewRecord, ReadBounds, ReadFrom, Record, RecordBatch, RecordsAck};
pub use stream::{
    AppendAck, AppendOptions, Chunk, CreateOptions, Created, DurableStream, StreamMeta,
};
pub use subscriptions::Subscription;
pub use transport::{
    tls_config, Client, ClientError, HttpMethod, Response, SseEvent, SseParser, StatusCode,
    Streaming,
};
