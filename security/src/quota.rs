//! Client quotas' rules (KIP-13, KIP-55, KIP-124), sans I/O: which quota
//! applies to a request of (user, client-id), and how long a client that went
//! over it is throttled. The caller records bytes with its own clock.
//!
//! ```text
//! Quotas::resolve(user, client_id, key) -> Resolved { limit, budget }
//!     KIP-55's precedence, most specific first:
//!     user+client-id, user+<default client>, user,
//!     <default user>+client-id, <default user>+<default client>, <default user>,
//!     client-id, <default client>
//!     budget: whose usage counts against the limit: the matched entity's
//!     components with the request's own names (a <default> entity gives
//!     each user or client its own budget; a user entity alone shares one
//!     budget among all that user's clients)
//! RateWindow::record(bytes, now_ms); RateWindow::throttle_ms(limit, now_ms)
//!     Kafka's sampled rate: `samples` windows of `window_ms`; over the limit,
//!     throttle = (rate - limit) / limit * window size, the time after which
//!     the rate is back at the limit if the client sends nothing
//! ```
//!
//! Not wired to the node yet (issue 17, item 5): storage in the metadata log
//! (Alter/DescribeClientQuotas) and the produce/fetch enforcement come next.

use std::collections::BTreeMap;

/// Kafka's defaults: `quota.window.num` and `quota.window.size.seconds`.
pub const DEFAULT_SAMPLES: usize = 11;
pub const DEFAULT_WINDOW_MS: u64 = 1000;

/// One component of a quota entity: a name, or `<default>`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EntityName {
    Default,
    Named(String),
}

/// A quota entity (Kafka's `ClientQuotaEntity`): a user, a client id, or
/// both; at least one.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct QuotaEntity {
    pub user: Option<EntityName>,
    pub client_id: Option<EntityName>,
}

/// What a quota limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum QuotaKey {
    /// `producer_byte_rate`: bytes per second of produce requests.
    ProducerByteRate,
    /// `consumer_byte_rate`: bytes per second of fetch responses.
    ConsumerByteRate,
    /// `request_percentage`: percent of one request-handling thread.
    RequestPercentage,
}

impl QuotaKey {
    pub const ALL: [QuotaKey; 3] = [
        QuotaKey::ProducerByteRate,
        QuotaKey::ConsumerByteRate,
        QuotaKey::RequestPercentage,
    ];

    pub fn name(self) -> &'static str {
        match self {
            QuotaKey::ProducerByteRate => "producer_byte_rate",
            QuotaKey::ConsumerByteRate => "consumer_byte_rate",
            QuotaKey::RequestPercentage => "request_percentage",
        }
    }

    pub fn parse(name: &str) -> Option<QuotaKey> {
        QuotaKey::ALL.into_iter().find(|k| k.name() == name)
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum QuotaError {
    #[error("a quota entity names a user, a client id or both")]
    EmptyEntity,
    #[error("unknown quota {0:?} (producer_byte_rate, consumer_byte_rate, request_percentage)")]
    UnknownKey(String),
    #[error("quota {key} = {value}: must be a positive number")]
    BadValue { key: &'static str, value: f64 },
}

impl QuotaEntity {
    pub fn new(
        user: Option<EntityName>,
        client_id: Option<EntityName>,
    ) -> Result<QuotaEntity, QuotaError> {
        if user.is_none() && client_id.is_none() {
            return Err(QuotaError::EmptyEntity);
        }
        Ok(QuotaEntity { user, client_id })
    }
}

/// Checks a value for `key` (Kafka refuses zero and negative rates).
pub fn check_value(key: QuotaKey, value: f64) -> Result<(), QuotaError> {
    if value.is_finite() && value > 0.0 {
        Ok(())
    } else {
        Err(QuotaError::BadValue {
            key: key.name(),
            value,
        })
    }
}

/// The quota that applies to a request, and whose usage it counts.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
    pub limit: f64,
    /// (user, client id) of the budget: a component is the request's own
    /// name when the matched entity has it (named or `<default>`), empty
    /// when not (Kafka's quota metric tags).
    pub budget: (String, String),
    pub entity: QuotaEntity,
}

/// Every configured quota.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Quotas {
    entries: BTreeMap<QuotaEntity, BTreeMap<QuotaKey, f64>>,
}

impl Quotas {
    /// Sets (`Some`) or removes (`None`) one quota of an entity.
    pub fn set(&mut self, entity: QuotaEntity, key: QuotaKey, value: Option<f64>) {
        match value {
            Some(v) => {
                self.entries.entry(entity).or_default().insert(key, v);
            }
            None => {
                if let Some(keys) = self.entries.get_mut(&entity) {
                    keys.remove(&key);
                    if keys.is_empty() {
                        self.entries.remove(&entity);
                    }
                }
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Every entity with its quotas, in a stable order.
    pub fn entries(&self) -> impl Iterator<Item = (&QuotaEntity, &BTreeMap<QuotaKey, f64>)> {
        self.entries.iter()
    }

    /// The quota `key` for a request of `user` (a principal's name; empty
    /// for none) and `client_id`, by KIP-55's precedence. None: unlimited.
    pub fn resolve(&self, user: &str, client_id: &str, key: QuotaKey) -> Option<Resolved> {
        use EntityName::{Default, Named};
        let named = |s: &str| Some(Named(s.to_string()));
        let candidates = [
            (named(user), named(client_id)),
            (named(user), Some(Default)),
            (named(user), None),
            (Some(Default), named(client_id)),
            (Some(Default), Some(Default)),
            (Some(Default), None),
            (None, named(client_id)),
            (None, Some(Default)),
        ];
        candidates.into_iter().find_map(|(u, c)| {
            let entity = QuotaEntity {
                user: u,
                client_id: c,
            };
            let limit = *self.entries.get(&entity)?.get(&key)?;
            let budget = (
                entity
                    .user
                    .as_ref()
                    .map_or(String::new(), |_| user.to_string()),
                entity
                    .client_id
                    .as_ref()
                    .map_or(String::new(), |_| client_id.to_string()),
            );
            Some(Resolved {
                limit,
                budget,
                entity,
            })
        })
    }
}

/// Kafka's sampled rate: the values recorded in the last `samples` windows
/// of `window_ms`, over the time they cover (at least `samples - 1` whole
/// windows, so a new client is not judged on its first milliseconds).
#[derive(Debug, Clone)]
pub struct RateWindow {
    samples: usize,
    window_ms: u64,
    /// (window start, value) per window, oldest first.
    windows: Vec<(u64, f64)>,
}

impl RateWindow {
    pub fn new(samples: usize, window_ms: u64) -> RateWindow {
        RateWindow {
            samples: samples.max(2),
            window_ms: window_ms.max(1),
            windows: Vec::new(),
        }
    }

    fn purge(&mut self, now_ms: u64) {
        let span = self.samples as u64 * self.window_ms;
        self.windows
            .retain(|(start, _)| now_ms.saturating_sub(*start) < span);
    }

    /// Adds `value` (bytes) at `now_ms`.
    pub fn record(&mut self, value: f64, now_ms: u64) {
        self.purge(now_ms);
        match self.windows.last_mut() {
            Some((start, v)) if now_ms < *start + self.window_ms => *v += value,
            _ => {
                self.windows.push((now_ms, value));
                if self.windows.len() > self.samples {
                    self.windows.remove(0);
                }
            }
        }
    }

    /// Kafka's `Rate.windowSize`: milliseconds since the oldest window
    /// began, at least `samples - 1` windows.
    pub fn window_size_ms(&mut self, now_ms: u64) -> u64 {
        self.purge(now_ms);
        let elapsed = self
            .windows
            .first()
            .map_or(0, |(start, _)| now_ms.saturating_sub(*start));
        let full = elapsed / self.window_ms;
        let min_full = self.samples as u64 - 1;
        if full < min_full {
            elapsed + (min_full - full) * self.window_ms
        } else {
            elapsed
        }
    }

    /// Per second, over the window.
    pub fn rate(&mut self, now_ms: u64) -> f64 {
        let size = self.window_size_ms(now_ms);
        let total: f64 = self.windows.iter().map(|(_, v)| v).sum();
        total / (size as f64 / 1000.0)
    }

    /// How long a client at this rate waits before its next request is
    /// served: 0 within `limit`, else (rate - limit) / limit * window size,
    /// the time until the rate is back at the limit without new bytes.
    pub fn throttle_ms(&mut self, limit: f64, now_ms: u64) -> u64 {
        let rate = self.rate(now_ms);
        if rate <= limit || limit <= 0.0 {
            return 0;
        }
        let size = self.window_size_ms(now_ms) as f64;
        ((rate - limit) / limit * size).round() as u64
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use EntityName::{Default, Named};

    fn named(s: &str) -> Option<EntityName> {
        Some(Named(s.into()))
    }

    fn entity(user: Option<EntityName>, client: Option<EntityName>) -> QuotaEntity {
        QuotaEntity::new(user, client).unwrap()
    }

    #[test]
    fn the_most_specific_entity_wins_in_kip_55_order() {
        let mut q = Quotas::default();
        let p = QuotaKey::ProducerByteRate;
        let levels = [
            (None, Some(Default)),
            (None, named("app")),
            (Some(Default), None),
            (Some(Default), Some(Default)),
            (Some(Default), named("app")),
            (named("alice"), None),
            (named("alice"), Some(Default)),
            (named("alice"), named("app")),
        ];
        // Added from the least specific up: each new one takes over.
        for (i, (u, c)) in levels.iter().enumerate() {
            q.set(entity(u.clone(), c.clone()), p, Some(100.0 + i as f64));
            let r = q.resolve("alice", "app", p).unwrap();
            assert_eq!(r.limit, 100.0 + i as f64, "level {i}");
            assert_eq!(r.entity, entity(u.clone(), c.clone()));
        }
        // Another key is not limited by them.
        assert!(q
            .resolve("alice", "app", QuotaKey::ConsumerByteRate)
            .is_none());
        // Removed from the most specific down: the next one applies again.
        for i in (0..levels.len() - 1).rev() {
            let (u, c) = levels[i + 1].clone();
            q.set(entity(u, c), p, None);
            assert_eq!(
                q.resolve("alice", "app", p).unwrap().limit,
                100.0 + i as f64
            );
        }
    }

    #[test]
    fn budgets_are_shared_or_apart_as_kafka_tags_them() {
        let mut q = Quotas::default();
        let p = QuotaKey::ProducerByteRate;
        // A user entity alone: all of alice's clients share one budget.
        q.set(entity(named("alice"), None), p, Some(1000.0));
        assert_eq!(
            q.resolve("alice", "a", p).unwrap().budget,
            ("alice".into(), String::new())
        );
        assert_eq!(
            q.resolve("alice", "b", p).unwrap().budget,
            q.resolve("alice", "a", p).unwrap().budget
        );
        // A default client id: each client of any user its own budget.
        q.set(entity(None, Some(Default)), p, Some(500.0));
        let bob_a = q.resolve("bob", "a", p).unwrap();
        assert_eq!(bob_a.budget, (String::new(), "a".into()));
        assert_eq!(bob_a.limit, 500.0);
        assert_ne!(bob_a.budget, q.resolve("bob", "b", p).unwrap().budget);
    }

    #[test]
    fn entities_and_values_are_checked() {
        assert_eq!(QuotaEntity::new(None, None), Err(QuotaError::EmptyEntity));
        assert!(check_value(QuotaKey::ProducerByteRate, 1.0).is_ok());
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert!(
                check_value(QuotaKey::ConsumerByteRate, bad).is_err(),
                "{bad}"
            );
        }
        for k in QuotaKey::ALL {
            assert_eq!(QuotaKey::parse(k.name()), Some(k));
        }
        assert_eq!(QuotaKey::parse("controller_mutation_rate"), None);
    }

    #[test]
    fn a_new_client_is_judged_over_the_whole_window() {
        let mut w = RateWindow::new(DEFAULT_SAMPLES, DEFAULT_WINDOW_MS);
        // 10 KB in its first millisecond is 1 KB/s over 10 windows, not 10 MB/s.
        w.record(10_000.0, 0);
        assert_eq!(w.window_size_ms(1), 10_001);
        assert!((w.rate(1) - 10_000.0 / 10.001).abs() < 1e-6);
        assert_eq!(w.throttle_ms(2_000.0, 1), 0);
        // Over the limit: throttled until the rate is back at it.
        let t = w.throttle_ms(500.0, 1);
        assert_eq!(t, ((999.9 - 500.0) / 500.0 * 10_001.0_f64).round() as u64);
    }

    #[test]
    fn a_client_that_waits_its_throttle_is_back_at_the_limit() {
        let limit = 1_000_000.0;
        let mut w = RateWindow::new(DEFAULT_SAMPLES, DEFAULT_WINDOW_MS);
        let mut now = 0u64;
        let mut sent = 0.0;
        // A greedy client sends 100 KB whenever it is not throttled, for a
        // minute of simulated time: its long-run rate is the limit.
        while now < 60_000 {
            w.record(100_000.0, now);
            sent += 100_000.0;
            now += w.throttle_ms(limit, now).max(1);
        }
        let rate = sent / (now as f64 / 1000.0);
        assert!((rate - limit).abs() / limit < 0.1, "rate {rate}");
    }

    #[test]
    fn old_windows_age_out() {
        let mut w = RateWindow::new(3, 1000);
        w.record(3000.0, 0);
        assert!(w.rate(10) > 0.0);
        // Three windows later the bytes are forgotten.
        assert_eq!(w.rate(3_500), 0.0);
        w.record(1000.0, 3_500);
        assert_eq!(w.window_size_ms(3_500), 2000);
    }
}
