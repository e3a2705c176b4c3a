#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;
use proptest::prelude::*;

const TIMEOUT: i32 = 60_000;

fn tp(topic: &str, partition: i32) -> TopicPartition {
    TopicPartition {
        topic: topic.into(),
        partition,
    }
}

/// A coordinator whose writes always succeed, with a producer id allocator.
struct Harness {
    c: TxnCoordinator,
    next_pid: ProducerId,
}

impl Harness {
    fn new() -> Harness {
        Harness {
            c: TxnCoordinator::new(TxnConfig::default()),
            next_pid: 1000,
        }
    }

    /// Applies an outcome's transition (durable at once); returns the reply.
    fn apply(&mut self, outcome: Outcome) -> Result<Reply, TxnError> {
        if let Some(t) = &outcome.transition {
            self.c.complete(&t.id).unwrap();
        }
        outcome.reply
    }

    fn init(&mut self, id: &str) -> Result<(ProducerId, Epoch), TxnError> {
        let mut next = self.next_pid;
        let outcome = self.c.init_producer_id(id, TIMEOUT, None, 0, &mut || {
            next += 1;
            next
        });
        self.next_pid = next;
        match self.apply(outcome)? {
            Reply::ProducerIdAndEpoch(p, e) => Ok((p, e)),
            Reply::Ok => panic!("InitProducerId answered without an id"),
        }
    }

    fn add(
        &mut self,
        id: &str,
        (p, e): (ProducerId, Epoch),
        parts: &[TopicPartition],
    ) -> Result<Reply, TxnError> {
        let outcome = self.c.add_partitions(id, p, e, parts, 10);
        self.apply(outcome)
    }

    fn end(
        &mut self,
        id: &str,
        (p, e): (ProducerId, Epoch),
        commit: bool,
    ) -> Result<Reply, TxnError> {
        let outcome = self.c.end_txn(id, p, e, commit, 20);
        self.apply(outcome)
    }

    fn finish_markers(&mut self, id: &str) {
        let t = self
            .c
            .markers_written(id, 30)
            .expect("a decided transaction");
        self.c.complete(&t.id).unwrap();
    }

    fn state(&self, id: &str) -> TxnState {
        self.c.get(id).unwrap().state
    }
}

#[test]
fn a_transaction_commits_through_prepare_markers_and_complete() {
    let mut h = Harness::new();
    let producer = h.init("t").unwrap();
    assert_eq!(producer, (1001, 0));
    assert_eq!(h.state("t"), TxnState::Empty);
    let parts = [tp("a", 0), tp("a", 1)];
    assert_eq!(h.add("t", producer, &parts), Ok(Reply::Ok));
    assert_eq!(h.state("t"), TxnState::Ongoing);
    // Adding what is already there writes nothing.
    let again =
        h.c.add_partitions("t", producer.0, producer.1, &parts[..1], 11);
    assert_eq!(again.transition, None);
    assert_eq!(h.end("t", producer, true), Ok(Reply::Ok));
    assert_eq!(h.state("t"), TxnState::PrepareCommit);
    let markers = h.c.markers("t").unwrap();
    assert!(markers.commit);
    assert_eq!((markers.producer_id, markers.epoch), producer);
    assert_eq!(markers.partitions.len(), 2);
    // While markers are written the producer's retry waits.
    assert_eq!(
        h.end("t", producer, true),
        Err(TxnError::ConcurrentTransactions)
    );
    assert_eq!(h.end("t", producer, false), Err(TxnError::InvalidTxnState));
    h.finish_markers("t");
    assert_eq!(h.state("t"), TxnState::CompleteCommit);
    assert!(h.c.get("t").unwrap().partitions.is_empty());
    // A retried EndTxn of the same decision succeeds; the other is refused.
    assert_eq!(h.end("t", producer, true), Ok(Reply::Ok));
    assert_eq!(h.end("t", producer, false), Err(TxnError::InvalidTxnState));
    // The next transaction starts from CompleteCommit.
    assert_eq!(h.add("t", producer, &[tp("b", 0)]), Ok(Reply::Ok));
    assert_eq!(h.c.get("t").unwrap().partitions.len(), 1);
    assert_eq!(h.end("t", producer, false), Ok(Reply::Ok));
    assert!(!h.c.markers("t").unwrap().commit);
    h.finish_markers("t");
    assert_eq!(h.state("t"), TxnState::CompleteAbort);
}

#[test]
fn a_write_verifies_only_inside_its_ongoing_transaction() {
    let mut h = Harness::new();
    let p = h.init("t").unwrap();
    let (a, b) = (tp("a", 0), tp("b", 1));
    // No transaction yet: nothing may open one.
    assert_eq!(
        h.c.verify("t", p.0, p.1, &a),
        Err(TxnError::InvalidTxnState)
    );
    h.add("t", p, std::slice::from_ref(&a)).unwrap();
    assert_eq!(h.c.verify("t", p.0, p.1, &a), Ok(()));
    // A partition the transaction does not hold, another producer id, an
    // old epoch, an unknown id.
    assert_eq!(
        h.c.verify("t", p.0, p.1, &b),
        Err(TxnError::InvalidTxnState)
    );
    assert_eq!(
        h.c.verify("t", p.0 + 1, p.1, &a),
        Err(TxnError::InvalidProducerIdMapping)
    );
    assert_eq!(
        h.c.verify("t", p.0, p.1 - 1, &a),
        Err(TxnError::ProducerFenced)
    );
    assert_eq!(
        h.c.verify("nobody", p.0, p.1, &a),
        Err(TxnError::InvalidProducerIdMapping)
    );
    // Decided: a late write to the partition no longer verifies, and after
    // the markers neither.
    h.end("t", p, true).unwrap();
    assert_eq!(
        h.c.verify("t", p.0, p.1, &a),
        Err(TxnError::InvalidTxnState)
    );
    h.finish_markers("t");
    assert_eq!(
        h.c.verify("t", p.0, p.1, &a),
        Err(TxnError::InvalidTxnState)
    );
}

#[test]
fn a_new_producer_fences_the_old_one() {
    let mut h = Harness::new();
    let old = h.init("t").unwrap();
    let new = h.init("t").unwrap();
    assert_eq!(new, (old.0, old.1 + 1));
    assert_eq!(
        h.add("t", old, &[tp("a", 0)]),
        Err(TxnError::ProducerFenced)
    );
    assert_eq!(h.end("t", old, true), Err(TxnError::ProducerFenced));
    assert_eq!(
        h.add("t", (old.0 + 7, new.1), &[tp("a", 0)]),
        Err(TxnError::InvalidProducerIdMapping)
    );
    assert_eq!(h.add("t", new, &[tp("a", 0)]), Ok(Reply::Ok));
}

#[test]
fn a_new_producer_during_a_transaction_aborts_it_first() {
    let mut h = Harness::new();
    let old = h.init("t").unwrap();
    h.add("t", old, &[tp("a", 0)]).unwrap();
    let outcome = h.c.init_producer_id("t", TIMEOUT, None, 5, &mut || 1);
    assert_eq!(outcome.reply, Err(TxnError::ConcurrentTransactions));
    let fence = outcome.transition.expect("the old producer is fenced");
    assert_eq!(fence.record.state, TxnState::PrepareAbort);
    assert_eq!(fence.record.producer_epoch, old.1 + 1);
    h.c.complete("t").unwrap();
    // The abort markers carry the bumped epoch: the old producer's late
    // writes are fenced by them.
    let markers = h.c.markers("t").unwrap();
    assert!(!markers.commit);
    assert_eq!(markers.epoch, old.1 + 1);
    assert_eq!(h.end("t", old, true), Err(TxnError::ProducerFenced));
    // The new producer retries until the abort completes.
    assert_eq!(h.init("t"), Err(TxnError::ConcurrentTransactions));
    h.finish_markers("t");
    assert_eq!(h.init("t").unwrap(), (old.0, old.1 + 2));
}

#[test]
fn a_write_in_progress_holds_every_other_request() {
    let mut h = Harness::new();
    let p = h.init("t").unwrap();
    let pending = h.c.add_partitions("t", p.0, p.1, &[tp("a", 0)], 1);
    assert!(pending.transition.is_some());
    assert_eq!(
        h.c.add_partitions("t", p.0, p.1, &[tp("a", 1)], 2).reply,
        Err(TxnError::ConcurrentTransactions)
    );
    assert_eq!(
        h.c.end_txn("t", p.0, p.1, true, 2).reply,
        Err(TxnError::ConcurrentTransactions)
    );
    // The write failed: nothing changed.
    h.c.fail("t");
    assert_eq!(h.state("t"), TxnState::Empty);
    assert_eq!(h.add("t", p, &[tp("a", 1)]), Ok(Reply::Ok));
    // A first InitProducerId whose write failed leaves no trace.
    let first = h.c.init_producer_id("u", TIMEOUT, None, 0, &mut || 77);
    assert!(first.transition.is_some());
    assert!(h.c.get("u").is_none());
    h.c.fail("u");
    assert!(h.c.get("u").is_none() && h.c.ids().all(|(id, _)| id != "u"));
}

#[test]
fn transactions_past_their_timeout_are_fenced_and_aborted() {
    let mut h = Harness::new();
    let p = h.init("t").unwrap();
    let outcome = h.c.add_partitions("t", p.0, p.1, &[tp("a", 0)], 1_000);
    h.apply(outcome).unwrap();
    assert!(h.c.expired(1_000 + i64::from(TIMEOUT)).is_empty());
    let aborted = h.c.expired(1_001 + i64::from(TIMEOUT));
    assert_eq!(aborted.len(), 1);
    assert_eq!(aborted[0].record.state, TxnState::PrepareAbort);
    assert_eq!(aborted[0].record.producer_epoch, p.1 + 1);
    h.c.complete("t").unwrap();
    assert_eq!(h.end("t", p, true), Err(TxnError::ProducerFenced));
    // Nothing else is due.
    assert!(h.c.expired(i64::MAX / 2).is_empty());
}

#[test]
fn timeouts_are_bounded() {
    let mut h = Harness::new();
    for bad in [0, -1, TxnConfig::default().max_timeout_ms + 1] {
        let o = h.c.init_producer_id("t", bad, None, 0, &mut || 1);
        assert_eq!(o.reply, Err(TxnError::InvalidTransactionTimeout(bad)));
        assert!(o.transition.is_none());
    }
}

#[test]
fn an_exhausted_epoch_moves_to_a_new_producer_id_and_kip_360_recognises_it() {
    let mut h = Harness::new();
    let (pid, _) = h.init("t").unwrap();
    // The id's epoch is spent.
    let mut record = h.c.get("t").unwrap().clone();
    record.producer_epoch = EPOCH_EXHAUSTED;
    h.c.load([("t".to_string(), record)]);
    let (new_pid, epoch) = h.init("t").unwrap();
    assert_ne!(new_pid, pid);
    assert_eq!(epoch, 0);
    assert_eq!(h.c.get("t").unwrap().previous_producer_id, pid);
    // A recovering producer of the old id (KIP-360) gets the new one back
    // without another bump.
    let o =
        h.c.init_producer_id("t", TIMEOUT, Some((pid, EPOCH_EXHAUSTED)), 1, &mut || 5);
    assert_eq!(o.reply, Ok(Reply::ProducerIdAndEpoch(new_pid, 0)));
    assert!(o.transition.is_none());
}

#[test]
fn kip_360_recovery_bumps_the_current_producer_and_fences_strangers() {
    let mut h = Harness::new();
    let p = h.init("t").unwrap();
    let o = h.c.init_producer_id("t", TIMEOUT, Some(p), 1, &mut || 5);
    assert_eq!(o.reply, Ok(Reply::ProducerIdAndEpoch(p.0, p.1 + 1)));
    h.c.complete("t").unwrap();
    // The same request again (its answer was lost): the same epoch.
    let o = h.c.init_producer_id("t", TIMEOUT, Some(p), 2, &mut || 5);
    assert_eq!(o.reply, Ok(Reply::ProducerIdAndEpoch(p.0, p.1 + 1)));
    assert!(o.transition.is_none());
    for stranger in [(p.0 + 1, p.1), (p.0, p.1 + 5)] {
        let o =
            h.c.init_producer_id("t", TIMEOUT, Some(stranger), 3, &mut || 5);
        assert_eq!(o.reply, Err(TxnError::ProducerFenced), "{stranger:?}");
    }
}

#[test]
fn a_new_coordinator_finishes_what_the_old_one_decided() {
    let mut h = Harness::new();
    let p = h.init("t").unwrap();
    h.add("t", p, &[tp("a", 0), tp("b", 3)]).unwrap();
    h.end("t", p, true).unwrap();
    let q = h.init("u").unwrap();
    h.add("u", q, &[tp("a", 1)]).unwrap();
    // The log as the next coordinator reads it.
    let log: Vec<(String, TxnRecord)> =
        h.c.ids()
            .map(|(id, r)| (id.to_string(), r.clone()))
            .collect();
    let mut next = TxnCoordinator::new(TxnConfig::default());
    let markers = next.load(log);
    assert_eq!(markers.len(), 1, "only t was decided");
    assert_eq!(markers[0].id, "t");
    assert!(markers[0].commit);
    assert_eq!(next.get("u").unwrap().state, TxnState::Ongoing);
}

#[test]
fn states_follow_kafkas_table() {
    use TxnState::*;
    let all = [
        Empty,
        Ongoing,
        PrepareCommit,
        PrepareAbort,
        CompleteCommit,
        CompleteAbort,
        Dead,
        PrepareEpochFence,
    ];
    let allowed: Vec<(TxnState, TxnState)> = all
        .iter()
        .flat_map(|to| all.iter().map(move |from| (*from, *to)))
        .filter(|(from, to)| to.may_follow(*from))
        .collect();
    assert!(allowed.contains(&(Ongoing, PrepareCommit)));
    assert!(allowed.contains(&(PrepareEpochFence, PrepareAbort)));
    assert!(!allowed.contains(&(Empty, PrepareCommit)));
    assert!(!allowed.contains(&(PrepareCommit, Ongoing)));
    assert!(!allowed.contains(&(CompleteCommit, CompleteAbort)));
    assert_eq!(allowed.len(), 16);
}

#[derive(Debug, Clone)]
enum Op {
    Init,
    Add { producer: usize, partition: i32 },
    End { producer: usize, commit: bool },
    WriteDone { ok: bool },
    Markers,
    Tick { ms: i64 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        Just(Op::Init),
        (0usize..3, 0i32..3).prop_map(|(producer, partition)| Op::Add {
            producer,
            partition
        }),
        (0usize..3, any::<bool>()).prop_map(|(producer, commit)| Op::End { producer, commit }),
        any::<bool>().prop_map(|ok| Op::WriteDone { ok }),
        Just(Op::Markers),
        (1i64..40_000).prop_map(|ms| Op::Tick { ms }),
    ]
}

proptest! {
    /// Producers come and go, writes succeed or fail, time passes: every
    /// durable state follows Kafka's table, (producer id, epoch) only grows,
    /// a producer older than the newest never gets an Ok, and a decided
    /// transaction's markers always carry the id's current epoch.
    #[test]
    fn fencing_and_states_hold_under_any_interleaving(ops in proptest::collection::vec(op(), 1..120)) {
        let mut c = TxnCoordinator::new(TxnConfig { max_timeout_ms: 30_000 });
        let mut now = 0i64;
        let mut next_pid = 100;
        // Producers that got an id, oldest first.
        let mut producers: Vec<(ProducerId, Epoch)> = Vec::new();
        let mut last: Option<TxnRecord> = None;
        for op in ops {
            match op {
                Op::Init => {
                    let o = c.init_producer_id("t", 20_000, None, now, &mut || { next_pid += 1; next_pid });
                    if let (Ok(Reply::ProducerIdAndEpoch(p, e)), Some(_)) = (&o.reply, &o.transition) {
                        producers.push((*p, *e));
                    }
                }
                Op::Add { producer, partition } => {
                    if let Some(&(p, e)) = producers.get(producer) {
                        let o = c.add_partitions("t", p, e, &[tp("a", partition)], now);
                        if o.reply.is_ok() {
                            let durable = c.get("t").map(|r| (r.producer_id, r.producer_epoch));
                            prop_assert_eq!(durable, Some((p, e)), "an Ok for a producer that is not current");
                        }
                    }
                }
                Op::End { producer, commit } => {
                    if let Some(&(p, e)) = producers.get(producer) {
                        let o = c.end_txn("t", p, e, commit, now);
                        if o.reply.is_ok() {
                            let durable = c.get("t").map(|r| (r.producer_id, r.producer_epoch));
                            prop_assert_eq!(durable, Some((p, e)), "an Ok for a producer that is not current");
                        }
                    }
                }
                Op::WriteDone { ok } => {
                    if ok { let _ = c.complete("t"); } else { c.fail("t"); }
                }
                Op::Markers => {
                    let _ = c.markers_written("t", now);
                }
                Op::Tick { ms } => {
                    now += ms;
                    let _ = c.expired(now);
                }
            }
            if let Some(record) = c.get("t") {
                if let Some(before) = &last {
                    if before != record {
                        prop_assert!(record.state.may_follow(before.state),
                            "{:?} after {:?}", record.state, before.state);
                        prop_assert!((record.producer_id, record.producer_epoch) >= (before.producer_id, before.producer_epoch));
                    }
                }
                if let Some(m) = c.markers("t") {
                    prop_assert_eq!((m.producer_id, m.epoch), (record.producer_id, record.producer_epoch));
                }
                last = Some(record.clone());
            }
        }
    }
}
