//! Fully populated requests of every served kind, version by version: every array
//! holds elements, every optional field present where the version has it. Used by
//! the round-trip tests and by the guard's layout check (which includes this file).

use bytes::Bytes;
use kafka_protocol::messages::add_partitions_to_txn_request::{
    AddPartitionsToTxnTopic, AddPartitionsToTxnTransaction,
};
use kafka_protocol::messages::alter_configs_request::{
    AlterConfigsResource as LegacyAlterConfigsResource, AlterableConfig as LegacyAlterableConfig,
};
use kafka_protocol::messages::alter_partition_reassignments_request::{
    ReassignablePartition, ReassignableTopic,
};
use kafka_protocol::messages::alter_user_scram_credentials_request::{
    ScramCredentialDeletion, ScramCredentialUpsertion,
};
use kafka_protocol::messages::create_acls_request::AclCreation;
use kafka_protocol::messages::create_partitions_request::{
    CreatePartitionsAssignment, CreatePartitionsTopic,
};
use kafka_protocol::messages::create_topics_request::{
    CreatableReplicaAssignment, CreatableTopic, CreatableTopicConfig,
};
use kafka_protocol::messages::delete_acls_request::DeleteAclsFilter;
use kafka_protocol::messages::delete_records_request::{
    DeleteRecordsPartition, DeleteRecordsTopic,
};
use kafka_protocol::messages::delete_topics_request::DeleteTopicState;
use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::describe_log_dirs_request::DescribableLogDirTopic;
use kafka_protocol::messages::describe_producers_request::TopicRequest as ProducersTopicRequest;
use kafka_protocol::messages::describe_quorum_request::{PartitionData, TopicData};
use kafka_protocol::messages::describe_user_scram_credentials_request::UserName;
use kafka_protocol::messages::elect_leaders_request::TopicPartitions as ElectTopicPartitions;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic, ForgottenTopic};
use kafka_protocol::messages::incremental_alter_configs_request::{
    AlterConfigsResource, AlterableConfig,
};
use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
use kafka_protocol::messages::leave_group_request::MemberIdentity;
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::list_partition_reassignments_request::ListPartitionReassignmentsTopics;
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::offset_delete_request::{
    OffsetDeleteRequestPartition, OffsetDeleteRequestTopic,
};
use kafka_protocol::messages::offset_fetch_request::{
    OffsetFetchRequestGroup, OffsetFetchRequestTopic, OffsetFetchRequestTopics,
};
use kafka_protocol::messages::offset_for_leader_epoch_request::{
    OffsetForLeaderPartition, OffsetForLeaderTopic,
};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
use kafka_protocol::messages::txn_offset_commit_request::{
    TxnOffsetCommitRequestPartition, TxnOffsetCommitRequestTopic,
};
use kafka_protocol::messages::write_txn_markers_request::{
    WritableTxnMarker, WritableTxnMarkerTopic,
};
use kafka_protocol::messages::{
    alter_client_quotas_request, describe_client_quotas_request, AlterClientQuotasRequest,
    DescribeClientQuotasRequest,
};
use kafka_protocol::messages::{
    AddOffsetsToTxnRequest, AddPartitionsToTxnRequest, DescribeTransactionsRequest, EndTxnRequest,
    ListTransactionsRequest, TxnOffsetCommitRequest, WriteTxnMarkersRequest,
};
use kafka_protocol::messages::{
    AlterConfigsRequest, AlterPartitionReassignmentsRequest, ApiKey, ApiVersionsRequest, BrokerId,
    CreatePartitionsRequest, CreateTopicsRequest, DeleteGroupsRequest, DeleteRecordsRequest,
    DeleteTopicsRequest, DescribeClusterRequest, DescribeConfigsRequest, DescribeGroupsRequest,
    DescribeLogDirsRequest, DescribeProducersRequest, DescribeQuorumRequest, ElectLeadersRequest,
    FetchRequest, FindCoordinatorRequest, GroupId, HeartbeatRequest,
    IncrementalAlterConfigsRequest, InitProducerIdRequest, JoinGroupRequest, LeaveGroupRequest,
    ListGroupsRequest, ListOffsetsRequest, ListPartitionReassignmentsRequest, MetadataRequest,
    OffsetCommitRequest, OffsetDeleteRequest, OffsetFetchRequest, OffsetForLeaderEpochRequest,
    ProduceRequest, ProducerId, RequestKind, SyncGroupRequest, TopicName, TransactionalId,
    UnregisterBrokerRequest,
};
use kafka_protocol::messages::{
    AlterUserScramCredentialsRequest, CreateAclsRequest, DeleteAclsRequest, DescribeAclsRequest,
    DescribeUserScramCredentialsRequest, SaslAuthenticateRequest, SaslHandshakeRequest,
};
use kafka_protocol::protocol::StrBytes;

fn s(text: &'static str) -> StrBytes {
    StrBytes::from_static_str(text)
}

fn topic(text: &'static str) -> TopicName {
    TopicName(s(text))
}

/// A populated request of `api_key` valid at `version`, or `None` for an api
/// without a sample.
pub fn sample_request(api_key: ApiKey, version: i16) -> Option<RequestKind> {
    let v = version;
    Some(match api_key {
        ApiKey::Produce => {
            let partitions = |base: i32| {
                vec![
                    PartitionProduceData::default()
                        .with_index(base)
                        .with_records(Some(Bytes::from_static(b"record batch bytes"))),
                    PartitionProduceData::default()
                        .with_index(base + 1)
                        .with_records(None),
                    PartitionProduceData::default()
                        .with_index(base + 2)
                        .with_records(Some(Bytes::new())),
                ]
            };
            ProduceRequest::default()
                .with_transactional_id(Some(TransactionalId(s("tx-1"))))
                .with_acks(-1)
                .with_timeout_ms(30_000)
                .with_topic_data(vec![
                    TopicProduceData::default()
                        .with_name(topic("orders"))
                        .with_partition_data(partitions(0)),
                    TopicProduceData::default()
                        .with_name(topic("payments"))
                        .with_partition_data(partitions(7)),
                ])
                .into()
        }
        ApiKey::Fetch => {
            let partition = |index: i32| {
                FetchPartition::default()
                    .with_partition(index)
                    .with_current_leader_epoch(if v >= 9 { 4 } else { -1 })
                    .with_fetch_offset(1000 + i64::from(index))
                    .with_last_fetched_epoch(if v >= 12 { 3 } else { -1 })
                    .with_log_start_offset(if v >= 5 { 10 } else { -1 })
                    .with_partition_max_bytes(1 << 20)
            };
            let mut request = FetchRequest::default()
                .with_replica_id(BrokerId(-1))
                .with_max_wait_ms(500)
                .with_min_bytes(1)
                .with_max_bytes(52_428_800)
                .with_isolation_level(1)
                .with_topics(vec![
                    FetchTopic::default()
                        .with_topic(topic("orders"))
                        .with_partitions(vec![partition(0), partition(1)]),
                    FetchTopic::default()
                        .with_topic(topic("payments"))
                        .with_partitions(vec![partition(2)]),
                ]);
            if v >= 7 {
                request = request
                    .with_session_id(11)
                    .with_session_epoch(2)
                    .with_forgotten_topics_data(vec![ForgottenTopic::default()
                        .with_topic(topic("old"))
                        .with_partitions(vec![0, 1, 5])]);
            }
            if v >= 11 {
                request = request.with_rack_id(s("rack-a"));
            }
            if v >= 12 {
                request = request.with_cluster_id(Some(s("cluster-1")));
            }
            request.into()
        }
        ApiKey::ListOffsets => {
            let partition = |index: i32| {
                ListOffsetsPartition::default()
                    .with_partition_index(index)
                    .with_current_leader_epoch(if v >= 4 { 2 } else { -1 })
                    .with_timestamp(-1)
            };
            ListOffsetsRequest::default()
                .with_replica_id(BrokerId(-1))
                .with_isolation_level(if v >= 2 { 1 } else { 0 })
                .with_topics(vec![
                    ListOffsetsTopic::default()
                        .with_name(topic("orders"))
                        .with_partitions(vec![partition(0), partition(1)]),
                    ListOffsetsTopic::default()
                        .with_name(topic("payments"))
                        .with_partitions(vec![partition(3)]),
                ])
                .into()
        }
        ApiKey::Metadata => MetadataRequest::default()
            .with_topics(Some(vec![
                MetadataRequestTopic::default().with_name(Some(topic("orders"))),
                MetadataRequestTopic::default().with_name(Some(topic("payments"))),
            ]))
            .with_allow_auto_topic_creation(v < 4)
            .with_include_cluster_authorized_operations((8..=10).contains(&v))
            .with_include_topic_authorized_operations(v >= 8)
            .into(),
        ApiKey::CreateTopics => {
            let created = |name: &'static str| {
                CreatableTopic::default()
                    .with_name(topic(name))
                    .with_num_partitions(-1)
                    .with_replication_factor(-1)
                    .with_assignments(vec![
                        CreatableReplicaAssignment::default()
                            .with_partition_index(0)
                            .with_broker_ids(vec![BrokerId(1), BrokerId(2)]),
                        CreatableReplicaAssignment::default()
                            .with_partition_index(1)
                            .with_broker_ids(vec![BrokerId(2), BrokerId(3)]),
                    ])
                    .with_configs(vec![
                        CreatableTopicConfig::default()
                            .with_name(s("retention.ms"))
                            .with_value(Some(s("60000"))),
                        CreatableTopicConfig::default()
                            .with_name(s("cleanup.policy"))
                            .with_value(None),
                    ])
            };
            CreateTopicsRequest::default()
                .with_topics(vec![created("orders"), created("payments")])
                .with_timeout_ms(5000)
                .with_validate_only(true)
                .into()
        }
        ApiKey::CreatePartitions => CreatePartitionsRequest::default()
            .with_topics(vec![
                CreatePartitionsTopic::default()
                    .with_name(topic("orders"))
                    .with_count(5)
                    .with_assignments(Some(vec![
                        CreatePartitionsAssignment::default()
                            .with_broker_ids(vec![BrokerId(1), BrokerId(2)]),
                        CreatePartitionsAssignment::default()
                            .with_broker_ids(vec![BrokerId(2), BrokerId(3)]),
                    ])),
                CreatePartitionsTopic::default()
                    .with_name(topic("payments"))
                    .with_count(8)
                    .with_assignments(None),
            ])
            .with_timeout_ms(5000)
            .with_validate_only(true)
            .into(),
        ApiKey::AlterConfigs => AlterConfigsRequest::default()
            .with_resources(vec![LegacyAlterConfigsResource::default()
                .with_resource_type(2)
                .with_resource_name(s("orders"))
                .with_configs(vec![
                    LegacyAlterableConfig::default()
                        .with_name(s("retention.ms"))
                        .with_value(Some(s("1000"))),
                    LegacyAlterableConfig::default()
                        .with_name(s("segment.bytes"))
                        .with_value(None),
                ])])
            .with_validate_only(true)
            .into(),
        ApiKey::DescribeLogDirs => DescribeLogDirsRequest::default()
            .with_topics(Some(vec![DescribableLogDirTopic::default()
                .with_topic(topic("orders"))
                .with_partitions(vec![0, 1, 5])]))
            .into(),
        ApiKey::DescribeProducers => DescribeProducersRequest::default()
            .with_topics(vec![ProducersTopicRequest::default()
                .with_name(topic("orders"))
                .with_partition_indexes(vec![0, 3])])
            .into(),
        ApiKey::OffsetDelete => OffsetDeleteRequest::default()
            .with_group_id(GroupId(s("billing")))
            .with_topics(vec![OffsetDeleteRequestTopic::default()
                .with_name(topic("orders"))
                .with_partitions(vec![
                    OffsetDeleteRequestPartition::default().with_partition_index(0),
                    OffsetDeleteRequestPartition::default().with_partition_index(3),
                ])])
            .into(),
        ApiKey::AlterPartitionReassignments => {
            let request = AlterPartitionReassignmentsRequest::default()
                .with_timeout_ms(60_000)
                .with_topics(vec![ReassignableTopic::default()
                    .with_name(topic("orders"))
                    .with_partitions(vec![
                        ReassignablePartition::default()
                            .with_partition_index(0)
                            .with_replicas(Some(vec![BrokerId(2), BrokerId(3), BrokerId(4)])),
                        ReassignablePartition::default().with_partition_index(1),
                    ])]);
            if v >= 1 {
                request.with_allow_replication_factor_change(false).into()
            } else {
                request.into()
            }
        }
        ApiKey::SaslHandshake => SaslHandshakeRequest::default()
            .with_mechanism(s("SCRAM-SHA-512"))
            .into(),
        ApiKey::SaslAuthenticate => SaslAuthenticateRequest::default()
            .with_auth_bytes(Bytes::from_static(b"n,,n=alice,r=fyko+d2lbbFgONRv9qkxdawL"))
            .into(),
        ApiKey::CreateAcls => CreateAclsRequest::default()
            .with_creations(vec![
                AclCreation::default()
                    .with_resource_type(2)
                    .with_resource_name(s("orders"))
                    .with_resource_pattern_type(3)
                    .with_principal(s("User:alice"))
                    .with_host(s("*"))
                    .with_operation(3)
                    .with_permission_type(3),
                AclCreation::default()
                    .with_resource_type(3)
                    .with_resource_name(s("app-"))
                    .with_resource_pattern_type(4)
                    .with_principal(s("User:bob"))
                    .with_host(s("10.0.0.1"))
                    .with_operation(2)
                    .with_permission_type(2),
            ])
            .into(),
        ApiKey::DescribeAcls => DescribeAclsRequest::default()
            .with_resource_type_filter(2)
            .with_resource_name_filter(Some(s("orders")))
            .with_pattern_type_filter(2)
            .with_principal_filter(None)
            .with_host_filter(Some(s("*")))
            .with_operation(1)
            .with_permission_type(1)
            .into(),
        ApiKey::DeleteAcls => DeleteAclsRequest::default()
            .with_filters(vec![
                DeleteAclsFilter::default()
                    .with_resource_type_filter(2)
                    .with_resource_name_filter(Some(s("orders")))
                    .with_pattern_type_filter(3)
                    .with_principal_filter(Some(s("User:alice")))
                    .with_host_filter(None)
                    .with_operation(3)
                    .with_permission_type(3),
                DeleteAclsFilter::default()
                    .with_resource_type_filter(1)
                    .with_resource_name_filter(None)
                    .with_pattern_type_filter(1)
                    .with_operation(1)
                    .with_permission_type(1),
            ])
            .into(),
        ApiKey::DescribeUserScramCredentials => DescribeUserScramCredentialsRequest::default()
            .with_users(Some(vec![
                UserName::default().with_name(s("alice")),
                UserName::default().with_name(s("bob")),
            ]))
            .into(),
        ApiKey::AlterUserScramCredentials => AlterUserScramCredentialsRequest::default()
            .with_deletions(vec![ScramCredentialDeletion::default()
                .with_name(s("bob"))
                .with_mechanism(1)])
            .with_upsertions(vec![ScramCredentialUpsertion::default()
                .with_name(s("alice"))
                .with_mechanism(2)
                .with_iterations(8192)
                .with_salt(Bytes::from_static(b"0123456789abcdef"))
                .with_salted_password(Bytes::from_static(&[7; 64]))])
            .into(),
        ApiKey::DescribeClientQuotas => DescribeClientQuotasRequest::default()
            .with_components(vec![
                describe_client_quotas_request::ComponentData::default()
                    .with_entity_type(s("user"))
                    .with_match_type(0)
                    .with_match(Some(s("alice"))),
                describe_client_quotas_request::ComponentData::default()
                    .with_entity_type(s("client-id"))
                    .with_match_type(2)
                    .with_match(None),
            ])
            .with_strict(true)
            .into(),
        ApiKey::AlterClientQuotas => AlterClientQuotasRequest::default()
            .with_entries(vec![alter_client_quotas_request::EntryData::default()
                .with_entity(vec![
                    alter_client_quotas_request::EntityData::default()
                        .with_entity_type(s("user"))
                        .with_entity_name(Some(s("alice"))),
                    alter_client_quotas_request::EntityData::default()
                        .with_entity_type(s("client-id"))
                        .with_entity_name(None),
                ])
                .with_ops(vec![
                    alter_client_quotas_request::OpData::default()
                        .with_key(s("producer_byte_rate"))
                        .with_value(1048576.0),
                    alter_client_quotas_request::OpData::default()
                        .with_key(s("consumer_byte_rate"))
                        .with_remove(true),
                ])])
            .with_validate_only(true)
            .into(),
        ApiKey::UnregisterBroker => UnregisterBrokerRequest::default()
            .with_broker_id(BrokerId(4))
            .into(),
        ApiKey::ListPartitionReassignments => ListPartitionReassignmentsRequest::default()
            .with_timeout_ms(60_000)
            .with_topics(Some(vec![ListPartitionReassignmentsTopics::default()
                .with_name(topic("orders"))
                .with_partition_indexes(vec![0, 1])]))
            .into(),
        ApiKey::ElectLeaders => {
            let request = ElectLeadersRequest::default()
                .with_topic_partitions(Some(vec![
                    ElectTopicPartitions::default()
                        .with_topic(topic("orders"))
                        .with_partitions(vec![0, 2]),
                    ElectTopicPartitions::default().with_topic(topic("payments")),
                ]))
                .with_timeout_ms(5000);
            if v >= 1 {
                request.with_election_type(1).into()
            } else {
                request.into()
            }
        }
        ApiKey::DescribeCluster => {
            let request =
                DescribeClusterRequest::default().with_include_cluster_authorized_operations(true);
            match v {
                0 => request.into(),
                1 => request.with_endpoint_type(1).into(),
                _ => request
                    .with_endpoint_type(1)
                    .with_include_fenced_brokers(true)
                    .into(),
            }
        }
        ApiKey::DescribeQuorum => DescribeQuorumRequest::default()
            .with_topics(vec![TopicData::default()
                .with_topic_name(topic("__cluster_metadata"))
                .with_partitions(vec![
                    PartitionData::default().with_partition_index(0),
                    PartitionData::default().with_partition_index(1),
                ])])
            .into(),
        ApiKey::DeleteTopics => {
            let request = DeleteTopicsRequest::default().with_timeout_ms(5000);
            if v >= 6 {
                request
                    .with_topics(vec![
                        DeleteTopicState::default().with_name(Some(topic("orders"))),
                        DeleteTopicState::default().with_name(None),
                    ])
                    .into()
            } else {
                request
                    .with_topic_names(vec![topic("orders"), topic("payments")])
                    .into()
            }
        }
        ApiKey::DescribeConfigs => DescribeConfigsRequest::default()
            .with_resources(vec![
                DescribeConfigsResource::default()
                    .with_resource_type(2)
                    .with_resource_name(s("orders"))
                    .with_configuration_keys(Some(vec![s("retention.ms"), s("segment.bytes")])),
                DescribeConfigsResource::default()
                    .with_resource_type(4)
                    .with_resource_name(s("1"))
                    .with_configuration_keys(None),
            ])
            .with_include_synonyms(true)
            .with_include_documentation(v >= 3)
            .into(),
        ApiKey::IncrementalAlterConfigs => IncrementalAlterConfigsRequest::default()
            .with_resources(vec![AlterConfigsResource::default()
                .with_resource_type(2)
                .with_resource_name(s("orders"))
                .with_configs(vec![
                    AlterableConfig::default()
                        .with_name(s("retention.ms"))
                        .with_config_operation(0)
                        .with_value(Some(s("1000"))),
                    AlterableConfig::default()
                        .with_name(s("segment.bytes"))
                        .with_config_operation(1)
                        .with_value(None),
                ])])
            .with_validate_only(false)
            .into(),
        ApiKey::AddPartitionsToTxn if v >= 4 => AddPartitionsToTxnRequest::default()
            .with_transactions(vec![
                AddPartitionsToTxnTransaction::default()
                    .with_transactional_id(TransactionalId(s("tx-1")))
                    .with_producer_id(ProducerId(42))
                    .with_producer_epoch(3)
                    .with_verify_only(true)
                    .with_topics(vec![AddPartitionsToTxnTopic::default()
                        .with_name(topic("orders"))
                        .with_partitions(vec![0, 3])]),
                AddPartitionsToTxnTransaction::default()
                    .with_transactional_id(TransactionalId(s("tx-2")))
                    .with_producer_id(ProducerId(43))
                    .with_topics(vec![]),
            ])
            .into(),
        ApiKey::AddPartitionsToTxn => AddPartitionsToTxnRequest::default()
            .with_v3_and_below_transactional_id(TransactionalId(s("tx-1")))
            .with_v3_and_below_producer_id(ProducerId(42))
            .with_v3_and_below_producer_epoch(3)
            .with_v3_and_below_topics(vec![
                AddPartitionsToTxnTopic::default()
                    .with_name(topic("orders"))
                    .with_partitions(vec![0, 3]),
                AddPartitionsToTxnTopic::default()
                    .with_name(topic("payments"))
                    .with_partitions(vec![1]),
            ])
            .into(),
        ApiKey::AddOffsetsToTxn => AddOffsetsToTxnRequest::default()
            .with_transactional_id(TransactionalId(s("tx-1")))
            .with_producer_id(ProducerId(42))
            .with_producer_epoch(3)
            .with_group_id(GroupId(s("billing")))
            .into(),
        ApiKey::EndTxn => EndTxnRequest::default()
            .with_transactional_id(TransactionalId(s("tx-1")))
            .with_producer_id(ProducerId(42))
            .with_producer_epoch(3)
            .with_committed(true)
            .into(),
        ApiKey::ListTransactions => ListTransactionsRequest::default()
            .with_state_filters(vec![s("Ongoing"), s("PrepareCommit")])
            .with_producer_id_filters(vec![ProducerId(42), ProducerId(43)])
            .with_duration_filter(if v >= 1 { 60_000 } else { -1 })
            .into(),
        ApiKey::DescribeTransactions => DescribeTransactionsRequest::default()
            .with_transactional_ids(vec![TransactionalId(s("tx-1")), TransactionalId(s("tx-2"))])
            .into(),
        ApiKey::TxnOffsetCommit => TxnOffsetCommitRequest::default()
            .with_transactional_id(TransactionalId(s("tx-1")))
            .with_group_id(GroupId(s("billing")))
            .with_producer_id(ProducerId(42))
            .with_producer_epoch(3)
            .with_generation_id(if v >= 3 { 5 } else { -1 })
            .with_member_id(if v >= 3 { s("member-1") } else { s("") })
            .with_group_instance_id((v >= 3).then(|| s("instance-1")))
            .with_topics(vec![TxnOffsetCommitRequestTopic::default()
                .with_name(topic("orders"))
                .with_partitions(vec![
                    TxnOffsetCommitRequestPartition::default()
                        .with_partition_index(0)
                        .with_committed_offset(100)
                        .with_committed_leader_epoch(if v >= 2 { 4 } else { -1 })
                        .with_committed_metadata(Some(s("m"))),
                    TxnOffsetCommitRequestPartition::default()
                        .with_partition_index(3)
                        .with_committed_offset(7)
                        .with_committed_metadata(None),
                ])])
            .into(),
        ApiKey::WriteTxnMarkers => WriteTxnMarkersRequest::default()
            .with_markers(vec![
                WritableTxnMarker::default()
                    .with_producer_id(ProducerId(42))
                    .with_producer_epoch(3)
                    .with_transaction_result(true)
                    .with_coordinator_epoch(7)
                    .with_topics(vec![WritableTxnMarkerTopic::default()
                        .with_name(topic("orders"))
                        .with_partition_indexes(vec![0, 3])]),
                WritableTxnMarker::default()
                    .with_producer_id(ProducerId(43))
                    .with_producer_epoch(0)
                    .with_transaction_result(false)
                    .with_coordinator_epoch(7)
                    .with_topics(vec![]),
            ])
            .into(),
        ApiKey::InitProducerId => {
            let request = InitProducerIdRequest::default()
                .with_transactional_id(Some(TransactionalId(s("tx-1"))))
                .with_transaction_timeout_ms(60_000);
            if v >= 3 {
                request
                    .with_producer_id(ProducerId(42))
                    .with_producer_epoch(3)
                    .into()
            } else {
                request.into()
            }
        }
        ApiKey::DeleteRecords => DeleteRecordsRequest::default()
            .with_topics(vec![DeleteRecordsTopic::default()
                .with_name(TopicName(s("orders")))
                .with_partitions(vec![
                    DeleteRecordsPartition::default()
                        .with_partition_index(0)
                        .with_offset(10),
                    DeleteRecordsPartition::default()
                        .with_partition_index(1)
                        .with_offset(-1),
                ])])
            .with_timeout_ms(1000)
            .into(),
        // replica_id (v3+) keeps its default, -2 (a debugging client).
        ApiKey::OffsetForLeaderEpoch => OffsetForLeaderEpochRequest::default()
            .with_topics(vec![OffsetForLeaderTopic::default()
                .with_topic(topic("orders"))
                .with_partitions(vec![
                    OffsetForLeaderPartition::default()
                        .with_partition(0)
                        .with_current_leader_epoch(3)
                        .with_leader_epoch(2),
                    OffsetForLeaderPartition::default()
                        .with_partition(1)
                        .with_current_leader_epoch(-1)
                        .with_leader_epoch(0),
                ])])
            .into(),
        ApiKey::FindCoordinator => {
            let request = FindCoordinatorRequest::default();
            let request = if v <= 3 {
                request.with_key(s("group-1"))
            } else {
                request
            };
            let request = if v >= 1 {
                request.with_key_type(0)
            } else {
                request
            };
            if v >= 4 {
                request
                    .with_coordinator_keys(vec![s("group-1"), s("group-2")])
                    .into()
            } else {
                request.into()
            }
        }
        ApiKey::JoinGroup => {
            let protocol = |name: &'static str| {
                JoinGroupRequestProtocol::default()
                    .with_name(s(name))
                    .with_metadata(Bytes::from_static(b"subscription"))
            };
            let mut request = JoinGroupRequest::default()
                .with_group_id(GroupId(s("group-1")))
                .with_session_timeout_ms(10_000)
                .with_member_id(s("member-1"))
                .with_protocol_type(s("consumer"))
                .with_protocols(vec![protocol("range"), protocol("roundrobin")]);
            if v >= 1 {
                request = request.with_rebalance_timeout_ms(30_000);
            }
            if v >= 5 {
                request = request.with_group_instance_id(Some(s("instance-1")));
            }
            if v >= 8 {
                request = request.with_reason(Some(s("rejoin")));
            }
            request.into()
        }
        ApiKey::SyncGroup => {
            let assignment = |member: &'static str| {
                SyncGroupRequestAssignment::default()
                    .with_member_id(s(member))
                    .with_assignment(Bytes::from_static(b"assignment"))
            };
            let mut request = SyncGroupRequest::default()
                .with_group_id(GroupId(s("group-1")))
                .with_generation_id(3)
                .with_member_id(s("member-1"))
                .with_assignments(vec![assignment("member-1"), assignment("member-2")]);
            if v >= 3 {
                request = request.with_group_instance_id(Some(s("instance-1")));
            }
            if v >= 5 {
                request = request
                    .with_protocol_type(Some(s("consumer")))
                    .with_protocol_name(Some(s("range")));
            }
            request.into()
        }
        ApiKey::Heartbeat => {
            let request = HeartbeatRequest::default()
                .with_group_id(GroupId(s("group-1")))
                .with_generation_id(3)
                .with_member_id(s("member-1"));
            if v >= 3 {
                request.with_group_instance_id(Some(s("instance-1"))).into()
            } else {
                request.into()
            }
        }
        ApiKey::LeaveGroup => {
            let request = LeaveGroupRequest::default().with_group_id(GroupId(s("group-1")));
            if v >= 3 {
                let member = |id: &'static str| {
                    let m = MemberIdentity::default()
                        .with_member_id(s(id))
                        .with_group_instance_id(Some(s("instance-1")));
                    if v >= 5 {
                        m.with_reason(Some(s("closing")))
                    } else {
                        m
                    }
                };
                request
                    .with_members(vec![member("member-1"), member("member-2")])
                    .into()
            } else {
                request.with_member_id(s("member-1")).into()
            }
        }
        ApiKey::OffsetCommit => {
            let partition = |index: i32| {
                OffsetCommitRequestPartition::default()
                    .with_partition_index(index)
                    .with_committed_offset(100 + i64::from(index))
                    .with_committed_leader_epoch(if v >= 6 { 2 } else { -1 })
                    .with_committed_metadata(Some(s("meta")))
            };
            let mut request = OffsetCommitRequest::default()
                .with_group_id(GroupId(s("group-1")))
                .with_generation_id_or_member_epoch(3)
                .with_member_id(s("member-1"))
                .with_topics(vec![
                    OffsetCommitRequestTopic::default()
                        .with_name(topic("orders"))
                        .with_partitions(vec![partition(0), partition(1)]),
                    OffsetCommitRequestTopic::default()
                        .with_name(topic("payments"))
                        .with_partitions(vec![partition(2)]),
                ]);
            if v >= 7 {
                request = request.with_group_instance_id(Some(s("instance-1")));
            }
            if v <= 4 {
                request = request.with_retention_time_ms(-1);
            }
            request.into()
        }
        ApiKey::OffsetFetch => {
            if v >= 8 {
                OffsetFetchRequest::default()
                    .with_groups(vec![
                        OffsetFetchRequestGroup::default()
                            .with_group_id(GroupId(s("group-1")))
                            .with_topics(Some(vec![OffsetFetchRequestTopics::default()
                                .with_name(topic("orders"))
                                .with_partition_indexes(vec![0, 1, 2])])),
                        OffsetFetchRequestGroup::default()
                            .with_group_id(GroupId(s("group-2")))
                            .with_topics(None),
                    ])
                    .with_require_stable(true)
                    .into()
            } else {
                OffsetFetchRequest::default()
                    .with_group_id(GroupId(s("group-1")))
                    .with_topics(Some(vec![
                        OffsetFetchRequestTopic::default()
                            .with_name(topic("orders"))
                            .with_partition_indexes(vec![0, 1]),
                        OffsetFetchRequestTopic::default()
                            .with_name(topic("payments"))
                            .with_partition_indexes(vec![4]),
                    ]))
                    .with_require_stable(v >= 7)
                    .into()
            }
        }
        ApiKey::ListGroups => {
            let mut request = ListGroupsRequest::default();
            if v >= 4 {
                request = request.with_states_filter(vec![s("Stable"), s("Empty")]);
            }
            if v >= 5 {
                request = request.with_types_filter(vec![s("classic")]);
            }
            request.into()
        }
        ApiKey::DescribeGroups => DescribeGroupsRequest::default()
            .with_groups(vec![GroupId(s("group-1")), GroupId(s("group-2"))])
            .with_include_authorized_operations(v >= 3)
            .into(),
        ApiKey::DeleteGroups => DeleteGroupsRequest::default()
            .with_groups_names(vec![GroupId(s("group-1")), GroupId(s("group-2"))])
            .into(),
        ApiKey::ApiVersions => {
            let request = ApiVersionsRequest::default();
            if v >= 3 {
                request
                    .with_client_software_name(s("skiff-test"))
                    .with_client_software_version(s("1.0"))
                    .into()
            } else {
                request.into()
            }
        }
        _ => return None,
    })
}
