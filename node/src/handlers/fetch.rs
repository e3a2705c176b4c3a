//! Fetch for consumers (batches up to the high watermark) and for followers
//! (a replica id: batches up to the log end; the fetch offset tells the
//! leader how far the follower has come, `replica::follower_fetch`; a log
//! that parted from ours gets Fetch v12's diverging epoch instead of data),
//! long polling until `min_bytes` are available or `max_wait_ms` passes. Record batches travel as
//! the batch cache's own `Bytes` into the response (`Splices` placeholders), so a
//! cached fetch copies no record bytes in user space.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_channel::oneshot;
use futures_util::future::{join_all, select, select_all};
use kafka_protocol::messages::fetch_response::{
    AbortedTransaction, FetchableTopicResponse, PartitionData,
};
use kafka_protocol::messages::{FetchRequest, FetchResponse, ProducerId, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use skiff_engine::batch::BatchHeader;
use skiff_engine::{wait_for_any, LogError, LongPoll, Partition, Shard, TopicPartition};
use skiff_protocol::splice::Splices;
use skiff_replication::FollowerFetch;

use crate::fetch_session::{Answer, FetchContext, FetchParams, INVALID_SESSION_ID};
use crate::kafka::error_code;
use crate::replica::throttle::{self, Side};
use crate::state::CoreState;

/// Upper bound on one long poll, whatever the client asks.
const MAX_WAIT_MS_CAP: u64 = 30_000;

struct PartitionRead {
    high_watermark: i64,
    /// The partition's last stable offset (what a read_committed consumer
    /// reads below; the high watermark where no transaction is undecided).
    last_stable_offset: i64,
    /// For a read_committed consumer, the aborted transactions overlapping
    /// what was read (producer id, first offset); None for everyone else.
    aborted: Option<Vec<(i64, i64)>>,
    log_start_offset: i64,
    batches: Vec<Bytes>,
    /// What a long poll waits to pass: the high watermark for a consumer,
    /// the log end for a follower.
    seen: i64,
    /// The leader's (epoch, end offset) where a follower's log diverges.
    diverging: Option<(i32, i64)>,
}

/// Who is fetching: a consumer reads up to the high watermark, or with
/// isolation_level READ_COMMITTED (`committed`) up to the last stable offset,
/// with the aborted transactions it must skip; a follower (Fetch with a
/// replica id) reads up to the log end, and its fetch offset is its log end,
/// which the leader records.
#[derive(Debug, Clone, Copy)]
enum Reader {
    Consumer { committed: bool },
    Follower { id: i32 },
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
        // isolation_level exists from v4 on (READ_COMMITTED = 1).
        Reader::Consumer {
            committed: version >= 4 && request.isolation_level == 1,
        }
    };
    let topics = core.topics();
    let topic_name = |name: &TopicName, id: &uuid::Uuid| {
        if name.0.is_empty() {
            topics
                .by_id(*id)
                .map(|i| i.name.clone())
                .unwrap_or_default()
        } else {
            name.0.to_string()
        }
    };
    let mut named: Vec<(TopicPartition, FetchParams)> = Vec::new();
    for t in &request.topics {
        let name = topic_name(&t.topic, &t.topic_id);
        for p in &t.partitions {
            named.push((
                TopicPartition::new(name.clone(), p.partition),
                FetchParams {
                    fetch_offset: p.fetch_offset,
                    partition_max_bytes: p.partition_max_bytes,
                    current_leader_epoch: p.current_leader_epoch,
                    last_fetched_epoch: if version >= 12 {
                        p.last_fetched_epoch
                    } else {
                        -1
                    },
                    log_start_offset: p.log_start_offset,
                },
            ));
        }
    }

    // KIP-227: which partitions this fetch reads and answers.
    let context = if version >= 7 {
        let forgotten: Vec<TopicPartition> = request
            .forgotten_topics_data
            .iter()
            .flat_map(|t| {
                let name = topic_name(&t.topic, &t.topic_id);
                t.partitions
                    .iter()
                    .map(move |p| TopicPartition::new(name.clone(), *p))
            })
            .collect();
        core.fetch_sessions.borrow_mut().begin(
            request.session_id,
            request.session_epoch,
            &named,
            &forgotten,
            started,
        )
    } else {
        Ok(FetchContext::Full { create: false })
    };
    let (session, wanted) = match context {
        Ok(FetchContext::Full { create }) => (Session::Full { create }, named),
        Ok(FetchContext::Incremental {
            session_id,
            partitions,
        }) => (Session::Incremental(session_id), partitions),
        Err(e) => {
            tracing::debug!(error = %e, "fetch session refused");
            return FetchResponse::default()
                .with_error_code(e.code().code())
                .with_session_id(INVALID_SESSION_ID);
        }
    };

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
            .filter_map(|((tp, _), r)| r.as_ref().ok().map(|r| (tp.clone(), r.seen)))
            .collect();
        let what = match reader {
            Reader::Follower { .. } => LongPoll::LogEnd,
            // A read_committed consumer too: the last stable offset moves
            // only when the high watermark passes a marker.
            Reader::Consumer { .. } => LongPoll::HighWatermark,
        };
        wait_for_data(&core.shard, seen, max_wait - waited, what).await;
    };

    // Trim to max_bytes in the order read; the first non-empty partition
    // always gets at least one batch (KIP-74). An incremental answer names
    // only the partitions with something new.
    let mut budget = max_bytes;
    let mut first = true;
    let mut responses: Vec<FetchableTopicResponse> = Vec::new();
    let mut held: Vec<(TopicPartition, FetchParams, Answer)> = Vec::new();
    for ((tp, params), result) in wanted.into_iter().zip(results) {
        let (data, answer) =
            partition_data(core, &tp, result, version, &mut budget, &mut first, splices);
        let name_it = match session {
            Session::Incremental(id) => core.fetch_sessions.borrow_mut().respond(id, &tp, answer),
            Session::Full { .. } => true,
        };
        if name_it {
            match responses.last_mut() {
                Some(t) if t.topic.0.as_str() == tp.topic => t.partitions.push(data),
                _ => responses.push(
                    FetchableTopicResponse::default()
                        .with_topic(TopicName(StrBytes::from_string(tp.topic.clone())))
                        .with_partitions(vec![data]),
                ),
            }
        }
        if let Session::Full { create: true } = session {
            held.push((tp, params, answer));
        }
    }
    let session_id = match session {
        Session::Full { create: true } => core.fetch_sessions.borrow_mut().create(
            matches!(reader, Reader::Follower { .. }),
            held,
            Instant::now(),
        ),
        Session::Full { create: false } => INVALID_SESSION_ID,
        Session::Incremental(id) => id,
    };
    FetchResponse::default()
        .with_session_id(session_id)
        .with_responses(responses)
}

/// How this fetch stands to a KIP-227 session.
#[derive(Debug, Clone, Copy)]
enum Session {
    /// Every partition answered; `create`: make a session of them.
    Full { create: bool },
    /// Only what changed is answered.
    Incremental(i32),
}

/// One partition's answer, its batches trimmed to what is left of the
/// response's `budget`, and what a session compares of it.
fn partition_data(
    core: &CoreState,
    tp: &TopicPartition,
    result: Result<PartitionRead, ResponseError>,
    version: i16,
    budget: &mut usize,
    first: &mut bool,
    splices: &mut Splices,
) -> (PartitionData, Answer) {
    let data = PartitionData::default().with_partition_index(tp.partition);
    let r = match result {
        Err(e) => {
            let answer = Answer {
                records: false,
                high_watermark: -1,
                log_start_offset: -1,
                error: true,
                diverging: false,
            };
            let data = data
                .with_error_code(e.code())
                .with_high_watermark(-1)
                .with_last_stable_offset(-1);
            return (data, answer);
        }
        Ok(r) => r,
    };
    let mut batches = Vec::new();
    let (mut bytes, mut records) = (0usize, 0u64);
    for b in &r.batches {
        if b.len() > *budget && !*first {
            break;
        }
        *budget = budget.saturating_sub(b.len());
        *first = false;
        bytes += b.len();
        // Stored batches passed validation; a header that does not parse
        // counts no records rather than failing.
        records += BatchHeader::parse(b).map_or(0, |h| u64::try_from(h.records_count).unwrap_or(0));
        batches.push(b.clone());
    }
    if !batches.is_empty() {
        core.metrics.fetched(&tp.topic, bytes, records);
    }
    let aborted = r
        .aborted
        .unwrap_or_default()
        .into_iter()
        .map(|(producer_id, first_offset)| {
            AbortedTransaction::default()
                .with_producer_id(ProducerId(producer_id))
                .with_first_offset(first_offset)
        })
        .collect();
    let mut data = data
        .with_high_watermark(r.high_watermark)
        .with_last_stable_offset(r.last_stable_offset)
        .with_aborted_transactions(Some(aborted));
    // The log start offset field exists from v5 on.
    if version >= 5 {
        data.log_start_offset = r.log_start_offset;
    }
    let diverging = matches!((r.diverging, version >= 12), (Some(_), true));
    if let (Some((epoch, end_offset)), true) = (r.diverging, version >= 12) {
        data.diverging_epoch = data
            .diverging_epoch
            .with_epoch(epoch)
            .with_end_offset(end_offset);
    }
    let answer = Answer {
        records: !batches.is_empty(),
        high_watermark: r.high_watermark,
        log_start_offset: r.log_start_offset,
        error: false,
        diverging,
    };
    let data = if batches.is_empty() {
        data.with_records(Some(Bytes::new()))
    } else {
        data.with_records(Some(splices.placeholder(batches)))
    };
    (data, answer)
}

/// Reads every wanted partition: one call to each owner core, which reads
/// its partitions concurrently. Results come back in `wanted`'s order.
async fn read_all(
    core: &CoreState,
    wanted: &[(TopicPartition, FetchParams)],
    reader: Reader,
) -> Vec<Result<PartitionRead, ResponseError>> {
    let topics = core.topics();
    let mut results: Vec<Option<Result<PartitionRead, ResponseError>>> =
        (0..wanted.len()).map(|_| None).collect();
    let mut by_owner: BTreeMap<usize, Vec<(usize, TopicPartition, FetchParams)>> = BTreeMap::new();
    for (i, (tp, params)) in wanted.iter().enumerate() {
        // A follower's epoch is checked by its leader role (replica::follower_fetch).
        let current_leader_epoch = match reader {
            Reader::Consumer { .. } => params.current_leader_epoch,
            Reader::Follower { .. } => -1,
        };
        match super::check_leader_at(&topics, &tp.topic, tp.partition, current_leader_epoch) {
            Err(e) => results[i] = Some(Err(e)),
            Ok(_) => by_owner
                .entry(core.shard.table().shard_of(tp))
                .or_default()
                .push((i, tp.clone(), *params)),
        }
    }
    let shard = &core.shard;
    let reads = join_all(by_owner.into_iter().map(|(owner, items)| async move {
        let indexes: Vec<usize> = items.iter().map(|(i, _, _)| *i).collect();
        let answers = shard
            .invoke_on(owner, move |shard| async move {
                join_all(
                    items
                        .into_iter()
                        .map(|(_, tp, params)| read_local(&shard, tp, params, reader)),
                )
                .await
            })
            .await;
        (indexes, answers)
    }))
    .await;
    for (indexes, answers) in reads {
        match answers {
            Ok(answers) => {
                for (i, a) in indexes.into_iter().zip(answers) {
                    results[i] = Some(a);
                }
            }
            Err(e) => {
                for i in indexes {
                    results[i] = Some(Err(error_code(&e)));
                }
            }
        }
    }
    results
        .into_iter()
        .map(|r| r.unwrap_or(Err(ResponseError::UnknownServerError)))
        .collect()
}

/// On the owner core: one partition's read.
async fn read_local(
    shard: &Rc<Shard>,
    tp: TopicPartition,
    params: FetchParams,
    reader: Reader,
) -> Result<PartitionRead, ResponseError> {
    let max_bytes = (params.partition_max_bytes.max(0) as usize).max(1);
    let read = async {
        let p = shard
            .local(&tp)
            .ok_or_else(|| LogError::UnknownPartition(tp.to_string()))?;
        let log_start_offset = p.log_start_offset().await?;
        match reader {
            Reader::Consumer { committed } => {
                let high_watermark = p.high_watermark();
                let last_stable_offset = p.last_stable_offset().await?;
                let bound = if committed {
                    last_stable_offset
                } else {
                    high_watermark
                };
                let read = p
                    .read(params.fetch_offset, max_bytes, bound)
                    .await
                    .inspect_err(|e| on_read_error(&tp, e))?;
                let aborted = if !committed {
                    None
                } else if read.batches.is_empty() {
                    Some(Vec::new())
                } else {
                    let found = p
                        .aborted_transactions(params.fetch_offset, read.next_offset)
                        .await?;
                    Some(
                        found
                            .iter()
                            .map(|t| (t.producer_id, t.first_offset))
                            .collect(),
                    )
                };
                Ok::<_, FetchError>(PartitionRead {
                    high_watermark,
                    last_stable_offset,
                    aborted,
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
                let epoch_end = if params.last_fetched_epoch >= 0 {
                    let (epoch, end) = p.epoch_end_offset(params.last_fetched_epoch).await?;
                    (epoch >= 0 && end >= 0).then_some((epoch, end))
                } else {
                    None
                };
                let core = CoreState::current().ok_or(LogError::RuntimeStopped)?;
                let fetch = FollowerFetch {
                    follower: id,
                    fetch_offset: params.fetch_offset,
                    last_fetched_epoch: params.last_fetched_epoch,
                    current_leader_epoch: params.current_leader_epoch,
                };
                let (high_watermark, diverging) =
                    crate::replica::follower_fetch(&core, &tp, fetch, epoch_end, &p)
                        .map_err(|r| FetchError::Refused(r.error))?;
                if diverging.is_some() {
                    return Ok(PartitionRead {
                        high_watermark,
                        last_stable_offset: high_watermark,
                        aborted: None,
                        log_start_offset,
                        batches: Vec::new(),
                        seen: p.log_end(),
                        diverging,
                    });
                }
                let end = p.log_end();
                // A replica being added, out of sync, under a throttle: no
                // records while the quota is used up (replica/throttle.rs).
                let table = core.topics();
                let cores = shard.table().shards();
                let throttled = table.get(&tp.topic).is_some_and(|info| {
                    throttle::is_throttled(info, Side::Leader, tp.partition, table.node_id)
                }) && !crate::replica::in_isr(&tp, id);
                if throttled && throttle::exceeded(&table, Side::Leader, cores) {
                    return Ok(PartitionRead {
                        high_watermark,
                        last_stable_offset: high_watermark,
                        aborted: None,
                        log_start_offset,
                        batches: Vec::new(),
                        seen: end,
                        diverging: None,
                    });
                }
                let read = p
                    .read(params.fetch_offset, max_bytes, end)
                    .await
                    .inspect_err(|e| on_read_error(&tp, e))?;
                if throttled {
                    let bytes = read.batches.iter().map(Bytes::len).sum();
                    throttle::record(&table, Side::Leader, cores, bytes);
                }
                Ok(PartitionRead {
                    high_watermark,
                    last_stable_offset: high_watermark,
                    aborted: None,
                    log_start_offset,
                    batches: read.batches,
                    seen: end,
                    diverging: None,
                })
            }
        }
    };
    read.await.map_err(|e| match e {
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

/// Waits until any partition passes the offset its read saw (`what`: the
/// high watermark for a consumer, the log end for a follower), or `timeout`:
/// one waiting task per owner core, however many partitions. When the fetch
/// stops waiting, the other cores' waits are told to end at once.
async fn wait_for_data(
    shard: &Rc<Shard>,
    seen: Vec<(TopicPartition, i64)>,
    timeout: Duration,
    what: LongPoll,
) {
    let mut by_owner: BTreeMap<usize, Vec<(TopicPartition, i64)>> = BTreeMap::new();
    for (tp, offset) in seen {
        by_owner
            .entry(shard.table().shard_of(&tp))
            .or_default()
            .push((tp, offset));
    }
    // Dropped when this function returns, each on its wait's core: that
    // wait then ends.
    let mut cancels = Vec::with_capacity(by_owner.len());
    let mut waits: Vec<Pin<Box<dyn Future<Output = ()> + '_>>> = Vec::new();
    for (owner, items) in by_owner {
        let (cancel, cancelled) = oneshot::channel::<()>();
        cancels.push((owner, cancel));
        waits.push(Box::pin(async move {
            let _ = shard
                .invoke_on(owner, move |shard| async move {
                    let partitions: Vec<(Rc<Partition>, i64)> = items
                        .into_iter()
                        .filter_map(|(tp, offset)| shard.local(&tp).map(|p| (p, offset)))
                        .collect();
                    let wait = std::pin::pin!(wait_for_any(&partitions, what, timeout));
                    select(wait, cancelled).await;
                })
                .await;
        }));
    }
    waits.push(Box::pin(async move {
        glommio::timer::sleep(timeout).await;
    }));
    let _ = select_all(waits).await;
    // Dropped where the wait runs (`Shard::run_on`): dropping a sender wakes
    // its receiver's task, which must not happen from another core's thread.
    for (owner, cancel) in cancels {
        if owner == shard.id() {
            drop(cancel);
            continue;
        }
        let shard = shard.clone();
        glommio::spawn_local(async move { shard.run_on(owner, move || drop(cancel)).await })
            .detach();
    }
}
