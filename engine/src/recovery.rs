//! Opening a partition directory after a clean stop or a crash.
//!
//! Rules:
//! - The recovery point (`recovery-point-offset-checkpoint`) is an offset below
//!   which the log is known flushed. Every segment from the one holding the
//!   recovery point to the last is read in full and each batch's length and
//!   CRC-32C are checked; the indexes of those segments are rebuilt from the scan.
//! - The first batch that fails at or past the recovery point ends the log: a
//!   torn write or garbage (a crash mid-write). The file is cut there and later
//!   segments are deleted; nothing past the cut is served.
//! - A batch that fails *before* the recovery point is bitrot in flushed data: it
//!   is never cut silently. Recovery stops with `RecoveryError::CorruptFlushedData`
//!   naming the file, position and offset, and the partition stays offline.
//! - Segments wholly before the recovery point are trusted: their `.index` and
//!   `.timeindex` are loaded and checked against the log, and rebuilt by a scan
//!   when missing or inconsistent. (`skiff-tools verify` checks every CRC.)
//! - Zeros after the data of a segment are preallocated space, trimmed here;
//!   so is whatever follows the data of a recycled segment (one with a
//!   `.recycled` marker: a previous segment's bytes, every batch of them below
//!   this segment's base, see `segment`), which is not a torn write.
//! - Segments wholly below the checkpointed log start go first (a crash after
//!   retention, DeleteRecords or `truncate_fully_and_start_at` checkpointed the
//!   start and before it deleted them); an empty last segment that does not
//!   continue its predecessor's offsets goes (a start-over that never
//!   committed); a log ending below its checkpointed start starts over, empty,
//!   at that start (Kafka's rule).

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use futures_util::stream::{self, StreamExt, TryStreamExt};
use glommio::io::DmaFile;
use thiserror::Error;

use crate::batch::crc_matches;
use crate::checkpoint::{self, RECOVERY_POINT_FILE};
use crate::config::LogConfig;
use crate::error::{LogError, Result};
use crate::fsutil;
use crate::segment::appender::Growth;
use crate::segment::index::{OffsetIndex, TimeIndex};
use crate::segment::scan::{scan, ScanStop};
use crate::segment::txn_index::TxnIndex;
use crate::segment::{
    parse_segment_name, parse_swap_name, segment_path, Segment, SegmentState, FREE_SUFFIX,
    INDEX_SUFFIX, LOG_SUFFIX, RECYCLED_SUFFIX, SIDE_SUFFIXES, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX,
};
use crate::txn::TxnBatch;

const SCAN_CHUNK_BYTES: usize = 4 << 20;
/// Closed segments loaded at once while a partition opens (a few small
/// reads each: the log's tail after its last index entry, its indexes).
const SEGMENT_LOAD_CONCURRENCY: usize = 16;

#[derive(Debug, Error)]
pub enum RecoveryError {
    #[error(
        "{}: corrupt batch at position {position} (offset {offset}), below the recovery point {recovery_point}: {reason}; the partition stays offline until the segment is repaired",
        path.display()
    )]
    CorruptFlushedData {
        path: PathBuf,
        position: u64,
        offset: i64,
        recovery_point: i64,
        reason: String,
    },
}

/// The state of a partition log after recovery.
pub struct Recovered {
    pub segments: BTreeMap<i64, Segment>,
    pub log_start_offset: i64,
    pub log_end_offset: i64,
    /// Bytes cut from the end of the log that held something: torn or
    /// garbled batches and whatever followed them, later segments.
    pub truncated_bytes: u64,
    /// Zeros trimmed after the last batch: space preallocated ahead of the
    /// active segment and never written, the normal end of a log after a
    /// crash (nothing of the log is lost there).
    pub unwritten_bytes: u64,
    /// What followed the data of a recycled active segment (a previous
    /// segment's bytes), trimmed: nothing of this log.
    pub recycled_bytes: u64,
    /// Bytes read and checked by full segment scans (the segments from the
    /// recovery point on, and any whose indexes did not check).
    pub scanned_bytes: u64,
    /// The base of the segment holding the recovery point: it and every later
    /// segment were scanned. The log end when nothing was (a clean close left
    /// the last segment with its indexes).
    pub first_scanned: i64,
    /// Per scanned segment (by base offset), its transactional batches in
    /// order: the log rebuilds those segments' aborted transaction indexes
    /// from them (`PartitionLog::open`).
    pub txn_batches: BTreeMap<i64, Vec<TxnBatch>>,
    /// Retired segment files kept for reuse (`<bound>.log.free`), as
    /// `(bound, path, size)`, lowest bound first.
    pub free: Vec<(i64, PathBuf, u64)>,
}

/// What a full scan of one segment found.
pub struct ScannedSegment {
    pub state: SegmentState,
    /// Where and why the valid data stops, if not at the end of the file.
    pub problem: Option<(u64, String)>,
    /// The data stops at `problem`'s position because only zeros follow
    /// (preallocated space never written), not because of a bad batch.
    pub unwritten: bool,
    /// Its transactional data batches and markers, in order.
    pub txn_batches: Vec<TxnBatch>,
}

/// Reads `[0, end)` of a segment and rebuilds its state (indexes, next offset, max
/// timestamp), checking every batch's CRC when `check_crc`. Stops at the first
/// batch that fails or whose offsets go backwards.
pub async fn scan_segment(
    file: &DmaFile,
    path: &Path,
    base_offset: i64,
    end: u64,
    index_interval_bytes: u64,
    check_crc: bool,
) -> Result<ScannedSegment> {
    let mut state = SegmentState::empty(base_offset);
    let mut bad: Option<String> = None;
    let mut txn_batches = Vec::new();
    let outcome = scan(
        file,
        path,
        0,
        end,
        SCAN_CHUNK_BYTES,
        |pos, header, bytes| {
            if header.base_offset < state.next_offset {
                bad = Some(format!(
                    "base offset {} goes backwards (expected at least {})",
                    header.base_offset, state.next_offset
                ));
                return ControlFlow::Break(());
            }
            if check_crc {
                if let Err(e) = crc_matches(bytes) {
                    bad = Some(e.to_string());
                    return ControlFlow::Break(());
                }
            }
            state.add_batch(base_offset, pos, header, index_interval_bytes);
            match TxnBatch::of(header, bytes) {
                Ok(Some(b)) => txn_batches.push(b),
                Ok(None) => {}
                // A control batch whose CRC checks but whose record does not
                // parse: not a marker of any transaction.
                Err(e) => tracing::warn!(
                    path = %path.display(), offset = header.base_offset, error = %e,
                    "a control batch that is no transaction marker; ignored"
                ),
            }
            ControlFlow::Continue(())
        },
    )
    .await?;
    let unwritten = matches!(outcome.stop, ScanStop::Unwritten);
    let problem = match outcome.stop {
        ScanStop::End => None,
        ScanStop::Unwritten => Some((outcome.position, "space never written".into())),
        ScanStop::Visitor => Some((outcome.position, bad.unwrap_or_default())),
        ScanStop::Partial => Some((
            outcome.position,
            "batch extends past the end of the file (torn write)".into(),
        )),
        ScanStop::BadHeader(e) => Some((outcome.position, e)),
    };
    Ok(ScannedSegment {
        state,
        problem,
        unwritten,
        txn_batches,
    })
}

/// What a clean close recorded of the active segment (`CLEAN_SHUTDOWN_FILE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CleanShutdown {
    pub base: i64,
    pub size: u64,
    pub next_offset: i64,
}

impl CleanShutdown {
    /// The record's file contents.
    pub fn encode(&self) -> Vec<u8> {
        checkpoint::encode(&[vec![
            self.base.to_string(),
            self.size.to_string(),
            self.next_offset.to_string(),
        ]])
        .into_bytes()
    }
}

async fn read_clean_shutdown(dir: &Path) -> Result<Option<CleanShutdown>> {
    let path = dir.join(checkpoint::CLEAN_SHUTDOWN_FILE);
    let Some(rows) = checkpoint::read(&path, 3).await? else {
        return Ok(None);
    };
    let Some(row) = rows.first() else {
        return Ok(None);
    };
    Ok(Some(CleanShutdown {
        base: checkpoint::parse_i64(&path, &row[0])?,
        size: checkpoint::parse_i64(&path, &row[1])?.max(0) as u64,
        next_offset: checkpoint::parse_i64(&path, &row[2])?,
    }))
}

pub async fn read_recovery_point(dir: &Path) -> Result<i64> {
    read_offset_checkpoint(&dir.join(RECOVERY_POINT_FILE)).await
}

pub async fn write_recovery_point(
    dir: &Path,
    topic: &str,
    partition: i32,
    offset: i64,
) -> Result<()> {
    write_offset_checkpoint(&dir.join(RECOVERY_POINT_FILE), topic, partition, offset).await
}

/// The contents of a `topic partition offset` checkpoint (recovery point,
/// log start, high watermark).
pub fn encode_offset_checkpoint(topic: &str, partition: i32, offset: i64) -> Vec<u8> {
    checkpoint::encode(&[vec![
        topic.to_string(),
        partition.to_string(),
        offset.to_string(),
    ]])
    .into_bytes()
}

/// A `topic partition offset` checkpoint's offset; 0 when the file is absent.
pub async fn read_offset_checkpoint(path: &Path) -> Result<i64> {
    match checkpoint::read(path, 3).await? {
        Some(rows) if !rows.is_empty() => checkpoint::parse_i64(path, &rows[0][2]),
        _ => Ok(0),
    }
}

pub async fn write_offset_checkpoint(
    path: &Path,
    topic: &str,
    partition: i32,
    offset: i64,
) -> Result<()> {
    fsutil::write_file_atomic(path, &encode_offset_checkpoint(topic, partition, offset)).await
}

/// Recovers the partition in `dir` (see the module docs). The last segment comes
/// back active.
pub async fn recover(dir: &Path, config: &LogConfig) -> Result<Recovered> {
    finish_interrupted_cleaning(dir).await?;
    let recovery_point = read_recovery_point(dir).await?;
    let checkpointed_start =
        read_offset_checkpoint(&dir.join(checkpoint::LOG_START_OFFSET_FILE)).await?;
    let Listing { mut bases, free } = list(dir)?;
    // Segments wholly below the log start (the next one starts at or before it):
    // what a crash left of retention, DeleteRecords or truncate_fully_and_start_at
    // after the start was checkpointed. They are not part of the log; they go
    // before anything reads them.
    let below = bases
        .partition_point(|&b| b <= checkpointed_start)
        .saturating_sub(1);
    for &base in &bases[..below] {
        tracing::info!(
            dir = %dir.display(), base, log_start_offset = checkpointed_start,
            "removing a segment below the log start"
        );
        delete_segment_files(dir, base).await?;
    }
    bases.drain(..below);
    // The segment holding the recovery point and every later one get a full scan.
    let first_scanned = bases
        .iter()
        .rposition(|&b| b <= recovery_point)
        .unwrap_or(0);
    // Except after a clean close: the last segment was closed with its
    // indexes at the recovery point, and still is what the close recorded
    // (same base, same size, loading to the same next offset below). Any
    // later change to its bytes below that size starts with a truncation,
    // which lowers the recovery point; the record is removed as the log opens
    // and any later checkpoint makes that removal durable.
    let clean = read_clean_shutdown(dir).await?.filter(|c| {
        c.next_offset == recovery_point
            && bases.last() == Some(&c.base)
            && first_scanned + 1 == bases.len()
    });
    let trusted = first_scanned + usize::from(clean.is_some());

    // The closed segments below the recovery point load from their indexes,
    // SEGMENT_LOAD_CONCURRENCY at a time: each is a few small reads, and one
    // after another they made a partition of 2,000 segments take 16 s to
    // open (nemesis seed 10001's late restarts).
    let mut preloaded = stream::iter(bases[..trusted].iter().copied())
        .map(|base| async move {
            let path = segment_path(dir, base, LOG_SUFFIX);
            let (file, file_size) = open_segment_file(&path).await?;
            let loaded = load_closed_segment(dir, &file, &path, base, file_size, config).await?;
            Ok::<_, LogError>((file, file_size, loaded))
        })
        .buffered(SEGMENT_LOAD_CONCURRENCY)
        .try_collect::<Vec<_>>()
        .await?
        .into_iter();

    let mut segments = BTreeMap::new();
    let mut truncated_bytes = 0u64;
    let mut unwritten_bytes = 0u64;
    let mut recycled_bytes = 0u64;
    let mut scanned_bytes = 0u64;
    let mut txn_batches = BTreeMap::new();
    let mut clean_loaded = false;
    let mut i = 0;
    while i < bases.len() {
        let base = bases[i];
        let path = segment_path(dir, base, LOG_SUFFIX);
        let (file, file_size, loaded) = match preloaded.next() {
            Some(preloaded) => preloaded,
            None => {
                let (file, file_size) = open_segment_file(&path).await?;
                (file, file_size, None)
            }
        };
        let next_base = bases.get(i + 1).copied();
        // The cleanly closed last segment only as the close recorded it.
        let loaded = loaded.filter(|state| {
            i < first_scanned
                || clean.is_some_and(|c| c.size == file_size && c.next_offset == state.next_offset)
        });
        let state = match loaded {
            Some(state) => {
                clean_loaded |= i >= first_scanned;
                state
            }
            None => {
                let scanned = scan_segment(
                    &file,
                    &path,
                    base,
                    file_size,
                    config.index_interval_bytes,
                    true,
                )
                .await?;
                scanned_bytes += file_size;
                txn_batches.insert(base, scanned.txn_batches);
                let state = scanned.state;
                if let Some((position, reason)) = scanned.problem {
                    if state.next_offset < recovery_point {
                        return Err(RecoveryError::CorruptFlushedData {
                            path,
                            position,
                            offset: state.next_offset,
                            recovery_point,
                            reason,
                        }
                        .into());
                    }
                    let contiguous = next_base == Some(state.next_offset);
                    let marker = segment_path(dir, base, RECYCLED_SUFFIX);
                    let recycled = marker.exists();
                    if scanned.unwritten {
                        // The end of an active segment (or of one a crash
                        // during a roll left): nothing damaged, nothing lost.
                        unwritten_bytes += file_size - position;
                    } else if recycled {
                        // A recycled file's previous contents: every batch in
                        // them lies below this segment's base offset.
                        recycled_bytes += file_size - position;
                    } else {
                        if !contiguous {
                            tracing::warn!(
                                path = %path.display(), position, offset = state.next_offset,
                                cut_bytes = file_size - position, %reason,
                                "truncating the log at the first invalid batch past the recovery point"
                            );
                        }
                        truncated_bytes += file_size - position;
                    }
                    file.truncate(position)
                        .await
                        .map_err(|e| LogError::io("truncate", &path, e))?;
                    if recycled {
                        // Synced by the activation's flush below, or by the
                        // indexes written after a cut; a marker that outlives
                        // a crash only quiets the next recovery's log line.
                        fsutil::remove(&marker).await?;
                    }
                    if !contiguous {
                        // Nothing after a cut is part of the log.
                        for &later in &bases[i + 1..] {
                            truncated_bytes += delete_segment_files(dir, later).await?;
                        }
                        let segment = Segment::from_state(dir, base, file, state);
                        segment.write_indexes().await?;
                        segments.insert(base, segment);
                        break;
                    }
                }
                let segment = Segment::from_state(dir, base, file.clone(), state);
                if next_base.is_some() {
                    segment.write_indexes().await?;
                }
                segments.insert(base, segment);
                i += 1;
                continue;
            }
        };
        segments.insert(base, Segment::from_state(dir, base, file, state));
        i += 1;
    }

    // An empty last segment that does not continue its predecessor's offsets
    // holds nothing of the log: the new segment of a truncate_fully_and_start_at
    // that crashed before its commit (or a roll past an offset gap whose first
    // batch never reached the disk). The log ends where the predecessor does.
    // (An empty last segment that does continue them, left by a crash during a
    // roll, is harmless and stays.)
    while segments.len() > 1 {
        let mut tail = segments.iter().rev();
        let (Some((&last_base, last)), Some((_, previous))) = (tail.next(), tail.next()) else {
            break;
        };
        if !last.is_empty() || previous.next_offset() >= last_base {
            break;
        }
        tracing::warn!(
            dir = %dir.display(), base = last_base, previous_end = previous.next_offset(),
            "removing an empty last segment that does not continue the log"
        );
        segments.remove(&last_base);
        delete_segment_files(dir, last_base).await?;
    }
    // The log ends below its checkpointed start: what it holds was deleted (a
    // DeleteRecords past the durable end, then a crash that lost the tail).
    // Kafka's LogLoader rule: it starts over, empty, at the checkpointed start,
    // so no offset below the start is ever served or given out again.
    let end = segments
        .values()
        .next_back()
        .map_or(0, Segment::next_offset);
    if !segments.is_empty() && end < checkpointed_start {
        tracing::warn!(
            dir = %dir.display(), log_end_offset = end, log_start_offset = checkpointed_start,
            "the log ends below its start: removing every segment and starting empty at the start"
        );
        for base in std::mem::take(&mut segments).into_keys() {
            delete_segment_files(dir, base).await?;
        }
    }
    // The log starts at its first segment, or later when records were deleted
    // inside it (DeleteRecords); never past the end.
    let first_base = segments.values().next().map_or(0, |s| s.base_offset());
    if segments.is_empty() {
        let start = first_base.max(recovery_point).max(checkpointed_start);
        let segment = Segment::create(dir, start, config, Growth::SMALL, None).await?;
        segments.insert(segment.base_offset(), segment);
    } else if let Some(last) = segments.values_mut().next_back() {
        last.activate(config).await?;
        last.flush().await?;
    }
    let log_end_offset = segments
        .values()
        .next_back()
        .map_or(0, Segment::next_offset);
    let log_start_offset = first_base.max(checkpointed_start).min(log_end_offset);
    let first_scanned = if clean_loaded {
        log_end_offset
    } else {
        bases
            .get(first_scanned)
            .copied()
            .filter(|b| segments.contains_key(b))
            .unwrap_or_else(|| segments.keys().next_back().copied().unwrap_or(0))
    };
    if clean.is_some() {
        // Not synced: the next checkpoint written here syncs the directory.
        fsutil::remove(&dir.join(checkpoint::CLEAN_SHUTDOWN_FILE)).await?;
    }
    // What recovery dropped (segments cut or removed) has no batches left.
    txn_batches.retain(|base, _| segments.contains_key(base));
    for (base, batches) in &mut txn_batches {
        if let Some(segment) = segments.get(base) {
            let end = segment.next_offset();
            batches.retain(|b| b.offset() < end);
        }
    }
    Ok(Recovered {
        segments,
        log_start_offset,
        log_end_offset,
        truncated_bytes,
        unwritten_bytes,
        recycled_bytes,
        scanned_bytes,
        first_scanned,
        txn_batches,
        free,
    })
}

/// A segment's `.log`, opened for DMA, and its size.
async fn open_segment_file(path: &Path) -> Result<(Rc<DmaFile>, u64)> {
    let file = Rc::new(fsutil::open_dma(path, false).await?);
    let size = file
        .file_size()
        .await
        .map_err(|e| LogError::io("stat", path, e))?;
    Ok((file, size))
}

/// Loads a trusted closed segment from its index files; `None` when they are
/// missing or disagree with the log (the caller rebuilds by scanning).
async fn load_closed_segment(
    dir: &Path,
    file: &DmaFile,
    path: &Path,
    base: i64,
    file_size: u64,
    config: &LogConfig,
) -> Result<Option<SegmentState>> {
    let Some(index_bytes) = fsutil::read_file(&segment_path(dir, base, INDEX_SUFFIX)).await? else {
        return Ok(None);
    };
    let Some(time_bytes) = fsutil::read_file(&segment_path(dir, base, TIME_INDEX_SUFFIX)).await?
    else {
        return Ok(None);
    };
    let Ok(offset_index) = OffsetIndex::decode(&index_bytes, file_size) else {
        tracing::warn!(path = %path.display(), "offset index inconsistent with the log; rebuilding");
        return Ok(None);
    };
    // Scan the tail after the last index entry to learn the next offset.
    let tail_start = offset_index
        .entries()
        .last()
        .map_or(0, |e| u64::from(e.position));
    let mut next_offset = base;
    let mut max_timestamp = -1;
    let mut bytes_after = 0u64;
    let outcome = scan(
        file,
        path,
        tail_start,
        file_size,
        SCAN_CHUNK_BYTES,
        |_, h, _| {
            next_offset = h.next_offset();
            max_timestamp = max_timestamp.max(h.max_timestamp);
            bytes_after += h.total_len() as u64;
            ControlFlow::Continue(())
        },
    )
    .await?;
    if !matches!(outcome.stop, ScanStop::End) {
        tracing::warn!(path = %path.display(), "closed segment does not end on a batch boundary; rescanning");
        return Ok(None);
    }
    let Ok(time_index) = TimeIndex::decode(&time_bytes, (next_offset - base).max(0) as u64) else {
        tracing::warn!(path = %path.display(), "time index inconsistent with the log; rebuilding");
        return Ok(None);
    };
    let max_timestamp = max_timestamp.max(time_index.last().map_or(-1, |e| e.timestamp));
    let txn_index = match fsutil::read_file(&segment_path(dir, base, TXN_INDEX_SUFFIX)).await? {
        None => TxnIndex::default(),
        Some(bytes) => match TxnIndex::decode(&bytes, base) {
            Ok(index) if index.entries().iter().all(|t| t.last_offset < next_offset) => index,
            Ok(_) => {
                tracing::warn!(path = %path.display(), "transaction index names offsets past the segment; rebuilding");
                return Ok(None);
            }
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "transaction index does not decode; rebuilding");
                return Ok(None);
            }
        },
    };
    let _ = config;
    Ok(Some(SegmentState {
        size: file_size,
        next_offset,
        max_timestamp,
        offset_index,
        time_index,
        bytes_since_index_entry: bytes_after,
        txn_index,
    }))
}

/// A cleaning interrupted by a crash (see `cleaner`): a `.cleaned` file was not
/// complete and goes; a `<base>-<end>.log.swap` file was (it is only ever made
/// from a synced, complete file), so the segments with base offsets in
/// `[base, end)` it replaces go and it becomes `<base>.log`. Indexes are left to
/// be rebuilt from the log.
pub async fn finish_interrupted_cleaning(dir: &Path) -> Result<()> {
    let mut swaps = Vec::new();
    let entries = std::fs::read_dir(dir).map_err(|e| LogError::io("list", dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| LogError::io("list", dir, e))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.ends_with(".log.cleaned") {
            tracing::info!(path = %entry.path().display(), "removing an unfinished cleaned segment");
            fsutil::remove(&entry.path()).await?;
        } else if let Some(range) = parse_swap_name(name) {
            swaps.push((range, entry.path()));
        }
    }
    if swaps.is_empty() {
        return Ok(());
    }
    swaps.sort_by_key(|(range, _)| *range);
    for ((base, end), swap) in swaps {
        tracing::info!(path = %swap.display(), "finishing an interrupted segment swap");
        for old in list_segments(dir)? {
            if old >= base && old < end {
                delete_segment_files(dir, old).await?;
            }
        }
        delete_segment_files(dir, base).await?;
        let log = segment_path(dir, base, LOG_SUFFIX);
        std::fs::rename(&swap, &log).map_err(|e| LogError::io("rename", &log, e))?;
    }
    fsutil::sync_dir(dir).await
}

/// Base offsets of the segments in `dir`, ascending. Leftover temporary files of
/// an interrupted atomic write are removed.
pub fn list_segments(dir: &Path) -> Result<Vec<i64>> {
    Ok(list(dir)?.bases)
}

/// What one listing of a partition directory found.
struct Listing {
    /// Segment base offsets, ascending.
    bases: Vec<i64>,
    /// Retired segment files kept for reuse (`<bound>.log.free`), as
    /// `(bound, path, size)`, lowest bound first.
    free: Vec<(i64, PathBuf, u64)>,
}

/// `list_segments`, and the free files beside them.
fn list(dir: &Path) -> Result<Listing> {
    let mut bases = Vec::new();
    let mut free = Vec::new();
    let entries = std::fs::read_dir(dir).map_err(|e| LogError::io("list", dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| LogError::io("list", dir, e))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.ends_with(".tmp") {
            let _ = std::fs::remove_file(entry.path());
            continue;
        }
        match parse_segment_name(name) {
            Some((base, LOG_SUFFIX)) => bases.push(base),
            Some((bound, FREE_SUFFIX)) => {
                let size = entry
                    .metadata()
                    .map_err(|e| LogError::io("stat", entry.path(), e))?
                    .len();
                free.push((bound, entry.path(), size));
            }
            _ => {}
        }
    }
    bases.sort_unstable();
    free.sort_unstable_by_key(|(bound, _, _)| *bound);
    Ok(Listing { bases, free })
}

async fn delete_segment_files(dir: &Path, base: i64) -> Result<u64> {
    let log = segment_path(dir, base, LOG_SUFFIX);
    let size = std::fs::metadata(&log).map_or(0, |m| m.len());
    // The `.log` last, as `Segment::delete` does.
    for suffix in SIDE_SUFFIXES.into_iter().chain([LOG_SUFFIX]) {
        fsutil::remove(&segment_path(dir, base, suffix)).await?;
    }
    Ok(size)
}
