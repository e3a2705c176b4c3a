//! DeleteRecords: move partitions' log start offsets up (at most to the high
//! watermark; -1 means the high watermark). Whole segments below the new start
//! are deleted; reads below it answer OFFSET_OUT_OF_RANGE.

use kafka_protocol::messages::delete_records_response::{
    DeleteRecordsPartitionResult, DeleteRecordsTopicResult,
};
use kafka_protocol::messages::{DeleteRecordsRequest, DeleteRecordsResponse};

use skiff_engine::{LogError, TopicPartition};

use crate::kafka::error_code;
use crate::state::CoreState;

pub async fn handle(core: &CoreState, request: DeleteRecordsRequest) -> DeleteRecordsResponse {
    let mut topics = Vec::with_capacity(request.topics.len());
    for t in request.topics {
        let name = t.name.0.to_string();
        let mut partitions = Vec::with_capacity(t.partitions.len());
        for p in t.partitions {
            let result = DeleteRecordsPartitionResult::default()
                .with_partition_index(p.partition_index)
                .with_low_watermark(-1);
            if let Err(e) = super::check_leader(&core.topics(), &name, p.partition_index) {
                partitions.push(result.with_error_code(e.code()));
                continue;
            }
            let tp = TopicPartition::new(name.clone(), p.partition_index);
            let offset = p.offset;
            let tp2 = tp.clone();
            let outcome = core
                .shard
                .invoke_on(core.shard.table().shard_of(&tp), move |shard| async move {
                    let partition = shard
                        .local(&tp2)
                        .ok_or_else(|| LogError::UnknownPartition(tp2.to_string()))?;
                    partition.delete_records(offset).await
                })
                .await
                .and_then(|r| r);
            partitions.push(match outcome {
                Ok(low_watermark) => result.with_low_watermark(low_watermark),
                Err(e) => result.with_error_code(error_code(&e).code()),
            });
        }
        topics.push(
            DeleteRecordsTopicResult::default()
                .with_name(t.name)
                .with_partitions(partitions),
        );
    }
    DeleteRecordsResponse::default().with_topics(topics)
}
