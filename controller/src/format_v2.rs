//! Format 2 of the metadata log and its snapshots, read and converted: what
//! builds before SCRAM credentials and ACLs wrote (format 3 added record kinds,
//! which changes the archived enum, and two sets to the state image). Nothing
//! writes it any more; these types only describe bytes already on disk, so
//! they never change. The records they hold are today's (unchanged since).

use rkyv::{Archive, Deserialize, Serialize};

use crate::records::{
    ClusterIdentity, Config, ConfigResource, MetadataRecord, NodeRegistrationChange, Partition,
    PartitionChange, RegisterNode, RemoveTopic, Topic, UnregisterNode,
};
use crate::state::{NodeState, StateImage, TopicState};

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
    UnregisterNode(UnregisterNode),
}

/// A format-2 batch (the same bytes as a `Vec` of its records).
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
            Record::PartitionChange(r) => MetadataRecord::PartitionChange(r),
            Record::Config(r) => MetadataRecord::Config(r),
            Record::ClusterId(r) => MetadataRecord::ClusterId(r),
            Record::UnregisterNode(r) => MetadataRecord::UnregisterNode(r),
        }
    }
}

impl From<Batch> for Vec<MetadataRecord> {
    fn from(b: Batch) -> Self {
        b.0.into_iter().map(Into::into).collect()
    }
}

#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub(crate) struct StateImageV2 {
    nodes: Vec<NodeState>,
    topics: Vec<TopicState>,
    configs: Vec<(ConfigResource, Vec<(String, String)>)>,
    broker_epoch_max: i64,
    offset_last: u64,
    cluster_id: Option<String>,
}

impl From<StateImageV2> for StateImage {
    fn from(image: StateImageV2) -> Self {
        StateImage {
            nodes: image.nodes,
            topics: image.topics,
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
