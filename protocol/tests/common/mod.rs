//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub mod samples;

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{BufMut, Bytes, BytesMut};
use futures_io::AsyncRead;
use skiff_protocol::messages::{ApiKey, RequestHeader, RequestKind};
use skiff_protocol::StrBytes;

/// Encodes a whole request frame the way a client does (kafka-protocol's own
/// encoders), size prefix included.
pub fn request_frame(
    api_key: ApiKey,
    version: i16,
    correlation_id: i32,
    body: &RequestKind,
) -> Bytes {
    let mut encoded_body = BytesMut::new();
    if let Err(error) = body.encode(&mut encoded_body, version) {
        panic!("body {api_key:?} v{version}: {error:#}");
    }
    raw_request_frame(api_key, version, correlation_id, &encoded_body)
}

/// A request frame with a kafka-protocol header and `body` as given.
pub fn raw_request_frame(api_key: ApiKey, version: i16, correlation_id: i32, body: &[u8]) -> Bytes {
    let header = RequestHeader::default()
        .with_request_api_key(api_key as i16)
        .with_request_api_version(version)
        .with_correlation_id(correlation_id)
        .with_client_id(Some(StrBytes::from_static_str("skiff-test")));
    let mut buf = BytesMut::new();
    buf.put_i32(0);
    let header_version = api_key.request_header_version(version);
    if let Err(error) =
        kafka_protocol::protocol::Encodable::encode(&header, &mut buf, header_version)
    {
        panic!("header {api_key:?} v{version}: {error:#}");
    }
    buf.extend_from_slice(body);
    let size = (buf.len() - 4) as i32;
    buf[..4].copy_from_slice(&size.to_be_bytes());
    buf.freeze()
}

/// An in-memory stream that returns at most `max_read` bytes per read.
pub struct MemReader {
    pub data: Bytes,
    pub position: usize,
    pub max_read: usize,
}

impl MemReader {
    pub fn new(data: impl Into<Bytes>, max_read: usize) -> Self {
        Self {
            data: data.into(),
            position: 0,
            max_read,
        }
    }
}

impl AsyncRead for MemReader {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        let n = buf
            .len()
            .min(self.max_read)
            .min(self.data.len() - self.position);
        let start = self.position;
        buf[..n].copy_from_slice(&self.data[start..start + n]);
        self.position += n;
        Poll::Ready(Ok(n))
    }
}
