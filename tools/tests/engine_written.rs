//! `verify` and the dumps against partitions the engine itself wrote: the tools
//! and the writer must agree on every byte of the layout.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use bytes::BytesMut;
use glommio::{LocalExecutorBuilder, Placement};
use skiff_engine::batch::BatchBuilder;
use skiff_engine::batch_cache::BatchCache;
use skiff_engine::log::AppendMode;
use skiff_engine::{LogConfig, PartitionLog};

fn skiff_tools(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_skiff-tools"))
        .args(args)
        .output()
        .expect("run skiff-tools")
}

fn describe(output: &Output) -> String {
    format!(
        "status {:?}\n--- stdout\n{}--- stderr\n{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Small segments and a dense index, so a few hundred batches make several of each.
fn config() -> LogConfig {
    LogConfig {
        segment_bytes: 16 * 1024,
        index_interval_bytes: 512,
        preallocate_step_bytes: 64 * 1024,
        append_chunk_bytes: 8 * 1024,
        ..LogConfig::default()
    }
}

/// Appends 300 batches of 3 records (leader epoch 0, then 2 from the 150th batch);
/// closes the log cleanly when `close`, else only flushes it (the active segment
/// stays preallocated with its index unwritten, as after a crash).
fn write_partition(dir: PathBuf, close: bool) {
    LocalExecutorBuilder::new(Placement::Unbound)
        .spawn(move || async move {
            let mut log = PartitionLog::open(&dir, "events", 0, config(), BatchCache::new(1 << 20))
                .await
                .unwrap();
            for i in 0..300i64 {
                let mut builder = BatchBuilder::new();
                for r in 0..3 {
                    let key = format!("key-{i}-{r}");
                    builder.push(1_000 + i, Some(key.as_bytes()), Some(&[i as u8; 40]), &[]);
                }
                let batch = BytesMut::from(&builder.build().unwrap()[..]);
                let leader_epoch = if i < 150 { 0 } else { 2 };
                log.append(batch, AppendMode::Leader { leader_epoch })
                    .await
                    .unwrap();
            }
            if close {
                log.close().await.unwrap();
            } else {
                log.flush().await.unwrap();
                log.checkpoint_recovery_point().await.unwrap();
            }
        })
        .expect("spawn executor")
        .join()
        .expect("executor");
}

fn segment_files(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .collect();
    files.sort();
    files
}

fn check_written_partition(close: bool) {
    let tmp = tempfile::tempdir().unwrap();
    let partition = tmp.path().join("events-0");
    write_partition(partition.clone(), close);
    let logs = segment_files(&partition, "log");
    assert!(logs.len() > 2, "expected several segments: {logs:?}");

    let out = skiff_tools(&["verify", partition.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.starts_with("OK: 1 partitions, "), "{text}");
    assert!(text.contains(" 300 batches, 900 records, "), "{text}");

    for (command, ext) in [
        ("dump-log", "log"),
        ("dump-index", "index"),
        ("dump-timeindex", "timeindex"),
    ] {
        for file in segment_files(&partition, ext) {
            let out = skiff_tools(&[command, file.to_str().unwrap()]);
            assert_eq!(
                out.status.code(),
                Some(0),
                "{command} {}: {}",
                file.display(),
                describe(&out)
            );
        }
    }
}

#[test]
fn cleanly_closed_partition_verifies() {
    check_written_partition(true);
}

#[test]
fn flushed_but_not_closed_partition_verifies() {
    check_written_partition(false);
}
