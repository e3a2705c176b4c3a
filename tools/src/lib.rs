//! skiff-tools: offline inspection of skiff data directories.
//!
//! What it is: readers for what the engine leaves on disk, sharing the engine's own
//! parsers (`skiff_engine::batch`, `skiff_engine::segment::index`) so the tools and
//! the broker cannot disagree about a byte:
//! - [`dump_log`]: kafka-dump-log style listing of a `.log` segment's batches and,
//!   with `deep`, their records;
//! - [`dump_index`]: listing of `.index` / `.timeindex` entries, each checked
//!   against the sibling `.log`;
//! - [`dump_metadata`]: the controller's metadata log (`__cluster_metadata-0/`):
//!   snapshot summary, then every frame and metadata record, read with the
//!   controller's own frame reader and batch decoder;
//! - [`verify`]: every check the layout promises, over a partition directory or a
//!   whole data directory, one line per problem.
//!
//! What it is not: a repair tool. Nothing here writes to a data directory; recovery
//! (in the engine) is what truncates torn tails and rebuilds indexes. It is also not
//! meant to run against a directory a live broker is appending to: the active
//! segment may change under it.
//!
//! Bounds: files are read with `std::fs`, one batch at a time (a batch is never
//! larger than its file, and the whole log is never held in memory); per segment,
//! memory grows only with its index entries (one per `index.interval.bytes` of log).
//! Decompressed records are capped at [`RECORDS_BYTES_MAX`]. Problems are written
//! out as they are found, not collected.

use std::io;
use std::path::PathBuf;

pub mod checkpoint;
pub mod dump_index;
pub mod dump_log;
pub mod dump_metadata;
pub mod index_check;
pub mod layout;
pub mod log_scan;
pub mod verify;

/// Upper bound on one batch's decompressed records section when decoding records
/// (`dump-log --deep`, `verify --deep`): a hostile or corrupt payload cannot make
/// the tool allocate more than this.
pub const RECORDS_BYTES_MAX: usize = 256 * 1024 * 1024;

/// Failures that stop a tool: the input cannot be read at all, or the output cannot
/// be written. Damaged *contents* are never errors: they are reported as problems.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },

    #[error("{}: {source}", path.display())]
    Index {
        path: PathBuf,
        source: skiff_engine::segment::index::IndexError,
    },

    #[error("{}: not a segment file name (expected a 20-digit base offset, e.g. 00000000000000000000.{expected_ext})", path.display())]
    NotSegmentName {
        path: PathBuf,
        expected_ext: &'static str,
    },

    #[error("{}: neither a partition directory (no .log segments or checkpoints, name not <topic>-<partition>) nor a data directory (no meta.properties, no partition directories)", path.display())]
    NotDataDir { path: PathBuf },

    #[error("{}: no metadata log here (no __cluster_metadata-0/ with raft.log or snapshot, and neither file in this directory)", path.display())]
    NotMetadataDir { path: PathBuf },

    #[error("writing output: {0}")]
    Output(#[from] io::Error),
}

impl ToolError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: io::Error) -> ToolError {
        ToolError::Io {
            path: path.into(),
            source,
        }
    }

    /// The reader of our output went away (`skiff-tools dump-log x | head`): not a
    /// failure worth a message.
    pub fn is_broken_pipe(&self) -> bool {
        matches!(self, ToolError::Output(e) if e.kind() == io::ErrorKind::BrokenPipe)
    }
}

/// Key and value bytes for display: as text when they are valid UTF-8 without
/// control characters, otherwise as `0x`-prefixed hex.
pub fn show_bytes(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text) if !text.chars().any(char::is_control) => text.to_owned(),
        _ => {
            let mut out = String::with_capacity(2 + bytes.len() * 2);
            out.push_str("0x");
            for b in bytes {
                out.push(HEX[usize::from(b >> 4)]);
                out.push(HEX[usize::from(b & 0x0f)]);
            }
            out
        }
    }
}

const HEX: [char; 16] = [
    '0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'a', 'b', 'c', 'd', 'e', 'f',
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn show_bytes_prefers_text() {
        assert_eq!(show_bytes(b"hello world"), "hello world");
        assert_eq!(show_bytes(b""), "");
        assert_eq!(show_bytes(b"a\nb"), "0x610a62");
        assert_eq!(show_bytes(&[0xff, 0x00]), "0xff00");
        assert_eq!(show_bytes("zürich".as_bytes()), "zürich");
    }
}
