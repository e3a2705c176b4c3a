//! The transaction coordinator's rules (Kafka's `TransactionCoordinator` and
//! `TransactionMetadata`), sans I/O.
//!
//! One [`TxnCoordinator`] holds the transactional ids of the
//! `__transaction_state` partitions its node leads. Every change goes
//! through the log first:
//!
//! ```text
//! request ──> TxnCoordinator::{init_producer_id, add_partitions, end_txn}
//!             -> Outcome { reply, transition }
//!                transition: a TxnRecord to append to __transaction_state;
//!                the id is busy (CONCURRENT_TRANSACTIONS) until
//!   driver appends it ──> complete(id) (durable: it becomes the state, the
//!                         reply goes out) | fail(id) (the reply is the
//!                         write's error; the state is as before)
//! end_txn -> PrepareCommit/PrepareAbort, durable -> the driver writes the
//!   COMMIT/ABORT markers to every partition of the transaction (as the
//!   producer id at the record's epoch) -> markers_written(id) ->
//!   CompleteCommit/CompleteAbort
//! expired(now) -> an ongoing transaction past its timeout: its epoch bumped
//!   (the producer is fenced) and PrepareAbort, then markers as above
//! load(records) after a leadership move: the last record per id is its
//!   state; ids left in PrepareCommit/PrepareAbort get their markers again
//! ```
//!
//! States and the moves between them are Kafka's
//! ([`TxnState::may_follow`]); a transition that breaks them is a bug, and is
//! refused as [`TxnError::IllegalState`] rather than applied.

pub mod records;

use std::collections::{BTreeMap, BTreeSet};

pub type ProducerId = i64;
pub type Epoch = i16;

/// No producer id or epoch yet (Kafka's -1).
pub const NO_PRODUCER_ID: ProducerId = -1;
pub const NO_EPOCH: Epoch = -1;
/// From this epoch on a producer id is spent: the next InitProducerId gets a
/// new id at epoch 0 (Kafka's `Short.MaxValue - 1`).
pub const EPOCH_EXHAUSTED: Epoch = i16::MAX - 1;

/// Kafka's `TransactionState`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TxnState {
    /// No transaction running (after InitProducerId or a completed one).
    Empty,
    /// Partitions added: records may be written.
    Ongoing,
    PrepareCommit,
    PrepareAbort,
    CompleteCommit,
    CompleteAbort,
    /// The id expired and is being removed.
    Dead,
    /// An ongoing transaction's producer is being fenced: its epoch is
    /// bumped and the transaction aborted.
    PrepareEpochFence,
}

impl TxnState {
    /// Whether a transaction may move to `self` from `from` (Kafka's
    /// `validPreviousStates`).
    pub fn may_follow(self, from: TxnState) -> bool {
        use TxnState::*;
        match self {
            Empty => matches!(from, Empty | CompleteCommit | CompleteAbort),
            Ongoing => matches!(from, Ongoing | Empty | CompleteCommit | CompleteAbort),
            PrepareCommit => from == Ongoing,
            PrepareAbort => matches!(from, Ongoing | PrepareEpochFence),
            CompleteCommit => from == PrepareCommit,
            CompleteAbort => from == PrepareAbort,
            Dead => matches!(from, Empty | CompleteCommit | CompleteAbort),
            PrepareEpochFence => from == Ongoing,
        }
    }

    /// Kafka's name (DescribeTransactions, ListTransactions).
    pub fn name(self) -> &'static str {
        use TxnState::*;
        match self {
            Empty => "Empty",
            Ongoing => "Ongoing",
            PrepareCommit => "PrepareCommit",
            PrepareAbort => "PrepareAbort",
            CompleteCommit => "CompleteCommit",
            CompleteAbort => "CompleteAbort",
            Dead => "Dead",
            PrepareEpochFence => "PrepareEpochFence",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TopicPartition {
    pub topic: String,
    pub partition: i32,
}

/// What `__transaction_state` holds for one transactional id (Kafka's
/// `TransactionLogValue`, with the previous producer id and epoch KIP-360
/// recovery checks against).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnRecord {
    pub producer_id: ProducerId,
    /// The id before an epoch exhaustion moved the transactional id to a new
    /// one (`NO_PRODUCER_ID` if none).
    pub previous_producer_id: ProducerId,
    pub producer_epoch: Epoch,
    /// The epoch before the last bump (a retried InitProducerId or EndTxn
    /// from the producer that caused it is recognised by it).
    pub last_producer_epoch: Epoch,
    pub timeout_ms: i32,
    pub state: TxnState,
    pub partitions: BTreeSet<TopicPartition>,
    /// When the running transaction began (-1: none).
    pub start_ms: i64,
    pub update_ms: i64,
}

/// Errors a client gets, with Kafka's codes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TxnError {
    #[error("another operation on this transactional id is in progress; retry")]
    ConcurrentTransactions,
    #[error("the producer id is not the one assigned to this transactional id")]
    InvalidProducerIdMapping,
    #[error("a newer producer with this transactional id fenced this one")]
    ProducerFenced,
    #[error("the transaction is not in a state that allows this")]
    InvalidTxnState,
    #[error("transaction.timeout.ms {0} is not between 1 and transaction.max.timeout.ms")]
    InvalidTransactionTimeout(i32),
    #[error("no transactional id {0:?} here")]
    TransactionalIdNotFound(String),
    #[error("illegal transaction state: {0}")]
    IllegalState(String),
}

impl TxnError {
    /// Kafka's error code.
    pub fn code(&self) -> i16 {
        match self {
            TxnError::ConcurrentTransactions => 51,
            TxnError::InvalidProducerIdMapping => 49,
            TxnError::ProducerFenced => 90,
            TxnError::InvalidTxnState => 48,
            TxnError::InvalidTransactionTimeout(_) => 50,
            TxnError::TransactionalIdNotFound(_) => 105,
            // UNKNOWN_SERVER_ERROR: a broken invariant, never the client's doing.
            TxnError::IllegalState(_) => -1,
        }
    }
}

/// What the client is told once the transition (if any) is durable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    ProducerIdAndEpoch(ProducerId, Epoch),
    Ok,
}

/// A record to append to `__transaction_state` for `id`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition {
    pub id: String,
    pub record: TxnRecord,
}

/// An answer to a request: the reply, and the transition to make durable
/// before it is sent (none: answer at once).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub reply: Result<Reply, TxnError>,
    pub transition: Option<Transition>,
}

impl Outcome {
    fn error(e: TxnError) -> Outcome {
        Outcome {
            reply: Err(e),
            transition: None,
        }
    }
}

/// The markers a decided transaction needs: `result` (commit or abort)
/// written to every partition as `producer_id` at `epoch`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Markers {
    pub id: String,
    pub producer_id: ProducerId,
    pub epoch: Epoch,
    pub commit: bool,
    pub partitions: BTreeSet<TopicPartition>,
}

#[derive(Debug, Clone)]
struct Entry {
    current: TxnRecord,
    /// A transition written but not yet durable.
    pending: Option<TxnRecord>,
}

/// Limits from the broker's settings.
#[derive(Debug, Clone, Copy)]
pub struct TxnConfig {
    /// `transaction.max.timeout.ms`.
    pub max_timeout_ms: i32,
}

impl Default for TxnConfig {
    fn default() -> Self {
        TxnConfig {
            max_timeout_ms: 900_000,
        }
    }
}

/// The transactional ids of the partitions this coordinator leads.
#[derive(Debug, Default)]
pub struct TxnCoordinator {
    config: TxnConfig,
    ids: BTreeMap<String, Entry>,
}

impl TxnCoordinator {
    pub fn new(config: TxnConfig) -> TxnCoordinator {
        TxnCoordinator {
            config,
            ids: BTreeMap::new(),
        }
    }

    /// The durable state of `id` (None: unknown, or its first
    /// InitProducerId is still being written).
    pub fn get(&self, id: &str) -> Option<&TxnRecord> {
        self.ids
            .get(id)
            .map(|e| &e.current)
            .filter(|r| r.producer_id != NO_PRODUCER_ID)
    }

    /// Every transactional id with a durable state.
    pub fn ids(&self) -> impl Iterator<Item = (&str, &TxnRecord)> {
        self.ids
            .iter()
            .map(|(id, e)| (id.as_str(), &e.current))
            .filter(|(_, r)| r.producer_id != NO_PRODUCER_ID)
    }

    /// Rebuilds the state from `__transaction_state` (its records in log
    /// order) after this node became the coordinator; returns the markers of
    /// transactions decided but not completed, to write again.
    pub fn load(&mut self, records: impl IntoIterator<Item = (String, TxnRecord)>) -> Vec<Markers> {
        self.ids.clear();
        for (id, record) in records {
            self.ids.insert(
                id,
                Entry {
                    current: record,
                    pending: None,
                },
            );
        }
        self.ids
            .iter()
            .filter_map(|(id, e)| markers_of(id, &e.current))
            .collect()
    }

    /// InitProducerId with a transactional id. `allocate` hands out a new
    /// producer id (a first InitProducerId, or an exhausted epoch).
    /// `expected`: KIP-360's producer id and epoch of a producer recovering
    /// from an error.
    pub fn init_producer_id(
        &mut self,
        id: &str,
        timeout_ms: i32,
        expected: Option<(ProducerId, Epoch)>,
        now_ms: i64,
        allocate: &mut dyn FnMut() -> ProducerId,
    ) -> Outcome {
        if timeout_ms <= 0 || timeout_ms > self.config.max_timeout_ms {
            return Outcome::error(TxnError::InvalidTransactionTimeout(timeout_ms));
        }
        let Some(entry) = self.ids.get(id) else {
            // A new transactional id: a new producer at epoch 0.
            let record = TxnRecord {
                producer_id: allocate(),
                previous_producer_id: NO_PRODUCER_ID,
                producer_epoch: 0,
                last_producer_epoch: NO_EPOCH,
                timeout_ms,
                state: TxnState::Empty,
                partitions: BTreeSet::new(),
                start_ms: -1,
                update_ms: now_ms,
            };
            return self.propose(id, None, record, |r| {
                Reply::ProducerIdAndEpoch(r.producer_id, r.producer_epoch)
            });
        };
        if entry.pending.is_some() {
            return Outcome::error(TxnError::ConcurrentTransactions);
        }
        let current = entry.current.clone();
        if let Some((pid, epoch)) = expected {
            let known_id = pid == current.producer_id || pid == current.previous_producer_id;
            let known_epoch =
                epoch == current.producer_epoch || epoch == current.last_producer_epoch;
            if !(known_id && known_epoch) {
                return Outcome::error(TxnError::ProducerFenced);
            }
            // A retry of the InitProducerId that made the current epoch.
            if pid == current.previous_producer_id
                || (epoch == current.last_producer_epoch && current.state == TxnState::Empty)
            {
                return Outcome {
                    reply: Ok(Reply::ProducerIdAndEpoch(
                        current.producer_id,
                        current.producer_epoch,
                    )),
                    transition: None,
                };
            }
        }
        match current.state {
            TxnState::PrepareCommit | TxnState::PrepareAbort => {
                // Its markers are being written: the producer retries.
                Outcome::error(TxnError::ConcurrentTransactions)
            }
            TxnState::Empty | TxnState::CompleteCommit | TxnState::CompleteAbort => {
                let mut record = bumped(&current, allocate);
                record.timeout_ms = timeout_ms;
                record.state = TxnState::Empty;
                record.partitions.clear();
                record.start_ms = -1;
                record.update_ms = now_ms;
                self.propose(id, Some(&current), record, |r| {
                    Reply::ProducerIdAndEpoch(r.producer_id, r.producer_epoch)
                })
            }
            TxnState::Ongoing => {
                // A new producer while a transaction runs: the old one is
                // fenced (epoch bumped) and its transaction aborted; the new
                // one retries and gets its epoch once that is done.
                let outcome = self.fence_and_abort(id, now_ms);
                Outcome {
                    reply: Err(TxnError::ConcurrentTransactions),
                    transition: outcome.transition,
                }
            }
            TxnState::Dead | TxnState::PrepareEpochFence => Outcome::error(TxnError::IllegalState(
                format!("{id} is {} at InitProducerId", current.state.name()),
            )),
        }
    }

    /// AddPartitionsToTxn (and AddOffsetsToTxn, with the group's offsets
    /// partition).
    pub fn add_partitions(
        &mut self,
        id: &str,
        producer_id: ProducerId,
        epoch: Epoch,
        partitions: &[TopicPartition],
        now_ms: i64,
    ) -> Outcome {
        let current = match self.checked(id, producer_id, epoch) {
            Ok(c) => c,
            Err(e) => return Outcome::error(e),
        };
        match current.state {
            TxnState::PrepareCommit | TxnState::PrepareAbort => {
                Outcome::error(TxnError::ConcurrentTransactions)
            }
            TxnState::Ongoing if partitions.iter().all(|p| current.partitions.contains(p)) => {
                Outcome {
                    reply: Ok(Reply::Ok),
                    transition: None,
                }
            }
            TxnState::Empty
            | TxnState::Ongoing
            | TxnState::CompleteCommit
            | TxnState::CompleteAbort => {
                let mut record = current.clone();
                if current.state != TxnState::Ongoing {
                    record.partitions.clear();
                    record.start_ms = now_ms;
                }
                record.partitions.extend(partitions.iter().cloned());
                record.state = TxnState::Ongoing;
                record.update_ms = now_ms;
                self.propose(id, Some(&current), record, |_| Reply::Ok)
            }
            TxnState::Dead | TxnState::PrepareEpochFence => Outcome::error(TxnError::IllegalState(
                format!("{id} is {} at AddPartitionsToTxn", current.state.name()),
            )),
        }
    }

    /// EndTxn: commit or abort. Once the PrepareCommit/PrepareAbort record
    /// is durable the driver writes the markers ([`Self::markers`]) and
    /// reports them with [`Self::markers_written`].
    pub fn end_txn(
        &mut self,
        id: &str,
        producer_id: ProducerId,
        epoch: Epoch,
        commit: bool,
        now_ms: i64,
    ) -> Outcome {
        let current = match self.checked(id, producer_id, epoch) {
            Ok(c) => c,
            Err(e) => return Outcome::error(e),
        };
        let ok = Outcome {
            reply: Ok(Reply::Ok),
            transition: None,
        };
        match (current.state, commit) {
            (TxnState::Ongoing, _) => {
                let mut record = current.clone();
                record.state = if commit {
                    TxnState::PrepareCommit
                } else {
                    TxnState::PrepareAbort
                };
                record.update_ms = now_ms;
                self.propose(id, Some(&current), record, |_| Reply::Ok)
            }
            // A retry of the decision already made.
            (TxnState::CompleteCommit, true) | (TxnState::CompleteAbort, false) => ok,
            (TxnState::PrepareCommit, true) | (TxnState::PrepareAbort, false) => {
                Outcome::error(TxnError::ConcurrentTransactions)
            }
            (
                TxnState::CompleteCommit
                | TxnState::CompleteAbort
                | TxnState::PrepareCommit
                | TxnState::PrepareAbort
                | TxnState::Empty,
                _,
            ) => Outcome::error(TxnError::InvalidTxnState),
            (TxnState::Dead | TxnState::PrepareEpochFence, _) => Outcome::error(
                TxnError::IllegalState(format!("{id} is {} at EndTxn", current.state.name())),
            ),
        }
    }

    /// KIP-890 part 1: whether a partition leader may take a transactional
    /// write of `producer_id` at `epoch` to `partition` that opens a
    /// transaction there: only if the id's ongoing transaction (at that
    /// producer and epoch) holds the partition. A write that arrives after
    /// its transaction ended (a retry stuck in the network, a zombie) is
    /// refused instead of opening a transaction no marker would ever end.
    /// A read: nothing is written.
    pub fn verify(
        &self,
        id: &str,
        producer_id: ProducerId,
        epoch: Epoch,
        partition: &TopicPartition,
    ) -> Result<(), TxnError> {
        let entry = self.ids.get(id).ok_or(TxnError::InvalidProducerIdMapping)?;
        let current = &entry.current;
        if current.producer_id != producer_id {
            return Err(TxnError::InvalidProducerIdMapping);
        }
        if current.producer_epoch != epoch {
            return Err(TxnError::ProducerFenced);
        }
        if current.state == TxnState::Ongoing && current.partitions.contains(partition) {
            Ok(())
        } else {
            Err(TxnError::InvalidTxnState)
        }
    }

    /// The markers `id`'s decided transaction needs (None: not decided).
    pub fn markers(&self, id: &str) -> Option<Markers> {
        markers_of(id, &self.ids.get(id)?.current)
    }

    /// Every marker of `id`'s decision is written: the transaction completes.
    pub fn markers_written(&mut self, id: &str, now_ms: i64) -> Option<Transition> {
        let entry = self.ids.get(id)?;
        if entry.pending.is_some() {
            return None;
        }
        let current = entry.current.clone();
        let state = match current.state {
            TxnState::PrepareCommit => TxnState::CompleteCommit,
            TxnState::PrepareAbort => TxnState::CompleteAbort,
            _ => return None,
        };
        let mut record = current.clone();
        record.state = state;
        record.partitions.clear();
        record.start_ms = -1;
        record.update_ms = now_ms;
        self.propose(id, Some(&current), record, |_| Reply::Ok)
            .transition
    }

    /// Ongoing transactions past their timeout at `now_ms`, fenced and
    /// aborted (one transition each; ids with a write in progress wait).
    pub fn expired(&mut self, now_ms: i64) -> Vec<Transition> {
        let due: Vec<String> = self
            .ids
            .iter()
            .filter(|(_, e)| {
                e.pending.is_none()
                    && e.current.state == TxnState::Ongoing
                    && e.current.start_ms + i64::from(e.current.timeout_ms) < now_ms
            })
            .map(|(id, _)| id.clone())
            .collect();
        due.into_iter()
            .filter_map(|id| self.fence_and_abort(&id, now_ms).transition)
            .collect()
    }

    /// `id`'s pending transition is durable: it is the state now.
    pub fn complete(&mut self, id: &str) -> Result<&TxnRecord, TxnError> {
        let entry = self
            .ids
            .get_mut(id)
            .ok_or_else(|| TxnError::TransactionalIdNotFound(id.to_string()))?;
        let pending = entry
            .pending
            .take()
            .ok_or_else(|| TxnError::IllegalState(format!("{id}: no write in progress")))?;
        entry.current = pending;
        Ok(&entry.current)
    }

    /// `id`'s pending transition could not be written: the state stays.
    pub fn fail(&mut self, id: &str) {
        let Some(entry) = self.ids.get_mut(id) else {
            return;
        };
        entry.pending = None;
        // A first InitProducerId that failed leaves nothing behind.
        if entry.current.producer_id == NO_PRODUCER_ID {
            self.ids.remove(id);
        }
    }

    /// The id's durable state, checked against a request's producer id and
    /// epoch, with no write in progress.
    fn checked(
        &self,
        id: &str,
        producer_id: ProducerId,
        epoch: Epoch,
    ) -> Result<TxnRecord, TxnError> {
        let entry = self.ids.get(id).ok_or(TxnError::InvalidProducerIdMapping)?;
        let current = &entry.current;
        if current.producer_id != producer_id {
            return Err(TxnError::InvalidProducerIdMapping);
        }
        if current.producer_epoch != epoch {
            return Err(TxnError::ProducerFenced);
        }
        if entry.pending.is_some() {
            return Err(TxnError::ConcurrentTransactions);
        }
        Ok(current.clone())
    }

    /// The producer of `id`'s ongoing transaction is fenced (epoch bumped)
    /// and the transaction goes to PrepareAbort.
    fn fence_and_abort(&mut self, id: &str, now_ms: i64) -> Outcome {
        let Some(current) = self.ids.get(id).map(|e| e.current.clone()) else {
            return Outcome::error(TxnError::TransactionalIdNotFound(id.to_string()));
        };
        let mut record = current.clone();
        // Up to the last epoch there is (an id past EPOCH_EXHAUSTED moves to
        // a new producer id at its next InitProducerId).
        if current.producer_epoch < i16::MAX {
            record.last_producer_epoch = current.producer_epoch;
            record.producer_epoch = current.producer_epoch + 1;
        }
        record.state = TxnState::PrepareAbort;
        record.update_ms = now_ms;
        self.propose(id, Some(&current), record, |_| Reply::Ok)
    }

    /// Records `record` as `id`'s pending transition if the move is legal.
    fn propose(
        &mut self,
        id: &str,
        current: Option<&TxnRecord>,
        record: TxnRecord,
        reply: impl FnOnce(&TxnRecord) -> Reply,
    ) -> Outcome {
        if let Some(current) = current {
            if !record.state.may_follow(current.state) {
                return Outcome::error(TxnError::IllegalState(format!(
                    "{id}: {} may not follow {}",
                    record.state.name(),
                    current.state.name()
                )));
            }
        }
        let entry = self.ids.entry(id.to_string()).or_insert_with(|| Entry {
            current: TxnRecord {
                producer_id: NO_PRODUCER_ID,
                previous_producer_id: NO_PRODUCER_ID,
                producer_epoch: NO_EPOCH,
                last_producer_epoch: NO_EPOCH,
                timeout_ms: record.timeout_ms,
                state: TxnState::Empty,
                partitions: BTreeSet::new(),
                start_ms: -1,
                update_ms: record.update_ms,
            },
            pending: None,
        });
        entry.pending = Some(record.clone());
        Outcome {
            reply: Ok(reply(&record)),
            transition: Some(Transition {
                id: id.to_string(),
                record,
            }),
        }
    }
}

/// The next producer id and epoch of `current`: the epoch bumped, or a new
/// id at epoch 0 when the epoch is spent.
fn bumped(current: &TxnRecord, allocate: &mut dyn FnMut() -> ProducerId) -> TxnRecord {
    let mut record = current.clone();
    if current.producer_epoch >= EPOCH_EXHAUSTED {
        record.previous_producer_id = current.producer_id;
        record.producer_id = allocate();
        // The old id's last epoch, so its producer's KIP-360 retry is known.
        record.last_producer_epoch = current.producer_epoch;
        record.producer_epoch = 0;
    } else {
        record.last_producer_epoch = current.producer_epoch;
        record.producer_epoch = current.producer_epoch + 1;
    }
    record
}

fn markers_of(id: &str, record: &TxnRecord) -> Option<Markers> {
    let commit = match record.state {
        TxnState::PrepareCommit => true,
        TxnState::PrepareAbort => false,
        _ => return None,
    };
    Some(Markers {
        id: id.to_string(),
        producer_id: record.producer_id,
        epoch: record.producer_epoch,
        commit,
        partitions: record.partitions.clone(),
    })
}

#[cfg(test)]
mod tests;
