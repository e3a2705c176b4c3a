//! Writing a decided transaction's COMMIT or ABORT markers to every
//! partition it touched (Kafka's `TransactionMarkerChannelManager`).
//!
//! ```text
//! write_all(markers, coordinator epoch)
//!   loop until every partition answered, or the coordinator lost its
//!   leadership (`still`) or the node stops:
//!     group the partitions left by the leader this node's metadata names
//!     (a deleted topic needs no marker; no leader yet: next round)
//!     per leader, all at once:
//!       this node  -> producer::write_marker on the partition's owner core
//!       another    -> WriteTxnMarkers v1 over a BrokerLink (from the core's
//!                     pool, dropped on any I/O error)
//!     per partition: done (written; or the topic is gone from this node's
//!     metadata), or retried after a backoff (not the leader, not enough
//!     replicas, a dead link, a leader that does not know the partition)
//! ```
//!
//! A marker is idempotent where it lands: a second one for a producer with
//! no open transaction there completes nothing (the engine's `TxnTracker`),
//! so a round retried after a lost answer is harmless.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::rc::Rc;
use std::time::Duration;

use kafka_protocol::messages::write_txn_markers_request::{
    WritableTxnMarker, WritableTxnMarkerTopic,
};
use kafka_protocol::messages::{ProducerId, TopicName, WriteTxnMarkersRequest};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use skiff_coordinator::txn::Markers;
use skiff_engine::TopicPartition;

use crate::broker_link;
use crate::state::CoreState;

/// WriteTxnMarkers v1 (Kafka 4 dropped v0).
const WRITE_TXN_MARKERS_VERSION: i16 = 1;
/// How long a partition leader may take to make a marker durable on its
/// in-sync replicas (Kafka: `request.timeout.ms` for the marker append).
pub const MARKER_TIMEOUT: Duration = Duration::from_secs(5);
const BACKOFF_MIN: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Writes `markers` to every partition of the transaction; true once all
/// are written, false if `still()` turned false or the node stops first.
pub async fn write_all(
    core: &Rc<CoreState>,
    markers: &Markers,
    coordinator_epoch: i32,
    still: impl Fn() -> bool,
) -> bool {
    let mut left: BTreeSet<TopicPartition> = markers
        .partitions
        .iter()
        .map(|p| TopicPartition::new(p.topic.clone(), p.partition))
        .collect();
    let mut backoff = BACKOFF_MIN;
    let mut rounds = 0u32;
    while !left.is_empty() {
        if !still() || core.stopping.get() {
            return false;
        }
        rounds += 1;
        let table = core.topics();
        let mut by_leader: BTreeMap<i32, Vec<TopicPartition>> = BTreeMap::new();
        let mut gone = Vec::new();
        for tp in &left {
            match table
                .get(&tp.topic)
                .map(|info| info.partition(tp.partition).map(|a| a.leader))
            {
                // Deleted (or never there): nothing to end.
                None | Some(None) => gone.push(tp.clone()),
                Some(Some(leader)) if leader >= 0 => {
                    by_leader.entry(leader).or_default().push(tp.clone())
                }
                // No leader now: the next round looks again.
                Some(Some(_)) => {}
            }
        }
        for tp in gone {
            tracing::debug!(partition = %tp, transactional_id = %markers.id, "no marker for a partition whose topic is gone");
            left.remove(&tp);
        }
        let me = table.node_id;
        let answers = futures_util::future::join_all(by_leader.into_iter().map(|(leader, tps)| {
            let core = core.clone();
            async move {
                if leader == me {
                    write_local(&core, markers, coordinator_epoch, tps).await
                } else {
                    write_remote(&core, leader, markers, coordinator_epoch, tps).await
                }
            }
        }))
        .await;
        for (tp, result) in answers.into_iter().flatten() {
            match result {
                Ok(()) => {
                    left.remove(&tp);
                }
                // Kafka retries this one too: a leader whose metadata does
                // not name the partition yet (or no longer: the next round
                // drops a topic this node's metadata says is deleted). Taken
                // as done, the partition kept the transaction open with no
                // marker to end it, and its last stable offset stopped there.
                Err(ResponseError::UnknownTopicOrPartition) => {
                    tracing::debug!(partition = %tp, transactional_id = %markers.id, "the leader does not know the partition; retrying");
                }
                Err(ResponseError::TransactionCoordinatorFenced) => {
                    // A newer coordinator of this id has written there: this
                    // one is deposed (its leadership check will say so).
                    tracing::warn!(
                        partition = %tp, transactional_id = %markers.id, coordinator_epoch,
                        "the partition refused the marker: a newer transaction coordinator wrote there"
                    );
                    return false;
                }
                Err(ResponseError::InvalidProducerEpoch) => {
                    // The partition holds a later epoch of this producer: a
                    // newer decision reached it; this one has nothing left
                    // to end there.
                    tracing::warn!(
                        partition = %tp, transactional_id = %markers.id,
                        producer_id = markers.producer_id, epoch = markers.epoch,
                        "the partition refused the marker: it has seen a later epoch of the producer"
                    );
                    left.remove(&tp);
                }
                Err(e) => {
                    tracing::debug!(partition = %tp, transactional_id = %markers.id, error = ?e, "marker not written yet; retrying");
                }
            }
        }
        if !left.is_empty() {
            if rounds % 20 == 0 {
                tracing::warn!(
                    transactional_id = %markers.id, rounds, partitions_left = left.len(),
                    "transaction markers still not written"
                );
            }
            glommio::timer::sleep(backoff).await;
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
    }
    true
}

/// Markers for partitions this node leads, each on its owner core.
async fn write_local(
    core: &Rc<CoreState>,
    markers: &Markers,
    coordinator_epoch: i32,
    tps: Vec<TopicPartition>,
) -> Vec<(TopicPartition, Result<(), ResponseError>)> {
    futures_util::future::join_all(tps.into_iter().map(|tp| {
        let core = core.clone();
        async move {
            let result = crate::producer::write_marker_on_owner(
                &core,
                &tp,
                markers.producer_id,
                markers.epoch,
                markers.commit,
                coordinator_epoch,
                MARKER_TIMEOUT,
            )
            .await
            .map(|_| ());
            (tp, result)
        }
    }))
    .await
}

/// Markers for partitions `leader` leads, in one WriteTxnMarkers request.
async fn write_remote(
    core: &Rc<CoreState>,
    leader: i32,
    markers: &Markers,
    coordinator_epoch: i32,
    tps: Vec<TopicPartition>,
) -> Vec<(TopicPartition, Result<(), ResponseError>)> {
    let failed = |tps: Vec<TopicPartition>, e: ResponseError| -> Vec<_> {
        tps.into_iter().map(|tp| (tp, Err(e))).collect()
    };
    let mut topics: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
    for tp in &tps {
        topics.entry(&tp.topic).or_default().push(tp.partition);
    }
    let request =
        WriteTxnMarkersRequest::default().with_markers(vec![WritableTxnMarker::default()
            .with_producer_id(ProducerId(markers.producer_id))
            .with_producer_epoch(markers.epoch)
            .with_transaction_result(markers.commit)
            .with_coordinator_epoch(coordinator_epoch)
            .with_topics(
                topics
                    .into_iter()
                    .map(|(name, partitions)| {
                        WritableTxnMarkerTopic::default()
                            .with_name(TopicName(StrBytes::from_string(name.to_string())))
                            .with_partition_indexes(partitions)
                    })
                    .collect(),
            )]);
    let mut link = match broker_link::take(core, leader, "skiff-txn-markers").await {
        Ok(l) => l,
        Err(e) => {
            tracing::debug!(leader, error = %e, "connecting to a partition leader for markers");
            return failed(tps, ResponseError::NetworkException);
        }
    };
    let response = match link
        .call(&request, WRITE_TXN_MARKERS_VERSION, MARKER_TIMEOUT)
        .await
    {
        Ok(r) => r,
        Err(e) => {
            // The link's framing is unknown now: it is dropped.
            tracing::debug!(leader, error = %e, "WriteTxnMarkers failed");
            return failed(tps, ResponseError::NetworkException);
        }
    };
    broker_link::give_back(leader, link);
    let mut answered: HashMap<TopicPartition, i16> = HashMap::new();
    for m in response
        .markers
        .iter()
        .filter(|m| m.producer_id.0 == markers.producer_id)
    {
        for t in &m.topics {
            for p in &t.partitions {
                answered.insert(
                    TopicPartition::new(t.name.0.to_string(), p.partition_index),
                    p.error_code,
                );
            }
        }
    }
    tps.into_iter()
        .map(|tp| {
            let result =
                match answered.get(&tp) {
                    Some(0) => Ok(()),
                    Some(&code) => Err(ResponseError::try_from_code(code)
                        .unwrap_or(ResponseError::UnknownServerError)),
                    // Not answered: asked again next round.
                    None => Err(ResponseError::UnknownServerError),
                };
            (tp, result)
        })
        .collect()
}
