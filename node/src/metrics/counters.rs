//! What each core counts (`CoreMetrics`, in `CoreState`) and the node's
//! phase: plain cells only its own thread touches. No module of the node is
//! imported here, so the per-core state can hold them without reaching up
//! into the scrape (`super`: gather, snapshots, exposition).

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use kafka_protocol::messages::{ApiKey, ResponseKind};
use skiff_engine::stats::{Histogram, HistogramSnapshot};

/// Request counters are kept per API key below this (Kafka's keys end near 90).
pub const API_KEYS_MAX: usize = 128;

/// Where the node is in its life, for `/health`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Recovering partitions, loading groups, opening listeners.
    Starting,
    /// Every listener open.
    Serving,
    /// Serving, but the controller has fenced this node (its session
    /// expired): it leads nothing until a heartbeat unfences it.
    Fenced,
    /// SIGTERM/SIGINT received: finishing in-flight requests, closing logs.
    Stopping,
}

/// Bytes and records produced to and fetched from one topic.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TopicIo {
    pub bytes_in: u64,
    pub records_in: u64,
    pub bytes_out: u64,
    pub records_out: u64,
}

impl TopicIo {
    fn merge(&mut self, other: &TopicIo) {
        self.bytes_in += other.bytes_in;
        self.records_in += other.records_in;
        self.bytes_out += other.bytes_out;
        self.records_out += other.records_out;
    }
}

/// One core's counters of the Kafka API it serves. Only its own thread touches
/// them (they live in the thread-local `CoreState`), so they are plain cells.
pub struct CoreMetrics {
    /// By topic name; entries of deleted topics are dropped at the next scrape
    /// (`CoreMetrics::snapshot`), so the map is bounded by the live topics.
    topics: RefCell<HashMap<String, TopicIo>>,
    /// By API key.
    requests: [Cell<u64>; API_KEYS_MAX],
    /// (API key, error code) -> responses or partition results with that error.
    errors: RefCell<HashMap<(i16, i16), u64>>,
    /// Frames that did not decode (the connection was closed).
    decode_errors: Cell<u64>,
    /// TLS handshakes that failed (garbage, a refused certificate, a
    /// plaintext client on a TLS listener, a timeout).
    tls_handshake_failures: Cell<u64>,
    /// Requests over a client quota, by `QuotaKey::ALL` index.
    throttled: [Cell<u64>; 3],
    connections_accepted: Cell<u64>,
    connections_open: Cell<u64>,
    produce_latency_acks_1: Histogram,
    produce_latency_acks_all: Histogram,
    fetch_latency: Histogram,
}

impl Default for CoreMetrics {
    fn default() -> Self {
        CoreMetrics {
            topics: RefCell::default(),
            requests: std::array::from_fn(|_| Cell::new(0)),
            errors: RefCell::default(),
            decode_errors: Cell::new(0),
            tls_handshake_failures: Cell::new(0),
            throttled: std::array::from_fn(|_| Cell::new(0)),
            connections_accepted: Cell::new(0),
            connections_open: Cell::new(0),
            produce_latency_acks_1: Histogram::default(),
            produce_latency_acks_all: Histogram::default(),
            fetch_latency: Histogram::default(),
        }
    }
}

fn add(cell: &Cell<u64>, n: u64) {
    cell.set(cell.get().saturating_add(n));
}

impl CoreMetrics {
    fn topic(&self, topic: &str, f: impl FnOnce(&mut TopicIo)) {
        let mut topics = self.topics.borrow_mut();
        // No allocation once the topic has an entry.
        match topics.get_mut(topic) {
            Some(io) => f(io),
            None => f(topics.entry(topic.to_string()).or_default()),
        }
    }

    /// A batch appended to `topic` (not a duplicate answered from producer state).
    pub fn produced(&self, topic: &str, bytes: usize, records: i32) {
        self.topic(topic, |io| {
            io.bytes_in += bytes as u64;
            io.records_in += u64::try_from(records).unwrap_or(0);
        });
    }

    /// Batches of `topic` put into a fetch response.
    pub fn fetched(&self, topic: &str, bytes: usize, records: u64) {
        self.topic(topic, |io| {
            io.bytes_out += bytes as u64;
            io.records_out += records;
        });
    }

    pub fn request(&self, api_key: ApiKey) {
        if let Some(c) = self.requests.get(api_key as i16 as usize) {
            add(c, 1);
        }
    }

    /// Counts every error code a response carries (top level, per topic, per
    /// partition), as Kafka's ErrorsPerSec does.
    pub fn response(&self, api_key: ApiKey, response: &ResponseKind) {
        error_codes(response, |code| {
            if code != 0 {
                *self
                    .errors
                    .borrow_mut()
                    .entry((api_key as i16, code))
                    .or_default() += 1;
            }
        });
    }

    pub fn decode_error(&self) {
        add(&self.decode_errors, 1);
    }

    pub fn tls_handshake_failed(&self) {
        add(&self.tls_handshake_failures, 1);
    }

    pub fn throttled(&self, key: skiff_security::quota::QuotaKey) {
        if let Some(i) = skiff_security::quota::QuotaKey::ALL
            .iter()
            .position(|k| *k == key)
        {
            add(&self.throttled[i], 1);
        }
    }

    pub fn connection_opened(&self) {
        add(&self.connections_accepted, 1);
        add(&self.connections_open, 1);
    }

    pub fn connection_closed(&self) {
        self.connections_open
            .set(self.connections_open.get().saturating_sub(1));
    }

    /// A produce answered `elapsed` after its frame was decoded (acks=1 or -1;
    /// acks=0 is never answered).
    pub fn produce_latency(&self, acks: i16, elapsed: Duration) {
        match acks {
            -1 => self.produce_latency_acks_all.observe(elapsed),
            1 => self.produce_latency_acks_1.observe(elapsed),
            _ => {}
        }
    }

    /// A fetch answered `elapsed` after its frame was decoded (long poll included).
    pub fn fetch_latency(&self, elapsed: Duration) {
        self.fetch_latency.observe(elapsed);
    }

    /// The counters now; forgets topics `live` does not know (deleted ones).
    pub(super) fn snapshot(&self, live: impl Fn(&str) -> bool) -> ApiSnapshot {
        self.topics.borrow_mut().retain(|name, _| live(name));
        ApiSnapshot {
            topics: self
                .topics
                .borrow()
                .iter()
                .map(|(k, v)| (k.clone(), *v))
                .collect(),
            requests: self
                .requests
                .iter()
                .enumerate()
                .filter(|(_, c)| c.get() > 0)
                .map(|(key, c)| (key as i16, c.get()))
                .collect(),
            errors: self.errors.borrow().iter().map(|(k, v)| (*k, *v)).collect(),
            decode_errors: self.decode_errors.get(),
            tls_handshake_failures: self.tls_handshake_failures.get(),
            throttled: std::array::from_fn(|i| self.throttled[i].get()),
            connections_accepted: self.connections_accepted.get(),
            connections_refused: 0,
            connections_open: self.connections_open.get(),
            produce_latency_acks_1: self.produce_latency_acks_1.snapshot(),
            produce_latency_acks_all: self.produce_latency_acks_all.snapshot(),
            fetch_latency: self.fetch_latency.snapshot(),
        }
    }
}

/// Calls `f` with every error code in a response.
fn error_codes(response: &ResponseKind, mut f: impl FnMut(i16)) {
    match response {
        ResponseKind::Produce(r) => r
            .responses
            .iter()
            .flat_map(|t| &t.partition_responses)
            .for_each(|p| f(p.error_code)),
        ResponseKind::Fetch(r) => {
            f(r.error_code);
            r.responses
                .iter()
                .flat_map(|t| &t.partitions)
                .for_each(|p| f(p.error_code));
        }
        ResponseKind::ListOffsets(r) => r
            .topics
            .iter()
            .flat_map(|t| &t.partitions)
            .for_each(|p| f(p.error_code)),
        ResponseKind::Metadata(r) => {
            for t in &r.topics {
                f(t.error_code);
                t.partitions.iter().for_each(|p| f(p.error_code));
            }
        }
        ResponseKind::CreateTopics(r) => r.topics.iter().for_each(|t| f(t.error_code)),
        ResponseKind::DeleteTopics(r) => r.responses.iter().for_each(|t| f(t.error_code)),
        ResponseKind::CreatePartitions(r) => r.results.iter().for_each(|t| f(t.error_code)),
        ResponseKind::DescribeCluster(r) => f(r.error_code),
        ResponseKind::DescribeProducers(r) => r
            .topics
            .iter()
            .flat_map(|t| &t.partitions)
            .for_each(|p| f(p.error_code)),
        ResponseKind::DescribeLogDirs(r) => {
            f(r.error_code);
            r.results.iter().for_each(|x| f(x.error_code));
        }
        ResponseKind::OffsetDelete(r) => {
            f(r.error_code);
            r.topics
                .iter()
                .flat_map(|t| &t.partitions)
                .for_each(|p| f(p.error_code));
        }
        ResponseKind::AlterConfigs(r) => r.responses.iter().for_each(|x| f(x.error_code)),
        ResponseKind::AlterPartitionReassignments(r) => {
            f(r.error_code);
            r.responses
                .iter()
                .flat_map(|t| &t.partitions)
                .for_each(|p| f(p.error_code));
        }
        ResponseKind::ListPartitionReassignments(r) => f(r.error_code),
        ResponseKind::UnregisterBroker(r) => f(r.error_code),
        ResponseKind::ElectLeaders(r) => {
            f(r.error_code);
            r.replica_election_results
                .iter()
                .flat_map(|t| &t.partition_result)
                .for_each(|p| f(p.error_code));
        }
        ResponseKind::DescribeQuorum(r) => {
            f(r.error_code);
            r.topics
                .iter()
                .flat_map(|t| &t.partitions)
                .for_each(|p| f(p.error_code));
        }
        ResponseKind::DeleteRecords(r) => r
            .topics
            .iter()
            .flat_map(|t| &t.partitions)
            .for_each(|p| f(p.error_code)),
        ResponseKind::DescribeConfigs(r) => r.results.iter().for_each(|x| f(x.error_code)),
        ResponseKind::IncrementalAlterConfigs(r) => {
            r.responses.iter().for_each(|x| f(x.error_code))
        }
        ResponseKind::FindCoordinator(r) => {
            f(r.error_code);
            r.coordinators.iter().for_each(|c| f(c.error_code));
        }
        ResponseKind::JoinGroup(r) => f(r.error_code),
        ResponseKind::SyncGroup(r) => f(r.error_code),
        ResponseKind::Heartbeat(r) => f(r.error_code),
        ResponseKind::LeaveGroup(r) => {
            f(r.error_code);
            r.members.iter().for_each(|m| f(m.error_code));
        }
        ResponseKind::OffsetCommit(r) => r
            .topics
            .iter()
            .flat_map(|t| &t.partitions)
            .for_each(|p| f(p.error_code)),
        ResponseKind::OffsetFetch(r) => {
            f(r.error_code);
            r.topics
                .iter()
                .flat_map(|t| &t.partitions)
                .for_each(|p| f(p.error_code));
            for g in &r.groups {
                f(g.error_code);
                g.topics
                    .iter()
                    .flat_map(|t| &t.partitions)
                    .for_each(|p| f(p.error_code));
            }
        }
        ResponseKind::ListGroups(r) => f(r.error_code),
        ResponseKind::DescribeGroups(r) => r.groups.iter().for_each(|g| f(g.error_code)),
        ResponseKind::DeleteGroups(r) => r.results.iter().for_each(|g| f(g.error_code)),
        ResponseKind::InitProducerId(r) => f(r.error_code),
        ResponseKind::ApiVersions(r) => f(r.error_code),
        _ => {}
    }
}

/// The API counters of one core (or, merged, of the node).
#[derive(Debug, Clone, Default)]
pub struct ApiSnapshot {
    pub topics: BTreeMap<String, TopicIo>,
    pub requests: BTreeMap<i16, u64>,
    pub errors: BTreeMap<(i16, i16), u64>,
    pub decode_errors: u64,
    pub tls_handshake_failures: u64,
    /// Requests throttled, by `QuotaKey::ALL` index.
    pub throttled: [u64; 3],
    pub connections_accepted: u64,
    /// New connections closed at once for `max.connections.per.ip`
    /// (node-wide, taken once per scrape, not merged).
    pub connections_refused: u64,
    pub connections_open: u64,
    pub produce_latency_acks_1: HistogramSnapshot,
    pub produce_latency_acks_all: HistogramSnapshot,
    pub fetch_latency: HistogramSnapshot,
}

impl ApiSnapshot {
    pub(super) fn merge(&mut self, other: &ApiSnapshot) {
        for (topic, io) in &other.topics {
            self.topics.entry(topic.clone()).or_default().merge(io);
        }
        for (key, n) in &other.requests {
            *self.requests.entry(*key).or_default() += n;
        }
        for (key, n) in &other.errors {
            *self.errors.entry(*key).or_default() += n;
        }
        self.decode_errors += other.decode_errors;
        self.tls_handshake_failures += other.tls_handshake_failures;
        for (t, o) in self.throttled.iter_mut().zip(other.throttled) {
            *t += o;
        }
        self.connections_accepted += other.connections_accepted;
        self.connections_open += other.connections_open;
        self.produce_latency_acks_1
            .merge(&other.produce_latency_acks_1);
        self.produce_latency_acks_all
            .merge(&other.produce_latency_acks_all);
        self.fetch_latency.merge(&other.fetch_latency);
    }
}
