//! Error types: [`FrameError`] for reading frames off a connection, [`ProtocolError`]
//! for decoding requests and encoding responses.
//!
//! Every variant is a reason to answer with a Kafka error code or to close the
//! connection with a logged reason; none of them is a reason to crash.

use kafka_protocol::messages::ApiKey;

/// An error from kafka-protocol (which reports `anyhow::Error`), kept as the source.
pub type CodecError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why a request frame could not be read. After any of these the connection's byte
/// stream is out of step (or gone) and must be closed.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The size prefix is negative.
    #[error("request frame size {size} is negative")]
    NegativeSize {
        /// The size prefix as read.
        size: i32,
    },
    /// The size prefix is over `socket.request.max.bytes`. Nothing was allocated for it.
    #[error("request frame of {size} bytes is over socket.request.max.bytes ({max})")]
    TooLarge {
        /// The size prefix as read.
        size: usize,
        /// The configured bound.
        max: usize,
    },
    /// The peer closed the connection in the middle of a frame (or of its size prefix).
    #[error("connection closed {received} bytes into a {expected}-byte frame")]
    Truncated {
        /// Bytes the frame needed, size prefix included.
        expected: usize,
        /// Bytes that arrived before the end of the stream.
        received: usize,
    },
    /// The underlying read failed.
    #[error("reading a request frame: {0}")]
    Io(#[from] std::io::Error),
}

/// Why a request could not be decoded or a response encoded.
#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    /// The frame is shorter than the api key, api version and correlation id.
    #[error("request of {len} bytes is too short for a request header")]
    ShortHeader {
        /// Frame length.
        len: usize,
    },
    /// The api key is not one Kafka defines. The connection should be closed (Kafka
    /// does the same); the correlation id is there for the log line.
    #[error("unknown api key {api_key} (version {api_version}, correlation id {correlation_id})")]
    UnknownApiKey {
        /// The api key as read.
        api_key: i16,
        /// The api version as read.
        api_version: i16,
        /// The correlation id.
        correlation_id: i32,
    },
    /// The request header does not decode.
    #[error("cannot decode the {api_key:?} v{version} request header")]
    Header {
        /// Api key of the request.
        api_key: ApiKey,
        /// Api version of the request.
        version: i16,
        /// kafka-protocol's reason.
        #[source]
        source: CodecError,
    },
    /// skiff does not serve this api at this version (see [`crate::versions`]); the
    /// body was not decoded. Answer UNSUPPORTED_VERSION.
    #[error("{api_key:?} v{version} is not served")]
    UnsupportedVersion {
        /// Api key of the request.
        api_key: ApiKey,
        /// Api version of the request.
        version: i16,
    },
    /// The request body is malformed in a way skiff checks before handing it to
    /// kafka-protocol (see `guard.rs`): an array count the frame cannot hold, or a
    /// length running past the end of the frame.
    #[error("malformed {api_key:?} v{version} request body: {reason}")]
    Malformed {
        /// Api key of the request.
        api_key: ApiKey,
        /// Api version of the request.
        version: i16,
        /// What was wrong, with the byte position in the body.
        reason: String,
    },
    /// kafka-protocol could not decode the request body.
    #[error("cannot decode the {api_key:?} v{version} request body")]
    Body {
        /// Api key of the request.
        api_key: ApiKey,
        /// Api version of the request.
        version: i16,
        /// kafka-protocol's reason.
        #[source]
        source: CodecError,
    },
    /// kafka-protocol could not encode a response (typically a field set that the
    /// response version cannot carry).
    #[error("cannot encode the {api_key:?} v{version} response")]
    Encode {
        /// Api key of the response.
        api_key: ApiKey,
        /// Api version of the response.
        version: i16,
        /// kafka-protocol's reason.
        #[source]
        source: CodecError,
    },
    /// Placeholders were registered for a response kind that cannot carry them:
    /// encoding it would send zeros instead of records.
    #[error("{api_key:?} responses cannot carry record placeholders")]
    SplicesUnsupported {
        /// Api key of the response.
        api_key: ApiKey,
    },
    /// The response could not be spliced (see [`SpliceError`]).
    #[error("{api_key:?} v{version} response: {source}")]
    Splice {
        /// Api key of the response.
        api_key: ApiKey,
        /// Api version of the response.
        version: i16,
        /// What went wrong.
        #[source]
        source: SpliceError,
    },
    /// The encoded response does not fit an i32 size prefix.
    #[error("response of {size} bytes does not fit a Kafka frame")]
    ResponseTooLarge {
        /// Encoded size, size prefix excluded.
        size: usize,
    },
}

/// Why a response with placeholders could not be spliced. Each one is a bug in the
/// caller or a change in kafka-protocol's encoder; none can be answered with a
/// partially right frame, so the response is not sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpliceError {
    /// The encoder wrote bytes of the placeholder region that are not exactly one
    /// registered placeholder (a sub-slice, or one from another `Splices`): zeros
    /// would have gone on the wire.
    #[error("{len} bytes at placeholder position {position} are not a registered placeholder")]
    ForeignPlaceholder {
        /// Start of the slice in the placeholder region.
        position: usize,
        /// Length of the slice.
        len: usize,
    },
    /// A registered placeholder never reached `put_slice`: either it is not in the
    /// response, or the encoder copied it some other way (zeros on the wire).
    #[error("placeholder {index} was registered but never encoded")]
    Unused {
        /// Registration index of the placeholder.
        index: usize,
    },
    /// The encoder moved back over (or read) bytes that are already spliced or
    /// split into separate parts.
    #[error("encoder seek/range {start}..{end} reaches before the current segment")]
    Unsupported {
        /// Start of the range, in response bytes.
        start: usize,
        /// End of the range, in response bytes.
        end: usize,
    },
}
