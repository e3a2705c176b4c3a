//! Connection limits on the Kafka listener, Kafka's way:
//!
//! - `max.connections.per.ip` (and `max.connections.per.ip.overrides`,
//!   `IP:N,IP:N`): a connection from an address that already holds its
//!   limit is closed as soon as it is accepted (Kafka's
//!   TooManyConnectionsException), so one client cannot take every slot;
//! - `max.connections` (KIP-402): while the node holds that many, no core
//!   accepts; new connections wait in the kernel's backlog (or, accepted by
//!   a core that was already waiting, unread) until one closes.
//!
//! The counts are node-wide, behind one mutex taken once when a connection
//! is accepted and once when it ends: never on a request's path. A
//! connection is counted in the same step that checks both limits
//! (`admit`), so neither is ever passed.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

#[derive(Debug, Default)]
struct Counts {
    total: usize,
    by_ip: HashMap<IpAddr, usize>,
}

/// The limits and the node's open connections.
#[derive(Debug)]
pub struct ConnectionLimits {
    max: usize,
    per_ip: usize,
    overrides: HashMap<IpAddr, usize>,
    open: Mutex<Counts>,
    /// Connections closed for `max.connections.per.ip` (a metric).
    refused: AtomicU64,
}

/// Why a connection is not admitted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// Closed at once.
    #[error("{ip} already holds {limit} connections (max.connections.per.ip)")]
    PerIp { ip: IpAddr, limit: usize },
    /// Waits for room.
    #[error("the node holds max.connections")]
    Full,
}

/// One admitted connection's place in the counts, given back when dropped.
#[derive(Debug)]
pub struct ConnectionPermit {
    limits: Arc<ConnectionLimits>,
    ip: IpAddr,
}

impl ConnectionLimits {
    /// The limits; None when there are none (every count unlimited).
    pub fn new(
        max: usize,
        per_ip: usize,
        overrides: HashMap<IpAddr, usize>,
    ) -> Option<Arc<ConnectionLimits>> {
        if max == usize::MAX && per_ip == usize::MAX && overrides.is_empty() {
            return None;
        }
        Some(Arc::new(ConnectionLimits {
            max,
            per_ip,
            overrides,
            open: Mutex::new(Counts::default()),
            refused: AtomicU64::new(0),
        }))
    }

    fn counts(&self) -> std::sync::MutexGuard<'_, Counts> {
        // The counts stay consistent even if a holder panicked (each update
        // is one step).
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The node holds `max.connections`: accept no more for now.
    pub fn full(&self) -> bool {
        self.counts().total >= self.max
    }

    /// Counts a connection from `ip`, or refuses it when its address holds
    /// its limit or the node holds `max.connections`.
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Result<ConnectionPermit, Refusal> {
        let limit = self.overrides.get(&ip).copied().unwrap_or(self.per_ip);
        let mut counts = self.counts();
        let held = counts.by_ip.get(&ip).copied().unwrap_or(0);
        if held >= limit {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return Err(Refusal::PerIp { ip, limit });
        }
        if counts.total >= self.max {
            return Err(Refusal::Full);
        }
        counts.total += 1;
        counts.by_ip.insert(ip, held + 1);
        Ok(ConnectionPermit {
            limits: self.clone(),
            ip,
        })
    }

    /// Connections closed so far for `max.connections.per.ip`.
    pub fn refused_total(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Open connections: all, and from `ip`.
    pub fn open(&self, ip: IpAddr) -> (usize, usize) {
        let counts = self.counts();
        (counts.total, counts.by_ip.get(&ip).copied().unwrap_or(0))
    }
}

impl Drop for ConnectionPermit {
    fn drop(&mut self) {
        let mut counts = self.limits.counts();
        counts.total = counts.total.saturating_sub(1);
        if let Some(n) = counts.by_ip.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                counts.by_ip.remove(&self.ip);
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    #[test]
    fn an_address_at_its_limit_is_refused_until_one_of_its_connections_ends() {
        let overrides = HashMap::from([(ip(9), 3)]);
        let limits = ConnectionLimits::new(usize::MAX, 2, overrides).unwrap();
        let a1 = limits.admit(ip(1)).unwrap();
        let _a2 = limits.admit(ip(1)).unwrap();
        assert_eq!(
            limits.admit(ip(1)).unwrap_err(),
            Refusal::PerIp {
                ip: ip(1),
                limit: 2
            }
        );
        // Another address has its own count; an override its own limit.
        let _b = limits.admit(ip(2)).unwrap();
        let held: Vec<_> = (0..3).map(|_| limits.admit(ip(9)).unwrap()).collect();
        assert!(limits.admit(ip(9)).is_err());
        assert_eq!(limits.refused_total(), 2);
        assert_eq!(limits.open(ip(1)), (6, 2));
        drop(a1);
        assert_eq!(limits.open(ip(1)), (5, 1));
        let _a3 = limits.admit(ip(1)).unwrap();
        drop(held);
        assert_eq!(limits.open(ip(9)), (3, 0));
    }

    #[test]
    fn full_at_max_connections_and_room_again_when_one_ends() {
        let limits = ConnectionLimits::new(2, usize::MAX, HashMap::new()).unwrap();
        let a = limits.admit(ip(1)).unwrap();
        assert!(!limits.full());
        let _b = limits.admit(ip(2)).unwrap();
        assert!(limits.full());
        assert_eq!(limits.admit(ip(3)).unwrap_err(), Refusal::Full);
        drop(a);
        assert!(!limits.full());
        let _c = limits.admit(ip(3)).unwrap();
    }

    #[test]
    fn no_limits_no_counting() {
        assert!(ConnectionLimits::new(usize::MAX, usize::MAX, HashMap::new()).is_none());
    }
}
