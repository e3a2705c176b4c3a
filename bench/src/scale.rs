//! `skiff-bench scale`: what partitions and connections cost (issue 15).
//!
//! For each partition count, on a fresh cluster it starts (one node, or N with
//! RF=N): the time CreateTopics takes until every partition has a leader, produce
//! at a fixed offered load (MB/s and latency percentiles), disk allocated beside
//! the bytes of records it holds, the nodes' resident memory, consume MB/s from
//! the earliest offsets, and the time from a restart until every node serves
//! again, after SIGTERM and after SIGKILL; unless `--no-closed-loop`, also
//! produce as fast as the in-flight limits allow (closed loop) and then open
//! loop at half that rate (issue 15 compares 1,000 partitions' closed-loop
//! MB/s with 16's, and asks for p99 at half of it). Then, on a fresh 16-partition
//! cluster, what idle connections cost: resident memory per connection and the
//! active producer's latency with and without them open.
//!
//! Results: `results.json`, `results.md` and `scale.svg` (each cost against
//! partitions) in `--out`.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args as ClapArgs;
use plotters::prelude::*;
use serde::Serialize;

use crate::kafka::{self, Cluster, Connection};
use crate::node_process::{self, ClusterProcess};
use crate::stats::Latency;
use crate::workload::WorkloadArgs;

#[derive(ClapArgs, Debug)]
pub struct Args {
    /// Partition counts to measure, each on a fresh cluster.
    #[arg(long, value_delimiter = ',', default_value = "16,100,1000,10000")]
    pub partitions: Vec<i32>,
    /// Idle connection counts to measure (on a fresh 16-partition cluster);
    /// the flag with no value skips them.
    #[arg(long, value_delimiter = ',', num_args = 0.., default_value = "10,1000")]
    pub idle_connections: Vec<usize>,
    /// Nodes per cluster; the topic's replication factor is the same.
    #[arg(long, default_value_t = 1)]
    pub nodes: usize,
    /// Offered produce load in MB/s of record values (open loop).
    #[arg(long, default_value_t = 20.0)]
    pub rate_mb: f64,
    #[arg(long, default_value_t = 1024)]
    pub record_size: usize,
    #[arg(long, default_value_t = 16384)]
    pub batch_bytes: usize,
    /// Seconds of produce load per step.
    #[arg(long, default_value_t = 8.0)]
    pub duration: f64,
    /// The `skiff` binary (default: next to this one, or SKIFF_BIN).
    #[arg(long)]
    pub skiff: Option<PathBuf>,
    /// Where the nodes' data goes (a scratch directory inside it, removed after).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Where results go.
    #[arg(long, default_value = "scale-results")]
    pub out: PathBuf,
    /// Skip each step's closed-loop produce and the open-loop one at half its rate.
    #[arg(long)]
    pub no_closed_loop: bool,
}

/// A step's closed-loop produce, and an open-loop one at half its rate.
#[derive(Debug, Serialize)]
pub struct Headroom {
    pub max_mb_s: f64,
    pub max_latency: Latency,
    pub half_rate_mb_s: f64,
    pub half_rate_latency: Latency,
}

#[derive(Debug, Serialize)]
pub struct PartitionStep {
    pub partitions: i32,
    pub nodes: usize,
    pub create_topic_s: f64,
    pub produce_mb_s: f64,
    pub produce_errors: u64,
    pub latency: Latency,
    /// Batch bytes acknowledged, times the replicas that hold them.
    pub record_bytes: u64,
    pub disk_allocated_bytes: u64,
    pub disk_apparent_bytes: u64,
    pub rss_bytes: u64,
    pub consume_mb_s: f64,
    pub restart_clean_s: f64,
    pub restart_crash_s: f64,
    pub closed_loop: Option<Headroom>,
}

#[derive(Debug, Serialize)]
pub struct ConnectionStep {
    pub idle_connections: usize,
    pub rss_per_connection_bytes: f64,
    pub produce_mb_s_without: f64,
    pub p99_ms_without: f64,
    pub produce_mb_s_with: f64,
    pub p99_ms_with: f64,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    anyhow::ensure!(args.nodes >= 1, "--nodes must be at least 1");
    anyhow::ensure!(args.rate_mb > 0.0, "--rate-mb must be positive");
    anyhow::ensure!(
        args.partitions.iter().all(|p| *p >= 1),
        "--partitions must all be at least 1"
    );
    let skiff = node_process::find_skiff(args.skiff.as_deref())?;
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let scratch = crate::baseline::scratch_dir(args.dir.as_deref())?;
    let mut partitions = Vec::new();
    for &p in &args.partitions {
        let step = partition_step(&args, &skiff, scratch.path(), p)
            .with_context(|| format!("the {p}-partition step"))?;
        eprintln!(
            "{p} partitions: create {:.2} s, produce {:.1} MB/s p99 {:.1} ms, disk {:.1}x records, \
             RSS {} MiB, consume {:.1} MB/s, restart {:.2} s / crash {:.2} s",
            step.create_topic_s,
            step.produce_mb_s,
            step.latency.p99_ms,
            ratio(step.disk_allocated_bytes, step.record_bytes),
            step.rss_bytes >> 20,
            step.consume_mb_s,
            step.restart_clean_s,
            step.restart_crash_s
        );
        if let Some(h) = &step.closed_loop {
            eprintln!(
                "{p} partitions: closed loop {:.1} MB/s p99 {:.1} ms; at half that rate {:.1} MB/s p99 {:.1} ms",
                h.max_mb_s, h.max_latency.p99_ms, h.half_rate_mb_s, h.half_rate_latency.p99_ms
            );
        }
        partitions.push(step);
    }
    let mut connections = Vec::new();
    for &n in &args.idle_connections {
        let step = connection_step(&args, &skiff, scratch.path(), n)
            .with_context(|| format!("the {n}-idle-connection step"))?;
        eprintln!(
            "{n} idle connections: {:.1} KiB each; produce {:.1} -> {:.1} MB/s, p99 {:.1} -> {:.1} ms",
            step.rss_per_connection_bytes / 1024.0,
            step.produce_mb_s_without,
            step.produce_mb_s_with,
            step.p99_ms_without,
            step.p99_ms_with
        );
        connections.push(step);
    }
    let results = serde_json::json!({
        "nodes": args.nodes,
        "rate_mb_s": args.rate_mb,
        "record_size": args.record_size,
        "batch_bytes": args.batch_bytes,
        "duration_s": args.duration,
        "partitions": partitions,
        "connections": connections,
    });
    std::fs::write(
        args.out.join("results.json"),
        serde_json::to_string_pretty(&results)? + "\n",
    )
    .with_context(|| format!("writing {}/results.json", args.out.display()))?;
    let md = markdown(&args, &partitions, &connections);
    std::fs::write(args.out.join("results.md"), &md)
        .with_context(|| format!("writing {}/results.md", args.out.display()))?;
    plot(&args.out.join("scale.svg"), &partitions)?;
    println!("{md}");
    println!(
        "wrote {}/results.json, results.md, scale.svg",
        args.out.display()
    );
    Ok(())
}

fn workload(args: &Args, bootstrap: &str, topic: &str, partitions: i32) -> WorkloadArgs {
    let mut w = WorkloadArgs::new(bootstrap, topic);
    w.partitions = partitions;
    w.record_size = args.record_size;
    w.batch_bytes = args.batch_bytes;
    w.duration = args.duration;
    w.acks = if args.nodes > 1 { -1 } else { 1 };
    w.rate = Some(((args.rate_mb * 1e6) / args.record_size as f64).max(1.0) as u64);
    w
}

fn start_cluster(args: &Args, skiff: &Path, dir: &Path) -> anyhow::Result<ClusterProcess> {
    std::fs::create_dir_all(dir)?;
    ClusterProcess::start(skiff, args.nodes, &dir.join("data"), dir)
}

fn create_topic(args: &Args, bootstrap: &str, topic: &str, partitions: i32) -> anyhow::Result<()> {
    kafka::create_replicated_topic(
        bootstrap,
        topic,
        partitions,
        args.nodes as i16,
        &[],
        Duration::from_secs(300),
    )?;
    Ok(())
}

fn partition_step(
    args: &Args,
    skiff: &Path,
    scratch: &Path,
    partitions: i32,
) -> anyhow::Result<PartitionStep> {
    let dir = scratch.join(format!("p{partitions}"));
    let mut cluster = start_cluster(args, skiff, &dir)?;
    let topic = "scale";
    let t0 = Instant::now();
    create_topic(args, &cluster.bootstrap, topic, partitions)?;
    let create_topic_s = t0.elapsed().as_secs_f64();
    let w = workload(args, &cluster.bootstrap, topic, partitions);
    let view = Cluster::discover(&cluster.bootstrap, topic, partitions, false)?;
    let produced = crate::produce::produce(&view, &w, None)?.report;
    let rss_bytes = cluster.pids().iter().map(|p| rss(*p)).sum();
    let (disk_allocated_bytes, disk_apparent_bytes) = disk_usage(&dir.join("data"))?;
    let consumed = crate::consume::consume_topic(&view, &w, false, None)?.report;
    let closed_loop = if args.no_closed_loop {
        None
    } else {
        Some(headroom(&view, &w)?)
    };
    let restart_clean_s = cluster.restart(false)?.as_secs_f64();
    let restart_crash_s = cluster.restart(true)?.as_secs_f64();
    cluster.stop()?;
    std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    Ok(PartitionStep {
        partitions,
        nodes: args.nodes,
        create_topic_s,
        produce_mb_s: produced.mb_s,
        produce_errors: produced.errors,
        latency: produced.latency,
        record_bytes: produced.wire_bytes * args.nodes as u64,
        disk_allocated_bytes,
        disk_apparent_bytes,
        rss_bytes,
        consume_mb_s: consumed.mb_s,
        restart_clean_s,
        restart_crash_s,
        closed_loop,
    })
}

/// Produce `w`'s records as fast as the in-flight limits allow, then open
/// loop at half the rate that reached.
fn headroom(view: &Cluster, w: &WorkloadArgs) -> anyhow::Result<Headroom> {
    let mut closed = w.clone();
    closed.rate = None;
    let max = crate::produce::produce(view, &closed, None)?.report;
    let mut half = w.clone();
    half.rate = Some(((max.records_s / 2.0) as u64).max(1));
    let at_half = crate::produce::produce(view, &half, None)?.report;
    Ok(Headroom {
        max_mb_s: max.mb_s,
        max_latency: max.latency,
        half_rate_mb_s: at_half.mb_s,
        half_rate_latency: at_half.latency,
    })
}

fn connection_step(
    args: &Args,
    skiff: &Path,
    scratch: &Path,
    idle: usize,
) -> anyhow::Result<ConnectionStep> {
    let dir = scratch.join(format!("c{idle}"));
    let cluster = start_cluster(args, skiff, &dir)?;
    let topic = "scale-connections";
    create_topic(args, &cluster.bootstrap, topic, 16)?;
    let w = workload(args, &cluster.bootstrap, topic, 16);
    let view = Cluster::discover(&cluster.bootstrap, topic, 16, false)?;
    let without = crate::produce::produce(&view, &w, None)?.report;
    let before: u64 = cluster.pids().iter().map(|p| rss(*p)).sum();
    let brokers: Vec<String> = view.brokers.values().cloned().collect();
    let mut open: Vec<crate::kafka::Stream> = Vec::with_capacity(idle);
    for i in 0..idle {
        // Each asks ApiVersions once, as a client does first, then stays idle.
        let mut conn = Connection::connect(&brokers[i % brokers.len()])?;
        conn.negotiate()?;
        open.push(conn.into_stream());
    }
    std::thread::sleep(Duration::from_millis(500));
    let after: u64 = cluster.pids().iter().map(|p| rss(*p)).sum();
    let with = crate::produce::produce(&view, &w, None)?.report;
    drop(open);
    cluster.stop()?;
    std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    Ok(ConnectionStep {
        idle_connections: idle,
        rss_per_connection_bytes: after.saturating_sub(before) as f64 / idle.max(1) as f64,
        produce_mb_s_without: without.mb_s,
        p99_ms_without: without.latency.p99_ms,
        produce_mb_s_with: with.mb_s,
        p99_ms_with: with.latency.p99_ms,
    })
}

/// Resident memory of a process (VmRSS), 0 when it cannot be read.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// (bytes the filesystem allocated, bytes of file content) under `dir`.
fn disk_usage(dir: &Path) -> anyhow::Result<(u64, u64)> {
    let mut allocated = 0;
    let mut apparent = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).with_context(|| format!("listing {}", d.display()))? {
            let entry = entry?;
            let meta = entry.metadata()?;
            if meta.is_dir() {
                stack.push(entry.path());
            } else {
                allocated += meta.blocks() * 512;
                apparent += meta.len();
            }
        }
    }
    Ok((allocated, apparent))
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        f64::NAN
    } else {
        a as f64 / b as f64
    }
}

fn markdown(args: &Args, steps: &[PartitionStep], conns: &[ConnectionStep]) -> String {
    use std::fmt::Write as _;
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# skiff-bench scale\n\n{} node(s), RF {}, offered load {} MB/s of {} B records in {} B \
         batches, {} s per step\n",
        args.nodes, args.nodes, args.rate_mb, args.record_size, args.batch_bytes, args.duration
    );
    let _ = writeln!(
        md,
        "| partitions | create topic s | produce MB/s | p50 ms | p99 ms | p99.9 ms | records MiB | \
         disk allocated MiB | allocated / records | RSS MiB | consume MB/s | restart s (SIGTERM) | \
         restart s (SIGKILL) |"
    );
    let _ = writeln!(md, "|{}", "---|".repeat(13));
    for s in steps {
        let _ = writeln!(
            md,
            "| {} | {:.2} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.2} | {} | {:.1} | {:.2} | {:.2} |",
            s.partitions,
            s.create_topic_s,
            s.produce_mb_s,
            s.latency.p50_ms,
            s.latency.p99_ms,
            s.latency.p999_ms,
            s.record_bytes as f64 / 1048576.0,
            s.disk_allocated_bytes as f64 / 1048576.0,
            ratio(s.disk_allocated_bytes, s.record_bytes),
            s.rss_bytes >> 20,
            s.consume_mb_s,
            s.restart_clean_s,
            s.restart_crash_s
        );
    }
    if steps.iter().any(|s| s.closed_loop.is_some()) {
        let first = steps
            .first()
            .and_then(|s| s.closed_loop.as_ref())
            .map(|h| (steps[0].partitions, h.max_mb_s));
        let _ = writeln!(
            md,
            "\n| partitions | closed-loop MB/s | vs the first step | p99 ms | half that rate: MB/s | p99 ms | p99.9 ms |\n|---|---|---|---|---|---|---|"
        );
        for s in steps {
            let Some(h) = &s.closed_loop else { continue };
            let versus = first.map_or(String::from("-"), |(p, mb)| {
                format!("{:.2}x of {p}", h.max_mb_s / mb)
            });
            let _ = writeln!(
                md,
                "| {} | {:.1} | {} | {:.1} | {:.1} | {:.1} | {:.1} |",
                s.partitions,
                h.max_mb_s,
                versus,
                h.max_latency.p99_ms,
                h.half_rate_mb_s,
                h.half_rate_latency.p99_ms,
                h.half_rate_latency.p999_ms
            );
        }
    }
    if !conns.is_empty() {
        let _ = writeln!(
            md,
            "\n| idle connections | RSS per connection KiB | produce MB/s without / with | p99 ms without / with |\n|---|---|---|---|"
        );
        for c in conns {
            let _ = writeln!(
                md,
                "| {} | {:.1} | {:.1} / {:.1} | {:.1} / {:.1} |",
                c.idle_connections,
                c.rss_per_connection_bytes / 1024.0,
                c.produce_mb_s_without,
                c.produce_mb_s_with,
                c.p99_ms_without,
                c.p99_ms_with
            );
        }
    }
    md
}

fn plot_error<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow::anyhow!("drawing the scale plot: {e:?}")
}

/// Four panels, each a cost against partitions (log scale).
fn plot(path: &Path, steps: &[PartitionStep]) -> anyhow::Result<()> {
    if steps.is_empty() {
        return Ok(());
    }
    let root = SVGBackend::new(path, (1000, 700)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
    let panels = root.split_evenly((2, 2));
    type Metric = fn(&PartitionStep) -> f64;
    let metrics: [(&str, Metric); 4] = [
        ("disk allocated / records", |s| {
            ratio(s.disk_allocated_bytes, s.record_bytes)
        }),
        ("RSS MiB", |s| s.rss_bytes as f64 / 1048576.0),
        ("produce p99 ms", |s| s.latency.p99_ms),
        ("restart to serving s (SIGKILL)", |s| s.restart_crash_s),
    ];
    let x_max = steps.iter().map(|s| s.partitions).max().unwrap_or(1) as f64 * 1.5;
    for (panel, (name, metric)) in panels.iter().zip(metrics) {
        let points: Vec<(f64, f64)> = steps
            .iter()
            .map(|s| (s.partitions as f64, metric(s)))
            .filter(|(_, y)| y.is_finite())
            .collect();
        let y_max = points.iter().map(|p| p.1).fold(0.0, f64::max).max(1e-3) * 1.2;
        let mut chart = ChartBuilder::on(panel)
            .caption(name, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(30)
            .y_label_area_size(50)
            .build_cartesian_2d((1.0..x_max).log_scale(), 0.0..y_max)
            .map_err(plot_error)?;
        chart
            .configure_mesh()
            .x_desc("partitions")
            .draw()
            .map_err(plot_error)?;
        chart
            .draw_series(LineSeries::new(points.clone(), &BLUE))
            .map_err(plot_error)?;
        chart
            .draw_series(points.iter().map(|p| Circle::new(*p, 3, BLUE.filled())))
            .map_err(plot_error)?;
    }
    root.present().map_err(plot_error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(partitions: i32, max_mb_s: f64, p99_ms: f64) -> PartitionStep {
        let latency = Latency {
            p99_ms,
            ..Latency::default()
        };
        PartitionStep {
            partitions,
            nodes: 1,
            create_topic_s: 0.1,
            produce_mb_s: 20.0,
            produce_errors: 0,
            latency,
            record_bytes: 100 << 20,
            disk_allocated_bytes: 150 << 20,
            disk_apparent_bytes: 120 << 20,
            rss_bytes: 300 << 20,
            consume_mb_s: 1000.0,
            restart_clean_s: 0.3,
            restart_crash_s: 0.4,
            closed_loop: Some(Headroom {
                max_mb_s,
                max_latency: latency,
                half_rate_mb_s: max_mb_s / 2.0,
                half_rate_latency: latency,
            }),
        }
    }

    /// The closed-loop table compares every step with the first one, as
    /// issue 15 compares 1,000 partitions with 16.
    #[test]
    fn the_closed_loop_table_compares_each_step_with_the_first() {
        let args = Args {
            partitions: vec![16, 1000],
            idle_connections: vec![],
            nodes: 1,
            rate_mb: 20.0,
            record_size: 1024,
            batch_bytes: 16384,
            duration: 8.0,
            skiff: None,
            dir: None,
            out: PathBuf::from("x"),
            no_closed_loop: false,
        };
        let md = markdown(
            &args,
            &[step(16, 200.0, 10.0), step(1000, 150.0, 40.0)],
            &[],
        );
        assert!(
            md.contains("| 16 | 200.0 | 1.00x of 16 | 10.0 | 100.0 |"),
            "{md}"
        );
        assert!(
            md.contains("| 1000 | 150.0 | 0.75x of 16 | 40.0 | 75.0 |"),
            "{md}"
        );
        let mut without = step(16, 1.0, 1.0);
        without.closed_loop = None;
        let md = markdown(&args, &[without], &[]);
        assert!(!md.contains("closed-loop"), "{md}");
    }
}
