//! The producer state of each partition this core owns, kept beside its log:
//! the rules are in [`state`] (sans I/O); this module drives them.
//!
//! - `append_idempotent`: a producer batch is checked against its producer's
//!   sequence and appended under the partition's producer lock, so pipelined
//!   batches of one producer are checked in append order.
//! - `rebuild`: the state is loaded from the latest producer snapshot and the
//!   log after it, the first time it is needed after the partition is opened
//!   or led again.
//! - `snapshot_producers` / `start_snapshot_timer`: snapshots every
//!   checkpoint interval and at a clean stop, so the next load reads little.
//!
//! The produce handler calls in; nothing here calls up into handlers.

pub mod state;

use std::rc::Rc;
use std::time::Duration;

use bytes::BytesMut;
use kafka_protocol::ResponseError;
use skiff_engine::batch::{self, BatchHeader, EndTxnMarker};
use skiff_engine::{AppendMode, LogError, Partition, TopicPartition};

pub use state::{
    BatchMeta, DescribedProducer, MarkerCheck, ProducerStates, SequenceCheck, BATCHES_KEPT,
};

use crate::state::CoreState;

/// An append refused by the engine or by the producer's sequence, or a
/// transactional write that needs KIP-890's check first.
#[derive(Debug)]
pub enum SequenceOrLog {
    Log(LogError),
    Sequence(ResponseError, String),
    /// A transactional batch that would open a transaction here: ask the
    /// coordinator (`txn::verify`), then append the batch (handed back, not
    /// appended) again with this guard.
    Unverified(TxnGuard, BytesMut),
}

/// Where the producer stood on the partition when a KIP-890 check began:
/// the append that follows holds only if no marker of the producer (and no
/// rebuild of the state) came in between.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxnGuard {
    generation: u64,
    markers: u64,
}

impl From<LogError> for SequenceOrLog {
    fn from(e: LogError) -> Self {
        SequenceOrLog::Log(e)
    }
}

impl From<batch::BatchError> for SequenceOrLog {
    fn from(e: batch::BatchError) -> Self {
        SequenceOrLog::Log(LogError::InvalidBatch(e))
    }
}

/// Check, append and record under the partition's producer lock, so pipelined
/// batches of one producer are checked in the order they are appended; the wait
/// for durability happens outside the lock.
pub async fn append_idempotent(
    partition: &Partition,
    tp: &TopicPartition,
    header: &BatchHeader,
    batch: BytesMut,
    mode: AppendMode,
    verified: Option<TxnGuard>,
) -> Result<(i64, i64, bool), SequenceOrLog> {
    let Some(core) = CoreState::current() else {
        return Err(LogError::RuntimeStopped.into());
    };
    let producers = core.producers(tp);
    let info = {
        let _permit = producers
            .lock
            .acquire_permit(1)
            .await
            .map_err(|_| LogError::RuntimeStopped)?;
        // The log first, then the sequence, as Kafka orders them: after an
        // offline log or a fence refused batch N ("not persisted"), batch
        // N+1 must get the same refusal, not OUT_OF_ORDER_SEQUENCE_NUMBER.
        // librdkafka reads that pair as skipped sequence numbers and bumps
        // its epoch, renumbering writes still waiting that may already be in
        // the log: duplicates (nemesis seed 2000, bitflip on a leader).
        partition.check_appendable(mode).await?;
        ensure_loaded(partition, tp, &producers).await?;
        let first_seq = header.base_sequence;
        let last_seq = first_seq.wrapping_add(header.last_offset_delta);
        let check = producers.states.borrow().check(
            header.producer_id,
            header.producer_epoch,
            first_seq,
            last_seq,
        );
        match check {
            SequenceCheck::Append => {}
            SequenceCheck::Duplicate {
                base_offset,
                last_offset,
            } => {
                tracing::debug!(partition = %tp, producer_id = header.producer_id, first_seq, "duplicate batch answered with its original offset");
                return Ok((base_offset, last_offset, true));
            }
            SequenceCheck::OutOfOrder { expected, got } => {
                return Err(SequenceOrLog::Sequence(
                    ResponseError::OutOfOrderSequenceNumber,
                    format!(
                        "producer {} expected sequence {expected}, got {got}",
                        header.producer_id
                    ),
                ))
            }
            SequenceCheck::Fenced { current_epoch } => {
                return Err(SequenceOrLog::Sequence(
                    ResponseError::InvalidProducerEpoch,
                    format!(
                        "producer epoch {} is older than {current_epoch}",
                        header.producer_epoch
                    ),
                ))
            }
            SequenceCheck::UnknownProducer => {
                return Err(SequenceOrLog::Sequence(
                    ResponseError::UnknownProducerId,
                    format!(
                        "no state for producer {} at sequence {first_seq}",
                        header.producer_id
                    ),
                ))
            }
        }
        {
            // One look at the producer's open transaction: a plain batch may
            // not land inside it, a transactional one that would open it
            // needs the coordinator's word first (KIP-890).
            let states = producers.states.borrow();
            let pid = header.producer_id;
            if let Some(since) = states.plain_write_in_txn(pid, header.is_transactional()) {
                return Err(SequenceOrLog::Sequence(
                    ResponseError::InvalidTxnState,
                    format!("producer {pid} sent a non-transactional batch while its transaction (from offset {since}) is open"),
                ));
            }
            if header.is_transactional() && !states.txn_open(pid) {
                let now = TxnGuard {
                    generation: producers.generation.get(),
                    markers: states.markers_seen(pid),
                };
                match verified {
                    Some(guard) if guard == now => {}
                    Some(_) => {
                        return Err(SequenceOrLog::Sequence(
                            ResponseError::InvalidTxnState,
                            format!("producer {pid}'s transaction ended while this write was being verified"),
                        ))
                    }
                    None => return Err(SequenceOrLog::Unverified(now, batch)),
                }
            }
        }
        let info = partition.append_buffered(batch, mode).await?;
        let mut states = producers.states.borrow_mut();
        states.record(
            header.producer_id,
            header.producer_epoch,
            BatchMeta {
                first_seq,
                last_seq,
                base_offset: info.base_offset,
                last_offset: info.last_offset,
            },
        );
        if header.is_transactional() {
            states.record_txn_data(header.producer_id, info.base_offset);
        }
        drop(states);
        info
    };
    Ok((info.base_offset, info.last_offset, false))
}

/// The idempotent and transactional producers of a partition this core owns,
/// as its producer state holds them (loaded from the log first if no produce
/// has yet), with the open transaction and coordinator epoch of each.
pub async fn describe_producers(tp: &TopicPartition) -> Result<Vec<DescribedProducer>, LogError> {
    let core = CoreState::current().ok_or(LogError::RuntimeStopped)?;
    let partition = core
        .shard
        .local(tp)
        .ok_or_else(|| LogError::UnknownPartition(tp.to_string()))?;
    let producers = core.producers(tp);
    let _permit = producers
        .lock
        .acquire_permit(1)
        .await
        .map_err(|_| LogError::RuntimeStopped)?;
    ensure_loaded(&partition, tp, &producers).await?;
    let described = producers.states.borrow().describe();
    Ok(described)
}

/// Loads the producers' state from the log the first time it is needed
/// (callers hold the producer lock).
async fn ensure_loaded(
    partition: &Partition,
    tp: &TopicPartition,
    producers: &crate::state::PartitionProducers,
) -> Result<(), LogError> {
    if !producers.loaded.get() {
        rebuild(partition, tp, producers).await?;
        producers.loaded.set(true);
    }
    Ok(())
}

thread_local! {
    static GENERATIONS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// A number no other rebuild on this core had: a state replaced by a new
/// one (even for the same partition) never matches an old KIP-890 guard.
fn next_generation() -> u64 {
    GENERATIONS.with(|g| {
        let n = g.get() + 1;
        g.set(n);
        n
    })
}

/// Rebuilds the producers' state: from the latest producer snapshot (the
/// state of the log below its offset), then the batches after it; from the
/// log's start when there is no usable snapshot.
async fn rebuild(
    partition: &Partition,
    tp: &TopicPartition,
    producers: &crate::state::PartitionProducers,
) -> Result<(), LogError> {
    producers.truncations.set(partition.truncations());
    producers.generation.set(next_generation());
    *producers.states.borrow_mut() = ProducerStates::default();
    producers.snapshot_offset.set(-1);
    let end = partition.log_end_offset().await?;
    let start = partition.log_start_offset().await?;
    let mut offset = start;
    if let Some((at, body)) = partition.latest_producer_snapshot().await? {
        match ProducerStates::decode(&body) {
            Ok(states) => {
                *producers.states.borrow_mut() = states;
                producers.snapshot_offset.set(at);
                // Records below the log start are gone; their producers stay.
                offset = at.max(start);
            }
            Err(reason) => {
                tracing::warn!(partition = %tp, %reason, offset = at, "undecodable producer snapshot: rebuilding from the whole log");
            }
        }
    }
    let scanned_from = offset;
    let started = std::time::Instant::now();
    while offset < end {
        let read = partition.read(offset, 8 << 20, end).await?;
        if read.batches.is_empty() {
            break;
        }
        for b in &read.batches {
            let Ok(h) = BatchHeader::parse(b) else {
                continue;
            };
            if h.producer_id >= 0 && h.is_control() {
                // A marker: the producer's epoch, its transaction ended; no
                // sequence (a control batch has none).
                if let Ok(Some(m)) = batch::parse_marker(b) {
                    let mut states = producers.states.borrow_mut();
                    states.record_marker(h.producer_id, h.producer_epoch, h.base_offset, m.commit);
                    states.record_coordinator(h.producer_id, m.coordinator_epoch);
                }
            } else if h.producer_id >= 0 {
                if h.is_transactional() {
                    producers
                        .states
                        .borrow_mut()
                        .record_txn_data(h.producer_id, h.base_offset);
                }
                producers.states.borrow_mut().record(
                    h.producer_id,
                    h.producer_epoch,
                    BatchMeta {
                        first_seq: h.base_sequence,
                        last_seq: h.base_sequence.wrapping_add(h.last_offset_delta),
                        base_offset: h.base_offset,
                        last_offset: h.last_offset(),
                    },
                );
            }
        }
        offset = read.next_offset;
    }
    tracing::debug!(
        partition = %tp,
        snapshot = producers.snapshot_offset.get(),
        scanned_from,
        end,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "producer state loaded"
    );
    Ok(())
}

/// Writes a producer snapshot for every partition of this core whose producer
/// state is loaded and whose log end moved since its last snapshot (every
/// checkpoint interval and at a clean stop), so the next load reads only the
/// log after it. Failures are logged: the state is still rebuilt from the log.
pub async fn snapshot_producers(core: &Rc<CoreState>) {
    for (tp, producers) in core.loaded_producers() {
        let Some(partition) = core.shard.local(&tp) else {
            continue;
        };
        match snapshot_partition(core, &tp, &partition, &producers).await {
            Ok(Some(offset)) => {
                tracing::debug!(partition = %tp, offset, "producer snapshot written")
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(partition = %tp, error = %e, "producer snapshot not written"),
        }
    }
}

/// One partition's snapshot. The state and the offset it is complete up to
/// are taken together under the producer lock (every idempotent append is
/// recorded under it, so the state holds exactly the producer batches below
/// the log end at that moment); the file is written outside the lock once
/// that offset is flushed, and only if no truncation happened since the state
/// was loaded and it is still this partition's state.
async fn snapshot_partition(
    core: &Rc<CoreState>,
    tp: &TopicPartition,
    partition: &Partition,
    producers: &Rc<crate::state::PartitionProducers>,
) -> Result<Option<i64>, LogError> {
    let (offset, body, truncations) = {
        let _permit = producers
            .lock
            .acquire_permit(1)
            .await
            .map_err(|_| LogError::RuntimeStopped)?;
        if !producers.loaded.get() || !core.is_current(tp, producers) {
            return Ok(None);
        }
        let end = partition.log_end();
        if end == producers.snapshot_offset.get() {
            return Ok(None);
        }
        (
            end,
            producers.states.borrow().encode(),
            producers.truncations.get(),
        )
    };
    // A snapshot may describe only records a crash cannot take away.
    partition.flush_to(offset).await?;
    if !core.is_current(tp, producers)
        || !partition
            .write_producer_snapshot(offset, &body, truncations)
            .await?
    {
        return Ok(None);
    }
    producers.snapshot_offset.set(offset);
    Ok(Some(offset))
}

/// Snapshots producer state every `log.flush.offset.checkpoint.interval.ms`
/// (per core, until the core stops serving).
pub fn start_snapshot_timer(core: Rc<CoreState>) {
    let every = Duration::from_millis(core.node.config.checkpoint_interval_ms.max(100));
    glommio::spawn_local(async move {
        loop {
            glommio::timer::sleep(every).await;
            if core.stopping.get() {
                return;
            }
            snapshot_producers(&core).await;
        }
    })
    .detach();
}

/// A COMMIT or ABORT marker for `tp` (from WriteTxnMarkers, or from this
/// node's own transaction coordinator), written on the partition's owner
/// core as its leader; the marker's offset once it is on the in-sync
/// replicas. Errors are Kafka's codes for a WriteTxnMarkers partition.
pub async fn write_marker_on_owner(
    core: &CoreState,
    tp: &TopicPartition,
    producer_id: i64,
    epoch: i16,
    commit: bool,
    coordinator_epoch: i32,
    timeout: Duration,
) -> Result<i64, ResponseError> {
    let known = core
        .topics()
        .get(&tp.topic)
        .is_some_and(|t| t.partition(tp.partition).is_some());
    if !known {
        return Err(ResponseError::UnknownTopicOrPartition);
    }
    let owner = core.shard.table().shard_of(tp);
    let at = tp.clone();
    let written = core
        .shard
        .invoke_on(owner, move |_| async move {
            write_marker(&at, producer_id, epoch, commit, coordinator_epoch, timeout).await
        })
        .await;
    let e = match written {
        Ok(Ok(offset)) => return Ok(offset),
        Ok(Err(SequenceOrLog::Sequence(code, message))) => {
            tracing::debug!(partition = %tp, producer_id, epoch, %message, "marker refused");
            return Err(code);
        }
        Ok(Err(SequenceOrLog::Unverified(..))) => return Err(ResponseError::UnknownServerError),
        Ok(Err(SequenceOrLog::Log(e))) | Err(e) => e,
    };
    tracing::debug!(partition = %tp, producer_id, epoch, error = %e, "marker not written");
    // An offline log is a leader that cannot take writes: the coordinator
    // looks for the leader the controller moves the partition to.
    match crate::kafka::error_code(&e) {
        ResponseError::KafkaStorageError => Err(ResponseError::NotLeaderOrFollower),
        code => Err(code),
    }
}

/// On the owner core of `tp`: the marker checked against its producer's
/// epoch and appended under the producer lock (in order with the producer's
/// own batches), then made durable here and on the in-sync replicas (Kafka
/// appends markers with acks=all).
async fn write_marker(
    tp: &TopicPartition,
    producer_id: i64,
    epoch: i16,
    commit: bool,
    coordinator_epoch: i32,
    timeout: Duration,
) -> Result<i64, SequenceOrLog> {
    let core = CoreState::current().ok_or(LogError::RuntimeStopped)?;
    let partition = core
        .shard
        .local(tp)
        .ok_or_else(|| LogError::UnknownPartition(tp.to_string()))?;
    let leader_epoch = crate::replica::admit_append(tp, -1)
        .map_err(|r| SequenceOrLog::Sequence(r.error, r.message))?;
    let mode = AppendMode::Leader { leader_epoch };
    let producers = core.producers(tp);
    let (info, appended_at) = {
        let _permit = producers
            .lock
            .acquire_permit(1)
            .await
            .map_err(|_| LogError::RuntimeStopped)?;
        partition.check_appendable(mode).await?;
        ensure_loaded(&partition, tp, &producers).await?;
        let fenced = producers
            .states
            .borrow()
            .coordinator_fenced(producer_id, coordinator_epoch);
        if let Some(latest) = fenced {
            return Err(SequenceOrLog::Sequence(
                ResponseError::TransactionCoordinatorFenced,
                format!("marker of producer {producer_id} from coordinator epoch {coordinator_epoch}: the partition has one from epoch {latest}"),
            ));
        }
        let check = producers.states.borrow().check_marker(producer_id, epoch);
        if let MarkerCheck::Fenced { current_epoch } = check {
            return Err(SequenceOrLog::Sequence(
                ResponseError::InvalidProducerEpoch,
                format!("marker of producer {producer_id} at epoch {epoch}: the partition has seen epoch {current_epoch}"),
            ));
        }
        let marker = EndTxnMarker {
            commit,
            coordinator_epoch,
        };
        let batch = batch::marker_batch(producer_id, epoch, marker, crate::kafka::now_ms())?;
        let info = partition
            .append_buffered(BytesMut::from(&batch[..]), mode)
            .await?;
        let appended_at = partition.truncations();
        producers
            .states
            .borrow_mut()
            .record_marker(producer_id, epoch, info.base_offset, commit);
        producers
            .states
            .borrow_mut()
            .record_coordinator(producer_id, coordinator_epoch);
        (info, appended_at)
    };
    partition
        .await_durable_to(info.last_offset + 1, appended_at)
        .await?;
    crate::replica::local_durable(tp, &partition);
    crate::replica::await_replicated(tp, info.last_offset + 1, timeout)
        .await
        .map_err(|r| SequenceOrLog::Sequence(r.error, r.message))?;
    MARKER_LISTENERS.with(|l| {
        for listener in l.borrow().iter() {
            listener(tp, producer_id, epoch, commit);
        }
    });
    Ok(info.base_offset)
}

type MarkerListener = Box<dyn Fn(&TopicPartition, i64, i16, bool)>;

thread_local! {
    static MARKER_LISTENERS: std::cell::RefCell<Vec<MarkerListener>> =
        std::cell::RefCell::new(Vec::new());
}

/// Calls `f(partition, producer id, epoch, commit)` on this core after
/// every marker this node writes as a leader is on the in-sync replicas:
/// how the group coordinator learns that a transaction's offsets count
/// (or not). Register once per core, before the core takes any role.
pub fn on_marker(f: impl Fn(&TopicPartition, i64, i16, bool) + 'static) {
    MARKER_LISTENERS.with(|l| l.borrow_mut().push(Box::new(f)));
}
