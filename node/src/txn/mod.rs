//! Transactions on a node: the transaction coordinator of the transactional
//! ids whose `__transaction_state` partition this node leads.
//!
//! Where a transactional id lives: partition `P = abs(java_hashCode(id)) %
//! partitions` of `__transaction_state` (Kafka's rule, as for groups), and
//! the core that owns P owns the id: its state, its writes to P. Requests for
//! an id are forwarded to that core with `Shard::invoke_on`.
//!
//! - `skiff_coordinator::txn`: the coordinator's rules, sans I/O, and
//!   Kafka's `__transaction_state` record formats; what this module drives.
//! - `coordinator.rs`: per-core glue: loading a partition when its
//!   leadership arrives, the writes, the replies.
//!
//! - `markers.rs`: a decided transaction's COMMIT/ABORT markers, written
//!   to every partition's leader (this node's own on their owner cores,
//!   others' with WriteTxnMarkers over a `BrokerLink`).
//!
//! Built so far (issue 18): FindCoordinator for transactions, InitProducerId
//! with a transactional id (a new id, an epoch bump that fences the previous
//! producer, KIP-360 recovery), AddPartitionsToTxn, AddOffsetsToTxn, EndTxn,
//! the markers, expiry of transactions past their timeout, TxnOffsetCommit
//! (in the group coordinator), KIP-890 verification of a transactional
//! write at the partition leader (`verify.rs`).

pub mod admin;
pub mod coordinator;
pub mod markers;
pub mod verify;

use skiff_engine::TopicPartition;

use crate::state::CoreState;
use crate::topics::TopicError;

/// Kafka's internal topic of transaction states.
pub const TXN_TOPIC: &str = "__transaction_state";

/// Kafka's `transaction.state.log.segment.bytes` default.
const TXN_TOPIC_SEGMENT_BYTES: &str = "104857600";

/// The `__transaction_state` partition of a transactional id and the core
/// that owns it; `None` while the internal topic does not exist.
pub fn coordinator_of(core: &CoreState, transactional_id: &str) -> Option<(TopicPartition, usize)> {
    crate::internal::partition_of(core, TXN_TOPIC, transactional_id)
}

/// Creates `__transaction_state` (compacted,
/// `transaction.state.log.num.partitions` partitions) unless it exists.
pub async fn ensure_txn_topic(core: &CoreState) -> Result<i32, TopicError> {
    let config = &core.node.config;
    crate::internal::ensure_topic(
        core,
        TXN_TOPIC,
        config.transaction_state_log_num_partitions,
        config.transaction_state_log_replication_factor,
        TXN_TOPIC_SEGMENT_BYTES,
    )
    .await
}
