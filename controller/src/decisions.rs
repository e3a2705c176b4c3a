//! The active controller's decisions: state (and time) in, records out.
//!
//! Every function here reads a `ClusterState` and returns the records that carry
//! out the decision; nothing is changed until the caller has the records
//! committed through Raft and applied. No I/O, no clock (time is an argument), no
//! randomness (topic ids and the assignment start index are arguments), so every
//! rule is tested without a quorum.
//!
//! Decisions are made against the state the caller passes. When requests are
//! pipelined the caller passes the committed state plus its own proposals that
//! are still in flight (as Kafka's controller does), so two decisions do not build
//! on the same stale epoch; a record that was built on a stale state anyway is
//! refused by `ClusterState::apply` on every replica alike.
//!
//! The rules follow Kafka's KRaft controller:
//! - a fenced, shutting-down or restarted (new incarnation) node leads nothing: its
//!   leaderships move to the first eligible ISR member in replica order (leader
//!   epoch + 1), and it leaves every ISR that has other members;
//! - with no eligible ISR member the partition is offline (`NO_LEADER`), unless
//!   `unclean.leader.election.enable` lets the first eligible replica lead alone;
//! - a fenced node is unfenced once its heartbeat reports a metadata offset at or
//!   past its own registration, and then takes offline partitions it can lead;
//! - every change bumps the partition epoch; AlterPartition must name the current
//!   leader epoch and partition epoch;
//! - a reassignment (KIP-455) adds its new replicas first; it completes in the
//!   change that brings every target replica into the ISR: the removed replicas
//!   leave (leader epoch + 1), and a removed leader hands over to the first
//!   target replica in the ISR.

use std::collections::{BTreeMap, BTreeSet};

use rkyv::{Archive, Deserialize, Serialize};

use crate::records::{
    Config, ConfigResource, Endpoint, MetadataRecord, NodeId, NodeRegistrationChange, Partition,
    PartitionChange, RegisterNode, RegistrationChange, RemoveTopic, ReplicaSet, Topic, TopicId,
    UnregisterNode, NO_LEADER,
};
use crate::state::{ClusterState, PartitionState};

pub const UNCLEAN_LEADER_ELECTION: &str = "unclean.leader.election.enable";
/// Kafka's limit on topic name length.
pub const TOPIC_NAME_BYTES_MAX: usize = 249;
/// Upper bound on partitions per CreateTopics request (one metadata batch).
pub const TOPIC_PARTITIONS_MAX: i32 = 10_000;

/// The controller's settings (Kafka's names).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControllerConfig {
    /// `broker.heartbeat.interval.ms`: how often nodes are told to heartbeat.
    pub heartbeat_interval_ms: u64,
    /// `broker.session.timeout.ms`: a node silent this long is fenced.
    pub session_timeout_ms: u64,
    /// `unclean.leader.election.enable`: cluster default; topics may override it.
    pub unclean_leader_election: bool,
    /// `auto.leader.rebalance.enable`: move leaderships back to preferred
    /// replicas when a node's imbalance passes `leader_imbalance_percentage`.
    pub auto_leader_rebalance: bool,
    /// `leader.imbalance.check.interval.seconds`, in ms.
    pub leader_imbalance_check_interval_ms: u64,
    /// `leader.imbalance.per.broker.percentage`.
    pub leader_imbalance_percentage: u32,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        Self {
            heartbeat_interval_ms: 2000,
            session_timeout_ms: 9000,
            unclean_leader_election: false,
            auto_leader_rebalance: true,
            leader_imbalance_check_interval_ms: 300_000,
            leader_imbalance_percentage: 10,
        }
    }
}

/// Why a request was refused; each maps to the Kafka error code a client sees.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum ControllerError {
    #[error("node {0} is not registered")]
    BrokerIdNotRegistered(NodeId),
    #[error("node {node}: broker epoch {got} is stale (current {current})")]
    StaleBrokerEpoch {
        node: NodeId,
        got: i64,
        current: i64,
    },
    #[error("topic {0} already exists")]
    TopicAlreadyExists(String),
    #[error("unknown topic or partition")]
    UnknownTopicOrPartition,
    #[error("invalid topic name {name:?}: {reason}")]
    InvalidTopic { name: String, reason: &'static str },
    #[error("invalid partition count {0}")]
    InvalidPartitions(i32),
    #[error(
        "replication factor {requested} needs that many unfenced nodes; {available} available"
    )]
    InvalidReplicationFactor { requested: i16, available: usize },
    #[error("leader epoch {request} is older than the current {current}")]
    FencedLeaderEpoch { request: i32, current: i32 },
    #[error("leader epoch {request} is newer than this controller's {current}")]
    NotController { request: i32, current: i32 },
    #[error("partition epoch {request} does not match the current {current}")]
    InvalidUpdateVersion { request: i32, current: i32 },
    #[error("ISR would contain ineligible replicas {0:?} (fenced, shutting down or not replicas)")]
    IneligibleReplica(Vec<NodeId>),
    #[error(
        "topic {topic} has {current} partitions; the new count must be higher, not {requested}"
    )]
    PartitionCountNotHigher {
        topic: String,
        current: u32,
        requested: i32,
    },
    #[error("invalid replica assignment: {0}")]
    InvalidReplicaAssignment(String),
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error("no reassignment is in progress")]
    NoReassignmentInProgress,
    #[error("unknown SCRAM mechanism type {0}")]
    UnsupportedSaslMechanism(i8),
    #[error("{0}")]
    UnacceptableCredential(String),
    #[error("{0}")]
    ResourceNotFound(String),
    #[error("{0}")]
    DuplicateResource(String),
}

impl ControllerError {
    /// The Kafka protocol error code.
    pub fn kafka_code(&self) -> i16 {
        match self {
            ControllerError::UnknownTopicOrPartition => 3,
            ControllerError::InvalidTopic { .. } => 17,
            ControllerError::TopicAlreadyExists(_) => 36,
            ControllerError::InvalidPartitions(_)
            | ControllerError::PartitionCountNotHigher { .. } => 37,
            ControllerError::InvalidReplicationFactor { .. } => 38,
            ControllerError::InvalidReplicaAssignment(_) => 39,
            ControllerError::NotController { .. } => 41,
            ControllerError::InvalidRequest(_) => 42,
            ControllerError::FencedLeaderEpoch { .. } => 74,
            ControllerError::StaleBrokerEpoch { .. } => 77,
            ControllerError::InvalidUpdateVersion { .. } => 95,
            ControllerError::BrokerIdNotRegistered(_) => 102,
            ControllerError::IneligibleReplica(_) => 107,
            ControllerError::NoReassignmentInProgress => 85,
            ControllerError::UnsupportedSaslMechanism(_) => 33,
            ControllerError::ResourceNotFound(_) => 91,
            ControllerError::DuplicateResource(_) => 92,
            ControllerError::UnacceptableCredential(_) => 93,
        }
    }
}

/// The controller's in-memory record of heartbeats (not in the log, as in Kafka:
/// a new active controller gives every node a fresh session).
#[derive(Debug, Clone, Default)]
pub struct Sessions {
    last_heartbeat_ms: BTreeMap<NodeId, u64>,
}

impl Sessions {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn touch(&mut self, node: NodeId, now_ms: u64) {
        self.last_heartbeat_ms.insert(node, now_ms);
    }

    /// The controller's own thread stood still for `stalled_ms` (its ticks
    /// came that late: a blocked disk, a starved CPU, a SIGSTOP). Heartbeats
    /// that arrived meanwhile wait unread in its sockets, so no session runs
    /// out on that time: each is moved on by the stall, never past `now_ms`.
    pub fn excuse(&mut self, stalled_ms: u64, now_ms: u64) {
        for last in self.last_heartbeat_ms.values_mut() {
            *last = last.saturating_add(stalled_ms).min(now_ms).max(*last);
        }
    }

    /// Forget nodes that no longer exist.
    pub fn retain_registered(&mut self, state: &ClusterState) {
        self.last_heartbeat_ms
            .retain(|id, _| state.node(*id).is_some());
    }

    /// Unfenced nodes whose session has expired, in id order. A node the
    /// controller has not heard from since it became active gets a session
    /// starting now.
    pub fn expired(
        &mut self,
        state: &ClusterState,
        now_ms: u64,
        config: &ControllerConfig,
    ) -> Vec<NodeId> {
        let mut out = Vec::new();
        for node in state.nodes().filter(|n| !n.fenced) {
            let last = *self.last_heartbeat_ms.entry(node.node_id).or_insert(now_ms);
            if now_ms.saturating_sub(last) > config.session_timeout_ms {
                out.push(node.node_id);
            }
        }
        out
    }
}

/// A node's registration request.
#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct Registration {
    pub node_id: NodeId,
    pub incarnation_id: [u8; 16],
    pub endpoints: Vec<Endpoint>,
    pub rack: Option<String>,
}

/// A node's heartbeat.
#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct Heartbeat {
    pub node_id: NodeId,
    pub broker_epoch: i64,
    /// The highest metadata log offset the node has applied.
    pub metadata_offset: u64,
    pub want_fence: bool,
    pub want_shutdown: bool,
    /// Partitions whose local log is offline on the node (a failed write or
    /// fdatasync: Kafka's offline log directory, KIP-858 in KRaft): the
    /// controller moves their leadership away and takes the node out of
    /// their ISRs, as for a fenced node, partition by partition.
    pub offline_partitions: Vec<(TopicId, u32)>,
}

/// What the heartbeat's sender is told (computed after the decision's records
/// have been applied).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct HeartbeatReply {
    pub is_fenced: bool,
    pub in_controlled_shutdown: bool,
    /// Controlled shutdown is done: the node leads nothing and may stop.
    pub should_shut_down: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct CreateTopic {
    pub name: String,
    /// Chosen by the caller (random in the node).
    pub topic_id: TopicId,
    pub partitions: i32,
    pub replication_factor: i16,
    pub configs: Vec<(String, String)>,
    /// Where the round-robin assignment starts (random in the node, as in Kafka).
    pub start_index: usize,
}

/// An AlterPartition request from a partition leader (an ISR change).
#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct AlterPartition {
    pub node_id: NodeId,
    pub broker_epoch: i64,
    pub topic_id: TopicId,
    pub index: u32,
    pub leader_epoch: i32,
    pub partition_epoch: i32,
    pub new_isr: Vec<NodeId>,
}

fn is_eligible(state: &ClusterState, node: NodeId) -> bool {
    state.node(node).is_some_and(|n| n.is_eligible())
}

fn unclean_allowed(state: &ClusterState, topic: TopicId, config: &ControllerConfig) -> bool {
    let topic_value = state
        .topic(topic)
        .and_then(|t| t.config(UNCLEAN_LEADER_ELECTION));
    let cluster_value = state.config(&ConfigResource::Cluster, UNCLEAN_LEADER_ELECTION);
    match topic_value.or(cluster_value) {
        Some(v) => v.eq_ignore_ascii_case("true"),
        None => config.unclean_leader_election,
    }
}

/// The change that makes a partition consistent with `eligible`: ineligible
/// members leave the ISR (never emptying it), an ineligible leader is replaced by
/// the first eligible ISR member in replica order (or, if allowed, an eligible
/// replica alone), an offline partition gets a leader if one is eligible now.
fn rebalance_partition(
    topic_id: TopicId,
    index: u32,
    p: &PartitionState,
    eligible: &dyn Fn(NodeId) -> bool,
    unclean: bool,
) -> Option<PartitionChange> {
    let kept: Vec<NodeId> = p.isr.iter().copied().filter(|n| eligible(*n)).collect();
    let mut isr = if kept.is_empty() {
        // Keep the last member(s): they hold the data and may come back.
        p.isr.clone()
    } else {
        kept
    };
    let mut leader = if p.leader != NO_LEADER && eligible(p.leader) {
        p.leader
    } else {
        p.replicas
            .iter()
            .copied()
            .find(|r| isr.contains(r) && eligible(*r))
            .unwrap_or(NO_LEADER)
    };
    if leader == NO_LEADER && unclean {
        // A replica a reassignment is still adding may hold nothing yet:
        // the replicas that were there before go first.
        let by_age = p
            .replicas
            .iter()
            .filter(|r| !p.adding.contains(r))
            .chain(p.adding.iter());
        if let Some(r) = by_age.copied().find(|r| eligible(*r)) {
            leader = r;
            isr = vec![r];
        }
    }
    if leader == p.leader && isr == p.isr {
        return None;
    }
    Some(PartitionChange {
        topic_id,
        index,
        isr: (isr != p.isr).then_some(isr),
        leader: (leader != p.leader).then_some(leader),
        leader_epoch: p.leader_epoch + i32::from(leader != p.leader),
        partition_epoch: p.partition_epoch + 1,
        replicas: None,
    })
}

/// Partition changes for every partition `node` leads or is in the ISR of, as if
/// `node` were ineligible.
fn move_away_from(
    state: &ClusterState,
    node: NodeId,
    config: &ControllerConfig,
) -> Vec<MetadataRecord> {
    let eligible = |n: NodeId| n != node && is_eligible(state, n);
    state
        .partitions()
        .filter(|(_, _, p)| p.leader == node || p.isr.contains(&node))
        .filter_map(|(t, i, p)| {
            rebalance_partition(t, i, p, &eligible, unclean_allowed(state, t, config))
        })
        .map(MetadataRecord::PartitionChange)
        .collect()
}

/// Leaders for offline partitions, with `node` counted as eligible (it is being
/// unfenced in the same batch).
fn elect_offline_with(
    state: &ClusterState,
    node: NodeId,
    config: &ControllerConfig,
) -> Vec<MetadataRecord> {
    let eligible = |n: NodeId| n == node || is_eligible(state, n);
    state
        .partitions()
        .filter(|(_, _, p)| p.leader == NO_LEADER && p.replicas.contains(&node))
        .filter_map(|(t, i, p)| {
            rebalance_partition(t, i, p, &eligible, unclean_allowed(state, t, config))
        })
        .map(MetadataRecord::PartitionChange)
        .collect()
}

fn registration_change(
    node: NodeId,
    broker_epoch: i64,
    change: RegistrationChange,
) -> MetadataRecord {
    MetadataRecord::NodeRegistrationChange(NodeRegistrationChange {
        node_id: node,
        broker_epoch,
        change,
    })
}

/// Fences `node`: its leaderships move, it leaves ISRs, then the fence record.
/// Empty if the node is unknown or already fenced.
pub fn fence_node(
    state: &ClusterState,
    node: NodeId,
    config: &ControllerConfig,
) -> Vec<MetadataRecord> {
    let Some(n) = state.node(node).filter(|n| !n.fenced) else {
        return Vec::new();
    };
    let mut out = move_away_from(state, node, config);
    out.push(registration_change(
        node,
        n.broker_epoch,
        RegistrationChange::Fenced,
    ));
    out
}

/// Fences the first node whose session expired. One node per call, as Kafka
/// does: the next call sees the first fence applied, so two nodes expiring
/// together never hand leaderships to each other.
pub fn fence_one_expired(
    state: &ClusterState,
    sessions: &mut Sessions,
    now_ms: u64,
    config: &ControllerConfig,
) -> Vec<MetadataRecord> {
    match sessions.expired(state, now_ms, config).first() {
        Some(&node) => {
            tracing::info!(node, now_ms, "session expired: fencing node");
            fence_node(state, node, config)
        }
        None => Vec::new(),
    }
}

/// Registers a node. The same incarnation registering again is a retry: no
/// records, the current epoch. A new incarnation (the node restarted) gets a new
/// broker epoch, starts fenced, and its leaderships move away first.
/// Returns the records and the node's broker epoch.
pub fn register(
    state: &ClusterState,
    request: &Registration,
    config: &ControllerConfig,
) -> Result<(Vec<MetadataRecord>, i64), ControllerError> {
    if request.node_id < 0 {
        return Err(ControllerError::InvalidRequest(format!(
            "node id {} is negative",
            request.node_id
        )));
    }
    if let Some(n) = state.node(request.node_id) {
        if n.incarnation_id == request.incarnation_id {
            return Ok((Vec::new(), n.broker_epoch));
        }
    }
    let broker_epoch = state.broker_epoch_max() + 1;
    let mut out = if state.node(request.node_id).is_some() {
        move_away_from(state, request.node_id, config)
    } else {
        Vec::new()
    };
    out.push(MetadataRecord::RegisterNode(RegisterNode {
        node_id: request.node_id,
        incarnation_id: request.incarnation_id,
        broker_epoch,
        endpoints: request.endpoints.clone(),
        rack: request.rack.clone(),
    }));
    Ok((out, broker_epoch))
}

/// Handles a heartbeat at `now_ms`: renews the session, and unfences, fences or
/// starts a controlled shutdown as the node's state and request say.
pub fn heartbeat(
    state: &ClusterState,
    sessions: &mut Sessions,
    request: &Heartbeat,
    now_ms: u64,
    config: &ControllerConfig,
) -> Result<Vec<MetadataRecord>, ControllerError> {
    let node = state
        .node(request.node_id)
        .ok_or(ControllerError::BrokerIdNotRegistered(request.node_id))?;
    if node.broker_epoch != request.broker_epoch {
        return Err(ControllerError::StaleBrokerEpoch {
            node: request.node_id,
            got: request.broker_epoch,
            current: node.broker_epoch,
        });
    }
    sessions.touch(request.node_id, now_ms);
    let id = request.node_id;
    if node.fenced {
        let caught_up = request.metadata_offset >= node.registered_offset;
        // A node fenced at the end of its controlled shutdown stays fenced
        // until it registers again (a new incarnation), whatever a late
        // heartbeat of the stopping process says.
        if request.want_fence || request.want_shutdown || !caught_up || node.in_controlled_shutdown
        {
            return Ok(Vec::new());
        }
        tracing::info!(
            node = id,
            offset = request.metadata_offset,
            "node caught up: unfencing"
        );
        let mut out = vec![registration_change(
            id,
            node.broker_epoch,
            RegistrationChange::Unfenced,
        )];
        out.extend(elect_offline_with(state, id, config));
        return Ok(out);
    }
    if request.want_fence {
        return Ok(fence_node(state, id, config));
    }
    if request.want_shutdown && node.in_controlled_shutdown && state.leader_count(id) == 0 {
        // Done: fenced now, as Kafka's controller does, so Metadata stops
        // naming a node that is about to stop (clients would connect to it
        // until its session expired).
        tracing::info!(node = id, "controlled shutdown done: fencing the node");
        return Ok(fence_node(state, id, config));
    }
    let mut out = move_offline_replicas(state, id, &request.offline_partitions, config);
    if request.want_shutdown && !node.in_controlled_shutdown {
        tracing::info!(node = id, "controlled shutdown: moving leaderships away");
        // Every partition moves away: the offline ones are among them.
        out = move_away_from(state, id, config);
        let done = !leads_after(state, id, &out);
        out.push(registration_change(
            id,
            node.broker_epoch,
            RegistrationChange::ControlledShutdown,
        ));
        if done {
            // Every leadership moved in this batch: the node will not
            // heartbeat again (the reply lets it stop), so it is fenced here.
            tracing::info!(node = id, "controlled shutdown done: fencing the node");
            out.push(registration_change(
                id,
                node.broker_epoch,
                RegistrationChange::Fenced,
            ));
        }
    }
    Ok(out)
}

/// Whether `node` still leads a partition once `changes` are applied.
fn leads_after(state: &ClusterState, node: NodeId, changes: &[MetadataRecord]) -> bool {
    state
        .partitions()
        .filter(|(_, _, p)| p.leader == node)
        .any(|(t, i, _)| {
            !changes.iter().any(|r| {
                matches!(r, MetadataRecord::PartitionChange(c)
                    if c.topic_id == t && c.index == i && c.leader.is_some_and(|l| l != node))
            })
        })
}

/// Leaderships and ISR places of `node` for the partitions it reports
/// offline, moved as if `node` were ineligible for them alone. A partition
/// whose ISR is `node` alone is left as it is: nobody else holds its data,
/// and re-electing it from there would only move it back.
fn move_offline_replicas(
    state: &ClusterState,
    node: NodeId,
    offline: &[(TopicId, u32)],
    config: &ControllerConfig,
) -> Vec<MetadataRecord> {
    let eligible = |n: NodeId| n != node && is_eligible(state, n);
    state
        .partitions()
        .filter(|(t, i, _)| offline.contains(&(*t, *i)))
        .filter(|(_, _, p)| p.leader == node || p.isr.contains(&node))
        .filter(|(_, _, p)| p.isr.iter().any(|n| *n != node))
        .filter_map(|(t, i, p)| {
            let change =
                rebalance_partition(t, i, p, &eligible, unclean_allowed(state, t, config))?;
            tracing::warn!(
                node, topic = ?t, partition = i,
                "the node reports its replica offline: moving its leadership and ISR place"
            );
            Some(change)
        })
        .map(MetadataRecord::PartitionChange)
        .collect()
}

/// The heartbeat reply, from the state after the heartbeat's records applied.
pub fn heartbeat_reply(state: &ClusterState, node: NodeId, want_shutdown: bool) -> HeartbeatReply {
    let Some(n) = state.node(node) else {
        return HeartbeatReply {
            is_fenced: true,
            in_controlled_shutdown: false,
            should_shut_down: want_shutdown,
        };
    };
    let leads_nothing = state.leader_count(node) == 0;
    HeartbeatReply {
        is_fenced: n.fenced,
        in_controlled_shutdown: n.in_controlled_shutdown,
        should_shut_down: want_shutdown
            && (n.fenced || (n.in_controlled_shutdown && leads_nothing)),
    }
}

fn check_topic_name(name: &str) -> Result<(), ControllerError> {
    let invalid = |reason| {
        Err(ControllerError::InvalidTopic {
            name: name.to_string(),
            reason,
        })
    };
    if name.is_empty() {
        return invalid("empty");
    }
    if name == "." || name == ".." {
        return invalid("'.' and '..' are not allowed");
    }
    if name.len() > TOPIC_NAME_BYTES_MAX {
        return invalid("longer than 249 characters");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return invalid("only ASCII letters, digits, '.', '_' and '-' are allowed");
    }
    Ok(())
}

/// Creates a topic: the Topic record and one Partition record per partition,
/// replicas assigned over the eligible nodes (rack-aware when every eligible node
/// has a rack), the first replica leading, ISR = replicas.
pub fn create_topic(
    state: &ClusterState,
    request: &CreateTopic,
) -> Result<Vec<MetadataRecord>, ControllerError> {
    check_topic_name(&request.name)?;
    if state.topic_by_name(&request.name).is_some() {
        return Err(ControllerError::TopicAlreadyExists(request.name.clone()));
    }
    if state.topic(request.topic_id).is_some() {
        return Err(ControllerError::InvalidRequest(format!(
            "topic id {} is taken",
            request.topic_id
        )));
    }
    if request.partitions < 1 || request.partitions > TOPIC_PARTITIONS_MAX {
        return Err(ControllerError::InvalidPartitions(request.partitions));
    }
    let nodes: Vec<(NodeId, Option<&str>)> = state
        .nodes()
        .filter(|n| n.is_eligible())
        .map(|n| (n.node_id, n.rack.as_deref()))
        .collect();
    let rf = request.replication_factor;
    if rf < 1 || rf as usize > nodes.len() {
        return Err(ControllerError::InvalidReplicationFactor {
            requested: rf,
            available: nodes.len(),
        });
    }
    let assignment = assign_replicas(
        &nodes,
        request.partitions as usize,
        rf as usize,
        request.start_index,
    );
    let mut configs = request.configs.clone();
    configs.sort();
    let mut out = vec![MetadataRecord::Topic(Topic {
        name: request.name.clone(),
        topic_id: request.topic_id,
        partitions: request.partitions as u32,
        configs,
    })];
    for (index, replicas) in assignment.into_iter().enumerate() {
        out.push(MetadataRecord::Partition(Partition {
            topic_id: request.topic_id,
            index: index as u32,
            leader: replicas[0],
            isr: replicas.clone(),
            replicas,
            leader_epoch: 0,
            partition_epoch: 0,
        }));
    }
    Ok(out)
}

/// Adds partitions to a topic (CreatePartitions): one `Partition` record per new
/// index, from the current count up to `count`. Replicas as many as partition
/// 0 has; `assignments` (one replica list per new partition) or, without them,
/// the round-robin of `assign_replicas` continued from where the topic's
/// creation started it (partition 0's first replica), so the new partitions
/// spread as if the topic had been created with `count`. The ISR is the
/// eligible replicas, the first of them leading; a new partition with no
/// eligible replica is refused.
pub fn create_partitions(
    state: &ClusterState,
    name: &str,
    count: i32,
    assignments: Option<&[Vec<NodeId>]>,
) -> Result<Vec<MetadataRecord>, ControllerError> {
    let topic = state
        .topic_by_name(name)
        .ok_or(ControllerError::UnknownTopicOrPartition)?;
    let current = topic.partition_count;
    if count <= current as i32 {
        return Err(ControllerError::PartitionCountNotHigher {
            topic: name.to_string(),
            current,
            requested: count,
        });
    }
    if count - current as i32 > TOPIC_PARTITIONS_MAX {
        return Err(ControllerError::InvalidPartitions(count));
    }
    let added = (count as u32 - current) as usize;
    let rf = topic
        .partitions
        .get(&0)
        .map_or(1, |p| p.replicas.len())
        .max(1);
    let eligible = |n: NodeId| state.node(n).is_some_and(|n| n.is_eligible());
    let replica_sets: Vec<Vec<NodeId>> = match assignments {
        Some(sets) => {
            if sets.len() != added {
                return Err(ControllerError::InvalidReplicaAssignment(format!(
                    "{} replica lists for {added} new partitions",
                    sets.len()
                )));
            }
            for replicas in sets {
                if replicas.len() != rf {
                    return Err(ControllerError::InvalidReplicaAssignment(format!(
                        "{replicas:?} has {} replicas; the topic's partitions have {rf}",
                        replicas.len()
                    )));
                }
                let distinct: BTreeSet<NodeId> = replicas.iter().copied().collect();
                if distinct.len() != replicas.len() {
                    return Err(ControllerError::InvalidReplicaAssignment(format!(
                        "{replicas:?} names a node twice"
                    )));
                }
                if let Some(unknown) = replicas.iter().find(|n| state.node(**n).is_none()) {
                    return Err(ControllerError::InvalidReplicaAssignment(format!(
                        "node {unknown} is not registered"
                    )));
                }
                if !replicas.iter().any(|n| eligible(*n)) {
                    return Err(ControllerError::InvalidReplicaAssignment(format!(
                        "no replica of {replicas:?} is unfenced to lead"
                    )));
                }
            }
            sets.to_vec()
        }
        None => {
            let nodes: Vec<(NodeId, Option<&str>)> = state
                .nodes()
                .filter(|n| n.is_eligible())
                .map(|n| (n.node_id, n.rack.as_deref()))
                .collect();
            if rf > nodes.len() {
                return Err(ControllerError::InvalidReplicationFactor {
                    requested: rf as i16,
                    available: nodes.len(),
                });
            }
            let mut ids: Vec<NodeId> = nodes.iter().map(|(n, _)| *n).collect();
            ids.sort_unstable();
            let first = topic.partitions.get(&0).and_then(|p| p.replicas.first());
            let start = first
                .and_then(|f| ids.iter().position(|n| n == f))
                .unwrap_or(0);
            let mut all = assign_replicas(&nodes, count as usize, rf, start);
            all.split_off(current as usize)
        }
    };
    Ok(replica_sets
        .into_iter()
        .enumerate()
        .map(|(i, replicas)| {
            let isr: Vec<NodeId> = replicas.iter().copied().filter(|n| eligible(*n)).collect();
            MetadataRecord::Partition(Partition {
                topic_id: topic.topic_id,
                index: current + i as u32,
                leader: isr[0],
                isr,
                replicas,
                leader_epoch: 0,
                partition_epoch: 0,
            })
        })
        .collect())
}

/// Kafka's replica assignment (`AdminUtils.assignReplicasToBrokers`): leaders
/// round-robin from `start_index`, followers shifted so that replicas spread;
/// rack-aware (racks alternate, one replica per rack while racks remain) when
/// every node has a rack. `rf` is capped at the number of nodes (`create_topic`
/// refuses a larger one before it gets here); no nodes, no assignment.
pub fn assign_replicas(
    nodes: &[(NodeId, Option<&str>)],
    partitions: usize,
    rf: usize,
    start_index: usize,
) -> Vec<Vec<NodeId>> {
    if nodes.is_empty() || rf == 0 {
        return Vec::new();
    }
    let rf = rf.min(nodes.len());
    let rack_aware = nodes.iter().all(|(_, r)| r.is_some());
    let (arranged, rack_of): (Vec<NodeId>, BTreeMap<NodeId, &str>) = if rack_aware {
        let racks: BTreeMap<NodeId, &str> =
            nodes.iter().map(|(n, r)| (*n, r.unwrap_or(""))).collect();
        (rack_alternated(&racks), racks)
    } else {
        let mut ids: Vec<NodeId> = nodes.iter().map(|(n, _)| *n).collect();
        ids.sort_unstable();
        (ids, BTreeMap::new())
    };
    let n = arranged.len();
    let rack_count = rack_of.values().collect::<BTreeSet<_>>().len().max(1);
    let start = start_index % n.max(1);
    let mut shift = start;
    let replica_index =
        |first: usize, shift: usize, j: usize| (first + 1 + (shift + j) % (n - 1)) % n;
    let mut out = Vec::with_capacity(partitions);
    for p in 0..partitions {
        if p > 0 && p % n == 0 {
            shift += 1;
        }
        let first = (p + start) % n;
        let mut replicas = vec![arranged[first]];
        if !rack_aware {
            for j in 0..rf - 1 {
                replicas.push(arranged[replica_index(first, shift, j)]);
            }
        } else {
            let mut racks_used: BTreeSet<&str> = BTreeSet::new();
            racks_used.insert(rack_of[&arranged[first]]);
            let mut k = 0;
            while replicas.len() < rf {
                let node = arranged[replica_index(first, shift * rack_count, k)];
                let rack = rack_of[&node];
                let rack_ok = !racks_used.contains(rack) || racks_used.len() == rack_count;
                let node_ok = !replicas.contains(&node) || replicas.len() == n;
                if rack_ok && node_ok {
                    replicas.push(node);
                    racks_used.insert(rack);
                }
                k += 1;
            }
        }
        out.push(replicas);
    }
    out
}

/// Nodes ordered so that racks alternate: first node of each rack (racks
/// sorted), then the second of each, ... (Kafka's `getRackAlternatedBrokerList`).
fn rack_alternated(racks: &BTreeMap<NodeId, &str>) -> Vec<NodeId> {
    let mut by_rack: BTreeMap<&str, std::collections::VecDeque<NodeId>> = BTreeMap::new();
    for (node, rack) in racks {
        by_rack.entry(rack).or_default().push_back(*node);
    }
    let mut out = Vec::with_capacity(racks.len());
    while out.len() < racks.len() {
        for queue in by_rack.values_mut() {
            if let Some(n) = queue.pop_front() {
                out.push(n);
            }
        }
    }
    out
}

pub fn delete_topic(
    state: &ClusterState,
    name: &str,
) -> Result<Vec<MetadataRecord>, ControllerError> {
    let topic = state
        .topic_by_name(name)
        .ok_or(ControllerError::UnknownTopicOrPartition)?;
    Ok(vec![MetadataRecord::RemoveTopic(RemoveTopic {
        topic_id: topic.topic_id,
    })])
}

/// Sets (`Some`) or deletes (`None`) a topic's config overrides: one `Config`
/// record per operation, in request order, for `ConfigResource::Topic(name)`.
/// An unknown topic is refused; no operations, no records.
pub fn alter_topic_configs(
    state: &ClusterState,
    name: &str,
    ops: &[(String, Option<String>)],
) -> Result<Vec<MetadataRecord>, ControllerError> {
    if state.topic_by_name(name).is_none() {
        return Err(ControllerError::UnknownTopicOrPartition);
    }
    let mut out = Vec::with_capacity(ops.len());
    for (key, value) in ops {
        if key.is_empty() {
            return Err(ControllerError::InvalidRequest("empty config name".into()));
        }
        out.push(MetadataRecord::Config(Config {
            resource: ConfigResource::Topic(name.to_string()),
            name: key.clone(),
            value: value.clone(),
        }));
    }
    Ok(out)
}

/// The node configs that can be changed while the cluster runs (Kafka's
/// dynamic broker configs skiff honours): replication throttles, bytes/s.
pub const DYNAMIC_NODE_CONFIGS: &[&str] = &[
    "leader.replication.throttled.rate",
    "follower.replication.throttled.rate",
];

/// Sets (`Some`) or removes (`None`) dynamic node configs: of one node, or
/// (`None`) the cluster-wide default every node falls back to.
pub fn alter_node_configs(
    node: Option<NodeId>,
    ops: &[(String, Option<String>)],
) -> Result<Vec<MetadataRecord>, ControllerError> {
    let resource = match node {
        Some(id) if id < 0 => {
            return Err(ControllerError::InvalidRequest(format!("node id {id}")));
        }
        Some(id) => ConfigResource::Node(id),
        None => ConfigResource::Cluster,
    };
    ops.iter()
        .map(|(key, value)| {
            if !DYNAMIC_NODE_CONFIGS.contains(&key.as_str()) {
                return Err(ControllerError::InvalidRequest(format!(
                    "{key} is not a dynamic node config (those are {})",
                    DYNAMIC_NODE_CONFIGS.join(", ")
                )));
            }
            if let Some(v) = value {
                if !v.parse::<u64>().is_ok_and(|n| n > 0) {
                    return Err(ControllerError::InvalidRequest(format!(
                        "{key} must be a number of bytes per second above 0, got {v:?}"
                    )));
                }
            }
            Ok(MetadataRecord::Config(Config {
                resource: resource.clone(),
                name: key.clone(),
                value: value.clone(),
            }))
        })
        .collect()
}

/// Checks an ISR change from a partition leader against the current epochs and
/// returns the change (empty if the ISR is already what it asks for).
pub fn alter_partition(
    state: &ClusterState,
    request: &AlterPartition,
) -> Result<Vec<MetadataRecord>, ControllerError> {
    let node = state
        .node(request.node_id)
        .ok_or(ControllerError::BrokerIdNotRegistered(request.node_id))?;
    if node.broker_epoch != request.broker_epoch {
        return Err(ControllerError::StaleBrokerEpoch {
            node: request.node_id,
            got: request.broker_epoch,
            current: node.broker_epoch,
        });
    }
    let p = state
        .partition(request.topic_id, request.index)
        .ok_or(ControllerError::UnknownTopicOrPartition)?;
    if request.leader_epoch < p.leader_epoch {
        return Err(ControllerError::FencedLeaderEpoch {
            request: request.leader_epoch,
            current: p.leader_epoch,
        });
    }
    if request.leader_epoch > p.leader_epoch {
        return Err(ControllerError::NotController {
            request: request.leader_epoch,
            current: p.leader_epoch,
        });
    }
    if request.node_id != p.leader {
        return Err(ControllerError::InvalidRequest(format!(
            "node {} is not the leader ({})",
            request.node_id, p.leader
        )));
    }
    if request.partition_epoch != p.partition_epoch {
        return Err(ControllerError::InvalidUpdateVersion {
            request: request.partition_epoch,
            current: p.partition_epoch,
        });
    }
    let isr = &request.new_isr;
    if !isr.contains(&p.leader) {
        return Err(ControllerError::InvalidRequest(
            "the new ISR must contain the leader".into(),
        ));
    }
    if isr.iter().collect::<BTreeSet<_>>().len() != isr.len() {
        return Err(ControllerError::InvalidRequest(
            "the new ISR has duplicates".into(),
        ));
    }
    let ineligible: Vec<NodeId> = isr
        .iter()
        .copied()
        .filter(|n| !p.replicas.contains(n) || !is_eligible(state, *n))
        .collect();
    if !ineligible.is_empty() {
        return Err(ControllerError::IneligibleReplica(ineligible));
    }
    let mut next = p.clone();
    next.isr = isr.clone();
    complete_reassignment(state, &mut next);
    Ok(change_between(request.topic_id, request.index, p, &next)
        .map(MetadataRecord::PartitionChange)
        .into_iter()
        .collect())
}

/// The change that turns `from` into `to` (`None`: they are the same): the
/// partition epoch grows, and the leader epoch too where the leader changes or
/// a replica leaves.
fn change_between(
    topic_id: TopicId,
    index: u32,
    from: &PartitionState,
    to: &PartitionState,
) -> Option<PartitionChange> {
    let replicas_change =
        from.replicas != to.replicas || from.adding != to.adding || from.removing != to.removing;
    if !replicas_change && from.isr == to.isr && from.leader == to.leader {
        return None;
    }
    let replica_leaves = from.replicas.iter().any(|r| !to.replicas.contains(r));
    Some(PartitionChange {
        topic_id,
        index,
        isr: (from.isr != to.isr).then(|| to.isr.clone()),
        leader: (from.leader != to.leader).then_some(to.leader),
        leader_epoch: from.leader_epoch + i32::from(from.leader != to.leader || replica_leaves),
        partition_epoch: from.partition_epoch + 1,
        replicas: replicas_change.then(|| ReplicaSet {
            replicas: to.replicas.clone(),
            adding: to.adding.clone(),
            removing: to.removing.clone(),
        }),
    })
}

/// Kafka's completion rule (`maybeCompleteReassignment`): a running
/// reassignment whose target replicas are all in the ISR completes: the
/// replicas become the target, the removed ones leave the ISR, and a leader
/// that is removed hands over to the first target replica in the ISR that is
/// eligible. Without such a replica it waits (never leaves the partition
/// without a leader it had).
fn complete_reassignment(state: &ClusterState, p: &mut PartitionState) {
    if !p.is_reassigning() {
        return;
    }
    let target = p.target_replicas();
    let isr: Vec<NodeId> = p
        .isr
        .iter()
        .copied()
        .filter(|r| target.contains(r))
        .collect();
    if isr.is_empty() || !target.iter().all(|r| isr.contains(r)) {
        return;
    }
    let leader = if p.leader == NO_LEADER || isr.contains(&p.leader) {
        p.leader
    } else {
        match target
            .iter()
            .copied()
            .find(|r| isr.contains(r) && is_eligible(state, *r))
        {
            Some(r) => r,
            None => return,
        }
    };
    p.replicas = target;
    p.isr = isr;
    p.leader = leader;
    p.adding.clear();
    p.removing.clear();
}

/// UnregisterBroker: the node's registration goes for good. Refused while it
/// runs (unfenced: stop it first, or it would register again) or while any
/// partition still has it as a replica (move them away first: `skiff node
/// drain`).
pub fn unregister_node(
    state: &ClusterState,
    node: NodeId,
) -> Result<Vec<MetadataRecord>, ControllerError> {
    let n = state
        .node(node)
        .ok_or(ControllerError::BrokerIdNotRegistered(node))?;
    if !n.fenced {
        return Err(ControllerError::InvalidRequest(format!(
            "node {node} is running (unfenced): stop it before unregistering it"
        )));
    }
    let held: Vec<String> = state
        .partitions()
        .filter(|(_, _, p)| p.replicas.contains(&node))
        .take(5)
        .map(|(t, i, _)| format!("{}-{i}", state.topic(t).map_or("?", |t| t.name.as_str())))
        .collect();
    if !held.is_empty() {
        return Err(ControllerError::InvalidRequest(format!(
            "node {node} still holds replicas ({}{}): reassign them first",
            held.join(", "),
            if held.len() == 5 { ", ..." } else { "" }
        )));
    }
    Ok(vec![MetadataRecord::UnregisterNode(UnregisterNode {
        node_id: node,
    })])
}

/// One partition's entry in AlterPartitionReassignments.
#[derive(Debug, Clone, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub struct Reassignment {
    pub topic: String,
    pub index: u32,
    /// The replicas to move to, or `None` to cancel the running reassignment.
    pub target: Option<Vec<NodeId>>,
}

/// AlterPartitionReassignments (KIP-455): per entry, the change that starts,
/// replaces or cancels a reassignment, or why it is refused.
///
/// Starting: the replicas become the target followed by the original replicas
/// it drops; the new ones are `adding` (they catch up as followers and join the
/// ISR) and the dropped ones `removing`. If the target is already in the ISR
/// (a reordering, or a smaller set) it completes in the same change. A new
/// target for a partition being reassigned starts from the original replicas
/// (replicas still being added and not in the new target leave). Cancelling
/// goes back to the original replicas. The target's nodes must be registered
/// (fenced ones catch up once they are back, as Kafka allows).
pub fn alter_reassignments(
    state: &ClusterState,
    entries: &[Reassignment],
) -> (Vec<MetadataRecord>, Vec<Result<(), ControllerError>>) {
    let mut records = Vec::new();
    let results = entries
        .iter()
        .map(|e| {
            let topic = state
                .topic_by_name(&e.topic)
                .ok_or(ControllerError::UnknownTopicOrPartition)?;
            let p = topic
                .partitions
                .get(&e.index)
                .ok_or(ControllerError::UnknownTopicOrPartition)?;
            let next = reassigned(state, p, e.target.as_deref())?;
            if let Some(change) = change_between(topic.topic_id, e.index, p, &next) {
                records.push(MetadataRecord::PartitionChange(change));
            }
            Ok(())
        })
        .collect();
    (records, results)
}

/// `p` with its reassignment to `target` started (or cancelled: `None`).
fn reassigned(
    state: &ClusterState,
    p: &PartitionState,
    target: Option<&[NodeId]>,
) -> Result<PartitionState, ControllerError> {
    let original = p.original_replicas();
    let target = match target {
        Some(target) => {
            if target.is_empty() {
                return Err(ControllerError::InvalidReplicaAssignment(
                    "the target has no replicas".into(),
                ));
            }
            if target.iter().collect::<BTreeSet<_>>().len() != target.len() {
                return Err(ControllerError::InvalidReplicaAssignment(format!(
                    "{target:?} names a node twice"
                )));
            }
            if let Some(n) = target.iter().find(|n| state.node(**n).is_none()) {
                return Err(ControllerError::InvalidReplicaAssignment(format!(
                    "node {n} is not registered"
                )));
            }
            target.to_vec()
        }
        None if p.is_reassigning() => original.clone(),
        None => return Err(ControllerError::NoReassignmentInProgress),
    };
    let mut next = p.clone();
    next.adding = target
        .iter()
        .copied()
        .filter(|r| !original.contains(r))
        .collect();
    next.removing = original
        .iter()
        .copied()
        .filter(|r| !target.contains(r))
        .collect();
    next.replicas = target.clone();
    next.replicas.extend(next.removing.iter().copied());
    let replicas = next.replicas.clone();
    next.isr.retain(|r| replicas.contains(r));
    if next.isr.is_empty() {
        return Err(ControllerError::InvalidReplicaAssignment(
            "no in-sync replica would remain".into(),
        ));
    }
    if next.leader != NO_LEADER && !next.isr.contains(&next.leader) {
        next.leader = next
            .replicas
            .iter()
            .copied()
            .find(|r| next.isr.contains(r) && is_eligible(state, *r))
            .ok_or_else(|| {
                ControllerError::InvalidReplicaAssignment(
                    "no eligible in-sync replica would remain to lead".into(),
                )
            })?;
    }
    complete_reassignment(state, &mut next);
    Ok(next)
}

/// Moves leadership back to each partition's preferred (first) replica where it
/// is in the ISR and eligible.
pub fn elect_preferred_leaders(state: &ClusterState) -> Vec<MetadataRecord> {
    state
        .partitions()
        .filter_map(|(topic_id, index, p)| preferred_change(state, topic_id, index, p))
        .map(MetadataRecord::PartitionChange)
        .collect()
}

/// The change that makes `p`'s preferred (first) replica its leader, if it is
/// not already and it is in the ISR and eligible.
fn preferred_change(
    state: &ClusterState,
    topic_id: TopicId,
    index: u32,
    p: &PartitionState,
) -> Option<PartitionChange> {
    let preferred = *p.replicas.first()?;
    let ok = preferred != p.leader && p.isr.contains(&preferred) && is_eligible(state, preferred);
    ok.then(|| PartitionChange {
        topic_id,
        index,
        isr: None,
        leader: Some(preferred),
        leader_epoch: p.leader_epoch + 1,
        partition_epoch: p.partition_epoch + 1,
        replicas: None,
    })
}

/// How many of `records` elect a leader from outside the partition's ISR (an
/// unclean election), judged against the state they apply to.
pub fn unclean_elections(state: &ClusterState, records: &[MetadataRecord]) -> usize {
    records
        .iter()
        .filter(|r| match r {
            MetadataRecord::PartitionChange(c) => c.leader.is_some_and(|l| {
                l != NO_LEADER
                    && state
                        .partition(c.topic_id, c.index)
                        .is_some_and(|p| !p.isr.contains(&l))
            }),
            _ => false,
        })
        .count()
}

/// Which election ElectLeaders asks for (Kafka's election types).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Archive, Serialize, Deserialize)]
pub enum ElectionType {
    /// The preferred (first) replica leads, if it is in the ISR and eligible.
    Preferred,
    /// A partition without a leader gets one from its eligible replicas even
    /// outside the ISR (which then holds it alone): acknowledged writes it
    /// lacks are lost, which the operator accepts by asking.
    Unclean,
}

/// ElectLeaders: the changes for `partitions` (topic name, index; `None`:
/// every partition). Partitions that need no election or cannot have one are
/// skipped (the node reports why from its own metadata).
pub fn elect_leaders(
    state: &ClusterState,
    election: ElectionType,
    partitions: Option<&[(String, u32)]>,
) -> Vec<MetadataRecord> {
    let wanted: Option<BTreeSet<(TopicId, u32)>> = partitions.map(|list| {
        list.iter()
            .filter_map(|(name, index)| Some((state.topic_by_name(name)?.topic_id, *index)))
            .collect()
    });
    let eligible = |n: NodeId| is_eligible(state, n);
    state
        .partitions()
        .filter(|(t, i, _)| wanted.as_ref().is_none_or(|w| w.contains(&(*t, *i))))
        .filter_map(|(t, i, p)| match election {
            ElectionType::Preferred => preferred_change(state, t, i, p),
            ElectionType::Unclean if p.leader == NO_LEADER => {
                rebalance_partition(t, i, p, &eligible, true)
            }
            ElectionType::Unclean => None,
        })
        .map(MetadataRecord::PartitionChange)
        .collect()
}

/// Kafka's automatic leader rebalance (`checkAndTriggerAutoLeaderRebalance`):
/// a node's imbalance is the share of the partitions it is the preferred
/// replica of that it does not lead; where that passes `percentage`, its
/// partitions go back to it (those where it is in the ISR and eligible).
pub fn rebalance_leaders(state: &ClusterState, percentage: u32) -> Vec<MetadataRecord> {
    let mut preferred_of: BTreeMap<NodeId, (u64, u64)> = BTreeMap::new();
    for (_, _, p) in state.partitions() {
        let Some(&preferred) = p.replicas.first() else {
            continue;
        };
        let entry = preferred_of.entry(preferred).or_default();
        entry.0 += 1;
        entry.1 += u64::from(p.leader != preferred);
    }
    let imbalanced: BTreeSet<NodeId> = preferred_of
        .into_iter()
        .filter(|(_, (total, not_leading))| not_leading * 100 > total * u64::from(percentage))
        .map(|(node, _)| node)
        .collect();
    if imbalanced.is_empty() {
        return Vec::new();
    }
    state
        .partitions()
        .filter(|(_, _, p)| p.replicas.first().is_some_and(|r| imbalanced.contains(r)))
        .filter_map(|(t, i, p)| preferred_change(state, t, i, p))
        .map(MetadataRecord::PartitionChange)
        .collect()
}

#[cfg(test)]
#[path = "decisions_tests.rs"]
mod tests;
