//! Follower fetchers: one task per (core, leader node). It batches every
//! partition this core follows from that leader into one Fetch request
//! (replica id = this node, long poll), appends what comes back with the
//! leader's offsets and epochs, makes it durable, and reports the new end with
//! its next fetch, which is how the leader learns it (Kafka's pull model).
//!
//! ```text
//! loop: per partition, FollowerReplica::next_fetch (skiff-replication):
//!         a log end past the durable end (a former leader's unflushed
//!         appends) is flushed first, so the offset reported is durable;
//!         records without an epoch history are cut to the high watermark
//!       Fetch v12 { replica_id: me, per partition: fetch_offset = log end,
//!                   last_fetched_epoch = epoch of the last record,
//!                   current_leader_epoch }
//!         on a KIP-227 session (fetch_session::SessionBuilder): the first
//!         request names every partition; later ones only those whose
//!         position changed (and forget those no longer fetched), and the
//!         leader answers only partitions with something new. A session error
//!         or a new connection: the next request is full again
//!   -> a response is applied only if the log still ends at its fetch offset
//!      and we still follow that leader epoch (on_response)
//!   -> diverging_epoch: truncate where the logs part (on_diverging), fetch
//!      again from the new end with the new last epoch
//!   -> records: each batch at or past the log end and continuing the log
//!      where the fetch (or the batch before) left it (check_fetched_batch),
//!      else nothing more of this response is appended; append
//!      (AppendMode::Replica { log_end }: the engine checks it again under
//!      the log's lock, as a repair or truncation in another task may cut
//!      the log while the append waits), flush to the new end
//!   -> high watermark = min(leader's, our durable end)
//!   -> the leader's log start above ours: ours moves up (DeleteRecords-style)
//!   -> OFFSET_OUT_OF_RANGE (Kafka's handleOutOfRangeError): ask the leader
//!      (ListOffsets with our replica id); our log past the leader's end is
//!      cut to it; our log ending below the leader's log start (its retention
//!      or DeleteRecords ran while we were away) starts over, empty, there
//!      (truncate_fully_and_start_at); then fetch again
//!   -> NOT_LEADER / FENCED / UNKNOWN epoch: back off until the metadata moves
//! ```
//!
//! Bounds: one request in flight per fetcher, `FETCH_PARTITION_BYTES` per
//! partition, `FETCH_MAX_BYTES` per response.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use std::time::{Duration, Instant};

use crate::broker_link::{BrokerLink, SILENCE_MAX};
use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic, ForgottenTopic};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::{BrokerId, FetchRequest, ListOffsetsRequest, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use skiff_engine::batch::BatchHeader;
use skiff_engine::{AppendMode, LogError, Partition, TopicPartition};
use skiff_replication::{
    check_fetched_batch, FetchPosition, FetchedBatch, FollowerReplica, LocalLog, NextFetch,
};

use crate::fetch_session::{is_session_error, FetchParams, SessionBuilder};
use crate::replica::throttle::{self, Side};
use crate::state::CoreState;

const FETCH_VERSION: i16 = 12;
/// ListOffsets with current_leader_epoch (v4+); the leader answers a replica
/// id's "latest" with its log end (Kafka's rule for followers).
const LIST_OFFSETS_VERSION: i16 = 4;
const LATEST: i64 = -1;
const EARLIEST: i64 = -2;
const FETCH_WAIT_MS: i32 = 500;
const FETCH_PARTITION_BYTES: i32 = 1 << 20;
const FETCH_MAX_BYTES: i32 = 16 << 20;
/// After an error for a partition (leader moved, epoch fenced), wait this
/// long before asking again (the metadata usually arrives first).
const PARTITION_BACKOFF: Duration = Duration::from_millis(200);
const CONNECT_BACKOFF: Duration = Duration::from_millis(300);
struct Followed {
    /// The rules: fetch position, stale answers, divergence, what to append.
    replica: FollowerReplica,
    paused_until: Option<Instant>,
}

impl Followed {
    fn leader_epoch(&self) -> i32 {
        self.replica.leader_epoch()
    }
}

type Partitions = Rc<RefCell<BTreeMap<TopicPartition, Followed>>>;

thread_local! {
    /// leader node id -> the partitions this core follows from it.
    static FETCHERS: RefCell<HashMap<i32, Partitions>> = RefCell::new(HashMap::new());
}

/// Follows `tp` from `leader` at `leader_epoch` (starting the fetcher for that
/// leader on this core if there is none); `log` is the local log as it is now.
pub fn add(
    core: &Rc<CoreState>,
    tp: TopicPartition,
    leader: i32,
    leader_epoch: i32,
    log: LocalLog,
) {
    remove(&tp);
    let (partitions, start) = FETCHERS.with(|f| {
        let mut f = f.borrow_mut();
        match f.get(&leader) {
            Some(p) => (p.clone(), false),
            None => {
                let p: Partitions = Rc::new(RefCell::new(BTreeMap::new()));
                f.insert(leader, p.clone());
                (p, true)
            }
        }
    });
    partitions.borrow_mut().insert(
        tp,
        Followed {
            replica: FollowerReplica::new(leader, leader_epoch, log),
            paused_until: None,
        },
    );
    if start {
        glommio::spawn_local(run(core.clone(), leader, partitions)).detach();
    }
}

/// Stops following `tp` (it became leader, moved, or was deleted).
pub fn remove(tp: &TopicPartition) {
    FETCHERS.with(|f| {
        for partitions in f.borrow().values() {
            partitions.borrow_mut().remove(tp);
        }
    });
}

/// A fetcher's life: until it follows nothing (then it removes itself).
async fn run(core: Rc<CoreState>, leader: i32, partitions: Partitions) {
    let mut conn: Option<BrokerLink> = None;
    // KIP-227: after the first full fetch, each names only what changed.
    let mut session = SessionBuilder::new();
    loop {
        if partitions.borrow().is_empty() || core.stopping.get() {
            // The next `add` for this leader starts a new fetcher.
            FETCHERS.with(|f| {
                let mut f = f.borrow_mut();
                if f.get(&leader).is_some_and(|p| Rc::ptr_eq(p, &partitions)) {
                    f.remove(&leader);
                }
            });
            return;
        }
        if conn.is_none() {
            // The leader's address is looked up only to (re)connect.
            match BrokerLink::connect(&core, leader, "skiff-replica").await {
                Ok(link) => {
                    conn = Some(link);
                    // A new connection: close the old session, make a new one.
                    session.on_failure();
                }
                // A TLS handshake or a login that failed: certificates or
                // settings, not the network; say so where an operator looks.
                Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                    tracing::warn!(leader, error = %e, "TLS handshake with the leader");
                    glommio::timer::sleep(CONNECT_BACKOFF).await;
                    continue;
                }
                Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                    tracing::warn!(leader, error = %e, "logging in to the leader");
                    glommio::timer::sleep(CONNECT_BACKOFF).await;
                    continue;
                }
                Err(e) => {
                    tracing::debug!(leader, error = %e, "connecting to the leader");
                    glommio::timer::sleep(CONNECT_BACKOFF).await;
                    continue;
                }
            }
        }
        let Some(stream) = conn.as_mut() else {
            continue;
        };
        let request = match build_request(&core, &partitions, &mut session).await {
            Some(r) => r,
            None => {
                glommio::timer::sleep(PARTITION_BACKOFF).await;
                continue;
            }
        };
        let wait = Duration::from_millis(FETCH_WAIT_MS as u64);
        let response = match stream.call(&request, FETCH_VERSION, wait).await {
            Ok(r) => {
                let bytes: usize = r
                    .responses
                    .iter()
                    .flat_map(|t| &t.partitions)
                    .filter_map(|p| p.records.as_ref().map(Bytes::len))
                    .sum();
                super::count_fetch(bytes as u64, false);
                r
            }
            Err(e) => {
                session.on_failure();
                super::count_fetch(0, true);
                tracing::debug!(leader, error = %e, "fetch from the leader failed; reconnecting");
                conn = None;
                glommio::timer::sleep(CONNECT_BACKOFF).await;
                continue;
            }
        };
        if !session.on_response(response.error_code, response.session_id) {
            tracing::debug!(leader, error = response.error_code, "fetch refused");
            if !is_session_error(response.error_code) {
                glommio::timer::sleep(PARTITION_BACKOFF).await;
            }
            continue;
        }
        let mut out_of_range = Vec::new();
        for topic in response.responses {
            let name = topic.topic.0.to_string();
            for p in topic.partitions {
                let tp = TopicPartition::new(name.clone(), p.partition_index);
                // Only an answer to the log as it was asked for is applied.
                let log_end = core.shard.local(&tp).map(|p| p.log_end());
                let sent = partitions
                    .borrow_mut()
                    .get_mut(&tp)
                    .zip(log_end)
                    .and_then(|(f, end)| f.replica.on_response(end));
                let Some(sent) = sent else {
                    tracing::debug!(partition = %tp, leader, "dropping a stale fetch answer");
                    continue;
                };
                if p.error_code == ResponseError::OffsetOutOfRange.code() {
                    out_of_range.push((tp, p.log_start_offset));
                    continue;
                }
                let bytes = p.records.as_ref().map_or(0, Bytes::len);
                if bytes > 0 && follower_throttled(&core, &tp) {
                    let table = core.topics();
                    throttle::record(&table, Side::Follower, core.shard.table().shards(), bytes);
                }
                if let Err(e) = apply(&core, &partitions, &tp, sent, p).await {
                    tracing::warn!(partition = %tp, leader, error = %e, "applying fetched data");
                    pause(&partitions, &tp);
                }
            }
        }
        for (tp, leader_start) in out_of_range {
            let handled = handle_out_of_range(&core, &partitions, stream, &tp, leader_start).await;
            match handled {
                Ok(()) => {}
                Err(OutOfRangeError::Connection(e)) => {
                    tracing::debug!(leader, error = %e, "asking the leader for its offsets failed; reconnecting");
                    conn = None;
                    glommio::timer::sleep(CONNECT_BACKOFF).await;
                    break;
                }
                Err(e) => {
                    tracing::warn!(partition = %tp, leader, error = %e, "handling OFFSET_OUT_OF_RANGE");
                    pause(&partitions, &tp);
                }
            }
        }
    }
}

/// Whether this node's replica of `tp` is out of sync and named by its
/// topic's follower throttle (`throttle.rs`).
fn follower_throttled(core: &CoreState, tp: &TopicPartition) -> bool {
    let table = core.topics();
    let me = table.node_id;
    table.get(&tp.topic).is_some_and(|info| {
        throttle::is_throttled(info, Side::Follower, tp.partition, me)
            && info
                .assignment
                .get(usize::try_from(tp.partition).unwrap_or(usize::MAX))
                .is_some_and(|a| !a.isr.contains(&me))
    })
}

fn pause(partitions: &Partitions, tp: &TopicPartition) {
    if let Some(f) = partitions.borrow_mut().get_mut(tp) {
        f.paused_until = Some(Instant::now() + PARTITION_BACKOFF);
    }
}

/// The next fetch: every partition not paused, brought to where it may be
/// fetched from; on the session, only those whose position changed are
/// named (and those no longer fetched are forgotten). None: nothing to fetch.
async fn build_request(
    core: &CoreState,
    partitions: &Partitions,
    session: &mut SessionBuilder,
) -> Option<FetchRequest> {
    let now = Instant::now();
    // Throttled replicas are left out while the quota is used up (leaving
    // the session, so the leader does not answer them either).
    let quota_used_up = {
        let table = core.topics();
        throttle::exceeded(&table, Side::Follower, core.shard.table().shards())
    };
    let candidates: Vec<(TopicPartition, i32)> = partitions
        .borrow()
        .iter()
        .filter(|(_, f)| f.paused_until.is_none_or(|t| t <= now))
        .filter(|(tp, _)| !(quota_used_up && follower_throttled(core, tp)))
        .map(|(tp, f)| (tp.clone(), f.leader_epoch()))
        .collect();
    let mut wanted: BTreeMap<TopicPartition, FetchParams> = BTreeMap::new();
    for (tp, leader_epoch) in candidates {
        let Some(partition) = core.shard.local(&tp) else {
            continue;
        };
        let position = match prepare_fetch(partitions, &tp, &partition).await {
            Ok(Some(position)) => position,
            Ok(None) => continue,
            Err(e) => {
                tracing::warn!(partition = %tp, error = %e, "preparing the fetch");
                pause(partitions, &tp);
                continue;
            }
        };
        wanted.insert(
            tp,
            FetchParams {
                fetch_offset: position.fetch_offset,
                partition_max_bytes: FETCH_PARTITION_BYTES,
                current_leader_epoch: leader_epoch,
                last_fetched_epoch: position.last_fetched_epoch,
                log_start_offset: -1,
            },
        );
    }
    if wanted.is_empty() {
        return None;
    }
    let next = session.build(&wanted);
    let mut topics: Vec<FetchTopic> = Vec::new();
    for (tp, params) in next.send {
        let fp = FetchPartition::default()
            .with_partition(tp.partition)
            .with_current_leader_epoch(params.current_leader_epoch)
            .with_fetch_offset(params.fetch_offset)
            .with_last_fetched_epoch(params.last_fetched_epoch)
            .with_log_start_offset(params.log_start_offset)
            .with_partition_max_bytes(params.partition_max_bytes);
        match topics.last_mut() {
            Some(t) if t.topic.0.as_str() == tp.topic => t.partitions.push(fp),
            _ => topics.push(
                FetchTopic::default()
                    .with_topic(TopicName(StrBytes::from_string(tp.topic.clone())))
                    .with_partitions(vec![fp]),
            ),
        }
    }
    let mut forgotten: Vec<ForgottenTopic> = Vec::new();
    for tp in next.forget {
        match forgotten.last_mut() {
            Some(t) if t.topic.0.as_str() == tp.topic => t.partitions.push(tp.partition),
            _ => forgotten.push(
                ForgottenTopic::default()
                    .with_topic(TopicName(StrBytes::from_string(tp.topic.clone())))
                    .with_partitions(vec![tp.partition]),
            ),
        }
    }
    Some(
        FetchRequest::default()
            .with_replica_id(BrokerId(core.node.config.node_id))
            .with_max_wait_ms(FETCH_WAIT_MS)
            .with_min_bytes(1)
            .with_max_bytes(FETCH_MAX_BYTES)
            .with_isolation_level(0)
            .with_session_id(next.session_id)
            .with_session_epoch(next.epoch)
            .with_topics(topics)
            .with_forgotten_topics_data(forgotten),
    )
}

/// The log as the follower rules see it, read under one lock.
pub async fn local_log(partition: &Partition) -> Result<LocalLog, skiff_engine::LogError> {
    let (log_start_offset, log_end_offset, latest_epoch) = partition.epoch_position().await?;
    Ok(LocalLog {
        log_start_offset,
        log_end_offset,
        // Read right after, with no await between: the same moment.
        durable_end_offset: partition.durable_end(),
        latest_epoch,
    })
}

/// Brings the log to where it may be fetched from (`next_fetch`: the
/// unflushed tail of a former leader flushed, records without an epoch
/// history cut to the high watermark) and records the fetch as sent. `None`:
/// not followed any more.
async fn prepare_fetch(
    partitions: &Partitions,
    tp: &TopicPartition,
    partition: &Partition,
) -> Result<Option<FetchPosition>, skiff_engine::LogError> {
    // Each step moves the state on; two are the most a log needs.
    for _ in 0..3 {
        let log = local_log(partition).await?;
        let next = match partitions.borrow().get(tp) {
            Some(f) => f.replica.next_fetch(log),
            None => return Ok(None),
        };
        match next {
            NextFetch::Fetch(position) => {
                return Ok(partitions.borrow_mut().get_mut(tp).map(|f| {
                    f.replica.on_sent(position);
                    position
                }));
            }
            NextFetch::FlushTo(end) => partition.flush_to(end).await?,
            NextFetch::TruncateToHighWatermark => {
                let hw = partition.high_watermark();
                tracing::warn!(
                    partition = %tp, log_end_offset = log.log_end_offset, high_watermark = hw,
                    "the log has records but no leader-epoch history: truncating to the high watermark"
                );
                partition.truncate_to(hw).await?;
                if let Some(f) = partitions.borrow_mut().get_mut(tp) {
                    f.replica.on_truncated_to_high_watermark();
                }
            }
        }
    }
    Ok(None)
}

#[derive(Debug, thiserror::Error)]
enum ApplyError {
    #[error(transparent)]
    Log(#[from] skiff_engine::LogError),
    #[error("the leader answered {0:?}")]
    Leader(ResponseError),
    #[error("the leader answered error code {0}")]
    Code(i16),
    #[error(transparent)]
    Fetched(#[from] skiff_replication::ReplicationError),
}

async fn apply(
    core: &Rc<CoreState>,
    partitions: &Partitions,
    tp: &TopicPartition,
    sent: FetchPosition,
    p: kafka_protocol::messages::fetch_response::PartitionData,
) -> Result<(), ApplyError> {
    if !partitions.borrow().contains_key(tp) {
        return Ok(()); // stopped following meanwhile
    }
    let Some(partition) = core.shard.local(tp) else {
        return Ok(());
    };
    if p.error_code != 0 {
        return Err(match ResponseError::try_from_code(p.error_code) {
            Some(e) => ApplyError::Leader(e),
            None => ApplyError::Code(p.error_code),
        });
    }
    if p.diverging_epoch.epoch >= 0 {
        let diverging = (p.diverging_epoch.epoch, p.diverging_epoch.end_offset);
        truncate(partitions, tp, &partition, sent, diverging).await?;
        return Ok(());
    }
    let appended = match p.records.filter(|r| !r.is_empty()) {
        Some(records) => append_fetched(tp, &partition, sent.fetch_offset, records).await,
        None => Ok(false),
    };
    if appended.as_ref().is_ok_and(|a| *a) || appended.is_err() {
        // Durable before the next fetch reports this end to the leader
        // (also what was appended before a batch that did not fit).
        partition.flush_to(partition.log_end()).await?;
    }
    appended?;
    let hw = p.high_watermark.min(partition.durable_end());
    if hw >= 0 {
        partition.set_replicated_high_watermark(Some(hw));
    }
    // The leader's log start moved (retention, DeleteRecords): ours follows, up
    // to our high watermark (Kafka's maybeIncrementLogStartOffset), and the
    // segments wholly below it go.
    if p.log_start_offset >= 0 {
        let target = p.log_start_offset.min(partition.high_watermark());
        if target > partition.log_start_offset().await? {
            let start = partition.delete_records(target).await?;
            tracing::debug!(partition = %tp, log_start_offset = start, "following the leader's log start");
        }
    }
    Ok(())
}

/// Appends the fetched batches, each at or past our log end
/// (`check_fetched_batch`), and each continuing the log where the previous
/// one left it, from `fetch_offset`, the end the answer was asked for. A
/// batch below the end is an answer that does not continue this log, and a
/// log cut since the fetch (a repair or a truncation in another task, or
/// while the append waited for the log) is one the answer was not for:
/// nothing more of it is appended. Returns whether anything was.
async fn append_fetched(
    tp: &TopicPartition,
    partition: &Partition,
    fetch_offset: i64,
    records: Bytes,
) -> Result<bool, ApplyError> {
    let mut appended = false;
    let mut fetched_for = fetch_offset;
    let mut rest = records;
    while rest.len() >= skiff_engine::batch::BATCH_HEADER_LEN {
        let Ok(header) = BatchHeader::parse(&rest) else {
            break;
        };
        let len = header.total_len();
        if len > rest.len() {
            break; // a partial batch at the end, as Fetch allows
        }
        let batch = rest.split_to(len);
        let start = if header.base_offset < partition.log_end() {
            partition.log_start_offset().await?
        } else {
            partition.log_end()
        };
        let end = partition.log_end(); // after the await above
        match check_fetched_batch(
            fetched_for,
            start,
            end,
            header.base_offset,
            header.next_offset(),
        )? {
            FetchedBatch::Append => {}
            FetchedBatch::StartOverAt(base_offset) => {
                // Our empty log starts at the leader's log start, which is
                // inside this batch (DeleteRecords on the leader): as Kafka's
                // follower does, the log starts over at the batch's base
                // offset; the leader's log start is applied after.
                tracing::info!(
                    partition = %tp, log_start_offset = end, batch_base_offset = base_offset,
                    "the first batch starts before our empty log: starting the log at its base offset"
                );
                partition.truncate_fully_and_start_at(base_offset).await?;
                fetched_for = base_offset;
            }
            FetchedBatch::Stale => {
                tracing::info!(
                    partition = %tp, fetched_for, log_end_offset = end,
                    "the log was cut since the fetch was sent: dropping the rest of the answer"
                );
                break;
            }
        }
        let mode = AppendMode::Replica {
            log_end: fetched_for,
        };
        match partition
            .append_buffered(BytesMut::from(&batch[..]), mode)
            .await
        {
            Ok(info) => fetched_for = info.last_offset + 1,
            // Cut while the append waited for the log: the same as `Stale`.
            Err(LogError::ReplicaLogMoved { log_end_offset, .. }) => {
                tracing::info!(
                    partition = %tp, fetched_for, log_end_offset,
                    "the log was cut since the fetch was sent: dropping the rest of the answer"
                );
                break;
            }
            Err(e) => return Err(e.into()),
        }
        appended = true;
    }
    Ok(appended)
}

/// The leader says our logs part at `diverging` (its epoch and end offset for
/// the epoch of our last record, as sent in `sent`): cut our log where
/// Kafka's rule says. The next fetch asks from the new end with the epoch of
/// the new last record.
async fn truncate(
    partitions: &Partitions,
    tp: &TopicPartition,
    partition: &Partition,
    sent: FetchPosition,
    diverging: (i32, i64),
) -> Result<(), ApplyError> {
    let local_epochs = partition.epoch_entries().await?;
    let local_end = partition.log_end();
    let hw = partition.high_watermark();
    let Some(cut) = partitions.borrow().get(tp).map(|f| {
        f.replica
            .on_diverging(sent, &local_epochs, local_end, diverging, hw)
    }) else {
        return Ok(());
    };
    if cut < local_end {
        tracing::warn!(
            partition = %tp, from = local_end, to = cut,
            last_fetched_epoch = sent.last_fetched_epoch,
            leader_epoch_end = ?diverging,
            "truncating a divergent tail"
        );
    }
    // Also at the log end: an epoch entry without records there goes (the
    // leader never had that epoch).
    partition.truncate_to(cut).await?;
    Ok(())
}

#[derive(Debug, thiserror::Error)]
enum OutOfRangeError {
    /// The connection to the leader failed: reconnect.
    #[error(transparent)]
    Connection(#[from] std::io::Error),
    #[error(transparent)]
    Log(#[from] skiff_engine::LogError),
    #[error("ListOffsets answered error code {0}")]
    Code(i16),
    #[error("ListOffsets answered no offset for the partition")]
    Missing,
}

/// The leader answered OFFSET_OUT_OF_RANGE for our fetch offset (Kafka's
/// `handleOutOfRangeError` / `fetchOffsetAndTruncate`): our log end is past
/// the leader's end, or below its log start. Past its end: cut ours to it.
/// Below its start: nothing we hold is in the leader's log any more, so ours
/// starts over, empty, at the leader's log start, and the next fetch asks
/// from there. The leader's log start comes from the fetch response when it
/// carries one (`leader_start >= 0`), else from ListOffsets.
async fn handle_out_of_range(
    core: &Rc<CoreState>,
    partitions: &Partitions,
    link: &mut BrokerLink,
    tp: &TopicPartition,
    leader_start: i64,
) -> Result<(), OutOfRangeError> {
    let Some(leader_epoch) = partitions.borrow().get(tp).map(|f| f.leader_epoch()) else {
        return Ok(()); // stopped following meanwhile
    };
    let Some(partition) = core.shard.local(tp) else {
        return Ok(());
    };
    let local_end = partition.log_end();
    let me = core.node.config.node_id;
    // The questions take round trips: act only if we still follow this leader
    // at this epoch (a replica elected meanwhile keeps its log).
    let still = |partitions: &Partitions| {
        partitions
            .borrow()
            .get(tp)
            .is_some_and(|f| f.leader_epoch() == leader_epoch)
    };
    let leader_start = if leader_start > local_end {
        leader_start
    } else {
        let leader_end = list_offset(link, me, tp, leader_epoch, LATEST).await?;
        if leader_end < local_end && still(partitions) {
            tracing::warn!(
                partition = %tp, local_end, leader_end,
                "our log ends past the leader's: truncating to the leader's log end"
            );
            partition.truncate_to(leader_end).await?;
            reset_fetch_state(partitions, tp);
            return Ok(());
        }
        list_offset(link, me, tp, leader_epoch, EARLIEST).await?
    };
    let local_start = partition.log_start_offset().await?;
    if leader_start > local_end && still(partitions) {
        tracing::warn!(
            partition = %tp, local_start, local_end, leader_log_start = leader_start,
            "our log ends below the leader's log start: deleting it and starting over at the leader's log start"
        );
        partition.truncate_fully_and_start_at(leader_start).await?;
        // Producer state is rebuilt from the log when it is next needed.
        core.forget_partition(tp);
        reset_fetch_state(partitions, tp);
    } else {
        // Our end is inside the leader's log now (it moved between the fetch
        // and the questions), or leadership moved: fetch again after a pause.
        tracing::debug!(partition = %tp, local_end, leader_log_start = leader_start, "out of range no more");
        pause(partitions, tp);
    }
    Ok(())
}

/// After a truncation the partition is fetched again at once (from the new
/// log end, with the epoch of its new last record: `next_fetch`).
fn reset_fetch_state(partitions: &Partitions, tp: &TopicPartition) {
    if let Some(f) = partitions.borrow_mut().get_mut(tp) {
        f.paused_until = None;
    }
}

/// The leader's offset for `timestamp` (LATEST: its log end, as answered to a
/// replica id; EARLIEST: its log start).
async fn list_offset(
    link: &mut BrokerLink,
    me: i32,
    tp: &TopicPartition,
    leader_epoch: i32,
    timestamp: i64,
) -> Result<i64, OutOfRangeError> {
    let request = ListOffsetsRequest::default()
        .with_replica_id(BrokerId(me))
        .with_isolation_level(0)
        .with_topics(vec![ListOffsetsTopic::default()
            .with_name(TopicName(StrBytes::from_string(tp.topic.clone())))
            .with_partitions(vec![ListOffsetsPartition::default()
                .with_partition_index(tp.partition)
                .with_current_leader_epoch(leader_epoch)
                .with_timestamp(timestamp)])]);
    // A rare path (a follower below the leader's log start): the long limit.
    let response = link
        .call(&request, LIST_OFFSETS_VERSION, SILENCE_MAX)
        .await?;
    let p = response
        .topics
        .iter()
        .filter(|t| t.name.0.as_str() == tp.topic)
        .flat_map(|t| &t.partitions)
        .find(|p| p.partition_index == tp.partition)
        .ok_or(OutOfRangeError::Missing)?;
    if p.error_code != 0 {
        return Err(OutOfRangeError::Code(p.error_code));
    }
    if p.offset < 0 {
        return Err(OutOfRangeError::Missing);
    }
    Ok(p.offset)
}
