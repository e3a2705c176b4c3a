//! The group APIs: JoinGroup, SyncGroup, Heartbeat, LeaveGroup, OffsetCommit,
//! OffsetFetch, ListGroups, DescribeGroups, DeleteGroups, OffsetDelete. Each handler checks
//! what it can on the connection's core (group id, known topics), forwards the
//! rest to the group's coordinator core (`group::coordinator_of`) and builds
//! the response for the request's version (kafka-protocol refuses fields a
//! version lacks, so they are set only where they exist).

use std::cell::Cell;
use std::collections::BTreeSet;
use std::future::Future;
use std::rc::Rc;

use bytes::Bytes;
use kafka_protocol::messages::delete_groups_response::DeletableGroupResult;
use kafka_protocol::messages::describe_groups_response::{DescribedGroup, DescribedGroupMember};
use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
use kafka_protocol::messages::leave_group_response::MemberResponse;
use kafka_protocol::messages::list_groups_response::ListedGroup;
use kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use kafka_protocol::messages::offset_delete_response::{
    OffsetDeleteResponsePartition, OffsetDeleteResponseTopic,
};
use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponseGroup, OffsetFetchResponsePartition, OffsetFetchResponsePartitions,
    OffsetFetchResponseTopic, OffsetFetchResponseTopics,
};
use kafka_protocol::messages::txn_offset_commit_response::{
    TxnOffsetCommitResponsePartition, TxnOffsetCommitResponseTopic,
};
use kafka_protocol::messages::{
    DeleteGroupsRequest, DeleteGroupsResponse, DescribeGroupsRequest, DescribeGroupsResponse,
    GroupId, HeartbeatRequest, HeartbeatResponse, JoinGroupRequest, JoinGroupResponse,
    LeaveGroupRequest, LeaveGroupResponse, ListGroupsRequest, ListGroupsResponse,
    OffsetCommitRequest, OffsetCommitResponse, OffsetDeleteRequest, OffsetDeleteResponse,
    OffsetFetchRequest, OffsetFetchResponse, SyncGroupRequest, SyncGroupResponse, TopicName,
};
use kafka_protocol::messages::{TxnOffsetCommitRequest, TxnOffsetCommitResponse};
use kafka_protocol::ResponseError;
use skiff_engine::{Shard, TopicPartition};

use crate::group::coordinator::{self, Coordinator, GroupSummary};
use crate::group::{self};
use crate::kafka::{now_ms, str_bytes};
use crate::state::CoreState;
use crate::topics::{Role, NO_LEADER};
use skiff_coordinator::group::records::OffsetValue;
use skiff_coordinator::group::state::{JoinRequest, JoinResult, Limits, Protocol};

fn code(error: Option<ResponseError>) -> i16 {
    error.map_or(0, |e| e.code())
}

/// Runs `f` on the coordinator core of `group_id`.
async fn on_coordinator<T, F, Fut>(
    core: &CoreState,
    group_id: &str,
    f: F,
) -> Result<T, ResponseError>
where
    F: FnOnce(Rc<Shard>, TopicPartition, Limits) -> Fut + Send + 'static,
    Fut: Future<Output = T> + 'static,
    T: Send + 'static,
{
    let Some((tp, owner)) = group::coordinator_of(core, group_id) else {
        return Err(ResponseError::CoordinatorNotAvailable);
    };
    // The coordinator of a group is the leader of its offsets partition.
    match core.topics().role(&tp.topic, tp.partition) {
        Role::Leader => {}
        Role::NotLeader(NO_LEADER) | Role::Unknown => {
            return Err(ResponseError::CoordinatorNotAvailable)
        }
        Role::NotLeader(_) => return Err(ResponseError::NotCoordinator),
    }
    let limits = coordinator::limits(core);
    core.shard
        .invoke_on(owner, move |shard| async move {
            // Led and loaded on the owner core (the table above can be ahead
            // of, or behind, the replica's role there).
            Coordinator::current().check(&tp)?;
            Ok(f(shard, tp, limits).await)
        })
        .await
        .map_err(|_| ResponseError::CoordinatorNotAvailable)?
}

thread_local! {
    /// (per-core random prefix, counter) for member ids.
    static MEMBER_IDS: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
}

/// Kafka's member id shape: `<client id>-<uuid>`, unique across restarts.
fn fresh_member_id(client_id: &str) -> String {
    let (mut prefix, counter) = MEMBER_IDS.with(Cell::get);
    if prefix == 0 {
        let mut bytes = [0u8; 8];
        if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
            use std::io::Read;
            let _ = f.read_exact(&mut bytes);
        }
        prefix = u64::from_le_bytes(bytes) | 1;
    }
    MEMBER_IDS.with(|c| c.set((prefix, counter + 1)));
    let id = uuid::Uuid::from_u64_pair(prefix, (now_ms() as u64) << 20 ^ counter);
    format!("{client_id}-{id}")
}

pub async fn join_group(
    core: &CoreState,
    request: JoinGroupRequest,
    version: i16,
    client_id: String,
    client_host: String,
) -> JoinGroupResponse {
    let group_id = request.group_id.0.to_string();
    let member_id = request.member_id.to_string();
    let result = if group_id.is_empty() {
        JoinResult::error(ResponseError::InvalidGroupId, &member_id)
    } else {
        let join = JoinRequest {
            member_id: member_id.clone(),
            group_instance_id: request.group_instance_id.as_ref().map(|s| s.to_string()),
            fresh_member_id: fresh_member_id(&client_id),
            client_id,
            client_host,
            session_timeout_ms: request.session_timeout_ms,
            // v0 has no rebalance timeout: Kafka uses the session timeout.
            rebalance_timeout_ms: if version >= 1 {
                request.rebalance_timeout_ms
            } else {
                request.session_timeout_ms
            },
            protocol_type: request.protocol_type.to_string(),
            protocols: request
                .protocols
                .iter()
                .map(|p| Protocol {
                    name: p.name.to_string(),
                    metadata: p.metadata.clone(),
                })
                .collect(),
            require_known_member_id: version >= 4,
        };
        let gid = group_id.clone();
        on_coordinator(core, &group_id, move |shard, tp, limits| async move {
            Coordinator::current()
                .join(&shard, tp, gid, limits, join)
                .await
        })
        .await
        .unwrap_or_else(|e| JoinResult::error(e, &member_id))
    };
    let mut response = JoinGroupResponse::default()
        .with_error_code(code(result.error))
        .with_generation_id(result.generation_id)
        .with_leader(str_bytes(result.leader))
        .with_member_id(str_bytes(result.member_id));
    // Nullable from v7; before that an empty string stands for "none".
    response.protocol_name = match (result.protocol_name, version >= 7) {
        (Some(name), _) => Some(str_bytes(name)),
        (None, true) => None,
        (None, false) => Some(str_bytes("")),
    };
    if version >= 7 {
        response.protocol_type = result.protocol_type.map(str_bytes);
    }
    response.members = result
        .members
        .into_iter()
        .map(|m| {
            let member = JoinGroupResponseMember::default()
                .with_member_id(str_bytes(m.member_id))
                .with_metadata(m.metadata);
            if version >= 5 {
                member.with_group_instance_id(m.group_instance_id.map(str_bytes))
            } else {
                member
            }
        })
        .collect();
    response
}

pub async fn sync_group(
    core: &CoreState,
    request: SyncGroupRequest,
    version: i16,
) -> SyncGroupResponse {
    let group_id = request.group_id.0.to_string();
    let result = if group_id.is_empty() {
        skiff_coordinator::group::state::SyncResult::error(ResponseError::InvalidGroupId)
    } else {
        let member_id = request.member_id.to_string();
        let instance = request.group_instance_id.as_ref().map(|s| s.to_string());
        let protocol = (
            request.protocol_type.as_ref().map(|s| s.to_string()),
            request.protocol_name.as_ref().map(|s| s.to_string()),
        );
        let assignments: Vec<(String, Bytes)> = request
            .assignments
            .iter()
            .map(|a| (a.member_id.to_string(), a.assignment.clone()))
            .collect();
        let generation_id = request.generation_id;
        let gid = group_id.clone();
        on_coordinator(core, &group_id, move |shard, _, _| async move {
            Coordinator::current()
                .sync(
                    &shard,
                    gid,
                    member_id,
                    generation_id,
                    instance,
                    protocol,
                    assignments,
                )
                .await
        })
        .await
        .unwrap_or_else(skiff_coordinator::group::state::SyncResult::error)
    };
    let response = SyncGroupResponse::default()
        .with_error_code(code(result.error))
        .with_assignment(result.assignment);
    if version >= 5 {
        response
            .with_protocol_type(result.protocol_type.map(str_bytes))
            .with_protocol_name(result.protocol_name.map(str_bytes))
    } else {
        response
    }
}

pub async fn heartbeat(core: &CoreState, request: HeartbeatRequest) -> HeartbeatResponse {
    let group_id = request.group_id.0.to_string();
    let error = if group_id.is_empty() {
        Some(ResponseError::InvalidGroupId)
    } else {
        let member_id = request.member_id.to_string();
        let instance = request.group_instance_id.as_ref().map(|s| s.to_string());
        let generation_id = request.generation_id;
        let gid = group_id.clone();
        on_coordinator(core, &group_id, move |_, _, _| async move {
            Coordinator::current().heartbeat(&gid, &member_id, generation_id, instance.as_deref())
        })
        .await
        .unwrap_or_else(Some)
    };
    HeartbeatResponse::default().with_error_code(code(error))
}

pub async fn leave_group(
    core: &CoreState,
    request: LeaveGroupRequest,
    version: i16,
) -> LeaveGroupResponse {
    let group_id = request.group_id.0.to_string();
    let leaving: Vec<(String, Option<String>)> = if version >= 3 {
        request
            .members
            .iter()
            .map(|m| {
                (
                    m.member_id.to_string(),
                    m.group_instance_id.as_ref().map(|s| s.to_string()),
                )
            })
            .collect()
    } else {
        vec![(request.member_id.to_string(), None)]
    };
    let errors: Result<Vec<Option<ResponseError>>, ResponseError> = if group_id.is_empty() {
        Err(ResponseError::InvalidGroupId)
    } else {
        let gid = group_id.clone();
        let l = leaving.clone();
        on_coordinator(core, &group_id, move |shard, _, _| async move {
            Coordinator::current().leave(&shard, gid, l).await
        })
        .await
    };
    match errors {
        Err(e) => LeaveGroupResponse::default().with_error_code(e.code()),
        Ok(errors) if version < 3 => {
            LeaveGroupResponse::default().with_error_code(code(errors.first().copied().flatten()))
        }
        Ok(errors) => LeaveGroupResponse::default().with_members(
            leaving
                .into_iter()
                .zip(errors)
                .map(|((member_id, instance), error)| {
                    MemberResponse::default()
                        .with_member_id(str_bytes(member_id))
                        .with_group_instance_id(instance.map(str_bytes))
                        .with_error_code(code(error))
                })
                .collect(),
        ),
    }
}

pub async fn offset_commit(
    core: &CoreState,
    request: OffsetCommitRequest,
    version: i16,
) -> OffsetCommitResponse {
    let group_id = request.group_id.0.to_string();
    let wanted = request.topics.iter().flat_map(|t| {
        t.partitions.iter().map(move |p| Wanted {
            topic: t.name.0.to_string(),
            partition: p.partition_index,
            offset: p.committed_offset,
            leader_epoch: if version >= 6 {
                p.committed_leader_epoch
            } else {
                -1
            },
            metadata: p.committed_metadata.as_ref().map(|m| m.to_string()),
        })
    });
    let (decided, offsets) = check_offsets(core, wanted, |_| None);
    // Kafka accepts an empty group id here (a legacy of ZooKeeper offsets).
    let gid = group_id.clone();
    let member_id = request.member_id.to_string();
    let instance = request.group_instance_id.as_ref().map(|s| s.to_string());
    let generation_id = request.generation_id_or_member_epoch;
    let outcome: Result<(), ResponseError> =
        on_coordinator(core, &group_id, move |shard, tp, limits| async move {
            Coordinator::current()
                .commit(
                    &shard,
                    tp,
                    gid,
                    limits,
                    member_id,
                    generation_id,
                    instance,
                    offsets,
                )
                .await
        })
        .await
        .and_then(|r| r);
    let response = by_topic(
        decided,
        outcome.err(),
        |partition, error| {
            OffsetCommitResponsePartition::default()
                .with_partition_index(partition)
                .with_error_code(code(error))
        },
        |name, partitions| {
            OffsetCommitResponseTopic::default()
                .with_name(TopicName(str_bytes(name)))
                .with_partitions(partitions)
        },
        |t| t.name.0.as_str(),
        |t, p| t.partitions.push(p),
    );
    OffsetCommitResponse::default().with_topics(response)
}

/// One partition's offset as an OffsetCommit or TxnOffsetCommit carries it.
struct Wanted {
    topic: String,
    partition: i32,
    offset: i64,
    leader_epoch: i32,
    metadata: Option<String>,
}

/// Per partition: a refusal decided here (`refuse_topic`'s, an unknown
/// partition, metadata too large), or the offset to commit.
#[allow(clippy::type_complexity)]
fn check_offsets(
    core: &CoreState,
    wanted: impl Iterator<Item = Wanted>,
    refuse_topic: impl Fn(&str) -> Option<ResponseError>,
) -> (
    Vec<(String, i32, Option<ResponseError>)>,
    Vec<(String, i32, OffsetValue)>,
) {
    let topics = core.topics();
    let now = now_ms();
    let mut decided = Vec::new();
    let mut offsets = Vec::new();
    for w in wanted {
        let metadata = w.metadata.unwrap_or_default();
        let refusal = refuse_topic(&w.topic).or_else(|| {
            if !topics.has_partition(&w.topic, w.partition) {
                Some(ResponseError::UnknownTopicOrPartition)
            } else if metadata.len() > coordinator::OFFSET_METADATA_BYTES_MAX {
                Some(ResponseError::OffsetMetadataTooLarge)
            } else {
                None
            }
        });
        if refusal.is_none() {
            offsets.push((
                w.topic.clone(),
                w.partition,
                OffsetValue {
                    offset: w.offset,
                    leader_epoch: w.leader_epoch,
                    metadata,
                    commit_timestamp_ms: now,
                },
            ));
        }
        decided.push((w.topic, w.partition, refusal));
    }
    (decided, offsets)
}

/// A commit's answer grouped by topic in request order: each partition's
/// own refusal, else the commit's outcome.
fn by_topic<T, P>(
    decided: Vec<(String, i32, Option<ResponseError>)>,
    outcome: Option<ResponseError>,
    partition: impl Fn(i32, Option<ResponseError>) -> P,
    topic: impl Fn(String, Vec<P>) -> T,
    name_of: impl Fn(&T) -> &str,
    push: impl Fn(&mut T, P),
) -> Vec<T> {
    let mut out: Vec<T> = Vec::new();
    for (name, index, refusal) in decided {
        let entry = partition(index, refusal.or(outcome));
        match out.last_mut() {
            Some(last) if name_of(last) == name => push(last, entry),
            _ => out.push(topic(name, vec![entry])),
        }
    }
    out
}

/// TxnOffsetCommit: a transactional producer's offsets for a group, checked
/// as OffsetCommit's are and stored pending until the transaction's marker
/// reaches the group's offsets partition (the partition AddOffsetsToTxn
/// added to the transaction).
pub async fn txn_offset_commit(
    core: &CoreState,
    access: &super::authz::Access,
    request: TxnOffsetCommitRequest,
) -> TxnOffsetCommitResponse {
    let group_id = request.group_id.0.to_string();
    // Kafka's order: the transactional id (WRITE), the group (READ), then
    // each topic (READ).
    let whole = super::authz::transactional_id(access, &request.transactional_id).or_else(|| {
        (!access.unrestricted() && !access.group(skiff_security::AclOperation::Read, &group_id))
            .then_some(ResponseError::GroupAuthorizationFailed)
    });
    let wanted = request.topics.iter().flat_map(|t| {
        t.partitions.iter().map(move |p| Wanted {
            topic: t.name.0.to_string(),
            partition: p.partition_index,
            offset: p.committed_offset,
            leader_epoch: p.committed_leader_epoch,
            metadata: p.committed_metadata.as_ref().map(|m| m.to_string()),
        })
    });
    let (decided, mut offsets) = check_offsets(core, wanted, |topic| {
        whole.or_else(|| {
            (!access.unrestricted() && !access.topic(skiff_security::AclOperation::Read, topic))
                .then_some(ResponseError::TopicAuthorizationFailed)
        })
    });
    if whole.is_some() {
        offsets.clear();
    }
    let gid = group_id.clone();
    let member_id = request.member_id.to_string();
    let instance = request.group_instance_id.as_ref().map(|s| s.to_string());
    let generation_id = request.generation_id;
    let producer = (request.producer_id.0, request.producer_epoch);
    let outcome: Result<(), ResponseError> =
        on_coordinator(core, &group_id, move |shard, tp, limits| async move {
            Coordinator::current()
                .txn_commit(
                    &shard,
                    tp,
                    gid,
                    limits,
                    producer,
                    member_id,
                    generation_id,
                    instance,
                    offsets,
                )
                .await
        })
        .await
        .and_then(|r| r);
    let response = by_topic(
        decided,
        outcome.err(),
        |partition, error| {
            TxnOffsetCommitResponsePartition::default()
                .with_partition_index(partition)
                .with_error_code(code(error))
        },
        |name, partitions| {
            TxnOffsetCommitResponseTopic::default()
                .with_name(TopicName(str_bytes(name)))
                .with_partitions(partitions)
        },
        |t| t.name.0.as_str(),
        |t, p| t.partitions.push(p),
    );
    TxnOffsetCommitResponse::default().with_topics(response)
}

use crate::group::coordinator::FetchedOffsets as Fetched;

/// The committed offsets, and (KIP-447's `require_stable`) the partitions
/// whose offsets a transaction has written but not yet ended: those are
/// answered UNSTABLE_OFFSET_COMMIT, which clients retry, so a consumer
/// never starts from an offset a commit in flight is about to move.
async fn fetch_group(
    core: &CoreState,
    group_id: String,
    wanted: Option<Vec<(String, Vec<i32>)>>,
    require_stable: bool,
) -> Result<(Fetched, BTreeSet<(String, i32)>), ResponseError> {
    let gid = group_id.clone();
    on_coordinator(core, &group_id, move |_, _, _| async move {
        let coordinator = Coordinator::current();
        let unstable = if require_stable {
            coordinator.pending_partitions(&gid)
        } else {
            BTreeSet::new()
        };
        (coordinator.fetch_offsets(&gid, wanted), unstable)
    })
    .await
}

pub async fn offset_fetch(
    core: &CoreState,
    request: OffsetFetchRequest,
    version: i16,
) -> OffsetFetchResponse {
    if version >= 8 {
        let mut groups = Vec::with_capacity(request.groups.len());
        for g in request.groups {
            let wanted = g.topics.map(|ts| {
                ts.into_iter()
                    .map(|t| (t.name.0.to_string(), t.partition_indexes))
                    .collect()
            });
            let group_id = g.group_id.0.to_string();
            let fetched = fetch_group(core, group_id.clone(), wanted, request.require_stable).await;
            let mut out =
                OffsetFetchResponseGroup::default().with_group_id(GroupId(str_bytes(group_id)));
            match fetched {
                Err(e) => out.error_code = e.code(),
                Ok((topics, unstable)) => {
                    out.topics = topics
                        .into_iter()
                        .map(|(name, partitions)| {
                            let partitions = partitions
                                .into_iter()
                                .map(|(p, v)| {
                                    if unstable.contains(&(name.clone(), p)) {
                                        return OffsetFetchResponsePartitions::default()
                                            .with_partition_index(p)
                                            .with_committed_offset(-1)
                                            .with_committed_leader_epoch(-1)
                                            .with_error_code(UNSTABLE.code());
                                    }
                                    let (offset, epoch, metadata) = fetched_fields(v);
                                    OffsetFetchResponsePartitions::default()
                                        .with_partition_index(p)
                                        .with_committed_offset(offset)
                                        .with_committed_leader_epoch(epoch)
                                        .with_metadata(Some(str_bytes(metadata)))
                                })
                                .collect();
                            OffsetFetchResponseTopics::default()
                                .with_name(TopicName(str_bytes(name)))
                                .with_partitions(partitions)
                        })
                        .collect()
                }
            }
            groups.push(out);
        }
        return OffsetFetchResponse::default().with_groups(groups);
    }
    let wanted = request.topics.map(|ts| {
        ts.into_iter()
            .map(|t| (t.name.0.to_string(), t.partition_indexes))
            .collect()
    });
    let mut response = OffsetFetchResponse::default();
    let require_stable = version >= 7 && request.require_stable;
    match fetch_group(core, request.group_id.0.to_string(), wanted, require_stable).await {
        Err(e) if version >= 2 => response.error_code = e.code(),
        Err(e) => {
            // v1 has no top-level error: every partition carries it, and
            // "all partitions" (null) does not exist before v2.
            tracing::debug!(error = ?e, "offset fetch v1 failed");
        }
        Ok((topics, unstable)) => {
            response.topics = topics
                .into_iter()
                .map(|(name, partitions)| {
                    let unstable_here: BTreeSet<i32> = unstable
                        .iter()
                        .filter(|(t, _)| *t == name)
                        .map(|(_, p)| *p)
                        .collect();
                    OffsetFetchResponseTopic::default()
                        .with_name(TopicName(str_bytes(name)))
                        .with_partitions(
                            partitions
                                .into_iter()
                                .map(|(p, v)| {
                                    if unstable_here.contains(&p) {
                                        return OffsetFetchResponsePartition::default()
                                            .with_partition_index(p)
                                            .with_committed_offset(-1)
                                            .with_error_code(UNSTABLE.code());
                                    }
                                    let (offset, epoch, metadata) = fetched_fields(v);
                                    let partition = OffsetFetchResponsePartition::default()
                                        .with_partition_index(p)
                                        .with_committed_offset(offset)
                                        .with_metadata(Some(str_bytes(metadata)));
                                    if version >= 5 {
                                        partition.with_committed_leader_epoch(epoch)
                                    } else {
                                        partition
                                    }
                                })
                                .collect(),
                        )
                })
                .collect();
        }
    }
    response
}

/// KIP-447: offsets of a transaction not yet ended (the client retries).
const UNSTABLE: ResponseError = ResponseError::UnstableOffsetCommit;

/// (offset, leader epoch, metadata); -1 / -1 / "" without a commit.
fn fetched_fields(value: Option<OffsetValue>) -> (i64, i32, String) {
    match value {
        Some(v) => (v.offset, v.leader_epoch, v.metadata),
        None => (-1, -1, String::new()),
    }
}

pub async fn list_groups(
    core: &CoreState,
    request: ListGroupsRequest,
    version: i16,
) -> ListGroupsResponse {
    let mut listed = Vec::new();
    for target in 0..core.shard.table().shards() {
        match core
            .shard
            .invoke_on(target, |_| async { Coordinator::current().list() })
            .await
        {
            Ok(groups) => listed.extend(groups),
            Err(_) => {
                return ListGroupsResponse::default()
                    .with_error_code(ResponseError::CoordinatorNotAvailable.code())
            }
        }
    }
    let states: Vec<String> = request
        .states_filter
        .iter()
        .map(|s| s.to_lowercase())
        .collect();
    let types: Vec<String> = request
        .types_filter
        .iter()
        .map(|s| s.to_lowercase())
        .collect();
    listed.retain(|g| {
        (states.is_empty() || states.contains(&g.state.to_lowercase()))
            && (types.is_empty() || types.iter().any(|t| t == "classic"))
    });
    listed.sort_by(|a, b| a.group_id.cmp(&b.group_id));
    ListGroupsResponse::default().with_groups(
        listed
            .into_iter()
            .map(|g| {
                let mut out = ListedGroup::default()
                    .with_group_id(GroupId(str_bytes(g.group_id)))
                    .with_protocol_type(str_bytes(g.protocol_type));
                if version >= 4 {
                    out.group_state = str_bytes(g.state);
                }
                if version >= 5 {
                    out.group_type = str_bytes("classic");
                }
                out
            })
            .collect(),
    )
}

pub async fn describe_groups(
    core: &CoreState,
    request: DescribeGroupsRequest,
    version: i16,
) -> DescribeGroupsResponse {
    let mut groups = Vec::with_capacity(request.groups.len());
    for group_id in request.groups {
        let id = group_id.0.to_string();
        let gid = id.clone();
        let summary = on_coordinator(core, &id, move |_, _, _| async move {
            Coordinator::current().describe(&gid)
        })
        .await;
        groups.push(described(group_id, summary, version));
    }
    DescribeGroupsResponse::default().with_groups(groups)
}

fn described(
    group_id: GroupId,
    summary: Result<Option<GroupSummary>, ResponseError>,
    version: i16,
) -> DescribedGroup {
    let out = DescribedGroup::default().with_group_id(group_id);
    match summary {
        Err(e) => out
            .with_error_code(e.code())
            .with_group_state(str_bytes("")),
        // Kafka describes an unknown group as Dead, without an error.
        Ok(None) => out.with_group_state(str_bytes("Dead")),
        Ok(Some(s)) => out
            .with_group_state(str_bytes(s.state))
            .with_protocol_type(str_bytes(s.protocol_type))
            .with_protocol_data(str_bytes(s.protocol))
            .with_members(
                s.members
                    .into_iter()
                    .map(|m| {
                        let member = DescribedGroupMember::default()
                            .with_member_id(str_bytes(m.member_id))
                            .with_client_id(str_bytes(m.client_id))
                            .with_client_host(str_bytes(m.client_host))
                            .with_member_metadata(m.metadata)
                            .with_member_assignment(m.assignment);
                        if version >= 4 {
                            member.with_group_instance_id(m.group_instance_id.map(str_bytes))
                        } else {
                            member
                        }
                    })
                    .collect(),
            ),
    }
}

pub async fn delete_groups(core: &CoreState, request: DeleteGroupsRequest) -> DeleteGroupsResponse {
    let mut results = Vec::with_capacity(request.groups_names.len());
    for group_id in request.groups_names {
        let id = group_id.0.to_string();
        let gid = id.clone();
        let outcome = on_coordinator(core, &id, move |shard, _, _| async move {
            Coordinator::current().delete(&shard, gid).await
        })
        .await
        .and_then(|r| r);
        results.push(
            DeletableGroupResult::default()
                .with_group_id(group_id)
                .with_error_code(code(outcome.err())),
        );
    }
    DeleteGroupsResponse::default().with_results(results)
}

/// OffsetDelete (KIP-496): deletes a group's committed offsets for the listed
/// partitions, by Kafka's rules (`Coordinator::delete_offsets`).
pub async fn offset_delete(core: &CoreState, request: OffsetDeleteRequest) -> OffsetDeleteResponse {
    let id = request.group_id.0.to_string();
    let mut asked = Vec::new();
    for t in &request.topics {
        for p in &t.partitions {
            asked.push((t.name.0.to_string(), p.partition_index));
        }
    }
    let gid = id.clone();
    let outcome = on_coordinator(core, &id, move |shard, _, _| async move {
        Coordinator::current()
            .delete_offsets(&shard, gid, asked)
            .await
    })
    .await
    .and_then(|r| r);
    let results = match outcome {
        Err(e) => return OffsetDeleteResponse::default().with_error_code(e.code()),
        Ok(results) => results,
    };
    let mut topics: Vec<OffsetDeleteResponseTopic> = Vec::new();
    for (topic, partition, error) in results {
        let p = OffsetDeleteResponsePartition::default()
            .with_partition_index(partition)
            .with_error_code(code(error));
        match topics.last_mut() {
            Some(t) if t.name.0.as_str() == topic => t.partitions.push(p),
            _ => topics.push(
                OffsetDeleteResponseTopic::default()
                    .with_name(TopicName(str_bytes(topic)))
                    .with_partitions(vec![p]),
            ),
        }
    }
    OffsetDeleteResponse::default().with_topics(topics)
}
