//! The `skiff-tools` binary against segments built in a temporary directory.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Output;

use skiff_engine::batch::{BatchBuilder, Compression};

mod common;
use common::{batch, describe, segment_name, skiff_tools, write_segment, Fixture};

fn stdout(output: &Output) -> String {
    String::from_utf8(output.stdout.clone()).unwrap()
}

fn verify(dir: &Path) -> Output {
    skiff_tools(&["verify", dir.to_str().unwrap()])
}

#[test]
fn clean_partition_verifies() {
    let fx = Fixture::new();
    for dir in [&fx.data_dir, &fx.partition] {
        let out = verify(dir);
        assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
        let text = stdout(&out);
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(
            text.starts_with("OK: 1 partitions, 2 segments, 5 batches, 15 records, "),
            "{text}"
        );
    }
}

#[test]
fn a_locked_data_dir_verifies() {
    let fx = Fixture::new();
    // As a running node holds it (its pid inside): `.lock` is neither a
    // partition nor a problem, and verify does not wait for the lock.
    let lock = skiff_engine::data_dir::lock(&fx.data_dir).unwrap();
    assert!(lock.path().exists());
    let out = verify(&fx.data_dir);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let text = stdout(&out);
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(text.starts_with("OK: 1 partitions, 2 segments, "), "{text}");
}

#[test]
fn flipped_bit_names_file_position_and_offset() {
    let fx = Fixture::new();
    let position = fx.positions[0][1];
    // A byte inside the second batch's records: covered by the CRC.
    fx.modify(0, "log", |log| log[position as usize + 70] ^= 0x04);
    let out = verify(&fx.data_dir);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    let expected = format!(
        "{}: position {position} offset 3: CRC mismatch",
        fx.file_str(0, "log")
    );
    let text = stdout(&out);
    assert!(
        text.lines().any(|l| l.starts_with(&expected)),
        "{}",
        describe(&out)
    );
    assert_eq!(
        text.lines().count(),
        1,
        "one damaged batch is one problem: {text}"
    );
    assert!(text.contains("below the recovery point 10"), "{text}");

    let dump = skiff_tools(&["dump-log", &fx.file_str(0, "log")]);
    assert_eq!(dump.status.code(), Some(1), "{}", describe(&dump));
    let dump_text = stdout(&dump);
    assert!(
        dump_text.contains(&format!("position: {position} "))
            && dump_text.contains("isvalid: false"),
        "{dump_text}"
    );
    // The scan went on past the bad batch.
    assert!(
        dump_text.contains("baseOffset: 6 lastOffset: 9 count: 4"),
        "{dump_text}"
    );
}

#[test]
fn flipped_base_offset_breaks_contiguity() {
    let fx = Fixture::new();
    let position = fx.positions[1][1] as usize;
    // baseOffset lies outside the CRC: only the offset checks can catch this.
    fx.modify(10, "log", |log| log[position + 7] ^= 0x01);
    let out = verify(&fx.partition);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    let expected = format!(
        "{}: position {position} offset 13: offset gap: expected base offset 12",
        fx.file_str(10, "log")
    );
    assert!(stdout(&out).contains(&expected), "{}", describe(&out));
}

#[test]
fn garbage_after_the_last_batch_is_flagged() {
    let fx = Fixture::new();
    let garbage = b"not a batch at all, just some bytes that someone wrote here";
    let mut end = 0;
    fx.modify(10, "log", |log| {
        end = log.len();
        log.extend_from_slice(garbage);
    });
    let out = verify(&fx.data_dir);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    let expected = format!(
        "{}: position {end} offset 15: torn or garbage tail: {} bytes",
        fx.file_str(10, "log"),
        garbage.len()
    );
    assert!(stdout(&out).contains(&expected), "{}", describe(&out));

    let dump = skiff_tools(&["dump-log", &fx.file_str(10, "log")]);
    assert_eq!(dump.status.code(), Some(1), "{}", describe(&dump));
    assert!(
        stdout(&dump).contains(&format!(
            "torn or garbage tail at position {end}: {} bytes",
            garbage.len()
        )),
        "{}",
        describe(&dump)
    );
}

#[test]
fn garbage_after_zero_padding_is_flagged() {
    let fx = Fixture::new();
    let mut end = 0;
    fx.modify(10, "log", |log| {
        end = log.len();
        log.resize(end + 8192, 0);
        log[end + 5000] = 0xaa;
    });
    let out = verify(&fx.partition);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    let text = stdout(&out);
    assert!(
        text.contains(&format!("position {end} offset 15: torn or garbage tail")),
        "{text}"
    );
    assert!(
        text.contains(&format!("non-zero byte at position {}", end + 5000)),
        "{text}"
    );
}

#[test]
fn torn_last_batch_is_flagged() {
    let fx = Fixture::new();
    let position = fx.positions[1][1];
    fx.modify(10, "log", |log| log.truncate(log.len() - 10));
    let out = verify(&fx.data_dir);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    let expected = format!(
        "{}: position {position} offset 12: torn or garbage tail",
        fx.file_str(10, "log")
    );
    let text = stdout(&out);
    assert!(text.contains(&expected), "{}", describe(&out));
    assert!(text.contains("torn write"), "{text}");
    assert!(
        text.contains("at or past the recovery point 10: recovery truncates the log here"),
        "{text}"
    );
}

#[test]
fn trailing_zeros_are_preallocation() {
    let fx = Fixture::new();
    let mut end = 0;
    fx.modify(10, "log", |log| {
        end = log.len();
        log.resize(end + 100_000, 0);
    });
    let out = verify(&fx.data_dir);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));

    let dump = skiff_tools(&["dump-log", &fx.file_str(10, "log")]);
    assert_eq!(dump.status.code(), Some(0), "{}", describe(&dump));
    let text = stdout(&dump);
    assert!(
        text.contains(&format!(
            "trailing zero bytes (preallocated) at position {end}: 100000 bytes"
        )),
        "{text}"
    );
    assert!(!text.contains("garbage"), "{text}");
}

#[test]
fn index_entry_past_the_log_is_flagged() {
    let fx = Fixture::new();
    fx.modify(0, "index", |index| {
        index.extend_from_slice(&10u32.to_be_bytes());
        index.extend_from_slice(&1_000_000u32.to_be_bytes());
    });
    let index = fx.file_str(0, "index");
    let dump = skiff_tools(&["dump-index", &index]);
    assert_eq!(dump.status.code(), Some(1), "{}", describe(&dump));
    let text = stdout(&dump);
    assert!(text.starts_with(&format!("Dumping {index}\n")), "{text}");
    let positions = &fx.positions[0];
    assert!(
        text.contains(&format!("offset: 5 position: {}\n", positions[1])),
        "{text}"
    );
    assert!(
        text.contains("offset: 10 position: 1000000 <- PROBLEM: points past the log"),
        "{text}"
    );

    let out = verify(&fx.data_dir);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    assert!(
        stdout(&out).contains(&format!(
            "{index}: position 16 offset 10: index entry 2: points past the log"
        )),
        "{}",
        describe(&out)
    );
}

#[test]
fn index_entry_off_a_batch_start_fails_verify() {
    let fx = Fixture::new();
    // Entry 0 names offset 5 at the second batch; move it 4 bytes into that batch.
    fx.modify(0, "index", |index| index[7] += 4);
    let out = verify(&fx.partition);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    assert!(
        stdout(&out).contains(&format!(
            "{}: position 0 offset 5: index entry 0: no batch starts at log position {}",
            fx.file_str(0, "index"),
            fx.positions[0][1] + 4
        )),
        "{}",
        describe(&out)
    );
}

#[test]
fn dump_timeindex_checks_entries() {
    let fx = Fixture::new();
    let path = fx.file_str(10, "timeindex");
    let out = skiff_tools(&["dump-timeindex", &path]);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert_eq!(
        stdout(&out),
        format!("Dumping {path}\ntimestamp: 1011 offset: 11\ntimestamp: 1014 offset: 14\n")
    );

    // A timestamp above anything in the log.
    fx.modify(10, "timeindex", |t| t[7] = 0xff);
    let out = skiff_tools(&["dump-timeindex", &path]);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    assert!(
        stdout(&out).contains("<- PROBLEM: timestamp"),
        "{}",
        describe(&out)
    );
    assert_eq!(verify(&fx.data_dir).status.code(), Some(1));
}

#[test]
fn dump_log_deep_prints_records() {
    let fx = Fixture::new();
    let path = fx.file_str(10, "log");
    let out = skiff_tools(&["dump-log", &path, "--deep"]);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], format!("Dumping {path}"));
    assert_eq!(lines[1], "Log starting offset: 10");
    assert!(
        lines[2].starts_with(
            "baseOffset: 10 lastOffset: 11 count: 2 baseSequence: -1 lastSequence: -1 \
             producerId: -1 producerEpoch: -1 partitionLeaderEpoch: 1 isTransactional: false \
             isControl: false position: 0 CreateTime: 1011 size: "
        ),
        "{}",
        lines[2]
    );
    assert!(
        lines[2].contains(" magic: 2 compresscodec: none crc: ")
            && lines[2].ends_with(" isvalid: true"),
        "{}",
        lines[2]
    );
    assert_eq!(
        lines[3],
        "| offset: 10 CreateTime: 1010 keySize: 6 valueSize: 8 sequence: -1 headerKeys: [trace] key: key-10 payload: value-10"
    );
    assert_eq!(lines.len(), 2 + (1 + 2) + (1 + 3), "{text}");
}

#[test]
fn dump_log_shows_binary_values_as_hex_and_compression() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join(segment_name(0, "log"));
    let mut builder = BatchBuilder::new().compression(Compression::Gzip);
    builder.push(5, None, Some(&[0x00, 0xff, 0x10]), &[]);
    builder.push(
        6,
        Some(b"k"),
        None,
        &[
            (b"h1".as_slice(), None),
            (b"h2".as_slice(), Some(b"x".as_slice())),
        ],
    );
    std::fs::write(&path, builder.build().unwrap()).unwrap();
    let out = skiff_tools(&["dump-log", path.to_str().unwrap(), "--deep"]);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let text = stdout(&out);
    assert!(text.contains("compresscodec: gzip"), "{text}");
    assert!(
        text.contains("| offset: 0 CreateTime: 5 keySize: -1 valueSize: 3 sequence: -1 headerKeys: [] key: null payload: 0x00ff10\n"),
        "{text}"
    );
    assert!(
        text.contains("| offset: 1 CreateTime: 6 keySize: 1 valueSize: -1 sequence: -1 headerKeys: [h1,h2] key: k payload: null\n"),
        "{text}"
    );
}

fn json_lines(output: &Output) -> Vec<serde_json::Value> {
    stdout(output)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect()
}

#[test]
fn json_output_is_one_object_per_line() {
    let fx = Fixture::new();
    fx.modify(0, "log", |log| {
        let len = log.len();
        log.resize(len + 4096, 0);
    });
    let out = skiff_tools(&["dump-log", &fx.file_str(0, "log"), "--deep", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let lines = json_lines(&out);
    assert_eq!(lines.len(), 1 + 3 + 10 + 1);
    assert_eq!(lines[0]["type"], "file");
    assert_eq!(lines[0]["logStartingOffset"], 0);
    assert_eq!(lines[1]["type"], "batch");
    assert_eq!(lines[1]["baseOffset"], 0);
    assert_eq!(lines[1]["lastOffset"], 2);
    assert_eq!(lines[1]["isvalid"], true);
    assert_eq!(lines[1]["compresscodec"], "none");
    assert_eq!(lines[1]["timestampType"], "CreateTime");
    assert_eq!(lines[2]["type"], "record");
    assert_eq!(lines[2]["key"], "key-0");
    assert_eq!(lines[2]["payload"], "value-0");
    assert_eq!(lines[2]["headers"][0]["key"], "trace");
    assert_eq!(lines[2]["headers"][0]["value"], "t1");
    let end = &lines[lines.len() - 1];
    assert_eq!(end["type"], "end");
    assert_eq!(end["zeroTail"]["bytes"], 4096);
    assert!(end["garbageTail"].is_null());

    for (command, ext) in [("dump-index", "index"), ("dump-timeindex", "timeindex")] {
        let out = skiff_tools(&[command, &fx.file_str(0, ext), "--json"]);
        assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
        let lines = json_lines(&out);
        assert_eq!(lines[0]["type"], "file");
        assert!(lines.len() > 1);
        assert!(lines[1..]
            .iter()
            .all(|l| l["type"] == "entry" && l["problems"].as_array().unwrap().is_empty()));
    }
}

#[test]
fn offset_gap_between_segments_is_flagged_unless_compacted() {
    let fx = Fixture::new();
    std::fs::remove_file(fx.file(10, "log")).unwrap();
    std::fs::remove_file(fx.file(10, "index")).unwrap();
    std::fs::remove_file(fx.file(10, "timeindex")).unwrap();
    write_segment(&fx.partition, 12, &[batch(12, 3, 1)]);
    let out = verify(&fx.partition);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    assert!(
        stdout(&out).contains(&format!(
            "{}: position 0 offset 12: offset gap: expected base offset 10",
            fx.file_str(12, "log")
        )),
        "{}",
        describe(&out)
    );
    let out = skiff_tools(&["verify", fx.partition.to_str().unwrap(), "--compacted"]);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
}

#[test]
fn checkpoint_problems_name_the_line() {
    let fx = Fixture::new();
    std::fs::write(
        fx.partition.join("leader-epoch-checkpoint"),
        "0\n2\n3 0\n1 6\n",
    )
    .unwrap();
    std::fs::write(
        fx.partition.join("recovery-point-offset-checkpoint"),
        "0\n1\norders 0 99\n",
    )
    .unwrap();
    std::fs::write(
        fx.partition.join("partition.metadata"),
        "version: 0\ntopic_id: not-an-id\n",
    )
    .unwrap();
    let out = verify(&fx.data_dir);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    let text = stdout(&out);
    assert!(
        text.contains("leader-epoch-checkpoint: line 4: epoch 1 does not increase"),
        "{text}"
    );
    assert!(
        text.contains("recovery-point-offset-checkpoint: line 3: recovery point 99 is past the log end offset 15"),
        "{text}"
    );
    assert!(
        text.contains("partition.metadata: topic_id \"not-an-id\""),
        "{text}"
    );
}

#[test]
fn usage_errors_exit_2() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("nope");
    let out = skiff_tools(&["verify", missing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let out = skiff_tools(&["verify", empty.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
    assert_eq!(skiff_tools(&["dump-log"]).status.code(), Some(2));
    assert_eq!(skiff_tools(&["frobnicate"]).status.code(), Some(2));
    let out = skiff_tools(&["dump-log", missing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
    let not_a_segment = tmp.path().join("x.index");
    std::fs::write(&not_a_segment, []).unwrap();
    let out = skiff_tools(&["dump-index", not_a_segment.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
}

#[test]
fn index_entry_naming_the_wrong_offset_fails_verify() {
    let fx = Fixture::new();
    // Entry 0 names offset 5, the last offset of the batch 3..=5 at its position.
    fx.modify(0, "index", |index| index[3] = 4);
    let out = verify(&fx.partition);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    assert!(
        stdout(&out).contains(&format!(
            "{}: position 0 offset 4: index entry 0: the batch at log position {} holds offsets 3..=5",
            fx.file_str(0, "index"),
            fx.positions[0][1]
        )),
        "{}",
        describe(&out)
    );
}

#[test]
fn dump_log_shows_transaction_markers() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join(segment_name(0, "log"));
    let mut builder = BatchBuilder::new().producer(7, 1, 0);
    // Control record: key = version 0, type 1 (COMMIT); value = version 0, epoch 5.
    builder.push(10, Some(&[0, 0, 0, 1]), Some(&[0, 0, 0, 0, 0, 5]), &[]);
    let mut batch = builder.build().unwrap().to_vec();
    batch[22] |= 0x30; // attributes: transactional + control
                       // Recomputes the CRC over the changed attributes.
    skiff_engine::batch::stamp_log_append_time(&mut batch, 2_000).unwrap();
    std::fs::write(&path, &batch).unwrap();
    let out = skiff_tools(&["dump-log", path.to_str().unwrap(), "--deep"]);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let text = stdout(&out);
    assert!(
        text.contains("producerId: 7 producerEpoch: 1 partitionLeaderEpoch: -1 isTransactional: true isControl: true position: 0 LogAppendTime: 2000"),
        "{text}"
    );
    assert!(
        text.contains("| offset: 0 LogAppendTime: 2000 keySize: 4 valueSize: 6 sequence: 0 headerKeys: [] endTxnMarker: COMMIT coordinatorEpoch: 5\n"),
        "{text}"
    );
}

/// A partition whose one segment holds an aborted transaction of producer 5
/// (offsets 0-1 and 3, ABORT at 4), a plain batch at 2, and producer 6's
/// committed transaction (5, COMMIT at 6).
fn transactional_partition() -> (tempfile::TempDir, std::path::PathBuf) {
    use skiff_engine::batch::{marker_batch, stamp, EndTxnMarker};
    let tmp = tempfile::tempdir().unwrap();
    let partition = tmp.path().join("orders-0");
    std::fs::create_dir_all(&partition).unwrap();
    let data = |offset: i64, records: i64, producer: i64, transactional: bool| {
        let mut b = BatchBuilder::new()
            .base_offset(offset)
            .partition_leader_epoch(0)
            .producer(producer, 0, offset as i32)
            .transactional(transactional);
        for o in offset..offset + records {
            b.push(1_000 + o, None, Some(b"v"), &[]);
        }
        b.build().unwrap()
    };
    let marker = |offset: i64, producer: i64, commit: bool| {
        let m = EndTxnMarker {
            commit,
            coordinator_epoch: 0,
        };
        let mut bytes = marker_batch(producer, 0, m, 1_000 + offset)
            .unwrap()
            .to_vec();
        stamp(&mut bytes, offset, 0).unwrap();
        bytes::Bytes::from(bytes)
    };
    write_segment(
        &partition,
        0,
        &[
            data(0, 2, 5, true),
            data(2, 1, 9, false),
            data(3, 1, 5, true),
            marker(4, 5, false),
            data(5, 1, 6, true),
            marker(6, 6, true),
        ],
    );
    std::fs::write(partition.join("leader-epoch-checkpoint"), "0\n1\n0 0\n").unwrap();
    (tmp, partition)
}

fn txn_index_bytes(entries: &[(i64, i64, i64, i64)]) -> Vec<u8> {
    use skiff_engine::segment::txn_index::AbortedTxn;
    let mut out = Vec::new();
    for &(producer_id, first_offset, last_offset, last_stable_offset) in entries {
        AbortedTxn {
            producer_id,
            first_offset,
            last_offset,
            last_stable_offset,
        }
        .encode_into(&mut out);
    }
    out
}

#[test]
fn verify_recomputes_the_txn_index_from_the_markers() {
    let (_tmp, partition) = transactional_partition();
    let txnindex = partition.join(segment_name(0, "txnindex"));

    // Aborted transactions and no .txnindex.
    let out = verify(&partition);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    assert!(
        stdout(&out).contains("missing: the log's markers end 1 aborted transaction(s)"),
        "{}",
        describe(&out)
    );

    // The right one: producer 5, offsets 0 to 4, LSO 5 (nothing else open).
    std::fs::write(&txnindex, txn_index_bytes(&[(5, 0, 4, 5)])).unwrap();
    let out = verify(&partition);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let out = skiff_tools(&["dump-txnindex", txnindex.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert_eq!(
        stdout(&out),
        format!(
            "Dumping {}\nversion: 0 producerId: 5 firstOffset: 0 lastOffset: 4 lastStableOffset: 5\n",
            txnindex.display()
        )
    );

    // A wrong first offset, and an entry with no marker behind it.
    std::fs::write(&txnindex, txn_index_bytes(&[(5, 1, 4, 5), (7, 5, 5, 6)])).unwrap();
    let out = verify(&partition);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    assert!(
        stdout(&out).contains("holds 2 aborted transaction(s), the log's markers end 1 here; first difference at entry 0"),
        "{}",
        describe(&out)
    );
    let out = skiff_tools(&["dump-txnindex", txnindex.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    assert!(
        stdout(&out).contains("<- PROBLEM: no control batch of producer 7 at offset 5 in the log"),
        "{}",
        describe(&out)
    );

    // Not a whole entry, and a version skiff does not know.
    std::fs::write(&txnindex, [0u8; 20]).unwrap();
    assert_eq!(verify(&partition).status.code(), Some(1));
    let mut bad = txn_index_bytes(&[(5, 0, 4, 5)]);
    bad[1] = 3;
    std::fs::write(&txnindex, bad).unwrap();
    let out = verify(&partition);
    assert!(stdout(&out).contains("has version 3"), "{}", describe(&out));
}
