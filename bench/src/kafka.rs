//! A minimal blocking Kafka client for the load generator: framing, version
//! negotiation, and the cluster view (Metadata, CreateTopics, ListOffsets,
//! DeleteTopics). It speaks only the Kafka protocol, so the load generator works
//! against any Kafka-compatible server.
//!
//! The hot paths (produce and fetch) do not go through [`Connection::call`]: they
//! write prebuilt frames and read responses on their own threads, using
//! [`read_frame`] and [`decode_response`] from here.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

pub use crate::tls::Stream;
use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, ApiVersionsResponse, BrokerId, CreateTopicsRequest,
    CreateTopicsResponse, DeleteTopicsRequest, DeleteTopicsResponse, FetchRequest, FetchResponse,
    ListOffsetsRequest, ListOffsetsResponse, MetadataRequest, MetadataResponse, RequestHeader,
    ResponseHeader, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, Request, StrBytes};
use kafka_protocol::ResponseError;

/// Largest response frame accepted: a fetch answers at most `fetch.max.bytes`
/// (bounded by the load generator) plus small framing.
pub const MAX_RESPONSE_BYTES: usize = 256 << 20;
/// How long a blocking read or write may wait before the run is declared stuck.
pub const SOCKET_TIMEOUT: Duration = Duration::from_secs(60);
/// The client id every request carries (`--client-id`; quotas key on it).
static CLIENT_ID: std::sync::OnceLock<StrBytes> = std::sync::OnceLock::new();

/// Sets the client id for the whole process (the first call wins).
pub fn set_client_id(id: &str) {
    let _ = CLIENT_ID.set(StrBytes::from_string(id.to_string()));
}

fn client_id() -> StrBytes {
    CLIENT_ID
        .get_or_init(|| StrBytes::from_static_str("skiff-bench"))
        .clone()
}

/// Kafka error code for an unknown topic or partition.
const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;

/// The versions the load generator can speak; the highest one both sides
/// support is used. Produce v13 and Fetch v13 address topics by id, which the
/// load generator does not do.
const PRODUCE_VERSIONS: (i16, i16) = (3, 11);
const FETCH_VERSIONS: (i16, i16) = (4, 12);
const METADATA_VERSIONS: (i16, i16) = (4, 12);
const LIST_OFFSETS_VERSIONS: (i16, i16) = (1, 7);
const CREATE_TOPICS_VERSIONS: (i16, i16) = (2, 7);
const DELETE_TOPICS_VERSIONS: (i16, i16) = (1, 5);

/// The request versions chosen for one server.
#[derive(Debug, Clone, Copy)]
pub struct Versions {
    pub produce: i16,
    pub fetch: i16,
    pub metadata: i16,
    pub list_offsets: i16,
    pub create_topics: i16,
    pub delete_topics: i16,
}

/// Encodes one request into a whole frame (size prefix included). The correlation
/// id sits at bytes 8..12 of the frame for every request (size, key, version, id).
pub fn encode_request<Req>(
    request: &Req,
    version: i16,
    correlation_id: i32,
) -> anyhow::Result<BytesMut>
where
    Req: Request + Encodable + HeaderVersion,
{
    let header = RequestHeader::default()
        .with_request_api_key(Req::KEY)
        .with_request_api_version(version)
        .with_correlation_id(correlation_id)
        .with_client_id(Some(client_id()));
    let mut frame = BytesMut::new();
    frame.put_i32(0);
    header
        .encode(&mut frame, Req::header_version(version))
        .context("encoding request header")?;
    request
        .encode(&mut frame, version)
        .with_context(|| format!("encoding api key {} v{version}", Req::KEY))?;
    let size = i32::try_from(frame.len() - 4).context("request frame over 2 GiB")?;
    frame[..4].copy_from_slice(&size.to_be_bytes());
    Ok(frame)
}

/// Byte position of the correlation id in a frame from [`encode_request`].
pub const CORRELATION_ID_AT: usize = 8;

/// Reads one response frame (without its size prefix).
pub fn read_frame(stream: &mut impl Read) -> anyhow::Result<Bytes> {
    let mut size = [0u8; 4];
    stream
        .read_exact(&mut size)
        .context("reading a response size")?;
    let size = i32::from_be_bytes(size);
    if size < 0 || size as usize > MAX_RESPONSE_BYTES {
        bail!("response size {size} out of range (max {MAX_RESPONSE_BYTES})");
    }
    let mut buf = BytesMut::zeroed(size as usize);
    stream.read_exact(&mut buf).context("reading a response")?;
    Ok(buf.freeze())
}

/// Decodes a response frame of request type `Req` at `version`; returns its
/// correlation id beside it.
pub fn decode_response<Req, Resp>(mut frame: Bytes, version: i16) -> anyhow::Result<(i32, Resp)>
where
    Req: Request,
    Resp: Decodable,
{
    let api_key =
        ApiKey::try_from(Req::KEY).map_err(|_| anyhow::anyhow!("unknown api key {}", Req::KEY))?;
    let header = ResponseHeader::decode(&mut frame, api_key.response_header_version(version))
        .context("decoding a response header")?;
    let response = Resp::decode(&mut frame, version)
        .with_context(|| format!("decoding a {api_key:?} v{version} response"))?;
    Ok((header.correlation_id, response))
}

/// A Fetch response frame (header and body), skipping any top-level tagged
/// field its version does not define. KIP-482 says a receiver skips tags it
/// does not know; kafka-protocol 0.18 instead refuses tag 0 (NodeEndpoints,
/// defined from v16) below v16, which Tansu 0.6 sends with Fetch v12. The body
/// up to the tags is decoded by kafka-protocol itself.
pub fn decode_fetch_response(
    mut frame: Bytes,
    version: i16,
) -> anyhow::Result<(i32, FetchResponse)> {
    use bytes::Buf;
    use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, NodeEndpoint};
    if version < 12 {
        return decode_response::<FetchRequest, FetchResponse>(frame, version);
    }
    let header = ResponseHeader::decode(&mut frame, ApiKey::Fetch.response_header_version(version))
        .context("decoding a fetch response header")?;
    let context = || format!("decoding a Fetch v{version} response");
    anyhow::ensure!(frame.remaining() >= 10, "{}: truncated", context());
    let throttle_time_ms = frame.get_i32();
    let error_code = frame.get_i16();
    let session_id = frame.get_i32();
    // A compact array: its length plus one (0: null), then the elements, each
    // decoded by kafka-protocol.
    let mut responses = Vec::new();
    for _ in 0..uvarint(&mut frame)?.saturating_sub(1) {
        responses.push(FetchableTopicResponse::decode(&mut frame, version).with_context(context)?);
    }
    let mut response = FetchResponse::default()
        .with_throttle_time_ms(throttle_time_ms)
        .with_error_code(error_code)
        .with_session_id(session_id)
        .with_responses(responses);
    for _ in 0..uvarint(&mut frame)? {
        let tag = uvarint(&mut frame)?;
        let size = uvarint(&mut frame)? as usize;
        anyhow::ensure!(
            size <= frame.len(),
            "{}: tagged field {tag} of {size} bytes, {} left",
            context(),
            frame.len()
        );
        let mut value = frame.split_to(size);
        if tag == 0 && version >= 16 {
            for _ in 0..uvarint(&mut value)?.saturating_sub(1) {
                response
                    .node_endpoints
                    .push(NodeEndpoint::decode(&mut value, version).with_context(context)?);
            }
        } else {
            response.unknown_tagged_fields.insert(tag as i32, value);
        }
    }
    Ok((header.correlation_id, response))
}

/// An unsigned varint (the flexible versions' lengths and tags).
fn uvarint(buf: &mut Bytes) -> anyhow::Result<u32> {
    use bytes::Buf;
    let mut value = 0u32;
    for shift in (0..35).step_by(7) {
        anyhow::ensure!(buf.has_remaining(), "truncated varint");
        let byte = buf.get_u8();
        value |= u32::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    bail!("varint longer than 5 bytes")
}

/// A Kafka error code as a readable error, or `Ok` for 0.
pub fn check(code: i16, what: &str) -> anyhow::Result<()> {
    match ResponseError::try_from_code(code) {
        None => Ok(()),
        Some(e) => bail!("{what}: {e} (error code {code})"),
    }
}

/// The name of a Kafka error code, for reports.
pub fn error_name(code: i16) -> String {
    ResponseError::try_from_code(code)
        .map_or_else(|| format!("error code {code}"), |e| format!("{e:?}"))
}

/// Opens a connection to `addr` with the load generator's socket settings
/// (TLS when the run turned it on: `tls::enable`).
pub fn connect_stream(addr: &str) -> anyhow::Result<Stream> {
    let mut last_error = None;
    for a in addr
        .to_socket_addrs()
        .with_context(|| format!("resolving {addr}"))?
    {
        match TcpStream::connect_timeout(&a, Duration::from_secs(10)) {
            Ok(stream) => {
                stream.set_nodelay(true)?;
                stream.set_read_timeout(Some(SOCKET_TIMEOUT))?;
                stream.set_write_timeout(Some(SOCKET_TIMEOUT))?;
                return Stream::over(stream, addr);
            }
            Err(e) => last_error = Some(anyhow::anyhow!("{a}: {e}")),
        }
    }
    Err(last_error.unwrap_or_else(|| anyhow::anyhow!("{addr} resolves to no address")))
        .with_context(|| format!("connecting to {addr}"))
}

/// One blocking request/response connection for control requests.
pub struct Connection {
    stream: Stream,
    correlation_id: i32,
}

impl Connection {
    pub fn connect(addr: &str) -> anyhow::Result<Connection> {
        Ok(Connection {
            stream: connect_stream(addr)?,
            correlation_id: 0,
        })
    }

    /// The socket, for a connection kept open and idle.
    pub fn into_stream(self) -> Stream {
        self.stream
    }

    /// Connects to the first reachable server of a comma-separated list.
    pub fn connect_any(bootstrap: &str) -> anyhow::Result<Connection> {
        let mut last_error = None;
        for server in bootstrap
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
        {
            match Connection::connect(server) {
                Ok(c) => return Ok(c),
                Err(e) => last_error = Some(e),
            }
        }
        Err(last_error.unwrap_or_else(|| anyhow::anyhow!("empty bootstrap list")))
    }

    pub fn call<Req, Resp>(&mut self, request: &Req, version: i16) -> anyhow::Result<Resp>
    where
        Req: Request + Encodable + HeaderVersion,
        Resp: Decodable,
    {
        self.correlation_id = self.correlation_id.wrapping_add(1);
        let frame = encode_request(request, version, self.correlation_id)?;
        self.stream.write_all(&frame).context("sending a request")?;
        let (correlation_id, response) =
            decode_response::<Req, Resp>(read_frame(&mut self.stream)?, version)?;
        if correlation_id != self.correlation_id {
            bail!(
                "response correlation id {correlation_id}, expected {}",
                self.correlation_id
            );
        }
        Ok(response)
    }

    /// ApiVersions (v2: no tagged fields, understood by every server since Kafka
    /// 0.11): the versions the server serves, for [`pick_version`].
    pub fn api_versions(&mut self) -> anyhow::Result<ApiVersionsResponse> {
        let response: ApiVersionsResponse = self.call(&ApiVersionsRequest::default(), 2)?;
        check(response.error_code, "ApiVersions")?;
        Ok(response)
    }

    /// ApiVersions, then the highest common version of each request the load
    /// generator sends.
    pub fn negotiate(&mut self) -> anyhow::Result<Versions> {
        let response = self.api_versions()?;
        let pick = |key, ours| pick_version(&response, key, ours);
        Ok(Versions {
            produce: pick(ApiKey::Produce, PRODUCE_VERSIONS)?,
            fetch: pick(ApiKey::Fetch, FETCH_VERSIONS)?,
            metadata: pick(ApiKey::Metadata, METADATA_VERSIONS)?,
            list_offsets: pick(ApiKey::ListOffsets, LIST_OFFSETS_VERSIONS)?,
            create_topics: pick(ApiKey::CreateTopics, CREATE_TOPICS_VERSIONS)?,
            delete_topics: pick(ApiKey::DeleteTopics, DELETE_TOPICS_VERSIONS)?,
        })
    }
}

/// The highest version of `key` both the server (its ApiVersions answer) and
/// the load generator (`ours_min..=ours_max`) speak.
pub fn pick_version(
    response: &ApiVersionsResponse,
    key: ApiKey,
    (ours_min, ours_max): (i16, i16),
) -> anyhow::Result<i16> {
    let theirs = response
        .api_keys
        .iter()
        .find(|k| k.api_key == key as i16)
        .ok_or_else(|| anyhow::anyhow!("the server does not serve {key:?}"))?;
    let version = theirs.max_version.min(ours_max);
    if version < ours_min.max(theirs.min_version) {
        bail!(
            "no common {key:?} version: server {}-{}, skiff-bench {ours_min}-{ours_max}",
            theirs.min_version,
            theirs.max_version
        );
    }
    Ok(version)
}

/// Where each partition of the benchmark topic lives.
#[derive(Debug, Clone)]
pub struct Cluster {
    pub topic: String,
    pub versions: Versions,
    /// Broker id -> "host:port".
    pub brokers: BTreeMap<i32, String>,
    /// (partition, leader broker id), sorted by partition.
    pub partitions: Vec<(i32, i32)>,
}

fn topic_name(topic: &str) -> TopicName {
    TopicName(StrBytes::from_string(topic.to_string()))
}

impl Cluster {
    /// Finds the topic's partitions and leaders; creates the topic with
    /// `partitions` partitions when it does not exist (and `create` is set).
    /// Waits up to 30 s for every partition to have a leader.
    pub fn discover(
        bootstrap: &str,
        topic: &str,
        partitions: i32,
        create: bool,
    ) -> anyhow::Result<Cluster> {
        let mut conn = Connection::connect_any(bootstrap)?;
        let versions = conn.negotiate()?;
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut created = false;
        loop {
            let response = topic_metadata(&mut conn, versions, topic)?;
            let brokers: BTreeMap<i32, String> = response
                .brokers
                .iter()
                .map(|b| (b.node_id.0, format!("{}:{}", b.host.as_str(), b.port)))
                .collect();
            let t = response
                .topics
                .iter()
                .find(|t| t.name.as_ref().map(|n| n.0.as_str()) == Some(topic))
                .ok_or_else(|| anyhow::anyhow!("metadata did not answer for topic {topic}"))?;
            if t.error_code == UNKNOWN_TOPIC_OR_PARTITION && create && !created {
                create_topic(&mut conn, versions, topic, partitions)?;
                created = true;
                tracing::info!(topic, partitions, "created the topic");
                continue;
            }
            let ready = t.error_code == 0
                && !t.partitions.is_empty()
                && t.partitions
                    .iter()
                    .all(|p| p.error_code == 0 && brokers.contains_key(&p.leader_id.0));
            if ready {
                let mut parts: Vec<(i32, i32)> = t
                    .partitions
                    .iter()
                    .map(|p| (p.partition_index, p.leader_id.0))
                    .collect();
                parts.sort_unstable();
                if !created && parts.len() as i32 != partitions {
                    tracing::info!(
                        topic,
                        existing = parts.len(),
                        asked = partitions,
                        "the topic exists with another partition count; using all its partitions"
                    );
                }
                return Ok(Cluster {
                    topic: topic.to_string(),
                    versions,
                    brokers,
                    partitions: parts,
                });
            }
            if Instant::now() > deadline {
                check(t.error_code, &format!("metadata for topic {topic}"))?;
                bail!("topic {topic}: not every partition has a leader after 30 s");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// "host:port" of a broker.
    pub fn address(&self, broker: i32) -> anyhow::Result<&str> {
        self.brokers
            .get(&broker)
            .map(String::as_str)
            .ok_or_else(|| anyhow::anyhow!("broker {broker} is not in the metadata"))
    }

    /// Offsets of every partition at `timestamp` (-2 earliest, -1 latest),
    /// indexed like `self.partitions`.
    pub fn list_offsets(&self, timestamp: i64) -> anyhow::Result<Vec<i64>> {
        let mut out = vec![0i64; self.partitions.len()];
        let mut by_leader: BTreeMap<i32, Vec<usize>> = BTreeMap::new();
        for (i, (_, leader)) in self.partitions.iter().enumerate() {
            by_leader.entry(*leader).or_default().push(i);
        }
        for (leader, indices) in by_leader {
            let mut conn = Connection::connect(self.address(leader)?)?;
            let request = ListOffsetsRequest::default()
                .with_replica_id(BrokerId(-1))
                .with_topics(vec![ListOffsetsTopic::default()
                    .with_name(topic_name(&self.topic))
                    .with_partitions(
                        indices
                            .iter()
                            .map(|&i| {
                                ListOffsetsPartition::default()
                                    .with_partition_index(self.partitions[i].0)
                                    .with_timestamp(timestamp)
                            })
                            .collect(),
                    )]);
            let response: ListOffsetsResponse = conn.call(&request, self.versions.list_offsets)?;
            for t in &response.topics {
                for p in &t.partitions {
                    check(
                        p.error_code,
                        &format!("ListOffsets partition {}", p.partition_index),
                    )?;
                    let i = self
                        .partitions
                        .iter()
                        .position(|(partition, _)| *partition == p.partition_index)
                        .ok_or_else(|| {
                            anyhow::anyhow!(
                                "ListOffsets answered unknown partition {}",
                                p.partition_index
                            )
                        })?;
                    out[i] = p.offset;
                }
            }
        }
        Ok(out)
    }
}

fn create_topic(
    conn: &mut Connection,
    versions: Versions,
    topic: &str,
    partitions: i32,
) -> anyhow::Result<()> {
    create_topic_with(conn, versions, topic, partitions, -1, &[])
}

/// Metadata for one topic, without creating it.
fn topic_metadata(
    conn: &mut Connection,
    versions: Versions,
    topic: &str,
) -> anyhow::Result<MetadataResponse> {
    let request = MetadataRequest::default()
        .with_topics(Some(vec![
            MetadataRequestTopic::default().with_name(Some(topic_name(topic)))
        ]))
        .with_allow_auto_topic_creation(false);
    conn.call(&request, versions.metadata)
}

/// CreateTopics with a replication factor (-1: the server's default) and topic
/// configs; an existing topic is fine.
fn create_topic_with(
    conn: &mut Connection,
    versions: Versions,
    topic: &str,
    partitions: i32,
    replication_factor: i16,
    configs: &[(&str, &str)],
) -> anyhow::Result<()> {
    let request = CreateTopicsRequest::default()
        .with_timeout_ms(30_000)
        .with_topics(vec![CreatableTopic::default()
            .with_name(topic_name(topic))
            .with_num_partitions(partitions)
            .with_replication_factor(replication_factor)
            .with_configs(
                configs
                    .iter()
                    .map(|(k, v)| {
                        CreatableTopicConfig::default()
                            .with_name(StrBytes::from_string(k.to_string()))
                            .with_value(Some(StrBytes::from_string(v.to_string())))
                    })
                    .collect(),
            )]);
    let response: CreateTopicsResponse = conn.call(&request, versions.create_topics)?;
    for t in &response.topics {
        // TOPIC_ALREADY_EXISTS (36): another client won the race; fine.
        if t.error_code != 36 {
            check(t.error_code, &format!("creating topic {topic}"))?;
        }
    }
    Ok(())
}

/// Brokers the metadata lists (a cluster is whole when it lists every node).
pub fn broker_count(bootstrap: &str) -> anyhow::Result<usize> {
    let mut conn = Connection::connect_any(bootstrap)?;
    let versions = conn.negotiate()?;
    let request = MetadataRequest::default()
        .with_topics(Some(Vec::new()))
        .with_allow_auto_topic_creation(false);
    let response: MetadataResponse = conn.call(&request, versions.metadata)?;
    Ok(response.brokers.len())
}

/// Creates a replicated topic (`replication_factor` replicas per partition, with
/// `configs`) and waits, up to `timeout`, until every partition has a leader and
/// all its replicas in sync. Returns the number of partitions each broker leads.
pub fn create_replicated_topic(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    replication_factor: i16,
    configs: &[(&str, &str)],
    timeout: Duration,
) -> anyhow::Result<BTreeMap<i32, usize>> {
    let mut conn = Connection::connect_any(bootstrap)?;
    let versions = conn.negotiate()?;
    create_topic_with(
        &mut conn,
        versions,
        topic,
        partitions,
        replication_factor,
        configs,
    )?;
    let deadline = Instant::now() + timeout;
    // Every node must have applied the topic before the load starts: a leader
    // that has not would answer UNKNOWN_TOPIC_OR_PARTITION.
    let mut leaders = BTreeMap::new();
    for addr in bootstrap
        .split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty())
    {
        let mut conn = Connection::connect(addr)?;
        let versions = conn.negotiate()?;
        leaders = wait_in_sync(
            &mut conn,
            versions,
            topic,
            partitions,
            replication_factor,
            deadline,
        )
        .with_context(|| format!("waiting for {topic} on {addr} (timeout {timeout:?})"))?;
    }
    Ok(leaders)
}

/// Waits until `conn`'s node lists every partition of `topic` with a leader
/// and all `replication_factor` replicas in sync; the partitions each broker
/// leads.
fn wait_in_sync(
    conn: &mut Connection,
    versions: Versions,
    topic: &str,
    partitions: i32,
    replication_factor: i16,
    deadline: Instant,
) -> anyhow::Result<BTreeMap<i32, usize>> {
    loop {
        let response = topic_metadata(conn, versions, topic)?;
        let t = response
            .topics
            .iter()
            .find(|t| t.name.as_ref().map(|n| n.0.as_str()) == Some(topic));
        let mut last = format!("topic {topic} not in the metadata yet");
        if let Some(t) = t {
            let want = usize::try_from(replication_factor).unwrap_or(0);
            let lagging: Vec<String> = t
                .partitions
                .iter()
                .filter(|p| {
                    p.error_code != 0
                        || p.leader_id.0 < 0
                        || p.replica_nodes.len() != want
                        || p.isr_nodes.len() != want
                })
                .map(|p| {
                    format!(
                        "partition {} (leader {}, replicas {:?}, isr {:?}, {})",
                        p.partition_index,
                        p.leader_id.0,
                        p.replica_nodes.iter().map(|b| b.0).collect::<Vec<_>>(),
                        p.isr_nodes.iter().map(|b| b.0).collect::<Vec<_>>(),
                        error_name(p.error_code)
                    )
                })
                .collect();
            if t.error_code == 0 && t.partitions.len() as i32 == partitions && lagging.is_empty() {
                let mut leaders = BTreeMap::new();
                for p in &t.partitions {
                    *leaders.entry(p.leader_id.0).or_insert(0) += 1;
                }
                return Ok(leaders);
            }
            last = if t.error_code != 0 {
                format!("topic error {}", error_name(t.error_code))
            } else {
                format!(
                    "{} of {partitions} partitions listed; not ready: {}",
                    t.partitions.len(),
                    lagging.join(", ")
                )
            };
        }
        if Instant::now() > deadline {
            bail!(
                "topic {topic} ({partitions} partitions, replication factor {replication_factor}) \
                 not fully in sync: {last}"
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Deletes a topic (the suite frees its disk space between workloads).
pub fn delete_topic(bootstrap: &str, topic: &str) -> anyhow::Result<()> {
    let mut conn = Connection::connect_any(bootstrap)?;
    let versions = conn.negotiate()?;
    let request = DeleteTopicsRequest::default()
        .with_topic_names(vec![topic_name(topic)])
        .with_timeout_ms(30_000);
    let response: DeleteTopicsResponse = conn.call(&request, versions.delete_topics)?;
    for r in &response.responses {
        check(r.error_code, &format!("deleting topic {topic}"))?;
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};

    /// A Fetch v12 response frame as Tansu 0.6 sends it: a top-level tag 0,
    /// which Fetch defines only from v16.
    fn frame_with_tag_zero(tag_bytes: &[u8]) -> Bytes {
        let response = FetchResponse::default()
            .with_session_id(7)
            .with_responses(vec![FetchableTopicResponse::default()
                .with_topic(TopicName(StrBytes::from_static_str("t")))
                .with_partitions(vec![PartitionData::default()
                    .with_partition_index(0)
                    .with_high_watermark(5)
                    .with_records(Some(Bytes::from_static(b"batch")))])]);
        let mut frame = BytesMut::new();
        ResponseHeader::default()
            .with_correlation_id(42)
            .encode(&mut frame, ApiKey::Fetch.response_header_version(12))
            .unwrap();
        response.encode(&mut frame, 12).unwrap();
        // The body ends with its tag count, 0: replace it.
        assert_eq!(frame.last(), Some(&0));
        frame.truncate(frame.len() - 1);
        frame.extend_from_slice(tag_bytes);
        frame.freeze()
    }

    #[test]
    fn a_fetch_response_with_a_tag_its_version_does_not_define_is_read() {
        let frame = frame_with_tag_zero(&[1, 0, 2, 0xab, 0xcd]);
        assert!(
            decode_response::<FetchRequest, FetchResponse>(frame.clone(), 12).is_err(),
            "kafka-protocol refuses it (if it no longer does, this workaround can go)"
        );
        let (correlation, response) = decode_fetch_response(frame, 12).unwrap();
        assert_eq!((correlation, response.session_id), (42, 7));
        let p = &response.responses[0].partitions[0];
        assert_eq!(p.high_watermark, 5);
        assert_eq!(p.records.as_deref(), Some(&b"batch"[..]));
        assert_eq!(
            response.unknown_tagged_fields.get(&0).map(|b| b.to_vec()),
            Some(vec![0xab, 0xcd])
        );
    }

    #[test]
    fn a_tagged_field_longer_than_the_frame_is_an_error() {
        let frame = frame_with_tag_zero(&[1, 0, 9, 0xab]);
        let e = decode_fetch_response(frame, 12).unwrap_err();
        assert!(e.to_string().contains("tagged field 0 of 9 bytes"), "{e}");
    }
}
