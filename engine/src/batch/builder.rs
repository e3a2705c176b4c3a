//! Builds valid v2 batches the way a producer would. The broker never builds batches
//! on the produce path (it stores what producers send); tests, benchmarks and tools do.

use bytes::Bytes;

use super::header::{
    write_crc, BatchHeader, BATCH_HEADER_LEN, CONTROL_BIT, LOG_OVERHEAD, MAGIC_V2,
    TRANSACTIONAL_BIT,
};
use super::records::{write_varint, write_varlong};
use super::{compress, BatchError, Compression};

/// Accumulates records and emits one batch: base offset 0, leader epoch -1, CreateTime,
/// no producer (id -1, epoch -1, sequence -1) unless set. The first record's
/// timestamp is the base timestamp; max_timestamp is the largest pushed.
#[derive(Debug, Clone)]
pub struct BatchBuilder {
    compression: Compression,
    base_offset: i64,
    partition_leader_epoch: i32,
    producer_id: i64,
    producer_epoch: i16,
    base_sequence: i32,
    transactional: bool,
    control: bool,
    /// Encoded records, uncompressed, ready to be the records section.
    records: Vec<u8>,
    records_count: i32,
    base_timestamp: i64,
    max_timestamp: i64,
    /// Reused to encode one record body before its length prefix is known.
    scratch: Vec<u8>,
}

impl Default for BatchBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl BatchBuilder {
    pub fn new() -> Self {
        BatchBuilder {
            compression: Compression::None,
            base_offset: 0,
            partition_leader_epoch: -1,
            producer_id: -1,
            producer_epoch: -1,
            base_sequence: -1,
            transactional: false,
            control: false,
            records: Vec::new(),
            records_count: 0,
            base_timestamp: -1,
            max_timestamp: -1,
            scratch: Vec::new(),
        }
    }

    pub fn compression(mut self, compression: Compression) -> Self {
        self.compression = compression;
        self
    }

    pub fn producer(mut self, producer_id: i64, producer_epoch: i16, base_sequence: i32) -> Self {
        self.producer_id = producer_id;
        self.producer_epoch = producer_epoch;
        self.base_sequence = base_sequence;
        self
    }

    /// Sets the transactional attribute (records of a transaction).
    pub fn transactional(mut self, transactional: bool) -> Self {
        self.transactional = transactional;
        self
    }

    /// Sets the control attribute (a batch of control records: markers).
    pub fn control(mut self, control: bool) -> Self {
        self.control = control;
        self
    }

    pub fn base_offset(mut self, base_offset: i64) -> Self {
        self.base_offset = base_offset;
        self
    }

    pub fn partition_leader_epoch(mut self, partition_leader_epoch: i32) -> Self {
        self.partition_leader_epoch = partition_leader_epoch;
        self
    }

    /// Appends one record with the next offset delta.
    pub fn push(
        &mut self,
        timestamp: i64,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        headers: &[(&[u8], Option<&[u8]>)],
    ) -> &mut Self {
        if self.records_count == 0 {
            self.base_timestamp = timestamp;
            self.max_timestamp = timestamp;
        }
        self.max_timestamp = self.max_timestamp.max(timestamp);

        let body = &mut self.scratch;
        body.clear();
        body.push(0); // record attributes: unused in v2
        write_varlong(body, timestamp.wrapping_sub(self.base_timestamp));
        write_varint(body, self.records_count);
        write_nullable(body, key);
        write_nullable(body, value);
        write_varint(body, len_i32(headers.len()));
        for (header_key, header_value) in headers {
            write_nullable(body, Some(header_key));
            write_nullable(body, *header_value);
        }
        write_varint(&mut self.records, len_i32(body.len()));
        self.records.extend_from_slice(body);
        self.records_count += 1;
        self
    }

    /// Records pushed so far.
    pub fn len(&self) -> usize {
        self.records_count as usize
    }

    pub fn is_empty(&self) -> bool {
        self.records_count == 0
    }

    /// Emits the batch with its CRC. Fails on an empty builder (Kafka batches hold at
    /// least one record) or a batch longer than the i32 length field allows.
    pub fn build(&self) -> Result<Bytes, BatchError> {
        if self.records_count == 0 {
            return Err(BatchError::EmptyBatch(0));
        }
        let section = compress(self.compression, &self.records)?;
        let total_len = BATCH_HEADER_LEN + section.len();
        let batch_length = i32::try_from(total_len - LOG_OVERHEAD)
            .map_err(|_| BatchError::InvalidLength(i32::MAX))?;
        let header = BatchHeader {
            base_offset: self.base_offset,
            batch_length,
            partition_leader_epoch: self.partition_leader_epoch,
            magic: MAGIC_V2,
            crc: 0, // computed below, once the whole batch is in place
            attributes: self.compression.as_attribute_bits()
                | if self.transactional {
                    TRANSACTIONAL_BIT
                } else {
                    0
                }
                | if self.control { CONTROL_BIT } else { 0 },
            last_offset_delta: self.records_count - 1,
            base_timestamp: self.base_timestamp,
            max_timestamp: self.max_timestamp,
            producer_id: self.producer_id,
            producer_epoch: self.producer_epoch,
            base_sequence: self.base_sequence,
            records_count: self.records_count,
        };
        let mut batch = vec![0u8; total_len];
        header.write_to(&mut batch);
        batch[BATCH_HEADER_LEN..].copy_from_slice(&section);
        write_crc(&mut batch);
        Ok(Bytes::from(batch))
    }
}

fn write_nullable(out: &mut Vec<u8>, bytes: Option<&[u8]>) {
    match bytes {
        None => write_varint(out, -1),
        Some(bytes) => {
            write_varint(out, len_i32(bytes.len()));
            out.extend_from_slice(bytes);
        }
    }
}

/// Test and tool inputs are far below 2 GiB; saturate rather than panic, and let
/// the resulting batch fail validation if someone ever gets there.
fn len_i32(len: usize) -> i32 {
    i32::try_from(len).unwrap_or(i32::MAX)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::batch::{decode_records, validate, Record, RecordHeader, TimestampType};
    use proptest::prelude::*;

    /// What a test pushes: timestamp, key, value, headers.
    type Pushed = (
        i64,
        Option<Vec<u8>>,
        Option<Vec<u8>>,
        Vec<(Vec<u8>, Option<Vec<u8>>)>,
    );

    const LIMIT: usize = 1 << 20;

    fn build(codec: Compression, base_offset: i64, records: &[Pushed]) -> Bytes {
        let mut builder = BatchBuilder::new()
            .compression(codec)
            .base_offset(base_offset)
            .producer(7, 3, 42);
        for (timestamp, key, value, headers) in records {
            let headers: Vec<(&[u8], Option<&[u8]>)> = headers
                .iter()
                .map(|(k, v)| (k.as_slice(), v.as_deref()))
                .collect();
            builder.push(*timestamp, key.as_deref(), value.as_deref(), &headers);
        }
        assert_eq!(builder.len(), records.len());
        builder.build().unwrap()
    }

    fn expected(base_offset: i64, records: &[Pushed]) -> Vec<Record> {
        records
            .iter()
            .enumerate()
            .map(|(i, (timestamp, key, value, headers))| Record {
                offset: base_offset + i as i64,
                timestamp: *timestamp,
                attributes: 0,
                key: key.clone().map(Bytes::from),
                value: value.clone().map(Bytes::from),
                headers: headers
                    .iter()
                    .map(|(k, v)| RecordHeader {
                        key: Bytes::from(k.clone()),
                        value: v.clone().map(Bytes::from),
                    })
                    .collect(),
            })
            .collect()
    }

    fn check_round_trip(codec: Compression, base_offset: i64, records: &[Pushed]) {
        let batch = build(codec, base_offset, records);
        let header = validate(&batch).unwrap();
        let count = records.len() as i32;
        assert_eq!(header.base_offset, base_offset);
        assert_eq!(header.partition_leader_epoch, -1);
        assert_eq!(header.records_count, count);
        assert_eq!(header.last_offset_delta, count - 1);
        assert_eq!(header.last_offset(), base_offset + i64::from(count) - 1);
        assert_eq!(header.compression().unwrap(), codec);
        assert_eq!(header.timestamp_type(), TimestampType::CreateTime);
        assert_eq!(
            (
                header.producer_id,
                header.producer_epoch,
                header.base_sequence
            ),
            (7, 3, 42)
        );
        assert_eq!(header.base_timestamp, records[0].0);
        assert_eq!(
            header.max_timestamp,
            records.iter().map(|r| r.0).max().unwrap()
        );
        assert_eq!(
            decode_records(&batch, LIMIT).unwrap(),
            expected(base_offset, records)
        );
    }

    #[test]
    fn round_trip_every_codec() {
        let records: Vec<Pushed> = vec![
            (
                1_700_000_000_000,
                Some(b"key".to_vec()),
                Some(b"value".to_vec()),
                vec![],
            ),
            (1_699_999_999_000, None, Some(vec![0xAB; 3000]), vec![]),
            (
                1_700_000_000_500,
                Some(Vec::new()),
                None,
                vec![
                    (b"trace".to_vec(), Some(b"abc".to_vec())),
                    (b"".to_vec(), None),
                ],
            ),
            (1_700_000_000_100, None, None, vec![]),
        ];
        for codec in Compression::ALL {
            check_round_trip(codec, 1000, &records);
        }
    }

    #[test]
    fn defaults_and_setters() {
        let mut builder = BatchBuilder::default().partition_leader_epoch(9);
        assert!(builder.is_empty());
        builder.push(5, None, Some(b"v"), &[]);
        let header = validate(&builder.build().unwrap()).unwrap();
        assert_eq!(header.base_offset, 0);
        assert_eq!(header.partition_leader_epoch, 9);
        assert_eq!(
            (
                header.producer_id,
                header.producer_epoch,
                header.base_sequence
            ),
            (-1, -1, -1)
        );
        assert!(!header.is_transactional() && !header.is_control());
    }

    #[test]
    fn empty_builder_fails() {
        assert!(matches!(
            BatchBuilder::new().build(),
            Err(BatchError::EmptyBatch(0))
        ));
    }

    fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
        prop::collection::vec(any::<u8>(), 0..max)
    }

    prop_compose! {
        fn pushed()(
            timestamp in any::<i64>(),
            key in prop::option::of(bytes(40)),
            value in prop::option::of(bytes(200)),
            headers in prop::collection::vec((bytes(10), prop::option::of(bytes(20))), 0..4),
        ) -> Pushed {
            (timestamp, key, value, headers)
        }
    }

    proptest! {
        #[test]
        fn arbitrary_records_round_trip(
            records in prop::collection::vec(pushed(), 1..20),
            codec in prop::sample::select(Compression::ALL.to_vec()),
            base_offset in 0..i64::MAX / 2,
        ) {
            check_round_trip(codec, base_offset, &records);
        }
    }
}
