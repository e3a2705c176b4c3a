//! Why a replication rule refused an event; each maps to the Kafka error code a
//! client or follower sees.

use crate::NodeId;

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum ReplicationError {
    /// acks=all before the append: the committed ISR is smaller than
    /// `min.insync.replicas`.
    #[error("ISR has {isr} replicas, min.insync.replicas is {min}")]
    NotEnoughReplicas { isr: usize, min: usize },
    /// acks=all after the append reached the high watermark: the committed ISR
    /// shrank below `min.insync.replicas` meanwhile (the records are written).
    #[error("records written, but the ISR shrank to {isr} replicas (min.insync.replicas {min})")]
    NotEnoughReplicasAfterAppend { isr: usize, min: usize },
    /// A fetch from a node that is not a replica of the partition (or the leader
    /// itself). Kafka answers NOT_LEADER_OR_FOLLOWER.
    #[error("node {0} is not a follower replica of this partition")]
    UnknownReplica(NodeId),
    /// The request's leader epoch is older than the replica's.
    #[error("leader epoch {request} is older than the current {current}")]
    FencedLeaderEpoch { request: i32, current: i32 },
    /// The request's leader epoch is newer than the replica's (it has not
    /// learned of it yet; the sender retries).
    #[error("leader epoch {request} is newer than the current {current}")]
    UnknownLeaderEpoch { request: i32, current: i32 },
    /// A follower fetched past the leader's log end (or at a negative offset).
    #[error("fetch offset {offset} is outside the leader's log (log end {log_end_offset})")]
    OffsetOutOfRange { offset: i64, log_end_offset: i64 },
    /// A committed ISR that this leader cannot hold: empty, without the leader,
    /// with a non-replica or a duplicate. The node must re-read the metadata.
    #[error("invalid ISR {isr:?}: {reason}")]
    InvalidIsr {
        isr: Vec<NodeId>,
        reason: &'static str,
    },
    /// A fetched batch that does not continue the follower's log: it starts
    /// below the log end (and the log is not an empty one starting inside
    /// it). Appending it would fork the log; skipping it would assume the
    /// records at those offsets are the same.
    #[error("fetched batch [{base_offset}, {next_offset}) does not continue the log ending at {log_end_offset}")]
    NonContiguousFetch {
        base_offset: i64,
        next_offset: i64,
        log_end_offset: i64,
    },
    /// The caller fed an event the replica's state does not allow (a bug in the
    /// caller, not in the peer).
    #[error("invalid event for the replica's state: {0}")]
    InvalidState(&'static str),
}

impl ReplicationError {
    /// The Kafka protocol error code.
    pub fn kafka_code(&self) -> i16 {
        match self {
            ReplicationError::OffsetOutOfRange { .. } => 1,
            ReplicationError::UnknownReplica(_) => 6, // NOT_LEADER_OR_FOLLOWER
            ReplicationError::NotEnoughReplicas { .. } => 19,
            ReplicationError::NotEnoughReplicasAfterAppend { .. } => 20,
            ReplicationError::FencedLeaderEpoch { .. } => 74,
            ReplicationError::UnknownLeaderEpoch { .. } => 76,
            // Local inconsistencies, never a peer's fault: UNKNOWN_SERVER_ERROR.
            ReplicationError::InvalidIsr { .. }
            | ReplicationError::InvalidState(_)
            | ReplicationError::NonContiguousFetch { .. } => -1,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn kafka_codes() {
        let cases = [
            (ReplicationError::NotEnoughReplicas { isr: 1, min: 2 }, 19),
            (
                ReplicationError::NotEnoughReplicasAfterAppend { isr: 1, min: 2 },
                20,
            ),
            (ReplicationError::UnknownReplica(7), 6),
            (
                ReplicationError::FencedLeaderEpoch {
                    request: 1,
                    current: 2,
                },
                74,
            ),
            (
                ReplicationError::UnknownLeaderEpoch {
                    request: 3,
                    current: 2,
                },
                76,
            ),
            (
                ReplicationError::OffsetOutOfRange {
                    offset: 9,
                    log_end_offset: 5,
                },
                1,
            ),
        ];
        for (error, code) in cases {
            assert_eq!(error.kafka_code(), code, "{error}");
        }
    }
}
