//! Log configuration, with Kafka's names and defaults where Kafka has the setting.

use std::time::Duration;

/// When an appended batch counts as acknowledged-safe on this replica.
///
/// This is explicit on purpose: the default flushes before acknowledging, and a
/// deployment that relaxes it says so in its config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// `fdatasync` before the append is acknowledged. Concurrent appends to one
    /// partition share one `fdatasync` (group commit).
    FlushBeforeAck,
    /// Acknowledge once the append is written to the segment file (its
    /// O_DIRECT write completed, group-committed, no fdatasync); a background
    /// task fdatasyncs every dirty partition at this interval (Kafka's
    /// `log.flush.interval.ms`). A process crash loses nothing acknowledged;
    /// a power loss can lose up to one interval on this replica.
    Interval(Duration),
}

/// Per-partition log settings.
#[derive(Debug, Clone)]
pub struct LogConfig {
    /// `segment.bytes`: roll the active segment before it would exceed this size.
    pub segment_bytes: u64,
    /// `segment.ms`: roll a non-empty active segment older than this.
    pub segment_ms: Option<Duration>,
    /// `index.interval.bytes`: bytes of log between two offset-index entries.
    pub index_interval_bytes: u64,
    /// The largest step of disk space reserved ahead of the write position
    /// (fallocate), so appends rarely wait on block allocation. Steps start at
    /// 64 KiB and double as the segment uses them (see `segment::appender`).
    /// 0 turns it off.
    pub preallocate_step_bytes: u64,
    /// The largest DMA buffer an active segment fills before writing it out;
    /// buffers start at 64 KiB and double as they fill.
    pub append_chunk_bytes: usize,
    /// Chunk writes of one segment in flight at once; more appends wait.
    pub max_inflight_writes: usize,
    /// Segments retention removes are kept and reused as later segments'
    /// files (`segment` module docs), at most as many as the log rolled since
    /// the previous retention pass (at least one); one no roll took within
    /// `log::FREE_FILE_TTL_MS` is freed by a later pass.
    pub recycle_segments: bool,
    /// A log closing for good whose active segment is at most this long (and
    /// holds the recovery point and no aborted transaction) skips writing that segment's indexes, the
    /// clean-close record and the recovery point: the next open scans it
    /// anyway, in less time than those fdatasyncs take
    /// (`PartitionLog::shutdown_with_high_watermark`). 1 MiB.
    pub clean_close_scan_bytes: u64,
    /// `message.max.bytes`: largest batch accepted.
    pub max_batch_bytes: usize,
    pub durability: Durability,
    /// `cleanup.policy` includes `delete`: closed segments are removed by
    /// retention (`retention_ms`, `retention_bytes`).
    pub retention_delete: bool,
    /// `retention.ms`: closed segments whose newest batch is older go (None: -1,
    /// keep forever).
    pub retention_ms: Option<Duration>,
    /// `retention.bytes`: oldest closed segments go while the log is larger
    /// (None: -1, no limit).
    pub retention_bytes: Option<u64>,
    /// `cleanup.policy` includes `compact`: the core's cleaner keeps the latest
    /// record of each key (see `cleaner`).
    pub compact: bool,
    /// `min.cleanable.dirty.ratio`: the share of the cleanable log not yet
    /// cleaned above which the cleaner picks the log.
    pub min_cleanable_dirty_ratio: f64,
    /// `min.compaction.lag.ms`: records younger than this stay uncompacted.
    pub min_compaction_lag: Duration,
    /// `max.compaction.lag.ms`: a log whose oldest dirty segment is older than this
    /// is cleaned whatever its dirty ratio (None: Long.MAX, never forced).
    pub max_compaction_lag: Option<Duration>,
    /// `delete.retention.ms`: how long a tombstone stays after the cleaning that
    /// first saw it (its batch's delete horizon), so consumers reading from the
    /// start see deletes.
    pub delete_retention: Duration,
}

impl LogConfig {
    pub const KIB: u64 = 1024;
    pub const MIB: u64 = 1024 * 1024;
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            segment_bytes: 1024 * Self::MIB,
            segment_ms: Some(Duration::from_secs(7 * 24 * 3600)),
            index_interval_bytes: 4 * Self::KIB,
            preallocate_step_bytes: 32 * Self::MIB,
            // 512 KiB writes, 8 in flight: the same 4 MiB in flight as 1 MiB
            // writes 4 at a time, but each is one request at a virtio disk
            // (at most 254 pages: a 1 MiB write went out as 1,016 + 8 KiB),
            // and 4-9% faster in the engine bench in six paired rounds
            // (docs/benchmarks.md, session 33).
            append_chunk_bytes: 512 * Self::KIB as usize,
            max_inflight_writes: 8,
            recycle_segments: true,
            clean_close_scan_bytes: Self::MIB,
            max_batch_bytes: 1024 * 1024 + 12 + 61,
            durability: Durability::FlushBeforeAck,
            retention_delete: true,
            retention_ms: Some(Duration::from_secs(7 * 24 * 3600)),
            retention_bytes: None,
            compact: false,
            min_cleanable_dirty_ratio: 0.5,
            min_compaction_lag: Duration::ZERO,
            max_compaction_lag: None,
            delete_retention: Duration::from_secs(24 * 3600),
        }
    }
}
