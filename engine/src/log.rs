//! The partition log: an ordered set of segments, the last one active.
//!
//! This is where a produce becomes bytes on disk: `append` validates the batch,
//! stamps its base offset and leader epoch in place (outside the CRC), copies it
//! into the active segment's DMA buffer (`segment::appender`), indexes it, and
//! keeps it in the core's batch cache for the fetch path. Durability is the
//! caller's next step (`flush`, group-committed by `partition::Partition`).
//!
//! Offsets: `log_start_offset` is the first offset still in the log,
//! `log_end_offset` the offset the next batch gets, `flushed_offset` the offset
//! below which everything is on disk (fdatasync'd), `recovery_point` the value last
//! checkpointed for recovery (`<= flushed_offset`).
//!
//! Ownership: a log is owned by one core and used through `&mut self`; it is
//! neither `Send` nor shared.
//!
//! Failures: any I/O error on the write path (an append, a roll, a write-out,
//! an fdatasync, a truncation) takes the log offline (`offline_reason`). What
//! the file holds past the flushed offset is then unknown, so from that moment
//! nothing more is written, flushed or checkpointed: appends and flushes fail
//! with `LogError::Offline`, reads stop at the flushed offset, and a close
//! leaves the files to recovery at the next open. Only reopening the log
//! (recovery) brings it back.
//!
//! A change to the files (an append with its roll, a write-out, a flush, a
//! truncation, a retention pass, a cleaner's swap) must run to its end: one
//! dropped part way (its caller gave up on the future) leaves the segment,
//! its indexes and the log's offsets out of step. Each runs under a
//! `ChangeGuard` (`PartitionLog::guarded`) that takes the log offline the
//! moment one is dropped, as a failed write would, and recovery at the next
//! open puts the files right.
//!
//! Corruption: every batch read from a segment file (not from the batch
//! cache, which holds what was written) has its header checked (it parses,
//! its offsets follow the batches before it and stay inside the segment) and
//! its CRC-32C verified before it leaves the engine. The first bad one takes
//! the log offline too (`corruption`, logged once with file and position):
//! reads answer `LogError::Corrupt`, appends `LogError::Offline`. Batches
//! before it in the same read are still returned. Unlike a failed write, a
//! corrupt batch is repairable: `repair_corruption` cuts the log before it
//! (`truncate_to` semantics) and the log serves again, for a replica that
//! fetches the rest from another one.

use std::cell::Cell;
use std::collections::{BTreeMap, VecDeque};
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use bytes::{Bytes, BytesMut};

use crate::batch::{self, decode_records, BatchHeader, BatchScanner};
use crate::batch_cache::BatchCache;
use crate::checkpoint::{
    CLEANER_CHECKPOINT_FILE, CLEAN_SHUTDOWN_FILE, HIGH_WATERMARK_FILE, LOG_START_OFFSET_FILE,
    RECOVERY_POINT_FILE,
};
use crate::cleaner::{CleanPlan, CleanedSegment, SegmentSnapshot};
use crate::config::LogConfig;
use crate::error::{Corruption, LogError, Result};
use crate::fsutil;
use crate::leader_epoch::LeaderEpochCache;
use crate::recovery::{self, scan_segment, write_offset_checkpoint, write_recovery_point};
use crate::segment::appender::Growth;
use crate::segment::scan::{scan, ScanStop};
use crate::segment::{
    remove_segment_files, segment_path, swap_path, Segment, INDEX_SUFFIX, LOG_SUFFIX,
    TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX,
};
use crate::snapshot;
use crate::txn::{TxnBatch, TxnTracker};

mod txns;

/// How an append gets its offsets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AppendMode {
    /// A leader append: the batch gets the next offsets and this leader epoch.
    Leader { leader_epoch: i32 },
    /// A follower append: the batch keeps the offsets and epoch the leader gave
    /// it, and continues the log where it ended when the fetch was sent
    /// (`log_end`: the fetch offset, then each appended batch's end). A log
    /// cut meanwhile by another task (a corruption repair, a truncation)
    /// refuses it (`LogError::ReplicaLogMoved`): checked under the log's lock,
    /// so no answer to an older log lands past a cut and leaves a hole (nemesis
    /// seed 10001: a repair cut the log to 303,145 while an answer from the
    /// old end, 374,118, waited for the lock, and was then appended).
    Replica { log_end: i64 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppendInfo {
    pub base_offset: i64,
    pub last_offset: i64,
    pub max_timestamp: i64,
    pub records: i32,
    pub bytes: usize,
}

/// What one retention pass (or DeleteRecords) removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RetentionOutcome {
    pub deleted_segments: usize,
    pub deleted_bytes: u64,
    /// Of the deleted segments, those whose files were kept for reuse
    /// (`LogConfig::recycle_segments`).
    pub recycled_segments: usize,
    pub log_start_offset: i64,
}

/// Batches returned by a read, whole and in order.
#[derive(Debug, Clone, Default)]
pub struct ReadBatches {
    pub batches: Vec<Bytes>,
    /// The offset after the last batch returned (the start of the next read).
    pub next_offset: i64,
}

impl ReadBatches {
    pub fn bytes(&self) -> usize {
        self.batches.iter().map(Bytes::len).sum()
    }
}

/// Smallest and largest read from disk on a cache miss.
const READ_CHUNK_MIN_BYTES: usize = 64 << 10;
/// A partition whose recovery takes this long is logged, with what it read.
const SLOW_OPEN: std::time::Duration = std::time::Duration::from_millis(1000);
const READ_CHUNK_MAX_BYTES: usize = 16 << 20;

pub struct PartitionLog {
    dir: PathBuf,
    topic: String,
    partition: i32,
    config: LogConfig,
    /// By base offset; the last one is active. Never empty.
    segments: BTreeMap<i64, Segment>,
    log_start_offset: i64,
    log_end_offset: i64,
    flushed_offset: i64,
    recovery_point: i64,
    epochs: LeaderEpochCache,
    cache: BatchCache,
    cache_id: u64,
    /// The cleaner's checkpoint: offsets below it are compacted (`compact` logs).
    first_dirty_offset: i64,
    /// Earliest delete horizon of a tombstone the last cleaning kept: once it
    /// passes, the log is worth cleaning whatever its dirty ratio.
    tombstone_horizon: Option<i64>,
    /// Set by `shutdown`: background work (the cleaner) leaves the log alone.
    closed: bool,
    /// Leader appends at an older epoch are refused (`fence_leader_appends`):
    /// a produce admitted under an old leadership must not land in the log
    /// after the role changed. In memory only: after a restart the node
    /// learns its roles before it takes produce requests.
    leader_appends_fenced_below: i32,
    /// Why the log went offline (see the module docs); None while it serves.
    offline: Option<String>,
    /// A batch read from disk failed its checks (see the module docs), with
    /// its one-line description for `offline_reason`.
    corrupt: Option<(Box<Corruption>, String)>,
    /// The replicated high watermark last written to `HIGH_WATERMARK_FILE`
    /// (None: never; a partition nobody replicates).
    high_watermark_checkpoint: Option<i64>,
    /// Where the scrubber (`scrub`) goes on: a closed segment's base offset,
    /// a batch boundary in it, and the lowest base offset the batch there may
    /// have. None: from the first segment.
    scrub_cursor: Option<ScrubCursor>,
    /// Open and unreplicated transactions (`txns`).
    txns: TxnTracker,
    /// The log has held a transactional batch (since it was created, as far
    /// as its files tell): only then is transaction state checkpointed.
    txn_seen: bool,
    /// The tracker's checkpointed states, by the roll offset they describe.
    txn_states: BTreeMap<i64, Vec<(bool, i64, i64, i64)>>,
    /// Retired segment files kept for the next rolls, oldest first (see
    /// `segment`'s module docs on recycling).
    free: VecDeque<FreeFile>,
    /// Rolls since the last retention pass: how many files the next pass
    /// keeps (at least one).
    rolls_since_retention: usize,
    /// Set when a change to the files was dropped part way (module docs).
    interrupted: Rc<Interrupted>,
}

/// What took the log offline when a change to its files was dropped before
/// its end (see the module docs); shared with the guard of the change in
/// progress, which sets it from its `Drop`.
#[derive(Debug)]
struct Interrupted {
    dir: PathBuf,
    reason: Cell<Option<&'static str>>,
}

/// Armed for one change to the log's files; dropped armed, it takes the log
/// offline. `done` disarms it.
#[must_use]
struct ChangeGuard {
    log: Rc<Interrupted>,
    reason: &'static str,
    armed: bool,
}

impl ChangeGuard {
    fn done(mut self) {
        self.armed = false;
    }
}

impl Drop for ChangeGuard {
    fn drop(&mut self) {
        if self.armed && self.log.reason.get().is_none() {
            tracing::error!(
                dir = %self.log.dir.display(), reason = self.reason,
                "partition log goes offline: nothing more is written until it is reopened"
            );
            self.log.reason.set(Some(self.reason));
        }
    }
}

/// A retired segment file waiting to be reused (`<bound>.log.free`).
#[derive(Debug)]
struct FreeFile {
    /// Every batch in the file lies below this offset.
    bound: i64,
    path: PathBuf,
    /// The file's size: disk it holds while it waits.
    bytes: u64,
    /// The retention pass's `now_ms` that kept it (None: found at open; the
    /// next pass stamps it).
    kept_at_ms: Option<i64>,
}

/// A free file no roll took within this long is freed by a retention pass:
/// the partition writes less than it did.
pub const FREE_FILE_TTL_MS: i64 = 10 * 60 * 1000;

#[derive(Debug, Clone, Copy)]
struct ScrubCursor {
    segment: i64,
    position: u64,
    expected: i64,
}

/// What one `scrub` call did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScrubStep {
    /// Bytes of batches read and verified.
    pub bytes: u64,
    /// The call reached the end of the last closed segment: the next call
    /// starts over at the first.
    pub pass_done: bool,
}

impl PartitionLog {
    /// Opens (recovering) or creates the log in `dir`.
    pub async fn open(
        dir: &Path,
        topic: &str,
        partition: i32,
        config: LogConfig,
        cache: BatchCache,
    ) -> Result<PartitionLog> {
        std::fs::create_dir_all(dir).map_err(|e| LogError::io("create dir", dir, e))?;
        let started = std::time::Instant::now();
        // Segments a crash left half deleted: the trash frees them.
        crate::trash::recover_files(dir)?;
        let recovered = recovery::recover(dir, &config).await?;
        let took = started.elapsed();
        if took >= SLOW_OPEN {
            tracing::warn!(
                dir = %dir.display(), took_ms = took.as_millis() as u64,
                segments = recovered.segments.len(), scanned_bytes = recovered.scanned_bytes,
                "recovering the partition log was slow"
            );
        }
        if recovered.truncated_bytes > 0 {
            tracing::warn!(
                dir = %dir.display(), bytes = recovered.truncated_bytes,
                log_end_offset = recovered.log_end_offset,
                "recovery cut torn or invalid data (and what followed it) from the end of the log"
            );
        }
        if recovered.recycled_bytes > 0 {
            tracing::debug!(
                dir = %dir.display(), bytes = recovered.recycled_bytes,
                log_end_offset = recovered.log_end_offset,
                "recovery trimmed a recycled segment file's previous contents"
            );
        }
        if recovered.unwritten_bytes > 0 {
            tracing::debug!(
                dir = %dir.display(), bytes = recovered.unwritten_bytes,
                log_end_offset = recovered.log_end_offset,
                "recovery trimmed preallocated space never written"
            );
        }
        // Producer snapshots above the recovered end describe records the
        // crash took away (a `.snapshot.tmp` went with recovery's other
        // temporaries).
        snapshot::delete_above(dir, recovered.log_end_offset).await?;
        // The epoch cache agrees with the recovered log: the epoch in force at
        // the log start starts there (a crash may have come between moving the
        // start and cutting the cache), and epochs from the log end on go. An
        // empty log keeps none (an interrupted truncate_fully_and_start_at).
        let mut epochs = LeaderEpochCache::load(dir).await?;
        let from_start = epochs.truncate_from_start(recovered.log_start_offset);
        let from_end = epochs.truncate_from_end(recovered.log_end_offset);
        if from_start || from_end {
            epochs.persist().await?;
        }
        let cache_id = cache.register();
        let first_dirty_offset =
            recovery::read_offset_checkpoint(&dir.join(CLEANER_CHECKPOINT_FILE)).await?;
        let high_watermark_checkpoint =
            match crate::checkpoint::read(&dir.join(HIGH_WATERMARK_FILE), 3).await? {
                Some(rows) if !rows.is_empty() => Some(
                    crate::checkpoint::parse_i64(&dir.join(HIGH_WATERMARK_FILE), &rows[0][2])?
                        .clamp(recovered.log_start_offset, recovered.log_end_offset),
                ),
                _ => None,
            };
        let mut log = PartitionLog {
            dir: dir.to_path_buf(),
            topic: topic.to_string(),
            partition,
            config,
            segments: recovered.segments,
            log_start_offset: recovered.log_start_offset,
            log_end_offset: recovered.log_end_offset,
            flushed_offset: recovered.log_end_offset,
            recovery_point: 0,
            epochs,
            cache,
            cache_id,
            first_dirty_offset,
            tombstone_horizon: None,
            closed: false,
            leader_appends_fenced_below: 0,
            offline: None,
            corrupt: None,
            scrub_cursor: None,
            high_watermark_checkpoint,
            txns: TxnTracker::default(),
            txn_seen: false,
            txn_states: BTreeMap::new(),
            free: recovered
                .free
                .into_iter()
                .map(|(bound, path, bytes)| FreeFile {
                    bound,
                    path,
                    bytes,
                    kept_at_ms: None,
                })
                .collect(),
            rolls_since_retention: 0,
            interrupted: Rc::new(Interrupted {
                dir: dir.to_path_buf(),
                reason: Cell::new(None),
            }),
        };
        log.rebuild_txns(recovered.first_scanned, recovered.txn_batches)
            .await?;
        // Recovery flushed the active segment: everything left is durable.
        log.checkpoint_recovery_point().await?;
        Ok(log)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
    pub fn topic(&self) -> &str {
        &self.topic
    }
    pub fn partition(&self) -> i32 {
        self.partition
    }
    pub fn config(&self) -> &LogConfig {
        &self.config
    }

    /// Durability is fixed for the life of an open log (the group-commit wrapper
    /// depends on it); every other setting can change.
    pub fn set_config(&mut self, config: LogConfig) {
        let durability = self.config.durability;
        self.config = LogConfig {
            durability,
            ..config
        };
    }
    pub fn log_start_offset(&self) -> i64 {
        self.log_start_offset
    }
    pub fn log_end_offset(&self) -> i64 {
        self.log_end_offset
    }
    pub fn flushed_offset(&self) -> i64 {
        self.flushed_offset
    }
    pub fn recovery_point(&self) -> i64 {
        self.recovery_point
    }
    pub fn leader_epochs(&self) -> &LeaderEpochCache {
        &self.epochs
    }
    pub fn segments(&self) -> impl Iterator<Item = &Segment> {
        self.segments.values()
    }
    pub fn size_bytes(&self) -> u64 {
        self.segments.values().map(Segment::size).sum()
    }
    pub fn segment_count(&self) -> usize {
        self.segments.len()
    }
    /// Why the log is offline (a write, roll or fdatasync failed, or a batch
    /// read from disk is corrupt), or None while it serves.
    pub fn offline_reason(&self) -> Option<&str> {
        self.write_failure()
            .or_else(|| self.corrupt.as_ref().map(|(_, line)| line.as_str()))
    }

    /// Why the log is offline for a failed write, roll or fdatasync (only a
    /// reopen brings it back), or None.
    fn write_failure(&self) -> Option<&str> {
        if let Some(reason) = self.interrupted.reason.get() {
            return Some(reason);
        }
        self.offline.as_deref().or_else(|| {
            self.segments
                .values()
                .next_back()
                .and_then(Segment::failure)
        })
    }

    /// The corrupt batch that took the log offline, until `repair_corruption`.
    pub fn corruption(&self) -> Option<&Corruption> {
        self.corrupt.as_ref().map(|(c, _)| c.as_ref())
    }

    /// Takes the log offline for `corruption` (the first one is kept and
    /// logged) and returns the error the read answers.
    fn mark_corrupt(&mut self, corruption: Corruption) -> LogError {
        let (kept, _) = self.corrupt.get_or_insert_with(|| {
            tracing::error!(
                path = %corruption.path.display(), position = corruption.position,
                base_offset = corruption.base_offset, reason = %corruption.reason,
                "corrupt batch read from disk: the partition log goes offline and serves nothing \
                 until it is repaired (cut before the bad batch, the rest fetched again from \
                 another replica)"
            );
            let line = corruption.to_string();
            (Box::new(corruption), line)
        });
        LogError::Corrupt(kept.clone())
    }

    /// `LogError::Offline` once the log is offline.
    fn check_online(&self) -> Result<()> {
        match self.offline_reason() {
            Some(reason) => Err(LogError::Offline(reason.to_string())),
            None => Ok(()),
        }
    }

    /// `check_online`, and closed logs refused too (appends, starting over).
    fn check_writable(&self) -> Result<()> {
        self.check_online()?;
        if self.closed {
            return Err(LogError::Offline(format!(
                "{} is closed",
                self.dir.display()
            )));
        }
        Ok(())
    }

    /// Passes `result` through; an error takes the log offline (the first
    /// reason is kept). For results of the write path only, where any error is
    /// an I/O failure that leaves the file's tail unknown.
    fn offline_on_error<T>(&mut self, result: Result<T>) -> Result<T> {
        if let Err(e) = &result {
            if self.offline.is_none() {
                let reason = match e {
                    LogError::Offline(reason) => reason.clone(),
                    other => other.to_string(),
                };
                tracing::error!(
                    dir = %self.dir.display(), %reason,
                    "partition log goes offline: nothing more is written until it is reopened"
                );
                self.offline = Some(reason);
            }
        }
        result
    }

    /// Writes one of the partition's offset checkpoint files (log start,
    /// cleaner point, high watermark) crash-safely.
    async fn write_checkpoint(&self, file: &str, offset: i64) -> Result<()> {
        write_offset_checkpoint(&self.dir.join(file), &self.topic, self.partition, offset).await
    }

    /// Runs `change`, a change to the files that must run to its end
    /// (module docs), under a `ChangeGuard`: dropped part way, it takes the
    /// log offline; `reason` says which change, for the log line and
    /// `offline_reason`.
    async fn guarded<'a, T, Fut>(
        &'a mut self,
        reason: &'static str,
        change: impl FnOnce(&'a mut Self) -> Fut,
    ) -> T
    where
        Fut: std::future::Future<Output = T> + 'a,
    {
        let guard = ChangeGuard {
            log: self.interrupted.clone(),
            reason,
            armed: true,
        };
        let out = change(self).await;
        guard.done();
        out
    }

    fn active(&mut self) -> &mut Segment {
        // Invariant: `segments` is never empty (open creates one, truncate keeps one).
        #[allow(clippy::expect_used)]
        self.segments
            .values_mut()
            .next_back()
            .expect("a partition log always has an active segment")
    }

    /// A new leadership at `leader_epoch` starts at the log end (Kafka's
    /// `maybeAssignEpochStartOffset` in `makeLeader`): the epoch is in the
    /// cache before its first record, so OffsetsForLeaderEpoch and a
    /// follower's divergence check see where the older epochs end on this
    /// leader. An epoch not newer than the latest changes nothing. Returns
    /// the epoch's start offset (the log end). In memory until the epoch's
    /// first record is appended: recovery drops a record-less epoch anyway,
    /// and an fdatasync here would slow every leader election.
    pub fn assign_leader_epoch(&mut self, leader_epoch: i32) -> Result<i64> {
        self.check_writable()?;
        self.fence_leader_appends(leader_epoch);
        let start = self.log_end_offset;
        self.epochs.assign_in_memory(leader_epoch, start);
        Ok(start)
    }

    /// From now on leader appends at an epoch below `epoch` are refused
    /// (`LogError::FencedLeaderEpoch`). Raised, never lowered: a replica
    /// that follows epoch E fences below E + 1, one that leads E below E.
    pub fn fence_leader_appends(&mut self, epoch: i32) {
        self.leader_appends_fenced_below = self.leader_appends_fenced_below.max(epoch);
    }

    /// Appends one batch. The batch is validated first (CRC, lengths, record
    /// count); an invalid batch is rejected with nothing written.
    /// The refusals `append` would give whatever the batch: the log is
    /// offline or closed, or a leader append at a fenced epoch. Callers that
    /// check something else first (an idempotent producer's sequence) run this
    /// before, so a refusal that says "not in the log" comes in the same order
    /// as Kafka's (leadership and log first, then the sequence).
    pub fn check_appendable(&self, mode: AppendMode) -> Result<()> {
        self.check_writable()?;
        match mode {
            AppendMode::Leader { leader_epoch }
                if leader_epoch < self.leader_appends_fenced_below =>
            {
                Err(LogError::FencedLeaderEpoch {
                    epoch: leader_epoch,
                    fenced_below: self.leader_appends_fenced_below,
                })
            }
            _ => Ok(()),
        }
    }

    pub async fn append(&mut self, mut batch: BytesMut, mode: AppendMode) -> Result<AppendInfo> {
        self.check_writable()?;
        if batch.len() > self.config.max_batch_bytes {
            return Err(LogError::BatchTooLarge {
                size: batch.len(),
                limit: self.config.max_batch_bytes,
            });
        }
        let mut header = batch::validate(&batch)?;
        match mode {
            AppendMode::Leader { leader_epoch } => {
                if leader_epoch < self.leader_appends_fenced_below {
                    return Err(LogError::FencedLeaderEpoch {
                        epoch: leader_epoch,
                        fenced_below: self.leader_appends_fenced_below,
                    });
                }
                batch::stamp(&mut batch, self.log_end_offset, leader_epoch)?;
                header.base_offset = self.log_end_offset;
                header.partition_leader_epoch = leader_epoch;
            }
            AppendMode::Replica { log_end } => {
                if log_end != self.log_end_offset {
                    return Err(LogError::ReplicaLogMoved {
                        expected: log_end,
                        log_end_offset: self.log_end_offset,
                    });
                }
                if header.base_offset < self.log_end_offset {
                    return Err(LogError::NonContiguousAppend {
                        base_offset: header.base_offset,
                        log_end_offset: self.log_end_offset,
                    });
                }
                // A log's epochs never go down. A fetched batch older than
                // our latest epoch is one that waited while this replica
                // became a leader (its epoch starts at our end): appended, it
                // would put the old epoch's records after the new epoch's
                // start, and every follower that asked where the old epoch
                // ends would be told the wrong offset and cut and refetch the
                // same record forever (nemesis seed 5002, cycle 549).
                if let Some(latest) = self.epochs.latest_epoch() {
                    if header.partition_leader_epoch < latest {
                        return Err(LogError::StaleReplicaEpoch {
                            epoch: header.partition_leader_epoch,
                            latest,
                        });
                    }
                }
            }
        }
        let result = self
            .guarded(
                "an append was cancelled part way through its write",
                |log| log.write_batch(batch, header),
            )
            .await;
        self.offline_on_error(result)
    }

    /// The I/O half of `append` (the batch is valid and stamped): every error
    /// from here on is a write-path failure.
    async fn write_batch(&mut self, batch: BytesMut, header: BatchHeader) -> Result<AppendInfo> {
        let assigned = self
            .epochs
            .assign(header.partition_leader_epoch, header.base_offset);
        if assigned || self.epochs.is_dirty() {
            self.epochs.persist().await?;
        }
        if self.should_roll(&header) {
            let started = std::time::Instant::now();
            self.roll(header.base_offset).await?;
            crate::stats::local().record_roll(started.elapsed());
        }
        // Two attribute bits; only a control batch is decoded.
        let txn = if header.is_transactional() || header.is_control() {
            TxnBatch::of(&header, &batch).unwrap_or_else(|e| {
                tracing::warn!(
                    dir = %self.dir.display(), offset = header.base_offset, error = %e,
                    "a control batch that is no transaction marker"
                );
                None
            })
        } else {
            None
        };
        let interval = self.config.index_interval_bytes;
        self.active().append(&batch, &header, interval).await?;
        self.log_end_offset = header.next_offset();
        if let Some(txn) = txn {
            self.track_txn(txn);
        }
        let bytes = batch.len();
        self.cache.insert(
            self.cache_id,
            header.base_offset,
            header.last_offset(),
            batch.freeze(),
        );
        Ok(AppendInfo {
            base_offset: header.base_offset,
            last_offset: header.last_offset(),
            max_timestamp: header.max_timestamp,
            records: header.records_count,
            bytes,
        })
    }

    fn should_roll(&mut self, header: &BatchHeader) -> bool {
        let segment_bytes = self.config.segment_bytes;
        let segment_ms = self.config.segment_ms;
        let active = self.active();
        if active.is_empty() {
            return false;
        }
        active.size() + header.total_len() as u64 > segment_bytes
            || segment_ms.is_some_and(|ms| active.age() >= ms)
            || !active.can_hold(header.last_offset())
    }

    /// Closes the active segment (flushed, trimmed, indexes written) and starts a
    /// new one at `base_offset`.
    ///
    /// A roll waits on the disk while the partition's appends wait on it, so
    /// it syncs as little, and as much at once, as it can: the closed
    /// segment's data, its two indexes and the next recovery point are written
    /// and fdatasync'd together; then the indexes are renamed into place, the
    /// new segment's file is made and the recovery point renamed, in that
    /// order, and one directory sync makes all of it durable. A crash before
    /// that sync leaves an earlier state or a prefix of those renames, each of
    /// which recovery reads (a missing index is rebuilt by a scan; a recovery
    /// point is never renamed before the data and indexes it vouches for were
    /// synced).
    async fn roll(&mut self, base_offset: i64) -> Result<()> {
        let growth = self.active().growth();
        let closed_end = self.log_end_offset;
        let point = fsutil::write_tmps(vec![(
            self.dir.join(RECOVERY_POINT_FILE),
            recovery::encode_offset_checkpoint(&self.topic, self.partition, closed_end),
        )]);
        let (closed, point) =
            futures_util::future::join(self.active().close_active_unsynced(), point).await;
        closed?;
        let point = point?;
        self.flushed_offset = self.flushed_offset.max(closed_end);
        self.checkpoint_txn_state(base_offset).await?;
        self.rolls_since_retention += 1;
        let reuse = self.take_free_file(base_offset);
        let segment = Segment::create_unsynced(
            &self.dir,
            base_offset,
            &self.config,
            growth,
            reuse.as_ref().map(|f| f.path.as_path()),
        )
        .await?;
        if reuse.is_some() {
            crate::stats::local().record_segment_recycled();
        }
        tracing::debug!(
            dir = %self.dir.display(), base_offset, recycled = reuse.is_some(), "rolled segment"
        );
        self.segments.insert(base_offset, segment);
        fsutil::rename_all(point).await?;
        fsutil::sync_dir(&self.dir).await?;
        self.recovery_point = closed_end;
        Ok(())
    }

    /// The oldest free file a segment based at `base_offset` may reuse: every
    /// batch in it lies below its bound, so at or below `base_offset` none of
    /// them can pass for this segment's data (see `segment`).
    fn take_free_file(&mut self, base_offset: i64) -> Option<FreeFile> {
        if !self.config.recycle_segments {
            return None;
        }
        let i = self.free.iter().position(|f| f.bound <= base_offset)?;
        self.free.remove(i)
    }

    /// Free files kept in the pool (`LogConfig::recycle_segments`).
    pub fn free_segment_files(&self) -> usize {
        self.free.len()
    }

    /// Disk the free files hold (not counted in `size_bytes`).
    pub fn free_segment_bytes(&self) -> u64 {
        self.free.iter().map(|f| f.bytes).sum()
    }

    /// Writes out and fdatasyncs everything appended: `flushed_offset` becomes the
    /// log end offset.
    pub async fn flush(&mut self) -> Result<()> {
        self.check_online()?;
        let end = self.log_end_offset;
        let result = self
            .guarded("a flush was cancelled part way", |log| log.active().flush())
            .await;
        self.offline_on_error(result)?;
        self.flushed_offset = end;
        Ok(())
    }

    /// First half of a group-committed flush: everything appended is written out
    /// (no sync). Returns the offset a sync of the active file makes durable.
    pub async fn write_out(&mut self) -> Result<i64> {
        // Checked here, not only by the appender: after a failed fdatasync
        // everything may be written out, and a second fdatasync succeeds
        // without making anything durable.
        self.check_online()?;
        let end = self.log_end_offset;
        let result = self
            .guarded("a write-out was cancelled part way", |log| {
                log.active().write_out()
            })
            .await;
        self.offline_on_error(result)?;
        Ok(end)
    }

    /// First half of a group commit, under the lock: submits everything
    /// appended up to the log end offset and returns it with the writes to
    /// await (outside the lock) before the fdatasync that makes it durable.
    pub async fn start_write_out(
        &mut self,
    ) -> Result<(i64, Vec<crate::segment::appender::PendingWrite>)> {
        // Checked here, not only by the appender: after a failed fdatasync
        // everything may be written out, and a second fdatasync succeeds
        // without making anything durable.
        self.check_online()?;
        let end = self.log_end_offset;
        let result = self
            .guarded("a write-out was cancelled part way", |log| {
                log.active().start_write_out()
            })
            .await;
        let writes = self.offline_on_error(result)?;
        Ok((end, writes))
    }

    /// The active segment's file, for an fdatasync done outside the log's lock.
    pub fn active_file(&mut self) -> std::rc::Rc<glommio::io::DmaFile> {
        self.active().file().clone()
    }

    /// Second half of a group-committed flush, after the fdatasync succeeded.
    /// Refused when the log went offline meanwhile (a roll's write or sync
    /// failed while this sync ran): a sync racing a failure proves nothing.
    pub fn mark_flushed(&mut self, offset: i64) -> Result<()> {
        self.check_online()?;
        self.flushed_offset = self.flushed_offset.max(offset.min(self.log_end_offset));
        Ok(())
    }

    /// A sync done outside failed: the log goes offline.
    pub fn poison(&mut self, reason: &str) {
        self.active().poison(reason);
        let _ = self.offline_on_error::<()>(Err(LogError::Offline(reason.to_string())));
    }

    /// The high watermark checkpointed by replication (None: never written).
    pub fn high_watermark_checkpoint(&self) -> Option<i64> {
        self.high_watermark_checkpoint
    }

    /// Persists the replicated high watermark (when it changed).
    /// Nothing is written once the log is offline.
    pub async fn checkpoint_high_watermark(&mut self, hw: i64) -> Result<()> {
        let hw = hw.min(self.log_end_offset);
        if self.high_watermark_checkpoint == Some(hw) || self.offline.is_some() {
            return Ok(());
        }
        self.write_checkpoint(HIGH_WATERMARK_FILE, hw).await?;
        self.high_watermark_checkpoint = Some(hw);
        Ok(())
    }

    /// Persists `flushed_offset` as the recovery point (not once the log is
    /// offline: the checkpoint on disk stays as it was, which recovery treats
    /// as safe, and a full disk is not asked for more).
    pub async fn checkpoint_recovery_point(&mut self) -> Result<()> {
        if self.recovery_point == self.flushed_offset && self.recovery_point != 0
            || self.offline_reason().is_some()
        {
            return Ok(());
        }
        write_recovery_point(&self.dir, &self.topic, self.partition, self.flushed_offset).await?;
        self.recovery_point = self.flushed_offset;
        Ok(())
    }

    /// Whole batches from the one holding `offset`, at most `max_bytes` (the first
    /// batch always whole, like Kafka), stopping before any batch at or past
    /// `upper_bound` (the high watermark for consumers, the log end for followers).
    pub async fn read(
        &mut self,
        offset: i64,
        max_bytes: usize,
        upper_bound: i64,
    ) -> Result<ReadBatches> {
        if let Some((corruption, _)) = &self.corrupt {
            return Err(LogError::Corrupt(corruption.clone()));
        }
        self.check_offset(offset)?;
        let upper = self.readable_end(upper_bound);
        if offset >= upper {
            return Ok(ReadBatches {
                batches: Vec::new(),
                next_offset: offset,
            });
        }
        if let Some(hit) = self.cache.read(self.cache_id, offset, max_bytes, upper) {
            return Ok(ReadBatches {
                batches: hit.batches,
                next_offset: hit.next_offset,
            });
        }
        self.read_from_disk(offset, max_bytes, upper).await
    }

    /// Where reads stop: `upper_bound`, within the log; once the log is
    /// offline, within what was flushed (the rest may never have reached the
    /// file, and nothing more is written out).
    fn readable_end(&self, upper_bound: i64) -> i64 {
        let end = upper_bound.min(self.log_end_offset);
        if self.offline_reason().is_some() {
            end.min(self.flushed_offset)
        } else {
            end
        }
    }

    pub fn check_offset(&self, offset: i64) -> Result<()> {
        if offset < self.log_start_offset || offset > self.log_end_offset {
            return Err(LogError::OffsetOutOfRange {
                offset,
                log_start_offset: self.log_start_offset,
                log_end_offset: self.log_end_offset,
            });
        }
        Ok(())
    }

    /// Reads the batch cache alone (no disk, no lock needed by callers).
    pub fn read_cached(
        &self,
        offset: i64,
        max_bytes: usize,
        upper_bound: i64,
    ) -> Option<ReadBatches> {
        let upper = self.readable_end(upper_bound);
        if offset < self.log_start_offset || offset >= upper || self.corrupt.is_some() {
            return None;
        }
        self.cache
            .read(self.cache_id, offset, max_bytes, upper)
            .map(|hit| ReadBatches {
                batches: hit.batches,
                next_offset: hit.next_offset,
            })
    }

    async fn read_from_disk(
        &mut self,
        offset: i64,
        max_bytes: usize,
        upper: i64,
    ) -> Result<ReadBatches> {
        let empty = ReadBatches {
            batches: Vec::new(),
            next_offset: offset,
        };
        // The segment holding `offset`, or the next one if `offset` falls in a gap.
        let Some(base) = self
            .segments
            .range(..=offset)
            .next_back()
            .filter(|(_, s)| s.next_offset() > offset)
            .or_else(|| self.segments.range(offset + 1..).next())
            .map(|(b, _)| *b)
        else {
            return Ok(empty);
        };
        let offline = self.offline_reason().is_some();
        let Some(segment) = self.segments.get_mut(&base) else {
            return Ok(empty);
        };
        if !offline {
            // Offline, reads stop at the flushed offset: that much is written.
            segment.write_out().await?;
        }
        let path = segment.log_path();
        let (segment_size, segment_next_offset) = (segment.size(), segment.next_offset());
        let rel = (offset - base).clamp(0, i64::from(u32::MAX)) as u32;
        let mut start = segment
            .offset_index()
            .lookup(rel)
            .map_or(0, |e| u64::from(e.position));
        let mut want = max_bytes.clamp(READ_CHUNK_MIN_BYTES, READ_CHUNK_MAX_BYTES);
        // The lowest base offset the next batch may have: offsets only grow
        // inside a segment (the base offset is outside the CRC's range).
        let mut expected = base;
        // Read a region, slice whole batches out of it; read again further on when
        // the batches before `offset` used it up or the first batch is larger.
        loop {
            let data = segment.read(start, want).await?;
            let mut out = ReadBatches {
                batches: Vec::new(),
                next_offset: offset,
            };
            let mut total = 0usize;
            let mut scanner = BatchScanner::new(&data);
            let mut skipped_to = 0usize;
            let mut full = false;
            let mut bad: Option<(usize, i64, String)> = None;
            for (p, h) in scanner.by_ref() {
                if let Err(reason) = check_stored_header(&h, expected, segment_next_offset) {
                    bad = Some((p, expected, reason));
                    break;
                }
                expected = h.next_offset();
                if h.last_offset() < offset {
                    skipped_to = p + h.total_len();
                    continue;
                }
                if h.base_offset >= upper
                    || (!out.batches.is_empty() && total + h.total_len() > max_bytes)
                {
                    full = true;
                    break;
                }
                let bytes = data.slice(p..p + h.total_len());
                // Verified here, once, on its way out: never served unchecked.
                if let Err(e) = batch::crc_matches(&bytes) {
                    bad = Some((p, h.base_offset, e.to_string()));
                    break;
                }
                total += h.total_len();
                out.next_offset = h.next_offset();
                out.batches.push(bytes);
            }
            let read_to_end = start + data.len() as u64 >= segment_size;
            if bad.is_none() && !full {
                // Stopped before the data did: a header that does not parse,
                // or a batch running past the segment's end.
                let stop = scanner.position();
                bad = match scanner.error() {
                    Some(e) => Some((stop, expected, format!("unreadable batch header: {e}"))),
                    None if read_to_end && stop < data.len() => Some((
                        stop,
                        expected,
                        "a batch runs past the end of the segment".to_string(),
                    )),
                    None => None,
                };
            }
            if let Some((p, base_offset, reason)) = bad {
                let error = self.mark_corrupt(Corruption {
                    path,
                    segment_base_offset: base,
                    position: start + p as u64,
                    base_offset,
                    reason,
                });
                // What was good before it is served; the next read fails.
                return if out.batches.is_empty() {
                    Err(error)
                } else {
                    Ok(out)
                };
            }
            if full || !out.batches.is_empty() || read_to_end {
                return Ok(out);
            }
            // Nothing whole yet: skip what was before `offset` and make sure the
            // next read holds at least the next batch entirely.
            start += skipped_to as u64;
            let rest = &data[skipped_to..];
            if let Ok(h) = BatchHeader::parse(rest) {
                want = want.max(h.total_len());
            }
        }
    }

    /// The first offset whose record timestamp is `>= timestamp`, with that
    /// timestamp (ListOffsets by time). `None` when every record is older.
    pub async fn offset_for_timestamp(&mut self, timestamp: i64) -> Result<Option<(i64, i64)>> {
        self.check_online()?;
        let Some(base) = self
            .segments
            .values()
            .find(|s| s.max_timestamp() >= timestamp)
            .map(Segment::base_offset)
        else {
            return Ok(None);
        };
        let Some(segment) = self.segments.get_mut(&base) else {
            return Ok(None);
        };
        segment.write_out().await?;
        // Batches up to the time index entry below `timestamp` are all older.
        let from_rel = segment
            .time_index()
            .lookup(timestamp)
            .map_or(0, |e| e.relative_offset.saturating_add(1));
        let start = segment
            .offset_index()
            .lookup(from_rel)
            .map_or(0, |e| u64::from(e.position));
        let mut found: Option<Bytes> = None;
        let path = segment.log_path();
        scan(
            segment.file(),
            &path,
            start,
            segment.size(),
            1 << 20,
            |_, h, bytes| {
                if h.max_timestamp >= timestamp && h.last_offset() >= base + i64::from(from_rel) {
                    found = Some(Bytes::copy_from_slice(bytes));
                    return ControlFlow::Break(());
                }
                ControlFlow::Continue(())
            },
        )
        .await?;
        let Some(batch) = found else { return Ok(None) };
        let records = decode_records(&batch, self.config.max_batch_bytes.saturating_mul(64))?;
        Ok(records
            .iter()
            .find(|r| r.timestamp >= timestamp)
            .map(|r| (r.offset, r.timestamp)))
    }

    /// Verifies about `max_bytes` of closed segments from where the last call
    /// stopped, with the read path's checks (`check_stored_header`, CRC-32C):
    /// a flipped byte in data nobody reads (a follower's, an old segment's) is
    /// found by the scrubber, not by the first consumer that asks for it. A
    /// bad batch takes the log offline for corruption exactly as a read would
    /// (`LogError::Corrupt`; the node repairs it from the other replicas).
    /// The active segment is left alone (what it holds was just written and
    /// recovery checks it after a crash); an offline log is skipped.
    pub async fn scrub(&mut self, max_bytes: usize) -> Result<ScrubStep> {
        let mut step = ScrubStep::default();
        if self.offline_reason().is_some() || self.closed {
            step.pass_done = true;
            return Ok(step);
        }
        let active = self.segments.keys().next_back().copied();
        let cursor = self.scrub_cursor.and_then(|c| {
            // The segment may be gone (retention, truncation, compaction).
            self.segments.contains_key(&c.segment).then_some(c)
        });
        let cursor = match cursor {
            Some(c) => c,
            None => match self.segments.keys().next().copied() {
                Some(first) => ScrubCursor {
                    segment: first,
                    position: 0,
                    expected: first,
                },
                None => {
                    step.pass_done = true;
                    return Ok(step);
                }
            },
        };
        if Some(cursor.segment) == active {
            self.scrub_cursor = None;
            step.pass_done = true;
            return Ok(step);
        }
        let Some(segment) = self.segments.get(&cursor.segment) else {
            self.scrub_cursor = None;
            return Ok(step);
        };
        let (size, next_offset, path) = (segment.size(), segment.next_offset(), segment.log_path());
        let mut want = max_bytes.clamp(READ_CHUNK_MIN_BYTES, READ_CHUNK_MAX_BYTES);
        let mut data = segment.read(cursor.position, want).await?;
        // A first batch larger than the read: read it whole (a header that
        // claims more than the largest read is reported below).
        if let Ok(h) = BatchHeader::parse(&data) {
            if h.total_len() > data.len() && h.total_len() <= READ_CHUNK_MAX_BYTES {
                want = h.total_len();
                data = segment.read(cursor.position, want).await?;
            }
        }
        let mut scanner = BatchScanner::new(&data);
        let mut expected = cursor.expected;
        let mut consumed = 0usize;
        let mut bad: Option<(usize, i64, String)> = None;
        for (p, h) in scanner.by_ref() {
            if let Err(reason) = check_stored_header(&h, expected, next_offset) {
                bad = Some((p, expected, reason));
                break;
            }
            if let Err(e) = batch::crc_matches(&data[p..p + h.total_len()]) {
                bad = Some((p, h.base_offset, e.to_string()));
                break;
            }
            expected = h.next_offset();
            consumed = p + h.total_len();
        }
        let end = cursor.position + consumed as u64;
        if bad.is_none() && consumed == 0 {
            // Not one whole batch in what was read.
            let reason = match scanner.error() {
                Some(e) => Some(format!("unreadable batch header: {e}")),
                None if cursor.position + data.len() as u64 >= size && !data.is_empty() => {
                    Some("a batch runs past the end of the segment".to_string())
                }
                None if !data.is_empty() => Some(format!(
                    "a batch header claims more than the largest read ({READ_CHUNK_MAX_BYTES} \
                     bytes; read {want})"
                )),
                None => None,
            };
            bad = reason.map(|r| (0, expected, r));
        }
        if let Some((p, base_offset, reason)) = bad {
            self.scrub_cursor = None;
            return Err(self.mark_corrupt(Corruption {
                path,
                segment_base_offset: cursor.segment,
                position: cursor.position + p as u64,
                base_offset,
                reason,
            }));
        }
        step.bytes = consumed as u64;
        self.scrub_cursor = if end >= size {
            // This segment is done: the next one, or a new pass.
            match self.segments.range(cursor.segment + 1..).next() {
                Some((&next, _)) if Some(next) != active => Some(ScrubCursor {
                    segment: next,
                    position: 0,
                    expected: next,
                }),
                _ => {
                    step.pass_done = true;
                    None
                }
            }
        } else {
            Some(ScrubCursor {
                segment: cursor.segment,
                position: end,
                expected,
            })
        };
        Ok(step)
    }

    /// Removes every batch from the one holding `offset` on (Kafka's truncateTo):
    /// afterwards the log ends at that batch's base offset. Replication uses it when
    /// a follower's log diverges from its new leader's.
    pub async fn truncate_to(&mut self, offset: i64) -> Result<()> {
        self.check_online()?;
        if offset >= self.log_end_offset {
            // Nothing to cut, but an epoch that starts at the log end has no
            // records here: a former leader's entry from a leadership that
            // never appended. Kafka drops it too (`UnifiedLog.truncateTo`);
            // kept, it would make this follower's last epoch one the leader
            // never had, and every fetch would diverge again.
            if self.epochs.truncate_from_end(self.log_end_offset) {
                let persisted = self.epochs.persist().await;
                self.offline_on_error(persisted)?;
            }
            return Ok(());
        }
        let result = self.truncate_inner(offset, false).await;
        self.offline_on_error(result)
    }

    /// Repairs a log that went offline for a corrupt batch (`corruption`):
    /// everything from the first batch of that segment that fails its checks
    /// on is removed (`truncate_to` semantics: later segments, indexes, the
    /// leader-epoch cache and producer snapshots follow), and the log serves
    /// again, ending where its good data ends. When the bad batch holds the
    /// log start, the log starts over, empty, at the log start.
    ///
    /// Only for a replica that fetches the rest from another: data is cut
    /// that this replica alone may not hold again (the node calls it once
    /// another replica leads). Returns the new log end, or None when the log
    /// is not corrupt. A log also offline for a failed write is refused
    /// (`LogError::Offline`: only a reopen brings that back); a failure here
    /// leaves the log offline the same way.
    pub async fn repair_corruption(&mut self) -> Result<Option<i64>> {
        if self.corrupt.is_none() {
            return Ok(None);
        }
        if let Some(reason) = self.write_failure() {
            return Err(LogError::Offline(reason.to_string()));
        }
        let Some((corruption, _)) = self.corrupt.take() else {
            return Ok(None);
        };
        let result = self.cut_before_corruption(&corruption).await;
        let end = self.offline_on_error(result)?;
        tracing::warn!(
            path = %corruption.path.display(), position = corruption.position,
            log_end_offset = end,
            "repaired the corrupt partition log: cut before the bad batch, serving again"
        );
        Ok(Some(end))
    }

    async fn cut_before_corruption(&mut self, corruption: &Corruption) -> Result<i64> {
        let Some(segment) = self.segments.get_mut(&corruption.segment_base_offset) else {
            // Gone already (nothing deletes segments of an offline log).
            return Ok(self.log_end_offset);
        };
        segment.write_out().await?;
        // The good prefix: the segment scanned with the read path's checks,
        // up to the first batch that fails (at or before the one the read
        // found); the cut is the offset after it.
        let segment_next_offset = segment.next_offset();
        let mut cut = segment.base_offset();
        scan(
            segment.file(),
            &segment.log_path(),
            0,
            segment.size(),
            4 << 20,
            |_, h, bytes| {
                if !stored_batch_ok(h, bytes, cut, segment_next_offset) {
                    return ControlFlow::Break(());
                }
                cut = h.next_offset();
                ControlFlow::Continue(())
            },
        )
        .await?;
        if cut <= self.log_start_offset {
            // Nothing good is left at or past the start: the log starts over,
            // empty, at its start. First cut to the start (the batch holding
            // it goes, and every segment from it on), which leaves the log
            // ending at or below its start, the one state
            // `truncate_fully_and_start_at` takes from a log with records; a
            // crash between the two is recovery's "log ends below its start".
            let start = self.log_start_offset;
            self.truncate_inner(start, true).await?;
            self.truncate_fully_and_start_at(start).await?;
        } else {
            self.truncate_inner(cut, true).await?;
        }
        Ok(self.log_end_offset)
    }

    /// Cuts the log at the batch holding `offset`; with `verify`, also at the
    /// first batch of the segment cut that fails its checks (CRC, offsets
    /// going backwards, an unreadable header), so no bad batch stays.
    async fn truncate_inner(&mut self, offset: i64, verify: bool) -> Result<()> {
        self.guarded("a truncation was cancelled part way", |log| {
            log.truncate_files(offset, verify)
        })
        .await
    }

    /// The body of `truncate_inner`, under its guard.
    async fn truncate_files(&mut self, offset: i64, verify: bool) -> Result<()> {
        let offset = offset.max(self.log_start_offset);
        // Snapshots of what is cut go first, durably: a crash half-way must not
        // leave one describing records the log no longer (or differently) has.
        snapshot::delete_above(&self.dir, offset).await?;
        // Segments wholly at or past the cut go, keeping the first as the new home.
        let doomed: Vec<i64> = self.segments.range(offset..).map(|(b, _)| *b).collect();
        let keep_first = self.segments.range(..offset).next_back().is_none();
        for base in &doomed {
            if keep_first && *base == doomed[0] {
                continue;
            }
            if let Some(segment) = self.segments.remove(base) {
                segment.delete().await?;
            }
        }
        let interval = self.config.index_interval_bytes;
        let config = self.config.clone();
        let segment = self.active();
        segment.write_out().await?;
        let base = segment.base_offset();
        // Find the batch holding `offset`; cut at its position.
        let mut cut: Option<u64> = None;
        let mut expected = base;
        let segment_next_offset = segment.next_offset();
        let path = segment.log_path();
        let outcome = scan(
            segment.file(),
            &path,
            0,
            segment.size(),
            4 << 20,
            |pos, h, bytes| {
                let bad = verify && !stored_batch_ok(h, bytes, expected, segment_next_offset);
                if bad || h.last_offset() >= offset {
                    cut = Some(pos);
                    return ControlFlow::Break(());
                }
                expected = h.next_offset();
                ControlFlow::Continue(())
            },
        )
        .await?;
        let position = match (cut, outcome.stop) {
            (Some(position), _) => position,
            (None, ScanStop::End) => segment.size(),
            // An unreadable header or a batch past the end: bad too.
            (None, _) if verify => outcome.position,
            (None, _) => segment.size(),
        };
        let scanned = scan_segment(segment.file(), &path, base, position, interval, verify).await?;
        let mut state = scanned.state;
        // The aborted transactions whose marker stays.
        let mut txn_index = segment.txn_index().clone();
        txn_index.truncate_to(state.next_offset);
        state.txn_index = txn_index;
        segment.truncate(state, &config).await?;
        self.log_end_offset = self.active().next_offset();
        self.truncate_txns(self.log_end_offset).await?;
        self.cache.truncate(self.cache_id, self.log_end_offset);
        if self.first_dirty_offset > self.log_end_offset {
            // Offsets appended again past the cut are not clean.
            self.first_dirty_offset = self.log_end_offset;
            self.write_checkpoint(CLEANER_CHECKPOINT_FILE, self.log_end_offset)
                .await?;
        }
        if self.epochs.truncate_from_end(self.log_end_offset) {
            self.epochs.persist().await?;
        }
        // The cut may land below `offset` (the start of the batch holding it).
        snapshot::delete_above(&self.dir, self.log_end_offset).await?;
        self.flushed_offset = self.flushed_offset.min(self.log_end_offset);
        self.checkpoint_recovery_point().await?;
        self.active().flush().await?;
        self.flushed_offset = self.log_end_offset;
        Ok(())
    }

    /// Stores an opaque producer-state snapshot describing the log below
    /// `offset` (see `snapshot`): only for flushed offsets, so a crash cannot
    /// take away what it describes. Keeps the newest `snapshot::SNAPSHOTS_KEPT`.
    /// Not on the append path; nothing is written once the log is offline.
    pub async fn write_producer_snapshot(&mut self, offset: i64, body: &[u8]) -> Result<()> {
        self.check_online()?;
        if offset > self.flushed_offset || offset < 0 {
            return Err(LogError::SnapshotNotFlushed {
                offset,
                flushed_offset: self.flushed_offset,
            });
        }
        snapshot::write(&self.dir, offset, body).await
    }

    /// The newest producer snapshot at or below the log end whose frame
    /// checks (corrupt ones are logged and skipped): its offset and body.
    pub async fn latest_producer_snapshot(&self) -> Result<Option<(i64, Bytes)>> {
        snapshot::latest(&self.dir, self.log_end_offset).await
    }

    /// Kafka's `truncateFullyAndStartAt`: every segment goes and the log starts
    /// over, empty, at `offset` (log start = log end = flushed = `offset`), with
    /// an empty leader-epoch cache. A follower does this when the leader's log
    /// starts past this log's end (retention or DeleteRecords ran on the leader
    /// while this replica was away), and when the first batch fetched into an
    /// empty log begins before its start (the leader's log start is inside that
    /// batch: the log starts over at the batch's base offset).
    ///
    /// `offset` must be at or past the log end, or the log must be empty with no
    /// batch in any segment; anything else is `OffsetOutOfRange` (cutting a log
    /// with records is `truncate_to`'s job). A poisoned log stays offline.
    ///
    /// Crash-safe (SIGKILL at any point comes back as the old log or as the
    /// empty log at `offset`, nothing in between). On disk, in order:
    /// 1. checkpoints that must not exceed the new log are lowered to `offset`
    ///    (recovery point, cleaner, replicated high watermark), and when
    ///    `offset` is below the log start the current start is checkpointed:
    ///    all of it is as true of the old log as of the new one;
    /// 2. the empty segment `<offset>.log` is created, directory synced (an
    ///    empty segment already starting at `offset` is kept instead);
    /// 3. `log-start-offset-checkpoint` = `offset`: the commit point;
    /// 4. the leader-epoch cache is emptied;
    /// 5. the old segments' files go;
    /// 6. the recovery point (and the high watermark, if one was checkpointed)
    ///    move to `offset`.
    ///
    /// Recovery before 3 finds the old log: the new segment is empty and either
    /// continues the old log's offsets (a harmless empty last segment) or does
    /// not (recovery removes it), or it lies wholly below the checkpointed
    /// start (removed). From 3 on, every old segment is wholly below the
    /// checkpointed start and recovery removes it; `open` cuts the epoch cache
    /// to the recovered log, which leaves an empty log with no epochs.
    pub async fn truncate_fully_and_start_at(&mut self, offset: i64) -> Result<()> {
        self.guarded("a truncation was cancelled part way", |log| {
            log.truncate_fully_and_start_at_to_its_end(offset)
        })
        .await
    }

    /// The body of `truncate_fully_and_start_at`, under its guard.
    async fn truncate_fully_and_start_at_to_its_end(&mut self, offset: i64) -> Result<()> {
        let empty = self.log_start_offset == self.log_end_offset
            && self.segments.values().all(Segment::is_empty);
        if offset < 0 || (offset < self.log_end_offset && !empty) {
            return Err(LogError::OffsetOutOfRange {
                offset,
                log_start_offset: self.log_start_offset,
                log_end_offset: self.log_end_offset,
            });
        }
        self.check_writable()?;
        let (old_start, old_end) = (self.log_start_offset, self.log_end_offset);
        // 0. Producer snapshots all go, durably, before anything else: they
        // describe the old log (Kafka's truncateFullyAndStartAt clears the
        // producer state too). A crash after this finds the old log without
        // them: slower to load, never wrong.
        snapshot::delete_above(&self.dir, -1).await?;
        // So does the transaction state: none open at `offset`. (A crash
        // before the commit finds no state for the old log's segments and
        // replays it from its start.)
        self.restart_txns(offset).await?;
        // 1. Checkpoints lowered where they would claim more than the new log holds.
        if self.recovery_point > offset {
            write_recovery_point(&self.dir, &self.topic, self.partition, offset).await?;
            self.recovery_point = offset;
        }
        if self.first_dirty_offset > offset {
            self.write_checkpoint(CLEANER_CHECKPOINT_FILE, offset)
                .await?;
            self.first_dirty_offset = offset;
        }
        self.tombstone_horizon = None;
        if self.high_watermark_checkpoint.is_some_and(|hw| hw > offset) {
            self.checkpoint_high_watermark(offset).await?;
        }
        if offset < self.log_start_offset {
            // A crash before the commit must still find the old start, above the
            // new segment made next (which recovery then drops as wholly below it).
            self.write_checkpoint(LOG_START_OFFSET_FILE, self.log_start_offset)
                .await?;
        }
        // 2. The new, empty active segment (or the empty one already there: by
        // the precondition a segment starting at or past the log end is empty).
        let created = match self.segments.get(&offset) {
            Some(segment) if !segment.is_empty() => {
                return Err(LogError::OffsetOutOfRange {
                    offset,
                    log_start_offset: self.log_start_offset,
                    log_end_offset: self.log_end_offset,
                })
            }
            Some(_) => None,
            None => {
                Some(Segment::create(&self.dir, offset, &self.config, Growth::SMALL, None).await?)
            }
        };
        // 3. The commit point.
        self.write_checkpoint(LOG_START_OFFSET_FILE, offset).await?;
        let mut old = std::mem::take(&mut self.segments);
        let mut segment = match created.or_else(|| old.remove(&offset)) {
            Some(segment) => segment,
            None => Segment::create(&self.dir, offset, &self.config, Growth::SMALL, None).await?,
        };
        if !segment.is_active() {
            segment.activate(&self.config).await?;
        }
        self.segments.insert(offset, segment);
        self.log_start_offset = offset;
        self.log_end_offset = offset;
        self.flushed_offset = offset;
        self.cache.truncate_front(self.cache_id, i64::MAX);
        // 4. No epochs: the next batch appended brings its own.
        if self.epochs.clear() {
            self.epochs.persist().await?;
        }
        // 5. The old segments.
        let deleted = old.len();
        for (_, segment) in old {
            segment.delete().await?;
        }
        // 6.
        self.checkpoint_recovery_point().await?;
        if self.high_watermark_checkpoint.is_some() {
            self.checkpoint_high_watermark(offset).await?;
        }
        tracing::info!(
            dir = %self.dir.display(), old_start, old_end, new_start = offset,
            deleted_segments = deleted, "log truncated fully and started over"
        );
        Ok(())
    }

    /// Deletes closed segments by `retention.ms` (their newest batch is older than
    /// `now_ms - retention.ms`) and `retention.bytes` (oldest first, while the log
    /// stays at or above the limit without them), as Kafka does: never the active
    /// segment, never a segment holding offsets at or past `high_watermark`, and
    /// in order, stopping at the first segment that must stay. The log start
    /// offset moves to the first remaining segment and is checkpointed.
    pub async fn apply_retention(
        &mut self,
        now_ms: i64,
        high_watermark: i64,
    ) -> Result<RetentionOutcome> {
        self.guarded("a retention pass was cancelled part way", |log| {
            log.apply_retention_to_its_end(now_ms, high_watermark)
        })
        .await
    }

    /// The body of `apply_retention`, under its guard.
    async fn apply_retention_to_its_end(
        &mut self,
        now_ms: i64,
        high_watermark: i64,
    ) -> Result<RetentionOutcome> {
        let mut outcome = RetentionOutcome {
            log_start_offset: self.log_start_offset,
            ..RetentionOutcome::default()
        };
        if self.offline_reason().is_some() {
            return Ok(outcome);
        }
        // Files kept long ago that no roll took since (the log writes less
        // than it used to), or all once recycling is off: their space goes
        // back.
        let mut kept = VecDeque::with_capacity(self.free.len());
        for mut f in std::mem::take(&mut self.free) {
            let since = *f.kept_at_ms.get_or_insert(now_ms);
            if !self.config.recycle_segments || now_ms.saturating_sub(since) > FREE_FILE_TTL_MS {
                crate::trash::delete_file(&f.path)?;
            } else {
                kept.push_back(f);
            }
        }
        self.free = kept;
        // As many files as the log rolled since the previous pass (at least
        // one): about what it will take before the next.
        let rolls = std::mem::take(&mut self.rolls_since_retention);
        let mut keep = if self.config.recycle_segments {
            rolls.max(1).saturating_sub(self.free.len())
        } else {
            0
        };
        if !self.config.retention_delete {
            return Ok(outcome);
        }
        let retention_ms = self.config.retention_ms.map(|d| d.as_millis() as i64);
        let retention_bytes = self.config.retention_bytes;
        let mut size = self.size_bytes();
        let mut doomed = Vec::new();
        let closed = self.segments.len().saturating_sub(1);
        for segment in self.segments.values().take(closed) {
            if segment.next_offset() > high_watermark {
                break;
            }
            let expired = retention_ms.is_some_and(|ms| {
                segment.max_timestamp() >= 0 && now_ms - segment.max_timestamp() > ms
            });
            let oversized =
                retention_bytes.is_some_and(|limit| size.saturating_sub(segment.size()) >= limit);
            if !(expired || oversized) {
                break;
            }
            size -= segment.size();
            doomed.push(segment.base_offset());
        }
        let Some(&last_doomed) = doomed.last() else {
            return Ok(outcome);
        };
        let new_start = self
            .segments
            .range(last_doomed + 1..)
            .next()
            .map_or(self.log_end_offset, |(b, _)| *b);
        // The new start is durable before any file goes: a crash in between leaves
        // extra segments below the start, never a start pointing at nothing.
        self.set_log_start_offset(new_start).await?;
        for base in doomed {
            if let Some(segment) = self.segments.remove(&base) {
                outcome.deleted_segments += 1;
                outcome.deleted_bytes += segment.size();
                if keep > 0 {
                    keep -= 1;
                    let bytes = segment.size();
                    let (path, bound) = segment.retire().await?;
                    outcome.recycled_segments += 1;
                    self.free.push_back(FreeFile {
                        bound,
                        path,
                        bytes,
                        kept_at_ms: Some(now_ms),
                    });
                } else {
                    segment.delete().await?;
                }
            }
        }
        outcome.log_start_offset = self.log_start_offset;
        tracing::info!(
            dir = %self.dir.display(), segments = outcome.deleted_segments, bytes = outcome.deleted_bytes,
            kept_for_reuse = outcome.recycled_segments,
            log_start_offset = outcome.log_start_offset, "retention deleted segments"
        );
        Ok(outcome)
    }

    /// DeleteRecords: the log starts at `offset` (at most `high_watermark`), and
    /// segments wholly below it are removed. Returns the new log start offset.
    pub async fn delete_records(&mut self, offset: i64, high_watermark: i64) -> Result<i64> {
        self.guarded("a DeleteRecords was cancelled part way", |log| {
            log.delete_records_to_its_end(offset, high_watermark)
        })
        .await
    }

    /// The body of `delete_records`, under its guard.
    async fn delete_records_to_its_end(&mut self, offset: i64, high_watermark: i64) -> Result<i64> {
        self.check_online()?;
        if offset < 0 || offset > high_watermark {
            return Err(LogError::OffsetOutOfRange {
                offset,
                log_start_offset: self.log_start_offset,
                log_end_offset: high_watermark,
            });
        }
        if offset <= self.log_start_offset {
            return Ok(self.log_start_offset);
        }
        self.set_log_start_offset(offset).await?;
        let closed = self.segments.len().saturating_sub(1);
        let doomed: Vec<i64> = self
            .segments
            .values()
            .take(closed)
            .take_while(|s| s.next_offset() <= offset)
            .map(Segment::base_offset)
            .collect();
        for base in doomed {
            if let Some(segment) = self.segments.remove(&base) {
                segment.delete().await?;
            }
        }
        Ok(self.log_start_offset)
    }

    async fn set_log_start_offset(&mut self, offset: i64) -> Result<()> {
        if offset <= self.log_start_offset {
            return Ok(());
        }
        self.write_checkpoint(LOG_START_OFFSET_FILE, offset).await?;
        self.log_start_offset = offset;
        self.cache.truncate_front(self.cache_id, offset);
        // In memory only (Kafka since KAFKA-15046 flushes this one in the
        // background): a file that still names epochs below the start is cut
        // the same way when the log opens, from the start checkpointed above,
        // and the next persist for another reason writes it. Syncing it here
        // cost every retention pass two more syncs under the write lock.
        self.epochs.truncate_from_start(offset);
        Ok(())
    }

    /// The cleaner's first dirty offset (below it the log is compacted).
    pub fn first_dirty_offset(&self) -> i64 {
        self.first_dirty_offset
            .clamp(self.log_start_offset, self.log_end_offset)
    }

    /// What a cleaning of this log would cover at `now_ms` (see `cleaner`), or
    /// `None` when the log is not compacted or nothing is cleanable: only closed
    /// segments wholly below the high watermark, the active segment, and the first
    /// segment holding a record younger than `min.compaction.lag.ms`.
    pub fn clean_plan(&self, now_ms: i64, high_watermark: i64) -> Option<CleanPlan> {
        if !self.config.compact || self.closed || self.offline_reason().is_some() {
            return None;
        }
        let lag_ms = self.config.min_compaction_lag.as_millis() as i64;
        let closed = self.segments.len().saturating_sub(1);
        // Below the last stable offset only: an open transaction's records
        // may yet be aborted, and must not displace a committed value.
        let stable = self.last_stable_offset(high_watermark);
        let segments: Vec<SegmentSnapshot> = self
            .segments
            .values()
            .take(closed)
            .take_while(|s| s.next_offset() <= stable)
            .take_while(|s| lag_ms == 0 || s.max_timestamp() <= now_ms - lag_ms)
            .map(|s| SegmentSnapshot {
                base_offset: s.base_offset(),
                next_offset: s.next_offset(),
                size: s.size(),
                max_timestamp: s.max_timestamp(),
                file: s.file().clone(),
                path: s.log_path(),
            })
            .collect();
        let first_dirty = self.first_dirty_offset();
        let (mut clean_bytes, mut dirty_bytes) = (0u64, 0u64);
        for s in &segments {
            if s.next_offset <= first_dirty {
                clean_bytes += s.size;
            } else {
                dirty_bytes += s.size;
            }
        }
        if segments.is_empty() || dirty_bytes == 0 && self.tombstone_horizon.is_none() {
            return None;
        }
        let dirty_ratio = dirty_bytes as f64 / (clean_bytes + dirty_bytes).max(1) as f64;
        let overdue = self.config.max_compaction_lag.is_some_and(|lag| {
            segments
                .iter()
                .find(|s| s.next_offset > first_dirty)
                .is_some_and(|s| {
                    s.max_timestamp >= 0 && now_ms - s.max_timestamp > lag.as_millis() as i64
                })
        });
        let horizon_passed = self.tombstone_horizon.is_some_and(|h| h <= now_ms);
        // Aborted transactions with records in the range (their markers may
        // lie past it: every index up to the stable end is read).
        let aborted = segments
            .first()
            .map(|s| self.aborted_transactions(s.base_offset, stable))
            .unwrap_or_default();
        Some(CleanPlan {
            dir: self.dir.clone(),
            aborted,
            segments,
            first_dirty,
            clean_bytes,
            dirty_bytes,
            dirty_ratio,
            must_clean: overdue || horizon_passed,
            config: self.config.clone(),
        })
    }

    /// Swaps cleaned data in for closed segments: `old` names each replaced
    /// segment by base offset and size, `new` is their cleaned replacement (None
    /// when nothing of them survives). Returns false, changing nothing, when any of
    /// them changed since the cleaner read it (retention, truncation, a close).
    ///
    /// On disk, crash-safe in this order: the cleaned file (already complete and
    /// synced) is renamed to `<base>-<end>.log.swap` and the directory synced (the
    /// commit point: recovery finishes the swap from here); the replaced segments'
    /// files go, index files first; the swap file becomes `<base>.log`; its indexes
    /// are written.
    pub async fn replace_segments(
        &mut self,
        old: &[(i64, u64)],
        new: Option<CleanedSegment>,
    ) -> Result<bool> {
        self.guarded(
            "a cleaner's swap of segments was cancelled part way",
            |log| log.replace_segments_to_its_end(old, new),
        )
        .await
    }

    /// The body of `replace_segments`, under its guard.
    async fn replace_segments_to_its_end(
        &mut self,
        old: &[(i64, u64)],
        new: Option<CleanedSegment>,
    ) -> Result<bool> {
        let unchanged = !self.closed
            && self.offline_reason().is_none()
            && old.iter().all(|&(base, size)| {
                self.segments
                    .get(&base)
                    .is_some_and(|s| !s.is_active() && s.size() == size)
            })
            && old
                .first()
                .is_some_and(|&(base, _)| new.as_ref().is_none_or(|n| n.base_offset == base));
        let group_end = old
            .last()
            .and_then(|(base, _)| self.segments.get(base))
            .map(Segment::next_offset);
        let (true, Some(group_end)) = (unchanged, group_end) else {
            if let Some(new) = new {
                fsutil::remove(&new.path).await?;
            }
            return Ok(false);
        };
        // The cleaner checkpoint's file says "the cleaner has worked on this
        // log" (`skiff-tools verify` then allows the gaps and short batches
        // compaction leaves), so it exists before the first swap commits: a
        // crash or an abandoned pass between a swap and `finish_cleaning`
        // leaves compacted segments whatever the checkpoint's offset.
        if !self.dir.join(CLEANER_CHECKPOINT_FILE).exists() {
            self.write_checkpoint(CLEANER_CHECKPOINT_FILE, self.first_dirty_offset)
                .await?;
        }
        let swap = new
            .as_ref()
            .map(|n| swap_path(&self.dir, n.base_offset, group_end));
        if let (Some(new), Some(swap)) = (&new, &swap) {
            std::fs::rename(&new.path, swap).map_err(|e| LogError::io("rename", swap, e))?;
            fsutil::sync_dir(&self.dir).await?;
        }
        // Committed: memory follows now, then the files (a failure below leaves a
        // state recovery completes). Cached copies of the replaced batches go, so
        // readers see the compacted log.
        self.cache.truncate_front(self.cache_id, group_end);
        // The cleaned segment's state indexes the aborted transactions whose
        // ABORT marker the cleaner kept (`cleaner::Pass::fill`).
        for &(base, _) in old {
            self.segments.remove(&base);
        }
        let new_segment =
            new.map(|n| Segment::from_state(&self.dir, n.base_offset, n.file, n.state));
        let new_base = new_segment.as_ref().map(Segment::base_offset);
        if let Some(segment) = new_segment {
            self.segments.insert(segment.base_offset(), segment);
        }
        for &(base, _) in old {
            remove_segment_files(
                &self.dir,
                base,
                &[INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX],
            )
            .await?;
            if Some(base) != new_base {
                remove_segment_files(&self.dir, base, &[LOG_SUFFIX]).await?;
            }
        }
        if let (Some(base), Some(swap)) = (new_base, swap) {
            let log = segment_path(&self.dir, base, LOG_SUFFIX);
            std::fs::rename(&swap, &log).map_err(|e| LogError::io("rename", &log, e))?;
            if let Some(segment) = self.segments.get(&base) {
                segment.write_indexes().await?;
            }
        }
        fsutil::sync_dir(&self.dir).await?;
        Ok(true)
    }

    /// Records a finished cleaning: offsets below `first_dirty` are compacted.
    pub async fn finish_cleaning(
        &mut self,
        first_dirty: i64,
        tombstone_horizon: Option<i64>,
    ) -> Result<()> {
        self.tombstone_horizon = tombstone_horizon;
        if first_dirty > self.first_dirty_offset && self.offline_reason().is_none() {
            self.write_checkpoint(CLEANER_CHECKPOINT_FILE, first_dirty)
                .await?;
            self.first_dirty_offset = first_dirty;
        }
        Ok(())
    }

    /// Flushes, closes the active segment (trimmed, indexes written) and
    /// checkpoints the recovery point: a clean stop.
    pub async fn close(mut self) -> Result<()> {
        self.shutdown().await
    }

    /// `close` for a log still reachable through shared handles: afterwards the
    /// active segment is closed and appends fail; reads still work.
    ///
    /// An offline log is left as it is (nothing can be flushed; its files are
    /// for recovery to settle at the next open): a quick stop, not an error.
    pub async fn shutdown(&mut self) -> Result<()> {
        self.shutdown_with_high_watermark(None).await
    }

    /// `shutdown` that also checkpoints the replicated high watermark `hw`.
    ///
    /// Like a roll (`roll`), a close syncs at once what it can: the active
    /// segment's data and indexes, the clean-close record, the recovery point
    /// and the high watermark (when they moved) are written and fdatasync'd
    /// together, then renamed, the indexes first, under one directory sync.
    pub async fn shutdown_with_high_watermark(&mut self, hw: Option<i64>) -> Result<()> {
        self.closed = true;
        if let Some(reason) = self.offline_reason() {
            tracing::warn!(
                dir = %self.dir.display(), %reason,
                "closing an offline partition log: nothing flushed, recovery checks its tail at the next open"
            );
            self.cache.remove_log(self.cache_id);
            return Ok(());
        }
        let end = self.log_end_offset;
        let hw = hw
            .map(|hw| hw.min(end))
            .filter(|&hw| self.high_watermark_checkpoint != Some(hw));
        let recovery_point = self.recovery_point;
        let scan_bytes = self.config.clean_close_scan_bytes;
        let active = self.active();
        // (A segment ending an aborted transaction keeps the full close: its
        // `.txnindex` is what `skiff-tools verify` checks the markers against.)
        if active.size() <= scan_bytes
            && recovery_point >= active.base_offset()
            && active.txn_index().is_empty()
        {
            // The next open scans this segment whatever a close writes, and a
            // scan of it costs less than writing its indexes, the clean-close
            // record and the recovery point would (each a file's fdatasync;
            // 10,000 partitions closed with them took 60,000 syncs).
            let closed = active.close_active_unindexed().await;
            self.offline_on_error(closed)?;
            self.flushed_offset = end;
            if let Some(hw) = hw {
                self.checkpoint_high_watermark(hw).await?;
            }
            self.cache.remove_log(self.cache_id);
            return Ok(());
        }
        // What the next open may load from the indexes written below instead
        // of scanning the segment (`CLEAN_SHUTDOWN_FILE`); the close trims the
        // file to the size recorded.
        let clean = recovery::CleanShutdown {
            base: active.base_offset(),
            size: active.size(),
            next_offset: end,
        };
        let mut files = vec![(self.dir.join(CLEAN_SHUTDOWN_FILE), clean.encode())];
        if recovery_point != end || recovery_point == 0 {
            let point = recovery::encode_offset_checkpoint(&self.topic, self.partition, end);
            files.push((self.dir.join(RECOVERY_POINT_FILE), point));
        }
        if let Some(hw) = hw {
            let hw = recovery::encode_offset_checkpoint(&self.topic, self.partition, hw);
            files.push((self.dir.join(HIGH_WATERMARK_FILE), hw));
        }
        let (closed, written) = futures_util::future::join(
            self.active().close_active_unsynced(),
            fsutil::write_tmps(files),
        )
        .await;
        self.offline_on_error(closed)?;
        self.flushed_offset = end;
        fsutil::rename_all(written?).await?;
        fsutil::sync_dir(&self.dir).await?;
        self.recovery_point = end;
        if hw.is_some() {
            self.high_watermark_checkpoint = hw;
        }
        self.cache.remove_log(self.cache_id);
        Ok(())
    }

    /// DMA memory the active segment holds for appends: at most one block
    /// once everything appended is written out (every commit does).
    pub fn append_buffer_bytes(&self) -> usize {
        self.segments
            .values()
            .next_back()
            .map_or(0, Segment::buffered_bytes)
    }

    /// Deletes the log and its directory.
    /// Deletes the whole log: its directory is renamed out of the way at
    /// once and freed by the core's trash task (`trash`).
    pub async fn delete(mut self) -> Result<()> {
        self.cache.remove_log(self.cache_id);
        // The segments' files closed before the rename.
        drop(std::mem::take(&mut self.segments));
        crate::trash::delete_dir(&self.dir).await
    }
}

/// A whole stored batch passes the read path's checks: its header's
/// (`check_stored_header`) and its CRC-32C.
fn stored_batch_ok(
    header: &BatchHeader,
    bytes: &[u8],
    expected: i64,
    segment_next_offset: i64,
) -> bool {
    check_stored_header(header, expected, segment_next_offset).is_ok()
        && batch::crc_matches(bytes).is_ok()
}

/// The checks a stored batch's header must pass beyond parsing, for the
/// fields the CRC does not cover: its offsets go forward from `expected` (the
/// previous batch's next offset, or the segment's base offset) and end
/// before the segment's next offset.
fn check_stored_header(
    header: &BatchHeader,
    expected: i64,
    segment_next_offset: i64,
) -> std::result::Result<(), String> {
    if header.base_offset < expected {
        return Err(format!(
            "base offset {} goes backwards (expected at least {expected})",
            header.base_offset
        ));
    }
    if header.last_offset_delta < 0 || header.last_offset() >= segment_next_offset {
        return Err(format!(
            "offsets {}..={} do not fit the segment, which ends before {segment_next_offset}",
            header.base_offset,
            header.last_offset()
        ));
    }
    Ok(())
}
