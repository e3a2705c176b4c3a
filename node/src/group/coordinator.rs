//! The group coordinator of one core: the groups whose `__consumer_offsets`
//! partition this core owns, their waiting members, their committed offsets,
//! and the writes of both to the log.
//!
//! Data flow of a call (on the owner core, reached with `invoke_on`): the pure
//! state machine (`state.rs`) decides; a member that must wait gets a oneshot
//! registered before the effects are applied; when the effects ask for it the
//! group's metadata is appended to its offsets partition and made durable;
//! then the waiting members are answered. An OffsetCommit is acknowledged only
//! after its records are durable, and the in-memory offsets follow the log
//! (a newer log offset wins, so racing commits settle as the log orders them).
//!
//! Leadership (Kafka's `onElection` / `onResignation`): when this node
//! becomes the leader of an offsets partition (`replica::become_leader`, at
//! start or at runtime after a failover), `on_leader` reads the partition
//! from its start (the latest value per key wins, a tombstone deletes) and
//! only then serves its groups; meanwhile they are answered
//! COORDINATOR_LOAD_IN_PROGRESS. When it stops leading, `on_resign` drops
//! those groups and answers their waiting members NOT_COORDINATOR, so clients
//! look for the new coordinator. Every write goes through the replication
//! path as an acks=all produce does (`append`): at the current leader epoch,
//! acknowledged once the in-sync replicas have it.
//! A ticker per core (`TICK_INTERVAL`) applies session and rebalance timeouts,
//! and every `offsets.retention.check.interval.ms` expires offsets and forgets
//! idle groups (`cleanup`).

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use futures_channel::oneshot;
use kafka_protocol::ResponseError;
use skiff_engine::{LogError, Shard, TopicPartition};

use crate::kafka::now_ms;
use crate::replica::RoleChange;
use crate::state::CoreState;
use skiff_coordinator::group::records::{self, OffsetValue, RecordKey};
use skiff_coordinator::group::state::{
    Effects, Group, JoinRequest, JoinResult, Limits, Reply, SyncResult,
};

/// How often each core applies group timeouts; session timeouts are enforced
/// to within this.
pub const TICK_INTERVAL: Duration = Duration::from_millis(100);
/// Kafka's `offset.metadata.max.bytes` default.
pub const OFFSET_METADATA_BYTES_MAX: usize = 4096;

thread_local! {
    static COORDINATOR: Rc<Coordinator> = Rc::new(Coordinator::default());
}

/// A marker (producer id, epoch, commit) waiting for its partition's load.
type DeferredMarker = (i64, i16, bool);

/// Transactional offsets by producer id: (topic, partition) -> the commit.
type PendingByProducer = BTreeMap<i64, BTreeMap<(String, i32), Committed>>;

/// A committed offset and where it is in the log.
#[derive(Debug, Clone)]
pub struct Committed {
    pub value: OffsetValue,
    log_offset: i64,
}

struct Entry {
    group: Group,
    tp: TopicPartition,
    /// (topic, partition) -> committed offset.
    offsets: BTreeMap<(String, i32), Committed>,
    /// TxnOffsetCommit's offsets by producer id, waiting for its marker:
    /// a COMMIT makes them committed (where newer in the log), an ABORT
    /// drops them.
    pending: PendingByProducer,
    join_waiters: HashMap<String, oneshot::Sender<JoinResult>>,
    sync_waiters: HashMap<String, oneshot::Sender<SyncResult>>,
    /// Whether the log holds a GroupMetadata record for it (forgetting the
    /// group then takes a tombstone).
    stored: bool,
}

impl Entry {
    fn new(group: Group, tp: TopicPartition) -> Entry {
        Entry {
            group,
            tp,
            stored: false,
            offsets: BTreeMap::new(),
            pending: BTreeMap::new(),
            join_waiters: HashMap::new(),
            sync_waiters: HashMap::new(),
        }
    }
}

/// What DescribeGroups and `skiff group describe` show of a group.
#[derive(Debug, Clone)]
pub struct GroupSummary {
    pub state: &'static str,
    pub protocol_type: String,
    /// Empty unless Stable (Kafka's rule).
    pub protocol: String,
    pub members: Vec<MemberSummary>,
}

#[derive(Debug, Clone)]
pub struct MemberSummary {
    pub member_id: String,
    pub group_instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    /// Both empty unless Stable.
    pub metadata: Bytes,
    pub assignment: Bytes,
}

/// Committed offsets by topic: (topic, [(partition, offset if committed)]).
pub type FetchedOffsets = Vec<(String, Vec<(i32, Option<OffsetValue>)>)>;

/// One group in ListGroups.
#[derive(Debug, Clone)]
pub struct Listed {
    pub group_id: String,
    pub protocol_type: String,
    pub state: &'static str,
}

/// An offsets partition this core leads: its groups are being read from the
/// log, or served. Keyed by the leader epoch that started the load, so a load
/// finishing after a newer election (or a resignation) is discarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Led {
    Loading(i32),
    Loaded(i32),
}

#[derive(Default)]
pub struct Coordinator {
    groups: RefCell<BTreeMap<String, Entry>>,
    /// The offsets partitions this core leads; a group is served only when
    /// its partition is `Loaded` here.
    led: RefCell<HashMap<TopicPartition, Led>>,
    /// Woken when no load is in progress (the node's start waits for them).
    load_waiters: RefCell<Vec<oneshot::Sender<()>>>,
    /// `offsets.commit.timeout.ms` (set when the core starts its ticker).
    write_timeout: std::cell::Cell<Option<Duration>>,
    /// The latest epoch of each transactional producer seen in each offsets
    /// partition this core leads (its TxnOffsetCommits and markers): an
    /// older one is fenced.
    txn_epochs: RefCell<HashMap<TopicPartition, HashMap<i64, i16>>>,
    /// Markers written while their offsets partition was still loading
    /// (the load may have read the log before them): applied when it ends.
    deferred_markers: RefCell<HashMap<TopicPartition, Vec<DeferredMarker>>>,
    /// Set when the node stops: calls are answered NOT_COORDINATOR, as a Kafka
    /// coordinator that resigns answers, so clients never wait on a dead node.
    closed: std::cell::Cell<bool>,
}

/// The node settings of the protocol.
pub fn limits(core: &CoreState) -> Limits {
    let c = &core.node.config;
    Limits {
        session_timeout_ms_min: c.group_min_session_timeout_ms,
        session_timeout_ms_max: c.group_max_session_timeout_ms,
        initial_rebalance_delay_ms: c.group_initial_rebalance_delay_ms,
    }
}

impl Coordinator {
    /// This core's coordinator.
    pub fn current() -> Rc<Coordinator> {
        COORDINATOR.with(Rc::clone)
    }

    fn entry_or_new<'a>(
        groups: &'a mut BTreeMap<String, Entry>,
        group_id: &str,
        tp: &TopicPartition,
        limits: Limits,
        now: i64,
    ) -> &'a mut Entry {
        groups
            .entry(group_id.to_string())
            .or_insert_with(|| Entry::new(Group::new(group_id, limits, now), tp.clone()))
    }

    pub async fn join(
        &self,
        shard: &Rc<Shard>,
        tp: TopicPartition,
        group_id: String,
        limits: Limits,
        request: JoinRequest,
    ) -> JoinResult {
        if self.closed.get() {
            return JoinResult::error(ResponseError::NotCoordinator, &request.member_id);
        }
        let now = now_ms();
        let (reply, effects, waiter) = {
            let mut groups = self.groups.borrow_mut();
            let entry = Self::entry_or_new(&mut groups, &group_id, &tp, limits, now);
            let (reply, effects) = entry.group.join(now, request);
            let waiter = match &reply {
                Reply::Now(_) => None,
                Reply::Wait(member_id) => {
                    let (tx, rx) = oneshot::channel();
                    if let Some(old) = entry.join_waiters.insert(member_id.clone(), tx) {
                        // The same member joined again before its answer came.
                        let _ = old.send(JoinResult::error(
                            ResponseError::RebalanceInProgress,
                            member_id,
                        ));
                    }
                    Some(rx)
                }
            };
            (reply, effects, waiter)
        };
        self.apply(shard, &group_id, effects).await;
        match (reply, waiter) {
            (Reply::Now(result), _) => result,
            (Reply::Wait(member_id), Some(rx)) => rx.await.unwrap_or_else(|_| {
                JoinResult::error(ResponseError::CoordinatorNotAvailable, &member_id)
            }),
            (Reply::Wait(member_id), None) => {
                JoinResult::error(ResponseError::CoordinatorNotAvailable, &member_id)
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub async fn sync(
        &self,
        shard: &Rc<Shard>,
        group_id: String,
        member_id: String,
        generation_id: i32,
        group_instance_id: Option<String>,
        protocol: (Option<String>, Option<String>),
        assignments: Vec<(String, Bytes)>,
    ) -> SyncResult {
        if self.closed.get() {
            return SyncResult::error(ResponseError::NotCoordinator);
        }
        let now = now_ms();
        let (reply, effects, waiter) = {
            let mut groups = self.groups.borrow_mut();
            let Some(entry) = groups.get_mut(&group_id) else {
                return SyncResult::error(ResponseError::UnknownMemberId);
            };
            let (reply, effects) = entry.group.sync(
                now,
                &member_id,
                generation_id,
                group_instance_id.as_deref(),
                (protocol.0.as_deref(), protocol.1.as_deref()),
                assignments,
            );
            let waiter = match &reply {
                Reply::Now(_) => None,
                Reply::Wait(id) => {
                    let (tx, rx) = oneshot::channel();
                    if let Some(old) = entry.sync_waiters.insert(id.clone(), tx) {
                        let _ = old.send(SyncResult::error(ResponseError::RebalanceInProgress));
                    }
                    Some(rx)
                }
            };
            (reply, effects, waiter)
        };
        self.apply(shard, &group_id, effects).await;
        match (reply, waiter) {
            (Reply::Now(result), _) => result,
            (Reply::Wait(_), Some(rx)) => rx
                .await
                .unwrap_or_else(|_| SyncResult::error(ResponseError::CoordinatorNotAvailable)),
            (Reply::Wait(_), None) => SyncResult::error(ResponseError::CoordinatorNotAvailable),
        }
    }

    pub fn heartbeat(
        &self,
        group_id: &str,
        member_id: &str,
        generation_id: i32,
        group_instance_id: Option<&str>,
    ) -> Option<ResponseError> {
        let mut groups = self.groups.borrow_mut();
        match groups.get_mut(group_id) {
            None => Some(ResponseError::UnknownMemberId),
            Some(entry) => {
                entry
                    .group
                    .heartbeat(now_ms(), member_id, generation_id, group_instance_id)
            }
        }
    }

    pub async fn leave(
        &self,
        shard: &Rc<Shard>,
        group_id: String,
        leaving: Vec<(String, Option<String>)>,
    ) -> Vec<Option<ResponseError>> {
        let (errors, effects) = {
            let mut groups = self.groups.borrow_mut();
            match groups.get_mut(&group_id) {
                None => (
                    vec![Some(ResponseError::UnknownMemberId); leaving.len()],
                    Effects::default(),
                ),
                Some(entry) => entry.group.leave(now_ms(), &leaving),
            }
        };
        self.apply(shard, &group_id, effects).await;
        errors
    }

    /// OffsetCommit: checks membership and generation, appends one record per
    /// offset, waits until they are durable, then updates the offsets.
    #[allow(clippy::too_many_arguments)]
    pub async fn commit(
        &self,
        shard: &Rc<Shard>,
        tp: TopicPartition,
        group_id: String,
        limits: Limits,
        member_id: String,
        generation_id: i32,
        group_instance_id: Option<String>,
        offsets: Vec<(String, i32, OffsetValue)>,
    ) -> Result<(), ResponseError> {
        let now = now_ms();
        let member = (
            member_id.as_str(),
            generation_id,
            group_instance_id.as_deref(),
        );
        self.check_committer(&tp, &group_id, limits, member, now)?;
        if offsets.is_empty() {
            return Ok(());
        }
        let records = offset_records(&group_id, &offsets);
        let base_offset = append(shard, &tp, &records, &group_id, self.write_timeout()).await?;
        let mut groups = self.groups.borrow_mut();
        let entry = Self::entry_or_new(&mut groups, &group_id, &tp, limits, now);
        for (i, (topic, partition, value)) in offsets.into_iter().enumerate() {
            let log_offset = base_offset + i as i64;
            let slot = entry.offsets.entry((topic, partition));
            match slot {
                std::collections::btree_map::Entry::Occupied(mut o) => {
                    if o.get().log_offset < log_offset {
                        o.insert(Committed { value, log_offset });
                    }
                }
                std::collections::btree_map::Entry::Vacant(v) => {
                    v.insert(Committed { value, log_offset });
                }
            }
        }
        Ok(())
    }

    /// TxnOffsetCommit: checked as OffsetCommit is, plus the producer's
    /// epoch; appended in a transactional batch of the producer; pending
    /// until the producer's marker reaches this partition (`on_marker`).
    #[allow(clippy::too_many_arguments)]
    pub async fn txn_commit(
        &self,
        shard: &Rc<Shard>,
        tp: TopicPartition,
        group_id: String,
        limits: Limits,
        producer: (i64, i16),
        member_id: String,
        generation_id: i32,
        group_instance_id: Option<String>,
        offsets: Vec<(String, i32, OffsetValue)>,
    ) -> Result<(), ResponseError> {
        let now = now_ms();
        let (producer_id, epoch) = producer;
        let known = self
            .txn_epochs
            .borrow()
            .get(&tp)
            .and_then(|e| e.get(&producer_id))
            .copied();
        if known.is_some_and(|k| epoch < k) {
            return Err(ResponseError::InvalidProducerEpoch);
        }
        let member = (
            member_id.as_str(),
            generation_id,
            group_instance_id.as_deref(),
        );
        self.check_committer(&tp, &group_id, limits, member, now)?;
        if offsets.is_empty() {
            return Ok(());
        }
        let records = offset_records(&group_id, &offsets);
        let base_offset = crate::internal::append_transactional(
            shard,
            &tp,
            &records,
            producer,
            self.write_timeout(),
        )
        .await
        .map_err(|e| {
            tracing::warn!(group = %group_id, partition = %tp, producer_id, error = %e, "writing transactional offsets failed");
            e.code(ResponseError::InvalidCommitOffsetSize)
        })?;
        self.txn_epochs
            .borrow_mut()
            .entry(tp.clone())
            .or_default()
            .entry(producer_id)
            .and_modify(|e| *e = (*e).max(epoch))
            .or_insert(epoch);
        let mut groups = self.groups.borrow_mut();
        let entry = Self::entry_or_new(&mut groups, &group_id, &tp, limits, now);
        let pending = entry.pending.entry(producer_id).or_default();
        for (i, (topic, partition, value)) in offsets.into_iter().enumerate() {
            let log_offset = base_offset + i as i64;
            pending.insert((topic, partition), Committed { value, log_offset });
        }
        Ok(())
    }

    /// The partitions of `group_id` with offsets a transaction wrote and
    /// has not ended yet.
    pub fn pending_partitions(&self, group_id: &str) -> std::collections::BTreeSet<(String, i32)> {
        self.groups
            .borrow()
            .get(group_id)
            .map(|e| e.pending.values().flat_map(|p| p.keys().cloned()).collect())
            .unwrap_or_default()
    }

    /// A marker of `producer_id` is on the in-sync replicas of offsets
    /// partition `tp`: its pending offsets count (COMMIT) or are dropped.
    pub fn on_marker(&self, tp: &TopicPartition, producer_id: i64, epoch: i16, commit: bool) {
        match self.led.borrow().get(tp) {
            Some(Led::Loaded(_)) => {}
            Some(Led::Loading(_)) => {
                self.deferred_markers
                    .borrow_mut()
                    .entry(tp.clone())
                    .or_default()
                    .push((producer_id, epoch, commit));
                return;
            }
            None => return,
        }
        self.txn_epochs
            .borrow_mut()
            .entry(tp.clone())
            .or_default()
            .entry(producer_id)
            .and_modify(|e| *e = (*e).max(epoch))
            .or_insert(epoch);
        for entry in self.groups.borrow_mut().values_mut() {
            if &entry.tp != tp {
                continue;
            }
            let Some(pending) = entry.pending.remove(&producer_id) else {
                continue;
            };
            if commit {
                settle(&mut entry.offsets, pending);
            }
        }
    }

    /// Whether `member` (id, generation, instance id) may commit offsets
    /// for `group_id` (Kafka: a commit with no generation creates a group
    /// that only stores offsets; any other commit needs a member).
    fn check_committer(
        &self,
        tp: &TopicPartition,
        group_id: &str,
        limits: Limits,
        (member_id, generation_id, group_instance_id): (&str, i32, Option<&str>),
        now: i64,
    ) -> Result<(), ResponseError> {
        let mut groups = self.groups.borrow_mut();
        match groups.get_mut(group_id) {
            None if generation_id < 0 => {
                Self::entry_or_new(&mut groups, group_id, tp, limits, now);
                Ok(())
            }
            None => Err(ResponseError::IllegalGeneration),
            Some(entry) => {
                entry
                    .group
                    .check_commit(now, member_id, generation_id, group_instance_id)
            }
        }
    }

    /// The committed offsets of `group_id`: of the listed partitions (`None`
    /// for a partition without a commit), or all of them.
    pub fn fetch_offsets(
        &self,
        group_id: &str,
        wanted: Option<Vec<(String, Vec<i32>)>>,
    ) -> FetchedOffsets {
        let groups = self.groups.borrow();
        let offsets = groups.get(group_id).map(|e| &e.offsets);
        match wanted {
            Some(topics) => topics
                .into_iter()
                .map(|(topic, partitions)| {
                    let found = partitions
                        .into_iter()
                        .map(|p| {
                            let value = offsets
                                .and_then(|o| o.get(&(topic.clone(), p)))
                                .map(|c| c.value.clone());
                            (p, value)
                        })
                        .collect();
                    (topic, found)
                })
                .collect(),
            None => {
                let mut out: FetchedOffsets = Vec::new();
                for ((topic, partition), c) in offsets.into_iter().flatten() {
                    match out.last_mut() {
                        Some((t, list)) if t == topic => {
                            list.push((*partition, Some(c.value.clone())))
                        }
                        _ => out.push((topic.clone(), vec![(*partition, Some(c.value.clone()))])),
                    }
                }
                out
            }
        }
    }

    pub fn describe(&self, group_id: &str) -> Option<GroupSummary> {
        let groups = self.groups.borrow();
        let group = &groups.get(group_id)?.group;
        let stable = group.state() == skiff_coordinator::group::state::GroupState::Stable;
        let protocol = group.protocol_name().unwrap_or_default().to_string();
        Some(GroupSummary {
            state: group.state().name(),
            protocol_type: group.protocol_type().unwrap_or_default().to_string(),
            protocol: if stable {
                protocol.clone()
            } else {
                String::new()
            },
            members: group
                .members()
                .map(|m| MemberSummary {
                    member_id: m.member_id.clone(),
                    group_instance_id: m.group_instance_id.clone(),
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    metadata: if stable {
                        m.metadata(&protocol)
                    } else {
                        Bytes::new()
                    },
                    assignment: if stable {
                        m.assignment.clone()
                    } else {
                        Bytes::new()
                    },
                })
                .collect(),
        })
    }

    pub fn list(&self) -> Vec<Listed> {
        self.groups
            .borrow()
            .iter()
            .map(|(id, e)| Listed {
                group_id: id.clone(),
                protocol_type: e.group.protocol_type().unwrap_or_default().to_string(),
                state: e.group.state().name(),
            })
            .collect()
    }

    /// DeleteGroups for one group: only an empty group goes; its metadata and
    /// every committed offset get a tombstone (durable before the answer).
    pub async fn delete(&self, shard: &Rc<Shard>, group_id: String) -> Result<(), ResponseError> {
        let entry = {
            let mut groups = self.groups.borrow_mut();
            match groups.get(&group_id) {
                None => return Err(ResponseError::GroupIdNotFound),
                Some(e) if !e.group.is_empty() => return Err(ResponseError::NonEmptyGroup),
                Some(_) => {}
            }
            match groups.remove(&group_id) {
                Some(e) => e,
                None => return Err(ResponseError::GroupIdNotFound),
            }
        };
        let mut tombstones = vec![(
            records::encode_key(&RecordKey::Group {
                group: group_id.clone(),
            }),
            None,
        )];
        for (topic, partition) in entry.offsets.keys() {
            tombstones.push(offset_tombstone(&group_id, topic, *partition));
        }
        if let Err(error) = append(
            shard,
            &entry.tp,
            &tombstones,
            &group_id,
            self.write_timeout(),
        )
        .await
        {
            // Not deleted after all: put it back unless the id is in use again.
            self.groups.borrow_mut().entry(group_id).or_insert(entry);
            return Err(error);
        }
        tracing::info!(group = %group_id, "deleted group");
        Ok(())
    }

    /// OffsetDelete for one group: tombstones for the committed offsets of
    /// `partitions`, durable before the answer. Kafka's rule: an empty group
    /// may lose any; a consumer group with members only those of topics no
    /// member subscribes to (the others get GROUP_SUBSCRIBED_TO_TOPIC); any
    /// other group with members none (NON_EMPTY_GROUP). A partition without a
    /// committed offset is answered as deleted.
    pub async fn delete_offsets(
        &self,
        shard: &Rc<Shard>,
        group_id: String,
        partitions: Vec<(String, i32)>,
    ) -> Result<Vec<(String, i32, Option<ResponseError>)>, ResponseError> {
        let (tp, doomed, results) = {
            let groups = self.groups.borrow();
            let entry = groups
                .get(&group_id)
                .ok_or(ResponseError::GroupIdNotFound)?;
            let subscribed = if entry.group.is_empty() {
                std::collections::BTreeSet::new()
            } else {
                entry
                    .group
                    .subscribed_topics()
                    .ok_or(ResponseError::NonEmptyGroup)?
            };
            let mut doomed = Vec::new();
            let mut results = Vec::with_capacity(partitions.len());
            for (topic, partition) in partitions {
                if subscribed.contains(&topic) {
                    results.push((
                        topic,
                        partition,
                        Some(ResponseError::GroupSubscribedToTopic),
                    ));
                    continue;
                }
                if entry.offsets.contains_key(&(topic.clone(), partition)) {
                    doomed.push((topic.clone(), partition));
                }
                results.push((topic, partition, None));
            }
            (entry.tp.clone(), doomed, results)
        };
        if doomed.is_empty() {
            return Ok(results);
        }
        let tombstones: Vec<(Vec<u8>, Option<Vec<u8>>)> = doomed
            .iter()
            .map(|(topic, partition)| offset_tombstone(&group_id, topic, *partition))
            .collect();
        let base = append(shard, &tp, &tombstones, &group_id, self.write_timeout()).await?;
        if let Some(entry) = self.groups.borrow_mut().get_mut(&group_id) {
            for (i, key) in doomed.into_iter().enumerate() {
                // A commit that landed after the tombstone stays.
                if entry
                    .offsets
                    .get(&key)
                    .is_some_and(|c| c.log_offset < base + i as i64)
                {
                    entry.offsets.remove(&key);
                }
            }
        }
        tracing::info!(group = %group_id, "deleted committed offsets");
        Ok(results)
    }

    /// Stores the group when asked, then answers the waiting members.
    async fn apply(&self, shard: &Rc<Shard>, group_id: &str, mut effects: Effects) {
        if effects.persist {
            let stored = {
                let groups = self.groups.borrow();
                groups
                    .get(group_id)
                    .map(|e| (e.tp.clone(), e.group.stored()))
            };
            if let Some((tp, stored)) = stored {
                let record = (
                    records::encode_key(&RecordKey::Group {
                        group: group_id.to_string(),
                    }),
                    Some(records::encode_group_value(&stored)),
                );
                let appended = append(shard, &tp, &[record], group_id, self.write_timeout()).await;
                if appended.is_ok() {
                    if let Some(e) = self.groups.borrow_mut().get_mut(group_id) {
                        e.stored = true;
                    }
                }
                if let Err(error) = appended {
                    for (_, sync) in &mut effects.syncs {
                        *sync = SyncResult::error(error);
                    }
                    let more = self
                        .groups
                        .borrow_mut()
                        .get_mut(group_id)
                        .map(|e| e.group.persist_failed(now_ms()))
                        .unwrap_or_default();
                    effects.joins.extend(more.joins);
                    effects.syncs.extend(more.syncs);
                }
            }
        }
        let mut groups = self.groups.borrow_mut();
        let Some(entry) = groups.get_mut(group_id) else {
            return;
        };
        for (member_id, result) in effects.joins {
            if let Some(tx) = entry.join_waiters.remove(&member_id) {
                let _ = tx.send(result);
            }
        }
        for (member_id, result) in effects.syncs {
            if let Some(tx) = entry.sync_waiters.remove(&member_id) {
                let _ = tx.send(result);
            }
        }
    }

    /// Applies timeouts to every group of this core.
    pub async fn tick(&self, shard: &Rc<Shard>) {
        let now = now_ms();
        let due: Vec<(String, Effects)> = self
            .groups
            .borrow_mut()
            .iter_mut()
            .map(|(id, e)| (id.clone(), e.group.tick(now)))
            .filter(|(_, effects)| !effects.is_empty())
            .collect();
        for (group_id, effects) in due {
            self.apply(shard, &group_id, effects).await;
        }
    }

    fn write_timeout(&self) -> Duration {
        self.write_timeout.get().unwrap_or(Duration::from_secs(5))
    }

    /// Whether this core serves the groups of offsets partition `tp` now:
    /// NOT_COORDINATOR unless it leads it, COORDINATOR_LOAD_IN_PROGRESS while
    /// its groups are being read.
    pub fn check(&self, tp: &TopicPartition) -> Result<(), ResponseError> {
        if self.closed.get() {
            return Err(ResponseError::NotCoordinator);
        }
        match self.led.borrow().get(tp) {
            Some(Led::Loaded(_)) => Ok(()),
            Some(Led::Loading(_)) => Err(ResponseError::CoordinatorLoadInProgress),
            None => Err(ResponseError::NotCoordinator),
        }
    }

    /// This node became the leader of offsets partition `tp` at
    /// `leader_epoch`: its groups are loaded in the background and served
    /// once loaded (Kafka's `onElection`).
    pub fn on_leader(
        self: &Rc<Self>,
        shard: &Rc<Shard>,
        tp: TopicPartition,
        leader_epoch: i32,
        limits: Limits,
    ) {
        if self.led.borrow().get(&tp) == Some(&Led::Loaded(leader_epoch)) {
            return;
        }
        // Anything left of an earlier leadership goes first.
        self.drop_groups_of(&tp);
        self.led
            .borrow_mut()
            .insert(tp.clone(), Led::Loading(leader_epoch));
        let this = self.clone();
        let shard = shard.clone();
        glommio::spawn_local(async move {
            let started = std::time::Instant::now();
            let loaded = load_partition(&shard, &tp, limits).await;
            let current = this.led.borrow().get(&tp).copied();
            if current != Some(Led::Loading(leader_epoch)) {
                tracing::info!(partition = %tp, leader_epoch, "discarding a load: leadership changed meanwhile");
            } else {
                match loaded {
                    Ok((entries, epochs)) => {
                        let count = entries.len();
                        this.txn_epochs.borrow_mut().insert(tp.clone(), epochs);
                        let mut groups = this.groups.borrow_mut();
                        for (id, entry) in entries {
                            groups.insert(id, entry);
                        }
                        drop(groups);
                        this.led.borrow_mut().insert(tp.clone(), Led::Loaded(leader_epoch));
                        // Markers applied twice are harmless: the second
                        // finds nothing pending.
                        let late = this.deferred_markers.borrow_mut().remove(&tp);
                        for (producer_id, epoch, commit) in late.into_iter().flatten() {
                            this.on_marker(&tp, producer_id, epoch, commit);
                        }
                        tracing::info!(partition = %tp, leader_epoch, groups = count, elapsed_ms = started.elapsed().as_millis() as u64, "loaded consumer groups");
                    }
                    Err(e) => {
                        // Not served: clients get NOT_COORDINATOR and look again
                        // (the partition is offline or the node stopping).
                        this.led.borrow_mut().remove(&tp);
                        tracing::error!(partition = %tp, leader_epoch, error = %e, "loading consumer groups failed");
                    }
                }
            }
            this.wake_load_waiters();
        })
        .detach();
    }

    /// This node no longer leads offsets partition `tp` (Kafka's
    /// `onResignation`): its groups are dropped, their waiting members
    /// answered NOT_COORDINATOR.
    pub fn on_resign(&self, tp: &TopicPartition) {
        if self.led.borrow_mut().remove(tp).is_some() {
            let dropped = self.drop_groups_of(tp);
            tracing::info!(partition = %tp, groups = dropped, "no longer the coordinator of its groups");
            self.wake_load_waiters();
        }
    }

    fn drop_groups_of(&self, tp: &TopicPartition) -> usize {
        self.txn_epochs.borrow_mut().remove(tp);
        self.deferred_markers.borrow_mut().remove(tp);
        let mut groups = self.groups.borrow_mut();
        let ids: Vec<String> = groups
            .iter()
            .filter(|(_, e)| &e.tp == tp)
            .map(|(id, _)| id.clone())
            .collect();
        for id in &ids {
            if let Some(mut entry) = groups.remove(id) {
                answer_waiters(&mut entry, ResponseError::NotCoordinator);
            }
        }
        ids.len()
    }

    fn wake_load_waiters(&self) {
        if self.loading() == 0 {
            for tx in self.load_waiters.borrow_mut().drain(..) {
                let _ = tx.send(());
            }
        }
    }

    fn loading(&self) -> usize {
        self.led
            .borrow()
            .values()
            .filter(|l| matches!(l, Led::Loading(_)))
            .count()
    }

    /// Waits until no load is in progress on this core; returns how many
    /// groups it serves.
    pub async fn wait_loaded(&self) -> usize {
        if self.loading() > 0 {
            let (tx, rx) = oneshot::channel();
            self.load_waiters.borrow_mut().push(tx);
            let _ = rx.await;
        }
        self.groups.borrow().len()
    }
}

/// Reads the groups and offsets stored in offsets partition `tp`, from its
/// start to its end: the latest value per key wins, a tombstone deletes.
async fn load_partition(
    shard: &Rc<Shard>,
    tp: &TopicPartition,
    limits: Limits,
) -> Result<(Vec<(String, Entry)>, HashMap<i64, i16>), LogError> {
    use crate::internal::Loaded;
    let now = now_ms();
    let mut groups: BTreeMap<String, Option<skiff_coordinator::group::state::StoredGroup>> =
        BTreeMap::new();
    let mut offsets: BTreeMap<String, BTreeMap<(String, i32), Option<Committed>>> = BTreeMap::new();
    // Transactional offsets by producer, until their marker: (group, topic,
    // partition) -> the commit.
    type Pending = BTreeMap<String, BTreeMap<(String, i32), Option<Committed>>>;
    let mut pending: HashMap<i64, Pending> = HashMap::new();
    let mut epochs: HashMap<i64, i16> = HashMap::new();
    crate::internal::read_batches(shard, tp, |loaded| match loaded {
        Loaded::Record {
            offset,
            key,
            value,
            transactional: None,
        } => apply_record(tp, offset, key, value, &mut groups, &mut offsets),
        Loaded::Record {
            offset,
            key,
            value,
            transactional: Some(producer_id),
        } => {
            // Only offsets are written transactionally; a group record
            // here would be a stranger's, and is ignored.
            let mut ignored = BTreeMap::new();
            let stash = pending.entry(producer_id).or_default();
            apply_record(tp, offset, key, value, &mut ignored, stash);
        }
        Loaded::Marker {
            producer_id,
            producer_epoch,
            commit,
            ..
        } => {
            epochs
                .entry(producer_id)
                .and_modify(|e| *e = (*e).max(producer_epoch))
                .or_insert(producer_epoch);
            let Some(stash) = pending.remove(&producer_id) else {
                return;
            };
            if !commit {
                return;
            }
            for (group, committed) in stash {
                let target = offsets.entry(group).or_default();
                for (key, value) in committed {
                    let Some(value) = value else { continue };
                    let newer = match target.get(&key) {
                        Some(Some(current)) => current.log_offset < value.log_offset,
                        _ => true,
                    };
                    if newer {
                        target.insert(key, Some(value));
                    }
                }
            }
        }
    })
    .await?;
    // What is still pending: open transactions, kept until their markers.
    let mut open: BTreeMap<String, PendingByProducer> = BTreeMap::new();
    for (producer_id, stash) in pending {
        for (group, committed) in stash {
            let slot = open
                .entry(group)
                .or_default()
                .entry(producer_id)
                .or_default();
            slot.extend(committed.into_iter().filter_map(|(k, v)| v.map(|v| (k, v))));
        }
    }
    let ids: std::collections::BTreeSet<String> = groups
        .keys()
        .chain(offsets.keys())
        .chain(open.keys())
        .cloned()
        .collect();
    let mut out = Vec::new();
    for id in ids {
        let stored = groups.remove(&id).flatten();
        let stored_present = stored.is_some();
        let committed: BTreeMap<(String, i32), Committed> = offsets
            .remove(&id)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|(k, v)| v.map(|v| (k, v)))
            .collect();
        let pending = open.remove(&id).unwrap_or_default();
        if stored.is_none() && committed.is_empty() && pending.is_empty() {
            continue;
        }
        let group = match stored {
            Some(s) => Group::loaded(id.clone(), limits, s, now),
            None => Group::new(id.clone(), limits, now),
        };
        let mut entry = Entry::new(group, tp.clone());
        entry.stored = stored_present;
        entry.offsets = committed;
        entry.pending = pending;
        out.push((id, entry));
    }
    Ok((out, epochs))
}

/// A committed transaction's offsets: each replaces the committed one
/// unless that one is later in the log (Kafka's rule).
fn settle(
    offsets: &mut BTreeMap<(String, i32), Committed>,
    pending: BTreeMap<(String, i32), Committed>,
) {
    for (key, value) in pending {
        match offsets.get(&key) {
            Some(current) if current.log_offset > value.log_offset => {}
            _ => {
                offsets.insert(key, value);
            }
        }
    }
}

/// Answers every member waiting in JoinGroup or SyncGroup with `error`.
fn answer_waiters(entry: &mut Entry, error: ResponseError) {
    for (member_id, tx) in entry.join_waiters.drain() {
        let _ = tx.send(JoinResult::error(error, &member_id));
    }
    for (_, tx) in entry.sync_waiters.drain() {
        let _ = tx.send(SyncResult::error(error));
    }
}

impl Coordinator {
    /// Kafka's offsets cleanup (every `offsets.retention.check.interval.ms`):
    /// expired offsets get tombstones, then groups with no members, no member
    /// ids handed out, no waiting members and no offsets are forgotten (a
    /// tombstone first if the log has their metadata), so group ids that come
    /// and go do not accumulate.
    pub async fn cleanup(&self, shard: &Rc<Shard>, retention_ms: i64) {
        self.expire_offsets(shard, retention_ms).await;
        self.forget_idle_groups(shard).await;
    }

    async fn expire_offsets(&self, shard: &Rc<Shard>, retention_ms: i64) {
        let now = now_ms();
        // (group, its partition, [(topic, partition, log offset of the commit)])
        type Expired = Vec<(String, TopicPartition, Vec<(String, i32, i64)>)>;
        let expired: Expired = self
            .groups
            .borrow()
            .iter()
            .filter_map(|(id, e)| {
                let keys: Vec<(String, i32, i64)> = e
                    .offsets
                    .iter()
                    .filter(|(_, c)| {
                        e.group
                            .offset_expired(now, retention_ms, c.value.commit_timestamp_ms)
                    })
                    .map(|((t, p), c)| (t.clone(), *p, c.log_offset))
                    .collect();
                (!keys.is_empty()).then(|| (id.clone(), e.tp.clone(), keys))
            })
            .collect();
        for (group_id, tp, keys) in expired {
            let tombstones: Vec<(Vec<u8>, Option<Vec<u8>>)> = keys
                .iter()
                .map(|(topic, partition, _)| offset_tombstone(&group_id, topic, *partition))
                .collect();
            if append(shard, &tp, &tombstones, &group_id, self.write_timeout())
                .await
                .is_err()
            {
                continue;
            }
            let mut groups = self.groups.borrow_mut();
            if let Some(entry) = groups.get_mut(&group_id) {
                for (topic, partition, log_offset) in keys {
                    // A commit that landed meanwhile stays.
                    if entry
                        .offsets
                        .get(&(topic.clone(), partition))
                        .is_some_and(|c| c.log_offset == log_offset)
                    {
                        entry.offsets.remove(&(topic, partition));
                    }
                }
            }
            tracing::info!(group = %group_id, "expired committed offsets");
        }
    }

    async fn forget_idle_groups(&self, shard: &Rc<Shard>) {
        let idle: Vec<(String, TopicPartition, bool)> = self
            .groups
            .borrow()
            .iter()
            .filter(|(_, e)| {
                e.group.is_idle()
                    && e.offsets.is_empty()
                    && e.pending.is_empty()
                    && e.join_waiters.is_empty()
                    && e.sync_waiters.is_empty()
            })
            .map(|(id, e)| (id.clone(), e.tp.clone(), e.stored))
            .collect();
        for (group_id, tp, stored) in idle {
            if stored {
                let key = records::encode_key(&RecordKey::Group {
                    group: group_id.clone(),
                });
                if append(shard, &tp, &[(key, None)], &group_id, self.write_timeout())
                    .await
                    .is_err()
                {
                    continue;
                }
            }
            let mut groups = self.groups.borrow_mut();
            // Still idle after the write? (A member may have joined meanwhile.)
            if groups
                .get(&group_id)
                .is_some_and(|e| e.group.is_idle() && e.offsets.is_empty())
            {
                groups.remove(&group_id);
                tracing::debug!(group = %group_id, "forgot an idle group");
            }
        }
    }

    /// The node is stopping: every waiting member is answered NOT_COORDINATOR
    /// and later calls are refused the same way.
    pub fn close(&self) {
        self.closed.set(true);
        for entry in self.groups.borrow_mut().values_mut() {
            answer_waiters(entry, ResponseError::NotCoordinator);
        }
    }
}

/// Folds one stored record into the load state (the latest value per key wins;
/// a null value deletes).
fn apply_record(
    tp: &TopicPartition,
    log_offset: i64,
    key: Option<&[u8]>,
    value: Option<&[u8]>,
    groups: &mut BTreeMap<String, Option<skiff_coordinator::group::state::StoredGroup>>,
    offsets: &mut BTreeMap<String, BTreeMap<(String, i32), Option<Committed>>>,
) {
    let Some(key) = key else {
        return;
    };
    let key = match records::decode_key(key) {
        Ok(k) => k,
        Err(e) => {
            tracing::warn!(partition = %tp, log_offset, error = %e, "skipping a record with an unknown key");
            return;
        }
    };
    match key {
        RecordKey::Group { group } => {
            let stored = match value.map(records::decode_group_value) {
                None => None,
                Some(Ok(g)) => Some(g),
                Some(Err(e)) => {
                    tracing::warn!(partition = %tp, log_offset, %group, error = %e, "skipping a bad group record");
                    return;
                }
            };
            groups.insert(group, stored);
        }
        RecordKey::Offset {
            group,
            topic,
            partition,
        } => {
            let committed = match value.map(records::decode_offset_value) {
                None => None,
                Some(Ok(value)) => Some(Committed { value, log_offset }),
                Some(Err(e)) => {
                    tracing::warn!(partition = %tp, log_offset, %group, error = %e, "skipping a bad offset record");
                    return;
                }
            };
            offsets
                .entry(group)
                .or_default()
                .insert((topic, partition), committed);
        }
    }
}

/// One offset record per committed offset of `group`.
fn offset_records(
    group: &str,
    offsets: &[(String, i32, OffsetValue)],
) -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
    offsets
        .iter()
        .map(|(topic, partition, value)| {
            let key = RecordKey::Offset {
                group: group.to_string(),
                topic: topic.clone(),
                partition: *partition,
            };
            (
                records::encode_key(&key),
                Some(records::encode_offset_value(value)),
            )
        })
        .collect()
}

/// The record that deletes a committed offset: its key, no value.
fn offset_tombstone(group: &str, topic: &str, partition: i32) -> (Vec<u8>, Option<Vec<u8>>) {
    let key = RecordKey::Offset {
        group: group.to_string(),
        topic: topic.to_string(),
        partition,
    };
    (records::encode_key(&key), None)
}

/// Appends records to an offsets partition this core leads
/// (`internal::append`), its failure logged and mapped as Kafka's group
/// coordinator does.
async fn append(
    shard: &Rc<Shard>,
    tp: &TopicPartition,
    records: &[(Vec<u8>, Option<Vec<u8>>)],
    group_id: &str,
    timeout: Duration,
) -> Result<i64, ResponseError> {
    crate::internal::append(shard, tp, records, timeout)
        .await
        .map_err(|e| {
            tracing::warn!(group = %group_id, partition = %tp, error = %e, "writing to __consumer_offsets failed");
            e.code(ResponseError::InvalidCommitOffsetSize)
        })
}

/// Makes this core's coordinator follow the leadership of the
/// `__consumer_offsets` partitions the core owns: it coordinates their
/// groups while it leads them (loading them first), and drops them when it
/// stops. Once per core, before the core takes any role.
pub fn attach(core: &Rc<CoreState>) {
    crate::producer::on_marker(|tp, producer_id, epoch, commit| {
        if tp.topic == super::OFFSETS_TOPIC {
            Coordinator::current().on_marker(tp, producer_id, epoch, commit);
        }
    });
    let core = Rc::downgrade(core);
    crate::replica::on_role_change(move |tp, change| {
        if tp.topic != super::OFFSETS_TOPIC {
            return;
        }
        match change {
            RoleChange::Leading { leader_epoch } => {
                let Some(core) = core.upgrade() else {
                    return;
                };
                Coordinator::current().on_leader(
                    &core.shard,
                    tp.clone(),
                    leader_epoch,
                    limits(&core),
                );
            }
            RoleChange::NotLeading => Coordinator::current().on_resign(tp),
        }
    });
}

/// Starts this core's ticker (stops with the core).
pub fn start_ticker(core: Rc<CoreState>) {
    glommio::spawn_local(async move {
        let coordinator = Coordinator::current();
        let config = &core.node.config;
        coordinator.write_timeout.set(Some(Duration::from_millis(
            config.offsets_commit_timeout_ms,
        )));
        let cleanup_interval =
            Duration::from_millis(config.offsets_retention_check_interval_ms.max(100));
        let retention_ms = config.offsets_retention_minutes.saturating_mul(60_000);
        let mut last_cleanup = std::time::Instant::now();
        while !core.stopping.get() {
            glommio::timer::sleep(TICK_INTERVAL).await;
            coordinator.tick(&core.shard).await;
            if last_cleanup.elapsed() >= cleanup_interval {
                last_cleanup = std::time::Instant::now();
                coordinator.cleanup(&core.shard, retention_ms).await;
            }
        }
    })
    .detach();
}
