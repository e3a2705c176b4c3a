//! The workload a load-generator run applies, shared by `produce`, `consume` and
//! `e2e`: its flags (Kafka's names where Kafka has them), the prebuilt record
//! batch, and how partitions are spread over connections.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use clap::Args as ClapArgs;
use skiff_engine::batch::{BatchBuilder, Compression};

use crate::kafka::Cluster;

#[derive(ClapArgs, Debug, Clone)]
pub struct WorkloadArgs {
    /// Comma-separated HOST:PORT list of the cluster to load.
    #[arg(long, default_value = "127.0.0.1:9092")]
    pub bootstrap: String,
    /// Topic to use; created (with --partitions) when it does not exist.
    #[arg(long, default_value = "skiff-bench")]
    pub topic: String,
    /// Partitions of the topic when it is created.
    #[arg(long, default_value_t = 16)]
    pub partitions: i32,
    /// Bytes of each record's value (no key), random uppercase letters as in
    /// Kafka's producer-perf-test.
    #[arg(long, default_value_t = 1024)]
    pub record_size: usize,
    /// Bytes of a record batch before compression (Kafka's batch.size): records
    /// per batch = what fits.
    #[arg(long, default_value_t = 16384)]
    pub batch_bytes: usize,
    /// Largest produce request (Kafka's max.request.size): a request carries one
    /// batch for each of as many of its connection's partitions as fit.
    #[arg(long, default_value_t = 1 << 20)]
    pub max_request_bytes: usize,
    /// 0, 1, or all (-1).
    #[arg(long, default_value = "1", value_parser = parse_acks)]
    pub acks: i16,
    #[arg(long, default_value = "none", value_parser = parse_compression)]
    pub compression: Compression,
    /// Records per second over all connections: open loop, with latency measured
    /// from each request's intended send time. Without it, as fast as the
    /// in-flight limit allows (closed loop, latency from the actual send).
    #[arg(long)]
    pub rate: Option<u64>,
    /// Seconds of load.
    #[arg(long, default_value_t = 10.0)]
    pub duration: f64,
    /// Stop producing after this many records (Kafka's --num-records), if the
    /// duration has not run out first.
    #[arg(long)]
    pub num_records: Option<u64>,
    /// TCP connections (spread over the partition leaders).
    #[arg(long, default_value_t = 4)]
    pub connections: usize,
    /// Requests in flight per connection (Kafka's
    /// max.in.flight.requests.per.connection).
    #[arg(long, default_value_t = 5)]
    pub max_in_flight: usize,
    /// Bytes fetched per partition per request (Kafka's max.partition.fetch.bytes).
    #[arg(long, default_value_t = 1 << 20)]
    pub fetch_bytes: usize,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

impl WorkloadArgs {
    /// The defaults, as the suite starts from them.
    pub fn new(bootstrap: &str, topic: &str) -> WorkloadArgs {
        WorkloadArgs {
            bootstrap: bootstrap.to_string(),
            topic: topic.to_string(),
            partitions: 16,
            record_size: 1024,
            batch_bytes: 16384,
            max_request_bytes: 1 << 20,
            acks: 1,
            compression: Compression::None,
            rate: None,
            duration: 10.0,
            num_records: None,
            connections: 4,
            max_in_flight: 5,
            fetch_bytes: 1 << 20,
            json: false,
        }
    }

    pub fn duration(&self) -> Duration {
        Duration::from_secs_f64(self.duration.max(0.0))
    }

    /// Checks the flags that the types do not.
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(self.partitions >= 1, "--partitions must be at least 1");
        anyhow::ensure!(self.record_size >= 1, "--record-size must be at least 1");
        anyhow::ensure!(
            self.record_size <= 64 << 20,
            "--record-size over 64 MiB is not a realistic record"
        );
        anyhow::ensure!(self.connections >= 1, "--connections must be at least 1");
        anyhow::ensure!(
            self.max_in_flight >= 1,
            "--max-in-flight must be at least 1"
        );
        anyhow::ensure!(
            self.max_in_flight <= MAX_IN_FLIGHT,
            "--max-in-flight over {MAX_IN_FLIGHT}"
        );
        anyhow::ensure!(
            (1..=FETCH_BYTES_MAX).contains(&self.fetch_bytes),
            "--fetch-bytes must be 1..={FETCH_BYTES_MAX}"
        );
        anyhow::ensure!(self.rate != Some(0), "--rate must be positive");
        anyhow::ensure!(self.duration > 0.0, "--duration must be positive");
        Ok(())
    }

    pub fn acks_name(&self) -> &'static str {
        match self.acks {
            0 => "0",
            1 => "1",
            _ => "all",
        }
    }
}

/// Bound on requests in flight per connection.
pub const MAX_IN_FLIGHT: usize = 1024;
/// Bound on the bytes one fetch asks per partition.
pub const FETCH_BYTES_MAX: usize = 64 << 20;

fn parse_acks(s: &str) -> Result<i16, String> {
    match s {
        "0" => Ok(0),
        "1" => Ok(1),
        "all" | "-1" => Ok(-1),
        _ => Err(format!("acks must be 0, 1, all or -1, not {s:?}")),
    }
}

fn parse_compression(s: &str) -> Result<Compression, String> {
    s.parse::<Compression>()
        .map_err(|_| format!("compression must be none, gzip, snappy, lz4 or zstd, not {s:?}"))
}

/// The prebuilt batch every produce request carries (one copy per partition).
#[derive(Debug, Clone)]
pub struct Payload {
    pub batch: Bytes,
    pub records: u64,
    /// Record value bytes in the batch.
    pub payload_bytes: u64,
}

/// The producer an idempotent or transactional run writes as: every batch
/// carries its id and epoch (and, in a transaction, the transactional bit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerStamp {
    pub id: i64,
    pub epoch: i16,
    pub transactional: bool,
}

/// Builds one batch of about `batch_bytes` (uncompressed) of `record_size`-byte
/// records of random uppercase letters, compressed with the workload's codec,
/// written as `producer` when there is one (base sequence 0: the senders stamp
/// each partition's own). Compressed once here; the senders only restamp
/// timestamps and the CRC (and sequences).
pub fn build_payload_for(
    args: &WorkloadArgs,
    producer: Option<ProducerStamp>,
) -> anyhow::Result<Payload> {
    let mut rng = fastrand::Rng::with_seed(0x5eed);
    let mut value = vec![0u8; args.record_size];
    // One record measures the per-record overhead (lengths, deltas) in the batch.
    let one = {
        let mut b = BatchBuilder::new();
        b.push(0, None, Some(&value), &[]);
        b.build()?.len()
    };
    let per_record = one
        .saturating_sub(skiff_engine::batch::BATCH_HEADER_LEN)
        .max(1);
    let records = (args
        .batch_bytes
        .saturating_sub(skiff_engine::batch::BATCH_HEADER_LEN)
        / per_record)
        .max(1);
    let mut builder = BatchBuilder::new().compression(args.compression);
    if let Some(p) = producer {
        builder = builder
            .producer(p.id, p.epoch, 0)
            .transactional(p.transactional);
    }
    for _ in 0..records {
        value.iter_mut().for_each(|b| *b = rng.u8(b'A'..=b'Z'));
        builder.push(0, None, Some(&value), &[]);
    }
    Ok(Payload {
        batch: builder.build()?,
        records: records as u64,
        payload_bytes: (records * args.record_size) as u64,
    })
}

/// One connection's share: the broker it talks to and the partitions it owns,
/// as indices into `Cluster::partitions`.
#[derive(Debug, Clone)]
pub struct ConnectionPlan {
    pub address: String,
    pub partitions: Vec<usize>,
}

/// Spreads `connections` over the partition leaders in proportion to their
/// partitions (largest remainder, so the total is `connections` when that is at
/// least the number of leaders; at least one per leader, at most one per
/// partition), and the partitions of each leader round-robin over its
/// connections.
pub fn plan_connections(
    cluster: &Cluster,
    connections: usize,
) -> anyhow::Result<Vec<ConnectionPlan>> {
    let mut by_leader: BTreeMap<i32, Vec<usize>> = BTreeMap::new();
    for (i, (_, leader)) in cluster.partitions.iter().enumerate() {
        by_leader.entry(*leader).or_default().push(i);
    }
    let total = cluster.partitions.len().max(1);
    // Each leader's share: the floor of its quota, then one more each for the
    // largest remainders while connections are left.
    let mut shares: Vec<(usize, usize)> = by_leader
        .values()
        .map(|parts| {
            let quota = connections * parts.len();
            ((quota / total).clamp(1, parts.len()), quota % total)
        })
        .collect();
    let mut left = connections.saturating_sub(shares.iter().map(|s| s.0).sum());
    let mut order: Vec<usize> = (0..shares.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(shares[i].1));
    let counts: Vec<usize> = by_leader.values().map(Vec::len).collect();
    while left > 0 {
        let before = left;
        for &i in &order {
            if left > 0 && shares[i].0 < counts[i] {
                shares[i].0 += 1;
                left -= 1;
            }
        }
        if left == before {
            break;
        }
    }
    let mut plans = Vec::new();
    for ((leader, parts), (share, _)) in by_leader.into_iter().zip(shares) {
        let address = cluster.address(leader)?.to_string();
        let mut mine: Vec<ConnectionPlan> = (0..share)
            .map(|_| ConnectionPlan {
                address: address.clone(),
                partitions: Vec::new(),
            })
            .collect();
        for (k, p) in parts.into_iter().enumerate() {
            mine[k % share].partitions.push(p);
        }
        plans.extend(mine);
    }
    Ok(plans)
}

/// Wall-clock milliseconds since the epoch (Kafka's timestamp unit).
pub fn wall_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Wall-clock microseconds since the epoch.
pub fn wall_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}
