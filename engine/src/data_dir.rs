//! The data directory's identity file, `meta.properties` (Kafka's format):
//! `key=value` lines with `version=1`, `node.id` and `cluster.id`; `#` comments.
//!
//! Written once when a node first uses a data directory and checked at every
//! start, so a directory cannot silently move to another node id. The first
//! time the node joins a cluster, `joined.cluster.id` records that cluster
//! (`join_cluster`); from then on the directory refuses any other, as Kafka's
//! does (InconsistentClusterIdException): a node pointed at the wrong quorum
//! would otherwise take every partition of its directory for a deleted topic.
//!
//! And the directory's lock, `.lock` (`lock`): one process at a time uses a data
//! directory, as Kafka locks every log directory. Two nodes writing one directory
//! would each recover, truncate and append the other's segments.

use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use thiserror::Error;

pub const META_FILE: &str = "meta.properties";
/// The data directory's lock file (Kafka's name); holds the holder's pid.
pub const LOCK_FILE: &str = ".lock";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaProperties {
    pub version: u32,
    pub node_id: i32,
    /// The id this directory proposes when its node founds a cluster (the
    /// first active controller names the cluster with it).
    pub cluster_id: String,
    /// The cluster this directory's node joined (`join_cluster`); None before
    /// its first join.
    pub joined_cluster_id: Option<String>,
}

impl MetaProperties {
    fn render(&self) -> String {
        let mut text = format!(
            "#written by skiff\nversion={}\nnode.id={}\ncluster.id={}\n",
            self.version, self.node_id, self.cluster_id
        );
        if let Some(joined) = &self.joined_cluster_id {
            text.push_str(&format!("joined.cluster.id={joined}\n"));
        }
        text
    }
}

#[derive(Debug, Error, PartialEq, Eq)]
#[error("line {line}: {reason}")]
pub struct MetaError {
    /// 1-based; 0 for a key missing from the whole file.
    pub line: usize,
    pub reason: String,
}

pub fn parse_meta_properties(text: &str) -> Result<MetaProperties, MetaError> {
    let err = |line: usize, reason: String| MetaError { line, reason };
    let (mut version, mut node_id, mut cluster_id) = (None, None, None);
    let mut joined_cluster_id = None;
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with('!') {
            continue;
        }
        let (key, value) = line
            .split_once('=')
            .ok_or_else(|| err(n, format!("not a key=value line: {line:?}")))?;
        let value = value.trim();
        let number = |what: &str| err(n, format!("{what} {value:?} is not a number"));
        match key.trim() {
            "version" => version = Some(value.parse::<u32>().map_err(|_| number("version"))?),
            "node.id" => node_id = Some(value.parse::<i32>().map_err(|_| number("node.id"))?),
            "cluster.id" if value.is_empty() => return Err(err(n, "empty cluster.id".into())),
            "cluster.id" => cluster_id = Some(value.to_owned()),
            "joined.cluster.id" if value.is_empty() => {
                return Err(err(n, "empty joined.cluster.id".into()))
            }
            "joined.cluster.id" => joined_cluster_id = Some(value.to_owned()),
            _ => {}
        }
    }
    let missing = |key: &str| err(0, format!("no {key}"));
    Ok(MetaProperties {
        version: version.ok_or_else(|| missing("version"))?,
        node_id: node_id.ok_or_else(|| missing("node.id"))?,
        cluster_id: cluster_id.ok_or_else(|| missing("cluster.id"))?,
        joined_cluster_id,
    })
}

#[derive(Debug, Error)]
pub enum DataDirError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    Malformed { path: String, source: MetaError },
    #[error("{path} belongs to node {found}, not node {expected}")]
    NodeIdMismatch {
        path: String,
        found: i32,
        expected: i32,
    },
    #[error("{path} belongs to cluster {joined}, but the controller quorum serves cluster {cluster}: is --controller-quorum pointing at the wrong cluster?")]
    ClusterIdMismatch {
        path: String,
        joined: String,
        cluster: String,
    },
    #[error("data directory {dir} is in use by another skiff process ({holder})")]
    InUse {
        dir: String,
        /// "pid N", or why the pid is not known.
        holder: String,
    },
}

/// The exclusive lock on a data directory, held until dropped (or the process
/// ends: the kernel releases a `flock` when its file is closed, SIGKILL
/// included, so a crashed holder never leaves the directory locked).
#[derive(Debug)]
pub struct DirLock {
    _file: std::fs::File,
    path: PathBuf,
}

impl DirLock {
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Takes the exclusive lock on `<data_dir>/.lock` (created if missing) and
/// writes this process's pid into it, or fails at once with `InUse` naming
/// the holder's pid when another process holds it. `flock`, not `fcntl`
/// locks: those are per process and dropped when any descriptor of the file
/// closes, so a library opening the file by accident would unlock it.
pub fn lock(data_dir: &Path) -> Result<DirLock, DataDirError> {
    let path = data_dir.join(LOCK_FILE);
    let shown = path.display().to_string();
    let io = |source| DataDirError::Io {
        path: shown.clone(),
        source,
    };
    // Not truncated on open: until the lock is ours the pid in it is the
    // holder's, which the error below names.
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(io)?;
    loop {
        // SAFETY: flock on a descriptor `file` owns and keeps open for the
        // call; no memory is passed.
        #[allow(unsafe_code)]
        let r = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if r == 0 {
            break;
        }
        let e = std::io::Error::last_os_error();
        match e.kind() {
            std::io::ErrorKind::Interrupted => continue,
            std::io::ErrorKind::WouldBlock => {
                return Err(DataDirError::InUse {
                    dir: data_dir.display().to_string(),
                    holder: holder(&path),
                })
            }
            _ => return Err(io(e)),
        }
    }
    file.set_len(0).map_err(io)?;
    file.write_all(format!("{}\n", std::process::id()).as_bytes())
        .map_err(io)?;
    Ok(DirLock { _file: file, path })
}

/// The holder's pid from the lock file. A holder writes it right after it
/// locks, so an empty file is read again a few times before giving up.
fn holder(path: &Path) -> String {
    for _ in 0..10 {
        match std::fs::read_to_string(path) {
            Ok(text) if !text.trim().is_empty() => {
                return match text.trim().parse::<u32>() {
                    Ok(pid) => format!("pid {pid}"),
                    Err(_) => format!("{} does not hold a pid", path.display()),
                };
            }
            Ok(_) => std::thread::sleep(std::time::Duration::from_millis(20)),
            Err(e) => return format!("pid unknown: {e}"),
        }
    }
    "pid unknown".to_string()
}

/// Reads `meta.properties`, or writes a fresh one (with a new cluster id) when the
/// directory has none. Runs once at start-up, before the executors, so it uses
/// `std::fs` (write to a temporary file, fsync, rename, fsync the directory).
pub fn load_or_create(data_dir: &Path, node_id: i32) -> Result<MetaProperties, DataDirError> {
    let path = data_dir.join(META_FILE);
    let shown = path.display().to_string();
    let io = |source| DataDirError::Io {
        path: shown.clone(),
        source,
    };
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let meta = parse_meta_properties(&text).map_err(|source| DataDirError::Malformed {
                path: shown.clone(),
                source,
            })?;
            if meta.node_id != node_id {
                return Err(DataDirError::NodeIdMismatch {
                    path: shown,
                    found: meta.node_id,
                    expected: node_id,
                });
            }
            Ok(meta)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let meta = MetaProperties {
                version: 1,
                node_id,
                cluster_id: new_cluster_id(),
                joined_cluster_id: None,
            };
            write_meta(data_dir, &meta)?;
            Ok(meta)
        }
        Err(e) => Err(io(e)),
    }
}

/// Writes `meta.properties` atomically: a temporary file, fsync, rename,
/// fsync of the directory.
fn write_meta(data_dir: &Path, meta: &MetaProperties) -> Result<(), DataDirError> {
    let path = data_dir.join(META_FILE);
    let io = |source| DataDirError::Io {
        path: path.display().to_string(),
        source,
    };
    let tmp = data_dir.join(format!("{META_FILE}.tmp"));
    let mut f = std::fs::File::create(&tmp).map_err(io)?;
    f.write_all(meta.render().as_bytes()).map_err(io)?;
    f.sync_all().map_err(io)?;
    std::fs::rename(&tmp, &path).map_err(io)?;
    std::fs::File::open(data_dir)
        .and_then(|d| d.sync_all())
        .map_err(io)
}

/// Binds the data directory to the cluster its node has joined: records
/// `cluster` the first time (a new directory, or one from before the key
/// existed), and refuses with `ClusterIdMismatch` when the directory joined
/// another. Runs once per start, after the node caught up with the cluster's
/// metadata and before it acts on it (stray partitions are deleted only in a
/// directory bound to the cluster whose metadata says so). A few hundred
/// bytes through `std::fs`, once.
pub fn join_cluster(data_dir: &Path, cluster: &str) -> Result<(), DataDirError> {
    let path = data_dir.join(META_FILE);
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(&path).map_err(|source| DataDirError::Io {
        path: shown.clone(),
        source,
    })?;
    let mut meta = parse_meta_properties(&text).map_err(|source| DataDirError::Malformed {
        path: shown.clone(),
        source,
    })?;
    match &meta.joined_cluster_id {
        Some(joined) if joined == cluster => Ok(()),
        Some(joined) => Err(DataDirError::ClusterIdMismatch {
            path: shown,
            joined: joined.clone(),
            cluster: cluster.to_string(),
        }),
        None => {
            meta.joined_cluster_id = Some(cluster.to_string());
            write_meta(data_dir, &meta)
        }
    }
}

/// 16 random bytes from /dev/urandom (time and pid where it cannot be read):
/// ids that must differ between processes and nodes.
pub fn random_id_bytes() -> [u8; 16] {
    let mut bytes = [0u8; 16];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        use std::io::Read;
        let _ = f.read_exact(&mut bytes);
    }
    if bytes == [0u8; 16] {
        // No /dev/urandom: time and pid still make collisions unlikely.
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        bytes = (now ^ (u128::from(std::process::id()) << 64)).to_le_bytes();
    }
    bytes
}

/// 16 random bytes as 22 characters of URL-safe base64, like Kafka's cluster ids.
fn new_cluster_id() -> String {
    crate::partition_meta::uuid_string(&random_id_bytes())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_reject() {
        let meta = parse_meta_properties("#x\nversion=1\nnode.id=3\ncluster.id=abc\n").unwrap();
        assert_eq!((meta.node_id, meta.cluster_id.as_str()), (3, "abc"));
        assert_eq!(
            parse_meta_properties("version=1\nnode.id=x\n")
                .unwrap_err()
                .line,
            2
        );
        assert_eq!(
            parse_meta_properties("version=1\nnode.id=1\n")
                .unwrap_err()
                .line,
            0
        );
        assert!(parse_meta_properties("garbage\n").is_err());
    }

    #[test]
    fn created_once_then_checked() {
        let dir = tempfile::tempdir().unwrap();
        let first = load_or_create(dir.path(), 7).unwrap();
        assert_eq!(first.cluster_id.len(), 22);
        assert_eq!(load_or_create(dir.path(), 7).unwrap(), first);
        assert!(matches!(
            load_or_create(dir.path(), 8),
            Err(DataDirError::NodeIdMismatch { .. })
        ));
    }

    #[test]
    fn the_first_cluster_joined_is_the_only_one() {
        let dir = tempfile::tempdir().unwrap();
        let first = load_or_create(dir.path(), 7).unwrap();
        assert_eq!(first.joined_cluster_id, None);
        join_cluster(dir.path(), "clusterA").unwrap();
        join_cluster(dir.path(), "clusterA").unwrap();
        let e = join_cluster(dir.path(), "clusterB").unwrap_err();
        assert!(matches!(e, DataDirError::ClusterIdMismatch { .. }), "{e}");
        assert!(e.to_string().contains("clusterA"), "{e}");
        let again = load_or_create(dir.path(), 7).unwrap();
        assert_eq!(again.cluster_id, first.cluster_id);
        assert_eq!(again.joined_cluster_id.as_deref(), Some("clusterA"));
    }

    #[test]
    fn one_lock_at_a_time_naming_the_holder() {
        let dir = tempfile::tempdir().unwrap();
        let held = lock(dir.path()).unwrap();
        let pid = std::process::id().to_string();
        assert_eq!(
            std::fs::read_to_string(held.path()).unwrap().trim(),
            pid.as_str()
        );
        // flock locks open files, not processes: a second open in this very
        // process is refused as another process's would be.
        let e = lock(dir.path()).unwrap_err();
        let shown = e.to_string();
        assert!(matches!(e, DataDirError::InUse { .. }), "{shown}");
        assert!(shown.contains(&dir.path().display().to_string()), "{shown}");
        assert!(shown.contains(&format!("pid {pid}")), "{shown}");
        drop(held);
        let again = lock(dir.path()).unwrap();
        // The lock file is not a partition directory.
        assert!(crate::shard::list_partition_dirs(dir.path())
            .unwrap()
            .is_empty());
        drop(again);
    }
}
