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

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use hdrhistogram::Histogram;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{ProduceRequest, ProduceResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use serde::Serialize;

use crate::kafka::{self, Cluster, CORRELATION_ID_AT};
use crate::stats::{self, Counters, Latency, Point, StopFlag};
use crate::workload::{self, ConnectionPlan, Payload, WorkloadArgs};

/// Batch field positions rewritten per send (Kafka RecordBatch v2).
const CRC_AT: usize = 17;
const CRC_FROM: usize = 21;
const BASE_TIMESTAMP_AT: usize = 27;
const MAX_TIMESTAMP_AT: usize = 35;

/// How long a produce request may wait on the server (Kafka's request.timeout).
const PRODUCE_TIMEOUT_MS: i32 = 30_000;

#[derive(Debug, Clone, Serialize)]
pub struct ProduceReport {
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
}

pub struct ProduceOutcome {
    pub report: ProduceReport,
    pub histogram: Histogram<u64>,
}

pub fn run(args: WorkloadArgs) -> anyhow::Result<()> {
    args.validate()?;
    let cluster = Cluster::discover(&args.bootstrap, &args.topic, args.partitions, true)?;
    let outcome = produce(&cluster, &args, None)?;
    print(&outcome.report, args.json)
}

pub fn print(report: &ProduceReport, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string(report)?);
        return Ok(());
    }
    let l = &report.latency;
    println!(
        "produce: {} records in {:.1} s, {:.0} records/s, {:.1} MB/s ({:.1} MB/s on the wire), acks={} compression={} {} errors",
        report.records, report.secs, report.records_s, report.mb_s, report.wire_mb_s, report.acks, report.compression, report.errors
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
    Ok(())
}

/// One prebuilt request: the whole frame and where its batches sit in it.
struct Template {
    frame: Vec<u8>,
    batch_positions: Vec<usize>,
    batch_len: usize,
    records: u64,
    payload_bytes: u64,
    wire_bytes: u64,
}

impl Template {
    /// Rewrites the correlation id and every batch's timestamps and CRC.
    fn stamp(&mut self, correlation_id: i32, timestamp_ms: i64) {
        self.frame[CORRELATION_ID_AT..CORRELATION_ID_AT + 4]
            .copy_from_slice(&correlation_id.to_be_bytes());
        for &at in &self.batch_positions {
            let batch = &mut self.frame[at..at + self.batch_len];
            batch[BASE_TIMESTAMP_AT..BASE_TIMESTAMP_AT + 8]
                .copy_from_slice(&timestamp_ms.to_be_bytes());
            batch[MAX_TIMESTAMP_AT..MAX_TIMESTAMP_AT + 8]
                .copy_from_slice(&timestamp_ms.to_be_bytes());
            let crc = crc32c::crc32c(&batch[CRC_FROM..]);
            batch[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_be_bytes());
        }
    }
}

/// The request templates of one connection: its partitions in groups of as many
/// batches as fit in `max_request_bytes` (at least one), balanced.
fn build_templates(
    cluster: &Cluster,
    plan: &ConnectionPlan,
    payload: &Payload,
    args: &WorkloadArgs,
) -> anyhow::Result<Vec<Template>> {
    let n = plan.partitions.len();
    let fit = (args.max_request_bytes / payload.batch.len().max(1)).clamp(1, n.max(1));
    let groups = n.div_ceil(fit).max(1);
    let per_group = n.div_ceil(groups).max(1);
    let mut templates = Vec::new();
    for group in plan.partitions.chunks(per_group) {
        let request = ProduceRequest::default()
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
            batch_positions,
            batch_len: payload.batch.len(),
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
}

impl RunShared {
    /// Reserves `records` for one more request; false when the run is over.
    fn reserve(&self, records: u64) -> bool {
        if stats::stopped(&self.stop) || Instant::now() >= self.deadline {
            return false;
        }
        match self.num_records {
            None => true,
            Some(limit) => self.records_reserved.fetch_add(records, Ordering::Relaxed) < limit,
        }
    }

    fn wall_ms_at(&self, t: Instant) -> i64 {
        self.start_wall_ms + t.saturating_duration_since(self.start).as_millis() as i64
    }
}

/// Runs the produce workload against `cluster` and waits for every answer.
pub fn produce(
    cluster: &Cluster,
    args: &WorkloadArgs,
    stop: Option<StopFlag>,
) -> anyhow::Result<ProduceOutcome> {
    let payload = workload::build_payload(args)?;
    let plans = workload::plan_connections(cluster, args.connections)?;
    let counters = Arc::new(Counters::default());
    let mut prepared = Vec::new();
    for plan in &plans {
        let templates = build_templates(cluster, plan, &payload, args)?;
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
    });
    let rate_per_connection = args.rate.map(|r| r as f64 / plans.len() as f64);
    let connections = plans.len();
    let mut handles = Vec::new();
    for (index, (templates, stream)) in prepared.into_iter().enumerate() {
        let (shared, counters) = (shared.clone(), counters.clone());
        let acks = args.acks;
        let version = cluster.versions.produce;
        let max_in_flight = args.max_in_flight;
        // Open loop: connections start staggered over one request interval.
        let stagger = index as f64 / connections as f64;
        handles.push(
            std::thread::Builder::new()
                .name(format!("produce-{index}"))
                .spawn(move || {
                    connection(
                        templates,
                        stream,
                        shared,
                        counters,
                        acks,
                        version,
                        max_in_flight,
                        rate_per_connection,
                        stagger,
                    )
                })
                .context("spawning a producer thread")?,
        );
    }
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (counters, done) = (counters.clone(), done.clone());
        let interval = stats::sample_interval(args.duration());
        std::thread::spawn(move || stats::sample_timeline(&counters, start, interval, &done))
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
    if let Some(e) = first_error {
        return Err(e);
    }
    let records = counters.records.load(Ordering::Relaxed);
    let payload_bytes = counters.payload_bytes.load(Ordering::Relaxed);
    let wire_bytes = counters.wire_bytes.load(Ordering::Relaxed);
    let report = ProduceReport {
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
    rate_per_connection: Option<f64>,
    stagger: f64,
) -> anyhow::Result<Histogram<u64>> {
    use std::io::Write;
    let read_half = stream.try_clone()?;
    let (tokens_tx, tokens_rx) = channel::<()>();
    let (inflight_tx, inflight_rx) = channel::<InFlight>();
    for _ in 0..max_in_flight {
        let _ = tokens_tx.send(());
    }
    let reader = if acks == 0 {
        drop(inflight_rx);
        None
    } else {
        let counters = counters.clone();
        Some(
            std::thread::Builder::new()
                .name("produce-reader".into())
                .spawn(move || {
                    read_responses(read_half, inflight_rx, tokens_tx, &counters, version)
                })
                .context("spawning a response reader")?,
        )
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
            if !shared.reserve(template.records) {
                return Ok(());
            }
            if acks != 0 && tokens_rx.recv().is_err() {
                // The reader has stopped (its error is reported by join).
                return Ok(());
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

fn read_responses(
    mut stream: kafka::Stream,
    inflight: Receiver<InFlight>,
    tokens: Sender<()>,
    counters: &Counters,
    version: i16,
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
        for topic in &response.responses {
            for p in &topic.partition_responses {
                if p.error_code == 0 {
                    ok += 1;
                } else {
                    failed += 1;
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

    /// A stamped template is a valid Produce request whose every batch passes
    /// the broker's checks (CRC included) and carries the new timestamp.
    #[test]
    fn stamped_templates_are_valid_requests() {
        for (version, codec) in [
            (3, Compression::None),
            (8, Compression::Lz4),
            (11, Compression::Zstd),
        ] {
            let cluster = cluster(6, version);
            let mut args = WorkloadArgs::new("127.0.0.1:9092", "t");
            args.compression = codec;
            args.batch_bytes = 4096;
            args.record_size = 100;
            args.max_request_bytes = 10_000;
            let payload = workload::build_payload(&args).unwrap();
            let plans = workload::plan_connections(&cluster, 2).unwrap();
            assert_eq!(plans.len(), 2);
            let mut templates = build_templates(&cluster, &plans[0], &payload, &args).unwrap();
            // 3 partitions; as many batches per request as fit in 10 000 bytes.
            let fit = (10_000 / payload.batch.len()).clamp(1, 3);
            assert_eq!(templates.len(), 3usize.div_ceil(fit), "{version} {codec}");
            for (i, t) in templates.iter_mut().enumerate() {
                t.stamp(1000 + i as i32, 1_700_000_000_123);
                let mut frame = Bytes::from(t.frame.clone());
                assert_eq!(frame.get_i32() as usize, frame.len());
                let header =
                    RequestHeader::decode(&mut frame, ProduceRequest::header_version(version))
                        .unwrap();
                assert_eq!(header.correlation_id, 1000 + i as i32);
                let request = ProduceRequest::decode(&mut frame, version).unwrap();
                assert_eq!(request.acks, 1);
                let mut batches = 0;
                for topic in &request.topic_data {
                    for p in &topic.partition_data {
                        let records = p.records.clone().unwrap();
                        let h = batch::validate(&records).unwrap();
                        assert_eq!(h.base_timestamp, 1_700_000_000_123);
                        assert_eq!(h.max_timestamp, 1_700_000_000_123);
                        assert_eq!(h.records_count as u64, payload.records);
                        assert_eq!(h.compression().unwrap(), codec);
                        batches += 1;
                    }
                }
                assert_eq!(batches, t.batch_positions.len());
            }
        }
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
