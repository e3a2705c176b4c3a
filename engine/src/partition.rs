//! A partition as a core serves it: the log behind a core-local async lock, plus
//! group-committed flushing.
//!
//! Appends hold the lock only while the batch is copied into the segment buffer.
//! Under `Durability::FlushBeforeAck` the append then waits for a flush that covers
//! it; while one `fdatasync` runs, every append that arrives waits for the next
//! one, so N concurrent appends cost about two syncs, not N. Reads that hit the
//! batch cache take the lock shared; cache misses read the disk under it.
//!
//! The lock is a glommio (single-thread) lock: nothing here is shared across cores.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use bytes::BytesMut;
use glommio::sync::RwLock;

use crate::config::Durability;
use crate::error::{LogError, Result};
use crate::log::{AppendInfo, AppendMode, PartitionLog, ReadBatches};
use crate::stats::{self, ShardStats};

/// Where ListOffsets looks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffsetQuery {
    Earliest,
    Latest,
    Timestamp(i64),
}

pub struct Partition {
    log: RwLock<PartitionLog>,
    durability: Durability,
    flushed_offset: Cell<i64>,
    /// Offsets below this were written to the file by a commit (O_DIRECT
    /// writes completed, not necessarily synced): `Durability::Interval`'s
    /// acknowledgements wait for it.
    written_offset: Cell<i64>,
    /// Mirror of the log's end offset, readable without the lock.
    log_end_offset: Cell<i64>,
    /// The group commits in flight (see `commit_to`).
    commits: CommitsInFlight,
    /// Notified when a commit leaves its write phase or ends.
    flush_done: Signal,
    /// Notified after every append and flush: long-polling fetches wait on it.
    changed: Signal,
    /// Set by replication (the node): the high watermark agreed by the in-sync
    /// replicas. None: a partition nobody replicates, whose high watermark is
    /// its own durable end.
    replicated_hw: Cell<Option<i64>>,
    /// The replicated high watermark found on disk at open.
    checkpointed_hw: Option<i64>,
    /// The owning core's counters (fdatasync count and latency).
    stats: Rc<ShardStats>,
    /// Bumped by every truncation: a producer snapshot prepared before one
    /// is not written (`write_producer_snapshot`).
    truncations: Cell<u64>,
    /// The last truncations (number, lowest offset it removed): a commit waiting on
    /// records a cut took fails instead of waiting for offsets refilled by
    /// other records (`commit_to`).
    cuts: RefCell<VecDeque<(u64, i64)>>,
    /// Mirror of `PartitionLog::has_transactions` (it never goes back to
    /// false): a log that never held a transaction answers the LSO and the
    /// aborted transactions without taking the lock, on every fetch.
    has_transactions: Cell<bool>,
}

/// A partition log's size and state, for metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogStats {
    pub segments: usize,
    pub size_bytes: u64,
    /// Segment files retention removed, kept for reuse (recycling).
    pub free_bytes: u64,
    pub log_start_offset: i64,
    pub log_end_offset: i64,
    /// Why the partition is offline; None while it serves.
    pub offline: Option<String>,
    /// Transactions: None for a log that never held one; else the open
    /// transactions and how far the last stable offset trails the high
    /// watermark (records read_committed readers wait for).
    pub transactions: Option<TxnStats>,
}

/// A transactional log's state for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TxnStats {
    pub open: usize,
    pub lso_lag: i64,
}

impl Partition {
    pub fn new(log: PartitionLog) -> Partition {
        let checkpointed_hw = log.high_watermark_checkpoint();
        let durability = log.config().durability;
        let flushed = log.flushed_offset();
        let end = log.log_end_offset();
        let has_transactions = log.has_transactions();
        Partition {
            log: RwLock::new(log),
            durability,
            flushed_offset: Cell::new(flushed),
            written_offset: Cell::new(flushed),
            log_end_offset: Cell::new(end),
            commits: CommitsInFlight::default(),
            flush_done: Signal::default(),
            changed: Signal::default(),
            replicated_hw: Cell::new(None),
            checkpointed_hw,
            // Built on the core that owns it: that core's stats.
            stats: stats::local(),
            truncations: Cell::new(0),
            cuts: RefCell::new(VecDeque::new()),
            has_transactions: Cell::new(has_transactions),
        }
    }

    /// Size, segment count, offsets and offline state (a brief shared lock).
    pub async fn log_stats(&self) -> Result<LogStats> {
        let log = self.shared().await?;
        let transactions = log.has_transactions().then(|| {
            let hw = self.high_watermark();
            TxnStats {
                open: log.open_transactions().len(),
                lso_lag: hw - log.last_stable_offset(hw),
            }
        });
        Ok(LogStats {
            segments: log.segment_count(),
            size_bytes: log.size_bytes(),
            free_bytes: log.free_segment_bytes(),
            log_start_offset: log.log_start_offset(),
            log_end_offset: log.log_end_offset(),
            offline: log.offline_reason().map(str::to_string),
            transactions,
        })
    }

    /// Why the partition is offline (a failed write or fdatasync), or None.
    pub async fn offline_reason(&self) -> Result<Option<String>> {
        Ok(self.shared().await?.offline_reason().map(str::to_string))
    }

    /// `offline_reason` without waiting for the log: `None` while a writer
    /// holds it (a later call sees it). For periodic checks over every
    /// partition, which must not queue behind appends one by one.
    pub fn try_offline_reason(&self) -> Option<Option<String>> {
        self.log
            .try_read()
            .ok()
            .map(|log| log.offline_reason().map(str::to_string))
    }

    async fn write(&self) -> Result<glommio::sync::RwLockWriteGuard<'_, PartitionLog>> {
        self.log.write().await.map_err(|_| LogError::RuntimeStopped)
    }

    async fn shared(&self) -> Result<glommio::sync::RwLockReadGuard<'_, PartitionLog>> {
        self.log.read().await.map_err(|_| LogError::RuntimeStopped)
    }

    /// Appends and, under `FlushBeforeAck`, returns once the batch is durable.
    pub async fn append(&self, batch: BytesMut, mode: AppendMode) -> Result<AppendInfo> {
        let info = self.append_buffered(batch, mode).await?;
        self.await_durable(&info).await?;
        Ok(info)
    }

    /// The first half of `append`: offsets assigned and the batch in the segment
    /// buffer, not yet durable. Callers that must order work around the offset
    /// assignment (idempotent producers) use this, then `await_durable`.
    pub async fn append_buffered(&self, batch: BytesMut, mode: AppendMode) -> Result<AppendInfo> {
        let info = {
            let mut log = self.write().await?;
            let info = log.append(batch, mode).await?;
            if log.has_transactions() {
                self.has_transactions.set(true);
                // What the high watermark made stable is forgotten here, so
                // the tracker holds only the undecided and the unreplicated.
                log.on_high_watermark(self.high_watermark());
            }
            info
        };
        self.log_end_offset.set(info.last_offset + 1);
        self.changed.notify_all();
        Ok(info)
    }

    /// The second half of `append`: waits for the flush the durability policy asks
    /// for before an acknowledgement.
    pub async fn await_durable(&self, info: &AppendInfo) -> Result<()> {
        // Called as the append returns, before anything else runs here.
        self.await_durable_to(info.last_offset + 1, self.truncations())
            .await
    }

    /// Waits until every offset below `end_offset` is as durable as the policy
    /// asks before an acknowledgement: fdatasync'd under `FlushBeforeAck`;
    /// under `Interval` written to the file (its O_DIRECT writes completed),
    /// so a process crash loses nothing acknowledged, as with Kafka's page
    /// cache; the interval's fdatasync covers a power loss.
    ///
    /// `appended_at` is `truncations()` read as the append returned (before
    /// any await): it tells these records from others a truncation let take
    /// their offsets, for which this fails with `CutBeforeDurable`.
    pub async fn await_durable_to(&self, end_offset: i64, appended_at: u64) -> Result<()> {
        let commit = match self.durability {
            Durability::FlushBeforeAck => Commit::Sync,
            Durability::Interval(_) => Commit::Write,
        };
        self.commit_to(end_offset, commit, appended_at).await
    }

    pub async fn read(
        &self,
        offset: i64,
        max_bytes: usize,
        upper_bound: i64,
    ) -> Result<ReadBatches> {
        {
            let log = self.shared().await?;
            if let Some(hit) = log.read_cached(offset, max_bytes, upper_bound) {
                return Ok(hit);
            }
        }
        self.write()
            .await?
            .read(offset, max_bytes, upper_bound)
            .await
    }

    /// `PartitionLog::check_appendable`, under the read lock.
    pub async fn check_appendable(&self, mode: AppendMode) -> Result<()> {
        self.shared().await?.check_appendable(mode)
    }

    /// One step of the scrubber (`PartitionLog::scrub`), under the write lock
    /// as a read from disk is.
    pub async fn scrub(&self, max_bytes: usize) -> Result<crate::log::ScrubStep> {
        self.write().await?.scrub(max_bytes).await
    }

    pub async fn list_offset(&self, query: OffsetQuery) -> Result<Option<(i64, i64)>> {
        match query {
            OffsetQuery::Earliest => Ok(Some((self.shared().await?.log_start_offset(), -1))),
            OffsetQuery::Latest => Ok(Some((self.shared().await?.log_end_offset(), -1))),
            OffsetQuery::Timestamp(ts) => self.write().await?.offset_for_timestamp(ts).await,
        }
    }

    pub async fn log_end_offset(&self) -> Result<i64> {
        Ok(self.shared().await?.log_end_offset())
    }

    pub async fn log_start_offset(&self) -> Result<i64> {
        Ok(self.shared().await?.log_start_offset())
    }

    pub fn flushed_offset(&self) -> i64 {
        self.flushed_offset.get()
    }

    pub fn durability(&self) -> Durability {
        self.durability
    }

    /// The offset below which data is acknowledged-safe on this replica (the high
    /// watermark consumers read up to): the flushed offset under
    /// `FlushBeforeAck`, the written offset under `Interval`.
    pub fn high_watermark(&self) -> i64 {
        let local = self.durable_end();
        match self.replicated_hw.get() {
            Some(hw) => hw.min(local),
            None => local,
        }
    }

    /// The end of what this replica may count as its own (what a follower
    /// reports, and what the leader counts for itself): the flushed offset
    /// under `FlushBeforeAck`; under `Interval` what is written to the file
    /// (a consumer never reads a record a process crash could take back).
    pub fn durable_end(&self) -> i64 {
        match self.durability {
            Durability::FlushBeforeAck => self.flushed_offset.get(),
            Durability::Interval(_) => self.written_end(),
        }
    }

    /// Offsets below this are in the file (written out, perhaps not synced).
    pub fn written_end(&self) -> i64 {
        self.written_offset.get().max(self.flushed_offset.get())
    }

    /// The log end offset (next offset to be written), without the lock.
    pub fn log_end(&self) -> i64 {
        self.log_end_offset.get()
    }

    /// The last stable offset: what a read_committed consumer may read below
    /// (the high watermark, or the first offset of an undecided transaction
    /// under it; `PartitionLog::last_stable_offset`). A brief shared lock.
    pub async fn last_stable_offset(&self) -> Result<i64> {
        let hw = self.high_watermark();
        if !self.has_transactions.get() {
            return Ok(hw);
        }
        Ok(self.shared().await?.last_stable_offset(hw))
    }

    /// The aborted transactions overlapping `[from, bound)`, for a
    /// read_committed fetch (`PartitionLog::aborted_transactions`).
    pub async fn aborted_transactions(
        &self,
        from: i64,
        bound: i64,
    ) -> Result<Vec<crate::segment::txn_index::AbortedTxn>> {
        if !self.has_transactions.get() {
            return Ok(Vec::new());
        }
        Ok(self.shared().await?.aborted_transactions(from, bound))
    }

    /// The high watermark replication set (None: not replicated).
    pub fn replicated_high_watermark(&self) -> Option<i64> {
        self.replicated_hw.get()
    }

    /// Replication sets the high watermark the replicas agreed on (None: the
    /// partition's own durable end again). Long polls waiting on it wake.
    pub fn set_replicated_high_watermark(&self, hw: Option<i64>) {
        if self.replicated_hw.get() != hw {
            self.replicated_hw.set(hw);
            self.changed.notify_all();
        }
    }

    /// OffsetsForLeaderEpoch: the largest epoch <= `epoch` this log knows and
    /// its end offset (the next epoch's start, or the log end). None when the
    /// log knows no epoch that old.
    pub async fn end_offset_for_epoch(&self, epoch: i32) -> Result<Option<(i32, i64)>> {
        let log = self.shared().await?;
        Ok(log
            .leader_epochs()
            .end_offset_for(epoch, log.log_end_offset()))
    }

    /// OffsetsForLeaderEpoch for `epoch` (Kafka's rules, see
    /// `LeaderEpochCache::kafka_end_offset_for`): (epoch, end offset).
    pub async fn epoch_end_offset(&self, epoch: i32) -> Result<(i32, i64)> {
        let log = self.shared().await?;
        Ok(log
            .leader_epochs()
            .kafka_end_offset_for(epoch, log.log_end_offset()))
    }

    /// A new leadership at `leader_epoch` starts at the log end
    /// (`PartitionLog::assign_leader_epoch`); returns that offset.
    pub async fn assign_leader_epoch(&self, leader_epoch: i32) -> Result<i64> {
        self.write().await?.assign_leader_epoch(leader_epoch)
    }

    /// Refuses leader appends below `epoch` from now on
    /// (`PartitionLog::fence_leader_appends`): taken under the write lock, so
    /// an append that already holds it finishes first and none admitted
    /// before the call lands after it.
    pub async fn fence_leader_appends(&self, epoch: i32) -> Result<()> {
        self.write().await?.fence_leader_appends(epoch);
        Ok(())
    }

    /// The log's start and end offsets and its latest epoch, read together
    /// under one lock (a follower's fetch position).
    pub async fn epoch_position(&self) -> Result<(i64, i64, Option<i32>)> {
        let log = self.shared().await?;
        Ok((
            log.log_start_offset(),
            log.log_end_offset(),
            log.leader_epochs().latest_epoch(),
        ))
    }

    /// The leader epoch the record at `offset` was written in (-1: unknown).
    pub async fn epoch_at(&self, offset: i64) -> Result<i32> {
        Ok(self
            .shared()
            .await?
            .leader_epochs()
            .epoch_at(offset)
            .unwrap_or(-1))
    }

    /// The leader-epoch history: (epoch, start offset), ascending.
    pub async fn epoch_entries(&self) -> Result<Vec<(i32, i64)>> {
        Ok(self
            .shared()
            .await?
            .leader_epochs()
            .entries()
            .iter()
            .map(|e| (e.epoch, e.start_offset))
            .collect())
    }

    /// The latest leader epoch written to this log (None: empty history).
    pub async fn latest_epoch(&self) -> Result<Option<i32>> {
        Ok(self.shared().await?.leader_epochs().latest_epoch())
    }

    /// Whether what a long poll waits on has passed `seen`.
    fn passed(&self, what: LongPoll, seen: i64) -> bool {
        match what {
            LongPoll::HighWatermark => self.high_watermark() > seen,
            LongPoll::LogEnd => self.log_end_offset.get() > seen,
        }
    }

    /// Long polls waiting on this partition now (each holds one waker).
    pub fn long_poll_waiters(&self) -> usize {
        self.changed.waiters()
    }

    /// Applies new settings (topic config changes); they take effect from the next
    /// append (a new `segment.bytes` at the next roll check).
    pub async fn update_config(&self, config: crate::config::LogConfig) -> Result<()> {
        self.write().await?.set_config(config);
        Ok(())
    }

    pub async fn truncate_to(&self, offset: i64) -> Result<()> {
        let mut log = self.write().await?;
        self.truncations.set(self.truncations.get() + 1);
        let cut = log.truncate_to(offset).await;
        self.after_cut(&log, log.log_end_offset());
        cut
    }

    /// Repairs a log offline for a corrupt batch read from disk
    /// (`PartitionLog::repair_corruption`: cut before it, serving again).
    /// Returns the new log end, or None when the log is not corrupt.
    pub async fn repair_corruption(&self) -> Result<Option<i64>> {
        let mut log = self.write().await?;
        if log.corruption().is_none() {
            return Ok(None);
        }
        self.truncations.set(self.truncations.get() + 1);
        let repaired = log.repair_corruption().await;
        self.after_cut(&log, log.log_end_offset());
        drop(log);
        self.changed.notify_all();
        repaired
    }

    /// The corrupt batch that took the log offline, if one did.
    pub async fn corruption(&self) -> Result<Option<crate::error::Corruption>> {
        Ok(self.shared().await?.corruption().cloned())
    }

    /// After a truncation (counted in `truncations` before it began): the
    /// cached flushed and end offsets follow the log's, and the cut is
    /// remembered for the commits waiting on records it may have taken
    /// (`cut_below`): `removed_from` is the lowest offset it may have
    /// removed (the new end; `i64::MIN` when the whole log went).
    fn after_cut(&self, log: &PartitionLog, removed_from: i64) {
        let end = log.log_end_offset();
        self.flushed_offset.set(log.flushed_offset());
        self.log_end_offset.set(end);
        // A cut log keeps nothing written above its new end.
        self.written_offset.set(self.written_offset.get().min(end));
        let mut cuts = self.cuts.borrow_mut();
        if cuts.len() == CUTS_KEPT {
            cuts.pop_front();
        }
        cuts.push_back((self.truncations.get(), removed_from.min(end)));
    }

    /// Whether a truncation after the `since`-th cut the log below `offset`
    /// (true too when the cuts since then are no longer all kept). Every
    /// truncation is recorded in turn, so an oldest kept past `since + 1`
    /// means some were dropped.
    fn cut_below(&self, since: u64, offset: i64) -> bool {
        let cuts = self.cuts.borrow();
        cuts.front().is_some_and(|(n, _)| *n > since + 1)
            || cuts.iter().any(|(n, from)| *n > since && *from < offset)
    }

    /// Deletes every segment and starts the log over, empty, at `offset`
    /// (`PartitionLog::truncate_fully_and_start_at`, crash-safe). The high
    /// watermark, if replication set one, becomes `offset` too.
    pub async fn truncate_fully_and_start_at(&self, offset: i64) -> Result<()> {
        let mut log = self.write().await?;
        self.truncations.set(self.truncations.get() + 1);
        let restarted = log.truncate_fully_and_start_at(offset).await;
        self.after_cut(&log, i64::MIN);
        restarted?;
        if self.replicated_hw.get().is_some() {
            self.replicated_hw.set(Some(offset));
        }
        drop(log);
        self.changed.notify_all();
        Ok(())
    }

    /// Waits until every offset below `offset` is durable, joining a running flush
    /// or starting one.
    pub async fn flush_to(&self, offset: i64) -> Result<()> {
        self.commit_to(offset, Commit::Sync, self.truncations.get())
            .await
    }

    /// Waits until every offset below `offset` is written out (`Commit::Write`)
    /// or also fdatasync'd (`Commit::Sync`), joining a commit in flight that
    /// covers it or starting one. Commits are pipelined: one at a time in its
    /// write phase (submitting the partial chunk, awaiting the writes), and
    /// the next may start while earlier ones wait for their fdatasync (up to
    /// `MAX_SYNCING`), so records appended during a sync need not wait for it
    /// before their own writes and sync begin. A sync covers a write.
    /// `since`: the truncation count when the records were appended.
    async fn commit_to(&self, offset: i64, commit: Commit, since: u64) -> Result<()> {
        loop {
            // Those records are gone (the log ends before them, or a cut
            // since this wait began went below them): no commit can make
            // them durable, and a later append at the same offsets is not
            // them. Waiting on would also spin a commit per turn.
            if offset > self.log_end_offset.get()
                || (self.truncations.get() != since && self.cut_below(since, offset))
            {
                return Err(LogError::CutBeforeDurable { offset });
            }
            let done = match commit {
                Commit::Sync => self.flushed_offset.get(),
                Commit::Write => self.written_end(),
            };
            if done >= offset {
                return Ok(());
            }
            if !self.commits.may_start(offset) {
                self.flush_done.wait().await;
                continue;
            }
            // Whatever ends this commit (done, failed, or this future dropped
            // half-way) ends it for the waiters too: they retry or see the error.
            let mut running = CommitRunning::start(self);
            let result = self.flush_once(commit, &mut running).await;
            drop(running);
            result?;
        }
    }

    /// One group commit: the partial chunk submitted under the lock; the
    /// writes awaited and the fdatasync done outside it, so appends go on
    /// filling the next chunk (and its writes go out) while this one
    /// completes. Holding the lock through the writes drained the disk's
    /// queue at every flush.
    /// Everything below the commit's target was written by the writes it
    /// awaits or by earlier commits' (done before this one's write phase
    /// began), so its fdatasync covers the target even when an earlier
    /// commit's sync is still in flight; `mark_flushed` only moves forward.
    async fn flush_once(&self, commit: Commit, running: &mut CommitRunning<'_>) -> Result<()> {
        let truncations = self.truncations.get();
        let (file, target, writes) = {
            let mut log = self.write().await?;
            let (target, writes) = log.start_write_out().await?;
            (log.active_file(), target, writes)
        };
        running.covers(target);
        for w in writes {
            if let Err(e) = w.wait().await {
                // The appender reaps the failed write itself, so the log goes
                // offline with its explained reason (a short write's cause:
                // ENOSPC, EFBIG), not only a byte count.
                let mut log = self.write().await?;
                log.write_out().await?;
                let reason = format!("write failed: {e}");
                log.poison(&reason);
                return Err(LogError::Offline(reason));
            }
        }
        if self.truncations.get() != truncations {
            // The log was cut while the writes ran: `target` may name offsets
            // appended since, which these writes did not carry. The waiters
            // look again and start another commit.
            return Ok(());
        }
        self.written_offset
            .set(self.written_offset.get().max(target));
        if commit == Commit::Write {
            return Ok(());
        }
        running.syncing();
        let started = Instant::now();
        let synced = file.fdatasync().await;
        self.stats.record_fsync(started.elapsed(), synced.is_ok());
        match synced {
            Ok(()) => {
                let mut log = self.write().await?;
                if self.truncations.get() != truncations {
                    return Ok(());
                }
                log.mark_flushed(target)?;
                self.flushed_offset.set(log.flushed_offset());
                Ok(())
            }
            Err(e) => {
                let reason = format!("fdatasync failed: {e}");
                self.write().await?.poison(&reason);
                Err(LogError::Offline(reason))
            }
        }
    }

    /// One retention pass at `now_ms`, below the high watermark.
    pub async fn apply_retention(&self, now_ms: i64) -> Result<crate::log::RetentionOutcome> {
        let high_watermark = self.high_watermark();
        self.write()
            .await?
            .apply_retention(now_ms, high_watermark)
            .await
    }

    /// What a cleaning would cover now (None: not compacted, or nothing closed
    /// below the high watermark). A brief shared lock.
    pub async fn clean_plan(&self, now_ms: i64) -> Result<Option<crate::cleaner::CleanPlan>> {
        let high_watermark = self.high_watermark();
        Ok(self.shared().await?.clean_plan(now_ms, high_watermark))
    }

    /// The cleaner's swap: the only part of a cleaning under the write lock.
    pub async fn replace_segments(
        &self,
        old: &[(i64, u64)],
        new: Option<crate::cleaner::CleanedSegment>,
    ) -> Result<bool> {
        self.write().await?.replace_segments(old, new).await
    }

    pub async fn finish_cleaning(&self, first_dirty: i64, horizon: Option<i64>) -> Result<()> {
        self.write()
            .await?
            .finish_cleaning(first_dirty, horizon)
            .await
    }

    /// The cleaner's checkpoint (offsets below it are compacted).
    pub async fn first_dirty_offset(&self) -> Result<i64> {
        Ok(self.shared().await?.first_dirty_offset())
    }

    /// DeleteRecords up to `offset` (-1: the high watermark).
    pub async fn delete_records(&self, offset: i64) -> Result<i64> {
        let high_watermark = self.high_watermark();
        let offset = if offset == -1 { high_watermark } else { offset };
        self.write()
            .await?
            .delete_records(offset, high_watermark)
            .await
    }

    /// How many truncations this partition has seen since it opened (read it
    /// when taking the state a producer snapshot will describe).
    pub fn truncations(&self) -> u64 {
        self.truncations.get()
    }

    /// Writes a producer snapshot for the log below `offset` (see
    /// `PartitionLog::write_producer_snapshot`) unless the partition was
    /// truncated since `truncations` was read: then the state it describes may
    /// include records that are gone, and `Ok(false)` is answered. Under the
    /// write lock, so a truncation cannot run between the check and the
    /// write (and one after it deletes the file).
    pub async fn write_producer_snapshot(
        &self,
        offset: i64,
        body: &[u8],
        truncations: u64,
    ) -> Result<bool> {
        let mut log = self.write().await?;
        if self.truncations.get() != truncations {
            return Ok(false);
        }
        log.write_producer_snapshot(offset, body).await?;
        Ok(true)
    }

    /// The newest valid producer snapshot at or below the log end.
    pub async fn latest_producer_snapshot(&self) -> Result<Option<(i64, bytes::Bytes)>> {
        self.shared().await?.latest_producer_snapshot().await
    }

    /// Persists the flushed offset as the recovery point (periodic, cheap when
    /// nothing changed).
    pub async fn checkpoint(&self) -> Result<()> {
        let mut log = self.write().await?;
        log.checkpoint_recovery_point().await?;
        if let Some(hw) = self.replicated_hw.get() {
            log.checkpoint_high_watermark(hw).await?;
        }
        Ok(())
    }

    /// The replicated high watermark the log had on disk when it opened.
    pub fn checkpointed_high_watermark(&self) -> Option<i64> {
        self.checkpointed_hw
    }

    /// Flushes and closes the log (clean stop). Later appends fail.
    pub async fn close(&self) -> Result<()> {
        let mut log = self.write().await?;
        log.shutdown_with_high_watermark(self.replicated_hw.get())
            .await
    }

    pub async fn delete(self) -> Result<()> {
        let log = self
            .log
            .into_inner()
            .map_err(|_| LogError::RuntimeStopped)?;
        log.delete().await
    }
}

/// What a long poll waits to pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LongPoll {
    /// A consumer's fetch: the high watermark.
    HighWatermark,
    /// A follower's fetch: the log end (followers read past the high watermark).
    LogEnd,
}

/// Waits until any of `partitions` passes the offset its reader saw, or
/// `timeout` elapses: the long poll of one fetch over every partition it
/// reads on this core, one task however many partitions. Re-checks after
/// every append, flush and high watermark change of any of them; the check
/// and the registration for a wake-up happen with no await between them, so
/// a change that lands in between is not missed.
pub async fn wait_for_any(
    partitions: &[(Rc<Partition>, i64)],
    what: LongPoll,
    timeout: std::time::Duration,
) {
    let deadline = Instant::now() + timeout;
    loop {
        let changed: Vec<SignalWait<'_>> =
            partitions.iter().map(|(p, _)| p.changed.wait()).collect();
        if partitions.iter().any(|(p, seen)| p.passed(what, *seen)) {
            return;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        let sleep = std::pin::pin!(glommio::timer::sleep(left));
        if changed.is_empty() {
            sleep.await;
            return;
        }
        futures_util::future::select(futures_util::future::select_all(changed), sleep).await;
    }
}

/// Truncations `Partition::cuts` remembers.
const CUTS_KEPT: usize = 8;

/// How far a group commit goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Commit {
    /// The appended bytes written to the file (a process crash keeps them).
    Write,
    /// Written and fdatasync'd (a power loss keeps them).
    Sync,
}

/// fdatasyncs of one partition's commits in flight at once, at most.
const MAX_SYNCING: u32 = 2;

/// A partition's group commits in flight.
#[derive(Default)]
struct CommitsInFlight {
    /// A commit is in its write phase (at most one).
    writing: Cell<bool>,
    /// Commits past their writes, waiting for their fdatasync.
    syncing: Cell<u32>,
    /// The highest target of a commit in flight that has one (its writes
    /// submitted); meaningful while any commit is in flight.
    covers: Cell<i64>,
}

impl CommitsInFlight {
    fn live(&self) -> bool {
        self.writing.get() || self.syncing.get() > 0
    }

    /// Whether a waiter for `offset` starts a commit now: none in flight
    /// covers it, none is in its write phase (it may cover it: its target is
    /// known once its writes are submitted), and a sync slot is free.
    fn may_start(&self, offset: i64) -> bool {
        let covered = self.live() && self.covers.get() >= offset;
        !covered && !self.writing.get() && self.syncing.get() < MAX_SYNCING
    }
}

/// One running group commit: registered in `CommitsInFlight` while it lives;
/// dropping it (after the commit, or with its future cancelled mid-way)
/// removes it and wakes every waiter, so none waits on a commit nobody runs.
struct CommitRunning<'a> {
    partition: &'a Partition,
    syncing: bool,
}

impl<'a> CommitRunning<'a> {
    fn start(partition: &'a Partition) -> Self {
        let commits = &partition.commits;
        if !commits.live() {
            commits.covers.set(i64::MIN);
        }
        commits.writing.set(true);
        CommitRunning {
            partition,
            syncing: false,
        }
    }

    fn covers(&self, target: i64) {
        let covers = &self.partition.commits.covers;
        covers.set(covers.get().max(target));
    }

    /// The writes are done: the next commit may start while this one syncs.
    fn syncing(&mut self) {
        let commits = &self.partition.commits;
        commits.writing.set(false);
        commits.syncing.set(commits.syncing.get() + 1);
        self.syncing = true;
        self.partition.flush_done.notify_all();
    }
}

impl Drop for CommitRunning<'_> {
    fn drop(&mut self) {
        let commits = &self.partition.commits;
        if self.syncing {
            commits.syncing.set(commits.syncing.get() - 1);
        } else {
            commits.writing.set(false);
        }
        self.partition.flush_done.notify_all();
        self.partition.changed.notify_all();
    }
}

/// Wakes every waiter once per `notify_all`: a single-threaded condition
/// variable. Each wait holds at most one registered waker, replaced when it is
/// polled again and removed when the wait is dropped: a long poll that times
/// out on an idle partition leaves nothing behind (a kept waker would also keep
/// its finished task's memory alive until the partition next changed).
#[derive(Default)]
pub(crate) struct Signal {
    generation: Cell<u64>,
    next_key: Cell<u64>,
    waiters: RefCell<HashMap<u64, Waker>>,
}

impl Signal {
    pub(crate) fn wait(&self) -> SignalWait<'_> {
        SignalWait {
            signal: self,
            generation: self.generation.get(),
            key: None,
        }
    }

    pub(crate) fn notify_all(&self) {
        self.generation.set(self.generation.get() + 1);
        let woken = std::mem::take(&mut *self.waiters.borrow_mut());
        for (_, w) in woken {
            w.wake();
        }
    }

    fn waiters(&self) -> usize {
        self.waiters.borrow().len()
    }
}

pub(crate) struct SignalWait<'a> {
    signal: &'a Signal,
    generation: u64,
    /// This wait's entry in `waiters` once it has been polled.
    key: Option<u64>,
}

impl Future for SignalWait<'_> {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.signal.generation.get() != self.generation {
            return Poll::Ready(());
        }
        let key = match self.key {
            Some(key) => key,
            None => {
                let key = self.signal.next_key.get();
                self.signal.next_key.set(key + 1);
                self.key = Some(key);
                key
            }
        };
        let mut waiters = self.signal.waiters.borrow_mut();
        match waiters.get_mut(&key) {
            Some(w) if w.will_wake(cx.waker()) => {}
            Some(w) => w.clone_from(cx.waker()),
            None => {
                waiters.insert(key, cx.waker().clone());
            }
        }
        Poll::Pending
    }
}

impl Drop for SignalWait<'_> {
    fn drop(&mut self) {
        if let Some(key) = self.key {
            self.signal.waiters.borrow_mut().remove(&key);
        }
    }
}
