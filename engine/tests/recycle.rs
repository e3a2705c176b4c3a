#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Segment recycling: files retention removes become later segments' files,
//! and what they held before never passes for data (see `segment`'s module
//! docs).

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use skiff_engine::batch::BatchHeader;
use skiff_engine::segment::{free_path, segment_path, LOG_SUFFIX, RECYCLED_SUFFIX};
use skiff_engine::{AppendMode, LogConfig, PartitionLog};

const LEADER: AppendMode = AppendMode::Leader { leader_epoch: 1 };

fn free_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_str().unwrap().ends_with(".log.free"))
        .collect();
    v.sort();
    v
}

/// Appends one ~2 KiB batch for each `n`.
async fn fill(log: &mut PartitionLog, ns: std::ops::Range<u64>) {
    for n in ns {
        log.append(mutable(&batch(n, 1, 2000, 0)), LEADER)
            .await
            .unwrap();
    }
}

/// The batch bytes past the stamped header fields (base offset, length, epoch).
fn body(b: &Bytes) -> &[u8] {
    &b[16..]
}

/// Retention keeps removed segments' files; the next rolls write over them;
/// reads, a crash (no close) and the recovery after it see exactly the
/// appended batches; an unused free file goes at the pass after.
#[test]
fn retention_keeps_segment_files_and_rolls_reuse_them() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("t-0");
    run(move || async move {
        let config = LogConfig {
            retention_ms: None,
            retention_bytes: Some(128 * 1024),
            ..small_config()
        };
        let mut log = open(&dir, config.clone()).await.unwrap();
        let mut sent: Vec<Bytes> = Vec::new();
        // ~2 KiB batches, 64 KiB segments: about 30 batches a segment.
        let mut append = |n: u64| {
            let b = batch(n, 1, 2000, n as i64);
            sent.push(b.clone());
            b
        };
        for n in 0..200 {
            log.append(mutable(&append(n)), LEADER).await.unwrap();
        }
        let leo = log.log_end_offset();
        let out = log.apply_retention(0, leo).await.unwrap();
        assert!(out.deleted_segments >= 2, "{out:?}");
        assert_eq!(
            out.recycled_segments, out.deleted_segments,
            "the log rolled more often than retention removed: every file is kept"
        );
        let free = free_files(&dir);
        assert_eq!(free.len(), out.recycled_segments);
        assert_eq!(log.free_segment_files(), free.len());
        let free_bytes: u64 = free
            .iter()
            .map(|p| std::fs::metadata(p).unwrap().len())
            .sum();
        assert_eq!(log.free_segment_bytes(), free_bytes);
        let reused_inode = std::fs::metadata(&free[0]).unwrap().ino();
        let reused_size = std::fs::metadata(&free[0]).unwrap().len();
        assert!(reused_size > 0);

        // The next roll takes the oldest free file.
        let segments_before = log.segment_count();
        let mut n = 200;
        while log.segment_count() == segments_before {
            log.append(mutable(&append(n)), LEADER).await.unwrap();
            n += 1;
        }
        let active = *log
            .segments()
            .last()
            .map(|s| s.base_offset())
            .as_ref()
            .unwrap();
        let active_log = segment_path(&dir, active, LOG_SUFFIX);
        assert_eq!(std::fs::metadata(&active_log).unwrap().ino(), reused_inode);
        assert!(segment_path(&dir, active, RECYCLED_SUFFIX).exists());
        assert_eq!(free_files(&dir).len(), free.len() - 1);
        // A few batches into it: less than the old data, which stays behind.
        for _ in 0..3 {
            log.append(mutable(&append(n)), LEADER).await.unwrap();
            n += 1;
        }
        log.flush().await.unwrap();
        let start = log.log_start_offset();
        let end = log.log_end_offset();
        let expect: Vec<Bytes> = sent[start as usize..end as usize].to_vec();
        let got = read_all(&mut log, start).await;
        assert_eq!(got.len(), expect.len());
        for (i, (g, e)) in got.iter().zip(&expect).enumerate() {
            assert_eq!(BatchHeader::parse(g).unwrap().base_offset, start + i as i64);
            assert_eq!(body(g), body(e), "offset {}", start + i as i64);
        }
        assert!(
            std::fs::metadata(&active_log).unwrap().len() >= reused_size,
            "the old data is still behind the new"
        );

        // A crash: no close, nothing trimmed. Recovery ends the log at the
        // new data, trims the old, and drops the marker.
        drop(log);
        let mut log = open(&dir, config.clone()).await.unwrap();
        assert_eq!(log.log_end_offset(), end);
        assert_eq!(log.log_start_offset(), start);
        let got = read_all(&mut log, start).await;
        assert_eq!(got.len(), expect.len());
        for (g, e) in got.iter().zip(&expect) {
            assert_eq!(body(g), body(e));
        }
        assert!(!segment_path(&dir, active, RECYCLED_SUFFIX).exists());
        assert!(std::fs::metadata(&active_log).unwrap().len() < reused_size);
        // Reopened, the other free file is still there for the next roll.
        assert_eq!(log.free_segment_files(), free.len() - 1);

        // Passes without a roll: a file found at open is stamped by the
        // first, kept within the time limit, freed after it.
        let leo = log.log_end_offset();
        let ttl = skiff_engine::log::FREE_FILE_TTL_MS;
        log.apply_retention(1_000, leo).await.unwrap();
        log.apply_retention(1_000 + ttl, leo).await.unwrap();
        assert_eq!(log.free_segment_files(), free.len() - 1);
        log.apply_retention(1_001 + ttl, leo).await.unwrap();
        assert_eq!(free_files(&dir), Vec::<std::path::PathBuf>::new());
        assert_eq!(log.free_segment_files(), 0);
        log.close().await.unwrap();
    });
}

/// With `recycle_segments` off retention frees every file it removes, and
/// the files kept while it was on go at the next pass.
#[test]
fn recycling_off_frees_every_removed_segment() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("t-0");
    run(move || async move {
        let config = LogConfig {
            retention_ms: None,
            retention_bytes: Some(128 * 1024),
            recycle_segments: false,
            ..small_config()
        };
        // Kept while recycling was on.
        let mut log = open(
            &dir,
            LogConfig {
                recycle_segments: true,
                ..config.clone()
            },
        )
        .await
        .unwrap();
        fill(&mut log, 0..200).await;
        let leo = log.log_end_offset();
        assert!(log.apply_retention(0, leo).await.unwrap().recycled_segments > 0);
        assert!(!free_files(&dir).is_empty());
        log.close().await.unwrap();

        let mut log = open(&dir, config).await.unwrap();
        fill(&mut log, 200..400).await;
        let leo = log.log_end_offset();
        let out = log.apply_retention(0, leo).await.unwrap();
        assert!(out.deleted_segments >= 2);
        assert_eq!(out.recycled_segments, 0);
        assert!(free_files(&dir).is_empty());
        assert_eq!(log.free_segment_files(), 0);
        log.close().await.unwrap();
    });
}

/// A free file is reused only by a segment based at or past its bound: here
/// one holds batches at exactly the offsets the log will need next (the log
/// was cut below them), so taking it would let recovery read its leftovers
/// after a crash as the log's own batches.
#[test]
fn a_free_file_is_never_reused_below_its_bound() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("t-0");
    run(move || async move {
        // Every batch rolls the segment: one batch per segment.
        let config = LogConfig {
            segment_ms: Some(Duration::ZERO),
            ..small_config()
        };
        // Batches of exactly one file system block: a write ends on a block
        // boundary, with no zero padding to cover what follows it.
        let value_len = (3000..4096)
            .find(|&v| batch(11, 1, v, 0).len() == 4096)
            .unwrap();
        let mut log = open(&dir, config.clone()).await.unwrap();
        for n in 10..20u64 {
            log.append(mutable(&batch(n, 1, value_len, 0)), LEADER)
                .await
                .unwrap();
        }
        log.close().await.unwrap();
        // Batches 3..7 back to back, as a file that held them would.
        let mut old = Vec::new();
        for base in 3..7 {
            old.extend(std::fs::read(segment_path(&dir, base, LOG_SUFFIX)).unwrap());
        }
        std::fs::write(free_path(&dir, 7), &old).unwrap();

        let mut log = open(&dir, config.clone()).await.unwrap();
        assert_eq!(log.free_segment_files(), 1);
        log.truncate_to(3).await.unwrap();
        // The same length as the old batch 3, other bytes: a file reused at
        // base 3 would hold it, then the old batches 4, 5 and 6 whole.
        let new = batch(21, 1, value_len, 0);
        let info = log.append(mutable(&new), LEADER).await.unwrap();
        assert_eq!(info.base_offset, 3);
        assert_eq!(log.free_segment_files(), 1, "bound 7 > base 3: not taken");
        log.flush().await.unwrap();
        drop(log);

        let mut log = open(&dir, config).await.unwrap();
        assert_eq!(log.log_end_offset(), 4, "the old batches are not the log's");
        let got = read_all(&mut log, 3).await;
        assert_eq!(got.len(), 1);
        assert_eq!(body(&got[0]), body(&new));
        log.close().await.unwrap();
    });
}
