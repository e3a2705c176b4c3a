#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Disk space and buffers follow the data (issue 15): a partition with one
//! small record holds a small reservation, a busy one grows to the configured
//! steps and keeps them across a roll, and a closed segment holds exactly its
//! data.

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use common::{batch, mutable, open, run};
use skiff_engine::{AppendMode, LogConfig, PartitionLog};

const LEADER: AppendMode = AppendMode::Leader { leader_epoch: 0 };
const KIB: u64 = 1024;

/// Bytes the filesystem allocated to `path`.
fn allocated(path: &Path) -> u64 {
    std::fs::metadata(path).unwrap().blocks() * 512
}

fn segment(dir: &Path, base: i64) -> std::path::PathBuf {
    dir.join(format!("{base:020}.log"))
}

/// Appends the `i`th batch of 16 records of 1,000 bytes and counts it.
async fn append_next(log: &mut PartitionLog, i: &mut u64) {
    log.append(mutable(&batch(*i, 16, 1_000, 1_000 + *i as i64)), LEADER)
        .await
        .unwrap();
    *i += 1;
}

/// The defaults: 512 KiB chunks, 32 MiB reservations at most.
fn config(segment_bytes: u64) -> LogConfig {
    LogConfig {
        segment_bytes,
        ..LogConfig::default()
    }
}

#[test]
fn one_small_record_reserves_a_small_step_not_the_full_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-0");
    run(move || async move {
        let mut log = open(&path, config(1 << 30)).await.unwrap();
        log.append(mutable(&batch(1, 1, 100, 1_000)), LEADER)
            .await
            .unwrap();
        log.flush().await.unwrap();
        let got = allocated(&segment(&path, 0));
        assert!(got > 0, "the record must be on disk");
        // One 64 KiB reservation (plus a filesystem block of slack), where a
        // fixed 32 MiB step used to be taken on the first write.
        assert!(got <= 68 * KIB, "{got} bytes allocated for one record");
    });
}

#[test]
fn reservations_grow_with_the_data_and_stay_within_twice_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-0");
    run(move || async move {
        let mut log = open(&path, config(1 << 30)).await.unwrap();
        let mut data = 0u64;
        let mut grew_past_min = false;
        for i in 0..1_500u64 {
            let b = batch(i, 16, 1_000, 1_000 + i as i64);
            data += b.len() as u64;
            log.append(mutable(&b), LEADER).await.unwrap();
            if i % 7 == 0 {
                log.flush().await.unwrap();
                let got = allocated(&segment(&path, 0));
                assert!(
                    got <= 2 * data + 68 * KIB,
                    "after {data} bytes of batches {got} bytes are allocated"
                );
                grew_past_min |= got > data + 256 * KIB;
            }
        }
        // A busy partition reserves ahead in steps larger than the first.
        assert!(
            grew_past_min,
            "reservations never grew past the first steps"
        );
    });
}

#[test]
fn a_roll_trims_the_closed_segment_and_the_next_keeps_the_grown_step() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-0");
    run(move || async move {
        let mut log = open(&path, config(8 << 20)).await.unwrap();
        let mut i = 0u64;
        while log.segment_count() < 2 {
            append_next(&mut log, &mut i).await;
        }
        log.flush().await.unwrap();
        let bases: Vec<i64> = log.segments().map(|s| s.base_offset()).collect();
        let closed = segment(&path, bases[0]);
        let size = std::fs::metadata(&closed).unwrap().len();
        assert!(size > 7 << 20, "the first segment holds {size} bytes");
        // Trimmed at the roll: the data rounded up to a block, plus a block or
        // two of the filesystem's own (ext4's extent tree).
        assert!(
            allocated(&closed) <= size.div_ceil(4 * KIB) * 4 * KIB + 8 * KIB,
            "a closed segment of {size} bytes keeps {} allocated",
            allocated(&closed)
        );
        // The new segment holds one batch yet reserved a step grown by the first
        // segment's 8 MiB, not the first 64 KiB again.
        let active = allocated(&segment(&path, bases[1]));
        assert!(
            active >= 1 << 20,
            "the next segment reserved only {active} bytes"
        );
    });
}

/// No reservation reaches past the segment's size limit: a segment rolls
/// before its data would, so space reserved beyond it was only ever trimmed
/// at the roll (a discard) and allocated again by the next segment.
#[test]
fn reservations_stop_at_the_segment_size() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-0");
    run(move || async move {
        let segment_bytes = 6 << 20;
        let mut log = open(&path, config(segment_bytes)).await.unwrap();
        let mut i = 0u64;
        while log.segment_count() < 2 {
            append_next(&mut log, &mut i).await;
            if log.segment_count() == 1 {
                log.flush().await.unwrap();
                let got = allocated(&segment(&path, 0));
                // The limit, plus a block or two of ext4's extent tree.
                assert!(
                    got <= segment_bytes + 8 * KIB,
                    "{got} bytes allocated to a segment limited to {segment_bytes}"
                );
            }
        }
    });
}

/// A commit gives back the append chunk a busy partition grew: once
/// everything appended is written out the partition holds at most one block
/// (its partial last one), however big its chunk had grown; appends go on
/// from that block, and the log reads back byte for byte as a log that was
/// never flushed half-way, from the cache-less disk path and after a reopen.
#[test]
fn a_commit_gives_back_the_append_chunk_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (path, control_path) = (dir.path().join("t-0"), dir.path().join("t-1"));
    run(move || async move {
        let mut log = common::open_uncached(&path, config(1 << 30)).await.unwrap();
        let mut control = common::open_uncached(&control_path, config(1 << 30))
            .await
            .unwrap();
        // About 700 KiB in 7 KiB batches: the chunk grows past its first size.
        for i in 0..100 {
            let b = batch(i, 7, 1000, 1_000);
            log.append(mutable(&b), LEADER).await.unwrap();
            control.append(mutable(&b), LEADER).await.unwrap();
        }
        let grown = log.append_buffer_bytes();
        assert!(
            grown >= 64 * KIB as usize,
            "holds {grown} bytes before the commit"
        );
        log.flush().await.unwrap();
        let kept = log.append_buffer_bytes();
        assert!(
            kept > 0 && kept <= 4 * KIB as usize,
            "holds {kept} bytes after the commit"
        );
        // Appends continue the partial block that was kept.
        for i in 100..110 {
            let b = batch(i, 3, 333, 2_000);
            log.append(mutable(&b), LEADER).await.unwrap();
            control.append(mutable(&b), LEADER).await.unwrap();
        }
        log.flush().await.unwrap();
        control.flush().await.unwrap();
        assert!(log.append_buffer_bytes() <= 4 * KIB as usize);
        let expected = common::read_all(&mut control, 0).await.concat();
        let read = common::read_all(&mut log, 0).await.concat();
        assert!(
            read == expected,
            "read {} bytes, the control {}",
            read.len(),
            expected.len()
        );
        log.close().await.unwrap();
        control.close().await.unwrap();
        let mut log = common::open_uncached(&path, config(1 << 30)).await.unwrap();
        let read = common::read_all(&mut log, 0).await.concat();
        assert!(
            read == expected,
            "after reopen: read {} bytes, the control {}",
            read.len(),
            expected.len()
        );
        log.close().await.unwrap();
    });
}
