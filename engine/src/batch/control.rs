//! Control batches: the COMMIT and ABORT markers that end a transaction on a
//! partition (Kafka's `EndTransactionMarker`), in Kafka's format.
//!
//! A marker is a batch with the transactional and control attributes, the
//! transaction's producer id and epoch, no sequence, and one record:
//!
//! ```text
//! key    version: i16 (0) | type: i16 (ABORT 0, COMMIT 1)   ControlRecordType
//! value  version: i16 (0) | coordinator epoch: i32          EndTransactionMarker
//! ```
//!
//! Other control types (KRaft's LeaderChange 2, snapshot headers 3 and 4)
//! are not markers; [`parse_marker`] says so with `None`.

use bytes::Bytes;

use super::{decode_records, BatchBuilder, BatchError, BatchHeader};

const CONTROL_KEY_VERSION: i16 = 0;
const MARKER_VALUE_VERSION: i16 = 0;
const ABORT: i16 = 0;
const COMMIT: i16 = 1;

/// What a COMMIT or ABORT marker says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EndTxnMarker {
    pub commit: bool,
    /// The transaction coordinator's epoch (its `__transaction_state`
    /// partition's leader epoch) when it wrote the marker: a partition
    /// refuses markers from an older coordinator.
    pub coordinator_epoch: i32,
}

/// The marker batch ending `producer_id`'s transaction at `producer_epoch`
/// (base offset 0 and leader epoch -1: the leader stamps both on append).
pub fn marker_batch(
    producer_id: i64,
    producer_epoch: i16,
    marker: EndTxnMarker,
    timestamp_ms: i64,
) -> Result<Bytes, BatchError> {
    let mut key = Vec::with_capacity(4);
    key.extend_from_slice(&CONTROL_KEY_VERSION.to_be_bytes());
    key.extend_from_slice(&(if marker.commit { COMMIT } else { ABORT }).to_be_bytes());
    let mut value = Vec::with_capacity(6);
    value.extend_from_slice(&MARKER_VALUE_VERSION.to_be_bytes());
    value.extend_from_slice(&marker.coordinator_epoch.to_be_bytes());
    let mut builder = BatchBuilder::new()
        .producer(producer_id, producer_epoch, -1)
        .transactional(true)
        .control(true);
    builder.push(timestamp_ms, Some(&key), Some(&value), &[]);
    builder.build()
}

/// The marker a control batch holds (`batch` is exactly one batch); `None`
/// for a batch that is not a control batch or holds another control type.
/// A control batch whose record is malformed is an error.
pub fn parse_marker(batch: &Bytes) -> Result<Option<EndTxnMarker>, BatchError> {
    let header = BatchHeader::parse(batch)?;
    if !header.is_control() {
        return Ok(None);
    }
    let records = decode_records(batch, batch.len().max(1 << 10))?;
    let [record] = records.as_slice() else {
        return Err(BatchError::InvalidRecord(
            "a control batch holds one record",
        ));
    };
    let key = record
        .key
        .as_deref()
        .filter(|k| k.len() >= 4)
        .ok_or(BatchError::InvalidRecord(
            "control record key shorter than 4 bytes",
        ))?;
    let version = i16::from_be_bytes([key[0], key[1]]);
    let kind = i16::from_be_bytes([key[2], key[3]]);
    if version != CONTROL_KEY_VERSION || !(kind == ABORT || kind == COMMIT) {
        return Ok(None);
    }
    let value =
        record
            .value
            .as_deref()
            .filter(|v| v.len() >= 6)
            .ok_or(BatchError::InvalidRecord(
                "transaction marker value shorter than 6 bytes",
            ))?;
    Ok(Some(EndTxnMarker {
        commit: kind == COMMIT,
        coordinator_epoch: i32::from_be_bytes([value[2], value[3], value[4], value[5]]),
    }))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::batch::validate;

    #[test]
    fn a_marker_is_a_transactional_control_batch_of_one_record() {
        let marker = EndTxnMarker {
            commit: true,
            coordinator_epoch: 7,
        };
        let batch = marker_batch(1000, 3, marker, 1_700_000_000_000).unwrap();
        let header = validate(&batch).unwrap();
        assert!(header.is_control() && header.is_transactional());
        assert_eq!((header.producer_id, header.producer_epoch), (1000, 3));
        assert_eq!((header.base_sequence, header.records_count), (-1, 1));
        let records = decode_records(&batch, 1 << 20).unwrap();
        // Kafka's bytes: key version 0, type COMMIT 1; value version 0, epoch 7.
        assert_eq!(records[0].key.as_deref(), Some(&[0u8, 0, 0, 1][..]));
        assert_eq!(records[0].value.as_deref(), Some(&[0u8, 0, 0, 0, 0, 7][..]));
        assert_eq!(parse_marker(&batch).unwrap(), Some(marker));

        let abort = EndTxnMarker {
            commit: false,
            coordinator_epoch: 0,
        };
        let batch = marker_batch(1000, 4, abort, 0).unwrap();
        assert_eq!(parse_marker(&batch).unwrap(), Some(abort));
    }

    #[test]
    fn other_batches_are_not_markers() {
        let mut data = BatchBuilder::new().transactional(true);
        data.push(0, None, Some(b"v"), &[]);
        let data = data.build().unwrap();
        assert!(validate(&data).unwrap().is_transactional());
        assert_eq!(parse_marker(&data).unwrap(), None);

        // KRaft's LeaderChange control record (type 2).
        let mut leader_change = BatchBuilder::new().control(true);
        leader_change.push(0, Some(&[0, 0, 0, 2]), Some(&[0, 0]), &[]);
        assert_eq!(parse_marker(&leader_change.build().unwrap()).unwrap(), None);
    }

    #[test]
    fn malformed_control_records_are_errors() {
        let mut short_key = BatchBuilder::new().control(true);
        short_key.push(0, Some(&[0, 0]), Some(&[0, 0, 0, 0, 0, 0]), &[]);
        assert!(parse_marker(&short_key.build().unwrap()).is_err());

        let mut short_value = BatchBuilder::new().control(true);
        short_value.push(0, Some(&[0, 0, 0, 1]), Some(&[0, 0]), &[]);
        assert!(parse_marker(&short_value.build().unwrap()).is_err());

        let mut two = BatchBuilder::new().control(true);
        two.push(0, Some(&[0, 0, 0, 1]), Some(&[0, 0, 0, 0, 0, 1]), &[]);
        two.push(0, Some(&[0, 0, 0, 1]), Some(&[0, 0, 0, 0, 0, 1]), &[]);
        assert!(parse_marker(&two.build().unwrap()).is_err());
    }
}
