//! One segment of a partition log: `<base offset, 20 digits>.log` with its
//! `.index` and `.timeindex` (formats in `index`); `txn_index` is the
//! `.txnindex` format (aborted transactions), not yet written by segments.
//!
//! The `.log` holds RecordBatch v2 bytes back to back, exactly as they travel on
//! the wire (base offset and partition leader epoch stamped by the leader). While a
//! segment is active its file is longer than its data (see `appender`); the
//! bytes after the data are zeros, or, in a recycled file, whatever the file held
//! before. A closed segment's file holds exactly its data.
//!
//! Recycling: a segment retention removes can be kept as `<bound>.log.free`
//! ([`Segment::retire`]) and become the file of a later segment of the same
//! partition ([`Segment::create`]), so appends overwrite blocks the file system
//! and the device already hold instead of converting fresh extents, and an
//! fdatasync writes no extent metadata (PostgreSQL's recycled WAL, ScyllaDB's
//! recycled commitlog). Safe with Kafka's format alone: every batch a pooled
//! file holds has offsets below its `bound` (the retired segment's next
//! offset; earlier generations' leftovers lie lower still), and it is reused
//! only for a segment based at or past the bound, so a leftover batch never has
//! the offset recovery expects next (offsets must not go backwards) and is
//! never taken for data. A recycled active segment has a `<base>.recycled`
//! marker until it closes, so recovery and `skiff-tools verify` call what
//! follows its data recycled space, not a torn write.

pub mod appender;
pub mod index;
pub mod scan;
pub mod txn_index;

use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Instant;

use bytes::Bytes;
use glommio::io::DmaFile;

use crate::batch::BatchHeader;
use crate::config::LogConfig;
use crate::error::{LogError, Result};
use crate::fsutil;
use appender::{Appender, Growth, Sizing};
use index::{OffsetIndex, TimeIndex};
use txn_index::TxnIndex;

pub const LOG_SUFFIX: &str = "log";
/// Size of the pieces a large segment read is split into (all in flight at once).
pub const READ_PIECE_BYTES: usize = 1 << 20;
pub const INDEX_SUFFIX: &str = "index";
pub const TIME_INDEX_SUFFIX: &str = "timeindex";
/// The aborted transaction index (`txn_index`): written with the other
/// indexes when a segment closes, only when it holds an entry.
pub const TXN_INDEX_SUFFIX: &str = "txnindex";
/// Marks an active segment whose file was recycled: past its data lie a
/// previous segment's bytes (see the module docs). Removed when it closes.
pub const RECYCLED_SUFFIX: &str = "recycled";
/// A retired segment file kept for reuse: `<bound, 20 digits>.log.free`, every
/// batch in it below `bound`.
pub const FREE_SUFFIX: &str = "log.free";
/// The files beside a segment's `.log`: removed before it, so a crash in
/// between leaves a whole segment or none (recovery lists segments by `.log`).
pub const SIDE_SUFFIXES: [&str; 4] = [
    INDEX_SUFFIX,
    TIME_INDEX_SUFFIX,
    TXN_INDEX_SUFFIX,
    RECYCLED_SUFFIX,
];

/// `dir/<base offset, 20 digits>.<suffix>`.
pub fn segment_path(dir: &Path, base_offset: i64, suffix: &str) -> PathBuf {
    dir.join(format!("{base_offset:020}.{suffix}"))
}

/// Where the cleaner writes the replacement of segments starting at `base_offset`
/// (`<base>.log.cleaned`); recovery deletes leftovers.
pub fn cleaned_path(dir: &Path, base_offset: i64) -> PathBuf {
    dir.join(format!("{base_offset:020}.{LOG_SUFFIX}.cleaned"))
}

/// A complete cleaned segment about to replace every segment whose base offset is
/// in `[base_offset, end_offset)`: `<base>-<end>.log.swap`. Its existence is the
/// commit point of a replacement; recovery finishes the swap (see `recovery`).
pub fn swap_path(dir: &Path, base_offset: i64, end_offset: i64) -> PathBuf {
    dir.join(format!(
        "{base_offset:020}-{end_offset:020}.{LOG_SUFFIX}.swap"
    ))
}

/// `(base, end)` of a swap file name made by [`swap_path`].
pub fn parse_swap_name(name: &str) -> Option<(i64, i64)> {
    let range = name.strip_suffix(".log.swap")?;
    let (base, end) = range.split_once('-')?;
    let digits = |s: &str| s.len() == 20 && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(base) || !digits(end) {
        return None;
    }
    Some((base.parse().ok()?, end.parse().ok()?))
}

/// Removes a segment's files (missing ones are fine).
pub async fn remove_segment_files(dir: &Path, base_offset: i64, suffixes: &[&str]) -> Result<()> {
    for suffix in suffixes {
        fsutil::remove(&segment_path(dir, base_offset, suffix)).await?;
    }
    Ok(())
}

/// `dir/<bound, 20 digits>.log.free`: a retired segment file kept for reuse.
pub fn free_path(dir: &Path, bound: i64) -> PathBuf {
    segment_path(dir, bound, FREE_SUFFIX)
}

/// The base offset named by a segment file name, if it is one of ours.
pub fn parse_segment_name(name: &str) -> Option<(i64, &str)> {
    let (stem, suffix) = name.split_once('.')?;
    if stem.len() != 20 || !stem.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((stem.parse().ok()?, suffix))
}

pub struct Segment {
    base_offset: i64,
    dir: PathBuf,
    file: Rc<DmaFile>,
    /// Present while this is the active segment.
    appender: Option<Appender>,
    state: SegmentState,
    /// When this segment became active, for `segment.ms`.
    opened_at: Instant,
}

/// What is known about a segment's contents: built by appends, or by recovery
/// scanning the file.
pub struct SegmentState {
    /// Bytes of batch data (the file may be longer while active).
    pub size: u64,
    /// The offset after the last batch; the base offset when empty.
    pub next_offset: i64,
    /// Largest batch max-timestamp in the segment, -1 when empty.
    pub max_timestamp: i64,
    pub offset_index: OffsetIndex,
    pub time_index: TimeIndex,
    pub bytes_since_index_entry: u64,
    /// The transactions whose ABORT marker lies in this segment: kept by the
    /// log as it appends (`PartitionLog`), loaded from `.txnindex` for a
    /// closed segment, rebuilt from the markers when recovery scans one.
    pub txn_index: TxnIndex,
}

impl SegmentState {
    pub fn empty(base_offset: i64) -> SegmentState {
        SegmentState {
            size: 0,
            next_offset: base_offset,
            max_timestamp: -1,
            offset_index: OffsetIndex::default(),
            time_index: TimeIndex::default(),
            bytes_since_index_entry: 0,
            txn_index: TxnIndex::default(),
        }
    }

    /// Records the batch at `position` (appends and recovery scans). Like Kafka,
    /// an offset-index entry names the batch's last offset, and one is added once
    /// `index_interval_bytes` of log went by without one.
    pub fn add_batch(
        &mut self,
        base_offset: i64,
        position: u64,
        header: &BatchHeader,
        index_interval_bytes: u64,
    ) {
        let rel_last = (header.last_offset() - base_offset) as u32;
        self.max_timestamp = self.max_timestamp.max(header.max_timestamp);
        if self.bytes_since_index_entry > index_interval_bytes {
            self.offset_index.push(rel_last, position as u32);
            self.time_index.maybe_push(self.max_timestamp, rel_last);
            self.bytes_since_index_entry = 0;
        }
        self.bytes_since_index_entry += header.total_len() as u64;
        self.next_offset = header.next_offset();
        self.size = position + header.total_len() as u64;
    }

    /// Completes the time index of a segment that takes no more batches: its last
    /// entry names the segment's largest timestamp, as Kafka's does on roll.
    pub fn seal(&mut self, base_offset: i64) {
        if self.next_offset > base_offset {
            let rel_last = (self.next_offset - 1 - base_offset) as u32;
            self.time_index.maybe_push(self.max_timestamp, rel_last);
        }
    }
}

impl Segment {
    /// Creates an empty active segment whose appender starts at `growth` (the
    /// previous segment's, at a roll). With `recycled` (a pooled file whose
    /// bound is at most `base_offset`), that file becomes the segment's: marked
    /// first, then renamed, both made durable by one sync of the directory.
    pub async fn create(
        dir: &Path,
        base_offset: i64,
        config: &LogConfig,
        growth: Growth,
        recycled: Option<&Path>,
    ) -> Result<Segment> {
        let segment = Segment::create_unsynced(dir, base_offset, config, growth, recycled).await?;
        fsutil::sync_dir(dir).await?;
        Ok(segment)
    }

    /// `create` without its directory sync, which the caller owes before
    /// anything durable may name the segment.
    pub async fn create_unsynced(
        dir: &Path,
        base_offset: i64,
        config: &LogConfig,
        growth: Growth,
        recycled: Option<&Path>,
    ) -> Result<Segment> {
        let path = segment_path(dir, base_offset, LOG_SUFFIX);
        if let Some(free) = recycled {
            let marker = segment_path(dir, base_offset, RECYCLED_SUFFIX);
            std::fs::File::create(&marker).map_err(|e| LogError::io("create", &marker, e))?;
            std::fs::rename(free, &path).map_err(|e| LogError::io("rename", free, e))?;
        }
        let file = Rc::new(fsutil::open_dma(&path, true).await?);
        let mut segment =
            Segment::from_state(dir, base_offset, file, SegmentState::empty(base_offset));
        segment.activate_with(config, growth).await?;
        Ok(segment)
    }

    /// A segment whose contents recovery has established.
    pub fn from_state(
        dir: &Path,
        base_offset: i64,
        file: Rc<DmaFile>,
        state: SegmentState,
    ) -> Segment {
        Segment {
            base_offset,
            dir: dir.to_path_buf(),
            file,
            appender: None,
            state,
            opened_at: Instant::now(),
        }
    }

    /// Makes this the active segment: appends continue at `size`, with the
    /// appender's sizes starting small.
    pub async fn activate(&mut self, config: &LogConfig) -> Result<()> {
        self.activate_with(config, Growth::SMALL).await
    }

    async fn activate_with(&mut self, config: &LogConfig, growth: Growth) -> Result<()> {
        let sizing = Sizing {
            max_chunk_bytes: config.append_chunk_bytes,
            max_inflight_writes: config.max_inflight_writes,
            max_reserve_bytes: config.preallocate_step_bytes,
            reserve_limit: config.segment_bytes,
            start: growth,
        };
        let appender =
            Appender::open(self.file.clone(), self.log_path(), self.state.size, sizing).await?;
        self.appender = Some(appender);
        self.opened_at = Instant::now();
        Ok(())
    }

    pub fn base_offset(&self) -> i64 {
        self.base_offset
    }
    pub fn next_offset(&self) -> i64 {
        self.state.next_offset
    }
    pub fn size(&self) -> u64 {
        self.state.size
    }
    pub fn max_timestamp(&self) -> i64 {
        self.state.max_timestamp
    }
    pub fn is_empty(&self) -> bool {
        self.state.size == 0
    }
    pub fn is_active(&self) -> bool {
        self.appender.is_some()
    }
    /// The sizes the active segment's appender grew to (small when closed).
    pub fn growth(&self) -> Growth {
        self.appender
            .as_ref()
            .map_or(Growth::SMALL, Appender::growth)
    }
    /// Why the active segment's appender failed (the partition is offline).
    pub fn failure(&self) -> Option<&str> {
        self.appender.as_ref().and_then(Appender::failure)
    }
    pub fn age(&self) -> std::time::Duration {
        self.opened_at.elapsed()
    }
    pub fn log_path(&self) -> PathBuf {
        segment_path(&self.dir, self.base_offset, LOG_SUFFIX)
    }
    pub fn offset_index(&self) -> &OffsetIndex {
        &self.state.offset_index
    }
    pub fn time_index(&self) -> &TimeIndex {
        &self.state.time_index
    }
    pub fn file(&self) -> &Rc<DmaFile> {
        &self.file
    }

    /// Whether `offset - base_offset` still fits the indexes' u32.
    pub fn can_hold(&self, last_offset: i64) -> bool {
        last_offset - self.base_offset <= i64::from(u32::MAX)
    }

    fn appender(&mut self) -> Result<&mut Appender> {
        let path = self.log_path();
        self.appender.as_mut().ok_or_else(|| {
            LogError::Offline(format!("{} is not the active segment", path.display()))
        })
    }

    /// Appends one batch (already validated and stamped) and indexes it.
    pub async fn append(
        &mut self,
        batch: &[u8],
        header: &BatchHeader,
        index_interval_bytes: u64,
    ) -> Result<u64> {
        debug_assert!(header.base_offset >= self.state.next_offset);
        let position = self.appender()?.append(batch).await?;
        debug_assert_eq!(position, self.state.size);
        self.state
            .add_batch(self.base_offset, position, header, index_interval_bytes);
        Ok(position)
    }

    /// Makes every appended byte readable from the file (no fsync).
    pub async fn write_out(&mut self) -> Result<()> {
        match self.appender.as_mut() {
            Some(a) if a.written() < a.end() => a.write_out().await,
            _ => Ok(()),
        }
    }

    /// `Appender::start_write_out`: the partial chunk submitted, the writes in
    /// flight returned for a flusher to await outside the partition's lock.
    pub async fn start_write_out(&mut self) -> Result<Vec<appender::PendingWrite>> {
        match self.appender.as_mut() {
            Some(a) => a.start_write_out().await,
            None => Ok(Vec::new()),
        }
    }

    /// Whether bytes below `position` can be read from the file already.
    pub fn is_written_to(&self, position: u64) -> bool {
        self.appender
            .as_ref()
            .is_none_or(|a| a.written() >= position)
    }

    pub async fn flush(&mut self) -> Result<()> {
        match self.appender.as_mut() {
            Some(a) => a.flush().await,
            None => Ok(()),
        }
    }

    /// DMA memory the active segment holds for appends (`Appender::buffered_bytes`).
    pub fn buffered_bytes(&self) -> usize {
        self.appender.as_ref().map_or(0, Appender::buffered_bytes)
    }

    pub fn poison(&mut self, reason: &str) {
        if let Some(a) = self.appender.as_mut() {
            a.poison(reason);
        }
    }

    /// Turns the active segment into a closed one: data flushed and trimmed, the
    /// final time index entry added, both indexes written. When that fails the
    /// segment stays active with its failed appender, so the failure is not
    /// forgotten (a later call must not find a "closed" segment whose data
    /// never reached the file).
    ///
    /// The data's flush and fdatasync and the indexes' writes run at once
    /// (each a sync of its own file); the renames that publish the indexes
    /// come after all of them, and the directory sync that makes them durable
    /// is the caller's (a roll shares one with the new segment and the
    /// recovery point).
    pub async fn close_active_unsynced(&mut self) -> Result<()> {
        self.close_active_with(true).await
    }

    /// Closes the active segment without writing its index files: the last
    /// segment of a log closing for good, small enough that the next open
    /// scans it faster than this close would write them
    /// (`PartitionLog::shutdown_with_high_watermark`). Nothing to rename.
    pub async fn close_active_unindexed(&mut self) -> Result<()> {
        self.close_active_with(false).await
    }

    async fn close_active_with(&mut self, indexes: bool) -> Result<()> {
        let Some(appender) = self.appender.as_mut() else {
            return Ok(());
        };
        // Idempotent: a close that failed and is tried again adds no entry.
        self.state.seal(self.base_offset);
        let files = if indexes {
            vec![
                (
                    segment_path(&self.dir, self.base_offset, INDEX_SUFFIX),
                    self.state.offset_index.encode(),
                ),
                (
                    segment_path(&self.dir, self.base_offset, TIME_INDEX_SUFFIX),
                    self.state.time_index.encode(),
                ),
            ]
        } else {
            Vec::new()
        };
        let (finished, written) =
            futures_util::future::join(appender.finish(), fsutil::write_tmps(files)).await;
        finished?;
        fsutil::rename_all(written?).await?;
        self.appender = None;
        if indexes {
            self.write_txn_index_unsynced().await?;
        } else {
            // Index files an earlier state left (a crash between a roll's
            // renames, an earlier clean close) would describe another
            // segment; none is better (`skiff-tools verify` checks any there).
            for suffix in [INDEX_SUFFIX, TIME_INDEX_SUFFIX] {
                fsutil::remove(&segment_path(&self.dir, self.base_offset, suffix)).await?;
            }
        }
        // Trimmed to its data and synced: nothing recycled is left in the file.
        fsutil::remove(&segment_path(&self.dir, self.base_offset, RECYCLED_SUFFIX)).await
    }

    pub async fn write_indexes(&self) -> Result<()> {
        fsutil::write_file_atomic(
            &segment_path(&self.dir, self.base_offset, INDEX_SUFFIX),
            &self.state.offset_index.encode(),
        )
        .await?;
        fsutil::write_file_atomic(
            &segment_path(&self.dir, self.base_offset, TIME_INDEX_SUFFIX),
            &self.state.time_index.encode(),
        )
        .await?;
        self.write_txn_index().await
    }

    /// Writes `.txnindex` when the segment holds an aborted transaction, and
    /// removes a stale one when it holds none (most segments never have one:
    /// no file, no inode).
    pub async fn write_txn_index(&self) -> Result<()> {
        self.write_txn_index_unsynced().await?;
        if self.state.txn_index.is_empty() {
            return Ok(());
        }
        fsutil::sync_dir(&self.dir).await
    }

    /// `write_txn_index` whose rename or removal the caller's next directory
    /// sync makes durable.
    async fn write_txn_index_unsynced(&self) -> Result<()> {
        let path = segment_path(&self.dir, self.base_offset, TXN_INDEX_SUFFIX);
        if self.state.txn_index.is_empty() {
            fsutil::remove(&path).await
        } else {
            fsutil::write_file_renamed(&path, &self.state.txn_index.encode()).await
        }
    }

    pub fn txn_index(&self) -> &TxnIndex {
        &self.state.txn_index
    }

    /// The transaction index in memory (the log adds an active segment's
    /// entries as it appends markers; recovery sets a rebuilt one).
    pub fn txn_index_mut(&mut self) -> &mut TxnIndex {
        &mut self.state.txn_index
    }

    /// Reads `len` bytes at `position` of the log file (clamped to the data) into
    /// one `Bytes`, so batches can be sliced out of it without further copies.
    ///
    /// Large reads go to the device as `READ_PIECE_BYTES` pieces, all in flight at
    /// once (sequential reads at queue depth 1 leave most of an NVMe's bandwidth
    /// unused); each piece is copied once out of its DMA buffer into place
    /// (glommio's read buffers are not `Send` and cannot become `Bytes`).
    pub async fn read(&self, position: u64, len: usize) -> Result<Bytes> {
        let end = (position + len as u64).min(self.state.size);
        if position >= end {
            return Ok(Bytes::new());
        }
        let want = (end - position) as usize;
        let mut out = vec![0u8; want];
        let pieces = out
            .chunks_mut(READ_PIECE_BYTES)
            .enumerate()
            .map(|(i, slot)| {
                let file = &self.file;
                async move {
                    let at = position + (i * READ_PIECE_BYTES) as u64;
                    let data = file
                        .read_at(at, slot.len())
                        .await
                        .map_err(std::io::Error::from)?;
                    if data.len() < slot.len() {
                        return Err(std::io::Error::new(
                            std::io::ErrorKind::UnexpectedEof,
                            format!("short read at {at}: {} of {} bytes", data.len(), slot.len()),
                        ));
                    }
                    slot.copy_from_slice(&data[..slot.len()]);
                    Ok(())
                }
            });
        for r in futures_util::future::join_all(pieces).await {
            r.map_err(|e| LogError::io("read", self.log_path(), e))?;
        }
        Ok(Bytes::from(out))
    }

    /// Cuts the segment to `state` (rebuilt by scanning the part that stays) and
    /// makes it the active segment.
    pub async fn truncate(&mut self, state: SegmentState, config: &LogConfig) -> Result<()> {
        if self.appender.is_none() {
            self.activate(config).await?;
        }
        self.appender()?.truncate(state.size).await?;
        self.state = state;
        // Indexes on disk may name the cut part; drop them until the next close.
        for suffix in [INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX] {
            fsutil::remove(&segment_path(&self.dir, self.base_offset, suffix)).await?;
        }
        Ok(())
    }

    /// Deletes the segment's files: the `.log` (up to a segment's size) is
    /// renamed, and freed by the core's trash task at its pace (`trash`).
    pub async fn delete(self) -> Result<()> {
        let log = self.into_log().await?;
        crate::trash::delete_file(&log)
    }

    /// Closes the segment's files and removes all but its `.log` (the last to
    /// go, see `SIDE_SUFFIXES`), whose path it returns.
    async fn into_log(self) -> Result<PathBuf> {
        let Segment {
            dir,
            base_offset,
            file,
            appender,
            ..
        } = self;
        drop(appender);
        drop(file);
        for suffix in SIDE_SUFFIXES {
            fsutil::remove(&segment_path(&dir, base_offset, suffix)).await?;
        }
        Ok(segment_path(&dir, base_offset, LOG_SUFFIX))
    }

    /// Removes a closed segment but keeps its file for reuse by a later
    /// segment of this partition (see the module docs): indexes removed, the
    /// `.log` renamed to `<next offset>.log.free`. Returns that path and the
    /// bound (the next offset) it names. The rename is not synced: a crash may bring the segment
    /// back below the log start, where recovery removes it.
    pub async fn retire(self) -> Result<(PathBuf, i64)> {
        debug_assert!(self.appender.is_none(), "only closed segments retire");
        let bound = self.state.next_offset;
        let free = free_path(&self.dir, bound);
        let log = self.into_log().await?;
        std::fs::rename(&log, &free).map_err(|e| LogError::io("rename", &log, e))?;
        Ok((free, bound))
    }
}
