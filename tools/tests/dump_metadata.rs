//! `skiff-tools dump-metadata` against metadata logs written by a real
//! single-voter `QuorumNode`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use skiff_controller::access::{self, ScramAlteration};
use skiff_controller::decisions::{
    self, ControllerConfig, CreateTopic, Heartbeat, Registration, Sessions,
};
use skiff_controller::node::{QuorumConfig, QuorumNode};
use skiff_controller::records::{AclRecord, Endpoint, MetadataRecord, TopicId};
use skiff_controller::storage::{LOG_DIR, LOG_FILE};

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_skiff-tools"))
        .args(args)
        .output()
        .unwrap()
}

fn describe(out: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn dump(dir: &Path, json: bool) -> Output {
    let mut args = vec!["dump-metadata", dir.to_str().unwrap()];
    if json {
        args.push("--json");
    }
    run(&args)
}

fn commit(node: &mut QuorumNode, records: &[MetadataRecord]) {
    assert!(!records.is_empty());
    node.propose(records).unwrap();
    let out = node.poll().unwrap();
    assert_eq!(out.committed.len(), 1, "a single voter commits at once");
}

/// A data directory whose metadata log registers node 1, unfences it and creates
/// topic `orders` with 3 partitions. Returns the data directory.
fn build_log(dir: &Path, snapshot_interval_entries: u64) -> PathBuf {
    let mut config = QuorumConfig::new(1, vec![1]);
    config.snapshot_interval_entries = snapshot_interval_entries;
    let mut node = QuorumNode::open(dir, &config).unwrap();
    for _ in 0..config.election_tick_max {
        node.tick();
        node.poll().unwrap();
        if node.is_leader() {
            break;
        }
    }
    assert!(node.is_leader());
    let controller = ControllerConfig::default();
    let registration = Registration {
        node_id: 1,
        incarnation_id: [7; 16],
        endpoints: vec![Endpoint {
            name: "PLAINTEXT".into(),
            host: "localhost".into(),
            port: 9092,
        }],
        rack: Some("rack-a".into()),
    };
    let (records, broker_epoch) =
        decisions::register(node.state(), &registration, &controller).unwrap();
    commit(&mut node, &records);
    let heartbeat = Heartbeat {
        node_id: 1,
        broker_epoch,
        metadata_offset: node.applied_offset(),
        want_fence: false,
        want_shutdown: false,
        offline_partitions: Vec::new(),
    };
    let records = decisions::heartbeat(
        node.state(),
        &mut Sessions::new(),
        &heartbeat,
        0,
        &controller,
    )
    .unwrap();
    commit(&mut node, &records);
    let create = CreateTopic {
        name: "orders".into(),
        topic_id: TopicId([0xab; 16]),
        partitions: 3,
        replication_factor: 1,
        configs: vec![("retention.ms".into(), "60000".into())],
        start_index: 0,
    };
    let records = decisions::create_topic(node.state(), &create).unwrap();
    commit(&mut node, &records);
    assert_eq!(
        node.state()
            .topic_by_name("orders")
            .unwrap()
            .partitions
            .len(),
        3
    );
    let (_, records) = access::alter_scram_credentials(
        node.state(),
        &[ScramAlteration::Upsert {
            name: "alice".into(),
            mechanism: 2,
            iterations: 4096,
            salt: vec![0x5a; 16],
            salted_password: vec![0x77; 64],
        }],
    );
    commit(&mut node, &records);
    let acl = AclRecord {
        resource_type: 2,
        resource_name: "orders".into(),
        pattern_type: 4,
        principal: "User:alice".into(),
        host: "*".into(),
        operation: 4,
        permission: 3,
    };
    let (_, records) = access::create_acls(node.state(), &[acl]);
    commit(&mut node, &records);
    dir.to_path_buf()
}

fn stdout(out: &Output) -> String {
    String::from_utf8(out.stdout.clone()).unwrap()
}

/// The JSON dump's lines.
fn json_lines(data_dir: &Path) -> Vec<serde_json::Value> {
    stdout(&dump(data_dir, true))
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// The raft.log position and offset of the entry holding the Topic record.
fn topic_entry(data_dir: &Path) -> (usize, u64) {
    let lines = json_lines(data_dir);
    let offset = lines
        .iter()
        .find(|l| l["type"] == "record" && l["record"] == "Topic")
        .unwrap()["offset"]
        .as_u64()
        .unwrap();
    let position = lines
        .iter()
        .find(|l| l["type"] == "entry" && l["offset"] == offset)
        .unwrap()["position"]
        .as_u64()
        .unwrap();
    (position as usize, offset)
}

#[test]
fn log_frames_and_records_are_listed() {
    let tmp = tempfile::tempdir().unwrap();
    let data_dir = build_log(tmp.path(), 10_000);
    let out = dump(&data_dir, false);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let text = stdout(&out);
    assert!(!text.contains("\nsnapshot "), "no snapshot yet: {text}");
    for expected in [
        "confState position: 0 voters: [1]",
        "hardState position: ",
        "commit position: ",
        "| RegisterNode nodeId: 1 brokerEpoch: 1 rack: rack-a endpoints: [\"PLAINTEXT://localhost:9092\"]",
        "| NodeRegistrationChange nodeId: 1 brokerEpoch: 1 change: Unfenced",
        "| Topic name: orders topicId: abababab-abab-abab-abab-abababababab partitions: 3 configs: {\"retention.ms\":\"60000\"}",
        "| Partition topic: orders partition: 0 replicas: [1] isr: [1] leader: 1 leaderEpoch: 0 partitionEpoch: 0",
        "| Partition topic: orders partition: 2 replicas: [1]",
        "| UserScramCredential name: alice mechanism: SCRAM-SHA-512 iterations: 4096",
        "| Acl resourceType: TOPIC name: orders patternType: PREFIXED principal: User:alice host: * operation: WRITE permission: ALLOW",
        "end frames: ",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in\n{text}");
    }
    assert!(text.contains("problems: 0"), "{text}");
    assert!(!text.contains("uncommitted tail"), "{text}");
    // Salts and keys are secrets: never dumped (0x5a is the salt's byte).
    assert!(!text.contains("5a5a") && !text.contains("salt"), "{text}");
    // Entry offsets grow.
    let offsets: Vec<u64> = text
        .lines()
        .filter(|l| l.starts_with("entry "))
        .map(|l| {
            let rest = &l[l.find("offset: ").unwrap() + 8..];
            rest.split(' ').next().unwrap().parse().unwrap()
        })
        .collect();
    assert!(offsets.len() >= 4, "{text}");
    assert!(offsets.windows(2).all(|w| w[0] < w[1]), "{offsets:?}");
}

#[test]
fn snapshot_state_is_summarized() {
    let tmp = tempfile::tempdir().unwrap();
    let data_dir = build_log(tmp.path(), 2);
    // Also accepts the __cluster_metadata-0 directory itself.
    let out = dump(&data_dir.join(LOG_DIR), false);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let text = stdout(&out);
    for expected in [
        "snapshot position: 0 index: ",
        "  node 1 nodeId: 1 brokerEpoch: 1 fenced: false inControlledShutdown: false rack: rack-a",
        "  topic orders name: orders topicId: abababab-abab-abab-abab-abababababab partitions: 3",
        "  partition orders-0 topic: orders partition: 0 replicas: [1] isr: [1] leader: 1 leaderEpoch: 0 partitionEpoch: 0",
        "  partition orders-2 ",
        "  credential alice name: alice mechanism: SCRAM-SHA-512 iterations: 4096",
        "  acl orders resourceType: TOPIC name: orders patternType: PREFIXED principal: User:alice",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in\n{text}");
    }
}

#[test]
fn corrupted_byte_is_reported_with_its_position() {
    let tmp = tempfile::tempdir().unwrap();
    let data_dir = build_log(tmp.path(), 10_000);
    let (position, _) = topic_entry(&data_dir);

    let log = data_dir.join(LOG_DIR).join(LOG_FILE);
    let mut bytes = std::fs::read(&log).unwrap();
    bytes[position + 20] ^= 0x10;
    std::fs::write(&log, &bytes).unwrap();

    let out = dump(&data_dir, false);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    let text = stdout(&out);
    assert!(
        text.contains(&format!(
            "CORRUPT: {}: position {position}: CRC mismatch",
            log.display()
        )),
        "{}",
        describe(&out)
    );
    // Everything before it is still listed.
    assert!(text.contains("| RegisterNode nodeId: 1"), "{text}");
    assert!(!text.contains("| Topic "), "{text}");
}

#[test]
fn undecodable_batch_in_an_intact_frame_is_reported_and_the_dump_goes_on() {
    let tmp = tempfile::tempdir().unwrap();
    let data_dir = build_log(tmp.path(), 10_000);
    let (position, topic_offset) = topic_entry(&data_dir);

    // Change a byte of the topic name inside the batch (its own CRC no longer
    // matches), then re-seal the storage frame so only the batch is damaged.
    let log = data_dir.join(LOG_DIR).join(LOG_FILE);
    let mut bytes = std::fs::read(&log).unwrap();
    let len = u32::from_le_bytes(bytes[position..position + 4].try_into().unwrap()) as usize;
    let body = position + 8..position + 8 + len;
    let name_at = bytes[body.clone()]
        .windows(6)
        .position(|w| w == b"orders")
        .unwrap();
    bytes[body.start + name_at] = b'O';
    let crc = crc32c::crc32c(&bytes[body]);
    bytes[position + 4..position + 8].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(&log, &bytes).unwrap();

    let out = dump(&data_dir, false);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    let text = stdout(&out);
    let expected = format!(
        "CORRUPT: {}: position {position} offset {topic_offset}: metadata batch checksum mismatch",
        log.display()
    );
    assert!(text.contains(&expected), "{}", describe(&out));
    // The frames after it are still listed.
    let after = &text[text.find(&expected).unwrap()..];
    assert!(after.contains("\ncommit position: "), "{text}");
    assert!(after.contains("problems: 1"), "{text}");
}

#[test]
fn torn_tail_after_the_last_commit_marker_is_not_corruption() {
    let tmp = tempfile::tempdir().unwrap();
    let data_dir = build_log(tmp.path(), 10_000);
    let log = data_dir.join(LOG_DIR).join(LOG_FILE);
    let mut bytes = std::fs::read(&log).unwrap();
    let len = bytes.len();
    // A frame header promising more bytes than were written.
    bytes.extend_from_slice(&[200, 0, 0, 0, 1, 2, 3, 4, 1, 9, 9]);
    std::fs::write(&log, &bytes).unwrap();

    let out = dump(&data_dir, false);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(
        stdout(&out).contains(&format!(
            "uncommitted tail (11 bytes) at position {len}, dropped at recovery"
        )),
        "{}",
        describe(&out)
    );
}

#[test]
fn json_lines_parse() {
    let tmp = tempfile::tempdir().unwrap();
    let data_dir = build_log(tmp.path(), 2);
    assert_eq!(dump(&data_dir, true).status.code(), Some(0));
    let lines = json_lines(&data_dir);
    assert_eq!(lines[0]["type"], "dir");
    assert_eq!(lines.last().unwrap()["type"], "end");
    assert_eq!(lines.last().unwrap()["problems"], 0);
    let snapshot = lines.iter().find(|l| l["type"] == "snapshot").unwrap();
    assert!(snapshot["index"].as_u64().unwrap() > 0);
    let node = lines.iter().find(|l| l["type"] == "node").unwrap();
    assert_eq!(node["nodeId"], 1);
    assert_eq!(node["fenced"], false);
    assert_eq!(node["endpoints"][0], "PLAINTEXT://localhost:9092");
    let topic = lines.iter().find(|l| l["type"] == "topic").unwrap();
    assert_eq!(topic["name"], "orders");
    assert_eq!(topic["configs"]["retention.ms"], "60000");
    let partitions: Vec<_> = lines
        .iter()
        .filter(|l| l["type"] == "partition")
        .map(|l| {
            (
                l["partition"].as_u64().unwrap(),
                l["leader"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(partitions, vec![(0, 1), (1, 1), (2, 1)]);
    assert!(lines.iter().any(|l| l["type"] == "commit"));
}

#[test]
fn not_a_metadata_dir_is_a_usage_error() {
    let tmp = tempfile::tempdir().unwrap();
    let out = dump(tmp.path(), false);
    assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no metadata log here"),
        "{}",
        describe(&out)
    );
}
