//! Log cleaner throughput, and what the cleaner costs appends.
//!
//! In one executor, as a core of the node runs them: a compacted partition is
//! filled with keyed records (random overwrites of `--keys` keys, segments rolled
//! at 64 MiB), then
//! 1. a steady append load (`--rate` batches of `--batch-records` records a second,
//!    each acknowledged after its flush, as acks=all) runs alone on a second
//!    partition: the idle latency;
//! 2. the same load runs while the cleaner, in its own low-share task queue (as in
//!    `shard::run_shard`), compacts the first partition: cleaner MB/s (bytes read
//!    over wall time) and the load's latency beside it.
//!
//! Latency is measured from each append's intended start (open loop), so a stall
//! shows in the percentiles instead of slowing the load down.

use std::path::PathBuf;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use clap::Args as ClapArgs;
use glommio::{Latency, LocalExecutorBuilder, Placement, Shares};
use skiff_engine::batch::{BatchBuilder, Compression};
use skiff_engine::batch_cache::BatchCache;
use skiff_engine::{AppendMode, Cleaner, CleanerConfig, LogConfig, Partition, PartitionLog};

use crate::baseline;
use crate::mb_s;

#[derive(ClapArgs, Debug, Clone)]
pub struct Args {
    /// Directory for the data (on the disk to measure). Default: a temp dir under
    /// the current directory.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// MiB of keyed records the cleaner compacts.
    #[arg(long, default_value_t = 512)]
    pub size_mib: u64,
    /// Distinct keys among them.
    #[arg(long, default_value_t = 100_000)]
    pub keys: u64,
    /// Value bytes per record.
    #[arg(long, default_value_t = 1024)]
    pub record_bytes: usize,
    /// Codec of the compacted data (the cleaner recompresses with it).
    #[arg(long, default_value = "none")]
    pub compression: String,
    /// Appends per second of the latency load.
    #[arg(long, default_value_t = 500)]
    pub rate: u64,
    /// Records per appended batch of the latency load.
    #[arg(long, default_value_t = 16)]
    pub batch_records: usize,
    /// Seconds of the idle (no cleaner) load.
    #[arg(long, default_value_t = 5)]
    pub idle_secs: u64,
    /// The cleaner's I/O throttle in MiB/s (log.cleaner.io.max.bytes.per.second).
    #[arg(long)]
    pub throttle_mib_s: Option<u64>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, Default)]
struct Latencies {
    samples_us: Vec<u64>,
}

impl Latencies {
    fn percentile_ms(&self, p: f64) -> f64 {
        if self.samples_us.is_empty() {
            return 0.0;
        }
        let mut v = self.samples_us.clone();
        v.sort_unstable();
        let i = ((p / 100.0) * (v.len() - 1) as f64).round() as usize;
        v[i.min(v.len() - 1)] as f64 / 1000.0
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "appends": self.samples_us.len(),
            "p50_ms": self.percentile_ms(50.0),
            "p99_ms": self.percentile_ms(99.0),
            "p999_ms": self.percentile_ms(99.9),
            "max_ms": self.percentile_ms(100.0),
        })
    }
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let codec: Compression = args.compression.parse()?;
    let scratch = baseline::scratch_dir(args.dir.as_deref())?;
    let dir = scratch.path().to_path_buf();
    let a = args.clone();
    let report = LocalExecutorBuilder::new(Placement::Unbound)
        .preempt_timer(skiff_engine::shard::PREEMPT_TIMER)
        .spawn(move || async move { measure(dir, a, codec).await })
        .map_err(|e| anyhow::anyhow!("starting the executor: {e}"))?
        .join()
        .map_err(|e| anyhow::anyhow!("executor: {e:?}"))??;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        let c = &report["cleaner"];
        println!(
            "cleaner: {:.0} MB/s read ({} MB in {:.2}s), {} MB written, {} of {} records kept ({})",
            c["mb_s"].as_f64().unwrap_or(0.0),
            c["bytes_read"].as_u64().unwrap_or(0) / 1_000_000,
            c["secs"].as_f64().unwrap_or(0.0),
            c["bytes_written"].as_u64().unwrap_or(0) / 1_000_000,
            c["records_kept"],
            c["records_read"],
            args.compression,
        );
        for phase in ["idle", "cleaning"] {
            let l = &report[phase];
            println!(
                "appends {phase:>8}: {} at {}/s, p50 {:.2} ms, p99 {:.2} ms, p99.9 {:.2} ms, max {:.2} ms",
                l["appends"], args.rate, l["p50_ms"].as_f64().unwrap_or(0.0),
                l["p99_ms"].as_f64().unwrap_or(0.0), l["p999_ms"].as_f64().unwrap_or(0.0),
                l["max_ms"].as_f64().unwrap_or(0.0),
            );
        }
    }
    Ok(())
}

async fn open(dir: PathBuf, name: &str, config: LogConfig) -> anyhow::Result<Rc<Partition>> {
    let log = PartitionLog::open(
        &dir.join(format!("{name}-0")),
        name,
        0,
        config,
        BatchCache::new(64 << 20),
    )
    .await?;
    Ok(Rc::new(Partition::new(log)))
}

async fn measure(
    dir: PathBuf,
    args: Args,
    codec: Compression,
) -> anyhow::Result<serde_json::Value> {
    let compacted = open(
        dir.clone(),
        "compacted",
        LogConfig {
            segment_bytes: 64 << 20,
            compact: true,
            ..LogConfig::default()
        },
    )
    .await?;
    let load = open(dir, "load", LogConfig::default()).await?;

    // Fill: batches of 64 records with random keys.
    let mut rng = fastrand::Rng::with_seed(42);
    let value = vec![0x5a; args.record_bytes];
    let target = args.size_mib << 20;
    let mut filled = 0u64;
    while filled < target {
        let mut b = BatchBuilder::new().compression(codec);
        for _ in 0..64 {
            let key = format!("key-{:08}", rng.u64(0..args.keys.max(1)));
            b.push(0, Some(key.as_bytes()), Some(&value), &[]);
        }
        let batch = b.build()?;
        filled += batch.len() as u64;
        compacted
            .append(
                BytesMut::from(&batch[..]),
                AppendMode::Leader { leader_epoch: 0 },
            )
            .await?;
    }
    // One more batch rolls nothing; the active segment stays uncleaned, as in a node.

    let mut b = BatchBuilder::new();
    for i in 0..args.batch_records.max(1) {
        b.push(0, Some(format!("k{i}").as_bytes()), Some(&value), &[]);
    }
    let load_batch = b.build()?;
    // Warm-up: the load partition's first segment, preallocation, caches.
    run_load(
        &load,
        &load_batch,
        args.rate,
        || Duration::from_secs(1),
        None,
    )
    .await?;
    let idle = run_load(
        &load,
        &load_batch,
        args.rate,
        || Duration::from_secs(args.idle_secs),
        None,
    )
    .await?;

    let queue = glommio::executor().create_task_queue(
        Shares::Static(25),
        Latency::NotImportant,
        "bench-cleaner",
    );
    let done = Rc::new(std::cell::Cell::new(false));
    let cleaning = {
        let (compacted, done) = (compacted.clone(), done.clone());
        let throttle = args.throttle_mib_s.map(|m| m << 20);
        glommio::spawn_local_into(
            async move {
                let mut cleaner = Cleaner::new(CleanerConfig {
                    io_max_bytes_per_second: throttle,
                    ..CleanerConfig::default()
                });
                let started = Instant::now();
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as i64);
                let stats = cleaner.clean(&compacted, now).await;
                done.set(true);
                (stats, started.elapsed())
            },
            queue,
        )
        .map_err(|e| anyhow::anyhow!("spawning the cleaner: {e}"))?
    };
    let during = run_load(&load, &load_batch, args.rate, || Duration::MAX, Some(done)).await?;
    let (stats, elapsed) = cleaning.await;
    let stats = stats?.unwrap_or_default();
    let secs = elapsed.as_secs_f64();
    Ok(serde_json::json!({
        "cleaner": {
            "bytes_read": stats.bytes_read,
            "bytes_written": stats.bytes_written,
            "records_read": stats.records_read,
            "records_kept": stats.records_kept,
            "secs": secs,
            "mb_s": mb_s(stats.bytes_read, secs),
            "compression": args.compression,
        },
        "idle": idle.json(),
        "cleaning": during.json(),
    }))
}

/// Appends `batch` at `rate` per second until `length()` has passed or `stop` is
/// set; each append's latency counts from when it was due.
async fn run_load(
    partition: &Rc<Partition>,
    batch: &bytes::Bytes,
    rate: u64,
    length: impl Fn() -> Duration,
    stop: Option<Rc<std::cell::Cell<bool>>>,
) -> anyhow::Result<Latencies> {
    let interval = Duration::from_secs_f64(1.0 / rate.max(1) as f64);
    let started = Instant::now();
    let mut tasks = Vec::new();
    let mut n = 0u32;
    loop {
        let due = started + interval * n;
        if due.duration_since(started) >= length() || stop.as_ref().is_some_and(|s| s.get()) {
            break;
        }
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            glommio::timer::sleep(wait).await;
        }
        let (p, copy) = (partition.clone(), BytesMut::from(&batch[..]));
        tasks.push(glommio::spawn_local(async move {
            p.append(copy, AppendMode::Leader { leader_epoch: 0 })
                .await
                .map(|_| due.elapsed().as_micros() as u64)
        }));
        n += 1;
    }
    let mut latencies = Latencies::default();
    for t in tasks {
        latencies.samples_us.push(t.await?);
    }
    Ok(latencies)
}
