//! Sparse offset and timestamp indexes, in Kafka's on-disk formats.
//!
//! `.index`: 8-byte entries, `relative offset: u32 BE` + `position: u32 BE`, one per
//! `index.interval.bytes` of log appended. `position` is the byte position in the
//! `.log` where a batch starts and `relative offset` is that batch's LAST offset
//! minus the segment's base offset (Kafka's convention, which kafka-dump-log's
//! index sanity check expects).
//!
//! `.timeindex`: 12-byte entries, `timestamp: i64 BE` + `relative offset: u32 BE`:
//! the largest batch max-timestamp seen so far in the segment and the last offset of
//! the batch that carried it. An entry is added only when the maximum grows, so both
//! columns are non-decreasing.
//!
//! Both indexes live in memory while a segment is open (they are small: one entry per
//! 4 KiB of log) and are written to disk whole when the segment is rolled or closed.
//! They are never trusted over the log: recovery rebuilds any index that is missing or
//! disagrees with the log (see `recovery`).

use thiserror::Error;

pub const OFFSET_ENTRY_LEN: usize = 8;
pub const TIME_ENTRY_LEN: usize = 12;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum IndexError {
    #[error("index length {len} is not a multiple of the {entry_len}-byte entry size")]
    Length { len: usize, entry_len: usize },
    #[error("index entry {entry} goes backwards ({detail})")]
    Backwards { entry: usize, detail: String },
    #[error(
        "index entry {entry} points past the log (position {position} >= log size {log_size})"
    )]
    PastLog {
        entry: usize,
        position: u32,
        log_size: u64,
    },
    #[error("transaction index entry {entry} has version {version}; only 0 is known")]
    TxnVersion { entry: usize, version: i16 },
    #[error("transaction index entry {entry} ends at offset {last_offset}, before its segment's base offset {base_offset}")]
    TxnBeforeSegment {
        entry: usize,
        last_offset: i64,
        base_offset: i64,
    },
    #[error("time index entry {entry} names relative offset {relative_offset}, past the segment's end {next_relative_offset}")]
    PastSegment {
        entry: usize,
        relative_offset: u32,
        next_relative_offset: u64,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OffsetEntry {
    pub relative_offset: u32,
    pub position: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeEntry {
    pub timestamp: i64,
    pub relative_offset: u32,
}

/// The sparse offset index of one segment, in memory.
#[derive(Debug, Default, Clone)]
pub struct OffsetIndex {
    entries: Vec<OffsetEntry>,
}

impl OffsetIndex {
    /// Decodes and checks an `.index` file's bytes against its log's size.
    pub fn decode(bytes: &[u8], log_size: u64) -> Result<OffsetIndex, IndexError> {
        let entries = decode_offset_entries(bytes)?;
        check_offset_entries(&entries, log_size)?;
        Ok(OffsetIndex { entries })
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.entries.len() * OFFSET_ENTRY_LEN);
        for e in &self.entries {
            out.extend_from_slice(&e.relative_offset.to_be_bytes());
            out.extend_from_slice(&e.position.to_be_bytes());
        }
        out
    }

    /// Appends an entry. Entries must strictly grow in both columns; the log code
    /// guarantees it, and a violation means the log is corrupt in memory.
    pub fn push(&mut self, relative_offset: u32, position: u32) {
        if let Some(last) = self.entries.last() {
            assert!(
                relative_offset > last.relative_offset && position > last.position,
                "offset index must grow: {last:?} then ({relative_offset}, {position})"
            );
        }
        self.entries.push(OffsetEntry {
            relative_offset,
            position,
        });
    }

    /// The entry with the largest relative offset `<= relative_offset`: where a scan
    /// for that offset starts. `None` means "scan from position 0".
    pub fn lookup(&self, relative_offset: u32) -> Option<OffsetEntry> {
        let n = self
            .entries
            .partition_point(|e| e.relative_offset <= relative_offset);
        n.checked_sub(1).map(|i| self.entries[i])
    }

    /// Drops every entry at or past `position` (the log is being cut there).
    pub fn truncate_to_position(&mut self, position: u32) {
        let n = self.entries.partition_point(|e| e.position < position);
        self.entries.truncate(n);
    }

    pub fn entries(&self) -> &[OffsetEntry] {
        &self.entries
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// The sparse timestamp index of one segment, in memory.
#[derive(Debug, Default, Clone)]
pub struct TimeIndex {
    entries: Vec<TimeEntry>,
}

impl TimeIndex {
    /// Decodes and checks a `.timeindex` file's bytes. `next_relative_offset` bounds
    /// the offsets entries may name (the segment's next offset minus its base).
    pub fn decode(bytes: &[u8], next_relative_offset: u64) -> Result<TimeIndex, IndexError> {
        let entries = decode_time_entries(bytes)?;
        check_time_entries(&entries, next_relative_offset)?;
        Ok(TimeIndex { entries })
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.entries.len() * TIME_ENTRY_LEN);
        for e in &self.entries {
            out.extend_from_slice(&e.timestamp.to_be_bytes());
            out.extend_from_slice(&e.relative_offset.to_be_bytes());
        }
        out
    }

    /// Records that the segment's max timestamp grew to `timestamp` at
    /// `relative_offset`; ignored unless it does grow.
    pub fn maybe_push(&mut self, timestamp: i64, relative_offset: u32) {
        match self.entries.last() {
            Some(last)
                if timestamp <= last.timestamp || relative_offset <= last.relative_offset => {}
            _ => self.entries.push(TimeEntry {
                timestamp,
                relative_offset,
            }),
        }
    }

    /// The entry with the largest timestamp `< timestamp`: batches before its offset
    /// cannot hold a record at or after `timestamp`... except that timestamps are not
    /// ordered within a segment, so callers use it only as a lower bound to scan from.
    pub fn lookup(&self, timestamp: i64) -> Option<TimeEntry> {
        let n = self.entries.partition_point(|e| e.timestamp < timestamp);
        n.checked_sub(1).map(|i| self.entries[i])
    }

    pub fn truncate_to_relative_offset(&mut self, relative_offset: u32) {
        let n = self
            .entries
            .partition_point(|e| e.relative_offset < relative_offset);
        self.entries.truncate(n);
    }

    pub fn entries(&self) -> &[TimeEntry] {
        &self.entries
    }

    pub fn last(&self) -> Option<TimeEntry> {
        self.entries.last().copied()
    }
}

/// Raw decode of `.index` bytes, no checks beyond the length (used by skiff-tools to
/// show a broken index as it is).
pub fn decode_offset_entries(bytes: &[u8]) -> Result<Vec<OffsetEntry>, IndexError> {
    if bytes.len() % OFFSET_ENTRY_LEN != 0 {
        return Err(IndexError::Length {
            len: bytes.len(),
            entry_len: OFFSET_ENTRY_LEN,
        });
    }
    Ok(bytes
        .chunks_exact(OFFSET_ENTRY_LEN)
        .map(|c| OffsetEntry {
            relative_offset: u32::from_be_bytes([c[0], c[1], c[2], c[3]]),
            position: u32::from_be_bytes([c[4], c[5], c[6], c[7]]),
        })
        .collect())
}

/// Raw decode of `.timeindex` bytes.
pub fn decode_time_entries(bytes: &[u8]) -> Result<Vec<TimeEntry>, IndexError> {
    if bytes.len() % TIME_ENTRY_LEN != 0 {
        return Err(IndexError::Length {
            len: bytes.len(),
            entry_len: TIME_ENTRY_LEN,
        });
    }
    Ok(bytes
        .chunks_exact(TIME_ENTRY_LEN)
        .map(|c| TimeEntry {
            timestamp: i64::from_be_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]),
            relative_offset: u32::from_be_bytes([c[8], c[9], c[10], c[11]]),
        })
        .collect())
}

/// Entries must strictly grow and point inside the log.
pub fn check_offset_entries(entries: &[OffsetEntry], log_size: u64) -> Result<(), IndexError> {
    for (i, e) in entries.iter().enumerate() {
        if u64::from(e.position) >= log_size {
            return Err(IndexError::PastLog {
                entry: i,
                position: e.position,
                log_size,
            });
        }
        if i > 0 {
            let prev = entries[i - 1];
            if e.relative_offset <= prev.relative_offset || e.position <= prev.position {
                return Err(IndexError::Backwards {
                    entry: i,
                    detail: format!(
                        "({}, {}) after ({}, {})",
                        e.relative_offset, e.position, prev.relative_offset, prev.position
                    ),
                });
            }
        }
    }
    Ok(())
}

/// Entries must not go backwards in either column and must name offsets below
/// `next_relative_offset`.
pub fn check_time_entries(
    entries: &[TimeEntry],
    next_relative_offset: u64,
) -> Result<(), IndexError> {
    for (i, e) in entries.iter().enumerate() {
        if u64::from(e.relative_offset) >= next_relative_offset {
            return Err(IndexError::PastSegment {
                entry: i,
                relative_offset: e.relative_offset,
                next_relative_offset,
            });
        }
        if i > 0 {
            let prev = entries[i - 1];
            if e.timestamp < prev.timestamp || e.relative_offset < prev.relative_offset {
                return Err(IndexError::Backwards {
                    entry: i,
                    detail: format!(
                        "({}, {}) after ({}, {})",
                        e.timestamp, e.relative_offset, prev.timestamp, prev.relative_offset
                    ),
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn lookup_finds_floor_entry() {
        let mut idx = OffsetIndex::default();
        idx.push(10, 4096);
        idx.push(20, 8192);
        assert_eq!(idx.lookup(5), None);
        assert_eq!(idx.lookup(10).unwrap().position, 4096);
        assert_eq!(idx.lookup(19).unwrap().position, 4096);
        assert_eq!(idx.lookup(1000).unwrap().position, 8192);
        idx.truncate_to_position(8192);
        assert_eq!(idx.len(), 1);
    }

    #[test]
    fn decode_rejects_bad_indexes() {
        let mut idx = OffsetIndex::default();
        idx.push(1, 100);
        idx.push(2, 200);
        let bytes = idx.encode();
        assert!(OffsetIndex::decode(&bytes, 201).is_ok());
        assert!(matches!(
            OffsetIndex::decode(&bytes, 200),
            Err(IndexError::PastLog { entry: 1, .. })
        ));
        assert!(matches!(
            OffsetIndex::decode(&bytes[..7], 1000),
            Err(IndexError::Length { .. })
        ));
        let mut swapped = bytes[8..].to_vec();
        swapped.extend_from_slice(&bytes[..8]);
        assert!(matches!(
            OffsetIndex::decode(&swapped, 1000),
            Err(IndexError::Backwards { entry: 1, .. })
        ));
    }

    #[test]
    fn time_index_only_grows() {
        let mut t = TimeIndex::default();
        t.maybe_push(100, 0);
        t.maybe_push(90, 1);
        t.maybe_push(100, 2);
        t.maybe_push(150, 3);
        assert_eq!(t.entries().len(), 2);
        assert_eq!(t.lookup(100), None);
        assert_eq!(t.lookup(101).unwrap().relative_offset, 0);
        assert_eq!(t.lookup(1000).unwrap().relative_offset, 3);
        let back = TimeIndex::decode(&t.encode(), 4).unwrap();
        assert_eq!(back.entries(), t.entries());
        assert!(TimeIndex::decode(&t.encode(), 3).is_err());
    }

    proptest! {
        #[test]
        fn offset_lookup_matches_linear_scan(
            deltas in proptest::collection::vec((1u32..1000, 1u32..100_000), 0..200),
            probe in 0u32..300_000,
        ) {
            let mut idx = OffsetIndex::default();
            let (mut off, mut pos) = (0u32, 0u32);
            for (d_off, d_pos) in deltas {
                off += d_off;
                pos += d_pos;
                idx.push(off, pos);
            }
            let expected = idx.entries().iter().rev().find(|e| e.relative_offset <= probe).copied();
            prop_assert_eq!(idx.lookup(probe), expected);
            let round = OffsetIndex::decode(&idx.encode(), u64::from(pos) + 1).unwrap();
            prop_assert_eq!(round.entries(), idx.entries());
        }

        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200), size in any::<u64>()) {
            let _ = OffsetIndex::decode(&bytes, size);
            let _ = TimeIndex::decode(&bytes, size);
        }
    }
}
