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
    /// A leader append at an epoch this replica no longer leads (it became a
    /// follower, or leads a newer epoch, while the append waited for the
    /// log): nothing is written.
    #[error("leader append at epoch {epoch}, but this replica's appends are fenced below epoch {fenced_below}")]
    FencedLeaderEpoch { epoch: i32, fenced_below: i32 },
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A write or fsync failed earlier: what is on disk is unknown, so the
    /// partition stops serving until it is reopened (and recovered).
    #[error("partition log is offline after an I/O failure: {0}")]
    Offline(String),
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
