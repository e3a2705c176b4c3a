//! Hardware baselines, measured in-process so no outside tool is needed. When
//! `fio` or `iperf3` are on PATH, their figures are reported beside as a
//! cross-check (see [`crate::crosscheck`]).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Instant;

use anyhow::Context;
use clap::Args as ClapArgs;
use glommio::io::{DmaBuffer, DmaFile, OpenOptions};
use glommio::{LocalExecutorBuilder, Placement};

use crate::crosscheck::{self, Check};
use crate::mb_s;

#[derive(ClapArgs, Debug, Clone)]
pub struct Args {
    /// Directory for the scratch files (on the disk to measure). Default: a temp dir
    /// under the current directory.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// MiB written per stream.
    #[arg(long, default_value_t = 1024)]
    pub size_mib: u64,
    /// Write/read size in KiB (the engine's append chunk is 512). With
    /// --queue-depth, measures that one setting; without either, the best over
    /// a sweep of block sizes (256, 1024, 4096 KiB) and queue depths (1 to 32).
    #[arg(long)]
    pub block_kib: Option<usize>,
    /// I/Os in flight per stream (the engine's max_inflight_writes is 8).
    #[arg(long)]
    pub queue_depth: Option<usize>,
    /// Concurrent streams, one executor and one file each.
    #[arg(long, default_value_t = 1)]
    pub streams: usize,
    /// MiB sent over loopback TCP (0 skips it).
    #[arg(long, default_value_t = 2048)]
    pub loopback_mib: u64,
    /// Instead of the disk's limit, the write as the engine commits: an
    /// fdatasync after every this many MiB (--block-kib, default 1024, and
    /// --queue-depth, default 4, within each group), into fresh space and
    /// then over the same blocks.
    #[arg(long)]
    pub synced_every_mib: Option<u64>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct DiskFigures {
    pub write_mb_s: f64,
    pub read_mb_s: f64,
}

/// Block sizes and queue depths the disk sweep tries: the disk's limit is its
/// best over them, not whatever the engine happens to use.
pub const SWEEP_BLOCK_KIB: [usize; 3] = [256, 1024, 4096];
pub const SWEEP_QUEUE_DEPTHS: [usize; 6] = [1, 2, 4, 8, 16, 32];

/// One point of a disk sweep.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct SweepPoint {
    pub block_kib: usize,
    pub queue_depth: usize,
    pub write_mb_s: f64,
    pub read_mb_s: f64,
}

/// The best write and the best read over a sweep (each at its own setting).
#[derive(Debug, Clone, serde::Serialize)]
pub struct DiskSweep {
    pub best_write: SweepPoint,
    pub best_read: SweepPoint,
    pub points: Vec<SweepPoint>,
}

impl DiskSweep {
    pub fn figures(&self) -> DiskFigures {
        DiskFigures {
            write_mb_s: self.best_write.write_mb_s,
            read_mb_s: self.best_read.read_mb_s,
        }
    }
}

/// Measures every (block size, queue depth) pair with `size_mib` per stream
/// and keeps the best write and the best read.
pub fn sweep(
    dir: &Path,
    streams: usize,
    size_mib: u64,
    blocks_kib: &[usize],
    depths: &[usize],
) -> anyhow::Result<DiskSweep> {
    let mut points = Vec::new();
    for &block_kib in blocks_kib {
        for &queue_depth in depths {
            // At least 16 blocks per stream, so the deepest queue fills.
            let size = size_mib.max((block_kib as u64 * 16).div_ceil(1024));
            let d = disk(dir, streams, size, block_kib, queue_depth)?;
            tracing::info!(
                block_kib,
                queue_depth,
                write = d.write_mb_s,
                read = d.read_mb_s,
                "disk sweep point"
            );
            points.push(SweepPoint {
                block_kib,
                queue_depth,
                write_mb_s: d.write_mb_s,
                read_mb_s: d.read_mb_s,
            });
        }
    }
    let best = |key: fn(&SweepPoint) -> f64| {
        points
            .iter()
            .copied()
            .max_by(|a, b| key(a).total_cmp(&key(b)))
            .ok_or_else(|| anyhow::anyhow!("the disk sweep has no points"))
    };
    Ok(DiskSweep {
        best_write: best(|p| p.write_mb_s)?,
        best_read: best(|p| p.read_mb_s)?,
        points,
    })
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let scratch = scratch_dir(args.dir.as_deref())?;
    if let Some(group_mib) = args.synced_every_mib {
        let (block_kib, queue_depth) = (
            args.block_kib.unwrap_or(1024),
            args.queue_depth.unwrap_or(4),
        );
        let (fresh, over) = disk_synced(
            scratch.path(),
            args.streams,
            args.size_mib,
            block_kib,
            queue_depth,
            group_mib.max(1),
        )?;
        if args.json {
            println!(
                "{}",
                serde_json::json!({
                    "fresh_write_mb_s": fresh, "overwrite_mb_s": over,
                    "block_kib": block_kib, "queue_depth": queue_depth,
                    "fdatasync_every_mib": group_mib.max(1), "streams": args.streams,
                })
            );
        } else {
            println!(
                "disk  O_DIRECT write, fdatasync every {} MiB ({} stream(s), {block_kib} KiB blocks, queue depth {queue_depth}): fresh space {fresh:>8.1} MB/s, over written blocks {over:>8.1} MB/s",
                group_mib.max(1),
                args.streams
            );
        }
        return Ok(());
    }
    let measured = match (args.block_kib, args.queue_depth) {
        (None, None) => sweep(
            scratch.path(),
            args.streams,
            args.size_mib,
            &SWEEP_BLOCK_KIB,
            &SWEEP_QUEUE_DEPTHS,
        )?,
        (block, depth) => {
            let (block_kib, queue_depth) = (block.unwrap_or(1024), depth.unwrap_or(4));
            let d = disk(
                scratch.path(),
                args.streams,
                args.size_mib,
                block_kib,
                queue_depth,
            )?;
            let point = SweepPoint {
                block_kib,
                queue_depth,
                write_mb_s: d.write_mb_s,
                read_mb_s: d.read_mb_s,
            };
            DiskSweep {
                best_write: point,
                best_read: point,
                points: vec![point],
            }
        }
    };
    let best = measured.best_write;
    let fio = crosscheck::fio(
        crosscheck::find_tool("fio").as_deref(),
        scratch.path(),
        args.streams,
        args.size_mib,
        best.block_kib,
        best.queue_depth,
    );
    let disk = measured.figures();
    let loopback = if args.loopback_mib > 0 {
        Some(loopback(args.loopback_mib)?)
    } else {
        None
    };
    // iperf3 cross-checks the loopback figure, so it is skipped with it.
    let iperf3: Option<Check<f64>> =
        loopback.map(|_| crosscheck::iperf3(crosscheck::find_tool("iperf3").as_deref()));
    let limit = crosscheck::disk_limit(disk, &fio);
    if args.json {
        println!(
            "{}",
            serde_json::json!({
                "disk_write_mb_s": limit.write_mb_s,
                "disk_read_mb_s": limit.read_mb_s,
                "in_process": disk,
                "sweep": measured,
                "loopback_mb_s": loopback,
                "streams": args.streams,
                "fio": crosscheck::fio_json(&fio),
                "iperf3": iperf3.as_ref().map_or(serde_json::Value::Null, crosscheck::iperf3_json),
            })
        );
    } else {
        if measured.points.len() > 1 {
            for p in &measured.points {
                println!(
                    "disk  {:>5} KiB blocks, queue depth {:>2}: write {:>8.1} MB/s, read {:>8.1} MB/s",
                    p.block_kib, p.queue_depth, p.write_mb_s, p.read_mb_s
                );
            }
        }
        let (w, r) = (measured.best_write, measured.best_read);
        println!(
            "disk  O_DIRECT sequential write: {:>8.1} MB/s  ({} stream(s), {} KiB blocks, queue depth {})",
            w.write_mb_s, args.streams, w.block_kib, w.queue_depth
        );
        println!(
            "disk  O_DIRECT sequential read:  {:>8.1} MB/s  ({} KiB blocks, queue depth {})",
            r.read_mb_s, r.block_kib, r.queue_depth
        );
        for line in crosscheck::fio_lines(&fio, disk.write_mb_s, disk.read_mb_s) {
            println!("  cross-check: {line}");
        }
        println!(
            "disk limit (the higher of in-process and fio): write {:.1} MB/s, read {:.1} MB/s",
            limit.write_mb_s, limit.read_mb_s
        );
        if let Some(l) = loopback {
            println!("loopback TCP single stream:      {l:>8.1} MB/s");
            if let Some(c) = &iperf3 {
                println!("  cross-check: {}", crosscheck::iperf3_line(c, l));
            }
        }
    }
    Ok(())
}

pub fn scratch_dir(dir: Option<&Path>) -> anyhow::Result<tempfile::TempDir> {
    let parent = dir.map_or_else(|| PathBuf::from("."), Path::to_path_buf);
    std::fs::create_dir_all(&parent)?;
    tempfile::Builder::new()
        .prefix("skiff-bench-")
        .tempdir_in(&parent)
        .with_context(|| format!("creating a scratch dir in {}", parent.display()))
}

/// Writes `size_mib` per stream sequentially with O_DIRECT (then one fdatasync),
/// then reads it back, each stream on its own executor.
pub fn disk(
    dir: &Path,
    streams: usize,
    size_mib: u64,
    block_kib: usize,
    queue_depth: usize,
) -> anyhow::Result<DiskFigures> {
    disk_pass(dir, streams, size_mib, block_kib, queue_depth, false)
}

/// `disk`'s write over blocks already written: each file is written once
/// (untimed) and then again (timed). A log whose segments reuse the files
/// retention removed writes this way; on a thin-provisioned virtual disk it
/// is faster than writing fresh space. Returns the write MB/s.
pub fn disk_overwrite(
    dir: &Path,
    streams: usize,
    size_mib: u64,
    block_kib: usize,
    queue_depth: usize,
) -> anyhow::Result<f64> {
    Ok(disk_pass(dir, streams, size_mib, block_kib, queue_depth, true)?.write_mb_s)
}

/// The disk written the way the engine commits: `group_mib` MiB at a time
/// (`block_kib` blocks, `queue_depth` in flight), then an fdatasync before the
/// next group, as a partition's group commit waits for its writes and syncs
/// before it acknowledges. Each stream writes its file twice: into fresh
/// (fallocated) space, then over those written blocks. Returns both write
/// MB/s: (fresh, over written blocks). What the raw burst (one fdatasync at
/// its end) never pays: each fdatasync into fresh space also commits the
/// metadata of the extents the writes converted.
pub fn disk_synced(
    dir: &Path,
    streams: usize,
    size_mib: u64,
    block_kib: usize,
    queue_depth: usize,
    group_mib: u64,
) -> anyhow::Result<(f64, f64)> {
    let block = block_kib.max(4) * 1024;
    let blocks = (size_mib * 1024 * 1024).div_ceil(block as u64);
    let group_blocks = ((group_mib << 20) / block as u64).max(1);
    let (fresh_secs, over_secs) = per_stream(
        dir,
        "synced",
        streams,
        block,
        queue_depth,
        async move |file| write_synced_twice(file, blocks, block, queue_depth, group_blocks).await,
    )?;
    let total = blocks * block as u64 * streams.max(1) as u64;
    Ok((mb_s(total, fresh_secs), mb_s(total, over_secs)))
}

/// Runs `measure` in `streams` executors at once, each on a scratch file of
/// its own (`on_scratch_file`); returns the slowest stream's two timings.
/// Registered I/O memory for every buffer in flight, as the engine's shards
/// have: without it glommio pins each buffer's pages per I/O and the figure
/// is the allocator's, not the disk's.
fn per_stream<F>(
    dir: &Path,
    name: &str,
    streams: usize,
    block: usize,
    queue_depth: usize,
    measure: F,
) -> anyhow::Result<(f64, f64)>
where
    F: AsyncFn(&DmaFile) -> anyhow::Result<(f64, f64)> + Clone + Send + 'static,
{
    let mut handles = Vec::new();
    for s in 0..streams.max(1) {
        let path = dir.join(format!("baseline-{name}-{s}.dat"));
        let measure = measure.clone();
        handles.push(
            LocalExecutorBuilder::new(Placement::Unbound)
                .io_memory(io_memory_bytes(block, queue_depth))
                .spawn(move || async move { on_scratch_file(&path, measure).await })
                .map_err(std::io::Error::from)
                .context("spawning executor")?,
        );
    }
    let (mut a, mut b): (f64, f64) = (0.0, 0.0);
    for h in handles {
        let (x, y) = h
            .join()
            .map_err(|e| anyhow::anyhow!("executor failed: {e}"))??;
        a = a.max(x);
        b = b.max(y);
    }
    Ok((a, b))
}

/// Seconds for `disk_synced`'s two passes over one file.
async fn write_synced_twice(
    file: &DmaFile,
    blocks: u64,
    block: usize,
    queue_depth: usize,
    group_blocks: u64,
) -> anyhow::Result<(f64, f64)> {
    let bufs = prepare(file, blocks, block, queue_depth).await;
    let t = Instant::now();
    write_pass(file, &bufs, blocks, block, group_blocks).await?;
    let fresh = t.elapsed().as_secs_f64();
    let t = Instant::now();
    write_pass(file, &bufs, blocks, block, group_blocks).await?;
    Ok((fresh, t.elapsed().as_secs_f64()))
}

/// Empties `file` and fallocates room for `blocks`; returns one buffer of
/// random bytes per write in flight, reused: the figure is the disk's, not
/// the allocator's or memset's. Random, as fio writes: a virtual disk whose
/// host compresses or deduplicates would take constant bytes faster than any
/// real data.
async fn prepare(
    file: &DmaFile,
    blocks: u64,
    block: usize,
    queue_depth: usize,
) -> Vec<Rc<DmaBuffer>> {
    file.truncate(0).await.ok();
    file.pre_allocate(blocks * block as u64, false).await.ok();
    let mut rng = fastrand::Rng::with_seed(0x5eed ^ blocks);
    (0..queue_depth.max(1))
        .map(|_| {
            let mut buf = file.alloc_dma_buffer(block);
            rng.fill(buf.as_bytes_mut());
            Rc::new(buf)
        })
        .collect()
}

/// Writes blocks `0..blocks` in order, one per buffer in flight, with an
/// fdatasync after every `group_blocks` (the last group's included).
async fn write_pass(
    file: &DmaFile,
    bufs: &[Rc<DmaBuffer>],
    blocks: u64,
    block: usize,
    group_blocks: u64,
) -> std::io::Result<()> {
    use futures_util::stream::{self, StreamExt, TryStreamExt};
    let slots = bufs.len();
    let mut first = 0;
    while first < blocks {
        let end = first.saturating_add(group_blocks.max(1)).min(blocks);
        stream::iter(first..end)
            .map(|i| file.write_rc_at(bufs[(i % slots as u64) as usize].clone(), i * block as u64))
            .buffer_unordered(slots)
            .try_for_each(|_| async { Ok(()) })
            .await
            .map_err(std::io::Error::from)?;
        file.fdatasync().await.map_err(std::io::Error::from)?;
        first = end;
    }
    Ok(())
}

/// Opens a scratch file at `path`, measures with it, then closes and removes
/// it. Closed before the executor ends: a dropped DmaFile's close waits for
/// the executor's next I/O cycle, which never comes, and the leaked
/// descriptor holds the removed file's blocks until the process exits (a
/// full suite's sweep and rounds filled a 41 GB disk that way).
async fn on_scratch_file<T>(
    path: &Path,
    measure: impl AsyncFnOnce(&DmaFile) -> anyhow::Result<T>,
) -> anyhow::Result<T> {
    let file = open(path).await?;
    let measured = measure(&file).await;
    let closed = file.close().await.map_err(std::io::Error::from);
    let _ = std::fs::remove_file(path);
    let measured = measured?;
    closed?;
    Ok(measured)
}

fn disk_pass(
    dir: &Path,
    streams: usize,
    size_mib: u64,
    block_kib: usize,
    queue_depth: usize,
    overwrite: bool,
) -> anyhow::Result<DiskFigures> {
    let block = block_kib * 1024;
    let blocks = (size_mib * 1024 * 1024).div_ceil(block as u64);
    let (write_secs, read_secs) = per_stream(
        dir,
        "burst",
        streams,
        block,
        queue_depth,
        async move |file| write_then_read(file, blocks, block, queue_depth, overwrite).await,
    )?;
    let total = blocks * block as u64 * streams.max(1) as u64;
    Ok(DiskFigures {
        write_mb_s: mb_s(total, write_secs),
        read_mb_s: mb_s(total, read_secs),
    })
}

/// Registered I/O memory for `queue_depth` buffers of `block` bytes (and the
/// reads' as many again), never less than the engine's default 64 MiB.
fn io_memory_bytes(block: usize, queue_depth: usize) -> usize {
    (2 * block * queue_depth.max(1) + (1 << 20)).max(64 << 20)
}

async fn open(path: &Path) -> anyhow::Result<DmaFile> {
    // A file with data first, so glommio's polled-I/O probe reads for real (see
    // skiff_engine::fsutil).
    std::fs::write(path, vec![0u8; 8192])?;
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .dma_open(path)
        .await
        .map_err(std::io::Error::from)
        .with_context(|| format!("opening {}", path.display()))
}

/// Seconds to write `blocks` blocks (then one fdatasync) and to read them back,
/// `queue_depth` I/Os in flight each way; with `overwrite`, the timed write
/// goes over blocks a first (untimed) pass wrote.
async fn write_then_read(
    file: &DmaFile,
    blocks: u64,
    block: usize,
    queue_depth: usize,
    overwrite: bool,
) -> anyhow::Result<(f64, f64)> {
    use futures_util::stream::{self, StreamExt, TryStreamExt};
    let bufs = prepare(file, blocks, block, queue_depth).await;
    let slots = bufs.len();
    if overwrite {
        write_pass(file, &bufs, blocks, block, blocks).await?;
    }
    let t = Instant::now();
    write_pass(file, &bufs, blocks, block, blocks).await?;
    let write_secs = t.elapsed().as_secs_f64();

    let t = Instant::now();
    stream::iter(0..blocks)
        .map(|i| file.read_at_aligned(i * block as u64, block))
        .buffer_unordered(slots)
        .try_for_each(|_| async { Ok(()) })
        .await
        .map_err(std::io::Error::from)?;
    let read_secs = t.elapsed().as_secs_f64();
    Ok((write_secs, read_secs))
}

pub fn loopback(size_mib: u64) -> anyhow::Result<f64> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let total = size_mib * 1024 * 1024;
    let receiver = std::thread::spawn(move || -> anyhow::Result<u64> {
        let (mut s, _) = listener.accept()?;
        let mut buf = vec![0u8; 1 << 20];
        let mut got = 0u64;
        loop {
            let n = s.read(&mut buf)?;
            if n == 0 {
                return Ok(got);
            }
            got += n as u64;
        }
    });
    let mut s = TcpStream::connect(addr)?;
    let buf = vec![7u8; 1 << 20];
    let t = Instant::now();
    let mut sent = 0u64;
    while sent < total {
        s.write_all(&buf)?;
        sent += buf.len() as u64;
    }
    drop(s);
    let got = receiver
        .join()
        .map_err(|_| anyhow::anyhow!("receiver panicked"))??;
    anyhow::ensure!(
        got == sent,
        "loopback lost bytes: sent {sent}, received {got}"
    );
    Ok(mb_s(sent, t.elapsed().as_secs_f64()))
}
