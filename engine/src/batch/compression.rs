//! The five batch codecs, byte-compatible with the Java client and librdkafka.
//!
//! The broker never decompresses on the produce or fetch path; this is for tools,
//! tests and, later, compaction. Every decompression is bounded by a caller-chosen
//! output limit so a small hostile payload cannot expand without bound.

use std::fmt;
use std::io::{self, Read, Write};
use std::str::FromStr;

use super::BatchError;

/// Attribute bits 0-2 of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
    Snappy,
    Lz4,
    Zstd,
}

pub(crate) const CODEC_MASK: i16 = 0x07;

impl Compression {
    pub fn from_attributes(attributes: i16) -> Result<Compression, BatchError> {
        match attributes & CODEC_MASK {
            0 => Ok(Compression::None),
            1 => Ok(Compression::Gzip),
            2 => Ok(Compression::Snappy),
            3 => Ok(Compression::Lz4),
            4 => Ok(Compression::Zstd),
            id => Err(BatchError::UnknownCompression(id)),
        }
    }

    pub fn as_attribute_bits(self) -> i16 {
        match self {
            Compression::None => 0,
            Compression::Gzip => 1,
            Compression::Snappy => 2,
            Compression::Lz4 => 3,
            Compression::Zstd => 4,
        }
    }

    /// Kafka's name for the codec (`compression.type`, kafka-dump-log's compresscodec).
    pub fn name(self) -> &'static str {
        match self {
            Compression::None => "none",
            Compression::Gzip => "gzip",
            Compression::Snappy => "snappy",
            Compression::Lz4 => "lz4",
            Compression::Zstd => "zstd",
        }
    }

    pub const ALL: [Compression; 5] = [
        Compression::None,
        Compression::Gzip,
        Compression::Snappy,
        Compression::Lz4,
        Compression::Zstd,
    ];
}

impl fmt::Display for Compression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Compression {
    type Err = BatchError;

    /// Case-insensitive, as Kafka accepts `compression.type`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Compression::ALL
            .into_iter()
            .find(|codec| codec.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| BatchError::UnknownCompressionName(s.to_owned()))
    }
}

/// Compresses a records section the way the Java client does.
pub fn compress(codec: Compression, data: &[u8]) -> Result<Vec<u8>, BatchError> {
    let io_error = |source| BatchError::Compression { codec, source };
    match codec {
        Compression::None => Ok(data.to_vec()),
        Compression::Gzip => {
            let mut encoder =
                flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            encoder.write_all(data).map_err(io_error)?;
            encoder.finish().map_err(io_error)
        }
        Compression::Snappy => xerial_compress(data).map_err(io_error),
        Compression::Lz4 => {
            // Kafka's own LZ4 writer: 64 KiB independent blocks, no checksums. Its
            // reader rejects dependent blocks, so the mode must be set explicitly.
            let info = lz4_flex::frame::FrameInfo::new()
                .block_size(lz4_flex::frame::BlockSize::Max64KB)
                .block_mode(lz4_flex::frame::BlockMode::Independent);
            let mut encoder = lz4_flex::frame::FrameEncoder::with_frame_info(info, Vec::new());
            encoder.write_all(data).map_err(io_error)?;
            encoder.finish().map_err(|e| io_error(e.into()))
        }
        // Level 3 is zstd's and Kafka's default.
        Compression::Zstd => zstd::bulk::compress(data, 3).map_err(io_error),
    }
}

/// Decompresses a records section, failing with [`BatchError::TooLarge`] as soon
/// as the output would exceed `size_limit` bytes.
pub fn decompress(
    codec: Compression,
    data: &[u8],
    size_limit: usize,
) -> Result<Vec<u8>, BatchError> {
    let io_error = |source| BatchError::Compression { codec, source };
    match codec {
        Compression::None => {
            if data.len() > size_limit {
                return Err(BatchError::TooLarge { limit: size_limit });
            }
            Ok(data.to_vec())
        }
        // Multi-member, as Java's GZIPInputStream reads concatenated members.
        Compression::Gzip => {
            read_bounded(flate2::read::MultiGzDecoder::new(data), codec, size_limit)
        }
        Compression::Snappy => snappy_decompress(data, size_limit),
        Compression::Lz4 => {
            read_bounded(lz4_flex::frame::FrameDecoder::new(data), codec, size_limit)
        }
        // The decoder's window memory stays under zstd's default limit (2^27 bytes).
        // Tighter limits would reject legitimate frames: a streaming producer
        // declares a window from its level (2^21 at level 3), not from the content.
        Compression::Zstd => {
            let decoder = zstd::stream::read::Decoder::with_buffer(data).map_err(io_error)?;
            read_bounded(decoder, codec, size_limit)
        }
    }
}

fn read_bounded(
    reader: impl Read,
    codec: Compression,
    size_limit: usize,
) -> Result<Vec<u8>, BatchError> {
    let mut out = Vec::new();
    // One byte past the limit tells "exactly at the limit" from "over it".
    let cap = u64::try_from(size_limit)
        .unwrap_or(u64::MAX)
        .saturating_add(1);
    reader
        .take(cap)
        .read_to_end(&mut out)
        .map_err(|source| BatchError::Compression { codec, source })?;
    if out.len() > size_limit {
        return Err(BatchError::TooLarge { limit: size_limit });
    }
    Ok(out)
}

/// snappy-java's stream header: magic, then version and min-compatible version.
const XERIAL_MAGIC: [u8; 8] = [0x82, b'S', b'N', b'A', b'P', b'P', b'Y', 0];
const XERIAL_HEADER_LEN: usize = XERIAL_MAGIC.len() + 8;
const XERIAL_VERSION: i32 = 1;
const XERIAL_MIN_COMPATIBLE_VERSION: i32 = 1;
/// snappy-java's SnappyOutputStream default block size, which Kafka uses.
const XERIAL_BLOCK_LEN: usize = 32 * 1024;

/// The Java client writes snappy-java's framing: header, then `[len i32][raw block]`.
fn xerial_compress(data: &[u8]) -> io::Result<Vec<u8>> {
    let mut out = Vec::with_capacity(XERIAL_HEADER_LEN + snap::raw::max_compress_len(data.len()));
    out.extend_from_slice(&XERIAL_MAGIC);
    out.extend_from_slice(&XERIAL_VERSION.to_be_bytes());
    out.extend_from_slice(&XERIAL_MIN_COMPATIBLE_VERSION.to_be_bytes());
    let mut encoder = snap::raw::Encoder::new();
    for block in data.chunks(XERIAL_BLOCK_LEN) {
        let compressed = encoder.compress_vec(block).map_err(invalid_data)?;
        let len = i32::try_from(compressed.len())
            .map_err(|_| invalid_data("snappy block longer than i32::MAX"))?;
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(&compressed);
    }
    Ok(out)
}

/// Accepts both snappy-java framing (Java client) and a bare raw snappy block
/// (librdkafka and others), as Kafka's own reader does.
fn snappy_decompress(data: &[u8], size_limit: usize) -> Result<Vec<u8>, BatchError> {
    let codec = Compression::Snappy;
    let io_error = |source| BatchError::Compression { codec, source };
    let Some(mut blocks) = data.strip_prefix(&XERIAL_MAGIC) else {
        let mut out = Vec::new();
        append_raw_snappy(data, &mut out, size_limit)?;
        return Ok(out);
    };
    // Version fields are informational; snappy-java itself only rejects version 0.
    blocks = blocks
        .get(8..)
        .ok_or_else(|| io_error(invalid_data("snappy-java header truncated")))?;
    let mut out = Vec::new();
    while !blocks.is_empty() {
        let (len, rest) = blocks
            .split_first_chunk::<4>()
            .ok_or_else(|| io_error(invalid_data("snappy-java block length truncated")))?;
        let len = usize::try_from(i32::from_be_bytes(*len))
            .map_err(|_| io_error(invalid_data("negative snappy-java block length")))?;
        if len > rest.len() {
            return Err(io_error(invalid_data("snappy-java block truncated")));
        }
        let (block, rest) = rest.split_at(len);
        append_raw_snappy(block, &mut out, size_limit)?;
        blocks = rest;
    }
    Ok(out)
}

/// Decompresses one raw block onto `out`, checking the length the block declares
/// against the limit before allocating for it.
fn append_raw_snappy(block: &[u8], out: &mut Vec<u8>, size_limit: usize) -> Result<(), BatchError> {
    let snappy_error = |e: snap::Error| BatchError::Compression {
        codec: Compression::Snappy,
        source: invalid_data(e),
    };
    let len = snap::raw::decompress_len(block).map_err(snappy_error)?;
    if len > size_limit.saturating_sub(out.len()) {
        return Err(BatchError::TooLarge { limit: size_limit });
    }
    let start = out.len();
    out.resize(start + len, 0);
    snap::raw::Decoder::new()
        .decompress(block, &mut out[start..])
        .map_err(snappy_error)?;
    Ok(())
}

fn invalid_data<E>(error: E) -> io::Error
where
    E: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    io::Error::new(io::ErrorKind::InvalidData, error)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Compressible but not trivial: runs of a few symbols, as record batches are.
    fn sample(len: usize) -> Vec<u8> {
        let mut rng = fastrand::Rng::with_seed(len as u64);
        (0..len).map(|_| b"abcd"[rng.usize(..4)]).collect()
    }

    #[test]
    fn round_trip_across_block_boundaries() {
        // 32 KiB is the snappy-java block, 64 KiB the LZ4 block.
        for len in [
            0,
            1,
            XERIAL_BLOCK_LEN,
            XERIAL_BLOCK_LEN + 7,
            64 * 1024 + 1,
            200_000,
        ] {
            let data = sample(len);
            for codec in Compression::ALL {
                let compressed = compress(codec, &data).unwrap();
                let restored = decompress(codec, &compressed, len).unwrap();
                assert!(restored == data, "{codec} at {len} bytes");
            }
        }
    }

    #[test]
    fn decompress_respects_size_limit() {
        let data = vec![0u8; 100_000];
        for codec in Compression::ALL {
            let compressed = compress(codec, &data).unwrap();
            assert_eq!(
                decompress(codec, &compressed, 100_000).unwrap().len(),
                100_000
            );
            assert!(
                matches!(
                    decompress(codec, &compressed, 99_999),
                    Err(BatchError::TooLarge { limit: 99_999 })
                ),
                "{codec}"
            );
        }
    }

    #[test]
    fn snappy_writes_xerial_and_reads_raw_too() {
        let data = sample(1000);
        let framed = compress(Compression::Snappy, &data).unwrap();
        assert_eq!(&framed[..8], &XERIAL_MAGIC);
        assert_eq!(&framed[8..16], &[0, 0, 0, 1, 0, 0, 0, 1]);
        // librdkafka sends a bare raw block.
        let raw = snap::raw::Encoder::new().compress_vec(&data).unwrap();
        assert_eq!(decompress(Compression::Snappy, &raw, 1000).unwrap(), data);
        // A truncated frame is an error, not a panic or a short result.
        assert!(decompress(Compression::Snappy, &framed[..framed.len() - 1], 1000).is_err());
    }

    #[test]
    fn lz4_frame_matches_kafkas_writer() {
        let frame = compress(Compression::Lz4, b"hello").unwrap();
        assert_eq!(&frame[..4], &[0x04, 0x22, 0x4D, 0x18]); // frame magic
                                                            // FLG: version 01, independent blocks, no checksums, no content size.
        assert_eq!(frame[4], 0b0110_0000);
        // BD: 64 KiB maximum block size.
        assert_eq!(frame[5], 0b0100_0000);
    }

    #[test]
    fn names_and_attribute_bits() {
        for codec in Compression::ALL {
            assert_eq!(
                Compression::from_attributes(codec.as_attribute_bits()).unwrap(),
                codec
            );
            // Other attribute bits (timestamp type, transactional...) are ignored.
            assert_eq!(
                Compression::from_attributes(codec.as_attribute_bits() | 0x78).unwrap(),
                codec
            );
            assert_eq!(codec.name().parse::<Compression>().unwrap(), codec);
            assert_eq!(
                codec.name().to_uppercase().parse::<Compression>().unwrap(),
                codec
            );
            assert_eq!(codec.to_string(), codec.name());
        }
        for id in 5..=7 {
            assert!(matches!(
                Compression::from_attributes(id),
                Err(BatchError::UnknownCompression(i)) if i == id
            ));
        }
        assert!("brotli".parse::<Compression>().is_err());
    }

    proptest! {
        #[test]
        fn arbitrary_data_round_trips(
            data in prop::collection::vec(any::<u8>(), 0..5000),
            codec in prop::sample::select(Compression::ALL.to_vec()),
        ) {
            let compressed = compress(codec, &data).unwrap();
            prop_assert_eq!(decompress(codec, &compressed, data.len()).unwrap(), data);
        }

        #[test]
        fn arbitrary_input_never_panics(
            data in prop::collection::vec(any::<u8>(), 0..500),
            codec in prop::sample::select(Compression::ALL.to_vec()),
        ) {
            let _ = decompress(codec, &data, 1 << 16);
            let mut framed = XERIAL_MAGIC.to_vec();
            framed.extend_from_slice(&data);
            let _ = decompress(Compression::Snappy, &framed, 1 << 16);
        }
    }
}
