//! The small text files beside the segments, in Kafka's formats.
//!
//! Checkpoint files (`leader-epoch-checkpoint`, `recovery-point-offset-checkpoint`):
//!
//! ```text
//! 0                 version
//! 2                 number of entries
//! 0 0               leader epochs: "epoch startOffset"
//! 3 1200            (recovery point: "topic partition offset")
//! ```
//!
//! `meta.properties`: `key=value` lines (`version`, `node.id`, `cluster.id`); blank
//! lines and `#` comments are allowed, as Java properties files have them.

/// What is wrong with a text file, and on which line (1-based; 0 = the file as a
/// whole).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct LineError {
    pub line: usize,
    pub message: String,
}

fn line_error(line: usize, message: impl Into<String>) -> LineError {
    LineError {
        line,
        message: message.into(),
    }
}

/// The only checkpoint format version Kafka (and skiff) writes.
pub const CHECKPOINT_VERSION: u32 = 0;

/// The entries of a checkpoint file, each as its line number and its fields.
pub fn parse_checkpoint(
    text: &str,
    fields_per_entry: usize,
) -> Result<Vec<(usize, Vec<&str>)>, LineError> {
    let mut lines = text.lines().enumerate().map(|(i, l)| (i + 1, l.trim()));
    let (n, version) = lines.next().ok_or_else(|| line_error(0, "empty file"))?;
    match version.parse::<u32>() {
        Ok(CHECKPOINT_VERSION) => {}
        _ => {
            return Err(line_error(
                n,
                format!("unsupported version {version:?} (expected {CHECKPOINT_VERSION})"),
            ))
        }
    }
    let (n, count) = lines
        .next()
        .ok_or_else(|| line_error(0, "no entry count line"))?;
    let count: usize = count
        .parse()
        .map_err(|_| line_error(n, format!("entry count {count:?} is not a number")))?;
    let mut entries = Vec::new();
    for (n, line) in lines {
        if line.is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() != fields_per_entry {
            return Err(line_error(
                n,
                format!(
                    "expected {fields_per_entry} fields, found {}: {line:?}",
                    fields.len()
                ),
            ));
        }
        entries.push((n, fields));
    }
    if entries.len() != count {
        return Err(line_error(
            2,
            format!(
                "declares {count} entries but the file holds {}",
                entries.len()
            ),
        ));
    }
    Ok(entries)
}

fn field<T: std::str::FromStr>(line: usize, name: &str, value: &str) -> Result<T, LineError> {
    value
        .parse()
        .map_err(|_| line_error(line, format!("{name} {value:?} is not a number")))
}

/// One `leader-epoch-checkpoint` entry: leader `epoch` started writing at
/// `start_offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EpochEntry {
    pub line: usize,
    pub epoch: i32,
    pub start_offset: i64,
}

pub fn parse_leader_epochs(text: &str) -> Result<Vec<EpochEntry>, LineError> {
    parse_checkpoint(text, 2)?
        .into_iter()
        .map(|(line, f)| {
            Ok(EpochEntry {
                line,
                epoch: field(line, "epoch", f[0])?,
                start_offset: field(line, "start offset", f[1])?,
            })
        })
        .collect()
}

/// Epochs and start offsets must both strictly increase: a new leader epoch starts
/// after every earlier one, and Kafka replaces an entry whose start offset a newer
/// epoch reuses.
pub fn check_leader_epochs(entries: &[EpochEntry]) -> Vec<LineError> {
    let mut problems = Vec::new();
    for pair in entries.windows(2) {
        let (prev, entry) = (pair[0], pair[1]);
        if entry.epoch < 0 || entry.epoch <= prev.epoch {
            problems.push(line_error(
                entry.line,
                format!(
                    "epoch {} does not increase (previous: {})",
                    entry.epoch, prev.epoch
                ),
            ));
        }
        if entry.start_offset <= prev.start_offset {
            problems.push(line_error(
                entry.line,
                format!(
                    "start offset {} of epoch {} does not increase (previous: {})",
                    entry.start_offset, entry.epoch, prev.start_offset
                ),
            ));
        }
    }
    if let Some(first) = entries.first() {
        if first.epoch < 0 || first.start_offset < 0 {
            problems.push(line_error(
                first.line,
                format!(
                    "negative epoch or start offset: {} {}",
                    first.epoch, first.start_offset
                ),
            ));
        }
    }
    problems
}

/// One `recovery-point-offset-checkpoint` entry: everything below `offset` in
/// `topic`-`partition` is known to be flushed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoveryPoint {
    pub line: usize,
    pub topic: String,
    pub partition: u32,
    pub offset: i64,
}

pub fn parse_recovery_points(text: &str) -> Result<Vec<RecoveryPoint>, LineError> {
    parse_checkpoint(text, 3)?
        .into_iter()
        .map(|(line, f)| {
            Ok(RecoveryPoint {
                line,
                topic: f[0].to_owned(),
                partition: field(line, "partition", f[1])?,
                offset: field(line, "offset", f[2])?,
            })
        })
        .collect()
}

/// `meta.properties`, parsed by the engine's own parser.
pub fn parse_meta_properties(text: &str) -> Result<MetaProperties, LineError> {
    skiff_engine::data_dir::parse_meta_properties(text).map_err(|e| line_error(e.line, e.reason))
}

pub use skiff_engine::data_dir::MetaProperties;

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn leader_epochs_parse_and_must_increase() {
        let entries = parse_leader_epochs("0\n3\n0 0\n2 150\n5 900\n").unwrap();
        assert_eq!(entries.len(), 3);
        assert_eq!(
            entries[2],
            EpochEntry {
                line: 5,
                epoch: 5,
                start_offset: 900
            }
        );
        assert!(check_leader_epochs(&entries).is_empty());

        let bad = parse_leader_epochs("0\n3\n0 0\n2 150\n1 100\n").unwrap();
        let problems = check_leader_epochs(&bad);
        assert_eq!(problems.len(), 2);
        assert!(problems.iter().all(|p| p.line == 5));

        assert_eq!(parse_leader_epochs("1\n0\n").unwrap_err().line, 1);
        assert_eq!(parse_leader_epochs("0\n2\n0 0\n").unwrap_err().line, 2);
        assert_eq!(parse_leader_epochs("0\n1\n0 x\n").unwrap_err().line, 3);
        assert_eq!(parse_leader_epochs("").unwrap_err().line, 0);
        assert!(parse_leader_epochs("0\n0\n").unwrap().is_empty());
    }

    #[test]
    fn recovery_points_parse() {
        let points = parse_recovery_points("0\n1\nmy-topic 3 1200\n").unwrap();
        assert_eq!(points[0].topic, "my-topic");
        assert_eq!((points[0].partition, points[0].offset), (3, 1200));
        assert!(parse_recovery_points("0\n1\nt 3\n").is_err());
    }

    #[test]
    fn meta_properties_parse() {
        let meta =
            parse_meta_properties("#written by skiff\nversion=1\nnode.id=3\ncluster.id=abc\n")
                .unwrap();
        assert_eq!(meta.node_id, 3);
        assert_eq!(meta.cluster_id, "abc");
        assert_eq!(
            parse_meta_properties("version=1\nnode.id=x\n")
                .unwrap_err()
                .line,
            2
        );
        assert!(parse_meta_properties("version=1\nnode.id=1\n").is_err());
    }
}
