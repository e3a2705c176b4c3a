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

use std::rc::Rc;

use skiff_engine::stats::ShardStatsSnapshot;
use skiff_engine::{LogStats, Shard, TopicPartition};

use skiff_controller::service::ControllerStatus;

use crate::cluster::Broker;
use crate::config::NodeConfig;
use crate::state::CoreState;
use crate::topics::TopicTable;

pub mod counters;

pub use counters::{ApiSnapshot, CoreMetrics, Phase, TopicIo, API_KEYS_MAX};

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
