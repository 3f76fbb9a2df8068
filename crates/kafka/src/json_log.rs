//! Reserved streams of JSON records that the Kafka listener keeps its own state
//! in: a group's committed offsets (`groups`), a transactional id's log (`txn`).

use bytes::Bytes;
use picomq_engine::{
    AppendRequest, ContentType, CreateRequest, EngineError, Offset, StreamName, StreamRef,
};
use serde_json::Value;

use crate::Kafka;

/// Appends one JSON record to `name`, creating the stream if it is new.
pub(crate) async fn append(
    kafka: &Kafka,
    name: &StreamName,
    body: Value,
) -> Result<(), EngineError> {
    let bytes = Bytes::from(serde_json::to_vec(&body).expect("JSON serializes"));
    let json = ContentType::new("application/json", 256).ok().flatten();
    for _ in 0..2 {
        let req = AppendRequest::new(name.clone(), json.clone(), bytes.clone());
        match kafka.engine.append(req).await {
            Ok(_) => return Ok(()),
            Err(EngineError::NotFound) => {
                let mut create = CreateRequest::new(name.clone());
                create.content_type = json.clone();
                kafka.engine.create(create).await?;
            }
            Err(e) => return Err(e),
        }
    }
    Err(EngineError::Unavailable(format!(
        "{name} could not be created"
    )))
}

/// Hands each JSON record of `stream` from `at` to its durable end to `apply`
/// (records that are not JSON are skipped); where the read ended.
pub(crate) async fn read(
    kafka: &Kafka,
    stream: &StreamRef,
    mut at: Offset,
    mut apply: impl FnMut(&Value),
) -> Result<Offset, EngineError> {
    loop {
        let chunk = kafka.engine.read(stream, at, 1 << 20).await?;
        for data in &chunk.segments {
            if let Ok(v) = serde_json::from_slice::<Value>(data) {
                apply(&v);
            }
        }
        let next = chunk.next;
        let done = chunk.up_to_date || next == at;
        at = next;
        if done {
            return Ok(at);
        }
    }
}
