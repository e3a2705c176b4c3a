//! Durable Raft storage: the metadata log under `<data-dir>/__cluster_metadata-0/`.
//!
//! raft-rs reads through the `Storage` trait from an in-memory cache (hard
//! state, conf state, the latest snapshot, the entries after it); every change
//! goes to disk first. Files:
//!
//! ```text
//! raft.log    append-only frames:
//!               len u32 LE | crc32c u32 LE of (kind, payload) | kind u8 | payload
//!             len counts kind + payload. Kinds: 1 entry, 2 hard state,
//!             3 conf state (protobuf, raft-rs's own messages), 4 commit marker
//!             (u64 LE sequence number). `sync` writes the frames buffered since
//!             the last sync plus one commit marker, then fdatasyncs.
//! snapshot    one frame, kind 5: a protobuf raft Snapshot (metadata + the state
//!             machine image). Replaced atomically: snapshot.tmp, fsync, rename,
//!             directory fsync.
//! ```
//!
//! A snapshot at index S makes the entries up to S unnecessary: after writing it,
//! `raft.log` is rewritten (atomically, the same way) with the hard state, the
//! conf state and the entries after S. A crash between the two steps leaves old
//! entries in the log; recovery skips entries at or below the snapshot.
//!
//! Recovery (`open`): frames are replayed up to the last commit marker. What
//! follows it is a batch whose sync never returned, so nothing in it was
//! acknowledged: it is cut (the torn tail). A bad frame (short, wrong length,
//! CRC mismatch) with a valid commit marker anywhere after it is corruption of
//! synced, acknowledged data: `open` fails with `StorageError::Corrupt` naming
//! the file and position, and the operator decides (the controller does not
//! guess). The rule errs on the side of stopping: a torn batch whose own marker
//! reached the disk while an earlier page of it did not is reported as corrupt
//! too, never silently cut.
//!
//! The controller is off the data path and its writes are small (a few hundred
//! bytes per batch), so this module uses std::fs instead of glommio's DMA
//! files. A sync is two halves: `write_pending` frames what was appended
//! since the last one plus a commit marker and returns a `SyncTicket` whose
//! write and fdatasync run on any thread (the service uses glommio's blocking
//! pool: a busy disk took over a second per fdatasync in the nemesis runs,
//! and even a buffered write blocks when the kernel throttles dirty pages
//! (seed 9301: another node filling its disk); the controller's thread must
//! go on ticking meanwhile); `synced` records the result. One ticket at a
//! time: while one is out, nothing else is appended to that file (an inline
//! `sync` rewrites the log instead), so frames land in order.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use raft::prelude::{ConfState, Entry, HardState, Snapshot};
use raft::{GetEntriesContext, RaftState};

/// The metadata log's directory under the data directory (Kafka's name).
pub const LOG_DIR: &str = "__cluster_metadata-0";
pub const LOG_FILE: &str = "raft.log";
pub const SNAPSHOT_FILE: &str = "snapshot";
/// The largest frame accepted (an entry, or a snapshot of the whole state).
pub const FRAME_BYTES_MAX: usize = 256 << 20;
/// A commit marker frame: 8 header bytes, the kind, a u64 sequence number.
const COMMIT_FRAME_BYTES: usize = 17;

const KIND_ENTRY: u8 = 1;
const KIND_HARD_STATE: u8 = 2;
const KIND_CONF_STATE: u8 = 3;
const KIND_COMMIT: u8 = 4;
const KIND_SNAPSHOT: u8 = 5;

#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: corrupted at byte {position} ({reason}), below the last synced batch; refusing to guess")]
    Corrupt {
        path: PathBuf,
        position: u64,
        reason: String,
    },
    #[error("{path}: log entries are not contiguous: expected index {expected}, found {found}")]
    Gap {
        path: PathBuf,
        expected: u64,
        found: u64,
    },
    #[error("{path}: {reason}")]
    Invalid { path: PathBuf, reason: String },
}

fn io_err<'a>(
    op: &'static str,
    path: &'a Path,
) -> impl FnOnce(std::io::Error) -> StorageError + 'a {
    move |source| StorageError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

type Result<T> = std::result::Result<T, StorageError>;

/// One decoded frame and where it ends in the file.
struct Frame {
    kind: u8,
    payload: Vec<u8>,
    end: u64,
}

enum Parse {
    Frame(Frame),
    /// Nothing left.
    End,
    /// A bad frame at this position.
    Bad {
        reason: String,
    },
}

fn frame_bytes(kind: u8, payload: &[u8]) -> Vec<u8> {
    let mut body = Vec::with_capacity(1 + payload.len());
    body.push(kind);
    body.extend_from_slice(payload);
    let mut out = Vec::with_capacity(8 + body.len());
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
    out.extend_from_slice(&body);
    out
}

fn parse_frame(buf: &[u8], pos: usize) -> Parse {
    let rest = &buf[pos..];
    if rest.is_empty() {
        return Parse::End;
    }
    let Some((header, after)) = rest.split_first_chunk::<8>() else {
        return Parse::Bad {
            reason: "incomplete frame header".into(),
        };
    };
    let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
    let crc = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
    if len == 0 || len > FRAME_BYTES_MAX {
        return Parse::Bad {
            reason: format!("frame length {len} out of range"),
        };
    }
    if after.len() < len {
        return Parse::Bad {
            reason: format!("frame of {len} bytes, {} left in the file", after.len()),
        };
    }
    let body = &after[..len];
    if crc32c::crc32c(body) != crc {
        return Parse::Bad {
            reason: "CRC mismatch".into(),
        };
    }
    if !(KIND_ENTRY..=KIND_SNAPSHOT).contains(&body[0]) {
        return Parse::Bad {
            reason: format!("unknown frame kind {}", body[0]),
        };
    }
    Parse::Frame(Frame {
        kind: body[0],
        payload: body[1..].to_vec(),
        end: (pos + 8 + len) as u64,
    })
}

/// True when a valid commit marker starts anywhere after `from`. Searched byte
/// by byte rather than frame by frame, so a corrupted length field cannot hide
/// the synced batches behind it. A marker is 17 bytes with a matching CRC: a
/// false match in torn garbage is not a practical concern.
fn commit_marker_after(buf: &[u8], from: usize) -> bool {
    let marker_len: [u8; 4] = 9u32.to_le_bytes();
    (from + 1..(buf.len() + 1).saturating_sub(COMMIT_FRAME_BYTES)).any(|p| {
        buf[p..p + 4] == marker_len
            && buf[p + 8] == KIND_COMMIT
            && matches!(parse_frame(buf, p), Parse::Frame(f) if f.kind == KIND_COMMIT)
    })
}

/// A decoded frame of `raft.log` or `snapshot`, for offline readers
/// (`skiff-tools dump-metadata`); see [`read_frames`].
#[derive(Debug, Clone)]
pub enum FrameContent {
    Entry(Entry),
    HardState(HardState),
    ConfState(ConfState),
    /// The commit marker's sync sequence number.
    Commit(u64),
    Snapshot(Snapshot),
}

/// One frame found by [`read_frames`]: where it starts and ends in the file.
#[derive(Debug, Clone)]
pub struct ReadFrame {
    pub position: u64,
    pub end: u64,
    pub content: FrameContent,
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum FrameError {
    /// Short, wrong length, CRC mismatch or unknown kind: the frame boundaries are
    /// lost here and iteration stops. `synced_after`: a valid commit marker follows,
    /// so recovery refuses the log as corrupt; otherwise this is the torn tail
    /// recovery cuts.
    #[error("bad frame at byte {position}: {reason}")]
    Bad {
        position: u64,
        reason: String,
        synced_after: bool,
    },
    /// The frame is intact (its CRC matches) but its payload does not decode;
    /// iteration continues with the next frame.
    #[error("frame at byte {position}: {reason}")]
    Payload { position: u64, reason: String },
}

/// The frames of a `raft.log` or `snapshot` file's bytes, in file order, parsed
/// by the same rules as recovery. Read-only; yields at most one
/// `FrameError::Bad`, as its last item.
pub fn read_frames(
    buf: &[u8],
) -> impl Iterator<Item = std::result::Result<ReadFrame, FrameError>> + '_ {
    let mut pos = 0usize;
    let mut stopped = false;
    std::iter::from_fn(move || {
        if stopped {
            return None;
        }
        let f = match parse_frame(buf, pos) {
            Parse::End => return None,
            Parse::Bad { reason } => {
                stopped = true;
                return Some(Err(FrameError::Bad {
                    position: pos as u64,
                    reason,
                    synced_after: commit_marker_after(buf, pos),
                }));
            }
            Parse::Frame(f) => f,
        };
        let position = pos as u64;
        pos = f.end as usize;
        let path = Path::new("");
        let content = match f.kind {
            KIND_ENTRY => decode(path, "entry", &f.payload).map(FrameContent::Entry),
            KIND_HARD_STATE => decode(path, "hard state", &f.payload).map(FrameContent::HardState),
            KIND_CONF_STATE => decode(path, "conf state", &f.payload).map(FrameContent::ConfState),
            KIND_COMMIT => Ok(FrameContent::Commit(
                f.payload
                    .first_chunk::<8>()
                    .map(|b| u64::from_le_bytes(*b))
                    .unwrap_or(0),
            )),
            _ => decode(path, "snapshot", &f.payload).map(FrameContent::Snapshot),
        };
        Some(match content {
            Ok(content) => Ok(ReadFrame {
                position,
                end: f.end,
                content,
            }),
            Err(e) => Err(FrameError::Payload {
                position,
                reason: match e {
                    StorageError::Invalid { reason, .. } => reason,
                    other => other.to_string(),
                },
            }),
        })
    })
}

fn decode<M: protobuf::Message>(path: &Path, what: &str, payload: &[u8]) -> Result<M> {
    M::parse_from_bytes(payload).map_err(|e| StorageError::Invalid {
        path: path.to_path_buf(),
        reason: format!("{what} does not decode: {e}"),
    })
}

/// A metadata log fdatasync this long is logged.
const SLOW_SYNC: std::time::Duration = std::time::Duration::from_millis(500);

fn encode<M: protobuf::Message>(m: &M) -> Vec<u8> {
    // Writing a protobuf message into a Vec fails only on messages that are
    // missing required fields; raft-rs's messages have none (proto3).
    match m.write_to_bytes() {
        Ok(b) => b,
        Err(e) => panic!("protobuf encoding into memory failed: {e}"),
    }
}

fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err("fsync dir", dir))
}

/// Writes `bytes` to `path` atomically (tmp, fdatasync, rename, dir fsync).
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension("tmp");
    let mut f = File::create(&tmp).map_err(io_err("create", &tmp))?;
    f.write_all(bytes).map_err(io_err("write", &tmp))?;
    f.sync_data().map_err(io_err("fdatasync", &tmp))?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(io_err("rename", &tmp))?;
    sync_dir(path.parent().unwrap_or(Path::new(".")))
}

/// The durable Raft storage. See the module docs for the format.
///
/// Invariants: `entries` are contiguous and start at `snapshot.index + 1`;
/// everything in the cache that raft-rs was told is persisted is on disk (the
/// driver calls `sync` before sending messages or advancing).
pub struct MetadataLog {
    dir: PathBuf,
    log_path: PathBuf,
    file: File,
    hard_state: HardState,
    conf_state: ConfState,
    snapshot: Snapshot,
    entries: Vec<Entry>,
    /// Frames appended since the last `write_pending` (in memory only).
    pending: Vec<u8>,
    /// A ticket of this generation is out, its frames not yet written:
    /// nothing else may be appended to the file before `synced`.
    ticket_out: bool,
    sync_sequence: u64,
    /// Bytes in `raft.log` (written), used for the log-size snapshot trigger.
    log_bytes: u64,
    /// Bytes of `raft.log` an fdatasync has covered.
    synced_bytes: u64,
    /// Bumped when `raft.log` is rewritten (compaction, an installed
    /// snapshot): a sync of the file before says nothing about the new one.
    generation: u64,
}

/// What one sync must write and make durable: `data` appended to
/// `raft.log`, which then holds `log_bytes`, through its own descriptor so
/// both can run on another thread.
#[derive(Debug)]
pub struct SyncTicket {
    file: File,
    path: PathBuf,
    data: Vec<u8>,
    log_bytes: u64,
    generation: u64,
}

impl SyncTicket {
    /// The write alone, without the fdatasync: what a crash between the
    /// two leaves behind (the simulation's crashes).
    pub fn write_unsynced(&self) -> std::io::Result<()> {
        (&self.file).write_all(&self.data)
    }

    /// The write and the fdatasync (blocking); one that held its caller up
    /// is logged.
    pub fn sync(&self) -> std::io::Result<()> {
        let started = std::time::Instant::now();
        let result = (&self.file)
            .write_all(&self.data)
            .and_then(|()| self.file.sync_data());
        let took = started.elapsed();
        if took >= SLOW_SYNC {
            tracing::warn!(
                path = %self.path.display(), bytes = self.data.len(),
                took_ms = took.as_millis() as u64,
                "the metadata log's write and fdatasync were slow"
            );
        }
        result
    }
}

impl MetadataLog {
    /// Opens (creating if needed) `<data_dir>/__cluster_metadata-0/` and recovers
    /// it: snapshot, then the log's frames up to the last commit marker.
    pub fn open(data_dir: &Path) -> Result<Self> {
        let dir = data_dir.join(LOG_DIR);
        if !dir.exists() {
            std::fs::create_dir_all(&dir).map_err(io_err("create dir", &dir))?;
            sync_dir(data_dir)?;
        }
        let snapshot = Self::read_snapshot(&dir.join(SNAPSHOT_FILE))?;
        let log_path = dir.join(LOG_FILE);
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(&log_path)
            .map_err(io_err("open", &log_path))?;
        let mut buf = Vec::new();
        file.read_to_end(&mut buf)
            .map_err(io_err("read", &log_path))?;
        let mut log = MetadataLog {
            hard_state: HardState::default(),
            conf_state: snapshot.get_metadata().get_conf_state().clone(),
            entries: Vec::new(),
            snapshot,
            dir,
            log_path,
            file,
            pending: Vec::new(),
            ticket_out: false,
            sync_sequence: 0,
            log_bytes: 0,
            synced_bytes: 0,
            generation: 0,
        };
        let durable = log.replay(&buf)?;
        if durable < buf.len() as u64 {
            tracing::warn!(
                path = %log.log_path.display(),
                durable,
                file_bytes = buf.len(),
                "cutting the metadata log's torn tail (a batch whose sync never returned)"
            );
            log.file
                .set_len(durable)
                .map_err(io_err("truncate", &log.log_path))?;
            log.file
                .sync_all()
                .map_err(io_err("fsync", &log.log_path))?;
        }
        log.log_bytes = durable;
        log.synced_bytes = durable;
        let snap_index = log.snapshot.get_metadata().index;
        if log.hard_state.commit < snap_index {
            log.hard_state.commit = snap_index;
        }
        tracing::info!(
            path = %log.dir.display(),
            snapshot_index = snap_index,
            last_index = log.last(),
            term = log.hard_state.term,
            commit = log.hard_state.commit,
            "metadata log recovered"
        );
        Ok(log)
    }

    fn read_snapshot(path: &Path) -> Result<Snapshot> {
        let buf = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Snapshot::default()),
            Err(e) => return Err(io_err("read", path)(e)),
        };
        match parse_frame(&buf, 0) {
            Parse::Frame(f) if f.kind == KIND_SNAPSHOT && f.end == buf.len() as u64 => {
                decode(path, "snapshot", &f.payload)
            }
            Parse::Frame(_) => Err(StorageError::Invalid {
                path: path.to_path_buf(),
                reason: "not a single snapshot frame".into(),
            }),
            Parse::End => Err(StorageError::Invalid {
                path: path.to_path_buf(),
                reason: "empty snapshot file".into(),
            }),
            Parse::Bad { reason, .. } => Err(StorageError::Corrupt {
                path: path.to_path_buf(),
                position: 0,
                reason,
            }),
        }
    }

    /// Replays the log's frames; returns the durable length (end of the last
    /// commit marker).
    fn replay(&mut self, buf: &[u8]) -> Result<u64> {
        // Pass 1: find the durable point, and check nothing bad lies below it.
        let mut frames = Vec::new();
        let mut pos = 0usize;
        let mut durable = 0u64;
        loop {
            match parse_frame(buf, pos) {
                Parse::End => break,
                Parse::Frame(f) => {
                    pos = f.end as usize;
                    if f.kind == KIND_COMMIT {
                        durable = f.end;
                    }
                    frames.push(f);
                }
                Parse::Bad { reason } => {
                    if commit_marker_after(buf, pos) {
                        return Err(StorageError::Corrupt {
                            path: self.log_path.clone(),
                            position: pos as u64,
                            reason,
                        });
                    }
                    break;
                }
            }
        }
        // Pass 2: apply the frames below the durable point.
        for f in frames.into_iter().take_while(|f| f.end <= durable) {
            match f.kind {
                KIND_ENTRY => {
                    let e: Entry = decode(&self.log_path, "entry", &f.payload)?;
                    self.cache_entry(e)?;
                }
                KIND_HARD_STATE => {
                    self.hard_state = decode(&self.log_path, "hard state", &f.payload)?;
                }
                KIND_CONF_STATE => {
                    self.conf_state = decode(&self.log_path, "conf state", &f.payload)?;
                }
                KIND_COMMIT => {
                    let seq = f
                        .payload
                        .first_chunk::<8>()
                        .map(|b| u64::from_le_bytes(*b))
                        .unwrap_or(0);
                    self.sync_sequence = self.sync_sequence.max(seq);
                }
                other => {
                    return Err(StorageError::Invalid {
                        path: self.log_path.clone(),
                        reason: format!("frame kind {other} in the log"),
                    })
                }
            }
        }
        Ok(durable)
    }

    /// Puts an entry in the cache; a conflicting suffix (same or higher index) is
    /// replaced, as Raft's log matching requires.
    fn cache_entry(&mut self, e: Entry) -> Result<()> {
        let snap_index = self.snapshot.get_metadata().index;
        if e.index <= snap_index {
            return Ok(());
        }
        let expected = self.last() + 1;
        if e.index > expected {
            return Err(StorageError::Gap {
                path: self.log_path.clone(),
                expected,
                found: e.index,
            });
        }
        self.entries.truncate((e.index - snap_index - 1) as usize);
        self.entries.push(e);
        Ok(())
    }

    fn first(&self) -> u64 {
        self.snapshot.get_metadata().index + 1
    }

    fn last(&self) -> u64 {
        self.snapshot.get_metadata().index + self.entries.len() as u64
    }

    /// Whether the log has a configuration (bootstrapped or recovered).
    pub fn is_initialized(&self) -> bool {
        !self.conf_state.voters.is_empty()
    }

    /// First start of a quorum member: the voters. Durable before it returns.
    /// Does nothing when the log already has a configuration.
    pub fn bootstrap(&mut self, voters: &[u64]) -> Result<()> {
        if self.is_initialized() {
            return Ok(());
        }
        self.set_conf_state(ConfState {
            voters: voters.to_vec(),
            ..Default::default()
        });
        self.sync()
    }

    pub fn set_conf_state(&mut self, cs: ConfState) {
        self.pending
            .extend_from_slice(&frame_bytes(KIND_CONF_STATE, &encode(&cs)));
        self.conf_state = cs;
    }

    pub fn conf_state(&self) -> &ConfState {
        &self.conf_state
    }

    pub fn hard_state(&self) -> &HardState {
        &self.hard_state
    }

    pub fn set_hard_state(&mut self, hs: HardState) {
        if hs == self.hard_state {
            return;
        }
        self.pending
            .extend_from_slice(&frame_bytes(KIND_HARD_STATE, &encode(&hs)));
        self.hard_state = hs;
    }

    pub fn set_commit(&mut self, commit: u64) {
        let mut hs = self.hard_state.clone();
        hs.commit = commit;
        self.set_hard_state(hs);
    }

    /// Appends entries (replacing any conflicting suffix). Durable after `sync`.
    pub fn append(&mut self, entries: &[Entry]) -> Result<()> {
        for e in entries {
            self.pending
                .extend_from_slice(&frame_bytes(KIND_ENTRY, &encode(e)));
            self.cache_entry(e.clone())?;
        }
        Ok(())
    }

    /// Writes everything since the last sync plus a commit marker and fdatasyncs.
    /// An error leaves the log's durable state unknown: the caller must stop
    /// (the controller is not allowed to acknowledge anything after it).
    pub fn sync(&mut self) -> Result<()> {
        if self.ticket_out {
            // Appending now would put these frames before the ticket's:
            // the rewrite holds both, in order, durable.
            return self.rewrite_log();
        }
        if let Some(ticket) = self.write_pending()? {
            let result = ticket.sync();
            self.synced(&ticket, result)?;
        }
        Ok(())
    }

    /// The first half of a sync that need not hold up the caller's thread:
    /// frames everything appended since the last one plus a commit marker
    /// and returns what to write and fdatasync, on any thread. None when
    /// nothing was appended, or while the previous ticket is out (one at a
    /// time, so frames land in order). `synced` finishes it.
    pub fn write_pending(&mut self) -> Result<Option<SyncTicket>> {
        if self.pending.is_empty() || self.ticket_out {
            return Ok(None);
        }
        let file = self
            .file
            .try_clone()
            .map_err(io_err("dup", &self.log_path))?;
        self.sync_sequence += 1;
        let marker = frame_bytes(KIND_COMMIT, &self.sync_sequence.to_le_bytes());
        let mut data = std::mem::take(&mut self.pending);
        data.extend_from_slice(&marker);
        self.log_bytes += data.len() as u64;
        self.ticket_out = true;
        Ok(Some(SyncTicket {
            file,
            path: self.log_path.clone(),
            data,
            log_bytes: self.log_bytes,
            generation: self.generation,
        }))
    }

    /// Ends a sync `write_pending` began: on success everything written up to
    /// the ticket is durable. A failed fdatasync leaves the durable state
    /// unknown (a second one proves nothing): the caller must stop.
    pub fn synced(&mut self, ticket: &SyncTicket, result: std::io::Result<()>) -> Result<()> {
        if ticket.generation == self.generation {
            self.ticket_out = false;
        }
        result.map_err(io_err("write or fdatasync", &ticket.path))?;
        if ticket.generation == self.generation {
            self.synced_bytes = self.synced_bytes.max(ticket.log_bytes);
        }
        Ok(())
    }

    /// Frames buffered since the last `write_pending`.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Bytes of `raft.log` known durable (a crash may lose what follows).
    pub fn synced_bytes(&self) -> u64 {
        self.synced_bytes
    }

    /// Bytes in `raft.log` (a snapshot trigger).
    pub fn log_bytes(&self) -> u64 {
        self.log_bytes
    }

    /// The latest snapshot (empty metadata index 0 when none).
    pub fn latest_snapshot(&self) -> &Snapshot {
        &self.snapshot
    }

    /// Installs a snapshot received from the leader: it replaces the whole log.
    pub fn apply_snapshot(&mut self, snapshot: Snapshot) -> Result<()> {
        let meta = snapshot.get_metadata();
        if meta.index <= self.snapshot.get_metadata().index {
            return Ok(());
        }
        self.conf_state = meta.get_conf_state().clone();
        let mut hs = self.hard_state.clone();
        hs.commit = hs.commit.max(meta.index);
        hs.term = hs.term.max(meta.term);
        self.hard_state = hs;
        // Entries past the snapshot that match it could be kept; dropping them is
        // simpler and correct (the leader sends them again).
        self.entries.clear();
        self.snapshot = snapshot;
        self.write_snapshot_and_rewrite_log()
    }

    /// Takes a snapshot of the state machine at `index` (applied, so present in
    /// the log) and drops the entries up to it, on disk and in memory.
    pub fn compact(&mut self, index: u64, data: Vec<u8>) -> Result<()> {
        if index <= self.snapshot.get_metadata().index {
            return Ok(());
        }
        if index > self.last() || index > self.hard_state.commit {
            return Err(StorageError::Invalid {
                path: self.log_path.clone(),
                reason: format!(
                    "snapshot at {index} beyond the last entry {} or commit {}",
                    self.last(),
                    self.hard_state.commit
                ),
            });
        }
        let term = self.term_of(index).unwrap_or(0);
        let mut snapshot = Snapshot::default();
        snapshot.set_data(data.into());
        let meta = snapshot.mut_metadata();
        meta.index = index;
        meta.term = term;
        meta.set_conf_state(self.conf_state.clone());
        let drop_count = (index - self.first() + 1) as usize;
        self.entries.drain(..drop_count);
        self.snapshot = snapshot;
        self.write_snapshot_and_rewrite_log()
    }

    fn write_snapshot_and_rewrite_log(&mut self) -> Result<()> {
        let snap_path = self.dir.join(SNAPSHOT_FILE);
        write_atomic(
            &snap_path,
            &frame_bytes(KIND_SNAPSHOT, &encode(&self.snapshot)),
        )?;
        self.rewrite_log()
    }

    /// Replaces `raft.log` atomically with the conf state, the hard state and
    /// every entry after the snapshot, durable. A ticket still out writes to
    /// the file replaced (harmless: the new one holds its frames).
    fn rewrite_log(&mut self) -> Result<()> {
        let mut image = frame_bytes(KIND_CONF_STATE, &encode(&self.conf_state));
        image.extend_from_slice(&frame_bytes(KIND_HARD_STATE, &encode(&self.hard_state)));
        for e in &self.entries {
            image.extend_from_slice(&frame_bytes(KIND_ENTRY, &encode(e)));
        }
        self.sync_sequence += 1;
        image.extend_from_slice(&frame_bytes(KIND_COMMIT, &self.sync_sequence.to_le_bytes()));
        // Whatever was pending is part of the image now.
        self.pending.clear();
        write_atomic(&self.log_path, &image)?;
        self.file = OpenOptions::new()
            .read(true)
            .append(true)
            .open(&self.log_path)
            .map_err(io_err("open", &self.log_path))?;
        self.log_bytes = image.len() as u64;
        self.synced_bytes = self.log_bytes;
        self.generation += 1;
        self.ticket_out = false;
        tracing::debug!(
            index = self.snapshot.get_metadata().index,
            log_bytes = self.log_bytes,
            "metadata snapshot written, log compacted"
        );
        Ok(())
    }

    fn term_of(&self, idx: u64) -> Option<u64> {
        let meta = self.snapshot.get_metadata();
        if idx == meta.index {
            return Some(meta.term);
        }
        if idx < self.first() || idx > self.last() {
            return None;
        }
        Some(self.entries[(idx - self.first()) as usize].term)
    }
}

impl raft::Storage for MetadataLog {
    fn initial_state(&self) -> raft::Result<RaftState> {
        Ok(RaftState::new(
            self.hard_state.clone(),
            self.conf_state.clone(),
        ))
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        _context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        if low < self.first() {
            return Err(raft::Error::Store(raft::StorageError::Compacted));
        }
        if high > self.last() + 1 || low > high {
            return Err(raft::Error::Store(raft::StorageError::Unavailable));
        }
        let from = (low - self.first()) as usize;
        let to = (high - self.first()) as usize;
        let mut out = self.entries[from..to].to_vec();
        raft::util::limit_size(&mut out, max_size.into());
        Ok(out)
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        if idx < self.snapshot.get_metadata().index {
            return Err(raft::Error::Store(raft::StorageError::Compacted));
        }
        self.term_of(idx)
            .ok_or(raft::Error::Store(raft::StorageError::Unavailable))
    }

    fn first_index(&self) -> raft::Result<u64> {
        Ok(self.first())
    }

    fn last_index(&self) -> raft::Result<u64> {
        Ok(self.last())
    }

    fn snapshot(&self, request_index: u64, _to: u64) -> raft::Result<Snapshot> {
        if self.snapshot.get_metadata().index < request_index {
            return Err(raft::Error::Store(
                raft::StorageError::SnapshotTemporarilyUnavailable,
            ));
        }
        Ok(self.snapshot.clone())
    }
}

#[cfg(test)]
#[path = "storage_tests.rs"]
mod tests;
