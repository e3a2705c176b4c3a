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

use crate::handlers::authz::{self, Access};
use crate::state::CoreState;
use crate::txn::markers::MARKER_TIMEOUT;
use kafka_protocol::messages::describe_transactions_response::{
    TopicData as DescribedTopic, TransactionState as DescribedTransaction,
};
use kafka_protocol::messages::list_transactions_response::TransactionState as ListedTransaction;
use kafka_protocol::messages::{
    DescribeTransactionsRequest, DescribeTransactionsResponse, ListTransactionsRequest,
    ListTransactionsResponse, TransactionalId,
};
use kafka_protocol::protocol::StrBytes;
use skiff_coordinator::txn::TxnState;
use skiff_security::{AclOperation as Op, ResourceType};

/// AddPartitionsToTxn. v0-3 are a client's: one transactional id. v4 is a
/// partition leader's batch of KIP-890 checks (`verify_only`; a v4 entry
/// without it adds, as v3 does).
pub async fn add_partitions_to_txn(
    core: &CoreState,
    access: &Access,
    request: AddPartitionsToTxnRequest,
    version: i16,
) -> AddPartitionsToTxnResponse {
    if version < 4 {
        let id = request.v3_and_below_transactional_id.to_string();
        if let Some(refusal) = refused(access, &id, &request.v3_and_below_topics) {
            return AddPartitionsToTxnResponse::default()
                .with_results_by_topic_v3_and_below(refusal);
        }
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
    if let Some(error) = authz::cluster_action(access) {
        return AddPartitionsToTxnResponse::default().with_error_code(error.code());
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

/// A client's AddPartitionsToTxn its principal may not make: every
/// partition TRANSACTIONAL_ID_AUTHORIZATION_FAILED (no WRITE on the id), or
/// TOPIC_AUTHORIZATION_FAILED on the topics it may not write and
/// OPERATION_NOT_ATTEMPTED on the rest (Kafka's answers).
fn refused(
    access: &Access,
    id: &str,
    topics: &[AddPartitionsToTxnTopic],
) -> Option<Vec<AddPartitionsToTxnTopicResult>> {
    let denied_id = authz::transactional_id(access, id);
    let denied_topics: Vec<&str> = topics
        .iter()
        .map(|t| t.name.0.as_str())
        .filter(|t| !access.unrestricted() && !access.topic(Op::Write, t))
        .collect();
    if denied_id.is_none() && denied_topics.is_empty() {
        return None;
    }
    Some(
        topics
            .iter()
            .map(|t| {
                let code = match denied_id {
                    Some(e) => e,
                    None if denied_topics.contains(&t.name.0.as_str()) => {
                        ResponseError::TopicAuthorizationFailed
                    }
                    None => ResponseError::OperationNotAttempted,
                };
                AddPartitionsToTxnTopicResult::default()
                    .with_name(t.name.clone())
                    .with_results_by_partition(
                        t.partitions
                            .iter()
                            .map(|&p| {
                                AddPartitionsToTxnPartitionResult::default()
                                    .with_partition_index(p)
                                    .with_partition_error_code(code.code())
                            })
                            .collect(),
                    )
            })
            .collect(),
    )
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
    access: &Access,
    request: AddOffsetsToTxnRequest,
) -> AddOffsetsToTxnResponse {
    let response = AddOffsetsToTxnResponse::default();
    if let Some(e) = authz::transactional_id(access, &request.transactional_id) {
        return response.with_error_code(e.code());
    }
    if !access.unrestricted() && !access.group(Op::Read, &request.group_id) {
        return response.with_error_code(ResponseError::GroupAuthorizationFailed.code());
    }
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
pub async fn end_txn(core: &CoreState, access: &Access, request: EndTxnRequest) -> EndTxnResponse {
    if let Some(e) = authz::transactional_id(access, &request.transactional_id) {
        return EndTxnResponse::default()
            .with_error_code(e.code())
            .with_producer_id(kafka_protocol::messages::ProducerId(-1))
            .with_producer_epoch(-1);
    }
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
    access: &Access,
    request: WriteTxnMarkersRequest,
) -> WriteTxnMarkersResponse {
    let denied = authz::cluster_action(access);
    let mut markers = Vec::with_capacity(request.markers.len());
    for m in request.markers {
        let writes = m.topics.iter().flat_map(|t| {
            t.partition_indexes.iter().map(|&p| {
                let tp = TopicPartition::new(t.name.0.to_string(), p);
                async move {
                    if let Some(e) = denied {
                        return (tp, Some(e));
                    }
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

/// ListTransactions: the transactional ids this node coordinates (clients
/// ask every broker), filtered by state, producer id and (v1) how long the
/// transaction has run; only ids the principal may DESCRIBE.
pub async fn list_transactions(
    core: &CoreState,
    access: &Access,
    request: ListTransactionsRequest,
    version: i16,
) -> ListTransactionsResponse {
    let known: Vec<&str> = ALL_STATES.iter().map(|s| s.name()).collect();
    let unknown: Vec<_> = request
        .state_filters
        .iter()
        .filter(|f| !known.contains(&f.as_str()))
        .cloned()
        .collect();
    let now = crate::kafka::now_ms();
    let min_duration = if version >= 1 {
        request.duration_filter
    } else {
        -1
    };
    let states = crate::txn::coordinator::list_all(core)
        .await
        .into_iter()
        .filter(|(id, r)| {
            (request.state_filters.is_empty()
                || request
                    .state_filters
                    .iter()
                    .any(|f| f.as_str() == r.state.name()))
                && (request.producer_id_filters.is_empty()
                    || request
                        .producer_id_filters
                        .iter()
                        .any(|p| p.0 == r.producer_id))
                && (min_duration < 0 || (r.start_ms >= 0 && now - r.start_ms >= min_duration))
                && (access.unrestricted()
                    || access.allowed(Op::Describe, ResourceType::TransactionalId, id))
        })
        .map(|(id, r)| {
            ListedTransaction::default()
                .with_transactional_id(TransactionalId(crate::kafka::str_bytes(id)))
                .with_producer_id(kafka_protocol::messages::ProducerId(r.producer_id))
                .with_transaction_state(StrBytes::from_static_str(r.state.name()))
        })
        .collect();
    ListTransactionsResponse::default()
        .with_unknown_state_filters(unknown)
        .with_transaction_states(states)
}

/// DescribeTransactions: each id's state where this node coordinates it
/// (NOT_COORDINATOR elsewhere: clients ask the id's coordinator).
pub async fn describe_transactions(
    core: &CoreState,
    access: &Access,
    request: DescribeTransactionsRequest,
) -> DescribeTransactionsResponse {
    let mut out = Vec::with_capacity(request.transactional_ids.len());
    for id in request.transactional_ids {
        let mut described = DescribedTransaction::default()
            .with_transactional_id(id.clone())
            .with_producer_id(kafka_protocol::messages::ProducerId(-1))
            .with_producer_epoch(-1)
            .with_transaction_start_time_ms(-1);
        let denied = !access.unrestricted()
            && !access.allowed(Op::Describe, ResourceType::TransactionalId, &id);
        if denied {
            out.push(
                described.with_error_code(ResponseError::TransactionalIdAuthorizationFailed.code()),
            );
            continue;
        }
        match crate::txn::coordinator::describe(core, id.to_string()).await {
            Err(e) => described.error_code = e.code(),
            Ok(r) => {
                let mut topics: Vec<DescribedTopic> = Vec::new();
                for p in &r.partitions {
                    match topics.iter_mut().find(|t| t.topic.0.as_str() == p.topic) {
                        Some(t) => t.partitions.push(p.partition),
                        None => topics.push(
                            DescribedTopic::default()
                                .with_topic(kafka_protocol::messages::TopicName(
                                    crate::kafka::str_bytes(p.topic.clone()),
                                ))
                                .with_partitions(vec![p.partition]),
                        ),
                    }
                }
                described = described
                    .with_transaction_state(StrBytes::from_static_str(r.state.name()))
                    .with_transaction_timeout_ms(r.timeout_ms)
                    .with_transaction_start_time_ms(r.start_ms)
                    .with_producer_id(kafka_protocol::messages::ProducerId(r.producer_id))
                    .with_producer_epoch(r.producer_epoch)
                    .with_topics(topics);
            }
        }
        out.push(described);
    }
    DescribeTransactionsResponse::default().with_transaction_states(out)
}

/// Every state a transaction can be in (ListTransactions' filters).
const ALL_STATES: [TxnState; 8] = [
    TxnState::Empty,
    TxnState::Ongoing,
    TxnState::PrepareCommit,
    TxnState::PrepareAbort,
    TxnState::CompleteCommit,
    TxnState::CompleteAbort,
    TxnState::Dead,
    TxnState::PrepareEpochFence,
];
