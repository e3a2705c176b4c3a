//! `skiff-bench e2e`: produce-to-consume latency. A consumer tails the topic from
//! its end while the producer runs; each batch's first timestamp (stamped by the
//! producer with its intended send time) is compared with the wall clock when the
//! consumer sees the batch. Kafka timestamps are milliseconds, so figures have
//! 1 ms resolution and err up (a timestamp is truncated to its millisecond), as in
//! the OpenMessaging Benchmark, which measures end-to-end latency the same way.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::consume::{self, ConsumeSpec, End};
use crate::kafka::Cluster;
use crate::produce::{self, ProduceReport};
use crate::stats::{Latency, StopFlag};
use crate::workload::WorkloadArgs;

/// How long the consumer may take, after producing ends, to see the last record.
const CATCH_UP_GRACE: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, Serialize)]
pub struct E2eReport {
    /// Produce-to-consume latency per record.
    pub latency: Latency,
    pub records_produced: u64,
    pub records_consumed: u64,
    pub produce: ProduceReport,
}

pub struct E2eOutcome {
    pub report: E2eReport,
    pub histogram: Histogram<u64>,
}

pub fn run(args: WorkloadArgs) -> anyhow::Result<()> {
    args.validate()?;
    let cluster = Cluster::discover(&args.bootstrap, &args.topic, args.partitions, true)?;
    let outcome = e2e(&cluster, &args, None)?;
    let r = &outcome.report;
    if args.json {
        println!("{}", serde_json::to_string(r)?);
        return Ok(());
    }
    produce::print(&r.produce, false)?;
    let l = &r.latency;
    println!(
        "end-to-end ms: mean {:.2}  p50 {:.2}  p90 {:.2}  p99 {:.2}  p99.9 {:.2}  max {:.2}  ({} of {} records seen)",
        l.mean_ms, l.p50_ms, l.p90_ms, l.p99_ms, l.p999_ms, l.max_ms, r.records_consumed, r.records_produced
    );
    Ok(())
}

pub fn e2e(
    cluster: &Cluster,
    args: &WorkloadArgs,
    stop: Option<StopFlag>,
) -> anyhow::Result<E2eOutcome> {
    let ends = Arc::new(OnceLock::new());
    let consumer = consume::consume(
        cluster,
        args.connections,
        ConsumeSpec {
            start_offsets: cluster.list_offsets(-1)?,
            end: End::Later(ends.clone()),
            repeat: false,
            // One fetch per connection covering all its partitions, like a Kafka
            // consumer: the answer comes as soon as any partition has data.
            groups_per_connection: 1,
            max_wait_ms: 500,
            fetch_bytes: args.fetch_bytes,
            e2e: true,
            stop: stop.clone(),
        },
    )?;
    let produced = produce::produce(cluster, args, stop);
    // Whatever happened to the producer, let the consumer finish.
    let offsets = cluster.list_offsets(-1);
    let deadline = Instant::now() + CATCH_UP_GRACE;
    let _ = ends.set((
        offsets
            .as_ref()
            .map_or_else(|_| vec![0; cluster.partitions.len()], Clone::clone),
        if offsets.is_ok() {
            deadline
        } else {
            Instant::now()
        },
    ));
    let consumed = consumer.finish()?;
    let produced = produced?;
    offsets?;
    let histogram = consumed.e2e;
    Ok(E2eOutcome {
        report: E2eReport {
            latency: Latency::of(&histogram),
            records_produced: produced.report.records,
            records_consumed: consumed.report.records,
            produce: produced.report,
        },
        histogram,
    })
}
