//! Produce requests (v3-v12), decoded by skiff rather than kafka-protocol so that
//! each partition's record batch is a `BytesMut`: a disjoint, writable piece of
//! the request frame. The engine stamps a batch's base offset and leader epoch
//! in place, so a batch that stays in its frame reaches the segment buffer and
//! the batch cache without any copy in user space. (kafka-protocol hands out
//! `Bytes` slices, which share the frame and can never be written.)
//!
//! The layout is Kafka's ProduceRequest.json: a nullable transactional id, acks,
//! timeout, then topics of (name, partitions of (index, nullable records));
//! flexible encodings (compact lengths, tagged fields, which are skipped as
//! KIP-482 says) from v9. v13 addresses topics by id and is not served.
//! Every length and count is checked against the bytes left before anything is
//! split off or allocated, so a malformed body is an error, never a panic.

use bytes::{Buf, BytesMut};
use kafka_protocol::messages::ApiKey;

use crate::error::ProtocolError;

/// The versions [`decode`] reads (the served range, `versions.rs`).
pub const VERSIONS: std::ops::RangeInclusive<i16> = 3..=12;

/// The first flexible version.
const FLEXIBLE_SINCE: i16 = 9;

/// A decoded Produce request body.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ProduceRequest {
    /// The transactional id, for a transactional producer.
    pub transactional_id: Option<String>,
    /// 0, 1 or -1 (all); anything else is refused per partition.
    pub acks: i16,
    /// How long the request may wait for acks=all.
    pub timeout_ms: i32,
    /// The topics, in request order.
    pub topics: Vec<TopicData>,
    /// Bytes of the body as it arrived (records included): how much memory a
    /// batch kept in its frame may hold on to.
    pub body_bytes: usize,
}

/// One topic's partitions.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct TopicData {
    /// The topic name.
    pub name: String,
    /// The partitions, in request order.
    pub partitions: Vec<PartitionData>,
}

/// One partition's records.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct PartitionData {
    /// The partition index.
    pub index: i32,
    /// The record batch bytes (null on the wire: `None`), a piece of the frame.
    pub records: Option<BytesMut>,
}

impl ProduceRequest {
    /// Bytes of record batches the request carries (what `producer_byte_rate`
    /// counts).
    pub fn records_bytes(&self) -> usize {
        self.topics
            .iter()
            .flat_map(|t| &t.partitions)
            .map(|p| p.records.as_ref().map_or(0, |r| r.len()))
            .sum()
    }
}

/// Decodes a Produce body (what `decode_header` left of the frame), splitting
/// each partition's records off `body`. On success `body` is empty.
pub fn decode(body: BytesMut, version: i16) -> Result<ProduceRequest, ProtocolError> {
    let malformed = |reason: String| ProtocolError::Malformed {
        api_key: ApiKey::Produce,
        version,
        reason,
    };
    if !VERSIONS.contains(&version) {
        return Err(ProtocolError::UnsupportedVersion {
            api_key: ApiKey::Produce,
            version,
        });
    }
    let body_bytes = body.len();
    let mut r = Reader {
        buf: body,
        flexible: version >= FLEXIBLE_SINCE,
        total: body_bytes,
    };
    let request = r.request().map_err(malformed)?;
    if r.buf.has_remaining() {
        return Err(malformed(format!(
            "{} bytes after the request's end",
            r.buf.remaining()
        )));
    }
    Ok(ProduceRequest {
        body_bytes,
        ..request
    })
}

/// A cursor over the body; every read checks the bytes left first.
struct Reader {
    buf: BytesMut,
    flexible: bool,
    total: usize,
}

type Step<T> = Result<T, String>;

impl Reader {
    fn request(&mut self) -> Step<ProduceRequest> {
        let transactional_id = self.nullable_string("transactional id")?;
        let acks = self.i16("acks")?;
        let timeout_ms = self.i32("timeout")?;
        let mut topics = Vec::new();
        for _ in 0..self.array_len("topics", 1)? {
            let name = self
                .nullable_string("topic name")?
                .ok_or_else(|| self.at("a null topic name"))?;
            let mut partitions = Vec::new();
            for _ in 0..self.array_len("partitions", 4)? {
                let index = self.i32("partition index")?;
                let records = self.nullable_bytes("records")?;
                self.tagged_fields()?;
                partitions.push(PartitionData { index, records });
            }
            self.tagged_fields()?;
            topics.push(TopicData { name, partitions });
        }
        self.tagged_fields()?;
        Ok(ProduceRequest {
            transactional_id,
            acks,
            timeout_ms,
            topics,
            body_bytes: 0,
        })
    }

    /// "what at byte N": positions count from the start of the body.
    fn at(&self, what: &str) -> String {
        format!("{what} at byte {}", self.total - self.buf.remaining())
    }

    fn need(&self, n: usize, what: &str) -> Step<()> {
        if self.buf.remaining() < n {
            return Err(self.at(&format!(
                "{what} needs {n} bytes, {} left",
                self.buf.remaining()
            )));
        }
        Ok(())
    }

    fn i16(&mut self, what: &str) -> Step<i16> {
        self.need(2, what)?;
        Ok(self.buf.get_i16())
    }

    fn i32(&mut self, what: &str) -> Step<i32> {
        self.need(4, what)?;
        Ok(self.buf.get_i32())
    }

    fn uvarint(&mut self, what: &str) -> Step<u32> {
        let mut value = 0u32;
        for shift in (0..35).step_by(7) {
            self.need(1, what)?;
            let byte = self.buf.get_u8();
            if shift == 28 && byte > 0x0f {
                return Err(self.at(&format!("{what}: a varint over 32 bits")));
            }
            value |= u32::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(self.at(&format!("{what}: a varint over 5 bytes")))
    }

    /// A length that may be null: `None` for null.
    fn nullable_len(&mut self, what: &str) -> Step<Option<usize>> {
        if self.flexible {
            // Compact: length + 1, 0 for null.
            return Ok(match self.uvarint(what)? {
                0 => None,
                n => Some(n as usize - 1),
            });
        }
        Ok(match self.i32(what)? {
            -1 => None,
            n if n < 0 => return Err(self.at(&format!("{what}: negative length {n}"))),
            n => Some(n as usize),
        })
    }

    fn nullable_string(&mut self, what: &str) -> Step<Option<String>> {
        let len = if self.flexible {
            self.nullable_len(what)?
        } else {
            match self.i16(what)? {
                -1 => None,
                n if n < 0 => return Err(self.at(&format!("{what}: negative length {n}"))),
                n => Some(n as usize),
            }
        };
        let Some(len) = len else { return Ok(None) };
        self.need(len, what)?;
        let raw = self.buf.split_to(len);
        String::from_utf8(raw.to_vec())
            .map(Some)
            .map_err(|_| self.at(&format!("{what} is not UTF-8")))
    }

    fn nullable_bytes(&mut self, what: &str) -> Step<Option<BytesMut>> {
        let Some(len) = self.nullable_len(what)? else {
            return Ok(None);
        };
        self.need(len, what)?;
        Ok(Some(self.buf.split_to(len)))
    }

    /// An array's element count, checked against what the bytes left can hold
    /// (`min_element` bytes each). Arrays here are not nullable.
    fn array_len(&mut self, what: &str, min_element: usize) -> Step<usize> {
        let Some(len) = self.nullable_len(what)? else {
            return Err(self.at(&format!("{what}: a null array")));
        };
        if len.saturating_mul(min_element) > self.buf.remaining() {
            return Err(self.at(&format!(
                "{what}: {len} entries cannot fit in {} bytes",
                self.buf.remaining()
            )));
        }
        Ok(len)
    }

    /// Skips a flexible version's tagged fields (none is defined for Produce).
    fn tagged_fields(&mut self) -> Step<()> {
        if !self.flexible {
            return Ok(());
        }
        for _ in 0..self.uvarint("tagged field count")? {
            self.uvarint("tag")?;
            let size = self.uvarint("tagged field size")? as usize;
            self.need(size, "tagged field")?;
            self.buf.advance(size);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_outside_the_served_range_are_refused() {
        for version in [0, 2, 13] {
            assert!(matches!(
                decode(BytesMut::new(), version),
                Err(ProtocolError::UnsupportedVersion { .. })
            ));
        }
    }

    #[test]
    fn a_count_the_body_cannot_hold_is_refused_before_anything_is_read() {
        // v3: null transactional id, acks, timeout, then 2^31-1 topics.
        let mut body = BytesMut::new();
        body.extend_from_slice(&(-1i16).to_be_bytes());
        body.extend_from_slice(&1i16.to_be_bytes());
        body.extend_from_slice(&1000i32.to_be_bytes());
        body.extend_from_slice(&i32::MAX.to_be_bytes());
        let error = decode(body, 3).map(|_| ()).err().map(|e| e.to_string());
        assert!(
            error
                .as_deref()
                .is_some_and(|e| e.contains("entries cannot fit")),
            "{error:?}"
        );
    }

    #[test]
    fn an_overlong_varint_is_refused() {
        // v9: the transactional id's compact length runs six bytes.
        let body = BytesMut::from(&[0xff, 0xff, 0xff, 0xff, 0xff, 0x01][..]);
        let error = decode(body, 9).map(|_| ()).err().map(|e| e.to_string());
        assert!(
            error.as_deref().is_some_and(|e| e.contains("varint")),
            "{error:?}"
        );
    }
}
