#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Partition log behaviour on real files through io_uring.

mod common;

use common::*;
use proptest::prelude::*;
use skiff_engine::batch::{BatchHeader, BatchScanner};
use skiff_engine::{AppendMode, LogError};

const LEADER: AppendMode = AppendMode::Leader { leader_epoch: 3 };

#[test]
fn append_read_roll_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-0");
    run(move || async move {
        let mut log = open(&path, small_config()).await.unwrap();
        let mut sent = Vec::new();
        for i in 0..200u64 {
            let b = batch(
                i,
                1 + (i % 5) as usize,
                100 + (i as usize * 37) % 900,
                1000 + i as i64 * 10,
            );
            let info = log.append(mutable(&b), LEADER).await.unwrap();
            assert_eq!(
                info.base_offset,
                sent.iter()
                    .map(|(_, n): &(bytes::Bytes, i64)| *n)
                    .sum::<i64>()
            );
            sent.push((b, 1 + (i % 5) as i64));
        }
        assert!(log.segments().count() > 3, "small segment.bytes must roll");
        // Every roll is timed (`skiff_log_roll_duration_seconds`): this
        // executor's thread ran no other log.
        let rolls = skiff_engine::stats::local().snapshot().roll;
        assert_eq!(rolls.count(), log.segments().count() as u64 - 1);
        assert!(rolls.sum_ns > 0);
        let leo = log.log_end_offset();
        let got = read_all(&mut log, 0).await;
        assert_eq!(got.len(), sent.len());
        let mut next = 0;
        for (g, (s, n)) in got.iter().zip(&sent) {
            let h = BatchHeader::parse(g).unwrap();
            assert_eq!(h.base_offset, next);
            assert_eq!(h.partition_leader_epoch, 3);
            assert_eq!(&g[61..], &s[61..], "payload byte-exact");
            skiff_engine::batch::crc_matches(g).unwrap();
            next += n;
        }
        log.close().await.unwrap();

        // Reopen: every read now comes from disk (the cache is empty).
        let mut log = open_uncached(&path, small_config()).await.unwrap();
        assert_eq!(log.log_end_offset(), leo);
        let again = read_all(&mut log, 0).await;
        assert_eq!(again, got);
        // A read from the middle of a batch returns that whole batch.
        let r = log.read(7, 1, i64::MAX).await.unwrap();
        let h = BatchHeader::parse(&r.batches[0]).unwrap();
        assert!(h.base_offset <= 7 && h.last_offset() >= 7);
        assert_eq!(
            r.batches.len(),
            1,
            "max_bytes=1 still returns one whole batch"
        );
        // upper_bound stops before a batch at or past it.
        let r = log.read(0, 1 << 20, 3).await.unwrap();
        assert!(r
            .batches
            .iter()
            .all(|b| BatchHeader::parse(b).unwrap().base_offset < 3));
        assert!(matches!(
            log.read(leo + 1, 100, i64::MAX).await,
            Err(LogError::OffsetOutOfRange { .. })
        ));
        assert!(log
            .read(leo, 100, i64::MAX)
            .await
            .unwrap()
            .batches
            .is_empty());
        log.close().await.unwrap();
    });
}

#[test]
fn invalid_batches_are_rejected_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-0");
    run(move || async move {
        let mut log = open(&path, small_config()).await.unwrap();
        log.append(mutable(&batch(1, 2, 10, 0)), LEADER)
            .await
            .unwrap();
        let good = batch(2, 2, 10, 0);
        let mut bad_crc = mutable(&good);
        let last = bad_crc.len() - 1;
        bad_crc[last] ^= 1;
        assert!(matches!(
            log.append(bad_crc, LEADER).await,
            Err(LogError::InvalidBatch(_))
        ));
        let mut short = mutable(&good);
        short.truncate(good.len() - 3);
        assert!(matches!(
            log.append(short, LEADER).await,
            Err(LogError::InvalidBatch(_))
        ));
        let mut bad_magic = mutable(&good);
        bad_magic[16] = 1;
        assert!(matches!(
            log.append(bad_magic, LEADER).await,
            Err(LogError::InvalidBatch(_))
        ));
        let huge = batch(3, 1, 2 << 20, 0);
        assert!(matches!(
            log.append(mutable(&huge), LEADER).await,
            Err(LogError::BatchTooLarge { .. })
        ));
        assert_eq!(log.log_end_offset(), 2);
        log.close().await.unwrap();
        let mut log = open(&path, small_config()).await.unwrap();
        assert_eq!(log.log_end_offset(), 2);
        assert_eq!(read_all(&mut log, 0).await.len(), 1);
        log.close().await.unwrap();
    });
}

#[test]
fn offset_for_timestamp_finds_first_record_at_or_after() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-0");
    run(move || async move {
        let mut log = open(&path, small_config()).await.unwrap();
        // Batch i holds 4 records at timestamps 1000*i + 0..4.
        for i in 0..100i64 {
            log.append(mutable(&batch(i as u64, 4, 300, 1000 * i)), LEADER)
                .await
                .unwrap();
        }
        for reopen in [false, true] {
            if reopen {
                log.close().await.unwrap();
                log = open_uncached(&path, small_config()).await.unwrap();
            }
            assert_eq!(log.offset_for_timestamp(0).await.unwrap(), Some((0, 0)));
            assert_eq!(
                log.offset_for_timestamp(5002).await.unwrap(),
                Some((22, 5002))
            );
            assert_eq!(
                log.offset_for_timestamp(5003).await.unwrap(),
                Some((23, 5003))
            );
            assert_eq!(
                log.offset_for_timestamp(5004).await.unwrap(),
                Some((24, 6000))
            );
            assert_eq!(
                log.offset_for_timestamp(99_003).await.unwrap(),
                Some((399, 99_003))
            );
            assert_eq!(log.offset_for_timestamp(99_004).await.unwrap(), None);
        }
        log.close().await.unwrap();
    });
}

#[test]
fn truncate_to_cuts_whole_batches_and_appends_continue() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-0");
    run(move || async move {
        let mut log = open(&path, small_config()).await.unwrap();
        for i in 0..100u64 {
            let epoch = if i < 50 { 1 } else { 2 };
            log.append(
                mutable(&batch(i, 3, 500, 0)),
                AppendMode::Leader {
                    leader_epoch: epoch,
                },
            )
            .await
            .unwrap();
        }
        assert_eq!(log.leader_epochs().entries().len(), 2);
        // Offset 100 is inside batch 33 (offsets 99..=101): the whole batch goes.
        log.truncate_to(100).await.unwrap();
        assert_eq!(log.log_end_offset(), 99);
        assert_eq!(
            log.leader_epochs().entries().len(),
            1,
            "epoch 2 started at 150, cut"
        );
        let info = log
            .append(mutable(&batch(1000, 2, 10, 0)), LEADER)
            .await
            .unwrap();
        assert_eq!(info.base_offset, 99);
        let all = read_all(&mut log, 0).await;
        assert_eq!(all.len(), 34);
        log.close().await.unwrap();
        let mut log = open_uncached(&path, small_config()).await.unwrap();
        assert_eq!(log.log_end_offset(), 101);
        assert_eq!(read_all(&mut log, 0).await, all);
        // Truncating to the very start leaves an empty, usable log.
        log.truncate_to(0).await.unwrap();
        assert_eq!(log.log_end_offset(), 0);
        assert_eq!(
            log.append(mutable(&batch(5, 1, 10, 0)), LEADER)
                .await
                .unwrap()
                .base_offset,
            0
        );
        log.close().await.unwrap();
    });
}

#[test]
fn replica_appends_keep_leader_offsets() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-0");
    run(move || async move {
        let mut log = open(&path, small_config()).await.unwrap();
        let mut b = mutable(&batch(1, 3, 10, 0));
        skiff_engine::batch::stamp(&mut b, 0, 7).unwrap();
        append_replica(&mut log, b).await.unwrap();
        let mut stale = mutable(&batch(2, 1, 10, 0));
        skiff_engine::batch::stamp(&mut stale, 1, 7).unwrap();
        assert!(matches!(
            append_replica(&mut log, stale).await,
            Err(LogError::NonContiguousAppend { .. })
        ));
        assert_eq!(log.leader_epochs().latest_epoch(), Some(7));
        log.close().await.unwrap();
    });
}

/// A fetched batch that waited while this replica became a leader (its epoch
/// now starts at our end) is refused: a log's epochs never go down, and the
/// old epoch's record after the new epoch's start would make this leader tell
/// followers the wrong end of the old epoch (nemesis seed 5002: a follower
/// cut and refetched the same record for two minutes).
#[test]
fn a_replica_batch_older_than_the_logs_epoch_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-0");
    run(move || async move {
        let mut log = open(&path, small_config()).await.unwrap();
        append_replica(&mut log, replica_batch(1, 0, 3, 220))
            .await
            .unwrap();
        // Elected at epoch 221 with the log ending at 3.
        assert_eq!(log.assign_leader_epoch(221).unwrap(), 3);
        // The old leader's next batch, fetched before the election, lands now.
        assert!(matches!(
            append_replica(&mut log, replica_batch(2, 3, 1, 220)).await,
            Err(LogError::StaleReplicaEpoch {
                epoch: 220,
                latest: 221
            })
        ));
        assert_eq!(log.log_end_offset(), 3, "nothing written");
        assert!(log.offline_reason().is_none(), "a refusal, not a failure");
        // Epoch 220 still ends where 221 starts; 221's own records go on.
        assert_eq!(log.leader_epochs().end_offset_for(220, 3), Some((220, 3)));
        log.append(
            mutable(&batch(3, 2, 10, 0)),
            AppendMode::Leader { leader_epoch: 221 },
        )
        .await
        .unwrap();
        // As a follower again, batches of its epoch or newer are taken.
        append_replica(&mut log, replica_batch(4, 5, 1, 221))
            .await
            .unwrap();
        append_replica(&mut log, replica_batch(5, 6, 1, 222))
            .await
            .unwrap();
        assert_eq!(log.log_end_offset(), 7);
        log.close().await.unwrap();
    });
}

/// Kafka's makeLeader: a new leadership's epoch is in the cache at the log
/// end before any record, so a follower's divergence check sees where the
/// older epochs end here. It survives a restart only with records.
#[test]
fn a_leader_epoch_starts_at_the_log_end_before_its_first_record() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-0");
    run(move || async move {
        let mut log = open(&path, small_config()).await.unwrap();
        log.append(mutable(&batch(1, 3, 10, 0)), LEADER)
            .await
            .unwrap();
        assert_eq!(log.assign_leader_epoch(5).unwrap(), 3);
        assert_eq!(log.leader_epochs().latest_epoch(), Some(5));
        assert_eq!(log.leader_epochs().end_offset_for(3, 3), Some((3, 3)));
        // An older or equal epoch changes nothing.
        assert_eq!(log.assign_leader_epoch(4).unwrap(), 3);
        assert_eq!(log.leader_epochs().latest_epoch(), Some(5));
        // As a follower it cuts nothing at its end, but the record-less
        // epoch goes (Kafka's truncateTo): the leader never had it.
        log.truncate_to(3).await.unwrap();
        assert_eq!(log.log_end_offset(), 3);
        assert_eq!(log.leader_epochs().latest_epoch(), Some(3));
        log.assign_leader_epoch(5).unwrap();
        log.close().await.unwrap();
        // Gone after a reopen: no record carries it yet.
        let mut log = open(&path, small_config()).await.unwrap();
        assert_eq!(log.leader_epochs().latest_epoch(), Some(3));
        log.assign_leader_epoch(6).unwrap();
        log.append(
            mutable(&batch(2, 2, 10, 0)),
            AppendMode::Leader { leader_epoch: 6 },
        )
        .await
        .unwrap();
        log.close().await.unwrap();
        let log = open(&path, small_config()).await.unwrap();
        let epochs: Vec<(i32, i64)> = log
            .leader_epochs()
            .entries()
            .iter()
            .map(|e| (e.epoch, e.start_offset))
            .collect();
        assert_eq!(epochs, vec![(3, 0), (6, 3)]);
    });
}

/// A produce admitted under an old leadership must not land after the
/// replica became a follower: leader appends below the fence are refused,
/// replica appends go on.
#[test]
fn leader_appends_below_the_fence_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-0");
    run(move || async move {
        let mut log = open(&path, small_config()).await.unwrap();
        log.append(mutable(&batch(1, 3, 10, 0)), LEADER)
            .await
            .unwrap();
        // Following epoch 4 (led by another node): fenced below 5.
        log.fence_leader_appends(5);
        assert!(matches!(
            log.append(mutable(&batch(2, 1, 10, 0)), LEADER).await,
            Err(LogError::FencedLeaderEpoch {
                epoch: 3,
                fenced_below: 5
            })
        ));
        assert_eq!(log.log_end_offset(), 3, "nothing written");
        append_replica(&mut log, replica_batch(3, 3, 2, 4))
            .await
            .unwrap();
        // Never lowered; leading epoch 7 lets epoch-7 appends through.
        log.fence_leader_appends(2);
        log.assign_leader_epoch(7).unwrap();
        log.append(
            mutable(&batch(4, 1, 10, 0)),
            AppendMode::Leader { leader_epoch: 7 },
        )
        .await
        .unwrap();
        assert!(matches!(
            log.append(
                mutable(&batch(5, 1, 10, 0)),
                AppendMode::Leader { leader_epoch: 6 }
            )
            .await,
            Err(LogError::FencedLeaderEpoch { .. })
        ));
        assert_eq!(log.log_end_offset(), 6);
        log.close().await.unwrap();
    });
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, .. ProptestConfig::default() })]

    /// Any sequence of appends, flushes and truncations reads back exactly
    /// what a model (a Vec of batches) holds, before and after reopening. A
    /// flush writes out a partly filled chunk, whose last block the next
    /// write rewrites.
    #[test]
    fn model_check_append_truncate(ops in proptest::collection::vec((0u8..10, 1usize..6, 1usize..3000), 1..60)) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t-0");
        run(move || async move {
            let mut log = open(&path, small_config()).await.unwrap();
            let mut model: Vec<(i64, bytes::Bytes)> = Vec::new();
            for (i, (op, records, size)) in ops.into_iter().enumerate() {
                if op == 0 && !model.is_empty() {
                    let cut = model[model.len() / 2].0;
                    log.truncate_to(cut).await.unwrap();
                    model.retain(|(base, _)| *base < cut);
                } else {
                    let b = batch(i as u64, records, size, i as i64);
                    let info = log.append(mutable(&b), LEADER).await.unwrap();
                    model.push((info.base_offset, b));
                    if op <= 3 {
                        log.flush().await.unwrap();
                    }
                }
            }
            for pass in 0..2 {
                if pass == 1 {
                    log.close().await.unwrap();
                    log = open_uncached(&path, small_config()).await.unwrap();
                }
                let got = read_all(&mut log, 0).await;
                assert_eq!(got.len(), model.len());
                for (g, (base, b)) in got.iter().zip(&model) {
                    assert_eq!(BatchHeader::parse(g).unwrap().base_offset, *base);
                    assert_eq!(&g[61..], &b[61..]);
                }
            }
            // The active segment's file holds exactly its batches after close.
            log.close().await.unwrap();
            for entry in std::fs::read_dir(&path).unwrap() {
                let p = entry.unwrap().path();
                if p.extension().is_some_and(|e| e == "log") {
                    let data = std::fs::read(&p).unwrap();
                    let mut scanner = BatchScanner::new(&data);
                    let n = scanner.by_ref().count();
                    assert_eq!(scanner.position(), data.len(), "{} has trailing bytes after {n} batches", p.display());
                }
            }
        });
    }
}

#[test]
fn long_poll_wakes_on_append_and_never_misses_one() {
    use skiff_engine::{wait_for_any, LongPoll};
    use std::rc::Rc;
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-0");
    run(move || async move {
        let log = open(&path, small_config()).await.unwrap();
        let p = Rc::new(skiff_engine::Partition::new(log));
        p.append(mutable(&batch(1, 1, 10, 0)), LEADER)
            .await
            .unwrap();
        // Data past what the fetch saw: no wait at all.
        let t = Instant::now();
        wait_for_any(
            &[(p.clone(), 0)],
            LongPoll::HighWatermark,
            Duration::from_secs(30),
        )
        .await;
        assert!(t.elapsed() < Duration::from_secs(10));
        // Nothing new: returns at the timeout.
        let t = Instant::now();
        wait_for_any(
            &[(p.clone(), 1)],
            LongPoll::HighWatermark,
            Duration::from_millis(50),
        )
        .await;
        assert!(t.elapsed() >= Duration::from_millis(50));
        // An append while waiting wakes the waiter long before its timeout.
        let writer = p.clone();
        let appender = glommio::spawn_local(async move {
            glommio::timer::sleep(Duration::from_millis(20)).await;
            writer
                .append(mutable(&batch(2, 1, 10, 0)), LEADER)
                .await
                .unwrap();
        });
        let t = Instant::now();
        wait_for_any(
            &[(p.clone(), 1)],
            LongPoll::HighWatermark,
            Duration::from_secs(30),
        )
        .await;
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "woken by the append, not the timeout"
        );
        appender.await;
        assert_eq!(p.high_watermark(), 2);
        p.close().await.unwrap();
    });
}

/// One long poll over many partitions (a fetch's, per core): it wakes when any
/// of them passes what it saw, follows the log end for a follower, and a poll
/// that ends (timeout or wake) leaves no waker behind on the partitions that
/// did not change: an idle partition polled all day holds none.
#[test]
fn long_poll_over_many_partitions_wakes_on_any_and_leaves_no_waiters() {
    use skiff_engine::{wait_for_any, LongPoll};
    use std::rc::Rc;
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    run(move || async move {
        let mut parts = Vec::new();
        for i in 0..3 {
            let log = open(&root.join(format!("t-{i}")), small_config())
                .await
                .unwrap();
            parts.push(Rc::new(skiff_engine::Partition::new(log)));
        }
        let polled: Vec<(Rc<skiff_engine::Partition>, i64)> =
            parts.iter().map(|p| (p.clone(), 0)).collect();
        // Idle: many timed-out polls, no waker kept.
        for _ in 0..50 {
            wait_for_any(&polled, LongPoll::HighWatermark, Duration::from_millis(1)).await;
        }
        for p in &parts {
            assert_eq!(p.long_poll_waiters(), 0);
        }
        // An append to the last partition wakes a poll over all three.
        let writer = parts[2].clone();
        let appender = glommio::spawn_local(async move {
            glommio::timer::sleep(Duration::from_millis(20)).await;
            writer
                .append(mutable(&batch(0, 1, 10, 0)), LEADER)
                .await
                .unwrap();
        });
        let t = Instant::now();
        let high_watermarks: Vec<(Rc<skiff_engine::Partition>, i64)> = parts
            .iter()
            .map(|p| (p.clone(), p.high_watermark()))
            .collect();
        assert_eq!(high_watermarks[2].1, 0);
        wait_for_any(
            &high_watermarks,
            LongPoll::HighWatermark,
            Duration::from_secs(30),
        )
        .await;
        assert!(t.elapsed() < Duration::from_secs(10), "woken by the append");
        appender.await;
        for p in &parts {
            assert_eq!(p.long_poll_waiters(), 0, "a finished poll left a waker");
        }
        // A follower's poll passes on the log end; a consumer's that saw the
        // high watermark at 1 does not.
        let ends: Vec<(Rc<skiff_engine::Partition>, i64)> =
            parts.iter().map(|p| (p.clone(), p.log_end())).collect();
        let t = Instant::now();
        wait_for_any(&ends, LongPoll::LogEnd, Duration::from_millis(30)).await;
        assert!(
            t.elapsed() >= Duration::from_millis(30),
            "nothing passed the ends"
        );
        for p in parts {
            p.close().await.unwrap();
        }
    });
}

/// A partition's offline state, as the broker's heartbeat reads it: none for
/// a healthy log, the failure's reason for one whose sync failed.
#[test]
fn offline_reason_names_the_failure() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    run(move || async move {
        let healthy =
            skiff_engine::Partition::new(open(&root.join("t-0"), small_config()).await.unwrap());
        assert_eq!(healthy.offline_reason().await.unwrap(), None);
        let mut log = open(&root.join("t-1"), small_config()).await.unwrap();
        log.append(mutable(&batch(0, 1, 10, 0)), LEADER)
            .await
            .unwrap();
        log.write_out().await.unwrap();
        log.poison("fdatasync failed: injected");
        let sick = skiff_engine::Partition::new(log);
        let reason = sick.offline_reason().await.unwrap();
        assert!(
            reason.as_deref().is_some_and(|r| r.contains("injected")),
            "{reason:?}"
        );
        healthy.close().await.unwrap();
        let _ = sick.close().await;
    });
}

/// Retention by time and size with the clock passed in: whole closed segments
/// only, never the active one, never at or past the high watermark; the log start
/// offset moves and survives a reopen.
#[test]
fn retention_by_time_and_size() {
    use std::time::Duration;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-0");
    run(move || async move {
        let config = skiff_engine::LogConfig {
            retention_ms: Some(Duration::from_millis(10_000)),
            retention_bytes: None,
            ..small_config()
        };
        let mut log = open(&path, config.clone()).await.unwrap();
        // 300 batches of ~2 KiB, timestamps 1000 ms apart: ~10 segments of 64 KiB.
        for i in 0..300i64 {
            log.append(mutable(&batch(i as u64, 1, 2000, i * 1000)), LEADER)
                .await
                .unwrap();
        }
        let segments = |log: &skiff_engine::PartitionLog| log.segments().count();
        let before = segments(&log);
        assert!(before > 4);
        let leo = log.log_end_offset();

        // At "now" = 300 s, segments whose newest batch is before 290 s are due;
        // a high watermark of 0 protects all of them.
        let none = log.apply_retention(300_000, 0).await.unwrap();
        assert_eq!(none.deleted_segments, 0);
        let out = log.apply_retention(300_000, leo).await.unwrap();
        assert!(out.deleted_segments > 0);
        assert_eq!(segments(&log), before - out.deleted_segments);
        let first = log.segments().next().unwrap();
        assert_eq!(log.log_start_offset(), first.base_offset());
        assert!(
            first.max_timestamp() >= 100_000 - 10_000,
            "kept segments are recent"
        );
        let start = log.log_start_offset();
        assert!(matches!(
            log.read(start - 1, 100, i64::MAX).await,
            Err(LogError::OffsetOutOfRange { .. })
        ));
        assert_eq!(
            BatchHeader::parse(&log.read(start, 100, i64::MAX).await.unwrap().batches[0])
                .unwrap()
                .base_offset,
            start
        );

        // Far in the future everything closed goes, the active segment stays.
        log.apply_retention(10_000_000, leo).await.unwrap();
        assert_eq!(segments(&log), 1);
        assert_eq!(log.log_end_offset(), leo);
        let start = log.log_start_offset();
        assert_eq!(log.leader_epochs().entries()[0].start_offset, start);
        log.close().await.unwrap();
        // Retention cuts the epoch cache in memory only; the file still names
        // the epoch from offset 0 and the open cuts it from the start again.
        let epochs = std::fs::read_to_string(path.join("leader-epoch-checkpoint")).unwrap();
        assert!(epochs.ends_with("\n3 0\n"), "{epochs}");
        let mut log = open(&path, config).await.unwrap();
        assert_eq!(
            log.log_start_offset(),
            start,
            "log start offset survives a reopen"
        );
        assert_eq!(log.leader_epochs().entries()[0].start_offset, start);
        assert_eq!(read_all(&mut log, start).await.len() as i64, leo - start);
        log.close().await.unwrap();

        // Size: keep at most ~200 KiB.
        let sized = tempfile::tempdir().unwrap();
        let config = skiff_engine::LogConfig {
            retention_ms: None,
            retention_bytes: Some(200 * 1024),
            ..small_config()
        };
        let mut log = open(&sized.path().join("t-0"), config).await.unwrap();
        for i in 0..200i64 {
            log.append(mutable(&batch(i as u64, 1, 2000, i)), LEADER)
                .await
                .unwrap();
        }
        let leo = log.log_end_offset();
        let out = log.apply_retention(0, leo).await.unwrap();
        assert!(out.deleted_segments > 0);
        assert!(log.size_bytes() >= 200 * 1024, "never below the limit");
        let oldest = log.segments().next().unwrap().size();
        assert!(
            log.size_bytes() - oldest < 200 * 1024,
            "one more deletion would go below the limit"
        );
        log.close().await.unwrap();
    });
}

#[test]
fn delete_records_moves_the_start_inside_a_segment() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-0");
    run(move || async move {
        let mut log = open(&path, small_config()).await.unwrap();
        for i in 0..50u64 {
            log.append(mutable(&batch(i, 2, 2000, 0)), LEADER)
                .await
                .unwrap();
        }
        let leo = log.log_end_offset();
        assert!(matches!(
            log.delete_records(leo + 1, leo).await,
            Err(LogError::OffsetOutOfRange { .. })
        ));
        assert_eq!(log.delete_records(41, leo).await.unwrap(), 41);
        assert_eq!(log.log_start_offset(), 41);
        assert!(log.segments().next().unwrap().base_offset() <= 41);
        assert!(matches!(
            log.read(40, 100, i64::MAX).await,
            Err(LogError::OffsetOutOfRange { .. })
        ));
        // The batch holding offset 41 (offsets 40..=41) is still served whole.
        let r = log.read(41, 100, i64::MAX).await.unwrap();
        assert_eq!(BatchHeader::parse(&r.batches[0]).unwrap().base_offset, 40);
        log.close().await.unwrap();
        let log = open(&path, small_config()).await.unwrap();
        assert_eq!(log.log_start_offset(), 41);
        log.close().await.unwrap();
    });
}

/// After an fdatasync fails, the state of the file is unknown: even with
/// every byte written out, nothing more may count as flushed. The log stays
/// offline (appends, write-outs, flushes, truncation refused), reads stop at
/// what was flushed, a close is quick and clean, and a reopen finds every
/// flushed batch.
#[test]
fn a_failed_sync_takes_the_log_offline_until_reopened() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-0");
    run(move || async move {
        let mut log = open_uncached(&path, small_config()).await.unwrap();
        let mut flushed = Vec::new();
        for i in 0..5u64 {
            let b = batch(i, 2, 300, 1000 + i as i64);
            log.append(mutable(&b), LEADER).await.unwrap();
            flushed.push(b);
        }
        log.flush().await.unwrap();
        let flushed_end = log.log_end_offset();
        for i in 5..8u64 {
            log.append(mutable(&batch(i, 2, 300, 1000)), LEADER)
                .await
                .unwrap();
        }
        // Written out (the group commit's first half), then the sync fails.
        log.write_out().await.unwrap();
        log.poison("fdatasync failed: injected");
        assert!(log.offline_reason().unwrap().contains("injected"));

        let offline = |r: skiff_engine::Result<()>, what: &str| match r {
            Err(LogError::Offline(reason)) => assert!(reason.contains("injected"), "{what}"),
            other => panic!("{what}: {other:?}"),
        };
        offline(log.write_out().await.map(|_| ()), "write_out");
        offline(log.flush().await, "flush");
        offline(
            log.append(mutable(&batch(9, 1, 10, 1000)), LEADER)
                .await
                .map(|_| ()),
            "append",
        );
        offline(log.truncate_to(1).await, "truncate_to");
        assert_eq!(log.flushed_offset(), flushed_end);

        // Reads stop at the flushed offset, whatever the caller's bound.
        let mut got = Vec::new();
        let mut offset = 0;
        loop {
            let r = log.read(offset, 256 * 1024, i64::MAX).await.unwrap();
            if r.batches.is_empty() {
                break;
            }
            offset = r.next_offset;
            got.extend(r.batches);
        }
        let ends: Vec<i64> = got
            .iter()
            .map(|b| BatchHeader::parse(b).unwrap().next_offset())
            .collect();
        assert_eq!(ends.last(), Some(&flushed_end));
        assert_eq!(got.len(), flushed.len());
        for (g, s) in got.iter().zip(&flushed) {
            assert_eq!(&g[61..], &s[61..]);
        }
        log.close().await.unwrap();

        let mut log = open_uncached(&path, small_config()).await.unwrap();
        assert!(log.offline_reason().is_none(), "a reopen brings it back");
        assert!(log.log_end_offset() >= flushed_end);
        let again = read_all(&mut log, 0).await;
        for (g, s) in again.iter().zip(&flushed) {
            assert_eq!(&g[61..], &s[61..]);
        }
        log.append(mutable(&batch(10, 1, 10, 1000)), LEADER)
            .await
            .unwrap();
        log.close().await.unwrap();
    });
}

/// The `.log` files of a partition directory, by base offset.
/// A replica append continuing the log where it ends now.
async fn append_replica(
    log: &mut skiff_engine::PartitionLog,
    batch: bytes::BytesMut,
) -> skiff_engine::Result<skiff_engine::AppendInfo> {
    let log_end = log.log_end_offset();
    log.append(batch, AppendMode::Replica { log_end }).await
}

/// A replica batch at `base` in leader epoch `epoch`.
fn replica_batch(seed: u64, base: i64, records: usize, epoch: i32) -> bytes::BytesMut {
    let mut b = mutable(&batch(seed, records, 300, seed as i64));
    skiff_engine::batch::stamp(&mut b, base, epoch).unwrap();
    b
}

/// 300 batches of 3 records over several segments, epochs 1 then 2; returns
/// the log end.
async fn fill(log: &mut skiff_engine::PartitionLog) -> i64 {
    for i in 0..300u64 {
        let epoch = if i < 150 { 1 } else { 2 };
        log.append(
            mutable(&batch(i, 3, 500, i as i64)),
            AppendMode::Leader {
                leader_epoch: epoch,
            },
        )
        .await
        .unwrap();
    }
    assert!(log.segments().count() > 3);
    log.log_end_offset()
}

/// A follower whose log ends below the leader's log start starts over there:
/// every segment goes, start = end = the offset, no epochs; appends continue
/// at the offset and everything survives a reopen with working indexes.
#[test]
fn truncate_fully_and_start_at_starts_an_empty_log_there() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-0");
    run(move || async move {
        let mut log = open(&path, small_config()).await.unwrap();
        let end = fill(&mut log).await;
        // Inside the log (it holds records): that is truncate_to's job.
        assert!(matches!(
            log.truncate_fully_and_start_at(end - 1).await,
            Err(LogError::OffsetOutOfRange { .. })
        ));
        assert_eq!(log.log_end_offset(), end);

        let start = end + 1000;
        log.truncate_fully_and_start_at(start).await.unwrap();
        assert_eq!(log.log_start_offset(), start);
        assert_eq!(log.log_end_offset(), start);
        assert_eq!(log.flushed_offset(), start);
        assert_eq!(log.recovery_point(), start);
        assert_eq!(log.segment_count(), 1);
        assert_eq!(log.segments().next().unwrap().base_offset(), start);
        assert!(log.leader_epochs().entries().is_empty());
        assert_eq!(segment_bases(&path), vec![start]);
        assert!(log
            .read(start, 100, i64::MAX)
            .await
            .unwrap()
            .batches
            .is_empty());
        assert!(matches!(
            log.read(start - 1, 100, i64::MAX).await,
            Err(LogError::OffsetOutOfRange { .. })
        ));
        // Reopened right away: the same empty log.
        log.close().await.unwrap();
        let mut log = open(&path, small_config()).await.unwrap();
        assert_eq!(
            (log.log_start_offset(), log.log_end_offset()),
            (start, start)
        );
        assert!(log.leader_epochs().entries().is_empty());

        // The leader's batches continue at the new start, rolling segments.
        let mut next = start;
        let mut sent = Vec::new();
        for i in 0..200u64 {
            let b = replica_batch(1000 + i, next, 2, 7);
            sent.push(b.clone().freeze());
            let info = append_replica(&mut log, b).await.unwrap();
            assert_eq!(info.base_offset, next);
            next = info.last_offset + 1;
        }
        assert!(log.segment_count() > 1);
        assert_eq!(
            log.leader_epochs().entries(),
            &[skiff_engine::leader_epoch::EpochEntry {
                epoch: 7,
                start_offset: start
            }]
        );
        let got = read_all(&mut log, start).await;
        assert_eq!(got, sent);
        log.close().await.unwrap();

        // From disk: reads, a read from the middle of a batch (index lookups),
        // the epochs and the start all survive.
        let mut log = open_uncached(&path, small_config()).await.unwrap();
        assert_eq!(log.log_start_offset(), start);
        assert_eq!(log.log_end_offset(), next);
        assert_eq!(read_all(&mut log, start).await, sent);
        for probe in [start + 1, start + 151, next - 1] {
            let r = log.read(probe, 1, i64::MAX).await.unwrap();
            let h = BatchHeader::parse(&r.batches[0]).unwrap();
            assert!(
                h.base_offset <= probe && probe <= h.last_offset(),
                "{probe}"
            );
        }
        assert_eq!(log.leader_epochs().latest_epoch(), Some(7));
        assert!(segment_bases(&path).iter().all(|&b| b >= start));
        log.close().await.unwrap();
    });
}

/// The leader's log start can be inside a batch (DeleteRecords): the follower's
/// empty log starts over at that batch's base, takes it, and then moves its
/// start up to the leader's, as Kafka's follower does.
#[test]
fn an_empty_log_starts_over_below_its_start_for_a_straddling_batch() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-0");
    run(move || async move {
        let mut log = open(&path, small_config()).await.unwrap();
        append_replica(&mut log, replica_batch(1, 0, 5, 1))
            .await
            .unwrap();
        log.truncate_fully_and_start_at(100).await.unwrap();
        // The leader's start is 100, inside its batch 95..=104.
        let straddling = replica_batch(2, 95, 10, 3);
        assert!(matches!(
            append_replica(&mut log, straddling.clone()).await,
            Err(LogError::NonContiguousAppend { .. })
        ));
        log.truncate_fully_and_start_at(95).await.unwrap();
        assert_eq!((log.log_start_offset(), log.log_end_offset()), (95, 95));
        assert_eq!(segment_bases(&path), vec![95]);
        append_replica(&mut log, straddling).await.unwrap();
        assert_eq!(log.delete_records(100, 105).await.unwrap(), 100);
        log.close().await.unwrap();
        let mut log = open(&path, small_config()).await.unwrap();
        assert_eq!((log.log_start_offset(), log.log_end_offset()), (100, 105));
        let r = log.read(100, 100, i64::MAX).await.unwrap();
        assert_eq!(BatchHeader::parse(&r.batches[0]).unwrap().base_offset, 95);
        // A log with records below its end is never started over below it.
        assert!(log.truncate_fully_and_start_at(104).await.is_err());
        log.close().await.unwrap();
    });
}

fn write_start_checkpoint(dir: &std::path::Path, offset: i64) {
    std::fs::write(
        dir.join(skiff_engine::checkpoint::LOG_START_OFFSET_FILE),
        format!("0\n1\nt 0 {offset}\n"),
    )
    .unwrap();
}

/// The files a truncate_fully_and_start_at has made at each of its steps, as a
/// SIGKILL would leave them, and what recovery makes of each: the old log
/// before the commit (the log start checkpoint), the empty log at the new
/// start from it on.
#[test]
fn an_interrupted_truncate_fully_recovers_to_the_old_log_or_the_new_one() {
    run(move || async move {
        let base = tempfile::tempdir().unwrap();
        let make = |name: &str| base.path().join(name);
        let mut end = 0;
        for (name, new_start) in [("gap", Some(5000)), ("contiguous", None)] {
            // Crash after creating the new segment, before the commit.
            let path = make(name);
            let mut log = open(&path, small_config()).await.unwrap();
            end = fill(&mut log).await;
            let old = read_all(&mut log, 0).await;
            log.close().await.unwrap();
            let at = new_start.unwrap_or(end);
            std::fs::write(path.join(format!("{at:020}.log")), b"").unwrap();
            let mut log = open_uncached(&path, small_config()).await.unwrap();
            assert_eq!(
                (log.log_start_offset(), log.log_end_offset()),
                (0, end),
                "{name}"
            );
            assert_eq!(read_all(&mut log, 0).await, old, "{name}");
            assert_eq!(log.leader_epochs().latest_epoch(), Some(2));
            // Appends continue the old log.
            let info = log
                .append(mutable(&batch(9, 1, 10, 0)), LEADER)
                .await
                .unwrap();
            assert_eq!(info.base_offset, end);
            log.close().await.unwrap();
            if new_start.is_some() {
                assert!(
                    !segment_bases(&path).contains(&at),
                    "the empty gap segment went"
                );
            }
        }

        // Crash after the commit: the new segment and the checkpoint are there,
        // the epochs and every old file too (or some of them).
        for keep_old in [true, false] {
            let path = make(if keep_old {
                "committed"
            } else {
                "half-deleted"
            });
            let mut log = open(&path, small_config()).await.unwrap();
            fill(&mut log).await;
            log.close().await.unwrap();
            let start = end + 77;
            std::fs::write(path.join(format!("{start:020}.log")), b"").unwrap();
            write_start_checkpoint(&path, start);
            if !keep_old {
                let first = segment_bases(&path)[0];
                for suffix in ["index", "timeindex", "log"] {
                    std::fs::remove_file(path.join(format!("{first:020}.{suffix}"))).unwrap();
                }
            }
            let mut log = open_uncached(&path, small_config()).await.unwrap();
            assert_eq!(
                (log.log_start_offset(), log.log_end_offset()),
                (start, start)
            );
            assert!(log.leader_epochs().entries().is_empty(), "no epochs");
            assert_eq!(segment_bases(&path), vec![start]);
            let info = append_replica(&mut log, replica_batch(3, start, 2, 9))
                .await
                .unwrap();
            assert_eq!(info.base_offset, start);
            log.close().await.unwrap();
            let mut log = open_uncached(&path, small_config()).await.unwrap();
            assert_eq!(read_all(&mut log, start).await.len(), 1);
            log.close().await.unwrap();
        }
    });
}

/// A log whose end is below its checkpointed start (the checkpoint moved, the
/// segments it covered are gone or never held it) starts over, empty, at the
/// checkpointed start: nothing below the start is served or reused.
#[test]
fn a_log_ending_below_its_checkpointed_start_starts_over_there() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-0");
    run(move || async move {
        let mut log = open(&path, small_config()).await.unwrap();
        let end = fill(&mut log).await;
        log.close().await.unwrap();
        write_start_checkpoint(&path, end + 10);
        let mut log = open(&path, small_config()).await.unwrap();
        assert_eq!(
            (log.log_start_offset(), log.log_end_offset()),
            (end + 10, end + 10)
        );
        assert!(log.leader_epochs().entries().is_empty());
        assert_eq!(segment_bases(&path), vec![end + 10]);
        let info = log
            .append(mutable(&batch(1, 1, 10, 0)), LEADER)
            .await
            .unwrap();
        assert_eq!(info.base_offset, end + 10);
        log.close().await.unwrap();
    });
}

/// Retention checkpoints the new start before it deletes files; segments a
/// crash left wholly below it are removed by recovery, and the epoch in force
/// at the start is moved there.
#[test]
fn recovery_removes_segments_wholly_below_the_checkpointed_start() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-0");
    run(move || async move {
        let mut log = open(&path, small_config()).await.unwrap();
        let end = fill(&mut log).await;
        let all = read_all(&mut log, 0).await;
        log.close().await.unwrap();
        let files = segment_bases(&path);
        let start = files[2];
        write_start_checkpoint(&path, start);
        let mut log = open_uncached(&path, small_config()).await.unwrap();
        assert_eq!((log.log_start_offset(), log.log_end_offset()), (start, end));
        assert_eq!(segment_bases(&path), files[2..].to_vec());
        let first = log.leader_epochs().entries()[0];
        assert_eq!((first.epoch, first.start_offset), (1, start));
        let kept: Vec<_> = all
            .into_iter()
            .filter(|b| BatchHeader::parse(b).unwrap().base_offset >= start)
            .collect();
        assert_eq!(read_all(&mut log, start).await, kept);
        log.close().await.unwrap();
    });
}

/// The producer snapshot files in `dir`, by offset.
fn snapshot_files(dir: &std::path::Path) -> Vec<i64> {
    skiff_engine::snapshot::list(dir).unwrap()
}

async fn append_n(log: &mut skiff_engine::PartitionLog, n: u64) {
    for i in 0..n {
        log.append(mutable(&batch(i, 1, 50, 0)), LEADER)
            .await
            .unwrap();
    }
}

#[test]
fn producer_snapshots_written_read_back_and_only_two_kept() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-0");
    run(move || async move {
        let mut log = open(&path, small_config()).await.unwrap();
        assert!(log.latest_producer_snapshot().await.unwrap().is_none());
        append_n(&mut log, 10).await;
        // Nothing above the flushed offset: a crash could take those records.
        assert!(matches!(
            log.write_producer_snapshot(5, b"five").await,
            Err(LogError::SnapshotNotFlushed { offset: 5, .. })
        ));
        assert!(snapshot_files(&path).is_empty());
        log.flush().await.unwrap();
        log.write_producer_snapshot(3, b"three").await.unwrap();
        log.write_producer_snapshot(5, b"five").await.unwrap();
        assert_eq!(snapshot_files(&path), vec![3, 5]);
        let (offset, body) = log.latest_producer_snapshot().await.unwrap().unwrap();
        assert_eq!((offset, &body[..]), (5, &b"five"[..]));
        log.write_producer_snapshot(10, b"").await.unwrap();
        assert_eq!(
            snapshot_files(&path),
            vec![5, 10],
            "only the newest two stay"
        );
        let (offset, body) = log.latest_producer_snapshot().await.unwrap().unwrap();
        assert_eq!((offset, body.len()), (10, 0));
        assert!(path.join("00000000000000000010.snapshot").exists());
        // A clean reopen keeps them.
        log.close().await.unwrap();
        let log = open(&path, small_config()).await.unwrap();
        assert_eq!(snapshot_files(&path), vec![5, 10]);
        assert_eq!(log.latest_producer_snapshot().await.unwrap().unwrap().0, 10);
        log.close().await.unwrap();
    });
}

#[test]
fn corrupt_producer_snapshot_is_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-0");
    run(move || async move {
        let mut log = open(&path, small_config()).await.unwrap();
        append_n(&mut log, 10).await;
        log.flush().await.unwrap();
        log.write_producer_snapshot(4, b"four").await.unwrap();
        log.write_producer_snapshot(9, b"nine").await.unwrap();
        // A flipped bit in the newest: the older one is used.
        let newest = skiff_engine::snapshot::snapshot_path(&path, 9);
        let mut bytes = std::fs::read(&newest).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0x40;
        std::fs::write(&newest, &bytes).unwrap();
        let (offset, body) = log.latest_producer_snapshot().await.unwrap().unwrap();
        assert_eq!((offset, &body[..]), (4, &b"four"[..]));
        // A torn older one too: none.
        let older = skiff_engine::snapshot::snapshot_path(&path, 4);
        std::fs::write(&older, &std::fs::read(&older).unwrap()[..7]).unwrap();
        assert!(log.latest_producer_snapshot().await.unwrap().is_none());
        // Garbage and an empty file are no better.
        std::fs::write(&older, b"").unwrap();
        std::fs::write(&newest, vec![0xff; 100]).unwrap();
        assert!(log.latest_producer_snapshot().await.unwrap().is_none());
        log.close().await.unwrap();
    });
}

#[test]
fn truncation_deletes_producer_snapshots_above_the_new_end() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-0");
    run(move || async move {
        let mut log = open(&path, small_config()).await.unwrap();
        append_n(&mut log, 10).await;
        log.flush().await.unwrap();
        log.write_producer_snapshot(4, b"four").await.unwrap();
        log.write_producer_snapshot(8, b"eight").await.unwrap();
        log.truncate_to(6).await.unwrap();
        assert_eq!(log.log_end_offset(), 6);
        assert_eq!(snapshot_files(&path), vec![4]);
        // Regrown past 8: the old snapshot at 8 must not come back.
        append_n(&mut log, 5).await;
        log.flush().await.unwrap();
        assert_eq!(log.latest_producer_snapshot().await.unwrap().unwrap().0, 4);
        // Cut at the snapshot's own offset: it describes exactly what is left.
        log.truncate_to(4).await.unwrap();
        assert_eq!(snapshot_files(&path), vec![4]);
        log.truncate_to(0).await.unwrap();
        assert!(snapshot_files(&path).is_empty());
        assert!(log.latest_producer_snapshot().await.unwrap().is_none());
        log.close().await.unwrap();
    });
}

#[test]
fn reopen_after_a_crash_keeps_only_producer_snapshots_within_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-0");
    let path2 = path.clone();
    run(move || async move {
        let mut log = open(&path, small_config()).await.unwrap();
        append_n(&mut log, 10).await;
        log.flush().await.unwrap();
        log.write_producer_snapshot(10, b"ten").await.unwrap();
        // No close: the process dies here.
        drop(log);
    });
    // What a crash can leave: a snapshot describing records that did not
    // survive (the engine never writes one, but a damaged disk or an older
    // version could), and a half-written temporary file.
    std::fs::write(
        skiff_engine::snapshot::snapshot_path(&path2, 50),
        skiff_engine::snapshot::encode(b"fifty"),
    )
    .unwrap();
    std::fs::write(path2.join("00000000000000000012.snapshot.tmp"), b"torn").unwrap();
    run(move || async move {
        let log = open(&path2, small_config()).await.unwrap();
        assert_eq!(log.log_end_offset(), 10);
        assert_eq!(snapshot_files(&path2), vec![10]);
        assert!(!path2.join("00000000000000000012.snapshot.tmp").exists());
        let (offset, body) = log.latest_producer_snapshot().await.unwrap().unwrap();
        assert_eq!((offset, &body[..]), (10, &b"ten"[..]));
        log.close().await.unwrap();
    });
}

#[test]
fn truncate_fully_deletes_every_producer_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-0");
    run(move || async move {
        let mut log = open(&path, small_config()).await.unwrap();
        append_n(&mut log, 10).await;
        log.flush().await.unwrap();
        log.write_producer_snapshot(4, b"four").await.unwrap();
        log.write_producer_snapshot(10, b"ten").await.unwrap();
        log.truncate_fully_and_start_at(50).await.unwrap();
        assert!(snapshot_files(&path).is_empty());
        assert!(log.latest_producer_snapshot().await.unwrap().is_none());
        log.close().await.unwrap();
    });
}

/// Issue 14: recovery after a crash says plainly what it cut. The zeros
/// preallocated after an active segment's data are the log's normal end, not
/// an invalid tail; garbage there is.
#[test]
fn recovery_tells_unwritten_space_from_an_invalid_tail() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-0");
    run(move || async move {
        let config = small_config();
        let mut log = open(&path, config.clone()).await.unwrap();
        for i in 0..5 {
            log.append(mutable(&batch(i, 3, 100, 0)), LEADER)
                .await
                .unwrap();
        }
        log.flush().await.unwrap();
        let end = log.log_end_offset();
        // A crash: no close, the preallocated space stays on disk.
        drop(log);
        let segment = path.join("00000000000000000000.log");
        let on_disk = std::fs::metadata(&segment).unwrap().len();
        let recovered = skiff_engine::recovery::recover(&path, &config)
            .await
            .unwrap();
        assert_eq!(recovered.log_end_offset, end);
        assert_eq!(recovered.truncated_bytes, 0, "nothing invalid was cut");
        assert!(
            recovered.unwritten_bytes > 0,
            "the preallocated space was trimmed"
        );
        let data = std::fs::metadata(&segment).unwrap().len();
        assert_eq!(data + recovered.unwritten_bytes, on_disk);
        drop(recovered);
        // Garbage after the data: an invalid tail, counted as cut.
        let mut bytes = std::fs::read(&segment).unwrap();
        bytes.extend_from_slice(&[0xAB; 300]);
        std::fs::write(&segment, &bytes).unwrap();
        let recovered = skiff_engine::recovery::recover(&path, &config)
            .await
            .unwrap();
        assert_eq!(recovered.log_end_offset, end);
        assert_eq!(recovered.truncated_bytes, 300);
        assert_eq!(recovered.unwritten_bytes, 0);
    });
}

/// Issue 14: a byte flipped on disk in a closed segment (in the records, in
/// the base offset outside the CRC's range, in the length) is caught when the
/// batch is read from disk and never served; the batches before it are; the
/// log is offline until `repair_corruption` cuts it before the bad batch,
/// and appends and a reopen then go on from there.
#[test]
fn a_flipped_byte_on_disk_is_never_served_and_repair_cuts_before_it() {
    // (byte of the batch to flip, mask): a record byte, the base offset's
    // high byte (not covered by the CRC), the length's high byte.
    for (at, mask) in [(61 + 9, 0x01u8), (0, 0x40), (8, 0x40)] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t-0");
        run(move || async move {
            let mut log = open(&path, small_config()).await.unwrap();
            let mut sent = Vec::new();
            for i in 0..120u64 {
                let b = batch(i, 2, 700, 1000 + i as i64);
                log.append(mutable(&b), LEADER).await.unwrap();
                sent.push(b);
            }
            assert!(log.segment_count() > 2, "small segment.bytes must roll");
            log.close().await.unwrap();

            // The third batch of the second (closed) segment.
            let second = path.join(format!("{:020}.log", segment_bases(&path)[1]));
            let mut bytes = std::fs::read(&second).unwrap();
            let (position, header) = BatchScanner::new(&bytes).nth(2).unwrap();
            let bad_offset = header.base_offset;
            bytes[position + at] ^= mask;
            std::fs::write(&second, &bytes).unwrap();

            // Every read comes from disk (no cache): the batches before the
            // bad one come back valid, then the read fails and keeps failing.
            let mut log = open_uncached(&path, small_config()).await.unwrap();
            let end = log.log_end_offset();
            let mut offset = 0;
            let mut good = Vec::new();
            let corruption = loop {
                match log.read(offset, 32 * 1024, i64::MAX).await {
                    Ok(r) => {
                        assert!(!r.batches.is_empty(), "no progress at {offset}");
                        offset = r.next_offset;
                        good.extend(r.batches);
                    }
                    Err(LogError::Corrupt(c)) => break c,
                    Err(e) => panic!("unexpected error {e}"),
                }
            };
            assert_eq!(corruption.path, second);
            assert_eq!(corruption.position, position as u64);
            assert_eq!(corruption.base_offset, bad_offset);
            assert_eq!(good.len() as i64, bad_offset / 2);
            for (g, s) in good.iter().zip(&sent) {
                skiff_engine::batch::crc_matches(g).unwrap();
                assert_eq!(&g[61..], &s[61..]);
            }
            assert!(matches!(
                log.read(0, 1024, i64::MAX).await,
                Err(LogError::Corrupt(_))
            ));
            assert!(log.offline_reason().is_some());
            assert!(matches!(
                log.append(mutable(&batch(999, 1, 10, 0)), LEADER).await,
                Err(LogError::Offline(_))
            ));
            assert_eq!(log.log_end_offset(), end, "nothing cut before the repair");

            // The repair: cut before the bad batch, serving again.
            assert_eq!(log.repair_corruption().await.unwrap(), Some(bad_offset));
            assert_eq!(log.repair_corruption().await.unwrap(), None);
            assert!(log.offline_reason().is_none());
            assert_eq!(log.log_end_offset(), bad_offset);
            assert!(log
                .leader_epochs()
                .entries()
                .iter()
                .all(|e| e.start_offset < bad_offset));
            assert_eq!(read_all(&mut log, 0).await, good);
            let info = log
                .append(mutable(&batch(500, 2, 700, 0)), LEADER)
                .await
                .unwrap();
            assert_eq!(info.base_offset, bad_offset);
            log.close().await.unwrap();
            let mut log = open_uncached(&path, small_config()).await.unwrap();
            assert_eq!(log.log_end_offset(), bad_offset + 2);
            let all = read_all(&mut log, 0).await;
            assert_eq!(all.len(), good.len() + 1);
            for b in &all {
                skiff_engine::batch::crc_matches(b).unwrap();
            }
            log.close().await.unwrap();
        });
    }
}

/// Nemesis seed 10001: a follower's fetch answer from its old log end was
/// checked, then waited for the log while a corruption repair held it and
/// cut the log far below; appended after the repair, it left a hole of
/// 70,973 offsets the replica later served as leader. A replica append says
/// where the log ended when its fetch was sent; a log cut meanwhile refuses
/// it, under the same lock as the cut, and stays online and whole.
#[test]
fn a_fetched_batch_waiting_behind_a_repair_is_refused_not_appended_past_the_cut() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-0");
    run(move || async move {
        let mut log = open(&path, small_config()).await.unwrap();
        for i in 0..120u64 {
            let b = batch(i, 2, 700, 1000 + i as i64);
            log.append(mutable(&b), LEADER).await.unwrap();
        }
        log.close().await.unwrap();
        let second = path.join(format!("{:020}.log", segment_bases(&path)[1]));
        let mut bytes = std::fs::read(&second).unwrap();
        let (position, header) = BatchScanner::new(&bytes).next().unwrap();
        let bad_offset = header.base_offset;
        bytes[position + 70] ^= 0x01;
        std::fs::write(&second, &bytes).unwrap();

        let mut log = open_uncached(&path, small_config()).await.unwrap();
        let end = log.log_end_offset();
        let mut offset = 0;
        loop {
            match log.read(offset, 32 * 1024, i64::MAX).await {
                Ok(r) => offset = r.next_offset,
                Err(LogError::Corrupt(_)) => break,
                Err(e) => panic!("unexpected error {e}"),
            }
        }
        let p = skiff_engine::Partition::new(log);
        // The answer from `end` was checked against a log ending there; its
        // append is queued behind the repair, which takes the log first.
        let fetched = replica_batch(7, end, 2, 3);
        let (repaired, appended) = futures_util::future::join(
            p.repair_corruption(),
            p.append_buffered(fetched, AppendMode::Replica { log_end: end }),
        )
        .await;
        assert_eq!(repaired.unwrap(), Some(bad_offset));
        assert!(
            matches!(
                appended,
                Err(LogError::ReplicaLogMoved { expected, log_end_offset })
                    if expected == end && log_end_offset == bad_offset
            ),
            "{appended:?}"
        );
        assert_eq!(p.log_end(), bad_offset, "nothing past the cut");
        assert!(p.offline_reason().await.unwrap().is_none(), "still serving");
        // The next fetch, from the new end, continues it.
        let info = p
            .append_buffered(
                replica_batch(8, bad_offset, 2, 3),
                AppendMode::Replica {
                    log_end: bad_offset,
                },
            )
            .await
            .unwrap();
        assert_eq!(info.base_offset, bad_offset);
        p.flush_to(p.log_end()).await.unwrap();
        p.close().await.unwrap();
        let mut log = open_uncached(&path, small_config()).await.unwrap();
        assert_eq!(log.log_end_offset(), bad_offset + 2);
        let all = read_all(&mut log, 0).await;
        let mut next = 0;
        for b in &all {
            let h = BatchHeader::parse(b).unwrap();
            assert_eq!(h.base_offset, next, "no hole");
            next = h.next_offset();
        }
        assert_eq!(next, bad_offset + 2);
        log.close().await.unwrap();
    });
}

/// A replica append for a log end other than the log's (an answer to a
/// fetch sent before a cut, or one grown meanwhile) writes nothing and
/// leaves the log online.
#[test]
fn a_replica_append_for_another_log_end_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-0");
    run(move || async move {
        let mut log = open(&path, small_config()).await.unwrap();
        let replica = |log_end| AppendMode::Replica { log_end };
        log.append(replica_batch(1, 0, 4, 2), replica(0))
            .await
            .unwrap();
        for stale in [0, 2, 9] {
            assert!(matches!(
                log.append(replica_batch(2, 9, 1, 2), replica(stale)).await,
                Err(LogError::ReplicaLogMoved { expected, log_end_offset: 4 }) if expected == stale
            ));
        }
        assert_eq!(log.log_end_offset(), 4);
        assert!(log.offline_reason().is_none());
        // A gap the leader's compaction left is fine when the end matches.
        let info = log
            .append(replica_batch(3, 9, 1, 2), replica(4))
            .await
            .unwrap();
        assert_eq!((info.base_offset, log.log_end_offset()), (9, 10));
        log.close().await.unwrap();
    });
}

/// Issue 14, seed 7301: a flipped byte in the batch holding the log start
/// (the very first batch, or the batch DeleteRecords moved the start into)
/// leaves nothing good at or past the start. The repair starts the log over,
/// empty, at its start (the rest is fetched again from the leader), instead
/// of failing with "offset out of range" and leaving the replica offline for
/// good; appends and a reopen go on from the start.
#[test]
fn a_corrupt_batch_at_the_log_start_is_repaired_to_an_empty_log_at_the_start() {
    // (log start to move to with DeleteRecords, or none).
    for delete_to in [None, Some(5i64)] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t-0");
        run(move || async move {
            let mut log = open(&path, small_config()).await.unwrap();
            for i in 0..120u64 {
                let b = batch(i, 2, 700, 1000 + i as i64);
                log.append(mutable(&b), LEADER).await.unwrap();
            }
            assert!(log.segment_count() > 2, "small segment.bytes must roll");
            let end = log.log_end_offset();
            if let Some(start) = delete_to {
                assert_eq!(log.delete_records(start, end).await.unwrap(), start);
            }
            let start = log.log_start_offset();
            log.close().await.unwrap();

            // Flip a record byte of the batch holding the start.
            let first = path.join(format!("{:020}.log", segment_bases(&path)[0]));
            let mut bytes = std::fs::read(&first).unwrap();
            let (position, header) = BatchScanner::new(&bytes)
                .find(|(_, h)| h.last_offset() >= start)
                .unwrap();
            assert!(header.base_offset <= start);
            bytes[position + 61 + 9] ^= 0x01;
            std::fs::write(&first, &bytes).unwrap();

            let mut log = open_uncached(&path, small_config()).await.unwrap();
            assert_eq!(log.log_start_offset(), start);
            assert!(matches!(
                log.read(start, 32 * 1024, i64::MAX).await,
                Err(LogError::Corrupt(_))
            ));
            assert_eq!(log.repair_corruption().await.unwrap(), Some(start));
            assert!(log.offline_reason().is_none());
            assert_eq!(log.log_start_offset(), start);
            assert_eq!(log.log_end_offset(), start);
            assert!(read_all(&mut log, start).await.is_empty());
            assert!(log.leader_epochs().entries().is_empty());
            let info = log
                .append(mutable(&batch(500, 2, 700, 0)), LEADER)
                .await
                .unwrap();
            assert_eq!(info.base_offset, start);
            log.close().await.unwrap();

            let mut log = open_uncached(&path, small_config()).await.unwrap();
            assert_eq!(log.log_start_offset(), start);
            assert_eq!(log.log_end_offset(), start + 2);
            let all = read_all(&mut log, start).await;
            assert_eq!(all.len(), 1);
            skiff_engine::batch::crc_matches(&all[0]).unwrap();
            log.close().await.unwrap();
        });
    }
}

/// Under `Durability::Interval` an acknowledged append is in the file (its
/// write completed), not only in the append chunk: the file read directly
/// holds every batch `await_durable` returned for, with no fdatasync.
#[test]
fn interval_acknowledgements_wait_for_the_write() {
    use std::rc::Rc;
    use std::time::Duration;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-0");
    let file_path = path.clone();
    run(move || async move {
        let mut config = small_config();
        config.segment_bytes = 1 << 20;
        config.durability = skiff_engine::Durability::Interval(Duration::from_secs(3600));
        let log = open(&path, config).await.unwrap();
        let p = Rc::new(skiff_engine::Partition::new(log));
        let mut end = 0;
        for i in 0..20 {
            let info = p
                .append(mutable(&batch(i, 3, 50, 0)), LEADER)
                .await
                .unwrap();
            end = info.last_offset + 1;
            assert_eq!(p.written_end(), end);
            assert_eq!(p.high_watermark(), end, "consumers see what is written");
        }
        assert_eq!(p.flushed_offset(), 0, "nothing was fdatasync'd");
        // What a process crash would leave: the file's own bytes.
        let data = std::fs::read(file_path.join("00000000000000000000.log")).unwrap();
        let mut scanner = BatchScanner::new(&data);
        let last = scanner.by_ref().last().unwrap();
        assert_eq!(last.1.last_offset() + 1, end);
    });
}

/// A commit waiting for records that a truncation took fails with
/// `CutBeforeDurable`: it must not wait for, and then report durable, other
/// records appended later at the same offsets (an acknowledgement of
/// records the log no longer holds), nor spin a commit per turn while the
/// log ends before them.
#[test]
fn a_commit_waiting_on_cut_records_fails() {
    use std::rc::Rc;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-0");
    run(move || async move {
        let log = open(&path, small_config()).await.unwrap();
        let p = Rc::new(skiff_engine::Partition::new(log));
        p.append(mutable(&batch(1, 5, 10, 0)), LEADER)
            .await
            .unwrap();
        // Cut before the wait begins: the log ends before the records.
        p.append_buffered(mutable(&batch(2, 5, 10, 0)), LEADER)
            .await
            .unwrap();
        p.truncate_to(5).await.unwrap();
        assert!(matches!(
            p.flush_to(10).await,
            Err(LogError::CutBeforeDurable { offset: 10 })
        ));
        // Cut and refilled by other records at the same offsets while the
        // wait runs (or before it first runs: the count read at the append
        // still tells).
        p.append_buffered(mutable(&batch(3, 5, 10, 0)), LEADER)
            .await
            .unwrap();
        let appended_at = p.truncations();
        let cutter = p.clone();
        let refill = glommio::spawn_local(async move {
            cutter.truncate_to(5).await.unwrap();
            cutter
                .append_buffered(mutable(&batch(4, 5, 10, 0)), LEADER)
                .await
                .unwrap();
        });
        let waited = p.await_durable_to(10, appended_at).await;
        assert!(
            matches!(waited, Err(LogError::CutBeforeDurable { offset: 10 })),
            "{waited:?}"
        );
        refill.await;
        // The records that are there now become durable as usual.
        assert_eq!(p.log_end(), 10);
        p.flush_to(10).await.unwrap();
        assert_eq!(p.flushed_offset(), 10);
        // The whole log deleted and started over past the records (a
        // replica behind its leader's log start).
        p.append_buffered(mutable(&batch(5, 5, 10, 0)), LEADER)
            .await
            .unwrap();
        let appended_at = p.truncations();
        let restarter = p.clone();
        let restart = glommio::spawn_local(async move {
            restarter.truncate_fully_and_start_at(100).await.unwrap();
        });
        let waited = p.await_durable_to(15, appended_at).await;
        assert!(
            matches!(waited, Err(LogError::CutBeforeDurable { offset: 15 })),
            "{waited:?}"
        );
        restart.await;
        assert_eq!(p.log_end(), 100);
    });
}

/// A clean close records the active segment it closed with its indexes; the
/// next open loads it from them instead of scanning it, but only while the
/// segment and the recovery point are still what the close recorded.
#[test]
fn a_clean_close_spares_the_next_open_its_scan_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-0");
    run(move || async move {
        let config = small_config();
        let mut log = open(&path, config.clone()).await.unwrap();
        append_n(&mut log, 40).await;
        let end = log.log_end_offset();
        log.close().await.unwrap();
        let record = path.join("clean-shutdown-checkpoint");
        assert!(record.exists(), "a clean close leaves its record");
        let kept = std::fs::read(&record).unwrap();

        let recovered = skiff_engine::recovery::recover(&path, &config)
            .await
            .unwrap();
        assert_eq!(recovered.log_end_offset, end);
        assert_eq!(
            recovered.scanned_bytes, 0,
            "nothing scanned after a clean close"
        );
        assert_eq!(recovered.first_scanned, end);
        assert!(!record.exists(), "the record is used once");
        drop(recovered);

        // Without it (a crash after the open), the last segment is scanned.
        let recovered = skiff_engine::recovery::recover(&path, &config)
            .await
            .unwrap();
        assert_eq!(recovered.log_end_offset, end);
        assert!(recovered.scanned_bytes > 0);
        drop(recovered);

        // A stale record beside a segment that grew since: its size differs,
        // so the segment is scanned and the bytes after the batches are cut.
        let segments: Vec<_> = std::fs::read_dir(&path)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "log"))
            .collect();
        let last = segments.iter().max().unwrap().clone();
        let mut bytes = std::fs::read(&last).unwrap();
        bytes.extend_from_slice(&[0xAB; 300]);
        std::fs::write(&last, &bytes).unwrap();
        std::fs::write(&record, &kept).unwrap();
        let recovered = skiff_engine::recovery::recover(&path, &config)
            .await
            .unwrap();
        assert_eq!(recovered.log_end_offset, end);
        assert!(recovered.scanned_bytes > 0, "a grown segment is scanned");
        assert_eq!(recovered.truncated_bytes, 300);
        drop(recovered);

        // A stale record after more appends made durable: the recovery point
        // moved past it, so the open scans and finds every batch.
        let mut log = open(&path, config.clone()).await.unwrap();
        append_n(&mut log, 5).await;
        log.flush().await.unwrap();
        let later_end = log.log_end_offset();
        drop(log); // a crash: no close
        std::fs::write(&record, &kept).unwrap();
        let log = open(&path, config.clone()).await.unwrap();
        assert_eq!(log.log_end_offset(), later_end);
        assert_eq!(log.log_end_offset(), end + 5);
        log.close().await.unwrap();
    });
}

/// A roll publishes its work with one directory sync (`PartitionLog::roll`):
/// the closed segment's index renames, the new segment's file, then the
/// recovery point. A crash before that sync leaves a prefix of those changes
/// (or, on a file system that orders no metadata, any subset); every such
/// state opens to every batch the closed segment holds.
#[test]
fn a_roll_cut_before_its_directory_sync_loses_nothing_it_closed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-0");
    run(move || async move {
        let config = small_config();
        let mut log = open(&path, config.clone()).await.unwrap();
        let mut i = 0;
        while segment_bases(&path).len() < 4 {
            log.append(mutable(&batch(i, 2, 700, 1000 + i as i64)), LEADER)
                .await
                .unwrap();
            i += 1;
        }
        log.flush().await.unwrap();
        let sent = read_all(&mut log, 0).await;
        drop(log); // a crash: no close

        let bases = segment_bases(&path);
        let (closed, last) = (bases[bases.len() - 2], bases[bases.len() - 1]);
        let file = |base: i64, suffix: &str| path.join(format!("{base:020}.{suffix}"));
        let below_last: Vec<_> = sent
            .iter()
            .filter(|b| BatchHeader::parse(b).unwrap().base_offset < last)
            .cloned()
            .collect();
        assert!(
            below_last.len() < sent.len(),
            "the last segment holds batches"
        );
        let saved = dir.path().join("saved");
        copy_dir(&path, &saved);

        // (lost renames, lost new segment, recovery point at the closed or the new segment)
        let states = [
            (true, false, last),
            (false, true, last),
            (true, true, last),
            (true, true, closed),
        ];
        for (lose_indexes, lose_new_segment, recovery_point) in states {
            std::fs::remove_dir_all(&path).unwrap();
            copy_dir(&saved, &path);
            if lose_indexes {
                std::fs::remove_file(file(closed, "index")).unwrap();
                std::fs::remove_file(file(closed, "timeindex")).unwrap();
            }
            if lose_new_segment {
                std::fs::remove_file(file(last, "log")).unwrap();
            }
            std::fs::write(
                path.join("recovery-point-offset-checkpoint"),
                format!("0\n1\nt 0 {recovery_point}\n"),
            )
            .unwrap();
            let state = format!(
                "indexes lost {lose_indexes}, new segment lost {lose_new_segment}, \
                 recovery point {recovery_point}"
            );
            let mut log = open_uncached(&path, config.clone()).await.unwrap();
            let want = if lose_new_segment { &below_last } else { &sent };
            assert_eq!(&read_all(&mut log, 0).await, want, "{state}");
            let end = if lose_new_segment {
                last
            } else {
                BatchHeader::parse(sent.last().unwrap())
                    .unwrap()
                    .next_offset()
            };
            assert_eq!(log.log_end_offset(), end, "{state}");
            if !lose_new_segment {
                assert!(file(closed, "index").exists(), "{state}: indexes rebuilt");
            } // else the closed segment is the active one again: no index yet
              // Appends go on where the log ends.
            let info = log
                .append(mutable(&batch(9999, 1, 10, 0)), LEADER)
                .await
                .unwrap();
            assert_eq!(info.base_offset, end, "{state}");
            log.close().await.unwrap();
        }
    });
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

/// A log closing for good with a small last segment leaves that segment as a
/// crash would (no indexes, no clean-close record, the recovery point where
/// the roll put it): the next open scans it, which costs less than the
/// fdatasyncs of writing those files. The high watermark is still written.
#[test]
fn a_small_last_segment_closes_without_its_indexes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-0");
    run(move || async move {
        let config = skiff_engine::LogConfig {
            clean_close_scan_bytes: 1 << 20,
            ..small_config()
        };
        let mut log = open(&path, config.clone()).await.unwrap();
        let mut i = 0;
        while segment_bases(&path).len() < 3 {
            log.append(mutable(&batch(i, 2, 700, 1000)), LEADER)
                .await
                .unwrap();
            i += 1;
        }
        let sent = read_all(&mut log, 0).await;
        let end = log.log_end_offset();
        let bases = segment_bases(&path);
        let last = *bases.last().unwrap();
        let point = std::fs::read_to_string(path.join("recovery-point-offset-checkpoint")).unwrap();
        assert!(point.ends_with(&format!(" {last}\n")), "{point}");
        let file = |base: i64, suffix: &str| path.join(format!("{base:020}.{suffix}"));
        // What a crash between a roll's renames may leave: one index file.
        std::fs::write(file(last, "index"), [0u8; 8]).unwrap();
        log.shutdown_with_high_watermark(Some(end - 1))
            .await
            .unwrap();
        drop(log);

        assert!(!path.join("clean-shutdown-checkpoint").exists());
        assert!(
            !file(last, "index").exists(),
            "no index for the last segment"
        );
        assert!(!file(last, "timeindex").exists());
        assert!(
            file(bases[0], "index").exists(),
            "closed segments keep theirs"
        );
        assert_eq!(
            std::fs::read_to_string(path.join("recovery-point-offset-checkpoint")).unwrap(),
            point,
            "the recovery point stays where the roll put it"
        );
        let hw = std::fs::read_to_string(path.join("replication-offset-checkpoint")).unwrap();
        assert!(hw.ends_with(&format!(" {}\n", end - 1)), "{hw}");
        // The file holds exactly its data: trimmed and synced.
        let size = std::fs::metadata(file(last, "log")).unwrap().len();

        let recovered = skiff_engine::recovery::recover(&path, &config)
            .await
            .unwrap();
        assert_eq!(recovered.log_end_offset, end);
        assert_eq!(
            recovered.scanned_bytes, size,
            "only the last segment scanned"
        );
        assert_eq!(recovered.truncated_bytes, 0);
        drop(recovered);
        let mut log = open_uncached(&path, config.clone()).await.unwrap();
        assert_eq!(read_all(&mut log, 0).await, sent);
        log.close().await.unwrap();
    });
}

/// Group commits are pipelined (the next one writes while the last one
/// syncs, each sync covering its own target): with producers appending at
/// once into small segments (rolls between commits), every acknowledgement
/// finds its records flushed, and a reopened log holds every acknowledged
/// record, in order, without holes.
#[test]
fn pipelined_commits_acknowledge_only_flushed_records() {
    use std::rc::Rc;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-0");
    run(move || async move {
        let log = open_uncached(&path, small_config()).await.unwrap();
        let p = Rc::new(skiff_engine::Partition::new(log));
        let producers: Vec<_> = (0..8u64)
            .map(|producer| {
                let p = p.clone();
                glommio::spawn_local(async move {
                    let mut acked = Vec::new();
                    for i in 0..40u64 {
                        // 1 to 12 KiB: some batches fill the one-block chunk
                        // a commit leaves, some cross chunks.
                        let b = batch(producer * 1000 + i, 3, 100 + 350 * (i % 12) as usize, 0);
                        let info = p.append(mutable(&b), LEADER).await.unwrap();
                        assert!(
                            p.flushed_offset() > info.last_offset,
                            "acknowledged offset {} with the log flushed to {}",
                            info.last_offset,
                            p.flushed_offset()
                        );
                        acked.push((info.base_offset, b));
                    }
                    acked
                })
            })
            .collect();
        let mut acked = Vec::new();
        for producer in producers {
            acked.extend(producer.await);
        }
        acked.sort_by_key(|(base, _)| *base);
        let end = p.log_end();
        assert_eq!(end, 8 * 40 * 3);
        p.close().await.unwrap();
        let mut log = open_uncached(&path, small_config()).await.unwrap();
        assert!(
            segment_bases(&path).len() > 3,
            "the appends rolled segments"
        );
        let all = read_all(&mut log, 0).await;
        assert_eq!(all.len(), acked.len());
        for (read, (base, sent)) in all.iter().zip(&acked) {
            let h = BatchHeader::parse(read).unwrap();
            assert_eq!(h.base_offset, *base, "no hole");
            // The bytes as sent but for the stamped base offset and epoch.
            assert_eq!(read.len(), sent.len());
            assert_eq!(read[8..12], sent[8..12], "batch at {base}");
            assert_eq!(read[16..], sent[16..], "batch at {base}");
        }
        log.close().await.unwrap();
    });
}

/// Appends dropped part way (a caller that gives up on one) never leave the
/// log inconsistent: either the log carries on, or it goes offline saying
/// why, and the reopened log holds every acknowledged batch, at its offset,
/// with no hole and no offset twice.
#[test]
fn appends_dropped_part_way_lose_nothing_acknowledged() {
    let (mut went_offline, mut acked) = (0, 0);
    for seed in 0..6 {
        let (offline, n) = dropped_appends_round(seed);
        went_offline += usize::from(offline);
        acked += n;
    }
    assert!(
        went_offline > 0,
        "no round dropped an append part way through its write"
    );
    assert!(acked > 0, "nothing acknowledged in any round");
}

/// One round of `appends_dropped_part_way_lose_nothing_acknowledged`:
/// whether the log went offline, and how many appends were acknowledged.
fn dropped_appends_round(seed: u64) -> (bool, usize) {
    use std::rc::Rc;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-0");
    run(move || async move {
        let log = open_uncached(&path, small_config()).await.unwrap();
        let p = Rc::new(skiff_engine::Partition::new(log));
        let rng = Rc::new(std::cell::RefCell::new(fastrand::Rng::with_seed(seed)));
        let appenders: Vec<_> = (0..16u64)
            .map(|appender| {
                let p = p.clone();
                let rng = rng.clone();
                glommio::spawn_local(async move {
                    let mut acked = Vec::new();
                    let mut refused = None;
                    for i in 0..60u64 {
                        let b = batch(appender * 1000 + i, 2, 200 + 300 * (i % 10) as usize, 0);
                        let (drop_it, after) = {
                            let mut rng = rng.borrow_mut();
                            (rng.u32(0..3) == 0, rng.u64(0..3_000))
                        };
                        let append = p.append(mutable(&b), LEADER);
                        let result = if drop_it {
                            let give_up =
                                glommio::timer::sleep(std::time::Duration::from_micros(after));
                            futures_util::pin_mut!(append);
                            futures_util::pin_mut!(give_up);
                            match futures_util::future::select(append, give_up).await {
                                futures_util::future::Either::Left((r, _)) => Some(r),
                                futures_util::future::Either::Right(_) => None,
                            }
                        } else {
                            Some(append.await)
                        };
                        match result {
                            Some(Ok(info)) => acked.push((info.base_offset, b)),
                            Some(Err(LogError::Offline(reason))) => {
                                refused = Some(reason);
                                break;
                            }
                            Some(Err(e)) => panic!("append failed: {e}"),
                            None => {}
                        }
                    }
                    (acked, refused)
                })
            })
            .collect();
        let mut acked = Vec::new();
        let mut refusals = Vec::new();
        for appender in appenders {
            let (a, refused) = appender.await;
            acked.extend(a);
            refusals.extend(refused);
        }
        for reason in &refusals {
            assert!(reason.contains("cancelled"), "offline for: {reason}");
        }
        // A log that went offline leaves its files to recovery.
        let _ = p.close().await;
        let mut log = open_uncached(&path, small_config()).await.unwrap();
        let all = read_all(&mut log, 0).await;
        let mut next = 0;
        let mut by_base = std::collections::HashMap::new();
        for read in &all {
            let h = BatchHeader::parse(read).unwrap();
            assert_eq!(h.base_offset, next, "seed {seed}: no hole, no offset twice");
            next = h.last_offset() + 1;
            by_base.insert(h.base_offset, read);
        }
        for (base, sent) in &acked {
            let read = by_base
                .get(base)
                .unwrap_or_else(|| panic!("seed {seed}: acknowledged batch at {base} lost"));
            assert_eq!(read[16..], sent[16..], "seed {seed}: batch at {base}");
        }
        log.close().await.unwrap();
        (!refusals.is_empty(), acked.len())
    })
}
