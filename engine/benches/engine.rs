//! Engine micro-benchmarks: `cargo bench -p skiff-engine`.

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use glommio::LocalExecutor;
use skiff_engine::batch::{self, BatchBuilder, BatchHeader, BatchScanner};
use skiff_engine::batch_cache::BatchCache;
use skiff_engine::segment::index::OffsetIndex;
use skiff_engine::{AppendMode, Durability, LogConfig, PartitionLog};

/// A batch as a typical producer sends it: `count` records of `value_len` bytes.
fn sample_batch(count: usize, value_len: usize) -> bytes::Bytes {
    let value = vec![b'x'; value_len];
    let mut builder = BatchBuilder::new();
    for i in 0..count {
        builder.push(
            1_700_000_000_000 + i as i64,
            Some(b"key"),
            Some(&value),
            &[],
        );
    }
    match builder.build() {
        Ok(batch) => batch,
        Err(error) => panic!("benchmark batch does not build: {error}"),
    }
}

/// CRC-32C throughput: the per-byte cost every produced batch pays in `validate`.
fn bench_crc(c: &mut Criterion) {
    let mut group = c.benchmark_group("crc");
    for size in [1 << 10, 16 << 10, 1 << 20] {
        let data = vec![0xA5u8; size];
        group.throughput(Throughput::Bytes(size as u64));
        group.bench_with_input(BenchmarkId::new("crc32c", size), &data, |b, data| {
            b.iter(|| crc32c::crc32c(black_box(data)))
        });
    }
    // Whole-batch checks: CRC alone, then the full produce-path validation.
    let batch = sample_batch(100, 160);
    group.throughput(Throughput::Bytes(batch.len() as u64));
    group.bench_function("crc_matches/100x160B", |b| {
        b.iter(|| batch::crc_matches(black_box(&batch)))
    });
    group.bench_function("validate/100x160B", |b| {
        b.iter(|| batch::validate(black_box(&batch)))
    });
    group.finish();
}

/// Header-only work on the fetch path: one parse, and a scan over a chunk of batches.
fn bench_header_parse(c: &mut Criterion) {
    let mut group = c.benchmark_group("header");
    let batch = sample_batch(10, 100);
    group.bench_function("parse", |b| {
        b.iter(|| BatchHeader::parse(black_box(&batch)))
    });

    let chunk: Vec<u8> = (0..1000).flat_map(|_| batch.iter().copied()).collect();
    group.throughput(Throughput::Elements(1000));
    group.bench_function("scan/1000_batches", |b| {
        b.iter(|| BatchScanner::new(black_box(&chunk)).count())
    });
    group.finish();
}

/// Sparse index lookup in a full 1 GiB segment's index (one entry per 4 KiB).
fn bench_index_lookup(c: &mut Criterion) {
    let mut index = OffsetIndex::default();
    let entries = (1u32 << 30) / 4096;
    for i in 1..=entries {
        index.push(i * 4, i * 4096);
    }
    let mut group = c.benchmark_group("index");
    let mut probe = 0u32;
    group.bench_function("offset_lookup/262144_entries", |b| {
        b.iter(|| {
            probe = probe.wrapping_mul(1_103_515_245).wrapping_add(12_345) % (entries * 4);
            index.lookup(black_box(probe))
        })
    });
    group.finish();
}

/// `PartitionLog::append` on a real file (io_uring, O_DIRECT), without the flush:
/// validation, stamping, the copy into the DMA chunk, indexing and chunk writes.
fn bench_append(c: &mut Criterion) {
    let executor = LocalExecutor::default();
    let mut group = c.benchmark_group("append");
    group.sample_size(10);
    for (count, value_len) in [(100usize, 160usize), (1000, 1024)] {
        let batch = sample_batch(count, value_len);
        let dir = match tempfile::tempdir_in(".") {
            Ok(dir) => dir,
            Err(error) => panic!("bench temp dir: {error}"),
        };
        let path = dir.path().join("bench-0");
        let config = LogConfig {
            durability: Durability::Interval(Duration::from_secs(3600)),
            max_batch_bytes: 4 << 20,
            ..LogConfig::default()
        };
        let log = executor.run(PartitionLog::open(
            &path,
            "bench",
            0,
            config,
            BatchCache::new(64 << 20),
        ));
        let mut log = match log {
            Ok(log) => log,
            Err(error) => panic!("open bench log: {error}"),
        };
        group.throughput(Throughput::Bytes(batch.len() as u64));
        group.bench_function(
            BenchmarkId::new("batch", format!("{count}x{value_len}B")),
            |b| {
                b.iter_custom(|iters| {
                    let copies: Vec<BytesMut> =
                        (0..iters).map(|_| BytesMut::from(&batch[..])).collect();
                    executor.run(async {
                        let start = Instant::now();
                        for copy in copies {
                            if let Err(error) = log
                                .append(copy, AppendMode::Leader { leader_epoch: 0 })
                                .await
                            {
                                panic!("append: {error}");
                            }
                        }
                        start.elapsed()
                    })
                })
            },
        );
        if let Err(error) = executor.run(log.close()) {
            panic!("close bench log: {error}");
        }
    }
    group.finish();
}

criterion_group!(
    benches,
    bench_crc,
    bench_header_parse,
    bench_index_lookup,
    bench_append
);
criterion_main!(benches);
