//! Framing limits: oversized, negative and truncated frames.

mod common;

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use common::MemReader;
use futures_io::AsyncRead;
use futures_lite::future::block_on;
use skiff_protocol::{read_frame, FrameError, FrameReader, DEFAULT_MAX_FRAME_BYTES};

/// Yields a size prefix, then fails the test if read again: a reader that waits
/// for (or allocates) the announced frame would read on.
struct PrefixOnly {
    prefix: [u8; 4],
    sent: bool,
}

impl AsyncRead for PrefixOnly {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        assert!(!self.sent, "read past the size prefix of a refused frame");
        self.sent = true;
        buf[..4].copy_from_slice(&self.prefix);
        Poll::Ready(Ok(4))
    }
}

#[test]
fn two_gigabyte_frame_is_refused_from_its_prefix() {
    let size = 2_000_000_000i32;
    let mut reader = PrefixOnly {
        prefix: size.to_be_bytes(),
        sent: false,
    };
    let mut frames = FrameReader::new(DEFAULT_MAX_FRAME_BYTES);
    match block_on(frames.next(&mut reader)) {
        Err(FrameError::TooLarge {
            size: 2_000_000_000,
            max: DEFAULT_MAX_FRAME_BYTES,
        }) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(frames.buffered_bytes(), 4);

    let mut reader = PrefixOnly {
        prefix: size.to_be_bytes(),
        sent: false,
    };
    assert!(matches!(
        block_on(read_frame(&mut reader, DEFAULT_MAX_FRAME_BYTES)),
        Err(FrameError::TooLarge { .. })
    ));
}

#[test]
fn bound_is_inclusive() {
    let mut data = 16i32.to_be_bytes().to_vec();
    data.extend_from_slice(&[1; 16]);
    let mut frames = FrameReader::new(16);
    let frame = block_on(frames.next(&mut MemReader::new(data.clone(), usize::MAX)));
    assert_eq!(frame.ok().flatten().map(|f| f.len()), Some(16));
    let mut frames = FrameReader::new(15);
    assert!(matches!(
        block_on(frames.next(&mut MemReader::new(data, usize::MAX))),
        Err(FrameError::TooLarge { size: 16, max: 15 })
    ));
}

#[test]
fn negative_size_is_refused() {
    for size in [-1i32, i32::MIN] {
        let mut frames = FrameReader::new(DEFAULT_MAX_FRAME_BYTES);
        let mut reader = PrefixOnly {
            prefix: size.to_be_bytes(),
            sent: false,
        };
        assert!(matches!(
            block_on(frames.next(&mut reader)),
            Err(FrameError::NegativeSize { size: s }) if s == size
        ));
        let mut reader = PrefixOnly {
            prefix: size.to_be_bytes(),
            sent: false,
        };
        assert!(matches!(
            block_on(read_frame(&mut reader, DEFAULT_MAX_FRAME_BYTES)),
            Err(FrameError::NegativeSize { .. })
        ));
    }
}

#[test]
fn truncated_frames_are_errors_and_clean_eof_is_none() {
    let mut whole = 10i32.to_be_bytes().to_vec();
    whole.extend_from_slice(&[7; 10]);
    for cut in 1..whole.len() {
        let mut frames = FrameReader::new(DEFAULT_MAX_FRAME_BYTES);
        let mut reader = MemReader::new(whole[..cut].to_vec(), 3);
        match block_on(frames.next(&mut reader)) {
            Err(FrameError::Truncated { expected, received }) => {
                assert_eq!(received, cut);
                assert_eq!(expected, if cut < 4 { 4 } else { 14 });
            }
            other => panic!("cut {cut}: {other:?}"),
        }
        let mut reader = MemReader::new(whole[..cut].to_vec(), 3);
        assert!(matches!(
            block_on(read_frame(&mut reader, DEFAULT_MAX_FRAME_BYTES)),
            Err(FrameError::Truncated { .. })
        ));
    }
    let mut frames = FrameReader::new(DEFAULT_MAX_FRAME_BYTES);
    assert!(matches!(
        block_on(frames.next(&mut MemReader::new(Vec::new(), 1))),
        Ok(None)
    ));
    assert!(matches!(
        block_on(read_frame(
            &mut MemReader::new(Vec::new(), 1),
            DEFAULT_MAX_FRAME_BYTES
        )),
        Ok(None)
    ));
}

#[test]
fn large_frame_is_read_whole() {
    let body: Vec<u8> = (0..5_000_000u32).map(|i| i as u8).collect();
    let mut data = (body.len() as i32).to_be_bytes().to_vec();
    data.extend_from_slice(&body);
    data.extend_from_slice(&0i32.to_be_bytes());
    // Cut inside the part read straight into the frame's room.
    let cut = 3_000_000;
    let mut frames = FrameReader::new(DEFAULT_MAX_FRAME_BYTES);
    let mut reader = MemReader::new(data[..cut].to_vec(), 100_000);
    match block_on(frames.next(&mut reader)) {
        Err(FrameError::Truncated { expected, received }) => {
            assert_eq!((expected, received), (body.len() + 4, cut));
        }
        other => panic!("{other:?}"),
    }
    let mut frames = FrameReader::new(DEFAULT_MAX_FRAME_BYTES);
    let mut reader = MemReader::new(data, 100_000);
    let frame = block_on(frames.next(&mut reader));
    assert!(frame
        .ok()
        .flatten()
        .is_some_and(|frame| frame[..] == body[..]));
    let empty = block_on(frames.next(&mut reader));
    assert!(empty.ok().flatten().is_some_and(|frame| frame.is_empty()));
    assert!(matches!(block_on(frames.next(&mut reader)), Ok(None)));
}
