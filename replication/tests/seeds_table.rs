//! The seeds' table: replication factor 3, `min.insync.replicas = 2`, with 0, 1
//! and 2 followers down (a down replica never fetches again), time driven well
//! past `replica.lag.time.max.ms`. One row per case: is acks=all admitted, does
//! the high watermark keep moving, and does any acknowledged (high-watermark
//! covered) offset exceed what the surviving replicas hold (it must not).
//!
//! Run with `cargo test -p skiff-replication --test seeds_table -- --nocapture`
//! to see the table.

#![allow(clippy::unwrap_used)]

use skiff_replication::{
    AckWaiters, FollowerFetch, LeaderConfig, LeaderReplica, NodeId, ReplicationError,
};

const LAG_MS: u64 = 30_000;
const STEP_MS: u64 = 250;
const DOWN_AT_MS: u64 = 5_000;
const END_MS: u64 = 60_000;
const LEADER: NodeId = 1;
const FOLLOWERS: [NodeId; 2] = [2, 3];

/// A fetch at `offset` with no epoch to check, at the leader's epoch.
fn at(follower: NodeId, offset: i64) -> FollowerFetch {
    FollowerFetch {
        follower,
        fetch_offset: offset,
        last_fetched_epoch: -1,
        current_leader_epoch: 1,
    }
}

#[derive(Debug, Default, PartialEq, Eq)]
struct Row {
    down: usize,
    final_isr: Vec<NodeId>,
    /// acks=all admitted at the end (after the lag window).
    acks_all_admitted_at_end: bool,
    acks_all_ok: usize,
    not_enough_replicas: usize,
    not_enough_after_append: usize,
    /// The high watermark moved during the last 10 s (acks=1 and acks=all
    /// writes are both appended every step).
    hw_moves_at_end: bool,
    /// Longest time between two high watermark moves while writes went on.
    hw_stall_ms_max: u64,
    /// Highest acknowledged offset (high watermark) and the smallest log end
    /// among the surviving replicas at the end.
    hw_end: i64,
    survivors_leo_min: i64,
    /// Every acks=all write acknowledged without error was held by at least
    /// min.insync.replicas replicas when it was acknowledged.
    acked_on_min_isr: bool,
}

fn run(down: usize) -> Row {
    let config = LeaderConfig {
        replica_lag_time_max_ms: LAG_MS,
        min_insync_replicas: 2,
    };
    let mut leader =
        LeaderReplica::new(LEADER, vec![1, 2, 3], vec![1, 2, 3], 1, 1, 0, 0, 0, config);
    let down_nodes: Vec<NodeId> = FOLLOWERS.iter().rev().take(down).copied().collect();
    // Each follower's durable log end (what it really holds).
    let mut follower_leo = [0i64; 2];
    let mut leo = 0i64;
    let mut waiters = AckWaiters::new(1024);
    let mut row = Row {
        down,
        acked_on_min_isr: true,
        ..Row::default()
    };
    let mut hw_changed_ms = 0u64;
    let mut hw_at_50s = 0;
    let mut now = 0u64;
    while now <= END_MS {
        // One acks=1 and one acks=all batch of one record each.
        leo += 1; // acks=1: answered after the durable append
        match leader.check_acks_all() {
            Ok(()) => {
                leo += 1;
                waiters.push(leo, leo).unwrap();
            }
            Err(ReplicationError::NotEnoughReplicas { .. }) => row.not_enough_replicas += 1,
            Err(e) => panic!("{e}"),
        }
        let mut hw_moved = leader.on_local_durable(leo).is_some();

        for (i, f) in FOLLOWERS.iter().enumerate() {
            if now >= DOWN_AT_MS && down_nodes.contains(f) {
                continue;
            }
            // It reports what it holds, then receives everything up to `leo`.
            let out = leader
                .on_follower_fetch(at(*f, follower_leo[i]), None, leo, now)
                .unwrap();
            hw_moved |= out.high_watermark.is_some();
            if let Some(change) = out.expand {
                let epoch = leader.partition_epoch() + 1;
                hw_moved |= leader
                    .on_isr_committed(change.new_isr, epoch)
                    .unwrap()
                    .is_some();
            }
            follower_leo[i] = leo;
        }
        if let Some(change) = leader.maybe_shrink(now) {
            // The controller is up: the change commits at once.
            let epoch = leader.partition_epoch() + 1;
            hw_moved |= leader
                .on_isr_committed(change.new_isr, epoch)
                .unwrap()
                .is_some();
        }

        let hw = leader.high_watermark();
        let holders = 1 + follower_leo.iter().filter(|l| **l >= hw).count();
        for _required in waiters.release(hw) {
            match leader.check_after_append() {
                Ok(()) => {
                    row.acks_all_ok += 1;
                    row.acked_on_min_isr &= holders >= 2;
                }
                Err(ReplicationError::NotEnoughReplicasAfterAppend { .. }) => {
                    row.not_enough_after_append += 1
                }
                Err(e) => panic!("{e}"),
            }
        }
        if hw_moved {
            row.hw_stall_ms_max = row.hw_stall_ms_max.max(now - hw_changed_ms);
            hw_changed_ms = now;
        }
        if now == END_MS - 10_000 {
            hw_at_50s = hw;
        }
        // Safety at every step: the high watermark is held by every survivor.
        for (i, f) in FOLLOWERS.iter().enumerate() {
            if !down_nodes.contains(f) {
                assert!(hw <= follower_leo[i], "HW {hw} above survivor {f}");
            }
        }
        assert!(hw <= leo);
        now += STEP_MS;
    }
    row.final_isr = leader.isr().to_vec();
    row.acks_all_admitted_at_end = leader.check_acks_all().is_ok();
    row.hw_end = leader.high_watermark();
    row.hw_moves_at_end = row.hw_end > hw_at_50s;
    row.survivors_leo_min = FOLLOWERS
        .iter()
        .enumerate()
        .filter(|(_, f)| !down_nodes.contains(f))
        .map(|(i, _)| follower_leo[i])
        .fold(leo, i64::min);
    row
}

#[test]
fn rf3_min_isr2_with_replicas_down() {
    let rows: Vec<Row> = (0..=2).map(run).collect();
    println!(
        "\nRF=3 min.insync.replicas=2 replica.lag.time.max.ms={LAG_MS}; followers stop at {DOWN_AT_MS} ms, run to {END_MS} ms"
    );
    println!(
        "{:<5} {:<10} {:<14} {:>10} {:>6} {:>14} {:>11} {:>13} {:>7} {:>13} {:>10}",
        "down",
        "final ISR",
        "acks=all now",
        "all ok",
        "NER",
        "NER after app",
        "HW moving",
        "HW stall ms",
        "HW",
        "survivor LEO",
        "HW safe"
    );
    for r in &rows {
        println!(
            "{:<5} {:<10} {:<14} {:>10} {:>6} {:>14} {:>11} {:>13} {:>7} {:>13} {:>10}",
            r.down,
            format!("{:?}", r.final_isr),
            if r.acks_all_admitted_at_end {
                "admitted"
            } else {
                "refused (19)"
            },
            r.acks_all_ok,
            r.not_enough_replicas,
            r.not_enough_after_append,
            r.hw_moves_at_end,
            r.hw_stall_ms_max,
            r.hw_end,
            r.survivors_leo_min,
            r.hw_end <= r.survivors_leo_min && r.acked_on_min_isr
        );
    }

    // No replica down: nothing changes, the HW trails by one fetch round.
    let r = &rows[0];
    assert_eq!(r.final_isr, vec![1, 2, 3]);
    assert!(r.acks_all_admitted_at_end && r.hw_moves_at_end);
    assert_eq!((r.not_enough_replicas, r.not_enough_after_append), (0, 0));
    assert_eq!(r.hw_stall_ms_max, STEP_MS, "{r:?}");

    // One down: the HW stands still for the lag window, then the ISR shrinks to
    // two and everything flows again; every acks=all write succeeds late.
    let r = &rows[1];
    assert_eq!(r.final_isr, vec![1, 2]);
    assert!(r.acks_all_admitted_at_end && r.hw_moves_at_end);
    assert_eq!((r.not_enough_replicas, r.not_enough_after_append), (0, 0));
    assert!((LAG_MS - STEP_MS..=LAG_MS + 2 * STEP_MS).contains(&r.hw_stall_ms_max));

    // Two down: the ISR shrinks to the leader alone. acks=all writes taken
    // during the window are answered NOT_ENOUGH_REPLICAS_AFTER_APPEND, later
    // ones NOT_ENOUGH_REPLICAS; acks=1 writes move the HW again.
    let r = &rows[2];
    assert_eq!(r.final_isr, vec![1]);
    assert!(!r.acks_all_admitted_at_end && r.hw_moves_at_end);
    assert!(r.not_enough_replicas > 0 && r.not_enough_after_append > 0);
    assert!((LAG_MS - STEP_MS..=LAG_MS + 2 * STEP_MS).contains(&r.hw_stall_ms_max));

    for r in &rows {
        assert!(r.hw_end <= r.survivors_leo_min, "{r:?}");
        assert!(r.acked_on_min_isr, "{r:?}");
    }
}
