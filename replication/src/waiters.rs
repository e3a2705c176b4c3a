//! acks=all produce requests waiting for the high watermark.

use std::collections::BTreeMap;

/// Tokens (the caller's: a request id, a reply channel) waiting until the high
/// watermark reaches their required offset (the batch's last offset + 1).
///
/// Bounded: at most `waiters_max` tokens; `push` gives the token back when full
/// and the caller answers that request with an error (Kafka would time it out).
/// Released in required-offset order, ties in push order.
#[derive(Debug)]
pub struct AckWaiters<T> {
    waiters: BTreeMap<(i64, u64), T>,
    next_seq: u64,
    waiters_max: usize,
}

impl<T> AckWaiters<T> {
    pub fn new(waiters_max: usize) -> Self {
        Self {
            waiters: BTreeMap::new(),
            next_seq: 0,
            waiters_max,
        }
    }

    /// Waits for `required_offset` (last offset + 1). `Err(token)` when full.
    pub fn push(&mut self, required_offset: i64, token: T) -> Result<(), T> {
        if self.waiters.len() >= self.waiters_max {
            return Err(token);
        }
        self.waiters.insert((required_offset, self.next_seq), token);
        self.next_seq += 1;
        Ok(())
    }

    /// Every token whose required offset is `<= high_watermark`, in order. The
    /// caller then answers each with `LeaderReplica::check_after_append`.
    pub fn release(&mut self, high_watermark: i64) -> Vec<T> {
        let rest = self
            .waiters
            .split_off(&(high_watermark.saturating_add(1), 0));
        std::mem::replace(&mut self.waiters, rest)
            .into_values()
            .collect()
    }

    /// Every token, in order: leadership was lost, the caller answers them all
    /// NOT_LEADER_OR_FOLLOWER (the records may or may not survive).
    pub fn drain_all(&mut self) -> Vec<T> {
        std::mem::take(&mut self.waiters).into_values().collect()
    }

    pub fn len(&self) -> usize {
        self.waiters.len()
    }

    pub fn is_empty(&self) -> bool {
        self.waiters.is_empty()
    }

    /// The smallest required offset still waiting.
    pub fn first_required_offset(&self) -> Option<i64> {
        self.waiters.keys().next().map(|(offset, _)| *offset)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn releases_in_order_up_to_the_high_watermark() {
        let mut waiters = AckWaiters::new(10);
        waiters.push(5, "a").unwrap();
        waiters.push(3, "b").unwrap();
        waiters.push(5, "c").unwrap();
        waiters.push(9, "d").unwrap();
        assert!(waiters.release(2).is_empty());
        assert_eq!(waiters.release(5), vec!["b", "a", "c"]);
        assert_eq!(waiters.len(), 1);
        assert_eq!(waiters.first_required_offset(), Some(9));
        assert!(waiters.release(8).is_empty());
        assert_eq!(waiters.release(9), vec!["d"]);
        assert!(waiters.is_empty());
    }

    #[test]
    fn bounded_and_drained_on_leadership_loss() {
        let mut waiters = AckWaiters::new(2);
        waiters.push(1, 1).unwrap();
        waiters.push(2, 2).unwrap();
        assert_eq!(waiters.push(3, 3), Err(3));
        assert_eq!(waiters.drain_all(), vec![1, 2]);
        assert!(waiters.is_empty());
        waiters.push(3, 3).unwrap();
        assert_eq!(waiters.release(i64::MAX), vec![3]);
    }
}
