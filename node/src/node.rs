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

use crate::cluster;
use crate::config::NodeConfig;
use crate::group::coordinator::{self, Coordinator};
use crate::metrics::{self, Phase};
use crate::server;
use crate::state::{CoreState, NodeContext, ProducerIdAllocator};
use skiff_controller::decisions::ControllerConfig;
use skiff_controller::node::QuorumConfig;
use skiff_controller::service::{ControllerHandle, ServiceConfig};

thread_local! {
    /// The stop channel and serve task of this core's listener.
    static LISTENER: RefCell<Option<(local_channel::LocalSender<()>, JoinHandle<()>)>> = const { RefCell::new(None) };
    /// The same for the metrics listener (core 0 only).
    static METRICS_LISTENER: RefCell<Option<(local_channel::LocalSender<()>, JoinHandle<()>)>> = const { RefCell::new(None) };
}

/// A running node.
pub struct Node {
    /// The broker's shard runtime (None: a controller-only node).
    runtime: Option<Runtime>,
    /// The Kafka listener (None: a controller-only node).
    pub addr: Option<SocketAddr>,
    controller: Option<ControllerHandle>,
    /// Where this node's controller listens (None: not a controller).
    pub controller_addr: Option<SocketAddr>,
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
        config.check_roles()?;
        // The controller first: a broker needs a quorum to join.
        // The data dir's identity first: its cluster id is what a first
        // active controller names the cluster with.
        std::fs::create_dir_all(&data_dir)
            .with_context(|| format!("creating {}", data_dir.display()))?;
        let meta = data_dir::load_or_create(&data_dir, config.node_id)?;
        let (controller, quorum_addrs) = start_controller(&config, &data_dir, &meta.cluster_id)?;
        let controller_addr = controller.as_ref().map(ControllerHandle::listen_addr);
        if !config.roles.broker {
            return Ok(Node {
                runtime: None,
                addr: None,
                controller,
                controller_addr,
                metrics_addr: None,
                data_dir,
                _temp_dir: temp_dir,
            });
        }
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
        let producer_ids = ProducerIdAllocator::open(&data_dir, config.node_id)
            .context("opening the producer id block")?;
        let node = Arc::new(NodeContext {
            config: config.clone(),
            data_dir: data_dir.clone(),
            cluster_id: meta.cluster_id,
            producer_ids: Mutex::new(producer_ids),
            controller: controller.as_ref().map(ControllerHandle::status_reader),
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
        // The broker joins the cluster on core 0: registration, the metadata
        // log up to it, the local partitions it assigns here, unfencing.
        let quorum = quorum_addrs;
        let timeout = Duration::from_millis(config.broker_session_timeout_ms.max(1000));
        runtime.block_on(0, move |_| async move {
            let Some(core) = CoreState::current() else {
                return Err(anyhow::anyhow!("core state missing"));
            };
            cluster::start(core.clone(), quorum, timeout)
                .await
                .context("joining the cluster")
        })??;
        // Each core takes the roles the table gives it (the broadcast applies
        // them in the background; applying the same table again waits for
        // that) and loads the groups of the offsets partitions it leads
        // before any listener opens; then applies their timeouts.
        // `__consumer_offsets` itself is created when a client first looks
        // for a coordinator, once the cluster's brokers are up.
        let mut groups = 0;
        for core in 0..runtime.shards() {
            groups += runtime.block_on(core, move |_| async move {
                let core =
                    CoreState::current().ok_or_else(|| anyhow::anyhow!("core state missing"))?;
                crate::replica::apply_table(core.clone(), core.topics()).await;
                let loaded = Coordinator::current().wait_loaded().await;
                crate::replica::start_shrink_timer(core.clone());
                crate::handlers::produce::start_snapshot_timer(core.clone());
                coordinator::start_ticker(core);
                anyhow::Ok(loaded)
            })??;
        }
        tracing::info!(groups, "loaded consumer groups");

        // Core 0 binds first, so a port of 0 resolves to one port for all cores.
        let addr = runtime.block_on(0, move |_| async move { listen(config.listen) })??;
        for core in 1..runtime.shards() {
            runtime.block_on(core, move |_| async move { listen(addr) })??;
        }
        set_phase(&runtime, Phase::Serving)?;
        Ok(Node {
            runtime: Some(runtime),
            addr: Some(addr),
            controller,
            controller_addr,
            metrics_addr,
            data_dir,
            _temp_dir: temp_dir,
        })
    }

    pub fn shards(&self) -> usize {
        self.runtime.as_ref().map_or(0, Runtime::shards)
    }

    /// Stops the broker (controlled shutdown, no new connections, in-flight
    /// requests finish, every partition closed), then the controller.
    pub fn stop(self) -> anyhow::Result<()> {
        if let Some(runtime) = self.runtime {
            stop_broker(runtime)?;
        }
        if let Some(controller) = self.controller {
            controller.stop().context("stopping the controller")?;
        }
        Ok(())
    }
}

fn stop_broker(runtime: Runtime) -> anyhow::Result<()> {
    set_phase(&runtime, Phase::Stopping)?;
    // Producer snapshots while this node still leads (a controlled shutdown
    // moves leaderships, which forgets producer state), and again below once
    // the last produces are in.
    snapshot_producers(&runtime)?;
    // Leaderships move to other nodes while this one still serves.
    runtime.block_on(0, |_| async move { cluster::shut_down().await })?;
    // Members waiting in JoinGroup/SyncGroup are answered first, so their
    // connections can finish.
    for core in 0..runtime.shards() {
        runtime.block_on(core, |_| async move { Coordinator::current().close() })?;
    }
    for core in 0..runtime.shards() {
        runtime.block_on(core, |_| async move {
            let Some((stop, serve)) = LISTENER.with(|l| l.borrow_mut().take()) else {
                return;
            };
            let _ = stop.try_send(());
            let _ = serve.await;
        })?;
    }
    snapshot_producers(&runtime)?;
    // Metrics last: /health answers "stopping" while requests drain.
    runtime.block_on(0, |_| async move {
        if let Some((stop, serve)) = METRICS_LISTENER.with(|l| l.borrow_mut().take()) {
            let _ = stop.try_send(());
            let _ = serve.await;
        }
    })?;
    runtime.shutdown()?;
    Ok(())
}

/// Every core writes its producer snapshots (see
/// `handlers::produce::snapshot_producers`).
fn snapshot_producers(runtime: &Runtime) -> anyhow::Result<()> {
    for core in 0..runtime.shards() {
        runtime.block_on(core, |_| async move {
            if let Some(core) = CoreState::current() {
                crate::handlers::produce::snapshot_producers(&core).await;
            }
        })?;
    }
    Ok(())
}

/// Starts this node's controller when it has the role, and returns it with
/// the quorum's addresses (every voter's controller listener). A node alone
/// (no quorum configured) is a quorum of itself on `DEFAULT_CONTROLLER_LISTEN`
/// unless `controller.listen` says otherwise.
fn start_controller(
    config: &NodeConfig,
    data_dir: &std::path::Path,
    cluster_id: &str,
) -> anyhow::Result<(Option<ControllerHandle>, Quorum)> {
    let node_id = u64::try_from(config.node_id)
        .ok()
        .filter(|id| *id >= 1)
        .context("node.id must be >= 1 in a cluster")?;
    if !config.roles.controller {
        return Ok((None, config.controller_quorum.clone()));
    }
    let listen = config
        .controller_listen
        .or_else(|| {
            config
                .controller_quorum
                .iter()
                .find(|(id, _)| *id == node_id)
                .map(|(_, addr)| *addr)
        })
        .unwrap_or(DEFAULT_CONTROLLER_LISTEN);
    let listener = std::net::TcpListener::bind(listen)
        .with_context(|| format!("binding the controller listener {listen}"))?;
    let bound = listener.local_addr()?;
    let peers = if config.controller_quorum.is_empty() {
        vec![(node_id, bound)]
    } else {
        config.controller_quorum.clone()
    };
    let voters = peers.iter().map(|(id, _)| *id).collect();
    let handle = ControllerHandle::start(ServiceConfig {
        data_dir: data_dir.to_path_buf(),
        quorum: QuorumConfig::new(node_id, voters),
        peers: peers.clone(),
        listener,
        controller: ControllerConfig {
            heartbeat_interval_ms: config.broker_heartbeat_interval_ms,
            session_timeout_ms: config.broker_session_timeout_ms,
            unclean_leader_election: config.unclean_leader_election,
        },
        tick: CONTROLLER_TICK,
        cpu: config.controller_cpu,
        cluster_id: cluster_id.to_string(),
    })
    .with_context(|| format!("starting the controller in {}", data_dir.display()))?;
    tracing::info!(node_id, addr = %bound, voters = peers.len(), "controller listening");
    Ok((Some(handle), peers))
}

/// Every voter's id and controller address.
type Quorum = Vec<(u64, SocketAddr)>;

/// Kafka's conventional controller port, on loopback.
pub const DEFAULT_CONTROLLER_LISTEN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 9093);

/// The controller's Raft tick: elections after 1-2 s of silence.
const CONTROLLER_TICK: Duration = Duration::from_millis(100);

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
