//! Produce: each partition's batch goes to the core that owns the partition, is
//! checked against the producer's sequence there (idempotence), appended, and
//! acknowledged once durable. acks=0 gets no response at all (Kafka's rule).
//!
//! Two phases keep Kafka's ordering promise: requests on one connection are
//! applied in the order they were sent. `append_phase` runs on the connection's
//! reader, one request after the other: it validates and appends every
//! partition's batch (offsets assigned, batch in the segment buffer). The wait for
//! durability and the response (`ProducePending::finish`) then run as their own
//! task, so pipelined requests still share group commits.
//!
//! A batch is handed to the engine as the writable piece of the request frame it
//! arrived in (`skiff_protocol::produce`): the engine stamps its offset and
//! epoch there and the batch cache keeps it, so the records are copied once, into
//! the segment buffer. A small batch, or one in a frame that is mostly other
//! bytes, is copied into its own buffer first (`own_buffer`), so the cache never
//! holds a large frame alive for a small batch.

use std::rc::Rc;
use std::time::Duration;

use bytes::BytesMut;
use futures_channel::oneshot;
use futures_util::future::join_all;
use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::ProduceResponse;
use kafka_protocol::ResponseError;
use skiff_engine::batch::{self, BatchHeader};
use skiff_engine::{AppendMode, LogError, Shard, TopicPartition};
use skiff_protocol::produce::ProduceRequest;

use crate::kafka::{error_code, now_ms, str_bytes};
use crate::producer::{append_idempotent, SequenceOrLog};
use crate::state::CoreState;

/// Bound on how long acks=all waits for the replicas, whatever the client asks.
const MAX_TIMEOUT_MS: i32 = 300_000;
/// Bound on a compressed batch's decompressed size while validating it.
const DECOMPRESSED_BYTES_MAX: usize = 256 << 20;

/// What the owner core answers for one partition.
#[derive(Debug, Clone)]
struct Appended {
    base_offset: i64,
    log_append_time_ms: i64,
    log_start_offset: i64,
}

/// Why a partition's produce was refused: the error code and its message
/// (the same pair replication refuses with).
type Refused = crate::replica::Refusal;

/// A produce whose batches are appended, waiting to be durable and answered.
pub struct ProducePending {
    request: ProduceRequest,
    version: i16,
    results: Vec<(TopicPartition, Result<AppendedPending, Refused>)>,
}

/// One partition's append, with the owner core's signal that it is durable.
struct AppendedPending {
    appended: Appended,
    durable: oneshot::Receiver<Result<(), Refused>>,
    /// Batch bytes and records appended; None for a duplicate answered from the
    /// producer's state (nothing was appended).
    appended_size: Option<(usize, i32)>,
}

/// A batch smaller than this is copied out of its request frame. A frame with a
/// batch this large was read into a buffer little larger than itself
/// (`FrameReader`), so a batch kept in its frame holds at most a few times its
/// own size.
const SHARED_BATCH_BYTES_MIN: usize = skiff_protocol::frame::READ_CHUNK_BYTES;

/// Whether the request's large batches may stay in its frame: only when they make
/// up at least three quarters of it, so what the batch cache holds alive is at
/// most a third more than the batches it counts.
fn frame_is_mostly_batches(request: &ProduceRequest) -> bool {
    let large: usize = request
        .topics
        .iter()
        .flat_map(|t| &t.partitions)
        .filter_map(|p| p.records.as_ref().map(|r| r.len()))
        .filter(|&len| len >= SHARED_BATCH_BYTES_MIN)
        .sum();
    large.saturating_mul(4) >= request.body_bytes.saturating_mul(3)
}

/// The batch in a buffer of its own when keeping it in the frame would hold
/// the frame's memory for a small batch (see the module comment).
fn own_buffer(records: BytesMut, share_frame: bool) -> BytesMut {
    if share_frame && records.len() >= SHARED_BATCH_BYTES_MIN {
        records
    } else {
        BytesMut::from(&records[..])
    }
}

/// Phase one (in request order): validate and append every partition's batch.
pub async fn append_phase(
    core: &CoreState,
    mut request: ProduceRequest,
    version: i16,
) -> ProducePending {
    let acks = request.acks;
    let timeout_ms = request.timeout_ms;
    let share_frame = frame_is_mostly_batches(&request);
    let transactional_id = request.transactional_id.as_deref();
    let topics = core.topics();
    let mut pending = Vec::new();
    for t in &mut request.topics {
        let name = t.name.clone();
        let log_append_time = topics
            .get(&name)
            .and_then(|info| info.configs.get("message.timestamp.type"))
            .is_some_and(|v| v == "LogAppendTime");
        // Kafka refuses keyless records on compacted topics: compaction keeps the
        // latest record per key, and a record without one has no place there.
        let compacted = topics.get(&name).is_some_and(|info| {
            core.node
                .config
                .cleanup_policy_has(&info.configs, "compact")
        });
        for p in &mut t.partitions {
            let tp = TopicPartition::new(name.clone(), p.index);
            let serves = super::check_leader(&topics, &name, p.index);
            let records = p.records.take().map(|r| own_buffer(r, share_frame));
            let shard = core.shard.clone();
            let metrics = &core.metrics;
            pending.push(async move {
                let result = if let Err(error) = serves {
                    Err(Refused {
                        error,
                        message: match error {
                            ResponseError::UnknownTopicOrPartition => {
                                format!("{tp} does not exist")
                            }
                            _ => format!("this node does not lead {tp}"),
                        },
                    })
                } else if crate::group::is_internal_topic(&tp.topic) {
                    // Kafka: "Cannot append to internal topic".
                    Err(Refused {
                        error: ResponseError::InvalidTopicException,
                        message: format!("cannot append to internal topic {}", tp.topic),
                    })
                } else if acks != 0 && acks != 1 && acks != -1 {
                    Err(Refused {
                        error: ResponseError::InvalidRequiredAcks,
                        message: format!("acks must be 0, 1 or -1, got {acks}"),
                    })
                } else {
                    let timeout = Duration::from_millis(timeout_ms.clamp(0, MAX_TIMEOUT_MS) as u64);
                    produce_partition(
                        core,
                        &shard,
                        &tp,
                        transactional_id,
                        records,
                        log_append_time,
                        compacted,
                        acks,
                        timeout,
                    )
                    .await
                };
                if let Ok(p) = &result {
                    if let Some((bytes, records)) = p.appended_size {
                        metrics.produced(&tp.topic, bytes, records);
                    }
                }
                (tp, result)
            });
        }
    }
    ProducePending {
        results: join_all(pending).await,
        request,
        version,
    }
}

impl ProducePending {
    /// Phase two: waits for durability and builds the response (`None` for
    /// acks=0, which Kafka never answers).
    pub async fn finish(self) -> Option<ProduceResponse> {
        let ProducePending {
            request,
            version,
            results,
        } = self;
        if request.acks == 0 {
            // Never answered: what the append phase did is all there is.
            return None;
        }
        let mut finished = Vec::with_capacity(results.len());
        for (tp, result) in results {
            let result = match result {
                Ok(p) => match p.durable.await {
                    Ok(Ok(())) => Ok(p.appended),
                    Ok(Err(refused)) => Err(refused),
                    // In the log already: "possibly persisted".
                    Err(_) => Err(Refused {
                        error: ResponseError::NotEnoughReplicasAfterAppend,
                        message: "written to the log, but the partition's core stopped".into(),
                    }),
                },
                Err(r) => Err(r),
            };
            finished.push((tp, result));
        }
        respond(&request, version, finished)
    }
}

fn respond(
    request: &ProduceRequest,
    version: i16,
    results: Vec<(TopicPartition, Result<Appended, Refused>)>,
) -> Option<ProduceResponse> {
    let acks = request.acks;
    if acks == 0 {
        for (tp, r) in &results {
            if let Err(e) = r {
                tracing::debug!(partition = %tp, error = %e.message, "acks=0 produce failed");
            }
        }
        return None;
    }
    let mut responses: Vec<TopicProduceResponse> = Vec::new();
    for (t, (tp, result)) in request
        .topics
        .iter()
        .flat_map(|t| t.partitions.iter().map(move |_| t))
        .zip(results)
    {
        // Fields are set only in the versions that have them (v5: log start
        // offset, v8: error message).
        let mut partition = PartitionProduceResponse::default().with_index(tp.partition);
        match result {
            Ok(a) => {
                partition.base_offset = a.base_offset;
                partition.log_append_time_ms = a.log_append_time_ms;
                if version >= 5 {
                    partition.log_start_offset = a.log_start_offset;
                }
            }
            Err(r) => {
                partition.error_code = r.error.code();
                partition.base_offset = -1;
                partition.log_append_time_ms = -1;
                if version >= 8 {
                    partition.error_message = Some(str_bytes(r.message));
                }
            }
        }
        match responses.last_mut() {
            Some(last) if last.name.0.as_str() == t.name => {
                last.partition_responses.push(partition)
            }
            _ => responses.push(
                TopicProduceResponse::default()
                    .with_name(kafka_protocol::messages::TopicName(str_bytes(
                        t.name.clone(),
                    )))
                    .with_partition_responses(vec![partition]),
            ),
        }
    }
    Some(ProduceResponse::default().with_responses(responses))
}

#[allow(clippy::too_many_arguments)]
async fn produce_partition(
    core: &CoreState,
    shard: &Rc<Shard>,
    tp: &TopicPartition,
    transactional_id: Option<&str>,
    records: Option<BytesMut>,
    log_append_time: bool,
    compacted: bool,
    acks: i16,
    timeout: Duration,
) -> Result<AppendedPending, Refused> {
    let refuse = |error: ResponseError, message: String| Refused { error, message };
    let records =
        records.ok_or_else(|| refuse(ResponseError::CorruptMessage, "no records".into()))?;
    // Produce v3+ carries exactly one RecordBatch per partition.
    let header = BatchHeader::parse(&records)
        .map_err(|e| refuse(ResponseError::CorruptMessage, e.to_string()))?;
    if header.total_len() != records.len() {
        return Err(refuse(
            ResponseError::InvalidRecord,
            format!(
                "expected exactly one record batch of {} bytes, got {} bytes",
                header.total_len(),
                records.len()
            ),
        ));
    }
    // Markers come only from a transaction coordinator (WriteTxnMarkers).
    if header.is_control() {
        return Err(refuse(
            ResponseError::InvalidRecord,
            "control batches are written by transaction coordinators, not producers".into(),
        ));
    }
    if header.is_transactional() && header.producer_id < 0 {
        return Err(refuse(
            ResponseError::InvalidRecord,
            "a transactional batch needs a producer id".into(),
        ));
    }
    // Kafka decompresses compressed batches on produce; so does skiff, on the
    // connection's core, so a batch no consumer could read is refused here. The
    // CRC and record counts are checked once, by the engine's append.
    if compacted {
        let section = batch::records_section(&records, &header, DECOMPRESSED_BYTES_MAX)
            .map_err(|e| refuse(ResponseError::CorruptMessage, e.to_string()))?;
        let views = batch::record_views(&section, header.records_count)
            .map_err(|e| refuse(ResponseError::CorruptMessage, e.to_string()))?;
        if views.iter().any(|r| r.key.is_none()) {
            return Err(refuse(
                ResponseError::InvalidRecord,
                format!(
                    "Compacted topic cannot accept message without key in topic partition {tp}."
                ),
            ));
        }
    } else {
        batch::check_compressed_records(&records, &header, DECOMPRESSED_BYTES_MAX)
            .map_err(|e| refuse(ResponseError::CorruptMessage, e.to_string()))?;
    }
    let size = (records.len(), header.records_count);
    // KIP-890: a transactional batch that would open a transaction here is
    // appended only once its coordinator confirms the transaction holds this
    // partition (`txn::verify`); the owner hands the batch back for that
    // second try.
    let mut batch = records;
    let mut verified = None;
    loop {
        let attempt = append_on_owner(
            shard,
            tp,
            header,
            batch,
            log_append_time,
            acks,
            timeout,
            size,
            verified,
        )
        .await;
        let guard = match attempt {
            Err(SequenceOrLog::Unverified(guard, returned)) if verified.is_none() => {
                batch = returned;
                guard
            }
            Err(SequenceOrLog::Unverified(..)) => {
                return Err(refuse(
                    ResponseError::InvalidTxnState,
                    "the transaction's state moved during its check".into(),
                ))
            }
            Err(SequenceOrLog::Log(e)) => {
                return Err(refuse(produce_error_code(&e), e.to_string()))
            }
            Err(SequenceOrLog::Sequence(error, message)) => return Err(refuse(error, message)),
            Ok(appended) => return Ok(appended),
        };
        let Some(id) = transactional_id else {
            return Err(refuse(
                ResponseError::InvalidTxnState,
                "a transactional batch in a produce request without a transactional id".into(),
            ));
        };
        crate::txn::verify::verify(core, id, header.producer_id, header.producer_epoch, tp)
            .await
            .map_err(|e| {
                refuse(
                    e,
                    format!(
                        "producer {} epoch {}: {tp} is not in transaction {id:?}'s ongoing transaction",
                        header.producer_id, header.producer_epoch
                    ),
                )
            })?;
        verified = Some(guard);
    }
}

/// On the owner core: admission, the idempotent or plain append, and the
/// durability wait started.
#[allow(clippy::too_many_arguments)]
async fn append_on_owner(
    shard: &Rc<Shard>,
    tp: &TopicPartition,
    header: BatchHeader,
    mut batch: BytesMut,
    log_append_time: bool,
    acks: i16,
    timeout: Duration,
    size: (usize, i32),
    verified: Option<crate::producer::TxnGuard>,
) -> Result<AppendedPending, SequenceOrLog> {
    let owner = shard.table().shard_of(tp);
    let origin = shard.id();
    let tp2 = tp.clone();
    shard
        .invoke_on(owner, move |shard| async move {
            let partition = shard
                .local(&tp2)
                .ok_or_else(|| LogError::UnknownPartition(tp2.to_string()))?;
            // Leading it (at which epoch), and for acks=all an ISR of at
            // least min.insync.replicas, before anything is written.
            let leader_epoch = crate::replica::admit_append(&tp2, acks)
                .map_err(|r| SequenceOrLog::Sequence(r.error, r.message))?;
            let mode = AppendMode::Leader { leader_epoch };
            let mut append_time = -1;
            if log_append_time {
                append_time = now_ms();
                batch::stamp_log_append_time(&mut batch, append_time)?;
            }
            let (base_offset, last_offset, duplicate) = if header.producer_id >= 0 {
                append_idempotent(&partition, &tp2, &header, batch, mode, verified).await?
            } else {
                let info = partition.append_buffered(batch, mode).await?;
                (info.base_offset, info.last_offset, false)
            };
            // Read as the append returns: the durability wait below is for
            // these records, not for others a truncation let take their offsets.
            let appended_at = partition.truncations();
            // The durability wait runs here, on the owner, as its own task; the
            // connection learns the outcome through the channel. acks=all then
            // waits for the in-sync replicas (the high watermark).
            let (tx, durable) = oneshot::channel();
            let waiter = partition.clone();
            let tp3 = tp2.clone();
            let here = shard.clone();
            glommio::spawn_local(async move {
                let result = match waiter.await_durable_to(last_offset + 1, appended_at).await {
                    Ok(()) => {
                        crate::replica::local_durable(&tp3, &waiter);
                        if acks == -1 {
                            crate::replica::await_replicated(&tp3, last_offset + 1, timeout).await
                        } else {
                            Ok(())
                        }
                    }
                    // Appended, then the flush failed: "possibly persisted"
                    // (see `replica::await_replicated`), never a code that
                    // says it is not in the log.
                    Err(e) => Err(Refused {
                        error: ResponseError::NotEnoughReplicasAfterAppend,
                        message: format!("written to the log, but not made durable: {e}"),
                    }),
                };
                // Sent on the connection's core (`Shard::run_on`): its task
                // is never woken from this thread.
                here.run_on(origin, move || {
                    let _ = tx.send(result);
                })
                .await;
            })
            .detach();
            Ok::<_, SequenceOrLog>(AppendedPending {
                appended: Appended {
                    base_offset,
                    log_append_time_ms: append_time,
                    log_start_offset: partition.log_start_offset().await?,
                },
                durable,
                appended_size: (!duplicate).then_some(size),
            })
        })
        .await
        .map_err(SequenceOrLog::Log)?
}

/// The error code for a produce the engine refused before its batch was in
/// the log. A storage failure (the log went offline: a failed write, roll or
/// fdatasync, corrupt bytes) is NOT_LEADER_OR_FOLLOWER, as for any leader that
/// cannot take writes: the client refreshes its metadata and finds the leader
/// the controller moves the partition to (the next heartbeat reports it
/// offline). Both that and KAFKA_STORAGE_ERROR mean "not persisted" to
/// librdkafka, which is true here; a batch already in the log is answered
/// "possibly persisted" instead (NOT_ENOUGH_REPLICAS_AFTER_APPEND, see
/// `replica::await_replicated`). The message still says what failed.
fn produce_error_code(e: &LogError) -> ResponseError {
    match error_code(e) {
        ResponseError::KafkaStorageError => ResponseError::NotLeaderOrFollower,
        code => code,
    }
}
