//! Checks of `.index` and `.timeindex` entries against their segment's log, shared
//! by `dump-index`/`dump-timeindex` and `verify`.
//!
//! Each check is fed the log's batches in file order ([`OffsetIndexCheck::observe`])
//! and then told where the data ends ([`OffsetIndexCheck::finish`]), so a segment is
//! read once and only the index entries are held in memory.
//!
//! What an entry must satisfy (the engine's `segment::index` documents the format):
//! - `.index`: both columns strictly increase; the position is inside the log's data
//!   and a batch starts exactly there whose last offset is segment base + relative
//!   (Kafka's convention, which the engine's `Segment::add_batch` follows; an entry
//!   naming the batch's base offset, as `segment::index`'s docs describe, is also
//!   accepted: both make a lookup start at or before the offset looked up).
//! - `.timeindex`: both columns never decrease; the offset is inside the segment and
//!   is the last offset of a batch; the timestamp is the largest batch max-timestamp
//!   up to that batch (above it is impossible; below it, the entry is not what any
//!   writer records: entries are appended as the segment's maximum so far).
//!
//! Missing entries are never a problem: the active segment's index lags its log.

use skiff_engine::batch::BatchHeader;
use skiff_engine::segment::index::{OffsetEntry, TimeEntry};

/// One index entry with its absolute offset and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryReport<E> {
    pub entry: E,
    /// Segment base offset + the entry's relative offset.
    pub offset: i64,
    pub problems: Vec<String>,
}

fn absolute(base_offset: i64, relative_offset: u32) -> i64 {
    base_offset.wrapping_add(i64::from(relative_offset))
}

fn reports<E: Copy>(
    base_offset: i64,
    entries: Vec<E>,
    relative: impl Fn(&E) -> u32,
) -> Vec<EntryReport<E>> {
    entries
        .into_iter()
        .map(|entry| EntryReport {
            offset: absolute(base_offset, relative(&entry)),
            entry,
            problems: Vec::new(),
        })
        .collect()
}

/// Checks an offset index (`.index`) against its log.
#[derive(Debug)]
pub struct OffsetIndexCheck {
    reports: Vec<EntryReport<OffsetEntry>>,
    /// Entry numbers sorted by position: the log is walked in position order.
    by_position: Vec<usize>,
    /// Next element of `by_position` not yet matched against a batch.
    cursor: usize,
}

impl OffsetIndexCheck {
    pub fn new(base_offset: i64, entries: Vec<OffsetEntry>) -> OffsetIndexCheck {
        let mut reports = reports(base_offset, entries, |e| e.relative_offset);
        for i in 1..reports.len() {
            let (prev, entry) = (reports[i - 1].entry, reports[i].entry);
            if entry.relative_offset <= prev.relative_offset {
                let prev_offset = reports[i - 1].offset;
                reports[i].problems.push(format!(
                    "offset goes backwards (previous entry: offset {prev_offset})"
                ));
            }
            if entry.position <= prev.position {
                reports[i].problems.push(format!(
                    "position goes backwards (previous entry: position {})",
                    prev.position
                ));
            }
        }
        let mut by_position: Vec<usize> = (0..reports.len()).collect();
        by_position.sort_by_key(|&i| reports[i].entry.position);
        OffsetIndexCheck {
            reports,
            by_position,
            cursor: 0,
        }
    }

    /// The log has a batch at `position` (called in increasing position order).
    pub fn observe(&mut self, position: u64, header: &BatchHeader) {
        while let Some(&i) = self.by_position.get(self.cursor) {
            let report = &mut self.reports[i];
            let entry_position = u64::from(report.entry.position);
            if entry_position > position {
                break;
            }
            if entry_position < position {
                report
                    .problems
                    .push(format!("no batch starts at log position {entry_position}"));
            } else if report.offset != header.last_offset() && report.offset != header.base_offset {
                report.problems.push(format!(
                    "the batch at log position {entry_position} holds offsets {}..={}, \
                     but an entry must name its last (or base) offset",
                    header.base_offset,
                    header.last_offset()
                ));
            }
            self.cursor += 1;
        }
    }

    /// Ends the walk: `data_end` is the log's data size, or `None` when there is no
    /// log to check positions against.
    pub fn finish(mut self, data_end: Option<u64>) -> Vec<EntryReport<OffsetEntry>> {
        if let Some(data_end) = data_end {
            for &i in &self.by_position[self.cursor..] {
                let report = &mut self.reports[i];
                let position = u64::from(report.entry.position);
                report.problems.push(if position >= data_end {
                    format!("points past the log (position {position} >= log data size {data_end})")
                } else {
                    format!("no batch starts at log position {position}")
                });
            }
        }
        self.reports
    }
}

/// Checks a time index (`.timeindex`) against its log.
#[derive(Debug)]
pub struct TimeIndexCheck {
    base_offset: i64,
    reports: Vec<EntryReport<TimeEntry>>,
    /// Entry numbers sorted by offset: the log is walked in offset order.
    by_offset: Vec<usize>,
    cursor: usize,
    /// Largest batch max-timestamp seen so far.
    timestamp_max: Option<i64>,
    /// Offset after the last batch seen.
    next_offset: Option<i64>,
}

impl TimeIndexCheck {
    pub fn new(base_offset: i64, entries: Vec<TimeEntry>) -> TimeIndexCheck {
        let mut reports = reports(base_offset, entries, |e| e.relative_offset);
        for i in 1..reports.len() {
            let (prev, entry) = (reports[i - 1].entry, reports[i].entry);
            if entry.timestamp < prev.timestamp {
                reports[i].problems.push(format!(
                    "timestamp goes backwards (previous entry: timestamp {})",
                    prev.timestamp
                ));
            }
            if entry.relative_offset < prev.relative_offset {
                let prev_offset = reports[i - 1].offset;
                reports[i].problems.push(format!(
                    "offset goes backwards (previous entry: offset {prev_offset})"
                ));
            }
        }
        let mut by_offset: Vec<usize> = (0..reports.len()).collect();
        by_offset.sort_by_key(|&i| reports[i].offset);
        TimeIndexCheck {
            base_offset,
            reports,
            by_offset,
            cursor: 0,
            timestamp_max: None,
            next_offset: None,
        }
    }

    /// The log's next batch (called in log order).
    pub fn observe(&mut self, header: &BatchHeader) {
        // Entries before this batch (in a gap between batches) name no batch's last
        // offset.
        while let Some(report) = self.pending(header.base_offset.saturating_sub(1)) {
            report.problems.push(format!(
                "offset {} is not the last offset of a batch (the next batch starts at {})",
                report.offset, header.base_offset
            ));
        }
        let timestamp_max = self
            .timestamp_max
            .map_or(header.max_timestamp, |t| t.max(header.max_timestamp));
        self.timestamp_max = Some(timestamp_max);
        self.next_offset = Some(header.next_offset());
        let last_offset = header.last_offset();
        while let Some(report) = self.pending(last_offset) {
            let (offset, timestamp) = (report.offset, report.entry.timestamp);
            if offset != last_offset {
                report.problems.push(format!(
                    "offset {offset} is inside the batch {}..={last_offset}, not its last offset",
                    header.base_offset
                ));
            } else if timestamp > timestamp_max {
                report.problems.push(format!(
                    "timestamp {timestamp} is above the max timestamp {timestamp_max} of the batches up to offset {offset}"
                ));
            } else if timestamp < timestamp_max {
                report.problems.push(format!(
                    "timestamp {timestamp} is below the max timestamp {timestamp_max} of the batches up to offset {offset} (entries record the maximum so far)"
                ));
            }
        }
    }

    /// The next unchecked entry (in offset order) if its offset is `<= offset_max`.
    fn pending(&mut self, offset_max: i64) -> Option<&mut EntryReport<TimeEntry>> {
        let &i = self.by_offset.get(self.cursor)?;
        if self.reports[i].offset > offset_max {
            return None;
        }
        self.cursor += 1;
        Some(&mut self.reports[i])
    }

    /// Ends the walk; `log_seen` is false when there is no log to check against.
    pub fn finish(mut self, log_seen: bool) -> Vec<EntryReport<TimeEntry>> {
        if !log_seen {
            return self.reports;
        }
        let base_offset = self.base_offset;
        for &i in &self.by_offset[self.cursor..] {
            let report = &mut self.reports[i];
            report.problems.push(match self.next_offset {
                Some(next) => format!(
                    "offset {} is past the end of the segment (its next offset is {next})",
                    report.offset
                ),
                None => format!(
                    "offset {} is past the end of the segment (it holds no batches; base offset {base_offset})",
                    report.offset
                ),
            });
        }
        self.reports
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use skiff_engine::batch::BatchBuilder;

    /// Headers of `count` batches of 2 records each, base offsets from 100, every
    /// batch 1000 bytes apart, max timestamps 10, 20, 30...
    fn headers(count: usize) -> Vec<(u64, BatchHeader)> {
        (0..count)
            .map(|i| {
                let base = 100 + 2 * i as i64;
                let ts = 10 * (i as i64 + 1);
                let mut b = BatchBuilder::new().base_offset(base);
                b.push(ts - 1, None, Some(b"v"), &[])
                    .push(ts, None, Some(b"v"), &[]);
                let bytes = b.build().unwrap();
                (1000 * i as u64, BatchHeader::parse(&bytes).unwrap())
            })
            .collect()
    }

    #[test]
    fn offset_index_entries_must_hit_batch_starts() {
        let entry = |relative_offset, position| OffsetEntry {
            relative_offset,
            position,
        };
        let entries = vec![
            entry(0, 0),    // ok: the base offset of batch 100..=101
            entry(3, 1000), // ok: the last offset of batch 102..=103
            entry(6, 2000), // batch there holds 104..=105
            entry(7, 2500), // not a batch start
            entry(9, 9000), // past the log
            entry(8, 8000), // backwards twice, and past the log
        ];
        let mut check = OffsetIndexCheck::new(100, entries);
        for (position, header) in headers(4) {
            check.observe(position, &header);
        }
        let reports = check.finish(Some(3080));
        assert!(reports[0].problems.is_empty(), "{:?}", reports[0]);
        assert!(reports[1].problems.is_empty(), "{:?}", reports[1]);
        assert_eq!(reports[2].offset, 106);
        assert!(reports[2].problems[0].contains("holds offsets 104..=105"));
        assert!(reports[3].problems[0].contains("no batch starts"));
        assert!(reports[4].problems[0].contains("past the log"));
        assert_eq!(reports[5].problems.len(), 3, "{:?}", reports[5]);
    }

    #[test]
    fn time_index_entries_match_the_log() {
        let entry = |timestamp, relative_offset| TimeEntry {
            timestamp,
            relative_offset,
        };
        let entries = vec![
            entry(10, 1), // ok: batch 100..=101, max timestamp 10
            entry(25, 3), // batch 102..=103: max so far is 20
            entry(20, 4), // backwards in time, and inside batch 104..=105
            entry(25, 5), // below the max so far, 30
            entry(40, 8), // past the end (next offset 106)
        ];
        let mut check = TimeIndexCheck::new(100, entries);
        for (_, header) in headers(3) {
            check.observe(&header);
        }
        let reports = check.finish(true);
        assert!(reports[0].problems.is_empty(), "{:?}", reports[0]);
        assert!(reports[1].problems[0].contains("above the max timestamp 20"));
        assert!(reports[2].problems[0].contains("timestamp goes backwards"));
        assert!(reports[2].problems[1].contains("inside the batch 104..=105"));
        assert!(reports[3].problems[0].contains("below the max timestamp 30"));
        assert!(reports[4].problems[0].contains("past the end of the segment"));
    }

    #[test]
    fn time_index_entry_in_an_offset_gap_is_flagged() {
        let mut check = TimeIndexCheck::new(
            100,
            vec![TimeEntry {
                timestamp: 10,
                relative_offset: 3,
            }],
        );
        let batches = headers(3);
        check.observe(&batches[0].1);
        check.observe(&batches[2].1);
        let reports = check.finish(true);
        assert!(
            reports[0].problems[0].contains("not the last offset of a batch"),
            "{:?}",
            reports[0]
        );
    }
}
