//! `skiff-bench consume`: reads a topic from its earliest offsets with pipelined
//! Fetch requests, one thread per connection.
//!
//! A connection's partitions are split into up to `--max-in-flight` groups; each
//! group has one Fetch in flight at a time (the next offset of a partition is known
//! only from the previous answer), so up to `--max-in-flight` fetches are in flight
//! per connection. `e2e` uses the same consumer with one group per connection, as a
//! Kafka consumer does, so a long poll on a quiet partition never holds back the
//! answer for a busy one.

use crate::kafka::Stream;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args as ClapArgs;
use hdrhistogram::Histogram;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{BrokerId, FetchRequest, TopicName};
use kafka_protocol::protocol::StrBytes;
use serde::Serialize;
use skiff_engine::batch::{BatchHeader, BATCH_HEADER_LEN};

use crate::kafka::{self, Cluster};
use crate::stats::{self, Counters, Point, StopFlag};
use crate::workload::{self, WorkloadArgs};

/// Kafka error code: the fetch offset is outside the log.
const OFFSET_OUT_OF_RANGE: i16 = 1;
/// Bound on one fetch response's bytes over all its partitions (Kafka's
/// fetch.max.bytes default is 50 MiB).
const FETCH_MAX_BYTES: usize = 64 << 20;

#[derive(ClapArgs, Debug, Clone)]
pub struct Args {
    #[command(flatten)]
    pub workload: WorkloadArgs,
    /// Start over from the earliest offsets whenever the end is reached, until
    /// --duration runs out: measures reads of data the server has cached.
    #[arg(long)]
    pub repeat: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct ConsumeReport {
    pub records: u64,
    /// Record batch bytes received (what the server sent, compressed if the
    /// batches are).
    pub bytes: u64,
    pub secs: f64,
    pub mb_s: f64,
    pub records_s: f64,
    pub fetches: u64,
    /// Partition answers with an error code.
    pub errors: u64,
    /// Times the whole topic was read (with --repeat).
    pub passes: u64,
    pub timeline: Vec<Point>,
    pub partitions: usize,
    pub connections: usize,
    pub fetch_version: i16,
}

pub struct ConsumeOutcome {
    pub report: ConsumeReport,
    /// Produce-to-consume latency of every record seen (e2e only).
    pub e2e: Histogram<u64>,
}

/// Where reading ends.
#[derive(Clone)]
pub enum End {
    /// Fixed end offsets (indexed like `Cluster::partitions`); stop at `deadline`
    /// in any case.
    Fixed {
        offsets: Vec<i64>,
        deadline: Instant,
    },
    /// End offsets and a deadline published later (by `e2e` once producing is
    /// over); until then, read what comes.
    Later(Arc<OnceLock<(Vec<i64>, Instant)>>),
}

impl End {
    fn get(&self) -> Option<(&[i64], Instant)> {
        match self {
            End::Fixed { offsets, deadline } => Some((offsets, *deadline)),
            End::Later(cell) => cell.get().map(|(o, d)| (o.as_slice(), *d)),
        }
    }
}

pub struct ConsumeSpec {
    pub start_offsets: Vec<i64>,
    pub end: End,
    pub repeat: bool,
    /// Fetches in flight per connection (one per partition group).
    pub groups_per_connection: usize,
    pub max_wait_ms: i32,
    pub fetch_bytes: usize,
    /// Record produce-to-consume latency from batch timestamps.
    pub e2e: bool,
    pub stop: Option<StopFlag>,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let w = &args.workload;
    w.validate()?;
    let cluster = Cluster::discover(&w.bootstrap, &w.topic, w.partitions, true)?;
    let outcome = consume_topic(&cluster, w, args.repeat, None)?;
    print(&outcome.report, w.json)
}

/// Reads the topic from its earliest offsets to the end offsets it has now
/// (again and again with `repeat`), for at most `--duration`. An empty topic is
/// first filled by a produce phase of the same workload.
pub fn consume_topic(
    cluster: &Cluster,
    args: &WorkloadArgs,
    repeat: bool,
    stop: Option<StopFlag>,
) -> anyhow::Result<ConsumeOutcome> {
    let mut starts = cluster.list_offsets(-2)?;
    let mut ends = cluster.list_offsets(-1)?;
    if starts.iter().zip(&ends).all(|(s, e)| s >= e) {
        tracing::info!(topic = %cluster.topic, "the topic is empty: filling it with a produce phase first");
        crate::produce::produce(cluster, args, stop.clone())?;
        starts = cluster.list_offsets(-2)?;
        ends = cluster.list_offsets(-1)?;
    }
    let spec = ConsumeSpec {
        start_offsets: starts,
        end: End::Fixed {
            offsets: ends,
            deadline: Instant::now() + args.duration(),
        },
        repeat,
        groups_per_connection: args.max_in_flight,
        max_wait_ms: 500,
        fetch_bytes: args.fetch_bytes,
        e2e: false,
        stop,
    };
    consume(cluster, args.connections, spec)?.finish()
}

pub fn print(report: &ConsumeReport, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string(report)?);
        return Ok(());
    }
    println!(
        "consume: {} records, {:.1} MB in {:.1} s: {:.0} records/s, {:.1} MB/s ({} fetches, {} pass(es), {} errors)",
        report.records,
        report.bytes as f64 / 1e6,
        report.secs,
        report.records_s,
        report.mb_s,
        report.fetches,
        report.passes,
        report.errors
    );
    Ok(())
}

/// A consumer running on its threads; `finish` waits for it.
pub struct Running {
    start: Instant,
    handles: Vec<std::thread::JoinHandle<anyhow::Result<ConnectionResult>>>,
    counters: Arc<Counters>,
    done: Arc<AtomicBool>,
    sampler: std::thread::JoinHandle<Vec<Point>>,
    partitions: usize,
    fetch_version: i16,
}

struct ConnectionResult {
    e2e: Histogram<u64>,
    passes: u64,
}

impl Running {
    pub fn finish(self) -> anyhow::Result<ConsumeOutcome> {
        let mut e2e = stats::new_histogram()?;
        let mut passes = u64::MAX;
        let connections = self.handles.len();
        let mut first_error = None;
        for h in self.handles {
            match h.join() {
                Ok(Ok(r)) => {
                    e2e.add(&r.e2e)
                        .map_err(|e| anyhow::anyhow!("merging histograms: {e}"))?;
                    passes = passes.min(r.passes);
                }
                Ok(Err(e)) => {
                    first_error.get_or_insert(e);
                }
                Err(_) => {
                    first_error
                        .get_or_insert_with(|| anyhow::anyhow!("a consumer thread panicked"));
                }
            }
        }
        let secs = self.start.elapsed().as_secs_f64();
        self.done.store(true, Ordering::Release);
        let timeline = self.sampler.join().unwrap_or_default();
        if let Some(e) = first_error {
            return Err(e);
        }
        let records = self.counters.records.load(Ordering::Relaxed);
        let bytes = self.counters.wire_bytes.load(Ordering::Relaxed);
        Ok(ConsumeOutcome {
            report: ConsumeReport {
                records,
                bytes,
                secs,
                mb_s: crate::mb_s(bytes, secs),
                records_s: records as f64 / secs.max(1e-9),
                fetches: self.counters.requests.load(Ordering::Relaxed),
                errors: self.counters.errors.load(Ordering::Relaxed),
                passes: if passes == u64::MAX { 0 } else { passes },
                timeline,
                partitions: self.partitions,
                connections,
                fetch_version: self.fetch_version,
            },
            e2e,
        })
    }
}

/// Starts consumer threads (connections are open and the first fetches sent
/// before this returns).
pub fn consume(
    cluster: &Cluster,
    connections: usize,
    spec: ConsumeSpec,
) -> anyhow::Result<Running> {
    let plans = workload::plan_connections(cluster, connections)?;
    let counters = Arc::new(Counters::default());
    let spec = Arc::new(spec);
    let mut consumers = Vec::new();
    for plan in &plans {
        let parts: Vec<PartState> = plan
            .partitions
            .iter()
            .map(|&index| PartState {
                index,
                partition: cluster.partitions[index].0,
                next: spec.start_offsets[index],
                done: false,
                wraps: 0,
            })
            .collect();
        let groups = spec.groups_per_connection.clamp(1, parts.len().max(1));
        let mut c = Consumer {
            stream: kafka::connect_stream(&plan.address)?,
            topic: TopicName(StrBytes::from_string(cluster.topic.clone())),
            version: cluster.versions.fetch,
            groups: (0..groups)
                .map(|g| (g..parts.len()).step_by(groups).collect())
                .collect(),
            parts,
            queue: VecDeque::new(),
            correlation_id: 0,
            spec: spec.clone(),
            counters: counters.clone(),
            e2e: stats::new_histogram()?,
            logged_errors: 0,
        };
        c.apply_end();
        for g in 0..c.groups.len() {
            c.send(g)?;
        }
        consumers.push(c);
    }
    let start = Instant::now();
    let handles = consumers
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            std::thread::Builder::new()
                .name(format!("consume-{i}"))
                .spawn(move || c.run())
                .context("spawning a consumer thread")
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let done = Arc::new(AtomicBool::new(false));
    let interval = match &spec.end {
        End::Fixed { deadline, .. } => {
            stats::sample_interval(deadline.saturating_duration_since(start))
        }
        End::Later(_) => Duration::from_millis(250),
    };
    let sampler = {
        let (counters, done) = (counters.clone(), done.clone());
        std::thread::spawn(move || stats::sample_timeline(&counters, start, interval, &done))
    };
    Ok(Running {
        start,
        handles,
        counters,
        done,
        sampler,
        partitions: cluster.partitions.len(),
        fetch_version: cluster.versions.fetch,
    })
}

struct PartState {
    /// Index into `Cluster::partitions` (and the offset vectors).
    index: usize,
    partition: i32,
    next: i64,
    done: bool,
    /// Times this partition reached its end offset.
    wraps: u64,
}

struct Consumer {
    stream: Stream,
    topic: TopicName,
    version: i16,
    parts: Vec<PartState>,
    /// Indices into `parts`; each group has at most one fetch in flight.
    groups: Vec<Vec<usize>>,
    /// Groups with a fetch in flight, in send order (answers come in order).
    queue: VecDeque<(usize, i32)>,
    correlation_id: i32,
    spec: Arc<ConsumeSpec>,
    counters: Arc<Counters>,
    e2e: Histogram<u64>,
    logged_errors: u32,
}

impl Consumer {
    fn run(mut self) -> anyhow::Result<ConnectionResult> {
        while let Some((group, correlation_id)) = self.queue.pop_front() {
            let frame = kafka::read_frame(&mut self.stream)?;
            let now_us = workload::wall_us();
            let (answered, response) = kafka::decode_fetch_response(frame, self.version)?;
            anyhow::ensure!(
                answered == correlation_id,
                "fetch response for correlation id {answered}, expected {correlation_id}"
            );
            kafka::check(response.error_code, "fetch")?;
            self.counters.requests.fetch_add(1, Ordering::Relaxed);
            for topic in &response.responses {
                for p in &topic.partitions {
                    self.take(p, now_us)?;
                }
            }
            self.apply_end();
            let over = stats::stopped(&self.spec.stop)
                || self
                    .spec
                    .end
                    .get()
                    .is_some_and(|(_, deadline)| Instant::now() >= deadline);
            if !over {
                self.send(group)?;
            }
        }
        Ok(ConnectionResult {
            passes: self.passes(),
            e2e: self.e2e,
        })
    }

    /// Marks partitions at their end offset done (or starts them over).
    fn apply_end(&mut self) {
        let Some((ends, _)) = self.spec.end.get() else {
            return;
        };
        for p in &mut self.parts {
            let (start, end) = (self.spec.start_offsets[p.index], ends[p.index]);
            if !p.done && p.next >= end {
                if self.spec.repeat && end > start {
                    p.next = start;
                    p.wraps += 1;
                } else {
                    p.done = true;
                    p.wraps = p.wraps.max(1);
                }
            }
        }
    }

    /// Whole passes over every partition of this connection.
    fn passes(&self) -> u64 {
        self.parts.iter().map(|p| p.wraps).min().unwrap_or(0)
    }

    /// One partition's answer: count the records past the fetch offset, move on.
    fn take(
        &mut self,
        answer: &kafka_protocol::messages::fetch_response::PartitionData,
        now_us: i64,
    ) -> anyhow::Result<()> {
        let Some(part) = self
            .parts
            .iter_mut()
            .find(|p| p.partition == answer.partition_index)
        else {
            anyhow::bail!(
                "fetch answered partition {} it was not asked for",
                answer.partition_index
            );
        };
        if answer.error_code != 0 {
            self.counters.errors.fetch_add(1, Ordering::Relaxed);
            if self.logged_errors < 5 {
                self.logged_errors += 1;
                tracing::warn!(partition = part.partition, error = %kafka::error_name(answer.error_code), "fetch failed");
            }
            if answer.error_code == OFFSET_OUT_OF_RANGE {
                // Retention or a deletion moved the start: continue from there.
                part.next = part.next.max(answer.log_start_offset);
            }
            return Ok(());
        }
        let end = self
            .spec
            .end
            .get()
            .map_or(i64::MAX, |(ends, _)| ends[part.index]);
        let Some(records) = &answer.records else {
            return Ok(());
        };
        let mut rest: &[u8] = records;
        let (mut count_total, mut bytes_total) = (0u64, 0u64);
        while rest.len() >= BATCH_HEADER_LEN {
            let h = BatchHeader::parse(rest).with_context(|| {
                format!(
                    "partition {} offset {}: not a v2 record batch",
                    part.partition, part.next
                )
            })?;
            let total = h.total_len();
            if total > rest.len() {
                break; // a partial batch at the end of the answer
            }
            let last = h.last_offset();
            if last >= part.next {
                let first = h.base_offset.max(part.next);
                let count = (last.min(end - 1) + 1 - first).max(0) as u64;
                count_total += count;
                bytes_total += total as u64;
                if self.spec.e2e && count > 0 {
                    let us = (now_us - h.base_timestamp.saturating_mul(1000)).max(0) as u64;
                    stats::record(&mut self.e2e, Duration::from_micros(us), count);
                }
                part.next = last + 1;
            }
            rest = &rest[total..];
        }
        if count_total > 0 || bytes_total > 0 {
            self.counters
                .records
                .fetch_add(count_total, Ordering::Relaxed);
            self.counters
                .payload_bytes
                .fetch_add(bytes_total, Ordering::Relaxed);
            self.counters
                .wire_bytes
                .fetch_add(bytes_total, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Sends the next fetch of `group`, unless all its partitions are done.
    fn send(&mut self, group: usize) -> anyhow::Result<()> {
        use std::io::Write;
        let active: Vec<usize> = self.groups[group]
            .iter()
            .copied()
            .filter(|&i| !self.parts[i].done)
            .collect();
        if active.is_empty() {
            return Ok(());
        }
        let request = FetchRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_max_wait_ms(self.spec.max_wait_ms)
            .with_min_bytes(1)
            .with_max_bytes((self.spec.fetch_bytes * active.len()).min(FETCH_MAX_BYTES) as i32)
            .with_topics(vec![FetchTopic::default()
                .with_topic(self.topic.clone())
                .with_partitions(
                    active
                        .iter()
                        .map(|&i| {
                            FetchPartition::default()
                                .with_partition(self.parts[i].partition)
                                .with_fetch_offset(self.parts[i].next)
                                .with_partition_max_bytes(self.spec.fetch_bytes as i32)
                        })
                        .collect(),
                )]);
        self.correlation_id = self.correlation_id.wrapping_add(1);
        let frame = kafka::encode_request(&request, self.version, self.correlation_id)?;
        self.stream
            .write_all(&frame)
            .context("sending a fetch request")?;
        self.queue.push_back((group, self.correlation_id));
        Ok(())
    }
}
