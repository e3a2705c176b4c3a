//! A partition directory's `partition.metadata` (Kafka's format): which topic,
//! by id, the directory's log belongs to.
//!
//! ```text
//! version: 0
//! topic_id: <22 characters of URL-safe base64>
//! ```
//!
//! A topic deleted and created again under the same name while a replica was
//! down leaves that replica a directory of the same name holding the old
//! topic's records; the id tells them apart, so the node deletes the old log
//! instead of serving it as the new topic's (`cluster::open_assigned`).

use std::path::Path;

use base64::Engine as _;

use crate::error::{LogError, Result};
use crate::fsutil;

pub const PARTITION_METADATA_FILE: &str = "partition.metadata";

/// A topic id as Kafka prints it (`Uuid.toString()`): its 16 bytes, big
/// endian, in URL-safe base64 without padding.
pub fn uuid_string(id: &[u8; 16]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(id)
}

pub fn encode(topic_id: &[u8; 16]) -> String {
    format!("version: 0\ntopic_id: {}\n", uuid_string(topic_id))
}

pub fn decode(path: &Path, text: &str) -> Result<[u8; 16]> {
    let bad = |reason: String| LogError::Checkpoint {
        path: path.to_path_buf(),
        reason,
    };
    let mut lines = text.lines();
    match lines.next().map(str::trim) {
        Some("version: 0") => {}
        other => return Err(bad(format!("unsupported version line {other:?}"))),
    }
    let id = lines
        .next()
        .and_then(|l| l.trim().strip_prefix("topic_id:"))
        .map(str::trim)
        .ok_or_else(|| bad("no topic_id line".into()))?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(id)
        .map_err(|e| bad(format!("topic_id {id:?}: {e}")))?;
    bytes
        .try_into()
        .map_err(|b: Vec<u8>| bad(format!("topic_id {id:?} has {} bytes, not 16", b.len())))
}

/// The topic id recorded in partition directory `dir`; None when it has no
/// `partition.metadata` (created before skiff wrote one).
pub async fn read(dir: &Path) -> Result<Option<[u8; 16]>> {
    let path = dir.join(PARTITION_METADATA_FILE);
    let Some(bytes) = fsutil::read_file(&path).await? else {
        return Ok(None);
    };
    let text = String::from_utf8_lossy(&bytes);
    decode(&path, &text).map(Some)
}

/// Records (durably) that directory `dir` holds topic `topic_id`'s log.
pub async fn write(dir: &Path, topic_id: &[u8; 16]) -> Result<()> {
    fsutil::write_file_atomic(
        &dir.join(PARTITION_METADATA_FILE),
        encode(topic_id).as_bytes(),
    )
    .await
}

/// `write` into a directory being created, without its directory fsync: the
/// creation's own (the first segment's, `Segment::create`) makes the file's
/// rename durable with the segment, so a new partition pays one directory
/// fsync, not two. A crash before that fsync leaves a directory without the
/// file, or without the directory, both of which a restart handles.
pub async fn write_in_new_dir(dir: &Path, topic_id: &[u8; 16]) -> Result<()> {
    fsutil::write_file_renamed(
        &dir.join(PARTITION_METADATA_FILE),
        encode(topic_id).as_bytes(),
    )
    .await
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_in_kafkas_format() {
        let id = [
            0x3c, 0x5a, 0x8e, 0x01, 0xff, 0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80,
            0x90, 0xa0,
        ];
        let text = encode(&id);
        assert_eq!(text, "version: 0\ntopic_id: PFqOAf8AECAwQFBgcICQoA\n");
        assert_eq!(decode(Path::new("x"), &text).unwrap(), id);
    }

    #[test]
    fn refuses_what_is_not_one() {
        let p = Path::new("x");
        assert!(decode(p, "version: 1\ntopic_id: PFqOAf8AECAwQFBgcICQoA\n").is_err());
        assert!(decode(p, "version: 0\n").is_err());
        assert!(decode(p, "version: 0\ntopic_id: !!!\n").is_err());
        assert!(decode(p, "version: 0\ntopic_id: AAAA\n").is_err());
        assert!(decode(p, "").is_err());
    }
}
