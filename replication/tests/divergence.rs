//! A model of one partition on three replicas under leader changes with
//! in-flight appends (issue 19): the rules of `skiff-replication` drive every
//! replica, a model controller elects leaders from the ISR and commits ISR
//! changes, and random steps pause, resume, crash and fence nodes while
//! producers send writes to whichever node believes it leads and retry the
//! unacknowledged ones, in another order, to the next.
//!
//! What a node knows is its own: a node learns the controller's decisions
//! only at a `Learn` step, so a paused leader resumes believing it still
//! leads, appends, and answers fetches of followers that have not learned
//! either. That is the timing that lost acknowledged writes.
//!
//! Checked after every step: every acknowledged write is, at its acknowledged
//! offset, in the log of every member of the controller's ISR (so any leader
//! it elects has it, and the ISR members agree wherever a write was
//! acknowledged).
//!
//! At the end, after everyone resumes and learns and followers fetch until
//! nothing moves, every replica's log is the leader's, batch for batch.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;

use proptest::prelude::*;
use skiff_replication::{
    check_fetched_batch, end_offset_for_epoch, FetchedBatch, FollowerFetch, FollowerReplica,
    IsrChange, LeaderConfig, LeaderReplica, LocalLog, NextFetch, NodeId,
};

const NODES: [NodeId; 3] = [1, 2, 3];
const MIN_ISR: usize = 2;
const LAG_MS: u64 = 1_000;

#[derive(Clone, Debug, PartialEq, Eq)]
struct Batch {
    base: i64,
    records: i64,
    epoch: i32,
    /// The producer's write id.
    value: u64,
}

impl Batch {
    fn next(&self) -> i64 {
        self.base + self.records
    }
}

/// What a node believes it is.
enum Role {
    None,
    Leader(Box<LeaderReplica>),
    Follower(FollowerReplica),
}

struct Replica {
    id: NodeId,
    batches: Vec<Batch>,
    /// The engine's leader-epoch cache: (epoch, start offset), ascending.
    epochs: Vec<(i32, i64)>,
    durable: i64,
    hw: i64,
    paused: bool,
    role: Role,
}

impl Replica {
    fn leo(&self) -> i64 {
        self.batches.last().map_or(0, Batch::next)
    }

    fn latest_epoch(&self) -> Option<i32> {
        self.epochs.last().map(|e| e.0)
    }

    fn local(&self) -> LocalLog {
        LocalLog {
            log_start_offset: 0,
            log_end_offset: self.leo(),
            durable_end_offset: self.durable,
            latest_epoch: self.latest_epoch(),
        }
    }

    /// The engine's `LeaderEpochCache::assign`.
    fn assign_epoch(&mut self, epoch: i32, start: i64) {
        if self.latest_epoch().is_some_and(|e| epoch <= e) {
            return;
        }
        while self.epochs.last().is_some_and(|e| e.1 >= start) {
            self.epochs.pop();
        }
        self.epochs.push((epoch, start));
    }

    fn append(&mut self, batch: Batch) {
        assert!(batch.base >= self.leo(), "append below the log end");
        self.assign_epoch(batch.epoch, batch.base);
        self.batches.push(batch);
    }

    /// The engine's `truncate_to`: cut at the start of the batch holding
    /// `offset`, the epoch cache from the new end.
    fn truncate_to(&mut self, offset: i64) {
        self.batches.retain(|b| b.next() <= offset);
        let leo = self.leo();
        self.epochs.retain(|e| e.1 < leo);
        self.durable = self.durable.min(leo);
        self.hw = self.hw.min(leo);
    }

    fn value_at(&self, offset: i64) -> Option<u64> {
        self.batches
            .iter()
            .find(|b| b.base <= offset && offset < b.next())
            .map(|b| b.value)
    }
}

struct Controller {
    leader: NodeId,
    leader_epoch: i32,
    partition_epoch: i32,
    isr: Vec<NodeId>,
}

/// A write a leader appended and has not answered yet.
struct Request {
    value: u64,
    node: NodeId,
    epoch: i32,
    offset: i64,
}

#[derive(Clone, Debug)]
enum Op {
    /// A new write (or, with `retry`, an unacknowledged one again) to the
    /// `pick`th node that believes it leads.
    Produce {
        pick: usize,
        retry: bool,
    },
    Fetch {
        node: usize,
    },
    Flush {
        node: usize,
    },
    Tick {
        ms: u64,
    },
    Shrink {
        node: usize,
    },
    Pause {
        node: usize,
    },
    Resume {
        node: usize,
    },
    /// The controller fences the current leader (its session expired).
    Fence,
    Learn {
        node: usize,
    },
    /// SIGKILL and restart: the unflushed tail is gone; the controller fences
    /// the old incarnation.
    Crash {
        node: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0usize..3, any::<bool>()).prop_map(|(pick, retry)| Op::Produce { pick, retry }),
        12 => (0usize..3).prop_map(|node| Op::Fetch { node }),
        5 => (0usize..3).prop_map(|node| Op::Flush { node }),
        2 => (0u64..1_500).prop_map(|ms| Op::Tick { ms }),
        1 => (0usize..3).prop_map(|node| Op::Shrink { node }),
        1 => (0usize..3).prop_map(|node| Op::Pause { node }),
        3 => (0usize..3).prop_map(|node| Op::Resume { node }),
        1 => Just(Op::Fence),
        4 => (0usize..3).prop_map(|node| Op::Learn { node }),
        1 => (0usize..3).prop_map(|node| Op::Crash { node }),
    ]
}

struct Model {
    replicas: Vec<Replica>,
    controller: Controller,
    requests: Vec<Request>,
    /// value -> acknowledged offset.
    acked: BTreeMap<u64, i64>,
    /// Written and not acknowledged: what producers retry.
    unacked: Vec<u64>,
    next_value: u64,
    now_ms: u64,
}

impl Model {
    fn new() -> Self {
        let mut m = Self {
            replicas: NODES
                .iter()
                .map(|&id| Replica {
                    id,
                    batches: Vec::new(),
                    epochs: Vec::new(),
                    durable: 0,
                    hw: 0,
                    paused: false,
                    role: Role::None,
                })
                .collect(),
            controller: Controller {
                leader: 1,
                leader_epoch: 0,
                partition_epoch: 0,
                isr: NODES.to_vec(),
            },
            requests: Vec::new(),
            acked: BTreeMap::new(),
            unacked: Vec::new(),
            next_value: 1,
            now_ms: 0,
        };
        for i in 0..3 {
            m.learn(i);
        }
        m
    }

    fn index(id: NodeId) -> usize {
        NODES.iter().position(|n| *n == id).unwrap()
    }

    fn step(&mut self, op: &Op) {
        match *op {
            Op::Produce { pick, retry } => self.produce(pick, retry),
            Op::Fetch { node } => self.fetch(node),
            Op::Flush { node } => self.flush(node),
            Op::Tick { ms } => self.now_ms += ms,
            Op::Shrink { node } => self.shrink(node),
            Op::Pause { node } => self.replicas[node].paused = true,
            Op::Resume { node } => self.replicas[node].paused = false,
            Op::Fence => {
                let leader = self.controller.leader;
                self.fence(leader);
            }
            Op::Learn { node } => {
                if !self.replicas[node].paused {
                    self.learn(node);
                }
            }
            Op::Crash { node } => self.crash(node),
        }
    }

    fn produce(&mut self, pick: usize, retry: bool) {
        let leaders: Vec<usize> = (0..3)
            .filter(|i| {
                let r = &self.replicas[*i];
                !r.paused && matches!(r.role, Role::Leader(_))
            })
            .collect();
        let Some(&i) = leaders.get(pick % leaders.len().max(1)) else {
            return;
        };
        let value = if retry && !self.unacked.is_empty() {
            // Retried in another order than first sent.
            self.unacked.remove(pick % self.unacked.len())
        } else {
            self.next_value += 1;
            self.next_value
        };
        let r = &mut self.replicas[i];
        let Role::Leader(l) = &r.role else { return };
        if l.check_acks_all().is_err() {
            self.unacked.push(value);
            return;
        }
        let epoch = l.leader_epoch();
        let batch = Batch {
            base: r.leo(),
            records: 1 + (value % 3) as i64,
            epoch,
            value,
        };
        let offset = batch.base;
        r.append(batch);
        self.requests.push(Request {
            value,
            node: r.id,
            epoch,
            offset,
        });
    }

    fn flush(&mut self, i: usize) {
        let r = &mut self.replicas[i];
        if r.paused {
            return;
        }
        r.durable = r.leo();
        let durable = r.durable;
        if let Role::Leader(l) = &mut r.role {
            l.on_local_durable(durable);
        }
        self.answer_requests(i);
    }

    /// One fetch round of follower `i` with the node it believes leads.
    fn fetch(&mut self, i: usize) {
        let (leader_id, leader_epoch) = match &self.replicas[i].role {
            Role::Follower(f) => (f.leader(), f.leader_epoch()),
            _ => return,
        };
        let li = Self::index(leader_id);
        if self.replicas[i].paused || self.replicas[li].paused {
            return;
        }
        // The follower's side before sending.
        let position = loop {
            let r = &mut self.replicas[i];
            let local = r.local();
            let Role::Follower(f) = &mut r.role else {
                return;
            };
            match f.next_fetch(local) {
                NextFetch::TruncateToHighWatermark => {
                    f.on_truncated_to_high_watermark();
                    let hw = r.hw;
                    r.truncate_to(hw);
                }
                NextFetch::FlushTo(end) => r.durable = end,
                NextFetch::Fetch(p) => {
                    f.on_sent(p);
                    break p;
                }
            }
        };
        // The leader's side.
        let leader = &mut self.replicas[li];
        let leader_leo = leader.leo();
        let epoch_end =
            end_offset_for_epoch(&leader.epochs, leader_leo, position.last_fetched_epoch);
        let Role::Leader(l) = &mut leader.role else {
            return;
        };
        let fetch = FollowerFetch {
            follower: NODES[i],
            fetch_offset: position.fetch_offset,
            last_fetched_epoch: position.last_fetched_epoch,
            current_leader_epoch: leader_epoch,
        };
        let Ok(outcome) = l.on_follower_fetch(fetch, epoch_end, leader_leo, self.now_ms) else {
            return; // fenced, unknown epoch, out of range: the follower retries later
        };
        let leader_hw = l.high_watermark();
        let batches: Vec<Batch> = leader
            .batches
            .iter()
            .filter(|b| b.next() > position.fetch_offset)
            .cloned()
            .collect();
        if let Some(change) = outcome.expand {
            self.alter_partition(li, change);
        }
        self.answer_requests(li);

        // The follower applies the answer.
        let r = &mut self.replicas[i];
        let leo = r.leo();
        let Role::Follower(f) = &mut r.role else {
            return;
        };
        let Some(sent) = f.on_response(leo) else {
            return;
        };
        if let Some(diverging) = outcome.diverging {
            let cut = f.on_diverging(sent, &r.epochs, leo, diverging, r.hw);
            r.truncate_to(cut);
            return;
        }
        let mut fetched_for = sent.fetch_offset;
        for b in batches {
            match check_fetched_batch(fetched_for, 0, r.leo(), b.base, b.next()) {
                Ok(FetchedBatch::Append) => {
                    r.append(b);
                    fetched_for = r.leo();
                }
                Ok(FetchedBatch::StartOverAt(_)) => unreachable!("the log start never moves"),
                Ok(FetchedBatch::Stale) => unreachable!("nothing else cuts the log meanwhile"),
                Err(e) => panic!("node {}: {e}", r.id),
            }
        }
        r.durable = r.leo();
        r.hw = leader_hw.min(r.durable);
    }

    fn shrink(&mut self, i: usize) {
        if self.replicas[i].paused {
            return;
        }
        let now = self.now_ms;
        let Role::Leader(l) = &mut self.replicas[i].role else {
            return;
        };
        if let Some(change) = l.maybe_shrink(now) {
            self.alter_partition(i, change);
        }
    }

    /// AlterPartition from node `i`: committed if its epochs are current.
    fn alter_partition(&mut self, i: usize, change: IsrChange) {
        let c = &mut self.controller;
        let Role::Leader(l) = &mut self.replicas[i].role else {
            return;
        };
        let current = c.leader == NODES[i]
            && change.leader_epoch == c.leader_epoch
            && change.partition_epoch == c.partition_epoch;
        if current {
            c.isr = change.new_isr;
            c.partition_epoch += 1;
            l.on_isr_committed(c.isr.clone(), c.partition_epoch)
                .unwrap();
        } else {
            l.on_isr_change_failed();
        }
        self.answer_requests(i);
    }

    /// Waiters of node `i` whose offset its high watermark covers are
    /// acknowledged (acks=all: the ISR still at least min.insync.replicas).
    fn answer_requests(&mut self, i: usize) {
        let r = &self.replicas[i];
        let Role::Leader(l) = &r.role else { return };
        let hw = l.high_watermark();
        let after = l.check_after_append().is_ok();
        let epoch = l.leader_epoch();
        let (done, waiting): (Vec<Request>, Vec<Request>) = self
            .requests
            .drain(..)
            .partition(|q| q.node == r.id && q.epoch == epoch && q.offset < hw);
        self.requests = waiting;
        for q in done {
            if after {
                assert_eq!(r.value_at(q.offset), Some(q.value));
                let old = self.acked.insert(q.value, q.offset);
                assert_eq!(old, None, "write {} acknowledged twice", q.value);
            } else {
                self.unacked.push(q.value);
            }
        }
    }

    /// Node `i` adopts the controller's current decisions.
    fn learn(&mut self, i: usize) {
        let c = &self.controller;
        let (leader, leader_epoch, isr, partition_epoch) =
            (c.leader, c.leader_epoch, c.isr.clone(), c.partition_epoch);
        let r = &mut self.replicas[i];
        if leader == r.id {
            if let Role::Leader(l) = &mut r.role {
                if l.leader_epoch() == leader_epoch {
                    l.on_isr_committed(isr, partition_epoch).unwrap();
                    self.answer_requests(i);
                    return;
                }
            }
            // Kafka's makeLeader: the new epoch starts at the log end.
            let leo = r.leo();
            r.assign_epoch(leader_epoch, leo);
            let mut state = LeaderReplica::new(
                r.id,
                NODES.to_vec(),
                isr,
                leader_epoch,
                partition_epoch,
                r.durable,
                r.hw,
                self.now_ms,
                LeaderConfig {
                    replica_lag_time_max_ms: LAG_MS,
                    min_insync_replicas: MIN_ISR,
                },
            )
            .with_epoch_start_offset(leo);
            state.on_local_durable(r.durable);
            r.role = Role::Leader(Box::new(state));
        } else {
            if let Role::Follower(f) = &r.role {
                if f.leader() == leader && f.leader_epoch() == leader_epoch {
                    return;
                }
            }
            r.role = Role::Follower(FollowerReplica::new(leader, leader_epoch, r.local()));
        }
        // Requests this node took as a leader of another epoch fail.
        let id = r.id;
        let (failed, rest): (Vec<Request>, Vec<Request>) = self
            .requests
            .drain(..)
            .partition(|q| q.node == id && q.epoch != leader_epoch);
        self.requests = rest;
        self.unacked.extend(failed.into_iter().map(|q| q.value));
    }

    /// The controller fences `node`: out of every ISR that has others; if it
    /// led, the first other ISR member leads at a new epoch.
    fn fence(&mut self, node: NodeId) {
        let c = &mut self.controller;
        if !c.isr.contains(&node) || c.isr.len() == 1 {
            return;
        }
        c.isr.retain(|n| *n != node);
        c.partition_epoch += 1;
        if c.leader == node {
            c.leader = c.isr[0];
            c.leader_epoch += 1;
        }
    }

    fn crash(&mut self, i: usize) {
        let id = NODES[i];
        self.fence(id);
        let c = &mut self.controller;
        if c.leader == id {
            // The only ISR member: offline until it is back, then it leads
            // again at a new epoch (a new incarnation never reuses an epoch).
            c.leader_epoch += 1;
            c.partition_epoch += 1;
        }
        let r = &mut self.replicas[i];
        let durable = r.durable;
        r.truncate_to(durable);
        r.role = Role::None;
        r.paused = false;
        let (failed, rest): (Vec<Request>, Vec<Request>) =
            self.requests.drain(..).partition(|q| q.node == id);
        self.requests = rest;
        self.unacked.extend(failed.into_iter().map(|q| q.value));
    }

    fn check(&self) {
        for (value, offset) in &self.acked {
            for id in &self.controller.isr {
                let r = &self.replicas[Self::index(*id)];
                assert_eq!(
                    r.value_at(*offset),
                    Some(*value),
                    "acknowledged write {value} at {offset} is not on ISR member {id}: {:?}",
                    r.batches
                );
            }
        }
    }

    /// Everyone resumes and learns; followers fetch until nothing moves.
    fn heal(&mut self) {
        for i in 0..3 {
            self.replicas[i].paused = false;
            self.learn(i);
        }
        for _ in 0..20 {
            for i in 0..3 {
                self.flush(i);
                self.fetch(i);
            }
        }
        let leader = &self.replicas[Self::index(self.controller.leader)];
        for r in &self.replicas {
            assert_eq!(
                r.batches, leader.batches,
                "node {} did not converge to leader {}",
                r.id, leader.id
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn logs_converge_and_acknowledged_writes_stay(ops in proptest::collection::vec(op(), 1..250)) {
        let mut model = Model::new();
        for op in &ops {
            model.step(op);
            model.check();
        }
        model.heal();
        model.check();
    }
}

/// The sequence of issue 19, step by step: node 3 leads epoch 0 and appends
/// writes nobody copied; it is paused; node 1 leads epoch 1 and takes the
/// retried writes in another order, to the same log end; node 3 resumes,
/// learns it follows, and must cut its tail before it is admitted to the ISR.
#[test]
fn issue_19_resumed_leader_with_equal_log_end() {
    let mut m = Model::new();
    // Node 3 leads epoch 1 (after a first fence of node 1 and its return).
    m.fence(1);
    m.fence(2);
    assert_eq!(m.controller.leader, 3, "{:?}", m.controller.isr);
    m.controller.isr = NODES.to_vec();
    m.controller.partition_epoch += 1;
    for i in 0..3 {
        m.learn(i);
    }
    for _ in 0..4 {
        m.step(&Op::Produce {
            pick: 0,
            retry: false,
        });
        m.flush(2);
        m.fetch(0);
        m.fetch(1);
        m.flush(2);
    }
    for _ in 0..2 {
        m.fetch(0);
        m.fetch(1);
        m.flush(2);
    }
    assert!(m.requests.is_empty() && m.unacked.is_empty());
    assert_eq!(m.acked.len(), 4);
    // Writes on node 3 only, unflushed, then paused.
    for _ in 0..3 {
        m.step(&Op::Produce {
            pick: 0,
            retry: false,
        });
    }
    m.replicas[2].paused = true;
    let tail_end = m.replicas[2].leo();
    m.fence(3);
    m.learn(0);
    m.learn(1);
    // The producers retry to the new leader in another order.
    while !m.unacked.is_empty() || m.requests.iter().any(|q| q.node == 3) {
        if m.unacked.is_empty() {
            // Node 3's requests time out at the producers.
            let (failed, rest): (Vec<Request>, Vec<Request>) =
                m.requests.drain(..).partition(|q| q.node == 3);
            m.requests = rest;
            m.unacked.extend(failed.iter().rev().map(|q| q.value));
        }
        m.step(&Op::Produce {
            pick: 0,
            retry: true,
        });
    }
    m.flush(0);
    m.fetch(1);
    m.flush(0);
    m.check();
    // Same log end as the paused node (the retried writes, other order).
    let new_leader_end = m.replicas[0].leo();
    assert_eq!(
        new_leader_end, tail_end,
        "the scenario wants equal log ends"
    );
    assert_ne!(m.replicas[0].batches, m.replicas[2].batches);
    // The new leader takes on new writes meanwhile.
    m.step(&Op::Produce {
        pick: 0,
        retry: false,
    });
    m.flush(0);
    m.fetch(1);
    // Node 3 resumes and learns it follows node 1.
    m.replicas[2].paused = false;
    m.learn(2);
    for _ in 0..5 {
        m.fetch(2);
        m.check();
    }
    assert_eq!(m.replicas[2].batches, m.replicas[0].batches);
    assert!(m.controller.isr.contains(&3), "rejoined once truncated");
}
