//! The controller quorum in one process over a simulated network and clock.
//!
//! Per seed: 3 or 5 `QuorumNode`s with real storage (in /dev/shm when present),
//! a logical clock (one tick per step), a network that drops, delays, duplicates
//! and reorders messages and partitions the nodes, and crashes followed by
//! restarts from storage (sometimes with junk appended to the log, as a torn
//! unsynced write would leave). Clients propose order-sensitive records at
//! whichever node leads. Then the faults stop and the quorum must converge.
//!
//! Checked on every step: at most one leader per term; a committed offset holds
//! the same batch on every node; each node applies offsets in increasing order.
//! At the end: every node applied the same offset and holds the same state, and
//! that state equals a replay of every batch any node ever committed, in offset
//! order (so nothing committed was lost or reordered), and a proposal made after
//! healing commits (liveness).
//!
//! `SKIFF_SIM_SEEDS=N` runs N seeds per test (default 100 per test, 200 in all);
//! `SKIFF_SIM_SEED=S` runs one seed (for debugging a failure).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::PathBuf;

use protobuf::Message as _;
use raft::prelude::{Message, MessageType};
use skiff_controller::decisions::{self, CreateTopic, Heartbeat, Registration};
use skiff_controller::node::{NodeError, Output, QuorumConfig, QuorumNode, SyncTicket};
use skiff_controller::records::{Config, ConfigResource, MetadataRecord, TopicId};
use skiff_controller::state::ClusterState;
use skiff_controller::storage::{LOG_DIR, LOG_FILE};

const FAULT_TICKS: u64 = 1000;
const HEAL_TICKS_MAX: u64 = 3000;
/// Chance per tick (per mille) that a node crashes, and that a partition starts.
const CRASH_PER_MILLE_TICK: u16 = 40;
const PARTITION_PER_MILLE_TICK: u16 = 15;
/// Longest simulated fdatasync, in ticks (async-sync seeds).
const SYNC_DELAY_MAX: u64 = 15;

struct InFlight {
    deliver_at: u64,
    to: usize,
    bytes: Vec<u8>,
}

struct Sim {
    seed: u64,
    rng: fastrand::Rng,
    configs: Vec<QuorumConfig>,
    dirs: Vec<tempfile::TempDir>,
    nodes: Vec<Option<QuorumNode>>,
    /// Restart tick of each crashed node.
    down_until: Vec<u64>,
    /// Highest offset each node applied since its last (re)start.
    applied_seen: Vec<u64>,
    now: u64,
    network: Vec<InFlight>,
    /// Partition group of each node while a partition lasts.
    groups: Option<(Vec<u8>, u64)>,
    leaders: BTreeMap<u64, u64>,
    /// Every committed batch by offset, as first reported by any node.
    committed: BTreeMap<u64, Vec<MetadataRecord>>,
    proposals: u64,
    /// After healing, clients stop once this many proposals were made.
    proposals_quiet_after: u64,
    faults: bool,
    /// Every other seed: each node's fdatasync runs "elsewhere" and returns 0 to
    /// `SYNC_DELAY_MAX` ticks later (`begin_sync` / `end_sync`), while the
    /// node goes on ticking and stepping; the others: `poll` syncs inline.
    async_sync: bool,
    /// The sync in flight per node and the tick it returns at.
    syncing: Vec<Option<(SyncTicket, u64)>>,
    stats: Stats,
}

/// What a run exercised (summed over seeds, asserted non-zero).
#[derive(Debug, Default, Clone, Copy)]
struct Stats {
    terms: u64,
    committed: u64,
    crashes: u64,
    torn_tails: u64,
    /// Crashes that lost what was written but not yet synced (power loss).
    unsynced_lost: u64,
    snapshots_installed: u64,
    partitions: u64,
    topics: u64,
    unfenced_nodes: u64,
}

impl std::ops::AddAssign for Stats {
    fn add_assign(&mut self, o: Stats) {
        self.terms += o.terms;
        self.committed += o.committed;
        self.crashes += o.crashes;
        self.torn_tails += o.torn_tails;
        self.unsynced_lost += o.unsynced_lost;
        self.snapshots_installed += o.snapshots_installed;
        self.partitions += o.partitions;
        self.topics += o.topics;
        self.unfenced_nodes += o.unfenced_nodes;
    }
}

fn scratch_root() -> Option<PathBuf> {
    let shm = PathBuf::from("/dev/shm");
    shm.is_dir().then_some(shm)
}

impl Sim {
    fn new(seed: u64, size: usize) -> Self {
        let mut rng = fastrand::Rng::with_seed(seed);
        let voters: Vec<u64> = (1..=size as u64).collect();
        // Distinct, fixed election timeouts per node: raft-rs randomises within
        // [min, max) with its own thread rng, so a width of 1 keeps runs seeded.
        let mut timeouts: Vec<usize> = (0..size).map(|i| 10 + 3 * i).collect();
        rng.shuffle(&mut timeouts);
        let configs: Vec<QuorumConfig> = voters
            .iter()
            .map(|&id| {
                let mut c = QuorumConfig::new(id, voters.clone());
                c.election_tick_min = timeouts[id as usize - 1];
                c.election_tick_max = c.election_tick_min + 1;
                c.snapshot_interval_entries = 16;
                c.max_inflight_msgs = 8;
                c
            })
            .collect();
        let dirs: Vec<tempfile::TempDir> = (0..size)
            .map(|_| match scratch_root() {
                Some(root) => tempfile::tempdir_in(root).unwrap(),
                None => tempfile::tempdir().unwrap(),
            })
            .collect();
        let nodes = (0..size)
            .map(|i| Some(QuorumNode::open(dirs[i].path(), &configs[i]).unwrap()))
            .collect();
        Sim {
            seed,
            rng,
            configs,
            dirs,
            nodes,
            down_until: vec![0; size],
            applied_seen: vec![0; size],
            now: 0,
            network: Vec::new(),
            groups: None,
            leaders: BTreeMap::new(),
            committed: BTreeMap::new(),
            proposals: 0,
            proposals_quiet_after: u64::MAX,
            faults: true,
            async_sync: (seed / 2) % 2 == 0,
            syncing: (0..size).map(|_| None).collect(),
            stats: Stats::default(),
        }
    }

    fn connected(&self, a: usize, b: usize) -> bool {
        match &self.groups {
            Some((g, _)) => g[a] == g[b],
            None => true,
        }
    }

    fn send(&mut self, from: usize, messages: Vec<Message>) {
        for m in messages {
            let to = m.to as usize - 1;
            let is_snapshot = m.get_msg_type() == MessageType::MsgSnapshot;
            let lost = self.faults && (!self.connected(from, to) || self.rng.u8(..100) < 8);
            if is_snapshot {
                // The transport knows whether a snapshot got through; the
                // simulated one knows at send time.
                let delivered = !lost && self.nodes[to].is_some();
                if let Some(sender) = self.nodes[from].as_mut() {
                    sender.report_snapshot(m.to, delivered);
                }
            }
            if lost {
                continue;
            }
            // Through the wire format, as the real transport will do.
            let bytes = m.write_to_bytes().unwrap();
            let delay = if self.faults { self.rng.u64(0..4) } else { 0 };
            let copies = if self.faults && self.rng.u8(..100) < 3 {
                2
            } else {
                1
            };
            for _ in 0..copies {
                self.network.push(InFlight {
                    deliver_at: self.now + delay,
                    to,
                    bytes: bytes.clone(),
                });
            }
        }
    }

    fn deliver(&mut self) {
        let (due, later): (Vec<InFlight>, Vec<InFlight>) = std::mem::take(&mut self.network)
            .into_iter()
            .partition(|m| m.deliver_at <= self.now);
        self.network = later;
        let mut due = due;
        if self.faults {
            self.rng.shuffle(&mut due);
        }
        for m in due {
            if let Some(node) = self.nodes[m.to].as_mut() {
                let msg = Message::parse_from_bytes(&m.bytes).unwrap();
                node.step(msg).unwrap();
            }
        }
    }

    fn poll_all(&mut self) {
        for i in 0..self.nodes.len() {
            let Some(node) = self.nodes[i].as_mut() else {
                continue;
            };
            let out = if self.async_sync {
                let mut out = Output::default();
                if self.syncing[i]
                    .as_ref()
                    .is_some_and(|(_, at)| *at <= self.now)
                {
                    if let Some((ticket, _)) = self.syncing[i].take() {
                        let result = ticket.sync();
                        out.extend(node.end_sync(ticket, result).unwrap_or_else(|e| {
                            panic!("seed {}: node {} end_sync: {e}", self.seed, i + 1)
                        }));
                    }
                }
                out.extend(node.poll_async().unwrap_or_else(|e| {
                    panic!("seed {}: node {} poll_async: {e}", self.seed, i + 1)
                }));
                if self.syncing[i].is_none() {
                    let ticket = node.begin_sync().unwrap_or_else(|e| {
                        panic!("seed {}: node {} begin_sync: {e}", self.seed, i + 1)
                    });
                    if let Some(ticket) = ticket {
                        let delay = if self.faults {
                            self.rng.u64(0..=SYNC_DELAY_MAX)
                        } else {
                            0
                        };
                        self.syncing[i] = Some((ticket, self.now + delay));
                    }
                }
                out
            } else {
                node.poll()
                    .unwrap_or_else(|e| panic!("seed {}: node {} poll: {e}", self.seed, i + 1))
            };
            if node.is_leader() {
                let leader = self.leaders.entry(node.term()).or_insert(node.id());
                assert_eq!(
                    *leader,
                    node.id(),
                    "seed {}: two leaders in term {}",
                    self.seed,
                    node.term()
                );
            }
            if let Some(index) = out.snapshot_installed {
                self.stats.snapshots_installed += 1;
                self.applied_seen[i] = self.applied_seen[i].max(index);
            }
            for c in &out.committed {
                assert!(
                    c.offset > self.applied_seen[i],
                    "seed {}: node {} applied {} after {}",
                    self.seed,
                    i + 1,
                    c.offset,
                    self.applied_seen[i]
                );
                self.applied_seen[i] = c.offset;
                match self.committed.get(&c.offset) {
                    Some(batch) => assert_eq!(
                        batch,
                        &c.records,
                        "seed {}: node {} committed a different batch at {}",
                        self.seed,
                        i + 1,
                        c.offset
                    ),
                    None => {
                        self.committed.insert(c.offset, c.records.clone());
                    }
                }
            }
            self.send(i, out.messages);
        }
    }

    fn leader(&self) -> Option<usize> {
        // The highest-term live leader (an old one may not know it was deposed).
        (0..self.nodes.len())
            .filter(|&i| self.nodes[i].as_ref().is_some_and(|n| n.is_leader()))
            .max_by_key(|&i| self.nodes[i].as_ref().map_or(0, |n| n.term()))
    }

    fn propose(&mut self) {
        let Some(i) = self.leader() else { return };
        self.proposals += 1;
        let seq = self.proposals;
        let node = self.nodes[i].as_mut().unwrap();
        let records = decide(node, seq, self.now).unwrap_or_else(|| {
            // Order-sensitive: later values overwrite earlier ones.
            vec![MetadataRecord::Config(Config {
                resource: ConfigResource::Cluster,
                name: format!("k{}", seq % 7),
                value: Some(seq.to_string()),
            })]
        });
        match node.propose(&records) {
            Ok(()) | Err(NodeError::NotLeader { .. }) => {}
            Err(e) => panic!("seed {}: propose: {e}", self.seed),
        }
    }

    fn crash_and_restart(&mut self) {
        for i in 0..self.nodes.len() {
            if self.nodes[i].is_none() && self.now >= self.down_until[i] {
                self.nodes[i] = Some(
                    QuorumNode::open(self.dirs[i].path(), &self.configs[i]).unwrap_or_else(|e| {
                        panic!("seed {}: node {} restart: {e}", self.seed, i + 1)
                    }),
                );
                self.applied_seen[i] = 0;
            }
        }
        if !self.faults || self.rng.u16(..1000) >= CRASH_PER_MILLE_TICK {
            return;
        }
        let i = self.rng.usize(..self.nodes.len());
        if let Some(node) = self.nodes[i].take() {
            self.stats.crashes += 1;
            if let Some((ticket, _)) = self.syncing[i].take() {
                // The sync in flight had written its frames, or not yet.
                if self.rng.bool() {
                    ticket.write_unsynced().unwrap();
                }
            }
            let synced = node.storage().synced_bytes();
            drop(node);
            let path = self.dirs[i].path().join(LOG_DIR).join(LOG_FILE);
            let written = std::fs::metadata(&path).map_or(0, |m| m.len());
            if written > synced && self.rng.bool() {
                // Power lost: nothing written after the last completed
                // fdatasync reached the disk (a sync in flight included).
                self.stats.unsynced_lost += 1;
                let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
                f.set_len(synced).unwrap();
            }
            self.down_until[i] = self.now + self.rng.u64(5..60);
            self.network.retain(|m| m.to != i);
            if self.rng.bool() {
                // A write that never synced: junk after the last commit marker.
                self.stats.torn_tails += 1;
                let path = self.dirs[i].path().join(LOG_DIR).join(LOG_FILE);
                let junk: Vec<u8> = (0..self.rng.usize(1..200))
                    .map(|_| self.rng.u8(..))
                    .collect();
                let mut bytes = std::fs::read(&path).unwrap();
                bytes.extend_from_slice(&junk);
                std::fs::write(&path, bytes).unwrap();
            }
        }
    }

    fn partitions(&mut self) {
        if let Some((_, until)) = &self.groups {
            if self.now >= *until || !self.faults {
                self.groups = None;
            }
            return;
        }
        if self.faults && self.rng.u16(..1000) < PARTITION_PER_MILLE_TICK {
            let groups = (0..self.nodes.len()).map(|_| self.rng.u8(..2)).collect();
            self.groups = Some((groups, self.now + self.rng.u64(10..120)));
            self.stats.partitions += 1;
        }
    }

    fn step(&mut self) {
        self.now += 1;
        self.partitions();
        self.crash_and_restart();
        for node in self.nodes.iter_mut().flatten() {
            node.tick();
        }
        self.deliver();
        let quiet = !self.faults && self.proposals >= self.proposals_quiet_after;
        if self.rng.u8(..100) < 30 && !quiet {
            self.propose();
        }
        self.poll_all();
    }

    fn run(mut self) -> Stats {
        for _ in 0..FAULT_TICKS {
            self.step();
        }
        // Heal: no drops, delays, partitions or crashes; everyone restarts.
        self.faults = false;
        for i in 0..self.nodes.len() {
            self.down_until[i] = 0;
        }
        let proposals_at_heal = self.proposals;
        self.proposals_quiet_after = proposals_at_heal + 5;
        let committed_at_heal = self.committed.keys().next_back().copied().unwrap_or(0);
        let mut converged = false;
        for _ in 0..HEAL_TICKS_MAX {
            self.step();
            if self.proposals >= self.proposals_quiet_after && self.converged(committed_at_heal) {
                converged = true;
                break;
            }
        }
        assert!(
            converged,
            "seed {}: no convergence after healing: applied {:?}",
            self.seed,
            self.nodes
                .iter()
                .map(|n| n.as_ref().map(|n| n.applied_offset()))
                .collect::<Vec<_>>()
        );
        let state = self.check_final_state();
        self.stats.topics = state.topics().count() as u64;
        self.stats.unfenced_nodes = state.nodes().filter(|n| !n.fenced).count() as u64;
        self.stats.terms = self.leaders.len() as u64;
        self.stats.committed = self.committed.len() as u64;
        self.stats
    }

    fn converged(&self, committed_at_heal: u64) -> bool {
        let Some(leader) = self.leader() else {
            return false;
        };
        let leader = self.nodes[leader].as_ref().unwrap();
        let target = leader.commit_index();
        target > committed_at_heal
            && self
                .committed
                .keys()
                .next_back()
                .is_some_and(|&o| o > committed_at_heal)
            && self
                .nodes
                .iter()
                .all(|n| n.as_ref().is_some_and(|n| n.applied_offset() == target))
    }

    fn check_final_state(&self) -> ClusterState {
        let mut replay = ClusterState::new();
        for (offset, batch) in &self.committed {
            replay.apply_batch(*offset, batch);
        }
        for (i, node) in self.nodes.iter().enumerate() {
            let node = node.as_ref().unwrap();
            assert_eq!(
                node.state(),
                &replay,
                "seed {}: node {} state differs from the committed log's replay",
                self.seed,
                i + 1
            );
        }
        for (t, i, p) in replay.partitions() {
            p.check()
                .unwrap_or_else(|e| panic!("seed {}: partition {t}-{i}: {e}", self.seed));
        }
        replay
    }
}

/// Real controller decisions made from the leader's applied state: nodes
/// register, heartbeat (and so get unfenced), topics are created. Decisions made
/// from the same state before the first one commits can conflict (two
/// registrations with one epoch); the state machine refuses the later one on
/// every node alike, which the final comparison checks. `None`: no decision
/// this time (the caller proposes a plain config record).
fn decide(node: &QuorumNode, seq: u64, now: u64) -> Option<Vec<MetadataRecord>> {
    let state = node.state();
    let config = decisions::ControllerConfig::default();
    let node_id = (seq % 7) as i32 + 1;
    match seq % 10 {
        0 | 5 => {
            let registration = Registration {
                node_id,
                incarnation_id: [(seq % 3) as u8; 16],
                endpoints: vec![],
                rack: Some(format!("rack-{}", node_id % 3)),
            };
            decisions::register(state, &registration, &config)
                .ok()
                .map(|(records, _)| records)
        }
        1 | 6 => {
            let heartbeat = Heartbeat {
                node_id,
                broker_epoch: state.node(node_id)?.broker_epoch,
                metadata_offset: node.applied_offset(),
                want_fence: false,
                want_shutdown: seq % 20 == 1,
                offline_partitions: Vec::new(),
            };
            let mut sessions = decisions::Sessions::new();
            decisions::heartbeat(state, &mut sessions, &heartbeat, now, &config).ok()
        }
        3 => {
            let eligible = state.nodes().filter(|n| n.is_eligible()).count();
            let request = CreateTopic {
                name: format!("t{seq}"),
                topic_id: TopicId((u128::from(seq) << 8).to_le_bytes()),
                partitions: 3,
                replication_factor: eligible.min(3) as i16,
                configs: vec![],
                start_index: seq as usize,
            };
            decisions::create_topic(state, &request).ok()
        }
        _ => None,
    }
}

fn seeds(default: u64) -> Vec<u64> {
    if let Some(seed) = std::env::var("SKIFF_SIM_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        return vec![seed];
    }
    let n = std::env::var("SKIFF_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default);
    (0..n).collect()
}

fn run_seeds(size: usize, salt: u64) {
    let started = std::time::Instant::now();
    let seeds = seeds(100);
    let mut total = Stats::default();
    for &seed in &seeds {
        total += Sim::new(seed * 2 + salt, size).run();
    }
    eprintln!(
        "{size} controllers, {} seeds in {:?}: {total:?}",
        seeds.len(),
        started.elapsed()
    );
    // The faults happened and the recovery paths ran (over all seeds).
    if seeds.len() >= 20 {
        assert!(total.terms > seeds.len() as u64, "{total:?}");
        assert!(total.crashes > 0 && total.torn_tails > 0, "{total:?}");
        assert!(total.unsynced_lost > 0, "{total:?}");
        assert!(total.snapshots_installed > 0, "{total:?}");
        assert!(total.partitions > 0, "{total:?}");
        assert!(total.topics > 0 && total.unfenced_nodes > 0, "{total:?}");
    }
}

#[test]
fn three_controllers_under_faults() {
    run_seeds(3, 0);
}

#[test]
fn five_controllers_under_faults() {
    run_seeds(5, 1);
}
