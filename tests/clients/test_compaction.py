"""Compacted topics (cleanup.policy=compact) with real clients: overwrites and
tombstones are compacted by the node's cleaner while the clients read through the
offset gaps it leaves; tombstones go after delete.retention.ms; keyless records are
refused with INVALID_RECORD, as Kafka does."""

import time

from confluent_kafka import Consumer, KafkaError, TopicPartition
from kafka import KafkaConsumer
from kafka import TopicPartition as KpTopicPartition

import ck

# A cleaner that looks every 100 ms, and tiny segments, so compaction happens
# within the test.
CLEANER = {"log.cleaner.backoff.ms": "100"}
KEYS = [f"k{i}".encode() for i in range(10)]
DELETED = {b"k3", b"k7"}
ROUNDS = 20


def compacted_topic(node, topic, **overrides):
    config = {
        "cleanup.policy": "compact",
        "segment.bytes": "2048",
        "min.cleanable.dirty.ratio": "0.01",
        "delete.retention.ms": "600000",
    }
    config.update(overrides)
    ck.create_topic(node.bootstrap, topic, 1, config=config)


def read_from_start(bootstrap, topic, timeout_s=20.0):
    """[(offset, key, value)] of partition 0 from the log start to its end."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "skiff-compaction-tests",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": 100,
        }
    )
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        out = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error() is not None:
                if m.error().code() == KafkaError._PARTITION_EOF:
                    return out
                raise AssertionError(f"consumer error: {m.error()}")
            out.append((m.offset(), m.key(), m.value()))
        raise AssertionError(f"no EOF within {timeout_s}s after {len(out)} records")
    finally:
        c.close()


def produce_rounds(node, topic):
    """ROUNDS overwrites of every key, the last round deleting DELETED, then filler
    records of their own key so the last round lands in closed segments. Returns
    {key: (offset, value)} of each key's latest record."""
    p = ck.producer(node.bootstrap, {"linger.ms": 0})
    d = ck.Deliveries()
    for r in range(ROUNDS):
        for k in KEYS:
            value = None if (r == ROUNDS - 1 and k in DELETED) else f"v{r}-{k.decode()}".encode() * 4
            ck.produce_bounded(p, topic=topic, key=k, value=value, on_delivery=d)
        ck.flush(p)
    for i in range(40):
        ck.produce_bounded(p, topic=topic, key=b"filler", value=b"f" * 100, on_delivery=d)
        ck.flush(p)
    assert not d.errors, d.errors[:3]
    latest = {}
    for _, offset, key, value in sorted(d.ok, key=lambda t: t[1]):
        latest[key] = (offset, value)
    return latest, len(d.ok)


def wait_compacted(node, topic, latest, timeout_s=30.0):
    """Reads from the start until no key but the filler appears more than once."""
    deadline = time.monotonic() + timeout_s
    while True:
        records = read_from_start(node.bootstrap, topic)
        keys = [k for _, k, _ in records if k != b"filler"]
        if len(keys) == len(set(keys)) == len(KEYS):
            return records
        if time.monotonic() > deadline:
            raise AssertionError(
                f"not compacted within {timeout_s}s: {len(records)} records, "
                f"{len(keys)} of the {len(KEYS)} keys\n{node.log_tail(40)}"
            )
        time.sleep(0.2)


def test_overwrites_and_tombstones_are_compacted(node_factory, topic_name):
    node = node_factory(CLEANER)
    compacted_topic(node, topic_name)
    latest, produced = produce_rounds(node, topic_name)
    records = wait_compacted(node, topic_name, latest)
    assert len(records) < produced / 4, f"{len(records)} of {produced} records left"
    offsets = [o for o, _, _ in records]
    assert offsets == sorted(set(offsets)), "offsets must strictly increase"
    assert offsets[-1] == max(o for o, _ in latest.values())
    for k in KEYS:
        found = [(o, v) for o, key, v in records if key == k]
        assert found == [latest[k]], f"{k}: {found} != {latest[k]}"
        if k in DELETED:
            assert found[0][1] is None, "a tombstone stays until delete.retention.ms"

    # kafka-python reads through the same gaps and sees the same records.
    kc = KafkaConsumer(
        bootstrap_servers=node.bootstrap,
        enable_auto_commit=False,
        consumer_timeout_ms=3000,
        request_timeout_ms=15000,
    )
    try:
        tp = KpTopicPartition(topic_name, 0)
        kc.assign([tp])
        kc.seek_to_beginning(tp)
        seen = [(m.offset, m.key, m.value) for m in kc]
    finally:
        kc.close()
    # The cleaner may run again between the two reads and drop more of the
    # filler key's older records; every other key is final by now.
    def settled(rs):
        return [r for r in rs if r[0] <= offsets[-1] and r[1] != b"filler"]

    assert settled(seen) == settled(records)

    # The compacted log survives a restart.
    node.restart()
    assert settled(read_from_start(node.bootstrap, topic_name)) == settled(records)


def test_tombstones_go_after_delete_retention(node_factory, topic_name):
    node = node_factory(CLEANER)
    compacted_topic(node, topic_name, **{"delete.retention.ms": "300"})
    latest, _ = produce_rounds(node, topic_name)
    deadline = time.monotonic() + 30
    while True:
        records = read_from_start(node.bootstrap, topic_name)
        keys = {k for _, k, _ in records}
        remaining = [k for k in KEYS if k not in DELETED]
        if not (keys & DELETED) and all(k in keys for k in remaining):
            break
        assert time.monotonic() < deadline, f"tombstones still there: {sorted(keys & DELETED)}"
        time.sleep(0.2)
    for k in remaining:
        assert [(o, v) for o, key, v in records if key == k] == [latest[k]]


def test_keyless_record_on_a_compacted_topic_is_refused(node_factory, topic_name):
    node = node_factory(CLEANER)
    compacted_topic(node, topic_name)
    p = ck.producer(node.bootstrap, {"message.send.max.retries": 0})
    d = ck.Deliveries()
    # Separate batches: Kafka refuses the whole batch a keyless record is in.
    ck.produce_bounded(p, topic=topic_name, value=b"no key", on_delivery=d)
    ck.flush(p)
    ck.produce_bounded(p, topic=topic_name, key=b"k", value=b"keyed", on_delivery=d)
    ck.flush(p)
    assert [e[0].code() for e in d.errors] == [KafkaError.INVALID_RECORD], d.errors
    assert [(key, value) for _, _, key, value in d.ok] == [(b"k", b"keyed")]
    # Nothing of the refused batch is in the log.
    assert [(k, v) for _, k, v in read_from_start(node.bootstrap, topic_name)] == [(b"k", b"keyed")]
