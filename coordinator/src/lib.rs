//! skiff's coordinators' rules, sans I/O: no sockets, files or clocks. The
//! node drives them: it hands them requests and the time, makes the
//! transitions they return durable (a record in the coordinator's log
//! partition), then tells them the write is done; they never call back up.
//!
//! - [`group`]: the group coordinator's rules (the classic membership
//!   protocol as a state machine, time passed in) and Kafka's key/value
//!   formats of `__consumer_offsets` records; `node/src/group` drives them.
//! - [`txn`]: the transaction coordinator (issue 18): InitProducerId with a
//!   transactional id (epoch bumps, fencing, KIP-360 recovery),
//!   AddPartitionsToTxn, EndTxn, the markers a decision needs written, and
//!   the abort of transactions that ran past their timeout.

pub mod group;
pub mod txn;
mod wire;

/// Java's `String.hashCode` (over UTF-16 code units, wrapping).
pub fn java_string_hash(s: &str) -> i32 {
    s.encode_utf16().fold(0i32, |h, unit| {
        h.wrapping_mul(31).wrapping_add(i32::from(unit))
    })
}

/// The partition of a coordinator's log topic (`__consumer_offsets` for a
/// group id, `__transaction_state` for a transactional id) that owns `key`:
/// Kafka's `Utils.abs(key.hashCode) % partitions` (`Utils.abs(MIN_VALUE)`
/// is 0), so a key maps to the same partition as in Kafka.
pub fn partition_for(key: &str, partitions: i32) -> i32 {
    let hash = java_string_hash(key);
    let abs = if hash == i32::MIN { 0 } else { hash.abs() };
    abs % partitions.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_matches_java() {
        // Values of "...".hashCode() in Java.
        assert_eq!(java_string_hash(""), 0);
        assert_eq!(java_string_hash("a"), 97);
        assert_eq!(java_string_hash("group"), 98_629_247);
        assert_eq!(java_string_hash("my-group"), -1_906_497_762);
        assert_eq!(java_string_hash("polygenelubricants"), i32::MIN);
        assert_eq!(partition_for("my-group", 50), 1_906_497_762 % 50);
        assert_eq!(partition_for("polygenelubricants", 50), 0);
        assert_eq!(partition_for("group", 4), 98_629_247 % 4);
        // Non-BMP characters hash as two UTF-16 units, as in Java.
        assert_eq!(java_string_hash("\u{1F600}"), 0xD83D * 31 + 0xDE00);
    }
}
