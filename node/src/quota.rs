//! Client quotas enforced (KIP-13 byte rates, KIP-124 request percentage,
//! KIP-219 throttling): which quota a request falls under comes from the
//! committed metadata (`skiff_security::quota::Quotas`, in each core's
//! `Security`), its usage is recorded in a node-wide window per budget, and a
//! client over its quota is told `throttle_time_ms` and its connection is
//! muted (no request read) for that long, as Kafka does.
//!
//! ```text
//! produce: request bytes        -> producer_byte_rate  -> throttle_time_ms, mute
//! fetch:   response data bytes  -> consumer_byte_rate  -> throttle_time_ms, mute
//!          (follower fetches are exempt: replication is not a client)
//! any:     core time of the request's in-order part -> request_percentage -> mute
//! ```
//!
//! Budgets are node-wide (a client's connections may land on several
//! cores), in `SHARDS` mutex-guarded maps: a request with no quota that
//! applies touches none of them, and two cores contend only when they charge
//! budgets of one shard at the same instant. A budget idle for a whole window
//! is dropped (its rate is zero by then).

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use skiff_security::quota::{QuotaKey, Quotas, RateWindow, DEFAULT_SAMPLES, DEFAULT_WINDOW_MS};

/// How often a muted connection looks at its core's stop flag.
const STOP_POLL: Duration = Duration::from_millis(100);

/// Mutex-guarded maps the budgets are spread over.
const SHARDS: usize = 64;

/// (what is limited, user, client id) of a budget, as `Quotas::resolve` names it.
type BudgetKey = (QuotaKey, String, String);

struct Budget {
    window: RateWindow,
    last_ms: u64,
}

#[derive(Default)]
struct Shard {
    budgets: HashMap<BudgetKey, Budget>,
    /// Charges since the last sweep for idle budgets.
    charges: u32,
}

/// Every budget of the node (one per node, shared by its cores).
pub struct QuotaBudgets {
    shards: Vec<Mutex<Shard>>,
    samples: usize,
    window_ms: u64,
}

impl Default for QuotaBudgets {
    fn default() -> Self {
        QuotaBudgets::new(DEFAULT_SAMPLES, DEFAULT_WINDOW_MS)
    }
}

impl QuotaBudgets {
    /// Kafka's `quota.window.num` and `quota.window.size.seconds` (in ms).
    pub fn new(samples: usize, window_ms: u64) -> Self {
        QuotaBudgets {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            samples: samples.max(2),
            window_ms: window_ms.max(1),
        }
    }

    /// Records `amount` against the quota that applies to (`user`,
    /// `client_id`) for `key` and returns how long the client must wait
    /// (0: within its quota, or no quota applies).
    pub fn charge(
        &self,
        quotas: &Quotas,
        user: &str,
        client_id: &str,
        key: QuotaKey,
        amount: f64,
        now_ms: u64,
    ) -> u64 {
        if quotas.is_empty() {
            return 0;
        }
        let Some(resolved) = quotas.resolve(user, client_id, key) else {
            return 0;
        };
        let budget: BudgetKey = (key, resolved.budget.0, resolved.budget.1);
        let shard = &self.shards[shard_of(&budget)];
        // A poisoned shard only means another core panicked mid-charge; the
        // window is still a valid window.
        let mut shard = shard.lock().unwrap_or_else(|p| p.into_inner());
        shard.charges += 1;
        if shard.charges >= 1024 {
            shard.charges = 0;
            let idle_ms = self.window_ms * self.samples as u64;
            shard
                .budgets
                .retain(|_, b| now_ms.saturating_sub(b.last_ms) < idle_ms);
        }
        let (samples, window_ms) = (self.samples, self.window_ms);
        let b = shard.budgets.entry(budget).or_insert_with(|| Budget {
            window: RateWindow::new(samples, window_ms),
            last_ms: now_ms,
        });
        b.last_ms = now_ms;
        b.window.record(amount, now_ms);
        let throttle = b.window.throttle_ms(resolved.limit, now_ms);
        // As Kafka: byte rates wait as long as their excess takes to age
        // out; request time at most one window (ClientRequestQuotaManager's
        // bound).
        match key {
            QuotaKey::RequestPercentage => throttle.min(self.window_ms),
            QuotaKey::ProducerByteRate | QuotaKey::ConsumerByteRate => throttle,
        }
    }

    /// Budgets held (tests, metrics).
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|p| p.into_inner()).budgets.len())
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn shard_of(key: &BudgetKey) -> usize {
    use std::hash::{BuildHasher, BuildHasherDefault};
    let h =
        BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default().hash_one(key);
    (h as usize) % SHARDS
}

/// Milliseconds on the node's quota clock (monotonic, one for every core).
pub fn now_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// `request_percentage` counts core time: this much of one core for a
/// second is 100.
pub fn percent_of_core(elapsed: Duration) -> f64 {
    elapsed.as_secs_f64() * 100.0
}

/// A connection's mute (KIP-219): no request is read before it ends.
#[derive(Debug, Default)]
pub struct Mute {
    until: Cell<Option<Instant>>,
}

impl Mute {
    /// Mutes for `throttle_ms` from now (a longer mute already set stays).
    pub fn extend(&self, throttle_ms: u64) {
        if throttle_ms == 0 {
            return;
        }
        let until = Instant::now() + Duration::from_millis(throttle_ms);
        if self.until.get().is_none_or(|u| u < until) {
            self.until.set(Some(until));
        }
    }

    /// Waits out the mute, if any, or until `stopping` is set (a muted
    /// connection must not hold up a stop).
    pub async fn wait(&self, stopping: &Cell<bool>) {
        while let Some(until) = self.until.get() {
            let now = Instant::now();
            if now >= until || stopping.get() {
                self.until.set(None);
                return;
            }
            glommio::timer::sleep((until - now).min(STOP_POLL)).await;
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use skiff_security::quota::{EntityName, QuotaEntity};

    fn quotas(limit: f64) -> Quotas {
        let mut q = Quotas::default();
        q.set(
            QuotaEntity::new(None, Some(EntityName::Named("greedy".into()))).unwrap(),
            QuotaKey::ProducerByteRate,
            Some(limit),
        );
        q
    }

    #[test]
    fn only_the_client_with_a_quota_is_throttled_and_by_the_excess() {
        let b = QuotaBudgets::new(11, 1000);
        let q = quotas(1000.0);
        // 10 s at 2,000 bytes/s: twice the quota.
        let mut last = 0;
        for t in 0..100u64 {
            last = b.charge(
                &q,
                "ANONYMOUS",
                "greedy",
                QuotaKey::ProducerByteRate,
                200.0,
                t * 100,
            );
            assert_eq!(
                b.charge(
                    &q,
                    "ANONYMOUS",
                    "polite",
                    QuotaKey::ProducerByteRate,
                    200.0,
                    t * 100
                ),
                0
            );
        }
        // Rate 2,000 over a 10-11 s window: about 10 s to get back to 1,000.
        assert!((9_000..=11_000).contains(&last), "throttle {last} ms");
        assert_eq!(b.len(), 1, "no budget for a client without a quota");
        // No quota at all: nothing recorded.
        assert_eq!(
            b.charge(
                &Quotas::default(),
                "u",
                "greedy",
                QuotaKey::ProducerByteRate,
                1e9,
                0
            ),
            0
        );
    }

    #[test]
    fn request_time_throttles_are_bounded_by_a_window_and_byte_rates_are_not() {
        let b = QuotaBudgets::new(11, 1000);
        let mut q = Quotas::default();
        let everyone = QuotaEntity::new(None, Some(EntityName::Default)).unwrap();
        q.set(everyone.clone(), QuotaKey::RequestPercentage, Some(1.0));
        q.set(everyone, QuotaKey::ProducerByteRate, Some(1.0));
        let percent = b.charge(&q, "u", "c", QuotaKey::RequestPercentage, 500.0, 0);
        assert_eq!(percent, 1000, "request time waits at most one window");
        let bytes = b.charge(&q, "u", "c", QuotaKey::ProducerByteRate, 500.0, 0);
        assert!(
            bytes > 100_000,
            "a byte rate waits its whole excess: {bytes} ms"
        );
    }

    #[test]
    fn idle_budgets_are_dropped() {
        // Idle after 2 windows of 100 ms; a <default> client entity gives
        // every client id its own budget; a new client every ms.
        let b = QuotaBudgets::new(2, 100);
        let mut q = Quotas::default();
        q.set(
            QuotaEntity::new(None, Some(EntityName::Default)).unwrap(),
            QuotaKey::ProducerByteRate,
            Some(1.0),
        );
        let clients = SHARDS as u64 * 1024 * 4;
        for c in 0..clients {
            b.charge(
                &q,
                "u",
                &format!("c{c}"),
                QuotaKey::ProducerByteRate,
                1.0,
                c,
            );
        }
        // At most the last 200 ms of clients plus each shard's charges since
        // its last sweep.
        assert!(b.len() <= 200 + SHARDS * 1024, "{} budgets kept", b.len());
    }
}
