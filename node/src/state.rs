//! Node-wide context (shared, read-only after start) and per-core state (one per
//! executor thread, reached through a thread-local: thread-per-core).

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use glommio::sync::Semaphore;
use skiff_controller::service::StatusReader;
use skiff_engine::{Shard, TopicPartition};

use crate::config::NodeConfig;
use crate::fetch_session::SessionCache;
use crate::metrics::counters::{CoreMetrics, Phase};
use crate::producer::state::ProducerStates;
use crate::topics::table::TopicTable;

/// Set by the stop signal's waiter while the node starts: the start's waits
/// on the controllers give up at their next retry instead of after
/// `cluster::START_TIMEOUT` (a SIGTERM to a node that could not register
/// took two minutes to stop it).
static STOP_REQUESTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Asks a starting node to give up (see `STOP_REQUESTED`).
pub fn request_stop() {
    STOP_REQUESTED.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// Whether a stop was asked for (see `STOP_REQUESTED`).
pub fn stop_requested() -> bool {
    STOP_REQUESTED.load(std::sync::atomic::Ordering::Relaxed)
}

/// Shared by every core; immutable except the producer id allocator, which is
/// only used by InitProducerId (not the hot path).
pub struct NodeContext {
    pub config: NodeConfig,
    pub data_dir: PathBuf,
    pub cluster_id: String,
    pub producer_ids: Mutex<ProducerIdAllocator>,
    /// This node's controller's status (None: not a controller), for the
    /// metrics scrape on core 0. Read at scrape time only.
    pub controller: Option<StatusReader>,
    /// The Kafka listeners, with the ports they were bound to.
    pub listeners: Vec<crate::config::Listener>,
    /// The listener's TLS (SSL, SASL_SSL) and the followers' side of it.
    pub tls: Option<crate::tls::Tls>,
    /// `max.connections`, `max.connections.per.ip` (None: no limits).
    pub conn_limits: Option<std::sync::Arc<crate::conn_limits::ConnectionLimits>>,
    /// Client quotas' usage, node-wide (`crate::quota`).
    pub quota_budgets: crate::quota::QuotaBudgets,
}

/// Hands out producer ids in blocks whose end is persisted before use, so ids
/// are never reused across restarts. Ids carry the node id in their high 32
/// bits, so two nodes never hand out the same one (Kafka allocates blocks
/// through the controller; this needs no round trip).
pub struct ProducerIdAllocator {
    path: PathBuf,
    prefix: i64,
    next: i64,
    block_end: i64,
}

pub const PRODUCER_ID_BLOCK: i64 = 1000;
pub const PRODUCER_ID_FILE: &str = "producer-id-block";

impl ProducerIdAllocator {
    pub fn open(data_dir: &std::path::Path, node_id: i32) -> std::io::Result<Self> {
        let path = data_dir.join(PRODUCER_ID_FILE);
        let next = match std::fs::read_to_string(&path) {
            Ok(text) => text.trim().parse().map_err(|_| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("{}: not a number", path.display()),
                )
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
            Err(e) => return Err(e),
        };
        Ok(ProducerIdAllocator {
            path,
            prefix: i64::from(node_id.max(0)) << 32,
            next,
            block_end: next,
        })
    }

    pub fn allocate(&mut self) -> std::io::Result<i64> {
        if self.next >= self.block_end {
            let end = self.next + PRODUCER_ID_BLOCK;
            let tmp = self.path.with_extension("tmp");
            std::fs::write(&tmp, format!("{end}\n"))?;
            std::fs::File::open(&tmp)?.sync_all()?;
            std::fs::rename(&tmp, &self.path)?;
            self.block_end = end;
        }
        if self.next >= 1 << 32 {
            return Err(std::io::Error::other(
                "this node has handed out 2^32 producer ids",
            ));
        }
        let id = self.prefix | self.next;
        self.next += 1;
        Ok(id)
    }
}

thread_local! {
    static CORE: RefCell<Option<Rc<CoreState>>> = const { RefCell::new(None) };
}

pub struct CoreState {
    pub shard: Rc<Shard>,
    pub node: Arc<NodeContext>,
    topics: RefCell<Arc<TopicTable>>,
    /// Producer state of the partitions this core owns, with the lock that keeps
    /// check → append → record atomic per partition.
    producers: RefCell<HashMap<TopicPartition, Rc<PartitionProducers>>>,
    /// Serialises topic changes (used on core 0).
    pub admin_lock: Semaphore,
    pub stopping: Cell<bool>,
    /// This core's counters (only this core's thread touches them).
    pub metrics: CoreMetrics,
    /// Where the node is in its life; core 0's (where `/health` is served) is
    /// the one kept up to date.
    pub phase: Cell<Phase>,
    /// KIP-227 fetch sessions made by connections on this core.
    pub fetch_sessions: RefCell<SessionCache>,
}

pub struct PartitionProducers {
    pub lock: Semaphore,
    pub loaded: Cell<bool>,
    pub states: RefCell<ProducerStates>,
    /// `Partition::truncations` when the state was loaded: the state describes
    /// the log only while no truncation happened since.
    pub truncations: Cell<u64>,
    /// The offset of the producer snapshot the state was last written to or
    /// loaded from (-1: none): a snapshot is written when the log end moved.
    pub snapshot_offset: Cell<i64>,
    /// Bumped at every rebuild of `states`: part of a KIP-890 guard (a
    /// guard taken from an earlier state does not hold).
    pub generation: Cell<u64>,
}

impl CoreState {
    pub fn install(shard: Rc<Shard>, node: Arc<NodeContext>) -> Rc<CoreState> {
        // The node's session slots, shared out over its cores.
        let cores = shard.table().shards().max(1);
        let sessions_per_core = node.config.fetch_session_cache_slots.div_ceil(cores);
        let session_eviction =
            std::time::Duration::from_millis(node.config.fetch_session_eviction_ms);
        let state = Rc::new(CoreState {
            shard,
            node,
            topics: RefCell::new(Arc::new(TopicTable::default())),
            producers: RefCell::new(HashMap::new()),
            admin_lock: Semaphore::new(1),
            stopping: Cell::new(false),
            metrics: CoreMetrics::default(),
            phase: Cell::new(Phase::Starting),
            fetch_sessions: RefCell::new(SessionCache::new(sessions_per_core, session_eviction)),
        });
        CORE.with(|c| *c.borrow_mut() = Some(state.clone()));
        state
    }

    /// This core's state (None before `install`, or off the executors).
    pub fn current() -> Option<Rc<CoreState>> {
        CORE.with(|c| c.borrow().clone())
    }

    pub fn topics(&self) -> Arc<TopicTable> {
        self.topics.borrow().clone()
    }

    pub fn set_topics(&self, table: Arc<TopicTable>) {
        *self.topics.borrow_mut() = table;
    }

    pub fn producers(&self, tp: &TopicPartition) -> Rc<PartitionProducers> {
        self.producers
            .borrow_mut()
            .entry(tp.clone())
            .or_insert_with(|| {
                Rc::new(PartitionProducers {
                    lock: Semaphore::new(1),
                    loaded: Cell::new(false),
                    states: RefCell::new(ProducerStates::default()),
                    truncations: Cell::new(0),
                    snapshot_offset: Cell::new(-1),
                    generation: Cell::new(0),
                })
            })
            .clone()
    }

    /// The loaded producer states of this core's partitions.
    pub fn loaded_producers(&self) -> Vec<(TopicPartition, Rc<PartitionProducers>)> {
        self.producers
            .borrow()
            .iter()
            .filter(|(_, p)| p.loaded.get())
            .map(|(tp, p)| (tp.clone(), p.clone()))
            .collect()
    }

    /// Whether `producers` is still the state of `tp` (not forgotten since:
    /// a leadership change or a deletion).
    pub fn is_current(&self, tp: &TopicPartition, producers: &Rc<PartitionProducers>) -> bool {
        self.producers
            .borrow()
            .get(tp)
            .is_some_and(|p| Rc::ptr_eq(p, producers))
    }

    pub fn forget_partition(&self, tp: &TopicPartition) {
        self.producers.borrow_mut().remove(tp);
    }
}

/// What runs on a core when a new topic table arrives there.
type TableListener = Rc<dyn Fn(Rc<CoreState>, Arc<TopicTable>)>;

/// Names the leaderships of a core that its followers still follow.
type FollowedProbe = Rc<dyn Fn(Duration) -> Vec<TopicPartition>>;

thread_local! {
    static TABLE_LISTENERS: RefCell<Vec<TableListener>> = const { RefCell::new(Vec::new()) };
    static FOLLOWED_PROBE: RefCell<Option<FollowedProbe>> = const { RefCell::new(None) };
}

/// Registers, on the calling core, what names the partitions it leads whose
/// in-sync followers all caught up within a window (`replica::attach`).
pub fn on_followed_query(probe: impl Fn(Duration) -> Vec<TopicPartition> + 'static) {
    FOLLOWED_PROBE.with(|p| *p.borrow_mut() = Some(Rc::new(probe)));
}

/// Asks every core which partitions it leads are still followed by every
/// other in-sync replica within `within` (the lease watchdog's question:
/// cluster.rs), without calling into the replication driver.
pub async fn followed_leaderships(
    shard: &Rc<Shard>,
    within: Duration,
) -> Result<HashSet<TopicPartition>, skiff_engine::LogError> {
    let mut out = HashSet::new();
    for core in 0..shard.table().shards() {
        let found = shard
            .invoke_on(core, move |_| async move {
                let probe = FOLLOWED_PROBE.with(|p| p.borrow().clone());
                probe.map_or_else(Vec::new, |probe| probe(within))
            })
            .await?;
        out.extend(found);
    }
    Ok(out)
}

/// Registers, on the calling core, what runs when a new topic table is
/// published to it (the replica roles follow it: `replica::attach`). The
/// table reaches drivers as an event; nothing here calls up into them.
pub fn on_table_change(listener: impl Fn(Rc<CoreState>, Arc<TopicTable>) + 'static) {
    TABLE_LISTENERS.with(|l| l.borrow_mut().push(Rc::new(listener)));
}

/// Sends a new topic table to every core: each makes it its table, then
/// tells its listeners.
pub async fn publish_table(
    shard: &Rc<Shard>,
    table: Arc<TopicTable>,
) -> Result<(), skiff_engine::LogError> {
    for core in 0..shard.table().shards() {
        let table = table.clone();
        shard
            .invoke_on(core, move |_| async move {
                if let Some(state) = CoreState::current() {
                    state.set_topics(table.clone());
                    let listeners = TABLE_LISTENERS.with(|l| l.borrow().clone());
                    for listener in listeners {
                        listener(state.clone(), table.clone());
                    }
                }
            })
            .await?;
    }
    Ok(())
}
