//! The producer side of idempotence and transactions for `skiff-bench produce
//! --idempotent | --transactional-id`: the control requests (InitProducerId,
//! FindCoordinator, AddPartitionsToTxn, EndTxn) over one blocking connection,
//! and the [`Gate`] that lets the writer threads send only while a
//! transaction is open.
//!
//! A transactional run (driven by [`run_transactions`] on the thread that
//! started the writers) repeats: AddPartitionsToTxn for every partition the
//! run writes, open the gate for `--commit-interval-ms`, close it and wait
//! until every produce let through is answered, EndTxn(commit). The commit
//! latency is the EndTxn round trip.
//!
//! Error codes in the answers: CONCURRENT_TRANSACTIONS is how a coordinator
//! says the previous transaction's markers are still being written; it is
//! retried (as Kafka's producer does) and counted as a retry, not an error.
//! Other retriable codes (NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS, ...)
//! are counted as errors and retried, the coordinator looked up again when it
//! moved, for at most [`RETRY_FOR`]; any other code ends the run.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use hdrhistogram::Histogram;
use kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnTopic;
use kafka_protocol::messages::{
    AddPartitionsToTxnRequest, AddPartitionsToTxnResponse, ApiKey, EndTxnRequest, EndTxnResponse,
    FindCoordinatorRequest, FindCoordinatorResponse, InitProducerIdRequest, InitProducerIdResponse,
    ProducerId, TopicName, TransactionalId,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use crate::kafka::{self, Connection};
use crate::stats;

/// Kafka's bound on an idempotent producer's requests in flight per
/// connection: a broker remembers the last 5 batches of each producer and
/// partition, so it can only order (and deduplicate) that many.
pub const MAX_IN_FLIGHT_IDEMPOTENT: usize = 5;

/// Versions the load generator speaks: FindCoordinator from v1 (the key
/// type), up to v3 (one key per request; v4 batches them); AddPartitionsToTxn
/// up to v3 (v4 is the brokers' batched form).
const FIND_COORDINATOR_VERSIONS: (i16, i16) = (1, 3);
const INIT_PRODUCER_ID_VERSIONS: (i16, i16) = (0, 4);
const ADD_PARTITIONS_TO_TXN_VERSIONS: (i16, i16) = (0, 3);
const END_TXN_VERSIONS: (i16, i16) = (0, 3);

/// FindCoordinator key type of a transactional id.
const KEY_TYPE_TRANSACTION: i8 = 1;
/// How long setup, and each control request of a run, keeps retrying
/// retriable errors.
pub const RETRY_FOR: Duration = Duration::from_secs(30);
/// First and largest pause between retries (doubling): markers usually take
/// a millisecond or two, and the commit interval is short.
const BACKOFF_FIRST: Duration = Duration::from_millis(2);
const BACKOFF_MAX: Duration = Duration::from_millis(50);
/// InitProducerId's transaction_timeout_ms for an idempotent producer
/// (Kafka's default transaction.timeout.ms; unused without transactions).
const IDEMPOTENT_TIMEOUT_MS: i32 = 60_000;

/// The producer id and epoch every batch of the run carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Producer {
    pub id: i64,
    pub epoch: i16,
}

/// What to do about an error code in a control answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Ok,
    /// CONCURRENT_TRANSACTIONS: wait and ask again (not an error).
    Busy,
    /// A retriable error: ask again after a pause.
    Retry,
    /// The coordinator moved or is not there yet: look it up again.
    Refind,
    Fatal,
}

fn verdict(code: i16) -> Verdict {
    match ResponseError::try_from_code(code) {
        None => Verdict::Ok,
        Some(ResponseError::ConcurrentTransactions) => Verdict::Busy,
        Some(ResponseError::NotCoordinator | ResponseError::CoordinatorNotAvailable) => {
            Verdict::Refind
        }
        Some(ResponseError::CoordinatorLoadInProgress) => Verdict::Retry,
        Some(e) if e.is_retriable() => Verdict::Retry,
        Some(_) => Verdict::Fatal,
    }
}

/// What an error code means for the producer, when it needs saying.
pub fn hint(code: i16) -> &'static str {
    match ResponseError::try_from_code(code) {
        Some(ResponseError::ProducerFenced | ResponseError::InvalidProducerEpoch) => {
            " (fenced: another producer with this transactional id, or a newer epoch, took over)"
        }
        Some(ResponseError::TransactionalIdAuthorizationFailed) => {
            " (the principal may not WRITE this transactional id)"
        }
        _ => "",
    }
}

/// A readable error for a fatal code.
fn fatal(code: i16, what: &str) -> anyhow::Error {
    anyhow::anyhow!(
        "{what}: {} (error code {code}){}; ending the run",
        kafka::error_name(code),
        hint(code)
    )
}

/// Retry pacing for one request: doubling pauses up to a deadline.
struct Backoff {
    deadline: Instant,
    next: Duration,
}

impl Backoff {
    fn new() -> Backoff {
        Backoff {
            deadline: Instant::now() + RETRY_FOR,
            next: BACKOFF_FIRST,
        }
    }

    /// Sleeps before the next attempt; an error once the deadline has passed.
    fn pause(&mut self, what: &str, code: i16) -> anyhow::Result<()> {
        if Instant::now() + self.next > self.deadline {
            bail!(
                "{what}: still {} after {RETRY_FOR:?} of retries",
                kafka::error_name(code)
            );
        }
        std::thread::sleep(self.next);
        self.next = (self.next * 2).min(BACKOFF_MAX);
        Ok(())
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // The state is a few counters, consistent after any panic elsewhere.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// An idempotent producer's id: InitProducerId without a transactional id,
/// to any broker of `bootstrap`.
pub fn init_idempotent(bootstrap: &str) -> anyhow::Result<Producer> {
    let mut conn = Connection::connect_any(bootstrap)?;
    let versions = conn.api_versions()?;
    let version =
        kafka::pick_version(&versions, ApiKey::InitProducerId, INIT_PRODUCER_ID_VERSIONS)?;
    let request = InitProducerIdRequest::default()
        .with_transactional_id(None)
        .with_transaction_timeout_ms(IDEMPOTENT_TIMEOUT_MS);
    let mut backoff = Backoff::new();
    loop {
        let response: InitProducerIdResponse = conn.call(&request, version)?;
        match verdict(response.error_code) {
            Verdict::Ok => {
                return Ok(Producer {
                    id: response.producer_id.0,
                    epoch: response.producer_epoch,
                })
            }
            Verdict::Fatal => return Err(fatal(response.error_code, "InitProducerId")),
            _ => backoff.pause("InitProducerId", response.error_code)?,
        }
    }
}

/// Negotiated versions of the transaction requests.
#[derive(Debug, Clone, Copy)]
struct TxnVersions {
    init_producer_id: i16,
    add_partitions: i16,
    end_txn: i16,
}

/// A transactional producer's control connection to its coordinator.
pub struct TxnClient {
    bootstrap: String,
    id: String,
    conn: Connection,
    versions: TxnVersions,
    pub producer: Producer,
    /// A transaction was begun and not yet ended (aborted on failure).
    open: bool,
}

impl TxnClient {
    /// FindCoordinator for `id`, then InitProducerId with it against that
    /// coordinator (retrying, for at most [`RETRY_FOR`], while the
    /// coordinator's partition is created or loaded or a previous
    /// producer's transaction is being ended).
    pub fn start(bootstrap: &str, id: &str, timeout_ms: i32) -> anyhow::Result<TxnClient> {
        anyhow::ensure!(!id.is_empty(), "the transactional id is empty");
        let (conn, versions) = find_coordinator(bootstrap, id)?;
        let mut client = TxnClient {
            bootstrap: bootstrap.to_string(),
            id: id.to_string(),
            conn,
            versions,
            producer: Producer { id: -1, epoch: -1 },
            open: false,
        };
        let request = InitProducerIdRequest::default()
            .with_transactional_id(Some(TransactionalId(StrBytes::from_string(id.to_string()))))
            .with_transaction_timeout_ms(timeout_ms);
        let what = format!("InitProducerId for transactional id {id}");
        let mut backoff = Backoff::new();
        loop {
            let response: InitProducerIdResponse = client
                .conn
                .call(&request, client.versions.init_producer_id)?;
            match verdict(response.error_code) {
                Verdict::Ok => {
                    client.producer = Producer {
                        id: response.producer_id.0,
                        epoch: response.producer_epoch,
                    };
                    return Ok(client);
                }
                Verdict::Fatal => return Err(fatal(response.error_code, &what)),
                Verdict::Refind => {
                    backoff.pause(&what, response.error_code)?;
                    client.refind()?;
                }
                Verdict::Busy | Verdict::Retry => backoff.pause(&what, response.error_code)?,
            }
        }
    }

    fn refind(&mut self) -> anyhow::Result<()> {
        let (conn, versions) = find_coordinator(&self.bootstrap, &self.id)?;
        self.conn = conn;
        self.versions = versions;
        Ok(())
    }

    /// Begins a transaction: AddPartitionsToTxn for `partitions` of `topic`.
    pub fn add_partitions(
        &mut self,
        topic: &str,
        partitions: &[i32],
        tally: &mut Tally,
    ) -> anyhow::Result<()> {
        let request = AddPartitionsToTxnRequest::default()
            .with_v3_and_below_transactional_id(TransactionalId(StrBytes::from_string(
                self.id.clone(),
            )))
            .with_v3_and_below_producer_id(ProducerId(self.producer.id))
            .with_v3_and_below_producer_epoch(self.producer.epoch)
            .with_v3_and_below_topics(vec![AddPartitionsToTxnTopic::default()
                .with_name(TopicName(StrBytes::from_string(topic.to_string())))
                .with_partitions(partitions.to_vec())]);
        let what = format!("AddPartitionsToTxn for transactional id {}", self.id);
        let mut backoff = Backoff::new();
        loop {
            let response: AddPartitionsToTxnResponse =
                self.conn.call(&request, self.versions.add_partitions)?;
            let code =
                add_partitions_error(&response, partitions.len()).with_context(|| what.clone())?;
            if self.settle(code, &what, tally, &mut backoff)? {
                self.open = true;
                return Ok(());
            }
        }
    }

    /// Ends the open transaction (EndTxn to the coordinator).
    pub fn end(&mut self, commit: bool, tally: &mut Tally) -> anyhow::Result<()> {
        let request = EndTxnRequest::default()
            .with_transactional_id(TransactionalId(StrBytes::from_string(self.id.clone())))
            .with_producer_id(ProducerId(self.producer.id))
            .with_producer_epoch(self.producer.epoch)
            .with_committed(commit);
        let what = format!(
            "EndTxn({}) for transactional id {}",
            if commit { "commit" } else { "abort" },
            self.id
        );
        let mut backoff = Backoff::new();
        loop {
            let response: EndTxnResponse = self.conn.call(&request, self.versions.end_txn)?;
            if self.settle(response.error_code, &what, tally, &mut backoff)? {
                self.open = false;
                return Ok(());
            }
        }
    }

    /// Counts and acts on one answer's error code: true when it succeeded,
    /// false to send again, an error when it is fatal or retries ran out.
    fn settle(
        &mut self,
        code: i16,
        what: &str,
        tally: &mut Tally,
        backoff: &mut Backoff,
    ) -> anyhow::Result<bool> {
        match verdict(code) {
            Verdict::Ok => return Ok(true),
            Verdict::Busy => tally.retries += 1,
            _ => {
                tally.errors.fetch_add(1, Ordering::Relaxed);
                if tally.logged < 5 {
                    tally.logged += 1;
                    tracing::warn!(error = %kafka::error_name(code), "{what} failed");
                }
            }
        }
        match verdict(code) {
            Verdict::Fatal => Err(fatal(code, what)),
            Verdict::Refind => {
                backoff.pause(what, code)?;
                self.refind()?;
                Ok(false)
            }
            _ => {
                backoff.pause(what, code)?;
                Ok(false)
            }
        }
    }

    /// After a failure: aborts the open transaction, if any, so the id does
    /// not hold back read_committed consumers until it times out. Best effort.
    pub fn abort_quietly(&mut self, tally: &mut Tally) {
        if !self.open {
            return;
        }
        if let Err(e) = self.end(false, tally) {
            tracing::warn!(error = %e, "aborting the open transaction failed");
        }
    }
}

/// The one error code of an AddPartitionsToTxn answer (v0-3): 0, or the
/// first partition's code that is not OPERATION_NOT_ATTEMPTED (Kafka answers
/// that for the partitions it did not try because another one failed).
fn add_partitions_error(
    response: &AddPartitionsToTxnResponse,
    asked: usize,
) -> anyhow::Result<i16> {
    let codes: Vec<i16> = response
        .results_by_topic_v3_and_below
        .iter()
        .flat_map(|t| &t.results_by_partition)
        .map(|p| p.partition_error_code)
        .collect();
    if response.error_code != 0 {
        return Ok(response.error_code);
    }
    let not_attempted = ResponseError::OperationNotAttempted.code();
    if let Some(&code) = codes.iter().find(|&&c| c != 0 && c != not_attempted) {
        return Ok(code);
    }
    if let Some(&code) = codes.iter().find(|&&c| c != 0) {
        return Ok(code);
    }
    anyhow::ensure!(
        codes.len() == asked,
        "answered {} of the {asked} partitions asked",
        codes.len()
    );
    Ok(0)
}

/// FindCoordinator (key type 1) for `id` on any broker of `bootstrap`, then
/// a connection to that coordinator with the transaction requests' versions.
fn find_coordinator(bootstrap: &str, id: &str) -> anyhow::Result<(Connection, TxnVersions)> {
    let what = format!("FindCoordinator for transactional id {id}");
    let mut backoff = Backoff::new();
    loop {
        let mut conn = Connection::connect_any(bootstrap)?;
        let served = conn.api_versions()?;
        let version =
            kafka::pick_version(&served, ApiKey::FindCoordinator, FIND_COORDINATOR_VERSIONS)?;
        let request = FindCoordinatorRequest::default()
            .with_key(StrBytes::from_string(id.to_string()))
            .with_key_type(KEY_TYPE_TRANSACTION);
        let response: FindCoordinatorResponse = conn.call(&request, version)?;
        match verdict(response.error_code) {
            Verdict::Ok => {}
            Verdict::Fatal => return Err(fatal(response.error_code, &what)),
            _ => {
                // The first lookup creates __transaction_state: its partition
                // may have no leader yet.
                backoff.pause(&what, response.error_code)?;
                continue;
            }
        }
        let address = format!("{}:{}", response.host.as_str(), response.port);
        let mut conn = Connection::connect(&address)
            .with_context(|| format!("connecting to the transaction coordinator of {id}"))?;
        let served = conn.api_versions()?;
        let versions = TxnVersions {
            init_producer_id: kafka::pick_version(
                &served,
                ApiKey::InitProducerId,
                INIT_PRODUCER_ID_VERSIONS,
            )?,
            add_partitions: kafka::pick_version(
                &served,
                ApiKey::AddPartitionsToTxn,
                ADD_PARTITIONS_TO_TXN_VERSIONS,
            )?,
            end_txn: kafka::pick_version(&served, ApiKey::EndTxn, END_TXN_VERSIONS)?,
        };
        tracing::info!(
            transactional_id = id,
            coordinator = response.node_id.0,
            %address,
            "found the transaction coordinator"
        );
        return Ok((conn, versions));
    }
}

/// The transaction loop's counts, and the run's error counter it adds to.
pub struct Tally<'a> {
    /// CONCURRENT_TRANSACTIONS answers retried (markers still being written).
    pub retries: u64,
    pub errors: &'a AtomicU64,
    logged: u32,
}

impl<'a> Tally<'a> {
    pub fn new(errors: &'a AtomicU64) -> Tally<'a> {
        Tally {
            retries: 0,
            errors,
            logged: 0,
        }
    }
}

/// Lets writers send only while a transaction is open, and counts what it
/// let through until each answer comes back.
#[derive(Debug, Default)]
pub struct Gate {
    state: Mutex<GateState>,
    changed: Condvar,
}

#[derive(Debug, Default)]
struct GateState {
    open: bool,
    finished: bool,
    /// Requests let through and not yet answered.
    in_flight: u64,
}

impl Gate {
    /// A closed gate.
    pub fn new() -> Gate {
        Gate::default()
    }

    /// A writer about to send one request: waits while the gate is closed;
    /// false once the run is finished. On true, [`leave`](Self::leave) must
    /// follow, when the request is answered (or was not sent after all).
    pub fn enter(&self) -> bool {
        let mut s = lock(&self.state);
        while !s.open && !s.finished {
            s = self
                .changed
                .wait(s)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        if s.finished {
            return false;
        }
        s.in_flight += 1;
        true
    }

    pub fn leave(&self) {
        let mut s = lock(&self.state);
        s.in_flight = s.in_flight.saturating_sub(1);
        if s.in_flight == 0 {
            self.changed.notify_all();
        }
    }

    pub fn open(&self) {
        let mut s = lock(&self.state);
        s.open = true;
        self.changed.notify_all();
    }

    /// Closes the gate and waits until every request it let through has
    /// been answered; false when the run finished (failed) meanwhile.
    pub fn close_and_drain(&self) -> bool {
        let mut s = lock(&self.state);
        s.open = false;
        while s.in_flight > 0 && !s.finished {
            s = self
                .changed
                .wait(s)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        !s.finished
    }

    /// The run is over: every waiting writer gives up.
    pub fn finish(&self) {
        let mut s = lock(&self.state);
        s.finished = true;
        s.open = false;
        self.changed.notify_all();
    }
}

/// What a transactional run measured.
pub struct TxnOutcome {
    pub committed: u64,
    pub retries: u64,
    /// AddPartitionsToTxn until it succeeded (CONCURRENT_TRANSACTIONS
    /// retries included: the wait for the previous transaction's markers).
    pub begin: Histogram<u64>,
    /// EndTxn(commit) round trips.
    pub commit: Histogram<u64>,
}

/// The transaction loop: begin (AddPartitionsToTxn for every partition),
/// let the writers send for `interval`, close the gate and wait for every
/// answer, commit; until `over()` says the run has ended; the last
/// transaction is committed too. On failure the open transaction is aborted
/// (best effort) and the gate finished.
pub fn run_transactions(
    client: &mut TxnClient,
    topic: &str,
    partitions: &[i32],
    interval: Duration,
    gate: &Gate,
    over: &dyn Fn() -> bool,
    errors: &AtomicU64,
) -> anyhow::Result<TxnOutcome> {
    let mut tally = Tally::new(errors);
    let mut outcome = TxnOutcome {
        committed: 0,
        retries: 0,
        begin: stats::new_histogram()?,
        commit: stats::new_histogram()?,
    };
    let result = (|| -> anyhow::Result<()> {
        while !over() {
            let asked = Instant::now();
            client.add_partitions(topic, partitions, &mut tally)?;
            stats::record(&mut outcome.begin, asked.elapsed(), 1);
            gate.open();
            let until = Instant::now() + interval;
            loop {
                let now = Instant::now();
                if now >= until || over() {
                    break;
                }
                std::thread::sleep((until - now).min(Duration::from_millis(5)));
            }
            anyhow::ensure!(
                gate.close_and_drain(),
                "the run failed during a transaction"
            );
            let asked = Instant::now();
            client.end(true, &mut tally)?;
            stats::record(&mut outcome.commit, asked.elapsed(), 1);
            outcome.committed += 1;
        }
        Ok(())
    })();
    gate.finish();
    if result.is_err() {
        client.abort_quietly(&mut tally);
    }
    outcome.retries = tally.retries;
    result.map(|()| outcome)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn error_codes_are_retried_refound_or_fatal() {
        assert_eq!(verdict(0), Verdict::Ok);
        assert_eq!(verdict(51), Verdict::Busy); // CONCURRENT_TRANSACTIONS
        assert_eq!(verdict(16), Verdict::Refind); // NOT_COORDINATOR
        assert_eq!(verdict(15), Verdict::Refind); // COORDINATOR_NOT_AVAILABLE
        assert_eq!(verdict(14), Verdict::Retry); // COORDINATOR_LOAD_IN_PROGRESS
        assert_eq!(verdict(90), Verdict::Fatal); // PRODUCER_FENCED
        assert_eq!(verdict(47), Verdict::Fatal); // INVALID_PRODUCER_EPOCH
        assert_eq!(verdict(48), Verdict::Fatal); // INVALID_TXN_STATE
        let e = fatal(90, "EndTxn").to_string();
        assert!(e.contains("ProducerFenced") && e.contains("fenced"), "{e}");
    }

    #[test]
    fn an_add_partitions_answer_names_its_real_error() {
        use kafka_protocol::messages::add_partitions_to_txn_response::{
            AddPartitionsToTxnPartitionResult, AddPartitionsToTxnTopicResult,
        };
        let answer = |codes: &[i16]| {
            AddPartitionsToTxnResponse::default().with_results_by_topic_v3_and_below(vec![
                AddPartitionsToTxnTopicResult::default().with_results_by_partition(
                    codes
                        .iter()
                        .enumerate()
                        .map(|(i, &c)| {
                            AddPartitionsToTxnPartitionResult::default()
                                .with_partition_index(i as i32)
                                .with_partition_error_code(c)
                        })
                        .collect(),
                ),
            ])
        };
        assert_eq!(add_partitions_error(&answer(&[0, 0]), 2).unwrap(), 0);
        assert_eq!(add_partitions_error(&answer(&[55, 3, 55]), 3).unwrap(), 3);
        assert_eq!(add_partitions_error(&answer(&[51, 51]), 2).unwrap(), 51);
        assert!(add_partitions_error(&answer(&[0]), 2).is_err());
    }

    /// The gate holds writers while closed, and closing waits for every
    /// request it let through.
    #[test]
    fn the_gate_drains_before_a_commit() {
        let gate = Arc::new(Gate::new());
        let entered = Arc::new(AtomicU64::new(0));
        let writer = {
            let (gate, entered) = (gate.clone(), entered.clone());
            std::thread::spawn(move || {
                let mut n = 0;
                while gate.enter() {
                    entered.fetch_add(1, Ordering::SeqCst);
                    n += 1;
                    std::thread::sleep(Duration::from_millis(1));
                    gate.leave();
                }
                n
            })
        };
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(
            entered.load(Ordering::SeqCst),
            0,
            "a closed gate lets none in"
        );
        gate.open();
        std::thread::sleep(Duration::from_millis(20));
        assert!(gate.close_and_drain());
        let after = entered.load(Ordering::SeqCst);
        assert!(after > 0);
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(entered.load(Ordering::SeqCst), after, "closed again");
        gate.finish();
        assert_eq!(writer.join().unwrap(), after);
        assert!(!gate.close_and_drain(), "finished");
    }
}
