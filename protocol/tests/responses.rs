//! Response frames: header versions and zero-copy fetch splicing.

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::protocol::{Decodable, Encodable};
use skiff_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use skiff_protocol::messages::{
    ApiKey, ApiVersionsResponse, FetchResponse, MetadataResponse, ResponseHeader, ResponseKind,
    TopicName,
};
use skiff_protocol::{
    api_versions_response, encode_response, ProtocolError, ResponseError, ResponseFrame,
    SpliceError, Splices, StrBytes,
};

fn encoded(
    correlation_id: i32,
    api_key: ApiKey,
    version: i16,
    body: &ResponseKind,
    splices: &Splices,
) -> ResponseFrame {
    match encode_response(correlation_id, api_key, version, body, splices) {
        Ok(frame) => frame,
        Err(error) => panic!("{api_key:?} v{version}: {error:?}"),
    }
}

/// What kafka-protocol itself writes: size, header, body, into one buffer.
fn reference_frame<T: Encodable>(
    correlation_id: i32,
    header_version: i16,
    body: &T,
    version: i16,
) -> Bytes {
    let mut buf = BytesMut::new();
    buf.put_i32(0);
    let header = ResponseHeader::default().with_correlation_id(correlation_id);
    assert!(header.encode(&mut buf, header_version).is_ok());
    assert!(body.encode(&mut buf, version).is_ok());
    let size = (buf.len() - 4) as i32;
    buf[..4].copy_from_slice(&size.to_be_bytes());
    buf.freeze()
}

#[test]
fn api_versions_v3_response_uses_header_v0() {
    let body = api_versions_response(Some(ResponseError::UnsupportedVersion));
    let frame = encoded(
        0x0a0b0c0d,
        ApiKey::ApiVersions,
        3,
        &ResponseKind::ApiVersions(body.clone()),
        &Splices::new(),
    );
    assert_eq!(frame.parts.len(), 1);
    let bytes = frame.to_bytes();
    let size = i32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
    assert_eq!(size as usize, bytes.len() - 4);
    // Header v0 is the correlation id alone: the error code follows at once, with
    // no tagged-field count byte between them.
    assert_eq!(bytes[4..8], [0x0a, 0x0b, 0x0c, 0x0d]);
    assert_eq!(bytes[8..10], [0, 35]);
    assert_eq!(bytes, reference_frame(0x0a0b0c0d, 0, &body, 3));
    let mut rest = bytes.slice(8..);
    let decoded = ApiVersionsResponse::decode(&mut rest, 3);
    assert_eq!(decoded.ok(), Some(body));
    assert!(rest.is_empty());
}

#[test]
fn other_responses_follow_their_header_version() {
    let body = MetadataResponse::default().with_cluster_id(Some(StrBytes::from_static_str("c")));
    for (version, header_version) in [(8, 0), (9, 1), (12, 1)] {
        let frame = encoded(
            7,
            ApiKey::Metadata,
            version,
            &ResponseKind::Metadata(body.clone()),
            &Splices::new(),
        );
        assert_eq!(
            frame.to_bytes(),
            reference_frame(7, header_version, &body, version)
        );
    }
}

/// Record batches per (topic, partition): several batches, none, an empty list,
/// an empty batch among others.
fn batch_layout() -> Vec<Vec<Option<Vec<Bytes>>>> {
    let batch =
        |seed: u8, len: usize| Bytes::from((0..len).map(|i| seed ^ i as u8).collect::<Vec<u8>>());
    vec![
        vec![
            Some(vec![batch(1, 61), batch(2, 300), batch(3, 5)]),
            None,
            Some(vec![batch(4, 1000)]),
        ],
        vec![
            Some(vec![]),
            Some(vec![batch(5, 70), Bytes::new(), batch(6, 9)]),
        ],
    ]
}

fn fetch_response(
    records: impl Fn(usize, usize) -> Option<Bytes>,
    shape: &[Vec<Option<Vec<Bytes>>>],
) -> FetchResponse {
    let topics = shape
        .iter()
        .enumerate()
        .map(|(t, partitions)| {
            FetchableTopicResponse::default()
                .with_topic(TopicName(StrBytes::from_string(format!("topic-{t}"))))
                .with_partitions(
                    (0..partitions.len())
                        .map(|p| {
                            PartitionData::default()
                                .with_partition_index(p as i32)
                                .with_high_watermark(100 + p as i64)
                                .with_last_stable_offset(100 + p as i64)
                                .with_records(records(t, p))
                        })
                        .collect(),
                )
        })
        .collect();
    FetchResponse::default()
        .with_throttle_time_ms(3)
        .with_responses(topics)
}

#[test]
fn fetch_records_are_spliced_not_copied() {
    let shape = batch_layout();
    for version in [4, 11, 12] {
        let mut splices = Splices::new();
        let mut placeholders = Vec::new();
        for partitions in &shape {
            placeholders.push(
                partitions
                    .iter()
                    .map(|batches| batches.clone().map(|batches| splices.placeholder(batches)))
                    .collect::<Vec<_>>(),
            );
        }
        let spliced = fetch_response(|t, p| placeholders[t][p].clone(), &shape);
        let concatenated = fetch_response(
            |t, p| shape[t][p].as_ref().map(|batches| batches.concat().into()),
            &shape,
        );
        let header_version = if version >= 12 { 1 } else { 0 };
        let frame = encoded(
            42,
            ApiKey::Fetch,
            version,
            &ResponseKind::Fetch(spliced),
            &splices,
        );

        // (a) byte for byte what kafka-protocol writes with the real records.
        assert_eq!(
            frame.to_bytes(),
            reference_frame(42, header_version, &concatenated, version),
            "v{version}"
        );
        // (b) every batch is one of the parts, the very same memory.
        let batches: Vec<&Bytes> = shape
            .iter()
            .flatten()
            .flatten()
            .flatten()
            .filter(|b| !b.is_empty())
            .collect();
        for batch in &batches {
            assert!(
                frame
                    .parts
                    .iter()
                    .any(|part| part.as_ptr() == batch.as_ptr() && part.len() == batch.len()),
                "v{version}: a batch was copied"
            );
        }
        // Encoded segments: one before each of the three spliced runs, and the
        // closing tagged-field counts from v12 (before it the last batch ends
        // the frame).
        let trailing = usize::from(version >= 12);
        assert_eq!(
            frame.parts.len(),
            batches.len() + 3 + trailing,
            "v{version}"
        );
    }
}

#[test]
fn splicing_misuse_is_refused() {
    // Placeholders on a response kind that cannot carry them.
    let mut splices = Splices::new();
    let placeholder = splices.placeholder(vec![Bytes::from_static(b"batch")]);
    let metadata = ResponseKind::Metadata(MetadataResponse::default());
    assert!(matches!(
        encode_response(1, ApiKey::Metadata, 12, &metadata, &splices),
        Err(ProtocolError::SplicesUnsupported { .. })
    ));
    // A registered placeholder missing from the response.
    let empty = ResponseKind::Fetch(fetch_response(|_, _| None, &[vec![None]]));
    assert!(matches!(
        encode_response(1, ApiKey::Fetch, 12, &empty, &splices),
        Err(ProtocolError::Splice {
            source: SpliceError::Unused { index: 0 },
            ..
        })
    ));
    // A placeholder from another registry.
    let other = Splices::new();
    let fetch = ResponseKind::Fetch(fetch_response(
        |_, _| Some(placeholder.clone()),
        &[vec![None]],
    ));
    assert!(matches!(
        encode_response(1, ApiKey::Fetch, 12, &fetch, &other),
        Err(ProtocolError::Splice {
            source: SpliceError::ForeignPlaceholder { .. },
            ..
        })
    ));
    // The same placeholder twice is fine: the batches go out twice.
    let twice = ResponseKind::Fetch(fetch_response(
        |_, _| Some(placeholder.clone()),
        &[vec![None, None]],
    ));
    let frame = encoded(1, ApiKey::Fetch, 12, &twice, &splices);
    assert_eq!(
        frame
            .parts
            .iter()
            .filter(|part| &part[..] == b"batch")
            .count(),
        2
    );
}
