//! The running controller: one quorum member on its own thread, networked.
//!
//! `ControllerHandle::start` opens the metadata log (synchronously: a storage
//! error is returned to the caller) and runs everything on one std thread
//! (named `skiff-controller`, glommio appends its executor id) with a glommio
//! `LocalExecutor`, optionally pinned to one CPU. The tasks on that executor:
//!
//! ```text
//! accept loop          the caller's listener; <= CONNECTIONS_MAX connections
//! connection task      per inbound connection: reads frames, answers requests
//!                      one at a time in order; Raft frames go to the inbox
//! peer sender          per other voter: a bounded queue (PEER_QUEUE_MAX frames)
//!                      and one outbound connection, reconnecting with backoff;
//!                      a frame it cannot send is dropped and raft-rs is told
//!                      (report_unreachable, report_snapshot(to, false)); a
//!                      snapshot written to the socket counts as delivered
//! driver               ticks every `tick`, steps the inbox, polls QuorumNode,
//!                      routes its messages, makes decisions, completes waiters
//! ```
//!
//! `QuorumNode` lives in an `Rc<RefCell<Core>>` on that one thread; no borrow is
//! held across an await. `QuorumNode::poll` fdatasyncs the metadata log
//! inline, blocking the thread: acceptable here because the thread is the
//! controller's alone (off the data path) and a sync is a few hundred bytes.
//!
//! Decisions (Register, Heartbeat, CreateTopic, DeleteTopic, CreatePartitions,
//! AlterTopicConfigs, AlterPartition, and session fencing on every tick) are
//! made by the active controller only (the Raft leader whose term's first entry
//! is applied), ONE AT A TIME against the committed state: a decision's records
//! are proposed and the next decision waits until they committed, or until
//! leadership was lost (the waiter then gets `NotController`; its records may
//! still commit under the next leader, so a retried CreateTopic can see
//! TOPIC_ALREADY_EXISTS). That is the simple correct pending view: no decision
//! is built on a state missing an in-flight batch. A decision with no records
//! is answered at once. Other voters answer `NotController` with the leader's
//! id and address when they know it. A new active controller gives every node a
//! fresh session (`Sessions::new`), as Kafka does.
//!
//! FetchMetadata reads committed entries from the metadata log's in-memory
//! cache (`MetadataLog`, bounded by the snapshot interval) and decodes them per
//! request, up to `max_bytes` (at least one batch) in chunks of
//! `FETCH_CHUNK_ENTRIES`; an offset behind the log's first entry gets a
//! snapshot of the committed state instead. With nothing newer it waits up to
//! `max_wait_ms` (capped at `FETCH_WAIT_MAX`) for a commit.
//!
//! Bad input: a frame the codec refuses, a Raft message protobuf refuses, or a
//! response sent to the controller closes that connection (logged at debug);
//! the service goes on.

use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_lite::AsyncWriteExt;
use glommio::channels::local_channel::{self, LocalReceiver, LocalSender};
use glommio::net::{TcpListener, TcpStream};
use glommio::task::JoinHandle;
use glommio::{LocalExecutorBuilder, Placement};
use protobuf::Message as _;
use raft::prelude::{EntryType, Message, MessageType};
use raft::{GetEntriesContext, Storage as _};
use skiff_security::SharedSecret;

use crate::access::{self, AclFilterRecord, QuotaAlteration, ScramAlteration};
use crate::decisions::{
    self, AlterPartition, ControllerConfig, ControllerError, CreateTopic, ElectionType, Heartbeat,
    Reassignment, Registration, Sessions,
};
use crate::lag::{self, LeaderLag};
use crate::node::{Committed, NodeError, Output, QuorumConfig, QuorumNode, SyncTicket};
use crate::records::{self, AclRecord, MetadataRecord, NodeId, TopicId, NO_LEADER};
use crate::rpc::{self, CreateTopicRequest, MetadataFetch, Request, Response, RpcMessage};

pub use crate::rpc::{ControllerStatus, NodeStatus};

/// Inbound connections served at once; more are closed on accept.
pub const CONNECTIONS_MAX: usize = 1024;
/// Frames queued per peer before new ones are dropped (and reported).
pub const PEER_QUEUE_MAX: usize = 1024;
/// Longest FetchMetadata wait, whatever the request asks.
pub const FETCH_WAIT_MAX: Duration = Duration::from_secs(30);
/// Entries read from the log per step of a FetchMetadata.
pub const FETCH_CHUNK_ENTRIES: u64 = 256;
/// A request waiting for its decision longer than this is answered
/// `NotController` (a leader without a quorum steps down well before).
pub const DECISION_WAIT_MAX: Duration = Duration::from_secs(30);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// Time a new connection has to finish the peer authentication exchange.
const AUTH_TIMEOUT: Duration = Duration::from_secs(5);
const BACKOFF_MIN: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(1);
/// How often a follower probes its leader's answers (`leader_probe`).
const PROBE_INTERVAL: Duration = Duration::from_millis(100);
/// How long a follower's leader must lag before it starts an election:
/// two observations past the bound (a late wake of its own thread is one).
const LAG_PERSIST: Duration = Duration::from_millis(200);
/// At most one election over a lagging leader per this long (Raft's
/// election timeout at the default tick is 1-2 s).
const LAG_CAMPAIGN_COOLDOWN: Duration = Duration::from_secs(2);
/// The head start each follower's campaign over a lagging leader gives the
/// one ranked before it (`lag::campaign_stagger`): more than a vote's round
/// trip and fdatasync on a healthy quorum.
const LAG_CAMPAIGN_STAGGER: Duration = Duration::from_millis(300);

/// How to run one controller.
#[derive(Debug)]
pub struct ServiceConfig {
    /// `QuorumNode::open(data_dir, ..)`: the log lives in
    /// `<data_dir>/__cluster_metadata-0/`.
    pub data_dir: PathBuf,
    /// This member's id and the voters.
    pub quorum: QuorumConfig,
    /// Every voter's controller address, this one's included.
    pub peers: Vec<(u64, SocketAddr)>,
    /// Bound by the caller (port 0 works; bind errors surface there).
    pub listener: std::net::TcpListener,
    pub controller: ControllerConfig,
    /// Raft tick (100 ms by default; `QuorumConfig`'s ticks count these).
    pub tick: Duration,
    /// Pin the executor to this CPU; `None`: unbound.
    pub cpu: Option<usize>,
    /// The id the first active controller names the cluster with (the node
    /// passes its data directory's cluster id); later controllers keep the
    /// committed one.
    pub cluster_id: String,
    /// The secret every connection to and from this controller proves first
    /// (`rpc::authenticate_inbound`/`_outbound`); `None`: no authentication.
    pub secret: Option<SharedSecret>,
}

impl ServiceConfig {
    /// Defaults: `ControllerConfig::default()`, a 100 ms tick, unbound.
    pub fn new(
        data_dir: PathBuf,
        quorum: QuorumConfig,
        peers: Vec<(u64, SocketAddr)>,
        listener: std::net::TcpListener,
        cluster_id: String,
    ) -> Self {
        Self {
            data_dir,
            quorum,
            peers,
            listener,
            controller: ControllerConfig::default(),
            tick: Duration::from_millis(100),
            cpu: None,
            cluster_id,
            secret: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error("controller: {0}")]
    Node(#[from] NodeError),
    #[error("controller listener: {0}")]
    Listener(std::io::Error),
    #[error("invalid controller service config: {0}")]
    Config(String),
    #[error("starting the controller thread: {0}")]
    Spawn(String),
    #[error("the controller thread panicked")]
    Panicked,
}

/// The running controller (see the module docs). Dropping it stops it too.
pub struct ControllerHandle {
    listen_addr: SocketAddr,
    status: Arc<Mutex<ControllerStatus>>,
    stop: Arc<AtomicBool>,
    thread: Option<glommio::ExecutorJoinHandle<Result<(), ServiceError>>>,
}

impl ControllerHandle {
    /// Opens the storage and starts the controller thread; returns once the
    /// storage is open (a storage error is returned here) and the listener is
    /// served.
    pub fn start(config: ServiceConfig) -> Result<ControllerHandle, ServiceError> {
        let id = config.quorum.id;
        for voter in &config.quorum.voters {
            if !config.peers.iter().any(|(p, _)| p == voter) {
                return Err(ServiceError::Config(format!(
                    "no address for voter {voter} in the peers {:?}",
                    config.peers
                )));
            }
        }
        if config.tick.is_zero() {
            return Err(ServiceError::Config("tick of 0".into()));
        }
        let listen_addr = config
            .listener
            .local_addr()
            .map_err(ServiceError::Listener)?;
        config
            .listener
            .set_nonblocking(true)
            .map_err(ServiceError::Listener)?;
        let status = Arc::new(Mutex::new(ControllerStatus {
            node_id: id,
            ..Default::default()
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<(), ServiceError>>();
        let placement = config.cpu.map_or(Placement::Unbound, Placement::Fixed);
        let (status2, stop2) = (status.clone(), stop.clone());
        let thread = LocalExecutorBuilder::new(placement)
            .name("skiff-controller")
            .spawn(move || run(config, status2, stop2, ready_tx))
            .map_err(|e| ServiceError::Spawn(e.to_string()))?;
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(ControllerHandle {
                listen_addr,
                status,
                stop,
                thread: Some(thread),
            }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => match thread.join() {
                Ok(Err(e)) => Err(e),
                _ => Err(ServiceError::Panicked),
            },
        }
    }

    pub fn listen_addr(&self) -> SocketAddr {
        self.listen_addr
    }

    /// The controller's latest status (updated by its thread at least every
    /// tick). Cheap; any thread.
    pub fn status(&self) -> ControllerStatus {
        lock(&self.status).clone()
    }

    /// A cloneable reader of `status` for other threads that do not own
    /// the handle (a broker's metrics scrape).
    pub fn status_reader(&self) -> StatusReader {
        StatusReader(self.status.clone())
    }

    /// Stops accepting, closes every connection, stops the thread and joins
    /// it. The error, if any, is what stopped the controller earlier (a
    /// storage error stops it: its durable state is then unknown).
    pub fn stop(mut self) -> Result<(), ServiceError> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Result<(), ServiceError> {
        self.stop.store(true, Ordering::Release);
        match self.thread.take() {
            None => Ok(()),
            Some(thread) => match thread.join() {
                Ok(result) => result,
                Err(_) => Err(ServiceError::Panicked),
            },
        }
    }
}

impl Drop for ControllerHandle {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown() {
            tracing::warn!(error = %e, "controller stopped with an error");
        }
    }
}

/// Reads a running controller's status (`ControllerHandle::status_reader`);
/// keeps the controller's shared status alive, not the controller. Cheap; any
/// thread.
#[derive(Clone)]
pub struct StatusReader(Arc<Mutex<ControllerStatus>>);

impl StatusReader {
    /// The latest status, as `ControllerHandle::status`.
    pub fn status(&self) -> ControllerStatus {
        lock(&self.0).clone()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The controller thread's root future.
async fn run(
    config: ServiceConfig,
    status: Arc<Mutex<ControllerStatus>>,
    stop: Arc<AtomicBool>,
    ready: std::sync::mpsc::Sender<Result<(), ServiceError>>,
) -> Result<(), ServiceError> {
    let opened = QuorumNode::open(&config.data_dir, &config.quorum).and_then(|mut node| {
        if config.quorum.voters == [config.quorum.id] {
            // Alone: no reason to wait for an election timeout.
            node.campaign()?;
        }
        Ok(node)
    });
    let node = match opened {
        Ok(node) => node,
        Err(e) => {
            let _ = ready.send(Err(e.into()));
            return Ok(());
        }
    };
    let listener = into_glommio(config.listener);
    let (kick, kick_rx) = local_channel::new_bounded(1);
    let peers: BTreeMap<u64, SocketAddr> = config.peers.iter().copied().collect();
    let shared = Rc::new(Shared {
        core: RefCell::new(Core {
            id: config.quorum.id,
            cluster_id: config.cluster_id.clone(),
            node,
            peers: peers.clone(),
            config: config.controller,
            sessions: Sessions::new(),
            reported_offsets: BTreeMap::new(),
            started: Instant::now(),
            leader_term: None,
            queue: VecDeque::new(),
            in_flight: None,
            inbox: Vec::new(),
            synced: None,
            commit_watchers: Vec::new(),
            outboxes: BTreeMap::new(),
            status,
            status_key: None,
            next_rebalance_ms: None,
            unclean_elections: 0,
            leader_contact: None,
            leader_lag: LeaderLag::default(),
        }),
        kick,
        tasks: RefCell::new(BTreeMap::new()),
        heard: RefCell::new(BTreeMap::new()),
        next_task: std::cell::Cell::new(0),
        secret: config.secret.clone(),
    });
    for (&to, &addr) in peers.iter().filter(|(p, _)| **p != config.quorum.id) {
        let (tx, rx) = local_channel::new_bounded(PEER_QUEUE_MAX);
        shared.core.borrow_mut().outboxes.insert(to, tx);
        let s = shared.clone();
        let task = glommio::spawn_local(peer_sender(s, to, addr, rx)).detach();
        shared.add_task(task);
    }
    if peers.len() > 1 {
        let task = glommio::spawn_local(leader_probe(shared.clone())).detach();
        shared.add_task(task);
    }
    tracing::info!(id = config.quorum.id, voters = ?config.quorum.voters, "controller started");
    let _ = ready.send(Ok(()));
    let result = futures_lite::future::or(
        async {
            accept_loop(shared.clone(), listener).await;
            Ok(())
        },
        drive(shared.clone(), kick_rx, stop, config.tick),
    )
    .await;
    // The listener is closed (dropped with the accept loop); close the rest.
    let tasks: Vec<JoinHandle<()>> = std::mem::take(&mut *shared.tasks.borrow_mut())
        .into_values()
        .collect();
    for task in tasks {
        task.cancel();
        let _ = with_timeout(Duration::from_millis(100), task).await;
    }
    {
        let mut core = shared.core.borrow_mut();
        core.fail_all();
        lock(&core.status).active = false;
    }
    match &result {
        Ok(()) => tracing::info!(id = config.quorum.id, "controller stopped"),
        Err(e) => tracing::error!(id = config.quorum.id, error = %e, "controller stopped"),
    }
    result
}

fn into_glommio(listener: std::net::TcpListener) -> TcpListener {
    use std::os::fd::{FromRawFd, IntoRawFd};
    let fd = listener.into_raw_fd();
    // SAFETY: `fd` is a bound, listening, non-blocking TCP socket we own
    // (`into_raw_fd` gave up std's ownership); glommio closes it on drop.
    #[allow(unsafe_code)]
    unsafe {
        TcpListener::from_raw_fd(fd)
    }
}

async fn with_timeout<T>(d: Duration, f: impl std::future::Future<Output = T>) -> Option<T> {
    futures_lite::future::or(async { Some(f.await) }, async {
        glommio::timer::sleep(d).await;
        None
    })
    .await
}

/// What the tasks share (one thread).
struct Shared {
    core: RefCell<Core>,
    /// Wakes the driver (capacity 1: kicks coalesce).
    kick: LocalSender<()>,
    /// Connection and peer tasks, cancelled at stop.
    tasks: RefCell<BTreeMap<u64, JoinHandle<()>>>,
    /// When a Raft message last came in from each peer: a peer that talks
    /// to us is up, whatever our connection to it went through before.
    heard: RefCell<BTreeMap<u64, Instant>>,
    next_task: std::cell::Cell<u64>,
    secret: Option<SharedSecret>,
}

impl Shared {
    fn kick(&self) {
        let _ = self.kick.try_send(());
    }

    fn add_task(&self, task: JoinHandle<()>) -> u64 {
        let id = self.next_task.get();
        self.next_task.set(id + 1);
        self.tasks.borrow_mut().insert(id, task);
        id
    }

    /// A frame for `to` was lost: raft-rs goes back to probing it.
    fn unreachable(&self, to: u64, snapshot: bool) {
        let mut core = self.core.borrow_mut();
        core.node.report_unreachable(to);
        if snapshot {
            core.node.report_snapshot(to, false);
        }
    }
}

/// A decision request waiting its turn.
struct Pending {
    decision: Decision,
    reply: LocalSender<Response>,
}

enum Decision {
    Register(Registration),
    Heartbeat(Heartbeat),
    CreateTopic(CreateTopicRequest),
    DeleteTopic(String),
    AlterTopicConfigs(String, Vec<(String, Option<String>)>),
    AlterPartition(AlterPartition),
    CreatePartitions(String, i32, Option<Vec<Vec<NodeId>>>),
    ElectLeaders(ElectionType, Option<Vec<(String, u32)>>),
    AlterReassignments(Vec<Reassignment>),
    UnregisterNode(NodeId),
    AlterNodeConfigs(Option<NodeId>, Vec<(String, Option<String>)>),
    AlterScramCredentials(Vec<ScramAlteration>),
    CreateAcls(Vec<AclRecord>),
    DeleteAcls(Vec<AclFilterRecord>),
    AlterClientQuotas(Vec<QuotaAlteration>, bool),
}

/// How to answer once a decision's batch committed.
enum Done {
    Registered { node: NodeId, broker_epoch: i64 },
    Heartbeat { node: NodeId, want_shutdown: bool },
    Committed,
    AlterPartition { topic_id: TopicId, index: u32 },
    PerEntry(Vec<Option<(i16, String)>>),
    DeletedAcls(Vec<Result<Vec<AclRecord>, (i16, String)>>),
}

/// The one proposal in flight.
struct InFlight {
    index: u64,
    term: u64,
    /// `None`: the controller's own (session fencing).
    waiter: Option<(Done, LocalSender<Response>)>,
}

struct Core {
    id: u64,
    /// Proposed as the cluster's id while the metadata has none.
    cluster_id: String,
    node: QuorumNode,
    peers: BTreeMap<u64, SocketAddr>,
    config: ControllerConfig,
    sessions: Sessions,
    /// The metadata offset each node reported in its last heartbeat to this
    /// controller (for `skiff cluster status`: how far behind a node is).
    reported_offsets: BTreeMap<NodeId, u64>,
    started: Instant,
    /// (term, index of the term's first entry) while this member leads.
    leader_term: Option<(u64, u64)>,
    queue: VecDeque<Pending>,
    in_flight: Option<InFlight>,
    /// Raft messages received since the last turn.
    inbox: Vec<Message>,
    /// A metadata log fdatasync that returned (run off this thread by
    /// `start_sync`), for the next turn to hand to the node.
    synced: Option<(SyncTicket, std::io::Result<()>)>,
    /// Long polls waiting for the next commit.
    commit_watchers: Vec<LocalSender<()>>,
    outboxes: BTreeMap<u64, LocalSender<Outbound>>,
    status: Arc<Mutex<ControllerStatus>>,
    status_key: Option<(u64, Option<u64>, u64, u64, bool)>,
    /// When the next automatic leader rebalance check is due (`now_ms`);
    /// `None` until this member first decides.
    next_rebalance_ms: Option<u64>,
    /// Unclean leader elections proposed while active (`ControllerStatus`).
    unclean_elections: u64,
    /// The last Raft leader other than this member and when (`now_ms`) this
    /// member last heard from it: where that node's broker session starts if
    /// this member becomes the active controller (see `track_leadership`).
    leader_contact: Option<(u64, u64)>,
    /// How late the Raft leader answers this member's probes
    /// (`leader_probe`): a follower replaces a leader that lags.
    leader_lag: LeaderLag,
}

/// One frame for a peer.
struct Outbound {
    frame: Vec<u8>,
    snapshot: bool,
}

impl Core {
    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// The active controller: leader, and its term's first entry applied (so
    /// its state holds everything committed before it).
    fn active(&self) -> bool {
        match self.leader_term {
            Some((term, first)) => {
                self.node.is_leader()
                    && self.node.term() == term
                    && self.node.applied_offset() >= first
            }
            None => false,
        }
    }

    fn not_controller(&self) -> Response {
        let leader = self
            .node
            .leader_id()
            .filter(|l| *l != self.id || self.node.is_leader())
            .map(|l| {
                let addr = self
                    .peers
                    .get(&l)
                    .map(ToString::to_string)
                    .unwrap_or_default();
                (l, addr)
            });
        Response::NotController { leader }
    }

    /// One pass of the driver: inbox, tick, poll, decisions, until quiet.
    fn turn(&mut self, ticked: bool) -> Result<(), NodeError> {
        for message in std::mem::take(&mut self.inbox) {
            if message.from != self.id && self.node.leader_id() == Some(message.from) {
                self.leader_contact = Some((message.from, self.now_ms()));
            }
            self.lift_lease_if_leader_lags(&message);
            if let Err(e) = self.node.step(message) {
                tracing::debug!(error = %e, "raft message not stepped");
            }
        }
        if ticked {
            self.node.tick();
            self.replace_leader_if_it_lags();
        }
        let mut fence_due = ticked;
        loop {
            self.poll()?;
            if !self.decide(&mut fence_due) {
                break;
            }
        }
        if ticked {
            self.sessions.retain_registered(self.node.state());
        }
        self.publish_status(ticked);
        Ok(())
    }

    /// The leader this follower probes, if it is another member.
    fn probed_leader(&self) -> Option<u64> {
        if self.node.is_leader() {
            return None;
        }
        self.node.leader_id().filter(|l| *l != self.id)
    }

    /// A follower whose probes of the leader have lagged past `lag::max_lag`
    /// for `LAG_PERSIST` starts an election (pre-vote first: it wins only if
    /// a majority sees the same lag; see `lift_lease_if_leader_lags`).
    fn replace_leader_if_it_lags(&mut self) {
        let Some(leader) = self.probed_leader() else {
            return;
        };
        let max = lag::max_lag(self.config.session_timeout_ms);
        let now = Instant::now();
        // `peers` holds every voter, this one included.
        let voters: Vec<u64> = self.peers.keys().copied().collect();
        let persist =
            LAG_PERSIST + lag::campaign_stagger(self.id, leader, &voters, LAG_CAMPAIGN_STAGGER);
        if self
            .leader_lag
            .observe(leader, now, max, persist, LAG_CAMPAIGN_COOLDOWN)
        {
            tracing::warn!(
                leader,
                lag_ms = self.leader_lag.lag(leader, now).as_millis() as u64,
                max_ms = max.as_millis() as u64,
                "the active controller answers too late: starting an election to replace it"
            );
            if let Err(e) = self.node.campaign() {
                tracing::warn!(error = %e, "starting an election");
            }
        }
    }

    /// A vote request for a later term is ignored while Raft's leader lease
    /// holds (this member heard from its leader within the election
    /// timeout); a member that sees the leader lag itself lifts the lease
    /// for it, so a majority that agrees the leader lags can replace it.
    fn lift_lease_if_leader_lags(&mut self, message: &Message) {
        let vote = matches!(
            message.get_msg_type(),
            MessageType::MsgRequestPreVote | MessageType::MsgRequestVote
        );
        if !vote || message.term <= self.node.term() {
            return;
        }
        let Some(leader) = self.probed_leader().filter(|l| *l != message.from) else {
            return;
        };
        let max = lag::max_lag(self.config.session_timeout_ms);
        let now = Instant::now();
        if self.leader_lag.lagging(leader, now, max) {
            tracing::info!(
                leader,
                candidate = message.from,
                lag_ms = self.leader_lag.lag(leader, now).as_millis() as u64,
                "the active controller answers too late: a candidate may have this member's vote"
            );
            self.node.forget_leader();
        }
    }

    fn poll(&mut self) -> Result<(), NodeError> {
        let mut out = Output::default();
        if let Some((ticket, result)) = self.synced.take() {
            out.extend(self.node.end_sync(ticket, result)?);
        }
        out.extend(self.node.poll_async()?);
        self.route(out.messages);
        if !out.committed.is_empty() || out.snapshot_installed.is_some() {
            for w in self.commit_watchers.drain(..) {
                let _ = w.try_send(());
            }
        }
        self.track_leadership();
        if let Some(f) = &self.in_flight {
            if !self.node.is_leader() || self.node.term() != f.term {
                self.fail_in_flight();
            } else if self.node.applied_offset() >= f.index {
                if let Some(f) = self.in_flight.take() {
                    if let Some((done, reply)) = f.waiter {
                        let response = self.completed(done, Some(f.index));
                        let _ = reply.try_send(response);
                    }
                }
            }
        }
        Ok(())
    }

    fn track_leadership(&mut self) {
        let leading = self.node.is_leader();
        let term = self.node.term();
        match self.leader_term {
            Some((t, _)) if leading && t == term => {}
            _ if leading => {
                // raft-rs appended the term's empty entry on becoming leader.
                self.leader_term = Some((term, self.node.last_index()));
                self.sessions = Sessions::new();
                // Every node gets a fresh session (as in Kafka), except the
                // one whose controller this member replaces: its broker has
                // most likely gone silent with it (paused, cut off, killed),
                // so its session runs from the last word its controller sent,
                // not from this election. Otherwise a leader that was also
                // the active controller keeps its partitions for an election
                // timeout longer than any other node would. A live one
                // heartbeats here within the session and nothing changes.
                // A contact older than a session is from some earlier term
                // (this member was cut off meanwhile): ignored.
                let now = self.now_ms();
                if let Some((previous, heard_ms)) = self.leader_contact.take() {
                    let recent = now.saturating_sub(heard_ms) < self.config.session_timeout_ms;
                    if let (true, Ok(node)) = (recent, NodeId::try_from(previous)) {
                        tracing::info!(
                            node,
                            silent_ms = now.saturating_sub(heard_ms),
                            "the replaced controller's node: its session runs from its last message"
                        );
                        self.sessions.touch(node, heard_ms);
                    }
                }
                tracing::info!(
                    id = self.id,
                    term,
                    "elected: active controller once the term's first entry commits"
                );
            }
            Some(_) => {
                self.leader_term = None;
                tracing::info!(id = self.id, term, leader = ?self.node.leader_id(), "no longer the leader");
                self.fail_all();
            }
            None => {}
        }
    }

    fn fail_in_flight(&mut self) {
        if let Some(f) = self.in_flight.take() {
            if let Some((_, reply)) = f.waiter {
                let _ = reply.try_send(self.not_controller());
            }
        }
    }

    fn fail_all(&mut self) {
        self.fail_in_flight();
        for p in std::mem::take(&mut self.queue) {
            let _ = p.reply.try_send(self.not_controller());
        }
    }

    /// Makes decisions while nothing is in flight. True if it proposed.
    fn decide(&mut self, fence_due: &mut bool) -> bool {
        while self.in_flight.is_none() && self.active() {
            if std::mem::take(fence_due) {
                let now = self.now_ms();
                let records = decisions::fence_one_expired(
                    self.node.state(),
                    &mut self.sessions,
                    now,
                    &self.config,
                );
                if !records.is_empty() {
                    return self.propose(&records, None);
                }
            }
            // The first active controller names the cluster.
            if self.node.state().cluster_id().is_none() {
                let record = MetadataRecord::ClusterId(records::ClusterIdentity {
                    cluster_id: self.cluster_id.clone(),
                });
                return self.propose(&[record], None);
            }
            if let Some(records) = self.rebalance_due() {
                tracing::info!(
                    partitions = records.len(),
                    "leaders away from their preferred replicas past leader.imbalance.per.broker.percentage: moving them back"
                );
                return self.propose(&records, None);
            }
            let Some(p) = self.queue.pop_front() else {
                return false;
            };
            match self.decide_one(&p.decision) {
                Err(e) => {
                    let _ = p.reply.try_send(Response::Refused {
                        code: e.kafka_code(),
                        message: e.to_string(),
                    });
                }
                Ok((records, done)) if records.is_empty() => {
                    let _ = p.reply.try_send(self.completed(done, None));
                }
                Ok((records, done)) => return self.propose(&records, Some((done, p.reply))),
            }
        }
        false
    }

    /// `auto.leader.rebalance.enable`: every check interval, the preferred
    /// leader elections of nodes past the imbalance percentage (`None` when
    /// not due or nothing to move).
    fn rebalance_due(&mut self) -> Option<Vec<MetadataRecord>> {
        if !self.config.auto_leader_rebalance {
            return None;
        }
        let now = self.now_ms();
        let interval = self.config.leader_imbalance_check_interval_ms;
        let due = self.next_rebalance_ms.get_or_insert(now + interval);
        if now < *due {
            return None;
        }
        *due = now + interval;
        let records = decisions::rebalance_leaders(
            self.node.state(),
            self.config.leader_imbalance_percentage,
        );
        (!records.is_empty()).then_some(records)
    }

    fn propose(
        &mut self,
        records: &[MetadataRecord],
        waiter: Option<(Done, LocalSender<Response>)>,
    ) -> bool {
        let unclean = decisions::unclean_elections(self.node.state(), records);
        if unclean > 0 {
            tracing::warn!(
                partitions = unclean,
                "unclean leader election: a replica outside the ISR leads; acknowledged writes it lacks are lost"
            );
            self.unclean_elections += unclean as u64;
        }
        match self.node.propose(records) {
            Ok(()) => {
                self.in_flight = Some(InFlight {
                    index: self.node.last_index(),
                    term: self.node.term(),
                    waiter,
                });
                true
            }
            Err(e) => {
                tracing::info!(error = %e, "proposal refused");
                if let Some((_, reply)) = waiter {
                    let _ = reply.try_send(self.not_controller());
                }
                false
            }
        }
    }

    fn decide_one(
        &mut self,
        decision: &Decision,
    ) -> Result<(Vec<MetadataRecord>, Done), ControllerError> {
        let now = self.now_ms();
        let state = self.node.state();
        let config = &self.config;
        match decision {
            Decision::Register(r) => {
                decisions::register(state, r, config).map(|(records, broker_epoch)| {
                    (
                        records,
                        Done::Registered {
                            node: r.node_id,
                            broker_epoch,
                        },
                    )
                })
            }
            Decision::Heartbeat(h) => {
                if state.node(h.node_id).is_some() {
                    self.reported_offsets.insert(h.node_id, h.metadata_offset);
                }
                decisions::heartbeat(state, &mut self.sessions, h, now, config).map(|records| {
                    (
                        records,
                        Done::Heartbeat {
                            node: h.node_id,
                            want_shutdown: h.want_shutdown,
                        },
                    )
                })
            }
            Decision::CreateTopic(t) => {
                let request = CreateTopic {
                    name: t.name.clone(),
                    topic_id: new_topic_id(|id| state.topic(id).is_some()),
                    partitions: t.partitions,
                    replication_factor: t.replication_factor,
                    configs: t.configs.clone(),
                    start_index: fastrand::usize(..),
                };
                decisions::create_topic(state, &request).map(|r| (r, Done::Committed))
            }
            Decision::DeleteTopic(name) => {
                decisions::delete_topic(state, name).map(|r| (r, Done::Committed))
            }
            Decision::ElectLeaders(election, partitions) => Ok((
                decisions::elect_leaders(state, *election, partitions.as_deref()),
                Done::Committed,
            )),
            Decision::AlterNodeConfigs(node, ops) => {
                decisions::alter_node_configs(*node, ops).map(|r| (r, Done::Committed))
            }
            Decision::UnregisterNode(node) => {
                decisions::unregister_node(state, *node).map(|r| (r, Done::Committed))
            }
            Decision::AlterReassignments(entries) => {
                let (records, results) = decisions::alter_reassignments(state, entries);
                Ok((records, Done::PerEntry(refusals(results))))
            }
            Decision::AlterScramCredentials(alterations) => {
                let (results, records) = access::alter_scram_credentials(state, alterations);
                Ok((
                    records,
                    Done::PerEntry(refusals(results.into_iter().map(|(_, r)| r))),
                ))
            }
            Decision::CreateAcls(bindings) => {
                let (results, records) = access::create_acls(state, bindings);
                Ok((records, Done::PerEntry(refusals(results))))
            }
            Decision::AlterClientQuotas(entries, validate_only) => {
                let (results, records) = access::alter_client_quotas(entries, *validate_only);
                Ok((records, Done::PerEntry(refusals(results))))
            }
            Decision::DeleteAcls(filters) => {
                let (results, records) = access::delete_acls(state, filters);
                let results = results
                    .into_iter()
                    .map(|r| r.map_err(|e| (e.kafka_code(), e.to_string())))
                    .collect();
                Ok((records, Done::DeletedAcls(results)))
            }
            Decision::CreatePartitions(name, count, assignments) => {
                decisions::create_partitions(state, name, *count, assignments.as_deref())
                    .map(|r| (r, Done::Committed))
            }
            Decision::AlterTopicConfigs(name, ops) => {
                decisions::alter_topic_configs(state, name, ops).map(|r| (r, Done::Committed))
            }
            Decision::AlterPartition(a) => decisions::alter_partition(state, a).map(|r| {
                (
                    r,
                    Done::AlterPartition {
                        topic_id: a.topic_id,
                        index: a.index,
                    },
                )
            }),
        }
    }

    /// The answer to a decision whose records committed at `index` (`None`:
    /// it had none), from the state with them applied.
    fn completed(&self, done: Done, index: Option<u64>) -> Response {
        let state = self.node.state();
        let applied = self.node.applied_offset();
        match done {
            Done::Registered { node, broker_epoch } => Response::Registered {
                broker_epoch,
                offset: index
                    .unwrap_or_else(|| state.node(node).map_or(applied, |n| n.registered_offset)),
            },
            Done::Heartbeat {
                node,
                want_shutdown,
            } => Response::Heartbeat {
                reply: decisions::heartbeat_reply(state, node, want_shutdown),
                offset: applied,
            },
            Done::Committed => Response::Committed {
                offset: index.unwrap_or(applied),
            },
            Done::PerEntry(refusals) => Response::PerEntry {
                offset: index.unwrap_or(applied),
                refusals,
            },
            Done::DeletedAcls(results) => Response::DeletedAcls {
                offset: index.unwrap_or(applied),
                results,
            },
            Done::AlterPartition { topic_id, index: p } => match state.partition(topic_id, p) {
                Some(partition) => Response::AlterPartition {
                    partition: partition.clone(),
                    offset: index.unwrap_or(applied),
                },
                None => {
                    let e = ControllerError::UnknownTopicOrPartition;
                    Response::Refused {
                        code: e.kafka_code(),
                        message: e.to_string(),
                    }
                }
            },
        }
    }

    /// Sends raft-rs's messages to their peers' queues.
    fn route(&mut self, messages: Vec<Message>) {
        for m in messages {
            let to = m.to;
            let snapshot = m.get_msg_type() == MessageType::MsgSnapshot;
            let frame = m
                .write_to_bytes()
                .map_err(|e| e.to_string())
                .and_then(|bytes| {
                    rpc::encode_frame(&RpcMessage::Raft(bytes)).map_err(|e| e.to_string())
                });
            let sent = match (frame, self.outboxes.get(&to)) {
                (Ok(frame), Some(outbox)) => outbox.try_send(Outbound { frame, snapshot }).is_ok(),
                (Err(e), _) => {
                    tracing::warn!(to, error = %e, "raft message not encodable; dropped");
                    false
                }
                (_, None) => {
                    tracing::debug!(to, "raft message for an unknown peer; dropped");
                    false
                }
            };
            if !sent {
                self.node.report_unreachable(to);
                if snapshot {
                    self.node.report_snapshot(to, false);
                }
            }
        }
    }

    /// Committed batches from `from` (see the module docs); `None`: nothing
    /// newer than `from` yet.
    fn read_committed(&self, from: u64, max_bytes: u32) -> Option<MetadataFetch> {
        let from = from.max(1);
        let applied = self.node.applied_offset();
        let storage = self.node.storage();
        let first = storage.first_index().unwrap_or(u64::MAX);
        if from < first {
            return Some(self.snapshot_fetch());
        }
        let mut batches = Vec::new();
        let mut bytes = 0usize;
        let mut low = from;
        while low <= applied && (batches.is_empty() || bytes < max_bytes as usize) {
            let high = (low + FETCH_CHUNK_ENTRIES).min(applied + 1);
            let entries = match storage.entries(low, high, None, GetEntriesContext::empty(false)) {
                Ok(entries) => entries,
                Err(e) => {
                    tracing::debug!(low, high, error = %e, "metadata entries unavailable; sending a snapshot");
                    return Some(self.snapshot_fetch());
                }
            };
            for entry in entries {
                if entry.get_entry_type() != EntryType::EntryNormal || entry.get_data().is_empty() {
                    continue;
                }
                if !batches.is_empty() && bytes + entry.get_data().len() > max_bytes as usize {
                    return Some(MetadataFetch::Batches(batches));
                }
                match records::decode_batch(entry.get_data()) {
                    Ok(records) => {
                        bytes += entry.get_data().len();
                        batches.push(Committed {
                            offset: entry.index,
                            records,
                        });
                    }
                    Err(e) => {
                        tracing::warn!(offset = entry.index, error = %e, "committed batch does not decode; skipped");
                    }
                }
            }
            low = high;
        }
        // Entries without records (a new term's empty entry, configuration
        // changes) still move the log: when they end what was read, an empty
        // batch at the last one carries the broker's applied offset up to the
        // controller's, which a heartbeat answer names as the offset to reach
        // (a node back from a lapsed lease leads again only there).
        let last = batches.last().map_or(from - 1, |b| b.offset);
        if low > applied && last < applied {
            batches.push(Committed {
                offset: applied,
                records: Vec::new(),
            });
        }
        (!batches.is_empty()).then_some(MetadataFetch::Batches(batches))
    }

    fn snapshot_fetch(&self) -> MetadataFetch {
        MetadataFetch::Snapshot {
            offset: self.node.applied_offset(),
            image: self.node.state().to_snapshot(),
        }
    }

    fn build_status(&self) -> ControllerStatus {
        let state = self.node.state();
        ControllerStatus {
            node_id: self.id,
            active: self.active(),
            leader_id: self.node.leader_id(),
            term: self.node.term(),
            commit_index: self.node.commit_index(),
            applied_offset: self.node.applied_offset(),
            nodes: state
                .nodes()
                .map(|n| NodeStatus {
                    id: n.node_id,
                    fenced: n.fenced,
                    in_controlled_shutdown: n.in_controlled_shutdown,
                    broker_epoch: n.broker_epoch,
                    endpoints: n
                        .endpoints
                        .iter()
                        .map(|e| format!("{}://{}:{}", e.name, e.host, e.port))
                        .collect(),
                    rack: n.rack.clone(),
                    metadata_offset: self.reported_offsets.get(&n.node_id).copied(),
                })
                .collect(),
            voters: self.node.voter_progress(),
            unclean_elections: self.unclean_elections,
            topics: state.topics().count() as u32,
            partitions: state.partitions().count() as u32,
            offline_partitions: state
                .partitions()
                .filter(|(_, _, p)| p.leader == NO_LEADER)
                .count() as u32,
        }
    }

    /// Refreshes the shared status when something it shows changed, and on
    /// every tick.
    fn publish_status(&mut self, force: bool) {
        let key = (
            self.node.term(),
            self.node.leader_id(),
            self.node.commit_index(),
            self.node.applied_offset(),
            self.active(),
        );
        if !force && self.status_key == Some(key) {
            return;
        }
        self.status_key = Some(key);
        let status = self.build_status();
        *lock(&self.status) = status;
    }
}

/// A random, unused topic id (a UUID v4, never the all-zero id).
fn new_topic_id(taken: impl Fn(TopicId) -> bool) -> TopicId {
    loop {
        let mut bytes = [0u8; 16];
        bytes[..8].copy_from_slice(&fastrand::u64(..).to_le_bytes());
        bytes[8..].copy_from_slice(&fastrand::u64(..).to_le_bytes());
        bytes[6] = (bytes[6] & 0x0f) | 0x40;
        bytes[8] = (bytes[8] & 0x3f) | 0x80;
        let id = TopicId(bytes);
        if !taken(id) {
            return id;
        }
    }
}

/// A tick this late is logged.
const LATE_TICK_WARN: Duration = Duration::from_millis(1000);

/// Ticks, steps the inbox, polls and decides until `stop` is set.
async fn drive(
    shared: Rc<Shared>,
    kick: LocalReceiver<()>,
    stop: Arc<AtomicBool>,
    tick: Duration,
) -> Result<(), ServiceError> {
    shared.core.borrow_mut().turn(false)?;
    start_sync(&shared)?;
    let mut next_tick = Instant::now() + tick;
    loop {
        if stop.load(Ordering::Acquire) {
            return Ok(());
        }
        let now = Instant::now();
        if now < next_tick {
            let wait = next_tick - now;
            futures_lite::future::or(
                async {
                    kick.recv().await;
                },
                async {
                    glommio::timer::sleep(wait).await;
                },
            )
            .await;
        }
        let now = Instant::now();
        let ticked = now >= next_tick;
        if ticked {
            let late = now - next_tick;
            if late > tick {
                // Sessions must not run out on time this thread stood still.
                let mut core = shared.core.borrow_mut();
                let now_ms = core.now_ms();
                core.sessions
                    .excuse(u64::try_from(late.as_millis()).unwrap_or(u64::MAX), now_ms);
            }
            if late >= LATE_TICK_WARN {
                // Raft's clocks stood still meanwhile (elections, check-quorum,
                // sessions): a blocked fdatasync or a starved CPU.
                tracing::warn!(
                    late_ms = late.as_millis() as u64,
                    "the controller's thread was held up; its ticks came late"
                );
            }
            next_tick += tick;
            if next_tick <= now {
                next_tick = now + tick;
            }
        }
        shared.core.borrow_mut().turn(ticked)?;
        start_sync(&shared)?;
    }
}

/// Starts the metadata log's next fdatasync, if one is due and none is in
/// flight, on glommio's blocking-thread pool: a slow disk then delays what
/// waits for durability (commits, votes, a follower's acknowledgements), not
/// the controller's ticks, heartbeats and network. The driver takes the
/// result on its next turn.
fn start_sync(shared: &Rc<Shared>) -> Result<(), NodeError> {
    let Some(ticket) = shared.core.borrow_mut().node.begin_sync()? else {
        return Ok(());
    };
    let s = shared.clone();
    glommio::spawn_local(async move {
        let (ticket, result) = glommio::executor()
            .spawn_blocking(move || {
                let result = ticket.sync();
                (ticket, result)
            })
            .await;
        s.core.borrow_mut().synced = Some((ticket, result));
        s.kick();
    })
    .detach();
    Ok(())
}

async fn accept_loop(shared: Rc<Shared>, listener: TcpListener) {
    let open = Rc::new(std::cell::Cell::new(0usize));
    loop {
        match listener.accept().await {
            Ok(stream) => {
                if open.get() >= CONNECTIONS_MAX {
                    tracing::info!("controller: too many connections, closing a new one");
                    continue;
                }
                open.set(open.get() + 1);
                let _ = stream.set_nodelay(true);
                let (s, open) = (shared.clone(), open.clone());
                let id_cell = Rc::new(std::cell::Cell::new(None));
                let id_cell2 = id_cell.clone();
                let task = glommio::spawn_local(async move {
                    connection(&s, stream).await;
                    open.set(open.get() - 1);
                    if let Some(id) = id_cell2.get() {
                        s.tasks.borrow_mut().remove(&id);
                    }
                })
                .detach();
                id_cell.set(Some(shared.add_task(task)));
            }
            Err(e) => {
                tracing::debug!(error = %e, "controller: accept failed");
                glommio::timer::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

/// Serves one inbound connection until it closes or sends something bad.
async fn connection(shared: &Rc<Shared>, mut stream: TcpStream) {
    let peer = stream.peer_addr().ok();
    if let Some(secret) = &shared.secret {
        match with_timeout(AUTH_TIMEOUT, rpc::authenticate_inbound(&mut stream, secret)).await {
            Some(Ok(())) => {}
            Some(Err(e)) => {
                tracing::info!(?peer, error = %e, "controller: a connection failed authentication; closed");
                return;
            }
            None => {
                tracing::info!(
                    ?peer,
                    "controller: a connection did not authenticate within {AUTH_TIMEOUT:?}; closed"
                );
                return;
            }
        }
    }
    loop {
        let message = match rpc::read_frame(&mut stream).await {
            Ok(Some(m)) => m,
            Ok(None) => return,
            Err(e) => {
                tracing::debug!(?peer, error = %e, "controller: closing a connection");
                return;
            }
        };
        match message {
            RpcMessage::Raft(bytes) => match Message::parse_from_bytes(&bytes) {
                Ok(m) => {
                    let mut core = shared.core.borrow_mut();
                    if m.to != core.id {
                        tracing::debug!(
                            ?peer,
                            to = m.to,
                            "raft message for another member; dropped"
                        );
                        continue;
                    }
                    let from = m.from;
                    core.inbox.push(m);
                    drop(core);
                    shared.heard.borrow_mut().insert(from, Instant::now());
                    shared.kick();
                }
                Err(e) => {
                    tracing::info!(?peer, error = %e, "controller: undecodable raft message, closing");
                    return;
                }
            },
            RpcMessage::Request {
                correlation_id,
                request,
            } => {
                let response = handle(shared, request).await;
                let reply = RpcMessage::Response {
                    correlation_id,
                    response,
                };
                let written = match rpc::encode_frame(&reply) {
                    Ok(frame) => with_timeout(WRITE_TIMEOUT, async {
                        stream.write_all(&frame).await?;
                        stream.flush().await
                    })
                    .await
                    .is_some_and(|r| r.is_ok()),
                    Err(e) => {
                        tracing::warn!(error = %e, "controller: response not encodable");
                        false
                    }
                };
                if !written {
                    return;
                }
            }
            RpcMessage::Response { .. } => {
                tracing::debug!(
                    ?peer,
                    "controller: a response sent to the controller, closing"
                );
                return;
            }
        }
    }
}

/// Per entry: `None` done, `Some` its refusal as the wire carries it.
fn refusals(
    results: impl IntoIterator<Item = Result<(), ControllerError>>,
) -> Vec<Option<(i16, String)>> {
    results
        .into_iter()
        .map(|r| r.err().map(|e| (e.kafka_code(), e.to_string())))
        .collect()
}

async fn handle(shared: &Rc<Shared>, request: Request) -> Response {
    let decision = match request {
        Request::Status => return Response::Status(shared.core.borrow().build_status()),
        Request::Ping => return Response::Pong,
        Request::FetchMetadata {
            from_offset,
            max_wait_ms,
            max_bytes,
        } => return fetch_metadata(shared, from_offset, max_wait_ms, max_bytes).await,
        Request::Register(r) => Decision::Register(r),
        Request::Heartbeat(h) => Decision::Heartbeat(h),
        Request::CreateTopic(t) => Decision::CreateTopic(t),
        Request::DeleteTopic { name } => Decision::DeleteTopic(name),
        Request::AlterTopicConfigs { name, ops } => Decision::AlterTopicConfigs(name, ops),
        Request::AlterPartition(a) => Decision::AlterPartition(a),
        Request::CreatePartitions {
            name,
            count,
            assignments,
        } => Decision::CreatePartitions(name, count, assignments),
        Request::ElectLeaders {
            election,
            partitions,
        } => Decision::ElectLeaders(election, partitions),
        Request::AlterReassignments { entries } => Decision::AlterReassignments(entries),
        Request::UnregisterNode { node_id } => Decision::UnregisterNode(node_id),
        Request::AlterNodeConfigs { node, ops } => Decision::AlterNodeConfigs(node, ops),
        Request::AlterScramCredentials { alterations } => {
            Decision::AlterScramCredentials(alterations)
        }
        Request::CreateAcls { bindings } => Decision::CreateAcls(bindings),
        Request::DeleteAcls { filters } => Decision::DeleteAcls(filters),
        Request::AlterClientQuotas {
            entries,
            validate_only,
        } => Decision::AlterClientQuotas(entries, validate_only),
    };
    let rx = {
        let mut core = shared.core.borrow_mut();
        if core.leader_term.is_none() {
            return core.not_controller();
        }
        let (tx, rx) = local_channel::new_bounded(1);
        core.queue.push_back(Pending {
            decision,
            reply: tx,
        });
        rx
    };
    shared.kick();
    match with_timeout(DECISION_WAIT_MAX, rx.recv()).await {
        Some(Some(response)) => response,
        _ => shared.core.borrow().not_controller(),
    }
}

async fn fetch_metadata(
    shared: &Rc<Shared>,
    from: u64,
    max_wait_ms: u32,
    max_bytes: u32,
) -> Response {
    let deadline = Instant::now() + Duration::from_millis(max_wait_ms.into()).min(FETCH_WAIT_MAX);
    loop {
        let (rx, wait) = {
            let mut core = shared.core.borrow_mut();
            if !core.active() {
                return core.not_controller();
            }
            if let Some(fetch) = core.read_committed(from, max_bytes) {
                return Response::Metadata(fetch);
            }
            let now = Instant::now();
            if now >= deadline {
                return Response::Metadata(MetadataFetch::Batches(Vec::new()));
            }
            let (tx, rx) = local_channel::new_bounded(1);
            core.commit_watchers.push(tx);
            (rx, deadline - now)
        };
        let _ = with_timeout(wait, rx.recv()).await;
    }
}

/// Sends frames to one peer over one connection, reconnecting with backoff.
#[derive(Debug)]
enum ConnectError {
    Io(String),
    Auth(rpc::RpcError),
}

/// A connection to a controller peer, authenticated when we have a secret.
async fn connect_peer(
    shared: &Shared,
    addr: SocketAddr,
    timeout: Duration,
) -> Result<TcpStream, ConnectError> {
    let mut s = TcpStream::connect_timeout(addr, timeout)
        .await
        .map_err(|e| ConnectError::Io(e.to_string()))?;
    let _ = s.set_nodelay(true);
    if let Some(secret) = &shared.secret {
        match with_timeout(AUTH_TIMEOUT, rpc::authenticate_outbound(&mut s, secret)).await {
            Some(Ok(())) => {}
            Some(Err(rpc::RpcError::Io(e))) => return Err(ConnectError::Io(e.to_string())),
            Some(Err(e)) => return Err(ConnectError::Auth(e)),
            None => return Err(ConnectError::Io("authentication timed out".into())),
        }
    }
    Ok(s)
}

/// Times the Raft leader's answers from this follower: a `Ping` on a
/// connection of its own every `PROBE_INTERVAL` (at once again after a slow
/// answer), one at a time, its round trip into `Core::leader_lag`. The answer
/// leaves the leader on the same outbound link as its answers to brokers and
/// its Raft messages, so a leader whose link queues shows it here even while
/// its messages still arrive. Connecting counts as part of the probe.
async fn leader_probe(shared: Rc<Shared>) {
    let mut conn: Option<(u64, TcpStream)> = None;
    let mut correlation_id = 0u64;
    let mut pause = PROBE_INTERVAL;
    loop {
        glommio::timer::sleep(pause).await;
        pause = PROBE_INTERVAL;
        let (leader, addr, timeout) = {
            let core = shared.core.borrow();
            let Some(leader) = core.probed_leader() else {
                conn = None;
                continue;
            };
            let Some(addr) = core.peers.get(&leader).copied() else {
                continue;
            };
            (
                leader,
                addr,
                Duration::from_millis(core.config.session_timeout_ms),
            )
        };
        let sent = Instant::now();
        shared.core.borrow_mut().leader_lag.sent(leader, sent);
        if conn.as_ref().map(|(to, _)| *to) != Some(leader) {
            conn = None;
            match connect_peer(&shared, addr, timeout).await {
                Ok(s) => conn = Some((leader, s)),
                Err(e) => {
                    tracing::debug!(leader, %addr, error = ?e, "probing the leader: cannot connect");
                    shared.core.borrow_mut().leader_lag.failed(leader);
                    continue;
                }
            }
        }
        let Some((_, stream)) = conn.as_mut() else {
            continue;
        };
        correlation_id += 1;
        let frame = match rpc::encode_frame(&RpcMessage::Request {
            correlation_id,
            request: Request::Ping,
        }) {
            Ok(frame) => frame,
            Err(e) => {
                tracing::warn!(error = %e, "probing the leader: cannot encode a ping");
                return;
            }
        };
        let answer = with_timeout(timeout, async {
            stream.write_all(&frame).await?;
            stream.flush().await?;
            rpc::read_frame(stream)
                .await
                .map_err(|e| std::io::Error::other(e.to_string()))
        })
        .await;
        let now = Instant::now();
        let mut core = shared.core.borrow_mut();
        match answer {
            Some(Ok(Some(RpcMessage::Response {
                correlation_id: id,
                response: Response::Pong,
            }))) if id == correlation_id => {
                core.leader_lag.answered(leader, now);
                if now - sent > lag::max_lag(core.config.session_timeout_ms) {
                    pause = Duration::ZERO;
                }
            }
            other => {
                // A leader of an older build (no Ping), a lost connection,
                // or no answer within a whole session: no figure.
                tracing::debug!(leader, answer = ?other.map(|a| a.map(|m| m.is_some())), "probing the leader: no answer");
                core.leader_lag.failed(leader);
                conn = None;
            }
        }
    }
}

async fn peer_sender(shared: Rc<Shared>, to: u64, addr: SocketAddr, rx: LocalReceiver<Outbound>) {
    let mut stream: Option<TcpStream> = None;
    let mut retry_at = Instant::now();
    let mut failed_at = Instant::now();
    let mut backoff = BACKOFF_MIN;
    while let Some(out) = rx.recv().await {
        if stream.is_none() {
            // A restarted peer that already talks to us gets our messages
            // now, not after the backoff its downtime built up.
            let heard = shared
                .heard
                .borrow()
                .get(&to)
                .is_some_and(|t| *t > failed_at);
            if Instant::now() < retry_at && !heard {
                shared.unreachable(to, out.snapshot);
                continue;
            }
            match connect_peer(&shared, addr, CONNECT_TIMEOUT).await {
                Ok(s) => {
                    tracing::debug!(to, %addr, "connected to controller peer");
                    stream = Some(s);
                    backoff = BACKOFF_MIN;
                }
                Err(e) => {
                    match e {
                        // Not a network fault: say so at every attempt.
                        ConnectError::Auth(e) => tracing::warn!(
                            to, %addr, error = %e, "controller peer refused or failed authentication"
                        ),
                        ConnectError::Io(e) => {
                            tracing::debug!(to, %addr, error = %e, "controller peer unreachable")
                        }
                    }
                    failed_at = Instant::now();
                    retry_at = failed_at + backoff;
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                    shared.unreachable(to, out.snapshot);
                    continue;
                }
            }
        }
        let Some(s) = stream.as_mut() else {
            continue;
        };
        // Writes of small messages succeed into the socket buffer even when
        // nothing reaches the peer: ask the kernel (see `tcp_health`).
        if crate::tcp_health::stalled(std::os::fd::AsRawFd::as_raw_fd(s)) {
            tracing::info!(to, %addr, "the connection to a controller peer stalled; reconnecting");
            stream = None;
            shared.unreachable(to, out.snapshot);
            continue;
        }
        let written = with_timeout(WRITE_TIMEOUT, async {
            s.write_all(&out.frame).await?;
            s.flush().await
        })
        .await;
        match written {
            Some(Ok(())) => {
                if out.snapshot {
                    shared.core.borrow_mut().node.report_snapshot(to, true);
                }
            }
            _ => {
                tracing::debug!(to, %addr, "lost the connection to a controller peer");
                stream = None;
                shared.unreachable(to, out.snapshot);
            }
        }
    }
}
