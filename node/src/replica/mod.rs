//! Replication on a node: each partition this node holds a replica of is, on
//! its owner core, a leader or a follower, as the committed metadata says.
//!
//! ```text
//! metadata table (cluster.rs broadcast) -> apply_table on every core:
//!   leader == me, new epoch    -> Leader: LeaderReplica (skiff-replication)
//!                                 over the ISR, producer state reloaded
//!   leader elsewhere           -> Follower: the core's fetcher for that
//!                                 leader fetches it (fetcher.rs)
//! produce (owner core):  admit_append (leader? epoch; acks=all: ISR >= min)
//!                        -> append at the leader epoch -> durable ->
//!                        local_durable (the leader's own end counts) ->
//!                        acks=all: await_replicated(last + 1)
//! follower fetch (owner core of the leader's partition): follower_fetch
//!                        records the follower's end -> HW -> waiters; an
//!                        ISR expansion goes to the controller (AlterPartition)
//! every SHRINK_INTERVAL: maybe_shrink -> AlterPartition
//! ```
//!
//! The rules themselves (high watermark, ISR, truncation) are in
//! `skiff-replication`, sans I/O; this module is the glue: roles per
//! partition in a core-local map, the engine's high watermark, waiters, and
//! AlterPartition through core 0.
//!
//! Architecture invariant: a partition's replication state is touched only on
//! its owner core (no locks); the high watermark consumers read up to is set
//! only from `LeaderReplica` (leader) or the leader's answers (follower).

pub mod fetcher;
pub mod throttle;

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;

use futures_channel::oneshot;
use glommio::sync::Semaphore;
use kafka_protocol::ResponseError;
use skiff_engine::{Partition, TopicPartition};
use skiff_replication::{
    AckWaiters, FollowerFetch, IsrChange, LeaderConfig, LeaderReplica, ReplicationError,
};

use crate::state::CoreState;
use crate::timeout::within;
use crate::topics::table::{TopicTable, NO_LEADER};

/// acks=all writes waiting for the replicas, per partition.
const ACK_WAITERS_MAX: usize = 100_000;
/// How often leaders look for followers to drop from the ISR.
const SHRINK_INTERVAL: Duration = Duration::from_millis(250);

/// A change of this core's role for a partition, given to whatever runs on
/// top of the partition (the group coordinator on `__consumer_offsets`):
/// replication announces it and never calls up into them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoleChange {
    /// This core leads the partition from this leader epoch on.
    Leading { leader_epoch: i32 },
    /// It no longer leads it (it follows, or no longer replicates it).
    NotLeading,
}

type RoleListener = Rc<dyn Fn(&TopicPartition, RoleChange)>;

thread_local! {
    static ROLE_LISTENERS: RefCell<Vec<RoleListener>> = const { RefCell::new(Vec::new()) };
}

/// Makes this core's leader and follower roles follow every topic table
/// published to it (`state::publish_table`), and answer the lease
/// watchdog's question (`state::followed_leaderships`). Called once per
/// core at start.
pub fn attach() {
    crate::state::on_table_change(|core, table| {
        glommio::spawn_local(apply_table(core, table)).detach();
    });
    crate::state::on_followed_query(followed_leaderships);
}

/// Registers `listener` for every role change of this core's partitions
/// from now on: once per core, before the core takes any role.
pub fn on_role_change(listener: impl Fn(&TopicPartition, RoleChange) + 'static) {
    ROLE_LISTENERS.with(|l| l.borrow_mut().push(Rc::new(listener)));
}

fn announce(tp: &TopicPartition, change: RoleChange) {
    // Called outside the borrow: a listener may register another.
    let listeners = ROLE_LISTENERS.with(|l| l.borrow().clone());
    for listener in listeners {
        listener(tp, change);
    }
}

/// A refusal a produce or fetch answers with.
#[derive(Debug, Clone)]
pub struct Refusal {
    pub error: ResponseError,
    pub message: String,
}

impl Refusal {
    fn new(error: ResponseError, message: impl Into<String>) -> Self {
        Self {
            error,
            message: message.into(),
        }
    }
}

impl From<ReplicationError> for Refusal {
    fn from(e: ReplicationError) -> Self {
        Refusal::new(
            ResponseError::try_from_code(e.kafka_code())
                .unwrap_or(ResponseError::UnknownServerError),
            e.to_string(),
        )
    }
}

pub struct Leader {
    pub state: LeaderReplica,
    /// More than one replica: the high watermark is the replicas' agreement.
    /// A single replica's is its own durable end, as without replication.
    replicated: bool,
    waiters: AckWaiters<oneshot::Sender<()>>,
    /// Node ids of the replicas, for metrics and transitions.
    pub replicas: Vec<i32>,
    /// A read found the log corrupt and that was said (`corrupt_read`).
    corrupt_reported: bool,
}

pub struct Follower {
    pub leader: i32,
    pub leader_epoch: i32,
}

pub enum Role {
    Leader(Box<Leader>),
    Follower(Follower),
}

/// This core's replication counters (only this core's thread touches them).
#[derive(Debug, Default)]
struct Counters {
    isr_shrinks: std::cell::Cell<u64>,
    isr_expands: std::cell::Cell<u64>,
    leaderships: std::cell::Cell<u64>,
    fetch_requests: std::cell::Cell<u64>,
    fetch_bytes: std::cell::Cell<u64>,
    fetch_errors: std::cell::Cell<u64>,
}

fn bump(cell: &std::cell::Cell<u64>, by: u64) {
    cell.set(cell.get().wrapping_add(by));
}

/// One follower of a partition this core leads, for metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FollowerLagSample {
    pub tp: TopicPartition,
    pub follower: i32,
    pub records_behind: i64,
    pub caught_up_ms_ago: u64,
    pub in_isr: bool,
}

/// This core's replication figures at a scrape.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplicationSnapshot {
    /// ISR shrinks / expansions this node proposed (AlterPartition sent).
    pub isr_shrinks: u64,
    pub isr_expands: u64,
    /// Leaderships this node took (a partition at a new leader epoch).
    pub leaderships: u64,
    /// Follower fetch requests sent, record bytes received, failures.
    pub fetch_requests: u64,
    pub fetch_bytes: u64,
    pub fetch_errors: u64,
    /// Replication bytes counted against a throttle (throttle.rs): sent as a
    /// leader, received as a follower.
    pub throttled_leader_bytes: u64,
    pub throttled_follower_bytes: u64,
    pub lag: Vec<FollowerLagSample>,
}

impl ReplicationSnapshot {
    pub fn merge(&mut self, other: ReplicationSnapshot) {
        self.isr_shrinks += other.isr_shrinks;
        self.isr_expands += other.isr_expands;
        self.leaderships += other.leaderships;
        self.fetch_requests += other.fetch_requests;
        self.fetch_bytes += other.fetch_bytes;
        self.fetch_errors += other.fetch_errors;
        self.throttled_leader_bytes += other.throttled_leader_bytes;
        self.throttled_follower_bytes += other.throttled_follower_bytes;
        self.lag.extend(other.lag);
    }
}

/// This core's figures (runs on the core it describes).
pub fn snapshot(
    partitions: &dyn Fn(&TopicPartition) -> Option<Rc<Partition>>,
) -> ReplicationSnapshot {
    let now = now_ms();
    let (throttled_leader_bytes, throttled_follower_bytes) = throttle::throttled_bytes();
    let mut out = COUNTERS.with(|c| ReplicationSnapshot {
        isr_shrinks: c.isr_shrinks.get(),
        isr_expands: c.isr_expands.get(),
        leaderships: c.leaderships.get(),
        fetch_requests: c.fetch_requests.get(),
        fetch_bytes: c.fetch_bytes.get(),
        fetch_errors: c.fetch_errors.get(),
        throttled_leader_bytes,
        throttled_follower_bytes,
        lag: Vec::new(),
    });
    ROLES.with(|r| {
        for (tp, role) in r.borrow().iter() {
            let Role::Leader(l) = role else { continue };
            if !l.replicated {
                continue;
            }
            let leo = partitions(tp).map_or(0, |p| p.log_end());
            for f in l.state.follower_lag(leo, now) {
                out.lag.push(FollowerLagSample {
                    tp: tp.clone(),
                    follower: f.node_id,
                    records_behind: f.records_behind,
                    caught_up_ms_ago: f.caught_up_ms_ago,
                    in_isr: f.in_isr,
                });
            }
        }
    });
    out
}

/// The fetcher's accounting (fetcher.rs).
pub(crate) fn count_fetch(bytes: u64, failed: bool) {
    COUNTERS.with(|c| {
        bump(&c.fetch_requests, 1);
        bump(&c.fetch_bytes, bytes);
        if failed {
            bump(&c.fetch_errors, 1);
        }
    });
}

thread_local! {
    static COUNTERS: Counters = Counters::default();
    static ROLES: RefCell<HashMap<TopicPartition, Role>> = RefCell::new(HashMap::new());
    /// One table applied at a time, in the order they arrive.
    static APPLYING: Rc<Semaphore> = Rc::new(Semaphore::new(1));
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn with_role<T>(tp: &TopicPartition, f: impl FnOnce(Option<&mut Role>) -> T) -> T {
    ROLES.with(|r| f(r.borrow_mut().get_mut(tp)))
}

/// Before a produce's append, on the owner core: the leader epoch to append
/// at, or why not (this node does not lead it; acks=all and the ISR is below
/// min.insync.replicas).
pub fn admit_append(tp: &TopicPartition, acks: i16) -> Result<i32, Refusal> {
    with_role(tp, |role| match role {
        Some(Role::Leader(l)) => {
            if acks == -1 {
                l.state.check_acks_all()?;
            }
            Ok(l.state.leader_epoch())
        }
        _ => Err(Refusal::new(
            ResponseError::NotLeaderOrFollower,
            format!("this node does not lead {tp}"),
        )),
    })
}

/// The leader's own log became durable further: its end counts toward the
/// high watermark.
pub fn local_durable(tp: &TopicPartition, partition: &Partition) {
    with_role(tp, |role| {
        if let Some(Role::Leader(l)) = role {
            if let Some(hw) = l.state.on_local_durable(partition.durable_end()) {
                publish(l, partition, hw);
            }
        }
    })
}

fn publish(leader: &mut Leader, partition: &Partition, hw: i64) {
    if leader.replicated {
        partition.set_replicated_high_watermark(Some(hw));
    }
    for waiter in leader.waiters.release(hw) {
        let _ = waiter.send(());
    }
}

/// acks=all: waits until the high watermark covers `end` (the last offset of
/// the append + 1), at most `timeout`; then checks that the ISR is still at
/// least min.insync.replicas (NOT_ENOUGH_REPLICAS_AFTER_APPEND otherwise).
///
/// The write is in the log when this runs, and followers may have fetched it:
/// every refusal says "possibly persisted" (REQUEST_TIMED_OUT or
/// NOT_ENOUGH_REPLICAS_AFTER_APPEND), never NOT_LEADER_OR_FOLLOWER, also when
/// the leadership moved meanwhile. librdkafka's idempotent producer reads
/// NOT_LEADER_OR_FOLLOWER as "not persisted"; when a later write of the same
/// producer then succeeds at the new leader (which holds this one), it sees a
/// sequence gap, bumps its epoch and sends this write again under new sequence
/// numbers: a duplicate no broker can recognise (the nemesis suite's bitflip
/// on a leader found it). "Possibly persisted" makes it retry with the same
/// sequence numbers, which the new leader answers with the original offset.
pub async fn await_replicated(
    tp: &TopicPartition,
    end: i64,
    timeout: Duration,
) -> Result<(), Refusal> {
    let rx = with_role(tp, |role| match role {
        Some(Role::Leader(l)) => {
            let (tx, rx) = oneshot::channel();
            if l.state.high_watermark() >= end {
                let _ = tx.send(());
            } else if l.waiters.push(end, tx).is_err() {
                return Err(Refusal::new(
                    ResponseError::RequestTimedOut,
                    format!("{tp}: too many acks=all writes waiting for the replicas"),
                ));
            }
            Ok(rx)
        }
        _ => Err(Refusal::new(
            ResponseError::NotEnoughReplicasAfterAppend,
            format!("{tp}: written to this node's log, but it no longer leads the partition"),
        )),
    })?;
    let timed_out = Refusal::new(
        ResponseError::RequestTimedOut,
        format!("{tp}: the in-sync replicas did not reach offset {end} within {timeout:?}"),
    );
    match within(timeout, rx).await {
        Some(Ok(())) => {}
        Some(Err(_)) => {
            return Err(Refusal::new(
                ResponseError::NotEnoughReplicasAfterAppend,
                format!(
                    "{tp}: written to this node's log, but it stopped leading the partition \
                     before the in-sync replicas confirmed it"
                ),
            ))
        }
        None => return Err(timed_out),
    }
    with_role(tp, |role| match role {
        Some(Role::Leader(l)) => Ok(l.state.check_after_append()?),
        _ => Err(Refusal::new(
            ResponseError::NotEnoughReplicasAfterAppend,
            format!("{tp}: written to this node's log, but it stopped leading the partition"),
        )),
    })
}

/// A follower's fetch, on the owner core: the leader epoch it believes in
/// must be this one; a follower whose log diverges from ours (`epoch_end`:
/// our end offset for its last fetched epoch) gets the diverging epoch and
/// nothing is recorded; otherwise its end is recorded (the high watermark may
/// move, waiters may be answered, an ISR expansion may be proposed).
/// Returns the high watermark to send back and the diverging epoch, if any.
pub fn follower_fetch(
    core: &Rc<CoreState>,
    tp: &TopicPartition,
    fetch: FollowerFetch,
    epoch_end: Option<(i32, i64)>,
    partition: &Partition,
) -> Result<(i64, Option<(i32, i64)>), Refusal> {
    let (hw, outcome) = with_role(tp, |role| match role {
        Some(Role::Leader(l)) => {
            let outcome =
                l.state
                    .on_follower_fetch(fetch, epoch_end, partition.log_end(), now_ms())?;
            if let Some(hw) = outcome.high_watermark {
                publish(l, partition, hw);
            }
            Ok::<_, Refusal>((l.state.high_watermark(), outcome))
        }
        _ => Err(Refusal::new(
            ResponseError::NotLeaderOrFollower,
            format!("this node does not lead {tp}"),
        )),
    })?;
    if let Some((epoch, end_offset)) = outcome.diverging {
        tracing::info!(
            partition = %tp, follower = fetch.follower, fetch_offset = fetch.fetch_offset,
            last_fetched_epoch = fetch.last_fetched_epoch, epoch, end_offset,
            "a follower's log diverges from ours: it must truncate"
        );
    }
    if let Some(change) = outcome.expand {
        COUNTERS.with(|c| bump(&c.isr_expands, 1));
        send_alter(core.clone(), tp.clone(), change);
    }
    Ok((hw, outcome.diverging))
}

/// Whether `follower` is in the committed ISR of `tp`, which this core leads.
pub fn in_isr(tp: &TopicPartition, follower: i32) -> bool {
    with_role(tp, |role| match role {
        Some(Role::Leader(l)) => l.state.isr().contains(&follower),
        _ => false,
    })
}

/// Sends an ISR change to the controller (through core 0) and applies the
/// answer on this core.
fn send_alter(core: Rc<CoreState>, tp: TopicPartition, change: IsrChange) {
    glommio::spawn_local(async move {
        tracing::info!(partition = %tp, isr = ?change.new_isr, "proposing an ISR change");
        let topic = tp.topic.clone();
        let index = tp.partition;
        let request = change.clone();
        let result = core
            .shard
            .invoke_on(0, move |_| async move {
                crate::cluster::alter_partition(&topic, index, request)
                    .await
                    .map_err(|e| e.to_string())
            })
            .await;
        let partition = core.shard.local(&tp);
        with_role(&tp, |role| {
            let Some(Role::Leader(l)) = role else {
                return;
            };
            match result {
                Ok(Ok((isr, partition_epoch))) => {
                    match l.state.on_isr_committed(isr, partition_epoch) {
                        Ok(Some(hw)) => {
                            if let Some(p) = &partition {
                                publish(l, p, hw);
                            }
                        }
                        Ok(None) => {}
                        Err(e) => {
                            tracing::warn!(partition = %tp, error = %e, "committed ISR not applied")
                        }
                    }
                }
                Ok(Err(e)) => {
                    tracing::warn!(partition = %tp, error = %e, "ISR change refused");
                    if let Some(hw) = l.state.on_isr_change_failed() {
                        if let Some(p) = &partition {
                            publish(l, p, hw);
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(partition = %tp, error = %e, "ISR change not sent");
                    if let Some(hw) = l.state.on_isr_change_failed() {
                        if let Some(p) = &partition {
                            publish(l, p, hw);
                        }
                    }
                }
            }
        });
    })
    .detach();
}

/// Applies a new metadata table to the partitions this core owns: becomes
/// leader or follower where the table says so. Tables apply one at a time,
/// in the order they arrive.
pub async fn apply_table(core: Rc<CoreState>, table: std::sync::Arc<TopicTable>) {
    let lock = APPLYING.with(|l| l.clone());
    let Ok(_guard) = lock.acquire_permit(1).await else {
        return;
    };
    let me = table.node_id;
    let shard = &core.shard;
    // Replicas the controller would refuse in an ISR (KIP-841).
    let ineligible: Vec<i32> = table
        .brokers
        .iter()
        .filter(|b| b.fenced || b.in_controlled_shutdown)
        .map(|b| b.id)
        .collect();
    let mut wanted: HashMap<TopicPartition, ()> = HashMap::new();
    for (name, info) in &table.topics {
        for (index, a) in info.assignment.iter().enumerate() {
            let tp = TopicPartition::new(name.clone(), index as i32);
            if !a.replicas.contains(&me) || shard.table().shard_of(&tp) != shard.id() {
                continue;
            }
            let Some(partition) = shard.local(&tp) else {
                continue;
            };
            wanted.insert(tp.clone(), ());
            if a.leader == me {
                become_leader(&core, &tp, &partition, a, info, &ineligible).await;
            } else if a.leader != NO_LEADER {
                become_follower(&core, &tp, &partition, a.leader, a.leader_epoch).await;
            } else {
                stop_replicating(&tp);
            }
        }
    }
    // Partitions no longer here (deleted topics, reassignments).
    let gone: Vec<TopicPartition> = ROLES.with(|r| {
        r.borrow()
            .keys()
            .filter(|tp| !wanted.contains_key(*tp))
            .cloned()
            .collect()
    });
    for tp in gone {
        stop_replicating(&tp);
    }
}

fn leader_config(core: &CoreState, info: &crate::topics::table::TopicInfo) -> LeaderConfig {
    let config = &core.node.config;
    let min_isr = info
        .configs
        .get("min.insync.replicas")
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(config.min_insync_replicas.max(1) as usize);
    LeaderConfig {
        replica_lag_time_max_ms: config.replica_lag_time_max_ms,
        min_insync_replicas: min_isr,
    }
}

async fn become_leader(
    core: &Rc<CoreState>,
    tp: &TopicPartition,
    partition: &Rc<Partition>,
    a: &crate::topics::table::Assignment,
    info: &crate::topics::table::TopicInfo,
    ineligible: &[i32],
) {
    let current = with_role(tp, |role| match role {
        Some(Role::Leader(l)) => Some((l.state.leader_epoch(), l.state.partition_epoch())),
        _ => None,
    });
    match current {
        Some((epoch, _)) if epoch == a.leader_epoch => {
            // Same leadership: the ISR may have changed (our own AlterPartition
            // coming back, or the controller's fencing).
            with_role(tp, |role| {
                if let Some(Role::Leader(l)) = role {
                    l.state.set_ineligible(ineligible.to_vec());
                    if a.replicas != l.replicas {
                        // A reassignment added replicas (one that removes
                        // any comes with a new leader epoch).
                        l.state.set_replicas(a.replicas.clone(), now_ms());
                        l.replicas = a.replicas.clone();
                        if !l.replicated && a.replicas.len() > 1 {
                            l.replicated = true;
                            partition.set_replicated_high_watermark(Some(l.state.high_watermark()));
                        }
                        tracing::info!(partition = %tp, replicas = ?a.replicas, adding = ?a.adding, "replicas changed");
                    }
                    if a.partition_epoch > l.state.partition_epoch() {
                        match l.state.on_isr_committed(a.isr.clone(), a.partition_epoch) {
                            Ok(Some(hw)) => publish(l, partition, hw),
                            Ok(None) => {}
                            Err(e) => {
                                tracing::warn!(partition = %tp, error = %e, "metadata ISR not applied")
                            }
                        }
                    }
                }
            });
            return;
        }
        _ => {}
    }
    fetcher::remove(tp);
    // A new leadership: what the log holds is the truth from here on; the
    // epoch starts at the log end (in the epoch cache before any record, so
    // followers' divergence checks see where older epochs end here); the
    // high watermark starts where this replica knew it to be.
    let epoch_start = match partition.assign_leader_epoch(a.leader_epoch).await {
        Ok(offset) => offset,
        Err(e) => {
            // The log is offline: it cannot lead. Metadata answers it as
            // unavailable (offline_partitions); nothing is appended to it.
            tracing::error!(partition = %tp, leader_epoch = a.leader_epoch, error = %e, "cannot start the leader epoch");
            partition.log_end()
        }
    };
    let log_end = partition.durable_end();
    let start = partition.log_start_offset().await.unwrap_or(0);
    let hw = match partition
        .replicated_high_watermark()
        .or(partition.checkpointed_high_watermark())
    {
        Some(hw) => hw,
        None if a.isr.len() == 1 => log_end,
        None => start,
    };
    let mut state = LeaderReplica::new(
        core.node.config.node_id,
        a.replicas.clone(),
        a.isr.clone(),
        a.leader_epoch,
        a.partition_epoch,
        log_end,
        hw.clamp(start, log_end),
        now_ms(),
        leader_config(core, info),
    )
    .with_epoch_start_offset(epoch_start);
    state.set_ineligible(ineligible.to_vec());
    // Recomputed at once: an ISR of this replica alone has its end as the
    // high watermark; a larger one waits for the followers' fetches.
    state.on_local_durable(log_end);
    let replicated = a.replicas.len() > 1;
    partition.set_replicated_high_watermark(replicated.then(|| state.high_watermark()));
    // Producer state is rebuilt from the log the first time it is needed.
    core.forget_partition(tp);
    // This node leading on at a new epoch (a reassignment dropped a
    // replica): its log is unchanged, so acks=all writes still waiting carry
    // over and complete once the new ISR holds them, as Kafka's do. After
    // any other role, the waiters of an older leadership were answered
    // when it ended.
    let carried = ROLES.with(|r| match r.borrow_mut().remove(tp) {
        Some(Role::Leader(mut l)) => Some(std::mem::replace(
            &mut l.waiters,
            AckWaiters::new(ACK_WAITERS_MAX),
        )),
        _ => None,
    });
    let hw = state.high_watermark();
    let mut leader = Box::new(Leader {
        state,
        replicated,
        waiters: carried.unwrap_or_else(|| AckWaiters::new(ACK_WAITERS_MAX)),
        replicas: a.replicas.clone(),
        corrupt_reported: false,
    });
    publish(&mut leader, partition, hw);
    ROLES.with(|r| r.borrow_mut().insert(tp.clone(), Role::Leader(leader)));
    COUNTERS.with(|c| bump(&c.leaderships, 1));
    tracing::info!(partition = %tp, leader_epoch = a.leader_epoch, isr = ?a.isr, "leading");
    announce(
        tp,
        RoleChange::Leading {
            leader_epoch: a.leader_epoch,
        },
    );
}

/// A read found this replica's log corrupt (the engine logged where, and the
/// log is offline). The heartbeat reports it offline, the controller moves
/// the leadership to another in-sync replica, and `become_follower` repairs
/// the log from there. Without another in-sync replica nothing can: the
/// partition stays offline, said once per leadership.
pub fn corrupt_read(tp: &TopicPartition) {
    with_role(tp, |role| {
        if let Some(Role::Leader(l)) = role {
            if l.state.isr().len() <= 1 && !l.corrupt_reported {
                l.corrupt_reported = true;
                tracing::error!(
                    partition = %tp, isr = ?l.state.isr(), replicas = ?l.replicas,
                    "this replica's log is corrupt and no other replica is in sync: the partition \
                     stays offline (nothing is cut that no one else holds)"
                );
            }
        }
    })
}

/// Repairs a log offline for a corrupt batch read from disk, now that
/// another replica leads: the log is cut before the bad batch and the
/// follower fetches the rest from the leader like any missing tail. True
/// when it was repaired.
async fn repair_if_corrupt(tp: &TopicPartition, partition: &Partition, leader: i32) -> bool {
    // A shared look first: every table passes here for every followed
    // partition, and the repair takes the log's write lock.
    if !matches!(partition.corruption().await, Ok(Some(_))) {
        return false;
    }
    match partition.repair_corruption().await {
        Ok(Some(log_end_offset)) => {
            tracing::warn!(
                partition = %tp, leader, log_end_offset,
                "repaired the corrupt log: cut before the bad batch; the rest is fetched from the leader"
            );
            true
        }
        Ok(None) => false,
        Err(e) => {
            tracing::error!(partition = %tp, error = %e, "cannot repair the corrupt log: it stays offline");
            false
        }
    }
}

async fn become_follower(
    core: &Rc<CoreState>,
    tp: &TopicPartition,
    partition: &Rc<Partition>,
    leader: i32,
    leader_epoch: i32,
) {
    let same = with_role(
        tp,
        |role| matches!(role, Some(Role::Follower(f)) if f.leader == leader && f.leader_epoch == leader_epoch),
    );
    // Before `same`: a follower's log found corrupt is repaired at the next
    // table (its ISR place removed), and its fetcher starts over below.
    let repaired = repair_if_corrupt(tp, partition, leader).await;
    if same && !repaired {
        return;
    }
    // Until the leader says otherwise, consumers of this replica (none: only
    // the leader serves) and the next leadership start from what is known.
    if partition.replicated_high_watermark().is_none() {
        let start = partition.log_start_offset().await.unwrap_or(0);
        let hw = partition.checkpointed_high_watermark().unwrap_or(start);
        partition.set_replicated_high_watermark(Some(hw));
    }
    // An offline log (failed write or fdatasync, or corrupt and not
    // repaired) cannot follow: its heartbeat reports it, and the controller
    // takes it out of the ISR.
    if matches!(partition.offline_reason().await, Ok(Some(_)) | Err(_)) {
        stop_replicating(tp);
        return;
    }
    // Produces admitted while this node led an older epoch must not land
    // in the log now that another node leads (they get NOT_LEADER).
    let fenced = partition.fence_leader_appends(leader_epoch + 1).await;
    let log = match fenced.and(fetcher::local_log(partition).await) {
        Ok(log) => log,
        Err(e) => {
            tracing::error!(partition = %tp, error = %e, "cannot follow: the log cannot be read");
            stop_replicating(tp);
            return;
        }
    };
    core.forget_partition(tp);
    ROLES.with(|r| {
        r.borrow_mut().insert(
            tp.clone(),
            Role::Follower(Follower {
                leader,
                leader_epoch,
            }),
        )
    });
    fetcher::add(core, tp.clone(), leader, leader_epoch, log);
    announce(tp, RoleChange::NotLeading);
    tracing::info!(partition = %tp, leader, leader_epoch, "following");
}

fn stop_replicating(tp: &TopicPartition) {
    fetcher::remove(tp);
    ROLES.with(|r| r.borrow_mut().remove(tp));
    announce(tp, RoleChange::NotLeading);
}

/// Leaders drop followers that fell behind from the ISR (per core, forever).
pub fn start_shrink_timer(core: Rc<CoreState>) {
    glommio::spawn_local(async move {
        loop {
            let asleep = std::time::Instant::now();
            glommio::timer::sleep(SHRINK_INTERVAL).await;
            if core.stopping.get() {
                return;
            }
            let now = now_ms();
            // Woken late: this core stood still, and its followers' fetches
            // waited unread; that time is not theirs (excuse_stall).
            let late = asleep.elapsed().saturating_sub(SHRINK_INTERVAL);
            let stalled_ms = (late > SHRINK_INTERVAL)
                .then(|| u64::try_from(late.as_millis()).unwrap_or(u64::MAX));
            let changes: Vec<(TopicPartition, IsrChange)> = ROLES.with(|r| {
                r.borrow_mut()
                    .iter_mut()
                    .filter_map(|(tp, role)| match role {
                        Role::Leader(l) => {
                            if let Some(ms) = stalled_ms {
                                l.state.excuse_stall(ms, now);
                            }
                            l.state.maybe_shrink(now).map(|c| (tp.clone(), c))
                        }
                        Role::Follower(_) => None,
                    })
                    .collect()
            });
            if let Some(ms) = stalled_ms {
                tracing::info!(stalled_ms = ms, "this core stood still: its followers' lag times excused");
            }
            for (tp, change) in changes {
                COUNTERS.with(|c| bump(&c.isr_shrinks, 1));
                tracing::warn!(partition = %tp, isr = ?change.new_isr, "a follower fell behind: shrinking the ISR");
                send_alter(core.clone(), tp, change);
            }
        }
    })
    .detach();
}

/// For metrics and describe: (partition, leader epoch, ISR size, replicas)
/// of what this core leads.
pub fn led_partitions() -> Vec<(TopicPartition, i32, usize, usize)> {
    ROLES.with(|r| {
        r.borrow()
            .iter()
            .filter_map(|(tp, role)| match role {
                Role::Leader(l) => Some((
                    tp.clone(),
                    l.state.leader_epoch(),
                    l.state.isr().len(),
                    l.replicas.len(),
                )),
                Role::Follower(_) => None,
            })
            .collect()
    })
}

/// The replicated partitions this core leads whose other in-sync replicas
/// all fetched and caught up within `within` (`LeaderReplica::followed_within`):
/// what the lease watchdog (cluster.rs) keeps leading while no controller
/// acknowledges this node's heartbeats.
pub fn followed_leaderships(within: Duration) -> Vec<TopicPartition> {
    let now = now_ms();
    let within_ms = u64::try_from(within.as_millis()).unwrap_or(u64::MAX);
    ROLES.with(|r| {
        r.borrow()
            .iter()
            .filter_map(|(tp, role)| match role {
                Role::Leader(l) if l.replicated && l.state.followed_within(now, within_ms) => {
                    Some(tp.clone())
                }
                _ => None,
            })
            .collect()
    })
}
