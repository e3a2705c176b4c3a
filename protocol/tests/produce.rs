//! skiff's own Produce decoder (`skiff_protocol::produce`) against what
//! kafka-protocol's client encoder writes: the same fields at every served
//! version, records as disjoint pieces of the body (no copies), unknown tagged
//! fields skipped, and any truncated or garbled body an error, never a panic.

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{ProduceRequest, TopicName, TransactionalId};
use kafka_protocol::protocol::{Encodable, StrBytes};
use proptest::prelude::*;
use skiff_protocol::produce::{self, VERSIONS};
use skiff_protocol::ProtocolError;

fn encode(request: &ProduceRequest, version: i16) -> BytesMut {
    let mut body = BytesMut::new();
    if let Err(error) = request.encode(&mut body, version) {
        panic!("encoding v{version}: {error:#}");
    }
    body
}

fn request_strategy() -> impl Strategy<Value = ProduceRequest> {
    let records = proptest::option::of(proptest::collection::vec(any::<u8>(), 0..300));
    let partition = (any::<i32>(), records).prop_map(|(index, records)| {
        PartitionProduceData::default()
            .with_index(index)
            .with_records(records.map(Bytes::from))
    });
    let topic = (
        "[a-zA-Z0-9._é-]{0,20}",
        proptest::collection::vec(partition, 0..4),
    )
        .prop_map(|(name, partitions)| {
            TopicProduceData::default()
                .with_name(TopicName(StrBytes::from_string(name)))
                .with_partition_data(partitions)
        });
    (
        proptest::option::of("[a-z-]{0,12}"),
        any::<i16>(),
        any::<i32>(),
        proptest::collection::vec(topic, 0..4),
    )
        .prop_map(|(id, acks, timeout_ms, topics)| {
            ProduceRequest::default()
                .with_transactional_id(id.map(|id| TransactionalId(StrBytes::from_string(id))))
                .with_acks(acks)
                .with_timeout_ms(timeout_ms)
                .with_topic_data(topics)
        })
}

/// Checks the decoded request field by field against what was encoded, and
/// that every records piece lies inside `body_range` with no overlap.
fn assert_same(
    decoded: &produce::ProduceRequest,
    expected: &ProduceRequest,
    body_range: std::ops::Range<usize>,
) {
    assert_eq!(
        decoded.transactional_id.as_deref(),
        expected.transactional_id.as_ref().map(|t| t.0.as_str())
    );
    assert_eq!(decoded.acks, expected.acks);
    assert_eq!(decoded.timeout_ms, expected.timeout_ms);
    assert_eq!(decoded.topics.len(), expected.topic_data.len());
    let mut pieces = Vec::new();
    for (d, e) in decoded.topics.iter().zip(&expected.topic_data) {
        assert_eq!(d.name, e.name.0.as_str());
        assert_eq!(d.partitions.len(), e.partition_data.len());
        for (dp, ep) in d.partitions.iter().zip(&e.partition_data) {
            assert_eq!(dp.index, ep.index);
            assert_eq!(dp.records.as_deref(), ep.records.as_deref());
            if let Some(records) = dp.records.as_ref().filter(|r| !r.is_empty()) {
                let start = records.as_ptr() as usize;
                assert!(
                    body_range.contains(&start) && start + records.len() <= body_range.end,
                    "records copied out of the body"
                );
                pieces.push(start..start + records.len());
            }
        }
    }
    pieces.sort_by_key(|r| r.start);
    for pair in pieces.windows(2) {
        assert!(pair[0].end <= pair[1].start, "records pieces overlap");
    }
    let records: usize = expected
        .topic_data
        .iter()
        .flat_map(|t| &t.partition_data)
        .map(|p| p.records.as_ref().map_or(0, |r| r.len()))
        .sum();
    assert_eq!(decoded.records_bytes(), records);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn decodes_what_kafka_protocol_encodes(request in request_strategy(), version in VERSIONS) {
        let body = encode(&request, version);
        let range = body.as_ptr() as usize..body.as_ptr() as usize + body.len();
        let len = body.len();
        let decoded = match produce::decode(body, version) {
            Ok(decoded) => decoded,
            Err(error) => panic!("v{version}: {error}"),
        };
        prop_assert_eq!(decoded.body_bytes, len);
        assert_same(&decoded, &request, range);
    }

    #[test]
    fn every_truncation_is_an_error(request in request_strategy(), version in VERSIONS, cut in any::<prop::sample::Index>()) {
        let body = encode(&request, version);
        let at = cut.index(body.len().max(1));
        let result = produce::decode(BytesMut::from(&body[..at]), version);
        prop_assert!(
            matches!(result, Err(ProtocolError::Malformed { .. })),
            "v{} cut at {} of {}: {:?}", version, at, body.len(), result
        );
    }

    #[test]
    fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200), version in VERSIONS) {
        let _ = produce::decode(BytesMut::from(&bytes[..]), version);
    }
}

#[test]
fn unknown_tagged_fields_are_skipped_at_every_level() {
    let field = |tag: i32| {
        std::iter::once((tag, Bytes::from_static(b"\x01\x02\x03")))
            .collect::<std::collections::BTreeMap<_, _>>()
    };
    let request = ProduceRequest::default()
        .with_acks(1)
        .with_timeout_ms(1000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(TopicName(StrBytes::from_static_str("t")))
            .with_partition_data(vec![PartitionProduceData::default()
                .with_index(3)
                .with_records(Some(Bytes::from_static(b"batch")))
                .with_unknown_tagged_fields(field(7))])
            .with_unknown_tagged_fields(field(8))])
        .with_unknown_tagged_fields(field(9));
    for version in 9..=12 {
        let body = encode(&request, version);
        let range = body.as_ptr() as usize..body.as_ptr() as usize + body.len();
        let decoded = match produce::decode(body, version) {
            Ok(decoded) => decoded,
            Err(error) => panic!("v{version}: {error}"),
        };
        assert_same(&decoded, &request, range);
    }
}

/// Why `body` is refused (fails the test if it decodes).
fn refusal(body: BytesMut, version: i16) -> String {
    match produce::decode(body, version) {
        Ok(decoded) => panic!("v{version} decoded: {decoded:?}"),
        Err(error) => error.to_string(),
    }
}

#[test]
fn trailing_bytes_and_null_names_are_refused() {
    let request = ProduceRequest::default().with_acks(1);
    for version in VERSIONS {
        let mut body = encode(&request, version);
        body.extend_from_slice(b"x");
        let error = refusal(body, version);
        assert!(error.contains("after the request's end"), "{error}");
    }
    // v3: null transactional id, acks, timeout, one topic whose name is null.
    let mut body = BytesMut::new();
    body.extend_from_slice(&(-1i16).to_be_bytes());
    body.extend_from_slice(&1i16.to_be_bytes());
    body.extend_from_slice(&0i32.to_be_bytes());
    body.extend_from_slice(&1i32.to_be_bytes());
    body.extend_from_slice(&(-1i16).to_be_bytes());
    body.extend_from_slice(&0i32.to_be_bytes());
    let error = refusal(body, 3);
    assert!(error.contains("null topic name"), "{error}");
}

#[test]
fn a_stamped_batch_changes_nothing_else_in_the_frame() {
    let request = ProduceRequest::default()
        .with_acks(-1)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(TopicName(StrBytes::from_static_str("t")))
            .with_partition_data(vec![
                PartitionProduceData::default()
                    .with_index(0)
                    .with_records(Some(Bytes::from(vec![0xaa; 64]))),
                PartitionProduceData::default()
                    .with_index(1)
                    .with_records(Some(Bytes::from(vec![0xbb; 64]))),
            ])]);
    let mut decoded = match produce::decode(encode(&request, 9), 9) {
        Ok(decoded) => decoded,
        Err(error) => panic!("{error}"),
    };
    let partitions = &mut decoded.topics[0].partitions;
    if let Some(first) = partitions[0].records.as_mut() {
        first[..8].copy_from_slice(&42i64.to_be_bytes());
    }
    assert_eq!(
        partitions[1].records.as_deref(),
        Some(&[0xbb; 64][..]),
        "the neighbour is untouched"
    );
    assert_eq!(
        partitions[0].records.as_deref().map(|r| &r[..8]),
        Some(&42i64.to_be_bytes()[..])
    );
}
