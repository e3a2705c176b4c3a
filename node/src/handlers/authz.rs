//! Authorization of requests (issue 17), Kafka's `KafkaApis` rules, decided
//! on the connection's core from its own `Authorizer` (in the core's topic
//! table: no cross-core call).
//!
//! How: before a handler runs, the request loses the topics (or the whole
//! group, or the whole request) the principal may not touch; after it ran,
//! the response gets those back with *_AUTHORIZATION_FAILED. The handlers
//! themselves never see what was refused. With no authorizer configured
//! (`authorizer.class.name` empty, the default) every check passes.
//!
//! The APIs [`covered`] names are checked here (every API skiff serves
//! today); any other API is served to super users only (`server.rs` closes
//! the connection of anyone else), so a new API is closed until its rule is
//! written.

use std::rc::Rc;
use std::sync::Arc;

use kafka_protocol::messages::create_topics_response::CreatableTopicResult;
use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use kafka_protocol::messages::metadata_response::MetadataResponseTopic;
use kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use kafka_protocol::messages::offset_for_leader_epoch_response::{
    EpochEndOffset, OffsetForLeaderTopicResult,
};
use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::{ApiKey, BrokerId, TopicName};
use kafka_protocol::ResponseError;
use skiff_security::{AclOperation as Op, ResourceType};

use crate::security::Session;
use crate::topics::TopicTable;

/// The APIs whose rules are written here (or that need none).
pub fn covered(api_key: ApiKey) -> bool {
    use ApiKey::*;
    matches!(
        api_key,
        ApiVersions
            | SaslHandshake
            | SaslAuthenticate
            | Metadata
            | Produce
            | Fetch
            | ListOffsets
            | OffsetForLeaderEpoch
            | FindCoordinator
            | JoinGroup
            | SyncGroup
            | Heartbeat
            | LeaveGroup
            | OffsetCommit
            | OffsetFetch
            | InitProducerId
            | AddPartitionsToTxn
            | AddOffsetsToTxn
            | EndTxn
            | TxnOffsetCommit
            | WriteTxnMarkers
            | ListTransactions
            | DescribeTransactions
            | CreateTopics
            | DeleteTopics
            | CreateAcls
            | DescribeAcls
            | DeleteAcls
            | AlterUserScramCredentials
            | DescribeUserScramCredentials
            | AlterClientQuotas
            | DescribeClientQuotas
            | DescribeCluster
            | DescribeConfigs
            | AlterConfigs
            | IncrementalAlterConfigs
            | CreatePartitions
            | DeleteRecords
            | DescribeProducers
            | ListGroups
            | DescribeGroups
            | DeleteGroups
            | OffsetDelete
            | ElectLeaders
            | AlterPartitionReassignments
            | ListPartitionReassignments
            | UnregisterBroker
            | DescribeLogDirs
            | DescribeQuorum
    )
}

/// One request's view of the authorizer.
pub struct Access {
    table: Arc<TopicTable>,
    session: Rc<Session>,
}

impl Access {
    pub fn new(table: Arc<TopicTable>, session: Rc<Session>) -> Self {
        Access { table, session }
    }

    /// Whether an authorizer decides at all.
    pub fn enabled(&self) -> bool {
        self.table.security.authorizer.is_some()
    }

    /// A super user, or no authorizer: everything is allowed.
    pub fn unrestricted(&self) -> bool {
        self.table
            .security
            .authorizer
            .as_ref()
            .is_none_or(|a| a.is_super_user(&self.session.principal))
    }

    pub fn allowed(&self, op: Op, resource_type: ResourceType, name: &str) -> bool {
        self.table.security.authorizer.as_ref().is_none_or(|a| {
            a.authorize(
                &self.session.principal,
                &self.session.ip,
                op,
                resource_type,
                name,
            )
        })
    }

    pub fn topic(&self, op: Op, name: &str) -> bool {
        self.allowed(op, ResourceType::Topic, name)
    }

    pub fn group(&self, op: Op, name: &str) -> bool {
        self.allowed(op, ResourceType::Group, name)
    }

    pub fn cluster(&self, op: Op) -> bool {
        self.allowed(op, ResourceType::Cluster, skiff_security::acl::CLUSTER_NAME)
    }

    /// Allowed on at least one resource of the type (KIP-679).
    pub fn any(&self, op: Op, resource_type: ResourceType) -> bool {
        self.table.security.authorizer.as_ref().is_none_or(|a| {
            a.authorize_any(&self.session.principal, &self.session.ip, op, resource_type)
        })
    }

    /// Creating `topic`: CREATE on the cluster or on the topic.
    pub fn may_create(&self, topic: &str) -> bool {
        self.cluster(Op::Create) || self.topic(Op::Create, topic)
    }

    fn exists(&self, topic: &str) -> bool {
        self.table.get(topic).is_some()
    }
}

const TOPIC_DENIED: ResponseError = ResponseError::TopicAuthorizationFailed;

/// Topics (with their partitions) the principal may not `op`.
pub type Denied = Vec<(String, Vec<i32>)>;

impl Access {
    /// Keeps the `items` the principal may touch (`allowed`) and returns
    /// `key` of each one taken out; takes nothing out when unrestricted.
    fn refuse<T, K>(
        &self,
        items: &mut Vec<T>,
        allowed: impl Fn(&T) -> bool,
        key: impl Fn(&T) -> K,
    ) -> Vec<K> {
        let mut refused = Vec::new();
        if self.unrestricted() {
            return refused;
        }
        items.retain(|t| {
            let ok = allowed(t);
            if !ok {
                refused.push(key(t));
            }
            ok
        });
        refused
    }
}

// -- Produce: WRITE on each topic; a transactional produce WRITE on its
// transactional id too (else every partition is refused with
// TRANSACTIONAL_ID_AUTHORIZATION_FAILED).

pub fn produce(
    access: &Access,
    request: &mut skiff_protocol::produce::ProduceRequest,
) -> (Denied, ResponseError) {
    let key = |t: &skiff_protocol::produce::TopicData| {
        (
            t.name.clone(),
            t.partitions.iter().map(|p| p.index).collect(),
        )
    };
    if let Some(id) = &request.transactional_id {
        if transactional_id(access, id).is_some() {
            let all = std::mem::take(&mut request.topics)
                .iter()
                .map(key)
                .collect();
            return (all, ResponseError::TransactionalIdAuthorizationFailed);
        }
    }
    let denied = access.refuse(
        &mut request.topics,
        |t| access.topic(Op::Write, &t.name),
        key,
    );
    (denied, TOPIC_DENIED)
}

pub fn produce_denied(
    response: &mut kafka_protocol::messages::ProduceResponse,
    (denied, error): (Denied, ResponseError),
) {
    for (name, partitions) in denied {
        response.responses.push(
            TopicProduceResponse::default()
                .with_name(TopicName(crate::kafka::str_bytes(name)))
                .with_partition_responses(
                    partitions
                        .into_iter()
                        .map(|p| {
                            PartitionProduceResponse::default()
                                .with_index(p)
                                .with_error_code(error.code())
                                .with_base_offset(-1)
                                .with_log_append_time_ms(-1)
                                .with_log_start_offset(-1)
                        })
                        .collect(),
                ),
        );
    }
}

// -- Fetch: READ on each topic (a consumer), CLUSTER_ACTION (a follower).

pub enum FetchGate {
    Serve(Denied),
    /// A replica fetch without CLUSTER_ACTION: the whole request.
    Refuse,
}

pub fn fetch(
    access: &Access,
    request: &mut kafka_protocol::messages::FetchRequest,
    version: i16,
) -> FetchGate {
    if access.unrestricted() {
        return FetchGate::Serve(Vec::new());
    }
    if version < 15 && request.replica_id.0 >= 0 {
        return if access.cluster(Op::ClusterAction) {
            FetchGate::Serve(Vec::new())
        } else {
            FetchGate::Refuse
        };
    }
    FetchGate::Serve(access.refuse(
        &mut request.topics,
        |t| access.topic(Op::Read, &t.topic.0),
        |t| {
            (
                t.topic.0.to_string(),
                t.partitions.iter().map(|p| p.partition).collect(),
            )
        },
    ))
}

pub fn fetch_denied(response: &mut kafka_protocol::messages::FetchResponse, denied: Denied) {
    for (name, partitions) in denied {
        response.responses.push(
            FetchableTopicResponse::default()
                .with_topic(TopicName(crate::kafka::str_bytes(name)))
                .with_partitions(
                    partitions
                        .into_iter()
                        .map(|p| {
                            PartitionData::default()
                                .with_partition_index(p)
                                .with_error_code(TOPIC_DENIED.code())
                                .with_high_watermark(-1)
                                .with_last_stable_offset(-1)
                                .with_log_start_offset(-1)
                                .with_preferred_read_replica(BrokerId(-1))
                        })
                        .collect(),
                ),
        );
    }
}

// -- ListOffsets and OffsetForLeaderEpoch: DESCRIBE on each topic
// (CLUSTER_ACTION for a replica's OffsetForLeaderEpoch).

pub fn list_offsets(
    access: &Access,
    request: &mut kafka_protocol::messages::ListOffsetsRequest,
) -> Denied {
    access.refuse(
        &mut request.topics,
        |t| access.topic(Op::Describe, &t.name.0),
        |t| {
            (
                t.name.0.to_string(),
                t.partitions.iter().map(|p| p.partition_index).collect(),
            )
        },
    )
}

pub fn list_offsets_denied(
    response: &mut kafka_protocol::messages::ListOffsetsResponse,
    denied: Denied,
) {
    for (name, partitions) in denied {
        response.topics.push(
            ListOffsetsTopicResponse::default()
                .with_name(TopicName(crate::kafka::str_bytes(name)))
                .with_partitions(
                    partitions
                        .into_iter()
                        .map(|p| {
                            ListOffsetsPartitionResponse::default()
                                .with_partition_index(p)
                                .with_error_code(TOPIC_DENIED.code())
                                .with_timestamp(-1)
                                .with_offset(-1)
                                .with_leader_epoch(-1)
                        })
                        .collect(),
                ),
        );
    }
}

pub fn offset_for_leader_epoch(
    access: &Access,
    request: &mut kafka_protocol::messages::OffsetForLeaderEpochRequest,
) -> Denied {
    let replica = request.replica_id.0 >= 0;
    let cluster_action = replica && access.cluster(Op::ClusterAction);
    access.refuse(
        &mut request.topics,
        |t| {
            if replica {
                cluster_action
            } else {
                access.topic(Op::Describe, &t.topic.0)
            }
        },
        |t| {
            (
                t.topic.0.to_string(),
                t.partitions.iter().map(|p| p.partition).collect(),
            )
        },
    )
}

pub fn offset_for_leader_epoch_denied(
    response: &mut kafka_protocol::messages::OffsetForLeaderEpochResponse,
    denied: Denied,
) {
    for (name, partitions) in denied {
        response.topics.push(
            OffsetForLeaderTopicResult::default()
                .with_topic(TopicName(crate::kafka::str_bytes(name)))
                .with_partitions(
                    partitions
                        .into_iter()
                        .map(|p| {
                            EpochEndOffset::default()
                                .with_partition(p)
                                .with_error_code(TOPIC_DENIED.code())
                                .with_leader_epoch(-1)
                                .with_end_offset(-1)
                        })
                        .collect(),
                ),
        );
    }
}

// -- Metadata: DESCRIBE on a topic to see it; CREATE (cluster or topic) to
// have a missing one auto-created. Listing every topic shows only the
// describable ones.

pub fn metadata(
    access: &Access,
    request: &mut kafka_protocol::messages::MetadataRequest,
) -> Vec<String> {
    if access.unrestricted() {
        return Vec::new();
    }
    let Some(topics) = request.topics.as_mut() else {
        return Vec::new();
    };
    let mut denied = Vec::new();
    topics.retain(|t| {
        let Some(name) = t.name.as_ref().map(|n| n.0.to_string()) else {
            return true; // by topic id: not served, answered as unknown
        };
        let ok =
            access.topic(Op::Describe, &name) && (access.exists(&name) || access.may_create(&name));
        if !ok {
            denied.push(name);
        }
        ok
    });
    denied
}

pub fn metadata_denied(
    access: &Access,
    response: &mut kafka_protocol::messages::MetadataResponse,
    denied: Vec<String>,
    listed_all: bool,
) {
    if access.unrestricted() {
        return;
    }
    if listed_all {
        response.topics.retain(|t| {
            t.name
                .as_ref()
                .is_some_and(|n| access.topic(Op::Describe, &n.0))
        });
    }
    for name in denied {
        response.topics.push(
            MetadataResponseTopic::default()
                .with_name(Some(TopicName(crate::kafka::str_bytes(name))))
                .with_error_code(TOPIC_DENIED.code()),
        );
    }
}

// -- Groups: READ on the group to join, sync, heartbeat, leave or commit
// (and READ on each committed topic); DESCRIBE on the group and each topic
// to fetch offsets; DESCRIBE to find its coordinator.

pub fn offset_commit(
    access: &Access,
    request: &mut kafka_protocol::messages::OffsetCommitRequest,
) -> Denied {
    access.refuse(
        &mut request.topics,
        |t| access.topic(Op::Read, &t.name.0),
        |t| {
            (
                t.name.0.to_string(),
                t.partitions.iter().map(|p| p.partition_index).collect(),
            )
        },
    )
}

/// Every partition of the request answered with `error` (a denied group),
/// or the denied topics added with TOPIC_AUTHORIZATION_FAILED.
pub fn offset_commit_denied(
    response: &mut kafka_protocol::messages::OffsetCommitResponse,
    denied: Denied,
    error: ResponseError,
) {
    for (name, partitions) in denied {
        response.topics.push(
            OffsetCommitResponseTopic::default()
                .with_name(TopicName(crate::kafka::str_bytes(name)))
                .with_partitions(
                    partitions
                        .into_iter()
                        .map(|p| {
                            OffsetCommitResponsePartition::default()
                                .with_partition_index(p)
                                .with_error_code(error.code())
                        })
                        .collect(),
                ),
        );
    }
}

pub fn offset_commit_all(request: &kafka_protocol::messages::OffsetCommitRequest) -> Denied {
    request
        .topics
        .iter()
        .map(|t| {
            (
                t.name.0.to_string(),
                t.partitions.iter().map(|p| p.partition_index).collect(),
            )
        })
        .collect()
}

// -- Admin.

pub fn create_topics_denied(
    access: &Access,
    request: &mut kafka_protocol::messages::CreateTopicsRequest,
) -> Vec<String> {
    access.refuse(
        &mut request.topics,
        |t| access.may_create(&t.name.0),
        |t| t.name.0.to_string(),
    )
}

pub fn create_topics_add(
    response: &mut kafka_protocol::messages::CreateTopicsResponse,
    denied: Vec<String>,
) {
    for name in denied {
        response.topics.push(
            CreatableTopicResult::default()
                .with_name(TopicName(crate::kafka::str_bytes(name)))
                .with_error_code(TOPIC_DENIED.code())
                .with_num_partitions(-1)
                .with_replication_factor(-1),
        );
    }
}

pub fn delete_topics_denied(
    access: &Access,
    request: &mut kafka_protocol::messages::DeleteTopicsRequest,
) -> Vec<String> {
    let mut denied = access.refuse(
        &mut request.topic_names,
        |t| access.topic(Op::Delete, &t.0),
        |t| t.0.to_string(),
    );
    // By name; a topic named by id only is answered as the handler does.
    denied.extend(access.refuse(
        &mut request.topics,
        |t| {
            t.name
                .as_ref()
                .is_none_or(|n| access.topic(Op::Delete, &n.0))
        },
        |t| t.name.as_ref().map(|n| n.0.to_string()).unwrap_or_default(),
    ));
    denied
}

pub fn delete_topics_add(
    response: &mut kafka_protocol::messages::DeleteTopicsResponse,
    denied: Vec<String>,
) {
    for name in denied {
        response.responses.push(
            DeletableTopicResult::default()
                .with_name(Some(TopicName(crate::kafka::str_bytes(name))))
                .with_error_code(TOPIC_DENIED.code()),
        );
    }
}

// -- FindCoordinator: DESCRIBE on the group (or transactional id).

/// Keys the principal may not describe, and the error they get.
pub struct CoordinatorDenied {
    keys: Vec<String>,
    error: ResponseError,
}

impl CoordinatorDenied {
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

pub fn find_coordinator(
    access: &Access,
    request: &mut kafka_protocol::messages::FindCoordinatorRequest,
    version: i16,
) -> CoordinatorDenied {
    let (resource_type, error) = if request.key_type == 1 {
        (
            ResourceType::TransactionalId,
            ResponseError::TransactionalIdAuthorizationFailed,
        )
    } else {
        (ResourceType::Group, ResponseError::GroupAuthorizationFailed)
    };
    let mut denied = CoordinatorDenied {
        keys: Vec::new(),
        error,
    };
    if access.unrestricted() {
        return denied;
    }
    if version >= 4 {
        denied.keys = access.refuse(
            &mut request.coordinator_keys,
            |k| access.allowed(Op::Describe, resource_type, k),
            |k| k.to_string(),
        );
    } else if !access.allowed(Op::Describe, resource_type, &request.key) {
        denied.keys.push(request.key.to_string());
    }
    denied
}

pub fn find_coordinator_denied(
    response: &mut kafka_protocol::messages::FindCoordinatorResponse,
    denied: CoordinatorDenied,
    version: i16,
) {
    use kafka_protocol::messages::find_coordinator_response::Coordinator;
    if denied.keys.is_empty() {
        return;
    }
    if version < 4 {
        response.error_code = denied.error.code();
        response.node_id = BrokerId(-1);
        response.port = -1;
        return;
    }
    for key in denied.keys {
        response.coordinators.push(
            Coordinator::default()
                .with_key(crate::kafka::str_bytes(key))
                .with_node_id(BrokerId(-1))
                .with_port(-1)
                .with_error_code(denied.error.code()),
        );
    }
}

// -- OffsetFetch: DESCRIBE on the group. (Topics the principal may not
// describe are not filtered out of the answer yet.)

pub struct OffsetFetchDenied {
    groups: Vec<String>,
    /// v0-1 only: the asked partitions, each answered with the error.
    topics: Denied,
}

impl OffsetFetchDenied {
    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }
}

pub fn offset_fetch(
    access: &Access,
    request: &mut kafka_protocol::messages::OffsetFetchRequest,
    version: i16,
) -> OffsetFetchDenied {
    let mut denied = OffsetFetchDenied {
        groups: Vec::new(),
        topics: Vec::new(),
    };
    if access.unrestricted() {
        return denied;
    }
    if version >= 8 {
        denied.groups = access.refuse(
            &mut request.groups,
            |g| access.group(Op::Describe, &g.group_id.0),
            |g| g.group_id.0.to_string(),
        );
    } else if !access.group(Op::Describe, &request.group_id.0) {
        denied.groups.push(request.group_id.0.to_string());
        denied.topics = request
            .topics
            .iter()
            .flatten()
            .map(|t| (t.name.0.to_string(), t.partition_indexes.clone()))
            .collect();
    }
    denied
}

pub fn offset_fetch_denied(
    response: &mut kafka_protocol::messages::OffsetFetchResponse,
    denied: OffsetFetchDenied,
    version: i16,
) {
    use kafka_protocol::messages::offset_fetch_response::{
        OffsetFetchResponseGroup, OffsetFetchResponsePartition, OffsetFetchResponseTopic,
    };
    let code = ResponseError::GroupAuthorizationFailed.code();
    if version >= 8 {
        for g in denied.groups {
            response.groups.push(
                OffsetFetchResponseGroup::default()
                    .with_group_id(kafka_protocol::messages::GroupId(crate::kafka::str_bytes(
                        g,
                    )))
                    .with_error_code(code),
            );
        }
        return;
    }
    if denied.groups.is_empty() {
        return;
    }
    if version >= 2 {
        response.error_code = code;
    }
    for (name, partitions) in denied.topics {
        response.topics.push(
            OffsetFetchResponseTopic::default()
                .with_name(TopicName(crate::kafka::str_bytes(name)))
                .with_partitions(
                    partitions
                        .into_iter()
                        .map(|p| {
                            OffsetFetchResponsePartition::default()
                                .with_partition_index(p)
                                .with_committed_offset(-1)
                                .with_error_code(code)
                        })
                        .collect(),
                ),
        );
    }
}

// -- InitProducerId: WRITE on the transactional id; an idempotent producer
// needs IDEMPOTENT_WRITE on the cluster or WRITE on some topic (KIP-679).

pub fn init_producer_id(
    access: &Access,
    request: &kafka_protocol::messages::InitProducerIdRequest,
) -> Option<ResponseError> {
    if access.unrestricted() {
        return None;
    }
    match &request.transactional_id {
        Some(id) => (!access.allowed(Op::Write, ResourceType::TransactionalId, &id.0))
            .then_some(ResponseError::TransactionalIdAuthorizationFailed),
        None => (!access.cluster(Op::IdempotentWrite)
            && !access.any(Op::Write, ResourceType::Topic))
        .then_some(ResponseError::ClusterAuthorizationFailed),
    }
}

// -- Transactions (Kafka's rules): WRITE on the transactional id for
// AddPartitionsToTxn (plus WRITE on its topics), AddOffsetsToTxn (plus READ
// on the group), EndTxn and TxnOffsetCommit (plus READ on the group and the
// topics); CLUSTER_ACTION for the brokers' calls (AddPartitionsToTxn v4,
// WriteTxnMarkers).

/// TRANSACTIONAL_ID_AUTHORIZATION_FAILED unless the principal may WRITE `id`.
pub fn transactional_id(access: &Access, id: &str) -> Option<ResponseError> {
    (!access.unrestricted() && !access.allowed(Op::Write, ResourceType::TransactionalId, id))
        .then_some(ResponseError::TransactionalIdAuthorizationFailed)
}

/// CLUSTER_AUTHORIZATION_FAILED unless the principal may CLUSTER_ACTION.
pub fn cluster_action(access: &Access) -> Option<ResponseError> {
    (!access.unrestricted() && !access.cluster(Op::ClusterAction))
        .then_some(ResponseError::ClusterAuthorizationFailed)
}

// -- Configs: DESCRIBE_CONFIGS / ALTER_CONFIGS on the topic, or on the
// cluster for a broker resource.

const CONFIG_TOPIC: i8 = 2;

fn config_allowed(access: &Access, op: Op, resource_type: i8, name: &str) -> bool {
    if resource_type == CONFIG_TOPIC {
        access.topic(op, name)
    } else {
        access.cluster(op)
    }
}

fn config_error(resource_type: i8) -> ResponseError {
    if resource_type == CONFIG_TOPIC {
        TOPIC_DENIED
    } else {
        ResponseError::ClusterAuthorizationFailed
    }
}

/// Resources refused: (type, name).
pub type DeniedResources = Vec<(i8, String)>;

pub fn describe_configs(
    access: &Access,
    request: &mut kafka_protocol::messages::DescribeConfigsRequest,
) -> DeniedResources {
    access.refuse(
        &mut request.resources,
        |r| {
            config_allowed(
                access,
                Op::DescribeConfigs,
                r.resource_type,
                &r.resource_name,
            )
        },
        |r| (r.resource_type, r.resource_name.to_string()),
    )
}

pub fn describe_configs_denied(
    response: &mut kafka_protocol::messages::DescribeConfigsResponse,
    denied: DeniedResources,
) {
    use kafka_protocol::messages::describe_configs_response::DescribeConfigsResult;
    for (t, name) in denied {
        response.results.push(
            DescribeConfigsResult::default()
                .with_error_code(config_error(t).code())
                .with_resource_type(t)
                .with_resource_name(crate::kafka::str_bytes(name)),
        );
    }
}

/// AlterConfigs and IncrementalAlterConfigs: the resources refused.
pub fn alter_configs<R>(
    access: &Access,
    resources: &mut Vec<R>,
    key: impl Fn(&R) -> (i8, String),
) -> DeniedResources {
    access.refuse(
        resources,
        |r| {
            let (t, name) = key(r);
            config_allowed(access, Op::AlterConfigs, t, &name)
        },
        &key,
    )
}

pub fn alter_configs_denied(
    responses: &mut Vec<
        kafka_protocol::messages::alter_configs_response::AlterConfigsResourceResponse,
    >,
    denied: DeniedResources,
) {
    use kafka_protocol::messages::alter_configs_response::AlterConfigsResourceResponse;
    for (t, name) in denied {
        responses.push(
            AlterConfigsResourceResponse::default()
                .with_error_code(config_error(t).code())
                .with_resource_type(t)
                .with_resource_name(crate::kafka::str_bytes(name)),
        );
    }
}

pub fn incremental_alter_configs_denied(
    responses: &mut Vec<
        kafka_protocol::messages::incremental_alter_configs_response::AlterConfigsResourceResponse,
    >,
    denied: DeniedResources,
) {
    use kafka_protocol::messages::incremental_alter_configs_response::AlterConfigsResourceResponse;
    for (t, name) in denied {
        responses.push(
            AlterConfigsResourceResponse::default()
                .with_error_code(config_error(t).code())
                .with_resource_type(t)
                .with_resource_name(crate::kafka::str_bytes(name)),
        );
    }
}

// -- CreatePartitions: ALTER on the topic. DeleteRecords: DELETE on it.
// DescribeProducers: READ on it.

pub fn create_partitions(
    access: &Access,
    request: &mut kafka_protocol::messages::CreatePartitionsRequest,
) -> Vec<String> {
    access.refuse(
        &mut request.topics,
        |t| access.topic(Op::Alter, &t.name.0),
        |t| t.name.0.to_string(),
    )
}

pub fn create_partitions_denied(
    response: &mut kafka_protocol::messages::CreatePartitionsResponse,
    denied: Vec<String>,
) {
    use kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
    for name in denied {
        response.results.push(
            CreatePartitionsTopicResult::default()
                .with_name(TopicName(crate::kafka::str_bytes(name)))
                .with_error_code(TOPIC_DENIED.code()),
        );
    }
}

pub fn delete_records(
    access: &Access,
    request: &mut kafka_protocol::messages::DeleteRecordsRequest,
) -> Denied {
    access.refuse(
        &mut request.topics,
        |t| access.topic(Op::Delete, &t.name.0),
        |t| {
            (
                t.name.0.to_string(),
                t.partitions.iter().map(|p| p.partition_index).collect(),
            )
        },
    )
}

pub fn delete_records_denied(
    response: &mut kafka_protocol::messages::DeleteRecordsResponse,
    denied: Denied,
) {
    use kafka_protocol::messages::delete_records_response::{
        DeleteRecordsPartitionResult, DeleteRecordsTopicResult,
    };
    for (name, partitions) in denied {
        response.topics.push(
            DeleteRecordsTopicResult::default()
                .with_name(TopicName(crate::kafka::str_bytes(name)))
                .with_partitions(
                    partitions
                        .into_iter()
                        .map(|p| {
                            DeleteRecordsPartitionResult::default()
                                .with_partition_index(p)
                                .with_low_watermark(-1)
                                .with_error_code(TOPIC_DENIED.code())
                        })
                        .collect(),
                ),
        );
    }
}

pub fn describe_producers(
    access: &Access,
    request: &mut kafka_protocol::messages::DescribeProducersRequest,
) -> Denied {
    access.refuse(
        &mut request.topics,
        |t| access.topic(Op::Read, &t.name.0),
        |t| (t.name.0.to_string(), t.partition_indexes.clone()),
    )
}

pub fn describe_producers_denied(
    response: &mut kafka_protocol::messages::DescribeProducersResponse,
    denied: Denied,
) {
    use kafka_protocol::messages::describe_producers_response::{PartitionResponse, TopicResponse};
    for (name, partitions) in denied {
        response.topics.push(
            TopicResponse::default()
                .with_name(TopicName(crate::kafka::str_bytes(name)))
                .with_partitions(
                    partitions
                        .into_iter()
                        .map(|p| {
                            PartitionResponse::default()
                                .with_partition_index(p)
                                .with_error_code(TOPIC_DENIED.code())
                        })
                        .collect(),
                ),
        );
    }
}

// -- Groups, listed and managed: DESCRIBE to list (without DESCRIBE on the
// cluster, only the groups the principal may describe) and describe,
// DELETE to delete a group or its offsets (and READ on each topic).

pub fn list_groups_filter(
    access: &Access,
    response: &mut kafka_protocol::messages::ListGroupsResponse,
) {
    if access.unrestricted() || access.cluster(Op::Describe) {
        return;
    }
    response
        .groups
        .retain(|g| access.group(Op::Describe, &g.group_id.0));
}

pub fn describe_groups(
    access: &Access,
    request: &mut kafka_protocol::messages::DescribeGroupsRequest,
) -> Vec<String> {
    access.refuse(
        &mut request.groups,
        |g| access.group(Op::Describe, &g.0),
        |g| g.0.to_string(),
    )
}

pub fn describe_groups_denied(
    response: &mut kafka_protocol::messages::DescribeGroupsResponse,
    denied: Vec<String>,
) {
    use kafka_protocol::messages::describe_groups_response::DescribedGroup;
    for g in denied {
        response.groups.push(
            DescribedGroup::default()
                .with_group_id(kafka_protocol::messages::GroupId(crate::kafka::str_bytes(
                    g,
                )))
                .with_error_code(ResponseError::GroupAuthorizationFailed.code()),
        );
    }
}

pub fn delete_groups(
    access: &Access,
    request: &mut kafka_protocol::messages::DeleteGroupsRequest,
) -> Vec<String> {
    access.refuse(
        &mut request.groups_names,
        |g| access.group(Op::Delete, &g.0),
        |g| g.0.to_string(),
    )
}

pub fn delete_groups_denied(
    response: &mut kafka_protocol::messages::DeleteGroupsResponse,
    denied: Vec<String>,
) {
    use kafka_protocol::messages::delete_groups_response::DeletableGroupResult;
    for g in denied {
        response.results.push(
            DeletableGroupResult::default()
                .with_group_id(kafka_protocol::messages::GroupId(crate::kafka::str_bytes(
                    g,
                )))
                .with_error_code(ResponseError::GroupAuthorizationFailed.code()),
        );
    }
}

pub fn offset_delete(
    access: &Access,
    request: &mut kafka_protocol::messages::OffsetDeleteRequest,
) -> Denied {
    access.refuse(
        &mut request.topics,
        |t| access.topic(Op::Read, &t.name.0),
        |t| {
            (
                t.name.0.to_string(),
                t.partitions.iter().map(|p| p.partition_index).collect(),
            )
        },
    )
}

pub fn offset_delete_denied(
    response: &mut kafka_protocol::messages::OffsetDeleteResponse,
    denied: Denied,
) {
    use kafka_protocol::messages::offset_delete_response::{
        OffsetDeleteResponsePartition, OffsetDeleteResponseTopic,
    };
    for (name, partitions) in denied {
        response.topics.push(
            OffsetDeleteResponseTopic::default()
                .with_name(TopicName(crate::kafka::str_bytes(name)))
                .with_partitions(
                    partitions
                        .into_iter()
                        .map(|p| {
                            OffsetDeleteResponsePartition::default()
                                .with_partition_index(p)
                                .with_error_code(TOPIC_DENIED.code())
                        })
                        .collect(),
                ),
        );
    }
}

/// Which asked groups (v8) or the one group (earlier) asked for all topics.
pub fn offset_fetch_all_topics(
    request: &kafka_protocol::messages::OffsetFetchRequest,
    version: i16,
) -> Vec<(String, bool)> {
    if version >= 8 {
        request
            .groups
            .iter()
            .map(|g| (g.group_id.0.to_string(), g.topics.is_none()))
            .collect()
    } else {
        vec![(request.group_id.0.to_string(), request.topics.is_none())]
    }
}

/// Offsets of topics the principal may not describe: left out of an
/// all-topics answer, refused (TOPIC_AUTHORIZATION_FAILED) where asked for.
pub fn offset_fetch_topics(
    access: &Access,
    response: &mut kafka_protocol::messages::OffsetFetchResponse,
    all_topics: &[(String, bool)],
    version: i16,
) {
    if access.unrestricted() {
        return;
    }
    let all = |group: &str| {
        all_topics
            .iter()
            .find(|(g, _)| g == group)
            .is_some_and(|(_, a)| *a)
    };
    let code = TOPIC_DENIED.code();
    if version >= 8 {
        for g in &mut response.groups {
            let everything = all(&g.group_id.0);
            g.topics
                .retain(|t| !everything || access.topic(Op::Describe, &t.name.0));
            for t in &mut g.topics {
                if !access.topic(Op::Describe, &t.name.0) {
                    for p in &mut t.partitions {
                        p.error_code = code;
                        p.committed_offset = -1;
                        p.metadata = None;
                    }
                }
            }
        }
        return;
    }
    let everything = all_topics.first().is_some_and(|(_, a)| *a);
    response
        .topics
        .retain(|t| !everything || access.topic(Op::Describe, &t.name.0));
    for t in &mut response.topics {
        if !access.topic(Op::Describe, &t.name.0) {
            for p in &mut t.partitions {
                p.error_code = code;
                p.committed_offset = -1;
                p.metadata = None;
            }
        }
    }
}
