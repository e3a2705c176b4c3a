//! In-process engine throughput: appends of prebuilt batches to one or more
//! partitions per core through the shard runtime, then cold reads after a restart,
//! with the raw O_DIRECT baseline measured in the same run.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use clap::{Args as ClapArgs, ValueEnum};
use skiff_engine::batch::{BatchBuilder, Compression};
use skiff_engine::shard::block_on;
use skiff_engine::{AppendMode, Durability, LogConfig, Runtime, ShardConfig, TopicPartition};

use crate::baseline;
use crate::mb_s;

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum DurabilityArg {
    /// fdatasync before each append is acknowledged (group-committed).
    Flush,
    /// Acknowledge once the append is written to the file (no fdatasync);
    /// fdatasync every 100 ms in the background.
    Interval,
}

#[derive(ClapArgs, Debug, Clone)]
pub struct Args {
    /// Directory for the data (on the disk to measure). Default: a temp dir under
    /// the current directory.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Shards (executors), one per core.
    #[arg(long, default_value_t = 2)]
    pub cores: usize,
    #[arg(long, default_value_t = 1)]
    pub partitions_per_core: usize,
    /// Size of each appended batch in KiB.
    #[arg(long, default_value_t = 1024)]
    pub batch_kib: usize,
    /// Value size of the records inside a batch, in bytes.
    #[arg(long, default_value_t = 1024)]
    pub record_bytes: usize,
    /// MiB appended to each partition.
    #[arg(long, default_value_t = 1024)]
    pub size_mib: u64,
    /// Appends in flight per partition (a producer's max.in.flight).
    #[arg(long, default_value_t = 4)]
    pub inflight: usize,
    #[arg(long, value_enum, default_value_t = DurabilityArg::Flush)]
    pub durability: DurabilityArg,
    /// Chunk writes the engine keeps in flight per partition
    /// (`LogConfig::max_inflight_writes`; default: the engine's).
    #[arg(long)]
    pub write_depth: Option<usize>,
    /// Largest append chunk in KiB (`LogConfig::append_chunk_bytes`; default:
    /// the engine's).
    #[arg(long)]
    pub chunk_kib: Option<usize>,
    /// Largest step of disk space reserved ahead of the writes, in MiB
    /// (`LogConfig::preallocate_step_bytes`; default: the engine's; 0: none).
    #[arg(long)]
    pub preallocate_mib: Option<u64>,
    /// Segment size in MiB (`segment.bytes`; default: the engine's 1 GiB).
    #[arg(long)]
    pub segment_mib: Option<u64>,
    /// Retention per partition in MiB (`retention.bytes`), checked every
    /// 100 ms: with it the run reaches the steady state of a long-lived log,
    /// whose new segments reuse the files retention removes (unless
    /// `--no-recycle`). Cold reads then read what is left.
    #[arg(long)]
    pub retention_mib: Option<u64>,
    /// MiB appended to each partition before the clock starts (with
    /// `--retention-mib`: enough to fill it, so the timed part is steady).
    #[arg(long, default_value_t = 0)]
    pub warmup_mib: u64,
    /// Free the segments retention removes instead of reusing their files
    /// (`skiff.log.segment.recycle=false`).
    #[arg(long)]
    pub no_recycle: bool,
    /// Skip the raw disk baseline.
    #[arg(long)]
    pub no_baseline: bool,
    /// Keep the data directory (for `skiff-tools`) and print where it is.
    #[arg(long)]
    pub keep: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// What one engine run measured.
#[derive(Debug, Clone, Copy)]
pub struct EngineFigures {
    pub append_mb_s: f64,
    pub read_cold_mb_s: f64,
    /// The raw disk in the same run (mean of before and after), unless skipped.
    pub raw: Option<baseline::DiskFigures>,
    pub partitions: usize,
    pub batch_bytes: usize,
    /// Rolls of the run (warm-up included) and the bucket bounds their
    /// median and 99th percentile fall in, in ms (`skiff_log_roll_duration_seconds`):
    /// how long the partitions' appends waited on them.
    pub rolls: u64,
    pub roll_p50_ms: f64,
    pub roll_p99_ms: f64,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let figures = measure(&args)?;
    let (append, read, raw, partitions) = (
        figures.append_mb_s,
        figures.read_cold_mb_s,
        figures.raw,
        figures.partitions,
    );
    if args.json {
        println!(
            "{}",
            serde_json::json!({
                "engine": {"append_mb_s": append, "read_cold_mb_s": read},
                "baseline": raw.map(|r| serde_json::json!({"disk_write_mb_s": r.write_mb_s, "disk_read_mb_s": r.read_mb_s})),
                "append_vs_raw_write": raw.map(|r| append / r.write_mb_s),
                "read_vs_raw_read": raw.map(|r| read / r.read_mb_s),
                "cores": args.cores, "partitions": partitions, "batch_bytes": figures.batch_bytes,
                "durability": format!("{:?}", args.durability).to_lowercase(), "inflight": args.inflight,
                "write_depth": args.write_depth, "chunk_kib": args.chunk_kib,
                "rolls": figures.rolls, "roll_p50_ms": figures.roll_p50_ms, "roll_p99_ms": figures.roll_p99_ms,
            })
        );
        return Ok(());
    }
    println!(
        "engine: {} partition(s) on {} core(s), {} byte batches, {} in flight, durability {:?}, {} MiB each",
        partitions,
        args.cores,
        figures.batch_bytes,
        args.inflight,
        args.durability,
        args.size_mib
    );
    match raw {
        Some(r) => {
            println!("raw O_DIRECT write {:>8.1} MB/s (mean of before/after)   engine append    {append:>8.1} MB/s   ratio {:.2}", r.write_mb_s, append / r.write_mb_s);
            println!(
                "raw O_DIRECT read  {:>8.1} MB/s   engine cold read {read:>8.1} MB/s   ratio {:.2}",
                r.read_mb_s,
                read / r.read_mb_s
            );
        }
        None => println!("engine append {append:.1} MB/s, cold read {read:.1} MB/s"),
    }
    if figures.rolls > 0 {
        println!(
            "rolls {} (warm-up included), appends waited p50 <= {} ms, p99 <= {} ms on each",
            figures.rolls, figures.roll_p50_ms, figures.roll_p99_ms
        );
    }
    Ok(())
}

/// Appends, restarts and reads back cold; the raw disk before and after.
pub fn measure(args: &Args) -> anyhow::Result<EngineFigures> {
    let scratch = baseline::scratch_dir(args.dir.as_deref())?;
    let partitions = args.cores.max(1) * args.partitions_per_core.max(1);
    let batch = build_batch(args.batch_kib * 1024, args.record_bytes)?;
    let batches_per_partition = ((args.size_mib << 20) / batch.len() as u64).max(1) as usize;
    let appended_bytes = (batches_per_partition * batch.len() * partitions) as u64;

    // Same streams, block size and queue depth as the engine's appenders; measured
    // before and after the engine and averaged, since shared disks drift.
    let raw_before = if args.no_baseline {
        None
    } else {
        Some(baseline::disk(
            scratch.path(),
            partitions,
            args.size_mib,
            1024,
            4,
        )?)
    };

    let data_dir = scratch.path().join("data");
    let mut config = ShardConfig::unpinned(&data_dir, args.cores);
    config.log = LogConfig {
        durability: match args.durability {
            DurabilityArg::Flush => Durability::FlushBeforeAck,
            DurabilityArg::Interval => Durability::Interval(Duration::from_millis(100)),
        },
        max_batch_bytes: batch.len().max(LogConfig::default().max_batch_bytes),
        max_inflight_writes: args
            .write_depth
            .unwrap_or(LogConfig::default().max_inflight_writes)
            .max(1),
        append_chunk_bytes: args
            .chunk_kib
            .map_or(LogConfig::default().append_chunk_bytes, |k| k.max(4) << 10),
        preallocate_step_bytes: args
            .preallocate_mib
            .map_or(LogConfig::default().preallocate_step_bytes, |m| m << 20),
        segment_bytes: args
            .segment_mib
            .map_or(LogConfig::default().segment_bytes, |m| m.max(1) << 20),
        retention_bytes: args.retention_mib.map(|m| m << 20),
        recycle_segments: !args.no_recycle,
        ..LogConfig::default()
    };
    if args.retention_mib.is_some() {
        config.retention_check_interval = Duration::from_millis(100);
    }
    let warmup_batches = ((args.warmup_mib << 20) / batch.len() as u64) as usize;
    let runtime = Runtime::start(config.clone())?;
    let tps: Vec<TopicPartition> = (0..partitions as i32)
        .map(|p| TopicPartition::new("bench", p))
        .collect();
    for tp in &tps {
        let tp = tp.clone();
        runtime.block_on(
            0,
            move |shard| async move { shard.create_partition(&tp).await },
        )??;
    }

    // Appends: every shard drives its own partitions; batches are copied before
    // the clock starts so only the engine's own work is timed.
    let mut pending = Vec::new();
    for s in 0..runtime.shards() {
        let mine = owned_by(&runtime, &tps, s);
        let batch = batch.clone();
        let inflight = args.inflight.max(1);
        pending.push(runtime.submit(s, move |shard| async move {
            // `count` batches to each partition, `inflight` appends at a time:
            // each task's batches.
            let copies_for = |count: usize| {
                let mut work = Vec::new();
                for tp in &mine {
                    let per_task = count.div_ceil(inflight);
                    for t in 0..inflight {
                        let n = per_task.min(count.saturating_sub(t * per_task));
                        let copies: Vec<BytesMut> =
                            (0..n).map(|_| BytesMut::from(&batch[..])).collect();
                        work.push((tp.clone(), copies));
                    }
                }
                work
            };
            let spawn_appends = |work: Vec<(TopicPartition, Vec<BytesMut>)>| {
                work.into_iter()
                    .map(|(tp, copies)| {
                        let shard = shard.clone();
                        glommio::spawn_local(async move {
                            for b in copies {
                                shard
                                    .append(&tp, b, AppendMode::Leader { leader_epoch: 0 })
                                    .await?;
                            }
                            Ok::<_, skiff_engine::LogError>(())
                        })
                    })
                    .collect::<Vec<_>>()
            };
            // Both sets of copies are made before any append: copying the
            // timed batches (a GiB on the shard's thread) after the warm-up
            // left the first timed roll stuck for about 340 ms on its
            // ftruncate in every steady-state run, a quarter of the clock.
            let warmup = copies_for(warmup_batches);
            let timed = copies_for(batches_per_partition);
            for task in spawn_appends(warmup) {
                task.await?;
            }
            let tasks = spawn_appends(timed);
            let t = Instant::now();
            for task in tasks {
                task.await?;
            }
            Ok::<_, skiff_engine::LogError>(t.elapsed())
        })?);
    }
    let mut append_secs: f64 = 0.0;
    for p in pending {
        let elapsed = block_on(p)??;
        append_secs = append_secs.max(elapsed.as_secs_f64());
    }
    let mut engine_stats = skiff_engine::stats::ShardStatsSnapshot::default();
    for s in 0..runtime.shards() {
        engine_stats.merge(&runtime.block_on(s, |shard| async move { shard.stats() })?);
    }
    runtime.shutdown()?;
    let append = mb_s(appended_bytes, append_secs);

    // Cold reads: a fresh runtime recovers the partitions; the cache starts empty.
    let runtime = Runtime::start(config)?;
    let mut pending = Vec::new();
    for s in 0..runtime.shards() {
        let mine = owned_by(&runtime, &tps, s);
        pending.push(runtime.submit(s, move |shard| async move {
            let t = Instant::now();
            let mut bytes = 0u64;
            for tp in mine {
                let mut offset = shard
                    .list_offset(&tp, skiff_engine::OffsetQuery::Earliest)
                    .await?
                    .map_or(0, |(start, _)| start);
                loop {
                    let r = shard.read(&tp, offset, 4 << 20, i64::MAX).await?;
                    if r.batches.is_empty() {
                        break;
                    }
                    bytes += r.bytes() as u64;
                    offset = r.next_offset;
                }
            }
            Ok::<_, skiff_engine::LogError>((bytes, t.elapsed()))
        })?);
    }
    let mut read_bytes = 0;
    let mut read_secs: f64 = 0.0;
    for p in pending {
        let (b, e) = block_on(p)??;
        read_bytes += b;
        read_secs = read_secs.max(e.as_secs_f64());
    }
    runtime.shutdown()?;
    let warmup_bytes = (warmup_batches * batch.len() * partitions) as u64;
    // Under retention only the newest part is left to read.
    anyhow::ensure!(
        read_bytes == appended_bytes + warmup_bytes
            || (args.retention_mib.is_some() && read_bytes <= appended_bytes + warmup_bytes),
        "read back {read_bytes} bytes of {}",
        appended_bytes + warmup_bytes
    );
    let read = mb_s(read_bytes, read_secs);
    let raw = match raw_before {
        Some(before) => {
            let after = baseline::disk(scratch.path(), partitions, args.size_mib, 1024, 4)?;
            Some(baseline::DiskFigures {
                write_mb_s: (before.write_mb_s + after.write_mb_s) / 2.0,
                read_mb_s: (before.read_mb_s + after.read_mb_s) / 2.0,
            })
        }
        None => None,
    };

    if args.keep {
        let kept = scratch.keep();
        eprintln!("data kept in {}", kept.join("data").display());
    }
    Ok(EngineFigures {
        append_mb_s: append,
        read_cold_mb_s: read,
        raw,
        partitions,
        batch_bytes: batch.len(),
        rolls: engine_stats.roll.count(),
        roll_p50_ms: engine_stats.roll.quantile_bound(0.5) * 1000.0,
        roll_p99_ms: engine_stats.roll.quantile_bound(0.99) * 1000.0,
    })
}

/// A batch of about `bytes` bytes of `record_bytes`-byte records.
fn build_batch(bytes: usize, record_bytes: usize) -> anyhow::Result<bytes::Bytes> {
    let value = vec![b'x'; record_bytes.max(1)];
    let records = (bytes / (record_bytes + 20)).max(1);
    let mut b = BatchBuilder::new().compression(Compression::None);
    for i in 0..records {
        let key = (i as u64).to_be_bytes();
        b.push(i as i64, Some(&key), Some(&value), &[]);
    }
    Ok(b.build()?)
}

fn owned_by(runtime: &Runtime, tps: &[TopicPartition], shard: usize) -> Vec<TopicPartition> {
    tps.iter()
        .filter(|tp| runtime.table().shard_of(tp) == shard)
        .cloned()
        .collect()
}
