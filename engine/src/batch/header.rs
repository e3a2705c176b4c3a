//! The fixed 61-byte batch header: parse, whole-batch validation, in-place stamping,
//! and a header-only scanner for the fetch path.

use super::records::walk_record_lengths;
use super::{BatchError, Compression};

/// Fixed header length, including baseOffset and batchLength.
pub const BATCH_HEADER_LEN: usize = 61;
/// baseOffset (i64) + batchLength (i32): the bytes not counted by batchLength.
pub const LOG_OVERHEAD: usize = 12;
/// The only batch format skiff accepts.
pub const MAGIC_V2: i8 = 2;

// Field positions within a batch.
pub(crate) const BASE_OFFSET_AT: usize = 0;
pub(crate) const LENGTH_AT: usize = 8;
pub(crate) const EPOCH_AT: usize = 12;
pub(crate) const MAGIC_AT: usize = 16;
pub(crate) const CRC_AT: usize = 17;
/// The CRC covers everything from here to the end of the batch.
pub(crate) const ATTRIBUTES_AT: usize = 21;
pub(crate) const LAST_OFFSET_DELTA_AT: usize = 23;
pub(crate) const BASE_TIMESTAMP_AT: usize = 27;
pub(crate) const MAX_TIMESTAMP_AT: usize = 35;
pub(crate) const PRODUCER_ID_AT: usize = 43;
pub(crate) const PRODUCER_EPOCH_AT: usize = 51;
pub(crate) const BASE_SEQUENCE_AT: usize = 53;
pub(crate) const RECORDS_COUNT_AT: usize = 57;

/// Smallest legal batchLength: a header with an empty records section.
const BATCH_LENGTH_MIN: i32 = (BATCH_HEADER_LEN - LOG_OVERHEAD) as i32;

const TIMESTAMP_TYPE_BIT: i16 = 1 << 3;
pub(crate) const TRANSACTIONAL_BIT: i16 = 1 << 4;
pub(crate) const CONTROL_BIT: i16 = 1 << 5;
pub(crate) const DELETE_HORIZON_BIT: i16 = 1 << 6;

/// Which clock a batch's timestamps come from (attributes bit 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimestampType {
    /// Set by the producer.
    CreateTime,
    /// Set by the broker on append; the batch's max_timestamp is the append time.
    LogAppendTime,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchHeader {
    pub base_offset: i64,
    /// Bytes after this field: the whole batch is `LOG_OVERHEAD + batch_length`.
    pub batch_length: i32,
    pub partition_leader_epoch: i32,
    pub magic: i8,
    pub crc: u32,
    pub attributes: i16,
    pub last_offset_delta: i32,
    pub base_timestamp: i64,
    /// The timestamp the log's time index uses (for LogAppendTime, the append time).
    pub max_timestamp: i64,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    pub records_count: i32,
}

impl BatchHeader {
    /// Parses the header at the start of `buf` (which may hold more). Checks only
    /// what the header alone proves: enough bytes, magic 2, a batchLength that
    /// covers the header. No CRC.
    pub fn parse(buf: &[u8]) -> Result<BatchHeader, BatchError> {
        if buf.len() < BATCH_HEADER_LEN {
            return Err(BatchError::TooShort {
                needed: BATCH_HEADER_LEN,
                actual: buf.len(),
            });
        }
        let batch_length = be_i32(buf, LENGTH_AT);
        if batch_length < BATCH_LENGTH_MIN {
            return Err(BatchError::InvalidLength(batch_length));
        }
        let magic = buf[MAGIC_AT] as i8;
        if magic != MAGIC_V2 {
            return Err(BatchError::BadMagic(magic));
        }
        Ok(BatchHeader {
            base_offset: be_i64(buf, BASE_OFFSET_AT),
            batch_length,
            partition_leader_epoch: be_i32(buf, EPOCH_AT),
            magic,
            crc: be_i32(buf, CRC_AT) as u32,
            attributes: be_i16(buf, ATTRIBUTES_AT),
            last_offset_delta: be_i32(buf, LAST_OFFSET_DELTA_AT),
            base_timestamp: be_i64(buf, BASE_TIMESTAMP_AT),
            max_timestamp: be_i64(buf, MAX_TIMESTAMP_AT),
            producer_id: be_i64(buf, PRODUCER_ID_AT),
            producer_epoch: be_i16(buf, PRODUCER_EPOCH_AT),
            base_sequence: be_i32(buf, BASE_SEQUENCE_AT),
            records_count: be_i32(buf, RECORDS_COUNT_AT),
        })
    }

    /// Writes every field into the first `BATCH_HEADER_LEN` bytes of `buf`, which the
    /// caller sizes. The CRC field is written as stored in `self`.
    pub(crate) fn write_to(&self, buf: &mut [u8]) {
        buf[BASE_OFFSET_AT..LENGTH_AT].copy_from_slice(&self.base_offset.to_be_bytes());
        buf[LENGTH_AT..EPOCH_AT].copy_from_slice(&self.batch_length.to_be_bytes());
        buf[EPOCH_AT..MAGIC_AT].copy_from_slice(&self.partition_leader_epoch.to_be_bytes());
        buf[MAGIC_AT] = self.magic as u8;
        buf[CRC_AT..ATTRIBUTES_AT].copy_from_slice(&self.crc.to_be_bytes());
        buf[ATTRIBUTES_AT..LAST_OFFSET_DELTA_AT].copy_from_slice(&self.attributes.to_be_bytes());
        buf[LAST_OFFSET_DELTA_AT..BASE_TIMESTAMP_AT]
            .copy_from_slice(&self.last_offset_delta.to_be_bytes());
        buf[BASE_TIMESTAMP_AT..MAX_TIMESTAMP_AT]
            .copy_from_slice(&self.base_timestamp.to_be_bytes());
        buf[MAX_TIMESTAMP_AT..PRODUCER_ID_AT].copy_from_slice(&self.max_timestamp.to_be_bytes());
        buf[PRODUCER_ID_AT..PRODUCER_EPOCH_AT].copy_from_slice(&self.producer_id.to_be_bytes());
        buf[PRODUCER_EPOCH_AT..BASE_SEQUENCE_AT]
            .copy_from_slice(&self.producer_epoch.to_be_bytes());
        buf[BASE_SEQUENCE_AT..RECORDS_COUNT_AT].copy_from_slice(&self.base_sequence.to_be_bytes());
        buf[RECORDS_COUNT_AT..BATCH_HEADER_LEN].copy_from_slice(&self.records_count.to_be_bytes());
    }

    /// Bytes the whole batch occupies in the log.
    pub fn total_len(&self) -> usize {
        // parse() guarantees batch_length >= 49, so the cast cannot wrap.
        LOG_OVERHEAD + self.batch_length as usize
    }

    /// Offset of the batch's last record. Wrapping, so a hostile header cannot panic
    /// the caller; offsets near i64::MAX never occur in a real log.
    pub fn last_offset(&self) -> i64 {
        self.base_offset
            .wrapping_add(i64::from(self.last_offset_delta))
    }

    /// The offset the next batch in the log starts at.
    pub fn next_offset(&self) -> i64 {
        self.last_offset().wrapping_add(1)
    }

    pub fn compression(&self) -> Result<Compression, BatchError> {
        Compression::from_attributes(self.attributes)
    }

    pub fn timestamp_type(&self) -> TimestampType {
        if self.attributes & TIMESTAMP_TYPE_BIT == 0 {
            TimestampType::CreateTime
        } else {
            TimestampType::LogAppendTime
        }
    }

    pub fn is_transactional(&self) -> bool {
        self.attributes & TRANSACTIONAL_BIT != 0
    }

    pub fn is_control(&self) -> bool {
        self.attributes & CONTROL_BIT != 0
    }

    /// Set by compaction once tombstones and transaction markers may be removed.
    pub fn has_delete_horizon(&self) -> bool {
        self.attributes & DELETE_HORIZON_BIT != 0
    }
}

/// Full check of one complete batch before it is appended: `buf` must be exactly
/// one batch. Checks the header, the CRC, that the batch holds at least one record
/// with `last_offset_delta == records_count - 1` (as every producer sends), and, for
/// uncompressed batches, that exactly `records_count` length-prefixed records fill
/// the records section. Compressed payloads are not decompressed (hot path).
///
/// Compacted batches read back from a log may legitimately hold fewer records than
/// their offset span; this is the produce-path check, not a stored-batch check.
pub fn validate(buf: &[u8]) -> Result<BatchHeader, BatchError> {
    let header = BatchHeader::parse(buf)?;
    check_complete(&header, buf)?;
    check_crc(&header, buf)?;
    if header.records_count < 1 {
        return Err(BatchError::EmptyBatch(header.records_count));
    }
    if i64::from(header.last_offset_delta) != i64::from(header.records_count) - 1 {
        return Err(BatchError::OffsetDelta {
            last_offset_delta: header.last_offset_delta,
            records_count: header.records_count,
        });
    }
    if header.compression()? == Compression::None {
        walk_record_lengths(&buf[BATCH_HEADER_LEN..], header.records_count)?;
    }
    Ok(header)
}

/// `validate`, and for a compressed batch also `check_compressed_records`.
pub fn validate_deep(buf: &[u8], size_limit: usize) -> Result<BatchHeader, BatchError> {
    let header = validate(buf)?;
    check_compressed_records(buf, &header, size_limit)?;
    Ok(header)
}

/// For a compressed batch, the part `validate` leaves out: decompression (output
/// bounded by `size_limit`) and the record walk over the decompressed records.
/// Kafka does this on produce: a batch whose payload does not decompress, or holds
/// other than `records_count` records, is refused before it can poison every
/// consumer. Uncompressed batches pass (their walk is in `validate`).
pub fn check_compressed_records(
    buf: &[u8],
    header: &BatchHeader,
    size_limit: usize,
) -> Result<(), BatchError> {
    let codec = header.compression()?;
    if codec == Compression::None {
        return Ok(());
    }
    let body = buf.get(BATCH_HEADER_LEN..).ok_or(BatchError::TooShort {
        needed: BATCH_HEADER_LEN,
        actual: buf.len(),
    })?;
    let records = super::decompress(codec, body, size_limit)?;
    walk_record_lengths(&records, header.records_count)
}

/// Checks only the CRC of one complete batch (`buf` is exactly the batch). Magic is
/// not checked: recovery wants the CRC verdict even when other bytes are damaged.
pub fn crc_matches(buf: &[u8]) -> Result<(), BatchError> {
    if buf.len() < BATCH_HEADER_LEN {
        return Err(BatchError::TooShort {
            needed: BATCH_HEADER_LEN,
            actual: buf.len(),
        });
    }
    let batch_length = be_i32(buf, LENGTH_AT);
    let declared = LOG_OVERHEAD as i64 + i64::from(batch_length);
    if declared != buf.len() as i64 {
        return Err(BatchError::LengthMismatch {
            // A negative length reads as 0 declared bytes: still clearly wrong.
            declared: usize::try_from(declared).unwrap_or(0),
            actual: buf.len(),
        });
    }
    let stored = be_i32(buf, CRC_AT) as u32;
    let computed = crc32c::crc32c(&buf[ATTRIBUTES_AT..]);
    if stored != computed {
        return Err(BatchError::CrcMismatch { stored, computed });
    }
    Ok(())
}

/// Overwrites baseOffset and partitionLeaderEpoch in place. Both lie before the CRC
/// range, so the stored CRC stays valid and no byte of the payload is touched.
pub fn stamp(
    buf: &mut [u8],
    base_offset: i64,
    partition_leader_epoch: i32,
) -> Result<(), BatchError> {
    BatchHeader::parse(buf)?;
    buf[BASE_OFFSET_AT..LENGTH_AT].copy_from_slice(&base_offset.to_be_bytes());
    buf[EPOCH_AT..MAGIC_AT].copy_from_slice(&partition_leader_epoch.to_be_bytes());
    Ok(())
}

/// For `message.timestamp.type=LogAppendTime` topics: sets max_timestamp to the append
/// time and the LogAppendTime attribute bit, then recomputes the CRC, since both
/// fields are inside the CRC range. `buf` must be exactly one complete batch.
pub fn stamp_log_append_time(buf: &mut [u8], timestamp_ms: i64) -> Result<(), BatchError> {
    let header = BatchHeader::parse(buf)?;
    check_complete(&header, buf)?;
    let attributes = header.attributes | TIMESTAMP_TYPE_BIT;
    buf[ATTRIBUTES_AT..LAST_OFFSET_DELTA_AT].copy_from_slice(&attributes.to_be_bytes());
    buf[MAX_TIMESTAMP_AT..PRODUCER_ID_AT].copy_from_slice(&timestamp_ms.to_be_bytes());
    write_crc(buf);
    Ok(())
}

/// Computes the CRC over `[21..]` of a complete batch and stores it at 17.
pub(crate) fn write_crc(buf: &mut [u8]) {
    let crc = crc32c::crc32c(&buf[ATTRIBUTES_AT..]);
    buf[CRC_AT..ATTRIBUTES_AT].copy_from_slice(&crc.to_be_bytes());
}

fn check_complete(header: &BatchHeader, buf: &[u8]) -> Result<(), BatchError> {
    if header.total_len() != buf.len() {
        return Err(BatchError::LengthMismatch {
            declared: header.total_len(),
            actual: buf.len(),
        });
    }
    Ok(())
}

fn check_crc(header: &BatchHeader, buf: &[u8]) -> Result<(), BatchError> {
    let computed = crc32c::crc32c(&buf[ATTRIBUTES_AT..]);
    if header.crc != computed {
        return Err(BatchError::CrcMismatch {
            stored: header.crc,
            computed,
        });
    }
    Ok(())
}

/// Walks the complete batches at the start of a chunk of log bytes, header only (no
/// CRC): yields `(position_in_chunk, header)` for each batch that fits entirely.
///
/// Stops at the first partial batch (not an error: the chunk simply ended) or at a
/// header that does not parse (then [`error`](Self::error) says why). Either way
/// [`position`](Self::position) is where the unconsumed bytes start.
#[derive(Debug)]
pub struct BatchScanner<'a> {
    chunk: &'a [u8],
    position: usize,
    error: Option<BatchError>,
    done: bool,
}

impl<'a> BatchScanner<'a> {
    pub fn new(chunk: &'a [u8]) -> Self {
        BatchScanner {
            chunk,
            position: 0,
            error: None,
            done: false,
        }
    }

    /// Start of the next batch not yet yielded.
    pub fn position(&self) -> usize {
        self.position
    }

    /// The bytes not yet yielded: a partial batch, garbage, or the rest of the chunk.
    pub fn remaining(&self) -> &'a [u8] {
        &self.chunk[self.position..]
    }

    /// Why scanning stopped, if it stopped at a header that does not parse.
    pub fn error(&self) -> Option<&BatchError> {
        self.error.as_ref()
    }
}

impl Iterator for BatchScanner<'_> {
    type Item = (usize, BatchHeader);

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let rest = self.remaining();
        if rest.len() < BATCH_HEADER_LEN {
            // Every batch is at least a header long: this is a partial tail.
            self.done = true;
            return None;
        }
        let header = match BatchHeader::parse(rest) {
            Ok(header) => header,
            Err(error) => {
                self.error = Some(error);
                self.done = true;
                return None;
            }
        };
        if header.total_len() > rest.len() {
            self.done = true;
            return None;
        }
        let position = self.position;
        self.position += header.total_len();
        Some((position, header))
    }
}

impl std::iter::FusedIterator for BatchScanner<'_> {}

// Callers check lengths first; these only read fixed-size fields.
fn be_i16(buf: &[u8], at: usize) -> i16 {
    let mut bytes = [0u8; 2];
    bytes.copy_from_slice(&buf[at..at + 2]);
    i16::from_be_bytes(bytes)
}

fn be_i32(buf: &[u8], at: usize) -> i32 {
    let mut bytes = [0u8; 4];
    bytes.copy_from_slice(&buf[at..at + 4]);
    i32::from_be_bytes(bytes)
}

fn be_i64(buf: &[u8], at: usize) -> i64 {
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&buf[at..at + 8]);
    i64::from_be_bytes(bytes)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::batch::{decode_records, BatchBuilder};
    use bytes::Bytes;
    use proptest::prelude::*;

    /// A batch of `count` small records; sizes vary with `count` so concatenations
    /// have batches of different lengths.
    fn sample(codec: Compression, count: usize) -> Vec<u8> {
        let mut builder = BatchBuilder::new().compression(codec);
        for i in 0..count {
            let value = vec![b'v'; 10 + i * 7];
            builder.push(1_000 + i as i64, Some(b"k"), Some(&value), &[(b"h", None)]);
        }
        builder.build().unwrap().to_vec()
    }

    /// Bit-at-a-time CRC-32C (reflected Castagnoli polynomial 0x82F63B78), written
    /// from the definition so the crc32c crate is not checked against itself.
    fn crc32c_bitwise(data: &[u8]) -> u32 {
        let mut crc = !0u32;
        for &byte in data {
            crc ^= u32::from(byte);
            for _ in 0..8 {
                crc = if crc & 1 != 0 {
                    (crc >> 1) ^ 0x82F6_3B78
                } else {
                    crc >> 1
                };
            }
        }
        !crc
    }

    #[test]
    fn crc_is_castagnoli_over_attributes_to_end() {
        // The standard CRC-32C check value.
        assert_eq!(crc32c::crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c_bitwise(b"123456789"), 0xE306_9283);

        let mut batch = sample(Compression::None, 3);
        let header = BatchHeader::parse(&batch).unwrap();
        assert_eq!(header.crc, crc32c_bitwise(&batch[21..]));
        // Bytes before the CRC range (offset, length's neighbours, epoch, magic) are
        // not covered: changing them leaves the CRC verdict untouched.
        batch[0] ^= 0xFF;
        batch[12] ^= 0xFF;
        batch[16] ^= 0xFF;
        crc_matches(&batch).unwrap();
    }

    #[test]
    fn parse_checks_length_and_magic() {
        let batch = sample(Compression::None, 1);
        assert!(matches!(
            BatchHeader::parse(&batch[..60]),
            Err(BatchError::TooShort {
                needed: 61,
                actual: 60
            })
        ));
        let mut bad = batch.clone();
        bad[16] = 1;
        assert!(matches!(
            BatchHeader::parse(&bad),
            Err(BatchError::BadMagic(1))
        ));
        let mut bad = batch.clone();
        bad[8..12].copy_from_slice(&48i32.to_be_bytes());
        assert!(matches!(
            BatchHeader::parse(&bad),
            Err(BatchError::InvalidLength(48))
        ));
        let header = BatchHeader::parse(&batch).unwrap();
        assert_eq!(header.total_len(), batch.len());
        assert_eq!(header.next_offset(), 1);
    }

    #[test]
    fn validate_rejects_inconsistent_counts() {
        let batch = sample(Compression::None, 3);
        let with = |at: usize, value: i32| {
            let mut bad = batch.clone();
            bad[at..at + 4].copy_from_slice(&value.to_be_bytes());
            write_crc(&mut bad);
            validate(&bad).unwrap_err()
        };
        assert!(matches!(
            with(RECORDS_COUNT_AT, 0),
            BatchError::EmptyBatch(0)
        ));
        assert!(matches!(
            with(LAST_OFFSET_DELTA_AT, 5),
            BatchError::OffsetDelta {
                last_offset_delta: 5,
                records_count: 3
            }
        ));
        // Header agrees with itself but the section holds 3 records, not 4 or 2.
        let mut bad = batch.clone();
        bad[LAST_OFFSET_DELTA_AT..BASE_TIMESTAMP_AT].copy_from_slice(&3i32.to_be_bytes());
        bad[RECORDS_COUNT_AT..BATCH_HEADER_LEN].copy_from_slice(&4i32.to_be_bytes());
        write_crc(&mut bad);
        assert!(matches!(
            validate(&bad),
            Err(BatchError::RecordCount {
                declared: 4,
                actual: 3
            })
        ));
        let mut bad = batch.clone();
        bad[LAST_OFFSET_DELTA_AT..BASE_TIMESTAMP_AT].copy_from_slice(&1i32.to_be_bytes());
        bad[RECORDS_COUNT_AT..BATCH_HEADER_LEN].copy_from_slice(&2i32.to_be_bytes());
        write_crc(&mut bad);
        assert!(matches!(validate(&bad), Err(BatchError::InvalidRecord(_))));
        // One trailing byte after a complete batch.
        let mut long = batch.clone();
        long.push(0);
        assert!(matches!(
            validate(&long),
            Err(BatchError::LengthMismatch { .. })
        ));
        let mut bad = batch.clone();
        bad[ATTRIBUTES_AT + 1] |= 0x07;
        write_crc(&mut bad);
        assert!(matches!(
            validate(&bad),
            Err(BatchError::UnknownCompression(7))
        ));
    }

    #[test]
    fn stamp_log_append_time_sets_type_and_recomputes_crc() {
        let mut batch = sample(Compression::Lz4, 4);
        stamp_log_append_time(&mut batch, 99_000).unwrap();
        let header = validate(&batch).unwrap();
        assert_eq!(header.timestamp_type(), TimestampType::LogAppendTime);
        assert_eq!(header.max_timestamp, 99_000);
        assert_eq!(header.compression().unwrap(), Compression::Lz4);
        let records = decode_records(&Bytes::from(batch), 1 << 20).unwrap();
        assert!(records.iter().all(|r| r.timestamp == 99_000));
    }

    #[test]
    fn validate_deep_decompresses() {
        for codec in Compression::ALL {
            let good = sample(codec, 5);
            assert!(validate_deep(&good, 1 << 20).is_ok(), "{codec}");
        }
        // Plain records labelled gzip, with a correct CRC: only the deep check sees it.
        let mut lying = sample(Compression::None, 5);
        let attributes = i16::from_be_bytes([lying[ATTRIBUTES_AT], lying[ATTRIBUTES_AT + 1]]);
        let labelled = attributes | Compression::Gzip.as_attribute_bits();
        lying[ATTRIBUTES_AT..ATTRIBUTES_AT + 2].copy_from_slice(&labelled.to_be_bytes());
        write_crc(&mut lying);
        assert!(validate(&lying).is_ok());
        assert!(matches!(
            validate_deep(&lying, 1 << 20),
            Err(BatchError::Compression { .. })
        ));
        // Output beyond the limit is refused too.
        let big = sample(Compression::Zstd, 50);
        assert!(validate_deep(&big, 64).is_err());
    }

    #[test]
    fn stamp_rejects_short_buffers() {
        let mut short = [0u8; 60];
        assert!(matches!(
            stamp(&mut short, 1, 1),
            Err(BatchError::TooShort { .. })
        ));
        let mut partial = sample(Compression::None, 2);
        partial.pop();
        assert!(matches!(
            stamp_log_append_time(&mut partial, 1),
            Err(BatchError::LengthMismatch { .. })
        ));
    }

    #[test]
    fn scanner_yields_complete_batches_then_stops() {
        let batches: Vec<Vec<u8>> = (1..=3).map(|n| sample(Compression::None, n)).collect();
        let tail = sample(Compression::Gzip, 2);
        for tail_len in [0, 1, 60, 61, tail.len() - 1] {
            let mut chunk: Vec<u8> = batches.concat();
            chunk.extend_from_slice(&tail[..tail_len]);
            let mut scanner = BatchScanner::new(&chunk);
            let mut expected_position = 0;
            for batch in &batches {
                let (position, header) = scanner.next().unwrap();
                assert_eq!(position, expected_position);
                assert_eq!(header, BatchHeader::parse(batch).unwrap());
                expected_position += batch.len();
            }
            assert_eq!(scanner.next(), None);
            assert_eq!(scanner.next(), None);
            assert_eq!(scanner.position(), expected_position);
            assert_eq!(scanner.remaining(), &tail[..tail_len]);
            assert!(scanner.error().is_none());
        }
    }

    #[test]
    fn scanner_reports_unparseable_header() {
        let mut chunk = sample(Compression::None, 1);
        let first_len = chunk.len();
        let mut garbage = sample(Compression::None, 1);
        garbage[16] = 0; // magic 0: a v0 message set, or garbage
        chunk.extend_from_slice(&garbage);
        let mut scanner = BatchScanner::new(&chunk);
        assert_eq!(scanner.next().map(|(position, _)| position), Some(0));
        assert_eq!(scanner.next(), None);
        assert_eq!(scanner.position(), first_len);
        assert!(matches!(scanner.error(), Some(BatchError::BadMagic(0))));
    }

    fn codec() -> impl Strategy<Value = Compression> {
        prop::sample::select(Compression::ALL.to_vec())
    }

    proptest! {
        #[test]
        fn any_byte_flip_from_crc_on_fails_the_crc(
            codec in codec(),
            count in 1usize..6,
            index in any::<prop::sample::Index>(),
            flip in 1u8..=255,
        ) {
            let mut batch = sample(codec, count);
            let at = CRC_AT + index.index(batch.len() - CRC_AT);
            batch[at] ^= flip;
            prop_assert!(
                matches!(validate(&batch), Err(BatchError::CrcMismatch { .. })),
                "flip at {} passed", at
            );
            prop_assert!(crc_matches(&batch).is_err());
        }

        #[test]
        fn stamp_keeps_batch_valid(
            codec in codec(),
            base_offset in any::<i64>(),
            epoch in any::<i32>(),
        ) {
            let mut batch = sample(codec, 3);
            let before = validate(&batch).unwrap();
            stamp(&mut batch, base_offset, epoch).unwrap();
            let after = validate(&batch).unwrap();
            prop_assert_eq!(after.base_offset, base_offset);
            prop_assert_eq!(after.partition_leader_epoch, epoch);
            prop_assert_eq!(after.crc, before.crc);
        }

        #[test]
        fn truncation_fails_with_typed_error(codec in codec(), count in 1usize..4) {
            let batch = sample(codec, count);
            for len in 0..batch.len() {
                let cut = &batch[..len];
                prop_assert!(validate(cut).is_err());
                prop_assert!(crc_matches(cut).is_err());
                prop_assert!(decode_records(&Bytes::copy_from_slice(cut), 1 << 20).is_err());
                let mut scanner = BatchScanner::new(cut);
                prop_assert_eq!(scanner.next(), None);
                prop_assert!(scanner.error().is_none());
            }
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
            let _ = BatchHeader::parse(&bytes);
            let _ = validate(&bytes);
            let _ = crc_matches(&bytes);
            let _ = decode_records(&Bytes::from(bytes.clone()), 1 << 16);
            let _ = BatchScanner::new(&bytes).count();
        }

        /// Random bytes rarely get past the header; this keeps a valid, CRC-correct
        /// header and randomizes only the records section, so the record parsers and
        /// decompressors see the garbage.
        #[test]
        fn arbitrary_records_section_never_panics(
            codec in codec(),
            count in -1i32..40,
            section in prop::collection::vec(any::<u8>(), 0..300),
        ) {
            let mut batch = sample(codec, 1);
            batch.truncate(BATCH_HEADER_LEN);
            batch.extend_from_slice(&section);
            let length = (batch.len() - LOG_OVERHEAD) as i32;
            batch[LENGTH_AT..EPOCH_AT].copy_from_slice(&length.to_be_bytes());
            batch[LAST_OFFSET_DELTA_AT..BASE_TIMESTAMP_AT]
                .copy_from_slice(&count.wrapping_sub(1).to_be_bytes());
            batch[RECORDS_COUNT_AT..BATCH_HEADER_LEN].copy_from_slice(&count.to_be_bytes());
            write_crc(&mut batch);
            let _ = validate(&batch);
            let _ = decode_records(&Bytes::from(batch), 1 << 16);
        }
    }
}
