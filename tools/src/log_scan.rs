//! Walks a `.log` segment batch by batch and says how its bytes end.
//!
//! A segment is RecordBatch v2 bytes back to back, then possibly zeros: the active
//! segment is preallocated, and an all-zero header means "no more data". So the
//! scan ends in one of three ways ([`Tail`]):
//! - at the end of the file ([`Tail::None`]);
//! - at zeros that run to the end of the file ([`Tail::Zeros`], normal);
//! - at anything else ([`Tail::Garbage`]): a header that does not parse, a batch
//!   that runs past the end of the file (a torn write), or non-zero bytes after the
//!   zero padding. What recovery would truncate;
//! - in a recycled active segment (a `<base>.recycled` marker beside it), at
//!   the first batch below the segment's base offset or anything that is not a
//!   batch ([`Tail::Recycled`], normal): the file's previous contents.
//!
//! A batch whose CRC does not match is still yielded (with the mismatch in
//! [`ScannedBatch::crc`]) and the scan continues at its declared length, since that
//! length lies within the file; only the batch's own bytes are suspect.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use skiff_engine::batch::{crc_matches, BatchError, BatchHeader, BATCH_HEADER_LEN};

use crate::ToolError;

/// Zero padding is checked in chunks of this size, so a preallocated gigabyte is
/// never read into memory at once.
const ZERO_CHECK_CHUNK_BYTES: usize = 64 * 1024;

/// How much of each batch to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScanMode {
    /// Read every batch whole and check its CRC.
    Full,
    /// Read only the 61-byte headers (enough to find batch boundaries and offsets).
    HeadersOnly,
}

/// One batch found in the log.
#[derive(Debug)]
pub struct ScannedBatch {
    /// Byte position of the batch in the `.log` file.
    pub position: u64,
    pub header: BatchHeader,
    /// The whole batch (`ScanMode::Full`), or empty (`ScanMode::HeadersOnly`).
    pub bytes: Bytes,
    /// The CRC verdict; `None` when the scan does not read batch bodies.
    pub crc: Option<Result<(), BatchError>>,
}

impl ScannedBatch {
    /// Bytes the batch occupies in the log.
    pub fn size(&self) -> u64 {
        self.header.total_len() as u64
    }

    /// False only when the CRC was checked and does not match.
    pub fn crc_valid(&self) -> bool {
        !matches!(self.crc, Some(Err(_)))
    }
}

/// What follows the last batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tail {
    /// The batches end exactly at the end of the file.
    None,
    /// Zeros from `position` to the end of the file: preallocated, not yet written.
    Zeros { position: u64, bytes: u64 },
    /// A recycled file's previous contents from `position` to the end of the
    /// file (every batch in them below the segment's base offset).
    Recycled { position: u64, bytes: u64 },
    /// Bytes from `position` to the end of the file that are not batches.
    Garbage {
        position: u64,
        bytes: u64,
        reason: String,
    },
}

/// Where a scan ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogEnd {
    /// Position just after the last batch: the log's data size.
    pub data_end: u64,
    pub file_len: u64,
    pub tail: Tail,
}

/// One step of a scan.
#[derive(Debug)]
pub enum Step {
    Batch(ScannedBatch),
    End(LogEnd),
}

/// Reads a `.log` file one batch at a time.
#[derive(Debug)]
pub struct LogScanner {
    path: PathBuf,
    file: File,
    file_len: u64,
    mode: ScanMode,
    /// Start of the next batch to read.
    position: u64,
    /// Set once the scan has ended; every later step returns it again.
    end: Option<LogEnd>,
    /// The segment's base offset when its file is recycled (a `.recycled`
    /// marker beside it): what does not continue the log past its data is
    /// the file's previous contents.
    recycled_floor: Option<i64>,
}

impl LogScanner {
    pub fn open(path: &Path, mode: ScanMode) -> Result<LogScanner, ToolError> {
        let file = File::open(path).map_err(|e| ToolError::io(path, e))?;
        let metadata = file.metadata().map_err(|e| ToolError::io(path, e))?;
        if !metadata.is_file() {
            let e = std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a regular file");
            return Err(ToolError::io(path, e));
        }
        let file_len = metadata.len();
        let recycled_floor = crate::layout::segment_base_offset(path).filter(|_| {
            path.with_extension(skiff_engine::segment::RECYCLED_SUFFIX)
                .exists()
        });
        Ok(LogScanner {
            recycled_floor,
            path: path.to_path_buf(),
            file,
            file_len,
            mode,
            position: 0,
            end: None,
        })
    }

    pub fn file_len(&self) -> u64 {
        self.file_len
    }

    /// The next batch, or how the log ends.
    pub fn step(&mut self) -> Result<Step, ToolError> {
        if let Some(end) = &self.end {
            return Ok(Step::End(end.clone()));
        }
        match self.read_batch()? {
            Ok(batch) => Ok(Step::Batch(batch)),
            Err(tail) => {
                let end = LogEnd {
                    data_end: self.position,
                    file_len: self.file_len,
                    tail,
                };
                self.end = Some(end.clone());
                Ok(Step::End(end))
            }
        }
    }

    /// Reads the batch at `self.position`; the inner `Err` is the tail when there is
    /// no batch there.
    fn read_batch(&mut self) -> Result<Result<ScannedBatch, Tail>, ToolError> {
        let position = self.position;
        let remaining = self.file_len - position;
        if remaining == 0 {
            return Ok(Err(Tail::None));
        }
        let header_len = remaining.min(BATCH_HEADER_LEN as u64) as usize;
        let mut header_bytes = [0u8; BATCH_HEADER_LEN];
        self.read_at(&mut header_bytes[..header_len], position)?;
        if header_bytes[..header_len].iter().all(|&b| b == 0) {
            return self.zero_tail(position).map(Err);
        }
        let recycled = self.recycled_floor.is_some();
        let garbage = |reason: String| {
            if recycled {
                Tail::Recycled {
                    position,
                    bytes: remaining,
                }
            } else {
                Tail::Garbage {
                    position,
                    bytes: remaining,
                    reason,
                }
            }
        };
        if header_len < BATCH_HEADER_LEN {
            return Ok(Err(garbage(format!(
                "{remaining} bytes are too few for a {BATCH_HEADER_LEN}-byte batch header"
            ))));
        }
        let header = match BatchHeader::parse(&header_bytes) {
            Ok(header) => header,
            Err(e) => return Ok(Err(garbage(format!("not a batch header: {e}")))),
        };
        if self
            .recycled_floor
            .is_some_and(|floor| header.base_offset < floor)
        {
            return Ok(Err(Tail::Recycled {
                position,
                bytes: remaining,
            }));
        }
        let size = header.total_len() as u64;
        if size > remaining {
            return Ok(Err(garbage(format!(
                "batch declares {size} bytes but only {remaining} remain in the file (torn write)"
            ))));
        }
        let (bytes, crc) = match self.mode {
            ScanMode::HeadersOnly => (Bytes::new(), None),
            ScanMode::Full => {
                // `size <= remaining <= file_len`: bounded by the file itself.
                let mut bytes = vec![0u8; header.total_len()];
                self.read_at(&mut bytes, position)?;
                let crc = crc_matches(&bytes);
                (Bytes::from(bytes), Some(crc))
            }
        };
        self.position += size;
        Ok(Ok(ScannedBatch {
            position,
            header,
            bytes,
            crc,
        }))
    }

    /// The tail from `position`, where a zero header was found: zeros to the end of
    /// the file are padding; anything non-zero after them is garbage.
    fn zero_tail(&self, position: u64) -> Result<Tail, ToolError> {
        let mut chunk = vec![0u8; ZERO_CHECK_CHUNK_BYTES];
        let mut at = position;
        while at < self.file_len {
            let len = (self.file_len - at).min(ZERO_CHECK_CHUNK_BYTES as u64) as usize;
            self.read_at(&mut chunk[..len], at)?;
            if let Some(i) = chunk[..len].iter().position(|&b| b != 0) {
                if self.recycled_floor.is_some() {
                    // The padding of the last write, then the old contents.
                    return Ok(Tail::Recycled {
                        position,
                        bytes: self.file_len - position,
                    });
                }
                return Ok(Tail::Garbage {
                    position,
                    bytes: self.file_len - position,
                    reason: format!(
                        "non-zero byte at position {} after zero padding",
                        at + i as u64
                    ),
                });
            }
            at += len as u64;
        }
        Ok(Tail::Zeros {
            position,
            bytes: self.file_len - position,
        })
    }

    fn read_at(&self, buf: &mut [u8], position: u64) -> Result<(), ToolError> {
        self.file
            .read_exact_at(buf, position)
            .map_err(|e| ToolError::io(&self.path, e))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use skiff_engine::batch::BatchBuilder;

    fn batch(base_offset: i64, records: usize) -> Bytes {
        let mut builder = BatchBuilder::new().base_offset(base_offset);
        for i in 0..records {
            builder.push(1_000 + i as i64, Some(b"k"), Some(b"value"), &[]);
        }
        builder.build().unwrap()
    }

    fn scan(bytes: &[u8], mode: ScanMode) -> (Vec<ScannedBatch>, LogEnd) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("00000000000000000000.log");
        std::fs::write(&path, bytes).unwrap();
        let mut scanner = LogScanner::open(&path, mode).unwrap();
        let mut batches = Vec::new();
        loop {
            match scanner.step().unwrap() {
                Step::Batch(b) => batches.push(b),
                Step::End(end) => return (batches, end),
            }
        }
    }

    #[test]
    fn clean_log_ends_at_file_end() {
        let mut log = batch(0, 3).to_vec();
        log.extend_from_slice(&batch(3, 2));
        let (batches, end) = scan(&log, ScanMode::Full);
        assert_eq!(batches.len(), 2);
        assert!(batches.iter().all(ScannedBatch::crc_valid));
        assert_eq!(batches[1].position, batches[0].size());
        assert_eq!(end.tail, Tail::None);
        assert_eq!(end.data_end, log.len() as u64);
    }

    #[test]
    fn zero_padding_is_a_clean_tail() {
        let mut log = batch(0, 3).to_vec();
        let data_len = log.len() as u64;
        log.resize(200_000, 0);
        let (batches, end) = scan(&log, ScanMode::HeadersOnly);
        assert_eq!(batches.len(), 1);
        assert_eq!(
            end.tail,
            Tail::Zeros {
                position: data_len,
                bytes: 200_000 - data_len
            }
        );
    }

    #[test]
    fn torn_batch_and_garbage_are_flagged() {
        let full = batch(0, 3);
        let (batches, end) = scan(&full[..full.len() - 5], ScanMode::Full);
        assert!(batches.is_empty());
        assert!(matches!(end.tail, Tail::Garbage { position: 0, .. }));

        let mut log = full.to_vec();
        log.resize(100_000, 0);
        log[90_000] = 7;
        let (_, end) = scan(&log, ScanMode::Full);
        match end.tail {
            Tail::Garbage {
                position, reason, ..
            } => {
                assert_eq!(position, full.len() as u64);
                assert!(reason.contains("90000"), "{reason}");
            }
            other => panic!("expected garbage, got {other:?}"),
        }

        let (_, end) = scan(&[1, 2, 3], ScanMode::Full);
        assert!(matches!(end.tail, Tail::Garbage { bytes: 3, .. }));
    }

    #[test]
    fn crc_mismatch_continues_at_declared_length() {
        let mut log = batch(0, 3).to_vec();
        let second = log.len();
        log.extend_from_slice(&batch(3, 2));
        log[second - 3] ^= 0x10;
        let (batches, end) = scan(&log, ScanMode::Full);
        assert_eq!(batches.len(), 2);
        assert!(!batches[0].crc_valid());
        assert!(batches[1].crc_valid());
        assert_eq!(end.tail, Tail::None);
    }
}
