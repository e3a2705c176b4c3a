#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Log compaction against a model: random keys, values and tombstones, appended
//! in batches of random codecs to a log with small segments, then cleaned (in
//! several passes when the offset map is small). A reader from the start must see
//! exactly the latest record of each key below the cleaned point and every record
//! above it, with offsets strictly increasing; after the delete horizon passes,
//! tombstones below the cleaned point are gone too. Plus: reads during a cleaning
//! always get valid batches, an interrupted swap is finished by recovery, and a
//! corrupt batch stops the cleaner without touching the log.

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use common::{mutable, run};
use proptest::prelude::*;
use skiff_engine::batch::{crc_matches, decode_records, BatchBuilder, BatchHeader, Compression};
use skiff_engine::batch_cache::BatchCache;
use skiff_engine::cleaner::offset_map::BYTES_PER_ENTRY;
use skiff_engine::segment::{segment_path, swap_path, LOG_SUFFIX};
use skiff_engine::{AppendMode, Cleaner, CleanerConfig, LogConfig, Partition, PartitionLog};

const LEADER: AppendMode = AppendMode::Leader { leader_epoch: 0 };
const DELETE_RETENTION_MS: i64 = 1_000;

/// One produced record: key index and value (None: a tombstone).
type Op = (u8, Option<Vec<u8>>);

fn compact_config() -> LogConfig {
    LogConfig {
        segment_bytes: 4 * 1024,
        index_interval_bytes: 512,
        preallocate_step_bytes: 64 * 1024,
        append_chunk_bytes: 16 * 1024,
        compact: true,
        min_cleanable_dirty_ratio: 0.0,
        delete_retention: Duration::from_millis(DELETE_RETENTION_MS as u64),
        ..LogConfig::default()
    }
}

fn cleaner(map_entries: usize) -> Cleaner {
    Cleaner::new(CleanerConfig {
        dedupe_buffer_bytes: map_entries * BYTES_PER_ENTRY,
        read_chunk_bytes: 8 * 1024,
        ..CleanerConfig::default()
    })
}

fn key(k: u8) -> Vec<u8> {
    format!("key-{k}").into_bytes()
}

async fn open_partition(dir: &Path, config: LogConfig, cache: usize) -> Partition {
    let log = PartitionLog::open(dir, "compacted", 0, config, BatchCache::new(cache))
        .await
        .unwrap();
    Partition::new(log)
}

/// Appends `ops` in batches of the given sizes (cycled) and codecs; returns the
/// offset each op got.
async fn append_ops(
    partition: &Partition,
    ops: &[Op],
    sizes: &[usize],
    codecs: &[Compression],
    first_timestamp: i64,
) -> Vec<i64> {
    let mut offsets = Vec::new();
    let mut i = 0;
    let mut n = 0;
    while i < ops.len() {
        let size = sizes[n % sizes.len()].max(1).min(ops.len() - i);
        let codec = codecs[n % codecs.len()];
        let mut b = BatchBuilder::new()
            .compression(codec)
            .producer(1, 0, i as i32);
        for (j, (k, v)) in ops[i..i + size].iter().enumerate() {
            b.push(
                first_timestamp + (i + j) as i64,
                Some(&key(*k)),
                v.as_deref(),
                &[],
            );
        }
        let info = partition
            .append(mutable(&b.build().unwrap()), LEADER)
            .await
            .unwrap();
        offsets.extend(info.base_offset..=info.last_offset);
        i += size;
        n += 1;
    }
    offsets
}

/// Every record readable from the start: (offset, key, value), checking each batch's
/// CRC and that offsets strictly increase.
async fn read_records(partition: &Partition) -> Vec<(i64, Option<Bytes>, Option<Bytes>)> {
    let end = partition.log_end_offset().await.unwrap();
    let mut offset = partition.log_start_offset().await.unwrap();
    let mut out: Vec<(i64, Option<Bytes>, Option<Bytes>)> = Vec::new();
    while offset < end {
        let read = partition.read(offset, 64 * 1024, i64::MAX).await.unwrap();
        assert!(!read.batches.is_empty(), "no progress at offset {offset}");
        for batch in &read.batches {
            crc_matches(batch).unwrap();
            let header = BatchHeader::parse(batch).unwrap();
            assert!(header.last_offset() >= offset.min(header.base_offset));
            for r in decode_records(batch, 1 << 24).unwrap() {
                if r.offset < offset {
                    continue; // the part of the first batch before the read offset
                }
                if let Some(last) = out.last() {
                    assert!(r.offset > last.0, "offset {} after {}", r.offset, last.0);
                }
                out.push((r.offset, r.key, r.value));
            }
        }
        offset = read.next_offset;
    }
    out
}

/// What a reader must see: below `cleaned_to`, the last record of each key there
/// (tombstones only while `keep_tombstones`); from `cleaned_to` on, everything.
fn model(
    ops: &[Op],
    offsets: &[i64],
    cleaned_to: i64,
    keep_tombstones: bool,
) -> Vec<(i64, Option<Bytes>, Option<Bytes>)> {
    let mut last_below: HashMap<u8, i64> = HashMap::new();
    for ((k, _), &o) in ops.iter().zip(offsets) {
        if o < cleaned_to {
            last_below.insert(*k, o);
        }
    }
    ops.iter()
        .zip(offsets)
        .filter(|((k, v), &o)| {
            o >= cleaned_to || (last_below[k] == o && (v.is_some() || keep_tombstones))
        })
        .map(|((k, v), &o)| (o, Some(Bytes::from(key(*k))), v.clone().map(Bytes::from)))
        .collect()
}

/// Cleans until a pass makes no progress; returns the cleaned point.
async fn clean_fully(cleaner: &mut Cleaner, partition: &Partition, now_ms: i64) -> i64 {
    let mut cleaned_to = partition.first_dirty_offset().await.unwrap();
    for _ in 0..1000 {
        let Some(stats) = cleaner.clean(partition, now_ms).await.unwrap() else {
            break;
        };
        if stats.cleaned_to <= cleaned_to {
            break;
        }
        cleaned_to = stats.cleaned_to;
    }
    cleaned_to
}

fn op() -> impl Strategy<Value = Op> {
    (
        0u8..40,
        prop_oneof![
            4 => prop::collection::vec(any::<u8>(), 0..60).prop_map(Some),
            1 => Just(None),
        ],
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn compaction_matches_the_model(
        ops in prop::collection::vec(op(), 1..700),
        sizes in prop::collection::vec(1usize..20, 1..6),
        codecs in prop::collection::vec(prop::sample::select(Compression::ALL.to_vec()), 1..4),
        map_entries in prop::sample::select(vec![64usize, 200, 100_000]),
        more in prop::collection::vec(op(), 0..100),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_path_buf();
        run(move || async move {
            let partition = open_partition(&path, compact_config(), 0).await;
            let mut offsets = append_ops(&partition, &ops, &sizes, &codecs, 1_000).await;
            let mut cleaner = cleaner(map_entries);
            let now = 10_000;
            let cleaned_to = clean_fully(&mut cleaner, &partition, now).await;
            let read = read_records(&partition).await;
            assert_eq!(read, model(&ops, &offsets, cleaned_to, true), "cleaned to {cleaned_to}");

            // More writes, then a cleaning past the horizon of the first
            // cleaning's tombstones: those go, newer tombstones stay.
            let mut all = ops.clone();
            offsets.extend(append_ops(&partition, &more, &sizes, &codecs, 5_000).await);
            all.extend(more.iter().cloned());
            let later = now + DELETE_RETENTION_MS + 1;
            let cleaned_again = clean_fully(&mut cleaner, &partition, later).await;
            let read = read_records(&partition).await;
            let first_cleaned: std::collections::HashSet<i64> =
                offsets.iter().copied().filter(|&o| o < cleaned_to).collect();
            let expected: Vec<_> = model(&all, &offsets, cleaned_again, true)
                .into_iter()
                .filter(|(o, _, v)| v.is_some() || !first_cleaned.contains(o))
                .collect();
            assert_eq!(read, expected, "cleaned to {cleaned_to}, then {cleaned_again}");

            // The result survives a restart (indexes rebuilt or loaded).
            partition.close().await.unwrap();
            let reopened = open_partition(&path, compact_config(), 0).await;
            assert_eq!(read_records(&reopened).await, expected);
            reopened.close().await.unwrap();
        });
    }
}

#[test]
fn reads_during_cleaning_get_valid_batches() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let partition = Rc::new(open_partition(&path, compact_config(), 1 << 20).await);
        let ops: Vec<Op> = (0..3000u32)
            .map(|i| ((i % 50) as u8, Some(vec![i as u8; 100])))
            .collect();
        let codecs = [Compression::None, Compression::Lz4];
        append_ops(&partition, &ops, &[7, 13], &codecs, 1_000).await;
        let stop = Rc::new(std::cell::Cell::new(false));
        let reader = {
            let (partition, stop) = (partition.clone(), stop.clone());
            glommio::spawn_local(async move {
                let mut passes = 0;
                while !stop.get() || passes == 0 {
                    let read = read_records(&partition).await;
                    assert!(!read.is_empty());
                    passes += 1;
                    glommio::timer::sleep(Duration::from_millis(1)).await;
                }
                passes
            })
        };
        let writer = {
            let (partition, stop) = (partition.clone(), stop.clone());
            glommio::spawn_local(async move {
                let mut n = 0;
                while !stop.get() && n < 100 {
                    let ops: Vec<Op> = (0..20u8).map(|i| (i, Some(vec![i; 50]))).collect();
                    append_ops(&partition, &ops, &[5], &[Compression::Zstd], 2_000).await;
                    n += 1;
                    glommio::timer::sleep(Duration::from_millis(1)).await;
                }
                n
            })
        };
        let mut cleaner = Cleaner::new(CleanerConfig {
            io_max_bytes_per_second: Some(20 << 20),
            read_chunk_bytes: 4096,
            ..CleanerConfig::default()
        });
        let mut cleanings = 0;
        for _ in 0..5 {
            if cleaner.clean(&partition, 10_000).await.unwrap().is_some() {
                cleanings += 1;
            }
        }
        stop.set(true);
        let passes = reader.await;
        let appends = writer.await;
        assert!(cleanings >= 1 && passes >= 1 && appends >= 1);
        // 50 keys, each now once below the cleaned point.
        let cleaned_to = partition.first_dirty_offset().await.unwrap();
        let read = read_records(&partition).await;
        let below = read.iter().filter(|r| r.0 < cleaned_to).count();
        assert!(below <= 50, "{below} records below {cleaned_to}");
    });
}

#[test]
fn recovery_finishes_an_interrupted_swap_and_drops_a_partial_cleaning() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let config = compact_config();
        let partition = open_partition(&path, config.clone(), 0).await;
        let ops: Vec<Op> = (0..400u32)
            .map(|i| ((i % 10) as u8, Some(vec![i as u8; 40])))
            .collect();
        let offsets = append_ops(&partition, &ops, &[10], &[Compression::None], 1_000).await;
        partition.close().await.unwrap();
        drop(partition);
        let mut bases: Vec<i64> = std::fs::read_dir(&path)
            .unwrap()
            .filter_map(|e| {
                let name = e.unwrap().file_name().into_string().unwrap();
                name.strip_suffix(".log").map(|s| s.parse().unwrap())
            })
            .collect();
        bases.sort();
        assert!(bases.len() >= 4, "{bases:?}");
        // A crash after the commit point: segments 0 and 1 are replaced by a swap
        // file holding only segment 0's data (as if segment 1 were all obsolete).
        let seg0 = std::fs::read(segment_path(&path, bases[0], LOG_SUFFIX)).unwrap();
        std::fs::write(swap_path(&path, bases[0], bases[2]), &seg0).unwrap();
        // ... and a leftover of a cleaning that never finished.
        std::fs::write(path.join(format!("{:020}.log.cleaned", bases[2])), b"junk").unwrap();
        let partition = open_partition(&path, config, 0).await;
        let read = read_records(&partition).await;
        let gone: Vec<i64> = offsets
            .iter()
            .copied()
            .filter(|&o| o >= bases[1] && o < bases[2])
            .collect();
        assert!(!gone.is_empty());
        assert_eq!(read.len(), offsets.len() - gone.len());
        assert!(read.iter().all(|r| r.0 < bases[1] || r.0 >= bases[2]));
        let names: Vec<String> = std::fs::read_dir(&path)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert!(
            !names
                .iter()
                .any(|n| n.ends_with(".swap") || n.ends_with(".cleaned")),
            "{names:?}"
        );
        assert!(!path.join(format!("{:020}.log", bases[1])).exists());
        partition.close().await.unwrap();
    });
}

/// A kill between a swap and `finish_cleaning` (or a pass abandoned after its
/// first swap) leaves compacted segments behind the old checkpoint offset: the
/// checkpoint's file must exist by then, since it is what tells `skiff-tools
/// verify` the log may hold compaction's gaps and short batches (the tools'
/// compaction crash test saw it missing).
#[test]
fn the_cleaner_checkpoint_exists_before_the_first_swap_commits() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let partition = open_partition(&path, compact_config(), 0).await;
        let ops: Vec<Op> = (0..200u32)
            .map(|i| ((i % 10) as u8, Some(vec![i as u8; 40])))
            .collect();
        append_ops(&partition, &ops, &[10], &[Compression::None], 1_000).await;
        let checkpoint = path.join(skiff_engine::checkpoint::CLEANER_CHECKPOINT_FILE);
        assert!(!checkpoint.exists(), "no cleaning yet");
        let plan = partition.clean_plan(1_000).await.unwrap().expect("a plan");
        let first = &plan.segments[0];
        // The swap of a pass that never finishes: the first segment goes whole.
        let old = [(first.base_offset, first.size)];
        drop(plan);
        assert!(partition.replace_segments(&old, None).await.unwrap());
        assert!(checkpoint.exists(), "swapped without a cleaner checkpoint");
        assert_eq!(partition.first_dirty_offset().await.unwrap(), 0);
        partition.close().await.unwrap();
        drop(partition);
        // Reopened, nothing counts as cleaned past the new log start.
        let partition = open_partition(&path, compact_config(), 0).await;
        assert!(checkpoint.exists());
        assert_eq!(
            partition.first_dirty_offset().await.unwrap(),
            partition.log_start_offset().await.unwrap()
        );
        partition.close().await.unwrap();
    });
}

#[test]
fn a_corrupt_batch_stops_the_cleaner_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let config = compact_config();
        let partition = open_partition(&path, config.clone(), 0).await;
        let ops: Vec<Op> = (0..300u32)
            .map(|i| ((i % 10) as u8, Some(vec![i as u8; 40])))
            .collect();
        append_ops(&partition, &ops, &[10], &[Compression::None], 1_000).await;
        partition.close().await.unwrap();
        drop(partition);
        // Flip a byte inside the second batch of the first segment.
        let seg = segment_path(&path, 0, LOG_SUFFIX);
        let mut bytes = std::fs::read(&seg).unwrap();
        let second = BatchHeader::parse(&bytes).unwrap().total_len();
        bytes[second + 100] ^= 0xff;
        std::fs::write(&seg, &bytes).unwrap();
        // The clean close's record is used up by the next open.
        let files = |path: &std::path::Path| -> Vec<_> {
            std::fs::read_dir(path)
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .filter(|n| n != "clean-shutdown-checkpoint")
                .collect()
        };
        let before = files(&path);
        // Recovery trusts closed segments below the recovery point (verify checks
        // them); the cleaner reads every batch and must refuse.
        let partition = open_partition(&path, config, 0).await;
        let err = cleaner(100_000)
            .clean(&partition, 10_000)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("CRC"), "{err}");
        assert_eq!(std::fs::read(&seg).unwrap(), bytes);
        let after = files(&path);
        assert_eq!(before.len(), after.len(), "{before:?} vs {after:?}");
        partition.close().await.unwrap();
    });
}

#[test]
fn keyless_records_and_superseded_producer_batches_go() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let partition = open_partition(&path, compact_config(), 0).await;
        // Producer 7's first batch will be wholly superseded; it is not its last,
        // so it disappears. Producer 8's only batch is wholly superseded too but is
        // its last: an empty batch keeps its offsets and sequence.
        let mut b = BatchBuilder::new().producer(7, 0, 0);
        b.push(1, Some(b"a"), Some(b"old"), &[]);
        b.push(1, None, Some(b"keyless"), &[]);
        partition
            .append(mutable(&b.build().unwrap()), LEADER)
            .await
            .unwrap();
        let mut b = BatchBuilder::new().producer(8, 0, 0);
        b.push(1, Some(b"b"), Some(b"old"), &[]);
        let p8 = partition
            .append(mutable(&b.build().unwrap()), LEADER)
            .await
            .unwrap();
        let mut b = BatchBuilder::new().producer(7, 0, 2);
        b.push(1, Some(b"a"), Some(b"new"), &[]);
        b.push(1, Some(b"b"), Some(b"new"), &[]);
        partition
            .append(mutable(&b.build().unwrap()), LEADER)
            .await
            .unwrap();
        // Roll so all of it is closed: a big batch fills the segment.
        let mut b = BatchBuilder::new();
        b.push(1, Some(b"filler"), Some(&[0u8; 5000]), &[]);
        partition
            .append(mutable(&b.build().unwrap()), LEADER)
            .await
            .unwrap();
        let mut b = BatchBuilder::new();
        b.push(1, Some(b"z"), Some(b"active"), &[]);
        partition
            .append(mutable(&b.build().unwrap()), LEADER)
            .await
            .unwrap();
        cleaner(1000)
            .clean(&partition, 10_000)
            .await
            .unwrap()
            .unwrap();
        let read = partition.read(0, 1 << 20, i64::MAX).await.unwrap();
        let headers: Vec<BatchHeader> = read
            .batches
            .iter()
            .map(|b| BatchHeader::parse(b).unwrap())
            .collect();
        assert!(headers
            .iter()
            .all(|h| h.producer_id != 7 || h.base_sequence != 0));
        let empty = headers.iter().find(|h| h.producer_id == 8).unwrap();
        assert_eq!(empty.records_count, 0);
        assert_eq!(
            (empty.base_offset, empty.last_offset()),
            (p8.base_offset, p8.last_offset)
        );
        let values: Vec<Option<Bytes>> = read
            .batches
            .iter()
            .flat_map(|b| decode_records(b, 1 << 20).unwrap())
            .map(|r| r.value)
            .collect();
        assert!(!values.contains(&Some(Bytes::from_static(b"old"))));
        assert!(!values.contains(&Some(Bytes::from_static(b"keyless"))));
        assert!(values.contains(&Some(Bytes::from_static(b"new"))));
        partition.close().await.unwrap();
    });
}

/// Kafka's cleaning of transactions: an aborted transaction's value never
/// displaces the committed one (it is neither mapped nor kept), markers stay,
/// and nothing at or past an open transaction (the last stable offset) is
/// cleaned.
#[test]
fn aborted_records_go_markers_stay_and_open_transactions_are_not_cleaned() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let partition = open_partition(&path, compact_config(), 0).await;
        let append = |bytes: Bytes| {
            let partition = &partition;
            async move { partition.append(mutable(&bytes), LEADER).await.unwrap() }
        };
        let data = |pid: i64, seq: i32, key: &[u8], value: &[u8]| txn_record(pid, seq, key, value);
        let marker = end_marker;
        // Producer 5 commits a=committed, then aborts a=aborted.
        append(data(5, 0, b"a", b"committed")).await;
        append(marker(5, true)).await;
        append(data(5, 1, b"a", b"aborted")).await;
        append(marker(5, false)).await;
        // A plain key written twice: the first goes.
        let mut b = BatchBuilder::new();
        b.push(1, Some(b"c"), Some(b"v1"), &[]);
        append(b.build().unwrap()).await;
        let mut b = BatchBuilder::new();
        b.push(1, Some(b"c"), Some(b"v2"), &[]);
        append(b.build().unwrap()).await;
        // Roll: all of the above is closed.
        let mut b = BatchBuilder::new();
        b.push(1, Some(b"filler"), Some(&[0u8; 5000]), &[]);
        append(b.build().unwrap()).await;
        // Producer 6's transaction stays open; c=v3 after it is unstable.
        let open = append(data(6, 0, b"c", b"open")).await;
        let mut b = BatchBuilder::new();
        b.push(1, Some(b"c"), Some(b"v3"), &[]);
        append(b.build().unwrap()).await;
        let mut b = BatchBuilder::new();
        b.push(1, Some(b"filler2"), Some(&[0u8; 5000]), &[]);
        append(b.build().unwrap()).await;
        let mut b = BatchBuilder::new();
        b.push(1, Some(b"z"), Some(b"active"), &[]);
        append(b.build().unwrap()).await;

        clean_fully(&mut cleaner(1000), &partition, 10_000).await;
        let records = read_records(&partition).await;
        let values: Vec<(i64, Option<Bytes>)> =
            records.iter().map(|(o, _, v)| (*o, v.clone())).collect();
        let has = |v: &[u8]| values.iter().any(|(_, x)| x.as_deref() == Some(v));
        // The committed value survives the aborted one written after it.
        assert!(has(b"committed"), "{values:?}");
        assert!(!has(b"aborted"), "{values:?}");
        // Below the open transaction, compaction went on as usual.
        assert!(!has(b"v1") && has(b"v2"), "{values:?}");
        // At and past the open transaction nothing was cleaned, though v3
        // supersedes both: the transaction may yet commit or abort.
        assert!(has(b"open") && has(b"v3"), "{values:?}");
        assert_eq!(
            partition.last_stable_offset().await.unwrap(),
            open.base_offset
        );
        // Both markers of producer 5 are still in the log.
        let read = partition.read(0, 1 << 20, i64::MAX).await.unwrap();
        let markers = read
            .batches
            .iter()
            .map(|b| BatchHeader::parse(b).unwrap())
            .filter(|h| h.is_control() && h.producer_id == 5)
            .count();
        assert_eq!(markers, 2);
    });
}

#[test]
fn markers_go_once_their_transactions_data_is_gone_and_their_horizon_passed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run(move || async move {
        let partition = open_partition(&path, compact_config(), 0).await;
        let append = |bytes: Bytes| {
            let partition = &partition;
            async move { partition.append(mutable(&bytes), LEADER).await.unwrap() }
        };
        let record = txn_record;
        let marker = |commit: bool| end_marker(5, commit);
        // Producer 5: a commits (later overwritten by a plain write), b
        // aborts, c commits and stays the latest c.
        append(record(5, 0, b"a", b"committed")).await;
        let commit_a = append(marker(true)).await.base_offset;
        append(record(5, 1, b"b", b"aborted")).await;
        let abort_b = append(marker(false)).await.base_offset;
        append(record(5, 2, b"c", b"kept")).await;
        let commit_c = append(marker(true)).await.base_offset;
        append(record(-1, 0, b"a", b"plain")).await;
        let roll = |n: u8| {
            let filler = format!("filler-{n}");
            async move {
                append(record(-1, 0, filler.as_bytes(), &[0u8; 5000])).await;
                append(record(-1, 0, b"z", b"active")).await;
            }
        };
        roll(0).await;
        let markers = || async {
            let read = partition.read(0, 1 << 20, i64::MAX).await.unwrap();
            read.batches
                .iter()
                .map(|b| BatchHeader::parse(b).unwrap())
                .filter(|h| h.is_control())
                .map(|h| (h.base_offset, h.has_delete_horizon()))
                .collect::<Vec<_>>()
        };
        let aborted = || async {
            let end = partition.log_end_offset().await.unwrap();
            partition.aborted_transactions(0, end).await.unwrap()
        };
        assert_eq!(aborted().await.len(), 1);

        // First pass: it reads every transaction's data, so every marker
        // stays as it was (the aborted record and the overwritten a go).
        let now = 10_000;
        clean_fully(&mut cleaner(1000), &partition, now).await;
        assert_eq!(
            markers().await,
            [(commit_a, false), (abort_b, false), (commit_c, false)]
        );
        assert_eq!(aborted().await.len(), 1);

        // Second pass (new dirty data): a's and b's transactions have no
        // batch left, so their markers get a horizon; c's keeps its record.
        roll(1).await;
        clean_fully(&mut cleaner(1000), &partition, now).await;
        assert_eq!(
            markers().await,
            [(commit_a, true), (abort_b, true), (commit_c, false)]
        );

        // Before the horizon they stay; after it the next pass drops them,
        // and the aborted transaction leaves the index with its marker.
        let mut c = cleaner(1000);
        let before = now + DELETE_RETENTION_MS - 1;
        c.clean(&partition, before).await.unwrap();
        assert_eq!(
            markers().await,
            [(commit_a, true), (abort_b, true), (commit_c, false)]
        );
        let later = now + DELETE_RETENTION_MS + 1;
        assert!(c.clean(&partition, later).await.unwrap().is_some());
        assert_eq!(markers().await, [(commit_c, false)]);
        assert!(aborted().await.is_empty(), "{:?}", aborted().await);
        let records = read_records(&partition).await;
        let values: Vec<Option<Bytes>> = records.iter().map(|(_, _, v)| v.clone()).collect();
        let has = |v: &[u8]| values.iter().any(|x| x.as_deref() == Some(v));
        assert!(has(b"kept") && has(b"plain"), "{values:?}");
        assert!(!has(b"committed") && !has(b"aborted"), "{values:?}");

        // Recovery agrees: reopened, the same markers and no aborted
        // transaction.
        partition.close().await.unwrap();
        let partition = open_partition(&path, compact_config(), 0).await;
        let end = partition.log_end_offset().await.unwrap();
        assert!(partition
            .aborted_transactions(0, end)
            .await
            .unwrap()
            .is_empty());
        let read = partition.read(0, 1 << 20, i64::MAX).await.unwrap();
        let kept: Vec<i64> = read
            .batches
            .iter()
            .map(|b| BatchHeader::parse(b).unwrap())
            .filter(|h| h.is_control())
            .map(|h| h.base_offset)
            .collect();
        assert_eq!(kept, [commit_c]);
    });
}

/// One record `key`=`value` at timestamp 1: of producer `pid`'s transaction
/// (sequence `seq`, epoch 0), or plain for a negative `pid`.
fn txn_record(pid: i64, seq: i32, key: &[u8], value: &[u8]) -> Bytes {
    let mut b = BatchBuilder::new();
    if pid >= 0 {
        b = b.producer(pid, 0, seq).transactional(true);
    }
    b.push(1, Some(key), Some(value), &[]);
    b.build().unwrap()
}

/// Producer `pid`'s COMMIT (or ABORT) marker at epoch 0, timestamp 1.
fn end_marker(pid: i64, commit: bool) -> Bytes {
    use skiff_engine::batch::{marker_batch, EndTxnMarker};
    let marker = EndTxnMarker {
        commit,
        coordinator_epoch: 0,
    };
    marker_batch(pid, 0, marker, 1).unwrap()
}
