//! OffsetForLeaderEpoch (KIP-101, KIP-320): the end offset of a leader epoch
//! in this leader's log. A consumer asks after a leader change, with the
//! epoch of the last record it consumed: an end offset below its position
//! means the log it read from was truncated (an unclean election), and the
//! client resets instead of silently skipping or re-reading. skiff's own
//! followers use Fetch v12's diverging epoch instead; a follower asking here
//! gets the same answer. Served by the partition's leader only, with the
//! client's `current_leader_epoch` checked as on a fetch.

use kafka_protocol::messages::offset_for_leader_epoch_response::{
    EpochEndOffset, OffsetForLeaderTopicResult,
};
use kafka_protocol::messages::{OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse};
use skiff_engine::{LogError, TopicPartition};

use crate::kafka::error_code;
use crate::state::CoreState;

pub async fn handle(
    core: &CoreState,
    request: OffsetForLeaderEpochRequest,
) -> OffsetForLeaderEpochResponse {
    let table = core.topics();
    let mut topics = Vec::with_capacity(request.topics.len());
    for t in request.topics {
        let name = t.topic.0.to_string();
        let mut partitions = Vec::with_capacity(t.partitions.len());
        for p in t.partitions {
            let answer = EpochEndOffset::default()
                .with_partition(p.partition)
                .with_leader_epoch(-1)
                .with_end_offset(-1);
            let checked =
                super::check_leader_at(&table, &name, p.partition, p.current_leader_epoch);
            if let Err(e) = checked {
                partitions.push(answer.with_error_code(e.code()));
                continue;
            }
            let tp = TopicPartition::new(name.clone(), p.partition);
            let owner = core.shard.table().shard_of(&tp);
            let requested = p.leader_epoch;
            let found = core
                .shard
                .invoke_on(owner, move |shard| async move {
                    let partition = shard
                        .local(&tp)
                        .ok_or_else(|| LogError::UnknownPartition(tp.to_string()))?;
                    partition.epoch_end_offset(requested).await
                })
                .await
                .and_then(|r| r);
            partitions.push(match found {
                Ok((epoch, end)) => answer.with_leader_epoch(epoch).with_end_offset(end),
                Err(e) => answer.with_error_code(error_code(&e).code()),
            });
        }
        topics.push(
            OffsetForLeaderTopicResult::default()
                .with_topic(t.topic)
                .with_partitions(partitions),
        );
    }
    OffsetForLeaderEpochResponse::default().with_topics(topics)
}
