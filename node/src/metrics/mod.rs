//! Metrics and health: what each core counts, how a scrape gathers it, and the
//! node's health.
//!
//! Each core counts its own work in `CoreMetrics` (in `CoreState`: plain `Cell`s
//! and a `RefCell` map, no atomics, no locks; only its own thread touches them),
//! and the engine does the same for fdatasyncs, cleaning and retention
//! (`skiff_engine::stats`). A scrape (`gather`, on the core serving HTTP, core 0)
//! asks every core with `Shard::invoke_on` for a `CoreSnapshot` (plain data, taken
//! in one go on that core) and sums them; `exposition` renders the sum in the
//! Prometheus text format, `http` serves it.
//!
//! The cluster's share (`ClusterSnapshot`) is taken on the scraping core at
//! scrape time, nothing on the hot path: the broker side from core 0's
//! `Broker` and `TopicTable` (the committed metadata this node applied), the
//! controller side from `NodeContext::controller` (the controller thread's
//! published `ControllerStatus`) when this node runs one.
//!
//! Not here yet: what replication will produce (ISR shrinks/expands, leader
//! elections, follower lag, fetcher rates). They go into `CoreSnapshot`
//! (per-partition replica state from the owner core) when replicas copy data.

pub mod exposition;
pub mod http;

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use std::time::Duration;

use kafka_protocol::messages::{ApiKey, ResponseKind};
use skiff_engine::stats::{Histogram, HistogramSnapshot, ShardStatsSnapshot};
use skiff_engine::{LogStats, Shard, TopicPartition};

use skiff_controller::service::ControllerStatus;

use crate::cluster::Broker;
use crate::config::NodeConfig;
use crate::state::CoreState;
use crate::topics::TopicTable;

/// Request counters are kept per API key below this (Kafka's keys end near 90).
pub const API_KEYS_MAX: usize = 128;

/// Where the node is in its life, for `/health`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Recovering partitions, loading groups, opening listeners.
    Starting,
    /// Every listener open.
    Serving,
    /// Serving, but the controller has fenced this node (its session
    /// expired): it leads nothing until a heartbeat unfences it.
    Fenced,
    /// SIGTERM/SIGINT received: finishing in-flight requests, closing logs.
    Stopping,
}

/// Bytes and records produced to and fetched from one topic.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TopicIo {
    pub bytes_in: u64,
    pub records_in: u64,
    pub bytes_out: u64,
    pub records_out: u64,
}

impl TopicIo {
    fn merge(&mut self, other: &TopicIo) {
        self.bytes_in += other.bytes_in;
        self.records_in += other.records_in;
        self.bytes_out += other.bytes_out;
        self.records_out += other.records_out;
    }
}

/// One core's counters of the Kafka API it serves. Only its own thread touches
/// them (they live in the thread-local `CoreState`), so they are plain cells.
pub struct CoreMetrics {
    /// By topic name; entries of deleted topics are dropped at the next scrape
    /// (`CoreMetrics::snapshot`), so the map is bounded by the live topics.
    topics: RefCell<HashMap<String, TopicIo>>,
    /// By API key.
    requests: [Cell<u64>; API_KEYS_MAX],
    /// (API key, error code) -> responses or partition results with that error.
    errors: RefCell<HashMap<(i16, i16), u64>>,
    /// Frames that did not decode (the connection was closed).
    decode_errors: Cell<u64>,
    /// TLS handshakes that failed (garbage, a refused certificate, a
    /// plaintext client on a TLS listener, a timeout).
    tls_handshake_failures: Cell<u64>,
    /// Requests over a client quota, by `QuotaKey::ALL` index.
    throttled: [Cell<u64>; 3],
    connections_accepted: Cell<u64>,
    connections_open: Cell<u64>,
    produce_latency_acks_1: Histogram,
    produce_latency_acks_all: Histogram,
    fetch_latency: Histogram,
}

impl Default for CoreMetrics {
    fn default() -> Self {
        CoreMetrics {
            topics: RefCell::default(),
            requests: std::array::from_fn(|_| Cell::new(0)),
            errors: RefCell::default(),
            decode_errors: Cell::new(0),
            tls_handshake_failures: Cell::new(0),
            throttled: std::array::from_fn(|_| Cell::new(0)),
            connections_accepted: Cell::new(0),
            connections_open: Cell::new(0),
            produce_latency_acks_1: Histogram::default(),
            produce_latency_acks_all: Histogram::default(),
            fetch_latency: Histogram::default(),
        }
    }
}

fn add(cell: &Cell<u64>, n: u64) {
    cell.set(cell.get().saturating_add(n));
}

impl CoreMetrics {
    fn topic(&self, topic: &str, f: impl FnOnce(&mut TopicIo)) {
        let mut topics = self.topics.borrow_mut();
        // No allocation once the topic has an entry.
        match topics.get_mut(topic) {
            Some(io) => f(io),
            None => f(topics.entry(topic.to_string()).or_default()),
        }
    }

    /// A batch appended to `topic` (not a duplicate answered from producer state).
    pub fn produced(&self, topic: &str, bytes: usize, records: i32) {
        self.topic(topic, |io| {
            io.bytes_in += bytes as u64;
            io.records_in += u64::try_from(records).unwrap_or(0);
        });
    }

    /// Batches of `topic` put into a fetch response.
    pub fn fetched(&self, topic: &str, bytes: usize, records: u64) {
        self.topic(topic, |io| {
            io.bytes_out += bytes as u64;
            io.records_out += records;
        });
    }

    pub fn request(&self, api_key: ApiKey) {
        if let Some(c) = self.requests.get(api_key as i16 as usize) {
            add(c, 1);
        }
    }

    /// Counts every error code a response carries (top level, per topic, per
    /// partition), as Kafka's ErrorsPerSec does.
    pub fn response(&self, api_key: ApiKey, response: &ResponseKind) {
        error_codes(response, |code| {
            if code != 0 {
                *self
                    .errors
                    .borrow_mut()
                    .entry((api_key as i16, code))
                    .or_default() += 1;
            }
        });
    }

    pub fn decode_error(&self) {
        add(&self.decode_errors, 1);
    }

    pub fn tls_handshake_failed(&self) {
        add(&self.tls_handshake_failures, 1);
    }

    pub fn throttled(&self, key: skiff_security::quota::QuotaKey) {
        if let Some(i) = skiff_security::quota::QuotaKey::ALL
            .iter()
            .position(|k| *k == key)
        {
            add(&self.throttled[i], 1);
        }
    }

    pub fn connection_opened(&self) {
        add(&self.connections_accepted, 1);
        add(&self.connections_open, 1);
    }

    pub fn connection_closed(&self) {
        self.connections_open
            .set(self.connections_open.get().saturating_sub(1));
    }

    /// A produce answered `elapsed` after its frame was decoded (acks=1 or -1;
    /// acks=0 is never answered).
    pub fn produce_latency(&self, acks: i16, elapsed: Duration) {
        match acks {
            -1 => self.produce_latency_acks_all.observe(elapsed),
            1 => self.produce_latency_acks_1.observe(elapsed),
            _ => {}
        }
    }

    /// A fetch answered `elapsed` after its frame was decoded (long poll included).
    pub fn fetch_latency(&self, elapsed: Duration) {
        self.fetch_latency.observe(elapsed);
    }

    /// The counters now; forgets topics `live` does not know (deleted ones).
    fn snapshot(&self, live: impl Fn(&str) -> bool) -> ApiSnapshot {
        self.topics.borrow_mut().retain(|name, _| live(name));
        ApiSnapshot {
            topics: self
                .topics
                .borrow()
                .iter()
                .map(|(k, v)| (k.clone(), *v))
                .collect(),
            requests: self
                .requests
                .iter()
                .enumerate()
                .filter(|(_, c)| c.get() > 0)
                .map(|(key, c)| (key as i16, c.get()))
                .collect(),
            errors: self.errors.borrow().iter().map(|(k, v)| (*k, *v)).collect(),
            decode_errors: self.decode_errors.get(),
            tls_handshake_failures: self.tls_handshake_failures.get(),
            throttled: std::array::from_fn(|i| self.throttled[i].get()),
            connections_accepted: self.connections_accepted.get(),
            connections_refused: 0,
            connections_open: self.connections_open.get(),
            produce_latency_acks_1: self.produce_latency_acks_1.snapshot(),
            produce_latency_acks_all: self.produce_latency_acks_all.snapshot(),
            fetch_latency: self.fetch_latency.snapshot(),
        }
    }
}

/// Calls `f` with every error code in a response.
fn error_codes(response: &ResponseKind, mut f: impl FnMut(i16)) {
    match response {
        ResponseKind::Produce(r) => r
            .responses
            .iter()
            .flat_map(|t| &t.partition_responses)
            .for_each(|p| f(p.error_code)),
        ResponseKind::Fetch(r) => {
            f(r.error_code);
            r.responses
                .iter()
                .flat_map(|t| &t.partitions)
                .for_each(|p| f(p.error_code));
        }
        ResponseKind::ListOffsets(r) => r
            .topics
            .iter()
            .flat_map(|t| &t.partitions)
            .for_each(|p| f(p.error_code)),
        ResponseKind::Metadata(r) => {
            for t in &r.topics {
                f(t.error_code);
                t.partitions.iter().for_each(|p| f(p.error_code));
            }
        }
        ResponseKind::CreateTopics(r) => r.topics.iter().for_each(|t| f(t.error_code)),
        ResponseKind::DeleteTopics(r) => r.responses.iter().for_each(|t| f(t.error_code)),
        ResponseKind::CreatePartitions(r) => r.results.iter().for_each(|t| f(t.error_code)),
        ResponseKind::DescribeCluster(r) => f(r.error_code),
        ResponseKind::DescribeProducers(r) => r
            .topics
            .iter()
            .flat_map(|t| &t.partitions)
            .for_each(|p| f(p.error_code)),
        ResponseKind::DescribeLogDirs(r) => {
            f(r.error_code);
            r.results.iter().for_each(|x| f(x.error_code));
        }
        ResponseKind::OffsetDelete(r) => {
            f(r.error_code);
            r.topics
                .iter()
                .flat_map(|t| &t.partitions)
                .for_each(|p| f(p.error_code));
        }
        ResponseKind::AlterConfigs(r) => r.responses.iter().for_each(|x| f(x.error_code)),
        ResponseKind::AlterPartitionReassignments(r) => {
            f(r.error_code);
            r.responses
                .iter()
                .flat_map(|t| &t.partitions)
                .for_each(|p| f(p.error_code));
        }
        ResponseKind::ListPartitionReassignments(r) => f(r.error_code),
        ResponseKind::UnregisterBroker(r) => f(r.error_code),
        ResponseKind::ElectLeaders(r) => {
            f(r.error_code);
            r.replica_election_results
                .iter()
                .flat_map(|t| &t.partition_result)
                .for_each(|p| f(p.error_code));
        }
        ResponseKind::DescribeQuorum(r) => {
            f(r.error_code);
            r.topics
                .iter()
                .flat_map(|t| &t.partitions)
                .for_each(|p| f(p.error_code));
        }
        ResponseKind::DeleteRecords(r) => r
            .topics
            .iter()
            .flat_map(|t| &t.partitions)
            .for_each(|p| f(p.error_code)),
        ResponseKind::DescribeConfigs(r) => r.results.iter().for_each(|x| f(x.error_code)),
        ResponseKind::IncrementalAlterConfigs(r) => {
            r.responses.iter().for_each(|x| f(x.error_code))
        }
        ResponseKind::FindCoordinator(r) => {
            f(r.error_code);
            r.coordinators.iter().for_each(|c| f(c.error_code));
        }
        ResponseKind::JoinGroup(r) => f(r.error_code),
        ResponseKind::SyncGroup(r) => f(r.error_code),
        ResponseKind::Heartbeat(r) => f(r.error_code),
        ResponseKind::LeaveGroup(r) => {
            f(r.error_code);
            r.members.iter().for_each(|m| f(m.error_code));
        }
        ResponseKind::OffsetCommit(r) => r
            .topics
            .iter()
            .flat_map(|t| &t.partitions)
            .for_each(|p| f(p.error_code)),
        ResponseKind::OffsetFetch(r) => {
            f(r.error_code);
            r.topics
                .iter()
                .flat_map(|t| &t.partitions)
                .for_each(|p| f(p.error_code));
            for g in &r.groups {
                f(g.error_code);
                g.topics
                    .iter()
                    .flat_map(|t| &t.partitions)
                    .for_each(|p| f(p.error_code));
            }
        }
        ResponseKind::ListGroups(r) => f(r.error_code),
        ResponseKind::DescribeGroups(r) => r.groups.iter().for_each(|g| f(g.error_code)),
        ResponseKind::DeleteGroups(r) => r.results.iter().for_each(|g| f(g.error_code)),
        ResponseKind::InitProducerId(r) => f(r.error_code),
        ResponseKind::ApiVersions(r) => f(r.error_code),
        _ => {}
    }
}

/// The API counters of one core (or, merged, of the node).
#[derive(Debug, Clone, Default)]
pub struct ApiSnapshot {
    pub topics: BTreeMap<String, TopicIo>,
    pub requests: BTreeMap<i16, u64>,
    pub errors: BTreeMap<(i16, i16), u64>,
    pub decode_errors: u64,
    pub tls_handshake_failures: u64,
    /// Requests throttled, by `QuotaKey::ALL` index.
    pub throttled: [u64; 3],
    pub connections_accepted: u64,
    /// New connections closed at once for `max.connections.per.ip`
    /// (node-wide, taken once per scrape, not merged).
    pub connections_refused: u64,
    pub connections_open: u64,
    pub produce_latency_acks_1: HistogramSnapshot,
    pub produce_latency_acks_all: HistogramSnapshot,
    pub fetch_latency: HistogramSnapshot,
}

impl ApiSnapshot {
    fn merge(&mut self, other: &ApiSnapshot) {
        for (topic, io) in &other.topics {
            self.topics.entry(topic.clone()).or_default().merge(io);
        }
        for (key, n) in &other.requests {
            *self.requests.entry(*key).or_default() += n;
        }
        for (key, n) in &other.errors {
            *self.errors.entry(*key).or_default() += n;
        }
        self.decode_errors += other.decode_errors;
        self.tls_handshake_failures += other.tls_handshake_failures;
        for (t, o) in self.throttled.iter_mut().zip(other.throttled) {
            *t += o;
        }
        self.connections_accepted += other.connections_accepted;
        self.connections_open += other.connections_open;
        self.produce_latency_acks_1
            .merge(&other.produce_latency_acks_1);
        self.produce_latency_acks_all
            .merge(&other.produce_latency_acks_all);
        self.fetch_latency.merge(&other.fetch_latency);
    }
}

/// One partition's log, as its owner core saw it.
#[derive(Debug, Clone)]
pub struct PartitionSnapshot {
    pub tp: TopicPartition,
    pub log: LogStats,
}

/// Everything one core knows (or, merged, the node).
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub cores: usize,
    pub api: ApiSnapshot,
    pub engine: ShardStatsSnapshot,
    pub cache_hits: u64,
    pub cache_misses: u64,
    pub cache_bytes: u64,
    pub cache_bytes_max: u64,
    pub partitions: Vec<PartitionSnapshot>,
    /// Partitions this node should serve but cannot, with the reason.
    pub offline: Vec<(TopicPartition, String)>,
    /// The cluster as this node sees it (taken once per scrape, not merged).
    pub cluster: ClusterSnapshot,
    /// Replication counters and follower lag (summed / listed over cores).
    pub replication: crate::replica::ReplicationSnapshot,
    /// KIP-227 fetch sessions held (summed over cores).
    pub fetch_sessions: FetchSessionSnapshot,
}

/// The fetch session caches' contents and churn.
#[derive(Debug, Clone, Copy, Default)]
pub struct FetchSessionSnapshot {
    pub sessions: u64,
    pub partitions: u64,
    pub created: u64,
    pub evicted: u64,
}

/// The cluster as this node sees it at a scrape.
#[derive(Debug, Clone, Default)]
pub struct ClusterSnapshot {
    /// None: no broker link on the scraping core (not core 0, or not started).
    pub broker: Option<BrokerSnapshot>,
    /// None: this node runs no controller.
    pub controller: Option<ControllerStatus>,
}

/// The broker's view, from the metadata it applied. `cluster_*` fields are
/// the whole cluster (the same on every up-to-date broker); the others are
/// this node's share (they add up over the brokers).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BrokerSnapshot {
    pub fenced: bool,
    /// The last metadata offset this broker applied.
    pub metadata_offset: u64,
    /// Registered brokers, fenced ones included.
    pub cluster_brokers: usize,
    pub cluster_brokers_fenced: usize,
    /// Partitions without a leader (leader -1), every topic.
    pub cluster_partitions_offline: usize,
    /// Partitions this node leads.
    pub partitions_led: usize,
    /// Of those, ISR smaller than the replica set.
    pub partitions_under_replicated: usize,
    /// Of those, ISR smaller than the topic's effective min.insync.replicas.
    pub partitions_under_min_isr: usize,
}

impl BrokerSnapshot {
    /// Counts from a metadata table; `fenced` and `metadata_offset` are the
    /// broker's own.
    pub fn from_table(
        table: &TopicTable,
        config: &NodeConfig,
        fenced: bool,
        metadata_offset: u64,
    ) -> BrokerSnapshot {
        let mut s = BrokerSnapshot {
            fenced,
            metadata_offset,
            cluster_brokers: table.brokers.len(),
            cluster_brokers_fenced: table.brokers.iter().filter(|b| b.fenced).count(),
            ..BrokerSnapshot::default()
        };
        for t in table.topics.values() {
            let min_isr = usize::try_from(config.min_insync_replicas_for(&t.configs)).unwrap_or(0);
            for a in &t.assignment {
                if a.leader == skiff_controller::records::NO_LEADER {
                    s.cluster_partitions_offline += 1;
                }
                if a.leader != table.node_id {
                    continue;
                }
                s.partitions_led += 1;
                if a.isr.len() < a.replicas.len() {
                    s.partitions_under_replicated += 1;
                }
                if a.isr.len() < min_isr {
                    s.partitions_under_min_isr += 1;
                }
            }
        }
        s
    }
}

/// The cluster part of a scrape, taken on the calling core.
fn cluster_snapshot(core: &CoreState) -> ClusterSnapshot {
    ClusterSnapshot {
        broker: Broker::current().map(|b| {
            BrokerSnapshot::from_table(
                &core.topics(),
                &core.node.config,
                b.is_fenced(),
                b.applied(),
            )
        }),
        controller: core.node.controller.as_ref().map(|c| c.status()),
    }
}

impl Snapshot {
    fn merge(&mut self, other: Snapshot) {
        self.cores += other.cores;
        self.api.merge(&other.api);
        self.engine.merge(&other.engine);
        self.cache_hits += other.cache_hits;
        self.cache_misses += other.cache_misses;
        self.cache_bytes += other.cache_bytes;
        self.cache_bytes_max += other.cache_bytes_max;
        self.partitions.extend(other.partitions);
        self.offline.extend(other.offline);
        self.replication.merge(other.replication);
        self.fetch_sessions.sessions += other.fetch_sessions.sessions;
        self.fetch_sessions.partitions += other.fetch_sessions.partitions;
        self.fetch_sessions.created += other.fetch_sessions.created;
        self.fetch_sessions.evicted += other.fetch_sessions.evicted;
    }
}

/// Takes this core's snapshot (runs on the core it describes).
async fn collect(shard: Rc<Shard>) -> Snapshot {
    let Some(core) = CoreState::current() else {
        return Snapshot::default();
    };
    let topics = core.topics();
    let api = core.metrics.snapshot(|name| topics.get(name).is_some());
    let cache = shard.cache_stats();
    let mut partitions = Vec::new();
    let mut offline = Vec::new();
    for (tp, p) in shard.local_partition_handles() {
        match p.log_stats().await {
            Ok(log) => {
                if let Some(reason) = &log.offline {
                    offline.push((tp.clone(), reason.clone()));
                }
                partitions.push(PartitionSnapshot { tp, log });
            }
            Err(e) => offline.push((tp, e.to_string())),
        }
    }
    offline.extend(missing_partitions(&core, &shard));
    Snapshot {
        cores: 1,
        api,
        engine: shard.stats(),
        cache_hits: cache.hits,
        cache_misses: cache.misses,
        cache_bytes: cache.bytes_used as u64,
        cache_bytes_max: shard.config().batch_cache_bytes_max as u64,
        partitions,
        offline,
        cluster: ClusterSnapshot::default(),
        replication: crate::replica::snapshot(&|tp| shard.local(tp)),
        fetch_sessions: {
            let sessions = core.fetch_sessions.borrow();
            FetchSessionSnapshot {
                sessions: sessions.len() as u64,
                partitions: sessions.partitions() as u64,
                created: sessions.created,
                evicted: sessions.evicted,
            }
        },
    }
}

/// Partitions assigned to this node that this core owns but has no log for.
fn missing_partitions(core: &CoreState, shard: &Shard) -> Vec<(TopicPartition, String)> {
    let table = shard.table();
    let topics = core.topics();
    let mut missing = Vec::new();
    for t in topics.topics.values() {
        for (p, a) in t.assignment.iter().enumerate() {
            if !a.replicas.contains(&topics.node_id) {
                continue;
            }
            let tp = TopicPartition::new(t.name.clone(), p as i32);
            if table.shard_of(&tp) == shard.id() && shard.local(&tp).is_none() {
                missing.push((tp, "no log on its owner core".to_string()));
            }
        }
    }
    missing
}

/// This core's offline partitions (runs on the core it describes).
async fn collect_offline(shard: Rc<Shard>) -> Vec<(TopicPartition, String)> {
    let mut offline = Vec::new();
    for (tp, p) in shard.local_partition_handles() {
        match p.offline_reason().await {
            Ok(None) => {}
            Ok(Some(reason)) => offline.push((tp, reason)),
            Err(e) => offline.push((tp, e.to_string())),
        }
    }
    if let Some(core) = CoreState::current() {
        offline.extend(missing_partitions(&core, &shard));
    }
    offline
}

/// A core that did not answer a scrape.
#[derive(Debug, thiserror::Error)]
#[error("core {core} did not answer: {reason}")]
pub struct GatherError {
    pub core: usize,
    pub reason: String,
}

/// Every core's snapshot, summed, with the cluster as the calling core sees
/// it (the broker side only on core 0). Runs on any core.
pub async fn gather(core: &CoreState) -> Result<Snapshot, GatherError> {
    let mut total = Snapshot::default();
    for target in 0..core.shard.table().shards() {
        let snapshot = core
            .shard
            .invoke_on(target, |shard| async move { collect(shard).await })
            .await
            .map_err(|e| GatherError {
                core: target,
                reason: e.to_string(),
            })?;
        total.merge(snapshot);
    }
    total.partitions.sort_by(|a, b| a.tp.cmp(&b.tp));
    total.offline.sort();
    total.cluster = cluster_snapshot(core);
    total.api.connections_refused = core
        .node
        .conn_limits
        .as_ref()
        .map_or(0, |l| l.refused_total());
    Ok(total)
}

/// The partitions of this node that cannot be served, from every core.
pub async fn offline_partitions(
    core: &CoreState,
) -> Result<Vec<(TopicPartition, String)>, GatherError> {
    let mut all = Vec::new();
    for target in 0..core.shard.table().shards() {
        let offline = core
            .shard
            .invoke_on(target, |shard| async move { collect_offline(shard).await })
            .await
            .map_err(|e| GatherError {
                core: target,
                reason: e.to_string(),
            })?;
        all.extend(offline);
    }
    all.sort();
    Ok(all)
}

/// `Ok` when the node is serving every partition it holds; otherwise why not
/// (the body of a 503).
pub async fn health(core: &CoreState) -> Result<(), String> {
    match core.phase.get() {
        Phase::Starting => return Err("starting".into()),
        Phase::Stopping => return Err("stopping".into()),
        Phase::Fenced => return Err("fenced by the controller".into()),
        Phase::Serving => {}
    }
    let offline = offline_partitions(core).await.map_err(|e| e.to_string())?;
    if offline.is_empty() {
        return Ok(());
    }
    let listed: Vec<String> = offline
        .iter()
        .take(OFFLINE_LISTED_MAX)
        .map(|(tp, reason)| format!("{tp}: {reason}"))
        .collect();
    Err(format!(
        "{} partition(s) offline: {}{}",
        offline.len(),
        listed.join("; "),
        if offline.len() > OFFLINE_LISTED_MAX {
            "; ..."
        } else {
            ""
        }
    ))
}

/// How many offline partitions a 503 names.
const OFFLINE_LISTED_MAX: usize = 20;

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::collections::BTreeMap;

    use uuid::Uuid;

    use super::*;
    use crate::topics::{Assignment, BrokerInfo, TopicInfo};

    fn assignment(replicas: &[i32], isr: &[i32], leader: i32) -> Assignment {
        Assignment {
            replicas: replicas.to_vec(),
            isr: isr.to_vec(),
            leader,
            leader_epoch: 0,
            partition_epoch: 0,
            adding: Vec::new(),
            removing: Vec::new(),
        }
    }

    fn topic(name: &str, configs: &[(&str, &str)], assignment: Vec<Assignment>) -> TopicInfo {
        TopicInfo {
            name: name.into(),
            id: Uuid::from_u128(name.len() as u128 + 1),
            partitions: assignment.len() as i32,
            configs: configs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            assignment,
        }
    }

    fn broker(id: i32, fenced: bool) -> BrokerInfo {
        BrokerInfo {
            endpoints: Vec::new(),
            id,
            host: "localhost".into(),
            port: 9092,
            rack: None,
            fenced,
            in_controlled_shutdown: false,
        }
    }

    #[test]
    fn cluster_metrics_count_the_applied_metadata() {
        let topics: BTreeMap<String, TopicInfo> = [
            // Led here: one full ISR, one shrunk; the other partition is
            // another node's, the last has no leader.
            topic(
                "a",
                &[],
                vec![
                    assignment(&[1, 2], &[1, 2], 1),
                    assignment(&[1, 2], &[1], 1),
                    assignment(&[2, 1], &[2, 1], 2),
                    assignment(&[3], &[3], -1),
                ],
            ),
            // min.insync.replicas=2 overridden: an ISR of one is under it.
            topic(
                "b",
                &[("min.insync.replicas", "2")],
                vec![
                    assignment(&[1], &[1], 1),
                    assignment(&[1, 2, 3], &[1, 2], 1),
                ],
            ),
            // A partition without a record yet: no replicas, no leader.
            topic("c", &[], vec![assignment(&[], &[], -1)]),
        ]
        .into_iter()
        .map(|t| (t.name.clone(), t))
        .collect();
        let table = TopicTable {
            topics,
            brokers: vec![broker(1, false), broker(2, false), broker(3, true)],
            node_id: 1,
            metadata_offset: 9,
            cluster_id: None,
            cluster_configs: BTreeMap::new(),
            node_configs: BTreeMap::new(),
            security: Default::default(),
        };
        let mut config = NodeConfig::defaults().unwrap();
        let s = BrokerSnapshot::from_table(&table, &config, false, 12);
        assert_eq!(
            s,
            BrokerSnapshot {
                fenced: false,
                metadata_offset: 12,
                cluster_brokers: 3,
                cluster_brokers_fenced: 1,
                cluster_partitions_offline: 2,
                partitions_led: 4,
                partitions_under_replicated: 2,
                partitions_under_min_isr: 1,
            }
        );
        // The node default applies where a topic has no override.
        config.min_insync_replicas = 2;
        let s = BrokerSnapshot::from_table(&table, &config, true, 12);
        assert!(s.fenced);
        assert_eq!(s.partitions_under_min_isr, 2);
        // One replica, full ISR, default min ISR 1: nothing to report.
        let single = TopicTable {
            topics: [topic("t", &[], vec![assignment(&[1], &[1], 1)])]
                .into_iter()
                .map(|t| (t.name.clone(), t))
                .collect(),
            brokers: vec![broker(1, false)],
            node_id: 1,
            metadata_offset: 3,
            cluster_id: None,
            cluster_configs: BTreeMap::new(),
            node_configs: BTreeMap::new(),
            security: Default::default(),
        };
        let s = BrokerSnapshot::from_table(&single, &NodeConfig::defaults().unwrap(), false, 3);
        assert_eq!(
            (
                s.partitions_led,
                s.partitions_under_replicated,
                s.partitions_under_min_isr,
                s.cluster_partitions_offline
            ),
            (1, 0, 0, 0)
        );
    }
}
