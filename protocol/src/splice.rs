//! Zero-copy record bytes in encoded responses.
//!
//! kafka-protocol encodes a FetchResponse partition's `records: Option<Bytes>` with
//! `put_slice`, i.e. a copy into the response buffer. To send record batches
//! straight from the batch cache instead, the fetch handler registers each
//! partition's batches with [`Splices::placeholder`] and puts the returned
//! placeholder in `records`. A placeholder is a `Bytes` of the right length that
//! points into `ZEROS`, a static all-zero region: placeholder `i` starts at byte
//! `i` of it, so its start pointer (with its length) names it. The response is then
//! encoded into a `SpliceBuf`, whose `put_slice` recognises a placeholder, closes
//! the current segment and appends the registered batches as parts of their own.
//! The encoder writes the length prefix before the slice, as usual; only the
//! payload is swapped. The result is an iovec list for `writev`.
//!
//! Limits: placeholder `i` can be at most `ZEROS_BYTES - i` bytes long (128 MiB
//! minus the count registered before it). A larger one falls back to one
//! concatenated copy of its batches, with a warning: correct, not zero-copy.
//!
//! Contract: a placeholder is only meaningful to the `Splices` that issued it, and
//! each registered placeholder must be encoded (at least once). A stray slice of
//! the zero region or a placeholder never seen by `put_slice` fails the encode
//! ([`SpliceError`]) rather than sending zeros.
//!
//! This is the crate's one module with `unsafe`: `SpliceBuf` implements the
//! unsafe trait `bytes::BufMut` by delegating to its `BytesMut` head.

use std::ops::Range;

use bytes::buf::UninitSlice;
use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::protocol::buf::ByteBufMut;

use crate::error::SpliceError;

/// Size of the zero region placeholders are carved from.
pub const ZEROS_BYTES: usize = 128 * 1024 * 1024;

/// Never written and never read by skiff: only its addresses are used. Being
/// zero-initialised, it lives in .bss and costs address space, not memory.
static ZEROS: [u8; ZEROS_BYTES] = [0; ZEROS_BYTES];

/// The registered batches of one response, by placeholder.
#[derive(Debug, Default)]
pub struct Splices {
    /// Entry `i` belongs to the placeholder starting at `ZEROS[i]`.
    entries: Vec<Entry>,
}

#[derive(Debug)]
struct Entry {
    len: usize,
    batches: Vec<Bytes>,
}

impl Splices {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers `batches` (sent back to back) and returns the `Bytes` to put in
    /// the response in their place.
    ///
    /// Empty batches give an empty `Bytes` (nothing to splice). When the
    /// placeholder would not fit the zero region, the batches are concatenated
    /// into one buffer instead: a copy, logged as a warning.
    pub fn placeholder(&mut self, batches: Vec<Bytes>) -> Bytes {
        let len: usize = batches.iter().map(Bytes::len).sum();
        if len == 0 {
            return Bytes::new();
        }
        let start = self.entries.len();
        let Some(region) = ZEROS.get(start..start.saturating_add(len)) else {
            tracing::warn!(
                len,
                placeholders = start,
                "record bytes over the splice region: copying them into the response"
            );
            let mut copy = BytesMut::with_capacity(len);
            for batch in &batches {
                copy.extend_from_slice(batch);
            }
            return copy.freeze();
        };
        self.entries.push(Entry { len, batches });
        Bytes::from_static(region)
    }

    /// Number of placeholders registered.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Bytes of record data registered (what the placeholders stand for).
    pub fn data_bytes(&self) -> usize {
        self.entries.iter().map(|e| e.len).sum()
    }

    /// Whether no placeholder is registered.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Which entry `src` is: `Ok(None)` when it does not touch the zero region.
    fn lookup(&self, src: &[u8]) -> Result<Option<usize>, SpliceError> {
        let base = ZEROS.as_ptr() as usize;
        let address = src.as_ptr() as usize;
        if src.is_empty() || address < base || address >= base + ZEROS_BYTES {
            return Ok(None);
        }
        let position = address - base;
        match self.entries.get(position) {
            Some(entry) if entry.len == src.len() => Ok(Some(position)),
            _ => Err(SpliceError::ForeignPlaceholder {
                position,
                len: src.len(),
            }),
        }
    }
}

/// One piece of the encoded response.
#[derive(Debug)]
enum Part {
    /// Encoder output, kept mutable so `range` can still reach it.
    Encoded(BytesMut),
    /// Registered record bytes, never copied.
    Spliced(Bytes),
}

/// The encode target: kafka-protocol's `ByteBufMut` over a list of segments.
///
/// Ordinary output goes into `head`; a placeholder closes `head` (split off, same
/// allocation) and appends its batches. `offset`, `seek` and `range` see one
/// contiguous response; they work within any single encoded segment (which is all
/// kafka-protocol needs: its message encoders use none of them, its record-batch
/// encoder only reaches back into the batch it is writing). Anything else is
/// recorded as an error returned by [`SpliceBuf::finish`].
#[derive(Debug)]
pub(crate) struct SpliceBuf<'a> {
    splices: &'a Splices,
    /// Closed segments with the response offset each starts at.
    parts: Vec<(usize, Part)>,
    head: BytesMut,
    /// Response offset of `head[0]`.
    head_start: usize,
    used: Vec<bool>,
    error: Option<SpliceError>,
    /// Handed out by `range` after an error, so that it can return something.
    scratch: Vec<u8>,
}

impl<'a> SpliceBuf<'a> {
    pub(crate) fn new(splices: &'a Splices, capacity: usize) -> Self {
        Self {
            splices,
            parts: Vec::new(),
            head: BytesMut::with_capacity(capacity),
            head_start: 0,
            used: vec![false; splices.len()],
            error: None,
            scratch: Vec::new(),
        }
    }

    /// The parts, in order; fails if the encoding went wrong in a way the
    /// encoder could not be told about.
    pub(crate) fn finish(mut self) -> Result<Vec<Bytes>, SpliceError> {
        if let Some(error) = self.error {
            return Err(error);
        }
        if let Some(index) = self.used.iter().position(|used| !used) {
            return Err(SpliceError::Unused { index });
        }
        self.close_head();
        Ok(self
            .parts
            .into_iter()
            .map(|(_, part)| match part {
                Part::Encoded(bytes) => bytes.freeze(),
                Part::Spliced(bytes) => bytes,
            })
            .collect())
    }

    fn fail(&mut self, error: SpliceError) {
        self.error.get_or_insert(error);
    }

    fn close_head(&mut self) {
        if !self.head.is_empty() {
            let start = self.head_start;
            self.head_start += self.head.len();
            self.parts.push((start, Part::Encoded(self.head.split())));
        }
    }

    fn splice(&mut self, index: usize) {
        self.close_head();
        self.used[index] = true;
        for batch in &self.splices.entries[index].batches {
            if !batch.is_empty() {
                self.parts
                    .push((self.head_start, Part::Spliced(batch.clone())));
                self.head_start += batch.len();
            }
        }
    }

    fn unsupported(&mut self, range: &Range<usize>) -> &mut [u8] {
        self.fail(SpliceError::Unsupported {
            start: range.start,
            end: range.end,
        });
        self.scratch.clear();
        self.scratch.resize(range.len(), 0);
        &mut self.scratch
    }
}

// SAFETY: every method delegates to `head`, a `BytesMut`, which upholds the
// `BufMut` contract: `chunk_mut` is `head`'s spare capacity, `advance_mut` marks
// bytes of that same chunk initialised, and `remaining_mut` is `head`'s.
// `put_slice` and `put` only add safe paths (a splice or `extend_from_slice`).
unsafe impl BufMut for SpliceBuf<'_> {
    fn remaining_mut(&self) -> usize {
        self.head.remaining_mut()
    }

    unsafe fn advance_mut(&mut self, cnt: usize) {
        // SAFETY: the caller guarantees that `cnt` bytes of the chunk returned by
        // `chunk_mut`, which is `head`'s, are initialised: exactly `head`'s
        // precondition.
        unsafe { self.head.advance_mut(cnt) }
    }

    fn chunk_mut(&mut self) -> &mut UninitSlice {
        self.head.chunk_mut()
    }

    fn put_slice(&mut self, src: &[u8]) {
        match self.splices.lookup(src) {
            Ok(None) => self.head.extend_from_slice(src),
            Ok(Some(index)) => self.splice(index),
            Err(error) => {
                // Keep offsets right so later fields still encode; the frame is
                // refused by `finish`.
                self.head.extend_from_slice(src);
                self.fail(error);
            }
        }
    }

    fn put<T: Buf>(&mut self, mut src: T)
    where
        Self: Sized,
    {
        // The default copies through `chunk_mut` and would miss a placeholder.
        while src.has_remaining() {
            let chunk = src.chunk();
            let len = chunk.len();
            self.put_slice(chunk);
            src.advance(len);
        }
    }
}

impl ByteBufMut for SpliceBuf<'_> {
    fn offset(&self) -> usize {
        self.head_start + self.head.len()
    }

    fn seek(&mut self, offset: usize) {
        match offset.checked_sub(self.head_start) {
            // What `BytesMut` does: truncate, or extend with zeros.
            Some(len) => self.head.resize(len, 0),
            None => self.fail(SpliceError::Unsupported {
                start: offset,
                end: self.offset(),
            }),
        }
    }

    fn range(&mut self, range: Range<usize>) -> &mut [u8] {
        if range.start > range.end || range.end > self.offset() {
            return self.unsupported(&range);
        }
        if range.start >= self.head_start {
            let start = range.start - self.head_start;
            return &mut self.head[start..start + range.len()];
        }
        let found = self
            .parts
            .iter()
            .rposition(|(start, _)| *start <= range.start);
        let Some(index) = found else {
            return self.unsupported(&range);
        };
        let fits = match &self.parts[index] {
            (start, Part::Encoded(bytes)) => range.end - start <= bytes.len(),
            (_, Part::Spliced(_)) => false,
        };
        if !fits {
            return self.unsupported(&range);
        }
        match &mut self.parts[index] {
            (start, Part::Encoded(bytes)) => {
                let first = range.start - *start;
                &mut bytes[first..first + range.len()]
            }
            // Refused above.
            (_, Part::Spliced(_)) => &mut [],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts_of(buf: SpliceBuf<'_>) -> Vec<Bytes> {
        buf.finish().unwrap_or_else(|error| panic!("{error}"))
    }

    #[test]
    fn placeholders_are_distinct_and_zero() {
        let mut splices = Splices::new();
        let a = splices.placeholder(vec![Bytes::from_static(b"abc")]);
        let b = splices.placeholder(vec![Bytes::from_static(b"de"), Bytes::from_static(b"f")]);
        assert_ne!(a.as_ptr(), b.as_ptr());
        assert_eq!((a.len(), b.len()), (3, 3));
        assert!(a.iter().chain(b.iter()).all(|byte| *byte == 0));
        assert!(splices.placeholder(vec![Bytes::new()]).is_empty());
        assert_eq!(splices.len(), 2);
    }

    #[test]
    fn oversized_placeholder_is_a_copy() {
        let mut splices = Splices::new();
        let _small = splices.placeholder(vec![Bytes::from_static(b"x")]);
        // Placeholder 1 may be ZEROS_BYTES - 1 long: one byte more is a copy.
        let big = Bytes::from(vec![5u8; ZEROS_BYTES]);
        let copied = splices.placeholder(vec![big.clone()]);
        assert_eq!(copied, big);
        assert_ne!(copied.as_ptr(), big.as_ptr());
        assert_eq!(splices.len(), 1);
        let fits = splices.placeholder(vec![big.slice(1..)]);
        assert_eq!(fits.as_ptr(), ZEROS[1..].as_ptr());
        assert_eq!(splices.len(), 2);
    }

    #[test]
    fn put_slice_splices_and_keeps_offsets() {
        let mut splices = Splices::new();
        let batch = Bytes::from(vec![9u8; 10]);
        let placeholder = splices.placeholder(vec![batch.clone()]);
        let mut buf = SpliceBuf::new(&splices, 16);
        buf.put_i32(0);
        buf.put_slice(&placeholder);
        assert_eq!(buf.offset(), 14);
        buf.put_u8(1);
        buf.range(0..4).copy_from_slice(&10i32.to_be_bytes());
        let gap = buf.put_gap(2);
        buf.gap_buf(gap).copy_from_slice(&[7, 7]);
        let parts = parts_of(buf);
        assert_eq!(parts.len(), 3);
        assert_eq!(parts[0][..], 10i32.to_be_bytes());
        assert_eq!(parts[1].as_ptr(), batch.as_ptr());
        assert_eq!(parts[2][..], [1, 7, 7]);
    }

    #[test]
    fn reaching_into_a_splice_is_an_error() {
        let mut splices = Splices::new();
        let placeholder = splices.placeholder(vec![Bytes::from_static(b"abcd")]);
        let mut buf = SpliceBuf::new(&splices, 16);
        buf.put_u8(1);
        buf.put_slice(&placeholder);
        assert_eq!(buf.range(2..4).len(), 2);
        assert!(matches!(buf.finish(), Err(SpliceError::Unsupported { .. })));
    }

    #[test]
    fn stray_and_unused_placeholders_are_errors() {
        let mut splices = Splices::new();
        let placeholder = splices.placeholder(vec![Bytes::from_static(b"abcd")]);
        let mut buf = SpliceBuf::new(&splices, 16);
        buf.put_slice(&placeholder[1..]);
        assert!(matches!(
            buf.finish(),
            Err(SpliceError::ForeignPlaceholder {
                position: 1,
                len: 3
            })
        ));
        let buf = SpliceBuf::new(&splices, 16);
        assert_eq!(buf.finish().err(), Some(SpliceError::Unused { index: 0 }));
    }
}
