//! The transaction coordinator of one core: the transactional ids whose
//! `__transaction_state` partition this core owns and leads, and the writes
//! of their states to that partition.
//!
//! ```text
//! InitProducerId(transactional id) -> handlers/init_producer_id.rs
//!   -> init_producer_id: invoke_on the owner core of the id's partition
//!   -> TxnCoordinator::init_producer_id (the rules) -> Outcome
//!   -> its transition's record appended as the partition's leader, acks=all
//!      (internal::append) -> complete | fail -> the reply
//! AddPartitionsToTxn / AddOffsetsToTxn / EndTxn -> handlers/txn.rs
//!   -> add_partitions / end_txn: the same path (`decide`)
//! a transition that leaves the id PrepareCommit/PrepareAbort (EndTxn, an
//!   expiry, a fenced producer) -> markers.rs writes the markers to every
//!   partition (its coordinator epoch: this partition's leader epoch) ->
//!   markers_written -> CompleteCommit/CompleteAbort appended
//! every `transaction.abort.timed.out.transaction.cleanup.interval.ms`:
//!   expired(now) -> each ongoing transaction past its timeout fenced and
//!   aborted, as above
//! replica role change on a __transaction_state partition (attach):
//!   Leading  -> Loading: every record read (the last per id wins, a
//!               tombstone deletes) -> TxnCoordinator::load -> Ready; the
//!               transactions it finds decided get their markers again
//!   NotLeading -> dropped: its ids answer NOT_COORDINATOR (a marker
//!               writer of the old leadership stops at its next round)
//! ```
//!
//! Leadership is checked at the decision and again once the write is
//! durable: a leadership lost (or taken again) meanwhile answers
//! NOT_COORDINATOR, and the new leader's load holds whatever reached the log.
//! "Taken again" is exact: every load gets a `Term` with a generation of its
//! own, and a task of an earlier load (a write, a marker writer, a
//! completion) stops at its next check even when the partition is led again
//! at the same leader epoch (a node that stepped down on a lapsed lease and
//! came back).

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use std::time::Duration;

use kafka_protocol::ResponseError;
use skiff_coordinator::txn::records::{decode_key, decode_value, encode_key, encode_value};
use skiff_coordinator::txn::{
    Epoch, Markers, Outcome, ProducerId, Reply, Transition, TxnConfig, TxnCoordinator, TxnError,
    TxnRecord, NO_PRODUCER_ID,
};
use skiff_engine::{LogError, Shard, TopicPartition};

use crate::kafka::now_ms;
use crate::replica::RoleChange;
use crate::state::CoreState;

thread_local! {
    static DRIVER: Rc<Driver> = Rc::new(Driver::default());
}

/// How long a write to `__transaction_state` waits for its in-sync replicas
/// (Kafka: `transaction.state.log` writes wait `request.timeout.ms`).
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// One load of a partition's coordinator: the leader epoch it was taken at
/// (the coordinator epoch of its markers) and a generation no other load of
/// this core shares, so that a task of an earlier load at the same leader
/// epoch never acts on this one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Term {
    leader_epoch: i32,
    generation: u64,
}

enum Slot {
    /// The leadership taken at this term; its records are being read.
    Loading { term: Term },
    /// Serving its transactional ids.
    Ready {
        term: Term,
        coordinator: Box<TxnCoordinator>,
    },
}

/// The coordinator of `tp` if it is still the load of `term`: every task of
/// a load checks this before it acts.
fn coordinator_of_term<'a>(
    slots: &'a mut HashMap<TopicPartition, Slot>,
    tp: &TopicPartition,
    term: Term,
) -> Option<&'a mut TxnCoordinator> {
    match slots.get_mut(tp) {
        Some(Slot::Ready {
            coordinator,
            term: t,
        }) if *t == term => Some(coordinator),
        _ => None,
    }
}

/// This core's transaction coordinators, one per `__transaction_state`
/// partition it leads.
#[derive(Default)]
pub struct Driver {
    slots: RefCell<HashMap<TopicPartition, Slot>>,
    config: Cell<TxnConfig>,
    /// The last generation given to a load.
    generation: Cell<u64>,
}

impl Driver {
    pub fn current() -> Rc<Driver> {
        DRIVER.with(Rc::clone)
    }

    fn on_leader(self: &Rc<Self>, core: &Rc<CoreState>, tp: TopicPartition, leader_epoch: i32) {
        if let Some(Slot::Ready { term, .. }) = self.slots.borrow().get(&tp) {
            if term.leader_epoch == leader_epoch {
                return;
            }
        }
        self.generation.set(self.generation.get() + 1);
        let term = Term {
            leader_epoch,
            generation: self.generation.get(),
        };
        self.slots
            .borrow_mut()
            .insert(tp.clone(), Slot::Loading { term });
        let this = self.clone();
        let core = core.clone();
        glommio::spawn_local(async move {
            let started = std::time::Instant::now();
            let loaded = load(&core.shard, &tp).await;
            let mut slots = this.slots.borrow_mut();
            if !matches!(slots.get(&tp), Some(Slot::Loading { term: t }) if *t == term) {
                tracing::info!(partition = %tp, leader_epoch, "discarding a load: leadership changed meanwhile");
                return;
            }
            match loaded {
                Ok(records) => {
                    let count = records.len();
                    let mut coordinator = Box::new(TxnCoordinator::new(this.config.get()));
                    let undecided = coordinator.load(records);
                    slots.insert(tp.clone(), Slot::Ready { term, coordinator });
                    drop(slots);
                    tracing::info!(
                        partition = %tp, leader_epoch, transactional_ids = count,
                        decided = undecided.len(),
                        elapsed_ms = started.elapsed().as_millis() as u64,
                        "loaded transaction states"
                    );
                    // Decided before the move: their markers again.
                    for markers in undecided {
                        spawn_markers(&core, &tp, term, markers);
                    }
                }
                Err(e) => {
                    // Not served: clients get NOT_COORDINATOR and look again.
                    slots.remove(&tp);
                    tracing::error!(partition = %tp, leader_epoch, error = %e, "loading transaction states failed");
                }
            }
        })
        .detach();
    }

    fn on_resign(&self, tp: &TopicPartition) {
        if self.slots.borrow_mut().remove(tp).is_some() {
            tracing::info!(partition = %tp, "no longer the transaction coordinator of its ids");
        }
    }

    /// The transactional ids this core coordinates, with their states (for
    /// tests and, later, DescribeTransactions).
    pub fn states(&self) -> Vec<(String, TxnRecord)> {
        self.slots
            .borrow()
            .values()
            .filter_map(|s| match s {
                Slot::Ready { coordinator, .. } => Some(coordinator),
                Slot::Loading { .. } => None,
            })
            .flat_map(|c| {
                c.ids()
                    .map(|(id, r)| (id.to_string(), r.clone()))
                    .collect::<Vec<_>>()
            })
            .collect()
    }
}

/// Every transactional id's last record in `tp`, in log order of their
/// last write (a tombstone forgets the id).
async fn load(
    shard: &Rc<Shard>,
    tp: &TopicPartition,
) -> Result<Vec<(String, TxnRecord)>, LogError> {
    let mut last: BTreeMap<String, (i64, Option<TxnRecord>)> = BTreeMap::new();
    crate::internal::read_records(shard, tp, |offset, key, value| {
        let Some(key) = key else {
            return;
        };
        let id = match decode_key(key) {
            Ok(id) => id,
            Err(e) => {
                tracing::warn!(partition = %tp, offset, error = %e, "skipping a record whose key does not decode");
                return;
            }
        };
        let record = match value.map(decode_value) {
            None => None,
            Some(Ok(record)) => Some(record),
            Some(Err(e)) => {
                tracing::warn!(partition = %tp, offset, transactional_id = %id, error = %e, "skipping a record whose value does not decode");
                return;
            }
        };
        last.insert(id, (offset, record));
    })
    .await?;
    let mut records: Vec<(i64, String, TxnRecord)> = last
        .into_iter()
        .filter_map(|(id, (offset, record))| record.map(|r| (offset, id, r)))
        .collect();
    records.sort_by_key(|(offset, _, _)| *offset);
    Ok(records.into_iter().map(|(_, id, r)| (id, r)).collect())
}

/// InitProducerId with a transactional id, on any core: the producer id and
/// epoch, once the state that holds them is durable. `expected`: KIP-360's
/// producer id and epoch of a producer recovering from an error.
pub async fn init_producer_id(
    core: &CoreState,
    transactional_id: String,
    timeout_ms: i32,
    expected: Option<(ProducerId, Epoch)>,
) -> Result<(ProducerId, Epoch), ResponseError> {
    let reply = on_owner(core, transactional_id, move |core, id, coordinator| {
        let mut failed = None;
        let mut allocate = || match core.node.producer_ids.lock() {
            Ok(mut ids) => ids.allocate().unwrap_or_else(|e| {
                failed = Some(e.to_string());
                NO_PRODUCER_ID
            }),
            Err(_) => {
                failed = Some("producer id allocator poisoned".into());
                NO_PRODUCER_ID
            }
        };
        let outcome =
            coordinator.init_producer_id(id, timeout_ms, expected, now_ms(), &mut allocate);
        if let Some(e) = failed {
            if outcome.transition.is_some() {
                coordinator.fail(id);
            }
            tracing::error!(transactional_id = %id, error = %e, "allocating a producer id failed");
            return Err(ResponseError::KafkaStorageError);
        }
        Ok(outcome)
    })
    .await?;
    match reply {
        Reply::ProducerIdAndEpoch(pid, epoch) => Ok((pid, epoch)),
        Reply::Ok => Err(ResponseError::UnknownServerError),
    }
}

/// AddPartitionsToTxn (and AddOffsetsToTxn, with the group's
/// `__consumer_offsets` partition): the partitions join the id's ongoing
/// transaction (or start one) once that is durable.
pub async fn add_partitions(
    core: &CoreState,
    transactional_id: String,
    producer_id: ProducerId,
    epoch: Epoch,
    partitions: Vec<TopicPartition>,
) -> Result<(), ResponseError> {
    on_owner(core, transactional_id, move |_, id, coordinator| {
        let partitions: Vec<_> = partitions
            .iter()
            .map(|tp| skiff_coordinator::txn::TopicPartition {
                topic: tp.topic.clone(),
                partition: tp.partition,
            })
            .collect();
        Ok(coordinator.add_partitions(id, producer_id, epoch, &partitions, now_ms()))
    })
    .await
    .map(|_| ())
}

/// EndTxn: the decision is durable when this answers; the markers follow
/// (the next AddPartitionsToTxn of the id waits for them:
/// CONCURRENT_TRANSACTIONS, which clients retry).
pub async fn end_txn(
    core: &CoreState,
    transactional_id: String,
    producer_id: ProducerId,
    epoch: Epoch,
    commit: bool,
) -> Result<(), ResponseError> {
    on_owner(core, transactional_id, move |_, id, coordinator| {
        Ok(coordinator.end_txn(id, producer_id, epoch, commit, now_ms()))
    })
    .await
    .map(|_| ())
}

/// Every transactional id this node coordinates, with its state, from
/// every core (ListTransactions).
pub async fn list_all(core: &CoreState) -> Vec<(String, TxnRecord)> {
    let mut out = Vec::new();
    for target in 0..core.shard.table().shards() {
        if let Ok(states) = core
            .shard
            .invoke_on(target, |_| async { Driver::current().states() })
            .await
        {
            out.extend(states);
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// The state of `transactional_id` where this node coordinates it
/// (DescribeTransactions).
pub async fn describe(
    core: &CoreState,
    transactional_id: String,
) -> Result<TxnRecord, ResponseError> {
    read_on_owner(core, transactional_id, |coordinator, id| {
        coordinator
            .get(id)
            .cloned()
            .ok_or(ResponseError::TransactionalIdNotFound)
    })
    .await
}

/// KIP-890: whether `partition` is in the ongoing transaction of
/// `transactional_id` at `producer_id` and `epoch` (a read of this node's
/// coordinator state, on the core that owns the id).
pub async fn verify_local(
    core: &CoreState,
    transactional_id: String,
    producer_id: ProducerId,
    epoch: Epoch,
    partition: TopicPartition,
) -> Result<(), ResponseError> {
    let partition = skiff_coordinator::txn::TopicPartition {
        topic: partition.topic,
        partition: partition.partition,
    };
    read_on_owner(core, transactional_id, move |coordinator, id| {
        coordinator
            .verify(id, producer_id, epoch, &partition)
            .map_err(|e| reply_error(&e))
    })
    .await
}

/// Reads the coordinator of `transactional_id` on the core that owns it
/// (no transition): NOT_COORDINATOR where this node does not lead its
/// partition, COORDINATOR_LOAD_IN_PROGRESS while it loads.
async fn read_on_owner<T, F>(
    core: &CoreState,
    transactional_id: String,
    read: F,
) -> Result<T, ResponseError>
where
    F: FnOnce(&TxnCoordinator, &str) -> Result<T, ResponseError> + Send + 'static,
    T: Send + 'static,
{
    let Some((tp, owner)) = super::coordinator_of(core, &transactional_id) else {
        return Err(ResponseError::NotCoordinator);
    };
    core.shard
        .invoke_on(owner, move |_| async move {
            let driver = Driver::current();
            let slots = driver.slots.borrow();
            match slots.get(&tp) {
                None => Err(ResponseError::NotCoordinator),
                Some(Slot::Loading { .. }) => Err(ResponseError::CoordinatorLoadInProgress),
                Some(Slot::Ready { coordinator, .. }) => read(coordinator, &transactional_id),
            }
        })
        .await
        .unwrap_or(Err(ResponseError::NotCoordinator))
}

/// Runs `rule` on the coordinator of `transactional_id` (on the core that
/// owns its partition), makes its transition durable, and gives the reply.
async fn on_owner<F>(
    core: &CoreState,
    transactional_id: String,
    rule: F,
) -> Result<Reply, ResponseError>
where
    F: FnOnce(&CoreState, &str, &mut TxnCoordinator) -> Result<Outcome, ResponseError>
        + Send
        + 'static,
{
    let Some((tp, owner)) = super::coordinator_of(core, &transactional_id) else {
        // No __transaction_state yet: FindCoordinator creates it.
        return Err(ResponseError::NotCoordinator);
    };
    core.shard
        .invoke_on(owner, move |_| async move {
            let core = CoreState::current().ok_or(ResponseError::NotCoordinator)?;
            decide(&core, &tp, &transactional_id, |c| {
                rule(&core, &transactional_id, c)
            })
            .await
        })
        .await
        .unwrap_or(Err(ResponseError::NotCoordinator))
}

/// On the owner core of `tp`: the rule's outcome, its transition appended
/// and completed, then its reply.
async fn decide(
    core: &Rc<CoreState>,
    tp: &TopicPartition,
    id: &str,
    rule: impl FnOnce(&mut TxnCoordinator) -> Result<Outcome, ResponseError>,
) -> Result<Reply, ResponseError> {
    let driver = Driver::current();
    let (outcome, term) = {
        let mut slots = driver.slots.borrow_mut();
        match slots.get_mut(tp) {
            None => return Err(ResponseError::NotCoordinator),
            Some(Slot::Loading { .. }) => return Err(ResponseError::CoordinatorLoadInProgress),
            Some(Slot::Ready { coordinator, term }) => (rule(coordinator)?, *term),
        }
    };
    if let Some(transition) = &outcome.transition {
        debug_assert_eq!(transition.id, id);
        write_transition(core, tp, term, transition).await?;
    }
    outcome.reply.map_err(|e| reply_error(&e))
}

/// Appends a transition to `tp` as its coordinator of `term` and makes it
/// the id's state once durable (or drops it if the write failed). A state
/// that needs markers (PrepareCommit, PrepareAbort) gets them written.
async fn write_transition(
    core: &Rc<CoreState>,
    tp: &TopicPartition,
    term: Term,
    transition: &Transition,
) -> Result<(), ResponseError> {
    let id = &transition.id;
    let record = (encode_key(id), Some(encode_value(&transition.record)));
    let written = crate::internal::append(&core.shard, tp, &[record], WRITE_TIMEOUT).await;
    let driver = Driver::current();
    let markers = {
        let mut slots = driver.slots.borrow_mut();
        // Lost or taken again meanwhile: the new load decides.
        let Some(coordinator) = coordinator_of_term(&mut slots, tp, term) else {
            return Err(ResponseError::NotCoordinator);
        };
        match written {
            Ok(_) => {
                coordinator.complete(id).map_err(|e| reply_error(&e))?;
                coordinator.markers(id)
            }
            Err(e) => {
                coordinator.fail(id);
                tracing::warn!(transactional_id = %id, partition = %tp, error = %e, "writing to __transaction_state failed");
                return Err(e.code(ResponseError::UnknownServerError));
            }
        }
    };
    if let Some(markers) = markers {
        spawn_markers(core, tp, term, markers);
    }
    Ok(())
}

/// Whether this core still coordinates `tp`'s ids in the load of `term`.
fn still_leading(tp: &TopicPartition, term: Term) -> bool {
    coordinator_of_term(&mut Driver::current().slots.borrow_mut(), tp, term).is_some()
}

/// Writes a decided transaction's markers, then its completion
/// (CompleteCommit/CompleteAbort), while this core coordinates `tp` in the
/// load of `term`; a new load takes over otherwise.
fn spawn_markers(core: &Rc<CoreState>, tp: &TopicPartition, term: Term, markers: Markers) {
    let core = core.clone();
    let tp = tp.clone();
    glommio::spawn_local(async move {
        let id = markers.id.clone();
        let started = std::time::Instant::now();
        let written = super::markers::write_all(&core, &markers, term.leader_epoch, || {
            still_leading(&tp, term)
        })
        .await;
        if !written {
            tracing::info!(transactional_id = %id, partition = %tp, "markers left to the next coordinator");
            return;
        }
        tracing::debug!(
            transactional_id = %id, commit = markers.commit, partitions = markers.partitions.len(),
            elapsed_ms = started.elapsed().as_millis() as u64, "transaction markers written"
        );
        // The completion, retried while this core still coordinates the id.
        let mut backoff = Duration::from_millis(100);
        loop {
            let transition = {
                let driver = Driver::current();
                let mut slots = driver.slots.borrow_mut();
                match coordinator_of_term(&mut slots, &tp, term) {
                    Some(coordinator) => coordinator.markers_written(&id, now_ms()),
                    None => return,
                }
            };
            let Some(transition) = transition else {
                return;
            };
            match write_transition(&core, &tp, term, &transition).await {
                Ok(()) => return,
                Err(e) => {
                    tracing::warn!(transactional_id = %id, partition = %tp, error = ?e, "completing a transaction failed; retrying");
                    if core.stopping.get() || !still_leading(&tp, term) {
                        return;
                    }
                    glommio::timer::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
            }
        }
    })
    .detach();
}

/// Aborts ongoing transactions past their timeout, on every partition this
/// core coordinates, every `interval` (Kafka's
/// `transaction.abort.timed.out.transaction.cleanup.interval.ms`).
fn start_expiry_timer(core: &Rc<CoreState>, interval: Duration) {
    let core = Rc::downgrade(core);
    glommio::spawn_local(async move {
        loop {
            glommio::timer::sleep(interval).await;
            let Some(core) = core.upgrade() else {
                return;
            };
            if core.stopping.get() {
                return;
            }
            let due: Vec<(TopicPartition, Term, Vec<Transition>)> = {
                let driver = Driver::current();
                let mut slots = driver.slots.borrow_mut();
                slots
                    .iter_mut()
                    .filter_map(|(tp, slot)| match slot {
                        Slot::Ready { coordinator, term } => {
                            Some((tp.clone(), *term, coordinator.expired(now_ms())))
                        }
                        Slot::Loading { .. } => None,
                    })
                    .filter(|(_, _, t)| !t.is_empty())
                    .collect()
            };
            for (tp, term, transitions) in due {
                for transition in transitions {
                    tracing::info!(
                        transactional_id = %transition.id, partition = %tp,
                        "aborting a transaction past its timeout; its producer is fenced"
                    );
                    if let Err(e) = write_transition(&core, &tp, term, &transition).await {
                        tracing::warn!(transactional_id = %transition.id, error = ?e, "aborting an expired transaction failed; the next round tries again");
                    }
                }
            }
        }
    })
    .detach();
}

fn reply_error(e: &TxnError) -> ResponseError {
    if let TxnError::IllegalState(detail) = e {
        tracing::error!(%detail, "transaction coordinator: illegal state");
    }
    ResponseError::try_from_code(e.code()).unwrap_or(ResponseError::UnknownServerError)
}

/// Makes this core's transaction coordinator follow the leadership of the
/// `__transaction_state` partitions the core owns. Once per core, before the
/// core takes any role.
pub fn attach(core: &Rc<CoreState>) {
    Driver::current().config.set(TxnConfig {
        max_timeout_ms: core.node.config.transaction_max_timeout_ms,
    });
    start_expiry_timer(
        core,
        Duration::from_millis(core.node.config.transaction_cleanup_interval_ms.max(10)),
    );
    let core = Rc::downgrade(core);
    crate::replica::on_role_change(move |tp, change| {
        if tp.topic != super::TXN_TOPIC {
            return;
        }
        match change {
            RoleChange::Leading { leader_epoch } => {
                let Some(core) = core.upgrade() else {
                    return;
                };
                Driver::current().on_leader(&core, tp.clone(), leader_epoch);
            }
            RoleChange::NotLeading => Driver::current().on_resign(tp),
        }
    });
}
