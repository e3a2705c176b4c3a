//! Record-level views of a stored batch and the rebuild compaction needs: keep some
//! records, drop the rest, and write a batch that keeps everything else about the
//! original (base and last offset, leader epoch, producer fields, attributes,
//! codec). Offsets of kept records are unchanged, so a compacted log has gaps.
//!
//! Kafka's cleaner (`MemoryRecords.filterTo`) does the same: a v2 batch keeps its
//! base offset and its last offset delta even when records go, so producer sequence
//! numbers stay meaningful and the offset range of every batch is stable.

use std::borrow::Cow;

use bytes::Bytes;

use super::compression::CODEC_MASK;
use super::header::{write_crc, BatchHeader, BATCH_HEADER_LEN, DELETE_HORIZON_BIT, LOG_OVERHEAD};
use super::records::{read_varint, read_varlong, write_varlong};
use super::{compress, decompress, BatchError, Compression};

/// One record inside a records section, borrowed.
#[derive(Debug, Clone, Copy)]
pub struct RecordView<'a> {
    pub offset_delta: i32,
    /// As stored: relative to the batch's base timestamp.
    pub timestamp_delta: i64,
    pub key: Option<&'a [u8]>,
    /// A null value: a tombstone.
    pub is_tombstone: bool,
    /// The record as stored, length prefix included.
    pub raw: &'a [u8],
    /// The record body after its attributes byte and timestamp delta (offset delta,
    /// key, value, headers): what a rebuild with a new base timestamp copies.
    pub after_timestamp: &'a [u8],
    /// The record's attributes byte (unused by v2, kept verbatim).
    pub attributes: u8,
}

/// The uncompressed records section of a complete batch (borrowed when the batch
/// is uncompressed). Output is bounded by `size_limit`.
pub fn records_section<'a>(
    batch: &'a [u8],
    header: &BatchHeader,
    size_limit: usize,
) -> Result<Cow<'a, [u8]>, BatchError> {
    let section = &batch[BATCH_HEADER_LEN..header.total_len().min(batch.len())];
    match header.compression()? {
        Compression::None => Ok(Cow::Borrowed(section)),
        codec => Ok(Cow::Owned(decompress(codec, section, size_limit)?)),
    }
}

/// Every record of an uncompressed records section, in order. Checks that the
/// records fill the section exactly and that there are `records_count` of them.
pub fn record_views(section: &[u8], records_count: i32) -> Result<Vec<RecordView<'_>>, BatchError> {
    let declared =
        usize::try_from(records_count).map_err(|_| BatchError::EmptyBatch(records_count))?;
    let mut out = Vec::with_capacity(declared.min(section.len() / 7));
    let mut pos = 0usize;
    while pos < section.len() {
        if out.len() == declared {
            return Err(BatchError::InvalidRecord(
                "bytes remain after the declared number of records",
            ));
        }
        let start = pos;
        let len = read_varint(section, &mut pos)?;
        let len = usize::try_from(len)
            .map_err(|_| BatchError::InvalidRecord("negative record length"))?;
        if len < 6 || len > section.len() - pos {
            return Err(BatchError::InvalidRecord(
                "record length does not fit the batch",
            ));
        }
        let end = pos + len;
        let body = &section[..end];
        let attributes = body[pos];
        pos += 1;
        let timestamp_delta = read_varlong(body, &mut pos)?;
        let after_timestamp_at = pos;
        let offset_delta = read_varint(body, &mut pos)?;
        let key = nullable(body, &mut pos)?;
        let value = nullable(body, &mut pos)?;
        out.push(RecordView {
            offset_delta,
            timestamp_delta,
            key,
            is_tombstone: value.is_none(),
            raw: &section[start..end],
            after_timestamp: &section[after_timestamp_at..end],
            attributes,
        });
        pos = end;
    }
    if out.len() != declared {
        return Err(BatchError::RecordCount {
            declared: records_count,
            actual: i32::try_from(out.len()).unwrap_or(i32::MAX),
        });
    }
    Ok(out)
}

fn nullable<'a>(buf: &'a [u8], pos: &mut usize) -> Result<Option<&'a [u8]>, BatchError> {
    let len = read_varint(buf, pos)?;
    if len < 0 {
        return Ok(None);
    }
    let len = len as usize;
    if len > buf.len() - *pos {
        return Err(BatchError::InvalidRecord("field extends past its record"));
    }
    let bytes = &buf[*pos..*pos + len];
    *pos += len;
    Ok(Some(bytes))
}

/// Writes a batch holding only `kept` (records of `original`, in order), keeping
/// the original's base offset, last offset delta, leader epoch, producer fields,
/// timestamp type and codec (the kept records are compressed again with it).
///
/// `delete_horizon_ms`: when set on a batch that had none, the batch gets the
/// delete-horizon attribute (KIP-534) and its base timestamp becomes the horizon;
/// record timestamp deltas are re-encoded against it so every record keeps its
/// own timestamp. A batch that already has a horizon keeps it.
///
/// An empty `kept` writes an empty batch (records count 0): compaction keeps one
/// where a producer's last batch must stay to carry its sequence state.
pub fn rebuild(
    original: &BatchHeader,
    kept: &[RecordView<'_>],
    delete_horizon_ms: Option<i64>,
) -> Result<Bytes, BatchError> {
    let codec = original.compression()?;
    let set_horizon = delete_horizon_ms.filter(|_| !original.has_delete_horizon());
    let base_timestamp = set_horizon.unwrap_or(original.base_timestamp);
    let mut section = Vec::with_capacity(kept.iter().map(|r| r.raw.len() + 4).sum());
    let mut body = Vec::new();
    let mut max_timestamp = -1i64;
    for record in kept {
        let timestamp = original.base_timestamp.wrapping_add(record.timestamp_delta);
        max_timestamp = max_timestamp.max(timestamp);
        if set_horizon.is_none() {
            section.extend_from_slice(record.raw);
            continue;
        }
        body.clear();
        body.push(record.attributes);
        write_varlong(&mut body, timestamp.wrapping_sub(base_timestamp));
        body.extend_from_slice(record.after_timestamp);
        super::records::write_varint(&mut section, i32::try_from(body.len()).unwrap_or(i32::MAX));
        section.extend_from_slice(&body);
    }
    // LogAppendTime batches carry the append time as their max timestamp; an empty
    // batch keeps the original's so retention by time sees the same age.
    if original.timestamp_type() == super::TimestampType::LogAppendTime || kept.is_empty() {
        max_timestamp = original.max_timestamp;
    }
    let section = match codec {
        Compression::None => section,
        _ if kept.is_empty() => Vec::new(),
        codec => compress(codec, &section)?,
    };
    let total_len = BATCH_HEADER_LEN + section.len();
    let batch_length =
        i32::try_from(total_len - LOG_OVERHEAD).map_err(|_| BatchError::InvalidLength(i32::MAX))?;
    let mut attributes = original.attributes;
    if kept.is_empty() {
        // As Kafka writes empty batches: no records section, so no codec.
        attributes &= !CODEC_MASK;
    }
    if set_horizon.is_some() {
        attributes |= DELETE_HORIZON_BIT;
    }
    let header = BatchHeader {
        batch_length,
        attributes,
        base_timestamp,
        max_timestamp,
        records_count: i32::try_from(kept.len()).unwrap_or(i32::MAX),
        crc: 0,
        ..*original
    };
    let mut batch = vec![0u8; total_len];
    header.write_to(&mut batch);
    batch[BATCH_HEADER_LEN..].copy_from_slice(&section);
    write_crc(&mut batch);
    Ok(Bytes::from(batch))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::batch::{crc_matches, decode_records, BatchBuilder};

    fn sample(codec: Compression) -> Bytes {
        let mut b = BatchBuilder::new()
            .compression(codec)
            .base_offset(100)
            .producer(5, 1, 10)
            .partition_leader_epoch(3);
        b.push(1_000, Some(b"a"), Some(b"1"), &[]);
        b.push(1_005, Some(b"b"), None, &[(b"h", Some(b"x"))]);
        b.push(990, Some(b"a"), Some(b"2"), &[]);
        b.build().unwrap()
    }

    #[test]
    fn views_cover_every_record() {
        let batch = sample(Compression::None);
        let header = BatchHeader::parse(&batch).unwrap();
        let section = records_section(&batch, &header, 1 << 20).unwrap();
        let views = record_views(&section, header.records_count).unwrap();
        assert_eq!(views.len(), 3);
        assert_eq!(views[1].key, Some(&b"b"[..]));
        assert!(views[1].is_tombstone && !views[0].is_tombstone);
        assert_eq!(views[2].offset_delta, 2);
        assert_eq!(views[2].timestamp_delta, -10);
    }

    #[test]
    fn rebuild_keeps_offsets_producer_and_codec() {
        for codec in Compression::ALL {
            let batch = sample(codec);
            let header = BatchHeader::parse(&batch).unwrap();
            let section = records_section(&batch, &header, 1 << 20).unwrap();
            let views = record_views(&section, header.records_count).unwrap();
            let kept = [views[1], views[2]];
            let out = rebuild(&header, &kept, None).unwrap();
            crc_matches(&out).unwrap();
            let h = BatchHeader::parse(&out).unwrap();
            assert_eq!((h.base_offset, h.last_offset()), (100, 102));
            assert_eq!(
                (h.producer_id, h.producer_epoch, h.base_sequence),
                (5, 1, 10)
            );
            assert_eq!(h.partition_leader_epoch, 3);
            assert_eq!(h.compression().unwrap(), codec);
            assert_eq!(h.records_count, 2);
            assert_eq!(h.max_timestamp, 1_005);
            let records = decode_records(&out, 1 << 20).unwrap();
            assert_eq!(records[0].offset, 101);
            assert_eq!(records[1].offset, 102);
            assert_eq!(records[1].value.as_deref(), Some(&b"2"[..]));
            assert_eq!(records[0].headers.len(), 1);
        }
    }

    #[test]
    fn delete_horizon_rebases_timestamps() {
        let batch = sample(Compression::Lz4);
        let header = BatchHeader::parse(&batch).unwrap();
        let section = records_section(&batch, &header, 1 << 20).unwrap();
        let views = record_views(&section, header.records_count).unwrap();
        let out = rebuild(&header, &views, Some(50_000)).unwrap();
        let h = BatchHeader::parse(&out).unwrap();
        assert!(h.has_delete_horizon());
        assert_eq!(h.base_timestamp, 50_000);
        let records = decode_records(&out, 1 << 20).unwrap();
        let stamps: Vec<i64> = records.iter().map(|r| r.timestamp).collect();
        assert_eq!(stamps, vec![1_000, 1_005, 990]);
        // A second rebuild keeps the first horizon.
        let section = records_section(&out, &h, 1 << 20).unwrap();
        let views = record_views(&section, h.records_count).unwrap();
        let again = rebuild(&h, &views[..1], Some(90_000)).unwrap();
        let h2 = BatchHeader::parse(&again).unwrap();
        assert_eq!(h2.base_timestamp, 50_000);
        assert_eq!(decode_records(&again, 1 << 20).unwrap()[0].timestamp, 1_000);
    }

    #[test]
    fn empty_rebuild_keeps_the_offset_range() {
        let batch = sample(Compression::Zstd);
        let header = BatchHeader::parse(&batch).unwrap();
        let out = rebuild(&header, &[], None).unwrap();
        crc_matches(&out).unwrap();
        let h = BatchHeader::parse(&out).unwrap();
        assert_eq!(
            (h.records_count, h.base_offset, h.last_offset()),
            (0, 100, 102)
        );
        assert_eq!(out.len(), BATCH_HEADER_LEN);
        assert_eq!(h.compression().unwrap(), Compression::None);
        assert!(decode_records(&out, 1 << 20).unwrap().is_empty());
    }

    #[test]
    fn lying_lengths_are_errors() {
        let batch = sample(Compression::None);
        let header = BatchHeader::parse(&batch).unwrap();
        let mut section = batch[BATCH_HEADER_LEN..].to_vec();
        section[0] = 0x7e; // record length 63: past the section
        assert!(record_views(&section, header.records_count).is_err());
        assert!(record_views(&batch[BATCH_HEADER_LEN..], 2).is_err());
    }
}
