//! Response frames: size prefix, response header, body, as a list of parts.
//!
//! A FetchResponse is encoded through [`SpliceBuf`](crate::splice), so the record
//! bytes registered as placeholders go out as their own parts, uncopied; every
//! other response is one contiguous part.

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, ResponseHeader, ResponseKind};
use kafka_protocol::protocol::buf::ByteBufMut;
use kafka_protocol::protocol::Encodable;

use crate::error::{CodecError, ProtocolError};
use crate::frame::SIZE_PREFIX_BYTES;
use crate::splice::{SpliceBuf, Splices};

/// Initial capacity of a response's encoded bytes; they grow as needed.
const ENCODE_CAPACITY_BYTES: usize = 1024;

/// A whole response frame as an iovec list: write `parts` in order (`writev`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseFrame {
    /// The frame's bytes in order; the first part starts with the size prefix.
    pub parts: Vec<Bytes>,
}

impl ResponseFrame {
    /// Total bytes on the wire, size prefix included.
    pub fn len(&self) -> usize {
        self.parts.iter().map(Bytes::len).sum()
    }

    /// Always false for an encoded frame (the size prefix is there).
    pub fn is_empty(&self) -> bool {
        self.parts.iter().all(Bytes::is_empty)
    }

    /// The frame as one buffer: a copy, for tests and writers without `writev`.
    pub fn to_bytes(&self) -> Bytes {
        let mut out = BytesMut::with_capacity(self.len());
        for part in &self.parts {
            out.extend_from_slice(part);
        }
        out.freeze()
    }
}

/// The response header version for `api_key` at `version`.
///
/// ApiVersions responses always use header v0, whatever the request version: a
/// client that does not yet know the broker's versions must be able to read the
/// answer (Kafka's special case, KIP-511).
pub fn response_header_version(api_key: ApiKey, version: i16) -> i16 {
    match api_key {
        ApiKey::ApiVersions => 0,
        _ => api_key.response_header_version(version),
    }
}

/// Encodes the whole response frame for request `correlation_id`.
///
/// `api_key` must be the body's api. `splices` holds the record bytes behind the
/// placeholders in `body` (only a Fetch body may carry any); pass an empty
/// `Splices` otherwise.
pub fn encode_response(
    correlation_id: i32,
    api_key: ApiKey,
    version: i16,
    body: &ResponseKind,
    splices: &Splices,
) -> Result<ResponseFrame, ProtocolError> {
    let header = ResponseHeader::default().with_correlation_id(correlation_id);
    let header_version = response_header_version(api_key, version);
    let parts = match body {
        ResponseKind::Fetch(fetch) => {
            let mut buf = SpliceBuf::new(splices, ENCODE_CAPACITY_BYTES);
            buf.put_i32(0);
            header
                .encode(&mut buf, header_version)
                .map_err(encode_error(api_key, version))?;
            fetch
                .encode(&mut buf, version)
                .map_err(encode_error(api_key, version))?;
            let size = size_prefix(buf.offset())?;
            buf.range(0..SIZE_PREFIX_BYTES).copy_from_slice(&size);
            buf.finish().map_err(|source| ProtocolError::Splice {
                api_key,
                version,
                source,
            })?
        }
        other => {
            if !splices.is_empty() {
                return Err(ProtocolError::SplicesUnsupported { api_key });
            }
            let mut buf = BytesMut::with_capacity(ENCODE_CAPACITY_BYTES);
            buf.put_i32(0);
            header
                .encode(&mut buf, header_version)
                .map_err(encode_error(api_key, version))?;
            other
                .encode(&mut buf, version)
                .map_err(encode_error(api_key, version))?;
            let size = size_prefix(buf.len())?;
            buf[..SIZE_PREFIX_BYTES].copy_from_slice(&size);
            vec![buf.freeze()]
        }
    };
    Ok(ResponseFrame { parts })
}

/// The size prefix for a frame whose bytes, prefix included, are `frame_bytes`.
fn size_prefix(frame_bytes: usize) -> Result<[u8; SIZE_PREFIX_BYTES], ProtocolError> {
    let size = frame_bytes - SIZE_PREFIX_BYTES;
    i32::try_from(size)
        .map(i32::to_be_bytes)
        .map_err(|_| ProtocolError::ResponseTooLarge { size })
}

/// Wraps kafka-protocol's (anyhow) error.
fn encode_error<E: Into<CodecError>>(api_key: ApiKey, version: i16) -> impl Fn(E) -> ProtocolError {
    move |source| ProtocolError::Encode {
        api_key,
        version,
        source: source.into(),
    }
}
