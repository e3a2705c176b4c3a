//! What the load generator measures: counters shared by the connection threads,
//! a throughput timeline sampled from them, and latency histograms (HdrHistogram,
//! microseconds) summarised as percentiles.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;

/// Highest latency a histogram holds (a minute, in microseconds); larger values
/// are clamped to it, so a stuck request still shows as the maximum.
const LATENCY_US_MAX: u64 = 60_000_000;

/// A latency histogram in microseconds, 3 significant digits.
pub fn new_histogram() -> anyhow::Result<Histogram<u64>> {
    Histogram::new_with_bounds(1, LATENCY_US_MAX, 3)
        .map_err(|e| anyhow::anyhow!("creating a latency histogram: {e}"))
}

/// Records `count` samples of `latency` (clamped into the histogram's range).
pub fn record(histogram: &mut Histogram<u64>, latency: Duration, count: u64) {
    let us = (latency.as_micros() as u64).clamp(1, LATENCY_US_MAX);
    // Cannot fail: the value is clamped into the histogram's bounds.
    let _ = histogram.record_n(us, count.max(1));
}

/// Running totals, updated by every connection thread (relaxed atomics: a few
/// tens of thousands of updates per second, read by the sampler).
#[derive(Debug, Default)]
pub struct Counters {
    pub records: AtomicU64,
    /// Record values and keys as the application sees them (Kafka's MB/s).
    pub payload_bytes: AtomicU64,
    /// Record batch bytes on the wire (compressed, with batch and record headers).
    pub wire_bytes: AtomicU64,
    pub requests: AtomicU64,
    pub errors: AtomicU64,
}

impl Counters {
    pub fn add(&self, records: u64, payload_bytes: u64, wire_bytes: u64) {
        self.records.fetch_add(records, Ordering::Relaxed);
        self.payload_bytes
            .fetch_add(payload_bytes, Ordering::Relaxed);
        self.wire_bytes.fetch_add(wire_bytes, Ordering::Relaxed);
        self.requests.fetch_add(1, Ordering::Relaxed);
    }
}

/// One timeline point: throughput over the interval ending at `t_s`.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Point {
    pub t_s: f64,
    pub mb_s: f64,
    pub records_s: f64,
}

/// Samples `counters` every `interval` until `done` is set; returns the points.
pub fn sample_timeline(
    counters: &Counters,
    start: Instant,
    interval: Duration,
    done: &AtomicBool,
) -> Vec<Point> {
    let mut points = Vec::new();
    let (mut last_bytes, mut last_records, mut last_t) = (0u64, 0u64, 0.0f64);
    let mut next = start + interval;
    while !done.load(Ordering::Acquire) {
        let now = Instant::now();
        if now < next {
            std::thread::sleep((next - now).min(Duration::from_millis(20)));
            continue;
        }
        next += interval;
        let t = start.elapsed().as_secs_f64();
        let bytes = counters.payload_bytes.load(Ordering::Relaxed);
        let records = counters.records.load(Ordering::Relaxed);
        let dt = (t - last_t).max(1e-9);
        points.push(Point {
            t_s: t,
            mb_s: (bytes - last_bytes) as f64 / 1e6 / dt,
            records_s: (records - last_records) as f64 / dt,
        });
        (last_bytes, last_records, last_t) = (bytes, records, t);
    }
    points
}

/// A sampling interval giving about 40 points over `duration`, 100 ms to 1 s.
pub fn sample_interval(duration: Duration) -> Duration {
    (duration / 40).clamp(Duration::from_millis(100), Duration::from_secs(1))
}

/// Latency percentiles in milliseconds.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Latency {
    pub count: u64,
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
}

impl Latency {
    pub fn of(h: &Histogram<u64>) -> Latency {
        if h.is_empty() {
            return Latency::default();
        }
        let ms = |us: u64| us as f64 / 1000.0;
        Latency {
            count: h.len(),
            mean_ms: h.mean() / 1000.0,
            p50_ms: ms(h.value_at_quantile(0.5)),
            p90_ms: ms(h.value_at_quantile(0.9)),
            p99_ms: ms(h.value_at_quantile(0.99)),
            p999_ms: ms(h.value_at_quantile(0.999)),
            max_ms: ms(h.max()),
        }
    }
}

/// A percentile curve for plots: (quantile, ms) at fixed quantiles from 0.5 to
/// 0.9999 and the maximum.
pub fn percentile_curve(h: &Histogram<u64>) -> Vec<(f64, f64)> {
    if h.is_empty() {
        return Vec::new();
    }
    const QUANTILES: [f64; 13] = [
        0.5, 0.75, 0.9, 0.95, 0.99, 0.995, 0.999, 0.9995, 0.9999, 0.99995, 0.99999, 0.999995,
        0.999999,
    ];
    // Past 1 - 1/count a quantile is only the maximum again: stop there.
    let last = 1.0 - 1.0 / h.len() as f64;
    let mut curve: Vec<(f64, f64)> = QUANTILES
        .iter()
        .take_while(|&&q| q <= last)
        .map(|&q| (q, h.value_at_quantile(q) as f64 / 1000.0))
        .collect();
    curve.push((last.max(0.5), h.max() as f64 / 1000.0));
    curve
}

/// A flag set from outside (Ctrl-C in the suite) that stops a run early.
pub type StopFlag = Arc<AtomicBool>;

pub fn stopped(stop: &Option<StopFlag>) -> bool {
    stop.as_ref().is_some_and(|s| s.load(Ordering::Relaxed))
}

/// The median of `values` (the mean of the middle two for an even count); NaN
/// when empty.
pub fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn median_of_odd_even_and_empty() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(&[7.0]), 7.0);
        assert!(median(&[]).is_nan());
    }
}
