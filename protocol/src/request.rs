//! Request decoding, in two steps so that an unsupported version can be answered
//! without touching its body: [`decode_header`], then (if
//! [`versions::accepts`]) [`decode_body`].
//!
//! Record batches in a ProduceRequest stay `Bytes` slices of the frame: nothing
//! here decodes records. The node decodes Produce bodies with [`crate::produce`]
//! instead, which hands out writable pieces of the frame.

use bytes::Bytes;
use kafka_protocol::messages::{ApiKey, RequestHeader, RequestKind};
use kafka_protocol::protocol::buf::ByteBuf;
use kafka_protocol::protocol::Decodable;

use crate::error::ProtocolError;
use crate::guard;
use crate::versions;

/// A decoded request.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The request header (correlation id, client id).
    pub header: RequestHeader,
    /// `header.request_api_key`, known to be a valid key.
    pub api_key: ApiKey,
    /// `header.request_api_version`.
    pub version: i16,
    /// The body.
    pub body: RequestKind,
}

impl Request {
    /// Decodes a whole request frame (both steps). Fails with
    /// [`ProtocolError::UnsupportedVersion`] for what skiff does not serve.
    pub fn decode(mut frame: Bytes) -> Result<Self, ProtocolError> {
        let (header, api_key) = decode_header(&mut frame)?;
        let version = header.request_api_version;
        let body = decode_body(api_key, version, &mut frame)?;
        Ok(Self {
            header,
            api_key,
            version,
            body,
        })
    }
}

/// Bytes of api key + api version + correlation id: the part of every header
/// readable without knowing the api.
const HEADER_PREFIX_BYTES: usize = 8;

/// Decodes the request header and advances `frame` to the body.
///
/// The api key and version are read first to choose the header version
/// (ApiVersions requests use header v2 from v3 on, v1 before). An api key Kafka
/// does not define fails with [`ProtocolError::UnknownApiKey`]; the request
/// cannot be answered (its response format is unknown): close the connection.
pub fn decode_header<B>(frame: &mut B) -> Result<(RequestHeader, ApiKey), ProtocolError>
where
    B: ByteBuf + std::ops::Deref<Target = [u8]>,
{
    let bytes: &[u8] = frame;
    let Some(prefix) = bytes.get(..HEADER_PREFIX_BYTES) else {
        return Err(ProtocolError::ShortHeader { len: bytes.len() });
    };
    let raw_api_key = i16::from_be_bytes([prefix[0], prefix[1]]);
    let version = i16::from_be_bytes([prefix[2], prefix[3]]);
    let Ok(api_key) = ApiKey::try_from(raw_api_key) else {
        return Err(ProtocolError::UnknownApiKey {
            api_key: raw_api_key,
            api_version: version,
            correlation_id: i32::from_be_bytes([prefix[4], prefix[5], prefix[6], prefix[7]]),
        });
    };
    let header_version = api_key.request_header_version(version);
    let header =
        RequestHeader::decode(frame, header_version).map_err(|source| ProtocolError::Header {
            api_key,
            version,
            source: source.into(),
        })?;
    Ok((header, api_key))
}

/// Decodes a request body (what [`decode_header`] left of the frame).
///
/// Only served versions are decoded ([`versions::accepts`]); anything else fails
/// with [`ProtocolError::UnsupportedVersion`] without reading the body. Before
/// kafka-protocol sees the body, its array counts are checked against its length
/// (`guard.rs`), so a crafted count cannot make the decoder allocate gigabytes.
pub fn decode_body(
    api_key: ApiKey,
    version: i16,
    frame: &mut Bytes,
) -> Result<RequestKind, ProtocolError> {
    let Some(api) = versions::served(api_key).filter(|api| api.accepts(version)) else {
        return Err(ProtocolError::UnsupportedVersion { api_key, version });
    };
    if let Some(schema) = api.guard {
        guard::check(schema, version, frame).map_err(|violation| ProtocolError::Malformed {
            api_key,
            version,
            reason: violation.to_string(),
        })?;
    }
    RequestKind::decode(api_key, frame, version).map_err(|source| ProtocolError::Body {
        api_key,
        version,
        source: source.into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_api_key_reports_correlation_id() {
        let mut frame = Bytes::from_static(&[0x7f, 0x00, 0, 1, 0, 0, 0, 42, 0xff]);
        assert!(matches!(
            decode_header(&mut frame),
            Err(ProtocolError::UnknownApiKey {
                api_key: 0x7f00,
                api_version: 1,
                correlation_id: 42
            })
        ));
    }

    #[test]
    fn short_frames_are_errors() {
        for len in 0..HEADER_PREFIX_BYTES {
            let mut frame = Bytes::from(vec![0u8; len]);
            assert!(matches!(
                decode_header(&mut frame),
                Err(ProtocolError::ShortHeader { .. })
            ));
        }
    }

    #[test]
    fn unserved_versions_are_not_decoded() {
        let mut body = Bytes::from_static(b"garbage");
        assert!(matches!(
            decode_body(ApiKey::Produce, 2, &mut body),
            Err(ProtocolError::UnsupportedVersion { version: 2, .. })
        ));
        assert!(matches!(
            decode_body(ApiKey::OffsetCommit, 10, &mut body),
            Err(ProtocolError::UnsupportedVersion { .. })
        ));
        assert_eq!(&body[..], b"garbage");
    }
}
