//! ElectLeaders (KIP-460): preferred or unclean leader elections, decided by
//! the active controller (`decisions::elect_leaders`).
//!
//! Each asked partition is first judged against this node's metadata: an
//! unknown one, one that needs no election (its preferred replica leads; for
//! unclean, it has a leader) and one that cannot have one (the preferred
//! replica is out of the ISR or fenced; for unclean, no replica is unfenced)
//! are answered at once with Kafka's codes. The rest go to the controller in
//! one request; once this node has applied the result, each is answered by
//! what its metadata now says. A request for every partition (null) answers
//! only the partitions an election was tried for, as Kafka does.

use std::collections::BTreeMap;

use kafka_protocol::messages::elect_leaders_response::{PartitionResult, ReplicaElectionResult};
use kafka_protocol::messages::{ElectLeadersRequest, ElectLeadersResponse, TopicName};
use kafka_protocol::ResponseError;
use skiff_controller::decisions::ElectionType;

use crate::kafka::str_bytes;
use crate::state::CoreState;
use crate::topics::{self, Assignment, TopicTable, NO_LEADER};

/// Kafka's election type codes.
const PREFERRED: i8 = 0;
const UNCLEAN: i8 = 1;

/// Why a partition gets no election, or `None` if it should have one.
fn judge(
    table: &TopicTable,
    election: ElectionType,
    a: &Assignment,
) -> Option<(ResponseError, String)> {
    let live = |n: i32| table.brokers.iter().any(|b| b.id == n && !b.fenced);
    match election {
        ElectionType::Preferred => {
            let preferred = *a.replicas.first()?;
            if a.leader == preferred {
                Some((
                    ResponseError::ElectionNotNeeded,
                    format!("node {preferred}, the preferred replica, leads already"),
                ))
            } else if !a.isr.contains(&preferred) || !live(preferred) {
                Some((
                    ResponseError::PreferredLeaderNotAvailable,
                    format!("the preferred replica, node {preferred}, is not in the ISR {:?} or not unfenced", a.isr),
                ))
            } else {
                None
            }
        }
        ElectionType::Unclean => {
            if a.leader != NO_LEADER {
                Some((
                    ResponseError::ElectionNotNeeded,
                    format!("node {} leads", a.leader),
                ))
            } else if !a.replicas.iter().any(|r| live(*r)) {
                Some((
                    ResponseError::EligibleLeadersNotAvailable,
                    format!("no replica of {:?} is unfenced", a.replicas),
                ))
            } else {
                None
            }
        }
    }
}

pub async fn handle(
    core: &CoreState,
    request: ElectLeadersRequest,
    version: i16,
) -> ElectLeadersResponse {
    let election = match (version, request.election_type) {
        (0, _) | (_, PREFERRED) => ElectionType::Preferred,
        (_, UNCLEAN) => ElectionType::Unclean,
        // Only v1+ carries a type, and a top-level error code with it.
        (_, other) => {
            tracing::debug!(election_type = other, "ElectLeaders: unknown election type");
            return ElectLeadersResponse::default()
                .with_error_code(ResponseError::InvalidRequest.code());
        }
    };
    let table = core.topics();
    let all = request.topic_partitions.is_none();
    let asked: Vec<(String, i32)> = match request.topic_partitions {
        Some(list) => list
            .into_iter()
            .flat_map(|t| {
                let name = t.topic.0.to_string();
                t.partitions.into_iter().map(move |p| (name.clone(), p))
            })
            .collect(),
        None => table
            .topics
            .values()
            .flat_map(|t| (0..t.partitions).map(move |p| (t.name.clone(), p)))
            .collect(),
    };
    // (topic, partition) -> its answer, or None while it waits for the election.
    let mut results: BTreeMap<(String, i32), Option<(ResponseError, String)>> = BTreeMap::new();
    let mut candidates = Vec::new();
    for (name, p) in asked {
        let assignment = table
            .get(&name)
            .and_then(|t| t.assignment.get(usize::try_from(p).ok()?));
        let verdict = match assignment {
            None => Some((
                ResponseError::UnknownTopicOrPartition,
                format!("no partition {p} of topic {name}"),
            )),
            Some(a) => judge(&table, election, a),
        };
        if all && verdict.is_some() {
            continue;
        }
        if verdict.is_none() {
            candidates.push((name.clone(), p as u32));
        }
        results.insert((name, p), verdict);
    }
    drop(table);
    if !candidates.is_empty() {
        let outcome = topics::elect_leaders(core, election, candidates).await;
        let table = core.topics();
        for ((name, p), verdict) in results.iter_mut() {
            if verdict.is_some() {
                continue;
            }
            if let Err(e) = &outcome {
                *verdict = Some((ResponseError::RequestTimedOut, e.to_string()));
                continue;
            }
            let Some(a) = table
                .get(name)
                .and_then(|t| t.assignment.get(usize::try_from(*p).ok()?))
            else {
                *verdict = Some((
                    ResponseError::UnknownTopicOrPartition,
                    format!("topic {name} was deleted"),
                ));
                continue;
            };
            let elected = match election {
                ElectionType::Preferred => a.replicas.first() == Some(&a.leader),
                ElectionType::Unclean => a.leader != NO_LEADER,
            };
            *verdict = if elected {
                None
            } else {
                judge(&table, election, a).or(Some((
                    ResponseError::PreferredLeaderNotAvailable,
                    "the controller did not elect it".to_string(),
                )))
            };
        }
    }
    let mut by_topic: BTreeMap<String, Vec<PartitionResult>> = BTreeMap::new();
    for ((name, p), verdict) in results {
        let r = PartitionResult::default().with_partition_id(p);
        by_topic.entry(name).or_default().push(match verdict {
            None => r,
            Some((code, message)) => r
                .with_error_code(code.code())
                .with_error_message(Some(str_bytes(message))),
        });
    }
    ElectLeadersResponse::default().with_replica_election_results(
        by_topic
            .into_iter()
            .map(|(name, partitions)| {
                ReplicaElectionResult::default()
                    .with_topic(TopicName(str_bytes(name)))
                    .with_partition_result(partitions)
            })
            .collect(),
    )
}

/// The answer without ALTER on the cluster: every asked partition refused
/// with CLUSTER_AUTHORIZATION_FAILED (and, from v1, the whole request).
pub fn refused(request: &ElectLeadersRequest, version: i16) -> ElectLeadersResponse {
    let code = ResponseError::ClusterAuthorizationFailed.code();
    let results = request
        .topic_partitions
        .iter()
        .flatten()
        .map(|t| {
            ReplicaElectionResult::default()
                .with_topic(t.topic.clone())
                .with_partition_result(
                    t.partitions
                        .iter()
                        .map(|p| {
                            PartitionResult::default()
                                .with_partition_id(*p)
                                .with_error_code(code)
                        })
                        .collect(),
                )
        })
        .collect();
    let response = ElectLeadersResponse::default().with_replica_election_results(results);
    if version >= 1 {
        response.with_error_code(code)
    } else {
        response
    }
}
