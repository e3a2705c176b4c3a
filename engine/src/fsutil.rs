//! Small whole-file I/O through glommio (io_uring): index files and checkpoints.
//!
//! Whole-file writes go to `<path>.tmp` with O_DIRECT, are trimmed to their exact
//! length, fdatasync'd, renamed over `path`, and the directory is synced, so a
//! reader sees either the old file or the new one.

use std::path::{Path, PathBuf};

use glommio::io::{Directory, DmaFile, OpenOptions};

use crate::error::{LogError, Result};

thread_local! {
    /// Devices (st_dev) whose polled-I/O support this thread's executor has probed.
    static PROBED_DEVICES: std::cell::RefCell<std::collections::HashSet<u64>> =
        std::cell::RefCell::new(std::collections::HashSet::new());
}

/// glommio decides, once per device and thread, whether to use the polled
/// io_uring by reading the first file it opens there. A read of an empty file
/// succeeds without touching the device, so the probe wrongly says yes and every
/// later read fails with EOPNOTSUPP on devices without poll queues. Before the
/// first DMA open on a device, open a file that holds data so the probe is real.
async fn ensure_probed(path: &Path) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let dir = path.parent().unwrap_or(Path::new("."));
    let dev = std::fs::metadata(dir)
        .map_err(|e| LogError::io("stat", dir, e))?
        .dev();
    if PROBED_DEVICES.with(|p| p.borrow().contains(&dev)) {
        return Ok(());
    }
    let probe = dir.join(format!(".skiff-io-probe-{}", std::process::id()));
    std::fs::write(&probe, vec![0u8; 8192]).map_err(|e| LogError::io("write", &probe, e))?;
    let opened = DmaFile::open(&probe).await;
    let _ = std::fs::remove_file(&probe);
    let file = opened.map_err(|e| LogError::io("open", &probe, e))?;
    let _ = file.close().await;
    PROBED_DEVICES.with(|p| p.borrow_mut().insert(dev));
    Ok(())
}

/// Opens (creating if asked) a DMA file read-write. Opening read-write matters:
/// glommio probes polled I/O with a read, which fails on a write-only fd.
pub async fn open_dma(path: &Path, create: bool) -> Result<DmaFile> {
    ensure_probed(path).await?;
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(create)
        .dma_open(path)
        .await
        .map_err(|e| LogError::io("open", path, e))
}

/// Reads a whole file (small files: indexes, checkpoints). `None` when it does not
/// exist.
pub async fn read_file(path: &Path) -> Result<Option<Vec<u8>>> {
    ensure_probed(path).await?;
    let file = match DmaFile::open(path).await {
        Ok(f) => f,
        Err(e) => {
            let e: std::io::Error = e.into();
            if e.kind() == std::io::ErrorKind::NotFound {
                return Ok(None);
            }
            return Err(LogError::io("open", path, e));
        }
    };
    let size = file
        .file_size()
        .await
        .map_err(|e| LogError::io("stat", path, e))?;
    let mut out = Vec::with_capacity(size as usize);
    let step = 1 << 20;
    let mut pos = 0u64;
    while pos < size {
        let len = step.min((size - pos) as usize);
        let chunk = file
            .read_at(pos, len)
            .await
            .map_err(|e| LogError::io("read", path, e))?;
        if chunk.is_empty() {
            break;
        }
        out.extend_from_slice(&chunk);
        pos += chunk.len() as u64;
    }
    let _ = file.close().await;
    Ok(Some(out))
}

/// Atomically replaces `path` with `bytes` (see the module docs).
pub async fn write_file_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    write_file_renamed(path, bytes).await?;
    sync_parent(path).await
}

/// `write_file_atomic` without its last step: the rename becomes durable
/// with the next fsync of the parent directory, which the caller owes (one
/// directory fsync can cover several files made together).
pub async fn write_file_renamed(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = write_tmp(path, bytes).await?;
    rename(&tmp, path).await
}

/// The first half of `write_file_renamed`: `bytes` written to `<path>.tmp`
/// and fdatasync'd. Returns the temporary file's path, for `rename` once
/// whatever must become durable before `path` changes has.
pub async fn write_tmp(path: &Path, bytes: &[u8]) -> Result<PathBuf> {
    let tmp = tmp_path(path);
    ensure_probed(&tmp).await?;
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .dma_open(&tmp)
        .await
        .map_err(|e| LogError::io("create", &tmp, e))?;
    if !bytes.is_empty() {
        let align = file.alignment() as usize;
        let padded = bytes.len().div_ceil(align) * align;
        let mut buf = file.alloc_dma_buffer(padded);
        let dst = buf.as_bytes_mut();
        dst[..bytes.len()].copy_from_slice(bytes);
        dst[bytes.len()..].fill(0);
        file.write_at(buf, 0)
            .await
            .map_err(|e| LogError::io("write", &tmp, e))?;
        file.truncate(bytes.len() as u64)
            .await
            .map_err(|e| LogError::io("truncate", &tmp, e))?;
    }
    file.fdatasync()
        .await
        .map_err(|e| LogError::io("fdatasync", &tmp, e))?;
    let _ = file.close().await;
    Ok(tmp)
}

/// The first half of several atomic replacements, for a caller that orders
/// the renames among other changes: each `(path, bytes)` written to its
/// temporary file and fdatasync'd, all at once. Returns the `(tmp, path)`
/// pairs for `rename_all`, whose renames the caller's next sync of the
/// directory makes durable.
pub async fn write_tmps(files: Vec<(PathBuf, Vec<u8>)>) -> Result<Vec<(PathBuf, PathBuf)>> {
    futures_util::future::try_join_all(files.into_iter().map(|(path, bytes)| async move {
        let tmp = write_tmp(&path, &bytes).await?;
        Ok::<_, LogError>((tmp, path))
    }))
    .await
}

/// Renames each `(tmp, path)` of `write_tmps` into place, in order.
pub async fn rename_all(written: Vec<(PathBuf, PathBuf)>) -> Result<()> {
    for (tmp, path) in written {
        rename(&tmp, &path).await?;
    }
    Ok(())
}

/// Renames `from` over `to` (durable with the next sync of the directory).
pub async fn rename(from: &Path, to: &Path) -> Result<()> {
    glommio::io::rename(from, to)
        .await
        .map_err(|e| LogError::io("rename", from, e))
}

/// fsyncs the directory holding `path`, making a create, rename or unlink durable.
pub async fn sync_parent(path: &Path) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    sync_dir(dir).await
}

pub async fn sync_dir(dir: &Path) -> Result<()> {
    let d = Directory::open(dir)
        .await
        .map_err(|e| LogError::io("open dir", dir, e))?;
    d.sync()
        .await
        .map_err(|e| LogError::io("fsync dir", dir, e))?;
    let _ = d.close().await;
    Ok(())
}

pub async fn remove(path: &Path) -> Result<()> {
    match glommio::io::remove(path).await {
        Ok(()) => Ok(()),
        Err(e) => {
            let e: std::io::Error = e.into();
            if e.kind() == std::io::ErrorKind::NotFound {
                Ok(())
            } else {
                Err(LogError::io("remove", path, e))
            }
        }
    }
}

/// Removes a directory and everything in it on glommio's blocking-thread
/// pool: unlinking a large file can take tens of milliseconds, which on the
/// executor's own thread would stall every partition of the core. A
/// directory already gone is fine.
pub async fn remove_dir_all(dir: &Path) -> Result<()> {
    let owned = dir.to_path_buf();
    let removed = glommio::executor()
        .spawn_blocking(move || std::fs::remove_dir_all(&owned))
        .await;
    match removed {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(LogError::io("remove dir", dir, e))
        }
        _ => Ok(()),
    }
}

fn tmp_path(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(".tmp");
    PathBuf::from(s)
}

/// The size and the space available to unprivileged users, in bytes, of the
/// file system holding `dir` (statvfs).
#[allow(unsafe_code)]
pub fn disk_space(dir: &Path) -> std::io::Result<(u64, u64)> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    // SAFETY: an all-zero statvfs is a valid value of this plain C struct.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is a NUL-terminated string and `st` a valid, writable
    // statvfs; both outlive the call.
    if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let unit = st.f_frsize as u64;
    Ok((st.f_blocks as u64 * unit, st.f_bavail as u64 * unit))
}

#[cfg(test)]
mod space_tests {
    #[test]
    fn disk_space_of_a_real_dir_and_an_error_for_a_missing_one() {
        let (total, available) = super::disk_space(std::path::Path::new("/")).unwrap_or((0, 0));
        assert!(total > 0 && available <= total, "{total} {available}");
        assert!(super::disk_space(std::path::Path::new("/no/such/dir/here")).is_err());
    }
}
