#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Deletion in two steps (`skiff_engine::trash`, issue 15 item 5): a deleted
//! partition is renamed out of the way at once and freed in the background at
//! the configured pace; what a crash left half freed is freed at the next start.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{batch, mutable};
use skiff_engine::{AppendMode, OffsetQuery, Runtime, ShardConfig, TopicPartition};

const MIB: u64 = 1 << 20;

fn config(dir: &Path, delete_bytes_per_second: u64) -> ShardConfig {
    let mut c = ShardConfig::unpinned(dir, 1);
    c.log = common::small_config();
    c.io_memory_bytes = 8 << 20;
    c.delete_bytes_per_second = delete_bytes_per_second;
    c
}

/// Entries of `dir` whose name ends with `suffix`.
fn named(dir: &Path, suffix: &str) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.to_str().is_some_and(|n| n.ends_with(suffix)))
        .collect()
}

/// Polls `done` every 20 ms for at most `limit`; panics with `what` past it.
fn wait_until(limit: Duration, what: &str, mut done: impl FnMut() -> bool) -> Duration {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < limit, "{what} not within {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    started.elapsed()
}

fn append_some(rt: &Runtime, tp: &TopicPartition, batches: u64) {
    let tp = tp.clone();
    rt.block_on(0, move |shard| async move {
        for i in 0..batches {
            shard
                .append(
                    &tp,
                    mutable(&batch(i, 3, 200, 1000)),
                    AppendMode::Leader { leader_epoch: 1 },
                )
                .await
                .unwrap();
        }
    })
    .unwrap();
}

/// `tp` made, given 5 batches and closed by a runtime that then stops.
fn stopped_partition(dir: &Path, tp: &TopicPartition) {
    let rt = Runtime::start(config(dir, 64 * MIB)).unwrap();
    let tp2 = tp.clone();
    rt.block_on(0, move |shard| async move {
        shard.create_partition(&tp2).await.unwrap()
    })
    .unwrap();
    append_some(&rt, tp, 5);
    rt.shutdown().unwrap();
}

#[test]
fn a_deleted_partition_is_renamed_at_once_and_freed_at_the_set_pace() {
    let dir = tempfile::tempdir().unwrap();
    // 32 MiB/s: a 128 MiB file takes 7 steps of 16 MiB, half a second each.
    let rt = Runtime::start(config(dir.path(), 32 * MIB)).unwrap();
    let tp = TopicPartition::new("big", 0);
    let tp2 = tp.clone();
    rt.block_on(0, move |shard| async move {
        shard.create_partition(&tp2).await.unwrap()
    })
    .unwrap();
    append_some(&rt, &tp, 10);
    // A large file in the partition (sparse: the pace counts its length).
    let large = std::fs::File::create(dir.path().join("big-0").join("large.bin")).unwrap();
    large.set_len(128 * MIB).unwrap();
    drop(large);

    let tp2 = tp.clone();
    rt.block_on(0, move |shard| async move {
        shard.delete_partition(&tp2).await.unwrap()
    })
    .unwrap();
    let deleted = Instant::now();
    // Out of the log's way at once, under Kafka's name for it.
    assert!(!dir.path().join("big-0").exists());
    let doomed = named(dir.path(), "-delete");
    assert_eq!(doomed.len(), 1, "{doomed:?}");
    let name = doomed[0].file_name().unwrap().to_str().unwrap().to_string();
    assert!(
        name.starts_with("big-0.") && name.ends_with("-delete"),
        "{name}"
    );

    // The same partition made again at once does not meet its old files.
    let tp2 = tp.clone();
    rt.block_on(0, move |shard| async move {
        shard.create_partition(&tp2).await.unwrap()
    })
    .unwrap();
    append_some(&rt, &tp, 2);
    let tp2 = tp.clone();
    let latest = rt
        .block_on(0, move |shard| async move {
            shard.list_offset(&tp2, OffsetQuery::Latest).await.unwrap()
        })
        .unwrap();
    assert_eq!(latest, Some((6, -1)));

    // Freed step by step: the large file is seen shorter but not gone.
    let large = doomed[0].join("large.bin");
    wait_until(Duration::from_secs(20), "the large file shrinking", || {
        std::fs::metadata(&large).is_ok_and(|m| m.len() < 128 * MIB && m.len() > 0)
    });
    wait_until(
        Duration::from_secs(30),
        "the deleted directory freed",
        || !doomed[0].exists(),
    );
    let took = deleted.elapsed();
    // 7 pauses of 0.5 s at least: the pace held.
    assert!(took >= Duration::from_millis(3000), "freed in {took:?}");
    rt.shutdown().unwrap();
    assert!(dir.path().join("big-0").exists());
}

#[test]
fn what_a_crash_left_half_deleted_is_freed_at_the_next_start() {
    let dir = tempfile::tempdir().unwrap();
    let tp = TopicPartition::new("kept", 0);
    stopped_partition(dir.path(), &tp);

    // As a crash leaves them: a renamed partition directory and a renamed
    // segment inside a live partition.
    let doomed_dir = dir.path().join("gone-3.0011223344556677-delete");
    std::fs::create_dir(&doomed_dir).unwrap();
    std::fs::File::create(doomed_dir.join("00000000000000000000.log"))
        .unwrap()
        .set_len(40 * MIB)
        .unwrap();
    let doomed_file = dir
        .path()
        .join("kept-0")
        .join("00000000000000000099.log.deleted");
    std::fs::File::create(&doomed_file)
        .unwrap()
        .set_len(40 * MIB)
        .unwrap();

    let rt = Runtime::start(config(dir.path(), 64 * MIB)).unwrap();
    wait_until(Duration::from_secs(30), "the leftovers freed", || {
        !doomed_dir.exists() && !doomed_file.exists()
    });
    // Neither was taken for a partition or a segment.
    let owned = rt
        .block_on(0, |shard| async move { shard.local_partitions().len() })
        .unwrap();
    assert_eq!(owned, 1);
    let latest = rt
        .block_on(0, move |shard| async move {
            shard.list_offset(&tp, OffsetQuery::Latest).await.unwrap()
        })
        .unwrap();
    assert_eq!(latest, Some((15, -1)));
    rt.shutdown().unwrap();
}

/// Deletions that come faster than the pace must not fill the disk: above
/// `delete_backlog_bytes` waiting, the trash frees without pausing; at or
/// below it the pace holds again.
#[test]
fn a_backlog_over_its_limit_is_freed_without_the_pace() {
    let dir = tempfile::tempdir().unwrap();
    stopped_partition(dir.path(), &TopicPartition::new("busy", 0));
    // Eight removed segments of 32 MiB waiting (sparse): 256 MiB, which at
    // 1 MiB/s would take four minutes.
    let partition = dir.path().join("busy-0");
    for i in 0..8 {
        std::fs::File::create(partition.join(format!("{:020}.log.deleted", 1000 + i)))
            .unwrap()
            .set_len(32 * MIB)
            .unwrap();
    }
    let waiting = || -> u64 {
        named(&partition, ".log.deleted")
            .iter()
            .map(|p| std::fs::metadata(p).map_or(0, |m| m.len()))
            .sum()
    };

    let mut c = config(dir.path(), MIB);
    c.delete_backlog_bytes = 64 * MIB;
    let rt = Runtime::start(c).unwrap();
    // Down to the limit (plus the step in hand) fast...
    wait_until(
        Duration::from_secs(20),
        "the backlog down to its limit",
        || waiting() <= 64 * MIB + 16 * MIB,
    );
    // ...then paced: 1 MiB/s frees 16 MiB in 16 s, so most stays for now.
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        waiting() >= 32 * MIB,
        "below the limit the pace holds: {} MiB left",
        waiting() / MIB
    );
    rt.shutdown().unwrap();
}
