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
//! replica role change on a __transaction_state partition (attach):
//!   Leading  -> Loading: every record read (the last per id wins, a
//!               tombstone deletes) -> TxnCoordinator::load -> Ready
//!   NotLeading -> dropped: its ids answer NOT_COORDINATOR
//! ```
//!
//! Leadership is checked at the decision and again once the write is
//! durable: a leadership lost (or taken again) meanwhile answers
//! NOT_COORDINATOR, and the new leader's load holds whatever reached the log.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use std::time::Duration;

use kafka_protocol::ResponseError;
use skiff_coordinator::txn::records::{decode_key, decode_value, encode_key, encode_value};
use skiff_coordinator::txn::{
    Epoch, ProducerId, Reply, TxnConfig, TxnCoordinator, TxnError, TxnRecord, NO_PRODUCER_ID,
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

enum Slot {
    /// The leadership taken at this epoch; its records are being read.
    Loading { leader_epoch: i32 },
    /// Serving its transactional ids.
    Ready {
        leader_epoch: i32,
        coordinator: Box<TxnCoordinator>,
    },
}

/// This core's transaction coordinators, one per `__transaction_state`
/// partition it leads.
#[derive(Default)]
pub struct Driver {
    slots: RefCell<HashMap<TopicPartition, Slot>>,
    config: Cell<TxnConfig>,
}

impl Driver {
    pub fn current() -> Rc<Driver> {
        DRIVER.with(Rc::clone)
    }

    fn on_leader(self: &Rc<Self>, shard: &Rc<Shard>, tp: TopicPartition, leader_epoch: i32) {
        if let Some(Slot::Ready {
            leader_epoch: epoch,
            ..
        }) = self.slots.borrow().get(&tp)
        {
            if *epoch == leader_epoch {
                return;
            }
        }
        self.slots
            .borrow_mut()
            .insert(tp.clone(), Slot::Loading { leader_epoch });
        let this = self.clone();
        let shard = shard.clone();
        glommio::spawn_local(async move {
            let started = std::time::Instant::now();
            let loaded = load(&shard, &tp).await;
            let mut slots = this.slots.borrow_mut();
            if !matches!(slots.get(&tp), Some(Slot::Loading { leader_epoch: e }) if *e == leader_epoch)
            {
                tracing::info!(partition = %tp, leader_epoch, "discarding a load: leadership changed meanwhile");
                return;
            }
            match loaded {
                Ok(records) => {
                    let count = records.len();
                    let mut coordinator = Box::new(TxnCoordinator::new(this.config.get()));
                    let undecided = coordinator.load(records);
                    if !undecided.is_empty() {
                        // Markers are not written yet (issue 18): such a
                        // transaction stays decided, its id busy.
                        tracing::warn!(
                            partition = %tp, transactions = undecided.len(),
                            "transactions decided but not completed: their markers are not written by this version"
                        );
                    }
                    slots.insert(
                        tp.clone(),
                        Slot::Ready {
                            leader_epoch,
                            coordinator,
                        },
                    );
                    tracing::info!(
                        partition = %tp, leader_epoch, transactional_ids = count,
                        elapsed_ms = started.elapsed().as_millis() as u64,
                        "loaded transaction states"
                    );
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
    let Some((tp, owner)) = super::coordinator_of(core, &transactional_id) else {
        // No __transaction_state yet: FindCoordinator creates it.
        return Err(ResponseError::NotCoordinator);
    };
    core.shard
        .invoke_on(owner, move |shard| async move {
            init_local(&shard, &tp, &transactional_id, timeout_ms, expected).await
        })
        .await
        .unwrap_or(Err(ResponseError::NotCoordinator))
}

/// On the owner core of `tp`.
async fn init_local(
    shard: &Rc<Shard>,
    tp: &TopicPartition,
    id: &str,
    timeout_ms: i32,
    expected: Option<(ProducerId, Epoch)>,
) -> Result<(ProducerId, Epoch), ResponseError> {
    let driver = Driver::current();
    let core = CoreState::current().ok_or(ResponseError::NotCoordinator)?;
    let (outcome, leader_epoch) = {
        let mut slots = driver.slots.borrow_mut();
        let (coordinator, leader_epoch) = match slots.get_mut(tp) {
            None => return Err(ResponseError::NotCoordinator),
            Some(Slot::Loading { .. }) => return Err(ResponseError::CoordinatorLoadInProgress),
            Some(Slot::Ready {
                coordinator,
                leader_epoch,
            }) => (coordinator, *leader_epoch),
        };
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
        (outcome, leader_epoch)
    };
    if let Some(transition) = &outcome.transition {
        let record = (
            encode_key(&transition.id),
            Some(encode_value(&transition.record)),
        );
        let written = crate::internal::append(shard, tp, &[record], WRITE_TIMEOUT).await;
        let mut slots = driver.slots.borrow_mut();
        let coordinator = match slots.get_mut(tp) {
            Some(Slot::Ready {
                coordinator,
                leader_epoch: epoch,
            }) if *epoch == leader_epoch => coordinator,
            // Lost or taken again meanwhile: the new load decides.
            _ => return Err(ResponseError::NotCoordinator),
        };
        match written {
            Ok(_) => {
                coordinator.complete(id).map_err(|e| reply_error(&e))?;
            }
            Err(e) => {
                coordinator.fail(id);
                tracing::warn!(transactional_id = %id, partition = %tp, error = %e, "writing to __transaction_state failed");
                return Err(e.code(ResponseError::UnknownServerError));
            }
        }
    }
    match outcome.reply {
        Ok(Reply::ProducerIdAndEpoch(pid, epoch)) => Ok((pid, epoch)),
        Ok(Reply::Ok) => Err(ResponseError::UnknownServerError),
        Err(e) => Err(reply_error(&e)),
    }
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
                Driver::current().on_leader(&core.shard, tp.clone(), leader_epoch);
            }
            RoleChange::NotLeading => Driver::current().on_resign(tp),
        }
    });
}
