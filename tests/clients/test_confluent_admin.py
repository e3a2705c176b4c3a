"""confluent-kafka's AdminClient against a skiff node: CreateTopics, Metadata,
DeleteTopics, CreatePartitions, DescribeConfigs, IncrementalAlterConfigs, and
their errors."""

import os
import time

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (AlterConfigOpType, ConfigEntry, ConfigResource, ConfigSource, NewPartitions,
                                  NewTopic, ResourceType)

import ck

T = ck.REQUEST_TIMEOUT_S


def create(a, topic, partitions=1, config=None, validate_only=False):
    fs = a.create_topics(
        [NewTopic(topic, num_partitions=partitions, replication_factor=1, config=config or {})],
        operation_timeout=T,
        request_timeout=T,
        validate_only=validate_only,
    )
    return fs[topic].result(timeout=T)


def error_code(excinfo):
    err = excinfo.value.args[0]
    return err.code() if isinstance(err, KafkaError) else err


def describe(a, topic):
    res = ConfigResource(ResourceType.TOPIC, topic)
    return a.describe_configs([res], request_timeout=T)[res].result(timeout=T)


def test_create_list_describe_delete(node, topic_name):
    a = ck.admin(node.bootstrap)
    create(a, topic_name, 3)
    md = ck.wait_for_topic(node.bootstrap, topic_name, 3)

    brokers = md.brokers
    assert list(brokers) == [1], f"brokers {brokers}"
    assert f"{brokers[1].host}:{brokers[1].port}" == node.bootstrap
    t = md.topics[topic_name]
    assert sorted(t.partitions) == [0, 1, 2]
    for pid, p in t.partitions.items():
        assert (p.leader, list(p.replicas), list(p.isrs)) == (1, [1], [1]), f"partition {pid}: {p}"
        assert p.error is None

    all_topics = a.list_topics(timeout=10).topics
    assert topic_name in all_topics

    fs = a.delete_topics([topic_name], operation_timeout=T, request_timeout=T)
    fs[topic_name].result(timeout=T)
    deadline = time.monotonic() + T
    while topic_name in a.list_topics(timeout=10).topics:
        assert time.monotonic() < deadline, f"{topic_name} still listed {T}s after DeleteTopics"
        time.sleep(0.1)

    # The name can be used again, for a new, empty topic.
    create(a, topic_name, 2)
    ck.wait_for_topic(node.bootstrap, topic_name, 2)
    c = ck.Consumer({"bootstrap.servers": node.bootstrap, "group.id": "skiff-client-tests"})
    try:
        for p in range(2):
            assert c.get_watermark_offsets(ck.TopicPartition(topic_name, p), timeout=10) == (0, 0)
    finally:
        c.close()


def test_create_existing_topic_fails(node, topic_name):
    a = ck.admin(node.bootstrap)
    create(a, topic_name, 1)
    with pytest.raises(KafkaException) as e:
        create(a, topic_name, 1)
    assert error_code(e) == KafkaError.TOPIC_ALREADY_EXISTS, e.value


@pytest.mark.parametrize("bad", ["bad/name", "spaces are bad", ".", "..", "x" * 250])
def test_create_invalid_topic_name(node, bad):
    a = ck.admin(node.bootstrap)
    with pytest.raises(KafkaException) as e:
        create(a, bad, 1)
    assert error_code(e) == KafkaError.TOPIC_EXCEPTION, e.value


def test_create_validate_only(node, topic_name):
    a = ck.admin(node.bootstrap)
    create(a, topic_name, 4, validate_only=True)
    assert topic_name not in a.list_topics(timeout=10).topics


def test_delete_unknown_topic(node, topic_name):
    a = ck.admin(node.bootstrap)
    fs = a.delete_topics([topic_name], operation_timeout=T, request_timeout=T)
    with pytest.raises(KafkaException) as e:
        fs[topic_name].result(timeout=T)
    assert error_code(e) == KafkaError.UNKNOWN_TOPIC_OR_PART, e.value


def add_partitions(a, topic, count, assignment=None, validate_only=False):
    new = NewPartitions(topic, count) if assignment is None else NewPartitions(topic, count, assignment)
    fs = a.create_partitions([new],
                             operation_timeout=T, request_timeout=T, validate_only=validate_only)
    return fs[topic].result(timeout=T)


def test_create_partitions_grows_a_topic_that_keeps_its_data(node, topic_name):
    """CreatePartitions: the new partitions are listed, empty, writable and
    readable; the old ones keep their records; validate_only changes nothing."""
    a = ck.admin(node.bootstrap)
    create(a, topic_name, 2)
    ck.wait_for_topic(node.bootstrap, topic_name, 2)
    p = ck.producer(node.bootstrap)
    for i in range(10):
        ck.produce_bounded(p, topic=topic_name, partition=i % 2, value=f"old-{i}".encode())
    ck.flush(p)

    add_partitions(a, topic_name, 4, validate_only=True)
    assert len(a.list_topics(topic_name, timeout=10).topics[topic_name].partitions) == 2
    add_partitions(a, topic_name, 5)
    md = ck.wait_for_topic(node.bootstrap, topic_name, 5)
    for pid, part in md.topics[topic_name].partitions.items():
        assert (part.leader, list(part.replicas), list(part.isrs)) == (1, [1], [1]), f"partition {pid}: {part}"

    p = ck.producer(node.bootstrap)  # a client learns of new partitions on its next metadata refresh
    for i in range(15):
        ck.produce_bounded(p, topic=topic_name, partition=i % 5, value=f"new-{i}".encode())
    ck.flush(p)
    got = ck.consume_all(node.bootstrap, topic_name, 5, 25)
    values = {pid: [m.value().decode() for m in msgs] for pid, msgs in got.items()}
    assert values[0] == [f"old-{i}" for i in range(0, 10, 2)] + [f"new-{i}" for i in range(0, 15, 5)]
    assert values[4] == [f"new-{i}" for i in (4, 9, 14)]
    ck.assert_contiguous(got)


def test_create_partitions_errors(node, topic_name):
    a = ck.admin(node.bootstrap)
    create(a, topic_name, 3)
    ck.wait_for_topic(node.bootstrap, topic_name, 3)
    cases = [
        (topic_name, 3, None, KafkaError.INVALID_PARTITIONS),  # not higher
        (topic_name, 2, None, KafkaError.INVALID_PARTITIONS),  # fewer
        (topic_name, 5, [[1]], KafkaError.INVALID_REPLICA_ASSIGNMENT),  # one list for two partitions
        (topic_name, 4, [[1, 1]], KafkaError.INVALID_REPLICA_ASSIGNMENT),  # two replicas on a 1-replica topic
        (topic_name, 4, [[9]], KafkaError.INVALID_REPLICA_ASSIGNMENT),  # no such node
        (topic_name + "-missing", 4, None, KafkaError.UNKNOWN_TOPIC_OR_PART),
    ]
    for topic, count, assignment, code in cases:
        with pytest.raises(KafkaException) as e:
            add_partitions(a, topic, count, assignment)
        assert error_code(e) == code, (topic, count, assignment, e.value)
    with pytest.raises(KafkaException) as e:
        add_partitions(a, topic_name, 2)
    assert "has 3 partitions" in str(e.value), e.value
    assert len(a.list_topics(topic_name, timeout=10).topics[topic_name].partitions) == 3
    # A manual assignment on this node works.
    add_partitions(a, topic_name, 5, [[1], [1]])
    ck.wait_for_topic(node.bootstrap, topic_name, 5)


def test_describe_and_alter_configs(node, topic_name):
    a = ck.admin(node.bootstrap)
    create(a, topic_name, 1, config={"retention.ms": "3600000"})

    entries = describe(a, topic_name)
    assert entries["retention.ms"].value == "3600000"
    assert not entries["retention.ms"].is_default
    assert source_of(entries["retention.ms"]) == ConfigSource.DYNAMIC_TOPIC_CONFIG.value, entries["retention.ms"]
    for name in ("segment.bytes", "cleanup.policy", "max.message.bytes"):
        assert name in entries, f"{name} missing from DescribeConfigs: {sorted(entries)}"
    assert entries["cleanup.policy"].value == "delete"

    res = ConfigResource(
        ResourceType.TOPIC,
        topic_name,
        incremental_configs=[
            ConfigEntry("retention.ms", "7200000", incremental_operation=AlterConfigOpType.SET),
            ConfigEntry("segment.bytes", "2097152", incremental_operation=AlterConfigOpType.SET),
        ],
    )
    a.incremental_alter_configs([res], request_timeout=T)[res].result(timeout=T)
    entries = describe(a, topic_name)
    assert entries["retention.ms"].value == "7200000"
    assert entries["segment.bytes"].value == "2097152"

    res = ConfigResource(
        ResourceType.TOPIC,
        topic_name,
        incremental_configs=[ConfigEntry("retention.ms", None, incremental_operation=AlterConfigOpType.DELETE)],
    )
    a.incremental_alter_configs([res], request_timeout=T)[res].result(timeout=T)
    entries = describe(a, topic_name)
    assert entries["retention.ms"].is_default, entries["retention.ms"]
    assert entries["retention.ms"].value == "604800000"  # Kafka's default, 7 days
    assert entries["segment.bytes"].value == "2097152"

    # Survives nothing but the node: the override is visible through a new client too.
    entries = describe(ck.admin(node.bootstrap), topic_name)
    assert entries["segment.bytes"].value == "2097152"


def test_alter_configs_errors(node, topic_name):
    a = ck.admin(node.bootstrap)
    with pytest.raises(KafkaException) as e:
        describe(a, topic_name)  # no such topic
    assert error_code(e) == KafkaError.UNKNOWN_TOPIC_OR_PART, e.value

    create(a, topic_name, 1)
    res = ConfigResource(
        ResourceType.TOPIC,
        topic_name,
        incremental_configs=[ConfigEntry("retention.ms", "not-a-number", incremental_operation=AlterConfigOpType.SET)],
    )
    with pytest.raises(KafkaException) as e:
        a.incremental_alter_configs([res], request_timeout=T)[res].result(timeout=T)
    assert error_code(e) == KafkaError.INVALID_CONFIG, e.value
    assert describe(a, topic_name)["retention.ms"].is_default


def test_segment_bytes_override_rolls_segments(node, topic_name):
    """A topic's segment.bytes override takes effect: 3 MB in 1 MiB segments makes
    several segment files in the partition directory."""
    ck.create_topic(node.bootstrap, topic_name, 1, config={"segment.bytes": "1048576"})
    p = ck.producer(node.bootstrap)
    for i in range(30):
        p.produce(topic_name, value=os.urandom(100_000), partition=0)
        p.poll(0)
    ck.flush(p)
    part_dir = os.path.join(node.data_dir, f"{topic_name}-0")
    assert os.path.isdir(part_dir), f"no partition dir {part_dir}: {os.listdir(node.data_dir)}"
    logs = sorted(f for f in os.listdir(part_dir) if f.endswith(".log"))
    assert len(logs) >= 3, f"segment files in {part_dir}: {logs}"
    got = ck.consume_all(node.bootstrap, topic_name, 1, 30)
    ck.assert_contiguous(got)


def source_of(entry):
    s = entry.source
    return s.value if hasattr(s, "value") else int(s)
