//! `verify`: checks a partition directory, or every partition of a data directory,
//! against what the layout promises. One line per problem, written as found:
//!
//! ```text
//! DIR/orders-0/00000000000000000000.log: position 4096 offset 37: CRC mismatch: stored 0x1a2b3c4d, computed 0x5e6f7081
//! ```
//!
//! Per partition:
//! - every batch parses and its CRC matches; the zeros after the last batch are
//!   preallocation, anything else there is a torn or garbage tail;
//! - the first batch of a segment starts at or after the file name's base offset;
//!   offsets strictly increase and are contiguous (next base offset = previous last
//!   offset + 1) within and across segments (`compacted` allows gaps between batches
//!   and batches with fewer records than their offset span); partition leader epochs
//!   never go backwards and agree with `leader-epoch-checkpoint` (each batch's
//!   epoch is listed there, and the batch lies within that epoch's offsets);
//! - `.index` and `.timeindex` entries agree with the log ([`crate::index_check`]);
//! - `.txnindex` holds exactly the aborted transactions the log's markers end
//!   in that segment (recomputed by replaying the partition's transactional
//!   batches and markers from its first segment; not checked for compacted
//!   logs, whose cleaner may have removed records), and a segment whose log
//!   ends aborted transactions has one;
//! - `leader-epoch-checkpoint` parses, with increasing epochs and start offsets;
//! - `partition.metadata`, when present, names a topic id (`version: 0`,
//!   `topic_id: <base64>`);
//! - `recovery-point-offset-checkpoint` names this partition and does not point past
//!   the log end (data below the recovery point was flushed: it must be there).
//!
//! Per data directory: `meta.properties` exists and parses.
//!
//! After a CRC mismatch the batch's header is not trusted: the offset checks restart
//! at the next batch, so one damaged batch is one problem, not a cascade.
//! A damaged batch or tail says what the engine's recovery will do about it: below
//! the recovery point the data was flushed, and recovery keeps the partition
//! offline; at or past it, recovery truncates the log there.

use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};

use skiff_engine::batch::{decode_records, BatchHeader};
use skiff_engine::segment::index::{OFFSET_ENTRY_LEN, TIME_ENTRY_LEN};
use skiff_engine::segment::txn_index::{AbortedTxn, TxnIndex};
use skiff_engine::txn::TxnTracker;

use crate::checkpoint::{
    check_leader_epochs, parse_leader_epochs, parse_meta_properties, parse_recovery_points,
    EpochEntry, LineError,
};
use crate::dump_index::{read_offset_index, read_time_index};
use crate::index_check::{EntryReport, OffsetIndexCheck, TimeIndexCheck};
use crate::layout::{
    parse_partition_dir_name, segment_base_offset, segment_file_name, INDEX_EXT,
    LEADER_EPOCH_CHECKPOINT, LOG_EXT, META_PROPERTIES, RECOVERY_POINT_CHECKPOINT, TIME_INDEX_EXT,
    TXN_INDEX_EXT,
};
use crate::log_scan::{LogEnd, LogScanner, ScanMode, ScannedBatch, Step, Tail};
use crate::{ToolError, RECORDS_BYTES_MAX};

#[derive(Debug, Clone, Copy, Default)]
pub struct VerifyOptions {
    /// The partitions are compacted: offsets may skip between batches, and a batch
    /// may hold fewer records than its offset span.
    pub compacted: bool,
    /// Also decode every record (decompressing), not just headers and CRCs.
    pub deep: bool,
}

/// Where in a file a problem is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    File,
    /// A byte position in the file (a batch in a `.log`, an entry in an index) and
    /// the offset it concerns, when known.
    Position {
        position: u64,
        offset: Option<i64>,
    },
    /// A line of a text file (1-based).
    Line(usize),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub file: PathBuf,
    pub location: Location,
    pub what: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.file.display())?;
        match self.location {
            Location::File => {}
            Location::Position {
                position,
                offset: Some(offset),
            } => write!(f, "position {position} offset {offset}: ")?,
            Location::Position {
                position,
                offset: None,
            } => write!(f, "position {position}: ")?,
            Location::Line(line) => write!(f, "line {line}: ")?,
        }
        f.write_str(&self.what)
    }
}

/// What was checked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    pub partitions: u64,
    pub segments: u64,
    pub batches: u64,
    pub records: u64,
    /// Bytes of batches (preallocated zeros not counted).
    pub bytes: u64,
}

impl fmt::Display for Totals {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} partitions, {} segments, {} batches, {} records, {} bytes",
            self.partitions, self.segments, self.batches, self.records, self.bytes
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VerifyOutcome {
    pub totals: Totals,
    pub problems: u64,
}

impl VerifyOutcome {
    pub fn is_clean(&self) -> bool {
        self.problems == 0
    }
}

/// Writes problems out as they are found and counts them.
struct Findings<'a> {
    out: &'a mut dyn Write,
    problems: u64,
}

impl Findings<'_> {
    fn report(
        &mut self,
        file: &Path,
        location: Location,
        what: impl Into<String>,
    ) -> Result<(), ToolError> {
        let problem = Problem {
            file: file.to_path_buf(),
            location,
            what: what.into(),
        };
        writeln!(self.out, "{problem}")?;
        self.problems += 1;
        Ok(())
    }

    fn report_line(&mut self, file: &Path, error: LineError) -> Result<(), ToolError> {
        let location = match error.line {
            0 => Location::File,
            line => Location::Line(line),
        };
        self.report(file, location, error.message)
    }

    /// A file that cannot be read is a problem of the directory, not a reason to
    /// stop checking the rest of it.
    fn report_unreadable(&mut self, file: &Path, error: ToolError) -> Result<(), ToolError> {
        match error {
            ToolError::Io { source, .. } => {
                self.report(file, Location::File, format!("cannot read: {source}"))
            }
            ToolError::Output(e) => Err(ToolError::Output(e)),
            other => self.report(file, Location::File, other.to_string()),
        }
    }
}

/// Verifies `dir` (a partition directory or a data directory), writing one line per
/// problem to `out`, or one `OK: ...` line when there are none. Errors only when
/// `dir` itself cannot be read or is neither kind of directory, or `out` fails.
pub fn verify(
    dir: &Path,
    options: VerifyOptions,
    out: &mut dyn Write,
) -> Result<VerifyOutcome, ToolError> {
    let mut findings = Findings { out, problems: 0 };
    let mut totals = Totals::default();
    match classify(dir)? {
        DirKind::Partition => verify_partition(dir, options, &mut findings, &mut totals)?,
        DirKind::Data { partitions } => {
            verify_meta_properties(dir, &mut findings)?;
            for partition in partitions {
                verify_partition(&partition, options, &mut findings, &mut totals)?;
            }
        }
    }
    let outcome = VerifyOutcome {
        totals,
        problems: findings.problems,
    };
    if outcome.is_clean() {
        writeln!(findings.out, "OK: {totals}")?;
    }
    Ok(outcome)
}

enum DirKind {
    Partition,
    Data { partitions: Vec<PathBuf> },
}

struct DirEntry {
    name: String,
    path: PathBuf,
    is_dir: bool,
}

/// The entries of `dir`, sorted by name.
fn list_dir(dir: &Path) -> Result<Vec<DirEntry>, ToolError> {
    let mut entries = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| ToolError::io(dir, e))? {
        let entry = entry.map_err(|e| ToolError::io(dir, e))?;
        let path = entry.path();
        entries.push(DirEntry {
            name: entry.file_name().to_string_lossy().into_owned(),
            is_dir: path.is_dir(),
            path,
        });
    }
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(entries)
}

/// A data directory holds `meta.properties` or partition directories; a partition
/// directory holds segments or checkpoints (or, when empty, has a
/// `<topic>-<partition>` name). A stray `server.log` does not make a data directory
/// a partition: only segment-named files count.
fn classify(dir: &Path) -> Result<DirKind, ToolError> {
    let entries = list_dir(dir)?;
    let has_meta = entries
        .iter()
        .any(|e| !e.is_dir && e.name == META_PROPERTIES);
    let is_partition_file = |e: &DirEntry| {
        !e.is_dir
            && (segment_base_offset(&e.path).is_some()
                || e.name == LEADER_EPOCH_CHECKPOINT
                || e.name == RECOVERY_POINT_CHECKPOINT)
    };
    let has_partition_files = entries.iter().any(is_partition_file);
    let partitions: Vec<PathBuf> = entries
        .into_iter()
        .filter(|e| e.is_dir && parse_partition_dir_name(&e.name).is_some())
        // The controller's metadata log (dump-metadata reads it).
        .filter(|e| !skiff_engine::shard::NOT_PARTITION_DIRS.contains(&e.name.as_str()))
        .map(|e| e.path)
        .collect();
    if has_meta || !partitions.is_empty() {
        return Ok(DirKind::Data { partitions });
    }
    if has_partition_files || dir_partition(dir).is_some() {
        return Ok(DirKind::Partition);
    }
    Err(ToolError::NotDataDir {
        path: dir.to_path_buf(),
    })
}

/// The (topic, partition) a directory's name gives, if it is a partition name.
fn dir_partition(dir: &Path) -> Option<(String, u32)> {
    let name = dir.canonicalize().ok()?.file_name()?.to_str()?.to_owned();
    parse_partition_dir_name(&name).map(|(topic, partition)| (topic.to_owned(), partition))
}

fn verify_meta_properties(dir: &Path, findings: &mut Findings<'_>) -> Result<(), ToolError> {
    let path = dir.join(META_PROPERTIES);
    match std::fs::read_to_string(&path) {
        Ok(text) => match parse_meta_properties(&text) {
            Ok(_) => Ok(()),
            Err(e) => findings.report_line(&path, e),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => findings.report(
            &path,
            Location::File,
            "missing: every data directory has one",
        ),
        Err(e) => findings.report_unreadable(&path, ToolError::io(&path, e)),
    }
}

/// Which files a segment has.
#[derive(Debug, Default)]
struct SegmentFiles {
    log: bool,
    index: bool,
    time_index: bool,
    txn_index: bool,
}

/// Carried from batch to batch and segment to segment of one partition.
#[derive(Debug, Default)]
struct PartitionState {
    /// The offset the next batch must start at; `None` at the start and after a
    /// batch whose header cannot be trusted.
    expected_offset: Option<i64>,
    epoch_last: Option<i32>,
    /// `leader-epoch-checkpoint`, when it parses: every epoch the log's batches
    /// carry was recorded there before the batch was written.
    epochs: Option<Vec<EpochEntry>>,
    /// Next offset after the last batch with a valid CRC (or the last segment's base).
    log_end_offset: Option<i64>,
    /// From `recovery-point-offset-checkpoint`: says what recovery will do about a
    /// damaged batch.
    recovery_point: Option<i64>,
    /// The partition's transactions replayed from its first segment.
    txns: TxnTracker,
}

impl PartitionState {
    /// What the engine's recovery does with a damaged batch or tail at `offset`:
    /// below the recovery point the data was flushed, so it refuses to cut it.
    fn recovery_note(&self, offset: Option<i64>) -> String {
        match (self.recovery_point, offset) {
            (Some(rp), Some(offset)) if offset < rp => format!(
                "; below the recovery point {rp}: flushed data is damaged, recovery keeps the partition offline"
            ),
            (Some(rp), Some(_)) => {
                format!("; at or past the recovery point {rp}: recovery truncates the log here")
            }
            _ => String::new(),
        }
    }
}

fn verify_partition(
    dir: &Path,
    options: VerifyOptions,
    findings: &mut Findings<'_>,
    totals: &mut Totals,
) -> Result<(), ToolError> {
    totals.partitions += 1;
    // A partition the cleaner has worked on is compacted whatever the flag says.
    let options = VerifyOptions {
        compacted: options.compacted
            || dir
                .join(skiff_engine::checkpoint::CLEANER_CHECKPOINT_FILE)
                .exists(),
        ..options
    };
    let entries = match list_dir(dir) {
        Ok(entries) => entries,
        Err(e) => return findings.report_unreadable(dir, e),
    };
    let mut segments = std::collections::BTreeMap::<i64, SegmentFiles>::new();
    for entry in entries.iter().filter(|e| !e.is_dir) {
        let ext = entry
            .path
            .extension()
            .and_then(|e| e.to_str())
            .unwrap_or("");
        if ![LOG_EXT, INDEX_EXT, TIME_INDEX_EXT, TXN_INDEX_EXT].contains(&ext) {
            continue;
        }
        let Some(base_offset) = segment_base_offset(&entry.path) else {
            findings.report(
                &entry.path,
                Location::File,
                "not a segment file name (expected a 20-digit base offset)",
            )?;
            continue;
        };
        let files = segments.entry(base_offset).or_default();
        match ext {
            LOG_EXT => files.log = true,
            INDEX_EXT => files.index = true,
            TXN_INDEX_EXT => files.txn_index = true,
            _ => files.time_index = true,
        }
    }
    for (&base_offset, files) in segments.iter().filter(|(_, f)| !f.log) {
        for (present, ext) in [
            (files.index, INDEX_EXT),
            (files.time_index, TIME_INDEX_EXT),
            (files.txn_index, TXN_INDEX_EXT),
        ] {
            if present {
                let path = dir.join(segment_file_name(base_offset, ext));
                findings.report(&path, Location::File, "index without a .log segment")?;
            }
        }
    }
    let mut state = PartitionState {
        recovery_point: recovery_point_of(dir),
        epochs: std::fs::read_to_string(dir.join(LEADER_EPOCH_CHECKPOINT))
            .ok()
            .and_then(|text| parse_leader_epochs(&text).ok()),
        ..PartitionState::default()
    };
    for (&base_offset, files) in segments.iter().filter(|(_, f)| f.log) {
        totals.segments += 1;
        if let Some(log_end_offset) = state.log_end_offset {
            if base_offset < log_end_offset {
                findings.report(
                    &dir.join(segment_file_name(base_offset, LOG_EXT)),
                    Location::File,
                    format!("segment base offset {base_offset} is below the end of the previous segment (offset {log_end_offset})"),
                )?;
            }
        }
        verify_segment(
            dir,
            base_offset,
            files,
            options,
            &mut state,
            findings,
            totals,
        )?;
    }
    verify_leader_epochs(dir, findings)?;
    verify_partition_metadata(dir, findings)?;
    verify_recovery_point(dir, state.log_end_offset, findings)
}

fn verify_segment(
    dir: &Path,
    base_offset: i64,
    files: &SegmentFiles,
    options: VerifyOptions,
    state: &mut PartitionState,
    findings: &mut Findings<'_>,
    totals: &mut Totals,
) -> Result<(), ToolError> {
    let log_path = dir.join(segment_file_name(base_offset, LOG_EXT));
    let index_path = dir.join(segment_file_name(base_offset, INDEX_EXT));
    let time_index_path = dir.join(segment_file_name(base_offset, TIME_INDEX_EXT));
    let mut index = None;
    if files.index {
        match read_offset_index(&index_path) {
            Ok(file) => {
                report_trailing(
                    &index_path,
                    file.entries.len() * OFFSET_ENTRY_LEN,
                    file.trailing_bytes,
                    findings,
                )?;
                index = Some(OffsetIndexCheck::new(base_offset, file.entries));
            }
            Err(e) => findings.report_unreadable(&index_path, e)?,
        }
    }
    let mut time_index = None;
    if files.time_index {
        match read_time_index(&time_index_path) {
            Ok(file) => {
                report_trailing(
                    &time_index_path,
                    file.entries.len() * TIME_ENTRY_LEN,
                    file.trailing_bytes,
                    findings,
                )?;
                time_index = Some(TimeIndexCheck::new(base_offset, file.entries));
            }
            Err(e) => findings.report_unreadable(&time_index_path, e)?,
        }
    }

    state.log_end_offset = Some(
        state
            .log_end_offset
            .map_or(base_offset, |end| end.max(base_offset)),
    );
    let mut txns = std::mem::take(&mut state.txns);
    let mut aborted: Vec<AbortedTxn> = Vec::new();
    let mut bad_markers: Vec<(u64, i64, String)> = Vec::new();
    let end = scan_segment(
        &log_path,
        base_offset,
        options,
        state,
        findings,
        totals,
        |batch| {
            if let Some(check) = &mut index {
                check.observe(batch.position, &batch.header);
            }
            if let Some(check) = &mut time_index {
                check.observe(&batch.header);
            }
            if batch.crc_valid() && !batch.bytes.is_empty() {
                match txns.replay(&batch.header, &batch.bytes) {
                    Ok(Some(txn)) => aborted.push(txn),
                    Ok(None) => {}
                    Err(e) => bad_markers.push((
                        batch.position,
                        batch.header.base_offset,
                        format!("malformed control batch: {e}"),
                    )),
                }
            }
        },
    )?;
    state.txns = txns;
    for (position, offset, problem) in bad_markers {
        findings.report(
            &log_path,
            Location::Position {
                position,
                offset: Some(offset),
            },
            problem,
        )?;
    }
    let end = match end {
        Some(end) => end,
        // Unreadable log (already reported): its indexes cannot be checked.
        None => return Ok(()),
    };
    if !options.compacted {
        verify_txn_index(dir, base_offset, files.txn_index, &aborted, findings)?;
    }
    if let Tail::Garbage {
        position,
        bytes,
        reason,
    } = &end.tail
    {
        findings.report(
            &log_path,
            Location::Position {
                position: *position,
                offset: state.expected_offset,
            },
            format!(
                "torn or garbage tail: {bytes} bytes ({reason}){}",
                state.recovery_note(state.expected_offset)
            ),
        )?;
    }
    if let Some(check) = index {
        report_entries(
            &index_path,
            OFFSET_ENTRY_LEN,
            check.finish(Some(end.data_end)),
            findings,
        )?;
    }
    if let Some(check) = time_index {
        report_entries(
            &time_index_path,
            TIME_ENTRY_LEN,
            check.finish(true),
            findings,
        )?;
    }
    Ok(())
}

/// The segment's `.txnindex` against the aborted transactions its markers
/// end (`aborted`, recomputed from the log).
fn verify_txn_index(
    dir: &Path,
    base_offset: i64,
    present: bool,
    aborted: &[AbortedTxn],
    findings: &mut Findings<'_>,
) -> Result<(), ToolError> {
    let path = dir.join(segment_file_name(base_offset, TXN_INDEX_EXT));
    if !present {
        if !aborted.is_empty() {
            findings.report(
                &path,
                Location::File,
                format!(
                    "missing: the log's markers end {} aborted transaction(s) in this segment",
                    aborted.len()
                ),
            )?;
        }
        return Ok(());
    }
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) => return findings.report_unreadable(&path, ToolError::io(&path, e)),
    };
    let index = match TxnIndex::decode(&bytes, base_offset) {
        Ok(index) => index,
        Err(e) => return findings.report(&path, Location::File, e.to_string()),
    };
    if index.entries() != aborted {
        let first = index
            .entries()
            .iter()
            .zip(aborted)
            .position(|(a, b)| a != b)
            .unwrap_or(index.entries().len().min(aborted.len()));
        findings.report(
            &path,
            Location::File,
            format!(
                "holds {} aborted transaction(s), the log's markers end {} here; first difference at entry {first}: index {:?}, log {:?}",
                index.entries().len(),
                aborted.len(),
                index.entries().get(first),
                aborted.get(first)
            ),
        )?;
    }
    Ok(())
}

fn report_trailing(
    path: &Path,
    whole_len: usize,
    trailing_bytes: usize,
    findings: &mut Findings<'_>,
) -> Result<(), ToolError> {
    if trailing_bytes == 0 {
        return Ok(());
    }
    findings.report(
        path,
        Location::Position {
            position: whole_len as u64,
            offset: None,
        },
        format!("{trailing_bytes} trailing bytes do not make a whole entry"),
    )
}

fn report_entries<E>(
    path: &Path,
    entry_len: usize,
    reports: Vec<EntryReport<E>>,
    findings: &mut Findings<'_>,
) -> Result<(), ToolError> {
    for (i, report) in reports.into_iter().enumerate() {
        for what in report.problems {
            let location = Location::Position {
                position: (i * entry_len) as u64,
                offset: Some(report.offset),
            };
            findings.report(path, location, format!("index entry {i}: {what}"))?;
        }
    }
    Ok(())
}

/// Walks one `.log`, checking every batch and handing it to `observe`. `None` if the
/// log could not be read (reported).
#[allow(clippy::too_many_arguments)]
fn scan_segment(
    log_path: &Path,
    base_offset: i64,
    options: VerifyOptions,
    state: &mut PartitionState,
    findings: &mut Findings<'_>,
    totals: &mut Totals,
    mut observe: impl FnMut(&ScannedBatch),
) -> Result<Option<LogEnd>, ToolError> {
    let mut scanner = match LogScanner::open(log_path, ScanMode::Full) {
        Ok(scanner) => scanner,
        Err(e) => {
            findings.report_unreadable(log_path, e)?;
            return Ok(None);
        }
    };
    loop {
        let batch = match scanner.step() {
            Ok(Step::Batch(batch)) => batch,
            Ok(Step::End(end)) => return Ok(Some(end)),
            Err(e) => {
                findings.report_unreadable(log_path, e)?;
                return Ok(None);
            }
        };
        totals.batches += 1;
        totals.bytes += batch.size();
        observe(&batch);
        check_batch(
            log_path,
            base_offset,
            &batch,
            options,
            state,
            findings,
            totals,
        )?;
    }
}

fn check_batch(
    log_path: &Path,
    base_offset: i64,
    batch: &ScannedBatch,
    options: VerifyOptions,
    state: &mut PartitionState,
    findings: &mut Findings<'_>,
    totals: &mut Totals,
) -> Result<(), ToolError> {
    let h = &batch.header;
    let location = Location::Position {
        position: batch.position,
        offset: Some(h.base_offset),
    };
    let mut report = |what: String| findings.report(log_path, location.clone(), what);
    if let Some(Err(e)) = &batch.crc {
        // Nothing in the header is trusted now; offsets are checked again from the
        // next batch on.
        state.expected_offset = None;
        return report(format!("{e}{}", state.recovery_note(Some(h.base_offset))));
    }
    totals.records += u64::try_from(h.records_count).unwrap_or(0);
    for what in header_problems(h, base_offset, options) {
        report(what)?;
    }
    if let Some(expected) = state.expected_offset {
        if h.base_offset < expected {
            report(format!(
                "offsets go backwards: base offset {} but the previous batch ended at offset {}",
                h.base_offset,
                expected.wrapping_sub(1)
            ))?;
        } else if h.base_offset > expected && !options.compacted {
            report(format!(
                "offset gap: expected base offset {expected} (the previous batch ended at offset {})",
                expected.wrapping_sub(1)
            ))?;
        }
    }
    if let Some(what) = state.epochs.as_deref().and_then(|e| epoch_problem(e, h)) {
        report(what)?;
    }
    if let Some(epoch_last) = state.epoch_last {
        if h.partition_leader_epoch < epoch_last {
            report(format!(
                "partition leader epoch {} goes backwards (previous batch: {epoch_last})",
                h.partition_leader_epoch
            ))?;
        }
    }
    if options.deep {
        if let Some(what) = record_problem(batch) {
            report(what)?;
        }
    }
    state.expected_offset = Some(h.next_offset());
    state.epoch_last = Some(h.partition_leader_epoch);
    state.log_end_offset = Some(h.next_offset());
    Ok(())
}

/// Whether the batch's partition leader epoch (outside the CRC) agrees with the
/// leader-epoch checkpoint: the epoch is there, and the batch lies between its start
/// offset and the next epoch's. Epochs older than the first entry are not checked:
/// the checkpoint may have been cut at the log start.
fn epoch_problem(epochs: &[EpochEntry], h: &BatchHeader) -> Option<String> {
    let epoch = h.partition_leader_epoch;
    let first = epochs.first()?;
    if epoch < 0 || epoch < first.epoch {
        return None;
    }
    let Some(i) = epochs.iter().position(|e| e.epoch == epoch) else {
        return Some(format!(
            "partition leader epoch {epoch} is not in {LEADER_EPOCH_CHECKPOINT}"
        ));
    };
    let entry = epochs[i];
    if i > 0 && h.base_offset < entry.start_offset {
        return Some(format!(
            "partition leader epoch {epoch}, but {LEADER_EPOCH_CHECKPOINT} has it start at offset {}",
            entry.start_offset
        ));
    }
    match epochs.get(i + 1) {
        Some(next) if h.base_offset >= next.start_offset => Some(format!(
            "partition leader epoch {epoch}, but {LEADER_EPOCH_CHECKPOINT} has epoch {} start at offset {}",
            next.epoch, next.start_offset
        )),
        _ => None,
    }
}

/// What the header alone says is wrong (the CRC having matched).
fn header_problems(h: &BatchHeader, base_offset: i64, options: VerifyOptions) -> Vec<String> {
    let mut problems = Vec::new();
    if let Err(e) = h.compression() {
        problems.push(e.to_string());
    }
    let span = i64::from(h.last_offset_delta) + 1;
    if h.last_offset_delta < 0 {
        problems.push(format!(
            "negative last offset delta {}",
            h.last_offset_delta
        ));
    } else if h.records_count < 0 || i64::from(h.records_count) > span {
        problems.push(format!(
            "record count {} does not fit the batch's {span} offsets",
            h.records_count
        ));
    } else if i64::from(h.records_count) != span && !options.compacted {
        problems.push(format!(
            "record count {} but the batch spans {span} offsets (only compaction removes records)",
            h.records_count
        ));
    }
    // -1 is "no epoch" (a batch never stamped by a leader); below that is damage.
    if h.partition_leader_epoch < -1 {
        problems.push(format!(
            "invalid partition leader epoch {}",
            h.partition_leader_epoch
        ));
    }
    if h.base_offset < base_offset {
        problems.push(format!(
            "base offset {} is below the segment's base offset {base_offset}",
            h.base_offset
        ));
    }
    problems
}

/// Decodes the records; what is wrong with them, if anything.
fn record_problem(batch: &ScannedBatch) -> Option<String> {
    let records = match decode_records(&batch.bytes, RECORDS_BYTES_MAX) {
        Ok(records) => records,
        Err(e) => return Some(format!("records do not decode: {e}")),
    };
    let (first, last) = (batch.header.base_offset, batch.header.last_offset());
    let mut previous: Option<i64> = None;
    for record in &records {
        if record.offset < first
            || record.offset > last
            || previous.is_some_and(|p| record.offset <= p)
        {
            return Some(format!(
                "record offset {} is out of order or outside the batch's offsets {first}..={last}",
                record.offset
            ));
        }
        previous = Some(record.offset);
    }
    None
}

fn read_optional(path: &Path, findings: &mut Findings<'_>) -> Result<Option<String>, ToolError> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => {
            findings.report_unreadable(path, ToolError::io(path, e))?;
            Ok(None)
        }
    }
}

fn verify_leader_epochs(dir: &Path, findings: &mut Findings<'_>) -> Result<(), ToolError> {
    let path = dir.join(LEADER_EPOCH_CHECKPOINT);
    let Some(text) = read_optional(&path, findings)? else {
        return Ok(());
    };
    match parse_leader_epochs(&text) {
        Ok(entries) => {
            for problem in check_leader_epochs(&entries) {
                findings.report_line(&path, problem)?;
            }
            Ok(())
        }
        Err(e) => findings.report_line(&path, e),
    }
}

/// `partition.metadata`, when there is one (directories from before skiff
/// wrote it have none), names a topic id in Kafka's format.
fn verify_partition_metadata(dir: &Path, findings: &mut Findings<'_>) -> Result<(), ToolError> {
    use skiff_engine::partition_meta::{decode, PARTITION_METADATA_FILE};
    let path = dir.join(PARTITION_METADATA_FILE);
    let Some(text) = read_optional(&path, findings)? else {
        return Ok(());
    };
    match decode(&path, &text) {
        Ok(_) => Ok(()),
        Err(skiff_engine::LogError::Checkpoint { reason, .. }) => {
            findings.report(&path, Location::File, reason)
        }
        Err(e) => findings.report(&path, Location::File, e.to_string()),
    }
}

/// This partition's recovery point, if the checkpoint parses and names it (problems
/// with the file are reported by [`verify_recovery_point`]).
fn recovery_point_of(dir: &Path) -> Option<i64> {
    let text = std::fs::read_to_string(dir.join(RECOVERY_POINT_CHECKPOINT)).ok()?;
    let points = parse_recovery_points(&text).ok()?;
    let this_partition = dir_partition(dir);
    points
        .iter()
        .find(|p| {
            this_partition.as_ref().is_none_or(|(topic, partition)| {
                (p.topic.as_str(), p.partition) == (topic.as_str(), *partition)
            })
        })
        .map(|p| p.offset)
}

fn verify_recovery_point(
    dir: &Path,
    log_end_offset: Option<i64>,
    findings: &mut Findings<'_>,
) -> Result<(), ToolError> {
    let path = dir.join(RECOVERY_POINT_CHECKPOINT);
    let Some(text) = read_optional(&path, findings)? else {
        return Ok(());
    };
    let points = match parse_recovery_points(&text) {
        Ok(points) => points,
        Err(e) => return findings.report_line(&path, e),
    };
    let this_partition = dir_partition(dir);
    for point in points {
        let location = Location::Line(point.line);
        if let Some((topic, partition)) = &this_partition {
            if (point.topic.as_str(), point.partition) != (topic.as_str(), *partition) {
                findings.report(
                    &path,
                    location.clone(),
                    format!(
                        "entry for {}-{}, but this is the directory of {topic}-{partition}",
                        point.topic, point.partition
                    ),
                )?;
                continue;
            }
        }
        if point.offset < 0 {
            findings.report(
                &path,
                location,
                format!("negative recovery point {}", point.offset),
            )?;
        } else if let Some(end) = log_end_offset.filter(|&end| point.offset > end) {
            findings.report(
                &path,
                location,
                format!(
                    "recovery point {} is past the log end offset {end}: data below it was flushed and is now missing",
                    point.offset
                ),
            )?;
        }
    }
    Ok(())
}
