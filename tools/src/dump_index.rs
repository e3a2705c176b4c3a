//! `dump-index`, `dump-timeindex` and `dump-txnindex`: index entries with
//! absolute offsets, each checked against the sibling `.log` (see
//! [`crate::index_check`]; the aborted transaction index in [`dump_txn_index`]).
//!
//! ```text
//! Dumping 00000000000000000000.index
//! offset: 0 position: 0
//! offset: 42 position: 4121
//! offset: 97 position: 900000 <- PROBLEM: points past the log (position 900000 >= log data size 8304)
//! ```
//!
//! `.timeindex` lines read `timestamp: T offset: O`. With `json`, one object per
//! line: `file`, then `entry` objects with a `problems` array, and `trailingBytes`
//! when the file is not a whole number of entries.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::Serialize;
use skiff_engine::segment::index::{
    decode_offset_entries, decode_time_entries, IndexError, OffsetEntry, TimeEntry,
    OFFSET_ENTRY_LEN, TIME_ENTRY_LEN,
};
use skiff_engine::segment::txn_index::{decode_txn_entries, AbortedTxn, TXN_ENTRY_LEN};

use crate::index_check::{EntryReport, OffsetIndexCheck, TimeIndexCheck};
use crate::layout::{segment_base_offset, INDEX_EXT, LOG_EXT, TIME_INDEX_EXT, TXN_INDEX_EXT};
use crate::log_scan::{LogScanner, ScanMode, Step};
use crate::ToolError;

/// An index file's whole entries and the length of any partial entry at its end.
pub struct IndexFile<E> {
    pub entries: Vec<E>,
    pub trailing_bytes: usize,
}

fn read_index<E>(
    path: &Path,
    entry_len: usize,
    decode: fn(&[u8]) -> Result<Vec<E>, IndexError>,
) -> Result<IndexFile<E>, ToolError> {
    let bytes = std::fs::read(path).map_err(|e| ToolError::io(path, e))?;
    let whole = bytes.len() - bytes.len() % entry_len;
    // `whole` is a multiple of the entry size, the only thing decode checks.
    let entries = decode(&bytes[..whole]).map_err(|source| ToolError::Index {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(IndexFile {
        entries,
        trailing_bytes: bytes.len() - whole,
    })
}

pub fn read_offset_index(path: &Path) -> Result<IndexFile<OffsetEntry>, ToolError> {
    read_index(path, OFFSET_ENTRY_LEN, decode_offset_entries)
}

pub fn read_time_index(path: &Path) -> Result<IndexFile<TimeEntry>, ToolError> {
    read_index(path, TIME_ENTRY_LEN, decode_time_entries)
}

pub fn read_txn_index(path: &Path) -> Result<IndexFile<AbortedTxn>, ToolError> {
    read_index(path, TXN_ENTRY_LEN, decode_txn_entries)
}

fn base_offset_of(path: &Path, expected_ext: &'static str) -> Result<i64, ToolError> {
    segment_base_offset(path).ok_or_else(|| ToolError::NotSegmentName {
        path: path.to_path_buf(),
        expected_ext,
    })
}

/// Walks the sibling log (headers only), feeding each batch to `observe`; returns
/// the log's data size, or `None` if there is no sibling log.
fn walk_sibling_log(
    index_path: &Path,
    mut observe: impl FnMut(u64, &skiff_engine::batch::BatchHeader),
) -> Result<Option<(PathBuf, u64)>, ToolError> {
    let log_path = index_path.with_extension(LOG_EXT);
    if !log_path.exists() {
        return Ok(None);
    }
    let mut scanner = LogScanner::open(&log_path, ScanMode::HeadersOnly)?;
    loop {
        match scanner.step()? {
            Step::Batch(batch) => observe(batch.position, &batch.header),
            Step::End(end) => return Ok(Some((log_path, end.data_end))),
        }
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct FileLine {
    #[serde(rename = "type")]
    kind: &'static str,
    file: String,
    base_offset: i64,
    /// The log the entries were checked against, if there is one.
    log: Option<String>,
    log_data_size: Option<u64>,
}

#[derive(Serialize)]
struct OffsetEntryLine<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    offset: i64,
    position: u32,
    problems: &'a [String],
}

#[derive(Serialize)]
struct TimeEntryLine<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    timestamp: i64,
    offset: i64,
    problems: &'a [String],
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct TxnEntryLine<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    producer_id: i64,
    first_offset: i64,
    last_offset: i64,
    last_stable_offset: i64,
    problems: &'a [String],
}

#[derive(Serialize)]
struct TrailingBytesLine {
    #[serde(rename = "type")]
    kind: &'static str,
    position: usize,
    bytes: usize,
}

fn write_json(out: &mut dyn Write, value: &impl Serialize) -> Result<(), ToolError> {
    serde_json::to_writer(&mut *out, value).map_err(std::io::Error::from)?;
    writeln!(out)?;
    Ok(())
}

fn write_header(
    out: &mut dyn Write,
    json: bool,
    path: &Path,
    base_offset: i64,
    log: &Option<(PathBuf, u64)>,
) -> Result<(), ToolError> {
    if json {
        return write_json(
            out,
            &FileLine {
                kind: "file",
                file: path.display().to_string(),
                base_offset,
                log: log.as_ref().map(|(p, _)| p.display().to_string()),
                log_data_size: log.as_ref().map(|(_, size)| *size),
            },
        );
    }
    writeln!(out, "Dumping {}", path.display())?;
    if log.is_none() {
        writeln!(
            out,
            "(no {} beside it: entries are not checked against the log)",
            path.with_extension(LOG_EXT).display()
        )?;
    }
    Ok(())
}

fn write_problems(out: &mut dyn Write, problems: &[String]) -> Result<(), ToolError> {
    if problems.is_empty() {
        writeln!(out)?;
    } else {
        writeln!(out, " <- PROBLEM: {}", problems.join("; "))?;
    }
    Ok(())
}

fn write_trailing(
    out: &mut dyn Write,
    json: bool,
    whole_len: usize,
    trailing_bytes: usize,
) -> Result<(), ToolError> {
    if trailing_bytes == 0 {
        return Ok(());
    }
    if json {
        return write_json(
            out,
            &TrailingBytesLine {
                kind: "trailingBytes",
                position: whole_len,
                bytes: trailing_bytes,
            },
        );
    }
    writeln!(
        out,
        "position: {whole_len} <- PROBLEM: {trailing_bytes} trailing bytes do not make a whole entry"
    )?;
    Ok(())
}

/// Dumps an `.index` file. Returns true when no entry was flagged.
pub fn dump_offset_index(path: &Path, json: bool, out: &mut dyn Write) -> Result<bool, ToolError> {
    let base_offset = base_offset_of(path, INDEX_EXT)?;
    let index = read_offset_index(path)?;
    let mut check = OffsetIndexCheck::new(base_offset, index.entries);
    let log = walk_sibling_log(path, |position, header| check.observe(position, header))?;
    let reports: Vec<EntryReport<OffsetEntry>> = check.finish(log.as_ref().map(|(_, size)| *size));
    write_header(out, json, path, base_offset, &log)?;
    for r in &reports {
        if json {
            write_json(
                out,
                &OffsetEntryLine {
                    kind: "entry",
                    offset: r.offset,
                    position: r.entry.position,
                    problems: &r.problems,
                },
            )?;
        } else {
            write!(out, "offset: {} position: {}", r.offset, r.entry.position)?;
            write_problems(out, &r.problems)?;
        }
    }
    write_trailing(
        out,
        json,
        reports.len() * OFFSET_ENTRY_LEN,
        index.trailing_bytes,
    )?;
    Ok(index.trailing_bytes == 0 && reports.iter().all(|r| r.problems.is_empty()))
}

/// Dumps a `.timeindex` file. Returns true when no entry was flagged.
pub fn dump_time_index(path: &Path, json: bool, out: &mut dyn Write) -> Result<bool, ToolError> {
    let base_offset = base_offset_of(path, TIME_INDEX_EXT)?;
    let index = read_time_index(path)?;
    let mut check = TimeIndexCheck::new(base_offset, index.entries);
    let log = walk_sibling_log(path, |_, header| check.observe(header))?;
    let reports = check.finish(log.is_some());
    write_header(out, json, path, base_offset, &log)?;
    for r in &reports {
        if json {
            write_json(
                out,
                &TimeEntryLine {
                    kind: "entry",
                    timestamp: r.entry.timestamp,
                    offset: r.offset,
                    problems: &r.problems,
                },
            )?;
        } else {
            write!(out, "timestamp: {} offset: {}", r.entry.timestamp, r.offset)?;
            write_problems(out, &r.problems)?;
        }
    }
    write_trailing(
        out,
        json,
        reports.len() * TIME_ENTRY_LEN,
        index.trailing_bytes,
    )?;
    Ok(index.trailing_bytes == 0 && reports.iter().all(|r| r.problems.is_empty()))
}

/// Dumps a `.txnindex` file (Kafka's `AbortedTxn` lines). Each entry is
/// checked on its own (it ends in this segment, begins no later than it
/// ends, comes after the previous one) and against the sibling log's batch
/// headers (a control batch of its producer at its last offset); `verify`
/// recomputes the whole index from the partition's markers. Returns true
/// when no entry was flagged.
pub fn dump_txn_index(path: &Path, json: bool, out: &mut dyn Write) -> Result<bool, ToolError> {
    let base_offset = base_offset_of(path, TXN_INDEX_EXT)?;
    let index = read_txn_index(path)?;
    let mut controls = std::collections::BTreeSet::new();
    let log = walk_sibling_log(path, |_, header| {
        if header.is_control() {
            controls.insert((header.base_offset, header.producer_id));
        }
    })?;
    write_header(out, json, path, base_offset, &log)?;
    let mut clean = index.trailing_bytes == 0;
    let mut previous_last = None;
    for txn in &index.entries {
        let mut problems = Vec::new();
        if txn.last_offset < base_offset {
            problems.push(format!(
                "ends before the segment (base offset {base_offset})"
            ));
        }
        if txn.first_offset > txn.last_offset {
            problems.push("begins after it ends".to_string());
        }
        if previous_last.is_some_and(|last| txn.last_offset < last) {
            problems.push("ends before the previous entry".to_string());
        }
        if log.is_some() && !controls.contains(&(txn.last_offset, txn.producer_id)) {
            problems.push(format!(
                "no control batch of producer {} at offset {} in the log",
                txn.producer_id, txn.last_offset
            ));
        }
        previous_last = Some(txn.last_offset);
        clean &= problems.is_empty();
        if json {
            write_json(
                out,
                &TxnEntryLine {
                    kind: "entry",
                    producer_id: txn.producer_id,
                    first_offset: txn.first_offset,
                    last_offset: txn.last_offset,
                    last_stable_offset: txn.last_stable_offset,
                    problems: &problems,
                },
            )?;
        } else {
            write!(
                out,
                "version: 0 producerId: {} firstOffset: {} lastOffset: {} lastStableOffset: {}",
                txn.producer_id, txn.first_offset, txn.last_offset, txn.last_stable_offset
            )?;
            write_problems(out, &problems)?;
        }
    }
    write_trailing(
        out,
        json,
        index.entries.len() * TXN_ENTRY_LEN,
        index.trailing_bytes,
    )?;
    Ok(clean)
}
