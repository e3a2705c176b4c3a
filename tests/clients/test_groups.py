"""Consumer groups with real clients: confluent-kafka members sharing partitions
and taking over when one leaves, committed offsets that survive a node restart
and that kafka-python resumes from, `kcat -G`, `skiff group ...`, and members
that stop heartbeating (a raw-protocol member that goes silent, a consumer
process that is SIGKILLed) removed after their session timeout."""

import subprocess
import sys
import time

import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition
from kafka import KafkaConsumer
from kafka import TopicPartition as KpTopicPartition

import ck
import kafka_wire as kw

PARTITIONS = 4
# Short sessions keep the timeout tests quick; the node must allow them.
FAST = {"group.min.session.timeout.ms": "1000", "group.initial.rebalance.delay.ms": "100"}
SESSION_MS = 3000


def group_consumer(bootstrap, group, strategy="range,roundrobin", **extra):
    conf = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "session.timeout.ms": SESSION_MS,
        "heartbeat.interval.ms": 200,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "partition.assignment.strategy": strategy,
        "socket.timeout.ms": 10000,
        "fetch.wait.max.ms": 100,
    }
    conf.update(extra)
    return Consumer(conf)


def assigned(c):
    return sorted(tp.partition for tp in c.assignment())


def poll_until(consumers, cond, what, timeout_s=30.0, sink=None):
    """Polls every consumer in turn until cond() holds; messages go to `sink`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for c in consumers:
            m = c.poll(0.05)
            if m is not None and m.error() is None and sink is not None:
                sink.append((c, m))
        if cond():
            return
    raise AssertionError(f"timed out waiting for {what}: {[assigned(c) for c in consumers]}")


def produce_values(bootstrap, topic, start, n):
    p = ck.producer(bootstrap, {"acks": "all"})
    dr = ck.Deliveries()
    for i in range(start, start + n):
        ck.produce_bounded(p, topic=topic, value=b"v-%d" % i, partition=i % PARTITIONS, on_delivery=dr)
    ck.flush(p)
    assert not dr.errors and len(dr.ok) == n, dr.errors[:3]


@pytest.mark.parametrize("strategy", ["range", "roundrobin", "cooperative-sticky"])
def test_two_members_share_four_partitions_and_one_takes_over(node_factory, topic_name, strategy):
    node = node_factory(FAST)
    ck.create_topic(node.bootstrap, topic_name, PARTITIONS)
    produce_values(node.bootstrap, topic_name, 0, 40)
    group = f"share-{strategy}"
    c1 = group_consumer(node.bootstrap, group, strategy)
    c2 = group_consumer(node.bootstrap, group, strategy)
    try:
        c1.subscribe([topic_name])
        c2.subscribe([topic_name])
        got = []
        poll_until(
            [c1, c2],
            lambda: len(assigned(c1)) == 2 and len(assigned(c2)) == 2,
            "two partitions each",
            sink=got,
        )
        assert sorted(assigned(c1) + assigned(c2)) == [0, 1, 2, 3]
        poll_until([c1, c2], lambda: len(got) >= 40, "all 40 records", sink=got)
        # Each member only read its own partitions (none was read twice).
        keys = [(m.partition(), m.offset()) for _, m in got]
        assert len(set(keys)) == len(keys) == 40
        for c, m in got:
            assert m.partition() in assigned(c)

        # c1 leaves (LeaveGroup on close): c2 takes its partitions well within
        # the session timeout.
        c1.commit(asynchronous=False)
        c2.commit(asynchronous=False)
        started = time.monotonic()
        c1.close()
        c1 = None
        poll_until([c2], lambda: assigned(c2) == [0, 1, 2, 3], "c2 to own all four partitions")
        assert time.monotonic() - started < SESSION_MS / 1000, "took over only after a session timeout"
        # c2 resumes every partition from the commits: only new records come.
        produce_values(node.bootstrap, topic_name, 40, 8)
        more = []
        poll_until([c2], lambda: len(more) >= 8, "8 new records", sink=more)
        assert sorted(m.value() for _, m in more) == sorted(b"v-%d" % i for i in range(40, 48))
    finally:
        for c in (c1, c2):
            if c is not None:
                c.close()


def test_commits_survive_a_restart_and_kafka_python_resumes(node_factory, topic_name):
    node = node_factory(FAST)
    ck.create_topic(node.bootstrap, topic_name, PARTITIONS)
    produce_values(node.bootstrap, topic_name, 0, 100)
    group = "resume"
    c = group_consumer(node.bootstrap, group)
    try:
        c.subscribe([topic_name])
        got = []
        poll_until([c], lambda: len(got) >= 100, "100 records", sink=got)
        c.commit(asynchronous=False)
        committed = c.committed([TopicPartition(topic_name, p) for p in range(PARTITIONS)], timeout=10)
        assert [tp.offset for tp in committed] == [25] * PARTITIONS
    finally:
        c.close()
    produce_values(node.bootstrap, topic_name, 100, 20)

    node.restart(kill=True)
    ck.wait_for_topic(node.bootstrap, topic_name, PARTITIONS)

    kc = KafkaConsumer(
        topic_name,
        bootstrap_servers=[node.bootstrap],
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        session_timeout_ms=SESSION_MS,
        heartbeat_interval_ms=300,
        request_timeout_ms=20000,
        fetch_max_wait_ms=100,
    )
    try:
        seen = []
        deadline = time.monotonic() + 60
        while len(seen) < 20 and time.monotonic() < deadline:
            for _, recs in kc.poll(timeout_ms=300).items():
                seen += [r.value for r in recs]
        for _ in range(5):  # nothing older may follow
            for _, recs in kc.poll(timeout_ms=200).items():
                seen += [r.value for r in recs]
        assert sorted(seen) == sorted(b"v-%d" % i for i in range(100, 120)), seen[:10]
        offsets = [kc.committed(KpTopicPartition(topic_name, p)) for p in range(PARTITIONS)]
        assert offsets == [25] * PARTITIONS
        kc.commit()
    finally:
        kc.close()
    # kafka-python's commits are visible to the others, and to `skiff group describe`.
    out = node.cli("group", "describe", group).stdout.decode()
    rows = [line.split("\t") for line in out.splitlines() if line.startswith(topic_name)]
    assert sorted((int(r[1]), r[2], r[3], r[4]) for r in rows) == [(p, "30", "30", "0") for p in range(PARTITIONS)], out


def test_kcat_group_consumes_and_skiff_group_commands(node_factory, topic_name):
    kcat = __import__("shutil").which("kcat")
    if kcat is None:
        pytest.skip("kcat not installed")
    node = node_factory(FAST)
    ck.create_topic(node.bootstrap, topic_name, 2)
    p = ck.producer(node.bootstrap)
    for i in range(30):
        ck.produce_bounded(p, topic=topic_name, value=b"line-%d" % i, partition=i % 2)
    ck.flush(p)

    def kcat_group():
        cmd = [kcat, "-b", node.bootstrap, "-G", "kgroup", "-X", "auto.offset.reset=earliest",
               "-X", "session.timeout.ms=6000", "-e", "-q", "-f", "%p %o %s\n", topic_name]
        r = subprocess.run(cmd, capture_output=True, timeout=60)
        assert r.returncode == 0, r.stderr.decode(errors="replace")[-2000:]
        return [line for line in r.stdout.decode().splitlines() if line]

    lines = kcat_group()
    assert sorted(int(line.split()[2].split("-")[1]) for line in lines) == list(range(30))
    # kcat committed on exit: a second run of the group has nothing left to read.
    assert kcat_group() == []

    listed = node.cli("group", "list").stdout.decode()
    assert "kgroup\tconsumer\tEmpty" in listed, listed
    described = node.cli("group", "describe", "kgroup").stdout.decode()
    assert "State: Empty" in described, described
    rows = sorted(line.split("\t")[:5] for line in described.splitlines() if line.startswith(topic_name))
    assert rows == [[topic_name, "0", "15", "15", "0"], [topic_name, "1", "15", "15", "0"]], described
    assert b"Deleted group kgroup." in node.cli("group", "delete", "kgroup").stdout
    assert "kgroup" not in node.cli("group", "list").stdout.decode()
    gone = node.cli("group", "delete", "kgroup", check=False)
    assert gone.returncode != 0 and b"GroupIdNotFound (error code 69)" in gone.stderr, gone.stderr
    # Deleted with its offsets: the group starts over from the beginning.
    assert len(kcat_group()) == 30


def test_silent_raw_member_is_removed_and_the_others_rebalance(node_factory, topic_name):
    node = node_factory(FAST)
    ck.create_topic(node.bootstrap, topic_name, PARTITIONS)
    group = "silent"
    with kw.Conn(node.bootstrap) as raw:
        assert kw.find_coordinator(raw, group) == (0, 1)
        err, gen, proto, leader, member, members = kw.join_group(raw, group, "", [topic_name], session_timeout_ms=2000)
        assert (err, gen, leader) == (0, 1, member) and members == [member]
        err, assignment = kw.sync_group(raw, group, gen, member, {member: {topic_name: [0, 1, 2, 3]}})
        assert err == 0 and assignment == kw.consumer_assignment({topic_name: [0, 1, 2, 3]})
        assert kw.heartbeat(raw, group, gen, member) == 0
        # From here the raw member says nothing (its connection stays open).
        started = time.monotonic()
        c = group_consumer(node.bootstrap, group)
        try:
            c.subscribe([topic_name])
            poll_until([c], lambda: assigned(c) == [0, 1, 2, 3], "the consumer to get every partition")
            took = time.monotonic() - started
            assert took >= 1.5, f"the silent member was dropped after {took:.1f}s, before its 2 s session"
            assert kw.heartbeat(raw, group, gen, member) == kw.ERR_UNKNOWN_MEMBER_ID
            described = node.cli("group", "describe", group).stdout.decode()
            assert "State: Stable" in described and "Members: 1" in described, described
        finally:
            c.close()


CHILD = r"""
import sys, time
from confluent_kafka import Consumer
c = Consumer({"bootstrap.servers": sys.argv[1], "group.id": sys.argv[2], "session.timeout.ms": 3000,
              "heartbeat.interval.ms": 200, "auto.offset.reset": "earliest"})
c.subscribe([sys.argv[3]])
announced = False
while True:
    c.poll(0.1)
    if not announced and len(c.assignment()) == 2:
        print("assigned", flush=True)
        announced = True
"""


def test_sigkilled_consumer_is_removed_after_its_session_timeout(node_factory, topic_name):
    node = node_factory(FAST)
    ck.create_topic(node.bootstrap, topic_name, PARTITIONS)
    group = "killed"
    survivor = group_consumer(node.bootstrap, group)
    child = subprocess.Popen([sys.executable, "-c", CHILD, node.bootstrap, group, topic_name],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        survivor.subscribe([topic_name])
        # Wait until the two share the partitions (the child says when it has two).
        poll_until([survivor], lambda: len(assigned(survivor)) == 2, "two partitions each", timeout_s=40)
        line = child.stdout.readline()
        assert line.strip() == b"assigned", line
        child.kill()
        child.wait(timeout=10)
        killed = time.monotonic()
        poll_until([survivor], lambda: assigned(survivor) == [0, 1, 2, 3], "the survivor to own every partition")
        took = time.monotonic() - killed
        assert took >= 2.0, f"took over after {took:.1f}s, before the killed member's 3 s session could expire"
    finally:
        if child.poll() is None:
            child.kill()
        survivor.close()


def test_static_member_restart_gets_its_partitions_back(node_factory, topic_name):
    """group.instance.id (KIP-345): a static member that restarts within its
    session timeout takes its place back under a new member id."""
    node = node_factory(FAST)
    ck.create_topic(node.bootstrap, topic_name, PARTITIONS)
    group = "static"
    c1 = group_consumer(node.bootstrap, group, **{"group.instance.id": "one", "session.timeout.ms": 10000})
    c2 = group_consumer(node.bootstrap, group, **{"group.instance.id": "two", "session.timeout.ms": 10000})
    try:
        c1.subscribe([topic_name])
        c2.subscribe([topic_name])
        poll_until([c1, c2], lambda: len(assigned(c1)) == 2 and len(assigned(c2)) == 2, "two partitions each")
        before = (assigned(c1), assigned(c2))
        c1.close()  # a static member does not leave the group on close
        c1 = group_consumer(node.bootstrap, group, **{"group.instance.id": "one", "session.timeout.ms": 10000})
        c1.subscribe([topic_name])
        started = time.monotonic()
        poll_until([c1, c2], lambda: len(assigned(c1)) == 2 and len(assigned(c2)) == 2, "the restarted member's partitions")
        assert (assigned(c1), assigned(c2)) == before
        assert time.monotonic() - started < 10, "waited for the old member's session to expire"
        described = node.cli("group", "describe", group).stdout.decode()
        assert "Members: 2" in described, described
    finally:
        for c in (c1, c2):
            c.close()


def committed(bootstrap, group, topic, partitions):
    c = group_consumer(bootstrap, group)
    try:
        got = c.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)
        return {tp.partition: tp.offset for tp in got}
    finally:
        c.close()


def test_reset_and_delete_offsets(node_factory, topic_name):
    """`skiff group reset-offsets` (a dry run, then --execute: earliest,
    latest, an offset, a shift, a timestamp) on an inactive group; refused while
    a member is live. OffsetDelete (kafka-python's delete_group_offsets and
    `skiff group delete-offsets`): refused for a topic a live member subscribes
    to, allowed for another topic and once the group is empty."""
    from kafka.admin import KafkaAdminClient

    node = node_factory(FAST)
    ck.create_topic(node.bootstrap, topic_name, 2)
    ck.create_topic(node.bootstrap, topic_name + "-other", 1)
    p = ck.producer(node.bootstrap)
    for i in range(20):
        ck.produce_bounded(p, topic=topic_name, value=b"v-%d" % i, partition=i % 2)
    ck.flush(p)
    middle = int(time.time() * 1000)
    time.sleep(0.05)
    for i in range(20, 30):
        ck.produce_bounded(p, topic=topic_name, value=b"v-%d" % i, partition=i % 2)
    ck.flush(p)
    group = f"{topic_name}-g"
    c = group_consumer(node.bootstrap, group)
    c.subscribe([topic_name])
    seen = []
    poll_until([c], lambda: len(seen) >= 30, "30 records", sink=seen)
    c.commit(asynchronous=False)
    assert committed(node.bootstrap, group, topic_name, 2) == {0: 15, 1: 15}

    live = node.cli("group", "reset-offsets", group, "--topic", topic_name, "--to-earliest", "--execute", check=False)
    assert live.returncode != 0 and b"no members" in live.stderr, live.stderr
    refused = node.cli("group", "delete-offsets", group, "--topic", topic_name, check=False)
    assert refused.returncode != 0 and b"GroupSubscribedToTopic" in refused.stdout, (refused.stdout, refused.stderr)
    # A topic nobody in the group subscribes to: allowed while it is live.
    node.cli("group", "delete-offsets", group, "--topic", topic_name + "-other")
    c.close()

    out = node.cli("group", "reset-offsets", group, "--topic", topic_name, "--to-earliest").stdout.decode()
    assert "dry run" in out and f"{topic_name}\t0\t15\t0" in out, out
    assert committed(node.bootstrap, group, topic_name, 2) == {0: 15, 1: 15}
    cases = [
        (["--to-earliest"], {0: 0, 1: 0}),
        (["--to-latest"], {0: 15, 1: 15}),
        (["--to-offset", "7", "--partition", "1"], {0: 15, 1: 7}),
        (["--shift-by", "-3"], {0: 12, 1: 4}),
        (["--shift-by", "100"], {0: 15, 1: 15}),
        (["--to-offset", "-5"], {0: 0, 1: 0}),
        (["--to-timestamp", str(middle)], {0: 10, 1: 10}),
    ]
    for args, want in cases:
        node.cli("group", "reset-offsets", group, "--topic", topic_name, *args, "--execute")
        assert committed(node.bootstrap, group, topic_name, 2) == want, args
    node.cli("group", "seek", group, "--topic", topic_name, "--to-latest", "--execute")
    assert committed(node.bootstrap, group, topic_name, 2) == {0: 15, 1: 15}
    bad = node.cli("group", "reset-offsets", group, "--topic", topic_name, check=False)
    assert bad.returncode != 0 and b"say where to" in bad.stderr, bad.stderr
    bad = node.cli("group", "reset-offsets", group, "--topic", topic_name, "--partition", "9", "--to-earliest",
                   check=False)
    assert bad.returncode != 0 and b"no partition 9" in bad.stderr, bad.stderr

    # The group is empty now: its offsets can go (kafka-python, then the CLI).
    a = KafkaAdminClient(bootstrap_servers=node.bootstrap, request_timeout_ms=30000)
    try:
        result = a.delete_group_offsets(group, [KpTopicPartition(topic_name, 0)])
        assert all(not getattr(v, "errno", 0) for v in (result.values() if isinstance(result, dict) else [])), result
    finally:
        a.close()
    assert committed(node.bootstrap, group, topic_name, 2) == {0: -1001, 1: 15}
    out = node.cli("group", "delete-offsets", group, "--topic", topic_name).stdout.decode()
    assert "(2 partitions)" in out, out
    assert committed(node.bootstrap, group, topic_name, 2) == {0: -1001, 1: -1001}
    # Deleted for good: a restart reads the tombstones.
    node.restart()
    assert committed(node.bootstrap, group, topic_name, 2) == {0: -1001, 1: -1001}
    missing = node.cli("group", "delete-offsets", group + "-none", "--topic", topic_name, check=False)
    assert missing.returncode != 0 and b"GroupIdNotFound" in missing.stderr, missing.stderr
