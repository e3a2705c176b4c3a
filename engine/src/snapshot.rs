//! Producer-state snapshot files (Kafka's `<offset>.snapshot`), stored for the
//! node: the engine keeps opaque bodies and owns their lifecycle, the node owns
//! what is in them.
//!
//! `<offset as 20 digits>.snapshot` in the partition directory describes the
//! log below `offset`. Layout: `version u16 BE (1) | crc32c u32 BE of the body
//! | body length u32 BE | body`. A file whose length or CRC does not check (a
//! torn write, bitrot) is skipped with a warning.
//!
//! Rules (enforced by `PartitionLog`): a snapshot is written only for an offset
//! at or below the flushed offset, so a crash cannot take away records it
//! describes; truncation deletes the snapshots above the new end (and syncs
//! the directory) before it cuts the log; recovery deletes those above the
//! recovered end. Retention and DeleteRecords leave them: producer state
//! outlives deleted segments, as in Kafka. The newest `SNAPSHOTS_KEPT` stay.

use std::path::{Path, PathBuf};

use bytes::Bytes;

use crate::error::{LogError, Result};
use crate::fsutil;

pub const SNAPSHOT_SUFFIX: &str = ".snapshot";
/// How many snapshots a partition keeps (the newest).
pub const SNAPSHOTS_KEPT: usize = 2;
const VERSION: u16 = 1;
const HEADER_LEN: usize = 10;

pub fn snapshot_path(dir: &Path, offset: i64) -> PathBuf {
    dir.join(format!("{offset:020}{SNAPSHOT_SUFFIX}"))
}

/// The offsets of the snapshot files in `dir`, ascending.
pub fn list(dir: &Path) -> Result<Vec<i64>> {
    let mut offsets = Vec::new();
    let entries = std::fs::read_dir(dir).map_err(|e| LogError::io("list", dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| LogError::io("list", dir, e))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(stem) = name.strip_suffix(SNAPSHOT_SUFFIX) else {
            continue;
        };
        if stem.len() == 20 && stem.bytes().all(|b| b.is_ascii_digit()) {
            if let Ok(offset) = stem.parse::<i64>() {
                offsets.push(offset);
            }
        }
    }
    offsets.sort_unstable();
    Ok(offsets)
}

pub fn encode(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + body.len());
    out.extend_from_slice(&VERSION.to_be_bytes());
    out.extend_from_slice(&crc32c::crc32c(body).to_be_bytes());
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(body);
    out
}

/// The body of a framed snapshot, or why it is not one.
pub fn decode(bytes: &[u8]) -> std::result::Result<&[u8], String> {
    if bytes.len() < HEADER_LEN {
        return Err(format!("{} bytes, shorter than the header", bytes.len()));
    }
    let version = u16::from_be_bytes([bytes[0], bytes[1]]);
    if version != VERSION {
        return Err(format!("unknown version {version}"));
    }
    let crc = u32::from_be_bytes([bytes[2], bytes[3], bytes[4], bytes[5]]);
    let len = u32::from_be_bytes([bytes[6], bytes[7], bytes[8], bytes[9]]) as usize;
    let body = &bytes[HEADER_LEN..];
    if body.len() != len {
        return Err(format!("body of {} bytes, header says {len}", body.len()));
    }
    if crc32c::crc32c(body) != crc {
        return Err("CRC-32C mismatch".to_string());
    }
    Ok(body)
}

/// Writes the snapshot for `offset` atomically (tmp, fdatasync, rename,
/// directory fsync), then deletes all but the newest `SNAPSHOTS_KEPT`.
pub async fn write(dir: &Path, offset: i64, body: &[u8]) -> Result<()> {
    fsutil::write_file_atomic(&snapshot_path(dir, offset), &encode(body)).await?;
    let offsets = list(dir)?;
    if offsets.len() > SNAPSHOTS_KEPT {
        // An old snapshot coming back after a crash is still valid: no sync.
        for old in &offsets[..offsets.len() - SNAPSHOTS_KEPT] {
            fsutil::remove(&snapshot_path(dir, *old)).await?;
        }
    }
    Ok(())
}

/// The newest snapshot at or below `max_offset` whose frame checks; corrupt
/// ones are logged and skipped.
pub async fn latest(dir: &Path, max_offset: i64) -> Result<Option<(i64, Bytes)>> {
    for offset in list(dir)?.into_iter().rev() {
        if offset > max_offset {
            continue;
        }
        let path = snapshot_path(dir, offset);
        let Some(bytes) = fsutil::read_file(&path).await? else {
            continue;
        };
        match decode(&bytes) {
            Ok(body) => return Ok(Some((offset, Bytes::copy_from_slice(body)))),
            Err(reason) => {
                tracing::warn!(path = %path.display(), %reason, "skipping a corrupt producer snapshot");
            }
        }
    }
    Ok(None)
}

/// Deletes the snapshots above `offset` (and leftover temporary files), and
/// makes that durable: a truncated log must not find them again after a crash.
pub async fn delete_above(dir: &Path, offset: i64) -> Result<()> {
    let mut removed = false;
    for o in list(dir)? {
        if o > offset {
            fsutil::remove(&snapshot_path(dir, o)).await?;
            removed = true;
        }
    }
    if removed {
        fsutil::sync_dir(dir).await?;
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn frame_round_trip_and_rejects() {
        let framed = encode(b"hello");
        assert_eq!(decode(&framed).unwrap(), b"hello");
        assert!(decode(&framed[..framed.len() - 1]).is_err());
        assert!(decode(&framed[..3]).is_err());
        let mut bad = framed.clone();
        bad[HEADER_LEN] ^= 1;
        assert!(decode(&bad).is_err());
        let mut bad = framed;
        bad[0] = 9;
        assert!(decode(&bad).is_err());
        assert_eq!(decode(&encode(b"")).unwrap(), b"");
    }
}
