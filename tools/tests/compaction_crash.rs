#![allow(clippy::unwrap_used, clippy::expect_used)]
//! SIGKILL during log compaction, with real processes: each cycle a child reopens
//! (recovers) a compacted partition, appends keyed batches (every acknowledged
//! batch is durable and printed), then cleans it over and over with a slow I/O
//! throttle and a small offset map (several passes, so kills land in the map
//! phase, mid-rewrite, around the `.cleaned` → `.swap` → `.log` steps). The parent
//! SIGKILLs it at a random moment, then reopens the partition itself and checks:
//! - offsets strictly increase and no offset appears twice;
//! - every record read is exactly what was acknowledged at that offset;
//! - the latest acknowledged record of every key is there (tombstones included:
//!   `delete.retention.ms` is long);
//! - `skiff-tools verify` finds nothing wrong after the reopen.
//!
//! `SKIFF_COMPACT_CRASH_CYCLES` (default 20) cycles, `SKIFF_CRASH_SEED` to replay.
//! `harness = false`: the binary is the parent, or the child with `--child DIR CYCLE`.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use glommio::{LocalExecutorBuilder, Placement};
use skiff_engine::batch::{decode_records, BatchBuilder, BatchHeader, Compression};
use skiff_engine::batch_cache::BatchCache;
use skiff_engine::cleaner::offset_map::BYTES_PER_ENTRY;
use skiff_engine::{AppendMode, Cleaner, CleanerConfig, LogConfig, Partition, PartitionLog};

const BATCHES_PER_CYCLE: u64 = 120;
const RECORDS_PER_BATCH: u64 = 10;
const KEYS: u64 = 97;

fn config() -> LogConfig {
    LogConfig {
        segment_bytes: 16 * 1024,
        index_interval_bytes: 1024,
        preallocate_step_bytes: 256 * 1024,
        append_chunk_bytes: 16 * 1024,
        compact: true,
        min_cleanable_dirty_ratio: 0.0,
        ..LogConfig::default()
    }
}

/// Record `i` of batch `n` of cycle `c`: its key and value (None: a tombstone).
fn record(c: u64, n: u64, i: u64) -> (Vec<u8>, Option<Vec<u8>>) {
    let seq = c * 1_000_003 + n * 31 + i;
    let key = format!("key-{}", (seq * 7919) % KEYS).into_bytes();
    if seq % 13 == 0 {
        return (key, None);
    }
    let mut value = format!("c{c}-n{n}-i{i}-").into_bytes();
    value.resize(60 + (seq % 80) as usize, b'.');
    (key, Some(value))
}

fn batch(c: u64, n: u64) -> Bytes {
    let codec = Compression::ALL[(n % Compression::ALL.len() as u64) as usize];
    let mut b = BatchBuilder::new().compression(codec).producer(
        c as i64,
        0,
        (n * RECORDS_PER_BATCH) as i32,
    );
    for i in 0..RECORDS_PER_BATCH {
        let (key, value) = record(c, n, i);
        b.push(1_000 + n as i64, Some(&key), value.as_deref(), &[]);
    }
    b.build().unwrap()
}

fn run<F, Fut, T>(f: F) -> T
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = T> + 'static,
    T: Send + 'static,
{
    LocalExecutorBuilder::new(Placement::Unbound)
        .spawn(f)
        .expect("spawn executor")
        .join()
        .expect("executor")
}

async fn open(dir: &Path) -> Partition {
    let log = PartitionLog::open(dir, "compacted", 0, config(), BatchCache::new(0))
        .await
        .expect("open");
    Partition::new(log)
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

fn child(dir: PathBuf, cycle: u64) {
    run(move || async move {
        let partition = open(&dir).await;
        for n in 0..BATCHES_PER_CYCLE {
            let info = partition
                .append(
                    BytesMut::from(&batch(cycle, n)[..]),
                    AppendMode::Leader { leader_epoch: 0 },
                )
                .await
                .expect("child: append");
            println!("ACK {cycle} {n} {} {}", info.base_offset, info.last_offset);
        }
        println!("READY");
        let mut cleaner = Cleaner::new(CleanerConfig {
            dedupe_buffer_bytes: 500 * BYTES_PER_ENTRY,
            io_max_bytes_per_second: Some(2 << 20),
            read_chunk_bytes: 8 * 1024,
            ..CleanerConfig::default()
        });
        loop {
            match cleaner
                .clean(&partition, now_ms())
                .await
                .expect("child: clean")
            {
                Some(stats) => println!("CLEANED {}", stats.cleaned_to),
                None => glommio::timer::sleep(Duration::from_millis(5)).await,
            }
        }
    });
}

/// Reads back the partition and checks it against what was acknowledged.
fn check(dir: &Path, acked: &BTreeMap<i64, (Vec<u8>, Option<Vec<u8>>)>, cycle: usize) -> usize {
    let dir = dir.to_path_buf();
    let (read, end) = run(move || async move {
        let partition = open(&dir).await;
        let end = partition.log_end_offset().await.unwrap();
        let mut offset = partition.log_start_offset().await.unwrap();
        let mut out: Vec<(i64, Option<Bytes>, Option<Bytes>)> = Vec::new();
        while offset < end {
            let read = partition.read(offset, 256 * 1024, i64::MAX).await.unwrap();
            assert!(!read.batches.is_empty(), "no progress at {offset}");
            for b in &read.batches {
                BatchHeader::parse(b).unwrap();
                for r in decode_records(b, 1 << 24).unwrap() {
                    if r.offset >= offset {
                        out.push((r.offset, r.key, r.value));
                    }
                }
            }
            offset = read.next_offset;
        }
        partition.close().await.unwrap();
        (out, end)
    });
    let last_acked = acked.keys().next_back().copied().unwrap_or(-1);
    assert!(
        end > last_acked,
        "cycle {cycle}: log ends at {end}, acknowledged up to {last_acked}"
    );
    let mut previous = -1;
    for (offset, key, value) in &read {
        assert!(
            *offset > previous,
            "cycle {cycle}: offset {offset} after {previous}"
        );
        previous = *offset;
        let (k, v) = acked
            .get(offset)
            .unwrap_or_else(|| panic!("cycle {cycle}: offset {offset} was never acknowledged"));
        assert_eq!(
            key.as_deref(),
            Some(&k[..]),
            "cycle {cycle}: key at {offset}"
        );
        assert_eq!(
            value.as_deref(),
            v.as_deref(),
            "cycle {cycle}: value at {offset}"
        );
    }
    let mut latest: HashMap<&[u8], i64> = HashMap::new();
    for (offset, (k, _)) in acked {
        latest.insert(k, *offset);
    }
    let present: std::collections::HashSet<i64> = read.iter().map(|r| r.0).collect();
    for (k, offset) in latest {
        assert!(
            present.contains(&offset),
            "cycle {cycle}: the latest record of {} (offset {offset}) is gone",
            String::from_utf8_lossy(k)
        );
    }
    read.len()
}

fn verify(dir: &Path, cycle: usize) {
    let out = Command::new(env!("CARGO_BIN_EXE_skiff-tools"))
        .arg("verify")
        .arg(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cycle {cycle}: skiff-tools verify failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--child") {
        child(PathBuf::from(&args[i + 1]), args[i + 2].parse().unwrap());
        return;
    }
    let cycles: usize = std::env::var("SKIFF_COMPACT_CRASH_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let seed = std::env::var("SKIFF_CRASH_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    println!("compaction crash test: {cycles} cycles, SKIFF_CRASH_SEED={seed}");
    let mut rng = fastrand::Rng::with_seed(seed);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("compacted-0");
    let mut acked: BTreeMap<i64, (Vec<u8>, Option<Vec<u8>>)> = BTreeMap::new();
    let started = Instant::now();
    let mut cleanings = 0;
    let mut kept = 0;
    let (mut mid_rewrite, mut mid_swap) = (0, 0);
    for cycle in 0..cycles {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--child", dir.to_str().unwrap(), &cycle.to_string()])
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
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut lines = Vec::new();
        loop {
            let line = rx
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                .expect("child did not get through its appends");
            let ready = line == "READY";
            lines.push(line);
            if ready {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(rng.u64(0..500)));
        child.kill().unwrap();
        child.wait().unwrap();
        reader.join().unwrap();
        lines.extend(rx.try_iter());
        // What the kill interrupted, as the files show it.
        for entry in std::fs::read_dir(&dir).unwrap() {
            let name = entry.unwrap().file_name().into_string().unwrap();
            if name.ends_with(".cleaned") {
                mid_rewrite += 1;
            } else if name.ends_with(".swap") {
                mid_swap += 1;
            }
        }
        for line in &lines {
            let f: Vec<&str> = line.split_whitespace().collect();
            match f.first() {
                Some(&"ACK") => {
                    let (c, n, base): (u64, u64, i64) = (
                        f[1].parse().unwrap(),
                        f[2].parse().unwrap(),
                        f[3].parse().unwrap(),
                    );
                    for i in 0..RECORDS_PER_BATCH {
                        let prev = acked.insert(base + i as i64, record(c, n, i));
                        assert!(
                            prev.is_none(),
                            "offset {} acknowledged twice",
                            base + i as i64
                        );
                    }
                }
                Some(&"CLEANED") => cleanings += 1,
                _ => {}
            }
        }
        kept = check(&dir, &acked, cycle);
        verify(&dir, cycle);
    }
    println!(
        "compaction crash test: {cycles} cycles, {} acknowledged records, {kept} kept after compaction, {cleanings} cleanings seen, killed mid-rewrite {mid_rewrite}x, mid-swap {mid_swap}x, {:.1}s",
        acked.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(
        cleanings > 0,
        "no cleaning finished in any cycle: the kills prove nothing"
    );
    assert!(kept < acked.len(), "compaction removed nothing");
    println!("1 passed, 0 failed");
}
