//! The transaction APIs: AddPartitionsToTxn, AddOffsetsToTxn and EndTxn go
//! to the transaction coordinator of the id (`txn::coordinator`, which
//! answers NOT_COORDINATOR where this node is not it); WriteTxnMarkers is a
//! coordinator's request to this node as the leader of the partitions named
//! (`producer::write_marker_on_owner`).

use std::rc::Rc;

use kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnTopic;
use kafka_protocol::messages::add_partitions_to_txn_response::{
    AddPartitionsToTxnPartitionResult, AddPartitionsToTxnResult, AddPartitionsToTxnTopicResult,
};
use kafka_protocol::messages::write_txn_markers_response::{
    WritableTxnMarkerPartitionResult, WritableTxnMarkerResult, WritableTxnMarkerTopicResult,
};
use kafka_protocol::messages::{
    AddOffsetsToTxnRequest, AddOffsetsToTxnResponse, AddPartitionsToTxnRequest,
    AddPartitionsToTxnResponse, EndTxnRequest, EndTxnResponse, WriteTxnMarkersRequest,
    WriteTxnMarkersResponse,
};
use kafka_protocol::ResponseError;
use skiff_engine::TopicPartition;

use crate::state::CoreState;
use crate::txn::markers::MARKER_TIMEOUT;

/// AddPartitionsToTxn. v0-3 are a client's: one transactional id. v4 is a
/// partition leader's batch of KIP-890 checks (`verify_only`; a v4 entry
/// without it adds, as v3 does).
pub async fn add_partitions_to_txn(
    core: &CoreState,
    request: AddPartitionsToTxnRequest,
    version: i16,
) -> AddPartitionsToTxnResponse {
    if version < 4 {
        let topics = add_for_one(
            core,
            request.v3_and_below_transactional_id.to_string(),
            request.v3_and_below_producer_id.0,
            request.v3_and_below_producer_epoch,
            &request.v3_and_below_topics,
        )
        .await;
        return AddPartitionsToTxnResponse::default().with_results_by_topic_v3_and_below(topics);
    }
    let mut results = Vec::with_capacity(request.transactions.len());
    for t in &request.transactions {
        let id = t.transactional_id.to_string();
        let topics = if t.verify_only {
            verify_for_one(core, &id, t.producer_id.0, t.producer_epoch, &t.topics).await
        } else {
            add_for_one(core, id, t.producer_id.0, t.producer_epoch, &t.topics).await
        };
        results.push(
            AddPartitionsToTxnResult::default()
                .with_transactional_id(t.transactional_id.clone())
                .with_topic_results(topics),
        );
    }
    AddPartitionsToTxnResponse::default().with_results_by_transaction(results)
}

/// KIP-890's question for each partition: is it in the id's ongoing
/// transaction at this producer and epoch?
async fn verify_for_one(
    core: &CoreState,
    id: &str,
    producer_id: i64,
    epoch: i16,
    topics: &[AddPartitionsToTxnTopic],
) -> Vec<AddPartitionsToTxnTopicResult> {
    let mut out = Vec::new();
    for t in topics {
        let mut results = Vec::new();
        for &p in &t.partitions {
            let tp = TopicPartition::new(t.name.0.to_string(), p);
            let verdict =
                crate::txn::coordinator::verify_local(core, id.to_string(), producer_id, epoch, tp)
                    .await;
            results.push(
                AddPartitionsToTxnPartitionResult::default()
                    .with_partition_index(p)
                    .with_partition_error_code(verdict.err().map_or(0, |e| e.code())),
            );
        }
        out.push(
            AddPartitionsToTxnTopicResult::default()
                .with_name(t.name.clone())
                .with_results_by_partition(results),
        );
    }
    out
}

/// The partitions join the id's transaction. Every partition gets the one
/// answer; a partition that does not exist fails the request: it is
/// UNKNOWN_TOPIC_OR_PARTITION, the others OPERATION_NOT_ATTEMPTED (Kafka's
/// rule).
async fn add_for_one(
    core: &CoreState,
    id: String,
    producer_id: i64,
    epoch: i16,
    requested: &[AddPartitionsToTxnTopic],
) -> Vec<AddPartitionsToTxnTopicResult> {
    let table = core.topics();
    let mut partitions = Vec::new();
    let mut unknown = Vec::new();
    for t in requested {
        for &p in &t.partitions {
            let tp = TopicPartition::new(t.name.0.to_string(), p);
            let exists = table
                .get(&tp.topic)
                .is_some_and(|info| info.partition(p).is_some());
            if exists && !crate::group::is_internal_topic(&tp.topic) {
                partitions.push(tp);
            } else {
                unknown.push(tp);
            }
        }
    }
    let answer = |tp: &TopicPartition| -> i16 {
        if unknown.contains(tp) {
            ResponseError::UnknownTopicOrPartition.code()
        } else {
            ResponseError::OperationNotAttempted.code()
        }
    };
    let results: Vec<(TopicPartition, i16)> = if unknown.is_empty() {
        let outcome = crate::txn::coordinator::add_partitions(
            core,
            id,
            producer_id,
            epoch,
            partitions.clone(),
        )
        .await;
        let code = outcome.err().map_or(0, |e| e.code());
        partitions.into_iter().map(|tp| (tp, code)).collect()
    } else {
        partitions
            .iter()
            .chain(&unknown)
            .map(|tp| (tp.clone(), answer(tp)))
            .collect()
    };
    let mut topics: Vec<AddPartitionsToTxnTopicResult> = Vec::new();
    for (tp, code) in results {
        let result = AddPartitionsToTxnPartitionResult::default()
            .with_partition_index(tp.partition)
            .with_partition_error_code(code);
        match topics.iter_mut().find(|t| t.name.0.as_str() == tp.topic) {
            Some(t) => t.results_by_partition.push(result),
            None => topics.push(
                AddPartitionsToTxnTopicResult::default()
                    .with_name(kafka_protocol::messages::TopicName(
                        crate::kafka::str_bytes(tp.topic),
                    ))
                    .with_results_by_partition(vec![result]),
            ),
        }
    }
    topics
}

/// AddOffsetsToTxn: the group's `__consumer_offsets` partition joins the
/// transaction (its TxnOffsetCommit then goes to the group coordinator).
pub async fn add_offsets_to_txn(
    core: &CoreState,
    request: AddOffsetsToTxnRequest,
) -> AddOffsetsToTxnResponse {
    let response = AddOffsetsToTxnResponse::default();
    if let Err(e) = crate::group::ensure_offsets_topic(core).await {
        tracing::warn!(error = %e, "AddOffsetsToTxn: the offsets topic is not available");
        return response.with_error_code(ResponseError::CoordinatorNotAvailable.code());
    }
    let Some((offsets_tp, _)) = crate::group::coordinator_of(core, &request.group_id) else {
        return response.with_error_code(ResponseError::CoordinatorNotAvailable.code());
    };
    let outcome = crate::txn::coordinator::add_partitions(
        core,
        request.transactional_id.to_string(),
        request.producer_id.0,
        request.producer_epoch,
        vec![offsets_tp],
    )
    .await;
    response.with_error_code(outcome.err().map_or(0, |e| e.code()))
}

/// EndTxn: commit or abort, answered once the decision is durable.
pub async fn end_txn(core: &CoreState, request: EndTxnRequest) -> EndTxnResponse {
    let outcome = crate::txn::coordinator::end_txn(
        core,
        request.transactional_id.to_string(),
        request.producer_id.0,
        request.producer_epoch,
        request.committed,
    )
    .await;
    EndTxnResponse::default()
        .with_error_code(outcome.err().map_or(0, |e| e.code()))
        .with_producer_id(kafka_protocol::messages::ProducerId(-1))
        .with_producer_epoch(-1)
}

/// WriteTxnMarkers: every partition's marker, all at once; each answered
/// once durable on its in-sync replicas, or with why it is not.
pub async fn write_txn_markers(
    core: &Rc<CoreState>,
    request: WriteTxnMarkersRequest,
) -> WriteTxnMarkersResponse {
    let mut markers = Vec::with_capacity(request.markers.len());
    for m in request.markers {
        let writes = m.topics.iter().flat_map(|t| {
            t.partition_indexes.iter().map(|&p| {
                let tp = TopicPartition::new(t.name.0.to_string(), p);
                async move {
                    let result = crate::producer::write_marker_on_owner(
                        core,
                        &tp,
                        m.producer_id.0,
                        m.producer_epoch,
                        m.transaction_result,
                        m.coordinator_epoch,
                        MARKER_TIMEOUT,
                    )
                    .await;
                    (tp, result.err())
                }
            })
        });
        let results = futures_util::future::join_all(writes).await;
        let mut topics: Vec<WritableTxnMarkerTopicResult> = Vec::new();
        for (tp, error) in results {
            let result = WritableTxnMarkerPartitionResult::default()
                .with_partition_index(tp.partition)
                .with_error_code(error.map_or(0, |e| e.code()));
            match topics.iter_mut().find(|t| t.name.0.as_str() == tp.topic) {
                Some(t) => t.partitions.push(result),
                None => topics.push(
                    WritableTxnMarkerTopicResult::default()
                        .with_name(kafka_protocol::messages::TopicName(
                            crate::kafka::str_bytes(tp.topic),
                        ))
                        .with_partitions(vec![result]),
                ),
            }
        }
        markers.push(
            WritableTxnMarkerResult::default()
                .with_producer_id(m.producer_id)
                .with_topics(topics),
        );
    }
    WriteTxnMarkersResponse::default().with_markers(markers)
}
