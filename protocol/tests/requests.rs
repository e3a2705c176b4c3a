//! Request frames through `FrameReader`, `decode_header` and `decode_body`.

mod common;

use bytes::Bytes;
use common::samples::sample_request;
use common::{raw_request_frame, request_frame, MemReader};
use futures_lite::future::block_on;
use proptest::prelude::*;
use proptest::sample::Index;
use skiff_protocol::messages::{ApiKey, RequestKind};
use skiff_protocol::versions::SERVED_APIS;
use skiff_protocol::{decode_body, decode_header, FrameReader, ProtocolError, Request};

/// Every served api at every accepted version (min and max included).
fn accepted_versions() -> Vec<(ApiKey, i16)> {
    SERVED_APIS
        .iter()
        .flat_map(|api| {
            let accepted = api.accepted();
            (accepted.min..=accepted.max).map(move |version| (api.api_key, version))
        })
        .collect()
}

fn sample(api_key: ApiKey, version: i16) -> RequestKind {
    match sample_request(api_key, version) {
        Some(request) => request,
        None => panic!("no sample for {api_key:?}"),
    }
}

#[test]
fn every_served_request_round_trips_at_every_accepted_version() {
    let cases = accepted_versions();
    // All frames pipelined on one stream, read in odd-sized pieces.
    let mut stream = Vec::new();
    for (index, (api_key, version)) in cases.iter().enumerate() {
        stream.extend_from_slice(&request_frame(
            *api_key,
            *version,
            index as i32,
            &sample(*api_key, *version),
        ));
    }
    for max_read in [7, 4096, usize::MAX] {
        let mut reader = MemReader::new(stream.clone(), max_read);
        let mut frames = FrameReader::new(skiff_protocol::DEFAULT_MAX_FRAME_BYTES);
        for (index, (api_key, version)) in cases.iter().enumerate() {
            let frame = match block_on(frames.next(&mut reader)) {
                Ok(Some(frame)) => frame.freeze(),
                other => panic!("{api_key:?} v{version}: {other:?}"),
            };
            let frame_range = frame.as_ptr() as usize..frame.as_ptr() as usize + frame.len();
            let mut rest = frame.clone();
            let (header, decoded_key) = match decode_header(&mut rest) {
                Ok(decoded) => decoded,
                Err(error) => panic!("{api_key:?} v{version}: {error}"),
            };
            assert_eq!(decoded_key, *api_key);
            assert_eq!(header.request_api_version, *version);
            assert_eq!(header.correlation_id, index as i32);
            assert_eq!(header.client_id.as_deref(), Some("skiff-test"));
            let body = match decode_body(*api_key, *version, &mut rest) {
                Ok(body) => body,
                Err(error) => panic!("{api_key:?} v{version}: {error:?}"),
            };
            assert_eq!(body, sample(*api_key, *version), "{api_key:?} v{version}");
            if let RequestKind::Produce(produce) = &body {
                // Record batches are slices of the frame, not copies.
                let records = produce.topic_data[0].partition_data[0].records.as_ref();
                let address = records.map_or(0, |records| records.as_ptr() as usize);
                assert!(frame_range.contains(&address));
            }
            let whole = match Request::decode(frame) {
                Ok(request) => request,
                Err(error) => panic!("{error}"),
            };
            assert_eq!(
                (whole.api_key, whole.version, whole.body),
                (*api_key, *version, body)
            );
        }
        assert!(matches!(block_on(frames.next(&mut reader)), Ok(None)));
    }
}

#[test]
fn advertised_but_refused_produce_versions_are_not_decoded() {
    for version in 0..3 {
        // kafka-protocol cannot encode v0-2 bodies: any bytes do, they are not read.
        let mut frame = raw_request_frame(ApiKey::Produce, version, 1, b"\xff\xff").slice(4..);
        let (header, api_key) = match decode_header(&mut frame) {
            Ok(decoded) => decoded,
            Err(error) => panic!("{error}"),
        };
        assert_eq!(
            (api_key, header.request_api_version),
            (ApiKey::Produce, version)
        );
        assert!(!skiff_protocol::accepts(api_key, version));
        assert!(matches!(
            decode_body(api_key, version, &mut frame),
            Err(ProtocolError::UnsupportedVersion { .. })
        ));
    }
}

#[test]
fn api_versions_header_version_follows_the_request_version() {
    // v0-2 use request header v1, v3+ header v2 (with tagged fields).
    for version in 0..=4 {
        let frame = request_frame(
            ApiKey::ApiVersions,
            version,
            9,
            &sample(ApiKey::ApiVersions, version),
        );
        let request = match Request::decode(frame.slice(4..)) {
            Ok(request) => request,
            Err(error) => panic!("v{version}: {error}"),
        };
        assert_eq!(request.header.correlation_id, 9);
    }
}

#[test]
fn unknown_api_key_is_reported_with_its_correlation_id() {
    let frame = Bytes::from_static(&[0x03, 0xe8, 0, 0, 0, 0, 0x01, 0x02, 0, 0]);
    assert!(matches!(
        Request::decode(frame),
        Err(ProtocolError::UnknownApiKey {
            api_key: 1000,
            api_version: 0,
            correlation_id: 0x0102
        })
    ));
}

#[test]
fn upstream_allocation_reproducer_is_an_error() {
    // kafka-protocol's decoder would pre-allocate ~3.6 GiB for this Metadata v0
    // body and abort the process (upstream PR #152).
    let mut body = Bytes::from_static(&[0x03, 0x3c, 0x0c, 0x00, 0xb6]);
    assert!(matches!(
        decode_body(ApiKey::Metadata, 0, &mut body),
        Err(ProtocolError::Malformed { .. })
    ));
    // Every length position of every served request overwritten with the largest
    // i32 and the largest compact (varint) length: errors or odd values, never an
    // abort.
    let largest_varint = [0xff, 0xff, 0xff, 0xff, 0x0f];
    for (api_key, version) in accepted_versions() {
        let mut body = request_frame(api_key, version, 1, &sample(api_key, version)).slice(4..);
        if decode_header(&mut body).is_err() {
            panic!("{api_key:?} v{version}");
        }
        for position in 0..body.len() {
            for crafted_length in [&i32::MAX.to_be_bytes()[..], &largest_varint[..]] {
                let mut crafted = body.to_vec();
                crafted.truncate(position);
                crafted.extend_from_slice(crafted_length);
                crafted
                    .extend_from_slice(body.get(position + crafted_length.len()..).unwrap_or(&[]));
                let _ = decode_body(api_key, version, &mut Bytes::from(crafted));
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn garbage_frames_never_panic(frame in proptest::collection::vec(any::<u8>(), 0..256)) {
        let mut frame = Bytes::from(frame);
        if let Ok((header, api_key)) = decode_header(&mut frame) {
            let _ = decode_body(api_key, header.request_api_version, &mut frame);
        }
    }

    #[test]
    fn garbage_streams_never_panic(data in proptest::collection::vec(any::<u8>(), 0..512)) {
        // What the fuzz target does, on a budget.
        let mut stream = &data[..];
        let mut frames = FrameReader::new(1024);
        while let Ok(Some(frame)) = block_on(frames.next(&mut stream)) {
            let _ = Request::decode(frame.freeze());
        }
    }

    #[test]
    fn garbage_bodies_never_panic(
        case in any::<Index>(),
        body in proptest::collection::vec(any::<u8>(), 0..256),
    ) {
        let cases = accepted_versions();
        let (api_key, version) = cases[case.index(cases.len())];
        let _ = decode_body(api_key, version, &mut Bytes::from(body));
    }

    #[test]
    fn mutated_requests_never_panic(
        case in any::<Index>(),
        mutations in proptest::collection::vec((any::<Index>(), any::<u8>()), 1..6),
        cut in any::<Index>(),
    ) {
        let cases = accepted_versions();
        let (api_key, version) = cases[case.index(cases.len())];
        let mut frame = request_frame(api_key, version, 1, &sample(api_key, version)).slice(4..).to_vec();
        for (position, byte) in mutations {
            let position = position.index(frame.len());
            frame[position] = byte;
        }
        frame.truncate(cut.index(frame.len() + 1));
        let _ = Request::decode(Bytes::from(frame));
    }
}
