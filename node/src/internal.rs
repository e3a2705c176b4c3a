//! What the coordinators share about their internal topics
//! (`__consumer_offsets`, `__transaction_state`): creating one on first use,
//! reading a partition's records when its leadership arrives, and appending
//! records as its leader the way an acks=all produce does.

use std::rc::Rc;
use std::time::Duration;

use bytes::BytesMut;
use kafka_protocol::ResponseError;
use skiff_engine::batch::{decode_records, parse_marker, BatchBuilder, BatchHeader};
use skiff_engine::{AppendMode, LogError, Shard, TopicPartition};

use skiff_coordinator::partition_for;

use crate::kafka::{error_code, now_ms};
use crate::state::CoreState;
use crate::topics::{self, CreateTopic, TopicError};

/// Bytes read per step while loading a partition.
const LOAD_READ_BYTES: usize = 8 << 20;
/// Bound on a stored record's decompressed size while loading.
const LOAD_RECORD_BYTES_MAX: usize = 64 << 20;
/// How long a node waits for an internal topic another node created to
/// reach its own metadata.
const TOPIC_WAIT: Duration = Duration::from_secs(60);

/// The partition of internal `topic` that holds `key` (Kafka's rule,
/// `partition_for`) and the core that owns it; `None` while the topic does
/// not exist.
pub fn partition_of(core: &CoreState, topic: &str, key: &str) -> Option<(TopicPartition, usize)> {
    let partitions = core.topics().get(topic)?.partitions;
    let tp = TopicPartition::new(topic, partition_for(key, partitions));
    let owner = core.shard.table().shard_of(&tp);
    Some((tp, owner))
}

/// Why a coordinator's write failed, before it becomes a Kafka error.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error(transparent)]
    Log(#[from] LogError),
    #[error("{}", .0.message)]
    Replication(crate::replica::Refusal),
}

impl WriteError {
    /// Kafka's mapping of a failed coordinator write (GroupMetadataManager,
    /// TransactionStateManager): retriable coordinator errors, so clients
    /// look for the coordinator again; a write too large is `too_large`.
    pub fn code(&self, too_large: ResponseError) -> ResponseError {
        let code = match self {
            WriteError::Log(e) => error_code(e),
            WriteError::Replication(r) => r.error,
        };
        match code {
            ResponseError::UnknownTopicOrPartition
            | ResponseError::NotEnoughReplicas
            | ResponseError::NotEnoughReplicasAfterAppend
            | ResponseError::RequestTimedOut => ResponseError::CoordinatorNotAvailable,
            ResponseError::NotLeaderOrFollower | ResponseError::KafkaStorageError => {
                ResponseError::NotCoordinator
            }
            ResponseError::MessageTooLarge | ResponseError::RecordListTooLarge => too_large,
            other => other,
        }
    }
}

/// Appends records (key, value or tombstone) as one batch to an internal
/// partition this core leads, as an acks=all produce does: at the current
/// leader epoch, then durable here, then on the in-sync replicas (at most
/// `timeout`). Returns the first record's offset.
pub async fn append(
    shard: &Rc<Shard>,
    tp: &TopicPartition,
    records: &[(Vec<u8>, Option<Vec<u8>>)],
    timeout: Duration,
) -> Result<i64, WriteError> {
    append_as(shard, tp, records, None, timeout).await
}

/// As [`append`], in a transactional batch of `producer` (id, epoch): the
/// records count once that producer's COMMIT marker follows them in the
/// partition (TxnOffsetCommit's offsets).
pub async fn append_transactional(
    shard: &Rc<Shard>,
    tp: &TopicPartition,
    records: &[(Vec<u8>, Option<Vec<u8>>)],
    producer: (i64, i16),
    timeout: Duration,
) -> Result<i64, WriteError> {
    append_as(shard, tp, records, Some(producer), timeout).await
}

async fn append_as(
    shard: &Rc<Shard>,
    tp: &TopicPartition,
    records: &[(Vec<u8>, Option<Vec<u8>>)],
    producer: Option<(i64, i16)>,
    timeout: Duration,
) -> Result<i64, WriteError> {
    let partition = shard
        .local(tp)
        .ok_or_else(|| LogError::UnknownPartition(tp.to_string()))?;
    let leader_epoch = crate::replica::admit_append(tp, -1).map_err(WriteError::Replication)?;
    let mut builder = match producer {
        // No sequence: the coordinator, not the producer, orders these.
        Some((id, epoch)) => BatchBuilder::new()
            .producer(id, epoch, -1)
            .transactional(true),
        None => BatchBuilder::new(),
    };
    let now = now_ms();
    for (key, value) in records {
        builder.push(now, Some(key), value.as_deref(), &[]);
    }
    let batch = builder.build().map_err(LogError::InvalidBatch)?;
    let info = partition
        .append(
            BytesMut::from(&batch[..]),
            AppendMode::Leader { leader_epoch },
        )
        .await?;
    crate::replica::local_durable(tp, &partition);
    crate::replica::await_replicated(tp, info.last_offset + 1, timeout)
        .await
        .map_err(WriteError::Replication)?;
    Ok(info.base_offset)
}

/// Reads every record of a partition this core holds, from its start to its
/// end as of the call: `visit(offset, key, value)` in log order (markers
/// left out). A batch that does not decode is skipped with a warning (its
/// neighbours still count).
pub async fn read_records(
    shard: &Rc<Shard>,
    tp: &TopicPartition,
    mut visit: impl FnMut(i64, Option<&[u8]>, Option<&[u8]>),
) -> Result<(), LogError> {
    read_batches(shard, tp, |loaded| {
        if let Loaded::Record {
            offset, key, value, ..
        } = loaded
        {
            visit(offset, key, value);
        }
    })
    .await
}

/// One thing a loader sees in a partition, in log order.
pub enum Loaded<'a> {
    Record {
        offset: i64,
        key: Option<&'a [u8]>,
        value: Option<&'a [u8]>,
        /// The producer id of a transactional batch: the record counts
        /// only once that producer's COMMIT marker follows.
        transactional: Option<i64>,
    },
    /// A COMMIT or ABORT marker of `producer_id` at `producer_epoch`.
    Marker {
        offset: i64,
        producer_id: i64,
        producer_epoch: i16,
        commit: bool,
    },
}

/// As [`read_records`], with transactions: every record with its batch's
/// producer if transactional, and the markers.
pub async fn read_batches(
    shard: &Rc<Shard>,
    tp: &TopicPartition,
    mut visit: impl FnMut(Loaded<'_>),
) -> Result<(), LogError> {
    let partition = shard
        .local(tp)
        .ok_or_else(|| LogError::UnknownPartition(tp.to_string()))?;
    let end = partition.log_end_offset().await?;
    let mut offset = partition.log_start_offset().await?;
    while offset < end {
        let read = partition.read(offset, LOAD_READ_BYTES, end).await?;
        if read.batches.is_empty() {
            break;
        }
        for batch in &read.batches {
            let header = match BatchHeader::parse(batch) {
                Ok(h) => h,
                Err(e) => {
                    tracing::warn!(partition = %tp, error = %e, "skipping an unparsable batch");
                    continue;
                }
            };
            if header.is_control() {
                match parse_marker(batch) {
                    Ok(Some(m)) => visit(Loaded::Marker {
                        offset: header.base_offset,
                        producer_id: header.producer_id,
                        producer_epoch: header.producer_epoch,
                        commit: m.commit,
                    }),
                    Ok(None) => {}
                    Err(e) => {
                        tracing::warn!(partition = %tp, offset = header.base_offset, error = %e, "skipping an undecodable control batch")
                    }
                }
                continue;
            }
            let transactional = header.is_transactional().then_some(header.producer_id);
            let records = match decode_records(batch, LOAD_RECORD_BYTES_MAX) {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(partition = %tp, error = %e, "skipping an undecodable batch");
                    continue;
                }
            };
            for r in records {
                visit(Loaded::Record {
                    offset: r.offset,
                    key: r.key.as_deref(),
                    value: r.value.as_deref(),
                    transactional,
                });
            }
        }
        offset = read.next_offset;
    }
    Ok(())
}

/// Creates an internal topic (compacted, small segments so the compactor
/// has closed ones to work on) unless it exists; returns its partition
/// count, which decides where keys live from then on. The replication
/// factor is capped at the brokers alive now (Kafka refuses instead and
/// retries).
pub async fn ensure_topic(
    core: &CoreState,
    name: &str,
    partitions: i32,
    replication_factor: i16,
    segment_bytes: &str,
) -> Result<i32, TopicError> {
    if let Some(info) = core.topics().get(name) {
        return Ok(info.partitions);
    }
    let configs = [
        ("cleanup.policy", "compact"),
        ("segment.bytes", segment_bytes),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let live = i16::try_from(core.topics().live_brokers().count()).unwrap_or(i16::MAX);
    let create = CreateTopic {
        name: name.to_string(),
        partitions,
        replication_factor: replication_factor.min(live).max(1),
        configs,
    };
    match topics::create(core, create).await {
        Ok(info) => Ok(info.partitions),
        // Another node created it first; its records are on their way here.
        Err(TopicError::Exists(_)) => {
            let deadline = std::time::Instant::now() + TOPIC_WAIT;
            loop {
                if let Some(t) = core.topics().get(name) {
                    return Ok(t.partitions);
                }
                if std::time::Instant::now() >= deadline {
                    return Err(TopicError::Unavailable(format!(
                        "{name} exists but did not reach this node's metadata within {TOPIC_WAIT:?}"
                    )));
                }
                glommio::timer::sleep(Duration::from_millis(5)).await;
            }
        }
        Err(e) => Err(e),
    }
}
