//! Names in a data directory, as the engine writes them:
//!
//! ```text
//! <data dir>/meta.properties                    version, node.id, cluster.id, joined.cluster.id
//! <data dir>/<topic>-<partition>/               one directory per partition
//!     00000000000000000000.log                  segments, named by base offset
//!     00000000000000000000.index
//!     00000000000000000000.timeindex
//!     leader-epoch-checkpoint
//!     recovery-point-offset-checkpoint
//!     partition.metadata                        the topic's id (Kafka's format)
//! ```

use std::path::Path;

// The engine's own names, so the tools look for exactly what it writes.
pub use skiff_engine::checkpoint::{
    LEADER_EPOCH_FILE as LEADER_EPOCH_CHECKPOINT, RECOVERY_POINT_FILE as RECOVERY_POINT_CHECKPOINT,
};
pub use skiff_engine::segment::{
    INDEX_SUFFIX as INDEX_EXT, LOG_SUFFIX as LOG_EXT, TIME_INDEX_SUFFIX as TIME_INDEX_EXT,
    TXN_INDEX_SUFFIX as TXN_INDEX_EXT,
};

/// Per data directory: `version`, `node.id`, `cluster.id`.
pub const META_PROPERTIES: &str = "meta.properties";

/// Segment file names are the base offset zero-padded to this many digits.
pub const SEGMENT_NAME_DIGITS: usize = 20;

/// The base offset a segment file's name carries (`00000000000000000042.index` →
/// 42), whatever its extension. `None` if the name is not 20 digits and an extension.
pub fn segment_base_offset(path: &Path) -> Option<i64> {
    let stem = path.file_stem()?.to_str()?;
    path.extension()?;
    if stem.len() != SEGMENT_NAME_DIGITS || !stem.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    stem.parse().ok()
}

/// Splits a partition directory name `<topic>-<partition>` at its last '-'. Topic
/// names may themselves contain '-'; the partition is all digits.
pub fn parse_partition_dir_name(name: &str) -> Option<(&str, u32)> {
    let (topic, partition) = name.rsplit_once('-')?;
    if topic.is_empty() || partition.is_empty() || !partition.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((topic, partition.parse().ok()?))
}

/// The segment file name for `base_offset` with extension `ext`.
pub fn segment_file_name(base_offset: i64, ext: &str) -> String {
    format!("{base_offset:0width$}.{ext}", width = SEGMENT_NAME_DIGITS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segment_names() {
        assert_eq!(
            segment_base_offset(Path::new("/d/t-0/00000000000000000042.log")),
            Some(42)
        );
        assert_eq!(
            segment_base_offset(Path::new("00000000000000000000.timeindex")),
            Some(0)
        );
        assert_eq!(segment_base_offset(Path::new("42.log")), None);
        assert_eq!(
            segment_base_offset(Path::new("0000000000000000004x.log")),
            None
        );
        assert_eq!(segment_base_offset(Path::new("00000000000000000042")), None);
        assert_eq!(
            segment_base_offset(Path::new("99999999999999999999.log")),
            None
        );
        assert_eq!(segment_file_name(42, "log"), "00000000000000000042.log");
    }

    #[test]
    fn partition_dir_names() {
        assert_eq!(parse_partition_dir_name("orders-3"), Some(("orders", 3)));
        assert_eq!(
            parse_partition_dir_name("my-topic-12"),
            Some(("my-topic", 12))
        );
        assert_eq!(parse_partition_dir_name("orders-"), None);
        assert_eq!(parse_partition_dir_name("-1"), None);
        assert_eq!(parse_partition_dir_name("orders-1.deleted"), None);
        assert_eq!(parse_partition_dir_name("orders"), None);
    }
}
