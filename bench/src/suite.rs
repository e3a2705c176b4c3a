//! `skiff-bench suite`: the whole benchmark in one run, against a `skiff` node it
//! starts itself. Steps: hardware baselines, the engine in-process, then over the
//! Kafka protocol: produce at 1 KiB records x 16 partitions for acks=1/all x
//! compression none/lz4, a catch-up consume of what the first produce wrote, the
//! acks=1 produce at steady state (retention removing segments, new ones reusing
//! their files), a hot
//! consume (a topic that fits the node's batch cache, read over and over), and
//! end-to-end latency at a fixed rate for acks=1 and acks=all; after the
//! acks=all/none produce, the same as an idempotent and as a transactional
//! producer (`producer_modes`, each beside the plain one). Then the single
//! node stops and the replicated workload runs: a 3-node cluster on this machine
//! (`ClusterProcess`), a topic with replication factor 3 and
//! `min.insync.replicas=2`, and the acks=all/none produce again with the same
//! records, batches and connections, routed to each partition's leader; its
//! figures go to `replicated` with `ratios.replicated_vs_single`. Writes
//! `results.json`, `results.md` and SVG plots (`report.rs`).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args as ClapArgs;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use skiff_engine::batch::Compression;

use crate::kafka::{self, Cluster};
use crate::node_process::{self, ClusterProcess, NodeProcess};
use crate::stats::{self, Latency, StopFlag};
use crate::workload::WorkloadArgs;
use crate::{baseline, consume, crosscheck, e2e, engine, produce, report};

#[derive(ClapArgs, Debug, Clone)]
pub struct Args {
    /// A short run (at most about a minute): smaller sizes, 3-4 s per workload.
    #[arg(long)]
    pub quick: bool,
    /// Where results.json, results.md, the SVG plots and the node logs (node.log,
    /// and node-1.log.. of the replicated cluster) go.
    #[arg(long, default_value = "skiff-bench-results")]
    pub out: PathBuf,
    /// The `skiff` binary (default: $SKIFF_BIN, else next to skiff-bench).
    #[arg(long)]
    pub skiff: Option<PathBuf>,
    /// Directory for scratch files and the node's data (on the disk to measure).
    /// Default: a temp dir under the current directory, removed at the end.
    #[arg(long)]
    pub dir: Option<PathBuf>,
}

/// Sizes and durations of one suite run.
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    pub quick: bool,
    pub disk_streams: usize,
    pub disk_mib_per_stream: u64,
    pub loopback_mib: u64,
    pub engine_mib_per_partition: u64,
    /// Rounds of disk, fio and engine in turn after the sweep (medians taken).
    pub confirm_rounds: usize,
    pub produce_s: f64,
    /// The steady-state produce step's segment size: its topic keeps two
    /// segments per partition (retention.bytes) and is warmed up with six.
    pub steady_segment_mib: u64,
    /// The idempotent and transactional produce steps (the acks=all/none
    /// workload again).
    pub producer_modes_s: f64,
    /// How often the transactional step commits.
    pub commit_interval_ms: u64,
    pub consume_s: f64,
    pub hot_topic_mib: u64,
    pub e2e_s: f64,
    pub e2e_rate_records_s: u64,
    pub partitions: i32,
    pub record_size: usize,
    pub batch_bytes: usize,
    pub e2e_batch_bytes: usize,
    pub connections: usize,
    pub max_in_flight: usize,
    /// The replicated workload: nodes, replication factor, min.insync.replicas
    /// and seconds of produce.
    pub replicated_nodes: usize,
    pub replication_factor: i16,
    pub min_insync_replicas: i16,
    pub replicated_s: f64,
}

impl Plan {
    fn new(quick: bool) -> Plan {
        let cores = std::thread::available_parallelism()
            .map_or(2, |n| n.get())
            .clamp(1, 8);
        Plan {
            quick,
            disk_streams: cores,
            disk_mib_per_stream: if quick { 128 } else { 1024 },
            loopback_mib: if quick { 512 } else { 4096 },
            engine_mib_per_partition: if quick { 64 } else { 1024 },
            confirm_rounds: if quick { 1 } else { 5 },
            produce_s: if quick { 4.0 } else { 20.0 },
            steady_segment_mib: if quick { 4 } else { 64 },
            producer_modes_s: if quick { 2.0 } else { 20.0 },
            commit_interval_ms: 100,
            consume_s: if quick { 3.0 } else { 15.0 },
            hot_topic_mib: if quick { 64 } else { 256 },
            e2e_s: if quick { 3.0 } else { 15.0 },
            e2e_rate_records_s: 20_000,
            partitions: 16,
            record_size: 1024,
            // Redpanda's and the OpenMessaging Benchmark's producer batch.size.
            batch_bytes: 128 << 10,
            // Kafka's default batch.size: at a fixed rate, smaller batches go
            // out more often, as a producer with a short linger sends them.
            e2e_batch_bytes: 16 << 10,
            connections: 4,
            max_in_flight: 5,
            replicated_nodes: 3,
            replication_factor: 3,
            min_insync_replicas: 2,
            replicated_s: if quick { 4.0 } else { 20.0 },
        }
    }

    /// Estimated seconds per step, for the progress bar.
    fn estimates(&self) -> [u64; 12] {
        // Write and read of every sweep point (6 quick, 18 full).
        let points = if self.quick { 6 } else { 18 };
        let disk = (points * self.disk_mib_per_stream * self.disk_streams as u64 / 500).max(1);
        [
            disk + self.loopback_mib / 2000 + 1,
            // Each round: the disk's write and read, written as the engine
            // commits, fio's, the engine's.
            self.confirm_rounds as u64
                * (8 * self.disk_mib_per_stream * self.disk_streams as u64 / 500
                    + (self.engine_mib_per_partition * 2 * 2 / 500)
                    + 3),
            2,
            4 * self.produce_s as u64,
            self.consume_s as u64 + 1,
            self.consume_s as u64 + 2,
            2 * self.e2e_s as u64 + 1,
            // Cluster start (quorum election), topic creation, produce, stop.
            self.replicated_s as u64 + 10,
            // TLS: certificates, a node, produce, catch-up read.
            self.produce_s as u64 + self.consume_s as u64 + 4,
            // Quota: a node, the probe alone, the greedy producer's windows.
            self.produce_s as u64 + (1 + QUOTA_PERIODS as u64) * quota_windows(self.quick) + 4,
            // Idempotent and transactional produce.
            2 * (self.producer_modes_s as u64 + 1),
            // Steady-state produce: the warm-up (six segments per partition at
            // about 1 GB/s), then the measured run.
            STEADY_WARMUP_SEGMENTS * self.steady_segment_mib * self.partitions as u64 / 1000
                + self.produce_s as u64
                + 2,
        ]
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    pub nproc: usize,
    pub cpu: String,
    pub memory_gib: f64,
    pub kernel: String,
    /// Device, file system and kind of the disk the data went to.
    pub disk: String,
}

/// One workload's figures, for the table and the plots.
#[derive(Debug, Clone, Serialize)]
pub struct WorkloadResult {
    pub name: String,
    pub kind: &'static str,
    pub mb_s: f64,
    pub records_s: f64,
    pub latency: Option<Latency>,
    /// (quantile, ms) points of the latency distribution.
    pub latency_curve: Vec<(f64, f64)>,
    pub timeline: Vec<stats::Point>,
    /// The step's full report.
    pub report: serde_json::Value,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let stop: StopFlag = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        // A second signal while the first is being handled exits at once.
        signal_hook::flag::register_conditional_shutdown(signal, 1, stop.clone())?;
        signal_hook::flag::register(signal, stop.clone())?;
    }
    let skiff = node_process::find_skiff(args.skiff.as_deref())?;
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    // Scratch files and the node's data; removed when this guard drops, on
    // success or error (after the node, which is dropped first).
    let scratch = baseline::scratch_dir(args.dir.as_deref())?;
    let plan = Plan::new(args.quick);
    let started = Instant::now();
    let progress = progress_bar(plan.estimates().iter().sum());
    let results = run_steps(&args, &plan, &skiff, scratch.path(), &progress, &stop);
    progress.finish_and_clear();
    let mut results = results?;
    results["duration_s"] = started.elapsed().as_secs_f64().into();
    let md = report::write(&args.out, &results)?;
    println!("{md}");
    println!(
        "wrote {}/results.json, results.md, throughput.svg, latency.svg (node logs: node.log, node-1.log..)",
        args.out.display()
    );
    Ok(())
}

fn progress_bar(total_s: u64) -> ProgressBar {
    let bar = ProgressBar::new(total_s);
    if let Ok(style) =
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} ~{pos}/{len} s  {msg}")
    {
        bar.set_style(style);
    }
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}

fn check_stop(stop: &StopFlag) -> anyhow::Result<()> {
    anyhow::ensure!(!stop.load(Ordering::Relaxed), "interrupted");
    Ok(())
}

fn run_steps(
    args: &Args,
    plan: &Plan,
    skiff: &Path,
    scratch: &Path,
    progress: &ProgressBar,
    stop: &StopFlag,
) -> anyhow::Result<serde_json::Value> {
    let est = plan.estimates();
    let step = |msg: &str| {
        progress.set_message(msg.to_string());
        tracing::info!("suite: {msg}");
    };

    step("baseline: raw O_DIRECT disk and loopback TCP");
    // The disk's limit is its best over block sizes and queue depths (the
    // quick plan tries fewer), and fio's figure at that setting when fio is
    // installed: every ratio is against the higher of the two.
    let (blocks, depths): (&[usize], &[usize]) = if plan.quick {
        (&[1024, 4096], &[2, 8, 32])
    } else {
        (&baseline::SWEEP_BLOCK_KIB, &baseline::SWEEP_QUEUE_DEPTHS)
    };
    let sweep = baseline::sweep(
        scratch,
        plan.disk_streams,
        plan.disk_mib_per_stream,
        blocks,
        depths,
    )?;
    let loopback_mb_s = baseline::loopback(plan.loopback_mib)?;
    progress.inc(est[0]);
    check_stop(stop)?;

    // The sweep's one burst per setting picks the disk's best setting. On a
    // shared (virtual) disk one burst varies by ±40% from minute to minute, and
    // the best of 18 bursts is the noise's maximum, not the disk's. So the
    // chosen setting, fio at it and the engine's append then run in turn,
    // `plan.confirm_rounds` times, and each figure is the median of its rounds:
    // the engine and the disk are measured at the same moments of the machine.
    step("engine: in-process append and cold read, in turn with the disk");
    let engine_args = engine::Args {
        dir: Some(scratch.to_path_buf()),
        cores: plan.disk_streams,
        partitions_per_core: 1,
        batch_kib: 1024,
        record_bytes: plan.record_size,
        size_mib: plan.engine_mib_per_partition,
        inflight: 4,
        durability: engine::DurabilityArg::Flush,
        write_depth: None,
        chunk_kib: None,
        preallocate_mib: None,
        segment_mib: None,
        retention_mib: None,
        warmup_mib: 0,
        no_recycle: false,
        no_baseline: true,
        keep: false,
        json: false,
    };
    // The same appends into a log at steady state: retention keeps two
    // segments of an eighth of the run each, and a warm-up of four fills it,
    // so the timed appends write over the files retention removes (segment
    // recycling), as a long-lived log's do; the run above writes into fresh
    // space only.
    let steady_segment_mib = (plan.engine_mib_per_partition / 8).max(1);
    let steady_args = engine::Args {
        segment_mib: Some(steady_segment_mib),
        retention_mib: Some(2 * steady_segment_mib),
        warmup_mib: 4 * steady_segment_mib,
        ..engine_args.clone()
    };
    let fio_tool = crosscheck::find_tool("fio");
    let mut rounds = Rounds::default();
    let mut fio = crosscheck::Check::Absent;
    let (bw, br) = (sweep.best_write, sweep.best_read);
    for round in 0..plan.confirm_rounds.max(1) {
        let w = baseline::disk(
            scratch,
            plan.disk_streams,
            plan.disk_mib_per_stream,
            bw.block_kib,
            bw.queue_depth,
        )?;
        rounds.disk_write.push(w.write_mb_s);
        rounds.disk_overwrite.push(baseline::disk_overwrite(
            scratch,
            plan.disk_streams,
            plan.disk_mib_per_stream,
            bw.block_kib,
            bw.queue_depth,
        )?);
        // The disk written as the engine commits (1 MiB writes, 4 in
        // flight, an fdatasync every 4 MiB: the engine run's appends and
        // group commits), into fresh space and over written blocks.
        let (synced_fresh, synced_over) = baseline::disk_synced(
            scratch,
            plan.disk_streams,
            plan.disk_mib_per_stream,
            SYNCED_BLOCK_KIB,
            SYNCED_QUEUE_DEPTH,
            SYNCED_GROUP_MIB,
        )?;
        rounds.disk_synced_fresh.push(synced_fresh);
        rounds.disk_synced_overwrite.push(synced_over);
        let r = if (br.block_kib, br.queue_depth) == (bw.block_kib, bw.queue_depth) {
            w
        } else {
            baseline::disk(
                scratch,
                plan.disk_streams,
                plan.disk_mib_per_stream,
                br.block_kib,
                br.queue_depth,
            )?
        };
        rounds.disk_read.push(r.read_mb_s);
        // fio at the best write setting; after a first round without it
        // (absent or failed), no more tries.
        if round == 0 || matches!(fio, crosscheck::Check::Ok(_)) {
            fio = crosscheck::fio(
                fio_tool.as_deref(),
                scratch,
                plan.disk_streams,
                plan.disk_mib_per_stream,
                bw.block_kib,
                bw.queue_depth,
            );
            if let crosscheck::Check::Ok(run) = &fio {
                rounds.fio_write.push(run.figures.write_mb_s);
                rounds.fio_read.push(run.figures.read_mb_s);
            }
        }
        let e = engine::measure(&engine_args)?;
        rounds.engine_append.push(e.append_mb_s);
        rounds.engine_read.push(e.read_cold_mb_s);
        let steady = engine::measure(&steady_args)?;
        rounds.engine_steady_append.push(steady.append_mb_s);
        tracing::info!(
            round,
            disk_write = w.write_mb_s,
            disk_read = r.read_mb_s,
            engine_append = e.append_mb_s,
            engine_read = e.read_cold_mb_s,
            engine_steady_append = steady.append_mb_s,
            "disk and engine in turn"
        );
        check_stop(stop)?;
    }
    // The disk's best write: into fresh space or over written blocks,
    // whichever is faster on this disk.
    let in_process = baseline::DiskFigures {
        write_mb_s: stats::median(&rounds.disk_write).max(stats::median(&rounds.disk_overwrite)),
        read_mb_s: stats::median(&rounds.disk_read),
    };
    let fio_median = match &fio {
        crosscheck::Check::Ok(run) => crosscheck::Check::Ok(crosscheck::FioRun {
            figures: crosscheck::FioFigures {
                write_mb_s: stats::median(&rounds.fio_write),
                read_mb_s: stats::median(&rounds.fio_read),
            },
            ioengine: run.ioengine.clone(),
        }),
        other => other.clone(),
    };
    let disk = crosscheck::disk_limit(in_process, &fio_median);
    let fio = fio_median;
    let engine = EngineMedians {
        append_mb_s: stats::median(&rounds.engine_append),
        read_cold_mb_s: stats::median(&rounds.engine_read),
        steady_append_mb_s: stats::median(&rounds.engine_steady_append),
    };
    let iperf3 = crosscheck::iperf3(crosscheck::find_tool("iperf3").as_deref());
    progress.inc(est[1]);
    check_stop(stop)?;

    step("starting a skiff node");
    let data_dir = scratch.join("node-data");
    // Retention checked every second, not Kafka's 5 minutes: the steady-state
    // produce step needs it to remove (and so recycle) segments while it runs.
    // Topics without a retention limit cost one look per partition.
    let node = NodeProcess::start_with_settings(
        skiff,
        &data_dir,
        &args.out.join("node.log"),
        None,
        &["log.retention.check.interval.ms=1000".to_string()],
    )?;
    let bootstrap = node.bootstrap.clone();
    progress.inc(est[2]);

    let mut workloads = Vec::new();
    let limit = disk.write_mb_s.min(loopback_mb_s);
    let base = |topic: &str| {
        let mut w = WorkloadArgs::new(&bootstrap, topic);
        w.partitions = plan.partitions;
        w.record_size = plan.record_size;
        w.batch_bytes = plan.batch_bytes;
        w.connections = plan.connections;
        w.max_in_flight = plan.max_in_flight;
        w
    };

    // Produce: acks x compression, and after acks=all/none the same workload
    // as an idempotent and as a transactional producer. Right after the first
    // one, a catch-up read of everything it wrote (then its topic goes, as
    // every topic does after its step, so the disk holds one workload's data
    // at a time).
    let mut headline = None;
    let mut single_all = None;
    let mut catchup = None;
    let transactional = produce::Mode::Transactional {
        id: "skiff-bench-suite".to_string(),
        commit_interval: Duration::from_millis(plan.commit_interval_ms),
    };
    let mut modes_json = serde_json::Map::new();
    for (acks, compression, mode) in [
        (1i16, Compression::None, produce::Mode::Plain),
        (-1, Compression::None, produce::Mode::Plain),
        (-1, Compression::None, produce::Mode::Idempotent),
        (-1, Compression::None, transactional),
        (1, Compression::Lz4, produce::Mode::Plain),
        (-1, Compression::Lz4, produce::Mode::Plain),
    ] {
        let plain = mode == produce::Mode::Plain;
        let mut w = base(&format!(
            "produce-acks{}-{}{}",
            acks_label(acks),
            compression.name(),
            if plain {
                String::new()
            } else {
                format!("-{}", mode.name())
            }
        ));
        w.acks = acks;
        w.compression = compression;
        w.duration = if plain {
            plan.produce_s
        } else {
            plan.producer_modes_s
        };
        w.num_records = disk_budget(scratch, 1, plan.record_size);
        let name = match &mode {
            produce::Mode::Plain => {
                format!("produce acks={} {}", w.acks_name(), compression.name())
            }
            produce::Mode::Idempotent => {
                format!(
                    "produce idempotent acks={} {}",
                    w.acks_name(),
                    compression.name()
                )
            }
            produce::Mode::Transactional {
                commit_interval, ..
            } => format!(
                "produce transactional acks={} {} (commit every {} ms)",
                w.acks_name(),
                compression.name(),
                commit_interval.as_millis()
            ),
        };
        step(&name);
        let cluster = Cluster::discover(&w.bootstrap, &w.topic, w.partitions, true)?;
        let outcome = produce::produce_with(&cluster, &w, &mode, Some(stop.clone()))?;
        check_stop(stop)?;
        anyhow::ensure!(
            outcome.report.errors == 0,
            "{name}: {} produce errors",
            outcome.report.errors
        );
        progress.inc(if plain { est[3] / 4 } else { est[10] / 2 });
        let r = &outcome.report;
        if plain && acks == -1 && compression == Compression::None {
            single_all = Some(r.clone());
        }
        if !plain {
            let against = single_all
                .as_ref()
                .context("the producer modes run after the plain acks=all none produce")?;
            modes_json.insert(mode.name().to_string(), mode_json(r, against));
        }
        workloads.push(WorkloadResult {
            name,
            kind: "produce",
            mb_s: r.mb_s,
            records_s: r.records_s,
            latency: Some(r.latency),
            latency_curve: stats::percentile_curve(&outcome.histogram),
            timeline: r.timeline.clone(),
            report: serde_json::to_value(r)?,
        });
        if headline.is_none() {
            headline = Some(r.clone());
            step("consume: catch-up read of what the first produce wrote");
            let mut w = w.clone();
            w.duration = plan.consume_s;
            let report = consume::consume_topic(&cluster, &w, false, Some(stop.clone()))?.report;
            check_stop(stop)?;
            anyhow::ensure!(
                report.records == r.records || report.secs >= plan.consume_s,
                "catch-up read {} of {} records",
                report.records,
                r.records
            );
            progress.inc(est[4]);
            workloads.push(consume_result(
                "consume catch-up (from disk and cache)",
                &report,
            )?);
            catchup = Some(report);
        }
        kafka::delete_topic(&bootstrap, &w.topic)?;
    }
    let headline = headline.context("no produce workload ran")?;
    let single_all = single_all.context("no acks=all produce workload ran")?;
    let catchup = catchup.context("no catch-up read ran")?;

    // The headline produce again, at steady state: a topic whose retention
    // keeps two segments per partition, warmed up with six, so retention
    // removes segments while it runs and new ones reuse their files (as the
    // engine's steady-state row). Disk use stays bounded by the retention.
    let steady_name = "produce acks=1 none at steady state (retention on, segments recycled)";
    step(steady_name);
    let mut w = base("produce-acks1-none-steady");
    let segment = plan.steady_segment_mib << 20;
    kafka::create_replicated_topic(
        &bootstrap,
        &w.topic,
        w.partitions,
        1,
        &[
            ("segment.bytes", &segment.to_string()),
            ("retention.bytes", &(2 * segment).to_string()),
        ],
        Duration::from_secs(30),
    )?;
    let cluster = Cluster::discover(&w.bootstrap, &w.topic, w.partitions, false)?;
    w.acks = 1;
    w.num_records =
        Some(STEADY_WARMUP_SEGMENTS * segment * w.partitions as u64 / plan.record_size as u64);
    w.duration = STEADY_WARMUP_MAX_S;
    let warmup = produce::produce_with(&cluster, &w, &produce::Mode::Plain, Some(stop.clone()))?;
    check_stop(stop)?;
    w.num_records = None;
    w.duration = plan.produce_s;
    let outcome = produce::produce_with(&cluster, &w, &produce::Mode::Plain, Some(stop.clone()))?;
    check_stop(stop)?;
    let errors = warmup.report.errors + outcome.report.errors;
    anyhow::ensure!(errors == 0, "{steady_name}: {errors} produce errors");
    progress.inc(est[11]);
    let steady = outcome.report.clone();
    workloads.push(produce_result(steady_name, &outcome)?);
    kafka::delete_topic(&bootstrap, &w.topic)?;

    // Hot consume: a topic that fits the node's batch cache, read again and again.
    step("consume: hot reads of a cached topic");
    let mut w = base("consume-hot");
    w.num_records = Some((plan.hot_topic_mib << 20) / plan.record_size as u64);
    w.duration = 60.0;
    let cluster = Cluster::discover(&w.bootstrap, &w.topic, w.partitions, true)?;
    produce::produce(&cluster, &w, Some(stop.clone()))?;
    check_stop(stop)?;
    w.duration = plan.consume_s;
    let hot = consume::consume_topic(&cluster, &w, true, Some(stop.clone()))?.report;
    check_stop(stop)?;
    kafka::delete_topic(&bootstrap, &w.topic)?;
    progress.inc(est[5]);
    workloads.push(consume_result("consume hot (cached, repeated)", &hot)?);

    // End-to-end latency at a fixed rate.
    let mut e2e_runs = Vec::new();
    for acks in [1i16, -1] {
        let mut w = base(&format!("e2e-acks{}", acks_label(acks)));
        w.acks = acks;
        w.batch_bytes = plan.e2e_batch_bytes;
        w.rate = Some(plan.e2e_rate_records_s);
        w.duration = plan.e2e_s;
        let name = format!(
            "e2e acks={} at {} records/s",
            w.acks_name(),
            plan.e2e_rate_records_s
        );
        step(&name);
        let cluster = Cluster::discover(&w.bootstrap, &w.topic, w.partitions, true)?;
        let outcome = e2e::e2e(&cluster, &w, Some(stop.clone()))?;
        check_stop(stop)?;
        kafka::delete_topic(&bootstrap, &w.topic)?;
        progress.inc(est[6] / 2);
        let r = &outcome.report;
        anyhow::ensure!(
            r.records_consumed == r.records_produced,
            "{name}: consumed {} of {} records",
            r.records_consumed,
            r.records_produced
        );
        workloads.push(WorkloadResult {
            name,
            kind: "e2e",
            mb_s: r.produce.mb_s,
            records_s: r.produce.records_s,
            latency: Some(r.latency),
            latency_curve: stats::percentile_curve(&outcome.histogram),
            timeline: r.produce.timeline.clone(),
            report: serde_json::to_value(r)?,
        });
        e2e_runs.push(r.latency);
    }

    node.stop()?;
    // Its data goes before the cluster starts: the cluster's steps are
    // sized to the free space.
    if let Err(e) = std::fs::remove_dir_all(&data_dir) {
        tracing::warn!(dir = %data_dir.display(), error = %e, "removing the single node's data");
    }

    // TLS: the headline produce and its catch-up read again, against a node
    // on an SSL listener, so the cost of encryption shows beside them.
    let tls = over_tls(args, plan, skiff, scratch, stop, &step)?;
    progress.inc(est[8]);
    let quota = under_quota(args, plan, skiff, scratch, stop, &step).with_context(|| {
        format!(
            "quota step (node log node-quota.log in {})",
            args.out.display()
        )
    })?;
    check_stop(stop)?;
    progress.inc(est[9]);
    for (name, outcome) in [
        ("produce probe alone (quota step)", &quota.probe_alone),
        (
            "produce probe beside a throttled producer",
            &quota.probe_beside,
        ),
    ] {
        workloads.push(produce_result(name, outcome)?);
    }
    let (pa, pb) = (
        quota.probe_alone.report.latency,
        quota.probe_beside.report.latency,
    );
    let quota_json = serde_json::json!({
        "limit_mb_s": QUOTA_BYTES_S as f64 / 1e6,
        "greedy_mb_s": quota.greedy_steady_mb_s,
        "greedy_vs_quota": quota.greedy_steady_mb_s * 1e6 / QUOTA_BYTES_S as f64,
        "greedy_whole_run_mb_s": quota.greedy_mb_s,
        "window_num": quota.windows,
        "probe_alone_p50_ms": pa.p50_ms,
        "probe_alone_p99_ms": pa.p99_ms,
        "probe_beside_p50_ms": pb.p50_ms,
        "probe_beside_p99_ms": pb.p99_ms,
    });
    let tls_json = match &tls {
        Some((produce, consume)) => {
            workloads.push(produce_result("produce acks=1 none over TLS", produce)?);
            workloads.push(consume_result("consume catch-up over TLS", consume)?);
            serde_json::json!({
                "produce_mb_s": produce.report.mb_s,
                "produce_p99_ms": produce.report.latency.p99_ms,
                "consume_mb_s": consume.mb_s,
                "produce_vs_plaintext": produce.report.mb_s / headline.mb_s.max(1e-9),
                "consume_vs_plaintext": consume.mb_s / catchup.mb_s.max(1e-9),
            })
        }
        None => serde_json::Value::Null,
    };

    // Replicated: the same acks=all produce against three nodes, RF=3. The
    // single node is stopped first so the cluster has the machine to itself.
    let mut w = base("produce-replicated-acksall-none");
    w.acks = -1;
    w.compression = Compression::None;
    w.duration = plan.replicated_s;
    w.num_records = disk_budget(
        scratch,
        usize::try_from(plan.replication_factor).unwrap_or(1),
        plan.record_size,
    );
    let name = format!(
        "produce acks=all none, {} nodes RF={}",
        plan.replicated_nodes, plan.replication_factor
    );
    step(&format!("{name}: starting the cluster"));
    let replicated = replicated(args, plan, skiff, scratch, &mut w, stop, |msg| {
        step(&format!("{name}: {msg}"))
    })
    .with_context(|| {
        format!(
            "replicated workload ({} nodes, replication factor {}, acks=all; node logs \
             node-1.log.. in {})",
            plan.replicated_nodes,
            plan.replication_factor,
            args.out.display()
        )
    })?;
    check_stop(stop)?;
    progress.inc(est[7]);
    let rr = &replicated.outcome.report;
    let rl = rr.latency;
    workloads.push(WorkloadResult {
        name: name.clone(),
        kind: "replicated",
        mb_s: rr.mb_s,
        records_s: rr.records_s,
        latency: Some(rl),
        latency_curve: stats::percentile_curve(&replicated.outcome.histogram),
        timeline: rr.timeline.clone(),
        report: serde_json::to_value(rr)?,
    });

    let l = headline.latency;
    let e2e1 = e2e_runs.first().copied().unwrap_or_default();
    Ok(serde_json::json!({
        "skiff_bench_version": env!("CARGO_PKG_VERSION"),
        "quick": args.quick,
        "started_at_unix_s": std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        "machine": machine(scratch),
        "plan": plan,
        "baseline": {
            "disk_write_mb_s": disk.write_mb_s,
            "disk_fresh_write_mb_s": stats::median(&rounds.disk_write),
            "disk_overwrite_mb_s": stats::median(&rounds.disk_overwrite),
            // Written as the engine commits: not the limit, what every
            // acknowledgement's fdatasync leaves of it.
            "disk_synced": {
                "block_kib": SYNCED_BLOCK_KIB,
                "queue_depth": SYNCED_QUEUE_DEPTH,
                "fdatasync_every_mib": SYNCED_GROUP_MIB,
                "fresh_write_mb_s": stats::median(&rounds.disk_synced_fresh),
                "overwrite_mb_s": stats::median(&rounds.disk_synced_overwrite),
            },
            "disk_read_mb_s": disk.read_mb_s,
            "disk_sweep": sweep,
            // Each figure of every round of the disk (at the sweep's best
            // settings), fio and the engine in turn; the figures above and
            // the engine's are their medians.
            "rounds": rounds,
            "loopback_mb_s": loopback_mb_s,
            "fio": crosscheck::fio_json(&fio),
            "iperf3": crosscheck::iperf3_json(&iperf3),
        },
        "engine": {
            "append_mb_s": engine.append_mb_s,
            "read_cold_mb_s": engine.read_cold_mb_s,
            // The same appends at steady state (retention on, segment files
            // reused): see the rounds.
            "steady_append_mb_s": engine.steady_append_mb_s,
        },
        "produce": {
            "workload": "acks=1, compression none",
            "mb_s": headline.mb_s,
            "wire_mb_s": headline.wire_mb_s,
            "records_s": headline.records_s,
            "p50_ms": l.p50_ms,
            "p90_ms": l.p90_ms,
            "p99_ms": l.p99_ms,
            "p999_ms": l.p999_ms,
            "max_ms": l.max_ms,
            // The same at steady state (retention on, segments recycled).
            "steady_mb_s": steady.mb_s,
            "steady_p99_ms": steady.latency.p99_ms,
            "steady_p999_ms": steady.latency.p999_ms,
        },
        "consume": {
            "mb_s": hot.mb_s,
            "records_s": hot.records_s,
            "catchup_mb_s": catchup.mb_s,
            "catchup_records_s": catchup.records_s,
        },
        "e2e": {
            "workload": format!("acks=1 at {} records/s", plan.e2e_rate_records_s),
            "p50_ms": e2e1.p50_ms,
            "p90_ms": e2e1.p90_ms,
            "p99_ms": e2e1.p99_ms,
            "p999_ms": e2e1.p999_ms,
            "max_ms": e2e1.max_ms,
        },
        // Null when openssl is not installed.
        "tls": tls_json,
        "quota": quota_json,
        "ratios": {
            "engine_vs_disk": engine.append_mb_s / disk.write_mb_s,
            "engine_steady_vs_disk": engine.steady_append_mb_s / disk.write_mb_s,
            "engine_vs_disk_synced": engine.append_mb_s / stats::median(&rounds.disk_synced_fresh),
            "engine_steady_vs_disk_synced": engine.steady_append_mb_s
                / stats::median(&rounds.disk_synced_overwrite),
            "engine_read_vs_disk": engine.read_cold_mb_s / disk.read_mb_s,
            "produce_vs_limit": headline.mb_s / limit,
            "produce_steady_vs_limit": steady.mb_s / limit,
            "consume_vs_loopback": hot.mb_s / loopback_mb_s,
            "catchup_vs_limit": catchup.mb_s / disk.read_mb_s.min(loopback_mb_s),
            "replicated_vs_single": rr.mb_s / single_all.mb_s,
            "idempotent_vs_plain": modes_json
                .get("idempotent")
                .and_then(|m| m.get("vs_plain"))
                .cloned()
                .unwrap_or_default(),
            "transactional_vs_plain": modes_json
                .get("transactional")
                .and_then(|m| m.get("vs_plain"))
                .cloned()
                .unwrap_or_default(),
        },
        // The acks=all/none produce as an idempotent and as a transactional
        // producer, each over the plain one of this run.
        "producer_modes": modes_json,
        "targets": {
            "engine_vs_disk": 0.9,
            "produce_vs_limit": 0.6,
            "produce_steady_vs_limit": 0.6,
            "consume_vs_loopback": 0.7,
        },
        "workloads": workloads,
        "replicated": {
            "workload": name,
            "nodes": plan.replicated_nodes,
            "replication_factor": plan.replication_factor,
            "min_insync_replicas": plan.min_insync_replicas,
            "acks": "all",
            "compression": "none",
            "produce_mb_s": rr.mb_s,
            "wire_mb_s": rr.wire_mb_s,
            "records_s": rr.records_s,
            "p50_ms": rl.p50_ms,
            "p90_ms": rl.p90_ms,
            "p99_ms": rl.p99_ms,
            "p999_ms": rl.p999_ms,
            "max_ms": rl.max_ms,
            "connections": rr.connections,
            "leaders_per_node": replicated
                .leaders
                .iter()
                .map(|(node, n)| (node.to_string(), serde_json::Value::from(*n)))
                .collect::<serde_json::Map<_, _>>(),
            "single_node_mb_s": single_all.mb_s,
            "single_node_p99_ms": single_all.latency.p99_ms,
        },
    }))
}

/// Every figure of the rounds in which the disk, fio and the engine run in
/// turn (MB/s, one entry per round; fio's empty without fio).
#[derive(Debug, Default, serde::Serialize)]
struct Rounds {
    disk_write: Vec<f64>,
    /// The same write over blocks written once before (`disk_overwrite`).
    disk_overwrite: Vec<f64>,
    /// Written as the engine commits (`baseline::disk_synced`): into fresh
    /// space, then over those blocks.
    disk_synced_fresh: Vec<f64>,
    disk_synced_overwrite: Vec<f64>,
    disk_read: Vec<f64>,
    fio_write: Vec<f64>,
    fio_read: Vec<f64>,
    engine_append: Vec<f64>,
    engine_read: Vec<f64>,
    /// The engine's append at steady state (retention on, files recycled).
    engine_steady_append: Vec<f64>,
}

/// The raw write with the engine's commit pattern (`baseline::disk_synced`):
/// the engine run's 1 MiB appends, 4 in flight, a group commit per 4 MiB.
const SYNCED_BLOCK_KIB: usize = 1024;
const SYNCED_QUEUE_DEPTH: usize = 4;
const SYNCED_GROUP_MIB: u64 = 4;

/// The engine's figures over the rounds (medians).
struct EngineMedians {
    append_mb_s: f64,
    read_cold_mb_s: f64,
    steady_append_mb_s: f64,
}

struct Replicated {
    outcome: produce::ProduceOutcome,
    /// Partitions led by each node id.
    leaders: std::collections::BTreeMap<i32, usize>,
}

/// Starts the cluster, creates the replicated topic (waiting until every replica
/// is in sync), produces `w` against it (bootstrapping from every node; each
/// connection goes to its partitions' leader) and stops the cluster. Every
/// failure is an error: the suite has no figure to leave out.
fn replicated(
    args: &Args,
    plan: &Plan,
    skiff: &Path,
    scratch: &Path,
    w: &mut WorkloadArgs,
    stop: &StopFlag,
    step: impl Fn(&str),
) -> anyhow::Result<Replicated> {
    let cluster = ClusterProcess::start(
        skiff,
        plan.replicated_nodes,
        &scratch.join("cluster-data"),
        &args.out,
    )?;
    check_stop(stop)?;
    w.bootstrap = cluster.bootstrap.clone();
    step("creating the topic");
    let min_isr = plan.min_insync_replicas.to_string();
    let leaders = kafka::create_replicated_topic(
        &w.bootstrap,
        &w.topic,
        w.partitions,
        plan.replication_factor,
        &[("min.insync.replicas", &min_isr)],
        Duration::from_secs(60),
    )?;
    step("producing");
    let topology = Cluster::discover(&w.bootstrap, &w.topic, w.partitions, false)?;
    let outcome = produce::produce(&topology, w, Some(stop.clone()))?;
    check_stop(stop)?;
    anyhow::ensure!(
        outcome.report.errors == 0,
        "{} produce errors (see the warnings above and the node logs)",
        outcome.report.errors
    );
    anyhow::ensure!(outcome.report.records > 0, "no record was acknowledged");
    step("stopping the cluster");
    cluster.stop()?;
    Ok(Replicated { outcome, leaders })
}

/// The quota step's producer_byte_rate for client id `bench-greedy`.
/// Segments per partition the steady-state produce step writes before it
/// measures (its retention keeps two), and the most seconds that may take.
const STEADY_WARMUP_SEGMENTS: u64 = 6;
const STEADY_WARMUP_MAX_S: f64 = 120.0;

const QUOTA_BYTES_S: u64 = 20_000_000;
/// The probe's offered load (records/s).
const QUOTA_PROBE_RATE: u64 = 1000;
/// Whole quota windows the greedy producer is measured over, after its first.
const QUOTA_PERIODS: f64 = 3.0;

/// The node's `quota.window.num` (windows of 1 s): Kafka's 11 in a full
/// run, 3 in a quick one (shorter periods, the same rule).
fn quota_windows(quick: bool) -> u64 {
    if quick {
        3
    } else {
        11
    }
}

struct QuotaOutcome {
    /// The greedy producer's MB/s over whole windows after its first, and
    /// over its whole run.
    greedy_steady_mb_s: f64,
    greedy_mb_s: f64,
    windows: u64,
    probe_alone: produce::ProduceOutcome,
    probe_beside: produce::ProduceOutcome,
}

/// Client quotas: a node whose client id `bench-greedy` has a
/// producer_byte_rate quota; a probe producer (acks=1, one partition, a
/// fixed rate, no quota) alone, then beside a greedy producer (a second
/// skiff-bench process with that client id, as fast as it may go). A
/// greedy client is held in bursts: Kafka's rate is measured over the
/// window, so a client that spent the window's worth is muted until its
/// bytes age out of it and then sends the next window's worth at once. Its
/// rate is therefore taken over whole windows after its first (in which a
/// new client may send the window's worth at once), and the probe runs
/// beside it in those.
fn under_quota(
    args: &Args,
    plan: &Plan,
    skiff: &Path,
    scratch: &Path,
    stop: &StopFlag,
    step: &dyn Fn(&str),
) -> anyhow::Result<QuotaOutcome> {
    step("quota: a node with a producer quota");
    let windows = quota_windows(args.quick);
    let data_dir = scratch.join("quota-node-data");
    let node = NodeProcess::start_with_settings(
        skiff,
        &data_dir,
        &args.out.join("node-quota.log"),
        None,
        &[format!("quota.window.num={windows}")],
    )?;
    let set = std::process::Command::new(skiff)
        .args(["quota", "set", "--client-id", "bench-greedy", "--set"])
        .arg(format!("producer_byte_rate={QUOTA_BYTES_S}"))
        .args(["--bootstrap", &node.bootstrap])
        .output()
        .context("running skiff quota set")?;
    anyhow::ensure!(
        set.status.success(),
        "skiff quota set: {}",
        String::from_utf8_lossy(&set.stderr)
    );
    let mut probe = WorkloadArgs::new(&node.bootstrap, "quota-probe");
    probe.partitions = 1;
    probe.record_size = plan.record_size;
    probe.batch_bytes = plan.e2e_batch_bytes;
    probe.connections = 1;
    probe.max_in_flight = plan.max_in_flight;
    probe.rate = Some(QUOTA_PROBE_RATE);
    probe.duration = plan.produce_s.min(QUOTA_PERIODS * windows as f64);
    let cluster = Cluster::discover(&probe.bootstrap, &probe.topic, probe.partitions, true)?;
    step("quota: the probe alone");
    let probe_alone = produce::produce(&cluster, &probe, Some(stop.clone()))?;
    check_stop(stop)?;

    step("quota: a greedy producer held to its quota");
    let first = windows as f64;
    let end = first * (1.0 + QUOTA_PERIODS);
    let greedy = std::process::Command::new(std::env::current_exe()?)
        .args(["--client-id", "bench-greedy", "produce", "--json"])
        .args(["--bootstrap", &node.bootstrap, "--topic", "quota-greedy"])
        .args(["--partitions", "2", "--connections", "2"])
        .arg(format!("--record-size={}", plan.record_size))
        .arg(format!("--batch-bytes={}", plan.batch_bytes))
        .arg(format!("--duration={}", end + 0.5))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .context("starting the greedy skiff-bench produce")?;
    std::thread::sleep(Duration::from_secs_f64(first));
    step("quota: the probe beside the throttled producer");
    let probe_beside = produce::produce(&cluster, &probe, Some(stop.clone()));
    let greedy = greedy
        .wait_with_output()
        .context("waiting for the greedy producer")?;
    let probe_beside = probe_beside?;
    check_stop(stop)?;
    anyhow::ensure!(greedy.status.success(), "the greedy producer failed");
    let report: serde_json::Value = serde_json::from_slice(&greedy.stdout)
        .context("reading the greedy producer's JSON report")?;
    let steady: Vec<f64> = report["timeline"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["t_s"].as_f64().is_some_and(|t| t > first && t <= end))
        .filter_map(|p| p["mb_s"].as_f64())
        .collect();
    anyhow::ensure!(
        !steady.is_empty(),
        "the greedy producer's timeline is empty"
    );
    node.stop()?;
    if let Err(e) = std::fs::remove_dir_all(&data_dir) {
        tracing::warn!(dir = %data_dir.display(), error = %e, "removing the quota node's data");
    }
    Ok(QuotaOutcome {
        greedy_steady_mb_s: steady.iter().sum::<f64>() / steady.len() as f64,
        greedy_mb_s: report["mb_s"].as_f64().unwrap_or(0.0),
        windows,
        probe_alone,
        probe_beside,
    })
}

/// The TLS steps: a node on an SSL listener with a certificate made here by
/// openssl, the headline produce (acks=1, no compression) and a catch-up
/// read of it. None when openssl is not installed (logged; results.json
/// says null).
fn over_tls(
    args: &Args,
    plan: &Plan,
    skiff: &Path,
    scratch: &Path,
    stop: &StopFlag,
    step: &dyn Fn(&str),
) -> anyhow::Result<Option<(produce::ProduceOutcome, consume::ConsumeReport)>> {
    let Some(openssl) = crosscheck::find_tool("openssl") else {
        tracing::warn!("openssl is not installed: the TLS steps are left out");
        return Ok(None);
    };
    step("TLS: a node on an SSL listener");
    let pki = scratch.join("tls");
    let (keystore, ca) = make_certificate(&openssl, &pki)?;
    let data_dir = scratch.join("tls-node-data");
    let node = NodeProcess::start_with(
        skiff,
        &data_dir,
        &args.out.join("node-tls.log"),
        Some((&keystore, &ca)),
    )?;
    let mut w = WorkloadArgs::new(&node.bootstrap, "produce-tls");
    w.partitions = plan.partitions;
    w.record_size = plan.record_size;
    w.batch_bytes = plan.batch_bytes;
    w.connections = plan.connections;
    w.max_in_flight = plan.max_in_flight;
    w.duration = plan.produce_s;
    w.num_records = disk_budget(scratch, 1, plan.record_size);
    step("produce acks=1 none over TLS");
    let cluster = Cluster::discover(&w.bootstrap, &w.topic, w.partitions, true)?;
    let produced = produce::produce(&cluster, &w, Some(stop.clone()))?;
    check_stop(stop)?;
    anyhow::ensure!(
        produced.report.errors == 0,
        "produce over TLS: {} errors",
        produced.report.errors
    );
    step("consume catch-up over TLS");
    w.duration = plan.consume_s;
    let consumed = consume::consume_topic(&cluster, &w, false, Some(stop.clone()))?.report;
    check_stop(stop)?;
    node.stop()?;
    if let Err(e) = std::fs::remove_dir_all(&data_dir) {
        tracing::warn!(dir = %data_dir.display(), error = %e, "removing the TLS node's data");
    }
    Ok(Some((produced, consumed)))
}

/// A certificate authority and a node certificate for 127.0.0.1 signed by
/// it, in `dir`: (the node's PEM keystore, the authority's PEM).
fn make_certificate(openssl: &Path, dir: &Path) -> anyhow::Result<(PathBuf, PathBuf)> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n",
    )?;
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let steps: [Vec<&str>; 3] = [
        [
            &["req", "-x509"][..],
            &ec,
            &["-keyout", "ca.key", "-out", "ca.pem", "-days", "2"],
            &[
                "-subj",
                "/CN=skiff-bench CA",
                "-addext",
                "basicConstraints=critical,CA:TRUE",
            ],
        ]
        .concat(),
        [
            &["req"][..],
            &ec,
            &["-keyout", "node.key", "-out", "node.csr"],
            &["-subj", "/CN=skiff-bench node"],
        ]
        .concat(),
        vec![
            "x509",
            "-req",
            "-in",
            "node.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-out",
            "node.pem",
            "-extfile",
            "ext.cnf",
        ],
    ];
    for args in steps {
        let out = std::process::Command::new(openssl)
            .args(&args)
            .current_dir(dir)
            .output()
            .with_context(|| format!("running {}", openssl.display()))?;
        anyhow::ensure!(
            out.status.success(),
            "openssl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let keystore = dir.join("node.keystore.pem");
    let mut pem = std::fs::read(dir.join("node.key"))?;
    pem.extend(std::fs::read(dir.join("node.pem"))?);
    std::fs::write(&keystore, pem)?;
    Ok((keystore, dir.join("ca.pem")))
}

/// At most this share of the scratch disk's free space goes to one produce step.
const DISK_SHARE: f64 = 0.5;

/// Records a closed-loop produce step may write so that its `replicas` copies
/// fit in `DISK_SHARE` of the free space where the nodes keep their data: a fast
/// disk can take tens of GB in a 20 s step, and a full disk stalls the node
/// rather than measuring it. None when the free space is unknown.
fn disk_budget(dir: &Path, replicas: usize, record_size: usize) -> Option<u64> {
    let free = free_bytes(dir)?;
    let records = (free as f64 * DISK_SHARE) as u64 / (replicas.max(1) * record_size.max(1)) as u64;
    tracing::info!(
        free_gb = free as f64 / 1e9,
        replicas,
        records,
        "produce step capped to the free disk space"
    );
    Some(records.max(1))
}

/// Free bytes (for unprivileged users) of the file system holding `dir`.
fn free_bytes(dir: &Path) -> Option<u64> {
    skiff_engine::fsutil::disk_space(dir)
        .ok()
        .map(|(_, available)| available)
}

fn acks_label(acks: i16) -> &'static str {
    if acks == -1 {
        "all"
    } else if acks == 0 {
        "0"
    } else {
        "1"
    }
}

fn produce_result(name: &str, o: &produce::ProduceOutcome) -> anyhow::Result<WorkloadResult> {
    Ok(WorkloadResult {
        name: name.to_string(),
        kind: "produce",
        mb_s: o.report.mb_s,
        records_s: o.report.records_s,
        latency: Some(o.report.latency),
        latency_curve: stats::percentile_curve(&o.histogram),
        timeline: o.report.timeline.clone(),
        report: serde_json::to_value(&o.report)?,
    })
}

/// An idempotent or transactional produce step for `producer_modes`, with
/// its MB/s over `plain`'s (the same workload without a producer id).
fn mode_json(r: &produce::ProduceReport, plain: &produce::ProduceReport) -> serde_json::Value {
    let mut v = serde_json::json!({
        "workload": format!("acks={}, compression {}", r.acks, r.compression),
        "mb_s": r.mb_s,
        "records_s": r.records_s,
        "p50_ms": r.latency.p50_ms,
        "p99_ms": r.latency.p99_ms,
        "max_ms": r.latency.max_ms,
        "plain_mb_s": plain.mb_s,
        "vs_plain": r.mb_s / plain.mb_s.max(1e-9),
    });
    if let Some(t) = &r.transactions {
        v["commit_interval_ms"] = t.commit_interval_ms.into();
        v["transactions"] = t.committed.into();
        v["commit_p50_ms"] = t.commit_latency.p50_ms.into();
        v["commit_p99_ms"] = t.commit_latency.p99_ms.into();
        v["commit_max_ms"] = t.commit_latency.max_ms.into();
        v["concurrent_transactions_retries"] = t.retries.into();
    }
    v
}

fn consume_result(name: &str, r: &consume::ConsumeReport) -> anyhow::Result<WorkloadResult> {
    anyhow::ensure!(r.errors == 0, "{name}: {} fetch errors", r.errors);
    Ok(WorkloadResult {
        name: name.to_string(),
        kind: "consume",
        mb_s: r.mb_s,
        records_s: r.records_s,
        latency: None,
        latency_curve: Vec::new(),
        timeline: r.timeline.clone(),
        report: serde_json::to_value(r)?,
    })
}

/// What the run ran on, read from /proc and /sys (best effort: unknown fields
/// say so).
fn machine(data_dir: &Path) -> Machine {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu = cpuinfo
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .and_then(|r| r.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let memory_kib: f64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0.0);
    Machine {
        nproc: std::thread::available_parallelism().map_or(0, |n| n.get()),
        cpu,
        memory_gib: (memory_kib / 1024.0 / 1024.0 * 10.0).round() / 10.0,
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map_or_else(|_| "unknown".into(), |s| s.trim().to_string()),
        disk: disk_of(data_dir),
    }
}

/// "device fstype (ssd|rotational)" of the mount holding `path`.
fn disk_of(path: &Path) -> String {
    let path = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    let best = mounts
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            Some((f.next()?, f.next()?, f.next()?))
        })
        .filter(|(_, mount, _)| path.starts_with(mount))
        .max_by_key(|(_, mount, _)| mount.len());
    let Some((device, _, fstype)) = best else {
        return "unknown".into();
    };
    let name = device.rsplit('/').next().unwrap_or(device);
    // A partition's queue settings are its disk's: vda1 -> vda, nvme0n1p1 -> nvme0n1.
    let mut disk = name.to_string();
    while !Path::new(&format!("/sys/block/{disk}")).exists() && !disk.is_empty() {
        disk.pop();
        if disk.ends_with('p') && disk.contains("nvme") {
            disk.pop();
        }
    }
    let kind = match std::fs::read_to_string(format!("/sys/block/{disk}/queue/rotational")) {
        Ok(s) if s.trim() == "0" => "non-rotational",
        Ok(_) => "rotational",
        Err(_) => "unknown kind",
    };
    let model = std::fs::read_to_string(format!("/sys/block/{disk}/device/model"))
        .map(|m| format!(", {}", m.trim()))
        .unwrap_or_default();
    format!("{device} {fstype} ({kind}{model})")
}
