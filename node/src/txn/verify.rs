//! KIP-890 part 1 at a partition leader: a transactional write that would
//! open a transaction on a partition is taken only once the transaction
//! coordinator of its transactional id confirms that the id's ongoing
//! transaction (at that producer id and epoch) holds the partition.
//!
//! ```text
//! produce (transactional batch, no transaction of its producer open here)
//!   -> append_idempotent refuses it as Unverified { markers seen so far }
//!   -> verify(): the coordinator of the id
//!        this node  -> coordinator::verify_local on the owner core
//!        another    -> AddPartitionsToTxn v4, verify_only, over a BrokerLink
//!   -> the append again, guarded: only if no marker of the producer reached
//!      the partition since (else the transaction ended meanwhile: refused)
//! ```
//!
//! Without it, a write delayed past its transaction's end (a retry stuck in
//! the network, a zombie producer) opens a transaction no marker ends: the
//! last stable offset stops there and read_committed readers with it.

use std::time::Duration;

use kafka_protocol::messages::add_partitions_to_txn_request::{
    AddPartitionsToTxnTopic, AddPartitionsToTxnTransaction,
};
use kafka_protocol::messages::{AddPartitionsToTxnRequest, ProducerId, TopicName, TransactionalId};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use skiff_engine::TopicPartition;

use crate::broker_link;
use crate::state::CoreState;

/// AddPartitionsToTxn v4: the brokers' batched form with `verify_only`.
const VERIFY_VERSION: i16 = 4;
const VERIFY_WAIT: Duration = Duration::from_secs(5);

/// Whether the coordinator of `transactional_id` confirms that `tp` is in
/// the id's ongoing transaction at `producer_id` and `epoch`. Errors are
/// what a producer is told (KIP-890): the coordinator unreachable, moving
/// or loading is NOT_ENOUGH_REPLICAS (retriable, which a producer expects
/// from a produce); a write outside its transaction INVALID_TXN_STATE; an
/// old epoch INVALID_PRODUCER_EPOCH.
pub async fn verify(
    core: &CoreState,
    transactional_id: &str,
    producer_id: i64,
    epoch: i16,
    tp: &TopicPartition,
) -> Result<(), ResponseError> {
    let answer = ask(core, transactional_id, producer_id, epoch, tp).await;
    answer.map_err(|e| match e {
        ResponseError::NotCoordinator
        | ResponseError::CoordinatorNotAvailable
        | ResponseError::CoordinatorLoadInProgress
        | ResponseError::ConcurrentTransactions
        | ResponseError::NetworkException
        | ResponseError::RequestTimedOut => ResponseError::NotEnoughReplicas,
        ResponseError::ProducerFenced => ResponseError::InvalidProducerEpoch,
        ResponseError::InvalidProducerIdMapping => ResponseError::InvalidTxnState,
        other => other,
    })
}

async fn ask(
    core: &CoreState,
    transactional_id: &str,
    producer_id: i64,
    epoch: i16,
    tp: &TopicPartition,
) -> Result<(), ResponseError> {
    let Some((txn_tp, _)) = super::coordinator_of(core, transactional_id) else {
        return Err(ResponseError::CoordinatorNotAvailable);
    };
    let table = core.topics();
    let leader = table
        .get(&txn_tp.topic)
        .and_then(|t| t.partition(txn_tp.partition))
        .map(|a| a.leader)
        .filter(|l| *l >= 0)
        .ok_or(ResponseError::CoordinatorNotAvailable)?;
    if leader == table.node_id {
        return super::coordinator::verify_local(
            core,
            transactional_id.to_string(),
            producer_id,
            epoch,
            tp.clone(),
        )
        .await;
    }
    let request = AddPartitionsToTxnRequest::default().with_transactions(vec![
        AddPartitionsToTxnTransaction::default()
            .with_transactional_id(TransactionalId(StrBytes::from_string(
                transactional_id.to_string(),
            )))
            .with_producer_id(ProducerId(producer_id))
            .with_producer_epoch(epoch)
            .with_verify_only(true)
            .with_topics(vec![AddPartitionsToTxnTopic::default()
                .with_name(TopicName(StrBytes::from_string(tp.topic.clone())))
                .with_partitions(vec![tp.partition])]),
    ]);
    let mut link = broker_link::take(core, leader, "skiff-txn-verify")
        .await
        .map_err(|_| ResponseError::NetworkException)?;
    let response = link
        .call(&request, VERIFY_VERSION, VERIFY_WAIT)
        .await
        .map_err(|e| {
            tracing::debug!(leader, error = %e, "KIP-890 verification call failed");
            ResponseError::NetworkException
        })?;
    broker_link::give_back(leader, link);
    if response.error_code != 0 {
        return Err(code(response.error_code));
    }
    let found = response
        .results_by_transaction
        .iter()
        .filter(|t| t.transactional_id.as_str() == transactional_id)
        .flat_map(|t| &t.topic_results)
        .filter(|t| t.name.0.as_str() == tp.topic)
        .flat_map(|t| &t.results_by_partition)
        .find(|p| p.partition_index == tp.partition)
        .map(|p| p.partition_error_code);
    match found {
        Some(0) => Ok(()),
        Some(c) => Err(code(c)),
        None => Err(ResponseError::InvalidTxnState),
    }
}

fn code(c: i16) -> ResponseError {
    ResponseError::try_from_code(c).unwrap_or(ResponseError::UnknownServerError)
}
