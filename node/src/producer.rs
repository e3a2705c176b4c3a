//! Idempotent producer state of one partition (Kafka's ProducerStateManager, cut
//! to what idempotence needs): for each producer id, its epoch and the sequence
//! ranges and offsets of its last `BATCHES_KEPT` batches.
//!
//! A batch whose sequences match a remembered one is a retry: it is answered with
//! the original offsets and not appended again. A batch that does not continue the
//! last sequence is OUT_OF_ORDER_SEQUENCE_NUMBER; an older epoch is
//! INVALID_PRODUCER_EPOCH (fenced); a producer this partition has never seen must
//! start at sequence 0, else UNKNOWN_PRODUCER_ID (the client then resets).
//!
//! The state is rebuilt from the log itself (the batches carry producer id, epoch
//! and sequence) the first time an idempotent batch arrives after the partition is
//! opened, so it survives restarts without a separate snapshot file.

use std::collections::{HashMap, VecDeque};

/// Kafka keeps the last five batches per producer (max.in.flight = 5).
pub const BATCHES_KEPT: usize = 5;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchMeta {
    pub first_seq: i32,
    pub last_seq: i32,
    pub base_offset: i64,
    pub last_offset: i64,
}

#[derive(Debug, Default)]
struct ProducerEntry {
    epoch: i16,
    batches: VecDeque<BatchMeta>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SequenceCheck {
    /// New in-order batch: append it.
    Append,
    /// A retry of a batch already in the log at these offsets.
    Duplicate {
        base_offset: i64,
        last_offset: i64,
    },
    OutOfOrder {
        expected: i32,
        got: i32,
    },
    Fenced {
        current_epoch: i16,
    },
    UnknownProducer,
}

#[derive(Debug, Default)]
pub struct ProducerStates {
    producers: HashMap<i64, ProducerEntry>,
}

/// The sequence after `seq` (sequences wrap at i32::MAX to 0, as in Kafka).
fn next_seq(seq: i32) -> i32 {
    if seq == i32::MAX {
        0
    } else {
        seq + 1
    }
}

impl ProducerStates {
    pub fn check(
        &self,
        producer_id: i64,
        epoch: i16,
        first_seq: i32,
        last_seq: i32,
    ) -> SequenceCheck {
        let Some(entry) = self.producers.get(&producer_id) else {
            return if first_seq == 0 {
                SequenceCheck::Append
            } else {
                SequenceCheck::UnknownProducer
            };
        };
        if epoch < entry.epoch {
            return SequenceCheck::Fenced {
                current_epoch: entry.epoch,
            };
        }
        if epoch > entry.epoch {
            // A bumped epoch restarts the sequence.
            return if first_seq == 0 {
                SequenceCheck::Append
            } else {
                SequenceCheck::OutOfOrder {
                    expected: 0,
                    got: first_seq,
                }
            };
        }
        if let Some(b) = entry
            .batches
            .iter()
            .find(|b| b.first_seq == first_seq && b.last_seq == last_seq)
        {
            return SequenceCheck::Duplicate {
                base_offset: b.base_offset,
                last_offset: b.last_offset,
            };
        }
        let expected = entry.batches.back().map_or(0, |b| next_seq(b.last_seq));
        if first_seq == expected {
            SequenceCheck::Append
        } else {
            SequenceCheck::OutOfOrder {
                expected,
                got: first_seq,
            }
        }
    }

    /// Records an appended batch (also used when rebuilding from the log).
    pub fn record(&mut self, producer_id: i64, epoch: i16, meta: BatchMeta) {
        let entry = self.producers.entry(producer_id).or_default();
        if epoch != entry.epoch {
            entry.epoch = epoch;
            entry.batches.clear();
        }
        entry.batches.push_back(meta);
        while entry.batches.len() > BATCHES_KEPT {
            entry.batches.pop_front();
        }
    }

    /// Forgets batches at or past `offset` (the log was truncated).
    pub fn truncate(&mut self, offset: i64) {
        for entry in self.producers.values_mut() {
            entry.batches.retain(|b| b.base_offset < offset);
        }
        self.producers.retain(|_, e| !e.batches.is_empty());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(first_seq: i32, last_seq: i32, base: i64) -> BatchMeta {
        BatchMeta {
            first_seq,
            last_seq,
            base_offset: base,
            last_offset: base + i64::from(last_seq - first_seq),
        }
    }

    #[test]
    fn sequences() {
        let mut s = ProducerStates::default();
        assert_eq!(s.check(7, 0, 5, 9), SequenceCheck::UnknownProducer);
        assert_eq!(s.check(7, 0, 0, 4), SequenceCheck::Append);
        s.record(7, 0, meta(0, 4, 100));
        assert_eq!(
            s.check(7, 0, 0, 4),
            SequenceCheck::Duplicate {
                base_offset: 100,
                last_offset: 104
            }
        );
        assert_eq!(
            s.check(7, 0, 6, 9),
            SequenceCheck::OutOfOrder {
                expected: 5,
                got: 6
            }
        );
        assert_eq!(s.check(7, 0, 5, 9), SequenceCheck::Append);
        for i in 1..=6 {
            s.record(7, 0, meta(i * 5, i * 5 + 4, 100 + i64::from(i) * 5));
        }
        // Only the last five batches are remembered.
        assert_eq!(
            s.check(7, 0, 5, 9),
            SequenceCheck::OutOfOrder {
                expected: 35,
                got: 5
            }
        );
        assert_eq!(
            s.check(7, 0, 30, 34),
            SequenceCheck::Duplicate {
                base_offset: 130,
                last_offset: 134
            }
        );
        assert_eq!(
            s.check(7, 1, 3, 3),
            SequenceCheck::OutOfOrder {
                expected: 0,
                got: 3
            }
        );
        assert_eq!(s.check(7, 1, 0, 0), SequenceCheck::Append);
        s.record(7, 1, meta(0, 0, 200));
        assert_eq!(
            s.check(7, 0, 35, 35),
            SequenceCheck::Fenced { current_epoch: 1 }
        );
        assert_eq!(next_seq(i32::MAX), 0);
        s.truncate(200);
        assert_eq!(s.check(7, 1, 1, 1), SequenceCheck::UnknownProducer);
    }
}
