//! Walking the batches of a segment file in chunks: the shared loop of recovery,
//! truncation and cold reads.

use std::ops::ControlFlow;
use std::path::Path;

use glommio::io::DmaFile;

use crate::batch::{BatchHeader, BatchScanner, BATCH_HEADER_LEN};
use crate::error::{LogError, Result};

/// Why a scan stopped.
#[derive(Debug)]
pub enum ScanStop {
    /// Every byte up to the end was a complete batch.
    End,
    /// The visitor asked to stop at `position`.
    Visitor,
    /// A batch header at `position` declares more bytes than the file holds: a
    /// torn write.
    Partial,
    /// The bytes at `position` are not a batch header (garbage, or a header
    /// torn by a crash).
    BadHeader(String),
    /// Zeros from `position` to the end of what was read: space preallocated
    /// ahead of an active segment's data and never written (where a crash
    /// leaves the end of the log), not a damaged batch.
    Unwritten,
}

/// The stop at `position` when the bytes there are `rest`: zeros are space
/// never written, anything else is `otherwise`.
fn classify(rest: &[u8], otherwise: ScanStop) -> ScanStop {
    if !rest.is_empty() && rest.iter().all(|b| *b == 0) {
        ScanStop::Unwritten
    } else {
        otherwise
    }
}

#[derive(Debug)]
pub struct ScanOutcome {
    /// Position of the first batch not visited (or where the visitor stopped).
    pub position: u64,
    pub stop: ScanStop,
}

/// Visits every complete batch in `[start, end)` of `file`, in order, reading
/// `chunk_bytes` at a time (more when a single batch is larger). The visitor gets
/// the batch's position, header and bytes, and may stop the scan by returning
/// `Break`; the outcome's position is then that batch's own position.
pub async fn scan(
    file: &DmaFile,
    path: &Path,
    start: u64,
    end: u64,
    chunk_bytes: usize,
    mut visit: impl FnMut(u64, &BatchHeader, &[u8]) -> ControlFlow<()>,
) -> Result<ScanOutcome> {
    let mut pos = start;
    let mut want = chunk_bytes;
    loop {
        if pos >= end {
            return Ok(ScanOutcome {
                position: pos,
                stop: ScanStop::End,
            });
        }
        let len = want.min((end - pos) as usize);
        let data = file
            .read_at(pos, len)
            .await
            .map_err(|e| LogError::io("read", path, e))?;
        let chunk = &data[..data.len().min(len)];
        let mut scanner = BatchScanner::new(chunk);
        for (p, header) in scanner.by_ref() {
            let bytes = &chunk[p..p + header.total_len()];
            if visit(pos + p as u64, &header, bytes).is_break() {
                return Ok(ScanOutcome {
                    position: pos + p as u64,
                    stop: ScanStop::Visitor,
                });
            }
        }
        let consumed = scanner.position();
        if let Some(e) = scanner.error() {
            return Ok(ScanOutcome {
                position: pos + consumed as u64,
                stop: classify(&chunk[consumed..], ScanStop::BadHeader(e.to_string())),
            });
        }
        let rest = &chunk[consumed..];
        pos += consumed as u64;
        want = chunk_bytes;
        if rest.is_empty() {
            continue;
        }
        // A batch continues past this chunk: read it whole next time, unless the
        // file ends first (a torn write).
        if rest.len() >= BATCH_HEADER_LEN {
            match BatchHeader::parse(rest) {
                Ok(h) if pos + h.total_len() as u64 > end => {
                    return Ok(ScanOutcome {
                        position: pos,
                        stop: ScanStop::Partial,
                    })
                }
                Ok(h) => want = want.max(h.total_len()),
                Err(e) => {
                    return Ok(ScanOutcome {
                        position: pos,
                        stop: classify(rest, ScanStop::BadHeader(e.to_string())),
                    })
                }
            }
        } else if pos + BATCH_HEADER_LEN as u64 > end {
            return Ok(ScanOutcome {
                position: pos,
                stop: classify(rest, ScanStop::Partial),
            });
        } else if consumed == 0 {
            want = want.max(BATCH_HEADER_LEN);
        }
    }
}
