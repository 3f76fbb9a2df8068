//! Server-kept positions, for consumers that keep no state (a function invoked per
//! event): a consumer names itself, commits the Durable Streams offset it reached,
//! and reads on from it (`?consumer=NAME` on a read) instead of an offset. Offsets
//! stay the protocol's opaque tokens.
//!
//! A position is a companion stream `__positions/{consumer}/{stream}` (in the
//! stream's slot: the member serving the stream keeps its positions), one JSON
//! message per commit; the last one is the position. Trimmed to its last message
//! every [`TRIM_EVERY`] commits.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use picomq_engine::{
    AppendRequest, ContentType, CreateRequest, Engine, EngineError, Offset, StreamName,
};
use serde_json::json;

use crate::error::ConsumerError;

const PREFIX: &str = "__positions/";
const TRIM_EVERY: u64 = 64;
const CONSUMER_BYTES_MAX: usize = 128;
/// Positions a node keeps in memory (a lookup past it reads the stream).
const CACHE_MAX: usize = 100_000;

pub struct Positions {
    engine: Engine,
    /// Companion name -> (offset, commits since the last trim).
    cache: Mutex<HashMap<String, (Offset, u64)>>,
}

pub fn check_consumer(consumer: &str) -> Result<(), ConsumerError> {
    crate::names::check_key_name("consumer", consumer, CONSUMER_BYTES_MAX)
}

impl Positions {
    pub fn new(engine: Engine) -> Arc<Positions> {
        Arc::new(Positions {
            engine,
            cache: Mutex::new(HashMap::new()),
        })
    }

    fn companion(&self, consumer: &str, stream: &str) -> Result<StreamName, ConsumerError> {
        StreamName::new(
            format!("{PREFIX}{consumer}/{stream}"),
            self.engine.config().stream_name_bytes_max,
        )
        .map_err(ConsumerError::from)
    }

    /// The committed position of `consumer` on `stream`, if any.
    pub async fn get(&self, consumer: &str, stream: &str) -> Result<Option<Offset>, ConsumerError> {
        let name = self.companion(consumer, stream)?;
        if let Some((o, _)) = self
            .cache
            .lock()
            .expect("positions lock")
            .get(name.as_str())
        {
            return Ok(Some(*o));
        }
        let handle = match self.engine.stream(&name).await {
            Ok(h) => h,
            Err(EngineError::NotFound | EngineError::Gone) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let mut from = self.engine.retained_start(&handle).await?;
        let mut last = None;
        loop {
            let chunk = self.engine.read(&handle, from, 1 << 20).await?;
            if let Some(seg) = chunk.segments.last() {
                last = Some(seg.clone());
            }
            let done = chunk.up_to_date || chunk.next == from;
            from = chunk.next;
            if done {
                break;
            }
        }
        let offset = last
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .and_then(|v| v["offset"].as_str().and_then(|s| Offset::parse(s).ok()));
        if let Some(o) = offset {
            self.remember(name.as_str(), o, 0);
        }
        Ok(offset)
    }

    fn remember(&self, name: &str, offset: Offset, commits: u64) {
        let mut cache = self.cache.lock().expect("positions lock");
        if cache.len() >= CACHE_MAX && !cache.contains_key(name) {
            cache.clear();
        }
        cache.insert(name.to_string(), (offset, commits));
    }

    /// Commits `offset` (durable on return). It must be an offset of the stream,
    /// at most its tail.
    pub async fn commit(
        &self,
        consumer: &str,
        stream: &str,
        offset: Offset,
    ) -> Result<(), ConsumerError> {
        let data = StreamName::new(
            stream.to_string(),
            self.engine.config().stream_name_bytes_max,
        )?;
        let info = self.engine.head(&data).await?;
        if offset > info.tail {
            return Err(ConsumerError::invalid(format!(
                "offset {offset} is past the stream's tail {}",
                info.tail
            )));
        }
        let name = self.companion(consumer, stream)?;
        let mut create = CreateRequest::new(name.clone());
        create.content_type = Some(ContentType::json());
        self.engine.create(create).await?;
        let body = json!({ "offset": offset.to_string(), "at": self.engine.clock().now_ms() });
        let req = AppendRequest::new(
            name.clone(),
            Some(ContentType::json()),
            Bytes::from(body.to_string()),
        );
        let before = self.engine.head(&name).await?.tail;
        self.engine.append(req).await?;
        let commits = {
            let cache = self.cache.lock().expect("positions lock");
            cache.get(name.as_str()).map_or(0, |c| c.1) + 1
        };
        if commits >= TRIM_EVERY {
            let _ = self.engine.trim_at_boundary(&name, before).await;
            self.remember(name.as_str(), offset, 0);
        } else {
            self.remember(name.as_str(), offset, commits);
        }
        Ok(())
    }

    pub async fn delete(&self, consumer: &str, stream: &str) -> Result<(), ConsumerError> {
        let name = self.companion(consumer, stream)?;
        self.cache
            .lock()
            .expect("positions lock")
            .remove(name.as_str());
        match self.engine.delete(&name).await {
            Ok(()) | Err(EngineError::NotFound | EngineError::Gone) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}
