//! `dump-log`: a `.log` segment as text, in kafka-dump-log's words, or as NDJSON.
//!
//! Text (one line per batch; with `deep`, one `|` line per record after it):
//!
//! ```text
//! Dumping 00000000000000000000.log
//! Log starting offset: 0
//! baseOffset: 0 lastOffset: 2 count: 3 baseSequence: -1 lastSequence: -1 producerId: -1 producerEpoch: -1 partitionLeaderEpoch: 0 isTransactional: false isControl: false position: 0 CreateTime: 1002 size: 94 magic: 2 compresscodec: none crc: 2143540327 isvalid: true
//! | offset: 0 CreateTime: 1000 keySize: 1 valueSize: 5 sequence: -1 headerKeys: [] key: k payload: hello
//! trailing zero bytes (preallocated) at position 94: 4002 bytes
//! ```
//!
//! JSON: one object per line, tagged by `"type"`: `file`, `batch` (the same fields,
//! `timestampType` + `maxTimestamp` for Kafka's `CreateTime: N`), `record`,
//! `recordsError`, and a final `end` with the tail. Keys and values are text when
//! printable UTF-8, else `0x` hex; `null` when absent (text output prints `null`).

use std::io::Write;
use std::path::Path;

use serde::Serialize;
use skiff_engine::batch::{decode_records, BatchHeader, Record, TimestampType};

use crate::layout::segment_base_offset;
use crate::log_scan::{LogScanner, ScanMode, ScannedBatch, Step, Tail};
use crate::{show_bytes, ToolError, RECORDS_BYTES_MAX};

#[derive(Debug, Clone, Copy, Default)]
pub struct DumpLogOptions {
    /// Decode and print every record.
    pub deep: bool,
    /// NDJSON instead of text.
    pub json: bool,
}

/// What the dump found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DumpLogSummary {
    pub batches: u64,
    /// Batches whose CRC does not match, or (with `deep`) whose records do not decode.
    pub invalid_batches: u64,
    /// Non-zero bytes after the last batch.
    pub garbage_tail: bool,
}

impl DumpLogSummary {
    pub fn is_clean(&self) -> bool {
        self.invalid_batches == 0 && !self.garbage_tail
    }
}

pub fn dump_log(
    path: &Path,
    options: DumpLogOptions,
    out: &mut dyn Write,
) -> Result<DumpLogSummary, ToolError> {
    let mut scanner = LogScanner::open(path, ScanMode::Full)?;
    let log_start_offset = segment_base_offset(path);
    if options.json {
        write_json(
            out,
            &FileLine {
                kind: "file",
                file: path.display().to_string(),
                log_starting_offset: log_start_offset,
            },
        )?;
    } else {
        writeln!(out, "Dumping {}", path.display())?;
        if let Some(offset) = log_start_offset {
            writeln!(out, "Log starting offset: {offset}")?;
        }
    }
    let mut summary = DumpLogSummary::default();
    loop {
        let batch = match scanner.step()? {
            Step::Batch(batch) => batch,
            Step::End(end) => {
                summary.garbage_tail = matches!(end.tail, Tail::Garbage { .. });
                write_end(out, options, end.data_end, end.file_len, &end.tail)?;
                return Ok(summary);
            }
        };
        summary.batches += 1;
        let mut valid = batch.crc_valid();
        let line = BatchLine::new(&batch);
        if options.json {
            write_json(out, &line)?;
        } else {
            line.write_text(out)?;
        }
        if options.deep {
            valid &= dump_records(&batch, options.json, out)?;
        }
        if !valid {
            summary.invalid_batches += 1;
        }
    }
}

fn write_json(out: &mut dyn Write, value: &impl Serialize) -> Result<(), ToolError> {
    serde_json::to_writer(&mut *out, value).map_err(std::io::Error::from)?;
    writeln!(out)?;
    Ok(())
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct FileLine {
    #[serde(rename = "type")]
    kind: &'static str,
    file: String,
    log_starting_offset: Option<i64>,
}

fn timestamp_type_name(header: &BatchHeader) -> &'static str {
    match header.timestamp_type() {
        TimestampType::CreateTime => "CreateTime",
        TimestampType::LogAppendTime => "LogAppendTime",
    }
}

/// Kafka's sequence arithmetic: sequences wrap from i32::MAX to 0; -1 means "none".
fn sequence_at(base_sequence: i32, delta: i32) -> i32 {
    if base_sequence < 0 {
        return -1;
    }
    let delta = delta.max(0);
    if base_sequence > i32::MAX - delta {
        delta - (i32::MAX - base_sequence) - 1
    } else {
        base_sequence + delta
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct BatchLine {
    #[serde(rename = "type")]
    kind: &'static str,
    base_offset: i64,
    last_offset: i64,
    count: i32,
    base_sequence: i32,
    last_sequence: i32,
    producer_id: i64,
    producer_epoch: i16,
    partition_leader_epoch: i32,
    is_transactional: bool,
    is_control: bool,
    position: u64,
    timestamp_type: &'static str,
    max_timestamp: i64,
    size: u64,
    magic: i8,
    compresscodec: String,
    crc: u32,
    isvalid: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

impl BatchLine {
    fn new(batch: &ScannedBatch) -> BatchLine {
        let h = &batch.header;
        BatchLine {
            kind: "batch",
            base_offset: h.base_offset,
            last_offset: h.last_offset(),
            count: h.records_count,
            base_sequence: h.base_sequence,
            last_sequence: sequence_at(h.base_sequence, h.last_offset_delta),
            producer_id: h.producer_id,
            producer_epoch: h.producer_epoch,
            partition_leader_epoch: h.partition_leader_epoch,
            is_transactional: h.is_transactional(),
            is_control: h.is_control(),
            position: batch.position,
            timestamp_type: timestamp_type_name(h),
            max_timestamp: h.max_timestamp,
            size: batch.size(),
            magic: h.magic,
            compresscodec: match h.compression() {
                Ok(c) => c.name().to_owned(),
                Err(_) => format!("unknown({})", h.attributes & 0x07),
            },
            crc: h.crc,
            isvalid: batch.crc_valid(),
            error: match &batch.crc {
                Some(Err(e)) => Some(e.to_string()),
                _ => None,
            },
        }
    }

    fn write_text(&self, out: &mut dyn Write) -> Result<(), ToolError> {
        write!(
            out,
            "baseOffset: {} lastOffset: {} count: {} baseSequence: {} lastSequence: {} \
             producerId: {} producerEpoch: {} partitionLeaderEpoch: {} isTransactional: {} \
             isControl: {} position: {} {}: {} size: {} magic: {} compresscodec: {} crc: {} \
             isvalid: {}",
            self.base_offset,
            self.last_offset,
            self.count,
            self.base_sequence,
            self.last_sequence,
            self.producer_id,
            self.producer_epoch,
            self.partition_leader_epoch,
            self.is_transactional,
            self.is_control,
            self.position,
            self.timestamp_type,
            self.max_timestamp,
            self.size,
            self.magic,
            self.compresscodec,
            self.crc,
            self.isvalid,
        )?;
        match &self.error {
            Some(error) => writeln!(out, " error: {error}")?,
            None => writeln!(out)?,
        }
        Ok(())
    }
}

#[derive(Serialize)]
struct HeaderJson {
    key: String,
    value: Option<String>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct RecordLine {
    #[serde(rename = "type")]
    kind: &'static str,
    offset: i64,
    timestamp_type: &'static str,
    timestamp: i64,
    key_size: i64,
    value_size: i64,
    sequence: i32,
    header_keys: Vec<String>,
    headers: Vec<HeaderJson>,
    key: Option<String>,
    payload: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    end_txn_marker: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    coordinator_epoch: Option<i32>,
}

fn size_of(bytes: &Option<bytes::Bytes>) -> i64 {
    bytes.as_ref().map_or(-1, |b| b.len() as i64)
}

/// A transaction marker's contents: key = version i16 + type i16 (0 abort, 1 commit),
/// value = version i16 + coordinator epoch i32.
fn end_txn_marker(record: &Record) -> Option<(&'static str, i32)> {
    let key = record.key.as_ref()?;
    let value = record.value.as_ref()?;
    if key.len() < 4 || value.len() < 6 {
        return None;
    }
    let marker = match i16::from_be_bytes([key[2], key[3]]) {
        0 => "ABORT",
        1 => "COMMIT",
        _ => return None,
    };
    Some((
        marker,
        i32::from_be_bytes([value[2], value[3], value[4], value[5]]),
    ))
}

impl RecordLine {
    fn new(header: &BatchHeader, record: &Record) -> RecordLine {
        let marker = if header.is_control() {
            end_txn_marker(record)
        } else {
            None
        };
        let delta = i32::try_from(record.offset.wrapping_sub(header.base_offset)).unwrap_or(-1);
        RecordLine {
            kind: "record",
            offset: record.offset,
            timestamp_type: timestamp_type_name(header),
            timestamp: record.timestamp,
            key_size: size_of(&record.key),
            value_size: size_of(&record.value),
            sequence: sequence_at(header.base_sequence, delta),
            header_keys: record.headers.iter().map(|h| show_bytes(&h.key)).collect(),
            headers: record
                .headers
                .iter()
                .map(|h| HeaderJson {
                    key: show_bytes(&h.key),
                    value: h.value.as_deref().map(show_bytes),
                })
                .collect(),
            key: record.key.as_deref().map(show_bytes),
            payload: record.value.as_deref().map(show_bytes),
            end_txn_marker: marker.map(|(m, _)| m),
            coordinator_epoch: marker.map(|(_, e)| e),
        }
    }

    fn write_text(&self, out: &mut dyn Write) -> Result<(), ToolError> {
        write!(
            out,
            "| offset: {} {}: {} keySize: {} valueSize: {} sequence: {} headerKeys: [{}]",
            self.offset,
            self.timestamp_type,
            self.timestamp,
            self.key_size,
            self.value_size,
            self.sequence,
            self.header_keys.join(","),
        )?;
        if let (Some(marker), Some(epoch)) = (self.end_txn_marker, self.coordinator_epoch) {
            writeln!(out, " endTxnMarker: {marker} coordinatorEpoch: {epoch}")?;
        } else {
            let or_null = |s: &Option<String>| s.clone().unwrap_or_else(|| "null".to_owned());
            writeln!(
                out,
                " key: {} payload: {}",
                or_null(&self.key),
                or_null(&self.payload)
            )?;
        }
        Ok(())
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct RecordsErrorLine {
    #[serde(rename = "type")]
    kind: &'static str,
    position: u64,
    base_offset: i64,
    error: String,
}

/// Prints the records of one batch; false if they do not decode.
fn dump_records(batch: &ScannedBatch, json: bool, out: &mut dyn Write) -> Result<bool, ToolError> {
    match decode_records(&batch.bytes, RECORDS_BYTES_MAX) {
        Ok(records) => {
            for record in &records {
                let line = RecordLine::new(&batch.header, record);
                if json {
                    write_json(out, &line)?;
                } else {
                    line.write_text(out)?;
                }
            }
            Ok(true)
        }
        Err(e) => {
            if json {
                write_json(
                    out,
                    &RecordsErrorLine {
                        kind: "recordsError",
                        position: batch.position,
                        base_offset: batch.header.base_offset,
                        error: e.to_string(),
                    },
                )?;
            } else {
                writeln!(out, "| records not decoded: {e}")?;
            }
            Ok(false)
        }
    }
}

#[derive(Serialize)]
struct ZeroTailJson {
    position: u64,
    bytes: u64,
}

#[derive(Serialize)]
struct GarbageTailJson {
    position: u64,
    bytes: u64,
    reason: String,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct EndLine {
    #[serde(rename = "type")]
    kind: &'static str,
    /// Position after the last batch (kafka-dump-log's "validBytes").
    data_end: u64,
    file_size: u64,
    zero_tail: Option<ZeroTailJson>,
    /// A recycled file's previous contents after the data.
    recycled_tail: Option<ZeroTailJson>,
    garbage_tail: Option<GarbageTailJson>,
}

fn write_end(
    out: &mut dyn Write,
    options: DumpLogOptions,
    data_end: u64,
    file_size: u64,
    tail: &Tail,
) -> Result<(), ToolError> {
    if options.json {
        let span = |position: &u64, bytes: &u64| ZeroTailJson {
            position: *position,
            bytes: *bytes,
        };
        let (zero_tail, recycled_tail, garbage_tail) = match tail {
            Tail::None => (None, None, None),
            Tail::Zeros { position, bytes } => (Some(span(position, bytes)), None, None),
            Tail::Recycled { position, bytes } => (None, Some(span(position, bytes)), None),
            Tail::Garbage {
                position,
                bytes,
                reason,
            } => (
                None,
                None,
                Some(GarbageTailJson {
                    position: *position,
                    bytes: *bytes,
                    reason: reason.clone(),
                }),
            ),
        };
        return write_json(
            out,
            &EndLine {
                kind: "end",
                data_end,
                file_size,
                zero_tail,
                recycled_tail,
                garbage_tail,
            },
        );
    }
    match tail {
        Tail::None => {}
        Tail::Zeros { position, bytes } => {
            writeln!(
                out,
                "trailing zero bytes (preallocated) at position {position}: {bytes} bytes"
            )?;
        }
        Tail::Recycled { position, bytes } => {
            writeln!(
                out,
                "recycled file's previous contents at position {position}: {bytes} bytes"
            )?;
        }
        Tail::Garbage {
            position,
            bytes,
            reason,
        } => {
            writeln!(
                out,
                "torn or garbage tail at position {position}: {bytes} bytes ({reason})"
            )?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequences_wrap_like_kafka() {
        assert_eq!(sequence_at(-1, 5), -1);
        assert_eq!(sequence_at(10, 5), 15);
        assert_eq!(sequence_at(i32::MAX, 0), i32::MAX);
        assert_eq!(sequence_at(i32::MAX, 1), 0);
        assert_eq!(sequence_at(i32::MAX - 1, 3), 1);
    }
}
