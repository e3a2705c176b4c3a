//! The array-count guard: a schema walk over a request body before kafka-protocol
//! decodes it.
//!
//! Why it exists: kafka-protocol 0.18's array decoders call
//! `Vec::with_capacity(count)` with the count read off the wire, before decoding a
//! single element. An 8-byte Metadata request announcing 50 million topics asks
//! for gigabytes up front, and a failed allocation aborts the process: no error,
//! no unwinding (upstream PRs #152/#161/#200, open at 0.18.0). skiff must answer
//! malformed input with an error, never a crash, so every served request whose
//! schema holds an array is walked here first: each array count must fit the bytes
//! left (count x the element's smallest encoding), and every length must stay
//! inside the body. The walk allocates nothing and reads each byte once.
//!
//! The schemas mirror kafka-protocol's generated decoders (`messages/*_request.rs`),
//! field by field and version by version: that is the layout the decoder will
//! follow, so it is the one to check. Known tagged fields are skipped by their
//! size: none of them holds an array in the served version ranges. The tests walk
//! requests encoded by kafka-protocol at every accepted version and require the
//! walk to end exactly at the end of the body.
//!
//! Adding a served API whose request holds an array means adding its schema here
//! and naming it in `versions::SERVED_APIS`.

use std::fmt;

/// One field's wire type.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Ty {
    /// Fixed-size scalars: int8..int64, boolean, uuid.
    Fixed(usize),
    /// `String` (i16 length) or `CompactString` (uvarint length + 1); nullable or not.
    Str,
    /// `Bytes` (i32 length) or `CompactBytes`; nullable or not.
    Bytes,
    /// `Array` / `CompactArray` of structs.
    Array(&'static Struct),
    /// `Array` / `CompactArray` of fixed-size scalars.
    FixedArray(usize),
    /// `Array` / `CompactArray` of strings.
    StrArray,
}

/// A field present from `since` to `until` (inclusive).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Field {
    ty: Ty,
    since: i16,
    until: i16,
}

/// The fields of one struct, in wire order.
#[derive(Debug)]
pub(crate) struct Struct {
    fields: &'static [Field],
}

/// A request body: its top-level struct and the first flexible version (compact
/// lengths, tagged fields at the end of every struct).
#[derive(Debug)]
pub(crate) struct Schema {
    body: Struct,
    flexible_since: i16,
}

const ALL: i16 = i16::MAX;

const fn f(ty: Ty) -> Field {
    Field {
        ty,
        since: 0,
        until: ALL,
    }
}

const fn since(version: i16, ty: Ty) -> Field {
    Field {
        ty,
        since: version,
        until: ALL,
    }
}

const fn until(version: i16, ty: Ty) -> Field {
    Field {
        ty,
        since: 0,
        until: version,
    }
}

const fn between(first: i16, last: i16, ty: Ty) -> Field {
    Field {
        ty,
        since: first,
        until: last,
    }
}

use Ty::{Array, Bytes, Fixed, FixedArray, Str, StrArray};

const I8: Ty = Fixed(1);
const I16: Ty = Fixed(2);
const I32: Ty = Fixed(4);
const I64: Ty = Fixed(8);
const BOOL: Ty = Fixed(1);
const UUID: Ty = Fixed(16);

// Produce (produce_request.rs): PartitionProduceData, TopicProduceData.
static PRODUCE_PARTITION: Struct = Struct {
    fields: &[f(I32), f(Bytes)],
};
static PRODUCE_TOPIC: Struct = Struct {
    fields: &[
        until(12, Str),
        since(13, UUID),
        f(Array(&PRODUCE_PARTITION)),
    ],
};
pub(crate) static PRODUCE: Schema = Schema {
    body: Struct {
        fields: &[f(Str), f(I16), f(I32), f(Array(&PRODUCE_TOPIC))],
    },
    flexible_since: 9,
};

// Fetch (fetch_request.rs): FetchPartition, FetchTopic, ForgottenTopic.
static FETCH_PARTITION: Struct = Struct {
    fields: &[
        f(I32),
        since(9, I32),
        f(I64),
        since(12, I32),
        since(5, I64),
        f(I32),
    ],
};
static FETCH_TOPIC: Struct = Struct {
    fields: &[until(12, Str), since(13, UUID), f(Array(&FETCH_PARTITION))],
};
static FETCH_FORGOTTEN_TOPIC: Struct = Struct {
    fields: &[
        between(7, 12, Str),
        since(13, UUID),
        since(7, FixedArray(4)),
    ],
};
pub(crate) static FETCH: Schema = Schema {
    body: Struct {
        fields: &[
            until(14, I32),
            f(I32),
            f(I32),
            f(I32),
            f(I8),
            since(7, I32),
            since(7, I32),
            f(Array(&FETCH_TOPIC)),
            since(7, Array(&FETCH_FORGOTTEN_TOPIC)),
            since(11, Str),
        ],
    },
    flexible_since: 12,
};

// ListOffsets (list_offsets_request.rs), decoded from v1.
static LIST_OFFSETS_PARTITION: Struct = Struct {
    fields: &[f(I32), since(4, I32), f(I64)],
};
static LIST_OFFSETS_TOPIC: Struct = Struct {
    fields: &[f(Str), f(Array(&LIST_OFFSETS_PARTITION))],
};
pub(crate) static LIST_OFFSETS: Schema = Schema {
    body: Struct {
        fields: &[
            f(I32),
            since(2, I8),
            f(Array(&LIST_OFFSETS_TOPIC)),
            since(10, I32),
        ],
    },
    flexible_since: 6,
};

// Metadata (metadata_request.rs).
static METADATA_TOPIC: Struct = Struct {
    fields: &[since(10, UUID), f(Str)],
};
pub(crate) static METADATA: Schema = Schema {
    body: Struct {
        fields: &[
            f(Array(&METADATA_TOPIC)),
            since(4, BOOL),
            between(8, 10, BOOL),
            since(8, BOOL),
        ],
    },
    flexible_since: 9,
};

// CreateTopics (create_topics_request.rs), decoded from v2.
static CREATE_TOPICS_ASSIGNMENT: Struct = Struct {
    fields: &[f(I32), f(FixedArray(4))],
};
static CREATE_TOPICS_CONFIG: Struct = Struct {
    fields: &[f(Str), f(Str)],
};
static CREATE_TOPICS_TOPIC: Struct = Struct {
    fields: &[
        f(Str),
        f(I32),
        f(I16),
        f(Array(&CREATE_TOPICS_ASSIGNMENT)),
        f(Array(&CREATE_TOPICS_CONFIG)),
    ],
};
pub(crate) static CREATE_TOPICS: Schema = Schema {
    body: Struct {
        fields: &[f(Array(&CREATE_TOPICS_TOPIC)), f(I32), f(BOOL)],
    },
    flexible_since: 5,
};

// DeleteTopics (delete_topics_request.rs), decoded from v1.
static DELETE_TOPICS_STATE: Struct = Struct {
    fields: &[since(6, Str), since(6, UUID)],
};
pub(crate) static DELETE_TOPICS: Schema = Schema {
    body: Struct {
        fields: &[
            since(6, Array(&DELETE_TOPICS_STATE)),
            until(5, StrArray),
            f(I32),
        ],
    },
    flexible_since: 4,
};

// DescribeConfigs (describe_configs_request.rs), decoded from v1.
static DESCRIBE_CONFIGS_RESOURCE: Struct = Struct {
    fields: &[f(I8), f(Str), f(StrArray)],
};
pub(crate) static DESCRIBE_CONFIGS: Schema = Schema {
    body: Struct {
        fields: &[
            f(Array(&DESCRIBE_CONFIGS_RESOURCE)),
            f(BOOL),
            since(3, BOOL),
        ],
    },
    flexible_since: 4,
};

// CreatePartitions (create_partitions_request.rs): topics of (name, count,
// nullable assignments of broker id arrays), timeout, validate only.
static CREATE_PARTITIONS_ASSIGNMENT: Struct = Struct {
    fields: &[f(FixedArray(4))],
};
static CREATE_PARTITIONS_TOPIC: Struct = Struct {
    fields: &[f(Str), f(I32), f(Array(&CREATE_PARTITIONS_ASSIGNMENT))],
};
pub(crate) static CREATE_PARTITIONS: Schema = Schema {
    body: Struct {
        fields: &[f(Array(&CREATE_PARTITIONS_TOPIC)), f(I32), f(BOOL)],
    },
    flexible_since: 2,
};

// DescribeQuorum (describe_quorum_request.rs): topics of (name, partition
// indexes as structs).
static DESCRIBE_QUORUM_PARTITION: Struct = Struct { fields: &[f(I32)] };
static DESCRIBE_QUORUM_TOPIC: Struct = Struct {
    fields: &[f(Str), f(Array(&DESCRIBE_QUORUM_PARTITION))],
};
pub(crate) static DESCRIBE_QUORUM: Schema = Schema {
    body: Struct {
        fields: &[f(Array(&DESCRIBE_QUORUM_TOPIC))],
    },
    flexible_since: 0,
};

// ElectLeaders (elect_leaders_request.rs): an election type (v1+), nullable
// topics of (name, partition ids), a timeout.
static ELECT_LEADERS_TOPIC: Struct = Struct {
    fields: &[f(Str), f(FixedArray(4))],
};
pub(crate) static ELECT_LEADERS: Schema = Schema {
    body: Struct {
        fields: &[since(1, I8), f(Array(&ELECT_LEADERS_TOPIC)), f(I32)],
    },
    flexible_since: 2,
};

// AlterConfigs (alter_configs_request.rs): resources of (type, name, configs
// of (name, nullable value)), validate only.
static LEGACY_ALTERABLE_CONFIG: Struct = Struct {
    fields: &[f(Str), f(Str)],
};
static LEGACY_ALTER_CONFIGS_RESOURCE: Struct = Struct {
    fields: &[f(I8), f(Str), f(Array(&LEGACY_ALTERABLE_CONFIG))],
};
pub(crate) static ALTER_CONFIGS: Schema = Schema {
    body: Struct {
        fields: &[f(Array(&LEGACY_ALTER_CONFIGS_RESOURCE)), f(BOOL)],
    },
    flexible_since: 2,
};

// OffsetDelete (offset_delete_request.rs): a group id, topics of (name,
// partitions as structs of an index).
static OFFSET_DELETE_PARTITION: Struct = Struct { fields: &[f(I32)] };
static OFFSET_DELETE_TOPIC: Struct = Struct {
    fields: &[f(Str), f(Array(&OFFSET_DELETE_PARTITION))],
};
pub(crate) static OFFSET_DELETE: Schema = Schema {
    body: Struct {
        fields: &[f(Str), f(Array(&OFFSET_DELETE_TOPIC))],
    },
    flexible_since: i16::MAX,
};

// DescribeLogDirs (describe_log_dirs_request.rs): nullable topics of (name,
// partition ids).
static DESCRIBE_LOG_DIRS_TOPIC: Struct = Struct {
    fields: &[f(Str), f(FixedArray(4))],
};
pub(crate) static DESCRIBE_LOG_DIRS: Schema = Schema {
    body: Struct {
        fields: &[f(Array(&DESCRIBE_LOG_DIRS_TOPIC))],
    },
    flexible_since: 2,
};

// DescribeProducers (describe_producers_request.rs): topics of (name,
// partition indexes); flexible from v0.
static DESCRIBE_PRODUCERS_TOPIC: Struct = Struct {
    fields: &[f(Str), f(FixedArray(4))],
};
pub(crate) static DESCRIBE_PRODUCERS: Schema = Schema {
    body: Struct {
        fields: &[f(Array(&DESCRIBE_PRODUCERS_TOPIC))],
    },
    flexible_since: 0,
};

// AddPartitionsToTxn (add_partitions_to_txn_request.rs): v4+ a batch of
// transactions (id, producer id, epoch, verify_only, topics); v0-3 the id,
// producer id and epoch, topics of (name, partition indexes); flexible from
// v3.
static ADD_PARTITIONS_TO_TXN_TOPIC: Struct = Struct {
    fields: &[f(Str), f(FixedArray(4))],
};
static ADD_PARTITIONS_TO_TXN_TRANSACTION: Struct = Struct {
    fields: &[
        f(Str),
        f(I64),
        f(I16),
        f(BOOL),
        f(Array(&ADD_PARTITIONS_TO_TXN_TOPIC)),
    ],
};
pub(crate) static ADD_PARTITIONS_TO_TXN: Schema = Schema {
    body: Struct {
        fields: &[
            since(4, Array(&ADD_PARTITIONS_TO_TXN_TRANSACTION)),
            until(3, Str),
            until(3, I64),
            until(3, I16),
            until(3, Array(&ADD_PARTITIONS_TO_TXN_TOPIC)),
        ],
    },
    flexible_since: 3,
};

// TxnOffsetCommit (txn_offset_commit_request.rs): the transactional id,
// group id, producer id and epoch, generation, member id and instance id
// (v3+), topics of (name, partitions of (index, offset, leader epoch (v2+),
// nullable metadata)); flexible from v3.
static TXN_OFFSET_COMMIT_PARTITION: Struct = Struct {
    fields: &[f(I32), f(I64), since(2, I32), f(Str)],
};
static TXN_OFFSET_COMMIT_TOPIC: Struct = Struct {
    fields: &[f(Str), f(Array(&TXN_OFFSET_COMMIT_PARTITION))],
};
pub(crate) static TXN_OFFSET_COMMIT: Schema = Schema {
    body: Struct {
        fields: &[
            f(Str),
            f(Str),
            f(I64),
            f(I16),
            since(3, I32),
            since(3, Str),
            since(3, Str),
            f(Array(&TXN_OFFSET_COMMIT_TOPIC)),
        ],
    },
    flexible_since: 3,
};

// ListTransactions (list_transactions_request.rs): state filters, producer
// id filters, a duration filter (v1+); flexible from v0.
pub(crate) static LIST_TRANSACTIONS: Schema = Schema {
    body: Struct {
        fields: &[f(StrArray), f(FixedArray(8)), since(1, I64)],
    },
    flexible_since: 0,
};

// DescribeTransactions (describe_transactions_request.rs): transactional
// ids; flexible from v0.
pub(crate) static DESCRIBE_TRANSACTIONS: Schema = Schema {
    body: Struct {
        fields: &[f(StrArray)],
    },
    flexible_since: 0,
};

// WriteTxnMarkers (write_txn_markers_request.rs), v1: markers of (producer
// id, epoch, result, topics of (name, partition indexes), coordinator
// epoch); flexible from v1.
static WRITE_TXN_MARKERS_TOPIC: Struct = Struct {
    fields: &[f(Str), f(FixedArray(4))],
};
static WRITE_TXN_MARKER: Struct = Struct {
    fields: &[
        f(I64),
        f(I16),
        f(BOOL),
        f(Array(&WRITE_TXN_MARKERS_TOPIC)),
        f(I32),
    ],
};
pub(crate) static WRITE_TXN_MARKERS: Schema = Schema {
    body: Struct {
        fields: &[f(Array(&WRITE_TXN_MARKER))],
    },
    flexible_since: 1,
};

// AlterPartitionReassignments (alter_partition_reassignments_request.rs): a
// timeout, allow_replication_factor_change (v1+), topics of (name, partitions
// of (index, nullable replica ids)); flexible from v0.
static REASSIGNABLE_PARTITION: Struct = Struct {
    fields: &[f(I32), f(FixedArray(4))],
};
static REASSIGNABLE_TOPIC: Struct = Struct {
    fields: &[f(Str), f(Array(&REASSIGNABLE_PARTITION))],
};
pub(crate) static ALTER_PARTITION_REASSIGNMENTS: Schema = Schema {
    body: Struct {
        fields: &[f(I32), since(1, BOOL), f(Array(&REASSIGNABLE_TOPIC))],
    },
    flexible_since: 0,
};

// ListPartitionReassignments (list_partition_reassignments_request.rs): a
// timeout, nullable topics of (name, partition indexes); flexible from v0.
static LIST_REASSIGNMENTS_TOPIC: Struct = Struct {
    fields: &[f(Str), f(FixedArray(4))],
};
pub(crate) static LIST_PARTITION_REASSIGNMENTS: Schema = Schema {
    body: Struct {
        fields: &[f(I32), f(Array(&LIST_REASSIGNMENTS_TOPIC))],
    },
    flexible_since: 0,
};

// CreateAcls and DeleteAcls (create_acls_request.rs, delete_acls_request.rs):
// creations, or filters, of (resource type, name, pattern type, principal,
// host, operation, permission); flexible from v2. DescribeAcls has no array.
static ACL_BINDING: Struct = Struct {
    fields: &[f(I8), f(Str), f(I8), f(Str), f(Str), f(I8), f(I8)],
};
pub(crate) static CREATE_ACLS: Schema = Schema {
    body: Struct {
        fields: &[f(Array(&ACL_BINDING))],
    },
    flexible_since: 2,
};
pub(crate) static DELETE_ACLS: Schema = Schema {
    body: Struct {
        fields: &[f(Array(&ACL_BINDING))],
    },
    flexible_since: 2,
};

// DescribeUserScramCredentials (describe_user_scram_credentials_request.rs):
// nullable users of (name); AlterUserScramCredentials: deletions of (name,
// mechanism), upsertions of (name, mechanism, iterations, salt, salted
// password). Both flexible from v0.
static SCRAM_USER: Struct = Struct { fields: &[f(Str)] };
pub(crate) static DESCRIBE_USER_SCRAM_CREDENTIALS: Schema = Schema {
    body: Struct {
        fields: &[f(Array(&SCRAM_USER))],
    },
    flexible_since: 0,
};
static SCRAM_DELETION: Struct = Struct {
    fields: &[f(Str), f(I8)],
};
static SCRAM_UPSERTION: Struct = Struct {
    fields: &[f(Str), f(I8), f(I32), f(Bytes), f(Bytes)],
};
pub(crate) static ALTER_USER_SCRAM_CREDENTIALS: Schema = Schema {
    body: Struct {
        fields: &[f(Array(&SCRAM_DELETION)), f(Array(&SCRAM_UPSERTION))],
    },
    flexible_since: 0,
};

// DescribeClientQuotas (describe_client_quotas_request.rs): components of
// (entity type, match type, match), strict; AlterClientQuotas
// (alter_client_quotas_request.rs): entries of (entity of (type, name), ops
// of (key, value f64, remove)), validate only. Both flexible from v1.
static QUOTA_COMPONENT: Struct = Struct {
    fields: &[f(Str), f(I8), f(Str)],
};
pub(crate) static DESCRIBE_CLIENT_QUOTAS: Schema = Schema {
    body: Struct {
        fields: &[f(Array(&QUOTA_COMPONENT)), f(BOOL)],
    },
    flexible_since: 1,
};
static QUOTA_ENTITY: Struct = Struct {
    fields: &[f(Str), f(Str)],
};
static QUOTA_OP: Struct = Struct {
    fields: &[f(Str), f(Fixed(8)), f(BOOL)],
};
static QUOTA_ENTRY: Struct = Struct {
    fields: &[f(Array(&QUOTA_ENTITY)), f(Array(&QUOTA_OP))],
};
pub(crate) static ALTER_CLIENT_QUOTAS: Schema = Schema {
    body: Struct {
        fields: &[f(Array(&QUOTA_ENTRY)), f(BOOL)],
    },
    flexible_since: 1,
};

// IncrementalAlterConfigs (incremental_alter_configs_request.rs).
static ALTERABLE_CONFIG: Struct = Struct {
    fields: &[f(Str), f(I8), f(Str)],
};
static ALTER_CONFIGS_RESOURCE: Struct = Struct {
    fields: &[f(I8), f(Str), f(Array(&ALTERABLE_CONFIG))],
};
pub(crate) static INCREMENTAL_ALTER_CONFIGS: Schema = Schema {
    body: Struct {
        fields: &[f(Array(&ALTER_CONFIGS_RESOURCE)), f(BOOL)],
    },
    flexible_since: 1,
};

// FindCoordinator (find_coordinator_request.rs): key until v3, key type from v1,
// coordinator keys from v4.
pub(crate) static FIND_COORDINATOR: Schema = Schema {
    body: Struct {
        fields: &[until(3, Str), since(1, I8), since(4, StrArray)],
    },
    flexible_since: 3,
};

// OffsetForLeaderEpoch (offset_for_leader_epoch_request.rs), decoded from v2:
// a replica id (v3+), then topics of (name, partitions of (index, current
// leader epoch, leader epoch)).
static OFFSET_FOR_LEADER_EPOCH_PARTITION: Struct = Struct {
    fields: &[f(I32), f(I32), f(I32)],
};
static OFFSET_FOR_LEADER_EPOCH_TOPIC: Struct = Struct {
    fields: &[f(Str), f(Array(&OFFSET_FOR_LEADER_EPOCH_PARTITION))],
};
pub(crate) static OFFSET_FOR_LEADER_EPOCH: Schema = Schema {
    body: Struct {
        fields: &[since(3, I32), f(Array(&OFFSET_FOR_LEADER_EPOCH_TOPIC))],
    },
    flexible_since: 4,
};

// DeleteRecords (delete_records_request.rs): topics of (name, partitions of
// (index, offset)), then a timeout.
static DELETE_RECORDS_PARTITION: Struct = Struct {
    fields: &[f(I32), f(I64)],
};
static DELETE_RECORDS_TOPIC: Struct = Struct {
    fields: &[f(Str), f(Array(&DELETE_RECORDS_PARTITION))],
};
pub(crate) static DELETE_RECORDS: Schema = Schema {
    body: Struct {
        fields: &[f(Array(&DELETE_RECORDS_TOPIC)), f(I32)],
    },
    flexible_since: 2,
};

// JoinGroup (join_group_request.rs): protocols of (name, metadata bytes).
static JOIN_GROUP_PROTOCOL: Struct = Struct {
    fields: &[f(Str), f(Bytes)],
};
pub(crate) static JOIN_GROUP: Schema = Schema {
    body: Struct {
        fields: &[
            f(Str),
            f(I32),
            since(1, I32),
            f(Str),
            since(5, Str),
            f(Str),
            f(Array(&JOIN_GROUP_PROTOCOL)),
            since(8, Str),
        ],
    },
    flexible_since: 6,
};

// SyncGroup (sync_group_request.rs): assignments of (member id, bytes).
static SYNC_GROUP_ASSIGNMENT: Struct = Struct {
    fields: &[f(Str), f(Bytes)],
};
pub(crate) static SYNC_GROUP: Schema = Schema {
    body: Struct {
        fields: &[
            f(Str),
            f(I32),
            f(Str),
            since(3, Str),
            since(5, Str),
            since(5, Str),
            f(Array(&SYNC_GROUP_ASSIGNMENT)),
        ],
    },
    flexible_since: 4,
};

// LeaveGroup (leave_group_request.rs): one member id until v2, members from v3.
static LEAVE_GROUP_MEMBER: Struct = Struct {
    fields: &[f(Str), f(Str), since(5, Str)],
};
pub(crate) static LEAVE_GROUP: Schema = Schema {
    body: Struct {
        fields: &[f(Str), until(2, Str), since(3, Array(&LEAVE_GROUP_MEMBER))],
    },
    flexible_since: 4,
};

// OffsetCommit (offset_commit_request.rs), decoded from v2.
static OFFSET_COMMIT_PARTITION: Struct = Struct {
    fields: &[f(I32), f(I64), since(6, I32), f(Str)],
};
static OFFSET_COMMIT_TOPIC: Struct = Struct {
    fields: &[f(Str), f(Array(&OFFSET_COMMIT_PARTITION))],
};
pub(crate) static OFFSET_COMMIT: Schema = Schema {
    body: Struct {
        fields: &[
            f(Str),
            f(I32),
            f(Str),
            since(7, Str),
            until(4, I64),
            f(Array(&OFFSET_COMMIT_TOPIC)),
        ],
    },
    flexible_since: 8,
};

// OffsetFetch (offset_fetch_request.rs), decoded from v1: one group with its
// topics until v7, groups of (id, [member id, epoch: v9], topics) from v8.
static OFFSET_FETCH_TOPIC: Struct = Struct {
    fields: &[f(Str), f(FixedArray(4))],
};
static OFFSET_FETCH_GROUP: Struct = Struct {
    fields: &[
        f(Str),
        since(9, Str),
        since(9, I32),
        f(Array(&OFFSET_FETCH_TOPIC)),
    ],
};
pub(crate) static OFFSET_FETCH: Schema = Schema {
    body: Struct {
        fields: &[
            until(7, Str),
            until(7, Array(&OFFSET_FETCH_TOPIC)),
            since(8, Array(&OFFSET_FETCH_GROUP)),
            since(7, BOOL),
        ],
    },
    flexible_since: 6,
};

// ListGroups (list_groups_request.rs): states filter from v4, types from v5.
pub(crate) static LIST_GROUPS: Schema = Schema {
    body: Struct {
        fields: &[since(4, StrArray), since(5, StrArray)],
    },
    flexible_since: 3,
};

// DescribeGroups (describe_groups_request.rs).
pub(crate) static DESCRIBE_GROUPS: Schema = Schema {
    body: Struct {
        fields: &[f(StrArray), since(3, BOOL)],
    },
    flexible_since: 5,
};

// DeleteGroups (delete_groups_request.rs).
pub(crate) static DELETE_GROUPS: Schema = Schema {
    body: Struct {
        fields: &[f(StrArray)],
    },
    flexible_since: 2,
};

/// Why a body failed the walk; `position` is the byte offset in the body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Violation {
    /// An array announces more elements than the rest of the body can hold.
    ArrayTooLong {
        position: usize,
        count: u64,
        remaining: usize,
    },
    /// A length or fixed field runs past the end of the body.
    Truncated { position: usize, needed: u64 },
    /// A length kafka-protocol would refuse anyway (negative, other than null).
    BadLength { position: usize, length: i64 },
}

impl fmt::Display for Violation {
    fn fmt(&self, out: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::ArrayTooLong {
                position,
                count,
                remaining,
            } => write!(
                out,
                "array at byte {position} announces {count} elements, {remaining} bytes left"
            ),
            Violation::Truncated { position, needed } => {
                write!(
                    out,
                    "{needed} bytes needed at byte {position}, past the end"
                )
            }
            Violation::BadLength { position, length } => {
                write!(out, "length {length} at byte {position}")
            }
        }
    }
}

/// Walks `body` (a request body at `version`) against `schema`. Returns the bytes
/// the walk consumed (kafka-protocol ignores trailing bytes, and so does this).
pub(crate) fn check(schema: &Schema, version: i16, body: &[u8]) -> Result<usize, Violation> {
    let mut walk = Walk {
        body,
        position: 0,
        version,
        flexible: version >= schema.flexible_since,
    };
    walk.walk_struct(&schema.body)?;
    Ok(walk.position)
}

struct Walk<'a> {
    body: &'a [u8],
    position: usize,
    version: i16,
    flexible: bool,
}

impl Walk<'_> {
    fn remaining(&self) -> usize {
        self.body.len() - self.position
    }

    fn present(&self, field: &Field) -> bool {
        field.since <= self.version && self.version <= field.until
    }

    fn walk_struct(&mut self, schema: &Struct) -> Result<(), Violation> {
        for field in schema.fields {
            if self.present(field) {
                self.walk_field(field.ty)?;
            }
        }
        if self.flexible {
            self.skip_tagged_fields()?;
        }
        Ok(())
    }

    fn walk_field(&mut self, ty: Ty) -> Result<(), Violation> {
        match ty {
            Fixed(size) => self.skip(size as u64),
            Str => self.skip_string(),
            Bytes => {
                let length = self.length_i32_or_compact()?;
                self.skip(length.unwrap_or(0))
            }
            Array(element) => {
                let minimum = self.struct_min_bytes(element);
                for _ in 0..self.array_count(minimum)? {
                    self.walk_struct(element)?;
                }
                Ok(())
            }
            FixedArray(size) => {
                let count = self.array_count(size)?;
                self.skip(count * size as u64)
            }
            StrArray => {
                let minimum = if self.flexible { 1 } else { 2 };
                for _ in 0..self.array_count(minimum)? {
                    self.skip_string()?;
                }
                Ok(())
            }
        }
    }

    /// The smallest encoding of one element: what bounds a believable count.
    fn struct_min_bytes(&self, schema: &Struct) -> usize {
        let length_bytes = |plain: usize| if self.flexible { 1 } else { plain };
        let fields: usize = schema
            .fields
            .iter()
            .filter(|field| self.present(field))
            .map(|field| match field.ty {
                Fixed(size) => size,
                Str => length_bytes(2),
                Bytes | Array(_) | FixedArray(_) | StrArray => length_bytes(4),
            })
            .sum();
        let tagged = usize::from(self.flexible);
        (fields + tagged).max(1)
    }

    /// An array's element count (0 for null), refused when `count` elements of at
    /// least `element_min_bytes` each cannot fit the rest of the body.
    fn array_count(&mut self, element_min_bytes: usize) -> Result<u64, Violation> {
        let position = self.position;
        let count = self.length_i32_or_compact()?.unwrap_or(0);
        let remaining = self.remaining();
        let fits = count
            .checked_mul(element_min_bytes as u64)
            .is_some_and(|bytes| bytes <= remaining as u64);
        if !fits {
            return Err(Violation::ArrayTooLong {
                position,
                count,
                remaining,
            });
        }
        Ok(count)
    }

    fn skip_string(&mut self) -> Result<(), Violation> {
        let length = if self.flexible {
            self.compact_length()?
        } else {
            let position = self.position;
            match i16::from_be_bytes(self.read_fixed::<2>()?) {
                -1 => None,
                length if length >= 0 => Some(length as u64),
                length => {
                    return Err(Violation::BadLength {
                        position,
                        length: i64::from(length),
                    })
                }
            }
        };
        self.skip(length.unwrap_or(0))
    }

    /// An i32 length (non-flexible) or a compact one; `None` is null (-1 / 0).
    fn length_i32_or_compact(&mut self) -> Result<Option<u64>, Violation> {
        if self.flexible {
            return self.compact_length();
        }
        let position = self.position;
        match i32::from_be_bytes(self.read_fixed::<4>()?) {
            -1 => Ok(None),
            length if length >= 0 => Ok(Some(length as u64)),
            length => Err(Violation::BadLength {
                position,
                length: i64::from(length),
            }),
        }
    }

    /// A compact length: uvarint `n`, where 0 is null and `n - 1` the length.
    fn compact_length(&mut self) -> Result<Option<u64>, Violation> {
        let raw = self.unsigned_varint()?;
        Ok(raw.checked_sub(1).map(u64::from))
    }

    /// Tagged fields: a count, then (tag, size, size bytes) each.
    fn skip_tagged_fields(&mut self) -> Result<(), Violation> {
        let count = self.unsigned_varint()?;
        for _ in 0..count {
            let _tag = self.unsigned_varint()?;
            let size = self.unsigned_varint()?;
            self.skip(u64::from(size))?;
        }
        Ok(())
    }

    /// Exactly kafka-protocol's `UnsignedVarInt` decoder: at most five bytes, bits
    /// past 32 dropped.
    fn unsigned_varint(&mut self) -> Result<u32, Violation> {
        let mut value: u32 = 0;
        for shift in (0..5).map(|i| i * 7) {
            let [byte] = self.read_fixed::<1>()?;
            value |= u32::from(byte & 0x7f).wrapping_shl(shift);
            if byte < 0x80 {
                break;
            }
        }
        Ok(value)
    }

    fn read_fixed<const N: usize>(&mut self) -> Result<[u8; N], Violation> {
        let position = self.position;
        let bytes = self
            .body
            .get(position..position + N)
            .ok_or(Violation::Truncated {
                position,
                needed: N as u64,
            })?;
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        self.position += N;
        Ok(out)
    }

    fn skip(&mut self, bytes: u64) -> Result<(), Violation> {
        if bytes > self.remaining() as u64 {
            return Err(Violation::Truncated {
                position: self.position,
                needed: bytes,
            });
        }
        self.position += bytes as usize;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::samples::sample_request;
    use crate::versions::SERVED_APIS;
    use bytes::BytesMut;

    /// The schemas must follow kafka-protocol's layout exactly: on every sample at
    /// every accepted version the walk ends on the body's last byte.
    #[test]
    fn walk_ends_exactly_at_the_end_of_every_sample() {
        for api in SERVED_APIS {
            let Some(schema) = api.guard else { continue };
            let accepted = api.accepted();
            for version in accepted.min..=accepted.max {
                let request = sample_request(api.api_key, version);
                let Some(request) = request else {
                    panic!("no sample for {:?}", api.api_key)
                };
                let mut body = BytesMut::new();
                if let Err(error) = request.encode(&mut body, version) {
                    panic!("{:?} v{version}: {error:#}", api.api_key);
                }
                assert_eq!(
                    check(schema, version, &body),
                    Ok(body.len()),
                    "{:?} v{version}",
                    api.api_key
                );
            }
        }
    }

    #[test]
    fn huge_metadata_topic_count_is_refused() {
        // The upstream reproducer's body: Metadata v0 announcing 0x033c0c00 topics.
        let body = [0x03, 0x3c, 0x0c, 0x00, 0xb6];
        assert!(matches!(
            check(&METADATA, 0, &body),
            Err(Violation::ArrayTooLong {
                count: 0x033c_0c00,
                ..
            })
        ));
    }

    #[test]
    fn compact_count_near_u32_max_is_refused() {
        // Metadata v9: compact topics array of u32::MAX - 1 elements.
        let body = [0xff, 0xff, 0xff, 0xff, 0x0f, 0x00];
        assert!(matches!(
            check(&METADATA, 9, &body),
            Err(Violation::ArrayTooLong { .. })
        ));
    }

    #[test]
    fn count_is_bounded_by_element_size_not_just_bytes() {
        // Fetch v4 partitions are 16 bytes each: 2 announced, 31 bytes present.
        let mut body = Vec::new();
        body.extend_from_slice(&[0u8; 17]); // replica, wait, min, max, isolation
        body.extend_from_slice(&1i32.to_be_bytes()); // one topic
        body.extend_from_slice(&0i16.to_be_bytes()); // empty name
        body.extend_from_slice(&2i32.to_be_bytes()); // two partitions
        body.extend_from_slice(&[0u8; 31]);
        assert!(matches!(
            check(&FETCH, 4, &body),
            Err(Violation::ArrayTooLong { count: 2, .. })
        ));
        body.push(0);
        assert_eq!(check(&FETCH, 4, &body), Ok(body.len()));
    }
}
