//! The records of `__consumer_offsets`, in Kafka's own formats, so Kafka tools
//! (and a Kafka broker) read what skiff writes and skiff reads what Kafka wrote.
//!
//! Every record's key and value start with an i16 schema version:
//!
//! ```text
//! key v0/v1  OffsetCommitKey     group: string, topic: string, partition: int32
//! key v2     GroupMetadataKey    group: string
//! value      OffsetCommitValue   v0-v4 (written: v3)
//!            offset: int64, leaderEpoch: int32 (v3+), metadata: string,
//!            commitTimestamp: int64, expireTimestamp: int64 (v1 only)
//! value      GroupMetadataValue  v0-v4 (written: v3)
//!            protocolType: string, generation: int32, protocol: string?,
//!            leader: string?, currentStateTimestamp: int64 (v2+),
//!            members: [memberId, groupInstanceId? (v3+), clientId, clientHost,
//!                      rebalanceTimeout (v1+), sessionTimeout, subscription: bytes,
//!                      assignment: bytes]
//! ```
//!
//! v4 of both values is flexible (compact lengths, tagged fields), as Kafka's
//! JSON schemas say; skiff reads it and writes v3, which every Kafka since 2.3
//! reads. A null value is a tombstone: the key's offset or group is deleted.

use bytes::BufMut;

use crate::wire::{put_nullable_string, put_string, Reader};

use super::state::{StoredGroup, StoredMember};

pub use crate::wire::RecordError;

/// What a record is about.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RecordKey {
    Offset {
        group: String,
        topic: String,
        partition: i32,
    },
    Group {
        group: String,
    },
}

impl RecordKey {
    pub fn group(&self) -> &str {
        match self {
            RecordKey::Offset { group, .. } | RecordKey::Group { group } => group,
        }
    }
}

/// A committed offset (OffsetCommitValue).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetValue {
    pub offset: i64,
    pub leader_epoch: i32,
    pub metadata: String,
    pub commit_timestamp_ms: i64,
}

const OFFSET_KEY_VERSION: i16 = 1;
const GROUP_KEY_VERSION: i16 = 2;
const OFFSET_VALUE_VERSION: i16 = 3;
const GROUP_VALUE_VERSION: i16 = 3;

pub fn encode_key(key: &RecordKey) -> Vec<u8> {
    let mut out = Vec::new();
    match key {
        RecordKey::Offset {
            group,
            topic,
            partition,
        } => {
            out.put_i16(OFFSET_KEY_VERSION);
            put_string(&mut out, group);
            put_string(&mut out, topic);
            out.put_i32(*partition);
        }
        RecordKey::Group { group } => {
            out.put_i16(GROUP_KEY_VERSION);
            put_string(&mut out, group);
        }
    }
    out
}

pub fn decode_key(bytes: &[u8]) -> Result<RecordKey, RecordError> {
    let mut r = Reader::new(bytes, false);
    match r.i16()? {
        0 | 1 => Ok(RecordKey::Offset {
            group: r.string()?,
            topic: r.string()?,
            partition: r.i32()?,
        }),
        2 => Ok(RecordKey::Group { group: r.string()? }),
        version => Err(RecordError::UnknownVersion {
            what: "key",
            version,
        }),
    }
}

pub fn encode_offset_value(value: &OffsetValue) -> Vec<u8> {
    let mut out = Vec::new();
    out.put_i16(OFFSET_VALUE_VERSION);
    out.put_i64(value.offset);
    out.put_i32(value.leader_epoch);
    put_string(&mut out, &value.metadata);
    out.put_i64(value.commit_timestamp_ms);
    out
}

pub fn decode_offset_value(bytes: &[u8]) -> Result<OffsetValue, RecordError> {
    let version = Reader::new(bytes, false).i16()?;
    if !(0..=4).contains(&version) {
        return Err(RecordError::UnknownVersion {
            what: "OffsetCommitValue",
            version,
        });
    }
    let mut r = Reader::new(bytes, version >= 4);
    r.position = 2;
    let offset = r.i64()?;
    let leader_epoch = if version >= 3 { r.i32()? } else { -1 };
    let metadata = r.string()?;
    let commit_timestamp_ms = r.i64()?;
    if version == 1 {
        let _expire_timestamp = r.i64()?;
    }
    r.tagged_fields()?;
    Ok(OffsetValue {
        offset,
        leader_epoch,
        metadata,
        commit_timestamp_ms,
    })
}

pub fn encode_group_value(group: &StoredGroup) -> Vec<u8> {
    let mut out = Vec::new();
    out.put_i16(GROUP_VALUE_VERSION);
    put_string(&mut out, &group.protocol_type);
    out.put_i32(group.generation);
    put_nullable_string(&mut out, group.protocol.as_deref());
    put_nullable_string(&mut out, group.leader.as_deref());
    out.put_i64(group.current_state_timestamp_ms);
    out.put_i32(group.members.len() as i32);
    for m in &group.members {
        put_string(&mut out, &m.member_id);
        put_nullable_string(&mut out, m.group_instance_id.as_deref());
        put_string(&mut out, &m.client_id);
        put_string(&mut out, &m.client_host);
        out.put_i32(m.rebalance_timeout_ms);
        out.put_i32(m.session_timeout_ms);
        out.put_i32(m.subscription.len() as i32);
        out.put_slice(&m.subscription);
        out.put_i32(m.assignment.len() as i32);
        out.put_slice(&m.assignment);
    }
    out
}

pub fn decode_group_value(bytes: &[u8]) -> Result<StoredGroup, RecordError> {
    let version = Reader::new(bytes, false).i16()?;
    if !(0..=4).contains(&version) {
        return Err(RecordError::UnknownVersion {
            what: "GroupMetadataValue",
            version,
        });
    }
    let mut r = Reader::new(bytes, version >= 4);
    r.position = 2;
    let protocol_type = r.string()?;
    let generation = r.i32()?;
    let protocol = r.nullable_string()?;
    let leader = r.nullable_string()?;
    let current_state_timestamp_ms = if version >= 2 { r.i64()? } else { -1 };
    // The smallest member: six empty strings/bytes and two or three int32s.
    let count = r.array_count(if r.flexible { 14 } else { 24 })?;
    let mut members = Vec::with_capacity(count);
    for _ in 0..count {
        let member_id = r.string()?;
        let group_instance_id = if version >= 3 {
            r.nullable_string()?
        } else {
            None
        };
        let client_id = r.string()?;
        let client_host = r.string()?;
        let rebalance_timeout_ms = if version >= 1 { r.i32()? } else { -1 };
        let session_timeout_ms = r.i32()?;
        let subscription = r.bytes()?;
        let assignment = r.bytes()?;
        r.tagged_fields()?;
        members.push(StoredMember {
            member_id,
            group_instance_id,
            client_id,
            client_host,
            rebalance_timeout_ms: if rebalance_timeout_ms < 0 {
                session_timeout_ms
            } else {
                rebalance_timeout_ms
            },
            session_timeout_ms,
            subscription,
            assignment,
        });
    }
    r.tagged_fields()?;
    Ok(StoredGroup {
        protocol_type,
        generation,
        protocol,
        leader,
        current_state_timestamp_ms,
        members,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use bytes::Bytes;

    /// OffsetCommitKey v1 {group "g1", topic "orders", partition 3}, byte by
    /// byte from Kafka's schema (what `GroupMetadataManager.offsetCommitKey`
    /// writes).
    const OFFSET_KEY: &[u8] = &[
        0, 1, // key version 1
        0, 2, b'g', b'1', // group
        0, 6, b'o', b'r', b'd', b'e', b'r', b's', // topic
        0, 0, 0, 3, // partition
    ];

    /// OffsetCommitValue v3 {offset 42, leaderEpoch 5, metadata "m",
    /// commitTimestamp 1700000000000}.
    const OFFSET_VALUE_V3: &[u8] = &[
        0, 3, // value version 3
        0, 0, 0, 0, 0, 0, 0, 42, // offset
        0, 0, 0, 5, // leader epoch
        0, 1, b'm', // metadata
        0, 0, 0x01, 0x8b, 0xcf, 0xe5, 0x68, 0x00, // commit timestamp
    ];

    /// OffsetCommitValue v1 (Kafka 0.10-2.0) with an expire timestamp.
    const OFFSET_VALUE_V1: &[u8] = &[
        0, 1, 0, 0, 0, 0, 0, 0, 0, 7, // version, offset 7
        0, 0, // metadata ""
        0, 0, 0, 0, 0, 0, 0, 9, // commit timestamp 9
        0, 0, 0, 0, 0, 0, 0, 10, // expire timestamp 10
    ];

    /// OffsetCommitValue v4 (flexible) {offset 1, epoch -1, metadata "", ts 2},
    /// no tagged fields.
    const OFFSET_VALUE_V4: &[u8] = &[
        0, 4, 0, 0, 0, 0, 0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff, // version, offset, epoch
        1,    // compact metadata: length 0
        0, 0, 0, 0, 0, 0, 0, 2, // commit timestamp
        0, // tagged fields
    ];

    /// GroupMetadataKey v2 {group "g1"}.
    const GROUP_KEY: &[u8] = &[0, 2, 0, 2, b'g', b'1'];

    /// GroupMetadataValue v3: protocolType "consumer", generation 4, protocol
    /// "range", leader "m-1", currentStateTimestamp 1000, one member {"m-1",
    /// instance null, client "c", host "/127.0.0.1", rebalance 300000, session
    /// 45000, subscription [1, 2], assignment [3]}.
    const GROUP_VALUE_V3: &[u8] = &[
        0, 3, // version
        0, 8, b'c', b'o', b'n', b's', b'u', b'm', b'e', b'r', // protocol type
        0, 0, 0, 4, // generation
        0, 5, b'r', b'a', b'n', b'g', b'e', // protocol
        0, 3, b'm', b'-', b'1', // leader
        0, 0, 0, 0, 0, 0, 0x03, 0xe8, // current state timestamp
        0, 0, 0, 1, // one member
        0, 3, b'm', b'-', b'1', // member id
        0xff, 0xff, // group instance id: null
        0, 1, b'c', // client id
        0, 10, b'/', b'1', b'2', b'7', b'.', b'0', b'.', b'0', b'.', b'1', // client host
        0, 4, 0x93, 0xe0, // rebalance timeout 300000
        0, 0, 0xaf, 0xc8, // session timeout 45000
        0, 0, 0, 2, 1, 2, // subscription
        0, 0, 0, 1, 3, // assignment
    ];

    fn group_v3() -> StoredGroup {
        StoredGroup {
            protocol_type: "consumer".into(),
            generation: 4,
            protocol: Some("range".into()),
            leader: Some("m-1".into()),
            current_state_timestamp_ms: 1000,
            members: vec![StoredMember {
                member_id: "m-1".into(),
                group_instance_id: None,
                client_id: "c".into(),
                client_host: "/127.0.0.1".into(),
                rebalance_timeout_ms: 300_000,
                session_timeout_ms: 45_000,
                subscription: Bytes::from_static(&[1, 2]),
                assignment: Bytes::from_static(&[3]),
            }],
        }
    }

    #[test]
    fn keys_match_kafka_bytes() {
        let offset = RecordKey::Offset {
            group: "g1".into(),
            topic: "orders".into(),
            partition: 3,
        };
        assert_eq!(encode_key(&offset), OFFSET_KEY);
        assert_eq!(decode_key(OFFSET_KEY), Ok(offset));
        let group = RecordKey::Group { group: "g1".into() };
        assert_eq!(encode_key(&group), GROUP_KEY);
        assert_eq!(decode_key(GROUP_KEY), Ok(group));
        assert!(matches!(
            decode_key(&[0, 3, 0, 0]),
            Err(RecordError::UnknownVersion { version: 3, .. })
        ));
    }

    #[test]
    fn offset_values_match_kafka_bytes() {
        let value = OffsetValue {
            offset: 42,
            leader_epoch: 5,
            metadata: "m".into(),
            commit_timestamp_ms: 1_700_000_000_000,
        };
        assert_eq!(encode_offset_value(&value), OFFSET_VALUE_V3);
        assert_eq!(decode_offset_value(OFFSET_VALUE_V3), Ok(value));
        let v1 = decode_offset_value(OFFSET_VALUE_V1).unwrap();
        assert_eq!(
            (v1.offset, v1.leader_epoch, v1.commit_timestamp_ms),
            (7, -1, 9)
        );
        let v4 = decode_offset_value(OFFSET_VALUE_V4).unwrap();
        assert_eq!(
            (v4.offset, v4.metadata.as_str(), v4.commit_timestamp_ms),
            (1, "", 2)
        );
    }

    #[test]
    fn group_values_match_kafka_bytes() {
        assert_eq!(encode_group_value(&group_v3()), GROUP_VALUE_V3);
        assert_eq!(decode_group_value(GROUP_VALUE_V3), Ok(group_v3()));
        // An empty group (all members left): no protocol, no leader.
        let empty = StoredGroup {
            protocol_type: "consumer".into(),
            generation: 5,
            protocol: None,
            leader: None,
            current_state_timestamp_ms: 7,
            members: vec![],
        };
        assert_eq!(decode_group_value(&encode_group_value(&empty)), Ok(empty));
    }

    #[test]
    fn truncated_and_hostile_records_are_errors() {
        for len in 0..GROUP_VALUE_V3.len() {
            assert!(decode_group_value(&GROUP_VALUE_V3[..len]).is_err(), "{len}");
        }
        for len in 0..OFFSET_VALUE_V3.len() {
            assert!(
                decode_offset_value(&OFFSET_VALUE_V3[..len]).is_err(),
                "{len}"
            );
        }
        // A member count of 2^31-1 is refused before allocating.
        let mut hostile = GROUP_VALUE_V3[..36].to_vec();
        hostile.extend_from_slice(&[0x7f, 0xff, 0xff, 0xff]);
        assert!(matches!(
            decode_group_value(&hostile),
            Err(RecordError::BadLength { .. })
        ));
    }
}
