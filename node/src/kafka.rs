//! Small Kafka-protocol helpers every layer of the node uses (handlers,
//! the coordinators' drivers, replication, SASL): the Kafka error code of
//! an engine error, Unix time in milliseconds, a `StrBytes`. They sit at
//! the bottom so no driver imports from `handlers/`.

use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use skiff_engine::LogError;

/// The Kafka error code for an engine error.
pub fn error_code(e: &LogError) -> ResponseError {
    match e {
        LogError::InvalidBatch(_) => ResponseError::CorruptMessage,
        LogError::BatchTooLarge { .. } => ResponseError::MessageTooLarge,
        LogError::OffsetOutOfRange { .. } => ResponseError::OffsetOutOfRange,
        LogError::UnknownPartition(_) => ResponseError::UnknownTopicOrPartition,
        LogError::NonContiguousAppend { .. } | LogError::ReplicaLogMoved { .. } => {
            ResponseError::InvalidRecord
        }
        LogError::PartitionExists(_) => ResponseError::TopicAlreadyExists,
        LogError::Io { .. }
        | LogError::Offline(_)
        | LogError::Corrupt(_)
        | LogError::Recovery(_)
        | LogError::Checkpoint { .. }
        | LogError::DataDir(_) => ResponseError::KafkaStorageError,
        LogError::BadPartitionDir(_) | LogError::SnapshotNotFlushed { .. } => {
            ResponseError::KafkaStorageError
        }
        LogError::RuntimeStopped
        | LogError::CutBeforeDurable { .. }
        | LogError::FencedLeaderEpoch { .. }
        | LogError::StaleReplicaEpoch { .. } => ResponseError::NotLeaderOrFollower,
    }
}

/// A `String` as the protocol's `StrBytes`.
pub fn str_bytes(s: impl Into<String>) -> StrBytes {
    StrBytes::from_string(s.into())
}

/// Unix time in milliseconds.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
