//! The Prometheus text exposition format (0.0.4) of a node's `Snapshot`.
//!
//! Names follow Prometheus' rules: `skiff_` prefix, snake_case, base units
//! (`_bytes`, `_seconds`), counters end in `_total`. Every family gets its
//! `# HELP` and `# TYPE` line once, before its samples.

use std::fmt::Write;

use kafka_protocol::messages::ApiKey;
use kafka_protocol::ResponseError;
use skiff_engine::stats::HistogramSnapshot;

use super::{ClusterSnapshot, Snapshot};

pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

struct Writer {
    out: String,
}

impl Writer {
    fn family(&mut self, name: &str, kind: Kind, help: &str) {
        let _ = writeln!(self.out, "# HELP {name} {help}");
        let _ = writeln!(self.out, "# TYPE {name} {}", kind.as_str());
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl std::fmt::Display) {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let _ = write!(self.out, "{k}=\"{}\"", escape(v));
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {value}");
    }

    /// A family with a single unlabelled sample.
    fn single(&mut self, name: &str, kind: Kind, help: &str, value: impl std::fmt::Display) {
        self.family(name, kind, help);
        self.sample(name, &[], value);
    }

    fn histogram(&mut self, name: &str, labels: &[(&str, &str)], h: &HistogramSnapshot) {
        let bucket = format!("{name}_bucket");
        for (le, count) in h.cumulative() {
            let le = if le.is_infinite() {
                "+Inf".to_string()
            } else {
                le.to_string()
            };
            let mut with_le = labels.to_vec();
            with_le.push(("le", &le));
            self.sample(&bucket, &with_le, count);
        }
        self.sample(&format!("{name}_sum"), labels, h.sum_seconds());
        self.sample(&format!("{name}_count"), labels, h.count());
    }
}

/// Label values escape backslash, double quote and newline.
fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

fn api_name(key: i16) -> String {
    ApiKey::try_from(key).map_or_else(|()| format!("ApiKey{key}"), |k| format!("{k:?}"))
}

/// Kafka's own spelling of an error: `UNKNOWN_TOPIC_OR_PARTITION`.
fn error_name(code: i16) -> String {
    match ResponseError::try_from_code(code) {
        None => "NONE".into(),
        Some(ResponseError::Unknown(code)) => format!("UNKNOWN_{}", code.unsigned_abs()),
        Some(e) => {
            let camel = e.to_string();
            let mut out = String::with_capacity(camel.len() + 8);
            for (i, c) in camel.chars().enumerate() {
                if c.is_ascii_uppercase() && i > 0 {
                    out.push('_');
                }
                out.push(c.to_ascii_uppercase());
            }
            out
        }
    }
}

/// The node's metrics in the Prometheus text format.
pub fn render(s: &Snapshot, node_id: i32) -> String {
    let mut w = Writer { out: String::new() };
    let node_id = node_id.to_string();
    w.family(
        "skiff_build_info",
        Kind::Gauge,
        "Always 1; the labels say which node and version.",
    );
    w.sample(
        "skiff_build_info",
        &[
            ("node_id", &node_id),
            ("version", env!("CARGO_PKG_VERSION")),
        ],
        1,
    );
    w.single(
        "skiff_cores",
        Kind::Gauge,
        "Shards (one executor per core) serving this node.",
        s.cores,
    );

    // Per topic: produce in, fetch out.
    type Field = fn(&super::TopicIo) -> u64;
    let topic_families: [(&str, &str, Field); 4] = [
        (
            "skiff_topic_bytes_in_total",
            "Record batch bytes appended by produce requests, per topic.",
            |io| io.bytes_in,
        ),
        (
            "skiff_topic_records_in_total",
            "Records appended by produce requests, per topic.",
            |io| io.records_in,
        ),
        (
            "skiff_topic_bytes_out_total",
            "Record batch bytes returned by fetch requests, per topic.",
            |io| io.bytes_out,
        ),
        (
            "skiff_topic_records_out_total",
            "Records in the batches returned by fetch requests, per topic.",
            |io| io.records_out,
        ),
    ];
    for (name, help, field) in topic_families {
        w.family(name, Kind::Counter, help);
        for (topic, io) in &s.api.topics {
            w.sample(name, &[("topic", topic)], field(io));
        }
    }

    w.family(
        "skiff_requests_total",
        Kind::Counter,
        "Kafka requests received, per API.",
    );
    for (key, n) in &s.api.requests {
        w.sample("skiff_requests_total", &[("api", &api_name(*key))], n);
    }
    w.family(
        "skiff_request_errors_total",
        Kind::Counter,
        "Error codes in Kafka responses (top level, per topic and per partition), per API and error.",
    );
    for ((key, code), n) in &s.api.errors {
        w.sample(
            "skiff_request_errors_total",
            &[("api", &api_name(*key)), ("error", &error_name(*code))],
            n,
        );
    }
    w.single(
        "skiff_request_decode_errors_total",
        Kind::Counter,
        "Request frames that did not decode; each closed its connection.",
        s.api.decode_errors,
    );
    w.single(
        "skiff_tls_handshake_failures_total",
        Kind::Counter,
        "TLS handshakes on SSL and SASL_SSL listeners that failed; each closed its connection.",
        s.api.tls_handshake_failures,
    );
    w.family(
        "skiff_quota_throttled_total",
        Kind::Counter,
        "Requests over a client quota (each answered with throttle_time_ms and its connection muted that long), per quota.",
    );
    for (key, n) in skiff_security::quota::QuotaKey::ALL
        .iter()
        .zip(s.api.throttled)
    {
        w.sample("skiff_quota_throttled_total", &[("quota", key.name())], n);
    }
    w.single(
        "skiff_connections_refused_total",
        Kind::Counter,
        "New connections closed at once because their address held max.connections.per.ip.",
        s.api.connections_refused,
    );
    w.single(
        "skiff_connections_accepted_total",
        Kind::Counter,
        "Kafka client connections accepted.",
        s.api.connections_accepted,
    );
    w.single(
        "skiff_connections",
        Kind::Gauge,
        "Kafka client connections open.",
        s.api.connections_open,
    );

    w.family(
        "skiff_produce_latency_seconds",
        Kind::Histogram,
        "Produce requests from decoded to answered (acks=all: once durable); acks=0 is never answered and not measured.",
    );
    w.histogram(
        "skiff_produce_latency_seconds",
        &[("acks", "1")],
        &s.api.produce_latency_acks_1,
    );
    w.histogram(
        "skiff_produce_latency_seconds",
        &[("acks", "all")],
        &s.api.produce_latency_acks_all,
    );
    w.family(
        "skiff_fetch_latency_seconds",
        Kind::Histogram,
        "Fetch requests from decoded to answered, long-poll wait included.",
    );
    w.histogram("skiff_fetch_latency_seconds", &[], &s.api.fetch_latency);
    w.single(
        "skiff_fetch_sessions",
        Kind::Gauge,
        "KIP-227 incremental fetch sessions held (max.incremental.fetch.session.cache.slots).",
        s.fetch_sessions.sessions,
    );
    w.single(
        "skiff_fetch_session_partitions",
        Kind::Gauge,
        "Partitions held over every fetch session.",
        s.fetch_sessions.partitions,
    );
    w.single(
        "skiff_fetch_sessions_created_total",
        Kind::Counter,
        "Fetch sessions made.",
        s.fetch_sessions.created,
    );
    w.single(
        "skiff_fetch_sessions_evicted_total",
        Kind::Counter,
        "Fetch sessions evicted to make room for another.",
        s.fetch_sessions.evicted,
    );

    w.single(
        "skiff_batch_cache_hits_total",
        Kind::Counter,
        "Reads served from the batch cache.",
        s.cache_hits,
    );
    w.single(
        "skiff_batch_cache_misses_total",
        Kind::Counter,
        "Reads that went to disk.",
        s.cache_misses,
    );
    w.single(
        "skiff_batch_cache_bytes",
        Kind::Gauge,
        "Bytes of record batches held in the batch caches.",
        s.cache_bytes,
    );
    w.single(
        "skiff_batch_cache_max_bytes",
        Kind::Gauge,
        "The batch caches' byte budget (skiff.batch.cache.bytes per core, summed).",
        s.cache_bytes_max,
    );

    w.family(
        "skiff_log_fsync_duration_seconds",
        Kind::Histogram,
        "Group-committed fdatasyncs of partition logs; _count is the number of fsyncs.",
    );
    w.histogram("skiff_log_fsync_duration_seconds", &[], &s.engine.fsync);
    w.single(
        "skiff_log_fsync_errors_total",
        Kind::Counter,
        "fdatasyncs that failed (each takes its partition offline).",
        s.engine.fsync_errors,
    );

    w.family(
        "skiff_log_roll_duration_seconds",
        Kind::Histogram,
        "Rolls of partitions' active segments (the closed one flushed, trimmed, indexed and synced, the next one created): the time the partition's appends waited; _count is the number of rolls.",
    );
    w.histogram("skiff_log_roll_duration_seconds", &[], &s.engine.roll);

    type LogField = fn(&skiff_engine::LogStats) -> i64;
    let log_families: [(&str, &str, LogField); 5] = [
        ("skiff_log_segments", "Segments of a partition log.", |l| {
            l.segments as i64
        }),
        (
            "skiff_log_size_bytes",
            "Bytes of a partition log's segments.",
            |l| l.size_bytes as i64,
        ),
        (
            "skiff_log_free_segment_bytes",
            "Bytes of segment files retention removed, kept for the partition's next segments (skiff.log.segment.recycle).",
            |l| l.free_bytes as i64,
        ),
        (
            "skiff_log_start_offset",
            "A partition's log start offset.",
            |l| l.log_start_offset,
        ),
        (
            "skiff_log_end_offset",
            "A partition's log end offset.",
            |l| l.log_end_offset,
        ),
    ];
    for (name, help, field) in log_families {
        w.family(name, Kind::Gauge, help);
        for p in &s.partitions {
            let partition = p.tp.partition.to_string();
            w.sample(
                name,
                &[("topic", &p.tp.topic), ("partition", &partition)],
                field(&p.log),
            );
        }
    }

    // Transactions: only logs that have held one get these series.
    type TxnField = fn(&skiff_engine::TxnStats) -> i64;
    let txn_families: [(&str, &str, TxnField); 2] = [
        (
            "skiff_log_open_transactions",
            "Transactions open on a partition (begun, no marker yet).",
            |t| t.open as i64,
        ),
        (
            "skiff_log_last_stable_offset_lag",
            "Records between a partition's last stable offset and its high watermark: what read_committed readers wait for.",
            |t| t.lso_lag,
        ),
    ];
    for (name, help, field) in txn_families {
        w.family(name, Kind::Gauge, help);
        for p in &s.partitions {
            let Some(t) = &p.log.transactions else {
                continue;
            };
            let partition = p.tp.partition.to_string();
            w.sample(
                name,
                &[("topic", &p.tp.topic), ("partition", &partition)],
                field(t),
            );
        }
    }

    w.single(
        "skiff_log_cleaner_runs_total",
        Kind::Counter,
        "Completed cleanings of compacted logs.",
        s.engine.cleaner_runs,
    );
    w.single(
        "skiff_log_cleaner_errors_total",
        Kind::Counter,
        "Cleanings that failed (the log stays uncleaned until restart).",
        s.engine.cleaner_errors,
    );
    w.single(
        "skiff_log_cleaner_read_bytes_total",
        Kind::Counter,
        "Log bytes the cleaner read.",
        s.engine.cleaner_read_bytes,
    );
    w.single(
        "skiff_log_cleaner_written_bytes_total",
        Kind::Counter,
        "Log bytes the cleaner wrote.",
        s.engine.cleaner_written_bytes,
    );
    w.single(
        "skiff_log_segments_recycled_total",
        Kind::Counter,
        "Segment rolls that reused a file retention removed (skiff.log.segment.recycle).",
        s.engine.segments_recycled,
    );
    w.single(
        "skiff_log_retention_deleted_segments_total",
        Kind::Counter,
        "Segments deleted by retention.ms / retention.bytes.",
        s.engine.retention_deleted_segments,
    );
    w.single(
        "skiff_log_retention_deleted_bytes_total",
        Kind::Counter,
        "Bytes deleted by retention.ms / retention.bytes.",
        s.engine.retention_deleted_bytes,
    );

    w.single(
        "skiff_partitions",
        Kind::Gauge,
        "Partition logs open on this node.",
        s.partitions.len(),
    );
    w.single(
        "skiff_partitions_offline",
        Kind::Gauge,
        "Partitions this node holds but cannot serve (failed write or fdatasync, or no log).",
        s.offline.len(),
    );
    render_cluster(&mut w, &s.cluster);
    render_replication(&mut w, &s.replication);
    w.out
}

/// A controller-only node's exposition: its controller's families alone.
pub fn render_controller(status: &skiff_controller::service::ControllerStatus) -> String {
    let mut w = Writer { out: String::new() };
    render_cluster(
        &mut w,
        &ClusterSnapshot {
            broker: None,
            controller: Some(status.clone()),
        },
    );
    w.out
}

/// The broker's view of the cluster (when the scraping core has the broker
/// link) and this node's controller (when it runs one).
fn render_cluster(w: &mut Writer, c: &ClusterSnapshot) {
    if let Some(b) = &c.broker {
        w.single(
            "skiff_broker_fenced",
            Kind::Gauge,
            "1 while the controller has this broker fenced (or no heartbeat was acknowledged for a session), else 0.",
            u8::from(b.fenced),
        );
        w.single(
            "skiff_broker_metadata_offset",
            Kind::Gauge,
            "The last metadata log offset this broker applied.",
            b.metadata_offset,
        );
        w.single(
            "skiff_cluster_brokers",
            Kind::Gauge,
            "Brokers registered in the cluster, fenced ones included (this broker's applied metadata).",
            b.cluster_brokers,
        );
        w.single(
            "skiff_cluster_brokers_fenced",
            Kind::Gauge,
            "Registered brokers the controller has fenced (this broker's applied metadata).",
            b.cluster_brokers_fenced,
        );
        w.single(
            "skiff_cluster_partitions_offline",
            Kind::Gauge,
            "Partitions of the whole cluster without a leader (leader -1), from this broker's applied metadata; skiff_partitions_offline counts this node's unservable logs.",
            b.cluster_partitions_offline,
        );
        w.single(
            "skiff_partitions_led",
            Kind::Gauge,
            "Partitions this node leads, per the applied metadata.",
            b.partitions_led,
        );
        w.single(
            "skiff_partitions_under_replicated",
            Kind::Gauge,
            "Partitions this node leads whose ISR is smaller than their replica set.",
            b.partitions_under_replicated,
        );
        w.single(
            "skiff_partitions_under_min_isr",
            Kind::Gauge,
            "Partitions this node leads whose ISR is smaller than the topic's min.insync.replicas.",
            b.partitions_under_min_isr,
        );
    }
    if let Some(status) = &c.controller {
        w.single(
            "skiff_controller_active",
            Kind::Gauge,
            "1 when this node's controller is the active one (Raft leader with its term's first entry applied), else 0.",
            u8::from(status.active),
        );
        w.single(
            "skiff_controller_raft_term",
            Kind::Gauge,
            "The Raft term this node's controller is in.",
            status.term,
        );
        w.single(
            "skiff_controller_commit_index",
            Kind::Gauge,
            "The highest metadata log index this node's controller knows committed.",
            status.commit_index,
        );
        w.single(
            "skiff_controller_applied_offset",
            Kind::Gauge,
            "The last metadata log offset this node's controller applied.",
            status.applied_offset,
        );
        w.single(
            "skiff_controller_unclean_leader_elections_total",
            Kind::Counter,
            "Unclean leader elections (a leader from outside the ISR) this controller made while active, since it started.",
            status.unclean_elections,
        );
        w.single(
            "skiff_controller_fenced_nodes",
            Kind::Gauge,
            "Registered nodes fenced, in this controller's applied metadata.",
            status.nodes.iter().filter(|n| n.fenced).count(),
        );
        w.family(
            "skiff_controller_node_metadata_lag",
            Kind::Gauge,
            "Metadata offsets a node is behind the active controller (its applied offset minus the one the node last heartbeated); only on the active controller, only for nodes that reported.",
        );
        // A standby controller's reports are stale (heartbeats go to the
        // active one), so only the active one says.
        if status.active {
            for n in &status.nodes {
                if let Some(reported) = n.metadata_offset {
                    w.sample(
                        "skiff_controller_node_metadata_lag",
                        &[("node", &n.id.to_string())],
                        status.applied_offset.saturating_sub(reported),
                    );
                }
            }
        }
    }
}

/// Replication: ISR changes, leaderships, the follower fetchers, and per
/// follower of a partition this node leads its lag.
fn render_replication(w: &mut Writer, r: &crate::replica::ReplicationSnapshot) {
    for (name, help, value) in [
        (
            "skiff_isr_shrinks_total",
            "ISR shrinks this node proposed as a partition leader (a follower fell behind).",
            r.isr_shrinks,
        ),
        (
            "skiff_isr_expands_total",
            "ISR expansions this node proposed as a partition leader (a follower caught up).",
            r.isr_expands,
        ),
        (
            "skiff_leader_elections_total",
            "Partition leaderships this node took (a partition at a new leader epoch).",
            r.leaderships,
        ),
        (
            "skiff_replica_fetch_requests_total",
            "Fetch requests this node's follower fetchers sent.",
            r.fetch_requests,
        ),
        (
            "skiff_replica_fetch_bytes_total",
            "Record batch bytes this node's follower fetchers received.",
            r.fetch_bytes,
        ),
        (
            "skiff_replica_fetch_errors_total",
            "Follower fetch requests that failed (connection, timeout, undecodable answer).",
            r.fetch_errors,
        ),
        (
            "skiff_replication_throttled_leader_bytes_total",
            "Record bytes this node sent as a leader to out-of-sync replicas under leader.replication.throttled.rate.",
            r.throttled_leader_bytes,
        ),
        (
            "skiff_replication_throttled_follower_bytes_total",
            "Record bytes this node fetched as an out-of-sync follower under follower.replication.throttled.rate.",
            r.throttled_follower_bytes,
        ),
    ] {
        w.single(name, Kind::Counter, help, value);
    }
    type LagField = fn(&crate::replica::FollowerLagSample) -> f64;
    let lag_families: [(&str, &str, LagField); 2] = [
        (
            "skiff_replica_lag_records",
            "Per follower of a partition this node leads: records behind the leader's log end.",
            |l| l.records_behind.max(0) as f64,
        ),
        (
            "skiff_replica_lag_seconds",
            "Per follower of a partition this node leads: time since it last caught up with the leader.",
            |l| l.caught_up_ms_ago as f64 / 1000.0,
        ),
    ];
    for (name, help, field) in lag_families {
        w.family(name, Kind::Gauge, help);
        for l in &r.lag {
            let partition = l.tp.partition.to_string();
            let follower = l.follower.to_string();
            w.sample(
                name,
                &[
                    ("topic", &l.tp.topic),
                    ("partition", &partition),
                    ("follower", &follower),
                ],
                field(l),
            );
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::collections::{BTreeMap, HashSet};
    use std::time::Duration;

    use skiff_engine::stats::Histogram;
    use skiff_engine::{LogStats, TopicPartition};

    use super::*;
    use skiff_controller::service::{ControllerStatus, NodeStatus};

    use crate::metrics::{ApiSnapshot, BrokerSnapshot, PartitionSnapshot, TopicIo};

    /// One parsed sample line.
    #[derive(Debug)]
    struct Sample {
        name: String,
        labels: BTreeMap<String, String>,
        value: f64,
    }

    fn valid_name(name: &str) -> bool {
        let mut chars = name.chars();
        chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    }

    fn valid_label_name(name: &str) -> bool {
        valid_name(name) && !name.contains(':')
    }

    /// `name{k="v",...} value`, per the 0.0.4 text format (no timestamps here).
    fn parse_sample(line: &str) -> Result<Sample, String> {
        let (name_labels, value) = line
            .rsplit_once(' ')
            .ok_or_else(|| format!("no value: {line}"))?;
        let value = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v.parse::<f64>().map_err(|_| format!("bad value: {line}"))?,
        };
        let (name, labels) = match name_labels.split_once('{') {
            None => (name_labels, BTreeMap::new()),
            Some((name, rest)) => {
                let body = rest
                    .strip_suffix('}')
                    .ok_or_else(|| format!("unclosed labels: {line}"))?;
                let mut labels = BTreeMap::new();
                let mut rest = body;
                while !rest.is_empty() {
                    let (k, after) = rest
                        .split_once("=\"")
                        .ok_or_else(|| format!("bad label: {line}"))?;
                    if !valid_label_name(k) {
                        return Err(format!("bad label name {k:?}: {line}"));
                    }
                    // The value runs to the first unescaped quote.
                    let mut value = String::new();
                    let mut chars = after.char_indices();
                    let mut end = None;
                    while let Some((i, c)) = chars.next() {
                        match c {
                            '\\' => match chars.next() {
                                Some((_, 'n')) => value.push('\n'),
                                Some((_, c @ ('\\' | '"'))) => value.push(c),
                                _ => return Err(format!("bad escape: {line}")),
                            },
                            '"' => {
                                end = Some(i);
                                break;
                            }
                            c => value.push(c),
                        }
                    }
                    let end = end.ok_or_else(|| format!("unterminated value: {line}"))?;
                    if labels.insert(k.to_string(), value).is_some() {
                        return Err(format!("repeated label {k}: {line}"));
                    }
                    rest = &after[end + 1..];
                    rest = rest.strip_prefix(',').unwrap_or(rest);
                }
                (name, labels)
            }
        };
        Ok(Sample {
            name: name.to_string(),
            labels,
            value,
        })
    }

    /// Parses a whole exposition and checks its grammar and Prometheus' naming
    /// and histogram rules; returns the families' types and the samples.
    fn check_exposition(text: &str) -> (BTreeMap<String, String>, Vec<Sample>) {
        let mut types: BTreeMap<String, String> = BTreeMap::new();
        let mut helped: HashSet<String> = HashSet::new();
        let mut samples = Vec::new();
        assert!(text.ends_with('\n'), "exposition ends with a newline");
        for line in text.lines() {
            assert!(!line.is_empty(), "no blank lines");
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let (name, help) = rest.split_once(' ').expect("HELP has text");
                assert!(!help.is_empty());
                assert!(helped.insert(name.to_string()), "HELP twice for {name}");
            } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').expect("TYPE has a kind");
                assert!(["counter", "gauge", "histogram"].contains(&kind), "{line}");
                assert!(helped.contains(name), "HELP before TYPE for {name}");
                assert!(
                    types.insert(name.to_string(), kind.to_string()).is_none(),
                    "TYPE twice for {name}"
                );
            } else {
                assert!(!line.starts_with('#'), "unknown comment {line}");
                let sample = parse_sample(line).unwrap_or_else(|e| panic!("{e}"));
                samples.push(sample);
            }
        }
        for (name, kind) in &types {
            assert!(valid_name(name), "invalid metric name {name}");
            assert!(name.starts_with("skiff_"), "{name} lacks the skiff_ prefix");
            assert_eq!(name, &name.to_lowercase(), "{name} has uppercase");
            assert!(!name.contains("__"), "{name} has a double underscore");
            match kind.as_str() {
                "counter" => assert!(name.ends_with("_total"), "counter {name} lacks _total"),
                _ => assert!(!name.ends_with("_total"), "{kind} {name} ends in _total"),
            }
            for unit in ["_ms", "_millis", "_kb", "_mb", "_bytes_bytes"] {
                assert!(!name.contains(unit), "{name}: not a base unit ({unit})");
            }
        }
        // Every sample belongs to a declared family (histograms: its series).
        for s in &samples {
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| {
                    let base = s.name.strip_suffix(suffix)?;
                    (types.get(base).map(String::as_str) == Some("histogram")).then_some(base)
                })
                .unwrap_or(&s.name);
            assert!(types.contains_key(family), "sample {} has no TYPE", s.name);
            if s.name.ends_with("_bucket") {
                assert!(s.labels.contains_key("le"), "{} without le", s.name);
            }
            assert!(s.value.is_finite() || s.labels.contains_key("le"));
        }
        // Histograms: cumulative buckets ending in +Inf == _count.
        for (name, kind) in &types {
            if kind != "histogram" {
                continue;
            }
            let mut series: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
            for s in samples
                .iter()
                .filter(|s| s.name == format!("{name}_bucket"))
            {
                let le = s.labels["le"].parse::<f64>().unwrap_or(f64::INFINITY);
                let mut key = s.labels.clone();
                key.remove("le");
                series
                    .entry(format!("{key:?}"))
                    .or_default()
                    .push((le, s.value));
            }
            for (key, buckets) in series {
                assert!(
                    buckets.windows(2).all(|w| w[0].0 < w[1].0),
                    "{name} le order"
                );
                assert!(
                    buckets.windows(2).all(|w| w[0].1 <= w[1].1),
                    "{name} cumulative"
                );
                let (last_le, last) = buckets[buckets.len() - 1];
                assert!(last_le.is_infinite(), "{name} ends with +Inf");
                let count = samples
                    .iter()
                    .find(|s| {
                        s.name == format!("{name}_count") && {
                            let mut l = s.labels.clone();
                            l.remove("le");
                            format!("{l:?}") == key
                        }
                    })
                    .map(|s| s.value);
                assert_eq!(count, Some(last), "{name}{key}: +Inf bucket == _count");
            }
        }
        (types, samples)
    }

    fn sample_snapshot() -> Snapshot {
        let h = Histogram::default();
        h.observe(Duration::from_micros(700));
        h.observe(Duration::from_millis(40));
        let mut api = ApiSnapshot::default();
        api.topics.insert(
            "orders".into(),
            TopicIo {
                bytes_in: 10,
                records_in: 2,
                bytes_out: 5,
                records_out: 1,
            },
        );
        api.topics.insert("we\"ird\\".into(), TopicIo::default());
        api.requests.insert(0, 3);
        api.requests.insert(1, 4);
        api.errors.insert((0, 3), 1);
        api.errors.insert((1, 1), 2);
        api.produce_latency_acks_all = h.snapshot();
        api.fetch_latency = h.snapshot();
        Snapshot {
            cores: 2,
            api,
            partitions: vec![PartitionSnapshot {
                tp: TopicPartition::new("orders", 0),
                log: LogStats {
                    segments: 2,
                    size_bytes: 1234,
                    free_bytes: 4096,
                    log_start_offset: 0,
                    log_end_offset: 9,
                    offline: None,
                    transactions: Some(skiff_engine::TxnStats {
                        open: 2,
                        lso_lag: 7,
                    }),
                },
            }],
            offline: vec![(TopicPartition::new("orders", 1), "fdatasync failed".into())],
            cluster: ClusterSnapshot {
                broker: Some(BrokerSnapshot {
                    fenced: false,
                    metadata_offset: 41,
                    cluster_brokers: 3,
                    cluster_brokers_fenced: 1,
                    cluster_partitions_offline: 2,
                    partitions_led: 5,
                    partitions_under_replicated: 1,
                    partitions_under_min_isr: 1,
                }),
                controller: Some(controller_status(true)),
            },
            replication: crate::replica::ReplicationSnapshot {
                isr_shrinks: 2,
                isr_expands: 1,
                leaderships: 4,
                fetch_requests: 100,
                fetch_bytes: 4096,
                fetch_errors: 3,
                throttled_leader_bytes: 512,
                throttled_follower_bytes: 256,
                lag: vec![crate::replica::FollowerLagSample {
                    tp: TopicPartition::new("orders", 0),
                    follower: 2,
                    records_behind: 17,
                    caught_up_ms_ago: 1500,
                    in_isr: true,
                }],
            },
            ..Snapshot::default()
        }
    }

    /// A controller at offset 42 of term 3; node 1 reported 40, node 2 42,
    /// node 3 (fenced) nothing.
    fn controller_status(active: bool) -> ControllerStatus {
        let node = |id: i32, fenced: bool, reported: Option<u64>| NodeStatus {
            id,
            fenced,
            in_controlled_shutdown: false,
            broker_epoch: 7,
            endpoints: vec![format!("PLAINTEXT://h{id}:9092")],
            rack: None,
            metadata_offset: reported,
        };
        ControllerStatus {
            node_id: 1,
            active,
            leader_id: Some(1),
            term: 3,
            commit_index: 43,
            applied_offset: 42,
            nodes: vec![
                node(1, false, Some(40)),
                node(2, false, Some(42)),
                node(3, true, None),
            ],
            voters: vec![(1, Some(43)), (2, Some(42)), (3, None)],
            topics: 2,
            partitions: 6,
            offline_partitions: 2,
            unclean_elections: 1,
        }
    }

    #[test]
    fn every_metric_follows_the_naming_rules_and_the_format_parses() {
        let text = render(&sample_snapshot(), 7);
        let (types, samples) = check_exposition(&text);
        // The families operators alert on are there with the right types.
        for (name, kind) in [
            ("skiff_topic_bytes_in_total", "counter"),
            ("skiff_topic_records_out_total", "counter"),
            ("skiff_requests_total", "counter"),
            ("skiff_request_errors_total", "counter"),
            ("skiff_produce_latency_seconds", "histogram"),
            ("skiff_fetch_latency_seconds", "histogram"),
            ("skiff_fetch_sessions", "gauge"),
            ("skiff_fetch_sessions_evicted_total", "counter"),
            ("skiff_log_fsync_duration_seconds", "histogram"),
            ("skiff_log_roll_duration_seconds", "histogram"),
            ("skiff_batch_cache_hits_total", "counter"),
            ("skiff_log_segments", "gauge"),
            ("skiff_log_size_bytes", "gauge"),
            ("skiff_log_free_segment_bytes", "gauge"),
            ("skiff_log_open_transactions", "gauge"),
            ("skiff_log_last_stable_offset_lag", "gauge"),
            ("skiff_log_cleaner_read_bytes_total", "counter"),
            ("skiff_log_retention_deleted_segments_total", "counter"),
            ("skiff_partitions_offline", "gauge"),
            ("skiff_broker_fenced", "gauge"),
            ("skiff_broker_metadata_offset", "gauge"),
            ("skiff_cluster_brokers", "gauge"),
            ("skiff_cluster_brokers_fenced", "gauge"),
            ("skiff_cluster_partitions_offline", "gauge"),
            ("skiff_partitions_led", "gauge"),
            ("skiff_partitions_under_replicated", "gauge"),
            ("skiff_partitions_under_min_isr", "gauge"),
            ("skiff_controller_active", "gauge"),
            ("skiff_controller_raft_term", "gauge"),
            ("skiff_controller_commit_index", "gauge"),
            ("skiff_controller_applied_offset", "gauge"),
            ("skiff_controller_fenced_nodes", "gauge"),
            ("skiff_controller_unclean_leader_elections_total", "counter"),
            ("skiff_isr_shrinks_total", "counter"),
            ("skiff_isr_expands_total", "counter"),
            ("skiff_leader_elections_total", "counter"),
            ("skiff_replica_fetch_requests_total", "counter"),
            ("skiff_replica_fetch_bytes_total", "counter"),
            ("skiff_replica_fetch_errors_total", "counter"),
            ("skiff_replication_throttled_leader_bytes_total", "counter"),
            (
                "skiff_replication_throttled_follower_bytes_total",
                "counter",
            ),
            ("skiff_replica_lag_records", "gauge"),
            ("skiff_replica_lag_seconds", "gauge"),
            ("skiff_controller_node_metadata_lag", "gauge"),
        ] {
            assert_eq!(types.get(name).map(String::as_str), Some(kind), "{name}");
        }
        let find = |name: &str, labels: &[(&str, &str)]| {
            samples
                .iter()
                .find(|s| {
                    s.name == name
                        && labels
                            .iter()
                            .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
                })
                .map(|s| s.value)
        };
        assert_eq!(
            find("skiff_topic_bytes_in_total", &[("topic", "orders")]),
            Some(10.0)
        );
        // Label values with quotes and backslashes survive escaping.
        assert_eq!(
            find("skiff_topic_bytes_in_total", &[("topic", "we\"ird\\")]),
            Some(0.0)
        );
        assert_eq!(
            find(
                "skiff_request_errors_total",
                &[("api", "Produce"), ("error", "UNKNOWN_TOPIC_OR_PARTITION")]
            ),
            Some(1.0)
        );
        assert_eq!(find("skiff_requests_total", &[("api", "Fetch")]), Some(4.0));
        assert_eq!(
            find("skiff_produce_latency_seconds_count", &[("acks", "all")]),
            Some(2.0)
        );
        assert_eq!(
            find(
                "skiff_produce_latency_seconds_bucket",
                &[("acks", "all"), ("le", "0.001")]
            ),
            Some(1.0)
        );
        assert_eq!(
            find("skiff_produce_latency_seconds_count", &[("acks", "1")]),
            Some(0.0)
        );
        assert_eq!(find("skiff_partitions_offline", &[]), Some(1.0));
        let orders0 = [("topic", "orders"), ("partition", "0")];
        assert_eq!(find("skiff_log_open_transactions", &orders0), Some(2.0));
        assert_eq!(
            find("skiff_log_last_stable_offset_lag", &orders0),
            Some(7.0)
        );
        for (name, value) in [
            ("skiff_broker_fenced", 0.0),
            ("skiff_broker_metadata_offset", 41.0),
            ("skiff_cluster_brokers", 3.0),
            ("skiff_cluster_brokers_fenced", 1.0),
            ("skiff_cluster_partitions_offline", 2.0),
            ("skiff_partitions_led", 5.0),
            ("skiff_partitions_under_replicated", 1.0),
            ("skiff_partitions_under_min_isr", 1.0),
            ("skiff_controller_active", 1.0),
            ("skiff_controller_raft_term", 3.0),
            ("skiff_controller_commit_index", 43.0),
            ("skiff_controller_applied_offset", 42.0),
            ("skiff_controller_fenced_nodes", 1.0),
            ("skiff_isr_shrinks_total", 2.0),
            ("skiff_isr_expands_total", 1.0),
            ("skiff_leader_elections_total", 4.0),
            ("skiff_replica_fetch_requests_total", 100.0),
            ("skiff_replica_fetch_bytes_total", 4096.0),
            ("skiff_replica_fetch_errors_total", 3.0),
            ("skiff_replication_throttled_leader_bytes_total", 512.0),
            ("skiff_replication_throttled_follower_bytes_total", 256.0),
        ] {
            assert_eq!(find(name, &[]), Some(value), "{name}");
        }
        let follower = [("topic", "orders"), ("partition", "0"), ("follower", "2")];
        assert_eq!(find("skiff_replica_lag_records", &follower), Some(17.0));
        assert_eq!(find("skiff_replica_lag_seconds", &follower), Some(1.5));
        // Lag only for the nodes that reported.
        assert_eq!(
            find("skiff_controller_node_metadata_lag", &[("node", "1")]),
            Some(2.0)
        );
        assert_eq!(
            find("skiff_controller_node_metadata_lag", &[("node", "2")]),
            Some(0.0)
        );
        assert_eq!(
            find("skiff_controller_node_metadata_lag", &[("node", "3")]),
            None
        );
        assert_eq!(
            find(
                "skiff_log_size_bytes",
                &[("topic", "orders"), ("partition", "0")]
            ),
            Some(1234.0)
        );
        assert_eq!(
            find(
                "skiff_log_free_segment_bytes",
                &[("topic", "orders"), ("partition", "0")]
            ),
            Some(4096.0)
        );
    }

    #[test]
    fn an_empty_node_renders_valid_families() {
        let (types, _) = check_exposition(&render(&Snapshot::default(), 1));
        assert!(types.len() > 20);
    }

    #[test]
    fn cluster_metrics_appear_only_where_they_have_a_source() {
        // A broker without a controller: broker families, no controller ones.
        let mut s = sample_snapshot();
        s.cluster.controller = None;
        let (types, _) = check_exposition(&render(&s, 2));
        assert!(types.contains_key("skiff_broker_fenced"));
        assert!(!types.keys().any(|k| k.starts_with("skiff_controller_")));
        // A standby controller: its state, but no lag (its reports are stale).
        let mut s = sample_snapshot();
        s.cluster.controller = Some(controller_status(false));
        let text = render(&s, 2);
        let (types, samples) = check_exposition(&text);
        assert!(types.contains_key("skiff_controller_node_metadata_lag"));
        assert!(samples
            .iter()
            .all(|s| s.name != "skiff_controller_node_metadata_lag"));
        assert!(text.contains("\nskiff_controller_active 0\n"));
        // Before the broker link exists: no broker families.
        let (types, _) = check_exposition(&render(&Snapshot::default(), 1));
        assert!(!types.contains_key("skiff_broker_fenced"));
        assert!(!types.contains_key("skiff_controller_active"));
    }

    #[test]
    fn the_checker_rejects_bad_names_and_lines() {
        for bad in [
            "# HELP skiff_x x\n# TYPE skiff_x counter\nskiff_x 1\n",
            "# HELP skiff_Upper_total x\n# TYPE skiff_Upper_total counter\nskiff_Upper_total 1\n",
            "# HELP skiff_y_total x\n# TYPE skiff_y_total counter\nskiff_y_total{a=\"1} 1\n",
            "# HELP skiff_z x\n# TYPE skiff_z gauge\nskiff_z{1a=\"x\"} 1\n",
        ] {
            let result = std::panic::catch_unwind(|| check_exposition(bad));
            assert!(result.is_err(), "accepted {bad:?}");
        }
    }

    #[test]
    fn error_names_are_kafkas() {
        assert_eq!(error_name(3), "UNKNOWN_TOPIC_OR_PARTITION");
        assert_eq!(error_name(2), "CORRUPT_MESSAGE");
        assert_eq!(api_name(0), "Produce");
    }
}
