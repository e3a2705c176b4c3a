//! Idempotent producer state of one partition (Kafka's ProducerStateManager, cut
//! to what idempotence needs): for each producer id, its epoch and the sequence
//! ranges and offsets of its last `BATCHES_KEPT` batches.
//!
//! A batch whose sequences match a remembered one is a retry: it is answered with
//! the original offsets and not appended again. A batch that does not continue the
//! last sequence is OUT_OF_ORDER_SEQUENCE_NUMBER; an older epoch is
//! INVALID_PRODUCER_EPOCH (fenced); a producer this partition has never seen must
//! start at sequence 0, else UNKNOWN_PRODUCER_ID (the client then resets).
//!
//! Transactions (issue 18, not yet driven by the node): a transactional data
//! batch opens its producer's transaction (`record_txn_data`); a COMMIT or
//! ABORT marker from the coordinator is checked against the producer's
//! epoch (`check_marker`: an older one is fenced) and completes it
//! (`record_marker`, which returns an aborted transaction's `.txnindex`
//! entry). The open transactions (engine's `TxnTracker`) give the last
//! stable offset and are kept in snapshots.
//!
//! The state is rebuilt from the log itself (the batches carry producer id, epoch
//! and sequence) the first time an idempotent batch arrives after the partition is
//! opened or led again: from the latest producer snapshot the engine holds
//! (`encode`/`decode` here, written by `producer::snapshot_producers`),
//! then the log after it; from the log's start when there is none.

use std::collections::{HashMap, VecDeque};

use skiff_engine::segment::txn_index::AbortedTxn;
use skiff_engine::txn::TxnTracker;

/// Kafka keeps the last five batches per producer (max.in.flight = 5).
pub const BATCHES_KEPT: usize = 5;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchMeta {
    pub first_seq: i32,
    pub last_seq: i32,
    pub base_offset: i64,
    pub last_offset: i64,
}

#[derive(Debug, Default)]
struct ProducerEntry {
    epoch: i16,
    batches: VecDeque<BatchMeta>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SequenceCheck {
    /// New in-order batch: append it.
    Append,
    /// A retry of a batch already in the log at these offsets.
    Duplicate {
        base_offset: i64,
        last_offset: i64,
    },
    OutOfOrder {
        expected: i32,
        got: i32,
    },
    Fenced {
        current_epoch: i16,
    },
    UnknownProducer,
}

/// One producer as DescribeProducers shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DescribedProducer {
    pub producer_id: i64,
    pub epoch: i16,
    pub last_sequence: i32,
    /// The offset of its last batch.
    pub last_offset: i64,
    /// The last transaction coordinator epoch of its markers here (-1: none).
    pub coordinator_epoch: i32,
    /// Where its open transaction began (-1: none).
    pub txn_start_offset: i64,
}

/// A COMMIT or ABORT marker's check against the producer's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MarkerCheck {
    Append,
    /// The producer has moved to a later epoch: INVALID_PRODUCER_EPOCH.
    Fenced {
        current_epoch: i16,
    },
}

#[derive(Debug, Default)]
pub struct ProducerStates {
    producers: HashMap<i64, ProducerEntry>,
    txns: TxnTracker,
    /// Markers recorded per producer since this state was built: a KIP-890
    /// check's guard (a marker between the check and the append means the
    /// transaction ended meanwhile).
    markers_seen: HashMap<i64, u64>,
    /// The latest transaction coordinator epoch whose marker each producer
    /// got here: a marker from an older coordinator (one deposed, writing
    /// late) is TRANSACTION_COORDINATOR_FENCED, so it cannot end a later
    /// transaction of the same producer and epoch.
    coordinator_epochs: HashMap<i64, i32>,
}

/// Version 3 adds the producers' coordinator epochs, version 2 the open
/// transactions; versions 1 (no transactions) and 2 are still read.
const SNAPSHOT_VERSION: u8 = 3;
const SNAPSHOT_VERSION_NO_COORDINATOR_EPOCHS: u8 = 2;
const SNAPSHOT_VERSION_NO_TXNS: u8 = 1;
/// Bytes of one open transaction in a snapshot.
const OPEN_TXN_LEN: usize = 8 + 8;
/// Bytes of one producer's coordinator epoch in a snapshot.
const COORDINATOR_EPOCH_LEN: usize = 8 + 4;
/// Bytes of a producer's fixed part and of one batch in a snapshot.
const ENTRY_LEN: usize = 8 + 2 + 1;
const META_LEN: usize = 4 + 4 + 8 + 8;

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn left(&self) -> usize {
        self.bytes.len() - self.pos
    }

    fn take<const N: usize>(&mut self) -> Result<[u8; N], String> {
        let end = self.pos + N;
        let Some(slice) = self.bytes.get(self.pos..end) else {
            return Err(format!("truncated producer snapshot at byte {}", self.pos));
        };
        self.pos = end;
        let mut out = [0u8; N];
        out.copy_from_slice(slice);
        Ok(out)
    }
}

/// The sequence after `seq` (sequences wrap at i32::MAX to 0, as in Kafka).
fn next_seq(seq: i32) -> i32 {
    if seq == i32::MAX {
        0
    } else {
        seq + 1
    }
}

impl ProducerStates {
    pub fn check(
        &self,
        producer_id: i64,
        epoch: i16,
        first_seq: i32,
        last_seq: i32,
    ) -> SequenceCheck {
        let Some(entry) = self.producers.get(&producer_id) else {
            return if first_seq == 0 {
                SequenceCheck::Append
            } else {
                SequenceCheck::UnknownProducer
            };
        };
        if epoch < entry.epoch {
            return SequenceCheck::Fenced {
                current_epoch: entry.epoch,
            };
        }
        if epoch > entry.epoch {
            // A bumped epoch restarts the sequence.
            return if first_seq == 0 {
                SequenceCheck::Append
            } else {
                SequenceCheck::OutOfOrder {
                    expected: 0,
                    got: first_seq,
                }
            };
        }
        if let Some(b) = entry
            .batches
            .iter()
            .find(|b| b.first_seq == first_seq && b.last_seq == last_seq)
        {
            return SequenceCheck::Duplicate {
                base_offset: b.base_offset,
                last_offset: b.last_offset,
            };
        }
        let expected = entry.batches.back().map_or(0, |b| next_seq(b.last_seq));
        if first_seq == expected {
            SequenceCheck::Append
        } else {
            SequenceCheck::OutOfOrder {
                expected,
                got: first_seq,
            }
        }
    }

    /// Records an appended batch (also used when rebuilding from the log).
    pub fn record(&mut self, producer_id: i64, epoch: i16, meta: BatchMeta) {
        let entry = self.producers.entry(producer_id).or_default();
        if epoch != entry.epoch {
            entry.epoch = epoch;
            entry.batches.clear();
        }
        entry.batches.push_back(meta);
        while entry.batches.len() > BATCHES_KEPT {
            entry.batches.pop_front();
        }
    }

    /// A transactional data batch of `producer_id` was appended at
    /// `base_offset` (after `record`): opens its transaction if none is.
    pub fn record_txn_data(&mut self, producer_id: i64, base_offset: i64) {
        self.txns.on_data(producer_id, base_offset);
    }

    /// Whether a marker of `producer_id` at `epoch` may be written: not
    /// from an epoch older than the producer's (a fenced producer's
    /// transaction was already ended by the coordinator at the newer one).
    pub fn check_marker(&self, producer_id: i64, epoch: i16) -> MarkerCheck {
        match self.producers.get(&producer_id) {
            Some(entry) if epoch < entry.epoch => MarkerCheck::Fenced {
                current_epoch: entry.epoch,
            },
            _ => MarkerCheck::Append,
        }
    }

    /// A marker of `producer_id` at `epoch` was appended at `offset`: the
    /// producer takes the epoch (a later one forgets its sequences, as a
    /// bump does) and its transaction completes; an aborted one is returned
    /// for the segment's `.txnindex`.
    pub fn record_marker(
        &mut self,
        producer_id: i64,
        epoch: i16,
        offset: i64,
        commit: bool,
    ) -> Option<AbortedTxn> {
        let entry = self.producers.entry(producer_id).or_default();
        if epoch != entry.epoch {
            entry.epoch = epoch;
            entry.batches.clear();
        }
        *self.markers_seen.entry(producer_id).or_default() += 1;
        self.txns.on_marker(producer_id, offset, commit)
    }

    /// The coordinator epoch a marker of `producer_id` must reach: Some(the
    /// latest seen) when `coordinator_epoch` is older than it.
    pub fn coordinator_fenced(&self, producer_id: i64, coordinator_epoch: i32) -> Option<i32> {
        self.coordinator_epochs
            .get(&producer_id)
            .copied()
            .filter(|latest| coordinator_epoch < *latest)
    }

    /// A marker of `producer_id` from a coordinator at `coordinator_epoch`
    /// was appended.
    pub fn record_coordinator(&mut self, producer_id: i64, coordinator_epoch: i32) {
        let latest = self
            .coordinator_epochs
            .entry(producer_id)
            .or_insert(coordinator_epoch);
        *latest = (*latest).max(coordinator_epoch);
    }

    /// Whether `producer_id` has a transaction open on this partition.
    /// Where `producer_id`'s open transaction began, when a batch that is not
    /// `transactional` comes from it: Kafka refuses that (INVALID_TXN_STATE),
    /// or the write would sit inside the transaction and be committed or
    /// aborted with it.
    pub fn plain_write_in_txn(&self, producer_id: i64, transactional: bool) -> Option<i64> {
        if transactional {
            None
        } else {
            self.txns.open_of(producer_id)
        }
    }

    pub fn txn_open(&self, producer_id: i64) -> bool {
        self.txns.open_of(producer_id).is_some()
    }

    /// How many markers of `producer_id` this state has recorded.
    pub fn markers_seen(&self, producer_id: i64) -> u64 {
        self.markers_seen.get(&producer_id).copied().unwrap_or(0)
    }

    /// The partition's open and unreplicated transactions (the LSO).
    pub fn txns(&self) -> &TxnTracker {
        &self.txns
    }

    /// The high watermark moved: completed transactions below it are stable.
    pub fn on_high_watermark(&mut self, hw: i64) {
        self.txns.on_high_watermark(hw);
    }

    /// Every producer with its epoch, last sequence and the offset of its
    /// last batch (DescribeProducers), by producer id.
    pub fn describe(&self) -> Vec<DescribedProducer> {
        let mut out: Vec<DescribedProducer> = self
            .producers
            .iter()
            .filter_map(|(id, e)| {
                let last = e.batches.back()?;
                Some(DescribedProducer {
                    producer_id: *id,
                    epoch: e.epoch,
                    last_sequence: last.last_seq,
                    last_offset: last.last_offset,
                    coordinator_epoch: self.coordinator_epochs.get(id).copied().unwrap_or(-1),
                    txn_start_offset: self.txns.open_of(*id).unwrap_or(-1),
                })
            })
            .collect();
        out.sort_unstable_by_key(|p| p.producer_id);
        out
    }

    /// The state as snapshot bytes: `version u8 (2) | producers u32 BE`, then
    /// per producer (by id) `id i64 | epoch i16 | batches u8`, then per batch
    /// `first_seq i32 | last_seq i32 | base_offset i64 | last_offset i64`,
    /// then `open transactions u32 BE` and per one (by first offset)
    /// `producer id i64 | first offset i64`, then `coordinator epochs u32
    /// BE` and per producer (by id) `producer id i64 | coordinator epoch
    /// i32` (big-endian): a snapshot taken after a producer's last marker
    /// must still fence a deposed coordinator's late one. The engine frames
    /// it with a CRC.
    pub fn encode(&self) -> Vec<u8> {
        let mut ids: Vec<i64> = self.producers.keys().copied().collect();
        ids.sort_unstable();
        let mut out = Vec::with_capacity(5 + ids.len() * (ENTRY_LEN + BATCHES_KEPT * META_LEN));
        out.push(SNAPSHOT_VERSION);
        out.extend_from_slice(&(ids.len() as u32).to_be_bytes());
        for id in ids {
            let entry = &self.producers[&id];
            out.extend_from_slice(&id.to_be_bytes());
            out.extend_from_slice(&entry.epoch.to_be_bytes());
            out.push(entry.batches.len() as u8);
            for b in &entry.batches {
                out.extend_from_slice(&b.first_seq.to_be_bytes());
                out.extend_from_slice(&b.last_seq.to_be_bytes());
                out.extend_from_slice(&b.base_offset.to_be_bytes());
                out.extend_from_slice(&b.last_offset.to_be_bytes());
            }
        }
        let open: Vec<(i64, i64)> = self.txns.open().collect();
        out.extend_from_slice(&(open.len() as u32).to_be_bytes());
        for (producer_id, first_offset) in open {
            out.extend_from_slice(&producer_id.to_be_bytes());
            out.extend_from_slice(&first_offset.to_be_bytes());
        }
        let mut epochs: Vec<(i64, i32)> = self
            .coordinator_epochs
            .iter()
            .map(|(id, e)| (*id, *e))
            .collect();
        epochs.sort_unstable();
        out.extend_from_slice(&(epochs.len() as u32).to_be_bytes());
        for (producer_id, epoch) in epochs {
            out.extend_from_slice(&producer_id.to_be_bytes());
            out.extend_from_slice(&epoch.to_be_bytes());
        }
        out
    }

    /// The state `encode` wrote, or why these bytes are not one (never a
    /// panic; nothing is allocated beyond what the bytes can hold).
    pub fn decode(bytes: &[u8]) -> Result<ProducerStates, String> {
        let mut r = Reader { bytes, pos: 0 };
        let version = r.take::<1>()?[0];
        if ![
            SNAPSHOT_VERSION,
            SNAPSHOT_VERSION_NO_COORDINATOR_EPOCHS,
            SNAPSHOT_VERSION_NO_TXNS,
        ]
        .contains(&version)
        {
            return Err(format!("unknown producer snapshot version {version}"));
        }
        let count = u32::from_be_bytes(r.take()?) as usize;
        if count > r.left() / ENTRY_LEN {
            return Err(format!(
                "{count} producers cannot fit in {} bytes",
                r.left()
            ));
        }
        let mut producers = HashMap::with_capacity(count);
        for _ in 0..count {
            let id = i64::from_be_bytes(r.take()?);
            let epoch = i16::from_be_bytes(r.take()?);
            let n = r.take::<1>()?[0] as usize;
            if n > BATCHES_KEPT {
                return Err(format!(
                    "producer {id}: {n} batches, at most {BATCHES_KEPT}"
                ));
            }
            let mut batches = VecDeque::with_capacity(n);
            for _ in 0..n {
                batches.push_back(BatchMeta {
                    first_seq: i32::from_be_bytes(r.take()?),
                    last_seq: i32::from_be_bytes(r.take()?),
                    base_offset: i64::from_be_bytes(r.take()?),
                    last_offset: i64::from_be_bytes(r.take()?),
                });
            }
            if producers
                .insert(id, ProducerEntry { epoch, batches })
                .is_some()
            {
                return Err(format!("producer {id} appears twice"));
            }
        }
        let mut txns = TxnTracker::default();
        if version >= SNAPSHOT_VERSION_NO_COORDINATOR_EPOCHS {
            let open = u32::from_be_bytes(r.take()?) as usize;
            if open > r.left() / OPEN_TXN_LEN {
                return Err(format!(
                    "{open} open transactions cannot fit in {} bytes",
                    r.left()
                ));
            }
            for _ in 0..open {
                let producer_id = i64::from_be_bytes(r.take()?);
                let first_offset = i64::from_be_bytes(r.take()?);
                if txns.open_of(producer_id).is_some() {
                    return Err(format!("producer {producer_id} has two open transactions"));
                }
                txns.on_data(producer_id, first_offset);
            }
        }
        let mut coordinator_epochs = HashMap::new();
        if version >= SNAPSHOT_VERSION {
            let n = u32::from_be_bytes(r.take()?) as usize;
            if n > r.left() / COORDINATOR_EPOCH_LEN {
                return Err(format!(
                    "{n} coordinator epochs cannot fit in {} bytes",
                    r.left()
                ));
            }
            for _ in 0..n {
                let producer_id = i64::from_be_bytes(r.take()?);
                let epoch = i32::from_be_bytes(r.take()?);
                if coordinator_epochs.insert(producer_id, epoch).is_some() {
                    return Err(format!("producer {producer_id} has two coordinator epochs"));
                }
            }
        }
        if r.left() != 0 {
            return Err(format!("{} bytes after the last producer", r.left()));
        }
        Ok(ProducerStates {
            producers,
            txns,
            markers_seen: HashMap::new(),
            coordinator_epochs,
        })
    }

    /// Forgets batches and transactions at or past `offset` (the log was
    /// truncated; a transaction whose marker was cut is open again).
    pub fn truncate(&mut self, offset: i64) {
        for entry in self.producers.values_mut() {
            entry.batches.retain(|b| b.base_offset < offset);
        }
        self.txns.truncate(offset);
        let txns = &self.txns;
        self.producers
            .retain(|id, e| !e.batches.is_empty() || txns.open_of(*id).is_some());
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_encoding_round_trips_and_refuses_garbage() {
        let empty = ProducerStates::default();
        assert_eq!(empty.encode(), vec![3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        assert!(ProducerStates::decode(&empty.encode())
            .unwrap()
            .producers
            .is_empty());
        let mut s = ProducerStates::default();
        for id in 0..20i64 {
            for i in 0..(id as i32 % 8) {
                s.record(
                    id << 32,
                    (id % 3) as i16,
                    meta(i * 2, i * 2 + 1, id * 1000 + i64::from(i) * 2),
                );
            }
            if id % 4 == 0 {
                s.record_coordinator(id << 32, id as i32);
            }
        }
        let bytes = s.encode();
        let back = ProducerStates::decode(&bytes).unwrap();
        assert_eq!(back.encode(), bytes);
        assert_eq!(back.producers.len(), s.producers.len());
        // Every cut, every flipped byte, anything appended: an error or a
        // state, never a panic; a cut or an extra byte is always an error.
        for cut in 0..bytes.len() {
            assert!(
                ProducerStates::decode(&bytes[..cut]).is_err(),
                "cut at {cut}"
            );
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(ProducerStates::decode(&longer).is_err());
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0xff;
            let _ = ProducerStates::decode(&b);
        }
        assert!(ProducerStates::decode(&[]).is_err());
        assert!(
            ProducerStates::decode(&[4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]).is_err(),
            "unknown version"
        );
        // Versions 1 (before transactions) and 2 (before coordinator
        // epochs) are read.
        assert!(ProducerStates::decode(&[1, 0, 0, 0, 0]).is_ok());
        assert!(ProducerStates::decode(&[2, 0, 0, 0, 0, 0, 0, 0, 0]).is_ok());
        // The same producer's coordinator epoch twice.
        let mut b = vec![3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2];
        b.extend_from_slice(&[0; 2 * COORDINATOR_EPOCH_LEN]);
        assert!(ProducerStates::decode(&b).is_err());
        assert!(
            ProducerStates::decode(&[1, 0xff, 0xff, 0xff, 0xff]).is_err(),
            "huge count"
        );
        // Too many batches for one producer.
        let mut b = vec![1, 0, 0, 0, 1];
        b.extend_from_slice(&[0; 10]);
        b.push(6);
        b.extend_from_slice(&[0; 6 * META_LEN]);
        assert!(ProducerStates::decode(&b).is_err());
        // The same producer twice.
        let mut b = vec![1, 0, 0, 0, 2];
        b.extend_from_slice(&[0; 11]);
        b.extend_from_slice(&[0; 11]);
        assert!(ProducerStates::decode(&b).is_err());
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for len in 0..400 {
            let junk: Vec<u8> = (0..len)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    seed as u8
                })
                .collect();
            let _ = ProducerStates::decode(&junk);
        }
    }

    fn meta(first_seq: i32, last_seq: i32, base: i64) -> BatchMeta {
        BatchMeta {
            first_seq,
            last_seq,
            base_offset: base,
            last_offset: base + i64::from(last_seq - first_seq),
        }
    }

    #[test]
    fn sequences() {
        let mut s = ProducerStates::default();
        assert_eq!(s.check(7, 0, 5, 9), SequenceCheck::UnknownProducer);
        assert_eq!(s.check(7, 0, 0, 4), SequenceCheck::Append);
        s.record(7, 0, meta(0, 4, 100));
        assert_eq!(
            s.check(7, 0, 0, 4),
            SequenceCheck::Duplicate {
                base_offset: 100,
                last_offset: 104
            }
        );
        assert_eq!(
            s.check(7, 0, 6, 9),
            SequenceCheck::OutOfOrder {
                expected: 5,
                got: 6
            }
        );
        assert_eq!(s.check(7, 0, 5, 9), SequenceCheck::Append);
        for i in 1..=6 {
            s.record(7, 0, meta(i * 5, i * 5 + 4, 100 + i64::from(i) * 5));
        }
        // Only the last five batches are remembered.
        assert_eq!(
            s.check(7, 0, 5, 9),
            SequenceCheck::OutOfOrder {
                expected: 35,
                got: 5
            }
        );
        assert_eq!(
            s.check(7, 0, 30, 34),
            SequenceCheck::Duplicate {
                base_offset: 130,
                last_offset: 134
            }
        );
        assert_eq!(
            s.check(7, 1, 3, 3),
            SequenceCheck::OutOfOrder {
                expected: 0,
                got: 3
            }
        );
        assert_eq!(s.check(7, 1, 0, 0), SequenceCheck::Append);
        s.record(7, 1, meta(0, 0, 200));
        assert_eq!(
            s.check(7, 0, 35, 35),
            SequenceCheck::Fenced { current_epoch: 1 }
        );
        assert_eq!(next_seq(i32::MAX), 0);
        // The state survives a snapshot round trip, answer for answer.
        s.record(9, 3, meta(0, 0, 300));
        let back = ProducerStates::decode(&s.encode()).unwrap();
        assert_eq!(back.encode(), s.encode());
        for (id, epoch, first, last) in [
            (7, 1, 0, 0),
            (7, 1, 1, 1),
            (7, 0, 35, 35),
            (9, 3, 0, 0),
            (9, 3, 1, 1),
            (9, 2, 1, 1),
            (5, 0, 0, 0),
            (5, 0, 3, 3),
        ] {
            assert_eq!(
                back.check(id, epoch, first, last),
                s.check(id, epoch, first, last)
            );
        }
        s.truncate(200);
        assert_eq!(s.check(7, 1, 1, 1), SequenceCheck::UnknownProducer);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod txn_tests {
    use super::*;

    fn meta(seq: i32, base: i64) -> BatchMeta {
        BatchMeta {
            first_seq: seq,
            last_seq: seq,
            base_offset: base,
            last_offset: base,
        }
    }

    #[test]
    fn markers_complete_transactions_and_fence_older_epochs() {
        let mut s = ProducerStates::default();
        s.record(7, 2, meta(0, 10));
        s.record_txn_data(7, 10);
        s.record(7, 2, meta(1, 11));
        s.record_txn_data(7, 11);
        assert_eq!(s.txns().last_stable_offset(20), 10);
        // A plain write of the producer while its transaction is open is
        // refused; transactional ones and other producers' are not.
        assert_eq!(s.plain_write_in_txn(7, false), Some(10));
        assert_eq!(s.plain_write_in_txn(7, true), None);
        assert_eq!(s.plain_write_in_txn(8, false), None);
        assert_eq!(
            s.check_marker(7, 1),
            MarkerCheck::Fenced { current_epoch: 2 }
        );
        assert_eq!(s.check_marker(7, 2), MarkerCheck::Append);
        // The coordinator aborts at a bumped epoch (a timed-out transaction):
        // the producer takes it and its sequences restart.
        assert_eq!(s.check_marker(7, 3), MarkerCheck::Append);
        let aborted = s.record_marker(7, 3, 12, false).unwrap();
        assert_eq!((aborted.first_offset, aborted.last_offset), (10, 12));
        assert_eq!(
            s.check(7, 2, 2, 2),
            SequenceCheck::Fenced { current_epoch: 3 }
        );
        assert_eq!(s.check(7, 3, 0, 0), SequenceCheck::Append);
        assert_eq!(s.plain_write_in_txn(7, false), None);
        s.on_high_watermark(13);
        assert_eq!(s.txns().last_stable_offset(13), 13);
        // A marker of a producer never seen (its data was deleted) is
        // written and completes nothing.
        assert_eq!(s.check_marker(99, 0), MarkerCheck::Append);
        assert_eq!(s.record_marker(99, 0, 14, true), None);
    }

    #[test]
    fn a_marker_from_an_older_coordinator_is_fenced() {
        let mut s = ProducerStates::default();
        assert_eq!(s.coordinator_fenced(7, 3), None);
        s.record_coordinator(7, 5);
        assert_eq!(s.coordinator_fenced(7, 4), Some(5));
        assert_eq!(s.coordinator_fenced(7, 5), None);
        assert_eq!(s.coordinator_fenced(7, 6), None);
        s.record_coordinator(7, 6);
        s.record_coordinator(7, 5);
        assert_eq!(s.coordinator_fenced(7, 5), Some(6));
        // Per producer.
        assert_eq!(s.coordinator_fenced(8, 0), None);
        // Kept by a snapshot: one taken after the producer's last marker
        // still fences the deposed coordinator's late one.
        let back = ProducerStates::decode(&s.encode()).unwrap();
        assert_eq!(back.coordinator_fenced(7, 5), Some(6));
        assert_eq!(back.coordinator_fenced(7, 6), None);
    }

    #[test]
    fn open_transactions_survive_snapshots_and_truncation_reopens() {
        let mut s = ProducerStates::default();
        s.record(7, 0, meta(0, 10));
        s.record_txn_data(7, 10);
        s.record(8, 0, meta(0, 11));
        s.record_txn_data(8, 11);
        s.record_marker(8, 0, 12, true);
        let back = ProducerStates::decode(&s.encode()).unwrap();
        assert_eq!(back.encode(), s.encode());
        assert_eq!(back.txns().open().collect::<Vec<_>>(), [(7, 10)]);
        assert_eq!(back.txns().last_stable_offset(30), 10);

        // The marker of 8 cut: its transaction is open again.
        s.truncate(12);
        assert_eq!(s.txns().open().collect::<Vec<_>>(), [(7, 10), (8, 11)]);
        // Everything of 8 cut: gone; 7 keeps its transaction.
        s.truncate(11);
        assert_eq!(s.txns().open().collect::<Vec<_>>(), [(7, 10)]);

        // Snapshot garbage about transactions: errors, never panics. The
        // bytes end with one open transaction, then no coordinator epochs.
        let bytes = s.encode();
        let n = bytes.len();
        assert_eq!(bytes[n - 4..], [0, 0, 0, 0]);
        let (txns, epochs) = (n - 24, n - 4);
        let mut two = bytes[..epochs].to_vec();
        two[txns..txns + 4].copy_from_slice(&2u32.to_be_bytes());
        two.extend_from_within(txns + 4..epochs);
        two.extend_from_slice(&bytes[epochs..]);
        assert!(
            ProducerStates::decode(&two).is_err(),
            "the same producer twice"
        );
        let mut huge = bytes.clone();
        huge[txns..txns + 4].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(ProducerStates::decode(&huge).is_err());
    }
}
