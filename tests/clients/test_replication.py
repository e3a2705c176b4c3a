"""Replication across three `skiff node` processes: RF=3, min.insync.replicas=2,
acks=all. The partition leader is SIGKILLed again and again under an idempotent
producer and nothing acknowledged is lost or duplicated; two of three down
refuses acks=all; a stopped follower leaves the ISR and rejoins; an old leader's
unreplicated tail is truncated when it comes back; a follower that was down
while the leader's retention deleted past its log end starts over at the
leader's log start and rejoins."""

import glob
import json
import os
import signal
import subprocess
import threading
import time

from confluent_kafka import KafkaError

import ck
import kafka_wire as kw
from cluster import WAIT_S, cluster_factory, produce_keys  # noqa: F401 (fixture)
from conftest import REPO, Node, _live_nodes

SKIFF_TOOLS = os.environ.get("SKIFF_TOOLS_BIN", str(REPO / "target" / "debug" / "skiff-tools"))

REPLICATED = {
    "broker.session.timeout.ms": "1500",
    "broker.heartbeat.interval.ms": "200",
    "replica.lag.time.max.ms": "3000",
    "min.insync.replicas": "2",
    "default.replication.factor": "3",
}
ERR_NOT_ENOUGH_REPLICAS = 19


def describe(bootstrap, topic):
    """{partition: (leader, replicas, isr)} from Metadata."""
    md = ck.admin(bootstrap).list_topics(topic=topic, timeout=10)
    return {p.id: (p.leader, list(p.replicas), list(p.isrs)) for p in md.topics[topic].partitions.values()}


def wait_partition(bootstrap, topic, pred, what, timeout_s=WAIT_S):
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        try:
            last = describe(bootstrap, topic)
            if pred(last):
                return last
        except Exception as e:  # a node coming or going
            last = e
        time.sleep(0.2)
    raise AssertionError(f"{topic}: never {what}; last {last!r}")


def alive_bootstrap(c):
    return ",".join(n.bootstrap for n in c.nodes if n.alive())


def replica_batches(node, topic, partition, below):
    """(base offset, last offset, crc) of every batch of a node's replica that
    ends below `below`, read offline with skiff-tools dump-log."""
    pdir = os.path.join(node.data_dir, f"{topic}-{partition}")
    out = []
    for seg in sorted(glob.glob(os.path.join(pdir, "*.log"))):
        p = subprocess.run([SKIFF_TOOLS, "dump-log", "--json", seg], capture_output=True, timeout=60)
        assert p.returncode == 0, p.stderr.decode(errors="replace")
        for line in p.stdout.decode().splitlines():
            row = json.loads(line)
            if "baseOffset" in row and row.get("lastOffset", -1) < below:
                out.append((row["baseOffset"], row["lastOffset"], row.get("crc")))
    return out


def test_acknowledged_writes_survive_ten_leader_kills(cluster_factory, topic_name):
    c = cluster_factory(size=3, settings=REPLICATED)
    ck.create_topic(c.node(1).bootstrap, topic_name, 1, replication_factor=3)
    wait_partition(c.bootstrap, topic_name, lambda d: len(d[0][2]) == 3, "an ISR of 3")

    acked = {}  # value -> offset
    errors = []
    stop = threading.Event()

    def on_delivery(err, msg):
        if err is None:
            acked[msg.value()] = msg.offset()
        else:
            errors.append(err)

    def produce():
        p = ck.producer(c.bootstrap, {
            "acks": "all", "enable.idempotence": True, "linger.ms": 5,
            "message.timeout.ms": 120000, "retry.backoff.ms": 100,
        })
        i = 0
        while not stop.is_set():
            try:
                p.produce(topic_name, value=b"v%08d" % i, partition=0, on_delivery=on_delivery)
                i += 1
            except BufferError:
                pass
            p.poll(0.002)
        assert p.flush(150) == 0, "messages still undelivered"

    writer = threading.Thread(target=produce)
    writer.start()
    try:
        for round_ in range(10):
            time.sleep(1.0)
            leader = wait_partition(alive_bootstrap(c), topic_name, lambda d: d[0][0] > 0, "a leader")[0][0]
            before = len(acked)
            c.node(leader).kill()
            wait_partition(alive_bootstrap(c), topic_name, lambda d: d[0][0] not in (-1, leader), f"a new leader after killing {leader}")
            c.node(leader).start()
            # Back in the ISR before the next kill, so two replicas always hold the data.
            wait_partition(c.bootstrap, topic_name, lambda d: len(d[0][2]) == 3, f"node {leader} back in the ISR (round {round_})", timeout_s=60)
            assert len(acked) >= before, "acknowledgements went backwards?"
    finally:
        stop.set()
        writer.join(timeout=180)
    assert not [e for e in errors if e.code() != KafkaError._MSG_TIMED_OUT], errors[:5]
    assert len(acked) > 100, f"only {len(acked)} writes acknowledged in 10 rounds"

    # Every acknowledged record, exactly once, at its acknowledged offset.
    hw = max(acked.values()) + 1
    got = read_all(c.bootstrap, topic_name)
    by_value = {}
    for offset, value in got:
        assert value not in by_value, f"{value!r} at {by_value.get(value)} and {offset}"
        by_value[value] = offset
    for value, offset in acked.items():
        assert by_value.get(value) == offset, f"{value!r} acknowledged at {offset}, read at {by_value.get(value)}"

    # Every replica's log agrees up to the high watermark.
    for n in c.nodes:
        n.stop()
    logs = [replica_batches(n, topic_name, 0, hw) for n in c.nodes]
    assert logs[0] and logs[0] == logs[1] == logs[2], "replicas differ below the high watermark"


def read_all(bootstrap, topic, timeout_s=60, partition=0):
    """(offset, value) of every record of a partition, through the leader."""
    from confluent_kafka import Consumer, TopicPartition

    cons = Consumer({
        "bootstrap.servers": bootstrap, "group.id": "replication-check", "enable.auto.commit": False,
        "enable.partition.eof": True, "auto.offset.reset": "earliest",
    })
    out = []
    try:
        cons.assign([TopicPartition(topic, partition, 0)])
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            m = cons.poll(0.5)
            if m is None:
                continue
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF:
                    return out
                continue
            out.append((m.offset(), m.value()))
        raise AssertionError(f"did not reach the end of {topic} in {timeout_s}s ({len(out)} records)")
    finally:
        cons.close()


def test_two_of_three_down_refuses_acks_all(cluster_factory, topic_name):
    # The controller apart: killing two brokers must not take the quorum
    # with them (in combined mode it would, and no ISR change could commit).
    c = cluster_factory(controllers=1, brokers=3, settings=REPLICATED)
    brokers = [n.node_id for n in c.brokers]
    ck.create_topic(c.bootstrap, topic_name, 1, replication_factor=3)
    d = wait_partition(c.bootstrap, topic_name, lambda d: len(d[0][2]) == 3, "an ISR of 3")
    leader = d[0][0]
    # Another broker may show the topic before the leader has applied it.
    wait_partition(c.node(leader).bootstrap, topic_name, lambda d: len(d[0][2]) == 3, "the leader serving it")
    followers = [n for n in brokers if n != leader]
    batch = kw.record_batch([(b"k", b"v")])
    with kw.Conn(c.node(leader).bootstrap) as conn:
        assert kw.produce(conn, topic_name, 0, batch, acks=-1)[0] == 0
    for f in followers:
        c.node(f).kill()
    wait_partition(c.node(leader).bootstrap, topic_name, lambda d: d[0][2] == [leader], "an ISR of the leader alone")
    with kw.Conn(c.node(leader).bootstrap) as conn:
        error, _ = kw.produce(conn, topic_name, 0, batch, acks=-1)
        assert error == ERR_NOT_ENOUGH_REPLICAS, f"acks=all with one in-sync replica: error {error}"
        # acks=1 is the client's choice to accept that risk; Kafka takes it.
        assert kw.produce(conn, topic_name, 0, batch, acks=1)[0] == 0
    c.node(followers[0]).start()
    wait_partition(c.node(leader).bootstrap, topic_name, lambda d: len(d[0][2]) >= 2, "an ISR of two again")
    with kw.Conn(c.node(leader).bootstrap) as conn:
        error, offset = kw.produce(conn, topic_name, 0, batch, acks=-1)
    assert error == 0 and offset == 2, (error, offset)


def test_added_partitions_replicate_like_the_first(cluster_factory, topic_name):
    """CreatePartitions on RF=3: the new partitions have three replicas spread
    like the first ones (leaders rotating), a full ISR, and take acks=all
    writes that every replica holds."""
    from confluent_kafka.admin import NewPartitions

    c = cluster_factory(size=3, settings=REPLICATED)
    ck.create_topic(c.node(1).bootstrap, topic_name, 3, replication_factor=3)
    wait_partition(c.bootstrap, topic_name, lambda d: len(d) == 3 and all(len(x[2]) == 3 for x in d.values()),
                   "3 partitions with an ISR of 3")
    a = ck.admin(c.node(2).bootstrap)
    fs = a.create_partitions([NewPartitions(topic_name, 6)], operation_timeout=WAIT_S, request_timeout=WAIT_S)
    fs[topic_name].result(timeout=WAIT_S)
    # Every node's metadata (a producer may ask any): librdkafka fails a
    # write to a partition its metadata does not have yet.
    for n in c.nodes:
        d = wait_partition(n.bootstrap, topic_name,
                           lambda d: len(d) == 6 and all(len(x[2]) == 3 for x in d.values()),
                           f"6 partitions with an ISR of 3 on node {n.node_id}")
    for part in range(3, 6):
        leader, replicas, isr = d[part]
        assert sorted(replicas) == [1, 2, 3] and sorted(isr) == [1, 2, 3] and leader == replicas[0], d
    # The new ones continue the old ones' rotation: 6 partitions, 2 led by each node.
    assert sorted(x[0] for x in d.values()) == [1, 1, 2, 2, 3, 3], d

    p = ck.producer(c.bootstrap, {"acks": "all", "enable.idempotence": True})
    dr = ck.Deliveries()
    for i in range(60):
        ck.produce_bounded(p, topic=topic_name, partition=3 + i % 3, value=f"v-{i}".encode(), on_delivery=dr)
    ck.flush(p)
    assert not dr.errors, dr.errors[:5]
    got = ck.consume_all(c.bootstrap, topic_name, 6, 60)
    assert [len(got[part]) for part in range(6)] == [0, 0, 0, 20, 20, 20]
    # Every replica of a new partition holds all 20 (the high watermark moved
    # only once all three had them: ISR of 3, acks=all).
    for part in range(3, 6):
        wait_partition(c.bootstrap, topic_name, lambda d: len(d[part][2]) == 3, f"partition {part} in sync")
        for n in c.nodes:
            batches = replica_batches(n, topic_name, part, 20)
            assert sum(last - base + 1 for base, last, _ in batches) == 20, (n.node_id, part, batches)


def preferred_led(d):
    return {p for p, (leader, replicas, _) in d.items() if leader == replicas[0]}


def kill_and_return(c, topic_name, node_id, partitions):
    """SIGKILL `node_id`, wait until its leaderships moved, start it again and
    wait until it is back in every ISR; returns the partitions it prefers."""
    d = describe(c.bootstrap, topic_name)
    mine = {p for p, (_, replicas, _) in d.items() if replicas[0] == node_id}
    assert mine, d
    c.node(node_id).kill()
    wait_partition(alive_bootstrap(c), topic_name, lambda d: all(x[0] not in (-1, node_id) for x in d.values()),
                   f"leaders away from node {node_id}")
    c.node(node_id).start()
    wait_partition(c.bootstrap, topic_name, lambda d: all(len(x[2]) == 3 for x in d.values()),
                   f"node {node_id} back in every ISR", timeout_s=60)
    return mine


def test_elect_preferred_leaders(cluster_factory, topic_name):
    """After a failover the leaderships stay where they moved (the automatic
    rebalance is off here); ElectLeaders (the CLI and confluent-kafka) moves
    them back to the preferred replicas, and then has nothing left to do."""
    from confluent_kafka import ElectionType, TopicPartition

    c = cluster_factory(size=3, settings={**REPLICATED, "auto.leader.rebalance.enable": "false"})
    ck.create_topic(c.node(1).bootstrap, topic_name, 6, replication_factor=3)
    wait_partition(c.bootstrap, topic_name, lambda d: len(d) == 6 and all(len(x[2]) == 3 for x in d.values()),
                   "6 partitions with an ISR of 3")
    mine = kill_and_return(c, topic_name, 1, 6)
    time.sleep(1)
    assert not (preferred_led(describe(c.bootstrap, topic_name)) & mine)

    # confluent-kafka: one partition.
    first = min(mine)
    a = ck.admin(c.node(2).bootstrap)
    got = a.elect_leaders(ElectionType.PREFERRED, [TopicPartition(topic_name, first)]).result(timeout=WAIT_S)
    assert [(tp.partition, err) for tp, err in got.items()] == [(first, None)], got
    assert describe(c.bootstrap, topic_name)[first][0] == 1
    # The CLI: every partition; those already led by their preferred replica need nothing.
    out = c.node(3).cli("partition", "elect", "--topic", topic_name).stdout.decode()
    for p in mine - {first}:
        assert f"{topic_name}-{p}: elected" in out, out
    assert f"{topic_name}-{first}: no election needed" in out, out
    assert preferred_led(describe(c.bootstrap, topic_name)) == set(range(6))
    out = c.node(1).cli("partition", "elect", "--all").stdout.decode()
    assert "no partition needed an election" in out, out
    # Unclean: every partition has a leader, so none needs one.
    out = c.node(1).cli("partition", "elect", "--type", "unclean", "--topic", topic_name).stdout.decode()
    assert out.count("no election needed") == 6, out
    p = c.node(1).cli("partition", "elect", "--topic", topic_name + "-missing", check=False)
    assert p.returncode != 0 and b"UnknownTopicOrPartition" in p.stderr, p.stderr


def test_automatic_leader_rebalance(cluster_factory, topic_name):
    """auto.leader.rebalance.enable: once the returned node is in sync, the
    active controller's next imbalance check gives it its leaderships back."""
    c = cluster_factory(size=3, settings={**REPLICATED, "leader.imbalance.check.interval.seconds": "1"})
    ck.create_topic(c.node(1).bootstrap, topic_name, 6, replication_factor=3)
    wait_partition(c.bootstrap, topic_name, lambda d: len(d) == 6 and all(len(x[2]) == 3 for x in d.values()),
                   "6 partitions with an ISR of 3")
    kill_and_return(c, topic_name, 2, 6)
    wait_partition(c.bootstrap, topic_name, lambda d: preferred_led(d) == set(range(6)),
                   "every partition led by its preferred replica again", timeout_s=30)


def test_stopped_follower_leaves_the_isr_and_rejoins(cluster_factory, topic_name):
    # A session longer than the lag window: the leader, not the controller's
    # fencing, takes the stopped follower out of the ISR.
    c = cluster_factory(size=3, settings={**REPLICATED, "broker.session.timeout.ms": "20000"})
    ck.create_topic(c.node(1).bootstrap, topic_name, 1, replication_factor=3)
    d = wait_partition(c.bootstrap, topic_name, lambda d: len(d[0][2]) == 3, "an ISR of 3")
    leader = d[0][0]
    follower = next(n for n in (1, 2, 3) if n != leader)
    os.kill(c.node(follower).proc.pid, signal.SIGSTOP)
    try:
        # Writes keep coming, so the stopped follower falls behind the log end
        # (a follower at the end of an idle partition is in sync, as in Kafka).
        deadline = time.monotonic() + WAIT_S
        with kw.Conn(c.node(leader).bootstrap) as conn:
            while follower in describe(c.node(leader).bootstrap, topic_name)[0][2]:
                assert time.monotonic() < deadline, f"node {follower} never left the ISR"
                assert kw.produce(conn, topic_name, 0, kw.record_batch([(b"k", b"before")]), acks=1)[0] == 0
                time.sleep(0.2)
        out = c.node(leader).cli("topic", "describe", "--under-replicated").stdout.decode()
        assert topic_name in out, out
        m = metrics(c.node(leader))
        assert m["skiff_partitions_under_replicated"] >= 1, m
        assert m["skiff_isr_shrinks_total"] >= 1, m
        with kw.Conn(c.node(leader).bootstrap) as conn:
            for _ in range(20):
                assert kw.produce(conn, topic_name, 0, kw.record_batch([(b"k", b"during")]), acks=-1)[0] == 0
    finally:
        os.kill(c.node(follower).proc.pid, signal.SIGCONT)
    wait_partition(c.node(leader).bootstrap, topic_name, lambda d: sorted(d[0][2]) == [1, 2, 3], f"node {follower} back in the ISR", timeout_s=60)
    out = c.node(leader).cli("topic", "describe", topic_name).stdout.decode()
    assert "Isr: 1,2,3" in out.replace(" ", "") or all(str(n) in out for n in (1, 2, 3)), out
    deadline = time.monotonic() + WAIT_S
    while True:
        m = metrics(c.node(leader))
        if m["skiff_partitions_under_replicated"] == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert m["skiff_partitions_under_replicated"] == 0, m
    assert m["skiff_isr_expands_total"] >= 1, m


def metrics(node):
    """The unlabelled samples of a node's /metrics, by name."""
    status, text = node.http_get("/metrics")
    assert status == 200, text
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or "{" in line or not line.strip():
            continue
        name, value = line.rsplit(" ", 1)
        out[name] = float(value)
    return out


def test_old_leader_truncates_its_unreplicated_tail(cluster_factory, topic_name):
    settings = dict(REPLICATED)
    settings["broker.session.timeout.ms"] = "4000"
    settings["replica.lag.time.max.ms"] = "30000"
    settings["min.insync.replicas"] = "1"
    c = cluster_factory(size=3, settings=settings)
    ck.create_topic(c.node(1).bootstrap, topic_name, 1, replication_factor=3)
    d = wait_partition(c.bootstrap, topic_name, lambda d: len(d[0][2]) == 3, "an ISR of 3")
    leader = d[0][0]
    followers = [n for n in (1, 2, 3) if n != leader]
    # The leader itself may apply the new topic after the node that answered.
    wait_partition(c.node(leader).bootstrap, topic_name, lambda d: len(d[0][2]) == 3, "an ISR of 3 on the leader")
    with kw.Conn(c.node(leader).bootstrap) as conn:
        for i in range(5):
            assert kw.produce(conn, topic_name, 0, kw.record_batch([(b"k", b"replicated-%d" % i)]), acks=-1)[0] == 0
    # The followers stop fetching; the leader takes acks=1 writes nobody copies.
    for f in followers:
        os.kill(c.node(f).proc.pid, signal.SIGSTOP)
    try:
        # Fetches already waiting at the leader end empty after their long
        # poll (500 ms); after that nothing carries new records to the followers.
        time.sleep(1.5)
        with kw.Conn(c.node(leader).bootstrap) as conn:
            for i in range(3):
                assert kw.produce(conn, topic_name, 0, kw.record_batch([(b"k", b"lost-%d" % i)]), acks=1)[0] == 0
        c.node(leader).kill()
    finally:
        for f in followers:
            os.kill(c.node(f).proc.pid, signal.SIGCONT)
    survivors = ",".join(c.node(f).bootstrap for f in followers)
    wait_partition(survivors, topic_name, lambda d: d[0][0] in followers, "a follower leading")
    new_leader = describe(survivors, topic_name)[0][0]
    with kw.Conn(c.node(new_leader).bootstrap) as conn:
        for i in range(2):
            assert kw.produce(conn, topic_name, 0, kw.record_batch([(b"k", b"after-%d" % i)]), acks=-1)[0] == 0
    c.node(leader).start()
    wait_partition(c.bootstrap, topic_name, lambda d: sorted(d[0][2]) == [1, 2, 3], "the old leader back in the ISR", timeout_s=60)
    values = [v for _, v in read_all(c.bootstrap, topic_name)]
    assert values == [b"replicated-%d" % i for i in range(5)] + [b"after-0", b"after-1"], values
    # The old leader's log now matches the new leader's: the lost tail is gone.
    end = 7
    for n in c.nodes:
        n.stop()
    logs = [replica_batches(n, topic_name, 0, end) for n in c.nodes]
    assert logs[0] == logs[1] == logs[2] and len(logs[0]) == 7, logs


def delete_records(bootstrap, topic, offset):
    """DeleteRecords on partition 0 up to `offset`: the new low watermark."""
    from confluent_kafka import TopicPartition

    a = ck.admin(bootstrap)  # alive until the result is in
    futures = a.delete_records([TopicPartition(topic, 0, offset)], request_timeout=30, operation_timeout=30)
    return next(iter(futures.values())).result(timeout=30).low_watermark


def log_start_metric(node, topic):
    """A node's skiff_log_start_offset for partition 0 of `topic` (None if absent)."""
    status, text = node.http_get("/metrics")
    assert status == 200, text
    for line in text.splitlines():
        if line.startswith("skiff_log_start_offset{") and f'topic="{topic}"' in line and 'partition="0"' in line:
            return int(float(line.rsplit(" ", 1)[1]))
    return None


def wait_for(pred, what, timeout_s=WAIT_S):
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, what()
        time.sleep(0.2)


def test_follower_behind_the_leaders_log_start_starts_over_and_rejoins(cluster_factory, topic_name):
    """A follower is SIGKILLed; while it is down the leader's retention
    (tiny segments, retention.bytes) deletes every offset it had. Back, its
    fetch offset is below the leader's log start (OFFSET_OUT_OF_RANGE): it
    must delete its log, start over at the leader's log start, catch up and
    rejoin the ISR, holding exactly the leader's batches. Then DeleteRecords:
    the follower's log start follows the leader's, and a follower back below
    a leader's log start inside a batch starts over at that batch."""
    settings = {**REPLICATED, "log.retention.check.interval.ms": "200"}
    c = cluster_factory(size=3, settings=settings)
    ck.create_topic(c.node(1).bootstrap, topic_name, 1, replication_factor=3,
                    config={"segment.bytes": "16384", "retention.bytes": "32768"})
    d = wait_partition(c.bootstrap, topic_name, lambda d: len(d[0][2]) == 3, "an ISR of 3")
    leader = d[0][0]
    follower = next(n for n in (1, 2, 3) if n != leader)
    # A new topic's ISR is whole from the start: wait until the leader itself
    # has applied it (another node's metadata may be ahead of it).
    wait_partition(c.node(leader).bootstrap, topic_name, lambda d: d[0][0] == leader, "the leader's own metadata")
    value = b"x" * 1000

    def produce(conn, tag, batches):
        for i in range(batches):
            records = [(b"%s-%d-%d" % (tag, i, r), value) for r in range(4)]
            error, _ = kw.produce(conn, topic_name, 0, kw.record_batch(records), acks=-1)
            assert error == 0, f"{tag} batch {i}: error {error}"

    with kw.Conn(c.node(leader).bootstrap) as conn:
        produce(conn, b"before", 10)
    # Everything so far is on the follower (acks=all with all three in sync).
    follower_end = 40

    c.node(follower).kill()
    wait_partition(c.node(leader).bootstrap, topic_name, lambda d: follower not in d[0][2],
                   f"node {follower} out of the ISR")
    deadline = time.monotonic() + WAIT_S
    with kw.Conn(c.node(leader).bootstrap) as conn:
        produce(conn, b"while-down", 60)
        # Retention runs every 200 ms and keeps ~32 KiB: the log start passes
        # everything the follower holds.
        while True:
            error, leader_start = kw.list_offset(conn, topic_name, 0, -2)
            assert error == 0, error
            if leader_start > follower_end + 40:
                break
            assert time.monotonic() < deadline, f"the leader's log start stayed at {leader_start}"
            time.sleep(0.2)

    c.node(follower).start()
    wait_partition(c.node(leader).bootstrap, topic_name, lambda d: sorted(d[0][2]) == [1, 2, 3],
                   f"node {follower} back in the ISR", timeout_s=60)
    with open(c.node(follower).log_path, "rb") as f:
        log = f.read().decode(errors="replace")
    assert "our log ends below the leader's log start" in log, "the follower never started over"
    # Replicating normally from there on.
    leader = describe(c.bootstrap, topic_name)[0][0]
    assert leader != follower, "the follower leads already?"
    with kw.Conn(c.node(leader).bootstrap) as conn:
        produce(conn, b"after", 5)
        error, end = kw.list_offset(conn, topic_name, 0, -1)
        assert error == 0 and end == 300, (error, end)

    # DeleteRecords on the leader, inside the last batch (296..299): the
    # follower's log start follows the leader's (from the fetch responses).
    assert delete_records(c.node(leader).bootstrap, topic_name, 298) == 298
    wait_for(lambda: log_start_metric(c.node(follower), topic_name) == 298,
             lambda: f"the follower's log start is {log_start_metric(c.node(follower), topic_name)}, not 298")

    # Down again; the leader's log start moves past the follower's end to the
    # middle of a batch (316..319). Back, the follower starts over at 318, gets
    # the batch starting at 316, starts over there (Kafka's rule) and moves
    # its log start up to the leader's.
    c.node(follower).kill()
    wait_partition(c.node(leader).bootstrap, topic_name, lambda d: follower not in d[0][2],
                   f"node {follower} out of the ISR again")
    with kw.Conn(c.node(leader).bootstrap) as conn:
        produce(conn, b"down-again", 5)
    assert delete_records(c.node(leader).bootstrap, topic_name, 318) == 318
    c.node(follower).start()
    wait_partition(c.node(leader).bootstrap, topic_name, lambda d: sorted(d[0][2]) == [1, 2, 3],
                   f"node {follower} back in the ISR again", timeout_s=60)
    with open(c.node(follower).log_path, "rb") as f:
        log = f.read().decode(errors="replace")
    assert "the first batch starts before our empty log" in log, "the follower never took the straddling batch"
    wait_for(lambda: log_start_metric(c.node(follower), topic_name) == 318,
             lambda: f"the follower's log start is {log_start_metric(c.node(follower), topic_name)}, not 318")
    end = 320

    for n in c.nodes:
        n.stop()
    logs = {n.node_id: replica_batches(n, topic_name, 0, end) for n in c.nodes}
    # Nothing of the follower's old log is left: it starts at or past the
    # leader's log start as it was when the follower came back.
    assert logs[follower] and logs[follower][0][0] >= leader_start, (leader_start, logs[follower][:3])
    # Each replica's retention deletes on its own segment boundaries: above the
    # highest log start of the three, the replicas hold the same batches.
    common = max(batches[0][0] for batches in logs.values())
    same = {k: [b for b in v if b[0] >= common] for k, v in logs.items()}
    assert same[follower] and same[follower] == same[leader], (common, same[follower][:3], same[leader][:3])
    assert same[follower] == same[next(n for n in (1, 2, 3) if n not in (leader, follower))]
    assert same[follower][-1][1] == end - 1, "the follower has every batch up to the log end"


import pytest  # noqa: E402


@pytest.mark.parametrize("unclean", [False, True])
def test_unclean_leader_election(cluster_factory, topic_name, unclean):
    """Only an out-of-sync replica is left. Off (the default): the partition
    stays offline rather than lose acknowledged records. On: that replica
    leads, and the records only the dead leader had are gone."""
    settings = dict(REPLICATED)
    settings["min.insync.replicas"] = "1"
    c = cluster_factory(controllers=1, brokers=2, settings=settings)
    ck.create_topic(c.bootstrap, topic_name, 1, replication_factor=2,
                    config={"unclean.leader.election.enable": str(unclean).lower()})
    d = wait_partition(c.bootstrap, topic_name, lambda d: len(d[0][2]) == 2, "an ISR of 2")
    leader = d[0][0]
    follower = next(n.node_id for n in c.brokers if n.node_id != leader)
    # The leader itself may apply the new topic after the node that answered.
    wait_partition(c.node(leader).bootstrap, topic_name, lambda d: len(d[0][2]) == 2, "an ISR of 2 on the leader")
    with kw.Conn(c.node(leader).bootstrap) as conn:
        assert kw.produce(conn, topic_name, 0, kw.record_batch([(b"k", b"both")]), acks=-1)[0] == 0
    c.node(follower).kill()
    wait_partition(c.node(leader).bootstrap, topic_name, lambda d: d[0][2] == [leader], "the follower out of the ISR")
    with kw.Conn(c.node(leader).bootstrap) as conn:
        # Acknowledged by the only in-sync replica (min.insync.replicas=1).
        assert kw.produce(conn, topic_name, 0, kw.record_batch([(b"k", b"leader-only")]), acks=-1)[0] == 0
    c.node(leader).kill()
    c.node(follower).start()
    if not unclean:
        time.sleep(3)
        d = describe(c.node(follower).bootstrap, topic_name)
        assert d[0][0] == -1, f"an out-of-sync replica was elected with unclean election off: {d}"
        c.node(leader).start()
        wait_partition(c.bootstrap, topic_name, lambda d: d[0][0] == leader, "the in-sync replica leading again")
        values = [v for _, v in read_all(c.bootstrap, topic_name)]
        assert values == [b"both", b"leader-only"], values
    else:
        wait_partition(c.node(follower).bootstrap, topic_name, lambda d: d[0][0] == follower, "the out-of-sync replica leading")
        values = [v for _, v in read_all(c.node(follower).bootstrap, topic_name)]
        # What unclean election costs: the acknowledged "leader-only" record.
        assert values == [b"both"], values
    # The controller-only node serves /metrics and /health too, and counts
    # the unclean elections it made.
    controller = c.nodes[0]
    assert controller.http_get("/health")[0] == 200
    status, text = controller.http_get("/metrics")
    assert status == 200, text
    counted = [line for line in text.splitlines() if line.startswith("skiff_controller_unclean_leader_elections_total ")]
    assert counted == [f"skiff_controller_unclean_leader_elections_total {int(unclean)}"], text
    assert "skiff_controller_active 1" in text, text


def offsets_partition_of(group, partitions):
    """Kafka's rule: abs(java hashCode(group)) % partitions."""
    units = group.encode("utf-16-be")
    h = 0
    for i in range(0, len(units), 2):
        h = (h * 31 + int.from_bytes(units[i:i + 2], "big")) & 0xFFFFFFFF
    h = h - (1 << 32) if h >= 1 << 31 else h
    return 0 if h == -(1 << 31) else abs(h) % partitions


def test_group_coordinator_fails_over(cluster_factory, topic_name):
    """__consumer_offsets is replicated (RF 3 by default): SIGKILL the group's
    coordinator and the leader of its offsets partition moves; the new leader
    loads the group, a live member keeps consuming and committing through it,
    and a kafka-python consumer in the same group resumes from the commits."""
    from confluent_kafka import Consumer, TopicPartition
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KpTopicPartition

    c = cluster_factory(size=3, settings=REPLICATED)
    group = f"{topic_name}-group"
    ck.create_topic(c.node(1).bootstrap, topic_name, 3, replication_factor=3)
    wait_partition(c.bootstrap, topic_name, lambda d: all(len(p[2]) == 3 for p in d.values()), "ISRs of 3")

    def produce_part(tag, n):
        p = ck.producer(alive_bootstrap(c), {"acks": "all"})
        for part in range(3):
            for i in range(n):
                ck.produce_bounded(p, topic=topic_name, partition=part, value=f"{tag}-{part}-{i}".encode())
        ck.flush(p)

    member = Consumer({
        "bootstrap.servers": c.bootstrap, "group.id": group, "auto.offset.reset": "earliest",
        "enable.auto.commit": False, "session.timeout.ms": 10000, "heartbeat.interval.ms": 500,
    })

    def consume(n):
        got = []
        deadline = time.monotonic() + 60
        while len(got) < n and time.monotonic() < deadline:
            for m in member.consume(num_messages=500, timeout=0.5):
                if m.error() is None:
                    got.append((m.partition(), m.value()))
                elif m.error().code() != KafkaError._PARTITION_EOF:
                    raise AssertionError(m.error())
        assert len(got) == n, f"consumed {len(got)} of {n}"
        return got

    def commit():
        done = member.commit(asynchronous=False)
        assert all(tp.error is None for tp in done), done
        return {tp.partition: tp.offset for tp in done}

    try:
        produce_part("a", 40)
        member.subscribe([topic_name])
        consume(120)
        assert commit() == {0: 40, 1: 40, 2: 40}

        # The group's offsets partition: three replicas, all in sync.
        offsets_part = offsets_partition_of(group, 3)
        d = wait_partition(c.bootstrap, "__consumer_offsets",
                           lambda d: len(d[offsets_part][2]) == 3, "an offsets ISR of 3")
        coordinator = d[offsets_part][0]
        admin = ck.admin(c.bootstrap)  # alive until the result is in
        found = admin.describe_consumer_groups([group])[group].result(timeout=10)
        assert found.coordinator.id == coordinator, (found.coordinator, d)

        c.node(coordinator).kill()
        wait_partition(alive_bootstrap(c), "__consumer_offsets",
                       lambda d: d[offsets_part][0] not in (-1, coordinator),
                       f"a new offsets leader after killing node {coordinator}")
        # The member goes on: new records, then commits through the new coordinator.
        produce_part("b", 20)
        consume(60)
        assert commit() == {0: 60, 1: 60, 2: 60}
        admin = ck.admin(alive_bootstrap(c))
        found = admin.describe_consumer_groups([group])[group].result(timeout=10)
        assert found.coordinator.id not in (-1, coordinator), found.coordinator
        assert len(found.members) == 1, found
    finally:
        member.close()

    # Another client in the same group resumes from the commits.
    produce_part("c", 5)
    kp = KafkaConsumer(bootstrap_servers=alive_bootstrap(c).split(","), group_id=group,
                       enable_auto_commit=False, auto_offset_reset="earliest", consumer_timeout_ms=1000)
    try:
        tps = [KpTopicPartition(topic_name, p) for p in range(3)]
        assert [kp.committed(tp) for tp in tps] == [60, 60, 60]
        kp.subscribe([topic_name])
        got = []
        deadline = time.monotonic() + 60
        while len(got) < 15 and time.monotonic() < deadline:
            for records in kp.poll(timeout_ms=500).values():
                got += [(r.partition, r.value) for r in records]
        assert sorted(got) == sorted((p, f"c-{p}-{i}".encode()) for p in range(3) for i in range(5)), got
    finally:
        kp.close()

    # The old coordinator returns as a follower of the offsets partition; the
    # commits are still there, whichever node answers.
    c.node(coordinator).start()
    wait_partition(c.bootstrap, "__consumer_offsets", lambda d: len(d[offsets_part][2]) == 3,
                   f"node {coordinator} back in the offsets ISR", timeout_s=60)
    check = Consumer({"bootstrap.servers": c.node(coordinator).bootstrap, "group.id": group})
    try:
        got = check.committed([TopicPartition(topic_name, p) for p in range(3)], timeout=20)
        assert [tp.offset for tp in got] == [60, 60, 60], got
    finally:
        check.close()


def partition_files(node, topic, partition):
    """The bytes of every `.log` segment of one partition directory on `node`
    and its `partition.metadata` text (None when either is missing)."""
    d = os.path.join(node.data_dir, f"{topic}-{partition}")
    if not os.path.isdir(d):
        return None, None
    data = b"".join(open(f, "rb").read() for f in sorted(glob.glob(os.path.join(d, "*.log"))))
    meta = os.path.join(d, "partition.metadata")
    return data, (open(meta).read() if os.path.exists(meta) else None)


def test_a_replica_down_while_its_topic_was_replaced_keeps_nothing_of_the_old_one(cluster_factory, topic_name):
    """Kafka's stray replicas: a replica that was down while its topic was
    deleted and created again under the same name must not serve the old
    topic's log as the new one's (only the leader epochs' truncation stood
    between them), and a topic deleted meanwhile must not leave its
    directories behind for good (they did: "left alone (stray)"). The replica is paused (still
    unfenced, so the new topic is placed on it too), killed, restarted."""
    c = cluster_factory(size=3, settings={**REPLICATED, "broker.session.timeout.ms": "15000"})
    gone = topic_name + "-gone"
    ck.create_topic(c.bootstrap, topic_name, 2, replication_factor=3)
    ck.create_topic(c.bootstrap, gone, 2, replication_factor=3)
    for t in (topic_name, gone):
        wait_partition(c.bootstrap, t, lambda d: all(len(d[p][2]) == 3 for p in d), "ISRs of 3")
    produce_keys(c.bootstrap, topic_name, 2, 50, "old")
    produce_keys(c.bootstrap, gone, 2, 5, "gone")
    active = c.status()["active"]
    victim = c.node(next(n for n in (3, 2, 1) if n != active))
    for p in range(2):
        wait_for(lambda p=p: b"value-old-%d-49" % p in (partition_files(victim, topic_name, p)[0] or b""),
                 f"node {victim.node_id} holding the old records of partition {p}")
    old_meta = partition_files(victim, topic_name, 0)[1]

    others = ",".join(n.bootstrap for n in c.nodes if n is not victim)
    os.kill(victim.proc.pid, signal.SIGSTOP)
    try:
        a = ck.admin(others)
        for t, f in a.delete_topics([topic_name, gone], operation_timeout=30, request_timeout=30).items():
            f.result(timeout=30)
        deadline = time.monotonic() + WAIT_S
        while topic_name in ck.admin(others).list_topics(timeout=10).topics:
            assert time.monotonic() < deadline, "the topic never went away"
            time.sleep(0.1)
        # The paused node is still unfenced (a 15 s session): placed on it too.
        ck.create_topic(others, topic_name, 2, replication_factor=3)
        d = describe(others, topic_name)
        assert all(victim.node_id in d[p][1] for p in d), d
    finally:
        victim.kill()
    victim.start()
    wait_partition(c.bootstrap, topic_name, lambda d: all(sorted(d[p][2]) == [1, 2, 3] for p in d),
                   f"node {victim.node_id} back in the new topic's ISRs", timeout_s=60)
    produce_keys(c.bootstrap, topic_name, 2, 20, "new")
    for p in range(2):
        wait_for(lambda p=p: b"value-new-%d-19" % p in (partition_files(victim, topic_name, p)[0] or b""),
                 f"node {victim.node_id} holding the new records of partition {p}")
        data, meta = partition_files(victim, topic_name, p)
        assert b"value-old" not in data, f"node {victim.node_id} kept the deleted topic's records in {topic_name}-{p}"
        assert not os.path.exists(os.path.join(victim.data_dir, f"{gone}-{p}")), \
            f"node {victim.node_id} kept the deleted topic's directory {gone}-{p}"
        assert old_meta and old_meta.startswith("version: 0\ntopic_id: "), old_meta
        assert meta and meta.startswith("version: 0\ntopic_id: ") and meta != old_meta, (meta, old_meta)
    log = open(victim.log_path, errors="replace").read()
    assert "deleting a stray partition directory" in log, victim.log_tail()
    assert "an earlier topic of the same name" in log, victim.log_tail()
    # Every replica serves the new records only, in order.
    msgs = ck.consume_all(c.bootstrap, topic_name, 2, 40)
    for p in range(2):
        assert [m.key() for m in msgs[p]] == [f"new-{p}-{i}".encode() for i in range(20)]


def test_a_data_directory_joins_one_cluster_only(cluster_factory):
    """A node pointed at another cluster's quorum with its data directory
    refuses to start (Kafka: InconsistentClusterIdException) instead of taking
    every partition it holds for a deleted topic's and deleting it."""
    first = cluster_factory(controllers=1, brokers=1)
    ck.create_topic(first.bootstrap, "kept", 1)
    produce_keys(first.bootstrap, "kept", 1, 5, "k")
    broker = first.node(2)
    assert broker.stop() == 0
    meta = open(os.path.join(broker.data_dir, "meta.properties")).read()
    assert "joined.cluster.id=" in meta, meta

    second = cluster_factory(size=1)
    wrong = Node(settings=second.settings, cores=1, node_id=2,
                 extra_args=["--controller-quorum", second.quorum, "--roles", "broker"])
    _live_nodes.append(wrong)
    wrong.data_dir = broker.data_dir
    try:
        wrong.launch()
        code = wrong.proc.wait(timeout=60)
        log = open(wrong.log_path, errors="replace").read()
        assert code != 0, log[-3000:]
        assert "belongs to cluster" in log, log[-3000:]
    finally:
        wrong.cleanup()
        _live_nodes.remove(wrong)
    assert os.path.isdir(os.path.join(broker.data_dir, "kept-0"))
    broker.start()
    msgs = ck.consume_all(first.bootstrap, "kept", 1, 5)
    assert [m.key() for m in msgs[0]] == [f"k-0-{i}".encode() for i in range(5)]
