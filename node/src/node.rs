//! Starting and stopping a node: the shard runtime, per-core state, topics, the
//! listeners; SIGTERM/SIGINT stop accepting, let in-flight requests finish, then
//! flush and checkpoint every partition.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use anyhow::Context;
use glommio::channels::local_channel;
use glommio::net::TcpListener;
use glommio::task::JoinHandle;
use skiff_engine::{data_dir, CleanerConfig, Runtime, ShardConfig};
use std::time::Duration;

use crate::config::NodeConfig;
use crate::group::{
    self,
    coordinator::{self, Coordinator},
};
use crate::metrics::{self, Phase};
use crate::server;
use crate::state::{CoreState, NodeContext, ProducerIdAllocator};
use crate::topics;

thread_local! {
    /// The stop channel and serve task of this core's listener.
    static LISTENER: RefCell<Option<(local_channel::LocalSender<()>, JoinHandle<()>)>> = const { RefCell::new(None) };
    /// The same for the metrics listener (core 0 only).
    static METRICS_LISTENER: RefCell<Option<(local_channel::LocalSender<()>, JoinHandle<()>)>> = const { RefCell::new(None) };
}

/// A running node.
pub struct Node {
    runtime: Runtime,
    pub addr: SocketAddr,
    /// Where `/metrics` and `/health` are served (None: turned off).
    pub metrics_addr: Option<SocketAddr>,
    pub data_dir: std::path::PathBuf,
    _temp_dir: Option<tempfile::TempDir>,
}

impl Node {
    pub fn start(config: NodeConfig) -> anyhow::Result<Node> {
        let (data_dir, temp_dir) = match &config.data_dir {
            Some(dir) => (dir.clone(), None),
            None => {
                let t = tempfile::Builder::new()
                    .prefix("skiff-data-")
                    .tempdir()
                    .context("creating a temporary data directory")?;
                (t.path().to_path_buf(), Some(t))
            }
        };
        let mut shard_config = ShardConfig::unpinned(&data_dir, 1);
        shard_config.node_id = config.node_id;
        shard_config.cpus = config.cpus();
        shard_config.log = config.log_config(&Default::default());
        shard_config.batch_cache_bytes_max = config.batch_cache_bytes;
        shard_config.io_memory_bytes = config.io_memory_bytes;
        shard_config.retention_check_interval =
            Duration::from_millis(config.retention_check_interval_ms.max(10));
        shard_config.checkpoint_interval =
            Duration::from_millis(config.checkpoint_interval_ms.max(100));
        shard_config.cleaner = CleanerConfig {
            enabled: config.cleaner_enable,
            dedupe_buffer_bytes: config.cleaner_dedupe_buffer_bytes,
            // Kafka's default (Double.MAX_VALUE) and anything near it: unthrottled.
            io_max_bytes_per_second: (config.cleaner_io_max_bytes_per_second < 1e15)
                .then_some(config.cleaner_io_max_bytes_per_second as u64),
            backoff: Duration::from_millis(config.cleaner_backoff_ms.max(10)),
            ..CleanerConfig::default()
        };
        let runtime = Runtime::start(shard_config)
            .with_context(|| format!("starting the engine in {}", data_dir.display()))?;
        let meta = data_dir::load_or_create(&data_dir, config.node_id)?;
        let producer_ids =
            ProducerIdAllocator::open(&data_dir).context("opening the producer id block")?;
        let node = Arc::new(NodeContext {
            config: config.clone(),
            data_dir: data_dir.clone(),
            cluster_id: meta.cluster_id,
            producer_ids: Mutex::new(producer_ids),
        });
        for core in 0..runtime.shards() {
            let node = node.clone();
            runtime.block_on(core, move |shard| async move {
                CoreState::install(shard, node);
            })?;
        }
        // The metrics listener opens first, so `/health` says "starting" while
        // groups load; a port it cannot bind fails the start.
        let metrics_addr = match config.metrics_listen {
            None => None,
            Some(addr) => Some(runtime.block_on(0, move |_| async move { listen_metrics(addr) })??),
        };
        if let Some(addr) = metrics_addr {
            tracing::info!("serving metrics and health on http://{addr} (/metrics, /health)");
        }
        let offsets_partitions = runtime.block_on(0, |shard| async move {
            let Some(core) = CoreState::current() else {
                return Err(anyhow::anyhow!("core state missing"));
            };
            let table = topics::load(&core).await?;
            topics::broadcast(&shard, Arc::new(table)).await?;
            Ok(group::ensure_offsets_topic(&core).await?)
        })??;
        // Each core loads the groups of the offsets partitions it owns before
        // any listener opens, then applies their timeouts.
        let mut groups = 0;
        for core in 0..runtime.shards() {
            groups += runtime.block_on(core, move |shard| async move {
                let core =
                    CoreState::current().ok_or_else(|| anyhow::anyhow!("core state missing"))?;
                let limits = coordinator::limits(&core);
                let loaded = Coordinator::current()
                    .load(&shard, offsets_partitions, limits)
                    .await?;
                coordinator::start_ticker(core);
                anyhow::Ok(loaded)
            })??;
        }
        tracing::info!(groups, offsets_partitions, "loaded consumer groups");

        // Core 0 binds first, so a port of 0 resolves to one port for all cores.
        let addr = runtime.block_on(0, move |_| async move { listen(config.listen) })??;
        for core in 1..runtime.shards() {
            runtime.block_on(core, move |_| async move { listen(addr) })??;
        }
        set_phase(&runtime, Phase::Serving)?;
        Ok(Node {
            runtime,
            addr,
            metrics_addr,
            data_dir,
            _temp_dir: temp_dir,
        })
    }

    pub fn shards(&self) -> usize {
        self.runtime.shards()
    }

    /// Stops accepting, waits for in-flight requests, closes every partition.
    pub fn stop(self) -> anyhow::Result<()> {
        set_phase(&self.runtime, Phase::Stopping)?;
        // Members waiting in JoinGroup/SyncGroup are answered first, so their
        // connections can finish.
        for core in 0..self.runtime.shards() {
            self.runtime
                .block_on(core, |_| async move { Coordinator::current().close() })?;
        }
        for core in 0..self.runtime.shards() {
            self.runtime.block_on(core, |_| async move {
                let Some((stop, serve)) = LISTENER.with(|l| l.borrow_mut().take()) else {
                    return;
                };
                let _ = stop.try_send(());
                let _ = serve.await;
            })?;
        }
        // Metrics last: /health answers "stopping" while requests drain.
        self.runtime.block_on(0, |_| async move {
            if let Some((stop, serve)) = METRICS_LISTENER.with(|l| l.borrow_mut().take()) {
                let _ = stop.try_send(());
                let _ = serve.await;
            }
        })?;
        self.runtime.shutdown()?;
        Ok(())
    }
}

/// Binds this core's listener and starts serving on it.
fn listen(addr: SocketAddr) -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind(addr)
        .map_err(std::io::Error::from)
        .with_context(|| format!("binding {addr}"))?;
    let bound = listener.local_addr().map_err(std::io::Error::from)?;
    let core = CoreState::current().ok_or_else(|| anyhow::anyhow!("core state missing"))?;
    let (tx, rx) = local_channel::new_bounded(1);
    let serve = glommio::spawn_local(server::serve(core, listener, rx)).detach();
    LISTENER.with(|l| *l.borrow_mut() = Some((tx, serve)));
    Ok(bound)
}

/// Binds the metrics listener on this core (core 0) and starts serving it.
fn listen_metrics(addr: SocketAddr) -> anyhow::Result<SocketAddr> {
    let listener = metrics::http::bind(addr)?;
    let bound = listener.local_addr().map_err(std::io::Error::from)?;
    let core = CoreState::current().ok_or_else(|| anyhow::anyhow!("core state missing"))?;
    let (tx, rx) = local_channel::new_bounded(1);
    let serve = glommio::spawn_local(metrics::http::serve(core, listener, rx)).detach();
    METRICS_LISTENER.with(|l| *l.borrow_mut() = Some((tx, serve)));
    Ok(bound)
}

/// Core 0 answers `/health`; its phase is the node's.
fn set_phase(runtime: &Runtime, phase: Phase) -> anyhow::Result<()> {
    runtime.block_on(0, move |_| async move {
        if let Some(core) = CoreState::current() {
            core.phase.set(phase);
        }
    })?;
    Ok(())
}
