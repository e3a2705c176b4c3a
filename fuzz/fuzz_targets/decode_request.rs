//! Arbitrary bytes as a connection's stream: frames are split off by
//! `FrameReader` (1 MiB bound), each frame goes through `decode_header` and, when
//! the api is known, `decode_body` (which checks served versions and array counts
//! before kafka-protocol decodes). Any panic or abort is a finding.
//!
//! Run: `cargo install cargo-fuzz`, then from this directory
//! `cargo +nightly fuzz run decode_request`.

#![no_main]

use libfuzzer_sys::fuzz_target;
use skiff_protocol::{decode_body, decode_header, FrameReader};

const MAX_FRAME_BYTES: usize = 1024 * 1024;

fuzz_target!(|data: &[u8]| {
    // The input as one request frame body, whatever its size prefix would say.
    decode(bytes::Bytes::copy_from_slice(data));

    // The input as a stream of frames.
    let mut stream = data;
    let mut frames = FrameReader::new(MAX_FRAME_BYTES);
    while let Ok(Some(frame)) = futures_lite::future::block_on(frames.next(&mut stream)) {
        decode(frame.freeze());
    }
});

fn decode(mut frame: bytes::Bytes) {
    if let Ok((header, api_key)) = decode_header(&mut frame) {
        let _ = decode_body(api_key, header.request_api_version, &mut frame);
    }
}
