//! How late the active controller answers this voter, and what a follower
//! does about a leader that answers too late (sans-I/O: the caller passes
//! the clock).
//!
//! Raft replaces a leader that goes silent (election timeout, check-quorum),
//! but not one whose messages and answers still arrive, seconds late: a
//! controller whose outbound link queues (a slow or saturated NIC, a
//! shaped link) keeps its quorum while every broker's heartbeat attempt
//! times out on it, so every broker's lease runs out and every partition
//! steps down at once (seen in the nemesis: seed 9101 cycle 423, `slow` on
//! the active controller, 9-11 s without an acknowledged write on every
//! partition). So each follower probes the leader (a `Ping` on its own
//! connection, answered on the leader's outbound link like every answer a
//! broker waits for) and keeps the round trip here. A follower that sees the
//! leader lag past `max` for `persist` starts an election; a voter asked for
//! its vote ignores Raft's leader lease only while it sees the same lag
//! itself, so one confused follower cannot depose a healthy leader (pre-vote
//! still needs a majority).

use std::time::{Duration, Instant};

/// The probe's view of one leader.
#[derive(Debug, Clone, Default)]
pub struct LeaderLag {
    /// The leader the figures below are about.
    leader: Option<u64>,
    /// The probe in flight and when it was sent.
    outstanding: Option<Instant>,
    /// The last answered probe's round trip.
    last_rtt: Duration,
    /// Since when every observation saw the lag past `max`.
    lagging_since: Option<Instant>,
    /// When this member last started an election over the lag.
    campaigned: Option<Instant>,
}

impl LeaderLag {
    /// A probe to `leader` went out at `now` (a new leader starts afresh).
    pub fn sent(&mut self, leader: u64, now: Instant) {
        if self.leader != Some(leader) {
            *self = Self {
                campaigned: self.campaigned,
                ..Self::default()
            };
            self.leader = Some(leader);
        }
        self.outstanding = Some(now);
    }

    /// The probe in flight to `leader` was answered at `now`.
    pub fn answered(&mut self, leader: u64, now: Instant) {
        if self.leader != Some(leader) {
            return;
        }
        if let Some(sent) = self.outstanding.take() {
            self.last_rtt = now.saturating_duration_since(sent);
        }
    }

    /// The probe failed (connection lost, refused): no figure for it. A
    /// leader that cannot be reached at all is Raft's business (election
    /// timeout), not this rule's.
    pub fn failed(&mut self, leader: u64) {
        if self.leader == Some(leader) {
            self.outstanding = None;
        }
    }

    /// How late `leader` answers, as of `now`: the last round trip, or the
    /// age of the probe still in flight if that is longer. Zero for a leader
    /// the probe has no figure for.
    pub fn lag(&self, leader: u64, now: Instant) -> Duration {
        if self.leader != Some(leader) {
            return Duration::ZERO;
        }
        let waiting = self
            .outstanding
            .map(|sent| now.saturating_duration_since(sent))
            .unwrap_or_default();
        self.last_rtt.max(waiting)
    }

    /// Takes one observation (each controller tick) and says whether this
    /// follower should start an election now: `leader` has lagged past
    /// `max` at every observation for at least `persist` (so one late wake
    /// of this member's own thread is not taken for the leader's lag), and
    /// this member has not started one over the lag within `cooldown`.
    pub fn observe(
        &mut self,
        leader: u64,
        now: Instant,
        max: Duration,
        persist: Duration,
        cooldown: Duration,
    ) -> bool {
        if self.lag(leader, now) <= max {
            self.lagging_since = None;
            return false;
        }
        let since = *self.lagging_since.get_or_insert(now);
        let cooled = self
            .campaigned
            .is_none_or(|at| now.saturating_duration_since(at) >= cooldown);
        if now.saturating_duration_since(since) >= persist && cooled {
            self.campaigned = Some(now);
            return true;
        }
        false
    }

    /// Whether a vote request may override Raft's leader lease: this member
    /// itself sees `leader` lag past `max`.
    pub fn lagging(&self, leader: u64, now: Instant, max: Duration) -> bool {
        self.lag(leader, now) > max
    }
}

/// How much longer than the others this member waits before it campaigns
/// over a lagging `leader`: `step` times its rank among the other voters
/// (by id). Every follower sees a slow leader at the same moment; campaigning
/// together splits the vote (each votes for itself) and costs a round per
/// try, as nemesis seed 9701 cycle 120 showed (two split rounds, ~4 s, while
/// every broker's lease ran out). Staggered, the first candidate asks the
/// others while they are still followers, and they vote for it.
pub fn campaign_stagger(me: u64, leader: u64, voters: &[u64], step: Duration) -> Duration {
    let mut others: Vec<u64> = voters.iter().copied().filter(|v| *v != leader).collect();
    others.sort_unstable();
    others.dedup();
    let rank = others.iter().position(|v| *v == me).unwrap_or(0);
    step * u32::try_from(rank).unwrap_or(u32::MAX)
}

/// The lag a leader may show before its followers replace it: a quarter of
/// the broker session. Brokers give one controller a third of the session
/// per heartbeat attempt, and a broker whose heartbeats go unanswered for a
/// session steps down from its leaderships, so the election must be over
/// well before either.
pub fn max_lag(session_timeout_ms: u64) -> Duration {
    Duration::from_millis(session_timeout_ms / 4)
}

#[cfg(test)]
mod stagger_tests {
    use super::*;

    #[test]
    fn followers_of_a_lagging_leader_campaign_one_after_another() {
        let step = Duration::from_millis(300);
        let voters = [3, 1, 2];
        // Leader 1: followers 2 and 3 go at 0 and 300 ms.
        assert_eq!(campaign_stagger(2, 1, &voters, step), Duration::ZERO);
        assert_eq!(campaign_stagger(3, 1, &voters, step), step);
        // Leader 2: 1 first, then 3.
        assert_eq!(campaign_stagger(1, 2, &voters, step), Duration::ZERO);
        assert_eq!(campaign_stagger(3, 2, &voters, step), step);
        // Five voters: ranks 0..3 among the four followers.
        let five = [1, 2, 3, 4, 5];
        let delays: Vec<_> = [1, 2, 4, 5]
            .iter()
            .map(|me| campaign_stagger(*me, 3, &five, step))
            .collect();
        assert_eq!(delays, [Duration::ZERO, step, step * 2, step * 3]);
        // Not a voter (or the leader itself): no extra wait.
        assert_eq!(campaign_stagger(9, 1, &voters, step), Duration::ZERO);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: Duration = Duration::from_millis(750);
    const PERSIST: Duration = Duration::from_millis(200);
    const COOLDOWN: Duration = Duration::from_secs(2);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn prompt_answers_never_start_an_election() {
        let t0 = Instant::now();
        let mut lag = LeaderLag::default();
        for i in 0..100 {
            let now = t0 + ms(100 * i);
            lag.sent(1, now);
            lag.answered(1, now + ms(5));
            assert!(!lag.observe(1, now + ms(50), MAX, PERSIST, COOLDOWN));
            assert!(!lag.lagging(1, now + ms(50), MAX));
        }
    }

    #[test]
    fn a_probe_in_flight_past_the_bound_counts_before_it_is_answered() {
        let t0 = Instant::now();
        let mut lag = LeaderLag::default();
        lag.sent(1, t0);
        assert!(!lag.lagging(1, t0 + ms(700), MAX));
        assert!(lag.lagging(1, t0 + ms(800), MAX));
        assert_eq!(lag.lag(1, t0 + ms(900)), ms(900));
        // Answered late: the round trip stays the figure until the next.
        lag.answered(1, t0 + ms(1_000));
        assert_eq!(lag.lag(1, t0 + ms(5_000)), ms(1_000));
        lag.sent(1, t0 + ms(5_000));
        lag.answered(1, t0 + ms(5_010));
        assert_eq!(lag.lag(1, t0 + ms(5_020)), ms(10));
    }

    #[test]
    fn a_lag_that_lasts_starts_one_election_per_cooldown() {
        let t0 = Instant::now();
        let mut lag = LeaderLag::default();
        lag.sent(1, t0);
        let mut elections = Vec::new();
        for tick in 0..60u64 {
            let now = t0 + ms(100 * tick);
            if lag.observe(1, now, MAX, PERSIST, COOLDOWN) {
                elections.push(100 * tick);
            }
        }
        // First past the bound at 800 ms, still past it 200 ms later; then
        // once per cooldown.
        assert_eq!(elections, vec![1_000, 3_000, 5_000]);
    }

    #[test]
    fn one_late_observation_does_not_start_an_election() {
        // This member's own thread stood still for a second: the answer
        // sat in its socket; the next turn reads it.
        let t0 = Instant::now();
        let mut lag = LeaderLag::default();
        lag.sent(1, t0);
        assert!(!lag.observe(1, t0 + ms(1_100), MAX, PERSIST, COOLDOWN));
        lag.answered(1, t0 + ms(1_105));
        lag.sent(1, t0 + ms(1_150));
        lag.answered(1, t0 + ms(1_152));
        // The round trip it took counts, but the next probe's figure
        // replaces it.
        assert!(!lag.observe(1, t0 + ms(1_200), MAX, PERSIST, COOLDOWN));
        assert!(!lag.observe(1, t0 + ms(1_400), MAX, PERSIST, COOLDOWN));
    }

    #[test]
    fn figures_are_per_leader() {
        let t0 = Instant::now();
        let mut lag = LeaderLag::default();
        lag.sent(1, t0);
        assert!(lag.lagging(1, t0 + ms(2_000), MAX));
        // A new leader: nothing known of it yet; the old one's late answer
        // does not count against it.
        assert!(!lag.lagging(2, t0 + ms(2_000), MAX));
        lag.sent(2, t0 + ms(2_000));
        lag.answered(1, t0 + ms(2_050));
        assert_eq!(lag.lag(2, t0 + ms(2_100)), ms(100));
        lag.failed(2);
        assert_eq!(lag.lag(2, t0 + ms(9_000)), Duration::ZERO);
    }

    #[test]
    fn the_bound_is_a_quarter_of_the_session() {
        assert_eq!(max_lag(3_000), ms(750));
        assert_eq!(max_lag(9_000), ms(2_250));
    }
}
