//! A partition's transactions as its log sees them, and the last stable
//! offset (LSO), sans I/O: Kafka's `ProducerStateManager` ongoing and
//! unreplicated transactions.
//!
//! ```text
//! transactional data batch of P, P has no open transaction
//!     -> P's transaction opens at the batch's base offset (its first offset)
//! COMMIT/ABORT marker of P at offset M
//!     -> P's transaction completes at M; it stays unstable until the high
//!        watermark passes M (the marker replicated: `on_high_watermark`);
//!        an ABORT returns the `AbortedTxn` for the segment's .txnindex,
//!        with the LSO of that moment: the first offset of the earliest
//!        other open transaction, or M + 1
//! first unstable offset = the lowest first offset of an open or an
//!     unreplicated transaction
//! LSO = min(first unstable offset, high watermark)
//! ```
//!
//! read_committed fetches stop at the LSO; ListOffsets read_committed
//! answers it. A marker for a producer with no open transaction (an empty
//! transaction, a marker written again after a coordinator moved) completes
//! nothing. Truncation drops transactions that began at or past the cut and
//! reopens completed ones whose marker was cut; anything older than the
//! tracker knows (a transaction completed and replicated, then cut below
//! the high watermark) needs a rebuild from the log.

use std::collections::{BTreeMap, HashMap};

use bytes::Bytes;

use crate::batch::{parse_marker, BatchError, BatchHeader};
use crate::segment::txn_index::AbortedTxn;

/// One batch that matters to transactions, as an append or a scan saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxnBatch {
    /// Transactional data of `producer_id` at `base_offset`.
    Data { producer_id: i64, base_offset: i64 },
    /// A COMMIT or ABORT marker of `producer_id` at `offset`.
    Marker {
        producer_id: i64,
        offset: i64,
        commit: bool,
    },
}

impl TxnBatch {
    /// What the batch `bytes` (whose header is `header`) is to transactions:
    /// None for plain data and for control records other than markers. Only
    /// a control batch is decoded (two attribute bits decide the rest).
    pub fn of(header: &BatchHeader, bytes: &[u8]) -> Result<Option<TxnBatch>, BatchError> {
        if header.is_control() {
            let marker = parse_marker(&Bytes::copy_from_slice(bytes))?;
            return Ok(marker.map(|m| TxnBatch::Marker {
                producer_id: header.producer_id,
                offset: header.base_offset,
                commit: m.commit,
            }));
        }
        Ok(header.is_transactional().then_some(TxnBatch::Data {
            producer_id: header.producer_id,
            base_offset: header.base_offset,
        }))
    }

    /// The offset the batch starts at.
    pub fn offset(&self) -> i64 {
        match *self {
            TxnBatch::Data { base_offset, .. } => base_offset,
            TxnBatch::Marker { offset, .. } => offset,
        }
    }
}

/// The open and the completed-but-unreplicated transactions of one log.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct TxnTracker {
    /// First offset -> producer id, of every open transaction.
    open: BTreeMap<i64, i64>,
    /// Producer id -> its open transaction's first offset.
    open_by_producer: HashMap<i64, i64>,
    /// First offset -> (producer id, marker offset), of transactions whose
    /// marker is at or above the high watermark.
    unreplicated: BTreeMap<i64, (i64, i64)>,
}

impl TxnTracker {
    /// A transactional data batch of `producer_id` at `base_offset`: opens
    /// its transaction unless one is open.
    pub fn on_data(&mut self, producer_id: i64, base_offset: i64) {
        if let std::collections::hash_map::Entry::Vacant(e) =
            self.open_by_producer.entry(producer_id)
        {
            e.insert(base_offset);
            self.open.insert(base_offset, producer_id);
        }
    }

    /// A COMMIT or ABORT marker of `producer_id` at `offset`: completes its
    /// open transaction, if any. An aborted one is returned for the
    /// transaction index.
    pub fn on_marker(&mut self, producer_id: i64, offset: i64, commit: bool) -> Option<AbortedTxn> {
        let first = self.open_by_producer.remove(&producer_id)?;
        self.open.remove(&first);
        self.unreplicated.insert(first, (producer_id, offset));
        if commit {
            return None;
        }
        let last_stable_offset = self.open.keys().next().copied().unwrap_or(offset + 1);
        Some(AbortedTxn {
            producer_id,
            first_offset: first,
            last_offset: offset,
            last_stable_offset,
        })
    }

    /// Applies one transactional batch: data opens its producer's
    /// transaction, a marker completes it (an aborted one is returned).
    pub fn apply(&mut self, batch: TxnBatch) -> Option<AbortedTxn> {
        match batch {
            TxnBatch::Data {
                producer_id,
                base_offset,
            } => {
                self.on_data(producer_id, base_offset);
                None
            }
            TxnBatch::Marker {
                producer_id,
                offset,
                commit,
            } => self.on_marker(producer_id, offset, commit),
        }
    }

    /// Whether it tracks nothing (no open, no unreplicated transaction).
    pub fn is_empty(&self) -> bool {
        self.open.is_empty() && self.unreplicated.is_empty()
    }

    /// The state as checkpoint rows (`open pid first -1` and `done pid first
    /// marker`), for `from_rows` after a restart.
    pub fn to_rows(&self) -> Vec<(bool, i64, i64, i64)> {
        let open = self
            .open
            .iter()
            .map(|(first, pid)| (true, *pid, *first, -1));
        let done = self
            .unreplicated
            .iter()
            .map(|(first, (pid, marker))| (false, *pid, *first, *marker));
        open.chain(done).collect()
    }

    /// The state `to_rows` described: (open?, producer id, first offset,
    /// marker offset). A producer with two open transactions, or a completed
    /// one whose marker precedes its first offset, is refused (the reason).
    pub fn from_rows(rows: &[(bool, i64, i64, i64)]) -> Result<TxnTracker, String> {
        let mut t = TxnTracker::default();
        for &(open, pid, first, marker) in rows {
            if open {
                if t.open_by_producer.insert(pid, first).is_some() {
                    return Err(format!("producer {pid} has two open transactions"));
                }
                t.open.insert(first, pid);
            } else {
                if marker < first {
                    return Err(format!(
                        "producer {pid}: marker {marker} before first offset {first}"
                    ));
                }
                t.unreplicated.insert(first, (pid, marker));
            }
        }
        Ok(t)
    }

    /// Applies one batch of the log (`batch` is exactly the batch, `header`
    /// its header): a marker completes its producer's transaction (an
    /// aborted one is returned), transactional data opens one, anything
    /// else changes nothing. For rebuilding from the log and checking it.
    pub fn replay(
        &mut self,
        header: &BatchHeader,
        batch: &Bytes,
    ) -> Result<Option<AbortedTxn>, BatchError> {
        Ok(TxnBatch::of(header, batch)?.and_then(|b| self.apply(b)))
    }

    /// The high watermark moved to `hw`: transactions whose marker is below
    /// it are stable.
    pub fn on_high_watermark(&mut self, hw: i64) {
        self.unreplicated.retain(|_, (_, marker)| *marker >= hw);
    }

    /// The lowest offset a read_committed reader may not pass yet, if any
    /// transaction holds one.
    pub fn first_unstable_offset(&self) -> Option<i64> {
        let open = self.open.keys().next();
        let unreplicated = self.unreplicated.keys().next();
        match (open, unreplicated) {
            (Some(a), Some(b)) => Some(*a.min(b)),
            (a, b) => a.or(b).copied(),
        }
    }

    /// The last stable offset for high watermark `hw`: the lowest first
    /// offset of an open transaction or of a completed one whose marker is
    /// not below `hw` yet, or `hw`. Exact whether or not
    /// `on_high_watermark` has dropped what `hw` made stable.
    pub fn last_stable_offset(&self, hw: i64) -> i64 {
        let open = self.open.keys().next().copied();
        let unreplicated = self
            .unreplicated
            .iter()
            .find(|(_, (_, marker))| *marker >= hw)
            .map(|(first, _)| *first);
        [open, unreplicated]
            .into_iter()
            .flatten()
            .fold(hw, i64::min)
    }

    /// Each open transaction: (producer id, first offset), by first offset
    /// (for producer snapshots and DescribeProducers' current transaction
    /// start offset).
    pub fn open(&self) -> impl Iterator<Item = (i64, i64)> + '_ {
        self.open.iter().map(|(first, pid)| (*pid, *first))
    }

    /// The first offset of `producer_id`'s open transaction.
    pub fn open_of(&self, producer_id: i64) -> Option<i64> {
        self.open_by_producer.get(&producer_id).copied()
    }

    /// The log was cut at `offset` (everything at or past it gone).
    pub fn truncate(&mut self, offset: i64) {
        let reopened: Vec<(i64, i64)> = self
            .unreplicated
            .iter()
            .filter(|(first, (_, marker))| **first < offset && *marker >= offset)
            .map(|(first, (pid, _))| (*first, *pid))
            .collect();
        self.unreplicated
            .retain(|first, (_, marker)| *first < offset && *marker < offset);
        self.open.retain(|first, _| *first < offset);
        for (first, pid) in reopened {
            self.open.insert(first, pid);
        }
        self.open_by_producer = self
            .open
            .iter()
            .map(|(first, pid)| (*pid, *first))
            .collect();
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_lso_holds_at_the_first_open_transaction() {
        let mut t = TxnTracker::default();
        assert_eq!(t.last_stable_offset(10), 10);
        t.on_data(1, 10);
        t.on_data(1, 12); // the same transaction goes on
        t.on_data(2, 11);
        assert_eq!(t.first_unstable_offset(), Some(10));
        assert_eq!(t.last_stable_offset(20), 10);
        assert_eq!(t.last_stable_offset(5), 5);
        assert_eq!(t.open_of(1), Some(10));
        assert_eq!(t.open().collect::<Vec<_>>(), [(1, 10), (2, 11)]);

        // 1 commits at 13: unstable until its marker replicates (the high
        // watermark passes it), whether or not the tracker was told.
        assert_eq!(t.on_marker(1, 13, true), None);
        assert_eq!(t.last_stable_offset(13), 10);
        t.on_high_watermark(13);
        assert_eq!(t.last_stable_offset(13), 10);
        assert_eq!(t.last_stable_offset(14), 11);
        t.on_high_watermark(14);
        assert_eq!(t.last_stable_offset(20), 11);

        // 2 aborts at 15 with nothing else open: its LSO is the marker + 1.
        assert_eq!(
            t.on_marker(2, 15, false),
            Some(AbortedTxn {
                producer_id: 2,
                first_offset: 11,
                last_offset: 15,
                last_stable_offset: 16,
            })
        );
        t.on_high_watermark(16);
        assert_eq!(t.first_unstable_offset(), None);
        assert_eq!(t.last_stable_offset(16), 16);
    }

    #[test]
    fn an_abort_records_the_earliest_other_open_transaction_as_its_lso() {
        let mut t = TxnTracker::default();
        t.on_data(1, 100);
        t.on_data(2, 101);
        t.on_data(3, 102);
        let aborted = t.on_marker(2, 103, false).unwrap();
        assert_eq!(
            (aborted.first_offset, aborted.last_stable_offset),
            (101, 100)
        );
    }

    #[test]
    fn a_marker_without_an_open_transaction_completes_nothing() {
        let mut t = TxnTracker::default();
        assert_eq!(t.on_marker(7, 5, false), None);
        assert_eq!(t.first_unstable_offset(), None);
        t.on_data(7, 6);
        assert!(t.on_marker(7, 8, false).is_some());
        // Written again (a coordinator moved): nothing more.
        assert_eq!(t.on_marker(7, 9, false), None);
    }

    #[test]
    fn replay_reads_data_and_markers_from_batches() {
        use crate::batch::{marker_batch, BatchBuilder, EndTxnMarker};
        let stamped = |mut bytes: Vec<u8>, offset: i64| {
            bytes[..8].copy_from_slice(&offset.to_be_bytes());
            let bytes = Bytes::from(bytes);
            (BatchHeader::parse(&bytes).unwrap(), bytes)
        };
        let mut data = BatchBuilder::new().producer(9, 0, 0).transactional(true);
        data.push(0, None, Some(b"v"), &[]);
        let mut plain = BatchBuilder::new().producer(8, 0, 0);
        plain.push(0, None, Some(b"v"), &[]);
        let abort = EndTxnMarker {
            commit: false,
            coordinator_epoch: 1,
        };
        let mut t = TxnTracker::default();
        for (bytes, offset) in [
            (data.build().unwrap().to_vec(), 40),
            (plain.build().unwrap().to_vec(), 41),
        ] {
            let (header, batch) = stamped(bytes, offset);
            assert_eq!(t.replay(&header, &batch).unwrap(), None);
        }
        assert_eq!(t.open().collect::<Vec<_>>(), [(9, 40)]);
        let (header, batch) = stamped(marker_batch(9, 0, abort, 0).unwrap().to_vec(), 42);
        let aborted = t.replay(&header, &batch).unwrap().unwrap();
        assert_eq!((aborted.first_offset, aborted.last_offset), (40, 42));
    }

    #[test]
    fn truncation_drops_and_reopens() {
        let mut t = TxnTracker::default();
        t.on_data(1, 10);
        t.on_data(2, 12);
        t.on_marker(1, 14, true);
        t.on_data(3, 15);
        // Cut at 14: 1's marker is gone (open again), 3 never began.
        t.truncate(14);
        assert_eq!(t.open().collect::<Vec<_>>(), [(1, 10), (2, 12)]);
        assert_eq!(t.open_of(3), None);
        assert_eq!(t.last_stable_offset(14), 10);
        // Cut at 11: only 1 is left, open.
        t.truncate(11);
        assert_eq!(t.open().collect::<Vec<_>>(), [(1, 10)]);
        t.truncate(0);
        assert_eq!(t, TxnTracker::default());
    }

    #[derive(Debug, Clone)]
    enum Op {
        Data(i64),
        Marker(i64, bool),
        Hw,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0..4i64).prop_map(Op::Data),
            (0..4i64, any::<bool>()).prop_map(|(p, c)| Op::Marker(p, c)),
            Just(Op::Hw),
        ]
    }

    proptest! {
        /// Against a model that replays the whole log: the LSO is the lowest
        /// record of a transaction that is open or whose marker is at or
        /// above the high watermark, or the high watermark; each abort's
        /// entry spans exactly its transaction.
        #[test]
        fn the_lso_never_passes_an_undecided_record(ops in proptest::collection::vec(op(), 1..60), hw_lag in 0i64..4) {
            let mut t = TxnTracker::default();
            // The same log, never told of the high watermark: its LSO must
            // be exact all the same (the fetch path reads it that way).
            let mut lazy = TxnTracker::default();
            // The log: (offset, producer, Some(commit) for a marker).
            let mut log: Vec<(i64, i64, Option<bool>)> = Vec::new();
            let mut hw = 0i64;
            for op in ops {
                let offset = log.len() as i64;
                match op {
                    Op::Data(p) => {
                        t.on_data(p, offset);
                        lazy.on_data(p, offset);
                        log.push((offset, p, None));
                    }
                    Op::Marker(p, commit) => {
                        let first = t.open_of(p);
                        let aborted = t.on_marker(p, offset, commit);
                        lazy.on_marker(p, offset, commit);
                        log.push((offset, p, Some(commit)));
                        match (first, commit) {
                            (Some(first), false) => {
                                let a = aborted.unwrap();
                                prop_assert_eq!((a.first_offset, a.last_offset), (first, offset));
                                // Every record of p in [first, offset) is p's data.
                                prop_assert!(log[first as usize..offset as usize].iter().any(|r| r.1 == p));
                            }
                            _ => prop_assert!(aborted.is_none()),
                        }
                    }
                    Op::Hw => {
                        hw = (log.len() as i64 - hw_lag).max(hw);
                        t.on_high_watermark(hw);
                    }
                }
                // The model: a data record is undecided while no marker of
                // its producer follows it below the high watermark.
                // The LSO is the lowest undecided data offset, or the high
                // watermark: never past an undecided record, never held
                // back by a decided one.
                let undecided = log.iter().filter(|(offset, p, marker)| {
                    marker.is_none()
                        && !log.iter().any(|(m, q, mk)| mk.is_some() && q == p && m > offset && *m < hw)
                });
                let model = undecided.map(|r| r.0).min().map_or(hw, |o| o.min(hw));
                prop_assert_eq!(t.last_stable_offset(hw), model);
                prop_assert_eq!(lazy.last_stable_offset(hw), model);
            }
        }
    }
}
