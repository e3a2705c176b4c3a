//! `skiff-bench produce`: pipelined Produce requests over several connections.
//!
//! Each connection has a writer thread and a reader thread over one socket. The
//! writer sends prebuilt request frames (encoded once per partition group at
//! start) and only rewrites what must change per request: the correlation id, and
//! each batch's timestamps and CRC-32C (the timestamps let `e2e` measure
//! produce-to-consume latency). A token per in-flight slot bounds the requests in
//! flight; the reader matches responses in order, records latency and returns the
//! token.
//!
//! With `--rate`, request k of a connection has an intended send time fixed in
//! advance and its latency runs from that time, so a stalled server shows up as
//! latency rather than as fewer samples (no coordinated omission).
//!
//! `--idempotent` first asks InitProducerId for a producer id; the batches are
//! built with it and its epoch, and every send also stamps each batch's base
//! sequence (continuing its partition's, wrapping as Kafka does) before the
//! CRC it recomputes anyway. `--transactional-id` does the same with the
//! transactional bit set, as the producer of that id, and commits every
//! `--commit-interval-ms` (`txn.rs`: the writers send only while a
//! transaction is open). Without either flag a send does no more than before.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args as ClapArgs;
use hdrhistogram::Histogram;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{ProduceRequest, ProduceResponse, TopicName, TransactionalId};
use kafka_protocol::protocol::StrBytes;
use serde::Serialize;

use crate::kafka::{self, Cluster, CORRELATION_ID_AT};
use crate::stats::{self, Counters, Latency, Point, StopFlag};
use crate::txn::{self, Gate, TxnClient, MAX_IN_FLIGHT_IDEMPOTENT};
use crate::workload::{self, ConnectionPlan, Payload, ProducerStamp, WorkloadArgs};

/// Batch field positions rewritten per send (Kafka RecordBatch v2, laid out
/// in `skiff_engine::batch`, whose own constants are private to the engine).
const CRC_AT: usize = 17;
const CRC_FROM: usize = 21;
const BASE_TIMESTAMP_AT: usize = 27;
const MAX_TIMESTAMP_AT: usize = 35;
const BASE_SEQUENCE_AT: usize = 53;

/// Largest `--commit-interval-ms`.
const COMMIT_INTERVAL_MS_MAX: u64 = 300_000;

/// How long a produce request may wait on the server (Kafka's request.timeout).
const PRODUCE_TIMEOUT_MS: i32 = 30_000;

#[derive(ClapArgs, Debug, Clone)]
pub struct Args {
    #[command(flatten)]
    pub workload: WorkloadArgs,
    /// Idempotent producer: InitProducerId first, then every batch carries the
    /// producer id and epoch and its partition's next sequence number (at most
    /// 5 requests in flight per connection; needs --acks 1 or all).
    #[arg(long)]
    pub idempotent: bool,
    /// Transactional producer with this transactional.id (idempotent too):
    /// every transaction adds all the topic's partitions, produces for
    /// --commit-interval-ms, waits for every answer and commits.
    #[arg(long, value_name = "ID")]
    pub transactional_id: Option<String>,
    /// Milliseconds of producing per transaction before it commits.
    #[arg(long, default_value_t = 100, requires = "transactional_id")]
    pub commit_interval_ms: u64,
}

impl Args {
    pub fn mode(&self) -> Mode {
        match &self.transactional_id {
            Some(id) => Mode::Transactional {
                id: id.clone(),
                commit_interval: Duration::from_millis(self.commit_interval_ms),
            },
            None if self.idempotent => Mode::Idempotent,
            None => Mode::Plain,
        }
    }
}

/// Which producer writes: none (plain batches), an idempotent one, or a
/// transactional one committing every `commit_interval`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    Plain,
    Idempotent,
    Transactional {
        id: String,
        commit_interval: Duration,
    },
}

impl Mode {
    pub fn name(&self) -> &'static str {
        match self {
            Mode::Plain => "plain",
            Mode::Idempotent => "idempotent",
            Mode::Transactional { .. } => "transactional",
        }
    }

    /// Batches carry a producer id and sequence numbers.
    fn sequenced(&self) -> bool {
        *self != Mode::Plain
    }

    /// The transactional id a Produce request names (its batches are the
    /// transaction's).
    fn transactional_id(&self) -> Option<TransactionalId> {
        match self {
            Mode::Transactional { id, .. } => {
                Some(TransactionalId(StrBytes::from_string(id.clone())))
            }
            _ => None,
        }
    }

    /// Kafka's rules for an idempotent producer, that the flags can break.
    pub fn validate(&self, args: &WorkloadArgs) -> anyhow::Result<()> {
        if *self == Mode::Plain {
            return Ok(());
        }
        let what = self.name();
        anyhow::ensure!(
            args.acks != 0,
            "--acks 0 with an {what} producer: sequences and commits need every answer (use --acks all, as Kafka's producer requires, or 1)"
        );
        anyhow::ensure!(
            args.max_in_flight <= MAX_IN_FLIGHT_IDEMPOTENT,
            "--max-in-flight {} with an {what} producer: at most {MAX_IN_FLIGHT_IDEMPOTENT} requests may be in flight per connection (Kafka's max.in.flight.requests.per.connection limit for idempotence: a broker orders only a producer's last 5 batches per partition)",
            args.max_in_flight
        );
        if let Mode::Transactional {
            id,
            commit_interval,
        } = self
        {
            anyhow::ensure!(!id.is_empty(), "--transactional-id must not be empty");
            let ms = commit_interval.as_millis();
            anyhow::ensure!(
                (1..=u128::from(COMMIT_INTERVAL_MS_MAX)).contains(&ms),
                "--commit-interval-ms must be 1..={COMMIT_INTERVAL_MS_MAX}, not {ms}"
            );
        }
        Ok(())
    }
}

/// The transactions of a transactional run.
#[derive(Debug, Clone, Serialize)]
pub struct TxnReport {
    pub transactional_id: String,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub commit_interval_ms: u64,
    /// Transactions committed (EndTxn(commit) answered without error).
    pub committed: u64,
    /// AddPartitionsToTxn/EndTxn answers of CONCURRENT_TRANSACTIONS retried
    /// (the previous transaction's markers were still being written); other
    /// error codes count in the report's `errors`.
    pub retries: u64,
    /// The EndTxn(commit) round trip.
    pub commit_latency: Latency,
    /// AddPartitionsToTxn until it succeeded: mostly the wait for the
    /// previous transaction's markers.
    pub begin_latency: Latency,
}

#[derive(Debug, Clone, Serialize)]
pub struct ProduceReport {
    /// "plain", "idempotent" or "transactional".
    pub mode: &'static str,
    pub records: u64,
    pub payload_bytes: u64,
    pub wire_bytes: u64,
    pub requests: u64,
    /// Partition responses with an error code (their records are not counted).
    pub errors: u64,
    pub secs: f64,
    /// Record value MB/s, as Kafka's producer-perf-test reports it.
    pub mb_s: f64,
    /// Batch bytes on the wire per second (after compression).
    pub wire_mb_s: f64,
    pub records_s: f64,
    /// Request latency (acks=0 has none: the server never answers).
    pub latency: Latency,
    pub timeline: Vec<Point>,
    pub acks: String,
    pub compression: String,
    pub record_size: usize,
    pub batch_bytes: usize,
    pub records_per_batch: u64,
    pub partitions: usize,
    pub connections: usize,
    pub max_in_flight: usize,
    pub rate: Option<u64>,
    pub produce_version: i16,
    /// Transactional runs only.
    pub transactions: Option<TxnReport>,
}

pub struct ProduceOutcome {
    pub report: ProduceReport,
    pub histogram: Histogram<u64>,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let mode = args.mode();
    let w = &args.workload;
    w.validate()?;
    mode.validate(w)?;
    let cluster = Cluster::discover(&w.bootstrap, &w.topic, w.partitions, true)?;
    let outcome = produce_with(&cluster, w, &mode, None)?;
    print(&outcome.report, w.json)
}

pub fn print(report: &ProduceReport, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string(report)?);
        return Ok(());
    }
    let l = &report.latency;
    println!(
        "produce: {} records in {:.1} s, {:.0} records/s, {:.1} MB/s ({:.1} MB/s on the wire), acks={} compression={} mode={} {} errors",
        report.records, report.secs, report.records_s, report.mb_s, report.wire_mb_s, report.acks, report.compression, report.mode, report.errors
    );
    if l.count > 0 {
        println!(
            "latency ms: mean {:.2}  p50 {:.2}  p90 {:.2}  p99 {:.2}  p99.9 {:.2}  max {:.2}  ({} requests{})",
            l.mean_ms,
            l.p50_ms,
            l.p90_ms,
            l.p99_ms,
            l.p999_ms,
            l.max_ms,
            l.count,
            if report.rate.is_some() { ", from intended send times" } else { "" }
        );
    }
    if let Some(t) = &report.transactions {
        let (c, b) = (&t.commit_latency, &t.begin_latency);
        println!(
            "transactions: {} committed (transactional id {}, producer id {} epoch {}, every {} ms of produce)",
            t.committed, t.transactional_id, t.producer_id, t.producer_epoch, t.commit_interval_ms,
        );
        println!(
            "commit (EndTxn) ms: p50 {:.2}  p99 {:.2}  max {:.2};  begin (AddPartitionsToTxn, {} CONCURRENT_TRANSACTIONS retries) ms: p50 {:.2}  p99 {:.2}  max {:.2}",
            c.p50_ms, c.p99_ms, c.max_ms, t.retries, b.p50_ms, b.p99_ms, b.max_ms
        );
    }
    Ok(())
}

/// One prebuilt request: the whole frame and where its batches sit in it.
struct Template {
    frame: Vec<u8>,
    batch_positions: Vec<usize>,
    batch_len: usize,
    /// Idempotent and transactional runs: the next base sequence of each
    /// batch's partition (a partition is in one template only), by position.
    sequences: Option<Vec<i32>>,
    records_per_batch: i32,
    records: u64,
    payload_bytes: u64,
    wire_bytes: u64,
}

impl Template {
    /// Rewrites the correlation id and every batch's timestamps and CRC (and,
    /// when sequenced, its base sequence, then advances the partition's).
    fn stamp(&mut self, correlation_id: i32, timestamp_ms: i64) {
        self.frame[CORRELATION_ID_AT..CORRELATION_ID_AT + 4]
            .copy_from_slice(&correlation_id.to_be_bytes());
        let len = self.batch_len;
        match &mut self.sequences {
            None => {
                for &at in &self.batch_positions {
                    stamp_batch(&mut self.frame[at..at + len], timestamp_ms);
                }
            }
            Some(sequences) => {
                for (&at, sequence) in self.batch_positions.iter().zip(sequences) {
                    let batch = &mut self.frame[at..at + len];
                    batch[BASE_SEQUENCE_AT..BASE_SEQUENCE_AT + 4]
                        .copy_from_slice(&sequence.to_be_bytes());
                    stamp_batch(batch, timestamp_ms);
                    *sequence = next_sequence(*sequence, self.records_per_batch);
                }
            }
        }
    }
}

/// A batch's timestamps, then its CRC-32C over attributes..end (what
/// `skiff_engine::batch::validate` checks).
#[inline]
fn stamp_batch(batch: &mut [u8], timestamp_ms: i64) {
    batch[BASE_TIMESTAMP_AT..BASE_TIMESTAMP_AT + 8].copy_from_slice(&timestamp_ms.to_be_bytes());
    batch[MAX_TIMESTAMP_AT..MAX_TIMESTAMP_AT + 8].copy_from_slice(&timestamp_ms.to_be_bytes());
    let crc = crc32c::crc32c(&batch[CRC_FROM..]);
    batch[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_be_bytes());
}

/// The sequence after `records` records from `sequence`: past i32::MAX it
/// wraps to 0 (Kafka's `DefaultRecordBatch.incrementSequence`).
fn next_sequence(sequence: i32, records: i32) -> i32 {
    if sequence > i32::MAX - records {
        records - (i32::MAX - sequence) - 1
    } else {
        sequence + records
    }
}

/// The request templates of one connection: its partitions in groups of as many
/// batches as fit in `max_request_bytes` (at least one), balanced.
fn build_templates(
    cluster: &Cluster,
    plan: &ConnectionPlan,
    payload: &Payload,
    args: &WorkloadArgs,
    mode: &Mode,
) -> anyhow::Result<Vec<Template>> {
    let n = plan.partitions.len();
    let fit = (args.max_request_bytes / payload.batch.len().max(1)).clamp(1, n.max(1));
    let groups = n.div_ceil(fit).max(1);
    let per_group = n.div_ceil(groups).max(1);
    let mut templates = Vec::new();
    for group in plan.partitions.chunks(per_group) {
        let request = ProduceRequest::default()
            .with_transactional_id(mode.transactional_id())
            .with_acks(args.acks)
            .with_timeout_ms(PRODUCE_TIMEOUT_MS)
            .with_topic_data(vec![TopicProduceData::default()
                .with_name(TopicName(StrBytes::from_string(cluster.topic.clone())))
                .with_partition_data(
                    group
                        .iter()
                        .map(|&i| {
                            PartitionProduceData::default()
                                .with_index(cluster.partitions[i].0)
                                .with_records(Some(payload.batch.clone()))
                        })
                        .collect(),
                )]);
        let frame = kafka::encode_request(&request, cluster.versions.produce, 0)?.to_vec();
        // The batches are in the frame verbatim and in order; find each one after
        // the previous (what lies between them is a few bytes of framing).
        let mut batch_positions = Vec::with_capacity(group.len());
        let mut from = 0;
        for _ in group {
            let at = find(&frame[from..], &payload.batch)
                .map(|p| p + from)
                .context("a batch is missing from its encoded produce request")?;
            batch_positions.push(at);
            from = at + payload.batch.len();
        }
        let k = group.len() as u64;
        templates.push(Template {
            frame,
            sequences: mode.sequenced().then(|| vec![0; batch_positions.len()]),
            batch_positions,
            batch_len: payload.batch.len(),
            records_per_batch: i32::try_from(payload.records)
                .context("over 2^31 records in one batch")?,
            records: payload.records * k,
            payload_bytes: payload.payload_bytes * k,
            wire_bytes: payload.batch.len() as u64 * k,
        });
    }
    Ok(templates)
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || needle.len() > haystack.len() {
        return None;
    }
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// What the reader needs to know about a request it will see answered.
struct InFlight {
    correlation_id: i32,
    /// Latency runs from here: the intended send time (open loop) or the actual one.
    start: Instant,
    batches: usize,
    records_per_batch: u64,
    payload_bytes_per_batch: u64,
    wire_bytes_per_batch: u64,
}

/// Shared by the writers of one run: limits and the clock.
struct RunShared {
    start: Instant,
    start_wall_ms: i64,
    deadline: Instant,
    /// Records handed to writers so far, against `--num-records`.
    records_reserved: AtomicU64,
    num_records: Option<u64>,
    stop: Option<StopFlag>,
    /// A connection failed: the others stop too.
    failed: AtomicBool,
    /// Transactional runs: writers send only while a transaction is open.
    gate: Option<Gate>,
}

impl RunShared {
    /// Reserves `records` for one more request; false when the run is over.
    fn reserve(&self, records: u64) -> bool {
        if stats::stopped(&self.stop)
            || self.failed.load(Ordering::Relaxed)
            || Instant::now() >= self.deadline
        {
            return false;
        }
        match self.num_records {
            None => true,
            Some(limit) => self.records_reserved.fetch_add(records, Ordering::Relaxed) < limit,
        }
    }

    /// Nothing more will be reserved (the transaction loop's end).
    fn over(&self) -> bool {
        stats::stopped(&self.stop)
            || self.failed.load(Ordering::Relaxed)
            || Instant::now() >= self.deadline
            || self
                .num_records
                .is_some_and(|limit| self.records_reserved.load(Ordering::Relaxed) >= limit)
    }

    /// A connection failed: every writer stops (and none waits on the gate).
    fn fail(&self) {
        self.failed.store(true, Ordering::Relaxed);
        if let Some(gate) = &self.gate {
            gate.finish();
        }
    }

    fn wall_ms_at(&self, t: Instant) -> i64 {
        self.start_wall_ms + t.saturating_duration_since(self.start).as_millis() as i64
    }
}

/// Runs the plain produce workload against `cluster` and waits for every answer.
pub fn produce(
    cluster: &Cluster,
    args: &WorkloadArgs,
    stop: Option<StopFlag>,
) -> anyhow::Result<ProduceOutcome> {
    produce_with(cluster, args, &Mode::Plain, stop)
}

/// Runs the produce workload as `mode`'s producer and waits for every answer
/// (and, transactional, for the last commit).
pub fn produce_with(
    cluster: &Cluster,
    args: &WorkloadArgs,
    mode: &Mode,
    stop: Option<StopFlag>,
) -> anyhow::Result<ProduceOutcome> {
    mode.validate(args)?;
    // The producer id first: every batch is built with it.
    let mut txn_client = match mode {
        Mode::Transactional {
            id,
            commit_interval,
        } => {
            // Kafka's default transaction.timeout.ms, or more for long
            // commit intervals (a transaction lasts about one).
            let timeout_ms = (60_000 + commit_interval.as_millis()).min(i32::MAX as u128) as i32;
            Some(TxnClient::start(&args.bootstrap, id, timeout_ms)?)
        }
        _ => None,
    };
    let producer = match mode {
        Mode::Plain => None,
        Mode::Idempotent => Some(txn::init_idempotent(&args.bootstrap)?),
        Mode::Transactional { .. } => txn_client.as_ref().map(|c| c.producer),
    };
    let stamp = producer.map(|p| ProducerStamp {
        id: p.id,
        epoch: p.epoch,
        transactional: txn_client.is_some(),
    });
    let payload = workload::build_payload_for(args, stamp)?;
    let plans = workload::plan_connections(cluster, args.connections)?;
    let counters = Arc::new(Counters::default());
    let mut prepared = Vec::new();
    for plan in &plans {
        let templates = build_templates(cluster, plan, &payload, args, mode)?;
        let stream = kafka::connect_stream(&plan.address)?;
        prepared.push((templates, stream));
    }
    let start = Instant::now();
    let shared = Arc::new(RunShared {
        start,
        start_wall_ms: workload::wall_ms(),
        deadline: start + args.duration(),
        records_reserved: AtomicU64::new(0),
        num_records: args.num_records,
        stop,
        failed: AtomicBool::new(false),
        gate: txn_client.as_ref().map(|_| Gate::new()),
    });
    let rate_per_connection = args.rate.map(|r| r as f64 / plans.len() as f64);
    let connections = plans.len();
    let mut handles = Vec::new();
    for (index, (templates, stream)) in prepared.into_iter().enumerate() {
        let (thread_shared, counters) = (shared.clone(), counters.clone());
        let acks = args.acks;
        let version = cluster.versions.produce;
        let max_in_flight = args.max_in_flight;
        let sequenced = mode.sequenced();
        // Open loop: connections start staggered over one request interval.
        let stagger = index as f64 / connections as f64;
        let spawned = std::thread::Builder::new()
            .name(format!("produce-{index}"))
            .spawn(move || {
                connection(
                    templates,
                    stream,
                    thread_shared,
                    counters,
                    acks,
                    version,
                    max_in_flight,
                    sequenced,
                    rate_per_connection,
                    stagger,
                )
            });
        match spawned {
            Ok(h) => handles.push(h),
            Err(e) => {
                // The writers already started must not wait on the gate.
                shared.fail();
                for h in handles {
                    let _ = h.join();
                }
                return Err(e).context("spawning a producer thread");
            }
        }
    }
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (counters, done) = (counters.clone(), done.clone());
        let interval = stats::sample_interval(args.duration());
        std::thread::spawn(move || stats::sample_timeline(&counters, start, interval, &done))
    };
    // Transactional: this thread begins and commits the transactions while the
    // writers send.
    let txn_outcome = match (&mut txn_client, &shared.gate, mode) {
        (
            Some(client),
            Some(gate),
            Mode::Transactional {
                commit_interval, ..
            },
        ) => {
            let partitions: Vec<i32> = cluster.partitions.iter().map(|(p, _)| *p).collect();
            let over = || shared.over();
            let outcome = txn::run_transactions(
                client,
                &cluster.topic,
                &partitions,
                *commit_interval,
                gate,
                &over,
                &counters.errors,
            );
            if outcome.is_err() {
                shared.fail();
            }
            Some(outcome)
        }
        _ => None,
    };
    let mut histogram = stats::new_histogram()?;
    let mut first_error = None;
    for h in handles {
        match h.join() {
            Ok(Ok(hist)) => histogram
                .add(&hist)
                .map_err(|e| anyhow::anyhow!("merging histograms: {e}"))?,
            Ok(Err(e)) => {
                first_error.get_or_insert(e);
            }
            Err(_) => {
                first_error.get_or_insert_with(|| anyhow::anyhow!("a producer thread panicked"));
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    done.store(true, Ordering::Release);
    let timeline = sampler.join().unwrap_or_default();
    // A writer's error first: the transaction loop's then only says the run failed.
    if let Some(e) = first_error {
        return Err(e);
    }
    let txn_outcome = txn_outcome.transpose()?;
    let transactions = match (txn_outcome, &txn_client, mode) {
        (
            Some(t),
            Some(client),
            Mode::Transactional {
                id,
                commit_interval,
            },
        ) => Some(TxnReport {
            transactional_id: id.clone(),
            producer_id: client.producer.id,
            producer_epoch: client.producer.epoch,
            commit_interval_ms: commit_interval.as_millis() as u64,
            committed: t.committed,
            retries: t.retries,
            commit_latency: Latency::of(&t.commit),
            begin_latency: Latency::of(&t.begin),
        }),
        _ => None,
    };
    let records = counters.records.load(Ordering::Relaxed);
    let payload_bytes = counters.payload_bytes.load(Ordering::Relaxed);
    let wire_bytes = counters.wire_bytes.load(Ordering::Relaxed);
    let report = ProduceReport {
        mode: mode.name(),
        records,
        payload_bytes,
        wire_bytes,
        requests: counters.requests.load(Ordering::Relaxed),
        errors: counters.errors.load(Ordering::Relaxed),
        secs,
        mb_s: crate::mb_s(payload_bytes, secs),
        wire_mb_s: crate::mb_s(wire_bytes, secs),
        records_s: records as f64 / secs.max(1e-9),
        latency: Latency::of(&histogram),
        timeline,
        acks: args.acks_name().to_string(),
        compression: args.compression.name().to_string(),
        record_size: args.record_size,
        batch_bytes: payload.batch.len(),
        records_per_batch: payload.records,
        partitions: cluster.partitions.len(),
        connections,
        max_in_flight: args.max_in_flight,
        rate: args.rate,
        produce_version: cluster.versions.produce,
        transactions,
    };
    Ok(ProduceOutcome { report, histogram })
}

/// One connection: this thread writes, a second one reads the answers.
#[allow(clippy::too_many_arguments)]
fn connection(
    mut templates: Vec<Template>,
    stream: kafka::Stream,
    shared: Arc<RunShared>,
    counters: Arc<Counters>,
    acks: i16,
    version: i16,
    max_in_flight: usize,
    sequenced: bool,
    rate_per_connection: Option<f64>,
    stagger: f64,
) -> anyhow::Result<Histogram<u64>> {
    use std::io::Write;
    let read_half = match stream.try_clone() {
        Ok(r) => r,
        Err(e) => {
            shared.fail();
            return Err(e.into());
        }
    };
    let (tokens_tx, tokens_rx) = channel::<()>();
    let (inflight_tx, inflight_rx) = channel::<InFlight>();
    for _ in 0..max_in_flight {
        let _ = tokens_tx.send(());
    }
    let reader = if acks == 0 {
        drop(inflight_rx);
        None
    } else {
        let (counters, reader_shared) = (counters.clone(), shared.clone());
        let spawned = std::thread::Builder::new()
            .name("produce-reader".into())
            .spawn(move || {
                let shared = reader_shared;
                let read = read_responses(
                    read_half,
                    inflight_rx,
                    tokens_tx,
                    &counters,
                    version,
                    sequenced,
                    shared.gate.as_ref(),
                );
                if read.is_err() {
                    shared.fail();
                }
                read
            });
        match spawned {
            Ok(r) => Some(r),
            Err(e) => {
                shared.fail();
                return Err(e).context("spawning a response reader");
            }
        }
    };
    let mut writer = stream;
    let mut correlation_id: i32 = 0;
    // Seconds after start at which the next request is meant to go (open loop).
    let mut intended_s = rate_per_connection
        .map(|rate| stagger * templates.first().map_or(1, |t| t.records) as f64 / rate)
        .unwrap_or(0.0);
    let mut k = 0usize;
    let result = (|| -> anyhow::Result<()> {
        loop {
            let index = k % templates.len().max(1);
            let Some(template) = templates.get_mut(index) else {
                return Ok(());
            };
            let intended = shared.start + Duration::from_secs_f64(intended_s);
            if let Some(rate) = rate_per_connection {
                if intended >= shared.deadline {
                    return Ok(());
                }
                let now = Instant::now();
                if intended > now {
                    std::thread::sleep(intended - now);
                }
                intended_s += template.records as f64 / rate;
            }
            if let Some(gate) = &shared.gate {
                // Transactional: an in-flight slot, an open transaction, then
                // the records (acks is never 0 here).
                if tokens_rx.recv().is_err() {
                    return Ok(());
                }
                if !gate.enter() {
                    return Ok(());
                }
                if !shared.reserve(template.records) {
                    gate.leave();
                    return Ok(());
                }
            } else {
                if !shared.reserve(template.records) {
                    return Ok(());
                }
                if acks != 0 && tokens_rx.recv().is_err() {
                    // The reader has stopped (its error is reported by join).
                    return Ok(());
                }
            }
            let sent_at = Instant::now();
            let start = if rate_per_connection.is_some() {
                intended
            } else {
                sent_at
            };
            correlation_id = correlation_id.wrapping_add(1);
            template.stamp(correlation_id, shared.wall_ms_at(start));
            if acks != 0 {
                let n = template.batch_positions.len() as u64;
                let _ = inflight_tx.send(InFlight {
                    correlation_id,
                    start,
                    batches: template.batch_positions.len(),
                    records_per_batch: template.records / n.max(1),
                    payload_bytes_per_batch: template.payload_bytes / n.max(1),
                    wire_bytes_per_batch: template.wire_bytes / n.max(1),
                });
            }
            writer
                .write_all(&template.frame)
                .context("sending a produce request")?;
            if acks == 0 {
                counters.add(
                    template.records,
                    template.payload_bytes,
                    template.wire_bytes,
                );
            }
            k += 1;
        }
    })();
    drop(inflight_tx);
    if result.is_err() {
        shared.fail();
        // Unblock the reader: the answers to a half-written request never come.
        let _ = writer.tcp().shutdown(std::net::Shutdown::Both);
    }
    let histogram = match reader {
        Some(r) => r
            .join()
            .map_err(|_| anyhow::anyhow!("a response reader panicked"))??,
        None => stats::new_histogram()?,
    };
    result?;
    Ok(histogram)
}

/// Reads the answers of one connection in order. `sequenced` (idempotent or
/// transactional): a failed batch ends the run, since nothing is retried and
/// its partition's next batches would be OUT_OF_ORDER_SEQUENCE_NUMBER. With
/// a `gate`, each answer is reported to it.
fn read_responses(
    mut stream: kafka::Stream,
    inflight: Receiver<InFlight>,
    tokens: Sender<()>,
    counters: &Counters,
    version: i16,
    sequenced: bool,
    gate: Option<&Gate>,
) -> anyhow::Result<Histogram<u64>> {
    let mut histogram = stats::new_histogram()?;
    let mut logged_errors = 0;
    while let Ok(request) = inflight.recv() {
        let frame = kafka::read_frame(&mut stream)?;
        let now = Instant::now();
        let (correlation_id, response) =
            kafka::decode_response::<ProduceRequest, ProduceResponse>(frame, version)?;
        anyhow::ensure!(
            correlation_id == request.correlation_id,
            "produce response for correlation id {correlation_id}, expected {}",
            request.correlation_id
        );
        stats::record(&mut histogram, now - request.start, 1);
        let (mut ok, mut failed) = (0u64, 0u64);
        let mut first_failure = None;
        for topic in &response.responses {
            for p in &topic.partition_responses {
                if p.error_code == 0 {
                    ok += 1;
                } else {
                    failed += 1;
                    first_failure.get_or_insert((p.index, p.error_code));
                    if logged_errors < 5 {
                        logged_errors += 1;
                        tracing::warn!(
                            partition = p.index,
                            error = %kafka::error_name(p.error_code),
                            message = ?p.error_message,
                            "produce failed"
                        );
                    }
                }
            }
        }
        // A batch the response does not mention counts as failed too.
        let failed = failed.max((request.batches as u64).saturating_sub(ok));
        if failed > 0 {
            counters.errors.fetch_add(failed, Ordering::Relaxed);
        }
        counters.add(
            request.records_per_batch * ok,
            request.payload_bytes_per_batch * ok,
            request.wire_bytes_per_batch * ok,
        );
        if sequenced && failed > 0 {
            let (what, hint) = match first_failure {
                Some((partition, code)) => (
                    format!(
                        "partition {partition}: produce failed with {} (error code {code})",
                        kafka::error_name(code)
                    ),
                    txn::hint(code),
                ),
                None => ("a produce answer left out a batch".to_string(), ""),
            };
            if hint.is_empty() {
                anyhow::bail!(
                    "{what}; the load generator does not retry, so the partition's sequence has a gap every later batch would hit: ending the run"
                );
            }
            anyhow::bail!("{what}{hint}: ending the run");
        }
        if let Some(gate) = gate {
            gate.leave();
        }
        if tokens.send(()).is_err() {
            break;
        }
    }
    Ok(histogram)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::kafka::Versions;
    use bytes::{Buf, Bytes};
    use kafka_protocol::messages::RequestHeader;
    use kafka_protocol::protocol::{Decodable, HeaderVersion};
    use skiff_engine::batch::{self, Compression};
    use std::collections::BTreeMap;

    fn cluster(partitions: i32, produce_version: i16) -> Cluster {
        Cluster {
            topic: "t".into(),
            versions: Versions {
                produce: produce_version,
                fetch: 12,
                metadata: 12,
                list_offsets: 7,
                create_topics: 7,
                delete_topics: 5,
            },
            brokers: [(1, "127.0.0.1:9092".to_string())].into(),
            partitions: (0..partitions).map(|p| (p, 1)).collect(),
        }
    }

    /// The producer a sequenced run's batches are built with.
    const PRODUCER: ProducerStamp = ProducerStamp {
        id: 4242,
        epoch: 7,
        transactional: false,
    };

    /// A stamped frame, decoded.
    struct Decoded {
        correlation_id: i32,
        transactional_id: Option<String>,
        /// Per batch: its partition and header (after the broker's checks,
        /// CRC included).
        batches: Vec<(i32, batch::BatchHeader)>,
    }

    fn decode(frame: &[u8], version: i16) -> Decoded {
        let mut frame = Bytes::from(frame.to_vec());
        assert_eq!(frame.get_i32() as usize, frame.len());
        let header =
            RequestHeader::decode(&mut frame, ProduceRequest::header_version(version)).unwrap();
        let request = ProduceRequest::decode(&mut frame, version).unwrap();
        assert_eq!(request.acks, 1);
        let mut batches = Vec::new();
        for topic in &request.topic_data {
            for p in &topic.partition_data {
                let records = p.records.clone().unwrap();
                batches.push((p.index, batch::validate(&records).unwrap()));
            }
        }
        Decoded {
            correlation_id: header.correlation_id,
            transactional_id: request.transactional_id.map(|t| t.0.to_string()),
            batches,
        }
    }

    /// A stamped template is a valid Produce request whose every batch passes
    /// the broker's checks (CRC included) and carries the new timestamp; in
    /// the idempotent and transactional modes also the producer id and epoch,
    /// its partition's next sequence (continuing over successive requests),
    /// and in transactional mode only the transactional bit and the
    /// request's transactional id.
    #[test]
    fn stamped_templates_are_valid_requests() {
        let modes = [
            Mode::Plain,
            Mode::Idempotent,
            Mode::Transactional {
                id: "tx".into(),
                commit_interval: Duration::from_millis(100),
            },
        ];
        for mode in &modes {
            for (version, codec) in [
                (3, Compression::None),
                (8, Compression::Lz4),
                (11, Compression::Zstd),
            ] {
                let what = format!("{} v{version} {codec}", mode.name());
                let transactional = matches!(mode, Mode::Transactional { .. });
                let cluster = cluster(6, version);
                let mut args = WorkloadArgs::new("127.0.0.1:9092", "t");
                args.compression = codec;
                args.batch_bytes = 4096;
                args.record_size = 100;
                args.max_request_bytes = 10_000;
                let producer = mode.sequenced().then_some(ProducerStamp {
                    transactional,
                    ..PRODUCER
                });
                let payload = workload::build_payload_for(&args, producer).unwrap();
                let plans = workload::plan_connections(&cluster, 2).unwrap();
                assert_eq!(plans.len(), 2);
                let mut templates =
                    build_templates(&cluster, &plans[0], &payload, &args, mode).unwrap();
                // 3 partitions; as many batches per request as fit in 10 000 bytes.
                let fit = (10_000 / payload.batch.len()).clamp(1, 3);
                assert_eq!(templates.len(), 3usize.div_ceil(fit), "{what}");
                let mut next_sequence: BTreeMap<i32, i64> = BTreeMap::new();
                let mut seen = 0;
                for round in 0..3i64 {
                    for (i, t) in templates.iter_mut().enumerate() {
                        let correlation_id = 1000 + i as i32 + 10 * round as i32;
                        let timestamp = 1_700_000_000_123 + round;
                        t.stamp(correlation_id, timestamp);
                        let decoded = decode(&t.frame, version);
                        assert_eq!(decoded.correlation_id, correlation_id, "{what}");
                        assert_eq!(
                            decoded.transactional_id.as_deref(),
                            transactional.then_some("tx"),
                            "{what}"
                        );
                        assert_eq!(decoded.batches.len(), t.batch_positions.len(), "{what}");
                        for (partition, h) in decoded.batches {
                            seen += 1;
                            assert_eq!(h.base_timestamp, timestamp, "{what}");
                            assert_eq!(h.max_timestamp, timestamp, "{what}");
                            assert_eq!(h.records_count as u64, payload.records, "{what}");
                            assert_eq!(h.compression().unwrap(), codec, "{what}");
                            assert_eq!(h.is_transactional(), transactional, "{what}");
                            assert!(!h.is_control(), "{what}");
                            if mode.sequenced() {
                                assert_eq!(
                                    (h.producer_id, h.producer_epoch),
                                    (PRODUCER.id, PRODUCER.epoch),
                                    "{what}"
                                );
                                let expected = next_sequence.entry(partition).or_insert(0);
                                assert_eq!(
                                    i64::from(h.base_sequence),
                                    *expected,
                                    "{what}: partition {partition} round {round}"
                                );
                                *expected += i64::from(h.records_count);
                            } else {
                                assert_eq!(
                                    (h.producer_id, h.producer_epoch, h.base_sequence),
                                    (-1, -1, -1),
                                    "{what}"
                                );
                            }
                        }
                    }
                }
                // Every partition of the connection, in every round.
                assert_eq!(seen, 3 * plans[0].partitions.len(), "{what}");
                if mode.sequenced() {
                    assert_eq!(next_sequence.len(), plans[0].partitions.len(), "{what}");
                    let per_round = 3 * payload.records as i64;
                    assert!(next_sequence.values().all(|&s| s == per_round), "{what}");
                }
            }
        }
    }

    /// Sequences wrap past i32::MAX to 0, as Kafka's producer wraps them, and
    /// a stamped batch there still carries a valid CRC.
    #[test]
    fn sequences_wrap_as_kafka_does() {
        assert_eq!(next_sequence(0, 5), 5);
        assert_eq!(next_sequence(i32::MAX - 5, 5), i32::MAX);
        assert_eq!(next_sequence(i32::MAX, 1), 0);
        // MAX-2, MAX-1, MAX, 0, 1: the next batch starts at 2.
        assert_eq!(next_sequence(i32::MAX - 2, 5), 2);

        let cluster = cluster(1, 9);
        let mut args = WorkloadArgs::new("127.0.0.1:9092", "t");
        args.batch_bytes = 1000;
        args.record_size = 100;
        let payload = workload::build_payload_for(&args, Some(PRODUCER)).unwrap();
        let records = payload.records as i32;
        assert!(records > 2);
        let plans = workload::plan_connections(&cluster, 1).unwrap();
        let mut templates =
            build_templates(&cluster, &plans[0], &payload, &args, &Mode::Idempotent).unwrap();
        let t = &mut templates[0];
        t.sequences = Some(vec![i32::MAX - 1]);
        let mut bases = Vec::new();
        for k in 0..3 {
            t.stamp(k, 1_700_000_000_000);
            bases.push(decode(&t.frame, 9).batches[0].1.base_sequence);
        }
        assert_eq!(
            bases,
            vec![i32::MAX - 1, records - 2, 2 * records - 2],
            "{records} records a batch"
        );
    }

    /// The flags' modes, and Kafka's idempotence rules they may not break.
    #[test]
    fn modes_and_their_limits() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            args: Args,
        }
        let mode = |argv: &[&str]| {
            Cli::try_parse_from([&["produce"], argv].concat()).map(|c| (c.args.mode(), c.args))
        };
        assert_eq!(mode(&[]).unwrap().0, Mode::Plain);
        assert_eq!(mode(&["--idempotent"]).unwrap().0, Mode::Idempotent);
        let tx = Mode::Transactional {
            id: "bench-tx".into(),
            commit_interval: Duration::from_millis(100),
        };
        assert_eq!(mode(&["--transactional-id", "bench-tx"]).unwrap().0, tx);
        assert_eq!(
            mode(&["--idempotent", "--transactional-id", "bench-tx"])
                .unwrap()
                .0,
            tx
        );
        assert_eq!(
            mode(&["--transactional-id", "t", "--commit-interval-ms", "250"])
                .unwrap()
                .0,
            Mode::Transactional {
                id: "t".into(),
                commit_interval: Duration::from_millis(250),
            }
        );
        assert!(
            mode(&["--commit-interval-ms", "250"]).is_err(),
            "a commit interval without a transaction"
        );

        let (idempotent, args) = mode(&["--idempotent", "--acks", "all"]).unwrap();
        idempotent.validate(&args.workload).unwrap();
        let (_, args) = mode(&["--idempotent", "--acks", "0"]).unwrap();
        let e = idempotent.validate(&args.workload).unwrap_err().to_string();
        assert!(e.contains("--acks 0"), "{e}");
        let (_, args) = mode(&["--idempotent", "--max-in-flight", "6"]).unwrap();
        let e = idempotent.validate(&args.workload).unwrap_err().to_string();
        assert!(e.contains("at most 5"), "{e}");
        // The plain producer keeps its own limit.
        Mode::Plain.validate(&args.workload).unwrap();
        let (tx, args) = mode(&["--transactional-id", "t", "--commit-interval-ms", "0"]).unwrap();
        assert!(tx.validate(&args.workload).is_err());
        let (tx, args) = mode(&["--transactional-id", ""]).unwrap();
        assert!(tx.validate(&args.workload).is_err());
    }

    #[test]
    fn connections_split_partitions_by_leader() {
        let mut c = cluster(5, 9);
        c.brokers.insert(2, "127.0.0.2:9092".into());
        c.partitions = vec![(0, 1), (1, 2), (2, 1), (3, 2), (4, 1)];
        let plans = workload::plan_connections(&c, 4).unwrap();
        let mut seen: Vec<usize> = plans.iter().flat_map(|p| p.partitions.clone()).collect();
        seen.sort_unstable();
        assert_eq!(seen, vec![0, 1, 2, 3, 4]);
        assert!(plans.iter().all(|p| !p.partitions.is_empty()));
        for p in &plans {
            let leader = if p.address.starts_with("127.0.0.1") {
                1
            } else {
                2
            };
            assert!(p.partitions.iter().all(|&i| c.partitions[i].1 == leader));
        }
        // Exactly the connections asked for: 3 partitions on broker 1 get
        // 2.4 -> 2, broker 2's 2 get 1.6 -> 2 (the larger remainder).
        assert_eq!(plans.len(), 4);
        // 16 partitions over three leaders (6, 5, 5) with 4 connections: 2, 1, 1.
        c.brokers.insert(3, "127.0.0.3:9092".into());
        c.partitions = (0..16).map(|p| (p, [1, 2, 3][p as usize % 3])).collect();
        let plans = workload::plan_connections(&c, 4).unwrap();
        let per_broker = |prefix: &str| {
            plans
                .iter()
                .filter(|p| p.address.starts_with(prefix))
                .count()
        };
        assert_eq!(
            (
                per_broker("127.0.0.1"),
                per_broker("127.0.0.2"),
                per_broker("127.0.0.3")
            ),
            (2, 1, 1)
        );
        // Fewer connections than leaders: still one per leader.
        assert_eq!(workload::plan_connections(&c, 1).unwrap().len(), 3);
        // More connections than partitions: one partition each at most.
        assert_eq!(workload::plan_connections(&c, 50).unwrap().len(), 16);
    }
}
