//! Metadata records: what the controller writes to the metadata log.
//!
//! One Raft entry holds one batch of records (`encode_batch`), committed
//! atomically: fencing a node is its partition changes and its registration
//! change in one entry, so no replica ever sees half of it. Each record then
//! applies on its own (`ClusterState::apply`); one the state refuses is skipped
//! the same way on every replica.
//!
//! Wire form of a batch (and of a state snapshot):
//!
//! ```text
//! version u8 (FORMAT_VERSION) | crc32c u32 LE of the archive | rkyv archive
//! ```
//!
//! An unknown version byte is an error (a newer writer's format is not guessed
//! at). Format 1 (before reassignments: no replica sets in partition changes or
//! the state) and format 2 (before SCRAM credentials and ACLs) are still read, through
//! `format_v1` and `format_v2`, and converted. The CRC comes first because an rkyv archive keeps its root at the end: a
//! truncated archive can be a valid smaller archive, which only the checksum
//! catches. The archive is then validated with bytecheck, so hostile bytes with a
//! matching CRC still give an error, never undefined behaviour.

use rkyv::{Archive, Deserialize, Serialize};

/// Kafka's broker id type. Raft peer ids are the same number as `u64` (never 0).
pub type NodeId = i32;

/// `leader` of a partition that has no leader (Kafka's `-1`).
pub const NO_LEADER: NodeId = -1;

/// The format version written in front of every encoded batch and snapshot.
/// 2: `PartitionChange::replicas` and the partition state's adding/removing
/// replicas (reassignments), `UnregisterNode`.
/// 3: SCRAM credentials and ACLs (`UserScramCredential`, `Acl` and their
/// removals) and the state's sets of them.
/// 4: client quotas (`ClientQuota`) and the state's set of them.
/// Formats 1 to 3 are read too (`format_v1`, `format_v2`, `format_v3`).
pub const FORMAT_VERSION: u8 = 4;

/// A batch larger than this is refused before decoding (a metadata batch is a
/// handful of records; the biggest is a topic creation with its partitions).
pub const BATCH_BYTES_MAX: usize = 16 << 20;

/// Version byte + CRC.
const HEADER_BYTES: usize = 5;

/// A topic's id (Kafka's topic UUID, 16 bytes). Chosen by the caller (random in
/// the node), so the decisions stay deterministic.
#[derive(
    Archive, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash,
)]
pub struct TopicId(pub [u8; 16]);

impl std::fmt::Display for TopicId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, b) in self.0.iter().enumerate() {
            if matches!(i, 4 | 6 | 8 | 10) {
                f.write_str("-")?;
            }
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

/// A listener a node advertises (`name` is the listener name, e.g. `PLAINTEXT`).
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub name: String,
    pub host: String,
    pub port: u16,
}

/// A node (re-)registered. The node starts fenced; `broker_epoch` grows with every
/// registration of any node and fences requests from an older incarnation.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct RegisterNode {
    pub node_id: NodeId,
    /// Random per process start: a new incarnation means the node restarted.
    pub incarnation_id: [u8; 16],
    pub broker_epoch: i64,
    pub endpoints: Vec<Endpoint>,
    pub rack: Option<String>,
}

#[derive(Archive, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegistrationChange {
    /// Session expired (or the node asked): it may lead nothing and is not in any ISR
    /// that has other members.
    Fenced,
    /// Caught up with the metadata log: eligible as leader and ISR member again.
    Unfenced,
    /// The node is stopping: its leaderships were moved away in the same batch.
    ControlledShutdown,
}

#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct NodeRegistrationChange {
    pub node_id: NodeId,
    /// Must equal the node's current broker epoch, or the record is refused.
    pub broker_epoch: i64,
    pub change: RegistrationChange,
}

/// A topic was created; its partitions follow as `Partition` records in the same
/// batch.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Topic {
    pub name: String,
    pub topic_id: TopicId,
    pub partitions: u32,
    /// Per-topic overrides (Kafka's names), sorted by name.
    pub configs: Vec<(String, String)>,
}

#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct RemoveTopic {
    pub topic_id: TopicId,
}

/// A partition's full state (on creation).
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Partition {
    pub topic_id: TopicId,
    pub index: u32,
    pub replicas: Vec<NodeId>,
    pub isr: Vec<NodeId>,
    pub leader: NodeId,
    pub leader_epoch: i32,
    pub partition_epoch: i32,
}

/// A change of a partition's ISR and/or leader, carrying the epochs it results in.
/// `partition_epoch` grows with every change; `leader_epoch` grows when the leader
/// changes (stale leaders are fenced by it).
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct PartitionChange {
    pub topic_id: TopicId,
    pub index: u32,
    /// `None`: unchanged.
    pub isr: Option<Vec<NodeId>>,
    /// `None`: unchanged; `Some(NO_LEADER)`: offline.
    pub leader: Option<NodeId>,
    pub leader_epoch: i32,
    pub partition_epoch: i32,
    /// `None`: unchanged. A reassignment starting, completing or cancelled.
    pub replicas: Option<ReplicaSet>,
}

/// A partition's replicas with its reassignment (Kafka's KIP-455): while one
/// runs, `replicas` is the target followed by the replicas being removed,
/// `adding` the target's new members (catching up, not yet all in the ISR)
/// and `removing` the members the target drops. Both empty: none runs.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct ReplicaSet {
    pub replicas: Vec<NodeId>,
    pub adding: Vec<NodeId>,
    pub removing: Vec<NodeId>,
}

#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum ConfigResource {
    /// Cluster-wide default (Kafka's broker resource with an empty name).
    Cluster,
    Node(NodeId),
    Topic(String),
}

/// Sets (`Some`) or removes (`None`) one config of a resource.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub resource: ConfigResource,
    pub name: String,
    pub value: Option<String>,
}

/// The cluster's id (Kafka's 22-character URL-safe base64), chosen once by
/// the first active controller; every broker answers Metadata with it.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct ClusterIdentity {
    pub cluster_id: String,
}

#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub enum MetadataRecord {
    RegisterNode(RegisterNode),
    NodeRegistrationChange(NodeRegistrationChange),
    Topic(Topic),
    RemoveTopic(RemoveTopic),
    Partition(Partition),
    PartitionChange(PartitionChange),
    Config(Config),
    ClusterId(ClusterIdentity),
    UnregisterNode(UnregisterNode),
    UserScramCredential(UserScramCredential),
    RemoveUserScramCredential(RemoveUserScramCredential),
    Acl(AclRecord),
    RemoveAcl(AclRecord),
    ClientQuota(ClientQuotaRecord),
}

/// One component of a client quota entity (Kafka's `EntityData`): its type
/// (`user`, `client-id`) and its name, `None` for the type's `<default>`.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct QuotaEntityPart {
    pub entity_type: String,
    pub name: Option<String>,
}

/// Entity types of client quotas (Kafka's `ClientQuotaEntity`).
pub const QUOTA_USER: &str = "user";
pub const QUOTA_CLIENT_ID: &str = "client-id";

/// One quota of one entity set or removed (Kafka's `ClientQuotaRecord`).
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct ClientQuotaRecord {
    /// Its components, sorted by type, each type at most once.
    pub entity: Vec<QuotaEntityPart>,
    /// `producer_byte_rate`, `consumer_byte_rate`, `request_percentage`.
    pub key: String,
    /// The value's `f64::to_bits` (kept as bits so records compare exactly);
    /// `None` removes the quota.
    pub value_bits: Option<u64>,
}

impl ClientQuotaRecord {
    pub fn value(&self) -> Option<f64> {
        self.value_bits.map(f64::from_bits)
    }
}

/// A user's SCRAM credential for one mechanism (AlterUserScramCredentials'
/// upsertion): what a server keeps instead of the password. Replaces the
/// user's credential for that mechanism.
#[derive(Archive, Serialize, Deserialize, Clone, PartialEq, Eq)]
pub struct UserScramCredential {
    pub name: String,
    /// Kafka's mechanism type: 1 SCRAM-SHA-256, 2 SCRAM-SHA-512.
    pub mechanism: i8,
    pub salt: Vec<u8>,
    pub stored_key: Vec<u8>,
    pub server_key: Vec<u8>,
    pub iterations: u32,
}

impl std::fmt::Debug for UserScramCredential {
    /// Keys stay out of log lines.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UserScramCredential")
            .field("name", &self.name)
            .field("mechanism", &self.mechanism)
            .field("iterations", &self.iterations)
            .finish_non_exhaustive()
    }
}

#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct RemoveUserScramCredential {
    pub name: String,
    pub mechanism: i8,
}

/// One ACL binding, with Kafka's wire codes (`skiff_security::acl` gives them
/// meaning): a resource pattern and an access control entry. Bindings are a
/// set: adding one that exists, or removing one that does not, changes nothing.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AclRecord {
    pub resource_type: i8,
    pub resource_name: String,
    pub pattern_type: i8,
    pub principal: String,
    pub host: String,
    pub operation: i8,
    pub permission: i8,
}

/// A node left the cluster for good (UnregisterBroker): its registration goes.
/// Only for a fenced node that holds no replica (the controller checks).
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct UnregisterNode {
    pub node_id: NodeId,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RecordError {
    #[error("metadata batch is empty (no format version byte)")]
    Empty,
    #[error(
        "metadata batch format version {0} is not supported (this build reads {FORMAT_VERSION})"
    )]
    UnknownVersion(u8),
    #[error("metadata batch of {0} bytes is over the {BATCH_BYTES_MAX} byte limit")]
    TooLarge(usize),
    #[error("metadata batch checksum mismatch (stored {expected:#010x}, computed {actual:#010x})")]
    Checksum { expected: u32, actual: u32 },
    #[error("metadata batch does not decode: {0}")]
    Malformed(String),
}

/// Encodes a batch of records: version byte + rkyv archive.
pub fn encode_batch(records: &[MetadataRecord]) -> Vec<u8> {
    encode_versioned(&records.to_vec())
}

/// Decodes what `encode_batch` wrote.
pub fn decode_batch(bytes: &[u8]) -> Result<Vec<MetadataRecord>, RecordError> {
    decode_versioned::<
        Vec<MetadataRecord>,
        crate::format_v1::Batch,
        crate::format_v2::Batch,
        crate::format_v3::Batch,
    >(bytes)
}

/// Version byte + rkyv archive of any archivable value (batches, state snapshots).
pub(crate) fn encode_versioned<T>(value: &T) -> Vec<u8>
where
    T: for<'a> Serialize<
        rkyv::api::high::HighSerializer<
            rkyv::util::AlignedVec,
            rkyv::ser::allocator::ArenaHandle<'a>,
            rkyv::rancor::Error,
        >,
    >,
{
    // Serializing owned, in-memory values into a growable buffer has no failure
    // mode other than allocation failure, which aborts anyway.
    let archived = match rkyv::to_bytes::<rkyv::rancor::Error>(value) {
        Ok(bytes) => bytes,
        Err(e) => panic!("rkyv serialization into memory failed: {e}"),
    };
    let mut out = Vec::with_capacity(HEADER_BYTES + archived.len());
    out.push(FORMAT_VERSION);
    out.extend_from_slice(&crc32c::crc32c(&archived).to_le_bytes());
    out.extend_from_slice(&archived);
    out
}

/// Decodes what `encode_versioned` wrote: a `T` in the current format, or a
/// `V1` (`V2`, `V3`) in format 1 (2, 3) converted into a `T`.
pub(crate) fn decode_versioned<T, V1, V2, V3>(bytes: &[u8]) -> Result<T, RecordError>
where
    T: Archive,
    T::Archived: for<'a> rkyv::bytecheck::CheckBytes<rkyv::api::high::HighValidator<'a, rkyv::rancor::Error>>
        + Deserialize<T, rkyv::api::high::HighDeserializer<rkyv::rancor::Error>>,
    V1: Archive + Into<T>,
    V1::Archived: for<'a> rkyv::bytecheck::CheckBytes<rkyv::api::high::HighValidator<'a, rkyv::rancor::Error>>
        + Deserialize<V1, rkyv::api::high::HighDeserializer<rkyv::rancor::Error>>,
    V2: Archive + Into<T>,
    V2::Archived: for<'a> rkyv::bytecheck::CheckBytes<rkyv::api::high::HighValidator<'a, rkyv::rancor::Error>>
        + Deserialize<V2, rkyv::api::high::HighDeserializer<rkyv::rancor::Error>>,
    V3: Archive + Into<T>,
    V3::Archived: for<'a> rkyv::bytecheck::CheckBytes<rkyv::api::high::HighValidator<'a, rkyv::rancor::Error>>
        + Deserialize<V3, rkyv::api::high::HighDeserializer<rkyv::rancor::Error>>,
{
    let (&version, rest) = bytes.split_first().ok_or(RecordError::Empty)?;
    if !(1..=FORMAT_VERSION).contains(&version) {
        return Err(RecordError::UnknownVersion(version));
    }
    let Some((crc, body)) = rest.split_first_chunk::<4>() else {
        return Err(RecordError::Malformed("shorter than its header".into()));
    };
    if body.len() > BATCH_BYTES_MAX {
        return Err(RecordError::TooLarge(body.len()));
    }
    let expected = u32::from_le_bytes(*crc);
    let actual = crc32c::crc32c(body);
    if expected != actual {
        return Err(RecordError::Checksum { expected, actual });
    }
    // The archive must be aligned; after the version byte it is not, so copy it.
    let mut aligned = rkyv::util::AlignedVec::<16>::with_capacity(body.len());
    aligned.extend_from_slice(body);
    let malformed = |e: rkyv::rancor::Error| RecordError::Malformed(e.to_string());
    match version {
        1 => {
            return rkyv::from_bytes::<V1, rkyv::rancor::Error>(&aligned)
                .map(Into::into)
                .map_err(malformed)
        }
        2 => {
            return rkyv::from_bytes::<V2, rkyv::rancor::Error>(&aligned)
                .map(Into::into)
                .map_err(malformed)
        }
        3 => {
            return rkyv::from_bytes::<V3, rkyv::rancor::Error>(&aligned)
                .map(Into::into)
                .map_err(malformed)
        }
        _ => {}
    }
    rkyv::from_bytes::<T, rkyv::rancor::Error>(&aligned).map_err(malformed)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn tid(n: u8) -> TopicId {
        TopicId([n; 16])
    }

    pub(crate) fn sample_records() -> Vec<MetadataRecord> {
        vec![
            MetadataRecord::RegisterNode(RegisterNode {
                node_id: 3,
                incarnation_id: [7; 16],
                broker_epoch: 12,
                endpoints: vec![Endpoint {
                    name: "PLAINTEXT".into(),
                    host: "10.0.0.3".into(),
                    port: 9092,
                }],
                rack: Some("rack-a".into()),
            }),
            MetadataRecord::NodeRegistrationChange(NodeRegistrationChange {
                node_id: 3,
                broker_epoch: 12,
                change: RegistrationChange::ControlledShutdown,
            }),
            MetadataRecord::Topic(Topic {
                name: "orders".into(),
                topic_id: tid(1),
                partitions: 2,
                configs: vec![("retention.ms".into(), "1000".into())],
            }),
            MetadataRecord::Partition(Partition {
                topic_id: tid(1),
                index: 1,
                replicas: vec![1, 2, 3],
                isr: vec![1, 3],
                leader: 3,
                leader_epoch: 4,
                partition_epoch: 9,
            }),
            MetadataRecord::PartitionChange(PartitionChange {
                topic_id: tid(1),
                index: 1,
                isr: Some(vec![1]),
                leader: Some(NO_LEADER),
                leader_epoch: 5,
                partition_epoch: 10,
                replicas: None,
            }),
            MetadataRecord::RemoveTopic(RemoveTopic { topic_id: tid(1) }),
            MetadataRecord::Config(Config {
                resource: ConfigResource::Topic("orders".into()),
                name: "cleanup.policy".into(),
                value: None,
            }),
            MetadataRecord::Config(Config {
                resource: ConfigResource::Node(2),
                name: "x".into(),
                value: Some("y".into()),
            }),
        ]
    }

    #[test]
    fn batch_round_trips() {
        let records = sample_records();
        let bytes = encode_batch(&records);
        assert_eq!(bytes[0], FORMAT_VERSION);
        assert_eq!(decode_batch(&bytes).unwrap(), records);
        assert_eq!(decode_batch(&encode_batch(&[])).unwrap(), vec![]);
    }

    #[test]
    fn unknown_version_and_empty_are_errors() {
        let mut bytes = encode_batch(&sample_records());
        bytes[0] = FORMAT_VERSION + 1;
        assert_eq!(
            decode_batch(&bytes),
            Err(RecordError::UnknownVersion(FORMAT_VERSION + 1))
        );
        assert_eq!(decode_batch(&[]), Err(RecordError::Empty));
    }

    #[test]
    fn corrupted_bytes_never_panic_and_truncation_fails() {
        let bytes = encode_batch(&sample_records());
        for cut in 1..bytes.len() {
            assert!(decode_batch(&bytes[..cut]).is_err(), "cut at {cut} decoded");
        }
        // Every garbled byte is detected (CRC), without a panic.
        for pos in 1..bytes.len() {
            for flip in [0x01u8, 0x80, 0xff] {
                let mut garbled = bytes.clone();
                garbled[pos] ^= flip;
                assert!(decode_batch(&garbled).is_err(), "flip {flip:#x} at {pos}");
            }
        }
        assert!(decode_batch(&[FORMAT_VERSION, 0xde, 0xad, 0xbe, 0xef]).is_err());
        // Hostile bytes with a valid CRC are refused by validation, not trusted.
        for len in [0usize, 1, 7, 64, 200] {
            let body: Vec<u8> = (0..len).map(|i| (i * 37 + 11) as u8).collect();
            let mut forged = vec![FORMAT_VERSION];
            forged.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
            forged.extend_from_slice(&body);
            assert!(decode_batch(&forged).is_err(), "forged body of {len} bytes");
        }
    }

    #[test]
    fn topic_id_displays_as_uuid() {
        let id = TopicId([
            0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0, 0, 1, 2, 3, 4, 5, 6, 7,
        ]);
        assert_eq!(id.to_string(), "12345678-9abc-def0-0001-020304050607");
    }
}

/// Format-1 bytes as an earlier build wrote them: `encode_batch` of
/// `tests::sample_records()`, and `ClusterState::to_snapshot` after applying
/// that batch. The metadata log and its snapshots outlive the binary that
/// wrote them, so a change to any record's or the state's layout must fail
/// here first (the format-4 bytes below), and come with a FORMAT_VERSION bump
/// and a reader for the older formats (`format_v1` to `format_v3`). `SKIFF_PRINT_GOLDEN=1
/// cargo test -p skiff-controller golden -- --nocapture` prints the current
/// format's bytes.
#[cfg(test)]
const GOLDEN_BATCH_V1: &[&str] = &[
    "01b45774ec504c41494e5445585400000089000000f4ffffff31302e302e302e3384230000726574656e74696f6e2e6d",
    "738c000000f4ffffff31303030ffffffff010000000200000003000000010000000300000001000000636c65616e7570",
    "2e706f6c69637900000000000000000000000000000300000007070707070707070707070707070707000000000c0000",
    "00000000007cffffff01000000010000007261636b2d61ffff00000000010000000000000003000000000000000c0000",
    "000000000002000000000000000000000000000000000000000000000000000000000000000000000000000000020000",
    "006f7264657273ffff010101010101010101010101010101010200000024ffffff010000000000000000000000000000",
    "00000000000000000000000000040000000101010101010101010101010101010101000000fcfeffff0300000000ffff",
    "ff0200000003000000040000000900000000000000000000000000000005000000010101010101010101010101010101",
    "010100000001000000ccfeffff0100000001000000ffffffff050000000a000000000000000000000000000000030101",
    "010101010101010101010101010100000000000000000000000000000000000000000000000000000000000000000000",
    "0000000000000000000000000006000000020000006f7264657273ffff8e0000005cfeffff0000000000000000000000",
    "00000000000000000000000000000000000000000000000000000000000600000001000000020000000000000078ffff",
    "ffffffffff0100000079ffffffffffffff0000000000000000000000000000000000000000000000000000000000feff",
    "ff08000000",
];

#[cfg(test)]
const GOLDEN_SNAPSHOT_V1: &[&str] = &[
    "0191f21556504c41494e5445585400000089000000f4ffffff31302e302e302e33842300000300000007070707070707",
    "070707070707070707000000000c00000000000000ccffffff01000000010000007261636b2d61ffff01010000010000",
    "000000000078ffffffffffffff79ffffffffffffff010000000200000000000000e4ffffff010000000000000098ffff",
    "ff01000000d0ffffff00000000d8ffffff010000000c0000000000000001000000000000000000000000000000000000",
    "0000000000",
];

#[cfg(test)]
const GOLDEN_BATCH_V2: &[&str] = &[
    "0265614e98504c41494e5445585400000089000000f4ffffff31302e302e302e3384230000726574656e74696f6e2e6d",
    "738c000000f4ffffff31303030ffffffff010000000200000003000000010000000300000001000000636c65616e7570",
    "2e706f6c6963790000010000000200000001000000020000000300000001000000020000000300000002000000000000",
    "00000000000300000007070707070707070707070707070707000000000c000000000000005cffffff01000000010000",
    "007261636b2d61ffff0000000000000000000000000000000000000000010000000000000003000000000000000c0000",
    "000000000002000000000000000000000000000000000000000000000000000000000000000000000000000000000000",
    "00000000000000000000000000020000006f7264657273ffff0101010101010101010101010101010102000000e4feff",
    "ff0100000000000000000000000000000000000000000000000000000000000000000000000000000000000000040000",
    "000101010101010101010101010101010101000000acfeffff03000000b0feffff020000000300000004000000090000",
    "000000000000000000000000000000000000000000000000000000000005000000010101010101010101010101010101",
    "0101000000010000006cfeffff0100000001000000ffffffff050000000a000000000000000000000000000000000000",
    "000000000000000000000000000301010101010101010101010101010101000000000000000000000000000000000000",
    "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000060000",
    "00020000006f7264657273ffff8e000000dcfdffff000000000000000000000000000000000000000000000000000000",
    "00000000000000000000000000000000000000000000000000000000000600000001000000020000000000000078ffff",
    "ffffffffff0100000079ffffffffffffff00000000000000000000000000000000000000000000000000000000000000",
    "000000000000000000000000000800000003000000000000000000000000000000000000000000000000000000000000",
    "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000020000",
    "006d6f766573ffffff0202020202020202020202020202020201000000ecfcffff000000000000000000000000000000",
    "000000000000000000000000000000000000000000000000000000000004000000020202020202020202020202020202",
    "0200000000a4fcffff02000000a4fcffff02000000010000000000000000000000000000000000000000000000000000",
    "000000000000000000000000000500000002020202020202020202020202020202000000000000000000000000000000",
    "00000000000000000000000000010000000100000044fcffff0300000048fcffff0100000044fcffff0100000040fcff",
    "ff0c000000",
];

#[cfg(test)]
const GOLDEN_SNAPSHOT_V2: &[&str] = &[
    "020961719103000000010000000200000001000000020000000300000002000000000000000000000000000000000000",
    "000000000000000000ccffffff03000000d0ffffff02000000010000000000000001000000c4ffffff01000000c0ffff",
    "ff0100000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000",
    "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000",
    "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000",
    "00000000000000000000000000000000000000000000000000000000000000000000000000010000006d6f766573ffff",
    "ff02020202020202020202020202020202d4feffff0000000001000000e4feffff0100000078ffffffffffffff79ffff",
    "ffffffffff010000000200000000000000e4ffffff010000000000000098feffff00000000a4ffffff01000000d8ffff",
    "ff010000000c00000000000000010000000000000000000000000000000000000000000000",
];

#[cfg(test)]
const GOLDEN_BATCH_V3: &[&str] = &[
    "037cc72cc1504c41494e5445585400000089000000f4ffffff31302e302e302e3384230000726574656e74696f6e2e6d",
    "738c000000f4ffffff31303030ffffffff010000000200000003000000010000000300000001000000636c65616e7570",
    "2e706f6c6963790000010000000200000001000000020000000300000001000000020000000300000002000000010101",
    "010101010101010101010101010101010101010101020202020202020202020202020202020202020202020202020202",
    "020202020202020202020202020202020202020202020202020202020202020202020202020303030303030303030303",
    "030303030303030303030303030303030303030303030303030303030303030303030303030303030303030303030303",
    "030303030304040404040404040404040404040404040404040404040405050505050505050505050505050505050505",
    "050505050505050505050505050606060606060606060606060606060606060606060606060606060606060606557365",
    "723a616c696365557365723a616c696365557365723a616c696365000000000000000000000300000007070707070707",
    "070707070707070707000000000c000000000000004cfeffff01000000010000007261636b2d61ffff00000000000000",
    "00000000000000000000000000010000000000000003000000000000000c000000000000000200000000000000000000",
    "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000020000",
    "006f7264657273ffff0101010101010101010101010101010102000000d4fdffff010000000000000000000000000000",
    "000000000000000000000000000000000000000000000000000000000004000000010101010101010101010101010101",
    "01010000009cfdffff03000000a0fdffff02000000030000000400000009000000000000000000000000000000000000",
    "00000000000000000000000000050000000101010101010101010101010101010101000000010000005cfdffff010000",
    "0001000000ffffffff050000000a00000000000000000000000000000000000000000000000000000000000000030101",
    "010101010101010101010101010100000000000000000000000000000000000000000000000000000000000000000000",
    "000000000000000000000000000000000000000000000000000000000006000000020000006f7264657273ffff8e0000",
    "00ccfcffff00000000000000000000000000000000000000000000000000000000000000000000000000000000000000",
    "000000000000000000000000000600000001000000020000000000000078ffffffffffffff0100000079ffffffffffff",
    "ff0000000000000000000000000000000000000000000000000000000000000000000000000000000000000000080000",
    "000300000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000",
    "0000000000000000000000000000000000000000000000000000000000020000006d6f766573ffffff02020202020202",
    "02020202020202020201000000dcfbffff00000000000000000000000000000000000000000000000000000000000000",
    "0000000000000000000000000004000000020202020202020202020202020202020000000094fbffff0200000094fbff",
    "ff0200000001000000000000000000000000000000000000000000000000000000000000000000000000000000050000",
    "000202020202020202020202020202020200000000000000000000000000000000000000000000000000000000010000",
    "000100000034fbffff0300000038fbffff0100000034fbffff0100000009000000616c696365ffffff0200000020fbff",
    "ff1800000030fbffff4000000068fbffff40000000001000000000000000000000000000000000000000000000000000",
    "0000000000000000000000000009000000626f62ffffffffff0100000068fbffff1800000078fbffff2000000090fbff",
    "ff20000000002000000000000000000000000000000000000000000000000000000000000000000000000000000a0000",
    "00626f62ffffffffff010000000000000000000000000000000000000000000000000000000000000000000000000000",
    "00000000000000000000000000000000000000000000000000000000000b000000020000006f7264657273ffff030000",
    "008a0000001cfbffff2affffffffffffff03030000000000000000000000000000000000000000000000000000000000",
    "000000000000000000000000000b000000020000006f7264ffffffffff040000008a000000d6faffff2affffffffffff",
    "ff03030000000000000000000000000000000000000000000000000000000000000000000000000000000000000c0000",
    "00020000006f7264657273ffff030000008a00000090faffff2affffffffffffff030300000000000000000000000000",
    "000000000000000000000000000000000000000000000000000000000060faffff12000000",
];

#[cfg(test)]
const GOLDEN_SNAPSHOT_V3: &[&str] = &[
    "03c3eb35d903000000010000000200000001000000020000000300000002000000000000000000000000000000000000",
    "000000000000000000ccffffff03000000d0ffffff02000000010000000000000001000000c4ffffff01000000c0ffff",
    "ff0100000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000",
    "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000",
    "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000",
    "00000000000000000000000000000000000000000000000000000000000000000000000000010000006d6f766573ffff",
    "ff02020202020202020202020202020202d4feffff0000000001000000e4feffff0100000078ffffffffffffff79ffff",
    "ffffffffff010000000200000000000000e4ffffff010000000101010101010101010101010101010101010101010101",
    "010202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020202",
    "020202020202020202020202020202020203030303030303030303030303030303030303030303030303030303030303",
    "030303030303030303030303030303030303030303030303030303030303030303616c696365ffffff020000005cffff",
    "ff180000006cffffff40000000a4ffffff4000000000100000557365723a616c6963650000020000006f7264ffffffff",
    "ff040000008a000000e4ffffff2affffffffffffff0303000000000000a8fdffff00000000b4feffff01000000e8feff",
    "ff010000000c00000000000000010000000000000000000000000000000000000070ffffff010000009cffffff010000",
    "0000000000",
];

#[cfg(test)]
const GOLDEN_BATCH_V4: &[&str] = &[
    "040c45ad7f504c41494e5445585400000089000000f4ffffff31302e302e302e3384230000726574656e74696f6e2e6d",
    "738c000000f4ffffff31303030ffffffff010000000200000003000000010000000300000001000000636c65616e7570",
    "2e706f6c6963790000010000000200000001000000020000000300000001000000020000000300000002000000010101",
    "010101010101010101010101010101010101010101020202020202020202020202020202020202020202020202020202",
    "020202020202020202020202020202020202020202020202020202020202020202020202020303030303030303030303",
    "030303030303030303030303030303030303030303030303030303030303030303030303030303030303030303030303",
    "030303030304040404040404040404040404040404040404040404040405050505050505050505050505050505050505",
    "050505050505050505050505050606060606060606060606060606060606060606060606060606060606060606557365",
    "723a616c696365557365723a616c696365557365723a616c696365000075736572ffffffff01000000616c696365ffff",
    "ff70726f64756365725f627974655f72617465636c69656e742d69640089000000f6ffffff0000000000000000000000",
    "0075736572ffffffff01000000616c696365ffffff636f6e73756d65725f627974655f72617465636c69656e742d6964",
    "0089000000f6ffffff0100000065746cffffffffff726571756573745f70657263656e74616765636c69656e742d6964",
    "0089000000f6ffffff0100000065746cffffffffff726571756573745f70657263656e74616765000000000000000000",
    "00000000000300000007070707070707070707070707070707000000000c000000000000007cfdffff01000000010000",
    "007261636b2d61ffff0000000000000000000000000000000000000000010000000000000003000000000000000c0000",
    "000000000002000000000000000000000000000000000000000000000000000000000000000000000000000000000000",
    "00000000000000000000000000020000006f7264657273ffff010101010101010101010101010101010200000004fdff",
    "ff0100000000000000000000000000000000000000000000000000000000000000000000000000000000000000040000",
    "000101010101010101010101010101010101000000ccfcffff03000000d0fcffff020000000300000004000000090000",
    "000000000000000000000000000000000000000000000000000000000005000000010101010101010101010101010101",
    "0101000000010000008cfcffff0100000001000000ffffffff050000000a000000000000000000000000000000000000",
    "000000000000000000000000000301010101010101010101010101010101000000000000000000000000000000000000",
    "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000060000",
    "00020000006f7264657273ffff8e000000fcfbffff000000000000000000000000000000000000000000000000000000",
    "00000000000000000000000000000000000000000000000000000000000600000001000000020000000000000078ffff",
    "ffffffffff0100000079ffffffffffffff00000000000000000000000000000000000000000000000000000000000000",
    "000000000000000000000000000800000003000000000000000000000000000000000000000000000000000000000000",
    "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000020000",
    "006d6f766573ffffff02020202020202020202020202020202010000000cfbffff000000000000000000000000000000",
    "000000000000000000000000000000000000000000000000000000000004000000020202020202020202020202020202",
    "0200000000c4faffff02000000c4faffff02000000010000000000000000000000000000000000000000000000000000",
    "000000000000000000000000000500000002020202020202020202020202020202000000000000000000000000000000",
    "00000000000000000000000000010000000100000064faffff0300000068faffff0100000064faffff01000000090000",
    "00616c696365ffffff0200000050faffff1800000060faffff4000000098faffff400000000010000000000000000000",
    "000000000000000000000000000000000000000000000000000000000009000000626f62ffffffffff0100000098faff",
    "ff18000000a8faffff20000000c0faffff20000000002000000000000000000000000000000000000000000000000000",
    "000000000000000000000000000a000000626f62ffffffffff0100000000000000000000000000000000000000000000",
    "0000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000b0000",
    "00020000006f7264657273ffff030000008a0000004cfaffff2affffffffffffff030300000000000000000000000000",
    "00000000000000000000000000000000000000000000000000000000000b000000020000006f7264ffffffffff040000",
    "008a00000006faffff2affffffffffffff03030000000000000000000000000000000000000000000000000000000000",
    "000000000000000000000000000c000000020000006f7264657273ffff030000008a000000c0f9ffff2affffffffffff",
    "ff03030000000000000000000000000000000000000000000000000000000000000000000000000000000000000d0000",
    "000000000088f9ffff010000009200000094f9ffff010000000000000000000000000030410000000000000000000000",
    "00000000000000000000000000000000000000000000000000000000000d0000000000000068f9ffff02000000920000",
    "0088f9ffff010000000000000000000000d0124341000000000000000000000000000000000000000000000000000000",
    "000000000000000000000000000d000000000000005cf9ffff010000009200000068f9ffff0100000000000000000000",
    "0000004940000000000000000000000000000000000000000000000000000000000000000000000000000000000d0000",
    "00000000003cf9ffff010000009200000048f9ffff000000000000000000000000000000000000000000000000000000",
    "000000000000000000000000000000000000000000000000000000000020f9ffff16000000",
];

#[cfg(test)]
const GOLDEN_SNAPSHOT_V4: &[&str] = &[
    "049b92800b03000000010000000200000001000000020000000300000002000000000000000000000000000000000000",
    "000000000000000000ccffffff03000000d0ffffff02000000010000000000000001000000c4ffffff01000000c0ffff",
    "ff0100000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000",
    "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000",
    "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000",
    "00000000000000000000000000000000000000000000000000000000000000000000000000010000006d6f766573ffff",
    "ff02020202020202020202020202020202d4feffff0000000001000000e4feffff0100000078ffffffffffffff79ffff",
    "ffffffffff010000000200000000000000e4ffffff010000000101010101010101010101010101010101010101010101",
    "010202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020202",
    "020202020202020202020202020202020203030303030303030303030303030303030303030303030303030303030303",
    "030303030303030303030303030303030303030303030303030303030303030303616c696365ffffff020000005cffff",
    "ff180000006cffffff40000000a4ffffff4000000000100000557365723a616c6963650000020000006f7264ffffffff",
    "ff040000008a000000e4ffffff2affffffffffffff03030000636c69656e742d696400000089000000f4ffffff000000",
    "00000000000000000075736572ffffffff01000000616c696365ffffff636f6e73756d65725f627974655f7261746500",
    "0075736572ffffffff01000000616c696365ffffff70726f64756365725f627974655f7261746500000000000098ffff",
    "ff0200000092000000b8ffffff010000000000000000000000d0124341b4ffffff0100000092000000c0ffffff010000",
    "00000000000000000000003041f8fcffff0000000004feffff0100000038feffff010000000c00000000000000010000",
    "0000000000000000000000000000000000c0feffff01000000ecfeffff010000007cffffff0200000000000000",
];

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod golden {
    use super::*;
    use crate::state::ClusterState;

    fn bytes(hex: &[&str]) -> Vec<u8> {
        let hex: String = hex.concat();
        (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn batches_and_snapshots_of_format_1_still_decode() {
        let batch = bytes(GOLDEN_BATCH_V1);
        assert_eq!(batch[0], 1);
        assert_eq!(decode_batch(&batch).unwrap(), tests::sample_records());
        let state = ClusterState::from_snapshot(&bytes(GOLDEN_SNAPSHOT_V1)).unwrap();
        let mut expected = ClusterState::new();
        expected.apply_batch(1, &tests::sample_records());
        assert_eq!(state, expected);
    }

    /// A reassignment in flight: a partition change with a replica set, and a
    /// state whose partition has adding and removing replicas; a node
    /// unregistered.
    fn reassignment_records() -> Vec<MetadataRecord> {
        let mut records = tests::sample_records();
        records.extend([
            MetadataRecord::UnregisterNode(UnregisterNode { node_id: 3 }),
            MetadataRecord::Topic(Topic {
                name: "moves".into(),
                topic_id: tests::tid(2),
                partitions: 1,
                configs: vec![],
            }),
            MetadataRecord::Partition(Partition {
                topic_id: tests::tid(2),
                index: 0,
                replicas: vec![1, 2],
                isr: vec![1, 2],
                leader: 1,
                leader_epoch: 0,
                partition_epoch: 0,
            }),
            MetadataRecord::PartitionChange(PartitionChange {
                topic_id: tests::tid(2),
                index: 0,
                isr: None,
                leader: None,
                leader_epoch: 0,
                partition_epoch: 1,
                replicas: Some(ReplicaSet {
                    replicas: vec![3, 1, 2],
                    adding: vec![3],
                    removing: vec![2],
                }),
            }),
        ]);
        records
    }

    #[test]
    fn batches_and_snapshots_of_format_2_still_decode() {
        let records = reassignment_records();
        let batch = bytes(GOLDEN_BATCH_V2);
        assert_eq!(batch[0], 2);
        assert_eq!(decode_batch(&batch).unwrap(), records);
        let state = ClusterState::from_snapshot(&bytes(GOLDEN_SNAPSHOT_V2)).unwrap();
        let mut expected = ClusterState::new();
        expected.apply_batch(1, &records);
        assert_eq!(state, expected);
    }

    /// Format 3's additions: SCRAM credentials and ACLs.
    fn security_records() -> Vec<MetadataRecord> {
        let mut records = reassignment_records();
        let acl = AclRecord {
            resource_type: 2,
            resource_name: "orders".into(),
            pattern_type: 3,
            principal: "User:alice".into(),
            host: "*".into(),
            operation: 3,
            permission: 3,
        };
        records.extend([
            MetadataRecord::UserScramCredential(UserScramCredential {
                name: "alice".into(),
                mechanism: 2,
                salt: vec![1; 24],
                stored_key: vec![2; 64],
                server_key: vec![3; 64],
                iterations: 4096,
            }),
            MetadataRecord::UserScramCredential(UserScramCredential {
                name: "bob".into(),
                mechanism: 1,
                salt: vec![4; 24],
                stored_key: vec![5; 32],
                server_key: vec![6; 32],
                iterations: 8192,
            }),
            MetadataRecord::RemoveUserScramCredential(RemoveUserScramCredential {
                name: "bob".into(),
                mechanism: 1,
            }),
            MetadataRecord::Acl(acl.clone()),
            MetadataRecord::Acl(AclRecord {
                pattern_type: 4,
                resource_name: "ord".into(),
                ..acl.clone()
            }),
            MetadataRecord::RemoveAcl(acl),
        ]);
        records
    }

    #[test]
    fn batches_and_snapshots_of_format_3_still_decode() {
        let records = security_records();
        let batch = bytes(GOLDEN_BATCH_V3);
        assert_eq!(batch[0], 3);
        assert_eq!(decode_batch(&batch).unwrap(), records);
        let state = ClusterState::from_snapshot(&bytes(GOLDEN_SNAPSHOT_V3)).unwrap();
        let mut expected = ClusterState::new();
        expected.apply_batch(1, &records);
        assert_eq!(state, expected);
    }

    /// Format 4's addition: client quotas, set and removed.
    fn quota_records() -> Vec<MetadataRecord> {
        let part = |t: &str, n: Option<&str>| QuotaEntityPart {
            entity_type: t.into(),
            name: n.map(Into::into),
        };
        let quota = |entity: Vec<QuotaEntityPart>, key: &str, value: Option<f64>| {
            MetadataRecord::ClientQuota(ClientQuotaRecord {
                entity,
                key: key.into(),
                value_bits: value.map(f64::to_bits),
            })
        };
        let mut records = security_records();
        records.extend([
            quota(
                vec![part(QUOTA_USER, Some("alice"))],
                "producer_byte_rate",
                Some(1048576.0),
            ),
            quota(
                vec![part(QUOTA_CLIENT_ID, None), part(QUOTA_USER, Some("alice"))],
                "consumer_byte_rate",
                Some(2.5e6),
            ),
            quota(
                vec![part(QUOTA_CLIENT_ID, Some("etl"))],
                "request_percentage",
                Some(50.0),
            ),
            quota(
                vec![part(QUOTA_CLIENT_ID, Some("etl"))],
                "request_percentage",
                None,
            ),
        ]);
        records
    }

    #[test]
    fn batches_and_snapshots_of_format_4_are_unchanged() {
        let records = quota_records();
        let batch = encode_batch(&records);
        let snapshot = {
            let mut state = ClusterState::new();
            // The format-1 samples hold records the state refuses (on purpose).
            state.apply_batch(1, &records);
            let p = state.partition(tests::tid(2), 0).unwrap();
            assert_eq!(
                (p.adding.as_slice(), p.removing.as_slice()),
                (&[3][..], &[2][..])
            );
            assert_eq!(state.scram_credentials().count(), 1);
            assert_eq!(state.acls().len(), 1);
            assert_eq!(state.client_quotas().count(), 2);
            state.to_snapshot()
        };
        if std::env::var_os("SKIFF_PRINT_GOLDEN").is_some() {
            for (name, b) in [("batch", &batch), ("snapshot", &snapshot)] {
                let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
                println!("{name}:");
                for line in hex.as_bytes().chunks(96) {
                    println!("    \"{}\",", String::from_utf8_lossy(line));
                }
            }
        }
        assert_eq!(batch, bytes(GOLDEN_BATCH_V4));
        assert_eq!(decode_batch(&batch).unwrap(), records);
        assert_eq!(snapshot, bytes(GOLDEN_SNAPSHOT_V4));
        let state = ClusterState::from_snapshot(&snapshot).unwrap();
        assert_eq!(state.to_snapshot(), snapshot);
    }
}
