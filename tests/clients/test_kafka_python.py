"""kafka-python 3.0 against a skiff node: its default producer (idempotent since
3.0: InitProducerId, sequence numbers, acks=all) with every codec it supports,
consumed with assign(), byte-exact; and a resent batch (response lost on the way
back) is not stored twice."""

import random
import socket
import struct
import threading
import time

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka import TopicPartition as KpTopicPartition

import ck
import kafka_wire as kw

CODECS = [None, "gzip", "snappy", "lz4", "zstd"]
PARTITIONS = 3
BASE_TS = 1_710_000_000_000
TIMEOUT_MS = 15000


def make_producer(bootstrap, **kw_):
    conf = dict(
        bootstrap_servers=[bootstrap],
        client_id="skiff-tests-kafka-python",
        request_timeout_ms=TIMEOUT_MS,
        max_block_ms=30000,
        bootstrap_timeout_ms=10000,
        linger_ms=5,
    )
    conf.update(kw_)
    return KafkaProducer(**conf)


def consume(bootstrap, topic, partitions, expected, timeout_s=60):
    c = KafkaConsumer(
        bootstrap_servers=[bootstrap],
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        request_timeout_ms=TIMEOUT_MS + 5000,
        bootstrap_timeout_ms=10000,
        fetch_max_wait_ms=100,
    )
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        c.assign(tps)
        c.seek_to_beginning(*tps)
        out = {p: [] for p in range(partitions)}
        count = 0
        deadline = time.monotonic() + timeout_s
        while count < expected and time.monotonic() < deadline:
            for tp, recs in c.poll(timeout_ms=500, max_records=10000).items():
                out[tp.partition] += recs
                count += len(recs)
        # a little longer, to see records that should not be there
        extra_deadline = time.monotonic() + 1.0
        while time.monotonic() < extra_deadline:
            for tp, recs in c.poll(timeout_ms=200).items():
                out[tp.partition] += recs
                count += len(recs)
        assert count == expected, f"consumed {count}, expected {expected}: per partition {[len(v) for v in out.values()]}"
        return out
    finally:
        c.close()


def sample_records():
    rng = random.Random(11)
    recs = [
        (b"k0", b"v0", []),
        (None, b"no key", []),
        (b"null-value", None, []),
        (b"", b"", []),
        (b"bin\x00\xff", bytes(range(256)) * 4, [("h1", b"a"), ("h1", b"b"), ("empty", b"")]),
        (b"random", rng.randbytes(4000), [("caf\u00e9", b"\xff\x00")]),
    ]
    for i in range(200):
        recs.append((b"key-%d" % i, (b"value-%d " % i) * (1 + i % 50), [("seq", str(i).encode())]))
    return recs


@pytest.mark.parametrize("codec", CODECS, ids=[c or "none" for c in CODECS])
def test_default_producer_codecs(node, topic_name, codec):
    ck.create_topic(node.bootstrap, topic_name, PARTITIONS)
    p = make_producer(node.bootstrap, compression_type=codec)
    try:
        tm = p._transaction_manager
        assert tm is not None, "kafka-python's default producer did not enable idempotence with this node"
        expected = {i: [] for i in range(PARTITIONS)}
        futures = []
        for i, (key, value, headers) in enumerate(sample_records()):
            part = i % PARTITIONS
            ts = BASE_TS + i
            futures.append((part, key, value, p.send(topic_name, key=key, value=value, headers=headers,
                                                     partition=part, timestamp_ms=ts)))
            expected[part].append((key, value, headers, ts))
        p.flush(timeout=60)
        for part, key, value, f in futures:
            md = f.get(timeout=30)
            assert md.partition == part
            assert md.offset >= 0
        assert tm.producer_id_and_epoch.producer_id >= 0, "no producer id from InitProducerId"
    finally:
        p.close(timeout=10)

    total = sum(len(v) for v in expected.values())
    got = consume(node.bootstrap, topic_name, PARTITIONS, total)
    for part, exp in expected.items():
        recs = got[part]
        assert [r.offset for r in recs] == list(range(len(exp))), f"partition {part}: offsets not contiguous from 0"
        for r, (key, value, headers, ts) in zip(recs, exp):
            where = f"partition {part} offset {r.offset}"
            assert r.key == key, where
            assert r.value == value, where
            assert list(r.headers) == headers, f"{where}: {r.headers} != {headers}"
            assert (r.timestamp, r.timestamp_type) == (ts, 0), f"{where}: timestamp {r.timestamp} type {r.timestamp_type}"
    # The offsets the producer was told are the offsets the records are at.
    for part, key, value, f in futures:
        md = f.get(timeout=0)
        r = got[part][md.offset]
        assert (r.key, r.value) == (key, value), f"acknowledged at {part}/{md.offset}"

    for part in range(PARTITIONS):
        batches = kw.all_batches(node.bootstrap, topic_name, part)
        assert all(b["crc_ok"] for b in batches)
        # kafka-python, like librdkafka, sends a batch uncompressed when
        # compressing does not make it smaller (a record that lingered alone).
        kw.assert_codec(batches, codec or "none", f"partition {part}")
        assert all(b["producer_id"] >= 0 and b["base_sequence"] >= 0 for b in batches), (
            f"partition {part}: stored batches without producer id / sequence: {batches[:3]}"
        )
        seqs = [b["base_sequence"] for b in batches]
        counts = [b["count"] for b in batches]
        assert seqs == [sum(counts[:i]) for i in range(len(counts))], f"partition {part}: sequences {seqs} counts {counts}"


def test_non_idempotent_acks_1(node, topic_name):
    ck.create_topic(node.bootstrap, topic_name, 1)
    p = make_producer(node.bootstrap, enable_idempotence=False, acks=1, compression_type="gzip")
    try:
        fs = [p.send(topic_name, value=b"m%d" % i, partition=0) for i in range(100)]
        p.flush(timeout=30)
        assert [f.get(timeout=10).offset for f in fs] == list(range(100))
    finally:
        p.close(timeout=10)
    got = consume(node.bootstrap, topic_name, 1, 100)
    assert [r.value for r in got[0]] == [b"m%d" % i for i in range(100)]


def test_admin_create_partitions(node, topic_name):
    """kafka-python's KafkaAdminClient.create_partitions, then its producer
    writes to a new partition and its consumer reads it back."""
    from kafka.admin import KafkaAdminClient, NewPartitions
    from kafka.errors import InvalidPartitionsError

    ck.create_topic(node.bootstrap, topic_name, 1)
    a = KafkaAdminClient(bootstrap_servers=node.bootstrap, request_timeout_ms=30000)
    try:
        a.create_partitions({topic_name: NewPartitions(total_count=3)})
        with pytest.raises(InvalidPartitionsError):
            a.create_partitions({topic_name: NewPartitions(total_count=2)}, raise_errors=True)
    finally:
        a.close()
    ck.wait_for_topic(node.bootstrap, topic_name, 3)
    p = make_producer(node.bootstrap)
    try:
        assert p.send(topic_name, value=b"on-2", partition=2).get(timeout=30).offset == 0
    finally:
        p.close(timeout=10)
    got = consume(node.bootstrap, topic_name, 3, 1)
    assert [r.value for r in got[2]] == [b"on-2"]


def legacy_alter_configs(bootstrap, topic, configs, validate_only=False):
    """AlterConfigs v0 on the wire: {key: value or None} as the topic's whole
    override set; returns (error code, message)."""
    import struct

    body = struct.pack(">i", 1) + struct.pack(">b", 2) + kw.string(topic) + struct.pack(">i", len(configs))
    for k, v in configs.items():
        body += kw.string(k) + kw.string(v)
    body += struct.pack(">b", 1 if validate_only else 0)
    with kw.Conn(bootstrap) as conn:
        r = kw.Reader(conn.request(33, 0, body))
    r.i32()  # throttle
    assert r.i32() == 1
    code, message = r.i16(), r.string()
    assert (r.i8(), r.string()) == (2, topic)
    return code, message


def test_admin_alter_configs_legacy(node, topic_name):
    """AlterConfigs, the whole-set API: kafka-python's alter_configs with
    incremental=False (it resends the other dynamic keys itself), then the
    API's own rule on the wire: keys not given go back to their defaults."""
    from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient

    ck.create_topic(node.bootstrap, topic_name, 1, config={"retention.ms": "123456", "segment.bytes": "1048576"})
    a = KafkaAdminClient(bootstrap_servers=node.bootstrap, request_timeout_ms=30000)
    try:
        res = ConfigResource(ConfigResourceType.TOPIC, topic_name, configs={"retention.ms": "5000"})
        a.alter_configs([res], incremental=False)
    finally:
        a.close()
    entries = ck.describe_topic_configs(node.bootstrap, topic_name)
    assert (entries["retention.ms"].value, entries["segment.bytes"].value) == ("5000", "1048576")

    assert legacy_alter_configs(node.bootstrap, topic_name, {"retention.ms": "abc"})[0] == 40  # INVALID_CONFIG
    assert legacy_alter_configs(node.bootstrap, topic_name, {"cleanup.policy": "compact"}, validate_only=True)[0] == 0
    assert legacy_alter_configs(node.bootstrap, topic_name + "-x", {"retention.ms": "1"})[0] == 3
    entries = ck.describe_topic_configs(node.bootstrap, topic_name)
    assert (entries["retention.ms"].value, entries["cleanup.policy"].value) == ("5000", "delete")
    assert legacy_alter_configs(node.bootstrap, topic_name, {"retention.ms": "7000"})[0] == 0
    entries = ck.describe_topic_configs(node.bootstrap, topic_name)
    assert entries["retention.ms"].value == "7000"
    assert entries["segment.bytes"].value == "1073741824" and entries["segment.bytes"].is_default, entries


def test_admin_describe_log_dirs(node, topic_name):
    """DescribeLogDirs through kafka-python: the node's data directory with
    each partition's bytes on disk (at least the records written) and no lag
    on a leader."""
    from kafka.admin import KafkaAdminClient

    ck.create_topic(node.bootstrap, topic_name, 2)
    p = make_producer(node.bootstrap)
    try:
        for i in range(200):
            p.send(topic_name, value=b"x" * 100, partition=i % 2)
        p.flush(timeout=30)
    finally:
        p.close(timeout=10)
    a = KafkaAdminClient(bootstrap_servers=node.bootstrap, request_timeout_ms=30000)
    try:
        got = a.describe_log_dirs({topic_name: [0, 1]})
    finally:
        a.close()
    text = repr(got)
    assert node.data_dir in text, text
    dirs = got if isinstance(got, list) else [got]
    found = {}

    def walk(x):
        if isinstance(x, dict):
            if "partition_index" in x and "partition_size" in x:
                found[x["partition_index"]] = (x["partition_size"], x.get("offset_lag"))
            for v in x.values():
                walk(v)
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)

    walk(dirs)
    assert sorted(found) == [0, 1], text
    for size, lag in found.values():
        assert size >= 100 * 100 and lag == 0, text


def test_admin_describe_producers(fresh_node, topic_name):
    """DescribeProducers through kafka-python: each idempotent producer of a
    partition with its epoch and last sequence, also after a restart (the
    state is loaded from the log when first asked)."""
    from kafka.admin import KafkaAdminClient

    node = fresh_node
    ck.create_topic(node.bootstrap, topic_name, 2)
    for tag in ("a", "b"):
        p = make_producer(node.bootstrap)  # idempotent by default (kafka-python 3)
        try:
            for i in range(7 if tag == "a" else 3):
                p.send(topic_name, value=b"%s-%d" % (tag.encode(), i), partition=0).get(timeout=30)
        finally:
            p.close(timeout=10)

    def described():
        a = KafkaAdminClient(bootstrap_servers=node.bootstrap, request_timeout_ms=30000)
        try:
            return a.describe_producers([KpTopicPartition(topic_name, 0), KpTopicPartition(topic_name, 1)])
        finally:
            a.close()

    for _ in range(2):
        got = described()
        states = {tp.partition: s.active_producers for tp, s in got.items()}
        assert states[1] == [], states
        assert sorted(p.last_sequence for p in states[0]) == [2, 6], states
        assert all(p.producer_id >= 0 and p.producer_epoch >= 0 for p in states[0]), states
        node.restart()


# ---------------------------------------------------------------- a lost produce response


class DropFirstProduceResponseProxy:
    """A TCP proxy in front of the node that forwards every frame, except that it
    swallows the first `drops` Produce responses and closes that client
    connection instead, as a network failure after the node appended would. The
    node advertises the proxy's address, so every client connection goes through it."""

    def __init__(self, upstream_port, drops=1):
        self.upstream_port = upstream_port
        self.drops = drops
        self.dropped = 0
        self.produce_requests = 0
        self.lock = threading.Lock()
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.listener.settimeout(0.2)
        self.port = self.listener.getsockname()[1]
        self.stopping = False
        self.sockets = []
        self.threads = [threading.Thread(target=self._accept_loop, daemon=True)]
        self.threads[0].start()

    def _accept_loop(self):
        while not self.stopping:
            try:
                client, _ = self.listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=10)
            for s in (client, upstream):
                s.settimeout(60)
            self.sockets += [client, upstream]
            produce_ids = set()
            for target in (self._client_to_node, self._node_to_client):
                t = threading.Thread(target=target, args=(client, upstream, produce_ids), daemon=True)
                t.start()
                self.threads.append(t)

    @staticmethod
    def _read_frame(sock):
        head = b""
        while len(head) < 4:
            chunk = sock.recv(4 - len(head))
            if not chunk:
                return None
            head += chunk
        (size,) = struct.unpack(">i", head)
        body = bytearray()
        while len(body) < size:
            chunk = sock.recv(min(65536, size - len(body)))
            if not chunk:
                return None
            body += chunk
        return head + bytes(body)

    def _client_to_node(self, client, upstream, produce_ids):
        try:
            while True:
                f = self._read_frame(client)
                if f is None:
                    break
                api_key, _, cid = struct.unpack(">hhi", f[4:12])
                if api_key == kw.API_PRODUCE:
                    with self.lock:
                        self.produce_requests += 1
                    produce_ids.add(cid)
                upstream.sendall(f)
        except OSError:
            pass
        self._close(client, upstream)

    def _node_to_client(self, client, upstream, produce_ids):
        try:
            while True:
                f = self._read_frame(upstream)
                if f is None:
                    break
                (cid,) = struct.unpack(">i", f[4:8])
                if cid in produce_ids:
                    with self.lock:
                        drop = self.dropped < self.drops
                        if drop:
                            self.dropped += 1
                    if drop:
                        break  # the response is lost; the connection goes down
                client.sendall(f)
        except OSError:
            pass
        self._close(client, upstream)

    @staticmethod
    def _close(*socks):
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            try:
                s.close()
            except OSError:
                pass

    def stop(self):
        self.stopping = True
        self.listener.close()
        self._close(*self.sockets)
        for t in self.threads:
            t.join(timeout=5)


@pytest.fixture
def proxied_node(node_factory):
    """A node that advertises a proxy's address; yields (node, proxy). The proxy
    binds first, so the node can be told its address; it learns the node's port
    before any client connects."""
    proxy = DropFirstProduceResponseProxy(upstream_port=0)
    try:
        n = node_factory(extra_args=["--advertised-listener", f"127.0.0.1:{proxy.port}"])
        proxy.upstream_port = n.port
        yield n, proxy
    finally:
        proxy.stop()


def test_resent_batch_not_duplicated(proxied_node, topic_name):
    node, proxy = proxied_node
    ck.create_topic(node.bootstrap, topic_name, 1)
    n = 50
    p = make_producer(f"127.0.0.1:{proxy.port}", linger_ms=0, retry_backoff_ms=50, compression_type="lz4")
    try:
        assert p._transaction_manager is not None, "default producer not idempotent"
        fs = [p.send(topic_name, key=b"k", value=b"record-%d" % i, partition=0) for i in range(n)]
        p.flush(timeout=60)
        offsets = [f.get(timeout=30).offset for f in fs]
    finally:
        p.close(timeout=10)
    assert proxy.dropped == 1, f"proxy saw {proxy.produce_requests} produce requests, dropped {proxy.dropped} responses"
    assert proxy.produce_requests > 1
    assert offsets == list(range(n)), f"acknowledged offsets {offsets}"
    got = consume(node.bootstrap, topic_name, 1, n)
    values = [r.value for r in got[0]]
    assert values == [b"record-%d" % i for i in range(n)], f"stored: {values[:10]}..."
