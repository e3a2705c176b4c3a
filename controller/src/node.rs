//! The Raft driver: one quorum member, sans I/O.
//!
//! `QuorumNode` owns raft-rs's `RawNode`, the durable metadata log (its
//! `Storage`) and the metadata state machine. The caller owns the clock and the
//! network:
//!
//! ```text
//! every tick interval:   node.tick()
//! message from a peer:   node.step(msg)
//! active controller:     node.propose(&records)      (NotLeader elsewhere)
//! after any of these:    let out = node.poll_async()?;
//!                        send out.messages; hand out.committed to whoever waits
//!                        if let Some(t) = node.begin_sync()? { run t.sync()
//!                        anywhere; then node.end_sync(t, result)? (same use) }
//! a snapshot message:    node.report_snapshot(to, delivered) once the
//!                        transport knows (raft-rs waits for it)
//! ```
//!
//! `poll_async` handles raft-rs's `Ready`s in the order that keeps Raft safe
//! without waiting for the disk (raft-rs's asynchronous persistence):
//! - a received snapshot is installed and synced at once (rare);
//! - new entries and the hard state are written into the log's page cache;
//! - the leader's messages go out at once (Raft thesis 10.2.1: its own entry
//!   counts towards the quorum only once persisted);
//! - every other message (votes, a follower's acknowledgements) is held until
//!   an fdatasync covers the ready it came with, except heartbeat answers,
//!   which promise nothing;
//! - committed batches are applied in log order (raft-rs hands over only
//!   what this member has persisted).
//!
//! `begin_sync` returns the fdatasync to run (one at a time), on any thread;
//! `end_sync` takes its result, tells raft-rs what is durable and releases what
//! waited. The controller service runs the fdatasync on glommio's blocking
//! pool, so a slow disk delays commits, not ticks, heartbeats or elections.
//! `poll` does all of it inline (tests, tools). Every
//! `snapshot_interval_entries` applied entries the state machine is
//! snapshotted and the log rewritten behind it (synchronously: rare).
//!
//! Architecture invariant: nothing that depends on a write leaves before an
//! fdatasync covered it; a storage error stops the node (its durable state is
//! then unknown), it is never retried or logged and ignored.

use std::path::Path;

use raft::prelude::{EntryType, Message, MessageType};
use raft::{RawNode, SnapshotStatus, StateRole};

use crate::records::{self, MetadataRecord, RecordError};
use crate::state::ClusterState;
use crate::storage::{MetadataLog, StorageError};

/// Settings of one quorum member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuorumConfig {
    /// This member's Raft id (the node id; never 0).
    pub id: u64,
    /// The voters (static membership: changing it is not supported yet).
    pub voters: Vec<u64>,
    /// A follower that hears nothing for a random number of ticks in
    /// `[election_tick_min, election_tick_max)` starts an election.
    pub election_tick_min: usize,
    pub election_tick_max: usize,
    /// The leader sends heartbeats every this many ticks.
    pub heartbeat_tick: usize,
    /// Snapshot the state machine (and truncate the log) after this many
    /// applied entries, or once `raft.log` holds this many bytes, whichever
    /// comes first.
    pub snapshot_interval_entries: u64,
    pub snapshot_interval_bytes: u64,
    /// Bytes of entries per append message.
    pub max_size_per_msg: u64,
    /// Append messages in flight per follower.
    pub max_inflight_msgs: usize,
}

impl QuorumConfig {
    /// Defaults for a tick of 100 ms: elections after 1-2 s of silence,
    /// heartbeats every 200 ms.
    pub fn new(id: u64, voters: Vec<u64>) -> Self {
        Self {
            id,
            voters,
            election_tick_min: 10,
            election_tick_max: 20,
            heartbeat_tick: 2,
            snapshot_interval_entries: 10_000,
            snapshot_interval_bytes: 64 << 20,
            max_size_per_msg: 1 << 20,
            max_inflight_msgs: 256,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error("raft: {0}")]
    Raft(#[from] raft::Error),
    #[error("metadata record: {0}")]
    Record(#[from] RecordError),
    #[error("not the active controller (leader: {leader:?})")]
    NotLeader { leader: Option<u64> },
    #[error("invalid quorum config: {0}")]
    Config(String),
    #[error(
        "committed entry {index} is a membership change; the quorum is static in this version"
    )]
    MembershipChange { index: u64 },
}

/// A committed record batch, applied at `offset` (its Raft index).
#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct Committed {
    pub offset: u64,
    pub records: Vec<MetadataRecord>,
}

/// What one `poll` produced.
#[derive(Debug, Default)]
pub struct Output {
    /// To send to their `to` peer (after the storage sync, already done).
    pub messages: Vec<Message>,
    /// Applied to the state machine, in log order.
    pub committed: Vec<Committed>,
    /// A snapshot from the leader replaced the state machine at this offset.
    pub snapshot_installed: Option<u64>,
}

impl Output {
    /// Appends `later`'s messages and commits after this one's.
    pub fn extend(&mut self, later: Output) {
        self.messages.extend(later.messages);
        self.committed.extend(later.committed);
        if later.snapshot_installed.is_some() {
            self.snapshot_installed = later.snapshot_installed;
        }
    }
}

/// An fdatasync `begin_sync` asks for: run `sync` on any thread, then give
/// the ticket and the result to `end_sync`.
#[derive(Debug)]
pub struct SyncTicket {
    /// The newest Raft ready whose writes this sync covers.
    number: u64,
    storage: crate::storage::SyncTicket,
}

impl SyncTicket {
    /// The write and the fdatasync (blocking).
    pub fn sync(&self) -> std::io::Result<()> {
        self.storage.sync()
    }

    /// The write alone: what a crash before the fdatasync leaves (tests).
    pub fn write_unsynced(&self) -> std::io::Result<()> {
        self.storage.write_unsynced()
    }
}

pub struct QuorumNode {
    raw: RawNode<MetadataLog>,
    state: ClusterState,
    /// Highest log index applied to `state` (committed, persisted).
    applied: u64,
    snapshot_interval_entries: u64,
    snapshot_interval_bytes: u64,
    /// The newest ready whose writes no sync has covered yet.
    unsynced: Option<u64>,
    /// The ready a sync in flight covers (one at a time).
    syncing: Option<u64>,
    /// Messages raft-rs releases only once their ready is durable, by ready.
    held: std::collections::VecDeque<(u64, Vec<Message>)>,
}

impl QuorumNode {
    /// Opens the metadata log under `data_dir` (bootstrapping the voters on first
    /// start), restores the state machine from its snapshot; committed entries
    /// after it are re-applied by the first polls.
    pub fn open(data_dir: &Path, config: &QuorumConfig) -> Result<Self, NodeError> {
        if config.id == 0 || !config.voters.contains(&config.id) {
            return Err(NodeError::Config(format!(
                "id {} must be non-zero and one of the voters {:?}",
                config.id, config.voters
            )));
        }
        if config.snapshot_interval_entries == 0 || config.snapshot_interval_bytes == 0 {
            return Err(NodeError::Config("snapshot interval of 0".into()));
        }
        let mut log = MetadataLog::open(data_dir)?;
        log.bootstrap(&config.voters)?;
        if log.conf_state().voters != config.voters {
            tracing::warn!(
                stored = ?log.conf_state().voters,
                configured = ?config.voters,
                "the metadata log's voters differ from the configured quorum; the log wins"
            );
        }
        let snap = log.latest_snapshot();
        let applied = snap.get_metadata().index;
        let state = if applied > 0 {
            ClusterState::from_snapshot(snap.get_data())?
        } else {
            ClusterState::new()
        };
        let raft_config = raft::Config {
            id: config.id,
            election_tick: config.election_tick_min,
            min_election_tick: config.election_tick_min,
            max_election_tick: config.election_tick_max,
            heartbeat_tick: config.heartbeat_tick,
            applied,
            max_size_per_msg: config.max_size_per_msg,
            max_inflight_msgs: config.max_inflight_msgs,
            // A leader that loses its quorum steps down; a partitioned node
            // rejoining does not disrupt the term (pre-vote).
            check_quorum: true,
            pre_vote: true,
            ..Default::default()
        };
        raft_config.validate()?;
        let logger = slog::Logger::root(TracingDrain, slog::o!("raft_id" => config.id));
        let raw = RawNode::new(&raft_config, log, &logger)?;
        Ok(Self {
            raw,
            state,
            applied,
            snapshot_interval_entries: config.snapshot_interval_entries,
            snapshot_interval_bytes: config.snapshot_interval_bytes,
            unsynced: None,
            syncing: None,
            held: std::collections::VecDeque::new(),
        })
    }

    pub fn id(&self) -> u64 {
        self.raw.raft.id
    }

    /// Advances the logical clock by one tick.
    pub fn tick(&mut self) {
        self.raw.tick();
    }

    /// Delivers a message from a peer. Raft messages are protobuf (raft-rs's
    /// codec, protobuf 2.28: RUSTSEC-2024-0437, a stack overflow on crafted
    /// input), so the transport decodes them only from authenticated peers.
    pub fn step(&mut self, message: Message) -> Result<(), NodeError> {
        self.raw.step(message).map_err(NodeError::from)
    }

    /// Starts an election now instead of waiting for the election timeout
    /// (a single voter wins it at once: its first `poll` makes it leader).
    pub fn campaign(&mut self) -> Result<(), NodeError> {
        self.raw.campaign().map_err(NodeError::from)
    }

    /// Index of the last entry in the log (committed or not). Right after a
    /// successful `propose` it is the proposed batch's offset.
    pub fn last_index(&self) -> u64 {
        self.raw.raft.raft_log.last_index()
    }

    /// The transport's word on a snapshot message sent to `to`: delivered, or
    /// lost. The leader sends no more entries to that follower until it hears
    /// (raft-rs's contract), so a transport that drops a snapshot must say so.
    pub fn report_snapshot(&mut self, to: u64, delivered: bool) {
        let status = if delivered {
            SnapshotStatus::Finish
        } else {
            SnapshotStatus::Failure
        };
        self.raw.report_snapshot(to, status);
    }

    /// The transport could not reach `to`: the leader goes back to probing it.
    pub fn report_unreachable(&mut self, to: u64) {
        self.raw.report_unreachable(to);
    }

    /// Proposes one batch of records (applied atomically once committed). Only
    /// the leader accepts; elsewhere `NotLeader` names the leader if known.
    pub fn propose(&mut self, records: &[MetadataRecord]) -> Result<(), NodeError> {
        if !self.is_leader() {
            return Err(NodeError::NotLeader {
                leader: self.leader_id(),
            });
        }
        match self.raw.propose(Vec::new(), records::encode_batch(records)) {
            Ok(()) => Ok(()),
            Err(raft::Error::ProposalDropped) => Err(NodeError::NotLeader {
                leader: self.leader_id(),
            }),
            Err(e) => Err(e.into()),
        }
    }

    pub fn is_leader(&self) -> bool {
        self.raw.raft.state == StateRole::Leader
    }

    /// Forgets who leads this term until the leader's next message: raft-rs
    /// then no longer holds its leader lease against a vote request (it
    /// ignores one for a later term while it heard from a leader within the
    /// election timeout). For a leader its followers agree answers too late
    /// (`lag`); the candidate still needs a majority and an up-to-date log.
    pub fn forget_leader(&mut self) {
        if !self.is_leader() {
            self.raw.raft.leader_id = raft::INVALID_ID;
        }
    }

    pub fn leader_id(&self) -> Option<u64> {
        Some(self.raw.raft.leader_id).filter(|id| *id != 0)
    }

    pub fn term(&self) -> u64 {
        self.raw.raft.term
    }

    /// Each voter's id and, on the leader, the highest log index known to
    /// match the leader's (Raft's `matched`); `None` elsewhere.
    pub fn voter_progress(&self) -> Vec<(u64, Option<u64>)> {
        let leader = self.is_leader();
        let mut out: Vec<(u64, Option<u64>)> = self
            .raw
            .raft
            .prs()
            .iter()
            .map(|(id, pr)| {
                let matched = if *id == self.id() {
                    self.last_index()
                } else {
                    pr.matched
                };
                (*id, leader.then_some(matched))
            })
            .collect();
        out.sort_unstable();
        out
    }

    /// The committed metadata, as applied so far.
    pub fn state(&self) -> &ClusterState {
        &self.state
    }

    pub fn applied_offset(&self) -> u64 {
        self.applied
    }

    pub fn commit_index(&self) -> u64 {
        self.raw.raft.raft_log.committed
    }

    pub fn storage(&self) -> &MetadataLog {
        self.raw.store()
    }

    /// Handles everything raft-rs has ready and makes it durable on this
    /// thread: `poll_async`, then `begin_sync` / fdatasync / `end_sync` until
    /// nothing waits. (Tests and tools; the controller service runs the
    /// fdatasync on another thread instead.)
    pub fn poll(&mut self) -> Result<Output, NodeError> {
        let mut out = self.poll_async()?;
        while let Some(ticket) = self.begin_sync()? {
            let result = ticket.sync();
            out.extend(self.end_sync(ticket, result)?);
        }
        Ok(out)
    }

    /// Handles everything raft-rs has ready without waiting for the disk
    /// (see the module docs): what may go out at once is in the output; what
    /// depends on the new writes waits for the sync `begin_sync` starts.
    pub fn poll_async(&mut self) -> Result<Output, NodeError> {
        let mut out = Output::default();
        loop {
            while self.raw.has_ready() {
                self.handle_ready(&mut out)?;
            }
            self.maybe_snapshot()?;
            // Readies that wrote nothing new are durable once every earlier
            // write is: with no sync in flight and nothing buffered, now.
            if self.syncing.is_some() || self.raw.store().has_pending() {
                break;
            }
            let Some(number) = self.unsynced.take() else {
                break;
            };
            self.persisted(number, &mut out);
        }
        Ok(out)
    }

    /// Writes what the readies handled so far buffered and returns the
    /// fdatasync that makes it durable, unless one is already in flight
    /// (one at a time, in order) or nothing waits for one. Hand the result to
    /// `end_sync`.
    pub fn begin_sync(&mut self) -> Result<Option<SyncTicket>, NodeError> {
        if self.syncing.is_some() {
            return Ok(None);
        }
        let Some(number) = self.unsynced else {
            return Ok(None);
        };
        let Some(ticket) = self.raw.mut_store().write_pending()? else {
            return Ok(None);
        };
        self.unsynced = None;
        self.syncing = Some(number);
        Ok(Some(SyncTicket {
            number,
            storage: ticket,
        }))
    }

    /// The fdatasync of `ticket` returned `result`: on success raft-rs learns
    /// what is durable and the messages that waited for it are released; an
    /// error stops the node (its durable state is unknown).
    pub fn end_sync(
        &mut self,
        ticket: SyncTicket,
        result: std::io::Result<()>,
    ) -> Result<Output, NodeError> {
        self.syncing = None;
        self.raw.mut_store().synced(&ticket.storage, result)?;
        let mut out = Output::default();
        self.persisted(ticket.number, &mut out);
        out.extend(self.poll_async()?);
        Ok(out)
    }

    /// Readies up to `number` are durable.
    fn persisted(&mut self, number: u64, out: &mut Output) {
        self.raw.on_persist_ready(number);
        while self.held.front().is_some_and(|(n, _)| *n <= number) {
            if let Some((_, messages)) = self.held.pop_front() {
                out.messages.extend(messages);
            }
        }
    }

    fn handle_ready(&mut self, out: &mut Output) -> Result<(), NodeError> {
        let mut ready = self.raw.ready();
        if !ready.snapshot().is_empty() {
            return self.handle_snapshot_ready(ready, out);
        }
        // The leader's appends go out before its own write is durable
        // (Raft thesis 10.2.1): its entry counts towards the quorum only
        // once `end_sync` reports it persisted.
        out.messages.extend(ready.take_messages());
        // raft-rs hands over committed entries only up to what this node
        // has persisted.
        self.apply(ready.take_committed_entries(), out)?;
        let store = self.raw.mut_store();
        store.append(ready.entries())?;
        if let Some(hs) = ready.hs() {
            store.set_hard_state(hs.clone());
        }
        let number = ready.number();
        // Votes and a follower's acknowledgements wait for the sync. A
        // heartbeat's answer promises nothing about the log or a vote, and
        // holding it would let a slow disk look like a lost follower to the
        // leader's check-quorum: it goes at once.
        let (now, held): (Vec<Message>, Vec<Message>) = ready
            .take_persisted_messages()
            .into_iter()
            .partition(|m| m.get_msg_type() == MessageType::MsgHeartbeatResponse);
        out.messages.extend(now);
        if !held.is_empty() {
            self.held.push_back((number, held));
        }
        self.unsynced = Some(number);
        self.raw.advance_append_async(ready);
        self.raw.advance_apply();
        Ok(())
    }

    /// A snapshot from the leader (rare) is installed synchronously: the log
    /// is rewritten around it, durable, with everything written before.
    fn handle_snapshot_ready(
        &mut self,
        mut ready: raft::Ready,
        out: &mut Output,
    ) -> Result<(), NodeError> {
        let snapshot = ready.snapshot().clone();
        let index = snapshot.get_metadata().index;
        let state = ClusterState::from_snapshot(snapshot.get_data())?;
        self.raw.mut_store().apply_snapshot(snapshot)?;
        self.state = state;
        self.applied = index;
        out.snapshot_installed = Some(index);
        tracing::info!(
            id = self.id(),
            index,
            "installed a metadata snapshot from the leader"
        );
        let store = self.raw.mut_store();
        store.append(ready.entries())?;
        if let Some(hs) = ready.hs() {
            store.set_hard_state(hs.clone());
        }
        store.sync()?;
        // Everything written before is durable now too (the rewrite holds it,
        // and `advance` below tells raft-rs so).
        self.unsynced = None;
        for (_, messages) in self.held.drain(..) {
            out.messages.extend(messages);
        }
        out.messages.extend(ready.take_messages());
        out.messages.extend(ready.take_persisted_messages());
        self.apply(ready.take_committed_entries(), out)?;
        let mut light = self.raw.advance(ready);
        if let Some(commit) = light.commit_index() {
            // Durable with the next sync: the commit index is recoverable from
            // the quorum, so it does not need its own fdatasync.
            self.raw.mut_store().set_commit(commit);
        }
        out.messages.extend(light.take_messages());
        self.apply(light.take_committed_entries(), out)?;
        self.raw.advance_apply();
        Ok(())
    }

    fn apply(
        &mut self,
        entries: Vec<raft::prelude::Entry>,
        out: &mut Output,
    ) -> Result<(), NodeError> {
        for entry in entries {
            if entry.index <= self.applied {
                continue;
            }
            match entry.get_entry_type() {
                EntryType::EntryNormal => {}
                EntryType::EntryConfChange | EntryType::EntryConfChangeV2 => {
                    return Err(NodeError::MembershipChange { index: entry.index });
                }
            }
            self.applied = entry.index;
            // A new leader's first entry is empty.
            if entry.get_data().is_empty() {
                continue;
            }
            let batch = records::decode_batch(entry.get_data())?;
            for (i, e) in self.state.apply_batch(entry.index, &batch) {
                tracing::warn!(offset = entry.index, record = i, error = %e, "metadata record refused");
            }
            out.committed.push(Committed {
                offset: entry.index,
                records: batch,
            });
        }
        Ok(())
    }

    fn maybe_snapshot(&mut self) -> Result<(), NodeError> {
        // The rewrite holds every entry and the hard state, synced: writes
        // not yet covered become durable early (raft-rs hears of it with the
        // next `end_sync`, or at once when nothing is left to write), and a
        // sync of the old file still in flight only covers less.
        let store = self.raw.store();
        let snap_index = store.latest_snapshot().get_metadata().index;
        let entries_due = self.applied >= snap_index + self.snapshot_interval_entries;
        let bytes_due =
            store.log_bytes() >= self.snapshot_interval_bytes && self.applied > snap_index;
        if !entries_due && !bytes_due {
            return Ok(());
        }
        let image = self.state.to_snapshot();
        let applied = self.applied;
        self.raw.mut_store().compact(applied, image)?;
        Ok(())
    }
}

/// Forwards raft-rs's slog records to `tracing` (target `raft`).
struct TracingDrain;

impl slog::Drain for TracingDrain {
    type Ok = ();
    type Err = slog::Never;

    fn log(&self, record: &slog::Record<'_>, _: &slog::OwnedKVList) -> Result<(), slog::Never> {
        macro_rules! forward {
            ($level:ident) => {
                if tracing::enabled!(target: "raft", tracing::Level::$level) {
                    let mut kv = KvText(String::new());
                    let _ = slog::KV::serialize(&record.kv(), record, &mut kv);
                    tracing::event!(target: "raft", tracing::Level::$level, "{}{}", record.msg(), kv.0);
                }
            };
        }
        match record.level() {
            slog::Level::Critical | slog::Level::Error => forward!(ERROR),
            slog::Level::Warning => forward!(WARN),
            slog::Level::Info => forward!(INFO),
            slog::Level::Debug => forward!(DEBUG),
            slog::Level::Trace => forward!(TRACE),
        }
        Ok(())
    }
}

struct KvText(String);

impl slog::Serializer for KvText {
    fn emit_arguments(&mut self, key: slog::Key, val: &std::fmt::Arguments<'_>) -> slog::Result {
        use std::fmt::Write;
        let _ = write!(self.0, " {key}={val}");
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::records::{Config, ConfigResource};

    fn config_record(name: &str, value: &str) -> MetadataRecord {
        MetadataRecord::Config(Config {
            resource: ConfigResource::Cluster,
            name: name.into(),
            value: Some(value.into()),
        })
    }

    #[test]
    fn single_member_elects_itself_commits_and_recovers() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = QuorumConfig::new(1, vec![1]);
        config.snapshot_interval_entries = 5;
        let mut node = QuorumNode::open(dir.path(), &config).unwrap();
        assert!(matches!(
            node.propose(&[config_record("a", "1")]),
            Err(NodeError::NotLeader { leader: None })
        ));
        for _ in 0..config.election_tick_max {
            node.tick();
            node.poll().unwrap();
        }
        assert!(node.is_leader());
        let mut committed = Vec::new();
        for i in 0..12 {
            node.propose(&[config_record(&format!("k{i}"), &i.to_string())])
                .unwrap();
            committed.extend(node.poll().unwrap().committed);
        }
        assert_eq!(committed.len(), 12);
        assert!(committed.windows(2).all(|w| w[0].offset < w[1].offset));
        assert!(node.storage().latest_snapshot().get_metadata().index >= 10);
        let state = node.state().clone();
        let applied = node.applied_offset();
        drop(node);

        let mut node = QuorumNode::open(dir.path(), &config).unwrap();
        for _ in 0..config.election_tick_max {
            node.tick();
            node.poll().unwrap();
        }
        // Everything re-applied, plus the new term's empty leader entry.
        assert_eq!(node.applied_offset(), applied + 1);
        assert_eq!(node.state(), &state);
        assert_eq!(
            node.state().config(&ConfigResource::Cluster, "k11"),
            Some("11")
        );
    }

    #[test]
    fn log_bytes_also_trigger_snapshots() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = QuorumConfig::new(1, vec![1]);
        config.snapshot_interval_bytes = 4096;
        let mut node = QuorumNode::open(dir.path(), &config).unwrap();
        for _ in 0..config.election_tick_max {
            node.tick();
            node.poll().unwrap();
        }
        let big = "x".repeat(1000);
        for i in 0..20 {
            node.propose(&[config_record(&format!("k{i}"), &big)])
                .unwrap();
            node.poll().unwrap();
            assert!(
                node.storage().log_bytes() < 4096 + 2048,
                "log not truncated"
            );
        }
        assert!(node.storage().latest_snapshot().get_metadata().index > 0);
    }

    /// Three members in memory; messages go straight to their target (a
    /// vote request to a member in `lift` first makes it forget its leader,
    /// as the service does when it sees the leader lag).
    /// `ticks` rounds of one tick each (none: one round, no tick).
    fn run_three(nodes: &mut [QuorumNode], lift: &[u64], ticks: usize) {
        for _ in 0..ticks.max(1) {
            let mut messages = Vec::new();
            for node in nodes.iter_mut() {
                if ticks > 0 {
                    node.tick();
                }
                messages.extend(node.poll().unwrap().messages);
            }
            while !messages.is_empty() {
                for m in std::mem::take(&mut messages) {
                    let to = &mut nodes[m.to as usize - 1];
                    let vote = matches!(
                        m.get_msg_type(),
                        raft::prelude::MessageType::MsgRequestPreVote
                            | raft::prelude::MessageType::MsgRequestVote
                    );
                    if vote && lift.contains(&m.to) {
                        to.forget_leader();
                    }
                    let _ = to.step(m);
                }
                for node in nodes.iter_mut() {
                    messages.extend(node.poll().unwrap().messages);
                }
            }
        }
    }

    #[test]
    fn a_follower_replaces_its_leader_only_with_a_voter_that_forgot_it() {
        let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
        let mut nodes: Vec<QuorumNode> = (1..=3u64)
            .map(|id| {
                let config = QuorumConfig::new(id, vec![1, 2, 3]);
                QuorumNode::open(dirs[id as usize - 1].path(), &config).unwrap()
            })
            .collect();
        nodes[0].campaign().unwrap();
        run_three(&mut nodes, &[], 3);
        assert!(nodes[0].is_leader());
        let term = nodes[0].term();

        // Raft's leader lease: the others heard from node 1 within the
        // election timeout, so node 2's election goes nowhere.
        nodes[1].campaign().unwrap();
        run_three(&mut nodes, &[], 3);
        assert!(nodes[0].is_leader());
        assert_eq!(nodes[0].term(), term);
        assert_eq!(nodes[2].leader_id(), Some(1));

        // Node 3 sees the leader lag too and lifts the lease for a vote:
        // node 2 wins the next term (no tick meanwhile: a heartbeat of node
        // 1's arriving first would turn the pre-candidate back into its
        // follower) and node 1 follows it.
        nodes[1].campaign().unwrap();
        run_three(&mut nodes, &[3], 0);
        run_three(&mut nodes, &[], 3);
        assert!(nodes[1].is_leader());
        assert!(nodes[1].term() > term);
        assert!(!nodes[0].is_leader());
        assert_eq!(nodes[0].leader_id(), Some(2));
        assert_eq!(nodes[2].leader_id(), Some(2));

        // A leader never forgets itself.
        nodes[1].forget_leader();
        assert_eq!(nodes[1].leader_id(), Some(2));
    }

    #[test]
    fn bad_config_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            QuorumNode::open(dir.path(), &QuorumConfig::new(4, vec![1, 2, 3])),
            Err(NodeError::Config(_))
        ));
        assert!(matches!(
            QuorumNode::open(dir.path(), &QuorumConfig::new(0, vec![0])),
            Err(NodeError::Config(_))
        ));
    }
}
