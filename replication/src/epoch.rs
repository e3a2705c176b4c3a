//! Leader epochs: fencing requests from other epochs, and where a follower's log
//! diverges from a new leader's (KIP-101, KIP-279, KIP-320).
//!
//! A log's leader-epoch cache (`leader-epoch-checkpoint`) is a list of
//! `(epoch, start_offset)` entries, epochs and start offsets ascending: epoch
//! `e` covers the offsets from its start up to the next entry's start (the last
//! epoch up to the log end). Two replicas hold the same records up to the end of
//! the largest epoch they both have, bounded by where each one's copy of that
//! epoch ends; everything past that point on the follower must be cut before it
//! fetches, or it would keep records the leader never had.

use crate::{ReplicationError, NO_EPOCH};

/// Checks a request's `current_leader_epoch` (Fetch v9+, OffsetsForLeaderEpoch
/// v2+, ListOffsets v4+) against the replica's `current` leader epoch.
///
/// `request == -1` (not given, older clients) is accepted. An older epoch is
/// FENCED_LEADER_EPOCH (the sender is behind: it must refresh its metadata); a
/// newer one is UNKNOWN_LEADER_EPOCH (this replica is behind: the sender retries).
pub fn check_leader_epoch(request: i32, current: i32) -> Result<(), ReplicationError> {
    if request == NO_EPOCH || request == current {
        Ok(())
    } else if request < current {
        Err(ReplicationError::FencedLeaderEpoch { request, current })
    } else {
        Err(ReplicationError::UnknownLeaderEpoch { request, current })
    }
}

/// Kafka's `LeaderEpochFileCache.endOffsetFor`: the largest epoch `<= requested`
/// in `epochs` and the offset where it ends (the next epoch's start, or
/// `log_end_offset` for the latest epoch). This is what a leader answers to
/// OffsetsForLeaderEpoch, and what a follower compares the answer with.
///
/// `None` is Kafka's UNDEFINED (epoch -1, offset -1): the cache is empty, the
/// request is `-1`, or `requested` is past the latest epoch. If `requested` is
/// older than every cached epoch, the answer is `requested` itself ending at
/// the first cached epoch's start (Kafka's rule: the earlier epochs may have
/// been removed by retention).
pub fn end_offset_for_epoch(
    epochs: &[(i32, i64)],
    log_end_offset: i64,
    requested: i32,
) -> Option<(i32, i64)> {
    let &(latest, _) = epochs.last()?;
    if requested == NO_EPOCH {
        return None;
    }
    if requested == latest {
        return Some((latest, log_end_offset));
    }
    let higher = epochs.iter().find(|(e, _)| *e > requested)?;
    let floor = epochs.iter().rev().find(|(e, _)| *e <= requested);
    match floor {
        Some(&(epoch, _)) => Some((epoch, higher.1)),
        None => Some((requested, higher.1)),
    }
}

/// The leader's side of KIP-595's truncation on fetch (Kafka's
/// `Partition.validateFetchOffsetAndMaybeGetDivergingEpoch`): a follower
/// fetching at `fetch_offset` (its log end) whose last record was written in
/// `last_fetched_epoch` diverges from the leader when the leader's copy of
/// that epoch (`epoch_end`, `end_offset_for_epoch` on the leader's cache)
/// ends before `fetch_offset`, or the leader's largest epoch `<=` it is
/// smaller (the leader never had that epoch). Returns the diverging (epoch,
/// end offset) to send back, UNDEFINED as `(-1, -1)`.
///
/// Equal log ends do not make equal logs: a paused leader that appended at
/// epoch 0 up to 1760 and a new leader that appended other records at epoch 1
/// from 1754 to 1760 both end at 1760; the leader's epoch 0 ends at 1754,
/// which is below the follower's 1760, so the follower cuts to 1754.
///
/// A follower that sends no epoch (`-1`: its log has no epoch history) is not
/// checked (Kafka's rule: nothing to compare); it truncated to its high
/// watermark before fetching (`FollowerReplica`).
pub fn leader_divergence(
    last_fetched_epoch: i32,
    fetch_offset: i64,
    epoch_end: Option<(i32, i64)>,
) -> Option<(i32, i64)> {
    if last_fetched_epoch < 0 {
        return None;
    }
    let (epoch, end_offset) = epoch_end.unwrap_or((NO_EPOCH, -1));
    (end_offset < fetch_offset || epoch < last_fetched_epoch).then_some((epoch, end_offset))
}

/// What a follower does with the leader's OffsetsForLeaderEpoch answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Truncation {
    /// Truncate the log to this offset (`== local_leo`: nothing to cut), then
    /// fetch from it. Final.
    TruncateTo(i64),
    /// The leader answered an epoch the follower does not have: the logs agree
    /// at most up to `truncate_to` (where the follower's largest earlier epoch
    /// ends). Kafka truncates there and asks again for `epoch`, the follower's
    /// new latest epoch; the final answer is never above `truncate_to`, so
    /// truncating now is safe.
    AskAgain { epoch: i32, truncate_to: i64 },
    /// The leader's answer is unusable (UNDEFINED: it has no epochs, or it
    /// answered an epoch newer than asked): truncate to the follower's own high
    /// watermark, which every ISR member has (Kafka's fallback).
    TruncateToHighWatermark,
}

/// Where a follower's log diverges from the leader's, given the leader's answer
/// for the follower's latest epoch (Kafka's
/// `AbstractFetcherThread.getOffsetTruncationState`).
///
/// - `local_epochs`: the follower's leader-epoch cache, ascending;
///   `local_leo`: its log end; `asked_epoch`: the epoch it asked about (its
///   latest);
/// - `leader_answer`: `(epoch, end_offset)`, the leader's largest epoch `<=
///   asked_epoch` and where that epoch ends in the leader's log; `None` is
///   UNDEFINED.
///
/// The rule, case by case as Kafka has it:
/// 1. UNDEFINED (or a negative end offset, or an epoch above `asked_epoch`,
///    which a correct leader never answers): `TruncateToHighWatermark`.
/// 2. An answer with epoch -1 but a valid offset (pre-2.0 leaders):
///    `min(end_offset, local_leo)`.
/// 3. Otherwise find the follower's own largest epoch `<=` the leader's
///    (`end_offset_for_epoch` on the follower's cache):
///    - the follower has no epochs: `min(end_offset, local_leo)`;
///    - it has that same epoch (KIP-101; also when the leader answered a
///      smaller epoch than asked, KIP-279's fast leader failover, if the
///      follower has that epoch): both logs hold it, up to where the shorter
///      copy ends: `min(leader's end, follower's end of that epoch, local_leo)`;
///    - it does not have that epoch (its largest below is smaller): the logs
///      agree at most up to where the follower's smaller epoch ends: cut there
///      and ask again for that epoch (`AskAgain`). Each round asks a strictly
///      smaller epoch, so the exchange ends.
pub fn truncation(
    local_epochs: &[(i32, i64)],
    local_leo: i64,
    asked_epoch: i32,
    leader_answer: Option<(i32, i64)>,
) -> Truncation {
    let Some((leader_epoch, leader_end)) = leader_answer else {
        return Truncation::TruncateToHighWatermark;
    };
    if leader_end < 0 || leader_epoch > asked_epoch {
        return Truncation::TruncateToHighWatermark;
    }
    if leader_epoch == NO_EPOCH {
        return Truncation::TruncateTo(leader_end.min(local_leo));
    }
    match end_offset_for_epoch(local_epochs, local_leo, leader_epoch) {
        None => Truncation::TruncateTo(leader_end.min(local_leo)),
        Some((epoch, local_end)) if epoch != leader_epoch => Truncation::AskAgain {
            epoch,
            truncate_to: local_end.min(local_leo),
        },
        Some((_, local_end)) => Truncation::TruncateTo(leader_end.min(local_end).min(local_leo)),
    }
}

/// The same rule for a Fetch v12+ response's `DivergingEpoch { epoch,
/// end_offset }` (KIP-595 truncation on fetch): the leader found that the
/// follower's `last_fetched_epoch` diverges and answered, in the fetch
/// response, what OffsetsForLeaderEpoch would have answered. On `AskAgain` the
/// follower truncates and simply fetches again with its new latest epoch as
/// `last_fetched_epoch`.
pub fn diverging_epoch_truncation(
    local_epochs: &[(i32, i64)],
    local_leo: i64,
    last_fetched_epoch: i32,
    diverging_epoch: i32,
    diverging_end_offset: i64,
) -> Truncation {
    truncation(
        local_epochs,
        local_leo,
        last_fetched_epoch,
        Some((diverging_epoch, diverging_end_offset)),
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A replica's log as its epoch cache and log end.
    struct Log {
        epochs: Vec<(i32, i64)>,
        leo: i64,
    }

    impl Log {
        fn new(epochs: &[(i32, i64)], leo: i64) -> Self {
            Self {
                epochs: epochs.to_vec(),
                leo,
            }
        }

        /// Kafka's truncation of the log and its epoch cache.
        fn truncate(&mut self, offset: i64) {
            self.leo = self.leo.min(offset);
            self.epochs.retain(|(_, start)| *start < offset);
        }
    }

    /// Runs the follower/leader exchange to the end, truncating the follower as
    /// Kafka does; returns the final offset and how many questions it took.
    fn resolve(follower: &mut Log, leader: &Log, hw: i64) -> (i64, usize) {
        let mut asked = follower.epochs.last().map(|e| e.0).unwrap_or(NO_EPOCH);
        for round in 1..=10 {
            let answer = end_offset_for_epoch(&leader.epochs, leader.leo, asked);
            match truncation(&follower.epochs, follower.leo, asked, answer) {
                Truncation::TruncateTo(offset) => {
                    follower.truncate(offset);
                    return (offset, round);
                }
                Truncation::TruncateToHighWatermark => {
                    follower.truncate(hw);
                    return (follower.leo, round);
                }
                Truncation::AskAgain { epoch, truncate_to } => {
                    assert!(epoch < asked, "asks a smaller epoch each round");
                    follower.truncate(truncate_to);
                    asked = epoch;
                }
            }
        }
        panic!("the exchange did not end");
    }

    #[test]
    fn leader_epoch_check() {
        assert_eq!(check_leader_epoch(-1, 5), Ok(()));
        assert_eq!(check_leader_epoch(5, 5), Ok(()));
        let fenced = check_leader_epoch(4, 5).unwrap_err();
        assert_eq!(
            fenced,
            ReplicationError::FencedLeaderEpoch {
                request: 4,
                current: 5
            }
        );
        assert_eq!(fenced.kafka_code(), 74);
        let unknown = check_leader_epoch(6, 5).unwrap_err();
        assert_eq!(unknown.kafka_code(), 76);
    }

    #[test]
    fn end_offset_for_epoch_follows_kafka() {
        let epochs = [(1, 0), (3, 10), (5, 20)];
        assert_eq!(end_offset_for_epoch(&epochs, 25, 5), Some((5, 25)));
        assert_eq!(end_offset_for_epoch(&epochs, 25, 4), Some((3, 20)));
        assert_eq!(end_offset_for_epoch(&epochs, 25, 3), Some((3, 20)));
        assert_eq!(end_offset_for_epoch(&epochs, 25, 2), Some((1, 10)));
        // Older than every cached epoch: the requested epoch, ending where the
        // first cached one starts.
        assert_eq!(end_offset_for_epoch(&epochs, 25, 0), Some((0, 0)));
        // Newer than the latest, -1, or an empty cache: UNDEFINED.
        assert_eq!(end_offset_for_epoch(&epochs, 25, 6), None);
        assert_eq!(end_offset_for_epoch(&epochs, 25, -1), None);
        assert_eq!(end_offset_for_epoch(&[], 0, 0), None);
    }

    /// KIP-101 scenario 1: the follower restarts holding m2 (offset 1) that the
    /// leader also has, but its high watermark (1) never learned of it. Truncating
    /// to the high watermark would lose m2 if this follower then became leader;
    /// with epochs nothing is cut.
    #[test]
    fn kip101_scenario_1_no_truncation_to_high_watermark() {
        let leader = Log::new(&[(0, 0)], 2);
        let mut follower = Log::new(&[(0, 0)], 2);
        assert_eq!(
            truncation(&follower.epochs, follower.leo, 0, Some((0, 2))),
            Truncation::TruncateTo(2)
        );
        assert_eq!(resolve(&mut follower, &leader, 1), (2, 1));
    }

    /// KIP-101 scenario 2: A (m1, m2 in epoch 0) and B (m1) lose power; B comes
    /// back first, leads epoch 1 and writes m3 at offset 1. A must cut m2 (offset
    /// 1), or the replicas diverge at offset 1.
    #[test]
    fn kip101_scenario_2_divergent_logs() {
        let leader_b = Log::new(&[(0, 0), (1, 1)], 2);
        let mut follower_a = Log::new(&[(0, 0)], 2);
        let answer = end_offset_for_epoch(&leader_b.epochs, leader_b.leo, 0);
        assert_eq!(answer, Some((0, 1)));
        assert_eq!(
            truncation(&follower_a.epochs, follower_a.leo, 0, answer),
            Truncation::TruncateTo(1)
        );
        assert_eq!(resolve(&mut follower_a, &leader_b, 0), (1, 1));
        assert_eq!(follower_a.epochs, vec![(0, 0)]);
    }

    /// KIP-279 fast leader failover: F led epoch 2 briefly and wrote 5..8 that
    /// nobody copied; the new leader never had epoch 2 and answers epoch 1
    /// (smaller than asked), ending at 5. F knows epoch 1, so one round ends it.
    #[test]
    fn kip279_leader_answers_smaller_epoch_known_to_follower() {
        let leader = Log::new(&[(1, 0), (3, 5)], 10);
        let mut follower = Log::new(&[(1, 0), (2, 5)], 8);
        assert_eq!(
            truncation(&follower.epochs, follower.leo, 2, Some((1, 5))),
            Truncation::TruncateTo(5)
        );
        assert_eq!(resolve(&mut follower, &leader, 0), (5, 1));
    }

    /// KIP-279 when the follower does not know the epoch the leader answered:
    /// cut to where its own earlier epoch ends and ask again for that epoch.
    #[test]
    fn kip279_leader_answers_epoch_unknown_to_follower_asks_again() {
        let leader = Log::new(&[(1, 0), (2, 3), (4, 6)], 12);
        let follower = Log::new(&[(1, 0), (3, 4)], 9);
        let answer = end_offset_for_epoch(&leader.epochs, leader.leo, 3);
        assert_eq!(answer, Some((2, 6)));
        assert_eq!(
            truncation(&follower.epochs, follower.leo, 3, answer),
            Truncation::AskAgain {
                epoch: 1,
                truncate_to: 4
            }
        );
        // Second round, after Kafka's intermediate truncation to 4: the leader's
        // epoch 1 ended at 3, the follower's at 4: cut to 3.
        assert_eq!(
            truncation(&[(1, 0)], 4, 1, Some((1, 3))),
            Truncation::TruncateTo(3)
        );
        // Without the intermediate truncation the answer is the same.
        assert_eq!(
            truncation(&follower.epochs, follower.leo, 1, Some((1, 3))),
            Truncation::TruncateTo(3)
        );
        let mut follower = follower;
        assert_eq!(resolve(&mut follower, &leader, 0), (3, 2));
    }

    #[test]
    fn empty_logs() {
        // An empty follower has nothing to cut, whatever the leader holds.
        assert_eq!(
            truncation(&[], 0, 0, Some((0, 7))),
            Truncation::TruncateTo(0)
        );
        // An empty leader (no epochs) answers UNDEFINED: the high watermark.
        let mut follower = Log::new(&[(0, 0)], 4);
        let leader = Log::new(&[], 0);
        assert_eq!(resolve(&mut follower, &leader, 2), (2, 1));
        // A follower with records but no epoch cache (pre-0.11 data): Kafka cuts
        // to the leader's end offset.
        assert_eq!(
            truncation(&[], 9, 1, Some((1, 5))),
            Truncation::TruncateTo(5)
        );
    }

    /// The follower wrote past the leader in the same epoch (the leader was
    /// elected without those records): cut to where the leader's epoch ends.
    #[test]
    fn follower_ahead_of_leader_in_same_epoch() {
        let leader = Log::new(&[(0, 0), (1, 2), (2, 7)], 9);
        let mut follower = Log::new(&[(0, 0), (1, 2)], 10);
        assert_eq!(
            truncation(&follower.epochs, follower.leo, 1, Some((1, 7))),
            Truncation::TruncateTo(7)
        );
        assert_eq!(resolve(&mut follower, &leader, 0), (7, 1));
        // Same epoch, leader further: nothing to cut.
        assert_eq!(
            truncation(&[(0, 0), (1, 2)], 5, 1, Some((1, 7))),
            Truncation::TruncateTo(5)
        );
    }

    #[test]
    fn undefined_or_bad_answers_fall_back_to_high_watermark() {
        let epochs = [(0, 0), (2, 5)];
        assert_eq!(
            truncation(&epochs, 8, 2, None),
            Truncation::TruncateToHighWatermark
        );
        assert_eq!(
            truncation(&epochs, 8, 2, Some((2, -1))),
            Truncation::TruncateToHighWatermark
        );
        // A leader answering a newer epoch than asked breaks the protocol.
        assert_eq!(
            truncation(&epochs, 8, 2, Some((3, 6))),
            Truncation::TruncateToHighWatermark
        );
        // Epoch -1 with a valid offset (pre-2.0 leader): its offset, bounded by ours.
        assert_eq!(
            truncation(&epochs, 8, 2, Some((-1, 6))),
            Truncation::TruncateTo(6)
        );
    }

    /// The follower's first cached epoch is newer than the leader's answer (its
    /// older epochs were removed by retention): Kafka treats the follower's copy
    /// of the answered epoch as ending where its first cached epoch starts.
    #[test]
    fn follower_cache_starts_after_answered_epoch() {
        assert_eq!(
            truncation(&[(3, 10), (4, 15)], 20, 4, Some((2, 12))),
            Truncation::TruncateTo(10)
        );
    }

    /// Issue 19: a resumed leader and its successor end at the same offset
    /// with different last epochs. The follower's last epoch ends earlier on
    /// the leader: it diverges, and cuts to where the leader's copy ends.
    #[test]
    fn equal_log_ends_with_different_last_epochs_diverge() {
        let leader = Log::new(&[(0, 0), (1, 1754)], 1760);
        let mut follower = Log::new(&[(0, 0)], 1760);
        let answer = end_offset_for_epoch(&leader.epochs, leader.leo, 0);
        assert_eq!(answer, Some((0, 1754)));
        assert_eq!(leader_divergence(0, 1760, answer), Some((0, 1754)));
        assert_eq!(
            diverging_epoch_truncation(&follower.epochs, follower.leo, 0, 0, 1754),
            Truncation::TruncateTo(1754)
        );
        assert_eq!(resolve(&mut follower, &leader, 0), (1754, 1));
        // Cut, the follower agrees: same epoch, the leader's copy reaches its end.
        let answer = end_offset_for_epoch(&leader.epochs, leader.leo, 0);
        assert_eq!(leader_divergence(0, 1754, answer), None);
    }

    /// Leader ahead, same last epoch: no divergence. Follower ahead in the
    /// leader's epoch, or in an epoch the leader never had: divergence.
    #[test]
    fn leader_divergence_cases() {
        let epochs = [(0, 0), (2, 10), (5, 20)];
        let leo = 30;
        let at = |e| end_offset_for_epoch(&epochs, leo, e);
        // Same latest epoch, follower behind or level: fine.
        assert_eq!(leader_divergence(5, 25, at(5)), None);
        assert_eq!(leader_divergence(5, 30, at(5)), None);
        // Follower ahead of the leader in the leader's own latest epoch.
        assert_eq!(leader_divergence(5, 31, at(5)), Some((5, 30)));
        // Older epoch, follower inside it: fine; past its end: diverges.
        assert_eq!(leader_divergence(2, 20, at(2)), None);
        assert_eq!(leader_divergence(2, 21, at(2)), Some((2, 20)));
        // An epoch the leader never had (3, 4): its largest below is 2.
        assert_eq!(leader_divergence(3, 15, at(3)), Some((2, 20)));
        assert_eq!(leader_divergence(4, 20, at(4)), Some((2, 20)));
        // Newer than anything the leader has: UNDEFINED.
        assert_eq!(leader_divergence(6, 30, at(6)), Some((-1, -1)));
        // No epoch from the follower: nothing to check.
        assert_eq!(leader_divergence(-1, 30, at(-1)), None);
    }

    #[test]
    fn diverging_epoch_is_the_same_rule() {
        assert_eq!(
            diverging_epoch_truncation(&[(1, 0), (2, 5)], 8, 2, 1, 5),
            Truncation::TruncateTo(5)
        );
        assert_eq!(
            diverging_epoch_truncation(&[(1, 0), (3, 4)], 9, 3, 2, 6),
            Truncation::AskAgain {
                epoch: 1,
                truncate_to: 4
            }
        );
    }
}
