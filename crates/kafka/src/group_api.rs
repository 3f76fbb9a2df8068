//! The group requests: FindCoordinator, JoinGroup, SyncGroup, Heartbeat,
//! LeaveGroup, OffsetCommit, OffsetFetch, DescribeGroups, ListGroups and
//! DeleteGroups. A group id is relative to the token's namespace; using a group
//! takes the `subscribe` scope on its id, committing or fetching a partition's
//! offset also `read` on the partition's stream.

use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::messages::delete_groups_response::DeletableGroupResult;
use kafka_protocol::messages::describe_groups_response::{DescribedGroup, DescribedGroupMember};
use kafka_protocol::messages::find_coordinator_response::Coordinator as FoundCoordinator;
use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
use kafka_protocol::messages::leave_group_response::MemberResponse;
use kafka_protocol::messages::list_groups_response::ListedGroup;
use kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponseGroup, OffsetFetchResponsePartition, OffsetFetchResponsePartitions,
    OffsetFetchResponseTopic, OffsetFetchResponseTopics,
};
use kafka_protocol::messages::{
    ApiKey, BrokerId, DeleteGroupsRequest, DeleteGroupsResponse, DescribeGroupsRequest,
    DescribeGroupsResponse, FindCoordinatorRequest, FindCoordinatorResponse, GroupId,
    HeartbeatRequest, HeartbeatResponse, JoinGroupRequest, JoinGroupResponse, LeaveGroupRequest,
    LeaveGroupResponse, ListGroupsRequest, ListGroupsResponse, OffsetCommitRequest,
    OffsetCommitResponse, OffsetFetchRequest, OffsetFetchResponse, SyncGroupRequest,
    SyncGroupResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use picomq_http::auth::Op;

use crate::api::{decode, frame, Answer};
use crate::brokers::Broker;
use crate::conn::{Request, Session};
use crate::errors::{self, code};
use crate::groups::{self, Committed, JoinRequest};
use crate::{topics, Kafka};

const GROUP_AUTHORIZATION_FAILED: i16 = 30;
const COORDINATOR_LOAD_IN_PROGRESS: i16 = 14;

fn text(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_string())
}

/// The group's key (its id within the caller's namespace), if the caller may use it.
pub(crate) fn group_key(kafka: &Kafka, session: &Session, group: &str) -> Result<String, i16> {
    if group.is_empty() || group.len() > groups::GROUP_ID_MAX {
        return Err(groups::INVALID_GROUP_ID);
    }
    topics::access(kafka, session)
        .stream(Op::Subscribe, group.to_string())
        .map_err(|_| GROUP_AUTHORIZATION_FAILED)
}

pub(crate) fn find_coordinator(
    kafka: &Kafka,
    session: &Session,
    request: &Request,
) -> Result<Answer, Answer> {
    let req: FindCoordinatorRequest = decode(request)?;
    let found = |key: &str| -> Result<Broker, (i16, String)> {
        match req.key_type {
            // Groups: the node serving the group's offsets stream.
            0 => match group_key(kafka, session, key) {
                Ok(k) => kafka
                    .leader_broker(&groups::offsets_stream_name(&k))
                    .ok_or_else(|| {
                        (
                            groups::COORDINATOR_NOT_AVAILABLE,
                            "the group's coordinator is moving between nodes; retry".into(),
                        )
                    }),
                Err(c) => Err((c, "this token may not use that group".into())),
            },
            // Transactional ids: the node serving the id's log.
            1 => match crate::txn::txn_key(kafka, session, key) {
                Ok(k) => kafka
                    .leader_broker(&crate::txn::log_name(&k))
                    .ok_or_else(|| {
                        (
                            groups::COORDINATOR_NOT_AVAILABLE,
                            "the transaction's coordinator is moving between nodes; retry".into(),
                        )
                    }),
                Err(c) => Err((c, "this token may not use that transactional id".into())),
            },
            other => Err((
                code::INVALID_REQUEST,
                format!("key type {other}: 0 (group) or 1 (transaction)"),
            )),
        }
    };
    let mut resp = FindCoordinatorResponse::default();
    if request.header.request_api_version < 4 {
        match found(&req.key) {
            Ok(b) => {
                resp.node_id = BrokerId(b.id);
                resp.host = text(&b.host);
                resp.port = b.port;
            }
            Err((c, m)) => {
                resp.error_code = c;
                resp.error_message = Some(text(&m));
                resp.node_id = BrokerId(-1);
                resp.port = -1;
            }
        }
    } else {
        for key in &req.coordinator_keys {
            let entry = FoundCoordinator::default().with_key(key.clone());
            resp.coordinators.push(match found(key) {
                Ok(b) => entry
                    .with_node_id(BrokerId(b.id))
                    .with_host(text(&b.host))
                    .with_port(b.port),
                Err((c, m)) => entry
                    .with_error_code(c)
                    .with_error_message(Some(text(&m)))
                    .with_node_id(BrokerId(-1))
                    .with_port(-1),
            });
        }
    }
    Ok(frame(ApiKey::FindCoordinator, &request.header, &resp))
}

pub(crate) async fn join_group(
    kafka: &Kafka,
    session: &Session,
    request: &Request,
) -> Result<Answer, Answer> {
    let req: JoinGroupRequest = decode(request)?;
    let version = request.header.request_api_version;
    let mut resp = JoinGroupResponse::default()
        .with_generation_id(-1)
        .with_member_id(req.member_id.clone());
    let key = match group_key(kafka, session, &req.group_id) {
        Ok(k) => k,
        Err(c) => {
            resp.error_code = c;
            return Ok(frame(ApiKey::JoinGroup, &request.header, &resp));
        }
    };
    let group = match kafka.groups.group(kafka, &key) {
        Ok(g) => g,
        Err(c) => {
            resp.error_code = c;
            return Ok(frame(ApiKey::JoinGroup, &request.header, &resp));
        }
    };
    let rebalance = if version == 0 {
        req.session_timeout_ms
    } else {
        req.rebalance_timeout_ms
    };
    let join = JoinRequest {
        member_id: req.member_id.to_string(),
        instance_id: req.group_instance_id.as_ref().map(|s| s.to_string()),
        client_id: request
            .header
            .client_id
            .as_deref()
            .unwrap_or("")
            .to_string(),
        client_host: session.peer.clone(),
        session: Duration::from_millis(req.session_timeout_ms.max(0) as u64),
        rebalance: Duration::from_millis(rebalance.clamp(0, 300_000) as u64),
        protocol_type: req.protocol_type.to_string(),
        protocols: req
            .protocols
            .iter()
            .map(|p| (p.name.to_string(), p.metadata.clone()))
            .collect(),
        member_id_required: version >= 4,
    };
    let waited = group.lock().await.join(join, kafka.join_delay);
    let joined = match waited {
        Err(now) => now,
        Ok(rx) => match rx.await {
            Ok(j) => j,
            // Replaced by a newer JoinGroup of the same member, or left.
            Err(_) => groups::Joined {
                error: groups::UNKNOWN_MEMBER_ID,
                generation: -1,
                protocol: None,
                leader: String::new(),
                member_id: req.member_id.to_string(),
                members: Vec::new(),
            },
        },
    };
    resp.error_code = joined.error;
    resp.generation_id = joined.generation;
    resp.protocol_type = Some(req.protocol_type.clone());
    resp.protocol_name = joined.protocol.as_deref().map(text);
    resp.leader = text(&joined.leader);
    resp.member_id = text(&joined.member_id);
    resp.members = joined
        .members
        .into_iter()
        .map(|(id, instance, meta)| {
            JoinGroupResponseMember::default()
                .with_member_id(text(&id))
                .with_group_instance_id(instance.as_deref().map(text))
                .with_metadata(meta)
        })
        .collect();
    Ok(frame(ApiKey::JoinGroup, &request.header, &resp))
}

pub(crate) async fn sync_group(
    kafka: &Kafka,
    session: &Session,
    request: &Request,
) -> Result<Answer, Answer> {
    let req: SyncGroupRequest = decode(request)?;
    let mut resp = SyncGroupResponse::default()
        .with_protocol_type(req.protocol_type.clone())
        .with_protocol_name(req.protocol_name.clone());
    let outcome = match group_key(kafka, session, &req.group_id) {
        Err(c) => (c, Bytes::new()),
        Ok(key) => match kafka.groups.existing(kafka, &key) {
            Err(c) => (c, Bytes::new()),
            Ok(None) => (groups::UNKNOWN_MEMBER_ID, Bytes::new()),
            Ok(Some(group)) => {
                let assignments = req
                    .assignments
                    .iter()
                    .map(|a| (a.member_id.to_string(), a.assignment.clone()))
                    .collect();
                let waited =
                    group
                        .lock()
                        .await
                        .sync(&req.member_id, req.generation_id, assignments);
                match waited {
                    Err(now) => now,
                    Ok(rx) => rx
                        .await
                        .unwrap_or((groups::REBALANCE_IN_PROGRESS, Bytes::new())),
                }
            }
        },
    };
    resp.error_code = outcome.0;
    resp.assignment = outcome.1;
    Ok(frame(ApiKey::SyncGroup, &request.header, &resp))
}

pub(crate) async fn heartbeat(
    kafka: &Kafka,
    session: &Session,
    request: &Request,
) -> Result<Answer, Answer> {
    let req: HeartbeatRequest = decode(request)?;
    let c = match group_key(kafka, session, &req.group_id) {
        Err(c) => c,
        Ok(key) => match kafka.groups.existing(kafka, &key) {
            Err(c) => c,
            Ok(None) => groups::UNKNOWN_MEMBER_ID,
            Ok(Some(g)) => g.lock().await.heartbeat(&req.member_id, req.generation_id),
        },
    };
    let resp = HeartbeatResponse::default().with_error_code(c);
    Ok(frame(ApiKey::Heartbeat, &request.header, &resp))
}

pub(crate) async fn leave_group(
    kafka: &Kafka,
    session: &Session,
    request: &Request,
) -> Result<Answer, Answer> {
    let req: LeaveGroupRequest = decode(request)?;
    let mut resp = LeaveGroupResponse::default();
    let leaving: Vec<String> = if request.header.request_api_version < 3 {
        vec![req.member_id.to_string()]
    } else {
        req.members
            .iter()
            .map(|m| m.member_id.to_string())
            .collect()
    };
    match group_key(kafka, session, &req.group_id) {
        Err(c) => resp.error_code = c,
        Ok(key) => {
            let group = kafka.groups.existing(kafka, &key);
            for id in leaving {
                let c = match &group {
                    Err(c) => *c,
                    Ok(None) => groups::UNKNOWN_MEMBER_ID,
                    Ok(Some(g)) => g.lock().await.leave(&id),
                };
                if request.header.request_api_version < 3 {
                    resp.error_code = c;
                } else {
                    resp.members.push(
                        MemberResponse::default()
                            .with_member_id(text(&id))
                            .with_error_code(c),
                    );
                }
            }
        }
    }
    Ok(frame(ApiKey::LeaveGroup, &request.header, &resp))
}

/// Checks `read` on a partition for an offset commit or fetch.
fn partition_readable(kafka: &Kafka, session: &Session, topic: &str, p: i32) -> i16 {
    match topics::stream_name(kafka, session, topic, p, Op::Read) {
        Ok(_) => code::NONE,
        Err((c, _)) => c,
    }
}

pub(crate) async fn offset_commit(
    kafka: &Kafka,
    session: &Session,
    request: &Request,
) -> Result<Answer, Answer> {
    let req: OffsetCommitRequest = decode(request)?;
    let mut resp = OffsetCommitResponse::default();
    let answer_all = |resp: &mut OffsetCommitResponse, c: i16| {
        resp.topics = req
            .topics
            .iter()
            .map(|t| {
                OffsetCommitResponseTopic::default()
                    .with_name(t.name.clone())
                    .with_partitions(
                        t.partitions
                            .iter()
                            .map(|p| {
                                OffsetCommitResponsePartition::default()
                                    .with_partition_index(p.partition_index)
                                    .with_error_code(c)
                            })
                            .collect(),
                    )
            })
            .collect();
    };
    let key = match group_key(kafka, session, &req.group_id) {
        Ok(k) => k,
        Err(c) => {
            answer_all(&mut resp, c);
            return Ok(frame(ApiKey::OffsetCommit, &request.header, &resp));
        }
    };
    let group = match kafka.groups.group(kafka, &key) {
        Ok(g) => g,
        Err(c) => {
            answer_all(&mut resp, c);
            return Ok(frame(ApiKey::OffsetCommit, &request.header, &resp));
        }
    };
    let mut g = group.lock().await;
    let c = g.may_commit(
        &req.member_id,
        req.generation_id_or_member_epoch,
        req.topics.iter().flat_map(|t| {
            t.partitions
                .iter()
                .map(move |p| (t.name.as_str(), p.partition_index))
        }),
    );
    if c != code::NONE {
        drop(g);
        answer_all(&mut resp, c);
        return Ok(frame(ApiKey::OffsetCommit, &request.header, &resp));
    }
    let mut entries = Vec::new();
    let mut codes = Vec::new();
    for t in &req.topics {
        for p in &t.partitions {
            let c = partition_readable(kafka, session, &t.name, p.partition_index);
            if c == code::NONE {
                entries.push((
                    t.name.to_string(),
                    p.partition_index,
                    Committed {
                        offset: p.committed_offset,
                        epoch: p.committed_leader_epoch,
                        metadata: p.committed_metadata.as_ref().map(|m| m.to_string()),
                    },
                ));
            }
            codes.push(c);
        }
    }
    let stored = if entries.is_empty() {
        code::NONE
    } else {
        match g.commit(kafka, entries).await {
            Ok(()) => code::NONE,
            Err(e) => errors::of_group(&e),
        }
    };
    drop(g);
    let mut codes = codes.into_iter();
    for t in &req.topics {
        let mut out = OffsetCommitResponseTopic::default().with_name(t.name.clone());
        for p in &t.partitions {
            let c = codes.next().unwrap_or(code::NONE);
            out.partitions.push(
                OffsetCommitResponsePartition::default()
                    .with_partition_index(p.partition_index)
                    .with_error_code(if c == code::NONE { stored } else { c }),
            );
        }
        resp.topics.push(out);
    }
    Ok(frame(ApiKey::OffsetCommit, &request.header, &resp))
}

/// One group's committed offsets for the asked partitions (`None`: all it has).
async fn fetch_offsets(
    kafka: &Kafka,
    session: &Session,
    group: &str,
    asked: Option<Vec<(String, Vec<i32>)>>,
) -> Result<Vec<(String, Vec<(i32, Committed, i16)>)>, i16> {
    let key = group_key(kafka, session, group)?;
    let g = kafka.groups.group(kafka, &key)?;
    let mut g = g.lock().await;
    if g.load_offsets(kafka).await.is_err() {
        return Err(COORDINATOR_LOAD_IN_PROGRESS);
    }
    let asked = asked.unwrap_or_else(|| {
        let mut all: Vec<(String, Vec<i32>)> = Vec::new();
        for (t, p) in g.offsets.keys() {
            match all.last_mut() {
                Some((last, ps)) if last == t => ps.push(*p),
                _ => all.push((t.clone(), vec![*p])),
            }
        }
        all
    });
    Ok(asked
        .into_iter()
        .map(|(t, ps)| {
            let rows = ps
                .into_iter()
                .map(|p| {
                    let c = partition_readable(kafka, session, &t, p);
                    let committed = g
                        .offsets
                        .get(&(t.clone(), p))
                        .filter(|_| c == code::NONE)
                        .cloned()
                        .unwrap_or_else(groups::none_committed);
                    (p, committed, c)
                })
                .collect();
            (t, rows)
        })
        .collect())
}

pub(crate) async fn offset_fetch(
    kafka: &Kafka,
    session: &Session,
    request: &Request,
) -> Result<Answer, Answer> {
    let req: OffsetFetchRequest = decode(request)?;
    let mut resp = OffsetFetchResponse::default();
    if request.header.request_api_version < 8 {
        let asked = req.topics.as_ref().map(|ts| {
            ts.iter()
                .map(|t| (t.name.to_string(), t.partition_indexes.clone()))
                .collect()
        });
        match fetch_offsets(kafka, session, &req.group_id, asked).await {
            Err(c) => resp.error_code = c,
            Ok(topics) => {
                for (t, rows) in topics {
                    resp.topics.push(
                        OffsetFetchResponseTopic::default()
                            .with_name(TopicName(text(&t)))
                            .with_partitions(
                                rows.into_iter()
                                    .map(|(p, c, e)| {
                                        OffsetFetchResponsePartition::default()
                                            .with_partition_index(p)
                                            .with_committed_offset(c.offset)
                                            .with_committed_leader_epoch(c.epoch)
                                            .with_metadata(c.metadata.as_deref().map(text))
                                            .with_error_code(e)
                                    })
                                    .collect(),
                            ),
                    );
                }
            }
        }
    } else {
        for group in &req.groups {
            let asked = group.topics.as_ref().map(|ts| {
                ts.iter()
                    .map(|t| (t.name.to_string(), t.partition_indexes.clone()))
                    .collect()
            });
            let mut out = OffsetFetchResponseGroup::default().with_group_id(group.group_id.clone());
            match fetch_offsets(kafka, session, &group.group_id, asked).await {
                Err(c) => out.error_code = c,
                Ok(topics) => {
                    for (t, rows) in topics {
                        out.topics.push(
                            OffsetFetchResponseTopics::default()
                                .with_name(TopicName(text(&t)))
                                .with_partitions(
                                    rows.into_iter()
                                        .map(|(p, c, e)| {
                                            OffsetFetchResponsePartitions::default()
                                                .with_partition_index(p)
                                                .with_committed_offset(c.offset)
                                                .with_committed_leader_epoch(c.epoch)
                                                .with_metadata(c.metadata.as_deref().map(text))
                                                .with_error_code(e)
                                        })
                                        .collect(),
                                ),
                        );
                    }
                }
            }
            resp.groups.push(out);
        }
    }
    Ok(frame(ApiKey::OffsetFetch, &request.header, &resp))
}

pub(crate) async fn describe_groups(
    kafka: &Kafka,
    session: &Session,
    request: &Request,
) -> Result<Answer, Answer> {
    let req: DescribeGroupsRequest = decode(request)?;
    let mut resp = DescribeGroupsResponse::default();
    for id in &req.groups {
        let mut out = DescribedGroup::default()
            .with_group_id(id.clone())
            .with_group_state(text("Dead"));
        match group_key(kafka, session, id) {
            Err(c) => out.error_code = c,
            Ok(key) => match kafka.groups.existing(kafka, &key) {
                Err(c) => out.error_code = c,
                Ok(None) => {}
                Ok(Some(g)) => {
                    let g = g.lock().await;
                    if !g.consumer.members.is_empty() {
                        // A KIP-848 group, as far as the classic API can show it.
                        out.group_state = text("Stable");
                        out.protocol_type = text("consumer");
                        out.members = g
                            .consumer
                            .members
                            .iter()
                            .map(|(mid, m)| {
                                DescribedGroupMember::default()
                                    .with_member_id(text(mid))
                                    .with_client_id(text(&m.client_id))
                                    .with_client_host(text(&m.client_host))
                            })
                            .collect();
                        resp.groups.push(out);
                        continue;
                    }
                    out.group_state = text(g.state.name());
                    out.protocol_type = text(&g.protocol_type);
                    out.protocol_data = text(g.protocol.as_deref().unwrap_or(""));
                    out.members = g
                        .members
                        .iter()
                        .map(|(mid, m)| {
                            let meta = m
                                .protocols
                                .iter()
                                .find(|(p, _)| Some(p.as_str()) == g.protocol.as_deref())
                                .map(|(_, b)| b.clone())
                                .unwrap_or_default();
                            DescribedGroupMember::default()
                                .with_member_id(text(mid))
                                .with_group_instance_id(m.instance_id.as_deref().map(text))
                                .with_client_id(text(&m.client_id))
                                .with_client_host(text(&m.client_host))
                                .with_member_metadata(meta)
                                .with_member_assignment(m.assignment.clone())
                        })
                        .collect();
                }
            },
        }
        resp.groups.push(out);
    }
    Ok(frame(ApiKey::DescribeGroups, &request.header, &resp))
}

/// ListGroups: the groups this node has in memory (those used since it started)
/// and those with committed offsets, that the caller may use.
pub(crate) async fn list_groups(
    kafka: &Kafka,
    session: &Session,
    request: &Request,
) -> Result<Answer, Answer> {
    let req: ListGroupsRequest = decode(request)?;
    let access = topics::access(kafka, session);
    let namespace = access.namespace().to_string();
    let mut keys: std::collections::BTreeSet<String> = kafka.groups.keys().into_iter().collect();
    let prefix = format!("__kafka/groups/{namespace}");
    let mut after = String::new();
    while keys.len() < groups::GROUPS_MAX * 2 {
        let Ok(page) = kafka.engine.list(&prefix, &after, 1_000).await else {
            break;
        };
        for s in &page.streams {
            if let Some(k) = s.name.strip_prefix("__kafka/groups/") {
                keys.insert(k.to_string());
            }
        }
        match page.next {
            Some(n) => after = n,
            None => break,
        }
    }
    let mut resp = ListGroupsResponse::default();
    for key in keys {
        let Some(id) = access.shown(&key) else {
            continue;
        };
        if !access.allows(Op::Subscribe, &key) {
            continue;
        }
        // Each broker lists the groups it coordinates (clients ask every one).
        let (state, ptype) = match kafka.groups.existing(kafka, &key) {
            Err(_) => continue,
            Ok(Some(g)) => {
                let g = g.lock().await;
                if g.consumer.members.is_empty() {
                    (g.state.name(), g.protocol_type.clone())
                } else {
                    ("Stable", "consumer".to_string())
                }
            }
            Ok(None) => ("Empty", "consumer".to_string()),
        };
        if !req.states_filter.is_empty() && !req.states_filter.iter().any(|s| s.as_str() == state) {
            continue;
        }
        if !req.types_filter.is_empty()
            && !req
                .types_filter
                .iter()
                .any(|s| s.eq_ignore_ascii_case("classic"))
        {
            continue;
        }
        resp.groups.push(
            ListedGroup::default()
                .with_group_id(GroupId(text(id)))
                .with_protocol_type(text(&ptype))
                .with_group_state(text(state))
                .with_group_type(text("classic")),
        );
    }
    Ok(frame(ApiKey::ListGroups, &request.header, &resp))
}

pub(crate) async fn delete_groups(
    kafka: &Kafka,
    session: &Session,
    request: &Request,
) -> Result<Answer, Answer> {
    let req: DeleteGroupsRequest = decode(request)?;
    let mut resp = DeleteGroupsResponse::default();
    for id in &req.groups_names {
        let c = match group_key(kafka, session, id) {
            Err(c) => c,
            Ok(key) => match kafka.groups.group(kafka, &key) {
                Err(c) => c,
                Ok(g) => {
                    let mut g = g.lock().await;
                    if !g.members.is_empty() {
                        groups::NON_EMPTY_GROUP
                    } else {
                        let had = g.load_offsets(kafka).await.is_ok() && !g.offsets.is_empty();
                        match g.delete_offsets(kafka).await {
                            Ok(()) if had || g.generation > 0 => {
                                drop(g);
                                kafka.groups.forget(&key);
                                code::NONE
                            }
                            Ok(()) => {
                                drop(g);
                                kafka.groups.forget(&key);
                                groups::GROUP_ID_NOT_FOUND
                            }
                            Err(e) => errors::of_group(&e),
                        }
                    }
                }
            },
        };
        resp.results.push(
            DeletableGroupResult::default()
                .with_group_id(id.clone())
                .with_error_code(c),
        );
    }
    Ok(frame(ApiKey::DeleteGroups, &request.header, &resp))
}
