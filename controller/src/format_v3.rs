//! Format 3 of the metadata log and its snapshots, read and converted: what
//! builds before client quotas wrote (format 4 added a record kind, which
//! changes the archived enum, and a set to the state image). Nothing writes it
//! any more; these types only describe bytes already on disk, so they never
//! change. The records they hold are today's (unchanged since).

use rkyv::{Archive, Deserialize, Serialize};

use crate::records::{
    AclRecord, ClusterIdentity, Config, ConfigResource, MetadataRecord, NodeRegistrationChange,
    Partition, PartitionChange, RegisterNode, RemoveTopic, RemoveUserScramCredential, Topic,
    UnregisterNode, UserScramCredential,
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
    UserScramCredential(UserScramCredential),
    RemoveUserScramCredential(RemoveUserScramCredential),
    Acl(AclRecord),
    RemoveAcl(AclRecord),
}

/// A format-3 batch (the same bytes as a `Vec` of its records).
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub(crate) struct Batch(pub(crate) Vec<Record>);

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
            Record::UserScramCredential(r) => MetadataRecord::UserScramCredential(r),
            Record::RemoveUserScramCredential(r) => MetadataRecord::RemoveUserScramCredential(r),
            Record::Acl(r) => MetadataRecord::Acl(r),
            Record::RemoveAcl(r) => MetadataRecord::RemoveAcl(r),
        }
    }
}

impl From<Batch> for Vec<MetadataRecord> {
    fn from(b: Batch) -> Self {
        b.0.into_iter().map(Into::into).collect()
    }
}

#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub(crate) struct StateImageV3 {
    pub(crate) nodes: Vec<NodeState>,
    pub(crate) topics: Vec<TopicState>,
    pub(crate) configs: Vec<(ConfigResource, Vec<(String, String)>)>,
    pub(crate) broker_epoch_max: i64,
    pub(crate) offset_last: u64,
    pub(crate) cluster_id: Option<String>,
    pub(crate) scram_credentials: Vec<UserScramCredential>,
    pub(crate) acls: Vec<AclRecord>,
}

impl From<StateImageV3> for StateImage {
    fn from(image: StateImageV3) -> Self {
        StateImage {
            nodes: image.nodes,
            topics: image.topics,
            configs: image.configs,
            broker_epoch_max: image.broker_epoch_max,
            offset_last: image.offset_last,
            cluster_id: image.cluster_id,
            scram_credentials: image.scram_credentials,
            acls: image.acls,
            client_quotas: Vec::new(),
        }
    }
}
