#![allow(clippy::unwrap_used)]

use super::*;

const LAG_MS: u64 = 30_000;

fn config() -> LeaderConfig {
    LeaderConfig {
        replica_lag_time_max_ms: LAG_MS,
        min_insync_replicas: 2,
    }
}

/// A fetch at `offset` with no epoch to check, at the leader's epoch.
fn at(follower: NodeId, offset: i64) -> FollowerFetch {
    FollowerFetch {
        follower,
        fetch_offset: offset,
        last_fetched_epoch: -1,
        current_leader_epoch: 5,
    }
}

/// Node 1 leads replicas 1, 2, 3 at leader epoch 5, partition epoch 10.
fn leader(isr: &[NodeId], local_leo: i64, hw: i64) -> LeaderReplica {
    LeaderReplica::new(
        1,
        vec![1, 2, 3],
        isr.to_vec(),
        5,
        10,
        local_leo,
        hw,
        0,
        config(),
    )
}

fn fetch(l: &mut LeaderReplica, follower: NodeId, offset: i64, now_ms: u64) -> FetchOutcome {
    let leader_leo = l.log_end_offset;
    l.on_follower_fetch(at(follower, offset), None, leader_leo, now_ms)
        .unwrap()
}

#[test]
fn new_clamps_high_watermark_and_starts_followers_unknown() {
    let l = leader(&[1, 2, 3], 10, 25);
    assert_eq!(l.high_watermark(), 10);
    assert_eq!(l.isr(), &[1, 2, 3]);
    assert_eq!(l.maximal_isr(), vec![1, 2, 3]);
    assert_eq!((l.leader_epoch(), l.partition_epoch()), (5, 10));
    assert_eq!(l.follower_log_end_offset(2), Some(UNKNOWN_OFFSET));
    assert_eq!(l.follower_log_end_offset(1), None);
    assert!(l.pending().is_none());
    // The leader is always in its ISR.
    let l = LeaderReplica::new(1, vec![2, 3], vec![2], 1, 1, 0, 0, 0, config());
    assert!(l.isr().contains(&1));
    assert!(l.replicas().contains(&1));
}

#[test]
fn high_watermark_waits_for_every_maximal_isr_member() {
    let mut l = leader(&[1, 2, 3], 0, 0);
    assert_eq!(
        l.on_local_durable(10),
        None,
        "followers' log ends are unknown"
    );
    assert_eq!(fetch(&mut l, 2, 10, 1).high_watermark, None, "3 is unknown");
    assert_eq!(fetch(&mut l, 3, 4, 2).high_watermark, Some(4));
    assert_eq!(fetch(&mut l, 3, 10, 3).high_watermark, Some(10));
    // Followers ahead of the leader's durable log end: bounded by the leader.
    assert_eq!(l.on_local_durable(20), None);
    let out = l.on_follower_fetch(at(2, 20), None, 25, 4).unwrap();
    assert_eq!(out.high_watermark, None);
    let out = l.on_follower_fetch(at(3, 25), None, 25, 5).unwrap();
    assert_eq!(out.high_watermark, Some(20));
    assert_eq!(l.on_local_durable(25), None, "2 holds it at 20");
    assert_eq!(fetch(&mut l, 2, 25, 6).high_watermark, Some(25));
}

#[test]
fn high_watermark_never_decreases() {
    let mut l = leader(&[1, 2], 0, 0);
    l.on_local_durable(10);
    assert_eq!(fetch(&mut l, 2, 10, 1).high_watermark, Some(10));
    // A smaller durable log end, a follower reporting less: nothing moves back.
    assert_eq!(l.on_local_durable(5), None);
    assert_eq!(fetch(&mut l, 2, 3, 2).high_watermark, None);
    assert_eq!(l.high_watermark(), 10);
    // A committed ISR naming a lagging member does not lower it either.
    assert_eq!(l.on_isr_committed(vec![1, 2, 3], 11).unwrap(), None);
    assert_eq!(l.high_watermark(), 10);
}

#[test]
fn non_isr_replica_does_not_hold_the_high_watermark() {
    let mut l = leader(&[1, 2], 0, 0);
    l.on_local_durable(10);
    assert_eq!(fetch(&mut l, 2, 10, 1).high_watermark, Some(10));
    assert_eq!(l.follower_log_end_offset(3), Some(UNKNOWN_OFFSET));
}

#[test]
fn isr_of_the_leader_alone_follows_its_durable_log_end() {
    let mut l = leader(&[1], 0, 0);
    assert_eq!(l.on_local_durable(7), Some(7));
    assert_eq!(l.on_local_durable(9), Some(9));
}

#[test]
fn pending_expansion_counts_for_high_watermark_before_it_commits() {
    let mut l = leader(&[1, 2], 0, 0);
    l.on_local_durable(10);
    fetch(&mut l, 2, 10, 1);
    assert_eq!(l.high_watermark(), 10);
    let out = fetch(&mut l, 3, 10, 2);
    let expand = out.expand.unwrap();
    assert_eq!(expand.new_isr, vec![1, 2, 3]);
    assert_eq!(l.isr(), &[1, 2], "not committed yet");
    assert_eq!(l.maximal_isr(), vec![1, 2, 3]);
    // New data: replica 3 now holds the high watermark although it is only pending.
    l.on_local_durable(20);
    assert_eq!(fetch(&mut l, 2, 20, 3).high_watermark, None);
    assert_eq!(l.high_watermark(), 10);
    assert_eq!(fetch(&mut l, 3, 15, 4).high_watermark, Some(15));
    assert_eq!(l.on_isr_committed(vec![1, 2, 3], 11).unwrap(), None);
    assert_eq!(fetch(&mut l, 3, 20, 5).high_watermark, Some(20));
}

#[test]
fn pending_shrink_keeps_the_member_in_the_high_watermark_until_committed() {
    let mut l = leader(&[1, 2, 3], 0, 0);
    l.on_local_durable(10);
    fetch(&mut l, 2, 10, 1);
    fetch(&mut l, 3, 4, 1);
    assert_eq!(l.high_watermark(), 4);
    let shrink = l.maybe_shrink(LAG_MS + 2).unwrap();
    assert_eq!(shrink.new_isr, vec![1, 2]);
    assert_eq!(
        l.maximal_isr(),
        vec![1, 2, 3],
        "shrink not committed: 3 still counts"
    );
    assert_eq!(fetch(&mut l, 2, 10, LAG_MS + 3).high_watermark, None);
    assert_eq!(l.high_watermark(), 4);
    // Committed: 3 is out, the high watermark moves to what 1 and 2 hold.
    assert_eq!(l.on_isr_committed(vec![1, 2], 11).unwrap(), Some(10));
    assert_eq!(l.maximal_isr(), vec![1, 2]);
}

#[test]
fn shrink_after_the_lag_time_not_before() {
    let mut l = leader(&[1, 2, 3], 0, 0);
    l.on_local_durable(10);
    fetch(&mut l, 2, 10, 100);
    // 3 never fetches: its window started when this leader did (time 0).
    assert_eq!(
        l.maybe_shrink(LAG_MS),
        None,
        "exactly the lag time is not more"
    );
    assert!(l.pending().is_none());
    let shrink = l.maybe_shrink(LAG_MS + 1).unwrap();
    assert_eq!(
        shrink,
        IsrChange {
            new_isr: vec![1, 2],
            leader_epoch: 5,
            partition_epoch: 10
        }
    );
    assert_eq!(l.pending(), Some(&shrink));
}

#[test]
fn follower_fetching_but_staying_behind_is_shrunk() {
    let mut l = leader(&[1, 2, 3], 0, 0);
    let mut now = 0;
    let mut leo = 0;
    // The leader keeps appending; 2 keeps up, 3 fetches every 500 ms but stays
    // at 5, never reaching the leader's log end (now or at its previous fetch).
    while now <= LAG_MS + 1000 {
        leo += 10;
        l.on_local_durable(leo);
        fetch(&mut l, 2, leo, now);
        fetch(&mut l, 3, 5.min(leo), now);
        now += 500;
        if let Some(change) = l.maybe_shrink(now) {
            assert!(now > LAG_MS, "shrunk at {now} ms, before the lag time");
            assert_eq!(change.new_isr, vec![1, 2]);
            return;
        }
    }
    panic!("the lagging follower was never shrunk");
}

#[test]
fn follower_reaching_the_previous_fetch_log_end_stays_in_sync() {
    // Under steady load a healthy follower never sees the leader's current log
    // end, but each fetch reaches the log end as of its previous fetch (Kafka's
    // second rule): it stays caught up.
    let mut l = leader(&[1, 2, 3], 0, 0);
    let mut now = 0;
    let mut leo = 0;
    let mut seen_by_3 = 0;
    while now <= 3 * LAG_MS {
        let previous = leo;
        leo += 10;
        l.on_local_durable(leo);
        fetch(&mut l, 2, leo, now);
        // 3 fetches what was there at its previous fetch, never the latest.
        l.on_follower_fetch(at(3, seen_by_3), None, leo, now)
            .unwrap();
        seen_by_3 = previous + 10;
        now += 500;
        assert_eq!(
            l.maybe_shrink(now),
            None,
            "shrunk a follower that keeps up at {now}"
        );
    }
    let lag = l.follower_lag(leo, now);
    assert!(lag.iter().all(|f| f.caught_up_ms_ago <= 1000), "{lag:?}");
}

#[test]
fn idle_partition_keeps_a_caught_up_member() {
    let mut l = leader(&[1, 2, 3], 0, 0);
    l.on_local_durable(10);
    fetch(&mut l, 2, 10, 1);
    fetch(&mut l, 3, 10, 1);
    // No writes and no fetches for a long time: nobody is behind.
    assert_eq!(l.maybe_shrink(10 * LAG_MS), None);
    // One write: now they are behind and their window has long passed.
    l.on_local_durable(11);
    assert_eq!(l.maybe_shrink(10 * LAG_MS).unwrap().new_isr, vec![1]);
}

#[test]
fn expansion_when_a_non_isr_replica_reaches_the_high_watermark() {
    let mut l = leader(&[1, 2], 0, 0);
    l.on_local_durable(10);
    fetch(&mut l, 2, 10, 1);
    assert_eq!(
        fetch(&mut l, 3, 9, 2).expand,
        None,
        "below the high watermark"
    );
    let expand = fetch(&mut l, 3, 10, 3).expand.unwrap();
    assert_eq!(expand.new_isr, vec![1, 2, 3]);
    assert_eq!((expand.leader_epoch, expand.partition_epoch), (5, 10));
    assert_eq!(l.pending(), Some(&expand));
    // Not proposed twice while pending.
    assert_eq!(fetch(&mut l, 3, 10, 4).expand, None);
    // An ISR member never "expands".
    assert_eq!(l.on_isr_committed(vec![1, 2, 3], 11).unwrap(), None);
    assert_eq!(fetch(&mut l, 3, 10, 5).expand, None);
}

#[test]
fn expansion_needs_the_epoch_start_offset() {
    // Leader since offset 10 with a checkpointed high watermark of 5: a
    // follower at 7 reached the high watermark but has not fetched anything of
    // this epoch (it may not have truncated against it): not yet.
    let mut l = leader(&[1, 2], 10, 5);
    assert_eq!(fetch(&mut l, 3, 7, 1).expand, None);
    assert!(fetch(&mut l, 3, 10, 2).expand.is_some());
}

#[test]
fn one_change_in_flight() {
    let mut l = leader(&[1, 2], 0, 0);
    l.on_local_durable(10);
    let shrink = l.maybe_shrink(LAG_MS + 1).unwrap();
    assert_eq!(shrink.new_isr, vec![1]);
    // While the shrink is pending: no expansion, no other shrink.
    assert_eq!(fetch(&mut l, 3, 10, LAG_MS + 2).expand, None);
    assert_eq!(l.maybe_shrink(2 * LAG_MS + 3), None);
    assert_eq!(l.pending(), Some(&shrink));
}

#[test]
fn failed_change_is_cleared_and_can_be_proposed_again() {
    let mut l = leader(&[1, 2], 0, 0);
    l.on_local_durable(10);
    fetch(&mut l, 2, 10, 1);
    let expand = fetch(&mut l, 3, 10, 2).expand.unwrap();
    // 3 falls behind the new data while pending, and holds the high watermark.
    l.on_local_durable(20);
    fetch(&mut l, 2, 20, 3);
    assert_eq!(l.high_watermark(), 10);
    // The controller refuses: 3 leaves the maximal ISR, the high watermark moves.
    assert_eq!(l.on_isr_change_failed(), Some(20));
    assert!(l.pending().is_none());
    assert_eq!(l.isr(), &[1, 2]);
    assert_eq!(l.maximal_isr(), vec![1, 2]);
    // When 3 catches up again it is proposed again.
    assert_eq!(fetch(&mut l, 3, 20, 4).expand, Some(expand));
}

#[test]
fn committed_isr_from_metadata_replaces_pending() {
    let mut l = leader(&[1, 2], 0, 0);
    l.on_local_durable(10);
    fetch(&mut l, 2, 10, 1);
    assert!(fetch(&mut l, 3, 10, 2).expand.is_some());
    // The controller removed 2 (say it was fenced) before answering: the
    // metadata's ISR wins, the pending expansion is dropped.
    assert_eq!(l.on_isr_committed(vec![1], 12).unwrap(), None);
    assert_eq!(l.isr(), &[1]);
    assert_eq!(l.partition_epoch(), 12);
    assert!(l.pending().is_none());
    assert_eq!(l.maximal_isr(), vec![1]);
    // A later proposal is based on the new partition epoch.
    let expand = fetch(&mut l, 3, 10, 3).expand.unwrap();
    assert_eq!((expand.new_isr, expand.partition_epoch), (vec![1, 3], 12));
}

#[test]
fn stale_or_invalid_committed_isr() {
    let mut l = leader(&[1, 2, 3], 0, 0);
    assert_eq!(l.on_isr_committed(vec![1], 9).unwrap(), None);
    assert_eq!(l.isr(), &[1, 2, 3], "older partition epoch ignored");
    for bad in [vec![2, 3], vec![1, 4], vec![1, 2, 2]] {
        let err = l.on_isr_committed(bad, 11).unwrap_err();
        assert!(matches!(err, ReplicationError::InvalidIsr { .. }), "{err}");
    }
    assert_eq!(l.isr(), &[1, 2, 3]);
    assert_eq!(l.partition_epoch(), 10);
}

#[test]
fn acks_all_admission_and_after_append() {
    let mut l = leader(&[1, 2, 3], 0, 0);
    assert_eq!(l.check_acks_all(), Ok(()));
    assert_eq!(l.check_after_append(), Ok(()));
    l.on_isr_committed(vec![1, 2], 11).unwrap();
    assert_eq!(l.check_acks_all(), Ok(()));
    // A pending shrink does not count: only the committed ISR does.
    l.on_local_durable(1);
    assert_eq!(l.maybe_shrink(LAG_MS + 1).unwrap().new_isr, vec![1]);
    assert_eq!(l.check_acks_all(), Ok(()));
    l.on_isr_committed(vec![1], 12).unwrap();
    let err = l.check_acks_all().unwrap_err();
    assert_eq!(err, ReplicationError::NotEnoughReplicas { isr: 1, min: 2 });
    assert_eq!(err.kafka_code(), 19);
    let err = l.check_after_append().unwrap_err();
    assert_eq!(
        err,
        ReplicationError::NotEnoughReplicasAfterAppend { isr: 1, min: 2 }
    );
    assert_eq!(err.kafka_code(), 20);
}

#[test]
fn fetch_from_unknown_replica_or_out_of_range() {
    let mut l = leader(&[1, 2, 3], 0, 0);
    l.on_local_durable(10);
    let err = l.on_follower_fetch(at(4, 0), None, 10, 1).unwrap_err();
    assert_eq!(err, ReplicationError::UnknownReplica(4));
    assert_eq!(err.kafka_code(), 6);
    assert_eq!(
        l.on_follower_fetch(at(1, 0), None, 10, 1).unwrap_err(),
        ReplicationError::UnknownReplica(1),
        "the leader does not fetch from itself"
    );
    let err = l.on_follower_fetch(at(2, 11), None, 10, 1).unwrap_err();
    assert_eq!(err.kafka_code(), 1);
    assert!(l.on_follower_fetch(at(2, -1), None, 10, 1).is_err());
    assert_eq!(
        l.follower_log_end_offset(2),
        Some(UNKNOWN_OFFSET),
        "nothing recorded"
    );
}

#[test]
fn follower_lag_for_metrics() {
    let mut l = leader(&[1, 2], 0, 0);
    l.on_local_durable(10);
    fetch(&mut l, 2, 10, 100);
    fetch(&mut l, 3, 4, 100);
    let lag = l.follower_lag(12, 400);
    assert_eq!(
        lag,
        vec![
            FollowerLag {
                node_id: 2,
                log_end_offset: 10,
                records_behind: 2,
                caught_up_ms_ago: 300,
                in_isr: true,
            },
            FollowerLag {
                node_id: 3,
                log_end_offset: 4,
                records_behind: 8,
                caught_up_ms_ago: 400,
                in_isr: false,
            },
        ]
    );
}

/// Issue 19: a resumed former leader ends at the same offset as this leader
/// (1760) but its last records are from epoch 0, which ends at 1754 here. Its
/// fetch diverges: nothing is recorded, no ISR admission, no high watermark,
/// however often it asks; once cut to 1754 and caught up, it is admitted.
#[test]
fn a_diverging_follower_is_not_recorded_nor_admitted() {
    // Node 1 leads epoch 5 from 1754 with ISR [1, 2]; 3 is the old leader.
    let mut l = leader(&[1, 2], 1754, 1754).with_epoch_start_offset(1754);
    assert_eq!(l.epoch_start_offset(), 1754);
    l.on_local_durable(1760);
    fetch(&mut l, 2, 1760, 1);
    assert_eq!(l.high_watermark(), 1760);
    let resumed = FollowerFetch {
        follower: 3,
        fetch_offset: 1760,
        last_fetched_epoch: 0,
        current_leader_epoch: 5,
    };
    // The leader's epoch 0 ends where epoch 5 starts.
    for now in 2..10 {
        let out = l
            .on_follower_fetch(resumed, Some((0, 1754)), 1760, now)
            .unwrap();
        assert_eq!(
            out,
            FetchOutcome {
                high_watermark: None,
                expand: None,
                diverging: Some((0, 1754)),
            }
        );
    }
    assert_eq!(l.follower_log_end_offset(3), Some(UNKNOWN_OFFSET));
    assert_eq!(l.isr(), &[1, 2]);
    // Cut to 1754, it fetches again in epoch 0 up to there: no divergence,
    // but below the high watermark and this epoch's start: not admitted.
    let cut = FollowerFetch {
        fetch_offset: 1754,
        ..resumed
    };
    let out = l.on_follower_fetch(cut, Some((0, 1754)), 1760, 11).unwrap();
    assert_eq!((out.diverging, out.expand), (None, None));
    // Caught up with the leader's epoch-5 records: admitted.
    let caught_up = FollowerFetch {
        fetch_offset: 1760,
        last_fetched_epoch: 5,
        ..resumed
    };
    let out = l
        .on_follower_fetch(caught_up, Some((5, 1760)), 1760, 12)
        .unwrap();
    assert_eq!(out.expand.map(|c| c.new_isr), Some(vec![1, 2, 3]));
}

#[test]
fn isr_admission_needs_the_current_leader_epoch() {
    let mut l = leader(&[1, 2], 0, 0);
    l.on_local_durable(10);
    fetch(&mut l, 2, 10, 1);
    // A fenced or future epoch is refused before anything is recorded.
    for (epoch, code) in [(4, 74), (6, 76)] {
        let f = FollowerFetch {
            current_leader_epoch: epoch,
            ..at(3, 10)
        };
        let err = l.on_follower_fetch(f, None, 10, 2).unwrap_err();
        assert_eq!(err.kafka_code(), code);
    }
    assert_eq!(l.follower_log_end_offset(3), Some(UNKNOWN_OFFSET));
    // No epoch given: the fetch counts, but is no proof of truncation
    // against this leader: no admission.
    let f = FollowerFetch {
        current_leader_epoch: -1,
        ..at(3, 10)
    };
    let out = l.on_follower_fetch(f, None, 10, 3).unwrap();
    assert_eq!(out.expand, None);
    assert_eq!(l.follower_log_end_offset(3), Some(10));
    assert!(fetch(&mut l, 3, 10, 4).expand.is_some());
}

/// The leader's epoch starts at its log end when it took over, past its
/// durable end: a follower must reach it to join.
#[test]
fn admission_waits_for_the_epoch_start() {
    let mut l = leader(&[1, 2], 8, 8).with_epoch_start_offset(10);
    assert_eq!(l.epoch_start_offset(), 10);
    l.on_local_durable(10);
    fetch(&mut l, 2, 10, 1);
    assert_eq!(fetch(&mut l, 3, 9, 2).expand, None);
    assert!(fetch(&mut l, 3, 10, 3).expand.is_some());
}

/// KIP-841: a fenced or shutting-down replica is not proposed for the ISR,
/// however caught up; once the metadata says it is back, it is.
#[test]
fn an_ineligible_follower_is_not_proposed() {
    let mut l = leader(&[1, 2], 0, 0);
    l.set_ineligible(vec![3]);
    l.on_local_durable(10);
    fetch(&mut l, 2, 10, 1);
    for now in 2..20 {
        assert_eq!(fetch(&mut l, 3, 10, now).expand, None);
    }
    assert!(l.pending().is_none());
    l.set_ineligible(Vec::new());
    assert_eq!(
        fetch(&mut l, 3, 10, 21).expand.map(|c| c.new_isr),
        Some(vec![1, 2, 3])
    );
}

#[test]
fn an_added_replica_catches_up_joins_the_isr_and_never_holds_the_high_watermark_before() {
    let mut l = leader(&[1, 2, 3], 10, 10);
    assert_eq!(l.on_local_durable(20), None);
    fetch(&mut l, 2, 20, 1);
    fetch(&mut l, 3, 20, 1);
    assert_eq!(l.high_watermark(), 20);
    // A reassignment adds node 4 in the same leader epoch.
    l.set_replicas(vec![4, 1, 2, 3], 2);
    assert_eq!(l.replicas(), &[4, 1, 2, 3]);
    assert_eq!(l.follower_log_end_offset(4), Some(UNKNOWN_OFFSET));
    assert_eq!(
        l.follower_log_end_offset(2),
        Some(20),
        "known followers keep their state"
    );
    // While it catches up it is not in the ISR and the high watermark moves
    // without it.
    assert_eq!(l.on_local_durable(30), None);
    fetch(&mut l, 2, 30, 3);
    let out = fetch(&mut l, 3, 30, 3);
    assert_eq!(out.high_watermark, Some(30));
    let out = fetch(&mut l, 4, 10, 4);
    assert!(
        out.expand.is_none(),
        "behind the high watermark: not proposed"
    );
    let out = fetch(&mut l, 4, 30, 5);
    let change = out.expand.unwrap();
    assert_eq!(change.new_isr, vec![4, 1, 2, 3]);
    // Removing a replica through set_replicas forgets it.
    l.set_replicas(vec![1, 2, 4], 6);
    assert_eq!(l.follower_log_end_offset(3), None);
}

#[test]
fn followed_within_needs_every_other_isr_member_caught_up_at_this_epoch() {
    const WITHIN: u64 = 1000;
    let mut l = leader(&[1, 2, 3], 0, 0);
    l.on_local_durable(10);
    // A new leadership counts nobody as following until they fetch, though
    // each gets a full lag window for the ISR.
    assert!(!l.followed_within(0, WITHIN));
    fetch(&mut l, 2, 10, 100);
    assert!(!l.followed_within(100, WITHIN), "3 has not fetched");
    fetch(&mut l, 3, 10, 200);
    assert!(l.followed_within(200, WITHIN));
    assert!(
        l.followed_within(100 + WITHIN, WITHIN),
        "exactly `within` is still within"
    );
    // 2 stops fetching (its own leadership, a cut): past the window, no.
    fetch(&mut l, 3, 10, 1000);
    assert!(!l.followed_within(100 + WITHIN + 1, WITHIN));
    // A follower that fetches but stays behind is not following.
    l.on_local_durable(50);
    fetch(&mut l, 2, 10, 2000);
    fetch(&mut l, 3, 50, 2000);
    fetch(&mut l, 2, 10, 2500);
    fetch(&mut l, 3, 50, 2500);
    assert!(!l.followed_within(2500 + WITHIN, WITHIN), "2 stayed at 10");
    fetch(&mut l, 2, 50, 2600);
    assert!(l.followed_within(2600, WITHIN));
    // Without another ISR member there is nobody following.
    let mut alone = leader(&[1], 0, 0);
    alone.on_local_durable(10);
    assert!(!alone.followed_within(100, WITHIN), "an ISR of one");
    // A pending expansion's member counts too: the controller may have
    // committed it unheard.
    let mut growing = leader(&[1, 2], 0, 0);
    growing.on_local_durable(10);
    fetch(&mut growing, 2, 10, 100);
    assert!(growing.followed_within(100, WITHIN));
    let out = fetch(&mut growing, 3, 10, 150);
    assert!(out.expand.is_some(), "3 caught up: expansion proposed");
    assert!(growing.followed_within(200, WITHIN));
    fetch(&mut growing, 2, 10, 1500);
    assert!(
        !growing.followed_within(1500, WITHIN),
        "3 stopped after its expansion"
    );
}

#[test]
fn a_stall_of_the_leader_itself_shrinks_nobody() {
    let mut l = leader(&[1, 2, 3], 0, 0);
    l.on_local_durable(10);
    fetch(&mut l, 2, 10, 100);
    fetch(&mut l, 3, 10, 100);
    // More appends the followers had no chance to fetch: the leader's thread
    // stood still from 200 ms to LAG + 5,000 ms.
    l.on_local_durable(20);
    let woke = LAG_MS + 5_000;
    l.excuse_stall(woke - 200, woke);
    assert_eq!(
        l.maybe_shrink(woke),
        None,
        "shrunk for the leader's own stall"
    );
    // Time the leader was awake still counts: 3 catches up, 2 stays silent
    // a whole lag time after the stall.
    fetch(&mut l, 3, 20, woke + 10);
    assert_eq!(l.maybe_shrink(woke + LAG_MS - 100), None);
    let shrink = l.maybe_shrink(woke + LAG_MS + 1).unwrap();
    assert_eq!(shrink.new_isr, vec![1, 3]);
    // A stall never moves a follower's time past now.
    let mut l = leader(&[1, 2], 0, 0);
    l.on_local_durable(10);
    fetch(&mut l, 2, 5, 100);
    l.excuse_stall(1_000_000, 200);
    assert!(l.maybe_shrink(200 + LAG_MS + 1).is_some());
}
