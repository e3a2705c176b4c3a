//! Errors of the partition log.

use std::path::PathBuf;

use thiserror::Error;

use crate::batch::BatchError;

pub type Result<T, E = LogError> = std::result::Result<T, E>;

#[derive(Debug, Error)]
pub enum LogError {
    #[error("invalid batch: {0}")]
    InvalidBatch(#[from] BatchError),
    #[error("batch of {size} bytes exceeds the limit of {limit}")]
    BatchTooLarge { size: usize, limit: usize },
    #[error("offset {offset} out of range [{log_start_offset}, {log_end_offset}]")]
    OffsetOutOfRange {
        offset: i64,
        log_start_offset: i64,
        log_end_offset: i64,
    },
    #[error(
        "replicated batch at offset {base_offset} does not follow log end offset {log_end_offset}"
    )]
    NonContiguousAppend {
        base_offset: i64,
        log_end_offset: i64,
    },
    /// A replicated batch fetched for a log that ended at `expected`, but the
    /// log ends elsewhere now (cut or repaired since the fetch was sent):
    /// nothing is written, and the follower fetches again from the new end.
    #[error("replicated batch continues the log at offset {expected}, but it ends at {log_end_offset} now (cut since the fetch was sent)")]
    ReplicaLogMoved { expected: i64, log_end_offset: i64 },
    /// A leader append at an epoch this replica no longer leads (it became a
    /// follower, or leads a newer epoch, while the append waited for the
    /// log): nothing is written.
    #[error("leader append at epoch {epoch}, but this replica's appends are fenced below epoch {fenced_below}")]
    FencedLeaderEpoch { epoch: i32, fenced_below: i32 },
    /// A replica append whose batch is from an older leader epoch than this
    /// log's latest (it became a leader meanwhile): nothing is written.
    #[error(
        "replica append of a batch from leader epoch {epoch}, older than this log's epoch {latest}"
    )]
    StaleReplicaEpoch { epoch: i32, latest: i32 },
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A truncation (a replica following its leader) took records whose
    /// acknowledgement waited for them to be made durable: they are not in
    /// this log any more (`Partition::await_durable_to`).
    #[error("the log was cut below offset {offset} while its records waited to be made durable")]
    CutBeforeDurable { offset: i64 },
    /// A write or fsync failed earlier: what is on disk is unknown, so the
    /// partition stops serving until it is reopened (and recovered).
    #[error("partition log is offline after an I/O failure: {0}")]
    Offline(String),
    /// A batch read back from a segment file failed its checks (CRC-32C,
    /// header): the bytes on disk are not the ones written. The log serves
    /// nothing more until it is repaired (`PartitionLog::repair_corruption`).
    #[error(transparent)]
    Corrupt(Box<Corruption>),
    #[error(transparent)]
    Recovery(#[from] crate::recovery::RecoveryError),
    #[error("bad checkpoint file {path}: {reason}")]
    Checkpoint { path: PathBuf, reason: String },
    #[error("partition {0} already exists")]
    PartitionExists(String),
    #[error("unknown partition {0}")]
    UnknownPartition(String),
    #[error("bad partition directory name {0:?}")]
    BadPartitionDir(String),
    #[error(transparent)]
    DataDir(#[from] crate::data_dir::DataDirError),
    /// A producer snapshot may only describe flushed records.
    #[error("producer snapshot at offset {offset} is above the flushed offset {flushed_offset}")]
    SnapshotNotFlushed { offset: i64, flushed_offset: i64 },
    #[error("shard runtime is stopped")]
    RuntimeStopped,
}

/// Where a read from disk found bytes that are not the batch written there.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error(
    "{}: corrupt batch at position {position} (offset {base_offset}): {reason}",
    path.display()
)]
pub struct Corruption {
    /// The segment file.
    pub path: PathBuf,
    /// Its base offset.
    pub segment_base_offset: i64,
    /// Where the bad batch starts in the file.
    pub position: u64,
    /// The bad batch's base offset as far as it is known: its header's
    /// (checked for order against the batches before it), or the offset
    /// after the last good batch when the header itself is unreadable.
    pub base_offset: i64,
    pub reason: String,
}

impl LogError {
    pub(crate) fn io(
        op: &'static str,
        path: impl Into<PathBuf>,
        source: impl Into<std::io::Error>,
    ) -> Self {
        LogError::Io {
            op,
            path: path.into(),
            source: source.into(),
        }
    }
}
