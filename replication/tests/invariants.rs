//! Property test of the leader's rules: random appends, durability, follower
//! fetches (followers only move forward), time, ISR shrinks and expansions
//! committed or refused, and ISR removals by the controller. After every step:
//! the high watermark never decreases, is never above the leader's durable log
//! end nor above the log end of any maximal-ISR member, the leader stays in its
//! ISR, the maximal ISR is the committed ISR plus the pending change, and
//! released acks=all waiters are all covered by the high watermark (and none
//! covered is left waiting).

#![allow(clippy::unwrap_used)]

use proptest::prelude::*;
use skiff_replication::{
    AckWaiters, FollowerFetch, LeaderConfig, LeaderReplica, NodeId, UNKNOWN_OFFSET,
};

const LEADER: NodeId = 1;
const FOLLOWERS: [NodeId; 3] = [2, 3, 4];

#[derive(Debug, Clone)]
enum Op {
    Append { records: i64, acks_all: bool },
    Durable,
    Fetch { follower: usize, percent: i64 },
    Tick { ms: u64 },
    CommitPending,
    FailPending,
    ControllerRemoves { follower: usize },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (1i64..5, any::<bool>()).prop_map(|(records, acks_all)| Op::Append { records, acks_all }),
        2 => Just(Op::Durable),
        5 => (0usize..3, 0i64..=100).prop_map(|(follower, percent)| Op::Fetch { follower, percent }),
        2 => (0u64..8_000).prop_map(|ms| Op::Tick { ms }),
        2 => Just(Op::CommitPending),
        1 => Just(Op::FailPending),
        1 => (0usize..3).prop_map(|follower| Op::ControllerRemoves { follower }),
    ]
}

/// A fetch at `offset` with no epoch to check, at the leader's epoch.
fn at(follower: NodeId, offset: i64) -> FollowerFetch {
    FollowerFetch {
        follower,
        fetch_offset: offset,
        last_fetched_epoch: -1,
        current_leader_epoch: 1,
    }
}

struct Model {
    leader: LeaderReplica,
    waiters: AckWaiters<i64>,
    log_end: i64,
    durable: i64,
    /// What each follower really holds (`-1`: has not fetched).
    follower_leo: [i64; 3],
    now_ms: u64,
    hw: i64,
}

impl Model {
    fn new() -> Self {
        let config = LeaderConfig {
            replica_lag_time_max_ms: 10_000,
            min_insync_replicas: 2,
        };
        Self {
            leader: LeaderReplica::new(
                LEADER,
                vec![1, 2, 3, 4],
                vec![1, 2, 3],
                1,
                1,
                0,
                0,
                0,
                config,
            ),
            waiters: AckWaiters::new(100_000),
            log_end: 0,
            durable: 0,
            follower_leo: [UNKNOWN_OFFSET; 3],
            now_ms: 0,
            hw: 0,
        }
    }

    fn step(&mut self, op: &Op) {
        match *op {
            Op::Append { records, acks_all } => {
                if acks_all && self.leader.check_acks_all().is_err() {
                    return;
                }
                self.log_end += records;
                if acks_all {
                    self.waiters.push(self.log_end, self.log_end).unwrap();
                }
            }
            Op::Durable => {
                self.durable = self.log_end;
                self.leader.on_local_durable(self.durable);
            }
            Op::Fetch { follower, percent } => {
                let from = self.follower_leo[follower].max(0);
                let offset = from + (self.log_end - from) * percent / 100;
                let out = self
                    .leader
                    .on_follower_fetch(
                        at(FOLLOWERS[follower], offset),
                        None,
                        self.log_end,
                        self.now_ms,
                    )
                    .unwrap();
                self.follower_leo[follower] = offset;
                if let Some(change) = out.expand {
                    assert_eq!(Some(&change), self.leader.pending());
                    assert!(change.new_isr.contains(&FOLLOWERS[follower]));
                    assert!(offset >= self.hw, "expanded a replica below the HW");
                }
            }
            Op::Tick { ms } => {
                self.now_ms += ms;
                if let Some(change) = self.leader.maybe_shrink(self.now_ms) {
                    assert_eq!(Some(&change), self.leader.pending());
                    assert!(change.new_isr.contains(&LEADER));
                }
            }
            Op::CommitPending => {
                if let Some(change) = self.leader.pending().cloned() {
                    self.leader
                        .on_isr_committed(change.new_isr, change.partition_epoch + 1)
                        .unwrap();
                }
            }
            Op::FailPending => {
                self.leader.on_isr_change_failed();
            }
            Op::ControllerRemoves { follower } => {
                let isr: Vec<NodeId> = self
                    .leader
                    .isr()
                    .iter()
                    .copied()
                    .filter(|n| *n != FOLLOWERS[follower])
                    .collect();
                let epoch = self.leader.partition_epoch() + 1;
                self.leader.on_isr_committed(isr, epoch).unwrap();
            }
        }
    }

    fn check(&mut self) {
        let hw = self.leader.high_watermark();
        assert!(hw >= self.hw, "HW went back from {} to {hw}", self.hw);
        assert!(
            hw <= self.durable,
            "HW {hw} above the leader's durable {}",
            self.durable
        );
        self.hw = hw;

        let isr = self.leader.isr().to_vec();
        assert!(isr.contains(&LEADER), "leader not in ISR {isr:?}");
        let maximal = self.leader.maximal_isr();
        let pending = self
            .leader
            .pending()
            .map(|p| p.new_isr.clone())
            .unwrap_or_default();
        for n in [LEADER].iter().chain(FOLLOWERS.iter()) {
            let expected = isr.contains(n) || pending.contains(n);
            assert_eq!(maximal.contains(n), expected, "maximal ISR {maximal:?}");
        }
        if let Some(p) = self.leader.pending() {
            assert_eq!(p.partition_epoch, self.leader.partition_epoch());
        }
        for (i, f) in FOLLOWERS.iter().enumerate() {
            if !maximal.contains(f) {
                continue;
            }
            let leo = self.follower_leo[i];
            if leo == UNKNOWN_OFFSET {
                assert_eq!(hw, 0, "HW moved past a member that never fetched");
            } else {
                assert!(hw <= leo, "HW {hw} above member {f}'s log end {leo}");
            }
        }

        for required in self.waiters.release(hw) {
            assert!(required <= hw, "released {required} above HW {hw}");
        }
        if let Some(first) = self.waiters.first_required_offset() {
            assert!(first > hw, "waiter {first} left behind at HW {hw}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn leader_invariants_hold(ops in proptest::collection::vec(op(), 1..200)) {
        let mut model = Model::new();
        for op in &ops {
            model.step(op);
            model.check();
        }
    }
}
