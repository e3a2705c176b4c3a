//! Format 1 of the metadata log and its snapshots, read and converted: what
//! builds before reassignments wrote (no replica set in a partition change, no
//! adding/removing replicas in the state). Nothing writes it any more; these
//! types only describe bytes already on disk, so they never change.

use std::collections::BTreeMap;

use rkyv::{Archive, Deserialize, Serialize};

use crate::records::{
    ClusterIdentity, Config, ConfigResource, MetadataRecord, NodeId, NodeRegistrationChange,
    Partition, RegisterNode, RemoveTopic, Topic, TopicId,
};
use crate::state::{NodeState, PartitionState, StateImage, TopicState};

#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub(crate) struct PartitionChange {
    topic_id: TopicId,
    index: u32,
    isr: Option<Vec<NodeId>>,
    leader: Option<NodeId>,
    leader_epoch: i32,
    partition_epoch: i32,
}

#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub(crate) enum Record {
    RegisterNode(RegisterNode),
    NodeRegistrationChange(NodeRegistrationChange),
    Topic(Topic),
    RemoveTopic(RemoveTopic),
    Partition(Partition),
    PartitionChange(PartitionChange),
    Config(Config),
    ClusterId(ClusterIdentity),
}

/// A format-1 batch (the same bytes as a `Vec` of its records).
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub(crate) struct Batch(Vec<Record>);

impl From<Record> for MetadataRecord {
    fn from(r: Record) -> Self {
        match r {
            Record::RegisterNode(r) => MetadataRecord::RegisterNode(r),
            Record::NodeRegistrationChange(r) => MetadataRecord::NodeRegistrationChange(r),
            Record::Topic(r) => MetadataRecord::Topic(r),
            Record::RemoveTopic(r) => MetadataRecord::RemoveTopic(r),
            Record::Partition(r) => MetadataRecord::Partition(r),
            Record::PartitionChange(c) => {
                MetadataRecord::PartitionChange(crate::records::PartitionChange {
                    topic_id: c.topic_id,
                    index: c.index,
                    isr: c.isr,
                    leader: c.leader,
                    leader_epoch: c.leader_epoch,
                    partition_epoch: c.partition_epoch,
                    replicas: None,
                })
            }
            Record::Config(r) => MetadataRecord::Config(r),
            Record::ClusterId(r) => MetadataRecord::ClusterId(r),
        }
    }
}

impl From<Batch> for Vec<MetadataRecord> {
    fn from(b: Batch) -> Self {
        b.0.into_iter().map(Into::into).collect()
    }
}

#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub(crate) struct PartitionStateV1 {
    replicas: Vec<NodeId>,
    isr: Vec<NodeId>,
    leader: NodeId,
    leader_epoch: i32,
    partition_epoch: i32,
}

#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub(crate) struct TopicStateV1 {
    name: String,
    topic_id: TopicId,
    configs: Vec<(String, String)>,
    partition_count: u32,
    partitions: BTreeMap<u32, PartitionStateV1>,
}

#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub(crate) struct StateImageV1 {
    nodes: Vec<NodeState>,
    topics: Vec<TopicStateV1>,
    configs: Vec<(ConfigResource, Vec<(String, String)>)>,
    broker_epoch_max: i64,
    offset_last: u64,
    cluster_id: Option<String>,
}

impl From<StateImageV1> for StateImage {
    fn from(image: StateImageV1) -> Self {
        let topics = image
            .topics
            .into_iter()
            .map(|t| TopicState {
                name: t.name,
                topic_id: t.topic_id,
                configs: t.configs,
                partition_count: t.partition_count,
                partitions: t
                    .partitions
                    .into_iter()
                    .map(|(i, p)| {
                        let state = PartitionState {
                            replicas: p.replicas,
                            isr: p.isr,
                            leader: p.leader,
                            leader_epoch: p.leader_epoch,
                            partition_epoch: p.partition_epoch,
                            adding: Vec::new(),
                            removing: Vec::new(),
                        };
                        (i, state)
                    })
                    .collect(),
            })
            .collect();
        StateImage {
            nodes: image.nodes,
            topics,
            configs: image.configs,
            broker_epoch_max: image.broker_epoch_max,
            offset_last: image.offset_last,
            cluster_id: image.cluster_id,
            scram_credentials: Vec::new(),
            acls: Vec::new(),
            client_quotas: Vec::new(),
        }
    }
}
