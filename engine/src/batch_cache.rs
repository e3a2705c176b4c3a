//! The per-core batch cache: recently appended batches, kept as `Bytes`, so tail
//! reads (consumers and followers close to the log end) never touch the disk.
//!
//! O_DIRECT bypasses the page cache, so without this every fetch would be a DMA
//! read. Each log keeps a contiguous suffix of its batches here; a core-wide
//! byte budget (`batch_cache_bytes_max`) evicts the oldest batches across all logs
//! of the core first. Single-threaded by construction (`Rc<RefCell<..>>`, never
//! borrowed across an await).

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::rc::Rc;

use bytes::Bytes;

#[derive(Clone)]
pub struct BatchCache {
    inner: Rc<RefCell<Inner>>,
}

struct CachedBatch {
    base_offset: i64,
    last_offset: i64,
    bytes: Bytes,
}

struct Inner {
    bytes_max: usize,
    bytes_used: usize,
    next_log_id: u64,
    logs: HashMap<u64, VecDeque<CachedBatch>>,
    /// Insertion order across logs: (log id, base offset). Entries whose batch was
    /// already dropped (truncation, log removal) are skipped on eviction.
    fifo: VecDeque<(u64, i64)>,
    hits: u64,
    misses: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheStats {
    pub bytes_used: usize,
    pub hits: u64,
    pub misses: u64,
}

/// The batches a cached read returns.
pub struct CachedRead {
    pub batches: Vec<Bytes>,
    pub next_offset: i64,
}

impl BatchCache {
    pub fn new(bytes_max: usize) -> BatchCache {
        BatchCache {
            inner: Rc::new(RefCell::new(Inner {
                bytes_max,
                bytes_used: 0,
                next_log_id: 0,
                logs: HashMap::new(),
                fifo: VecDeque::new(),
                hits: 0,
                misses: 0,
            })),
        }
    }

    /// A fresh id for a log that will use this cache.
    pub fn register(&self) -> u64 {
        let mut inner = self.inner.borrow_mut();
        inner.next_log_id += 1;
        inner.next_log_id
    }

    pub fn insert(&self, log_id: u64, base_offset: i64, last_offset: i64, bytes: Bytes) {
        let mut inner = self.inner.borrow_mut();
        if bytes.len() > inner.bytes_max {
            return;
        }
        inner.bytes_used += bytes.len();
        let entries = inner.logs.entry(log_id).or_default();
        debug_assert!(entries.back().is_none_or(|b| b.last_offset < base_offset));
        entries.push_back(CachedBatch {
            base_offset,
            last_offset,
            bytes,
        });
        inner.fifo.push_back((log_id, base_offset));
        inner.evict();
    }

    /// The cached batches from the one holding `offset` on, stopping before a batch
    /// at or past `upper_bound` or one that would take the total over `max_bytes`
    /// (the first batch is always returned whole). `None` when the batch holding
    /// `offset` is not cached.
    pub fn read(
        &self,
        log_id: u64,
        offset: i64,
        max_bytes: usize,
        upper_bound: i64,
    ) -> Option<CachedRead> {
        let mut inner = self.inner.borrow_mut();
        let found = inner.logs.get(&log_id).and_then(|entries| {
            let first = entries.front()?;
            if offset < first.base_offset || offset > entries.back()?.last_offset {
                return None;
            }
            let start = entries.partition_point(|b| b.last_offset < offset);
            let mut batches = Vec::new();
            let mut total = 0usize;
            let mut next_offset = offset;
            for b in entries.range(start..) {
                if b.base_offset >= upper_bound
                    || (!batches.is_empty() && total + b.bytes.len() > max_bytes)
                {
                    break;
                }
                total += b.bytes.len();
                next_offset = b.last_offset + 1;
                batches.push(b.bytes.clone());
            }
            Some(CachedRead {
                batches,
                next_offset,
            })
        });
        match found {
            Some(_) => inner.hits += 1,
            None => inner.misses += 1,
        }
        found
    }

    /// Drops a log's batches with base offset `>= offset` (the log was truncated).
    pub fn truncate(&self, log_id: u64, offset: i64) {
        let mut inner = self.inner.borrow_mut();
        let mut freed = 0;
        if let Some(entries) = inner.logs.get_mut(&log_id) {
            while entries.back().is_some_and(|b| b.base_offset >= offset) {
                if let Some(b) = entries.pop_back() {
                    freed += b.bytes.len();
                }
            }
        }
        inner.bytes_used -= freed;
    }

    /// Drops a log's batches that end below `offset` (its start moved up).
    pub fn truncate_front(&self, log_id: u64, offset: i64) {
        let mut inner = self.inner.borrow_mut();
        let mut freed = 0;
        if let Some(entries) = inner.logs.get_mut(&log_id) {
            while entries.front().is_some_and(|b| b.last_offset < offset) {
                if let Some(b) = entries.pop_front() {
                    freed += b.bytes.len();
                }
            }
        }
        inner.bytes_used -= freed;
    }

    /// Drops everything of a log (deleted or closed).
    pub fn remove_log(&self, log_id: u64) {
        let mut inner = self.inner.borrow_mut();
        if let Some(entries) = inner.logs.remove(&log_id) {
            let freed: usize = entries.iter().map(|b| b.bytes.len()).sum();
            inner.bytes_used -= freed;
        }
    }

    pub fn stats(&self) -> CacheStats {
        let inner = self.inner.borrow();
        CacheStats {
            bytes_used: inner.bytes_used,
            hits: inner.hits,
            misses: inner.misses,
        }
    }
}

impl Inner {
    fn evict(&mut self) {
        while self.bytes_used > self.bytes_max {
            let Some((log_id, base_offset)) = self.fifo.pop_front() else {
                break;
            };
            let Some(entries) = self.logs.get_mut(&log_id) else {
                continue;
            };
            if entries
                .front()
                .is_some_and(|b| b.base_offset == base_offset)
            {
                if let Some(b) = entries.pop_front() {
                    self.bytes_used -= b.bytes.len();
                }
            }
        }
        // Stale entries (truncated batches) would otherwise pile up in the FIFO.
        if self.fifo.len() > 2 * self.logs.values().map(VecDeque::len).sum::<usize>() + 1024 {
            let logs = &self.logs;
            self.fifo.retain(|(id, base)| {
                logs.get(id)
                    .is_some_and(|e| e.front().is_some_and(|f| f.base_offset <= *base))
            });
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn reads_evicts_and_truncates() {
        let cache = BatchCache::new(300);
        let a = cache.register();
        let b = cache.register();
        for i in 0..3 {
            cache.insert(a, i * 10, i * 10 + 9, Bytes::from(vec![0u8; 100]));
        }
        let r = cache.read(a, 15, 1000, i64::MAX).unwrap();
        assert_eq!((r.batches.len(), r.next_offset), (2, 30));
        let r = cache.read(a, 0, 150, i64::MAX).unwrap();
        assert_eq!((r.batches.len(), r.next_offset), (1, 10));
        let r = cache.read(a, 0, 1000, 20).unwrap();
        assert_eq!(r.next_offset, 20);
        // Budget is 300: another log's batch evicts a's oldest.
        cache.insert(b, 0, 0, Bytes::from(vec![0u8; 100]));
        assert!(cache.read(a, 5, 1000, i64::MAX).is_none());
        assert!(cache.read(a, 10, 1000, i64::MAX).is_some());
        cache.truncate(a, 20);
        assert!(cache.read(a, 25, 1000, i64::MAX).is_none());
        assert_eq!(cache.stats().bytes_used, 200);
        cache.remove_log(a);
        assert_eq!(cache.stats().bytes_used, 100);
    }
}
