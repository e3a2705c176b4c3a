//! ListOffsets: earliest (-2), latest (-1, the high watermark, or with
//! isolation_level READ_COMMITTED the last stable offset; the log end for
//! a replica id, which is how a follower asks the leader for its log end), and
//! by timestamp (the first offset whose record timestamp is at or after it).
//! From v4 each answer carries a leader epoch (Kafka's: the current one for
//! latest, the epoch the record was written in otherwise) and the client's
//! `current_leader_epoch` is checked (KIP-320).

use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use kafka_protocol::messages::{ListOffsetsRequest, ListOffsetsResponse};
use kafka_protocol::ResponseError;
use skiff_engine::{OffsetQuery, TopicPartition};

use crate::kafka::error_code;
use crate::state::CoreState;

const LATEST: i64 = -1;
const EARLIEST: i64 = -2;

pub async fn handle(
    core: &CoreState,
    request: ListOffsetsRequest,
    version: i16,
) -> ListOffsetsResponse {
    // A follower (replica id >= 0) reads to the log end, as Kafka answers it;
    // a read_committed consumer (isolation_level 1, from v2) to the LSO.
    let replica = request.replica_id.0 >= 0;
    let committed = version >= 2 && request.isolation_level == 1;
    let mut topics = Vec::with_capacity(request.topics.len());
    for t in request.topics {
        let name = t.name.0.to_string();
        let mut partitions = Vec::with_capacity(t.partitions.len());
        for p in t.partitions {
            let tp = TopicPartition::new(name.clone(), p.partition_index);
            let asked = (p.timestamp, p.current_leader_epoch);
            partitions.push(partition(core, &tp, asked, version, (replica, committed)).await);
        }
        topics.push(
            ListOffsetsTopicResponse::default()
                .with_name(t.name)
                .with_partitions(partitions),
        );
    }
    ListOffsetsResponse::default().with_topics(topics)
}

async fn partition(
    core: &CoreState,
    tp: &TopicPartition,
    (timestamp, current_leader_epoch): (i64, i32),
    version: i16,
    (replica, committed): (bool, bool),
) -> ListOffsetsPartitionResponse {
    let response = ListOffsetsPartitionResponse::default()
        .with_partition_index(tp.partition)
        .with_timestamp(-1)
        .with_offset(-1);
    let table = core.topics();
    let leader_epoch =
        match super::check_leader_at(&table, &tp.topic, tp.partition, current_leader_epoch) {
            Ok(epoch) => epoch,
            Err(e) => return response.with_error_code(e.code()),
        };
    let query = match timestamp {
        LATEST => None,
        EARLIEST => Some(OffsetQuery::Earliest),
        ts if ts >= 0 => Some(OffsetQuery::Timestamp(ts)),
        // -3 (max timestamp) and others are not served yet.
        _ => return response.with_error_code(ResponseError::UnsupportedVersion.code()),
    };
    let tp2 = tp.clone();
    let result = core
        .shard
        .invoke_on(core.shard.table().shard_of(tp), move |shard| async move {
            let p = shard
                .local(&tp2)
                .ok_or_else(|| skiff_engine::LogError::UnknownPartition(tp2.to_string()))?;
            let stable = if committed {
                p.last_stable_offset().await?
            } else {
                p.high_watermark()
            };
            let found = match query {
                None if replica => return Ok(Some((p.log_end(), -1, leader_epoch))),
                None => return Ok(Some((stable, -1, leader_epoch))),
                Some(OffsetQuery::Timestamp(ts)) => {
                    // Only records below the high watermark (or the LSO)
                    // are visible.
                    p.list_offset(OffsetQuery::Timestamp(ts))
                        .await?
                        .filter(|(offset, _)| *offset < stable)
                }
                Some(q) => p.list_offset(q).await?,
            };
            match found {
                Some((offset, ts)) => Ok(Some((offset, ts, p.epoch_at(offset).await?))),
                None => Ok(None),
            }
        })
        .await
        .and_then(|r| r);
    match result {
        Ok(Some((offset, ts, epoch))) => {
            let r = response.with_offset(offset).with_timestamp(ts);
            // The leader epoch field exists from v4 on.
            if version >= 4 {
                r.with_leader_epoch(epoch)
            } else {
                r
            }
        }
        Ok(None) => response,
        Err(e) => response.with_error_code(error_code(&e).code()),
    }
}
