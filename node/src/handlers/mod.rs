//! Kafka API handlers: one module per API family. `Request::decode` runs on the
//! connection's reader (a frame that does not decode closes the connection);
//! `handle` runs each request as its own task and returns the encoded response
//! (`None` for acks=0 produce, which Kafka never answers).

mod acls;
mod admin;
pub mod authz;
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
mod quotas;
mod reassign;
pub mod throttle;
mod txn;

use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::time::Instant;

use bytes::BytesMut;
use kafka_protocol::messages::{ApiKey, RequestHeader, RequestKind, ResponseKind};
use kafka_protocol::ResponseError;
use skiff_protocol::produce::ProduceRequest;
use skiff_protocol::response::{encode_response, ResponseFrame};
use skiff_protocol::splice::Splices;
use skiff_protocol::{request, versions};
use skiff_security::quota::QuotaKey;

use crate::state::CoreState;

pub struct Request {
    pub header: RequestHeader,
    pub api_key: ApiKey,
    pub version: i16,
    /// The body kafka-protocol decoded; `None` for a Produce (see `produce`) and
    /// for an ApiVersions version this node does not know.
    pub body: Option<RequestKind>,
    /// A Produce body, decoded by skiff so its batches are writable pieces of
    /// the frame (`skiff_protocol::produce`).
    pub produce: Option<ProduceRequest>,
}

impl Request {
    /// Decodes a frame. Errors are reasons to close the connection.
    pub fn decode(mut frame: BytesMut) -> Result<Request, String> {
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
                    produce: None,
                });
            }
            return Err(format!(
                "unsupported version {version} of {api_key:?} (correlation id {})",
                header.correlation_id
            ));
        }
        let malformed = |e: skiff_protocol::ProtocolError| {
            format!(
                "malformed {api_key:?} v{version} request (correlation id {}): {e}",
                header.correlation_id
            )
        };
        if api_key == ApiKey::Produce {
            let produce = skiff_protocol::produce::decode(frame, version).map_err(malformed)?;
            return Ok(Request {
                header,
                api_key,
                version,
                body: None,
                produce: Some(produce),
            });
        }
        let body =
            request::decode_body(api_key, version, &mut frame.freeze()).map_err(malformed)?;
        Ok(Request {
            header,
            api_key,
            version,
            body: Some(body),
            produce: None,
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
    session: Rc<crate::security::Session>,
) -> Pin<Box<dyn Future<Output = Option<ResponseFrame>>>> {
    let Request {
        header,
        api_key,
        version,
        body,
        produce,
    } = request;
    core.metrics.request(api_key);
    match (body, produce) {
        (_, Some(mut r)) => {
            let started = Instant::now();
            let acks = r.acks;
            let access = authz::Access::new(core.topics(), session.clone());
            let denied = authz::produce(&access, &mut r);
            // Charged as the request arrives, as Kafka does.
            let throttle = throttle::charge(
                &core,
                &session,
                header.client_id.as_deref().unwrap_or(""),
                QuotaKey::ProducerByteRate,
                || r.records_bytes() as f64,
            );
            let pending = produce::append_phase(&core, r, version).await;
            Box::pin(async move {
                let mut response = pending.finish().await?;
                response.throttle_time_ms = response.throttle_time_ms.max(throttle);
                authz::produce_denied(&mut response, denied);
                let response = ResponseKind::Produce(response);
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
        (body, None) => Box::pin(handle(
            core,
            Request {
                header,
                api_key,
                version,
                body,
                produce: None,
            },
            session,
        )),
    }
}

pub(crate) fn encode(
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
    session: Rc<crate::security::Session>,
) -> Option<ResponseFrame> {
    use skiff_security::AclOperation as Op;
    let access = authz::Access::new(core.topics(), session.clone());
    let client_host = session.client_host.clone();
    let Request {
        header,
        api_key,
        mut version,
        body,
        ..
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
        Some(RequestKind::Metadata(mut r)) => {
            let listed_all = r.topics.is_none();
            let denied = authz::metadata(&access, &mut r);
            let mut response = metadata::handle(&core, r, version, &session.listener).await;
            authz::metadata_denied(&access, &mut response, denied, listed_all);
            ResponseKind::Metadata(response)
        }
        Some(RequestKind::Fetch(mut r)) => match authz::fetch(&access, &mut r, version) {
            authz::FetchGate::Serve(denied) => {
                let follower = r.replica_id.0 >= 0 || r.replica_state.replica_id.0 >= 0;
                let mut response = fetch::handle(&core, r, version, &mut splices).await;
                authz::fetch_denied(&mut response, denied);
                if !follower {
                    let throttle = throttle::charge(
                        &core,
                        &session,
                        header.client_id.as_deref().unwrap_or(""),
                        QuotaKey::ConsumerByteRate,
                        || splices.data_bytes() as f64,
                    );
                    response.throttle_time_ms = response.throttle_time_ms.max(throttle);
                }
                ResponseKind::Fetch(response)
            }
            authz::FetchGate::Refuse => ResponseKind::Fetch(
                kafka_protocol::messages::FetchResponse::default()
                    .with_error_code(ResponseError::ClusterAuthorizationFailed.code()),
            ),
        },
        Some(RequestKind::ListOffsets(mut r)) => {
            let denied = authz::list_offsets(&access, &mut r);
            let mut response = list_offsets::handle(&core, r, version).await;
            authz::list_offsets_denied(&mut response, denied);
            ResponseKind::ListOffsets(response)
        }
        Some(RequestKind::CreateTopics(mut r)) => {
            let denied = authz::create_topics_denied(&access, &mut r);
            let mut response = admin::create_topics(&core, r, version).await;
            authz::create_topics_add(&mut response, denied);
            ResponseKind::CreateTopics(response)
        }
        Some(RequestKind::DeleteTopics(mut r)) => {
            let denied = authz::delete_topics_denied(&access, &mut r);
            let mut response = admin::delete_topics(&core, r, version).await;
            authz::delete_topics_add(&mut response, denied);
            ResponseKind::DeleteTopics(response)
        }
        Some(RequestKind::CreatePartitions(mut r)) => {
            let denied = authz::create_partitions(&access, &mut r);
            let mut response = admin::create_partitions(&core, r).await;
            authz::create_partitions_denied(&mut response, denied);
            ResponseKind::CreatePartitions(response)
        }
        Some(RequestKind::ElectLeaders(r)) if !access.cluster(Op::Alter) => {
            ResponseKind::ElectLeaders(elect_leaders::refused(&r, version))
        }
        Some(RequestKind::ElectLeaders(r)) => {
            ResponseKind::ElectLeaders(elect_leaders::handle(&core, r, version).await)
        }
        Some(RequestKind::AlterPartitionReassignments(_)) if !access.cluster(Op::Alter) => {
            ResponseKind::AlterPartitionReassignments(
                kafka_protocol::messages::AlterPartitionReassignmentsResponse::default()
                    .with_error_code(ResponseError::ClusterAuthorizationFailed.code()),
            )
        }
        Some(RequestKind::AlterPartitionReassignments(r)) => {
            ResponseKind::AlterPartitionReassignments(reassign::alter(&core, r, version).await)
        }
        Some(RequestKind::ListPartitionReassignments(_)) if !access.cluster(Op::Describe) => {
            ResponseKind::ListPartitionReassignments(
                kafka_protocol::messages::ListPartitionReassignmentsResponse::default()
                    .with_error_code(ResponseError::ClusterAuthorizationFailed.code()),
            )
        }
        Some(RequestKind::ListPartitionReassignments(r)) => {
            ResponseKind::ListPartitionReassignments(reassign::list(&core, r))
        }
        Some(RequestKind::UnregisterBroker(_)) if !access.cluster(Op::Alter) => {
            ResponseKind::UnregisterBroker(
                kafka_protocol::messages::UnregisterBrokerResponse::default()
                    .with_error_code(ResponseError::ClusterAuthorizationFailed.code()),
            )
        }
        Some(RequestKind::UnregisterBroker(r)) => {
            ResponseKind::UnregisterBroker(reassign::unregister_broker(&core, r).await)
        }
        Some(RequestKind::DescribeLogDirs(_)) if !access.cluster(Op::Describe) => {
            // v3+ says why; before, Kafka answers no directories.
            let response = kafka_protocol::messages::DescribeLogDirsResponse::default();
            ResponseKind::DescribeLogDirs(if version >= 3 {
                response.with_error_code(ResponseError::ClusterAuthorizationFailed.code())
            } else {
                response
            })
        }
        Some(RequestKind::DescribeLogDirs(r)) => {
            ResponseKind::DescribeLogDirs(describe::describe_log_dirs(&core, r, version).await)
        }
        Some(RequestKind::DescribeProducers(mut r)) => {
            let denied = authz::describe_producers(&access, &mut r);
            let mut response = describe::describe_producers(&core, r).await;
            authz::describe_producers_denied(&mut response, denied);
            ResponseKind::DescribeProducers(response)
        }
        Some(RequestKind::DescribeCluster(_)) if !access.cluster(Op::Describe) => {
            ResponseKind::DescribeCluster(
                kafka_protocol::messages::DescribeClusterResponse::default()
                    .with_error_code(ResponseError::ClusterAuthorizationFailed.code()),
            )
        }
        Some(RequestKind::DescribeCluster(r)) => ResponseKind::DescribeCluster(
            describe::describe_cluster(&core, &r, version, &session.listener),
        ),
        Some(RequestKind::DescribeQuorum(_)) if !access.cluster(Op::Describe) => {
            ResponseKind::DescribeQuorum(
                kafka_protocol::messages::DescribeQuorumResponse::default()
                    .with_error_code(ResponseError::ClusterAuthorizationFailed.code()),
            )
        }
        Some(RequestKind::DescribeQuorum(r)) => {
            ResponseKind::DescribeQuorum(describe::describe_quorum(&core, r, version).await)
        }
        Some(RequestKind::DescribeConfigs(mut r)) => {
            let denied = authz::describe_configs(&access, &mut r);
            let mut response = admin::describe_configs(&core, r, version);
            authz::describe_configs_denied(&mut response, denied);
            ResponseKind::DescribeConfigs(response)
        }
        Some(RequestKind::AlterConfigs(mut r)) => {
            let denied = authz::alter_configs(&access, &mut r.resources, |r| {
                (r.resource_type, r.resource_name.to_string())
            });
            let mut response = admin::alter_configs(&core, r).await;
            authz::alter_configs_denied(&mut response.responses, denied);
            ResponseKind::AlterConfigs(response)
        }
        Some(RequestKind::IncrementalAlterConfigs(mut r)) => {
            let denied = authz::alter_configs(&access, &mut r.resources, |r| {
                (r.resource_type, r.resource_name.to_string())
            });
            let mut response = admin::incremental_alter_configs(&core, r).await;
            authz::incremental_alter_configs_denied(&mut response.responses, denied);
            ResponseKind::IncrementalAlterConfigs(response)
        }
        Some(RequestKind::DeleteRecords(mut r)) => {
            let denied = authz::delete_records(&access, &mut r);
            let mut response = delete_records::handle(&core, r).await;
            authz::delete_records_denied(&mut response, denied);
            ResponseKind::DeleteRecords(response)
        }
        Some(RequestKind::OffsetForLeaderEpoch(mut r)) => {
            let denied = authz::offset_for_leader_epoch(&access, &mut r);
            let mut response = offsets_for_leader_epoch::handle(&core, r).await;
            authz::offset_for_leader_epoch_denied(&mut response, denied);
            ResponseKind::OffsetForLeaderEpoch(response)
        }
        Some(RequestKind::FindCoordinator(mut r)) => {
            let denied = authz::find_coordinator(&access, &mut r, version);
            // Nothing left to look up: the one key (v0-3) or every key was refused.
            let nothing_left = !denied.is_empty() && (version < 4 || r.coordinator_keys.is_empty());
            let mut response = if nothing_left {
                kafka_protocol::messages::FindCoordinatorResponse::default()
            } else {
                find_coordinator::handle(&core, r, version, &session.listener).await
            };
            authz::find_coordinator_denied(&mut response, denied, version);
            ResponseKind::FindCoordinator(response)
        }
        Some(RequestKind::JoinGroup(r)) if !access.group(Op::Read, &r.group_id.0) => {
            ResponseKind::JoinGroup(
                kafka_protocol::messages::JoinGroupResponse::default()
                    .with_error_code(ResponseError::GroupAuthorizationFailed.code())
                    .with_generation_id(-1),
            )
        }
        Some(RequestKind::SyncGroup(r)) if !access.group(Op::Read, &r.group_id.0) => {
            ResponseKind::SyncGroup(
                kafka_protocol::messages::SyncGroupResponse::default()
                    .with_error_code(ResponseError::GroupAuthorizationFailed.code()),
            )
        }
        Some(RequestKind::Heartbeat(r)) if !access.group(Op::Read, &r.group_id.0) => {
            ResponseKind::Heartbeat(
                kafka_protocol::messages::HeartbeatResponse::default()
                    .with_error_code(ResponseError::GroupAuthorizationFailed.code()),
            )
        }
        Some(RequestKind::LeaveGroup(r)) if !access.group(Op::Read, &r.group_id.0) => {
            ResponseKind::LeaveGroup(
                kafka_protocol::messages::LeaveGroupResponse::default()
                    .with_error_code(ResponseError::GroupAuthorizationFailed.code()),
            )
        }
        Some(RequestKind::OffsetCommit(r)) if !access.group(Op::Read, &r.group_id.0) => {
            let mut response = kafka_protocol::messages::OffsetCommitResponse::default();
            authz::offset_commit_denied(
                &mut response,
                authz::offset_commit_all(&r),
                ResponseError::GroupAuthorizationFailed,
            );
            ResponseKind::OffsetCommit(response)
        }
        Some(RequestKind::OffsetCommit(mut r)) => {
            let denied = authz::offset_commit(&access, &mut r);
            let mut response = groups::offset_commit(&core, r, version).await;
            authz::offset_commit_denied(
                &mut response,
                denied,
                ResponseError::TopicAuthorizationFailed,
            );
            ResponseKind::OffsetCommit(response)
        }
        Some(RequestKind::OffsetFetch(mut r)) => {
            let all_topics = authz::offset_fetch_all_topics(&r, version);
            let denied = authz::offset_fetch(&access, &mut r, version);
            let mut response = if version < 8 && !denied.is_empty() {
                kafka_protocol::messages::OffsetFetchResponse::default()
            } else {
                groups::offset_fetch(&core, r, version).await
            };
            authz::offset_fetch_topics(&access, &mut response, &all_topics, version);
            authz::offset_fetch_denied(&mut response, denied, version);
            ResponseKind::OffsetFetch(response)
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
        Some(RequestKind::ListGroups(r)) => {
            let mut response = groups::list_groups(&core, r, version).await;
            authz::list_groups_filter(&access, &mut response);
            ResponseKind::ListGroups(response)
        }
        Some(RequestKind::DescribeGroups(mut r)) => {
            let denied = authz::describe_groups(&access, &mut r);
            let mut response = groups::describe_groups(&core, r, version).await;
            authz::describe_groups_denied(&mut response, denied);
            ResponseKind::DescribeGroups(response)
        }
        Some(RequestKind::OffsetDelete(r)) if !access.group(Op::Delete, &r.group_id.0) => {
            ResponseKind::OffsetDelete(
                kafka_protocol::messages::OffsetDeleteResponse::default()
                    .with_error_code(ResponseError::GroupAuthorizationFailed.code()),
            )
        }
        Some(RequestKind::OffsetDelete(mut r)) => {
            let denied = authz::offset_delete(&access, &mut r);
            let mut response = groups::offset_delete(&core, r).await;
            authz::offset_delete_denied(&mut response, denied);
            ResponseKind::OffsetDelete(response)
        }
        Some(RequestKind::DeleteGroups(mut r)) => {
            let denied = authz::delete_groups(&access, &mut r);
            let mut response = groups::delete_groups(&core, r).await;
            authz::delete_groups_denied(&mut response, denied);
            ResponseKind::DeleteGroups(response)
        }
        Some(RequestKind::CreateAcls(r)) if !access.cluster(Op::Alter) => {
            ResponseKind::CreateAcls(acls::create_acls_refused(&r))
        }
        Some(RequestKind::CreateAcls(r)) => {
            ResponseKind::CreateAcls(acls::create_acls(&core, r).await)
        }
        Some(RequestKind::AlterClientQuotas(r)) if !access.cluster(Op::AlterConfigs) => {
            ResponseKind::AlterClientQuotas(quotas::alter_client_quotas_refused(&r))
        }
        Some(RequestKind::AlterClientQuotas(r)) => {
            ResponseKind::AlterClientQuotas(quotas::alter_client_quotas(&core, r).await)
        }
        Some(RequestKind::DescribeClientQuotas(_)) if !access.cluster(Op::DescribeConfigs) => {
            ResponseKind::DescribeClientQuotas(
                kafka_protocol::messages::DescribeClientQuotasResponse::default()
                    .with_error_code(ResponseError::ClusterAuthorizationFailed.code()),
            )
        }
        Some(RequestKind::DescribeClientQuotas(r)) => {
            ResponseKind::DescribeClientQuotas(quotas::describe_client_quotas(&core, r))
        }
        Some(RequestKind::DescribeAcls(_)) if !access.cluster(Op::Describe) => {
            ResponseKind::DescribeAcls(
                kafka_protocol::messages::DescribeAclsResponse::default()
                    .with_error_code(ResponseError::ClusterAuthorizationFailed.code()),
            )
        }
        Some(RequestKind::DescribeAcls(r)) => {
            ResponseKind::DescribeAcls(acls::describe_acls(&core, r))
        }
        Some(RequestKind::DeleteAcls(r)) if !access.cluster(Op::Alter) => {
            ResponseKind::DeleteAcls(acls::delete_acls_refused(&r))
        }
        Some(RequestKind::DeleteAcls(r)) => {
            ResponseKind::DeleteAcls(acls::delete_acls(&core, r).await)
        }
        Some(RequestKind::DescribeUserScramCredentials(_)) if !access.cluster(Op::Describe) => {
            ResponseKind::DescribeUserScramCredentials(
                kafka_protocol::messages::DescribeUserScramCredentialsResponse::default()
                    .with_error_code(ResponseError::ClusterAuthorizationFailed.code()),
            )
        }
        Some(RequestKind::DescribeUserScramCredentials(r)) => {
            ResponseKind::DescribeUserScramCredentials(acls::describe_user_scram_credentials(
                &core, r,
            ))
        }
        Some(RequestKind::AlterUserScramCredentials(r)) if !access.cluster(Op::Alter) => {
            ResponseKind::AlterUserScramCredentials(acls::alter_user_scram_credentials_refused(&r))
        }
        Some(RequestKind::AlterUserScramCredentials(r)) => ResponseKind::AlterUserScramCredentials(
            acls::alter_user_scram_credentials(&core, r).await,
        ),
        Some(RequestKind::InitProducerId(r)) => match authz::init_producer_id(&access, &r) {
            Some(error) => ResponseKind::InitProducerId(
                kafka_protocol::messages::InitProducerIdResponse::default()
                    .with_error_code(error.code())
                    .with_producer_id(kafka_protocol::messages::ProducerId(-1))
                    .with_producer_epoch(-1),
            ),
            None => ResponseKind::InitProducerId(init_producer_id::handle(&core, r).await),
        },
        Some(RequestKind::AddPartitionsToTxn(r)) => ResponseKind::AddPartitionsToTxn(
            txn::add_partitions_to_txn(&core, &access, r, version).await,
        ),
        Some(RequestKind::AddOffsetsToTxn(r)) => {
            ResponseKind::AddOffsetsToTxn(txn::add_offsets_to_txn(&core, &access, r).await)
        }
        Some(RequestKind::EndTxn(r)) => ResponseKind::EndTxn(txn::end_txn(&core, &access, r).await),
        Some(RequestKind::TxnOffsetCommit(r)) => {
            ResponseKind::TxnOffsetCommit(groups::txn_offset_commit(&core, &access, r).await)
        }
        Some(RequestKind::ListTransactions(r)) => {
            ResponseKind::ListTransactions(txn::list_transactions(&core, &access, r, version).await)
        }
        Some(RequestKind::DescribeTransactions(r)) => {
            ResponseKind::DescribeTransactions(txn::describe_transactions(&core, &access, r).await)
        }
        Some(RequestKind::WriteTxnMarkers(r)) => {
            ResponseKind::WriteTxnMarkers(txn::write_txn_markers(&core, &access, r).await)
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
