//! Records inside a batch: zigzag varints, the length walk `validate` uses, and full
//! decoding for tools and tests.
//!
//! Record layout: length varint; attributes i8; timestampDelta varlong;
//! offsetDelta varint; keyLength varint (-1 = null); key; valueLength varint
//! (-1 = null); value; headersCount varint; per header: keyLength varint, key,
//! valueLength varint (-1 = null), value.

use bytes::Bytes;

use super::header::{BatchHeader, TimestampType, BATCH_HEADER_LEN};
use super::{decompress, BatchError, Compression};

/// A record body is at least attributes, timestampDelta, offsetDelta, keyLength,
/// valueLength and headersCount, one byte each.
const RECORD_BODY_LEN_MIN: usize = 6;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Absolute: the batch's base offset plus the record's offset delta.
    pub offset: i64,
    /// Absolute. For LogAppendTime batches this is the batch's max_timestamp, as in
    /// Kafka: the broker's append time replaces every record's own timestamp.
    pub timestamp: i64,
    pub attributes: i8,
    pub key: Option<Bytes>,
    pub value: Option<Bytes>,
    pub headers: Vec<RecordHeader>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordHeader {
    pub key: Bytes,
    pub value: Option<Bytes>,
}

/// Decodes every record of one complete batch (`batch` is exactly the batch).
/// Compressed payloads are decompressed with output bounded by `size_limit`;
/// uncompressed records are slices of `batch` (zero copy). The CRC is not checked:
/// call [`validate`](super::validate) or [`crc_matches`](super::crc_matches) first
/// when the bytes are untrusted.
pub fn decode_records(batch: &Bytes, size_limit: usize) -> Result<Vec<Record>, BatchError> {
    let header = BatchHeader::parse(batch)?;
    if header.total_len() != batch.len() {
        return Err(BatchError::LengthMismatch {
            declared: header.total_len(),
            actual: batch.len(),
        });
    }
    let section = match header.compression()? {
        Compression::None => {
            if batch.len() - BATCH_HEADER_LEN > size_limit {
                return Err(BatchError::TooLarge { limit: size_limit });
            }
            batch.slice(BATCH_HEADER_LEN..)
        }
        codec => Bytes::from(decompress(codec, &batch[BATCH_HEADER_LEN..], size_limit)?),
    };
    // Zero is legal in a stored log (compaction can empty a batch); negative is not.
    let declared = usize::try_from(header.records_count)
        .map_err(|_| BatchError::EmptyBatch(header.records_count))?;
    // The count comes from the sender: cap the allocation by what the bytes can hold.
    let mut records = Vec::with_capacity(declared.min(section.len() / (RECORD_BODY_LEN_MIN + 1)));
    let mut cursor = Cursor {
        buf: &section,
        pos: 0,
        end: section.len(),
    };
    while cursor.pos < cursor.end {
        if records.len() == declared {
            return Err(BatchError::InvalidRecord(
                "bytes remain after the declared number of records",
            ));
        }
        records.push(decode_record(&mut cursor, &header)?);
    }
    if records.len() != declared {
        return Err(BatchError::RecordCount {
            declared: header.records_count,
            actual: i32::try_from(records.len()).unwrap_or(i32::MAX),
        });
    }
    Ok(records)
}

fn decode_record(cursor: &mut Cursor<'_>, header: &BatchHeader) -> Result<Record, BatchError> {
    let len = record_length(cursor.buf, &mut cursor.pos, cursor.end)?;
    // Parse within the record's own bounds so a lying field cannot read its neighbour.
    let mut record = Cursor {
        buf: cursor.buf,
        pos: cursor.pos,
        end: cursor.pos + len,
    };
    cursor.pos += len;

    let attributes = record.i8()?;
    let timestamp_delta = record.varlong()?;
    let offset_delta = record.varint()?;
    let key = record.nullable_bytes()?;
    let value = record.nullable_bytes()?;
    let headers_count = usize::try_from(record.varint()?)
        .map_err(|_| BatchError::InvalidRecord("negative header count"))?;
    // Each header takes at least two bytes (key length, value length).
    let mut headers = Vec::with_capacity(headers_count.min(record.remaining() / 2));
    for _ in 0..headers_count {
        let key = record
            .nullable_bytes()?
            .ok_or(BatchError::InvalidRecord("null header key"))?;
        let value = record.nullable_bytes()?;
        headers.push(RecordHeader { key, value });
    }
    if record.remaining() != 0 {
        return Err(BatchError::InvalidRecord(
            "record length does not match its contents",
        ));
    }

    let timestamp = match header.timestamp_type() {
        TimestampType::LogAppendTime => header.max_timestamp,
        TimestampType::CreateTime => header.base_timestamp.wrapping_add(timestamp_delta),
    };
    Ok(Record {
        // Wrapping: hostile deltas must not panic; a real log never gets near i64::MAX.
        offset: header.base_offset.wrapping_add(i64::from(offset_delta)),
        timestamp,
        attributes,
        key,
        value,
        headers,
    })
}

/// Checks that exactly `records_count` length-prefixed records fill `section`,
/// without parsing inside them: the produce-path check for uncompressed batches.
pub(crate) fn walk_record_lengths(section: &[u8], records_count: i32) -> Result<(), BatchError> {
    let mut pos = 0;
    let mut count: i32 = 0;
    while pos < section.len() {
        if count == records_count {
            return Err(BatchError::InvalidRecord(
                "bytes remain after the declared number of records",
            ));
        }
        let len = record_length(section, &mut pos, section.len())?;
        pos += len;
        count += 1;
    }
    if count != records_count {
        return Err(BatchError::RecordCount {
            declared: records_count,
            actual: count,
        });
    }
    Ok(())
}

/// Reads a record's length prefix at `pos` and checks the body fits before `end`.
fn record_length(buf: &[u8], pos: &mut usize, end: usize) -> Result<usize, BatchError> {
    let len = read_varint(&buf[..end], pos)?;
    let len =
        usize::try_from(len).map_err(|_| BatchError::InvalidRecord("negative record length"))?;
    if len < RECORD_BODY_LEN_MIN {
        return Err(BatchError::InvalidRecord(
            "record shorter than the minimum record",
        ));
    }
    if len > end - *pos {
        return Err(BatchError::InvalidRecord(
            "record extends past the end of the batch",
        ));
    }
    Ok(len)
}

/// A read position within `buf[..end]`; byte fields come out as `Bytes` slices.
struct Cursor<'a> {
    buf: &'a Bytes,
    pos: usize,
    end: usize,
}

impl Cursor<'_> {
    fn remaining(&self) -> usize {
        self.end - self.pos
    }

    fn i8(&mut self) -> Result<i8, BatchError> {
        if self.pos >= self.end {
            return Err(BatchError::InvalidRecord("record truncated"));
        }
        let byte = self.buf[self.pos] as i8;
        self.pos += 1;
        Ok(byte)
    }

    fn varint(&mut self) -> Result<i32, BatchError> {
        read_varint(&self.buf[..self.end], &mut self.pos)
    }

    fn varlong(&mut self) -> Result<i64, BatchError> {
        read_varlong(&self.buf[..self.end], &mut self.pos)
    }

    /// A varint length (-1 = null) followed by that many bytes.
    fn nullable_bytes(&mut self) -> Result<Option<Bytes>, BatchError> {
        let len = self.varint()?;
        if len == -1 {
            return Ok(None);
        }
        let len =
            usize::try_from(len).map_err(|_| BatchError::InvalidRecord("negative field length"))?;
        if len > self.remaining() {
            return Err(BatchError::InvalidRecord(
                "field extends past the end of the record",
            ));
        }
        let bytes = self.buf.slice(self.pos..self.pos + len);
        self.pos += len;
        Ok(Some(bytes))
    }
}

/// Reads a zigzag varint (at most 5 bytes) at `pos`, advancing it.
pub(crate) fn read_varint(buf: &[u8], pos: &mut usize) -> Result<i32, BatchError> {
    let raw = read_unsigned(buf, pos, 5)?;
    // Bits beyond 32 can only come from a malformed fifth byte; Kafka ignores them too.
    let raw = raw as u32;
    Ok((raw >> 1) as i32 ^ -((raw & 1) as i32))
}

/// Reads a zigzag varlong (at most 10 bytes) at `pos`, advancing it.
pub(crate) fn read_varlong(buf: &[u8], pos: &mut usize) -> Result<i64, BatchError> {
    let raw = read_unsigned(buf, pos, 10)?;
    Ok((raw >> 1) as i64 ^ -((raw & 1) as i64))
}

fn read_unsigned(buf: &[u8], pos: &mut usize, max_bytes: u32) -> Result<u64, BatchError> {
    let mut value: u64 = 0;
    for i in 0..max_bytes {
        let byte = *buf
            .get(*pos)
            .ok_or(BatchError::InvalidRecord("varint truncated"))?;
        *pos += 1;
        // At i = 9 the shift is 63: high bits of the last byte fall off, as in Kafka.
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(BatchError::InvalidRecord("varint too long"))
}

pub(crate) fn write_varint(out: &mut Vec<u8>, value: i32) {
    write_unsigned(out, u64::from(((value << 1) ^ (value >> 31)) as u32));
}

pub(crate) fn write_varlong(out: &mut Vec<u8>, value: i64) {
    write_unsigned(out, ((value << 1) ^ (value >> 63)) as u64);
}

fn write_unsigned(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn varint_known_encodings() {
        // Zigzag maps 0, -1, 1, -2 ... to 0, 1, 2, 3 ...; 300 -> 600 -> [0xD8, 0x04].
        for (value, encoded) in [
            (0, vec![0x00]),
            (-1, vec![0x01]),
            (1, vec![0x02]),
            (300, vec![0xD8, 0x04]),
            (i32::MIN, vec![0xFF, 0xFF, 0xFF, 0xFF, 0x0F]),
        ] {
            let mut out = Vec::new();
            write_varint(&mut out, value);
            assert_eq!(out, encoded);
            assert_eq!(read_varint(&encoded, &mut 0).unwrap(), value);
        }
    }

    #[test]
    fn varint_rejects_truncated_and_overlong() {
        assert!(matches!(
            read_varint(&[0x80], &mut 0),
            Err(BatchError::InvalidRecord("varint truncated"))
        ));
        assert!(matches!(
            read_varint(&[0x80; 6], &mut 0),
            Err(BatchError::InvalidRecord("varint too long"))
        ));
        assert!(read_varlong(&[0x80; 11], &mut 0).is_err());
    }

    proptest! {
        #[test]
        fn varints_round_trip(a in any::<i32>(), b in any::<i64>()) {
            let mut out = Vec::new();
            write_varint(&mut out, a);
            write_varlong(&mut out, b);
            let mut pos = 0;
            prop_assert_eq!(read_varint(&out, &mut pos).unwrap(), a);
            prop_assert_eq!(read_varlong(&out, &mut pos).unwrap(), b);
            prop_assert_eq!(pos, out.len());
        }
    }
}
