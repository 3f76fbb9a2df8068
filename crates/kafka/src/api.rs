//! Which APIs and versions are served, decoding each request, encoding its answer.

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::{
    ApiKey, ApiVersionsResponse, RequestHeader, ResponseHeader, SaslAuthenticateRequest,
    SaslAuthenticateResponse, SaslHandshakeRequest, SaslHandshakeResponse,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};

use crate::conn::{Request, Session};
use crate::errors::code;
use crate::{admin, consumer_protocol, fetch, group_api, metadata, produce, txn, Kafka};

/// What a request gets.
pub(crate) enum Answer {
    /// A response frame (without its length prefix).
    Frame(Bytes),
    /// Nothing (a produce with `acks=0`).
    None,
    /// Close the connection (as Kafka does for malformed requests).
    Close(String),
}

/// The APIs served and their version ranges. Produce and Fetch start at the
/// versions that carry record batches (magic 2); they, Metadata and DeleteTopics
/// stop before the versions that name topics by id only.
pub(crate) const SUPPORTED: &[(ApiKey, i16, i16)] = &[
    (ApiKey::Produce, 3, 11),
    (ApiKey::Fetch, 4, 12),
    (ApiKey::ListOffsets, 1, 8),
    (ApiKey::Metadata, 1, 12),
    (ApiKey::ApiVersions, 0, 3),
    (ApiKey::CreateTopics, 2, 7),
    (ApiKey::DeleteTopics, 1, 5),
    (ApiKey::CreatePartitions, 0, 3),
    (ApiKey::DescribeConfigs, 1, 4),
    (ApiKey::AlterConfigs, 0, 2),
    (ApiKey::IncrementalAlterConfigs, 0, 1),
    (ApiKey::DeleteRecords, 0, 2),
    (ApiKey::DescribeCluster, 0, 1),
    (ApiKey::InitProducerId, 0, 4),
    (ApiKey::FindCoordinator, 0, 4),
    (ApiKey::JoinGroup, 0, 9),
    (ApiKey::SyncGroup, 0, 5),
    (ApiKey::Heartbeat, 0, 4),
    (ApiKey::LeaveGroup, 0, 5),
    (ApiKey::OffsetCommit, 2, 9),
    (ApiKey::OffsetFetch, 1, 9),
    (ApiKey::ConsumerGroupHeartbeat, 0, 1),
    (ApiKey::DescribeGroups, 0, 5),
    (ApiKey::ListGroups, 0, 4),
    (ApiKey::DeleteGroups, 0, 2),
    (ApiKey::AddPartitionsToTxn, 0, 3),
    (ApiKey::AddOffsetsToTxn, 0, 3),
    (ApiKey::EndTxn, 0, 3),
    (ApiKey::TxnOffsetCommit, 0, 3),
    (ApiKey::SaslHandshake, 1, 1),
    (ApiKey::SaslAuthenticate, 0, 2),
];

fn supports(key: ApiKey, version: i16) -> bool {
    SUPPORTED
        .iter()
        .any(|&(k, min, max)| k == key && (min..=max).contains(&version))
}

/// Encodes `body` as the answer to `header`.
pub(crate) fn frame<R: Encodable>(key: ApiKey, header: &RequestHeader, body: &R) -> Answer {
    let version = header.request_api_version;
    let mut out = BytesMut::with_capacity(64);
    let head = ResponseHeader::default().with_correlation_id(header.correlation_id);
    let encoded = head
        .encode(&mut out, key.response_header_version(version))
        .and_then(|()| body.encode(&mut out, version));
    match encoded {
        Ok(()) => Answer::Frame(out.freeze()),
        Err(e) => Answer::Close(format!("encoding the {key:?} v{version} response: {e}")),
    }
}

pub(crate) fn decode<R: Decodable>(request: &Request) -> Result<R, Answer> {
    let mut body = request.body.clone();
    R::decode(&mut body, request.header.request_api_version).map_err(|e| {
        Answer::Close(format!(
            "malformed {:?} v{} request: {e}",
            request.key, request.header.request_api_version
        ))
    })
}

/// A request other than ApiVersions and SASL.
pub(crate) async fn handle(kafka: &Kafka, session: &Session, request: Request) -> Answer {
    handle_produce(kafka, session, request, None).await
}

/// [`handle`], with the signal a produce request gives once its appends are in
/// order (see `conn.rs`); other requests drop it at once.
pub(crate) async fn handle_produce(
    kafka: &Kafka,
    session: &Session,
    request: Request,
    sequenced: Option<tokio::sync::oneshot::Sender<()>>,
) -> Answer {
    let version = request.header.request_api_version;
    if !supports(request.key, version) {
        return Answer::Close(format!(
            "{:?} v{version} is not supported (ApiVersions lists what is)",
            request.key
        ));
    }
    // A token revoked or expired since the connection authenticated ends it.
    if let (Some(auth), Some(p)) = (&kafka.auth, &session.principal) {
        if !auth.still_valid(p, auth.now_ms()) {
            return Answer::Close("the connection's token was revoked or has expired".into());
        }
    }
    let key = request.key;
    let work = async {
        match request.key {
            ApiKey::Produce => {
                let (tx, _unused) = tokio::sync::oneshot::channel();
                produce::produce(kafka, session, &request, sequenced.unwrap_or(tx)).await
            }
            ApiKey::Fetch => fetch::fetch(kafka, session, &request).await,
            ApiKey::ListOffsets => metadata::list_offsets(kafka, session, &request).await,
            ApiKey::Metadata => metadata::metadata(kafka, session, &request).await,
            ApiKey::DescribeCluster => metadata::describe_cluster(kafka, &request),
            ApiKey::InitProducerId => txn::init_producer_id(kafka, session, &request).await,
            ApiKey::AddPartitionsToTxn => txn::add_partitions(kafka, session, &request).await,
            ApiKey::AddOffsetsToTxn => txn::add_offsets(kafka, session, &request).await,
            ApiKey::EndTxn => txn::end_txn(kafka, session, &request).await,
            ApiKey::TxnOffsetCommit => txn::txn_offset_commit(kafka, session, &request).await,
            ApiKey::CreateTopics => admin::create_topics(kafka, session, &request).await,
            ApiKey::DeleteTopics => admin::delete_topics(kafka, session, &request).await,
            ApiKey::CreatePartitions => admin::create_partitions(kafka, session, &request).await,
            ApiKey::DescribeConfigs => admin::describe_configs(kafka, session, &request).await,
            ApiKey::AlterConfigs => admin::alter_configs(kafka, session, &request).await,
            ApiKey::IncrementalAlterConfigs => {
                admin::incremental_alter_configs(kafka, session, &request).await
            }
            ApiKey::DeleteRecords => admin::delete_records(kafka, session, &request).await,
            ApiKey::FindCoordinator => group_api::find_coordinator(kafka, session, &request),
            ApiKey::JoinGroup => group_api::join_group(kafka, session, &request).await,
            ApiKey::SyncGroup => group_api::sync_group(kafka, session, &request).await,
            ApiKey::Heartbeat => group_api::heartbeat(kafka, session, &request).await,
            ApiKey::LeaveGroup => group_api::leave_group(kafka, session, &request).await,
            ApiKey::OffsetCommit => group_api::offset_commit(kafka, session, &request).await,
            ApiKey::OffsetFetch => group_api::offset_fetch(kafka, session, &request).await,
            ApiKey::DescribeGroups => group_api::describe_groups(kafka, session, &request).await,
            ApiKey::ListGroups => group_api::list_groups(kafka, session, &request).await,
            ApiKey::DeleteGroups => group_api::delete_groups(kafka, session, &request).await,
            ApiKey::ConsumerGroupHeartbeat => {
                consumer_protocol::heartbeat(kafka, session, &request).await
            }
            other => Err(Answer::Close(format!("{other:?} is not served"))),
        }
    };
    watched(key, work).await.unwrap_or_else(|a| a)
}

/// How long a request that does not wait by design may run before it is logged.
const SLOW: std::time::Duration = std::time::Duration::from_secs(10);

/// Runs `work`, logging a warning every [`SLOW`] while it runs on: requests that
/// wait by design (Fetch's long-poll, a group's join and sync) are left alone.
async fn watched<F: std::future::Future>(key: ApiKey, work: F) -> F::Output {
    if matches!(key, ApiKey::Fetch | ApiKey::JoinGroup | ApiKey::SyncGroup) {
        return work.await;
    }
    let started = std::time::Instant::now();
    tokio::pin!(work);
    loop {
        tokio::select! {
            out = &mut work => return out,
            () = tokio::time::sleep(SLOW) => {
                tracing::warn!(api = ?key, elapsed_ms = started.elapsed().as_millis() as u64, "a Kafka request is taking long");
            }
        }
    }
}

/// ApiVersions, SaslHandshake and SaslAuthenticate: they change or precede the
/// connection's identity, so they run in line.
pub(crate) async fn session_request(
    kafka: &Kafka,
    session: &mut Session,
    request: Request,
) -> Answer {
    let version = request.header.request_api_version;
    match request.key {
        ApiKey::ApiVersions => api_versions(&request),
        _ if !supports(request.key, version) => Answer::Close(format!(
            "{:?} v{version} is not supported (ApiVersions lists what is)",
            request.key
        )),
        ApiKey::SaslHandshake => {
            let req: SaslHandshakeRequest = match decode(&request) {
                Ok(r) => r,
                Err(a) => return a,
            };
            let mechanisms = vec![
                StrBytes::from_static_str("PLAIN"),
                StrBytes::from_static_str("OAUTHBEARER"),
            ];
            let mut resp = SaslHandshakeResponse::default().with_mechanisms(mechanisms);
            let chosen = req.mechanism.as_str();
            if kafka.auth.is_none() {
                resp.error_code = code::ILLEGAL_SASL_STATE;
            } else if chosen == "PLAIN" || chosen == "OAUTHBEARER" {
                session.mechanism = Some(chosen.to_string());
            } else {
                resp.error_code = code::UNSUPPORTED_SASL_MECHANISM;
            }
            frame(request.key, &request.header, &resp)
        }
        ApiKey::SaslAuthenticate => {
            let req: SaslAuthenticateRequest = match decode(&request) {
                Ok(r) => r,
                Err(a) => return a,
            };
            let mut resp = SaslAuthenticateResponse::default();
            match authenticate(kafka, session, &req.auth_bytes) {
                Ok(()) => {
                    if let (Some(auth), Some(p)) = (&kafka.auth, &session.principal) {
                        let left = picomq_http::auth::Auth::expires_ms(p)
                            .map(|e| e.saturating_sub(auth.now_ms()) as i64);
                        resp.session_lifetime_ms = left.unwrap_or(0);
                    }
                }
                Err(why) => {
                    resp.error_code = code::SASL_AUTHENTICATION_FAILED;
                    resp.error_message = Some(StrBytes::from_string(why));
                }
            }
            let failed = resp.error_code != 0;
            let answer = frame(request.key, &request.header, &resp);
            if failed {
                // Kafka closes the connection after a failed authentication; the
                // answer goes out first.
                tracing::info!(client = ?request.header.client_id, "kafka SASL authentication failed");
            }
            answer
        }
        other => Answer::Close(format!("{other:?} is not a session request")),
    }
}

fn api_versions(request: &Request) -> Answer {
    let version = request.header.request_api_version;
    let keys = SUPPORTED
        .iter()
        .map(|&(k, min, max)| {
            ApiVersion::default()
                .with_api_key(k as i16)
                .with_min_version(min)
                .with_max_version(max)
        })
        .collect();
    let mut resp = ApiVersionsResponse::default().with_api_keys(keys);
    if !(0..=3).contains(&version) {
        // The protocol's rule: answer an unknown version in v0, with the error and
        // the versions served, so the client can pick one.
        resp.error_code = code::UNSUPPORTED_VERSION;
        let mut header = request.header.clone();
        header.request_api_version = 0;
        return frame(ApiKey::ApiVersions, &header, &resp);
    }
    frame(ApiKey::ApiVersions, &request.header, &resp)
}

/// SASL/PLAIN (`authzid \0 user \0 password`) or OAUTHBEARER
/// (`n,,\x01auth=Bearer TOKEN\x01\x01`): the secret is a PicoMQ token's.
fn authenticate(kafka: &Kafka, session: &mut Session, bytes: &Bytes) -> Result<(), String> {
    let Some(auth) = &kafka.auth else {
        return Err("this server runs without authentication".into());
    };
    if session.principal.is_some() {
        return Err("the connection is already authenticated".into());
    }
    let text = std::str::from_utf8(bytes).map_err(|_| "the SASL message is not UTF-8")?;
    let secret = match session.mechanism.as_deref() {
        Some("PLAIN") => {
            let mut parts = text.split('\0');
            let (_authzid, _user, password) = (parts.next(), parts.next(), parts.next());
            if parts.next().is_some() {
                return Err("a PLAIN message has three parts".into());
            }
            password.ok_or("a PLAIN message has three parts")?
        }
        Some("OAUTHBEARER") => text
            .split('\x01')
            .find_map(|kv| kv.strip_prefix("auth="))
            .and_then(|v| {
                v.strip_prefix("Bearer ")
                    .or_else(|| v.strip_prefix("bearer "))
            })
            .ok_or("an OAUTHBEARER message carries auth=Bearer TOKEN")?
            .trim(),
        _ => return Err("SaslHandshake must choose PLAIN or OAUTHBEARER first".into()),
    };
    let principal = auth.authenticate_secret(secret).map_err(|e| e.message)?;
    session.principal = Some(principal);
    Ok(())
}
