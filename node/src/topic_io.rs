//! `skiff topic produce | consume`: records from stdin to a topic and from a
//! topic to stdout over the Kafka protocol (blocking, one connection per
//! partition leader), so they work against any Kafka-compatible cluster, as
//! `rpk topic produce | consume` and kcat do.
//!
//! Produce: one record per input line, `KEY<sep>VALUE` with `--key-separator`;
//! the same headers on every record. Keyed records go to Kafka's default
//! partition (murmur2 of the key, as the Java client and kafka-python choose
//! it), unkeyed ones round-robin over the partitions by batch; `--partition`
//! pins them. Batches of up to `BATCH_RECORDS` records per partition go to the
//! leader with the chosen acks; any refusal stops with the broker's error.
//!
//! Consume: from earliest, latest or an offset, every partition (or those
//! chosen) until the high watermark each had at the start, `--count` records,
//! or, with `--follow`, until interrupted. Records print through a kcat-like
//! format string or as JSON lines.

use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::time::Duration;

use anyhow::{bail, Context};
use bytes::Bytes;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    BrokerId, FetchRequest, FetchResponse, ListOffsetsRequest, ListOffsetsResponse, ProduceRequest,
    ProduceResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use skiff_engine::batch::{decode_records, BatchBuilder, BatchScanner, Compression};

use crate::admin_client::AdminClient;

/// Records per produced batch (per partition).
const BATCH_RECORDS: usize = 1000;
/// Largest fetch answer asked for, per partition and in all.
const FETCH_PARTITION_BYTES: i32 = 4 << 20;
const FETCH_BYTES: i32 = 16 << 20;
/// Decompressed bytes one batch may expand to.
const BATCH_DECODE_LIMIT: usize = 64 << 20;

/// Kafka's murmur2 (`Utils.murmur2`), the default partitioner's hash.
pub fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let len = data.len();
    let mut h: u32 = SEED ^ (len as u32);
    let mut chunks = data.chunks_exact(4);
    for chunk in &mut chunks {
        let mut k = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let tail = chunks.remainder();
    if tail.len() >= 3 {
        h ^= u32::from(tail[2]) << 16;
    }
    if tail.len() >= 2 {
        h ^= u32::from(tail[1]) << 8;
    }
    if !tail.is_empty() {
        h ^= u32::from(tail[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// The partition Kafka's default partitioner picks for `key`.
pub fn partition_for_key(key: &[u8], partitions: i32) -> i32 {
    (murmur2(key) & 0x7fff_ffff) % partitions.max(1)
}

/// A topic's partitions and each one's leader address.
struct Layout {
    leaders: BTreeMap<i32, String>,
}

fn layout(bootstrap: &str, topic: &str) -> anyhow::Result<Layout> {
    let metadata = AdminClient::connect(bootstrap)?.metadata(Some(vec![topic.to_string()]))?;
    let addresses: BTreeMap<i32, String> = metadata
        .brokers
        .iter()
        .map(|b| (b.node_id.0, format!("{}:{}", b.host.as_str(), b.port)))
        .collect();
    let t = metadata
        .topics
        .first()
        .context("the metadata answer lists no topic")?;
    if let Some(e) = ResponseError::try_from_code(t.error_code) {
        bail!("topic {topic}: {e}");
    }
    let mut leaders = BTreeMap::new();
    for p in &t.partitions {
        let address = addresses
            .get(&p.leader_id.0)
            .with_context(|| format!("partition {} of {topic} has no leader", p.partition_index))?;
        leaders.insert(p.partition_index, address.clone());
    }
    if leaders.is_empty() {
        bail!("topic {topic} has no partitions");
    }
    Ok(Layout { leaders })
}

/// One input line as a record: its key (if split off) and value.
type KeyValue = (Option<Vec<u8>>, Vec<u8>);

/// How `produce` splits and places input lines.
pub struct ProduceOptions {
    pub partition: Option<i32>,
    pub key_separator: Option<String>,
    pub headers: Vec<(String, String)>,
    pub acks: i16,
    pub compression: Compression,
}

/// Produces every line of `input` to `topic`; returns the records written.
pub fn produce(
    bootstrap: &str,
    topic: &str,
    options: &ProduceOptions,
    input: impl BufRead,
) -> anyhow::Result<u64> {
    let layout = layout(bootstrap, topic)?;
    let count = layout.leaders.len() as i32;
    if let Some(p) = options.partition {
        if !layout.leaders.contains_key(&p) {
            bail!("topic {topic} has no partition {p} (it has {count})");
        }
    }
    let mut clients: BTreeMap<String, AdminClient> = BTreeMap::new();
    let mut pending: BTreeMap<i32, Vec<KeyValue>> = BTreeMap::new();
    let mut written = 0u64;
    let mut batches = 0i32;
    let mut lines = input.lines();
    loop {
        let line = lines.next().transpose().context("reading stdin")?;
        let end = line.is_none();
        if let Some(line) = line {
            let (key, value) = match &options.key_separator {
                Some(sep) => match line.split_once(sep.as_str()) {
                    Some((k, v)) => (Some(k.as_bytes().to_vec()), v.as_bytes().to_vec()),
                    None => (None, line.as_bytes().to_vec()),
                },
                None => (None, line.into_bytes()),
            };
            let partition = match (options.partition, &key) {
                (Some(p), _) => p,
                (None, Some(k)) => partition_for_key(k, count),
                (None, None) => batches.rem_euclid(count),
            };
            pending.entry(partition).or_default().push((key, value));
        }
        let full: Vec<i32> = pending
            .iter()
            .filter(|(_, records)| end || records.len() >= BATCH_RECORDS)
            .map(|(p, _)| *p)
            .collect();
        for p in full {
            let records = pending.remove(&p).unwrap_or_default();
            if records.is_empty() {
                continue;
            }
            let address = &layout.leaders[&p];
            let client = match clients.entry(address.clone()) {
                std::collections::btree_map::Entry::Occupied(o) => o.into_mut(),
                std::collections::btree_map::Entry::Vacant(v) => {
                    v.insert(AdminClient::connect(address)?)
                }
            };
            written += send_batch(client, topic, p, &records, options)?;
            batches = batches.wrapping_add(1);
        }
        if end {
            return Ok(written);
        }
    }
}

fn send_batch(
    client: &mut AdminClient,
    topic: &str,
    partition: i32,
    records: &[KeyValue],
    options: &ProduceOptions,
) -> anyhow::Result<u64> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let headers: Vec<(&[u8], Option<&[u8]>)> = options
        .headers
        .iter()
        .map(|(k, v)| (k.as_bytes(), Some(v.as_bytes())))
        .collect();
    let mut builder = BatchBuilder::new().compression(options.compression);
    for (key, value) in records {
        builder.push(now, key.as_deref(), Some(value), &headers);
    }
    let batch = builder.build().context("building the record batch")?;
    let request = ProduceRequest::default()
        .with_acks(options.acks)
        .with_timeout_ms(30_000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(TopicName(StrBytes::from_string(topic.to_string())))
            .with_partition_data(vec![PartitionProduceData::default()
                .with_index(partition)
                .with_records(Some(batch))])]);
    if options.acks == 0 {
        // No answer comes for acks=0.
        client.send(&request, 9)?;
        return Ok(records.len() as u64);
    }
    let response: ProduceResponse = client.call(&request, 9)?;
    for t in &response.responses {
        for p in &t.partition_responses {
            if let Some(e) = ResponseError::try_from_code(p.error_code) {
                bail!(
                    "producing to {topic}-{}: {e}{}",
                    p.index,
                    p.error_message
                        .as_deref()
                        .map(|m| format!(": {m}"))
                        .unwrap_or_default()
                );
            }
        }
    }
    Ok(records.len() as u64)
}

/// Where `consume` starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum From {
    Earliest,
    Latest,
    Offset(i64),
}

/// How `consume` prints records.
#[derive(Debug, Clone)]
pub enum Format {
    /// kcat's tokens: %t topic, %p partition, %o offset, %k key, %v value,
    /// %h headers (k=v,...), %T timestamp, %% a percent; \n \t escapes.
    Template(String),
    /// One JSON object per record.
    Json,
}

pub struct ConsumeOptions {
    pub partitions: Vec<i32>,
    pub from: From,
    pub count: Option<u64>,
    pub follow: bool,
    pub format: Format,
}

/// Consumes `topic` to `out`; returns the records printed.
pub fn consume(
    bootstrap: &str,
    topic: &str,
    options: &ConsumeOptions,
    out: &mut impl Write,
) -> anyhow::Result<u64> {
    let layout = layout(bootstrap, topic)?;
    let chosen: Vec<i32> = if options.partitions.is_empty() {
        layout.leaders.keys().copied().collect()
    } else {
        for p in &options.partitions {
            if !layout.leaders.contains_key(p) {
                bail!(
                    "topic {topic} has no partition {p} (it has {})",
                    layout.leaders.len()
                );
            }
        }
        options.partitions.clone()
    };
    let mut clients: BTreeMap<String, AdminClient> = BTreeMap::new();
    // Start and stop offsets per partition.
    let mut position: BTreeMap<i32, i64> = BTreeMap::new();
    let mut stop_at: BTreeMap<i32, i64> = BTreeMap::new();
    for &p in &chosen {
        let address = &layout.leaders[&p];
        let mut c = match clients.remove(address) {
            Some(c) => c,
            None => AdminClient::connect(address)?,
        };
        let (earliest, latest) = (
            list_offset(&mut c, topic, p, -2)?,
            list_offset(&mut c, topic, p, -1)?,
        );
        position.insert(
            p,
            match options.from {
                From::Earliest => earliest,
                From::Latest => latest,
                From::Offset(o) => o.clamp(earliest, latest),
            },
        );
        stop_at.insert(p, latest);
        clients.insert(address.clone(), c);
    }
    let mut printed = 0u64;
    loop {
        let done = |position: &BTreeMap<i32, i64>| {
            !options.follow && position.iter().all(|(p, o)| *o >= stop_at[p])
        };
        if done(&position) || options.count.is_some_and(|c| printed >= c) {
            return Ok(printed);
        }
        let mut by_leader: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
        for &p in &chosen {
            if options.follow || position[&p] < stop_at[&p] {
                by_leader.entry(&layout.leaders[&p]).or_default().push(p);
            }
        }
        for (address, partitions) in by_leader {
            let request = FetchRequest::default()
                .with_replica_id(BrokerId(-1))
                .with_max_wait_ms(if options.follow { 500 } else { 100 })
                .with_min_bytes(1)
                .with_max_bytes(FETCH_BYTES)
                .with_session_epoch(-1)
                .with_topics(vec![FetchTopic::default()
                    .with_topic(TopicName(StrBytes::from_string(topic.to_string())))
                    .with_partitions(
                        partitions
                            .iter()
                            .map(|p| {
                                FetchPartition::default()
                                    .with_partition(*p)
                                    .with_fetch_offset(position[p])
                                    .with_partition_max_bytes(FETCH_PARTITION_BYTES)
                            })
                            .collect(),
                    )]);
            let mut c = match clients.remove(address) {
                Some(c) => c,
                None => AdminClient::connect(address)?,
            };
            c.set_read_timeout(Duration::from_secs(30))?;
            let response: FetchResponse = c.call(&request, 11)?;
            clients.insert(address.to_string(), c);
            if let Some(e) = ResponseError::try_from_code(response.error_code) {
                bail!("fetching from {address}: {e}");
            }
            for t in &response.responses {
                for part in &t.partitions {
                    if let Some(e) = ResponseError::try_from_code(part.error_code) {
                        bail!("fetching {topic}-{}: {e}", part.partition_index);
                    }
                    let Some(bytes) = &part.records else { continue };
                    let p = part.partition_index;
                    for (at, header) in BatchScanner::new(bytes) {
                        let batch = bytes.slice(at..at + header.total_len());
                        let next = header.base_offset + i64::from(header.last_offset_delta) + 1;
                        for r in decode_records(&batch, BATCH_DECODE_LIMIT)
                            .with_context(|| format!("decoding a batch of {topic}-{p}"))?
                        {
                            let stop = stop_at[&p];
                            if r.offset < position[&p] || (!options.follow && r.offset >= stop) {
                                continue;
                            }
                            if options.count.is_some_and(|c| printed >= c) {
                                return Ok(printed);
                            }
                            print_record(out, topic, p, &r, &options.format)?;
                            printed += 1;
                        }
                        if let Some(pos) = position.get_mut(&p) {
                            *pos = (*pos).max(next);
                        }
                    }
                }
            }
        }
        out.flush().context("writing stdout")?;
    }
}

fn list_offset(
    client: &mut AdminClient,
    topic: &str,
    partition: i32,
    timestamp: i64,
) -> anyhow::Result<i64> {
    let request = ListOffsetsRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_topics(vec![ListOffsetsTopic::default()
            .with_name(TopicName(StrBytes::from_string(topic.to_string())))
            .with_partitions(vec![ListOffsetsPartition::default()
                .with_partition_index(partition)
                .with_timestamp(timestamp)])]);
    let response: ListOffsetsResponse = client.call(&request, 5)?;
    let p = response
        .topics
        .first()
        .and_then(|t| t.partitions.first())
        .context("ListOffsets answered no partition")?;
    if let Some(e) = ResponseError::try_from_code(p.error_code) {
        bail!("offsets of {topic}-{partition}: {e}");
    }
    Ok(p.offset)
}

fn text(b: &Option<Bytes>) -> String {
    b.as_ref()
        .map(|b| String::from_utf8_lossy(b).into_owned())
        .unwrap_or_default()
}

fn print_record(
    out: &mut impl Write,
    topic: &str,
    partition: i32,
    r: &skiff_engine::batch::Record,
    format: &Format,
) -> anyhow::Result<()> {
    let headers = || {
        r.headers
            .iter()
            .map(|h| format!("{}={}", String::from_utf8_lossy(&h.key), text(&h.value)))
            .collect::<Vec<_>>()
            .join(",")
    };
    let line = match format {
        Format::Json => {
            let headers: serde_json::Map<String, serde_json::Value> = r
                .headers
                .iter()
                .map(|h| {
                    (
                        String::from_utf8_lossy(&h.key).into_owned(),
                        h.value.as_ref().map_or(serde_json::Value::Null, |v| {
                            String::from_utf8_lossy(v).into_owned().into()
                        }),
                    )
                })
                .collect();
            let key = r.key.as_ref().map_or(serde_json::Value::Null, |k| {
                String::from_utf8_lossy(k).into_owned().into()
            });
            let value = r.value.as_ref().map_or(serde_json::Value::Null, |v| {
                String::from_utf8_lossy(v).into_owned().into()
            });
            let mut line = serde_json::json!({
                "topic": topic,
                "partition": partition,
                "offset": r.offset,
                "timestamp": r.timestamp,
                "key": key,
                "value": value,
                "headers": headers,
            })
            .to_string();
            line.push('\n');
            line
        }
        Format::Template(template) => {
            let mut line = String::new();
            let mut chars = template.chars();
            while let Some(c) = chars.next() {
                match c {
                    '%' => match chars.next() {
                        Some('t') => line.push_str(topic),
                        Some('p') => line.push_str(&partition.to_string()),
                        Some('o') => line.push_str(&r.offset.to_string()),
                        Some('k') => line.push_str(&text(&r.key)),
                        Some('v') => line.push_str(&text(&r.value)),
                        Some('h') => line.push_str(&headers()),
                        Some('T') => line.push_str(&r.timestamp.to_string()),
                        Some(other) => line.push(other),
                        None => line.push('%'),
                    },
                    '\\' => match chars.next() {
                        Some('n') => line.push('\n'),
                        Some('t') => line.push('\t'),
                        Some(other) => line.push(other),
                        None => line.push('\\'),
                    },
                    c => line.push(c),
                }
            }
            line
        }
    };
    out.write_all(line.as_bytes()).context("writing stdout")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn murmur2_matches_kafka() {
        // Kafka's UtilsTest.testMurmur2 vectors.
        let cases: [(&[u8], i32); 6] = [
            (b"21", -973_932_308),
            (b"foobar", -790_332_482),
            (b"a-little-bit-long-string", -985_981_536),
            (b"a-little-bit-longer-string", -1_486_304_829),
            (
                b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
                -58_897_971,
            ),
            (b"abc", 479_470_107),
        ];
        for (key, want) in cases {
            assert_eq!(murmur2(key), want, "{:?}", String::from_utf8_lossy(key));
        }
        assert!((0..1000)
            .all(|i| (0..7).contains(&partition_for_key(format!("key-{i}").as_bytes(), 7))));
    }
}
