//! The follower side of one partition: truncate against the new leader, then
//! fetch.

use crate::{NodeId, ReplicationError, Truncation};

/// Where a follower is with its leader.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FollowerState {
    /// Must learn where its log diverges before fetching: send
    /// OffsetsForLeaderEpoch for `epoch` and pass the answer to `truncation`.
    Truncating { epoch: i32 },
    /// The log has records but no leader-epoch cache (lost checkpoint): no
    /// epoch to ask about, so Kafka's fallback: truncate to the local high
    /// watermark (`on_truncation(Truncation::TruncateToHighWatermark, hw)`).
    TruncatingToHighWatermark,
    /// Fetching from `offset` (the local log end).
    Fetching { offset: i64 },
}

/// The follower side of one partition, for one leader epoch (a new leader or
/// epoch makes a new `FollowerReplica`).
#[derive(Clone, Debug)]
pub struct FollowerReplica {
    leader: NodeId,
    leader_epoch: i32,
    state: FollowerState,
}

impl FollowerReplica {
    /// Following `leader` at `leader_epoch` with a local log ending at
    /// `local_leo` whose latest cached epoch is `local_latest_epoch`. An empty
    /// log fetches from 0 at once; otherwise the follower first asks the leader
    /// about its latest epoch (KIP-101), or truncates to its high watermark if
    /// it has no epoch.
    pub fn new(
        leader: NodeId,
        leader_epoch: i32,
        local_leo: i64,
        local_latest_epoch: Option<i32>,
    ) -> Self {
        let state = match local_latest_epoch {
            _ if local_leo <= 0 => FollowerState::Fetching { offset: 0 },
            Some(epoch) => FollowerState::Truncating { epoch },
            None => FollowerState::TruncatingToHighWatermark,
        };
        Self {
            leader,
            leader_epoch,
            state,
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

    /// The offset to fetch from, once fetching.
    pub fn fetch_offset(&self) -> Option<i64> {
        match self.state {
            FollowerState::Fetching { offset } => Some(offset),
            _ => None,
        }
    }

    /// Applies a `truncation` decision; returns the offset the caller must
    /// truncate its log (and epoch cache) to before anything else. After
    /// `TruncateTo` or `TruncateToHighWatermark` the follower fetches from that
    /// offset; after `AskAgain` it asks again about the smaller epoch.
    /// `local_high_watermark` is only used by `TruncateToHighWatermark`.
    pub fn on_truncation(
        &mut self,
        result: Truncation,
        local_high_watermark: i64,
    ) -> Result<i64, ReplicationError> {
        if matches!(self.state, FollowerState::Fetching { .. }) {
            return Err(ReplicationError::InvalidState(
                "truncation result while fetching",
            ));
        }
        let (state, truncate_to) = match result {
            Truncation::TruncateTo(offset) => (FollowerState::Fetching { offset }, offset),
            Truncation::TruncateToHighWatermark => (
                FollowerState::Fetching {
                    offset: local_high_watermark,
                },
                local_high_watermark,
            ),
            Truncation::AskAgain { epoch, truncate_to } => {
                (FollowerState::Truncating { epoch }, truncate_to)
            }
        };
        self.state = state;
        Ok(truncate_to)
    }

    /// The fetched records are in the local log, which now ends at `new_leo`:
    /// the next fetch starts there. A log end behind the fetch offset is
    /// refused (followers only move forward between truncations).
    pub fn on_fetched(&mut self, new_leo: i64) -> Result<(), ReplicationError> {
        match self.state {
            FollowerState::Fetching { offset } if new_leo >= offset => {
                self.state = FollowerState::Fetching { offset: new_leo };
                Ok(())
            }
            FollowerState::Fetching { .. } => Err(ReplicationError::InvalidState(
                "fetched log end behind the fetch offset",
            )),
            _ => Err(ReplicationError::InvalidState("fetched while truncating")),
        }
    }

    /// The follower's high watermark: the leader's, bounded by what is durable
    /// here (a follower never exposes records it does not hold).
    pub fn local_high_watermark(&self, leader_hw: i64, local_durable_leo: i64) -> i64 {
        leader_hw.min(local_durable_leo)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::truncation;

    #[test]
    fn empty_log_fetches_from_zero() {
        let f = FollowerReplica::new(1, 4, 0, None);
        assert_eq!(f.state(), FollowerState::Fetching { offset: 0 });
        assert_eq!(f.fetch_offset(), Some(0));
        assert_eq!((f.leader(), f.leader_epoch()), (1, 4));
        // An empty log with an epoch cache entry (truncated to nothing) too.
        let f = FollowerReplica::new(1, 4, 0, Some(2));
        assert_eq!(f.fetch_offset(), Some(0));
    }

    #[test]
    fn truncates_then_fetches() {
        let epochs = [(1, 0), (3, 4)];
        let mut f = FollowerReplica::new(2, 5, 9, Some(3));
        assert_eq!(f.state(), FollowerState::Truncating { epoch: 3 });
        assert_eq!(f.fetch_offset(), None);
        assert!(f.on_fetched(10).is_err());

        let first = truncation(&epochs, 9, 3, Some((2, 6)));
        assert_eq!(f.on_truncation(first, 0).unwrap(), 4);
        assert_eq!(f.state(), FollowerState::Truncating { epoch: 1 });

        let second = truncation(&[(1, 0)], 4, 1, Some((1, 3)));
        assert_eq!(f.on_truncation(second, 0).unwrap(), 3);
        assert_eq!(f.fetch_offset(), Some(3));
        assert!(f.on_truncation(second, 0).is_err());

        f.on_fetched(7).unwrap();
        assert_eq!(f.fetch_offset(), Some(7));
        assert!(f.on_fetched(6).is_err());
        assert_eq!(f.fetch_offset(), Some(7));
    }

    #[test]
    fn no_epoch_cache_truncates_to_high_watermark() {
        let mut f = FollowerReplica::new(2, 5, 9, None);
        assert_eq!(f.state(), FollowerState::TruncatingToHighWatermark);
        assert_eq!(
            f.on_truncation(Truncation::TruncateToHighWatermark, 6)
                .unwrap(),
            6
        );
        assert_eq!(f.fetch_offset(), Some(6));
    }

    #[test]
    fn follower_high_watermark_is_bounded_by_local_log() {
        let f = FollowerReplica::new(2, 5, 0, None);
        assert_eq!(f.local_high_watermark(10, 7), 7);
        assert_eq!(f.local_high_watermark(5, 7), 5);
    }
}
