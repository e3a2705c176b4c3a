//! The shard runtime: one glommio executor per core, each owning a disjoint set of
//! partitions.
//!
//! - `Runtime::start` spawns one pinned `LocalExecutor` per configured core. The
//!   executors join a glommio channel mesh; a shard's id is its index in the mesh.
//! - `ShardTable::shard_of` maps a partition to its shard with a fixed function of
//!   (topic, partition), so every core computes the owner on its own: no shared
//!   table, no lock, no atomic on the hot path. Consecutive partitions of a topic
//!   land on consecutive shards.
//! - `Shard` is the per-core handle (not `Send`): its partition calls run locally
//!   when this shard owns the partition and are shipped to the owner over the mesh
//!   otherwise (`invoke_on`), the answer coming back on a oneshot channel.
//! - Threads outside the runtime (the binary's main thread, tests, benchmarks) use
//!   `Runtime::submit` to run a closure on a shard.
//! - Background work per shard (periodic flush for `Durability::Interval`, recovery
//!   point checkpoints) runs in a low-share task queue so it cannot starve appends.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::rc::Rc;
use std::time::Duration;

use bytes::BytesMut;
use futures_channel::{mpsc, oneshot};
use futures_util::StreamExt;
use glommio::channels::channel_mesh::{MeshBuilder, Senders};
use glommio::{Latency, LocalExecutorBuilder, Placement, Shares};

use crate::batch_cache::{BatchCache, CacheStats};
use crate::cleaner::{Cleaner, CleanerConfig};
use crate::config::{Durability, LogConfig};
use crate::error::{LogError, Result};
use crate::log::{AppendInfo, AppendMode, PartitionLog, ReadBatches};
use crate::partition::{OffsetQuery, Partition};

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TopicPartition {
    pub topic: String,
    pub partition: i32,
}

impl TopicPartition {
    pub fn new(topic: impl Into<String>, partition: i32) -> Self {
        TopicPartition {
            topic: topic.into(),
            partition,
        }
    }

    /// Parses a partition directory name `<topic>-<partition>`.
    pub fn from_dir_name(name: &str) -> Option<TopicPartition> {
        let (topic, partition) = name.rsplit_once('-')?;
        if topic.is_empty()
            || partition.is_empty()
            || !partition.bytes().all(|b| b.is_ascii_digit())
        {
            return None;
        }
        Some(TopicPartition::new(topic, partition.parse().ok()?))
    }

    pub fn dir_name(&self) -> String {
        format!("{}-{}", self.topic, self.partition)
    }
}

impl fmt::Display for TopicPartition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.topic, self.partition)
    }
}

/// Which shard owns a partition: `(crc32c(topic) + partition) mod shards`.
#[derive(Debug, Clone, Copy)]
pub struct ShardTable {
    shards: usize,
}

impl ShardTable {
    pub fn new(shards: usize) -> Self {
        ShardTable {
            shards: shards.max(1),
        }
    }
    pub fn shards(&self) -> usize {
        self.shards
    }
    pub fn shard_of(&self, tp: &TopicPartition) -> usize {
        let h = u64::from(crc32c::crc32c(tp.topic.as_bytes()));
        ((h + tp.partition.max(0) as u64) % self.shards as u64) as usize
    }
}

#[derive(Debug, Clone)]
pub struct ShardConfig {
    pub data_dir: PathBuf,
    /// This node's id, recorded in the data dir's `meta.properties`.
    pub node_id: i32,
    /// CPUs to pin one executor each to; `None` entries run unpinned. The shard
    /// count is `cpus.len()`.
    pub cpus: Vec<Option<usize>>,
    pub log: LogConfig,
    /// Bytes of recently appended batches each core keeps for reads.
    pub batch_cache_bytes_max: usize,
    /// Memory glommio registers with io_uring for DMA buffers, per core.
    pub io_memory_bytes: usize,
    /// How often each core persists its partitions' recovery points
    /// (Kafka's `log.flush.offset.checkpoint.interval.ms`).
    pub checkpoint_interval: Duration,
    /// How often each core applies retention (`log.retention.check.interval.ms`).
    pub retention_check_interval: Duration,
    /// Bytes of closed segments each core reads and verifies per second, in
    /// the background, so bitrot in data nobody reads is found and repaired
    /// from the other replicas (`PartitionLog::scrub`). 0 turns it off.
    pub scrub_bytes_per_second: u64,
    /// Bytes of deleted segments and partitions each core frees per second,
    /// in the background (`trash`); 0 frees each file at once.
    pub delete_bytes_per_second: u64,
    /// Bytes waiting to be freed on a core above which its trash frees
    /// without pausing: the pace must not let the disk fill.
    pub delete_backlog_bytes: u64,
    /// Bound on cross-core requests queued towards one shard from one peer.
    pub mesh_channel_capacity: usize,
    /// The core's log cleaner (compaction).
    pub cleaner: CleanerConfig,
    /// How long one task queue may run before the executor polls io_uring and
    /// picks the next queue (glommio's preempt timer). Below a few milliseconds
    /// glommio 0.9 can hang at start (the channel mesh join never completes:
    /// seen with 500 us under load), so background work that runs long on the
    /// CPU (the cleaner) paces itself instead (`cleaner::Throttle::pace`).
    pub preempt_timer: Duration,
}

/// `ShardConfig::scrub_bytes_per_second`'s default: 8 MiB/s per core, well
/// under 1% of a disk's bandwidth; one pass over 1 TB on 8 cores takes about
/// four hours.
pub const SCRUB_BYTES_PER_SECOND: u64 = 8 << 20;

/// `ShardConfig::preempt_timer`'s default: glommio's own.
pub const PREEMPT_TIMER: Duration = Duration::from_millis(100);

impl ShardConfig {
    /// `shards` unpinned executors: tests and machines that share cores.
    pub fn unpinned(data_dir: impl Into<PathBuf>, shards: usize) -> Self {
        ShardConfig {
            data_dir: data_dir.into(),
            node_id: 1,
            cpus: vec![None; shards.max(1)],
            log: LogConfig::default(),
            batch_cache_bytes_max: 256 << 20,
            io_memory_bytes: 64 << 20,
            checkpoint_interval: Duration::from_secs(60),
            retention_check_interval: Duration::from_secs(300),
            scrub_bytes_per_second: SCRUB_BYTES_PER_SECOND,
            delete_bytes_per_second: crate::trash::DELETE_BYTES_PER_SECOND,
            delete_backlog_bytes: crate::trash::DELETE_BACKLOG_BYTES,
            mesh_channel_capacity: 1024,
            cleaner: CleanerConfig::default(),
            preempt_timer: PREEMPT_TIMER,
        }
    }
}

type Job = Box<dyn FnOnce(Rc<Shard>) -> Pin<Box<dyn Future<Output = ()>>> + Send>;

/// The per-core handle to the engine.
pub struct Shard {
    id: usize,
    table: ShardTable,
    config: ShardConfig,
    cache: BatchCache,
    partitions: RefCell<HashMap<TopicPartition, Rc<Partition>>>,
    peers: Senders<Job>,
    /// Set when the shard stops: the background loops end at their next
    /// step instead of being cancelled. (A glommio task cancelled while it
    /// holds a partition's lock, mid-flush, was sometimes never dropped, and
    /// the stop's close waited for that lock for ever.)
    stopping: Cell<bool>,
    stopped: crate::partition::Signal,
}

impl Shard {
    pub fn id(&self) -> usize {
        self.id
    }

    /// Sleeps `d`, less if the shard starts stopping: false once it is (a
    /// background loop returns then).
    async fn pause(&self, d: Duration) -> bool {
        if self.stopping.get() {
            return false;
        }
        let sleep = std::pin::pin!(glommio::timer::sleep(d));
        let stop = std::pin::pin!(self.stopped.wait());
        let _ = futures_util::future::select(sleep, stop).await;
        !self.stopping.get()
    }
    pub fn table(&self) -> ShardTable {
        self.table
    }
    pub fn config(&self) -> &ShardConfig {
        &self.config
    }
    pub fn cache_stats(&self) -> CacheStats {
        self.cache.stats()
    }
    /// This core's engine counters (fdatasyncs, cleaning, retention).
    pub fn stats(&self) -> crate::stats::ShardStatsSnapshot {
        crate::stats::local().snapshot()
    }
    /// This core's partitions (shared handles), for metrics and health.
    pub fn local_partition_handles(&self) -> Vec<(TopicPartition, Rc<Partition>)> {
        let mut v: Vec<_> = self
            .partitions
            .borrow()
            .iter()
            .map(|(tp, p)| (tp.clone(), p.clone()))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// This core's partition, if it owns it.
    pub fn local(&self, tp: &TopicPartition) -> Option<Rc<Partition>> {
        self.partitions.borrow().get(tp).cloned()
    }

    /// The partitions this core owns.
    pub fn local_partitions(&self) -> Vec<TopicPartition> {
        let mut v: Vec<_> = self.partitions.borrow().keys().cloned().collect();
        v.sort();
        v
    }

    /// Runs `f` on shard `target` (here, when it is this shard) and returns its
    /// result.
    pub async fn invoke_on<F, Fut, T>(self: &Rc<Self>, target: usize, f: F) -> Result<T>
    where
        F: FnOnce(Rc<Shard>) -> Fut + Send + 'static,
        Fut: Future<Output = T> + 'static,
        T: Send + 'static,
    {
        if target == self.id {
            return Ok(f(self.clone()).await);
        }
        let (tx, rx) = oneshot::channel();
        let origin = self.id;
        let job: Job = Box::new(move |shard| {
            Box::pin(async move {
                let out = f(shard.clone()).await;
                shard
                    .run_on(origin, move || {
                        let _ = tx.send(out);
                    })
                    .await;
            })
        });
        self.peers
            .send_to(target, job)
            .await
            .map_err(|_| LogError::RuntimeStopped)?;
        rx.await.map_err(|_| LogError::RuntimeStopped)
    }

    /// Runs `deliver` on shard `target` (here, at once, when it is this
    /// shard), as a job of its own there. A result for a task of another
    /// core goes back this way, so that core's waker is woken on its own
    /// thread: glommio counts a waker's references atomically but keeps the
    /// task's state unsynchronised, and a waker woken or dropped here while
    /// its task completed on its own core freed that task twice (a node
    /// aborted with "double free detected in tcache 2" in
    /// `process_foreign_wakes`). Dropped, not run, once `target` has stopped.
    pub async fn run_on(&self, target: usize, deliver: impl FnOnce() + Send + 'static) {
        if target == self.id {
            deliver();
            return;
        }
        let job: Job = Box::new(move |_| Box::pin(async move { deliver() }));
        let _ = self.peers.send_to(target, job).await;
    }

    async fn on_owner<F, Fut, T>(self: &Rc<Self>, tp: &TopicPartition, f: F) -> Result<T>
    where
        F: FnOnce(Rc<Partition>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T>> + 'static,
        T: Send + 'static,
    {
        let owner = self.table.shard_of(tp);
        let tp = tp.clone();
        self.invoke_on(owner, move |shard| async move {
            let partition = shard
                .local(&tp)
                .ok_or_else(|| LogError::UnknownPartition(tp.to_string()))?;
            f(partition).await
        })
        .await?
    }

    pub async fn create_partition(self: &Rc<Self>, tp: &TopicPartition) -> Result<()> {
        self.create_partition_with(tp, self.config.log.clone(), None)
            .await
    }

    /// Creates a partition with its own settings (a topic's config overrides)
    /// and, given one, its topic's id in `partition.metadata`.
    pub async fn create_partition_with(
        self: &Rc<Self>,
        tp: &TopicPartition,
        log: LogConfig,
        topic_id: Option<[u8; 16]>,
    ) -> Result<()> {
        let owner = self.table.shard_of(tp);
        let tp = tp.clone();
        self.invoke_on(owner, move |shard| async move {
            shard.open_local(&tp, Create::Yes(topic_id), log).await
        })
        .await?
    }

    /// Changes an open partition's settings.
    pub async fn update_partition_config(
        self: &Rc<Self>,
        tp: &TopicPartition,
        log: LogConfig,
    ) -> Result<()> {
        self.on_owner(tp, move |p| async move { p.update_config(log).await })
            .await
    }

    pub async fn delete_partition(self: &Rc<Self>, tp: &TopicPartition) -> Result<()> {
        let owner = self.table.shard_of(tp);
        let tp = tp.clone();
        self.invoke_on(owner, move |shard| async move {
            let partition = shard
                .partitions
                .borrow_mut()
                .remove(&tp)
                .ok_or_else(|| LogError::UnknownPartition(tp.to_string()))?;
            match Rc::try_unwrap(partition) {
                Ok(p) => p.delete().await,
                Err(shared) => {
                    // In-flight requests still hold it: close, then delete the files.
                    shared.close().await?;
                    let dir = shard.config.data_dir.join(tp.dir_name());
                    crate::trash::delete_dir(&dir).await
                }
            }
        })
        .await?
    }

    pub async fn append(
        self: &Rc<Self>,
        tp: &TopicPartition,
        batch: BytesMut,
        mode: AppendMode,
    ) -> Result<AppendInfo> {
        self.on_owner(tp, move |p| async move { p.append(batch, mode).await })
            .await
    }

    pub async fn read(
        self: &Rc<Self>,
        tp: &TopicPartition,
        offset: i64,
        max_bytes: usize,
        upper_bound: i64,
    ) -> Result<ReadBatches> {
        self.on_owner(tp, move |p| async move {
            p.read(offset, max_bytes, upper_bound).await
        })
        .await
    }

    pub async fn list_offset(
        self: &Rc<Self>,
        tp: &TopicPartition,
        query: OffsetQuery,
    ) -> Result<Option<(i64, i64)>> {
        self.on_owner(tp, move |p| async move { p.list_offset(query).await })
            .await
    }

    pub async fn truncate_to(self: &Rc<Self>, tp: &TopicPartition, offset: i64) -> Result<()> {
        self.on_owner(tp, move |p| async move { p.truncate_to(offset).await })
            .await
    }

    async fn open_local(&self, tp: &TopicPartition, create: Create, log: LogConfig) -> Result<()> {
        let new = matches!(create, Create::Yes(_));
        if self.partitions.borrow().contains_key(tp) {
            return if new {
                Err(LogError::PartitionExists(tp.to_string()))
            } else {
                Ok(())
            };
        }
        let dir = self.config.data_dir.join(tp.dir_name());
        if new && dir.exists() {
            return Err(LogError::PartitionExists(tp.to_string()));
        }
        if let Create::Yes(Some(topic_id)) = create {
            // Before the log: its first segment's directory fsync covers both.
            std::fs::create_dir_all(&dir).map_err(|e| LogError::io("create dir", &dir, e))?;
            crate::partition_meta::write_in_new_dir(&dir, &topic_id).await?;
        }
        let log =
            PartitionLog::open(&dir, &tp.topic, tp.partition, log, self.cache.clone()).await?;
        self.partitions
            .borrow_mut()
            .insert(tp.clone(), Rc::new(Partition::new(log)));
        Ok(())
    }

    /// Opens every partition directory of the data dir that this shard owns,
    /// `OPEN_CLOSE_CONCURRENCY` at a time: each open waits on its own reads
    /// (and on recovery's fdatasyncs after a crash), so thousands of partitions
    /// one after another would take the node minutes to serve.
    async fn open_owned(&self) -> Result<()> {
        use futures_util::stream::{self, TryStreamExt};
        let started = std::time::Instant::now();
        let owned: Vec<TopicPartition> = list_partition_dirs(&self.config.data_dir)?
            .into_iter()
            .filter(|tp| self.table.shard_of(tp) == self.id)
            .collect();
        // Partitions being opened now: named in a progress line every
        // OPEN_PROGRESS_EVERY, so a start that never serves says where it is.
        let opening = RefCell::new(std::collections::BTreeSet::<&TopicPartition>::new());
        let opened = Cell::new(0usize);
        let open_all = stream::iter(owned.iter().map(Ok)).try_for_each_concurrent(
            OPEN_CLOSE_CONCURRENCY,
            |tp| {
                let (opening, opened) = (&opening, &opened);
                async move {
                    opening.borrow_mut().insert(tp);
                    let result = self
                        .open_local(tp, Create::No, self.config.log.clone())
                        .await;
                    opening.borrow_mut().remove(tp);
                    opened.set(opened.get() + 1);
                    result
                }
            },
        );
        let progress = async {
            loop {
                glommio::timer::sleep(OPEN_PROGRESS_EVERY).await;
                let now: Vec<String> = opening
                    .borrow()
                    .iter()
                    .take(8)
                    .map(|tp| tp.to_string())
                    .collect();
                tracing::warn!(
                    shard = self.id,
                    opened = opened.get(),
                    partitions = owned.len(),
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    opening = ?now,
                    "still opening the shard's partition logs"
                );
            }
        };
        futures_util::pin_mut!(open_all, progress);
        match futures_util::future::select(open_all, progress).await {
            futures_util::future::Either::Left((result, _)) => result?,
            futures_util::future::Either::Right(((), _)) => {
                unreachable!("the progress loop never ends")
            }
        }
        tracing::info!(
            shard = self.id,
            partitions = owned.len(),
            took_ms = started.elapsed().as_millis() as u64,
            "opened the shard's partition logs"
        );
        Ok(())
    }

    /// Closes every partition (flush, trim, indexes, checkpoints: a few
    /// fdatasyncs each), `OPEN_CLOSE_CONCURRENCY` at a time, so a clean stop
    /// of thousands of partitions takes seconds, not minutes. Every partition
    /// is closed even when one fails; the first error is returned.
    async fn close_all(&self) -> Result<()> {
        use futures_util::stream::{self, StreamExt};
        let partitions: Vec<_> = self.partitions.borrow_mut().drain().collect();
        let first_error = std::cell::RefCell::new(None);
        stream::iter(partitions)
            .for_each_concurrent(OPEN_CLOSE_CONCURRENCY, |(tp, p)| {
                let first_error = &first_error;
                async move {
                    if let Err(e) = p.close().await {
                        tracing::error!(partition = %tp, error = %e, "close failed");
                        first_error.borrow_mut().get_or_insert(e);
                    }
                }
            })
            .await;
        first_error.into_inner().map_or(Ok(()), Err)
    }

    fn snapshot(&self) -> Vec<Rc<Partition>> {
        self.partitions.borrow().values().cloned().collect()
    }
}

/// Partitions a shard opens or closes at once (start and clean stop).
const OPEN_CLOSE_CONCURRENCY: usize = 64;

/// Whether `open_local` opens an existing partition directory or creates a
/// new one (with its topic's id in `partition.metadata`, given one).
enum Create {
    No,
    Yes(Option<[u8; 16]>),
}

/// How often a shard still opening its partitions says which.
const OPEN_PROGRESS_EVERY: Duration = Duration::from_secs(10);

/// How often `Runtime::start` says which shards have not reported ready.
const START_PROGRESS_EVERY: Duration = Duration::from_secs(10);

/// Partition directories under a data dir.
/// Directories of the data dir that look like partitions but are not
/// partition logs: the controller's metadata log lives in the same data
/// directory (as Kafka's does) and has its own format and owner.
pub const NOT_PARTITION_DIRS: &[&str] = &["__cluster_metadata-0"];

pub fn list_partition_dirs(data_dir: &Path) -> Result<Vec<TopicPartition>> {
    let mut out = Vec::new();
    let entries = std::fs::read_dir(data_dir).map_err(|e| LogError::io("list", data_dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| LogError::io("list", data_dir, e))?;
        // Files are never partitions: `meta.properties`, the lock `.lock`,
        // the producer id block.
        if !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        if NOT_PARTITION_DIRS.iter().any(|d| entry.file_name() == *d) {
            continue;
        }
        if let Some(tp) = entry
            .file_name()
            .to_str()
            .and_then(TopicPartition::from_dir_name)
        {
            out.push(tp);
        }
    }
    out.sort();
    Ok(out)
}

/// The running shards of one node.
pub struct Runtime {
    submit: Vec<mpsc::UnboundedSender<Job>>,
    stop: Vec<oneshot::Sender<()>>,
    threads: Vec<glommio::ExecutorJoinHandle<Result<()>>>,
    table: ShardTable,
}

impl Runtime {
    /// Starts one executor per configured CPU, recovers the partitions each owns,
    /// and returns once every shard serves.
    pub fn start(mut config: ShardConfig) -> Result<Runtime> {
        std::fs::create_dir_all(&config.data_dir)
            .map_err(|e| LogError::io("create dir", &config.data_dir, e))?;
        // glommio opens directories with openat and no directory fd: a
        // relative path would fail with EBADF.
        config.data_dir = std::fs::canonicalize(&config.data_dir)
            .map_err(|e| LogError::io("resolve dir", &config.data_dir, e))?;
        let meta = crate::data_dir::load_or_create(&config.data_dir, config.node_id)?;
        tracing::info!(node_id = meta.node_id, cluster_id = %meta.cluster_id, dir = %config.data_dir.display(), "data directory");
        let shards = config.cpus.len().max(1);
        let table = ShardTable::new(shards);
        let mesh = MeshBuilder::<Job, _>::full(shards, config.mesh_channel_capacity);
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<
            Result<(usize, mpsc::UnboundedSender<Job>, oneshot::Sender<()>)>,
        >();
        let mut threads = Vec::with_capacity(shards);
        for (i, cpu) in config.cpus.iter().enumerate() {
            let placement = cpu.map_or(Placement::Unbound, Placement::Fixed);
            let (mesh, config, ready_tx) = (mesh.clone(), config.clone(), ready_tx.clone());
            let handle = LocalExecutorBuilder::new(placement)
                .name(&format!("skiff-shard-{i}"))
                .io_memory(config.io_memory_bytes)
                .preempt_timer(config.preempt_timer)
                .spawn(move || async move { run_shard(mesh, config, table, ready_tx).await })
                .map_err(|e| {
                    LogError::io("spawn executor", "", std::io::Error::other(e.to_string()))
                })?;
            threads.push(handle);
        }
        drop(ready_tx);
        let mut submit: Vec<Option<mpsc::UnboundedSender<Job>>> = vec![None; shards];
        let mut stop: Vec<Option<oneshot::Sender<()>>> = (0..shards).map(|_| None).collect();
        let mut first_error = None;
        let started = std::time::Instant::now();
        let mut ready = 0;
        while ready < shards {
            let next = match ready_rx.recv_timeout(START_PROGRESS_EVERY) {
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    tracing::warn!(
                        ready,
                        shards,
                        elapsed_ms = started.elapsed().as_millis() as u64,
                        "still waiting for the shards to start"
                    );
                    continue;
                }
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => Err(()),
                Ok(r) => Ok(r),
            };
            ready += 1;
            match next {
                Ok(Ok((id, tx, stop_tx))) => {
                    submit[id] = Some(tx);
                    stop[id] = Some(stop_tx);
                }
                Ok(Err(e)) => {
                    first_error.get_or_insert(e);
                }
                Err(_) => {
                    first_error.get_or_insert(LogError::RuntimeStopped);
                }
            }
        }
        let runtime = Runtime {
            submit: submit.into_iter().flatten().collect(),
            stop: stop.into_iter().flatten().collect(),
            threads,
            table,
        };
        if let Some(e) = first_error {
            let _ = runtime.shutdown();
            return Err(e);
        }
        Ok(runtime)
    }

    pub fn shards(&self) -> usize {
        self.table.shards()
    }

    pub fn table(&self) -> ShardTable {
        self.table
    }

    /// Runs `f` on shard `shard`; the receiver yields its result.
    pub fn submit<F, Fut, T>(&self, shard: usize, f: F) -> Result<oneshot::Receiver<T>>
    where
        F: FnOnce(Rc<Shard>) -> Fut + Send + 'static,
        Fut: Future<Output = T> + 'static,
        T: Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let job: Job = Box::new(move |s| {
            Box::pin(async move {
                let _ = tx.send(f(s).await);
            })
        });
        self.submit
            .get(shard)
            .ok_or(LogError::RuntimeStopped)?
            .unbounded_send(job)
            .map_err(|_| LogError::RuntimeStopped)?;
        Ok(rx)
    }

    /// `submit` and wait for the result on this (non-executor) thread.
    pub fn block_on<F, Fut, T>(&self, shard: usize, f: F) -> Result<T>
    where
        F: FnOnce(Rc<Shard>) -> Fut + Send + 'static,
        Fut: Future<Output = T> + 'static,
        T: Send + 'static,
    {
        let rx = self.submit(shard, f)?;
        block_on(rx).map_err(|_| LogError::RuntimeStopped)
    }

    /// Stops every shard: partitions are flushed, closed and checkpointed.
    pub fn shutdown(self) -> Result<()> {
        for s in self.stop {
            let _ = s.send(());
        }
        drop(self.submit);
        let mut first_error = None;
        for t in self.threads {
            match t.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    first_error.get_or_insert(e);
                }
                Err(e) => {
                    first_error
                        .get_or_insert(LogError::Offline(format!("shard thread failed: {e}")));
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

type Ready =
    std::sync::mpsc::Sender<Result<(usize, mpsc::UnboundedSender<Job>, oneshot::Sender<()>)>>;

async fn run_shard(
    mesh: MeshBuilder<Job, glommio::channels::channel_mesh::Full>,
    config: ShardConfig,
    table: ShardTable,
    ready: Ready,
) -> Result<()> {
    let (senders, mut receivers) = match mesh.join().await {
        Ok(pair) => pair,
        Err(_) => {
            let _ = ready.send(Err(LogError::RuntimeStopped));
            return Err(LogError::RuntimeStopped);
        }
    };
    let id = senders.peer_id();
    let shard = Rc::new(Shard {
        id,
        table,
        cache: BatchCache::new(config.batch_cache_bytes_max),
        config,
        partitions: RefCell::new(HashMap::new()),
        peers: senders,
        stopping: Cell::new(false),
        stopped: Default::default(),
    });
    crate::trash::attach(
        shard.config.delete_bytes_per_second,
        shard.config.delete_backlog_bytes,
    );
    if id == 0 {
        // Partitions whose deletion a crash interrupted: shard 0 frees them.
        match crate::trash::recover_dirs(&shard.config.data_dir) {
            Ok(0) => {}
            Ok(n) => tracing::info!(directories = n, "freeing partitions deleted before a crash"),
            Err(e) => tracing::warn!(error = %e, "listing partitions deleted before a crash"),
        }
    }
    if let Err(e) = shard.open_owned().await {
        tracing::error!(shard = id, error = %e, "opening partitions failed");
        let _ = ready.send(Err(e));
        return Ok(());
    }
    // Requests from peer shards.
    for (_, rx) in receivers.streams() {
        let shard = shard.clone();
        glommio::spawn_local(async move {
            while let Some(job) = rx.recv().await {
                glommio::spawn_local(job(shard.clone())).detach();
            }
        })
        .detach();
    }
    let background = glommio::executor().create_task_queue(
        Shares::Static(100),
        Latency::NotImportant,
        "skiff-background",
    );
    let bg = glommio::spawn_local_into(background_loop(shard.clone()), background).ok();
    // The cleaner gets its own queue with fewer shares than the background one:
    // under load it runs only in the time produce and fetch leave.
    let cleaner = if shard.config.cleaner.enabled {
        let queue = glommio::executor().create_task_queue(
            Shares::Static(25),
            Latency::NotImportant,
            "skiff-cleaner",
        );
        glommio::spawn_local_into(cleaner_loop(shard.clone()), queue)
            .map(|t| t.detach())
            .ok()
    } else {
        None
    };

    let scrubber = (shard.config.scrub_bytes_per_second > 0)
        .then(|| glommio::spawn_local_into(scrub_loop(shard.clone()), background))
        .and_then(|t| t.ok());

    let (submit_tx, mut submit_rx) = mpsc::unbounded::<Job>();
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let _ = ready.send(Ok((id, submit_tx, stop_tx)));
    let submissions = {
        let shard = shard.clone();
        glommio::spawn_local(async move {
            while let Some(job) = submit_rx.next().await {
                glommio::spawn_local(job(shard.clone())).detach();
            }
        })
        .detach()
    };
    let _ = stop_rx.await;
    submissions.cancel();
    // The flusher and the scrubber take partition locks: they end at their
    // next step (a flush or scrub step in progress finishes) and are awaited
    // before the partitions close. The cleaner holds a lock only for its
    // brief swap and may be mid-way through a long cleaning: cancelled.
    shard.stopping.set(true);
    shard.stopped.notify_all();
    if let Some(cleaner) = cleaner {
        cleaner.cancel();
    }
    if let Some(bg) = bg {
        bg.await;
    }
    if let Some(scrubber) = scrubber {
        scrubber.await;
    }
    let result = shard.close_all().await;
    shard.peers.close();
    result
}

/// The scrubber, in the background task queue: every tick it verifies its
/// share of `scrub_bytes_per_second` of closed segments, partition after
/// partition, each from where its last step stopped. A corrupt batch takes
/// that log offline (logged by the engine); the node repairs it.
async fn scrub_loop(shard: Rc<Shard>) {
    const TICK: Duration = Duration::from_millis(100);
    let budget = ((shard.config.scrub_bytes_per_second as u128 * TICK.as_millis()) / 1000)
        .clamp(1, usize::MAX as u128) as usize;
    // The round's partitions in a stable order (refreshed each round, so new
    // ones join at the next), and the one being scrubbed.
    let mut round: Vec<TopicPartition> = Vec::new();
    let mut at = 0usize;
    while shard.pause(TICK).await {
        let mut left = budget;
        // Each partition at most once per tick: a tick over idle logs ends.
        let mut visited = 0usize;
        while left > 0 && visited <= round.len() && !shard.stopping.get() {
            if at >= round.len() {
                round = shard.partitions.borrow().keys().cloned().collect();
                round.sort_unstable();
                at = 0;
                if round.is_empty() {
                    break;
                }
            }
            visited += 1;
            let partition = shard.partitions.borrow().get(&round[at]).cloned();
            let Some(partition) = partition else {
                at += 1;
                continue;
            };
            match partition.scrub(left).await {
                Ok(step) => {
                    left = left.saturating_sub(step.bytes as usize);
                    if step.pass_done {
                        at += 1;
                    }
                }
                Err(e) => {
                    tracing::debug!(partition = %round[at], error = %e, "scrub step ended");
                    at += 1;
                }
            }
        }
    }
}

/// The shard's background work, in the low-share task queue: the interval flush
/// (`Durability::Interval`), recovery-point checkpoints (and, with them, the
/// append chunks of partitions quiet since the previous one given back) and
/// retention, each on its own period.
async fn background_loop(shard: Rc<Shard>) {
    let flush_every = match shard.config.log.durability {
        Durability::Interval(d) => Some(d),
        Durability::FlushBeforeAck => None,
    };
    let checkpoint_every = shard.config.checkpoint_interval;
    let retention_every = shard.config.retention_check_interval;
    let tick = [flush_every, Some(checkpoint_every), Some(retention_every)]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(checkpoint_every)
        .max(Duration::from_millis(10));
    let (mut since_checkpoint, mut since_retention) = (Duration::ZERO, Duration::ZERO);
    let stats = crate::stats::local();
    while shard.pause(tick).await {
        since_checkpoint += tick;
        since_retention += tick;
        let checkpoint = since_checkpoint >= checkpoint_every;
        let retention = since_retention >= retention_every;
        let now_ms = now_ms();
        for (tp, p) in shard.local_partition_handles() {
            if shard.stopping.get() {
                return; // the stop flushes and checkpoints every partition
            }
            // Deleted since the list was taken (a topic deletion while an
            // earlier partition's fdatasync was awaited): its files are gone.
            if !shard.local(&tp).is_some_and(|q| Rc::ptr_eq(&q, &p)) {
                continue;
            }
            if matches!(p.offline_reason().await, Ok(Some(_))) {
                // Logged when it went offline; nothing is written to it now.
                continue;
            }
            if flush_every.is_some() {
                let end = p.log_end_offset().await.unwrap_or(0);
                if let Err(e) = p.flush_to(end).await {
                    tracing::error!(error = %e, "periodic flush failed");
                }
            }
            if retention {
                match p.apply_retention(now_ms).await {
                    Ok(outcome) => stats.record_retention(&outcome),
                    Err(e) => tracing::error!(error = %e, "retention failed"),
                }
            }
            if checkpoint {
                if let Err(e) = p.checkpoint().await {
                    tracing::error!(error = %e, "recovery point checkpoint failed");
                }
            }
        }
        if checkpoint {
            since_checkpoint = Duration::ZERO;
        }
        if retention {
            since_retention = Duration::ZERO;
        }
    }
}

/// The core's cleaner: cleans the dirtiest compacted log on this core, again
/// right away while logs need it, else after `log.cleaner.backoff.ms`. A log whose
/// cleaning fails (a corrupt batch, say) is left alone until the node restarts,
/// as Kafka marks such logs uncleanable.
async fn cleaner_loop(shard: Rc<Shard>) {
    let mut cleaner = Cleaner::new(shard.config.cleaner.clone());
    let backoff = shard.config.cleaner.backoff.max(Duration::from_millis(10));
    let mut uncleanable: Vec<Rc<Partition>> = Vec::new();
    let stats = crate::stats::local();
    loop {
        let candidates: Vec<Rc<Partition>> = shard
            .snapshot()
            .into_iter()
            .filter(|p| !uncleanable.iter().any(|u| Rc::ptr_eq(u, p)))
            .collect();
        match cleaner.clean_dirtiest(&candidates, now_ms()).await {
            Ok(Some((_, cleaned))) => {
                stats.record_cleaning(&cleaned);
                glommio::yield_if_needed().await
            }
            Ok(None) => glommio::timer::sleep(backoff).await,
            Err((partition, e)) => {
                stats.record_cleaner_error();
                tracing::error!(error = %e, "log cleaning failed; the log stays uncleaned until restart");
                uncleanable.push(partition);
                glommio::timer::sleep(backoff).await;
            }
        }
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Waits for a future on a thread that is not an executor: for the receivers
/// `Runtime::submit` returns.
pub fn block_on<F: Future>(fut: F) -> F::Output {
    use std::sync::Arc;
    use std::task::{Context, Poll, Wake};
    struct ThreadWaker(std::thread::Thread);
    impl Wake for ThreadWaker {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Arc::new(ThreadWaker(std::thread::current())).into();
    let mut cx = Context::from_waker(&waker);
    let mut fut = std::pin::pin!(fut);
    loop {
        if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dir_names_round_trip() {
        let tp = TopicPartition::new("my-topic", 12);
        assert_eq!(TopicPartition::from_dir_name(&tp.dir_name()), Some(tp));
        assert_eq!(TopicPartition::from_dir_name("nodash"), None);
        assert_eq!(TopicPartition::from_dir_name("t-x1"), None);
        assert_eq!(TopicPartition::from_dir_name("-1"), None);
    }

    #[test]
    fn table_spreads_consecutive_partitions() {
        let table = ShardTable::new(4);
        let owners: Vec<_> = (0..8)
            .map(|p| table.shard_of(&TopicPartition::new("t", p)))
            .collect();
        for w in owners.windows(2) {
            assert_eq!((w[0] + 1) % 4, w[1]);
        }
    }
}
