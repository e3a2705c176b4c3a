//! AlterPartitionReassignments and ListPartitionReassignments (KIP-455): moving
//! a partition's replicas, decided by the active controller
//! (`decisions::alter_reassignments`), listed from this node's metadata; and
//! UnregisterBroker, for a node whose replicas have all moved away.
//!
//! Each entry is first checked against this node's metadata (an unknown
//! partition, a replication factor change that v1 forbids); the rest go to the
//! controller in one request, and are answered once this node has applied the
//! outcome. The new replicas then catch up as followers, join the ISR, and the
//! controller completes the move in that ISR change (see `replica/`).

use std::collections::BTreeMap;

use kafka_protocol::messages::alter_partition_reassignments_response::{
    ReassignablePartitionResponse, ReassignableTopicResponse,
};
use kafka_protocol::messages::list_partition_reassignments_response::{
    OngoingPartitionReassignment, OngoingTopicReassignment,
};
use kafka_protocol::messages::{
    AlterPartitionReassignmentsRequest, AlterPartitionReassignmentsResponse, BrokerId,
    ListPartitionReassignmentsRequest, ListPartitionReassignmentsResponse, TopicName,
    UnregisterBrokerRequest, UnregisterBrokerResponse,
};
use kafka_protocol::ResponseError;
use skiff_controller::decisions::Reassignment;

use crate::kafka::str_bytes;
use crate::state::CoreState;
use crate::topics;

pub async fn alter(
    core: &CoreState,
    request: AlterPartitionReassignmentsRequest,
    version: i16,
) -> AlterPartitionReassignmentsResponse {
    // v0 has no flag and always allowed it; v1 says.
    let rf_change_allowed = version == 0 || request.allow_replication_factor_change;
    // (topic, partition) -> its answer; `None` while it waits for the controller.
    let mut results: BTreeMap<(String, i32), Option<(i16, String)>> = BTreeMap::new();
    let mut entries = Vec::new();
    let mut asked = Vec::new();
    {
        let table = core.topics();
        for t in request.topics {
            let name = t.name.0.to_string();
            for p in t.partitions {
                let target: Option<Vec<i32>> =
                    p.replicas.map(|r| r.into_iter().map(|b| b.0).collect());
                let assignment = table
                    .get(&name)
                    .and_then(|t| t.assignment.get(usize::try_from(p.partition_index).ok()?));
                let verdict = match (assignment, &target) {
                    (None, _) => Some((
                        ResponseError::UnknownTopicOrPartition.code(),
                        format!("no partition {} of topic {name}", p.partition_index),
                    )),
                    (Some(a), Some(target)) if !rf_change_allowed => {
                        let original = a.replicas.len() - a.adding.len();
                        (target.len() != original).then(|| {
                            (
                                ResponseError::InvalidReplicationFactor.code(),
                                format!(
                                    "the target {target:?} changes the replication factor {original} \
                                     (allow_replication_factor_change is false)"
                                ),
                            )
                        })
                    }
                    _ => None,
                };
                if verdict.is_none() {
                    entries.push(Reassignment {
                        topic: name.clone(),
                        index: p.partition_index as u32,
                        target,
                    });
                    asked.push((name.clone(), p.partition_index));
                }
                results.insert((name.clone(), p.partition_index), verdict);
            }
        }
    }
    if !entries.is_empty() {
        match topics::alter_reassignments(core, entries).await {
            Ok(refusals) => {
                for (key, refusal) in asked.into_iter().zip(refusals) {
                    results.insert(key, refusal);
                }
            }
            Err(e) => {
                // Nothing is known about them: the client retries or asks.
                for key in asked {
                    results.insert(
                        key,
                        Some((ResponseError::RequestTimedOut.code(), e.to_string())),
                    );
                }
            }
        }
    }
    let mut by_topic: BTreeMap<String, Vec<ReassignablePartitionResponse>> = BTreeMap::new();
    for ((name, p), verdict) in results {
        let r = ReassignablePartitionResponse::default().with_partition_index(p);
        by_topic.entry(name).or_default().push(match verdict {
            None => r,
            Some((code, message)) => r
                .with_error_code(code)
                .with_error_message(Some(str_bytes(message))),
        });
    }
    AlterPartitionReassignmentsResponse::default()
        .with_allow_replication_factor_change(rf_change_allowed)
        .with_responses(
            by_topic
                .into_iter()
                .map(|(name, partitions)| {
                    ReassignableTopicResponse::default()
                        .with_name(TopicName(str_bytes(name)))
                        .with_partitions(partitions)
                })
                .collect(),
        )
}

/// The running reassignments of the asked partitions (every partition: null
/// topics); unknown partitions and ones not being reassigned are left out, as
/// Kafka does.
pub fn list(
    core: &CoreState,
    request: ListPartitionReassignmentsRequest,
) -> ListPartitionReassignmentsResponse {
    let table = core.topics();
    let asked: Vec<(String, Option<Vec<i32>>)> = match request.topics {
        Some(list) => list
            .into_iter()
            .map(|t| (t.name.0.to_string(), Some(t.partition_indexes)))
            .collect(),
        None => table.topics.keys().map(|n| (n.clone(), None)).collect(),
    };
    let mut topics = Vec::new();
    for (name, indexes) in asked {
        let Some(info) = table.get(&name) else {
            continue;
        };
        let indexes = indexes.unwrap_or_else(|| (0..info.partitions).collect());
        let partitions: Vec<OngoingPartitionReassignment> = indexes
            .into_iter()
            .filter_map(|p| Some((p, info.assignment.get(usize::try_from(p).ok()?)?)))
            .filter(|(_, a)| !a.adding.is_empty() || !a.removing.is_empty())
            .map(|(p, a)| {
                let ids = |v: &[i32]| v.iter().copied().map(BrokerId).collect::<Vec<_>>();
                OngoingPartitionReassignment::default()
                    .with_partition_index(p)
                    .with_replicas(ids(&a.replicas))
                    .with_adding_replicas(ids(&a.adding))
                    .with_removing_replicas(ids(&a.removing))
            })
            .collect();
        if !partitions.is_empty() {
            topics.push(
                OngoingTopicReassignment::default()
                    .with_name(TopicName(str_bytes(name)))
                    .with_partitions(partitions),
            );
        }
    }
    ListPartitionReassignmentsResponse::default().with_topics(topics)
}

/// UnregisterBroker: the controller refuses a running node or one that still
/// holds replicas (`decisions::unregister_node`), with the reason.
pub async fn unregister_broker(
    core: &CoreState,
    request: UnregisterBrokerRequest,
) -> UnregisterBrokerResponse {
    match topics::unregister_node(core, request.broker_id.0).await {
        Ok(()) => UnregisterBrokerResponse::default(),
        Err(e) => {
            let code = match &e {
                topics::TopicError::Refused { code, .. } => *code,
                _ => ResponseError::RequestTimedOut.code(),
            };
            UnregisterBrokerResponse::default()
                .with_error_code(code)
                .with_error_message(Some(str_bytes(e.to_string())))
        }
    }
}
