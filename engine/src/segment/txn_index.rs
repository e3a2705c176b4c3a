//! The aborted transaction index (`.txnindex`), in Kafka's on-disk format
//! (`TransactionIndex`, `AbortedTxn`), so kafka-dump-log reads it.
//!
//! One per segment, holding the transactions whose ABORT marker (their last
//! offset) lies in that segment, in the order the markers were written:
//!
//! ```text
//! entry (34 bytes, big-endian)  version: i16 (0) | producer id: i64 |
//!                               first offset: i64 | last offset: i64 |
//!                               last stable offset: i64
//! ```
//!
//! `first offset` is the transaction's first record, `last offset` its ABORT
//! marker, `last stable offset` the partition's LSO when the marker was
//! written. A read_committed fetch of `[fetch offset, upper bound)` asks each
//! segment's index from the one holding the fetch offset on
//! ([`TxnIndex::collect`]) for the aborted transactions that overlap it, and
//! stops at the first entry whose LSO reaches the upper bound: every
//! transaction that began below the bound had ended by then, so later
//! segments hold no more that overlap (Kafka's `TxnIndexSearchResult`).
//!
//! Like the other indexes it is never trusted over the log: decoding checks
//! the version, that last offsets do not go back, that each entry begins no
//! later than it ends and ends in its segment; recovery rebuilds it from the
//! log's control batches.

use super::index::IndexError;

pub const TXN_ENTRY_LEN: usize = 34;
/// `AbortedTxn.CURRENT_VERSION`.
const TXN_ENTRY_VERSION: i16 = 0;

/// One aborted transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AbortedTxn {
    pub producer_id: i64,
    pub first_offset: i64,
    pub last_offset: i64,
    pub last_stable_offset: i64,
}

impl AbortedTxn {
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&TXN_ENTRY_VERSION.to_be_bytes());
        out.extend_from_slice(&self.producer_id.to_be_bytes());
        out.extend_from_slice(&self.first_offset.to_be_bytes());
        out.extend_from_slice(&self.last_offset.to_be_bytes());
        out.extend_from_slice(&self.last_stable_offset.to_be_bytes());
    }

    fn decode(entry: usize, bytes: &[u8; TXN_ENTRY_LEN]) -> Result<AbortedTxn, IndexError> {
        let i64_at = |at: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&bytes[at..at + 8]);
            i64::from_be_bytes(b)
        };
        let version = i16::from_be_bytes([bytes[0], bytes[1]]);
        if version != TXN_ENTRY_VERSION {
            return Err(IndexError::TxnVersion { entry, version });
        }
        Ok(AbortedTxn {
            producer_id: i64_at(2),
            first_offset: i64_at(10),
            last_offset: i64_at(18),
            last_stable_offset: i64_at(26),
        })
    }
}

/// A `.txnindex` file's entries, with only the length and each entry's
/// version checked (for dumps, which show what is there).
pub fn decode_txn_entries(bytes: &[u8]) -> Result<Vec<AbortedTxn>, IndexError> {
    if bytes.len() % TXN_ENTRY_LEN != 0 {
        return Err(IndexError::Length {
            len: bytes.len(),
            entry_len: TXN_ENTRY_LEN,
        });
    }
    bytes
        .chunks_exact(TXN_ENTRY_LEN)
        .enumerate()
        .map(|(entry, chunk)| {
            let mut raw = [0u8; TXN_ENTRY_LEN];
            raw.copy_from_slice(chunk);
            AbortedTxn::decode(entry, &raw)
        })
        .collect()
}

/// The aborted transaction index of one segment, in memory.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct TxnIndex {
    entries: Vec<AbortedTxn>,
}

impl TxnIndex {
    /// Decodes and checks a `.txnindex` file's bytes for the segment that
    /// starts at `base_offset`.
    pub fn decode(bytes: &[u8], base_offset: i64) -> Result<TxnIndex, IndexError> {
        let mut index = TxnIndex::default();
        for (entry, txn) in decode_txn_entries(bytes)?.into_iter().enumerate() {
            if txn.last_offset < base_offset {
                return Err(IndexError::TxnBeforeSegment {
                    entry,
                    last_offset: txn.last_offset,
                    base_offset,
                });
            }
            index
                .push(txn)
                .map_err(|detail| IndexError::Backwards { entry, detail })?;
        }
        Ok(index)
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.entries.len() * TXN_ENTRY_LEN);
        for txn in &self.entries {
            txn.encode_into(&mut out);
        }
        out
    }

    /// Appends the transaction an ABORT marker just ended. Refused (the
    /// reason) if it begins after it ends or ends before the last entry.
    pub fn push(&mut self, txn: AbortedTxn) -> Result<(), String> {
        if txn.first_offset > txn.last_offset {
            return Err(format!(
                "first offset {} after last offset {}",
                txn.first_offset, txn.last_offset
            ));
        }
        if let Some(last) = self.entries.last() {
            if txn.last_offset < last.last_offset {
                return Err(format!(
                    "last offset {} below the previous entry's {}",
                    txn.last_offset, last.last_offset
                ));
            }
        }
        self.entries.push(txn);
        Ok(())
    }

    /// Adds to `out` the transactions that overlap `[fetch_offset,
    /// upper_bound)` (ended at or after the fetch offset, began below the
    /// bound); true when the search is complete (an entry's LSO reached the
    /// bound: later segments need not be asked).
    pub fn collect(&self, fetch_offset: i64, upper_bound: i64, out: &mut Vec<AbortedTxn>) -> bool {
        for txn in &self.entries {
            if txn.last_offset >= fetch_offset && txn.first_offset < upper_bound {
                out.push(*txn);
            }
            if txn.last_stable_offset >= upper_bound {
                return true;
            }
        }
        false
    }

    /// Drops the entries whose marker is at or past `offset` (the log was
    /// cut there).
    pub fn truncate_to(&mut self, offset: i64) {
        self.entries.retain(|txn| txn.last_offset < offset);
    }

    pub fn entries(&self) -> &[AbortedTxn] {
        &self.entries
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn txn(producer_id: i64, first: i64, last: i64, lso: i64) -> AbortedTxn {
        AbortedTxn {
            producer_id,
            first_offset: first,
            last_offset: last,
            last_stable_offset: lso,
        }
    }

    #[test]
    fn an_entry_matches_kafkas_bytes() {
        let mut out = Vec::new();
        txn(7, 100, 105, 99).encode_into(&mut out);
        let mut expected = vec![0, 0];
        for v in [7i64, 100, 105, 99] {
            expected.extend_from_slice(&v.to_be_bytes());
        }
        assert_eq!(out, expected);
        assert_eq!(out.len(), TXN_ENTRY_LEN);
    }

    #[test]
    fn decode_round_trips_and_checks() {
        let mut index = TxnIndex::default();
        index.push(txn(1, 100, 110, 100)).unwrap();
        index.push(txn(2, 104, 120, 111)).unwrap();
        let bytes = index.encode();
        assert_eq!(TxnIndex::decode(&bytes, 100).unwrap(), index);

        assert!(matches!(
            TxnIndex::decode(&bytes[..40], 100),
            Err(IndexError::Length { .. })
        ));
        // An entry whose marker lies before the segment.
        assert!(matches!(
            TxnIndex::decode(&bytes, 115),
            Err(IndexError::TxnBeforeSegment { entry: 0, .. })
        ));
        // An unknown version.
        let mut bad = bytes.clone();
        bad[1] = 1;
        assert!(matches!(
            TxnIndex::decode(&bad, 100),
            Err(IndexError::TxnVersion {
                entry: 0,
                version: 1
            })
        ));
        // Markers out of order.
        let mut swapped = bytes[TXN_ENTRY_LEN..].to_vec();
        swapped.extend_from_slice(&bytes[..TXN_ENTRY_LEN]);
        assert!(matches!(
            TxnIndex::decode(&swapped, 100),
            Err(IndexError::Backwards { entry: 1, .. })
        ));
        assert!(index.push(txn(3, 130, 125, 111)).is_err());
    }

    #[test]
    fn collect_returns_the_overlapping_and_stops_at_the_bound() {
        let mut index = TxnIndex::default();
        index.push(txn(1, 100, 110, 100)).unwrap();
        index.push(txn(2, 104, 120, 111)).unwrap();
        index.push(txn(3, 130, 140, 130)).unwrap();
        index.push(txn(4, 141, 150, 141)).unwrap();

        // [105, 125): 1 and 2 overlap; 3's LSO (130) reaches the bound.
        let mut out = Vec::new();
        assert!(index.collect(105, 125, &mut out));
        assert_eq!(
            out.iter().map(|t| t.producer_id).collect::<Vec<_>>(),
            [1, 2]
        );

        // [111, 200): 2, 3, 4; no LSO reaches 200: ask the next segment.
        let mut out = Vec::new();
        assert!(!index.collect(111, 200, &mut out));
        assert_eq!(
            out.iter().map(|t| t.producer_id).collect::<Vec<_>>(),
            [2, 3, 4]
        );

        // Below everything: nothing, complete at the first entry.
        let mut out = Vec::new();
        assert!(index.collect(0, 100, &mut out));
        assert!(out.is_empty());
    }

    #[test]
    fn truncation_drops_markers_at_or_past_the_cut() {
        let mut index = TxnIndex::default();
        index.push(txn(1, 100, 110, 100)).unwrap();
        index.push(txn(2, 104, 120, 111)).unwrap();
        index.truncate_to(120);
        assert_eq!(index.entries(), &[txn(1, 100, 110, 100)]);
        index.truncate_to(0);
        assert!(index.is_empty());
    }
}
