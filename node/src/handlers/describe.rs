//! DescribeCluster, DescribeQuorum, DescribeLogDirs and DescribeProducers: the
//! cluster, its controller quorum, this node's data directory and a
//! partition's idempotent producers as Kafka's admin tools ask for them over
//! a broker's port (KIP-700, KIP-595, KIP-113, KIP-664).
//!
//! DescribeCluster is answered from this node's applied metadata, like
//! Metadata (the controller id is this node's own, as a KRaft broker answers;
//! fenced brokers only when v2 asks for them). DescribeQuorum asks the
//! controller quorum (core 0's controller link): the active controller's
//! answer carries each voter's matched log index, which is the voter's log end
//! offset as the leader knows it; from any other voter only ids are known
//! (offsets -1, Kafka's "unknown"). Brokers that are not voters are observers.
//!
//! DescribeLogDirs answers for the node's one data directory: every local
//! partition (each core reports its own) with its bytes on disk and its lag
//! (high watermark minus log end, 0 when caught up), and at v4 the file
//! system's size and available bytes.
//!
//! DescribeProducers is answered by each partition's leader from its producer
//! state (loaded from the log if no produce has yet): id, epoch, last sequence;
//! skiff keeps no per-producer timestamp (-1) and no transactions (-1).

use std::collections::{BTreeMap, BTreeSet};

use kafka_protocol::messages::describe_cluster_response::DescribeClusterBroker;
use kafka_protocol::messages::describe_log_dirs_response::{
    DescribeLogDirsPartition, DescribeLogDirsResult, DescribeLogDirsTopic,
};
use kafka_protocol::messages::describe_producers_response::{
    PartitionResponse, ProducerState, TopicResponse as ProducersTopicResponse,
};
use kafka_protocol::messages::describe_quorum_response::{
    Listener, Node, PartitionData, ReplicaState, TopicData,
};
use kafka_protocol::messages::{
    BrokerId, DescribeClusterRequest, DescribeClusterResponse, DescribeLogDirsRequest,
    DescribeLogDirsResponse, DescribeProducersRequest, DescribeProducersResponse,
    DescribeQuorumRequest, DescribeQuorumResponse, ProducerId, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use skiff_engine::TopicPartition;

use crate::cluster;
use crate::kafka::str_bytes;
use crate::state::CoreState;

/// The metadata log's name in DescribeQuorum (Kafka's).
const METADATA_TOPIC: &str = "__cluster_metadata";
/// DescribeCluster's endpoint type for brokers (2 is controllers).
const ENDPOINT_BROKERS: i8 = 1;

/// `listener`: the connection's; brokers are answered with its endpoints.
pub fn describe_cluster(
    core: &CoreState,
    request: &DescribeClusterRequest,
    version: i16,
    listener: &str,
) -> DescribeClusterResponse {
    let table = core.topics();
    let mut response = DescribeClusterResponse::default()
        .with_controller_id(BrokerId(core.node.config.node_id))
        .with_cluster_id(str_bytes(
            table
                .cluster_id
                .clone()
                .unwrap_or_else(|| core.node.cluster_id.clone()),
        ))
        .with_cluster_authorized_operations(i32::MIN);
    if version >= 1 {
        if request.endpoint_type != ENDPOINT_BROKERS {
            // Controllers are not reachable over this port's protocol.
            return response
                .with_endpoint_type(request.endpoint_type)
                .with_error_code(ResponseError::UnsupportedEndpointType.code())
                .with_error_message(Some(StrBytes::from_static_str(
                    "skiff answers DescribeCluster for brokers only (endpoint type 1)",
                )));
        }
        response.endpoint_type = ENDPOINT_BROKERS;
    }
    let include_fenced = version >= 2 && request.include_fenced_brokers;
    response.brokers = table
        .brokers
        .iter()
        .filter(|b| include_fenced || !b.fenced)
        .map(|b| {
            let (host, port) = b.endpoint(listener);
            let broker = DescribeClusterBroker::default()
                .with_broker_id(BrokerId(b.id))
                .with_host(str_bytes(host.to_string()))
                .with_port(i32::from(port))
                .with_rack(b.rack.clone().map(str_bytes));
            if version >= 2 {
                broker.with_is_fenced(b.fenced)
            } else {
                broker
            }
        })
        .collect();
    response
}

pub async fn describe_quorum(
    core: &CoreState,
    request: DescribeQuorumRequest,
    version: i16,
) -> DescribeQuorumResponse {
    let asks_metadata_log = request.topics.iter().all(|t| {
        t.topic_name.0.as_str() == METADATA_TOPIC
            && t.partitions.iter().all(|p| p.partition_index == 0)
    }) && !request.topics.is_empty();
    if !asks_metadata_log {
        return DescribeQuorumResponse::default()
            .with_error_code(ResponseError::InvalidRequest.code())
            .with_error_message(Some(str_bytes(format!(
                "the quorum is {METADATA_TOPIC} partition 0"
            ))));
    }
    let (status, quorum) = match cluster::quorum_status(core).await {
        Ok(answer) => answer,
        Err(e) => {
            return DescribeQuorumResponse::default().with_topics(vec![TopicData::default()
                .with_topic_name(TopicName(StrBytes::from_static_str(METADATA_TOPIC)))
                .with_partitions(vec![PartitionData::default()
                    .with_error_code(ResponseError::NotLeaderOrFollower.code())
                    .with_error_message(Some(str_bytes(e.to_string())))
                    .with_leader_id(BrokerId(-1))
                    .with_leader_epoch(-1)
                    .with_high_watermark(-1)])]);
        }
    };
    let replica = |id: i32, end: Option<u64>| {
        ReplicaState::default()
            .with_replica_id(BrokerId(id))
            .with_log_end_offset(end.map_or(-1, |o| o as i64))
            .with_last_fetch_timestamp(-1)
            .with_last_caught_up_timestamp(-1)
    };
    let voters: Vec<ReplicaState> = status
        .voters
        .iter()
        .map(|(id, matched)| replica(*id as i32, *matched))
        .collect();
    let observers: Vec<ReplicaState> = status
        .nodes
        .iter()
        .filter(|n| {
            !status
                .voters
                .iter()
                .any(|(v, _)| *v as i64 == i64::from(n.id))
        })
        .map(|n| replica(n.id, n.metadata_offset))
        .collect();
    let partition = PartitionData::default()
        .with_leader_id(BrokerId(status.leader_id.map_or(-1, |l| l as i32)))
        .with_leader_epoch(i32::try_from(status.term).unwrap_or(i32::MAX))
        .with_high_watermark(status.commit_index as i64)
        .with_current_voters(voters)
        .with_observers(observers);
    let mut response = DescribeQuorumResponse::default().with_topics(vec![TopicData::default()
        .with_topic_name(TopicName(StrBytes::from_static_str(METADATA_TOPIC)))
        .with_partitions(vec![partition])]);
    if version >= 2 {
        response.nodes = quorum
            .iter()
            .map(|(id, addr)| {
                Node::default()
                    .with_node_id(BrokerId(*id as i32))
                    .with_listeners(vec![Listener::default()
                        .with_name(StrBytes::from_static_str("CONTROLLER"))
                        .with_host(str_bytes(addr.ip().to_string()))
                        .with_port(addr.port())])
            })
            .collect();
    }
    response
}

pub async fn describe_log_dirs(
    core: &CoreState,
    request: DescribeLogDirsRequest,
    version: i16,
) -> DescribeLogDirsResponse {
    let wanted: Option<BTreeSet<(String, i32)>> = request.topics.map(|topics| {
        topics
            .into_iter()
            .flat_map(|t| {
                let name = t.topic.0.to_string();
                t.partitions.into_iter().map(move |p| (name.clone(), p))
            })
            .collect()
    });
    let dir = core.node.data_dir.display().to_string();
    let mut rows: BTreeMap<String, Vec<DescribeLogDirsPartition>> = BTreeMap::new();
    for target in 0..core.shard.table().shards() {
        let local = core
            .shard
            .invoke_on(target, |shard| async move {
                let mut out = Vec::new();
                for (tp, partition) in shard.local_partition_handles() {
                    // An offline or closing log is not listed (Kafka lists
                    // only the logs it serves).
                    if let Ok(stats) = partition.log_stats().await {
                        let lag = (partition.high_watermark() - stats.log_end_offset).max(0);
                        out.push((tp, stats.size_bytes, lag));
                    }
                }
                out
            })
            .await;
        let Ok(local) = local else {
            return DescribeLogDirsResponse::default().with_results(vec![
                DescribeLogDirsResult::default()
                    .with_error_code(ResponseError::KafkaStorageError.code())
                    .with_log_dir(str_bytes(dir)),
            ]);
        };
        for (tp, size, lag) in local {
            if wanted
                .as_ref()
                .is_some_and(|w| !w.contains(&(tp.topic.clone(), tp.partition)))
            {
                continue;
            }
            rows.entry(tp.topic).or_default().push(
                DescribeLogDirsPartition::default()
                    .with_partition_index(tp.partition)
                    .with_partition_size(i64::try_from(size).unwrap_or(i64::MAX))
                    .with_offset_lag(lag),
            );
        }
    }
    let mut result = DescribeLogDirsResult::default()
        .with_log_dir(str_bytes(dir))
        .with_topics(
            rows.into_iter()
                .map(|(name, mut partitions)| {
                    partitions.sort_by_key(|p| p.partition_index);
                    DescribeLogDirsTopic::default()
                        .with_name(TopicName(str_bytes(name)))
                        .with_partitions(partitions)
                })
                .collect(),
        );
    if version >= 4 {
        match skiff_engine::fsutil::disk_space(&core.node.data_dir) {
            Ok((total, available)) => {
                result.total_bytes = i64::try_from(total).unwrap_or(i64::MAX);
                result.usable_bytes = i64::try_from(available).unwrap_or(i64::MAX);
            }
            Err(e) => tracing::debug!(error = %e, "statvfs of the data directory"),
        }
    }
    DescribeLogDirsResponse::default().with_results(vec![result])
}

pub async fn describe_producers(
    core: &CoreState,
    request: DescribeProducersRequest,
) -> DescribeProducersResponse {
    let table = core.topics();
    let mut topics = Vec::with_capacity(request.topics.len());
    for t in request.topics {
        let name = t.name.0.to_string();
        let mut partitions = Vec::with_capacity(t.partition_indexes.len());
        for p in t.partition_indexes {
            let response = PartitionResponse::default().with_partition_index(p);
            if let Err(e) = super::check_leader(&table, &name, p) {
                partitions.push(response.with_error_code(e.code()));
                continue;
            }
            let tp = TopicPartition::new(name.clone(), p);
            let owner = core.shard.table().shard_of(&tp);
            let outcome = core
                .shard
                .invoke_on(owner, move |_| async move {
                    crate::producer::describe_producers(&tp).await
                })
                .await
                .and_then(|r| r);
            partitions.push(match outcome {
                Ok(producers) => response.with_active_producers(
                    producers
                        .into_iter()
                        .map(|p| {
                            ProducerState::default()
                                .with_producer_id(ProducerId(p.producer_id))
                                .with_producer_epoch(i32::from(p.epoch))
                                .with_last_sequence(p.last_sequence)
                                .with_last_timestamp(-1)
                                .with_coordinator_epoch(p.coordinator_epoch)
                                .with_current_txn_start_offset(p.txn_start_offset)
                        })
                        .collect(),
                ),
                Err(e) => response
                    .with_error_code(crate::kafka::error_code(&e).code())
                    .with_error_message(Some(str_bytes(e.to_string()))),
            });
        }
        topics.push(
            ProducersTopicResponse::default()
                .with_name(t.name)
                .with_partitions(partitions),
        );
    }
    DescribeProducersResponse::default().with_topics(topics)
}
