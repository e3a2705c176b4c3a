#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]
//! Helpers shared by the engine's integration tests.

use std::future::Future;
use std::path::Path;

use bytes::{Bytes, BytesMut};
use glommio::{LocalExecutorBuilder, Placement};
use skiff_engine::batch::{BatchBuilder, Compression};
use skiff_engine::batch_cache::BatchCache;
use skiff_engine::{LogConfig, PartitionLog};

/// Runs `f` on a fresh glommio executor (tests run on threads of the test harness).
///
/// A tick keeps a timer armed beside `f`, as a node always has one: glommio
/// parks in `io_uring_enter` until a completion or its next timer, and once,
/// under heavy load, a test with no timer pending parked for good (25 min in
/// `compaction_matches_the_model`, its io-wq worker idle: a wakeup lost). The
/// tick bounds such a park to `TICK`.
pub fn run<F, Fut, T>(f: F) -> T
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = T> + 'static,
    T: Send + 'static,
{
    const TICK: std::time::Duration = std::time::Duration::from_millis(100);
    LocalExecutorBuilder::new(Placement::Unbound)
        .spawn(move || async move {
            let tick = glommio::spawn_local(async {
                loop {
                    glommio::timer::sleep(TICK).await;
                }
            });
            let out = f().await;
            tick.cancel().await;
            out
        })
        .expect("spawn executor")
        .join()
        .expect("executor")
}

/// A batch of `records` records of `value_len` bytes, keys `k{seed}-{i}`.
pub fn batch(seed: u64, records: usize, value_len: usize, timestamp: i64) -> Bytes {
    let mut b = BatchBuilder::new().compression(Compression::None);
    for i in 0..records {
        let key = format!("k{seed}-{i}");
        let value = vec![(seed as u8).wrapping_add(i as u8); value_len];
        b.push(
            timestamp + i as i64,
            Some(key.as_bytes()),
            Some(&value),
            &[],
        );
    }
    b.build().unwrap()
}

pub fn small_config() -> LogConfig {
    LogConfig {
        segment_bytes: 64 * 1024,
        index_interval_bytes: 1024,
        preallocate_step_bytes: 256 * 1024,
        append_chunk_bytes: 16 * 1024,
        // Every clean close writes its indexes and record (the tests of that
        // path); `a_small_last_segment_closes_without_its_indexes` sets it.
        clean_close_scan_bytes: 0,
        ..LogConfig::default()
    }
}

pub async fn open(dir: &Path, config: LogConfig) -> skiff_engine::Result<PartitionLog> {
    PartitionLog::open(dir, "t", 0, config, BatchCache::new(64 << 20)).await
}

pub async fn open_uncached(dir: &Path, config: LogConfig) -> skiff_engine::Result<PartitionLog> {
    PartitionLog::open(dir, "t", 0, config, BatchCache::new(0)).await
}

pub fn mutable(b: &Bytes) -> BytesMut {
    BytesMut::from(&b[..])
}

/// Base offsets of the `.log` files in `dir`, ascending.
pub fn segment_bases(dir: &Path) -> Vec<i64> {
    let mut bases: Vec<i64> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().into_string().unwrap();
            name.strip_suffix(".log").and_then(|b| b.parse().ok())
        })
        .collect();
    bases.sort_unstable();
    bases
}

/// Every batch of the log from `from`, read in steps.
pub async fn read_all(log: &mut PartitionLog, from: i64) -> Vec<Bytes> {
    let mut out = Vec::new();
    let mut offset = from;
    while offset < log.log_end_offset() {
        let r = log.read(offset, 256 * 1024, i64::MAX).await.unwrap();
        assert!(!r.batches.is_empty(), "no progress at {offset}");
        offset = r.next_offset;
        out.extend(r.batches);
    }
    out
}
