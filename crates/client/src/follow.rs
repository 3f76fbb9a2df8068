//! Following a stream: [`Follow`], an async stream of [`Chunk`]s read with
//! `live=long-poll` from an offset, that rides out disconnects, `5xx` answers and
//! server restarts (capped backoff, bounded by `retry_for`) and resumes from the
//! last `Stream-Next-Offset` it yielded, so nothing is lost or repeated. It ends
//! when the stream is closed and read to its end, or with an error the retries
//! cannot fix (the stream is gone, access refused, or retrying lasted too long).

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::stream::BoxStream;
use futures::Stream;

use crate::backoff::Backoff;
use crate::error::{Error, Result};
use crate::offset::Offset;
use crate::path::query_value;
use crate::stream::{Chunk, DurableStream};

/// How long a live read may be held by the server before the SDK gives up on it
/// (the server's long-poll timeout is shorter: PicoMQ's is 25 s).
pub(crate) const LIVE_WAIT: Duration = Duration::from_secs(60);

/// How a follow retries.
#[derive(Clone, Debug)]
pub struct FollowOptions {
    /// Give up (yield the error and end) after failing this long without one
    /// success; `None`: retry for ever.
    pub retry_for: Option<Duration>,
    /// The waits between attempts.
    pub backoff: Backoff,
}

impl Default for FollowOptions {
    /// Retry for ever, 100 ms doubling up to 5 s.
    fn default() -> Self {
        FollowOptions {
            retry_for: None,
            backoff: Backoff::default(),
        }
    }
}

impl FollowOptions {
    /// Gives up after failing `limit` without a success.
    pub fn retry_for(mut self, limit: Duration) -> Self {
        self.retry_for = Some(limit);
        self
    }
}

/// An async stream of the chunks of a followed stream, in order, each with the
/// offset to resume from. Empty long-polls are not yielded.
pub struct Follow {
    inner: BoxStream<'static, Result<Chunk>>,
}

impl Stream for Follow {
    type Item = Result<Chunk>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner.as_mut().poll_next(cx)
    }
}

/// What a retried operation does next.
pub(crate) struct Retrier {
    backoff: Backoff,
    retry_for: Option<Duration>,
    failing_since: Option<Instant>,
}

impl Retrier {
    pub(crate) fn new(backoff: Backoff, retry_for: Option<Duration>) -> Retrier {
        Retrier {
            backoff,
            retry_for,
            failing_since: None,
        }
    }

    pub(crate) fn succeeded(&mut self) {
        self.failing_since = None;
        self.backoff.reset();
    }

    /// After a failure: `Ok` once it waited (try again), or the error to give up on.
    pub(crate) async fn failed(&mut self, e: Error) -> Result<()> {
        if !e.is_retryable() {
            return Err(e);
        }
        let since = *self.failing_since.get_or_insert_with(Instant::now);
        if self.retry_for.is_some_and(|limit| since.elapsed() >= limit) {
            return Err(e);
        }
        self.backoff.wait().await;
        Ok(())
    }
}

struct State {
    stream: DurableStream,
    offset: Offset,
    cursor: Option<String>,
    retrier: Retrier,
    done: bool,
}

impl State {
    /// The next chunk with data; `None` at the end of a closed stream.
    async fn next(&mut self) -> Option<Result<Chunk>> {
        while !self.done {
            let mut query = format!(
                "offset={}&live=long-poll",
                query_value(self.offset.as_str())
            );
            if let Some(c) = &self.cursor {
                query.push_str("&cursor=");
                query.push_str(&query_value(c));
            }
            match self.stream.get(&query, LIVE_WAIT).await {
                Ok(chunk) => {
                    self.retrier.succeeded();
                    self.offset = chunk.next_offset.clone();
                    self.cursor = chunk.cursor.clone();
                    self.done = chunk.closed;
                    if !chunk.is_empty() {
                        return Some(Ok(chunk));
                    }
                }
                Err(e) => {
                    if let Err(e) = self.retrier.failed(e).await {
                        self.done = true;
                        return Some(Err(e));
                    }
                }
            }
        }
        None
    }
}

impl DurableStream {
    /// Follows the stream from `from` ([`Offset::start`], [`Offset::now`] or a
    /// `next_offset` kept from an earlier chunk): every chunk from there on, live,
    /// with `live=long-poll`, until the stream is closed and read to its end.
    pub fn follow(&self, from: Offset, options: FollowOptions) -> Follow {
        let state = State {
            stream: self.clone(),
            offset: from,
            cursor: None,
            retrier: Retrier::new(options.backoff, options.retry_for),
            done: false,
        };
        let inner = futures::stream::unfold(state, |mut s| async move {
            let item = s.next().await?;
            Some((item, s))
        });
        Follow {
            inner: Box::pin(inner),
        }
    }
}
