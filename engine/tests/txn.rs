#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The log's transaction side on real files: open transactions, the last
//! stable offset and every segment's aborted transaction index, as appends
//! build them, and as a clean reopen, a crash, and truncation leave them.
//! The expectation is always the log's own batches read back and replayed
//! through a fresh `TxnTracker` (the rules have their own property test in
//! `txn.rs`; this checks what is kept, written and rebuilt).

mod common;

use std::path::Path;

use bytes::Bytes;
use common::*;
use skiff_engine::batch::{marker_batch, BatchBuilder, BatchHeader, EndTxnMarker};
use skiff_engine::segment::txn_index::{AbortedTxn, TxnIndex};
use skiff_engine::txn::TxnTracker;
use skiff_engine::{AppendMode, PartitionLog};

const LEADER: AppendMode = AppendMode::Leader { leader_epoch: 1 };
const PRODUCERS: i64 = 3;

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    }
}

fn data(producer: Option<i64>, records: usize, seq: i32) -> Bytes {
    let mut b = BatchBuilder::new();
    if let Some(pid) = producer {
        b = b.producer(pid, 0, seq).transactional(true);
    }
    for i in 0..records {
        b.push(1_000 + i as i64, Some(b"k"), Some(&[7u8; 700]), &[]);
    }
    b.build().unwrap()
}

fn marker(pid: i64, commit: bool) -> Bytes {
    marker_batch(
        pid,
        0,
        EndTxnMarker {
            commit,
            coordinator_epoch: 0,
        },
        2_000,
    )
    .unwrap()
}

/// Appends `n` batches: plain data, transactional data of one of the
/// producers, or a marker (mostly for an open transaction, sometimes for
/// none: an empty transaction).
async fn append_mix(log: &mut PartitionLog, rng: &mut Rng, n: usize) {
    let mut seq = [0i32; PRODUCERS as usize];
    for _ in 0..n {
        let pid = rng.below(PRODUCERS as u64) as i64 + 100;
        let b = match rng.below(10) {
            0..=2 => data(None, 1 + rng.below(3) as usize, -1),
            3..=6 => {
                let s = &mut seq[(pid - 100) as usize];
                let records = 1 + rng.below(3) as usize;
                let b = data(Some(pid), records, *s);
                *s += records as i32;
                b
            }
            7 | 8 => marker(pid, false),
            _ => marker(pid, true),
        };
        log.append(mutable(&b), LEADER).await.unwrap();
    }
}

/// What the log's own batches say: every aborted transaction in marker
/// order, the open ones, and the tracker (for the LSO at any high watermark).
async fn replayed(log: &mut PartitionLog) -> (Vec<AbortedTxn>, Vec<(i64, i64)>, TxnTracker) {
    let start = log.log_start_offset();
    let mut tracker = TxnTracker::default();
    let mut aborted = Vec::new();
    for b in read_all(log, start).await {
        let header = BatchHeader::parse(&b).unwrap();
        if let Some(a) = tracker.replay(&header, &b).unwrap() {
            aborted.push(a);
        }
    }
    let open = tracker.open().collect();
    (aborted, open, tracker)
}

async fn check(log: &mut PartitionLog, what: &str) -> Vec<AbortedTxn> {
    let (aborted, open, tracker) = replayed(log).await;
    let (start, end) = (log.log_start_offset(), log.log_end_offset());
    assert_eq!(
        log.aborted_transactions(log.log_start_offset(), i64::MAX),
        aborted,
        "{what}: aborted transactions"
    );
    assert_eq!(log.open_transactions(), open, "{what}: open transactions");
    for hw in [start, (start + end) / 2, end - 1, end] {
        assert_eq!(
            log.last_stable_offset(hw),
            tracker.last_stable_offset(hw),
            "{what}: LSO at high watermark {hw}"
        );
    }
    aborted
}

/// Every `.txnindex` file of the directory, decoded, in segment order.
fn index_files(dir: &Path) -> Vec<(i64, Vec<AbortedTxn>)> {
    let mut out: Vec<(i64, Vec<AbortedTxn>)> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().into_string().unwrap();
            let base: i64 = name.strip_suffix(".txnindex")?.parse().ok()?;
            let bytes = std::fs::read(dir.join(&name)).unwrap();
            let index = TxnIndex::decode(&bytes, base).unwrap();
            Some((base, index.entries().to_vec()))
        })
        .collect();
    out.sort_by_key(|(b, _)| *b);
    out
}

fn write_recovery_point(dir: &Path, offset: i64) {
    std::fs::write(
        dir.join("recovery-point-offset-checkpoint"),
        format!("0\n1\nt 0 {offset}\n"),
    )
    .unwrap();
}

#[test]
fn transactions_are_indexed_as_appended_and_survive_a_clean_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-0");
    run(move || async move {
        let mut log = open(&path, small_config()).await.unwrap();
        let mut rng = Rng(0x5eed_0001);
        append_mix(&mut log, &mut rng, 400).await;
        assert!(log.segments().count() > 5, "small segments must roll");
        let aborted = check(&mut log, "as appended").await;
        assert!(
            aborted.len() > 10,
            "the mix aborts transactions: {aborted:?}"
        );
        assert!(!log.open_transactions().is_empty() || aborted.len() > 10);
        // A search bounded below the end stops early but misses nothing
        // that overlaps the range (Kafka's collect).
        let mid = log.log_end_offset() / 2;
        let part = log.aborted_transactions(mid / 2, mid);
        let want: Vec<_> = aborted
            .iter()
            .filter(|t| t.last_offset >= mid / 2 && t.first_offset < mid)
            .copied()
            .collect();
        for t in &want {
            assert!(
                part.contains(t),
                "{t:?} missing from the search of [{}, {mid})",
                mid / 2
            );
        }
        // A fetch stops at a segment's end: every segment boundary as the
        // bound, from the segment's start and from its last offsets; a
        // marker in a later segment than its records included.
        let bases: Vec<i64> = log.segments().map(|s| s.base_offset()).collect();
        for pair in bases.windows(2) {
            let (start, bound) = (pair[0], pair[1]);
            for from in [start, (start + bound) / 2, bound - 1] {
                let found = log.aborted_transactions(from, bound);
                for t in aborted
                    .iter()
                    .filter(|t| t.last_offset >= from && t.first_offset < bound)
                {
                    assert!(
                        found.contains(t),
                        "{t:?} missing from the search of [{from}, {bound})"
                    );
                }
            }
        }
        log.close().await.unwrap();
        // Closed segments hold their aborted transactions in .txnindex
        // (only those that have one), the active one too after a close.
        let files: Vec<AbortedTxn> = index_files(&path)
            .into_iter()
            .flat_map(|(_, e)| e)
            .collect();
        assert_eq!(files, aborted, ".txnindex files");
        assert!(index_files(&path).iter().all(|(_, e)| !e.is_empty()));
        let mut log = open(&path, small_config()).await.unwrap();
        check(&mut log, "after a clean reopen").await;
        append_mix(&mut log, &mut rng, 100).await;
        check(&mut log, "appending after the reopen").await;
        log.close().await.unwrap();
    });
}

/// Nemesis seed 10001: a transaction's records at the end of one segment,
/// its ABORT marker the first batch of the next (the segment rolled for
/// `segment.ms` while the abort waited). A read_committed fetch of the
/// records stops at the segment's end, so its upper bound is the marker's
/// offset; the search must still find the marker's entry in the next
/// segment's index, or the consumer takes the aborted records as committed.
#[test]
fn an_abort_marker_that_starts_the_next_segment_is_found_for_its_records() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-0");
    run(move || async move {
        let config = skiff_engine::LogConfig {
            segment_ms: Some(std::time::Duration::from_millis(30)),
            ..small_config()
        };
        let mut log = open(&path, config.clone()).await.unwrap();
        log.append(mutable(&data(None, 2, -1)), LEADER)
            .await
            .unwrap();
        let first = log
            .append(mutable(&data(Some(100), 2, 0)), LEADER)
            .await
            .unwrap()
            .base_offset;
        glommio::timer::sleep(std::time::Duration::from_millis(60)).await;
        let marker_at = log
            .append(mutable(&marker(100, false)), LEADER)
            .await
            .unwrap()
            .base_offset;
        let bases: Vec<i64> = log.segments().map(|s| s.base_offset()).collect();
        assert_eq!(bases, [0, marker_at], "the marker starts a segment");
        let want = AbortedTxn {
            producer_id: 100,
            first_offset: first,
            last_offset: marker_at,
            last_stable_offset: marker_at + 1,
        };
        for from in [0, first, marker_at - 1] {
            assert_eq!(
                log.aborted_transactions(from, marker_at),
                [want],
                "a fetch from {from} up to the segment's end"
            );
        }
        // A bound at or below the records' start: not theirs.
        assert!(log.aborted_transactions(0, first).is_empty());
        log.close().await.unwrap();
        // What a fetch from the records reads from disk: up to the
        // segment's end, the bound the fetch handler searches with.
        let mut log = open_uncached(&path, config).await.unwrap();
        let read = log.read(first, 1 << 20, i64::MAX).await.unwrap();
        assert_eq!(read.next_offset, marker_at);
        assert_eq!(log.aborted_transactions(first, read.next_offset), [want]);
        log.close().await.unwrap();
    });
}

#[test]
fn a_crash_rebuilds_them_from_the_state_of_a_roll() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-0");
    run(move || async move {
        let mut log = open(&path, small_config()).await.unwrap();
        let mut rng = Rng(0x5eed_0002);
        append_mix(&mut log, &mut rng, 500).await;
        log.flush().await.unwrap();
        let want = check(&mut log, "before the crash").await;
        // A crash: nothing closed, the recovery point where the last roll
        // (or the open) left it.
        drop(log);
        let mut log = open(&path, small_config()).await.unwrap();
        assert_eq!(check(&mut log, "after the crash").await, want);
        log.flush().await.unwrap();
        drop(log);
        // A crash between a roll's state and its recovery point: recovery
        // scans from the segment before, whose state is kept too; and one
        // far older, with no state kept: replayed from the log start.
        let bases = segment_bases(&path);
        for back in [2, 6] {
            write_recovery_point(&path, bases[bases.len() - back]);
            let mut log = open(&path, small_config()).await.unwrap();
            assert_eq!(
                check(&mut log, &format!("recovery point {back} segments back")).await,
                want
            );
            log.flush().await.unwrap();
            drop(log);
        }
        let mut log = open(&path, small_config()).await.unwrap();
        append_mix(&mut log, &mut rng, 100).await;
        check(&mut log, "appending after the crashes").await;
        log.close().await.unwrap();
    });
}

#[test]
fn truncation_cuts_transactions_and_their_index() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-0");
    run(move || async move {
        let mut log = open(&path, small_config()).await.unwrap();
        let mut rng = Rng(0x5eed_0003);
        for round in 0..6 {
            append_mix(&mut log, &mut rng, 150).await;
            let end = log.log_end_offset();
            let cut = end - 1 - rng.below((end / 3) as u64) as i64;
            log.truncate_to(cut).await.unwrap();
            assert!(log.log_end_offset() <= cut);
            check(&mut log, &format!("round {round}: cut at {cut}")).await;
            if round % 2 == 1 {
                log.flush().await.unwrap();
                drop(log);
                log = open(&path, small_config()).await.unwrap();
                check(&mut log, &format!("round {round}: reopened")).await;
            }
        }
        log.close().await.unwrap();
        let files: Vec<AbortedTxn> = index_files(&path)
            .into_iter()
            .flat_map(|(_, e)| e)
            .collect();
        let mut log = open(&path, small_config()).await.unwrap();
        assert_eq!(files, check(&mut log, "closed").await);
        // Starting over empty forgets every transaction.
        let end = log.log_end_offset();
        log.truncate_fully_and_start_at(end + 10).await.unwrap();
        assert!(log.open_transactions().is_empty());
        assert!(log.aborted_transactions(0, i64::MAX).is_empty());
        assert_eq!(log.last_stable_offset(end + 10), end + 10);
        log.close().await.unwrap();
        let mut log = open(&path, small_config()).await.unwrap();
        assert!(log.open_transactions().is_empty());
        check(&mut log, "started over").await;
    });
}

#[test]
fn a_log_without_transactions_writes_nothing_for_them() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t-0");
    run(move || async move {
        let mut log = open(&path, small_config()).await.unwrap();
        for i in 0..200 {
            let b = batch(i, 2, 900, 1_000);
            log.append(mutable(&b), LEADER).await.unwrap();
        }
        assert!(log.segments().count() > 3);
        log.close().await.unwrap();
        let log = open(&path, small_config()).await.unwrap();
        let end = log.log_end_offset();
        assert_eq!(log.last_stable_offset(end), end);
        log.close().await.unwrap();
        let names: Vec<String> = std::fs::read_dir(&path)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.ends_with(".txnindex") || n.starts_with("txn-state"))
            .collect();
        assert!(names.is_empty(), "{names:?}");
    });
}
