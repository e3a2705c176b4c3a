//! The leader side of one partition: follower progress, the high watermark and
//! ISR changes to propose.
//!
//! Invariants (checked by the tests and the property test):
//! - the leader is in the committed ISR, which only the controller changes
//!   (`on_isr_committed`);
//! - at most one ISR change is pending (sent as AlterPartition, not yet
//!   answered); the maximal ISR is the committed ISR plus the pending change's
//!   members (KIP-497): a pending expansion already counts for the high
//!   watermark, a pending shrink does not remove anyone until it commits;
//! - `high_watermark` never decreases, is never above the leader's durable log
//!   end, and never above the log end of a maximal-ISR member (a member that
//!   has not fetched yet holds it where it is).

use std::collections::BTreeMap;

use crate::epoch::{check_leader_epoch, leader_divergence};
use crate::{NodeId, ReplicationError, UNKNOWN_OFFSET};

/// The leader's settings (Kafka's names).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderConfig {
    /// `replica.lag.time.max.ms`: an ISR member not caught up for longer than
    /// this leaves the ISR.
    pub replica_lag_time_max_ms: u64,
    /// `min.insync.replicas`: the smallest ISR that accepts acks=all writes.
    pub min_insync_replicas: usize,
}

impl Default for LeaderConfig {
    fn default() -> Self {
        Self {
            replica_lag_time_max_ms: 30_000,
            min_insync_replicas: 1,
        }
    }
}

/// An ISR change to send to the controller (AlterPartition).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IsrChange {
    /// In replica order.
    pub new_isr: Vec<NodeId>,
    pub leader_epoch: i32,
    /// The partition epoch the change is based on (AlterPartition's
    /// `partition_epoch`); the controller refuses it if the epoch moved.
    pub partition_epoch: i32,
}

/// What a follower's fetch changed.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct FetchOutcome {
    /// The new high watermark, if it advanced.
    pub high_watermark: Option<i64>,
    /// An expansion to send as AlterPartition (now pending).
    pub expand: Option<IsrChange>,
    /// The follower's log diverges from the leader's: answer this (epoch,
    /// end offset) as Fetch's diverging epoch, with no records. Nothing of
    /// the fetch was recorded.
    pub diverging: Option<(i32, i64)>,
}

/// One follower fetch of one partition, as the leader sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FollowerFetch {
    pub follower: NodeId,
    /// The follower's log end (durable: it flushes before it reports).
    pub fetch_offset: i64,
    /// The epoch of the follower's last record (`-1`: its log has none).
    pub last_fetched_epoch: i32,
    /// The leader epoch the follower follows (`-1`: not given).
    pub current_leader_epoch: i32,
}

/// One follower's replication state, for metrics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FollowerLag {
    pub node_id: NodeId,
    /// `-1` until it fetched.
    pub log_end_offset: i64,
    /// Records behind the leader's log end (all of them if unknown).
    pub records_behind: i64,
    /// Milliseconds since it was last caught up.
    pub caught_up_ms_ago: u64,
    pub in_isr: bool,
}

/// What the leader knows of one follower (Kafka's `Replica` state).
#[derive(Clone, Debug)]
struct Follower {
    /// The follower's durable log end, as its last fetch said (`-1`: unknown).
    log_end_offset: i64,
    /// The last time it was caught up with the leader's log end.
    last_caught_up_ms: u64,
    /// The leader's log end and the time at its previous fetch: a follower that
    /// reaches the leader's log end as of its previous fetch was caught up then.
    last_fetch_leader_leo: i64,
    last_fetch_ms: u64,
}

/// The leader side of one partition.
#[derive(Clone, Debug)]
pub struct LeaderReplica {
    me: NodeId,
    replicas: Vec<NodeId>,
    /// Committed ISR, as the controller last said. Contains `me`.
    isr: Vec<NodeId>,
    leader_epoch: i32,
    partition_epoch: i32,
    /// The leader's own durable log end.
    local_leo: i64,
    /// The leader's log end as last seen (durable or not): `>= local_leo`.
    log_end_offset: i64,
    /// Where this leader epoch starts (the leader's log end when it took the
    /// leadership, which the caller records in its epoch cache): a follower
    /// must have fetched at or past it, without diverging, to join the ISR.
    epoch_start_offset: i64,
    /// `<= local_leo`; never decreases.
    high_watermark: i64,
    /// Every replica but `me`.
    followers: BTreeMap<NodeId, Follower>,
    pending: Option<IsrChange>,
    /// Replicas the controller would refuse in an ISR (fenced, shutting
    /// down): never proposed (KIP-841), however caught up they are.
    ineligible: Vec<NodeId>,
    config: LeaderConfig,
}

impl LeaderReplica {
    /// Becoming leader at `leader_epoch` with the committed replicas and ISR;
    /// `local_leo` is the leader's durable log end, `hw` the checkpointed high
    /// watermark (clamped to `local_leo`). Followers start with an unknown log
    /// end and `last_caught_up_ms = now_ms`: every ISR member gets a full lag
    /// window to fetch (Kafka does the same).
    ///
    /// `me` is added to the ISR if missing (the controller elects leaders from
    /// the ISR, so this only fixes a caller's slip) and to the replicas.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        me: NodeId,
        replicas: Vec<NodeId>,
        isr: Vec<NodeId>,
        leader_epoch: i32,
        partition_epoch: i32,
        local_leo: i64,
        hw: i64,
        now_ms: u64,
        config: LeaderConfig,
    ) -> Self {
        let mut replicas = dedup(replicas);
        if !replicas.contains(&me) {
            replicas.insert(0, me);
        }
        let mut isr: Vec<NodeId> = dedup(isr)
            .into_iter()
            .filter(|n| replicas.contains(n))
            .collect();
        if !isr.contains(&me) {
            isr.push(me);
        }
        let local_leo = local_leo.max(0);
        let followers = replicas
            .iter()
            .filter(|n| **n != me)
            .map(|n| {
                let follower = Follower {
                    log_end_offset: UNKNOWN_OFFSET,
                    last_caught_up_ms: now_ms,
                    last_fetch_leader_leo: local_leo,
                    last_fetch_ms: now_ms,
                };
                (*n, follower)
            })
            .collect();
        Self {
            me,
            replicas,
            isr,
            leader_epoch,
            partition_epoch,
            local_leo,
            log_end_offset: local_leo,
            epoch_start_offset: local_leo,
            high_watermark: hw.clamp(0, local_leo),
            followers,
            pending: None,
            ineligible: Vec::new(),
            config,
        }
    }

    /// The replicas the controller counts as fenced or shutting down, from the
    /// latest metadata: not proposed for the ISR until that changes (KIP-841;
    /// the controller would refuse them, and the leader would ask again at
    /// every fetch).
    pub fn set_ineligible(&mut self, nodes: Vec<NodeId>) {
        self.ineligible = nodes;
    }

    /// The controller committed a new replica set in this leader epoch (a
    /// reassignment adding replicas; one that removes any bumps the leader
    /// epoch, so a new `LeaderReplica` takes over instead). New followers
    /// start as in `new` (unknown log end, a full lag window); followers that
    /// are no longer replicas are forgotten. The ISR is unchanged here: it
    /// comes with `on_isr_committed`.
    pub fn set_replicas(&mut self, replicas: Vec<NodeId>, now_ms: u64) {
        let mut replicas = dedup(replicas);
        if !replicas.contains(&self.me) {
            replicas.insert(0, self.me);
        }
        self.followers.retain(|n, _| replicas.contains(n));
        for n in replicas.iter().filter(|n| **n != self.me) {
            self.followers.entry(*n).or_insert(Follower {
                log_end_offset: UNKNOWN_OFFSET,
                last_caught_up_ms: now_ms,
                last_fetch_leader_leo: self.local_leo,
                last_fetch_ms: now_ms,
            });
        }
        self.replicas = replicas;
    }

    /// This epoch's records start at `log_end_offset`, the leader's log end
    /// when it took the leadership (what the caller assigned in its epoch
    /// cache), when that is past the durable end given to `new` (a follower's
    /// last appends were not flushed yet).
    pub fn with_epoch_start_offset(mut self, log_end_offset: i64) -> Self {
        self.epoch_start_offset = self.epoch_start_offset.max(log_end_offset);
        self.log_end_offset = self.log_end_offset.max(log_end_offset);
        self
    }

    /// Where this leader epoch's records start.
    pub fn epoch_start_offset(&self) -> i64 {
        self.epoch_start_offset
    }

    pub fn high_watermark(&self) -> i64 {
        self.high_watermark
    }

    /// The committed ISR.
    pub fn isr(&self) -> &[NodeId] {
        &self.isr
    }

    pub fn replicas(&self) -> &[NodeId] {
        &self.replicas
    }

    /// The leader's own thread stood still for `stalled_ms` (the shrink
    /// timer woke that late: a starved CPU, a blocking call). Its followers'
    /// fetches waited unread meanwhile, so none of that time counts against
    /// them: each one's last caught-up time moves on by the stall, never
    /// past `now_ms` (as the controller excuses its own stalls from broker
    /// sessions). Without it a leader that stalls for the lag time shrinks
    /// its ISR to itself on waking, and acks=all stops until they rejoin.
    pub fn excuse_stall(&mut self, stalled_ms: u64, now_ms: u64) {
        for f in self.followers.values_mut() {
            f.last_caught_up_ms = f
                .last_caught_up_ms
                .saturating_add(stalled_ms)
                .min(now_ms)
                .max(f.last_caught_up_ms);
        }
    }

    /// Whether every other member of the maximal ISR fetched at this leader
    /// epoch and was caught up within the last `within_ms`: the replicas the
    /// controller could elect instead of this one are all still following
    /// it, so none of them leads yet. A node whose lease on its leaderships
    /// ran out (no heartbeat acknowledged: the controller is slow, electing,
    /// or cut off from it) keeps leading such a partition; one that is cut
    /// off from its followers, or whose successor stopped fetching, does
    /// not. Never true without another ISR member (nobody else to ask).
    /// Safety does not rest on it: the high watermark still waits for every
    /// member, so a deposed leader cannot acknowledge what its successor
    /// lacks.
    pub fn followed_within(&self, now_ms: u64, within_ms: u64) -> bool {
        let mut others = self
            .maximal_isr()
            .into_iter()
            .filter(|n| *n != self.me)
            .peekable();
        others.peek().is_some()
            && others.all(|n| {
                self.followers.get(&n).is_some_and(|f| {
                    f.log_end_offset != UNKNOWN_OFFSET
                        && now_ms.saturating_sub(f.last_caught_up_ms) <= within_ms
                })
            })
    }

    /// The committed ISR plus the members of a pending change (KIP-497's
    /// maximal ISR): the set the high watermark waits for while an
    /// AlterPartition is in flight. In replica order.
    pub fn maximal_isr(&self) -> Vec<NodeId> {
        let pending: &[NodeId] = self.pending.as_ref().map_or(&[], |p| &p.new_isr);
        self.replicas
            .iter()
            .copied()
            .filter(|n| self.isr.contains(n) || pending.contains(n))
            .collect()
    }

    pub fn leader_epoch(&self) -> i32 {
        self.leader_epoch
    }

    pub fn partition_epoch(&self) -> i32 {
        self.partition_epoch
    }

    /// The ISR change sent and not answered yet.
    pub fn pending(&self) -> Option<&IsrChange> {
        self.pending.as_ref()
    }

    /// A follower's last known log end (`-1`: unknown, `None`: not a follower).
    pub fn follower_log_end_offset(&self, follower: NodeId) -> Option<i64> {
        self.followers.get(&follower).map(|f| f.log_end_offset)
    }

    /// The leader's own log is durable up to `leo` (its next offset). Returns
    /// the new high watermark if it advanced. A smaller `leo` than before is
    /// ignored (a leader's durable log end only grows).
    pub fn on_local_durable(&mut self, leo: i64) -> Option<i64> {
        self.local_leo = self.local_leo.max(leo);
        self.log_end_offset = self.log_end_offset.max(self.local_leo);
        self.maybe_advance_high_watermark()
    }

    /// A follower's fetch (`fetch`: its log end, the epoch of its last
    /// record, the leader epoch it believes in); `epoch_end` is this leader's
    /// answer for `fetch.last_fetched_epoch` (Kafka's `endOffsetForEpoch`:
    /// the largest epoch `<=` it in the leader's log and where that epoch
    /// ends; `None` is UNDEFINED); `leader_leo` is the leader's log end at
    /// this moment (durable or not).
    ///
    /// In this order (Kafka's `Partition.fetchRecords` and
    /// `updateFollowerFetchState`):
    /// 1. The request's leader epoch must be this one (FENCED_LEADER_EPOCH /
    ///    UNKNOWN_LEADER_EPOCH), and the sender a follower replica.
    /// 2. KIP-101/KIP-595: if the follower's log diverges from this one
    ///    (`diverging`), the answer is the diverging epoch and nothing else:
    ///    the fetch offset is not recorded, counts for no high watermark, no
    ///    caught-up time and no ISR admission. The follower must truncate and
    ///    fetch again. This holds even when both logs end at the same offset.
    /// 3. The offset must be inside the leader's log (OFFSET_OUT_OF_RANGE).
    /// 4. Caught-up time (Kafka's `Replica.updateFetchState`): the follower
    ///    is caught up now if it reached `leader_leo`; otherwise, if it reached
    ///    the leader's log end as of its previous fetch, it was caught up then.
    /// 5. ISR admission: if no change is pending, a non-ISR replica that
    ///    fetched at this leader's current epoch (not `-1`), at or past the
    ///    high watermark and this epoch's start offset, is proposed for the ISR
    ///    (pending from now on, counting for the high watermark). Reaching the
    ///    epoch's start without diverging means it truncated against this
    ///    leader: its log is a prefix of the leader's up to its fetch offset.
    /// 6. The high watermark moves.
    pub fn on_follower_fetch(
        &mut self,
        fetch: FollowerFetch,
        epoch_end: Option<(i32, i64)>,
        leader_leo: i64,
        now_ms: u64,
    ) -> Result<FetchOutcome, ReplicationError> {
        check_leader_epoch(fetch.current_leader_epoch, self.leader_epoch)?;
        if !self.followers.contains_key(&fetch.follower) {
            return Err(ReplicationError::UnknownReplica(fetch.follower));
        }
        if let Some(diverging) =
            leader_divergence(fetch.last_fetched_epoch, fetch.fetch_offset, epoch_end)
        {
            return Ok(FetchOutcome {
                diverging: Some(diverging),
                ..FetchOutcome::default()
            });
        }
        let fetch_offset = fetch.fetch_offset;
        let leader_leo = leader_leo.max(self.local_leo);
        if fetch_offset < 0 || fetch_offset > leader_leo {
            return Err(ReplicationError::OffsetOutOfRange {
                offset: fetch_offset,
                log_end_offset: leader_leo,
            });
        }
        let Some(state) = self.followers.get_mut(&fetch.follower) else {
            return Err(ReplicationError::UnknownReplica(fetch.follower));
        };
        if fetch_offset >= leader_leo {
            state.last_caught_up_ms = state.last_caught_up_ms.max(now_ms);
        } else if fetch_offset >= state.last_fetch_leader_leo {
            state.last_caught_up_ms = state.last_caught_up_ms.max(state.last_fetch_ms);
        }
        state.last_fetch_leader_leo = leader_leo;
        state.last_fetch_ms = now_ms;
        state.log_end_offset = fetch_offset;
        self.log_end_offset = self.log_end_offset.max(leader_leo);

        let expand = if fetch.current_leader_epoch == self.leader_epoch {
            self.maybe_expand(fetch.follower, fetch_offset)
        } else {
            None
        };
        let high_watermark = self.maybe_advance_high_watermark();
        Ok(FetchOutcome {
            high_watermark,
            expand,
            diverging: None,
        })
    }

    fn maybe_expand(&mut self, follower: NodeId, fetch_offset: i64) -> Option<IsrChange> {
        let eligible = self.pending.is_none()
            && !self.isr.contains(&follower)
            && !self.ineligible.contains(&follower)
            && fetch_offset >= self.high_watermark
            && fetch_offset >= self.epoch_start_offset;
        if !eligible {
            return None;
        }
        let new_isr = self
            .replicas
            .iter()
            .copied()
            .filter(|n| self.isr.contains(n) || *n == follower)
            .collect();
        Some(self.propose(new_isr))
    }

    /// ISR members (other than the leader) behind the leader's log end and not
    /// caught up for more than `replica_lag_time_max_ms`: a shrink to propose
    /// (now pending). `None` while a change is pending or nobody lags. A member
    /// at the leader's log end is never out of sync, however long ago it fetched
    /// (Kafka: an idle partition keeps its ISR).
    pub fn maybe_shrink(&mut self, now_ms: u64) -> Option<IsrChange> {
        if self.pending.is_some() {
            return None;
        }
        let out_of_sync: Vec<NodeId> = self
            .isr
            .iter()
            .copied()
            .filter(|n| *n != self.me)
            .filter(|n| self.is_out_of_sync(*n, now_ms))
            .collect();
        if out_of_sync.is_empty() {
            return None;
        }
        let new_isr = self
            .replicas
            .iter()
            .copied()
            .filter(|n| self.isr.contains(n) && !out_of_sync.contains(n))
            .collect();
        Some(self.propose(new_isr))
    }

    fn is_out_of_sync(&self, follower: NodeId, now_ms: u64) -> bool {
        self.followers.get(&follower).is_some_and(|f| {
            f.log_end_offset < self.log_end_offset
                && now_ms.saturating_sub(f.last_caught_up_ms) > self.config.replica_lag_time_max_ms
        })
    }

    fn propose(&mut self, new_isr: Vec<NodeId>) -> IsrChange {
        let change = IsrChange {
            new_isr,
            leader_epoch: self.leader_epoch,
            partition_epoch: self.partition_epoch,
        };
        self.pending = Some(change.clone());
        change
    }

    /// The controller committed an ISR (the AlterPartition answer, or a
    /// partition change in the metadata log): it becomes the committed ISR, the
    /// pending change is cleared, and the high watermark may advance (returned
    /// if it did). An ISR with an older partition epoch than the current one is
    /// stale and ignored (`Ok(None)`). An ISR without this leader, with a
    /// non-replica or a duplicate is refused: the node must re-read the metadata
    /// (this leader has likely been replaced).
    pub fn on_isr_committed(
        &mut self,
        isr: Vec<NodeId>,
        partition_epoch: i32,
    ) -> Result<Option<i64>, ReplicationError> {
        if partition_epoch < self.partition_epoch {
            return Ok(None);
        }
        let reason = if !isr.contains(&self.me) {
            Some("the leader is not in it")
        } else if isr.iter().any(|n| !self.replicas.contains(n)) {
            Some("a member is not a replica")
        } else if dedup(isr.clone()).len() != isr.len() {
            Some("a member appears twice")
        } else {
            None
        };
        if let Some(reason) = reason {
            return Err(ReplicationError::InvalidIsr { isr, reason });
        }
        self.isr = isr;
        self.partition_epoch = partition_epoch;
        self.pending = None;
        Ok(self.maybe_advance_high_watermark())
    }

    /// The AlterPartition failed (stale epochs, refused by the controller): the
    /// pending change is dropped. If it was an expansion whose new member held
    /// the high watermark, the high watermark may now advance (returned).
    pub fn on_isr_change_failed(&mut self) -> Option<i64> {
        self.pending = None;
        self.maybe_advance_high_watermark()
    }

    /// acks=all admission before the append: NOT_ENOUGH_REPLICAS when the
    /// committed ISR is smaller than `min.insync.replicas`.
    pub fn check_acks_all(&self) -> Result<(), ReplicationError> {
        self.check_isr_size()
            .map_err(|(isr, min)| ReplicationError::NotEnoughReplicas { isr, min })
    }

    /// acks=all after the records reached the high watermark:
    /// NOT_ENOUGH_REPLICAS_AFTER_APPEND if the committed ISR shrank below
    /// `min.insync.replicas` meanwhile (Kafka's `checkEnoughReplicasReachOffset`).
    pub fn check_after_append(&self) -> Result<(), ReplicationError> {
        self.check_isr_size()
            .map_err(|(isr, min)| ReplicationError::NotEnoughReplicasAfterAppend { isr, min })
    }

    fn check_isr_size(&self) -> Result<(), (usize, usize)> {
        let min = self.config.min_insync_replicas;
        if self.isr.len() < min {
            Err((self.isr.len(), min))
        } else {
            Ok(())
        }
    }

    /// Per follower, in id order: its log end, records behind `leader_leo`,
    /// milliseconds since it was caught up, ISR membership.
    pub fn follower_lag(&self, leader_leo: i64, now_ms: u64) -> Vec<FollowerLag> {
        self.followers
            .iter()
            .map(|(id, f)| FollowerLag {
                node_id: *id,
                log_end_offset: f.log_end_offset,
                records_behind: (leader_leo - f.log_end_offset.max(0)).max(0),
                caught_up_ms_ago: now_ms.saturating_sub(f.last_caught_up_ms),
                in_isr: self.isr.contains(id),
            })
            .collect()
    }

    /// HW = min over the maximal ISR of each member's log end (the leader's own
    /// durable log end for itself); moves only forward.
    fn maybe_advance_high_watermark(&mut self) -> Option<i64> {
        let candidate = self
            .maximal_isr()
            .into_iter()
            .filter(|n| *n != self.me)
            .map(|n| {
                self.followers
                    .get(&n)
                    .map_or(UNKNOWN_OFFSET, |f| f.log_end_offset)
            })
            .fold(self.local_leo, i64::min);
        if candidate > self.high_watermark {
            self.high_watermark = candidate;
            Some(candidate)
        } else {
            None
        }
    }
}

fn dedup(nodes: Vec<NodeId>) -> Vec<NodeId> {
    let mut out = Vec::with_capacity(nodes.len());
    for n in nodes {
        if !out.contains(&n) {
            out.push(n);
        }
    }
    out
}

#[cfg(test)]
#[path = "leader_tests.rs"]
mod tests;
