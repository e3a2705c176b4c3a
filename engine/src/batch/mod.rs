//! Kafka RecordBatch v2 (magic 2): the unit skiff stores, replicates and serves.
//!
//! Batches are kept byte for byte as producers sent them. This module parses and
//! checks them without re-encoding: the produce path calls [`validate`] and then
//! [`stamp`]s the base offset and leader epoch in place (both lie outside the CRC);
//! the fetch path walks headers with [`BatchScanner`]; recovery and `verify` use
//! [`crc_matches`]. Only tools and tests decode individual records
//! ([`decode_records`]) or build batches ([`BatchBuilder`]).
//!
//! Layout (all big-endian; the CRC-32C covers byte 21 to the end):
//!
//! ```text
//!  0 baseOffset i64        8 batchLength i32 (bytes after this field)
//! 12 partitionLeaderEpoch i32   16 magic i8 = 2   17 crc u32
//! 21 attributes i16       23 lastOffsetDelta i32  27 baseTimestamp i64
//! 35 maxTimestamp i64     43 producerId i64       51 producerEpoch i16
//! 53 baseSequence i32     57 recordsCount i32     61 records (one blob if compressed)
//! ```
//!
//! Not here: the Kafka wire protocol around batches, and magic 0/1 message sets.

mod builder;
mod compression;
mod control;
mod header;
mod records;
mod rewrite;

pub use builder::BatchBuilder;
pub use compression::{compress, decompress, Compression};
pub use control::{marker_batch, parse_marker, EndTxnMarker};
pub use header::{
    check_compressed_records, crc_matches, stamp, stamp_log_append_time, validate, validate_deep,
    BatchHeader, BatchScanner, TimestampType, BATCH_HEADER_LEN, LOG_OVERHEAD, MAGIC_V2,
};
pub use records::{decode_records, Record, RecordHeader};
pub use rewrite::{rebuild, record_views, records_section, RecordView};

/// Why a batch was rejected. Messages name the field and both values so an
/// operator can tell truncation from corruption from an unsupported client.
#[derive(Debug, thiserror::Error)]
pub enum BatchError {
    #[error("record batch truncated: need {needed} bytes, have {actual}")]
    TooShort { needed: usize, actual: usize },

    #[error("record batch length mismatch: header declares {declared} bytes in total, buffer holds {actual}")]
    LengthMismatch { declared: usize, actual: usize },

    #[error("invalid record batch length field {0}: must be at least 49 (the rest of the header)")]
    InvalidLength(i32),

    #[error("unsupported record batch magic {0}: only v2 (magic 2) is supported")]
    BadMagic(i8),

    #[error("CRC mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    CrcMismatch { stored: u32, computed: u32 },

    #[error("record batch declares {0} records: a batch holds at least one")]
    EmptyBatch(i32),

    #[error("record count mismatch: header declares {declared} records, found {actual}")]
    RecordCount { declared: i32, actual: i32 },

    #[error("last offset delta {last_offset_delta} does not match record count {records_count} (expected count - 1)")]
    OffsetDelta {
        last_offset_delta: i32,
        records_count: i32,
    },

    #[error("malformed record: {0}")]
    InvalidRecord(&'static str),

    #[error("unknown compression codec id {0} in batch attributes")]
    UnknownCompression(i16),

    #[error("unknown compression codec name {0:?} (expected none, gzip, snappy, lz4 or zstd)")]
    UnknownCompressionName(String),

    #[error("{codec} codec failed: {source}")]
    Compression {
        codec: Compression,
        source: std::io::Error,
    },

    #[error("decompressed records exceed the {limit}-byte limit")]
    TooLarge { limit: usize },
}
