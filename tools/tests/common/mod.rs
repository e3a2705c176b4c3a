//! A small partition built with the engine's `BatchBuilder` and index types, shared
//! by the integration tests.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use bytes::Bytes;
use skiff_engine::batch::{BatchBuilder, BatchHeader};
use skiff_engine::segment::index::{OffsetIndex, TimeIndex};

pub const TOPIC_DIR: &str = "orders-0";

pub fn segment_name(base_offset: i64, ext: &str) -> String {
    format!("{base_offset:020}.{ext}")
}

/// One batch of `records` records at `base_offset`: keys `key-N`, values `value-N`,
/// one header `trace` on each record; timestamps 1_000 + offset.
pub fn batch(base_offset: i64, records: i64, epoch: i32) -> Bytes {
    let mut builder = BatchBuilder::new()
        .base_offset(base_offset)
        .partition_leader_epoch(epoch);
    for offset in base_offset..base_offset + records {
        let key = format!("key-{offset}");
        let value = format!("value-{offset}");
        builder.push(
            1_000 + offset,
            Some(key.as_bytes()),
            Some(value.as_bytes()),
            &[(b"trace".as_slice(), Some(b"t1".as_slice()))],
        );
    }
    builder.build().unwrap()
}

/// A segment written the way the engine writes one: batches back to back, an index
/// entry (the batch's last offset, like Kafka) for every batch after the first, a
/// time index entry whenever the max timestamp grows. Returns the batch positions.
pub fn write_segment(dir: &Path, base_offset: i64, batches: &[Bytes]) -> Vec<u64> {
    let mut log = Vec::new();
    let mut positions = Vec::new();
    let mut index = OffsetIndex::default();
    let mut time_index = TimeIndex::default();
    for batch in batches {
        let header = BatchHeader::parse(batch).unwrap();
        let last_relative = u32::try_from(header.last_offset() - base_offset).unwrap();
        if !log.is_empty() {
            index.push(last_relative, u32::try_from(log.len()).unwrap());
        }
        time_index.maybe_push(header.max_timestamp, last_relative);
        positions.push(log.len() as u64);
        log.extend_from_slice(batch);
    }
    std::fs::write(dir.join(segment_name(base_offset, "log")), log).unwrap();
    std::fs::write(dir.join(segment_name(base_offset, "index")), index.encode()).unwrap();
    std::fs::write(
        dir.join(segment_name(base_offset, "timeindex")),
        time_index.encode(),
    )
    .unwrap();
    positions
}

/// A data directory with one partition of two segments: offsets 0..10 in batches of
/// 3, 3, 4 (epoch 0, 0, 1), then 10..15 in batches of 2, 3 (epoch 1).
pub struct Fixture {
    _tmp: tempfile::TempDir,
    pub data_dir: PathBuf,
    pub partition: PathBuf,
    /// Batch positions in each segment.
    pub positions: [Vec<u64>; 2],
}

impl Fixture {
    pub fn new() -> Fixture {
        let tmp = tempfile::tempdir().unwrap();
        let data_dir = tmp.path().join("data");
        let partition = data_dir.join(TOPIC_DIR);
        std::fs::create_dir_all(&partition).unwrap();
        std::fs::write(
            data_dir.join("meta.properties"),
            "version=1\nnode.id=1\ncluster.id=skiff-test\n",
        )
        .unwrap();
        let first = write_segment(
            &partition,
            0,
            &[batch(0, 3, 0), batch(3, 3, 0), batch(6, 4, 1)],
        );
        let second = write_segment(&partition, 10, &[batch(10, 2, 1), batch(12, 3, 1)]);
        std::fs::write(
            partition.join("leader-epoch-checkpoint"),
            "0\n2\n0 0\n1 6\n",
        )
        .unwrap();
        std::fs::write(
            partition.join("recovery-point-offset-checkpoint"),
            "0\n1\norders 0 10\n",
        )
        .unwrap();
        Fixture {
            _tmp: tmp,
            data_dir,
            partition,
            positions: [first, second],
        }
    }

    pub fn file(&self, base_offset: i64, ext: &str) -> PathBuf {
        self.partition.join(segment_name(base_offset, ext))
    }

    pub fn file_str(&self, base_offset: i64, ext: &str) -> String {
        self.file(base_offset, ext).display().to_string()
    }

    pub fn modify(&self, base_offset: i64, ext: &str, f: impl FnOnce(&mut Vec<u8>)) {
        let path = self.file(base_offset, ext);
        let mut bytes = std::fs::read(&path).unwrap();
        f(&mut bytes);
        std::fs::write(&path, bytes).unwrap();
    }
}

/// Runs the built `skiff-tools` binary.
pub fn skiff_tools(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_skiff-tools"))
        .args(args)
        .output()
        .expect("run skiff-tools")
}

/// Exit status and both streams, for assertion messages.
pub fn describe(output: &Output) -> String {
    format!(
        "status {:?}\n--- stdout\n{}--- stderr\n{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}
