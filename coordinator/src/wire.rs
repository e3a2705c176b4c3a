//! Kafka's primitive types as its coordinator records use them
//! (`__consumer_offsets`, `__transaction_state`): big-endian integers,
//! strings and arrays with i16/i32 lengths, or, in flexible versions,
//! uvarint lengths + 1 and tagged fields. Bounds-checked: a short or
//! malformed record is a [`RecordError`], never a panic.

use bytes::{BufMut, Bytes};
use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum RecordError {
    #[error("record ends early: {needed} bytes needed at byte {position}")]
    Truncated { position: usize, needed: usize },
    #[error("unknown {what} schema version {version}")]
    UnknownVersion { what: &'static str, version: i16 },
    #[error("bad length {length} at byte {position}")]
    BadLength { position: usize, length: i64 },
    #[error("string at byte {position} is not UTF-8")]
    NotUtf8 { position: usize },
    #[error("unknown transaction state {0}")]
    UnknownTxnState(i8),
}

pub(crate) fn put_string(out: &mut Vec<u8>, s: &str) {
    out.put_i16(s.len() as i16);
    out.put_slice(s.as_bytes());
}

pub(crate) fn put_nullable_string(out: &mut Vec<u8>, s: Option<&str>) {
    match s {
        Some(s) => put_string(out, s),
        None => out.put_i16(-1),
    }
}

/// A bounds-checked reader of Kafka's primitive types, plain or flexible.
pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
    pub(crate) position: usize,
    pub(crate) flexible: bool,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(bytes: &'a [u8], flexible: bool) -> Self {
        Reader {
            bytes,
            position: 0,
            flexible,
        }
    }

    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], RecordError> {
        let slice = self
            .bytes
            .get(self.position..self.position.saturating_add(n))
            .ok_or(RecordError::Truncated {
                position: self.position,
                needed: n,
            })?;
        self.position += n;
        Ok(slice)
    }

    pub(crate) fn fixed<const N: usize>(&mut self) -> Result<[u8; N], RecordError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    pub(crate) fn i16(&mut self) -> Result<i16, RecordError> {
        Ok(i16::from_be_bytes(self.fixed()?))
    }
    pub(crate) fn i32(&mut self) -> Result<i32, RecordError> {
        Ok(i32::from_be_bytes(self.fixed()?))
    }
    pub(crate) fn i64(&mut self) -> Result<i64, RecordError> {
        Ok(i64::from_be_bytes(self.fixed()?))
    }

    pub(crate) fn uvarint(&mut self) -> Result<u32, RecordError> {
        let mut value: u32 = 0;
        for shift in (0..5).map(|i| i * 7) {
            let [byte] = self.fixed::<1>()?;
            value |= u32::from(byte & 0x7f).wrapping_shl(shift);
            if byte < 0x80 {
                return Ok(value);
            }
        }
        Ok(value)
    }

    /// A length: i16 (strings) or i32 (bytes, arrays) when plain, uvarint+1
    /// when flexible. `None` is null.
    pub(crate) fn length(&mut self, wide: bool) -> Result<Option<usize>, RecordError> {
        let position = self.position;
        let length: i64 = if self.flexible {
            i64::from(self.uvarint()?) - 1
        } else if wide {
            i64::from(self.i32()?)
        } else {
            i64::from(self.i16()?)
        };
        match length {
            -1 => Ok(None),
            l if l >= 0 => Ok(Some(l as usize)),
            l => Err(RecordError::BadLength {
                position,
                length: l,
            }),
        }
    }

    pub(crate) fn nullable_string(&mut self) -> Result<Option<String>, RecordError> {
        let Some(length) = self.length(false)? else {
            return Ok(None);
        };
        let position = self.position;
        let raw = self.take(length)?;
        String::from_utf8(raw.to_vec())
            .map(Some)
            .map_err(|_| RecordError::NotUtf8 { position })
    }

    pub(crate) fn string(&mut self) -> Result<String, RecordError> {
        Ok(self.nullable_string()?.unwrap_or_default())
    }

    pub(crate) fn bytes(&mut self) -> Result<Bytes, RecordError> {
        let length = self.length(true)?.unwrap_or(0);
        Ok(Bytes::copy_from_slice(self.take(length)?))
    }

    pub(crate) fn array_count(&mut self, element_min_bytes: usize) -> Result<usize, RecordError> {
        let position = self.position;
        let count = self.length(true)?.unwrap_or(0);
        let left = self.bytes.len() - self.position;
        if count.saturating_mul(element_min_bytes) > left {
            return Err(RecordError::BadLength {
                position,
                length: count as i64,
            });
        }
        Ok(count)
    }

    pub(crate) fn tagged_fields(&mut self) -> Result<(), RecordError> {
        self.tagged_fields_with(|_, _| Ok(()))
    }

    /// A flexible structure's tagged fields, each (tag, its bytes) handed
    /// to `f`, which ignores the tags it does not know (KIP-482).
    pub(crate) fn tagged_fields_with(
        &mut self,
        mut f: impl FnMut(u32, &'a [u8]) -> Result<(), RecordError>,
    ) -> Result<(), RecordError> {
        if !self.flexible {
            return Ok(());
        }
        for _ in 0..self.uvarint()? {
            let tag = self.uvarint()?;
            let size = self.uvarint()? as usize;
            f(tag, self.take(size)?)?;
        }
        Ok(())
    }

    pub(crate) fn i8(&mut self) -> Result<i8, RecordError> {
        Ok(i8::from_be_bytes(self.fixed()?))
    }
}

pub(crate) fn put_uvarint(out: &mut Vec<u8>, mut value: u32) {
    while value >= 0x80 {
        out.put_u8((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    out.put_u8(value as u8);
}

/// A flexible version's string: uvarint length + 1, then the bytes.
pub(crate) fn put_compact_string(out: &mut Vec<u8>, s: &str) {
    put_uvarint(out, s.len() as u32 + 1);
    out.put_slice(s.as_bytes());
}
