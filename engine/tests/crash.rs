#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Crash test with real processes: a child process appends to a partition with
//! `Durability::FlushBeforeAck` from several concurrent tasks and prints each
//! acknowledged batch; the parent SIGKILLs it at a random moment, reopens the log
//! and checks that every acknowledged batch is there, byte-exact, at the offset it
//! was acknowledged at, and that the indexes on disk agree with the log. Repeated
//! for `SKIFF_CRASH_CYCLES` cycles (default 20) on the same directory, so each
//! child also recovers what the previous one left.
//!
//! A second scenario fills the disk: the child runs under a file-size limit
//! (`prlimit --fsize`, SIGXFSZ ignored), so a segment write fails with EFBIG the
//! way it would with ENOSPC. The append must fail with a typed error, every later
//! append must fail too (the partition is offline, not half-written), and a
//! reopen without the limit must find every acknowledged batch. A third makes
//! the failing write a segment roll's (batches appended but not yet written
//! out when the roll writes them): the roll fails, none of those batches is
//! acknowledged, the partition stays offline instead of rolling on, and a
//! reopen finds every acknowledged batch.
//!
//! A third scenario starts the log over again and again: the child appends a
//! few batches, then `truncate_fully_and_start_at` a little past the end, in a
//! loop, and is SIGKILLed at a random moment. After each kill the log must be
//! either the old one (every acknowledged batch since the last completed
//! start-over, byte-exact) or, when the kill came during a start-over, the
//! empty log at its offset; never a mix, and the epoch cache and indexes must
//! agree with what came back.
//!
//! A fourth recycles segments: the first scenario's writers with retention
//! removing all but the newest 512 KiB every few milliseconds, so new
//! segments are written over files retention removed. After each kill every
//! acknowledged batch at or past the log start must be there, byte-exact, and
//! the log must hold each batch once at consecutive offsets: a reused file's
//! old batches never come back as data.
//!
//! `harness = false`: the same binary is the parent (no arguments) and the child
//! (`--child DIR START`, `--child-fill DIR`, `--child-roll DIR`,
//! `--child-restart DIR START` or `--child-recycle DIR START`).

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::rc::Rc;
use std::time::{Duration, Instant};

use common::{batch, mutable, run, segment_bases};
use skiff_engine::batch::BatchHeader;
use skiff_engine::batch_cache::BatchCache;
use skiff_engine::segment::index::{decode_offset_entries, decode_time_entries};
use skiff_engine::{AppendMode, LogConfig, Partition, PartitionLog};

const WRITERS: u64 = 4;

fn config() -> LogConfig {
    LogConfig {
        segment_bytes: 256 * 1024,
        index_interval_bytes: 2048,
        preallocate_step_bytes: 1 << 20,
        append_chunk_bytes: 64 * 1024,
        ..LogConfig::default()
    }
}

/// The batch writer `writer` sends as its `n`th: content is a function of both.
fn writer_batch(writer: u64, n: u64) -> bytes::Bytes {
    let seed = writer << 32 | n;
    batch(
        seed,
        1 + (seed % 7) as usize,
        64 + (seed as usize * 131) % 4000,
        seed as i64,
    )
}

/// Appends until the disk "fills", then checks the partition stays failed.
fn child_fill(dir: PathBuf) {
    run(move || async move {
        let config = LogConfig {
            segment_bytes: 64 << 20,
            ..config()
        };
        let log = PartitionLog::open(&dir, "crash", 0, config, BatchCache::new(8 << 20))
            .await
            .expect("child: open");
        let partition = Partition::new(log);
        for n in 0.. {
            match partition
                .append(
                    mutable(&writer_batch(9, n)),
                    AppendMode::Leader { leader_epoch: 0 },
                )
                .await
            {
                Ok(info) => println!("ACK 9 {n} {} {}", info.base_offset, info.last_offset),
                Err(e) => {
                    println!("ERR {e}");
                    let again = partition
                        .append(
                            mutable(&writer_batch(9, n + 1)),
                            AppendMode::Leader { leader_epoch: 0 },
                        )
                        .await;
                    match again {
                        Err(e) => println!("ERR2 {e}"),
                        Ok(_) => println!("ERR2 none: an append after a failed write succeeded"),
                    }
                    std::process::exit(3);
                }
            }
        }
    });
}

/// The file-size limit of `full_disk_at_roll`: a multiple of the append chunk,
/// so the chunk that holds the roll starts exactly at the limit.
const ROLL_LIMIT: u64 = 3 << 20;
/// Batches appended and acknowledged one by one before the buffered ones.
const ROLL_DURABLE_FIRST: u64 = 40;

/// Acknowledged appends first, then appends left in the segment buffer (no
/// flush) until the roll that must write them out crosses the limit; then
/// waits for the buffered ones to be durable, and appends once more.
fn child_roll(dir: PathBuf) {
    run(move || async move {
        let config = LogConfig {
            segment_bytes: ROLL_LIMIT + (512 << 10),
            append_chunk_bytes: 1 << 20,
            ..config()
        };
        let log = PartitionLog::open(&dir, "crash", 0, config, BatchCache::new(8 << 20))
            .await
            .expect("child: open");
        let partition = Partition::new(log);
        let leader = AppendMode::Leader { leader_epoch: 0 };
        let mut buffered = Vec::new();
        for n in 0.. {
            let batch = mutable(&writer_batch(9, n));
            if n < ROLL_DURABLE_FIRST {
                let info = partition
                    .append(batch, leader)
                    .await
                    .expect("child: durable append");
                println!("ACK 9 {n} {} {}", info.base_offset, info.last_offset);
                continue;
            }
            match partition.append_buffered(batch, leader).await {
                Ok(info) => buffered.push((n, info)),
                Err(e) => {
                    println!("ERR {e}");
                    break;
                }
            }
        }
        println!("BUFFERED {}", buffered.len());
        for (n, info) in buffered {
            match partition.await_durable(&info).await {
                Ok(()) => println!("ACK 9 {n} {} {}", info.base_offset, info.last_offset),
                Err(e) => println!("NACK {n} {e}"),
            }
        }
        match partition
            .append(mutable(&writer_batch(9, 1 << 20)), leader)
            .await
        {
            Err(e) => println!("ERR2 {e}"),
            Ok(_) => println!("ERR2 none: an append after a failed roll succeeded"),
        }
        std::process::exit(3);
    });
}

/// Opens (recovering) the child's partition and says READY.
async fn open_ready(dir: &Path, config: LogConfig) -> Rc<Partition> {
    let log = PartitionLog::open(dir, "crash", 0, config, BatchCache::new(8 << 20))
        .await
        .expect("child: open");
    println!("READY");
    Rc::new(Partition::new(log))
}

fn child(dir: PathBuf, start: u64) {
    run(move || async move {
        let partition = open_ready(&dir, config()).await;
        write_forever(&partition, start).await;
    });
}

/// Appends 1..=4 batches (acknowledged when durable), then starts the log over
/// 0..50 offsets past its end, forever; epochs grow with each round.
fn child_restart(dir: PathBuf, start: u64) {
    run(move || async move {
        let log = PartitionLog::open(&dir, "crash", 0, config(), BatchCache::new(8 << 20))
            .await
            .expect("child: open");
        let partition = Partition::new(log);
        println!("READY");
        let mut rng = fastrand::Rng::with_seed(start);
        for round in 0.. {
            let epoch = (start as i32).wrapping_mul(1000).wrapping_add(round) & 0x3fff_ffff;
            for i in 0..rng.u64(1..=4) {
                let n = start * 1000 + round as u64 * 10 + i;
                let info = partition
                    .append(
                        mutable(&writer_batch(8, n)),
                        AppendMode::Leader {
                            leader_epoch: epoch,
                        },
                    )
                    .await
                    .expect("child: append");
                println!("ACK 8 {n} {} {}", info.base_offset, info.last_offset);
            }
            let to = partition.log_end() + rng.i64(0..50);
            println!("TRUNC {to}");
            partition
                .truncate_fully_and_start_at(to)
                .await
                .expect("child: truncate fully");
            println!("DONE {to}");
        }
    });
}

/// `WRITERS` tasks appending batches from `n = start` on, each printed as
/// `ACK writer n base last` once acknowledged; never ends.
async fn write_forever(partition: &Rc<Partition>, start: u64) {
    let tasks: Vec<_> = (0..WRITERS)
        .map(|w| {
            let p = partition.clone();
            glommio::spawn_local(async move {
                for n in start.. {
                    let info = p
                        .append(
                            mutable(&writer_batch(w, n)),
                            AppendMode::Leader { leader_epoch: 0 },
                        )
                        .await
                        .expect("child: append");
                    println!("ACK {w} {n} {} {}", info.base_offset, info.last_offset);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await;
    }
}

/// `child` with retention removing all but the newest 512 KiB every few
/// milliseconds, so rolls reuse the files it removes (segment recycling).
/// Prints `RECYCLED n` (rolls that reused a file so far) as it changes.
fn child_recycle(dir: PathBuf, start: u64) {
    run(move || async move {
        let partition = open_ready(&dir, recycle_config()).await;
        let retention = {
            let p = partition.clone();
            glommio::spawn_local(async move {
                let mut reported = 0;
                loop {
                    glommio::timer::sleep(Duration::from_millis(3)).await;
                    p.apply_retention(0).await.expect("child: retention");
                    let recycled = skiff_engine::stats::local().segments_recycled.get();
                    if recycled != reported {
                        reported = recycled;
                        println!("RECYCLED {recycled}");
                    }
                }
            })
        };
        write_forever(&partition, start).await;
        retention.await;
    });
}

fn recycle_config() -> LogConfig {
    LogConfig {
        retention_ms: None,
        retention_bytes: Some(512 * 1024),
        ..config()
    }
}

/// Kill loops over a log whose segments are recycled: every acknowledged
/// batch at or past the log start comes back byte-exact, and the log holds
/// each batch once, at consecutive offsets (a reused file's leftovers never
/// come back as data).
fn recycle_crashes(cycles: usize, rng: &mut fastrand::Rng) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("recycle-0");
    let mut acked: BTreeMap<i64, Acked> = BTreeMap::new();
    let mut next_n = 0u64;
    let mut recycled = 0u64;
    for cycle in 0..cycles {
        let lines = run_and_kill(
            &[
                "--child-recycle",
                dir.to_str().unwrap(),
                &next_n.to_string(),
            ],
            Duration::from_millis(rng.u64(20..300)),
        );
        let mut cycle_acks = 0;
        let mut cycle_recycled = 0;
        for line in lines {
            let f: Vec<&str> = line.split_whitespace().collect();
            match f.as_slice() {
                ["ACK", w, n, base, last] => {
                    let n: u64 = n.parse().unwrap();
                    acked.insert(
                        base.parse().unwrap(),
                        Acked {
                            writer: w.parse().unwrap(),
                            n,
                            last_offset: last.parse().unwrap(),
                        },
                    );
                    next_n = next_n.max(n + 1);
                    cycle_acks += 1;
                }
                ["RECYCLED", count] => cycle_recycled = count.parse::<u64>().unwrap(),
                _ => {}
            }
        }
        recycled += cycle_recycled;
        next_n += 1;
        let (start, end) = reopen_offsets_with(&dir, recycle_config());
        acked.retain(|base, _| *base >= start);
        check_with(&dir, &acked, cycle, cycle_acks, true, recycle_config());
        check_contiguous_and_unique(&dir, start, end, cycle);
    }
    println!("recycling crashes: {cycles} cycles, {recycled} rolls reused a file");
    assert!(recycled > 0, "no roll reused a file: nothing was tested");
}

/// The log from `start` to `end` is batches at consecutive offsets, no two
/// alike.
fn check_contiguous_and_unique(dir: &Path, start: i64, end: i64, cycle: usize) {
    use std::hash::{Hash, Hasher};
    let dir = dir.to_path_buf();
    run(move || async move {
        let mut log = PartitionLog::open(&dir, "crash", 0, recycle_config(), BatchCache::new(0))
            .await
            .unwrap();
        let mut seen = std::collections::HashSet::new();
        let mut offset = start;
        while offset < end {
            let r = log.read(offset, 1 << 20, i64::MAX).await.unwrap();
            assert!(!r.batches.is_empty(), "cycle {cycle}: no batch at {offset}");
            for b in &r.batches {
                let h = BatchHeader::parse(b).unwrap();
                assert_eq!(
                    h.base_offset, offset,
                    "cycle {cycle}: offsets not consecutive"
                );
                let mut hasher = std::collections::hash_map::DefaultHasher::new();
                b[16..].hash(&mut hasher);
                assert!(
                    seen.insert(hasher.finish()),
                    "cycle {cycle}: the batch at {offset} is in the log twice"
                );
                offset = h.next_offset();
            }
        }
        assert_eq!(offset, end);
        log.close().await.unwrap();
    });
}

/// Runs this binary with `args` (a child that prints READY once it serves),
/// lets it run `run_for`, SIGKILLs it (no destructor, no flush, no close) and
/// returns every line it printed.
fn run_and_kill(args: &[&str], run_for: Duration) -> Vec<String> {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    // Wait until the child has recovered and serves, then let it run a while.
    let ready = rx.recv_timeout(Duration::from_secs(60)).unwrap();
    assert_eq!(ready, "READY", "child did not start");
    std::thread::sleep(run_for);
    child.kill().unwrap();
    child.wait().unwrap();
    reader.join().unwrap();
    rx.try_iter().collect()
}

/// See the module docs: a start-over is all or nothing across a SIGKILL.
fn restart_crashes(cycles: usize, rng: &mut fastrand::Rng) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("restart-0");
    // What the log must hold: its start, and the batches acknowledged since.
    let mut start = 0i64;
    let mut acked: BTreeMap<i64, Acked> = BTreeMap::new();
    let (mut mid_old, mut mid_new) = (0, 0);
    for cycle in 0..cycles {
        let lines = run_and_kill(
            &[
                "--child-restart",
                dir.to_str().unwrap(),
                &(cycle + 1).to_string(),
            ],
            Duration::from_millis(rng.u64(5..150)),
        );
        let mut pending: Option<i64> = None;
        for line in lines {
            let f: Vec<&str> = line.split_whitespace().collect();
            match f.as_slice() {
                ["ACK", w, n, base, last] => {
                    acked.insert(
                        base.parse().unwrap(),
                        Acked {
                            writer: w.parse().unwrap(),
                            n: n.parse().unwrap(),
                            last_offset: last.parse().unwrap(),
                        },
                    );
                }
                ["TRUNC", to] => pending = Some(to.parse().unwrap()),
                ["DONE", to] => {
                    start = to.parse().unwrap();
                    acked.clear();
                    pending = None;
                }
                _ => {}
            }
        }
        let (got_start, got_end) = reopen_offsets(&dir);
        if let Some(to) = pending {
            if got_start == to && to != start {
                assert_eq!(
                    got_end, to,
                    "cycle {cycle}: a started-over log holds nothing"
                );
                start = to;
                acked.clear();
                mid_new += 1;
            } else {
                mid_old += 1;
            }
        }
        assert_eq!(
            got_start, start,
            "cycle {cycle}: log start {got_start}, want {start} (kill during a start-over to {pending:?})"
        );
        let bases: Vec<i64> = segment_bases(&dir);
        assert_eq!(
            bases.first(),
            Some(&start),
            "cycle {cycle}: segments {bases:?}"
        );
        check(&dir, &acked, cycle, acked.len(), false);
        check_epochs(&dir, cycle);
    }
    println!(
        "start-over crashes: {cycles} cycles, {mid_old} kills during a start-over came back as the old log, {mid_new} as the new one"
    );
}

fn reopen_offsets(dir: &Path) -> (i64, i64) {
    reopen_offsets_with(dir, config())
}

fn reopen_offsets_with(dir: &Path, config: LogConfig) -> (i64, i64) {
    let dir = dir.to_path_buf();
    run(move || async move {
        let log = PartitionLog::open(&dir, "crash", 0, config, BatchCache::new(0))
            .await
            .unwrap();
        let offsets = (log.log_start_offset(), log.log_end_offset());
        log.close().await.unwrap();
        offsets
    })
}

/// Every epoch in the cache starts inside the log (an empty log has none).
fn check_epochs(dir: &Path, cycle: usize) {
    let dir = dir.to_path_buf();
    run(move || async move {
        let log = PartitionLog::open(&dir, "crash", 0, config(), BatchCache::new(0))
            .await
            .unwrap();
        let (start, end) = (log.log_start_offset(), log.log_end_offset());
        let entries = log.leader_epochs().entries().to_vec();
        assert!(
            entries
                .iter()
                .all(|e| e.start_offset >= start && e.start_offset < end),
            "cycle {cycle}: epochs {entries:?} outside the log [{start}, {end})"
        );
        log.close().await.unwrap();
    });
}

struct Acked {
    writer: u64,
    n: u64,
    last_offset: i64,
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--child-fill") {
        child_fill(PathBuf::from(&args[i + 1]));
        return;
    }
    if let Some(i) = args.iter().position(|a| a == "--child-roll") {
        child_roll(PathBuf::from(&args[i + 1]));
        return;
    }
    if let Some(i) = args.iter().position(|a| a == "--child-restart") {
        child_restart(PathBuf::from(&args[i + 1]), args[i + 2].parse().unwrap());
        return;
    }
    if let Some(i) = args.iter().position(|a| a == "--child-recycle") {
        child_recycle(PathBuf::from(&args[i + 1]), args[i + 2].parse().unwrap());
        return;
    }
    if let Some(i) = args.iter().position(|a| a == "--child") {
        let dir = PathBuf::from(&args[i + 1]);
        let start: u64 = args[i + 2].parse().unwrap();
        child(dir, start);
        return;
    }
    // Ignore the harness flags cargo passes (e.g. --nocapture).
    let cycles: usize = std::env::var("SKIFF_CRASH_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let seed = std::env::var("SKIFF_CRASH_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    println!("crash test: {cycles} cycles, SKIFF_CRASH_SEED={seed}");
    let mut rng = fastrand::Rng::with_seed(seed);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("crash-0");
    let mut acked: BTreeMap<i64, Acked> = BTreeMap::new();
    let mut next_n = 0u64;
    let started = Instant::now();
    for cycle in 0..cycles {
        let kill_after = Duration::from_millis(rng.u64(5..150));
        let lines = run_and_kill(
            &["--child", dir.to_str().unwrap(), &next_n.to_string()],
            kill_after,
        );
        let mut cycle_acks = 0;
        for line in lines {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.first() != Some(&"ACK") || f.len() != 5 {
                continue;
            }
            let (writer, n, base, last) = (
                f[1].parse().unwrap(),
                f[2].parse().unwrap(),
                f[3].parse().unwrap(),
                f[4].parse().unwrap(),
            );
            let prev = acked.insert(
                base,
                Acked {
                    writer,
                    n,
                    last_offset: last,
                },
            );
            assert!(prev.is_none(), "offset {base} acknowledged twice");
            next_n = next_n.max(n + 1);
            cycle_acks += 1;
        }
        // Writers resume at fresh sequence numbers so every batch is unique.
        next_n += 1;
        check(&dir, &acked, cycle, cycle_acks, true);
    }
    println!(
        "crash test: {cycles} cycles, {} acknowledged batches verified in {:.1}s",
        acked.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(
        acked.len() > cycles,
        "the children acknowledged too few batches to prove anything"
    );
    full_disk();
    full_disk_at_roll();
    restart_crashes(cycles, &mut rng);
    recycle_crashes(cycles, &mut rng);
    println!("5 passed, 0 failed");
}

/// Runs this binary as `child_flag DIR` under a file-size limit of `limit`
/// bytes (SIGXFSZ ignored, so a write past it fails with EFBIG as on a full
/// disk); the child must exit 3, after the error it reported. Its stdout.
fn run_limited_child(limit: u64, child_flag: &str, dir: &Path) -> String {
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "trap '' XFSZ; exec prlimit --fsize={limit} -- \"$0\" {child_flag} \"$1\""
        ))
        .arg(std::env::current_exe().unwrap())
        .arg(dir)
        .output()
        .expect("run sh/prlimit");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(
        out.status.code(),
        Some(3),
        "child must stop on the error it reported: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// See the module docs: a write failure mid-append loses no acknowledged batch.
fn full_disk() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("full-0");
    let stdout = run_limited_child(3 << 20, "--child-fill", &dir);
    let err = stdout
        .lines()
        .find_map(|l| l.strip_prefix("ERR "))
        .expect("an append error");
    assert!(
        err.contains("offline") && err.contains("File too large"),
        "typed, explained error: {err}"
    );
    let err2 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("ERR2 "))
        .expect("second append");
    assert!(
        err2.contains("offline"),
        "the partition stays offline: {err2}"
    );
    let mut acked = BTreeMap::new();
    for line in stdout.lines().filter(|l| l.starts_with("ACK ")) {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (n, base, last): (u64, i64, i64) = (
            f[2].parse().unwrap(),
            f[3].parse().unwrap(),
            f[4].parse().unwrap(),
        );
        acked.insert(
            base,
            Acked {
                writer: 9,
                n,
                last_offset: last,
            },
        );
    }
    assert!(
        acked.len() > 100,
        "the limit left room for many batches: {}",
        acked.len()
    );
    check(&dir, &acked, 0, acked.len(), true);
    println!(
        "full disk: {} acknowledged batches survived the failed write; error was: {err}",
        acked.len()
    );
}

/// See the module docs: a roll that cannot write what it closes takes the
/// partition offline, acknowledges none of it, and loses nothing acknowledged.
fn full_disk_at_roll() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("roll-0");
    let stdout = run_limited_child(ROLL_LIMIT, "--child-roll", &dir);
    let line = |prefix: &str| {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(prefix))
            .unwrap_or_else(|| panic!("no {prefix:?} line: {stdout}"))
            .to_string()
    };
    let err = line("ERR ");
    assert!(
        err.contains("offline") && err.contains("File too large"),
        "typed, explained error: {err}"
    );
    let buffered: usize = line("BUFFERED ").parse().unwrap();
    assert!(buffered > 0, "batches were waiting in the buffer");
    let nacked = stdout.lines().filter(|l| l.starts_with("NACK ")).count();
    assert_eq!(
        nacked, buffered,
        "no batch the failed roll did not write is acknowledged: {stdout}"
    );
    let err2 = line("ERR2 ");
    assert!(
        err2.contains("offline"),
        "the partition stays offline: {err2}"
    );
    let mut acked = BTreeMap::new();
    for line in stdout.lines().filter(|l| l.starts_with("ACK ")) {
        let f: Vec<&str> = line.split_whitespace().collect();
        acked.insert(
            f[3].parse::<i64>().unwrap(),
            Acked {
                writer: 9,
                n: f[2].parse().unwrap(),
                last_offset: f[4].parse().unwrap(),
            },
        );
    }
    assert_eq!(acked.len() as u64, ROLL_DURABLE_FIRST);
    check(&dir, &acked, 0, acked.len(), true);
    println!(
        "full disk at a roll: {} acknowledged batches survived, {buffered} buffered ones refused; error was: {err}",
        acked.len()
    );
}

/// Reopens the log (recovery) and checks every acknowledged batch and the indexes.
/// `epoch_zero`: the batches were written in leader epoch 0.
fn check(
    dir: &Path,
    acked: &BTreeMap<i64, Acked>,
    cycle: usize,
    cycle_acks: usize,
    epoch_zero: bool,
) {
    check_with(dir, acked, cycle, cycle_acks, epoch_zero, config());
}

fn check_with(
    dir: &Path,
    acked: &BTreeMap<i64, Acked>,
    cycle: usize,
    cycle_acks: usize,
    epoch_zero: bool,
    config: LogConfig,
) {
    let dir2 = dir.to_path_buf();
    let expected: Vec<(i64, i64, u64, u64)> = acked
        .iter()
        .map(|(b, a)| (*b, a.last_offset, a.writer, a.n))
        .collect();
    run(move || async move {
        let mut log = PartitionLog::open(&dir2, "crash", 0, config, BatchCache::new(0))
            .await
            .unwrap();
        let leo = log.log_end_offset();
        for (base, last, writer, n) in expected {
            assert!(
                last < leo,
                "cycle {cycle}: acknowledged offset {last} lost (log end {leo})"
            );
            let r = log.read(base, 1, i64::MAX).await.unwrap();
            let got = &r.batches[0];
            let h = BatchHeader::parse(got).unwrap();
            assert_eq!(
                (h.base_offset, h.last_offset()),
                (base, last),
                "cycle {cycle}: batch moved"
            );
            let sent = writer_batch(writer, n);
            if epoch_zero {
                assert_eq!(&got[12..16], &[0, 0, 0, 0], "leader epoch 0");
            }
            assert_eq!(
                &got[16..],
                &sent[16..],
                "cycle {cycle}: batch at {base} differs from what was acknowledged"
            );
        }
        log.close().await.unwrap();
    });
    check_indexes(dir);
    println!(
        "cycle {cycle}: {cycle_acks} new acks, {} total, recovered and verified",
        acked.len()
    );
}

/// Every index entry names the last offset of the batch at its position; time
/// index entries only grow. Every segment has its indexes but a last one of
/// at most `clean_close_scan_bytes` (closed without them, and without any an
/// earlier state left: the open scans it).
fn check_indexes(dir: &Path) {
    let last = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .max();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "log") {
            continue;
        }
        let base: i64 = path.file_stem().unwrap().to_str().unwrap().parse().unwrap();
        let log = std::fs::read(&path).unwrap();
        let small = log.len() as u64 <= LogConfig::default().clean_close_scan_bytes;
        if Some(&path) == last.as_ref() && small {
            for suffix in ["index", "timeindex"] {
                assert!(!path.with_extension(suffix).exists(), "{}", path.display());
            }
            continue;
        }
        let index = std::fs::read(path.with_extension("index")).unwrap();
        for e in decode_offset_entries(&index).unwrap() {
            let h = BatchHeader::parse(&log[e.position as usize..]).unwrap();
            assert_eq!(
                h.last_offset(),
                base + i64::from(e.relative_offset),
                "{}",
                path.display()
            );
        }
        let time = std::fs::read(path.with_extension("timeindex")).unwrap();
        let entries = decode_time_entries(&time).unwrap();
        for w in entries.windows(2) {
            assert!(
                w[0].timestamp <= w[1].timestamp && w[0].relative_offset <= w[1].relative_offset
            );
        }
    }
}
