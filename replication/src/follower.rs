//! The follower side of one partition: where to fetch from, what to do with
//! a fetch response, and when a fetched batch may be appended.
//!
//! The rules (KIP-101, KIP-279, KIP-595's truncation on fetch; Kafka's
//! `AbstractFetcherThread` and `Log.appendAsFollower`):
//! - One offset for the fetch and for the divergence check: the local log
//!   end. The fetch carries the epoch of the last record in the log, and the
//!   leader compares the two with its own epoch history
//!   (`epoch::leader_divergence`); a follower that diverges gets a diverging
//!   epoch and cuts its log (`on_diverging`) before it gets any record.
//! - The log end the follower reports must be durable (acks=all counts it),
//!   so a log end past the durable end (a former leader's last appends, not
//!   yet flushed) is made durable before the fetch is sent: those records are
//!   kept only if the leader's log agrees with them, never counted before.
//! - A response is applied only to the log it was asked for: the follower
//!   still follows the same leader epoch and its log still ends at the fetch
//!   offset. Anything else is a stale answer and is dropped.
//! - A fetched batch is appended at or past the log end (past it only when
//!   the leader's compaction removed offsets), or not at all: a batch below
//!   the log end is never skipped as "already held" on its offsets alone,
//!   since the same offsets may hold other records here.

use crate::epoch::{diverging_epoch_truncation, Truncation};
use crate::{NodeId, ReplicationError, NO_EPOCH};

/// Where a follower is with its leader.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FollowerState {
    /// The log has records but no leader-epoch history (a lost checkpoint):
    /// there is no epoch the leader could check, so Kafka's fallback: cut to
    /// the local high watermark before the first fetch.
    TruncatingToHighWatermark,
    /// Fetching from the local log end.
    Fetching,
}

/// What a follower's log looks like now (read under one lock).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalLog {
    pub log_start_offset: i64,
    pub log_end_offset: i64,
    /// What a crash cannot take away (flushed, under flush-before-ack).
    pub durable_end_offset: i64,
    /// The epoch of the last record (the latest cached epoch), if any.
    pub latest_epoch: Option<i32>,
}

/// A fetch position: the local log end and the epoch of its last record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FetchPosition {
    pub fetch_offset: i64,
    pub last_fetched_epoch: i32,
}

/// What the follower must do before its next fetch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NextFetch {
    /// Cut the log to the local high watermark, then call
    /// `on_truncated_to_high_watermark`.
    TruncateToHighWatermark,
    /// Make the log durable up to this offset (its end) first.
    FlushTo(i64),
    /// Fetch from here.
    Fetch(FetchPosition),
}

/// What to do with one fetched batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FetchedBatch {
    /// Append it (with the leader's offsets).
    Append,
    /// The local log is empty and starts inside this batch (the leader's
    /// DeleteRecords moved its log start there): start the log over at the
    /// batch's base offset, then append it (Kafka's handling of
    /// `UnexpectedAppendOffsetException`).
    StartOverAt(i64),
    /// The log no longer ends where the answer continues (cut since the
    /// fetch was sent): drop this batch and the rest of the answer; the next
    /// fetch asks from the new end.
    Stale,
}

/// The follower side of one partition, for one leader epoch (a new leader or
/// epoch makes a new `FollowerReplica`).
#[derive(Clone, Debug)]
pub struct FollowerReplica {
    leader: NodeId,
    leader_epoch: i32,
    state: FollowerState,
    /// The fetch sent and not answered yet.
    in_flight: Option<FetchPosition>,
}

impl FollowerReplica {
    /// Following `leader` at `leader_epoch` with `log` as it is now. A log
    /// with records but no epoch history truncates to its high watermark
    /// first; any other fetches from its end (an empty log from its start).
    pub fn new(leader: NodeId, leader_epoch: i32, log: LocalLog) -> Self {
        let has_records = log.log_end_offset > log.log_start_offset;
        let state = if has_records && log.latest_epoch.is_none() {
            FollowerState::TruncatingToHighWatermark
        } else {
            FollowerState::Fetching
        };
        Self {
            leader,
            leader_epoch,
            state,
            in_flight: None,
        }
    }

    pub fn leader(&self) -> NodeId {
        self.leader
    }

    pub fn leader_epoch(&self) -> i32 {
        self.leader_epoch
    }

    pub fn state(&self) -> FollowerState {
        self.state
    }

    /// The fetch sent and not answered yet.
    pub fn in_flight(&self) -> Option<FetchPosition> {
        self.in_flight
    }

    /// What to do before the next fetch, given the log as it is now.
    pub fn next_fetch(&self, log: LocalLog) -> NextFetch {
        if self.state == FollowerState::TruncatingToHighWatermark {
            return NextFetch::TruncateToHighWatermark;
        }
        if log.durable_end_offset < log.log_end_offset {
            return NextFetch::FlushTo(log.log_end_offset);
        }
        NextFetch::Fetch(FetchPosition {
            fetch_offset: log.log_end_offset,
            last_fetched_epoch: log.latest_epoch.unwrap_or(NO_EPOCH),
        })
    }

    /// The log was cut to the local high watermark: fetch from its end.
    pub fn on_truncated_to_high_watermark(&mut self) {
        self.state = FollowerState::Fetching;
    }

    /// A fetch at `position` (from `next_fetch`) was sent.
    pub fn on_sent(&mut self, position: FetchPosition) {
        self.in_flight = Some(position);
    }

    /// The answer to the fetch in flight arrived; the log now ends at
    /// `log_end_offset`. Returns the position it answers if it may be applied,
    /// `None` if it is stale (nothing in flight, or the log moved since it
    /// was sent): drop it and fetch again.
    pub fn on_response(&mut self, log_end_offset: i64) -> Option<FetchPosition> {
        self.in_flight
            .take()
            .filter(|sent| sent.fetch_offset == log_end_offset)
    }

    /// The leader answered a diverging epoch for the fetch at `sent`: where
    /// to cut the log (`local_epochs` and `local_leo` as they are now,
    /// `local_high_watermark` for an UNDEFINED answer). A cut at or past the
    /// log end cuts nothing. The next fetch, from the new end with the epoch
    /// of the new last record, asks the leader again: Kafka's rounds of
    /// OffsetsForLeaderEpoch, each about a strictly smaller epoch.
    pub fn on_diverging(
        &self,
        sent: FetchPosition,
        local_epochs: &[(i32, i64)],
        local_leo: i64,
        diverging: (i32, i64),
        local_high_watermark: i64,
    ) -> i64 {
        let cut = match diverging_epoch_truncation(
            local_epochs,
            local_leo,
            sent.last_fetched_epoch,
            diverging.0,
            diverging.1,
        ) {
            Truncation::TruncateTo(offset) => offset,
            Truncation::AskAgain { truncate_to, .. } => truncate_to,
            Truncation::TruncateToHighWatermark => local_high_watermark,
        };
        cut.min(local_leo)
    }

    /// The follower's high watermark: the leader's, bounded by what is durable
    /// here (a follower never exposes records it does not hold).
    pub fn local_high_watermark(&self, leader_hw: i64, local_durable_leo: i64) -> i64 {
        leader_hw.min(local_durable_leo)
    }
}

/// May a fetched batch `[base_offset, next_offset)` be appended to a log
/// `[log_start_offset, log_end_offset)`? `fetched_for` is the log end the
/// answer continues: the fetch offset it was asked for, then the end after
/// each batch appended from it.
///
/// A log that no longer ends there was cut meanwhile by someone else (a
/// corruption repair, a truncation): the rest of the answer is `Stale` and
/// dropped, never appended past the cut (nemesis seed 10001 left a hole of
/// 70,973 offsets that way, and the replica later led). Otherwise: at or
/// past the end, append; an empty log whose start is inside the batch, start
/// over at its base. Anything else is a batch this log cannot take
/// (`NonContiguousFetch`): the response does not continue this log, and the
/// follower must not guess which records it holds.
///
/// The check and the append are apart in time (the append waits for the
/// log); the storage makes the same check again under the log's lock.
pub fn check_fetched_batch(
    fetched_for: i64,
    log_start_offset: i64,
    log_end_offset: i64,
    base_offset: i64,
    next_offset: i64,
) -> Result<FetchedBatch, ReplicationError> {
    if log_end_offset != fetched_for {
        return Ok(FetchedBatch::Stale);
    }
    if base_offset >= log_end_offset {
        return Ok(FetchedBatch::Append);
    }
    let empty = log_start_offset == log_end_offset;
    if empty && next_offset > log_end_offset {
        return Ok(FetchedBatch::StartOverAt(base_offset));
    }
    Err(ReplicationError::NonContiguousFetch {
        base_offset,
        next_offset,
        log_end_offset,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn log(start: i64, end: i64, durable: i64, latest_epoch: Option<i32>) -> LocalLog {
        LocalLog {
            log_start_offset: start,
            log_end_offset: end,
            durable_end_offset: durable,
            latest_epoch,
        }
    }

    #[test]
    fn fetches_from_the_log_end_with_the_last_epoch() {
        let f = FollowerReplica::new(1, 4, log(0, 0, 0, None));
        assert_eq!((f.leader(), f.leader_epoch()), (1, 4));
        assert_eq!(f.state(), FollowerState::Fetching);
        assert_eq!(
            f.next_fetch(log(0, 0, 0, None)),
            NextFetch::Fetch(FetchPosition {
                fetch_offset: 0,
                last_fetched_epoch: -1
            })
        );
        let f = FollowerReplica::new(1, 4, log(0, 9, 9, Some(3)));
        assert_eq!(
            f.next_fetch(log(0, 9, 9, Some(3))),
            NextFetch::Fetch(FetchPosition {
                fetch_offset: 9,
                last_fetched_epoch: 3
            })
        );
    }

    /// Issue 19: a former leader's unflushed tail is not skipped by fetching
    /// from the durable end; it is made durable and fetched from the log end,
    /// where the leader's epoch check sees it.
    #[test]
    fn an_unflushed_tail_is_flushed_before_the_fetch() {
        let f = FollowerReplica::new(1, 1, log(0, 1760, 1754, Some(0)));
        assert_eq!(
            f.next_fetch(log(0, 1760, 1754, Some(0))),
            NextFetch::FlushTo(1760)
        );
        assert_eq!(
            f.next_fetch(log(0, 1760, 1760, Some(0))),
            NextFetch::Fetch(FetchPosition {
                fetch_offset: 1760,
                last_fetched_epoch: 0
            })
        );
    }

    #[test]
    fn records_without_epochs_truncate_to_the_high_watermark_first() {
        let mut f = FollowerReplica::new(2, 5, log(0, 9, 9, None));
        assert_eq!(f.state(), FollowerState::TruncatingToHighWatermark);
        assert_eq!(
            f.next_fetch(log(0, 9, 9, None)),
            NextFetch::TruncateToHighWatermark
        );
        f.on_truncated_to_high_watermark();
        assert_eq!(
            f.next_fetch(log(0, 6, 6, None)),
            NextFetch::Fetch(FetchPosition {
                fetch_offset: 6,
                last_fetched_epoch: -1
            })
        );
        // An empty log (or one whose records all went) needs no truncation.
        let f = FollowerReplica::new(2, 5, log(7, 7, 7, None));
        assert_eq!(f.state(), FollowerState::Fetching);
    }

    #[test]
    fn stale_responses_are_dropped() {
        let mut f = FollowerReplica::new(2, 5, log(0, 9, 9, Some(3)));
        assert_eq!(f.on_response(9), None, "nothing in flight");
        let sent = FetchPosition {
            fetch_offset: 9,
            last_fetched_epoch: 3,
        };
        f.on_sent(sent);
        assert_eq!(f.in_flight(), Some(sent));
        assert_eq!(f.on_response(9), Some(sent));
        assert_eq!(f.on_response(9), None, "answered once");
        f.on_sent(sent);
        assert_eq!(f.on_response(7), None, "the log was cut meanwhile");
    }

    #[test]
    fn diverging_answers_cut_the_log() {
        let f = FollowerReplica::new(2, 5, log(0, 1760, 1760, Some(0)));
        let sent = FetchPosition {
            fetch_offset: 1760,
            last_fetched_epoch: 0,
        };
        assert_eq!(f.on_diverging(sent, &[(0, 0)], 1760, (0, 1754), 1700), 1754);
        // An epoch the follower does not have: cut where its smaller one ends.
        let sent = FetchPosition {
            fetch_offset: 9,
            last_fetched_epoch: 3,
        };
        assert_eq!(f.on_diverging(sent, &[(1, 0), (3, 4)], 9, (2, 6), 0), 4);
        // UNDEFINED: the local high watermark.
        assert_eq!(f.on_diverging(sent, &[(1, 0), (3, 4)], 9, (-1, -1), 2), 2);
        // Never past the log end.
        assert_eq!(f.on_diverging(sent, &[(1, 0), (3, 4)], 9, (3, 12), 0), 9);
    }

    #[test]
    fn fetched_batches_go_at_or_past_the_log_end_only() {
        assert_eq!(
            check_fetched_batch(10, 0, 10, 10, 15),
            Ok(FetchedBatch::Append)
        );
        // A gap left by the leader's compaction.
        assert_eq!(
            check_fetched_batch(10, 0, 10, 12, 15),
            Ok(FetchedBatch::Append)
        );
        // Issue 19: a batch at offsets this log already has is not "already
        // held": the records there may differ.
        assert!(check_fetched_batch(10, 0, 10, 4, 10).is_err());
        assert!(check_fetched_batch(10, 0, 10, 8, 12).is_err());
        // An empty log starting inside the batch starts over at its base.
        assert_eq!(
            check_fetched_batch(7, 7, 7, 5, 9),
            Ok(FetchedBatch::StartOverAt(5))
        );
        assert!(check_fetched_batch(7, 7, 7, 3, 7).is_err());
    }

    /// Nemesis seed 10001: an answer fetched from offset 374,118 was checked,
    /// then waited for the log while a corruption repair cut it to 303,145;
    /// appended there, it left a hole the replica later served as leader.
    /// An answer applies only to the log end it was fetched for, whatever
    /// its batches' offsets.
    #[test]
    fn a_log_cut_since_the_fetch_takes_nothing_from_its_answer() {
        // Cut below the fetch offset: the batch is past the new end, which
        // alone would say "append".
        assert_eq!(
            check_fetched_batch(374_118, 0, 303_145, 374_118, 374_187),
            Ok(FetchedBatch::Stale)
        );
        // Cut below a batch of the answer already appended.
        assert_eq!(
            check_fetched_batch(374_187, 0, 374_150, 374_187, 374_257),
            Ok(FetchedBatch::Stale)
        );
        // Grown meanwhile (another answer applied): stale too, not a
        // non-contiguous batch.
        assert_eq!(
            check_fetched_batch(10, 0, 15, 10, 15),
            Ok(FetchedBatch::Stale)
        );
        // An empty log started over elsewhere: not this answer's log.
        assert_eq!(check_fetched_batch(7, 9, 9, 5, 12), Ok(FetchedBatch::Stale));
    }

    #[test]
    fn follower_high_watermark_is_bounded_by_local_log() {
        let f = FollowerReplica::new(2, 5, log(0, 0, 0, None));
        assert_eq!(f.local_high_watermark(10, 7), 7);
        assert_eq!(f.local_high_watermark(5, 7), 5);
    }
}
