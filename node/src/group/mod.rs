//! Consumer groups: the group coordinator (classic protocol) and committed
//! offsets, stored in the internal compacted topic `__consumer_offsets`.
//!
//! Where a group lives: partition `P = abs(java_hashCode(group_id)) %
//! partitions` of `__consumer_offsets` (Kafka's rule, so a group maps to the
//! same partition as in Kafka), and the core that owns P (`ShardTable`) owns
//! the group: its state machine, its committed offsets and the writes to P.
//! Requests for a group are forwarded to that core with `Shard::invoke_on`, so
//! nothing about a group is shared between cores and nothing takes a lock.
//!
//! - `skiff_coordinator::group`: the membership protocol as a pure state
//!   machine (time passed in) and Kafka's key/value formats of
//!   `__consumer_offsets` records; what this module drives.
//! - `coordinator.rs`: per-core glue: waiting members, timers, the log, loading.
//! - `admin.rs`: `skiff group ...` (a client of the group APIs).

pub mod admin;
pub mod coordinator;

use skiff_engine::TopicPartition;

use crate::state::CoreState;
use crate::topics::TopicError;

/// Kafka's internal topic of group metadata and committed offsets.
pub const OFFSETS_TOPIC: &str = "__consumer_offsets";

/// The offsets partition of a group and the core that owns it; `None` while
/// the internal topic does not exist.
pub fn coordinator_of(core: &CoreState, group_id: &str) -> Option<(TopicPartition, usize)> {
    crate::internal::partition_of(core, OFFSETS_TOPIC, group_id)
}

/// Whether clients may not write to `topic` directly (Kafka's internal topics).
pub fn is_internal_topic(topic: &str) -> bool {
    topic == OFFSETS_TOPIC || topic == crate::txn::TXN_TOPIC
}

/// Kafka's `offsets.topic.segment.bytes` default: small segments, so the
/// compactor has closed segments to work on.
const OFFSETS_TOPIC_SEGMENT_BYTES: &str = "104857600";

/// Creates `__consumer_offsets` (compacted, `offsets.topic.num.partitions`
/// partitions) unless it exists; returns its partition count, which decides
/// where groups live from then on.
pub async fn ensure_offsets_topic(core: &CoreState) -> Result<i32, TopicError> {
    let config = &core.node.config;
    crate::internal::ensure_topic(
        core,
        OFFSETS_TOPIC,
        config.offsets_topic_num_partitions,
        config.offsets_topic_replication_factor,
        OFFSETS_TOPIC_SEGMENT_BYTES,
    )
    .await
}
