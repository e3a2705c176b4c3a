//! skiff-protocol: Kafka wire framing and request/response glue over the
//! kafka-protocol crate.
//!
//! What it is: reading request frames off a connection ([`frame`]), decoding a
//! request header and then, for the versions skiff serves ([`versions`]), its body
//! ([`request`]); encoding a response into a frame ([`response`]) whose record
//! bytes are spliced in by reference, never copied ([`splice`]). Message types are
//! kafka-protocol's, re-exported as [`messages`].
//!
//! What it is not: it does not decode, validate or re-encode record batches (they
//! stay slices of the request frame: writable `BytesMut` pieces in a Produce
//! decoded by [`produce`], `Bytes` elsewhere; they go out as the `Bytes` the
//! fetch path registered); it has no I/O policy beyond reading frames (timeouts,
//! connection handling and writing are the node's); it does not handle requests.
//!
//! Bounds: a request frame over `max_frame_bytes` (socket.request.max.bytes,
//! [`frame::DEFAULT_MAX_FRAME_BYTES`] = 100 MiB) is refused from its size prefix,
//! before anything is allocated for it; a body's array counts are checked against
//! its length before kafka-protocol pre-allocates them (`guard.rs`); a placeholder
//! holds at most [`splice::ZEROS_BYTES`] (128 MiB) minus the number registered
//! before it, past which its batches are copied.

pub mod error;
pub mod frame;
mod guard;
pub mod produce;
pub mod request;
pub mod response;
// The one module with `unsafe`: it implements `bytes::BufMut`, an unsafe trait.
#[allow(unsafe_code)]
pub mod splice;
pub mod versions;

// Populated requests of every served kind, shared with the integration tests.
#[cfg(test)]
#[path = "../tests/common/samples.rs"]
mod samples;

pub use error::{FrameError, ProtocolError, SpliceError};
pub use frame::{read_frame, FrameReader, DEFAULT_MAX_FRAME_BYTES};
pub use kafka_protocol::messages;
pub use kafka_protocol::messages::{ApiKey, RequestKind, ResponseKind};
pub use kafka_protocol::protocol::StrBytes;
pub use kafka_protocol::ResponseError;
pub use request::{decode_body, decode_header, Request};
pub use response::{encode_response, response_header_version, ResponseFrame};
pub use splice::Splices;
pub use versions::{accepts, api_versions_response};
