//! `verify` and the dumps against partitions the engine itself wrote: the tools
//! and the writer must agree on every byte of the layout. The corruption tests
//! damage such a partition the three ways a disk does (torn tail, garbage after the
//! data, a flipped bit in flushed data) and check both that `verify` reports it and
//! that the engine's recovery does the right thing.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

mod common;

use bytes::BytesMut;
use common::{describe, skiff_tools};
use glommio::{LocalExecutorBuilder, Placement};
use skiff_engine::batch::BatchBuilder;
use skiff_engine::batch_cache::BatchCache;
use skiff_engine::log::AppendMode;
use skiff_engine::{LogConfig, PartitionLog};

/// Small segments and a dense index, so a few hundred batches make several of each.
fn config() -> LogConfig {
    LogConfig {
        segment_bytes: 16 * 1024,
        index_interval_bytes: 512,
        preallocate_step_bytes: 64 * 1024,
        append_chunk_bytes: 8 * 1024,
        ..LogConfig::default()
    }
}

/// Appends 300 batches of 3 records (leader epoch 0, then 2 from the 150th batch);
/// closes the log cleanly when `close`, else only flushes it (the active segment
/// stays preallocated with its index unwritten, as after a crash).
fn write_partition(dir: PathBuf, close: bool) {
    LocalExecutorBuilder::new(Placement::Unbound)
        .spawn(move || async move {
            let mut log = PartitionLog::open(&dir, "events", 0, config(), BatchCache::new(1 << 20))
                .await
                .unwrap();
            for i in 0..300i64 {
                let mut builder = BatchBuilder::new();
                for r in 0..3 {
                    let key = format!("key-{i}-{r}");
                    builder.push(1_000 + i, Some(key.as_bytes()), Some(&[i as u8; 40]), &[]);
                }
                let batch = BytesMut::from(&builder.build().unwrap()[..]);
                let leader_epoch = if i < 150 { 0 } else { 2 };
                log.append(batch, AppendMode::Leader { leader_epoch })
                    .await
                    .unwrap();
            }
            if close {
                log.close().await.unwrap();
            } else {
                log.flush().await.unwrap();
                log.checkpoint_recovery_point().await.unwrap();
            }
        })
        .expect("spawn executor")
        .join()
        .expect("executor");
}

fn segment_files(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .collect();
    files.sort();
    files
}

fn check_written_partition(close: bool) {
    let tmp = tempfile::tempdir().unwrap();
    let partition = tmp.path().join("events-0");
    write_partition(partition.clone(), close);
    let logs = segment_files(&partition, "log");
    assert!(logs.len() > 2, "expected several segments: {logs:?}");

    let out = skiff_tools(&["verify", partition.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.starts_with("OK: 1 partitions, "), "{text}");
    assert!(text.contains(" 300 batches, 900 records, "), "{text}");

    for (command, ext) in [
        ("dump-log", "log"),
        ("dump-index", "index"),
        ("dump-timeindex", "timeindex"),
    ] {
        for file in segment_files(&partition, ext) {
            let out = skiff_tools(&[command, file.to_str().unwrap()]);
            assert_eq!(
                out.status.code(),
                Some(0),
                "{command} {}: {}",
                file.display(),
                describe(&out)
            );
        }
    }
}

#[test]
fn cleanly_closed_partition_verifies() {
    check_written_partition(true);
}

#[test]
fn flushed_but_not_closed_partition_verifies() {
    check_written_partition(false);
}

/// Runs `f` on a glommio executor and returns its result.
fn on_executor<T: Send + 'static, Fut: std::future::Future<Output = T> + 'static>(
    f: impl FnOnce() -> Fut + Send + 'static,
) -> T {
    LocalExecutorBuilder::new(Placement::Unbound)
        .spawn(f)
        .expect("spawn executor")
        .join()
        .expect("executor")
}

/// Reopens the partition with the engine: `Ok((log end offset, batches read))`,
/// after appending one more batch to prove the log is writable; or the open error.
fn reopen(dir: PathBuf) -> Result<(i64, usize), String> {
    on_executor(move || async move {
        let mut log = PartitionLog::open(&dir, "events", 0, config(), BatchCache::new(0))
            .await
            .map_err(|e| e.to_string())?;
        let end = log.log_end_offset();
        let mut batches = 0;
        let mut offset = 0;
        while offset < end {
            let r = log.read(offset, 1 << 20, i64::MAX).await.unwrap();
            batches += r.batches.len();
            offset = r.next_offset;
        }
        let info = log
            .append(
                BytesMut::from(&after_recovery_batch()[..]),
                AppendMode::Leader { leader_epoch: 2 },
            )
            .await
            .unwrap();
        assert_eq!(
            info.base_offset, end,
            "appends continue at the recovered log end"
        );
        log.close().await.unwrap();
        Ok((end, batches))
    })
}

fn after_recovery_batch() -> bytes::Bytes {
    let mut builder = BatchBuilder::new();
    builder.push(5_000, Some(b"after"), Some(b"recovery"), &[]);
    builder.build().unwrap()
}

fn verify(dir: &Path) -> (Option<i32>, String) {
    let out = skiff_tools(&["verify", dir.to_str().unwrap()]);
    (out.status.code(), describe(&out))
}

fn last_segment(dir: &Path) -> PathBuf {
    segment_files(dir, "log").pop().unwrap()
}

fn append_bytes(path: &Path, bytes: &[u8]) {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new().append(true).open(path).unwrap();
    f.write_all(bytes).unwrap();
}

#[test]
fn torn_tail_is_reported_and_cut_on_recovery() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("events-0");
    write_partition(dir.clone(), true);
    let log = last_segment(&dir);
    let clean_len = std::fs::metadata(&log).unwrap().len();
    // The first 100 bytes of a valid batch: a write the crash cut short.
    let mut builder = BatchBuilder::new().base_offset(900);
    builder.push(9_000, Some(b"k"), Some(&[7u8; 300]), &[]);
    append_bytes(&log, &builder.build().unwrap()[..100]);

    let (code, report) = verify(&dir);
    assert_eq!(code, Some(1), "{report}");
    assert!(
        report.contains(&format!("position {clean_len} offset 900")),
        "{report}"
    );

    assert_eq!(reopen(dir.clone()), Ok((900, 300)));
    let (code, report) = verify(&dir);
    assert_eq!(
        code,
        Some(0),
        "after recovery the partition is clean: {report}"
    );
}

#[test]
fn garbage_after_the_data_is_reported_and_cut_on_recovery() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("events-0");
    write_partition(dir.clone(), true);
    let log = last_segment(&dir);
    let clean_len = std::fs::metadata(&log).unwrap().len();
    append_bytes(
        &log,
        b"\x13\x37 not a record batch, just junk that landed after the data",
    );

    let (code, report) = verify(&dir);
    assert_eq!(code, Some(1), "{report}");
    assert!(
        report.contains(&format!("position {clean_len} offset 900")),
        "{report}"
    );
    assert!(report.contains("tail"), "{report}");

    assert_eq!(reopen(dir.clone()), Ok((900, 300)));
    assert_eq!(
        std::fs::metadata(&log).unwrap().len(),
        clean_len + after_recovery_batch().len() as u64,
        "junk cut, one batch appended"
    );
    let (code, report) = verify(&dir);
    assert_eq!(code, Some(0), "{report}");
}

#[test]
fn flipped_bit_in_flushed_data_keeps_the_partition_offline() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("events-0");
    // Flushed, then a crash: recovery scans the last segment. (After a clean
    // close it loads that segment from its indexes, as every closed segment,
    // and damage there is for `verify` and the scrubber to find.)
    write_partition(dir.clone(), false);
    let log = last_segment(&dir);
    let mut bytes = std::fs::read(&log).unwrap();
    // A value byte of the second batch of the last segment.
    let first = skiff_engine::batch::BatchHeader::parse(&bytes).unwrap();
    let second_at = first.total_len();
    let second = skiff_engine::batch::BatchHeader::parse(&bytes[second_at..]).unwrap();
    bytes[second_at + second.total_len() - 5] ^= 0x10;
    std::fs::write(&log, &bytes).unwrap();
    let name = log.file_name().unwrap().to_str().unwrap().to_string();

    let (code, report) = verify(&dir);
    assert_eq!(code, Some(1), "{report}");
    let expected = format!("position {second_at} offset {}", second.base_offset);
    assert!(
        report.contains(&name) && report.contains(&expected),
        "{report}"
    );

    let err = reopen(dir.clone()).unwrap_err();
    assert!(err.contains(&name), "{err}");
    assert!(
        err.contains(&format!(
            "position {second_at} (offset {})",
            second.base_offset
        )),
        "{err}"
    );
    assert!(err.contains("offline"), "{err}");
    // Nothing was cut: the damaged bytes are still there for an operator.
    assert_eq!(std::fs::read(&log).unwrap(), bytes);
}

/// Transactions the engine indexed itself: `verify` recomputes every
/// segment's aborted transactions from the markers and must find the same
/// `.txnindex` entries (producer, first and last offset, and the LSO the log
/// had when each ABORT was written), and `dump-txnindex` reads each file.
#[test]
fn a_transactional_partition_the_engine_wrote_verifies() {
    use skiff_engine::batch::{marker_batch, EndTxnMarker};
    let tmp = tempfile::tempdir().unwrap();
    let partition = tmp.path().join("orders-0");
    let dir = partition.clone();
    on_executor(move || async move {
        let mut log = PartitionLog::open(&dir, "orders", 0, config(), BatchCache::new(1 << 20))
            .await
            .unwrap();
        let mut seq = [0i32; 3];
        for i in 0..300usize {
            let pid = 50 + (i % 3) as i64;
            let batch = match (i / 3) % 5 {
                // Each producer writes twice, then its marker: aborts and
                // commits interleave, transactions stay open across rolls.
                0 | 1 => {
                    let mut b = BatchBuilder::new()
                        .producer(pid, 0, seq[i % 3])
                        .transactional(true);
                    seq[i % 3] += 2;
                    b.push(1_000, Some(b"k"), Some(&[1u8; 300]), &[]);
                    b.push(1_000, Some(b"k"), Some(&[2u8; 300]), &[]);
                    b.build().unwrap()
                }
                2 => {
                    let m = EndTxnMarker {
                        commit: i % 2 == 0,
                        coordinator_epoch: 0,
                    };
                    marker_batch(pid, 0, m, 2_000).unwrap()
                }
                _ => {
                    let mut b = BatchBuilder::new();
                    b.push(1_000, None, Some(&[3u8; 500]), &[]);
                    b.build().unwrap()
                }
            };
            log.append(
                BytesMut::from(&batch[..]),
                AppendMode::Leader { leader_epoch: 0 },
            )
            .await
            .unwrap();
        }
        assert!(!log.aborted_transactions(0, i64::MAX).is_empty());
        log.close().await.unwrap();
    });
    let indexes = segment_files(&partition, "txnindex");
    assert!(
        indexes.len() > 2,
        "expected several .txnindex files: {indexes:?}"
    );
    let out = skiff_tools(&["verify", partition.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    for file in indexes {
        let out = skiff_tools(&["dump-txnindex", file.to_str().unwrap()]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}: {}",
            file.display(),
            describe(&out)
        );
    }
}

/// A partition whose active segment reuses a file retention removed, left
/// as a crash leaves it (flushed, not closed): past its data lie the file's
/// previous batches. `verify` calls that the recycled tail (a `.recycled`
/// marker says so), `dump-log` names it, and recovery cuts it. Without the
/// marker the same bytes are reported: the marker is what tells them apart.
#[test]
fn a_recycled_active_segment_verifies_and_recovers() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("events-0");
    let dir2 = dir.clone();
    let end: i64 = on_executor(move || async move {
        let config = LogConfig {
            retention_ms: None,
            retention_bytes: Some(32 * 1024),
            ..config()
        };
        let mut log = PartitionLog::open(&dir2, "events", 0, config, BatchCache::new(1 << 20))
            .await
            .unwrap();
        for i in 0..5_000i64 {
            let mut builder = BatchBuilder::new();
            builder.push(1_000 + i, Some(b"key"), Some(&[i as u8; 200]), &[]);
            let batch = BytesMut::from(&builder.build().unwrap()[..]);
            log.append(batch, AppendMode::Leader { leader_epoch: 0 })
                .await
                .unwrap();
            if i % 10 == 0 {
                let leo = log.log_end_offset();
                log.apply_retention(0, leo).await.unwrap();
            }
            let active = log.segments().last().unwrap();
            let marker = dir2.join(format!("{:020}.recycled", active.base_offset()));
            if marker.exists() && active.size() > 0 {
                break;
            }
        }
        log.flush().await.unwrap();
        log.checkpoint_recovery_point().await.unwrap();
        log.log_end_offset()
    });
    let active = last_segment(&dir);
    let marker = active.with_extension("recycled");
    assert!(marker.exists(), "no roll reused a file");

    let (code, report) = verify(&dir);
    assert_eq!(code, Some(0), "{report}");
    let out = skiff_tools(&["dump-log", active.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("recycled file's previous contents"), "{text}");

    let saved = std::fs::read(&marker).unwrap();
    std::fs::remove_file(&marker).unwrap();
    let (code, report) = verify(&dir);
    assert_eq!(
        code,
        Some(1),
        "without the marker the tail is suspect: {report}"
    );
    std::fs::write(&marker, saved).unwrap();

    let dir2 = dir.clone();
    let reopened = on_executor(move || async move {
        let log = PartitionLog::open(&dir2, "events", 0, config(), BatchCache::new(0))
            .await
            .unwrap();
        let end = log.log_end_offset();
        log.close().await.unwrap();
        end
    });
    assert_eq!(
        reopened, end,
        "recovery keeps every flushed batch, nothing more"
    );
    assert!(!marker.exists());
    let (code, report) = verify(&dir);
    assert_eq!(code, Some(0), "{report}");
}
