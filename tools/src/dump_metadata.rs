//! `dump-metadata`: the controller's metadata log (`__cluster_metadata-0/`) as
//! text or NDJSON, like Kafka's `kafka-dump-log --cluster-metadata-decoder`.
//!
//! Frames are parsed by the controller's own reader
//! (`skiff_controller::storage::read_frames`) and batches by its own decoder
//! (`records::decode_batch`), so the tool and recovery cannot disagree. Text:
//!
//! ```text
//! Dumping metadata log /data/__cluster_metadata-0
//! snapshot position: 0 index: 12 term: 2 voters: [1] learners: [] brokerEpochMax: 1 offsetLast: 12
//!   node 1 brokerEpoch: 1 fenced: false inControlledShutdown: false rack: null endpoints: ["PLAINTEXT://h:9092"] registeredOffset: 3
//!   topic orders topicId: 0000..-.. partitions: 2 configs: {}
//!   partition orders-0 replicas: [1] isr: [1] leader: 1 leaderEpoch: 0 partitionEpoch: 0
//! confState position: 0 voters: [1] learners: []
//! entry position: 40 offset: 13 term: 2 records: 1
//! | Config resource: cluster name: a value: 1
//! commit position: 120 sequence: 7
//! uncommitted tail (31 bytes) at position 137, dropped at recovery
//! end frames: 4 entries: 1 records: 1 problems: 0
//! ```
//!
//! JSON: one object per line, tagged by `"type"` (`dir`, `snapshot`, `node`,
//! `topic`, `partition`, `entry`, `record`, `hardState`, `confState`, `commit`,
//! `uncommittedTail`, `corrupt`, `end`) with the same fields.
//!
//! Problems (exit status 1): a bad frame below the last commit marker (what
//! recovery refuses as corruption; frame boundaries are lost there, so the dump
//! stops), an intact frame whose payload or metadata batch does not decode (the
//! dump goes on), an unreadable snapshot. Bytes after the last commit marker are
//! the torn tail recovery cuts: reported, not a problem.
//!
//! Bounds: `raft.log` and `snapshot` are read whole, as recovery reads them (the
//! controller keeps `raft.log` under its snapshot interval, 64 MiB by default).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};
use skiff_controller::raft::prelude::{ConfState, Entry, EntryType, HardState, Snapshot};
use skiff_controller::records::{
    decode_batch, AclRecord, ConfigResource, Endpoint, MetadataRecord, RegistrationChange, TopicId,
};
use skiff_controller::state::ClusterState;
use skiff_controller::storage::{
    read_frames, FrameContent, FrameError, ReadFrame, LOG_DIR, LOG_FILE, SNAPSHOT_FILE,
};

use crate::{show_bytes, ToolError};

/// What the dump found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DumpMetadataSummary {
    /// Frames of `raft.log` printed (those recovery replays).
    pub frames: u64,
    pub entries: u64,
    pub records: u64,
    /// Corrupt frames, undecodable payloads or batches, an unreadable snapshot.
    pub problems: u64,
    /// Bytes after the last commit marker (cut at recovery; not a problem).
    pub uncommitted_tail: u64,
}

impl DumpMetadataSummary {
    pub fn is_clean(&self) -> bool {
        self.problems == 0
    }
}

/// The metadata log directory for `path`: a data directory holding
/// `__cluster_metadata-0/`, that directory itself, or a file in it.
pub fn metadata_dir(path: &Path) -> Result<PathBuf, ToolError> {
    let is_log_dir = |dir: &Path| dir.join(LOG_FILE).is_file() || dir.join(SNAPSHOT_FILE).is_file();
    let nested = path.join(LOG_DIR);
    if is_log_dir(&nested) {
        return Ok(nested);
    }
    if is_log_dir(path) {
        return Ok(path.to_path_buf());
    }
    if path.is_file() {
        if let Some(parent) = path.parent().filter(|p| is_log_dir(p)) {
            return Ok(parent.to_path_buf());
        }
    }
    Err(ToolError::NotMetadataDir {
        path: path.to_path_buf(),
    })
}

pub fn dump_metadata(
    path: &Path,
    json: bool,
    out: &mut dyn Write,
) -> Result<DumpMetadataSummary, ToolError> {
    let dir = metadata_dir(path)?;
    let mut dump = Dump {
        out,
        json,
        summary: DumpMetadataSummary::default(),
        topic_names: BTreeMap::new(),
        snapshot_index: 0,
    };
    if json {
        dump.emit_json("dir", vec![("dir", json!(dir.display().to_string()))])?;
    } else {
        writeln!(dump.out, "Dumping metadata log {}", dir.display())?;
    }
    dump.snapshot(&dir.join(SNAPSHOT_FILE))?;
    dump.log(&dir.join(LOG_FILE))?;
    let s = dump.summary;
    dump.emit(
        "end",
        "end".into(),
        vec![
            ("frames", json!(s.frames)),
            ("entries", json!(s.entries)),
            ("records", json!(s.records)),
            ("problems", json!(s.problems)),
        ],
    )?;
    Ok(s)
}

type Fields = Vec<(&'static str, Value)>;

struct Dump<'a> {
    out: &'a mut dyn Write,
    json: bool,
    summary: DumpMetadataSummary,
    /// Topic names by id, from the snapshot and the Topic records seen so far.
    topic_names: BTreeMap<TopicId, String>,
    snapshot_index: u64,
}

/// Reads a file; `None` when it does not exist.
fn read_optional(path: &Path) -> Result<Option<Vec<u8>>, ToolError> {
    match std::fs::read(path) {
        Ok(buf) => Ok(Some(buf)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(ToolError::io(path, e)),
    }
}

impl Dump<'_> {
    /// One line: `head k: v k: v` as text, `{"type": kind, k: v}` as JSON.
    fn emit(&mut self, kind: &str, head: String, fields: Fields) -> Result<(), ToolError> {
        if self.json {
            return self.emit_json(kind, fields);
        }
        let mut line = head;
        for (k, v) in fields {
            line.push(' ');
            line.push_str(k);
            line.push_str(": ");
            match v {
                Value::String(s) => line.push_str(&s),
                other => line.push_str(&other.to_string()),
            }
        }
        writeln!(self.out, "{line}")?;
        Ok(())
    }

    fn emit_json(&mut self, kind: &str, fields: Fields) -> Result<(), ToolError> {
        let mut object = Map::new();
        object.insert("type".into(), json!(kind));
        for (k, v) in fields {
            object.insert(k.into(), v);
        }
        serde_json::to_writer(&mut *self.out, &Value::Object(object))
            .map_err(std::io::Error::from)?;
        writeln!(self.out)?;
        Ok(())
    }

    fn corrupt(
        &mut self,
        file: &Path,
        position: u64,
        offset: Option<u64>,
        message: String,
    ) -> Result<(), ToolError> {
        self.summary.problems += 1;
        if self.json {
            return self.emit_json(
                "corrupt",
                vec![
                    ("file", json!(file.display().to_string())),
                    ("position", json!(position)),
                    ("offset", json!(offset)),
                    ("message", json!(message)),
                ],
            );
        }
        let at = match offset {
            Some(offset) => format!("position {position} offset {offset}"),
            None => format!("position {position}"),
        };
        writeln!(self.out, "CORRUPT: {}: {at}: {message}", file.display())?;
        Ok(())
    }

    fn snapshot(&mut self, path: &Path) -> Result<(), ToolError> {
        let Some(buf) = read_optional(path)? else {
            return Ok(());
        };
        let mut frames = read_frames(&buf);
        let snapshot = match (frames.next(), frames.next()) {
            (
                Some(Ok(ReadFrame {
                    content: FrameContent::Snapshot(s),
                    end,
                    ..
                })),
                None,
            ) if end == buf.len() as u64 => s,
            (
                Some(Err(FrameError::Bad {
                    position, reason, ..
                }))
                | Some(Err(FrameError::Payload { position, reason })),
                _,
            ) => {
                return self.corrupt(path, position, None, reason);
            }
            (None, _) => return self.corrupt(path, 0, None, "empty snapshot file".into()),
            _ => return self.corrupt(path, 0, None, "not a single snapshot frame".into()),
        };
        self.print_snapshot(path, &snapshot)
    }

    fn print_snapshot(&mut self, path: &Path, snapshot: &Snapshot) -> Result<(), ToolError> {
        let meta = snapshot.get_metadata();
        self.snapshot_index = meta.index;
        let conf = meta.get_conf_state();
        let mut fields: Fields = vec![
            ("position", json!(0)),
            ("index", json!(meta.index)),
            ("term", json!(meta.term)),
            ("voters", json!(conf.voters)),
            ("learners", json!(conf.learners)),
        ];
        let state = match ClusterState::from_snapshot(snapshot.get_data()) {
            Ok(state) => state,
            Err(e) => {
                self.emit("snapshot", "snapshot".into(), fields)?;
                return self.corrupt(
                    path,
                    0,
                    Some(meta.index),
                    format!("snapshot state image: {e}"),
                );
            }
        };
        fields.push(("brokerEpochMax", json!(state.broker_epoch_max())));
        fields.push(("offsetLast", json!(state.offset_last())));
        self.emit("snapshot", "snapshot".into(), fields)?;
        for n in state.nodes() {
            self.emit(
                "node",
                format!("  node {}", n.node_id),
                vec![
                    ("nodeId", json!(n.node_id)),
                    ("brokerEpoch", json!(n.broker_epoch)),
                    ("fenced", json!(n.fenced)),
                    ("inControlledShutdown", json!(n.in_controlled_shutdown)),
                    ("rack", json!(n.rack)),
                    ("endpoints", endpoints(&n.endpoints)),
                    ("registeredOffset", json!(n.registered_offset)),
                    ("incarnationId", json!(show_bytes(&n.incarnation_id))),
                ],
            )?;
        }
        for t in state.topics() {
            self.topic_names.insert(t.topic_id, t.name.clone());
            self.emit(
                "topic",
                format!("  topic {}", t.name),
                vec![
                    ("name", json!(t.name)),
                    ("topicId", json!(t.topic_id.to_string())),
                    ("partitions", json!(t.partition_count)),
                    ("configs", configs(&t.configs)),
                ],
            )?;
            for (index, p) in &t.partitions {
                self.emit(
                    "partition",
                    format!("  partition {}-{index}", t.name),
                    vec![
                        ("topic", json!(t.name)),
                        ("partition", json!(index)),
                        ("replicas", json!(p.replicas)),
                        ("isr", json!(p.isr)),
                        ("leader", json!(p.leader)),
                        ("leaderEpoch", json!(p.leader_epoch)),
                        ("partitionEpoch", json!(p.partition_epoch)),
                    ]
                    .into_iter()
                    .chain(
                        p.is_reassigning()
                            .then(|| [("adding", json!(p.adding)), ("removing", json!(p.removing))])
                            .into_iter()
                            .flatten(),
                    )
                    .collect(),
                )?;
            }
        }
        for c in state.scram_credentials() {
            self.emit(
                "scram",
                format!("  credential {}", c.name),
                vec![
                    ("name", json!(c.name)),
                    ("mechanism", scram_mechanism(c.mechanism)),
                    ("iterations", json!(c.iterations)),
                ],
            )?;
        }
        for a in state.acls() {
            self.emit("acl", format!("  acl {}", a.resource_name), acl_fields(a))?;
        }
        Ok(())
    }

    fn log(&mut self, path: &Path) -> Result<(), ToolError> {
        let Some(buf) = read_optional(path)? else {
            return Ok(());
        };
        let items: Vec<Result<ReadFrame, FrameError>> = read_frames(&buf).collect();
        // Recovery's rule: frames up to the last commit marker are replayed, the
        // rest is cut; a bad frame with a commit marker after it is corruption.
        let mut durable = items
            .iter()
            .filter_map(|item| match item {
                Ok(ReadFrame {
                    content: FrameContent::Commit(_),
                    end,
                    ..
                }) => Some(*end),
                _ => None,
            })
            .next_back()
            .unwrap_or(0);
        let corrupt_at = items.iter().find_map(|item| match item {
            Err(FrameError::Bad {
                position,
                synced_after: true,
                ..
            }) => Some(*position),
            _ => None,
        });
        if let Some(position) = corrupt_at {
            durable = position;
        }
        for item in &items {
            match item {
                Ok(frame) if frame.end <= durable => self.frame(path, frame)?,
                Err(FrameError::Payload { position, reason }) if *position < durable => {
                    self.corrupt(path, *position, None, reason.clone())?;
                }
                Err(FrameError::Bad {
                    position,
                    reason,
                    synced_after: true,
                }) => {
                    self.corrupt(
                        path,
                        *position,
                        None,
                        format!(
                            "{reason}; a commit marker follows, so this is synced data \
                             (recovery refuses this log); stopping here"
                        ),
                    )?;
                    return Ok(());
                }
                // After the last commit marker: the torn tail, reported below.
                _ => {}
            }
        }
        let tail = buf.len() as u64 - durable;
        if tail > 0 {
            self.summary.uncommitted_tail = tail;
            let fields = vec![("position", json!(durable)), ("bytes", json!(tail))];
            if self.json {
                self.emit_json("uncommittedTail", fields)?;
            } else {
                writeln!(
                    self.out,
                    "uncommitted tail ({tail} bytes) at position {durable}, dropped at recovery"
                )?;
            }
        }
        Ok(())
    }

    fn frame(&mut self, path: &Path, frame: &ReadFrame) -> Result<(), ToolError> {
        self.summary.frames += 1;
        let position = json!(frame.position);
        match &frame.content {
            FrameContent::Entry(entry) => self.entry(path, frame.position, entry),
            FrameContent::HardState(hs) => {
                let HardState {
                    term, vote, commit, ..
                } = hs;
                self.emit(
                    "hardState",
                    "hardState".into(),
                    vec![
                        ("position", position),
                        ("term", json!(term)),
                        ("vote", json!(vote)),
                        ("commit", json!(commit)),
                    ],
                )
            }
            FrameContent::ConfState(cs) => {
                let ConfState {
                    voters, learners, ..
                } = cs;
                self.emit(
                    "confState",
                    "confState".into(),
                    vec![
                        ("position", position),
                        ("voters", json!(voters)),
                        ("learners", json!(learners)),
                    ],
                )
            }
            FrameContent::Commit(sequence) => self.emit(
                "commit",
                "commit".into(),
                vec![("position", position), ("sequence", json!(sequence))],
            ),
            FrameContent::Snapshot(_) => self.corrupt(
                path,
                frame.position,
                None,
                "a snapshot frame in the log (recovery refuses it)".into(),
            ),
        }
    }

    fn entry(&mut self, path: &Path, position: u64, entry: &Entry) -> Result<(), ToolError> {
        self.summary.entries += 1;
        let offset = entry.index;
        let data = entry.get_data();
        let batch = match entry.get_entry_type() {
            EntryType::EntryNormal if data.is_empty() => Ok(Vec::new()),
            EntryType::EntryNormal => decode_batch(data).map_err(|e| e.to_string()),
            other => Err(format!(
                "{other:?} entry (the quorum is static in this version)"
            )),
        };
        let mut fields: Fields = vec![
            ("position", json!(position)),
            ("offset", json!(offset)),
            ("term", json!(entry.term)),
            ("bytes", json!(data.len())),
        ];
        if let Ok(records) = &batch {
            fields.push(("records", json!(records.len())));
        }
        if offset <= self.snapshot_index {
            fields.push(("belowSnapshot", json!(true)));
        }
        self.emit("entry", "entry".into(), fields)?;
        let records = match batch {
            Ok(records) => records,
            Err(message) => return self.corrupt(path, position, Some(offset), message),
        };
        for (i, record) in records.iter().enumerate() {
            self.summary.records += 1;
            let (name, fields) = self.record_fields(record);
            if self.json {
                let mut all: Fields = vec![
                    ("offset", json!(offset)),
                    ("index", json!(i)),
                    ("record", json!(name)),
                ];
                all.extend(fields);
                self.emit_json("record", all)?;
            } else {
                self.emit("record", format!("| {name}"), fields)?;
            }
        }
        Ok(())
    }

    /// A record's name and fields; topic ids come with the topic's name when known.
    fn record_fields(&mut self, record: &MetadataRecord) -> (&'static str, Fields) {
        let topic = |names: &BTreeMap<TopicId, String>, id: &TopicId| {
            json!(names.get(id).cloned().unwrap_or_else(|| id.to_string()))
        };
        match record {
            MetadataRecord::RegisterNode(r) => (
                "RegisterNode",
                vec![
                    ("nodeId", json!(r.node_id)),
                    ("brokerEpoch", json!(r.broker_epoch)),
                    ("rack", json!(r.rack)),
                    ("endpoints", endpoints(&r.endpoints)),
                    ("incarnationId", json!(show_bytes(&r.incarnation_id))),
                ],
            ),
            MetadataRecord::NodeRegistrationChange(r) => (
                "NodeRegistrationChange",
                vec![
                    ("nodeId", json!(r.node_id)),
                    ("brokerEpoch", json!(r.broker_epoch)),
                    (
                        "change",
                        json!(match r.change {
                            RegistrationChange::Fenced => "Fenced",
                            RegistrationChange::Unfenced => "Unfenced",
                            RegistrationChange::ControlledShutdown => "ControlledShutdown",
                        }),
                    ),
                ],
            ),
            MetadataRecord::Topic(t) => {
                self.topic_names.insert(t.topic_id, t.name.clone());
                (
                    "Topic",
                    vec![
                        ("name", json!(t.name)),
                        ("topicId", json!(t.topic_id.to_string())),
                        ("partitions", json!(t.partitions)),
                        ("configs", configs(&t.configs)),
                    ],
                )
            }
            MetadataRecord::RemoveTopic(r) => (
                "RemoveTopic",
                vec![
                    ("topic", topic(&self.topic_names, &r.topic_id)),
                    ("topicId", json!(r.topic_id.to_string())),
                ],
            ),
            MetadataRecord::Partition(p) => (
                "Partition",
                vec![
                    ("topic", topic(&self.topic_names, &p.topic_id)),
                    ("partition", json!(p.index)),
                    ("replicas", json!(p.replicas)),
                    ("isr", json!(p.isr)),
                    ("leader", json!(p.leader)),
                    ("leaderEpoch", json!(p.leader_epoch)),
                    ("partitionEpoch", json!(p.partition_epoch)),
                ],
            ),
            MetadataRecord::PartitionChange(c) => (
                "PartitionChange",
                vec![
                    ("topic", topic(&self.topic_names, &c.topic_id)),
                    ("partition", json!(c.index)),
                    ("isr", json!(c.isr)),
                    ("leader", json!(c.leader)),
                    ("leaderEpoch", json!(c.leader_epoch)),
                    ("partitionEpoch", json!(c.partition_epoch)),
                ]
                .into_iter()
                .chain(c.replicas.iter().flat_map(|set| {
                    [
                        ("replicas", json!(set.replicas)),
                        ("adding", json!(set.adding)),
                        ("removing", json!(set.removing)),
                    ]
                }))
                .collect(),
            ),
            MetadataRecord::Config(c) => (
                "Config",
                vec![
                    (
                        "resource",
                        json!(match &c.resource {
                            ConfigResource::Cluster => "cluster".to_string(),
                            ConfigResource::Node(n) => format!("node:{n}"),
                            ConfigResource::Topic(t) => format!("topic:{t}"),
                        }),
                    ),
                    ("name", json!(c.name)),
                    ("value", json!(c.value)),
                ],
            ),
            MetadataRecord::ClusterId(c) => ("ClusterId", vec![("clusterId", json!(c.cluster_id))]),
            MetadataRecord::UnregisterNode(u) => {
                ("UnregisterNode", vec![("nodeId", json!(u.node_id))])
            }
            // Salt and keys stay out of the dump: they are what an attacker
            // would need to try passwords offline.
            MetadataRecord::UserScramCredential(c) => (
                "UserScramCredential",
                vec![
                    ("name", json!(c.name)),
                    ("mechanism", scram_mechanism(c.mechanism)),
                    ("iterations", json!(c.iterations)),
                ],
            ),
            MetadataRecord::RemoveUserScramCredential(c) => (
                "RemoveUserScramCredential",
                vec![
                    ("name", json!(c.name)),
                    ("mechanism", scram_mechanism(c.mechanism)),
                ],
            ),
            MetadataRecord::Acl(a) => ("Acl", acl_fields(a)),
            MetadataRecord::RemoveAcl(a) => ("RemoveAcl", acl_fields(a)),
            MetadataRecord::ClientQuota(q) => (
                "ClientQuota",
                vec![
                    (
                        "entity",
                        json!(q
                            .entity
                            .iter()
                            .map(|p| json!({"entityType": p.entity_type, "entityName": p.name}))
                            .collect::<Vec<_>>()),
                    ),
                    ("key", json!(q.key)),
                    ("value", json!(q.value())),
                    ("remove", json!(q.value_bits.is_none())),
                ],
            ),
        }
    }
}

fn scram_mechanism(code: i8) -> Value {
    match skiff_controller::access::scram_mechanism_name(code) {
        Some(name) => json!(name),
        None => json!(format!("unknown ({code})")),
    }
}

/// An ACL binding by Kafka's names (its codes where they mean nothing).
fn acl_fields(a: &AclRecord) -> Fields {
    match skiff_controller::access::acl_binding(a) {
        Ok(b) => vec![
            ("resourceType", json!(b.pattern.resource_type.name())),
            ("name", json!(b.pattern.name)),
            ("patternType", json!(b.pattern.pattern_type.name())),
            ("principal", json!(b.entry.principal)),
            ("host", json!(b.entry.host)),
            ("operation", json!(b.entry.operation.name())),
            ("permission", json!(b.entry.permission.name())),
        ],
        Err(e) => vec![
            ("invalid", json!(e.to_string())),
            ("raw", json!(format!("{a:?}"))),
        ],
    }
}

fn endpoints(endpoints: &[Endpoint]) -> Value {
    json!(endpoints
        .iter()
        .map(|e| format!("{}://{}:{}", e.name, e.host, e.port))
        .collect::<Vec<_>>())
}

fn configs(configs: &[(String, String)]) -> Value {
    Value::Object(configs.iter().map(|(k, v)| (k.clone(), json!(v))).collect())
}
