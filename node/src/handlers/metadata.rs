//! Metadata: this node is the only broker, the controller, and the leader of
//! every partition it can serve. Unknown topics are created on request when
//! `auto.create.topics.enable` and the request allow it.
//!
//! A partition this node cannot serve (its log failed a write or fdatasync, or
//! has no log) is answered as Kafka answers a partition without a live leader:
//! LEADER_NOT_AVAILABLE, leader -1, this node in `offline_replicas` and not in
//! the ISR. Clients then wait for a leader instead of producing into a
//! KAFKA_STORAGE_ERROR, and `skiff topic describe --unavailable` lists it.

use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::{BrokerId, MetadataRequest, MetadataResponse, TopicName};
use std::collections::HashSet;

use kafka_protocol::ResponseError;
use skiff_engine::TopicPartition;

use super::str_bytes;
use crate::group;
use crate::state::CoreState;
use crate::topics::{self, CreateTopic, TopicError, TopicInfo};

pub async fn handle(core: &CoreState, request: MetadataRequest, version: i16) -> MetadataResponse {
    let node_id = BrokerId(core.node.config.node_id);
    let (host, port) = core.node.config.advertised();
    // kafka-protocol refuses to encode a field its version lacks, so fields are
    // set only from the version that has them.
    let mut response =
        MetadataResponse::default().with_brokers(vec![MetadataResponseBroker::default()
            .with_node_id(node_id)
            .with_host(str_bytes(host))
            .with_port(i32::from(port))]);
    if version >= 1 {
        response.controller_id = node_id;
    }
    if version >= 2 {
        response.cluster_id = Some(str_bytes(core.node.cluster_id.clone()));
    }

    // v0: an empty list means all topics; v1+: null means all.
    let requested: Option<Vec<String>> = match request.topics {
        Some(list) if !(version == 0 && list.is_empty()) => Some(
            list.into_iter()
                .map(|t| match t.name {
                    Some(name) => name.0.to_string(),
                    None => core
                        .topics()
                        .by_id(t.topic_id)
                        .map(|i| i.name.clone())
                        .unwrap_or_default(),
                })
                .collect(),
        ),
        _ => None,
    };
    let auto_create =
        core.node.config.auto_create_topics && (version < 4 || request.allow_auto_topic_creation);
    // One question per core; a core that does not answer is reported by the
    // partitions' own requests, not here.
    let offline: Offline = match requested.as_ref().map(Vec::is_empty) {
        Some(true) => HashSet::new(),
        _ => match crate::metrics::offline_partitions(core).await {
            Ok(list) => list.into_iter().map(|(tp, _)| tp).collect(),
            Err(e) => {
                tracing::warn!(error = %e, "metadata: offline partitions unknown");
                HashSet::new()
            }
        },
    };
    let at = Answer {
        node_id,
        version,
        offline: &offline,
    };
    let topics: Vec<MetadataResponseTopic> = match requested {
        // Internal topics are answered only when asked for by name.
        None => core
            .topics()
            .topics
            .values()
            .filter(|t| !group::is_internal_topic(&t.name))
            .map(|t| topic(t, &at))
            .collect(),
        Some(names) => {
            let mut out = Vec::with_capacity(names.len());
            for name in names {
                out.push(requested_topic(core, &name, auto_create, &at).await);
            }
            out
        }
    };
    response.topics = topics;
    response
}

type Offline = HashSet<TopicPartition>;

/// What every topic of one response is answered with.
struct Answer<'a> {
    node_id: BrokerId,
    version: i16,
    offline: &'a Offline,
}

async fn requested_topic(
    core: &CoreState,
    name: &str,
    auto_create: bool,
    at: &Answer<'_>,
) -> MetadataResponseTopic {
    if let Some(info) = core.topics().get(name) {
        return topic(info, at);
    }
    let error = |e: ResponseError| {
        MetadataResponseTopic::default()
            .with_name(Some(TopicName(str_bytes(name))))
            .with_error_code(e.code())
    };
    if topics::validate_name(name).is_err() {
        return error(ResponseError::InvalidTopicException);
    }
    if !auto_create {
        return error(ResponseError::UnknownTopicOrPartition);
    }
    let create = CreateTopic {
        name: name.to_string(),
        partitions: -1,
        replication_factor: -1,
        configs: Default::default(),
    };
    match topics::create(core, create).await {
        Ok(info) => topic(&info, at),
        // Another request created it meanwhile.
        Err(TopicError::Exists(_)) => match core.topics().get(name) {
            Some(info) => topic(info, at),
            None => error(ResponseError::LeaderNotAvailable),
        },
        Err(e) => {
            tracing::warn!(topic = name, error = %e, "auto-creating topic failed");
            error(ResponseError::UnknownTopicOrPartition)
        }
    }
}

fn topic(info: &TopicInfo, at: &Answer<'_>) -> MetadataResponseTopic {
    let (node_id, version) = (at.node_id, at.version);
    let t =
        MetadataResponseTopic::default().with_name(Some(TopicName(str_bytes(info.name.clone()))));
    let t = if version >= 10 {
        t.with_topic_id(info.id)
    } else {
        t
    };
    let t = if version >= 1 {
        t.with_is_internal(group::is_internal_topic(&info.name))
    } else {
        t
    };
    t.with_partitions(
        (0..info.partitions)
            .map(|p| {
                let partition = MetadataResponsePartition::default()
                    .with_partition_index(p)
                    .with_replica_nodes(vec![node_id]);
                let partition = if at
                    .offline
                    .contains(&TopicPartition::new(info.name.clone(), p))
                {
                    let partition = partition
                        .with_error_code(ResponseError::LeaderNotAvailable.code())
                        .with_leader_id(BrokerId(-1))
                        .with_isr_nodes(vec![]);
                    if version >= 5 {
                        partition.with_offline_replicas(vec![node_id])
                    } else {
                        partition
                    }
                } else {
                    partition
                        .with_leader_id(node_id)
                        .with_isr_nodes(vec![node_id])
                };
                if version >= 7 {
                    partition.with_leader_epoch(0)
                } else {
                    partition
                }
            })
            .collect(),
    )
}
