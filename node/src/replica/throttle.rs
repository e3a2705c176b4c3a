//! Replication throttles (Kafka's KIP-73), for moving replicas without
//! starving clients: `leader.replication.throttled.rate` and
//! `follower.replication.throttled.rate` (dynamic node configs, bytes/s)
//! bound the replication traffic of the replicas a topic names in
//! `leader.replication.throttled.replicas` / `follower.replication.throttled.replicas`
//! ("*", or "partition:node" pairs), as Kafka's reassignment tool sets them:
//! the leader side lists the replicas a moving partition is read from, the
//! follower side the replicas being added.
//!
//! As in Kafka, only replicas outside the ISR are ever throttled (an in-sync
//! follower that slowed down would hold back acks=all), and while the quota
//! is used up a throttled partition is left out: the leader answers its
//! follower fetch with no records (`handlers/fetch.rs`), the follower leaves
//! it out of its next fetch (`fetcher.rs`). Each core keeps its own budget of
//! rate / cores, refilled continuously with one second's worth at most: no
//! cross-core state on the fetch path.

use std::cell::RefCell;
use std::time::Instant;

use crate::config::{FOLLOWER_RATE, FOLLOWER_REPLICAS, LEADER_RATE, LEADER_REPLICAS};
use crate::topics::table::{TopicInfo, TopicTable};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Leader,
    Follower,
}

impl Side {
    fn rate_key(self) -> &'static str {
        match self {
            Side::Leader => LEADER_RATE,
            Side::Follower => FOLLOWER_RATE,
        }
    }

    fn replicas_key(self) -> &'static str {
        match self {
            Side::Leader => LEADER_REPLICAS,
            Side::Follower => FOLLOWER_REPLICAS,
        }
    }
}

/// Whether `value` names the replica of `partition` on `node`.
fn names(value: &str, partition: i32, node: i32) -> bool {
    let value = value.trim();
    value == "*"
        || value.split(',').any(|pair| {
            pair.trim().split_once(':').is_some_and(|(p, n)| {
                p.trim().parse::<i32>() == Ok(partition) && n.trim().parse::<i32>() == Ok(node)
            })
        })
}

/// Whether the topic's config throttles `side` for `partition`'s replica on
/// `node` (whatever the quota says).
pub fn is_throttled(info: &TopicInfo, side: Side, partition: i32, node: i32) -> bool {
    info.configs
        .get(side.replicas_key())
        .is_some_and(|v| names(v, partition, node))
}

/// A byte budget refilled at `rate` per second, up to one second's worth;
/// spending may take it below zero (the next bytes wait for the debt).
#[derive(Debug, Clone)]
struct Budget {
    rate: u64,
    tokens: f64,
    at: Instant,
}

impl Budget {
    fn refill(&mut self, rate: u64, now: Instant) {
        if rate != self.rate {
            self.rate = rate;
            self.tokens = self.tokens.min(rate as f64);
        }
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * rate as f64).min(rate as f64);
        self.at = now;
    }
}

thread_local! {
    static BUDGETS: RefCell<[Option<Budget>; 2]> = const { RefCell::new([None, None]) };
}

fn slot(side: Side) -> usize {
    match side {
        Side::Leader => 0,
        Side::Follower => 1,
    }
}

/// This core's share of `side`'s rate (None: not throttled).
fn core_rate(table: &TopicTable, side: Side, cores: usize) -> Option<u64> {
    let rate: u64 = table.node_config(side.rate_key())?.parse().ok()?;
    Some((rate / cores.max(1) as u64).max(1))
}

/// Whether `side`'s quota is used up on this core now (never without a rate).
pub fn exceeded(table: &TopicTable, side: Side, cores: usize) -> bool {
    let Some(rate) = core_rate(table, side, cores) else {
        return false;
    };
    with_budget(side, rate, |budget| budget.tokens <= 0.0)
}

/// `f` on this core's budget for `side`, refilled to now at `rate`.
fn with_budget<T>(side: Side, rate: u64, f: impl FnOnce(&mut Budget) -> T) -> T {
    let now = Instant::now();
    BUDGETS.with(|b| {
        let mut b = b.borrow_mut();
        let budget = b[slot(side)].get_or_insert(Budget {
            rate,
            tokens: rate as f64,
            at: now,
        });
        budget.refill(rate, now);
        f(budget)
    })
}

/// Counts `bytes` of throttled replication against `side`'s quota on this core.
pub fn record(table: &TopicTable, side: Side, cores: usize, bytes: usize) {
    let Some(rate) = core_rate(table, side, cores) else {
        return;
    };
    with_budget(side, rate, |budget| budget.tokens -= bytes as f64);
    COUNTERS.with(|c| {
        let mut c = c.borrow_mut();
        c[slot(side)] += bytes as u64;
    });
}

thread_local! {
    /// Throttled replication bytes counted on this core, leader and follower side.
    static COUNTERS: RefCell<[u64; 2]> = const { RefCell::new([0, 0]) };
}

/// This core's throttled bytes so far: (leader side, follower side).
pub fn throttled_bytes() -> (u64, u64) {
    COUNTERS.with(|c| {
        let c = c.borrow();
        (c[0], c[1])
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::check_replicas;

    #[test]
    fn replica_lists_parse_and_match() {
        for ok in ["", "*", "0:1", "0:1, 1:2,3:4"] {
            assert!(check_replicas(ok).is_ok(), "{ok}");
        }
        for bad in ["1", "a:b", "0:1,", "0:-1", "*,0:1"] {
            assert!(check_replicas(bad).is_err(), "{bad}");
        }
        assert!(names("*", 3, 9));
        assert!(names("0:1, 1:2", 1, 2));
        assert!(!names("0:1,1:2", 1, 1));
        assert!(!names("", 0, 1));
    }

    #[test]
    fn a_budget_refills_at_its_rate_up_to_one_second() {
        let t0 = Instant::now();
        let mut b = Budget {
            rate: 1000,
            tokens: 1000.0,
            at: t0,
        };
        b.tokens -= 2500.0;
        b.refill(1000, t0 + std::time::Duration::from_millis(1000));
        assert!((b.tokens - -500.0).abs() < 1e-6);
        b.refill(1000, t0 + std::time::Duration::from_secs(10));
        assert!(
            (b.tokens - 1000.0).abs() < 1e-6,
            "capped at one second's worth"
        );
        b.refill(10, t0 + std::time::Duration::from_secs(10));
        assert!(
            (b.tokens - 10.0).abs() < 1e-6,
            "a lower rate lowers the cap"
        );
    }
}
