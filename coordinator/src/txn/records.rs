//! The records of `__transaction_state`, in Kafka's own formats
//! (`TransactionLogKey`, `TransactionLogValue`), so Kafka's tools read what
//! skiff writes and skiff reads what Kafka wrote.
//!
//! ```text
//! key    i16 0 | TransactionLogKey v0    transactionalId: string
//! value  i16 version | TransactionLogValue v0 or v1 (flexible)
//!        producerId: int64, producerEpoch: int16,
//!        transactionTimeoutMs: int32, transactionStatus: int8 (Kafka's
//!        TransactionState ids: Empty 0 .. PrepareEpochFence 7),
//!        transactionPartitions: [topic: string, partitionIds: [int32]]?
//!        (null when Empty), transactionLastUpdateTimestampMs: int64,
//!        transactionStartTimestampMs: int64;
//!        v1 tagged: 0 previousProducerId int64, 1 nextProducerId int64,
//!        2 clientTransactionVersion int16
//! ```
//!
//! Written: v0, which every Kafka since 0.11 reads, unless the record has a
//! previous producer id (an epoch exhaustion moved the transactional id to a
//! new one), which only v1 can carry (Kafka 4.0 reads it). Read: both. A
//! null value is a tombstone: the transactional id expired and is gone.
//! Like Kafka, the epoch before the last bump (`last_producer_epoch`) is not
//! in the log: a loaded record has none.

use std::collections::BTreeSet;

use bytes::BufMut;

use super::{Epoch, ProducerId, TopicPartition, TxnRecord, TxnState, NO_EPOCH, NO_PRODUCER_ID};
use crate::wire::{put_compact_string, put_string, put_uvarint, Reader, RecordError};

const KEY_VERSION: i16 = 0;
const PREVIOUS_PRODUCER_ID_TAG: u32 = 0;

impl TxnState {
    /// Kafka's `TransactionState` id, as `transactionStatus` holds it.
    pub fn id(self) -> i8 {
        use TxnState::*;
        match self {
            Empty => 0,
            Ongoing => 1,
            PrepareCommit => 2,
            PrepareAbort => 3,
            CompleteCommit => 4,
            CompleteAbort => 5,
            Dead => 6,
            PrepareEpochFence => 7,
        }
    }

    pub fn from_id(id: i8) -> Option<TxnState> {
        use TxnState::*;
        Some(match id {
            0 => Empty,
            1 => Ongoing,
            2 => PrepareCommit,
            3 => PrepareAbort,
            4 => CompleteCommit,
            5 => CompleteAbort,
            6 => Dead,
            7 => PrepareEpochFence,
            _ => return None,
        })
    }
}

pub fn encode_key(transactional_id: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + transactional_id.len());
    out.put_i16(KEY_VERSION);
    put_string(&mut out, transactional_id);
    out
}

pub fn decode_key(bytes: &[u8]) -> Result<String, RecordError> {
    let mut r = Reader::new(bytes, false);
    match r.i16()? {
        KEY_VERSION => r.string(),
        version => Err(RecordError::UnknownVersion {
            what: "TransactionLogKey",
            version,
        }),
    }
}

/// The partitions grouped by topic, in order.
fn by_topic(partitions: &BTreeSet<TopicPartition>) -> Vec<(&str, Vec<i32>)> {
    let mut topics: Vec<(&str, Vec<i32>)> = Vec::new();
    for tp in partitions {
        match topics.last_mut() {
            Some((topic, ids)) if *topic == tp.topic => ids.push(tp.partition),
            _ => topics.push((&tp.topic, vec![tp.partition])),
        }
    }
    topics
}

pub fn encode_value(record: &TxnRecord) -> Vec<u8> {
    let flexible = record.previous_producer_id != NO_PRODUCER_ID;
    let mut out = Vec::with_capacity(64);
    out.put_i16(if flexible { 1 } else { 0 });
    out.put_i64(record.producer_id);
    out.put_i16(record.producer_epoch);
    out.put_i32(record.timeout_ms);
    out.put_i8(record.state.id());
    // Kafka writes an Empty transaction's partitions as null.
    let topics = (record.state != TxnState::Empty).then(|| by_topic(&record.partitions));
    match (&topics, flexible) {
        (None, false) => out.put_i32(-1),
        (None, true) => put_uvarint(&mut out, 0),
        (Some(topics), false) => {
            out.put_i32(topics.len() as i32);
            for (topic, ids) in topics {
                put_string(&mut out, topic);
                out.put_i32(ids.len() as i32);
                ids.iter().for_each(|id| out.put_i32(*id));
            }
        }
        (Some(topics), true) => {
            put_uvarint(&mut out, topics.len() as u32 + 1);
            for (topic, ids) in topics {
                put_compact_string(&mut out, topic);
                put_uvarint(&mut out, ids.len() as u32 + 1);
                ids.iter().for_each(|id| out.put_i32(*id));
                put_uvarint(&mut out, 0); // the entry's tagged fields
            }
        }
    }
    out.put_i64(record.update_ms);
    out.put_i64(record.start_ms);
    if flexible {
        put_uvarint(&mut out, 1);
        put_uvarint(&mut out, PREVIOUS_PRODUCER_ID_TAG);
        put_uvarint(&mut out, 8);
        out.put_i64(record.previous_producer_id);
    }
    out
}

pub fn decode_value(bytes: &[u8]) -> Result<TxnRecord, RecordError> {
    let version = Reader::new(bytes, false).i16()?;
    if !(0..=1).contains(&version) {
        return Err(RecordError::UnknownVersion {
            what: "TransactionLogValue",
            version,
        });
    }
    let mut r = Reader::new(bytes, version >= 1);
    r.position = 2;
    let producer_id: ProducerId = r.i64()?;
    let producer_epoch: Epoch = r.i16()?;
    let timeout_ms = r.i32()?;
    let status = r.i8()?;
    let state = TxnState::from_id(status).ok_or(RecordError::UnknownTxnState(status))?;
    let mut partitions = BTreeSet::new();
    // The smallest topic entry: an empty string and an empty array.
    let position = r.position;
    let topics = if r.flexible {
        i64::from(r.uvarint()?) - 1
    } else {
        i64::from(r.i32()?)
    };
    if topics < -1 || topics.saturating_mul(if r.flexible { 3 } else { 6 }) > bytes.len() as i64 {
        return Err(RecordError::BadLength {
            position,
            length: topics,
        });
    }
    for _ in 0..topics.max(0) {
        let topic = r.string()?;
        for _ in 0..r.array_count(4)? {
            partitions.insert(TopicPartition {
                topic: topic.clone(),
                partition: r.i32()?,
            });
        }
        r.tagged_fields()?;
    }
    let update_ms = r.i64()?;
    let start_ms = r.i64()?;
    let mut previous_producer_id = NO_PRODUCER_ID;
    r.tagged_fields_with(|tag, value| {
        if tag == PREVIOUS_PRODUCER_ID_TAG {
            let mut v = Reader::new(value, false);
            previous_producer_id = v.i64()?;
        }
        Ok(())
    })?;
    Ok(TxnRecord {
        producer_id,
        previous_producer_id,
        producer_epoch,
        last_producer_epoch: NO_EPOCH,
        timeout_ms,
        state,
        partitions,
        start_ms,
        update_ms,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn tp(topic: &str, partition: i32) -> TopicPartition {
        TopicPartition {
            topic: topic.into(),
            partition,
        }
    }

    fn ongoing() -> TxnRecord {
        TxnRecord {
            producer_id: 1000,
            previous_producer_id: NO_PRODUCER_ID,
            producer_epoch: 3,
            last_producer_epoch: NO_EPOCH,
            timeout_ms: 60_000,
            state: TxnState::Ongoing,
            partitions: [tp("a", 1), tp("a", 0), tp("bc", 7)].into_iter().collect(),
            start_ms: 1_700_000_000_000,
            update_ms: 1_700_000_000_500,
        }
    }

    /// TransactionLogKey v0 {"tx-1"}, byte by byte from Kafka's schema.
    const KEY: &[u8] = &[0, 0, 0, 4, b't', b'x', b'-', b'1'];

    /// `ongoing()` as TransactionLogValue v0, byte by byte from the schema.
    fn ongoing_v0() -> Vec<u8> {
        let mut v = vec![0, 0]; // version 0
        v.extend_from_slice(&1000i64.to_be_bytes()); // producerId
        v.extend_from_slice(&[0, 3]); // producerEpoch
        v.extend_from_slice(&60_000i32.to_be_bytes()); // transactionTimeoutMs
        v.push(1); // transactionStatus: Ongoing
        v.extend_from_slice(&[0, 0, 0, 2]); // two topics
        v.extend_from_slice(&[0, 1, b'a', 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 1]);
        v.extend_from_slice(&[0, 2, b'b', b'c', 0, 0, 0, 1, 0, 0, 0, 7]);
        v.extend_from_slice(&1_700_000_000_500i64.to_be_bytes()); // last update
        v.extend_from_slice(&1_700_000_000_000i64.to_be_bytes()); // start
        v
    }

    #[test]
    fn key_matches_kafkas_bytes() {
        assert_eq!(encode_key("tx-1"), KEY);
        assert_eq!(decode_key(KEY).unwrap(), "tx-1");
        assert!(matches!(
            decode_key(&[0, 1, 0, 0]),
            Err(RecordError::UnknownVersion { .. })
        ));
    }

    #[test]
    fn value_v0_matches_kafkas_bytes() {
        assert_eq!(encode_value(&ongoing()), ongoing_v0());
        assert_eq!(decode_value(&ongoing_v0()).unwrap(), ongoing());
    }

    #[test]
    fn an_empty_transactions_partitions_are_null() {
        let mut empty = ongoing();
        empty.state = TxnState::Empty;
        empty.partitions.clear();
        let bytes = encode_value(&empty);
        assert_eq!(&bytes[17..21], &(-1i32).to_be_bytes());
        assert_eq!(decode_value(&bytes).unwrap(), empty);
    }

    #[test]
    fn a_previous_producer_id_is_written_as_v1_and_read_back() {
        let mut moved = ongoing();
        moved.previous_producer_id = 999;
        moved.state = TxnState::PrepareCommit;
        let bytes = encode_value(&moved);
        assert_eq!(&bytes[..2], &[0, 1]);
        assert_eq!(decode_value(&bytes).unwrap(), moved);
    }

    /// A v1 value as Kafka 4.0 writes it: compact lengths, the entry's
    /// tagged fields, and all three value tags (skiff keeps tag 0 and skips
    /// the others).
    #[test]
    fn value_v1_from_kafka_with_every_tag_is_read() {
        let mut v = vec![0, 1];
        v.extend_from_slice(&42i64.to_be_bytes());
        v.extend_from_slice(&[0, 0]);
        v.extend_from_slice(&1_000i32.to_be_bytes());
        v.push(5); // CompleteAbort
        v.extend_from_slice(&[2, 2, b't', 3, 0, 0, 0, 4, 0, 0, 0, 5, 0]);
        v.extend_from_slice(&7i64.to_be_bytes());
        v.extend_from_slice(&6i64.to_be_bytes());
        v.push(3); // three tagged fields
        v.extend_from_slice(&[0, 8]);
        v.extend_from_slice(&41i64.to_be_bytes());
        v.extend_from_slice(&[1, 8]);
        v.extend_from_slice(&43i64.to_be_bytes());
        v.extend_from_slice(&[2, 2, 0, 2]);
        let record = decode_value(&v).unwrap();
        assert_eq!(record.producer_id, 42);
        assert_eq!(record.previous_producer_id, 41);
        assert_eq!(record.state, TxnState::CompleteAbort);
        assert_eq!(
            record.partitions,
            [tp("t", 4), tp("t", 5)].into_iter().collect()
        );
        assert_eq!((record.update_ms, record.start_ms), (7, 6));
        assert_eq!(encode_value(&record), {
            // Written back: v1 (it has a previous id), only tag 0.
            let mut w = v[..v.len() - 1 - 10 - 10 - 4].to_vec();
            w.extend_from_slice(&[1, 0, 8]);
            w.extend_from_slice(&41i64.to_be_bytes());
            w
        });
    }

    #[test]
    fn every_state_id_round_trips_and_unknown_ones_are_errors() {
        for id in 0..8 {
            assert_eq!(TxnState::from_id(id).unwrap().id(), id);
        }
        let mut bytes = ongoing_v0();
        bytes[16] = 9;
        assert_eq!(decode_value(&bytes), Err(RecordError::UnknownTxnState(9)));
    }

    #[test]
    fn short_and_lying_values_are_errors_not_panics() {
        let bytes = ongoing_v0();
        for cut in 0..bytes.len() {
            assert!(decode_value(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut huge = bytes.clone();
        huge[17..21].copy_from_slice(&i32::MAX.to_be_bytes());
        assert!(matches!(
            decode_value(&huge),
            Err(RecordError::BadLength { .. })
        ));
        let mut negative = bytes;
        negative[17..21].copy_from_slice(&(-2i32).to_be_bytes());
        assert!(matches!(
            decode_value(&negative),
            Err(RecordError::BadLength { .. })
        ));
    }
}
