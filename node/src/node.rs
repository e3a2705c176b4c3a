//! Starting and stopping a node: the shard runtime, per-core state, topics, the
//! listeners; SIGTERM/SIGINT stop accepting, let in-flight requests finish, then
//! flush and checkpoint every partition.
//!
//! The start, in order: the data directory's lock (`data_dir::lock`: one process
//! per directory); every listener bound but not listening (`listeners`: a port
//! that cannot be had fails the start before anything of the node is reachable);
//! `meta.properties`; the controller (its listener listens); the engine; the
//! metrics listener; joining the cluster; groups; the Kafka listener last.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use anyhow::Context;
use glommio::channels::local_channel;
use glommio::task::JoinHandle;
use skiff_engine::{data_dir, CleanerConfig, Runtime, ShardConfig};
use std::time::Duration;

use crate::cluster;
use crate::config::NodeConfig;
use crate::group::coordinator::{self, Coordinator};
use crate::listeners::{self, Bound, Which};
use crate::metrics::{self, Phase};
use crate::server;
use crate::state::{CoreState, NodeContext, ProducerIdAllocator};
use skiff_controller::decisions::ControllerConfig;
use skiff_controller::node::QuorumConfig;
use skiff_controller::service::{ControllerHandle, ServiceConfig};

thread_local! {
    /// The stop channel and serve task of this core's listener.
    static LISTENER: RefCell<Vec<(local_channel::LocalSender<()>, JoinHandle<()>)>> = const { RefCell::new(Vec::new()) };
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
    /// A controller-only node's metrics thread: its stop flag, address and
    /// handle (a broker serves metrics on core 0 instead).
    metrics_thread: Option<(
        Arc<std::sync::atomic::AtomicBool>,
        SocketAddr,
        std::thread::JoinHandle<()>,
    )>,
    pub data_dir: std::path::PathBuf,
    _temp_dir: Option<tempfile::TempDir>,
    /// The data directory's lock; released when the node is dropped, after
    /// everything else of it stopped (or by the kernel when the process dies).
    _lock: data_dir::DirLock,
}

impl Node {
    pub fn start(mut config: NodeConfig) -> anyhow::Result<Node> {
        config.check_roles()?;
        let node_id = u64::try_from(config.node_id)
            .ok()
            .filter(|id| *id >= 1)
            .context("node.id must be >= 1 in a cluster")?;
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
        std::fs::create_dir_all(&data_dir)
            .with_context(|| format!("creating {}", data_dir.display()))?;
        // Absolute from here on: glommio opens directories with openat and no
        // directory fd, so a relative path fails with EBADF (`--data-dir d1`
        // started, then could not create or reopen a partition).
        let data_dir = std::fs::canonicalize(&data_dir)
            .with_context(|| format!("resolving {}", data_dir.display()))?;
        // Before any other file of the directory is read or written, and
        // before any port is taken: a second process on this directory
        // leaves no trace.
        let lock = data_dir::lock(&data_dir)?;
        // Certificates and keys are read before any port is taken: a file
        // that cannot be used fails the start here, naming it.
        let tls = crate::tls::Tls::load(&config)?;
        // Every listener is bound (its port reserved, nothing answering yet)
        // before anything else starts: a port this node cannot have fails it
        // here, before it registers with the controller or a client or
        // probe can reach any part of it.
        let controller_socket = match config.roles.controller {
            true => Some(listeners::bind(
                Which::Controller,
                controller_listen(&config, node_id),
            )?),
            false => None,
        };
        let kafka_sockets = match config.roles.broker {
            true => {
                let mut sockets = Vec::new();
                for (i, listener) in config.kafka_listeners()?.into_iter().enumerate() {
                    let kafka = listeners::bind(Which::Kafka, listener.addr)?;
                    // A port of 0 resolved: the broker registers where it listens.
                    config.listeners[i].addr = kafka.addr();
                    // Who may connect is checked by a login, a required client
                    // certificate or the ACLs; with none of them, by nobody.
                    let checked = listener.protocol.sasl()
                        || (listener.protocol.tls()
                            && config.ssl_client_auth == crate::config::ClientAuth::Required)
                        || config.authorizer;
                    if !kafka.addr().ip().is_loopback() && !checked {
                        tracing::warn!(
                            listener = %listener.name,
                            addr = %kafka.addr(),
                            "the Kafka listener is reachable beyond this machine with no SASL, no \
                             required client certificate and no authorizer: anyone who reaches it \
                             can read, write and delete every topic"
                        );
                    }
                    sockets.push(kafka);
                }
                sockets
            }
            false => Vec::new(),
        };
        // Every node serves /metrics and /health, a controller-only one too.
        let metrics_socket = match config.metrics_listen {
            Some(addr) => Some(listeners::bind(Which::Metrics, addr)?),
            None => None,
        };
        // The data dir's identity before the controller: its cluster id is
        // what a first active controller names the cluster with. The
        // controller before the broker: a broker needs a quorum to join.
        let meta = data_dir::load_or_create(&data_dir, config.node_id)?;
        let (controller, quorum_addrs) = start_controller(
            &config,
            node_id,
            controller_socket,
            &data_dir,
            &meta.cluster_id,
        )?;
        let controller_addr = controller.as_ref().map(ControllerHandle::listen_addr);
        if kafka_sockets.is_empty() {
            let mut metrics_addr = None;
            let mut metrics_thread = None;
            if let (Some(socket), Some(c)) = (metrics_socket, controller.as_ref()) {
                let addr = socket.addr();
                let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
                let thread = metrics::http::serve_controller(
                    socket.listen()?,
                    c.status_reader(),
                    config.metrics_token.clone(),
                    stop.clone(),
                )
                .context("starting the metrics thread")?;
                tracing::info!("serving metrics and health on http://{addr} (/metrics, /health)");
                metrics_addr = Some(addr);
                metrics_thread = Some((stop, addr, thread));
            }
            return Ok(Node {
                runtime: None,
                addr: None,
                controller,
                controller_addr,
                metrics_addr,
                metrics_thread,
                data_dir,
                _temp_dir: temp_dir,
                _lock: lock,
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
        shard_config.scrub_bytes_per_second = config.scrub_bytes_per_second;
        shard_config.delete_bytes_per_second = config.delete_bytes_per_second;
        shard_config.delete_backlog_bytes = config.delete_backlog_bytes;
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
            listeners: config.kafka_listeners()?,
            tls,
            conn_limits: crate::conn_limits::ConnectionLimits::new(
                config.max_connections,
                config.max_connections_per_ip,
                config.max_connections_per_ip_overrides.clone(),
            ),
            quota_budgets: crate::quota::QuotaBudgets::new(
                config.quota_window_num,
                config.quota_window_size_seconds.saturating_mul(1000),
            ),
        });
        for core in 0..runtime.shards() {
            let node = node.clone();
            runtime.block_on(core, move |shard| async move {
                let core = CoreState::install(shard, node);
                crate::replica::attach();
                coordinator::attach(&core);
                crate::txn::coordinator::attach(&core);
            })?;
        }
        // The metrics listener opens first, so `/health` says "starting" while
        // groups load.
        let metrics_addr = match metrics_socket {
            None => None,
            Some(socket) => {
                let addr = socket.addr();
                let listener = socket.listen()?;
                runtime.block_on(0, move |_| async move { listen_metrics(listener) })??;
                tracing::info!("serving metrics and health on http://{addr} (/metrics, /health)");
                Some(addr)
            }
        };
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
                crate::producer::start_snapshot_timer(core.clone());
                coordinator::start_ticker(core);
                anyhow::Ok(loaded)
            })??;
        }
        tracing::info!(groups, "loaded consumer groups");

        // One listening socket per listener; every core accepts on its own
        // duplicate of each (see `listeners`).
        let addr = kafka_sockets[0].addr();
        for (index, socket) in kafka_sockets.into_iter().enumerate() {
            let bound = socket.addr();
            let listener = socket.listen()?;
            for core in 0..runtime.shards() {
                let own = listener
                    .try_clone()
                    .with_context(|| format!("duplicating the Kafka listener {bound}"))?;
                runtime.block_on(core, move |_| async move { listen(own, index) })??;
            }
            // Not kept: once the cores close theirs at a stop, a descriptor
            // left here would keep the port listening, queueing connections
            // nobody accepts instead of refusing them.
            drop(listener);
        }
        set_phase(&runtime, Phase::Serving)?;
        Ok(Node {
            runtime: Some(runtime),
            addr: Some(addr),
            controller,
            controller_addr,
            metrics_addr,
            metrics_thread: None,
            data_dir,
            _temp_dir: temp_dir,
            _lock: lock,
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
        if let Some((stop, addr, thread)) = self.metrics_thread {
            stop.store(true, std::sync::atomic::Ordering::Release);
            // Wake the blocking accept; it sees the flag and returns.
            let _ = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1));
            let _ = thread.join();
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
    // Every core stops accepting first, then each drains: a core still
    // accepting would deal new connections to one already draining (which
    // closes them).
    for core in 0..runtime.shards() {
        runtime.block_on(core, |_| async move {
            LISTENER.with(|l| {
                for (stop, _) in l.borrow().iter() {
                    let _ = stop.try_send(());
                }
            });
        })?;
    }
    for core in 0..runtime.shards() {
        runtime.block_on(core, |_| async move {
            for (_, serve) in LISTENER.with(|l| std::mem::take(&mut *l.borrow_mut())) {
                let _ = serve.await;
            }
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
                crate::producer::snapshot_producers(&core).await;
            }
        })?;
    }
    Ok(())
}

/// Where this node's controller listens: `controller.listen`, else its own
/// quorum entry; a node alone (no quorum configured) is a quorum of itself on
/// `DEFAULT_CONTROLLER_LISTEN`.
fn controller_listen(config: &NodeConfig, node_id: u64) -> SocketAddr {
    config
        .controller_listen
        .or_else(|| {
            config
                .controller_quorum
                .iter()
                .find(|(id, _)| *id == node_id)
                .map(|(_, addr)| *addr)
        })
        .unwrap_or(DEFAULT_CONTROLLER_LISTEN)
}

/// Starts this node's controller on its bound socket when it has the role
/// (`socket`: None without it), and returns it with the quorum's addresses
/// (every voter's controller listener).
fn start_controller(
    config: &NodeConfig,
    node_id: u64,
    socket: Option<Bound>,
    data_dir: &std::path::Path,
    cluster_id: &str,
) -> anyhow::Result<(Option<ControllerHandle>, Quorum)> {
    let Some(socket) = socket else {
        return Ok((None, config.controller_quorum.clone()));
    };
    let bound = socket.addr();
    if !bound.ip().is_loopback() && config.controller_secret.is_none() {
        tracing::warn!(
            listener = %bound,
            "the controller listener is reachable beyond this machine and no controller.secret.file \
             is set: anything that reaches it can talk Raft to the quorum; set one on every node"
        );
    }
    let listener = socket.listen()?;
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
            auto_leader_rebalance: config.auto_leader_rebalance,
            leader_imbalance_check_interval_ms: config.leader_imbalance_check_interval_s * 1000,
            leader_imbalance_percentage: config.leader_imbalance_percentage,
        },
        tick: CONTROLLER_TICK,
        cpu: config.controller_cpu,
        cluster_id: cluster_id.to_string(),
        secret: config.controller_secret.clone(),
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

/// Serves Kafka listener `index` (of `NodeContext::listeners`) on this core
/// from its own descriptor of the listening socket.
fn listen(listener: std::net::TcpListener, index: usize) -> anyhow::Result<()> {
    let listener = listeners::into_glommio(listener);
    let core = CoreState::current().ok_or_else(|| anyhow::anyhow!("core state missing"))?;
    let (tx, rx) = local_channel::new_bounded(1);
    let serve = glommio::spawn_local(server::serve(core, listener, index, rx)).detach();
    LISTENER.with(|l| l.borrow_mut().push((tx, serve)));
    Ok(())
}

/// Serves the metrics listener on this core (core 0).
fn listen_metrics(listener: std::net::TcpListener) -> anyhow::Result<()> {
    let listener = listeners::into_glommio(listener);
    let core = CoreState::current().ok_or_else(|| anyhow::anyhow!("core state missing"))?;
    let (tx, rx) = local_channel::new_bounded(1);
    let serve = glommio::spawn_local(metrics::http::serve(core, listener, rx)).detach();
    METRICS_LISTENER.with(|l| *l.borrow_mut() = Some((tx, serve)));
    Ok(())
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
