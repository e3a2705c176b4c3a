#![allow(clippy::unwrap_used)]

use raft::Storage;

use super::*;

fn entry(index: u64, term: u64, data: &[u8]) -> Entry {
    Entry {
        index,
        term,
        data: data.to_vec().into(),
        ..Default::default()
    }
}

fn indexes(log: &MetadataLog) -> Vec<(u64, u64)> {
    let (first, last) = (log.first_index().unwrap(), log.last_index().unwrap());
    log.entries(first, last + 1, None, GetEntriesContext::empty(false))
        .unwrap()
        .iter()
        .map(|e| (e.index, e.term))
        .collect()
}

/// Writes `batches` synced batches of 3 entries each; returns the file length
/// after every batch.
fn write_batches(dir: &Path, batches: u64) -> Vec<u64> {
    let mut log = MetadataLog::open(dir).unwrap();
    log.bootstrap(&[1, 2, 3]).unwrap();
    let mut ends = Vec::new();
    for b in 0..batches {
        let ents: Vec<Entry> = (0..3)
            .map(|i| entry(b * 3 + i + 1, 1, format!("e{b}-{i}").as_bytes()))
            .collect();
        log.append(&ents).unwrap();
        log.set_hard_state(HardState {
            term: 1,
            vote: 1,
            commit: b * 3 + 3,
            ..Default::default()
        });
        log.sync().unwrap();
        ends.push(
            std::fs::metadata(dir.join(LOG_DIR).join(LOG_FILE))
                .unwrap()
                .len(),
        );
    }
    ends
}

#[test]
fn entries_hard_state_and_conf_state_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    write_batches(dir.path(), 4);
    let log = MetadataLog::open(dir.path()).unwrap();
    assert_eq!(log.first_index().unwrap(), 1);
    assert_eq!(log.last_index().unwrap(), 12);
    assert_eq!(log.hard_state().commit, 12);
    assert_eq!(log.hard_state().vote, 1);
    assert_eq!(log.conf_state().voters, vec![1, 2, 3]);
    let e = log
        .entries(5, 6, None, GetEntriesContext::empty(false))
        .unwrap();
    assert_eq!(e[0].get_data(), b"e1-1");
    assert_eq!(log.term(12).unwrap(), 1);
    assert!(log.term(13).is_err());
    assert!(log
        .entries(1, 14, None, GetEntriesContext::empty(false))
        .is_err());
}

#[test]
fn conflicting_suffix_is_replaced_and_stays_replaced() {
    let dir = tempfile::tempdir().unwrap();
    write_batches(dir.path(), 2);
    let mut log = MetadataLog::open(dir.path()).unwrap();
    log.append(&[entry(4, 2, b"new4"), entry(5, 2, b"new5")])
        .unwrap();
    log.sync().unwrap();
    assert_eq!(indexes(&log), vec![(1, 1), (2, 1), (3, 1), (4, 2), (5, 2)]);
    drop(log);
    let log = MetadataLog::open(dir.path()).unwrap();
    assert_eq!(indexes(&log), vec![(1, 1), (2, 1), (3, 1), (4, 2), (5, 2)]);
    // A gap is a bug in the caller: refused.
    let mut log = log;
    assert!(matches!(
        log.append(&[entry(9, 2, b"x")]),
        Err(StorageError::Gap { .. })
    ));
}

#[test]
fn unsynced_batch_is_not_recovered() {
    let dir = tempfile::tempdir().unwrap();
    write_batches(dir.path(), 1);
    let mut log = MetadataLog::open(dir.path()).unwrap();
    log.append(&[entry(4, 1, b"lost")]).unwrap();
    drop(log); // crash before sync: never written
    let log = MetadataLog::open(dir.path()).unwrap();
    assert_eq!(log.last_index().unwrap(), 3);
}

/// Simulated crash mid-write: the last batch is cut at every byte, or its tail
/// garbled, or zeros appended. Recovery keeps every synced batch before it.
#[test]
fn torn_tail_is_cut_and_synced_entries_kept() {
    let dir = tempfile::tempdir().unwrap();
    let ends = write_batches(dir.path(), 3);
    let path = dir.path().join(LOG_DIR).join(LOG_FILE);
    let pristine = std::fs::read(&path).unwrap();
    let (before_last, end) = (ends[1] as usize, ends[2] as usize);
    assert_eq!(pristine.len(), end);
    let check = |bytes: &[u8], what: &str| {
        std::fs::write(&path, bytes).unwrap();
        let log = MetadataLog::open(dir.path()).unwrap_or_else(|e| panic!("{what}: {e}"));
        let last = log.last_index().unwrap();
        assert!(
            last == 6 || (last == 9 && bytes.len() >= end),
            "{what}: last {last}"
        );
        assert_eq!(log.hard_state().commit, last, "{what}");
        // The cut is on disk: appending after recovery works and survives.
        let mut log = log;
        log.append(&[entry(last + 1, 1, b"after")]).unwrap();
        log.sync().unwrap();
        drop(log);
        let log = MetadataLog::open(dir.path()).unwrap();
        assert_eq!(log.last_index().unwrap(), last + 1, "{what}");
    };
    for cut in before_last..end {
        check(&pristine[..cut], &format!("cut at {cut}"));
    }
    for pos in [before_last + 3, before_last + 20, end - 1] {
        let mut garbled = pristine.clone();
        garbled[pos] ^= 0x5a;
        // The torn write may also leave the marker itself damaged: cut it too.
        garbled.truncate(end - 4);
        check(&garbled, &format!("garbled at {pos}"));
    }
    let mut zeros = pristine[..before_last + 10].to_vec();
    zeros.extend_from_slice(&[0u8; 4096]);
    check(&zeros, "zero-filled tail");
    let mut garbage = pristine.clone();
    garbage.extend_from_slice(b"\x05\x00\x00\x00garbage-after-the-last-sync");
    check(&garbage, "garbage appended");
}

#[test]
fn corruption_below_the_synced_point_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let ends = write_batches(dir.path(), 3);
    let path = dir.path().join(LOG_DIR).join(LOG_FILE);
    let pristine = std::fs::read(&path).unwrap();
    for pos in [0usize, 2, 12, ends[0] as usize + 5, ends[1] as usize - 3] {
        let mut bad = pristine.clone();
        bad[pos] ^= 0x01;
        std::fs::write(&path, &bad).unwrap();
        match MetadataLog::open(dir.path()) {
            Err(StorageError::Corrupt { position, .. }) => assert!(position <= pos as u64),
            other => panic!(
                "flip at {pos}: expected Corrupt, got {:?}",
                other.map(|l| l.last())
            ),
        }
    }
}

#[test]
fn compaction_writes_snapshot_and_truncates_log() {
    let dir = tempfile::tempdir().unwrap();
    write_batches(dir.path(), 4);
    let mut log = MetadataLog::open(dir.path()).unwrap();
    let bytes_before = log.log_bytes();
    log.compact(9, b"state@9".to_vec()).unwrap();
    assert!(log.log_bytes() < bytes_before);
    assert_eq!(log.first_index().unwrap(), 10);
    assert_eq!(log.term(9).unwrap(), 1);
    assert!(matches!(
        log.term(8),
        Err(raft::Error::Store(raft::StorageError::Compacted))
    ));
    assert!(log
        .entries(8, 10, None, GetEntriesContext::empty(false))
        .is_err());
    // Beyond the commit point: refused.
    assert!(log.compact(13, vec![]).is_err());
    drop(log);
    let log = MetadataLog::open(dir.path()).unwrap();
    assert_eq!(indexes(&log), vec![(10, 1), (11, 1), (12, 1)]);
    let snap = log.snapshot(0, 2).unwrap();
    assert_eq!(snap.get_metadata().index, 9);
    assert_eq!(snap.get_data(), b"state@9");
    assert_eq!(snap.get_metadata().get_conf_state().voters, vec![1, 2, 3]);
    assert!(log.snapshot(10, 2).is_err());
    assert_eq!(
        std::fs::metadata(dir.path().join(LOG_DIR).join(LOG_FILE))
            .unwrap()
            .len(),
        log.log_bytes()
    );
}

#[test]
fn received_snapshot_replaces_the_log() {
    let dir = tempfile::tempdir().unwrap();
    write_batches(dir.path(), 1);
    let mut log = MetadataLog::open(dir.path()).unwrap();
    let mut snap = Snapshot::default();
    snap.set_data(b"leader-state".to_vec().into());
    snap.mut_metadata().index = 20;
    snap.mut_metadata().term = 3;
    snap.mut_metadata().set_conf_state(ConfState {
        voters: vec![1, 2, 3],
        ..Default::default()
    });
    log.apply_snapshot(snap).unwrap();
    assert_eq!(log.first_index().unwrap(), 21);
    assert_eq!(log.last_index().unwrap(), 20);
    assert_eq!(log.term(20).unwrap(), 3);
    log.append(&[entry(21, 3, b"x")]).unwrap();
    log.sync().unwrap();
    drop(log);
    let log = MetadataLog::open(dir.path()).unwrap();
    assert_eq!(indexes(&log), vec![(21, 3)]);
    assert_eq!(log.hard_state().commit, 20);
    assert_eq!(log.latest_snapshot().get_data(), b"leader-state");
}

#[test]
fn crash_between_snapshot_and_log_rewrite_skips_old_entries() {
    let dir = tempfile::tempdir().unwrap();
    write_batches(dir.path(), 3);
    let path = dir.path().join(LOG_DIR).join(LOG_FILE);
    let old_log = std::fs::read(&path).unwrap();
    let mut log = MetadataLog::open(dir.path()).unwrap();
    log.compact(4, b"s".to_vec()).unwrap();
    drop(log);
    // As if the rename of the rewritten log never happened.
    std::fs::write(&path, &old_log).unwrap();
    let log = MetadataLog::open(dir.path()).unwrap();
    assert_eq!(log.first_index().unwrap(), 5);
    assert_eq!(log.last_index().unwrap(), 9);
}

#[test]
fn corrupted_snapshot_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    write_batches(dir.path(), 2);
    let mut log = MetadataLog::open(dir.path()).unwrap();
    log.compact(3, b"snap".to_vec()).unwrap();
    drop(log);
    let path = dir.path().join(LOG_DIR).join(SNAPSHOT_FILE);
    let mut bytes = std::fs::read(&path).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&path, &bytes).unwrap();
    assert!(matches!(
        MetadataLog::open(dir.path()),
        Err(StorageError::Corrupt { .. })
    ));
}

#[test]
fn a_ticket_out_writes_its_frames_off_thread_and_nothing_jumps_ahead_of_them() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = MetadataLog::open(dir.path()).unwrap();
    log.bootstrap(&[1]).unwrap();
    let before = std::fs::metadata(dir.path().join(LOG_DIR).join(LOG_FILE))
        .unwrap()
        .len();
    log.append(&[entry(1, 1, b"a"), entry(2, 1, b"b")]).unwrap();
    let ticket = log.write_pending().unwrap().unwrap();
    // Nothing reaches the file on the caller's thread.
    let len = || {
        std::fs::metadata(dir.path().join(LOG_DIR).join(LOG_FILE))
            .unwrap()
            .len()
    };
    assert_eq!(len(), before);
    // One ticket at a time.
    log.append(&[entry(3, 1, b"c")]).unwrap();
    assert!(log.write_pending().unwrap().is_none());
    // An inline sync while it is out rewrites the log, in order, durable.
    log.sync().unwrap();
    assert_eq!(log.synced_bytes(), len());
    // The ticket finishing late writes to the replaced file: harmless, and
    // it says nothing about the new one.
    ticket.sync().unwrap();
    let synced = log.synced_bytes();
    log.synced(&ticket, Ok(())).unwrap();
    assert_eq!(log.synced_bytes(), synced);
    log.append(&[entry(4, 1, b"d")]).unwrap();
    let next = log.write_pending().unwrap().unwrap();
    next.sync().unwrap();
    log.synced(&next, Ok(())).unwrap();
    assert_eq!(log.synced_bytes(), len());
    drop(log);
    let log = MetadataLog::open(dir.path()).unwrap();
    assert_eq!(indexes(&log), vec![(1, 1), (2, 1), (3, 1), (4, 1)]);
}
