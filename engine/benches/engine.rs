//! Engine micro-benchmarks: `cargo bench -p skiff-engine`.

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use skiff_engine::batch::{self, BatchBuilder, BatchHeader, BatchScanner};

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

criterion_group!(benches, bench_crc, bench_header_parse);
criterion_main!(benches);
