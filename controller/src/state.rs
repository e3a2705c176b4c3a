//! The metadata state machine: the cluster as the committed metadata log says.
//!
//! `ClusterState::apply` is deterministic and total: a record that does not fit
//! the state (stale epoch, unknown topic, a partition that would break an
//! invariant) is refused with an `ApplyError` and leaves the state unchanged, the
//! same way on every replica. So the invariants below hold in every state any
//! replica ever has, whatever was written to the log:
//!
//! - a partition's replicas are distinct and non-empty; ISR ⊆ replicas;
//! - a reassignment's adding and removing replicas are distinct replicas, and
//!   no replica is both;
//! - leader is `NO_LEADER` or a member of the ISR; the ISR is non-empty;
//! - leader epochs and partition epochs only grow (per partition, while it exists);
//! - a node's broker epoch only grows.
//!
//! Architecture invariant: no I/O, no clock, no randomness here.

use std::collections::{BTreeMap, BTreeSet};

use rkyv::{Archive, Deserialize, Serialize};

use crate::records::{
    self, AclRecord, ClientQuotaRecord, ConfigResource, Endpoint, MetadataRecord, NodeId,
    NodeRegistrationChange, PartitionChange, QuotaEntityPart, RecordError, RegisterNode,
    RegistrationChange, ReplicaSet, TopicId, UserScramCredential, NO_LEADER,
};

#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct NodeState {
    pub node_id: NodeId,
    pub incarnation_id: [u8; 16],
    pub broker_epoch: i64,
    pub endpoints: Vec<Endpoint>,
    pub rack: Option<String>,
    pub fenced: bool,
    pub in_controlled_shutdown: bool,
    /// Log offset (Raft index) of the registration: the node is unfenced once it
    /// has applied the log up to here.
    pub registered_offset: u64,
}

impl NodeState {
    /// May lead a partition or join an ISR.
    pub fn is_eligible(&self) -> bool {
        !self.fenced && !self.in_controlled_shutdown
    }
}

#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct PartitionState {
    pub replicas: Vec<NodeId>,
    pub isr: Vec<NodeId>,
    pub leader: NodeId,
    pub leader_epoch: i32,
    pub partition_epoch: i32,
    /// A running reassignment's new replicas (see `records::ReplicaSet`).
    pub adding: Vec<NodeId>,
    /// A running reassignment's replicas to drop once the target is in sync.
    pub removing: Vec<NodeId>,
}

impl PartitionState {
    /// A reassignment is running.
    pub fn is_reassigning(&self) -> bool {
        !self.adding.is_empty() || !self.removing.is_empty()
    }

    /// The replicas before the running reassignment (`replicas` if none runs).
    pub fn original_replicas(&self) -> Vec<NodeId> {
        self.replicas
            .iter()
            .copied()
            .filter(|r| !self.adding.contains(r))
            .collect()
    }

    /// The replicas the running reassignment leads to (`replicas` if none runs).
    pub fn target_replicas(&self) -> Vec<NodeId> {
        self.replicas
            .iter()
            .copied()
            .filter(|r| !self.removing.contains(r))
            .collect()
    }

    /// The invariants every stored partition keeps (see the module docs).
    pub fn check(&self) -> Result<(), String> {
        if self.replicas.is_empty() {
            return Err("no replicas".into());
        }
        let mut sorted = self.replicas.clone();
        sorted.sort_unstable();
        sorted.dedup();
        if sorted.len() != self.replicas.len() {
            return Err(format!("duplicate replicas {:?}", self.replicas));
        }
        if self.isr.is_empty() {
            return Err("empty ISR".into());
        }
        let mut isr = self.isr.clone();
        isr.sort_unstable();
        isr.dedup();
        if isr.len() != self.isr.len() {
            return Err(format!("duplicate ISR members {:?}", self.isr));
        }
        if let Some(n) = self.isr.iter().find(|n| !self.replicas.contains(n)) {
            return Err(format!("ISR member {n} is not a replica"));
        }
        if self.leader != NO_LEADER && !self.isr.contains(&self.leader) {
            return Err(format!("leader {} not in ISR {:?}", self.leader, self.isr));
        }
        for (what, set) in [("adding", &self.adding), ("removing", &self.removing)] {
            let mut sorted = set.clone();
            sorted.sort_unstable();
            sorted.dedup();
            if sorted.len() != set.len() {
                return Err(format!("duplicate {what} replicas {set:?}"));
            }
            if let Some(n) = set.iter().find(|n| !self.replicas.contains(n)) {
                return Err(format!("{what} replica {n} is not a replica"));
            }
        }
        if let Some(n) = self.adding.iter().find(|n| self.removing.contains(n)) {
            return Err(format!("replica {n} is both added and removed"));
        }
        if self.removing.len() == self.replicas.len() {
            return Err("a reassignment removes every replica".into());
        }
        Ok(())
    }
}

#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct TopicState {
    pub name: String,
    pub topic_id: TopicId,
    pub configs: Vec<(String, String)>,
    /// Declared count; `partitions` fills up as the topic's Partition records apply.
    pub partition_count: u32,
    pub partitions: BTreeMap<u32, PartitionState>,
}

impl TopicState {
    pub fn config(&self, name: &str) -> Option<&str> {
        self.configs
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ApplyError {
    #[error("the cluster id is already {0}")]
    ClusterIdSet(String),
    #[error("node {0} is not registered")]
    UnknownNode(NodeId),
    #[error("node {node}: broker epoch {got} is stale (current {current})")]
    StaleBrokerEpoch {
        node: NodeId,
        got: i64,
        current: i64,
    },
    #[error("topic {0} already exists")]
    TopicExists(String),
    #[error("SCRAM credential for {name:?}, mechanism type {mechanism}: no user name or an unknown mechanism")]
    InvalidCredential { name: String, mechanism: i8 },
    #[error("no SCRAM credential for {name:?}, mechanism type {mechanism}")]
    UnknownCredential { name: String, mechanism: i8 },
    #[error("topic {0} is unknown")]
    UnknownTopicName(String),
    #[error("topic id {0} is unknown")]
    UnknownTopic(TopicId),
    #[error("partition {topic}-{index} is unknown or out of range")]
    UnknownPartition { topic: TopicId, index: u32 },
    #[error("partition {topic}-{index} already exists")]
    PartitionExists { topic: TopicId, index: u32 },
    #[error("partition {topic}-{index}: {reason}")]
    InvalidPartition {
        topic: TopicId,
        index: u32,
        reason: String,
    },
    #[error("partition {topic}-{index}: epochs must grow (leader {leader_epoch}, partition {partition_epoch})")]
    EpochNotIncreasing {
        topic: TopicId,
        index: u32,
        leader_epoch: i32,
        partition_epoch: i32,
    },
}

/// The whole cluster's metadata. Maps are ordered, so iteration (and therefore
/// every decision made from this state) is deterministic.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterState {
    nodes: BTreeMap<NodeId, NodeState>,
    topics: BTreeMap<TopicId, TopicState>,
    topic_ids: BTreeMap<String, TopicId>,
    configs: BTreeMap<ConfigResource, BTreeMap<String, String>>,
    broker_epoch_max: i64,
    /// The offset of the last applied record batch (Raft index).
    offset_last: u64,
    /// Set by the first `ClusterId` record; later ones are refused.
    cluster_id: Option<String>,
    /// (user, Kafka mechanism type) -> credential.
    scram: BTreeMap<(String, i8), UserScramCredential>,
    acls: BTreeSet<AclRecord>,
    /// Client quotas: entity -> key -> the value's `f64::to_bits`.
    client_quotas: BTreeMap<Vec<QuotaEntityPart>, BTreeMap<String, u64>>,
}

/// The snapshot form of `ClusterState` (plain vectors: simple to archive).
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub(crate) struct StateImage {
    pub(crate) nodes: Vec<NodeState>,
    pub(crate) topics: Vec<TopicState>,
    pub(crate) configs: Vec<(ConfigResource, Vec<(String, String)>)>,
    pub(crate) broker_epoch_max: i64,
    pub(crate) offset_last: u64,
    pub(crate) cluster_id: Option<String>,
    pub(crate) scram_credentials: Vec<UserScramCredential>,
    pub(crate) acls: Vec<AclRecord>,
    pub(crate) client_quotas: Vec<ClientQuotaRecord>,
}

impl ClusterState {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn nodes(&self) -> impl Iterator<Item = &NodeState> {
        self.nodes.values()
    }

    pub fn node(&self, id: NodeId) -> Option<&NodeState> {
        self.nodes.get(&id)
    }

    pub fn topics(&self) -> impl Iterator<Item = &TopicState> {
        self.topics.values()
    }

    pub fn topic(&self, id: TopicId) -> Option<&TopicState> {
        self.topics.get(&id)
    }

    pub fn topic_by_name(&self, name: &str) -> Option<&TopicState> {
        self.topic_ids.get(name).and_then(|id| self.topics.get(id))
    }

    pub fn partition(&self, topic: TopicId, index: u32) -> Option<&PartitionState> {
        self.topics.get(&topic)?.partitions.get(&index)
    }

    /// Every partition: (topic id, index, state), in order.
    pub fn partitions(&self) -> impl Iterator<Item = (TopicId, u32, &PartitionState)> {
        self.topics
            .values()
            .flat_map(|t| t.partitions.iter().map(|(i, p)| (t.topic_id, *i, p)))
    }

    /// A config of a resource; a topic's come from its `TopicState::configs`.
    /// Every config set on a node or cluster-wide (topics keep theirs in
    /// `TopicState`).
    pub fn resource_configs(&self) -> impl Iterator<Item = (&ConfigResource, &str, &str)> {
        self.configs
            .iter()
            .flat_map(|(r, m)| m.iter().map(move |(k, v)| (r, k.as_str(), v.as_str())))
    }

    pub fn config(&self, resource: &ConfigResource, name: &str) -> Option<&str> {
        if let ConfigResource::Topic(topic) = resource {
            return self.topic_by_name(topic)?.config(name);
        }
        self.configs.get(resource)?.get(name).map(String::as_str)
    }

    pub fn broker_epoch_max(&self) -> i64 {
        self.broker_epoch_max
    }

    pub fn offset_last(&self) -> u64 {
        self.offset_last
    }

    /// Partitions the node leads.
    pub fn leader_count(&self, node: NodeId) -> usize {
        self.partitions()
            .filter(|(_, _, p)| p.leader == node)
            .count()
    }

    /// Applies one batch (one log entry at `offset`). Records that are refused are
    /// returned with their error; the others apply. Deterministic.
    pub fn apply_batch(
        &mut self,
        offset: u64,
        records: &[MetadataRecord],
    ) -> Vec<(usize, ApplyError)> {
        let mut refused = Vec::new();
        for (i, r) in records.iter().enumerate() {
            if let Err(e) = self.apply(offset, r) {
                refused.push((i, e));
            }
        }
        self.offset_last = self.offset_last.max(offset);
        refused
    }

    /// Applies one record written at `offset`. On error the state is unchanged.
    pub fn apply(&mut self, offset: u64, record: &MetadataRecord) -> Result<(), ApplyError> {
        match record {
            MetadataRecord::RegisterNode(r) => self.apply_register(offset, r),
            MetadataRecord::NodeRegistrationChange(r) => self.apply_registration_change(r),
            MetadataRecord::Topic(t) => {
                if self.topic_ids.contains_key(&t.name) || self.topics.contains_key(&t.topic_id) {
                    return Err(ApplyError::TopicExists(t.name.clone()));
                }
                let mut configs = t.configs.clone();
                configs.sort();
                self.topic_ids.insert(t.name.clone(), t.topic_id);
                self.topics.insert(
                    t.topic_id,
                    TopicState {
                        name: t.name.clone(),
                        topic_id: t.topic_id,
                        configs,
                        partition_count: t.partitions,
                        partitions: BTreeMap::new(),
                    },
                );
                Ok(())
            }
            MetadataRecord::RemoveTopic(r) => {
                let topic = self
                    .topics
                    .remove(&r.topic_id)
                    .ok_or(ApplyError::UnknownTopic(r.topic_id))?;
                self.topic_ids.remove(&topic.name);
                self.configs
                    .remove(&ConfigResource::Topic(topic.name.clone()));
                Ok(())
            }
            MetadataRecord::Partition(p) => {
                let topic = self
                    .topics
                    .get_mut(&p.topic_id)
                    .ok_or(ApplyError::UnknownTopic(p.topic_id))?;
                // The next index adds a partition (CreatePartitions); a gap
                // is refused.
                if p.index > topic.partition_count {
                    return Err(ApplyError::UnknownPartition {
                        topic: p.topic_id,
                        index: p.index,
                    });
                }
                if topic.partitions.contains_key(&p.index) {
                    return Err(ApplyError::PartitionExists {
                        topic: p.topic_id,
                        index: p.index,
                    });
                }
                let state = PartitionState {
                    replicas: p.replicas.clone(),
                    isr: p.isr.clone(),
                    leader: p.leader,
                    leader_epoch: p.leader_epoch,
                    partition_epoch: p.partition_epoch,
                    adding: Vec::new(),
                    removing: Vec::new(),
                };
                state
                    .check()
                    .map_err(|reason| ApplyError::InvalidPartition {
                        topic: p.topic_id,
                        index: p.index,
                        reason,
                    })?;
                if p.index == topic.partition_count {
                    topic.partition_count += 1;
                }
                topic.partitions.insert(p.index, state);
                Ok(())
            }
            MetadataRecord::PartitionChange(c) => self.apply_partition_change(c),
            MetadataRecord::Config(c) => {
                if let ConfigResource::Topic(name) = &c.resource {
                    // A topic's overrides live in its `TopicState` (one place).
                    let topic = self
                        .topic_ids
                        .get(name)
                        .and_then(|id| self.topics.get_mut(id))
                        .ok_or_else(|| ApplyError::UnknownTopicName(name.clone()))?;
                    set_config(&mut topic.configs, &c.name, c.value.as_deref());
                    return Ok(());
                }
                let entry = self.configs.entry(c.resource.clone()).or_default();
                match &c.value {
                    Some(v) => {
                        entry.insert(c.name.clone(), v.clone());
                    }
                    None => {
                        entry.remove(&c.name);
                    }
                }
                if entry.is_empty() {
                    self.configs.remove(&c.resource);
                }
                Ok(())
            }
            MetadataRecord::UnregisterNode(u) => {
                if self.nodes.remove(&u.node_id).is_none() {
                    return Err(ApplyError::UnknownNode(u.node_id));
                }
                Ok(())
            }
            MetadataRecord::UserScramCredential(c) => {
                if c.name.is_empty() || !(1..=2).contains(&c.mechanism) {
                    return Err(ApplyError::InvalidCredential {
                        name: c.name.clone(),
                        mechanism: c.mechanism,
                    });
                }
                self.scram.insert((c.name.clone(), c.mechanism), c.clone());
                Ok(())
            }
            MetadataRecord::RemoveUserScramCredential(r) => {
                match self.scram.remove(&(r.name.clone(), r.mechanism)) {
                    Some(_) => Ok(()),
                    None => Err(ApplyError::UnknownCredential {
                        name: r.name.clone(),
                        mechanism: r.mechanism,
                    }),
                }
            }
            MetadataRecord::Acl(a) => {
                self.acls.insert(a.clone());
                Ok(())
            }
            MetadataRecord::RemoveAcl(a) => {
                self.acls.remove(a);
                Ok(())
            }
            MetadataRecord::ClientQuota(q) => {
                match q.value_bits {
                    Some(bits) => {
                        self.client_quotas
                            .entry(q.entity.clone())
                            .or_default()
                            .insert(q.key.clone(), bits);
                    }
                    None => {
                        if let Some(keys) = self.client_quotas.get_mut(&q.entity) {
                            keys.remove(&q.key);
                            if keys.is_empty() {
                                self.client_quotas.remove(&q.entity);
                            }
                        }
                    }
                }
                Ok(())
            }
            MetadataRecord::ClusterId(c) => match &self.cluster_id {
                Some(id) if *id != c.cluster_id => Err(ApplyError::ClusterIdSet(id.clone())),
                _ => {
                    self.cluster_id = Some(c.cluster_id.clone());
                    Ok(())
                }
            },
        }
    }

    /// The cluster's id, once the first active controller has chosen it.
    pub fn cluster_id(&self) -> Option<&str> {
        self.cluster_id.as_deref()
    }

    /// Every user's SCRAM credentials, by user then mechanism type.
    pub fn scram_credentials(&self) -> impl Iterator<Item = &UserScramCredential> {
        self.scram.values()
    }

    pub fn scram_credential(&self, name: &str, mechanism: i8) -> Option<&UserScramCredential> {
        self.scram.get(&(name.to_string(), mechanism))
    }

    pub fn acls(&self) -> &BTreeSet<AclRecord> {
        &self.acls
    }

    /// Every client quota: (entity, key, value), by entity then key.
    pub fn client_quotas(&self) -> impl Iterator<Item = (&[QuotaEntityPart], &str, f64)> {
        self.client_quotas.iter().flat_map(|(entity, keys)| {
            keys.iter()
                .map(move |(k, bits)| (entity.as_slice(), k.as_str(), f64::from_bits(*bits)))
        })
    }

    /// The quotas of one entity, by key.
    pub fn client_quota(&self, entity: &[QuotaEntityPart], key: &str) -> Option<f64> {
        self.client_quotas
            .get(entity)?
            .get(key)
            .map(|bits| f64::from_bits(*bits))
    }

    fn apply_register(&mut self, offset: u64, r: &RegisterNode) -> Result<(), ApplyError> {
        if let Some(old) = self.nodes.get(&r.node_id) {
            if r.broker_epoch <= old.broker_epoch {
                return Err(ApplyError::StaleBrokerEpoch {
                    node: r.node_id,
                    got: r.broker_epoch,
                    current: old.broker_epoch,
                });
            }
        }
        self.broker_epoch_max = self.broker_epoch_max.max(r.broker_epoch);
        self.nodes.insert(
            r.node_id,
            NodeState {
                node_id: r.node_id,
                incarnation_id: r.incarnation_id,
                broker_epoch: r.broker_epoch,
                endpoints: r.endpoints.clone(),
                rack: r.rack.clone(),
                fenced: true,
                in_controlled_shutdown: false,
                registered_offset: offset,
            },
        );
        Ok(())
    }

    fn apply_registration_change(&mut self, r: &NodeRegistrationChange) -> Result<(), ApplyError> {
        let node = self
            .nodes
            .get_mut(&r.node_id)
            .ok_or(ApplyError::UnknownNode(r.node_id))?;
        if node.broker_epoch != r.broker_epoch {
            return Err(ApplyError::StaleBrokerEpoch {
                node: r.node_id,
                got: r.broker_epoch,
                current: node.broker_epoch,
            });
        }
        match r.change {
            RegistrationChange::Fenced => node.fenced = true,
            RegistrationChange::Unfenced => {
                node.fenced = false;
                node.in_controlled_shutdown = false;
            }
            RegistrationChange::ControlledShutdown => node.in_controlled_shutdown = true,
        }
        Ok(())
    }

    fn apply_partition_change(&mut self, c: &PartitionChange) -> Result<(), ApplyError> {
        let current = self
            .partition(c.topic_id, c.index)
            .ok_or(ApplyError::UnknownPartition {
                topic: c.topic_id,
                index: c.index,
            })?;
        let leader_changes = c.leader.is_some_and(|l| l != current.leader);
        // A replica leaving the partition is fenced by a new leader epoch (its
        // fetches and any leadership it still believes in become stale).
        let replica_leaves = c
            .replicas
            .as_ref()
            .is_some_and(|set| current.replicas.iter().any(|r| !set.replicas.contains(r)));
        let epochs_ok = c.partition_epoch > current.partition_epoch
            && c.leader_epoch >= current.leader_epoch
            && (!(leader_changes || replica_leaves) || c.leader_epoch > current.leader_epoch);
        if !epochs_ok {
            return Err(ApplyError::EpochNotIncreasing {
                topic: c.topic_id,
                index: c.index,
                leader_epoch: c.leader_epoch,
                partition_epoch: c.partition_epoch,
            });
        }
        let mut next = current.clone();
        if let Some(isr) = &c.isr {
            next.isr = isr.clone();
        }
        if let Some(leader) = c.leader {
            next.leader = leader;
        }
        if let Some(ReplicaSet {
            replicas,
            adding,
            removing,
        }) = &c.replicas
        {
            next.replicas = replicas.clone();
            next.adding = adding.clone();
            next.removing = removing.clone();
        }
        next.leader_epoch = c.leader_epoch;
        next.partition_epoch = c.partition_epoch;
        next.check()
            .map_err(|reason| ApplyError::InvalidPartition {
                topic: c.topic_id,
                index: c.index,
                reason,
            })?;
        if let Some(slot) = self
            .topics
            .get_mut(&c.topic_id)
            .and_then(|t| t.partitions.get_mut(&c.index))
        {
            *slot = next;
        }
        Ok(())
    }

    /// The state as snapshot bytes (version byte + rkyv), see `from_snapshot`.
    pub fn to_snapshot(&self) -> Vec<u8> {
        let image = StateImage {
            nodes: self.nodes.values().cloned().collect(),
            topics: self.topics.values().cloned().collect(),
            configs: self
                .configs
                .iter()
                .map(|(r, m)| {
                    (
                        r.clone(),
                        m.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
                    )
                })
                .collect(),
            broker_epoch_max: self.broker_epoch_max,
            offset_last: self.offset_last,
            cluster_id: self.cluster_id.clone(),
            scram_credentials: self.scram.values().cloned().collect(),
            acls: self.acls.iter().cloned().collect(),
            client_quotas: self
                .client_quotas
                .iter()
                .flat_map(|(entity, keys)| {
                    keys.iter().map(move |(key, bits)| ClientQuotaRecord {
                        entity: entity.clone(),
                        key: key.clone(),
                        value_bits: Some(*bits),
                    })
                })
                .collect(),
        };
        records::encode_versioned(&image)
    }

    pub fn from_snapshot(bytes: &[u8]) -> Result<Self, RecordError> {
        let image: StateImage = records::decode_versioned::<
            StateImage,
            crate::format_v1::StateImageV1,
            crate::format_v2::StateImageV2,
            crate::format_v3::StateImageV3,
        >(bytes)?;
        let mut state = ClusterState {
            broker_epoch_max: image.broker_epoch_max,
            offset_last: image.offset_last,
            cluster_id: image.cluster_id,
            scram: image
                .scram_credentials
                .into_iter()
                .map(|c| ((c.name.clone(), c.mechanism), c))
                .collect(),
            acls: image.acls.into_iter().collect(),
            ..Default::default()
        };
        for q in image.client_quotas {
            if let Some(bits) = q.value_bits {
                state
                    .client_quotas
                    .entry(q.entity)
                    .or_default()
                    .insert(q.key, bits);
            }
        }
        for n in image.nodes {
            state.nodes.insert(n.node_id, n);
        }
        for t in image.topics {
            for (i, p) in &t.partitions {
                p.check()
                    .map_err(|e| RecordError::Malformed(format!("partition {}: {e}", i)))?;
            }
            state.topic_ids.insert(t.name.clone(), t.topic_id);
            state.topics.insert(t.topic_id, t);
        }
        for (r, entries) in image.configs {
            if let ConfigResource::Topic(name) = &r {
                // Images written before topic configs moved into `TopicState`
                // kept them here: fold them in (dropped with an unknown topic,
                // as applying them now would be).
                let topic = state
                    .topic_ids
                    .get(name)
                    .and_then(|id| state.topics.get_mut(id));
                if let Some(topic) = topic {
                    for (k, v) in &entries {
                        set_config(&mut topic.configs, k, Some(v));
                    }
                }
                continue;
            }
            state.configs.insert(r, entries.into_iter().collect());
        }
        Ok(state)
    }
}

/// Sets or removes `name` in a sorted list of config overrides.
fn set_config(configs: &mut Vec<(String, String)>, name: &str, value: Option<&str>) {
    let at = configs.binary_search_by(|(k, _)| k.as_str().cmp(name));
    match (at, value) {
        (Ok(i), Some(v)) => configs[i].1 = v.to_string(),
        (Err(i), Some(v)) => configs.insert(i, (name.to_string(), v.to_string())),
        (Ok(i), None) => {
            configs.remove(i);
        }
        (Err(_), None) => {}
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::records::tests::{sample_records, tid};
    use crate::records::{Partition, Topic};

    fn register(id: NodeId, epoch: i64) -> MetadataRecord {
        MetadataRecord::RegisterNode(RegisterNode {
            node_id: id,
            incarnation_id: [id as u8; 16],
            broker_epoch: epoch,
            endpoints: vec![],
            rack: None,
        })
    }

    fn topic_with_partition() -> Vec<MetadataRecord> {
        vec![
            MetadataRecord::Topic(Topic {
                name: "t".into(),
                topic_id: tid(1),
                partitions: 1,
                configs: vec![],
            }),
            MetadataRecord::Partition(Partition {
                topic_id: tid(1),
                index: 0,
                replicas: vec![1, 2],
                isr: vec![1, 2],
                leader: 1,
                leader_epoch: 0,
                partition_epoch: 0,
            }),
        ]
    }

    #[test]
    fn cluster_id_is_set_once_and_kept_by_snapshots() {
        let id = |s: &str| {
            MetadataRecord::ClusterId(crate::records::ClusterIdentity {
                cluster_id: s.into(),
            })
        };
        let mut state = ClusterState::new();
        assert_eq!(state.cluster_id(), None);
        state.apply(1, &id("AAAAAAAAAAAAAAAAAAAAAA")).unwrap();
        // The same id again is harmless; another is refused, the first stays.
        state.apply(2, &id("AAAAAAAAAAAAAAAAAAAAAA")).unwrap();
        assert_eq!(
            state.apply(3, &id("BBBBBBBBBBBBBBBBBBBBBB")),
            Err(ApplyError::ClusterIdSet("AAAAAAAAAAAAAAAAAAAAAA".into()))
        );
        let restored = ClusterState::from_snapshot(&state.to_snapshot()).unwrap();
        assert_eq!(restored.cluster_id(), Some("AAAAAAAAAAAAAAAAAAAAAA"));
    }

    #[test]
    fn registration_starts_fenced_and_stale_epochs_are_refused() {
        let mut s = ClusterState::new();
        s.apply(5, &register(1, 5)).unwrap();
        let n = s.node(1).unwrap();
        assert!(n.fenced);
        assert_eq!(n.registered_offset, 5);
        assert_eq!(
            s.apply(6, &register(1, 5)),
            Err(ApplyError::StaleBrokerEpoch {
                node: 1,
                got: 5,
                current: 5
            })
        );
        let unfence = |epoch| {
            MetadataRecord::NodeRegistrationChange(NodeRegistrationChange {
                node_id: 1,
                broker_epoch: epoch,
                change: RegistrationChange::Unfenced,
            })
        };
        assert!(s.apply(7, &unfence(4)).is_err());
        s.apply(7, &unfence(5)).unwrap();
        assert!(!s.node(1).unwrap().fenced);
        assert_eq!(s.broker_epoch_max(), 5);
    }

    #[test]
    fn partition_changes_need_growing_epochs_and_keep_invariants() {
        let mut s = ClusterState::new();
        assert!(s.apply_batch(1, &topic_with_partition()).is_empty());
        let change = |isr: Option<Vec<NodeId>>, leader, le, pe| {
            MetadataRecord::PartitionChange(PartitionChange {
                topic_id: tid(1),
                index: 0,
                isr,
                leader,
                leader_epoch: le,
                partition_epoch: pe,
                replicas: None,
            })
        };
        // Same partition epoch: refused.
        assert!(s.apply(2, &change(Some(vec![1]), None, 0, 0)).is_err());
        // Leader change without a leader epoch bump: refused.
        assert!(s.apply(2, &change(None, Some(2), 0, 1)).is_err());
        // Leader outside the ISR: refused, state unchanged.
        let before = s.clone();
        assert!(s.apply(2, &change(Some(vec![1]), Some(2), 1, 1)).is_err());
        assert_eq!(s, before);
        // Empty ISR: refused.
        assert!(s
            .apply(2, &change(Some(vec![]), Some(NO_LEADER), 1, 1))
            .is_err());
        s.apply(2, &change(Some(vec![2]), Some(2), 1, 1)).unwrap();
        let p = s.partition(tid(1), 0).unwrap();
        assert_eq!(
            (p.leader, p.isr.clone(), p.leader_epoch, p.partition_epoch),
            (2, vec![2], 1, 1)
        );
    }

    #[test]
    fn topics_and_configs_apply_and_remove() {
        let mut s = ClusterState::new();
        s.apply_batch(1, &topic_with_partition());
        assert_eq!(s.topic_by_name("t").unwrap().partitions.len(), 1);
        assert!(matches!(
            s.apply(2, &topic_with_partition()[0]),
            Err(ApplyError::TopicExists(_))
        ));
        // A partition index past the next one is refused (the next one adds a
        // partition: CreatePartitions).
        let mut extra = topic_with_partition()[1].clone();
        if let MetadataRecord::Partition(p) = &mut extra {
            p.index = 2;
        }
        assert!(s.apply(2, &extra).is_err());
        assert_eq!(s.topic_by_name("t").unwrap().partition_count, 1);
        let set = MetadataRecord::Config(crate::records::Config {
            resource: ConfigResource::Topic("t".into()),
            name: "retention.ms".into(),
            value: Some("5".into()),
        });
        s.apply(3, &set).unwrap();
        assert_eq!(
            s.config(&ConfigResource::Topic("t".into()), "retention.ms"),
            Some("5")
        );
        // The topic's overrides live in its TopicState, sorted.
        let topic_config = |name: &str, value: Option<&str>| {
            MetadataRecord::Config(crate::records::Config {
                resource: ConfigResource::Topic("t".into()),
                name: name.into(),
                value: value.map(str::to_string),
            })
        };
        s.apply(3, &topic_config("cleanup.policy", Some("compact")))
            .unwrap();
        assert_eq!(
            s.topic_by_name("t").unwrap().configs,
            vec![
                ("cleanup.policy".to_string(), "compact".to_string()),
                ("retention.ms".to_string(), "5".to_string()),
            ]
        );
        s.apply(3, &topic_config("cleanup.policy", None)).unwrap();
        assert_eq!(s.topic_by_name("t").unwrap().config("cleanup.policy"), None);
        let unknown = MetadataRecord::Config(crate::records::Config {
            resource: ConfigResource::Topic("nope".into()),
            name: "retention.ms".into(),
            value: Some("1".into()),
        });
        let before = s.clone();
        assert_eq!(
            s.apply(3, &unknown),
            Err(ApplyError::UnknownTopicName("nope".into()))
        );
        assert_eq!(s, before);
        let back = ClusterState::from_snapshot(&s.to_snapshot()).unwrap();
        assert_eq!(back, s);
        s.apply(
            4,
            &MetadataRecord::RemoveTopic(crate::records::RemoveTopic { topic_id: tid(1) }),
        )
        .unwrap();
        assert!(s.topic_by_name("t").is_none());
        assert_eq!(
            s.config(&ConfigResource::Topic("t".into()), "retention.ms"),
            None
        );
    }

    #[test]
    fn snapshot_round_trips() {
        let mut s = ClusterState::new();
        s.apply_batch(1, &[register(1, 1), register(2, 2)]);
        s.apply_batch(2, &topic_with_partition());
        s.apply_batch(3, &sample_records());
        let bytes = s.to_snapshot();
        let back = ClusterState::from_snapshot(&bytes).unwrap();
        assert_eq!(back, s);
        assert!(ClusterState::from_snapshot(&bytes[..bytes.len() / 2]).is_err());
    }
}
