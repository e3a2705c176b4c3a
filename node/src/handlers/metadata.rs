//! Metadata, answered from the committed cluster metadata this node has
//! applied (`cluster.rs`): the live (unfenced) brokers, and per partition its
//! replicas, ISR, leader and leader epoch. Unknown topics are created through
//! the controller when `auto.create.topics.enable` and the request allow it.
//! The controller id is this node's own, as a KRaft broker answers: clients
//! never talk to controllers.
//!
//! A partition without a leader, and one this node leads but cannot serve (its
//! log failed a write or fdatasync, or has no log), is answered as Kafka
//! answers a partition without a live leader: LEADER_NOT_AVAILABLE, leader -1,
//! unavailable replicas in `offline_replicas`. Clients then wait for a leader
//! instead of producing into a KAFKA_STORAGE_ERROR, and `skiff topic describe
//! --unavailable` lists it.

use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::{BrokerId, MetadataRequest, MetadataResponse, TopicName};
use std::collections::HashSet;

use kafka_protocol::ResponseError;
use skiff_engine::TopicPartition;

use crate::group;
use crate::kafka::str_bytes;
use crate::state::CoreState;
use crate::topics::{self, Assignment, CreateTopic, TopicError, TopicInfo, TopicTable, NO_LEADER};

/// `listener`: the connection's; brokers are answered with its endpoints.
pub async fn handle(
    core: &CoreState,
    request: MetadataRequest,
    version: i16,
    listener: &str,
) -> MetadataResponse {
    let node_id = BrokerId(core.node.config.node_id);
    let table = core.topics();
    // kafka-protocol refuses to encode a field its version lacks, so fields are
    // set only from the version that has them.
    let mut response = MetadataResponse::default().with_brokers(
        table
            .live_brokers()
            .map(|b| {
                let (host, port) = b.endpoint(listener);
                let broker = MetadataResponseBroker::default()
                    .with_node_id(BrokerId(b.id))
                    .with_host(str_bytes(host.to_string()))
                    .with_port(i32::from(port));
                if version >= 1 {
                    broker.with_rack(b.rack.clone().map(str_bytes))
                } else {
                    broker
                }
            })
            .collect(),
    );
    if version >= 1 {
        response.controller_id = node_id;
    }
    if version >= 2 {
        // The cluster's, from the metadata; this data dir's own before the
        // first controller has named the cluster.
        let id = table
            .cluster_id
            .clone()
            .unwrap_or_else(|| core.node.cluster_id.clone());
        response.cluster_id = Some(str_bytes(id));
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
        table: &table,
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
    table: &'a TopicTable,
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
    let version = at.version;
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
        info.assignment
            .iter()
            .enumerate()
            .map(|(p, a)| partition(info, p as i32, a, at))
            .collect(),
    )
}

fn partition(
    info: &TopicInfo,
    p: i32,
    a: &Assignment,
    at: &Answer<'_>,
) -> MetadataResponsePartition {
    let table = at.table;
    let ids = |list: &[i32]| list.iter().copied().map(BrokerId).collect::<Vec<_>>();
    let live = |id: i32| table.broker(id).is_some_and(|b| !b.fenced);
    // This node leads it but its log cannot serve: offline, as Kafka says.
    let failed_here = a.leader == table.node_id
        && at
            .offline
            .contains(&TopicPartition::new(info.name.clone(), p));
    let mut offline_replicas: Vec<i32> = a.replicas.iter().copied().filter(|r| !live(*r)).collect();
    if failed_here && !offline_replicas.contains(&table.node_id) {
        offline_replicas.push(table.node_id);
    }
    let (error, leader, isr) = if a.leader == NO_LEADER || failed_here {
        let isr: Vec<i32> = a
            .isr
            .iter()
            .copied()
            .filter(|r| !failed_here || *r != table.node_id)
            .collect();
        (Some(ResponseError::LeaderNotAvailable), NO_LEADER, isr)
    } else {
        (None, a.leader, a.isr.clone())
    };
    let partition = MetadataResponsePartition::default()
        .with_partition_index(p)
        .with_error_code(error.map_or(0, |e| e.code()))
        .with_leader_id(BrokerId(leader))
        .with_replica_nodes(ids(&a.replicas))
        .with_isr_nodes(ids(&isr));
    let partition = if at.version >= 5 {
        partition.with_offline_replicas(ids(&offline_replicas))
    } else {
        partition
    };
    if at.version >= 7 {
        partition.with_leader_epoch(a.leader_epoch)
    } else {
        partition
    }
}
