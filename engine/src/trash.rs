//! Deleting without stalling the disk.
//!
//! Freeing gigabytes at once stalls every write of the file system for
//! seconds: ext4 frees a file's extents when it is unlinked, and on a
//! file system mounted with `discard` (this project's machines) the next
//! journal commit first sends the device a discard for every freed block.
//! An fdatasync that needs a commit (a segment roll, an index, a checkpoint)
//! waits behind it: the full suite's produce step after the previous step's
//! 11 GB topic was deleted made nothing for 5.5 s (issue 15, item 5).
//!
//! So deletion is in two steps, as Kafka's: what is deleted is first renamed
//! out of the log's way (a partition directory to `<topic>-<p>.<id>-delete`,
//! a segment's `.log` to `.log.deleted`), which is instant and atomic; then
//! this core's trash task frees the bytes in the background, shrinking each
//! file by `step` bytes at a time (ftruncate on glommio's blocking pool)
//! and pausing between steps, `bytes_per_second` in all, before it unlinks
//! the file; while more than `backlog_limit` bytes wait it does not pause
//! (a pace below the rate retention removes data at would fill the disk). A crash in between leaves renamed leftovers, which the next
//! start hands back to the trash (`Shard` for directories, `PartitionLog::open`
//! for segments); nothing reads them.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::time::Duration;

use glommio::{Latency, Shares};

use crate::error::{LogError, Result};

/// Suffix of a partition directory being deleted (`<dir>.<id>-delete`, as
/// Kafka names them).
pub const DELETED_DIR_SUFFIX: &str = "-delete";
/// Suffix of a segment file being deleted (`<base>.log.deleted`).
pub const DELETED_FILE_SUFFIX: &str = ".deleted";

/// `ShardConfig::delete_bytes_per_second`'s default.
pub const DELETE_BYTES_PER_SECOND: u64 = 256 << 20;
/// `ShardConfig::delete_backlog_bytes`'s default.
pub const DELETE_BACKLOG_BYTES: u64 = 2 << 30;
/// Bytes freed by one step (one ftruncate).
const STEP_BYTES: u64 = 16 << 20;

thread_local! {
    /// What this core's trash task still has to free, oldest first.
    static QUEUE: RefCell<VecDeque<PathBuf>> = const { RefCell::new(VecDeque::new()) };
    /// Whether this core's trash task runs.
    static RUNNING: Cell<bool> = const { Cell::new(false) };
    /// The pace, bytes per second (0: free at once); None until a shard
    /// runs on this thread (`attach`): then deletions happen at once.
    static RATE: Cell<Option<u64>> = const { Cell::new(None) };
    /// The task queue the trash task runs in (made on first use).
    static TASK_QUEUE: Cell<Option<glommio::TaskQueueHandle>> = const { Cell::new(None) };
    /// Bytes of files queued or being freed, not yet freed (a directory
    /// counts its files once the task lists them).
    static BACKLOG: Cell<u64> = const { Cell::new(0) };
    /// Above this backlog the task frees without pausing (`attach`).
    static BACKLOG_LIMIT: Cell<u64> = const { Cell::new(DELETE_BACKLOG_BYTES) };
}

/// Gives this thread (a shard's executor) a trash task, freeing
/// `bytes_per_second` (0: each file at once, still in the background)
/// while at most `backlog_limit` bytes wait; above that it frees without
/// pausing, so deletions that come faster than the pace (a log written
/// faster than it, with retention) cannot fill the disk.
/// Without it (tools, tests of one log) deletions happen at once.
pub fn attach(bytes_per_second: u64, backlog_limit: u64) {
    RATE.with(|r| r.set(Some(bytes_per_second)));
    BACKLOG_LIMIT.with(|l| l.set(backlog_limit));
}

/// Bytes waiting to be freed on this core.
pub fn backlog() -> u64 {
    BACKLOG.with(Cell::get)
}

fn add_backlog(bytes: u64) {
    BACKLOG.with(|b| b.set(b.get().saturating_add(bytes)));
}

fn sub_backlog(bytes: u64) {
    BACKLOG.with(|b| b.set(b.get().saturating_sub(bytes)));
}

/// Paths queued or being freed on this core.
pub fn pending() -> usize {
    QUEUE.with(|q| q.borrow().len()) + usize::from(RUNNING.with(Cell::get))
}

/// Renames a partition directory out of the log's way (`<dir>.<id>-delete`,
/// the parent directory synced) and hands it to this core's trash task.
pub async fn delete_dir(dir: &Path) -> Result<()> {
    let name = dir
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| LogError::io("delete", dir, std::io::Error::other("no directory name")))?;
    let id: String = crate::data_dir::random_id_bytes()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let doomed = dir.with_file_name(format!("{name}.{id}{DELETED_DIR_SUFFIX}"));
    match std::fs::rename(dir, &doomed) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(LogError::io("rename", dir, e)),
    }
    if let Some(parent) = dir.parent() {
        crate::fsutil::sync_dir(parent).await?;
    }
    schedule(doomed);
    Ok(())
}

/// Renames a file to `<file>.deleted` (the directory synced by the caller
/// when it matters) and hands it to this core's trash task. A file already
/// gone is fine.
pub fn delete_file(path: &Path) -> Result<()> {
    let mut doomed = path.as_os_str().to_owned();
    doomed.push(DELETED_FILE_SUFFIX);
    let doomed = PathBuf::from(doomed);
    match std::fs::rename(path, &doomed) {
        Ok(()) => {
            schedule(doomed);
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(LogError::io("rename", path, e)),
    }
}

/// Hands a renamed file or directory to this core's trash task (started
/// when not running). Outside a glommio executor it is removed at once.
pub fn schedule(path: PathBuf) {
    if RATE.with(Cell::get).is_some() {
        // A file counts from now; a directory's files when they are listed.
        if let Ok(m) = std::fs::symlink_metadata(&path) {
            if m.is_file() {
                add_backlog(m.len());
            }
        }
    }
    QUEUE.with(|q| q.borrow_mut().push_back(path));
    if RUNNING.with(Cell::get) {
        return;
    }
    let Some(queue) = task_queue() else {
        // Not a shard's thread: nothing runs in the background.
        while let Some(path) = QUEUE.with(|q| q.borrow_mut().pop_front()) {
            if let Err(e) = remove_now(&path) {
                tracing::warn!(path = %path.display(), error = %e, "removing a deleted file");
            }
        }
        return;
    };
    RUNNING.with(|r| r.set(true));
    let started = glommio::spawn_local_into(drain(), queue);
    match started {
        Ok(task) => {
            task.detach();
        }
        Err(e) => {
            RUNNING.with(|r| r.set(false));
            tracing::warn!(error = %e, "starting the trash task; deleted files wait for the next");
        }
    }
}

/// Queues every leftover of a deletion a crash interrupted: directories
/// ending in `-delete` under `data_dir`. Returns how many.
pub fn recover_dirs(data_dir: &Path) -> Result<usize> {
    let mut found = 0;
    let entries = std::fs::read_dir(data_dir).map_err(|e| LogError::io("list", data_dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| LogError::io("list", data_dir, e))?;
        let is_doomed = entry
            .file_name()
            .to_str()
            .is_some_and(|n| n.ends_with(DELETED_DIR_SUFFIX));
        if is_doomed && entry.file_type().is_ok_and(|t| t.is_dir()) {
            schedule(entry.path());
            found += 1;
        }
    }
    Ok(found)
}

/// Queues the `.deleted` files a crash left in a partition directory (a
/// node's to free: on a thread without a shard, nothing is touched).
pub fn recover_files(dir: &Path) -> Result<usize> {
    if RATE.with(Cell::get).is_none() {
        return Ok(0);
    }
    let mut found = 0;
    let entries = std::fs::read_dir(dir).map_err(|e| LogError::io("list", dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| LogError::io("list", dir, e))?;
        if entry
            .file_name()
            .to_str()
            .is_some_and(|n| n.ends_with(DELETED_FILE_SUFFIX))
        {
            schedule(entry.path());
            found += 1;
        }
    }
    Ok(found)
}

fn task_queue() -> Option<glommio::TaskQueueHandle> {
    RATE.with(Cell::get)?;
    if let Some(q) = TASK_QUEUE.with(Cell::get) {
        return Some(q);
    }
    let q = glommio::executor().create_task_queue(
        Shares::Static(25),
        Latency::NotImportant,
        "skiff-trash",
    );
    TASK_QUEUE.with(|t| t.set(Some(q)));
    Some(q)
}

/// The trash task: frees what is queued, oldest first, then ends.
async fn drain() {
    while let Some(path) = QUEUE.with(|q| q.borrow_mut().pop_front()) {
        let started = std::time::Instant::now();
        match free(&path).await {
            Ok(bytes) => tracing::debug!(
                path = %path.display(),
                bytes,
                took_ms = started.elapsed().as_millis() as u64,
                "freed a deleted file or directory"
            ),
            Err(e) => tracing::warn!(
                path = %path.display(),
                error = %e,
                "freeing a deleted file or directory failed; it stays until the next start"
            ),
        }
    }
    RUNNING.with(|r| r.set(false));
}

/// Frees a file (shrunk step by step, then unlinked) or a directory (each
/// file so, then the directory); returns the bytes freed.
async fn free(path: &Path) -> Result<u64> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(LogError::io("stat", path, e)),
    };
    if !meta.is_dir() {
        return free_file(path, meta.len()).await;
    }
    let mut freed = 0;
    let entries = std::fs::read_dir(path).map_err(|e| LogError::io("list", path, e))?;
    let files: Vec<(PathBuf, u64)> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let m = e.metadata().ok()?;
            m.is_file().then(|| (e.path(), m.len()))
        })
        .collect();
    let mut left: u64 = files.iter().map(|(_, size)| size).sum();
    add_backlog(left);
    for (file, size) in files {
        left -= size;
        match free_file(&file, size).await {
            Ok(n) => freed += n,
            Err(e) => {
                // The files not reached leave the backlog too.
                sub_backlog(left);
                return Err(e);
            }
        }
    }
    crate::fsutil::remove_dir_all(path).await?;
    Ok(freed)
}

/// Shrinks a file `STEP_BYTES` at a time at this core's pace (no pause
/// while the backlog is over its limit), then unlinks it. `counted`: what
/// the backlog holds for it, all taken off by the time this returns.
async fn free_file(path: &Path, counted: u64) -> Result<u64> {
    let mut left_counted = counted;
    let result = shrink_and_remove(path, &mut left_counted).await;
    sub_backlog(left_counted);
    result
}

async fn shrink_and_remove(path: &Path, counted: &mut u64) -> Result<u64> {
    let rate = RATE.with(Cell::get).unwrap_or(0);
    let size = std::fs::metadata(path).map_or(0, |m| m.len());
    if rate > 0 && size > STEP_BYTES {
        let pause = Duration::from_secs_f64(STEP_BYTES as f64 / rate as f64);
        let owned = path.to_path_buf();
        let file = blocking(move || std::fs::OpenOptions::new().write(true).open(owned))
            .await
            .map_err(|e| LogError::io("open", path, e))?;
        let file = std::sync::Arc::new(file);
        let mut left = size;
        while left > STEP_BYTES {
            left -= STEP_BYTES;
            let f = file.clone();
            blocking(move || f.set_len(left))
                .await
                .map_err(|e| LogError::io("truncate", path, e))?;
            let step = STEP_BYTES.min(*counted);
            sub_backlog(step);
            *counted -= step;
            if backlog() <= BACKLOG_LIMIT.with(Cell::get) {
                glommio::timer::sleep(pause).await;
            } else {
                glommio::yield_if_needed().await;
            }
        }
    }
    let owned = path.to_path_buf();
    match blocking(move || std::fs::remove_file(owned)).await {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(LogError::io("remove", path, e)),
        _ => Ok(size),
    }
}

/// Removes a file or directory at once (no executor to pace it).
fn remove_now(path: &Path) -> std::io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> std::io::Result<T> {
    glommio::executor().spawn_blocking(f).await
}
