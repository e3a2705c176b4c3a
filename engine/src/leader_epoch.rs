//! The leader-epoch cache: for each leader epoch, the first offset written in it.
//! Persisted as `leader-epoch-checkpoint` (Kafka's format). Replication uses it to
//! answer OffsetsForLeaderEpoch and to find where a follower's log diverges.

use std::path::{Path, PathBuf};

use crate::checkpoint::{self, LEADER_EPOCH_FILE};
use crate::error::Result;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EpochEntry {
    pub epoch: i32,
    pub start_offset: i64,
}

#[derive(Debug)]
pub struct LeaderEpochCache {
    path: PathBuf,
    /// Strictly increasing in both fields.
    entries: Vec<EpochEntry>,
    /// Changed in memory since the last `persist` (a leadership's epoch
    /// assigned before its first record): the next append persists it.
    dirty: bool,
}

impl LeaderEpochCache {
    pub async fn load(dir: &Path) -> Result<LeaderEpochCache> {
        let path = dir.join(LEADER_EPOCH_FILE);
        let mut entries = Vec::new();
        if let Some(rows) = checkpoint::read(&path, 2).await? {
            for row in rows {
                let epoch = checkpoint::parse_i64(&path, &row[0])? as i32;
                let start_offset = checkpoint::parse_i64(&path, &row[1])?;
                entries.push(EpochEntry {
                    epoch,
                    start_offset,
                });
            }
        }
        // A file written by a buggy or foreign writer: keep the longest valid prefix.
        let valid = entries
            .windows(2)
            .position(|w| w[1].epoch <= w[0].epoch || w[1].start_offset < w[0].start_offset)
            .map_or(entries.len(), |i| i + 1);
        entries.truncate(valid);
        Ok(LeaderEpochCache {
            path,
            entries,
            dirty: false,
        })
    }

    pub fn entries(&self) -> &[EpochEntry] {
        &self.entries
    }

    pub fn latest_epoch(&self) -> Option<i32> {
        self.entries.last().map(|e| e.epoch)
    }

    /// Records that `epoch` starts at `start_offset` if it is newer than the latest
    /// epoch. Returns whether the cache changed (and must be persisted).
    pub fn assign(&mut self, epoch: i32, start_offset: i64) -> bool {
        if epoch < 0 || self.latest_epoch().is_some_and(|e| epoch <= e) {
            return false;
        }
        // An epoch that starts where the previous one did replaces it (no records).
        while self
            .entries
            .last()
            .is_some_and(|e| e.start_offset >= start_offset)
        {
            self.entries.pop();
        }
        self.entries.push(EpochEntry {
            epoch,
            start_offset,
        });
        true
    }

    /// The end offset of `epoch` (the start of the next larger epoch, or
    /// `log_end_offset` for the latest), and the largest epoch `<= epoch`, as
    /// OffsetsForLeaderEpoch answers. `None` when no epoch that old is known.
    pub fn end_offset_for(&self, epoch: i32, log_end_offset: i64) -> Option<(i32, i64)> {
        let i = self.entries.partition_point(|e| e.epoch <= epoch);
        let found = self.entries.get(i.checked_sub(1)?)?;
        let end = self
            .entries
            .get(i)
            .map_or(log_end_offset, |next| next.start_offset);
        Some((found.epoch, end))
    }

    /// OffsetsForLeaderEpoch's answer for `requested`, exactly as Kafka's
    /// `LeaderEpochFileCache.endOffsetFor`: the latest epoch ends at the log
    /// end; an older one at the start of the next larger epoch, reported with
    /// the largest known epoch `<= requested` (or `requested` itself when it is
    /// older than every known epoch); an unknown or newer-than-latest epoch is
    /// (-1, -1).
    pub fn kafka_end_offset_for(&self, requested: i32, log_end_offset: i64) -> (i32, i64) {
        const UNDEFINED: (i32, i64) = (-1, -1);
        if requested < 0 {
            return UNDEFINED;
        }
        if self.latest_epoch() == Some(requested) {
            return (requested, log_end_offset);
        }
        let higher = self.entries.partition_point(|e| e.epoch <= requested);
        let Some(next) = self.entries.get(higher) else {
            return UNDEFINED;
        };
        match higher.checked_sub(1).and_then(|i| self.entries.get(i)) {
            Some(floor) => (floor.epoch, next.start_offset),
            None => (requested, next.start_offset),
        }
    }

    /// The epoch the record at `offset` was written in (the entry in force
    /// there), if the history reaches back that far.
    pub fn epoch_at(&self, offset: i64) -> Option<i32> {
        let i = self.entries.partition_point(|e| e.start_offset <= offset);
        Some(self.entries.get(i.checked_sub(1)?)?.epoch)
    }

    /// `assign`, in memory only: a leadership's epoch at the log end before
    /// its first record. Not worth an fdatasync on the leader-election path:
    /// recovery drops an epoch without records anyway; the first append in
    /// it persists the cache (`is_dirty`).
    pub fn assign_in_memory(&mut self, epoch: i32, start_offset: i64) {
        if self.assign(epoch, start_offset) {
            self.dirty = true;
        }
    }

    /// Changed in memory since the last `persist`.
    pub fn is_dirty(&self) -> bool {
        self.dirty
    }

    /// Forgets epochs that start at or after `offset` (the log was cut there).
    pub fn truncate_from_end(&mut self, offset: i64) -> bool {
        let before = self.entries.len();
        self.entries.retain(|e| e.start_offset < offset);
        before != self.entries.len()
    }

    /// The log now starts at `offset`: epochs that ended before it go, and the
    /// epoch in force there starts at `offset` (Kafka's truncateFromStart).
    pub fn truncate_from_start(&mut self, offset: i64) -> bool {
        let keep_from = self
            .entries
            .partition_point(|e| e.start_offset <= offset)
            .saturating_sub(1);
        let mut changed = keep_from > 0;
        self.entries.drain(..keep_from);
        if let Some(first) = self.entries.first_mut() {
            if first.start_offset < offset {
                first.start_offset = offset;
                changed = true;
            }
        }
        changed
    }

    /// Forgets every epoch (the log starts over empty: Kafka's clearAndFlush
    /// after truncateFullyAndStartAt). Returns whether the cache changed.
    pub fn clear(&mut self) -> bool {
        let changed = !self.entries.is_empty();
        self.entries.clear();
        changed
    }

    pub async fn persist(&mut self) -> Result<()> {
        self.dirty = false;
        let rows: Vec<Vec<String>> = self
            .entries
            .iter()
            .map(|e| vec![e.epoch.to_string(), e.start_offset.to_string()])
            .collect();
        checkpoint::write(&self.path, &rows).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache() -> LeaderEpochCache {
        LeaderEpochCache {
            path: PathBuf::from("unused"),
            entries: Vec::new(),
            dirty: false,
        }
    }

    #[test]
    fn assign_and_lookup() {
        let mut c = cache();
        assert!(c.assign(0, 0));
        assert!(!c.assign(0, 10));
        assert!(c.assign(2, 10));
        assert!(c.assign(5, 30));
        assert_eq!(c.end_offset_for(0, 50), Some((0, 10)));
        assert_eq!(c.end_offset_for(1, 50), Some((0, 10)));
        assert_eq!(c.end_offset_for(2, 50), Some((2, 30)));
        assert_eq!(c.end_offset_for(9, 50), Some((5, 50)));
        assert!(c.truncate_from_end(30));
        assert_eq!(c.latest_epoch(), Some(2));
        assert_eq!(c.end_offset_for(-1, 50), None);
    }

    #[test]
    fn kafka_end_offsets_and_epoch_at() {
        let mut c = cache();
        assert_eq!(c.kafka_end_offset_for(0, 0), (-1, -1));
        c.assign(1, 5);
        c.assign(3, 10);
        c.assign(6, 30);
        // The latest: the log end.
        assert_eq!(c.kafka_end_offset_for(6, 50), (6, 50));
        // Older ones: the start of the next larger epoch, reported with the
        // largest known epoch at or below the requested one.
        assert_eq!(c.kafka_end_offset_for(3, 50), (3, 30));
        assert_eq!(c.kafka_end_offset_for(4, 50), (3, 30));
        assert_eq!(c.kafka_end_offset_for(1, 50), (1, 10));
        // Older than every known epoch: the requested epoch, ending where the
        // history starts.
        assert_eq!(c.kafka_end_offset_for(0, 50), (0, 5));
        // Newer than the latest, or undefined: unknown.
        assert_eq!(c.kafka_end_offset_for(7, 50), (-1, -1));
        assert_eq!(c.kafka_end_offset_for(-1, 50), (-1, -1));

        assert_eq!(c.epoch_at(4), None);
        assert_eq!(c.epoch_at(5), Some(1));
        assert_eq!(c.epoch_at(29), Some(3));
        assert_eq!(c.epoch_at(30), Some(6));
        assert_eq!(c.epoch_at(1000), Some(6));
    }

    #[test]
    fn truncate_from_start_keeps_the_epoch_in_force() {
        let mut c = cache();
        c.assign(1, 0);
        c.assign(2, 10);
        c.assign(3, 20);
        assert!(c.truncate_from_start(15));
        assert_eq!(
            c.entries(),
            &[
                EpochEntry {
                    epoch: 2,
                    start_offset: 15
                },
                EpochEntry {
                    epoch: 3,
                    start_offset: 20
                }
            ]
        );
        assert!(!c.truncate_from_start(15));
    }

    #[test]
    fn empty_epoch_is_replaced() {
        let mut c = cache();
        c.assign(1, 5);
        c.assign(2, 5);
        assert_eq!(
            c.entries(),
            &[EpochEntry {
                epoch: 2,
                start_offset: 5
            }]
        );
    }
}
