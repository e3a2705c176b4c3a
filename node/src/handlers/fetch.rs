//! Fetch for consumers (batches up to the high watermark) and for followers
//! (a replica id: batches up to the log end; the fetch offset tells the
//! leader how far the follower has come, `replica::follower_fetch`; a log
//! that parted from ours gets Fetch v12's diverging epoch instead of data),
//! long polling until `min_bytes` are available or `max_wait_ms` passes. Record batches travel as
//! the batch cache's own `Bytes` into the response (`Splices` placeholders), so a
//! cached fetch copies no record bytes in user space.

use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::future::{join_all, select_all};
use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::{FetchRequest, FetchResponse};
use kafka_protocol::ResponseError;
use skiff_engine::batch::BatchHeader;
use skiff_engine::{LogError, Shard, TopicPartition};
use skiff_protocol::splice::Splices;
use skiff_replication::FollowerFetch;

use super::error_code;
use crate::state::CoreState;

/// Upper bound on one long poll, whatever the client asks.
const MAX_WAIT_MS_CAP: u64 = 30_000;

struct PartitionRead {
    high_watermark: i64,
    log_start_offset: i64,
    batches: Vec<Bytes>,
    /// What a long poll waits to pass: the high watermark for a consumer,
    /// the log end for a follower.
    seen: i64,
    /// The leader's (epoch, end offset) where a follower's log diverges.
    diverging: Option<(i32, i64)>,
}

/// Who is fetching: a consumer reads up to the high watermark; a follower
/// (Fetch with a replica id) reads up to the log end, and its fetch offset is
/// its log end, which the leader records.
#[derive(Debug, Clone, Copy)]
enum Reader {
    Consumer,
    Follower { id: i32 },
}

/// One partition of a fetch.
#[derive(Debug, Clone)]
struct Wanted {
    tp: TopicPartition,
    offset: i64,
    max_bytes: usize,
    current_leader_epoch: i32,
    last_fetched_epoch: i32,
}

pub async fn handle(
    core: &CoreState,
    request: FetchRequest,
    version: i16,
    splices: &mut Splices,
) -> FetchResponse {
    let started = Instant::now();
    let max_wait = Duration::from_millis((request.max_wait_ms.max(0) as u64).min(MAX_WAIT_MS_CAP));
    let min_bytes = request.min_bytes.max(0) as usize;
    let max_bytes = if request.max_bytes > 0 {
        request.max_bytes as usize
    } else {
        usize::MAX
    };
    let reader = if version < 15 && request.replica_id.0 >= 0 {
        Reader::Follower {
            id: request.replica_id.0,
        }
    } else {
        Reader::Consumer
    };
    let mut wanted: Vec<Wanted> = Vec::new();
    let topics = core.topics();
    for t in &request.topics {
        let name = if t.topic.0.is_empty() {
            topics
                .by_id(t.topic_id)
                .map(|i| i.name.clone())
                .unwrap_or_default()
        } else {
            t.topic.0.to_string()
        };
        for p in &t.partitions {
            wanted.push(Wanted {
                tp: TopicPartition::new(name.clone(), p.partition),
                offset: p.fetch_offset,
                max_bytes: p.partition_max_bytes.max(0) as usize,
                current_leader_epoch: p.current_leader_epoch,
                last_fetched_epoch: if version >= 12 {
                    p.last_fetched_epoch
                } else {
                    -1
                },
            });
        }
    }

    let results = loop {
        let results = read_all(core, &wanted, reader).await;
        let bytes: usize = results
            .iter()
            .filter_map(|r| r.as_ref().ok())
            .flat_map(|r| r.batches.iter().map(Bytes::len))
            .sum();
        let any_error = results.iter().any(Result::is_err);
        let waited = started.elapsed();
        let enough = bytes >= min_bytes && (bytes > 0 || min_bytes == 0);
        if enough || any_error || waited >= max_wait || wanted.is_empty() || core.stopping.get() {
            break results;
        }
        // Wake when any partition passes what this read saw.
        let seen: Vec<(TopicPartition, i64)> = wanted
            .iter()
            .zip(&results)
            .filter_map(|(w, r)| r.as_ref().ok().map(|r| (w.tp.clone(), r.seen)))
            .collect();
        let follower = matches!(reader, Reader::Follower { .. });
        wait_for_data(&core.shard, seen, max_wait - waited, follower).await;
    };

    // Trim to max_bytes in request order; the first non-empty partition always
    // gets at least one batch (KIP-74).
    let mut budget = max_bytes;
    let mut first = true;
    let mut responses: Vec<FetchableTopicResponse> = Vec::new();
    for (t_index, t) in request.topics.iter().enumerate() {
        let mut partitions = Vec::with_capacity(t.partitions.len());
        let offset_before: usize = request.topics[..t_index]
            .iter()
            .map(|t| t.partitions.len())
            .sum();
        for (i, p) in t.partitions.iter().enumerate() {
            let data = PartitionData::default().with_partition_index(p.partition);
            let data = match &results[offset_before + i] {
                Err(e) => data
                    .with_error_code(e.code())
                    .with_high_watermark(-1)
                    .with_last_stable_offset(-1),
                Ok(r) => {
                    let mut batches = Vec::new();
                    let (mut bytes, mut records) = (0usize, 0u64);
                    for b in &r.batches {
                        if b.len() > budget && !first {
                            break;
                        }
                        budget = budget.saturating_sub(b.len());
                        first = false;
                        bytes += b.len();
                        // Stored batches passed validation; a header that does
                        // not parse counts no records rather than failing.
                        records += BatchHeader::parse(b)
                            .map_or(0, |h| u64::try_from(h.records_count).unwrap_or(0));
                        batches.push(b.clone());
                    }
                    if !batches.is_empty() {
                        core.metrics
                            .fetched(&wanted[offset_before + i].tp.topic, bytes, records);
                    }
                    let mut data = data
                        .with_high_watermark(r.high_watermark)
                        .with_last_stable_offset(r.high_watermark)
                        .with_aborted_transactions(Some(Vec::new()));
                    // The log start offset field exists from v5 on.
                    if version >= 5 {
                        data.log_start_offset = r.log_start_offset;
                    }
                    if let (Some((epoch, end_offset)), true) = (r.diverging, version >= 12) {
                        data.diverging_epoch = data
                            .diverging_epoch
                            .with_epoch(epoch)
                            .with_end_offset(end_offset);
                    }
                    if batches.is_empty() {
                        data.with_records(Some(Bytes::new()))
                    } else {
                        data.with_records(Some(splices.placeholder(batches)))
                    }
                }
            };
            partitions.push(data);
        }
        responses.push(
            FetchableTopicResponse::default()
                .with_topic(t.topic.clone())
                .with_partitions(partitions),
        );
    }
    FetchResponse::default().with_responses(responses)
}

async fn read_all(
    core: &CoreState,
    wanted: &[Wanted],
    reader: Reader,
) -> Vec<Result<PartitionRead, ResponseError>> {
    let topics = core.topics();
    join_all(wanted.iter().map(|w| {
        // A follower's epoch is checked by its leader role (replica::follower_fetch).
        let current_leader_epoch = match reader {
            Reader::Consumer => w.current_leader_epoch,
            Reader::Follower { .. } => -1,
        };
        let serves =
            super::check_leader_at(&topics, &w.tp.topic, w.tp.partition, current_leader_epoch)
                .map(|_| ());
        read_one(&core.shard, w.clone(), reader, serves)
    }))
    .await
}

async fn read_one(
    shard: &Rc<Shard>,
    w: Wanted,
    reader: Reader,
    serves: Result<(), ResponseError>,
) -> Result<PartitionRead, ResponseError> {
    serves?;
    let owner = shard.table().shard_of(&w.tp);
    shard
        .invoke_on(owner, move |shard| async move {
            let p = shard
                .local(&w.tp)
                .ok_or_else(|| LogError::UnknownPartition(w.tp.to_string()))?;
            let log_start_offset = p.log_start_offset().await?;
            match reader {
                Reader::Consumer => {
                    let high_watermark = p.high_watermark();
                    let read = p
                        .read(w.offset, w.max_bytes.max(1), high_watermark)
                        .await
                        .inspect_err(|e| on_read_error(&w.tp, e))?;
                    Ok::<_, FetchError>(PartitionRead {
                        high_watermark,
                        log_start_offset,
                        batches: read.batches,
                        seen: high_watermark,
                        diverging: None,
                    })
                }
                Reader::Follower { id } => {
                    // Our end offset for the epoch of the follower's last
                    // record: replica::follower_fetch decides whether its log
                    // diverges from ours (KIP-595: it then gets the diverging
                    // epoch and no data, and truncates before it fetches).
                    let epoch_end = if w.last_fetched_epoch >= 0 {
                        let (epoch, end) = p.epoch_end_offset(w.last_fetched_epoch).await?;
                        (epoch >= 0 && end >= 0).then_some((epoch, end))
                    } else {
                        None
                    };
                    let core = CoreState::current().ok_or(LogError::RuntimeStopped)?;
                    let fetch = FollowerFetch {
                        follower: id,
                        fetch_offset: w.offset,
                        last_fetched_epoch: w.last_fetched_epoch,
                        current_leader_epoch: w.current_leader_epoch,
                    };
                    let (high_watermark, diverging) =
                        crate::replica::follower_fetch(&core, &w.tp, fetch, epoch_end, &p)
                            .map_err(|r| FetchError::Refused(r.error))?;
                    if diverging.is_some() {
                        return Ok(PartitionRead {
                            high_watermark,
                            log_start_offset,
                            batches: Vec::new(),
                            seen: p.log_end(),
                            diverging,
                        });
                    }
                    let end = p.log_end();
                    let read = p
                        .read(w.offset, w.max_bytes.max(1), end)
                        .await
                        .inspect_err(|e| on_read_error(&w.tp, e))?;
                    Ok(PartitionRead {
                        high_watermark,
                        log_start_offset,
                        batches: read.batches,
                        seen: end,
                        diverging: None,
                    })
                }
            }
        })
        .await
        .map_err(|e| error_code(&e))?
        .map_err(|e| match e {
            FetchError::Log(e) => error_code(&e),
            FetchError::Refused(e) => e,
        })
}

/// On the owner core: a corrupt log is replication's business too.
fn on_read_error(tp: &TopicPartition, e: &LogError) {
    if matches!(e, LogError::Corrupt(_)) {
        crate::replica::corrupt_read(tp);
    }
}

#[derive(Debug)]
enum FetchError {
    Log(LogError),
    Refused(ResponseError),
}

impl From<LogError> for FetchError {
    fn from(e: LogError) -> Self {
        FetchError::Log(e)
    }
}

/// Waits until any partition's high watermark passes the value seen, or
/// `timeout`. Each waiter on an owner core ends by itself at the timeout, so
/// abandoned waiters do not pile up.
async fn wait_for_data(
    shard: &Rc<Shard>,
    seen: Vec<(TopicPartition, i64)>,
    timeout: Duration,
    follower: bool,
) {
    let mut waits: Vec<Pin<Box<dyn Future<Output = ()> + '_>>> = seen
        .into_iter()
        .map(|(tp, high_watermark)| {
            let owner = shard.table().shard_of(&tp);
            let wait: Pin<Box<dyn Future<Output = ()> + '_>> = Box::pin(async move {
                let _ = shard
                    .invoke_on(owner, move |shard| async move {
                        if let Some(p) = shard.local(&tp) {
                            if follower {
                                p.wait_for_end(high_watermark, timeout).await;
                            } else {
                                p.wait_for_data(high_watermark, timeout).await;
                            }
                        }
                    })
                    .await;
            });
            wait
        })
        .collect();
    waits.push(Box::pin(async move {
        glommio::timer::sleep(timeout).await;
    }));
    let _ = select_all(waits).await;
}
