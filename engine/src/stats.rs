//! Per-core counters of the engine's own work (fdatasyncs, cleaning, retention),
//! and the latency histogram type the node's metrics use too.
//!
//! Every core (executor thread) has its own `ShardStats`, reached through a
//! thread-local: a partition records its fdatasyncs into the stats of the core
//! that owns it, with plain `Cell`s, no atomics and no locks. A metrics scrape
//! visits every core (`Shard::invoke_on`), takes a `ShardStatsSnapshot` there
//! (plain data, `Send`) and sums them.
//!
//! Counters only grow; they start at zero when the process starts.

use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

/// Upper bounds (inclusive, in microseconds) of the latency histogram buckets:
/// 50 us to 30 s, roughly 1-2.5-5 per decade. A bucket past the last one
/// (`+Inf`) takes the rest. Fixed, so every core's histograms add up bucket by
/// bucket.
pub const LATENCY_BUCKETS_US: [u64; 19] = [
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000, 5_000_000, 10_000_000, 20_000_000, 30_000_000,
];

/// A latency histogram of one core: a count per bucket (not cumulative), the
/// number of observations and their sum.
#[derive(Debug, Default)]
pub struct Histogram {
    /// `LATENCY_BUCKETS_US.len() + 1` entries; the last is `+Inf`.
    buckets: [Cell<u64>; LATENCY_BUCKETS_US.len() + 1],
    sum_ns: Cell<u64>,
}

impl Histogram {
    pub fn observe(&self, elapsed: Duration) {
        let us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        // The first bucket whose bound is >= the value (Prometheus' `le`).
        let i = LATENCY_BUCKETS_US.partition_point(|&bound| bound < us);
        let bucket = &self.buckets[i];
        bucket.set(bucket.get() + 1);
        let ns = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        self.sum_ns.set(self.sum_ns.get().saturating_add(ns));
    }

    pub fn snapshot(&self) -> HistogramSnapshot {
        HistogramSnapshot {
            buckets: self.buckets.iter().map(Cell::get).collect(),
            sum_ns: self.sum_ns.get(),
        }
    }
}

/// A histogram's values at one moment, to be sent across cores and summed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistogramSnapshot {
    /// Per bucket, not cumulative; `LATENCY_BUCKETS_US.len() + 1` entries.
    pub buckets: Vec<u64>,
    pub sum_ns: u64,
}

impl Default for HistogramSnapshot {
    fn default() -> Self {
        HistogramSnapshot {
            buckets: vec![0; LATENCY_BUCKETS_US.len() + 1],
            sum_ns: 0,
        }
    }
}

impl HistogramSnapshot {
    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }

    /// The upper bound, in seconds, of the bucket holding quantile `q` (0
    /// to 1): the observation there took at most this long. 0 when empty,
    /// infinite past the last bound.
    pub fn quantile_bound(&self, q: f64) -> f64 {
        let count = self.count();
        if count == 0 {
            return 0.0;
        }
        let rank = ((count as f64) * q).ceil().max(1.0) as u64;
        self.cumulative()
            .into_iter()
            .find(|(_, total)| *total >= rank)
            .map_or(f64::INFINITY, |(le, _)| le)
    }

    pub fn sum_seconds(&self) -> f64 {
        self.sum_ns as f64 / 1e9
    }

    /// Adds another core's histogram (same buckets) to this one.
    pub fn merge(&mut self, other: &HistogramSnapshot) {
        for (a, b) in self.buckets.iter_mut().zip(&other.buckets) {
            *a += b;
        }
        self.sum_ns = self.sum_ns.saturating_add(other.sum_ns);
    }

    /// `(upper bound in seconds, cumulative count)` per bucket, `+Inf` last
    /// (as `f64::INFINITY`): Prometheus' `_bucket{le=..}` series.
    pub fn cumulative(&self) -> Vec<(f64, u64)> {
        let mut total = 0;
        self.buckets
            .iter()
            .enumerate()
            .map(|(i, n)| {
                total += n;
                let le = LATENCY_BUCKETS_US
                    .get(i)
                    .map_or(f64::INFINITY, |us| *us as f64 / 1e6);
                (le, total)
            })
            .collect()
    }
}

fn add(cell: &Cell<u64>, n: u64) {
    cell.set(cell.get().saturating_add(n));
}

/// What one core's engine did since the process started.
#[derive(Debug, Default)]
pub struct ShardStats {
    /// Every group-committed fdatasync of a partition (`Partition::flush_to`).
    pub fsync: Histogram,
    pub fsync_errors: Cell<u64>,
    /// Every roll of a partition's active segment (`PartitionLog::roll`):
    /// the time the partition's appends waited on it.
    pub roll: Histogram,
    /// Completed cleanings (one pass over one log each).
    pub cleaner_runs: Cell<u64>,
    pub cleaner_errors: Cell<u64>,
    pub cleaner_read_bytes: Cell<u64>,
    pub cleaner_written_bytes: Cell<u64>,
    /// Segments and bytes removed by retention (`retention.ms`/`retention.bytes`).
    pub retention_deleted_segments: Cell<u64>,
    pub retention_deleted_bytes: Cell<u64>,
    /// Rolls whose new segment reused a file retention retired.
    pub segments_recycled: Cell<u64>,
}

impl ShardStats {
    pub fn record_cleaning(&self, stats: &crate::cleaner::CleanStats) {
        add(&self.cleaner_runs, 1);
        add(&self.cleaner_read_bytes, stats.bytes_read);
        add(&self.cleaner_written_bytes, stats.bytes_written);
    }

    pub fn record_retention(&self, outcome: &crate::log::RetentionOutcome) {
        add(
            &self.retention_deleted_segments,
            outcome.deleted_segments as u64,
        );
        add(&self.retention_deleted_bytes, outcome.deleted_bytes);
    }

    pub fn record_segment_recycled(&self) {
        add(&self.segments_recycled, 1);
    }

    pub fn record_fsync(&self, elapsed: Duration, ok: bool) {
        self.fsync.observe(elapsed);
        if !ok {
            add(&self.fsync_errors, 1);
        }
    }

    pub fn record_roll(&self, elapsed: Duration) {
        self.roll.observe(elapsed);
    }

    pub fn record_cleaner_error(&self) {
        add(&self.cleaner_errors, 1);
    }

    pub fn snapshot(&self) -> ShardStatsSnapshot {
        ShardStatsSnapshot {
            fsync: self.fsync.snapshot(),
            fsync_errors: self.fsync_errors.get(),
            roll: self.roll.snapshot(),
            cleaner_runs: self.cleaner_runs.get(),
            cleaner_errors: self.cleaner_errors.get(),
            cleaner_read_bytes: self.cleaner_read_bytes.get(),
            cleaner_written_bytes: self.cleaner_written_bytes.get(),
            retention_deleted_segments: self.retention_deleted_segments.get(),
            retention_deleted_bytes: self.retention_deleted_bytes.get(),
            segments_recycled: self.segments_recycled.get(),
        }
    }
}

/// `ShardStats` at one moment (plain data, sent to the scraping core).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShardStatsSnapshot {
    pub fsync: HistogramSnapshot,
    pub fsync_errors: u64,
    pub roll: HistogramSnapshot,
    pub cleaner_runs: u64,
    pub cleaner_errors: u64,
    pub cleaner_read_bytes: u64,
    pub cleaner_written_bytes: u64,
    pub retention_deleted_segments: u64,
    pub retention_deleted_bytes: u64,
    pub segments_recycled: u64,
}

impl ShardStatsSnapshot {
    pub fn merge(&mut self, other: &ShardStatsSnapshot) {
        self.fsync.merge(&other.fsync);
        self.fsync_errors += other.fsync_errors;
        self.roll.merge(&other.roll);
        self.cleaner_runs += other.cleaner_runs;
        self.cleaner_errors += other.cleaner_errors;
        self.cleaner_read_bytes += other.cleaner_read_bytes;
        self.cleaner_written_bytes += other.cleaner_written_bytes;
        self.retention_deleted_segments += other.retention_deleted_segments;
        self.retention_deleted_bytes += other.retention_deleted_bytes;
        self.segments_recycled += other.segments_recycled;
    }
}

thread_local! {
    static LOCAL: Rc<ShardStats> = Rc::new(ShardStats::default());
}

/// This core's (this thread's) stats.
pub fn local() -> Rc<ShardStats> {
    LOCAL.with(Rc::clone)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_land_in_the_first_bucket_at_or_above_them() {
        let h = Histogram::default();
        h.observe(Duration::from_micros(50)); // le=0.00005
        h.observe(Duration::from_micros(51)); // le=0.0001
        h.observe(Duration::from_secs(31)); // +Inf
        let s = h.snapshot();
        assert_eq!(s.buckets[0], 1);
        assert_eq!(s.buckets[1], 1);
        assert_eq!(s.buckets[LATENCY_BUCKETS_US.len()], 1);
        assert_eq!(s.count(), 3);
        let cumulative = s.cumulative();
        assert_eq!(cumulative[0], (0.00005, 1));
        assert_eq!(cumulative[1], (0.0001, 2));
        assert_eq!(cumulative.last(), Some(&(f64::INFINITY, 3)));
        assert_eq!(s.quantile_bound(0.3), 0.00005);
        assert_eq!(s.quantile_bound(0.5), 0.0001);
        assert_eq!(s.quantile_bound(0.99), f64::INFINITY);
        assert_eq!(HistogramSnapshot::default().quantile_bound(0.5), 0.0);
        assert_eq!(s.sum_ns, 50_000 + 51_000 + 31_000_000_000);
    }

    #[test]
    fn snapshots_merge_bucket_by_bucket() {
        let (a, b) = (Histogram::default(), Histogram::default());
        a.observe(Duration::from_millis(1));
        b.observe(Duration::from_millis(1));
        b.observe(Duration::from_millis(7));
        let mut merged = a.snapshot();
        merged.merge(&b.snapshot());
        assert_eq!(merged.count(), 3);
        assert_eq!(merged.buckets[4], 2); // le=0.001
        assert_eq!(merged.buckets[7], 1); // le=0.01
    }
}
