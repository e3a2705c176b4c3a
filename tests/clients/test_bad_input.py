"""Bad input over raw sockets: each gets the right Kafka error or a closed
connection, and the node stays up and keeps serving new connections."""

import random
import struct

import pytest
from confluent_kafka import KafkaError

import ck
import kafka_wire as kw

EXPECTED_APIS = {
    kw.API_PRODUCE: "Produce",
    kw.API_FETCH: "Fetch",
    kw.API_LIST_OFFSETS: "ListOffsets",
    kw.API_METADATA: "Metadata",
    kw.API_API_VERSIONS: "ApiVersions",
    kw.API_CREATE_TOPICS: "CreateTopics",
    kw.API_DELETE_TOPICS: "DeleteTopics",
    kw.API_INIT_PRODUCER_ID: "InitProducerId",
    kw.API_DESCRIBE_CONFIGS: "DescribeConfigs",
    kw.API_INCREMENTAL_ALTER_CONFIGS: "IncrementalAlterConfigs",
}


def assert_serving(node):
    """The process is up and a new connection gets a good ApiVersions answer."""
    assert node.alive(), f"node died\n{node.log_tail()}"
    with kw.Conn(node.bootstrap) as c:
        err, apis = kw.api_versions(c, 0)
    assert err == 0
    assert kw.API_API_VERSIONS in apis
    return apis


def test_api_versions(node):
    with kw.Conn(node.bootstrap) as c:
        err, apis = kw.api_versions(c, 0)
        assert err == 0
        missing = {name for key, name in EXPECTED_APIS.items() if key not in apis}
        assert not missing, f"ApiVersions v0 lacks {missing}: {apis}"
        # librdkafka 2.0 compresses only when Produce v0 is listed; v3+ is what is served.
        lo, hi = apis[kw.API_PRODUCE]
        assert lo == 0 and hi >= 7, f"Produce versions {lo}-{hi}"
        lo, hi = apis[kw.API_FETCH]
        assert lo <= 4 and hi >= 12, f"Fetch versions {lo}-{hi}"
        assert apis[kw.API_LIST_OFFSETS][0] <= 1
        assert apis[kw.API_INIT_PRODUCER_ID][0] <= 1
        # the flexible (v3) request on the same connection gives the same list
        err3, apis3 = kw.api_versions(c, 3)
        assert err3 == 0
        assert apis3 == apis


def test_api_versions_unsupported_version(node):
    """Kafka answers an ApiVersions request of a version it does not know with a v0
    response: UNSUPPORTED_VERSION and the supported list, so the client can retry."""
    with kw.Conn(node.bootstrap) as c:
        resp = c.request(kw.API_API_VERSIONS, 99, kw.uvarint(0), flexible_header=True)
        err, apis = kw.parse_api_versions_v0(resp)
        assert err == kw.ERR_UNSUPPORTED_VERSION, f"ApiVersions v99: error {err}, want 35"
        assert kw.API_API_VERSIONS in apis and apis[kw.API_API_VERSIONS][0] == 0, apis
        # the connection is still good for a supported version
        assert kw.api_versions(c, 0)[0] == 0
    assert_serving(node)


def _garbage_cases():
    rng = random.Random(1234)
    yield "http", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"  # size prefix 0x47455420: over socket.request.max.bytes
    yield "negative-size", struct.pack(">i", -1) + b"\x00" * 16
    yield "zero-size", struct.pack(">i", 0)
    yield "short-header", kw.frame(b"\x00\x12\x00")  # 3 bytes: not even api key + version
    # ApiVersions v0 header whose client id claims 30000 bytes in a 20-byte frame
    yield "client-id-overrun", kw.frame(struct.pack(">hhih", 18, 0, 1, 30000) + b"x" * 10)
    # Metadata v1 whose topic array claims 2^31-1 entries
    yield "array-overrun", kw.frame(kw.request_header_v1(3, 1, 1) + struct.pack(">i", 0x7FFFFFFF))
    for i in range(5):
        body = rng.randbytes(rng.randrange(8, 200))
        yield f"random-{i}", kw.frame(body)


@pytest.mark.parametrize("name,data", list(_garbage_cases()), ids=[c[0] for c in _garbage_cases()])
def test_garbage_closes_connection(node, name, data):
    with kw.Conn(node.bootstrap) as c:
        c.send_raw(data)
        if name.startswith("random"):
            # Random bytes might by chance form a request; all that is asked is an
            # answer or a close, never a crash or a hang that takes the node down.
            c.closed_by_peer(timeout=5)
        else:
            assert c.closed_by_peer(timeout=10), f"{name}: connection still open after garbage (got {c.leftover[:64]!r})"
    assert_serving(node)


def test_frame_announcing_2gb(node):
    with kw.Conn(node.bootstrap) as c:
        c.send_raw(struct.pack(">i", 0x7FFFFFFF) + kw.request_header_v1(0, 7, 1) + b"\x00" * 1000)
        assert c.closed_by_peer(timeout=10), "a 2 GB frame must be refused and the connection closed"
    assert_serving(node)
    # and a second one right after, while another connection works
    with kw.Conn(node.bootstrap) as other, kw.Conn(node.bootstrap) as c:
        c.send_raw(struct.pack(">i", 0x7FFFFFFF))
        assert kw.api_versions(other, 0)[0] == 0
        assert c.closed_by_peer(timeout=10)
    assert_serving(node)


def test_unknown_api_key(node):
    with kw.Conn(node.bootstrap) as c:
        c.send_raw(kw.frame(kw.request_header_v1(9999, 0, 42) + b"\x00" * 8))
        closed = c.closed_by_peer(timeout=10)
        if not closed:
            # an answer is acceptable only as a well-formed frame for correlation id 42
            assert len(c.leftover) >= 8, "no answer and no close for unknown API key 9999"
            size, cid = struct.unpack(">ii", c.leftover[:8])
            assert cid == 42 and size == len(c.leftover) - 4, c.leftover[:64]
    assert_serving(node)


def test_known_api_unsupported_version(node):
    """Metadata v999: UNSUPPORTED_VERSION is not answerable in a format the client
    knows, so Kafka closes the connection. The node must at least not crash."""
    with kw.Conn(node.bootstrap) as c:
        c.send_raw(kw.frame(kw.request_header_v2(kw.API_METADATA, 999, 7) + b"\x00" * 8))
        c.closed_by_peer(timeout=10)
    assert_serving(node)


def test_pipelined_requests_answered_in_order(node):
    """Ten requests written at once on one connection come back in order."""
    with kw.Conn(node.bootstrap) as c:
        c.send_raw(b"".join(kw.frame(kw.request_header_v1(kw.API_API_VERSIONS, 0, cid)) for cid in range(100, 110)))
        cids = []
        for _ in range(10):
            resp = c.recv_frame()
            cids.append(struct.unpack(">i", resp[:4])[0])
    assert cids == list(range(100, 110))


# ---------------------------------------------------------------- produce errors


def test_produce_valid_raw_batch(node, topic_name):
    """The hand-built batch is accepted as it is: the base for the CRC test below."""
    ck.create_topic(node.bootstrap, topic_name, 1)
    b = kw.record_batch([(b"k%d" % i, b"v%d" % i, [("h", b"x")]) for i in range(5)])
    with kw.Conn(node.bootstrap) as c:
        assert kw.produce(c, topic_name, 0, b) == (0, 0)
        assert kw.produce(c, topic_name, 0, b) == (0, 5)  # no producer id: no dedupe
    got = ck.consume_all(node.bootstrap, topic_name, 1, 10)
    assert [(m.key(), m.value(), m.headers()) for m in got[0][:5]] == [
        (b"k%d" % i, b"v%d" % i, [("h", b"x")]) for i in range(5)
    ]
    batches = kw.all_batches(node.bootstrap, topic_name, 0)
    assert [(x["base_offset"], x["count"], x["crc_ok"]) for x in batches] == [(0, 5, True), (5, 5, True)]


def test_produce_wrong_crc(node, topic_name):
    ck.create_topic(node.bootstrap, topic_name, 1)
    good = kw.record_batch([(b"k", b"value-%d" % i) for i in range(3)])
    bad = kw.corrupt_payload(good)
    assert bad != good
    with kw.Conn(node.bootstrap) as c:
        err, _ = kw.produce(c, topic_name, 0, bad)
        assert err == kw.ERR_CORRUPT_MESSAGE, f"Produce v7 with a wrong CRC-32C: error {err}, want 2"
        # a wrong CRC in the header field itself, payload intact
        b2 = bytearray(good)
        b2[kw.BATCH_CRC_POS] ^= 0x01
        err, _ = kw.produce(c, topic_name, 0, bytes(b2))
        assert err == kw.ERR_CORRUPT_MESSAGE, f"flipped CRC byte: error {err}, want 2"
        # nothing was stored; the connection and the partition still work
        assert kw.produce(c, topic_name, 0, good) == (0, 0)
        assert kw.list_offset(c, topic_name, 0, -1) == (0, 3)
    assert_serving(node)


def test_produce_truncated_batch(node, topic_name):
    """A batch whose batchLength runs past the records bytes: CORRUPT_MESSAGE (or the
    connection closed), nothing stored."""
    ck.create_topic(node.bootstrap, topic_name, 1)
    good = kw.record_batch([(b"k", b"v" * 100)])
    with kw.Conn(node.bootstrap) as c:
        try:
            err, _ = kw.produce(c, topic_name, 0, good[:-10])
            assert err in (kw.ERR_CORRUPT_MESSAGE, 87), f"truncated batch: error {err}, want 2 (or 87 INVALID_RECORD)"
        except ConnectionError:
            pass
    with kw.Conn(node.bootstrap) as c:
        assert kw.list_offset(c, topic_name, 0, -1) == (0, 0)
    assert_serving(node)


def test_produce_missing_partition_raw(node_factory, topic_name):
    node = node_factory({"auto.create.topics.enable": "false"})
    ck.create_topic(node.bootstrap, topic_name, 1)
    b = kw.record_batch([(None, b"x")])
    with kw.Conn(node.bootstrap) as c:
        err, _ = kw.produce(c, topic_name, 5, b)
        assert err == kw.ERR_UNKNOWN_TOPIC_OR_PARTITION, f"partition 5 of a 1-partition topic: error {err}, want 3"
        err, _ = kw.produce(c, topic_name + "-missing", 0, b)
        assert err == kw.ERR_UNKNOWN_TOPIC_OR_PARTITION, f"missing topic: error {err}, want 3"
        assert kw.produce(c, topic_name, 0, b) == (0, 0)
    # not created behind our back
    md = ck.admin(node.bootstrap).list_topics(timeout=10)
    assert topic_name + "-missing" not in md.topics or md.topics[topic_name + "-missing"].error is not None
    assert_serving(node)


def test_produce_missing_topic_confluent(node_factory, topic_name):
    """With auto-create off, librdkafka's produce to a missing topic fails with an
    unknown-topic error in the delivery report instead of hanging."""
    node = node_factory({"auto.create.topics.enable": "false"})
    p = ck.producer(node.bootstrap, {"message.timeout.ms": 10000, "topic.metadata.propagation.max.ms": 1000})
    dr = ck.Deliveries()
    p.produce(topic_name, value=b"x", on_delivery=dr)
    p.flush(20)
    assert not dr.ok, "delivered to a topic that does not exist"
    assert len(dr.errors) == 1
    assert dr.errors[0][0].code() in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC), dr.errors[0][0]
    assert topic_name not in ck.admin(node.bootstrap).list_topics(timeout=10).topics
    assert_serving(node)


def _patched(batch: bytes, pos: int, fmt: str, value) -> bytes:
    """`batch` with the field at `pos` replaced and the CRC recomputed, so only the
    field itself is wrong."""
    b = bytearray(batch)
    struct.pack_into(fmt, b, pos, value)
    struct.pack_into(">I", b, kw.BATCH_CRC_POS, kw.crc32c(bytes(b[kw.BATCH_ATTRS_POS:])))
    return bytes(b)


def test_produce_inconsistent_record_count(node, topic_name):
    """lastOffsetDelta says 5 records, the batch holds 3, CRC valid: rejected
    (Kafka: CORRUPT_MESSAGE / INVALID_RECORD), nothing stored."""
    ck.create_topic(node.bootstrap, topic_name, 1)
    good = kw.record_batch([(None, b"a"), (None, b"b"), (None, b"c")])
    bad_delta = _patched(good, kw.BATCH_ATTRS_POS + 2, ">i", 4)  # lastOffsetDelta
    bad_count = _patched(good, kw.BATCH_HEADER_LEN - 4, ">i", 1000)  # records count
    with kw.Conn(node.bootstrap) as c:
        for name, b in (("lastOffsetDelta 4 for 3 records", bad_delta), ("records count 1000 for 3", bad_count)):
            err, _ = kw.produce(c, topic_name, 0, b)
            assert err in (kw.ERR_CORRUPT_MESSAGE, kw.ERR_INVALID_RECORD), f"{name}: error {err}, want 2 or 87"
        assert kw.list_offset(c, topic_name, 0, -1) == (0, 0), "a rejected batch was stored"
    assert_serving(node)


def test_produce_bad_magic(node, topic_name):
    ck.create_topic(node.bootstrap, topic_name, 1)
    b = bytearray(kw.record_batch([(None, b"a")]))
    b[16] = 3  # magic: CRC does not cover it
    with kw.Conn(node.bootstrap) as c:
        err, _ = kw.produce(c, topic_name, 0, bytes(b))
        assert err in (kw.ERR_CORRUPT_MESSAGE, kw.ERR_INVALID_RECORD, 43), f"magic 3: error {err}"
        assert kw.list_offset(c, topic_name, 0, -1) == (0, 0)
    assert_serving(node)


def test_produce_v2_refused(node, topic_name):
    """Produce v0-2 are listed in ApiVersions (for librdkafka 2.0) but refused, as
    Kafka 4.0 does: UNSUPPORTED_VERSION or a closed connection; nothing stored."""
    ck.create_topic(node.bootstrap, topic_name, 1)
    body = (
        struct.pack(">hi", -1, 5000)
        + struct.pack(">i", 1)
        + kw.string(topic_name)
        + struct.pack(">i", 1)
        + struct.pack(">i", 0)
        + kw.nbytes(kw.record_batch([(None, b"old")]))
    )
    with kw.Conn(node.bootstrap) as c:
        try:
            r = kw.Reader(c.request(kw.API_PRODUCE, 2, body))
            assert r.i32() == 1
            r.string()
            assert r.i32() == 1
            r.i32()
            err = r.i16()
            assert err == kw.ERR_UNSUPPORTED_VERSION, f"Produce v2: error {err}, want 35"
        except ConnectionError:
            pass
    with kw.Conn(node.bootstrap) as c:
        assert kw.list_offset(c, topic_name, 0, -1) == (0, 0)
    assert_serving(node)


def test_stalled_half_frame_does_not_block_others(node):
    """A client that sends half a frame and stops holds only its own connection."""
    with kw.Conn(node.bootstrap) as stalled:
        stalled.send_raw(struct.pack(">i", 100) + kw.request_header_v1(kw.API_API_VERSIONS, 0, 1)[:6])
        for _ in range(3):
            assert_serving(node)
        with kw.Conn(node.bootstrap) as c:
            assert kw.api_versions(c, 3)[0] == 0


@pytest.mark.parametrize("codec", [1, 2, 3, 4], ids=["gzip", "snappy", "lz4", "zstd"])
def test_produce_undecompressable_batch(node, topic_name, codec):
    """A batch that says it is compressed but whose records are not valid compressed
    data, with a correct CRC: Kafka validates compressed records and answers
    CORRUPT_MESSAGE / INVALID_RECORD. Stored, it would be a poison pill that every
    consumer of the partition fails on (librdkafka: _BAD_COMPRESSION)."""
    ck.create_topic(node.bootstrap, topic_name, 1)
    plain = kw.record_batch([(None, b"a" * 100)] * 3)
    bad = _patched(plain, kw.BATCH_ATTRS_POS, ">h", codec)  # attributes: codec bits
    with kw.Conn(node.bootstrap) as c:
        err, _ = kw.produce(c, topic_name, 0, bad)
        assert err in (kw.ERR_CORRUPT_MESSAGE, kw.ERR_INVALID_RECORD), (
            f"Produce v7 of a {kw.CODEC_NAMES[codec]} batch whose payload does not decompress: error {err}, want 2 or 87"
        )
        assert kw.list_offset(c, topic_name, 0, -1) == (0, 0), "the undecompressable batch was stored"
    assert_serving(node)
