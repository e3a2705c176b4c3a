//! Log compaction: the per-core cleaner that keeps the latest record of each key.
//!
//! Where it runs: one `Cleaner` per core, in its own low-share glommio task queue
//! (`shard::run_shard`), so produce and fetch always win the CPU; its reads and
//! writes go through a byte-rate throttle (`log.cleaner.io.max.bytes.per.second`).
//! It holds a partition's lock only to take a snapshot of the segment list and,
//! briefly, to swap cleaned segments in; reading and rewriting happen outside it
//! (closed segments never change).
//!
//! One cleaning of a log (Kafka's `LogCleaner` in shape):
//! 1. **Plan** (`PartitionLog::clean_plan`): the cleanable range is the closed
//!    segments wholly below the high watermark and older than
//!    `min.compaction.lag.ms`; the part below the cleaner checkpoint is *clean*, the
//!    rest *dirty*. The core's cleaner picks the log with the largest dirty ratio
//!    at or over `min.cleanable.dirty.ratio`, or one overdue by
//!    `max.compaction.lag.ms`, or one whose kept tombstones passed their horizon.
//! 2. **Map**: the dirty batches, in order, fill an [`OffsetMap`] (key → latest
//!    offset) up to its fixed budget. A dirty section with more keys than fit is
//!    cleaned in several passes: the map stops at a batch boundary, which becomes
//!    the end of this pass.
//! 3. **Rewrite**: every closed segment from the start of the log up to that end is
//!    rewritten, consecutive segments grouped while their total stays within
//!    `segment.bytes`. A record stays when no later offset of its key is in the map,
//!    it has a key, and it is not a tombstone past its delete horizon. Batches keep
//!    their offsets (base and last), leader epoch and producer fields; a batch that
//!    loses records is re-encoded with its own codec; a batch that keeps all its
//!    records is copied verbatim. Tombstones get a delete horizon (now +
//!    `delete.retention.ms`, KIP-534) the first time they are cleaned and are
//!    dropped by the first cleaning after it. A producer's last batch stays (empty
//!    if need be) so its sequence state survives.
//! 4. **Swap** (`PartitionLog::replace_segments`): `.cleaned` → `.swap` (the commit
//!    point) → the old files go → `.log`; recovery finishes an interrupted swap and
//!    deletes a `.cleaned` leftover. Then the checkpoint moves to the pass's end.
//!
//! Transactions (Kafka's rules): only segments below the last stable offset
//! are cleaned (an open transaction may still abort); records of aborted
//! transactions (the `.txnindex` entries of the range) are neither mapped nor
//! kept, so an aborted value never displaces a committed one. A COMMIT or
//! ABORT marker stays while any batch of its transaction does (a pass that
//! read one keeps it); the first pass that reads none gives it a delete
//! horizon (now + `delete.retention.ms`, as a tombstone's), and the first
//! pass after that drops it, so a consumer that read the transaction's data
//! still finds its marker. The cleaned segment's `.txnindex` holds the
//! aborted transactions whose ABORT marker it kept.
//!
//! Invariants: offsets only ever disappear, never move; the active segment and
//! anything at or past the last stable offset are never touched; every batch read is
//! CRC-checked before it is rewritten, so corruption is never laundered into a
//! fresh CRC.

pub mod offset_map;

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use glommio::io::DmaFile;

use crate::batch::{
    self, crc_matches, record_views, records_section, BatchHeader, BATCH_HEADER_LEN,
};
use crate::config::LogConfig;
use crate::error::{LogError, Result};
use crate::fsutil;
use crate::partition::Partition;
use crate::segment::appender::{Appender, Growth, Sizing};
use crate::segment::txn_index::AbortedTxn;
use crate::segment::{cleaned_path, SegmentState};
pub use offset_map::OffsetMap;

/// Per-core cleaner settings, with Kafka's names.
#[derive(Debug, Clone)]
pub struct CleanerConfig {
    /// `log.cleaner.enable`.
    pub enabled: bool,
    /// `log.cleaner.dedupe.buffer.size`, per core: the offset map's budget.
    pub dedupe_buffer_bytes: usize,
    /// `log.cleaner.io.max.bytes.per.second` (read plus written), per core; None:
    /// unthrottled.
    pub io_max_bytes_per_second: Option<u64>,
    /// `log.cleaner.backoff.ms`: the pause when no log needs cleaning.
    pub backoff: Duration,
    /// Bytes read from a segment at a time.
    pub read_chunk_bytes: usize,
}

impl Default for CleanerConfig {
    fn default() -> Self {
        CleanerConfig {
            enabled: true,
            dedupe_buffer_bytes: 32 << 20,
            io_max_bytes_per_second: None,
            backoff: Duration::from_secs(15),
            read_chunk_bytes: 1 << 20,
        }
    }
}

/// A closed segment as the cleaner sees it: an open file that no longer changes.
#[derive(Clone)]
pub struct SegmentSnapshot {
    pub base_offset: i64,
    pub next_offset: i64,
    pub size: u64,
    pub max_timestamp: i64,
    pub file: Rc<DmaFile>,
    pub path: PathBuf,
}

/// What one cleaning of a log would cover (from `PartitionLog::clean_plan`).
pub struct CleanPlan {
    pub dir: PathBuf,
    /// Aborted transactions whose records may be in the range: those records
    /// are neither mapped nor kept.
    pub aborted: Vec<AbortedTxn>,
    /// The cleanable closed segments, from the first of the log, in order.
    pub segments: Vec<SegmentSnapshot>,
    /// Below it the log is already compacted.
    pub first_dirty: i64,
    pub clean_bytes: u64,
    pub dirty_bytes: u64,
    /// dirty / (clean + dirty).
    pub dirty_ratio: f64,
    /// Overdue by `max.compaction.lag.ms`, or a kept tombstone's horizon passed.
    pub must_clean: bool,
    pub config: LogConfig,
}

impl CleanPlan {
    /// Whether the cleaner should take this log now.
    pub fn is_due(&self) -> bool {
        self.must_clean
            || (self.dirty_bytes > 0 && self.dirty_ratio >= self.config.min_cleanable_dirty_ratio)
    }
}

/// A finished `.cleaned` file, ready to replace the segments it was made from.
pub struct CleanedSegment {
    pub base_offset: i64,
    pub path: PathBuf,
    pub file: Rc<DmaFile>,
    pub state: SegmentState,
}

/// What one cleaning did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CleanStats {
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub records_read: u64,
    pub records_kept: u64,
    pub segments_replaced: usize,
    /// The new first dirty offset.
    pub cleaned_to: i64,
    pub elapsed: Duration,
}

/// Kafka's byte-rate throttle for the cleaner: sleeps whenever the bytes moved
/// since the window opened run ahead of the allowed rate. It also paces the
/// cleaner's CPU: glommio reaps completed I/O only when no task queue is runnable
/// or its preempt timer (100 ms) fires, so a cleaner that never waits would hold
/// every completed append and fetch of its core for that long. After each
/// `CPU_SLICE` of work the cleaner sleeps briefly, its queue goes idle, the
/// executor polls io_uring, and whatever was waiting runs first.
struct Throttle {
    rate: Option<u64>,
    window_start: Instant,
    window_bytes: u64,
    slice_start: Instant,
}

/// Longest stretch of cleaner work between two pauses.
const CPU_SLICE: Duration = Duration::from_millis(1);
/// The pause: long enough for the executor to go round its reactor.
const PAUSE: Duration = Duration::from_micros(50);

impl Throttle {
    fn new(rate: Option<u64>) -> Self {
        Throttle {
            rate,
            window_start: Instant::now(),
            window_bytes: 0,
            slice_start: Instant::now(),
        }
    }

    async fn pace(&mut self) {
        if self.slice_start.elapsed() >= CPU_SLICE {
            glommio::timer::sleep(PAUSE).await;
            self.slice_start = Instant::now();
        }
    }

    async fn account(&mut self, bytes: u64) {
        let Some(rate) = self.rate.filter(|r| *r > 0) else {
            return;
        };
        self.window_bytes += bytes;
        let elapsed = self.window_start.elapsed();
        let allowed = Duration::from_secs_f64(self.window_bytes as f64 / rate as f64);
        // Sleep in steps the timer can honour (short sleeps overshoot).
        if allowed > elapsed + Duration::from_millis(10) {
            glommio::timer::sleep(allowed - elapsed).await;
        }
        if self.window_start.elapsed() > Duration::from_secs(1) {
            self.window_start = Instant::now();
            self.window_bytes = 0;
        }
    }
}

/// A core's cleaner: the offset map (allocated once) and the throttle.
pub struct Cleaner {
    config: CleanerConfig,
    map: OffsetMap,
    throttle: Throttle,
}

/// The dirty section the map covered, and each producer's last batch in it.
struct MapOutcome {
    end: i64,
    producers_last: HashMap<i64, i64>,
}

impl Cleaner {
    pub fn new(config: CleanerConfig) -> Cleaner {
        Cleaner {
            map: OffsetMap::with_budget(config.dedupe_buffer_bytes),
            throttle: Throttle::new(config.io_max_bytes_per_second),
            config,
        }
    }

    pub fn config(&self) -> &CleanerConfig {
        &self.config
    }

    /// Cleans the log among `partitions` that needs it most, if any does. An error
    /// names the partition it happened on.
    pub async fn clean_dirtiest(
        &mut self,
        partitions: &[Rc<Partition>],
        now_ms: i64,
    ) -> std::result::Result<Option<(Rc<Partition>, CleanStats)>, (Rc<Partition>, LogError)> {
        let mut best: Option<(f64, Rc<Partition>, CleanPlan)> = None;
        for p in partitions {
            let plan = match p.clean_plan(now_ms).await {
                Ok(Some(plan)) if plan.is_due() => plan,
                Ok(_) => continue,
                Err(e) => return Err((p.clone(), e)),
            };
            let score = if plan.must_clean {
                f64::MAX
            } else {
                plan.dirty_ratio
            };
            if best.as_ref().is_none_or(|(s, _, _)| score > *s) {
                best = Some((score, p.clone(), plan));
            }
        }
        let Some((_, partition, plan)) = best else {
            return Ok(None);
        };
        match self.clean_plan(&partition, plan, now_ms).await {
            Ok(stats) => Ok(Some((partition, stats))),
            Err(e) => {
                self.map.clear();
                Err((partition, e))
            }
        }
    }

    /// One cleaning of `partition` (whether or not it is due): None when it has
    /// nothing cleanable.
    pub async fn clean(
        &mut self,
        partition: &Partition,
        now_ms: i64,
    ) -> Result<Option<CleanStats>> {
        let Some(plan) = partition.clean_plan(now_ms).await? else {
            return Ok(None);
        };
        Ok(Some(self.clean_plan(partition, plan, now_ms).await?))
    }

    async fn clean_plan(
        &mut self,
        partition: &Partition,
        plan: CleanPlan,
        now_ms: i64,
    ) -> Result<CleanStats> {
        let started = Instant::now();
        let mut stats = CleanStats::default();
        let mapped = self.build_map(&plan).await?;
        let size_limit = plan.config.max_batch_bytes.saturating_mul(64);
        let horizon = now_ms.saturating_add(plan.config.delete_retention.as_millis() as i64);
        let to_clean: Vec<&SegmentSnapshot> = plan
            .segments
            .iter()
            .filter(|s| s.base_offset < mapped.end)
            .collect();
        let mut pass = Pass {
            plan: &plan,
            rules: Rules {
                txn_data_seen: HashSet::new(),
                aborted: &plan.aborted,
                map: &self.map,
                producers_last: &mapped.producers_last,
                now_ms,
                new_horizon: horizon,
                size_limit,
            },
            read_chunk_bytes: self.config.read_chunk_bytes,
            throttle: &mut self.throttle,
            stats: &mut stats,
            earliest_horizon: None,
        };
        for group in group_segments(&to_clean, plan.config.segment_bytes) {
            let out = pass.write_cleaned(group).await?;
            let old: Vec<(i64, u64)> = group.iter().map(|s| (s.base_offset, s.size)).collect();
            if !partition.replace_segments(&old, out).await? {
                tracing::info!(dir = %plan.dir.display(), "log changed during cleaning; pass abandoned");
                self.map.clear();
                return Ok(stats);
            }
            pass.stats.segments_replaced += group.len();
        }
        let earliest_horizon = pass.earliest_horizon;
        self.map.clear();
        partition
            .finish_cleaning(mapped.end, earliest_horizon)
            .await?;
        stats.cleaned_to = mapped.end;
        stats.elapsed = started.elapsed();
        tracing::info!(
            dir = %plan.dir.display(), read = stats.bytes_read, written = stats.bytes_written,
            records = stats.records_read, kept = stats.records_kept, cleaned_to = mapped.end,
            ms = stats.elapsed.as_millis() as u64, "cleaned log"
        );
        Ok(stats)
    }

    /// Fills the map from the dirty section, stopping at a batch boundary when the
    /// next batch might not fit.
    async fn build_map(&mut self, plan: &CleanPlan) -> Result<MapOutcome> {
        self.map.clear();
        let mut producers_last = HashMap::new();
        let size_limit = plan.config.max_batch_bytes.saturating_mul(64);
        let mut end = plan.first_dirty;
        'segments: for segment in plan
            .segments
            .iter()
            .filter(|s| s.next_offset > plan.first_dirty)
        {
            let mut batches = SegmentBatches::new(segment, self.config.read_chunk_bytes);
            while let Some((position, header, bytes)) = batches.next().await? {
                self.throttle.account(bytes.len() as u64).await;
                self.throttle.pace().await;
                if header.last_offset() < plan.first_dirty {
                    continue;
                }
                check_crc(segment, position, &header, &bytes)?;
                if !header.is_control() {
                    let count = usize::try_from(header.records_count).unwrap_or(0);
                    if !self.map.has_room_for(count) {
                        if self.map.is_empty() {
                            return Err(LogError::Offline(format!(
                                "{}: a batch of {count} records does not fit the cleaner's offset map ({} entries); raise log.cleaner.dedupe.buffer.size",
                                segment.path.display(),
                                self.map.capacity()
                            )));
                        }
                        break 'segments;
                    }
                    let section = records_section(&bytes, &header, size_limit)?;
                    // An aborted value must not displace a committed one.
                    let aborted = is_aborted(&plan.aborted, &header);
                    for record in record_views(&section, header.records_count)? {
                        if aborted {
                            break;
                        }
                        if let Some(key) = record.key {
                            self.map
                                .put(key, header.base_offset + i64::from(record.offset_delta));
                        }
                    }
                    if header.producer_id >= 0 {
                        producers_last.insert(header.producer_id, header.base_offset);
                    }
                }
                end = header.next_offset();
            }
            end = end.max(segment.next_offset);
        }
        Ok(MapOutcome {
            end,
            producers_last,
        })
    }
}

/// Whether `header` is a data batch of a transaction that was aborted.
fn is_aborted(aborted: &[AbortedTxn], header: &BatchHeader) -> bool {
    header.is_transactional()
        && !header.is_control()
        && aborted.iter().any(|a| {
            a.producer_id == header.producer_id
                && a.first_offset <= header.base_offset
                && header.base_offset <= a.last_offset
        })
}

/// Consecutive segments whose total size stays within `max_bytes` (at least one
/// per group) and whose offsets fit one segment's u32 index.
fn group_segments<'a>(
    segments: &'a [&'a SegmentSnapshot],
    max_bytes: u64,
) -> Vec<&'a [&'a SegmentSnapshot]> {
    let mut groups = Vec::new();
    let mut start = 0;
    while start < segments.len() {
        let base = segments[start].base_offset;
        let mut size = segments[start].size;
        let mut end = start + 1;
        while end < segments.len()
            && size + segments[end].size <= max_bytes
            && segments[end].next_offset - base <= i64::from(u32::MAX)
        {
            size += segments[end].size;
            end += 1;
        }
        groups.push(&segments[start..end]);
        start = end;
    }
    groups
}

/// The record-level decisions of one pass.
struct Rules<'a> {
    /// Producers with a data batch of their current transaction read in
    /// this pass (from the log's start, in offset order): their next marker
    /// stays.
    txn_data_seen: HashSet<i64>,
    aborted: &'a [AbortedTxn],
    map: &'a OffsetMap,
    producers_last: &'a HashMap<i64, i64>,
    now_ms: i64,
    /// The horizon a tombstone gets when first cleaned.
    new_horizon: i64,
    size_limit: usize,
}

/// What becomes of one batch.
enum Filtered {
    Verbatim,
    Rewritten(Bytes),
    Dropped,
}

impl Rules<'_> {
    fn filter(
        &mut self,
        bytes: &[u8],
        header: &BatchHeader,
        stats: &mut CleanStats,
    ) -> Result<Filtered> {
        if header.is_control() {
            return self.filter_marker(bytes, header);
        }
        if header.is_transactional() {
            self.txn_data_seen.insert(header.producer_id);
        }
        let section = records_section(bytes, header, self.size_limit)?;
        let records = record_views(&section, header.records_count)?;
        stats.records_read += records.len() as u64;
        let horizon_passed = header.has_delete_horizon() && header.base_timestamp <= self.now_ms;
        // An aborted transaction's records are never readable
        // (read_committed skips them): none is kept, the batch goes unless
        // it is its producer's last (below).
        let aborted = is_aborted(self.aborted, header);
        let kept: Vec<_> = records
            .iter()
            .filter(|_| !aborted)
            .filter(|r| {
                let Some(key) = r.key else {
                    return false; // keyless records have no place in a compacted log
                };
                let offset = header.base_offset + i64::from(r.offset_delta);
                if self.map.get(key).is_some_and(|latest| offset < latest) {
                    return false;
                }
                !(r.is_tombstone && horizon_passed)
            })
            .copied()
            .collect();
        stats.records_kept += kept.len() as u64;
        if kept.is_empty() {
            let last_of_producer = header.producer_id >= 0
                && self
                    .producers_last
                    .get(&header.producer_id)
                    .is_none_or(|&last| last == header.base_offset);
            return Ok(match (last_of_producer, records.is_empty()) {
                (false, _) => Filtered::Dropped,
                (true, true) => Filtered::Verbatim,
                (true, false) => Filtered::Rewritten(batch::rebuild(header, &[], None)?),
            });
        }
        let needs_horizon = !header.has_delete_horizon() && kept.iter().any(|r| r.is_tombstone);
        if kept.len() == records.len() && !needs_horizon {
            return Ok(Filtered::Verbatim);
        }
        let horizon = needs_horizon.then_some(self.new_horizon);
        Ok(Filtered::Rewritten(batch::rebuild(header, &kept, horizon)?))
    }

    /// A control batch (a transaction's COMMIT or ABORT marker): kept while
    /// a batch of its transaction is in the log, then given a delete
    /// horizon, then dropped once the horizon passed.
    fn filter_marker(&mut self, bytes: &[u8], header: &BatchHeader) -> Result<Filtered> {
        if self.txn_data_seen.remove(&header.producer_id) {
            return Ok(Filtered::Verbatim);
        }
        if header.has_delete_horizon() {
            return Ok(if header.base_timestamp <= self.now_ms {
                Filtered::Dropped
            } else {
                Filtered::Verbatim
            });
        }
        let section = records_section(bytes, header, self.size_limit)?;
        let records = record_views(&section, header.records_count)?;
        if records.is_empty() {
            // Nothing a reader could need (Kafka drops an empty control batch).
            return Ok(Filtered::Dropped);
        }
        Ok(Filtered::Rewritten(batch::rebuild(
            header,
            &records,
            Some(self.new_horizon),
        )?))
    }
}

/// One pass's rewrite of its segment groups: the rules, and what the pass has
/// seen so far.
struct Pass<'a> {
    plan: &'a CleanPlan,
    rules: Rules<'a>,
    read_chunk_bytes: usize,
    throttle: &'a mut Throttle,
    stats: &'a mut CleanStats,
    /// Earliest delete horizon among the tombstones kept.
    earliest_horizon: Option<i64>,
}

impl Pass<'_> {
    /// Writes the cleaned replacement of `group` to `<base>.log.cleaned`, synced,
    /// with its indexes built in memory. None when nothing of the group survives;
    /// on any failure the file is removed.
    async fn write_cleaned(
        &mut self,
        group: &[&SegmentSnapshot],
    ) -> Result<Option<CleanedSegment>> {
        let Some(first) = group.first() else {
            return Ok(None);
        };
        let base = first.base_offset;
        let path = cleaned_path(&self.plan.dir, base);
        fsutil::remove(&path).await?;
        let file = Rc::new(fsutil::open_dma(&path, true).await?);
        let state = match self.fill(group, base, &file, &path).await {
            Ok(state) if state.size > 0 => state,
            other => {
                drop(file);
                fsutil::remove(&path).await?;
                return other.map(|_| None);
            }
        };
        Ok(Some(CleanedSegment {
            base_offset: base,
            path,
            file,
            state,
        }))
    }

    async fn fill(
        &mut self,
        group: &[&SegmentSnapshot],
        base: i64,
        file: &Rc<DmaFile>,
        path: &std::path::Path,
    ) -> Result<SegmentState> {
        let config = &self.plan.config;
        let mut appender = Appender::open(
            file.clone(),
            path.to_path_buf(),
            0,
            Sizing {
                max_chunk_bytes: config.append_chunk_bytes,
                max_inflight_writes: config.max_inflight_writes,
                // The cleaner's output is written once and trimmed: no fallocate.
                max_reserve_bytes: 0,
                reserve_limit: u64::MAX,
                start: Growth {
                    chunk_bytes: config.append_chunk_bytes,
                    reserve_bytes: 0,
                },
            },
        )
        .await?;
        let mut state = SegmentState::empty(base);
        for segment in group {
            let mut batches = SegmentBatches::new(segment, self.read_chunk_bytes);
            while let Some((position, header, bytes)) = batches.next().await? {
                self.stats.bytes_read += bytes.len() as u64;
                self.throttle.account(bytes.len() as u64).await;
                self.throttle.pace().await;
                check_crc(segment, position, &header, &bytes)?;
                let out = match self.rules.filter(&bytes, &header, self.stats)? {
                    Filtered::Dropped => continue,
                    Filtered::Verbatim => bytes,
                    Filtered::Rewritten(b) => b,
                };
                let out_header = BatchHeader::parse(&out)?;
                if out_header.is_control() {
                    // The aborted transaction this kept ABORT marker ends.
                    if let Some(txn) = self.rules.aborted.iter().find(|a| {
                        a.producer_id == out_header.producer_id
                            && a.last_offset == out_header.base_offset
                    }) {
                        // Markers come in offset order, as the index wants
                        // them: a push cannot fail.
                        let _ = state.txn_index.push(*txn);
                    }
                }
                if out_header.has_delete_horizon() && out_header.records_count > 0 {
                    let h = out_header.base_timestamp;
                    self.earliest_horizon = Some(self.earliest_horizon.map_or(h, |e| e.min(h)));
                }
                let at = appender.append(&out).await?;
                state.add_batch(base, at, &out_header, config.index_interval_bytes);
                self.stats.bytes_written += out.len() as u64;
                self.throttle.account(out.len() as u64).await;
            }
        }
        appender.finish().await?;
        state.seal(base);
        Ok(state)
    }
}

fn check_crc(
    segment: &SegmentSnapshot,
    position: u64,
    header: &BatchHeader,
    bytes: &[u8],
) -> Result<()> {
    crc_matches(bytes).map_err(|e| {
        LogError::Offline(format!(
            "{}: batch at position {position} (offset {}) fails its CRC ({e}); the cleaner leaves this log alone",
            segment.path.display(),
            header.base_offset
        ))
    })
}

/// The batches of a closed segment, read `chunk` bytes at a time.
struct SegmentBatches<'a> {
    segment: &'a SegmentSnapshot,
    chunk: usize,
    /// Position of the next batch.
    pos: u64,
    buf: Bytes,
    /// File position of `buf[0]`.
    buf_pos: u64,
}

impl<'a> SegmentBatches<'a> {
    fn new(segment: &'a SegmentSnapshot, chunk: usize) -> Self {
        SegmentBatches {
            segment,
            chunk: chunk.max(BATCH_HEADER_LEN),
            pos: 0,
            buf: Bytes::new(),
            buf_pos: 0,
        }
    }

    async fn next(&mut self) -> Result<Option<(u64, BatchHeader, Bytes)>> {
        let end = self.segment.size;
        loop {
            if self.pos >= end {
                return Ok(None);
            }
            let off = (self.pos - self.buf_pos) as usize;
            let mut need = BATCH_HEADER_LEN;
            if self.pos >= self.buf_pos && off + BATCH_HEADER_LEN <= self.buf.len() {
                let header = BatchHeader::parse(&self.buf[off..])
                    .map_err(|e| self.corrupt(format!("unreadable batch header: {e}")))?;
                let len = header.total_len();
                if off + len <= self.buf.len() {
                    let bytes = self.buf.slice(off..off + len);
                    let position = self.pos;
                    self.pos += len as u64;
                    return Ok(Some((position, header, bytes)));
                }
                need = len;
            }
            if self.pos + need as u64 > end {
                return Err(self.corrupt("batch runs past the end of the segment".into()));
            }
            let len = self.chunk.max(need).min((end - self.pos) as usize);
            let data = self
                .segment
                .file
                .read_at(self.pos, len)
                .await
                .map_err(|e| LogError::io("read", &self.segment.path, std::io::Error::from(e)))?;
            if data.len() < len {
                return Err(self.corrupt(format!("short read: {} of {len} bytes", data.len())));
            }
            self.buf = Bytes::copy_from_slice(&data[..len]);
            self.buf_pos = self.pos;
        }
    }

    fn corrupt(&self, reason: String) -> LogError {
        LogError::Offline(format!(
            "{}: position {}: {reason}",
            self.segment.path.display(),
            self.pos
        ))
    }
}
