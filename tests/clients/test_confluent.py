"""confluent-kafka 2.16 (librdkafka 2.16) against a skiff node: every codec, keys,
null values, headers, acks 0/1/all, idempotence, timestamps and ListOffsets, a 900 KB
message, MESSAGE_TOO_LARGE, and 100,000 messages over 8 partitions."""

import os
import random

import pytest
from confluent_kafka import TIMESTAMP_CREATE_TIME, KafkaError, TopicPartition

import ck
import kafka_wire as kw

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
PARTITIONS = 3
BASE_TS = 1_700_000_000_000


def sample_records():
    """(key, value, headers) covering the edge cases, then a compressible bulk."""
    rng = random.Random(7)
    recs = [
        (b"k0", b"v0", None),
        (None, b"value without key", None),
        (b"null-value", None, None),
        (b"", b"", None),
        (b"bin\x00\xff\n", bytes(range(256)) * 4, [("h1", b"a"), ("h1", b"b"), ("empty", b""), ("nullh", None)]),
        (b"random", rng.randbytes(5000), [("\u00e9t\u00e9", "caf\u00e9".encode())]),
        (None, None, [("only-headers", b"x")]),
    ]
    for i in range(300):
        recs.append((b"key-%d" % i, (b"value-%d-" % i) * (1 + i % 40), [("seq", str(i).encode())]))
    return recs


def produce_sample(bootstrap, topic, conf):
    """Produce sample_records() round-robin over PARTITIONS with explicit timestamps.
    Returns (expected per partition [(key, value, headers, ts)], deliveries)."""
    p = ck.producer(bootstrap, conf)
    dr = ck.Deliveries()
    expected = {i: [] for i in range(PARTITIONS)}
    for i, (key, value, headers) in enumerate(sample_records()):
        part = i % PARTITIONS
        ts = BASE_TS + i
        kw = dict(topic=topic, key=key, value=value, partition=part, timestamp=ts, on_delivery=dr)
        if headers is not None:
            kw["headers"] = headers
        ck.produce_bounded(p, **kw)
        expected[part].append((key, value, headers, ts))
        p.poll(0)
    ck.flush(p)
    return expected, dr


def short(b):
    return repr(b) if b is None or len(b) <= 60 else f"{b[:60]!r}... ({len(b)} bytes)"


def check_stored_codec(bootstrap, topic, partitions, codec):
    for part in range(partitions):
        batches = kw.all_batches(bootstrap, topic, part)
        assert batches, f"partition {part}: no batches"
        assert all(b["crc_ok"] for b in batches), f"partition {part}: bad CRC in {batches}"
        kw.assert_codec(batches, codec, f"compression.type={codec}, partition {part}")


def check_consumed(got, expected):
    for part, exp in expected.items():
        msgs = got[part]
        assert len(msgs) == len(exp), f"partition {part}: {len(msgs)} messages, expected {len(exp)}"
        for i, (m, (key, value, headers, ts)) in enumerate(zip(msgs, exp)):
            where = f"partition {part} offset {m.offset()} (#{i})"
            assert m.key() == key, f"{where}: key {m.key()!r} != {key!r}"
            assert m.value() == value, f"{where}: value {short(m.value())} != {short(value)}"
            want_headers = [(k, v) for k, v in headers] if headers else None
            got_headers = m.headers()
            assert (got_headers or None) == want_headers, f"{where}: headers {got_headers!r} != {want_headers!r}"
            assert m.timestamp() == (TIMESTAMP_CREATE_TIME, ts), f"{where}: timestamp {m.timestamp()} != CreateTime {ts}"
    ck.assert_contiguous(got)


@pytest.mark.parametrize("acks", ["0", "1", "all"])
@pytest.mark.parametrize("codec", CODECS)
def test_produce_consume_codec_acks(node, topic_name, codec, acks):
    ck.create_topic(node.bootstrap, topic_name, PARTITIONS)
    conf = {"compression.type": codec, "acks": acks}
    expected, dr = produce_sample(node.bootstrap, topic_name, conf)
    total = sum(len(v) for v in expected.values())
    assert not dr.errors, f"delivery errors: {dr.errors[:5]}"
    assert len(dr.ok) == total
    got = ck.consume_all(node.bootstrap, topic_name, PARTITIONS, total)
    check_consumed(got, expected)
    check_stored_codec(node.bootstrap, topic_name, PARTITIONS, codec)
    if acks != "0":
        # The offsets the producer was told are the offsets the records are at.
        for part, offset, key, value in dr.ok:
            m = got[part][offset]
            assert (m.key(), m.value()) == (key, value), f"delivery report said {part}/{offset}"


@pytest.mark.parametrize("codec", CODECS)
def test_idempotent_producer(node, topic_name, codec):
    ck.create_topic(node.bootstrap, topic_name, PARTITIONS)
    conf = {"compression.type": codec, "enable.idempotence": True}
    expected, dr = produce_sample(node.bootstrap, topic_name, conf)
    total = sum(len(v) for v in expected.values())
    assert not dr.errors, f"delivery errors: {dr.errors[:5]}"
    got = ck.consume_all(node.bootstrap, topic_name, PARTITIONS, total)
    check_consumed(got, expected)
    check_stored_codec(node.bootstrap, topic_name, PARTITIONS, codec)
    for part in range(PARTITIONS):
        batches = kw.all_batches(node.bootstrap, topic_name, part)
        assert all(b["producer_id"] >= 0 and b["base_sequence"] >= 0 for b in batches), (
            f"partition {part}: batches without producer id / sequence: {batches[:3]}"
        )


def test_auto_created_topic(node, topic_name):
    """Producing to a topic that does not exist creates it (auto.create.topics.enable
    defaults to true) with num.partitions (default 1) partitions."""
    p = ck.producer(node.bootstrap)
    dr = ck.Deliveries()
    for i in range(10):
        p.produce(topic_name, value=b"auto-%d" % i, on_delivery=dr)
    ck.flush(p)
    assert not dr.errors, dr.errors
    md = ck.wait_for_topic(node.bootstrap, topic_name, 1)
    assert len(md.topics[topic_name].partitions) == 1
    got = ck.consume_all(node.bootstrap, topic_name, 1, 10)
    assert [m.value() for m in got[0]] == [b"auto-%d" % i for i in range(10)]


def test_watermarks(node, topic_name):
    """ListOffsets earliest/latest through get_watermark_offsets."""
    ck.create_topic(node.bootstrap, topic_name, 2)
    p = ck.producer(node.bootstrap)
    for i in range(17):
        p.produce(topic_name, value=b"%d" % i, partition=i % 2)
    ck.flush(p)
    c = ck.Consumer({"bootstrap.servers": node.bootstrap, "group.id": "skiff-client-tests"})
    try:
        assert c.get_watermark_offsets(TopicPartition(topic_name, 0), timeout=10) == (0, 9)
        assert c.get_watermark_offsets(TopicPartition(topic_name, 1), timeout=10) == (0, 8)
    finally:
        c.close()


@pytest.mark.parametrize("layout", ["one-batch", "batch-per-record", "gzip-one-batch"])
def test_offsets_for_times(node, topic_name, layout):
    """ListOffsets by timestamp returns the first offset whose timestamp is >= the
    target, also inside a (compressed) batch holding many records."""
    ck.create_topic(node.bootstrap, topic_name, 1)
    conf = {"linger.ms": 200} if layout != "batch-per-record" else {"linger.ms": 0}
    if layout == "gzip-one-batch":
        conf["compression.type"] = "gzip"
    p = ck.producer(node.bootstrap, conf)
    n = 20
    stamps = [BASE_TS + 1000 * i for i in range(n)]
    for i, ts in enumerate(stamps):
        p.produce(topic_name, value=b"t%d" % i, partition=0, timestamp=ts)
        if layout == "batch-per-record":
            ck.flush(p)
    ck.flush(p)

    c = ck.Consumer({"bootstrap.servers": node.bootstrap, "group.id": "skiff-client-tests"})
    try:
        cases = [
            (BASE_TS - 5000, 0),  # before everything: the first record
            (BASE_TS, 0),
            (BASE_TS + 1, 1),  # between records: the next one
            (BASE_TS + 7000, 7),
            (BASE_TS + 7500, 8),
            (stamps[-1], n - 1),
            (stamps[-1] + 1, -1),  # after everything: no offset (-1), as Kafka answers
        ]
        for target, want in cases:
            res = c.offsets_for_times([TopicPartition(topic_name, 0, target)], timeout=10)
            assert res[0].error is None, f"ts {target}: {res[0].error}"
            assert res[0].offset == want, f"offsets_for_times({target - BASE_TS:+d} ms from base) = {res[0].offset}, want {want}"
    finally:
        c.close()


def test_message_900kb(node, topic_name):
    ck.create_topic(node.bootstrap, topic_name, 1)
    big = os.urandom(900 * 1024)  # incompressible
    p = ck.producer(node.bootstrap)
    dr = ck.Deliveries()
    p.produce(topic_name, key=b"big", value=big, partition=0, on_delivery=dr)
    p.produce(topic_name, key=b"after", value=b"small", partition=0, on_delivery=dr)
    ck.flush(p)
    assert not dr.errors, dr.errors[:1]
    got = ck.consume_all(node.bootstrap, topic_name, 1, 2)
    assert got[0][0].key() == b"big"
    assert len(got[0][0].value()) == len(big)
    assert got[0][0].value() == big
    assert got[0][1].value() == b"small"
    assert [m.offset() for m in got[0]] == [0, 1]


def test_message_too_large(node, topic_name):
    """A 1.2 MB record is over the node's message.max.bytes (1048588 by default):
    MESSAGE_TOO_LARGE, nothing stored, and the partition keeps working."""
    ck.create_topic(node.bootstrap, topic_name, 1)
    p = ck.producer(node.bootstrap, {"message.max.bytes": 4_000_000, "message.send.max.retries": 0})
    dr = ck.Deliveries()
    p.produce(topic_name, value=os.urandom(1_200_000), partition=0, on_delivery=dr)
    ck.flush(p)
    assert len(dr.errors) == 1, f"expected MSG_SIZE_TOO_LARGE, got ok={dr.ok} errors={dr.errors}"
    assert dr.errors[0][0].code() == KafkaError.MSG_SIZE_TOO_LARGE, dr.errors[0][0]
    p2 = ck.producer(node.bootstrap)
    p2.produce(topic_name, value=b"after", partition=0)
    ck.flush(p2)
    got = ck.consume_all(node.bootstrap, topic_name, 1, 1)
    assert [(m.offset(), m.value()) for m in got[0]] == [(0, b"after")]


def test_100k_messages_8_partitions(node, topic_name):
    parts, n = 8, 100_000
    ck.create_topic(node.bootstrap, topic_name, parts)
    p = ck.producer(node.bootstrap, {"linger.ms": 20, "compression.type": "lz4", "acks": "all"})
    dr_errors = []

    def on_delivery(err, msg):
        if err is not None:
            dr_errors.append(err)

    for i in range(n):
        part = i % parts
        ck.produce_bounded(p, topic=topic_name, key=b"%d" % part, value=b"%d:%d" % (part, i // parts),
                           partition=part, on_delivery=on_delivery)
        if i % 1000 == 0:
            p.poll(0)
    ck.flush(p, 120)
    assert not dr_errors, dr_errors[:5]
    got = ck.consume_all(node.bootstrap, topic_name, parts, n, timeout_s=120)
    for part in range(parts):
        values = [m.value() for m in got[part]]
        assert len(values) == n // parts
        want = [b"%d:%d" % (part, s) for s in range(n // parts)]
        if values != want:
            first = next(i for i, (a, b) in enumerate(zip(values, want)) if a != b)
            raise AssertionError(f"partition {part}: order broken at #{first}: {values[first]!r} != {want[first]!r}")
    ck.assert_contiguous(got)
