//! The APIs skiff serves and at which versions: one table, [`SERVED_APIS`].
//!
//! Ranges follow Kafka 4.x where skiff implements the whole version; where a newer
//! version needs something skiff lacks (topic ids on fetch, for one) the range stops
//! below it. A version can be *advertised* in ApiVersions without being *accepted*:
//! Kafka 4.0 lists Produce v0-2 and answers them with UNSUPPORTED_VERSION, because
//! librdkafka (2.0, Debian's) only enables compression when the broker lists
//! Produce v0 (KAFKA-18659). [`accepts`] is the check the node makes before it
//! decodes a body.

use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::{ApiKey, ApiVersionsResponse};
use kafka_protocol::protocol::VersionRange;
use kafka_protocol::ResponseError;

use crate::guard::{self, Schema};

/// One served API.
#[derive(Debug, Clone, Copy)]
pub struct ServedApi {
    /// The API.
    pub api_key: ApiKey,
    /// The range listed in ApiVersions.
    pub advertised: VersionRange,
    /// The lowest version answered; advertised versions below it get
    /// UNSUPPORTED_VERSION.
    pub accepted_min: i16,
    /// The array-count check run before kafka-protocol decodes the body (see
    /// `guard.rs`); `None` only for requests without arrays.
    pub(crate) guard: Option<&'static Schema>,
}

impl ServedApi {
    const fn new(api_key: ApiKey, min: i16, max: i16) -> Self {
        Self {
            api_key,
            advertised: VersionRange { min, max },
            accepted_min: min,
            guard: None,
        }
    }

    /// Advertised from `advertised.min` but answered only from `version`.
    const fn refusing_below(mut self, version: i16) -> Self {
        self.accepted_min = version;
        self
    }

    const fn guarded(mut self, schema: &'static Schema) -> Self {
        self.guard = Some(schema);
        self
    }

    /// The range actually answered.
    pub fn accepted(&self) -> VersionRange {
        VersionRange {
            min: self.accepted_min,
            max: self.advertised.max,
        }
    }

    /// Whether `version` is answered (not only advertised).
    pub fn accepts(&self, version: i16) -> bool {
        self.accepted_min <= version && version <= self.advertised.max
    }
}

/// Every API skiff serves. A request whose schema holds an array MUST name its
/// guard schema (`guard.rs`): kafka-protocol pre-allocates array counts read off
/// the wire.
pub const SERVED_APIS: &[ServedApi] = &[
    ServedApi::new(ApiKey::ApiVersions, 0, 4),
    ServedApi::new(ApiKey::Metadata, 0, 12).guarded(&guard::METADATA),
    // v0-2 listed for librdkafka's compression check, refused like Kafka 4.0.
    ServedApi::new(ApiKey::Produce, 0, 12)
        .refusing_below(3)
        .guarded(&guard::PRODUCE),
    // v13+ address topics by id.
    ServedApi::new(ApiKey::Fetch, 4, 12).guarded(&guard::FETCH),
    ServedApi::new(ApiKey::ListOffsets, 1, 8).guarded(&guard::LIST_OFFSETS),
    ServedApi::new(ApiKey::CreateTopics, 2, 7).guarded(&guard::CREATE_TOPICS),
    ServedApi::new(ApiKey::DeleteTopics, 1, 6).guarded(&guard::DELETE_TOPICS),
    ServedApi::new(ApiKey::CreatePartitions, 0, 3).guarded(&guard::CREATE_PARTITIONS),
    ServedApi::new(ApiKey::ElectLeaders, 0, 2).guarded(&guard::ELECT_LEADERS),
    // KIP-455 reassignments; v1 (KIP-860) can refuse a replication factor change.
    ServedApi::new(ApiKey::AlterPartitionReassignments, 0, 1)
        .guarded(&guard::ALTER_PARTITION_REASSIGNMENTS),
    ServedApi::new(ApiKey::ListPartitionReassignments, 0, 0)
        .guarded(&guard::LIST_PARTITION_REASSIGNMENTS),
    // KIP-631: a stopped node that holds no replica leaves the cluster.
    ServedApi::new(ApiKey::UnregisterBroker, 0, 0),
    ServedApi::new(ApiKey::DescribeConfigs, 1, 4).guarded(&guard::DESCRIBE_CONFIGS),
    // The legacy whole-set form (kafka-python's alter_configs).
    ServedApi::new(ApiKey::AlterConfigs, 0, 2).guarded(&guard::ALTER_CONFIGS),
    ServedApi::new(ApiKey::IncrementalAlterConfigs, 0, 1)
        .guarded(&guard::INCREMENTAL_ALTER_CONFIGS),
    ServedApi::new(ApiKey::InitProducerId, 0, 5),
    // Transactions (issue 18). The versions that say a client speaks
    // KIP-890 part 2 (AddPartitionsToTxn v5, AddOffsetsToTxn v4, EndTxn v5,
    // TxnOffsetCommit v5) are not listed; v4 of AddPartitionsToTxn is the
    // brokers' batched form (KIP-890 part 1's verify_only).
    ServedApi::new(ApiKey::AddPartitionsToTxn, 0, 4).guarded(&guard::ADD_PARTITIONS_TO_TXN),
    ServedApi::new(ApiKey::AddOffsetsToTxn, 0, 3),
    ServedApi::new(ApiKey::EndTxn, 0, 4),
    // To the group coordinator: offsets that count once the transaction
    // commits.
    ServedApi::new(ApiKey::TxnOffsetCommit, 0, 4).guarded(&guard::TXN_OFFSET_COMMIT),
    // Inspection (KIP-664): ListTransactions v1 adds the duration filter
    // (v2's id pattern is not served).
    ServedApi::new(ApiKey::ListTransactions, 0, 1).guarded(&guard::LIST_TRANSACTIONS),
    ServedApi::new(ApiKey::DescribeTransactions, 0, 0).guarded(&guard::DESCRIBE_TRANSACTIONS),
    // Between brokers: a transaction coordinator to a partition leader.
    ServedApi::new(ApiKey::WriteTxnMarkers, 1, 1).guarded(&guard::WRITE_TXN_MARKERS),
    ServedApi::new(ApiKey::DeleteRecords, 0, 2).guarded(&guard::DELETE_RECORDS),
    // KIP-320: clients check their position after a leader change (v2 is
    // the first with a current leader epoch; kafka-protocol decodes from it).
    ServedApi::new(ApiKey::OffsetForLeaderEpoch, 2, 4).guarded(&guard::OFFSET_FOR_LEADER_EPOCH),
    // Groups: this node; transactions: COORDINATOR_NOT_AVAILABLE. Listed from v0
    // also because librdkafka only enables lz4 when it sees FindCoordinator v0.
    ServedApi::new(ApiKey::FindCoordinator, 0, 4).guarded(&guard::FIND_COORDINATOR),
    // The classic group protocol, every version kafka-protocol decodes; the
    // flexible versions add nothing skiff cannot honour (reasons are logged
    // nowhere, skip_assignment is always false: assignors run in clients).
    ServedApi::new(ApiKey::JoinGroup, 0, 9).guarded(&guard::JOIN_GROUP),
    ServedApi::new(ApiKey::SyncGroup, 0, 5).guarded(&guard::SYNC_GROUP),
    ServedApi::new(ApiKey::Heartbeat, 0, 4),
    ServedApi::new(ApiKey::LeaveGroup, 0, 5).guarded(&guard::LEAVE_GROUP),
    // v9 is the same request for classic groups (generation id); v10 addresses
    // topics by id.
    ServedApi::new(ApiKey::OffsetCommit, 2, 9).guarded(&guard::OFFSET_COMMIT),
    // v8 batches groups; v9 adds KIP-848 member epochs (new consumer protocol).
    ServedApi::new(ApiKey::OffsetFetch, 1, 8).guarded(&guard::OFFSET_FETCH),
    ServedApi::new(ApiKey::ListGroups, 0, 5).guarded(&guard::LIST_GROUPS),
    // v6 answers unknown groups with GROUP_ID_NOT_FOUND; up to v5 they are Dead.
    ServedApi::new(ApiKey::DescribeGroups, 0, 5).guarded(&guard::DESCRIBE_GROUPS),
    ServedApi::new(ApiKey::DeleteGroups, 0, 2).guarded(&guard::DELETE_GROUPS),
    ServedApi::new(ApiKey::OffsetDelete, 0, 0).guarded(&guard::OFFSET_DELETE),
    // Inspection over the Kafka port (KIP-700, KIP-595): brokers from the
    // node's metadata, the controller quorum from the active controller.
    ServedApi::new(ApiKey::DescribeCluster, 0, 2),
    ServedApi::new(ApiKey::DescribeProducers, 0, 0).guarded(&guard::DESCRIBE_PRODUCERS),
    // One log directory per node (v0 is not answered by Kafka 4 either).
    ServedApi::new(ApiKey::DescribeLogDirs, 1, 4).guarded(&guard::DESCRIBE_LOG_DIRS),
    ServedApi::new(ApiKey::DescribeQuorum, 0, 2).guarded(&guard::DESCRIBE_QUORUM),
    // SASL on SASL_PLAINTEXT listeners (v0's raw tokens are not spoken:
    // advertised as Kafka does, answered from v1).
    ServedApi::new(ApiKey::SaslHandshake, 0, 1).refusing_below(1),
    ServedApi::new(ApiKey::SaslAuthenticate, 0, 2),
    // Security (issue 17): ACLs and SCRAM credentials, kept by the controller.
    // ACL v0 has no pattern type; Kafka 4 dropped it too.
    ServedApi::new(ApiKey::CreateAcls, 1, 3).guarded(&guard::CREATE_ACLS),
    ServedApi::new(ApiKey::DescribeAcls, 1, 3),
    ServedApi::new(ApiKey::DeleteAcls, 1, 3).guarded(&guard::DELETE_ACLS),
    ServedApi::new(ApiKey::DescribeUserScramCredentials, 0, 0)
        .guarded(&guard::DESCRIBE_USER_SCRAM_CREDENTIALS),
    ServedApi::new(ApiKey::AlterUserScramCredentials, 0, 0)
        .guarded(&guard::ALTER_USER_SCRAM_CREDENTIALS),
    // Client quotas (KIP-546), kept by the controller like ACLs.
    ServedApi::new(ApiKey::DescribeClientQuotas, 0, 1).guarded(&guard::DESCRIBE_CLIENT_QUOTAS),
    ServedApi::new(ApiKey::AlterClientQuotas, 0, 1).guarded(&guard::ALTER_CLIENT_QUOTAS),
];

/// The table entry for `api_key`, if skiff serves it.
pub fn served(api_key: ApiKey) -> Option<&'static ServedApi> {
    SERVED_APIS.iter().find(|api| api.api_key == api_key)
}

/// The range listed in ApiVersions for `api_key`.
pub fn advertised(api_key: ApiKey) -> Option<VersionRange> {
    served(api_key).map(|api| api.advertised)
}

/// Whether skiff answers `api_key` at `version`. Anything else gets
/// UNSUPPORTED_VERSION without its body being decoded.
pub fn accepts(api_key: ApiKey, version: i16) -> bool {
    served(api_key).is_some_and(|api| api.accepts(version))
}

/// The ApiVersions answer: every served API with its advertised range, and
/// `error` (UNSUPPORTED_VERSION when the client asked with a version above 4;
/// Kafka then answers in v0 so that any client can read it).
pub fn api_versions_response(error: Option<ResponseError>) -> ApiVersionsResponse {
    let api_keys = SERVED_APIS
        .iter()
        .map(|api| {
            ApiVersion::default()
                .with_api_key(api.api_key as i16)
                .with_min_version(api.advertised.min)
                .with_max_version(api.advertised.max)
        })
        .collect();
    ApiVersionsResponse::default()
        .with_error_code(error.map_or(0, |error| error.code()))
        .with_api_keys(api_keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepted_ranges_are_decodable_by_kafka_protocol() {
        for api in SERVED_APIS {
            let decodable = api.api_key.valid_versions();
            let accepted = api.accepted();
            assert!(
                decodable.min <= accepted.min && accepted.max <= decodable.max,
                "{:?}: accepted {accepted} not within kafka-protocol's {decodable}",
                api.api_key
            );
            assert!(api.advertised.min <= accepted.min);
        }
    }

    #[test]
    fn one_entry_per_api() {
        for (i, api) in SERVED_APIS.iter().enumerate() {
            assert!(SERVED_APIS[..i].iter().all(|o| o.api_key != api.api_key));
        }
    }

    #[test]
    fn produce_v0_is_advertised_but_refused() {
        assert_eq!(advertised(ApiKey::Produce).map(|r| r.min), Some(0));
        assert!(!accepts(ApiKey::Produce, 0));
        assert!(!accepts(ApiKey::Produce, 2));
        assert!(accepts(ApiKey::Produce, 3));
        assert!(accepts(ApiKey::Produce, 12));
        assert!(!accepts(ApiKey::Produce, 13));
        assert!(!accepts(ApiKey::Fetch, 3));
        assert!(!accepts(ApiKey::OffsetCommit, 10));
        assert!(!accepts(ApiKey::OffsetFetch, 9));
    }

    #[test]
    fn api_versions_lists_the_table() {
        let response = api_versions_response(Some(ResponseError::UnsupportedVersion));
        assert_eq!(response.error_code, 35);
        assert_eq!(response.api_keys.len(), SERVED_APIS.len());
        let produce = response.api_keys.iter().find(|a| a.api_key == 0);
        assert_eq!(
            produce.map(|a| (a.min_version, a.max_version)),
            Some((0, 12))
        );
    }
}
