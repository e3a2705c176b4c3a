//! The log's transaction side: which transactions are open, the last stable
//! offset (LSO) and the aborted transaction index of every segment, kept as
//! batches are appended and rebuilt after a restart (Kafka's
//! `ProducerStateManager` ongoing transactions and `TransactionIndex`).
//!
//! ```text
//! append (write_batch)   transactional data / COMMIT / ABORT marker
//!                        -> TxnTracker::apply -> an ABORT's AbortedTxn
//!                        -> the active segment's TxnIndex (memory)
//! roll / close           the closed segment's .txnindex is written with its
//!                        other indexes (only when it holds an entry); the
//!                        tracker's state at the new segment's base goes to
//!                        `txn-state-checkpoint` (the last STATES_KEPT rolls)
//! open (after recovery)  the state at the base of the first segment recovery
//!                        scanned (checkpointed at its roll) + the scanned
//!                        segments' transactional batches, replayed -> the
//!                        tracker, and those segments' indexes rebuilt
//! read_committed fetch   aborted_transactions(fetch offset, upper bound):
//!                        each segment's index from the fetch offset's on,
//!                        past the bound too, until an entry's LSO reaches
//!                        the bound (a marker can sit segments after its data)
//! ```
//!
//! Nothing here is written for a partition that never saw a transactional
//! batch: no checkpoint, no `.txnindex`, one attribute test per append.

use std::collections::BTreeMap;

use crate::checkpoint::{self, TXN_STATE_FILE};
use crate::error::{LogError, Result};
use crate::recovery::scan_segment;
use crate::segment::txn_index::{AbortedTxn, TxnIndex};
use crate::txn::{TxnBatch, TxnTracker};

use super::PartitionLog;

/// Checkpointed states kept: the latest roll's, and the one before, for a
/// crash between writing a roll's state and checkpointing its recovery point
/// (recovery then scans from the older segment).
const STATES_KEPT: usize = 2;

/// One tracker row: (open?, producer id, first offset, marker offset).
type Row = (bool, i64, i64, i64);

impl PartitionLog {
    /// An appended batch that matters to transactions (`write_batch`, after
    /// the active segment took it).
    pub(super) fn track_txn(&mut self, batch: TxnBatch) {
        self.txn_seen = true;
        let Some(aborted) = self.txns.apply(batch) else {
            return;
        };
        if let Err(reason) = self.active().txn_index_mut().push(aborted) {
            // The tracker only hands out entries in marker order.
            tracing::warn!(dir = %self.dir.display(), %reason, "aborted transaction not indexed");
        }
    }

    /// The last stable offset for high watermark `hw`: a read_committed
    /// reader reads below it (Kafka's LSO).
    pub fn last_stable_offset(&self, hw: i64) -> i64 {
        if !self.txn_seen {
            return hw;
        }
        self.txns.last_stable_offset(hw)
    }

    /// Whether the log has held a transactional batch (since it was
    /// created, as far as its files tell).
    pub fn has_transactions(&self) -> bool {
        self.txn_seen
    }

    /// The high watermark reached `hw`: transactions whose marker is below it
    /// are stable and forgotten (they only bounded the LSO until then).
    pub fn on_high_watermark(&mut self, hw: i64) {
        self.txns.on_high_watermark(hw);
    }

    /// Each open transaction: (producer id, first offset), by first offset.
    pub fn open_transactions(&self) -> Vec<(i64, i64)> {
        self.txns.open().collect()
    }

    /// The aborted transactions that overlap `[fetch_offset, upper_bound)`,
    /// for a read_committed fetch (Kafka's `collectAbortedTransactions`):
    /// each segment's index from the one holding `fetch_offset` on, until one
    /// entry's LSO reaches the bound. Segments at or past the bound are
    /// searched too: an ABORT marker is indexed in the segment that holds
    /// it, and a transaction whose records are below the bound may have its
    /// marker in a later segment (a roll between its data and its marker,
    /// `segment.ms` or a new leader). Stopping at the bound handed a
    /// read_committed consumer those aborted records as committed (nemesis
    /// seed 10001: 44 aborted reads, each right before a segment that
    /// began with its marker).
    pub fn aborted_transactions(&self, fetch_offset: i64, upper_bound: i64) -> Vec<AbortedTxn> {
        let mut out = Vec::new();
        if !self.txn_seen {
            return out;
        }
        let from = self
            .segments
            .range(..=fetch_offset)
            .next_back()
            .map_or(i64::MIN, |(base, _)| *base);
        for segment in self.segments.range(from..).map(|(_, s)| s) {
            if segment
                .txn_index()
                .collect(fetch_offset, upper_bound, &mut out)
            {
                break;
            }
        }
        out
    }

    /// At a roll: the tracker's state at `at` (the new segment's base, every
    /// record below it flushed) is checkpointed, once the log has seen a
    /// transaction.
    pub(super) async fn checkpoint_txn_state(&mut self, at: i64) -> Result<()> {
        if !self.txn_seen {
            return Ok(());
        }
        self.txn_states.insert(at, self.txns.to_rows());
        while self.txn_states.len() > STATES_KEPT {
            self.txn_states.pop_first();
        }
        write_states(self, &self.txn_states).await
    }

    /// The log was cut to end at `end`: transactions are cut with it, and
    /// checkpointed states past the new end describe records that are gone.
    pub(super) async fn truncate_txns(&mut self, end: i64) -> Result<()> {
        self.txns.truncate(end);
        let before = self.txn_states.len();
        self.txn_states.retain(|at, _| *at <= end);
        if self.txn_states.len() != before {
            write_states(self, &self.txn_states).await?;
        }
        Ok(())
    }

    /// The log starts over, empty, at `offset` (`truncate_fully_and_start_at`).
    pub(super) async fn restart_txns(&mut self, offset: i64) -> Result<()> {
        self.txns = TxnTracker::default();
        if !self.txn_seen {
            return Ok(());
        }
        self.txn_states = BTreeMap::from([(offset, Vec::new())]);
        write_states(self, &self.txn_states).await
    }

    /// After recovery: the tracker from the state checkpointed at the base of
    /// the first scanned segment (`first_scanned`), replaying the scanned
    /// segments' transactional batches (`scanned`, by segment base), whose
    /// indexes are rebuilt on the way. With no state there, it starts from
    /// the latest one below (reading the trusted segments between), or
    /// empty at the log start; with no checkpoint at all the log saw no
    /// transaction before its last roll and starts empty there.
    pub(super) async fn rebuild_txns(
        &mut self,
        first_scanned: i64,
        mut scanned: BTreeMap<i64, Vec<TxnBatch>>,
    ) -> Result<()> {
        let path = self.dir.join(TXN_STATE_FILE);
        let states = read_states(&path).await?;
        let indexed = self.segments.values().any(|s| !s.txn_index().is_empty());
        let replayed_any = scanned.values().any(|b| !b.is_empty());
        self.txn_seen = states.is_some() || indexed || replayed_any;
        if !self.txn_seen {
            return Ok(());
        }
        let (start, rows) = match &states {
            None => {
                if self
                    .segments
                    .range(..first_scanned)
                    .any(|(_, s)| !s.txn_index().is_empty())
                {
                    tracing::warn!(
                        path = %path.display(),
                        "no transaction state checkpoint although older segments index aborted transactions: starting from none open"
                    );
                }
                (first_scanned, Vec::new())
            }
            Some(states) => match states.range(..=first_scanned).next_back() {
                Some((at, rows)) => (*at, rows.clone()),
                None => (self.log_start_offset, Vec::new()),
            },
        };
        let mut tracker = TxnTracker::from_rows(&rows).map_err(|reason| LogError::Checkpoint {
            path: path.clone(),
            reason,
        })?;
        // Trusted segments between the state and the first scanned one are
        // read for their transactional batches only (their indexes stand).
        let between: Vec<i64> = self
            .segments
            .range(..first_scanned)
            .filter(|(base, s)| s.next_offset() > start && !scanned.contains_key(base))
            .map(|(base, _)| *base)
            .collect();
        let mut read_only = BTreeMap::new();
        for base in between {
            let Some(segment) = self.segments.get(&base) else {
                continue;
            };
            let path = segment.log_path();
            let found = scan_segment(
                segment.file(),
                &path,
                base,
                segment.size(),
                self.config.index_interval_bytes,
                false,
            )
            .await?;
            read_only.insert(base, found.txn_batches);
        }
        let bases: Vec<i64> = self.segments.keys().copied().collect();
        for base in bases {
            let rebuilt = scanned.remove(&base);
            let batches = match (&rebuilt, read_only.remove(&base)) {
                (Some(b), _) => b.clone(),
                (None, Some(b)) => b,
                (None, None) => continue,
            };
            let mut index = TxnIndex::default();
            // A segment rescanned below the state (its indexes did not
            // check) is replayed on its own: its markers of transactions
            // begun before it are lost to its index.
            let mut alone = TxnTracker::default();
            let below = base < start && rebuilt.is_some();
            let replaying = if below { &mut alone } else { &mut tracker };
            for batch in batches.into_iter().filter(|b| below || b.offset() >= start) {
                if let Some(aborted) = replaying.apply(batch) {
                    let _ = index.push(aborted);
                }
            }
            if rebuilt.is_none() {
                continue;
            }
            let Some(segment) = self.segments.get_mut(&base) else {
                continue;
            };
            if below {
                tracing::warn!(
                    path = %segment.log_path().display(),
                    "transaction index rebuilt without the transactions open before the segment"
                );
            }
            *segment.txn_index_mut() = index;
            if !segment.is_active() {
                segment.write_txn_index().await?;
            }
        }
        self.txns = tracker;
        if let Some(states) = states {
            self.txn_states = states;
        }
        Ok(())
    }
}

async fn read_states(path: &std::path::Path) -> Result<Option<BTreeMap<i64, Vec<Row>>>> {
    let Some(entries) = checkpoint::read(path, 5).await? else {
        return Ok(None);
    };
    let mut states: BTreeMap<i64, Vec<Row>> = BTreeMap::new();
    for fields in entries {
        let at = checkpoint::parse_i64(path, &fields[0])?;
        let [pid, first, marker] =
            [&fields[2], &fields[3], &fields[4]].map(|f| checkpoint::parse_i64(path, f));
        let rows = states.entry(at).or_default();
        match fields[1].as_str() {
            "state" => {}
            "open" => rows.push((true, pid?, first?, marker?)),
            "done" => rows.push((false, pid?, first?, marker?)),
            other => {
                return Err(LogError::Checkpoint {
                    path: path.to_path_buf(),
                    reason: format!("unknown row kind {other:?}"),
                })
            }
        }
    }
    Ok(Some(states))
}

/// One `at state -1 -1 -1` row per state (an empty one has nothing else),
/// then `at open|done pid first marker` per transaction.
async fn write_states(log: &PartitionLog, states: &BTreeMap<i64, Vec<Row>>) -> Result<()> {
    let mut entries = Vec::new();
    for (at, rows) in states {
        entries.push(vec![
            at.to_string(),
            "state".into(),
            "-1".into(),
            "-1".into(),
            "-1".into(),
        ]);
        for (open, pid, first, marker) in rows {
            entries.push(vec![
                at.to_string(),
                if *open { "open" } else { "done" }.into(),
                pid.to_string(),
                first.to_string(),
                marker.to_string(),
            ]);
        }
    }
    checkpoint::write(&log.dir.join(TXN_STATE_FILE), &entries).await
}
