//! Kafka request framing: a big-endian i32 size, then that many bytes.
//!
//! The size is checked against `socket.request.max.bytes` before anything is
//! allocated for the frame, so a peer announcing 2 GB costs four bytes of reading.
//! [`FrameReader`] is the connection-long reader: it reads in chunks and splits
//! pipelined frames off one buffer without copying them; [`read_frame`] is the
//! one-shot form.

use std::future::poll_fn;
use std::io;
use std::pin::Pin;

use bytes::{Buf, BytesMut};
use futures_io::AsyncRead;

use crate::error::FrameError;

/// Kafka's default `socket.request.max.bytes` (100 MiB).
pub const DEFAULT_MAX_FRAME_BYTES: usize = 100 * 1024 * 1024;

/// Bytes of the size prefix.
pub const SIZE_PREFIX_BYTES: usize = 4;

/// How much [`FrameReader`] asks the socket for at once while frames are small. A
/// frame whose rest is at least this large is read straight into its place.
pub const READ_CHUNK_BYTES: usize = 64 * 1024;

/// How much of a large frame's place is zeroed (and then read into) at a time.
pub const ZEROED_STEP_BYTES: usize = 64 * 1024;

/// Reads one frame: `Ok(None)` on a clean end of stream before the frame starts.
///
/// Allocates exactly the frame's size, after checking it. For a connection that
/// pipelines many small requests prefer [`FrameReader`], which does one read for
/// many frames.
pub async fn read_frame<R: AsyncRead + Unpin>(
    reader: &mut R,
    max_frame_bytes: usize,
) -> Result<Option<BytesMut>, FrameError> {
    let mut prefix = [0u8; SIZE_PREFIX_BYTES];
    let received = read_full(reader, &mut prefix).await?;
    if received == 0 {
        return Ok(None);
    }
    if received < SIZE_PREFIX_BYTES {
        return Err(FrameError::Truncated {
            expected: SIZE_PREFIX_BYTES,
            received,
        });
    }
    let size = frame_size(prefix, max_frame_bytes)?;
    let mut frame = BytesMut::zeroed(size);
    let received = read_full(reader, &mut frame).await?;
    if received < size {
        return Err(FrameError::Truncated {
            expected: SIZE_PREFIX_BYTES + size,
            received: SIZE_PREFIX_BYTES + received,
        });
    }
    Ok(Some(frame))
}

/// A connection's frame reader.
///
/// Memory bound: the buffer holds at most one whole frame
/// (`max_frame_bytes + 4`) plus one read chunk, and the chunk buffer is
/// [`READ_CHUNK_BYTES`]. Frames handed out share the buffer's allocation until
/// they are dropped; a frame whose rest was [`READ_CHUNK_BYTES`] or more when
/// its reading began has an allocation of its own, of its size.
#[derive(Debug)]
pub struct FrameReader {
    /// `buf[..filled]` is read and not yet handed out: whole frames first, then a
    /// partial one. Between reads `buf.len() == filled`.
    buf: BytesMut,
    filled: usize,
    /// While a large frame is incomplete: where it ends in `buf`, whose capacity
    /// ends there too; its bytes are read straight into place. 0 otherwise.
    large_end: usize,
    /// Where small reads land (initialised once, so no per-read zeroing); their
    /// bytes are then appended to `buf`.
    chunk: Box<[u8]>,
    max_frame_bytes: usize,
}

impl FrameReader {
    /// A reader that refuses frames over `max_frame_bytes` (socket.request.max.bytes).
    pub fn new(max_frame_bytes: usize) -> Self {
        Self {
            buf: BytesMut::with_capacity(READ_CHUNK_BYTES),
            filled: 0,
            large_end: 0,
            chunk: vec![0u8; READ_CHUNK_BYTES].into_boxed_slice(),
            max_frame_bytes,
        }
    }

    /// The configured bound.
    pub fn max_frame_bytes(&self) -> usize {
        self.max_frame_bytes
    }

    /// Bytes read from the connection and not yet returned as frames.
    pub fn buffered_bytes(&self) -> usize {
        self.filled
    }

    /// The next frame (without its size prefix), or `Ok(None)` when the stream ends
    /// cleanly between frames. A frame already in the buffer is returned without
    /// reading. After an error the reader is out of step with the stream: close it.
    pub async fn next<R: AsyncRead + Unpin>(
        &mut self,
        reader: &mut R,
    ) -> Result<Option<BytesMut>, FrameError> {
        loop {
            let expected = match self.buf[..self.filled].get(..SIZE_PREFIX_BYTES) {
                Some(prefix) => {
                    let prefix = [prefix[0], prefix[1], prefix[2], prefix[3]];
                    SIZE_PREFIX_BYTES + frame_size(prefix, self.max_frame_bytes)?
                }
                None => SIZE_PREFIX_BYTES,
            };
            if self.filled >= expected {
                self.buf.advance(SIZE_PREFIX_BYTES);
                self.filled -= expected;
                return Ok(Some(self.buf.split_to(expected - SIZE_PREFIX_BYTES)));
            }
            let received = self.fill(reader, expected - self.filled).await?;
            if received == 0 {
                if self.filled == 0 {
                    return Ok(None);
                }
                return Err(FrameError::Truncated {
                    expected,
                    received: self.filled,
                });
            }
        }
    }

    /// One read from the connection into the buffer. `missing` is what the current
    /// frame still needs: a large rest is read straight into the frame's place,
    /// never past its end, so the buffer stays bounded by one frame.
    ///
    /// That place is a new allocation of exactly the frame's size, never a larger
    /// buffer reused: a large frame's record batches may outlive it (the batch
    /// cache keeps them), and must not hold memory far beyond their own. It is
    /// zeroed one [`ZEROED_STEP_BYTES`] piece at a time, just before each read
    /// into it, so the read finds the piece still in cache (zeroing a whole
    /// frame first cost as much as the copy out of the socket).
    async fn fill<R: AsyncRead + Unpin>(
        &mut self,
        reader: &mut R,
        missing: usize,
    ) -> Result<usize, FrameError> {
        // A read cancelled at its await (a stopping connection) leaves zeroed
        // bytes past `filled`.
        self.buf.truncate(self.filled);
        if self.large_end == 0 && missing >= READ_CHUNK_BYTES {
            let mut place = BytesMut::with_capacity(self.filled + missing);
            place.extend_from_slice(&self.buf[..self.filled]);
            self.buf = place;
            self.large_end = self.filled + missing;
        }
        let received = if self.large_end > 0 {
            let step = (self.large_end - self.filled).min(ZEROED_STEP_BYTES);
            self.buf.resize(self.filled + step, 0);
            let received = read_some(reader, &mut self.buf[self.filled..]).await;
            self.buf
                .truncate(self.filled + received.as_ref().map_or(0, |n| *n));
            let received = received?;
            if self.filled + received == self.large_end {
                self.large_end = 0;
            }
            received
        } else {
            let received = read_some(reader, &mut self.chunk).await?;
            self.buf.extend_from_slice(&self.chunk[..received]);
            received
        };
        self.filled += received;
        Ok(received)
    }
}

/// Checks a size prefix against the bound: before any allocation for the frame.
fn frame_size(
    prefix: [u8; SIZE_PREFIX_BYTES],
    max_frame_bytes: usize,
) -> Result<usize, FrameError> {
    let size = i32::from_be_bytes(prefix);
    let Ok(size) = usize::try_from(size) else {
        return Err(FrameError::NegativeSize { size });
    };
    if size > max_frame_bytes {
        return Err(FrameError::TooLarge {
            size,
            max: max_frame_bytes,
        });
    }
    Ok(size)
}

/// Reads until `dst` is full or the stream ends; returns the bytes read.
async fn read_full<R: AsyncRead + Unpin>(reader: &mut R, dst: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < dst.len() {
        let received = read_some(reader, &mut dst[filled..]).await?;
        if received == 0 {
            break;
        }
        filled += received;
    }
    Ok(filled)
}

/// One read, retried on `Interrupted`; 0 means end of stream.
async fn read_some<R: AsyncRead + Unpin>(reader: &mut R, dst: &mut [u8]) -> io::Result<usize> {
    loop {
        match poll_fn(|cx| Pin::new(&mut *reader).poll_read(cx, dst)).await {
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            result => return result,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_lite::future::block_on;
    use std::future::Future;
    use std::task::{Context, Poll};

    /// Hands out its bytes in the given read sizes, then end of stream.
    struct Chunked {
        data: Vec<u8>,
        position: usize,
        sizes: Vec<usize>,
        reads: usize,
    }

    impl AsyncRead for Chunked {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
            buf: &mut [u8],
        ) -> Poll<io::Result<usize>> {
            let size = self.sizes.get(self.reads).copied().unwrap_or(usize::MAX);
            self.reads += 1;
            let n = size.min(buf.len()).min(self.data.len() - self.position);
            buf[..n].copy_from_slice(&self.data[self.position..self.position + n]);
            self.position += n;
            Poll::Ready(Ok(n))
        }
    }

    fn framed(bodies: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        for body in bodies {
            out.extend_from_slice(&(body.len() as i32).to_be_bytes());
            out.extend_from_slice(body);
        }
        out
    }

    #[test]
    fn pipelined_frames_in_odd_reads() {
        let big = vec![7u8; 3 * READ_CHUNK_BYTES + 5];
        let bodies: Vec<&[u8]> = vec![b"one", b"", b"three", &big, b"x"];
        for sizes in [vec![1; 64], vec![3, 2, 7, 1000, 1], vec![]] {
            let mut reader = Chunked {
                data: framed(&bodies),
                position: 0,
                sizes,
                reads: 0,
            };
            let mut frames = FrameReader::new(DEFAULT_MAX_FRAME_BYTES);
            for body in &bodies {
                let frame = block_on(frames.next(&mut reader));
                assert_eq!(frame.ok().flatten().as_deref(), Some(*body));
            }
            assert!(matches!(block_on(frames.next(&mut reader)), Ok(None)));
        }
    }

    /// Reads like `Chunked`, but the first read that finds the stream at
    /// `stall_at` returns Pending once.
    struct Stalling {
        inner: Chunked,
        stall_at: usize,
        stalled: bool,
    }

    impl AsyncRead for Stalling {
        fn poll_read(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut [u8],
        ) -> Poll<io::Result<usize>> {
            if !self.stalled && self.inner.position >= self.stall_at {
                self.stalled = true;
                return Poll::Pending;
            }
            Pin::new(&mut self.inner).poll_read(cx, buf)
        }
    }

    #[test]
    fn a_read_dropped_in_the_middle_of_a_large_frame_loses_nothing() {
        let big: Vec<u8> = (0..3 * READ_CHUNK_BYTES + 5).map(|i| i as u8).collect();
        let bodies: Vec<&[u8]> = vec![&big, b"after"];
        let mut reader = Stalling {
            inner: Chunked {
                data: framed(&bodies),
                position: 0,
                sizes: vec![1000, 70_000, 5],
                reads: 0,
            },
            stall_at: 71_000,
            stalled: false,
        };
        let mut frames = FrameReader::new(DEFAULT_MAX_FRAME_BYTES);
        {
            // Polled until the stall, then dropped (as a stopping connection does).
            let mut next = std::pin::pin!(frames.next(&mut reader));
            let waker = std::task::Waker::noop();
            assert!(next
                .as_mut()
                .poll(&mut Context::from_waker(waker))
                .is_pending());
        }
        let read = reader.inner.position;
        assert!((71_000..big.len()).contains(&read), "stalled mid-frame");
        assert_eq!(frames.buffered_bytes(), read);
        for body in &bodies {
            let frame = block_on(frames.next(&mut reader));
            assert_eq!(frame.ok().flatten().as_deref(), Some(*body));
        }
    }

    #[test]
    fn one_shot_matches_reader() {
        let data = framed(&[b"abc", b"defgh"]);
        let mut reader = Chunked {
            data,
            position: 0,
            sizes: vec![2, 1, 1, 1],
            reads: 0,
        };
        let first = block_on(read_frame(&mut reader, 16));
        assert_eq!(first.ok().flatten().as_deref(), Some(&b"abc"[..]));
        let second = block_on(read_frame(&mut reader, 16));
        assert_eq!(second.ok().flatten().as_deref(), Some(&b"defgh"[..]));
        assert!(matches!(block_on(read_frame(&mut reader, 16)), Ok(None)));
    }
}
