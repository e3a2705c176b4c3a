"""Fetch semantics that clients rely on: long polling (max.wait.ms / min.bytes),
the high watermark bound, OFFSET_OUT_OF_RANGE, starting in the middle of a batch,
and several producers writing one partition at once."""

import threading
import time

import ck
import kafka_wire as kw


def test_long_poll_waits_then_returns_empty(node, topic_name):
    ck.create_topic(node.bootstrap, topic_name, 1)
    with kw.Conn(node.bootstrap) as c:
        t0 = time.monotonic()
        err, hw, records = kw.fetch(c, topic_name, 0, 0, max_wait_ms=1000)
        waited = time.monotonic() - t0
    assert (err, hw, records) == (0, 0, b"")
    assert 0.8 <= waited <= 5.0, f"Fetch with max_wait_ms=1000 on an empty partition answered after {waited:.3f}s"


def test_long_poll_wakes_on_produce(node, topic_name):
    ck.create_topic(node.bootstrap, topic_name, 1)
    result = {}

    def poll():
        with kw.Conn(node.bootstrap, timeout=20) as c:
            t0 = time.monotonic()
            result["fetch"] = kw.fetch(c, topic_name, 0, 0, max_wait_ms=10000)
            result["waited"] = time.monotonic() - t0

    t = threading.Thread(target=poll)
    t.start()
    time.sleep(0.5)
    with kw.Conn(node.bootstrap) as c:
        assert kw.produce(c, topic_name, 0, kw.record_batch([(b"k", b"wake up")])) == (0, 0)
    t.join(timeout=20)
    assert not t.is_alive()
    err, hw, records = result["fetch"]
    assert err == 0 and hw == 1
    assert [b["count"] for b in kw.parse_batches(records)] == [1]
    assert result["waited"] < 5.0, f"long poll answered {result['waited']:.2f}s after start, not when data arrived"


def test_min_bytes_waits_for_enough(node, topic_name):
    """min_bytes larger than what is there: the fetch waits for max_wait_ms."""
    ck.create_topic(node.bootstrap, topic_name, 1)
    with kw.Conn(node.bootstrap) as c:
        assert kw.produce(c, topic_name, 0, kw.record_batch([(None, b"x" * 10)])) == (0, 0)
        t0 = time.monotonic()
        err, hw, records = kw.fetch(c, topic_name, 0, 0, max_wait_ms=800, min_bytes=1_000_000)
        waited = time.monotonic() - t0
        assert err == 0 and hw == 1
        assert len(kw.parse_batches(records)) == 1, "after max_wait_ms the data there is returned"
        assert waited >= 0.6, f"min_bytes=1000000 with 80 bytes available answered after {waited:.3f}s"
        t0 = time.monotonic()
        kw.fetch(c, topic_name, 0, 0, max_wait_ms=5000, min_bytes=1)
        assert time.monotonic() - t0 < 2.0, "data available and min_bytes=1: answer at once"


def test_offset_out_of_range(node, topic_name):
    ck.create_topic(node.bootstrap, topic_name, 1)
    with kw.Conn(node.bootstrap) as c:
        assert kw.produce(c, topic_name, 0, kw.record_batch([(None, b"a"), (None, b"b")])) == (0, 0)
        err, hw, records = kw.fetch(c, topic_name, 0, 2, max_wait_ms=10)
        assert (err, hw, records) == (0, 2, b""), "fetch at the log end: empty, no error"
        err, hw, _ = kw.fetch(c, topic_name, 0, 3, max_wait_ms=10)
        assert err == kw.ERR_OFFSET_OUT_OF_RANGE, f"fetch past the log end: error {err}, want 1"
        err, _, _ = kw.fetch(c, topic_name, 0, -5, max_wait_ms=10)
        assert err == kw.ERR_OFFSET_OUT_OF_RANGE, f"fetch at offset -5: error {err}, want 1"
        err, _, _ = kw.fetch(c, topic_name, 7, 0, max_wait_ms=10)
        assert err == kw.ERR_UNKNOWN_TOPIC_OR_PARTITION, f"fetch from partition 7 of 1: error {err}, want 3"


def test_consume_from_middle_of_batch(node, topic_name):
    ck.create_topic(node.bootstrap, topic_name, 1)
    p = ck.producer(node.bootstrap, {"linger.ms": 100, "compression.type": "zstd"})
    for i in range(300):
        p.produce(topic_name, value=b"m%d" % i, partition=0)
    ck.flush(p)
    batches = kw.all_batches(node.bootstrap, topic_name, 0)
    assert sum(b["count"] for b in batches) == 300
    # an offset inside the first batch that is not its base
    start = 37 if batches[0]["count"] > 37 else 1
    c = ck.Consumer({"bootstrap.servers": node.bootstrap, "group.id": "skiff-client-tests",
                     "enable.auto.commit": False, "enable.partition.eof": True})
    try:
        c.assign([ck.TopicPartition(topic_name, 0, start)])
        got = []
        deadline = time.monotonic() + 30
        while len(got) < 300 - start and time.monotonic() < deadline:
            for m in c.consume(1000, timeout=0.5):
                if m.error() is None:
                    got.append((m.offset(), m.value()))
    finally:
        c.close()
    assert got == [(i, b"m%d" % i) for i in range(start, 300)]


def test_concurrent_producers_one_partition(node, topic_name):
    """Four producers (four connections, spread over the node's cores) write to
    the same partitions at once: nothing lost, each producer's order kept."""
    parts, producers, n = 2, 4, 5000
    ck.create_topic(node.bootstrap, topic_name, parts)
    errors = []

    def run(pid):
        p = ck.producer(node.bootstrap, {"linger.ms": 2, "acks": "all", "enable.idempotence": pid % 2 == 0})
        dr = ck.Deliveries()
        for i in range(n):
            ck.produce_bounded(p, topic=topic_name, key=b"p%d" % pid, value=b"%d:%06d" % (pid, i),
                               partition=i % parts, on_delivery=dr)
            if i % 500 == 0:
                p.poll(0)
        ck.flush(p)
        errors.extend(dr.errors)

    threads = [threading.Thread(target=run, args=(pid,)) for pid in range(producers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors[:5]
    got = ck.consume_all(node.bootstrap, topic_name, parts, producers * n)
    ck.assert_contiguous(got)
    for part in range(parts):
        for pid in range(producers):
            mine = [m.value() for m in got[part] if m.key() == b"p%d" % pid]
            assert mine == [b"%d:%06d" % (pid, i) for i in range(part, n, parts)], f"producer {pid} partition {part}"
