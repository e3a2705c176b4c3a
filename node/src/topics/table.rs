//! The topic table every core keeps (`CoreState::topics`): an immutable
//! snapshot derived from the committed metadata. Plain data: nothing of the
//! node is imported here but the security metadata it carries, so the
//! per-core state holds it without reaching up into the admin calls
//! (`super`) that go to the controller.

use std::collections::BTreeMap;
use std::sync::Arc;

use thiserror::Error;
use uuid::Uuid;

/// Kafka's limit on topic name length.
pub const TOPIC_NAME_MAX: usize = 249;
/// A partition without a leader.
pub const NO_LEADER: i32 = -1;

/// One partition's replicas, in-sync replicas and leader (node ids).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assignment {
    pub replicas: Vec<i32>,
    pub isr: Vec<i32>,
    /// `NO_LEADER` while offline.
    pub leader: i32,
    pub leader_epoch: i32,
    /// Grows with every change of the partition (ISR or leader).
    pub partition_epoch: i32,
    /// A running reassignment's new replicas (in `replicas`, catching up).
    pub adding: Vec<i32>,
    /// A running reassignment's replicas to drop (in `replicas` until it completes).
    pub removing: Vec<i32>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicInfo {
    pub name: String,
    pub id: Uuid,
    pub partitions: i32,
    /// Overrides only; defaults come from the node config.
    pub configs: BTreeMap<String, String>,
    /// Per partition, in order (`partitions` entries).
    pub assignment: Vec<Assignment>,
}

impl TopicInfo {
    pub fn partition(&self, index: i32) -> Option<&Assignment> {
        self.assignment.get(usize::try_from(index).ok()?)
    }
}

/// A registered node, as the metadata says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerInfo {
    pub id: i32,
    /// The first listener's endpoint.
    pub host: String,
    pub port: u16,
    /// Every listener's endpoint: (listener name, host, port).
    pub endpoints: Vec<(String, String, u16)>,
    pub rack: Option<String>,
    pub fenced: bool,
    pub in_controlled_shutdown: bool,
}

impl BrokerInfo {
    /// Where a client of `listener` reaches this broker: that listener's
    /// endpoint (Kafka answers each listener's clients with its own), or
    /// the first one when the broker has no listener of that name.
    pub fn endpoint(&self, listener: &str) -> (&str, u16) {
        self.endpoints
            .iter()
            .find(|(name, _, _)| name == listener)
            .map_or((self.host.as_str(), self.port), |(_, host, port)| {
                (host.as_str(), *port)
            })
    }
}

/// Who serves a partition, from one node's point of view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// No such topic or partition.
    Unknown,
    /// This node leads it: produce and fetch are served here.
    Leader,
    /// Another node leads it, or nobody does (`NO_LEADER`).
    NotLeader(i32),
}

#[derive(Debug, Default, Clone)]
pub struct TopicTable {
    pub topics: BTreeMap<String, TopicInfo>,
    pub brokers: Vec<BrokerInfo>,
    /// The node this table was derived for.
    pub node_id: i32,
    /// The metadata log offset it reflects.
    pub metadata_offset: u64,
    /// The cluster's id, from the metadata (None until the first active
    /// controller has chosen it).
    pub cluster_id: Option<String>,
    /// Dynamic node configs (`decisions::DYNAMIC_NODE_CONFIGS`): the cluster
    /// default, and each node's own.
    pub cluster_configs: BTreeMap<String, String>,
    pub node_configs: BTreeMap<i32, BTreeMap<String, String>>,
    /// SCRAM credentials and ACLs (shared between tables while unchanged).
    pub security: Arc<crate::security::Security>,
}

impl TopicTable {
    /// A dynamic config as it applies to this node: its own, else the
    /// cluster default.
    pub fn node_config(&self, name: &str) -> Option<&str> {
        self.node_configs
            .get(&self.node_id)
            .and_then(|c| c.get(name))
            .or_else(|| self.cluster_configs.get(name))
            .map(String::as_str)
    }

    pub fn get(&self, name: &str) -> Option<&TopicInfo> {
        self.topics.get(name)
    }

    pub fn by_id(&self, id: Uuid) -> Option<&TopicInfo> {
        self.topics.values().find(|t| t.id == id)
    }

    pub fn has_partition(&self, topic: &str, partition: i32) -> bool {
        self.get(topic)
            .is_some_and(|t| partition >= 0 && partition < t.partitions)
    }

    pub fn role(&self, topic: &str, partition: i32) -> Role {
        match self.get(topic).and_then(|t| t.partition(partition)) {
            None => Role::Unknown,
            Some(a) if a.leader == self.node_id => Role::Leader,
            Some(a) => Role::NotLeader(a.leader),
        }
    }

    pub fn broker(&self, id: i32) -> Option<&BrokerInfo> {
        self.brokers.iter().find(|b| b.id == id)
    }

    /// Brokers clients may use: registered and not fenced.
    pub fn live_brokers(&self) -> impl Iterator<Item = &BrokerInfo> {
        self.brokers.iter().filter(|b| !b.fenced)
    }
}

#[derive(Debug, Error)]
pub enum TopicError {
    #[error("topic {0} already exists")]
    Exists(String),
    #[error("unknown topic {0}")]
    Unknown(String),
    #[error("invalid topic name {name:?}: {reason}")]
    InvalidName { name: String, reason: &'static str },
    #[error("invalid partition count {0}")]
    InvalidPartitions(i32),
    #[error("invalid replication factor {0}")]
    InvalidReplicationFactor(i16),
    #[error("invalid config: {0}")]
    InvalidConfig(String),
    /// The controller refused (Kafka's error code and its message).
    #[error("{message}")]
    Refused { code: i16, message: String },
    /// No active controller answered, or the change did not come back in time.
    #[error("cluster metadata: {0}")]
    Unavailable(String),
    #[error(transparent)]
    Engine(#[from] skiff_engine::LogError),
}

/// Kafka's rules: 1..=249 characters of `[a-zA-Z0-9._-]`, not `.` or `..`.
pub fn validate_name(name: &str) -> Result<(), TopicError> {
    let bad = |reason| TopicError::InvalidName {
        name: name.to_string(),
        reason,
    };
    if name.is_empty() {
        return Err(bad("empty"));
    }
    if name == "." || name == ".." {
        return Err(bad("'.' and '..' are not allowed"));
    }
    if name.len() > TOPIC_NAME_MAX {
        return Err(bad("longer than 249 characters"));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
    {
        return Err(bad(
            "only ASCII letters, digits, '.', '_' and '-' are allowed",
        ));
    }
    Ok(())
}
