#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The `skiff` binary as a user runs it: a real process on a loopback port, real
//! Kafka requests (encoded by kafka-protocol, as a client would), SIGTERM and
//! SIGKILL restarts, and malformed input on raw sockets.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiVersionsRequest, ApiVersionsResponse, FetchRequest, FetchResponse, ProduceRequest,
    ProduceResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use skiff_engine::batch::{BatchBuilder, BatchHeader, Compression};
use skiff_node::admin_client::AdminClient;

struct NodeProcess {
    child: Child,
    port: u16,
    /// The HTTP port of /metrics and /health.
    metrics_port: u16,
    dir: PathBuf,
    /// The last `LOG_TAIL_LINES` lines of the node's stderr.
    log: std::sync::Arc<std::sync::Mutex<std::collections::VecDeque<String>>>,
}

const LOG_TAIL_LINES: usize = 200;

/// A loopback port free now, below the ephemeral range: a port the kernel
/// hands out (bind to 0) can be taken by any outgoing connection before the
/// node binds it (seen under load: "the metrics listener ... is in use").
fn free_port() -> u16 {
    ports_below_ephemeral(1)[0]
}

impl NodeProcess {
    fn start(dir: &Path, port: u16, extra: &[&str]) -> NodeProcess {
        NodeProcess::start_with(dir, port, extra, None)
    }

    /// `start`, optionally under a file-size limit (`prlimit --fsize`, SIGXFSZ
    /// ignored): a write past `fsize_limit` bytes of any file fails with EFBIG,
    /// as a write to a full disk fails with ENOSPC.
    fn start_with(dir: &Path, port: u16, extra: &[&str], fsize_limit: Option<u64>) -> NodeProcess {
        let ports = Ports {
            kafka: port,
            metrics: free_port(),
            controller: 0,
        };
        NodeProcess::launch(dir, ports, extra, fsize_limit)
    }

    /// `start` on the given ports (a restart on all of the same ones).
    fn start_on(dir: &Path, ports: Ports, extra: &[&str]) -> NodeProcess {
        NodeProcess::launch(dir, ports, extra, None)
    }

    fn launch(dir: &Path, ports: Ports, extra: &[&str], fsize_limit: Option<u64>) -> NodeProcess {
        let mut command = match fsize_limit {
            None => Command::new(env!("CARGO_BIN_EXE_skiff")),
            Some(limit) => {
                // sh ignores SIGXFSZ and execs prlimit, which execs the node:
                // the child's pid is the node's.
                let mut c = Command::new("sh");
                c.arg("-c")
                    .arg(format!(
                        "trap '' XFSZ; exec prlimit --fsize={limit} -- \"$0\" \"$@\""
                    ))
                    .arg(env!("CARGO_BIN_EXE_skiff"));
                c
            }
        };
        command.args(node_args(dir, ports, extra));
        let (node, listening) = NodeProcess::spawn(command, dir, ports);
        node.wait_listening(listening)
    }

    /// Starts the node and returns at once; the receiver hears when it
    /// listens for Kafka clients (`wait_listening`).
    fn spawn(
        mut command: Command,
        dir: &Path,
        ports: Ports,
    ) -> (NodeProcess, std::sync::mpsc::Receiver<()>) {
        let (port, metrics_port) = (ports.kafka, ports.metrics);
        let mut child = command
            .env("RUST_LOG", "info")
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let log = std::sync::Arc::new(std::sync::Mutex::new(std::collections::VecDeque::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let lines = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if line.contains("listening on") {
                    let _ = tx.send(());
                }
                let mut lines = lines.lock().unwrap();
                if lines.len() == LOG_TAIL_LINES {
                    lines.pop_front();
                }
                lines.push_back(line);
            }
        });
        let node = NodeProcess {
            child,
            port,
            metrics_port,
            dir: dir.to_path_buf(),
            log,
        };
        (node, rx)
    }

    /// Waits (30 s at most) until the node listens.
    fn wait_listening(mut self, listening: std::sync::mpsc::Receiver<()>) -> NodeProcess {
        if let Err(e) = listening.recv_timeout(Duration::from_secs(30)) {
            // Do not leave a hung node behind.
            let _ = self.child.kill();
            let _ = self.child.wait();
            panic!("node did not start listening: {e}\n{}", self.log_tail());
        }
        self
    }

    /// The last lines the node logged (for failure messages).
    fn log_tail(&self) -> String {
        let lines = self.log.lock().unwrap();
        lines.iter().cloned().collect::<Vec<_>>().join("\n")
    }

    fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn client(&self) -> AdminClient {
        AdminClient::connect(&self.bootstrap()).unwrap()
    }

    /// SIGTERM and wait: the node must exit 0 within the deadline.
    fn terminate(self) {
        let (status, _, log) = self.terminate_within(Duration::from_secs(30));
        assert!(status.success(), "SIGTERM exit status {status}\n{log}");
    }

    /// SIGTERM, then wait at most `limit` for the exit (the process is killed
    /// and the test fails beyond it): the exit status, how long it took and
    /// the last lines the node logged.
    fn terminate_within(mut self, limit: Duration) -> (std::process::ExitStatus, Duration, String) {
        let pid = self.child.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                let took = started.elapsed();
                // The reader thread sees the end of stderr soon after the exit.
                std::thread::sleep(Duration::from_millis(100));
                return (status, took, self.log_tail());
            }
            assert!(
                started.elapsed() < limit,
                "node did not stop within {limit:?} after SIGTERM\n{}",
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    fn restart(self, sigkill: bool) -> NodeProcess {
        let (dir, port) = (self.dir.clone(), self.port);
        if sigkill {
            self.kill();
        } else {
            self.terminate();
        }
        NodeProcess::start(&dir, port, &[])
    }
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A node's ports (0: any, the kernel's pick).
#[derive(Debug, Clone, Copy)]
struct Ports {
    kafka: u16,
    controller: u16,
    metrics: u16,
}

impl Ports {
    /// Three ports free now, below the kernel's ephemeral range (32768 and
    /// up on Linux): no outgoing connection of this or any test, and no bind
    /// to port 0, can take one while a node restarts on it.
    fn free() -> Ports {
        let ports = ports_below_ephemeral(3);
        Ports {
            kafka: ports[0],
            controller: ports[1],
            metrics: ports[2],
        }
    }
}

/// `n` distinct loopback ports in 20000..32000 that can be bound now, from a
/// start that differs between tests and processes.
fn ports_below_ephemeral(n: usize) -> Vec<u16> {
    use std::sync::atomic::{AtomicU32, Ordering};
    static CALLS: AtomicU32 = AtomicU32::new(0);
    let seed = std::process::id()
        .wrapping_mul(7919)
        .wrapping_add(CALLS.fetch_add(1, Ordering::Relaxed).wrapping_mul(104_729))
        .wrapping_add(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos()),
        );
    let mut ports = Vec::new();
    let mut candidate = 20_000 + seed % 12_000;
    for _ in 0..12_000 {
        let port = u16::try_from(candidate).unwrap();
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            ports.push(port);
            if ports.len() == n {
                return ports;
            }
        }
        candidate = 20_000 + (candidate - 20_000 + 1) % 12_000;
    }
    panic!("no {n} free ports in 20000..32000");
}

/// `skiff node`'s arguments: 2 cores on loopback, `extra` as `--set`s.
fn node_args(dir: &Path, ports: Ports, extra: &[&str]) -> Vec<std::ffi::OsString> {
    let mut args: Vec<std::ffi::OsString> = [
        "node".to_string(),
        "--listen".to_string(),
        format!("127.0.0.1:{}", ports.kafka),
        "--metrics-listen".to_string(),
        format!("127.0.0.1:{}", ports.metrics),
        "--controller-listen".to_string(),
        format!("127.0.0.1:{}", ports.controller),
        "--cores".to_string(),
        "2".to_string(),
        "--data-dir".to_string(),
    ]
    .into_iter()
    .map(Into::into)
    .collect();
    args.push(dir.into());
    for s in extra {
        args.push("--set".into());
        args.push((*s).into());
    }
    args
}

/// Starts a node that must not come up and waits (at most `limit`) for it to
/// exit, calling `meanwhile` every 50 ms while it runs: its exit status and
/// everything it wrote to stderr.
fn start_failing(
    dir: &Path,
    ports: Ports,
    limit: Duration,
    mut meanwhile: impl FnMut(u32),
) -> (std::process::ExitStatus, String) {
    /// Kills the node if the test fails while it runs (`meanwhile` panics).
    struct Guard(Child);
    impl Drop for Guard {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut child = Guard(
        Command::new(env!("CARGO_BIN_EXE_skiff"))
            .args(node_args(dir, ports, &[]))
            .env("RUST_LOG", "info")
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut stderr = child.0.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > limit {
            drop(child);
            let text = reader.join().unwrap();
            panic!("the node did not exit within {limit:?}\n{text}");
        }
        meanwhile(child.0.id());
        std::thread::sleep(Duration::from_millis(50));
    };
    (status, reader.join().unwrap())
}

/// Whether anything accepts connections on the loopback port.
fn answers(port: u16) -> bool {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_ok()
}

/// Whether process `pid` holds a listening TCP socket on 127.0.0.1:`port`
/// (/proc/net/tcp's LISTEN entry whose inode is one of its fds). Asking
/// whether the port answers is not the same: a parallel test's process may
/// take a port the node under test never bound.
fn listens(pid: u32, port: u16) -> bool {
    let Ok(table) = std::fs::read_to_string("/proc/net/tcp") else {
        return false;
    };
    let local = format!("0100007F:{port:04X}");
    let inodes: Vec<String> = table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // sl local_address rem_address st ... uid timeout inode
            (fields.len() > 9 && fields[1] == local && fields[3] == "0A")
                .then(|| format!("socket:[{}]", fields[9]))
        })
        .collect();
    if inodes.is_empty() {
        return false;
    }
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten().any(|fd| {
        std::fs::read_link(fd.path())
            .is_ok_and(|target| inodes.iter().any(|i| target.as_os_str() == i.as_str()))
    })
}

/// ApiVersions answered without error.
fn api_versions_ok(client: &mut AdminClient) -> bool {
    let versions: ApiVersionsResponse = client.call(&ApiVersionsRequest::default(), 3).unwrap();
    versions.error_code == 0
}

fn batch(values: &[&str], producer: Option<(i64, i16, i32)>) -> Bytes {
    let mut b = BatchBuilder::new().compression(Compression::None);
    if let Some((id, epoch, seq)) = producer {
        b = b.producer(id, epoch, seq);
    }
    for (i, v) in values.iter().enumerate() {
        b.push(
            1_000 + i as i64,
            Some(format!("k{i}").as_bytes()),
            Some(v.as_bytes()),
            &[],
        );
    }
    b.build().unwrap()
}

fn produce(client: &mut AdminClient, topic: &str, partition: i32, records: Bytes) -> (i16, i64) {
    let request = ProduceRequest::default()
        .with_acks(-1)
        .with_timeout_ms(10_000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(TopicName(StrBytes::from_string(topic.to_string())))
            .with_partition_data(vec![PartitionProduceData::default()
                .with_index(partition)
                .with_records(Some(records))])]);
    let response: ProduceResponse = client.call(&request, 9).unwrap();
    let p = &response.responses[0].partition_responses[0];
    (p.error_code, p.base_offset)
}

/// A consumer's Fetch of one partition from `offset` (100 ms long poll, 1 MiB).
fn fetch_request(topic: &str, partition: i32, offset: i64) -> FetchRequest {
    FetchRequest::default()
        .with_replica_id(kafka_protocol::messages::BrokerId(-1))
        .with_max_wait_ms(100)
        .with_min_bytes(1)
        .with_max_bytes(1 << 20)
        .with_topics(vec![FetchTopic::default()
            .with_topic(TopicName(StrBytes::from_string(topic.to_string())))
            .with_partitions(vec![FetchPartition::default()
                .with_partition(partition)
                .with_fetch_offset(offset)
                .with_partition_max_bytes(1 << 20)])])
}

/// Every record value of a partition, from offset 0.
fn fetch_values(client: &mut AdminClient, topic: &str, partition: i32) -> Vec<(i64, String)> {
    fetch_values_from(client, topic, partition, 0)
}

/// `fetch_values` from `offset` on.
fn fetch_values_from(
    client: &mut AdminClient,
    topic: &str,
    partition: i32,
    offset: i64,
) -> Vec<(i64, String)> {
    let mut out = Vec::new();
    let mut offset = offset;
    for _ in 0..100 {
        let request = fetch_request(topic, partition, offset);
        let response: FetchResponse = client.call(&request, 11).unwrap();
        let p = &response.responses[0].partitions[0];
        assert_eq!(p.error_code, 0);
        let records = p.records.clone().unwrap_or_default();
        if records.is_empty() {
            return out;
        }
        let mut rest = records;
        while !rest.is_empty() {
            let h = BatchHeader::parse(&rest).unwrap();
            let one = rest.split_to(h.total_len());
            for r in skiff_engine::batch::decode_records(&one, 1 << 20).unwrap() {
                out.push((
                    r.offset,
                    String::from_utf8(r.value.unwrap().to_vec()).unwrap(),
                ));
            }
            offset = h.next_offset();
        }
    }
    panic!("fetch did not reach the end");
}

fn create_topic(client: &mut AdminClient, name: &str, partitions: i32) {
    create_topic_with(client, name, partitions, &[]);
}

fn create_topic_with(
    client: &mut AdminClient,
    name: &str,
    partitions: i32,
    configs: &[(&str, &str)],
) {
    use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
    let configs = configs
        .iter()
        .map(|(k, v)| {
            CreatableTopicConfig::default()
                .with_name(StrBytes::from_string(k.to_string()))
                .with_value(Some(StrBytes::from_string(v.to_string())))
        })
        .collect();
    let request = kafka_protocol::messages::CreateTopicsRequest::default().with_topics(vec![
        CreatableTopic::default()
            .with_name(TopicName(StrBytes::from_string(name.to_string())))
            .with_num_partitions(partitions)
            .with_replication_factor(1)
            .with_configs(configs),
    ]);
    let response = client.create_topics(&request).unwrap();
    assert_eq!(
        response.topics[0].error_code, 0,
        "{:?}",
        response.topics[0].error_message
    );
}

#[test]
fn produce_fetch_idempotence_and_restarts() {
    let tmp = tempfile::tempdir().unwrap();
    let node = NodeProcess::start(
        tmp.path(),
        free_port(),
        &["auto.create.topics.enable=false"],
    );
    let mut c = node.client();
    create_topic(&mut c, "events", 3);

    // Plain produce to every partition (they live on both cores).
    for p in 0..3 {
        assert_eq!(
            produce(&mut c, "events", p, batch(&["a", "b"], None)),
            (0, 0)
        );
        assert_eq!(produce(&mut c, "events", p, batch(&["c"], None)), (0, 2));
    }
    // Idempotent producer: a resent batch is answered with its first offset and
    // not stored twice; a gap in sequences is refused.
    let pid = Some((42, 0, 0));
    assert_eq!(
        produce(&mut c, "events", 0, batch(&["i0", "i1"], pid)),
        (0, 3)
    );
    assert_eq!(
        produce(&mut c, "events", 0, batch(&["i0", "i1"], pid)),
        (0, 3),
        "duplicate"
    );
    assert_eq!(
        produce(&mut c, "events", 0, batch(&["x"], Some((42, 0, 5)))).0,
        45,
        "OUT_OF_ORDER_SEQUENCE_NUMBER"
    );
    assert_eq!(
        produce(&mut c, "events", 0, batch(&["i2"], Some((42, 0, 2)))),
        (0, 5)
    );
    // Unknown partition, bad CRC.
    assert_eq!(
        produce(&mut c, "events", 9, batch(&["z"], None)).0,
        3,
        "UNKNOWN_TOPIC_OR_PARTITION"
    );
    assert_eq!(produce(&mut c, "nope", 0, batch(&["z"], None)).0, 3);
    let mut corrupt = batch(&["payload"], None).to_vec();
    let last = corrupt.len() - 2;
    corrupt[last] ^= 0xff;
    assert_eq!(
        produce(&mut c, "events", 1, Bytes::from(corrupt)).0,
        2,
        "CORRUPT_MESSAGE"
    );

    let expected0: Vec<(i64, String)> = ["a", "b", "c", "i0", "i1", "i2"]
        .iter()
        .enumerate()
        .map(|(i, v)| (i as i64, v.to_string()))
        .collect();
    assert_eq!(fetch_values(&mut c, "events", 0), expected0);
    drop(c);

    // SIGTERM restart: everything acknowledged is there, and the producer's
    // sequence state too (rebuilt from the log).
    let node = node.restart(false);
    let mut c = node.client();
    assert_eq!(fetch_values(&mut c, "events", 0), expected0);
    assert_eq!(
        produce(&mut c, "events", 0, batch(&["i2"], Some((42, 0, 2)))),
        (0, 5),
        "duplicate after restart"
    );
    assert_eq!(produce(&mut c, "events", 2, batch(&["d"], None)), (0, 3));
    drop(c);

    // SIGKILL restart: acks=all was answered after fdatasync, so nothing is lost.
    let node = node.restart(true);
    let mut c = node.client();
    assert_eq!(fetch_values(&mut c, "events", 0), expected0);
    let p2: Vec<String> = fetch_values(&mut c, "events", 2)
        .into_iter()
        .map(|(_, v)| v)
        .collect();
    assert_eq!(p2, ["a", "b", "c", "d"]);
    drop(c);
    node.terminate();
}

/// `log.durability = "interval"` relaxes the fdatasync, not the write: a
/// produce is answered once its records are in the file, so a SIGKILL loses
/// nothing acknowledged (Kafka's page-cache guarantee; only a power loss
/// may take the last interval). Small batches sit in the partial append
/// chunk: the node acknowledged them from memory, and lost them to a
/// SIGKILL, before the ack waited for the write.
#[test]
fn interval_durability_loses_nothing_acknowledged_to_sigkill() {
    let tmp = tempfile::tempdir().unwrap();
    let node = NodeProcess::start(
        tmp.path(),
        free_port(),
        &[
            "auto.create.topics.enable=false",
            "log.durability=interval",
            "log.flush.interval.ms=3600000",
        ],
    );
    let mut c = node.client();
    create_topic(&mut c, "relaxed", 2);
    let mut expected = [Vec::new(), Vec::new()];
    for i in 0..40 {
        let p = i % 2;
        let value = format!("v{i}");
        let (error, base) = produce(&mut c, "relaxed", p, batch(&[&value], None));
        assert_eq!(error, 0, "produce {i}");
        assert_eq!(base, expected[p as usize].len() as i64);
        expected[p as usize].push((base, value));
    }
    // Read back before the crash too: what was acknowledged is readable.
    for p in 0..2 {
        assert_eq!(fetch_values(&mut c, "relaxed", p), expected[p as usize]);
    }
    drop(c);
    let node = node.restart(true);
    let mut c = node.client();
    for p in 0..2 {
        assert_eq!(
            fetch_values(&mut c, "relaxed", p),
            expected[p as usize],
            "partition {p} after SIGKILL"
        );
    }
    drop(c);
    node.terminate();
}

/// The producer snapshot files (by offset) in a partition's directory.
fn snapshot_offsets(dir: &Path) -> Vec<i64> {
    let mut offsets: Vec<i64> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| {
                    let name = e.ok()?.file_name().into_string().ok()?;
                    name.strip_suffix(".snapshot")?.parse().ok()
                })
                .collect()
        })
        .unwrap_or_default();
    offsets.sort_unstable();
    offsets
}

fn wait_for_snapshot(dir: &Path, offset: i64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !snapshot_offsets(dir).contains(&offset) {
        assert!(
            Instant::now() < deadline,
            "no producer snapshot at {offset} in {}: {:?}",
            dir.display(),
            snapshot_offsets(dir)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

const SNAPSHOT_SETTINGS: [&str; 2] = [
    "log.flush.offset.checkpoint.interval.ms=200",
    "log.retention.check.interval.ms=100",
];

/// Producer state comes back from the snapshot, not only from the log: the
/// producer's batches are in a segment retention deleted, yet after a
/// SIGTERM and a SIGKILL restart its retry is still a duplicate answered with
/// the original offset and its next sequence appends (a rebuild from the log
/// alone would not know the producer: UNKNOWN_PRODUCER_ID).
#[test]
fn producer_snapshots_survive_restarts_and_retention() {
    let tmp = tempfile::tempdir().unwrap();
    let port = free_port();
    let node = NodeProcess::start(tmp.path(), port, &SNAPSHOT_SETTINGS);
    let mut c = node.client();
    // Batches carry 1970 timestamps: every closed segment is past retention.
    create_topic_with(
        &mut c,
        "idem",
        1,
        &[("segment.bytes", "16384"), ("retention.ms", "60000")],
    );
    let value = "v".repeat(4000);
    for seq in 0..4 {
        assert_eq!(
            produce(&mut c, "idem", 0, batch(&[&value], Some((42, 0, seq)))),
            (0, i64::from(seq))
        );
    }
    for i in 0..8 {
        assert_eq!(
            produce(&mut c, "idem", 0, batch(&[&value], None)),
            (0, 4 + i)
        );
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while earliest_offset(&mut c, "idem") < 4 {
        assert!(
            Instant::now() < deadline,
            "retention did not delete the producer's segment"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let dir = tmp.path().join("idem-0");
    wait_for_snapshot(&dir, 12);
    assert!(snapshot_offsets(&dir).len() <= 2, "at most two kept");
    drop(c);

    node.terminate();
    let node = NodeProcess::start(tmp.path(), port, &SNAPSHOT_SETTINGS);
    let mut c = node.client();
    assert_eq!(
        produce(&mut c, "idem", 0, batch(&[&value], Some((42, 0, 3)))),
        (0, 3),
        "a retry of the last batch after a SIGTERM restart: a duplicate at its offset"
    );
    assert_eq!(
        produce(&mut c, "idem", 0, batch(&[&value], Some((42, 0, 4)))),
        (0, 12)
    );
    drop(c);

    // SIGKILL: the state comes from a snapshot plus the log after it.
    node.kill();
    let node = NodeProcess::start(tmp.path(), port, &SNAPSHOT_SETTINGS);
    let mut c = node.client();
    assert_eq!(
        produce(&mut c, "idem", 0, batch(&[&value], Some((42, 0, 4)))),
        (0, 12),
        "a retry after a SIGKILL restart"
    );
    assert_eq!(
        produce(&mut c, "idem", 0, batch(&[&value], Some((42, 0, 6)))).0,
        45,
        "OUT_OF_ORDER_SEQUENCE_NUMBER"
    );
    assert_eq!(
        produce(&mut c, "idem", 0, batch(&[&value], Some((42, 0, 5)))),
        (0, 13)
    );
    drop(c);
    node.terminate();
}

/// A corrupt snapshot on disk: the node starts, says so, and rebuilds the
/// producer state from the whole log, so deduplication still holds.
#[test]
fn corrupt_producer_snapshot_falls_back_to_the_log() {
    let tmp = tempfile::tempdir().unwrap();
    let port = free_port();
    let node = NodeProcess::start(tmp.path(), port, &SNAPSHOT_SETTINGS);
    let mut c = node.client();
    create_topic(&mut c, "plain", 1);
    for seq in 0..5 {
        assert_eq!(
            produce(
                &mut c,
                "plain",
                0,
                batch(&["x", "y"], Some((7, 0, seq * 2)))
            ),
            (0, i64::from(seq) * 2)
        );
    }
    let dir = tmp.path().join("plain-0");
    wait_for_snapshot(&dir, 10);
    drop(c);
    node.terminate();
    // Every snapshot damaged: a flipped byte in the body.
    let offsets = snapshot_offsets(&dir);
    assert!(!offsets.is_empty());
    for offset in &offsets {
        let path = dir.join(format!("{offset:020}.snapshot"));
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0x01;
        std::fs::write(&path, bytes).unwrap();
    }
    let node = NodeProcess::start(tmp.path(), port, &SNAPSHOT_SETTINGS);
    let mut c = node.client();
    assert_eq!(
        produce(&mut c, "plain", 0, batch(&["x", "y"], Some((7, 0, 8)))),
        (0, 8),
        "a retry of the last batch: a duplicate at its offset"
    );
    assert_eq!(
        produce(&mut c, "plain", 0, batch(&["x"], Some((7, 0, 10)))),
        (0, 10)
    );
    assert!(
        node.log_tail().contains("corrupt producer snapshot"),
        "the corrupt snapshot is reported:\n{}",
        node.log_tail()
    );
    drop(c);
    node.terminate();
}

fn raw_connection(port: u16) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

/// Reads until the node closes the connection (or the timeout says it did not).
fn closed_by_node(mut s: TcpStream) -> bool {
    let mut buf = [0u8; 64];
    matches!(s.read(&mut buf), Ok(0) | Err(_))
}

#[test]
fn malformed_input_closes_the_connection_and_the_node_stays_up() {
    let tmp = tempfile::tempdir().unwrap();
    let node = NodeProcess::start(tmp.path(), free_port(), &[]);

    // Garbage that parses as a small frame.
    let mut s = raw_connection(node.port);
    s.write_all(&[0, 0, 0, 8, 0xde, 0xad, 0xbe, 0xef, 1, 2, 3, 4])
        .unwrap();
    assert!(closed_by_node(s));
    // A frame announcing 2 GB: refused from its size prefix.
    let mut s = raw_connection(node.port);
    s.write_all(&0x7fff_ffffi32.to_be_bytes()).unwrap();
    assert!(closed_by_node(s));
    // An unknown API key.
    let mut s = raw_connection(node.port);
    let body = [
        &9999i16.to_be_bytes()[..],
        &0i16.to_be_bytes(),
        &1i32.to_be_bytes(),
        &(-1i16).to_be_bytes(),
    ]
    .concat();
    s.write_all(&(body.len() as i32).to_be_bytes()).unwrap();
    s.write_all(&body).unwrap();
    assert!(closed_by_node(s));
    // A truncated request followed by the end of the stream.
    let mut s = raw_connection(node.port);
    s.write_all(&[0, 0, 1, 0, 0, 3]).unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    assert!(closed_by_node(s));

    // The node still answers.
    let mut c = node.client();
    let versions: ApiVersionsResponse = c.call(&ApiVersionsRequest::default(), 3).unwrap();
    assert_eq!(versions.error_code, 0);
    assert!(
        versions
            .api_keys
            .iter()
            .any(|k| k.api_key == 0 && k.min_version == 0),
        "Produce v0 advertised"
    );
    node.terminate();
}

fn earliest_offset(client: &mut AdminClient, topic: &str) -> i64 {
    use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
    use kafka_protocol::messages::{ListOffsetsRequest, ListOffsetsResponse};
    let request = ListOffsetsRequest::default().with_topics(vec![ListOffsetsTopic::default()
        .with_name(TopicName(StrBytes::from_string(topic.to_string())))
        .with_partitions(vec![ListOffsetsPartition::default()
            .with_partition_index(0)
            .with_timestamp(-2)])]);
    let response: ListOffsetsResponse = client.call(&request, 7).unwrap();
    let p = &response.topics[0].partitions[0];
    assert_eq!(p.error_code, 0);
    p.offset
}

/// Retention in real time with small settings: old segments of a topic with
/// `retention.ms` go at the next check, the earliest offset moves, and a fetch
/// below it answers OFFSET_OUT_OF_RANGE.
#[test]
fn retention_deletes_old_segments_end_to_end() {
    let tmp = tempfile::tempdir().unwrap();
    let node = NodeProcess::start(
        tmp.path(),
        free_port(),
        &["log.retention.check.interval.ms=100"],
    );
    let mut c = node.client();
    create_topic_with(
        &mut c,
        "old",
        1,
        &[("segment.bytes", "16384"), ("retention.ms", "60000")],
    );
    create_topic_with(
        &mut c,
        "kept",
        1,
        &[("segment.bytes", "16384"), ("retention.ms", "-1")],
    );
    let an_hour_ago = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
        - 3_600_000;
    let value = "v".repeat(4000);
    for topic in ["old", "kept"] {
        for _ in 0..20 {
            let mut b = BatchBuilder::new();
            b.push(an_hour_ago, Some(b"k"), Some(value.as_bytes()), &[]);
            assert_eq!(produce(&mut c, topic, 0, b.build().unwrap()).0, 0);
        }
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while earliest_offset(&mut c, "old") == 0 {
        assert!(
            Instant::now() < deadline,
            "retention did not delete anything"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let start = earliest_offset(&mut c, "old");
    assert!(
        start > 0 && start < 20,
        "closed segments go, the active one stays: {start}"
    );
    assert_eq!(
        earliest_offset(&mut c, "kept"),
        0,
        "retention.ms=-1 keeps everything"
    );

    let request = fetch_request("old", 0, 0).with_max_wait_ms(0);
    let response: FetchResponse = c.call(&request, 11).unwrap();
    assert_eq!(
        response.responses[0].partitions[0].error_code, 1,
        "OFFSET_OUT_OF_RANGE below the log start"
    );
    drop(c);
    // The new start survives a restart.
    let node = node.restart(false);
    let mut c = node.client();
    assert_eq!(earliest_offset(&mut c, "old"), start);
    drop(c);
    node.terminate();
}

/// Segment recycling end to end: with small segments and `retention.bytes`,
/// rolls reuse the files retention removed (the metric counts them), and
/// after a SIGKILL the node serves exactly the acknowledged records from the
/// log start on: nothing a reused file held before comes back.
#[test]
fn recycled_segments_serve_exactly_what_was_acknowledged_across_sigkill() {
    let tmp = tempfile::tempdir().unwrap();
    let node = NodeProcess::start(
        tmp.path(),
        free_port(),
        &["log.retention.check.interval.ms=50"],
    );
    let mut c = node.client();
    create_topic_with(
        &mut c,
        "reused",
        1,
        &[("segment.bytes", "16384"), ("retention.bytes", "32768")],
    );
    let mut acked = Vec::new();
    let mut recycled = 0.0;
    for i in 0..400 {
        let value = format!("{i:05}-{}", "r".repeat(900));
        let (error, base) = produce(&mut c, "reused", 0, batch(&[&value], None));
        assert_eq!(error, 0, "produce {i}");
        assert_eq!(base, i);
        acked.push((base, value));
        if i % 20 == 19 {
            // Let retention run between bursts, so later rolls find files.
            std::thread::sleep(Duration::from_millis(120));
            recycled = metric(
                &scrape(node.metrics_port),
                "skiff_log_segments_recycled_total",
            );
        }
    }
    assert!(recycled > 0.0, "no roll reused a file");
    let dir = tmp.path().join("reused-0");
    let kept_free = std::fs::read_dir(&dir)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".log.free")
        })
        .count();
    assert!(kept_free <= 8, "{kept_free} free files kept");
    drop(c);

    let node = node.restart(true);
    let mut c = node.client();
    let start = earliest_offset(&mut c, "reused");
    assert!(start > 0, "retention removed something");
    let got = fetch_values_from(&mut c, "reused", 0, start);
    assert_eq!(got, acked[start as usize..].to_vec(), "after SIGKILL");
    drop(c);
    node.terminate();
}

/// Pipelined produce requests on one connection (all sent before any answer is
/// read) are applied in the order sent, as Kafka promises per connection.
#[test]
fn pipelined_produces_keep_their_order() {
    let tmp = tempfile::tempdir().unwrap();
    let node = NodeProcess::start(tmp.path(), free_port(), &[]);
    let mut c = node.client();
    create_topic(&mut c, "ordered", 2);
    const REQUESTS: usize = 300;
    let mut sent = Vec::new();
    for i in 0..REQUESTS {
        // Alternate partitions and sizes so requests take different times.
        let value = format!("{i:06}{}", "x".repeat((i % 7) * 500));
        let request = ProduceRequest::default()
            .with_acks(-1)
            .with_timeout_ms(10_000)
            .with_topic_data(vec![TopicProduceData::default()
                .with_name(TopicName(StrBytes::from_static_str("ordered")))
                .with_partition_data(vec![PartitionProduceData::default()
                    .with_index(0)
                    .with_records(Some(batch(&[&value], None)))])]);
        sent.push(c.send(&request, 9).unwrap());
    }
    let mut last = -1;
    for correlation_id in sent {
        let r: ProduceResponse = c.receive::<ProduceRequest, _>(correlation_id, 9).unwrap();
        let p = &r.responses[0].partition_responses[0];
        assert_eq!(p.error_code, 0);
        assert_eq!(
            p.base_offset,
            last + 1,
            "responses in order, offsets in send order"
        );
        last = p.base_offset;
    }
    let values: Vec<String> = fetch_values(&mut c, "ordered", 0)
        .into_iter()
        .map(|(_, v)| v[..6].to_string())
        .collect();
    let expected: Vec<String> = (0..REQUESTS).map(|i| format!("{i:06}")).collect();
    assert_eq!(values, expected);
    drop(c);
    node.terminate();
}

/// The file-size limit of the full-disk tests: room for the node's own files
/// (meta.properties, the metadata log, checkpoints) and a few MiB of the
/// partition that fills.
const FULL_DISK_LIMIT: u64 = 4 << 20;

/// A full disk: the node runs under a file-size limit, so the write that
/// takes a segment past it fails (EFBIG, as ENOSPC on a full disk). Pipelined
/// produce requests to that partition are all answered within a bound: every
/// one acknowledged before the failure, then NOT_ENOUGH_REPLICAS_AFTER_APPEND
/// for a batch already in the log when the write failed ("possibly persisted":
/// librdkafka's idempotent producer retries it with the same sequence numbers;
/// NOT_LEADER_OR_FOLLOWER or KAFKA_STORAGE_ERROR, "not persisted", made it
/// resend under a bumped epoch and duplicate what the followers had) and
/// NOT_LEADER_OR_FOLLOWER for one refused before it reached the log (the
/// partition goes offline, later produces are refused at once).
/// Another partition of the node keeps taking writes, every acknowledged
/// record can be fetched before and after a restart without the limit, and
/// SIGTERM stops the node within seconds.
#[test]
fn full_disk_answers_produce_and_stops() {
    full_disk_case(&[]);
}

/// `full_disk_answers_produce_and_stops` with segments a little larger than
/// the limit, so the failing write can be the roll's (which once left the
/// partition rolling on, acknowledging batches that never reached the disk,
/// and the node unable to restart: "corrupt batch below the recovery point").
#[test]
fn full_disk_at_a_segment_roll_answers_produce_and_stops() {
    let segment_bytes = format!("log.segment.bytes={}", FULL_DISK_LIMIT + 100_000);
    full_disk_case(&[&segment_bytes]);
}

fn full_disk_case(settings: &[&str]) {
    const VALUE_BYTES: usize = 60 << 10;
    /// Produce requests in flight on the connection.
    const WINDOW: usize = 8;
    /// A produce answered later than this counts as never answered.
    const ANSWER_WITHIN: Duration = Duration::from_secs(5);
    const STOP_WITHIN: Duration = Duration::from_secs(10);
    const NOT_LEADER_OR_FOLLOWER: i16 = 6;
    const NOT_ENOUGH_REPLICAS_AFTER_APPEND: i16 = 20;

    let tmp = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut all_settings = vec!["auto.create.topics.enable=false"];
    all_settings.extend_from_slice(settings);
    let node = NodeProcess::start_with(tmp.path(), port, &all_settings, Some(FULL_DISK_LIMIT));
    let mut admin = node.client();
    create_topic(&mut admin, "full", 1);
    create_topic(&mut admin, "other", 1);
    assert_eq!(
        produce(&mut admin, "other", 0, batch(&["before"], None)),
        (0, 0)
    );

    let value = |n: usize| format!("{n:06}:{}", "v".repeat(VALUE_BYTES));
    let acks_all_to_full = |records: Bytes| {
        ProduceRequest::default()
            .with_acks(-1)
            .with_timeout_ms(10_000)
            .with_topic_data(vec![TopicProduceData::default()
                .with_name(TopicName(StrBytes::from_static_str("full")))
                .with_partition_data(vec![PartitionProduceData::default()
                    .with_index(0)
                    .with_records(Some(records))])])
    };
    let request = |n: usize| acks_all_to_full(batch(&[&value(n)], None));
    let mut producer = node.client();
    producer.set_read_timeout(ANSWER_WITHIN).unwrap();
    // Far more than the limit leaves room for: some write must fail.
    let most = 4 * FULL_DISK_LIMIT as usize / VALUE_BYTES;
    let mut in_flight = std::collections::VecDeque::new();
    let mut acked: Vec<(i64, String)> = Vec::new();
    let mut failed: Vec<(usize, i16, String)> = Vec::new();
    let mut next = 0;
    loop {
        while failed.is_empty() && in_flight.len() < WINDOW && next < most {
            in_flight.push_back((producer.send(&request(next), 9).unwrap(), next));
            next += 1;
        }
        let Some((correlation_id, n)) = in_flight.pop_front() else {
            break;
        };
        let response: ProduceResponse = producer
            .receive::<ProduceRequest, _>(correlation_id, 9)
            .unwrap_or_else(|e| {
                panic!(
                    "produce {n} not answered within {ANSWER_WITHIN:?}: {e:#}\n{}",
                    node.log_tail()
                )
            });
        let p = &response.responses[0].partition_responses[0];
        if p.error_code == 0 {
            assert!(
                failed.is_empty(),
                "produce {n} acknowledged after a failed write: {failed:?}"
            );
            acked.push((p.base_offset, value(n)));
        } else {
            let message = p.error_message.as_ref().map(|m| m.to_string());
            failed.push((n, p.error_code, message.unwrap_or_default()));
        }
    }
    assert!(
        !failed.is_empty(),
        "no write failed in {most} batches of {VALUE_BYTES} bytes"
    );
    assert!(
        acked.len() * VALUE_BYTES > FULL_DISK_LIMIT as usize / 2,
        "the limit left room for more than {} batches",
        acked.len()
    );
    for (n, code, message) in &failed {
        assert!(
            *code == NOT_LEADER_OR_FOLLOWER || *code == NOT_ENOUGH_REPLICAS_AFTER_APPEND,
            "produce {n} refused with {code}: {message}"
        );
        // Only a batch in the log is "possibly persisted", and it says so.
        assert_eq!(
            *code == NOT_ENOUGH_REPLICAS_AFTER_APPEND,
            message.contains("written to the log"),
            "produce {n} refused with {code}: {message}"
        );
    }
    assert!(
        failed[0].2.contains("offline") && failed[0].2.contains("File too large"),
        "the error says why: {:?}",
        failed[0]
    );

    // The partition stays offline: a new produce is refused at once.
    producer.set_read_timeout(Duration::from_secs(30)).unwrap();
    let started = Instant::now();
    let (code, _) = produce(&mut producer, "full", 0, batch(&["after"], None));
    assert_eq!(code, NOT_LEADER_OR_FOLLOWER);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "refused in {:?}",
        started.elapsed()
    );
    // An idempotent producer's pipelined batches all get the log's refusal,
    // checked before their sequence: the second one must not be answered
    // UNKNOWN_PRODUCER_ID or OUT_OF_ORDER_SEQUENCE_NUMBER because the first
    // was refused (librdkafka reads that as skipped sequence numbers and
    // bumps its epoch, which can duplicate writes still waiting).
    let idempotent = |seq: i32| acks_all_to_full(batch(&["idempotent"], Some((4242, 0, seq))));
    let first = producer.send(&idempotent(0), 9).unwrap();
    let second = producer.send(&idempotent(1), 9).unwrap();
    for (seq, id) in [(0, first), (1, second)] {
        let r: ProduceResponse = producer.receive::<ProduceRequest, _>(id, 9).unwrap();
        let code = r.responses[0].partition_responses[0].error_code;
        assert_eq!(
            code, NOT_LEADER_OR_FOLLOWER,
            "idempotent batch at sequence {seq}"
        );
    }
    // The other partition's writes still succeed.
    assert_eq!(
        produce(&mut admin, "other", 0, batch(&["during"], None)),
        (0, 1)
    );
    // Everything acknowledged is readable, nothing else.
    assert_eq!(fetch_values(&mut admin, "full", 0), acked);
    drop(admin);
    drop(producer);

    let (status, took, log) = node.terminate_within(STOP_WITHIN);
    assert!(status.success(), "SIGTERM exit status {status}\n{log}");
    eprintln!(
        "full disk: {} produces acknowledged, {} refused (first: {}), stopped in {took:?}",
        acked.len(),
        failed.len(),
        failed[0].2
    );

    // Without the limit: every acknowledged record is there (records whose
    // produce failed may follow them: their fate was never promised), the
    // partition takes writes again, the other one kept its records.
    let node = NodeProcess::start(tmp.path(), port, settings);
    let mut c = node.client();
    let fetched = fetch_values(&mut c, "full", 0);
    assert!(
        fetched.len() >= acked.len() && fetched[..acked.len()] == acked[..],
        "acknowledged records lost: {} acknowledged, {} read back",
        acked.len(),
        fetched.len()
    );
    let (code, offset) = produce(&mut c, "full", 0, batch(&["again"], None));
    assert_eq!((code, offset), (0, fetched.len() as i64));
    let other: Vec<String> = fetch_values(&mut c, "other", 0)
        .into_iter()
        .map(|(_, v)| v)
        .collect();
    assert_eq!(other, ["before", "during"]);
    drop(c);
    node.terminate();
}

// ---------------------------------------------------------------- groups

mod groups {
    use super::*;
    use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
    use kafka_protocol::messages::offset_commit_request::{
        OffsetCommitRequestPartition, OffsetCommitRequestTopic,
    };
    use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestTopic;
    use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
    use kafka_protocol::messages::{
        DeleteGroupsRequest, DeleteGroupsResponse, DescribeGroupsRequest, DescribeGroupsResponse,
        FindCoordinatorRequest, FindCoordinatorResponse, GroupId, HeartbeatRequest,
        HeartbeatResponse, JoinGroupRequest, JoinGroupResponse, LeaveGroupRequest,
        LeaveGroupResponse, ListGroupsRequest, ListGroupsResponse, MetadataRequest,
        MetadataResponse, OffsetCommitRequest, OffsetCommitResponse, OffsetFetchRequest,
        OffsetFetchResponse, SyncGroupRequest, SyncGroupResponse,
    };

    const NONE: i16 = 0;
    const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
    const INVALID_TOPIC_EXCEPTION: i16 = 17;
    const ILLEGAL_GENERATION: i16 = 22;
    const INCONSISTENT_GROUP_PROTOCOL: i16 = 23;
    const INVALID_GROUP_ID: i16 = 24;
    const UNKNOWN_MEMBER_ID: i16 = 25;
    const INVALID_SESSION_TIMEOUT: i16 = 26;
    const REBALANCE_IN_PROGRESS: i16 = 27;
    const NON_EMPTY_GROUP: i16 = 68;
    const GROUP_ID_NOT_FOUND: i16 = 69;
    const MEMBER_ID_REQUIRED: i16 = 79;

    fn s(text: &str) -> StrBytes {
        StrBytes::from_string(text.to_string())
    }

    fn join_request(group: &str, member_id: &str, protocol_type: &str) -> JoinGroupRequest {
        JoinGroupRequest::default()
            .with_group_id(GroupId(s(group)))
            .with_session_timeout_ms(10_000)
            .with_rebalance_timeout_ms(10_000)
            .with_member_id(s(member_id))
            .with_protocol_type(s(protocol_type))
            .with_protocols(vec![JoinGroupRequestProtocol::default()
                .with_name(s("range"))
                .with_metadata(Bytes::from_static(b"sub"))])
    }

    /// JoinGroup after FindCoordinator, as clients do: the first lookup
    /// creates `__consumer_offsets`, and this node leads all of it.
    fn join(c: &mut AdminClient, request: &JoinGroupRequest) -> JoinGroupResponse {
        let find: FindCoordinatorResponse = c
            .call(
                &FindCoordinatorRequest::default().with_key(request.group_id.0.clone()),
                1,
            )
            .unwrap();
        assert_eq!(find.error_code, NONE, "{:?}", find.error_message);
        c.call(request, 5).unwrap()
    }

    fn heartbeat(c: &mut AdminClient, group: &str, member: &str, generation: i32) -> i16 {
        let request = HeartbeatRequest::default()
            .with_group_id(GroupId(s(group)))
            .with_member_id(s(member))
            .with_generation_id(generation);
        let response: HeartbeatResponse = c.call(&request, 3).unwrap();
        response.error_code
    }

    fn sync(c: &mut AdminClient, group: &str, member: &str, generation: i32) -> SyncGroupResponse {
        let request = SyncGroupRequest::default()
            .with_group_id(GroupId(s(group)))
            .with_member_id(s(member))
            .with_generation_id(generation)
            .with_assignments(vec![SyncGroupRequestAssignment::default()
                .with_member_id(s(member))
                .with_assignment(Bytes::from_static(b"all of it"))]);
        c.call(&request, 3).unwrap()
    }

    fn commit(
        c: &mut AdminClient,
        group: &str,
        member: &str,
        generation: i32,
        topic: &str,
        offset: i64,
    ) -> i16 {
        let request = OffsetCommitRequest::default()
            .with_group_id(GroupId(s(group)))
            .with_generation_id_or_member_epoch(generation)
            .with_member_id(s(member))
            .with_topics(vec![OffsetCommitRequestTopic::default()
                .with_name(TopicName(s(topic)))
                .with_partitions(vec![OffsetCommitRequestPartition::default()
                    .with_partition_index(0)
                    .with_committed_offset(offset)
                    .with_committed_metadata(Some(s("meta")))])]);
        let response: OffsetCommitResponse = c.call(&request, 8).unwrap();
        response.topics[0].partitions[0].error_code
    }

    /// Committed offsets of partitions 0 and 1.
    fn fetch(c: &mut AdminClient, group: &str, topic: &str) -> Vec<i64> {
        let request = OffsetFetchRequest::default()
            .with_group_id(GroupId(s(group)))
            .with_topics(Some(vec![OffsetFetchRequestTopic::default()
                .with_name(TopicName(s(topic)))
                .with_partition_indexes(vec![0, 1])]));
        let response: OffsetFetchResponse = c.call(&request, 7).unwrap();
        assert_eq!(response.error_code, NONE);
        response.topics[0]
            .partitions
            .iter()
            .map(|p| p.committed_offset)
            .collect()
    }

    fn describe(c: &mut AdminClient, group: &str) -> (String, usize) {
        let request = DescribeGroupsRequest::default().with_groups(vec![GroupId(s(group))]);
        let response: DescribeGroupsResponse = c.call(&request, 5).unwrap();
        let g = &response.groups[0];
        assert_eq!(g.error_code, NONE);
        (g.group_state.to_string(), g.members.len())
    }

    fn delete(c: &mut AdminClient, group: &str) -> i16 {
        let request = DeleteGroupsRequest::default().with_groups_names(vec![GroupId(s(group))]);
        let response: DeleteGroupsResponse = c.call(&request, 2).unwrap();
        response.results[0].error_code
    }

    #[test]
    fn group_protocol_edges_fencing_and_offsets_across_restart() {
        let tmp = tempfile::tempdir().unwrap();
        let node = NodeProcess::start(tmp.path(), free_port(), &[]);
        let mut c = node.client();
        create_topic(&mut c, "orders", 2);

        // FindCoordinator: groups here, and transactional ids too (the
        // lookup creates __transaction_state).
        let find: FindCoordinatorResponse = c
            .call(&FindCoordinatorRequest::default().with_key(s("g")), 1)
            .unwrap();
        assert_eq!((find.error_code, find.port), (NONE, i32::from(node.port)));
        let find: FindCoordinatorResponse = c
            .call(
                &FindCoordinatorRequest::default()
                    .with_key(s("tx"))
                    .with_key_type(1),
                1,
            )
            .unwrap();
        assert_eq!((find.error_code, find.port), (NONE, i32::from(node.port)));

        // Bad joins.
        assert_eq!(
            join(&mut c, &join_request("", "", "consumer")).error_code,
            INVALID_GROUP_ID
        );
        assert_eq!(
            join(&mut c, &join_request("g", "", "")).error_code,
            INCONSISTENT_GROUP_PROTOCOL
        );
        assert_eq!(
            join(
                &mut c,
                &join_request("g", "", "consumer").with_protocols(vec![])
            )
            .error_code,
            INCONSISTENT_GROUP_PROTOCOL
        );
        assert_eq!(
            join(&mut c, &join_request("g", "ghost", "consumer")).error_code,
            UNKNOWN_MEMBER_ID
        );
        assert_eq!(
            join(
                &mut c,
                &join_request("g", "", "consumer").with_session_timeout_ms(10)
            )
            .error_code,
            INVALID_SESSION_TIMEOUT
        );

        // The v4+ two-step join, then generation 1 with this member as leader.
        let first = join(&mut c, &join_request("g", "", "consumer"));
        assert_eq!(first.error_code, MEMBER_ID_REQUIRED);
        let member = first.member_id.to_string();
        assert!(member.starts_with("skiff-admin-"), "{member}");
        let joined = join(&mut c, &join_request("g", &member, "consumer"));
        assert_eq!(joined.error_code, NONE);
        assert_eq!(joined.generation_id, 1);
        assert_eq!(joined.leader.as_str(), member);
        assert_eq!(joined.members.len(), 1);
        assert_eq!(joined.protocol_name.as_deref(), Some("range"));
        // Another protocol type cannot join this group.
        assert_eq!(
            join(&mut c, &join_request("g", "", "connect")).error_code,
            INCONSISTENT_GROUP_PROTOCOL
        );

        // Sync: fenced generations and unknown members, then the assignment.
        assert_eq!(sync(&mut c, "g", &member, 7).error_code, ILLEGAL_GENERATION);
        assert_eq!(sync(&mut c, "g", "ghost", 1).error_code, UNKNOWN_MEMBER_ID);
        let synced = sync(&mut c, "g", &member, 1);
        assert_eq!(synced.error_code, NONE);
        assert_eq!(&synced.assignment[..], b"all of it");
        assert_eq!(heartbeat(&mut c, "g", &member, 1), NONE);
        assert_eq!(heartbeat(&mut c, "g", &member, 0), ILLEGAL_GENERATION);
        assert_eq!(heartbeat(&mut c, "g", "ghost", 1), UNKNOWN_MEMBER_ID);
        assert_eq!(heartbeat(&mut c, "nobody", &member, 1), UNKNOWN_MEMBER_ID);
        assert_eq!(heartbeat(&mut c, "", &member, 1), INVALID_GROUP_ID);
        assert_eq!(describe(&mut c, "g"), ("Stable".to_string(), 1));
        assert_eq!(describe(&mut c, "never-seen"), ("Dead".to_string(), 0));

        // Commits: generation and membership are checked; unknown topics refused.
        assert_eq!(
            commit(&mut c, "g", &member, 0, "orders", 5),
            ILLEGAL_GENERATION
        );
        assert_eq!(
            commit(&mut c, "g", "ghost", 1, "orders", 5),
            UNKNOWN_MEMBER_ID
        );
        assert_eq!(commit(&mut c, "g", "", -1, "orders", 5), UNKNOWN_MEMBER_ID);
        assert_eq!(
            commit(&mut c, "g", &member, 1, "nope", 5),
            UNKNOWN_TOPIC_OR_PARTITION
        );
        assert_eq!(commit(&mut c, "g", &member, 1, "orders", 5), NONE);
        assert_eq!(fetch(&mut c, "g", "orders"), vec![5, -1]);
        // A simple consumer (no membership) commits with generation -1; a
        // generation without a group is refused.
        assert_eq!(commit(&mut c, "simple", "", -1, "orders", 42), NONE);
        assert_eq!(
            commit(&mut c, "other", "m", 3, "orders", 1),
            ILLEGAL_GENERATION
        );
        assert_eq!(fetch(&mut c, "simple", "orders"), vec![42, -1]);
        assert_eq!(fetch(&mut c, "never-seen", "orders"), vec![-1, -1]);

        let listed: ListGroupsResponse = c.call(&ListGroupsRequest::default(), 4).unwrap();
        let mut names: Vec<(String, String)> = listed
            .groups
            .iter()
            .map(|g| (g.group_id.0.to_string(), g.group_state.to_string()))
            .collect();
        names.sort();
        assert_eq!(
            names,
            vec![
                ("g".to_string(), "Stable".to_string()),
                ("simple".to_string(), "Empty".to_string())
            ]
        );

        // Deleting: only empty groups, and never an unknown one.
        assert_eq!(delete(&mut c, "g"), NON_EMPTY_GROUP);
        assert_eq!(delete(&mut c, "never-seen"), GROUP_ID_NOT_FOUND);
        let left: LeaveGroupResponse = c
            .call(
                &LeaveGroupRequest::default()
                    .with_group_id(GroupId(s("g")))
                    .with_member_id(s(&member)),
                1,
            )
            .unwrap();
        assert_eq!(left.error_code, NONE);
        assert_eq!(heartbeat(&mut c, "g", &member, 1), UNKNOWN_MEMBER_ID);
        assert_eq!(describe(&mut c, "g"), ("Empty".to_string(), 0));
        assert_eq!(delete(&mut c, "g"), NONE);
        assert_eq!(fetch(&mut c, "g", "orders"), vec![-1, -1]);

        // The internal topic: hidden from a full listing, internal by name,
        // closed to producers.
        let all: MetadataResponse = c
            .call(&MetadataRequest::default().with_topics(None), 12)
            .unwrap();
        assert!(all
            .topics
            .iter()
            .all(|t| t.name.as_ref().map(|n| n.0.as_str()) != Some("__consumer_offsets")));
        let by_name = c
            .metadata(Some(vec!["__consumer_offsets".to_string()]))
            .unwrap();
        assert!(by_name.topics[0].is_internal);
        assert_eq!(by_name.topics[0].partitions.len(), 4);
        let (code, _) = produce(&mut c, "__consumer_offsets", 0, batch(&["x"], None));
        assert_eq!(code, INVALID_TOPIC_EXCEPTION);

        // A stray JoinGroup with a crafted protocol count closes the connection.
        let mut raw = raw_connection(node.port);
        let mut body = Vec::new();
        body.extend_from_slice(&11i16.to_be_bytes()); // JoinGroup
        body.extend_from_slice(&1i16.to_be_bytes()); // v1
        body.extend_from_slice(&7i32.to_be_bytes()); // correlation id
        body.extend_from_slice(&(-1i16).to_be_bytes()); // client id: null
        body.extend_from_slice(&[0, 1, b'g']); // group
        body.extend_from_slice(&10_000i32.to_be_bytes());
        body.extend_from_slice(&10_000i32.to_be_bytes());
        body.extend_from_slice(&[0, 0]); // member id ""
        body.extend_from_slice(&[0, 1, b'c']); // protocol type
        body.extend_from_slice(&0x7fff_ffffi32.to_be_bytes()); // protocols
        raw.write_all(&(body.len() as i32).to_be_bytes()).unwrap();
        raw.write_all(&body).unwrap();
        assert!(closed_by_node(raw));

        // Committed offsets survive a SIGKILL; the deleted group stays deleted.
        drop(c);
        let node = node.restart(true);
        let mut c = node.client();
        assert_eq!(fetch(&mut c, "simple", "orders"), vec![42, -1]);
        assert_eq!(fetch(&mut c, "g", "orders"), vec![-1, -1]);
        assert_eq!(describe(&mut c, "g"), ("Dead".to_string(), 0));
        assert_eq!(describe(&mut c, "simple"), ("Empty".to_string(), 0));
        node.terminate();
    }

    #[test]
    fn a_member_that_stops_heartbeating_is_removed_and_the_rest_rebalance() {
        let tmp = tempfile::tempdir().unwrap();
        let node = NodeProcess::start(
            tmp.path(),
            free_port(),
            &[
                "group.min.session.timeout.ms=500",
                "group.initial.rebalance.delay.ms=0",
            ],
        );
        let mut a = node.client();
        let mut b = node.client();
        let short =
            |member: &str| join_request("h", member, "consumer").with_session_timeout_ms(1000);
        let a_id = join(&mut a, &short("")).member_id.to_string();
        let joined = join(&mut a, &short(&a_id));
        assert_eq!((joined.error_code, joined.generation_id), (NONE, 1));
        assert_eq!(sync(&mut a, "h", &a_id, 1).error_code, NONE);
        // b joins: a learns of the rebalance, rejoins; b goes silent after.
        let b_id = join(&mut b, &short("")).member_id.to_string();
        b.send(&short(&b_id), 5).unwrap();
        let started = Instant::now();
        loop {
            let code = heartbeat(&mut a, "h", &a_id, 1);
            if code == REBALANCE_IN_PROGRESS {
                break;
            }
            assert_eq!(code, NONE);
            assert!(started.elapsed() < Duration::from_secs(5));
            std::thread::sleep(Duration::from_millis(50));
        }
        let rejoined = join(&mut a, &short(&a_id));
        assert_eq!((rejoined.error_code, rejoined.generation_id), (NONE, 2));
        assert_eq!(rejoined.members.len(), 2);
        assert_eq!(sync(&mut a, "h", &a_id, 2).error_code, NONE);
        // b never syncs nor heartbeats: after its session timeout it is gone,
        // and a's heartbeat sees a new rebalance; a alone makes generation 3.
        let silent = Instant::now();
        loop {
            let code = heartbeat(&mut a, "h", &a_id, 2);
            if code == REBALANCE_IN_PROGRESS {
                break;
            }
            assert_eq!(code, NONE);
            assert!(
                silent.elapsed() < Duration::from_secs(10),
                "b was never removed"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        assert!(
            silent.elapsed() >= Duration::from_millis(800),
            "{:?}",
            silent.elapsed()
        );
        let alone = join(&mut a, &short(&a_id));
        assert_eq!((alone.error_code, alone.generation_id), (NONE, 3));
        assert_eq!(alone.members.len(), 1);
        assert_eq!(heartbeat(&mut a, "h", &b_id, 2), UNKNOWN_MEMBER_ID);
        node.terminate();
    }

    #[test]
    fn stopping_answers_waiting_members_not_coordinator() {
        const NOT_COORDINATOR: i16 = 16;
        let tmp = tempfile::tempdir().unwrap();
        let node = NodeProcess::start(
            tmp.path(),
            free_port(),
            &["group.initial.rebalance.delay.ms=0"],
        );
        let mut a = node.client();
        let mut b = node.client();
        let a_id = join(&mut a, &join_request("w", "", "consumer"))
            .member_id
            .to_string();
        assert_eq!(
            join(&mut a, &join_request("w", &a_id, "consumer")).generation_id,
            1
        );
        assert_eq!(sync(&mut a, "w", &a_id, 1).error_code, NONE);
        // b waits in JoinGroup for a to rejoin (up to the 10 s rebalance timeout).
        let b_id = join(&mut b, &join_request("w", "", "consumer"))
            .member_id
            .to_string();
        let correlation_id = b.send(&join_request("w", &b_id, "consumer"), 5).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        let started = Instant::now();
        node.terminate();
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        let answer: JoinGroupResponse = b
            .receive::<JoinGroupRequest, JoinGroupResponse>(correlation_id, 5)
            .unwrap();
        assert_eq!(answer.error_code, NOT_COORDINATOR);
    }

    #[test]
    fn offsets_expire_and_idle_groups_are_forgotten() {
        let tmp = tempfile::tempdir().unwrap();
        // Retention 0 (Kafka's minimum is 1 minute): whatever may expire does,
        // at the next check.
        let settings = [
            "offsets.retention.minutes=0",
            "offsets.retention.check.interval.ms=200",
            "group.initial.rebalance.delay.ms=0",
        ];
        let node = NodeProcess::start(tmp.path(), free_port(), &settings);
        let mut c = node.client();
        create_topic(&mut c, "orders", 2);
        // A group with a member keeps its offsets; an offsets-only group does not.
        let a_id = join(&mut c, &join_request("live", "", "consumer"))
            .member_id
            .to_string();
        assert_eq!(
            join(&mut c, &join_request("live", &a_id, "consumer")).generation_id,
            1
        );
        assert_eq!(sync(&mut c, "live", &a_id, 1).error_code, NONE);
        assert_eq!(commit(&mut c, "live", &a_id, 1, "orders", 7), NONE);
        assert_eq!(commit(&mut c, "simple", "", -1, "orders", 9), NONE);
        let started = Instant::now();
        while fetch(&mut c, "simple", "orders") != vec![-1, -1] {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "offsets never expired"
            );
            assert_eq!(heartbeat(&mut c, "live", &a_id, 1), NONE);
            std::thread::sleep(Duration::from_millis(100));
        }
        std::thread::sleep(Duration::from_millis(500));
        assert_eq!(fetch(&mut c, "live", "orders"), vec![7, -1]);
        let listed: ListGroupsResponse = c.call(&ListGroupsRequest::default(), 4).unwrap();
        let names: Vec<String> = listed
            .groups
            .iter()
            .map(|g| g.group_id.0.to_string())
            .collect();
        assert_eq!(names, vec!["live".to_string()]);
        // The expiry is in the log: a restart does not bring the offsets back.
        drop(c);
        let node = node.restart(true);
        let mut c = node.client();
        assert_eq!(fetch(&mut c, "simple", "orders"), vec![-1, -1]);
        assert_eq!(describe(&mut c, "simple"), ("Dead".to_string(), 0));
        node.terminate();
    }
}

/// One HTTP exchange with the metrics listener: (status code, body).
fn http(port: u16, request: &[u8]) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(request).unwrap();
    let mut response = Vec::new();
    s.read_to_end(&mut response).unwrap();
    let text = String::from_utf8(response).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").expect("a response head");
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("a status code");
    assert!(head.contains("Connection: close"), "{head}");
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .and_then(|v| v.parse().ok())
        .expect("a Content-Length");
    assert_eq!(length, body.len(), "Content-Length matches the body");
    (status, body.to_string())
}

fn get(port: u16, path: &str) -> (u16, String) {
    http(
        port,
        format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").as_bytes(),
    )
}

/// Every sample of a scrape, by `name{labels}` as the node writes it.
fn scrape(port: u16) -> BTreeMap<String, f64> {
    let (status, body) = get(port, "/metrics");
    assert_eq!(status, 200, "{body}");
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| {
            let (key, value) = l.rsplit_once(' ').expect("name and value");
            let value = if value == "+Inf" {
                f64::INFINITY
            } else {
                value.parse().expect("a number")
            };
            (key.to_string(), value)
        })
        .collect()
}

fn metric(samples: &BTreeMap<String, f64>, key: &str) -> f64 {
    samples.get(key).copied().unwrap_or(0.0)
}

fn fetch_bytes(client: &mut AdminClient, topic: &str, partition: i32) -> usize {
    let request = fetch_request(topic, partition, 0);
    let response: FetchResponse = client.call(&request, 11).unwrap();
    let p = &response.responses[0].partitions[0];
    assert_eq!(p.error_code, 0);
    p.records.as_ref().map_or(0, |r| r.len())
}

/// One incremental fetch request: `session_id` at `epoch`, naming `named`
/// (partition, fetch offset) and forgetting `forgotten`.
fn session_fetch(
    topic: &str,
    session_id: i32,
    epoch: i32,
    named: &[(i32, i64)],
    forgotten: &[i32],
    max_wait_ms: i32,
) -> FetchRequest {
    use kafka_protocol::messages::fetch_request::ForgottenTopic;
    let name = TopicName(StrBytes::from_string(topic.to_string()));
    let topics = if named.is_empty() {
        Vec::new()
    } else {
        vec![FetchTopic::default()
            .with_topic(name.clone())
            .with_partitions(
                named
                    .iter()
                    .map(|(p, offset)| {
                        FetchPartition::default()
                            .with_partition(*p)
                            .with_fetch_offset(*offset)
                            .with_partition_max_bytes(1 << 20)
                    })
                    .collect(),
            )]
    };
    let forgotten = if forgotten.is_empty() {
        Vec::new()
    } else {
        vec![ForgottenTopic::default()
            .with_topic(name)
            .with_partitions(forgotten.to_vec())]
    };
    FetchRequest::default()
        .with_replica_id(kafka_protocol::messages::BrokerId(-1))
        .with_max_wait_ms(max_wait_ms)
        .with_min_bytes(1)
        .with_max_bytes(1 << 20)
        .with_session_id(session_id)
        .with_session_epoch(epoch)
        .with_topics(topics)
        .with_forgotten_topics_data(forgotten)
}

/// The partitions a fetch response names, with their record bytes.
fn named_partitions(response: &FetchResponse) -> Vec<(i32, usize)> {
    let mut named: Vec<(i32, usize)> = response
        .responses
        .iter()
        .flat_map(|t| &t.partitions)
        .map(|p| (p.partition_index, p.records.as_ref().map_or(0, Bytes::len)))
        .collect();
    named.sort_unstable();
    named
}

/// KIP-227 on the wire: a full fetch makes a session; incremental fetches on it
/// name only partitions with something new, wake on any of the session's
/// partitions on either core, forget what they are told to, and refuse a
/// wrong epoch or an unknown session without losing it.
#[test]
fn fetch_sessions_answer_only_what_changed() {
    const FETCH_SESSION_ID_NOT_FOUND: i16 = 70;
    const INVALID_FETCH_SESSION_EPOCH: i16 = 71;
    let tmp = tempfile::tempdir().unwrap();
    let node = NodeProcess::start(
        tmp.path(),
        free_port(),
        &["auto.create.topics.enable=false", "cores=2"],
    );
    let mut c = node.client();
    let topic = "sessions";
    create_topic(&mut c, topic, 4);
    assert_eq!(produce(&mut c, topic, 1, batch(&["a"], None)), (0, 0));

    let all: Vec<(i32, i64)> = (0..4).map(|p| (p, 0)).collect();
    let full: FetchResponse = c
        .call(&session_fetch(topic, 0, 0, &all, &[], 0), 12)
        .unwrap();
    assert_eq!(full.error_code, 0);
    let id = full.session_id;
    assert_ne!(id, 0, "a full fetch at epoch 0 makes a session");
    let named = named_partitions(&full);
    assert_eq!(
        named.iter().map(|(p, _)| *p).collect::<Vec<_>>(),
        vec![0, 1, 2, 3]
    );
    assert!(named[1].1 > 0 && named[0].1 == 0);

    // Nothing new (partition 1 moves on past its record): nothing named.
    let quiet: FetchResponse = c
        .call(&session_fetch(topic, id, 1, &[(1, 1)], &[], 200), 12)
        .unwrap();
    assert_eq!((quiet.error_code, quiet.session_id), (0, id));
    assert_eq!(named_partitions(&quiet), vec![]);

    // A record on partition 3 wakes a long poll over the session and is the
    // only partition named.
    let port = node.port;
    let producer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        let mut c = AdminClient::connect(&format!("127.0.0.1:{port}")).unwrap();
        produce(&mut c, "sessions", 3, batch(&["b"], None))
    });
    let started = Instant::now();
    let woken: FetchResponse = c
        .call(&session_fetch(topic, id, 2, &[], &[], 20_000), 12)
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "woken by the record, not the timeout"
    );
    assert_eq!(producer.join().unwrap(), (0, 0));
    let named = named_partitions(&woken);
    assert_eq!(named.len(), 1, "{named:?}");
    assert_eq!(named[0].0, 3);
    assert!(named[0].1 > 0);

    // The same epoch again: refused, and the session lives on.
    let stale: FetchResponse = c
        .call(&session_fetch(topic, id, 2, &[], &[], 0), 12)
        .unwrap();
    assert_eq!(stale.error_code, INVALID_FETCH_SESSION_EPOCH);
    assert!(stale.responses.is_empty());
    let unknown: FetchResponse = c
        .call(&session_fetch(topic, id ^ 0x5a5a, 1, &[], &[], 0), 12)
        .unwrap();
    assert_eq!(unknown.error_code, FETCH_SESSION_ID_NOT_FOUND);

    // Forget partition 3 and move it on; a record there is not named, one on
    // partition 0 is.
    assert_eq!(produce(&mut c, topic, 3, batch(&["c"], None)), (0, 1));
    assert_eq!(produce(&mut c, topic, 0, batch(&["d"], None)), (0, 0));
    let after: FetchResponse = c
        .call(&session_fetch(topic, id, 3, &[], &[3], 1000), 12)
        .unwrap();
    assert_eq!(after.error_code, 0);
    let named = named_partitions(&after);
    assert_eq!(named.iter().map(|(p, _)| *p).collect::<Vec<_>>(), vec![0]);

    // Closing the session (epoch -1) answers in full and holds nothing more.
    let closing: FetchResponse = c
        .call(&session_fetch(topic, id, -1, &all, &[], 0), 12)
        .unwrap();
    assert_eq!((closing.error_code, closing.session_id), (0, 0));
    assert_eq!(named_partitions(&closing).len(), 4);
    let gone: FetchResponse = c
        .call(&session_fetch(topic, id, 4, &[], &[], 0), 12)
        .unwrap();
    assert_eq!(gone.error_code, FETCH_SESSION_ID_NOT_FOUND);
    let samples = scrape(node.metrics_port);
    assert_eq!(metric(&samples, "skiff_fetch_sessions"), 0.0);
    assert!(metric(&samples, "skiff_fetch_sessions_created_total") >= 1.0);
}

#[test]
fn metrics_count_produce_and_fetch_exactly_and_health_answers() {
    let tmp = tempfile::tempdir().unwrap();
    let node = NodeProcess::start(tmp.path(), free_port(), &[]);
    let port = node.metrics_port;
    let mut c = node.client();
    create_topic(&mut c, "metered", 4);
    let before = scrape(port);

    // 4 batches of known size, one per partition (both cores own some), and
    // one produce to a partition that does not exist.
    let mut batch_bytes = 0usize;
    let mut sizes = Vec::new();
    for p in 0..4 {
        let values: Vec<String> = (0..5)
            .map(|i| format!("value-{p}-{i}-{}", "x".repeat(p as usize * 100)))
            .collect();
        let refs: Vec<&str> = values.iter().map(String::as_str).collect();
        let b = batch(&refs, None);
        batch_bytes += b.len();
        sizes.push(b.len());
        assert_eq!(produce(&mut c, "metered", p, b), (0, 0));
    }
    let (error, _) = produce(&mut c, "metered", 99, batch(&["lost"], None));
    assert_eq!(error, 3, "UNKNOWN_TOPIC_OR_PARTITION");

    let after = scrape(port);
    let delta = |key: &str| metric(&after, key) - metric(&before, key);
    assert_eq!(
        delta("skiff_topic_bytes_in_total{topic=\"metered\"}"),
        batch_bytes as f64
    );
    assert_eq!(
        delta("skiff_topic_records_in_total{topic=\"metered\"}"),
        20.0
    );
    assert_eq!(delta("skiff_requests_total{api=\"Produce\"}"), 5.0);
    assert_eq!(
        delta("skiff_request_errors_total{api=\"Produce\",error=\"UNKNOWN_TOPIC_OR_PARTITION\"}"),
        1.0
    );
    assert_eq!(
        delta("skiff_produce_latency_seconds_count{acks=\"all\"}"),
        5.0
    );
    assert_eq!(
        delta("skiff_produce_latency_seconds_bucket{acks=\"all\",le=\"+Inf\"}"),
        5.0
    );
    assert!(delta("skiff_produce_latency_seconds_sum{acks=\"all\"}") > 0.0);
    assert_eq!(
        delta("skiff_produce_latency_seconds_count{acks=\"1\"}"),
        0.0
    );
    // Every acks=all produce waited for an fdatasync (group commits may share).
    assert!(delta("skiff_log_fsync_duration_seconds_count") >= 1.0);
    for (p, size) in sizes.iter().enumerate() {
        let labels = format!("{{topic=\"metered\",partition=\"{p}\"}}");
        assert_eq!(
            metric(&after, &format!("skiff_log_end_offset{labels}")),
            5.0
        );
        assert_eq!(
            metric(&after, &format!("skiff_log_size_bytes{labels}")),
            *size as f64
        );
        assert_eq!(metric(&after, &format!("skiff_log_segments{labels}")), 1.0);
    }
    assert_eq!(metric(&after, "skiff_partitions_offline"), 0.0);
    assert_eq!(metric(&after, "skiff_cores"), 2.0);

    // Fetch everything back: out moves by exactly what was returned.
    let mut fetched = 0;
    for p in 0..4 {
        fetched += fetch_bytes(&mut c, "metered", p);
    }
    assert_eq!(fetched, batch_bytes);
    let fetched_scrape = scrape(port);
    let delta = |key: &str| metric(&fetched_scrape, key) - metric(&after, key);
    assert_eq!(
        delta("skiff_topic_bytes_out_total{topic=\"metered\"}"),
        batch_bytes as f64
    );
    assert_eq!(
        delta("skiff_topic_records_out_total{topic=\"metered\"}"),
        20.0
    );
    assert_eq!(delta("skiff_requests_total{api=\"Fetch\"}"), 4.0);
    assert_eq!(delta("skiff_fetch_latency_seconds_count"), 4.0);
    // Tail reads come from the batch cache.
    assert!(delta("skiff_batch_cache_hits_total") >= 4.0);
    // Scraping is not a Kafka request and moves no Kafka counter.
    assert_eq!(delta("skiff_topic_bytes_in_total{topic=\"metered\"}"), 0.0);

    // Health, and what the listener refuses.
    assert_eq!(get(port, "/health"), (200, "ok\n".to_string()));
    assert_eq!(get(port, "/nope").0, 404);
    let (status, _) = http(
        port,
        b"POST /metrics HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello",
    );
    assert_eq!(status, 405);
    assert_eq!(http(port, b"garbage\r\n\r\n").0, 400);
    assert_eq!(
        http(port, b"GET /metrics HTTP/1.1\r\nno colon\r\n\r\n").0,
        400
    );
    let mut oversized = b"GET /metrics HTTP/1.1\r\nX-Pad: ".to_vec();
    oversized.extend(std::iter::repeat_n(b'a', 16 << 10));
    assert_eq!(http(port, &oversized).0, 400);
    // A client that connects and says nothing does not block the others.
    let silent = TcpStream::connect(("127.0.0.1", port)).unwrap();
    assert_eq!(get(port, "/health").0, 200);
    drop(silent);
    // The node kept serving Kafka and HTTP through all of it.
    assert_eq!(
        produce(&mut c, "metered", 0, batch(&["again"], None)),
        (0, 5)
    );
    let last = scrape(port);
    assert_eq!(
        metric(&last, "skiff_topic_records_in_total{topic=\"metered\"}")
            - metric(&before, "skiff_topic_records_in_total{topic=\"metered\"}"),
        21.0
    );

    // Filters of `skiff topic describe`: one node, every partition led and in
    // sync, so both lists are empty; without a filter every partition shows.
    let describe = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_skiff"))
            .args([
                "topic",
                "describe",
                "metered",
                "--bootstrap",
                &node.bootstrap(),
            ])
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    assert_eq!(describe(&[]).matches("Partition: ").count(), 4);
    assert_eq!(describe(&["--under-replicated"]), "");
    assert_eq!(describe(&["--unavailable"]), "");
    assert_eq!(
        describe(&["--unavailable-partitions", "--under-replicated-partitions"]),
        ""
    );

    // A second node on the same metrics address does not start (no silent
    // port sharing).
    let tmp2 = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_skiff"))
        .args(["node", "--cores", "1", "--listen"])
        .arg(format!("127.0.0.1:{}", free_port()))
        .args([
            "--metrics-listen",
            &format!("127.0.0.1:{port}"),
            "--controller-listen",
            "127.0.0.1:0",
            "--data-dir",
        ])
        .arg(tmp2.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("binding the metrics listener"),
        "{out:?}"
    );
    assert_eq!(get(port, "/health").0, 200);
    node.terminate();
}

#[test]
fn metrics_listener_can_be_turned_off() {
    let tmp = tempfile::tempdir().unwrap();
    let node = NodeProcess::start(tmp.path(), free_port(), &["metrics.listen=none"]);
    // The flag given by the harness is overridden by --set (applied last).
    assert!(TcpStream::connect(("127.0.0.1", node.metrics_port)).is_err());
    let mut c = node.client();
    create_topic(&mut c, "quiet", 1);
    assert_eq!(produce(&mut c, "quiet", 0, batch(&["v"], None)), (0, 0));
    node.terminate();
}

#[test]
fn metrics_show_the_cluster_and_the_controller_of_a_single_node() {
    let tmp = tempfile::tempdir().unwrap();
    let node = NodeProcess::start(tmp.path(), free_port(), &["offsets.topic.num.partitions=3"]);
    let port = node.metrics_port;
    let mut c = node.client();
    create_topic(&mut c, "led", 5);
    // One replica can never satisfy min.insync.replicas=2.
    create_topic_with(&mut c, "strict", 2, &[("min.insync.replicas", "2")]);
    // The first group lookup creates __consumer_offsets (3 partitions).
    let find: kafka_protocol::messages::FindCoordinatorResponse = c
        .call(
            &kafka_protocol::messages::FindCoordinatorRequest::default()
                .with_key(StrBytes::from_static_str("g")),
            1,
        )
        .unwrap();
    assert_eq!(find.error_code, 0);

    // The controller's status is refreshed every tick (100 ms): poll.
    let deadline = Instant::now() + Duration::from_secs(10);
    let samples = loop {
        let samples = scrape(port);
        if samples.contains_key("skiff_controller_node_metadata_lag{node=\"1\"}")
            || Instant::now() >= deadline
        {
            break samples;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let get = |key: &str| {
        *samples
            .get(key)
            .unwrap_or_else(|| panic!("{key} missing from the scrape"))
    };
    assert_eq!(get("skiff_controller_active"), 1.0);
    assert!(get("skiff_controller_raft_term") >= 1.0);
    assert!(get("skiff_controller_commit_index") >= 1.0);
    assert!(get("skiff_controller_applied_offset") >= 1.0);
    assert_eq!(get("skiff_controller_fenced_nodes"), 0.0);
    assert!(get("skiff_controller_node_metadata_lag{node=\"1\"}") >= 0.0);
    assert_eq!(get("skiff_broker_fenced"), 0.0);
    assert!(get("skiff_broker_metadata_offset") >= 1.0);
    assert_eq!(get("skiff_cluster_brokers"), 1.0);
    assert_eq!(get("skiff_cluster_brokers_fenced"), 0.0);
    // Every partition is led here: both topics and __consumer_offsets.
    assert_eq!(get("skiff_partitions_led"), 5.0 + 2.0 + 3.0);
    assert_eq!(get("skiff_partitions"), 10.0);
    assert_eq!(get("skiff_cluster_partitions_offline"), 0.0);
    assert_eq!(get("skiff_partitions_offline"), 0.0);
    assert_eq!(get("skiff_partitions_under_replicated"), 0.0);
    assert_eq!(get("skiff_partitions_under_min_isr"), 2.0);

    // Deleting a topic takes its partitions out of the counts.
    let request = kafka_protocol::messages::DeleteTopicsRequest::default()
        .with_topic_names(vec![TopicName(StrBytes::from_static_str("strict"))]);
    let response = c.delete_topics(&request).unwrap();
    assert_eq!(response.responses[0].error_code, 0);
    let samples = scrape(port);
    assert_eq!(metric(&samples, "skiff_partitions_led"), 8.0);
    assert_eq!(metric(&samples, "skiff_partitions_under_min_isr"), 0.0);
    node.terminate();
}

/// KIP-320 on one node: OffsetForLeaderEpoch answers the end offset of each
/// leader epoch (Kafka's rules), ListOffsets names the epoch of what it
/// returns, and a client's `current_leader_epoch` is checked on Fetch,
/// ListOffsets and OffsetForLeaderEpoch (older: FENCED_LEADER_EPOCH, newer:
/// UNKNOWN_LEADER_EPOCH). A restart moves the leadership to a new epoch.
#[test]
fn leader_epochs_offsets_for_leader_epoch_and_fencing() {
    use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
    use kafka_protocol::messages::offset_for_leader_epoch_request::{
        OffsetForLeaderPartition, OffsetForLeaderTopic,
    };
    use kafka_protocol::messages::{
        ListOffsetsRequest, ListOffsetsResponse, OffsetForLeaderEpochRequest,
        OffsetForLeaderEpochResponse,
    };
    const FENCED_LEADER_EPOCH: i16 = 74;
    const UNKNOWN_LEADER_EPOCH: i16 = 75;
    const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;

    fn leader_epoch(c: &mut AdminClient) -> i32 {
        let md = c.metadata(Some(vec!["epochs".to_string()])).unwrap();
        md.topics[0].partitions[0].leader_epoch
    }
    /// (error, epoch, end offset) for `requested`, believing in `current`.
    fn end_offset(
        c: &mut AdminClient,
        topic: &str,
        current: i32,
        requested: i32,
    ) -> (i16, i32, i64) {
        let request = OffsetForLeaderEpochRequest::default().with_topics(vec![
            OffsetForLeaderTopic::default()
                .with_topic(TopicName(StrBytes::from_string(topic.to_string())))
                .with_partitions(vec![OffsetForLeaderPartition::default()
                    .with_partition(0)
                    .with_current_leader_epoch(current)
                    .with_leader_epoch(requested)]),
        ]);
        let response: OffsetForLeaderEpochResponse = c.call(&request, 4).unwrap();
        let p = &response.topics[0].partitions[0];
        (p.error_code, p.leader_epoch, p.end_offset)
    }
    /// (error, offset, leader epoch) of ListOffsets v7 at `timestamp`.
    fn list(c: &mut AdminClient, timestamp: i64, current: i32) -> (i16, i64, i32) {
        let request = ListOffsetsRequest::default().with_topics(vec![ListOffsetsTopic::default()
            .with_name(TopicName(StrBytes::from_static_str("epochs")))
            .with_partitions(vec![ListOffsetsPartition::default()
                .with_partition_index(0)
                .with_current_leader_epoch(current)
                .with_timestamp(timestamp)])]);
        let response: ListOffsetsResponse = c.call(&request, 7).unwrap();
        let p = &response.topics[0].partitions[0];
        (p.error_code, p.offset, p.leader_epoch)
    }
    fn fetch_error(c: &mut AdminClient, current: i32) -> i16 {
        let mut request = fetch_request("epochs", 0, 0);
        request.topics[0].partitions[0].current_leader_epoch = current;
        let response: FetchResponse = c.call(&request, 12).unwrap();
        response.responses[0].partitions[0].error_code
    }

    let tmp = tempfile::tempdir().unwrap();
    let node = NodeProcess::start(tmp.path(), free_port(), &[]);
    let mut c = node.client();
    create_topic(&mut c, "epochs", 1);
    let first = leader_epoch(&mut c);
    assert!(first >= 0);
    assert_eq!(
        produce(&mut c, "epochs", 0, batch(&["a", "b", "c"], None)),
        (0, 0)
    );
    assert_eq!(end_offset(&mut c, "epochs", first, first), (0, first, 3));
    assert_eq!(end_offset(&mut c, "epochs", -1, first + 1), (0, -1, -1));
    assert_eq!(
        end_offset(&mut c, "epochs", first + 1, first).0,
        UNKNOWN_LEADER_EPOCH
    );
    assert_eq!(fetch_error(&mut c, first + 1), UNKNOWN_LEADER_EPOCH);
    assert_eq!(fetch_error(&mut c, first), 0);
    assert_eq!(fetch_error(&mut c, -1), 0);
    assert_eq!(list(&mut c, -2, first + 1).0, UNKNOWN_LEADER_EPOCH);
    assert_eq!(
        end_offset(&mut c, "nowhere", -1, 0).0,
        UNKNOWN_TOPIC_OR_PARTITION
    );
    drop(c);

    // After a restart the node leads at a newer epoch; records written since
    // belong to it.
    let node = node.restart(false);
    let mut c = node.client();
    let second = leader_epoch(&mut c);
    assert!(
        second > first,
        "leader epoch {first} -> {second} across a restart"
    );
    let started = produce(&mut c, "epochs", 0, batch(&["d", "e"], None));
    assert_eq!(started, (0, 3));
    assert_eq!(end_offset(&mut c, "epochs", second, first), (0, first, 3));
    assert_eq!(end_offset(&mut c, "epochs", second, second), (0, second, 5));
    // An epoch between the two that wrote nothing ends where the next began.
    if second > first + 1 {
        assert_eq!(
            end_offset(&mut c, "epochs", second, first + 1),
            (0, first, 3)
        );
    }
    // Older than any epoch of the log: the requested one, ending where the history starts.
    if first > 0 {
        assert_eq!(
            end_offset(&mut c, "epochs", -1, first - 1),
            (0, first - 1, 0)
        );
    }
    assert_eq!(
        end_offset(&mut c, "epochs", first, second).0,
        FENCED_LEADER_EPOCH
    );
    assert_eq!(fetch_error(&mut c, first), FENCED_LEADER_EPOCH);
    assert_eq!(fetch_error(&mut c, second), 0);
    assert_eq!(list(&mut c, -2, first).0, FENCED_LEADER_EPOCH);
    // ListOffsets: earliest in the first epoch, latest at the current one.
    assert_eq!(list(&mut c, -2, second), (0, 0, first));
    assert_eq!(list(&mut c, -1, second), (0, 5, second));
    node.terminate();
}

/// SIGKILL, then a start at once on every one of the same ports and the same
/// data directory, as systemd's `Restart=always` does: the dead process's
/// listening sockets outlive it for some milliseconds (io_uring tears them
/// down after the reaping), which failed the start with "Address already in
/// use". Clients are connected at every kill, so their connections linger too.
#[test]
fn restart_at_once_after_sigkill_on_the_same_ports() {
    let tmp = tempfile::tempdir().unwrap();
    let ports = Ports::free();
    let mut node = NodeProcess::start_on(tmp.path(), ports, &[]);
    let mut c = node.client();
    create_topic(&mut c, "crashes", 2);
    let mut expected = Vec::new();
    for round in 0..5 {
        assert!(
            api_versions_ok(&mut c),
            "round {round}\n{}",
            node.log_tail()
        );
        let value = format!("r{round}");
        let (error, offset) = produce(&mut c, "crashes", 0, batch(&[value.as_str()], None));
        assert_eq!(error, 0, "round {round}\n{}", node.log_tail());
        expected.push((offset, value));
        // Killed with this client and a metrics scrape's connection open.
        let _scrape = TcpStream::connect(("127.0.0.1", ports.metrics)).unwrap();
        node.child.kill().unwrap();
        node.child.wait().unwrap();
        drop(node);
        // No pause: the next start must cope with what the killed one left.
        node = NodeProcess::start_on(tmp.path(), ports, &[]);
        c = node.client();
    }
    assert!(api_versions_ok(&mut c), "{}", node.log_tail());
    assert_eq!(get(ports.metrics, "/health").0, 200, "{}", node.log_tail());
    // Every acknowledged record survived the kills.
    assert_eq!(fetch_values(&mut c, "crashes", 0), expected);
    drop(c);
    node.terminate();
}

/// A second node on a Kafka port another node listens on (its own data
/// directory and controller port) must fail as Kafka does, not share the port
/// (SO_REUSEPORT across processes spread clients over two clusters).
#[test]
fn a_second_node_on_the_same_kafka_port_fails() {
    let first_dir = tempfile::tempdir().unwrap();
    let second_dir = tempfile::tempdir().unwrap();
    let ports = Ports::free();
    let first = NodeProcess::start_on(first_dir.path(), ports, &[]);
    let mut c = first.client();
    create_topic(&mut c, "mine", 1);
    assert_eq!(produce(&mut c, "mine", 0, batch(&["a"], None)), (0, 0));

    let theirs = Ports {
        kafka: ports.kafka,
        ..Ports::free()
    };
    let (status, stderr) =
        start_failing(second_dir.path(), theirs, Duration::from_secs(60), |_| {});
    assert!(!status.success(), "{stderr}");
    let expected = format!("Kafka listener 127.0.0.1:{}", ports.kafka);
    assert!(stderr.contains(&expected), "{stderr}");
    assert!(
        stderr.to_lowercase().contains("address already in use"),
        "{stderr}"
    );
    // It took nothing else either (all its ports are free again).
    for port in [theirs.controller, theirs.metrics] {
        std::net::TcpListener::bind(("127.0.0.1", port))
            .unwrap_or_else(|e| panic!("port {port} still taken: {e}\n{stderr}"));
    }

    // The first node still serves every connection, with its own data.
    for _ in 0..8 {
        let mut other = first.client();
        assert!(api_versions_ok(&mut other));
        assert_eq!(fetch_values(&mut other, "mine", 0), [(0, "a".to_string())]);
    }
    assert_eq!(produce(&mut c, "mine", 0, batch(&["b"], None)), (0, 1));
    drop(c);
    first.terminate();
}

/// A second node on a data directory another node uses must refuse to start,
/// naming the directory and the holder; the lock goes with its holder, even
/// when SIGKILLed.
#[test]
fn a_second_node_on_the_same_data_dir_fails() {
    let tmp = tempfile::tempdir().unwrap();
    let first_ports = Ports::free();
    let first = NodeProcess::start_on(tmp.path(), first_ports, &[]);
    let pid = first.child.id();
    // The check below sees a node's listeners (it would pass vacuously if not).
    assert!(listens(pid, first_ports.kafka));

    let other_ports = Ports::free();
    let (status, stderr) =
        start_failing(tmp.path(), other_ports, Duration::from_secs(60), |child| {
            // It fails before it listens on any of its ports.
            for port in [
                other_ports.kafka,
                other_ports.controller,
                other_ports.metrics,
            ] {
                assert!(!listens(child, port), "the node listened on {port}");
            }
        });
    assert!(!status.success(), "{stderr}");
    let expected = format!(
        "data directory {} is in use by another skiff process (pid {pid})",
        tmp.path().display()
    );
    assert!(stderr.contains(&expected), "{stderr}");
    // The holder's pid is in the lock file.
    let lock_file = tmp.path().join(".lock");
    assert_eq!(
        std::fs::read_to_string(&lock_file).unwrap().trim(),
        pid.to_string()
    );
    let mut c = first.client();
    assert!(api_versions_ok(&mut c));
    drop(c);

    // SIGKILL: the kernel drops the lock with the process; a node starts on
    // the directory at once.
    let mut first = first;
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    drop(first);
    let next = NodeProcess::start_on(tmp.path(), other_ports, &[]);
    assert_eq!(
        std::fs::read_to_string(&lock_file).unwrap().trim(),
        next.child.id().to_string()
    );
    let mut c = next.client();
    assert!(api_versions_ok(&mut c));
    drop(c);
    next.terminate();
}

/// A node whose metrics or controller port an unrelated process holds (past
/// the bind's retry window) fails with an error naming the listener and the
/// address, after retrying, and none of its ports ever answered meanwhile:
/// every listener is bound before any listens.
#[test]
fn a_node_whose_port_is_taken_fails_before_anything_answers() {
    for taken in ["metrics", "controller"] {
        let tmp = tempfile::tempdir().unwrap();
        let ports = Ports::free();
        let held = match taken {
            "metrics" => ports.metrics,
            _ => ports.controller,
        };
        let holder = std::net::TcpListener::bind(("127.0.0.1", held)).unwrap();
        let (status, stderr) =
            start_failing(tmp.path(), ports, Duration::from_secs(120), |child| {
                for port in [ports.kafka, ports.controller, ports.metrics] {
                    if port != held {
                        assert!(
                            !listens(child, port),
                            "the node listened on {port} ({taken} taken)"
                        );
                    }
                }
            });
        assert!(!status.success(), "{stderr}");
        let expected = format!("binding the {taken} listener 127.0.0.1:{held}");
        assert!(stderr.contains(&expected), "{stderr}");
        assert!(stderr.contains("address already in use"), "{stderr}");
        assert!(
            stderr.contains("retrying"),
            "the bind was retried\n{stderr}"
        );
        // Everything it had bound is free again.
        for port in [ports.kafka, ports.controller, ports.metrics] {
            if port != held {
                std::net::TcpListener::bind(("127.0.0.1", port))
                    .unwrap_or_else(|e| panic!("port {port} still taken: {e}\n{stderr}"));
            }
        }
        drop(holder);
    }
}

/// `n` nodes of one cluster on loopback (node ids 1..=n, each a broker and a
/// controller of one quorum), data in `root/node-ID`, `extra` as `--set`s.
struct Cluster {
    nodes: Vec<NodeProcess>,
}

impl Cluster {
    fn start(root: &Path, n: usize, extra: &[&str]) -> Cluster {
        let ports: Vec<Ports> = ports_below_ephemeral(3 * n)
            .chunks(3)
            .map(|p| Ports {
                kafka: p[0],
                controller: p[1],
                metrics: p[2],
            })
            .collect();
        let quorum = ports
            .iter()
            .enumerate()
            .map(|(i, p)| format!("{}@127.0.0.1:{}", i + 1, p.controller))
            .collect::<Vec<_>>()
            .join(",");
        // All started before any is waited for: none serves without a quorum.
        let spawned: Vec<_> = ports
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let dir = root.join(format!("node-{}", i + 1));
                let mut command = Command::new(env!("CARGO_BIN_EXE_skiff"));
                command
                    .args(node_args(&dir, *p, extra))
                    .args(["--node-id", &(i + 1).to_string()])
                    .args(["--controller-quorum", &quorum]);
                NodeProcess::spawn(command, &dir, *p)
            })
            .collect();
        Cluster {
            nodes: spawned
                .into_iter()
                .map(|(node, listening)| node.wait_listening(listening))
                .collect(),
        }
    }

    fn node(&self, id: i32) -> &NodeProcess {
        &self.nodes[usize::try_from(id - 1).unwrap()]
    }

    /// (leader, ISR) of `topic`-0 as node `asked` says.
    fn partition_state(&self, asked: i32, topic: &str) -> (i32, Vec<i32>) {
        let Ok(mut c) = AdminClient::connect(&self.node(asked).bootstrap()) else {
            return (-1, Vec::new());
        };
        let Ok(m) = c.metadata(Some(vec![topic.to_string()])) else {
            return (-1, Vec::new());
        };
        let Some(p) = m.topics.first().and_then(|t| t.partitions.first()) else {
            return (-1, Vec::new());
        };
        let mut isr: Vec<i32> = p.isr_nodes.iter().map(|b| b.0).collect();
        isr.sort_unstable();
        (p.leader_id.0, isr)
    }

    /// Waits (at most `limit`) until node `asked` says `done`; the state then.
    fn wait_for(
        &self,
        asked: i32,
        topic: &str,
        limit: Duration,
        what: &str,
        done: impl Fn(i32, &[i32]) -> bool,
    ) -> (i32, Vec<i32>) {
        let started = Instant::now();
        loop {
            let (leader, isr) = self.partition_state(asked, topic);
            if done(leader, &isr) {
                return (leader, isr);
            }
            assert!(
                started.elapsed() < limit,
                "{what}: not within {limit:?} (leader {leader}, ISR {isr:?})\n{}",
                self.nodes
                    .iter()
                    .map(NodeProcess::log_tail)
                    .collect::<Vec<_>>()
                    .join("\n\n")
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Every batch of a stopped replica's partition directory, from its
/// segment files in offset order.
fn replica_batches(dir: &Path) -> Vec<Bytes> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    files.sort();
    let mut out = Vec::new();
    for file in files {
        let data = Bytes::from(std::fs::read(&file).unwrap());
        for (p, h) in skiff_engine::batch::BatchScanner::new(&data) {
            out.push(data.slice(p..p + h.total_len()));
        }
    }
    out
}

/// Issue 14 (a flipped byte in a closed segment of one replica): three
/// nodes, RF=3, 4 KiB segments, no batch cache (every read from disk). A
/// byte of the leader's first segment is flipped; a consumer fetching from
/// offset 0 gets only valid batches and then KAFKA_STORAGE_ERROR, never the
/// corrupt one; the leadership moves; the corrupt replica repairs itself
/// (cut before the bad batch, refetched from the new leader) and is back in
/// the ISR, and at the end the three logs are identical.
#[test]
fn a_corrupt_closed_segment_is_never_served_and_the_replica_repairs_from_the_others() {
    const KAFKA_STORAGE_ERROR: i16 = 56;
    const NOT_LEADER_OR_FOLLOWER: i16 = 6;
    let tmp = tempfile::tempdir().unwrap();
    let cluster = Cluster::start(
        tmp.path(),
        3,
        &[
            "skiff.batch.cache.bytes=0",
            "broker.heartbeat.interval.ms=200",
            "auto.create.topics.enable=false",
        ],
    );
    let topic = "scrubbed";
    {
        use kafka_protocol::messages::create_topics_request::{
            CreatableTopic, CreatableTopicConfig,
        };
        let config = |k: &str, v: &str| {
            CreatableTopicConfig::default()
                .with_name(StrBytes::from_string(k.to_string()))
                .with_value(Some(StrBytes::from_string(v.to_string())))
        };
        let request = kafka_protocol::messages::CreateTopicsRequest::default().with_topics(vec![
            CreatableTopic::default()
                .with_name(TopicName(StrBytes::from_string(topic.to_string())))
                .with_num_partitions(1)
                .with_replication_factor(3)
                .with_configs(vec![
                    config("segment.bytes", "4096"),
                    config("min.insync.replicas", "2"),
                ]),
        ]);
        let response = cluster.nodes[0].client().create_topics(&request).unwrap();
        assert_eq!(response.topics[0].error_code, 0);
    }
    let whole = |_: i32, isr: &[i32]| isr == [1, 2, 3];
    let (leader, _) = cluster.wait_for(1, topic, Duration::from_secs(30), "full ISR", |l, isr| {
        l > 0 && whole(l, isr)
    });

    // 60 batches of 3 records, acks=all: several 4 KiB segments.
    let value = |i: usize, j: usize| format!("value-{i}-{j}-{}", "x".repeat(200));
    let mut expected = Vec::new();
    let mut c = cluster.node(leader).client();
    for i in 0..60 {
        let values: Vec<String> = (0..3).map(|j| value(i, j)).collect();
        let refs: Vec<&str> = values.iter().map(String::as_str).collect();
        // The leader's own table may lag the metadata that named it by a
        // moment (UNKNOWN_TOPIC_OR_PARTITION, NOT_LEADER_OR_FOLLOWER,
        // NOT_ENOUGH_REPLICAS: nothing written).
        let started = Instant::now();
        loop {
            match produce(&mut c, topic, 0, batch(&refs, None)) {
                (3 | 6 | 19, _) if started.elapsed() < Duration::from_secs(10) => {
                    std::thread::sleep(Duration::from_millis(100));
                }
                answer => {
                    assert_eq!(answer, (0, 3 * i as i64));
                    break;
                }
            }
        }
        for (j, v) in values.into_iter().enumerate() {
            expected.push(((3 * i + j) as i64, v));
        }
    }
    cluster.wait_for(leader, topic, Duration::from_secs(30), "full ISR", whole);
    // The followers replicated all of it over KIP-227 sessions with the leader.
    let samples = scrape(cluster.node(leader).metrics_port);
    assert!(
        metric(&samples, "skiff_fetch_sessions") >= 2.0,
        "{samples:?}"
    );
    assert!(metric(&samples, "skiff_fetch_session_partitions") >= 2.0);

    // Flip a record byte of the second batch in the leader's first segment
    // (closed: the log rolled past it).
    let dir = |id: i32| {
        tmp.path()
            .join(format!("node-{id}"))
            .join(format!("{topic}-0"))
    };
    let first = dir(leader).join(format!("{:020}.log", 0));
    let mut bytes = std::fs::read(&first).unwrap();
    let (position, header) = skiff_engine::batch::BatchScanner::new(&bytes)
        .nth(1)
        .unwrap();
    assert_eq!(header.base_offset, 3);
    let segments = std::fs::read_dir(dir(leader))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "log")
        })
        .count();
    assert!(
        segments > 2,
        "the first segment is closed ({segments} segments)"
    );
    bytes[position + 61 + 20] ^= 0x10;
    std::fs::write(&first, &bytes).unwrap();

    // A consumer from offset 0: valid batches only, then the storage error
    // (or, once the leadership moved, NOT_LEADER); never the flipped batch.
    let mut offset = 0;
    let mut served = 0;
    let code = loop {
        let response: FetchResponse = c.call(&fetch_request(topic, 0, offset), 11).unwrap();
        let p = &response.responses[0].partitions[0];
        if p.error_code != 0 {
            break p.error_code;
        }
        let mut rest = p.records.clone().unwrap_or_default();
        assert!(!rest.is_empty(), "the read stopped silently at {offset}");
        while !rest.is_empty() {
            let h = BatchHeader::parse(&rest).unwrap();
            let one = rest.split_to(h.total_len());
            skiff_engine::batch::crc_matches(&one).expect("a served batch has a valid CRC");
            for r in skiff_engine::batch::decode_records(&one, 1 << 20).unwrap() {
                let got = String::from_utf8(r.value.unwrap().to_vec()).unwrap();
                assert_eq!((r.offset, got), expected[r.offset as usize].clone());
            }
            offset = h.next_offset();
            served += 1;
        }
        assert!(
            offset <= 3,
            "served past the flipped batch: offset {offset}"
        );
    };
    assert!(
        code == KAFKA_STORAGE_ERROR || code == NOT_LEADER_OR_FOLLOWER,
        "error {code}"
    );
    assert!(served <= 1);
    drop(c);

    // The leadership moves to a healthy replica; the corrupt one repairs
    // itself and is back in the ISR.
    let other = if leader == 1 { 2 } else { 1 };
    let (new_leader, _) = cluster.wait_for(
        other,
        topic,
        Duration::from_secs(30),
        "leadership moved",
        |l, _| l > 0 && l != leader,
    );
    cluster.wait_for(
        new_leader,
        topic,
        Duration::from_secs(60),
        "the repaired replica back in the ISR",
        whole,
    );
    let said = cluster.node(leader).log_tail();
    assert!(
        said.contains("corrupt batch read from disk") && said.contains("repaired the corrupt log"),
        "{said}"
    );
    let mut c = cluster.node(new_leader).client();
    assert_eq!(fetch_values(&mut c, topic, 0), expected);
    // And it takes acks=all writes with the repaired replica in the ISR.
    assert_eq!(produce(&mut c, topic, 0, batch(&["after"], None)), (0, 180));
    cluster.wait_for(
        new_leader,
        topic,
        Duration::from_secs(30),
        "full ISR",
        whole,
    );
    drop(c);

    // Every replica's log, read from its files after a clean stop: the same
    // batches, byte for byte, every one valid.
    for node in cluster.nodes {
        node.terminate();
    }
    let logs: Vec<Vec<Bytes>> = (1..=3).map(|id| replica_batches(&dir(id))).collect();
    assert_eq!(logs[0].len(), 61);
    for b in &logs[0] {
        skiff_engine::batch::crc_matches(b).unwrap();
    }
    assert_eq!(logs[0], logs[1]);
    assert_eq!(logs[0], logs[2]);
}

/// A SIGTERM to a broker still trying to register (its controllers do not
/// answer) stops it within seconds, not after the start's two-minute bound
/// (issue 14).
#[test]
fn sigterm_while_registering_stops_the_node_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    let ports = Ports::free();
    // Nothing listens on the voter's port: every registration attempt fails.
    let nobody = ports_below_ephemeral(1)[0];
    let quorum = format!("controller.quorum.voters=1@127.0.0.1:{nobody}");
    let mut child = Command::new(env!("CARGO_BIN_EXE_skiff"))
        .args(node_args(
            tmp.path(),
            ports,
            &["node.id=2", "process.roles=broker", &quorum],
        ))
        .env("RUST_LOG", "info")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if line.contains("registering with the controller (retrying)") {
                let _ = tx.send(());
            }
            text.push_str(&line);
            text.push('\n');
        }
        text
    });
    let retrying = rx.recv_timeout(Duration::from_secs(30));
    if retrying.is_err() {
        let _ = child.kill();
        let _ = child.wait();
        panic!(
            "the node never retried its registration\n{}",
            reader.join().unwrap()
        );
    }
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > Duration::from_secs(5) {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "still starting 5 s after SIGTERM\n{}",
                reader.join().unwrap()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let took = started.elapsed();
    let log = reader.join().unwrap();
    eprintln!("stopped {took:?} after SIGTERM");
    assert!(status.success(), "exit status {status}\n{log}");
    assert!(log.contains("stopped while starting"), "{log}");
    // Nothing it bound is left behind.
    assert!(!answers(ports.kafka), "{log}");
}
