//! Kafka API handlers: one module per API family. `Request::decode` runs on the
//! connection's reader (a frame that does not decode closes the connection);
//! `handle` runs each request as its own task and returns the encoded response
//! (`None` for acks=0 produce, which Kafka never answers).

mod admin;
mod delete_records;
mod describe;
mod elect_leaders;
mod fetch;
mod find_coordinator;
mod groups;
mod init_producer_id;
mod list_offsets;
mod metadata;
mod offsets_for_leader_epoch;
pub mod produce;
mod reassign;

use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::time::Instant;

use bytes::Bytes;
use kafka_protocol::messages::{ApiKey, RequestHeader, RequestKind, ResponseKind};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use skiff_engine::LogError;
use skiff_protocol::response::{encode_response, ResponseFrame};
use skiff_protocol::splice::Splices;
use skiff_protocol::{request, versions};

use crate::state::CoreState;

pub struct Request {
    pub header: RequestHeader,
    pub api_key: ApiKey,
    pub version: i16,
    pub body: Option<RequestKind>,
}

impl Request {
    /// Decodes a frame. Errors are reasons to close the connection.
    pub fn decode(mut frame: Bytes) -> Result<Request, String> {
        let (header, api_key) = request::decode_header(&mut frame).map_err(|e| e.to_string())?;
        let version = header.request_api_version;
        if !versions::accepts(api_key, version) {
            // ApiVersions answers an unsupported version with the supported list;
            // for anything else Kafka closes the connection.
            if api_key == ApiKey::ApiVersions {
                return Ok(Request {
                    header,
                    api_key,
                    version,
                    body: None,
                });
            }
            return Err(format!(
                "unsupported version {version} of {api_key:?} (correlation id {})",
                header.correlation_id
            ));
        }
        let body = request::decode_body(api_key, version, &mut frame).map_err(|e| {
            format!(
                "malformed {api_key:?} v{version} request (correlation id {}): {e}",
                header.correlation_id
            )
        })?;
        Ok(Request {
            header,
            api_key,
            version,
            body: Some(body),
        })
    }
}

/// Starts a request on the connection's reader and returns the rest of its work,
/// to run as a task. Produce does its appends here, so the appends of pipelined
/// requests happen in request order (Kafka's per-connection ordering); every
/// other API does all its work in the returned future.
pub async fn start(
    core: Rc<CoreState>,
    request: Request,
    client_host: Rc<str>,
) -> Pin<Box<dyn Future<Output = Option<ResponseFrame>>>> {
    let Request {
        header,
        api_key,
        version,
        body,
    } = request;
    core.metrics.request(api_key);
    match body {
        Some(RequestKind::Produce(r)) => {
            let started = Instant::now();
            let acks = r.acks;
            let pending = produce::append_phase(&core, r, version).await;
            Box::pin(async move {
                let response = ResponseKind::Produce(pending.finish().await?);
                core.metrics.produce_latency(acks, started.elapsed());
                core.metrics.response(api_key, &response);
                encode(
                    header.correlation_id,
                    api_key,
                    version,
                    &response,
                    &Splices::default(),
                )
            })
        }
        body => Box::pin(handle(
            core,
            Request {
                header,
                api_key,
                version,
                body,
            },
            client_host,
        )),
    }
}

fn encode(
    correlation_id: i32,
    api_key: ApiKey,
    version: i16,
    response: &ResponseKind,
    splices: &Splices,
) -> Option<ResponseFrame> {
    match encode_response(correlation_id, api_key, version, response, splices) {
        Ok(frame) => Some(frame),
        Err(e) => {
            tracing::error!(?api_key, version, error = %e, "encoding the response failed");
            None
        }
    }
}

async fn handle(
    core: Rc<CoreState>,
    request: Request,
    client_host: Rc<str>,
) -> Option<ResponseFrame> {
    let Request {
        header,
        api_key,
        mut version,
        body,
    } = request;
    let started = Instant::now();
    if body.is_none() {
        // An ApiVersions version we do not know: answer in v0, as Kafka does, so
        // the client can read the supported range and retry.
        version = 0;
    }
    let mut splices = Splices::default();
    let response = match body {
        None => ResponseKind::ApiVersions(versions::api_versions_response(Some(
            ResponseError::UnsupportedVersion,
        ))),
        Some(RequestKind::ApiVersions(_)) => {
            ResponseKind::ApiVersions(versions::api_versions_response(None))
        }
        Some(RequestKind::Metadata(r)) => {
            ResponseKind::Metadata(metadata::handle(&core, r, version).await)
        }
        Some(RequestKind::Fetch(r)) => {
            ResponseKind::Fetch(fetch::handle(&core, r, version, &mut splices).await)
        }
        Some(RequestKind::ListOffsets(r)) => {
            ResponseKind::ListOffsets(list_offsets::handle(&core, r, version).await)
        }
        Some(RequestKind::CreateTopics(r)) => {
            ResponseKind::CreateTopics(admin::create_topics(&core, r, version).await)
        }
        Some(RequestKind::DeleteTopics(r)) => {
            ResponseKind::DeleteTopics(admin::delete_topics(&core, r, version).await)
        }
        Some(RequestKind::CreatePartitions(r)) => {
            ResponseKind::CreatePartitions(admin::create_partitions(&core, r).await)
        }
        Some(RequestKind::ElectLeaders(r)) => {
            ResponseKind::ElectLeaders(elect_leaders::handle(&core, r, version).await)
        }
        Some(RequestKind::AlterPartitionReassignments(r)) => {
            ResponseKind::AlterPartitionReassignments(reassign::alter(&core, r, version).await)
        }
        Some(RequestKind::ListPartitionReassignments(r)) => {
            ResponseKind::ListPartitionReassignments(reassign::list(&core, r))
        }
        Some(RequestKind::UnregisterBroker(r)) => {
            ResponseKind::UnregisterBroker(reassign::unregister_broker(&core, r).await)
        }
        Some(RequestKind::DescribeLogDirs(r)) => {
            ResponseKind::DescribeLogDirs(describe::describe_log_dirs(&core, r, version).await)
        }
        Some(RequestKind::DescribeProducers(r)) => {
            ResponseKind::DescribeProducers(describe::describe_producers(&core, r).await)
        }
        Some(RequestKind::DescribeCluster(r)) => {
            ResponseKind::DescribeCluster(describe::describe_cluster(&core, &r, version))
        }
        Some(RequestKind::DescribeQuorum(r)) => {
            ResponseKind::DescribeQuorum(describe::describe_quorum(&core, r, version).await)
        }
        Some(RequestKind::DescribeConfigs(r)) => {
            ResponseKind::DescribeConfigs(admin::describe_configs(&core, r, version))
        }
        Some(RequestKind::AlterConfigs(r)) => {
            ResponseKind::AlterConfigs(admin::alter_configs(&core, r).await)
        }
        Some(RequestKind::IncrementalAlterConfigs(r)) => {
            ResponseKind::IncrementalAlterConfigs(admin::incremental_alter_configs(&core, r).await)
        }
        Some(RequestKind::DeleteRecords(r)) => {
            ResponseKind::DeleteRecords(delete_records::handle(&core, r).await)
        }
        Some(RequestKind::OffsetForLeaderEpoch(r)) => {
            ResponseKind::OffsetForLeaderEpoch(offsets_for_leader_epoch::handle(&core, r).await)
        }
        Some(RequestKind::FindCoordinator(r)) => {
            ResponseKind::FindCoordinator(find_coordinator::handle(&core, r, version).await)
        }
        Some(RequestKind::JoinGroup(r)) => {
            let client_id = header.client_id.as_deref().unwrap_or_default().to_string();
            ResponseKind::JoinGroup(
                groups::join_group(&core, r, version, client_id, client_host.to_string()).await,
            )
        }
        Some(RequestKind::SyncGroup(r)) => {
            ResponseKind::SyncGroup(groups::sync_group(&core, r, version).await)
        }
        Some(RequestKind::Heartbeat(r)) => {
            ResponseKind::Heartbeat(groups::heartbeat(&core, r).await)
        }
        Some(RequestKind::LeaveGroup(r)) => {
            ResponseKind::LeaveGroup(groups::leave_group(&core, r, version).await)
        }
        Some(RequestKind::OffsetCommit(r)) => {
            ResponseKind::OffsetCommit(groups::offset_commit(&core, r, version).await)
        }
        Some(RequestKind::OffsetFetch(r)) => {
            ResponseKind::OffsetFetch(groups::offset_fetch(&core, r, version).await)
        }
        Some(RequestKind::ListGroups(r)) => {
            ResponseKind::ListGroups(groups::list_groups(&core, r, version).await)
        }
        Some(RequestKind::DescribeGroups(r)) => {
            ResponseKind::DescribeGroups(groups::describe_groups(&core, r, version).await)
        }
        Some(RequestKind::OffsetDelete(r)) => {
            ResponseKind::OffsetDelete(groups::offset_delete(&core, r).await)
        }
        Some(RequestKind::DeleteGroups(r)) => {
            ResponseKind::DeleteGroups(groups::delete_groups(&core, r).await)
        }
        Some(RequestKind::InitProducerId(r)) => {
            ResponseKind::InitProducerId(init_producer_id::handle(&core, r))
        }
        Some(other) => {
            // versions::accepts only lets through what is matched above (and
            // Produce, which `start` handles).
            tracing::error!(?api_key, "no handler for {other:?}");
            return None;
        }
    };
    if api_key == ApiKey::Fetch {
        core.metrics.fetch_latency(started.elapsed());
    }
    core.metrics.response(api_key, &response);
    encode(header.correlation_id, api_key, version, &response, &splices)
}

/// The Kafka error code for an engine error.
pub fn error_code(e: &LogError) -> ResponseError {
    match e {
        LogError::InvalidBatch(_) => ResponseError::CorruptMessage,
        LogError::BatchTooLarge { .. } => ResponseError::MessageTooLarge,
        LogError::OffsetOutOfRange { .. } => ResponseError::OffsetOutOfRange,
        LogError::UnknownPartition(_) => ResponseError::UnknownTopicOrPartition,
        LogError::NonContiguousAppend { .. } => ResponseError::InvalidRecord,
        LogError::PartitionExists(_) => ResponseError::TopicAlreadyExists,
        LogError::Io { .. }
        | LogError::Offline(_)
        | LogError::Corrupt(_)
        | LogError::Recovery(_)
        | LogError::Checkpoint { .. }
        | LogError::DataDir(_) => ResponseError::KafkaStorageError,
        LogError::BadPartitionDir(_) | LogError::SnapshotNotFlushed { .. } => {
            ResponseError::KafkaStorageError
        }
        LogError::RuntimeStopped
        | LogError::FencedLeaderEpoch { .. }
        | LogError::StaleReplicaEpoch { .. } => ResponseError::NotLeaderOrFollower,
    }
}

pub fn str_bytes(s: impl Into<String>) -> StrBytes {
    StrBytes::from_string(s.into())
}

/// Unix time in milliseconds.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Whether this node serves `topic`/`partition` as its leader: the leader
/// epoch if so, else UNKNOWN_TOPIC_OR_PARTITION (no such partition) or
/// NOT_LEADER_OR_FOLLOWER (another node leads it, or nobody does yet), on
/// which clients refresh their metadata. With `current_leader_epoch` >= 0
/// (KIP-320: the epoch the client believes in) an older epoch is
/// FENCED_LEADER_EPOCH (the client refreshes) and a newer one
/// UNKNOWN_LEADER_EPOCH (this node has not seen the election yet); -1 skips
/// that check. One table lookup.
pub fn check_leader_at(
    table: &crate::topics::TopicTable,
    topic: &str,
    partition: i32,
    current_leader_epoch: i32,
) -> Result<i32, ResponseError> {
    let Some(a) = table.get(topic).and_then(|t| t.partition(partition)) else {
        return Err(ResponseError::UnknownTopicOrPartition);
    };
    if a.leader != table.node_id {
        return Err(ResponseError::NotLeaderOrFollower);
    }
    if current_leader_epoch < 0 || current_leader_epoch == a.leader_epoch {
        Ok(a.leader_epoch)
    } else if current_leader_epoch < a.leader_epoch {
        Err(ResponseError::FencedLeaderEpoch)
    } else {
        Err(ResponseError::UnknownLeaderEpoch)
    }
}

/// `check_leader_at` without an epoch to check.
pub fn check_leader(
    table: &crate::topics::TopicTable,
    topic: &str,
    partition: i32,
) -> Result<(), ResponseError> {
    check_leader_at(table, topic, partition, -1).map(|_| ())
}
