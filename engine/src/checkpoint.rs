//! Kafka's checkpoint text files: line 1 the format version (`0`), line 2 the
//! number of entries, then one entry per line, fields separated by a space.
//! Used for `leader-epoch-checkpoint` (`epoch start_offset`) and
//! `recovery-point-offset-checkpoint` and `log-start-offset-checkpoint`
//! (`topic partition offset`).

use std::path::Path;

use crate::error::{LogError, Result};
use crate::fsutil;

pub const LEADER_EPOCH_FILE: &str = "leader-epoch-checkpoint";
pub const RECOVERY_POINT_FILE: &str = "recovery-point-offset-checkpoint";
pub const LOG_START_OFFSET_FILE: &str = "log-start-offset-checkpoint";
/// The high watermark replication last agreed on (Kafka keeps one
/// `replication-offset-checkpoint` per data dir; skiff one per partition).
pub const HIGH_WATERMARK_FILE: &str = "replication-offset-checkpoint";
/// The cleaner's first dirty offset: everything below it has been compacted.
pub const CLEANER_CHECKPOINT_FILE: &str = "cleaner-offset-checkpoint";
/// What a clean close left (`PartitionLog::shutdown`): the active segment's
/// `base size next_offset` as it was closed, its indexes written. Recovery
/// loads that segment from its indexes instead of scanning it when the
/// segment, its size and the recovery point still match, and removes the file
/// as the log opens (`recovery::recover`).
pub const CLEAN_SHUTDOWN_FILE: &str = "clean-shutdown-checkpoint";
/// The log's open and unreplicated transactions at its last rolls
/// (`log::txns`): `at state|open|done producer_id first_offset marker_offset`.
pub const TXN_STATE_FILE: &str = "txn-state-checkpoint";

pub fn encode(entries: &[Vec<String>]) -> String {
    let mut out = format!("0\n{}\n", entries.len());
    for e in entries {
        out.push_str(&e.join(" "));
        out.push('\n');
    }
    out
}

/// Parses a checkpoint file's text into its entries' fields; every entry must have
/// `fields` fields.
pub fn decode(path: &Path, text: &str, fields: usize) -> Result<Vec<Vec<String>>> {
    let bad = |reason: String| LogError::Checkpoint {
        path: path.to_path_buf(),
        reason,
    };
    let mut lines = text.lines();
    match lines.next() {
        Some("0") => {}
        other => return Err(bad(format!("unsupported version line {other:?}"))),
    }
    let count: usize = lines
        .next()
        .and_then(|l| l.trim().parse().ok())
        .ok_or_else(|| bad("missing entry count".into()))?;
    let entries: Vec<Vec<String>> = lines
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .collect();
    if entries.len() != count {
        return Err(bad(format!(
            "expected {count} entries, found {}",
            entries.len()
        )));
    }
    if let Some(e) = entries.iter().find(|e| e.len() != fields) {
        return Err(bad(format!("entry {e:?} does not have {fields} fields")));
    }
    Ok(entries)
}

pub fn parse_i64(path: &Path, field: &str) -> Result<i64> {
    field.parse().map_err(|_| LogError::Checkpoint {
        path: path.to_path_buf(),
        reason: format!("{field:?} is not a number"),
    })
}

pub async fn read(path: &Path, fields: usize) -> Result<Option<Vec<Vec<String>>>> {
    let Some(bytes) = fsutil::read_file(path).await? else {
        return Ok(None);
    };
    let text = String::from_utf8(bytes).map_err(|_| LogError::Checkpoint {
        path: path.to_path_buf(),
        reason: "not UTF-8".into(),
    })?;
    decode(path, &text, fields).map(Some)
}

pub async fn write(path: &Path, entries: &[Vec<String>]) -> Result<()> {
    fsutil::write_file_atomic(path, encode(entries).as_bytes()).await
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_rejects() {
        let p = Path::new("x");
        let entries = vec![
            vec!["0".to_string(), "0".to_string()],
            vec!["3".into(), "100".into()],
        ];
        let text = encode(&entries);
        assert_eq!(text, "0\n2\n0 0\n3 100\n");
        assert_eq!(decode(p, &text, 2).unwrap(), entries);
        assert!(decode(p, "1\n0\n", 2).is_err());
        assert!(decode(p, "0\n3\n0 0\n", 2).is_err());
        assert!(decode(p, "0\n1\n0 0 0\n", 2).is_err());
        assert!(decode(p, "", 2).is_err());
    }
}
