//! Request decoding micro-benchmarks: `cargo bench -p skiff-protocol`.
//!
//! What every request pays before a handler sees it: header, version check,
//! array-count guard, body (kafka-protocol). Record batches stay slices of the
//! frame, so a Produce request's cost should not grow with its batch bytes.

use bytes::{BufMut, Bytes, BytesMut};
use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiKey, BrokerId, FetchRequest, MetadataRequest, ProduceRequest, RequestHeader, TopicName,
};
use kafka_protocol::protocol::{Encodable, HeaderVersion, Request as KafkaRequest, StrBytes};
use skiff_protocol::Request;

/// A request frame as read off a connection (without its size prefix).
fn frame<R: KafkaRequest + Encodable + HeaderVersion>(request: &R, version: i16) -> Bytes {
    let header = RequestHeader::default()
        .with_request_api_key(R::KEY)
        .with_request_api_version(version)
        .with_correlation_id(7)
        .with_client_id(Some(StrBytes::from_static_str("skiff-bench")));
    let mut buf = BytesMut::new();
    if let Err(error) = header.encode(&mut buf, R::header_version(version)) {
        panic!("header: {error}");
    }
    if let Err(error) = request.encode(&mut buf, version) {
        panic!("{:?} v{version}: {error}", ApiKey::try_from(R::KEY));
    }
    buf.freeze()
}

fn topic(name: &str) -> TopicName {
    TopicName(StrBytes::from_string(name.to_string()))
}

/// Produce with `partitions` batches of `batch_bytes` (opaque bytes: decoding
/// never looks inside them).
fn produce(version: i16, partitions: i32, batch_bytes: usize) -> Bytes {
    let mut batch = BytesMut::with_capacity(batch_bytes);
    batch.put_bytes(b'x', batch_bytes);
    let batch = batch.freeze();
    let request = ProduceRequest::default()
        .with_acks(-1)
        .with_timeout_ms(30_000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(topic("orders"))
            .with_partition_data(
                (0..partitions)
                    .map(|p| {
                        PartitionProduceData::default()
                            .with_index(p)
                            .with_records(Some(batch.clone()))
                    })
                    .collect(),
            )]);
    frame(&request, version)
}

fn fetch(version: i16, partitions: i32) -> Bytes {
    let request = FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(500)
        .with_min_bytes(1)
        .with_max_bytes(50 << 20)
        .with_topics(vec![FetchTopic::default()
            .with_topic(topic("orders"))
            .with_partitions(
                (0..partitions)
                    .map(|p| {
                        FetchPartition::default()
                            .with_partition(p)
                            .with_fetch_offset(1_000_000)
                            .with_partition_max_bytes(1 << 20)
                    })
                    .collect(),
            )]);
    frame(&request, version)
}

fn metadata(version: i16) -> Bytes {
    let request = MetadataRequest::default()
        .with_topics(Some(vec![
            MetadataRequestTopic::default().with_name(Some(topic("orders")))
        ]))
        .with_allow_auto_topic_creation(false);
    frame(&request, version)
}

fn bench_decode(c: &mut Criterion) {
    let mut group = c.benchmark_group("decode");
    let cases = [
        ("produce_v3/1x1KiB", produce(3, 1, 1 << 10)),
        ("produce_v9/16x16KiB", produce(9, 16, 16 << 10)),
        ("produce_v9/16x1MiB", produce(9, 16, 1 << 20)),
        ("fetch_v12/16_partitions", fetch(12, 16)),
        ("fetch_v4/1_partition", fetch(4, 1)),
        ("metadata_v12/1_topic", metadata(12)),
    ];
    for (name, frame) in cases {
        group.throughput(Throughput::Elements(1));
        group.bench_function(name, |b| {
            b.iter(|| match Request::decode(black_box(frame.clone())) {
                Ok(request) => request,
                Err(error) => panic!("{name}: {error}"),
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench_decode);
criterion_main!(benches);
