"""Moving replicas (KIP-455) across `skiff node` processes: kafka-python's
AdminClient starts, lists and cancels reassignments (and gets Kafka's errors);
a three-node cluster grows to four, `skiff partition plan | reassign` moves
replicas onto the new node while an idempotent acks=all producer writes, then
`skiff node drain | remove` empties a node and takes it out; no acknowledged
write is lost or duplicated, and the moved-off replicas' files are gone."""

import json
import os
import threading
import time

import pytest
from confluent_kafka import KafkaError
from kafka import KafkaAdminClient, TopicPartition
from kafka.errors import (
    InvalidReplicationAssignmentError,
    NoReassignmentInProgressError,
    RequestTimedOutError,
    UnknownTopicOrPartitionError,
)

import ck
from cluster import WAIT_S, cluster_factory  # noqa: F401 (fixture)
from test_replication import REPLICATED, describe, read_all, wait_partition


def kp_admin(bootstrap):
    return KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30000)


def test_kafka_python_starts_lists_and_cancels_a_reassignment(cluster_factory, topic_name):
    c = cluster_factory(size=3, settings=REPLICATED)
    ck.create_topic(c.node(1).bootstrap, topic_name, 1, replication_factor=2)
    first = wait_partition(c.bootstrap, topic_name, lambda d: len(d[0][2]) == 2, "an ISR of 2")
    replicas = first[0][1]
    spare = ({1, 2, 3} - set(replicas)).pop()
    keep = replicas[0]
    tp = TopicPartition(topic_name, 0)

    def admin_call(f):
        """f(admin) on a fresh client over the live nodes (kafka-python keeps
        the controller it first learnt, which may be stopped), retried while
        the answer is a retriable timeout (a controller election)."""
        deadline = time.monotonic() + WAIT_S
        while True:
            admin = kp_admin(",".join(n.bootstrap for n in c.nodes if n.alive()))
            try:
                result = f(admin)
            finally:
                admin.close()
            if RequestTimedOutError not in (result.values() if isinstance(result, dict) else ()) \
                    or time.monotonic() > deadline:
                return result
            time.sleep(0.5)

    def alter(reassignments):
        return admin_call(lambda a: a.alter_partition_reassignments(reassignments))

    def listed():
        return admin_call(lambda a: a.list_partition_reassignments())

    # Errors first: an unknown node, an unknown partition, nothing to cancel.
    assert alter({tp: [keep, 9]})[tp] is InvalidReplicationAssignmentError
    ghost = TopicPartition(topic_name, 7)
    assert alter({ghost: [1]})[ghost] is UnknownTopicOrPartitionError
    assert alter({tp: None})[tp] is NoReassignmentInProgressError

    # The spare node stopped: the move cannot finish and stays listed.
    c.node(spare).stop()
    wait_partition(c.bootstrap, topic_name, lambda d: d[0][0] > 0, "a leader")
    deadline = time.monotonic() + WAIT_S
    while spare in ck.admin(c.bootstrap).list_topics(timeout=10).brokers:
        assert time.monotonic() < deadline, f"node {spare} still listed after it stopped"
        time.sleep(0.2)  # fenced once its session expires
    assert alter({tp: [keep, spare]})[tp] is None
    ongoing = listed()
    assert tp in ongoing, ongoing
    ongoing = ongoing[tp]
    assert ongoing["adding_replicas"] == [spare], ongoing
    assert ongoing["removing_replicas"] == [replicas[1]], ongoing
    assert ongoing["replicas"] == [keep, spare, replicas[1]], ongoing
    leader, now, isr = describe(c.bootstrap, topic_name)[0]
    assert sorted(now) == sorted([keep, spare, replicas[1]]) and spare not in isr
    # Cancelled: back to the original replicas.
    assert alter({tp: None})[tp] is None
    assert listed() == {}
    assert describe(c.bootstrap, topic_name)[0][1] == replicas

    # With the spare node back the same move completes.
    c.node(spare).start()
    assert alter({tp: [keep, spare]})[tp] is None
    wait_partition(
        c.bootstrap, topic_name,
        lambda d: d[0][1] == [keep, spare] and sorted(d[0][2]) == sorted([keep, spare]),
        "moved to the spare node",
    )
    assert listed() == {}
    # The replica that left deleted its files.
    gone = os.path.join(c.node(replicas[1]).data_dir, f"{topic_name}-0")
    deadline = time.monotonic() + WAIT_S
    while os.path.exists(gone) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not os.path.exists(gone), f"{gone} is still there"


class Writer:
    """An idempotent acks=all producer writing to every partition of a topic
    until stopped: what it acknowledged, by partition."""

    def __init__(self, bootstrap, topic, partitions):
        self.acked = {}  # (partition, value) -> offset
        self.errors = []
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self.run, args=(bootstrap, topic, partitions))
        self.thread.start()

    def on_delivery(self, err, msg):
        # librdkafka acknowledges a write whose own answer was "possibly
        # persisted" once a later write of the same producer succeeds, with
        # no offset (None): it must be in the log all the same.
        if err is None:
            self.acked[(msg.partition(), msg.value())] = msg.offset()
        else:
            self.errors.append(err)

    def run(self, bootstrap, topic, partitions):
        p = ck.producer(bootstrap, {
            "acks": "all", "enable.idempotence": True, "linger.ms": 5,
            "message.timeout.ms": 120000, "retry.backoff.ms": 100,
        })
        i = 0
        while not self.stop_event.is_set():
            try:
                p.produce(topic, value=b"v%08d" % i, partition=i % partitions, on_delivery=self.on_delivery)
                i += 1
            except BufferError:
                pass
            p.poll(0.002)
        assert p.flush(150) == 0, "messages still undelivered"

    def stop(self):
        self.stop_event.set()
        self.thread.join(timeout=180)


def cli(c, *args, timeout=120, check=True):
    return c.node(2).cli(*args, timeout=timeout, check=check)


def replica_counts(d):
    counts = {}
    for _, replicas, _ in d.values():
        for r in replicas:
            counts[r] = counts.get(r, 0) + 1
    return counts


def test_grow_rebalance_drain_and_remove_under_load(cluster_factory, topic_name, tmp_path):
    partitions = 4
    c = cluster_factory(size=3, settings=REPLICATED)
    ck.create_topic(c.node(1).bootstrap, topic_name, partitions, replication_factor=3)
    wait_partition(c.bootstrap, topic_name, lambda d: all(len(v[2]) == 3 for v in d.values()), "full ISRs")
    writer = Writer(c.bootstrap, topic_name, partitions)
    try:
        time.sleep(1.0)
        # Grow: node 4 joins and gets its share.
        c.add_broker()
        plan_path = tmp_path / "plan.json"
        deadline = time.monotonic() + WAIT_S
        while True:
            out = cli(c, "partition", "plan", "--topic", topic_name).stdout.decode()
            plan = json.loads(out)
            if any(4 in p["replicas"] for p in plan["partitions"]) or time.monotonic() > deadline:
                break
            time.sleep(0.5)  # node 4 not in the metadata yet
        assert plan["version"] == 1 and plan["partitions"], out
        plan_path.write_text(out)
        # Under a (generous) throttle, as an operator would move data.
        started = cli(c, "partition", "reassign", "--plan", str(plan_path),
                      "--throttle", "20000000").stdout.decode()
        assert "Current assignment" in started and "moving" in started, started
        deadline = time.monotonic() + 90
        while (done := cli(c, "partition", "reassign", "--verify", str(plan_path), check=False)).returncode != 0:
            assert time.monotonic() < deadline, done.stdout
            time.sleep(0.5)
        assert b"Replication throttles removed." in done.stdout, done.stdout
        d = wait_partition(c.bootstrap, topic_name, lambda d: all(len(v[2]) == 3 for v in d.values()), "full ISRs after the move")
        assert replica_counts(d) == {1: 3, 2: 3, 3: 3, 4: 3}, d
        # A balanced cluster needs no plan.
        again = json.loads(cli(c, "partition", "plan", "--topic", topic_name).stdout)
        assert again["partitions"] == [], again

        # Drain node 3 (the command waits for the moves), stop it, remove it.
        drained = cli(c, "node", "drain", "3", timeout=300).stdout.decode()
        assert "holds no replica now" in drained, drained
        d = wait_partition(c.bootstrap, topic_name, lambda d: all(len(v[2]) == 3 for v in d.values()), "full ISRs after the drain")
        assert all(3 not in replicas for _, replicas, _ in d.values()), d
        refused = cli(c, "node", "remove", "3", check=False)
        assert refused.returncode != 0 and b"stop it" in refused.stderr, refused.stderr
        c.node(3).stop()
        deadline = time.monotonic() + WAIT_S
        while cli(c, "node", "remove", "3", check=False).returncode != 0:
            assert time.monotonic() < deadline, "node 3 was never removable"
            time.sleep(0.5)
        md = ck.admin(c.bootstrap).list_topics(timeout=10)
        assert sorted(md.brokers) == [1, 2, 4], md.brokers
        time.sleep(1.0)
    finally:
        writer.stop()
    assert not [e for e in writer.errors if e.code() != KafkaError._MSG_TIMED_OUT], writer.errors[:5]
    assert len(writer.acked) > 200, f"only {len(writer.acked)} writes acknowledged"
    # Every acknowledged record, exactly once, at its acknowledged offset.
    for part in range(partitions):
        got = read_all(c.bootstrap, topic_name, partition=part)
        by_value = {}
        for offset, value in got:
            assert value not in by_value, f"p{part}: {value!r} at {by_value[value]} and {offset}"
            by_value[value] = offset
        for (p, value), offset in writer.acked.items():
            if p == part:
                assert value in by_value, f"p{part}: {value!r} acknowledged at {offset}, not in the log"
                if offset is not None:
                    assert by_value[value] == offset, f"p{part}: {value!r} acknowledged at {offset}, read at {by_value[value]}"


def test_reassign_cli_refuses_bad_plans(cluster_factory, topic_name, tmp_path):
    c = cluster_factory(size=3, settings=REPLICATED)
    ck.create_topic(c.node(1).bootstrap, topic_name, 1, replication_factor=3)
    bad = tmp_path / "bad.json"
    for text, needle in [
        ("not json", b"is not a reassignment plan"),
        ('{"version":1,"partitions":[{"topic":"%s","partition":0,"replicas":[1,1]}]}' % topic_name, b"twice"),
        ('{"version":1,"partitions":[{"topic":"%s","partition":0,"replicas":[1,9]}]}' % topic_name, b"not registered"),
        ('{"version":1,"partitions":[{"topic":"%s","partition":5,"replicas":[1]}]}' % topic_name, b"does not exist"),
    ]:
        bad.write_text(text)
        p = cli(c, "partition", "reassign", "--plan", str(bad), check=False)
        assert p.returncode != 0, text
        assert needle in p.stderr + p.stdout, (text, p.stdout, p.stderr)
    p = cli(c, "partition", "reassign", check=False)
    assert p.returncode != 0 and b"required" in p.stderr
    p = cli(c, "node", "remove", "9", check=False)
    assert p.returncode != 0 and b"9" in p.stderr
    p = cli(c, "node", "drain", "9", check=False)
    assert p.returncode != 0 and b"node 9 is not in the cluster" in p.stderr, p.stderr
    p = cli(c, "partition", "plan", "--nodes", "1", "--topic", topic_name, check=False)
    assert p.returncode != 0 and b"3 replicas cannot be placed on 1 nodes" in p.stderr, p.stderr
    p = cli(c, "partition", "reassign", "--verify", str(tmp_path / "missing.json"), check=False)
    assert p.returncode != 0 and b"reading the plan" in p.stderr, p.stderr
    p = cli(c, "partition", "reassign", "--list", "--throttle", "5", check=False)
    assert p.returncode != 0 and b"--plan" in p.stderr, p.stderr


def metric(node, name):
    total = 0.0
    for line in node.http_get("/metrics")[1].splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_a_throttled_move_under_load_keeps_to_its_rate(cluster_factory, topic_name):
    """kafka-python sets the throttle (dynamic broker and topic configs) and
    starts the move while an acks=all producer writes; the new replica copies
    6 MiB no faster than the rate allows, and nothing acknowledged is lost."""
    from kafka.admin import ConfigResource, ConfigResourceType

    c = cluster_factory(size=3, settings=REPLICATED)
    ck.create_topic(c.node(1).bootstrap, topic_name, 1, replication_factor=2)
    leader, replicas, _ = wait_partition(c.bootstrap, topic_name, lambda d: len(d[0][2]) == 2, "an ISR of 2")[0]
    spare = ({1, 2, 3} - set(replicas)).pop()
    # 6 MiB of records for the new replica to copy.
    p = ck.producer(c.bootstrap, {"acks": "all", "linger.ms": 20})
    value = os.urandom(16 * 1024)
    for i in range(384):
        ck.produce_bounded(p, topic=topic_name, partition=0, value=value + b"%06d" % i)
    ck.flush(p)
    size = 384 * len(value)
    rate = 1 << 20
    tp = TopicPartition(topic_name, 0)
    admin = kp_admin(c.bootstrap)
    writer = Writer(c.bootstrap, topic_name, 1)
    try:
        leader_bytes = metric(c.node(leader), "skiff_replication_throttled_leader_bytes_total")
        # Per node, as kafka-python names broker resources (the cluster-wide
        # default, resource name "", is what `skiff partition reassign
        # --throttle` sets).
        result = admin.alter_configs(raise_on_unknown=False, config_resources=[
            ConfigResource(ConfigResourceType.BROKER, str(n), configs={
                "leader.replication.throttled.rate": str(rate),
                "follower.replication.throttled.rate": str(rate),
            })
            for n in (1, 2, 3)
        ] + [
            ConfigResource(ConfigResourceType.TOPIC, topic_name, configs={
                "leader.replication.throttled.replicas": ",".join(f"0:{r}" for r in replicas),
                "follower.replication.throttled.replicas": f"0:{spare}",
            }),
        ])
        assert "Error" not in repr(result) or "NoError" in repr(result), result
        started = time.monotonic()
        assert admin.alter_partition_reassignments({tp: replicas + [spare]})[tp] is None
        while admin.list_partition_reassignments():
            assert time.monotonic() - started < 120, "the move never completed"
            time.sleep(0.2)
        elapsed = time.monotonic() - started
        moved = metric(c.node(leader), "skiff_replication_throttled_leader_bytes_total") - leader_bytes
        print(f"throttled move: {size} bytes at {rate} B/s took {elapsed:.1f}s "
              f"({size / elapsed / 1e6:.2f} MB/s; {moved:.0f} throttled bytes counted)")
        # One second of budget per side and up to one fetch (1 MiB) over it:
        # the rest waits for the rate.
        assert elapsed >= (size - 2 * (1 << 20)) / rate, f"{elapsed:.1f}s is faster than {rate} B/s allows"
        assert moved >= size * 0.9, f"only {moved} bytes counted against the throttle"
        wait_partition(c.bootstrap, topic_name, lambda d: sorted(d[0][2]) == sorted(replicas + [spare]),
                       "the new replica in the ISR")
        # The throttle goes away again (and describes as gone).
        described = repr(admin.describe_configs([ConfigResource(ConfigResourceType.BROKER, str(leader))]))
        assert "leader.replication.throttled.rate" in described, described
        admin.alter_configs(raise_on_unknown=False, config_resources=[
            ConfigResource(ConfigResourceType.BROKER, str(n), configs={
                "leader.replication.throttled.rate": ("DELETE", None),
                "follower.replication.throttled.rate": ("DELETE", None),
            })
            for n in (1, 2, 3)
        ])
        described = repr(admin.describe_configs([ConfigResource(ConfigResourceType.BROKER, str(leader))]))
        assert "throttled.rate" not in described, described
        time.sleep(0.5)
    finally:
        writer.stop()
        admin.close()
    assert not [e for e in writer.errors if e.code() != KafkaError._MSG_TIMED_OUT], writer.errors[:5]
    got = {v: o for o, v in read_all(c.bootstrap, topic_name)}
    for (_, v), offset in writer.acked.items():
        assert v in got and (offset is None or got[v] == offset), (v, offset, got.get(v))
    assert len(writer.acked) > 50, f"only {len(writer.acked)} writes acknowledged during the move"

