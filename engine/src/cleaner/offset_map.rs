//! The cleaner's key → latest offset map, in a fixed memory budget.
//!
//! Keys are stored as their 128-bit xxh3 hash (as Kafka's `SkimpyOffsetMap`
//! stores an MD5): 24 bytes per entry whatever the key's size, and a collision
//! (which would drop a live record) has probability ~n²/2¹²⁹. The table is sized
//! once from the budget and reused by every pass, so the cleaner's memory does not
//! grow with the data it cleans; when the dirty section has more distinct keys
//! than fit, the pass stops at a batch boundary and the next pass continues.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Bytes one entry costs in the table: the u128 hash, the i64 offset, hashbrown's
/// control byte, and its 7/8 load factor.
pub const BYTES_PER_ENTRY: usize = 32;
/// The smallest map, whatever the budget says.
pub const MIN_ENTRIES: usize = 64;

pub struct OffsetMap {
    entries: HashMap<u128, i64, BuildHasherDefault<PrehashedKey>>,
    capacity: usize,
}

impl OffsetMap {
    /// A map using at most about `budget_bytes` (at least `MIN_ENTRIES` entries).
    pub fn with_budget(budget_bytes: usize) -> OffsetMap {
        let capacity = (budget_bytes / BYTES_PER_ENTRY).max(MIN_ENTRIES);
        OffsetMap {
            entries: HashMap::with_capacity_and_hasher(capacity, Default::default()),
            capacity,
        }
    }

    /// Entries the budget holds.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether `more` new keys surely fit.
    pub fn has_room_for(&self, more: usize) -> bool {
        self.entries.len().saturating_add(more) <= self.capacity
    }

    /// Records `offset` as the latest for `key` (offsets arrive in log order).
    pub fn put(&mut self, key: &[u8], offset: i64) {
        self.entries.insert(hash(key), offset);
    }

    /// The latest offset recorded for `key`.
    pub fn get(&self, key: &[u8]) -> Option<i64> {
        self.entries.get(&hash(key)).copied()
    }

    /// Empties the map for the next pass, keeping its allocation.
    pub fn clear(&mut self) {
        self.entries.clear();
    }
}

fn hash(key: &[u8]) -> u128 {
    xxhash_rust::xxh3::xxh3_128(key)
}

/// The keys are already uniform hashes: the table uses their low 64 bits as is.
#[derive(Default)]
pub struct PrehashedKey(u64);

impl Hasher for PrehashedKey {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Only u128 keys are hashed; this path folds any other input anyway.
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.0 ^= u64::from_le_bytes(word);
        }
    }
    fn write_u128(&mut self, v: u128) {
        self.0 = v as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latest_offset_wins_and_budget_bounds_capacity() {
        let mut map = OffsetMap::with_budget(64 << 10);
        assert_eq!(map.capacity(), 2048);
        map.put(b"a", 1);
        map.put(b"b", 2);
        map.put(b"a", 7);
        assert_eq!(map.get(b"a"), Some(7));
        assert_eq!(map.get(b"b"), Some(2));
        assert_eq!(map.get(b"c"), None);
        assert_eq!(map.len(), 2);
        assert!(map.has_room_for(2046) && !map.has_room_for(2047));
        map.clear();
        assert!(map.is_empty());
        assert_eq!(OffsetMap::with_budget(0).capacity(), MIN_ENTRIES);
    }
}
