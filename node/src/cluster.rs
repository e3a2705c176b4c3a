//! The broker's side of the cluster: it registers with the active controller,
//! heartbeats, and follows the committed metadata log, applying it in order to
//! its own copy of `ClusterState` (the same deterministic state machine the
//! controllers run). From that copy it derives the `TopicTable` every core
//! reads (topics, partitions, leaders, live brokers) and keeps a log for exactly
//! the partitions this node is a replica of.
//!
//! Everything here runs on core 0 and is reached from other cores through
//! `Shard::invoke_on(0, ..)`: admin requests only, never produce or fetch.
//!
//! ```text
//! start:      register -> catch up to the registration offset -> reconcile
//!             local partitions -> heartbeat until unfenced
//! follower:   fetch_metadata(applied + 1, long poll) -> apply -> reconcile ->
//!             broadcast the new TopicTable to every core
//! heartbeat:  every broker.heartbeat.interval.ms with the applied offset; a
//!             refused epoch (a controller that restarted without us, or a
//!             fence) re-registers
//! stop:       controlled shutdown (leaderships move away), bounded
//! ```
//!
//! Architecture invariant: the broker never decides anything about the
//! cluster; it applies what the controller committed, in log order, and
//! answers clients from that.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use glommio::timer::sleep;
use skiff_controller::client::{ClientError, ControllerClient, CreateTopicRequest};
use skiff_controller::decisions::{ElectionType, Heartbeat, Registration};
use skiff_controller::records::{ConfigResource, Endpoint, NodeId, TopicId, NO_LEADER};
use skiff_controller::rpc::{MetadataFetch, RpcError};
use skiff_controller::state::ClusterState;
use skiff_controller::ControllerStatus;
use skiff_engine::{shard::list_partition_dirs, TopicPartition};
use uuid::Uuid;

use crate::metrics::counters::Phase;
use crate::state::CoreState;
use crate::topics::table::{Assignment, BrokerInfo, TopicError, TopicInfo, TopicTable};

/// Kafka's error codes the heartbeat reacts to.
const STALE_BROKER_EPOCH: i16 = 77;
const BROKER_ID_NOT_REGISTERED: i16 = 102;

/// How long a long poll for new metadata waits at the controller.
const FETCH_WAIT: Duration = Duration::from_millis(500);
/// Pause after a failed fetch or registration before the next try.
const RETRY_PAUSE: Duration = Duration::from_millis(200);
/// How long a start waits for the quorum to elect a controller and for this
/// node to be registered, caught up and unfenced.
pub const START_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a stop waits for the controller to move leaderships away.
const CONTROLLED_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

thread_local! {
    static BROKER: RefCell<Option<Rc<Broker>>> = const { RefCell::new(None) };
}

/// Core 0's view of the cluster and its link to the controller.
pub struct Broker {
    /// Admin changes (create/delete topics, configs). Each link carries one
    /// request at a time, so the long-polling metadata fetch and the
    /// heartbeats get their own and never wait behind each other.
    pub client: ControllerClient,
    heartbeats: ControllerClient,
    metadata: ControllerClient,
    node_id: i32,
    incarnation: [u8; 16],
    broker_epoch: Cell<i64>,
    state: RefCell<ClusterState>,
    /// The last metadata offset applied to `state`.
    applied: Cell<u64>,
    /// The metadata offset of the table every core has (partitions opened,
    /// table broadcast): what admin requests wait for.
    published: Cell<u64>,
    fenced: Cell<bool>,
    /// When the last acknowledged heartbeat was sent: the controller heard
    /// from this node no earlier, so its session there lasts at least until
    /// this + `broker.session.timeout.ms` (the node's lease on its
    /// leaderships).
    lease_from: Cell<Instant>,
    /// This node gave up its leaderships (fenced, or its lease ran out: the
    /// controller may have elected other leaders by now). Tables derived
    /// meanwhile show none of its partitions led by it but `held`, and
    /// itself fenced when it holds none.
    stepped_down: Cell<bool>,
    /// The last heartbeat answer said fenced (or refused the broker epoch):
    /// the controller has moved this node's leaderships, none is held.
    told_fenced: Cell<bool>,
    /// Leaderships kept while the lease has run out but the controller never
    /// said fenced: every other in-sync replica still follows them
    /// (`lease_watchdog`). Only shrinks until a heartbeat is acknowledged.
    held: RefCell<HashSet<TopicPartition>>,
    /// While stepped down: the controller's metadata offset in its first
    /// answer that acknowledged this node unfenced. Leaderships come back
    /// only once this node has applied that much metadata (`stays_down`):
    /// the controller may have moved them meanwhile, and a table derived
    /// from older metadata would lead them again at the old epoch (seed
    /// 10001: node 1 led __transaction_state-0 at epoch 267 for 0.4 s after
    /// node 2 had been elected at 268).
    resume_at: Cell<Option<u64>>,
    /// One table derivation and broadcast at a time (the follower and the
    /// lease watchdog both publish), so the last one derived lands last.
    publishing: Rc<glommio::sync::Semaphore>,
    stopping: Cell<bool>,
    /// The security metadata of the last table derived; rebuilt only when a
    /// batch or snapshot applied since may have changed it.
    security: RefCell<Arc<crate::security::Security>>,
    security_dirty: Cell<bool>,
    authz: Option<crate::security::AuthzSettings>,
}

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("controller: {0}")]
    Controller(#[from] ClientError),
    #[error("the controller refused: {0}")]
    Refused(String),
    #[error("{0}")]
    Timeout(String),
    #[error(transparent)]
    Topic(#[from] TopicError),
    #[error("stopped while joining the cluster")]
    Stopped,
    #[error(transparent)]
    DataDir(#[from] skiff_engine::data_dir::DataDirError),
}

impl Broker {
    /// Core 0's broker (None elsewhere, or before `start`).
    pub fn current() -> Option<Rc<Broker>> {
        BROKER.with(|b| b.borrow().clone())
    }

    pub fn applied(&self) -> u64 {
        self.applied.get()
    }

    pub fn is_fenced(&self) -> bool {
        self.fenced.get()
    }

    /// Waits until every core's table reflects the metadata log up to
    /// `offset` (the commit offset of a change this node asked for), so what
    /// the caller answers next already shows it.
    pub async fn wait_applied(&self, offset: u64, timeout: Duration) -> Result<(), ClusterError> {
        let deadline = Instant::now() + timeout;
        while self.published.get() < offset {
            if Instant::now() >= deadline {
                return Err(ClusterError::Timeout(format!(
                    "metadata offset {offset} not applied within {timeout:?} (applied {})",
                    self.published.get()
                )));
            }
            sleep(Duration::from_millis(2)).await;
        }
        Ok(())
    }
}

/// Registers this node, catches up with the metadata log, opens the local
/// partitions it is a replica of, and waits until the controller unfences it.
/// Then the follower and heartbeat tasks keep it current.
///
/// A stop asked for meanwhile (`state::request_stop`) ends it within
/// `STOP_POLL` with `ClusterError::Stopped`, whatever it waits on: a single
/// registration attempt against silent controllers lasts a whole request
/// timeout, and the start's bound is two minutes.
pub async fn start(
    core: Rc<CoreState>,
    quorum: Vec<(u64, std::net::SocketAddr)>,
    request_timeout: Duration,
) -> Result<(), ClusterError> {
    let join = std::pin::pin!(join(core, quorum, request_timeout));
    let stop = std::pin::pin!(async {
        while !crate::state::stop_requested() {
            sleep(STOP_POLL).await;
        }
    });
    match futures_util::future::select(join, stop).await {
        futures_util::future::Either::Left((joined, _)) => joined,
        futures_util::future::Either::Right(_) => Err(ClusterError::Stopped),
    }
}

/// How often a starting node looks for a stop request.
const STOP_POLL: Duration = Duration::from_millis(50);

async fn join(
    core: Rc<CoreState>,
    quorum: Vec<(u64, std::net::SocketAddr)>,
    request_timeout: Duration,
) -> Result<(), ClusterError> {
    let config = &core.node.config;
    let link = || {
        ControllerClient::new(quorum.clone(), request_timeout)
            .with_secret(config.controller_secret.clone())
    };
    // A voter that does not answer (paused, cut off: its TCP connection may
    // well stay up) gets a third of the session before the next is tried.
    let attempt =
        Duration::from_millis(config.broker_session_timeout_ms / 3).max(Duration::from_millis(200));
    let broker = Rc::new(Broker {
        client: link(),
        // A heartbeat must reach the active controller within the lease.
        heartbeats: link().with_attempt_timeout(attempt),
        // A long poll parked at a controller that stopped answering would
        // otherwise wait out the whole request timeout, and this node would
        // learn of the new leaders (its own leaderships among them) seconds
        // after the controller that replaced it committed them.
        metadata: link().with_attempt_timeout(attempt),
        node_id: config.node_id,
        incarnation: skiff_engine::data_dir::random_id_bytes(),
        broker_epoch: Cell::new(-1),
        state: RefCell::new(ClusterState::new()),
        applied: Cell::new(0),
        published: Cell::new(0),
        fenced: Cell::new(true),
        lease_from: Cell::new(Instant::now()),
        stepped_down: Cell::new(false),
        told_fenced: Cell::new(false),
        resume_at: Cell::new(None),
        held: RefCell::new(HashSet::new()),
        publishing: Rc::new(glommio::sync::Semaphore::new(1)),
        stopping: Cell::new(false),
        security: RefCell::new(Arc::default()),
        // The first table derives it (an authorizer with no ACLs yet).
        security_dirty: Cell::new(true),
        authz: config.authorizer.then(|| crate::security::AuthzSettings {
            super_users: config.super_users.clone(),
            allow_if_no_acl: config.allow_everyone_if_no_acl_found,
        }),
    });
    BROKER.with(|b| *b.borrow_mut() = Some(broker.clone()));
    let deadline = Instant::now() + START_TIMEOUT;

    let registered_at = register(&core, &broker, deadline).await?;
    // Catch up to (at least) our own registration before opening anything.
    while broker.applied.get() < registered_at {
        if Instant::now() >= deadline {
            return Err(ClusterError::Timeout(format!(
                "metadata not caught up to offset {registered_at} within {START_TIMEOUT:?}"
            )));
        }
        if let Err(e) = fetch_once(&broker).await {
            tracing::info!(error = %e, "fetching metadata (retrying)");
            sleep(RETRY_PAUSE).await;
        }
    }
    let table = Arc::new(derive_table(&broker));
    // Before acting on the metadata (deleting a stray partition among it),
    // the data directory must be this cluster's.
    if let Some(cluster) = &table.cluster_id {
        skiff_engine::data_dir::join_cluster(&core.node.data_dir, cluster)?;
    }
    open_assigned(&core, &TopicTable::default(), &table, true).await?;
    let offset = table.metadata_offset;
    crate::state::publish_table(&core.shard, table)
        .await
        .map_err(TopicError::from)?;
    broker.published.set(offset);

    glommio::spawn_local(follow(core.clone(), broker.clone())).detach();
    glommio::spawn_local(heartbeat_loop(core.clone(), broker.clone())).detach();

    while broker.fenced.get() {
        if Instant::now() >= deadline {
            return Err(ClusterError::Timeout(format!(
                "node {} not unfenced by the controller within {START_TIMEOUT:?}",
                broker.node_id
            )));
        }
        sleep(Duration::from_millis(5)).await;
    }
    tracing::info!(
        node_id = broker.node_id,
        broker_epoch = broker.broker_epoch.get(),
        metadata_offset = broker.applied.get(),
        "registered and unfenced"
    );
    glommio::spawn_local(lease_watchdog(core.clone(), broker.clone())).detach();
    Ok(())
}

/// Registers (retrying until `deadline`): the controller answers with this
/// incarnation's broker epoch and the offset of the registration record.
async fn register(
    core: &CoreState,
    broker: &Broker,
    deadline: Instant,
) -> Result<u64, ClusterError> {
    let config = &core.node.config;
    // One endpoint per listener, where clients of that listener reach it.
    let endpoints = core
        .node
        .listeners
        .iter()
        .map(|l| {
            let (host, port) = config.advertised(l);
            Endpoint {
                name: l.name.clone(),
                host,
                port,
            }
        })
        .collect();
    let registration = Registration {
        node_id: broker.node_id,
        incarnation_id: broker.incarnation,
        endpoints,
        rack: config.broker_rack.clone(),
    };
    loop {
        match broker.heartbeats.register(registration.clone()).await {
            Ok((epoch, offset)) => {
                broker.broker_epoch.set(epoch);
                return Ok(offset);
            }
            Err(ClientError::Refused { code, message }) => {
                return Err(ClusterError::Refused(format!(
                    "registration of node {}: {message} (error {code})",
                    broker.node_id
                )))
            }
            Err(e) if Instant::now() < deadline => {
                tracing::info!(error = %e, "registering with the controller (retrying)");
                sleep(RETRY_PAUSE).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// One long poll for committed metadata, applied to the broker's state.
/// Returns whether anything changed.
async fn fetch_once(broker: &Broker) -> Result<bool, ClientError> {
    let from = broker.applied.get() + 1;
    match broker.metadata.fetch_metadata(from, FETCH_WAIT).await? {
        MetadataFetch::Batches(batches) => {
            let changed = !batches.is_empty();
            let mut state = broker.state.borrow_mut();
            for batch in batches {
                if batch.offset <= broker.applied.get() {
                    continue;
                }
                // The controllers applied the same batch to the same state and
                // refused the same records: the refusal is part of the state.
                if batch.records.iter().any(crate::security::touches) {
                    broker.security_dirty.set(true);
                }
                for (index, e) in state.apply_batch(batch.offset, &batch.records) {
                    tracing::debug!(offset = batch.offset, index, error = %e, "metadata record refused, as by the controller");
                }
                broker.applied.set(batch.offset);
            }
            Ok(changed)
        }
        MetadataFetch::Snapshot { offset, image } => {
            let state = ClusterState::from_snapshot(&image).map_err(|e| {
                ClientError::Protocol(RpcError::Malformed(format!(
                    "metadata snapshot at {offset}: {e}"
                )))
            })?;
            *broker.state.borrow_mut() = state;
            broker.applied.set(offset);
            broker.security_dirty.set(true);
            Ok(true)
        }
    }
}

/// Follows the metadata log for as long as the node runs.
async fn follow(core: Rc<CoreState>, broker: Rc<Broker>) {
    let mut quiet_errors = 0u32;
    while !broker.stopping.get() {
        match fetch_once(&broker).await {
            Ok(false) => {}
            Ok(true) => {
                quiet_errors = 0;
                let Ok(_permit) = broker.publishing.acquire_permit(1).await else {
                    return;
                };
                let old = core.topics();
                let new = Arc::new(derive_table(&broker));
                // New partitions exist before any core's table shows them;
                // removed ones go after no table shows them any more.
                if let Err(e) = open_assigned(&core, &old, &new, false).await {
                    tracing::error!(error = %e, "opening the partitions the metadata assigns here");
                }
                match crate::state::publish_table(&core.shard, new.clone()).await {
                    Ok(()) => broker.published.set(new.metadata_offset),
                    Err(e) => tracing::warn!(error = %e, "sending the new metadata to the cores"),
                }
                if let Err(e) = drop_removed(&core, &old, &new).await {
                    tracing::error!(error = %e, "deleting the partitions of deleted topics");
                }
            }
            Err(e) => {
                // Expected while a controller election runs: quiet, then loud.
                quiet_errors += 1;
                if quiet_errors == 10 {
                    tracing::warn!(error = %e, "cannot fetch metadata from the controller");
                } else {
                    tracing::debug!(error = %e, "fetching metadata");
                }
                sleep(RETRY_PAUSE).await;
            }
        }
    }
}

async fn heartbeat_loop(core: Rc<CoreState>, broker: Rc<Broker>) {
    let config = &core.node.config;
    let interval = Duration::from_millis(config.broker_heartbeat_interval_ms);
    let session = Duration::from_millis(config.broker_session_timeout_ms);
    let mut last_ack = Instant::now();
    loop {
        if broker.stopping.get() {
            return;
        }
        let beat = Heartbeat {
            node_id: broker.node_id,
            broker_epoch: broker.broker_epoch.get(),
            metadata_offset: broker.applied.get(),
            want_fence: false,
            want_shutdown: false,
            offline_partitions: offline_replicas(&core, &broker).await,
        };
        match broker.heartbeats.heartbeat_timed(beat).await {
            Ok((reply, metadata_offset, sent)) => {
                last_ack = Instant::now();
                // From the send of the attempt that was answered: a call
                // that began during a cut and got through on a retry after
                // the heal does not leave the lease as old as the cut.
                broker.lease_from.set(sent);
                if reply.is_fenced != broker.fenced.get() {
                    tracing::info!(
                        "the controller {} this node",
                        if reply.is_fenced {
                            "fenced"
                        } else {
                            "unfenced"
                        }
                    );
                }
                broker.fenced.set(reply.is_fenced);
                broker.told_fenced.set(reply.is_fenced);
                if reply.is_fenced {
                    broker.resume_at.set(None);
                } else if broker.stepped_down.get() && broker.resume_at.get().is_none() {
                    broker.resume_at.set(Some(metadata_offset));
                }
            }
            Err(ClientError::Refused { code, message })
                if code == STALE_BROKER_EPOCH || code == BROKER_ID_NOT_REGISTERED =>
            {
                tracing::warn!(%message, "heartbeat refused; registering again");
                broker.fenced.set(true);
                broker.told_fenced.set(true);
                set_phase(&core, &broker);
                if let Err(e) = register(&core, &broker, Instant::now() + START_TIMEOUT).await {
                    tracing::warn!(error = %e, "registering again");
                }
                continue;
            }
            Err(e) => {
                // No acknowledged heartbeat for a whole session: the controller
                // has fenced this node by now, or cannot be reached to say
                // (the lease watchdog steps down from the leaderships).
                if last_ack.elapsed() > session && !broker.fenced.get() {
                    tracing::warn!(error = %e, "no heartbeat acknowledged for {session:?}: counting this node as fenced");
                    broker.fenced.set(true);
                } else {
                    tracing::debug!(error = %e, "heartbeat");
                }
            }
        }
        set_phase(&core, &broker);
        // Heartbeat faster while fenced: unfencing waits for the next one.
        sleep(if broker.fenced.get() {
            interval.min(Duration::from_millis(50))
        } else {
            interval
        })
        .await;
    }
}

/// How often the lease is checked against the clock.
const LEASE_CHECK_INTERVAL: Duration = Duration::from_millis(100);

/// How recently every other in-sync replica must have caught up for a
/// leadership to outlive the lease: a third of the session, at least twice a
/// follower's fetch wait (an idle follower is caught up at each fetch).
fn hold_window(session: Duration) -> Duration {
    (session / 3).max(Duration::from_millis(1000))
}

/// Steps down from leaderships when this node is fenced or its lease ran
/// out (no heartbeat acknowledged for a session: the controller may already
/// have moved them, or the quorum is slow or gone), and takes them back
/// from the metadata when a heartbeat is acknowledged unfenced. Clients of
/// a stepped-down partition get NOT_LEADER_OR_FOLLOWER at once, and
/// Metadata shows it led by nobody here, so they move to the new leader
/// instead of waiting for an answer that cannot come.
///
/// A lease that ran out without the controller saying "fenced" keeps the
/// leaderships every other in-sync replica still follows (caught up within
/// `hold_window`): none of them has been told it leads, so nobody else
/// does, and a controller quorum that is slow to elect (a stalled thread, a
/// busy disk) no longer stops every broker at once (seed 9301: all three
/// nodes' leases ran out together while their replication was healthy).
/// Once the controller elects a successor, it stops fetching here and the
/// leadership is given up within the window; a leader cut off from its
/// followers holds nothing. The high watermark waits for every ISR member
/// either way, so holding never acknowledges what a successor lacks.
async fn lease_watchdog(core: Rc<CoreState>, broker: Rc<Broker>) {
    let session = Duration::from_millis(core.node.config.broker_session_timeout_ms);
    let window = hold_window(session);
    while !broker.stopping.get() {
        let expired = broker.lease_from.get().elapsed() > session;
        if expired && !broker.fenced.get() {
            tracing::warn!(
                "no heartbeat acknowledged for {session:?}: counting this node as fenced"
            );
            broker.fenced.set(true);
            set_phase(&core, &broker);
        }
        let down = stays_down(
            broker.fenced.get(),
            expired,
            broker.stepped_down.get(),
            broker.applied.get(),
            broker.resume_at.get(),
        );
        let held = if down && !broker.told_fenced.get() {
            match crate::state::followed_leaderships(&core.shard, window).await {
                // The set only shrinks: a leadership given up is not taken
                // back before a heartbeat is acknowledged.
                Ok(followed) if broker.stepped_down.get() => broker
                    .held
                    .borrow()
                    .intersection(&followed)
                    .cloned()
                    .collect(),
                Ok(followed) => followed,
                Err(e) => {
                    tracing::warn!(error = %e, "asking the cores which leaderships are followed");
                    HashSet::new()
                }
            }
        } else {
            HashSet::new()
        };
        if down != broker.stepped_down.get() || held != *broker.held.borrow() {
            if let Ok(_permit) = broker.publishing.acquire_permit(1).await {
                if down && !broker.stepped_down.get() {
                    tracing::warn!(
                        keeping = held.len(),
                        "fenced or out of touch with the controller: stepping down from every leadership but those every in-sync follower still follows"
                    );
                } else if down {
                    let mut dropped: Vec<String> = broker
                        .held
                        .borrow()
                        .difference(&held)
                        .map(|tp| tp.to_string())
                        .collect();
                    dropped.sort();
                    tracing::warn!(
                        partitions = ?dropped,
                        keeping = held.len(),
                        "out of touch with the controller and no longer followed by every in-sync replica: stepping down"
                    );
                } else {
                    tracing::info!(
                        metadata_offset = broker.applied.get(),
                        "unfenced: leading again where the metadata says so"
                    );
                    broker.resume_at.set(None);
                }
                broker.stepped_down.set(down);
                *broker.held.borrow_mut() = held;
                let table = Arc::new(derive_table(&broker));
                if let Err(e) = crate::state::publish_table(&core.shard, table).await {
                    tracing::warn!(error = %e, "sending the new metadata to the cores");
                }
            }
        }
        sleep(LEASE_CHECK_INTERVAL).await;
    }
}

/// Whether this node stays stepped down from its leaderships: fenced, its
/// lease run out, or stepped down and not yet caught up with the metadata
/// the controller had when it first acknowledged the node unfenced again
/// (`resume_at`; None: no such answer yet).
fn stays_down(
    fenced: bool,
    expired: bool,
    stepped_down: bool,
    applied: u64,
    resume_at: Option<u64>,
) -> bool {
    fenced || expired || (stepped_down && resume_at.is_none_or(|at| applied < at))
}

/// The partitions whose local log is offline (a failed write or fdatasync),
/// as the controller names them: reported with every heartbeat, so their
/// leadership and this node's ISR places move away (KIP-858's offline log
/// directories, per partition). Asks every core.
async fn offline_replicas(core: &CoreState, broker: &Broker) -> Vec<(TopicId, u32)> {
    let mut offline = Vec::new();
    for target in 0..core.shard.table().shards() {
        let found = core
            .shard
            .invoke_on(target, |shard| async move {
                // Without waiting on each log's lock: a heartbeat over
                // thousands of busy partitions queued behind their appends
                // one by one. A log busy now is looked at next time.
                shard
                    .local_partition_handles()
                    .into_iter()
                    .filter(|(_, p)| matches!(p.try_offline_reason(), Some(Some(_))))
                    .map(|(tp, _)| tp)
                    .collect::<Vec<_>>()
            })
            .await;
        match found {
            Ok(found) => offline.extend(found),
            Err(e) => tracing::debug!(core = target, error = %e, "asking for offline partitions"),
        }
    }
    if offline.is_empty() {
        return Vec::new();
    }
    let state = broker.state.borrow();
    offline
        .iter()
        .filter_map(|tp| {
            let topic = state.topics().find(|t| t.name == tp.topic)?;
            Some((topic.topic_id, u32::try_from(tp.partition).ok()?))
        })
        .collect()
}

fn set_phase(core: &CoreState, broker: &Broker) {
    if matches!(core.phase.get(), Phase::Serving | Phase::Fenced) {
        core.phase.set(if broker.fenced.get() {
            Phase::Fenced
        } else {
            Phase::Serving
        });
    }
}

/// Controlled shutdown: asks the controller to move this node's leaderships
/// away, and waits (bounded) until it says the node may stop.
pub async fn shut_down() {
    let Some(broker) = Broker::current() else {
        return;
    };
    broker.stopping.set(true);
    let deadline = Instant::now() + CONTROLLED_SHUTDOWN_TIMEOUT;
    while Instant::now() < deadline {
        let beat = Heartbeat {
            node_id: broker.node_id,
            broker_epoch: broker.broker_epoch.get(),
            metadata_offset: broker.applied.get(),
            want_fence: false,
            want_shutdown: true,
            // Controlled shutdown moves every partition away anyway.
            offline_partitions: Vec::new(),
        };
        // The client retries an unreachable controller for a whole request
        // timeout (the session timeout); the stop waits no longer than its
        // own deadline (a controller whose disk is full is gone for good).
        let left = deadline.saturating_duration_since(Instant::now());
        let answer = crate::timeout::within(left, broker.heartbeats.heartbeat(beat)).await;
        match answer {
            Some(Ok(reply)) if reply.should_shut_down => {
                tracing::info!("controlled shutdown done: this node leads nothing");
                return;
            }
            Some(Ok(_)) => {}
            Some(Err(e)) => {
                tracing::info!(error = %e, "controlled shutdown: no controller; stopping anyway");
                return;
            }
            None => break,
        }
        sleep(Duration::from_millis(50)).await;
    }
    tracing::warn!(
        "controlled shutdown did not finish in {CONTROLLED_SHUTDOWN_TIMEOUT:?}; stopping anyway"
    );
}

/// The table every core reads, from the broker's committed state.
fn derive_table(broker: &Broker) -> TopicTable {
    let state = broker.state.borrow();
    let stepped_down = broker.stepped_down.get();
    let held = broker.held.borrow();
    let brokers = state
        .nodes()
        .map(|n| {
            let endpoint = n.endpoints.first();
            BrokerInfo {
                id: n.node_id,
                host: endpoint.map(|e| e.host.clone()).unwrap_or_default(),
                port: endpoint.map_or(0, |e| e.port),
                endpoints: n
                    .endpoints
                    .iter()
                    .map(|e| (e.name.clone(), e.host.clone(), e.port))
                    .collect(),
                rack: n.rack.clone(),
                // A node that stepped down from everything counts itself out.
                fenced: n.fenced
                    || (n.node_id == broker.node_id && stepped_down && held.is_empty()),
                in_controlled_shutdown: n.in_controlled_shutdown,
            }
        })
        .collect();
    let topics = state
        .topics()
        .map(|t| {
            let assignment = (0..t.partition_count)
                .map(|i| match t.partitions.get(&i) {
                    Some(p) => Assignment {
                        replicas: p.replicas.clone(),
                        isr: p.isr.clone(),
                        leader: if stepped_down
                            && p.leader == broker.node_id
                            && !held.contains(&TopicPartition::new(t.name.clone(), i as i32))
                        {
                            NO_LEADER
                        } else {
                            p.leader
                        },
                        leader_epoch: p.leader_epoch,
                        partition_epoch: p.partition_epoch,
                        adding: p.adding.clone(),
                        removing: p.removing.clone(),
                    },
                    None => Assignment {
                        replicas: Vec::new(),
                        isr: Vec::new(),
                        leader: NO_LEADER,
                        leader_epoch: -1,
                        partition_epoch: -1,
                        adding: Vec::new(),
                        removing: Vec::new(),
                    },
                })
                .collect::<Vec<_>>();
            let info = TopicInfo {
                name: t.name.clone(),
                id: Uuid::from_bytes(t.topic_id.0),
                partitions: t.partition_count as i32,
                configs: t.configs.iter().cloned().collect::<BTreeMap<_, _>>(),
                assignment,
            };
            (t.name.clone(), info)
        })
        .collect();
    let mut cluster_configs = BTreeMap::new();
    let mut node_configs: BTreeMap<i32, BTreeMap<String, String>> = BTreeMap::new();
    for (resource, key, value) in state.resource_configs() {
        let (key, value) = (key.to_string(), value.to_string());
        match resource {
            ConfigResource::Cluster => {
                cluster_configs.insert(key, value);
            }
            ConfigResource::Node(n) => {
                node_configs.entry(*n).or_default().insert(key, value);
            }
            ConfigResource::Topic(_) => {}
        }
    }
    if broker.security_dirty.replace(false) {
        *broker.security.borrow_mut() = Arc::new(crate::security::Security::from_state(
            &state,
            broker.authz.as_ref(),
        ));
    }
    TopicTable {
        topics,
        brokers,
        node_id: broker.node_id,
        metadata_offset: broker.applied.get(),
        cluster_id: state.cluster_id().map(str::to_string),
        cluster_configs,
        node_configs,
        security: broker.security.borrow().clone(),
    }
}

/// Deletes the local partitions of topics that `new` no longer has, and the
/// replicas a completed (or cancelled) reassignment moved off this node. (A
/// topic deleted and re-created under the same name between two fetches is
/// handled by `open_assigned`, which replaces its partitions.)
async fn drop_removed(
    core: &CoreState,
    old: &TopicTable,
    new: &TopicTable,
) -> Result<(), TopicError> {
    let me = new.node_id;
    for (name, info) in &old.topics {
        let Some(now) = new.topics.get(name).filter(|t| t.id == info.id) else {
            if !new.topics.contains_key(name) {
                delete_local(core, name, info.partitions).await?;
                tracing::info!(topic = %name, "deleted topic");
            }
            continue;
        };
        for (p, a) in info.assignment.iter().enumerate() {
            let moved_away = a.replicas.contains(&me)
                && now
                    .assignment
                    .get(p)
                    .is_some_and(|n| !n.replicas.contains(&me));
            if !moved_away {
                continue;
            }
            let tp = TopicPartition::new(name.clone(), p as i32);
            delete_one(core, &tp).await?;
            tracing::info!(partition = %tp, replicas = ?now.assignment[p].replicas, "replica moved off this node: deleted");
        }
    }
    Ok(())
}

/// Partitions created or deleted at once when a topic is applied: each waits
/// on its own file creation and fdatasyncs (on its owner core), and 10,000 one
/// after another took CreateTopics 20 s.
const APPLY_CONCURRENCY: usize = 64;

async fn delete_local(core: &CoreState, name: &str, partitions: i32) -> Result<(), TopicError> {
    use futures_util::stream::{self, TryStreamExt};
    stream::iter((0..partitions).map(Ok))
        .try_for_each_concurrent(APPLY_CONCURRENCY, |p| async move {
            delete_one(core, &TopicPartition::new(name.to_string(), p)).await
        })
        .await
}

/// Deletes one local partition (its log and the node's state of it).
async fn delete_one(core: &CoreState, tp: &TopicPartition) -> Result<(), TopicError> {
    match core.shard.delete_partition(tp).await {
        Ok(()) | Err(skiff_engine::LogError::UnknownPartition(_)) => {}
        Err(e) => return Err(TopicError::from(e)),
    }
    core.forget_partition(tp);
    Ok(())
}

/// Opens a log for every partition `new` assigns to this node and keeps
/// configs current.
///
/// At start (`first`), with the metadata caught up to this node's own
/// registration and the data directory bound to the cluster (`join`), the
/// local partition directories are checked against it, as Kafka's stray
/// replica detection does: one whose `partition.metadata` names another topic
/// id holds a topic of the same name deleted while this node was down, and is
/// deleted before the new topic's log is created; one the metadata does not
/// assign here (its topic deleted, or the replica moved away, while the node
/// was down) is deleted. Without a cluster id to bind to (a metadata log from
/// before it had one) strays are only reported.
async fn open_assigned(
    core: &CoreState,
    old: &TopicTable,
    new: &TopicTable,
    first: bool,
) -> Result<(), TopicError> {
    use futures_util::stream::TryStreamExt;
    let me = new.node_id;
    let data_dir = &core.node.data_dir;
    for (name, info) in &new.topics {
        if let Some(replaced) = old.topics.get(name).filter(|o| o.id != info.id) {
            // Deleted and created again: the old partitions' data must not
            // appear in the new topic.
            delete_local(core, name, replaced.partitions).await?;
        }
        let before = old.topics.get(name).filter(|o| o.id == info.id);
        let configs_changed = before.is_none_or(|o| o.configs != info.configs);
        let log = &core.node.config.log_config(&info.configs);
        let topic_id = *info.id.as_bytes();
        let created = std::cell::Cell::new(0);
        let mine = info
            .assignment
            .iter()
            .enumerate()
            .filter(|(_, a)| a.replicas.contains(&me))
            .map(|(p, _)| Ok(TopicPartition::new(name.clone(), p as i32)));
        futures_util::stream::iter(mine)
            .try_for_each_concurrent(APPLY_CONCURRENCY, |tp| {
                let created = &created;
                async move {
                    let dir = data_dir.join(tp.dir_name());
                    let mut exists = dir.exists();
                    // A topic new to this node may find a directory of an
                    // earlier one: left by a deletion while the node was
                    // down, or one that failed (a full disk).
                    if exists && (first || before.is_none()) {
                        exists = keep_if_same_topic(core, &tp, &dir, topic_id).await?;
                    }
                    if !exists {
                        core.shard
                            .create_partition_with(&tp, log.clone(), Some(topic_id))
                            .await?;
                        created.set(created.get() + 1);
                    } else if first || configs_changed {
                        core.shard.update_partition_config(&tp, log.clone()).await?;
                    }
                    Ok::<_, TopicError>(())
                }
            })
            .await?;
        let created = created.get();
        if created > 0 && before.is_none() && !first {
            tracing::info!(topic = %name, partitions = info.partitions, local = created, "created topic");
        }
    }
    if first {
        for tp in list_partition_dirs(data_dir)? {
            let topic = new.topics.get(&tp.topic);
            let assigned = topic
                .and_then(|t| t.assignment.get(usize::try_from(tp.partition).ok()?))
                .is_some_and(|a| a.replicas.contains(&me));
            if assigned {
                continue;
            }
            if new.cluster_id.is_none() {
                tracing::warn!(partition = %tp, "a partition directory the cluster metadata does not assign to this node; left alone (stray: the metadata names no cluster to check it against)");
                continue;
            }
            let why = if topic.is_some() {
                "the replica moved off this node"
            } else {
                "its topic was deleted"
            };
            tracing::info!(partition = %tp, why, "deleting a stray partition directory: the cluster metadata does not assign it to this node");
            delete_one(core, &tp).await?;
        }
    }
    Ok(())
}

/// Whether local partition directory `dir` holds topic `topic_id`'s
/// log. A directory from before `partition.metadata` existed is taken for the
/// topic of its name (the id is written); one whose file names another id is
/// an earlier topic's of the same name, and is deleted (false).
async fn keep_if_same_topic(
    core: &CoreState,
    tp: &TopicPartition,
    dir: &std::path::Path,
    topic_id: [u8; 16],
) -> Result<bool, TopicError> {
    use skiff_engine::partition_meta;
    match partition_meta::read(dir).await? {
        Some(id) if id == topic_id => Ok(true),
        Some(other) => {
            tracing::info!(
                partition = %tp,
                held = %partition_meta::uuid_string(&other),
                topic_id = %partition_meta::uuid_string(&topic_id),
                "deleting a partition directory of an earlier topic of the same name (deleted and created again while this node was down)"
            );
            delete_one(core, tp).await?;
            Ok(false)
        }
        None => {
            partition_meta::write(dir, &topic_id).await?;
            Ok(true)
        }
    }
}

/// Creates a topic through the controller; returns once this node has applied
/// it (its local partitions exist).
pub async fn create_topic(
    name: String,
    partitions: i32,
    replication_factor: i16,
    configs: BTreeMap<String, String>,
) -> Result<TopicInfo, ClusterError> {
    let broker = Broker::current().ok_or_else(not_running)?;
    let offset = broker
        .client
        .create_topic(CreateTopicRequest {
            name: name.clone(),
            partitions,
            replication_factor,
            configs: configs.into_iter().collect(),
        })
        .await
        .map_err(|e| refusal(&name, e))?;
    broker.wait_applied(offset, START_TIMEOUT).await?;
    let core = CoreState::current().ok_or_else(not_running)?;
    core.topics()
        .get(&name)
        .cloned()
        .ok_or(ClusterError::Topic(TopicError::Unknown(name)))
}

pub async fn delete_topic(name: &str) -> Result<(), ClusterError> {
    let broker = Broker::current().ok_or_else(not_running)?;
    let offset = broker
        .client
        .delete_topic(name)
        .await
        .map_err(|e| refusal(name, e))?;
    broker.wait_applied(offset, START_TIMEOUT).await
}

/// The controller quorum's status (the active controller's when it answers:
/// its voters carry their matched log index) and the voters' addresses,
/// asked over core 0's controller link.
pub async fn quorum_status(
    core: &CoreState,
) -> Result<(ControllerStatus, Vec<(u64, SocketAddr)>), ClusterError> {
    core.shard
        .invoke_on(0, |_| async move {
            let broker = Broker::current().ok_or_else(not_running)?;
            let status = broker.client.quorum_status().await?;
            Ok((status, broker.client.quorum().to_vec()))
        })
        .await
        .map_err(|e| ClusterError::Topic(TopicError::Engine(e)))?
}

/// Preferred or unclean elections through the controller; returns once this
/// node has applied the outcome.
pub async fn elect_leaders(
    election: ElectionType,
    partitions: Vec<(String, u32)>,
) -> Result<(), ClusterError> {
    let broker = Broker::current().ok_or_else(not_running)?;
    let offset = broker
        .client
        .elect_leaders(election, Some(partitions))
        .await?;
    broker.wait_applied(offset, START_TIMEOUT).await
}

/// Dynamic node configs through the controller (`node` None: the cluster
/// default); returns once this node has applied them.
pub async fn alter_node_configs(
    node: Option<NodeId>,
    ops: Vec<(String, Option<String>)>,
) -> Result<(), ClusterError> {
    let broker = Broker::current().ok_or_else(not_running)?;
    let offset = broker
        .client
        .alter_node_configs(node, ops)
        .await
        .map_err(|e| refusal("node configs", e))?;
    broker.wait_applied(offset, START_TIMEOUT).await
}

/// UnregisterBroker through the controller; returns once this node has
/// applied it.
pub async fn unregister_node(node: NodeId) -> Result<(), ClusterError> {
    let broker = Broker::current().ok_or_else(not_running)?;
    let offset = broker
        .client
        .unregister_node(node)
        .await
        .map_err(|e| refusal(&format!("node {node}"), e))?;
    broker.wait_applied(offset, START_TIMEOUT).await
}

/// Starts, replaces or cancels reassignments through the controller; returns
/// once this node has applied the outcome, with each entry's refusal (Kafka
/// code, text) or `None`.
pub async fn alter_reassignments(
    entries: Vec<skiff_controller::decisions::Reassignment>,
) -> Result<Vec<Option<(i16, String)>>, ClusterError> {
    let broker = Broker::current().ok_or_else(not_running)?;
    let (offset, refusals) = broker.client.alter_reassignments(entries).await?;
    broker.wait_applied(offset, START_TIMEOUT).await?;
    Ok(refusals)
}

/// AlterUserScramCredentials through the controller; returns once this node
/// has applied the outcome, with each user's refusal or `None`.
pub async fn alter_scram_credentials(
    alterations: Vec<skiff_controller::access::ScramAlteration>,
) -> Result<Vec<Option<(i16, String)>>, ClusterError> {
    let broker = Broker::current().ok_or_else(not_running)?;
    let (offset, refusals) = broker.client.alter_scram_credentials(alterations).await?;
    broker.wait_applied(offset, START_TIMEOUT).await?;
    Ok(refusals)
}

/// CreateAcls through the controller; each binding's refusal or `None`, once
/// this node has applied the outcome.
pub async fn create_acls(
    bindings: Vec<skiff_controller::records::AclRecord>,
) -> Result<Vec<Option<(i16, String)>>, ClusterError> {
    let broker = Broker::current().ok_or_else(not_running)?;
    let (offset, refusals) = broker.client.create_acls(bindings).await?;
    broker.wait_applied(offset, START_TIMEOUT).await?;
    Ok(refusals)
}

/// AlterClientQuotas through the controller; each entry's refusal or
/// `None`, once this node has applied the outcome.
pub async fn alter_client_quotas(
    entries: Vec<skiff_controller::access::QuotaAlteration>,
    validate_only: bool,
) -> Result<Vec<Option<(i16, String)>>, ClusterError> {
    let broker = Broker::current().ok_or_else(not_running)?;
    let (offset, refusals) = broker
        .client
        .alter_client_quotas(entries, validate_only)
        .await?;
    broker.wait_applied(offset, START_TIMEOUT).await?;
    Ok(refusals)
}

/// DeleteAcls through the controller: per filter, the bindings removed or
/// its refusal, once this node has applied the outcome.
pub async fn delete_acls(
    filters: Vec<skiff_controller::access::AclFilterRecord>,
) -> Result<crate::security::DeletedAcls, ClusterError> {
    let broker = Broker::current().ok_or_else(not_running)?;
    let (offset, results) = broker.client.delete_acls(filters).await?;
    broker.wait_applied(offset, START_TIMEOUT).await?;
    Ok(results)
}

/// Grows a topic to `count` partitions through the controller; returns once
/// this node has applied it (its new local partitions exist).
pub async fn create_partitions(
    name: &str,
    count: i32,
    assignments: Option<Vec<Vec<NodeId>>>,
) -> Result<(), ClusterError> {
    let broker = Broker::current().ok_or_else(not_running)?;
    let offset = broker
        .client
        .create_partitions(name, count, assignments)
        .await
        .map_err(|e| refusal(name, e))?;
    broker.wait_applied(offset, START_TIMEOUT).await
}

pub async fn alter_topic_configs(
    name: &str,
    ops: Vec<(String, Option<String>)>,
) -> Result<(), ClusterError> {
    let broker = Broker::current().ok_or_else(not_running)?;
    let offset = broker
        .client
        .alter_topic_configs(name, ops)
        .await
        .map_err(|e| refusal(name, e))?;
    broker.wait_applied(offset, START_TIMEOUT).await
}

fn not_running() -> ClusterError {
    ClusterError::Timeout("the broker's cluster link is not running (core 0)".into())
}

/// A controller refusal as the topic error a Kafka client expects.
fn refusal(name: &str, e: ClientError) -> ClusterError {
    match e {
        ClientError::Refused { code: 36, .. } => TopicError::Exists(name.to_string()).into(),
        ClientError::Refused { code: 3, .. } => TopicError::Unknown(name.to_string()).into(),
        ClientError::Refused { code, message } => TopicError::Refused { code, message }.into(),
        e => ClusterError::Controller(e),
    }
}

/// An ISR change from a partition this node leads (core 0): the controller
/// checks it against the epochs and commits it. Returns the committed ISR and
/// partition epoch.
pub async fn alter_partition(
    topic: &str,
    index: i32,
    change: skiff_replication::IsrChange,
) -> Result<(Vec<i32>, i32), ClusterError> {
    let broker = Broker::current().ok_or_else(not_running)?;
    let topic_id = broker
        .state
        .borrow()
        .topic_by_name(topic)
        .map(|t| t.topic_id)
        .ok_or_else(|| ClusterError::Topic(TopicError::Unknown(topic.to_string())))?;
    let request = skiff_controller::decisions::AlterPartition {
        node_id: broker.node_id,
        broker_epoch: broker.broker_epoch.get(),
        topic_id,
        index: u32::try_from(index).map_err(|_| TopicError::InvalidPartitions(index))?,
        leader_epoch: change.leader_epoch,
        partition_epoch: change.partition_epoch,
        new_isr: change.new_isr,
    };
    let state = broker
        .client
        .alter_partition(request)
        .await
        .map_err(|e| match e {
            ClientError::Refused { code, message } => {
                ClusterError::Topic(TopicError::Refused { code, message })
            }
            e => ClusterError::Controller(e),
        })?;
    Ok((state.isr, state.partition_epoch))
}

#[cfg(test)]
mod tests {
    use super::stays_down;

    #[test]
    fn leaderships_come_back_only_with_the_metadata_of_the_unfencing() {
        // Running normally: a metadata apply lagging the controller is no
        // reason to step down.
        assert!(!stays_down(false, false, false, 10, None));
        // Fenced or the lease run out: down, whatever the metadata.
        assert!(stays_down(true, false, false, 99, Some(1)));
        assert!(stays_down(false, true, true, 99, Some(1)));
        // Stepped down, acknowledged unfenced at controller offset 50: down
        // until offset 50 is applied here (the controller may have moved
        // the leaderships before it), then up.
        assert!(stays_down(false, false, true, 49, Some(50)));
        assert!(!stays_down(false, false, true, 50, Some(50)));
        // Stepped down and no unfenced answer recorded yet: still down.
        assert!(stays_down(false, false, true, 99, None));
    }
}
