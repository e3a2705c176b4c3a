#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The appender's group-commit half (`start_write_out`): the writes it hands
//! back are awaited while more is appended (as a flusher does outside the
//! partition's lock), and the file still ends up holding exactly what was
//! appended, in order. The next chunk rewrites the partial block a flush wrote,
//! so it must not be written while that flush's write is in flight.

mod common;

use std::rc::Rc;

use common::run;
use skiff_engine::fsutil::open_dma;
use skiff_engine::segment::appender::{Appender, Growth, PendingWrite, Sizing};

/// A small chunk (8 KiB) so a few appends fill and dispatch several chunks.
fn sizing(max_inflight_writes: usize) -> Sizing {
    Sizing {
        max_chunk_bytes: 8192,
        max_inflight_writes,
        max_reserve_bytes: 64 * 1024,
        reserve_limit: u64::MAX,
        start: Growth {
            chunk_bytes: 4096,
            reserve_bytes: 4096,
        },
    }
}

/// Random appends with `start_write_out` at random points; each flush's writes
/// are awaited later, after more appends (some fill and dispatch chunks that
/// begin with the flush's partial block). Once a flush's writes are done,
/// everything appended before it must read back from the file; at the end the
/// file's data is exactly the appended bytes.
#[test]
fn flushed_writes_awaited_later_leave_the_file_exact() {
    for seed in 0..40u64 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("00000000000000000000.log");
        run(move || async move {
            let mut rng = fastrand::Rng::with_seed(seed);
            let file = Rc::new(open_dma(&path, true).await.unwrap());
            let depth = 1 + rng.usize(..4);
            let mut appender = Appender::open(file.clone(), path.clone(), 0, sizing(depth))
                .await
                .unwrap();
            let mut expected: Vec<u8> = Vec::new();
            // Flushes whose writes are not awaited yet: (end of data, writes).
            let mut pending: Vec<(usize, Vec<PendingWrite>)> = Vec::new();
            for _ in 0..60 {
                match rng.u8(..10) {
                    0..=5 => {
                        let len = 1 + rng.usize(..6000);
                        let data: Vec<u8> = (0..len).map(|_| rng.u8(1..)).collect();
                        let at = appender.append(&data).await.unwrap();
                        assert_eq!(at, expected.len() as u64, "seed {seed}");
                        expected.extend_from_slice(&data);
                    }
                    6..=7 => {
                        let writes = appender.start_write_out().await.unwrap();
                        pending.push((expected.len(), writes));
                    }
                    _ => {
                        if pending.is_empty() {
                            continue;
                        }
                        let (end, writes) = pending.remove(rng.usize(..pending.len()));
                        for w in writes {
                            w.wait().await.unwrap();
                        }
                        let on_disk = std::fs::read(&path).unwrap();
                        assert!(
                            on_disk.len() >= end,
                            "seed {seed}: file shorter than a flush"
                        );
                        assert!(
                            on_disk[..end] == expected[..end],
                            "seed {seed}: a flushed prefix of {end} bytes differs on disk"
                        );
                    }
                }
            }
            for (_, writes) in pending {
                for w in writes {
                    w.wait().await.unwrap();
                }
            }
            appender.finish().await.unwrap();
            drop(appender);
            Rc::try_unwrap(file).ok().unwrap().close().await.unwrap();
            let on_disk = std::fs::read(&path).unwrap();
            assert_eq!(
                on_disk.len(),
                expected.len(),
                "seed {seed}: trimmed to the data"
            );
            assert!(
                on_disk == expected,
                "seed {seed}: the file differs from the appends"
            );
        });
    }
}

/// Writes align to the filesystem's block, not only the device's sector: a
/// direct write that starts or ends inside an ext4 block of a preallocated
/// extent is serialised by the filesystem (exclusive inode lock, waiting for
/// every write in flight) and punted by io_uring to a worker thread.
#[test]
fn writes_align_to_the_filesystem_block() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("00000000000000000000.log");
    run(move || async move {
        let file = Rc::new(open_dma(&path, true).await.unwrap());
        let fs_block = std::fs::metadata(&path).unwrap().blksize();
        let dma = file.alignment();
        let appender = Appender::open(file.clone(), path.clone(), 0, sizing(2))
            .await
            .unwrap();
        if fs_block.is_power_of_two() && fs_block > dma && fs_block <= 8192 {
            assert_eq!(appender.alignment(), fs_block, "the filesystem's block");
        } else {
            assert_eq!(appender.alignment(), dma.max(512), "the device's alignment");
        }
        // A chunk size that is no multiple of the block keeps the device's.
        let other = Appender::open(
            file.clone(),
            path.clone(),
            0,
            Sizing {
                max_chunk_bytes: 8192 + 512,
                ..sizing(2)
            },
        )
        .await
        .unwrap();
        if fs_block > dma && fs_block.is_power_of_two() && (8192 + 512) % fs_block != 0 {
            assert_eq!(other.alignment(), dma.max(512));
        }
    });
}
